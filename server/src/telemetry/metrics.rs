//! Metrics: OpenTelemetry instruments (the `opentelemetry` API and SDK), read by one pull
//! reader and served in the Prometheus text format on `/metrics` (`--metrics-listen`, default
//! `127.0.0.1:9464`), optionally pushed with OTLP too (cargo feature `otlp`, off by default, then
//! `--otlp-endpoint`).
//!
//! Names follow the table in DESIGN.md. The exposition ([`exposition`]) appends the unit (`s` ->
//! `_seconds`) and `_total` for counters itself, so instruments are created *without* those
//! suffixes (`vallum_commit_duration` with unit `s` is scraped as
//! `vallum_commit_duration_seconds`; `vallum_commits` as `vallum_commits_total`). The test
//! `scrape_has_every_design_metric` checks the scraped names.
//!
//! | scraped name | kind | labels | fed by |
//! |---|---|---|---|
//! | `vallum_commit_duration_seconds` | histogram | phase, outcome | [`Metrics::record_commit`] |
//! | `vallum_commit_quiesce_cores_waited` | histogram | | [`Metrics::record_retired`] |
//! | `vallum_commits_total` | counter | ruleset, outcome | [`Metrics::record_commit`] |
//! | `vallum_active_revision` | gauge | ruleset | [`Metrics::set_active_revision`] |
//! | `vallum_rulesets_not_loaded` | gauge | | [`Metrics::set_rulesets_not_loaded`] |
//! | `vallum_packets_total` | counter | family, hook, verdict, ruleset=`all` | engine, at scrape |
//! | `vallum_core_generation` | gauge | core | engine, at scrape |
//! | `vallum_shadow_packets_total` | counter | ruleset, revision, from, to | engine, at scrape (the running shadow, else the last one) |
//! | `vallum_packet_barrier_seconds` | histogram | strategy | engine, at scrape |
//! | `vallum_rule_packets_total`, `vallum_rule_bytes_total` | counter (opt-in) | ruleset, family, table, chain, rule | engine, at scrape |
//! | `vallum_set_elements` | gauge | set | [`Metrics::observe_sets`], at scrape |
//! | `vallum_store_writes_total`, `vallum_store_fsyncs_total` | counter | | [`Metrics::observe_store`], at scrape |
//! | `vallum_packet_events_dropped_total` | counter | reason | [`Metrics::observe_events`], at scrape |
//! | `rpc_server_call_duration_seconds` | histogram | rpc_system_name, rpc_method, rpc_response_status_code, error_type | [`Metrics::grpc_layer`] |
//! | `rpc_server_duration_seconds` (deprecated) | histogram | rpc_system, rpc_service, rpc_method, rpc_grpc_status_code | [`Metrics::grpc_layer`] |
//! | `vallum_conntrack_entries`, `vallum_conntrack_max` | gauge | | engine, at scrape ([`Metrics::observe_conntrack`]) |
//! | `vallum_conntrack_new_total`, `vallum_conntrack_early_drops_total`, `vallum_conntrack_insert_failed_total` | counter | | engine, at scrape |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, ... | counter, gauges | | `/proc/self`, at scrape (`process`) |
//! | `vallum_nfqueue_received_total`, `vallum_nfqueue_verdicts_total` (+ verdict), `vallum_nfqueue_verdict_send_errors_total`, `vallum_nfqueue_receive_errors_total`, `vallum_nfqueue_ct_state_disagreements_total` | counter | queue | the NFQUEUE workers, at scrape ([`Metrics::observe_nfqueue`]) |
//! | `vallum_nfqueue_kernel_ids_total`, `vallum_nfqueue_queue_dropped_total`, `vallum_nfqueue_user_dropped_total`, `vallum_nfqueue_socket_drops_total`, `vallum_nfqueue_bypassed_total` | counter | queue | `/proc/net/netfilter/nfnetlink_queue`, `/proc/net/netlink`, at scrape |
//! | `vallum_nfqueue_waiting`, `vallum_nfqueue_maxlen`, `vallum_nfqueue_copy_range_bytes`, `vallum_nfqueue_fail_open`, `vallum_nfqueue_bypass_exact` | gauge | queue | the same |
//!
//! Deviations from the table, because of what the engine can attribute:
//! - `vallum_packets_total` has `ruleset="all"`: the engine counts verdicts per (family, hook,
//!   verdict) only, a verdict is the outcome of all rulesets at a hook. A `family` label is added.
//! - `vallum_rule_*_total` has a `family` label too: `filter`/`INPUT` exists in both families.
//!   `rule` is the 1-based rule number, or `policy` for the chain policy.
//!
//! ## How `/metrics` is served, and why this way
//! A scrape collects the SDK's instruments through `PullReader` (the SDK's `ManualReader`,
//! shared with the renderer), converts the collected `ResourceMetrics` into the text format's
//! families ([`exposition::from_otel`]), adds the barrier histogram (below) and renders them all
//! with one encoder ([`exposition::render`]). There is no second registry or instrument API.
//!
//! The alternatives, as of opentelemetry 0.33 (checked with `cargo info`):
//! - `opentelemetry-prometheus` 0.33.1 is maintained again (its 0.32 changelog removed the
//!   discontinuation notice) but renders through the `prometheus` crate's registry and encoder;
//!   the barrier histogram, which OTel cannot express, would then need a raw
//!   `prometheus::Collector` in that registry: two instrument APIs and two crates for one
//!   text format of a few dozen lines.
//! - OTLP into Prometheus' OTLP receiver is what OTel recommends for new projects, but it is a
//!   push path (and a Prometheus feature flag); the deployment (ServiceMonitor, the alerts'
//!   `up{job="vallum"}`) scrapes. OTLP stays available for those who want it (feature `otlp`).
//!
//! The test `server/tests/it/prometheus_server.rs` has a real Prometheus scrape vallumd and
//! evaluates every dashboard query and alert expression, so a format or name slip fails there.
//!
//! ## The barrier histogram
//! The engine keeps its own log-linear histogram of sampled barrier cost per packet (in
//! picoseconds), cumulative since start. OTel has no asynchronous histogram, and re-recording the
//! deltas between scrapes would cost one `record` call per sample and lose the exact sum. So
//! `vallum_packet_barrier_seconds` is read from the engine at scrape time
//! ([`Metrics::observe_engine`]) and rendered by the same encoder: exact counts and sum, bucket
//! bounds at powers of two from 2^3 ps (8e-12 s) to 2^20 ps (1.05e-6 s), which are bucket edges
//! of the engine's histogram, so no count is moved between buckets. It is not pushed via OTLP.
//!
//! ## Wiring in the server
//! ```ignore
//! let metrics = Metrics::new(args.metrics.clone())?;
//! metrics.observe_engine(engine.clone())?;                     // once, at start
//! let _http = metrics.serve(args.metrics.metrics_listen, shutdown.clone()).await?;
//! Server::builder().layer(metrics.grpc_layer(clock)).layer(auth_layer) ...;
//! metrics.record_commit(&ruleset, Outcome::Committed, &phases); // after each commit
//! metrics.set_active_revision(&ruleset, Some(n));              // after commit / rollback / delete
//! ```

