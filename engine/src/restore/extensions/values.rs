//! Value parsers of the extensions' options, each with iptables' grammar: numbers as
//! `strtoul`, ports and services, addresses and masks (with a fast path for dotted quads),
//! protocols, TCP flag lists, multiport lists, ICMP type names, conntrack states, marks, rates,
//! MAC addresses. Used by `matches`, `targets` and the rule parser (`-s`, `-d`, `-p`).
//!
//! Parse time only (not on the packet path); errors carry the token's line and column.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{Family, IcmpMatch, IpNet, MarkValue, PortRange, RateUnit, ct_state};

use super::super::lexer::{Tok, split_byte};
use super::super::rule::Ctx;
use super::super::{ParseError, ParseErrorKind as K};

pub(super) fn invalid(
    ctx: &Ctx<'_>,
    t: &Tok,
    what: &'static str,
    reason: impl Into<String>,
) -> ParseError {
    ctx.err(
        t,
        K::InvalidValue {
            what,
            reason: reason.into(),
        },
    )
}

// === numbers, ports, addresses ===

/// An unsigned number as C's `strtoul(s, 0)`: decimal, `0x` hex or leading-`0` octal; no sign.
pub(crate) fn parse_uint(s: &str, max: u64) -> Option<u64> {
    let v = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if h.is_empty() || !h.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(h, 16).ok()?
    } else if s.len() > 1 && s.starts_with('0') {
        if !s.chars().all(|c| c.is_digit(8)) {
            return None;
        }
        u64::from_str_radix(&s[1..], 8).ok()?
    } else {
        if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()?
    };
    (v <= max).then_some(v)
}

/// A few well-known service names (iptables asks getservbyname; the engine reads no files).
pub(super) const SERVICES: &[(&str, u16)] = &[
    ("ftp-data", 20),
    ("ftp", 21),
    ("ssh", 22),
    ("telnet", 23),
    ("smtp", 25),
    ("domain", 53),
    ("http", 80),
    ("pop3", 110),
    ("ntp", 123),
    ("imap", 143),
    ("snmp", 161),
    ("https", 443),
    ("imaps", 993),
    ("pop3s", 995),
];

