//! A two-copy cell whose readers take nothing per read inside a batch: the contents of sets.
//!
//! [`LeftRight<T, Op>`] keeps two copies of a `T`. Readers read the *live* one through one
//! Acquire pointer load; the writer changes the other (*standby*) one, flips the pointer, and
//! later replays the same change on the copy readers left (the left-right scheme of Ramalhete
//! and Correia, without its per-reader counters: the readers' batches already have them).
//!
//! # Readers
//!
//! [`LeftRight::read`] has two paths:
//! - **in a batch** of the dataplane whose [`Quiescence`] the cell was built with (the packet
//!   path: `Worker::batch` marks the thread): one `live.load(Acquire)` and the closure. No
//!   lock, no reference count, no store. The batch's odd generation covers the read.
//! - **anywhere else** (traces under the commit lock, tests, cells without a dataplane): the
//!   same load under a read lock of the cell's [`Readers::slow`] `RwLock`, which the writer
//!   takes for writing while it changes a standby copy.
//!
//! # Writer (one at a time, under the cell's writer mutex)
//!
//! [`LeftRight::publish`]`(op)`:
//! 1. wait for the [`Grace`] of the previous flip ([`Quiescence::wait`]): batches that may
//!    still read the standby (the previous live copy) end; this waits for at most the rest of
//!    one batch per core, usually for nothing (they ended long ago);
//! 2. under the slow lock (write): apply the previous flip's pending op, then `op`, to the
//!    standby ([`Absorb`]); both copies are now equal plus `op`;
//! 3. `live.store(standby, Release)`: the flip;
//! 4. [`Quiescence::start`] (writer barrier, one look at the generations) gives the new
//!    `Grace`; `op` is kept as the pending op of the copy just unpublished.
//!
//! So an update returns without waiting for readers, costs its own size twice (applied to
//! each copy once) and never copies the whole content, except when the op is at least half
//! the content's size (a bulk load), where copying the live copy is the cheaper replay. A
//! large op (more than [`EAGER_REPLAY`] changes) is replayed at once after one grace period
//! instead, so it is not kept in memory until the next update.
//!
//! # Memory-ordering argument
//!
//! This is the commit protocol of [`crate::dataplane`] with `live` in place of `active`:
//! - the flip (3) is a Release store and the reader's load is Acquire: a reader that loads the
//!   new pointer sees the copy as step 2 left it (the mutex and the slow lock order step 2
//!   before step 3 on the writer's thread);
//! - Claim A: the reader's odd generation store and barrier precede its load of `live` (any
//!   load in the batch comes after them); the writer's `live` store precedes its barrier and
//!   generation loads (4). Of the two SeqCst fences (or membarrier and its promoted compiler
//!   fence) one is first: either the writer sees the batch's odd value (and step 1 of the next
//!   publish waits for it to change), or the reader's load returns the new pointer;
//! - Claim B: step 1's Acquire load of a changed generation synchronizes with the worker's
//!   Release store at or after the end of that batch, so the batch's reads of the copy
//!   happen-before the writer's changes to it in step 2;
//! - slow readers hold the read lock from their load of `live` to the end of their read; step 2
//!   takes the write lock, so a slow reader that loaded the old pointer has released it first
//!   (unlock happens-before lock), and one that takes the lock after step 2 loads the flipped
//!   or an even later pointer, never a copy being changed.
//!
//! The loom model (`dataplane/loom_model.rs`, `loom_set_*`) checks this with readers in batches
//! and outside them against a writer that publishes twice.

use std::ptr::NonNull;
use std::sync::Arc;

use super::{Backoff, Grace, Quiescence, in_batch_of};
use crate::sync::{AtomicPtr, Mutex, MutexGuard, Ordering, RwLock};

/// Ops with more changes than this are replayed on the second copy right after one grace
/// period (so they are not kept until the next update); smaller ones wait for the next update.
pub(crate) const EAGER_REPLAY: usize = 4096;

/// A change that can be applied to either copy of a [`LeftRight`] (applied twice: once to
/// each copy, so it must be deterministic).
pub(crate) trait Absorb<Op> {
    /// Applies `op`.
    fn absorb(&mut self, op: &Op);

    /// How many changes `op` makes (for [`EAGER_REPLAY`]).
    fn op_size(op: &Op) -> usize;

    /// How many items `self` holds, in the unit of [`Absorb::op_size`].
    fn size(&self) -> usize;

    /// Makes `self` equal to `live` by copying it: what bringing a standby up to date costs
    /// instead of replaying an op that is at least half as large as the content (a bulk load).
    fn copy_from(&mut self, live: &Self);
}

/// What the readers of a group of cells are protected by: a dataplane's [`Quiescence`] for
/// readers in its batches (if any), and one `RwLock` for everyone else. Shared (`Arc`) by every
/// cell whose copies may move between cells ([`LeftRight::exchange`]).
#[derive(Debug)]
pub(crate) struct Readers {
    quiescence: Option<Arc<Quiescence>>,
    /// [`Quiescence::id`] of `quiescence`, `usize::MAX` without one (never a thread's mark).
    id: usize,
    /// Read-locked by readers outside batches; write-locked while a standby copy changes.
    slow: RwLock<()>,
}

