//! The store's writer: one SQLite connection (rusqlite) on which the write transactions of
//! revisions, commits and the audit log run, each as one synchronous call on a blocking
//! thread.
//!
//! Why not through the sqlx pool like the reads: sqlx-sqlite runs every statement on the
//! connection's own worker thread and hands it and its rows over channels, one round trip
//! per statement. A commit's transaction is ~15 statements that take microseconds each, and
//! on a loaded 2-core VM each round trip cost 0.25-0.5 ms. Here the whole transaction is one
//! hop to a blocking thread, with statements prepared once and cached on the connection
//! (persist of a 10k-rule Apply, p50: 4.7-5.0 -> 3.3-3.4 ms together with the session's other
//! changes, BENCHMARKS.md §6). SQLite allows one writer at a time anyway; readers keep using
//! the pool (WAL: they never wait for the writer).
//!
//! The connection is opened after the migrations ran (the schema is the pool's), with the
//! pool's settings: `synchronous = FULL` (a commit is on disk when it returns), foreign
//! keys on, a 10 s busy timeout (the pool's few single-statement writes and the sets'
//! transactions may hold the write lock for a moment).

use std::cell::RefCell;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use super::{
    AuditEntry, NewRevision, RevisionRow, RevisionState, RulesetRow, chunks, etag, i64_of, u64_of,
};
use crate::error::{Error, Result};

/// The writer connection (cheap to clone: shared).
#[derive(Clone, Debug)]
pub(crate) struct Writer {
    conn: Arc<Mutex<Connection>>,
}

impl Writer {
    /// Opens the writer connection to the database at `path` (which must exist and be
    /// migrated).
    ///
    /// Errors: [`Error::StoreWrite`] when it cannot be opened or configured.
    pub(crate) fn open(path: &Path) -> Result<Writer> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        // Room for every statement of the write transactions (~25).
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Writer {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on a blocking thread and commits it
    /// when `f` returns `Ok` (durable when this returns); an `Err` rolls everything back.
    ///
    /// Errors: those of `f`, [`Error::StoreWrite`], [`Error::Internal`] when the blocking
    /// task panicked.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Tx<'_>) -> Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            // A panic in an earlier transaction left nothing half done: its transaction
            // rolled back when it was dropped.
            let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            let tx = Tx {
                tx: conn.transaction_with_behavior(TransactionBehavior::Immediate)?,
                refs: RefCell::default(),
                created: RefCell::default(),
            };
            let out = f(&tx)?;
            chunks::apply_refs(&tx.tx, tx.refs.take(), tx.created.take())?;
            tx.tx.commit()?;
            Ok(out)
        })
        .await
        .map_err(|e| Error::Internal(format!("store write task: {e}")))?
    }
}

/// One write transaction of [`Writer::run`] (derefs to the rusqlite transaction), with the
/// chunk reference counts it changed: [`chunks::put`] and [`chunks::release`] add to them
/// and the net change per chunk is written once, just before the commit. A commit that adds
/// a revision and prunes the oldest one names ~150 chunks twice over, almost all with a net
/// change of zero: one UPDATE of ~150 rows each way was ~0.5 ms of a 10k-rule Apply.
pub(crate) struct Tx<'c> {
    tx: Transaction<'c>,
    /// Chunk id -> change of its reference count, not yet written.
    pub(crate) refs: RefCell<chunks::RefChanges>,
    /// The chunks [`chunks::put`] stored in this transaction (with a count of zero).
    pub(crate) created: RefCell<Vec<i64>>,
}

impl<'c> std::ops::Deref for Tx<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

fn ruleset_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RulesetRow> {
    Ok(RulesetRow {
        name: r.get("name")?,
        priority: r.get("priority")?,
        etag: r.get("etag")?,
        active_revision: r.get::<_, Option<i64>>("active_revision")?.map(u64_of),
        latest_revision: u64_of(r.get("latest_revision")?),
        created_at: r.get("created_at")?,
        updated_at: r.get("updated_at")?,
    })
}

