//! Fleet mode: one declared policy for many nodes, kept in etcd (v3 API).
//!
//! Off unless `vallumd` runs with `--fleet-endpoints`. Then it serves `vallum.v1.FleetService`
//! ([`service`]) and runs a node agent ([`agent`]). The keys under `--fleet-prefix` (default
//! `/vallum/v1/`), each value JSON (readable with `etcdctl get`):
//!
//! - `{prefix}rulesets/{name}`: a [`Desired`] ruleset (canonical IPv4/IPv6 iptables-save
//!   text, priority, node selector, message, author, write time), written only by
//!   FleetService after it validated the text exactly as Apply does. The etcd revision of the
//!   write (the key's mod revision) is the **fleet revision**, and its etag.
//! - `{prefix}reports/{name}/{node}`: a [`NodeReport`], one small key per (ruleset, node),
//!   never a list inside the ruleset key (writes stay one per node and change). Grouped by
//!   ruleset, so a rollout's status is one range read of `reports/{name}/` whatever the
//!   number of other rulesets, and FleetService's delete of a ruleset removes its reports in
//!   the same Txn.
//! - `{prefix}nodes/{node}`: a [`NodeInfo`] (labels, version, heartbeat), bound to an etcd
//!   lease of `--fleet-lease-ttl` seconds kept alive by the agent: when a node dies its node
//!   key expires, and its reports show as stale in GetRolloutStatus rather than as applied.
//!
//! **Migration from the first report layout**, `{prefix}status/{node}/{name}` (vallumd before
//! the `reports/` keys; a rolling upgrade needs no stop): a new agent, each time it lists
//! (start, reconnect after a compaction), copies its own `status/{node}/*` reports that have
//! no `reports/` twin to `reports/{name}/{node}` and then deletes `status/{node}/` (one range
//! delete). Readers (GetRolloutStatus, WaitRollout) accept both while any `status/` key
//! exists, checked with one keys-only read of limit 1: then they also scan `status/` (the
//! old cost) and take a node's legacy report only where it has no `reports/` one. That lasts
//! until the last node has run the new agent once; a node that never returns leaves its
//! `status/{node}/` keys, which `etcdctl del --prefix {prefix}status/{node}/` removes (docs/
//! fleet.md). Old readers do not read `reports/`: during the upgrade ask a new vallumd.
//!
//! The etcd client ([`etcd`]) is generated from the subset of etcd's API in
//! `proto/etcd/rpc.proto` (see there, and [`etcd`], for why not the `etcd-client` crate).
//!
//! Ownership: a ruleset the agent committed is *fleet-owned* ([`Owners`]): its local
//! revisions have author [`FLEET_AUTHOR`] and a message starting `fleet revision N`, so the
//! ownership survives a restart without etcd. RulesetService refuses to change a fleet-owned
//! ruleset (FAILED_PRECONDITION, reason FLEET_OWNED, naming the owner).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vallum_engine::model::Family;

use crate::control::content::{RulesetInput, TextPart};
use crate::control::store::Store;
use crate::error::{Error, Result};

pub mod agent;
pub mod etcd;
pub mod selector;
pub mod service;

/// The author of every local revision the fleet agent commits.
pub const FLEET_AUTHOR: &str = "fleet";

