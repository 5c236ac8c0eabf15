//! Header parsing: Ethernet / raw IP bytes to [`PacketMeta`], with etherparse underneath.
//!
//! All entry points take untrusted bytes and never panic: every header is read through an
//! etherparse `*Slice::from_slice` constructor (which checks the length first) or through
//! `slice::get`. Nothing here allocates, formats or logs, so it can run on the packet path; the
//! error is the two-byte [`PacketError`].
//!
//! # Lax lengths, strict headers
//!
//! Capture files are often cut at a snap length, and Ethernet pads short frames. So the layer-3
//! length fields are trusted for [`PacketMeta::len`] (what the kernel counts, what `-m length`
//! sees) but the bytes actually present bound what is read: an IPv4 total length or IPv6 payload
//! length larger than the buffer is accepted (snaplen truncation), one smaller than the buffer
//! trims it (padding). This is the lax model of etherparse's `LaxSlicedPacket`, done by hand
//! because iptables semantics differ from it in two places: the IPv4 protocol is the header's own
//! (an AH header is not skipped, as `-p` reads `iph->protocol`), and for a first fragment the
//! transport header is read (etherparse skips every fragmented payload; the kernel matches ports
//! on offset 0).
//!
//! # What the kernel reads, and what we require
//!
//! iptables matches do not parse a packet; each reads the fixed bytes it needs from the start of
//! the transport header with `skb_header_pointer` and, when they are not there, sets
//! `par->hotdrop`: the packet is dropped on the spot, the rule's counter does not move. Nothing
//! checks a type-specific length. From the kernel sources (net/netfilter/xt_tcpudp.c,
//! xt_multiport.c, net/ipv4/netfilter/ip_tables.c, net/ipv6/netfilter/ip6_tables.c):
//!
//! | match                    | function                    | bytes read                      |
//! |--------------------------|-----------------------------|---------------------------------|
//! | `-m tcp`                 | `tcp_mt`                    | 20 (`struct tcphdr`); the options only for `--tcp-option` |
//! | `-m udp` (UDP, UDP-Lite) | `udp_mt`                    | 8 (`struct udphdr`)             |
//! | `-m multiport`           | `multiport_mt`              | 4 (the two ports)               |
//! | `-m icmp`                | `icmp_match`                | 8 (`struct icmphdr`)            |
//! | `-m icmp6`               | `icmp6_match`               | 8 (`struct icmp6hdr`)           |
//!
//! On a non-first fragment (`par->fragoff != 0`) every one of them is false without reading
//! anything, except that `tcp_mt` hotdrops an IPv4 fragment at offset 1 (8 bytes: "evil TCP
//! offset=1 frag", it could overwrite the flags of the first).
//!
//! So an ICMP timestamp request with 100 bytes of payload, an echo request with an odd-length
//! payload or an information request is matched on its type and code like any ICMP message.
//! etherparse's `Icmpv4Slice::from_slice` refuses a timestamp message (type 13/14, code 0) that
//! is not exactly 20 bytes, so the ICMPv4 header is read from its first 8 bytes directly;
//! `Icmpv6Slice::from_slice` only asks for 8 bytes and is used as is.
//!
//! A transport header shorter than its protocol's (TCP: 20 bytes and its options, as
//! `TcpSlice::from_slice` wants them; UDP, UDP-Lite, ICMP, ICMPv6: 8; SCTP, DCCP: the 4 port
//! bytes, all `multiport` reads) is not an error: the packet parses with
//! [`PacketMeta::l4_cut`] set to the bytes present (and the ports, TCP flags and ICMP type that
//! lie within them), and the evaluator drops it at the first match that reads a missing byte,
//! on the linear path, as the kernel's hotdrop (rules before it count; see `compile.rs`). What
//! is required, unless the packet is a non-first fragment: the IP header and IPv6 extension
//! headers ([`PacketError::Truncated`] otherwise; the caller drops the packet, NFQUEUE, or
//! skips it, captures). A TCP data offset below 5 and an IPv4 TCP fragment at offset 1 are
//! [`PacketError::Malformed`].
//!
//! Checksums are not verified (captures often carry offloaded, unfilled checksums).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2Slice, Icmpv6Slice, IpAuthHeaderSlice, Ipv4HeaderSlice,
    Ipv6FragmentHeaderSlice, Ipv6HeaderSlice, Ipv6RawExtHeaderSlice, LinuxSllProtocolType,
    LinuxSllSlice, SingleVlanSlice, TcpSlice, UdpSlice,
};

