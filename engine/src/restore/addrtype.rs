//! `-m addrtype`: the line parser collects its options as for an opaque extension; [`typed`]
//! reads them with libxt_addrtype's revision-1 grammar (iptables 1.8.9) and the kernel's
//! `addrtype_mt_checkentry` family rules into [`Match::AddrType`]. An error is located at the
//! extension's name.
//!
//! Grammar: `[!] --src-type LIST`, `[!] --dst-type LIST` (at least one of them, each at most
//! once), `--limit-iface-in` or `--limit-iface-out` (not both). LIST is comma-separated type
//! names compared as libxt_addrtype's `parse_type` does: case-insensitively and by prefix
//! (`strncasecmp(word, name, strlen(word))`, the first name in `rtn_names` order wins, so
//! `loc` is LOCAL and `U` is UNSPEC); an empty word is refused. ip6tables refuses BROADCAST,
//! BLACKHOLE and PROHIBIT..XRESOLVE (the kernel's checkentry for IPv6). Which hooks allow the
//! interface limits is checked by validation (it knows the chains' hooks).
//!
//! Printed as `addrtype_save_v1`: `[!] --src-type A,B [!] --dst-type C --limit-iface-in`,
//! names upper-case in bit order.

use crate::model::{AddrTypeLimit, AddrTypeMatch, Family, Match, Neg, OpaqueOption, addr_type};

use super::ParseError;
use super::ext_options::{ExtOptions, Opt};
use super::lexer::Tok;
use super::rule::Ctx;

/// addrtype's options.
const GRAMMAR: &[Opt] = &[
    Opt::value("--src-type").negatable(),
    Opt::value("--dst-type").negatable(),
    Opt::flag("--limit-iface-in"),
    Opt::flag("--limit-iface-out"),
];

/// Reads `-m addrtype`'s options (collected opaque) into [`Match::AddrType`].
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let r = ExtOptions::check("addrtype", GRAMMAR, options, token, ctx)?;
    let bad = |reason: String| r.bad(reason);
    let mut m = AddrTypeMatch::default();
    for o in options {
        match o.args.as_slice() {
            [a] => {
                let v = Neg {
                    negated: o.negated,
                    value: parse_types(a).map_err(|w| bad(format!("bad type \"{w}\"")))?,
                };
                if o.name == "--src-type" {
                    m.src = Some(v);
                } else {
                    m.dst = Some(v);
                }
            }
            _ => {
                let l = if o.name == "--limit-iface-in" {
                    AddrTypeLimit::In
                } else {
                    AddrTypeLimit::Out
                };
                if m.limit != AddrTypeLimit::None && m.limit != l {
                    return Err(bad(
                        "option \"--limit-iface-out\" cannot be used together with \"--limit-iface-in\""
                            .into(),
                    ));
                }
                m.limit = l;
            }
        }
    }
    if m.src.is_none() && m.dst.is_none() {
        return Err(r.missing("--src-type or --dst-type"));
    }
    if ctx.family == Family::Ipv6 {
        let all = m.src.map_or(0, |v| v.value) | m.dst.map_or(0, |v| v.value);
        let refused = all & (addr_type::BROADCAST | addr_type::BLACKHOLE | !0x00ff);
        if refused != 0 {
            return Err(bad(format!(
                "ip6tables does not support {} (the kernel refuses it for IPv6)",
                addr_type::names(refused)
            )));
        }
    }
    Ok(Match::AddrType(m))
}

/// A comma-separated type list as libxt_addrtype's `parse_types`; the word it refuses.
pub(crate) fn parse_types(list: &str) -> Result<u16, &str> {
    let mut mask = 0u16;
    for word in list.split(',') {
        let i = (!word.is_empty())
            .then(|| {
                addr_type::NAMES.iter().position(|n| {
                    n.len() >= word.len() && n[..word.len()].eq_ignore_ascii_case(word)
                })
            })
            .flatten()
            .ok_or(word)?;
        mask |= 1 << i;
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_words_as_libxt_addrtype() {
        assert_eq!(parse_types("LOCAL"), Ok(addr_type::LOCAL));
        assert_eq!(parse_types("local"), Ok(addr_type::LOCAL));
        assert_eq!(parse_types("loc"), Ok(addr_type::LOCAL));
        assert_eq!(parse_types("U"), Ok(addr_type::UNSPEC));
        assert_eq!(parse_types("UNI"), Ok(addr_type::UNICAST));
        assert_eq!(
            parse_types("ANYCAST,LOCAL"),
            Ok(addr_type::ANYCAST | addr_type::LOCAL)
        );
        assert_eq!(parse_types("wrong"), Err("wrong"));
        assert_eq!(parse_types("LOCAL,"), Err(""));
        assert_eq!(parse_types(",LOCAL"), Err(""));
        assert_eq!(parse_types("LOCALX"), Err("LOCALX"));
        assert_eq!(
            addr_type::names(addr_type::LOCAL | addr_type::UNSPEC),
            "UNSPEC,LOCAL"
        );
    }
}
