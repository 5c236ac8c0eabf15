//! The IP-header matches (ttl, hl, tos, dscp, ecn, ah, frag, rt, ipv6header): parsed with
//! iptables 1.8.9's grammar, printed as `iptables-legacy-save` 1.8.9 printed each rule below
//! (recorded by hand with iptables-legacy-restore / -save), refused where iptables refuses,
//! and enforced on packets parsed from bytes, in the linear walk and the compiled index alike.

use std::sync::Arc;

use vallum_engine::model::{Family, Hook};
use vallum_engine::packet::parse::parse_ip;
use vallum_engine::packet::{Packet, PacketMeta};
use vallum_engine::restore::parse_ruleset;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};

use crate::support::one_rule;
use one_rule::{opts, printed};

/// (family, as written, as iptables-legacy-save 1.8.9 prints it).
const SAVE_FORMS: &[(Family, &str, &str)] = &[
    (Family::Ipv4, "-m ttl --ttl-lt 3", "-m ttl --ttl-lt 3"),
    (Family::Ipv4, "-m ttl ! --ttl-eq 64", "-m ttl ! --ttl-eq 64"),
    (Family::Ipv6, "-m hl ! --hl-eq 255", "-m hl ! --hl-eq 255"),
    (Family::Ipv6, "-m hl --hl-gt 42", "-m hl --hl-gt 42"),
    (
        Family::Ipv4,
        "-m tos ! --tos Minimize-Cost",
        "-m tos ! --tos 0x02/0x3f",
    ),
    (Family::Ipv6, "-m tos --tos 3", "-m tos --tos 0x03/0xff"),
    (
        Family::Ipv6,
        "-m dscp ! --dscp-class AF41",
        "-m dscp ! --dscp 0x22",
    ),
    (
        Family::Ipv4,
        "-p tcp -m ecn ! --ecn-tcp-cwr --ecn-ip-ect 2 --ecn-tcp-ece",
        "-p tcp -m ecn --ecn-tcp-ece ! --ecn-tcp-cwr --ecn-ip-ect 2",
    ),
    (
        Family::Ipv4,
        "-m ecn ! --ecn-ip-ect 0",
        "-m ecn ! --ecn-ip-ect 0",
    ),
    (Family::Ipv4, "-p 51 -m ah", "-p ah -m ah"),
    (Family::Ipv4, "-p ah --ahspi 3:3", "-p ah -m ah --ahspi 3"),
    (
        Family::Ipv6,
        "-m ipv6header --header hop-by-hop,dst,route,frag,auth,esp,none,protocol",
        "-m ipv6header --header hop-by-hop,ipv6-opts,ipv6-route,ipv6-frag,ah,esp,ipv6-nonxt,protocol",
    ),
    (
        Family::Ipv6,
        "-m ipv6header ! --header 60,0 --soft",
        "-m ipv6header ! --header hop-by-hop,ipv6-opts --soft",
    ),
    (
        Family::Ipv6,
        "-m ipv6header --header ipv6-frag,255",
        "-m ipv6header --header ipv6-frag,protocol",
    ),
    (
        Family::Ipv6,
        "-m rt --rt-type 0 --rt-segsleft 0",
        "-m rt --rt-type 0 --rt-segsleft 0",
    ),
    (
        Family::Ipv6,
        "-m rt ! --rt-type 0 --rt-len 16",
        "-m rt ! --rt-type 0 --rt-len 16",
    ),
    (Family::Ipv6, "-m rt --rt-segsleft :", "-m rt"),
    (
        Family::Ipv6,
        "-m rt --rt-type 0 --rt-0-not-strict --rt-0-addrs ::1,::2 --rt-0-res",
        "-m rt --rt-type 0 --rt-0-res --rt-0-addrs ::1,::2 --rt-0-not-strict",
    ),
    (
        Family::Ipv6,
        "-m frag --fraglen 8 --fragmore",
        "-m frag --fraglen 8 --fragmore",
    ),
    (Family::Ipv6, "-m frag --fragid :", "-m frag"),
];

#[test]
fn prints_as_iptables_save() {
    for (family, rule, want) in SAVE_FORMS {
        let got = printed(*family, rule).unwrap_or_else(|e| panic!("{rule}: {e}"));
        assert_eq!(&got, want, "{rule}");
        // And the printed form reads back to itself.
        assert_eq!(&printed(*family, want).expect("re-parse"), want);
    }
}

#[test]
fn negated_whole_ranges_keep_their_negation() {
    // iptables-legacy-save 1.8.9 drops the `!` (printing a never-matching rule as one that
    // matches everything); iptables 1.8.11 and we keep it.
    assert_eq!(
        printed(Family::Ipv4, "-p ah -m ah ! --ahspi :").as_deref(),
        Ok("-p ah -m ah ! --ahspi 0:4294967295")
    );
    assert_eq!(
        printed(Family::Ipv6, "-m rt ! --rt-segsleft 0:").as_deref(),
        Ok("-m rt ! --rt-segsleft 0:4294967295")
    );
}

