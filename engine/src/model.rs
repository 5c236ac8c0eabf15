//! The rule model: ruleset -> tables -> chains -> rules (matches + target).
//!
//! These are plain data types, the common language of the parser ([`crate::restore`]), the
//! validator ([`crate::validate`]) and the compiler ([`crate::compile`]). They mirror what
//! `iptables-save` prints: a [`Rule`] holds the "IP header" part of an iptables rule (`-s`, `-d`,
//! `-i`, `-o`, `-p`, `-f`) as fields, then the `-m` matches in the order they were given, then the
//! target. Nothing here knows about protobuf, SQLite or the clock.
//!
//! Tables `filter` and `raw` are enforced by the engine. `nat`, `mangle` and `security` are
//! parsed, stored and printed back, and [`crate::validate`] reports them as "not enforced":
//! they are never dropped silently. Matches and targets of extensions the engine does not
//! implement are kept as [`Match::Opaque`] / [`Target::Opaque`] so that a real ruleset survives
//! a round trip; validation rejects them in enforced tables, naming the extension.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

mod ct_zone;
mod edit;
mod physdev;
mod rules;
mod stateful;

pub use ct_zone::{CtZone, CtZoneSpec};
pub use edit::{EditError, EditOp, RuleEdit};
pub use physdev::PhysdevMatch;
pub use rules::{Iter as RuleIter, IterMut as RuleIterMut, RuleList};
pub use stateful::{
    HASHLIMIT_BURST_MAX, HASHLIMIT_NAME_MAX, HASHLIMIT_SCALE, HashlimitMatch, RECENT_LIST_TOT,
    RECENT_MAX_STAMPS, RECENT_NAME_MAX, RecentMatch, RecentOp, full_mask, hashlimit_mode,
};

/// Address family of a table: `iptables` (IPv4) or `ip6tables` (IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (`iptables`, `-4`).
    Ipv4,
    /// IPv6 (`ip6tables`, `-6`).
    Ipv6,
}

/// The kind of an x_tables table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableKind {
    /// `raw`: PREROUTING and OUTPUT, before conntrack; enforced (NOTRACK / CT --notrack).
    Raw,
    /// `mangle`: parsed and printed, not enforced.
    Mangle,
    /// `nat`: parsed and printed, not enforced.
    Nat,
    /// `filter`: INPUT, FORWARD, OUTPUT; enforced.
    Filter,
    /// `security`: parsed and printed, not enforced.
    Security,
}

impl TableKind {
    /// All kinds, in the order the kernel runs them at a hook (raw first, as
    /// NF_IP_PRI_RAW < NF_IP_PRI_MANGLE < NF_IP_PRI_NAT_DST < NF_IP_PRI_FILTER < NF_IP_PRI_SECURITY).
    pub const ALL: [TableKind; 5] = [
        TableKind::Raw,
        TableKind::Mangle,
        TableKind::Nat,
        TableKind::Filter,
        TableKind::Security,
    ];

    /// The name used after `*` in iptables-restore text.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Raw => "raw",
            TableKind::Mangle => "mangle",
            TableKind::Nat => "nat",
            TableKind::Filter => "filter",
            TableKind::Security => "security",
        }
    }

    /// Parses a table name (`filter`, `raw`, ...); `None` for anything else.
    pub fn from_name(s: &str) -> Option<TableKind> {
        TableKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether the engine evaluates this table on the packet path (filter and raw).
    pub fn is_enforced(self) -> bool {
        matches!(self, TableKind::Filter | TableKind::Raw)
    }

    /// The builtin chains (hooks) of this table, in iptables-save order.
    pub fn builtin_hooks(self) -> &'static [Hook] {
        use Hook::*;
        match self {
            TableKind::Raw => &[Prerouting, Output],
            TableKind::Mangle => &[Prerouting, Input, Forward, Output, Postrouting],
            TableKind::Nat => &[Prerouting, Input, Output, Postrouting],
            TableKind::Filter => &[Input, Forward, Output],
            TableKind::Security => &[Input, Forward, Output],
        }
    }
}

impl fmt::Display for TableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A netfilter hook: where in the stack a builtin chain is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// Before routing, every packet that arrives.
    Prerouting,
    /// Packets for a local address.
    Input,
    /// Routed packets.
    Forward,
    /// Locally generated packets.
    Output,
    /// Every packet that leaves.
    Postrouting,
}

impl Hook {
    /// All hooks, in packet-path order.
    pub const ALL: [Hook; 5] = [
        Hook::Prerouting,
        Hook::Input,
        Hook::Forward,
        Hook::Output,
        Hook::Postrouting,
    ];

    /// The builtin chain name (`INPUT`, ...).
    pub fn chain_name(self) -> &'static str {
        match self {
            Hook::Prerouting => "PREROUTING",
            Hook::Input => "INPUT",
            Hook::Forward => "FORWARD",
            Hook::Output => "OUTPUT",
            Hook::Postrouting => "POSTROUTING",
        }
    }

    /// Parses a builtin chain name; `None` for user chains.
    pub fn from_chain_name(s: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.chain_name() == s)
    }

    /// Index 0..5, for per-hook arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.chain_name())
    }
}

/// Where something came from in iptables-restore text: 1-based line and column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// 1-based line number (0 when the item did not come from text).
    pub line: u32,
    /// 1-based column of the first byte of the token (0 when unknown).
    pub column: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Packet and byte counters, as `[packets:bytes]` in iptables-save text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    /// Packets.
    pub packets: u64,
    /// Bytes (layer 3 length, as xt_counters).
    pub bytes: u64,
}

/// A ruleset: one owner's tables. Several rulesets can be active at once; at each hook they run
/// in ascending `priority` order with nftables semantics (see [`crate::compile`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ruleset {
    /// Owner-chosen name, unique among active rulesets.
    pub name: String,
    /// Lower runs first (as nftables base-chain priority).
    pub priority: i32,
    /// Tables, at most one per (family, kind).
    pub tables: Vec<Table>,
}

impl Ruleset {
    /// The table of this family and kind, if present.
    pub fn table(&self, family: Family, kind: TableKind) -> Option<&Table> {
        self.tables
            .iter()
            .find(|t| t.family == family && t.kind == kind)
    }