pub mod exposition;
mod grpc;
mod process;
mod reference;
pub mod traces;

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Temporality,
};
use vallum_engine::dataplane::Histogram as EngineHistogram;
use vallum_engine::engine::Engine;
use vallum_engine::sets::SetManager;

use crate::control::outcome::Outcome;
use crate::control::store::Phases;
use exposition::{Family, Kind, Number, Series, Value};
#[cfg(test)]
use grpc::Recording;
use grpc::RpcHistograms;
pub use grpc::{GrpcMetricsLayer, GrpcMetricsService, MetricsBody};

/// Default address of the `/metrics` HTTP listener.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";

/// Bucket bounds of `vallum_commit_duration_seconds`, seconds (1 µs .. 10 s).
const COMMIT_BOUNDS: &[f64] = &[
    1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Bucket bounds of `vallum_commit_quiesce_cores_waited`, cores.
const CORES_BOUNDS: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
/// Bucket bounds of `rpc.server.call.duration` (and the deprecated `rpc.server.duration`),
/// seconds: the semantic-convention buckets with finer ones below 5 ms (most of our calls are
/// sub-millisecond).
const RPC_BOUNDS: &[f64] = &[
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0,
];
/// `vallum_packet_barrier_seconds` bounds: powers of two from 2^3 to 2^20 picoseconds.
const BARRIER_MIN_EXP: u32 = 3;
const BARRIER_MAX_EXP: u32 = 20;

/// Metric flags of `vallumd`; flatten into the server's clap parser.
#[derive(Clone, Debug, clap::Args)]
pub struct MetricsConfig {
    /// Address of the Prometheus `/metrics` HTTP listener.
    #[arg(long, env = "VALLUM_METRICS_LISTEN", default_value = DEFAULT_METRICS_LISTEN)]
    pub metrics_listen: SocketAddr,
    /// Export per-rule packet and byte counters (`vallum_rule_*_total`; one series per rule).
    #[arg(long, env = "VALLUM_METRICS_RULE_COUNTERS")]
    pub metrics_rule_counters: bool,
    /// Also push metrics with OTLP/gRPC to this endpoint (e.g. `http://127.0.0.1:4317`), every
    /// 60 s; needs vallum-server built with the `otlp` cargo feature.
    #[arg(long, env = "VALLUM_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

impl Default for MetricsConfig {
    fn default() -> MetricsConfig {
        MetricsConfig {
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            metrics_rule_counters: false,
            otlp_endpoint: None,
        }
    }
}

/// Why metrics could not be set up or served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The OpenTelemetry SDK or exporter refused the configuration.
    #[error("metrics exporter: {0}")]
    Exporter(String),
    /// `--otlp-endpoint` was given but the `otlp` cargo feature is off.
    #[error("--otlp-endpoint needs vallum-server built with the `otlp` cargo feature")]
    OtlpDisabled,
    /// The engine's metrics are already registered (`observe_engine` called twice).
    #[error("metrics registry: the engine's metrics are already registered")]
    AlreadyRegistered,
    /// The `/metrics` listener could not be bound.
    #[error("cannot listen for /metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl MetricsError {
    /// UPPER_SNAKE code of this startup error, printed by vallumd. It never reaches a client,
    /// so it is not a row of the [`crate::Reason`] table.
    pub fn reason(&self) -> &'static str {
        match self {
            MetricsError::Exporter(_) => "METRICS_EXPORTER",
            MetricsError::OtlpDisabled => "OTLP_DISABLED",
            MetricsError::AlreadyRegistered => "METRICS_REGISTRY",
            MetricsError::Bind { .. } => "METRICS_BIND",
        }
    }
}

fn ns_to_s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

// === impl Metrics ===

