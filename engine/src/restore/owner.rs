//! `-m owner` (xt_owner revision 1): `[!] --socket-exists`, `[!] --uid-owner ID[-ID]`,
//! `[!] --gid-owner ID[-ID]`, `--suppl-groups`, read from the options the line parser
//! collected (as for an opaque extension) into [`Match::Owner`]. As libxt_owner, a word is
//! first looked up as a user (group) name in the host's databases, then read as `ID[-ID]`;
//! the engine reads no host file, so the lookup is the caller's
//! ([`ParseOptions::resolve_owner`](super::ParseOptions::resolve_owner): vallumd's, at
//! commit), and without one a name is refused with an error saying so. The rule keeps the
//! number, which is what iptables-save prints. An error is located at the extension's name.

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
                // libxt_owner checks it when it reads the option: --gid-owner comes first.
                if m.gid.is_none() {
                    return Err(bad("--suppl-groups needs --gid-owner before it".into()));
                }
                m.suppl_groups = true;
            }
            "--uid-owner" | "--gid-owner" => {
                let [a] = o.args.as_slice() else {
                    return Err(bad(format!("option '{}' takes one argument", o.name)));
                };
                let (what, db) = if o.name == "--uid-owner" {
                    ("user", super::OwnerDb::User)
                } else {
                    ("group", super::OwnerDb::Group)
                };
                // As libxt_owner: ID or ID-ID, each below 2^32 - 1 ((uid_t)-1 is invalid).
                let id = |s: &str| {
                    parse_uint(s, u64::from(u32::MAX) - 1).map(|v| v as u32).ok_or_else(|| {
                        if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
                            bad(format!("{what} id '{s}' is out of range (0-4294967294)"))
                        } else {
                            bad(format!(
                                "{what} '{s}' does not exist on this host (names are looked up in \
                                 the host's databases when the ruleset is committed, as iptables \
                                 does when it loads it)"
                            ))
                        }
                    })
                };
                // getpwnam / getgrnam first, as libxt_owner's owner_parse.
                let named = ctx.resolve_owner.and_then(|f| f(db, a));
                let (lo, hi) = match (named, a.split_once('-')) {
                    (Some(v), _) => (v, v),
                    (None, Some((l, h))) => (id(l)?, id(h)?),
                    (None, None) => {
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