    /// Number of rules over all tables and chains.
    pub fn rule_count(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|t| &t.chains)
            .map(|c| c.rules.len())
            .sum()
    }
}

/// One table (`*filter` ... `COMMIT`) of one family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Table {
    /// IPv4 or IPv6.
    pub family: Family,
    /// filter, raw, nat, mangle or security.
    pub kind: TableKind,
    /// Builtin chains first in hook order, then user chains, as iptables-save prints them.
    pub chains: Vec<Chain>,
    /// Where `*table` was written.
    pub location: Location,
}

impl Table {
    /// The chain with this name, if present.
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }
}

/// A builtin chain's policy: the verdict when the packet reaches the end of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// `ACCEPT`.
    Accept,
    /// `DROP`.
    Drop,
}

/// A chain: builtin (has a hook and a policy) or user-defined (`-` in `:NAME - [0:0]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Chain {
    /// Chain name, at most 28 bytes (XT_EXTENSION_MAXNAMELEN - 1 minus the kernel's own needs,
    /// as iptables: "chain name too long").
    pub name: String,
    /// `Some` for builtin chains only (as iptables-restore: "policy only on builtin chains").
    pub policy: Option<Policy>,
    /// The policy counters `[p:b]` of a builtin chain (zero for user chains).
    pub counters: Counters,
    /// Rules in evaluation order, in chunks shared between clones ([`RuleList`]).
    pub rules: RuleList,
    /// Where the chain was declared (`:NAME` or `-N NAME`).
    pub location: Location,
}

impl Chain {
    /// The hook this chain is attached to, if it is builtin.
    pub fn hook(&self) -> Option<Hook> {
        if self.policy.is_some() {
            Hook::from_chain_name(&self.name)
        } else {
            None
        }
    }
}

/// A value with an optional `!` in front, as iptables writes `! -s 10.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Neg<T> {
    /// `true` when written with `!`: the match succeeds when the test fails.
    pub negated: bool,
    /// The tested value.
    pub value: T,
}

impl<T> Neg<T> {
    /// A plain (non-negated) value.
    pub fn plain(value: T) -> Self {
        Neg {
            negated: false,
            value,
        }
    }
}

/// An address with a mask, as `-s 10.0.0.0/8` or `-s 10.0.0.0/255.0.0.0`.
/// The mask need not be contiguous (iptables accepts any dotted mask); `prefix_len()` returns
/// `None` then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    /// The address, already ANDed with the mask (as iptables stores it).
    pub addr: IpAddr,
    /// The mask, same family as `addr`.
    pub mask: IpAddr,
}

impl IpNet {
    /// A network from an address and a prefix length (0..=32 or 0..=128). Bits of `addr` beyond
    /// the prefix are cleared. Returns `None` when `len` is too long for the family.
    pub fn new(addr: IpAddr, len: u8) -> Option<IpNet> {
        match addr {
            IpAddr::V4(a) => {
                if len > 32 {
                    return None;
                }
                let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                Some(IpNet {
                    addr: IpAddr::V4(Ipv4Addr::from(u32::from(a) & m)),
                    mask: IpAddr::V4(Ipv4Addr::from(m)),
                })
            }
            IpAddr::V6(a) => {
                if len > 128 {
                    return None;
                }
                let m = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                Some(IpNet {
                    addr: IpAddr::V6(Ipv6Addr::from(u128::from(a) & m)),
                    mask: IpAddr::V6(Ipv6Addr::from(m)),
                })
            }
        }
    }

    /// The prefix length when the mask is contiguous.
    pub fn prefix_len(&self) -> Option<u8> {
        let (bits, width) = match self.mask {
            IpAddr::V4(m) => (u32::from(m) as u128, 32u32),
            IpAddr::V6(m) => (u128::from(m), 128u32),
        };
        let ones = bits.count_ones();
        let expected = if ones == 0 {
            0
        } else {
            (u128::MAX >> (128 - width)) & !((1u128 << (width - ones)) - 1)
        };
        (bits == expected).then_some(ones as u8)
    }

    /// Whether `ip` is inside this network (false across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, self.mask, ip) {
            (IpAddr::V4(a), IpAddr::V4(m), IpAddr::V4(x)) => {
                u32::from(x) & u32::from(m) == u32::from(a)
            }
            (IpAddr::V6(a), IpAddr::V6(m), IpAddr::V6(x)) => {
                u128::from(x) & u128::from(m) == u128::from(a)
            }
            _ => false,
        }
    }
}

/// An interface name pattern (`-i eth0`, `-i eth+`): at most 15 bytes (IFNAMSIZ - 1); a trailing
/// `+` matches every name with that prefix, and `+` alone matches every interface.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Iface {
    /// The name as written, including a trailing `+`.
    pub name: String,
}

impl Iface {
    /// Whether an interface name matches this pattern (as xt's ifname compare).
    pub fn matches(&self, ifname: &str) -> bool {
        match self.name.strip_suffix('+') {
            Some(prefix) => ifname.starts_with(prefix),
            None => self.name == ifname,
        }
    }
}

/// An inclusive port range; a single port has `lo == hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port (>= lo).
    pub hi: u16,
}

impl PortRange {
    /// Whether `port` is within the range.
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }
}

/// An inclusive range of IP addresses (`-m iprange --src-range a-b`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddrRange {
    /// First address.
    pub lo: IpAddr,
    /// Last address (same family).
    pub hi: IpAddr,
}

impl AddrRange {
    /// Whether `ip` is within the range (false across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.lo, self.hi, ip) {
            (IpAddr::V4(l), IpAddr::V4(h), IpAddr::V4(x)) => l <= x && x <= h,
            (IpAddr::V6(l), IpAddr::V6(h), IpAddr::V6(x)) => l <= x && x <= h,
            _ => false,
        }
    }
}

/// TCP flag bits, as in the TCP header's 13th byte (FIN = 0x01 ... URG = 0x20).
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;
}