#[test]
fn refused_as_iptables_refuses() {
    let bad: &[(Family, &str, &str)] = &[
        (Family::Ipv4, "-m ttl ! --ttl-lt 3", "cannot be inverted"),
        (
            Family::Ipv6,
            "-m hl --hl-lt 3 --hl-eq 4",
            "cannot be used together",
        ),
        (Family::Ipv4, "-m ttl --ttl-eq 256", "out of range"),
        (Family::Ipv4, "-m ecn", "at least one option"),
        (Family::Ipv4, "-m ecn --ecn-ip-ect 4", "out of range (0-3)"),
        (Family::Ipv4, "-m ecn --ecn-tcp-cwr", "tcp"),
        (Family::Ipv6, "-m ipv6header --soft", "--header"),
        (
            Family::Ipv6,
            "-m ipv6header --header 7",
            "unknown header `7'",
        ),
        (Family::Ipv6, "-m rt --rt-0-not-strict", "required before"),
        (
            Family::Ipv6,
            "-m frag --fraglast --fragmore",
            "cannot be used together",
        ),
        (Family::Ipv6, "-m frag ! --fragres", "cannot be inverted"),
        (Family::Ipv4, "-m ah --ahspi 1", "ah"),
        (Family::Ipv4, "-p ah -m ah --ahspi 4:3", "invalid range"),
        (
            Family::Ipv4,
            "-m ttl --ttl-eq 1 --hops 2",
            "no option '--hops'",
        ),
        (Family::Ipv4, "-m hl --hl-eq 1", "Couldn't load match"),
        (Family::Ipv6, "-m ttl --ttl-eq 1", "Couldn't load match"),
        (Family::Ipv4, "-m dscp --dscp 0x40", "out of range"),
    ];
    for (family, rule, want) in bad {
        match printed(*family, rule) {
            Ok(p) => panic!("{rule}: accepted as {p}"),
            Err(e) => assert!(e.contains(want), "{rule}: {e}"),
        }
    }
}

/// An IPv4 TCP SYN from 192.0.2.1 to 198.51.100.1:80 with the given TTL and TOS byte.
fn ipv4_tcp(ttl: u8, tos: u8, tcp_flags: u8) -> Vec<u8> {
    let mut b = vec![
        0x45, tos, 0, 40, 0, 1, 0, 0, ttl, 6, 0, 0, 192, 0, 2, 1, 198, 51, 100, 1,
    ];
    b.extend_from_slice(&[
        0x9c, 0x40, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, tcp_flags, 0xff, 0xff,
    ]);
    b.extend_from_slice(&[0, 0, 0, 0]);
    b
}

/// An IPv4 AH packet (12-byte header, then nothing) with the given SPI.
fn ipv4_ah(spi: u32) -> Vec<u8> {
    let mut b = vec![
        0x45, 0, 0, 32, 0, 1, 0, 0, 64, 51, 0, 0, 192, 0, 2, 1, 198, 51, 100, 1,
    ];
    b.extend_from_slice(&[59, 1, 0, 0]);
    b.extend_from_slice(&spi.to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, 1]);
    b
}

/// An IPv6 UDP packet 2001:db8::1 -> 2001:db8::2 port 53 behind `ext` (each entry: header
/// type, then its bytes without the next-header byte, which is filled in).
fn ipv6_udp(hop_limit: u8, tclass: u8, ext: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (i, (_, bytes)) in ext.iter().enumerate() {
        payload.push(ext.get(i + 1).map_or(17, |e| e.0));
        payload.extend_from_slice(bytes);
    }
    payload.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
    let first = ext.first().map_or(17, |e| e.0);
    let mut b = vec![
        0x60 | (tclass >> 4),
        tclass << 4,
        0,
        0,
        0,
        payload.len() as u8,
        first,
        hop_limit,
    ];
    b.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    b.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    b.extend_from_slice(&payload);
    b
}

/// A type-`t` routing header with `segs` segments left (8 bytes + 16 per address).
fn routing(t: u8, segs: u8, addrs: u8) -> (u8, Vec<u8>) {
    let mut v = vec![2 * addrs, t, segs, 0, 0, 0, 0];
    v.extend(std::iter::repeat_n(0, 16 * usize::from(addrs)));
    (43, v)
}

/// A fragment header: offset (8-byte units), M flag, identification.
fn fragment(offset: u16, more: bool, id: u32) -> (u8, Vec<u8>) {
    let w = (offset << 3) | u16::from(more);
    let mut v = vec![0];
    v.extend_from_slice(&w.to_be_bytes());
    v.extend_from_slice(&id.to_be_bytes());
    (44, v)
}

fn hop_by_hop() -> (u8, Vec<u8>) {
    (0, vec![0, 1, 4, 0, 0, 0, 0])
}

