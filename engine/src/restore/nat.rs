//! The options of the nat targets, which the engine stores (and hands to the kernel with
//! `--kernel-tables`) without enforcing them, checked as iptables' libxt_DNAT / libxt_SNAT /
//! libxt_MASQUERADE / libxt_REDIRECT / libxt_NETMAP read them, and written back in
//! iptables-save's form:
//!
//! - `DNAT`: `--to-destination [ADDR[-ADDR]][:PORT[-PORT[/BASE]]]` (required, once; IPv6
//!   addresses in brackets when a port follows), `--random`, `--persistent`;
//! - `SNAT`: `--to-source` as DNAT's (required; no `/BASE`), `--random`, `--random-fully`,
//!   `--persistent`;
//! - `MASQUERADE`: `--to-ports PORT[-PORT]`, `--random`, `--random-fully`;
//! - `REDIRECT`: `--to-ports PORT[-PORT]`, `--random`;
//! - `NETMAP`: `--to ADDR[/LEN]` (required).
//!
//! Ports need `-p` tcp, udp, sctp, dccp or udplite; a port is a number 0-65535 or a service
//! name, printed as its number (the ends of a range are numbers; BASE may be a name); a range whose ends are equal is printed as one port. A flag
//! takes no argument (`--random @@` is refused), no option may be negated or repeated, and an
//! option the target does not have is refused. Every error is located at the target's name.

use std::net::IpAddr;

use crate::model::{Family, Neg, OpaqueOption};

use super::extensions::{parse_uint, service_port};
use super::lexer::Tok;
use super::rule::Ctx;
use super::{ParseError, ParseErrorKind as K};

/// Protocols with ports (tcp, udp, dccp, sctp, udplite).
const PORT_PROTOCOLS: [u8; 5] = [6, 17, 33, 132, 136];

/// Checks and rewrites the options of nat target `name` (see the module docs); other targets
/// pass untouched. `protocol` is the rule's `-p`.
pub(super) fn check_target(
    name: &str,
    options: &mut [OpaqueOption],
    protocol: Option<Neg<u8>>,
    token: &Tok<'_>,
    ctx: &Ctx<'_>,
) -> Result<(), ParseError> {
    let (values, flags, required): (&[&str], &[&str], Option<&str>) = match name {
        "DNAT" => (
            &["--to-destination"],
            &["--random", "--persistent"],
            Some("--to-destination"),
        ),
        "SNAT" => (
            &["--to-source"],
            &["--random", "--random-fully", "--persistent"],
            Some("--to-source"),
        ),
        "MASQUERADE" => (&["--to-ports"], &["--random", "--random-fully"], None),
        "REDIRECT" => (&["--to-ports"], &["--random"], None),
        "NETMAP" => (&["--to"], &[], Some("--to")),
        _ => return Ok(()),
    };
    let bad = |reason: String| {
        ctx.err(
            token,
            K::InvalidValue {
                what: "extension option",
                reason: format!("{name}: {reason}"),
            },
        )
    };
    let ports_ok = protocol.is_some_and(|p| !p.negated && PORT_PROTOCOLS.contains(&p.value));
    for (i, o) in options.iter().enumerate() {
        if options[..i].iter().any(|p| p.name == o.name) {
            return Err(bad(format!("option '{}' given twice", o.name)));
        }
        if o.negated {
            return Err(bad(format!("option '{}' cannot be negated", o.name)));
        }
        if flags.contains(&o.name.as_str()) {
            if !o.args.is_empty() {
                return Err(bad(format!("option '{}' takes no argument", o.name)));
            }
        } else if !values.contains(&o.name.as_str()) {
            return Err(bad(format!("unknown option '{}'", o.name)));
        } else if o.args.len() != 1 {
            return Err(bad(format!("option '{}' takes one argument", o.name)));
        }
    }
    if let Some(r) = required {
        if !options.iter().any(|o| o.name == r) {
            return Err(bad(format!("option '{r}' is required")));
        }
    }
    for o in options
        .iter_mut()
        .filter(|o| values.contains(&o.name.as_str()))
    {
        let arg = &o.args[0];
        let canonical = match o.name.as_str() {
            "--to-ports" => {
                if !ports_ok {
                    return Err(bad(
                        "--to-ports needs -p tcp, udp, sctp, dccp or udplite".into()
                    ));
                }
                port_range(arg, false).map_err(bad)?
            }
            "--to" => netmap_to(arg, ctx.family).map_err(bad)?,
            _ => nat_range(arg, ctx.family, ports_ok, name == "DNAT").map_err(bad)?,
        };
        o.args = vec![canonical];
    }
    Ok(())
}

