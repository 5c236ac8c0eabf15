//! IP-header matches the engine enforces: `ttl` (IPv4), `hl` (IPv6), `tos`, `dscp`, `ecn`,
//! `ah` (IPv4), and the IPv6 extension-header matches `frag`, `rt` and `ipv6header`.
//!
//! The line parser collects their options as it does for an opaque extension (each option with
//! its `!` and the words after it); [`typed`] then reads them with the extension's grammar in
//! iptables 1.8.9 (the `libipt_ttl`, `libip6t_hl`, `libxt_tos`, `libxt_dscp`, `libxt_ecn`,
//! `libipt_ah`, `libip6t_frag`, `libip6t_rt`, `libip6t_ipv6header` parsers and the kernel's
//! checkentry functions) into a typed [`Match`]. An error is located at the extension's name.
//!
//! Canonical values (what `restore::print` writes) are iptables-save's, checked with
//! `iptables-legacy-save` 1.8.9, with one deliberate difference: a negated full range
//! (`! --ahspi 0:4294967295`, `! --fragid :`, `! --rt-segsleft 0:`), which never matches, is
//! printed with its `!` as iptables 1.8.11 does; 1.8.9 drops the `!` and so prints a rule that
//! matches everything.

use crate::model::{
    EcnMatch, Family, FragMatch, IdRange, Ipv6HeaderMatch, Match, Neg, OpaqueOption, RtMatch,
    TosValue, TtlMatch, TtlOp, ipv6_ext,
};

use super::ext_options::{ExtOptions, Opt};
use super::extensions::parse_uint;
use super::lexer::Tok;
use super::opaque::{dscp_class, dscp_number, tos_value};
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// The names [`typed`] handles in `family` (the others stay opaque).
pub(crate) fn is_typed(name: &str, family: Family) -> bool {
    match family {
        Family::Ipv4 => matches!(name, "ttl" | "tos" | "dscp" | "ecn" | "ah"),
        Family::Ipv6 => matches!(
            name,
            "hl" | "tos" | "dscp" | "ecn" | "frag" | "rt" | "ipv6header"
        ),
    }
}

