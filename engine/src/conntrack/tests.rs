//! Unit tests of the tracker: TCP handshake and closing, UDP and ICMP, timeouts, GC, the
//! maximum with early drop, and concurrent readers and writers.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::*;
use crate::model::tcp_flags::{ACK, FIN, PSH, RST, SYN};

const S: u64 = 1_000_000_000;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

fn pkt(protocol: u8, src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: u8) -> Packet {
    Packet::from(PacketMeta {
        src,
        dst,
        protocol,
        sport,
        dport,
        tcp_flags: flags,
        ..PacketMeta::default()
    })
}

fn table(buckets: usize, max_entries: usize) -> Conntrack {
    Conntrack::new(ConntrackConfig {
        buckets,
        max_entries,
        locks: 16,
        tcp_loose: true,
    })
    .unwrap()
}

/// A table without mid-stream pick-up (`nf_conntrack_tcp_loose=0`).
fn strict_table() -> Conntrack {
    Conntrack::new(ConntrackConfig {
        tcp_loose: false,
        ..ConntrackConfig::default()
    })
    .unwrap()
}

/// Tracks a TCP packet from client (a:1000) to server (b:80) or back; returns the ct_state.
fn tcp(ct: &Conntrack, reply: bool, flags: u8, now: u64) -> u8 {
    let mut p = if reply {
        pkt(PROTO_TCP, ip(2), 80, ip(1), 1000, flags)
    } else {
        pkt(PROTO_TCP, ip(1), 1000, ip(2), 80, flags)
    };
    ct.track(&mut p, now);
    p.ct_state
}

#[test]
fn tcp_handshake_new_then_established_both_ways() {
    let ct = table(64, 100);
    assert_eq!(tcp(&ct, false, SYN, 0), ct_state::NEW);
    assert_eq!(tcp(&ct, false, SYN, S), ct_state::NEW, "retransmitted SYN");
    assert_eq!(tcp(&ct, true, SYN | ACK, 2 * S), ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::SynRecv));
    assert_eq!(tcp(&ct, false, ACK, 3 * S), ct_state::ESTABLISHED);
    assert_eq!(tcp(&ct, true, ACK, 4 * S), ct_state::ESTABLISHED);
    let l = ct.list();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].tcp_state, Some(TcpState::Established));
    assert!(l[0].seen_reply);
    assert_eq!(l[0].expires_ns, 4 * S + 5 * 24 * 3600 * S);
    assert_eq!(ct.stats().new_total, 1);
    assert_eq!(ct.stats().entries, 1);
}

#[test]
fn tcp_close_and_invalid() {
    let strict = strict_table();
    assert_eq!(
        tcp(&strict, false, ACK, 0),
        ct_state::INVALID,
        "no entry, not a SYN"
    );
    assert_eq!(strict.stats().entries, 0);
    let ct = table(64, 100);
    for flags in [FIN | ACK, RST, RST | ACK, SYN | ACK, FIN, 0] {
        assert_eq!(
            tcp(&ct, false, flags, 0),
            ct_state::INVALID,
            "no entry, flags {flags:#x}: not picked up even when loose"
        );
    }
    assert_eq!(ct.stats().entries, 0);
    tcp(&ct, false, SYN, 0);
    assert_eq!(
        tcp(&ct, false, SYN | ACK, 0),
        ct_state::INVALID,
        "SYN-ACK from client"
    );
    tcp(&ct, true, SYN | ACK, 0);
    tcp(&ct, false, ACK, 0);
    tcp(&ct, false, FIN | ACK, 0);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::FinWait));
    tcp(&ct, true, FIN | ACK, 0);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::LastAck));
    assert_eq!(tcp(&ct, false, ACK, 0), ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::TimeWait));
    assert_eq!(ct.list()[0].expires_ns, 120 * S);
    // A new SYN on the same tuple reopens it.
    assert_eq!(tcp(&ct, false, SYN, S), ct_state::NEW);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::SynSent));
    assert_eq!(tcp(&ct, true, RST, S), ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::Close));
    assert_eq!(ct.list()[0].expires_ns, 11 * S);
}

/// As nf_conntrack_tcp_loose=1: an ACK with no entry (a flow older than the table: a restart,
/// a flush) opens an ESTABLISHED entry; the packet is NEW, the reply ESTABLISHED, and until
/// that reply the entry lives 300 s, not 5 days. Before the pick-up it was INVALID.
#[test]
fn tcp_loose_picks_up_mid_stream() {
    let ct = table(64, 100);
    assert_eq!(tcp(&ct, false, ACK | PSH, S), ct_state::NEW);
    let l = ct.list();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].tcp_state, Some(TcpState::Established));
    assert!(!l[0].seen_reply);
    assert_eq!(l[0].expires_ns, S + 300 * S);
    // More data the same way: still NEW (no reply yet), as the kernel's ctinfo.
    assert_eq!(tcp(&ct, false, ACK, 2 * S), ct_state::NEW);
    // The server answers: ESTABLISHED, and the established timeout applies.
    assert_eq!(tcp(&ct, true, ACK, 3 * S), ct_state::ESTABLISHED);
    assert_eq!(tcp(&ct, false, ACK, 4 * S), ct_state::ESTABLISHED);
    let l = ct.list();
    assert!(l[0].seen_reply);
    assert_eq!(l[0].expires_ns, 4 * S + 5 * 24 * 3600 * S);
    // It closes as any other flow.
    tcp(&ct, false, FIN | ACK, 5 * S);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::FinWait));
    // A reply-direction ACK of an unknown flow is picked up too, with the roles as seen.
    assert_eq!(
        tcp(&ct, true, ACK, 6 * S),
        ct_state::ESTABLISHED,
        "same entry"
    );
    let mut other = pkt(PROTO_TCP, ip(3), 443, ip(1), 2000, ACK);
    assert_eq!(ct.track(&mut other, 7 * S), CtVerdict::New);
    assert_eq!(ct.list().len(), 2);
}

