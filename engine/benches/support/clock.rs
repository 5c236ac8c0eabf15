//! Clocks for the engine benches, shared through `#[path]`: the engine's [`Clock`] on a
//! monotonic start instant, and the calling thread's CPU time.

#![allow(dead_code)] // Each bench uses a different part of this module.

use std::time::Instant;

use vallum_engine::Clock;

/// Nanoseconds since the instant it holds.
pub struct MonoClock(pub Instant);

impl Clock for MonoClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// CPU time of the calling thread, ns (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
