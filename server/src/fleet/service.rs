//! `vallum.v1.FleetService`: writes and reads the fleet's desired rulesets in etcd, and
//! aggregates the nodes' reports.
//!
//! PutRuleset checks the source exactly as RulesetService.Apply does (the same
//! [`super::check`] against this vallumd's sets, the same errors with FILE:LINE:COL) before
//! anything is written; the write is one etcd Txn comparing the key's mod revision with the
//! request's etag (FAILED_PRECONDITION, reason ETAG_MISMATCH, when it moved). A value larger
//! than etcd's request limit (1.5 MiB by default) is refused by etcd (FLEET_UNAVAILABLE with
//! etcd's message).
//!
//! A canary write (`canary` set) keeps, inside the same key, the content the other selected
//! nodes keep enforcing ([`super::Previous`]): the ruleset as it was before (or before the
//! canary phase that is still running). The next write without canary ends the phase.
//!
//! GetRolloutStatus reads the ruleset key, the node keys and the reports at one etcd
//! revision, the reports page by page ([`REPORT_PAGE`] keys per request) so that thousands
//! of nodes never make one response larger than etcd's limits. WaitRollout reads the same
//! once, then follows an etcd watch of the fleet prefix from the next revision (no polling)
//! and sends the status whenever it changed.

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::fleet_service_server::FleetService;

use super::etcd::{Etcd, EtcdError, KeyValue, Swap};
use super::selector::Selector;
use super::{Ack, Desired, Keys, NodeInfo, NodeReport, Previous};
use crate::content::RulesetInput;
use crate::convert;
use crate::error::{Error, Result};
use crate::hooks;
use crate::service::State;

/// The FleetService implementation.
#[derive(Debug, Clone)]
pub struct FleetApi {
    state: Arc<State>,
    etcd: Etcd,
    keys: Keys,
}

impl FleetApi {
    /// The service over shared state and an etcd client.
    pub fn new(state: Arc<State>, etcd: Etcd, keys: Keys) -> Self {
        FleetApi { state, etcd, keys }
    }

    async fn put(&self, caller: String, r: pb::PutFleetRulesetRequest) -> Result<pb::FleetRuleset> {
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
            content: checked.content.v4.clone(),
            content_v6: checked.content.v6.clone(),
            priority: r.priority,
            selector: r.selector.clone(),
            message: r.message.clone(),
            author: caller,
            write_time_ns: super::now_ns(),
            canary: r.canary.clone(),
            previous: None,
        };
        if r.validate_only {
            return Ok(fleet_ruleset(&name, &desired, 0, warnings));
        }
        let key = self.keys.ruleset(&name);
        if !desired.canary.is_empty() {
            // The non-canary nodes keep what they enforce now: the current key's content,
            // or its own previous one while a canary phase runs. The write then swaps on
            // the key as read, so the previous content is the one replaced.
            let current = self.etcd.get(&key).await?;
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
            if let Some(kv) = current {
                let now = decode(&kv)?;
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
        let value = serde_json::to_vec(&desired)
            .map_err(|e| Error::Internal(format!("encode fleet ruleset: {e}")))?;
        match self.etcd.put_if(&key, value, expect).await? {
            Swap::Done(rev) => Ok(fleet_ruleset(&name, &desired, rev, warnings)),
            Swap::Moved(current) => Err(Error::EtagMismatch {
                name: format!("fleet/rulesets/{name}"),
                given: r.etag.clone(),
                current: current.to_string(),
            }),
        }
    }

    async fn get(&self, name: &str) -> Result<(Desired, KeyValue)> {
        get(&self.etcd, &self.keys, name).await
    }

    async fn nodes(&self) -> Result<BTreeMap<String, NodeInfo>> {
        nodes(&self.etcd, &self.keys).await
    }

    async fn rollout(&self, name: &str) -> Result<pb::RolloutStatus> {
        rollout_status(&self.etcd, &self.keys, name).await
    }
}

/// The fleet ruleset `name` and its key.
///
/// Errors: [`Error::NotFound`], [`Error::Fleet`], [`Error::Internal`] for a value that is not one.
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
    /// The etcd revision every event up to which is in here.
    revision: i64,
}

impl Rollout {
    /// Reads the rollout of `name` at one etcd revision, the nodes and the reports page by
    /// page.
    ///
    /// Errors: as [`get`].
    pub async fn read(etcd: &Etcd, keys: &Keys, name: &str) -> Result<Rollout> {
        let (desired, kv) = get(etcd, keys, name).await?;
        let name = convert::ruleset_id("name", name)?;
        let mut out = Rollout {
            keys: keys.clone(),
            name,
            desired: Some((desired, kv.mod_revision)),
            nodes: BTreeMap::new(),
            reports: BTreeMap::new(),
            revision: 0,
        };
        // The ruleset read's revision is unknown here (a plain get): read the nodes at the
        // newest revision, then the reports and the ruleset again at that one.
        let mut nodes = Vec::new();
        let at = etcd
            .range_prefix_paged(&keys.nodes(), 0, REPORT_PAGE, |kv| nodes.push(kv))
            .await?;
        let mut reports = Vec::new();
        etcd.range_prefix_paged(&keys.statuses(), at, REPORT_PAGE, |kv| {
            reports.push(kv);
        })
        .await?;
        out.desired = match etcd.get_at(&keys.ruleset(&out.name), at).await? {
            Some(kv) => Some((decode(&kv)?, kv.mod_revision)),
            None => None,
        };
        for kv in nodes.into_iter().chain(reports) {
            out.put(&kv);
        }
        out.revision = at;
        Ok(out)
    }