/// Conntrack states as a bit set (`--ctstate NEW,ESTABLISHED`), the bits of xt_conntrack's
/// XT_CONNTRACK_STATE_* in the order iptables prints them.
pub mod ct_state {
    /// INVALID.
    pub const INVALID: u8 = 1 << 0;
    /// ESTABLISHED.
    pub const ESTABLISHED: u8 = 1 << 1;
    /// RELATED.
    pub const RELATED: u8 = 1 << 2;
    /// NEW.
    pub const NEW: u8 = 1 << 3;
    /// UNTRACKED.
    pub const UNTRACKED: u8 = 1 << 4;
    /// SNAT (conntrack match only).
    pub const SNAT: u8 = 1 << 5;
    /// DNAT (conntrack match only).
    pub const DNAT: u8 = 1 << 6;
}

/// Which packet address a `--match-set` flag refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetDir {
    /// `src`.
    Src,
    /// `dst`.
    Dst,
}

/// A `-m` match (or the implicit protocol match). Each variant is one iptables extension.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Match {
    /// `-m tcp`: ports, flags and options.
    Tcp(TcpMatch),
    /// `-m udp`: ports.
    Udp(UdpMatch),
    /// `-m multiport`: up to 15 port slots, a range takes 2.
    Multiport(MultiportMatch),
    /// `-m icmp --icmp-type`.
    Icmp(IcmpMatch),
    /// `-m icmp6 --icmpv6-type`.
    Icmpv6(IcmpMatch),
    /// `-m conntrack`.
    Conntrack(ConntrackMatch),
    /// `-m state --state`: a set of [`ct_state`] bits.
    State(Neg<u8>),
    /// `-m iprange`.
    Iprange(IprangeMatch),
    /// `-m set --match-set NAME dir[,dir...]`.
    Set(SetMatch),
    /// `-m comment --comment TEXT` (at most 255 bytes); never affects matching.
    Comment(String),
    /// `-m mark --mark VALUE[/MASK]`: `(mark & mask) == value`.
    Mark(Neg<MarkValue>),
    /// `-m owner` (OUTPUT and POSTROUTING): the local socket that sent the packet.
    Owner(OwnerMatch),
    /// `-m physdev`: the bridge ports of a bridged packet ([`PhysdevMatch`]).
    Physdev(PhysdevMatch),
    /// `-m connmark [!] --mark VALUE[/MASK]`: `(ctmark & mask) == value` on the mark of the
    /// packet's conntrack entry. As connmark_mt, a packet without an entry (INVALID,
    /// UNTRACKED, or in the raw table, which runs before conntrack) never matches, negated
    /// or not.
    Connmark(Neg<MarkValue>),
    /// `-m length --length LO[:HI]`: layer-3 length in bytes.
    Length(Neg<PortRange>),
    /// `-m limit`: token bucket.
    Limit(LimitMatch),
    /// `-m mac --mac-source`.
    Mac(Neg<[u8; 6]>),
    /// `-m ttl` (IPv4): compares the TTL.
    Ttl(TtlMatch),
    /// `-m hl` (IPv6): compares the hop limit.
    Hl(TtlMatch),
    /// `-m tos [!] --tos VALUE/MASK`: `(tos & mask) == value` on the IPv4 TOS byte or the IPv6
    /// traffic class.
    Tos(Neg<TosValue>),
    /// `-m dscp [!] --dscp N`: the top 6 bits of the TOS byte / traffic class equal N (0-63).
    Dscp(Neg<u8>),
    /// `-m ecn`: ECN bits of the IP header and of the TCP header.
    Ecn(EcnMatch),
    /// `-m ah [!] --ahspi LO[:HI]` (IPv4, needs `-p ah`): the AH header's SPI is in the range
    /// (the whole range when no `--ahspi` was given).
    Ah(Neg<IdRange>),
    /// `-m frag` (IPv6): the first fragment extension header.
    Frag(FragMatch),
    /// `-m rt` (IPv6): the first routing extension header.
    Rt(RtMatch),
    /// `-m ipv6header [!] --header LIST [--soft]` (IPv6): which extension headers the packet
    /// carries.
    Ipv6Header(Ipv6HeaderMatch),
    /// `-m addrtype`: the kernel's route type of the source and/or destination address
    /// ([`crate::node_addrs`] decides it from the node's address facts).
    AddrType(AddrTypeMatch),
    /// `-m recent`: a named list of recently seen addresses ([`RecentMatch`]).
    Recent(RecentMatch),
    /// `-m hashlimit` with a packet rate: a token bucket per hash key ([`HashlimitMatch`]).
    Hashlimit(HashlimitMatch),
    /// An extension the engine does not implement, kept verbatim (for nat/mangle/security
    /// tables and round trips); rejected by validation in enforced tables.
    Opaque(Opaque),
}

impl Match {
    /// The extension name as written after `-m`.
    pub fn extension(&self) -> &str {
        match self {
            Match::Tcp(_) => "tcp",
            Match::Udp(_) => "udp",
            Match::Multiport(_) => "multiport",
            Match::Icmp(_) => "icmp",
            Match::Icmpv6(_) => "icmp6",
            Match::Conntrack(_) => "conntrack",
            Match::State(_) => "state",
            Match::Iprange(_) => "iprange",
            Match::Set(_) => "set",
            Match::Comment(_) => "comment",
            Match::Mark(_) => "mark",
            Match::Connmark(_) => "connmark",
            Match::Owner(_) => "owner",
            Match::Physdev(_) => "physdev",
            Match::Length(_) => "length",
            Match::Limit(_) => "limit",
            Match::Mac(_) => "mac",
            Match::Ttl(_) => "ttl",
            Match::Hl(_) => "hl",
            Match::Tos(_) => "tos",
            Match::Dscp(_) => "dscp",
            Match::Ecn(_) => "ecn",
            Match::Ah(_) => "ah",
            Match::Frag(_) => "frag",
            Match::Rt(_) => "rt",
            Match::Ipv6Header(_) => "ipv6header",
            Match::AddrType(_) => "addrtype",
            Match::Recent(_) => "recent",
            Match::Hashlimit(_) => "hashlimit",
            Match::Opaque(o) => &o.name,
        }
    }
}

/// How `-m ttl` / `-m hl` compares (xt_ttl's `IPT_TTL_*` / `IP6T_HL_*` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TtlOp {
    /// `--ttl-eq N` / `--hl-eq N`.
    Eq,
    /// `! --ttl-eq N` / `! --hl-eq N`.
    Ne,
    /// `--ttl-lt N` / `--hl-lt N`: strictly below.
    Lt,
    /// `--ttl-gt N` / `--hl-gt N`: strictly above.
    Gt,
}

