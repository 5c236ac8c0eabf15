//! Loom model of the commit protocol (`RUSTFLAGS="--cfg loom"`; see the module docs of
//! [`crate::dataplane`] for the argument it checks).
//!
//! Readers run batches that read a snapshot's content through a loom `UnsafeCell` (so loom reports
//! any read that is not ordered before the snapshot's drop) and assert its "freed" flag is clear.
//! A writer commits a new snapshot, checks that no reader is still inside a batch holding the old
//! one, and drops the retired snapshot. Under loom both strategies use `fence(SeqCst)` on the
//! reader side (loom cannot model the asymmetric membarrier pairing) and the membarrier syscall
//! is modelled as the writer's `fence(SeqCst)`.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom cargo test -p vallum-engine
//! --release --lib loom`. The preemption bound is fixed at [`PREEMPTIONS`] (override with the
//! `LOOM_MAX_PREEMPTIONS` environment variable).

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::{BarrierStrategy, Dataplane};
use crate::Clock;

/// Default preemption bound: 3 explores every interleaving with up to 3 preemptions.
const PREEMPTIONS: usize = 3;

struct ZeroClock;

impl Clock for ZeroClock {
    fn now_ns(&self) -> u64 {
        0
    }
}

/// A snapshot whose drop is visible to the model.
struct TestSnap {
    id: u64,
    /// Read by readers inside batches, written by `drop`: loom flags unordered access.
    value: UnsafeCell<u64>,
    freed: Arc<AtomicBool>,
}

// SAFETY: `value` is written only in `drop` (with `&mut self`, exclusive) and otherwise only read;
// loom checks that those reads are ordered before the drop, which is the property under test.
unsafe impl Sync for TestSnap {}

impl TestSnap {
    fn new(id: u64, freed: Arc<AtomicBool>) -> TestSnap {
        TestSnap {
            id,
            value: UnsafeCell::new(id + 100),
            freed,
        }
    }

    /// What a batch does with the snapshot.
    fn read(&self) -> u64 {
        // Relaxed: a stricter check than Acquire; any `true` seen at all is a use after free.
        assert!(
            !self.freed.load(Relaxed),
            "snapshot {} read after free",
            self.id
        );
        // SAFETY: shared read; the only write is in `drop`, and loom reports it if unordered.
        self.value.with(|p| unsafe { *p })
    }

    /// What dropping does to the snapshot, observably: overwrite the value, set the flag.
    fn poison(&self) {
        self.value.with_mut(|p| {
            // SAFETY: a write through the cell; loom reports it if any read is unordered with it
            // (that is the use-after-free this model looks for).
            unsafe { *p = 0xdead }
        });
        self.freed.store(true, Relaxed);
    }
}

impl Drop for TestSnap {
    fn drop(&mut self) {
        self.poison();
    }
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    // `Builder::new` reads LOOM_MAX_PREEMPTIONS; default to our bound when it is not set.
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(PREEMPTIONS);
    }
    b
}

/// `readers` reader threads, each running `batches` batches, against `commits` commits.
fn check(strategy: BarrierStrategy, readers: usize, batches: usize, commits: u64) {
    builder().check(move || {
        let freed: Vec<Arc<AtomicBool>> = (0..=commits)
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
        let dp = Arc::new(Dataplane::new(
            TestSnap::new(0, Arc::clone(&freed[0])),
            readers,
            strategy,
            std::sync::Arc::new(ZeroClock),
        ));
        // Per reader: 1 + the id of the snapshot its current batch loaded, 0 outside batches.
        let holding: Arc<Vec<AtomicU64>> =
            Arc::new((0..readers).map(|_| AtomicU64::new(0)).collect());

        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let (dp, holding) = (Arc::clone(&dp), Arc::clone(&holding));
                loom::thread::spawn(move || {
                    let mut w = dp.worker(r).expect("one worker per core");
                    for _ in 0..batches {
                        w.batch(|snap, b| {
                            holding[r].store(snap.id + 1, Relaxed);
                            assert_eq!(snap.read(), snap.id + 100);
                            b.add_packets(1);
                            holding[r].store(0, Relaxed);
                        });
                    }
                })
            })
            .collect();

        let mut graveyard = Vec::new();
        for id in 1..=commits {
            let (retired, _report) =
                dp.commit(Box::new(TestSnap::new(id, Arc::clone(&freed[id as usize]))));
            // Once commit returned, no reader may still be inside a batch that loaded the
            // retired snapshot (id - 1). Relaxed: the only happens-before we may rely on is the
            // protocol's.
            for (r, h) in holding.iter().enumerate() {
                assert_ne!(
                    h.load(Relaxed),
                    id,
                    "reader {r} still holds snapshot {}",
                    id - 1
                );
            }
            assert_eq!(retired.id, id - 1);
            assert_eq!(retired.read(), id - 1 + 100);
            // "Free" it: poison it now, but keep the memory until the readers are joined, so that
            // a protocol bug shows as a loom report (causality violation or the freed assertion)
            // instead of a segfault in a reader that dereferences a really freed box.
            let retired = retired.into_inner();
            retired.poison();
            graveyard.push(retired);
        }

        for h in handles {
            h.join().expect("reader panicked");
        }
        drop(graveyard);
        assert_eq!(dp.batches().iter().sum::<u64>(), (readers * batches) as u64);
    });
}

#[test]
fn loom_one_reader_two_batches_seqcst() {
    check(BarrierStrategy::SeqCst, 1, 2, 1);
}

#[test]
fn loom_one_reader_two_batches_membarrier() {
    check(BarrierStrategy::Membarrier, 1, 2, 1);
}

#[test]
fn loom_two_readers_one_batch_seqcst() {
    check(BarrierStrategy::SeqCst, 2, 1, 1);
}

#[test]
fn loom_one_reader_three_batches_two_commits() {
    check(BarrierStrategy::SeqCst, 1, 3, 2);
}

#[test]
fn loom_two_readers_two_batches_seqcst() {
    check(BarrierStrategy::SeqCst, 2, 2, 1);
}
