//! Vallum's rule engine: the rule model, the iptables-restore parser and printer, validation,
//! compiled snapshots and the per-core packet path with generation counters.
//!
//! The engine is sans-IO: it reads no socket, no file and no clock. Time comes in as `now`
//! (nanoseconds from an arbitrary origin) or through the [`Clock`] the caller supplies.

pub mod compile;
pub mod conntrack;
pub mod dataplane;
pub mod echo;
pub mod engine;
pub mod fib;
pub mod model;
pub mod node_addrs;
pub mod packet;
pub mod restore;
pub mod sets;
pub mod sync;
#[cfg(test)]
mod test_rng;
pub mod validate;

/// A monotonic clock the caller supplies (the engine never reads one itself).
pub trait Clock: Send + Sync {
    /// Nanoseconds since an arbitrary fixed origin; never decreases.
    fn now_ns(&self) -> u64;
}