/// Fleet-mode flags, flattened into [`crate::Config`]; each has a `VALLUM_*` env twin.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct FleetArgs {
    /// etcd endpoints, comma-separated (`http://127.0.0.1:2379,...`); fleet mode is off
    /// without it.
    #[arg(long, env = "VALLUM_FLEET_ENDPOINTS", value_delimiter = ',')]
    pub fleet_endpoints: Vec<String>,

    /// This node's name in the fleet (default: the host name).
    #[arg(long, env = "VALLUM_NODE_NAME")]
    pub node_name: Option<String>,

    /// This node's labels, `k=v,k2=v2`, matched by the rulesets' node selectors.
    #[arg(long, env = "VALLUM_NODE_LABELS", default_value = "", value_parser = selector::parse_labels)]
    pub node_labels: Labels,

    /// The etcd key prefix of the fleet's keys.
    #[arg(long, env = "VALLUM_FLEET_PREFIX", default_value = "/vallum/v1/")]
    pub fleet_prefix: String,

    /// Seconds the node key outlives this node (its etcd lease's TTL, at least 2; kept
    /// alive every third of it, jittered). A node whose lease was lost registers again.
    #[arg(long, env = "VALLUM_FLEET_LEASE_TTL", default_value_t = 10)]
    pub fleet_lease_ttl: u32,

    /// The longest one etcd call waits (N[s|m|h], e.g. `5s`, `0.5s`); a FleetService call
    /// also never waits past its caller's gRPC deadline. Past it the call fails with
    /// FLEET_UNAVAILABLE ("etcd did not answer within ...").
    #[arg(long, env = "VALLUM_FLEET_CALL_TIMEOUT", default_value = "5s", value_parser = crate::config::parse_duration)]
    pub fleet_call_timeout: Duration,

    /// etcd's request size limit in bytes (etcd's `--max-request-bytes`, 1.5 MiB by
    /// default): a fleet ruleset whose etcd write would be larger is refused with
    /// RESOURCE_EXHAUSTED (`FLEET_VALUE_TOO_LARGE`) before anything is written.
    #[arg(long, env = "VALLUM_FLEET_MAX_REQUEST_BYTES", default_value_t = ETCD_MAX_REQUEST_BYTES)]
    pub fleet_max_request_bytes: usize,

    /// PEM CA that signed etcd's server certificate (etcd's `--trusted-ca-file` side for
    /// clients); use `https://` endpoints with it.
    #[arg(long, env = "VALLUM_FLEET_CA")]
    pub fleet_ca: Option<std::path::PathBuf>,

    /// PEM client certificate presented to etcd (etcd `--client-cert-auth`), with
    /// `--fleet-key`.
    #[arg(long, env = "VALLUM_FLEET_CERT", requires = "fleet_key")]
    pub fleet_cert: Option<std::path::PathBuf>,

    /// PEM private key of `--fleet-cert`.
    #[arg(long, env = "VALLUM_FLEET_KEY", requires = "fleet_cert")]
    pub fleet_key: Option<std::path::PathBuf>,
}

/// etcd's default `--max-request-bytes`: 1.5 MiB.
pub const ETCD_MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// Node labels: name -> value.
pub type Labels = BTreeMap<String, String>;

impl FleetArgs {
    /// Whether fleet mode is on.
    pub fn enabled(&self) -> bool {
        !self.fleet_endpoints.is_empty()
    }

    /// The node name: `--node-name`, else the host name.
    ///
    /// Errors: [`Error::Startup`] when neither is usable as a key segment.
    pub fn node(&self) -> Result<String> {
        let name = match &self.node_name {
            Some(n) => n.clone(),
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        };
        let ok = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok {
            Ok(name)
        } else {
            Err(Error::Startup {
                code: "NODE_NAME_INVALID",
                message: format!(
                    "--node-name {name:?}: 1-253 characters of A-Z a-z 0-9 . _ - are required in fleet mode"
                ),
            })
        }
    }

    /// The key layout under `--fleet-prefix`.
    pub fn keys(&self) -> Keys {
        Keys::new(&self.fleet_prefix)
    }

    /// The etcd client of `--fleet-endpoints`, over TLS when `--fleet-ca` or `--fleet-cert`
    /// is given (then every endpoint must be `https://`).
    ///
    /// Errors: [`Error::Startup`] (`FLEET_ENDPOINT_INVALID`, `FLEET_TLS_INVALID`) for an
    /// endpoint that is not a URL, a TLS file that cannot be read, or a scheme that does not
    /// match the TLS flags.
    pub fn etcd(&self) -> Result<etcd::Etcd> {
        let tls = if self.fleet_ca.is_some() || self.fleet_cert.is_some() {
            Some(
                crate::grpc::tls::client_config(
                    self.fleet_ca.as_deref(),
                    self.fleet_cert.as_deref(),
                    self.fleet_key.as_deref(),
                    None,
                )
                .map_err(|e| Error::Startup {
                    code: "FLEET_TLS_INVALID",
                    message: format!("fleet TLS: {e}"),
                })?,
            )
        } else {
            None
        };
        etcd::Etcd::connect_with(&self.fleet_endpoints, tls)
            .map(|e| e.call_timeout(self.fleet_call_timeout))
            .map_err(|e| Error::Startup {
                code: "FLEET_ENDPOINT_INVALID",
                message: e.to_string(),
            })
    }

