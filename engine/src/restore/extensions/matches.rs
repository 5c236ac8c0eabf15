//! `-m NAME` and its options: [`new_match`] starts a match, [`match_option`] reads each
//! `--option` of a typed match (opaque ones collect theirs with [`opaque_option`]), and
//! [`finish_match`] makes the kernel's protocol checks and the extension's final check, then
//! reads header matches and `addrtype` into their typed form.
//!
//! Parse time only (not on the packet path); every error names the token (line, column).

use crate::model::{
    AddrRange, ConntrackMatch, Family, IcmpMatch, IprangeMatch, LimitMatch, MarkValue, Match,
    MultiportDir, MultiportMatch, Neg, Opaque, OpaqueOption, PortRange, RateUnit, SetDir, SetMatch,
    TcpFlags, TcpMatch, UdpMatch,
};

use super::super::lexer::Tok;
use super::super::rule::{Args, Ctx};
use super::super::{ParseError, ParseErrorKind as K};
use super::values::*;
use super::{OPAQUE_MATCHES, OPAQUE_NEEDS_OPTION, Seen, once};

/// What the line parser tracks of a match (beside the [`Match`] itself) while its line is
/// parsed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatchState<'t> {
    /// Options already given (for "multiple ... not allowed"), one bit per option key.
    seen: Seen,
    /// The `-m NAME` argument (or the option that loaded it implicitly).
    token: Tok<'t>,
}

impl<'t> MatchState<'t> {
    /// The `-m NAME` argument (or the option that loaded the match implicitly).
    pub(crate) fn token(&self) -> Tok<'t> {
        self.token
    }
}

impl MatchState<'_> {
    /// A placeholder (for arrays of states).
    pub(crate) const EMPTY: MatchState<'static> = MatchState {
        seen: 0,
        token: Tok {
            text: "",
            column: 0,
        },
    };
}

/// Whether a match is kept verbatim (an extension the engine does not implement).
pub(crate) fn is_opaque(m: &Match) -> bool {
    matches!(m, Match::Opaque(_))
}

/// Starts `-m NAME`.
pub(crate) fn new_match<'t>(
    name: &str,
    tok: &Tok<'t>,
    ctx: &Ctx<'_>,
) -> Result<(Match, MatchState<'t>), ParseError> {
    let name = match name {
        "icmpv6" | "ipv6-icmp" => "icmp6",
        n => n,
    };
    let m = match name {
        "tcp" => Match::Tcp(TcpMatch::default()),
        "udp" => Match::Udp(UdpMatch::default()),
        "multiport" => Match::Multiport(MultiportMatch {
            dir: MultiportDir::Either,
            negated: false,
            ports: Vec::new(),
        }),
        "icmp" if ctx.family == Family::Ipv4 => Match::Icmp(any_icmp()),
        "icmp6" if ctx.family == Family::Ipv6 => Match::Icmpv6(any_icmp()),
        "conntrack" => Match::Conntrack(ConntrackMatch::default()),
        "state" => Match::State(Neg::plain(0)),
        "iprange" => Match::Iprange(IprangeMatch::default()),
        "set" => Match::Set(SetMatch {
            negated: false,
            name: String::new(),
            dirs: Vec::new(),
            other: Vec::new(),
        }),
        "comment" => Match::Comment(String::new()),
        "mark" => Match::Mark(Neg::plain(MarkValue {
            value: 0,
            mask: u32::MAX,
        })),
        "length" => Match::Length(Neg::plain(PortRange { lo: 0, hi: 65535 })),
        "limit" => Match::Limit(LimitMatch {
            rate: 3,
            unit: RateUnit::Hour,
            burst: 5,
        }),
        "mac" => Match::Mac(Neg::plain([0; 6])),
        // Family-specific extensions: ip6tables has no libipt_ttl, iptables no libip6t_*.
        "ttl" if ctx.family == Family::Ipv6 => {
            return Err(ctx.err(tok, K::UnknownMatch(name.to_string())));
        }
        "hl" | "frag" | "rt" | "ipv6header" if ctx.family == Family::Ipv4 => {
            return Err(ctx.err(tok, K::UnknownMatch(name.to_string())));
        }
        // Collected like an opaque extension; `finish_match` reads the options into a typed
        // match where `header_matches` knows the extension.
        n if OPAQUE_MATCHES.contains(&n) => Match::Opaque(Opaque {
            name: n.to_string(),
            options: Vec::new(),
        }),
        _ => return Err(ctx.err(tok, K::UnknownMatch(name.to_string()))),
    };
    Ok((
        m,
        MatchState {
            seen: 0,
            token: *tok,
        },
    ))
}

