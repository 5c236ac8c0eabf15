//! Loom model of the table's publication, lookup, unlink and resize (`RUSTFLAGS="--cfg loom"`).
//!
//! What it checks: every interleaving (up to [`PREEMPTIONS`] preemptions) of two threads that
//! look up, insert, delete entries or resize a table of one or two buckets ends with no duplicate,
//! no lost entry, and counters that agree with the chains. What it does not check: the
//! reclamation itself (under loom retired nodes are freed when the table drops, see
//! [`super::reclaim`]) and races on the immutable tuples, which are plain fields loom cannot see.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom cargo test -p vallum-engine
//! --release --lib conntrack::loom_model`.

use std::net::{IpAddr, Ipv4Addr};

use loom::sync::Arc;

use super::*;

/// Default preemption bound (override with `LOOM_MAX_PREEMPTIONS`).
const PREEMPTIONS: usize = 3;

/// Runs `f` under loom and checks that it explored more than one interleaving.
fn model(f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(PREEMPTIONS);
    }
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&runs);
    b.check(move || {
        counted.fetch_add(1, Relaxed);
        f();
    });
    let runs = runs.load(Relaxed);
    eprintln!("loom explored {runs} interleavings");
    assert!(runs > 1, "loom explored a single interleaving");
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

fn udp(src: u8, sport: u16, dst: u8, dport: u16) -> Packet {
    Packet::from(PacketMeta {
        src: ip(src),
        dst: ip(dst),
        protocol: PROTO_UDP,
        sport,
        dport,
        ..PacketMeta::default()
    })
}

fn table(buckets: usize, locks: usize) -> Conntrack {
    Conntrack::new(ConntrackConfig {
        buckets,
        max_entries: 16,
        locks,
        tcp_loose: true,
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Both directions of one flow arrive at once on two threads: exactly one entry results (the
/// loser of the insert race finds the winner's entry under the locks), and it has seen a reply.
#[test]
fn concurrent_open_from_both_sides_gives_one_entry() {
    model(|| {
        let ct = Arc::new(table(2, 2));
        let t = {
            let ct = Arc::clone(&ct);
            loom::thread::spawn(move || ct.track(&mut udp(1, 1000, 2, 53), 0))
        };
        let b = ct.track(&mut udp(2, 53, 1, 1000), 0);
        let a = t.join().unwrap_or_else(|_| panic!("thread"));
        assert!(a == CtVerdict::New || b == CtVerdict::New, "{a:?} {b:?}");
        let l = ct.list();
        assert_eq!(l.len(), 1);
        assert!(l[0].seen_reply);
        let s = ct.stats();
        assert_eq!((s.entries, s.new_total), (1, 1));
    });
}

/// A lock-free lookup races with the deletion of the entry it looks for, in a chain shared
/// with another entry: the reader either updates the old entry or opens a new one; the other
/// entry is never lost; the counters agree with the chains.
#[test]
fn lookup_races_with_delete() {
    model(|| {
        let ct = Arc::new(table(1, 1));
        ct.track(&mut udp(1, 1, 2, 53), 0);
        ct.track(&mut udp(1, 2, 2, 53), 0);
        let t = {
            let ct = Arc::clone(&ct);
            loom::thread::spawn(move || ct.delete(|v| v.original.sport == 1))
        };
        let v = ct.track(&mut udp(1, 1, 2, 53), 1);
        let deleted = t.join().unwrap_or_else(|_| panic!("thread"));
        assert_eq!(v, CtVerdict::New);
        let l = ct.list();
        assert!(l.iter().any(|c| c.original.sport == 2), "bystander lost");
        assert_eq!(ct.stats().entries as usize, l.len());
        // Either the reader re-created the flow after the delete, or the delete removed the
        // entry after the reader's update; both ways at most one copy exists.
        assert!(l.iter().filter(|c| c.original.sport == 1).count() <= 1);
        assert!(deleted <= 1);
    });
}

/// Two inserts into one chain at once, then both are found by lock-free lookups.
#[test]
fn concurrent_inserts_into_one_chain_are_both_published() {
    model(|| {
        let ct = Arc::new(table(1, 1));
        let t = {
            let ct = Arc::clone(&ct);
            loom::thread::spawn(move || ct.track(&mut udp(1, 1, 2, 53), 0))
        };
        assert_eq!(ct.track(&mut udp(1, 2, 2, 53), 0), CtVerdict::New);
        assert_eq!(
            t.join().unwrap_or_else(|_| panic!("thread")),
            CtVerdict::New
        );
        assert_eq!(ct.track(&mut udp(2, 53, 1, 1), 0), CtVerdict::Established);
        assert_eq!(ct.track(&mut udp(2, 53, 1, 2), 0), CtVerdict::Established);
        assert_eq!(ct.stats().entries, 2);
    });
}

/// A lock-free lookup of an existing entry races with a resize that moves it (and its
/// neighbour) into a new array: the lookup still finds it (retrying when the generation moved),
/// and nothing is lost or duplicated.
#[test]
fn lookup_races_with_resize() {
    model(|| {
        let ct = Arc::new(table(1, 1));
        ct.track(&mut udp(1, 1, 2, 53), 0);
        ct.track(&mut udp(1, 2, 2, 53), 0);
        let t = {
            let ct = Arc::clone(&ct);
            loom::thread::spawn(move || ct.track(&mut udp(2, 53, 1, 1), 1))
        };
        assert_eq!(ct.resize(2), Ok(2));
        assert_eq!(
            t.join().unwrap_or_else(|_| panic!("thread")),
            CtVerdict::Established
        );
        assert_eq!(ct.buckets(), 2);
        assert_eq!(ct.list().len(), 2);
        assert_eq!(ct.stats().entries, 2);
    });
}

/// An insert races with a resize: the writer's generation check after locking puts the entry
/// into whichever array is current, so afterwards it is found from both directions.
#[test]
fn insert_races_with_resize() {
    model(|| {
        let ct = Arc::new(table(1, 1));
        let t = {
            let ct = Arc::clone(&ct);
            loom::thread::spawn(move || ct.track(&mut udp(1, 1, 2, 53), 0))
        };
        assert_eq!(ct.resize(2), Ok(2));
        assert_eq!(
            t.join().unwrap_or_else(|_| panic!("thread")),
            CtVerdict::New
        );
        assert_eq!(ct.track(&mut udp(2, 53, 1, 1), 0), CtVerdict::Established);
        assert_eq!(ct.list().len(), 1);
        assert_eq!(ct.stats().entries, 1);
    });
}

/// A lookup that may not fall back on an insert (tracing's `peek`) races with a resize: a walk
/// that a moved node led astray must notice the generation change and look again, or it would
/// report an existing flow as new.
#[test]
fn peek_races_with_resize() {
    model(|| {
        let ct = Arc::new(table(1, 1));
        ct.track(&mut udp(1, 1, 2, 53), 0);
        ct.track(&mut udp(1, 2, 2, 53), 0);
        let t = {
            let ct = Arc::clone(&ct);
            loom::thread::spawn(move || ct.peek(&udp(2, 53, 1, 1), 1))
        };
        assert_eq!(ct.resize(2), Ok(2));
        assert_eq!(
            t.join().unwrap_or_else(|_| panic!("thread")),
            CtVerdict::Established
        );
        assert_eq!(ct.stats().entries, 2);
    });
}
