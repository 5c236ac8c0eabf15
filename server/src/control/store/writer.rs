//! The store's connections (rusqlite, the store's one SQLite driver): one writer connection
//! on which every write transaction runs, and a few reader connections for the reads; each
//! call is one synchronous closure on a blocking thread (a short read may run on the calling
//! thread instead: [`Readers::run_here`]).
//!
//! Why rusqlite and not sqlx (the design card's first choice): sqlx-sqlite runs every
//! statement on the connection's own worker thread and hands it and its rows over channels,
//! one round trip per statement. A commit's transaction is ~15-25 statements that take
//! microseconds each. Measured 2026-12-01 on a loaded 2-core VM (same file, WAL,
//! `synchronous = FULL`, one `BEGIN IMMEDIATE` transaction of 12 point reads and 12 updates,
//! 300 each, alternated): p50 1.15-1.18 ms through the sqlx pool, 0.23-0.31 ms here (3.8-5x;
//! ~0.04 ms more per statement, ~1 ms more for a 10k-rule Apply's ~25-30 statements, +15% of
//! the Apply; BENCHMARKS.md §6 "One SQLite driver"). Here the whole transaction is one hop
//! to a blocking thread, with statements prepared once and cached on the connection. SQLite
//! allows one writer at a time anyway; readers run on their own connections (WAL: they never
//! wait for the writer, and see a transaction whole or not at all).
//!
//! Every connection has foreign keys on and a 10 s busy timeout; the database is in WAL mode.
//! The writer runs the migrations ([`super::migrate`]) with `synchronous = FULL` before the
//! readers open, then `synchronous = NORMAL`: a commit is in the WAL (a crash of vallumd keeps
//! it) when it returns, and on disk once the group flusher has fsynced the WAL up to its mark
//! ([`super::flush`]); [`Writer::run`] waits for that when the store's [`Durability`] is
//! `Full`, [`Writer::run_unsynced`] leaves the wait to its caller. Readers are `query_only`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use super::flush::{Flusher, Mark};
use super::{
    AuditEntry, Durability, NewRevision, RevisionRow, RevisionState, RulesetRow, chunks, etag,
    i64_of, ruleset_row, u64_of,
};
use crate::error::{Error, Result};

/// Opens a connection to `path` with the store's settings (see the module docs), at
/// `synchronous = FULL`.
fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    // Room for every statement of the transactions (~30).
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Runs `f` on one of `conns` (the first free one, else the next in turn) on a blocking
/// thread. A panic in an earlier call left nothing half done: its transaction rolled back
/// when it was dropped.
async fn on_blocking<T, F>(conns: Arc<[Mutex<Connection>]>, start: usize, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let n = conns.len();
        let free = (0..n).find_map(|i| conns[(start + i) % n].try_lock().ok());
        let mut conn = match free {
            Some(c) => c,
            None => conns[start % n].lock().unwrap_or_else(|e| e.into_inner()),
        };
        f(&mut conn)
    })
    .await
    .map_err(|e| Error::TaskFailed {
        task: "store",
        source: e,
    })?
}

/// The reader connections (cheap to clone: shared).
#[derive(Clone, Debug)]
pub(crate) struct Readers {
    conns: Arc<[Mutex<Connection>]>,
    next: Arc<AtomicUsize>,
}

impl Readers {
    /// Opens `n` (at least 1) read-only connections to the migrated database at `path`.
    ///
    /// Errors: [`Error::Store`].
    pub(crate) fn open(path: &Path, n: usize) -> Result<Readers> {
        let conns = (0..n.max(1))
            .map(|_| {
                let c = connect(path)?;
                c.pragma_update(None, "query_only", true)?;
                Ok(Mutex::new(c))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Readers {
            conns: conns.into(),
            next: Arc::default(),
        })
    }

    /// Runs `f` in one read transaction (one snapshot of the database) on a reader
    /// connection, on a blocking thread.
    ///
    /// Errors: those of `f`, [`Error::Store`], [`Error::TaskFailed`] when the task panicked.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        on_blocking(self.conns.clone(), start, move |conn| in_read_tx(conn, f)).await
    }