#[test]
fn udp_reply_establishes_and_extends_timeout() {
    let ct = table(64, 100);
    let mut q = pkt(PROTO_UDP, ip(1), 5353, ip(2), 53, 0);
    assert_eq!(ct.track(&mut q, 0), CtVerdict::New);
    assert_eq!(q.ct_state, ct_state::NEW);
    assert_eq!(ct.list()[0].expires_ns, 30 * S);
    let mut r = pkt(PROTO_UDP, ip(2), 53, ip(1), 5353, 0);
    assert_eq!(ct.track(&mut r, S), CtVerdict::Established);
    assert_eq!(r.ct_state, ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].expires_ns, 121 * S);
    assert_eq!(ct.track(&mut q, 2 * S), CtVerdict::Established);
}

#[test]
fn icmp_echo_and_errors() {
    let ct = table(64, 100);
    let mut req = pkt(PROTO_ICMP, ip(1), 0, ip(2), 0, 0);
    req.icmp_type = 8;
    let mut rep = pkt(PROTO_ICMP, ip(2), 0, ip(1), 0, 0);
    rep.icmp_type = 0;
    assert_eq!(
        ct.track(&mut rep.clone(), 0),
        CtVerdict::Invalid,
        "reply first"
    );
    assert_eq!(ct.track(&mut req, 0), CtVerdict::New);
    assert_eq!(ct.track(&mut rep, 0), CtVerdict::Established);
    let mut unreach = pkt(PROTO_ICMP, ip(2), 0, ip(1), 0, 0);
    unreach.icmp_type = 3;
    assert_eq!(ct.track(&mut unreach, 0), CtVerdict::Invalid);
    let mut ns = pkt(PROTO_ICMPV6, ip(2), 0, ip(1), 0, 0);
    ns.icmp_type = 135;
    assert_eq!(ct.track(&mut ns, 0), CtVerdict::Untracked);
    assert_eq!(ns.ct_state, ct_state::UNTRACKED);
}

#[test]
fn notrack_and_fragments_are_not_tracked() {
    let ct = table(64, 100);
    let mut p = pkt(PROTO_UDP, ip(1), 1, ip(2), 2, 0);
    p.ct_state = ct_state::UNTRACKED;
    assert_eq!(ct.track(&mut p, 0), CtVerdict::Untracked);
    assert_eq!(p.ct_state, ct_state::UNTRACKED);
    let mut f = pkt(PROTO_UDP, ip(1), 0, ip(2), 0, 0);
    f.fragment = true;
    assert_eq!(ct.track(&mut f, 0), CtVerdict::Untracked);
    assert_eq!(ct.stats().entries, 0);
}

#[test]
fn timeouts_expire_with_now_and_gc_collects() {
    let ct = table(64, 100);
    let mut q = pkt(PROTO_UDP, ip(1), 5353, ip(2), 53, 0);
    ct.track(&mut q, 0);
    tcp(&ct, false, SYN, 0);
    assert_eq!(ct.stats().entries, 2);
    // The UDP entry (30 s) expired at 31 s; a reply then finds nothing and opens a new entry.
    let mut r = pkt(PROTO_UDP, ip(2), 53, ip(1), 5353, 0);
    assert_eq!(ct.track(&mut r, 31 * S), CtVerdict::New);
    assert_eq!(ct.stats().new_total, 3);
    assert_eq!(ct.stats().entries, 2);
    assert_eq!(
        ct.gc(60 * S, 64),
        0,
        "SYN_SENT lives 120 s, the new UDP entry until 61 s"
    );
    assert_eq!(ct.stats().entries, 2);
    assert_eq!(ct.gc(100 * S, 64), 1);
    assert_eq!(ct.stats().entries, 1);
    assert_eq!(ct.gc(121 * S, 64), 1);
    assert_eq!(ct.stats().entries, 0);
    assert!(ct.list().is_empty());
}

#[test]
fn gc_reports_what_it_removed() {
    let ct = table(64, 1000);
    for i in 0..100u16 {
        let mut p = pkt(PROTO_UDP, ip(1), i, ip(2), 53, 0);
        ct.track(&mut p, 0);
    }
    let mut removed = 0;
    for _ in 0..8 {
        removed += ct.gc(31 * S, 8);
    }
    assert_eq!(removed, 100);
    assert_eq!(ct.stats().entries, 0);
}

