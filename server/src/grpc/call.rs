//! The one handler layer: every method of the `vallum.v1` services runs through [`read`] or
//! [`mutate`], which do what every call shares, in one place and one order:
//!
//! 1. ready: [`State::ready`], NOT_READY until the stored state is loaded (every call, reads
//!    too, as docs/operations.md says);
//! 2. caller: [`hooks::caller`], the name the audit log records;
//! 3. grant: the caller's scope ([`Grant`]) must hold the method's [`Op`] (checked before
//!    the request is read, so a caller without the op is refused whatever it sent), then
//!    cover each [`Target`] the request names, with the priority it asks for;
//! 4. idempotency: a call with a `request_id` runs once ([`State::idempotent`]), keyed by
//!    the method and the request's sha256;
//! 5. audit: one record per mutating call, refused ones included, written with the commit
//!    when the pipeline takes it ([`Cx::audit`]), else here after the call;
//! 6. refused: a commit request's refusal is reported to the pipeline
//!    ([`crate::control::pipeline::Pipeline::refused`]: watch stream and metrics).
//!
//! A mutating call runs on a task of its own ([`to_completion`]; a local call on its
//! connection's, [`on_own_task`]), so a client that gives up cannot stop it between its
//! durable store write and the engine's publish. A `validate_only`
//! call ([`Mutation::validate_only`]) is checked as the real one (ready, grant) but neither
//! answers from nor writes to the idempotency keys, writes no audit record and reports no
//! refusal.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use sha2::{Digest as _, Sha256};
use tonic::{Request, Response, Status};

use crate::control::hooks;
use crate::control::store::AuditEntry;
use crate::error::{Error, Result};
use crate::grpc::auth::{Grant, Op};
use crate::grpc::service::State;

/// A mutating request: what the layer reads of it besides its digest.
pub trait Mutation: prost::Message + Send + Sync + 'static {
    /// The request's `request_id` (empty: none; a request type without the field has none).
    fn request_id(&self) -> &str {
        ""
    }
    /// The request's `validate_only` (false for a request type without the field).
    fn validate_only(&self) -> bool {
        false
    }
}

/// Implements [`Mutation`] for request types with `request_id` and, after `;`, those with
/// `validate_only` too, and those with neither after a second `;`.
macro_rules! mutations {
    ($($id:ty),* ; $($both:ty),* ; $($none:ty),*) => {
        $(impl Mutation for $id {
            fn request_id(&self) -> &str {
                &self.request_id
            }
        })*
        $(impl Mutation for $both {
            fn request_id(&self) -> &str {
                &self.request_id
            }
            fn validate_only(&self) -> bool {
                self.validate_only
            }
        })*
        $(impl Mutation for $none {})*
    };
}

use vallum_proto::v1 as pb;
mutations!(
    pb::ConfirmCommitRequest, pb::RollbackRequest, pb::DeleteRulesetRequest,
    pb::DeleteConntrackRequest, pb::FlushConntrackRequest, pb::CreateSetRequest,
    pb::DestroySetRequest, pb::AddElementsRequest, pb::DeleteElementsRequest,
    pb::FlushSetRequest, pb::SwapSetsRequest, pb::ImportIpsetSaveRequest;
    pb::StageRevisionRequest, pb::CommitRevisionRequest, pb::ApplyRequest,
    pb::EditRulesetRequest, pb::UpdateRulesetRequest, pb::PutFleetRulesetRequest;
    pb::ZeroCountersRequest, pb::DeleteFleetRulesetRequest
);

/// Where a mutating call's audit record (the sha256 of its request) is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digest {
    /// On the call's task, before the body runs (small requests).
    Inline,
    /// On a blocking thread while the body runs (a 10k-rule text is ~0.5 MB to hash): the
    /// body joins it with [`Cx::join_audit`] once it has parsed; a call with a `request_id`
    /// joins it before the body (the idempotency key needs the digest); a call that never
    /// joined it (refused early) joins it after.
    Parallel,
}

