//! Canonical forms of more stored-only extensions, as iptables-save 1.8.9 prints them (each
//! checked by iptables' own `.t` vectors, `tests/it/conformance.rs`), with the refusals of their
//! libxt parsers and the kernel's checks:
//!
//! - `-m quota [!] --quota N`: N below 2^64;
//! - `-m tcpmss [!] --mss LO[:HI]` (`-p tcp`): `LO` when LO = HI, 16-bit;
//! - `-m esp [!] --espspi LO[:HI]`: `LO` when LO = HI, left out for the whole 32-bit range
//!   unless negated;
//! - `-m connbytes [!] --connbytes FROM[:TO] --connbytes-mode packets|bytes|avgpkt
//!   --connbytes-dir original|reply|both`, all three needed: `FROM` when TO is 2^64 - 1
//!   (`FROM:` and `:`);
//! - `-m cgroup [!] --cgroup ID` or `[!] --path PATH` (one of them): the path is printed in
//!   double quotes ([`QUOTED`]);
//! - `-m ipvs`: `--vproto` as a number, `--vport` as a number;
//! - `-j NFQUEUE`: `--queue-num N` (default 0) or `--queue-balance LO:HI` (LO < HI, a
//!   missing HI is 65535 as in iptables 1.8.9; the kernel refuses 65536 queues), then
//!   `--queue-bypass`, `--queue-cpu-fanout` (which needs `--queue-balance`).
//!
//! An error is located at the extension's name.

use crate::model::OpaqueOption;

use super::super::ParseError;
use super::super::extensions::{parse_port, parse_protocol, parse_range, parse_uint};
use super::super::lexer::Tok;
use super::super::rule::Ctx;
use super::{one_arg, opt};

/// Options that iptables-save prints in double quotes whatever they hold.
pub(crate) const QUOTED: &[(&str, &str)] = &[("cgroup", "--path")];

/// The extensions this file canonicalises (matches).
pub(super) const MATCHES: &[&str] = &["quota", "tcpmss", "esp", "connbytes", "cgroup", "ipvs"];

/// `LO` or `LO:HI` of a range.
fn range_text(lo: u64, hi: u64) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}:{hi}")
    }
}

fn only(
    options: &[OpaqueOption],
    names: &[&str],
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    match options.iter().find(|o| !names.contains(&o.name.as_str())) {
        Some(o) => Err(bad(format!("unknown option \"{}\"", o.name))),
        None => Ok(()),
    }
}