#[test]
fn max_entries_with_early_drop() {
    // One bucket, so early drop always sees every entry.
    let ct = table(1, 3);
    for i in 0..3u16 {
        let mut p = pkt(PROTO_UDP, ip(1), i, ip(2), 53, 0);
        assert_eq!(ct.track(&mut p, 0), CtVerdict::New);
    }
    // Replied entries are not dropped early.
    for i in 0..3u16 {
        let mut r = pkt(PROTO_UDP, ip(2), 53, ip(1), i, 0);
        assert_eq!(ct.track(&mut r, 0), CtVerdict::Established);
    }
    let mut p = pkt(PROTO_UDP, ip(1), 100, ip(2), 53, 0);
    assert_eq!(ct.track(&mut p, 0), CtVerdict::TableFull);
    assert_eq!(p.ct_state, ct_state::INVALID);
    assert_eq!(ct.stats().insert_failed, 1);
    // Once one is unreplied... there is none; delete one and add an unreplied one.
    assert_eq!(ct.delete(|v| v.original.sport == 0), 1);
    assert_eq!(ct.track(&mut p, 0), CtVerdict::New);
    let mut p2 = pkt(PROTO_UDP, ip(1), 101, ip(2), 53, 0);
    assert_eq!(ct.track(&mut p2, 0), CtVerdict::New);
    let s = ct.stats();
    assert_eq!((s.entries, s.early_drops, s.new_total), (3, 1, 5));
    let sports: Vec<u16> = ct.list().iter().map(|v| v.original.sport).collect();
    assert!(
        sports.contains(&101) && !sports.contains(&100),
        "{sports:?}"
    );
}

#[test]
fn delete_and_flush() {
    let ct = table(16, 1000);
    for i in 0..50u16 {
        let mut p = pkt(PROTO_UDP, ip(1), i, ip(2), 53, 0);
        ct.track(&mut p, 0);
    }
    assert_eq!(ct.delete(|v| v.original.sport < 10), 10);
    assert_eq!(ct.list().len(), 40);
    assert_eq!(ct.flush(), 40);
    assert_eq!(ct.stats().entries, 0);
}

#[test]
fn config_errors() {
    let c = ConntrackConfig::default();
    assert!(Conntrack::new(c).is_ok());
    let e = |c| Conntrack::new(c).err();
    assert_eq!(
        e(ConntrackConfig { buckets: 0, ..c }),
        Some(ConntrackError::Buckets(0))
    );
    assert_eq!(
        e(ConntrackConfig { locks: 0, ..c }),
        Some(ConntrackError::NoLocks)
    );
    assert_eq!(
        e(ConntrackConfig {
            max_entries: 0,
            ..c
        }),
        Some(ConntrackError::NoEntries)
    );
}