use crate::conntrack::Tuple;
use crate::conntrack::tuple::is_icmp_error;
use crate::model::Family;
use crate::model::ipv6_ext;
use crate::packet::{FragmentHeader, Ipv6Ext, Packet, PacketFacts, PacketMeta, RoutingHeader};

/// Why bytes could not be turned into a [`Packet`]. Tiny and `Copy`: the packet path
/// returns it without allocating or formatting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum PacketError {
    /// The bytes end inside a header the classifier needs: link, IP or IPv6 extension header
    /// (a cut transport header is [`PacketMeta::l4_cut`], not an error).
    #[error("packet truncated inside a header")]
    Truncated,
    /// A header field is impossible: IPv4 IHL < 5 or total length shorter than the header,
    /// an IP version nibble that does not match the link-layer protocol, a TCP data offset
    /// below 5, an IPv4 TCP fragment at offset 1 (8 bytes).
    #[error("malformed packet header")]
    Malformed,
    /// The frame carries something other than IPv4 or IPv6 (ARP, LLDP, an unknown version).
    #[error("not an IPv4 or IPv6 packet")]
    NotIp,
}

/// IP protocol numbers this module reads a transport header for.
mod proto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const DCCP: u8 = 33;
    pub const ICMPV6: u8 = 58;
    pub const SCTP: u8 = 132;
    pub const UDPLITE: u8 = 136;
    // IPv6 extension headers that ipv6_find_hdr() skips.
    pub const HOPOPTS: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const AUTH: u8 = 51;
    pub const DSTOPTS: u8 = 60;
    // Where ip6t_ipv6header's walk ends besides an upper-layer protocol.
    pub const ESP: u8 = 50;
    pub const NONE: u8 = 59;
    /// IPv4 `-p ah` (the same number as [`AUTH`]).
    pub const AH: u8 = 51;
}

/// Parses an Ethernet II frame (without FCS), skipping any number of 802.1Q / 802.1ad / QinQ
/// (0x8100, 0x88A8, 0x9100) tags, into a [`Packet`].
///
/// `base` supplies what is not in the bytes (hook, interfaces, mark, ct_state); every header
/// field of the result is taken from the frame, `src_mac` from the Ethernet source.
pub fn parse_ethernet(frame: &[u8], base: Packet) -> Result<Packet, PacketError> {
    let eth = Ethernet2Slice::from_slice_without_fcs(frame).map_err(|_| PacketError::Truncated)?;
    let mut ether_type = eth.ether_type();
    let mut rest = eth.payload_slice();
    // Each tag consumes 4 bytes, so this loop ends.
    while matches!(
        ether_type,
        EtherType::VLAN_TAGGED_FRAME
            | EtherType::PROVIDER_BRIDGING
            | EtherType::VLAN_DOUBLE_TAGGED_FRAME
    ) {
        let vlan = SingleVlanSlice::from_slice(rest).map_err(|_| PacketError::Truncated)?;
        ether_type = vlan.ether_type();
        rest = vlan.payload_slice();
    }
    let mut packet = parse_ether_payload(ether_type, rest, base)?;
    packet.facts.src_mac = Some(eth.source());
    Ok(packet)
}

