//! `vallum.v1.FleetService`: writes and reads the fleet's desired rulesets in etcd, and
//! aggregates the nodes' reports.
//!
//! PutRuleset checks the source exactly as RulesetService.Apply does (the same
//! [`super::check`] against this vallumd's sets, the same errors with FILE:LINE:COL) before
//! anything is written; the write is one etcd Txn comparing the key's mod revision with the
//! request's etag (FAILED_PRECONDITION, reason ETAG_MISMATCH, when it moved). A value larger
//! than etcd's request limit (1.5 MiB by default) is refused by etcd (FLEET_UNAVAILABLE with
//! etcd's message).

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_proto::v1 as pb;
use vallum_proto::v1::fleet_service_server::FleetService;

use super::etcd::{Etcd, KeyValue, Swap};
use super::selector::Selector;
use super::{Ack, Desired, Keys, NodeInfo, NodeReport};
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
        let expect = etag("etag", &r.etag)?;
        let source = r
            .source
            .as_ref()
            .ok_or_else(|| Error::invalid("source", "a ruleset source is required"))?;
        let input = RulesetInput::try_from(source)?;
        // The same check as Apply's: limits first, then parse, validate, the empty refusal.
        let checked = super::check(&self.state.pipeline, &name, r.priority, input)
            .await?
            .refuse_empty(r.allow_empty)?;
        let warnings: Vec<pb::Violation> =
            checked.warnings().iter().map(convert::violation).collect();
        let checked = checked.into_valid()?;
        let desired = Desired {
            content: checked.content.v4.clone(),
            content_v6: checked.content.v6.clone(),
            priority: r.priority,
            selector: r.selector.clone(),
            message: r.message.clone(),
            author: caller,
            write_time_ns: super::now_ns(),
        };
        if r.validate_only {
            return Ok(fleet_ruleset(&name, &desired, 0, warnings));
        }
        let value = serde_json::to_vec(&desired)
            .map_err(|e| Error::Internal(format!("encode fleet ruleset: {e}")))?;
        let key = self.keys.ruleset(&name);
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
    let (_, kvs) = etcd.range_prefix(&keys.nodes(), 0).await?;
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

/// GetRolloutStatus of `name`: the live nodes its selector matches, which of them ACKed or
/// NACKed its current fleet revision, which are pending, and reports of nodes gone.
///
/// Errors: as [`get`].
pub async fn rollout_status(etcd: &Etcd, keys: &Keys, name: &str) -> Result<pb::RolloutStatus> {
    let (desired, kv) = get(etcd, keys, name).await?;
    let name = convert::ruleset_id("name", name)?;
    let selector = Selector::parse(&desired.selector)
        .map_err(|e| Error::Internal(format!("stored selector: {e}")))?;
    let nodes = nodes(etcd, keys).await?;
    // Every report, then this ruleset's: status keys are per (node, ruleset).
    let (_, kvs) = etcd.range_prefix(&keys.statuses(), 0).await?;
    let mut reports = BTreeMap::new();
    for kv in kvs {
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        if let Some((node, rs)) = keys.status_parts(&key) {
            if rs == name {
                if let Ok(r) = serde_json::from_slice::<NodeReport>(&kv.value) {
                    reports.insert(node.to_string(), r);
                }
            }
        }
    }
    let rev = kv.mod_revision;
    let mut out = pb::RolloutStatus {
        name: name.clone(),
        fleet_revision: rev,
        ..Default::default()
    };
    for (node, info) in &nodes {
        if !selector.matches(&info.labels) {
            continue;
        }
        out.selected.push(node.clone());
        match reports.get(node) {
            Some(r) if r.fleet_revision == rev && r.result == Ack::Ack => {
                out.applied.push(node_status(node, r));
            }
            Some(r) if r.fleet_revision == rev => out.failed.push(node_status(node, r)),
            _ => out.pending.push(node.clone()),
        }
    }
    for (node, r) in &reports {
        if !nodes.contains_key(node) {
            out.stale.push(node_status(node, r));
        }
    }
    Ok(out)
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
    }
}

/// How often WaitRollout reads the reports.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(100);

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

type ProgressStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::RolloutProgress, Status>> + Send>>;

#[tonic::async_trait]
impl FleetService for FleetApi {
    type WaitRolloutStream = ProgressStream;

    /// Reads the status every 100 ms (one range of the reports each) and sends it when it
    /// changed.
    async fn wait_rollout(
        &self,
        request: Request<pb::WaitRolloutRequest>,
    ) -> Result<Response<Self::WaitRolloutStream>, Status> {
        let r = request.into_inner();
        let timeout = convert::duration("timeout", r.timeout.as_ref())?
            .unwrap_or(std::time::Duration::from_secs(60));
        let first = self.rollout(&r.name).await?;
        let revision = if r.fleet_revision > 0 {
            r.fleet_revision
        } else {
            first.fleet_revision
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut status = first;
            let mut sent: Option<pb::RolloutStatus> = None;
            loop {
                let mut p = phase(&status, revision);
                let timed_out = tokio::time::Instant::now() >= deadline;
                if p == pb::RolloutPhase::Progressing && timed_out {
                    p = pb::RolloutPhase::TimedOut;
                }
                let end = p != pb::RolloutPhase::Progressing;
                if end || sent.as_ref() != Some(&status) {
                    let msg = pb::RolloutProgress {
                        phase: p as i32,
                        status: Some(status.clone()),
                    };
                    if tx.send(Ok(msg)).await.is_err() || end {
                        return;
                    }
                    sent = Some(status.clone());
                }
                tokio::time::sleep(WAIT_POLL).await;
                status = match this.rollout(&r.name).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                };
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