/// `-m ttl` / `-m hl`: the TTL or hop limit compared with `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TtlMatch {
    /// The comparison.
    pub op: TtlOp,
    /// The compared value.
    pub value: u8,
}

/// `--tos VALUE/MASK` (a symbolic name is its value with mask 0x3f, a bare number mask 0xff, as
/// libxt_tos).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TosValue {
    /// Compared value.
    pub value: u8,
    /// Mask applied to the TOS byte first.
    pub mask: u8,
}

/// `-m ecn` options; each is `Some(negated)` when given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EcnMatch {
    /// `[!] --ecn-tcp-ece`: the TCP ECE flag is set (needs `-p tcp`).
    pub ece: Option<bool>,
    /// `[!] --ecn-tcp-cwr`: the TCP CWR flag is set (needs `-p tcp`).
    pub cwr: Option<bool>,
    /// `[!] --ecn-ip-ect N`: the IP header's ECN field (0-3) equals N.
    pub ect: Option<Neg<u8>>,
}

/// An inclusive range of 32-bit identifiers (AH SPIs, fragment ids, segments left).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdRange {
    /// First value.
    pub lo: u32,
    /// Last value (>= lo).
    pub hi: u32,
}

impl IdRange {
    /// Every 32-bit value (what an omitted option means).
    pub const ALL: IdRange = IdRange {
        lo: 0,
        hi: u32::MAX,
    };

    /// Whether `v` is within the range.
    pub fn contains(&self, v: u32) -> bool {
        self.lo <= v && v <= self.hi
    }
}

/// `-m frag` options (ip6t_frag). A packet without a fragment header never matches, whatever
/// the negations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragMatch {
    /// `[!] --fragid LO[:HI]`: the identification is in the range ([`IdRange::ALL`] when not
    /// given and not negated).
    pub id: Neg<IdRange>,
    /// `[!] --fraglen N`: stored and printed; the kernel's `frag_mt6` does not compare it, and
    /// neither does the engine.
    pub len: Option<Neg<u32>>,
    /// `--fragres`: the reserved fields are zero.
    pub res: bool,
    /// `--fragfirst`: the offset is zero.
    pub first: bool,
    /// `--fragmore`: the M flag is set.
    pub more: bool,
    /// `--fraglast`: the M flag is clear.
    pub last: bool,
}

/// `-m rt` options (ip6t_rt). A packet without a routing header never matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RtMatch {
    /// `[!] --rt-type N`.
    pub rt_type: Option<Neg<u8>>,
    /// `[!] --rt-segsleft LO[:HI]` ([`IdRange::ALL`] when not given and not negated).
    pub segsleft: Neg<IdRange>,
    /// `[!] --rt-len N`: the header length in bytes, `(Hdr Ext Len + 1) * 8`.
    pub len: Option<Neg<u32>>,
    /// The type-0 options (`--rt-0-res`, `--rt-0-addrs`, `--rt-0-not-strict`) verbatim; parsed
    /// and printed, refused by validation in enforced tables.
    pub other: Vec<OpaqueOption>,
}

/// `-m ipv6header`: ip6t_ipv6header's header bits ([`ipv6_ext`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6HeaderMatch {
    /// `!` before `--header`.
    pub negated: bool,
    /// The headers listed ([`ipv6_ext`] bits).
    pub headers: u8,
    /// `--soft`: the listed headers are present (or, negated, absent), others may be too;
    /// without it the packet's set of headers equals the list (or, negated, differs).
    pub soft: bool,
}

/// `-m owner` (xt_owner revision 1), as owner_mt: a packet without a socket (forwarded, or
/// sent by the kernel itself) matches only when every given option is negated; with one,
/// `! --socket-exists` fails and the uid / gid (the socket's file's fsuid / fsgid, as
/// NFQUEUE's NFQA_UID / NFQA_GID give them) must be in (or, negated, out of) the ranges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OwnerMatch {
    /// `[!] --socket-exists`: `Some(negated)`.
    pub socket: Option<bool>,
    /// `[!] --uid-owner LO[-HI]`.
    pub uid: Option<Neg<IdRange>>,
    /// `[!] --gid-owner LO[-HI]`.
    pub gid: Option<Neg<IdRange>>,
    /// `--suppl-groups`: the gid test also looks at the supplementary groups (stored only:
    /// NFQUEUE does not send them).
    pub suppl_groups: bool,
}

/// `-m addrtype` (xt_addrtype revision 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddrTypeMatch {
    /// `[!] --src-type LIST`: [`addr_type`] bits, the source's type is one of them.
    pub src: Option<Neg<u16>>,
    /// `[!] --dst-type LIST`: [`addr_type`] bits, the destination's type is one of them.
    pub dst: Option<Neg<u16>>,
    /// `--limit-iface-in` / `--limit-iface-out`: only addresses of the packet's input
    /// (output) device count as LOCAL or BROADCAST.
    pub limit: AddrTypeLimit,
}

/// `-m addrtype`'s device limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AddrTypeLimit {
    /// Any device.
    #[default]
    None,
    /// `--limit-iface-in`: the input device (PREROUTING, INPUT, FORWARD).
    In,
    /// `--limit-iface-out`: the output device (FORWARD, OUTPUT, POSTROUTING).
    Out,
}

