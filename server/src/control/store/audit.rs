//! The audit log, idempotency keys and load failures: what the store keeps about calls
//! rather than rulesets, and [`Retention`], how long it keeps them ([`Store::prune`]).

use rusqlite::{OptionalExtension, params};

use super::{AuditEntry, LoadFailure, Store, i64_of, u64_of, writer};
use crate::error::Result;

/// How long the store keeps idempotency keys and audit records (vallumd's
/// `--idempotency-ttl`, `--audit-retention`, `--audit-max-rows`); [`Store::prune`] deletes
/// what is past it, [`Store::spawn_prune`] does so periodically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// A request id is remembered this long (Unix ns); a later call with it runs anew. `None`:
    /// forever.
    pub idempotency_ttl: Option<std::time::Duration>,
    /// Audit records older than this are deleted. `None`: kept whatever their age.
    pub audit_max_age: Option<std::time::Duration>,
    /// At most this many audit records are kept (the newest). `None`: no bound.
    pub audit_max_rows: Option<u64>,
}

impl Default for Retention {
    /// vallumd's defaults: keys for 24 h (as Stripe's), audit for 90 days and at most a
    /// million records.
    fn default() -> Self {
        Retention {
            idempotency_ttl: Some(std::time::Duration::from_secs(24 * 3600)),
            audit_max_age: Some(std::time::Duration::from_secs(90 * 24 * 3600)),
            audit_max_rows: Some(1_000_000),
        }
    }
}

/// What one [`Store::prune`] deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Audit records (by age or beyond the row bound).
    pub audit: u64,
    /// Expired idempotency keys.
    pub idempotency: u64,
}

/// A stored idempotency key: the digest of the request that used it and its response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotentCall {
    /// sha256 hex of the first request's encoding (empty for keys stored before digests
    /// were: not compared).
    pub request_digest: String,
    /// The encoded response of the first call.
    pub response: Vec<u8>,
}

/// `now - age` in Unix ns (the oldest time still kept), saturating.
fn cutoff(now: i64, age: std::time::Duration) -> i64 {
    now.saturating_sub(i64::try_from(age.as_nanos()).unwrap_or(i64::MAX))
}

// === impl Store ===

impl Store {
    /// The earlier call with this request id, whatever its method (one namespace, as
    /// AIP-155: the key names the request), with that method, unless its key expired at
    /// `now` (Unix ns; older than [`Retention::idempotency_ttl`]).
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn idempotent_get(
        &self,
        request_id: &str,
        now: i64,
    ) -> Result<Option<(String, IdempotentCall)>> {
        let request_id = request_id.to_string();
        let oldest = self
            .retention
            .idempotency_ttl
            .map_or(i64::MIN, |ttl| cutoff(now, ttl));
        self.readers
            .run(move |tx| {
                Ok(tx
                    .prepare_cached(
                        "SELECT method, request_digest, response FROM idempotency \
                         WHERE request_id = ?1 AND created_at >= ?2 \
                         ORDER BY created_at DESC LIMIT 1",
                    )?
                    .query_row(params![request_id, oldest], |r| {
                        Ok((
                            r.get(0)?,
                            IdempotentCall {
                                request_digest: r.get(1)?,
                                response: r.get(2)?,
                            },
                        ))
                    })
                    .optional()?)
            })
            .await
    }

    /// Stores the first successful call of `method` with this request id at `now` (Unix ns):
    /// the digest of its request and its encoded response. A live key is kept (the first one
    /// wins); one that expired at `now` is replaced, and so is a key of another method (the
    /// caller found it expired: [`Store::idempotent_get`] answers across methods).
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn idempotent_put(
        &self,
        method: &str,
        request_id: &str,
        call: IdempotentCall,
        now: i64,
    ) -> Result<()> {
        let (method, request_id) = (method.to_string(), request_id.to_string());
        let oldest = self
            .retention
            .idempotency_ttl
            .map_or(i64::MIN, |ttl| cutoff(now, ttl));
        self.writer
            .run(move |tx| {
                tx.prepare_cached(
                    "DELETE FROM idempotency WHERE request_id = ?1 AND method <> ?2 \
                     AND created_at < ?3",
                )?
                .execute(params![request_id, method, oldest])?;
                tx.prepare_cached(
                    "INSERT INTO idempotency \
                     (method, request_id, response, created_at, request_digest) \
                     VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (method, request_id) DO UPDATE SET \
                     response = excluded.response, created_at = excluded.created_at, \
                     request_digest = excluded.request_digest \
                     WHERE idempotency.created_at < ?6",
                )?
                .execute(params![
                    method,
                    request_id,
                    call.response,
                    now,
                    call.request_digest,
                    oldest
                ])?;
                Ok(())
            })
            .await
    }

