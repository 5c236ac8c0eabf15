//! `-m string`: the line parser collects its options as for an opaque extension; [`typed`]
//! reads them with libxt_string's revision-1 grammar (iptables 1.8.9) and the checks of the
//! kernel's `string_mt_check` into [`Match::String`]. An error is located at the extension's
//! name.
//!
//! Grammar: `--algo bm|kmp` (mandatory), exactly one of `[!] --string TEXT` (at most 128
//! bytes) and `[!] --hex-string TEXT` (`parse_hex_string`: `|..|` blocks of hex byte pairs,
//! spaces allowed between pairs, `\c` a literal outside them), `--from N`, `--to N` (16-bit,
//! `from <= to`), `--icase`; each at most once. iptables itself passes any `--algo` name to
//! the kernel, which knows `bm`, `kmp` and `fsm` (a token pattern language the engine does not
//! run): the parser takes `bm` and `kmp` and refuses the others, naming them.
//!
//! Printed as `string_save`: `[!] --string "TEXT"` (`"` and `\` escaped) or, when a byte is
//! not printable ASCII or the last one is a backslash, `[!] --hex-string "|HEX|"`; then
//! `--algo NAME`, `--from N` unless 0, `--to N` unless 65535, `--icase`.

use crate::model::{Match, OpaqueOption, STRING_MAX_PATTERN, StringAlgo, StringMatch};

use super::ParseError;
use super::ext_options::{ExtOptions, Opt};
use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;

/// string's options.
const GRAMMAR: &[Opt] = &[
    Opt::value("--string").negatable(),
    Opt::value("--hex-string").negatable(),
    Opt::value("--algo"),
    Opt::value("--from"),
    Opt::value("--to"),
    Opt::flag("--icase"),
];

/// Reads `-m string`'s options (collected opaque) into [`Match::String`].
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let r = ExtOptions::check("string", GRAMMAR, options, token, ctx)?;
    let bad = |reason: String| r.bad(reason);
    let mut m = StringMatch {
        negated: false,
        pattern: Vec::new(),
        algo: StringAlgo::Bm,
        from: 0,
        to: u16::MAX,
        icase: false,
    };
    let (mut algo, mut pattern) = (false, false);
    for o in options {
        let (name, arg) = (o.name.as_str(), ExtOptions::arg(o));
        match name {
            "--string" | "--hex-string" => {
                if pattern {
                    return Err(bad("--string and --hex-string exclude each other".into()));
                }
                pattern = true;
                m.negated = o.negated;
                m.pattern = if name == "--string" {
                    if arg.len() > STRING_MAX_PATTERN {
                        return Err(bad("STRING too long (at most 128 bytes)".into()));
                    }
                    arg.as_bytes().to_vec()
                } else {
                    hex_string(arg).map_err(|why| bad(why.into()))?
                };
            }
            "--algo" => {
                algo = true;
                m.algo = match arg {
                    "bm" => StringAlgo::Bm,
                    "kmp" => StringAlgo::Kmp,
                    _ => {
                        return Err(bad(format!(
                            "algorithm \"{arg}\" is not one the engine runs (bm, kmp)"
                        )));
                    }
                };
            }
            "--from" | "--to" => {
                let v = parse_uint(arg, u64::from(u16::MAX))
                    .ok_or_else(|| bad(format!("bad value \"{arg}\" for \"{name}\"")))?
                    as u16;
                if name == "--from" {
                    m.from = v;
                } else {
                    m.to = v;
                }
            }
            _ => m.icase = true,
        }
    }
    if !algo {
        return Err(r.missing("--algo"));
    }
    if !pattern {
        return Err(r.missing("--string or --hex-string"));
    }
    if let Some(why) = m.kernel_refusal() {
        return Err(bad(why.into()));
    }
    Ok(Match::String(Box::new(m)))
}

/// libxt_string's `parse_hex_string`, with its quirks: after a `|` the next character is
/// taken as it is (so `|41||42|` is `A|42`, as iptables-legacy-save shows), spaces right
/// after an opening `|` and after a hex pair are skipped, `\c` outside a block is the literal
/// `c`.
fn hex_string(s: &str) -> Result<Vec<u8>, &'static str> {
    let s = s.as_bytes();
    if s.is_empty() {
        return Err("STRING must contain at least one char");
    }
    let (mut out, mut i, mut hex, mut literal) = (Vec::new(), 0usize, false, false);
    while i < s.len() {
        if s[i] == b'\\' && !hex {
            literal = true;
        } else if s[i] == b'\\' {
            return Err("Cannot include literals in hex data");
        } else if s[i] == b'|' {
            if hex {
                hex = false;
            } else {
                hex = true;
                while s.get(i + 1) == Some(&b' ') {
                    i += 1;
                }
            }
            if i + 1 >= s.len() {
                break;
            }
            i += 1;
        }
        if literal {
            let Some(&c) = s.get(i + 1) else {
                return Err("Bad literal placement at end of string");
            };
            out.push(c);
            i += 2;
            literal = false;
        } else if hex {
            if i + 1 >= s.len() {
                return Err("Odd number of hex digits");
            }
            if i + 2 >= s.len() {
                return Err("Invalid hex block");
            }
            let digit = |c: u8| (c as char).to_digit(16);
            let (Some(h), Some(l)) = (digit(s[i]), digit(s[i + 1])) else {
                return Err("Invalid hex char");
            };
            out.push((h * 16 + l) as u8);
            i += if s[i + 2] == b' ' { 3 } else { 2 };
        } else {
            out.push(s[i]);
            i += 1;
        }
        if out.len() > STRING_MAX_PATTERN {
            return Err("STRING too long (at most 128 bytes)");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::hex_string;

    #[test]
    fn hex_strings_as_libxt_string_reads_them() {
        assert_eq!(hex_string("|0a0a|ab|00|"), Ok(vec![10, 10, b'a', b'b', 0]));
        assert_eq!(hex_string("| 41 42|"), Ok(b"AB".to_vec()));
        assert_eq!(hex_string("|41||42|"), Ok(b"A|42".to_vec()));
        assert_eq!(hex_string("a\\|b"), Ok(b"a|b".to_vec()));
        assert!(hex_string("|4|").is_err());
        assert!(hex_string("|4g|").is_err());
        assert!(hex_string("ab\\").is_err());
        assert!(hex_string("|41").is_err());
    }
}
