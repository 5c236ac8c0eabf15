//! The synchronization primitives of the commit protocol, in one place, so that the loom model
//! (`RUSTFLAGS="--cfg loom"`) checks exactly the atomics the dataplane uses.
//!
//! Under `cfg(loom)` every type and function here is loom's; otherwise it is std's. Code in
//! [`crate::dataplane`] imports atomics only from here (or from [`stat`] for statistics).
//!
//! Two helpers model the barrier strategies:
//! - [`light_barrier`] is the reader half of the asymmetric (membarrier) pairing: a compiler fence,
//!   which costs nothing at run time; the committer's `membarrier()` promotes it to a full fence
//!   on every thread that was running. Loom cannot model asymmetric fences, so under loom it is a
//!   real `fence(SeqCst)`: the model then checks the protocol as if both sides fenced, which is
//!   what membarrier guarantees (see the argument in [`crate::dataplane`]).
//! - The committer's membarrier call itself lives in `dataplane::barrier`; under loom it is
//!   modelled as `fence(SeqCst)` on the writer side.

#[cfg(loom)]
pub use loom::hint::spin_loop;
#[cfg(loom)]
pub use loom::sync::RwLock;
#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering, fence};
#[cfg(loom)]
pub use loom::sync::{Mutex, MutexGuard};
#[cfg(loom)]
pub use loom::thread::yield_now;
#[cfg(loom)]
pub use loom::thread_local;

#[cfg(not(loom))]
pub use std::hint::spin_loop;
#[cfg(not(loom))]
pub use std::sync::RwLock;
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::thread::yield_now;
#[cfg(not(loom))]
pub use std::thread_local;

/// The reader half of the asymmetric barrier: orders the preceding generation store before the
/// following pointer load in the instruction stream only (no CPU fence).
///
/// This is sound only together with a committer that runs `membarrier(PRIVATE_EXPEDITED)`
/// between publishing and reading the generations. Under loom it is `fence(SeqCst)` (loom has
/// no model of asymmetric fences).
#[inline(always)]
pub fn light_barrier() {
    #[cfg(not(loom))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

/// Statistics counters (packets, batches, histogram buckets). They are not part of the commit
/// protocol: each is written by one core only (plain `Relaxed` load + store, no RMW) and read
/// by exporters with `Relaxed` loads, so no other access is ordered by them. They are std types
/// even under loom, which keeps the model's state small; loom threads run on one OS thread, so
/// using real atomics there is sound.
pub mod stat {
    pub use std::sync::atomic::{AtomicU64, Ordering};
}
