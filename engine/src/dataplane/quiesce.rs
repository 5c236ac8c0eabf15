//! Waiting for cores: after the new snapshot is published and the barrier ran, every core that was
//! inside a batch (odd generation) must pass a quiescent point before the old snapshot may go.

use crate::sync::{AtomicU64, Ordering, spin_loop, yield_now};

/// Spins of `spin_loop` per core before the committer starts yielding its CPU. About 1-10 us on
/// current x86-64 (a `pause` is 10-140 cycles): longer than a typical batch, short enough that a
/// committer sharing a CPU with a preempted worker gives it the CPU soon.
pub(crate) const SPIN_LIMIT: u32 = 1 << 10;

/// Reads every generation once, then waits for each core that was inside a batch (odd) to move
/// on; returns how many cores were waited for. Idle cores (even) never delay a commit.
///
/// Must run after the writer barrier (see `crate::dataplane`). The generations are all read
/// first and only then waited on, so a core that starts a new batch meanwhile (which loaded the
/// new pointer) does not make us wait for it.
pub(crate) fn quiesce<'a>(generations: impl IntoIterator<Item = &'a AtomicU64>) -> usize {
    let busy: Vec<(&AtomicU64, u64)> = generations
        .into_iter()
        // Acquire: when the value read is a core's end-of-batch (even) store, the core's reads of
        // the snapshot it used in that batch happen-before everything we do next. Odd values are
        // handled by `wait_moved`.
        .map(|g| (g, g.load(Ordering::Acquire)))
        .filter(|(_, v)| v % 2 == 1)
        .collect();
    for &(g, seen) in &busy {
        wait_moved(g, seen);
    }
    busy.len()
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
            // The worker is probably preempted (or its batch is long); give it our CPU.
            yield_now();
        }
    }
}