/// The network (IP) packet an Ethernet frame carries, past any VLAN tags and cut to the IP
/// length (Ethernet padding dropped), as the kernel's skb holds it at the netfilter hooks and
/// `-m string` searches it; `None` when the frame holds no complete IP header.
pub fn network_packet(frame: &[u8]) -> Option<&[u8]> {
    let eth = Ethernet2Slice::from_slice_without_fcs(frame).ok()?;
    let mut ether_type = eth.ether_type();
    let mut rest = eth.payload_slice();
    while matches!(
        ether_type,
        EtherType::VLAN_TAGGED_FRAME
            | EtherType::PROVIDER_BRIDGING
            | EtherType::VLAN_DOUBLE_TAGGED_FRAME
    ) {
        let vlan = SingleVlanSlice::from_slice(rest).ok()?;
        ether_type = vlan.ether_type();
        rest = vlan.payload_slice();
    }
    ip_packet(rest)
}

/// A raw IP packet cut to its IP length (IPv4 total length, IPv6 payload length + 40);
/// `None` when the header is incomplete.
pub fn ip_packet(bytes: &[u8]) -> Option<&[u8]> {
    let len = match bytes.first()? >> 4 {
        4 => usize::from(u16::from_be_bytes([*bytes.get(2)?, *bytes.get(3)?])),
        6 => 40 + usize::from(u16::from_be_bytes([*bytes.get(4)?, *bytes.get(5)?])),
        _ => return None,
    };
    Some(&bytes[..len.min(bytes.len())])
}

/// Parses a Linux "cooked" capture (SLL, pcap linktype 113) packet. `src_mac` is the SLL
/// sender address when it is a 6-byte (Ethernet) address, else `base.src_mac`.
pub fn parse_linux_sll(bytes: &[u8], base: Packet) -> Result<Packet, PacketError> {
    let sll = LinuxSllSlice::from_slice(bytes).map_err(|e| match e {
        etherparse::err::linux_sll::HeaderSliceError::Len(_) => PacketError::Truncated,
        etherparse::err::linux_sll::HeaderSliceError::Content(_) => PacketError::Malformed,
    })?;
    let ether_type = match sll.protocol_type() {
        LinuxSllProtocolType::EtherType(t) => t,
        _ => return Err(PacketError::NotIp),
    };
    let mut packet = parse_ether_payload(ether_type, sll.payload_slice(), base)?;
    if let Ok(mac) = <[u8; 6]>::try_from(sll.sender_address()) {
        packet.facts.src_mac = Some(mac);
    }
    Ok(packet)
}

/// Parses a raw IPv4 or IPv6 packet, choosing by the version nibble of the first byte.
/// `src_mac` is kept from `base`.
pub fn parse_ip(bytes: &[u8], base: Packet) -> Result<Packet, PacketError> {
    match bytes.first().map(|b| b >> 4) {
        None => Err(PacketError::Truncated),
        Some(4) => parse_ipv4(bytes, base),
        Some(6) => parse_ipv6(bytes, base),
        Some(_) => Err(PacketError::NotIp),
    }
}

/// Dispatches on an Ethernet protocol number; the IP version nibble must agree with it.
fn parse_ether_payload(
    ether_type: EtherType,
    bytes: &[u8],
    base: Packet,
) -> Result<Packet, PacketError> {
    let want = match ether_type {
        EtherType::IPV4 => 4,
        EtherType::IPV6 => 6,
        _ => return Err(PacketError::NotIp),
    };
    match bytes.first().map(|b| b >> 4) {
        None => Err(PacketError::Truncated),
        Some(v) if v != want => Err(PacketError::Malformed),
        Some(_) => parse_ip(bytes, base),
    }
}

/// The layer-3 fields common to both families, before the transport header is read.
struct Layer3<'a> {
    family: Family,
    src: IpAddr,
    dst: IpAddr,
    protocol: u8,
    /// Non-first fragment.
    fragment: bool,
    /// Layer-3 length in bytes (header field, not the buffer length).
    len: u32,
    /// TTL / hop limit.
    ttl: u8,
    /// TOS byte / traffic class.
    tos: u8,
    /// IPv6 extension headers.
    ipv6_ext: Ipv6Ext,
    /// Bytes after the IP (and IPv6 extension) headers that are present in the buffer.
    l4: &'a [u8],
}