/// The priority a scoped token's `min-priority=` is checked against for a [`Target`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Not checked (the call sets no priority: a delete, a set change).
    Unchecked,
    /// The lower of this one (asked for) and, when the ruleset exists, its stored one (a
    /// ruleset keeps the priority of its first stage, so committing to one created below
    /// the floor would put the caller's rules ahead of it).
    Requested(i32),
    /// The ruleset's stored one (the call commits to it with the priority it has).
    Stored,
}

/// One thing a mutating request touches, for the caller's [`Grant`].
#[derive(Clone, Debug)]
pub struct Target {
    /// The resource as the refusal names it after the method (`rulesets/NAME`, `sets/*`;
    /// empty: the method alone, e.g. `ConntrackService/Flush`).
    pub resource: String,
    /// The ruleset or set name the scope must cover; `None`: every one (only a scope
    /// without `rulesets=` covers that).
    pub name: Option<String>,
    /// The priority the scope's floor is checked against.
    pub priority: Priority,
}

impl Target {
    /// The ruleset `name`.
    pub fn ruleset(name: String, priority: Priority) -> Target {
        Target {
            resource: format!("rulesets/{name}"),
            name: Some(name),
            priority,
        }
    }

    /// The set `name`.
    pub fn set(name: &str) -> Target {
        Target {
            resource: format!("sets/{name}"),
            name: Some(name.to_string()),
            priority: Priority::Unchecked,
        }
    }

    /// Every ruleset or set (`resource`: `rulesets/*`, `sets/*`, or empty for a host-wide
    /// table such as conntrack's).
    pub fn every(resource: &str) -> Target {
        Target {
            resource: resource.to_string(),
            name: None,
            priority: Priority::Unchecked,
        }
    }

    /// The call as a refusal names it: `METHOD RESOURCE[ priority P]`.
    fn what(&self, method: &str) -> String {
        let mut what = method.to_string();
        if !self.resource.is_empty() {
            what.push(' ');
            what.push_str(&self.resource);
        }
        if let Priority::Requested(p) = self.priority {
            what.push_str(&format!(" priority {p}"));
        }
        what
    }
}

/// What a mutating method is, for [`mutate`].
pub struct Spec<R> {
    /// The method's name in the audit log and the idempotency keys (`Apply`, `CreateSet`,
    /// `ConntrackService/Delete`, ...).
    pub method: &'static str,
    /// The operation a scoped token must hold.
    pub op: Op,
    /// The names the request touches, parsed from its fields (errors: the field's).
    pub targets: fn(&R) -> Result<Vec<Target>>,
    /// Where the audit record's digest is made.
    pub digest: Digest,
    /// Whether an error is a commit refusal to report ([`crate::control::pipeline::Pipeline::refused`],
    /// for the first target's name).
    pub refused: bool,
}

/// What a mutating call's body gets from the layer.
pub struct Cx {
    /// The shared state.
    pub state: Arc<State>,
    /// The caller, as the audit log records it.
    pub caller: String,
    /// The call's audit record (`None` for a dry run): a commit takes it
    /// (`&mut cx.audit`) to write it inside its own transaction; the layer writes it
    /// otherwise. With [`Digest::Parallel`], `None` until joined ([`Cx::join_audit`]).
    pub audit: Option<AuditEntry>,
    /// The record being made on a blocking thread ([`Digest::Parallel`]).
    digesting: Option<tokio::task::JoinHandle<AuditEntry>>,
    /// The method, for the record made when the digest task failed.
    method: &'static str,
}

impl Cx {
    /// Waits for the audit record made on a blocking thread ([`Digest::Parallel`]); does
    /// nothing when it is made already or the call is a dry run.
    ///
    /// Errors: [`Error::TaskFailed`] when the digest task panicked (the record is then written
    /// without the digest, and the failure logged).
    pub async fn join_audit(&mut self) -> Result<()> {
        let Some(t) = self.digesting.take() else {
            return Ok(());
        };
        match t.await {
            Ok(entry) => {
                self.audit = Some(entry);
                Ok(())
            }
            Err(e) => {
                self.audit = Some(digest_failed(&e, &self.caller, self.method));
                Err(Error::TaskFailed {
                    task: "audit",
                    source: e,
                })
            }
        }
    }
}

