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

use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// Reads `-m connlimit`'s options (collected opaque) into [`Match::Connlimit`].
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
                reason: format!("connlimit: {reason}"),
            },
        )
    };
    let width: u64 = if ctx.family == Family::Ipv4 { 32 } else { 128 };
    let (mut limit, mut upto, mut mask, mut daddr) = (None, false, width, None);
    for (i, o) in options.iter().enumerate() {
        let opt = o.name.as_str();
        if !matches!(
            opt,
            "--connlimit-upto"
                | "--connlimit-above"
                | "--connlimit-mask"
                | "--connlimit-saddr"
                | "--connlimit-daddr"
        ) {
            return Err(ctx.err(
                token,
                K::UnknownExtensionOption {
                    extension: "connlimit".into(),
                    option: o.name.clone(),
                },
            ));
        }
        if options[..i].iter().any(|p| p.name == o.name) {
            return Err(ctx.err(token, K::DuplicateOption(o.name.clone())));
        }
        let counts = matches!(opt, "--connlimit-upto" | "--connlimit-above");
        if o.negated && !counts {
            return Err(bad(format!("option \"{opt}\" cannot be inverted")));
        }
        let takes = counts || opt == "--connlimit-mask";
        let arg = match (takes, o.args.as_slice()) {
            (true, [a]) => a.as_str(),
            (false, []) => "",
            (true, _) => return Err(bad(format!("option \"{opt}\" takes one argument"))),
            (false, _) => return Err(bad(format!("option \"{opt}\" takes no argument"))),
        };
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
        return Err(ctx.err(
            token,
            K::MissingOption {
                extension: "connlimit".into(),
                needs: "--connlimit-above or --connlimit-upto",
            },
        ));
    };
    Ok(Match::Connlimit(ConnlimitMatch {
        limit: limit as u32,
        upto,
        prefix: mask as u8,
        daddr: daddr == Some(true),
    }))
}
