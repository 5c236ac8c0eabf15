//! `-m u32`: the line parser collects its options as for an opaque extension; [`typed`] reads
//! `[!] --u32 TESTS` with libxt_u32's `u32_parse` (iptables 1.8.9) into [`Match::U32`], and
//! refuses what the kernel's `u32_mt_checkentry` refuses (shifts by 32 or more). An error is
//! located at the extension's name and gives the character position in TESTS as iptables
//! does ("u32: at char N: ...").
//!
//! Grammar: tests joined by `&&`; a test is a location, `=`, and ranges joined by `,`; a
//! location is a number followed by operations `&N`, `<<N`, `>>N`, `@N`; a range is `N` or
//! `N:M`. Numbers are read as `strtoull` with base 0 (decimal, `0x` hex, leading-`0` octal;
//! a `+` sign, not a `-`) up to 2^32 - 1; blanks may stand between the parts. At most 10
//! tests, 10 numbers in a location, 10 ranges in a test. Printed as `u32_save`: `[!] --u32
//! "0xA&0xB=0xC:0xD,..."` (every number in hex).

use crate::model::{Match, OpaqueOption, U32_MAX_ITEMS, U32Match, U32Op, U32Test};

use super::ParseError;
use super::ext_options::{ExtOptions, Opt};
use super::lexer::Tok;
use super::rule::Ctx;

/// u32's one option.
const GRAMMAR: &[Opt] = &[Opt::value("--u32").negatable()];

/// Reads `-m u32`'s options (collected opaque) into [`Match::U32`].
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Match, ParseError> {
    let r = ExtOptions::check("u32", GRAMMAR, options, token, ctx)?;
    let Some(o) = options.first() else {
        return Err(r.missing("--u32"));
    };
    let tests = parse(ExtOptions::arg(o)).map_err(|why| r.bad(why))?;
    let m = U32Match {
        negated: o.negated,
        tests,
    };
    if let Some(why) = m.kernel_refusal() {
        return Err(r.bad(format!("the kernel refuses it: {why}")));
    }
    Ok(Match::U32(Box::new(m)))
}

/// `strtoull(s, &end, 0)` as `xtables_strtoull` uses it (a leading `-` refused), at most
/// 2^32 - 1 (libxt_u32's `parse_number`): the number and the bytes read.
fn number(s: &[u8]) -> Option<(u32, usize)> {
    let mut i = 0;
    while s.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    if s.get(i) == Some(&b'-') {
        return None;
    }
    if s.get(i) == Some(&b'+') {
        i += 1;
    }
    let (radix, mut at) = match (s.get(i), s.get(i + 1), s.get(i + 2)) {
        (Some(b'0'), Some(b'x' | b'X'), Some(c)) if c.is_ascii_hexdigit() => (16, i + 2),
        (Some(b'0'), _, _) => (8, i),
        _ => (10, i),
    };
    let digits_from = at;
    let mut v: u64 = 0;
    while let Some(d) = s.get(at).and_then(|&c| char::from(c).to_digit(radix)) {
        v = v
            .saturating_mul(u64::from(radix))
            .saturating_add(u64::from(d));
        at += 1;
    }
    if at == digits_from {
        return None;
    }
    u32::try_from(v).ok().map(|v| (v, at))
}