fn any_icmp() -> IcmpMatch {
    IcmpMatch {
        negated: false,
        icmp_type: None,
        code: (0, 255),
    }
}

/// Handles `--name` for a known match; `None` when the match has no such option.
pub(crate) fn match_option(
    m: &mut Match,
    st: &mut MatchState<'_>,
    name: &str,
    negated: bool,
    args: &mut Args<'_, '_>,
    ctx: &Ctx<'_>,
) -> Option<Result<(), ParseError>> {
    let seen = &mut st.seen;
    let r = match m {
        Match::Tcp(m) => match name {
            "--sport" | "--source-port" => {
                ports_opt(&mut m.sport, seen, 0, "--sport", negated, args, ctx)
            }
            "--dport" | "--destination-port" => {
                ports_opt(&mut m.dport, seen, 1, "--dport", negated, args, ctx)
            }
            "--syn" => once(seen, 2, negated, true, args, ctx, name).map(|()| {
                m.flags = Some(Neg {
                    negated,
                    value: TcpFlags {
                        mask: 0x17,
                        comp: 0x02,
                    },
                });
            }),
            "--tcp-flags" => once(seen, 2, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                let b = args.next_plain()?;
                m.flags = Some(Neg {
                    negated,
                    value: TcpFlags {
                        mask: tcp_flag_list(&a, ctx)?,
                        comp: tcp_flag_list(&b, ctx)?,
                    },
                });
                Ok(())
            }),
            "--tcp-option" => once(seen, 3, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                let v = parse_uint(a.text, 255)
                    .ok_or_else(|| invalid(ctx, &a, "TCP option", "not a number 0-255"))?;
                m.option = Some(Neg {
                    negated,
                    value: v as u8,
                });
                Ok(())
            }),
            _ => return None,
        },
        Match::Udp(m) => match name {
            "--sport" | "--source-port" => {
                ports_opt(&mut m.sport, seen, 0, "--sport", negated, args, ctx)
            }
            "--dport" | "--destination-port" => {
                ports_opt(&mut m.dport, seen, 1, "--dport", negated, args, ctx)
            }
            _ => return None,
        },
        Match::Multiport(m) => {
            let dir = match name {
                "--sports" | "--source-ports" => MultiportDir::Source,
                "--dports" | "--destination-ports" => MultiportDir::Destination,
                "--ports" => MultiportDir::Either,
                _ => return None,
            };
            once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                m.dir = dir;
                m.negated = negated;
                m.ports = multiport_list(&a, ctx)?;
                Ok(())
            })
        }
        Match::Icmp(m) | Match::Icmpv6(m) => {
            let v6 = ctx.family == Family::Ipv6;
            if name != if v6 { "--icmpv6-type" } else { "--icmp-type" } {
                return None;
            }
            once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                *m = parse_icmp(&a, v6, ctx)?;
                m.negated = negated;
                Ok(())
            })
        }
        Match::Conntrack(m) => return conntrack_option(m, seen, name, negated, args, ctx),
        Match::State(s) => match name {
            "--state" => once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                *s = Neg {
                    negated,
                    value: parse_states(&a, false, ctx)?,
                };
                Ok(())
            }),
            _ => return None,
        },
        Match::Iprange(m) => {
            let slot = match name {
                "--src-range" => &mut m.src,
                "--dst-range" => &mut m.dst,
                _ => return None,
            };
            let key = usize::from(name != "--src-range");
            once(seen, key, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                // A single address is the range of just it (libxt_iprange: FROM[-TO]).
                let (lo, hi) = a.text.split_once('-').unwrap_or((a.text, a.text));
                let lo = parse_addr(&a, lo, ctx.family, ctx)?;
                let hi = parse_addr(&a, hi, ctx.family, ctx)?;
                *slot = Some(Neg {
                    negated,
                    value: AddrRange { lo, hi },
                });
                Ok(())
            })
        }
        Match::Set(m) => return set_option(m, seen, name, negated, args, ctx),
        Match::Comment(c) => match name {
            "--comment" => once(seen, 0, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                if a.text.len() > 255 {
                    return Err(ctx.err(
                        &a,
                        K::TooLong {
                            what: "comment",
                            max: 255,
                        },
                    ));
                }
                *c = a.text.to_string();
                Ok(())
            }),
            _ => return None,
        },
        Match::Connmark(_) | Match::Owner(_) | Match::Physdev(_) => return None,
        Match::Mark(mk) => match name {
            "--mark" => once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                *mk = Neg {
                    negated,
                    value: parse_mark(&a, ctx)?,
                };
                Ok(())
            }),
            _ => return None,
        },
        Match::Length(l) => match name {
            "--length" => once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                let (lo, hi) = parse_range(&a, ctx, "length", 65535)?;
                *l = Neg {
                    negated,
                    value: PortRange {
                        lo: lo as u16,
                        hi: hi as u16,
                    },
                };
                Ok(())
            }),
            _ => return None,
        },
        Match::Limit(l) => match name {
            "--limit" => once(seen, 0, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                let (rate, unit) = parse_rate(&a, ctx)?;
                l.rate = rate;
                l.unit = unit;
                Ok(())
            }),
            "--limit-burst" => once(seen, 1, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                l.burst = parse_uint(a.text, 10000)
                    .ok_or_else(|| invalid(ctx, &a, "burst", "not a number 0-10000"))?
                    as u32;
                Ok(())
            }),
            _ => return None,
        },
        Match::Mac(mac) => match name {
            "--mac-source" => once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                *mac = Neg {
                    negated,
                    value: parse_mac(&a, ctx)?,
                };
                Ok(())
            }),
            _ => return None,
        },
        // Collected as opaque while the line is parsed (see `header_matches`).
        Match::Opaque(_)
        | Match::Ttl(_)
        | Match::Hl(_)
        | Match::Tos(_)
        | Match::Dscp(_)
        | Match::Ecn(_)
        | Match::Ah(_)
        | Match::Frag(_)
        | Match::Rt(_)
        | Match::Ipv6Header(_)
        | Match::AddrType(_)
        | Match::Rpfilter(_)
        | Match::PktType(_)
        | Match::Recent(_)
        | Match::Hashlimit(_)
        | Match::Connlimit(_)
        | Match::String(_)
        | Match::Sctp(_)
        | Match::U32(_) => return None,
    };
    Some(r)
}

