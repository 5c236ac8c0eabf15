//! Reading every page of a List method (AIP-158): vallumctl's list commands ask for pages
//! until `next_page_token` is empty, so a listing of any length never meets gRPC's message
//! limit.

use crate::error::CliError;

/// Page size vallumctl asks for; the server lowers it to its maximum (and ends a page
/// before 1 MiB) where that is smaller.
pub const PAGE_SIZE: u32 = 10_000;

/// The token of the page after one whose response carried `next`, when there is one.
///
/// Errors: [`CliError::Output`] when the server returned the token it was given (it would
/// loop forever).
pub fn next(asked: &str, next: String) -> Result<Option<String>, CliError> {
    if next.is_empty() {
        return Ok(None);
    }
    if next == asked {
        return Err(CliError::Output(
            "the server returned the page token it was sent; the listing does not advance".into(),
        ));
    }
    Ok(Some(next))
}

/// Every item of a listing: `$call` is an expression of `$token` (the page token to send,
/// a `String`) that awaits one page and evaluates to the response; `$items` names the
/// response's repeated field.
macro_rules! all_pages {
    (|$token:ident| $call:expr, $items:ident) => {{
        let mut all = Vec::new();
        let mut $token = String::new();
        loop {
            let r = $call.into_inner();
            all.extend(r.$items);
            match $crate::pages::next(&$token, r.next_page_token)? {
                Some(t) => $token = t,
                None => break,
            }
        }
        all
    }};
}
pub(crate) use all_pages;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_on_empty_and_refuses_a_loop() {
        assert_eq!(next("", String::new()).unwrap(), None);
        assert_eq!(next("", "a".into()).unwrap().as_deref(), Some("a"));
        assert!(next("a", "a".into()).is_err());
    }
}
