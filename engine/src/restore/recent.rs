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

use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// Reads `-m recent`'s options (collected opaque) into [`Match::Recent`].
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let bad = |reason: String| {
        ctx.err(
            token,
            K::InvalidValue {
                what: "extension option",
                reason: format!("recent: {reason}"),
            },
        )
    };
    let mut m = RecentMatch::new(RecentOp::Set, ctx.family);
    let mut op: Option<RecentOp> = None;
    for (i, o) in options.iter().enumerate() {
        let name = o.name.as_str();
        let (takes_arg, negatable) = match name {
            "--set" | "--rcheck" | "--update" | "--remove" => (false, true),
            "--reap" | "--rttl" | "--rsource" | "--rdest" => (false, false),
            "--seconds" | "--hitcount" | "--name" | "--mask" => (true, false),
            _ => {
                return Err(ctx.err(
                    token,
                    K::UnknownExtensionOption {
                        extension: "recent".into(),
                        option: o.name.clone(),
                    },
                ));
            }
        };
        if options[..i].iter().any(|p| p.name == o.name) {
            return Err(ctx.err(token, K::DuplicateOption(o.name.clone())));
        }
        if o.negated && !negatable {
            return Err(bad(format!("option \"{name}\" cannot be inverted")));
        }
        let arg = match (takes_arg, o.args.as_slice()) {
            (true, [a]) => a.as_str(),
            (false, []) => "",
            (true, _) => return Err(bad(format!("option \"{name}\" takes one argument"))),
            (false, _) => return Err(bad(format!("option \"{name}\" takes no argument"))),
        };
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
        return Err(ctx.err(
            token,
            K::MissingOption {
                extension: "recent".into(),
                needs: "one of --set, --rcheck, --update or --remove",
            },
        ));
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
