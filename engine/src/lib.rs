//! Vallum's rule engine: the rule model, the iptables-restore parser and printer, validation,
//! compiled snapshots and the per-core packet path with generation counters; and [`nft`], the
//! nftables front end (nft text and JSON in, the `nft list ruleset` listing out), whose rulesets
//! [`nft::lower()`] maps onto the rule model, so the same classifier enforces both.
//!
//! The engine is sans-IO: it reads no socket, no file and no clock. Time comes in as `now`
//! (nanoseconds from an arbitrary origin) or through the [`Clock`] the caller supplies.
//!
//! Used as a library (the README's "Using the engine as a library" shows this example without
//! its `#` lines; `tests/it/readme.rs` keeps the two equal):
//!
//! ```rust
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use vallum_engine::snapshot::Verdict;
//! use vallum_engine::conntrack::ConntrackConfig;
//! use vallum_engine::dataplane::BarrierStrategy;
//! use vallum_engine::engine::{Change, Engine, EngineConfig};
//! use vallum_engine::model::{Family, Hook};
//! use vallum_engine::packet::PacketMeta;
//! use vallum_engine::{Clock, restore, sets::NoSets};
//!
//! struct Monotonic(std::time::Instant); // the engine reads no clock: the caller gives one
//! impl Clock for Monotonic {
//!     fn now_ns(&self) -> u64 {
//!         self.0.elapsed().as_nanos() as u64
//!     }
//! }
//!
//! let config = EngineConfig {
//!     cores: 4,
//!     barrier: BarrierStrategy::Membarrier,
//!     conntrack: Some(ConntrackConfig::default()), // None: no connection tracking
//! };
//! let clock = Arc::new(Monotonic(std::time::Instant::now()));
//! let engine = Engine::new(config, clock.clone());
//! let text = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";
//! let rs = restore::parse_ruleset("host", text, &restore::ParseOptions::default())?;
//! let committed = engine.commit(Change::Put(rs), &NoSets)?; // phases in committed.report
//! drop(committed.retired); // old snapshot: drop off the hot path
//! let mut worker = engine.worker(0)?; // one per core, on its own thread
//! let ssh = PacketMeta {
//!     family: Family::Ipv4,
//!     hook: Hook::Input,
//!     src: "192.0.2.7".parse()?,
//!     dst: "192.0.2.1".parse()?,
//!     protocol: 6,
//!     sport: 40000,
//!     dport: 22,
//!     len: 60,
//!     ..PacketMeta::default()
//! };
//! let mut packets = [ssh, PacketMeta { dport: 23, ..ssh }];
//! let mut verdicts = [Verdict::Accept; 2];
//! worker.process_batch(&mut packets, &mut verdicts, clock.now_ns());
//! assert_eq!(verdicts, [Verdict::Accept, Verdict::Drop]);
//! # Ok(())
//! # }
//! ```

pub mod conntrack;
pub mod dataplane;
pub mod echo;
pub mod engine;
pub mod eval;
pub mod fib;
pub mod kernel_decided;
pub mod mark_field;
pub mod model;
pub mod nft;
pub mod node_addrs;
pub mod packet;
pub mod restore;
pub mod sets;
pub mod snapshot;
pub mod sync;
// Unit tests that include the benches' ClassBench reader (`#[path]`) name the crate as
// the benches do.
#[cfg(test)]
extern crate self as vallum_engine;
#[cfg(test)]
mod test_rng;
pub mod validate;

/// A monotonic clock the caller supplies (the engine never reads one itself).
pub trait Clock: Send + Sync {
    /// Nanoseconds since an arbitrary fixed origin; never decreases.
    fn now_ns(&self) -> u64;
}
