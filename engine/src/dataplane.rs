//! The per-core dataplane: workers read the published snapshot inside batches guarded by a
//! per-core generation counter; a committer publishes a new snapshot and waits until no core can
//! still hold the old one (quiescent-state-based reclamation: the per-CPU sequence-count wait of
//! x_tables' `xt_replace_table`, DPDK's `rte_rcu_qsbr`).
//!
//! [`Dataplane<S>`] is generic over the snapshot type `S`, so the protocol can be checked by loom
//! with a tiny `S`; the engine's compiled `Snapshot` is one instance.
//!
//! # Protocol
//!
//! Worker, one batch on core `c` ([`Worker::batch`]):
//! 1. `gen[c] += 1` (odd), a Release store (only core `c` writes `gen[c]`, so no RMW);
//! 2. reader barrier: `fence(SeqCst)` ([`BarrierStrategy::SeqCst`]) or a compiler fence
//!    ([`BarrierStrategy::Membarrier`]);
//! 3. `p = active.load(Acquire)`; run the batch on `&*p`;
//! 4. `gen[c] += 1` (even), a Release store.
//!
//! Committer ([`Dataplane::publish`], one at a time under a mutex, then
//! [`Unpublished::retire`], by anyone, at any later time):
//! 1. `old = active.swap(new, AcqRel)`;
//! 2. writer barrier: `fence(SeqCst)`, preceded by `membarrier(PRIVATE_EXPEDITED)` for the
//!    membarrier strategy;
//! 3. read every `gen[c]` (Acquire) and keep the odd ones ([`Grace`]); `publish` returns here,
//!    with `old` as an [`Unpublished`]: every batch that begins from now on runs `new`;
//! 4. retire: for each odd value `v` kept, wait until `gen[c] != v`;
//! 5. `old` is unreachable: hand it back as [`Retired`] for the caller to drop.
//!
//! [`Dataplane::commit`] is steps 1-5 in one call. Splitting at step 3 is what lets a caller
//! answer a commit as soon as the new snapshot is published (x_tables' `xt_replace_table` waits
//! for the per-CPU sequence counts before it returns; the caller of `publish` need not): the
//! wait for a core preempted mid-batch (milliseconds on a loaded host) moves off its path. Any
//! number of publishes may be outstanding; each [`Unpublished`] waits only for its own cores.
//!
//! # Memory-ordering argument
//!
//! **Claim A** (no core misses the commit): if a worker's step-3 load returns `old`, the
//! committer's step-3 read of that core returns the odd value of that batch (or a later value).
//! This is the store-buffering pattern: the worker stores `gen` then loads `active`; the
//! committer stores `active` then loads `gen`. Without fences both loads may read the old values
//! (each store still sits in its CPU's store buffer), and the committer would free a snapshot a
//! worker is about to read. With a SeqCst fence on both sides, the two fences are ordered in the
//! single total order S of SeqCst operations:
//! - worker fence before committer fence: the committer's `gen` load (after its fence) must
//!   observe the worker's odd store (before its fence) or a later one (C++ [atomics.fences]/
//!   [atomics.order] p4: fence–fence rule);
//! - committer fence before worker fence: the worker's `active` load must observe the swap or a
//!   later value, i.e. not `old`.
//!
//! So "worker loaded `old`" implies "committer saw the batch's odd value or later". If it saw the
//! odd value, step 3 waits for it to change (Claim B); if it saw a later value, that value was
//! stored after the batch ended, which is Claim B's case too.
//!
//! With the membarrier strategy the worker has only a compiler fence, which keeps the store and
//! the load in program order in the instruction stream but not in the CPU. The committer's
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every CPU currently running a thread of
//! this process execute a full memory barrier (an IPI; CPUs not running one of our threads pass a
//! full barrier at their next switch into it) before the call returns. At whatever instruction
//! the worker was interrupted, its compiler-ordered store→load pair is then either entirely
//! before that full barrier, or entirely after it, or split by it — in every case it behaves as
//! if the worker had a full fence at that point, which is the symmetric argument above (the
//! asymmetric-fence pairing of `sys_membarrier(2)`, Folly's `asymmetricHeavyBarrier`, liburcu's
//! `urcu-memb`). Loom cannot model this pairing; under loom both sides use `fence(SeqCst)`.
//!
//! **Claim B** (the waits are enough): every store to `gen[c]` is a Release store, and the
//! committer's loads are Acquire. When the committer reads a value stored at or after the end of
//! the batch that might hold `old`, it synchronizes with that store, and the worker's reads of
//! `*old` (sequenced before it) happen-before the committer's return and so before the caller
//! drops `old`. The odd (begin) store must be Release too, not Relaxed: a committer that spins
//! may skip the even value and read the *next* batch's odd value, and since C++20 a release
//! sequence no longer includes later plain stores of the same thread, so only a Release on that
//! store gives the happens-before. On x86-64 both Release stores are a plain `mov`; on arm64 an
//! `stlr`. The end-of-batch step needs no fence: there is no store→load pair there, only "reads
//! of `*old` before the even store", which Release orders.
//!
//! **Idle cores**: a core whose counter is even at step 3 is between batches; by Claim A its
//! next batch loads the new pointer, so it never delays a commit. A core that becomes odd after
//! step 3's read also loaded the new pointer; the committer reads all counters first and only
//! then waits, so it does not wait for such batches.
//!
//! **Deferred retire**: steps 4-5 need nothing from step 3 but the [`Grace`] (the cores and the
//! odd values seen) and the pointer, so they may run on another thread and after further
//! publishes: Claims A and B are about one swap and the loads of the generations after its
//! barrier, and a later swap changes neither. Until retire, `old` stays allocated and readable
//! (the [`Unpublished`] owns it; [`Unpublished::get`] lends it out, e.g. to read counters that
//! cores may still be adding to); dropping an `Unpublished` without retiring it waits as retire
//! does, so it is never freed early.
//!
//! **Publication**: the Release half of the swap pairs with the worker's Acquire load, so a
//! worker that loads `new` sees it fully built. The Acquire half pairs with the previous commit's
//! Release swap, so the committer owns `*old` (it may read and drop it).
//!
//! # What bounds quiesce latency
//!
//! The committer waits for the longest remaining batch among the cores that were mid-batch when it
//! looked (batches are short: one burst of packets); idle cores cost nothing. It grows when such a
//! worker is preempted mid-batch: then the commit waits until the scheduler runs the worker
//! again. That is most likely when every CPU is busy (workers = CPUs), where the committer itself
//! takes a CPU a preempted worker could use: after spinning it yields once, then sleeps in short
//! rounds to give its CPU away (see [`Backoff`], tunable with [`Dataplane::set_backoff`]). Pinning workers to
//! CPUs and leaving one CPU for the committer keeps commits in the microseconds. With the
//! membarrier strategy the `publish_ns` phase also includes the syscall, which waits for IPIs to
//! every CPU running one of our threads (~15-20 us measured in this VM, less on bare metal).

