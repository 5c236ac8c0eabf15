//! `vallum.v1.FleetService`: writes and reads the fleet's desired rulesets in etcd, and
//! aggregates the nodes' reports.
//!
//! PutRuleset checks the source exactly as RulesetService.Apply does (the same
//! `super::check` against this vallumd's sets, the same errors with FILE:LINE:COL) before
//! anything is written; the write is one etcd Txn comparing the key's mod revision with the
//! request's etag (FAILED_PRECONDITION, reason ETAG_MISMATCH, when it moved). A write larger
//! than etcd's request limit (`--fleet-max-request-bytes`, etcd's `--max-request-bytes`, 1.5
//! MiB by default: the JSON value, which in a canary phase also holds the previous content,
//! plus the key and the Txn around them) is refused before it is sent: RESOURCE_EXHAUSTED,
//! reason FLEET_VALUE_TOO_LARGE, naming the limit.
//!
//! Deadlines: every handler's etcd calls wait at most `--fleet-call-timeout` each (5 s by
//! default) and never past the caller's gRPC deadline (less a tenth of the time it gave, at
//! most 1 s, so that the answer reaches the caller before its deadline:
//! [`caller_deadline`]); an etcd that does not answer (down, partitioned, SIGSTOPped) is
//! FLEET_UNAVAILABLE in that time. WaitRollout's first read also ends by its `timeout`.
//!
//! A canary write (`canary` set) keeps, inside the same key, the content the other selected
//! nodes keep enforcing ([`super::Previous`]): the ruleset as it was before (or before the
//! canary phase that is still running). The next write without canary ends the phase.
//! Every write lists the earlier revisions of the key with the same content
//! ([`Desired::same_content_as`]), so the full write of a canary rollout commits nothing on
//! the canary nodes (they ACK it from the canary commit), and neither does a text written
//! again unchanged.
//!
//! DeleteRuleset removes the ruleset key and its reports (`reports/{name}/`) in one Txn.
//!
//! GetRolloutStatus reads the ruleset key, the node keys and the ruleset's reports (one
//! range, `reports/{name}/`; during the migration from `status/{node}/{name}` also those,
//! see [`super`]) at one etcd revision: one Txn with the ruleset and the first page of each,
//! then the other pages at that revision without a raft read each ([`REPORT_PAGE`] keys
//! per request, so that thousands of nodes never make one response larger than etcd's
//! limits, and a status read during a rollout's burst of report writes waits for one
//! linearizable read, not one per page). WaitRollout reads the same
//! once, then follows an etcd watch of the fleet prefix from the next revision (no polling),
//! keeps a tally of the nodes by state from each event, and sends the status when it changed
//! (at most every [`PROGRESS_EVERY`] while progressing; the end at once). A revision that
//! selects no live node ends NO_NODES, never DONE, unless the request allows it
//! (`allow_no_nodes`).

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::fleet_service_server::FleetService;

use super::etcd::{Etcd, EtcdError, KeyValue, Read, Swap};
use super::selector::Selector;
use super::{Ack, Desired, Keys, NodeInfo, NodeReport, Previous};
use crate::control::content::RulesetInput;
use crate::error::{Error, Result};
use crate::grpc::auth::Op;
use crate::grpc::call::{self, Digest, Priority, Spec, Target};
use crate::grpc::convert;
use crate::grpc::service::State;
use crate::grpc::service::paging::{self, Paging};

/// The fleet ruleset a write names, as the layer's one [`Target`] (scope `ops=apply` over
/// its name, as a local ruleset's).
///
/// Errors: INVALID_ARGUMENT at `name`.
fn fleet_target(name: &str) -> Result<Vec<Target>> {
    let name = convert::ruleset_id("name", name)?;
    Ok(vec![Target {
        resource: format!("fleet/rulesets/{name}"),
        name: Some(name),
        priority: Priority::Unchecked,
    }])
}

/// How FleetService.ListRulesets pages (by name).
pub const LIST_RULESETS: Paging = Paging {
    method: "FleetService/ListRulesets",
    default: 100,
    max: 1000,
};

/// How FleetService.ListNodes pages (by name).
pub const LIST_NODES: Paging = Paging {
    method: "FleetService/ListNodes",
    default: 1000,
    max: 10_000,
};

/// The FleetService implementation.
#[derive(Debug, Clone)]
pub struct FleetApi {
    state: Arc<State>,
    etcd: Etcd,
    keys: Keys,
    max_request_bytes: usize,
}

/// What a PutRuleset's etcd Txn adds to the value and the key (the compare, the failure
/// read, protobuf framing): generous, so a write at the limit is refused here, not by etcd.
const TXN_OVERHEAD: usize = 512;

