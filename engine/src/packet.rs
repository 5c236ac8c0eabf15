//! Packets as the classifier sees them, parsed from Ethernet or raw IP bytes plus the metadata
//! that does not live in the bytes (hook, interfaces, mark, conntrack state), in two parts:
//!
//! - [`PacketMeta`], the hot part: what every packet needs (addresses, protocol, ports,
//!   lengths, flags, TTL/TOS, mark, conntrack state and mark), `Copy`, at most 64 bytes (a
//!   `const` assertion holds it). The batch copies and the index probe read only this.
//! - [`PacketFacts`], the cold part: what a few matches read (TCP options, IPv6 extension
//!   headers, AH SPI, interface names, bridge ports, source MAC, socket owner, conntrack zone,
//!   the kernel's NAT facts, kernel-decided facts, the tuple embedded in an ICMP error). A
//!   batch keeps them in a parallel array (`crate::engine::Batch::facts`), filled by the
//!   source with the hot part; the chain walk hands a packet's facts only to the matches and
//!   targets that use them, so a ruleset without them does not read that memory.
//!
//! [`Packet`] holds both, for code that handles one packet at a time (the parser's result,
//! log events, traces, tests).
//!
//! Interfaces are names in the cold part, not ids in the hot one: an id would need a name table
//! that every source and every snapshot agree on across commits (and `eth+` patterns still
//! compare names), while a name read costs the rules with `-i`/`-o` one more cache line per
//! packet (the facts entry, then L1 for the rest of the walk); `engine/BENCH_NOTES_32.md` has the
//! measurement.
//!
//! Parsing lives in [`parse`] (etherparse underneath), capture files in [`pcap`], generated
//! traffic in [`synth`]. The hot path never allocates.

use std::net::{IpAddr, Ipv4Addr};

use crate::conntrack::Tuple;
use crate::model::{Family, Hook, ct_state};

pub mod parse;
pub mod pcap;
pub mod synth;

/// An interface name stored inline (IFNAMSIZ = 16 bytes, at most 15 used), so packet metadata
/// stays `Copy` and allocation-free. The empty name means "no interface" (e.g. `-o` at INPUT).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IfName {
    bytes: [u8; 16],
    len: u8,
}

impl IfName {
    /// The empty name ("no interface").
    pub const EMPTY: IfName = IfName {
        bytes: [0; 16],
        len: 0,
    };

    /// An interface name; `None` when longer than 15 bytes.
    pub fn new(name: &str) -> Option<IfName> {
        let b = name.as_bytes();
        if b.len() > 15 {
            return None;
        }
        let mut bytes = [0u8; 16];
        bytes[..b.len()].copy_from_slice(b);
        Some(IfName {
            bytes,
            len: b.len() as u8,
        })
    }