mod barrier;
mod histogram;
pub(crate) mod left_right;
mod quiesce;

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

pub use barrier::{BarrierError, BarrierStrategy};
pub use histogram::Histogram;
pub use quiesce::{Backoff, Grace};

use crate::Clock;
use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Mutex, Ordering, stat, thread_local};
use histogram::CoreHistogram;

/// One batch in this many (per core) is timed for the barrier-cost histogram (a power of two).
pub const SAMPLE_EVERY: u64 = 1024;

/// Errors of claiming a core for a worker.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DataplaneError {
    /// The core index is not below the number of cores the dataplane was built with.
    #[error("core {core} out of range (the dataplane has {cores} cores)")]
    CoreOutOfRange {
        /// The requested index.
        core: usize,
        /// The number of cores.
        cores: usize,
    },
    /// Another [`Worker`] holds this core (each core has at most one writer of its counter).
    #[error("core {core} is already claimed by a worker")]
    CoreClaimed {
        /// The requested index.
        core: usize,
    },
}

/// What a commit cost. Times in nanoseconds from the dataplane's [`Clock`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuiesceReport {
    /// Swap of the active pointer, the writer barrier (for membarrier: the syscall) and one read
    /// of every core's generation, ns.
    pub publish_ns: u64,
    /// Waiting for the cores that were mid-batch to move on, ns.
    pub quiesce_ns: u64,
    /// Number of cores that were mid-batch (odd generation) after the barrier.
    pub cores_waited: usize,
}

/// A snapshot that was active before a commit and that no core can reach any more.
///
/// The caller reads it (e.g. to carry counters into the new snapshot) and drops it, preferably
/// off the commit path (send it to a reclaimer thread; the engine spawns no threads itself).
#[derive(Debug)]
pub struct Retired<S> {
    snapshot: Box<S>,
}

impl<S> Retired<S> {
    /// The owned snapshot.
    pub fn into_inner(self) -> Box<S> {
        self.snapshot
    }
}

impl<S> std::ops::Deref for Retired<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.snapshot
    }
}

/// A snapshot that [`Dataplane::publish`] replaced, which cores that were mid-batch at the
/// publish may still be reading: owned, allocated and readable until [`Unpublished::retire`]
/// (or the drop) has waited for those cores (module docs, steps 4-5).
pub struct Unpublished<S> {
    /// From `Box::into_raw`, owned; `None` once retired.
    snapshot: Option<NonNull<S>>,
    /// The cores that were mid-batch after the publish's barrier.
    grace: Grace,
    quiescence: Arc<Quiescence>,
    backoff: Backoff,
    /// Owns an `S` (dropck); `Send`/`Sync` are the impls below.
    _owns: PhantomData<S>,
}

