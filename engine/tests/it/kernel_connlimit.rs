//! `-m connlimit` against the Linux kernel: TCP connections opened one after the other from
//! one source, with a limit of N, so that the (N+1)th SYN is refused by both, a refused
//! connection stops counting, a client's RST (CLOSE) frees its slot, a retransmitted SYN of a
//! confirmed connection gets the list as it stands, `--connlimit-daddr` with a /24 mask groups
//! by server network, and an IPv6 /64 mask groups clients.
//!
//! The kernel's side is the oracle's namespace (`oracle/kernel.rs`): its conntrack confirms
//! every SYN the rules accept; its own RSTs and SYN-ACKs are dropped in raw OUTPUT (before
//! conntrack), so an accepted connection stays in SYN_SENT, counted. The engine's side is an
//! [`Engine`] with its tracker, the same frames through a worker's `process_batch` (the packet
//! path: track, evaluate, confirm), 1 ms apart. For every packet the rules whose counters went
//! up must be the kernel's.
//!
//! The kernel test needs root, `ip` and the `*tables-legacy*` tools: it is ignored unless asked
//! for (`-- --include-ignored`), and fails without them.
//!
//! Run: `cargo test -p vallum-engine --test it -- kernel_connlimit:: --nocapture`.

// Shared with kernel_oracle.rs, which uses the parts this test does not.
#[allow(dead_code)]
use crate::oracle::kernel;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vallum_engine::Clock;
use vallum_engine::conntrack::ConntrackConfig;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::tcp_flags::{ACK, RST, SYN};
use vallum_engine::model::{Family, Hook, TableKind};
use vallum_engine::packet::parse::parse_ethernet;
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;

use kernel::{FW_IFACE, FW_MAC, KernelHits, KernelOracle, PacketSpec, Proto, Setup, build_frame};

fn tcp(src: &str, dst: &str, sport: u16, dport: u16, flags: u8) -> PacketSpec {
    PacketSpec {
        id: format!("{src}:{sport}>{dst}:{dport}/{flags:#x}"),
        proto: Proto::Tcp,
        src: src.parse::<IpAddr>().expect("address"),
        dst: dst.parse::<IpAddr>().expect("address"),
        sport,
        dport,
        flags,
        icmp_type: 0,
        icmp_code: 0,
        payload_len: 0,
        cut: None,
        ttl: 64,
        tos: 0,
        payload: None,
        ext: None,
    }
}

/// At most 2 SSH connections per client address; at most 1 web connection per /24 of
/// servers.
const RULES: &str = "\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp -m tcp --dport 22 --tcp-flags FIN,SYN,RST,ACK SYN -m connlimit --connlimit-above 2 --connlimit-mask 32 --connlimit-saddr -j REJECT --reject-with tcp-reset
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -p tcp -m tcp --dport 80 --tcp-flags FIN,SYN,RST,ACK SYN -m connlimit --connlimit-upto 1 --connlimit-mask 24 --connlimit-daddr -j ACCEPT
-A INPUT -p tcp -m tcp --dport 80 -j DROP
COMMIT
";

/// IPv6: at most 1 connection per client /64.
const RULES6: &str = "\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp -m tcp --dport 22 -m connlimit --connlimit-above 1 --connlimit-mask 64 --connlimit-saddr -j DROP
COMMIT
";

fn packets6() -> Vec<PacketSpec> {
    let d = "2001:db8:ffff::1";
    vec![
        tcp("2001:db8:1:2::1", d, 41001, 22, SYN),
        tcp("2001:db8:1:2::99", d, 41002, 22, SYN),
        tcp("2001:db8:1:3::1", d, 41003, 22, SYN),
    ]
}