/// Route types of `-m addrtype`, as xt_addrtype's `XT_ADDRTYPE_*` (`1 << RTN_*`).
pub mod addr_type {
    /// `UNSPEC` (RTN_UNSPEC).
    pub const UNSPEC: u16 = 1 << 0;
    /// `UNICAST`.
    pub const UNICAST: u16 = 1 << 1;
    /// `LOCAL`.
    pub const LOCAL: u16 = 1 << 2;
    /// `BROADCAST`.
    pub const BROADCAST: u16 = 1 << 3;
    /// `ANYCAST`.
    pub const ANYCAST: u16 = 1 << 4;
    /// `MULTICAST`.
    pub const MULTICAST: u16 = 1 << 5;
    /// `BLACKHOLE`.
    pub const BLACKHOLE: u16 = 1 << 6;
    /// `UNREACHABLE`.
    pub const UNREACHABLE: u16 = 1 << 7;
    /// `PROHIBIT`.
    pub const PROHIBIT: u16 = 1 << 8;
    /// `THROW`.
    pub const THROW: u16 = 1 << 9;
    /// `NAT`.
    pub const NAT: u16 = 1 << 10;
    /// `XRESOLVE`.
    pub const XRESOLVE: u16 = 1 << 11;
    /// The names in bit order, as libxt_addrtype's `rtn_names` (its print order).
    pub const NAMES: [&str; 12] = [
        "UNSPEC",
        "UNICAST",
        "LOCAL",
        "BROADCAST",
        "ANYCAST",
        "MULTICAST",
        "BLACKHOLE",
        "UNREACHABLE",
        "PROHIBIT",
        "THROW",
        "NAT",
        "XRESOLVE",
    ];
    /// The types the engine decides from the node's local table and the address bits
    /// (see [`crate::node_addrs`]); the others need routes it does not have.
    pub const DECIDED: u16 = UNSPEC | UNICAST | LOCAL | BROADCAST | MULTICAST;

    /// The names of the bits in `mask`, comma-separated, in bit order (libxt_addrtype's
    /// `print_types`).
    pub fn names(mask: u16) -> String {
        let mut out = String::new();
        for (i, n) in NAMES.iter().enumerate() {
            if mask & (1 << i) != 0 {
                if !out.is_empty() {
                    out.push(',');
                }
                out.push_str(n);
            }
        }
        out
    }
}

/// IPv6 extension-header bits as ip6t_ipv6header's `MASK_*`.
pub mod ipv6_ext {
    /// Hop-by-hop options.
    pub const HOPOPTS: u8 = 128;
    /// Destination options.
    pub const DSTOPTS: u8 = 64;
    /// Routing header.
    pub const ROUTING: u8 = 32;
    /// Fragment header.
    pub const FRAGMENT: u8 = 16;
    /// Authentication header.
    pub const AH: u8 = 8;
    /// Encapsulating security payload.
    pub const ESP: u8 = 4;
    /// No next header (59).
    pub const NONE: u8 = 2;
    /// An upper-layer protocol follows the extension headers.
    pub const PROTO: u8 = 1;
}

/// `-m tcp` options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TcpMatch {
    /// `--sport`.
    pub sport: Option<Neg<PortRange>>,
    /// `--dport`.
    pub dport: Option<Neg<PortRange>>,
    /// `--tcp-flags MASK COMP` (`--syn` is `FIN,SYN,RST,ACK SYN`).
    pub flags: Option<Neg<TcpFlags>>,
    /// `--tcp-option N`: the packet carries TCP option kind N.
    pub option: Option<Neg<u8>>,
}

/// `--tcp-flags MASK COMP`: `(flags & mask) == comp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TcpFlags {
    /// Flags examined ([`tcp_flags`] bits).
    pub mask: u8,
    /// Flags that must be set among those examined.
    pub comp: u8,
}

/// `-m udp` options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct UdpMatch {
    /// `--sport`.
    pub sport: Option<Neg<PortRange>>,
    /// `--dport`.
    pub dport: Option<Neg<PortRange>>,
}

/// Which ports `-m multiport` compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MultiportDir {
    /// `--sports`.
    Source,
    /// `--dports`.
    Destination,
    /// `--ports`: source or destination.
    Either,
}

/// `-m multiport [!] --sports|--dports|--ports p[,p|lo:hi...]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MultiportMatch {
    /// Compared ports.
    pub dir: MultiportDir,
    /// `!` before the option.
    pub negated: bool,
    /// Ports and ranges in written order; at most 15 slots where a range takes 2.
    pub ports: Vec<PortRange>,
}

/// `--icmp-type` / `--icmpv6-type`: `type` and an inclusive code range; `any` is `None` type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IcmpMatch {
    /// `!` before the option.
    pub negated: bool,
    /// `None` for `any` (every ICMP packet). For IPv4, `Some(255)` also matches every ICMP
    /// packet whatever `code` says, as the kernel's icmp_type_code_match.
    pub icmp_type: Option<u8>,
    /// Inclusive code range (0..=255 when only a type is given).
    pub code: (u8, u8),
}

/// `-m conntrack` options. `--ctstate` is typed; the others are kept in their canonical
/// text (as iptables-save prints them) in `other`, and [`ConntrackMatch::tuple_conditions`]
/// reads those the engine enforces ([`CONNTRACK_ENFORCED`]); validation names the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConntrackMatch {
    /// `--ctstate`: [`ct_state`] bits.
    pub ctstate: Option<Neg<u8>>,
    /// Every other option, in libxt_conntrack's print order (name with `--`, negation, the
    /// canonical value).
    pub other: Vec<OpaqueOption>,
}

/// The `-m conntrack` options besides `--ctstate` that the engine enforces: the protocol, the
/// addresses and ports of the entry's original and reply tuples, and the packet's direction.
/// `--ctstatus` and `--ctexpire` are stored only.
pub const CONNTRACK_ENFORCED: [&str; 10] = [
    "--ctproto",
    "--ctorigsrc",
    "--ctorigdst",
    "--ctreplsrc",
    "--ctrepldst",
    "--ctorigsrcport",
    "--ctorigdstport",
    "--ctreplsrcport",
    "--ctrepldstport",
    "--ctdir",
];

/// What [`ConntrackMatch::tuple_conditions`] reads: each `Some((negated, value))` when given.
/// Tuple fields are indexed original source, original destination, reply source, reply
/// destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtTupleConditions {
    /// `--ctproto N`.
    pub proto: Option<(bool, u8)>,
    /// `--ctorigsrc`, `--ctorigdst`, `--ctreplsrc`, `--ctrepldst` (address and mask).
    pub addrs: [Option<(bool, IpNet)>; 4],
    /// `--ctorigsrcport`, `--ctorigdstport`, `--ctreplsrcport`, `--ctrepldstport`.
    pub ports: [Option<(bool, PortRange)>; 4],
    /// `--ctdir ORIGINAL` (`Some(false)`) or `REPLY` (`Some(true)`).
    pub reply: Option<bool>,
}

