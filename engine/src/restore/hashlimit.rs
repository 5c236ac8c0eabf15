//! `-m hashlimit`: the line parser collects its options as for an opaque extension; [`typed`]
//! reads them with libxt_hashlimit's revision-3 grammar (iptables 1.8.9) into
//! [`Match::Hashlimit`] when the rate counts packets. A byte rate (`4kb/s`), a burst with a
//! size suffix or `--hashlimit-rate-match` leaves the match opaque (stored only: validation
//! refuses it in filter and raw). An error is located at the extension's name.
//!
//! Grammar: `[!] --hashlimit-upto RATE` or `[!] --hashlimit-above RATE` (`--hashlimit` is the
//! old name of `-upto`; `!` swaps the two), `--hashlimit-name NAME` (mandatory),
//! `--hashlimit-burst N`, `--hashlimit-mode LIST` (`srcip`, `srcport`, `dstip`, `dstport`,
//! separated by `,` or `|`), `--hashlimit-srcmask/-dstmask LEN`, `--hashlimit-htable-size`,
//! `-max`, `-gcinterval`, `-expire`; each at most once. RATE is `N[/second|/minute|/hour|/day]`
//! (a unit by any prefix of its name), stored as the period in microseconds
//! (`1000000 * unit / N`, which must not round to 0). The default expire is the written unit
//! in ms, as libxt_hashlimit's final check.
//!
//! Printed as `hashlimit_mt_print` (revision 3): `--hashlimit-upto|-above RATE` in the largest
//! unit that keeps it exact, `--hashlimit-burst N` (always), `--hashlimit-mode`,
//! `--hashlimit-name`, then the htable values that differ from their defaults (expire: the
//! printed unit in ms), then the masks that are not the family's width.

use crate::model::{Family, HASHLIMIT_SCALE, HashlimitMatch, Match, OpaqueOption, hashlimit_mode};

use super::ParseError;
use super::ext_options::{ExtOptions, Opt};
use super::extensions::parse_uint;
use super::lexer::Tok;
use super::rule::Ctx;

/// hashlimit's options (`--hashlimit` is libxt_hashlimit's revision-0 spelling of
/// `--hashlimit-upto`).
const GRAMMAR: &[Opt] = &[
    Opt::value("--hashlimit").negatable(),
    Opt::value("--hashlimit-upto").negatable(),
    Opt::value("--hashlimit-above").negatable(),
    Opt::value("--hashlimit-name"),
    Opt::value("--hashlimit-burst"),
    Opt::value("--hashlimit-mode"),
    Opt::value("--hashlimit-srcmask"),
    Opt::value("--hashlimit-dstmask"),
    Opt::value("--hashlimit-htable-size"),
    Opt::value("--hashlimit-htable-max"),
    Opt::value("--hashlimit-htable-gcinterval"),
    Opt::value("--hashlimit-htable-expire"),
    Opt::flag("--hashlimit-rate-match"),
    Opt::value("--hashlimit-rate-interval"),
];