    /// Whether this is the empty name ("no interface").
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        // Only ever built from a &str in `new`, so the bytes are valid UTF-8.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl std::fmt::Debug for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The hot part of one packet: what the classifier reads for every packet (the 5-tuple,
/// lengths, flags, TTL/TOS, mark, conntrack state), one cache line at most (a `const`
/// assertion below holds it to 64 bytes). What only a few matches read is in
/// [`PacketFacts`], kept beside it (module docs).
///
/// Shapes and units: addresses in host form, ports in host order, `len` is the layer-3 length
/// in bytes (IPv4 total length, IPv6 payload length + 40) as `-m length` and xt_counters use.
/// `sport`/`dport` are 0 and `tcp_flags` 0 when the protocol has no ports or the packet is a
/// non-first fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketMeta {
    /// IPv4 or IPv6.
    pub family: Family,
    /// The hook the packet is classified at.
    pub hook: Hook,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Layer-4 protocol number (after IPv6 extension headers).
    pub protocol: u8,
    /// A non-first fragment (no layer-4 header available), as `-f`.
    pub fragment: bool,
    /// TCP/UDP/SCTP/DCCP/UDP-Lite source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// TCP flags byte ([`crate::model::tcp_flags`]).
    pub tcp_flags: u8,
    /// ICMP / ICMPv6 type.
    pub icmp_type: u8,
    /// ICMP / ICMPv6 code.
    pub icmp_code: u8,
    /// Layer-3 length in bytes.
    pub len: u32,
    /// IPv4 TTL / IPv6 hop limit (`-m ttl`, `-m hl`); 64 by default.
    pub ttl: u8,
    /// IPv4 TOS byte / IPv6 traffic class: DSCP in the top 6 bits, ECN in the low 2 (`-m tos`,
    /// `-m dscp`, `-m ecn --ecn-ip-ect`).
    pub tos: u8,
    /// The packet mark (skb->mark): what the kernel queued the packet with, changed by
    /// `-j MARK` and `-j CONNMARK --restore-mark` as the rules run; what it is after the
    /// evaluation goes back to the kernel with the verdict (NFQUEUE mode).
    pub mark: u32,
    /// The mark of the packet's conntrack entry (ct->mark, `-m connmark`), as the engine's
    /// tracker holds it: set when the tracker finds the entry (0 for a new one), changed by
    /// `-j CONNMARK --set-xmark/--save-mark`, and written back to the entry after the verdict
    /// ([`crate::conntrack::Conntrack::set_mark`]). Meaningful only when the packet has an
    /// entry ([`PacketMeta::ct_state`] neither INVALID nor UNTRACKED).
    pub ct_mark: u32,
    /// The packet is in the reply direction of its conntrack entry (`--ctdir REPLY`): it
    /// matched the entry's reply tuple. Set by the tracker; false for the first packet.
    pub ct_reply: bool,
    /// Conntrack state as one [`ct_state`] bit (NEW when no tracker ran).
    pub ct_state: u8,
    /// `Some(n)` when the transport header is cut after `n` bytes, short of what the
    /// protocol's header holds (TCP: 20 bytes and its options; UDP, UDP-Lite, ICMP, ICMPv6:
    /// 8; SCTP, DCCP: the 4 port bytes). The fields that lie within the `n` bytes are set
    /// (ports from 4 bytes, TCP flags from 14), the others are 0. As the kernel's matches
    /// do, the first `-m tcp` / `udp` / `multiport` / `icmp` match that reads a missing byte
    /// drops the packet on the spot (a hotdrop: that rule's counter does not move, earlier
    /// rules still count), and conntrack finds it INVALID. `None` for a complete header, a
    /// non-first fragment and protocols without one.
    pub l4_cut: Option<u8>,
}

/// One cache line: the batch copies and the index probe read this struct for every packet.
const _: () = assert!(std::mem::size_of::<PacketMeta>() <= 64);

impl Default for PacketMeta {
    fn default() -> Self {
        PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Input,
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            protocol: 0,
            fragment: false,
            sport: 0,
            dport: 0,
            tcp_flags: 0,
            icmp_type: 0,
            icmp_code: 0,
            len: 0,
            ttl: 64,
            tos: 0,
            mark: 0,
            ct_mark: 0,
            ct_reply: false,
            ct_state: ct_state::NEW,
            l4_cut: None,
        }
    }
}