/// Reads the options of `-m name` into a typed match; `None` when `name` is not one of this
/// module's extensions in the family. `proto` is the rule's non-negated `-p`.
pub(crate) fn typed(
    name: &str,
    options: &[OpaqueOption],
    proto: Option<u8>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Option<Match>, ParseError> {
    if !is_typed(name, ctx.family) {
        return Ok(None);
    }
    let r = Reader {
        name,
        x: ExtOptions::check(name, grammar(name), options, token, ctx)?,
    };
    let m = match name {
        "ttl" => Match::Ttl(r.ttl("ttl")?),
        "hl" => Match::Hl(r.ttl("hl")?),
        "tos" => {
            let o = r.exactly_one(&["--tos"])?;
            let (value, mask) = tos_value(r.arg(o)?, &|s| r.bad(s))?;
            Match::Tos(Neg {
                negated: o.negated,
                value: TosValue { value, mask },
            })
        }
        "dscp" => {
            let o = r.exactly_one(&["--dscp", "--dscp-class"])?;
            let a = r.arg(o)?;
            let v = if o.name == "--dscp" {
                dscp_number(a, &|s| r.bad(s))?
            } else {
                dscp_class(a, &|s| r.bad(s))?
            };
            Match::Dscp(Neg {
                negated: o.negated,
                value: v,
            })
        }
        "ecn" => {
            let mut m = EcnMatch::default();
            for o in options {
                match o.name.as_str() {
                    "--ecn-tcp-ece" => m.ece = Some(r.flag(o)?),
                    "--ecn-tcp-cwr" => m.cwr = Some(r.flag(o)?),
                    _ => {
                        let a = r.arg(o)?;
                        let v = parse_uint(a, 3).ok_or_else(|| {
                            r.bad(format!(
                                "bad value for option \"--ecn-ip-ect\", or out of range (0-3): '{a}'"
                            ))
                        })?;
                        m.ect = Some(Neg {
                            negated: o.negated,
                            value: v as u8,
                        });
                    }
                }
            }
            if options.is_empty() {
                return Err(r.missing("at least one option"));
            }
            // As ecn_mt_check4/6: "cannot match TCP bits in rule for non-tcp packets".
            if (m.ece.is_some() || m.cwr.is_some()) && proto != Some(6) {
                return Err(ctx.err(
                    token,
                    K::NeedsProtocol {
                        extension: "ecn --ecn-tcp-ece/--ecn-tcp-cwr".into(),
                        proto: "tcp",
                    },
                ));
            }
            Match::Ecn(m)
        }
        "ah" => {
            if proto != Some(51) {
                return Err(ctx.err(
                    token,
                    K::NeedsProtocol {
                        extension: "ah".into(),
                        proto: "ah",
                    },
                ));
            }
            let mut spi = Neg::plain(IdRange::ALL);
            for o in options {
                spi = Neg {
                    negated: o.negated,
                    value: r.id_range(o)?,
                };
            }
            Match::Ah(spi)
        }
        "frag" => {
            let mut m = FragMatch {
                id: Neg::plain(IdRange::ALL),
                len: None,
                res: false,
                first: false,
                more: false,
                last: false,
            };
            for o in options {
                match o.name.as_str() {
                    "--fragid" => {
                        m.id = Neg {
                            negated: o.negated,
                            value: r.id_range(o)?,
                        }
                    }
                    "--fraglen" => {
                        m.len = Some(Neg {
                            negated: o.negated,
                            value: r.u32_arg(o)?,
                        })
                    }
                    "--fragres" => m.res = r.plain_flag(o)?,
                    "--fragfirst" => m.first = r.plain_flag(o)?,
                    "--fragmore" => m.more = r.plain_flag(o)?,
                    _ => m.last = r.plain_flag(o)?,
                }
            }
            if m.more && m.last {
                return Err(r.bad(
                    "option \"--fraglast\" cannot be used together with \"--fragmore\"".into(),
                ));
            }
            Match::Frag(m)
        }
        "rt" => {
            let mut m = RtMatch {
                rt_type: None,
                segsleft: Neg::plain(IdRange::ALL),
                len: None,
                other: Vec::new(),
            };
            for o in options {
                match o.name.as_str() {
                    "--rt-type" => {
                        let a = r.arg(o)?;
                        let v = parse_uint(a, 255)
                            .ok_or_else(|| r.bad(format!("bad --rt-type '{a}' (0-255)")))?;
                        m.rt_type = Some(Neg {
                            negated: o.negated,
                            value: v as u8,
                        });
                    }
                    "--rt-segsleft" => {
                        m.segsleft = Neg {
                            negated: o.negated,
                            value: r.id_range(o)?,
                        }
                    }
                    "--rt-len" => {
                        m.len = Some(Neg {
                            negated: o.negated,
                            value: r.u32_arg(o)?,
                        })
                    }
                    _ => {
                        if o.negated {
                            return Err(r.bad(format!("option \"{}\" cannot be inverted", o.name)));
                        }
                        m.other.push(o.clone());
                    }
                }
            }
            let has = |n: &str| m.other.iter().any(|o| o.name == n);
            if has("--rt-0-not-strict") && !has("--rt-0-addrs") {
                return Err(r.bad("`--rt-0-addrs ...' required before `--rt-0-not-strict'".into()));
            }
            // libip6t_rt prints the type-0 options in this order.
            m.other.sort_by_key(|o| {
                ["--rt-0-res", "--rt-0-addrs", "--rt-0-not-strict"]
                    .iter()
                    .position(|n| *n == o.name)
            });
            Match::Rt(m)
        }
        _ => {
            let mut m = Ipv6HeaderMatch {
                negated: false,
                headers: 0,
                soft: false,
            };
            let mut header = false;
            for o in options {
                if o.name == "--soft" {
                    m.soft = r.plain_flag(o)?;
                    continue;
                }
                header = true;
                m.negated = o.negated;
                for part in r.arg(o)?.split(',') {
                    m.headers |= ipv6_header_bit(part)
                        .ok_or_else(|| r.bad(format!("unknown header `{part}' specified")))?;
                }
            }
            if !header {
                return Err(r.missing("--header"));
            }
            Match::Ipv6Header(m)
        }
    };
    Ok(Some(m))
}

/// `-m ipv6header --header` names as ip6tables 1.8.9 prints them, in print order.
pub(crate) const IPV6_HEADER_NAMES: [(&str, u8); 8] = [
    ("hop-by-hop", ipv6_ext::HOPOPTS),
    ("ipv6-opts", ipv6_ext::DSTOPTS),
    ("ipv6-route", ipv6_ext::ROUTING),
    ("ipv6-frag", ipv6_ext::FRAGMENT),
    ("ah", ipv6_ext::AH),
    ("esp", ipv6_ext::ESP),
    ("ipv6-nonxt", ipv6_ext::NONE),
    ("protocol", ipv6_ext::PROTO),
];

/// One `--header` word: a printed name, libip6t_ipv6header's short names (`hop`, `dst`,
/// `route`, `frag`, `auth`, `esp`, `none`, `prot`) or the protocol number (255 for `prot`).
fn ipv6_header_bit(s: &str) -> Option<u8> {
    if let Some((_, b)) = IPV6_HEADER_NAMES.iter().find(|(n, _)| *n == s) {
        return Some(*b);
    }
    let n = match s {
        "hop" => 0,
        "dst" => 60,
        "route" => 43,
        "frag" => 44,
        "auth" => 51,
        "none" => 59,
        "prot" => 255,
        _ => parse_uint(s, 255)?,
    };
    Some(match n {
        0 => ipv6_ext::HOPOPTS,
        60 => ipv6_ext::DSTOPTS,
        43 => ipv6_ext::ROUTING,
        44 => ipv6_ext::FRAGMENT,
        51 => ipv6_ext::AH,
        50 => ipv6_ext::ESP,
        59 => ipv6_ext::NONE,
        255 => ipv6_ext::PROTO,
        _ => return None,
    })
}

/// The options of each extension.
fn grammar(name: &str) -> &'static [Opt] {
    const TTL: &[Opt] = &[
        Opt::value("--ttl-eq").negatable(),
        Opt::value("--ttl-lt"),
        Opt::value("--ttl-gt"),
    ];
    const HL: &[Opt] = &[
        Opt::value("--hl-eq").negatable(),
        Opt::value("--hl-lt"),
        Opt::value("--hl-gt"),
    ];
    const TOS: &[Opt] = &[Opt::value("--tos").negatable()];
    const DSCP: &[Opt] = &[
        Opt::value("--dscp").negatable(),
        Opt::value("--dscp-class").negatable(),
    ];
    const ECN: &[Opt] = &[
        Opt::flag("--ecn-tcp-ece").negatable(),
        Opt::flag("--ecn-tcp-cwr").negatable(),
        Opt::value("--ecn-ip-ect").negatable(),
    ];
    const AH: &[Opt] = &[Opt::value("--ahspi").negatable()];
    const FRAG: &[Opt] = &[
        Opt::value("--fragid").negatable(),
        Opt::value("--fraglen").negatable(),
        Opt::flag("--fragres"),
        Opt::flag("--fragfirst"),
        Opt::flag("--fragmore"),
        Opt::flag("--fraglast"),
    ];
    const RT: &[Opt] = &[
        Opt::value("--rt-type").negatable(),
        Opt::value("--rt-segsleft").negatable(),
        Opt::value("--rt-len").negatable(),
        Opt::flag("--rt-0-res"),
        Opt::value("--rt-0-addrs"),
        Opt::flag("--rt-0-not-strict"),
    ];
    const IPV6HEADER: &[Opt] = &[Opt::value("--header").negatable(), Opt::flag("--soft")];
    match name {
        "ttl" => TTL,
        "hl" => HL,
        "tos" => TOS,
        "dscp" => DSCP,
        "ecn" => ECN,
        "ah" => AH,
        "frag" => FRAG,
        "rt" => RT,
        "ipv6header" => IPV6HEADER,
        _ => &[],
    }
}