/// Writers open flows (each flow by two threads at once, from both directions), delete and GC
/// while readers track established flows; afterwards every flow exists exactly once and the
/// counters add up.
#[test]
fn concurrent_readers_and_writers_keep_counts() {
    const FLOWS: u16 = 2000;
    let ct = Arc::new(table(256, 1 << 20));
    // Long-lived flows the readers use.
    for i in 0..100u16 {
        let mut p = pkt(PROTO_UDP, ip(9), i, ip(8), 53, 0);
        ct.track(&mut p, 0);
        let mut r = pkt(PROTO_UDP, ip(8), 53, ip(9), i, 0);
        ct.track(&mut r, 0);
    }
    let mut handles = Vec::new();
    for w in 0..4u16 {
        let ct = Arc::clone(&ct);
        handles.push(std::thread::spawn(move || {
            for i in 0..FLOWS {
                // Threads 0 and 1 open the same flows from opposite sides, 2 and 3 likewise.
                let (a, b) = (ip(1 + (w / 2) as u8), ip(100));
                let mut p = if w % 2 == 0 {
                    pkt(PROTO_UDP, a, i, b, 53, 0)
                } else {
                    pkt(PROTO_UDP, b, 53, a, i, 0)
                };
                let v = ct.track(&mut p, 1);
                assert!(
                    matches!(v, CtVerdict::New | CtVerdict::Established),
                    "{v:?}"
                );
            }
        }));
    }
    for _ in 0..2 {
        let ct = Arc::clone(&ct);
        handles.push(std::thread::spawn(move || {
            for round in 0..20 {
                for i in 0..100u16 {
                    let mut r = pkt(PROTO_UDP, ip(8), 53, ip(9), i, 0);
                    assert_eq!(ct.track(&mut r, 2), CtVerdict::Established, "round {round}");
                }
            }
        }));
    }
    // A churner: short flows created and deleted again.
    {
        let ct = Arc::clone(&ct);
        handles.push(std::thread::spawn(move || {
            for i in 0..2000u16 {
                let mut p = pkt(PROTO_TCP, ip(50), i, ip(51), 80, SYN);
                assert_eq!(ct.track(&mut p, 3), CtVerdict::New);
                if i % 2 == 0 {
                    ct.delete(|v| v.original.src == ip(50) && v.original.sport == i);
                }
                ct.gc(3, 4);
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let l = ct.list();
    let mut keys: Vec<Tuple> = l.iter().map(|v| v.original).collect();
    keys.sort_by_key(|t| (t.src, t.dst, t.sport, t.dport, t.protocol));
    keys.dedup();
    assert_eq!(keys.len(), l.len(), "no duplicate entries");
    let expected = 100 + 2 * usize::from(FLOWS) + 1000;
    assert_eq!(l.len(), expected);
    let s = ct.stats();
    assert_eq!(s.entries as usize, expected);
    assert_eq!(
        s.new_total as usize,
        expected + 1000,
        "inserts - deletes = entries"
    );
    assert_eq!(s.early_drops + s.insert_failed, 0);
    // Every flow of both writer pairs was seen from both sides: established.
    assert!(
        l.iter()
            .filter(|v| v.original.protocol == PROTO_UDP)
            .all(|v| v.seen_reply)
    );
}

#[test]
fn icmp_errors_about_tracked_flows_are_related() {
    let ct = table(64, 100);
    tcp(&ct, false, SYN, 0);
    let inner = Tuple {
        src: ip(1),
        dst: ip(2),
        protocol: PROTO_TCP,
        sport: 1000,
        dport: 80,
    };
    // A router tells the client its SYN did not get through.
    let mut unreach = pkt(PROTO_ICMP, ip(7), 0, ip(1), 0, 0);
    unreach.icmp_type = 3;
    assert_eq!(
        ct.track_related(&mut unreach, &inner, S),
        CtVerdict::Related
    );
    assert_eq!(unreach.ct_state, ct_state::RELATED);
    // The same error quoting the server's side of the flow (the reply tuple) is RELATED too.
    assert_eq!(
        ct.track_related(&mut unreach, &inner.reply(), S),
        CtVerdict::Related
    );
    // Unknown flow, expired flow, not an error, NOTRACK.
    let other = Tuple {
        sport: 1001,
        ..inner
    };
    assert_eq!(
        ct.track_related(&mut unreach, &other, S),
        CtVerdict::Invalid
    );
    assert_eq!(unreach.ct_state, ct_state::INVALID);
    assert_eq!(
        ct.track_related(&mut unreach, &inner, 121 * S),
        CtVerdict::Invalid
    );
    let mut echo = pkt(PROTO_ICMP, ip(7), 0, ip(1), 0, 0);
    echo.icmp_type = 8;
    assert_eq!(ct.track_related(&mut echo, &inner, S), CtVerdict::Invalid);
    let mut untracked = unreach;
    untracked.ct_state = ct_state::UNTRACKED;
    assert_eq!(
        ct.track_related(&mut untracked, &inner, S),
        CtVerdict::Untracked
    );
    // ICMPv6 packet too big.
    let mut ptb = pkt(PROTO_ICMPV6, ip(7), 0, ip(1), 0, 0);
    ptb.icmp_type = 2;
    assert_eq!(ct.track_related(&mut ptb, &inner, S), CtVerdict::Related);
    assert_eq!(ct.stats().entries, 1, "errors open no entries");
}

#[test]
fn track_reads_the_embedded_header_and_peek_changes_nothing() {
    let ct = table(64, 100);
    let mut unreach = pkt(PROTO_ICMP, ip(7), 0, ip(1), 0, 0);
    unreach.icmp_type = 3;
    unreach.facts.embedded = Some(Tuple {
        src: ip(1),
        dst: ip(2),
        protocol: PROTO_TCP,
        sport: 1000,
        dport: 80,
    });
    assert_eq!(ct.peek(&unreach, 0), CtVerdict::Invalid, "no flow yet");
    let mut syn = pkt(PROTO_TCP, ip(1), 1000, ip(2), 80, SYN);
    assert_eq!(ct.peek(&syn, 0), CtVerdict::New);
    assert_eq!(ct.stats().entries, 0, "peek inserts nothing");
    ct.track(&mut syn, 0);
    assert_eq!(ct.peek(&unreach, S), CtVerdict::Related);
    assert_eq!(ct.track(&mut unreach, S), CtVerdict::Related);
    assert_eq!(unreach.ct_state, ct_state::RELATED);
    // Without the embedded header the error is INVALID.
    unreach.facts.embedded = None;
    assert_eq!(ct.track(&mut unreach, S), CtVerdict::Invalid);
    // peek of the SYN-ACK says ESTABLISHED but leaves SYN_SENT and the timeout alone.
    let before = ct.list();
    let synack = pkt(PROTO_TCP, ip(2), 80, ip(1), 1000, SYN | ACK);
    assert_eq!(ct.peek(&synack, 5 * S), CtVerdict::Established);
    assert_eq!(ct.list(), before);
    assert_eq!(before[0].tcp_state, Some(TcpState::SynSent));
    // A SYN on the same tuple in SYN_SENT is a retransmission: NEW. Expired: NEW as well.
    assert_eq!(ct.peek(&syn, S), CtVerdict::New);
    let ack = pkt(PROTO_TCP, ip(1), 1000, ip(2), 80, ACK);
    assert_eq!(ct.peek(&ack, S), CtVerdict::Invalid);
    // Expired: no entry, so the ACK is picked up mid-stream (loose), INVALID when strict.
    assert_eq!(ct.peek(&ack, 500 * S), CtVerdict::New, "expired: no entry");
    assert_eq!(strict_table().peek(&ack, 500 * S), CtVerdict::Invalid);
}

#[test]
fn filters_match_like_conntrack_tools() {
    use crate::model::{Family, IpNet};
    let ct = table(64, 100);
    tcp(&ct, false, SYN, 0);
    tcp(&ct, true, SYN | ACK, 0);
    let mut dns = pkt(PROTO_UDP, ip(1), 5353, ip(9), 53, 0);
    ct.track(&mut dns, 0);
    let mut ping = pkt(PROTO_ICMP, ip(1), 0, ip(9), 0, 0);
    ping.icmp_type = 8;
    ct.track(&mut ping, 0);
    let hits = |f: ConnFilter| ct.list().iter().filter(|c| f.matches(c)).count();
    assert_eq!(hits(ConnFilter::default()), 3);
    let v4 = ConnFilter {
        family: Some(Family::Ipv4),
        ..ConnFilter::default()
    };
    assert_eq!(hits(v4), 3);
    let v6 = ConnFilter {
        family: Some(Family::Ipv6),
        ..ConnFilter::default()
    };
    assert_eq!(hits(v6), 0);
    let to9 = ConnFilter {
        dst: IpNet::new(ip(9), 32),
        ..ConnFilter::default()
    };
    assert_eq!(hits(to9), 2);
    let net = ConnFilter {
        src: IpNet::new(ip(0), 24),
        dport: Some(53),
        ..ConnFilter::default()
    };
    assert_eq!(hits(net), 1);
    // The reply tuple is not what -s/-d look at.
    let from2 = ConnFilter {
        src: IpNet::new(ip(2), 32),
        ..ConnFilter::default()
    };
    assert_eq!(hits(from2), 0);
    // ICMP keeps type/code in dport: a port filter never matches it.
    let port = ConnFilter {
        protocol: Some(PROTO_ICMP),
        dport: Some(8 << 8),
        ..ConnFilter::default()
    };
    assert_eq!(hits(port), 0);
    let state = ConnFilter {
        tcp_state: Some(TcpState::SynRecv),
        ..ConnFilter::default()
    };
    assert_eq!(hits(state), 1);
    assert_eq!(TcpState::from_name("syn_recv"), Some(TcpState::SynRecv));
    assert_eq!(TcpState::from_name("LISTEN"), None);
    for s in TcpState::ALL {
        assert_eq!(TcpState::from_name(s.name()), Some(s));
    }
}

/// Four threads open more flows than the table holds while a fifth collects garbage: the
/// maximum holds up to the number of concurrent inserters, every flow is either in the table or
/// was dropped early or refused, and the counters agree with the chains.
#[test]
fn concurrent_early_drop_keeps_counts() {
    const MAX: usize = 64;
    let ct = Arc::new(table(32, MAX));
    let handles: Vec<_> = (0..4u8)
        .map(|w| {
            let ct = Arc::clone(&ct);
            std::thread::spawn(move || {
                let mut new = 0u64;
                for i in 0..1000u16 {
                    let mut p = pkt(PROTO_TCP, ip(10 + w), i, ip(2), 80, SYN);
                    match ct.track(&mut p, u64::from(i)) {
                        CtVerdict::New => new += 1,
                        CtVerdict::TableFull => {}
                        v => panic!("{v:?}"),
                    }
                    assert!(ct.stats().entries as usize <= MAX + 4);
                    if i % 3 == 0 {
                        let mut r = pkt(PROTO_TCP, ip(2), 80, ip(10 + w), i, SYN | ACK);
                        ct.track(&mut r, u64::from(i));
                    }
                }
                new
            })
        })
        .collect();
    let gc = {
        let ct = Arc::clone(&ct);
        std::thread::spawn(move || {
            for _ in 0..200 {
                ct.gc(500, 8);
            }
        })
    };
    let new: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    gc.join().unwrap();
    let s = ct.stats();
    let l = ct.list();
    assert_eq!(s.entries as usize, l.len());
    assert!(l.len() <= MAX);
    assert_eq!(s.new_total, new);
    assert!(s.early_drops > 0);
    assert!(s.new_total >= s.entries + s.early_drops, "{s:?}");
}

#[test]
fn track_batch_matches_track() {
    let ct = table(64, 100);
    let mut pkts = [
        pkt(PROTO_TCP, ip(1), 1000, ip(2), 80, SYN),
        pkt(PROTO_TCP, ip(2), 80, ip(1), 1000, SYN | ACK),
        pkt(PROTO_TCP, ip(1), 1000, ip(2), 80, ACK),
        pkt(PROTO_TCP, ip(1), 1001, ip(2), 80, FIN | ACK),
    ];
    let mut v = [CtVerdict::Invalid; 4];
    ct.track_batch(&mut pkts, 0, &mut v);
    use CtVerdict::*;
    assert_eq!(v, [New, Established, Established, Invalid]);
    let states: Vec<u8> = pkts.iter().map(|p| p.ct_state).collect();
    use ct_state::*;
    assert_eq!(states, [NEW, ESTABLISHED, ESTABLISHED, INVALID]);
}

fn udp_flow(i: u32) -> (Packet, Packet) {
    let a = IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + i));
    let port = 1024 + (i % 50_000) as u16;
    (
        pkt(PROTO_UDP, a, port, ip(2), 53, 0),
        pkt(PROTO_UDP, ip(2), 53, a, port, 0),
    )
}

/// An explicit resize (up and down) keeps every entry findable from both directions, once.
#[test]
fn resize_keeps_every_entry() {
    let ct = table(16, 4096);
    for i in 0..1000 {
        assert_eq!(ct.track(&mut udp_flow(i).0, 0), CtVerdict::New);
    }
    for buckets in [1024, 2, 3000] {
        let n = ct.resize(buckets).unwrap();
        assert_eq!(n, buckets.next_power_of_two());
        assert_eq!(ct.buckets(), n);
        assert_eq!(ct.list().len(), 1000, "after resize to {n}");
        for i in (0..1000).step_by(7) {
            assert_eq!(
                ct.track(&mut udp_flow(i).1, 0),
                CtVerdict::Established,
                "flow {i} after resize to {n}"
            );
        }
    }
    assert_eq!(ct.stats().entries, 1000);
    assert_eq!(ct.resize(0), Err(ConntrackError::Buckets(0)));
    assert_eq!(ct.delete(|v| v.original.dport == 53), 1000);
    assert_eq!(ct.stats().entries, 0);
}

/// GC doubles the table while it holds more entries than buckets, up to `max_entries`
/// rounded up to a power of two.
#[test]
fn gc_grows_the_table_up_to_the_maximum() {
    let ct = table(4, 50);
    for i in 0..20 {
        ct.track(&mut udp_flow(i).0, 0);
    }
    ct.gc(0, 4);
    assert_eq!(
        ct.buckets(),
        8,
        "20 entries > 4 buckets: one doubling per gc"
    );
    ct.gc(0, 8);
    assert_eq!(ct.buckets(), 16);
    ct.gc(0, 16);
    assert_eq!(ct.buckets(), 32);
    ct.gc(0, 32);
    assert_eq!(ct.buckets(), 32, "20 entries fit 32 buckets");
    for i in 20..50 {
        ct.track(&mut udp_flow(i).0, 0);
    }
    for _ in 0..4 {
        ct.gc(0, 64);
    }
    assert_eq!(ct.buckets(), 64, "capped at max_entries rounded up");
    assert_eq!(ct.list().len(), 50);
}

/// Two threads open flows and look up their earlier flows while a third resizes the table
/// up and down: no lookup misses a live entry, no entry is duplicated or lost.
#[test]
fn lookups_and_inserts_race_with_resizes() {
    let ct = Arc::new(table(4, 1 << 16));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resizer = {
        let (ct, stop) = (Arc::clone(&ct), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u32;
            // A pause between resizes: back-to-back resizes would starve lookups (a walk
            // that overlaps a resize retries), which is why the server only grows from GC.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                ct.resize(if n % 2 == 0 { 2 } else { 512 }).unwrap();
                n += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            n
        })
    };
    let workers: Vec<_> = (0..2u32)
        .map(|w| {
            let ct = Arc::clone(&ct);
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let id = w * 10_000 + i;
                    assert_eq!(ct.track(&mut udp_flow(id).0, 0), CtVerdict::New, "{id}");
                    let old = w * 10_000 + i / 2;
                    assert_eq!(
                        ct.track(&mut udp_flow(old).1, 0),
                        CtVerdict::Established,
                        "reply of {old}"
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let resizes = resizer.join().unwrap();
    assert!(resizes > 0);
    let l = ct.list();
    assert_eq!(l.len(), 4000);
    assert_eq!(ct.stats().entries, 4000);
    let mut keys: Vec<_> = l.iter().map(|v| v.original).collect();
    keys.sort_by_key(|t| format!("{t:?}"));
    keys.dedup();
    assert_eq!(keys.len(), 4000, "no entry listed twice");
}

/// Corner cases of the TCP state machine where nf_conntrack accepts the packet (a valid
/// transition, or "ignored" without a state change) and a `--ctstate INVALID -j DROP` rule
/// must not drop it.
#[test]
fn tcp_retransmissions_and_simultaneous_open_are_not_invalid() {
    // The server's SYN-ACK retransmitted after the client's ACK was seen (the ACK got lost
    // behind the firewall): nf_conntrack ignores it in ESTABLISHED (sIG), it is not INVALID.
    let ct = table(64, 100);
    tcp(&ct, false, SYN, 0);
    tcp(&ct, true, SYN | ACK, 0);
    tcp(&ct, false, ACK, 0);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::Established));
    assert_eq!(tcp(&ct, true, SYN | ACK, S), ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::Established));

    // The client's SYN retransmitted after the SYN-ACK was seen (sSR, SYN: sIG).
    let ct = table(64, 100);
    tcp(&ct, false, SYN, 0);
    tcp(&ct, true, SYN | ACK, 0);
    assert_eq!(tcp(&ct, false, SYN, S), ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::SynRecv));
    assert_eq!(tcp(&ct, false, ACK, S), ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::Established));

    // Simultaneous open: SYN both ways, then SYN-ACK both ways, then ACKs (sS2 -> sSR on
    // either side's SYN-ACK).
    let ct = table(64, 100);
    assert_eq!(tcp(&ct, false, SYN, 0), ct_state::NEW);
    assert_eq!(tcp(&ct, true, SYN, 0), ct_state::ESTABLISHED);
    assert_eq!(tcp(&ct, false, SYN | ACK, 0), ct_state::ESTABLISHED);
    assert_eq!(tcp(&ct, true, SYN | ACK, 0), ct_state::ESTABLISHED);
    assert_eq!(tcp(&ct, false, ACK, 0), ct_state::ESTABLISHED);
    assert_eq!(ct.list()[0].tcp_state, Some(TcpState::Established));
}

