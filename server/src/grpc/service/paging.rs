//! Pagination of every List method (AIP-158): page sizes, page tokens and the byte budget
//! of a page.
//!
//! A token is opaque to clients and tamper-evident: the hex of `v1`, the method, a digest of
//! the request's other fields and a cursor, separated by U+001F, then `.` and the hex of an
//! HMAC-SHA256 of those bytes under a key drawn at random when vallumd starts ([`mac_key`]). A
//! token whose MAC does not verify (forged, edited, or issued before a restart) is
//! INVALID_ARGUMENT on `page_token`, as a token of another method is. The cursor is where the next page starts: the
//! last item's key for keyset listings (rulesets, sets, revisions, conntrack entries: items
//! added or removed between two pages do not shift the others), or an offset together with
//! a fingerprint of the listed state where there is no stable key (counters: see
//! [`Error::ListChanged`]). A token of another method, or one issued for a request whose
//! other fields differ, is INVALID_ARGUMENT on `page_token`.

use std::sync::OnceLock;

use prost::Message;
use ring::hmac;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The most bytes of encoded items one page holds: a page ends before the next item would
/// pass it (after one item at least), so every response stays far below gRPC's default
/// 4 MiB message limit whatever the size of its items.
pub const PAGE_BYTES: usize = 1 << 20;

/// Token format version (the first word of every token).
const VERSION: &str = "v1";
/// Separates the words of a token.
const SEP: char = '\u{1f}';

/// The page a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// Items at most: the request's `page_size`, 0 as the method's default, above the
    /// maximum as the maximum.
    pub size: usize,
    /// Where to continue (`None`: the first page).
    pub cursor: Option<String>,
}

/// How one method pages.
#[derive(Clone, Copy, Debug)]
pub struct Paging {
    /// The method, as it is named in tokens and messages (`ListRulesets`).
    pub method: &'static str,
    /// `page_size` 0 means this.
    pub default: u32,
    /// Larger page sizes are lowered to this.
    pub max: u32,
}

impl Paging {
    /// The page that `page_size` and `page_token` ask for; `query` identifies the request's
    /// other fields (filters) and must be the same as for the token's first page.
    ///
    /// Errors: [`Error::BadRequest`] on `page_token` for a token that is not one of this
    /// method's, or one issued for a different `query`.
    pub fn page(&self, page_size: u32, page_token: &str, query: &str) -> Result<Page> {
        let size = match page_size {
            0 => self.default,
            n => n.min(self.max),
        } as usize;
        if page_token.is_empty() {
            return Ok(Page { size, cursor: None });
        }
        let foreign = || {
            Error::invalid(
                "page_token",
                format!(
                    "not a page token of {} (pass the previous response's next_page_token unchanged)",
                    self.method
                ),
            )
        };
        let (body, tag) = page_token.split_once('.').ok_or_else(foreign)?;
        let tag = unhex_bytes(tag).ok_or_else(foreign)?;
        hmac::verify(mac_key(), body.as_bytes(), &tag).map_err(|_| foreign())?;
        let text = unhex(body).ok_or_else(foreign)?;
        let mut words = text.splitn(4, SEP);
        let (Some(VERSION), Some(method), Some(digest), Some(cursor)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(foreign());
        };
        if method != self.method {
            return Err(foreign());
        }
        if digest != query_digest(query) {
            return Err(Error::invalid(
                "page_token",
                format!(
                    "the token was issued for a {} request with other fields (filters); every page of a listing must repeat the first page's request",
                    self.method
                ),
            ));
        }
        Ok(Page {
            size,
            cursor: Some(cursor.to_string()),
        })
    }

    /// The token of the page that starts after `cursor`, for the same `query`.
    pub fn token(&self, query: &str, cursor: &str) -> String {
        let body = hex(&format!(
            "{VERSION}{SEP}{}{SEP}{}{SEP}{cursor}",
            self.method,
            query_digest(query)
        ));
        let tag = hmac::sign(mac_key(), body.as_bytes());
        let tag: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("{body}.{tag}")
    }
}

