//! Seams between the server core and its operational plumbing: metrics, authentication and
//! limits plug in here without touching the services or the pipeline.
//!
//! - [`Observer`]: called by the pipeline after every commit outcome, whenever a ruleset's
//!   active revision changes, and once at start with the engine. [`MetricsObserver`] feeds
//!   [`crate::telemetry::metrics`] from it; [`Hooks::with_observer`] adds observers.
//! - [`rpc_layer`]: the tower layers wrapped around every gRPC service, outermost first:
//!   `rpc.server.call.duration` and the call's span ([`crate::telemetry::metrics::GrpcMetricsLayer`], so
//!   refused calls are measured and traced too), the request-size answer
//!   ([`RequestLimitLayer`]) and bearer-token auth ([`AuthLayer`]).
//! - [`caller`]: who made a request, for the audit table (the auth layer's [`Caller`]).
//! - [`Hooks::limits`]: the limits the pipeline enforces (rules per ruleset, rulesets).
//! - [`Hooks::clock`]: the one clock (engine time, wall time) the server runs on.

use std::sync::Arc;

use tower::ServiceBuilder;
use tower::layer::util::{Identity, Stack};
use vallum_engine::engine::Engine;

use crate::clock::Clock;
use crate::config::Config;
use crate::control::outcome::Outcome;
use crate::control::store::Phases;
use crate::grpc::auth::{AuthLayer, Caller};
use crate::grpc::limits::{LimitsConfig, RequestLimitLayer};
use crate::telemetry::metrics::{GrpcMetricsLayer, Metrics};

/// What the pipeline reports after each commit.
#[derive(Clone, Debug)]
pub struct CommitRecord {
    /// Ruleset name; empty for a refused request naming a ruleset that does not exist (see
    /// [`crate::control::pipeline::Pipeline::refused`]).
    pub ruleset: String,
    /// Revision number made active (or failed); `None` when no revision was made (refused).
    pub revision: Option<u64>,
    /// How the commit ended.
    pub outcome: Outcome,
    /// Phase durations (ns).
    pub phases: Phases,
    /// Rules in the new snapshot.
    pub rules: u64,
}

/// Receives server events; implementations must be cheap and must not block.
pub trait Observer: Send + Sync + 'static {
    /// After every commit outcome (every [`Outcome`]: also refusals, failures, rollbacks,
    /// reverts and confirmations).
    fn on_commit(&self, _record: &CommitRecord) {}
    /// Once per published commit, after the snapshots it replaced were retired (after the
    /// reply, see `Engine::settle`): how long that waited for cores that were mid-batch, ns,
    /// and how many cores were mid-batch at its publish.
    fn on_retired(&self, _quiesce_ns: u64, _cores_waited: usize) {}
    /// When a ruleset's active revision changes: `Some(n)` after a commit, rollback or load,
    /// `None` when the ruleset is deactivated or deleted.
    fn on_active(&self, _ruleset: &str, _revision: Option<u64>) {}
    /// Once, after the stored state is loaded into the engine.
    fn on_start(&self, _engine: &Arc<Engine>, _config: &Config) {}
    /// How many stored active revisions the engine does not run because they did not load
    /// at start: after the load, and whenever one of them is replaced or deleted.
    fn on_not_loaded(&self, _rulesets: usize) {}
}

/// An observer that does nothing (the default until the metrics module fills in).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {}

/// Several observers, called in order.
struct Observers(Vec<Arc<dyn Observer>>);

impl Observer for Observers {
    fn on_commit(&self, record: &CommitRecord) {
        for o in &self.0 {
            o.on_commit(record);
        }
    }

    fn on_retired(&self, quiesce_ns: u64, cores_waited: usize) {
        for o in &self.0 {
            o.on_retired(quiesce_ns, cores_waited);
        }
    }

    fn on_active(&self, ruleset: &str, revision: Option<u64>) {
        for o in &self.0 {
            o.on_active(ruleset, revision);
        }
    }