fn ports_opt(
    slot: &mut Option<Neg<PortRange>>,
    seen: &mut Seen,
    key: usize,
    opt: &str,
    negated: bool,
    args: &mut Args<'_, '_>,
    ctx: &Ctx<'_>,
) -> Result<(), ParseError> {
    once(seen, key, negated, true, args, ctx, opt)?;
    let a = args.next()?;
    let r = port_range(&a, ctx)?;
    // A full range not negated matches everything: iptables-save omits it.
    *slot = (negated || r != PortRange { lo: 0, hi: 65535 }).then_some(Neg { negated, value: r });
    Ok(())
}

/// The options of `-m conntrack` other than `--ctstate`, in libxt_conntrack's print order.
const CONNTRACK_ORDER: [&str; 12] = [
    "--ctproto",
    "--ctorigsrc",
    "--ctorigdst",
    "--ctreplsrc",
    "--ctrepldst",
    "--ctorigsrcport",
    "--ctorigdstport",
    "--ctreplsrcport",
    "--ctrepldstport",
    "--ctstatus",
    "--ctexpire",
    "--ctdir",
];

fn conntrack_option(
    m: &mut ConntrackMatch,
    seen: &mut Seen,
    name: &str,
    negated: bool,
    args: &mut Args<'_, '_>,
    ctx: &Ctx<'_>,
) -> Option<Result<(), ParseError>> {
    if name == "--ctstate" {
        return Some(
            once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                m.ctstate = Some(Neg {
                    negated,
                    value: parse_states(&a, true, ctx)?,
                });
                Ok(())
            }),
        );
    }
    let i = CONNTRACK_ORDER.iter().position(|k| *k == name)?;
    let key = CONNTRACK_ORDER[i];
    Some((|| {
        once(seen, i + 1, negated, key != "--ctdir", args, ctx, name)?;
        let a = args.next()?;
        let value = match key {
            "--ctproto" => {
                let p = parse_protocol(&a, ctx)?;
                if p == 0 {
                    return Err(ctx.err(&a, K::NeverMatches));
                }
                p.to_string()
            }
            "--ctorigsrc" | "--ctorigdst" | "--ctreplsrc" | "--ctrepldst" => {
                let n = parse_net(&a, ctx.family, ctx)?;
                match n.prefix_len() {
                    Some(32) if ctx.family == Family::Ipv4 => n.addr.to_string(),
                    Some(128) => n.addr.to_string(),
                    Some(l) => format!("{}/{l}", n.addr),
                    None => format!("{}/{}", n.addr, n.mask),
                }
            }
            "--ctstatus" => {
                let mut v = 0;
                for s in a.text.split(',') {
                    v |= if s.eq_ignore_ascii_case("NONE") {
                        0
                    } else {
                        CT_STATUS_NAMES
                            .iter()
                            .find(|(n, _)| n.eq_ignore_ascii_case(s))
                            .map(|(_, b)| *b)
                            .ok_or_else(|| {
                                invalid(ctx, &a, "status", format!("bad status '{s}'"))
                            })?
                    };
                }
                if v == 0 {
                    "NONE".to_string()
                } else {
                    CT_STATUS_NAMES
                        .iter()
                        .filter(|(_, b)| v & b != 0)
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(",")
                }
            }
            "--ctexpire" => {
                let (lo, hi) = parse_range(&a, ctx, "expire time", u64::from(u32::MAX))?;
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}:{hi}")
                }
            }
            "--ctdir" => match a.as_str() {
                "ORIGINAL" | "REPLY" => a.text.to_string(),
                _ => return Err(invalid(ctx, &a, "direction", "ORIGINAL or REPLY")),
            },
            _ => {
                let r = port_range(&a, ctx)?;
                if r.lo == r.hi {
                    r.lo.to_string()
                } else {
                    format!("{}:{}", r.lo, r.hi)
                }
            }
        };
        m.other.push(OpaqueOption {
            negated,
            name: key.to_string(),
            args: vec![value],
        });
        Ok(())
    })())
}