    /// The lease TTL (at least 2 s).
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.fleet_lease_ttl.max(2)))
    }
}

// === impl Keys ===

/// The etcd keys of a fleet under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys under `prefix` (a `/` is appended when missing).
    pub fn new(prefix: &str) -> Keys {
        let mut prefix = prefix.to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Keys { prefix }
    }

    /// The prefix itself, ending in `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `{prefix}rulesets/`.
    pub fn rulesets(&self) -> String {
        format!("{}rulesets/", self.prefix)
    }

    /// `{prefix}rulesets/{name}`.
    pub fn ruleset(&self, name: &str) -> String {
        format!("{}rulesets/{name}", self.prefix)
    }

    /// `{prefix}reports/{ruleset}/`: every node's report on `ruleset` (one range read).
    pub fn reports(&self, ruleset: &str) -> String {
        format!("{}reports/{ruleset}/", self.prefix)
    }

    /// `{prefix}reports/{ruleset}/{node}`: `node`'s report on `ruleset`.
    pub fn report(&self, ruleset: &str, node: &str) -> String {
        format!("{}reports/{ruleset}/{node}", self.prefix)
    }

    /// `{prefix}status/`: the reports of the first layout, `status/{node}/{ruleset}`, read
    /// during the migration to [`Keys::report`] only (see the module docs).
    pub fn legacy_statuses(&self) -> String {
        format!("{}status/", self.prefix)
    }

    /// `{prefix}status/{node}/`: `node`'s reports of the first layout.
    pub fn legacy_statuses_of(&self, node: &str) -> String {
        format!("{}status/{node}/", self.prefix)
    }

    /// `{prefix}status/{node}/{ruleset}`: a report of the first layout.
    pub fn legacy_status(&self, node: &str, ruleset: &str) -> String {
        format!("{}status/{node}/{ruleset}", self.prefix)
    }

    /// `{prefix}nodes/`.
    pub fn nodes(&self) -> String {
        format!("{}nodes/", self.prefix)
    }

    /// `{prefix}nodes/{node}`.
    pub fn node(&self, node: &str) -> String {
        format!("{}nodes/{node}", self.prefix)
    }

    /// The ruleset name of a `{prefix}rulesets/{name}` key.
    pub fn ruleset_name<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.prefix.as_str())?
            .strip_prefix("rulesets/")
            .filter(|n| !n.is_empty() && !n.contains('/'))
    }

    /// (ruleset, node) of a `{prefix}reports/{ruleset}/{node}` key.
    pub fn report_parts<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        key.strip_prefix(self.prefix.as_str())?
            .strip_prefix("reports/")?
            .split_once('/')
    }

    /// (node, ruleset) of a `{prefix}status/{node}/{ruleset}` key (the first layout).
    pub fn legacy_status_parts<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        key.strip_prefix(self.prefix.as_str())?
            .strip_prefix("status/")?
            .split_once('/')
    }
}

// === values ===