/// The ruleset row of `name`, if any.
pub(crate) fn ruleset(tx: &Tx<'_>, name: &str) -> Result<Option<RulesetRow>> {
    Ok(tx
        .prepare_cached("SELECT * FROM rulesets WHERE name = ?1")?
        .query_row([name], ruleset_row)
        .optional()?)
}

/// The ruleset row of `name`; [`Error::NotFound`] when missing.
pub(crate) fn existing_ruleset(tx: &Tx<'_>, name: &str) -> Result<RulesetRow> {
    ruleset(tx, name)?.ok_or_else(|| Error::NotFound {
        kind: "ruleset",
        name: format!("rulesets/{name}"),
    })
}

/// Creates the ruleset row when missing; returns it.
pub(crate) fn ensure_ruleset(
    tx: &Tx<'_>,
    name: &str,
    priority: i32,
    now: i64,
) -> Result<RulesetRow> {
    if let Some(r) = ruleset(tx, name)? {
        return Ok(r);
    }
    let row = RulesetRow {
        name: name.to_string(),
        priority,
        etag: etag(now, 0, None),
        active_revision: None,
        latest_revision: 0,
        created_at: now,
        updated_at: now,
    };
    tx.prepare_cached(
        "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
         VALUES (?1, ?2, ?3, NULL, 0, ?4, ?4)",
    )?
    .execute(params![name, priority, row.etag, now])?;
    Ok(row)
}

/// Inserts revision `latest_revision + 1` of `rs` with `new`'s content (stored as chunks);
/// returns its row (the content moved into it, nothing read back).
pub(crate) fn insert_revision(
    tx: &Tx<'_>,
    rs: &RulesetRow,
    new: NewRevision,
    state: RevisionState,
    now: i64,
) -> Result<RevisionRow> {
    let number = rs.latest_revision + 1;
    let digest = new.content.digest();
    tx.prepare_cached(
        "INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        rs.name,
        i64_of(number),
        rs.active_revision.map(i64_of),
        digest,
        i64::from(new.rule_count),
        new.author,
        new.message,
        state.as_str(),
        now
    ])?;
    let (v4, v6) = chunks::put(tx, &new.content)?;
    tx.prepare_cached(
        "INSERT INTO revision_chunks (ruleset, number, chunks_v4, chunks_v6) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![rs.name, i64_of(number), v4, v6])?;
    Ok(RevisionRow {
        ruleset: rs.name.clone(),
        number,
        parent: rs.active_revision,
        digest,
        content: new.content,
        rule_count: new.rule_count,
        author: new.author,
        message: new.message,
        state,
        created_at: now,
    })
}

/// The state of revision `number` of `ruleset`, if it exists (no text is read).
pub(crate) fn revision_state(
    tx: &Tx<'_>,
    ruleset: &str,
    number: u64,
) -> Result<Option<RevisionState>> {
    let state: Option<String> = tx
        .prepare_cached("SELECT state FROM revisions WHERE ruleset = ?1 AND number = ?2")?
        .query_row(params![ruleset, i64_of(number)], |r| r.get(0))
        .optional()?;
    state.map(|s| s.parse()).transpose()
}

/// Sets the state of revision `number` of `ruleset`.
pub(crate) fn set_state(
    tx: &Tx<'_>,
    ruleset: &str,
    number: u64,
    state: RevisionState,
) -> Result<()> {
    tx.prepare_cached("UPDATE revisions SET state = ?1 WHERE ruleset = ?2 AND number = ?3")?
        .execute(params![state.as_str(), ruleset, i64_of(number)])?;
    Ok(())
}

