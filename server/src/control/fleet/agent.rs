//! The node agent: keeps the local pipeline enforcing the fleet rulesets whose selector
//! matches this node's labels, reports ACK/NACK per (node, ruleset), and keeps the node key
//! alive on an etcd lease.
//!
//! Sync: list `{prefix}rulesets/` at revision R (and this node's own reports), reconcile,
//! then watch from R+1. Every event is handled idempotently and the last revision seen only
//! moves past an event once it is handled and reported, so after a disconnect the watch
//! resumes from that revision and re-delivers anything half done. When etcd answers that the
//! revision was compacted, the agent lists again and reconciles (`vallum_fleet_watch_restarts
//! _total{reason="compacted"}`).
//!
//! Reconcile of one ruleset: a selected ruleset whose fleet revision this node does not
//! enforce yet (neither that revision nor one the value lists as the same content,
//! [`Desired::same_content_as`]) is checked and committed through the same local pipeline as Apply
//! (`super::check`, as Apply checks, then [`Pipeline::apply`], author [`FLEET_AUTHOR`], message
//! `fleet revision N: ...`, an audit row `FleetApply`), then reported ACK with the local
//! revision and the latency write -> publish, or NACK with the error (the node keeps what it
//! enforced before). A ruleset no longer selected, or deleted, is removed locally and its
//! report deleted.
//!
//! Fail-static: nothing here runs before the stored state is loaded, and nothing local
//! changes while etcd is unreachable; `vallum_fleet_connected` says 0 and the agent retries
//! with a backoff of 0.1 s doubling to 5 s. Latency uses the writer's and the node's wall
//! clocks (keep them in sync, e.g. NTP).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue as Attr;
use opentelemetry::metrics::{Counter, Histogram};
use sha2::{Digest, Sha256};
use vallum_proto::etcdserverpb::event::EventType;

use super::etcd::{Etcd, EtcdError, EtcdResult, KeyValue, Read};
use super::{Ack, Desired, FLEET_AUTHOR, Keys, Labels, NodeInfo, NodeReport, Owners, ReportPhases};
use crate::clock::Clock;
use crate::control::pipeline::Pipeline;
use crate::control::store::AuditEntry;
use crate::error::Error;
use crate::telemetry::metrics::Metrics;

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Buckets of `vallum_fleet_programming_latency_seconds`.
const LATENCY_BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

// === impl FleetStats ===

/// The agent's metrics: `vallum_fleet_connected`, `vallum_fleet_revision`,
/// `vallum_fleet_applies_total{outcome, ruleset}`, `vallum_fleet_watch_restarts_total{reason}`,
/// `vallum_fleet_programming_latency_seconds`, and the registration's health:
/// `vallum_fleet_registered`, `vallum_fleet_lease_ttl_seconds`,
/// `vallum_fleet_last_keepalive_timestamp_seconds`.
#[derive(Debug)]
pub struct FleetStats {
    connected: Arc<AtomicBool>,
    revision: Arc<AtomicI64>,
    /// Unix ms when the node's lease runs out unless renewed (0: no lease).
    lease_until_ms: Arc<AtomicI64>,
    /// Unix ms of the last grant or keep-alive etcd answered with a live lease (0: none).
    renewed_ms: Arc<AtomicI64>,
    applies: Counter<u64>,
    restarts: Counter<u64>,
    latency: Histogram<f64>,
    /// The wall clock of the lease times, the reports and the agent's audit rows.
    clock: Clock,
}

