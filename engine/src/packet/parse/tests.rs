//! Tests of the header parser: built packets (etherparse `PacketBuilder`), cut and padded
//! lengths, fragments, IPv6 extension headers, ICMP errors, and proptests that no input panics.

use super::*;
use crate::model::{Hook, tcp_flags};
use crate::packet::IfName;
use etherparse::{IpNumber, PacketBuilder, TcpOptionElement};
use proptest::prelude::*;

const SMAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const DMAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn base() -> Packet {
    Packet {
        meta: PacketMeta {
            hook: Hook::Input,
            mark: 7,
            // Stale header values in base must not leak into the result.
            sport: 999,
            icmp_type: 99,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new("eth0").unwrap(),
            ..PacketFacts::default()
        },
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
        assert!(m.facts.has_tcp_option(kind), "kind {kind}");
    }
    assert!(!m.facts.has_tcp_option(8));
    assert_eq!(m.len, 20 + 32 + 10);
    assert_eq!(m.facts.src_mac, Some(SMAC));
    assert_eq!(
        (m.mark, m.hook, m.facts.in_iface.as_str()),
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
    assert_eq!(m.facts.src_mac, None);
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
    let t = m.facts.embedded.expect("embedded header");
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
    assert_eq!((m.icmp_type, m.facts.embedded), (3, None));
    // An echo request is not an error: nothing embedded, even with a payload that looks
    // like an IP header. A stale `embedded` in `base` does not leak through.
    let mut echo = Vec::new();
    PacketBuilder::ipv4([10, 0, 0, 9], [10, 0, 0, 2], 64)
        .icmpv4_echo_request(1, 1)
        .write(&mut echo, &about[..28])
        .unwrap();
    let mut stale = base();
    stale.facts.embedded = m.facts.embedded.or(Some(t));
    assert_eq!(parse_ip(&echo, stale).unwrap().facts.embedded, None);
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
    let t = parse_ip(&ttl, base()).unwrap().facts.embedded.unwrap();
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
    let t = m.facts.embedded.expect("embedded header");
    assert_eq!((t.protocol, t.sport, t.dport), (6, 40000, 443));
    assert_eq!(t.src, "2001:db8::1".parse::<IpAddr>().unwrap());
    assert_eq!(t.dst, "2001:db8::2".parse::<IpAddr>().unwrap());
    // Neighbour solicitation (135) is not an error.
    let ns = ipv6_raw(58, &[], &[135, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(parse_ip(&ns, base()).unwrap().facts.embedded, None);
    // The embedded header cut inside its extension header: no tuple.
    let mut short = vec![1, 4, 0, 0, 0, 0, 0, 0];
    short.extend_from_slice(&about[..44]);
    let m = parse_ip(&ipv6_raw(58, &[], &short), base()).unwrap();
    assert_eq!((m.icmp_type, m.facts.embedded), (1, None));
}

/// Real ICMP port-unreachable errors from `../shared/data/pcap/tcpreplay-test.pcap`
/// (SOURCES.md): 172.16.11.12 answers DNS replies from 172.16.11.1:53 with type 3 code 3,
/// embedding the reply's IPv4 and UDP headers (checked by hand with a hex dump).
#[test]
#[ignore = "needs ../shared/data"]
fn icmp_errors_of_a_real_capture() {
    let path = std::env::var_os("VALLUM_SHARED_DATA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data")
        })
        .join("pcap/tcpreplay-test.pcap");
    let Ok(bytes) = std::fs::read(&path) else {
        panic!("real ICMP errors: cannot read {}", path.display());
    };
    let caps = crate::packet::pcap::read_capture(&bytes).unwrap();
    let errors: Vec<Packet> = caps
        .iter()
        .filter_map(|c| c.parse(Packet::default()).ok())
        .filter(|m| m.protocol == 1 && m.icmp_type == 3)
        .collect();
    assert_eq!(errors.len(), 6);
    let dns = "172.16.11.1".parse::<IpAddr>().unwrap();
    let host = "172.16.11.12".parse::<IpAddr>().unwrap();
    let mut ports = Vec::new();
    for m in &errors {
        assert_eq!((m.src, m.dst, m.icmp_code), (host, dns, 3));
        let t = m.facts.embedded.expect("embedded header");
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
    assert_eq!(m.facts.src_mac, Some([1, 2, 3, 4, 5, 6]));
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
        assert_eq!(m.facts.embedded, None, "{what}");
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
        assert_eq!(m.facts.embedded, None, "{what}");
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
    assert!(m.facts.has_tcp_option(1));
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
                (
                    m.l4_cut,
                    (m.sport, m.dport),
                    m.tcp_flags,
                    m.facts.tcp_options
                ),
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
        let _ = parse_ethernet(&bytes, Packet::default());
        let _ = parse_ip(&bytes, Packet::default());
        let _ = parse_linux_sll(&bytes, Packet::default());
    }

    #[test]
    fn ip_looking_bytes_never_panic(
        v6 in any::<bool>(),
        mut bytes in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        if let Some(b) = bytes.first_mut() {
            *b = if v6 { 0x60 } else { 0x45 };
        }
        let _ = parse_ip(&bytes, Packet::default());
    }
}
