//! `-j NAME` and its options: [`new_target`] starts a target (or says NAME is a chain),
//! [`target_option`] reads each `--option` of ACCEPT, DROP, RETURN, REJECT, LOG, NOTRACK and CT
//! (opaque targets collect theirs with [`opaque_target_option`]), and [`finish_target`] makes
//! the final checks (REJECT's tcp-reset needs `-p tcp`, the options an opaque target needs).
//!
//! Parse time only (not on the packet path); every error names the token (line, column).

use crate::model::{
    CtTarget, CtZone, CtZoneSpec, Family, LogTarget, Neg, NflogTarget, Opaque, OpaqueOption,
    RejectWith, TableKind, Target,
};

use super::super::lexer::Tok;
use super::super::rule::{Args, Ctx};
use super::super::{ParseError, ParseErrorKind as K, ParseWarning, ParseWarningKind};
use super::values::*;
use super::{OPAQUE_NEEDS_OPTION, OPAQUE_TARGETS, Seen, once};

/// A target being built while its line is parsed.
pub(crate) struct PendingTarget<'t> {
    /// The target so far.
    pub t: Target,
    seen: Seen,
    /// The `-j NAME` argument (`None` for a jump or goto).
    pub(crate) token: Option<Tok<'t>>,
    /// A value kept in the kernel's form rather than as written (see [`ParseWarning`]).
    pub warning: Option<ParseWarning>,
}

impl PendingTarget<'_> {
    /// A target without options (jump, goto).
    pub(crate) fn plain(t: Target) -> Self {
        PendingTarget {
            t,
            seen: 0,
            token: None,
            warning: None,
        }
    }

    /// The extension name (empty for a jump or goto).
    pub(crate) fn name(&self) -> &str {
        self.token.map_or("", |t| t.text)
    }

    pub(crate) fn is_opaque(&self) -> bool {
        matches!(self.t, Target::Opaque(_))
    }
}

/// Appends an option to an opaque target.
pub(crate) fn opaque_target_option(
    pt: &mut PendingTarget,
    name: &str,
    negated: bool,
    args: &mut Args<'_, '_>,
) {
    if let Target::Opaque(o) = &mut pt.t {
        o.options.push(OpaqueOption {
            negated,
            name: name.to_string(),
            args: args.rest_plain(),
        });
    }
}

/// Starts `-j NAME`; `None` when NAME is no target (then it is a chain to jump to).
pub(crate) fn new_target<'t>(
    tok: &Tok<'t>,
    ctx: &Ctx<'_>,
) -> Result<Option<PendingTarget<'t>>, ParseError> {
    let t = match tok.as_str() {
        "ACCEPT" => Target::Accept,
        "DROP" => Target::Drop,
        "RETURN" => Target::Return,
        "REJECT" => Target::Reject(RejectWith::PortUnreachable),
        "LOG" => Target::Log(LogTarget::default()),
        "NFLOG" => Target::Nflog(NflogTarget::default()),
        "NOTRACK" => Target::Notrack,
        "CT" => Target::Ct(CtTarget::default()),
        n if OPAQUE_TARGETS.contains(&n) => Target::Opaque(Opaque {
            name: n.to_string(),
            options: Vec::new(),
        }),
        _ => return Ok(None),
    };
    if matches!(t, Target::Notrack | Target::Ct(_)) && ctx.table != TableKind::Raw {
        return Err(ctx.err(
            tok,
            K::WrongTable {
                extension: tok.text.to_string(),
                table: "raw",
            },
        ));
    }
    Ok(Some(PendingTarget {
        t,
        seen: 0,
        token: Some(*tok),
        warning: None,
    }))
}