fn port(s: &str) -> Result<u16, String> {
    if let Some(v) = parse_uint(s, 65535) {
        return Ok(v as u16);
    }
    // The service names the filter side's port parser knows, one table for both.
    service_port(s).ok_or_else(|| format!("'{s}' is not a port number 0-65535"))
}

/// `PORT[-PORT[/BASE]]` (BASE with `with_base`, 1-65535) as iptables-save prints it.
fn port_range(s: &str, with_base: bool) -> Result<String, String> {
    let (range, base) = match s.split_once('/') {
        Some((r, b)) if with_base => (r, Some(b)),
        Some(_) => return Err(format!("'{s}': a port range takes no /BASE here")),
        None => (s, None),
    };
    // A service name may hold a '-' (`ftp-data`): read the whole first. The ends of a range
    // are numbers (iptables 1.8.9: "Port `ssh' not valid" for `10-ssh`).
    let (lo, hi) = match port(range) {
        Ok(p) => (p, p),
        Err(_) => {
            let number = |p: &str| {
                parse_uint(p, 65535)
                    .map(|v| v as u16)
                    .ok_or_else(|| format!("port '{p}' not valid (a range takes numbers)"))
            };
            let (a, b) = range
                .split_once('-')
                .ok_or_else(|| format!("'{range}' is not a port or port range"))?;
            (number(a)?, number(b)?)
        }
    };
    if lo > hi {
        return Err(format!("'{range}': the range starts above its end"));
    }
    let mut out = if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    };
    if let Some(b) = base {
        let b = port(b)?;
        if b == 0 {
            return Err("the base port must be 1-65535".into());
        }
        out.push_str(&format!("/{b}"));
    }
    Ok(out)
}

fn address(s: &str, family: Family) -> Result<IpAddr, String> {
    let a: Option<IpAddr> = match family {
        Family::Ipv4 => s.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4),
        Family::Ipv6 => s.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6),
    };
    a.ok_or_else(|| {
        let fam = if family == Family::Ipv4 {
            "IPv4"
        } else {
            "IPv6"
        };
        format!("'{s}' is not an {fam} address")
    })
}

/// `ADDR[-ADDR]`, the second not below the first.
fn address_range(s: &str, family: Family) -> Result<String, String> {
    match s.split_once('-') {
        Some((a, b)) => {
            let (x, y) = (address(a, family)?, address(b, family)?);
            if x > y {
                return Err(format!("'{s}': the range starts above its end"));
            }
            Ok(format!("{x}-{y}"))
        }
        None => Ok(address(s, family)?.to_string()),
    }
}

/// `--to-destination` / `--to-source`: `[ADDR[-ADDR]][:PORTS]`, IPv6 `[ADDR[-ADDR]]:PORTS`.
fn nat_range(s: &str, family: Family, ports_ok: bool, with_base: bool) -> Result<String, String> {
    let (addrs, ports) = match family {
        Family::Ipv4 => match s.split_once(':') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        },
        Family::Ipv6 => match s.strip_prefix('[') {
            Some(rest) => {
                let (a, after) = rest
                    .split_once(']')
                    .ok_or_else(|| format!("'{s}': '[' without ']'"))?;
                match after {
                    "" => (a, None),
                    _ => (
                        a,
                        Some(
                            after
                                .strip_prefix(':')
                                .ok_or_else(|| format!("'{s}': ':PORT' expected after ']'"))?,
                        ),
                    ),
                }
            }
            None => (s, None),
        },
    };
    if addrs.is_empty() && ports.is_none() {
        return Err("an address or a port is required".into());
    }
    let addrs = if addrs.is_empty() {
        String::new()
    } else {
        address_range(addrs, family)?
    };
    let Some(ports) = ports else {
        return Ok(addrs);
    };
    if !ports_ok {
        return Err("a port needs -p tcp, udp, sctp, dccp or udplite".into());
    }
    let ports = port_range(ports, with_base)?;
    Ok(match family {
        Family::Ipv4 => format!("{addrs}:{ports}"),
        Family::Ipv6 => format!("[{addrs}]:{ports}"),
    })
}