impl Readers {
    /// Readers protected by `quiescence` inside its batches (and by a lock elsewhere); `None`:
    /// every read takes the lock.
    pub(crate) fn new(quiescence: Option<Arc<Quiescence>>) -> Readers {
        let id = quiescence.as_ref().map_or(usize::MAX, |q| q.id());
        Readers {
            quiescence,
            id,
            slow: RwLock::new(()),
        }
    }

    /// The dataplane generations these readers' batches run on.
    pub(crate) fn quiescence(&self) -> Option<&Arc<Quiescence>> {
        self.quiescence.as_ref()
    }

    fn start(&self) -> Grace {
        self.quiescence
            .as_ref()
            .map(|q| q.start())
            .unwrap_or_default()
    }

    fn wait(&self, grace: &Grace) {
        if let Some(q) = &self.quiescence {
            q.wait(grace, &Backoff::default());
        }
    }
}

/// The writer's side of a cell: which copy is which, and what the standby still lacks.
struct Writer<T, Op> {
    /// The copy `live` points to (from `Box::into_raw`).
    live: NonNull<T>,
    /// The other copy (from `Box::into_raw`); batches in `grace` may still read it.
    standby: NonNull<T>,
    /// The op `live` has and `standby` lacks.
    pending: Option<Op>,
    /// The cores that may still read `standby`.
    grace: Grace,
}

/// Two copies of a `T`, one live for readers, one for the writer (module docs).
pub(crate) struct LeftRight<T, Op> {
    /// One of `writer`'s two copies; never null.
    live: AtomicPtr<T>,
    /// `readers.id`, kept here so that a read checks its thread's mark without another load.
    id: usize,
    writer: Mutex<Writer<T, Op>>,
    readers: Arc<Readers>,
}

// SAFETY: the cell owns two boxed `T`s (freed wherever it drops: `T: Send`) and ops in
// transit (`Op: Send`); readers on other threads get `&T` (`T: Sync`). Shared mutable state is
// the atomic pointer and what the mutex and the lock guard.
unsafe impl<T: Send + Sync, Op: Send> Send for LeftRight<T, Op> {}
// SAFETY: through `&LeftRight`, readers share `&T` across threads (`T: Sync`); writers move
// ops in and change the standby `T` from whichever thread holds the mutex (`T: Send`,
// `Op: Send`), never while a reader can see that copy (module docs).
unsafe impl<T: Send + Sync, Op: Send> Sync for LeftRight<T, Op> {}

impl<T: Absorb<Op>, Op> LeftRight<T, Op> {
    /// A cell with two equal copies (`a` live, `b` standby; the caller makes them equal).
    pub(crate) fn new(a: T, b: T, readers: Arc<Readers>) -> Self {
        let live = NonNull::from(Box::leak(Box::new(a)));
        let standby = NonNull::from(Box::leak(Box::new(b)));
        LeftRight {
            live: AtomicPtr::new(live.as_ptr()),
            id: readers.id,
            writer: Mutex::new(Writer {
                live,
                standby,
                pending: None,
                grace: Grace::default(),
            }),
            readers,
        }
    }