/// The port of a service name in [`SERVICES`] (`None` when it is not there).
pub(crate) fn service_port(name: &str) -> Option<u16> {
    SERVICES.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

pub(crate) fn parse_port(t: &Tok, s: &str, ctx: &Ctx<'_>) -> Result<u16, ParseError> {
    if let Some(v) = parse_uint(s, 65535) {
        return Ok(v as u16);
    }
    service_port(s).ok_or_else(|| {
        invalid(
            ctx,
            t,
            "port",
            format!("'{s}' is not a port number 0-65535"),
        )
    })
}

/// `a`, `a:b`, `:b`, `a:`, `:` (missing ends are 0 and `max`); `a > b` is an error.
pub(crate) fn parse_range(
    t: &Tok,
    ctx: &Ctx<'_>,
    what: &'static str,
    max: u64,
) -> Result<(u64, u64), ParseError> {
    let num = |s: &str| -> Result<u64, ParseError> {
        if what == "port" {
            return parse_port(t, s, ctx).map(u64::from);
        }
        parse_uint(s, max)
            .ok_or_else(|| invalid(ctx, t, what, format!("'{s}' is not a number 0-{max}")))
    };
    let (lo, hi) = match split_byte(t.text, b':') {
        None => {
            let v = num(t.text)?;
            (v, v)
        }
        Some((a, b)) => (
            if a.is_empty() { 0 } else { num(a)? },
            if b.is_empty() { max } else { num(b)? },
        ),
    };
    if lo > hi {
        return Err(invalid(ctx, t, what, "range start is above its end"));
    }
    Ok((lo, hi))
}

pub(crate) fn port_range(t: &Tok, ctx: &Ctx<'_>) -> Result<PortRange, ParseError> {
    let (lo, hi) = parse_range(t, ctx, "port", 65535)?;
    Ok(PortRange {
        lo: lo as u16,
        hi: hi as u16,
    })
}

/// A dotted-quad IPv4 address as `Ipv4Addr::from_str` reads it (four decimal octets of one
/// to three digits, no leading zero, at most 255 each), without its general parser; `None`
/// for anything else.
pub(crate) fn parse_ipv4(s: &str) -> Option<Ipv4Addr> {
    let b = s.as_bytes();
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (k, o) in octets.iter_mut().enumerate() {
        if k > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut v: u32 = 0;
        while let Some(&c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            if i - start == 3 {
                return None;
            }
            v = v * 10 + u32::from(c - b'0');
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || (digits > 1 && b[start] == b'0') || v > 255 {
            return None;
        }
        *o = v as u8;
    }
    (i == b.len()).then(|| Ipv4Addr::from(octets))
}

/// An IPv4 address as iptables' `__numeric_to_ipaddr` reads it: up to four dot-separated
/// parts, each a number 0-255 as `strtoul(s, 0)` reads it (so `010` is octal 8, `0x0a` is 10;
/// a leading `+` is allowed); an address (not a mask) with fewer parts is completed with zero
/// bytes (`-s 0` is `0.0.0.0`, `-s 10.1` is `10.1.0.0`).
pub(super) fn numeric_ipv4(s: &str, is_mask: bool) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut n = 0;
    for part in s.split('.') {
        let slot = octets.get_mut(n)?;
        let digits = part.strip_prefix('+').unwrap_or(part);
        *slot = parse_uint(digits, 255)? as u8;
        n += 1;
    }
    (!is_mask || n == 4).then(|| Ipv4Addr::from(octets))
}

pub(crate) fn parse_addr(
    t: &Tok,
    s: &str,
    family: Family,
    ctx: &Ctx<'_>,
) -> Result<IpAddr, ParseError> {
    parse_addr_or_mask(t, s, family, false, ctx)
}

pub(super) fn parse_addr_or_mask(
    t: &Tok,
    s: &str,
    family: Family,
    is_mask: bool,
    ctx: &Ctx<'_>,
) -> Result<IpAddr, ParseError> {
    match family {
        Family::Ipv4 => {
            // The fast path takes the plain dotted quads; iptables' own reading takes the rest.
            if let Some(a) = parse_ipv4(s).or_else(|| numeric_ipv4(s, is_mask)) {
                return Ok(IpAddr::V4(a));
            }
        }
        Family::Ipv6 => {
            if let Ok(a) = s.parse::<Ipv6Addr>() {
                return Ok(IpAddr::V6(a));
            }
        }
    }
    let hostname = !s.is_empty()
        && s.chars().any(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !(family == Family::Ipv6 && s.chars().all(|c| c.is_ascii_hexdigit()));
    if hostname {
        return Err(ctx.err(t, K::Hostname));
    }
    Err(invalid(
        ctx,
        t,
        "address",
        format!(
            "'{s}' is not an {} address",
            if family == Family::Ipv4 {
                "IPv4"
            } else {
                "IPv6"
            }
        ),
    ))
}

/// The common IPv4 forms of [`parse_net`], `A.B.C.D` and `A.B.C.D/LEN` with a LEN of one or
/// two digits up to 32, read in one pass with the result the general path gives; `None` sends
/// everything else (every error included) down the general path.
pub(crate) fn parse_ipv4_net(s: &str) -> Option<IpNet> {
    let (a, len) = match split_byte(s, b'/') {
        None => (s, 32),
        Some((a, m)) => {
            let len = match *m.as_bytes() {
                [d] if d.is_ascii_digit() => d - b'0',
                [d, e] if d.is_ascii_digit() && e.is_ascii_digit() => (d - b'0') * 10 + (e - b'0'),
                _ => return None,
            };
            (a, len)
        }
    };
    IpNet::new(IpAddr::V4(parse_ipv4(a)?), len)
}

/// `-s`/`-d` and conntrack addresses: `ADDR[/LEN|/MASK]`; the address is masked as iptables
/// stores it; a mask need not be contiguous. Comma lists (the line parser splits `-s`/`-d`
/// lists before) and hostnames are rejected.
pub(crate) fn parse_net(t: &Tok, family: Family, ctx: &Ctx<'_>) -> Result<IpNet, ParseError> {
    if family == Family::Ipv4 {
        if let Some(n) = parse_ipv4_net(t.text) {
            return Ok(n);
        }
    }
    if t.text.as_bytes().contains(&b',') {
        return Err(invalid(
            ctx,
            t,
            "address",
            "address lists are not supported, write one rule per address",
        ));
    }
    let (a, m) = match split_byte(t.text, b'/') {
        Some((a, m)) => (a, Some(m)),
        None => (t.as_str(), None),
    };
    let addr = parse_addr(t, a, family, ctx)?;
    let width: u8 = if family == Family::Ipv4 { 32 } else { 128 };
    let mask = match m {
        None => IpNet::new(addr, width).map(|n| n.mask),
        Some(m) if !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()) => m
            .parse::<u8>()
            .ok()
            .and_then(|len| IpNet::new(addr, len))
            .map(|n| n.mask),
        Some(m) => Some(parse_addr_or_mask(t, m, family, true, ctx)?),
    };
    let Some(mask) = mask else {
        return Err(invalid(ctx, t, "mask", "prefix length too long"));
    };
    let addr = match (addr, mask) {
        (IpAddr::V4(a), IpAddr::V4(m)) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & u32::from(m))),
        (IpAddr::V6(a), IpAddr::V6(m)) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & u128::from(m))),
        _ => return Err(invalid(ctx, t, "mask", "family mismatch")),
    };
    Ok(IpNet { addr, mask })
}

