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
//! The `loom_deferred_*` models check a publish that returns at once and retires later
//! ([`super::Unpublished`]): several publishes outstanding, retired in any order and on
//! another thread, each only after the readers that could hold it.
//!
//! The `loom_set_*` models check set publication ([`super::left_right`]): readers inside
//! batches and outside them against a writer that publishes (and so changes each copy) several
//! times; a read unordered with a change of the copy it reads is a loom causality report.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom cargo test -p vallum-engine
//! --release --lib loom`. The preemption bound is fixed at [`PREEMPTIONS`] (override with the
//! `LOOM_MAX_PREEMPTIONS` environment variable).

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::left_right::{Absorb, LeftRight, Readers};
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

// === Deferred retire (publish now, retire later) ===

/// `readers` reader threads, each running `batches` batches, against `publishes` publishes
/// that return without waiting: the writer keeps every [`super::Unpublished`], reads each one
/// (as a carry reads counters), then retires the newest on another thread and the others here,
/// newest first, and poisons what retire hands back. A retire that returned while a reader
/// could still read that snapshot is a loom report (causality or the freed flag).
fn check_deferred(readers: usize, batches: usize, publishes: u64) {
    builder().check(move || {
        let freed: Vec<Arc<AtomicBool>> = (0..=publishes)
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
        let dp = Arc::new(Dataplane::new(
            TestSnap::new(0, Arc::clone(&freed[0])),
            readers,
            BarrierStrategy::SeqCst,
            std::sync::Arc::new(ZeroClock),
        ));
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let dp = Arc::clone(&dp);
                loom::thread::spawn(move || {
                    let mut w = dp.worker(r).expect("one worker per core");
                    for _ in 0..batches {
                        w.batch(|snap, _| assert_eq!(snap.read(), snap.id + 100));
                    }
                })
            })
            .collect();

        let mut outstanding = Vec::new();
        for id in 1..=publishes {
            let (old, report) =
                dp.publish(Box::new(TestSnap::new(id, Arc::clone(&freed[id as usize]))));
            assert_eq!(report.quiesce_ns, 0);
            // Not retired yet: readable (cores may read it too).
            assert_eq!(old.get().id, id - 1);
            assert_eq!(old.get().read(), id - 1 + 100);
            outstanding.push(old);
        }
        let newest = outstanding.pop().expect("at least one publish");
        let elsewhere = loom::thread::spawn(move || {
            let retired = newest.retire().into_inner();
            retired.poison();
            retired
        });
        let mut graveyard = Vec::new();
        while let Some(old) = outstanding.pop() {
            let retired = old.retire().into_inner();
            retired.poison();
            graveyard.push(retired);
        }
        graveyard.push(elsewhere.join().expect("retiring thread panicked"));
        for h in handles {
            h.join().expect("reader panicked");
        }
        drop(graveyard);
    });
}

#[test]
fn loom_deferred_one_reader_two_batches_one_publish() {
    check_deferred(1, 2, 1);
}

#[test]
fn loom_deferred_one_reader_two_batches_two_publishes() {
    check_deferred(1, 2, 2);
}

#[test]
fn loom_deferred_two_readers_one_batch_two_publishes() {
    check_deferred(2, 1, 2);
}

// === Set publication (left_right.rs) ===

/// A set's content as the model sees it: one value in a loom cell (loom reports a reader's
/// access that is not ordered before the writer's change of the same copy).
struct Copy {
    value: UnsafeCell<u64>,
}

// SAFETY: `value` is written only through `absorb` (`&mut self`, which the left-right cell hands
// out only for a copy no reader can see) and otherwise only read; loom checks that ordering,
// which is the property under test.
unsafe impl Sync for Copy {}

impl Absorb<u64> for Copy {
    fn absorb(&mut self, op: &u64) {
        // A write through the cell: loom checks it against every read of this copy.
        self.value.with_mut(|p| {
            // SAFETY: `&mut self`: the left-right cell gives the writer this copy only when no
            // reader can see it; loom reports it if that is not so.
            unsafe { *p = *op }
        });
    }

    fn op_size(_op: &u64) -> usize {
        1
    }

    fn size(&self) -> usize {
        // Never copy: the model checks the replay (the copy takes the same path).
        usize::MAX
    }

    fn copy_from(&mut self, live: &Copy) {
        let v = live.read();
        self.absorb(&v);
    }
}

impl Copy {
    fn new() -> Copy {
        Copy {
            value: UnsafeCell::new(0),
        }
    }

    fn read(&self) -> u64 {
        // SAFETY: shared read; loom reports it if a writer's change is unordered with it.
        self.value.with(|p| unsafe { *p })
    }
}

/// `batch_readers` workers (one batch of two reads each) and, with `slow_reader`, one thread
/// reading outside any batch, against a writer that publishes 1, 2, ..., `publishes` through a
/// cell protected by the dataplane's generations. Every read sees a published value, each
/// reader's values never go back, and no read races with the writer's changes of a copy.
fn check_set(batch_readers: usize, slow_reader: bool, publishes: u64) {
    builder().check(move || {
        let dp = Arc::new(Dataplane::new(
            (),
            batch_readers.max(1),
            BarrierStrategy::SeqCst,
            std::sync::Arc::new(ZeroClock),
        ));
        let readers =
            std::sync::Arc::new(Readers::new(Some(std::sync::Arc::clone(dp.quiescence()))));
        let cell = Arc::new(LeftRight::new(Copy::new(), Copy::new(), readers));

        let mut handles: Vec<_> = (0..batch_readers)
            .map(|r| {
                let (dp, cell) = (Arc::clone(&dp), Arc::clone(&cell));
                loom::thread::spawn(move || {
                    let mut w = dp.worker(r).expect("one worker per core");
                    w.batch(|_, _| {
                        let a = cell.read(Copy::read);
                        let b = cell.read(Copy::read);
                        assert!(a <= b && b <= publishes, "batch read {a} then {b}");
                    });
                })
            })
            .collect();
        if slow_reader {
            let cell = Arc::clone(&cell);
            handles.push(loom::thread::spawn(move || {
                let v = cell.read(Copy::read);
                assert!(v <= publishes, "slow read {v}");
            }));
        }

        for v in 1..=publishes {
            cell.publish(v);
            assert_eq!(cell.lock().live().read(), v);
        }
        for h in handles {
            h.join().expect("reader panicked");
        }
    });
}

#[test]
fn loom_set_batch_reader_two_publishes() {
    check_set(1, false, 2);
}

#[test]
fn loom_set_slow_reader_two_publishes() {
    check_set(0, true, 2);
}

#[test]
fn loom_set_batch_and_slow_reader_three_publishes() {
    check_set(1, true, 3);
}