/// The metrics of one server: cheap to clone, share it between services.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    provider: SdkMeterProvider,
    /// What `/metrics` collects from (also registered with `provider`).
    reader: PullReader,
    /// The engine whose barrier histogram `/metrics` adds ([`Metrics::observe_engine`]).
    engine: OnceLock<Arc<Engine>>,
    /// What `/readyz` asks ([`Metrics::observe_health`]).
    health: OnceLock<Arc<tonic_health::server::HealthService>>,
    meter: Meter,
    rule_counters: bool,
    commit_duration: Histogram<f64>,
    cores_waited: Histogram<u64>,
    commits: Counter<u64>,
    rpc_call_duration: Histogram<f64>,
    /// The deprecated `rpc.server.duration` (semantic conventions up to 1.37).
    rpc_duration: Histogram<f64>,
    /// ruleset -> active revision, read by the `vallum_active_revision` callback.
    active: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Stored active revisions the engine does not run, read by the
    /// `vallum_rulesets_not_loaded` callback.
    not_loaded: Arc<AtomicU64>,
    /// Observable instruments: kept so their callbacks stay registered.
    observers: Mutex<Vec<Box<dyn Any + Send + Sync>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("rule_counters", &self.inner.rule_counters)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Builds the meter provider, its pull reader and the instruments fed by calls.
    pub fn new(config: &MetricsConfig) -> Result<Metrics, MetricsError> {
        let reader = PullReader(Arc::new(ManualReader::builder().build()));
        let resource = Resource::builder().with_service_name("vallumd").build();
        let builder = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader.clone());
        let builder = with_otlp(builder, config.otlp_endpoint.as_deref())?;
        let provider = builder.build();
        let meter = provider.meter("vallum");

        let commit_duration = meter
            .f64_histogram("vallum_commit_duration")
            .with_unit("s")
            .with_description(
                "Duration of each commit phase and of the whole commit (phase=total).",
            )
            .with_boundaries(COMMIT_BOUNDS.to_vec())
            .build();
        let cores_waited = meter
            .u64_histogram("vallum_commit_quiesce_cores_waited")
            .with_description("Cores that were mid-batch at publish time and had to be waited for.")
            .with_boundaries(CORES_BOUNDS.to_vec())
            .build();
        let commits = meter
            .u64_counter("vallum_commits")
            .with_description("Commits by ruleset and outcome.")
            .build();
        let rpc_call_duration = meter
            .f64_histogram("rpc.server.call.duration")
            .with_unit("s")
            .with_description(
                "Duration of inbound gRPC calls, to the end of the response (OTel RPC semantic \
                 conventions).",
            )
            .with_boundaries(RPC_BOUNDS.to_vec())
            .build();
        let rpc_duration = meter
            .f64_histogram("rpc.server.duration")
            .with_unit("s")
            .with_description(
                "Deprecated: use rpc_server_call_duration_seconds. Duration of inbound gRPC \
                 calls (OTel semantic conventions up to 1.37).",
            )
            .with_boundaries(RPC_BOUNDS.to_vec())
            .build();

        let active: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let active_cb = active.clone();
        let active_gauge = meter
            .u64_observable_gauge("vallum_active_revision")
            .with_description("Active revision number of each ruleset.")
            .with_callback(move |obs| {
                let map = active_cb.lock().unwrap_or_else(PoisonError::into_inner);
                for (ruleset, rev) in map.iter() {
                    obs.observe(*rev, &[KeyValue::new("ruleset", ruleset.clone())]);
                }
            })
            .build();
        let not_loaded: Arc<AtomicU64> = Arc::default();
        let not_loaded_cb = not_loaded.clone();
        let not_loaded_gauge = meter
            .u64_observable_gauge("vallum_rulesets_not_loaded")
            .with_description(
                "Rulesets whose stored active revision did not load at start (the engine does \
                 not run it; vallumd --on-load-failure degraded).",
            )
            // Relaxed: a lone value, read at scrape; nothing else is ordered against it.
            .with_callback(move |obs| obs.observe(not_loaded_cb.load(Ordering::Relaxed), &[]))
            .build();

        let mut observers: Vec<Box<dyn Any + Send + Sync>> =
            vec![Box::new(active_gauge), Box::new(not_loaded_gauge)];
        observers.extend(process::register(&meter));
        Ok(Metrics {
            inner: Arc::new(Inner {
                provider,
                reader,
                engine: OnceLock::new(),
                health: OnceLock::new(),
                meter,
                rule_counters: config.metrics_rule_counters,
                commit_duration,
                cores_waited,
                commits,
                rpc_call_duration,
                rpc_duration,
                active,
                not_loaded,
                observers: Mutex::new(observers),
            }),
        })
    }

    /// The meter, for instruments another module owns (fleet mode's `vallum_fleet_*`).
    pub fn meter(&self) -> Meter {
        self.inner.meter.clone()
    }

    /// Keeps an observable instrument registered for the life of these metrics.
    pub fn keep(&self, instrument: Box<dyn Any + Send + Sync>) {
        self.inner
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(instrument);
    }

    /// Records one commit: each phase and `total` into `vallum_commit_duration_seconds`, and
    /// one `vallum_commits_total{ruleset, outcome}` (outcome: an [`Outcome::label`]). For other
    /// outcomes than `committed` only the phases that ran (non-zero) are recorded, `total`
    /// included: a refusal or a confirmation has no phases and must not pull the latency
    /// quantiles down with zeros. The `quiesce` phase and the cores waited for are recorded
    /// when the replaced snapshot is retired, after the reply ([`Metrics::record_retired`]).
    pub fn record_commit(&self, ruleset: &str, outcome: Outcome, phases: &Phases) {
        let i = &self.inner;
        let outcome_kv = KeyValue::new("outcome", outcome.label());
        let total = ("total", phases.total_ns);
        for (phase, ns) in phases.labelled().into_iter().chain([total]) {
            if (ns == 0 && outcome != Outcome::Committed) || phase == "quiesce" {
                continue;
            }
            i.commit_duration.record(
                ns_to_s(ns),
                &[KeyValue::new("phase", phase), outcome_kv.clone()],
            );
        }
        i.commits.add(
            1,
            &[KeyValue::new("ruleset", ruleset.to_owned()), outcome_kv],
        );
    }

    /// Records the retirement of published commits' replaced snapshots (after the reply):
    /// the wait for cores that were mid-batch as `vallum_commit_duration_seconds{phase=
    /// "quiesce", outcome="committed"}`, the cores as `vallum_commit_quiesce_cores_waited`.
    pub fn record_retired(&self, quiesce_ns: u64, cores_waited: usize) {
        let i = &self.inner;
        i.commit_duration.record(
            ns_to_s(quiesce_ns),
            &[
                KeyValue::new("phase", "quiesce"),
                KeyValue::new("outcome", Outcome::Committed.label()),
            ],
        );
        i.cores_waited
            .record(u64::try_from(cores_waited).unwrap_or(u64::MAX), &[]);
    }

    /// Sets `vallum_rulesets_not_loaded`: how many stored active revisions did not load.
    pub fn set_rulesets_not_loaded(&self, rulesets: usize) {
        // Relaxed: see the callback.
        self.inner.not_loaded.store(
            u64::try_from(rulesets).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Sets (`Some`) or removes (`None`, ruleset deleted) `vallum_active_revision{ruleset}`.
    pub fn set_active_revision(&self, ruleset: &str, revision: Option<u64>) {
        let mut map = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match revision {
            Some(r) => {
                map.insert(ruleset.to_owned(), r);
            }
            None => {
                map.remove(ruleset);
            }
        }
    }

    /// Registers the engine-fed metrics, read at scrape time: packets by verdict, core
    /// generations, the barrier histogram and (opt-in) per-rule counters. Call once; a second
    /// call fails with [`MetricsError::AlreadyRegistered`].
    pub fn observe_engine(&self, engine: Arc<Engine>) -> Result<(), MetricsError> {
        let i = &self.inner;
        i.engine
            .set(engine.clone())
            .map_err(|_| MetricsError::AlreadyRegistered)?;
        let mut keep: Vec<Box<dyn Any + Send + Sync>> = Vec::new();

        let e = engine.clone();
        keep.push(Box::new(
            i.meter
                .u64_observable_counter("vallum_packets")
                .with_description(
                    "Packets by final verdict (ruleset=\"all\": verdicts are per hook, not per ruleset).",
                )
                .with_callback(move |obs| {
                    for vc in e.verdict_counts() {
                        obs.observe(
                            vc.packets,
                            &[
                                KeyValue::new("family", family_name(vc.family)),
                                KeyValue::new("hook", vc.hook.chain_name()),
                                KeyValue::new("verdict", vc.verdict),
                                KeyValue::new("ruleset", "all"),
                            ],
                        );
                    }
                })
                .build(),
        ));

        let e = engine.clone();
        keep.push(Box::new(
            i.meter
                .u64_observable_counter("vallum_shadow_packets")
                .with_description(
                    "Packets of the running (else the last) shadow by (active verdict `from`, shadow verdict `to`).",
                )
                .with_callback(move |obs| {
                    let Some((ruleset, revision, pairs)) = e.shadow_pairs() else {
                        return;
                    };
                    for p in pairs {
                        obs.observe(
                            p.packets,
                            &[
                                KeyValue::new("ruleset", ruleset.clone()),
                                KeyValue::new("revision", revision.to_string()),
                                KeyValue::new("from", p.active),
                                KeyValue::new("to", p.shadow),
                            ],
                        );
                    }
                })
                .build(),
        ));

        let e = engine.clone();
        keep.push(Box::new(
            i.meter
                .u64_observable_gauge("vallum_core_generation")
                .with_description("Generation counter of each core (odd: inside a batch).")
                .with_callback(move |obs| {
                    for (core, g) in e.generations().into_iter().enumerate() {
                        obs.observe(g, &[KeyValue::new("core", core.to_string())]);
                    }
                })
                .build(),
        ));

        if i.rule_counters {
            for (name, bytes) in [("vallum_rule_packets", false), ("vallum_rule_bytes", true)] {
                let e = engine.clone();
                keep.push(Box::new(
                    i.meter
                        .u64_observable_counter(name)
                        .with_description(if bytes {
                            "Bytes (layer-3 length) matched by each rule or chain policy (opt-in: --metrics-rule-counters)."
                        } else {
                            "Packets matched by each rule or chain policy (opt-in: --metrics-rule-counters)."
                        })
                        .with_callback(move |obs| {
                            for c in e.counters() {
                                let rule = c
                                    .rule
                                    .map_or_else(|| "policy".to_owned(), |r| r.to_string());
                                obs.observe(
                                    if bytes { c.bytes } else { c.packets },
                                    &[
                                        KeyValue::new("ruleset", c.ruleset.to_string()),
                                        KeyValue::new("family", family_name(c.family)),
                                        KeyValue::new("table", c.table.name()),
                                        KeyValue::new("chain", c.chain.to_string()),
                                        KeyValue::new("rule", rule),
                                    ],
                                );
                            }
                        })
                        .build(),
                ));
            }
        }
        i.observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(keep);
        Ok(())
    }

    /// Registers the connection-table metrics, read from [`Conntrack::stats`] at scrape time:
    /// `vallum_conntrack_entries` and `vallum_conntrack_max` (gauges, entries; the table-full
    /// alert divides them), `vallum_conntrack_new_total`, `vallum_conntrack_early_drops_total`
    /// and `vallum_conntrack_insert_failed_total` (counters since start). Registers nothing when
    /// the engine runs without conntrack. Call once.
    ///
    /// [`Conntrack::stats`]: vallum_engine::conntrack::Conntrack::stats
    pub fn observe_conntrack(&self, engine: Arc<Engine>) {
        let i = &self.inner;
        let Some(max) = engine.conntrack().map(|c| c.max_entries()) else {
            return;
        };
        let mut keep: Vec<Box<dyn Any + Send + Sync>> = Vec::new();
        let e = engine.clone();
        keep.push(Box::new(
            i.meter
                .u64_observable_gauge("vallum_conntrack_entries")
                .with_description(
                    "Entries in the connection table (including expired ones not yet collected).",
                )
                .with_callback(move |obs| {
                    if let Some(ct) = e.conntrack() {
                        obs.observe(ct.stats().entries, &[]);
                    }
                })
                .build(),
        ));
        keep.push(Box::new(
            i.meter
                .u64_observable_gauge("vallum_conntrack_max")
                .with_description("Most entries the connection table admits (--conntrack-max).")
                .with_callback(move |obs| obs.observe(max, &[]))
                .build(),
        ));
        type Pick = fn(&vallum_engine::conntrack::ConntrackStats) -> u64;
        let counters: [(&'static str, &'static str, Pick); 3] = [
            (
                "vallum_conntrack_new",
                "Connection-table entries created.",
                |s| s.new_total,
            ),
            (
                "vallum_conntrack_early_drops",
                "Unreplied entries evicted to admit new connections (table full).",
                |s| s.early_drops,
            ),
            (
                "vallum_conntrack_insert_failed",
                "New connections refused, and their packets dropped, because the table was full.",
                |s| s.insert_failed,
            ),
        ];
        for (name, help, pick) in counters {
            let e = engine.clone();
            keep.push(Box::new(
                i.meter
                    .u64_observable_counter(name)
                    .with_description(help)
                    .with_callback(move |obs| {
                        if let Some(ct) = e.conntrack() {
                            obs.observe(pick(&ct.stats()), &[]);
                        }
                    })
                    .build(),
            ));
        }
        i.observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(keep);
    }

    /// Registers the `vallum_nfqueue_*` series of `queues` (one `queue` label each), read at
    /// scrape time through one [`Scraper`](crate::host::nfqueue_stats::Scraper) reading: ours (the
    /// workers' counters) and the kernel's (`/proc/net/netfilter/nfnetlink_queue`, our
    /// sockets' drops in `/proc/net/netlink`); what each counts and how exact it is, in the
    /// help texts and [`crate::host::nfqueue_stats`]. Nothing is registered without queues. Call
    /// once.
    pub fn observe_nfqueue(&self, queues: Vec<Arc<crate::host::nfqueue_stats::QueueCounters>>) {
        self.observe_nfqueue_at(std::path::Path::new("/proc"), queues);
    }

    /// [`Metrics::observe_nfqueue`] with the kernel's files read under `proc` instead of
    /// `/proc` (the metric reference's test feeds every family from files of its own).
    pub(crate) fn observe_nfqueue_at(
        &self,
        proc: &std::path::Path,
        queues: Vec<Arc<crate::host::nfqueue_stats::QueueCounters>>,
    ) {
        use crate::host::nfqueue_stats::{QueueStats, Scraper};
        if queues.is_empty() {
            return;
        }
        let scraper = Arc::new(Scraper::new(proc, queues));
        let q = |s: &QueueStats| KeyValue::new("queue", s.queue.to_string());
        type Pick = fn(&QueueStats) -> Option<u64>;
        let counters: [(&'static str, &'static str, Pick); 9] = [
            (
                "vallum_nfqueue_received",
                "Packets vallumd read from the queue (each gets one verdict).",
                |s| Some(s.received),
            ),
            (
                "vallum_nfqueue_verdict_send_errors",
                "Batches whose verdicts vallumd could not send (sendto failed); their packets \
                 wait in the kernel until a later batch verdict covers them.",
                |s| Some(s.verdict_errors),
            ),
            (
                "vallum_nfqueue_receive_errors",
                "Failed receives on the queue's socket (other than timeouts).",
                |s| Some(s.receive_errors),
            ),
            (
                "vallum_nfqueue_kernel_ids",
                "Packet ids the kernel gave out on this queue (id_sequence, unwrapped): packets \
                 it sent to vallumd's socket, or tried to while the socket was full.",
                |s| s.ids,
            ),
            (
                "vallum_nfqueue_queue_dropped",
                "Packets the kernel dropped because the queue was full (fail-closed only; \
                 queue_dropped, wraps at 2^32).",
                |s| s.kernel.map(|k| u64::from(k.queue_dropped)),
            ),
            (
                "vallum_nfqueue_user_dropped",
                "Packets the kernel dropped because vallumd's socket buffer was full \
                 (fail-closed only; user_dropped, wraps at 2^32).",
                |s| s.kernel.map(|k| u64::from(k.user_dropped)),
            ),
            (
                "vallum_nfqueue_socket_drops",
                "Packet messages the kernel could not put in vallumd's full socket buffer \
                 (sk_drops, both modes): dropped when fail-closed, accepted unclassified when \
                 fail-open.",
                |s| s.socket_drops,
            ),
            (
                "vallum_nfqueue_ct_state_disagreements",
                "Packets whose conntrack state in the kernel (NFQA_CT_INFO: NEW, ESTABLISHED, \
                 RELATED) differed from the one vallumd's own table gave them; vallumd's \
                 decides (it sees the ruleset's raw-table NOTRACK rules and its own accepts).",
                |s| Some(s.ct_disagreed),
            ),
            (
                "vallum_nfqueue_bypassed",
                "Packets let through by fail-open without a verdict (fail-open queues only): \
                 exact while vallum_nfqueue_bypass_exact is 1 (the socket fills before the \
                 queue; its drops are exactly these), a lower bound when it is 0 (accepts at a \
                 full queue are counted nowhere).",
                |s| s.bypassed,
            ),
        ];
        let mut keep: Vec<Box<dyn Any + Send + Sync>> = Vec::new();
        for (name, help, pick) in counters {
            let sc = scraper.clone();
            keep.push(Box::new(
                self.inner
                    .meter
                    .u64_observable_counter(name)
                    .with_description(help)
                    .with_callback(move |obs| {
                        for s in sc.stats() {
                            if let Some(v) = pick(&s) {
                                obs.observe(v, &[q(&s)]);
                            }
                        }
                    })
                    .build(),
            ));
        }
        let sc = scraper.clone();
        keep.push(Box::new(
            self.inner
                .meter
                .u64_observable_counter("vallum_nfqueue_verdicts")
                .with_description("Verdicts vallumd sent, by verdict (REJECT is sent as drop).")
                .with_callback(move |obs| {
                    for s in sc.stats() {
                        for (v, n) in [("accept", s.accepted), ("drop", s.dropped)] {
                            obs.observe(n, &[q(&s), KeyValue::new("verdict", v)]);
                        }
                    }
                })
                .build(),
        ));
        let batch = crate::host::sources::BATCH as u32;
        type Gauge =
            fn(&QueueStats, &crate::host::nfqueue_stats::QueueCounters, u32) -> Option<u64>;
        let gauges: [(&'static str, &'static str, Gauge); 5] = [
            (
                "vallum_nfqueue_waiting",
                "Packets queued in the kernel and not yet given a verdict (queue_total).",
                |s, _, _| s.kernel.map(|k| u64::from(k.waiting)),
            ),
            (
                "vallum_nfqueue_maxlen",
                "Packets the queue holds before it drops or, fail-open, accepts new ones \
                 (--queue-maxlen).",
                |_, c, _| Some(u64::from(c.maxlen)),
            ),
            (
                "vallum_nfqueue_copy_range_bytes",
                "Bytes of each packet the kernel copies to vallumd (copy_range).",
                |s, _, _| s.kernel.map(|k| u64::from(k.copy_range)),
            ),
            (
                "vallum_nfqueue_fail_open",
                "1 when a full queue accepts packets unclassified (fail-open), 0 when it drops \
                 them (fail-closed).",
                |_, c, _| Some(u64::from(c.fail_open)),
            ),
            (
                "vallum_nfqueue_bypass_exact",
                "1 when vallum_nfqueue_bypassed_total counts every fail-open bypass (or the \
                 queue is fail-closed), 0 when --queue-maxlen is below the socket buffer's \
                 capacity and it is a lower bound.",
                |_, c, batch| Some(u64::from(c.bypass_exact(batch))),
            ),
        ];
        for (name, help, pick) in gauges {
            let sc = scraper.clone();
            keep.push(Box::new(
                self.inner
                    .meter
                    .u64_observable_gauge(name)
                    .with_description(help)
                    .with_callback(move |obs| {
                        for (s, c) in sc.stats().iter().zip(sc.counters()) {
                            if let Some(v) = pick(s, c, batch) {
                                obs.observe(v, &[q(s)]);
                            }
                        }
                    })
                    .build(),
            ));
        }
        self.inner
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(keep);
    }

    /// Registers `vallum_packet_events_dropped_total{reason}`, read at scrape time from
    /// `events`: packet events (LOG hits, sampled drops) lost because a core's LOG ring was
    /// full (`ring_full`: more hits in one batch than [`LOG_RING_CAPACITY`]), a commit made a
    /// LOG hit's rule unnameable before its core drained it (`stale`), the events thread's
    /// queue was full (`queue_full`) or a `WatchPacketEvents` subscriber read too slowly
    /// (`slow_subscriber`, once per subscriber that missed it). Call once.
    ///
    /// [`LOG_RING_CAPACITY`]: vallum_engine::engine::LOG_RING_CAPACITY
    pub fn observe_events(&self, events: crate::telemetry::events::Events) {
        let counter = self
            .inner
            .meter
            .u64_observable_counter("vallum_packet_events_dropped")
            .with_description(
                "Packet events (LOG hits, sampled drops) lost: a core's LOG ring was full, a \
                 commit made the hit's rule unnameable, the events queue was full, or a \
                 WatchPacketEvents subscriber read too slowly.",
            )
            .with_callback(move |obs| {
                let d = events.drops();
                obs.observe(
                    d.ring_full.load(std::sync::atomic::Ordering::Relaxed),
                    &[KeyValue::new("reason", "ring_full")],
                );
                obs.observe(
                    d.stale.load(std::sync::atomic::Ordering::Relaxed),
                    &[KeyValue::new("reason", "stale")],
                );
                obs.observe(
                    d.queue_full.load(std::sync::atomic::Ordering::Relaxed),
                    &[KeyValue::new("reason", "queue_full")],
                );
                obs.observe(
                    d.slow_subscriber.load(std::sync::atomic::Ordering::Relaxed),
                    &[KeyValue::new("reason", "slow_subscriber")],
                );
            })
            .build();
        self.keep(Box::new(counter));
    }

    /// Registers `vallum_set_elements{set}`, read at scrape time from `sets`: the elements each
    /// set holds (expired ones count until garbage-collected, as ipset's "Number of entries").
    /// A set appears once created and disappears when destroyed. Call once.
    pub fn observe_sets(&self, sets: Arc<SetManager>) -> Result<(), MetricsError> {
        let gauge = self
            .inner
            .meter
            .u64_observable_gauge("vallum_set_elements")
            .with_description("Elements held by each ipset-style set.")
            .with_callback(move |obs| {
                for s in sets.summaries() {
                    obs.observe(s.entries as u64, &[KeyValue::new("set", s.name)]);
                }
            })
            .build();
        self.inner
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(gauge));
        Ok(())
    }

    /// Registers `vallum_store_writes_total` and `vallum_store_fsyncs_total`, read at scrape
    /// from `stats` (the store's committed write transactions and the fsyncs of its WAL, see
    /// `Store::written` and `Store::fsyncs`): writes per fsync is how many callers shared
    /// one (group commit, `--sync`).
    pub fn observe_store(&self, stats: impl Fn() -> (u64, u64) + Send + Sync + 'static) {
        let stats = Arc::new(stats);
        let writes_cb = stats.clone();
        let writes = self
            .inner
            .meter
            .u64_observable_counter("vallum_store_writes")
            .with_description("Write transactions the store committed (to its WAL).")
            .with_callback(move |obs| obs.observe(writes_cb().0, &[]))
            .build();
        let fsyncs = self
            .inner
            .meter
            .u64_observable_counter("vallum_store_fsyncs")
            .with_description(
                "fsyncs of the store's WAL (one per group of waiting writes; none for \
                 --sync normal writes until a full one, a checkpoint or shutdown).",
            )
            .with_callback(move |obs| obs.observe(stats().1, &[]))
            .build();
        let mut observers = self
            .inner
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        observers.push(Box::new(writes));
        observers.push(Box::new(fsyncs));
    }

    /// A tower layer that records `rpc.server.call.duration` (and the deprecated
    /// `rpc.server.duration`) for every call and opens its span ([`traces`]); put it
    /// outermost in the tonic `Server` builder so refused calls (auth, limits) are measured
    /// and traced too.
    pub fn grpc_layer(&self, clock: crate::clock::Clock) -> GrpcMetricsLayer {
        GrpcMetricsLayer {
            histograms: RpcHistograms {
                call_duration: self.inner.rpc_call_duration.clone(),
                deprecated_duration: self.inner.rpc_duration.clone(),
                clock,
            },
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of every instrument and the barrier
    /// histogram, collected now. Fails only after [`Metrics::shutdown`].
    pub fn render(&self) -> Result<String, MetricsError> {
        let mut rm = ResourceMetrics::default();
        self.inner
            .reader
            .collect(&mut rm)
            .map_err(|e| MetricsError::Exporter(e.to_string()))?;
        let mut families = exposition::from_otel(&rm);
        if let Some(engine) = self.inner.engine.get() {
            families.push(barrier_family(engine));
        }
        Ok(exposition::render(families))
    }

    /// The metric reference (docs/metrics.md): every family collected now, with its type,
    /// unit, label names and help, as a Markdown table (module `reference`). Fails only after
    /// [`Metrics::shutdown`].
    pub fn reference(&self) -> Result<String, MetricsError> {
        let mut rm = ResourceMetrics::default();
        self.inner
            .reader
            .collect(&mut rm)
            .map_err(|e| MetricsError::Exporter(e.to_string()))?;
        let extra = match self.inner.engine.get() {
            Some(engine) => vec![(barrier_family(engine), "s")],
            None => Vec::new(),
        };
        Ok(reference::render(&rm, extra))
    }

    /// Makes `/readyz` answer from `reporter`'s overall status (service `""`), the one
    /// `grpc.health.v1` serves. Only the first call takes effect.
    pub fn observe_health(&self, reporter: tonic_health::server::HealthReporter) {
        let _ = self.inner.health.set(Arc::new(
            tonic_health::server::HealthService::from_health_reporter(reporter),
        ));
    }

    /// Whether the overall gRPC health (service `""`) is SERVING, with its status name; false
    /// ("UNKNOWN") before [`Metrics::observe_health`].
    pub async fn serving(&self) -> (bool, &'static str) {
        use tonic_health::pb::health_check_response::ServingStatus as S;
        use tonic_health::pb::health_server::Health;
        let Some(h) = self.inner.health.get() else {
            return (false, "UNKNOWN");
        };
        let req = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        match h.check(req).await.map(|r| r.into_inner().status()) {
            Ok(S::Serving) => (true, "SERVING"),
            Ok(S::NotServing) => (false, "NOT_SERVING"),
            Ok(S::ServiceUnknown) => (false, "SERVICE_UNKNOWN"),
            Ok(S::Unknown) | Err(_) => (false, "UNKNOWN"),
        }
    }

    /// Binds `addr` and serves `GET /metrics` until `shutdown` resolves. Returns once bound;
    /// the server runs on a spawned task (needs a tokio runtime).
    ///
    /// Also the plaintext health endpoints for probes that cannot speak TLS gRPC (Kubernetes'
    /// `grpc` probes are plaintext only): `GET /readyz` is 200 `SERVING` while the overall
    /// `grpc.health.v1` status is SERVING, else 503 with the status name; `GET /livez` is 200
    /// `ok` while the process answers.
    pub async fn serve<F>(
        &self,
        addr: SocketAddr,
        shutdown: F,
    ) -> Result<MetricsServer, MetricsError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| MetricsError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| MetricsError::Bind { addr, source })?;
        let this = self.clone();
        let health = self.clone();
        let app = axum::Router::new()
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let health = health.clone();
                    async move {
                        let (ok, name) = health.serving().await;
                        let code = if ok {
                            http::StatusCode::OK
                        } else {
                            http::StatusCode::SERVICE_UNAVAILABLE
                        };
                        (code, [(http::header::CONTENT_TYPE, "text/plain")], name)
                    }
                }),
            )
            .route("/livez", axum::routing::get(|| async { "ok" }))
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let this = this.clone();
                    async move {
                        match this.render() {
                            Ok(body) => (
                                http::StatusCode::OK,
                                [(http::header::CONTENT_TYPE, exposition::CONTENT_TYPE)],
                                body,
                            ),
                            Err(e) => (
                                http::StatusCode::INTERNAL_SERVER_ERROR,
                                [(http::header::CONTENT_TYPE, "text/plain")],
                                e.to_string(),
                            ),
                        }
                    }
                }),
            );
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        });
        Ok(MetricsServer { local_addr, task })
    }

    /// Flushes and stops the exporters (OTLP's last push).
    pub fn shutdown(&self) -> Result<(), MetricsError> {
        self.inner
            .provider
            .shutdown()
            .map_err(|e| MetricsError::Exporter(e.to_string()))
    }
}