impl FleetStats {
    /// Registers the instruments on `metrics`; lease times are read on `clock` (the agent
    /// that records into these reads it too).
    pub fn new(metrics: &Metrics, clock: Clock) -> Arc<FleetStats> {
        let meter = metrics.meter();
        let connected = Arc::new(AtomicBool::new(false));
        let revision = Arc::new(AtomicI64::new(0));
        let c = connected.clone();
        let gauge = meter
            .u64_observable_gauge("vallum_fleet_connected")
            .with_description("1 while the fleet agent's last etcd call succeeded, else 0.")
            // Relaxed: a monitoring read of one flag, ordered with nothing else.
            .with_callback(move |o| o.observe(u64::from(c.load(Ordering::Relaxed)), &[]))
            .build();
        metrics.keep(Box::new(gauge));
        let r = revision.clone();
        let gauge = meter
            .i64_observable_gauge("vallum_fleet_revision")
            .with_description("The last etcd revision the fleet agent handled.")
            // Relaxed: as above.
            .with_callback(move |o| o.observe(r.load(Ordering::Relaxed), &[]))
            .build();
        metrics.keep(Box::new(gauge));
        let lease_until_ms = Arc::new(AtomicI64::new(0));
        let renewed_ms = Arc::new(AtomicI64::new(0));
        let (until, now) = (lease_until_ms.clone(), clock.clone());
        let gauge = meter
            .u64_observable_gauge("vallum_fleet_registered")
            .with_description(
                "1 while this node's key is on a live etcd lease as far as the node knows (the last TTL etcd granted has not run out), else 0.",
            )
            // Relaxed: a monitoring read of one value, ordered with nothing else.
            .with_callback(move |o| {
                let left = until.load(Ordering::Relaxed) - now.unix_ns() / 1_000_000;
                o.observe(u64::from(left > 0), &[]);
            })
            .build();
        metrics.keep(Box::new(gauge));
        let (until, now) = (lease_until_ms.clone(), clock.clone());
        let gauge = meter
            .f64_observable_gauge("vallum_fleet_lease_ttl")
            .with_unit("s")
            .with_description(
                "Seconds left on this node's etcd lease: the TTL etcd granted at the last keep-alive, counted down (0: expired or none).",
            )
            // Relaxed: as above.
            .with_callback(move |o| {
                let left = until.load(Ordering::Relaxed) - now.unix_ns() / 1_000_000;
                o.observe(left.max(0) as f64 / 1e3, &[]);
            })
            .build();
        metrics.keep(Box::new(gauge));
        let renewed = renewed_ms.clone();
        let gauge = meter
            .f64_observable_gauge("vallum_fleet_last_keepalive_timestamp")
            .with_unit("s")
            .with_description(
                "Unix time of the last lease grant or keep-alive that etcd answered with a live lease (0: none yet).",
            )
            // Relaxed: as above.
            .with_callback(move |o| o.observe(renewed.load(Ordering::Relaxed) as f64 / 1e3, &[]))
            .build();
        metrics.keep(Box::new(gauge));
        Arc::new(FleetStats {
            connected,
            revision,
            lease_until_ms,
            renewed_ms,
            clock,
            applies: meter
                .u64_counter("vallum_fleet_applies")
                // `ruleset` is bounded: fleet rulesets are few (each is an etcd key that
                // every selected node enforces), unlike nodes or revisions.
                .with_description(
                    "Fleet rulesets handled by this node, by outcome (ack, nack, removed) and ruleset.",
                )
                .build(),
            restarts: meter
                .u64_counter("vallum_fleet_watch_restarts")
                .with_description("Watch restarts by reason (disconnected, compacted).")
                .build(),
            latency: meter
                .f64_histogram("vallum_fleet_programming_latency")
                .with_unit("s")
                .with_description("Fleet write time to local publish of a fleet ruleset.")
                .with_boundaries(LATENCY_BOUNDS.to_vec())
                .build(),
        })
    }

    /// Whether the last etcd call succeeded.
    pub fn connected(&self) -> bool {
        // Relaxed: a status read of one flag.
        self.connected.load(Ordering::Relaxed)
    }

    fn set_connected(&self, up: bool) {
        // Relaxed: see `connected`.
        self.connected.store(up, Ordering::Relaxed);
    }

    /// Whether this node's key is on a live lease, as far as it knows (the last TTL etcd
    /// granted has not run out).
    pub fn registered(&self) -> bool {
        // Relaxed: a status read of one value.
        self.lease_until_ms.load(Ordering::Relaxed) > self.clock.unix_ns() / 1_000_000
    }

