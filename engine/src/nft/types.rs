//! nft datatypes: how a value is read for an expression and how nft lists it.
//!
//! Each [`DataType`] has the symbol table nft v1.1.6 uses (`icmp_type`: `echo-request` is 8),
//! a width, and a canonical listing: addresses dotted or RFC 5952, marks as `0x%08x`,
//! protocols and ports as numbers, ICMP types/codes, ct states and flags by name (flags joined
//! with `,` in bit order), interface names quoted. Address ranges that are exactly a prefix are
//! listed as the prefix (`192.168.3.0-192.168.3.255` is `192.168.3.0/24`), as nft does.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{Elem, Value};

/// A datatype of nft values (the subset the modelled expressions use).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ipv4_addr`.
    Ipv4Addr,
    /// `ipv6_addr`.
    Ipv6Addr,
    /// `inet_proto` (listed as a number).
    InetProto,
    /// `inet_service`: a port (listed as a number).
    InetService,
    /// `icmp_type`.
    IcmpType,
    /// `icmpv6_type`.
    Icmpv6Type,
    /// `icmp_code`.
    IcmpCode,
    /// `icmpv6_code`.
    Icmpv6Code,
    /// `icmpx_code`.
    IcmpxCode,
    /// `ct_state` (flags).
    CtState,
    /// `ct_status` (flags).
    CtStatus,
    /// `ct_dir`.
    CtDir,
    /// `mark`.
    Mark,
    /// `ifname`: an interface name (a string of up to 15 bytes, `*` wildcard at the end).
    IfName,
    /// `iface_index`: an interface, written and listed by name.
    IfIndex,
    /// `nf_proto`.
    NfProto,
    /// `pkttype`.
    PktType,
    /// `fib_addrtype`.
    FibAddrType,
    /// `tcp_flag` (flags).
    TcpFlag,
    /// `dscp`.
    Dscp,
    /// `boolean` (`exists`/`missing`, for `fib ... oif`).
    Boolean,
    /// `uid` (listed as a number).
    Uid,
    /// `gid` (listed as a number).
    Gid,
    /// `integer` of the given width in bits.
    Integer(u8),
}

