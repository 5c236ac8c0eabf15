//! The engine's conntrack in the packet path: a stateful ruleset (`--ctstate
//! ESTABLISHED,RELATED -j ACCEPT`, new SSH, `-P INPUT DROP`) sees NEW, ESTABLISHED, RELATED,
//! INVALID and UNTRACKED packets; a full table drops; a commit keeps the table; trace looks up
//! without changing it; with conntrack off nothing is tracked.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use etherparse::PacketBuilder;
use vallum_engine::Clock;
use vallum_engine::conntrack::{ConnFilter, ConntrackConfig, TcpState};
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::tcp_flags::{ACK, SYN};
use vallum_engine::model::{Family, Hook, ct_state};
use vallum_engine::packet::parse::parse_ip;
use vallum_engine::packet::{Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;

const S: u64 = 1_000_000_000;

/// A clock nobody reads here: every call passes `now` explicitly.
struct Frozen(AtomicU64);

impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The host is 10.0.0.1; it runs sshd and talks to the world. Raw NOTRACKs NTP (udp/123) at
/// PREROUTING and OUTPUT; filter accepts UNTRACKED on OUTPUT only, so the path is visible.
const STATEFUL: &str = "\
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -p udp --dport 123 -j NOTRACK
-A OUTPUT -p udp --dport 123 -j NOTRACK
COMMIT
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A INPUT -p tcp --dport 22 --syn -j ACCEPT
COMMIT
";

fn engine(conntrack: Option<ConntrackConfig>) -> Engine {
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack,
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    let rs = parse_ruleset("host", STATEFUL, &ParseOptions::default()).unwrap();
    e.commit(Change::Put(rs), &NoSets).unwrap();
    e
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pkt(hook: Hook, proto: u8, src: &str, sport: u16, dst: &str, dport: u16, f: u8) -> PacketMeta {
    PacketMeta {
        family: Family::Ipv4,
        hook,
        src: ip(src),
        dst: ip(dst),
        protocol: proto,
        sport,
        dport,
        tcp_flags: f,
        len: 60,
        ..PacketMeta::default()
    }
}

/// Runs one packet through core 0; returns (verdict, ct_state it came back with).
fn run(e: &Engine, p: impl Into<Packet>, now: u64) -> (Verdict, u8) {
    let mut w = e.worker(0).unwrap();
    let mut ps = [p.into()];
    let mut vs = [Verdict::Accept];
    assert_eq!(
        crate::support::process_packets(&mut w, &mut ps, &mut vs, now),
        1
    );
    (vs[0], ps[0].ct_state)
}

/// Counter of INPUT rule `n` (1-based).
fn rule_packets(e: &Engine, n: u32) -> u64 {
    e.counters()
        .into_iter()
        .find(|c| &*c.chain == "INPUT" && c.rule == Some(n))
        .map_or(0, |c| c.packets)
}

const ME: &str = "10.0.0.1";
const PEER: &str = "192.0.2.7";

#[test]
fn new_established_invalid_through_the_rules() {
    let e = engine(Some(ConntrackConfig::default()));
    // A client's SYN to sshd: NEW, accepted by rule 3.
    let syn = pkt(Hook::Input, 6, PEER, 40000, ME, 22, SYN);
    assert_eq!(run(&e, syn, S), (Verdict::Accept, ct_state::NEW));
    assert_eq!(rule_packets(&e, 3), 1);
    // sshd's SYN-ACK leaves through OUTPUT: the reply direction, ESTABLISHED.
    let synack = pkt(Hook::Output, 6, ME, 22, PEER, 40000, SYN | ACK);
    assert_eq!(
        run(&e, synack, 2 * S),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
    // The client's ACK: ESTABLISHED, accepted by rule 1.
    let ack = pkt(Hook::Input, 6, PEER, 40000, ME, 22, ACK);
    assert_eq!(
        run(&e, ack, 3 * S),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
    assert_eq!(rule_packets(&e, 1), 1);
    let list = e.conntrack().unwrap().list();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].tcp_state, Some(TcpState::Established));
    assert_eq!(list[0].original.src, ip(PEER));

    // Our own connection out: the SYN is NEW at OUTPUT, the peer's SYN-ACK is ESTABLISHED at
    // INPUT and passes the default-DROP chain through rule 1.
    let out = pkt(Hook::Output, 6, ME, 50000, PEER, 443, SYN);
    assert_eq!(run(&e, out, 4 * S), (Verdict::Accept, ct_state::NEW));
    let back = pkt(Hook::Input, 6, PEER, 443, ME, 50000, SYN | ACK);
    assert_eq!(
        run(&e, back, 5 * S),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
    assert_eq!(rule_packets(&e, 1), 2);

    // A mid-stream ACK of a connection the table never saw: NEW, as with Linux's default
    // nf_conntrack_tcp_loose=1 (picked up), but rule 3 wants a SYN, so INPUT's policy drops
    // it and no entry is created.
    let stray = pkt(Hook::Input, 6, PEER, 41000, ME, 22, ACK);
    assert_eq!(run(&e, stray, 6 * S), (Verdict::Drop, ct_state::NEW));
    assert_eq!(rule_packets(&e, 2), 0);
    assert_eq!(e.conntrack().unwrap().stats().entries, 2);
    // Without pick-up (tcp_loose off) it is INVALID, dropped by rule 2.
    let strict = engine(Some(ConntrackConfig {
        tcp_loose: false,
        ..ConntrackConfig::default()
    }));
    assert_eq!(
        run(&strict, stray, 6 * S),
        (Verdict::Drop, ct_state::INVALID)
    );
    assert_eq!(rule_packets(&strict, 2), 1);
    // A new connection to a closed port: NEW (conntrack runs before filter), dropped by the
    // policy, and not confirmed: no entry, as in the kernel; its retransmission is NEW again.
    let closed = pkt(Hook::Input, 6, PEER, 42000, ME, 25, SYN);
    assert_eq!(run(&e, closed, 7 * S), (Verdict::Drop, ct_state::NEW));
    assert_eq!(run(&e, closed, 8 * S), (Verdict::Drop, ct_state::NEW));
    let st = e.conntrack().unwrap().stats();
    assert_eq!((st.entries, st.new_total), (2, 2));
    // So a "reply" to that dropped packet finds no flow: INVALID, not ESTABLISHED (a SYN-ACK
    // opens nothing; OUTPUT's policy accepts it).
    let forged = pkt(Hook::Output, 6, ME, 25, PEER, 42000, SYN | ACK);
    assert_eq!(run(&e, forged, 9 * S), (Verdict::Accept, ct_state::INVALID));
}

/// An ICMP port-unreachable from `from` about the UDP datagram `about_src:sport ->
/// about_dst:dport`, parsed from bytes at INPUT.
fn unreachable(from: &str, to: &str, about: (&str, u16, &str, u16)) -> Packet {
    let v4 = |s: &str| match ip(s) {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => unreachable!("IPv4 only here"),
    };
    let mut inner = Vec::new();
    PacketBuilder::ipv4(v4(about.0), v4(about.2), 64)
        .udp(about.1, about.3)
        .write(&mut inner, &[0; 12])
        .unwrap();
    let mut bytes = Vec::new();
    PacketBuilder::ipv4(v4(from), v4(to), 64)
        .icmpv4_raw(3, 3, [0; 4])
        .write(&mut bytes, &inner[..28])
        .unwrap();
    parse_ip(
        &bytes,
        Packet::from(PacketMeta {
            hook: Hook::Input,
            ..PacketMeta::default()
        }),
    )
    .unwrap()
}

#[test]
fn icmp_error_about_a_tracked_flow_is_related() {
    let e = engine(Some(ConntrackConfig::default()));
    // A DNS query out: NEW.
    let q = pkt(Hook::Output, 17, ME, 5353, PEER, 53, 0);
    assert_eq!(run(&e, q, S), (Verdict::Accept, ct_state::NEW));
    // The peer says port unreachable about that query: RELATED, accepted by rule 1.
    let err = unreachable(PEER, ME, (ME, 5353, PEER, 53));
    assert_eq!(run(&e, err, 2 * S), (Verdict::Accept, ct_state::RELATED));
    assert_eq!(rule_packets(&e, 1), 1);
    // The same error about a flow nobody sent: INVALID, dropped by rule 2.
    let forged = unreachable(PEER, ME, (ME, 6000, PEER, 53));
    assert_eq!(run(&e, forged, 3 * S), (Verdict::Drop, ct_state::INVALID));
    // Errors open no entry.
    assert_eq!(e.conntrack().unwrap().stats().entries, 1);
}

#[test]
fn raw_notrack_is_untracked_and_not_in_the_table() {
    let e = engine(Some(ConntrackConfig::default()));
    // NTP at PREROUTING: raw NOTRACK, UNTRACKED, no entry.
    let ntp_in = pkt(Hook::Prerouting, 17, PEER, 123, ME, 123, 0);
    assert_eq!(run(&e, ntp_in, S), (Verdict::Accept, ct_state::UNTRACKED));
    let ntp_out = pkt(Hook::Output, 17, ME, 123, PEER, 123, 0);
    assert_eq!(run(&e, ntp_out, S), (Verdict::Accept, ct_state::UNTRACKED));
    assert_eq!(e.conntrack().unwrap().stats().entries, 0);
    assert_eq!(e.conntrack().unwrap().stats().new_total, 0);
    // Another UDP port at PREROUTING is tracked.
    let dns_in = pkt(Hook::Prerouting, 17, PEER, 5000, ME, 53, 0);
    assert_eq!(run(&e, dns_in, S), (Verdict::Accept, ct_state::NEW));
    assert_eq!(e.conntrack().unwrap().stats().entries, 1);
}

#[test]
fn a_full_table_drops_and_counts() {
    let e = engine(Some(ConntrackConfig {
        buckets: 4,
        max_entries: 2,
        locks: 2,
        tcp_loose: true,
    }));
    // Two replied (so not early-droppable) flows fill the table.
    for port in [1000, 1001] {
        let out = pkt(Hook::Output, 17, ME, port, PEER, 53, 0);
        assert_eq!(run(&e, out, S), (Verdict::Accept, ct_state::NEW));
        let back = pkt(Hook::Input, 17, PEER, 53, ME, port, 0);
        assert_eq!(run(&e, back, S), (Verdict::Accept, ct_state::ESTABLISHED));
    }
    // A third flow finds no room and no unreplied victim: dropped, even at OUTPUT whose
    // policy is ACCEPT.
    let third = pkt(Hook::Output, 17, ME, 1002, PEER, 53, 0);
    assert_eq!(run(&e, third, 2 * S), (Verdict::Drop, ct_state::INVALID));
    let st = e.conntrack().unwrap().stats();
    assert_eq!((st.entries, st.insert_failed, st.new_total), (2, 1, 2));
    let dropped: u64 = e
        .verdict_counts()
        .iter()
        .filter(|v| v.hook == Hook::Output && v.verdict == "DROP")
        .map(|v| v.packets)
        .sum();
    assert_eq!(dropped, 1);
    // Existing flows go on.
    let back = pkt(Hook::Input, 17, PEER, 53, ME, 1000, 0);
    assert_eq!(
        run(&e, back, 3 * S),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
}

#[test]
fn a_commit_keeps_the_table() {
    let e = engine(Some(ConntrackConfig::default()));
    let syn = pkt(Hook::Input, 6, PEER, 40000, ME, 22, SYN);
    assert_eq!(run(&e, syn, S).0, Verdict::Accept);
    run(&e, pkt(Hook::Output, 6, ME, 22, PEER, 40000, SYN | ACK), S);
    // A new revision that no longer admits new SSH connections.
    let locked = STATEFUL.replace("-A INPUT -p tcp --dport 22 --syn -j ACCEPT\n", "");
    let rs = parse_ruleset("host", &locked, &ParseOptions::default()).unwrap();
    let c = e.commit(Change::Put(rs), &NoSets).unwrap();
    drop(c.retired);
    assert_eq!(e.conntrack().unwrap().stats().entries, 1);
    // The established session survives; a new one is refused.
    let ack = pkt(Hook::Input, 6, PEER, 40000, ME, 22, ACK);
    assert_eq!(
        run(&e, ack, 2 * S),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
    let other = pkt(Hook::Input, 6, PEER, 40001, ME, 22, SYN);
    assert_eq!(run(&e, other, 2 * S), (Verdict::Drop, ct_state::NEW));
}

#[test]
fn trace_looks_up_without_changing_the_table() {
    let e = engine(Some(ConntrackConfig::default()));
    let ct = e.conntrack().unwrap();
    let syn = pkt(Hook::Input, 6, PEER, 40000, ME, 22, SYN);
    let t = e.trace(&syn, S);
    assert_eq!((t.verdict, t.ct_state), (Verdict::Accept, ct_state::NEW));
    assert_eq!(ct.stats().entries, 0, "trace inserts nothing");
    let stray = pkt(Hook::Input, 6, PEER, 40000, ME, 22, ACK);
    let t = e.trace(&stray, S);
    // Picked up mid-stream (NEW), dropped by the policy (rule 3 wants a SYN).
    assert_eq!((t.verdict, t.ct_state), (Verdict::Drop, ct_state::NEW));
    assert_eq!(ct.stats().entries, 0, "trace inserts nothing");
    // Asking with a given state skips the lookup.
    let given = PacketMeta {
        ct_state: ct_state::ESTABLISHED,
        ..stray
    };
    let t = e.trace_with_state(&given, S);
    assert_eq!(
        (t.verdict, t.ct_state),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );

    run(&e, syn, S);
    run(&e, pkt(Hook::Output, 6, ME, 22, PEER, 40000, SYN | ACK), S);
    let before = ct.list();
    let t = e.trace(&stray, 2 * S);
    assert_eq!(
        (t.verdict, t.ct_state),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
    // The lookup did not advance the state (SYN_RECV -> ESTABLISHED) nor the timeout.
    assert_eq!(ct.list(), before);
    assert_eq!(before[0].tcp_state, Some(TcpState::SynRecv));
    // An ICMP error about it traces RELATED; NTP at PREROUTING UNTRACKED.
    let err = unreachable(PEER, ME, (ME, 22, PEER, 40000));
    assert_eq!(
        e.trace(&err, 2 * S).ct_state,
        ct_state::INVALID,
        "udp != tcp"
    );
    let ntp = pkt(Hook::Prerouting, 17, PEER, 123, ME, 123, 0);
    assert_eq!(e.trace(&ntp, 2 * S).ct_state, ct_state::UNTRACKED);
    assert_eq!(ct.stats().new_total, 1);
}

#[test]
fn delete_by_filter_flush_and_gc() {
    let e = engine(Some(ConntrackConfig::default()));
    run(&e, pkt(Hook::Input, 6, PEER, 40000, ME, 22, SYN), S);
    run(&e, pkt(Hook::Output, 17, ME, 5353, PEER, 53, 0), S);
    run(
        &e,
        pkt(Hook::Output, 17, ME, 5354, "198.51.100.1", 53, 0),
        S,
    );
    let ct = e.conntrack().unwrap();
    let udp = ConnFilter {
        protocol: Some(17),
        ..ConnFilter::default()
    };
    assert_eq!(ct.list().iter().filter(|c| udp.matches(c)).count(), 2);
    let to_peer = ConnFilter {
        protocol: Some(17),
        dst: Some(vallum_engine::model::IpNet::new(ip(PEER), 32).unwrap()),
        ..ConnFilter::default()
    };
    assert_eq!(ct.delete(|c| to_peer.matches(c)), 1);
    assert_eq!(ct.stats().entries, 2);
    // UDP entries time out after 30 s unreplied; the SYN_SENT one after 120 s.
    assert_eq!(e.gc(40 * S, usize::MAX), 1);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::SynSent));
    assert_eq!(ct.flush(), 1);
    assert_eq!(ct.stats().entries, 0);
}

#[test]
fn conntrack_off_tracks_nothing() {
    for off in [
        None,
        Some(ConntrackConfig {
            max_entries: 0,
            ..ConntrackConfig::default()
        }),
    ] {
        let e = engine(off);
        assert!(e.conntrack().is_none());
        // Without a tracker every packet keeps its NEW: a mid-stream ACK to sshd is not
        // INVALID, and the SYN-ACK of our own connection is not ESTABLISHED.
        let back = pkt(Hook::Input, 6, PEER, 443, ME, 50000, SYN | ACK);
        assert_eq!(run(&e, back, S), (Verdict::Drop, ct_state::NEW));
        assert_eq!(e.gc(S, 10), 0);
        assert_eq!(e.trace(&back, S).ct_state, ct_state::NEW);
    }
}

/// A batch is tracked packet by packet in order: a reply in the same batch as the packet that
/// opened its connection sees that connection (it was confirmed before the reply was tracked),
/// and a NEW packet the rules drop leaves nothing for a later packet of the batch. The INPUT
/// chain is long enough to be indexed (the batch probe runs), and its `--ctstate` rules sit in
/// the index (they pin a protocol and port). Batches of 16 give what batches of 1 give.
#[test]
fn one_batch_tracks_in_order_as_single_packets() {
    let mut text = String::from(
        "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p tcp --dport 22 -m conntrack --ctstate ESTABLISHED -j ACCEPT\n\
         -A INPUT -p tcp --sport 443 -m conntrack --ctstate ESTABLISHED -j ACCEPT\n",
    );
    // 3,000 blocked hosts: an index of ~150 KB, above the size from which batches are probed
    // together (`compile::PROBE_MIN_BYTES`).
    for i in 0..3000 {
        text += &format!(
            "-A INPUT -s 10.{}.{}.1 -p tcp --dport 22 -j DROP\n",
            i / 250,
            i % 250
        );
    }
    text += "-A INPUT -s 198.51.100.3 -p tcp --dport 22 -j DROP\n";
    text += "-A INPUT -p tcp --dport 22 --syn -j ACCEPT\nCOMMIT\n";
    let rs = parse_ruleset("host", &text, &ParseOptions::default()).unwrap();
    let mut packets = Vec::new();
    for (k, peer) in ["192.0.2.7", "198.51.100.3", "192.0.2.8"]
        .iter()
        .enumerate()
    {
        let port = 40000 + k as u16;
        packets.push(pkt(Hook::Input, 6, peer, port, ME, 22, SYN));
        packets.push(pkt(Hook::Output, 6, ME, 22, peer, port, SYN | ACK));
        packets.push(pkt(Hook::Input, 6, peer, port, ME, 22, ACK));
        packets.push(pkt(Hook::Output, 6, ME, 50000 + k as u16, peer, 443, SYN));
        packets.push(pkt(
            Hook::Input,
            6,
            peer,
            443,
            ME,
            50000 + k as u16,
            SYN | ACK,
        ));
    }
    let run_in = |size: usize| {
        let e = Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: Some(ConntrackConfig::default()),
            },
            Arc::new(Frozen(AtomicU64::new(0))),
        );
        e.commit(Change::Put(rs.clone()), &NoSets).unwrap();
        let mut w = e.worker(0).unwrap();
        let mut out = Vec::new();
        for chunk in packets.chunks(size) {
            let mut ps = chunk.to_vec();
            let mut vs = vec![Verdict::Drop; ps.len()];
            assert_eq!(w.process_batch(&mut ps, &mut vs, S), ps.len());
            out.extend(vs.into_iter().zip(ps.iter().map(|p| p.ct_state)));
        }
        drop(w);
        let counters: Vec<_> = e.counters().into_iter().map(|c| c.packets).collect();
        (out, counters, e.conntrack().unwrap().list().len())
    };
    let single = run_in(1);
    assert_eq!(run_in(16), single);
    // The blocked peer's SYN was dropped, so its later packets are not ESTABLISHED.
    let (out, _, entries) = &single;
    assert_eq!(out[2], (Verdict::Accept, ct_state::ESTABLISHED));
    assert_eq!(out[5], (Verdict::Drop, ct_state::NEW));
    // Its ACK is picked up (NEW, loose tracking) and dropped by its DROP rule.
    assert_eq!(out[7], (Verdict::Drop, ct_state::NEW));
    assert_eq!(out[9], (Verdict::Accept, ct_state::ESTABLISHED));
    // Both ssh connections that were accepted and the three connections out.
    assert_eq!(*entries, 5);
}

/// Docker 28's guard against LAN hosts reaching a container directly, and a DNS server that
/// does not track its queries, as one host writes them: raw PREROUTING decides both.
const DOCKER_GUARD: &str = "\
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -d 172.17.0.2/32 ! -i docker0 -j DROP
-A PREROUTING -p udp -m udp --dport 53 -j CT --notrack
COMMIT
*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m conntrack --ctstate UNTRACKED -j ACCEPT
-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
";

fn counter(e: &Engine, chain: &str, rule: Option<u32>) -> u64 {
    e.counters()
        .into_iter()
        .find(|c| &*c.chain == chain && c.rule == rule)
        .map_or(0, |c| c.packets)
}

/// Before the fix, a packet handed over at INPUT or FORWARD ran only that hook's chains: the
/// guard never dropped, and the DNS query was NEW, so INPUT's policy dropped it.
#[test]
fn input_and_forward_packets_pass_raw_prerouting_first() {
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    let rs = parse_ruleset("host", DOCKER_GUARD, &ParseOptions::default()).unwrap();
    e.commit(Change::Put(rs), &NoSets).unwrap();
    let from = |hook: Hook, in_iface: &str, out_iface: &str, p: Packet| {
        let mut p = p;
        p.hook = hook;
        p.facts.in_iface = vallum_engine::packet::IfName::new(in_iface).unwrap();
        p.facts.out_iface = vallum_engine::packet::IfName::new(out_iface).unwrap();
        p
    };
    // A LAN host's SYN to the container, routed (FORWARD) from eth0: dropped at raw
    // PREROUTING, before conntrack (no entry, nothing counted NEW).
    let lan = pkt(Hook::Forward, 6, PEER, 40000, "172.17.0.2", 80, SYN);
    let lan = from(Hook::Forward, "eth0", "docker0", lan.into());
    assert_eq!(run(&e, lan, S).0, Verdict::Drop);
    assert_eq!(counter(&e, "PREROUTING", Some(1)), 1);
    assert_eq!(e.conntrack().unwrap().stats().new_total, 0);
    // The same address from the bridge passes (FORWARD's policy ACCEPT), tracked NEW.
    let bridge = from(Hook::Forward, "docker0", "eth0", lan);
    assert_eq!(run(&e, bridge, S), (Verdict::Accept, ct_state::NEW));
    assert_eq!(counter(&e, "PREROUTING", Some(1)), 1);
    // Queued at INPUT (a host with that address): dropped too.
    let local = from(Hook::Input, "eth0", "", lan);
    assert_eq!(run(&e, local, S).0, Verdict::Drop);
    assert_eq!(counter(&e, "PREROUTING", Some(1)), 2);
    // The verdicts count at the hook the packet came with.
    let drops: u64 = e
        .verdict_counts()
        .iter()
        .filter(|c| c.verdict == "DROP")
        .map(|c| {
            assert_ne!(c.hook, Hook::Prerouting, "{c:?}");
            c.packets
        })
        .sum();
    assert_eq!(drops, 2);

    // A DNS query at INPUT: CT --notrack in raw PREROUTING makes it UNTRACKED, INPUT rule 1
    // accepts it, and the table has no entry for it.
    let entries = e.conntrack().unwrap().stats().entries;
    let dns = from(
        Hook::Input,
        "eth0",
        "",
        pkt(Hook::Input, 17, PEER, 5353, ME, 53, 0).into(),
    );
    assert_eq!(run(&e, dns, 2 * S), (Verdict::Accept, ct_state::UNTRACKED));
    assert_eq!(counter(&e, "INPUT", Some(1)), 1);
    assert_eq!(e.conntrack().unwrap().stats().entries, entries);
    // trace walks the same path: raw PREROUTING's NOTRACK rule and policy, then INPUT rule 1.
    let t = e.trace(&dns, 3 * S);
    assert_eq!(
        (t.verdict, t.ct_state),
        (Verdict::Accept, ct_state::UNTRACKED)
    );
    let path: Vec<_> = t.steps.iter().map(|s| (&*s.chain, s.rule)).collect();
    assert_eq!(
        path,
        [
            ("PREROUTING", Some(2)),
            ("PREROUTING", None),
            ("INPUT", Some(1))
        ]
    );
    // Another UDP port is tracked (NEW) and dropped by INPUT's policy.
    let mut other = dns;
    other.dport = 54;
    assert_eq!(run(&e, other, 3 * S), (Verdict::Drop, ct_state::NEW));
}

/// A packet handed over at OUTPUT runs raw OUTPUT before conntrack; PREROUTING is not its
/// path (locally generated packets never pass it).
#[test]
fn output_packets_skip_prerouting() {
    let e = engine(Some(ConntrackConfig::default()));
    let rs = parse_ruleset(
        "guard",
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -j DROP\nCOMMIT\n",
        &ParseOptions::default(),
    )
    .unwrap();
    e.commit(Change::Put(rs), &NoSets).unwrap();
    let ntp_out = pkt(Hook::Output, 17, ME, 123, PEER, 123, 0);
    assert_eq!(run(&e, ntp_out, S), (Verdict::Accept, ct_state::UNTRACKED));
    let ssh_in = pkt(Hook::Input, 6, PEER, 40000, ME, 22, SYN);
    assert_eq!(run(&e, ssh_in, S).0, Verdict::Drop);
}

/// A ufw-style host (established accepted, INVALID dropped, ssh open without `--ctstate`)
/// after a restart or a flush: the table is empty and the client's next segment is a plain
/// ACK. Linux (nf_conntrack_tcp_loose=1) picks the flow up as NEW and the ssh rule accepts
/// it; before the pick-up it was INVALID and ufw's INVALID rule dropped every such flow.
#[test]
fn established_flow_survives_an_empty_table() {
    const UFW: &str = "\
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
";
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    e.commit(
        Change::Put(parse_ruleset("ufw", UFW, &ParseOptions::default()).unwrap()),
        &NoSets,
    )
    .unwrap();
    let data = pkt(Hook::Input, 6, PEER, 40000, ME, 22, ACK);
    assert_eq!(run(&e, data, S), (Verdict::Accept, ct_state::NEW));
    assert_eq!(rule_packets(&e, 3), 1);
    // sshd's answer is the reply direction of the picked-up entry; then the flow is
    // ESTABLISHED both ways.
    let answer = pkt(Hook::Output, 6, ME, 22, PEER, 40000, ACK);
    assert_eq!(
        run(&e, answer, 2 * S),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
    assert_eq!(
        run(&e, data, 3 * S),
        (Verdict::Accept, ct_state::ESTABLISHED)
    );
    assert_eq!(rule_packets(&e, 1), 1);
    let l = e.conntrack().unwrap().list();
    assert_eq!((l.len(), l[0].tcp_state), (1, Some(TcpState::Established)));
    // A stray FIN or RST of an unknown flow is still INVALID (not picked up).
    let fin = pkt(Hook::Input, 6, PEER, 40001, ME, 22, ACK | 0x01);
    assert_eq!(run(&e, fin, 4 * S), (Verdict::Drop, ct_state::INVALID));
}

/// `--ctstate DNAT` / `SNAT` read the kernel's NAT bits ([`PacketMeta::ct_nat`], from
/// NFQA_CT in NFQUEUE mode) on top of our tracker's state, as xt_conntrack reads the entry's
/// IPS_DST_NAT / IPS_SRC_NAT; not for an UNTRACKED packet (no entry). Before, nothing set
/// those bits and the rules never matched.
#[test]
fn ctstate_dnat_reads_the_kernel_nat_bits() {
    const PORT_FORWARD: &str = "\
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -p udp -m udp --dport 123 -j NOTRACK
COMMIT
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -m conntrack --ctstate DNAT -j ACCEPT
-A FORWARD -m conntrack ! --ctstate SNAT -p udp -j DROP
-A FORWARD -p udp -m conntrack --ctstate SNAT -j ACCEPT
COMMIT
";
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    let rs = parse_ruleset("fwd", PORT_FORWARD, &ParseOptions::default()).unwrap();
    e.commit(Change::Put(rs), &NoSets).unwrap();
    let fwd = pkt(Hook::Forward, 6, PEER, 40000, "172.17.0.2", 80, SYN);
    assert_eq!(run(&e, fwd, S).0, Verdict::Drop, "no NAT: policy");
    let dnat = Packet {
        meta: fwd,
        facts: PacketFacts {
            ct_nat: ct_state::DNAT,
            ..PacketFacts::default()
        },
    };
    assert_eq!(run(&e, dnat, S), (Verdict::Accept, ct_state::NEW));
    assert_eq!(counter(&e, "FORWARD", Some(1)), 1);
    let t = e.trace(&dnat, S);
    let forward: Vec<_> = t.steps.iter().filter(|s| &*s.chain == "FORWARD").collect();
    assert_eq!(forward[0].rule, Some(1));
    // `! --ctstate SNAT` drops UDP without SNAT; with SNAT it goes on to rule 3.
    let udp = pkt(Hook::Forward, 17, PEER, 5000, "172.17.0.2", 53, 0);
    assert_eq!(run(&e, udp, S).0, Verdict::Drop);
    assert_eq!(counter(&e, "FORWARD", Some(2)), 1);
    let snat = Packet {
        meta: udp,
        facts: PacketFacts {
            ct_nat: ct_state::SNAT,
            ..PacketFacts::default()
        },
    };
    assert_eq!(run(&e, snat, S).0, Verdict::Accept);
    assert_eq!(counter(&e, "FORWARD", Some(3)), 1);
    // UNTRACKED by our raw table: no entry, so no NAT bits to read.
    let ntp = Packet {
        meta: pkt(Hook::Forward, 17, PEER, 123, "172.17.0.2", 123, 0),
        facts: PacketFacts {
            ct_nat: ct_state::DNAT,
            ..PacketFacts::default()
        },
    };
    assert_eq!(run(&e, ntp, S), (Verdict::Drop, ct_state::UNTRACKED));
}

/// A transport header cut short is dropped by the first match that reads a missing byte, as
/// the kernel hotdrops: rules before it count, nothing after it runs, and a chain large
/// enough for the index (which skips rules by their ports) still walks it in order. Before,
/// the parser refused such packets, so no rule counted at all.
#[test]
fn cut_transport_header_is_hotdropped_at_the_first_match_that_reads_it() {
    let mut text = String::from(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -s 192.0.2.7/32\n",
    );
    for i in 0..300 {
        text += &format!("-A INPUT -p tcp -m tcp --dport {} -j DROP\n", 1000 + i);
    }
    text += "COMMIT\n";
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    let rs = parse_ruleset("big", &text, &ParseOptions::default()).unwrap();
    e.commit(Change::Put(rs), &NoSets).unwrap();
    // 16 bytes of a TCP header to port 22: no rule's port matches, but rule 2's tcp_mt
    // cannot read its 20 bytes.
    let mut bytes = Vec::new();
    PacketBuilder::ipv4([192, 0, 2, 7], [10, 0, 0, 1], 64)
        .tcp(40000, 22, 1, 1024)
        .syn()
        .write(&mut bytes, &[])
        .unwrap();
    bytes.truncate(20 + 16);
    bytes[2..4].copy_from_slice(&36u16.to_be_bytes());
    let cut = parse_ip(&bytes, Packet::default()).unwrap();
    assert_eq!((cut.l4_cut, cut.dport), (Some(16), 22));
    let t = e.trace(&cut, S);
    assert!(t.hotdropped);
    assert_eq!((t.verdict, t.ct_state), (Verdict::Drop, ct_state::INVALID));
    let path: Vec<_> = t.steps.iter().map(|s| s.rule).collect();
    assert_eq!(path, [Some(1)], "rule 1 counts; rule 2 hotdrops; no policy");
    // The packet path, one at a time and in a batch with complete packets around it.
    let whole = parse_ip(
        &{
            let mut b = Vec::new();
            PacketBuilder::ipv4([192, 0, 2, 7], [10, 0, 0, 1], 64)
                .tcp(40000, 22, 1, 1024)
                .syn()
                .write(&mut b, &[])
                .unwrap();
            b
        },
        Packet::default(),
    )
    .unwrap();
    let mut w = e.worker(0).unwrap();
    let mut ps = [whole, cut, whole, cut];
    let mut vs = [Verdict::Accept; 4];
    crate::support::process_packets(&mut w, &mut ps, &mut vs, S);
    drop(w);
    assert_eq!(
        vs,
        [
            Verdict::Accept,
            Verdict::Drop,
            Verdict::Accept,
            Verdict::Drop
        ]
    );
    assert_eq!(counter(&e, "INPUT", Some(1)), 4);
    assert_eq!(counter(&e, "INPUT", Some(2)), 0);
    assert_eq!(
        counter(&e, "INPUT", None),
        2,
        "policy: the whole packets only"
    );
    // Only the complete SYN opened an entry; the cut ones are INVALID.
    assert_eq!(e.conntrack().unwrap().stats().entries, 1);
    assert_eq!(ps[1].ct_state, ct_state::INVALID);
}