/// The protocol names of `/etc/protocols` as Debian's netbase 6.4 ships it (taken from IANA's
/// "Assigned Internet Protocol Numbers", <https://www.iana.org/assignments/protocol-numbers>),
/// official names only, in file order. iptables reads that file through `getprotobyname` /
/// `getprotobynumber`; the engine reads no files, so the table is built in. (`mptcp`, 262,
/// does not fit an IP header's protocol byte: see [`parse_protocol`].)
pub(super) const ETC_PROTOCOLS: &[(&str, u8)] = &[
    ("ip", 0),
    ("hopopt", 0),
    ("icmp", 1),
    ("igmp", 2),
    ("ggp", 3),
    ("ipencap", 4),
    ("st", 5),
    ("tcp", 6),
    ("egp", 8),
    ("igp", 9),
    ("pup", 12),
    ("udp", 17),
    ("hmp", 20),
    ("xns-idp", 22),
    ("rdp", 27),
    ("iso-tp4", 29),
    ("dccp", 33),
    ("xtp", 36),
    ("ddp", 37),
    ("idpr-cmtp", 38),
    ("ipv6", 41),
    ("ipv6-route", 43),
    ("ipv6-frag", 44),
    ("idrp", 45),
    ("rsvp", 46),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("skip", 57),
    ("ipv6-icmp", 58),
    ("ipv6-nonxt", 59),
    ("ipv6-opts", 60),
    ("rspf", 73),
    ("vmtp", 81),
    ("eigrp", 88),
    ("ospf", 89),
    ("ax.25", 93),
    ("ipip", 94),
    ("etherip", 97),
    ("encap", 98),
    ("pim", 103),
    ("ipcomp", 108),
    ("vrrp", 112),
    ("l2tp", 115),
    ("isis", 124),
    ("sctp", 132),
    ("fc", 133),
    ("mobility-header", 135),
    ("udplite", 136),
    ("mpls-in-ip", 137),
    ("manet", 138),
    ("hip", 139),
    ("shim6", 140),
    ("wesp", 141),
    ("rohc", 142),
    ("ethernet", 143),
];

/// The names iptables knows without `/etc/protocols` (`xtables_chain_protos`, iptables 1.8.9):
/// used for parsing, and for printing only numbers `/etc/protocols` has no name for.
pub(super) const CHAIN_PROTOS: &[(&str, u8)] = &[
    ("tcp", 6),
    ("sctp", 132),
    ("udp", 17),
    ("udplite", 136),
    ("icmp", 1),
    ("icmpv6", 58),
    ("ipv6-icmp", 58),
    ("esp", 50),
    ("ah", 51),
    ("mh", 135),
    ("all", 0),
];

/// The name iptables-save prints for a protocol number, if it has one: as iptables 1.8.9's
/// `proto_to_name`, the `/etc/protocols` name first (`-p 4` prints `-p ipencap`, `-p 135`
/// `-p mobility-header`), then `xtables_chain_protos`.
pub(crate) fn protocol_name(p: u8) -> Option<&'static str> {
    if p == 0 {
        return None;
    }
    ETC_PROTOCOLS
        .iter()
        .chain(CHAIN_PROTOS)
        .find(|(_, n)| *n == p)
        .map(|(s, _)| *s)
}