type Sym = (&'static str, u128);

const INET_PROTO: &[Sym] = &[
    ("icmp", 1),
    ("igmp", 2),
    ("ipip", 4),
    ("tcp", 6),
    ("egp", 8),
    ("udp", 17),
    ("dccp", 33),
    ("ipv6", 41),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("ipv6-icmp", 58),
    ("icmpv6", 58),
    ("comp", 108),
    ("sctp", 132),
    ("udplite", 136),
];
const SERVICES: &[Sym] = &[
    ("ftp-data", 20),
    ("ftp", 21),
    ("ssh", 22),
    ("telnet", 23),
    ("smtp", 25),
    ("domain", 53),
    ("bootps", 67),
    ("bootpc", 68),
    ("tftp", 69),
    ("http", 80),
    ("pop3", 110),
    ("ntp", 123),
    ("imap", 143),
    ("snmp", 161),
    ("bgp", 179),
    ("https", 443),
    ("submission", 587),
    ("imaps", 993),
    ("pop3s", 995),
];
const ICMP_TYPE: &[Sym] = &[
    ("echo-reply", 0),
    ("destination-unreachable", 3),
    ("source-quench", 4),
    ("redirect", 5),
    ("echo-request", 8),
    ("router-advertisement", 9),
    ("router-solicitation", 10),
    ("time-exceeded", 11),
    ("parameter-problem", 12),
    ("timestamp-request", 13),
    ("timestamp-reply", 14),
    ("info-request", 15),
    ("info-reply", 16),
    ("address-mask-request", 17),
    ("address-mask-reply", 18),
];
const ICMPV6_TYPE: &[Sym] = &[
    ("destination-unreachable", 1),
    ("packet-too-big", 2),
    ("time-exceeded", 3),
    ("parameter-problem", 4),
    ("echo-request", 128),
    ("echo-reply", 129),
    ("mld-listener-query", 130),
    ("mld-listener-report", 131),
    ("mld-listener-done", 132),
    ("mld-listener-reduction", 132),
    ("nd-router-solicit", 133),
    ("nd-router-advert", 134),
    ("nd-neighbor-solicit", 135),
    ("nd-neighbor-advert", 136),
    ("nd-redirect", 137),
    ("router-renumbering", 138),
    ("ind-neighbor-solicit", 141),
    ("ind-neighbor-advert", 142),
    ("mld2-listener-report", 143),
];
const ICMP_CODE: &[Sym] = &[
    ("net-unreachable", 0),
    ("host-unreachable", 1),
    ("prot-unreachable", 2),
    ("port-unreachable", 3),
    ("frag-needed", 4),
    ("net-prohibited", 9),
    ("host-prohibited", 10),
    ("admin-prohibited", 13),
];
const ICMPV6_CODE: &[Sym] = &[
    ("no-route", 0),
    ("admin-prohibited", 1),
    ("addr-unreachable", 3),
    ("port-unreachable", 4),
    ("policy-fail", 5),
    ("reject-route", 6),
];
const ICMPX_CODE: &[Sym] = &[
    ("no-route", 0),
    ("port-unreachable", 1),
    ("host-unreachable", 2),
    ("admin-prohibited", 3),
];
const CT_STATE: &[Sym] = &[
    ("invalid", 1),
    ("established", 2),
    ("related", 4),
    ("new", 8),
    ("untracked", 64),
];
const CT_STATUS: &[Sym] = &[
    ("expected", 1),
    ("seen-reply", 2),
    ("assured", 4),
    ("confirmed", 8),
    ("snat", 16),
    ("dnat", 32),
    ("dying", 512),
];
const CT_DIR: &[Sym] = &[("original", 0), ("reply", 1)];
const NF_PROTO: &[Sym] = &[("ipv4", 2), ("ipv6", 10)];
const PKTTYPE: &[Sym] = &[
    ("host", 0),
    ("unicast", 0),
    ("broadcast", 1),
    ("multicast", 2),
    ("other", 3),
];
const FIB_ADDRTYPE: &[Sym] = &[
    ("unspec", 0),
    ("unicast", 1),
    ("local", 2),
    ("broadcast", 3),
    ("anycast", 4),
    ("multicast", 5),
    ("blackhole", 6),
    ("unreachable", 7),
    ("prohibit", 8),
];
const TCP_FLAG: &[Sym] = &[
    ("fin", 1),
    ("syn", 2),
    ("rst", 4),
    ("psh", 8),
    ("ack", 16),
    ("urg", 32),
    ("ecn", 64),
    ("cwr", 128),
];
const DSCP: &[Sym] = &[
    ("cs0", 0),
    ("cs1", 8),
    ("af11", 10),
    ("af12", 12),
    ("af13", 14),
    ("cs2", 16),
    ("af21", 18),
    ("af22", 20),
    ("af23", 22),
    ("cs3", 24),
    ("af31", 26),
    ("af32", 28),
    ("af33", 30),
    ("cs4", 32),
    ("af41", 34),
    ("af42", 36),
    ("af43", 38),
    ("cs5", 40),
    ("ef", 46),
    ("cs6", 48),
    ("cs7", 56),
];
const BOOLEAN: &[Sym] = &[("missing", 0), ("exists", 1), ("false", 0), ("true", 1)];

const NAMED: &[(&str, DataType)] = &[
    ("ipv4_addr", DataType::Ipv4Addr),
    ("ipv6_addr", DataType::Ipv6Addr),
    ("inet_proto", DataType::InetProto),
    ("inet_service", DataType::InetService),
    ("icmp_type", DataType::IcmpType),
    ("icmpv6_type", DataType::Icmpv6Type),
    ("icmp_code", DataType::IcmpCode),
    ("icmpv6_code", DataType::Icmpv6Code),
    ("icmpx_code", DataType::IcmpxCode),
    ("ct_state", DataType::CtState),
    ("ct_status", DataType::CtStatus),
    ("ct_dir", DataType::CtDir),
    ("mark", DataType::Mark),
    ("ifname", DataType::IfName),
    ("iface_index", DataType::IfIndex),
    ("nf_proto", DataType::NfProto),
    ("pkttype", DataType::PktType),
    ("fib_addrtype", DataType::FibAddrType),
    ("tcp_flag", DataType::TcpFlag),
    ("dscp", DataType::Dscp),
    ("boolean", DataType::Boolean),
    ("uid", DataType::Uid),
    ("gid", DataType::Gid),
];

// === impl DataType ===

impl DataType {
    /// The datatype named `name` in a set's `type` line.
    pub fn from_name(name: &str) -> Option<DataType> {
        NAMED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
    }

    /// nft's name of the type (`integer` for all integer widths).
    pub fn name(self) -> &'static str {
        NAMED
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("integer", |(n, _)| n)
    }

    /// Width in bits.
    pub fn bits(self) -> u32 {
        match self {
            DataType::Ipv4Addr => 32,
            DataType::Ipv6Addr => 128,
            DataType::InetService => 16,
            DataType::CtState
            | DataType::CtStatus
            | DataType::Mark
            | DataType::FibAddrType
            | DataType::Uid
            | DataType::Gid
            | DataType::IfIndex => 32,
            DataType::Dscp => 6,
            DataType::Boolean => 1,
            DataType::IfName => 128,
            DataType::Integer(b) => u32::from(b),
            _ => 8,
        }
    }

    fn symbols(self) -> &'static [Sym] {
        match self {
            DataType::InetProto => INET_PROTO,
            DataType::InetService => SERVICES,
            DataType::IcmpType => ICMP_TYPE,
            DataType::Icmpv6Type => ICMPV6_TYPE,
            DataType::IcmpCode => ICMP_CODE,
            DataType::Icmpv6Code => ICMPV6_CODE,
            DataType::IcmpxCode => ICMPX_CODE,
            DataType::CtState => CT_STATE,
            DataType::CtStatus => CT_STATUS,
            DataType::CtDir => CT_DIR,
            DataType::NfProto => NF_PROTO,
            DataType::PktType => PKTTYPE,
            DataType::FibAddrType => FIB_ADDRTYPE,
            DataType::TcpFlag => TCP_FLAG,
            DataType::Dscp => DSCP,
            DataType::Boolean => BOOLEAN,
            _ => &[],
        }
    }

    /// A flag type: values combine with `,` (`established,related`).
    pub fn is_flags(self) -> bool {
        matches!(
            self,
            DataType::CtState | DataType::CtStatus | DataType::TcpFlag
        )
    }

    /// Listed by symbol when one exists (inet_proto and inet_service are listed numerically).
    fn prints_symbol(self) -> bool {
        !matches!(self, DataType::InetProto | DataType::InetService)
    }

    /// An address type: ranges that are exactly a prefix are listed as the prefix.
    pub fn is_addr(self) -> bool {
        matches!(self, DataType::Ipv4Addr | DataType::Ipv6Addr)
    }

    /// A string type (interface names).
    pub fn is_string(self) -> bool {
        matches!(self, DataType::IfName | DataType::IfIndex)
    }

    fn max(self) -> u128 {
        let b = self.bits();
        if b >= 128 {
            u128::MAX
        } else {
            (1u128 << b) - 1
        }
    }

    /// Reads one value: a symbol, a number (decimal or 0x hex) or an address; a string type
    /// takes a quoted string or a bare word.
    pub fn parse_value(self, word: &str, quoted: bool) -> Option<Value> {
        if self.is_string() {
            return (!word.is_empty() && word.len() < 16).then(|| Value::Str(word.to_string()));
        }
        if quoted {
            return None;
        }
        match self {
            DataType::Ipv4Addr => word
                .parse::<Ipv4Addr>()
                .ok()
                .map(|a| Value::Num(u128::from(u32::from(a)))),
            DataType::Ipv6Addr => word
                .parse::<Ipv6Addr>()
                .ok()
                .map(|a| Value::Num(u128::from(a))),
            _ => {
                if let Some((_, v)) = self.symbols().iter().find(|(n, _)| *n == word) {
                    return Some(Value::Num(*v));
                }
                let n = if let Some(hex) = word.strip_prefix("0x") {
                    u128::from_str_radix(hex, 16).ok()?
                } else if word.bytes().all(|b| b.is_ascii_digit()) && !word.is_empty() {
                    word.parse::<u128>().ok()?
                } else {
                    return None;
                };
                (n <= self.max()).then_some(Value::Num(n))
            }
        }
    }

    /// Reads a value, a prefix (`ADDR/LEN`, addresses and marks) or a range (`LOW-HIGH`).
    pub fn parse_elem(self, word: &str, quoted: bool) -> Option<Elem> {
        if let Some(v) = self.parse_value(word, quoted) {
            return Some(Elem::Value(v));
        }
        if quoted {
            return None;
        }
        if let Some((addr, len)) = word.split_once('/') {
            if !self.is_addr() {
                return None;
            }
            let Value::Num(a) = self.parse_value(addr, false)? else {
                return None;
            };
            let len: u8 = len.parse().ok()?;
            if u32::from(len) > self.bits() {
                return None;
            }
            return Some(prefix_elem(self, a, len));
        }
        // A range: the first `-` whose both sides are values (names contain `-` too).
        for (i, _) in word.match_indices('-') {
            let (lo, hi) = (&word[..i], &word[i + 1..]);
            if let (Some(lo), Some(hi)) = (self.parse_value(lo, false), self.parse_value(hi, false))
            {
                if lo > hi {
                    return None;
                }
                return Some(Elem::Range(lo, hi));
            }
        }
        None
    }

    /// Appends the canonical listing of `v` (nft v1.1: protocols as numbers).
    pub fn print_value(self, v: &Value, out: &mut String) {
        self.print_value_as(v, false, out);
    }

    /// As [`DataType::print_value`]; `proto_names`: protocols by name, as nft v1.0 lists them.
    pub(crate) fn print_value_as(self, v: &Value, proto_names: bool, out: &mut String) {
        let n = match v {
            Value::Str(s) => {
                out.push('"');
                out.push_str(s);
                out.push('"');
                return;
            }
            Value::Num(n) => *n,
        };
        match self {
            DataType::Ipv4Addr => out.push_str(&Ipv4Addr::from(n as u32).to_string()),
            DataType::Ipv6Addr => print_ipv6(n, out),
            DataType::Mark => out.push_str(&format!("0x{n:08x}")),
            t if t.is_flags() => {
                let mut rest = n;
                let mut first = true;
                for (name, bit) in t.symbols() {
                    if rest & bit != 0 {
                        if !first {
                            out.push(',');
                        }
                        out.push_str(name);
                        first = false;
                        rest &= !bit;
                    }
                }
                if rest != 0 || first {
                    if !first {
                        out.push(',');
                    }
                    out.push_str(&format!("0x{rest:x}"));
                }
            }
            t => match t.symbols().iter().find(|(_, v)| *v == n) {
                Some((name, _))
                    if t.prints_symbol() || (proto_names && t == DataType::InetProto) =>
                {
                    out.push_str(name)
                }
                _ if t == DataType::Dscp => out.push_str(&format!("0x{n:02x}")),
                _ => out.push_str(&n.to_string()),
            },
        }
    }

    /// Appends the canonical listing of `e` (of this type; concatenations use `types`).
    /// `in_set`: an element of a set or a nat range, where nft lists an address range that is
    /// exactly a prefix as the prefix (a match's own range is listed as written).
    pub fn print_elem(self, e: &Elem, in_set: bool, out: &mut String) {
        self.print_elem_as(e, in_set, false, out);
    }

    /// As [`DataType::print_elem`]; `proto_names` as in [`DataType::print_value_as`].
    pub(crate) fn print_elem_as(self, e: &Elem, in_set: bool, proto_names: bool, out: &mut String) {
        match e {
            Elem::Value(v) => self.print_value_as(v, proto_names, out),
            Elem::Prefix(a, len) => {
                self.print_value_as(&Value::Num(*a), proto_names, out);
                if u32::from(*len) != self.bits() {
                    out.push('/');
                    out.push_str(&len.to_string());
                }
            }
            Elem::Range(lo, hi) => {
                if let (true, Value::Num(l), Value::Num(h)) = (in_set && self.is_addr(), lo, hi) {
                    if let Some(len) = range_prefix(self.bits(), *l, *h) {
                        return self.print_elem_as(
                            &Elem::Prefix(*l, len),
                            in_set,
                            proto_names,
                            out,
                        );
                    }
                }
                self.print_value_as(lo, proto_names, out);
                out.push('-');
                self.print_value_as(hi, proto_names, out);
            }
            Elem::Concat(_) => out.push_str("<concat>"),
        }
    }
}