/// An ICMP error about an SCTP (or DCCP, UDP-Lite) flow: the tracker keys those flows
/// without ports (generic), so the parsed embedded header must be keyed the same way or the
/// error is never RELATED.
#[test]
fn icmp_error_about_an_sctp_flow_is_related() {
    use crate::packet::parse::parse_ip;
    // IPv4 10.0.0.1 -> 10.0.0.2, protocol 132 (SCTP), then the 12-byte SCTP common header
    // (ports 5000 -> 36412, verification tag, checksum).
    let mut sctp = vec![
        0x45, 0, 0, 32, 0, 1, 0, 0, 64, 132, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    sctp.extend_from_slice(&[0x13, 0x88, 0x8e, 0x3c, 0, 0, 0, 1, 0, 0, 0, 0]);
    let mut p = parse_ip(&sctp, Packet::default()).unwrap();
    assert_eq!(p.protocol, 132);
    let ct = table(64, 100);
    assert_eq!(ct.track(&mut p, 0), CtVerdict::New);
    // A router 10.0.0.7 answers with destination unreachable quoting the packet.
    let mut icmp = vec![
        0x45,
        0,
        0,
        (20 + 8 + sctp.len()) as u8,
        0,
        2,
        0,
        0,
        64,
        1,
        0,
        0,
        10,
        0,
        0,
        7,
        10,
        0,
        0,
        1,
    ];
    icmp.extend_from_slice(&[3, 1, 0, 0, 0, 0, 0, 0]);
    icmp.extend_from_slice(&sctp);
    let mut e = parse_ip(&icmp, Packet::default()).unwrap();
    assert!(e.facts.embedded.is_some());
    assert_eq!(ct.track(&mut e, S), CtVerdict::Related);
}

/// Stress: two threads track flows (new, replies, re-creation after expiry) on an advancing
/// clock while a third runs GC with growth, explicit resizes, deletes by filter and flushes,
/// all at once, with a small maximum so early drop runs too. Afterwards the count equals the
/// listed entries, each listed once, each findable in both directions.
#[test]
fn gc_resize_delete_flush_race_lookups() {
    let ct = Arc::new(table(2, 512));
    let clock = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admin = {
        let (ct, clock, stop) = (Arc::clone(&ct), Arc::clone(&clock), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut round = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let now = clock.load(std::sync::atomic::Ordering::Relaxed);
                ct.gc(now, 64);
                match round % 4 {
                    0 => {
                        ct.resize(if round % 8 == 0 { 4 } else { 256 }).unwrap();
                    }
                    1 => {
                        ct.delete(|v| v.original.sport % 3 == 0);
                    }
                    2 if round % 16 == 2 => {
                        ct.flush();
                    }
                    _ => {}
                }
                round += 1;
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            round
        })
    };
    let workers: Vec<_> = (0..2u32)
        .map(|w| {
            let (ct, clock) = (Arc::clone(&ct), Arc::clone(&clock));
            std::thread::spawn(move || {
                for i in 0..20_000u32 {
                    let id = w * 100_000 + i % 700;
                    // Time moves 1 s per 100 packets: UDP entries (30 s) expire while in use.
                    let now = clock.fetch_add(S / 100, std::sync::atomic::Ordering::Relaxed);
                    let (mut q, mut r) = udp_flow(id);
                    let v = ct.track(&mut q, now);
                    assert!(
                        matches!(
                            v,
                            CtVerdict::New | CtVerdict::Established | CtVerdict::TableFull
                        ),
                        "{v:?}"
                    );
                    if i % 2 == 0 {
                        let v = ct.track(&mut r, now);
                        // The entry may have been deleted, flushed or dropped meanwhile.
                        assert!(
                            matches!(
                                v,
                                CtVerdict::New | CtVerdict::Established | CtVerdict::TableFull
                            ),
                            "{v:?}"
                        );
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(admin.join().unwrap() > 0);
    let l = ct.list();
    assert_eq!(ct.stats().entries, l.len() as u64);
    assert!(l.len() <= 512 + 2, "{}", l.len());
    let mut keys: Vec<_> = l.iter().map(|v| v.original).collect();
    keys.sort_by_key(|t| format!("{t:?}"));
    keys.dedup();
    assert_eq!(keys.len(), l.len(), "no entry listed twice");
    let now = clock.load(std::sync::atomic::Ordering::Relaxed);
    for v in &l {
        if v.expires_ns > now {
            let mut p = Packet::from(PacketMeta {
                src: v.reply.src,
                dst: v.reply.dst,
                protocol: v.reply.protocol,
                sport: v.reply.sport,
                dport: v.reply.dport,
                ..PacketMeta::default()
            });
            assert_eq!(ct.peek(&p, now), CtVerdict::Established, "{v:?}");
            assert_eq!(ct.track(&mut p, now), CtVerdict::Established, "{v:?}");
        }
    }
    assert_eq!(ct.flush(), l.len());
    assert_eq!(ct.stats().entries, 0);
}

/// `max_entries` near `usize::MAX` (a `--conntrack-max` typo) builds a working table: the
/// growth limit is capped at the largest size a resize accepts instead of overflowing
/// `next_power_of_two`.
#[test]
fn huge_max_entries_do_not_overflow() {
    for max_entries in [usize::MAX, (1 << 63) + 1, (1 << 62) + 1] {
        let ct = Conntrack::new(ConntrackConfig {
            buckets: 2,
            max_entries,
            locks: 4,
            tcp_loose: true,
        })
        .unwrap();
        for i in 0..8 {
            assert_eq!(ct.track(&mut udp_flow(i).0, 0), CtVerdict::New);
        }
        ct.gc(0, 2);
        assert_eq!(ct.buckets(), 4, "grows by doubling");
        assert_eq!(ct.list().len(), 8);
    }
}

fn in_zone(mut p: Packet, id: u16, dirs: u8) -> Packet {
    p.facts.ct_zone = Some(CtZone { id, dirs });
    p
}

#[test]
fn two_zones_keep_separate_entries_for_the_same_tuple() {
    let ct = table(64, 100);
    let query = pkt(PROTO_UDP, ip(1), 5000, ip(2), 53, 0);
    let answer = pkt(PROTO_UDP, ip(2), 53, ip(1), 5000, 0);
    let both = CtZone::ORIG | CtZone::REPLY;
    for zone in [1, 2] {
        let mut p = in_zone(query, zone, both);
        assert_eq!(ct.track(&mut p, 0), CtVerdict::New, "zone {zone}");
    }
    let mut p = query;
    assert_eq!(ct.track(&mut p, 0), CtVerdict::New, "the default zone");
    assert_eq!(ct.stats().entries, 3);
    let mut zones: Vec<u16> = ct.list().iter().map(|c| c.zone.id).collect();
    zones.sort_unstable();
    assert_eq!(zones, [0, 1, 2]);
    // The answer in zone 1 belongs to zone 1's entry only.
    let mut a = in_zone(answer, 1, both);
    assert_eq!(ct.track(&mut a, S), CtVerdict::Established);
    let mut again = in_zone(query, 2, both);
    assert_eq!(
        ct.track(&mut again, S),
        CtVerdict::New,
        "zone 2 saw no reply"
    );
    let mut again = in_zone(query, 1, both);
    assert_eq!(ct.track(&mut again, S), CtVerdict::Established);
    // A lookup only (trace) keys by the zone too.
    assert_eq!(ct.peek(&in_zone(query, 7, both), S), CtVerdict::New);
    assert_eq!(
        ct.peek(&in_zone(answer, 1, both), S),
        CtVerdict::Established
    );
    assert_eq!(ct.stats().entries, 3);
}

#[test]
fn a_one_direction_zone_keys_that_direction_only() {
    // `--zone-orig 5`: the entry is in zone 5 for its original tuple and in zone 0 for its
    // reply tuple, so an answer that no CT rule put in a zone finds it (nf_ct_zone_equal by
    // the direction that matched); an answer in zone 5 both ways does not.
    let ct = table(64, 100);
    let query = pkt(PROTO_UDP, ip(1), 5000, ip(2), 53, 0);
    let answer = pkt(PROTO_UDP, ip(2), 53, ip(1), 5000, 0);
    let mut q = in_zone(query, 5, CtZone::ORIG);
    assert_eq!(ct.track(&mut q, 0), CtVerdict::New);
    assert_eq!(
        ct.peek(&in_zone(answer, 5, CtZone::ORIG | CtZone::REPLY), S),
        CtVerdict::New
    );
    let mut plain = answer;
    assert_eq!(ct.track(&mut plain, S), CtVerdict::Established);
    assert_eq!(ct.stats().entries, 1);
    // The original direction without the zone is another connection.
    assert_eq!(ct.peek(&query, S), CtVerdict::New);
}

#[test]
fn zones_survive_save_and_restore() {
    let ct = table(64, 100);
    let query = pkt(PROTO_UDP, ip(1), 5000, ip(2), 53, 0);
    // (A `--zone-reply 9` entry of `query` itself would be found by the default zone's
    // lookup: its original tuple is in zone 0. So it gets its own port.)
    let other = pkt(PROTO_UDP, ip(1), 5001, ip(2), 53, 0);
    for (p, id, dirs) in [
        (query, 1, CtZone::ORIG | CtZone::REPLY),
        (other, 9, CtZone::REPLY),
        (query, 0, 3),
    ] {
        assert_eq!(ct.track(&mut in_zone(p, id, dirs), 0), CtVerdict::New);
    }
    let text = ct.save(0);
    assert!(
        text.contains(" zone=1\n") && text.contains(" zone-reply=9\n"),
        "{text}"
    );
    let again = table(64, 100);
    assert_eq!(again.restore(&text, 0, 0).unwrap().restored, 3);
    let key = |c: &ConnView| (c.zone.id, c.zone.dirs);
    let mut a: Vec<_> = ct.list().iter().map(key).collect();
    let mut b: Vec<_> = again.list().iter().map(key).collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    // Restored entries are found in their zone.
    let answer = pkt(PROTO_UDP, ip(2), 53, ip(1), 5000, 0);
    let both = CtZone::ORIG | CtZone::REPLY;
    assert_eq!(
        again.peek(&in_zone(answer, 1, both), S),
        CtVerdict::Established
    );
}
