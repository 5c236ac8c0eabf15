//! `-m string` against the Linux kernel: the same frames to the oracle's namespace
//! (`oracle/kernel.rs`) and through an [`Engine`] worker with the frames' IP bytes
//! (`EngineWorker::process` with the packets' bytes, as NFQUEUE hands them), both algorithms, `--from`/`--to` with a
//! pattern that ends at `to`, one that straddles it and one that starts before `from`,
//! `--icase`, `--hex-string` inverted, an offset past the packet's end. For every packet the
//! rules whose counters went up must be the kernel's.
//!
//! The kernel test needs root, `ip` and the `*tables-legacy*` tools: it is ignored unless asked
//! for (`-- --include-ignored`), and fails without them (the engine tests always run).
//!
//! Run: `cargo test -p vallum-engine --test it -- kernel_string:: --nocapture`.

// Shared with kernel_oracle.rs, which uses the parts this test does not.
#[allow(dead_code)]
use crate::oracle::kernel;

use std::net::IpAddr;
use std::sync::Arc;

use vallum_engine::Clock;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Batch, Change, Engine, EngineConfig};
use vallum_engine::model::tcp_flags::{ACK, PSH};
use vallum_engine::model::{Family, Hook, TableKind};
use vallum_engine::packet::parse::parse_ethernet;
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset, print};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;

use kernel::{FW_IFACE, FW_MAC, KernelHits, KernelOracle, PacketSpec, Proto, Setup, build_frame};

/// Ethernet header length: the frames' IP packet starts here.
const ETH: usize = 14;

/// Offsets are from the IPv4 header: 20 bytes of IP and 20 of TCP put the payload at 40.
const RULES: &str = "\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp -m tcp --dport 80 -m string --string \"GET /wp-login.php\" --algo kmp -j DROP
-A INPUT -p udp -m udp --dport 53 -m string --string \"tracker\" --algo bm -j DROP
-A INPUT -p tcp -m tcp --dport 81 -m string --string \"abc\" --algo bm --from 40 --to 45 -j DROP
-A INPUT -p tcp -m tcp --dport 82 -m string --string \"abc\" --algo kmp --from 40 --to 45 -j DROP
-A INPUT -p tcp -m tcp --dport 83 -m string --string \"HeLLo\" --algo bm --icase -j DROP
-A INPUT -p tcp -m tcp --dport 84 -m string ! --hex-string \"|00ff|\" --algo kmp -j DROP
-A INPUT -p tcp -m tcp --dport 85 -m string --string \"x\" --algo bm --from 100 -j DROP
-A INPUT -p tcp -m tcp --dport 86 -m string --string \"Ab\" --algo kmp --from 41 --to 43 --icase -j DROP
COMMIT
";

fn pkt(proto: Proto, dport: u16, payload: &[u8]) -> PacketSpec {
    PacketSpec {
        id: format!("{dport}:{}", String::from_utf8_lossy(payload)),
        proto,
        src: "198.51.100.7".parse::<IpAddr>().expect("address"),
        dst: "203.0.113.1".parse::<IpAddr>().expect("address"),
        sport: 40000,
        dport,
        flags: ACK | PSH,
        icmp_type: 0,
        icmp_code: 0,
        payload_len: 0,
        cut: None,
        ttl: 64,
        tos: 0,
        payload: Some(payload.to_vec()),
        ext: None,
    }
}

fn packets() -> Vec<PacketSpec> {
    use Proto::{Tcp, Udp};
    vec![
        pkt(Tcp, 80, b"GET /wp-login.php HTTP/1.1\r\n"),
        pkt(Tcp, 80, b"GET /wp-login.ph"),
        pkt(Tcp, 80, b"POST /x HTTP/1.1\r\n\r\nGET /wp-login.php"),
        pkt(
            Udp,
            53,
            b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07tracker\x03com\x00",
        ),
        pkt(Udp, 53, b"\x12\x34\x01\x00\x00\x01\x07tracke\x03com\x00"),
        // from 40 to 45: "abc" at 40..43 and 42..45 lie inside; at 43..46 it straddles `to`.
        pkt(Tcp, 81, b"abcxxxxx"),
        pkt(Tcp, 81, b"xxabcxxx"),
        pkt(Tcp, 81, b"xxxabcxx"),
        pkt(Tcp, 82, b"xxabcxxx"),
        pkt(Tcp, 82, b"xxxabcxx"),
        // Too short for the pattern.
        pkt(Tcp, 81, b"ab"),
        pkt(Tcp, 83, b"say hello!"),
        pkt(Tcp, 83, b"say HELL0"),
        pkt(Tcp, 84, b"\x01\x00\xff\x02"),
        pkt(Tcp, 84, b"\x01\x00\xfe\x02"),
        pkt(Tcp, 85, b"xxxxxxxx"),
        pkt(Tcp, 86, b"xaB"),
        pkt(Tcp, 86, b"xxaB"),
        // Starts before `from`.
        pkt(Tcp, 86, b"aBxx"),
    ]
}