/// `-p`: as iptables' `xtables_parse_protocol`, the text lowercased, then a number 0..=255
/// (`strtoul` base 0), then an `/etc/protocols` name ([`ETC_PROTOCOLS`]), then a
/// [`CHAIN_PROTOS`] name. 0 (`all`, `ip`, `hopopt`) means any protocol.
pub(crate) fn parse_protocol(t: &Tok, ctx: &Ctx<'_>) -> Result<u8, ParseError> {
    if let Some(v) = parse_uint(t.text, 255) {
        return Ok(v as u8);
    }
    // Names are lowercase ASCII: comparing ignoring ASCII case is comparing the lowercased
    // text, without allocating it.
    if let Some((_, n)) = ETC_PROTOCOLS
        .iter()
        .chain(CHAIN_PROTOS)
        .find(|(name, _)| name.eq_ignore_ascii_case(t.text))
    {
        return Ok(*n);
    }
    if t.text.eq_ignore_ascii_case("mptcp") {
        return Err(invalid(
            ctx,
            t,
            "protocol",
            "mptcp is protocol 262, which no IP header can carry (the kernel stores it and never matches)",
        ));
    }
    Err(invalid(
        ctx,
        t,
        "protocol",
        "unknown protocol name (not in /etc/protocols) or number above 255",
    ))
}

/// The match `-p PROTO` loads implicitly for an unknown option.
pub(crate) fn proto_extension(p: u8) -> Option<&'static str> {
    Some(match p {
        6 => "tcp",
        17 => "udp",
        1 => "icmp",
        58 => "icmp6",
        132 => "sctp",
        33 => "dccp",
        136 => "udplite",
        135 => "mh",
        50 => "esp",
        51 => "ah",
        _ => return None,
    })
}

/// TCP flag names in iptables' print order.
pub(crate) const TCP_FLAG_NAMES: [(&str, u8); 6] = [
    ("FIN", 0x01),
    ("SYN", 0x02),
    ("RST", 0x04),
    ("PSH", 0x08),
    ("ACK", 0x10),
    ("URG", 0x20),
];

pub(super) fn tcp_flag_list(t: &Tok, ctx: &Ctx<'_>) -> Result<u8, ParseError> {
    let mut v = 0;
    for f in t.text.split(',') {
        let f = f.to_ascii_uppercase();
        v |= match f.as_str() {
            "ALL" => 0x3f,
            "NONE" => 0,
            _ => TCP_FLAG_NAMES
                .iter()
                .find(|(n, _)| *n == f)
                .map(|(_, b)| *b)
                .ok_or_else(|| invalid(ctx, t, "TCP flag", format!("unknown flag '{f}'")))?,
        };
    }
    Ok(v)
}

/// As libxt_multiport v1: up to 15 slots, a range `a:b` (a < b) takes two.
pub(super) fn multiport_list(t: &Tok, ctx: &Ctx<'_>) -> Result<Vec<PortRange>, ParseError> {
    let mut out = Vec::new();
    let mut slots = 0;
    for part in t.text.split(',') {
        let r = match part.split_once(':') {
            Some((a, b)) => {
                let lo = parse_port(t, a, ctx)?;
                let hi = parse_port(t, b, ctx)?;
                if lo >= hi {
                    return Err(invalid(ctx, t, "port range", "invalid portrange specified"));
                }
                slots += 2;
                PortRange { lo, hi }
            }
            None => {
                let p = parse_port(t, part, ctx)?;
                slots += 1;
                PortRange { lo: p, hi: p }
            }
        };
        out.push(r);
    }
    if slots > 15 {
        return Err(invalid(
            ctx,
            t,
            "port list",
            "too many ports specified (15 slots, a range takes 2)",
        ));
    }
    Ok(out)
}