// SAFETY: an `Unpublished<S>` owns a boxed `S` and drops it on whichever thread retires or drops
// it (`S: Send`), while worker threads may still read `&S` (`S: Sync`).
unsafe impl<S: Send + Sync> Send for Unpublished<S> {}
// SAFETY: through `&Unpublished<S>` only `&S` is lent out (`S: Sync`); the rest is read-only.
unsafe impl<S: Send + Sync> Sync for Unpublished<S> {}

impl<S> Unpublished<S> {
    /// The replaced snapshot. Cores listed in the grace may still be inside a batch that reads
    /// it (and adds to its atomics, such as counters); nobody frees it while `self` lives.
    pub fn get(&self) -> &S {
        let Some(p) = self.snapshot else {
            unreachable!("an Unpublished holds its snapshot until retired")
        };
        // SAFETY: `p` came from `Box::into_raw` in `Dataplane::publish`, and only `retire` and
        // `drop` (which need `self`, so not while this borrow lives) free it. Cores only read
        // it through shared references (and atomics), so a shared reference is sound.
        unsafe { p.as_ref() }
    }

    /// How many cores were mid-batch at the publish (what retire waits for).
    pub fn cores_waited(&self) -> usize {
        self.grace.cores_waited()
    }

    /// The cores retire waits for, to wait on elsewhere ([`Quiescence::wait`]: a caller that
    /// keeps this in a locked queue waits outside the lock, then retires at once).
    pub fn grace(&self) -> &Grace {
        &self.grace
    }

    /// Whether every core that was mid-batch at the publish has moved on, so that
    /// [`Unpublished::retire`] returns without waiting. Never waits (DPDK's
    /// `rte_rcu_qsbr_check` without blocking). Once true it stays true.
    pub fn is_quiescent(&self) -> bool {
        self.quiescence.is_over(&self.grace)
    }

    /// Waits until no core can still read the snapshot (at most the rest of one batch per core
    /// the grace lists; at once when [`Unpublished::is_quiescent`]), then hands it back: the
    /// cores' reads of it happen-before this return (Claim B).
    pub fn retire(mut self) -> Retired<S> {
        self.quiescence.wait(&self.grace, &self.backoff);
        let Some(p) = self.snapshot.take() else {
            unreachable!("an Unpublished holds its snapshot until retired")
        };
        // SAFETY: `p` came from `Box::into_raw` in `Dataplane::publish` (or `with_membarrier`)
        // and is taken out of `self` once, above. The swap that unpublished it was followed by
        // the writer barrier and the look that made `grace`; we waited for every core it lists
        // (Claims A and B, module docs), so no core holds it and their reads happen-before this.
        let snapshot = unsafe { Box::from_raw(p.as_ptr()) };
        Retired { snapshot }
    }
}

impl<S> Drop for Unpublished<S> {
    fn drop(&mut self) {
        if let Some(p) = self.snapshot.take() {
            self.quiescence.wait(&self.grace, &self.backoff);
            // SAFETY: as in `retire`: owned, taken once, and the wait above ended the grace.
            drop(unsafe { Box::from_raw(p.as_ptr()) });
        }
    }
}

impl<S> std::fmt::Debug for Unpublished<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unpublished")
            .field("cores_waited", &self.grace.cores_waited())
            .finish_non_exhaustive()
    }
}

/// One core's slot. 128-byte aligned so no two cores' counters share a cache line (or the
/// adjacent line the x86 spatial prefetcher pulls in with it).
#[repr(align(128))]
struct Core {
    /// Odd while the core is inside a batch. Written by the claiming worker only.
    generation: AtomicU64,
    /// Whether a [`Worker`] holds this core.
    claimed: AtomicBool,
    /// Packets counted by the worker (statistics).
    packets: stat::AtomicU64,
    /// Batches run by the worker (statistics).
    batches: stat::AtomicU64,
    /// Sampled barrier cost per packet, ps (its buckets live in their own allocation).
    barrier_cost: CoreHistogram,
}

/// The per-core generation counters of a [`Dataplane`] and its barrier strategy, shared (in an
/// `Arc`) with whoever else publishes data that batches read and must retire it only when no
/// batch can still hold it: the contents of sets ([`crate::sets`], through
/// `left_right::LeftRight`). Such a publisher runs the committer's half of the protocol (module
/// docs) on its own pointer: store the new pointer, then [`Quiescence::start`] (writer barrier and
/// one look at every core), and free or reuse the old data only after [`Quiescence::wait`] on
/// that [`Grace`]. Readers need nothing but the batch they already run: a load of such a pointer
/// anywhere inside [`Worker::batch`] is ordered after the batch's odd generation store and
/// barrier exactly as the load of the snapshot is (Claim A holds for any load after the
/// barrier), and the batch's even store releases it (Claim B).
///
/// [`Quiescence::in_batch`] tells a reader whether the calling thread is inside a batch of this
/// dataplane; a reader outside one (a trace, a test calling a set directly) must protect itself
/// another way.
pub struct Quiescence {
    cores: Box<[Core]>,
    /// The effective strategy (after a possible fallback).
    strategy: BarrierStrategy,
}

