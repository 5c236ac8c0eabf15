//! Tests of shadow evaluation (`shadow.rs`) through the engine's workers.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::Clock;
use crate::conntrack::ConntrackConfig;
use crate::dataplane::BarrierStrategy;
use crate::engine::{Change, Engine, EngineConfig, ShadowConfig, ShadowEnd};
use crate::eval::StepOutcome;
use crate::model::{Policy, Ruleset, ct_state};
use crate::packet::PacketMeta;
use crate::restore::{ParseOptions, parse};
use crate::sets::NoSets;
use crate::snapshot::Verdict;

struct Zero;

impl Clock for Zero {
    fn now_ns(&self) -> u64 {
        0
    }
}

fn ruleset(rules: &str) -> Ruleset {
    let text = format!("*filter\n:INPUT ACCEPT [0:0]\n{rules}COMMIT\n");
    Ruleset {
        name: "web".into(),
        priority: 0,
        tables: parse(&text, &ParseOptions::default()).unwrap().tables,
    }
}

fn engine(cores: usize) -> Engine {
    Engine::new(
        EngineConfig {
            cores,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Zero),
    )
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

/// A TCP packet (ACK, so a mid-stream pick-up opens its entry) from 10.0.0.`src`:`sport` to
/// 10.0.0.1:`dport`, `len` bytes.
fn tcp(src: u8, sport: u16, dport: u16, len: u32) -> PacketMeta {
    PacketMeta {
        src: ip(src),
        dst: ip(1),
        protocol: 6,
        sport,
        dport,
        tcp_flags: 0x10,
        len,
        ..PacketMeta::default()
    }
}

const ACTIVE: &str = "-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp --dport 80 -j ACCEPT\n";
const SHADOW: &str = "-A INPUT -p tcp --dport 8080 -j DROP\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp --dport 80 -j ACCEPT\n";

/// A shadow that drops one port: every packet keeps the active verdict (ACCEPT), the report
/// names exactly the flows to that port with their packets, bytes and first/last seen (a flow
/// seen on two cores is one row), the rules that decided them on each side, the totals by
/// verdict pair, and the shadow's own rule counters.
#[test]
fn a_shadow_that_drops_one_port_reports_exactly_its_flows() {
    let e = engine(2);
    e.commit(Change::Put(ruleset(ACTIVE)), &NoSets).unwrap();
    assert!(
        e.start_shadow(ruleset(SHADOW), 7, ShadowConfig::default(), &NoSets)
            .unwrap()
            .is_none()
    );
    assert_eq!(e.shadow_revision(), Some(("web".to_string(), 7)));
    let mut w0 = e.worker(0).unwrap();
    let mut w1 = e.worker(1).unwrap();
    // (flow source, sport, dport, packets) with 100-byte packets; flow 2 also on core 1.
    let flows = [
        (2, 1000, 8080, 3),
        (3, 1001, 8080, 5),
        (4, 1002, 80, 4),
        (5, 1003, 22, 2),
    ];
    let mut batch: Vec<PacketMeta> = Vec::new();
    for &(src, sport, dport, n) in &flows {
        for _ in 0..n {
            batch.push(tcp(src, sport, dport, 100));
        }
    }
    let mut verdicts = vec![Verdict::Drop; batch.len()];
    assert_eq!(w0.process_batch(&mut batch, &mut verdicts, 10), batch.len());
    assert!(
        verdicts.iter().all(|&v| v == Verdict::Accept),
        "{verdicts:?}"
    );
    let mut more = vec![tcp(2, 1000, 8080, 60), tcp(4, 1002, 80, 60)];
    let mut verdicts = vec![Verdict::Drop; 2];
    w1.process_batch(&mut more, &mut verdicts, 20);
    assert_eq!(verdicts, [Verdict::Accept; 2]);

    let r = e.shadow_report().unwrap();
    assert_eq!((r.ruleset.as_str(), r.revision, r.ended), ("web", 7, None));
    let pairs: Vec<_> = r
        .pairs
        .iter()
        .map(|p| (p.active, p.shadow, p.packets, p.bytes))
        .collect();
    assert_eq!(
        pairs,
        [("ACCEPT", "ACCEPT", 7, 660), ("ACCEPT", "DROP", 9, 860)]
    );
    assert_eq!((r.changed_packets(), r.changed_flows()), (9, 2));
    let rows: Vec<_> = r
        .flows
        .iter()
        .map(|f| {
            (
                f.src,
                f.sport,
                f.dport,
                f.packets,
                f.bytes,
                f.first_seen_ns,
                f.last_seen_ns,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (ip(3), 1001, 8080, 5, 500, 10, 10),
            (ip(2), 1000, 8080, 4, 360, 10, 20)
        ]
    );
    for f in &r.flows {
        assert_eq!((f.active, f.shadow, f.protocol), ("ACCEPT", "DROP", 6));
        let a = f.active_rule.as_ref().unwrap();
        assert_eq!(
            (&*a.chain, a.rule, a.outcome),
            ("INPUT", None, StepOutcome::Policy(Policy::Accept))
        );
        let s = f.shadow_rule.as_ref().unwrap();
        assert_eq!(
            (&*s.ruleset, &*s.chain, s.rule, s.outcome),
            ("web", "INPUT", Some(1), StepOutcome::Drop)
        );
    }
    let counts: Vec<_> = r.counters.iter().map(|c| (c.rule, c.packets)).collect();
    // Rules, then the policies of INPUT, FORWARD and OUTPUT.
    assert_eq!(
        counts,
        [
            (Some(1), 9),
            (Some(2), 2),
            (Some(3), 5),
            (None, 0),
            (None, 0),
            (None, 0)
        ]
    );
    // The active counters did not see the shadow: its rule 2 (dport 80) counted 5 packets.
    let active: Vec<_> = e.counters().iter().map(|c| (c.rule, c.packets)).collect();
    assert_eq!(
        active,
        [(Some(1), 2), (Some(2), 5), (None, 9), (None, 0), (None, 0)]
    );
}

/// The shadow sees the conntrack state the active rules produced, and tracks nothing
/// itself: a shadow that drops NEW UDP to port 53 differs on a flow's first packet only (its
/// reply and the next query are ESTABLISHED, as the active lookup found them), and the
/// connection table holds the one entry the active path made.
#[test]
fn the_shadow_sees_the_active_conntrack_state() {
    let e = engine(1);
    e.commit(Change::Put(ruleset("")), &NoSets).unwrap();
    let shadow = ruleset("-A INPUT -p udp --dport 53 -m conntrack --ctstate NEW -j DROP\n");
    e.start_shadow(shadow, 2, ShadowConfig::default(), &NoSets)
        .unwrap();
    let udp = |src, dst, sport, dport| PacketMeta {
        src: ip(src),
        dst: ip(dst),
        protocol: 17,
        sport,
        dport,
        len: 60,
        ..PacketMeta::default()
    };
    let mut w = e.worker(0).unwrap();
    let mut packets = vec![
        udp(2, 1, 5353, 53),
        udp(1, 2, 53, 5353),
        udp(2, 1, 5353, 53),
    ];
    let mut verdicts = vec![Verdict::Drop; 3];
    w.process_batch(&mut packets, &mut verdicts, 5);
    assert_eq!(verdicts, [Verdict::Accept; 3]);
    assert_eq!(packets[2].ct_state, ct_state::ESTABLISHED);
    let r = e.shadow_report().unwrap();
    assert_eq!(r.changed_packets(), 1);
    assert_eq!(r.flows.len(), 1);
    assert_eq!((r.flows[0].sport, r.flows[0].packets), (5353, 1));
    assert_eq!(e.conntrack().unwrap().stats().entries, 1);
}

/// A shadow ends on request (its last report says so, workers stop counting in it), when
/// another takes its place, and at the next publish; a commit that numbers the shadowed
/// ruleset with the shadowed revision starts from the shadow's counters.
#[test]
fn a_shadow_ends_on_request_on_replace_and_on_commit() {
    let e = engine(1);
    e.commit(Change::Put(ruleset(ACTIVE)), &NoSets).unwrap();
    let mut w = e.worker(0).unwrap();
    let mut send = |n: usize| {
        let mut p = vec![tcp(2, 1000, 8080, 100); n];
        let mut v = vec![Verdict::Drop; n];
        w.process_batch(&mut p, &mut v, 1);
        assert!(v.iter().all(|&v| v == Verdict::Accept));
    };

    assert!(e.end_shadow().is_none(), "no shadow yet");
    assert!(e.shadow_report().is_none());
    e.start_shadow(ruleset(SHADOW), 3, ShadowConfig::default(), &NoSets)
        .unwrap();
    send(2);
    let ended = e.end_shadow().unwrap();
    assert_eq!(
        (ended.ended, ended.changed_packets()),
        (Some(ShadowEnd::Ended), 2)
    );
    assert!(e.shadow_revision().is_none());
    send(1);
    assert!(e.end_shadow().is_none());
    assert_eq!(e.shadow_report(), Some(ended), "the last one, unchanged");

    e.start_shadow(ruleset(SHADOW), 4, ShadowConfig::default(), &NoSets)
        .unwrap();
    send(1);
    let replaced = e
        .start_shadow(ruleset(SHADOW), 5, ShadowConfig::default(), &NoSets)
        .unwrap()
        .unwrap();
    assert_eq!(
        (replaced.revision, replaced.ended),
        (4, Some(ShadowEnd::Replaced))
    );
    assert_eq!(replaced.changed_packets(), 1);
    send(3);

    // Commit revision 5, the shadowed one: it ends the shadow and carries its counters.
    let mut p = e.prepare(Change::Put(ruleset(SHADOW)), &NoSets).unwrap();
    p.set_revision("web", 5);
    drop(e.publish(p).unwrap());
    let last = e.shadow_report().unwrap();
    let shown = last.clone();
    assert_eq!(
        (last.revision, last.ended, last.changed_packets()),
        (5, Some(ShadowEnd::Committed), 3)
    );
    assert!(e.shadow_revision().is_none());
    assert_eq!(e.shadow_report(), Some(shown));
    let counts: Vec<_> = e.counters().iter().map(|c| (c.rule, c.packets)).collect();
    // The INPUT policy keeps what it counted when active (7 packets to 8080 so far).
    assert_eq!(
        counts,
        [
            (Some(1), 3),
            (Some(2), 0),
            (Some(3), 0),
            (None, 7),
            (None, 0),
            (None, 0)
        ]
    );
    // Now enforced: the next packets to 8080 are dropped.
    let mut p = vec![tcp(2, 1000, 8080, 100)];
    let mut v = vec![Verdict::Accept];
    w.process_batch(&mut p, &mut v, 2);
    assert_eq!(v, [Verdict::Drop]);

    // A commit of another revision ends a shadow without carrying anything.
    e.start_shadow(ruleset(ACTIVE), 6, ShadowConfig::default(), &NoSets)
        .unwrap();
    drop(e.commit(Change::Put(ruleset(SHADOW)), &NoSets).unwrap());
    let last = e.shadow_report().unwrap();
    assert_eq!((last.revision, last.ended), (6, Some(ShadowEnd::Committed)));
    assert!(e.shadow_revision().is_none());
}

/// The flow table keeps at most `max_flows` rows per core; differing packets of further flows
/// are counted as overflow, and `changed_flows` says there were more.
#[test]
fn the_flow_table_is_bounded() {
    let e = engine(1);
    e.commit(Change::Put(ruleset(ACTIVE)), &NoSets).unwrap();
    let config = ShadowConfig {
        max_flows: 2,
        sample: 2,
    };
    e.start_shadow(ruleset(SHADOW), 1, config, &NoSets).unwrap();
    let mut w = e.worker(0).unwrap();
    let mut p: Vec<_> = (0..5).map(|i| tcp(2, 2000 + i, 8080, 50)).collect();
    let mut v = vec![Verdict::Drop; 5];
    w.process_batch(&mut p, &mut v, 1);
    let r = e.shadow_report().unwrap();
    assert_eq!(
        (r.flows.len(), r.overflow_packets, r.overflow_bytes),
        (2, 3, 150)
    );
    assert_eq!(r.changed_flows(), 3);
    let samples = e.drain_shadow_samples();
    let ports: Vec<_> = samples.iter().map(|s| s.packet.meta.sport).collect();
    assert_eq!(ports, [2000, 2002, 2004], "every second differing packet");
    assert!(e.drain_shadow_samples().is_empty());
}

/// With the source's facts: the flow names its input interface, the shadow reads the facts
/// as they came (its `-i` rule matches), and the batch's facts come back as the active walk
/// left them.
#[test]
fn the_shadow_reads_the_batch_facts() {
    use crate::engine::Batch;
    use crate::packet::{IfName, PacketFacts};
    let e = engine(1);
    e.commit(Change::Put(ruleset(ACTIVE)), &NoSets).unwrap();
    let shadow = ruleset("-A INPUT -i eth7 -p tcp --dport 80 -j REJECT\n");
    e.start_shadow(shadow, 9, ShadowConfig::default(), &NoSets)
        .unwrap();
    let mut w = e.worker(0).unwrap();
    let eth = |n| PacketFacts {
        in_iface: IfName::new(n).unwrap(),
        ..PacketFacts::default()
    };
    let mut packets = vec![tcp(2, 1000, 80, 40), tcp(3, 1000, 80, 40)];
    let mut facts = vec![eth("eth7"), eth("eth8")];
    let before = facts.clone();
    let mut verdicts = vec![Verdict::Drop; 2];
    let mut skipped = [false; 2];
    w.process(
        Batch {
            packets: &mut packets,
            facts: &mut facts,
            verdicts: &mut verdicts,
            bytes: &[],
            cut: &[],
            skipped: &mut skipped,
        },
        3,
    );
    assert_eq!(verdicts, [Verdict::Accept; 2]);
    assert_eq!(facts, before);
    let r = e.shadow_report().unwrap();
    assert_eq!(r.flows.len(), 1);
    assert_eq!(
        (
            r.flows[0].in_iface.as_str(),
            r.flows[0].src,
            r.flows[0].shadow
        ),
        ("eth7", ip(2), "REJECT")
    );
}
