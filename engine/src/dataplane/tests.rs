//! Unit tests of the dataplane with std threads (the loom model is in `loom_model.rs`).

use std::sync::atomic::{
    AtomicBool as StdBool, AtomicU64 as StdU64, AtomicUsize, Ordering::SeqCst,
};
use std::sync::{Arc, mpsc};
use std::thread;

use super::*;

/// A clock driven by a closure (tests observe or fake time with it).
struct FnClock<F>(F);

impl<F: Fn() -> u64 + Send + Sync> Clock for FnClock<F> {
    fn now_ns(&self) -> u64 {
        (self.0)()
    }
}

/// A clock that advances 10 ns per read.
fn ticking() -> Arc<dyn Clock> {
    let t = StdU64::new(0);
    Arc::new(FnClock(move || t.fetch_add(10, SeqCst)))
}

/// A snapshot that records its own drop in a registry that outlives it, so readers can check
/// "not freed" without touching freed memory.
struct Snap {
    id: usize,
    freed: Arc<Vec<StdBool>>,
}

impl Drop for Snap {
    fn drop(&mut self) {
        self.freed[self.id].store(true, SeqCst);
    }
}

fn registry(n: usize) -> Arc<Vec<StdBool>> {
    Arc::new((0..n).map(|_| StdBool::new(false)).collect())
}

fn strategies() -> [BarrierStrategy; 2] {
    [BarrierStrategy::SeqCst, BarrierStrategy::Membarrier]
}

#[test]
fn generations_advance_by_two_per_batch_and_count() {
    for strategy in strategies() {
        let dp = Dataplane::new(7u32, 3, strategy, ticking());
        let mut w = dp.worker(1).unwrap();
        for i in 0..5u64 {
            let seen = w.batch(|s, b| {
                b.add_packets(i);
                assert_eq!(b.core(), 1);
                *s
            });
            assert_eq!(seen, 7);
        }
        assert_eq!(dp.generations(), vec![0, 10, 0]);
        assert_eq!(dp.batches(), vec![0, 5, 0]);
        assert_eq!(dp.packets(), vec![0, 10, 0]);
        // Inside a batch the counter is odd.
        w.batch(|_, _| assert_eq!(dp.generations()[1], 11));
        assert_eq!(dp.generations()[1], 12);
    }
}

#[test]
fn claims_are_exclusive_and_checked() {
    let dp = Dataplane::new((), 2, BarrierStrategy::SeqCst, ticking());
    assert_eq!(
        dp.worker(2).unwrap_err(),
        DataplaneError::CoreOutOfRange { core: 2, cores: 2 }
    );
    let mut w = dp.worker(0).unwrap();
    w.batch(|_, _| ());
    assert_eq!(
        dp.worker(0).unwrap_err(),
        DataplaneError::CoreClaimed { core: 0 }
    );
    drop(w);
    // A new worker continues the counter of the previous one.
    let mut w = dp.worker(0).unwrap();
    w.batch(|_, _| ());
    assert_eq!(dp.generations()[0], 4);
}

#[test]
fn idle_cores_do_not_delay_a_commit() {
    for strategy in strategies() {
        let dp = Dataplane::new(1u32, 8, strategy, ticking());
        let mut w = dp.worker(3).unwrap();
        w.batch(|_, _| ());
        let (old, report) = dp.commit(Box::new(2));
        assert_eq!(*old, 1);
        assert_eq!(report.cores_waited, 0);
        assert_eq!(w.batch(|s, _| *s), 2);
    }
}

/// A worker is stuck inside a batch on the old snapshot while a commit runs: the commit must
/// wait for it (cores_waited = 1) and return only after it ended the batch; idle cores don't
/// count. Then the worker starts a new batch at once and stays in it until the commit returned:
/// the commit must accept "changed" (odd again), not wait for "even".
#[test]
fn a_busy_core_delays_the_commit_until_its_counter_moves() {
    for strategy in strategies() {
        // Counts the committer's clock reads: the 2nd is taken after publish + barrier + the one
        // read of every generation, just before waiting.
        let committer_reads = Arc::new(AtomicUsize::new(0));
        let reads = Arc::clone(&committer_reads);
        let clock = Arc::new(FnClock(move || {
            if thread::current().name() == Some("committer") {
                reads.fetch_add(1, SeqCst);
            }
            0
        }));
        let dp = Dataplane::new(1u32, 4, strategy, clock);
        let first_batch_done = StdBool::new(false);
        let commit_returned = StdBool::new(false);
        thread::scope(|s| {
            let (in_batch_tx, in_batch_rx) = mpsc::channel();
            let (dp, committer_reads, first_batch_done, commit_returned) =
                (&dp, &committer_reads, &first_batch_done, &commit_returned);
            s.spawn(move || {
                let mut w = dp.worker(1).unwrap();
                w.batch(|snap, _| {
                    assert_eq!(*snap, 1);
                    in_batch_tx.send(()).unwrap();
                    // Stay in the batch until the commit has published and looked at us.
                    while committer_reads.load(SeqCst) < 2 {
                        thread::yield_now();
                    }
                    first_batch_done.store(true, SeqCst);
                });
                // Odd again at once; must not block the commit.
                w.batch(|snap, _| {
                    assert_eq!(
                        *snap, 2,
                        "a batch after the commit's look must see the new one"
                    );
                    while !commit_returned.load(SeqCst) {
                        thread::yield_now();
                    }
                });
            });
            in_batch_rx.recv().unwrap();
            thread::Builder::new()
                .name("committer".into())
                .spawn_scoped(s, move || {
                    let (old, report) = dp.commit(Box::new(2));
                    assert!(first_batch_done.load(SeqCst), "commit returned mid-batch");
                    assert_eq!(*old, 1);
                    assert_eq!(report.cores_waited, 1);
                    commit_returned.store(true, SeqCst);
                })
                .unwrap();
        });
        assert_eq!(dp.generations(), vec![0, 4, 0, 0]);
    }
}

