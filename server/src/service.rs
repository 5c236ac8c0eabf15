//! The gRPC services, one module each, sharing [`State`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use crate::store::{AuditEntry, now_ns};

pub mod conntrack;
pub mod counters;
pub mod engine;
pub mod paging;
pub mod ruleset;
pub mod sets;
pub mod trace;

/// What every service shares.
#[derive(Debug)]
pub struct State {
    /// The commit pipeline (engine + store).
    pub pipeline: Arc<Pipeline>,
    /// Set once the stored state is loaded into the engine.
    pub ready: AtomicBool,
    /// The packet source, as configured (`none`, `pcap:FILE`, `synthetic`).
    pub source: String,
    /// The rulesets fleet mode owns: RulesetService refuses to change them.
    pub owners: Arc<crate::fleet::Owners>,
    /// Packet events from the cores (`WatchPacketEvents`).
    pub events: crate::events::Events,
    /// Serialises calls that carry a request_id, so a retry racing the first call waits for
    /// its stored response.
    idempotency: tokio::sync::Mutex<()>,
}

impl State {
    /// Shared state for the services.
    pub fn new(
        pipeline: Arc<Pipeline>,
        source: String,
        events: crate::events::Events,
    ) -> Arc<State> {
        Arc::new(State {
            pipeline,
            ready: AtomicBool::new(false),
            source,
            owners: Arc::default(),
            events,
            idempotency: tokio::sync::Mutex::new(()),
        })
    }

    /// Errors with [`Error::NotReady`] until the stored state is loaded.
    pub fn ready(&self) -> Result<()> {
        // Acquire pairs with the Release store in `server::run` after loading.
        if self.ready.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::NotReady)
        }
    }

    /// Runs `f` once per (method, request_id): a repeated id returns the stored response of the
    /// first successful call. An empty id always runs `f`.
    ///
    /// Errors: `f`'s, or [`Error::Store`]/[`Error::Internal`] for the stored response.
    pub async fn idempotent<M, F>(&self, method: &str, request_id: &str, f: F) -> Result<M>
    where
        M: prost::Message + Default,
        F: std::future::Future<Output = Result<M>>,
    {
        if request_id.is_empty() {
            return f.await;
        }
        let _g = self.idempotency.lock().await;
        let store = self.pipeline.store();
        if let Some(bytes) = store.idempotent_get(method, request_id).await? {
            return M::decode(bytes.as_slice())
                .map_err(|e| Error::Internal(format!("stored response of {request_id}: {e}")));
        }
        let m = f.await?;
        store
            .idempotent_put(method, request_id, &m.encode_to_vec())
            .await?;
        Ok(m)
    }

    /// Appends an audit record for a mutating call (failures to write it are reported on
    /// stderr, not to the caller).
    pub async fn audit<R: prost::Message, T>(
        &self,
        caller: String,
        method: &str,
        request: &R,
        result: &Result<T>,
    ) {
        self.audit_pending(Some(audit_entry(caller, method, request)), result)
            .await;
    }

    /// Writes `entry` with the outcome of `result`, unless it was already written (`None`:
    /// the pipeline recorded it inside its commit transaction, see
    /// [`crate::store::PersistCommit::audit`]).
    pub async fn audit_pending<T>(&self, entry: Option<AuditEntry>, result: &Result<T>) {
        let Some(mut entry) = entry else {
            return;
        };
        if let Err(e) = result {
            entry.outcome = e.reason().info().name.to_string();
        }
        if let Err(e) = self.pipeline.store().audit(entry).await {
            tracing::error!(error = %e, "audit write failed");
        }
    }
}

/// Runs a mutating call's work on a task of its own and waits for it. A gRPC handler's future
/// is dropped when the client gives up (deadline, disconnect); a commit dropped between its
/// durable store write and the engine's publish would leave the store naming a revision the
/// engine does not run (found by review: Apply with a short deadline). A spawned task is not
/// cancelled with the caller, so the call ends as a whole: published, or reverted.
///
/// Errors: the call's own; [`Error::Internal`] as a Status when the task panicked.
pub async fn to_completion<T, F>(call: F) -> Result<T, tonic::Status>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, tonic::Status>> + Send + 'static,
{
    tokio::spawn(call)
        .await
        .unwrap_or_else(|e| Err(Error::Internal(format!("call task: {e}")).into()))
}

/// The audit record of a call of `method` by `caller` with `request` (outcome `OK`; the
/// writer sets the failure reason): the request is identified by the sha256 of its encoding.
pub fn audit_entry<R: prost::Message>(caller: String, method: &str, request: &R) -> AuditEntry {
    let digest: String = Sha256::digest(request.encode_to_vec())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    AuditEntry {
        at: now_ns(),
        caller,
        method: method.to_string(),
        request_digest: digest,
        outcome: "OK".to_string(),
    }
}