    /// etcd granted or renewed the lease for `ttl` seconds, now.
    fn lease_renewed(&self, ttl: i64) {
        let now_ms = self.clock.unix_ns() / 1_000_000;
        // Relaxed: monitoring values, each read on its own.
        self.lease_until_ms
            .store(now_ms + ttl.max(0) * 1000, Ordering::Relaxed);
        self.renewed_ms.store(now_ms, Ordering::Relaxed);
    }

    /// The lease is gone (or ran out unrenewed).
    fn lease_lost(&self) {
        // Relaxed: as in `lease_renewed`.
        self.lease_until_ms.store(0, Ordering::Relaxed);
    }

    /// One zero measurement on each instrument, so that the metric reference (a test in
    /// crate::telemetry::metrics) lists them.
    #[cfg(test)]
    pub(crate) fn record_each_once(&self) {
        self.applies.add(0, &applied_attrs("ack", "web"));
        self.restarts.add(0, &[Attr::new("reason", "compacted")]);
        self.latency.record(0.0, &[]);
    }
}

// === Local ===

/// A local commit of a fleet ruleset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Applied {
    /// The local revision made active.
    pub local_revision: u64,
    /// Its phases.
    pub phases: ReportPhases,
}

/// The node-local side of the agent: in vallumd, the commit pipeline ([`PipelineLocal`]); the
/// fleet scale bench (`benches/fleet.rs`) runs the same agent over a lighter one.
#[tonic::async_trait]
pub trait Local: Send + Sync + std::fmt::Debug + 'static {
    /// Whether a ruleset of this name is active locally, and its local revision.
    fn active(&self, name: &str) -> Option<u64>;

    /// A number that changes when something local that a NACK may depend on changes (the
    /// set names, the active rulesets); the agent retries its NACKed rulesets
    /// when it does.
    fn generation(&self) -> u64 {
        0
    }

    /// Checks and commits `d` as ruleset `name` at fleet revision `rev` (`value`: the etcd
    /// value, for the audit record).
    ///
    /// Errors: as Apply's.
    async fn apply(
        &self,
        name: &str,
        rev: i64,
        d: &Desired,
        value: &[u8],
    ) -> Result<Applied, Error>;

    /// Deactivates and deletes ruleset `name`.
    ///
    /// Errors: as DeleteRuleset's.
    async fn remove(&self, name: &str) -> Result<(), Error>;
}

/// [`Local`] over vallumd's pipeline: the same check and commit as Apply.
#[derive(Debug)]
pub struct PipelineLocal(pub Arc<Pipeline>);

#[tonic::async_trait]
impl Local for PipelineLocal {
    fn active(&self, name: &str) -> Option<u64> {
        self.0.active().get(name).map(|a| a.revision)
    }

    fn generation(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        // A NACK's local causes: a set missing (or present), a local ruleset of the same
        // name. Not a set's type (a type change is a destroy and a create, seen here only
        // when the name comes and goes between two looks).
        self.0.sets().names().hash(&mut h);
        self.0.active().hash(&mut h);
        h.finish()
    }

    async fn apply(
        &self,
        name: &str,
        rev: i64,
        d: &Desired,
        value: &[u8],
    ) -> Result<Applied, Error> {
        let started = self.0.clock().now_ns();
        let checked = super::check(&self.0, name, d.priority, d.input(name, rev)).await?;
        let checking = self.0.clock().now_ns().saturating_sub(started);
        let digest: String = Sha256::digest(value)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut audit = Some(AuditEntry {
            caller: format!("fleet revision {rev} ({})", d.author),
            method: "FleetApply".to_string(),
            request_digest: digest,
            outcome: "OK".to_string(),
        });
        let result = self
            .0
            .apply(
                checked,
                FLEET_AUTHOR,
                &super::revision_message(rev, &d.message),
                None,
                None,
                &mut audit,
            )
            .await;
        if let Some(mut entry) = audit {
            // Not written inside the commit transaction: the commit failed before it.
            if let Err(e) = &result {
                entry.outcome = e.reason().info().name.to_string();
            }
            if let Err(e) = self.0.store().audit(entry).await {
                tracing::error!(error = %e, "fleet: audit write failed");
            }
        }
        let r = result?;
        Ok(Applied {
            local_revision: r.revision.number,
            phases: ReportPhases::new(&r.phases, checking),
        })
    }

