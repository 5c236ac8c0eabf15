//! Argument types and parsers several subcommand families share.

use std::time::Duration;

use clap::ValueEnum;

use crate::error::CliError;

/// `--family`: the family of lines without `-4`/`-6`, and of a connection-table filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FamilyArg {
    /// IPv4 (iptables).
    Ipv4,
    /// IPv6 (ip6tables).
    Ipv6,
}

/// Parses `500ms`, `30s`, `5m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 30s, 500ms, 5m, 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("unknown unit `{unit}` in `{s}` (ms, s, m, h)")),
    };
    Ok(d)
}

/// A duration as `google.protobuf.Duration` (saturating at `i64::MAX` seconds).
pub fn proto_duration(d: Option<Duration>) -> Option<prost_types::Duration> {
    d.map(|d| prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    })
}

/// Accepts `rulesets/R/revisions/N` or the short `R/N`; anything else is a usage error.
pub fn revision_name(s: &str) -> Result<String, CliError> {
    if let Some(rest) = s.strip_prefix("rulesets/") {
        if let Some((r, n)) = rest.split_once("/revisions/") {
            if !r.is_empty() && n.parse::<u64>().is_ok() {
                return Ok(s.to_owned());
            }
        }
    } else if let Some((r, n)) = s.rsplit_once('/') {
        if !r.is_empty() && !r.contains('/') && n.parse::<u64>().is_ok() {
            return Ok(format!("rulesets/{r}/revisions/{n}"));
        }
    }
    Err(CliError::Argument(format!(
        "`{s}` is not a revision (RULESET/N or rulesets/RULESET/revisions/N)"
    )))
}

/// [`revision_name`] as clap's value parser, so a malformed revision is a usage error (exit 2)
/// decided before any call, whether or not the server is up.
pub fn revision_arg(s: &str) -> Result<String, String> {
    revision_name(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("3x").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn revision_names() {
        assert_eq!(revision_name("web/3").unwrap(), "rulesets/web/revisions/3");
        assert_eq!(
            revision_name("rulesets/web/revisions/3").unwrap(),
            "rulesets/web/revisions/3"
        );
        assert!(revision_name("web").is_err());
        assert!(revision_name("web/x").is_err());
        assert!(revision_name("a/b/3").is_err());
    }
}
