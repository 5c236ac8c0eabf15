//! `-m owner` (xt_owner revision 1): `[!] --socket-exists`, `[!] --uid-owner ID[-ID]`,
//! `[!] --gid-owner ID[-ID]`, `--suppl-groups`, read from the options the line parser
//! collected (as for an opaque extension) into [`Match::Owner`]. iptables resolves user and
//! group names with the host's passwd/group databases when it loads the rule; the engine
//! reads no host file, so a name is refused with an error saying to write the number (the
//! canonical form iptables-save prints is the number anyway). An error is located at the
//! extension's name.

use crate::model::{IdRange, Match, Neg, OpaqueOption, OwnerMatch};

use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// Reads `-m owner`'s options.
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
                reason: format!("owner: {reason}"),
            },
        )
    };
    let mut m = OwnerMatch::default();
    for o in options {
        let twice = || bad(format!("option '{}' given twice", o.name));
        match o.name.as_str() {
            "--socket-exists" => {
                if !o.args.is_empty() {
                    return Err(bad("--socket-exists takes no argument".into()));
                }
                if m.socket.replace(o.negated).is_some() {
                    return Err(twice());
                }
            }
            "--suppl-groups" => {
                if !o.args.is_empty() || o.negated {
                    return Err(bad("--suppl-groups takes no argument and no !".into()));
                }
                m.suppl_groups = true;
            }
            "--uid-owner" | "--gid-owner" => {
                let [a] = o.args.as_slice() else {
                    return Err(bad(format!("option '{}' takes one argument", o.name)));
                };
                let what = if o.name == "--uid-owner" {
                    "user"
                } else {
                    "group"
                };
                // As libxt_owner: ID or ID-ID, each below 2^32 - 1 ((uid_t)-1 is invalid).
                let id = |s: &str| {
                    parse_uint(s, u64::from(u32::MAX) - 1).map(|v| v as u32).ok_or_else(|| {
                        if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
                            bad(format!("{what} id '{s}' is out of range (0-4294967294)"))
                        } else {
                            bad(format!(
                                "{what} '{s}': give the numeric id (iptables resolves names on the \
                                 host at load time; the engine does not read the host's databases)"
                            ))
                        }
                    })
                };
                let (lo, hi) = match a.split_once('-') {
                    Some((l, h)) => (id(l)?, id(h)?),
                    None => {
                        let v = id(a)?;
                        (v, v)
                    }
                };
                if lo > hi {
                    return Err(bad(format!("empty range '{a}'")));
                }
                let v = Neg {
                    negated: o.negated,
                    value: IdRange { lo, hi },
                };
                let slot = if o.name == "--uid-owner" {
                    &mut m.uid
                } else {
                    &mut m.gid
                };
                if slot.replace(v).is_some() {
                    return Err(twice());
                }
            }
            other => return Err(bad(format!("unknown option '{other}'"))),
        }
    }
    if m.socket.is_none() && m.uid.is_none() && m.gid.is_none() {
        return Err(ctx.err(
            token,
            K::MissingOption {
                extension: "owner".into(),
                needs: "--socket-exists, --uid-owner or --gid-owner",
            },
        ));
    }
    if m.suppl_groups && m.gid.is_none() {
        return Err(bad("--suppl-groups needs --gid-owner".into()));
    }
    Ok(Match::Owner(m))
}