#[cfg(not(loom))]
thread_local! {
    /// The [`Quiescence`] (its address) whose batch the calling thread is inside, 0 outside
    /// every batch. Set by [`Worker::batch`] around the closure, restored after it (nested
    /// batches of another dataplane keep the outer one's value for after they end). Only this
    /// thread reads it: no ordering.
    static IN_BATCH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

// Loom's `thread_local!` (one per model thread) takes no `const` initializer.
#[cfg(loom)]
thread_local! {
    static IN_BATCH: std::cell::Cell<usize> = std::cell::Cell::new(0);
}

impl Quiescence {
    /// An identifier of this quiescence domain, never 0 (its address).
    pub(crate) fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Whether the calling thread is inside a [`Worker::batch`] of the dataplane these
    /// generations belong to (so its core's generation is odd and the reader barrier ran).
    #[inline]
    pub fn in_batch(&self) -> bool {
        in_batch_of(self.id())
    }

    /// The writer's half after publishing a new pointer: the writer barrier (a `fence(SeqCst)`,
    /// with membarrier first for that strategy), then one Acquire read of every core's
    /// generation. The returned [`Grace`] lists the cores that were inside a batch; such a core
    /// may still hold the old pointer until it moves on. Cost: the barrier plus one load per core.
    pub fn start(&self) -> Grace {
        // Claim A (module docs): the barrier orders our pointer store before the loads below.
        barrier::writer_barrier(self.strategy);
        Grace::look(self.cores.iter().map(|c| &c.generation))
    }

    /// Waits until every core `grace` lists has moved past the batch it was in (at most the
    /// rest of one batch per core; returns at once when they already have). After this, no
    /// batch can hold the pointer that was replaced before [`Quiescence::start`], and its
    /// readers' accesses happen-before our return (Claim B).
    pub fn wait(&self, grace: &Grace, backoff: &Backoff) {
        for &(core, seen) in grace.busy() {
            if let Some(c) = self.cores.get(core) {
                quiesce::wait_moved(&c.generation, seen, backoff);
            }
        }
    }

    /// Whether every core `grace` lists has moved past the batch it was in; never waits. The
    /// same Acquire loads as [`Quiescence::wait`], so `true` gives the same happens-before.
    pub fn is_over(&self, grace: &Grace) -> bool {
        grace.busy().iter().all(|&(core, seen)| {
            self.cores
                .get(core)
                .is_none_or(|c| quiesce::moved(&c.generation, seen))
        })
    }

    /// The number of cores.
    pub fn cores(&self) -> usize {
        self.cores.len()
    }
}

impl std::fmt::Debug for Quiescence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quiescence")
            .field("cores", &self.cores.len())
            .field("barrier", &self.strategy)
            .finish()
    }
}

/// Whether the calling thread is inside a batch of the quiescence domain `id`
/// ([`Quiescence::id`]); `false` for any id when outside every batch.
#[inline]
pub(crate) fn in_batch_of(id: usize) -> bool {
    IN_BATCH.with(|c| c.get()) == id
}

/// The published snapshot and the per-core generation counters of the commit protocol (see the
/// [module docs](self)).
///
/// Share it between worker threads and the committer (`Arc<Dataplane<S>>` or scoped threads).
/// Each worker claims one core with [`Dataplane::worker`]; commits go through
/// [`Dataplane::commit`].
pub struct Dataplane<S> {
    /// The active snapshot, from `Box::into_raw`; never null while the dataplane lives.
    active: AtomicPtr<S>,
    /// The cores and the effective barrier strategy (after a possible fallback), shared with
    /// other publishers that retire what batches read ([`Quiescence`]).
    quiescence: Arc<Quiescence>,
    /// The effective strategy (a copy of the quiescence's, read by every worker).
    strategy: BarrierStrategy,
    requested: BarrierStrategy,
    fallback: Option<(BarrierError, String)>,
    /// One committer at a time; also keeps the active snapshot alive for `with_active`.
    commit_lock: Mutex<()>,
    /// Keeps the active snapshot alive for [`Dataplane::with_base`] (long reads: a commit's
    /// compile) without holding `commit_lock`, which the short reads take. A commit takes it
    /// before `commit_lock` (the one lock order).
    base_lock: Mutex<()>,
    /// How commits wait for busy cores.
    backoff: Backoff,
    clock: Arc<dyn Clock>,
    /// Owns an `S` (dropck), and opts out of the auto `Send`/`Sync` that `AtomicPtr` would give
    /// for every `S`; see the impls below.
    _owns: PhantomData<*mut S>,
}