#[cfg(feature = "otlp")]
fn with_otlp(
    builder: opentelemetry_sdk::metrics::MeterProviderBuilder,
    endpoint: Option<&str>,
) -> Result<opentelemetry_sdk::metrics::MeterProviderBuilder, MetricsError> {
    use opentelemetry_otlp::{MetricExporter, WithExportConfig};
    let Some(endpoint) = endpoint else {
        return Ok(builder);
    };
    let exporter = MetricExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| MetricsError::Exporter(e.to_string()))?;
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
        .with_interval(std::time::Duration::from_secs(60))
        .build();
    Ok(builder.with_reader(reader))
}

#[cfg(not(feature = "otlp"))]
fn with_otlp(
    builder: opentelemetry_sdk::metrics::MeterProviderBuilder,
    endpoint: Option<&str>,
) -> Result<opentelemetry_sdk::metrics::MeterProviderBuilder, MetricsError> {
    match endpoint {
        None => Ok(builder),
        Some(_) => Err(MetricsError::OtlpDisabled),
    }
}

fn family_name(f: vallum_engine::model::Family) -> &'static str {
    match f {
        vallum_engine::model::Family::Ipv4 => "ipv4",
        vallum_engine::model::Family::Ipv6 => "ipv6",
    }
}

/// The running `/metrics` listener.
#[derive(Debug)]
pub struct MetricsServer {
    /// The bound address (useful with port 0).
    pub local_addr: SocketAddr,
    /// The server task; ends after the shutdown future resolved.
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
}