/// Reads `-m hashlimit`'s options (collected opaque) into [`Match::Hashlimit`]; `Ok(None)`
/// when the rule is a byte rate or a rate match (kept opaque).
pub(crate) fn typed(
    options: &[OpaqueOption],
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<Option<Match>, ParseError> {
    let r = ExtOptions::check("hashlimit", GRAMMAR, options, token, ctx)?;
    let bad = |reason: String| r.bad(reason);
    let width: u8 = if ctx.family == Family::Ipv4 { 32 } else { 128 };
    let mut m = HashlimitMatch {
        above: false,
        avg: 0,
        burst: 5,
        mode: 0,
        name: String::new(),
        size: 0,
        max: 0,
        gc_interval: 1000,
        expire: 0,
        srcmask: None,
        dstmask: None,
    };
    let (mut rate, mut name, mut expire, mut opaque) = (false, false, false, false);
    let mut unit_ms = 1000u32;
    for o in options {
        let (opt, arg) = (o.name.as_str(), ExtOptions::arg(o));
        let key = if opt == "--hashlimit" {
            "--hashlimit-upto"
        } else {
            opt
        };
        let bad_value = || bad(format!("bad value \"{arg}\" for \"{opt}\""));
        let uint = |max: u64| parse_uint(arg, max).ok_or_else(bad_value);
        match key {
            "--hashlimit-upto" | "--hashlimit-above" => {
                if rate {
                    return Err(bad(
                        "--hashlimit-upto and --hashlimit-above exclude each other".into(),
                    ));
                }
                rate = true;
                m.above = (key == "--hashlimit-above") != o.negated;
                if arg.find("b/s").is_some_and(|at| at > 0) {
                    opaque = true;
                    continue;
                }
                let (avg, mult) = parse_rate(arg).ok_or_else(|| {
                    bad(format!(
                        "bad value \"{arg}\" for \"{opt}\" (N/sec, /min, /hour or /day, at most 1000000/sec)"
                    ))
                })?;
                m.avg = avg;
                unit_ms = mult * 1000;
            }
            "--hashlimit-name" => {
                name = true;
                m.name = arg.to_string();
            }
            "--hashlimit-burst" => {
                if !arg.chars().all(|c| c.is_ascii_digit()) {
                    // A size (`400kb`): a byte rate's burst.
                    opaque = true;
                    continue;
                }
                m.burst = uint(u64::from(crate::model::HASHLIMIT_BURST_MAX))
                    .ok()
                    .filter(|&v| v >= 1)
                    .ok_or_else(|| {
                        bad(format!(
                            "bad value for option \"--hashlimit-burst\", or out of range (1-{})",
                            crate::model::HASHLIMIT_BURST_MAX
                        ))
                    })? as u32;
            }
            "--hashlimit-mode" => m.mode = parse_mode(arg).ok_or_else(bad_value)?,
            "--hashlimit-srcmask" | "--hashlimit-dstmask" => {
                let len = uint(u64::from(width))? as u8;
                let v = (len != width).then_some(len);
                if key == "--hashlimit-srcmask" {
                    m.srcmask = v;
                } else {
                    m.dstmask = v;
                }
            }
            "--hashlimit-htable-size" => m.size = uint(u64::from(u32::MAX))? as u32,
            "--hashlimit-htable-max" => m.max = uint(u64::from(u32::MAX))? as u32,
            "--hashlimit-htable-gcinterval" => m.gc_interval = uint(u64::from(u32::MAX))? as u32,
            "--hashlimit-htable-expire" => {
                expire = true;
                m.expire = uint(u64::from(u32::MAX))? as u32;
            }
            // --hashlimit-rate-match, --hashlimit-rate-interval.
            _ => opaque = true,
        }
    }
    if !rate {
        return Err(r.missing("--hashlimit-upto or --hashlimit-above"));
    }
    if !name {
        return Err(r.missing("--hashlimit-name"));
    }
    if opaque {
        return Ok(None);
    }
    if !expire {
        m.expire = unit_ms;
    }
    if let Some(why) = m.kernel_refusal(ctx.family) {
        return Err(bad(why.into()));
    }
    Ok(Some(Match::Hashlimit(m)))
}

/// libxt_hashlimit's `parse_rate` (revision 3): `(period in µs, the unit in seconds)`.
fn parse_rate(s: &str) -> Option<(u64, u32)> {
    let (n, unit) = match s.split_once('/') {
        Some((n, u)) => (n, Some(u)),
        None => (s, None),
    };
    let mult: u32 = match unit {
        None => 1,
        Some("") => return None,
        Some(u) => {
            let is = |name: &str| name.len() >= u.len() && name[..u.len()].eq_ignore_ascii_case(u);
            if is("second") {
                1
            } else if is("minute") {
                60
            } else if is("hour") {
                3600
            } else if is("day") {
                86_400
            } else {
                return None;
            }
        }
    };
    // strtoull: the leading digits.
    let digits = n.len() - n.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let r: u64 = n[..digits].parse().ok().filter(|&r| r != 0)?;
    let avg = HASHLIMIT_SCALE * u64::from(mult) / r;
    (avg != 0).then_some((avg, mult))
}

/// libxt_hashlimit's `parse_mode`.
fn parse_mode(s: &str) -> Option<u8> {
    let mut mode = 0;
    for w in s.split([',', '|']).filter(|w| !w.is_empty()) {
        mode |= hashlimit_mode::NAMES
            .iter()
            .find(|(n, _)| *n == w)
            .map(|(_, b)| *b)?;
    }
    Some(mode)
}

/// `print_rate` (revision 3): the rate in the largest unit that divides evenly, as
/// `(N, unit name, the unit in ms)`.
pub(crate) fn rate_parts(avg: u64) -> (u64, &'static str, u64) {
    const RATES: [(&str, u64); 4] = [
        ("day", HASHLIMIT_SCALE * 86_400),
        ("hour", HASHLIMIT_SCALE * 3600),
        ("min", HASHLIMIT_SCALE * 60),
        ("sec", HASHLIMIT_SCALE),
    ];
    let period = avg.max(1);
    let mut i = 1;
    while i < RATES.len() {
        if period > RATES[i].1 || RATES[i].1 / period < RATES[i].1 % period {
            break;
        }
        i += 1;
    }
    let (name, mult) = RATES[i - 1];
    (mult / period, name, mult / HASHLIMIT_SCALE * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print_as_libxt_hashlimit() {
        assert_eq!(parse_rate("1/sec"), Some((1_000_000, 1)));
        assert_eq!(parse_rate("1/s"), Some((1_000_000, 1)));
        assert_eq!(parse_rate("120/min"), Some((500_000, 60)));
        assert_eq!(parse_rate("1/day"), Some((86_400_000_000, 86_400)));
        assert_eq!(parse_rate("5"), Some((200_000, 1)));
        assert_eq!(parse_rate("2000000/sec"), None, "rounds to zero");
        assert_eq!(parse_rate("0/sec"), None);
        assert_eq!(parse_rate("1/"), None);
        assert_eq!(parse_rate("1/week"), None);
        assert_eq!(rate_parts(1_000_000), (1, "sec", 1000));
        assert_eq!(rate_parts(500_000), (2, "sec", 1000));
        assert_eq!(rate_parts(60_000_000), (1, "min", 60_000));
        assert_eq!(rate_parts(86_400_000_000), (1, "day", 86_400_000));
        assert_eq!(rate_parts(1), (1_000_000, "sec", 1000));
        assert_eq!(parse_mode("srcip,dstport|dstip"), Some(1 | 8 | 4));
        assert_eq!(parse_mode(""), Some(0));
        assert_eq!(parse_mode("srcip,bogus"), None);
    }
}