    /// [`Readers::run`] on the calling thread when a reader connection is free, else as
    /// [`Readers::run`]. For a read of a few rows by their key, which costs microseconds: a
    /// hop to a blocking thread and back costs more (two wakeups, ~20-50 us each on a busy
    /// 2-vCPU host) and puts the call behind whatever the blocking threads do. WAL readers do
    /// not wait for the writer, so `f` does not block the async worker it runs on.
    ///
    /// Errors: as [`Readers::run`].
    pub(crate) fn run_here<T, F>(&self, f: F) -> Option<Result<T>>
    where
        F: FnOnce(&Transaction<'_>) -> Result<T>,
    {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.conns.len();
        let mut conn = (0..n).find_map(|i| self.conns[(start + i) % n].try_lock().ok())?;
        Some(in_read_tx(&mut conn, f))
    }
}

/// `f` in one read transaction of `conn` (one snapshot of the database), the transaction
/// ended when `f` returns Ok. Errors: those of `f`, [`Error::Store`].
fn in_read_tx<T>(
    conn: &mut Connection,
    f: impl FnOnce(&Transaction<'_>) -> Result<T>,
) -> Result<T> {
    let tx = conn.transaction()?;
    let out = f(&tx)?;
    tx.commit()?;
    Ok(out)
}

/// The writer connection and its group flusher (cheap to clone: shared).
#[derive(Clone, Debug)]
pub(crate) struct Writer {
    conn: Arc<[Mutex<Connection>]>,
    /// What the writer remembers of each ruleset's chunk lists ([`chunks::Lists`]), as of
    /// the last committed transaction.
    lists: Arc<Mutex<chunks::Lists>>,
    flusher: Flusher,
    /// What [`Writer::run`] waits for.
    durability: Durability,
}

impl Writer {
    /// Opens (creating it when missing) the database at `path` in WAL mode, applies the
    /// pending migrations, up to and including version `until` (durably), and starts the
    /// group flusher; [`Writer::run`] then waits for the disk ([`Durability::Full`], see
    /// [`Writer::with_durability`]).
    ///
    /// Errors: [`Error::Store`] when it cannot be opened or configured, [`Error::Migrate`],
    /// [`Error::Io`] when the flusher cannot start.
    pub(crate) fn open(path: &Path, until: i64, now: i64) -> Result<Writer> {
        let mut conn = connect(path)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::store_corrupt(format!(
                "{}: journal mode {mode}, not WAL",
                path.display()
            )));
        }
        super::migrate::run_to(&mut conn, until, now)?;
        // From here the fsync of a commit is the flusher's (see the module docs).
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(Writer {
            conn: Arc::new([Mutex::new(conn)]),
            lists: Arc::default(),
            flusher: Flusher::start(path)?,
            durability: Durability::Full,
        })
    }

