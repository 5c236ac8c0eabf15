//! `-m connlimit`, stored only (the engine does not enforce it: `support::why_not_enforced`):
//! [`canonical`] checks the options with libxt_connlimit's grammar (iptables 1.8.9,
//! revision 1) and rewrites them into `connlimit_save`'s form, so that nat and mangle tables round-trip
//! as iptables-save prints them and what iptables refuses is refused here too.
//!
//! Grammar: `[!] --connlimit-upto N` or `[!] --connlimit-above N` (one of them; `!` swaps
//! them), `--connlimit-mask LEN`, `--connlimit-saddr` or `--connlimit-daddr`. Printed as
//! `--connlimit-upto|-above N --connlimit-mask LEN --connlimit-saddr|-daddr`.

use crate::model::{Family, OpaqueOption};

use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// Checks `-m connlimit`'s options and puts them in iptables-save's form.
pub(crate) fn canonical(
    options: &mut Vec<OpaqueOption>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<(), ParseError> {
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
    let opt = |name: &str, args: Vec<String>| OpaqueOption {
        negated: false,
        name: name.into(),
        args,
    };
    *options = vec![
        opt(
            if upto {
                "--connlimit-upto"
            } else {
                "--connlimit-above"
            },
            vec![limit.to_string()],
        ),
        opt("--connlimit-mask", vec![mask.to_string()]),
        opt(
            if daddr == Some(true) {
                "--connlimit-daddr"
            } else {
                "--connlimit-saddr"
            },
            Vec::new(),
        ),
    ];
    Ok(())
}
