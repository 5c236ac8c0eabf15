//! Waiting for cores: after the new snapshot is published and the barrier ran, every core that was
//! inside a batch (odd generation) must pass a quiescent point before the old snapshot may go.

use crate::sync::{AtomicU64, Ordering, spin_loop, yield_now};

/// How the committer waits for a core that is still inside a batch: spin, then yield, then
/// sleep. Set it with `Dataplane::set_backoff`.
///
/// A worker still odd after the spins is probably preempted, waiting for a CPU — often by the
/// committer itself, which woke up on the worker's CPU. Yielding then gives it back at once; but
/// under foreign load `sched_yield` may hand the CPU to another task for a whole slice (EEVDF),
/// where sleeping is better. Measured with `benches/quiesce.rs` on a 2-CPU VM loaded by other
/// processes (median commit, 2 us batches):
///
/// | workers | spin, yield once, sleep 20 us | spin, sleep 20 us | spin, yield 16x, sleep 50 us |
/// |---|---|---|---|
/// | CPUs - 1 | 2.2 us | 103 us | — |
/// | CPUs | 3.8 ms | 0.29 ms | ~12 ms |
///
/// The default yields once, for the recommended deployment that leaves a CPU to the committer;
/// with a worker on every CPU and other load on the machine, set `yields: 0`. Tails (p99) were
/// in the milliseconds in every setting on that machine (workers preempted by foreign load).
/// Under loom, sleeping is replaced by yielding to the model's scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// `spin_loop` rounds per core before yielding (default 1024: about 3-50 us on current
    /// x86-64, longer than a typical batch).
    pub spins: u32,
    /// `yield_now` rounds after the spins before sleeping (default 1).
    pub yields: u32,
    /// Sleep per round after that, in microseconds (default 20; Linux adds its timer slack,
    /// 50 us by default, to each sleep).
    pub sleep_us: u64,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            spins: 1 << 10,
            yields: 1,
            sleep_us: 20,
        }
    }
}

/// The cores a publisher must wait for before it may free (or reuse) what it unpublished: those
/// that were inside a batch when it looked ([`crate::dataplane::Quiescence::start`]), with the
/// generation seen. Waiting is deferred to [`crate::dataplane::Quiescence::wait`], so a publisher
/// can return at once and wait only before it next touches the old data, by which time the
/// cores have usually moved on (DPDK's `rte_rcu_qsbr_start` / `_check` split).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grace {
    /// (core index, odd generation seen).
    busy: Vec<(usize, u64)>,
}

impl Grace {
    /// Reads every generation once and keeps the cores inside a batch (odd), by index, with the
    /// value seen. Must run after the writer barrier (see `crate::dataplane`). The generations
    /// are all read first and only then waited on, so a core that starts a new batch meanwhile
    /// (which loaded the new pointer) does not make anyone wait for it.
    pub(crate) fn look<'a>(generations: impl IntoIterator<Item = &'a AtomicU64>) -> Grace {
        Grace {
            busy: (generations.into_iter().enumerate())
                // Acquire: when the value read is a core's end-of-batch (even) store, the core's
                // reads of the snapshot it used in that batch happen-before everything we do
                // next. Odd values are waited on (`wait_moved`).
                .map(|(i, g)| (i, g.load(Ordering::Acquire)))
                .filter(|(_, v)| v % 2 == 1)
                .collect(),
        }
    }

    /// The cores that were inside a batch, with the generation seen.
    pub(crate) fn busy(&self) -> &[(usize, u64)] {
        &self.busy
    }

    /// How many cores were inside a batch.
    pub fn cores_waited(&self) -> usize {
        self.busy.len()
    }
}

/// Whether `generation` differs from `seen` (an odd value read after the barrier): one
/// Acquire load, with the meaning and pairing of [`wait_moved`]'s; never waits.
pub(crate) fn moved(generation: &AtomicU64, seen: u64) -> bool {
    // Acquire: pairs with the worker's Release generation stores (see `wait_moved`).
    generation.load(Ordering::Acquire) != seen
}

pub(crate) fn wait_moved(generation: &AtomicU64, seen: u64, backoff: &Backoff) {
    let mut rounds = 0u64;
    let yield_until = u64::from(backoff.spins) + u64::from(backoff.yields);
    // Acquire: see above; pairs with the worker's Release generation stores.
    while generation.load(Ordering::Acquire) == seen {
        rounds += 1;
        if rounds <= u64::from(backoff.spins) {
            spin_loop();
        } else if rounds <= yield_until || cfg!(loom) {
            // Offer our CPU, in case we displaced the worker.
            yield_now();
        } else {
            // Give the CPU away for a while. Not a clock read; the engine still takes no time
            // from the OS, it only blocks.
            #[cfg(not(loom))]
            std::thread::sleep(std::time::Duration::from_micros(backoff.sleep_us));
        }
    }
}