    /// This writer with [`Writer::run`] waiting as `durability` says.
    pub(crate) fn with_durability(mut self, durability: Durability) -> Writer {
        self.durability = durability;
        self
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on a blocking thread and commits it
    /// when `f` returns `Ok`; an `Err` rolls everything back. With [`Durability::Full`] the
    /// commit is on disk when this returns (it shares one fsync with the writes of other
    /// callers, [`super::flush`]); with [`Durability::Normal`] it is in the WAL (kept by a
    /// crash of vallumd, not of the host, until a later flush or checkpoint).
    ///
    /// Errors: those of `f`, [`Error::Store`], [`Error::TaskFailed`] when the blocking
    /// task panicked, [`Error::Io`] when the fsync failed.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Tx<'_>) -> Result<T> + Send + 'static,
    {
        let (out, mark) = self.run_unsynced(f).await?;
        if self.durability == Durability::Full {
            self.flusher.wait(mark).await?;
        }
        Ok(out)
    }

    /// [`Writer::run`] without the wait: returns when the transaction is in the WAL, with
    /// its [`Mark`] for [`Writer::sync`] (the commit pipeline waits after it released its
    /// write lock, so concurrent commits share an fsync; [`Writer::request`] starts the
    /// fsync early).
    ///
    /// Errors: as [`Writer::run`].
    pub(crate) async fn run_unsynced<T, F>(&self, f: F) -> Result<(T, Mark)>
    where
        T: Send + 'static,
        F: FnOnce(&Tx<'_>) -> Result<T> + Send + 'static,
    {
        let flusher = self.flusher.clone();
        let lists = self.lists.clone();
        let (out, mark) = on_blocking(self.conn.clone(), 0, move |conn| {
            let mut lists = lists.lock().unwrap_or_else(|e| e.into_inner());
            let (out, changed) = {
                let tx = Tx {
                    tx: conn.transaction_with_behavior(TransactionBehavior::Immediate)?,
                    lists: &lists,
                    changed: RefCell::default(),
                };
                let out = f(&tx)?;
                chunks::delete_unused(&tx)?;
                let Tx { tx, changed, .. } = tx;
                tx.commit()?;
                (out, changed.into_inner())
            };
            // Remembered only once committed (a rolled back list is not stored).
            for (ruleset, last) in changed {
                match last {
                    Some(l) => lists.insert(ruleset, l),
                    None => lists.remove(&ruleset),
                };
            }
            // Under the connection's lock: marks follow the WAL's order.
            Ok((out, flusher.wrote()))
        })
        .await?;
        Ok((out, mark))
    }

    /// Asks the flusher for `mark` without waiting (see [`Flusher::request`]).
    pub(crate) fn request(&self, mark: Mark) {
        self.flusher.request(mark);
    }

    /// Waits until every transaction up to `mark` is on disk, whatever the store's
    /// durability (a caller that asked for `full`).
    ///
    /// Errors: [`Error::Io`] when the fsync failed.
    pub(crate) async fn sync(&self, mark: Mark) -> Result<()> {
        self.flusher.wait(mark).await
    }

    /// The mark of the last committed transaction (for [`Writer::sync`]).
    pub(crate) fn written(&self) -> Mark {
        self.flusher.written()
    }

    /// The store's durability.
    pub(crate) fn durability(&self) -> Durability {
        self.durability
    }

    /// The fsyncs of the WAL done so far.
    pub(crate) fn fsyncs(&self) -> u64 {
        self.flusher.fsyncs()
    }
}

/// One write transaction of [`Writer::run`] (a [`Transaction`] by `Deref`), with what the
/// writer remembers of the rulesets' chunk lists ([`chunks::Lists`]) and what this
/// transaction changes of it (kept once it commits); [`chunks::delete_unused`] runs at its
/// end.
pub(crate) struct Tx<'c> {
    tx: Transaction<'c>,
    lists: &'c chunks::Lists,
    /// Per ruleset, what to remember after the commit (`None`: forget it).
    changed: RefCell<HashMap<String, Option<chunks::Last>>>,
}

impl<'c> std::ops::Deref for Tx<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

impl Tx<'_> {
    /// What the writer remembers of `ruleset`'s lists, as this transaction left it.
    fn last(&self, ruleset: &str) -> Option<chunks::Last> {
        match self.changed.borrow().get(ruleset) {
            Some(l) => l.clone(),
            None => self.lists.get(ruleset).cloned(),
        }
    }