/// Points `rs` at `latest` and `active` with a new etag; returns the row after.
pub(crate) fn set_ruleset_heads(
    tx: &Tx<'_>,
    rs: &RulesetRow,
    latest: u64,
    active: Option<u64>,
    now: i64,
) -> Result<RulesetRow> {
    let after = RulesetRow {
        etag: etag(rs.created_at, latest, active),
        active_revision: active,
        latest_revision: latest,
        updated_at: now,
        ..rs.clone()
    };
    tx.prepare_cached(
        "UPDATE rulesets SET latest_revision = ?1, active_revision = ?2, etag = ?3, updated_at = ?4 WHERE name = ?5",
    )?
    .execute(params![
        i64_of(after.latest_revision),
        after.active_revision.map(i64_of),
        after.etag,
        now,
        rs.name
    ])?;
    Ok(after)
}

/// Clears the commit-confirmed deadlines of `ruleset` (a later commit settles them).
pub(crate) fn clear_deadlines(tx: &Tx<'_>, ruleset: &str) -> Result<()> {
    tx.prepare_cached(
        "UPDATE commits SET confirm_deadline = NULL WHERE ruleset = ?1 AND confirm_deadline IS NOT NULL",
    )?
    .execute([ruleset])?;
    Ok(())
}

/// Appends an audit record; returns its id.
pub(crate) fn insert_audit(tx: &Tx<'_>, e: &AuditEntry) -> Result<i64> {
    tx.prepare_cached(
        "INSERT INTO audit (at, caller, method, request_digest, outcome) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![e.at, e.caller, e.method, e.request_digest, e.outcome])?;
    Ok(tx.last_insert_rowid())
}

/// Deletes revisions of `ruleset` (`number` = `Some(n)`: that one only; `None`: all) with
/// their chunk lists, releasing the chunks no other revision names.
pub(crate) fn delete_revisions(tx: &Tx<'_>, ruleset: &str, number: Option<u64>) -> Result<()> {
    let n = number.map(i64_of);
    let lists = tx
        .prepare_cached(
            "DELETE FROM revision_chunks WHERE ruleset = ?1 AND (?2 IS NULL OR number = ?2) \
             RETURNING chunks_v4, chunks_v6",
        )?
        .query_map(params![ruleset, n], |r| {
            Ok([r.get::<_, String>(0)?, r.get::<_, String>(1)?])
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    chunks::release(tx, &lists.concat())?;
    tx.prepare_cached("DELETE FROM revisions WHERE ruleset = ?1 AND (?2 IS NULL OR number = ?2)")?
        .execute(params![ruleset, n])?;
    Ok(())
}

/// Deletes the oldest revisions of `ruleset` beyond `keep` (0: none), never one in
/// `protected`, the active one, one PENDING_CONFIRM, or the revision a pending confirm would
/// restore. Returns the numbers deleted.
pub(crate) fn prune_revisions(
    tx: &Tx<'_>,
    ruleset: &str,
    keep: usize,
    protected: &[u64],
) -> Result<Vec<u64>> {
    if keep == 0 {
        return Ok(Vec::new());
    }
    let numbers = tx
        .prepare_cached("SELECT number FROM revisions WHERE ruleset = ?1 ORDER BY number")?
        .query_map([ruleset], |r| r.get::<_, i64>(0))?
        .map(|n| n.map(u64_of))
        .collect::<rusqlite::Result<Vec<u64>>>()?;
    if numbers.len() <= keep {
        return Ok(Vec::new());
    }
    let mut protect = protected.to_vec();
    let held = tx
        .prepare_cached(
            "SELECT active_revision AS n FROM rulesets WHERE name = ?1 AND active_revision IS NOT NULL \
             UNION SELECT number FROM revisions WHERE ruleset = ?1 AND state = 'PENDING_CONFIRM' \
             UNION SELECT previous FROM commits WHERE ruleset = ?1 AND confirm_deadline IS NOT NULL \
                   AND previous IS NOT NULL",
        )?
        .query_map([ruleset], |r| r.get::<_, i64>(0))?
        .collect::<rusqlite::Result<Vec<i64>>>()?;
    protect.extend(held.into_iter().map(u64_of));
    let prune = crate::limits::revisions_to_prune(&numbers, &protect, keep);
    for n in &prune {
        delete_revisions(tx, ruleset, Some(*n))?;
    }
    Ok(prune)
}