/// The value of `{prefix}rulesets/{name}` (JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desired {
    /// Canonical iptables-save text of the IPv4 tables.
    #[serde(default)]
    pub content: String,
    /// Canonical ip6tables-save text of the IPv6 tables.
    #[serde(default)]
    pub content_v6: String,
    /// Priority among active rulesets (lower runs first).
    #[serde(default)]
    pub priority: i32,
    /// Node selector ([`selector::Selector`] syntax); empty selects every node.
    #[serde(default)]
    pub selector: String,
    /// The writer's message.
    #[serde(default)]
    pub message: String,
    /// Who wrote it (the FleetService caller).
    #[serde(default)]
    pub author: String,
    /// Write time, Unix ns (the start of programming latency).
    #[serde(default)]
    pub write_time_ns: i64,
    /// A canary phase: only the selected nodes that also match this selector take this
    /// content; the other selected nodes keep enforcing [`Desired::previous`] (or nothing,
    /// when the ruleset is new). Empty: no canary, every selected node takes this content.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub canary: String,
    /// During a canary phase, the content the non-canary nodes keep: the ruleset as it was
    /// before the canary write (never itself a canary), with its fleet revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Box<Previous>>,
    /// Earlier fleet revisions of this key whose content, content_v6 and priority equal
    /// this one's (oldest first, at most [`SAME_CONTENT_KEPT`]): a node that committed one
    /// of them enforces this content already and ACKs without a local commit. Set by the
    /// writer; e.g. the full write of a canary rollout lists the canary write, so the
    /// canary nodes do not commit the same content twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_content_as: Vec<i64>,
}

// === impl Desired ===

impl Desired {
    /// The pipeline's input for revision `rev` of ruleset `name`: the IPv4 text and, when
    /// there is one, the IPv6 text, named `fleet:NAME@REV` (and `fleet:NAME@REV (v6)`) in
    /// findings, with the field paths an Apply of the same text names, so that a NACK reads
    /// as that Apply's refusal would.
    ///
    /// An nft listing ([`crate::control::content::nft::is_listing`]) is nft input, named as
    /// an Apply's `source.nft.content`.
    pub fn input(&self, name: &str, rev: i64) -> RulesetInput {
        let filename = format!("fleet:{name}@{rev}");
        if crate::control::content::nft::is_listing(&self.content) {
            return RulesetInput {
                parts: Vec::new(),
                nft: Some(crate::control::content::nft::NftPart {
                    text: self.content.clone(),
                    json: false,
                    filename,
                    field: "source.nft.content".into(),
                }),
            };
        }
        let mut parts = vec![TextPart {
            text: self.content.clone(),
            family: Family::Ipv4,
            filename: filename.clone(),
            field: "source.text.content".into(),
            line_fields: None,
        }];
        if !self.content_v6.is_empty() {
            parts.push(TextPart {
                text: self.content_v6.clone(),
                family: Family::Ipv6,
                filename: format!("{filename} (v6)"),
                field: "source.text.content_v6".into(),
                line_fields: None,
            });
        }
        RulesetInput { parts, nft: None }
    }
}

/// How many revisions [`Desired::same_content_as`] keeps (an unchanged text written again
/// and again stays a bounded key).
pub const SAME_CONTENT_KEPT: usize = 16;

/// The content the non-canary nodes keep during a canary phase ([`Desired::previous`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previous {
    /// The fleet revision of that content (the mod revision of its write).
    pub fleet_revision: i64,
    /// The ruleset at that revision (`canary` empty, `previous` none).
    pub desired: Desired,
}

impl Desired {
    /// Whether `self` and `other` make the same local ruleset (content, content_v6 and
    /// priority; not the message, author or selectors).
    pub fn same_content(&self, other: &Desired) -> bool {
        self.content == other.content
            && self.content_v6 == other.content_v6
            && self.priority == other.priority
    }

    /// Sets [`Desired::same_content_as`] for a write replacing `current` (the key's value
    /// at `mod_revision`): `current`'s own list and `mod_revision` when the content is the
    /// same, else nothing.
    pub fn follow_content_of(&mut self, current: &Desired, mod_revision: i64) {
        self.same_content_as.clear();
        if self.same_content(current) {
            self.same_content_as.extend(&current.same_content_as);
            self.same_content_as.push(mod_revision);
            let extra = self.same_content_as.len().saturating_sub(SAME_CONTENT_KEPT);
            self.same_content_as.drain(..extra);
        }
    }

    /// Whether a node that committed fleet revision `enforced` of this key enforces the
    /// content of this value (`mod_revision`: this value's own fleet revision).
    pub fn enforced_by(&self, enforced: i64, mod_revision: i64) -> bool {
        enforced == mod_revision || self.same_content_as.contains(&enforced)
    }