// SAFETY: a `Dataplane<S>` owns boxed `S` values and drops them wherever it is dropped (needs
// `S: Send`); workers on other threads read `&S` through it (needs `S: Sync`).
unsafe impl<S: Send + Sync> Send for Dataplane<S> {}
// SAFETY: through `&Dataplane<S>`, threads read `&S` concurrently (needs `S: Sync`), and `commit`
// moves boxed `S` values in from, and hands retired ones out to, whichever thread calls it
// (needs `S: Send`). All shared mutable state is atomics or behind the mutex.
unsafe impl<S: Send + Sync> Sync for Dataplane<S> {}

// === impl Dataplane ===

impl<S> Dataplane<S> {
    /// A dataplane with `initial` active, `cores` idle cores and the given barrier strategy.
    ///
    /// For [`BarrierStrategy::Membarrier`] this registers the process for
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED` (build the dataplane before starting workers). If the
    /// kernel does not support it, the dataplane falls back to [`BarrierStrategy::SeqCst`]:
    /// [`Dataplane::barrier`] returns the strategy in effect and [`Dataplane::fallback_reason`]
    /// says why. The `clock` times 1 in [`SAMPLE_EVERY`] batches and each commit's phases.
    pub fn new(
        initial: S,
        cores: usize,
        strategy: BarrierStrategy,
        clock: Arc<dyn Clock>,
    ) -> Dataplane<S> {
        Dataplane::with_membarrier(
            initial,
            cores,
            strategy,
            clock,
            &mut barrier::membarrier_syscall,
        )
    }

    /// [`Dataplane::new`] with the membarrier syscall injected (tests drive the fallback).
    fn with_membarrier(
        initial: S,
        cores: usize,
        requested: BarrierStrategy,
        clock: Arc<dyn Clock>,
        sys: &mut dyn FnMut(i32) -> std::io::Result<i64>,
    ) -> Dataplane<S> {
        let (strategy, fallback) = match requested {
            BarrierStrategy::SeqCst => (BarrierStrategy::SeqCst, None),
            // Under loom there is no syscall: the writer barrier is modelled as a fence.
            BarrierStrategy::Membarrier if cfg!(loom) => (BarrierStrategy::Membarrier, None),
            BarrierStrategy::Membarrier => match barrier::register_with(sys) {
                Ok(()) => (BarrierStrategy::Membarrier, None),
                Err(e) => {
                    let reason = e.to_string();
                    (BarrierStrategy::SeqCst, Some((e, reason)))
                }
            },
        };
        let cores = (0..cores)
            .map(|_| Core {
                generation: AtomicU64::new(0),
                claimed: AtomicBool::new(false),
                packets: stat::AtomicU64::new(0),
                batches: stat::AtomicU64::new(0),
                barrier_cost: CoreHistogram::new(),
            })
            .collect();
        Dataplane {
            active: AtomicPtr::new(Box::into_raw(Box::new(initial))),
            quiescence: Arc::new(Quiescence { cores, strategy }),
            strategy,
            requested,
            fallback,
            commit_lock: Mutex::new(()),
            base_lock: Mutex::new(()),
            backoff: Backoff::default(),
            clock,
            _owns: PhantomData,
        }
    }

    /// Sets how commits wait for cores that are inside a batch (before sharing the dataplane).
    pub fn set_backoff(&mut self, backoff: Backoff) {
        self.backoff = backoff;
    }

    /// How commits wait for cores that are inside a batch.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Claims core `core` for the calling worker; released when the [`Worker`] is dropped.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::CoreOutOfRange`] when `core >= self.cores()`;
    /// [`DataplaneError::CoreClaimed`] when another `Worker` holds it.
    pub fn worker(&self, core: usize) -> Result<Worker<'_, S>, DataplaneError> {
        let slot = (self.quiescence.cores.get(core)).ok_or(DataplaneError::CoreOutOfRange {
            core,
            cores: self.cores(),
        })?;
        // Acquire pairs with the Release in `Worker::drop`: a new worker of this core sees the
        // previous worker's last counter stores, so its shadow copies below are current.
        if slot
            .claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(DataplaneError::CoreClaimed { core });
        }
        Ok(Worker {
            dp: self,
            core: slot,
            index: core,
            strategy: self.strategy,
            // Relaxed: ordered by the claim above (and only the claimant writes these).
            generation: slot.generation.load(Ordering::Relaxed),
            batches: slot.batches.load(stat::Ordering::Relaxed),
            packets: slot.packets.load(stat::Ordering::Relaxed),
            outer: 0,
        })
    }

    /// Publishes `new` and returns at once with the previous snapshot, which cores that were
    /// mid-batch may still be reading ([`Unpublished`]: retire it to wait for them and get it
    /// back), and the publish's timings (`quiesce_ns` 0: nothing was waited for). One publish at
    /// a time (callers queue on a mutex); `with_base` readers are waited for first.
    ///
    /// Every batch that begins after this returns runs `new` (Claim A, module docs): a packet a
    /// source hands to a worker after the return is decided by `new`.
    ///
    /// # Panics
    ///
    /// With the membarrier strategy, if `membarrier(PRIVATE_EXPEDITED)` fails although
    /// registration succeeded (not documented to happen). The old snapshot is then leaked, never
    /// freed, and `new` stays published.
    pub fn publish(&self, new: Box<S>) -> (Unpublished<S>, QuiesceReport) {
        // The mutexes guard no data, so a poisoned lock (a panicking committer) is still usable.
        // `base_lock` first: no `with_base` reader holds the snapshot this unpublishes.
        let _no_base_reader = self.base_lock.lock().unwrap_or_else(|e| e.into_inner());
        let _one_committer = self.commit_lock.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = self.clock.now_ns();
        // AcqRel: Release so that workers whose Acquire load returns `new` see it fully built;
        // Acquire so that we see the previous snapshot as its publisher wrote it (we own it now).
        let old = self.active.swap(Box::into_raw(new), Ordering::AcqRel);
        // Full barrier between the swap and the generation loads (Claim A in the module docs),
        // then one look at every core.
        let grace = self.quiescence.start();
        let t1 = self.clock.now_ns();
        let report = QuiesceReport {
            publish_ns: t1.saturating_sub(t0),
            quiesce_ns: 0,
            cores_waited: grace.cores_waited(),
        };
        let unpublished = Unpublished {
            // `active` is never null (module invariant), so neither is what the swap returned.
            snapshot: NonNull::new(old),
            grace,
            quiescence: Arc::clone(&self.quiescence),
            backoff: self.backoff,
            _owns: PhantomData,
        };
        (unpublished, report)
    }

    /// Publishes `new`, waits until no core can still read the previous snapshot, and returns it
    /// with the commit's timings: [`Dataplane::publish`] then [`Unpublished::retire`].
    ///
    /// The caller then reads the retired snapshot (e.g. adds its counters into the new one, which
    /// workers are already updating) and drops it, preferably on another thread.
    ///
    /// Blocks for as long as the longest batch that was running when the new snapshot was
    /// published (see the module docs); never for idle cores.
    ///
    /// # Panics
    ///
    /// As [`Dataplane::publish`].
    pub fn commit(&self, new: Box<S>) -> (Retired<S>, QuiesceReport) {
        let (unpublished, mut report) = self.publish(new);
        let t1 = self.clock.now_ns();
        let retired = unpublished.retire();
        report.quiesce_ns = self.clock.now_ns().saturating_sub(t1);
        (retired, report)
    }

    /// Runs `f` on the active snapshot from outside the workers (exporters, `trace`). Holds the
    /// commit lock while `f` runs, so commits wait for it; keep `f` short.
    pub fn with_active<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        let _no_commit = self.commit_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Acquire: pairs with the Release half of the commit's swap (the lock orders it as well).
        let p = self.active.load(Ordering::Acquire);
        // SAFETY: `active` is never null and only `publish` (which needs the lock we hold)
        // unpublishes a snapshot, which is freed only after that; so `*p` lives until we
        // release the lock after `f`.
        f(unsafe { &*p })
    }

    /// Runs `f` on the active snapshot for as long as it takes (a commit compiling the next
    /// snapshot from it): commits wait for `f` to return, [`Dataplane::with_active`] callers
    /// (counter reads, traces, scrapes) and workers do not. One `with_base` at a time.
    pub fn with_base<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        let _no_commit = self.base_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Acquire: pairs with the Release half of the commit's swap (the lock orders it as well).
        let p = self.active.load(Ordering::Acquire);
        // SAFETY: `active` is never null and only `publish` unpublishes a snapshot (freed only
        // after that); it takes `base_lock` first, which we hold, so `*p` lives until we
        // release it after `f`.
        f(unsafe { &*p })
    }

    /// The number of cores.
    pub fn cores(&self) -> usize {
        self.quiescence.cores.len()
    }

    /// The cores' generations, shared: publishers of other data that batches read (the
    /// contents of sets, [`crate::sets`]) retire it through them, as commits retire snapshots.
    pub fn quiescence(&self) -> &Arc<Quiescence> {
        &self.quiescence
    }

    /// The barrier strategy in effect (differs from the requested one after a fallback).
    pub fn barrier(&self) -> BarrierStrategy {
        self.strategy
    }

    /// The barrier strategy passed to [`Dataplane::new`].
    pub fn requested_barrier(&self) -> BarrierStrategy {
        self.requested
    }

    /// Why the membarrier strategy fell back to SeqCst; `None` when no fallback happened.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_ref().map(|(_, reason)| reason.as_str())
    }

    /// The error behind [`Dataplane::fallback_reason`].
    pub fn fallback_error(&self) -> Option<&BarrierError> {
        self.fallback.as_ref().map(|(e, _)| e)
    }

    /// Each core's generation (odd: inside a batch), for the `vallum_core_generation` gauge.
    pub fn generations(&self) -> Vec<u64> {
        // Relaxed: a gauge reading; orders nothing.
        (self.quiescence.cores.iter())
            .map(|c| c.generation.load(Ordering::Relaxed))
            .collect()
    }

    /// Each core's packet count (as reported with [`CoreBatch::add_packets`]).
    pub fn packets(&self) -> Vec<u64> {
        (self.quiescence.cores.iter())
            .map(|c| c.packets.load(stat::Ordering::Relaxed))
            .collect()
    }

    /// Each core's number of completed batches.
    pub fn batches(&self) -> Vec<u64> {
        (self.quiescence.cores.iter())
            .map(|c| c.batches.load(stat::Ordering::Relaxed))
            .collect()
    }

    /// The sampled barrier cost per packet, summed over cores, in picoseconds (see
    /// [`Histogram`]; for `vallum_packet_barrier_seconds`, labelled with [`Dataplane::barrier`]).
    ///
    /// One batch in [`SAMPLE_EVERY`] per core is timed with the clock around its begin and end
    /// steps (not around the batch's work), minus the clock's own cost measured by a
    /// back-to-back read just before, and divided by the batch's packet count (1 if it reported
    /// none). Samples are noisy at this scale (the clock costs ~20 ns); the benchmarks give the
    /// precise figure.
    pub fn barrier_histogram(&self) -> Histogram {
        let mut h = Histogram::new();
        for c in self.quiescence.cores.iter() {
            c.barrier_cost.add_to(&mut h);
        }
        h
    }
}