fn parse_ipv4(bytes: &[u8], base: Packet) -> Result<Packet, PacketError> {
    use etherparse::err::ipv4::HeaderSliceError;
    let header = Ipv4HeaderSlice::from_slice(bytes).map_err(|e| match e {
        HeaderSliceError::Len(_) => PacketError::Truncated,
        HeaderSliceError::Content(_) => PacketError::Malformed,
    })?;
    let header_len = header.slice().len();
    let total_len = usize::from(header.total_len());
    if total_len < header_len {
        return Err(PacketError::Malformed);
    }
    // As tcp_mt's "evil TCP offset=1 frag": the kernel hotdrops it at any `-m tcp`.
    let offset = header.fragments_offset().value();
    if offset == 1 && header.protocol().0 == proto::TCP {
        return Err(PacketError::Malformed);
    }
    // Lax: a total length beyond the buffer is snaplen truncation; read what is there.
    let end = total_len.min(bytes.len());
    let l4 = bytes.get(header_len..end).unwrap_or(&[]);
    finish(
        Layer3 {
            family: Family::Ipv4,
            src: IpAddr::V4(Ipv4Addr::from(header.source())),
            dst: IpAddr::V4(Ipv4Addr::from(header.destination())),
            protocol: header.protocol().0,
            fragment: offset != 0,
            len: u32::from(header.total_len()),
            ttl: header.ttl(),
            tos: (header.dcp().value() << 2) | header.ecn().value(),
            ipv6_ext: Ipv6Ext::default(),
            l4,
        },
        base,
    )
}

fn parse_ipv6(bytes: &[u8], base: Packet) -> Result<Packet, PacketError> {
    use etherparse::err::ipv6::HeaderSliceError;
    let header = Ipv6HeaderSlice::from_slice(bytes).map_err(|e| match e {
        HeaderSliceError::Len(_) => PacketError::Truncated,
        HeaderSliceError::Content(_) => PacketError::Malformed,
    })?;
    let payload_len = usize::from(header.payload_length());
    let after_header = bytes.get(etherparse::Ipv6Header::LEN..).unwrap_or(&[]);
    // Payload length 0 with bytes following is a jumbogram (RFC 2675): the buffer is the packet.
    let (payload, len) = if payload_len == 0 && !after_header.is_empty() {
        (after_header, bytes.len())
    } else {
        let present = payload_len.min(after_header.len());
        (
            after_header.get(..present).unwrap_or(&[]),
            payload_len + etherparse::Ipv6Header::LEN,
        )
    };
    let mut ipv6_ext = Ipv6Ext::default();
    let (protocol, fragment, l4) =
        skip_ipv6_extensions(header.next_header().0, payload, &mut ipv6_ext)?;
    finish(
        Layer3 {
            family: Family::Ipv6,
            src: IpAddr::V6(Ipv6Addr::from(header.source())),
            dst: IpAddr::V6(Ipv6Addr::from(header.destination())),
            protocol,
            fragment,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            ttl: header.hop_limit(),
            tos: header.traffic_class(),
            ipv6_ext,
            l4,
        },
        base,
    )
}