/// The deadline of a call's etcd work: the caller's gRPC deadline (`grpc-timeout`), less a
/// tenth of the time it gave (at most 1 s) so that FLEET_UNAVAILABLE reaches the caller
/// before its own deadline passes; `None` when the caller set none (then only
/// `--fleet-call-timeout` bounds each etcd call).
pub fn caller_deadline<T>(request: &Request<T>) -> Option<tokio::time::Instant> {
    let v = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    let given = match unit {
        "H" => std::time::Duration::from_secs(n.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(n.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    };
    let margin = (given / 10).min(std::time::Duration::from_secs(1));
    // tokio's clock (an etcd wait's timer deadline), not `crate::clock`: see etcd.rs.
    tokio::time::Instant::now().checked_add(given - margin)
}

impl FleetApi {
    /// The service over shared state and an etcd client; a ruleset whose etcd write would
    /// exceed `max_request_bytes` (etcd's `--max-request-bytes`) is refused before it.
    pub fn new(state: Arc<State>, etcd: Etcd, keys: Keys, max_request_bytes: usize) -> Self {
        FleetApi {
            state,
            etcd,
            keys,
            max_request_bytes,
        }
    }

    async fn put(
        &self,
        etcd: &Etcd,
        caller: String,
        r: &pb::PutFleetRulesetRequest,
    ) -> Result<pb::FleetRuleset> {
        let name = convert::ruleset_id("name", &r.name)?;
        Selector::parse(&r.selector).map_err(|e| Error::invalid("selector", e))?;
        Selector::parse(&r.canary).map_err(|e| Error::invalid("canary", e))?;
        let mut expect = etag("etag", &r.etag)?;
        let source = r
            .source
            .as_ref()
            .ok_or_else(|| Error::invalid("source", "a ruleset source is required"))?;
        let input = RulesetInput::try_from(source)?;
        // The same check as Apply's: limits first, then parse, the empty refusal, validate.
        let checked = super::check(&self.state.pipeline, &name, r.priority, input)
            .await?
            .refuse_empty(r.allow_empty)?;
        let checked = self.state.pipeline.validate(checked).await?;
        let warnings: Vec<pb::Violation> =
            checked.warnings().iter().map(convert::violation).collect();
        let checked = checked.into_valid()?;
        let mut desired = Desired {
            content: checked.content.v4().to_string(),
            content_v6: checked.content.v6().to_string(),
            priority: r.priority,
            selector: r.selector.clone(),
            message: r.message.clone(),
            author: caller,
            write_time_ns: self.state.pipeline.clock().unix_ns(),
            canary: r.canary.clone(),
            previous: None,
            same_content_as: Vec::new(),
        };
        let key = self.keys.ruleset(&name);
        // A text that alone is past the limit is refused before any etcd call (and a
        // validate_only write says so too).
        let least = desired.content.len() + desired.content_v6.len() + key.len() + TXN_OVERHEAD;
        if least > self.max_request_bytes {
            return Err(Error::FleetValueTooLarge {
                name,
                bytes: least,
                limit: self.max_request_bytes,
            });
        }
        if r.validate_only {
            // A dry run says what the write would: an etag that is not the key's is refused.
            if let Some(want) = expect {
                let now = etcd.get(&key).await?.map_or(0, |kv| kv.mod_revision);
                if want != now {
                    return Err(Error::EtagMismatch {
                        name: format!("fleet/rulesets/{name}"),
                        given: r.etag.clone(),
                        current: now.to_string(),
                    });
                }
            }
            return Ok(fleet_ruleset(&name, &desired, 0, warnings));
        }
        let current = etcd.get(&key).await?;
        if !desired.canary.is_empty() {
            // The non-canary nodes keep what they enforce now: the current key's content,
            // or its own previous one while a canary phase runs. The write then swaps on
            // the key as read, so the previous content is the one replaced.
            if let (Some(want), Some(kv)) = (expect, &current) {
                if want != kv.mod_revision {
                    return Err(Error::EtagMismatch {
                        name: format!("fleet/rulesets/{name}"),
                        given: r.etag.clone(),
                        current: kv.mod_revision.to_string(),
                    });
                }
            }
            expect = Some(current.as_ref().map_or(0, |kv| kv.mod_revision));
            if let Some(kv) = &current {
                let now = decode(kv)?;
                desired.previous = match now.previous {
                    Some(p) if !now.canary.is_empty() => Some(p),
                    _ if !now.canary.is_empty() => None,
                    _ => Some(Box::new(Previous {
                        fleet_revision: kv.mod_revision,
                        desired: now,
                    })),
                };
            }
        }
        // The revisions whose content this write repeats (their nodes commit nothing): a
        // fact about those revisions, true whatever is written in between, so it needs no
        // swap of its own. A value that does not decode (a hand-edited key) repeats nothing.
        if let Some(kv) = &current {
            if let Ok(now) = decode(kv) {
                desired.follow_content_of(&now, kv.mod_revision);
            }
        }
        let value = serde_json::to_vec(&desired)
            .map_err(|e| Error::invariant(format!("encode fleet ruleset: {e}")))?;
        let bytes = value.len() + key.len() + TXN_OVERHEAD;
        if bytes > self.max_request_bytes {
            return Err(Error::FleetValueTooLarge {
                name,
                bytes,
                limit: self.max_request_bytes,
            });
        }
        match etcd.put_if(&key, value, expect).await? {
            Swap::Done(rev) => Ok(fleet_ruleset(&name, &desired, rev, warnings)),
            Swap::Moved(current) => Err(Error::EtagMismatch {
                name: format!("fleet/rulesets/{name}"),
                given: r.etag.clone(),
                current: current.to_string(),
            }),
        }
    }

    /// The etcd client for `request`'s handler: bounded by its caller's deadline.
    fn etcd_for<T>(&self, request: &Request<T>) -> Etcd {
        self.etcd.until(caller_deadline(request))
    }
}

/// The fleet ruleset `name` and its key.
///
/// Errors: [`Error::NotFound`], [`Error::Fleet`], [`Error::StoreCorrupt`] for a value that is not one.
pub async fn get(etcd: &Etcd, keys: &Keys, name: &str) -> Result<(Desired, KeyValue)> {
    let name = convert::ruleset_id("name", name)?;
    let kv = etcd
        .get(&keys.ruleset(&name))
        .await?
        .ok_or_else(|| Error::NotFound {
            kind: "fleet ruleset",
            name: format!("fleet/rulesets/{name}"),
        })?;
    Ok((decode(&kv)?, kv))
}

/// The live nodes (their node key, on a lease, exists).
///
/// Errors: [`Error::Fleet`].
pub async fn nodes(etcd: &Etcd, keys: &Keys) -> Result<BTreeMap<String, NodeInfo>> {
    let mut kvs = Vec::new();
    etcd.range_prefix_paged(&keys.nodes(), 0, REPORT_PAGE, |kv| kvs.push(kv))
        .await?;
    let mut nodes = BTreeMap::new();
    for kv in kvs {
        let key = String::from_utf8_lossy(&kv.key);
        if let (Some(name), Ok(info)) = (
            key.strip_prefix(keys.nodes().as_str()),
            serde_json::from_slice::<NodeInfo>(&kv.value),
        ) {
            nodes.insert(name.to_string(), info);
        }
    }
    Ok(nodes)
}

/// Status keys read per etcd Range: a report is ~300 bytes, so a page stays far below
/// etcd's 1.5 MiB request limit and 4 MiB default response limit of other clients.
pub const REPORT_PAGE: usize = 1000;

/// GetRolloutStatus of `name`: the live nodes its selector matches, which of them ACKed or
/// NACKed its current fleet revision, which are pending, and reports of nodes gone; read at
/// one etcd revision.
///
/// Errors: as [`get`].
pub async fn rollout_status(etcd: &Etcd, keys: &Keys, name: &str) -> Result<pb::RolloutStatus> {
    Ok(Rollout::read(etcd, keys, name).await?.status())
}

/// What a rollout's status is made of, as of one etcd revision: the ruleset key, the live
/// nodes and this ruleset's reports. Read once ([`Rollout::read`]), then kept current from
/// watch events ([`Rollout::event`]).
#[derive(Debug)]
pub struct Rollout {
    keys: Keys,
    name: String,
    /// The ruleset key (None once deleted) and its mod revision.
    desired: Option<(Desired, i64)>,
    nodes: BTreeMap<String, NodeInfo>,
    /// This ruleset's reports, by node.
    reports: BTreeMap<String, NodeReport>,
    /// This ruleset's reports of the first layout (`status/{node}/{name}`), by node: read
    /// only while any such key exists (the migration, see [`super`]); a node's
    /// `reports/` key wins over its legacy one.
    legacy: BTreeMap<String, NodeReport>,
    /// The etcd revision every event up to which is in here.
    revision: i64,
    /// The parsed selector and canary selector of `desired` (None: one does not parse, so
    /// nothing is selected; the writer checks them).
    selectors: Option<(Selector, Selector)>,
    /// The selected live nodes by state, kept by every change ([`Rollout::event`]) so that
    /// [`Rollout::phase`] is O(1): a follower sees the end of a rollout of thousands of
    /// nodes at the event that ends it without walking every node per event.
    tally: Tally,
}

/// How many selected live nodes are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    applied: usize,
    failed: usize,
    pending: usize,
}

/// A selected live node's state in a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    Applied,
    Failed,
    Pending,
}