    fn on_start(&self, engine: &Arc<Engine>, config: &Config) {
        for o in &self.0 {
            o.on_start(engine, config);
        }
    }

    fn on_not_loaded(&self, rulesets: usize) {
        for o in &self.0 {
            o.on_not_loaded(rulesets);
        }
    }
}

// === impl MetricsObserver ===

/// Feeds [`Metrics`] from the pipeline: `vallum_commit_duration_seconds` (every phase, persist
/// included), `vallum_commits_total`, `vallum_active_revision` and
/// `vallum_rulesets_not_loaded`.
#[derive(Clone, Debug)]
pub struct MetricsObserver {
    metrics: Metrics,
}

impl MetricsObserver {
    /// An observer recording into `metrics`.
    pub fn new(metrics: Metrics) -> MetricsObserver {
        MetricsObserver { metrics }
    }
}

impl Observer for MetricsObserver {
    fn on_commit(&self, record: &CommitRecord) {
        self.metrics
            .record_commit(&record.ruleset, record.outcome, &record.phases);
    }

    fn on_retired(&self, quiesce_ns: u64, cores_waited: usize) {
        self.metrics.record_retired(quiesce_ns, cores_waited);
    }

    fn on_active(&self, ruleset: &str, revision: Option<u64>) {
        self.metrics.set_active_revision(ruleset, revision);
    }

    fn on_not_loaded(&self, rulesets: usize) {
        self.metrics.set_rulesets_not_loaded(rulesets);
    }
}

/// The hooks a server runs with.
#[derive(Clone)]
pub struct Hooks {
    /// Commit, active-revision and start events.
    pub observer: Arc<dyn Observer>,
    /// Limits the pipeline enforces (rules per ruleset, rulesets).
    pub limits: LimitsConfig,
    /// The clock the engine, the pipeline, the store and the services read (see
    /// [`crate::clock`]); default the system clock; tests pass a
    /// [`crate::clock::ManualClock`]'s and advance it.
    pub clock: Clock,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            observer: Arc::new(NoopObserver),
            limits: LimitsConfig::default(),
            clock: Clock::system(),
        }
    }
}

impl Hooks {
    /// These hooks with `extra` called after the current observer.
    pub fn with_observer(mut self, extra: Arc<dyn Observer>) -> Hooks {
        self.observer = Arc::new(Observers(vec![self.observer, extra]));
        self
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// The tower layers around all gRPC services (see [`rpc_layer`]).
pub type RpcLayer = Stack<AuthLayer, Stack<RequestLimitLayer, Stack<GrpcMetricsLayer, Identity>>>;

/// Builds the [`RpcLayer`]: RPC metrics outermost (refusals are measured; calls timed on
/// `clock`), then the request-size answer, then `auth` (tokens — empty: no bearer tokens; its
/// [`AuthLayer::reloader`] swaps them later — and the local socket's peer credentials; see
/// [`crate::grpc::auth`]). The same layer serves the TCP listener and the local socket.
pub fn rpc_layer(config: &Config, metrics: &Metrics, auth: AuthLayer, clock: Clock) -> RpcLayer {
    ServiceBuilder::new()
        .layer(metrics.grpc_layer(clock))
        .layer(RequestLimitLayer::new(config.limits.max_request_bytes))
        .layer(auth)
        .into_inner()
}

/// The caller of a request, for the audit table: [`Caller::audit_name`] (with a scoped token's scope); when
/// auth is off (the `anonymous` caller) or the request did not pass the layer, the peer
/// address (`peer:ADDR`) or `anonymous`.
pub fn caller<T>(request: &tonic::Request<T>) -> String {
    match request.extensions().get::<Caller>() {
        Some(c) if *c != Caller::anonymous() => c.audit_name(),
        _ => request
            .remote_addr()
            .map_or_else(|| "anonymous".to_string(), |a| format!("peer:{a}")),
    }
}