/// The checked options of one extension, and the readers of their values.
struct Reader<'a, 't> {
    name: &'a str,
    x: ExtOptions<'a, 't>,
}

impl Reader<'_, '_> {
    fn bad(&self, reason: String) -> ParseError {
        self.x.bad(reason)
    }

    fn missing(&self, needs: &'static str) -> ParseError {
        self.x.missing(needs)
    }

    /// The one option among `names` (they exclude each other, one is required).
    fn exactly_one(&self, names: &[&str]) -> Result<&OpaqueOption, ParseError> {
        let mut given = self
            .x
            .options()
            .iter()
            .filter(|o| names.contains(&o.name.as_str()));
        match (given.next(), given.next()) {
            (Some(o), None) => Ok(o),
            (None, _) => Err(self.missing(match self.name {
                "ttl" => "--ttl-eq, --ttl-lt or --ttl-gt",
                "hl" => "--hl-eq, --hl-lt or --hl-gt",
                "dscp" => "--dscp or --dscp-class",
                _ => "--tos",
            })),
            (Some(a), Some(b)) => Err(self.bad(format!(
                "option \"{}\" cannot be used together with \"{}\"",
                b.name, a.name
            ))),
        }
    }

    fn arg<'o>(&self, o: &'o OpaqueOption) -> Result<&'o str, ParseError> {
        match o.args.as_slice() {
            [a] => Ok(a),
            _ => Err(self.bad(format!("option \"{}\" takes one argument", o.name))),
        }
    }

    /// A flag option: `Some(negated)` in the model.
    fn flag(&self, o: &OpaqueOption) -> Result<bool, ParseError> {
        Ok(o.negated)
    }

    /// A flag that cannot be negated (checked in [`Self::check_options`]).
    fn plain_flag(&self, _o: &OpaqueOption) -> Result<bool, ParseError> {
        Ok(true)
    }

    fn u32_arg(&self, o: &OpaqueOption) -> Result<u32, ParseError> {
        let a = self.arg(o)?;
        parse_uint(a, u64::from(u32::MAX))
            .map(|v| v as u32)
            .ok_or_else(|| self.bad(format!("{} '{a}' is not a number 0-4294967295", o.name)))
    }

    /// `N`, `LO:HI`, `:HI`, `LO:` or `:` with 32-bit numbers, LO <= HI (as libipt_ah's
    /// parse_spis and libip6t_frag/rt).
    fn id_range(&self, o: &OpaqueOption) -> Result<IdRange, ParseError> {
        let a = self.arg(o)?;
        let num = |s: &str, dflt: u32| {
            if s.is_empty() {
                return Ok(dflt);
            }
            parse_uint(s, u64::from(u32::MAX))
                .map(|v| v as u32)
                .ok_or_else(|| self.bad(format!("{} '{a}': not a 32-bit number", o.name)))
        };
        let r = match a.split_once(':') {
            Some((lo, hi)) => IdRange {
                lo: num(lo, 0)?,
                hi: num(hi, u32::MAX)?,
            },
            None => {
                if a.is_empty() {
                    return Err(self.bad(format!("{} needs a value", o.name)));
                }
                let v = num(a, 0)?;
                IdRange { lo: v, hi: v }
            }
        };
        if r.lo > r.hi {
            return Err(self.bad(format!("{} '{a}': invalid range", o.name)));
        }
        Ok(r)
    }

    /// `-m ttl` / `-m hl`: exactly one comparison with a value 0-255.
    fn ttl(&self, ext: &str) -> Result<TtlMatch, ParseError> {
        let names: [String; 3] = ["eq", "lt", "gt"].map(|k| format!("--{ext}-{k}"));
        let names: [&str; 3] = [&names[0], &names[1], &names[2]];
        let o = self.exactly_one(&names)?;
        let a = self.arg(o)?;
        let v = parse_uint(a, 255).ok_or_else(|| {
            self.bad(format!(
                "bad value for option \"{}\", or out of range (0-255): '{a}'",
                o.name
            ))
        })?;
        let op = match (o.name.rsplit('-').next(), o.negated) {
            (Some("eq"), false) => TtlOp::Eq,
            (Some("eq"), true) => TtlOp::Ne,
            (Some("lt"), _) => TtlOp::Lt,
            _ => TtlOp::Gt,
        };
        Ok(TtlMatch { op, value: v as u8 })
    }
}