/// NETMAP's `--to ADDR[/LEN]`.
fn netmap_to(s: &str, family: Family) -> Result<String, String> {
    let max = if family == Family::Ipv4 { 32 } else { 128 };
    match s.split_once('/') {
        Some((a, l)) => {
            let a = address(a, family)?;
            let len = parse_uint(l, max).ok_or_else(|| format!("'{l}' is not a prefix 0-{max}"))?;
            Ok(format!("{a}/{len}"))
        }
        None => Ok(format!("{}/{max}", address(s, family)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let v4 = Family::Ipv4;
        assert_eq!(nat_range("1.1.1.1", v4, false, true).unwrap(), "1.1.1.1");
        assert_eq!(
            nat_range("1.1.1.1-1.1.1.10:1025-65535", v4, true, true).unwrap(),
            "1.1.1.1-1.1.1.10:1025-65535"
        );
        assert_eq!(
            nat_range("1.1.1.1:ssh", v4, true, true).unwrap(),
            "1.1.1.1:22"
        );
        assert_eq!(
            nat_range("1.1.1.1:10-20/ftp", v4, true, true).unwrap(),
            "1.1.1.1:10-20/21"
        );
        assert_eq!(
            nat_range("[dead::beef]:ftp-data", Family::Ipv6, true, true).unwrap(),
            "[dead::beef]:20"
        );
        for bad in [
            "99999999999999999999999",
            "1.1.1.1:1025-65536",
            "1.1.1.1:1000-2000/0",
            "1.1.1.1:1000-2000/65536",
            "1.1.1.2-1.1.1.1",
            "",
        ] {
            assert!(nat_range(bad, v4, true, true).is_err(), "{bad}");
        }
        assert!(
            nat_range("1.1.1.1:80", v4, false, true).is_err(),
            "port without -p"
        );
        assert!(nat_range("[dead::beef", Family::Ipv6, true, true).is_err());
        assert_eq!(port_range("0-0", false).unwrap(), "0");
        assert!(port_range("42-1234/567", false).is_err());
    }

    /// Issue #28 item 11: the report's garbage is refused at the target's line, as any bad
    /// filter option is; the forms of iptables' own vectors parse and print as iptables-save.
    #[test]
    fn nat_tables_are_parsed_strictly() {
        use crate::restore::{ParseOptions, PrintOptions, parse, print};
        let text =
            |rule: &str| format!("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING {rule}\nCOMMIT\n");
        for bad in [
            "-j DNAT --to-destination 99999999999999999999999",
            "-j MASQUERADE --random @@",
            "-j DNAT --to-destination 1.1.1.1 --to-destination 2.2.2.2",
            "-j DNAT --to-destination 1.1.1.1:80",
            "-j SNAT --to-source 1.1.1.1 --bogus",
            "-p tcp -j REDIRECT --to-ports 65536",
            "-p tcp -j REDIRECT --to-ports 10-ssh",
            "-p tcp -j DNAT --to-destination 1.1.1.1:echo-ssh",
            "-j DNAT",
            "-j NETMAP",
        ] {
            let e = parse(&text(bad), &ParseOptions::default()).expect_err(bad);
            assert_eq!(e.0[0].location.line, 3, "{bad}: {e}");
        }
        for (rule, printed) in [
            (
                "-p tcp -j DNAT --to-destination 1.1.1.1:ssh",
                "-p tcp -j DNAT --to-destination 1.1.1.1:22",
            ),
            (
                "-p udp -j REDIRECT --to-ports 512-512",
                "-p udp -j REDIRECT --to-ports 512",
            ),
            (
                "-j MASQUERADE --random-fully",
                "-j MASQUERADE --random-fully",
            ),
            (
                "-j SNAT --to-source 1.1.1.1 --random --persistent",
                "-j SNAT --to-source 1.1.1.1 --random --persistent",
            ),
        ] {
            let r = parse(&text(rule), &ParseOptions::default())
                .unwrap_or_else(|e| panic!("{rule}: {e}"));
            let out = print(&r.tables, &PrintOptions::default());
            assert!(out.contains(printed), "{rule}: {out}");
        }
    }
}
