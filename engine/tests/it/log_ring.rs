//! `-j LOG` on the packet path (issue #15, item 5): a worker keeps its hits in a fixed-capacity
//! ring of records (rule indices and the packet), so a batch with LOG hits allocates nothing
//! (counted by this binary's global allocator, per thread); a full ring counts what it drops;
//! records name their rule exactly as the per-packet `Vec<LogEvent>` sink does, until a
//! commit replaces their snapshot.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vallum_engine::Clock;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{
    Batch, Change, Engine, EngineConfig, EngineWorker, LOG_RING_CAPACITY, LogDrops,
};
use vallum_engine::model::{Family, Ruleset};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;

/// Counts the allocations (and reallocations) of the calling thread.
struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: the thread's slot may be gone while the thread exits.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged (so
// `System`'s guarantees are the caller's); the counting touches only a thread-local `Cell`
// and allocates nothing.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received (see the impl).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[derive(Default)]
struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

fn engine() -> Engine {
    Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ManualClock::default()),
    )
}

fn ruleset(name: &str, text: &str) -> Ruleset {
    parse_ruleset(name, text, &ParseOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn tcp(dport: u16) -> Packet {
    let src: IpAddr = "10.0.0.1".parse().unwrap();
    Packet {
        meta: PacketMeta {
            family: Family::Ipv4,
            src,
            dst: "10.0.0.2".parse().unwrap(),
            protocol: 6,
            sport: 40000,
            dport,
            tcp_flags: 0x02,
            len: 60,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new("eth0").unwrap(),
            src_mac: Some([2, 0, 0, 0, 0, 1]),
            ..PacketFacts::default()
        },
    }
}

/// `packets` through `w` at `now` as one batch, with `facts` beside it; allocates nothing.
fn process(
    w: &mut EngineWorker<'_>,
    packets: &mut [PacketMeta],
    facts: &mut [PacketFacts],
    verdicts: &mut [Verdict],
    now: u64,
) -> usize {
    let batch = Batch {
        facts,
        ..Batch::new(packets, verdicts)
    };
    w.process(batch, now).0
}

/// Rule 2 of INPUT logs ssh (then rule 3 accepts it); everything else falls to DROP.
const LOGGING: &str = "*filter\n:INPUT DROP [0:0]\n\
    -A INPUT -p udp -j ACCEPT\n\
    -A INPUT -p tcp --dport 22 -j LOG --log-prefix \"ssh: \" --log-level 6\n\
    -A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";

#[test]
fn a_batch_with_log_hits_allocates_nothing_and_the_records_name_their_rule() {
    let e = engine();
    e.commit(Change::Put(ruleset("web", LOGGING)), &NoSets)
        .expect("commits");
    let mut w = e.worker(0).expect("core 0");
    let mut packets = vec![tcp(22).meta; 64];
    packets[5] = tcp(80).meta;
    let mut facts = vec![tcp(22).facts; 64];
    let mut verdicts = vec![Verdict::Drop; packets.len()];
    // One batch first, so that nothing lazy is left for the measured one.
    process(&mut w, &mut packets.clone(), &mut facts, &mut verdicts, 1);
    assert_eq!(w.drain_log_records().len(), 63);

    let mut batch = packets.clone();
    let before = allocs();
    let n = process(&mut w, &mut batch, &mut facts, &mut verdicts, 2);
    let during = allocs() - before;
    assert_eq!(n, 64);
    assert_eq!(
        during, 0,
        "process_batch with 63 LOG hits allocated {during} times"
    );
    assert_eq!(verdicts[0], Verdict::Accept);
    assert_eq!(verdicts[5], Verdict::Drop);

    // The records in hit order, each naming rule 2 of INPUT with its packet; drained
    // without allocating.
    let before = allocs();
    let mut records = [None; 64];
    for (slot, r) in records.iter_mut().zip(w.drain_log_records()) {
        *slot = Some(r);
    }
    assert_eq!(allocs() - before, 0, "draining records allocated");
    assert!(records[63].is_none());
    let records: Vec<_> = records.iter().flatten().copied().collect();
    assert_eq!(records.len(), 63);
    assert!(records.iter().all(|r| r.rule == 2 && r.level == 6));
    assert!(records.iter().all(|r| r.packet.dport == 22));
    assert_eq!(records[0].packet.facts.src_mac, Some([2, 0, 0, 0, 0, 1]));
    assert_eq!(
        records[0].packet.facts.in_iface,
        IfName::new("eth0").unwrap()
    );

    // Named as the per-packet path (a trace's `Vec<LogEvent>`) names the same hit.
    let want = e.trace(&tcp(22), 3).logs;
    assert_eq!(want.len(), 1);
    let got = e.log_event(&records[0]).expect("its snapshot is active");
    assert_eq!(got, want[0]);
    assert_eq!(got.prefix.as_deref(), Some("ssh: "));
    assert_eq!((&*got.ruleset, &*got.chain, got.rule), ("web", "INPUT", 2));

    // `drain_logs` gives the same events.
    process(&mut w, &mut packets.clone(), &mut facts, &mut verdicts, 4);
    let events = w.drain_logs();
    assert_eq!(events.len(), 63);
    assert!(events.iter().all(|ev| *ev == want[0]));
    assert_eq!(w.log_drops(), LogDrops::default());
    assert!(w.drain_logs().is_empty());
}

#[test]
fn a_full_ring_counts_the_hits_it_drops_and_a_commit_makes_records_stale() {
    let e = engine();
    e.commit(Change::Put(ruleset("web", LOGGING)), &NoSets)
        .expect("commits");
    let mut w = e.worker(0).expect("core 0");
    let over = 10;
    let mut packets = vec![tcp(22).meta; LOG_RING_CAPACITY + over];
    let mut facts = vec![tcp(22).facts; packets.len()];
    let mut verdicts = vec![Verdict::Drop; packets.len()];
    process(&mut w, &mut packets.clone(), &mut facts, &mut verdicts, 1);
    w.drain_log_records().for_each(drop);
    assert_eq!(w.log_drops().full, over as u64);

    let before = allocs();
    process(&mut w, &mut packets, &mut facts, &mut verdicts, 2);
    assert_eq!(
        allocs() - before,
        0,
        "a batch that fills the ring allocated"
    );
    assert_eq!(w.log_drops().full, 2 * over as u64);
    assert!(verdicts.iter().all(|v| *v == Verdict::Accept));

    // The snapshot these records refer to is replaced: they cannot be named any more.
    let stale = w.drain_log_records().next().expect("a record");
    e.commit(Change::Put(ruleset("web", LOGGING)), &NoSets)
        .expect("commits");
    assert_eq!(e.log_event(&stale), None);
    process(
        &mut w,
        &mut [tcp(22).meta],
        &mut [],
        &mut [Verdict::Drop],
        3,
    );
    e.commit(Change::Put(ruleset("other", LOGGING)), &NoSets)
        .expect("commits");
    assert!(w.drain_logs().is_empty());
    assert_eq!(
        w.log_drops(),
        LogDrops {
            full: 2 * over as u64,
            stale: 1
        }
    );
}