    async fn remove(&self, name: &str) -> Result<(), Error> {
        self.0.delete(name, None).await
    }
}

// === impl Agent ===

/// One node's agent.
#[derive(Debug)]
pub struct Agent {
    etcd: Etcd,
    local: Arc<dyn Local>,
    owners: Arc<Owners>,
    keys: Keys,
    node: String,
    labels: Labels,
    lease_ttl: Duration,
    stats: Arc<FleetStats>,
    /// The rulesets this node has a report key for.
    reported: Mutex<BTreeMap<String, NodeReport>>,
    /// The NACKed rulesets: their fleet key and the [`Local::generation`] at the NACK.
    nacked: Mutex<BTreeMap<String, (KeyValue, u64)>>,
}

/// How often the agent compares [`Local::generation`] with the one of its NACKs.
const RETRY_EVERY: Duration = Duration::from_millis(500);

impl Agent {
    /// An agent for `node` with `labels`, committing through `local`.
    #[allow(clippy::too_many_arguments)] // One call site (server wiring); each is distinct.
    pub fn new(
        etcd: Etcd,
        local: Arc<dyn Local>,
        owners: Arc<Owners>,
        keys: Keys,
        node: String,
        labels: Labels,
        lease_ttl: Duration,
        stats: Arc<FleetStats>,
    ) -> Arc<Agent> {
        Arc::new(Agent {
            etcd,
            local,
            owners,
            keys,
            node,
            labels,
            lease_ttl,
            stats,
            reported: Mutex::new(BTreeMap::new()),
            nacked: Mutex::new(BTreeMap::new()),
        })
    }