/// Rewrites the options of match `name` (one of [`MATCHES`]).
pub(super) fn canonical_match(
    name: &str,
    options: &mut Vec<OpaqueOption>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    let range = |o: &OpaqueOption, max: u64| -> Result<(u64, u64), ParseError> {
        let a = one_arg(o, bad)?;
        if a.starts_with('-') {
            return Err(bad(format!("bad value \"{a}\" for \"{}\"", o.name)));
        }
        let t = Tok {
            text: a,
            column: token.column,
        };
        parse_range(&t, ctx, "value", max)
    };
    match name {
        "quota" => {
            only(options, &["--quota"], bad)?;
            super::exactly_one(options, &["--quota"], bad)?;
            for o in options.iter_mut() {
                let a = one_arg(o, bad)?;
                let v = parse_uint(a, u64::MAX)
                    .ok_or_else(|| bad(format!("bad value \"{a}\" for \"--quota\"")))?;
                o.args = vec![v.to_string()];
            }
        }
        "tcpmss" => {
            only(options, &["--mss"], bad)?;
            super::exactly_one(options, &["--mss"], bad)?;
            for o in options.iter_mut() {
                let (lo, hi) = range(o, u64::from(u16::MAX))?;
                o.args = vec![range_text(lo, hi)];
            }
        }
        "esp" => {
            only(options, &["--espspi"], bad)?;
            if options.len() > 1 {
                return Err(bad("option \"--espspi\" given twice".into()));
            }
            let mut keep = true;
            for o in options.iter_mut() {
                let (lo, hi) = range(o, u64::from(u32::MAX))?;
                keep = o.negated || (lo, hi) != (0, u64::from(u32::MAX));
                o.args = vec![range_text(lo, hi)];
            }
            if !keep {
                options.clear();
            }
        }
        "connbytes" => {
            only(
                options,
                &["--connbytes", "--connbytes-mode", "--connbytes-dir"],
                bad,
            )?;
            for n in ["--connbytes", "--connbytes-mode", "--connbytes-dir"] {
                super::exactly_one(options, &[n], bad)?;
            }
            for o in options.iter_mut() {
                match o.name.as_str() {
                    "--connbytes" => {
                        // A single number is FROM with no upper end.
                        let (lo, hi) = range(o, u64::MAX)?;
                        let hi = if o.args[0].contains(':') {
                            hi
                        } else {
                            u64::MAX
                        };
                        o.args = vec![if hi == u64::MAX {
                            lo.to_string()
                        } else {
                            format!("{lo}:{hi}")
                        }];
                    }
                    "--connbytes-mode" => {
                        let a = one_arg(o, bad)?;
                        if !matches!(a, "packets" | "bytes" | "avgpkt") || o.negated {
                            return Err(bad(format!("bad --connbytes-mode \"{a}\"")));
                        }
                    }
                    _ => {
                        let a = one_arg(o, bad)?;
                        if !matches!(a, "original" | "reply" | "both") || o.negated {
                            return Err(bad(format!("bad --connbytes-dir \"{a}\"")));
                        }
                    }
                }
            }
            let order = |o: &OpaqueOption| match o.name.as_str() {
                "--connbytes" => 0,
                "--connbytes-mode" => 1,
                _ => 2,
            };
            options.sort_by_key(order);
        }
        "cgroup" => {
            only(options, &["--cgroup", "--path"], bad)?;
            super::exactly_one(options, &["--cgroup", "--path"], bad)?;
            for o in options.iter_mut() {
                let a = one_arg(o, bad)?;
                if o.name == "--cgroup" {
                    let v = parse_uint(a, u64::from(u32::MAX))
                        .ok_or_else(|| bad(format!("bad value \"{a}\" for \"--cgroup\"")))?;
                    o.args = vec![v.to_string()];
                }
            }
        }
        "ipvs" => {
            for o in options.iter_mut() {
                match o.name.as_str() {
                    "--vproto" => {
                        let a = one_arg(o, bad)?;
                        let t = Tok {
                            text: a,
                            column: token.column,
                        };
                        *o = opt(
                            "--vproto",
                            o.negated,
                            vec![parse_protocol(&t, ctx)?.to_string()],
                        );
                    }
                    "--vport" | "--vportctl" => {
                        let a = one_arg(o, bad)?;
                        let t = Tok {
                            text: a,
                            column: token.column,
                        };
                        o.args = vec![parse_port(&t, a, ctx)?.to_string()];
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// `-j SET --add-set/--del-set/--map-set NAME FLAGS`: as `-m set`, the set must exist when
/// the caller says which do ([`ParseOptions::set_exists`](super::super::ParseOptions)).
pub(super) fn set_target(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<(), ParseError> {
    let Some(exists) = ctx.set_exists else {
        return Ok(());
    };
    for o in options {
        if matches!(o.name.as_str(), "--add-set" | "--del-set" | "--map-set") {
            if let Some(name) = o.args.first() {
                if !exists(name) {
                    return Err(
                        ctx.err(token, super::super::ParseErrorKind::NoSuchSet(name.clone()))
                    );
                }
            }
        }
    }
    Ok(())
}

/// Rewrites `-j NFQUEUE`'s options (libxt_NFQUEUE revision 3).
pub(super) fn nfqueue(
    options: &mut Vec<OpaqueOption>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
    bad: &dyn Fn(String) -> ParseError,
) -> Result<(), ParseError> {
    only(
        options,
        &[
            "--queue-num",
            "--queue-balance",
            "--queue-bypass",
            "--queue-cpu-fanout",
        ],
        bad,
    )?;
    let (mut num, mut balance, mut bypass, mut fanout) = (None, None, false, false);
    for o in options.iter() {
        if o.negated {
            return Err(bad(format!("option \"{}\" cannot be inverted", o.name)));
        }
        match o.name.as_str() {
            "--queue-num" | "--queue-balance" if num.is_some() || balance.is_some() => {
                return Err(bad(
                    "only one of --queue-num or --queue-balance may be given".into(),
                ));
            }
            "--queue-num" => {
                let a = one_arg(o, bad)?;
                num = Some(
                    parse_uint(a, u64::from(u16::MAX))
                        .ok_or_else(|| bad(format!("bad value \"{a}\" for \"--queue-num\"")))?,
                );
            }
            "--queue-balance" => {
                let a = one_arg(o, bad)?;
                if !a.contains(':') || a.starts_with('-') {
                    return Err(bad(format!("bad range \"{a}\" for \"--queue-balance\"")));
                }
                let t = Tok {
                    text: a,
                    column: token.column,
                };
                let (lo, hi) = parse_range(&t, ctx, "queue", u64::from(u16::MAX))?;
                if lo >= hi {
                    return Err(bad(format!("{lo} should be less than {hi}")));
                }
                // The kernel keeps the count in 16 bits: 65536 queues are 0, refused.
                if hi - lo + 1 > u64::from(u16::MAX) {
                    return Err(bad(format!(
                        "--queue-balance {lo}:{hi} is 65536 queues; the kernel takes at most 65535"
                    )));
                }
                balance = Some((lo, hi));
            }
            "--queue-bypass" => bypass = true,
            _ => fanout = true,
        }
        if matches!(o.name.as_str(), "--queue-bypass" | "--queue-cpu-fanout") && !o.args.is_empty()
        {
            return Err(bad(format!("option \"{}\" takes no argument", o.name)));
        }
    }
    if fanout && balance.is_none() {
        return Err(bad(
            "option \"--queue-cpu-fanout\" also requires \"--queue-balance\"".into(),
        ));
    }
    let mut out = vec![match balance {
        Some((lo, hi)) => opt("--queue-balance", false, vec![format!("{lo}:{hi}")]),
        None => opt("--queue-num", false, vec![num.unwrap_or(0).to_string()]),
    }];
    if bypass {
        out.push(opt("--queue-bypass", false, Vec::new()));
    }
    if fanout {
        out.push(opt("--queue-cpu-fanout", false, Vec::new()));
    }
    *options = out;
    Ok(())
}