/// The cold part of one packet: parsed headers, kernel metadata and conntrack facts that only
/// some matches read (each field names them). A batch keeps them in an array beside its
/// [`PacketMeta`]s (same index); the chain walk reads a packet's facts only in those matches,
/// so a ruleset without them never touches this memory. `Default` is "nothing known": no
/// interfaces, no options, no socket, default zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketFacts {
    /// Input interface (empty at OUTPUT): `-i`, `-m addrtype --limit-iface-in`, `-m rpfilter`,
    /// `-m pkttype`.
    pub in_iface: IfName,
    /// Output interface (empty at PREROUTING and INPUT): `-o`,
    /// `-m addrtype --limit-iface-out`.
    pub out_iface: IfName,
    /// TCP option kinds present, as a 256-bit set (bit k of word k/64): `--tcp-option`.
    pub tcp_options: [u64; 4],
    /// The SPI of an IPv4 AH header (`-p ah`, read by `-m ah`); 0 otherwise.
    pub ah_spi: u32,
    /// IPv6 extension headers (all empty for IPv4): `-m ipv6header`, `-m frag`, `-m rt`.
    pub ipv6_ext: Ipv6Ext,
    /// Ethernet source address, when the packet came with a link-layer header (`-m mac`).
    pub src_mac: Option<[u8; 6]>,
    /// The bridge port a bridged packet came in on (its `in_iface` is then the bridge), empty
    /// when it did not cross a bridge: NFQUEUE's NFQA_IFINDEX_PHYSINDEV, which the kernel sends
    /// for packets br_netfilter hands to iptables. `-m physdev --physdev-in` reads it.
    pub phys_in: IfName,
    /// The bridge port a bridged packet goes out of, empty when it has none (it is delivered
    /// to the host, or not bridged): NFQA_IFINDEX_PHYSOUTDEV. A packet with either port set
    /// is a bridged one to `-m physdev`.
    pub phys_out: IfName,
    /// The uid and gid of the local socket that sent the packet (its file's fsuid / fsgid),
    /// `None` when it has none (forwarded, sent by the kernel): NFQUEUE's NFQA_UID / NFQA_GID,
    /// which the kernel sends only for a full socket with a file. `-m owner` reads it.
    pub owner: Option<(u32, u32)>,
    /// The conntrack zone a raw-table `-j CT` rule gave the packet (`Some` once a CT
    /// template is attached, even for zone 0), which the tracker keys its entry with
    /// ([`crate::model::CtZone`]); `None`: the default zone 0.
    pub ct_zone: Option<crate::model::CtZone>,
    /// The NAT bits of the kernel's conntrack entry for this packet: [`ct_state::SNAT`] when
    /// its status has IPS_SRC_NAT, [`ct_state::DNAT`] for IPS_DST_NAT (NFQUEUE mode reads them
    /// from `NFQA_CT`), 0 when the kernel did no NAT or nobody said. Only the kernel knows
    /// them (it does the NAT); the engine's own tracker decides the other states.
    /// `--ctstate SNAT` / `DNAT` read them, as xt_conntrack reads the status bits, for a
    /// tracked packet only (not when [`PacketMeta::ct_state`] is INVALID or UNTRACKED).
    pub ct_nat: u8,
    /// The original destination address and port (`None` for protocols without ports) of
    /// the kernel's own conntrack entry when the kernel DNATed the connection (NFQUEUE mode,
    /// `CTA_TUPLE_ORIG` in `NFQA_CT`; set only with [`ct_state::DNAT`] in `ct_nat`): the
    /// packet the engine sees is already translated, so its tracker's original destination
    /// is the translated one; `--ctorigdst` / `--ctorigdstport` read this one instead, as
    /// xt_conntrack reads the kernel's tuple. `None`: the engine's tuple decides.
    pub ct_orig_dst: Option<(IpAddr, Option<u16>)>,
    /// The kernel-decided matches that hold for this packet: bit `i` set when the kernel's
    /// steering found the expression of bit `i` true ([`crate::kernel_decided`]; NFQUEUE mode
    /// reads them from the facts field of the packet's mark). 0 from sources without them.
    pub kernel_facts: u32,
    /// For an ICMP/ICMPv6 error (destination unreachable, time exceeded, ...): the header
    /// embedded in it, as the packet the error is about was sent, in the tracker's
    /// [`Tuple`] form (ports, or ICMP `type << 8 | code`). `None` for other packets and for
    /// errors whose embedded header is missing, truncated or a non-first fragment; the tracker
    /// then finds such an error INVALID (as nf_conntrack's `icmp_error_message`).
    pub embedded: Option<Tuple>,
}

