//! Canonical forms of some extensions the engine keeps opaque ([`crate::model::Opaque`]): the
//! options are rewritten into what iptables-save 1.8.9 prints for the rule, so that stored
//! nat and mangle tables (Kubernetes, Docker, Calico) export byte-equal to the kernel's save.
//! Each form below was checked against `iptables-legacy-save` (see
//! `tests/oracle/save-forms.txt`):
//!
//! - `-m statistic`: `--mode random [!] --probability P`, with P as the kernel keeps it
//!   (`lround(P * 2^31)`, printed `%.11f`: 0.3333333333 -> 0.33333333349); `--mode nth [!]
//!   --every N --packet P` in decimal;
//! - `-m connmark --mark V[/M]`: hex, the mask omitted when all ones (as `-m mark`);
//! - `-m tos --tos V[/M]` and `-j TOS`: `0x%02x/0x%02x`; a symbolic name has mask 0x3f, a
//!   number without mask 0xff; `--and-tos`/`--or-tos`/`--xor-tos` become `--set-tos`;
//! - `-m dscp` / `-j DSCP`: `--dscp 0x%02x` / `--set-dscp 0x%02x`, classes (`EF`, `AF41`) as
//!   numbers;
//! - `-j MARK`: `--set-xmark V/M` for `--set-mark`, `--and-mark`, `--or-mark`, `--xor-mark`;
//! - `-j CONNMARK`: `--set-xmark V/M` likewise; `--save-mark` / `--restore-mark` with both
//!   `--nfmask` and `--ctmask` (`--mask M` sets both, defaults all ones);
//! - `-j CLASSIFY --set-class MAJOR:MINOR`: `%04x:%04x`;
//! - `-m policy`: libxt_policy's grammar and save order (`opaque/policy.rs`).
//!
//! An option list that does not fit the extension's grammar is an error located at the
//! extension's name (the option tokens are not kept); an option not listed here is kept as
//! written.

use crate::model::{ConnmarkTarget, MarkValue, Match, Neg, OpaqueOption, Target};

mod policy;
mod stored;
pub(crate) use stored::QUOTED;

use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

fn opt(name: &str, negated: bool, args: Vec<String>) -> OpaqueOption {
    OpaqueOption {
        negated,
        name: name.to_string(),
        args,
    }
}

/// The one argument of an option, or an error naming it.
fn one_arg<'o>(
    o: &'o OpaqueOption,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<&'o str, ParseError> {
    match o.args.as_slice() {
        [a] => Ok(a),
        _ => Err(bad(format!("option '{}' takes one argument", o.name))),
    }
}

fn u32_value(s: &str, what: &str, bad: &dyn Fn(String) -> ParseError) -> Result<u32, ParseError> {
    parse_uint(s, u64::from(u32::MAX))
        .map(|v| v as u32)
        .ok_or_else(|| bad(format!("{what} '{s}' is not a 32-bit number")))
}