/// Many commits against busy workers: no batch ever sees a freed snapshot, and each worker sees
/// snapshot ids in non-decreasing order.
#[test]
fn many_commits_with_concurrent_workers_never_use_after_free() {
    // Sized for a 2-core CI machine: with more workers than CPUs a commit can wait a whole
    // scheduler slice for a preempted worker.
    const COMMITS: usize = 300;
    const WORKERS: usize = 3;
    for strategy in strategies() {
        let freed = registry(COMMITS + 1);
        let dp = Dataplane::new(
            Snap {
                id: 0,
                freed: Arc::clone(&freed),
            },
            WORKERS,
            strategy,
            ticking(),
        );
        let stop = StdBool::new(false);
        thread::scope(|s| {
            for core in 0..WORKERS {
                let (dp, stop, freed) = (&dp, &stop, &freed);
                s.spawn(move || {
                    let mut w = dp.worker(core).unwrap();
                    let mut last = 0;
                    while !stop.load(SeqCst) {
                        w.batch(|snap, b| {
                            assert!(!freed[snap.id].load(SeqCst), "use after free");
                            assert!(snap.id >= last, "went back from {last} to {}", snap.id);
                            last = snap.id;
                            b.add_packets(4);
                            std::hint::black_box(snap.id);
                            assert!(!freed[snap.id].load(SeqCst), "freed during the batch");
                        });
                    }
                });
            }
            // Retired snapshots are dropped on a reclaimer thread, as the server would.
            let (tx, rx) = mpsc::channel::<Retired<Snap>>();
            s.spawn(move || rx.into_iter().for_each(drop));
            // Let every worker get going before committing.
            while dp.batches().contains(&0) {
                thread::yield_now();
            }
            for id in 1..=COMMITS {
                let (old, _) = dp.commit(Box::new(Snap {
                    id,
                    freed: Arc::clone(&freed),
                }));
                assert_eq!(old.id, id - 1);
                tx.send(old).unwrap();
            }
            drop(tx);
            stop.store(true, SeqCst);
        });
        assert!(dp.packets().iter().sum::<u64>() > 0);
        drop(dp);
        assert!(
            freed.iter().all(|f| f.load(SeqCst)),
            "every snapshot freed once"
        );
    }
}

#[test]
fn membarrier_fallback_reason_is_reported() {
    let mut enosys = |_| Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
    let dp = Dataplane::with_membarrier((), 1, BarrierStrategy::Membarrier, ticking(), &mut enosys);
    assert_eq!(dp.barrier(), BarrierStrategy::SeqCst);
    assert_eq!(dp.requested_barrier(), BarrierStrategy::Membarrier);
    let reason = dp.fallback_reason().unwrap();
    assert!(reason.contains("query failed"), "{reason}");
    assert!(matches!(dp.fallback_error(), Some(BarrierError::Query(_))));
    // The fallback dataplane works.
    let (_, report) = dp.commit(Box::new(()));
    assert_eq!(report.cores_waited, 0);

    let dp = Dataplane::new((), 1, BarrierStrategy::SeqCst, ticking());
    assert_eq!(dp.fallback_reason(), None);
}

#[test]
fn real_membarrier_registers_or_explains() {
    let dp = Dataplane::new((), 1, BarrierStrategy::Membarrier, ticking());
    match dp.barrier() {
        BarrierStrategy::Membarrier => assert_eq!(dp.fallback_reason(), None),
        BarrierStrategy::SeqCst => assert!(dp.fallback_reason().is_some()),
    }
}

#[test]
fn a_panicking_batch_leaves_the_core_idle() {
    let dp = Dataplane::new(0u8, 1, BarrierStrategy::SeqCst, ticking());
    let mut w = dp.worker(0).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.batch(|_, _| panic!("boom"));
    }));
    assert!(r.is_err());
    assert_eq!(dp.generations(), vec![2]);
    let (_, report) = dp.commit(Box::new(1));
    assert_eq!(report.cores_waited, 0);
}