impl ConntrackMatch {
    /// The enforced options of `other` read into conditions; `Err(name)` for the first
    /// option that is not enforced or whose value is not in the canonical form the parser
    /// writes (structured input), naming it.
    pub fn tuple_conditions(&self, family: Family) -> Result<CtTupleConditions, String> {
        let mut c = CtTupleConditions::default();
        for o in &self.other {
            let bad = || format!("conntrack {}", o.name);
            let [arg] = o.args.as_slice() else {
                return Err(bad());
            };
            let i = CONNTRACK_ENFORCED
                .iter()
                .position(|n| *n == o.name)
                .ok_or_else(bad)?;
            match i {
                0 => c.proto = Some((o.negated, arg.parse().map_err(|_| bad())?)),
                1..=4 => {
                    let net = read_net(arg, family).ok_or_else(bad)?;
                    c.addrs[i - 1] = Some((o.negated, net));
                }
                5..=8 => {
                    let (lo, hi) = arg.split_once(':').unwrap_or((arg, arg));
                    let (lo, hi) = (
                        lo.parse().map_err(|_| bad())?,
                        hi.parse().map_err(|_| bad())?,
                    );
                    if lo > hi {
                        return Err(bad());
                    }
                    c.ports[i - 5] = Some((o.negated, PortRange { lo, hi }));
                }
                _ => {
                    c.reply = Some(match arg.as_str() {
                        "ORIGINAL" if !o.negated => false,
                        "REPLY" if !o.negated => true,
                        _ => return Err(bad()),
                    });
                }
            }
        }
        Ok(c)
    }
}

/// `ADDR`, `ADDR/LEN` or `ADDR/MASK` of `family`, with no bits outside the mask.
fn read_net(s: &str, family: Family) -> Option<IpNet> {
    let (a, m) = s.split_once('/').unwrap_or((s, ""));
    let addr: IpAddr = a.parse().ok()?;
    if addr.is_ipv6() != (family == Family::Ipv6) {
        return None;
    }
    let full = if addr.is_ipv6() { 128 } else { 32 };
    let net = if m.is_empty() {
        IpNet::new(addr, full)?
    } else if let Ok(len) = m.parse::<u8>() {
        IpNet::new(addr, len)?
    } else {
        let mask: IpAddr = m.parse().ok()?;
        if mask.is_ipv6() != addr.is_ipv6() {
            return None;
        }
        IpNet { addr, mask }
    };
    let bits = |ip: IpAddr| match ip {
        IpAddr::V4(x) => u128::from(u32::from(x)),
        IpAddr::V6(x) => u128::from(x),
    };
    (bits(net.addr) & !bits(net.mask) == 0).then_some(net)
}

/// `-m iprange`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IprangeMatch {
    /// `--src-range LO-HI`.
    pub src: Option<Neg<AddrRange>>,
    /// `--dst-range LO-HI`.
    pub dst: Option<Neg<AddrRange>>,
}

/// `-m set [!] --match-set NAME src|dst[,...]`: the set's element type decides how many flags
/// are consumed (hash:ip uses the first, hash:ip,port the first two).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetMatch {
    /// `!` before `--match-set`.
    pub negated: bool,
    /// Set name, at most 31 bytes (IPSET_MAXNAMELEN - 1).
    pub name: String,
    /// One flag per element dimension.
    pub dirs: Vec<SetDir>,
    /// Further options (`--return-nomatch`, `! --update-counters`, ...) verbatim.
    pub other: Vec<OpaqueOption>,
}

/// `--mark VALUE[/MASK]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MarkValue {
    /// Compared value.
    pub value: u32,
    /// Mask applied to the packet mark first (0xffffffff when not written).
    pub mask: u32,
}

/// `-m limit --limit N/unit --limit-burst B`: a token bucket, as xt_limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LimitMatch {
    /// Average rate: packets per `unit`.
    pub rate: u32,
    /// Unit of the rate.
    pub unit: RateUnit,
    /// Bucket size in packets (default 5).
    pub burst: u32,
}

impl LimitMatch {
    /// Nanoseconds between two packets at the average rate.
    pub fn interval_ns(&self) -> u64 {
        self.unit.ns() / u64::from(self.rate.max(1))
    }
}

/// The unit of a `--limit` rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RateUnit {
    /// `/sec`.
    Second,
    /// `/min`.
    Minute,
    /// `/hour`.
    Hour,
    /// `/day`.
    Day,
}

impl RateUnit {
    /// The unit's length in nanoseconds.
    pub fn ns(self) -> u64 {
        const S: u64 = 1_000_000_000;
        match self {
            RateUnit::Second => S,
            RateUnit::Minute => 60 * S,
            RateUnit::Hour => 3600 * S,
            RateUnit::Day => 86_400 * S,
        }
    }
}

/// An option of an extension kept verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OpaqueOption {
    /// `!` before the option.
    pub negated: bool,
    /// The option name including its dashes (`--dst-type`).
    pub name: String,
    /// The option's arguments as separate tokens (unquoted).
    pub args: Vec<String>,
}

/// A match or target extension the engine does not implement, kept verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Opaque {
    /// The extension name (`addrtype`, `DNAT`).
    pub name: String,
    /// Its options in written order.
    pub options: Vec<OpaqueOption>,
}

/// What a rule does when all its matches hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// No `-j`: the rule only counts.
    None,
    /// `-j ACCEPT`.
    Accept,
    /// `-j DROP`.
    Drop,
    /// `-j RETURN`.
    Return,
    /// `-j REJECT [--reject-with TYPE]`: a final drop that answers with an ICMP error or TCP RST.
    Reject(RejectWith),
    /// `-j CHAIN`: call a user chain; RETURN or its end comes back here.
    Jump(String),
    /// `-g CHAIN`: continue in a user chain; its end returns to this chain's caller.
    Goto(String),
    /// `-j LOG`: emit a log event and continue with the next rule.
    Log(LogTarget),
    /// `-j NFLOG`: emit a log event for netlink log group `group` (xt_NFLOG) and continue;
    /// the engine hands it to its caller as it hands LOG events ([`crate::compile::LogEvent`]
    /// with `nflog_group`).
    Nflog(NflogTarget),
    /// `-j NOTRACK` (raw table): mark the packet untracked and continue.
    Notrack,
    /// `-j CT` (raw table): `--notrack` as NOTRACK; otherwise a conntrack template (its
    /// zone) for the tracker.
    Ct(CtTarget),
    /// `-j MARK --set-xmark VALUE/MASK` (xt_MARK revision 2): the packet mark becomes
    /// `(mark & !mask) ^ value`, and the next rule runs. `--set-mark V[/M]` is `V/(V|M)`,
    /// `--and-mark V` is `0/!V`, `--or-mark V` is `V/V`, `--xor-mark V` is `V/0`, as
    /// libxt_MARK reads them; iptables-save prints `--set-xmark`.
    Mark(MarkValue),
    /// `-j CONNMARK` (xt_CONNMARK revision 1): changes the conntrack entry's mark or the packet
    /// mark, and the next rule runs. A packet without an entry (INVALID, UNTRACKED, or in the
    /// raw table) is left as it is, as connmark_tg.
    Connmark(ConnmarkTarget),
    /// A target extension the engine does not implement, kept verbatim.
    Opaque(Opaque),
}