/// Which INPUT rule (1-based) each packet hits first, `0` for the policy, in both
/// classifiers; they must agree.
fn first_hits(family: Family, rules: &[&str], packets: &[Vec<u8>]) -> Vec<usize> {
    let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for r in rules {
        text.push_str(&format!("-A INPUT {r} -j DROP\n"));
    }
    text.push_str("COMMIT\n");
    let rs = Arc::new(parse_ruleset("t", &text, &opts(family)).expect("parses"));
    let mut out = Vec::new();
    let index = Classifier::TupleMerge {
        min_rules: 1,
        batch_min_bytes: 0,
        rfc_min_rules: 1,
        rfc_max_rules: 1000,
    };
    let snaps: Vec<Snapshot> = [Classifier::Linear, index]
        .into_iter()
        .map(|c| {
            Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, c).expect("compiles")
        })
        .collect();
    for bytes in packets {
        let base = Packet::from(PacketMeta {
            hook: Hook::Input,
            ..PacketMeta::default()
        });
        let p = parse_ip(bytes, base).expect("packet parses");
        let mut hits = Vec::new();
        for s in &snaps {
            let t = s.trace(&p, 0);
            let hit = t.steps.first().and_then(|st| st.rule).unwrap_or(0) as usize;
            let mut p2 = p;
            let v = crate::support::classify_one(s, 0, &mut p2, 0, &mut Vec::new());
            assert_eq!(v == Verdict::Drop, hit != 0, "verdict and trace agree");
            hits.push(hit);
        }
        assert_eq!(hits[0], hits[1], "linear and index agree on {bytes:02x?}");
        out.push(hits[0]);
    }
    out
}

#[test]
fn ipv4_header_fields_are_enforced() {
    let rules = [
        "-m ttl --ttl-lt 2",
        "-m tos --tos 0x10/0x3f",
        "-m dscp --dscp-class EF",
        "-p tcp -m ecn --ecn-tcp-ece ! --ecn-tcp-cwr",
        "-m ecn --ecn-ip-ect 3",
        "-m ttl ! --ttl-eq 64",
    ];
    let packets = [
        ipv4_tcp(1, 0, 0x02),
        ipv4_tcp(64, 0x10, 0x02),
        ipv4_tcp(64, 0x12, 0x02),
        ipv4_tcp(64, 0x50, 0x02),
        ipv4_tcp(64, 0xb8, 0x02),
        ipv4_tcp(64, 0, 0x42),
        ipv4_tcp(64, 0, 0xc2),
        ipv4_tcp(64, 0x03, 0x02),
        ipv4_tcp(63, 0, 0x02),
        ipv4_tcp(64, 0, 0x02),
    ];
    assert_eq!(
        first_hits(Family::Ipv4, &rules, &packets),
        [1, 2, 0, 2, 3, 4, 0, 5, 6, 0]
    );
}

#[test]
fn ah_spi_is_enforced() {
    let rules = ["-p ah -m ah --ahspi 256:300", "-p ah -m ah ! --ahspi 7"];
    let packets = [ipv4_ah(256), ipv4_ah(7), ipv4_ah(8)];
    assert_eq!(first_hits(Family::Ipv4, &rules, &packets), [1, 0, 2]);
    // The 12-byte AH header must be there (ah_mt would hotdrop).
    assert!(parse_ip(&ipv4_ah(1)[..28], Packet::default()).is_err());
}

#[test]
fn ipv6_extension_headers_are_enforced() {
    let rules = [
        "-m rt --rt-type 0 --rt-segsleft 1:5",
        "-m rt --rt-type 2 --rt-len 24",
        "-m frag --fragid 7 --fragfirst --fragmore",
        "-m frag --fraglast ! --fragid 7",
        "-m ipv6header --header hop-by-hop,protocol",
        "-m ipv6header ! --header hop-by-hop --soft -m hl --hl-eq 1",
        "-m dscp --dscp 0x2e",
    ];
    let packets = [
        ipv6_udp(64, 0, &[routing(0, 2, 1)]),
        ipv6_udp(64, 0, &[routing(0, 0, 1)]),
        ipv6_udp(64, 0, &[routing(2, 1, 1)]),
        ipv6_udp(64, 0, &[fragment(0, true, 7)]),
        ipv6_udp(64, 0, &[fragment(0, true, 8)]),
        ipv6_udp(64, 0, &[fragment(4, false, 9)]),
        ipv6_udp(64, 0, &[hop_by_hop()]),
        ipv6_udp(1, 0, &[hop_by_hop(), fragment(0, false, 7)]),
        ipv6_udp(1, 0, &[]),
        ipv6_udp(64, 0xb8, &[]),
        ipv6_udp(64, 0, &[]),
    ];
    assert_eq!(
        first_hits(Family::Ipv6, &rules, &packets),
        [1, 0, 2, 3, 0, 4, 5, 0, 6, 7, 0]
    );
}