/// The options of `-m set` after `--match-set`, in libxt_set's print order, and whether they
/// take a number.
const SET_ORDER: [(&str, bool); 9] = [
    ("--return-nomatch", false),
    ("--update-counters", false),
    ("--update-subcounters", false),
    ("--packets-eq", true),
    ("--packets-lt", true),
    ("--packets-gt", true),
    ("--bytes-eq", true),
    ("--bytes-lt", true),
    ("--bytes-gt", true),
];

fn set_option(
    m: &mut SetMatch,
    seen: &mut Seen,
    name: &str,
    negated: bool,
    args: &mut Args<'_, '_>,
    ctx: &Ctx<'_>,
) -> Option<Result<(), ParseError>> {
    if name == "--match-set" || name == "--set" {
        return Some(
            once(seen, 0, negated, true, args, ctx, name).and_then(|()| {
                let n = args.next()?;
                // The grammar every set is created with.
                if let Err(why) = crate::sets::ipset::check_name(n.text) {
                    return Err(invalid(ctx, &n, "set name", why));
                }
                let f = args.next_plain()?;
                let mut dirs = Vec::new();
                for d in f.text.split(',') {
                    dirs.push(match d {
                        "src" => SetDir::Src,
                        "dst" => SetDir::Dst,
                        _ => {
                            return Err(invalid(
                                ctx,
                                &f,
                                "set flags",
                                "expected src|dst[,src|dst...]",
                            ));
                        }
                    });
                }
                if dirs.len() > 6 {
                    return Err(invalid(ctx, &f, "set flags", "at most 6 dimensions"));
                }
                if let Some(exists) = ctx.set_exists {
                    if !exists(n.text) {
                        return Err(ctx.err(&n, K::NoSuchSet(n.text.to_string())));
                    }
                }
                m.negated = negated;
                m.name = n.text.to_string();
                m.dirs = dirs;
                Ok(())
            }),
        );
    }
    let i = SET_ORDER.iter().position(|(k, _)| *k == name)?;
    let (key, takes_number) = SET_ORDER[i];
    Some((|| {
        let negatable = key != "--return-nomatch" && !key.ends_with("-lt") && !key.ends_with("-gt");
        once(seen, i + 1, negated, negatable, args, ctx, name)?;
        let mut a = Vec::new();
        if takes_number {
            let t = args.next()?;
            let v = parse_uint(t.text, u64::MAX)
                .ok_or_else(|| invalid(ctx, &t, "counter", "not a number"))?;
            a.push(v.to_string());
        }
        m.other.push(OpaqueOption {
            negated,
            name: key.to_string(),
            args: a,
        });
        Ok(())
    })())
}