/// `V[/M]` with 32-bit numbers; `None` for the mask when not written.
fn value_mask(
    s: &str,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(u32, Option<u32>), ParseError> {
    match s.split_once('/') {
        Some((v, m)) => Ok((
            u32_value(v, "value", bad)?,
            Some(u32_value(m, "mask", bad)?),
        )),
        None => Ok((u32_value(s, "value", bad)?, None)),
    }
}

/// Fails unless exactly one of `names` is among the options (an extension's mandatory,
/// exclusive options).
fn exactly_one(
    options: &[OpaqueOption],
    names: &[&str],
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    match options
        .iter()
        .filter(|o| names.contains(&o.name.as_str()))
        .count()
    {
        1 => Ok(()),
        0 => Err(bad(format!("needs {}", names.join(" or ")))),
        _ => Err(bad(format!("only one of {}", names.join(", ")))),
    }
}

fn hex_pair(v: u32, m: u32) -> String {
    format!("{v:#x}/{m:#x}")
}

/// The error of extension `name`'s option at `token`: `name: reason`.
fn option_error(ctx: &Ctx<'_>, token: &Tok<'_>, name: &str, reason: String) -> ParseError {
    ctx.err(
        token,
        K::InvalidValue {
            what: "extension option",
            reason: format!("{name}: {reason}"),
        },
    )
}

/// Rewrites an opaque match's options into iptables-save's form (see the module docs).
pub(crate) fn canonical_match(
    name: &str,
    options: &mut Vec<OpaqueOption>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<(), ParseError> {
    let bad = |reason: String| option_error(ctx, token, name, reason);
    if stored::MATCHES.contains(&name) {
        return stored::canonical_match(name, options, token, ctx, &bad);
    }
    if name == "policy" {
        return policy::policy(options, token, ctx, &bad);
    }
    match name {
        "statistic" => statistic(options, &bad),
        "connmark" => {
            exactly_one(options, &["--mark"], &bad)?;
            for o in options.iter_mut() {
                if o.name == "--mark" {
                    let (v, m) = value_mask(one_arg(o, &bad)?, &bad)?;
                    let m = m.unwrap_or(u32::MAX);
                    o.args = vec![if m == u32::MAX {
                        format!("{v:#x}")
                    } else {
                        hex_pair(v, m)
                    }];
                }
            }
            Ok(())
        }
        "tos" => {
            exactly_one(options, &["--tos"], &bad)?;
            for o in options.iter_mut() {
                if o.name == "--tos" {
                    let (v, m) = tos_value(one_arg(o, &bad)?, &bad)?;
                    o.args = vec![format!("0x{v:02x}/0x{m:02x}")];
                }
            }
            Ok(())
        }
        "dscp" => {
            exactly_one(options, &["--dscp", "--dscp-class"], &bad)?;
            for o in options.iter_mut() {
                let v = match o.name.as_str() {
                    "--dscp" => dscp_number(one_arg(o, &bad)?, &bad)?,
                    "--dscp-class" => dscp_class(one_arg(o, &bad)?, &bad)?,
                    _ => continue,
                };
                *o = opt("--dscp", o.negated, vec![format!("0x{v:02x}")]);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Rewrites an opaque target's options into iptables-save's form (see the module docs).
pub(crate) fn canonical_target(
    name: &str,
    options: &mut Vec<OpaqueOption>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<(), ParseError> {
    let bad = |reason: String| option_error(ctx, token, name, reason);
    if name == "NFQUEUE" {
        return stored::nfqueue(options, token, ctx, &bad);
    }
    if name == "SET" {
        return stored::set_target(options, token, ctx);
    }
    match name {
        "MARK" => mark(options, &bad),
        "CONNMARK" => connmark(options, &bad),
        "TOS" => {
            exactly_one(
                options,
                &["--set-tos", "--and-tos", "--or-tos", "--xor-tos"],
                &bad,
            )?;
            for o in options.iter_mut() {
                let (v, m) = match o.name.as_str() {
                    "--set-tos" => tos_value(one_arg(o, &bad)?, &bad)?,
                    "--and-tos" => (0, !tos_byte(one_arg(o, &bad)?, &bad)?),
                    "--or-tos" => {
                        let v = tos_byte(one_arg(o, &bad)?, &bad)?;
                        (v, v)
                    }
                    "--xor-tos" => (tos_byte(one_arg(o, &bad)?, &bad)?, 0),
                    _ => continue,
                };
                *o = opt("--set-tos", o.negated, vec![format!("0x{v:02x}/0x{m:02x}")]);
            }
            Ok(())
        }
        "DSCP" => {
            exactly_one(options, &["--set-dscp", "--set-dscp-class"], &bad)?;
            for o in options.iter_mut() {
                let v = match o.name.as_str() {
                    "--set-dscp" => dscp_number(one_arg(o, &bad)?, &bad)?,
                    "--set-dscp-class" => dscp_class(one_arg(o, &bad)?, &bad)?,
                    _ => continue,
                };
                *o = opt("--set-dscp", o.negated, vec![format!("0x{v:02x}")]);
            }
            Ok(())
        }
        "CLASSIFY" => {
            exactly_one(options, &["--set-class"], &bad)?;
            for o in options.iter_mut() {
                if o.name == "--set-class" {
                    let a = one_arg(o, &bad)?;
                    let part = |s: &str| {
                        let h = s
                            .strip_prefix("0x")
                            .or_else(|| s.strip_prefix("0X"))
                            .unwrap_or(s);
                        (!h.is_empty() && h.len() <= 4)
                            .then(|| u16::from_str_radix(h, 16).ok())
                            .flatten()
                    };
                    let (maj, min) = a
                        .split_once(':')
                        .and_then(|(a, b)| Some((part(a)?, part(b)?)))
                        .ok_or_else(|| bad(format!("Bad class value \"{a}\"")))?;
                    o.args = vec![format!("{maj:04x}:{min:04x}")];
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// `V` or `V/M` as the canonical forms above print them (mask all ones when absent).
fn read_mark(s: &str) -> Option<MarkValue> {
    let num = |x: &str| parse_uint(x, u64::from(u32::MAX)).map(|v| v as u32);
    Some(match s.split_once('/') {
        Some((v, m)) => MarkValue {
            value: num(v)?,
            mask: num(m)?,
        },
        None => MarkValue {
            value: num(s)?,
            mask: u32::MAX,
        },
    })
}

/// Opaque matches [`typed_match`] reads into a typed match (the support table lists them as
/// enforced).
pub(crate) const TYPED_MATCHES: &[&str] = &["connmark"];

/// Opaque targets [`typed_target`] reads into a typed target.
pub(crate) const TYPED_TARGETS: &[&str] = &["MARK", "CONNMARK"];

/// The typed form of a canonical `-m connmark` ([`canonical_match`] ran): `None` when its
/// options are not exactly one `--mark` (the match then stays opaque and validation refuses
/// it where it would be enforced).
pub(crate) fn typed_match(name: &str, options: &[OpaqueOption]) -> Option<Match> {
    match (name, options) {
        ("connmark", [o]) if o.name == "--mark" => {
            let [a] = o.args.as_slice() else { return None };
            Some(Match::Connmark(Neg {
                negated: o.negated,
                value: read_mark(a)?,
            }))
        }
        _ => None,
    }
}

/// The typed form of a canonical `-j MARK` or `-j CONNMARK` ([`canonical_target`] ran):
/// `None` for any other option list (shifts of CONNMARK revision 2, options it does not
/// know), which stays opaque.
pub(crate) fn typed_target(name: &str, options: &[OpaqueOption]) -> Option<Target> {
    if options.iter().any(|o| o.negated) {
        return None;
    }
    let arg = |o: &OpaqueOption| match o.args.as_slice() {
        [a] => read_mark(a),
        _ => None,
    };
    match (name, options) {
        ("MARK", [o]) if o.name == "--set-xmark" => Some(Target::Mark(arg(o)?)),
        ("CONNMARK", [o]) if o.name == "--set-xmark" => {
            Some(Target::Connmark(ConnmarkTarget::Set(arg(o)?)))
        }
        ("CONNMARK", [mode, nf, ct]) if nf.name == "--nfmask" && ct.name == "--ctmask" => {
            let (nfmask, ctmask) = (arg(nf)?.value, arg(ct)?.value);
            match mode.name.as_str() {
                "--save-mark" => Some(Target::Connmark(ConnmarkTarget::Save { nfmask, ctmask })),
                "--restore-mark" => {
                    Some(Target::Connmark(ConnmarkTarget::Restore { nfmask, ctmask }))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// `-m statistic`.
fn statistic(
    options: &mut Vec<OpaqueOption>,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    let find = |n: &str| options.iter().find(|o| o.name == n);
    let known = ["--mode", "--probability", "--every", "--packet"];
    if options.iter().any(|o| !known.contains(&o.name.as_str())) {
        return Ok(());
    }
    let Some(mode) = find("--mode") else {
        return Err(bad("option \"--mode\" must be specified".into()));
    };
    let mode = one_arg(mode, bad)?.to_string();
    let out = match mode.as_str() {
        "random" => {
            if find("--every").is_some() || find("--packet").is_some() {
                return Err(bad("--every and --packet need --mode nth".into()));
            }
            let Some(p) = find("--probability") else {
                return Err(bad("--mode random needs --probability".into()));
            };
            let v: f64 = one_arg(p, bad)?
                .parse()
                .ok()
                .filter(|v: &f64| (0.0..=1.0).contains(v))
                .ok_or_else(|| {
                    bad("bad value for option \"--probability\", or out of range (0-1)".into())
                })?;
            // As libxt_statistic: the kernel keeps lround(P * 2^31), printed with %.11f.
            let kept = (v * 2_147_483_648.0).round() / 2_147_483_648.0;
            vec![
                opt("--mode", false, vec![mode.clone()]),
                opt("--probability", p.negated, vec![format!("{kept:.11}")]),
            ]
        }
        "nth" => {
            if find("--probability").is_some() {
                return Err(bad("--probability needs --mode random".into()));
            }
            let (Some(every), Some(packet)) = (find("--every"), find("--packet")) else {
                return Err(bad("option \"--every\" also requires \"--packet\"".into()));
            };
            let n = |o: &OpaqueOption| {
                let a = one_arg(o, bad)?;
                u32_value(a, &o.name, bad)
            };
            let (e, p) = (n(every)?, n(packet)?);
            if e == 0 || p >= e {
                return Err(bad(
                    "--every must be at least 1 and --packet below it".into()
                ));
            }
            vec![
                opt("--mode", false, vec![mode.clone()]),
                opt("--every", every.negated, vec![e.to_string()]),
                opt("--packet", false, vec![p.to_string()]),
            ]
        }
        m => return Err(bad(format!("bad mode '{m}' (random or nth)"))),
    };
    *options = out;
    Ok(())
}

/// `-j MARK` (revision 2): every form as `--set-xmark V/M`.
fn mark(
    options: &mut [OpaqueOption],
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    exactly_one(
        options,
        &[
            "--set-xmark",
            "--set-mark",
            "--and-mark",
            "--or-mark",
            "--xor-mark",
        ],
        bad,
    )?;
    for o in options.iter_mut() {
        let (v, m) = match o.name.as_str() {
            "--set-xmark" => {
                let (v, m) = value_mask(one_arg(o, bad)?, bad)?;
                (v, m.unwrap_or(u32::MAX))
            }
            "--set-mark" => {
                let (v, m) = value_mask(one_arg(o, bad)?, bad)?;
                (v, v | m.unwrap_or(u32::MAX))
            }
            "--and-mark" => (0, !u32_value(one_arg(o, bad)?, "value", bad)?),
            "--or-mark" => {
                let v = u32_value(one_arg(o, bad)?, "value", bad)?;
                (v, v)
            }
            "--xor-mark" => (u32_value(one_arg(o, bad)?, "value", bad)?, 0),
            _ => continue,
        };
        *o = opt("--set-xmark", o.negated, vec![hex_pair(v, m)]);
    }
    Ok(())
}

/// `-j CONNMARK` (revision 1): set forms as `--set-xmark V/M`; save and restore with both
/// masks.
fn connmark(
    options: &mut Vec<OpaqueOption>,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    let known = [
        "--set-xmark",
        "--set-mark",
        "--and-mark",
        "--or-mark",
        "--xor-mark",
        "--save-mark",
        "--restore-mark",
        "--mask",
        "--nfmask",
        "--ctmask",
    ];
    if options.iter().any(|o| !known.contains(&o.name.as_str())) {
        return Ok(());
    }
    let mut mode: Option<(&str, u32, u32)> = None;
    let (mut nfmask, mut ctmask) = (u32::MAX, u32::MAX);
    for o in options.iter() {
        let m = match o.name.as_str() {
            "--set-xmark" => {
                let (v, m) = value_mask(one_arg(o, bad)?, bad)?;
                Some(("set", v, m.unwrap_or(u32::MAX)))
            }
            "--set-mark" => {
                let (v, m) = value_mask(one_arg(o, bad)?, bad)?;
                Some(("set", v, v | m.unwrap_or(u32::MAX)))
            }
            "--and-mark" => Some(("set", 0, !u32_value(one_arg(o, bad)?, "value", bad)?)),
            "--or-mark" => {
                let v = u32_value(one_arg(o, bad)?, "value", bad)?;
                Some(("set", v, v))
            }
            "--xor-mark" => Some(("set", u32_value(one_arg(o, bad)?, "value", bad)?, 0)),
            "--save-mark" | "--restore-mark" => {
                if !o.args.is_empty() {
                    return Err(bad(format!("option '{}' takes no argument", o.name)));
                }
                Some((
                    if o.name == "--save-mark" {
                        "save"
                    } else {
                        "restore"
                    },
                    0,
                    0,
                ))
            }
            "--mask" => {
                let v = u32_value(one_arg(o, bad)?, "mask", bad)?;
                (nfmask, ctmask) = (v, v);
                None
            }
            "--nfmask" => {
                nfmask = u32_value(one_arg(o, bad)?, "mask", bad)?;
                None
            }
            _ => {
                ctmask = u32_value(one_arg(o, bad)?, "mask", bad)?;
                None
            }
        };
        if let Some(m) = m {
            if mode.is_some() {
                return Err(bad("only one of the --set/--save/--restore options".into()));
            }
            mode = Some(m);
        }
    }
    let Some((mode, v, m)) = mode else {
        return Err(bad(
            "one of --set-xmark, --save-mark or --restore-mark is needed".into(),
        ));
    };
    *options = match mode {
        // A later `--mask` replaces the set mask, as libxt_CONNMARK.
        "set" => {
            let m = if options
                .iter()
                .any(|o| o.name == "--mask" || o.name == "--ctmask")
            {
                ctmask
            } else {
                m
            };
            vec![opt("--set-xmark", false, vec![hex_pair(v, m)])]
        }
        _ => vec![
            opt(&format!("--{mode}-mark"), false, Vec::new()),
            opt("--nfmask", false, vec![format!("{nfmask:#x}")]),
            opt("--ctmask", false, vec![format!("{ctmask:#x}")]),
        ],
    };
    Ok(())
}

/// TOS names (libxt_tos_helper.h), matched ignoring ASCII case.
const TOS_NAMES: [(&str, u8); 5] = [
    ("Minimize-Delay", 0x10),
    ("Maximize-Throughput", 0x08),
    ("Maximize-Reliability", 0x04),
    ("Minimize-Cost", 0x02),
    ("Normal-Service", 0x00),
];

fn tos_byte(s: &str, bad: &dyn Fn(String) -> ParseError) -> Result<u8, ParseError> {
    parse_uint(s, 0xff)
        .map(|v| v as u8)
        .ok_or_else(|| bad(format!("'{s}' is not a number 0-255")))
}

/// `NAME` (mask 0x3f), `V` (mask 0xff) or `V/M`, as libxt_tos_helper's `tos_parse_*`.
pub(crate) fn tos_value(
    s: &str,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(u8, u8), ParseError> {
    if let Some((_, v)) = TOS_NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
        return Ok((*v, 0x3f));
    }
    let unknown = || bad(format!("Symbolic name \"{s}\" is unknown"));
    let num = |x: &str| parse_uint(x, 0xff).map(|v| v as u8);
    match s.split_once('/') {
        Some((v, m)) => Ok((num(v).ok_or_else(unknown)?, num(m).ok_or_else(unknown)?)),
        None => Ok((num(s).ok_or_else(unknown)?, 0xff)),
    }
}

pub(crate) fn dscp_number(s: &str, bad: &dyn Fn(String) -> ParseError) -> Result<u8, ParseError> {
    parse_uint(s, 63)
        .map(|v| v as u8)
        .ok_or_else(|| bad(format!("bad DSCP value '{s}', or out of range (0-63)")))
}

/// DiffServ class names (libxt_dscp_helper.c), matched ignoring ASCII case.
const DSCP_CLASSES: [(&str, u8); 22] = [
    ("CS0", 0x00),
    ("CS1", 0x08),
    ("CS2", 0x10),
    ("CS3", 0x18),
    ("CS4", 0x20),
    ("CS5", 0x28),
    ("CS6", 0x30),
    ("CS7", 0x38),
    ("BE", 0x00),
    ("AF11", 0x0a),
    ("AF12", 0x0c),
    ("AF13", 0x0e),
    ("AF21", 0x12),
    ("AF22", 0x14),
    ("AF23", 0x16),
    ("AF31", 0x1a),
    ("AF32", 0x1c),
    ("AF33", 0x1e),
    ("AF41", 0x22),
    ("AF42", 0x24),
    ("AF43", 0x26),
    ("EF", 0x2e),
];

pub(crate) fn dscp_class(s: &str, bad: &dyn Fn(String) -> ParseError) -> Result<u8, ParseError> {
    DSCP_CLASSES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s))
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            bad(format!(
                "Use a DSCP class name (CS0-CS7, BE, AF11-AF43, EF), not '{s}'"
            ))
        })
}