    /// Applies one watch event of the fleet prefix (`put` false: a delete).
    pub fn event(&mut self, kv: &KeyValue, put: bool) {
        if put {
            self.put(kv);
        } else {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            if let Some(node) = key.strip_prefix(self.keys.nodes().as_str()) {
                self.nodes.remove(node);
            } else if let Some((node, rs)) = self.keys.status_parts(&key) {
                if rs == self.name {
                    self.reports.remove(node);
                }
            } else if self.keys.ruleset_name(&key) == Some(self.name.as_str()) {
                self.desired = None;
            }
        }
        self.revision = self.revision.max(kv.mod_revision);
    }

    fn put(&mut self, kv: &KeyValue) {
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        if let Some(node) = key.strip_prefix(self.keys.nodes().as_str()) {
            if let Ok(info) = serde_json::from_slice::<NodeInfo>(&kv.value) {
                self.nodes.insert(node.to_string(), info);
            }
        } else if let Some((node, rs)) = self.keys.status_parts(&key) {
            if rs == self.name {
                if let Ok(r) = serde_json::from_slice::<NodeReport>(&kv.value) {
                    self.reports.insert(node.to_string(), r);
                }
            }
        } else if self.keys.ruleset_name(&key) == Some(self.name.as_str()) {
            if let Ok(d) = serde_json::from_slice::<Desired>(&kv.value) {
                self.desired = Some((d, kv.mod_revision));
            }
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
            let selector = Selector::parse(&desired.selector).ok();
            let canary = Selector::parse(&desired.canary).ok();
            for (node, info) in &self.nodes {
                let selected = selector.as_ref().is_some_and(|s| s.matches(&info.labels))
                    && canary.as_ref().is_some_and(|c| c.matches(&info.labels));
                if !selected {
                    continue;
                }
                out.selected.push(node.clone());
                match self.reports.get(node) {
                    Some(r) if r.fleet_revision == *rev && r.result == Ack::Ack => {
                        out.applied.push(node_status(node, r));
                    }
                    Some(r) if r.fleet_revision == *rev => out.failed.push(node_status(node, r)),
                    _ => out.pending.push(node.clone()),
                }
            }
        }
        for (node, r) in &self.reports {
            if !self.nodes.contains_key(node) {
                out.stale.push(node_status(node, r));
            }
        }
        out
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
        Error::Internal(format!(
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
        latency_seconds: r.latency_seconds,
        phases: r.phases.as_ref().map(|p| pb::CommitPhases {
            validate_ns: p.validate_ns,
            compile_ns: p.compile_ns,
            persist_ns: p.persist_ns,
            publish_ns: p.publish_ns,
            quiesce_ns: p.quiesce_ns,
            carry_ns: p.carry_ns,
            total_ns: p.total_ns,
            cores_waited: p.cores_waited,
        }),
    }
}

/// The phase of a rollout of `revision` given its status.
fn phase(s: &pb::RolloutStatus, revision: i64) -> pb::RolloutPhase {
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

/// How long [`follow`] gathers watch events after the first of a batch before it looks at
/// the status again: at thousands of nodes the reports arrive one by one, and each look
/// walks every node.
pub const FOLLOW_WINDOW: std::time::Duration = std::time::Duration::from_millis(25);

/// Follows the rollout `rollout` (as read by [`Rollout::read`]) of fleet revision `revision`
/// (0: the one read) until it ends or `deadline` passes: an etcd watch of the fleet prefix
/// from the revision read, events gathered for [`FOLLOW_WINDOW`] at a time; `send` gets the
/// phase and the status each time the status changed and a last time with the end phase
/// (DONE, FAILED, SUPERSEDED or TIMED_OUT), and stops the follow by returning false. A
/// watch behind a compaction reads the rollout again.
///
/// Errors: as [`Rollout::read`], and an etcd watch that fails.
pub async fn follow<F, Fut>(
    etcd: &Etcd,
    mut rollout: Rollout,
    revision: i64,
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
    let mut watch = None;
    loop {
        let status = rollout.status();
        let mut p = phase(&status, revision);
        if p == pb::RolloutPhase::Progressing && tokio::time::Instant::now() >= deadline {
            p = pb::RolloutPhase::TimedOut;
        }
        let end = p != pb::RolloutPhase::Progressing;
        if end || sent.as_ref() != Some(&status) {
            if !send(p, &status).await || end {
                return Ok(());
            }
            sent = Some(status);
        }
        let w = match watch.as_mut() {
            Some(w) => w,
            None => watch.insert(
                etcd.watch_prefix(rollout.keys.prefix(), rollout.revision + 1)
                    .await?,
            ),
        };
        // The first batch, then whatever else comes within the window.
        let mut until = deadline;
        loop {
            let batch = match tokio::time::timeout_at(until, w.next()).await {
                Err(_) => break,
                Ok(Ok(batch)) => batch,
                Ok(Err(EtcdError::Compacted(_))) => {
                    watch = None;
                    match Rollout::read(etcd, &rollout.keys, &rollout.name).await {
                        Ok(fresh) => rollout = fresh,
                        Err(Error::NotFound { .. }) => rollout.desired = None,
                        Err(e) => return Err(e),
                    }
                    break;
                }
                Ok(Err(e)) => return Err(e.into()),
            };
            if batch.events.is_empty() {
                if let Some(h) = &batch.header {
                    rollout.revision = rollout.revision.max(h.revision);
                }
            }
            for ev in batch.events {
                if let Some(kv) = ev.kv {
                    let put =
                        ev.r#type != vallum_proto::etcdserverpb::event::EventType::Delete as i32;
                    rollout.event(&kv, put);
                }
            }
            until = deadline.min(tokio::time::Instant::now() + FOLLOW_WINDOW);
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
        let r = request.into_inner();
        let timeout = convert::duration("timeout", r.timeout.as_ref())?
            .unwrap_or(std::time::Duration::from_secs(60));
        let first = Rollout::read(&self.etcd, &self.keys, &r.name).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let sent = follow(
                &this.etcd,
                first,
                r.fleet_revision,
                deadline,
                |phase, status| {
                    let msg = pb::RolloutProgress {
                        phase: phase as i32,
                        status: Some(status.clone()),
                    };
                    // A full channel waits (the client reads slowly); a closed one ends.
                    let tx = tx.clone();
                    async move { tx.send(Ok(msg)).await.is_ok() }
                },
            )
            .await;
            if let Err(e) = sent {
                let _ = tx.send(Err(e.into())).await;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn put_ruleset(
        &self,
        request: Request<pb::PutFleetRulesetRequest>,
    ) -> Result<Response<pb::FleetRuleset>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let r = request.into_inner();
        let this = self.clone();
        let result = crate::service::to_completion(async move {
            if r.validate_only {
                return Ok(this.put(caller, r).await?);
            }
            let id = r.request_id.clone();
            let state = this.state.clone();
            let audit = crate::service::audit_entry(caller.clone(), "FleetPutRuleset", &r);
            let result = state
                .idempotent("FleetPutRuleset", &id, this.put(caller, r))
                .await;
            state.audit_pending(Some(audit), &result).await;
            Ok(result?)
        })
        .await?;
        Ok(Response::new(result))
    }

    async fn get_ruleset(
        &self,
        request: Request<pb::GetFleetRulesetRequest>,
    ) -> Result<Response<pb::FleetRuleset>, Status> {
        let r = request.into_inner();
        let (d, kv) = self.get(&r.name).await?;
        let name = convert::ruleset_id("name", &r.name)?;
        Ok(Response::new(fleet_ruleset(
            &name,
            &d,
            kv.mod_revision,
            Vec::new(),
        )))
    }

    async fn list_rulesets(
        &self,
        _request: Request<pb::ListFleetRulesetsRequest>,
    ) -> Result<Response<pb::ListFleetRulesetsResponse>, Status> {
        let (_, kvs) = self
            .etcd
            .range_prefix(&self.keys.rulesets(), 0)
            .await
            .map_err(Error::from)?;
        let mut rulesets = Vec::new();
        for kv in kvs {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            if let Some(name) = self.keys.ruleset_name(&key) {
                rulesets.push(fleet_ruleset(
                    name,
                    &decode(&kv)?,
                    kv.mod_revision,
                    Vec::new(),
                ));
            }
        }
        Ok(Response::new(pb::ListFleetRulesetsResponse { rulesets }))
    }

    async fn delete_ruleset(
        &self,
        request: Request<pb::DeleteFleetRulesetRequest>,
    ) -> Result<Response<pb::DeleteFleetRulesetResponse>, Status> {
        self.state.ready()?;
        let caller = hooks::caller(&request);
        let r = request.into_inner();
        let result = async {
            let name = convert::ruleset_id("name", &r.name)?;
            let expect = etag("etag", &r.etag)?;
            match self
                .etcd
                .delete_if(&self.keys.ruleset(&name), expect)
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
            }
        }
        .await;
        self.state
            .audit(caller, "FleetDeleteRuleset", &r, &result)
            .await;
        Ok(Response::new(pb::DeleteFleetRulesetResponse {
            fleet_revision: result?,
        }))
    }

    async fn get_rollout_status(
        &self,
        request: Request<pb::GetRolloutStatusRequest>,
    ) -> Result<Response<pb::RolloutStatus>, Status> {
        Ok(Response::new(
            self.rollout(&request.into_inner().name).await?,
        ))
    }

    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let nodes = self
            .nodes()
            .await?
            .into_iter()
            .map(|(name, info)| pb::FleetNode {
                name,
                labels: info.labels.into_iter().collect(),
                version: info.version,
                heartbeat_time: Some(convert::timestamp(info.heartbeat_ns)),
            })
            .collect();
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }
}