/// ICMP type names (iptables' icmp_codes): name, type, code range.
pub(crate) const ICMP_NAMES: &[(&str, u8, u8, u8)] = &[
    ("any", 255, 0, 255),
    ("echo-reply", 0, 0, 255),
    ("destination-unreachable", 3, 0, 255),
    ("network-unreachable", 3, 0, 0),
    ("host-unreachable", 3, 1, 1),
    ("protocol-unreachable", 3, 2, 2),
    ("port-unreachable", 3, 3, 3),
    ("fragmentation-needed", 3, 4, 4),
    ("source-route-failed", 3, 5, 5),
    ("network-unknown", 3, 6, 6),
    ("host-unknown", 3, 7, 7),
    ("network-prohibited", 3, 9, 9),
    ("host-prohibited", 3, 10, 10),
    ("TOS-network-unreachable", 3, 11, 11),
    ("TOS-host-unreachable", 3, 12, 12),
    ("communication-prohibited", 3, 13, 13),
    ("host-precedence-violation", 3, 14, 14),
    ("precedence-cutoff", 3, 15, 15),
    ("source-quench", 4, 0, 255),
    ("redirect", 5, 0, 255),
    ("network-redirect", 5, 0, 0),
    ("host-redirect", 5, 1, 1),
    ("TOS-network-redirect", 5, 2, 2),
    ("TOS-host-redirect", 5, 3, 3),
    ("echo-request", 8, 0, 255),
    ("ping", 8, 0, 255),
    ("router-advertisement", 9, 0, 255),
    ("router-solicitation", 10, 0, 255),
    ("time-exceeded", 11, 0, 255),
    ("ttl-exceeded", 11, 0, 255),
    ("ttl-zero-during-transit", 11, 0, 0),
    ("ttl-zero-during-reassembly", 11, 1, 1),
    ("parameter-problem", 12, 0, 255),
    ("ip-header-bad", 12, 0, 0),
    ("required-option-missing", 12, 1, 1),
    ("timestamp-request", 13, 0, 255),
    ("timestamp-reply", 14, 0, 255),
    ("address-mask-request", 17, 0, 255),
    ("address-mask-reply", 18, 0, 255),
];

/// ICMPv6 type names (ip6tables' icmpv6_codes).
pub(crate) const ICMPV6_NAMES: &[(&str, u8, u8, u8)] = &[
    ("destination-unreachable", 1, 0, 255),
    ("no-route", 1, 0, 0),
    ("communication-prohibited", 1, 1, 1),
    ("beyond-scope", 1, 2, 2),
    ("address-unreachable", 1, 3, 3),
    ("port-unreachable", 1, 4, 4),
    ("failed-policy", 1, 5, 5),
    ("reject-route", 1, 6, 6),
    ("packet-too-big", 2, 0, 255),
    ("time-exceeded", 3, 0, 255),
    ("ttl-exceeded", 3, 0, 255),
    ("ttl-zero-during-transit", 3, 0, 0),
    ("ttl-zero-during-reassembly", 3, 1, 1),
    ("parameter-problem", 4, 0, 255),
    ("bad-header", 4, 0, 0),
    ("unknown-header-type", 4, 1, 1),
    ("unknown-option", 4, 2, 2),
    ("echo-request", 128, 0, 255),
    ("ping", 128, 0, 255),
    ("echo-reply", 129, 0, 255),
    ("pong", 129, 0, 255),
    ("mld-listener-query", 130, 0, 255),
    ("mld-listener-report", 131, 0, 255),
    ("mld-listener-done", 132, 0, 255),
    ("mld-listener-reduction", 132, 0, 255),
    ("router-solicitation", 133, 0, 255),
    ("router-advertisement", 134, 0, 255),
    ("neighbour-solicitation", 135, 0, 255),
    ("neighbor-solicitation", 135, 0, 255),
    ("neighbour-advertisement", 136, 0, 255),
    ("neighbor-advertisement", 136, 0, 255),
    ("redirect", 137, 0, 255),
];

/// `NAME`, `TYPE`, `TYPE/CODE` or `TYPE/LO:HI`. IPv4 type 255 with every code is `any`.
pub(super) fn parse_icmp(t: &Tok, v6: bool, ctx: &Ctx<'_>) -> Result<IcmpMatch, ParseError> {
    let names = if v6 { ICMPV6_NAMES } else { ICMP_NAMES };
    let (ty, code) = if let Some((_, ty, lo, hi)) = names.iter().find(|(n, ..)| *n == t.text) {
        (*ty, (*lo, *hi))
    } else {
        let bad = || {
            invalid(
                ctx,
                t,
                "ICMP type",
                "unknown name, or not TYPE[/CODE] with numbers 0-255",
            )
        };
        let (ty, code) = match t.text.split_once('/') {
            Some((a, c)) => (a, Some(c)),
            None => (t.as_str(), None),
        };
        let ty = parse_uint(ty, 255).ok_or_else(bad)? as u8;
        let code = match code {
            None => (0, 255),
            Some(c) => match c.split_once(':') {
                Some((lo, hi)) => {
                    let lo = parse_uint(lo, 255).ok_or_else(bad)? as u8;
                    let hi = parse_uint(hi, 255).ok_or_else(bad)? as u8;
                    if lo > hi {
                        return Err(bad());
                    }
                    (lo, hi)
                }
                None => {
                    let c = parse_uint(c, 255).ok_or_else(bad)? as u8;
                    (c, c)
                }
            },
        };
        (ty, code)
    };
    let icmp_type = (v6 || ty != 255 || code != (0, 255)).then_some(ty);
    Ok(IcmpMatch {
        negated: false,
        icmp_type,
        code,
    })
}