/// An IPv6 address as glibc's `inet_ntop` writes it (RFC 5952, plus the IPv4-compatible
/// form `::a.b.c.d` when the first 96 bits are zero and the seventh group is not).
fn print_ipv6(n: u128, out: &mut String) {
    if n >> 32 == 0 && (n >> 16) & 0xffff != 0 {
        out.push_str("::");
        out.push_str(&Ipv4Addr::from(n as u32).to_string());
    } else {
        out.push_str(&Ipv6Addr::from(n).to_string());
    }
}

/// A prefix element; a full-length prefix is the address itself.
pub(crate) fn prefix_elem(t: DataType, a: u128, len: u8) -> Elem {
    let bits = t.bits();
    if u32::from(len) == bits {
        return Elem::Value(Value::Num(a));
    }
    let host = if len == 0 {
        u128::MAX
    } else {
        (1u128 << (bits - u32::from(len))) - 1
    };
    Elem::Prefix(a & !host, len)
}

/// The prefix length when `lo-hi` is exactly one prefix of a `bits`-wide type.
fn range_prefix(bits: u32, lo: u128, hi: u128) -> Option<u8> {
    let span = hi.checked_sub(lo)?;
    if span == u128::MAX {
        return (bits == 128 && lo == 0).then_some(0);
    }
    let size = span + 1;
    if !size.is_power_of_two() || lo & span != 0 {
        return None;
    }
    let host_bits = size.trailing_zeros();
    (host_bits > 0 && host_bits <= bits).then(|| (bits - host_bits) as u8)
}