struct Zero;

impl Clock for Zero {
    fn now_ns(&self) -> u64 {
        0
    }
}

fn engine_hits(packets: &[PacketSpec]) -> Vec<KernelHits> {
    let rs = parse_ruleset("oracle", RULES, &ParseOptions::default()).expect("parses");
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(Zero),
    );
    e.commit(Change::Put(rs), &NoSets).expect("commits");
    let mut w = e.worker(0).expect("core");
    let mut out = Vec::new();
    for p in packets {
        let base = Packet {
            meta: PacketMeta {
                hook: Hook::Input,
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface: IfName::new(FW_IFACE).expect("short name"),
                ..PacketFacts::default()
            },
        };
        let frame = build_frame(p, FW_MAC);
        let packet = parse_ethernet(&frame, base).expect("parses");
        let before = e.counters();
        let (mut ps, mut fs, mut vs) = ([packet.meta], [packet.facts], [Verdict::Accept]);
        let bytes: [&[u8]; 1] = [&frame[ETH..]];
        let mut batch = Batch::new(&mut ps, &mut vs);
        batch.facts = &mut fs;
        batch.bytes = &bytes;
        w.process(batch, 1);
        let after = e.counters();
        let mut hits = KernelHits::default();
        for (a, b) in after.iter().zip(&before) {
            if a.table != TableKind::Filter || a.packets == b.packets {
                continue;
            }
            match a.rule {
                Some(n) => hits.rules.push((a.chain.to_string(), n as usize)),
                None => hits.policy = Some(a.chain.to_string()),
            }
        }
        hits.rules.sort();
        out.push(hits);
    }
    out
}

/// Without the kernel: what each packet should hit, and the print of the rules.
#[test]
fn string_rules_decide_and_print() {
    let rs = parse_ruleset("p", RULES, &ParseOptions::default()).expect("parses");
    let printed = print(&rs.tables, &Default::default());
    for l in RULES.lines().filter(|l| l.starts_with("-A")) {
        assert!(printed.contains(l), "{l} not in\n{printed}");
    }
    let hits: Vec<Option<usize>> = engine_hits(&packets())
        .iter()
        .map(|h| h.rules.first().map(|r| r.1))
        .collect();
    assert_eq!(
        hits,
        [
            Some(1),
            None,
            Some(1),
            Some(2),
            None,
            Some(3),
            Some(3),
            None,
            Some(4),
            None,
            None,
            Some(5),
            None,
            None,
            Some(6),
            None,
            Some(8),
            None,
            None,
        ]
    );
}

#[test]
#[ignore = "needs root, iproute2 and iptables-legacy"]
fn string_decides_as_the_kernel() {
    let oracle = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(reason)) => {
            panic!("kernel oracle: {reason}");
        }
        Err(e) => panic!("kernel oracle setup failed: {e}"),
    };
    oracle.load(Family::Ipv4, RULES).expect("kernel loads");
    let packets = packets();
    let engine = engine_hits(&packets);
    let mut failures = Vec::new();
    for (p, want) in packets.iter().zip(&engine) {
        let mut got = oracle
            .hits(Family::Ipv4, &build_frame(p, FW_MAC))
            .unwrap_or_else(|e| panic!("{}: kernel: {e}", p.id));
        got.rules.sort();
        if &got != want {
            failures.push(format!("{}: kernel {got:?}, engine {want:?}", p.id));
        }
    }
    println!(
        "string kernel oracle: {} packets, {} differences",
        packets.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A trace searches the bytes it is given, and without them `--string` is false.
#[test]
fn a_trace_searches_the_frames_bytes() {
    let rs = parse_ruleset("t", RULES, &ParseOptions::default()).expect("parses");
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(Zero),
    );
    e.commit(Change::Put(rs), &NoSets).expect("commits");
    let frame = build_frame(&pkt(Proto::Tcp, 80, b"GET /wp-login.php"), FW_MAC);
    let base = Packet::from(PacketMeta {
        hook: Hook::Input,
        ..PacketMeta::default()
    });
    let meta = parse_ethernet(&frame, base).expect("parses");
    let bytes = vallum_engine::packet::parse::network_packet(&frame).expect("IP packet");
    assert_eq!(bytes, &frame[ETH..]);
    assert_eq!(e.trace_bytes(&meta, bytes, 0, true).verdict, Verdict::Drop);
    assert_eq!(e.trace(&meta, 0).verdict, Verdict::Accept);
}