/// libxt_u32's `u32_parse` over the `--u32` argument; `Err` is its message.
fn parse(arg: &str) -> Result<Vec<U32Test>, String> {
    let s = arg.as_bytes();
    let at = |i: usize, what: &str| format!("at char {i}: {what}");
    let mut tests = Vec::new();
    let mut cur = U32Test {
        start: 0,
        ops: Vec::new(),
        ranges: Vec::new(),
    };
    let (mut i, mut locind, mut in_values) = (0usize, 0usize, false);
    let read = |i: &mut usize| -> Result<u32, String> {
        let (v, n) = number(&s[*i..]).ok_or_else(|| at(*i, "not a number or out of range"))?;
        *i += n;
        Ok(v)
    };
    loop {
        while s.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
            i += 1;
        }
        let Some(&c) = s.get(i) else {
            if !in_values {
                return Err("abrupt end of input after location specifier".into());
            }
            if cur.ranges.is_empty() {
                return Err("test ended with no value specified".into());
            }
            tests.push(cur);
            if tests.len() > U32_MAX_ITEMS {
                return Err(at(i, "too many \"&&\"s"));
            }
            return Ok(tests);
        };
        if !in_values {
            if c == b'=' {
                if locind == 0 {
                    return Err(at(i, "location spec missing"));
                }
                i += 1;
                in_values = true;
                continue;
            }
            if locind == 0 {
                cur.start = read(&mut i)?;
            } else {
                let op = match c {
                    b'&' => U32Op::And,
                    b'<' | b'>' => {
                        i += 1;
                        if s.get(i) != Some(&c) {
                            return Err(at(
                                i,
                                if c == b'<' {
                                    "a second '<' was expected"
                                } else {
                                    "a second '>' was expected"
                                },
                            ));
                        }
                        if c == b'<' { U32Op::Shl } else { U32Op::Shr }
                    }
                    b'@' => U32Op::At,
                    _ => return Err(at(i, "operator expected")),
                };
                i += 1;
                let n = read(&mut i)?;
                cur.ops.push((op, n));
            }
            locind += 1;
            if locind > U32_MAX_ITEMS {
                return Err(at(i, "too many operators"));
            }
        } else if c == b'&' {
            i += 1;
            if s.get(i) != Some(&b'&') {
                return Err(at(i, "a second '&' was expected"));
            }
            if cur.ranges.is_empty() {
                return Err(at(i, "value spec missing"));
            }
            tests.push(std::mem::replace(
                &mut cur,
                U32Test {
                    start: 0,
                    ops: Vec::new(),
                    ranges: Vec::new(),
                },
            ));
            if tests.len() > U32_MAX_ITEMS {
                return Err(at(i, "too many \"&&\"s"));
            }
            i += 1;
            in_values = false;
            locind = 0;
        } else {
            if !cur.ranges.is_empty() {
                if c != b',' {
                    return Err(at(i, "expected \",\" or \"&&\""));
                }
                i += 1;
            }
            let min = read(&mut i)?;
            while s.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
                i += 1;
            }
            let max = if s.get(i) == Some(&b':') {
                i += 1;
                read(&mut i)?
            } else {
                min
            };
            cur.ranges.push((min, max));
            if cur.ranges.len() > U32_MAX_ITEMS {
                return Err(at(i, "too many \",\"s"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(t: &[U32Test]) -> String {
        let mut s = String::new();
        for (k, t) in t.iter().enumerate() {
            if k > 0 {
                s.push_str("&&");
            }
            s.push_str(&format!("{:#x}", t.start));
            for (op, n) in &t.ops {
                s.push_str(&format!("{}{n:#x}", op.text()));
            }
            s.push('=');
            for (k, (a, b)) in t.ranges.iter().enumerate() {
                if k > 0 {
                    s.push(',');
                }
                s.push_str(&if a == b {
                    format!("{a:#x}")
                } else {
                    format!("{a:#x}:{b:#x}")
                });
            }
        }
        s
    }

    /// What iptables-legacy-restore 1.8.9 answered (saved form or error), measured.
    #[test]
    fn parses_as_libxt_u32() {
        for (input, want) in [
            ("0x0=0x0&&0x0=0x1", Ok("0x0=0x0&&0x0=0x1")),
            (
                "6 & 0xFF = 1 && 4 & 0x3FFF = 0 && 0 >> 22 & 0x3C @ 0 >> 16 = 1:2,0x10",
                Ok("0x6&0xff=0x1&&0x4&0x3fff=0x0&&0x0>>0x16&0x3c@0x0>>0x10=0x1:0x2,0x10"),
            ),
            (" 010 = 0x1f : 077 ", Ok("0x8=0x1f:0x3f")),
            ("4294967295=4294967295", Ok("0xffffffff=0xffffffff")),
            ("0=2:1", Ok("0x0=0x2:0x1")),
            ("+5=1", Ok("0x5=0x1")),
            ("0 = 1 , 2 : 3 && 4 = 5", Ok("0x0=0x1,0x2:0x3&&0x4=0x5")),
            (
                "0&1&1&1&1&1&1&1&1&1=1",
                Ok("0x0&0x1&0x1&0x1&0x1&0x1&0x1&0x1&0x1&0x1=0x1"),
            ),
            ("-0=0", Err("at char 0: not a number or out of range")),
            (
                "4294967296=1",
                Err("at char 0: not a number or out of range"),
            ),
            (
                "0&1&1&1&1&1&1&1&1&1&1=1",
                Err("at char 21: too many operators"),
            ),
            (
                "0=1,2,3,4,5,6,7,8,9,10,11",
                Err("at char 25: too many \",\"s"),
            ),
            ("0=", Err("test ended with no value specified")),
            ("0", Err("abrupt end of input after location specifier")),
            ("0x=1", Err("at char 1: operator expected")),
            ("0=1,", Err("at char 4: not a number or out of range")),
            ("0&&0=1", Err("at char 2: not a number or out of range")),
            ("=1", Err("at char 0: location spec missing")),
            ("0=1 2", Err("at char 4: expected \",\" or \"&&\"")),
            ("0=0x", Err("at char 3: expected \",\" or \"&&\"")),
        ] {
            let got = parse(input).map(|t| dump(&t));
            assert_eq!(got.as_deref().map_err(String::as_str), want, "{input}");
        }
        let eleven = ["0=1"; 11].join("&&");
        assert_eq!(
            parse(&eleven).map(|_| ()),
            Err("at char 53: too many \"&&\"s".into())
        );
    }
}
