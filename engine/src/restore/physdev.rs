//! `-m physdev` (libxt_physdev): `[!] --physdev-in NAME`, `[!] --physdev-out NAME`,
//! `[!] --physdev-is-in`, `[!] --physdev-is-out`, `[!] --physdev-is-bridged`, read from the
//! options the line parser collected (as for an opaque extension) into [`Match::Physdev`].
//! As libxt_physdev: each option at most once ("can only be used once"), at least one
//! ("no physdev option specified"), names checked as `-i` names (at most 15 bytes, a trailing
//! `+` for a prefix). An error is located at the extension's name.

use crate::model::{Match, Neg, OpaqueOption, PhysdevMatch};

use super::lexer::Tok;
use super::rule::{Ctx, parse_iface};
use super::{ParseError, ParseErrorKind as K};

/// Reads `-m physdev`'s options.
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
                reason: format!("physdev: {reason}"),
            },
        )
    };
    let mut m = PhysdevMatch::default();
    for o in options {
        let twice = || bad(format!("option '{}' can only be used once", o.name));
        match o.name.as_str() {
            "--physdev-in" | "--physdev-out" => {
                let [a] = o.args.as_slice() else {
                    return Err(bad(format!("option '{}' takes one argument", o.name)));
                };
                let tok = Tok {
                    text: a,
                    column: token.column,
                };
                let value = parse_iface(&tok, ctx)?;
                let slot = if o.name == "--physdev-in" {
                    &mut m.physdev_in
                } else {
                    &mut m.physdev_out
                };
                if slot
                    .replace(Neg {
                        negated: o.negated,
                        value,
                    })
                    .is_some()
                {
                    return Err(twice());
                }
            }
            "--physdev-is-in" | "--physdev-is-out" | "--physdev-is-bridged" => {
                if !o.args.is_empty() {
                    return Err(bad(format!("option '{}' takes no argument", o.name)));
                }
                let slot = match o.name.as_str() {
                    "--physdev-is-in" => &mut m.is_in,
                    "--physdev-is-out" => &mut m.is_out,
                    _ => &mut m.is_bridged,
                };
                if slot.replace(o.negated).is_some() {
                    return Err(twice());
                }
            }
            other => return Err(bad(format!("unknown option '{other}'"))),
        }
    }
    if m == PhysdevMatch::default() {
        return Err(ctx.err(
            token,
            K::MissingOption {
                extension: "physdev".into(),
                needs: "--physdev-in, --physdev-out, --physdev-is-in, --physdev-is-out or --physdev-is-bridged",
            },
        ));
    }
    Ok(Match::Physdev(m))
}