/// Walks IPv6 extension headers as the kernel's `ipv6_find_hdr(.., target = -1, ..)` does for
/// ip6tables `-p`: hop-by-hop, routing, destination options and AH are skipped wherever they
/// appear; at a fragment header with a non-zero offset the walk stops and the fragment header's
/// next-header value is the protocol (the rest is not a header). Returns (protocol, non-first
/// fragment, bytes after the headers).
///
/// On the way it records in `ext` what `-m ipv6header`, `-m rt` and `-m frag` read: the
/// header bits as ip6t_ipv6header's walk sets them (`PROTO` when the walk ends at an
/// upper-layer protocol, `NONE` at next header 59, `ESP` where ESP starts), and the first
/// routing and fragment headers. After a non-first fragment the kernel's ipv6header walk would
/// read the fragment's payload as headers when the fragment header names an extension header;
/// here the walk ends at such a fragment and only `PROTO` (or `NONE`/`ESP`) is added.
fn skip_ipv6_extensions<'b>(
    mut next: u8,
    mut rest: &'b [u8],
    ext: &mut Ipv6Ext,
) -> Result<(u8, bool, &'b [u8]), PacketError> {
    let end_bits = |next: u8| match next {
        proto::NONE => ipv6_ext::NONE,
        proto::ESP => ipv6_ext::ESP,
        _ => ipv6_ext::PROTO,
    };
    // Every extension header is at least 8 bytes, so this loop ends.
    loop {
        match next {
            proto::HOPOPTS | proto::ROUTING | proto::DSTOPTS => {
                let h =
                    Ipv6RawExtHeaderSlice::from_slice(rest).map_err(|_| PacketError::Truncated)?;
                let bytes = h.slice();
                ext.mask |= match next {
                    proto::HOPOPTS => ipv6_ext::HOPOPTS,
                    proto::ROUTING => ipv6_ext::ROUTING,
                    _ => ipv6_ext::DSTOPTS,
                };
                if next == proto::ROUTING && ext.routing.is_none() {
                    if let [_, _, rt_type, segments_left, ..] = *bytes {
                        ext.routing = Some(RoutingHeader {
                            rt_type,
                            segments_left,
                            len: bytes.len() as u16,
                        });
                    }
                }
                next = h.next_header().0;
                rest = rest.get(bytes.len()..).unwrap_or(&[]);
            }
            proto::FRAGMENT => {
                let frag = Ipv6FragmentHeaderSlice::from_slice(rest)
                    .map_err(|_| PacketError::Truncated)?;
                ext.mask |= ipv6_ext::FRAGMENT;
                next = frag.next_header().0;
                rest = rest.get(frag.slice().len()..).unwrap_or(&[]);
                // The offset is the top 13 bits of bytes 2..4. Read by hand: etherparse 0.16's
                // `fragment_offset()` mixes in the low flag bits (M=1 reads as offset 1).
                let (reserved, offset_flags, id) = match *frag.slice() {
                    [_, r, hi, lo, a, b, c, d, ..] => (
                        r,
                        u16::from_be_bytes([hi, lo]),
                        u32::from_be_bytes([a, b, c, d]),
                    ),
                    _ => (0, 0, 0),
                };
                if ext.fragment.is_none() {
                    ext.fragment = Some(FragmentHeader {
                        id,
                        offset_flags,
                        reserved,
                    });
                }
                if offset_flags >> 3 != 0 {
                    ext.mask |= end_bits(next);
                    return Ok((next, true, rest));
                }
            }
            proto::AUTH => {
                let auth = IpAuthHeaderSlice::from_slice(rest).map_err(|e| match e {
                    etherparse::err::ip_auth::HeaderSliceError::Len(_) => PacketError::Truncated,
                    etherparse::err::ip_auth::HeaderSliceError::Content(_) => {
                        PacketError::Malformed
                    }
                })?;
                ext.mask |= ipv6_ext::AH;
                next = auth.next_header().0;
                rest = rest.get(auth.slice().len()..).unwrap_or(&[]);
            }
            _ => {
                ext.mask |= end_bits(next);
                return Ok((next, false, rest));
            }
        }
    }
}