/// The lowest value of an element (the sort key nft lists set elements by).
pub(crate) fn sort_key(e: &Elem) -> Vec<Value> {
    match e {
        Elem::Value(v) | Elem::Range(v, _) => vec![v.clone()],
        Elem::Prefix(a, _) => vec![Value::Num(*a)],
        Elem::Concat(parts) => parts.iter().flat_map(sort_key).collect(),
    }
}

/// Reads a time (`1d2h3m4s500ms`, or plain seconds) as milliseconds.
pub(crate) fn parse_time(word: &str) -> Option<u64> {
    if !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit()) {
        return word.parse::<u64>().ok()?.checked_mul(1000);
    }
    let mut total: u64 = 0;
    let mut rest = word;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (mult, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('d') {
            (86_400_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1000, 1)
        } else {
            return None;
        };
        total = total.checked_add(n.checked_mul(mult)?)?;
        rest = &rest[len..];
    }
    Some(total)
}

/// Lists a time as nft does: `1d2h3m4s500ms` without the zero parts.
pub(crate) fn print_time(ms: u64, out: &mut String) {
    let parts = [
        (ms / 86_400_000, "d"),
        (ms / 3_600_000 % 24, "h"),
        (ms / 60_000 % 60, "m"),
        (ms / 1000 % 60, "s"),
        (ms % 1000, "ms"),
    ];
    let mut any = false;
    for (n, unit) in parts {
        if n > 0 {
            out.push_str(&n.to_string());
            out.push_str(unit);
            any = true;
        }
    }
    if !any {
        out.push_str("0s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(t: DataType, w: &str) -> String {
        let mut s = String::new();
        t.print_elem(&t.parse_elem(w, false).unwrap(), true, &mut s);
        s
    }

    #[test]
    fn canonical_values() {
        assert_eq!(
            show(DataType::Ipv4Addr, "192.168.3.0-192.168.3.255"),
            "192.168.3.0/24"
        );
        assert_eq!(show(DataType::Ipv4Addr, "192.168.3.1/24"), "192.168.3.0/24");
        assert_eq!(show(DataType::Ipv4Addr, "10.0.0.1/32"), "10.0.0.1");
        assert_eq!(show(DataType::InetProto, "tcp"), "6");
        assert_eq!(show(DataType::IcmpType, "8"), "echo-request");
        assert_eq!(
            show(DataType::IcmpType, "echo-reply-echo-request"),
            "echo-reply-echo-request"
        );
        assert_eq!(show(DataType::Mark, "0x32"), "0x00000032");
        assert_eq!(show(DataType::Dscp, "0x38"), "cs7");
        assert_eq!(show(DataType::InetService, "1024-65535"), "1024-65535");
        assert_eq!(show(DataType::Ipv6Addr, "dead:0::beef"), "dead::beef");
        assert!(DataType::InetService.parse_elem("65536", false).is_none());
        assert!(
            DataType::IcmpType
                .parse_elem("echo-requestt", false)
                .is_none()
        );
        let mut t = String::new();
        print_time(parse_time("23d23h59m59s").unwrap(), &mut t);
        assert_eq!(t, "23d23h59m59s");
        let mut t = String::new();
        print_time(parse_time("60s").unwrap(), &mut t);
        assert_eq!(t, "1m");
    }
}
