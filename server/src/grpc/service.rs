//! The gRPC services, one module each, sharing [`State`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::control::pipeline::Pipeline;
use crate::control::store::{AuditEntry, IdempotentCall};
use crate::error::{Error, FieldViolation, Reason, Result};

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
    pub owners: Arc<crate::control::fleet::Owners>,
    /// Packet events from the cores (`WatchPacketEvents`).
    pub events: crate::telemetry::events::Events,
    /// One lock per (method, request_id) in use, so a retry racing the first call waits for
    /// its stored response while calls with other ids go on (see [`State::idempotent`]).
    idempotency: KeyLocks,
}

impl State {
    /// Shared state for the services.
    pub fn new(
        pipeline: Arc<Pipeline>,
        source: String,
        events: crate::telemetry::events::Events,
    ) -> Arc<State> {
        Arc::new(State {
            pipeline,
            ready: AtomicBool::new(false),
            source,
            owners: Arc::default(),
            events,
            idempotency: Mutex::default(),
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

    /// Runs `f` once per request_id, as Stripe's idempotency keys and AIP-155 (the ids of all
    /// methods are one namespace): a repeated id with the same method and request (`digest`,
    /// [`request_digest`] of it) returns the stored response of the first successful call
    /// without running `f`; with another method or request it is refused. A `validate_only`
    /// call never comes here (it neither answers from nor writes to the key store).
    /// A failed call stores nothing (a retry runs again). Keys live for the store's
    /// [`crate::control::store::Retention::idempotency_ttl`]. An empty id always runs `f`.
    ///
    /// Errors: `f`'s; [`Error::BadRequest`] (IDEMPOTENCY_KEY_REUSED at `request_id`) for an
    /// id used with another method or request; [`Error::Store`]/[`Error::StoreCorrupt`] for the stored
    /// response.
    pub async fn idempotent<M, F>(
        &self,
        method: &str,
        request_id: &str,
        digest: &str,
        f: F,
    ) -> Result<M>
    where
        M: prost::Message + Default,
        F: std::future::Future<Output = Result<M>>,
    {
        if request_id.is_empty() {
            return f.await;
        }
        // One lock per id, whatever the method: ids are one namespace.
        let key = KeyLock::new(&self.idempotency, "", request_id);
        {
            let _g = key.lock.lock().await;
            let store = self.pipeline.store();
            if let Some((first_method, first)) = store
                .idempotent_get(request_id, self.pipeline.clock().unix_ns())
                .await?
            {
                if first_method != method {
                    return Err(Error::BadRequest {
                        reason: Reason::IdempotencyKeyReused,
                        violations: vec![FieldViolation::new(
                            "request_id",
                            format!(
                                "{} was used by an earlier {first_method}: request ids are one \
                                 namespace across methods, each for retries of one request (use \
                                 a new id)",
                                vallum_engine::echo::quoted(request_id)
                            ),
                        )],
                    });
                }
                if !first.request_digest.is_empty() && first.request_digest != digest {
                    return Err(Error::BadRequest {
                        reason: Reason::IdempotencyKeyReused,
                        violations: vec![FieldViolation::new(
                            "request_id",
                            format!(
                                "{} was used by an earlier {method} with a different request: an \
                                 id is for retries of the same request (use a new id)",
                                vallum_engine::echo::quoted(request_id)
                            ),
                        )],
                    });
                }
                return M::decode(first.response.as_slice()).map_err(|e| {
                    Error::store_corrupt(format!("stored response of {request_id}: {e}"))
                });
            }
            let m = f.await?;
            let call = IdempotentCall {
                request_digest: digest.to_string(),
                response: m.encode_to_vec(),
            };
            store
                .idempotent_put(method, request_id, call, self.pipeline.clock().unix_ns())
                .await?;
            Ok(m)
        }
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
    /// [`crate::control::store::PersistCommit::audit`]).
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

/// The locks of [`State::idempotent`], one per key in use.
type KeyLocks = Mutex<HashMap<(String, String), Arc<tokio::sync::Mutex<()>>>>;

/// A call's hold on its key's lock in [`KeyLocks`]; dropping it (also when the call is
/// cancelled) removes the lock from the map when no other call holds it.
struct KeyLock<'a> {
    locks: &'a KeyLocks,
    key: (String, String),
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> KeyLock<'a> {
    fn new(locks: &'a KeyLocks, method: &str, request_id: &str) -> Self {
        let key = (method.to_string(), request_id.to_string());
        let lock = (locks.lock().unwrap_or_else(|e| e.into_inner()))
            .entry(key.clone())
            .or_default()
            .clone();
        KeyLock { locks, key, lock }
    }
}

impl Drop for KeyLock<'_> {
    fn drop(&mut self) {
        // The map holds one reference and this call one; a waiter took its clone under the
        // map's lock, so a count of 2 means nobody else can still want it.
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}

/// Runs a mutating call's work on a task of its own and waits for it. A gRPC handler's future
/// is dropped when the client gives up (deadline, disconnect); a commit dropped between its
/// durable store write and the engine's publish would leave the store naming a revision the
/// engine does not run (found by review: Apply with a short deadline). A spawned task is not
/// cancelled with the caller, so the call ends as a whole: published, or reverted.
///
/// The task runs in the caller's span (the call's, crate::telemetry::metrics::traces), so the commit's
/// spans stay children of the call's.
///
/// Errors: the call's own; [`Error::TaskFailed`] as a Status when the task panicked.
pub async fn to_completion<T, F>(call: F) -> Result<T, tonic::Status>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, tonic::Status>> + Send + 'static,
{
    use tracing::Instrument as _;
    tokio::spawn(call.in_current_span())
        .await
        .unwrap_or_else(|e| {
            Err(Error::TaskFailed {
                task: "call",
                source: e,
            }
            .into())
        })
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