    /// Deletes what is past the store's [`Retention`] at `now` (Unix ns): idempotency keys
    /// older than the TTL, audit records older than the audit age and the oldest beyond the
    /// audit row bound; one transaction. Costs one indexed range delete per table.
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn prune(&self, now: i64) -> Result<Pruned> {
        let r = self.retention;
        self.writer
            .run(move |tx| {
                let mut pruned = Pruned::default();
                let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
                if let Some(ttl) = r.idempotency_ttl {
                    pruned.idempotency = count(
                        tx.prepare_cached("DELETE FROM idempotency WHERE created_at < ?1")?
                            .execute([cutoff(now, ttl)])?,
                    );
                }
                if let Some(age) = r.audit_max_age {
                    pruned.audit += count(
                        tx.prepare_cached("DELETE FROM audit WHERE at < ?1")?
                            .execute([cutoff(now, age)])?,
                    );
                }
                if let Some(rows) = r.audit_max_rows {
                    // The newest `rows` records by id (ids grow with every insert) stay.
                    pruned.audit += count(
                        tx.prepare_cached(
                            "DELETE FROM audit WHERE id <= \
                             (SELECT id FROM audit ORDER BY id DESC LIMIT 1 OFFSET ?1)",
                        )?
                        .execute([i64::try_from(rows).unwrap_or(i64::MAX)])?,
                    );
                }
                Ok(pruned)
            })
            .await
    }

    /// Runs [`Store::prune`] every `interval` (at the wall clock's now) until the returned
    /// task is aborted; failures are logged and retried at the next tick.
    pub fn spawn_prune(&self, interval: std::time::Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(interval.max(std::time::Duration::from_millis(10)));
            loop {
                tick.tick().await;
                match me.prune(me.clock.unix_ns()).await {
                    Ok(p) if p != Pruned::default() => {
                        tracing::info!(
                            audit = p.audit,
                            idempotency = p.idempotency,
                            "store pruned"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "store pruning failed"),
                }
            }
        })
    }

    /// Number of stored idempotency keys, expired ones included (for tests and status).
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn idempotency_count(&self) -> Result<u64> {
        self.readers
            .run(|tx| {
                let n: i64 = tx.query_row("SELECT COUNT(*) FROM idempotency", [], |r| r.get(0))?;
                Ok(u64_of(n))
            })
            .await
    }

    /// Appends an audit record.
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn audit(&self, e: AuditEntry) -> Result<()> {
        let clock = self.clock.clone();
        self.writer
            .run(move |tx| writer::insert_audit(tx, &e, clock.unix_ns()).map(drop))
            .await
    }

    /// Marks `f` as an active revision that did not load, with its audit record (at `f.at`),
    /// in one transaction (replacing an earlier mark of the ruleset).
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn record_load_failure(&self, f: LoadFailure, audit: AuditEntry) -> Result<()> {
        self.writer
            .run(move |tx| {
                writer::insert_audit(tx, &audit, f.at)?;
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO load_failures (ruleset, revision, error, at) \
                     VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![f.ruleset, i64_of(f.revision), f.error, f.at])?;
                Ok(())
            })
            .await
    }

    /// Removes the load-failure mark of `ruleset` (it loaded, got another active revision or
    /// was deleted).
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn clear_load_failure(&self, ruleset: &str) -> Result<()> {
        let name = ruleset.to_string();
        self.writer
            .run(move |tx| {
                tx.prepare_cached("DELETE FROM load_failures WHERE ruleset = ?1")?
                    .execute([name])?;
                Ok(())
            })
            .await
    }

    /// The marked load failures, by ruleset.
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn load_failures(&self) -> Result<Vec<LoadFailure>> {
        self.readers
            .run(|tx| {
                Ok(tx
                    .prepare_cached("SELECT * FROM load_failures ORDER BY ruleset")?
                    .query_map([], |r| {
                        Ok(LoadFailure {
                            ruleset: r.get("ruleset")?,
                            revision: u64_of(r.get("revision")?),
                            error: r.get("error")?,
                            at: r.get("at")?,
                        })
                    })?
                    .collect::<rusqlite::Result<_>>()?)
            })
            .await
    }

    /// Number of audit records (for tests and status).
    ///
    /// Errors: [`Error::Store`](crate::error::Error::Store).
    pub async fn audit_count(&self) -> Result<u64> {
        self.readers
            .run(|tx| {
                let n: i64 = tx.query_row("SELECT COUNT(*) FROM audit", [], |r| r.get(0))?;
                Ok(u64_of(n))
            })
            .await
    }
}