impl Tally {
    fn count(&mut self, state: Option<NodeState>, add: bool) {
        let slot = match state {
            None => return,
            Some(NodeState::Applied) => &mut self.applied,
            Some(NodeState::Failed) => &mut self.failed,
            Some(NodeState::Pending) => &mut self.pending,
        };
        if add {
            *slot += 1;
        } else {
            *slot = slot.saturating_sub(1);
        }
    }
}

impl Rollout {
    /// Reads the rollout of `name` at one etcd revision: the ruleset key, the first page of
    /// the nodes and of the reports, and whether any report of the first layout exists, in
    /// one Txn (one linearizable read, however many writes are in flight); then the rest of
    /// the nodes and reports page by page at that revision ([`Etcd::range_prefix_after`]).
    ///
    /// Errors: as [`get`].
    pub async fn read(etcd: &Etcd, keys: &Keys, name: &str) -> Result<Rollout> {
        let name = convert::ruleset_id("name", name)?;
        let nodes_prefix = keys.nodes();
        let reports_prefix = keys.reports(&name);
        let (at, first) = etcd
            .read_many(&[
                Read::key(&keys.ruleset(&name)),
                Read::prefix(&nodes_prefix, REPORT_PAGE),
                Read::prefix(&reports_prefix, REPORT_PAGE),
                Read::any_under(&keys.legacy_statuses()),
            ])
            .await?;
        let [ruleset, nodes_page, reports_page, legacy_any] = <[_; 4]>::try_from(first)
            .map_err(|r| Error::Fleet(format!("etcd answered {} reads of 4", r.len())))?;
        let kv = ruleset
            .kvs
            .into_iter()
            .next()
            .ok_or_else(|| Error::NotFound {
                kind: "fleet ruleset",
                name: format!("fleet/rulesets/{name}"),
            })?;
        let desired = decode(&kv)?;
        let mut out = Rollout {
            keys: keys.clone(),
            name,
            desired: None,
            nodes: BTreeMap::new(),
            reports: BTreeMap::new(),
            legacy: BTreeMap::new(),
            revision: 0,
            selectors: None,
            tally: Tally::default(),
        };
        let mut nodes = Vec::new();
        let mut reports = Vec::new();
        for (prefix, page, into) in [
            (&nodes_prefix, nodes_page, &mut nodes),
            (&reports_prefix, reports_page, &mut reports),
        ] {
            let more = page.more;
            into.extend(page.kvs);
            if let Some(last) = into.last().map(|kv| kv.key.clone()).filter(|_| more) {
                etcd.range_prefix_after(prefix, &last, at, REPORT_PAGE, |kv| into.push(kv))
                    .await?;
            }
        }
        // The first layout, while a node has not moved its reports yet: every ruleset's are
        // under `status/`, so this scan reads them all (the cost the new layout removes).
        if !legacy_any.kvs.is_empty() {
            let name = out.name.clone();
            etcd.range_prefix_paged(&keys.legacy_statuses(), at, REPORT_PAGE, |kv| {
                let key = String::from_utf8_lossy(&kv.key);
                if keys
                    .legacy_status_parts(&key)
                    .is_some_and(|(_, rs)| rs == name)
                {
                    reports.push(kv);
                }
            })
            .await?;
        }
        out.set_desired(Some((desired, kv.mod_revision)));
        for kv in nodes.into_iter().chain(reports) {
            out.event(&kv, true);
        }
        out.revision = at;
        Ok(out)
    }