impl<S> Drop for Dataplane<S> {
    fn drop(&mut self) {
        // Acquire: see the swap in `commit`. `&mut self` means no worker or committer is left.
        let p = self.active.swap(std::ptr::null_mut(), Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: `p` came from `Box::into_raw` and is still owned by the dataplane; with
            // `&mut self` no worker (they borrow the dataplane) can be reading it.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl<S> std::fmt::Debug for Dataplane<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("cores", &self.cores())
            .field("barrier", &self.strategy)
            .field("fallback_reason", &self.fallback_reason())
            .field("generations", &self.generations())
            .finish_non_exhaustive()
    }
}

// === impl Worker ===

/// A worker's exclusive handle on one core: runs batches against the active snapshot.
///
/// Obtained from [`Dataplane::worker`]; the core is released when this is dropped. The handle
/// may move between threads (it is `Send` when `S: Sync`), but only one thread uses it at a time
/// (`batch` takes `&mut self`), which is what makes the core's counter single-writer.
pub struct Worker<'a, S> {
    dp: &'a Dataplane<S>,
    core: &'a Core,
    index: usize,
    strategy: BarrierStrategy,
    /// Shadow copies of this core's counters (we are their only writer).
    generation: u64,
    batches: u64,
    packets: u64,
    /// The thread's [`IN_BATCH`] value before the current batch (restored at its end).
    outer: usize,
}

