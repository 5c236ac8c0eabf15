//! The `-m` matches: [`Match`], one variant per iptables extension, and the values each
//! holds (ports and flags, ICMP types, conntrack states, sets, marks, limits, IPv6 headers,
//! owner, addrtype), plus [`Opaque`] for an extension kept verbatim. Plain data, on both
//! paths; the compiler reads them on the commit path.

use std::net::IpAddr;

use super::{
    AddrRange, ConnlimitMatch, Family, HashlimitMatch, IpNet, Neg, PktType, PortRange, RecentMatch,
    RpfilterMatch, StringMatch,
};

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
    /// `-m physdev`: the bridge ports of a bridged packet ([`super::PhysdevMatch`]).
    Physdev(super::PhysdevMatch),
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
    /// `-m rpfilter`: a reverse-path route lookup of the source ([`crate::fib`] decides it
    /// from the node's routing view).
    Rpfilter(RpfilterMatch),
    /// `-m pkttype [!] --pkt-type TYPE`: the packet's link-layer class
    /// ([`crate::node_addrs::AddrFacts::pkt_class`] derives it).
    PktType(Neg<PktType>),
    /// `-m recent`: a named list of recently seen addresses ([`RecentMatch`]).
    Recent(RecentMatch),
    /// `-m hashlimit` with a packet rate: a token bucket per hash key ([`HashlimitMatch`]).
    Hashlimit(HashlimitMatch),
    /// `-m connlimit`: how many connections share the packet's masked address
    /// ([`ConnlimitMatch`]).
    Connlimit(ConnlimitMatch),
    /// `-m string`: a byte pattern in the packet ([`StringMatch`]; boxed, it holds up to 128
    /// bytes).
    String(Box<StringMatch>),
    /// `-m sctp`: ports and chunk types of an SCTP packet ([`super::SctpMatch`]; boxed, it
    /// holds a 256-bit chunk map).
    Sctp(Box<super::SctpMatch>),
    /// `-m u32`: tests on 4-byte words of the packet ([`super::U32Match`]).
    U32(Box<super::U32Match>),
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
            Match::Rpfilter(_) => "rpfilter",
            Match::PktType(_) => "pkttype",
            Match::Recent(_) => "recent",
            Match::Hashlimit(_) => "hashlimit",
            Match::Connlimit(_) => "connlimit",
            Match::String(_) => "string",
            Match::Sctp(_) => "sctp",
            Match::U32(_) => "u32",
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
    /// The IPv6 types the engine decides from the node's local table and the address bits
    /// (see [`crate::node_addrs`]); ANYCAST and UNREACHABLE need a route lookup it does not
    /// make.
    pub const DECIDED: u16 = UNSPEC | UNICAST | LOCAL | BROADCAST | MULTICAST;

    /// The IPv4 types the engine decides: all of them. `inet_dev_addr_type` gives the type of
    /// the local table's longest route (LOCAL, BROADCAST, ANYCAST, MULTICAST; UNICAST for a
    /// `unicast` route, an address no route holds, and a reject route, whose lookup fails),
    /// so BLACKHOLE, UNREACHABLE, PROHIBIT, THROW, NAT, XRESOLVE and UNSPEC never match.
    pub const DECIDED_V4: u16 = 0x0fff;

    /// The types the engine decides in `family`.
    pub fn decided(family: super::Family) -> u16 {
        match family {
            super::Family::Ipv4 => DECIDED_V4,
            super::Family::Ipv6 => DECIDED,
        }
    }

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
    /// Set name, at most 31 bytes (IPSET_MAXNAMELEN - 1), or an nft set's longer
    /// `FAMILY.TABLE.SET` ([`crate::sets::ipset::check_name`]).
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

impl MarkValue {
    /// `(old & !mask) ^ value`: what `--set-xmark VALUE/MASK` makes of `old`.
    pub fn apply(self, old: u32) -> u32 {
        (old & !self.mask) ^ self.value
    }
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
    /// The kernel's `avg` for this rate: `XT_LIMIT_SCALE` (10000) units of time between two
    /// packets, as libxt_limit computes it from the printed rate.
    pub fn kernel_avg(&self) -> u32 {
        let unit: u32 = match self.unit {
            RateUnit::Second => 10_000,
            RateUnit::Minute => 600_000,
            RateUnit::Hour => 36_000_000,
            RateUnit::Day => 864_000_000,
        };
        unit / self.rate.max(1)
    }

    /// xt_limit's `limit_mt_check` "Overflow, try lower": a burst of 0, or
    /// `user2credits(avg * burst) < user2credits(avg)` in the kernel's wrapping 32-bit
    /// arithmetic (`HZ * CREDITS_PER_JIFFY` is 32000 with `CONFIG_HZ` 250 and 1000). It refuses
    /// `1/day` with a burst of 4 or 5 and loads it with 5000, as the kernel does.
    pub fn kernel_overflows(&self) -> bool {
        const HZ_CPJ: u32 = 32_000;
        let credits = |user: u32| {
            if user > u32::MAX / HZ_CPJ {
                (user / 10_000).wrapping_mul(HZ_CPJ)
            } else {
                user * HZ_CPJ / 10_000
            }
        };
        let avg = self.kernel_avg();
        self.burst == 0 || credits(avg.wrapping_mul(self.burst)) < credits(avg)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// What this kernel (6.18, CONFIG_HZ 1000) answered with iptables-legacy-restore.
    #[test]
    fn limit_overflow_is_the_kernels() {
        let l = |rate, unit, burst| LimitMatch { rate, unit, burst };
        for (m, refused) in [
            (l(1, RateUnit::Day, 10_000), true),
            (l(1, RateUnit::Day, 5), true),
            (l(1, RateUnit::Day, 4), true),
            (l(1, RateUnit::Day, 5000), false),
            (l(1, RateUnit::Hour, 10_000), false),
            (l(1, RateUnit::Minute, 10_000), false),
            (l(1, RateUnit::Second, 5), false),
            (l(1, RateUnit::Second, 0), true),
        ] {
            assert_eq!(m.kernel_overflows(), refused, "{m:?}");
        }
    }
}