    /// Replaces the ruleset value and recounts every node (a ruleset write: rare).
    fn set_desired(&mut self, desired: Option<(Desired, i64)>) {
        self.selectors = desired.as_ref().and_then(|(d, _)| {
            Some((
                Selector::parse(&d.selector).ok()?,
                Selector::parse(&d.canary).ok()?,
            ))
        });
        self.desired = desired;
        let mut tally = Tally::default();
        for node in self.nodes.keys() {
            tally.count(self.state(node), true);
        }
        self.tally = tally;
    }

    /// `node`'s state, `None` when it is not live or not selected (or no ruleset).
    fn state(&self, node: &str) -> Option<NodeState> {
        let (_, rev) = self.desired.as_ref()?;
        let info = self.nodes.get(node)?;
        let (selector, canary) = self.selectors.as_ref()?;
        if !(selector.matches(&info.labels) && canary.matches(&info.labels)) {
            return None;
        }
        Some(match self.report(node) {
            Some(r) if r.fleet_revision == *rev && r.result == Ack::Ack => NodeState::Applied,
            Some(r) if r.fleet_revision == *rev => NodeState::Failed,
            _ => NodeState::Pending,
        })
    }

    /// The phase of the rollout of fleet revision `revision`, from the tally: SUPERSEDED
    /// when the key moved on (or was deleted), else FAILED on any NACK, DONE when no
    /// selected node is pending, else PROGRESSING.
    pub fn phase(&self, revision: i64) -> pb::RolloutPhase {
        let current = self.desired.as_ref().map_or(0, |(_, rev)| *rev);
        if current != revision {
            pb::RolloutPhase::Superseded
        } else if self.tally.failed > 0 {
            pb::RolloutPhase::Failed
        } else if self.tally.pending == 0 {
            pb::RolloutPhase::Done
        } else {
            pb::RolloutPhase::Progressing
        }
    }

    /// How many live nodes the current revision selects (O(1), from the tally).
    pub fn selected(&self) -> usize {
        self.tally.applied + self.tally.failed + self.tally.pending
    }

    /// Applies one watch event of the fleet prefix (`put` false: a delete): O(1) but for a
    /// write of this ruleset's key, which recounts the nodes.
    pub fn event(&mut self, kv: &KeyValue, put: bool) {
        let key = String::from_utf8_lossy(&kv.key);
        let nodes = self.keys.nodes();
        if let Some(node) = key.strip_prefix(nodes.as_str()) {
            let before = self.state(node);
            if !put {
                self.nodes.remove(node);
            } else if let Ok(info) = serde_json::from_slice::<NodeInfo>(&kv.value) {
                self.nodes.insert(node.to_string(), info);
            }
            self.recount(node, before);
        } else if let Some((rs, node)) = self.keys.report_parts(&key) {
            if rs == self.name {
                let before = self.state(node);
                if !put {
                    self.reports.remove(node);
                } else if let Ok(r) = serde_json::from_slice::<NodeReport>(&kv.value) {
                    self.reports.insert(node.to_string(), r);
                }
                self.recount(node, before);
            }
        } else if let Some((node, rs)) = self.keys.legacy_status_parts(&key) {
            if rs == self.name {
                let before = self.state(node);
                if !put {
                    self.legacy.remove(node);
                } else if let Ok(r) = serde_json::from_slice::<NodeReport>(&kv.value) {
                    self.legacy.insert(node.to_string(), r);
                }
                self.recount(node, before);
            }
        } else if self.keys.ruleset_name(&key) == Some(self.name.as_str()) {
            if !put {
                self.set_desired(None);
            } else if let Ok(d) = serde_json::from_slice::<Desired>(&kv.value) {
                self.set_desired(Some((d, kv.mod_revision)));
            }
        }
        self.revision = self.revision.max(kv.mod_revision);
    }