impl<'a, S> Worker<'a, S> {
    /// The core index this worker holds.
    pub fn core(&self) -> usize {
        self.index
    }

    /// Enters one batch: marks the core busy and loads the active snapshot, which the returned
    /// guard lends out ([`InBatch::snapshot`]) until it is dropped; dropping it marks the core
    /// idle (also when the code holding it unwinds, so commits do not wait for it forever). A
    /// reference to the snapshot cannot outlive the guard. Count the batch's packets with
    /// [`InBatch::add_packets`]. One batch in [`SAMPLE_EVERY`] is timed into the
    /// barrier-cost histogram.
    ///
    /// Do not call [`Dataplane::commit`] while holding the guard (on any dataplane this
    /// worker's core belongs to): the commit would wait for this very batch to end and never
    /// return. [`Dataplane::with_active`] is fine.
    #[inline]
    pub fn enter(&mut self) -> InBatch<'_, 'a, S> {
        let sample = if self.batches & (SAMPLE_EVERY - 1) == 0 {
            Some(self.sample_start())
        } else {
            None
        };
        let active = self.begin();
        let sample = sample.map(|mut s| {
            s.t1 = s.clock.now_ns();
            s
        });
        let batch = CoreBatch::new(self.index);
        InBatch {
            worker: self,
            active,
            batch,
            sample,
        }
    }

    /// Runs one batch: [`Worker::enter`], `f` on the active snapshot, leave. `f` cannot keep
    /// the `&S` (it is only valid for the batch).
    #[inline]
    pub fn batch<R>(&mut self, f: impl FnOnce(&S, &CoreBatch) -> R) -> R {
        let guard = self.enter();
        f(guard.snapshot(), &guard.batch)
    }

    /// The clock reads before a sampled batch's begin step (its cost is measured too).
    #[cold]
    #[inline(never)]
    fn sample_start(&self) -> Sample {
        let clock = Arc::clone(&self.dp.clock);
        // Two back-to-back reads measure the clock's own cost, subtracted twice at the end.
        let c0 = clock.now_ns();
        let t0 = clock.now_ns();
        Sample {
            overhead: t0.saturating_sub(c0),
            clock,
            t0,
            t1: 0,
        }
    }

