//! Seams for the ops side: metrics, authentication and limits plug in here without touching
//! the services or the pipeline.
//!
//! - [`Observer`]: called by the pipeline after every commit outcome and once at start with
//!   the engine (for sampled gauges such as per-core generations). The default does nothing.
//! - [`rpc_layer`]: the tower layer wrapped around every gRPC service (auth, limits,
//!   `rpc.server.duration`). Replace the body and [`RpcLayer`] with a `ServiceBuilder` stack.
//! - [`caller`]: who made a request, for the audit table (from the auth layer's extensions
//!   once tokens exist).

use std::sync::Arc;

use vallum_engine::engine::Engine;

use crate::config::Config;
use crate::store::Phases;

/// What the pipeline reports after each commit.
#[derive(Clone, Debug)]
pub struct CommitRecord {
    /// Ruleset name.
    pub ruleset: String,
    /// Revision number made active (or refused).
    pub revision: u64,
    /// `COMMITTED`, `FAILED`, `ROLLED_BACK` or `CONFIRMED`.
    pub outcome: &'static str,
    /// Phase durations (ns).
    pub phases: Phases,
    /// Rules in the new snapshot.
    pub rules: u64,
}

/// Receives server events; implementations must be cheap and must not block.
pub trait Observer: Send + Sync + 'static {
    /// After every commit outcome (also failures, rollbacks and confirmations).
    fn on_commit(&self, _record: &CommitRecord) {}
    /// Once, after the stored state is loaded into the engine.
    fn on_start(&self, _engine: &Arc<Engine>, _config: &Config) {}
}

/// An observer that does nothing (the default until the metrics module fills in).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {}

/// The hooks a server runs with.
#[derive(Clone)]
pub struct Hooks {
    /// Commit and start events.
    pub observer: Arc<dyn Observer>,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            observer: Arc::new(NoopObserver),
        }
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

/// The tower layer around all gRPC services. HOOK(ops): auth, limits and RPC metrics.
pub type RpcLayer = tower::layer::util::Identity;

/// Builds the [`RpcLayer`] from the configuration. HOOK(ops).
pub fn rpc_layer(_config: &Config) -> RpcLayer {
    tower::layer::util::Identity::new()
}

/// The caller of a request, for the audit table. HOOK(ops): read the authenticated identity
/// from the request extensions; until then the peer address or `anonymous`.
pub fn caller<T>(request: &tonic::Request<T>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "anonymous".to_string(), |a| format!("peer:{a}"))
}