/// The first items of `items` that fit a page of `size` items and [`PAGE_BYTES`] (one at
/// least), and whether any item is left after them.
pub fn fill<T: Message>(items: impl IntoIterator<Item = T>, size: usize) -> (Vec<T>, bool) {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut items = items.into_iter();
    for item in items.by_ref() {
        // The field's tag and length prefix: at most 1 + 5 bytes.
        let len = item.encoded_len() + 6;
        if out.len() == size || (!out.is_empty() && bytes + len > PAGE_BYTES) {
            return (out, true);
        }
        bytes += len;
        out.push(item);
    }
    (out, false)
}

fn query_digest(query: &str) -> String {
    Sha256::digest(query.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The key of the page tokens' MAC: 32 random bytes drawn once per process (tokens do not
/// outlive the vallumd that issued them).
///
/// # Panics
/// When the operating system's random source fails (`getrandom`), as ring's key generation
/// does; vallumd cannot run safely without one.
fn mac_key() -> &'static hmac::Key {
    static KEY: OnceLock<hmac::Key> = OnceLock::new();
    KEY.get_or_init(|| {
        let rng = ring::rand::SystemRandom::new();
        hmac::Key::generate(hmac::HMAC_SHA256, &rng).expect("the system's random source")
    })
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    String::from_utf8(unhex_bytes(s)?).ok()
}

fn unhex_bytes(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 8192 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Paging = Paging {
        method: "ListThings",
        default: 10,
        max: 100,
    };

    fn field(e: Error) -> String {
        match e {
            Error::BadRequest { violations, .. } => violations[0].field.clone(),
            other => panic!("not a bad request: {other}"),
        }
    }

    #[test]
    fn sizes_default_and_cap() {
        assert_eq!(P.page(0, "", "").unwrap().size, 10);
        assert_eq!(P.page(7, "", "").unwrap().size, 7);
        assert_eq!(P.page(5000, "", "").unwrap().size, 100);
    }

    #[test]
    fn tokens_round_trip_and_bind_the_request() {
        let t = P.token("ruleset=a", "k\u{1f}with sep");
        let page = P.page(0, &t, "ruleset=a").unwrap();
        assert_eq!(page.cursor.as_deref(), Some("k\u{1f}with sep"));
        assert_eq!(field(P.page(0, &t, "ruleset=b").unwrap_err()), "page_token");
        let other = Paging {
            method: "ListOther",
            ..P
        };
        assert_eq!(
            field(other.page(0, &t, "ruleset=a").unwrap_err()),
            "page_token"
        );
        for bad in ["zz", "abc", "12", &"00".repeat(5000), "é"] {
            assert_eq!(
                field(P.page(0, bad, "").unwrap_err()),
                "page_token",
                "{bad}"
            );
        }
    }

    /// Issue #28 item 7: a token re-made from a real one with another cursor (as the 87
    /// forged cursors of the report), a real one with a changed MAC, or one without a MAC is
    /// refused; the real one still works.
    #[test]
    fn forged_tokens_are_refused() {
        let t = P.token("q", "b");
        assert_eq!(P.page(0, &t, "q").unwrap().cursor.as_deref(), Some("b"));
        let (body, tag) = t.split_once('.').unwrap();
        let forged_body = hex(&unhex(body).unwrap().replace("\u{1f}b", "\u{1f}a"));
        let mut bad_tag = tag.to_string();
        bad_tag.replace_range(0..2, if &tag[0..2] == "00" { "01" } else { "00" });
        for bad in [
            format!("{forged_body}.{tag}"),
            format!("{body}.{bad_tag}"),
            body.to_string(),
            format!("{body}."),
        ] {
            assert_eq!(
                field(P.page(0, &bad, "q").unwrap_err()),
                "page_token",
                "{bad}"
            );
        }
    }

    #[test]
    fn fill_stops_at_size_and_bytes() {
        let (v, more) = fill((0..5).map(|i: u32| i.to_string()), 3);
        assert_eq!((v.len(), more), (3, true));
        let (v, more) = fill((0..3).map(|i: u32| i.to_string()), 3);
        assert_eq!((v.len(), more), (3, false));
        let big = "x".repeat(400 * 1024);
        let (v, more) = fill(std::iter::repeat_n(big.clone(), 5), 100);
        assert_eq!((v.len(), more), (2, true));
        let huge = "x".repeat(2 * PAGE_BYTES);
        let (v, more) = fill([huge], 100);
        assert_eq!((v.len(), more), (1, false));
    }
}
