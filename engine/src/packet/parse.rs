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
use crate::packet::{FragmentHeader, Ipv6Ext, PacketMeta, RoutingHeader};

/// Why bytes could not be turned into a [`PacketMeta`]. Tiny and `Copy`: the packet path
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
/// (0x8100, 0x88A8, 0x9100) tags, into a [`PacketMeta`].
///
/// `base` supplies what is not in the bytes (hook, interfaces, mark, ct_state); every header
/// field of the result is taken from the frame, `src_mac` from the Ethernet source.
pub fn parse_ethernet(frame: &[u8], base: PacketMeta) -> Result<PacketMeta, PacketError> {
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
    let meta = parse_ether_payload(ether_type, rest, base)?;
    Ok(PacketMeta {
        src_mac: Some(eth.source()),
        ..meta
    })
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
pub fn parse_linux_sll(bytes: &[u8], base: PacketMeta) -> Result<PacketMeta, PacketError> {
    let sll = LinuxSllSlice::from_slice(bytes).map_err(|e| match e {
        etherparse::err::linux_sll::HeaderSliceError::Len(_) => PacketError::Truncated,
        etherparse::err::linux_sll::HeaderSliceError::Content(_) => PacketError::Malformed,
    })?;
    let ether_type = match sll.protocol_type() {
        LinuxSllProtocolType::EtherType(t) => t,
        _ => return Err(PacketError::NotIp),
    };
    let meta = parse_ether_payload(ether_type, sll.payload_slice(), base)?;
    let src_mac = match <[u8; 6]>::try_from(sll.sender_address()) {
        Ok(mac) => Some(mac),
        Err(_) => base.src_mac,
    };
    Ok(PacketMeta { src_mac, ..meta })
}

/// Parses a raw IPv4 or IPv6 packet, choosing by the version nibble of the first byte.
/// `src_mac` is kept from `base`.
pub fn parse_ip(bytes: &[u8], base: PacketMeta) -> Result<PacketMeta, PacketError> {
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
    base: PacketMeta,
) -> Result<PacketMeta, PacketError> {
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

fn parse_ipv4(bytes: &[u8], base: PacketMeta) -> Result<PacketMeta, PacketError> {
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

fn parse_ipv6(bytes: &[u8], base: PacketMeta) -> Result<PacketMeta, PacketError> {
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
fn finish(l3: Layer3<'_>, base: PacketMeta) -> Result<PacketMeta, PacketError> {
    let mut meta = PacketMeta {
        family: l3.family,
        src: l3.src,
        dst: l3.dst,
        protocol: l3.protocol,
        fragment: l3.fragment,
        sport: 0,
        dport: 0,
        tcp_flags: 0,
        tcp_options: [0; 4],
        icmp_type: 0,
        icmp_code: 0,
        len: l3.len,
        ttl: l3.ttl,
        tos: l3.tos,
        ah_spi: 0,
        ipv6_ext: l3.ipv6_ext,
        embedded: None,
        ..base
    };
    if l3.fragment {
        return Ok(meta);
    }
    let l4 = l3.l4;
    match (l3.protocol, l3.family) {
        (proto::TCP, _) => match TcpSlice::from_slice(l4) {
            Ok(tcp) => {
                meta.sport = tcp.source_port();
                meta.dport = tcp.destination_port();
                // Byte 13 of the header, as xt_tcpudp reads it (CWR and ECE included).
                meta.tcp_flags = tcp.header_slice().get(13).copied().unwrap_or(0);
                meta.tcp_options = tcp_option_kinds(tcp.options());
            }
            Err(etherparse::err::tcp::HeaderSliceError::Content(_)) => {
                return Err(PacketError::Malformed);
            }
            // Shorter than 20 bytes or than its data offset says (at most 60).
            Err(etherparse::err::tcp::HeaderSliceError::Len(_)) => {
                cut(&mut meta, l4);
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
            Err(_) => cut(&mut meta, l4),
        },
        // As ah_mt: the 12-byte `struct ip_auth_hdr`, of which `-m ah` reads the SPI.
        (proto::AH, Family::Ipv4) => {
            let [_, _, _, _, a, b, c, d, _, _, _, _, ..] = *l4 else {
                return Err(PacketError::Truncated);
            };
            meta.ah_spi = u32::from_be_bytes([a, b, c, d]);
        }
        // Only multiport reads these: the two ports.
        (proto::SCTP | proto::DCCP, _) => cut(&mut meta, l4),
        (proto::ICMP, Family::Ipv4) => {
            // As icmp_match: the 8-byte `struct icmphdr`, whatever the type (not
            // `Icmpv4Slice::from_slice`, which wants a timestamp message to be exactly 20 bytes).
            let [icmp_type, icmp_code, _, _, _, _, _, _, payload @ ..] = l4 else {
                meta.l4_cut = Some(l4.len() as u8);
                return Ok(meta);
            };
            meta.icmp_type = *icmp_type;
            meta.icmp_code = *icmp_code;
            if is_icmp_error(proto::ICMP, meta.icmp_type) {
                meta.embedded = embedded_ipv4(payload);
            }
        }
        (proto::ICMPV6, Family::Ipv6) => match Icmpv6Slice::from_slice(l4) {
            Ok(icmp) => {
                meta.icmp_type = icmp.type_u8();
                meta.icmp_code = icmp.code_u8();
                if is_icmp_error(proto::ICMPV6, meta.icmp_type) {
                    meta.embedded = embedded_ipv6(icmp.payload());
                }
            }
            Err(_) => meta.l4_cut = Some(l4.len() as u8),
        },
        _ => {}
    }
    Ok(meta)
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
mod tests {
    use super::*;
    use crate::model::{Hook, tcp_flags};
    use crate::packet::IfName;
    use etherparse::{IpNumber, PacketBuilder, TcpOptionElement};
    use proptest::prelude::*;

    const SMAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const DMAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn base() -> PacketMeta {
        PacketMeta {
            hook: Hook::Input,
            in_iface: IfName::new("eth0").unwrap(),
            mark: 7,
            // Stale header values in base must not leak into the result.
            sport: 999,
            icmp_type: 99,
            ..PacketMeta::default()
        }
    }

    fn tcp_v4(payload_len: usize) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(SMAC, DMAC)
            .ipv4([192, 0, 2, 1], [198, 51, 100, 7], 64)
            .tcp(40000, 443, 1, 65535)
            .syn()
            .ece()
            .options(&[
                TcpOptionElement::MaximumSegmentSize(1460),
                TcpOptionElement::Noop,
                TcpOptionElement::WindowScale(7),
                TcpOptionElement::SelectiveAcknowledgementPermitted,
            ])
            .unwrap();
        let mut v = Vec::new();
        b.write(&mut v, &vec![0u8; payload_len]).unwrap();
        v
    }

    #[test]
    fn ipv4_tcp_with_options() {
        let frame = tcp_v4(10);
        let m = parse_ethernet(&frame, base()).unwrap();
        assert_eq!(m.family, Family::Ipv4);
        assert_eq!(m.src, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(m.dst, "198.51.100.7".parse::<IpAddr>().unwrap());
        assert_eq!((m.protocol, m.sport, m.dport), (6, 40000, 443));
        assert_eq!(m.tcp_flags, tcp_flags::SYN | 0x40);
        for kind in [1, 2, 3, 4] {
            assert!(m.has_tcp_option(kind), "kind {kind}");
        }
        assert!(!m.has_tcp_option(8));
        assert_eq!(m.len, 20 + 32 + 10);
        assert_eq!(m.src_mac, Some(SMAC));
        assert_eq!(
            (m.mark, m.hook, m.in_iface.as_str()),
            (7, Hook::Input, "eth0")
        );
        assert_eq!(m.icmp_type, 0);
        assert!(!m.fragment);
    }

    #[test]
    fn snaplen_truncated_payload_still_parses_and_keeps_header_length() {
        let frame = tcp_v4(100);
        let cut = &frame[..14 + 20 + 32 + 5];
        let m = parse_ethernet(cut, base()).unwrap();
        assert_eq!(m.len, 20 + 32 + 100);
        assert_eq!(m.dport, 443);
    }

    #[test]
    fn truncated_headers_are_errors() {
        let frame = tcp_v4(0);
        for cut in 0..14 + 20 {
            let r = parse_ethernet(&frame[..cut], base());
            assert_eq!(r, Err(PacketError::Truncated), "cut at {cut}");
        }
        // Inside the TCP header (32 bytes with options): parsed, the cut marked; the ports
        // once their 4 bytes are there.
        for cut in 14 + 20..14 + 20 + 32 {
            let m = parse_ethernet(&frame[..cut], base()).unwrap();
            let n = cut - 34;
            assert_eq!(m.l4_cut, Some(n as u8), "cut at {cut}");
            let ports = if n >= 4 { (40000, 443) } else { (0, 0) };
            assert_eq!((m.sport, m.dport), ports, "cut at {cut}");
        }
        assert_eq!(parse_ethernet(&frame, base()).unwrap().l4_cut, None);
    }

    #[test]
    fn ethernet_padding_is_ignored() {
        let mut v = Vec::new();
        PacketBuilder::ethernet2(SMAC, DMAC)
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(53, 5353)
            .write(&mut v, &[])
            .unwrap();
        v.resize(60, 0xAA);
        let m = parse_ethernet(&v, base()).unwrap();
        assert_eq!((m.protocol, m.sport, m.dport, m.len), (17, 53, 5353, 28));
    }

    #[test]
    fn vlan_tags_are_skipped() {
        let mut v = Vec::new();
        PacketBuilder::ethernet2(SMAC, DMAC)
            .double_vlan(
                etherparse::VlanId::try_new(100).unwrap(),
                etherparse::VlanId::try_new(200).unwrap(),
            )
            .ipv6(
                [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                [0xfe; 16],
                64,
            )
            .icmpv6_echo_request(1, 2)
            .write(&mut v, &[1, 2, 3])
            .unwrap();
        let m = parse_ethernet(&v, base()).unwrap();
        assert_eq!(m.family, Family::Ipv6);
        assert_eq!((m.protocol, m.icmp_type, m.icmp_code), (58, 128, 0));
        assert_eq!(m.len, 40 + 8 + 3);
    }

    #[test]
    fn icmpv4_type_and_code() {
        let mut v = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .icmpv4_raw(3, 4, [0; 4])
            .write(&mut v, &[])
            .unwrap();
        let m = parse_ip(&v, base()).unwrap();
        assert_eq!(
            (m.protocol, m.icmp_type, m.icmp_code, m.sport),
            (1, 3, 4, 0)
        );
        assert_eq!(m.src_mac, None);
    }

    #[test]
    fn icmpv4_error_embeds_the_header_it_is_about() {
        // The UDP datagram 10.0.0.2:5353 -> 10.0.0.9:53 the error is about: its IP header and
        // the first 8 bytes, as routers send them (RFC 792).
        let mut about = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 2], [10, 0, 0, 9], 64)
            .udp(5353, 53)
            .write(&mut about, &[0xAB; 20])
            .unwrap();
        let mut v = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 9], [10, 0, 0, 2], 64)
            .icmpv4_raw(3, 3, [0; 4])
            .write(&mut v, &about[..28])
            .unwrap();
        let m = parse_ip(&v, base()).unwrap();
        assert_eq!((m.icmp_type, m.icmp_code), (3, 3));
        let t = m.embedded.expect("embedded header");
        assert_eq!(
            (t.src, t.dst, t.protocol, t.sport, t.dport),
            (
                "10.0.0.2".parse::<IpAddr>().unwrap(),
                "10.0.0.9".parse::<IpAddr>().unwrap(),
                17,
                5353,
                53
            )
        );
        // Cut inside the embedded ports: no tuple (the tracker finds the error INVALID), but
        // the outer packet still parses.
        let mut cut = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 9], [10, 0, 0, 2], 64)
            .icmpv4_raw(3, 3, [0; 4])
            .write(&mut cut, &about[..22])
            .unwrap();
        let m = parse_ip(&cut, base()).unwrap();
        assert_eq!((m.icmp_type, m.embedded), (3, None));
        // An echo request is not an error: nothing embedded, even with a payload that looks
        // like an IP header. A stale `embedded` in `base` does not leak through.
        let mut echo = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 9], [10, 0, 0, 2], 64)
            .icmpv4_echo_request(1, 1)
            .write(&mut echo, &about[..28])
            .unwrap();
        let stale = PacketMeta {
            embedded: m.embedded.or(Some(t)),
            ..base()
        };
        assert_eq!(parse_ip(&echo, stale).unwrap().embedded, None);
        // Time exceeded about an echo request: the ICMP convention, dport = type << 8 | code.
        let mut ping = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 2], [192, 0, 2, 1], 1)
            .icmpv4_echo_request(7, 1)
            .write(&mut ping, &[])
            .unwrap();
        let mut ttl = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .icmpv4_raw(11, 0, [0; 4])
            .write(&mut ttl, &ping)
            .unwrap();
        let t = parse_ip(&ttl, base()).unwrap().embedded.unwrap();
        assert_eq!((t.protocol, t.sport, t.dport), (1, 0, 8 << 8));
    }

    #[test]
    fn icmpv6_error_embeds_the_header_it_is_about() {
        // TCP 2001:db8::1:40000 -> 2001:db8::2:443 behind a hop-by-hop header, inside a
        // packet-too-big (type 2).
        let mut tcp = vec![0u8; 20];
        tcp[..4].copy_from_slice(&[0x9c, 0x40, 0x01, 0xbb]);
        tcp[12] = 0x50;
        let about = ipv6_raw(0, &[6, 0, 1, 4, 0, 0, 0, 0], &tcp);
        let mut err = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
        err.extend_from_slice(&about);
        let m = parse_ip(&ipv6_raw(58, &[], &err), base()).unwrap();
        assert_eq!((m.protocol, m.icmp_type), (58, 2));
        let t = m.embedded.expect("embedded header");
        assert_eq!((t.protocol, t.sport, t.dport), (6, 40000, 443));
        assert_eq!(t.src, "2001:db8::1".parse::<IpAddr>().unwrap());
        assert_eq!(t.dst, "2001:db8::2".parse::<IpAddr>().unwrap());
        // Neighbour solicitation (135) is not an error.
        let ns = ipv6_raw(58, &[], &[135, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_ip(&ns, base()).unwrap().embedded, None);
        // The embedded header cut inside its extension header: no tuple.
        let mut short = vec![1, 4, 0, 0, 0, 0, 0, 0];
        short.extend_from_slice(&about[..44]);
        let m = parse_ip(&ipv6_raw(58, &[], &short), base()).unwrap();
        assert_eq!((m.icmp_type, m.embedded), (1, None));
    }

    /// Real ICMP port-unreachable errors from `../shared/data/pcap/tcpreplay-test.pcap`
    /// (SOURCES.md): 172.16.11.12 answers DNS replies from 172.16.11.1:53 with type 3 code 3,
    /// embedding the reply's IPv4 and UDP headers (checked by hand with a hex dump).
    #[test]
    fn icmp_errors_of_a_real_capture() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/pcap/tcpreplay-test.pcap");
        let Ok(bytes) = std::fs::read(&path) else {
            println!("SKIP real ICMP errors: cannot read {}", path.display());
            return;
        };
        let caps = crate::packet::pcap::read_capture(&bytes).unwrap();
        let errors: Vec<PacketMeta> = caps
            .iter()
            .filter_map(|c| c.parse(PacketMeta::default()).ok())
            .filter(|m| m.protocol == 1 && m.icmp_type == 3)
            .collect();
        assert_eq!(errors.len(), 6);
        let dns = "172.16.11.1".parse::<IpAddr>().unwrap();
        let host = "172.16.11.12".parse::<IpAddr>().unwrap();
        let mut ports = Vec::new();
        for m in &errors {
            assert_eq!((m.src, m.dst, m.icmp_code), (host, dns, 3));
            let t = m.embedded.expect("embedded header");
            assert_eq!((t.src, t.dst, t.protocol, t.sport), (dns, host, 17, 53));
            ports.push(t.dport);
        }
        assert_eq!(ports, [59368, 50282, 59925, 57238, 57238, 57360]);
    }

    /// An IPv6 header followed by `exts` (already chained) and `l4`.
    fn ipv6_raw(first_next: u8, exts: &[u8], l4: &[u8]) -> Vec<u8> {
        let mut v = vec![0x60, 0, 0, 0];
        v.extend_from_slice(&u16::try_from(exts.len() + l4.len()).unwrap().to_be_bytes());
        v.push(first_next);
        v.push(64);
        v.extend_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        v.extend_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        v.extend_from_slice(exts);
        v.extend_from_slice(l4);
        v
    }

    const UDP_53: [u8; 8] = [0x30, 0x39, 0, 53, 0, 8, 0, 0];

    #[test]
    fn ipv6_extension_headers_are_skipped() {
        // hop-by-hop (8 bytes) -> destination options (16 bytes) -> routing (8) -> UDP
        let mut exts = vec![60, 0, 1, 4, 0, 0, 0, 0];
        exts.extend_from_slice(&[43, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        exts.extend_from_slice(&[17, 0, 0, 0, 0, 0, 0, 0]);
        let pkt = ipv6_raw(0, &exts, &UDP_53);
        let m = parse_ip(&pkt, base()).unwrap();
        assert_eq!((m.protocol, m.sport, m.dport), (17, 12345, 53));
        assert_eq!(m.len, 40 + 32 + 8);
        assert!(!m.fragment);
        // cut inside the destination options header
        assert_eq!(
            parse_ip(&pkt[..40 + 12], base()),
            Err(PacketError::Truncated)
        );
    }

    #[test]
    fn ipv6_fragments() {
        // first fragment (offset 0, M=1): ports are read
        let first = [17, 0, 0x00, 0x01, 0, 0, 0, 9];
        let m = parse_ip(&ipv6_raw(44, &first, &UDP_53), base()).unwrap();
        assert_eq!((m.protocol, m.fragment, m.dport), (17, false, 53));
        // non-first fragment (offset 8 units): no ports, protocol from the fragment header
        let later = [17, 0, 0x00, 0x40, 0, 0, 0, 9];
        let m = parse_ip(&ipv6_raw(44, &later, &[1, 2, 3]), base()).unwrap();
        assert_eq!((m.protocol, m.fragment, m.sport, m.dport), (17, true, 0, 0));
    }

    #[test]
    fn ipv4_fragments_and_ah() {
        let mut v = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1000, 2000)
            .write(&mut v, &[0; 16])
            .unwrap();
        // non-first fragment: set offset 2 (16 bytes); header checksum is not checked
        let mut later = v.clone();
        later[6] = 0x00;
        later[7] = 0x02;
        let m = parse_ip(&later, base()).unwrap();
        assert_eq!((m.protocol, m.fragment, m.sport, m.dport), (17, true, 0, 0));
        // first fragment (MF set, offset 0): ports read
        let mut first = v.clone();
        first[6] = 0x20;
        let m = parse_ip(&first, base()).unwrap();
        assert_eq!((m.fragment, m.dport), (false, 2000));
        // AH is not skipped for IPv4: -p sees 51
        let mut ah = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .write(
                &mut ah,
                IpNumber(51),
                &[17, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0],
            )
            .unwrap();
        let m = parse_ip(&ah, base()).unwrap();
        assert_eq!((m.protocol, m.sport), (51, 0));
    }

    #[test]
    fn sctp_ports_and_other_protocols() {
        let mut v = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .write(&mut v, IpNumber(132), &[0x0b, 0xb8, 0x0f, 0xa0, 0, 0, 0, 0])
            .unwrap();
        let m = parse_ip(&v, base()).unwrap();
        assert_eq!((m.protocol, m.sport, m.dport), (132, 3000, 4000));
        let mut gre = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .write(&mut gre, IpNumber(47), &[])
            .unwrap();
        let m = parse_ip(&gre, base()).unwrap();
        assert_eq!((m.protocol, m.sport, m.len), (47, 0, 20));
    }

    #[test]
    fn not_ip_and_malformed() {
        let mut arp = vec![0u8; 42];
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(parse_ethernet(&arp, base()), Err(PacketError::NotIp));
        assert_eq!(parse_ip(&[0x50; 40], base()), Err(PacketError::NotIp));
        assert_eq!(parse_ip(&[], base()), Err(PacketError::Truncated));
        // IHL 4
        let mut bad = vec![0x44; 20];
        bad[2] = 0;
        bad[3] = 20;
        assert_eq!(parse_ip(&bad, base()), Err(PacketError::Malformed));
        // IPv6 bytes behind an IPv4 ether type
        let mut frame = vec![0u8; 14];
        frame[12] = 0x08;
        frame.extend_from_slice(&ipv6_raw(17, &[], &UDP_53));
        assert_eq!(parse_ethernet(&frame, base()), Err(PacketError::Malformed));
    }

    #[test]
    fn linux_sll() {
        let mut v = Vec::new();
        PacketBuilder::linux_sll(
            etherparse::LinuxSllPacketType::HOST,
            6,
            [1, 2, 3, 4, 5, 6, 0, 0],
        )
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .udp(1, 2)
        .write(&mut v, &[])
        .unwrap();
        let m = parse_linux_sll(&v, base()).unwrap();
        assert_eq!((m.protocol, m.dport), (17, 2));
        assert_eq!(m.src_mac, Some([1, 2, 3, 4, 5, 6]));
    }

    /// An IPv4 packet to 10.0.0.2 carrying protocol `protocol` with exactly `l4` after the
    /// header (total length and checksum right, as the kernel's ip_rcv wants them).
    fn ipv4_l4(protocol: u8, l4: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .write(&mut v, IpNumber(protocol), l4)
            .unwrap();
        v
    }

    /// ICMP `ty`/`code` with the rest of the 8-byte header zero and `extra` bytes after it.
    fn icmp(ty: u8, code: u8, extra: usize) -> Vec<u8> {
        let mut l4 = vec![ty, code, 0, 0, 0, 1, 0, 1];
        l4.resize(8 + extra, 0x5A);
        l4
    }

    /// As icmp_match: type and code from the 8-byte header, no type-specific length.
    #[test]
    fn icmpv4_of_any_length_is_read_like_the_kernel() {
        for (what, ty, code, extra) in [
            ("timestamp request, 100 bytes of payload", 13, 0, 100),
            ("timestamp request, header only", 13, 0, 0),
            ("timestamp request, 12 of 20 bytes", 13, 0, 4),
            ("timestamp reply, the usual 20 bytes", 14, 0, 12),
            ("timestamp reply, 21 bytes", 14, 0, 13),
            ("echo request, odd payload", 8, 0, 7),
            ("echo reply, 1 byte of payload", 0, 0, 1),
            ("information request", 15, 0, 0),
            ("information reply, padded", 16, 0, 3),
            ("address mask request", 17, 0, 4),
            ("unknown type 42 code 7", 42, 7, 5),
        ] {
            let pkt = ipv4_l4(1, &icmp(ty, code, extra));
            let m = parse_ip(&pkt, base()).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                (m.protocol, m.icmp_type, m.icmp_code, m.sport, m.dport),
                (1, ty, code, 0, 0),
                "{what}"
            );
            assert_eq!(m.len as usize, 20 + 8 + extra, "{what}");
            assert_eq!(m.embedded, None, "{what}");
        }
        // Fewer than the 8 bytes icmp_match reads: marked, the kernel hotdrops it at `-m icmp`.
        for cut in 0..8 {
            let pkt = ipv4_l4(1, &icmp(13, 0, 0)[..cut]);
            assert_eq!(parse_ip(&pkt, base()).unwrap().l4_cut, Some(cut as u8));
        }
        // A non-first fragment has no ICMP header to read: parsed, type 0.
        let mut later = ipv4_l4(1, &[0xAB; 3]);
        later[7] = 0x03;
        let m = parse_ip(&later, base()).unwrap();
        assert_eq!((m.fragment, m.icmp_type), (true, 0));
    }

    /// As icmp6_match: the 8-byte `struct icmp6hdr`, whatever the type.
    #[test]
    fn icmpv6_of_any_length_is_read_like_the_kernel() {
        for (what, ty, code, extra) in [
            ("echo request, odd payload", 128, 0, 7),
            ("echo reply, no payload", 129, 0, 0),
            ("neighbour solicitation without its target", 135, 0, 0),
            ("neighbour advertisement, 23 bytes", 136, 0, 15),
            ("router solicitation", 133, 0, 0),
            ("MLD query, odd length", 130, 0, 17),
            ("node information query", 139, 1, 9),
            ("parameter problem, nothing embedded", 4, 1, 0),
            ("unknown type 200", 200, 9, 3),
        ] {
            let pkt = ipv6_raw(58, &[], &icmp(ty, code, extra));
            let m = parse_ip(&pkt, base()).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                (m.protocol, m.icmp_type, m.icmp_code),
                (58, ty, code),
                "{what}"
            );
            assert_eq!(m.len as usize, 40 + 8 + extra, "{what}");
            assert_eq!(m.embedded, None, "{what}");
        }
        // Behind a hop-by-hop header, 7 bytes: too short for icmp6_match.
        let hbh = [58, 0, 1, 4, 0, 0, 0, 0];
        let m = parse_ip(&ipv6_raw(0, &hbh, &icmp(128, 0, 1)), base()).unwrap();
        assert_eq!((m.protocol, m.icmp_type), (58, 128));
        for cut in 0..8 {
            let pkt = ipv6_raw(0, &hbh, &icmp(128, 0, 0)[..cut]);
            assert_eq!(parse_ip(&pkt, base()).unwrap().l4_cut, Some(cut as u8));
        }
    }

    /// A TCP header of `len` bytes with data offset `doff` (words), ports 40000 -> 22, SYN.
    fn tcp_header(doff: u8, len: usize) -> Vec<u8> {
        let mut t = vec![
            0x9c,
            0x40,
            0,
            22,
            0,
            0,
            0,
            1,
            0,
            0,
            0,
            0,
            doff << 4,
            0x02,
            0xff,
            0xff,
        ];
        t.resize(len, 1); // NOP options past byte 20
        t
    }

    #[test]
    fn truncated_transport_headers_follow_the_kernel_reads() {
        // TCP: tcp_mt reads 20 bytes; with options we need them all (`--tcp-option`).
        let m = parse_ip(&ipv4_l4(6, &tcp_header(5, 20)), base()).unwrap();
        assert_eq!((m.sport, m.dport, m.tcp_flags), (40000, 22, tcp_flags::SYN));
        let m = parse_ip(&ipv4_l4(6, &tcp_header(6, 24)), base()).unwrap();
        assert!(m.has_tcp_option(1));
        assert_eq!(m.l4_cut, None);
        // Cut short: parsed, with the cut marked (the matches that read the missing bytes
        // hotdrop), the ports and TCP flags when their bytes are there.
        for (what, l4, cut, ports, flags) in [
            ("TCP, 3 bytes", tcp_header(5, 3), 3, (0, 0), 0),
            (
                "TCP, 14 bytes",
                tcp_header(5, 14),
                14,
                (40000, 22),
                tcp_flags::SYN,
            ),
            (
                "TCP, 19 bytes",
                tcp_header(5, 19),
                19,
                (40000, 22),
                tcp_flags::SYN,
            ),
            (
                "TCP options cut",
                tcp_header(8, 24),
                24,
                (40000, 22),
                tcp_flags::SYN,
            ),
            ("UDP, 4 bytes", UDP_53[..4].to_vec(), 4, (12345, 53), 0),
            ("UDP, 7 bytes", UDP_53[..7].to_vec(), 7, (12345, 53), 0),
        ] {
            for pkt in [
                ipv4_l4(l4_proto(what), &l4),
                ipv6_raw(l4_proto(what), &[], &l4),
            ] {
                let m = parse_ip(&pkt, base()).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(
                    (m.l4_cut, (m.sport, m.dport), m.tcp_flags, m.tcp_options),
                    (Some(cut), ports, flags, [0; 4]),
                    "{what}"
                );
            }
        }
        for pkt in [
            ipv4_l4(6, &tcp_header(4, 20)),
            ipv6_raw(6, &[], &tcp_header(4, 20)),
        ] {
            assert_eq!(
                parse_ip(&pkt, base()),
                Err(PacketError::Malformed),
                "doff 4"
            );
        }
        // UDP with a length field that lies (0, or beyond the packet): read as udp_mt does.
        let mut lying = UDP_53;
        lying[5] = 0;
        let m = parse_ip(&ipv4_l4(17, &lying), base()).unwrap();
        assert_eq!(m.dport, 53);
        lying[4] = 0xff;
        let m = parse_ip(&ipv6_raw(17, &[], &lying), base()).unwrap();
        assert_eq!(m.dport, 53);
        // UDP-Lite goes through udp_mt: 8 bytes. SCTP and DCCP: the 4 port bytes multiport reads.
        assert_eq!(
            parse_ip(&ipv4_l4(136, &UDP_53[..7]), base())
                .unwrap()
                .l4_cut,
            Some(7)
        );
        assert_eq!(parse_ip(&ipv4_l4(136, &UDP_53), base()).unwrap().dport, 53);
        for p in [132, 33] {
            let m = parse_ip(&ipv4_l4(p, &UDP_53[..4]), base()).unwrap();
            assert_eq!((m.dport, m.l4_cut), (53, None));
            assert_eq!(
                parse_ip(&ipv4_l4(p, &UDP_53[..3]), base()).unwrap().l4_cut,
                Some(3)
            );
        }
        // Non-first fragments read no transport header, however short.
        let later = [6, 0, 0x00, 0x10, 0, 0, 0, 9];
        let m = parse_ip(&ipv6_raw(44, &later, &[1]), base()).unwrap();
        assert_eq!((m.protocol, m.fragment, m.dport), (6, true, 0));
        // IPv4 TCP at fragment offset 1 (8 bytes): tcp_mt's "evil TCP offset=1 frag".
        let mut evil = ipv4_l4(6, &[0; 12]);
        evil[7] = 0x01;
        assert_eq!(parse_ip(&evil, base()), Err(PacketError::Malformed));
        let mut udp_at_1 = ipv4_l4(17, &[0; 12]);
        udp_at_1[7] = 0x01;
        assert!(parse_ip(&udp_at_1, base()).unwrap().fragment);
        // In IPv6 the offset is in bytes, so "offset 1" (8 bytes) is just a non-first fragment.
        let at_8 = [6, 0, 0x00, 0x08, 0, 0, 0, 9];
        assert!(
            parse_ip(&ipv6_raw(44, &at_8, &[0; 12]), base())
                .unwrap()
                .fragment
        );
    }

    fn l4_proto(what: &str) -> u8 {
        if what.starts_with("TCP") { 6 } else { 17 }
    }

    #[test]
    fn tcp_option_walk_matches_kernel() {
        // NOP, EOL, then kind 30 length 4, then kind 8 with zero length (counts as 1), kind 5
        let set = tcp_option_kinds(&[1, 0, 30, 4, 0, 0, 8, 0, 5]);
        let has = |k: u8| set[usize::from(k / 64)] & (1 << (k % 64)) != 0;
        assert!(has(1) && has(0) && has(30) && has(8) && has(5));
        assert!(!has(4) && !has(2));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_ethernet(&bytes, PacketMeta::default());
            let _ = parse_ip(&bytes, PacketMeta::default());
            let _ = parse_linux_sll(&bytes, PacketMeta::default());
        }

        #[test]
        fn ip_looking_bytes_never_panic(
            v6 in any::<bool>(),
            mut bytes in proptest::collection::vec(any::<u8>(), 0..120),
        ) {
            if let Some(b) = bytes.first_mut() {
                *b = if v6 { 0x60 } else { 0x45 };
            }
            let _ = parse_ip(&bytes, PacketMeta::default());
        }
    }
}