/// The answer of `-j REJECT`. IPv4 names are `icmp-*`, IPv6 names `icmp6-*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectWith {
    /// icmp-net-unreachable / icmp6-no-route.
    NetUnreachable,
    /// icmp-host-unreachable / icmp6-addr-unreachable.
    HostUnreachable,
    /// icmp-port-unreachable / icmp6-port-unreachable (the default).
    PortUnreachable,
    /// icmp-proto-unreachable (IPv4 only).
    ProtoUnreachable,
    /// icmp-net-prohibited (IPv4 only).
    NetProhibited,
    /// icmp-host-prohibited (IPv4 only).
    HostProhibited,
    /// icmp-admin-prohibited / icmp6-adm-prohibited.
    AdminProhibited,
    /// tcp-reset.
    TcpReset,
    /// icmp6-policy-fail (IPv6 only).
    PolicyFail,
    /// icmp6-reject-route (IPv6 only).
    RejectRoute,
}

/// `-j LOG` options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogTarget {
    /// `--log-prefix` (at most 29 bytes).
    pub prefix: Option<String>,
    /// `--log-level` as a syslog number 0..=7 (printed as a number, as iptables-save does).
    pub level: Option<u8>,
    /// `--log-tcp-sequence`, `--log-tcp-options`, `--log-ip-options`, `--log-uid`,
    /// `--log-macdecode` as written, in iptables' print order.
    pub flags: Vec<String>,
}

/// What `-j CONNMARK` does (xt_connmark's `XT_CONNMARK_SET`, `_SAVE`, `_RESTORE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnmarkTarget {
    /// `--set-xmark VALUE/MASK` (also `--set-mark`, `--and-mark`, `--or-mark`, `--xor-mark`
    /// as for MARK): `ctmark = (ctmark & !mask) ^ value`.
    Set(MarkValue),
    /// `--save-mark --nfmask N --ctmask C`: `ctmark = (ctmark & !C) ^ (mark & N)`.
    Save {
        /// Bits of the packet mark copied.
        nfmask: u32,
        /// Bits of the connection mark replaced.
        ctmask: u32,
    },
    /// `--restore-mark --nfmask N --ctmask C`: `mark = (mark & !N) ^ (ctmark & C)`.
    Restore {
        /// Bits of the packet mark replaced.
        nfmask: u32,
        /// Bits of the connection mark copied.
        ctmask: u32,
    },
}

impl MarkValue {
    /// `(old & !mask) ^ value`: what `--set-xmark VALUE/MASK` makes of `old`.
    pub fn apply(self, old: u32) -> u32 {
        (old & !self.mask) ^ self.value
    }
}

/// `-j NFLOG` options (xt_nflog_info), as iptables-save prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NflogTarget {
    /// `--nflog-group` (0-65535; 0, the default, is not printed).
    pub group: u16,
    /// `--nflog-prefix` (at most 63 bytes).
    pub prefix: Option<String>,
    /// `--nflog-range N` (0, the default, is not printed; superseded by `--nflog-size`).
    pub range: u32,
    /// `--nflog-size N`: bytes of the packet copied to the log (XT_NFLOG_F_COPY_LEN).
    pub size: Option<u32>,
    /// `--nflog-threshold` (packets queued in the kernel before a send; 0, the default, is
    /// not printed).
    pub threshold: u16,
}

/// `-j CT` options. Without `--notrack` the rule attaches a conntrack template to the
/// packet, as xt_ct_target: the first CT or NOTRACK rule a packet meets decides (a later one
/// finds the template and does nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtTarget {
    /// `--notrack`.
    pub notrack: bool,
    /// `--zone`, `--zone-orig`, `--zone-reply` (`None`: zone 0, which iptables-save omits).
    pub zone: Option<CtZoneSpec>,
    /// Every other option (`--helper`, `--timeout`, `--ctevents`, `--expevents`) in
    /// libxt_CT's print order, its value canonical.
    pub other: Vec<OpaqueOption>,
}

/// A rule's `-m` matches in written order, used as a slice (`Deref<Target = [Match]>`). Most
/// rules have at most one match: it is kept inline, so such a rule owns no heap block for its
/// matches, and cloning, comparing and dropping a large ruleset touches one array instead of
/// one allocation per rule. Two or more matches live in a `Vec`. Equality, hashing and `Debug`
/// are those of the slice.
#[derive(Clone, Default)]
pub struct MatchList(MatchRepr);

#[derive(Clone, Default)]
enum MatchRepr {
    #[default]
    Empty,
    One(Match),
    Many(Vec<Match>),
}

impl MatchList {
    /// No matches.
    pub const fn new() -> MatchList {
        MatchList(MatchRepr::Empty)
    }

    /// Appends a match.
    pub fn push(&mut self, m: Match) {
        self.0 = match std::mem::take(&mut self.0) {
            MatchRepr::Empty => MatchRepr::One(m),
            MatchRepr::One(first) => MatchRepr::Many(vec![first, m]),
            MatchRepr::Many(mut v) => {
                v.push(m);
                MatchRepr::Many(v)
            }
        };
    }

    /// Removes every match.
    pub fn clear(&mut self) {
        self.0 = MatchRepr::Empty;
    }

    /// The matches as a slice.
    pub fn as_slice(&self) -> &[Match] {
        match &self.0 {
            MatchRepr::Empty => &[],
            MatchRepr::One(m) => std::slice::from_ref(m),
            MatchRepr::Many(v) => v,
        }
    }