// === impl PullReader ===

/// The reader `/metrics` collects from: the SDK's [`ManualReader`], shared between the meter
/// provider (which owns a registered reader) and [`Metrics::render`]. Cumulative temporality,
/// as Prometheus expects.
#[derive(Clone, Debug)]
struct PullReader(Arc<ManualReader>);

impl MetricReader for PullReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, _kind: InstrumentKind) -> Temporality {
        Temporality::Cumulative
    }
}

// === the barrier histogram ===

const BARRIER_HELP: &str =
    "Sampled barrier cost per packet (1 batch in 1024 per core, batch time / batch size).";

/// `vallum_packet_barrier_seconds{strategy}`, read from the engine's histogram now.
fn barrier_family(engine: &Engine) -> Family {
    let h = engine.barrier_histogram();
    let mut buckets = Vec::new();
    let mut engine_buckets = h.buckets().peekable();
    let mut cumulative = 0u64;
    for e in BARRIER_MIN_EXP..=BARRIER_MAX_EXP {
        let bound_ps = 1u64 << e;
        // Engine buckets are [lo, hi) with hi a power of two at these bounds; a bucket
        // whose exclusive upper bound is <= 2^e holds only values < 2^e.
        while let Some((_, count)) = engine_buckets.next_if(|(hi, _)| *hi <= bound_ps) {
            cumulative += count;
        }
        buckets.push((EngineHistogram::ps_to_seconds(bound_ps), cumulative));
    }
    Family {
        name: "vallum_packet_barrier_seconds".to_owned(),
        help: BARRIER_HELP.to_owned(),
        kind: Kind::Histogram,
        series: vec![Series {
            labels: vec![("strategy".to_owned(), engine.barrier().as_str().to_owned())],
            value: Value::Histogram {
                buckets,
                sum: Number::F64(EngineHistogram::ps_to_seconds(h.sum_ps())),
                count: h.count(),
            },
        }],
    }
}

#[cfg(test)]
mod tests;
