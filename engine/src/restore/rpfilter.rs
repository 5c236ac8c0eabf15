//! `-m rpfilter` and `-m pkttype`: the line parser collects their options as for an opaque
//! extension; [`typed_rpfilter`] and [`typed_pkttype`] read them with libxt_rpfilter's and
//! libxt_pkttype's grammar (iptables 1.8.9) into [`Match::Rpfilter`] / [`Match::PktType`]. An
//! error is located at the extension's name.
//!
//! - rpfilter: `--loose`, `--validmark`, `--accept-local`, `--invert`, each at most once,
//!   none negatable, no arguments; printed in that order (`rpfilter_print_prefix`). Which
//!   tables and hooks allow it is checked by validation.
//! - pkttype: `[!] --pkt-type TYPE`, required; TYPE compared case-insensitively with
//!   `unicast`, `broadcast`, `multicast` and libxt_pkttype's aliases `host`, `bcast`,
//!   `mcast`; printed `[!] --pkt-type NAME` with the canonical name.

use crate::fib::rpfilter_flags as F;
use crate::model::{Match, Neg, OpaqueOption, PktType, RpfilterMatch};

use super::ParseError;
use super::ext_options::{ExtOptions, Opt};
use super::lexer::Tok;
use super::rule::Ctx;

/// rpfilter's options and their flags, in print order.
pub(crate) const RPFILTER_OPTIONS: [(&str, u8); 4] = [
    ("--loose", F::LOOSE),
    ("--validmark", F::VALID_MARK),
    ("--accept-local", F::ACCEPT_LOCAL),
    ("--invert", F::INVERT),
];

/// rpfilter's grammar: flags only, none negatable.
const GRAMMAR: &[Opt] = &[
    Opt::flag("--loose"),
    Opt::flag("--validmark"),
    Opt::flag("--accept-local"),
    Opt::flag("--invert"),
];

/// Reads `-m rpfilter`'s options (collected opaque) into [`Match::Rpfilter`].
pub(crate) fn typed_rpfilter(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    ExtOptions::check("rpfilter", GRAMMAR, options, token, ctx)?;
    let mut m = RpfilterMatch::default();
    for o in options {
        if let Some((_, bit)) = RPFILTER_OPTIONS.iter().find(|(n, _)| *n == o.name) {
            m.flags |= bit;
        }
    }
    Ok(Match::Rpfilter(m))
}

/// A `--pkt-type` word as libxt_pkttype's `parse_pkttype` (case-insensitive, with aliases).
pub(crate) fn parse_pkt_type(word: &str) -> Option<PktType> {
    let w = word.to_ascii_lowercase();
    Some(match w.as_str() {
        "unicast" | "host" => PktType::Unicast,
        "broadcast" | "bcast" => PktType::Broadcast,
        "multicast" | "mcast" => PktType::Multicast,
        _ => return None,
    })
}

/// Reads `-m pkttype`'s options (collected opaque) into [`Match::PktType`].
pub(crate) fn typed_pkttype(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let r = ExtOptions::check(
        "pkttype",
        &[Opt::value("--pkt-type").negatable()],
        options,
        token,
        ctx,
    )?;
    let Some(o) = options.first() else {
        return Err(r.missing("--pkt-type"));
    };
    let a = ExtOptions::arg(o);
    let value = parse_pkt_type(a).ok_or_else(|| r.bad(format!("Bad packet type '{a}'")))?;
    let m = Neg {
        negated: o.negated,
        value,
    };
    Ok(Match::PktType(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkt_type_words_as_libxt_pkttype() {
        assert_eq!(parse_pkt_type("unicast"), Some(PktType::Unicast));
        assert_eq!(parse_pkt_type("BROADCAST"), Some(PktType::Broadcast));
        assert_eq!(parse_pkt_type("mcast"), Some(PktType::Multicast));
        assert_eq!(parse_pkt_type("host"), Some(PktType::Unicast));
        assert_eq!(parse_pkt_type("wrong"), None);
        assert_eq!(parse_pkt_type(""), None);
    }
}
