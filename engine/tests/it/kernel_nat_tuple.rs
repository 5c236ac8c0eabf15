//! `--ctorigdst` / `--ctorigdstport` under the kernel's DNAT (NFQUEUE mode): the packet the
//! engine sees is already translated, so the tracker's own original tuple has the translated
//! destination; the kernel hands its entry's original tuple (`NFQA_CT`'s `CTA_TUPLE_ORIG`,
//! [`PacketMeta::ct_orig_dst`]) and xt_conntrack decides with that one. Docker's documented
//! DOCKER-USER recipe (restrict a published port by its original destination port) through
//! the engine with its tracker, for the request and for the container's answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vallum_engine::Clock;
use vallum_engine::conntrack::ConntrackConfig;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::tcp_flags::{ACK, SYN};
use vallum_engine::model::{Family, Hook, ct_state};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;
use vallum_engine::validate::validate;

const RULES: &str = "\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -p tcp -m conntrack --ctorigdst 198.51.100.1 --ctorigdstport 8080 -j DROP
COMMIT
";

struct Frozen(AtomicU64);

impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[allow(clippy::too_many_arguments)]
fn fwd(src: &str, sport: u16, dst: &str, dport: u16, flags: u8, kernel_dnat: bool) -> Packet {
    Packet {
        meta: PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Forward,
            src: src.parse().expect("address"),
            dst: dst.parse().expect("address"),
            protocol: 6,
            sport,
            dport,
            tcp_flags: flags,
            len: 60,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new("eth0").expect("name"),
            out_iface: IfName::new("docker0").expect("name"),
            ct_nat: if kernel_dnat { ct_state::DNAT } else { 0 },
            ct_orig_dst: kernel_dnat
                .then(|| ("198.51.100.1".parse().expect("address"), Some(8080))),
            ..PacketFacts::default()
        },
    }
}

fn run(e: &Engine, p: Packet, now: u64) -> Verdict {
    let mut w = e.worker(0).expect("core");
    let (mut ps, mut vs) = ([p], [Verdict::Accept]);
    crate::support::process_packets(&mut w, &mut ps, &mut vs, now);
    vs[0]
}

#[test]
fn ctorigdst_reads_the_kernel_tuple_under_its_dnat() {
    let rs = parse_ruleset("nat", RULES, &ParseOptions::default()).expect("parses");
    assert!(validate(&rs, None).is_empty(), "{:?}", validate(&rs, None));
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    e.commit(Change::Put(rs), &NoSets).expect("commits");
    let c = "172.17.0.2";
    // 198.51.100.1:8080 DNATed to the container's port 80: the kernel's original tuple says
    // 8080, the packet says 80.
    let syn = fwd("203.0.113.9", 40000, c, 80, SYN, true);
    assert_eq!(run(&e, syn, 1), Verdict::Drop, "original destination 8080");
    // Without the kernel's tuple (no ctnetlink) the engine's own is the translated one.
    let blind = fwd("203.0.113.9", 40001, c, 80, SYN, false);
    assert_eq!(
        run(&e, blind, 1),
        Verdict::Accept,
        "the engine's tuple: port 80"
    );
    // The container's answer of an accepted flow: its entry's original destination too.
    let ok = fwd("203.0.113.9", 40002, c, 80, SYN, false);
    assert_eq!(run(&e, ok, 1), Verdict::Accept);
    let mut back = fwd(c, 80, "203.0.113.9", 40002, SYN | ACK, true);
    back.facts.in_iface = IfName::new("docker0").expect("name");
    back.facts.out_iface = IfName::new("eth0").expect("name");
    assert_eq!(
        run(&e, back, 2),
        Verdict::Drop,
        "reply direction, kernel tuple"
    );
}