/// The audit record of a call whose digest task failed (panicked or was cancelled): a
/// record without the digest, so the call still has its audit row; the failure is logged.
fn digest_failed(e: &tokio::task::JoinError, caller: &str, method: &str) -> AuditEntry {
    tracing::error!(error = %e, method, "audit digest task failed: the row has no digest");
    audit_entry_of(caller.to_string(), method, String::new())
}

/// Runs a read-only method: refuses with NOT_READY until the stored state is loaded, then
/// runs `body` with the request (its metadata too: a fleet read takes its deadline).
///
/// Errors: [`Error::NotReady`]; the body's.
pub async fn read<R, M, F, Fut>(
    state: &State,
    request: Request<R>,
    body: F,
) -> Result<Response<M>, Status>
where
    F: FnOnce(Request<R>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<M>, Status>>,
{
    state.ready()?;
    body(request).await
}

/// Runs a mutating method `spec` on a task of its own (see the module head for the steps):
/// `body` does the method's own work once the layer let it through, with the request shared
/// (the digest thread reads it too).
///
/// Errors: [`Error::NotReady`]; [`Error::ScopeDenied`] (PERMISSION_DENIED) when the grant
/// refuses; the targets' field errors; [`State::idempotent`]'s; the body's; INTERNAL when the
/// call's task panicked.
pub async fn mutate<R, M, F>(
    state: &Arc<State>,
    spec: Spec<R>,
    request: Request<R>,
    body: F,
) -> Result<Response<M>, Status>
where
    R: Mutation,
    M: prost::Message + Default + Send + 'static,
    F: for<'a> FnOnce(&'a mut Cx, Arc<R>) -> BoxFuture<'a, Result<M>> + Send + 'static,
{
    state.ready()?;
    let caller = hooks::caller(&request);
    let grant = Grant::of(&request);
    let r = Arc::new(request.into_inner());
    let state = state.clone();
    to_completion(async move {
        let method = spec.method;
        let dry = r.validate_only();
        let mut cx = Cx {
            state: state.clone(),
            caller: caller.clone(),
            audit: None,
            digesting: None,
            method,
        };
        // No record (nor key) for a dry run.
        match (dry, spec.digest) {
            (true, _) => {}
            (false, Digest::Inline) => cx.audit = Some(audit_entry(caller, method, &*r)),
            (false, Digest::Parallel) => {
                let r = r.clone();
                cx.digesting = Some(tokio::task::spawn_blocking(move || {
                    audit_entry(caller, method, &*r)
                }));
            }
        }
        let mut name = None;
        let result = async {
            grant.check_op(method, spec.op)?;
            let targets = (spec.targets)(&r)?;
            name = targets.first().and_then(|t| t.name.clone());
            for t in targets {
                let priority = scoped_priority(&state, &grant, &t).await?;
                grant.check(&t.what(method), spec.op, t.name.as_deref(), priority)?;
            }
            if dry || r.request_id().is_empty() {
                return body(&mut cx, r.clone()).await;
            }
            // A retry is told from a reuse by the request's digest: wait for it first (a
            // retry runs nothing again: it gets the first answer).
            cx.join_audit().await?;
            let digest = (cx.audit.as_ref())
                .map(|a| a.request_digest.clone())
                .unwrap_or_default();
            let id = r.request_id().to_string();
            let call = body(&mut cx, r.clone());
            state.idempotent(method, &id, &digest, call).await
        }
        .await;
        if let Some(t) = cx.digesting.take() {
            // Refused before the body joined the record.
            cx.audit = Some(match t.await {
                Ok(entry) => entry,
                Err(e) => digest_failed(&e, &cx.caller, method),
            });
        }
        if !dry {
            state.audit_pending(cx.audit.take(), &result).await;
            if let (true, Err(e)) = (spec.refused, &result) {
                state.pipeline.refused(name.as_deref(), e).await;
            }
        }
        Ok(Response::new(result?))
    })
    .await
}