    /// Moves `node` in the tally from `before` to its state now.
    fn recount(&mut self, node: &str, before: Option<NodeState>) {
        let now = self.state(node);
        if now != before {
            self.tally.count(before, false);
            self.tally.count(now, true);
        }
    }

    /// The status: fleet revision 0 (and nothing selected) once the ruleset is deleted.
    pub fn status(&self) -> pb::RolloutStatus {
        let mut out = pb::RolloutStatus {
            name: self.name.clone(),
            ..Default::default()
        };
        if let Some((desired, rev)) = &self.desired {
            out.fleet_revision = *rev;
            out.canary = desired.canary.clone();
            // Unparsable selectors (the writer checks them) select nothing.
            for node in self.nodes.keys() {
                let Some(state) = self.state(node) else {
                    continue;
                };
                out.selected.push(node.clone());
                match (state, self.report(node)) {
                    (NodeState::Applied, Some(r)) => out.applied.push(node_status(node, r)),
                    (NodeState::Failed, Some(r)) => out.failed.push(node_status(node, r)),
                    _ => out.pending.push(node.clone()),
                }
            }
        }
        let gone = |node: &&String| !self.nodes.contains_key(*node);
        let reported: std::collections::BTreeSet<&String> = self
            .reports
            .keys()
            .chain(self.legacy.keys())
            .filter(gone)
            .collect();
        for node in reported {
            if let Some(r) = self.report(node) {
                out.stale.push(node_status(node, r));
            }
        }
        out
    }

    /// `node`'s report: its `reports/` key, else its first-layout one.
    fn report(&self, node: &str) -> Option<&NodeReport> {
        self.reports.get(node).or_else(|| self.legacy.get(node))
    }
}

/// The expected mod revision of an etag: `None` for "", else its number (0: absent).
fn etag(field: &str, s: &str) -> Result<Option<i64>> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .map(Some)
        .ok_or_else(|| {
            Error::invalid(
                field,
                format!(
                    "{s:?} is not a fleet etag (a fleet revision, or 0 for \"must not exist\")"
                ),
            )
        })
}

fn decode(kv: &KeyValue) -> Result<Desired> {
    serde_json::from_slice(&kv.value).map_err(|e| {
        Error::store_corrupt(format!(
            "{}: not a fleet ruleset value: {e}",
            String::from_utf8_lossy(&kv.key)
        ))
    })
}

fn fleet_ruleset(
    name: &str,
    d: &Desired,
    rev: i64,
    warnings: Vec<pb::Violation>,
) -> pb::FleetRuleset {
    pb::FleetRuleset {
        name: name.to_string(),
        priority: d.priority,
        selector: d.selector.clone(),
        message: d.message.clone(),
        author: d.author.clone(),
        write_time: Some(convert::timestamp(d.write_time_ns)),
        fleet_revision: rev,
        etag: if rev > 0 {
            rev.to_string()
        } else {
            String::new()
        },
        content: d.content.clone(),
        content_v6: d.content_v6.clone(),
        warnings,
        canary: d.canary.clone(),
        previous_revision: d.previous.as_ref().map_or(0, |p| p.fleet_revision),
    }
}

fn node_status(node: &str, r: &NodeReport) -> pb::NodeStatus {
    pb::NodeStatus {
        node: node.to_string(),
        fleet_revision: r.fleet_revision,
        result: match r.result {
            Ack::Ack => pb::NodeResult::Ack,
            Ack::Nack => pb::NodeResult::Nack,
        } as i32,
        error: r.error.clone(),
        local_revision: r.local_revision,
        time: Some(convert::timestamp(r.time_ns)),
        latency: Some(convert::duration_pb(
            (r.latency_seconds.max(0.0) * 1e9) as u64,
        )),
        phases: r.phases.as_ref().map(|p| pb::CommitPhases {
            validate: Some(convert::duration_pb(p.validate_ns)),
            compile: Some(convert::duration_pb(p.compile_ns)),
            persist: Some(convert::duration_pb(p.persist_ns)),
            publish: Some(convert::duration_pb(p.publish_ns)),
            quiesce: Some(convert::duration_pb(p.quiesce_ns)),
            carry: Some(convert::duration_pb(p.carry_ns)),
            total: Some(convert::duration_pb(p.total_ns)),
            cores_waited: p.cores_waited,
        }),
    }
}