#[test]
fn sampled_batches_fill_the_histogram() {
    let dp = Dataplane::new(0u8, 2, BarrierStrategy::SeqCst, ticking());
    let mut w = dp.worker(0).unwrap();
    for _ in 0..=SAMPLE_EVERY {
        w.batch(|_, b| b.add_packets(10));
    }
    let h = dp.barrier_histogram();
    // Batches 0 and 1024 are sampled. Fake clock: 10 ns per read, the overhead pair says 10 ns,
    // (10 + 10) - 2 * 10 = 0 ns of barrier.
    assert_eq!(h.count(), 2);
    assert_eq!(h.sum_ps(), 0);
}

#[test]
fn with_active_and_commit_report_timings() {
    let dp = Dataplane::new(String::from("a"), 1, BarrierStrategy::SeqCst, ticking());
    assert_eq!(dp.with_active(|s| s.clone()), "a");
    let (old, report) = dp.commit(Box::new(String::from("b")));
    assert_eq!(old.into_inner().as_str(), "a");
    assert_eq!(report.publish_ns, 10);
    assert_eq!(report.quiesce_ns, 10);
    assert_eq!(dp.with_active(|s| s.clone()), "b");
}

/// `publish` returns while a core is mid-batch on the old snapshot: the old one stays
/// readable and unfreed, a batch that begins after the return runs the new one, and `retire`
/// hands the old one back only once the mid-batch core moved on.
#[test]
fn publish_returns_before_the_mid_batch_core_moves_on() {
    for strategy in strategies() {
        let freed = registry(2);
        let dp = Dataplane::new(
            Snap {
                id: 0,
                freed: Arc::clone(&freed),
            },
            2,
            strategy,
            ticking(),
        );
        let (entered_tx, entered) = mpsc::channel();
        let (leave_tx, leave) = mpsc::channel::<()>();
        thread::scope(|s| {
            let (dp_ref, freed_ref) = (&dp, &freed);
            let reader = s.spawn(move || {
                let (dp, freed) = (dp_ref, freed_ref);
                let mut w = dp.worker(0).unwrap();
                let batch = w.enter();
                entered_tx.send(batch.snapshot().id).unwrap();
                leave.recv().unwrap();
                // Still the snapshot the batch began with, never freed while it runs.
                assert_eq!(batch.snapshot().id, 0);
                assert!(!freed[0].load(SeqCst), "read after free");
            });
            assert_eq!(entered.recv().unwrap(), 0);
            let new = Box::new(Snap {
                id: 1,
                freed: Arc::clone(&freed),
            });
            let (old, report) = dp.publish(new);
            assert_eq!(report.cores_waited, 1);
            assert_eq!(report.quiesce_ns, 0);
            assert_eq!(old.cores_waited(), 1);
            assert!(!old.is_quiescent(), "core 0 is still in its batch");
            assert_eq!(old.get().id, 0);
            // A batch that begins now, on the other core, runs the new snapshot.
            let mut w1 = dp.worker(1).unwrap();
            assert_eq!(w1.batch(|s, _| s.id), 1);
            assert!(!freed[0].load(SeqCst));
            leave_tx.send(()).unwrap();
            reader.join().unwrap();
            assert!(old.is_quiescent());
            let retired = old.retire();
            assert_eq!(retired.id, 0);
            assert!(!freed[0].load(SeqCst));
            drop(retired);
            assert!(freed[0].load(SeqCst));
        });
        assert!(!freed[1].load(SeqCst));
    }
}

/// Dropping an `Unpublished` without retiring it waits for the mid-batch core as retire
/// does (it never frees early), and several publishes may be outstanding at once.
#[test]
fn unpublished_drop_waits_and_publishes_overlap() {
    let freed = registry(3);
    let dp = Dataplane::new(
        Snap {
            id: 0,
            freed: Arc::clone(&freed),
        },
        1,
        BarrierStrategy::SeqCst,
        ticking(),
    );
    let (entered_tx, entered) = mpsc::channel();
    let (leave_tx, leave) = mpsc::channel::<()>();
    thread::scope(|s| {
        let (dp_ref, freed_ref) = (&dp, &freed);
        let reader = s.spawn(move || {
            let (dp, freed) = (dp_ref, freed_ref);
            let mut w = dp.worker(0).unwrap();
            let batch = w.enter();
            entered_tx.send(()).unwrap();
            leave.recv().unwrap();
            assert!(!freed[batch.snapshot().id].load(SeqCst), "read after free");
        });
        entered.recv().unwrap();
        let (first, _) = dp.publish(Box::new(Snap {
            id: 1,
            freed: Arc::clone(&freed),
        }));
        let (second, _) = dp.publish(Box::new(Snap {
            id: 2,
            freed: Arc::clone(&freed),
        }));
        // The second publish replaced snapshot 1, which no batch ever loaded: but core 0 is
        // still in the batch it began before both, so both wait for it.
        assert_eq!((first.cores_waited(), second.cores_waited()), (1, 1));
        let dropper = s.spawn(move || drop(first));
        leave_tx.send(()).unwrap();
        reader.join().unwrap();
        dropper.join().unwrap();
        assert!(freed[0].load(SeqCst));
        assert_eq!(second.retire().id, 1);
    });
    assert!(freed[1].load(SeqCst));
    assert!(!freed[2].load(SeqCst));
}