/// Conntrack state names in iptables' print order (libxt_conntrack / libxt_state).
pub(crate) const CT_STATE_NAMES: [(&str, u8); 7] = [
    ("INVALID", ct_state::INVALID),
    ("NEW", ct_state::NEW),
    ("RELATED", ct_state::RELATED),
    ("ESTABLISHED", ct_state::ESTABLISHED),
    ("UNTRACKED", ct_state::UNTRACKED),
    ("SNAT", ct_state::SNAT),
    ("DNAT", ct_state::DNAT),
];

pub(super) fn parse_states(t: &Tok, conntrack: bool, ctx: &Ctx<'_>) -> Result<u8, ParseError> {
    let mut v = 0;
    for s in t.text.split(',') {
        let bit = CT_STATE_NAMES
            .iter()
            .filter(|(n, _)| conntrack || !matches!(*n, "SNAT" | "DNAT"))
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|(_, b)| *b)
            .ok_or_else(|| invalid(ctx, t, "state", format!("bad state '{s}'")))?;
        v |= bit;
    }
    Ok(v)
}

/// Conntrack status names in print order with their IPS_* bits.
pub(super) const CT_STATUS_NAMES: [(&str, u32); 4] = [
    ("EXPECTED", 1),
    ("SEEN_REPLY", 2),
    ("ASSURED", 4),
    ("CONFIRMED", 8),
];

pub(super) fn parse_mark(t: &Tok, ctx: &Ctx<'_>) -> Result<MarkValue, ParseError> {
    let bad = || invalid(ctx, t, "mark", "expected VALUE[/MASK], 32-bit numbers");
    let (v, m) = match t.text.split_once('/') {
        Some((v, m)) => (v, Some(m)),
        None => (t.as_str(), None),
    };
    let value = parse_uint(v, u64::from(u32::MAX)).ok_or_else(bad)? as u32;
    let mask = match m {
        Some(m) => parse_uint(m, u64::from(u32::MAX)).ok_or_else(bad)? as u32,
        None => u32::MAX,
    };
    Ok(MarkValue { value, mask })
}

/// Rate units as libxt_limit: name, ticks per unit at XT_LIMIT_SCALE (10000 per second).
pub(super) const RATES: [(&str, RateUnit, u64); 4] = [
    ("day", RateUnit::Day, 10000 * 86400),
    ("hour", RateUnit::Hour, 10000 * 3600),
    ("min", RateUnit::Minute, 10000 * 60),
    ("sec", RateUnit::Second, 10000),
];

/// The printed name of a rate unit.
pub(crate) fn rate_unit_name(u: RateUnit) -> &'static str {
    RATES
        .iter()
        .find(|r| r.1 == u)
        .map(|r| r.0)
        .unwrap_or("sec")
}

/// `N[/second|minute|hour|day]` (unit prefixes allowed) as libxt_limit's parse_rate, then
/// canonicalized as its print_rate would print it (so `60/min` becomes `1/sec`).
pub(super) fn parse_rate(t: &Tok, ctx: &Ctx<'_>) -> Result<(u32, RateUnit), ParseError> {
    let bad = |r: &str| invalid(ctx, t, "rate", r.to_string());
    let (n, unit) = match t.text.split_once('/') {
        Some((n, u)) => (n, Some(u)),
        None => (t.as_str(), None),
    };
    let mult = match unit {
        None => 10000,
        Some(u) => {
            let full = [
                ("second", 10000),
                ("minute", 600_000),
                ("hour", 36_000_000),
                ("day", 864_000_000),
            ];
            full.iter()
                .find(|(name, _)| !u.is_empty() && name.starts_with(&u.to_ascii_lowercase()))
                .map(|(_, m)| *m)
                .ok_or_else(|| bad("unit must be second, minute, hour or day"))?
        }
    };
    let r = parse_uint(n, u64::from(u32::MAX)).ok_or_else(|| bad("not a number"))?;
    if r == 0 {
        return Err(bad("rate must be above 0"));
    }
    if r > mult {
        return Err(bad("rate too fast"));
    }
    let period = mult / r;
    // print_rate: the largest unit that divides well.
    let mut i = 1;
    while i < RATES.len() {
        let m = RATES[i].2;
        if period > m || m / period < m % period {
            break;
        }
        i += 1;
    }
    let (_, unit, m) = RATES[i - 1];
    Ok(((m / period) as u32, unit))
}