fn packets() -> Vec<PacketSpec> {
    let (a, b, d) = ("198.51.100.7", "198.51.100.8", "203.0.113.1");
    vec![
        // N = 2 connections, then the (N+1)th and (N+2)th are refused.
        tcp(a, d, 41001, 22, SYN),
        tcp(a, d, 41002, 22, SYN),
        tcp(a, d, 41003, 22, SYN),
        tcp(a, d, 41004, 22, SYN),
        // Another client is counted on its own.
        tcp(b, d, 41001, 22, SYN),
        // A retransmitted SYN of a counted (confirmed) connection: the list as it stands,
        // with the refused 41004 not cleaned yet: 3, refused.
        tcp(a, d, 41001, 22, SYN),
        // The client resets its first connection (CLOSE): a new one fits again.
        tcp(a, d, 41001, 22, RST | ACK),
        tcp(a, d, 41005, 22, SYN),
        tcp(a, d, 41006, 22, SYN),
        // Web: one connection per server /24.
        tcp(a, d, 42001, 80, SYN),
        tcp(b, "203.0.113.2", 42001, 80, SYN),
        tcp(b, "203.0.114.2", 42002, 80, SYN),
    ]
}

struct Fixed(AtomicU64);

impl Clock for Fixed {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The filter rules and policy each packet moved in the engine's packet path, with its
/// verdict.
fn engine_hits(family: Family, packets: &[PacketSpec]) -> Vec<(KernelHits, Verdict)> {
    let (rules, opts) = match family {
        Family::Ipv4 => (RULES, ParseOptions::default()),
        Family::Ipv6 => (
            RULES6,
            ParseOptions {
                family,
                ..ParseOptions::default()
            },
        ),
    };
    let rs = parse_ruleset("oracle", rules, &opts).expect("parses");
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Fixed(AtomicU64::new(0))),
    );
    e.commit(Change::Put(rs), &NoSets).expect("commits");
    let mut w = e.worker(0).expect("core");
    let mut out = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        let base = Packet {
            meta: PacketMeta {
                hook: Hook::Input,
                family,
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface: IfName::new(FW_IFACE).expect("short name"),
                ..PacketFacts::default()
            },
        };
        let meta = parse_ethernet(&build_frame(p, FW_MAC), base).expect("parses");
        let before = e.counters();
        let (mut ps, mut vs) = ([meta], [Verdict::Accept]);
        crate::support::process_packets(&mut w, &mut ps, &mut vs, (i as u64 + 1) * 1_000_000);
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
        out.push((hits, vs[0]));
    }
    out
}

/// Without the kernel: the engine refuses the third SSH connection of one client.
#[test]
fn the_third_connection_of_a_client_is_refused() {
    let hits = engine_hits(Family::Ipv4, &packets());
    let rules: Vec<Vec<usize>> = hits
        .iter()
        .map(|(h, _)| h.rules.iter().map(|(_, n)| *n).collect())
        .collect();
    assert_eq!(
        rules,
        [
            vec![2],
            vec![2],
            vec![1],
            vec![1],
            vec![2],
            vec![1],
            vec![2],
            vec![2],
            vec![1],
            vec![3],
            vec![4],
            vec![3],
        ]
    );
    assert!(matches!(hits[2].1, Verdict::Reject(_)), "{:?}", hits[2].1);
    // IPv6 /64: the second client of 2001:db8:1:2::/64 is over 1, another /64 is not.
    let v6: Vec<Verdict> = engine_hits(Family::Ipv6, &packets6())
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(v6, [Verdict::Accept, Verdict::Drop, Verdict::Accept]);
}

#[test]
#[ignore = "needs root, iproute2 and iptables-legacy"]
fn connlimit_decides_as_the_kernel() {
    let oracle = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(reason)) => {
            panic!("kernel oracle: {reason}");
        }
        Err(e) => panic!("kernel oracle setup failed: {e}"),
    };
    let mut failures = Vec::new();
    let mut sent = 0;
    for (family, rules, packets) in [
        (Family::Ipv4, RULES, packets()),
        (Family::Ipv6, RULES6, packets6()),
    ] {
        oracle.load(family, rules).expect("kernel loads");
        let engine = engine_hits(family, &packets);
        for (p, (want, _)) in packets.iter().zip(&engine) {
            let mut got = oracle
                .hits(family, &build_frame(p, FW_MAC))
                .unwrap_or_else(|e| panic!("{}: kernel: {e}", p.id));
            got.rules.sort();
            if &got != want {
                failures.push(format!("{}: kernel {got:?}, engine {want:?}", p.id));
            }
            sent += 1;
        }
    }
    println!(
        "connlimit kernel oracle: {sent} packets, {} differences",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
