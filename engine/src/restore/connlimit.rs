//! `-m connlimit`: the line parser collects its options as for an opaque extension;
//! [`typed`] reads them with libxt_connlimit's grammar (iptables 1.8.9, revision 1) into
//! [`Match::Connlimit`], refusing what iptables refuses. An error is located at the
//! extension's name.
//!
//! Grammar: `[!] --connlimit-upto N` or `[!] --connlimit-above N` (one of them; `!` swaps
//! them), `--connlimit-mask LEN`, `--connlimit-saddr` or `--connlimit-daddr`. Printed as
//! `connlimit_save` does: `--connlimit-upto|-above N --connlimit-mask LEN
//! --connlimit-saddr|-daddr`.

use crate::model::{ConnlimitMatch, Family, Match, OpaqueOption};

use super::ParseError;
use super::ext_options::{ExtOptions, Opt};
use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;

/// connlimit's options.
const GRAMMAR: &[Opt] = &[
    Opt::value("--connlimit-upto").negatable(),
    Opt::value("--connlimit-above").negatable(),
    Opt::value("--connlimit-mask"),
    Opt::flag("--connlimit-saddr"),
    Opt::flag("--connlimit-daddr"),
];

/// Reads `-m connlimit`'s options (collected opaque) into [`Match::Connlimit`].
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let r = ExtOptions::check("connlimit", GRAMMAR, options, token, ctx)?;
    let bad = |reason: String| r.bad(reason);
    let width: u64 = if ctx.family == Family::Ipv4 { 32 } else { 128 };
    let (mut limit, mut upto, mut mask, mut daddr) = (None, false, width, None);
    for o in options {
        let (opt, arg) = (o.name.as_str(), ExtOptions::arg(o));
        let value = |max: u64| {
            parse_uint(arg, max).ok_or_else(|| bad(format!("bad value \"{arg}\" for \"{opt}\"")))
        };
        match opt {
            "--connlimit-upto" | "--connlimit-above" => {
                if limit.is_some() {
                    return Err(bad(
                        "--connlimit-upto and --connlimit-above exclude each other".into(),
                    ));
                }
                limit = Some(value(u64::from(u32::MAX))?);
                upto = (opt == "--connlimit-upto") != o.negated;
            }
            "--connlimit-mask" => mask = value(width)?,
            _ => {
                let d = opt == "--connlimit-daddr";
                if daddr.is_some_and(|x| x != d) {
                    return Err(bad(
                        "option \"--connlimit-daddr\" cannot be used together with \"--connlimit-saddr\""
                            .into(),
                    ));
                }
                daddr = Some(d);
            }
        }
    }
    let Some(limit) = limit else {
        return Err(r.missing("--connlimit-above or --connlimit-upto"));
    };
    Ok(Match::Connlimit(ConnlimitMatch {
        limit: limit as u32,
        upto,
        prefix: mask as u8,
        daddr: daddr == Some(true),
    }))
}