/// Appends an option to an opaque match, with every following non-option token as argument.
pub(crate) fn opaque_option(m: &mut Match, name: &str, negated: bool, args: &mut Args<'_, '_>) {
    if let Match::Opaque(o) = m {
        o.options.push(OpaqueOption {
            negated,
            name: name.to_string(),
            args: args.rest_plain(),
        });
    }
}

/// The kernel's protocol checks and each extension's final check.
/// `protocol` is the rule's `-p`.
pub(crate) fn finish_match(
    m: &mut Match,
    st: &MatchState<'_>,
    protocol: Option<Neg<u8>>,
    ctx: &Ctx<'_>,
) -> Result<(), ParseError> {
    let MatchState { seen, token } = *st;
    let proto = protocol.filter(|p| !p.negated).map(|p| p.value);
    let needs = |need: &'static str| {
        Err(ctx.err(
            &token,
            K::MissingOption {
                extension: m_name(&token),
                needs: need,
            },
        ))
    };
    let needs_proto = |ok: bool, proto_names: &'static str| {
        if ok {
            Ok(())
        } else {
            Err(ctx.err(
                &token,
                K::NeedsProtocol {
                    extension: m_name(&token),
                    proto: proto_names,
                },
            ))
        }
    };
    match m {
        Match::Tcp(_) => needs_proto(proto == Some(6), "tcp")?,
        Match::Udp(_) => needs_proto(proto == Some(17), "udp")?,
        Match::Multiport(_) => {
            if seen == 0 {
                return needs("--sports, --dports or --ports");
            }
            needs_proto(
                matches!(proto, Some(6 | 17 | 132 | 33 | 136)),
                "tcp|udp|udplite|sctp|dccp",
            )?
        }
        Match::Icmp(_) => {
            if seen == 0 {
                return needs("--icmp-type");
            }
            needs_proto(proto == Some(1), "icmp")?
        }
        Match::Icmpv6(_) => {
            if seen == 0 {
                return needs("--icmpv6-type");
            }
            needs_proto(proto == Some(58), "ipv6-icmp")?
        }
        Match::Conntrack(c) => {
            if seen == 0 {
                return needs("at least one option");
            }
            c.other
                .sort_by_key(|o| CONNTRACK_ORDER.iter().position(|k| *k == o.name));
        }
        Match::State(_) => {
            if seen == 0 {
                return needs("--state");
            }
        }
        Match::Iprange(_) => {
            if seen == 0 {
                return needs("--src-range or --dst-range");
            }
        }
        Match::Set(s) => {
            if seen & 1 == 0 {
                return needs("--match-set NAME FLAGS");
            }
            s.other
                .sort_by_key(|o| SET_ORDER.iter().position(|k| k.0 == o.name));
        }
        Match::Comment(_) => {
            if seen == 0 {
                return needs("--comment");
            }
        }
        Match::Mark(_) => {
            if seen == 0 {
                return needs("--mark");
            }
        }
        Match::Length(_) => {
            if seen == 0 {
                return needs("--length");
            }
        }
        Match::Mac(_) => {
            if seen == 0 {
                return needs("--mac-source");
            }
        }
        Match::Limit(l) => {
            if l.kernel_overflows() {
                return Err(invalid(
                    ctx,
                    &token,
                    "limit",
                    "the rate times --limit-burst overflows the kernel's credits (xt_limit: \"Overflow, try lower\"); lower the burst or raise the rate",
                ));
            }
        }
        Match::Opaque(o) => {
            if o.options.is_empty() && OPAQUE_NEEDS_OPTION.contains(&o.name.as_str()) {
                return needs("at least one option");
            }
            if o.name == "owner" {
                *m = super::super::owner::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "physdev" {
                *m = super::super::physdev::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "addrtype" {
                *m = super::super::addrtype::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "string" {
                *m = super::super::string::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "connlimit" {
                *m = super::super::connlimit::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "hashlimit" {
                if let Some(t) = super::super::hashlimit::typed(&o.options, &token, ctx)? {
                    *m = t;
                    return Ok(());
                }
            }
            if o.name == "rpfilter" {
                *m = super::super::rpfilter::typed_rpfilter(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "pkttype" {
                *m = super::super::rpfilter::typed_pkttype(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "u32" {
                *m = super::super::u32_match::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "sctp" {
                needs_proto(proto == Some(132), "sctp")?;
                *m = super::super::sctp::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if o.name == "recent" {
                *m = super::super::recent::typed(&o.options, &token, ctx)?;
                return Ok(());
            }
            if let Some(t) =
                super::super::header_matches::typed(&o.name, &o.options, proto, &token, ctx)?
            {
                *m = t;
                return Ok(());
            }
            let wants = match o.name.as_str() {
                "ah" => Some((51, "ah")),
                "esp" => Some((50, "esp")),
                "sctp" => Some((132, "sctp")),
                "dccp" => Some((33, "dccp")),
                "mh" => Some((135, "mh")),
                "tcpmss" => Some((6, "tcp")),
                _ => None,
            };
            if let Some((n, p)) = wants {
                needs_proto(proto == Some(n), p)?;
            }
            super::super::opaque::canonical_match(&o.name, &mut o.options, &token, ctx)?;
            if let Some(t) = super::super::opaque::typed_match(&o.name, &o.options) {
                *m = t;
            }
        }
        // Built from opaque options by `header_matches` (above), checked there.
        Match::Connmark(_)
        | Match::Owner(_)
        | Match::Physdev(_)
        | Match::Ttl(_)
        | Match::Hl(_)
        | Match::Tos(_)
        | Match::Dscp(_)
        | Match::Ecn(_)
        | Match::Ah(_)
        | Match::Frag(_)
        | Match::Rt(_)
        | Match::Ipv6Header(_)
        | Match::AddrType(_)
        | Match::Rpfilter(_)
        | Match::PktType(_)
        | Match::Recent(_)
        | Match::Hashlimit(_)
        | Match::Connlimit(_)
        | Match::String(_)
        | Match::Sctp(_)
        | Match::U32(_) => {}
    }
    Ok(())
}

fn m_name(t: &Tok) -> String {
    t.text.to_string()
}