/// REJECT names per family: (IPv4 names, IPv6 names, value); the first name is printed.
pub(crate) const REJECT_NAMES: &[(&[&str], &[&str], RejectWith)] = &[
    (
        &["icmp-net-unreachable", "net-unreach"],
        &["icmp6-no-route", "no-route"],
        RejectWith::NetUnreachable,
    ),
    (
        &["icmp-host-unreachable", "host-unreach"],
        &["icmp6-addr-unreachable", "addr-unreach"],
        RejectWith::HostUnreachable,
    ),
    (
        &["icmp-port-unreachable", "port-unreach"],
        &["icmp6-port-unreachable", "port-unreach"],
        RejectWith::PortUnreachable,
    ),
    (
        &["icmp-proto-unreachable", "proto-unreach"],
        &[],
        RejectWith::ProtoUnreachable,
    ),
    (
        &["icmp-net-prohibited", "net-prohib"],
        &[],
        RejectWith::NetProhibited,
    ),
    (
        &["icmp-host-prohibited", "host-prohib"],
        &[],
        RejectWith::HostProhibited,
    ),
    (
        &["icmp-admin-prohibited", "admin-prohib"],
        &["icmp6-adm-prohibited", "adm-prohibited"],
        RejectWith::AdminProhibited,
    ),
    (
        &["tcp-reset", "tcp-rst"],
        &["tcp-reset", "tcp-rst"],
        RejectWith::TcpReset,
    ),
    (
        &[],
        &["icmp6-policy-fail", "policy-fail"],
        RejectWith::PolicyFail,
    ),
    (
        &[],
        &["icmp6-reject-route", "reject-route"],
        RejectWith::RejectRoute,
    ),
];

/// LOG levels (syslog names; iptables-save prints numbers).
const LOG_LEVELS: [(&str, u8); 10] = [
    ("emerg", 0),
    ("panic", 0),
    ("alert", 1),
    ("crit", 2),
    ("error", 3),
    ("err", 3),
    ("warning", 4),
    ("warn", 4),
    ("notice", 5),
    ("info", 6),
];

/// The longest `--log-prefix` the kernel keeps, in bytes (`ipt_log_info.prefix[30]`, NUL
/// included).
pub(crate) const LOG_PREFIX_MAX: usize = 29;

/// The longest `--nflog-prefix` the kernel keeps, in bytes (`xt_nflog_info.prefix[64]`).
pub(crate) const NFLOG_PREFIX_MAX: usize = 63;

/// A prefix option's value: no newline, at least one byte (libxt_LOG / libxt_NFLOG's option
/// tables), cut to `max` bytes at a character boundary with a warning made by `warn`.
fn prefix_value(
    a: &Tok<'_>,
    max: usize,
    ctx: &Ctx<'_>,
    warning: &mut Option<ParseWarning>,
    warn: impl FnOnce(usize, String) -> ParseWarningKind,
) -> Result<String, ParseError> {
    if a.text.contains('\n') {
        return Err(invalid(ctx, a, "log prefix", "no newline allowed"));
    }
    if a.text.is_empty() {
        return Err(invalid(
            ctx,
            a,
            "log prefix",
            "Argument must have a minimum length of 1 characters",
        ));
    }
    let mut kept = a.text;
    if kept.len() > max {
        let mut end = max;
        while !kept.is_char_boundary(end) {
            end -= 1;
        }
        kept = &kept[..end];
        *warning = Some(ParseWarning::new(
            ctx.line,
            a.column,
            a.text,
            warn(a.text.len(), kept.to_string()),
        ));
    }
    Ok(kept.to_string())
}

/// LOG flags in libipt_LOG's print order.
pub(crate) const LOG_FLAGS: [&str; 5] = [
    "--log-tcp-sequence",
    "--log-tcp-options",
    "--log-ip-options",
    "--log-uid",
    "--log-macdecode",
];

/// CT event names in libxt_CT's print order.
const CT_EVENTS: [&str; 10] = [
    "new",
    "related",
    "destroy",
    "reply",
    "assured",
    "protoinfo",
    "helper",
    "mark",
    "natseqinfo",
    "secmark",
];

/// CT options other than `--notrack`, in libxt_CT's print order.
const CT_ORDER: [&str; 7] = [
    "--helper",
    "--timeout",
    "--ctevents",
    "--expevents",
    "--zone-orig",
    "--zone-reply",
    "--zone",
];

