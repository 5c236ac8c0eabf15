//! The clock of commit-confirmed deadlines: wall time as Unix nanoseconds, because a deadline
//! is stored and must keep its meaning across a restart (the engine's monotonic clock starts
//! again at 0 in every process).
//!
//! The pipeline reads it through [`WallClock`] ([`crate::control::hooks::Hooks::confirm_clock`]):
//! vallumd uses [`SystemWallClock`]; a test passes a [`ManualWallClock`] and advances it, so
//! a confirm deadline passes without waiting for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Wall time, Unix ns.
pub trait WallClock: Send + Sync + std::fmt::Debug {
    /// Now, Unix ns.
    fn unix_ns(&self) -> i64;
}

/// The system clock ([`std::time::SystemTime`], as [`crate::control::store::now_ns`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemWallClock;

impl WallClock for SystemWallClock {
    fn unix_ns(&self) -> i64 {
        crate::control::store::now_ns()
    }
}

/// A clock that moves only when told to; clones share the time.
#[derive(Clone, Debug)]
pub struct ManualWallClock(Arc<AtomicI64>);

impl ManualWallClock {
    /// A clock at the system time now.
    pub fn starting_now() -> Self {
        ManualWallClock(Arc::new(AtomicI64::new(crate::control::store::now_ns())))
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        // Relaxed: the value is the only data; a reader sees this or a later time, and the
        // pipeline orders its own work by its write lock, not by this atomic.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }
}

impl WallClock for ManualWallClock {
    fn unix_ns(&self) -> i64 {
        // Relaxed: see `advance`.
        self.0.load(Ordering::Relaxed)
    }
}
