//! Stateful matches (`-m recent`, `-m hashlimit`) against the Linux kernel: each case loads one ruleset into the oracle's
//! namespace (`oracle/kernel.rs`) and sends its packets in order, so that the kernel's lists
//! fill as they go; the engine runs the same packets in the same order through one compiled
//! snapshot (the packet path, which changes the lists), and for every packet the rules whose
//! counters went up must be the kernel's.
//!
//! Needs root, `ip` and the `*tables-legacy*` tools: ignored unless asked for
//! (`-- --include-ignored`), and failing without them. The windows (`--seconds`) are far longer than a
//! run takes, so the kernel's jiffies and the engine's `now` (1 ms a packet) agree on them.
//!
//! Run: `cargo test -p vallum-engine --test it -- kernel_stateful:: --nocapture`.

// Shared with kernel_oracle.rs, which uses the parts this test does not.
#[allow(dead_code)]
use crate::oracle::kernel;

use std::net::IpAddr;
use std::sync::Arc;

use vallum_engine::model::{Family, Hook, TableKind, ct_state};
use vallum_engine::packet::parse::parse_ethernet;
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Snapshot;

use kernel::{FW_IFACE, FW_MAC, KernelHits, KernelOracle, PacketSpec, Proto, Setup, build_frame};

fn tcp(src: &str, dst: &str, dport: u16, ttl: u8) -> PacketSpec {
    PacketSpec {
        id: format!("{src}>{dst}:{dport}/ttl{ttl}"),
        proto: Proto::Tcp,
        src: src.parse::<IpAddr>().expect("address"),
        dst: dst.parse::<IpAddr>().expect("address"),
        sport: 40000,
        dport,
        flags: vallum_engine::model::tcp_flags::SYN,
        icmp_type: 0,
        icmp_code: 0,
        payload_len: 0,
        cut: None,
        ttl,
        tos: 0,
        payload: None,
        ext: None,
    }
}

struct Case {
    name: &'static str,
    family: Family,
    rules: String,
    packets: Vec<PacketSpec>,
}

fn filter(rules: &[&str]) -> String {
    let mut t =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for r in rules {
        t.push_str("-A INPUT ");
        t.push_str(r);
        t.push('\n');
    }
    t.push_str("COMMIT\n");
    t
}