/// Handles `--name` for a known target; `None` when it has no such option.
pub(crate) fn target_option(
    pt: &mut PendingTarget,
    name: &str,
    negated: bool,
    args: &mut Args<'_, '_>,
    ctx: &Ctx<'_>,
) -> Option<Result<(), ParseError>> {
    let seen = &mut pt.seen;
    let warning = &mut pt.warning;
    let r = match &mut pt.t {
        Target::Reject(w) => {
            if name != "--reject-with" {
                return None;
            }
            once(seen, 0, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                let v6 = ctx.family == Family::Ipv6;
                *w = REJECT_NAMES
                    .iter()
                    .find(|(n4, n6, _)| if v6 { n6 } else { n4 }.contains(&a.as_str()))
                    .map(|e| e.2)
                    .ok_or_else(|| invalid(ctx, &a, "reject type", "unknown for this family"))?;
                Ok(())
            })
        }
        Target::Log(l) => match name {
            "--log-prefix" => once(seen, 0, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                // As libxt_LOG's option table (`.min = 1`).
                let kept = prefix_value(&a, LOG_PREFIX_MAX, ctx, warning, |len, kept| {
                    ParseWarningKind::LogPrefixTruncated { len, kept }
                })?;
                l.prefix = Some(kept);
                Ok(())
            }),
            "--log-level" => once(seen, 1, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                let lv = LOG_LEVELS
                    .iter()
                    .find(|(n, _)| *n == a.text)
                    .map(|(_, v)| *v)
                    .or_else(|| {
                        if a.text == "debug" {
                            Some(7)
                        } else {
                            parse_uint(a.text, 7).map(|v| v as u8)
                        }
                    })
                    .ok_or_else(|| invalid(ctx, &a, "log level", "a syslog level name or 0-7"))?;
                // 4 (warning) is the default and iptables-save omits it.
                l.level = (lv != 4).then_some(lv);
                Ok(())
            }),
            f => {
                let i = LOG_FLAGS.iter().position(|k| *k == f)?;
                let key = LOG_FLAGS[i];
                once(seen, i + 2, negated, false, args, ctx, name).map(|()| {
                    l.flags.push(key.to_string());
                    l.flags
                        .sort_by_key(|x| LOG_FLAGS.iter().position(|k| k == x));
                })
            }
        },
        Target::Nflog(n) => match name {
            "--nflog-group" => once(seen, 0, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                n.group = parse_uint(a.text, 65535)
                    .ok_or_else(|| invalid(ctx, &a, "nflog group", "not a number 0-65535"))?
                    as u16;
                Ok(())
            }),
            "--nflog-prefix" => once(seen, 1, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                let kept = prefix_value(&a, NFLOG_PREFIX_MAX, ctx, warning, |len, kept| {
                    ParseWarningKind::NflogPrefixTruncated { len, kept }
                })?;
                n.prefix = Some(kept);
                Ok(())
            }),
            "--nflog-range" | "--nflog-size" => {
                let key = if name == "--nflog-range" { 2 } else { 3 };
                once(seen, key, negated, false, args, ctx, name).and_then(|()| {
                    let a = args.next()?;
                    let v = parse_uint(a.text, u64::from(u32::MAX)).ok_or_else(|| {
                        invalid(ctx, &a, "nflog length", "not a number 0-4294967295")
                    })? as u32;
                    if key == 2 {
                        n.range = v;
                    } else {
                        n.size = Some(v);
                    }
                    Ok(())
                })
            }
            "--nflog-threshold" => once(seen, 4, negated, false, args, ctx, name).and_then(|()| {
                let a = args.next()?;
                n.threshold = parse_uint(a.text, 65535)
                    .ok_or_else(|| invalid(ctx, &a, "nflog threshold", "not a number 0-65535"))?
                    as u16;
                Ok(())
            }),
            _ => return None,
        },
        Target::Ct(c) => {
            if name == "--notrack" {
                return Some(once(seen, 0, negated, false, args, ctx, name).map(|()| {
                    c.notrack = true;
                }));
            }
            let i = CT_ORDER.iter().position(|k| *k == name)?;
            let key = CT_ORDER[i];
            (|| {
                once(seen, i + 1, negated, false, args, ctx, name)?;
                let a = args.next()?;
                if let Some(dir) = match key {
                    "--zone-orig" => Some(CtZone::ORIG),
                    "--zone-reply" => Some(CtZone::REPLY),
                    "--zone" => Some(0),
                    _ => None,
                } {
                    // As libxt_CT: each option sets the one id (`mark` or 0-65535) and
                    // adds its direction; none or both mean both.
                    let (id, from_mark) = if a.text == "mark" {
                        (0, true)
                    } else {
                        let id = parse_uint(a.text, 65535).ok_or_else(|| {
                            invalid(ctx, &a, "zone", "not a number 0-65535 or `mark`")
                        })?;
                        (id as u16, false)
                    };
                    let dirs = c.zone.map_or(0, |z| z.dirs) | dir;
                    c.zone = Some(CtZoneSpec {
                        id,
                        from_mark,
                        dirs,
                    });
                    return Ok(());
                }
                let value = match key {
                    "--ctevents" | "--expevents" => {
                        let mut bits = 0u32;
                        for e in a.text.split(',') {
                            let i = CT_EVENTS
                                .iter()
                                .position(|n| *n == e)
                                .filter(|&i| key == "--ctevents" || i == 0)
                                .ok_or_else(|| {
                                    invalid(ctx, &a, "event", format!("unknown event '{e}'"))
                                })?;
                            bits |= 1 << i;
                        }
                        CT_EVENTS
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| bits & (1 << i) != 0)
                            .map(|(_, n)| *n)
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                    _ => {
                        if a.text.is_empty() || a.text.len() > 15 {
                            return Err(invalid(ctx, &a, "name", "1 to 15 bytes"));
                        }
                        a.text.to_string()
                    }
                };
                c.other.push(OpaqueOption {
                    negated: false,
                    name: key.to_string(),
                    args: vec![value],
                });
                c.other
                    .sort_by_key(|o| CT_ORDER.iter().position(|k| *k == o.name));
                Ok(())
            })()
        }
        _ => return None,
    };
    Some(r)
}