    /// What a node with `labels` must enforce: `(fleet revision, content)` for the key at
    /// `mod_revision`, or `None` when the node is not selected (or, in a canary phase, is
    /// outside the canary and the ruleset had no previous content).
    ///
    /// Errors: a selector that does not parse (the writer checked it; a hand-edited key).
    pub fn target(
        &self,
        mod_revision: i64,
        labels: &Labels,
    ) -> std::result::Result<Option<(i64, &Desired)>, String> {
        let selector =
            selector::Selector::parse(&self.selector).map_err(|e| format!("selector: {e}"))?;
        if !selector.matches(labels) {
            return Ok(None);
        }
        if self.canary.is_empty() {
            return Ok(Some((mod_revision, self)));
        }
        let canary =
            selector::Selector::parse(&self.canary).map_err(|e| format!("canary selector: {e}"))?;
        if canary.matches(labels) {
            return Ok(Some((mod_revision, self)));
        }
        Ok(self
            .previous
            .as_ref()
            .map(|p| (p.fleet_revision, &p.desired)))
    }
}

/// ACK or NACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Ack {
    /// The node enforces the fleet revision.
    Ack,
    /// The node could not apply it (and keeps what it enforced before).
    Nack,
}

/// The value of `{prefix}reports/{ruleset}/{node}` (JSON; the same at the first layout's
/// `{prefix}status/{node}/{ruleset}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The fleet revision this report is about.
    pub fleet_revision: i64,
    /// ACK or NACK.
    pub result: Ack,
    /// The NACK's error, as Apply would return it (`FILE:LINE:COL: message`).
    #[serde(default)]
    pub error: String,
    /// The local revision an ACK made active (0 for a NACK).
    #[serde(default)]
    pub local_revision: u64,
    /// Report time, Unix ns.
    pub time_ns: i64,
    /// Fleet write time -> local publish, seconds (0 for a NACK).
    #[serde(default)]
    pub latency_seconds: f64,
    /// The local commit's phases, seconds (absent for a NACK and for an ACK of a revision
    /// the node enforced already, e.g. after a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<ReportPhases>,
}

/// The phases of a node's local commit of a fleet ruleset, ns: the pipeline's commit phases
/// ([`crate::control::store::Phases`], as CommitResult's), `validate_ns` including the agent's check as
/// Apply's before the commit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportPhases {
    /// Parse, limits and validation.
    pub validate_ns: u64,
    /// Compiling the classifier.
    pub compile_ns: u64,
    /// The durable SQLite transaction.
    pub persist_ns: u64,
    /// Pointer swap and writer barrier.
    pub publish_ns: u64,
    /// Waiting for mid-batch cores to pass a quiescent point.
    pub quiesce_ns: u64,
    /// Counter carry.
    pub carry_ns: u64,
    /// The local commit, wall clock (the check before it included).
    pub total_ns: u64,
    /// Packet cores waited for.
    pub cores_waited: u32,
}

impl ReportPhases {
    /// A commit's phases, with `check_ns` of checking before it.
    pub fn new(p: &crate::control::store::Phases, check_ns: u64) -> ReportPhases {
        ReportPhases {
            validate_ns: p.validate_ns.saturating_add(check_ns),
            compile_ns: p.compile_ns,
            persist_ns: p.persist_ns,
            publish_ns: p.publish_ns,
            quiesce_ns: p.quiesce_ns,
            carry_ns: p.carry_ns,
            total_ns: p.total_ns.saturating_add(check_ns),
            cores_waited: p.cores_waited,
        }
    }
}

/// The value of `{prefix}nodes/{node}` (JSON), on the node's lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's labels.
    #[serde(default)]
    pub labels: Labels,
    /// vallumd's version.
    #[serde(default)]
    pub version: String,
    /// When the node (re)registered on its lease, Unix ns; the lease keeps it alive after.
    #[serde(default)]
    pub heartbeat_ns: i64,
}

// === impl Owners ===

