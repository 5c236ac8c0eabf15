//! The verdicts of verdict-map elements (nft's `KEY : VERDICT`, as in kube-proxy's
//! `service-ips` map): a verdict as a small number that an element carries
//! ([`crate::sets::Element::verdict`]) and a compiled `vmap` resolves per packet.
//!
//! Numbers: 0 is "no verdict" (an element of a plain set), 1..=4 are `accept`, `drop`,
//! `return`, `continue`, and every `jump CHAIN` / `goto CHAIN` gets its own number the first
//! time it is seen, from one process-wide table that only grows (a number never changes its
//! meaning, so an element keeps its verdict across commits and restarts of the ruleset). A
//! chain name here is the name inside its nft table (`service-ULMVA6XW-ns1/svc1/tcp/p80`); a
//! compiled vmap resolves it among the chains of its own table. The table holds at most
//! [`MAX_CHAIN_VERDICTS`] names (refused past it) of at most [`MAX_CHAIN_NAME`] bytes each.
//!
//! Commit/API path: [`parse`] and [`text`] take a lock; the packet path only compares numbers.

use std::sync::{LazyLock, PoisonError, RwLock};

use rustc_hash::FxHashMap;

/// No verdict: an element of a plain set.
pub const NONE: u32 = 0;
/// `accept`.
pub const ACCEPT: u32 = 1;
/// `drop`.
pub const DROP: u32 = 2;
/// `return`.
pub const RETURN: u32 = 3;
/// `continue`.
pub const CONTINUE: u32 = 4;
/// The first number of a chain verdict.
const FIRST_CHAIN: u32 = 5;

/// The most distinct `jump`/`goto` verdicts the process keeps.
pub const MAX_CHAIN_VERDICTS: usize = 1 << 20;

/// The longest chain name of a verdict, in bytes (nft's NFT_CHAIN_MAXNAMELEN - 1).
pub const MAX_CHAIN_NAME: usize = 255;

/// A chain verdict: `goto` (true) or `jump` (false), and the chain's name in its table.
type ChainVerdict = (bool, Box<str>);

#[derive(Default)]
struct Table {
    names: Vec<ChainVerdict>,
    ids: FxHashMap<ChainVerdict, u32>,
}

static TABLE: LazyLock<RwLock<Table>> = LazyLock::new(RwLock::default);

/// The number of verdict `text` (`accept`, `drop`, `return`, `continue`, `jump NAME`,
/// `goto NAME`; words separated by blanks, a chain name optionally in double quotes).
///
/// Errors: what is wrong (another word, an empty or too long name, the table full).
pub fn parse(text: &str) -> Result<u32, String> {
    let mut words = text.split_whitespace();
    let (Some(verb), rest) = (words.next(), words.collect::<Vec<_>>()) else {
        return Err("no verdict".into());
    };
    let fixed = match verb {
        "accept" => Some(ACCEPT),
        "drop" => Some(DROP),
        "return" => Some(RETURN),
        "continue" => Some(CONTINUE),
        "jump" | "goto" => None,
        other => {
            return Err(format!(
                "{other:?} is not a verdict (accept, drop, return, continue, jump CHAIN, goto CHAIN)"
            ));
        }
    };
    if let Some(id) = fixed {
        if !rest.is_empty() {
            return Err(format!("`{verb}` takes no chain"));
        }
        return Ok(id);
    }
    let [name] = rest.as_slice() else {
        return Err(format!("`{verb}` takes one chain name"));
    };
    let name = name
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(name);
    chain(verb == "goto", name)
}

/// The number of `goto NAME` (`goto` true) or `jump NAME`.
///
/// Errors: an empty or too long name, a name with a control character, the table full.
pub fn chain(goto: bool, name: &str) -> Result<u32, String> {
    if name.is_empty() || name.len() > MAX_CHAIN_NAME || name.chars().any(char::is_control) {
        return Err(format!(
            "a chain name has 1 to {MAX_CHAIN_NAME} bytes and no control characters"
        ));
    }
    let key: ChainVerdict = (goto, name.into());
    if let Some(&id) = TABLE
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .ids
        .get(&key)
    {
        return Ok(id);
    }
    let mut t = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(&id) = t.ids.get(&key) {
        return Ok(id);
    }
    if t.names.len() >= MAX_CHAIN_VERDICTS {
        return Err(format!(
            "more than {MAX_CHAIN_VERDICTS} distinct jump/goto verdicts"
        ));
    }
    let id = FIRST_CHAIN + t.names.len() as u32;
    t.names.push(key.clone());
    t.ids.insert(key, id);
    Ok(id)
}

/// What number `id` means: `None` for [`NONE`] or a number never given out.
pub fn resolve(id: u32) -> Option<Verdict> {
    Some(match id {
        NONE => return None,
        ACCEPT => Verdict::Accept,
        DROP => Verdict::Drop,
        RETURN => Verdict::Return,
        CONTINUE => Verdict::Continue,
        _ => {
            let t = TABLE.read().unwrap_or_else(PoisonError::into_inner);
            let (goto, name) = t.names.get((id - FIRST_CHAIN) as usize)?;
            if *goto {
                Verdict::Goto(name.to_string())
            } else {
                Verdict::Jump(name.to_string())
            }
        }
    })
}

/// The text of verdict `id` as nft writes it (`goto NAME`); empty for [`NONE`].
pub fn text(id: u32) -> String {
    match resolve(id) {
        None => String::new(),
        Some(Verdict::Accept) => "accept".into(),
        Some(Verdict::Drop) => "drop".into(),
        Some(Verdict::Return) => "return".into(),
        Some(Verdict::Continue) => "continue".into(),
        Some(Verdict::Jump(c)) => format!("jump {c}"),
        Some(Verdict::Goto(c)) => format!("goto {c}"),
    }
}

/// A verdict of a map element.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `return`.
    Return,
    /// `continue`: the next rule.
    Continue,
    /// `jump CHAIN` (the name in the map's table).
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_fixed_and_chains_numbered_once() {
        assert_eq!(parse("accept"), Ok(ACCEPT));
        assert_eq!(parse(" drop "), Ok(DROP));
        assert_eq!(parse("continue"), Ok(CONTINUE));
        let a = parse("goto service-a").unwrap();
        let b = parse("jump service-a").unwrap();
        assert!(a >= FIRST_CHAIN && b >= FIRST_CHAIN && a != b);
        assert_eq!(parse("goto \"service-a\""), Ok(a));
        assert_eq!(text(a), "goto service-a");
        assert_eq!(resolve(b), Some(Verdict::Jump("service-a".into())));
        assert_eq!(resolve(NONE), None);
        assert_eq!(resolve(u32::MAX), None);
        assert!(parse("queue").is_err());
        assert!(parse("accept x").is_err());
        assert!(parse("goto").is_err());
        assert!(parse(&format!("jump {}", "x".repeat(256))).is_err());
    }
}