    /// The matches as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [Match] {
        match &mut self.0 {
            MatchRepr::Empty => &mut [],
            MatchRepr::One(m) => std::slice::from_mut(m),
            MatchRepr::Many(v) => v,
        }
    }
}

impl std::ops::Deref for MatchList {
    type Target = [Match];

    fn deref(&self) -> &[Match] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for MatchList {
    fn deref_mut(&mut self) -> &mut [Match] {
        self.as_mut_slice()
    }
}

impl PartialEq for MatchList {
    fn eq(&self, other: &MatchList) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for MatchList {}

impl std::hash::Hash for MatchList {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl fmt::Debug for MatchList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl From<Vec<Match>> for MatchList {
    fn from(mut v: Vec<Match>) -> MatchList {
        MatchList(match v.len() {
            0 => MatchRepr::Empty,
            1 => MatchRepr::One(v.pop().expect("one match")),
            _ => MatchRepr::Many(v),
        })
    }
}

impl FromIterator<Match> for MatchList {
    fn from_iter<I: IntoIterator<Item = Match>>(iter: I) -> MatchList {
        let mut list = MatchList::new();
        list.extend(iter);
        list
    }
}

impl Extend<Match> for MatchList {
    fn extend<I: IntoIterator<Item = Match>>(&mut self, iter: I) {
        for m in iter {
            self.push(m);
        }
    }
}

impl<'a> IntoIterator for &'a MatchList {
    type Item = &'a Match;
    type IntoIter = std::slice::Iter<'a, Match>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl<'a> IntoIterator for &'a mut MatchList {
    type Item = &'a mut Match;
    type IntoIter = std::slice::IterMut<'a, Match>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_mut_slice().iter_mut()
    }
}

impl IntoIterator for MatchList {
    type Item = Match;
    type IntoIter = std::vec::IntoIter<Match>;

    fn into_iter(self) -> Self::IntoIter {
        match self.0 {
            MatchRepr::Empty => Vec::new(),
            MatchRepr::One(m) => vec![m],
            MatchRepr::Many(v) => v,
        }
        .into_iter()
    }
}

/// One rule: the header fields, the matches in order and the target.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    /// `-s`.
    pub src: Option<Neg<IpNet>>,
    /// `-d`.
    pub dst: Option<Neg<IpNet>>,
    /// `-i`.
    pub in_iface: Option<Neg<Iface>>,
    /// `-o`.
    pub out_iface: Option<Neg<Iface>>,
    /// `-p`: protocol number (0 is never stored: `-p all` is `None`).
    pub protocol: Option<Neg<u8>>,
    /// `-f` / `! -f` (IPv4 only): `Some(true)` matches second and later fragments only.
    pub fragment: Option<bool>,
    /// `-m` matches, in written order.
    pub matches: MatchList,
    /// `-j` / `-g`.
    pub target: Target,
    /// `[p:b]` or `-c p b` counters given in the text, if any.
    pub counters: Option<Counters>,
    /// Where the rule's first token was written.
    pub location: Location,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            src: None,
            dst: None,
            in_iface: None,
            out_iface: None,
            protocol: None,
            fragment: None,
            matches: MatchList::new(),
            target: Target::None,
            counters: None,
            location: Location::default(),
        }
    }
}

impl Rule {
    /// Whether two rules have the same content: every field but where they were written
    /// (`location`) and the counters given in the text (an inserted line moves every later
    /// rule's location, which must not make them "changed"). Two rules with the same content
    /// validate and compile alike in the same chain.
    pub fn same_content(&self, other: &Rule) -> bool {
        // Cheap inline fields first; `matches` (behind a pointer) last.
        self.src == other.src
            && self.dst == other.dst
            && self.protocol == other.protocol
            && self.fragment == other.fragment
            && self.in_iface == other.in_iface
            && self.out_iface == other.out_iface
            && self.target == other.target
            && self.matches == other.matches
    }
}

/// The longest common prefix and, of what follows it, the longest common suffix of `old` and
/// `new` (by [`Rule::same_content`]): `(prefix, old_mid, new_mid)` with `old_mid`/`new_mid`
/// the lengths of what differs. A chunk both lists share at the same place ([`RuleList`]) is
/// taken as equal without reading it, so a list edited from a clone of another is diffed in
/// time proportional to its chunks plus the changed rules. `unchanged(i, rule)` is called for
/// rules of `new` found equal to their counterparts (prefix in order, then suffix from the
/// end), while they are in cache: every one compared rule by rule and, of a shared chunk, at
/// least those that jump, go to a chain or match a set (what validation must see again).
pub(crate) fn diff_rules(
    old: &RuleList,
    new: &RuleList,
    unchanged: impl FnMut(usize, &Rule),
) -> (u32, u32, u32) {
    rules::diff(old, new, unchanged)
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault, Hash};

    use super::*;

    #[test]
    fn match_list_behaves_as_its_slice() {
        let ms: Vec<Match> = (0..4).map(|i| Match::Comment(format!("c{i}"))).collect();
        let hash = |x: &dyn Fn(&mut rustc_hash::FxHasher)| {
            let mut h = BuildHasherDefault::<rustc_hash::FxHasher>::default().build_hasher();
            x(&mut h);
            std::hash::Hasher::finish(&h)
        };
        for n in 0..=ms.len() {
            let mut list = MatchList::new();
            for m in &ms[..n] {
                list.push(m.clone());
            }
            assert_eq!(list.as_slice(), &ms[..n]);
            assert_eq!(list, MatchList::from(ms[..n].to_vec()));
            assert_eq!(list, ms[..n].iter().cloned().collect::<MatchList>());
            assert_eq!(list.clone().into_iter().collect::<Vec<_>>(), &ms[..n]);
            assert_eq!(format!("{list:?}"), format!("{:?}", ms[..n].to_vec()));
            assert_eq!(
                hash(&|h| list.hash(h)),
                hash(&|h| ms[..n].to_vec().hash(h)),
                "{n} matches"
            );
            if n > 0 {
                assert_ne!(list, MatchList::from(ms[..n - 1].to_vec()));
            }
            list.clear();
            assert!(list.is_empty());
        }
    }
}