/// Each target's final check (REJECT tcp-reset needs `-p tcp`).
/// `protocol` is the rule's `-p`.
pub(crate) fn finish_target(
    mut pt: PendingTarget,
    protocol: Option<Neg<u8>>,
    ctx: &Ctx<'_>,
) -> Result<Target, ParseError> {
    if let Target::Reject(RejectWith::TcpReset) = pt.t {
        let tcp = protocol == Some(Neg::plain(6));
        if !tcp {
            let tok = pt.token.unwrap_or(Tok {
                text: "REJECT",
                column: 0,
            });
            return Err(ctx.err(
                &tok,
                K::NeedsProtocol {
                    extension: "REJECT --reject-with tcp-reset".into(),
                    proto: "tcp",
                },
            ));
        }
    }
    if let (Target::Opaque(o), Some(tok)) = (&mut pt.t, &pt.token) {
        if o.options.is_empty() && OPAQUE_NEEDS_OPTION.contains(&o.name.as_str()) {
            return Err(ctx.err(
                tok,
                K::MissingOption {
                    extension: o.name.clone(),
                    needs: "at least one option",
                },
            ));
        }
        super::super::nat::check_target(&o.name, &mut o.options, protocol, tok, ctx)?;
        super::super::opaque::canonical_target(&o.name, &mut o.options, tok, ctx)?;
        if let Some(t) = super::super::opaque::typed_target(&o.name, &o.options) {
            return Ok(t);
        }
    }
    if let Target::Ct(c) = &mut pt.t {
        if let Some(z) = &mut c.zone {
            if z.dirs == 0 {
                z.dirs = CtZone::ORIG | CtZone::REPLY;
            }
        }
        // Zone 0 (not `mark`) is the default zone and iptables-save omits it.
        if c.zone.is_some_and(|z| z.id == 0 && !z.from_mark) {
            c.zone = None;
        }
    }
    Ok(pt.t)
}
