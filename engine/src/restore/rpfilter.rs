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

use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// rpfilter's options and their flags, in print order.
pub(crate) const RPFILTER_OPTIONS: [(&str, u8); 4] = [
    ("--loose", F::LOOSE),
    ("--validmark", F::VALID_MARK),
    ("--accept-local", F::ACCEPT_LOCAL),
    ("--invert", F::INVERT),
];

fn bad(ctx: &Ctx<'_>, token: &Tok<'_>, ext: &str, reason: String) -> ParseError {
    ctx.err(
        token,
        K::InvalidValue {
            what: "extension option",
            reason: format!("{ext}: {reason}"),
        },
    )
}

/// Reads `-m rpfilter`'s options (collected opaque) into [`Match::Rpfilter`].
pub(crate) fn typed_rpfilter(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let mut m = RpfilterMatch::default();
    for (i, o) in options.iter().enumerate() {
        let Some((_, bit)) = RPFILTER_OPTIONS.iter().find(|(n, _)| *n == o.name) else {
            return Err(ctx.err(
                token,
                K::UnknownExtensionOption {
                    extension: "rpfilter".into(),
                    option: o.name.clone(),
                },
            ));
        };
        if options[..i].iter().any(|p| p.name == o.name) {
            return Err(ctx.err(token, K::DuplicateOption(o.name.clone())));
        }
        if o.negated {
            return Err(bad(
                ctx,
                token,
                "rpfilter",
                format!("option \"{}\" cannot be inverted", o.name),
            ));
        }
        if !o.args.is_empty() {
            return Err(bad(
                ctx,
                token,
                "rpfilter",
                format!("option \"{}\" takes no argument", o.name),
            ));
        }
        m.flags |= bit;
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
    let mut out: Option<Neg<PktType>> = None;
    for o in options {
        if o.name != "--pkt-type" {
            return Err(ctx.err(
                token,
                K::UnknownExtensionOption {
                    extension: "pkttype".into(),
                    option: o.name.clone(),
                },
            ));
        }
        if out.is_some() {
            return Err(ctx.err(token, K::DuplicateOption(o.name.clone())));
        }
        let [a] = o.args.as_slice() else {
            return Err(bad(
                ctx,
                token,
                "pkttype",
                "option \"--pkt-type\" takes one argument".into(),
            ));
        };
        let value = parse_pkt_type(a)
            .ok_or_else(|| bad(ctx, token, "pkttype", format!("Bad packet type '{a}'")))?;
        out = Some(Neg {
            negated: o.negated,
            value,
        });
    }
    let m = out.ok_or_else(|| {
        ctx.err(
            token,
            K::MissingOption {
                extension: "pkttype".into(),
                needs: "--pkt-type",
            },
        )
    })?;
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
