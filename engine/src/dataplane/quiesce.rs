//! Waiting for cores: after the new snapshot is published and the barrier ran, every core that was
//! inside a batch (odd generation) must pass a quiescent point before the old snapshot may go.

use crate::sync::{AtomicU64, Ordering, spin_loop};

/// Spins of `spin_loop` per core before the committer starts sleeping. About 10-50 us on
/// current x86-64 (a `pause` is 10-140 cycles): longer than a typical batch.
pub(crate) const SPIN_LIMIT: u32 = 1 << 10;

/// How long the committer sleeps per round once spinning did not help, in us.
///
/// A worker still odd after the spins is almost surely preempted, waiting for a CPU. The
/// committer then sleeps rather than calling `sched_yield`: when every CPU is busy, yielding does
/// not reliably hand the CPU to the preempted worker (EEVDF may pick another task, or the yielder
/// again), and in `benches/quiesce.rs` with workers = CPUs on a loaded 2-CPU VM, 16 yields before
/// sleeping gave a median commit of ~12-14 ms against ~0.15 ms for spinning then sleeping, in
/// the same run. Under loom (no sleeping) it yields to the model's scheduler instead.
#[cfg_attr(loom, allow(dead_code))] // loom yields instead of sleeping
pub(crate) const SLEEP_US: u64 = 50;

/// Reads every generation once and returns the cores inside a batch (odd), with the value seen.
///
/// Must run after the writer barrier (see `crate::dataplane`). The generations are all read
/// first and only then waited on (in [`wait_all`]), so a core that starts a new batch meanwhile
/// (which loaded the new pointer) does not make us wait for it.
pub(crate) fn look<'a>(
    generations: impl IntoIterator<Item = &'a AtomicU64>,
) -> Vec<(&'a AtomicU64, u64)> {
    generations
        .into_iter()
        // Acquire: when the value read is a core's end-of-batch (even) store, the core's reads of
        // the snapshot it used in that batch happen-before everything we do next. Odd values are
        // handled by `wait_moved`.
        .map(|g| (g, g.load(Ordering::Acquire)))
        .filter(|(_, v)| v % 2 == 1)
        .collect()
}

/// Waits for each core [`look`] found busy to move on. Idle cores were never in the list, so
/// they never delay a commit.
pub(crate) fn wait_all(busy: &[(&AtomicU64, u64)]) {
    for &(g, seen) in busy {
        wait_moved(g, seen);
    }
}

/// Waits until `generation` differs from `seen` (an odd value read after the barrier).
///
/// Any change means the core ended the batch that might hold the old snapshot: the next value
/// it stores is the even end-of-batch value, and every later value is stored after that. Every
/// generation store is a Release store, so our Acquire load of any later value synchronizes with
/// a store sequenced after the end of that batch: the core's reads of the old snapshot
/// happen-before our return (and so before the caller frees it). We do not wait for the value to
/// become even: a core that is odd again is in a new batch, which loaded the new pointer.
pub(crate) fn wait_moved(generation: &AtomicU64, seen: u64) {
    let mut spins = 0u32;
    // Acquire: see above; pairs with the worker's Release generation stores.
    while generation.load(Ordering::Acquire) == seen {
        if spins < SPIN_LIMIT {
            spins += 1;
            spin_loop();
        } else {
            // The worker is probably preempted (or its batch is long): give our CPU away. Not a
            // clock read; the engine still takes no time from the OS, it only blocks.
            #[cfg(not(loom))]
            std::thread::sleep(std::time::Duration::from_micros(SLEEP_US));
            #[cfg(loom)]
            crate::sync::yield_now();
        }
    }
}