/// The least time between two progress statuses [`follow`] sends while a rollout runs: each
/// is built from every selected node (thousands), and a human reads a few a second. The end
/// of the rollout is sent at the event that ends it, not held back.
pub const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Follows the rollout `rollout` (as read by [`Rollout::read`]) of fleet revision `revision`
/// (0: the one read) until it ends or `deadline` passes: an etcd watch of the fleet prefix
/// from the revision read, each event applied to the rollout's tally (O(1), see
/// [`Rollout::phase`]); `send` gets the phase and the status when the status changed, at most
/// once per [`PROGRESS_EVERY`] while PROGRESSING, and at once with the end phase (DONE,
/// FAILED, SUPERSEDED, NO_NODES or TIMED_OUT); it stops the follow by returning false. A
/// revision that selects no live node is NO_NODES, an end, unless `allow_no_nodes` (then
/// DONE). A watch behind a compaction reads the rollout again.
///
/// Errors: as [`Rollout::read`], and an etcd watch that fails.
pub async fn follow<F, Fut>(
    etcd: &Etcd,
    mut rollout: Rollout,
    revision: i64,
    allow_no_nodes: bool,
    deadline: tokio::time::Instant,
    mut send: F,
) -> Result<()>
where
    F: FnMut(pb::RolloutPhase, &pb::RolloutStatus) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let revision = if revision > 0 {
        revision
    } else {
        rollout.desired.as_ref().map_or(0, |(_, rev)| *rev)
    };
    let mut sent: Option<pb::RolloutStatus> = None;
    // When the next progress status may go, and whether anything changed since the last.
    // tokio's clock (an etcd wait's timer deadline), not `crate::clock`: see etcd.rs.
    let mut next_send = tokio::time::Instant::now();
    let mut changed = true;
    let mut watch = None;
    loop {
        // tokio's clock (an etcd wait's timer deadline), not `crate::clock`: see etcd.rs.
        let now = tokio::time::Instant::now();
        let mut p = rollout.phase(revision);
        if p == pb::RolloutPhase::Progressing && now >= deadline {
            p = pb::RolloutPhase::TimedOut;
        }
        if p == pb::RolloutPhase::Done && !allow_no_nodes && rollout.selected() == 0 {
            p = pb::RolloutPhase::NoNodes;
        }
        let end = p != pb::RolloutPhase::Progressing;
        if end || (changed && now >= next_send) {
            let status = rollout.status();
            if end || sent.as_ref() != Some(&status) {
                if !send(p, &status).await || end {
                    return Ok(());
                }
                sent = Some(status);
                next_send = now + PROGRESS_EVERY;
            }
            changed = false;
        }
        let w = match watch.as_mut() {
            Some(w) => w,
            None => watch.insert(
                etcd.watch_prefix(rollout.keys.prefix(), rollout.revision + 1)
                    .await?,
            ),
        };
        // Wake for the next batch, the deadline, or (with a change not sent yet) the time
        // the next progress status may go.
        let until = if changed {
            deadline.min(next_send)
        } else {
            deadline
        };
        match tokio::time::timeout_at(until, w.next()).await {
            Err(_) => {}
            Ok(Ok(batch)) => {
                if batch.events.is_empty() {
                    if let Some(h) = &batch.header {
                        rollout.revision = rollout.revision.max(h.revision);
                    }
                }
                for ev in batch.events {
                    if let Some(kv) = ev.kv {
                        let put = ev.r#type
                            != vallum_proto::etcdserverpb::event::EventType::Delete as i32;
                        rollout.event(&kv, put);
                        changed = true;
                    }
                }
            }
            Ok(Err(EtcdError::Compacted(_))) => {
                watch = None;
                match Rollout::read(etcd, &rollout.keys, &rollout.name).await {
                    Ok(fresh) => rollout = fresh,
                    Err(Error::NotFound { .. }) => rollout.set_desired(None),
                    Err(e) => return Err(e),
                }
                changed = true;
            }
            Ok(Err(e)) => return Err(e.into()),
        }
    }
}

type ProgressStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::RolloutProgress, Status>> + Send>>;

#[tonic::async_trait]
impl FleetService for FleetApi {
    type WaitRolloutStream = ProgressStream;

    /// Reads the rollout once, then follows a watch of the fleet prefix ([`follow`]).
    async fn wait_rollout(
        &self,
        request: Request<pb::WaitRolloutRequest>,
    ) -> Result<Response<Self::WaitRolloutStream>, Status> {
        call::read(&self.state, request, |request| async move {
            let caller = caller_deadline(&request);
            let r = request.into_inner();
            let timeout = convert::duration("timeout", r.timeout.as_ref())?
                .unwrap_or(std::time::Duration::from_secs(60));
            // tokio's clock (an etcd wait's timer deadline), not `crate::clock`: see etcd.rs.
            let deadline = tokio::time::Instant::now() + timeout;
            // The first read ends by the wait's timeout too (and the caller's deadline, if it
            // set one): a hung etcd is FLEET_UNAVAILABLE within the time asked for.
            let first_by = caller.map_or(deadline, |c| c.min(deadline));
            let first =
                Rollout::read(&self.etcd.until(Some(first_by)), &self.keys, &r.name).await?;
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let this = self.clone();
            let progress = tx.clone();
            let following = tokio::spawn(async move {
                follow(
                    &this.etcd.until(Some(deadline)),
                    first,
                    r.fleet_revision,
                    r.allow_no_nodes,
                    deadline,
                    |phase, status| {
                        let msg = pb::RolloutProgress {
                            phase: phase as i32,
                            status: Some(status.clone()),
                        };
                        // A full channel waits (the client reads slowly); a closed one ends.
                        let tx = progress.clone();
                        async move { tx.send(Ok(msg)).await.is_ok() }
                    },
                )
                .await
            });
            // The follower is joined here: its error, or its panic (logged, INTERNAL), ends
            // the stream as a status instead of a stream that just stops.
            tokio::spawn(async move {
                let end = match following.await {
                    Ok(Ok(_)) => return,
                    Ok(Err(e)) => Status::from(e),
                    Err(e) => {
                        tracing::error!(error = %e, "WaitRollout follower task failed");
                        Status::from(Error::TaskFailed {
                            task: "WaitRollout follower",
                            source: e,
                        })
                    }
                };
                // A closed channel: the client is gone, nobody to tell.
                tx.send(Err(end)).await.ok();
            });
            let stream: ProgressStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
            Ok(Response::new(stream))
        })
        .await
    }