pub(super) fn parse_mac(t: &Tok, ctx: &Ctx<'_>) -> Result<[u8; 6], ParseError> {
    let bad = || invalid(ctx, t, "MAC address", "expected XX:XX:XX:XX:XX:XX");
    let parts: Vec<&str> = t.text.split(':').collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || p.len() > 2 {
            return Err(bad());
        }
        mac[i] = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TableKind;

    /// Strings at the edges of the dotted-quad grammar.
    const ODD_V4: &[&str] = &[
        "0.0.0.0",
        "255.255.255.255",
        "1.2.3.4",
        "10.0.0.1",
        "01.2.3.4",
        "1.2.3.04",
        "1.2.3.00",
        "00.0.0.0",
        "1.2.3.256",
        "1.2.3.999",
        "1.2.3.1000",
        "1.2.3",
        "1.2.3.4.5",
        "1..2.3",
        ".1.2.3",
        "1.2.3.",
        "+1.2.3.4",
        "1.2.3.-4",
        " 1.2.3.4",
        "1.2.3.4 ",
        "",
        "1.2.3.4/8",
        "a.b.c.d",
        "0x1.2.3.4",
        "１.2.3.4",
        "1.2.3.4\0",
    ];

    #[test]
    fn fast_ipv4_takes_exactly_what_std_takes() {
        for s in ODD_V4 {
            assert_eq!(parse_ipv4(s), s.parse::<Ipv4Addr>().ok(), "{s:?}");
        }
        // Every one-octet value, with and without leading zeros.
        for v in 0..=1000u32 {
            for s in [
                format!("1.2.3.{v}"),
                format!("1.2.3.{v:03}"),
                format!("{v}.0.0.1"),
            ] {
                assert_eq!(parse_ipv4(&s), s.parse::<Ipv4Addr>().ok(), "{s:?}");
            }
        }
    }

    fn ctx() -> Ctx<'static> {
        Ctx {
            family: Family::Ipv4,
            table: TableKind::Filter,
            line: 1,
            set_exists: None,
            resolve_owner: None,
        }
    }

    /// `parse_net` as it was before the fast path: the general path only.
    fn general(s: &str) -> Result<IpNet, ParseError> {
        let t = Tok { text: s, column: 7 };
        let ctx = ctx();
        let (a, m) = match s.split_once('/') {
            Some((a, m)) => (a, Some(m)),
            None => (s, None),
        };
        if s.contains(',') {
            return Err(invalid(&ctx, &t, "address", "lists"));
        }
        let addr = parse_addr(&t, a, Family::Ipv4, &ctx)?;
        let mask = match m {
            None => IpNet::new(addr, 32).map(|n| n.mask),
            Some(m) if !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()) => m
                .parse::<u8>()
                .ok()
                .and_then(|len| IpNet::new(addr, len))
                .map(|n| n.mask),
            Some(m) => Some(parse_addr_or_mask(&t, m, Family::Ipv4, true, &ctx)?),
        };
        let Some(IpAddr::V4(mask)) = mask else {
            return Err(invalid(&ctx, &t, "mask", "prefix length too long"));
        };
        let IpAddr::V4(a) = addr else {
            unreachable!("an IPv4 parse")
        };
        Ok(IpNet {
            addr: IpAddr::V4(Ipv4Addr::from(u32::from(a) & u32::from(mask))),
            mask: IpAddr::V4(mask),
        })
    }

    #[test]
    fn fast_ipv4_prefixes_agree_with_the_general_path() {
        let mut cases: Vec<String> = ODD_V4.iter().map(|s| s.to_string()).collect();
        for len in [
            "0",
            "00",
            "8",
            "08",
            "24",
            "31",
            "32",
            "032",
            "33",
            "99",
            "100",
            "256",
            "",
            "+8",
            "-1",
            "8 ",
            "255.0.255.0",
            "255.255.255.0",
            "0.0.0.0",
            "1.2.3",
        ] {
            cases.push(format!("10.1.2.3/{len}"));
            cases.push(format!("0.0.0.0/{len}"));
        }
        cases.push("1.2.3.4/8/8".into());
        cases.push("1.2.3.4,5.6.7.8".into());
        let ctx = ctx();
        for s in &cases {
            let t = Tok { text: s, column: 7 };
            let got = parse_net(&t, Family::Ipv4, &ctx);
            match general(s) {
                Ok(n) => assert_eq!(got, Ok(n), "{s:?}"),
                // Errors come from the general path itself (same kind, message and column).
                Err(_) => assert!(parse_ipv4_net(s).is_none(), "{s:?}"),
            }
        }
        let net = |s: &str| parse_net(&Tok { text: s, column: 1 }, Family::Ipv4, &ctx);
        assert_eq!(
            net("10.1.2.3/8").map(|n| n.addr.to_string()),
            Ok("10.0.0.0".into())
        );
        assert_eq!(net("10.1.2.3/0").map(|n| n.prefix_len()), Ok(Some(0)));
        assert_eq!(net("10.1.2.3").map(|n| n.prefix_len()), Ok(Some(32)));
        let odd = net("10.1.2.3/255.0.255.0").expect("a non-contiguous mask parses");
        assert_eq!(odd.prefix_len(), None);
        assert_eq!(odd.addr.to_string(), "10.0.2.0");
        // As iptables (strtoul base 0 per part, missing parts zero): checked with the kernel.
        let v4 = |s: &str| net(s).map(|n| (n.addr.to_string(), n.prefix_len()));
        assert_eq!(v4("01.2.3.4/8"), Ok(("1.0.0.0".into(), Some(8))));
        assert_eq!(v4("010.0.0.1"), Ok(("8.0.0.1".into(), Some(32))));
        assert_eq!(v4("0x0a.1.2.3"), Ok(("10.1.2.3".into(), Some(32))));
        assert_eq!(v4("0"), Ok(("0.0.0.0".into(), Some(32))));
        assert_eq!(v4("0/0"), Ok(("0.0.0.0".into(), Some(0))));
        assert_eq!(v4("10.1/8"), Ok(("10.0.0.0".into(), Some(8))));
        for bad in ["10.", "1.2.3.4.5", "1.2.3.256", "10.1.2.3/255.0", "1..2"] {
            let e = net(bad).expect_err(bad);
            assert_eq!(e.location.column, 1);
        }
        let e = net("1.2.3.4/33").expect_err("too long");
        assert!(e.to_string().contains("prefix length too long"), "{e}");
    }

    #[test]
    fn protocol_names_ignore_ascii_case_only() {
        let ctx = ctx();
        for s in [
            "tcp",
            "TCP",
            "Tcp",
            "uDp",
            "IPV6-ICMP",
            "icmpv6",
            "all",
            "ALL",
            "6",
            "0x11",
            "017",
            "256",
            "tcpx",
            "tc",
            "",
            "\u{131}cmp",
            "ＴＣＰ",
            "TCP\u{301}",
        ] {
            let t = Tok { text: s, column: 3 };
            // The rule before: lowercase the text, then compare.
            let lower = s.to_ascii_lowercase();
            let want = ETC_PROTOCOLS
                .iter()
                .chain(CHAIN_PROTOS)
                .find(|(name, _)| *name == lower)
                .map(|(_, n)| *n)
                .or_else(|| parse_uint(s, 255).map(|v| v as u8));
            assert_eq!(parse_protocol(&t, &ctx).ok(), want, "{s:?}");
        }
    }

    #[test]
    fn ipv6_is_unchanged() {
        let v6 = Ctx {
            family: Family::Ipv6,
            ..ctx()
        };
        let net = |s: &str| parse_net(&Tok { text: s, column: 1 }, Family::Ipv6, &v6);
        let n = net("2001:db8::1/32").expect("parses");
        assert_eq!(n.addr.to_string(), "2001:db8::");
        assert_eq!(n.prefix_len(), Some(32));
        assert!(net("1.2.3.4").is_err());
        assert_eq!(net("::1").map(|n| n.prefix_len()), Ok(Some(128)));
    }
}