    /// Runs the sync loop and the heartbeat until aborted.
    pub fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::join!(self.heartbeat(), self.sync());
        })
    }

    async fn sync(&self) {
        let mut last = 0i64;
        let mut need_list = true;
        let mut backoff = BACKOFF_MIN;
        loop {
            if need_list {
                match self.list_and_reconcile().await {
                    Ok(rev) => {
                        last = rev;
                        need_list = false;
                        backoff = BACKOFF_MIN;
                        self.stats.set_connected(true);
                        // Relaxed: a monitoring value.
                        self.stats.revision.store(last, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.stats.set_connected(false);
                        tracing::warn!(error = %e, retry_in = ?backoff, "fleet: list failed");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                        continue;
                    }
                }
            }
            let err = self.watch_from(&mut last, &mut backoff).await;
            let reason = match err {
                EtcdError::Compacted(_) => {
                    need_list = true;
                    "compacted"
                }
                _ => {
                    self.stats.set_connected(false);
                    tracing::warn!(
                        error = %err,
                        resume_from = last + 1,
                        retry_in = ?backoff,
                        "fleet: watch failed"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    "disconnected"
                }
            };
            self.stats.restarts.add(1, &[Attr::new("reason", reason)]);
        }
    }

    /// Lists the rulesets and this node's reports on them, reconciles; returns the revision
    /// read. Two requests: the rulesets and this node's reports of the first layout in one
    /// Txn (one linearizable read), then its reports on those rulesets at that revision.
    async fn list_and_reconcile(&self) -> EtcdResult<i64> {
        let (rev, mut read) = self
            .etcd
            .read_many(&[
                Read::prefix(&self.keys.rulesets(), 0),
                Read::prefix(&self.keys.legacy_statuses_of(&self.node), 0),
            ])
            .await?;
        let legacy = read.pop().map(|r| r.kvs).unwrap_or_default();
        let kvs = read.pop().map(|r| r.kvs).unwrap_or_default();
        let named: Vec<(String, &KeyValue)> = kvs
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(&kv.key);
                Some((self.keys.ruleset_name(&key)?.to_string(), kv))
            })
            .collect();
        let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
        self.load_reports(&names, rev, legacy).await?;
        for (name, kv) in &named {
            self.desired(name, kv).await?;
        }
        let stale: Vec<String> = self
            .owners
            .all()
            .into_keys()
            .chain(lock(&self.reported).keys().cloned())
            .filter(|n| !names.contains(n))
            .collect();
        for name in stale {
            self.removed(&name).await?;
        }
        Ok(rev)
    }

    /// Reads this node's reports on the rulesets `names` at `revision` (one Txn of point
    /// reads per [`super::etcd::TXN_OPS`]) into `reported`. Its reports of the first layout
    /// (`status/{node}/{name}`, read at `revision`: `legacy`) are moved: copied to
    /// `reports/{name}/{node}` where that key is absent (for listed rulesets), then
    /// `status/{node}/` is deleted.
    async fn load_reports(
        &self,
        names: &[String],
        revision: i64,
        legacy: Vec<KeyValue>,
    ) -> EtcdResult<()> {
        let keys: Vec<String> = names
            .iter()
            .map(|n| self.keys.report(n, &self.node))
            .collect();
        let found = self.etcd.get_many_at(&keys, revision).await?;
        let mut reported = BTreeMap::new();
        for (name, kv) in names.iter().zip(found) {
            if let Some(r) = kv.and_then(|kv| serde_json::from_slice::<NodeReport>(&kv.value).ok())
            {
                reported.insert(name.clone(), r);
            }
        }
        if !legacy.is_empty() {
            let legacy_prefix = self.keys.legacy_statuses_of(&self.node);
            for kv in &legacy {
                let key = String::from_utf8_lossy(&kv.key);
                let Some((_, name)) = self.keys.legacy_status_parts(&key) else {
                    continue;
                };
                if reported.contains_key(name) || !names.iter().any(|n| n == name) {
                    continue;
                }
                let Ok(r) = serde_json::from_slice::<NodeReport>(&kv.value) else {
                    continue;
                };
                self.etcd
                    .put(&self.keys.report(name, &self.node), kv.value.clone(), 0)
                    .await?;
                reported.insert(name.to_string(), r);
            }
            self.etcd.delete_prefix(&legacy_prefix).await?;
            tracing::info!(
                reports = legacy.len(),
                "fleet: moved this node's reports to the reports/{{ruleset}}/{{node}} keys"
            );
        }
        *lock(&self.reported) = reported;
        Ok(())
    }

    /// Watches from `last + 1`, handling events, until an error (which it returns).
    async fn watch_from(&self, last: &mut i64, backoff: &mut Duration) -> EtcdError {
        let mut w = match self
            .etcd
            .watch_prefix(&self.keys.rulesets(), *last + 1)
            .await
        {
            Ok(w) => w,
            Err(e) => return e,
        };
        self.stats.set_connected(true);
        *backoff = BACKOFF_MIN;
        let mut retry = tokio::time::interval(RETRY_EVERY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let nacks = !lock(&self.nacked).is_empty();
            let r = tokio::select! {
                // `Watcher::next` is cancel-safe: its state lives in the stream.
                r = w.next() => r,
                _ = retry.tick(), if nacks => {
                    if let Err(e) = self.retry_nacks().await {
                        return e;
                    }
                    continue;
                }
            };
            let r = match r {
                Ok(r) => r,
                Err(e) => return e,
            };
            if r.events.is_empty() {
                // A progress notification: every event up to this revision was sent.
                if let Some(h) = &r.header {
                    *last = (*last).max(h.revision);
                }
            }
            for ev in r.events {
                let Some(kv) = ev.kv else { continue };
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                if let Some(name) = self.keys.ruleset_name(&key) {
                    let done = if ev.r#type == EventType::Delete as i32 {
                        self.removed(name).await
                    } else {
                        self.desired(name, &kv).await
                    };
                    if let Err(e) = done {
                        return e;
                    }
                }
                *last = (*last).max(kv.mod_revision);
            }
            // Relaxed: a monitoring value.
            self.stats.revision.store(*last, Ordering::Relaxed);
        }
    }

    /// Retries the NACKed rulesets whose local cause may have changed (the
    /// [`Local::generation`] moved since their NACK).
    async fn retry_nacks(&self) -> EtcdResult<()> {
        let now = self.local.generation();
        let due: Vec<(String, KeyValue)> = lock(&self.nacked)
            .iter()
            .filter(|(_, (_, g))| *g != now)
            .map(|(n, (kv, _))| (n.clone(), kv.clone()))
            .collect();
        for (name, kv) in due {
            self.desired(&name, &kv).await?;
        }
        Ok(())
    }

    /// Reconciles ruleset `name` with its fleet key `kv`.
    async fn desired(&self, name: &str, kv: &KeyValue) -> EtcdResult<()> {
        lock(&self.nacked).remove(name);
        let generation = self.local.generation();
        let key_rev = kv.mod_revision;
        let d: Desired = match serde_json::from_slice(&kv.value) {
            Ok(d) => d,
            Err(e) => {
                return self
                    .report(
                        name,
                        nack(
                            key_rev,
                            format!("not a fleet ruleset value: {e}"),
                            self.stats.clock.unix_ns(),
                        ),
                    )
                    .await;
            }
        };
        let (rev, d) = match d.target(key_rev, &self.labels) {
            Ok(Some(t)) => t,
            Ok(None) => return self.removed(name).await,
            Err(e) => {
                return self
                    .report(name, nack(key_rev, e, self.stats.clock.unix_ns()))
                    .await;
            }
        };
        let active = self.local.active(name);
        if self
            .owners
            .get(name)
            .is_some_and(|enforced| d.enforced_by(enforced, rev))
        {
            // Enforced already (e.g. before a restart, an event re-delivered, a canary
            // phase this node is outside of, or the full write after a canary phase this
            // node was in: the same content at a later revision).
            return self
                .report(
                    name,
                    ack(
                        rev,
                        active.unwrap_or(0),
                        0.0,
                        None,
                        self.stats.clock.unix_ns(),
                    ),
                )
                .await;
        }
        let outcome = if self.owners.get(name).is_none() && active.is_some() {
            Err(format!(
                "a local ruleset {name} exists that the fleet does not own; delete it on this node first"
            ))
        } else {
            self.local
                .apply(name, rev, d, &kv.value)
                .await
                .map_err(|e| describe(&e))
        };
        match outcome {
            Ok(applied) => {
                self.owners.set(name, rev);
                let latency = ((self.stats.clock.unix_ns() - d.write_time_ns).max(0) as f64) / 1e9;
                self.stats.latency.record(latency, &[]);
                self.stats.applies.add(1, &applied_attrs("ack", name));
                let r = ack(
                    rev,
                    applied.local_revision,
                    latency,
                    Some(applied.phases),
                    self.stats.clock.unix_ns(),
                );
                self.report(name, r).await
            }
            Err(error) => {
                // Counted once per fleet revision: a retry that NACKs again is the same NACK.
                let again = lock(&self.reported)
                    .get(name)
                    .is_some_and(|r| r.fleet_revision == rev && r.result == Ack::Nack);
                if !again {
                    self.stats.applies.add(1, &applied_attrs("nack", name));
                }
                lock(&self.nacked).insert(name.to_string(), (kv.clone(), generation));
                self.report(name, nack(rev, error, self.stats.clock.unix_ns()))
                    .await
            }
        }
    }

    /// Removes ruleset `name` from this node (when the fleet owns it) and its report.
    async fn removed(&self, name: &str) -> EtcdResult<()> {
        lock(&self.nacked).remove(name);
        if self.owners.get(name).is_some() {
            match self.local.remove(name).await {
                Ok(()) | Err(Error::NotFound { .. }) => {
                    self.owners.remove(name);
                    self.stats.applies.add(1, &applied_attrs("removed", name));
                }
                Err(e) => tracing::error!(ruleset = %name, error = %e, "fleet: removing failed"),
            }
        }
        if lock(&self.reported).contains_key(name) {
            self.etcd
                .delete(&self.keys.report(name, &self.node))
                .await?;
            lock(&self.reported).remove(name);
        }
        Ok(())
    }

    /// Writes this node's report for `name`, unless the same result is reported already.
    async fn report(&self, name: &str, r: NodeReport) -> EtcdResult<()> {
        if let Some(old) = lock(&self.reported).get(name) {
            if old.fleet_revision == r.fleet_revision && old.result == r.result {
                return Ok(());
            }
        }
        let value = serde_json::to_vec(&r).unwrap_or_default();
        self.etcd
            .put(&self.keys.report(name, &self.node), value, 0)
            .await?;
        lock(&self.reported).insert(name.to_string(), r);
        Ok(())
    }

    /// Registers the node key (labels, version) on a lease and keeps the lease alive, for
    /// as long as the agent runs:
    ///
    /// - a keep-alive every third of the TTL, each interval drawn from 75-100% of it (and
    ///   the first after a registration from 0-100%), so that nodes started together spread
    ///   their keep-alives instead of sending them as one burst per period;
    /// - a keep-alive that fails or gets no answer within the interval (or the call
    ///   timeout) is retried on a new stream (the next endpoint) on the same lease, while
    ///   the lease lasts as far as this node knows (the last TTL etcd granted, counted from
    ///   the request that got it);
    /// - when etcd answers that the lease is gone (TTL 0: it expired during a partition or a
    ///   hung etcd, was revoked, or etcd was restored from a snapshot without it), or the
    ///   lease ran out without an answer, the node registers again: a new lease and its node
    ///   key with its labels. Each of these is logged (warn), and [`FleetStats`] exports the
    ///   state (`vallum_fleet_registered`, `vallum_fleet_lease_ttl_seconds`,
    ///   `vallum_fleet_last_keepalive_timestamp_seconds`).
    async fn heartbeat(&self) {
        let every = self.lease_ttl / 3;
        // One answer may take at most the interval: a keep-alive that waits longer leaves
        // too little of the lease for the retry.
        let etcd = self
            .etcd
            .clone()
            .call_timeout(self.etcd.timeout().min(every));
        let mut lease: Option<Lease> = None;
        let mut backoff = BACKOFF_MIN;
        loop {
            let (id, fresh) = match lease {
                // tokio's clock (lease timers against etcd), not `crate::clock`: see etcd.rs.
                Some(l) if tokio::time::Instant::now() < l.expires => (l.id, false),
                _ => {
                    if let Some(l) = lease.take() {
                        self.stats.lease_lost();
                        tracing::warn!(
                            lease = %format!("{:x}", l.id),
                            "fleet: the lease ran out without a keep-alive answer; registering again"
                        );
                    }
                    match self.register(&etcd).await {
                        Ok(l) => {
                            tracing::info!(
                                node = %self.node,
                                lease = %format!("{:x}", l.id),
                                ttl_s = l.ttl,
                                "fleet: registered"
                            );
                            backoff = BACKOFF_MIN;
                            lease = Some(l);
                            (l.id, true)
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, retry_in = ?backoff, "fleet: registering failed");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(every);
                            continue;
                        }
                    }
                }
            };
            match self.keep(&etcd, id, fresh, every, &mut lease).await {
                Ok(()) => {
                    self.stats.lease_lost();
                    tracing::warn!(
                        lease = %format!("{id:x}"),
                        "fleet: etcd says the lease is gone (expired, revoked, or etcd restored \
                         from a snapshot); registering again with this node's labels"
                    );
                    lease = None;
                }
                Err(e) => {
                    tracing::warn!(
                        lease = %format!("{id:x}"),
                        error = %e,
                        retry_in = ?backoff,
                        "fleet: keep-alive failed; retrying on the same lease while it lasts"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(every);
                }
            }
        }
    }

    /// A new lease of `--fleet-lease-ttl` and the node key on it.
    async fn register(&self, etcd: &Etcd) -> EtcdResult<Lease> {
        // tokio's clock (lease timers against etcd), not `crate::clock`: see etcd.rs.
        let asked = tokio::time::Instant::now();
        let (id, ttl) = etcd.lease_grant(self.lease_ttl.as_secs() as i64).await?;
        let info = NodeInfo {
            labels: self.labels.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            heartbeat_ns: self.stats.clock.unix_ns(),
        };
        let value = serde_json::to_vec(&info).unwrap_or_default();
        etcd.put(&self.keys.node(&self.node), value, id).await?;
        let l = Lease {
            id,
            ttl,
            expires: asked + Duration::from_secs(ttl.max(0) as u64),
        };
        self.stats.lease_renewed(ttl);
        Ok(l)
    }

    /// Keeps lease `id` alive every `every` (jittered) until etcd says it is gone (`Ok`) or
    /// a keep-alive fails (the error); each answer moves `lease`'s expiry. After a fresh
    /// registration the first keep-alive waits a random share of `every`; a retry sends it
    /// at once.
    async fn keep(
        &self,
        etcd: &Etcd,
        id: i64,
        fresh: bool,
        every: Duration,
        lease: &mut Option<Lease>,
    ) -> EtcdResult<()> {
        if fresh {
            tokio::time::sleep(jitter(every, 0.0)).await;
        }
        let mut keeper: Option<super::etcd::LeaseKeeper> = None;
        loop {
            // tokio's clock (lease timers against etcd), not `crate::clock`: see etcd.rs.
            let asked = tokio::time::Instant::now();
            let ttl = match keeper.as_mut() {
                Some(k) => k.renew().await?,
                None => {
                    let (k, ttl) = etcd.keep_alive(id).await?;
                    keeper = Some(k);
                    ttl
                }
            };
            if ttl == 0 {
                return Ok(());
            }
            if let Some(l) = lease.as_mut() {
                l.ttl = ttl;
                l.expires = asked + Duration::from_secs(ttl as u64);
            }
            self.stats.lease_renewed(ttl);
            tokio::time::sleep(jitter(every, 0.75)).await;
        }
    }
}