    async fn put_ruleset(
        &self,
        request: Request<pb::PutFleetRulesetRequest>,
    ) -> Result<Response<pb::FleetRuleset>, Status> {
        let spec = Spec {
            method: "FleetPutRuleset",
            op: Op::Apply,
            targets: |r: &pb::PutFleetRulesetRequest| fleet_target(&r.name),
            digest: Digest::Parallel,
            refused: false,
        };
        let etcd = self.etcd_for(&request);
        let this = self.clone();
        call::mutate(&self.state, spec, request, move |cx, r| {
            Box::pin(async move { this.put(&etcd, cx.caller.clone(), &r).await })
        })
        .await
    }

    async fn get_ruleset(
        &self,
        request: Request<pb::GetFleetRulesetRequest>,
    ) -> Result<Response<pb::FleetRuleset>, Status> {
        call::read(&self.state, request, |request| async move {
            let etcd = self.etcd_for(&request);
            let r = request.into_inner();
            let (d, kv) = get(&etcd, &self.keys, &r.name).await?;
            let name = convert::ruleset_id("name", &r.name)?;
            Ok(Response::new(fleet_ruleset(
                &name,
                &d,
                kv.mod_revision,
                Vec::new(),
            )))
        })
        .await
    }

    async fn list_rulesets(
        &self,
        request: Request<pb::ListFleetRulesetsRequest>,
    ) -> Result<Response<pb::ListFleetRulesetsResponse>, Status> {
        call::read(&self.state, request, |request| async move {
            let etcd = self.etcd_for(&request);
            let r = request.into_inner();
            let page = LIST_RULESETS.page(r.page_size, &r.page_token, "")?;
            let after = page.cursor.unwrap_or_default();
            let (_, kvs) = etcd
                .range_prefix(&self.keys.rulesets(), 0)
                .await
                .map_err(Error::from)?;
            // etcd returns a prefix by key, so by name; the page's keys are decoded, no others.
            let mut named = Vec::new();
            for kv in &kvs {
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                if let Some(name) = self.keys.ruleset_name(&key) {
                    if name > after.as_str() {
                        named.push((name.to_string(), kv));
                    }
                }
            }
            named.sort_by(|a, b| a.0.cmp(&b.0));
            let mut decoded = Vec::new();
            for (name, kv) in named.iter().take(page.size + 1) {
                decoded.push(fleet_ruleset(
                    name,
                    &decode(kv)?,
                    kv.mod_revision,
                    Vec::new(),
                ));
            }
            let (rulesets, more) = paging::fill(decoded, page.size);
            let next_page_token = match rulesets.last() {
                Some(last) if more => LIST_RULESETS.token("", &last.name),
                _ => String::new(),
            };
            Ok(Response::new(pb::ListFleetRulesetsResponse {
                rulesets,
                next_page_token,
            }))
        })
        .await
    }

    async fn delete_ruleset(
        &self,
        request: Request<pb::DeleteFleetRulesetRequest>,
    ) -> Result<Response<pb::DeleteFleetRulesetResponse>, Status> {
        let spec = Spec {
            method: "FleetDeleteRuleset",
            op: Op::Apply,
            targets: |r: &pb::DeleteFleetRulesetRequest| fleet_target(&r.name),
            digest: Digest::Inline,
            refused: false,
        };
        let etcd = self.etcd_for(&request);
        let this = self.clone();
        call::mutate(&self.state, spec, request, move |_, r| {
            Box::pin(async move {
                let name = convert::ruleset_id("name", &r.name)?;
                let expect = etag("etag", &r.etag)?;
                let fleet_revision = match etcd
                    .delete_if(
                        &this.keys.ruleset(&name),
                        expect,
                        Some(&this.keys.reports(&name)),
                    )
                    .await?
                {
                    Swap::Done(rev) => Ok(rev),
                    Swap::Moved(0) => Err(Error::NotFound {
                        kind: "fleet ruleset",
                        name: format!("fleet/rulesets/{name}"),
                    }),
                    Swap::Moved(current) => Err(Error::EtagMismatch {
                        name: format!("fleet/rulesets/{name}"),
                        given: r.etag.clone(),
                        current: current.to_string(),
                    }),
                }?;
                Ok(pb::DeleteFleetRulesetResponse { fleet_revision })
            })
        })
        .await
    }