/// Reads the transport header (unless a non-first fragment) and builds the result.
fn finish(l3: Layer3<'_>, base: Packet) -> Result<Packet, PacketError> {
    let mut packet = Packet {
        meta: PacketMeta {
            family: l3.family,
            src: l3.src,
            dst: l3.dst,
            protocol: l3.protocol,
            fragment: l3.fragment,
            sport: 0,
            dport: 0,
            tcp_flags: 0,
            icmp_type: 0,
            icmp_code: 0,
            len: l3.len,
            ttl: l3.ttl,
            tos: l3.tos,
            ..base.meta
        },
        facts: PacketFacts {
            tcp_options: [0; 4],
            ah_spi: 0,
            ipv6_ext: l3.ipv6_ext,
            embedded: None,
            ..base.facts
        },
    };
    if l3.fragment {
        return Ok(packet);
    }
    let Packet { meta, facts } = &mut packet;
    let l4 = l3.l4;
    match (l3.protocol, l3.family) {
        (proto::TCP, _) => match TcpSlice::from_slice(l4) {
            Ok(tcp) => {
                meta.sport = tcp.source_port();
                meta.dport = tcp.destination_port();
                // Byte 13 of the header, as xt_tcpudp reads it (CWR and ECE included).
                meta.tcp_flags = tcp.header_slice().get(13).copied().unwrap_or(0);
                facts.tcp_options = tcp_option_kinds(tcp.options());
            }
            Err(etherparse::err::tcp::HeaderSliceError::Content(_)) => {
                return Err(PacketError::Malformed);
            }
            // Shorter than 20 bytes or than its data offset says (at most 60).
            Err(etherparse::err::tcp::HeaderSliceError::Len(_)) => {
                cut(meta, l4);
                if let Some(&flags) = l4.get(13) {
                    meta.tcp_flags = flags;
                }
            }
        },
        // As udp_mt, which serves UDP-Lite too: the 8-byte header, its length field not checked.
        (proto::UDP | proto::UDPLITE, _) => match UdpSlice::from_slice_lax(l4) {
            Ok(udp) => {
                meta.sport = udp.source_port();
                meta.dport = udp.destination_port();
            }
            Err(_) => cut(meta, l4),
        },
        // As ah_mt: the 12-byte `struct ip_auth_hdr`, of which `-m ah` reads the SPI.
        (proto::AH, Family::Ipv4) => {
            let [_, _, _, _, a, b, c, d, _, _, _, _, ..] = *l4 else {
                return Err(PacketError::Truncated);
            };
            facts.ah_spi = u32::from_be_bytes([a, b, c, d]);
        }
        // Only multiport reads these: the two ports.
        (proto::SCTP | proto::DCCP, _) => cut(meta, l4),
        (proto::ICMP, Family::Ipv4) => {
            // As icmp_match: the 8-byte `struct icmphdr`, whatever the type (not
            // `Icmpv4Slice::from_slice`, which wants a timestamp message to be exactly 20 bytes).
            let [icmp_type, icmp_code, _, _, _, _, _, _, payload @ ..] = l4 else {
                meta.l4_cut = Some(l4.len() as u8);
                return Ok(packet);
            };
            meta.icmp_type = *icmp_type;
            meta.icmp_code = *icmp_code;
            if is_icmp_error(proto::ICMP, meta.icmp_type) {
                facts.embedded = embedded_ipv4(payload);
            }
        }
        (proto::ICMPV6, Family::Ipv6) => match Icmpv6Slice::from_slice(l4) {
            Ok(icmp) => {
                meta.icmp_type = icmp.type_u8();
                meta.icmp_code = icmp.code_u8();
                if is_icmp_error(proto::ICMPV6, meta.icmp_type) {
                    facts.embedded = embedded_ipv6(icmp.payload());
                }
            }
            Err(_) => meta.l4_cut = Some(l4.len() as u8),
        },
        _ => {}
    }
    Ok(packet)
}

/// The ports of a transport header (its first 4 bytes), or, when they are cut too, nothing;
/// for SCTP and DCCP (whose header we read only the ports of) a complete 4 bytes is not a cut.
/// Marks the cut ([`PacketMeta::l4_cut`]) otherwise. Called only with fewer bytes than the
/// protocol's header (at most 60 for TCP), so the count fits a `u8`.
fn cut(meta: &mut PacketMeta, l4: &[u8]) {
    if let Some(&[a, b, c, d]) = l4.get(..4).and_then(|p| <&[u8; 4]>::try_from(p).ok()) {
        meta.sport = u16::from_be_bytes([a, b]);
        meta.dport = u16::from_be_bytes([c, d]);
        if matches!(meta.protocol, proto::SCTP | proto::DCCP) {
            return;
        }
    }
    meta.l4_cut = Some(l4.len().min(usize::from(u8::MAX)) as u8);
}