/// This node's lease, as far as it knows.
#[derive(Clone, Copy, Debug)]
struct Lease {
    id: i64,
    /// The TTL etcd granted last, seconds.
    ttl: i64,
    /// When it runs out unless renewed: the TTL counted from the request that got it.
    expires: tokio::time::Instant,
}

/// A random duration in [`low` x `d`, `d`): the keep-alive interval's jitter.
fn jitter(d: Duration, low: f64) -> Duration {
    use std::hash::BuildHasher;
    // A randomly keyed hasher (std's RandomState) hashing nothing: a random u64 per call,
    // no dependency for a number that needs no quality beyond "not the same on every node".
    let r = std::collections::hash_map::RandomState::new().hash_one(());
    let share = low + (1.0 - low) * (r as f64 / u64::MAX as f64);
    d.mul_f64(share.clamp(0.0, 1.0))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The attributes of `vallum_fleet_applies_total`.
fn applied_attrs(outcome: &'static str, ruleset: &str) -> [Attr; 2] {
    [
        Attr::new("outcome", outcome),
        Attr::new("ruleset", ruleset.to_string()),
    ]
}

/// An ACK report made at `time_ns` (Unix ns).
fn ack(
    rev: i64,
    local: u64,
    latency: f64,
    phases: Option<ReportPhases>,
    time_ns: i64,
) -> NodeReport {
    NodeReport {
        fleet_revision: rev,
        result: Ack::Ack,
        error: String::new(),
        local_revision: local,
        time_ns,
        latency_seconds: latency,
        phases,
    }
}

/// A NACK report made at `time_ns` (Unix ns).
fn nack(rev: i64, error: String, time_ns: i64) -> NodeReport {
    NodeReport {
        fleet_revision: rev,
        result: Ack::Nack,
        error,
        local_revision: 0,
        time_ns,
        latency_seconds: 0.0,
        phases: None,
    }
}

/// An error as a NACK shows it: every violation of a bad request (`FILE:LINE:COL: ...`),
/// else the error's text.
fn describe(e: &Error) -> String {
    match e {
        Error::BadRequest { violations, .. } => violations
            .iter()
            .map(|v| v.description.clone())
            .collect::<Vec<_>>()
            .join("; "),
        other => other.client_message(),
    }
}