impl PacketFacts {
    /// Nothing known ([`PacketFacts::default`] as a constant).
    pub const NONE: PacketFacts = PacketFacts {
        in_iface: IfName::EMPTY,
        out_iface: IfName::EMPTY,
        tcp_options: [0; 4],
        ah_spi: 0,
        ipv6_ext: Ipv6Ext {
            mask: 0,
            routing: None,
            fragment: None,
        },
        src_mac: None,
        phys_in: IfName::EMPTY,
        phys_out: IfName::EMPTY,
        owner: None,
        ct_zone: None,
        ct_nat: 0,
        ct_orig_dst: None,
        kernel_facts: 0,
        embedded: None,
    };

    /// The output interface as the rules at `hook` see it: none at PREROUTING and INPUT (the
    /// kernel has not routed the packet there; a packet queued at FORWARD runs the
    /// PREROUTING chains first with its hook set to PREROUTING), else
    /// [`PacketFacts::out_iface`].
    pub fn out_iface_at(&self, hook: Hook) -> &IfName {
        match hook {
            Hook::Prerouting | Hook::Input => &IfName::EMPTY,
            _ => &self.out_iface,
        }
    }

    /// Whether the packet carries TCP option `kind`.
    pub fn has_tcp_option(&self, kind: u8) -> bool {
        self.tcp_options[usize::from(kind / 64)] & (1u64 << (kind % 64)) != 0
    }
}

/// One packet whole, hot part and facts together: what the parser returns, what log events and
/// traces carry, and how tests and tools that handle one packet at a time build one
/// (`Packet { meta: PacketMeta { .. }, facts: PacketFacts { .. } }`, or
/// `Packet::from(meta)` when no fact is known). A batch splits it into its two arrays.
/// Dereferences to its [`PacketMeta`], so `packet.dport` reads the hot part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Packet {
    /// The hot part.
    pub meta: PacketMeta,
    /// The cold part.
    pub facts: PacketFacts,
}

impl From<PacketMeta> for Packet {
    fn from(meta: PacketMeta) -> Packet {
        Packet {
            meta,
            facts: PacketFacts::default(),
        }
    }
}

/// A copy of `meta` with no facts known.
impl From<&PacketMeta> for Packet {
    fn from(meta: &PacketMeta) -> Packet {
        Packet::from(*meta)
    }
}

/// A copy.
impl From<&Packet> for Packet {
    fn from(packet: &Packet) -> Packet {
        *packet
    }
}

impl std::ops::Deref for Packet {
    type Target = PacketMeta;
    fn deref(&self) -> &PacketMeta {
        &self.meta
    }
}

impl std::ops::DerefMut for Packet {
    fn deref_mut(&mut self) -> &mut PacketMeta {
        &mut self.meta
    }
}

/// The IPv6 extension headers of a packet, as ip6tables' header matches see them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ipv6Ext {
    /// The headers present, as ip6t_ipv6header's walk finds them ([`crate::model::ipv6_ext`]
    /// bits; `PROTO` when an upper-layer header follows, `NONE` for next header 59, `ESP`
    /// ends the walk).
    pub mask: u8,
    /// The first routing header (`-m rt`, which finds it as `ipv6_find_hdr`).
    pub routing: Option<RoutingHeader>,
    /// The first fragment header (`-m frag`).
    pub fragment: Option<FragmentHeader>,
}

/// The fields of an IPv6 routing header that `-m rt` reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RoutingHeader {
    /// Routing type (0, 2, 4 for SRv6...).
    pub rt_type: u8,
    /// Segments left.
    pub segments_left: u8,
    /// Header length in bytes: `(Hdr Ext Len + 1) * 8`.
    pub len: u16,
}

/// The fields of an IPv6 fragment header that `-m frag` reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragmentHeader {
    /// Identification.
    pub id: u32,
    /// Bytes 2..4 in host order: the offset in the top 13 bits, 2 reserved bits, then M.
    pub offset_flags: u16,
    /// The reserved byte (byte 1).
    pub reserved: u8,
}