    /// Remembers `last` for `ruleset` (`None`: forgets it) once this transaction commits.
    fn remember(&self, ruleset: &str, last: Option<chunks::Last>) {
        self.changed.borrow_mut().insert(ruleset.to_string(), last);
    }
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
        etag: etag(now, 0, None, priority),
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
    let content = Arc::new(new.content);
    let put = chunks::put(tx, tx.last(&rs.name).as_ref(), &content)?;
    let digest = content.layout().root_hex();
    tx.prepare_cached(
        "INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at, chunk_list) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
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
        now,
        put.list
    ])?;
    chunks::put_edits(tx, &rs.name, i64_of(number), &put.edits)?;
    tx.remember(&rs.name, Some(put.last));
    Ok(RevisionRow {
        ruleset: rs.name.clone(),
        number,
        parent: rs.active_revision,
        digest,
        content,
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
        etag: etag(rs.created_at, latest, active, rs.priority),
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

/// Sets the priority of `rs`; returns the row after (its etag is made again by
/// [`set_ruleset_heads`], which the caller runs next).
pub(crate) fn set_priority(tx: &Tx<'_>, rs: RulesetRow, priority: i32) -> Result<RulesetRow> {
    tx.prepare_cached("UPDATE rulesets SET priority = ?1 WHERE name = ?2")?
        .execute(params![priority, rs.name])?;
    Ok(RulesetRow { priority, ..rs })
}

/// [`clear_deadlines`]' statement: it reads the partial index `commits_pending_by_ruleset`
/// (the ruleset's commits that wait for a confirm), not the ruleset's whole commit history.
pub(crate) const CLEAR_DEADLINES: &str = "UPDATE commits SET confirm_deadline = NULL WHERE ruleset = ?1 AND confirm_deadline IS NOT NULL";

/// Clears the commit-confirmed deadlines of `ruleset` (a later commit settles them).
pub(crate) fn clear_deadlines(tx: &Tx<'_>, ruleset: &str) -> Result<()> {
    tx.prepare_cached(CLEAR_DEADLINES)?.execute([ruleset])?;
    Ok(())
}

/// Appends an audit record made at `at` (Unix ns); returns its id.
pub(crate) fn insert_audit(tx: &Tx<'_>, e: &AuditEntry, at: i64) -> Result<i64> {
    tx.prepare_cached(
        "INSERT INTO audit (at, caller, method, request_digest, outcome) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![at, e.caller, e.method, e.request_digest, e.outcome])?;
    Ok(tx.last_insert_rowid())
}

/// Deletes revisions of `ruleset` (`number` = `Some(n)`: that one only; `None`: all) with
/// their chunk edits (`ON DELETE CASCADE`; the key frames and chunks nothing names any more
/// are deleted at the end of the transaction, [`chunks::delete_unused`]).
pub(crate) fn delete_revisions(tx: &Tx<'_>, ruleset: &str, number: Option<u64>) -> Result<()> {
    match number {
        // One statement per shape: with `(?2 IS NULL OR number = ?2)` SQLite reads every
        // revision of the ruleset to delete one.
        Some(n) => {
            tx.prepare_cached("DELETE FROM revisions WHERE ruleset = ?1 AND number = ?2")?
                .execute(params![ruleset, i64_of(n)])?;
        }
        None => {
            tx.prepare_cached("DELETE FROM revisions WHERE ruleset = ?1")?
                .execute([ruleset])?;
            tx.remember(ruleset, None);
        }
    }
    Ok(())
}

/// The revisions of `?1` that [`prune_revisions`] keeps whatever their age: the active one, those
/// PENDING_CONFIRM, and those a pending confirm's timeout would restore; read from the partial
/// indexes `revisions_pending_by_ruleset` and `commits_pending_by_ruleset`, not from every
/// revision and commit of the ruleset.
pub(crate) const HELD_REVISIONS: &str = "SELECT active_revision AS n FROM rulesets WHERE name = ?1 AND active_revision IS NOT NULL \
     UNION SELECT number FROM revisions WHERE ruleset = ?1 AND state = 'PENDING_CONFIRM' \
     UNION SELECT previous FROM commits WHERE ruleset = ?1 AND confirm_deadline IS NOT NULL \
           AND previous IS NOT NULL";

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
        .prepare_cached(HELD_REVISIONS)?
        .query_map([ruleset], |r| r.get::<_, i64>(0))?
        .collect::<rusqlite::Result<Vec<i64>>>()?;
    protect.extend(held.into_iter().map(u64_of));
    let prune = crate::grpc::limits::revisions_to_prune(&numbers, &protect, keep);
    for n in &prune {
        delete_revisions(tx, ruleset, Some(*n))?;
    }
    Ok(prune)
}
