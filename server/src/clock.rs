//! vallumd's one clock: a monotonic reading ([`Clock::now`], an [`Instant`]) and a wall
//! reading ([`Clock::unix_ns`], Unix nanoseconds) from one injected value.
//!
//! Every part of the server that asks "what time is it" asks the [`Clock`] it was given: the
//! engine (through [`vallum_engine::Clock`], ns since the clock was made), the pipeline
//! (phase timings, commit and audit times, commit-confirmed deadlines), the store (row times,
//! idempotency expiry), the gRPC layer (call latency, idle connections), packet events and
//! fleet mode. vallumd passes [`Clock::system`] (through
//! [`crate::control::hooks::Hooks::clock`]); a test passes a [`ManualClock`]'s clock and
//! moves both readings forward together with [`ManualClock::advance`], so a deadline, a TTL
//! or an audit time is tested without waiting.
//!
//! What does not read this clock, and why (each site says so again): the I/O edges, whose
//! time is the kernel's or a socket's.
//! - timers on tokio's clock (`tokio::time::Instant`, `sleep`, `timeout_at`): etcd calls and
//!   leases (`control/fleet/`), socket idle timers (`grpc/connections.rs`). tokio's clock is
//!   the one its timers fire on; tests drive it with `tokio::time::pause`;
//! - the pcap/synthetic source's pacing (`host/sources.rs`), which sleeps the thread;
//! - the cache of the kernel's NFQUEUE counters read from /proc (`host/nfqueue_stats.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall and monotonic time, shared by clones (cheap to clone: one `Arc`).
#[derive(Clone, Debug)]
pub struct Clock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The monotonic origin: [`vallum_engine::Clock::now_ns`] counts from it.
    origin: Instant,
    /// `None` for the system clock; for a manual one, the wall time at `origin` (Unix ns)
    /// and how far it was advanced (ns).
    manual: Option<(i64, AtomicU64)>,
}

impl Clock {
    /// The system's clocks ([`Instant::now`], [`SystemTime::now`]).
    pub fn system() -> Clock {
        Clock {
            inner: Arc::new(Inner {
                origin: Instant::now(),
                manual: None,
            }),
        }
    }

    /// Monotonic now.
    pub fn now(&self) -> Instant {
        match &self.inner.manual {
            None => Instant::now(),
            Some((_, offset)) => self.inner.origin + Duration::from_nanos(load(offset)),
        }
    }

    /// Engine time: nanoseconds since this clock was made (what the engine reads through
    /// [`vallum_engine::Clock`]; saturating at `u64::MAX`).
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.now().duration_since(self.inner.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Wall now as Unix nanoseconds (0 before 1970, `i64::MAX` after 2262).
    pub fn unix_ns(&self) -> i64 {
        match &self.inner.manual {
            None => unix_ns_of(SystemTime::now()),
            Some((at_origin, offset)) => {
                at_origin.saturating_add(i64::try_from(load(offset)).unwrap_or(i64::MAX))
            }
        }
    }

    /// Wall now as a [`SystemTime`].
    pub fn system_time(&self) -> SystemTime {
        match &self.inner.manual {
            None => SystemTime::now(),
            Some(_) => {
                UNIX_EPOCH + Duration::from_nanos(u64::try_from(self.unix_ns()).unwrap_or(0))
            }
        }
    }
}

impl Default for Clock {
    /// [`Clock::system`].
    fn default() -> Self {
        Clock::system()
    }
}

impl vallum_engine::Clock for Clock {
    /// [`Clock::now_ns`].
    fn now_ns(&self) -> u64 {
        Clock::now_ns(self)
    }
}

/// A clock that moves only when told to; for tests. Both readings start at the system's
/// time now and move together.
#[derive(Clone, Debug)]
pub struct ManualClock(Clock);

impl ManualClock {
    /// A clock at the system's time now.
    pub fn starting_now() -> ManualClock {
        ManualClock(Clock {
            inner: Arc::new(Inner {
                origin: Instant::now(),
                manual: Some((unix_ns_of(SystemTime::now()), AtomicU64::new(0))),
            }),
        })
    }

    /// The clock to inject; it shares this one's time.
    pub fn clock(&self) -> Clock {
        self.0.clone()
    }

    /// Moves both readings forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        if let Some((_, offset)) = &self.0.inner.manual {
            // Relaxed: the value is the only data; a reader sees this or a later time, and
            // no other memory is published through it.
            let _ = offset.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
        }
    }
}

impl std::ops::Deref for ManualClock {
    type Target = Clock;

    /// Reads the manual clock as any [`Clock`].
    fn deref(&self) -> &Clock {
        &self.0
    }
}

/// Relaxed: see [`ManualClock::advance`].
fn load(offset: &AtomicU64) -> u64 {
    offset.load(Ordering::Relaxed)
}

/// `t` as Unix nanoseconds (0 before 1970, `i64::MAX` after 2262).
pub fn unix_ns_of(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced_and_both_readings_together() {
        let m = ManualClock::starting_now();
        let c = m.clock();
        let (mono, wall, engine) = (c.now(), c.unix_ns(), c.now_ns());
        assert_eq!(engine, 0);
        assert_eq!((c.now(), c.unix_ns()), (mono, wall));
        m.advance(Duration::from_secs(90));
        assert_eq!(c.now() - mono, Duration::from_secs(90));
        assert_eq!(c.unix_ns() - wall, 90_000_000_000);
        assert_eq!(c.now_ns(), 90_000_000_000);
        assert_eq!(unix_ns_of(c.system_time()), c.unix_ns());
    }

    #[test]
    fn system_clock_follows_the_system() {
        let c = Clock::system();
        let before = unix_ns_of(SystemTime::now());
        let wall = c.unix_ns();
        assert!(before <= wall && wall <= unix_ns_of(SystemTime::now()));
        let a = c.now_ns();
        assert!(c.now_ns() >= a);
    }
}