    /// Runs `f` on the live copy (module docs, "Readers"). Inside a batch of the cell's
    /// dataplane: one Acquire load, nothing else; elsewhere under the slow read lock.
    #[inline]
    pub(crate) fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        if in_batch_of(self.id) {
            // Acquire: pairs with the Release flip in `publish`/`exchange` (the copy is fully
            // changed before it is published).
            let p = self.live.load(Ordering::Acquire);
            // SAFETY: `p` is one of the two boxes the cell owns (never null, freed only in
            // `Drop`, which needs `&mut self`). We are inside a batch of `readers.quiescence`
            // (the thread mark says so), after its odd store and barrier: the writer changes
            // the copy behind `p` only after `Quiescence::wait` saw this core leave the batch,
            // and `f` cannot keep the reference (it is generic over its lifetime).
            return f(unsafe { &*p });
        }
        self.read_slow(f)
    }

    /// The address of the live copy (tests: which copies a cell uses).
    #[cfg(test)]
    pub(crate) fn live_addr(&self) -> usize {
        self.live.load(Ordering::Relaxed) as usize
    }

    #[cold]
    #[inline(never)]
    fn read_slow<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        // A writer that panicked while changing a standby copy leaves it unpublished; the live
        // copy we read is whole.
        let _slow = self.readers.slow.read().unwrap_or_else(|e| e.into_inner());
        // Acquire: as in `read`.
        let p = self.live.load(Ordering::Acquire);
        // SAFETY: `p` is one of the cell's boxes; the writer changes a copy only with the slow
        // lock held for writing, which waits for our read guard, and never changes the live one.
        f(unsafe { &*p })
    }

    /// The writer's view: the live copy, read with the writer mutex held (no flip meanwhile).
    pub(crate) fn lock(&self) -> WriterGuard<'_, T, Op> {
        WriterGuard {
            // A writer that panicked did so inside `Absorb::absorb` (hash-map inserts for sets,
            // which abort rather than unwind on allocation failure), before its flip: the live
            // copy is whole.
            w: self.writer.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Applies `op` to the standby copy and publishes it (module docs, "Writer"). Returns
    /// after the flip, without waiting for readers of the old copy (unless `op` is larger than
    /// [`EAGER_REPLAY`]: then after one grace period and the replay).
    pub(crate) fn publish(&self, op: Op) {
        let mut w = self.lock();
        self.publish_locked(&mut w, op);
    }

    /// [`LeftRight::publish`] with the writer mutex already held (from [`LeftRight::lock`]).
    pub(crate) fn publish_locked(&self, g: &mut WriterGuard<'_, T, Op>, op: Op) {
        let w = &mut *g.w;
        self.settle(w);
        {
            let _no_slow_reader = self.readers.slow.write().unwrap_or_else(|e| e.into_inner());
            // SAFETY: `standby` is one of our boxes and not `live`. Batches that could read it
            // ended (`settle` waited for the grace of the flip that unpublished it), slow
            // readers are kept out by the write lock, and other writers by the mutex.
            unsafe { w.standby.as_mut() }.absorb(&op);
        }
        // Release: the change above happens-before any reader's Acquire load of this pointer.
        self.live.store(w.standby.as_ptr(), Ordering::Release);
        std::mem::swap(&mut w.live, &mut w.standby);
        // Barrier and one look at the generations (Claim A); waited on in the next `settle`.
        w.grace = self.readers.start();
        let eager = T::op_size(&op) > EAGER_REPLAY;
        w.pending = Some(op);
        if eager {
            self.settle(w);
        }
    }

    /// Makes the standby equal to the live copy: waits for the grace of the last flip and
    /// applies the pending op. Waits for at most the rest of one batch per core.
    fn settle(&self, w: &mut Writer<T, Op>) {
        let Some(op) = w.pending.take() else {
            return;
        };
        self.readers.wait(&w.grace);
        w.grace = Grace::default();
        let _no_slow_reader = self.readers.slow.write().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `live` is one of our boxes, distinct from `standby`, and only writers (we hold
        // the mutex) change a copy, never the live one: a shared reference is sound.
        let live = unsafe { w.live.as_ref() };
        // SAFETY: as in `publish_locked`: the standby's batch readers left it (the wait above),
        // slow readers are locked out, other writers wait on the mutex.
        let standby = unsafe { w.standby.as_mut() };
        if T::op_size(&op).saturating_mul(2) >= live.size() {
            standby.copy_from(live);
        } else {
            standby.absorb(&op);
        }
    }

    /// Exchanges the contents of two cells (both copies, the pending op and the grace), so
    /// that readers of `a` see what `b` had and the reverse; each cell flips atomically, one
    /// after the other. Nothing is copied or waited for: a copy only changes cells, and the
    /// grace that protects a standby travels with it. Requires the same [`Readers`] (else
    /// returns `false` and changes nothing); `a` and `b` the same cell: nothing to do.
    pub(crate) fn exchange(a: &Self, b: &Self) -> bool {
        if std::ptr::eq(a, b) {
            return true;
        }
        if !Arc::ptr_eq(&a.readers, &b.readers) {
            return false;
        }
        // Lock order by address: two exchanges of the same pair cannot deadlock.
        let (first, second) = if std::ptr::from_ref(a) < std::ptr::from_ref(b) {
            (a, b)
        } else {
            (b, a)
        };
        let mut wf = first.lock();
        let mut ws = second.lock();
        std::mem::swap(&mut *wf.w, &mut *ws.w);
        // Release: as the flip in `publish` (the copies are unchanged; this only publishes
        // which cell shows which). A reader of a cell may, between the two stores, find both
        // cells showing the same copy.
        first.live.store(wf.w.live.as_ptr(), Ordering::Release);
        second.live.store(ws.w.live.as_ptr(), Ordering::Release);
        true
    }
}

impl<T, Op> Drop for LeftRight<T, Op> {
    fn drop(&mut self) {
        let w = self.writer.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: both pointers came from `Box::leak` in `new` and are distinct; with
        // `&mut self` no reader or writer can be using them, and `exchange` moved ownership
        // of copies only together with the `Writer` that frees them.
        unsafe {
            drop(Box::from_raw(w.live.as_ptr()));
            drop(Box::from_raw(w.standby.as_ptr()));
        }
    }
}

/// The writer mutex of a [`LeftRight`], held: read the live copy, publish.
pub(crate) struct WriterGuard<'a, T, Op> {
    w: MutexGuard<'a, Writer<T, Op>>,
}

impl<T, Op> WriterGuard<'_, T, Op> {
    /// The live copy. Only writers (who hold this guard) change copies, and never the live one.
    pub(crate) fn live(&self) -> &T {
        // SAFETY: `live` is one of the cell's boxes; it changes only in `publish_locked` and
        // `exchange`, which need this mutex (we hold it, and borrow the guard for `&T`'s life).
        unsafe { self.w.live.as_ref() }
    }
}
