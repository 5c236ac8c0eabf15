//! Deferred freeing of unlinked entries: lock-free readers may still walk a node after a
//! writer unlinked it, so a node is freed only after every reader that could have loaded a
//! pointer to it has finished.
//!
//! Normally this is crossbeam-epoch: a reader pins the epoch ([`pin`]) for the duration of one
//! lookup, and a writer defers the free until every thread pinned at unlink time has unpinned.
//! Under `cfg(loom)` the deferred nodes are kept until the table is dropped (crossbeam-epoch is
//! not loom-instrumented), so the loom model checks publication and unlinking, not the epoch
//! scheme itself.
//!
//! # Why conntrack does not ride on the dataplane's generation counters
//! Snapshots and set contents (`dataplane/left_right.rs`) are reclaimed once every core
//! passed a quiescent point of the commit protocol ([`crate::dataplane`]'s generations), and a
//! writer that needs the old copy gone waits for that. Conntrack differs on both sides: its
//! writers are the packet cores themselves (a packet's core unlinks the entries it finds
//! expired, replaces the entry of a closed flow, resizes the table), and a packet core must
//! not wait for the other cores' quiescence while its own generation is odd (two cores doing
//! so would wait for each other); and its readers are not only batches but also threads with
//! no generation (`Conntrack::gc`, the listing and persistence of `vallumd`, traces). An
//! epoch collector serves both: any thread pins for one lookup, and an unlink defers its free
//! without waiting. Riding on the generations would need a deferred-free queue keyed by the
//! cores' generations (DPDK's `rte_rcu_qsbr_dq`) and a generation for every off-batch reader;
//! that is not built, so this is the one second scheme, kept here and nowhere else.

#[cfg(not(loom))]
pub(crate) use crossbeam_epoch::Guard;

/// Pins the current thread: nodes unlinked after this call are not freed before the guard drops.
#[cfg(not(loom))]
pub(crate) fn pin() -> Guard {
    crossbeam_epoch::pin()
}

/// The nodes a table has retired and not yet freed.
#[cfg(not(loom))]
pub(crate) struct Retired<T>(std::marker::PhantomData<fn(T)>);

#[cfg(not(loom))]
impl<T> Retired<T> {
    pub(crate) fn new() -> Self {
        Retired(std::marker::PhantomData)
    }

    /// Frees `p` once no thread pinned now can still hold it.
    ///
    /// # Safety
    /// `p` came from `Box::into_raw`, is no longer reachable from any chain (no new reader can
    /// find it) and is retired exactly once.
    pub(crate) unsafe fn retire(&self, guard: &Guard, p: *mut T) {
        // SAFETY: the caller guarantees `p` is an unreachable, uniquely retired Box; the epoch
        // scheme runs the destructor only after every guard pinned before this call is dropped,
        // and every reader that loaded `p` did so under such a guard.
        unsafe { guard.defer_destroy(crossbeam_epoch::Shared::from(p.cast_const())) }
    }
}

/// Under loom: a no-op guard.
#[cfg(loom)]
pub(crate) struct Guard;

/// Under loom: a no-op pin.
#[cfg(loom)]
pub(crate) fn pin() -> Guard {
    Guard
}

/// Under loom: retired nodes are kept until the table drops.
#[cfg(loom)]
pub(crate) struct Retired<T>(std::sync::Mutex<Vec<SendPtr<T>>>);

#[cfg(loom)]
pub(crate) struct SendPtr<T>(*mut T);

// SAFETY: the pointer is only dereferenced (freed) by `Retired::drop`, which has `&mut self`,
// so no other thread uses it then.
#[cfg(loom)]
unsafe impl<T> Send for SendPtr<T> {}

#[cfg(loom)]
impl<T> Retired<T> {
    pub(crate) fn new() -> Self {
        Retired(std::sync::Mutex::new(Vec::new()))
    }

    /// Keeps `p` until the table drops.
    ///
    /// # Safety
    /// As the non-loom version.
    pub(crate) unsafe fn retire(&self, _guard: &Guard, p: *mut T) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(SendPtr(p));
    }
}

#[cfg(loom)]
impl<T> Drop for Retired<T> {
    fn drop(&mut self) {
        let v = self
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for p in v.drain(..) {
            // SAFETY: retired pointers came from Box::into_raw, were retired once, and the
            // table (hence every reader borrowing it) is gone.
            drop(unsafe { Box::from_raw(p.0) });
        }
    }
}
