//! What the randomised engine tests share: a clock that stays at 0 and a seeded generator,
//! so that every run replays the same cases. Included with `#[path]` (each test file is its
//! own crate); not every file uses every item.
#![allow(dead_code)]

use std::sync::Arc;

use vallum_engine::Clock;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Engine, EngineConfig};

/// A clock that always reads 0 ns: the tests send no time-dependent traffic.
pub struct ZeroClock;

impl Clock for ZeroClock {
    fn now_ns(&self) -> u64 {
        0
    }
}

/// An engine of `cores` cores on [`ZeroClock`], with the SeqCst barrier and no conntrack.
pub fn engine(cores: usize) -> Engine {
    Engine::new(
        EngineConfig {
            cores,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    )
}

/// splitmix64: a small deterministic generator, enough to spread rules and headers.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