/// The tuple of the IPv4 header (and the start of its transport header) that an ICMP error
/// embeds after its 8-byte header, as nf_conntrack's `icmp_error_message` reads it: addresses
/// and protocol from the IP header, then TCP/UDP ports (the first 4 bytes; RFC 792 guarantees
/// 8) or the ICMP type and code (other protocols: no ports, as the tracker keys them). `None` when the IP header is incomplete or
/// malformed, the embedded packet is a non-first fragment, or the ports / ICMP header are cut
/// off. The embedded header's lengths and checksum are not checked (it is usually truncated).
fn embedded_ipv4(bytes: &[u8]) -> Option<Tuple> {
    let h = Ipv4HeaderSlice::from_slice(bytes).ok()?;
    if h.fragments_offset().value() != 0 {
        return None;
    }
    embedded_tuple(
        IpAddr::V4(Ipv4Addr::from(h.source())),
        IpAddr::V4(Ipv4Addr::from(h.destination())),
        h.protocol().0,
        bytes.get(h.slice().len()..)?,
    )
}

/// As [`embedded_ipv4`] for the IPv6 header an ICMPv6 error embeds (RFC 4443: as much of the
/// packet as fits), skipping extension headers as [`skip_ipv6_extensions`] does.
fn embedded_ipv6(bytes: &[u8]) -> Option<Tuple> {
    let h = Ipv6HeaderSlice::from_slice(bytes).ok()?;
    let rest = bytes.get(etherparse::Ipv6Header::LEN..)?;
    let (protocol, fragment, l4) =
        skip_ipv6_extensions(h.next_header().0, rest, &mut Ipv6Ext::default()).ok()?;
    if fragment {
        return None;
    }
    embedded_tuple(
        IpAddr::V6(Ipv6Addr::from(h.source())),
        IpAddr::V6(Ipv6Addr::from(h.destination())),
        protocol,
        l4,
    )
}

/// The tuple of an embedded header whose layer-4 bytes start at `l4`.
fn embedded_tuple(src: IpAddr, dst: IpAddr, protocol: u8, l4: &[u8]) -> Option<Tuple> {
    let (sport, dport) = match protocol {
        // Ports only where the tracker keys flows by them (`Tuple::from_packet`): SCTP, DCCP
        // and UDP-Lite flows are tracked generically (no ports), so their errors must be too.
        proto::TCP | proto::UDP => match l4 {
            [a, b, c, d, ..] => (u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d])),
            _ => return None,
        },
        // The tracker's ICMP convention: sport 0, dport `type << 8 | code`.
        proto::ICMP | proto::ICMPV6 => match l4 {
            [ty, code, ..] => (0, u16::from_be_bytes([*ty, *code])),
            _ => return None,
        },
        _ => (0, 0),
    };
    Some(Tuple {
        src,
        dst,
        protocol,
        sport,
        dport,
    })
}

/// The set of TCP option kinds present, walked as the kernel's `tcp_find_option` does: kinds 0
/// (EOL) and 1 (NOP) are one byte, every other kind is skipped by its length byte (a zero or
/// missing length counts as 1). The walk does not stop at EOL, as the kernel's does not.
fn tcp_option_kinds(options: &[u8]) -> [u64; 4] {
    let mut set = [0u64; 4];
    let mut i = 0usize;
    while let Some(&kind) = options.get(i) {
        set[usize::from(kind / 64)] |= 1u64 << (kind % 64);
        i += if kind < 2 {
            1
        } else {
            match options.get(i + 1) {
                Some(&0) | None => 1,
                Some(&n) => usize::from(n),
            }
        };
    }
    set
}

#[cfg(test)]
mod tests;