    /// Steps 1-3 of the protocol: odd generation, barrier, load of the active pointer.
    #[inline(always)]
    fn begin(&mut self) -> *mut S {
        self.generation = self.generation.wrapping_add(1);
        // Release, not Relaxed: a committer that skips our even value and reads this odd one must
        // still synchronize with the end of our previous batch (Claim B in the module docs).
        self.core
            .generation
            .store(self.generation, Ordering::Release);
        // Orders the store above before the load below (Claim A).
        barrier::reader_barrier(self.strategy);
        // Thread-local, read by this thread only: set readers inside the batch know they are
        // covered by our odd generation (see `Quiescence`).
        let id = self.dp.quiescence.id();
        self.outer = IN_BATCH.with(|c| c.replace(id));
        // Acquire: pairs with the Release half of the commit's swap, so the snapshot's contents
        // are visible.
        self.dp.active.load(Ordering::Acquire)
    }

    /// Step 4: even generation; publishes the batch's counts.
    #[inline(always)]
    fn end(&mut self, packets: u64) {
        IN_BATCH.with(|c| c.set(self.outer));
        self.generation = self.generation.wrapping_add(1);
        // Release: our reads of the snapshot happen-before a committer's Acquire load of this (or
        // any later) value (Claim B). No fence needed: no store->load pair here.
        self.core
            .generation
            .store(self.generation, Ordering::Release);
        // Statistics: single writer, Relaxed load-free stores of our shadow copies.
        self.batches += 1;
        self.core
            .batches
            .store(self.batches, stat::Ordering::Relaxed);
        if packets != 0 {
            self.packets += packets;
            self.core
                .packets
                .store(self.packets, stat::Ordering::Relaxed);
        }
    }
}

impl<S> Drop for Worker<'_, S> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire claim in `Dataplane::worker`.
        self.core.claimed.store(false, Ordering::Release);
    }
}

impl<S> std::fmt::Debug for Worker<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("core", &self.index)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// One batch of a [`Worker`] ([`Worker::enter`]): lends out the snapshot that was active when
/// the batch began, and ends the batch when dropped (also on unwinding).
pub struct InBatch<'w, 'a, S> {
    worker: &'w mut Worker<'a, S>,
    /// The active pointer loaded after our odd generation store and barrier.
    active: *mut S,
    batch: CoreBatch,
    /// The begin step's timing, for a sampled batch.
    sample: Option<Sample>,
}

/// The timing of a sampled batch's begin step ([`Worker::enter`]).
struct Sample {
    clock: Arc<dyn Clock>,
    overhead: u64,
    t0: u64,
    t1: u64,
}

impl<S> InBatch<'_, '_, S> {
    /// The snapshot of this batch.
    #[inline]
    pub fn snapshot(&self) -> &S {
        // SAFETY: `active` is the active pointer loaded after our odd generation store and
        // barrier; by the protocol (module docs) no commit frees it until our generation
        // changes, which happens only in `InBatch::drop`. The reference borrows `self`, so it
        // cannot outlive the batch.
        unsafe { &*self.active }
    }

    /// The index of the core running this batch.
    #[inline]
    pub fn core(&self) -> usize {
        self.batch.core
    }

    /// Counts `n` packets into this batch (added to the core's packet count when it ends,
    /// and used to divide the sampled barrier cost).
    #[inline]
    pub fn add_packets(&self, n: u64) {
        self.batch.add_packets(n);
    }
}

impl<S> Drop for InBatch<'_, '_, S> {
    fn drop(&mut self) {
        let packets = self.batch.packets();
        match self.sample.take() {
            None => self.worker.end(packets),
            Some(s) => {
                let t2 = s.clock.now_ns();
                self.worker.end(packets);
                let t3 = s.clock.now_ns();
                let cost_ns = (s.t1.saturating_sub(s.t0) + t3.saturating_sub(t2))
                    .saturating_sub(2 * s.overhead);
                self.worker
                    .core
                    .barrier_cost
                    .record(cost_ns.saturating_mul(1000) / packets.max(1));
            }
        }
    }
}

// === impl CoreBatch ===

/// Per-batch context handed to the batch closure: the core index and the packet count.
#[derive(Debug)]
pub struct CoreBatch {
    core: usize,
    packets: Cell<u64>,
}

impl CoreBatch {
    fn new(core: usize) -> CoreBatch {
        CoreBatch {
            core,
            packets: Cell::new(0),
        }
    }

    /// The index of the core running this batch (for per-core counter slots in the snapshot).
    pub fn core(&self) -> usize {
        self.core
    }

    /// Counts `n` packets into this batch (added to the core's packet count at the end of the
    /// batch, and used to divide the sampled barrier cost).
    #[inline]
    pub fn add_packets(&self, n: u64) {
        self.packets.set(self.packets.get() + n);
    }

    /// Packets counted so far in this batch.
    pub fn packets(&self) -> u64 {
        self.packets.get()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_model;