fn cases() -> Vec<Case> {
    let a = "198.51.100.7";
    let b = "198.51.100.8";
    let d = "203.0.113.1";
    let mut ufw = Vec::new();
    for _ in 0..6 {
        ufw.push(tcp(a, d, 22, 64));
    }
    ufw.push(tcp(b, d, 22, 64));
    ufw.push(tcp(a, d, 80, 64));
    ufw.push(tcp(a, d, 22, 64));
    let s = "10.1.1.1";
    let flags = vec![
        tcp("10.0.0.1", "10.9.9.1", 2, 64),
        tcp("10.0.0.1", "10.9.9.1", 1, 64),
        tcp("10.0.0.2", "10.9.9.200", 2, 64),
        tcp("10.0.0.2", "10.9.8.1", 2, 64),
        tcp(s, d, 6, 64),
        tcp(s, d, 3, 64),
        tcp(s, d, 4, 64),
        tcp(s, d, 6, 64),
        tcp(s, d, 5, 64),
        tcp(s, d, 5, 63),
        tcp(s, d, 3, 64),
        tcp(s, d, 6, 64),
        tcp(s, d, 7, 64),
    ];
    let v6 = vec![
        tcp("2001:db8:1:2::1", "2001:db8:ffff::1", 1, 64),
        tcp("2001:db8:1:2::99", "2001:db8:ffff::1", 2, 64),
        tcp("2001:db8:1:2::99", "2001:db8:ffff::1", 1, 64),
        tcp("2001:db8:1:2:ff::", "2001:db8:ffff::1", 2, 64),
        tcp("2001:db8:1:3::1", "2001:db8:ffff::1", 2, 64),
    ];
    let mut hl = Vec::new();
    for i in 0..4 {
        hl.push(tcp("198.51.100.7", d, 22, 64));
        hl.push(tcp("198.51.100.200", d, 22, 64));
        hl.push(tcp("198.51.101.7", d, 22 + i, 64));
        hl.push(tcp("198.51.101.7", d, 80, 64));
    }
    vec![
        Case {
            name: "hashlimit",
            family: Family::Ipv4,
            rules: filter(&[
                "-p tcp -m tcp --dport 22 -m hashlimit --hashlimit-above 1/min --hashlimit-burst 3 --hashlimit-mode srcip --hashlimit-name vhl1 --hashlimit-srcmask 24 -j DROP",
                "-p tcp -m hashlimit --hashlimit-upto 1/min --hashlimit-burst 2 --hashlimit-mode srcip,dstport --hashlimit-name vhl2 -j ACCEPT",
                "-p tcp -j DROP",
            ]),
            packets: hl,
        },
        Case {
            name: "recent-ufw-limit",
            family: Family::Ipv4,
            rules: filter(&[
                "-p tcp -m tcp --dport 22 -m recent --set --name vlim --mask 255.255.255.255 --rsource",
                "-p tcp -m tcp --dport 22 -m recent --update --seconds 600 --hitcount 4 --name vlim --mask 255.255.255.255 --rsource -j DROP",
                "-p tcp -m tcp --dport 22 -j ACCEPT",
            ]),
            packets: ufw,
        },
        Case {
            name: "recent-options",
            family: Family::Ipv4,
            rules: filter(&[
                "-p tcp -m tcp --dport 1 -m recent --set --name vnet --mask 255.255.255.0 --rdest -j ACCEPT",
                "-p tcp -m tcp --dport 2 -m recent --rcheck --name vnet --mask 255.255.255.255 --rdest -j DROP",
                "-p tcp -m tcp --dport 3 -m recent --remove --name vsrc --mask 255.255.255.255 --rsource -j DROP",
                "-p tcp -m tcp --dport 4 -m recent --set --name vsrc --mask 255.255.255.255 --rsource -j ACCEPT",
                "-p tcp -m tcp --dport 5 -m recent --rcheck --rttl --name vsrc --mask 255.255.255.255 --rsource -j DROP",
                "-p tcp -m tcp --dport 6 -m recent ! --rcheck --name vsrc --mask 255.255.255.255 --rsource -j DROP",
                "-p tcp -m tcp --dport 7 -m recent --rcheck --seconds 600 --reap --name vnet --mask 255.255.255.255 --rdest -j DROP",
            ]),
            packets: flags,
        },
        Case {
            name: "recent-v6",
            family: Family::Ipv6,
            rules: filter(&[
                "-p tcp -m tcp --dport 1 -m recent --set --name v6n --mask ffff:ffff:ffff:ffff:: --rsource -j ACCEPT",
                "-p tcp -m tcp --dport 2 -m recent --update --hitcount 2 --name v6n --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -j DROP",
            ]),
            packets: v6,
        },
    ]
}

/// The filter rules (chain, 1-based) and policy whose counters each packet moved, in the
/// engine's packet path, the packets in order through one snapshot.
fn engine_hits(case: &Case) -> Vec<KernelHits> {
    let opts = ParseOptions {
        family: case.family,
        ..ParseOptions::default()
    };
    let rs = parse_ruleset("oracle", &case.rules, &opts).expect("case parses");
    let snap = Snapshot::compile(&[Arc::new(rs)], &NoSets, 1).expect("compiles");
    let mut out = Vec::new();
    for (i, p) in case.packets.iter().enumerate() {
        let base = Packet {
            meta: PacketMeta {
                hook: Hook::Input,
                ct_state: ct_state::NEW,
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface: IfName::new(FW_IFACE).expect("short name"),
                ..PacketFacts::default()
            },
        };
        let mut meta = parse_ethernet(&build_frame(p, FW_MAC), base).expect("parses");
        let before = snap.counters();
        crate::support::classify_one(
            &snap,
            0,
            &mut meta,
            (i as u64 + 1) * 1_000_000,
            &mut Vec::new(),
        );
        let after = snap.counters();
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

#[test]
#[ignore = "needs root, iproute2 and iptables-legacy"]
fn stateful_matches_decide_as_the_kernel() {
    let oracle = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(reason)) => {
            panic!("kernel oracle: {reason}");
        }
        Err(e) => panic!("kernel oracle setup failed: {e}"),
    };
    let mut failures = Vec::new();
    let mut packets = 0;
    for case in cases() {
        oracle
            .load(case.family, &case.rules)
            .unwrap_or_else(|e| panic!("{}: loading: {e}", case.name));
        let engine = engine_hits(&case);
        for (p, want) in case.packets.iter().zip(&engine) {
            packets += 1;
            let mut got = oracle
                .hits(case.family, &build_frame(p, FW_MAC))
                .unwrap_or_else(|e| panic!("{}/{}: kernel: {e}", case.name, p.id));
            got.rules.sort();
            if &got != want {
                failures.push(format!(
                    "{}/{}: kernel {got:?}, engine {want:?}",
                    case.name, p.id
                ));
            }
        }
    }
    println!(
        "stateful kernel oracle: {packets} packets, {} differences",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