/// Which local rulesets the fleet agent owns, and at which fleet revision: the one place the
/// services and the agent ask.
#[derive(Debug, Default)]
pub struct Owners {
    /// `None` when fleet mode is off; else the prefix (for messages).
    prefix: Mutex<Option<String>>,
    owned: Mutex<BTreeMap<String, i64>>,
}

impl Owners {
    /// Turns fleet ownership on for `prefix` and reads the owned rulesets from the store:
    /// those whose active revision's author is [`FLEET_AUTHOR`] (the fleet revision from its
    /// message `fleet revision N: ...`).
    ///
    /// Errors: [`Error::Store`].
    pub async fn load(&self, prefix: &str, store: &Store) -> Result<()> {
        let mut owned = BTreeMap::new();
        for (rs, rev) in store.active().await? {
            if rev.author == FLEET_AUTHOR {
                owned.insert(rs.name, fleet_revision_of(&rev.message).unwrap_or(0));
            }
        }
        *lock(&self.prefix) = Some(prefix.to_string());
        *lock(&self.owned) = owned;
        Ok(())
    }

    /// Errors with [`Error::FleetOwned`] when `ruleset` is fleet-owned.
    pub fn check(&self, ruleset: &str) -> Result<()> {
        let Some(prefix) = lock(&self.prefix).clone() else {
            return Ok(());
        };
        match lock(&self.owned).get(ruleset) {
            Some(rev) => Err(Error::FleetOwned {
                ruleset: ruleset.to_string(),
                owner: format!("the fleet at {prefix} (fleet revision {rev})"),
            }),
            None => Ok(()),
        }
    }

    /// The fleet revision a fleet-owned ruleset was applied at.
    pub fn get(&self, ruleset: &str) -> Option<i64> {
        lock(&self.owned).get(ruleset).copied()
    }

    /// Every fleet-owned ruleset.
    pub fn all(&self) -> BTreeMap<String, i64> {
        lock(&self.owned).clone()
    }

    /// Marks `ruleset` fleet-owned at `revision`.
    pub fn set(&self, ruleset: &str, revision: i64) {
        lock(&self.owned).insert(ruleset.to_string(), revision);
    }

