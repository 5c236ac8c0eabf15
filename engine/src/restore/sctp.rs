//! `-m sctp`: the line parser collects its options as for an opaque extension; [`typed`]
//! reads them with libxt_sctp's grammar (iptables 1.8.9) into [`Match::Sctp`]. An error is
//! located at the extension's name.
//!
//! Grammar: `[!] --source-port|--sport PORT[:PORT]`, `[!] --destination-port|--dport
//! PORT[:PORT]`, `[!] --chunk-types all|any|only LIST`, each at most once. LIST is `ALL`,
//! `NONE`, or comma-separated chunk names ([`SCTP_CHUNK_NAMES`], any case), each with
//! `:FLAGS` where the type has flags (a capital letter: the flag set, a small one: clear); at
//! most [`SCTP_MAX_FLAGS`] types with flags. Printed as `sctp_save` (see
//! `print.rs`): the ports as given (a full range too), then `--chunk-types MODE` and `ALL`,
//! `NONE` or the listed types in number order with their flags.

use crate::model::{
    Match, Neg, OpaqueOption, SCTP_CHUNK_NAMES, SCTP_MAX_FLAGS, SctpChunkMode, SctpChunks,
    SctpFlag, SctpMatch,
};

use super::ext_options::ExtOptions;
use super::extensions::port_range;
use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// Reads `-m sctp`'s options (collected opaque) into [`Match::Sctp`].
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    // `--chunk-types` takes two arguments, which the shared grammar check does not know: its
    // reporter only.
    let r = ExtOptions::check("sctp", &[], &[], token, ctx)?;
    let bad = |reason: String| r.bad(reason);
    let mut m = SctpMatch {
        sport: None,
        dport: None,
        chunks: None,
    };
    for o in options {
        let name = o.name.as_str();
        match name {
            "--source-port" | "--sport" | "--destination-port" | "--dport" => {
                let src = matches!(name, "--source-port" | "--sport");
                let slot = if src { &mut m.sport } else { &mut m.dport };
                if slot.is_some() {
                    return Err(ctx.err(
                        token,
                        K::DuplicateOption(
                            if src {
                                "--source-port"
                            } else {
                                "--destination-port"
                            }
                            .into(),
                        ),
                    ));
                }
                let [arg] = o.args.as_slice() else {
                    return Err(bad(format!("option \"{name}\" takes one argument")));
                };
                let t = Tok {
                    text: arg,
                    column: token.column,
                };
                *slot = Some(Neg {
                    negated: o.negated,
                    value: port_range(&t, ctx)?,
                });
            }
            "--chunk-types" => {
                if m.chunks.is_some() {
                    return Err(ctx.err(token, K::DuplicateOption(name.into())));
                }
                let [mode, list] = o.args.as_slice() else {
                    return Err(bad("--chunk-types requires two args".into()));
                };
                let mode = match mode.to_ascii_lowercase().as_str() {
                    "any" => SctpChunkMode::Any,
                    "all" => SctpChunkMode::All,
                    "only" => SctpChunkMode::Only,
                    _ => {
                        return Err(bad(
                            "Match type has to be one of \"ALL\", \"ANY\" or \"ONLY\"".into(),
                        ));
                    }
                };
                let (map, flags) = chunk_list(list).map_err(bad)?;
                m.chunks = Some(SctpChunks {
                    negated: o.negated,
                    mode,
                    map,
                    flags,
                });
            }
            _ => {
                return Err(ctx.err(
                    token,
                    K::UnknownExtensionOption {
                        extension: "sctp".into(),
                        option: name.into(),
                    },
                ));
            }
        }
    }
    Ok(Match::Sctp(Box::new(m)))
}

/// libxt_sctp's `parse_sctp_chunk`: the chunk map and the flags of `list`.
fn chunk_list(list: &str) -> Result<([u32; 8], Vec<SctpFlag>), String> {
    let mut map = [0u32; 8];
    let mut flags: Vec<SctpFlag> = Vec::new();
    if list.eq_ignore_ascii_case("ALL") {
        return Ok(([u32::MAX; 8], flags));
    }
    if list.eq_ignore_ascii_case("NONE") {
        return Ok((map, flags));
    }
    // strtok: empty items are skipped.
    for item in list.split(',').filter(|i| !i.is_empty()) {
        let (name, chunk_flags) = match item.split_once(':') {
            Some((n, f)) => (n, Some(f)),
            None => (item, None),
        };
        let Some(index) = SCTP_CHUNK_NAMES
            .iter()
            .position(|(n, _, _)| n.eq_ignore_ascii_case(name))
        else {
            return Err(format!("Unknown sctp chunk `{name}'"));
        };
        let (_, t, valid) = SCTP_CHUNK_NAMES[index];
        map[usize::from(t / 32)] |= 1 << (t % 32);
        for c in chunk_flags.unwrap_or("").chars() {
            let Some(at) = valid.find(c.to_ascii_uppercase()) else {
                return Err(format!("Invalid flags for chunk type {index}"));
            };
            let bit = 1u8 << (7 - at);
            // save_chunk_flag_info: keyed by the name's index (see `SctpFlag`).
            let key = index as u8;
            let f = match flags.iter().position(|f| f.chunk_type == key) {
                Some(i) => &mut flags[i],
                None => {
                    if flags.len() == SCTP_MAX_FLAGS {
                        return Err(format!(
                            "Number of chunk types with flags exceeds currently allowed limit ({SCTP_MAX_FLAGS})"
                        ));
                    }
                    flags.push(SctpFlag {
                        chunk_type: key,
                        flag: 0,
                        mask: 0,
                    });
                    let last = flags.len() - 1;
                    &mut flags[last]
                }
            };
            f.mask |= bit;
            if c.is_ascii_uppercase() {
                f.flag |= bit;
            }
        }
    }
    Ok((map, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_lists_as_libxt_sctp() {
        let (map, flags) = chunk_list("INIT,DATA:iUbE,SACK,ABORT:T").expect("parses");
        assert_eq!(map[0], 1 << 1 | 1 | 1 << 3 | 1 << 6);
        assert_eq!(
            flags,
            vec![
                SctpFlag {
                    chunk_type: 0,
                    flag: 0b0101,
                    mask: 0b1111
                },
                SctpFlag {
                    chunk_type: 6,
                    flag: 1,
                    mask: 1
                },
            ]
        );
        let (map, _) = chunk_list("i_data,asconf").expect("parses");
        assert_eq!(map[2], 1, "I_DATA is 64");
        assert_eq!(map[6], 1 << 1, "ASCONF is 193");
        assert_eq!(chunk_list("all").expect("parses").0, [u32::MAX; 8]);
        assert_eq!(chunk_list("NONE").expect("parses").0, [0; 8]);
        assert!(chunk_list("BOGUS").is_err());
        assert!(chunk_list("INIT:T").is_err(), "INIT has no flags");
        assert!(chunk_list("DATA:I,ABORT:T,SHUTDOWN_COMPLETE:T,I_DATA:E,DATA:U").is_ok());
        assert!(
            chunk_list("DATA:I,ABORT:T,SHUTDOWN_COMPLETE:T,I_DATA:E,ABORT:t").is_ok(),
            "ABORT again merges"
        );
    }
}