/// The priority `target`'s scope floor is checked against ([`Priority`]); reads the store
/// only for a token with a floor.
///
/// Errors: [`Error::Store`].
async fn scoped_priority(state: &State, grant: &Grant, target: &Target) -> Result<Option<i32>> {
    let requested = match target.priority {
        Priority::Unchecked => return Ok(None),
        Priority::Requested(p) => Some(p),
        Priority::Stored => None,
    };
    let (true, Some(name)) = (grant.limits_priority(), &target.name) else {
        return Ok(requested);
    };
    let stored = (state.pipeline.store().get_ruleset(name).await?).map(|r| r.priority);
    Ok(match (requested, stored) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

tokio::task_local! {
    /// Set while a call runs on a task that nothing cancels ([`on_own_task`]).
    static ON_OWN_TASK: ();
}

/// Runs `call` (a whole request through the service stack) marked as running on a task of
/// its own that is never cancelled while it runs, so [`to_completion`] needs no second task.
/// For the local socket's connections ([`crate::grpc::local_call`]): a connection's task
/// awaits each call it reads to the end (no deadline, no select around it), whether or not
/// the client is still there. Not for HTTP/2, whose streams are dropped when the client
/// resets them.
pub async fn on_own_task<F: std::future::Future>(call: F) -> F::Output {
    ON_OWN_TASK.scope((), call).await
}

/// Runs a call's work on a task of its own and waits for it. A gRPC handler's future is
/// dropped when the client gives up (deadline, disconnect); a commit dropped between its
/// durable store write and the engine's publish would leave the store naming a revision the
/// engine does not run (found by review: Apply with a short deadline). A spawned task is not
/// cancelled with the caller, so the call ends as a whole: published, or reverted. A call
/// that already runs on such a task ([`on_own_task`]: a local call) runs here, without the
/// spawn and the wakeup of its join (a hop between threads on a multi-thread runtime).
///
/// The task runs in the caller's span (the call's, crate::telemetry::metrics::traces), so the
/// commit's spans stay children of the call's.
///
/// Errors: the call's own; [`Error::TaskFailed`] (INTERNAL) when the task panicked, or
/// [`Error::Invariant`] (INTERNAL) when a call run in place panicked (logged; the RPC metrics
/// count it under its code).
pub async fn to_completion<T, F>(call: F) -> Result<T, Status>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, Status>> + Send + 'static,
{
    use futures_util::FutureExt as _;
    use tracing::Instrument as _;
    if ON_OWN_TASK.try_with(|_| ()).is_ok() {
        // AssertUnwindSafe: after a panic nothing of the call is used again (its state was
        // its own), as when its spawned task panicked.
        return match std::panic::AssertUnwindSafe(call).catch_unwind().await {
            Ok(r) => r,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(panic = %what, "call panicked");
                Err(Error::invariant("the call panicked; vallumd's log says why").into())
            }
        };
    }
    match tokio::spawn(call.in_current_span()).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "call task failed");
            Err(Error::TaskFailed {
                task: "call",
                source: e,
            }
            .into())
        }
    }
}

/// The sha256 (hex) of `request`'s protobuf encoding: what the audit record and the
/// idempotency key keep of a request. prost encodes fields in field-number order, so the
/// same request gives the same bytes.
pub fn request_digest<R: prost::Message>(request: &R) -> String {
    Sha256::digest(request.encode_to_vec())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The audit record of a call of `method` by `caller` with `request` (outcome `OK`; the
/// writer sets the failure reason): the request is identified by [`request_digest`].
pub fn audit_entry<R: prost::Message>(caller: String, method: &str, request: &R) -> AuditEntry {
    audit_entry_of(caller, method, request_digest(request))
}

/// [`audit_entry`] with the request's digest already made.
pub fn audit_entry_of(caller: String, method: &str, request_digest: String) -> AuditEntry {
    AuditEntry {
        caller,
        method: method.to_string(),
        request_digest,
        outcome: "OK".to_string(),
    }
}

#[cfg(test)]
mod tests;