    async fn get_rollout_status(
        &self,
        request: Request<pb::GetRolloutStatusRequest>,
    ) -> Result<Response<pb::RolloutStatus>, Status> {
        call::read(&self.state, request, |request| async move {
            let etcd = self.etcd_for(&request);
            Ok(Response::new(
                rollout_status(&etcd, &self.keys, &request.into_inner().name).await?,
            ))
        })
        .await
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        call::read(&self.state, request, |request| async move {
            let etcd = self.etcd_for(&request);
            let r = request.into_inner();
            let page = LIST_NODES.page(r.page_size, &r.page_token, "")?;
            let after = page.cursor.unwrap_or_default();
            let mut all: Vec<_> = nodes(&etcd, &self.keys)
                .await?
                .into_iter()
                .filter(|(name, _)| *name > after)
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            let (nodes, more) = paging::fill(
                all.into_iter().map(|(name, info)| pb::FleetNode {
                    name,
                    labels: info.labels.into_iter().collect(),
                    version: info.version,
                    heartbeat_time: Some(convert::timestamp(info.heartbeat_ns)),
                }),
                page.size,
            );
            let next_page_token = match nodes.last() {
                Some(last) if more => LIST_NODES.token("", &last.name),
                _ => String::new(),
            };
            Ok(Response::new(pb::ListNodesResponse {
                nodes,
                next_page_token,
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The phase as the full status shows it (what [`Rollout::phase`]'s tally must equal).
    fn status_phase(s: &pb::RolloutStatus, revision: i64) -> pb::RolloutPhase {
        if s.fleet_revision != revision {
            pb::RolloutPhase::Superseded
        } else if !s.failed.is_empty() {
            pb::RolloutPhase::Failed
        } else if s.pending.is_empty() {
            pb::RolloutPhase::Done
        } else {
            pb::RolloutPhase::Progressing
        }
    }

    fn kv(key: String, value: Vec<u8>, mod_revision: i64) -> KeyValue {
        KeyValue {
            key: key.into_bytes(),
            value,
            mod_revision,
            ..Default::default()
        }
    }

    #[test]
    fn the_tally_agrees_with_the_status_after_every_event() {
        let keys = Keys::new("/vallum/v1/");
        let mut r = Rollout {
            keys: keys.clone(),
            name: "web".into(),
            desired: None,
            nodes: BTreeMap::new(),
            reports: BTreeMap::new(),
            legacy: BTreeMap::new(),
            revision: 0,
            selectors: None,
            tally: Tally::default(),
        };
        let ruleset = |selector: &str, canary: &str, rev: i64| {
            let d = Desired {
                selector: selector.into(),
                canary: canary.into(),
                ..Default::default()
            };
            kv(keys.ruleset("web"), serde_json::to_vec(&d).unwrap(), rev)
        };
        let node = |name: &str, labels: &str| {
            let info = NodeInfo {
                labels: super::super::selector::parse_labels(labels).unwrap(),
                ..Default::default()
            };
            kv(keys.node(name), serde_json::to_vec(&info).unwrap(), 1)
        };
        let report = |key: String, rev: i64, ack: bool| {
            let r = NodeReport {
                fleet_revision: rev,
                result: if ack { Ack::Ack } else { Ack::Nack },
                error: String::new(),
                local_revision: 1,
                time_ns: 1,
                latency_seconds: 0.0,
                phases: None,
            };
            kv(key, serde_json::to_vec(&r).unwrap(), rev)
        };
        let events: Vec<(KeyValue, bool)> = vec![
            (node("n1", "role=web,zone=a"), true),
            (ruleset("role=web", "", 10), true),
            (node("n2", "role=db"), true),
            (node("n3", "role=web,zone=b"), true),
            (report(keys.report("web", "n1"), 10, true), true),
            (report(keys.report("other", "n3"), 10, false), true),
            (report(keys.legacy_status("n3", "web"), 10, false), true),
            (report(keys.report("web", "n3"), 10, true), true),
            (report(keys.legacy_status("n3", "web"), 10, false), false),
            (report(keys.report("web", "n2"), 10, false), true),
            (node("n2", "role=web"), true),
            (node("n2", "role=db"), true),
            (ruleset("role=web", "zone=a", 12), true),
            (report(keys.report("web", "n1"), 12, true), true),
            (node("n1", ""), false),
            (node("n1", "role=web,zone=a"), true),
            (ruleset("role in web", "", 13), true),
            (ruleset("role=web", "", 14), true),
            (report(keys.report("web", "n3"), 14, true), false),
            (ruleset("", "", 15), false),
        ];
        let mut phases = Vec::new();
        for (i, (kv, put)) in events.iter().enumerate() {
            r.event(kv, *put);
            let s = r.status();
            let current = r.desired.as_ref().map_or(0, |(_, rev)| *rev);
            for rev in [current, 10] {
                assert_eq!(r.phase(rev), status_phase(&s, rev), "event {i}: {s:?}");
            }
            assert_eq!(
                (r.tally.applied, r.tally.failed, r.tally.pending),
                (s.applied.len(), s.failed.len(), s.pending.len()),
                "event {i}"
            );
            phases.push(r.phase(current));
        }
        use pb::RolloutPhase::*;
        assert_eq!(
            phases,
            [
                Done,
                Progressing,
                Progressing,
                Progressing,
                Progressing,
                Progressing,
                Failed,
                Done,
                Done,
                Done,
                Failed,
                Done,
                Progressing,
                Done,
                Done,
                Done,
                Done,
                Progressing,
                Progressing,
                Done
            ]
        );
    }
}