    /// `ruleset` is no longer fleet-owned.
    pub fn remove(&self, ruleset: &str) {
        lock(&self.owned).remove(ruleset);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The local revision message of a fleet apply.
pub fn revision_message(fleet_revision: i64, message: &str) -> String {
    if message.is_empty() {
        format!("fleet revision {fleet_revision}")
    } else {
        format!("fleet revision {fleet_revision}: {message}")
    }
}

/// The fleet revision in a message made by [`revision_message`].
pub fn fleet_revision_of(message: &str) -> Option<i64> {
    let rest = message.strip_prefix("fleet revision ")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Checks a fleet ruleset exactly as Apply does on this vallumd (limits first, then parse),
/// off the async workers: the writer's check before a Put (which then validates it,
/// [`crate::control::pipeline::Pipeline::validate`]) and each node's before it commits (the commit
/// validates; a node over its own limits NACKs).
///
/// Errors: as [`crate::control::content::check_with`].
pub(crate) async fn check(
    pipeline: &crate::control::pipeline::Pipeline,
    name: &str,
    priority: i32,
    input: crate::control::content::RulesetInput,
) -> Result<crate::control::content::Checked> {
    let limits = pipeline.limits().clone();
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        crate::control::content::check_with(
            &name,
            priority,
            &input,
            None,
            &crate::control::content::Restoring::default(),
            Some(&limits),
        )
    })
    .await
    .map_err(|e| Error::TaskFailed {
        task: "check",
        source: e,
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let k = Keys::new("/vallum/v1");
        assert_eq!(k.ruleset("web"), "/vallum/v1/rulesets/web");
        assert_eq!(k.ruleset_name("/vallum/v1/rulesets/web"), Some("web"));
        assert_eq!(k.ruleset_name("/vallum/v1/rulesets/"), None);
        assert_eq!(k.report_parts(&k.report("web", "n1")), Some(("web", "n1")));
        assert!(k.report("web", "n1").starts_with(&k.reports("web")));
        assert!(!k.report("web2", "n1").starts_with(&k.reports("web")));
        assert_eq!(
            k.legacy_status_parts(&k.legacy_status("n1", "web")),
            Some(("n1", "web"))
        );
        assert_eq!(k.report_parts(&k.legacy_status("n1", "web")), None);
    }

    #[test]
    fn revision_message_round_trip() {
        assert_eq!(fleet_revision_of(&revision_message(42, "hello")), Some(42));
        assert_eq!(fleet_revision_of(&revision_message(7, "")), Some(7));
        assert_eq!(fleet_revision_of("rollback to revision 3"), None);
    }

    #[test]
    fn a_canary_phase_targets_the_canary_and_keeps_the_previous_elsewhere() {
        let labels = |s: &str| selector::parse_labels(s).unwrap();
        let before = Desired {
            content: "old".into(),
            selector: "role=web".into(),
            ..Default::default()
        };
        let canary = Desired {
            content: "new".into(),
            selector: "role=web".into(),
            canary: "zone=a".into(),
            previous: Some(Box::new(Previous {
                fleet_revision: 5,
                desired: before.clone(),
            })),
            ..Default::default()
        };
        let target = |d: &Desired, l: &str| {
            d.target(9, &labels(l))
                .unwrap()
                .map(|(rev, d)| (rev, d.content.clone()))
        };
        assert_eq!(target(&canary, "role=web,zone=a"), Some((9, "new".into())));
        assert_eq!(target(&canary, "role=web,zone=b"), Some((5, "old".into())));
        assert_eq!(target(&canary, "role=db,zone=a"), None);
        let new_ruleset = Desired {
            previous: None,
            ..canary.clone()
        };
        assert_eq!(target(&new_ruleset, "role=web,zone=b"), None);
        assert_eq!(target(&before, "role=web"), Some((9, "old".into())));
        let bad = Desired {
            canary: "zone in a".into(),
            ..canary
        };
        assert!(bad.target(9, &labels("role=web")).is_err());
    }

    #[test]
    fn a_write_lists_the_earlier_revisions_of_the_same_content() {
        let text = |content: &str| Desired {
            content: content.into(),
            ..Default::default()
        };
        // A canary write at 9 of "new", then the full write of "new": the canary nodes
        // (committed at 9) enforce it already; a node at 5 ("old") does not.
        let canary = Desired {
            canary: "zone=a".into(),
            ..text("new")
        };
        let mut full = text("new");
        full.follow_content_of(&canary, 9);
        assert_eq!(full.same_content_as, [9]);
        assert!(full.enforced_by(9, 12) && full.enforced_by(12, 12));
        assert!(!full.enforced_by(5, 12));
        // Written again unchanged: the list grows, bounded.
        let mut again = text("new");
        again.follow_content_of(&full, 12);
        assert_eq!(again.same_content_as, [9, 12]);
        let mut last = again.clone();
        for rev in 13..40 {
            let mut next = text("new");
            next.follow_content_of(&last, rev);
            last = next;
        }
        assert_eq!(last.same_content_as.len(), SAME_CONTENT_KEPT);
        assert_eq!(last.same_content_as.last(), Some(&39));
        // Another text, or the same text at another priority, repeats nothing.
        let mut other = text("other");
        other.follow_content_of(&again, 13);
        assert!(other.same_content_as.is_empty());
        let mut moved = Desired {
            priority: 5,
            ..text("new")
        };
        moved.follow_content_of(&again, 13);
        assert!(moved.same_content_as.is_empty());
    }

    #[test]
    fn owners_refuse_only_in_fleet_mode() {
        let o = Owners::default();
        o.set("web", 5);
        assert!(o.check("web").is_ok(), "fleet mode off: nothing is owned");
        *lock(&o.prefix) = Some("/vallum/v1/".into());
        let e = o.check("web").unwrap_err();
        assert_eq!(e.reason(), crate::Reason::FleetOwned);
        assert!(e.to_string().contains("fleet revision 5"), "{e}");
        assert!(o.check("other").is_ok());
    }
}
