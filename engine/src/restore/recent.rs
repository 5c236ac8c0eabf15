//! `-m recent`: the line parser collects its options as for an opaque extension; [`typed`]
//! reads them with libxt_recent's revision-1 grammar (iptables 1.8.9) and the checks of the
//! kernel's `recent_mt_check` into [`Match::Recent`]. An error is located at the extension's
//! name.
//!
//! Grammar: exactly one of `[!] --set`, `[!] --rcheck`, `[!] --update`, `[!] --remove`;
//! `--seconds N` (N >= 1), `--reap` (needs `--seconds`), `--hitcount N`, `--rttl` (not with
//! `--set` / `--remove`), `--name NAME`, `--rsource` / `--rdest`, `--mask ADDR`; each at most
//! once. The kernel also refuses `--seconds`/`--hitcount` with `--set`/`--remove`, a
//! `--hitcount` of 256 or more, and names that are not a /proc file name
//! ([`RecentMatch::kernel_refusal`]).
//!
//! Printed as `recent_save`: `[!] --OP [--seconds N] [--reap] [--hitcount N] [--rttl]
//! --name NAME --mask ADDR --rsource|--rdest`.

use crate::model::{Family, Match, OpaqueOption, RecentMatch, RecentOp};

use super::ParseError;
use super::ext_options::{ExtOptions, Opt};
use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;

/// recent's options.
const GRAMMAR: &[Opt] = &[
    Opt::flag("--set").negatable(),
    Opt::flag("--rcheck").negatable(),
    Opt::flag("--update").negatable(),
    Opt::flag("--remove").negatable(),
    Opt::flag("--reap"),
    Opt::flag("--rttl"),
    Opt::flag("--rsource"),
    Opt::flag("--rdest"),
    Opt::value("--seconds"),
    Opt::value("--hitcount"),
    Opt::value("--name"),
    Opt::value("--mask"),
];

/// Reads `-m recent`'s options (collected opaque) into [`Match::Recent`].
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let r = ExtOptions::check("recent", GRAMMAR, options, token, ctx)?;
    let bad = |reason: String| r.bad(reason);
    let mut m = RecentMatch::new(RecentOp::Set, ctx.family);
    let mut op: Option<RecentOp> = None;
    for o in options {
        let (name, arg) = (o.name.as_str(), ExtOptions::arg(o));
        let number = |min: u64| {
            parse_uint(arg, u64::from(u32::MAX))
                .filter(|&v| v >= min)
                .map(|v| v as u32)
                .ok_or_else(|| bad(format!("bad value \"{arg}\" for \"{name}\"")))
        };
        match name {
            "--set" | "--rcheck" | "--update" | "--remove" => {
                if let Some(prev) = op {
                    return Err(bad(format!(
                        "only one of --set, --rcheck, --update or --remove may be given ({} and {name})",
                        prev.option()
                    )));
                }
                op = Some(match name {
                    "--set" => RecentOp::Set,
                    "--rcheck" => RecentOp::Rcheck,
                    "--update" => RecentOp::Update,
                    _ => RecentOp::Remove,
                });
                m.negated = o.negated;
            }
            "--seconds" => m.seconds = number(1)?,
            "--hitcount" => m.hitcount = number(0)?,
            "--reap" => m.reap = true,
            "--rttl" => m.rttl = true,
            "--rsource" => m.dest = false,
            "--rdest" => m.dest = true,
            "--name" => m.name = arg.to_string(),
            _ => {
                let t = Tok {
                    text: arg,
                    column: token.column,
                };
                m.mask = super::extensions::parse_addr(&t, arg, ctx.family, ctx)?;
            }
        }
    }
    let Some(op) = op else {
        return Err(r.missing("one of --set, --rcheck, --update or --remove"));
    };
    m.op = op;
    if m.rttl && matches!(op, RecentOp::Set | RecentOp::Remove) {
        return Err(bad(format!(
            "option \"--rttl\" cannot be used together with \"{}\"",
            op.option()
        )));
    }
    if let Some(why) = m.kernel_refusal() {
        return Err(bad(why.into()));
    }
    if m.mask.is_ipv4() != (ctx.family == Family::Ipv4) {
        return Err(bad("--mask is not of the table's family".into()));
    }
    Ok(Match::Recent(m))
}
