//! The SQLite store: every query of the server lives in this module.
//!
//! The database is opened in WAL mode with `synchronous = FULL`, so a transaction is durable
//! when its commit returns (the commit pipeline relies on that: the revision and commit rows are
//! durable before the engine publishes). Migrations from `migrations/` at the workspace root are
//! embedded and applied at open. Times are Unix nanoseconds, durations nanoseconds.
//!
//! Writers are serialised by the caller (the pipeline's write lock); readers run concurrently
//! on the pool's other connections.

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection, Transaction};

use crate::content::Content;
use crate::error::{Error, Result};

pub mod chunks;
pub mod sets;

/// Now as Unix nanoseconds.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The stored state of a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RevisionState {
    /// Stored, never made active.
    Staged,
    /// Active in the engine.
    Active,
    /// Was active; a later commit replaced it.
    Superseded,
    /// Its commit failed or was rolled back.
    Rejected,
    /// Active, waiting for ConfirmCommit.
    PendingConfirm,
}

impl RevisionState {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            RevisionState::Staged => "STAGED",
            RevisionState::Active => "ACTIVE",
            RevisionState::Superseded => "SUPERSEDED",
            RevisionState::Rejected => "REJECTED",
            RevisionState::PendingConfirm => "PENDING_CONFIRM",
        }
    }
}

impl FromStr for RevisionState {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "STAGED" => RevisionState::Staged,
            "ACTIVE" => RevisionState::Active,
            "SUPERSEDED" => RevisionState::Superseded,
            "REJECTED" => RevisionState::Rejected,
            "PENDING_CONFIRM" => RevisionState::PendingConfirm,
            _ => {
                return Err(Error::Internal(format!(
                    "unknown revision state {s:?} in store"
                )));
            }
        })
    }
}

/// How a commit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The revision became active.
    Committed,
    /// The engine refused it; nothing changed.
    Failed,
    /// A confirm timeout (or rollback) made an earlier content active again.
    RolledBack,
    /// A commit-confirmed was confirmed.
    Confirmed,
}

impl Outcome {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "COMMITTED",
            Outcome::Failed => "FAILED",
            Outcome::RolledBack => "ROLLED_BACK",
            Outcome::Confirmed => "CONFIRMED",
        }
    }
}

impl FromStr for Outcome {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "COMMITTED" => Outcome::Committed,
            "FAILED" => Outcome::Failed,
            "ROLLED_BACK" => Outcome::RolledBack,
            "CONFIRMED" => Outcome::Confirmed,
            _ => {
                return Err(Error::Internal(format!(
                    "unknown commit outcome {s:?} in store"
                )));
            }
        })
    }
}

/// Phase durations of a commit, nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// Validation.
    pub validate_ns: u64,
    /// Compilation.
    pub compile_ns: u64,
    /// The durable store transaction.
    pub persist_ns: u64,
    /// Pointer swap and writer barrier.
    pub publish_ns: u64,
    /// Waiting for mid-batch cores.
    pub quiesce_ns: u64,
    /// Counter carry.
    pub carry_ns: u64,
    /// Whole commit, wall clock.
    pub total_ns: u64,
    /// Cores waited for.
    pub cores_waited: u32,
}

/// A ruleset row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulesetRow {
    /// Name.
    pub name: String,
    /// Priority among active rulesets (lower first).
    pub priority: i32,
    /// Current etag.
    pub etag: String,
    /// Active revision number.
    pub active_revision: Option<u64>,
    /// Highest revision number.
    pub latest_revision: u64,
    /// Creation time, Unix ns.
    pub created_at: i64,
    /// Last change, Unix ns.
    pub updated_at: i64,
}

/// A revision row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionRow {
    /// Ruleset name.
    pub ruleset: String,
    /// Number, from 1.
    pub number: u64,
    /// The revision active when this one was created.
    pub parent: Option<u64>,
    /// sha256 hex of the combined content.
    pub digest: String,
    /// Canonical content.
    pub content: Content,
    /// Rules over all tables.
    pub rule_count: u32,
    /// Who created it.
    pub author: String,
    /// Why.
    pub message: String,
    /// State.
    pub state: RevisionState,
    /// Creation time, Unix ns.
    pub created_at: i64,
}

/// A commit row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitRow {
    /// Sequence number.
    pub id: i64,
    /// Ruleset.
    pub ruleset: String,
    /// The revision made active.
    pub revision: u64,
    /// The revision active before.
    pub previous: Option<u64>,
    /// Outcome.
    pub outcome: Outcome,
    /// Error text of a failed commit.
    pub error: Option<String>,
    /// Phase durations.
    pub phases: Phases,
    /// Start, Unix ns.
    pub started_at: i64,
    /// Commit-confirmed deadline, Unix ns, while pending.
    pub confirm_deadline: Option<i64>,
}

/// A new revision to store.
#[derive(Clone, Debug)]
pub struct NewRevision {
    /// Ruleset name (created on first stage).
    pub ruleset: String,
    /// Priority, stored when the ruleset is created.
    pub priority: i32,
    /// Canonical content.
    pub content: Content,
    /// Rule count.
    pub rule_count: u32,
    /// Author (the caller).
    pub author: String,
    /// Message.
    pub message: String,
}

/// What a commit makes active.
#[derive(Clone, Debug)]
pub enum CommitTarget {
    /// An existing STAGED revision.
    Staged(u64),
    /// A new revision stored in the same transaction (Apply, Rollback, confirm timeout).
    New(NewRevision),
}

/// The durable part of a commit: one transaction.
#[derive(Clone, Debug)]
pub struct PersistCommit {
    /// Ruleset name.
    pub ruleset: String,
    /// What becomes active.
    pub target: CommitTarget,
    /// ACTIVE or PENDING_CONFIRM.
    pub state: RevisionState,
    /// COMMITTED or ROLLED_BACK.
    pub outcome: Outcome,
    /// The state the previously active revision gets (SUPERSEDED, or REJECTED for a confirm
    /// timeout).
    pub previous_state: RevisionState,
    /// Commit-confirmed deadline, Unix ns.
    pub confirm_deadline: Option<i64>,
    /// When the request must still see this etag.
    pub expected_etag: Option<String>,
    /// Start of the commit, Unix ns.
    pub started_at: i64,
    /// Validation time so far.
    pub validate_ns: u64,
    /// The audit record of the call that asked for this commit, written in the same
    /// transaction (so the record and the commit are durable together, with one fsync);
    /// [`Store::revert_commit`] corrects its outcome should the engine refuse.
    pub audit: Option<AuditEntry>,
}

/// The result of [`Store::persist_commit`].
#[derive(Clone, Debug)]
pub struct Persisted {
    /// The commit row id.
    pub commit_id: i64,
    /// The ruleset after the commit.
    pub ruleset: RulesetRow,
    /// The revision made active.
    pub revision: RevisionRow,
    /// The revision active before, and its state before.
    pub previous: Option<(u64, RevisionState)>,
    /// The id of the audit record written with the commit, if one was given.
    pub audit_id: Option<i64>,
}

/// One audit record.
#[derive(Clone, Debug)]
pub struct AuditEntry {
    /// Unix ns.
    pub at: i64,
    /// Who called (from the auth hook; `anonymous` without auth).
    pub caller: String,
    /// gRPC method, e.g. `Apply`.
    pub method: String,
    /// sha256 hex of the encoded request.
    pub request_digest: String,
    /// `OK` or the error reason.
    pub outcome: String,
}

/// The store handle (cheap to clone).
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
    /// Revisions kept per ruleset (`--max-revisions-kept`); 0 keeps all.
    revisions_kept: usize,
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn etag(created_at: i64, latest: u64, active: Option<u64>) -> String {
    format!("{:x}.{latest}.{}", created_at, active.unwrap_or(0))
}

fn ruleset_row(r: &SqliteRow) -> Result<RulesetRow> {
    Ok(RulesetRow {
        name: r.try_get("name")?,
        priority: r.try_get("priority")?,
        etag: r.try_get("etag")?,
        active_revision: r.try_get::<Option<i64>, _>("active_revision")?.map(u64_of),
        latest_revision: u64_of(r.try_get("latest_revision")?),
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// A query for revisions with their chunk lists: `revisions` joined with `revision_chunks`
/// (the texts live in content-addressed chunks, see [`chunks`]; the small columns can be read
/// and updated without touching them), followed by `$tail` (a `WHERE r.…` literal). Rows go
/// through [`revision_rows`].
macro_rules! revision_select {
    ($tail:literal) => {
        concat!(
            "SELECT r.ruleset, r.number, r.parent, r.digest, c.chunks_v4, c.chunks_v6, ",
            "r.rule_count, r.author, r.message, r.state, r.created_at FROM revisions r ",
            "JOIN revision_chunks c ON c.ruleset = r.ruleset AND c.number = r.number ",
            $tail
        )
    };
}

/// Revisions from rows of [`revision_select!`], with their texts joined from the chunks.
async fn revision_rows(
    conn: &mut SqliteConnection,
    rows: &[SqliteRow],
) -> Result<Vec<RevisionRow>> {
    let mut lists = Vec::with_capacity(rows.len() * 2);
    for r in rows {
        lists.push(r.try_get::<String, _>("chunks_v4")?);
        lists.push(r.try_get::<String, _>("chunks_v6")?);
    }
    let refs: Vec<&str> = lists.iter().map(String::as_str).collect();
    let mut texts = chunks::texts(conn, &refs).await?.into_iter();
    rows.iter()
        .map(|r| {
            let (Some(v4), Some(v6)) = (texts.next(), texts.next()) else {
                return Err(Error::Internal("chunk texts missing".into()));
            };
            revision_row_with(r, Content { v4, v6 })
        })
        .collect()
}

/// A revision from a row of `revisions` alone, with `content` the caller already has.
fn revision_row_with(r: &SqliteRow, content: Content) -> Result<RevisionRow> {
    Ok(RevisionRow {
        ruleset: r.try_get("ruleset")?,
        number: u64_of(r.try_get("number")?),
        parent: r.try_get::<Option<i64>, _>("parent")?.map(u64_of),
        digest: r.try_get("digest")?,
        content,
        rule_count: u32::try_from(r.try_get::<i64, _>("rule_count")?).unwrap_or(u32::MAX),
        author: r.try_get("author")?,
        message: r.try_get("message")?,
        state: r.try_get::<String, _>("state")?.parse()?,
        created_at: r.try_get("created_at")?,
    })
}

fn commit_row(r: &SqliteRow) -> Result<CommitRow> {
    Ok(CommitRow {
        id: r.try_get("id")?,
        ruleset: r.try_get("ruleset")?,
        revision: u64_of(r.try_get("revision")?),
        previous: r.try_get::<Option<i64>, _>("previous")?.map(u64_of),
        outcome: r.try_get::<String, _>("outcome")?.parse()?,
        error: r.try_get("error")?,
        phases: Phases {
            validate_ns: u64_of(r.try_get("validate_ns")?),
            compile_ns: u64_of(r.try_get("compile_ns")?),
            persist_ns: u64_of(r.try_get("persist_ns")?),
            publish_ns: u64_of(r.try_get("publish_ns")?),
            quiesce_ns: u64_of(r.try_get("quiesce_ns")?),
            carry_ns: u64_of(r.try_get("carry_ns")?),
            total_ns: u64_of(r.try_get("total_ns")?),
            cores_waited: u32::try_from(r.try_get::<i64, _>("cores_waited")?).unwrap_or(0),
        },
        started_at: r.try_get("started_at")?,
        confirm_deadline: r.try_get("confirm_deadline")?,
    })
}

async fn ruleset_in(tx: &mut Transaction<'_, Sqlite>, name: &str) -> Result<Option<RulesetRow>> {
    let row = sqlx::query("SELECT * FROM rulesets WHERE name = ?")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
    row.as_ref().map(ruleset_row).transpose()
}

async fn revision_in(
    tx: &mut Transaction<'_, Sqlite>,
    ruleset: &str,
    number: u64,
) -> Result<Option<RevisionRow>> {
    let rows = sqlx::query(revision_select!("WHERE r.ruleset = ? AND r.number = ?"))
        .bind(ruleset)
        .bind(i64_of(number))
        .fetch_all(&mut **tx)
        .await?;
    Ok(revision_rows(tx, &rows).await?.pop())
}

/// The state of revision `number` of `ruleset`, if it exists (no text is read).
async fn revision_state_in(
    tx: &mut Transaction<'_, Sqlite>,
    ruleset: &str,
    number: u64,
) -> Result<Option<RevisionState>> {
    let row = sqlx::query("SELECT state FROM revisions WHERE ruleset = ? AND number = ?")
        .bind(ruleset)
        .bind(i64_of(number))
        .fetch_optional(&mut **tx)
        .await?;
    row.map(|r| r.try_get::<String, _>("state")?.parse())
        .transpose()
}

/// Creates the ruleset row when missing; returns it.
async fn ensure_ruleset(
    tx: &mut Transaction<'_, Sqlite>,
    name: &str,
    priority: i32,
    now: i64,
) -> Result<RulesetRow> {
    if let Some(r) = ruleset_in(tx, name).await? {
        return Ok(r);
    }
    sqlx::query(
        "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
         VALUES (?, ?, ?, NULL, 0, ?, ?)",
    )
    .bind(name)
    .bind(priority)
    .bind(etag(now, 0, None))
    .bind(now)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    ruleset_in(tx, name)
        .await?
        .ok_or_else(|| Error::Internal(format!("ruleset {name} vanished after insert")))
}

async fn insert_revision(
    tx: &mut Transaction<'_, Sqlite>,
    rs: &RulesetRow,
    new: &NewRevision,
    state: RevisionState,
    now: i64,
) -> Result<RevisionRow> {
    let number = rs.latest_revision + 1;
    let row = RevisionRow {
        ruleset: rs.name.clone(),
        number,
        parent: rs.active_revision,
        digest: new.content.digest(),
        content: new.content.clone(),
        rule_count: new.rule_count,
        author: new.author.clone(),
        message: new.message.clone(),
        state,
        created_at: now,
    };
    sqlx::query(
        "INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&row.ruleset)
    .bind(i64_of(number))
    .bind(row.parent.map(i64_of))
    .bind(&row.digest)
    .bind(i64::from(row.rule_count))
    .bind(&row.author)
    .bind(&row.message)
    .bind(state.as_str())
    .bind(now)
    .execute(&mut **tx)
    .await?;
    let (v4, v6) = chunks::put(tx, &new.content).await?;
    sqlx::query(
        "INSERT INTO revision_chunks (ruleset, number, chunks_v4, chunks_v6) VALUES (?, ?, ?, ?)",
    )
    .bind(&rs.name)
    .bind(i64_of(number))
    .bind(v4)
    .bind(v6)
    .execute(&mut **tx)
    .await?;
    Ok(row)
}

async fn set_ruleset_heads(
    tx: &mut Transaction<'_, Sqlite>,
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
    sqlx::query(
        "UPDATE rulesets SET latest_revision = ?, active_revision = ?, etag = ?, updated_at = ? WHERE name = ?",
    )
    .bind(i64_of(after.latest_revision))
    .bind(after.active_revision.map(i64_of))
    .bind(&after.etag)
    .bind(now)
    .bind(&rs.name)
    .execute(&mut **tx)
    .await?;
    Ok(after)
}

/// Deletes the oldest revisions of `ruleset` beyond `keep` (0: none), never one in
/// `protected`, the active one, one PENDING_CONFIRM, or the revision a pending confirm would
/// restore. Returns the numbers deleted.
async fn prune_revisions(
    tx: &mut Transaction<'_, Sqlite>,
    ruleset: &str,
    keep: usize,
    protected: &[u64],
) -> Result<Vec<u64>> {
    if keep == 0 {
        return Ok(Vec::new());
    }
    // One row (`1,2,...`): sqlx-sqlite hands each result row over a channel, and this runs
    // in every commit's transaction over up to `keep` + 1 revisions.
    let numbers: Option<String> =
        sqlx::query("SELECT group_concat(number) FROM revisions WHERE ruleset = ?")
            .bind(ruleset)
            .fetch_one(&mut **tx)
            .await?
            .try_get(0)?;
    let numbers: Vec<u64> = numbers
        .iter()
        .flat_map(|n| n.split(','))
        .map(|n| {
            n.parse()
                .map_err(|_| Error::Internal(format!("revision number {n:?}")))
        })
        .collect::<Result<_>>()?;
    if numbers.len() <= keep {
        return Ok(Vec::new());
    }
    let mut protect = protected.to_vec();
    let held = sqlx::query(
        "SELECT active_revision AS n FROM rulesets WHERE name = ?1 AND active_revision IS NOT NULL \
         UNION SELECT number FROM revisions WHERE ruleset = ?1 AND state = 'PENDING_CONFIRM' \
         UNION SELECT previous FROM commits WHERE ruleset = ?1 AND confirm_deadline IS NOT NULL \
               AND previous IS NOT NULL",
    )
    .bind(ruleset)
    .fetch_all(&mut **tx)
    .await?;
    for r in &held {
        protect.push(u64_of(r.try_get::<i64, _>(0)?));
    }
    let prune = crate::limits::revisions_to_prune(&numbers, &protect, keep);
    for n in &prune {
        let lists = sqlx::query(
            "DELETE FROM revision_chunks WHERE ruleset = ? AND number = ? RETURNING chunks_v4, chunks_v6",
        )
        .bind(ruleset)
        .bind(i64_of(*n))
        .fetch_all(&mut **tx)
        .await?;
        release_lists(tx, &lists).await?;
        sqlx::query("DELETE FROM revisions WHERE ruleset = ? AND number = ?")
            .bind(ruleset)
            .bind(i64_of(*n))
            .execute(&mut **tx)
            .await?;
    }
    Ok(prune)
}

/// Appends an audit record; returns its id.
async fn insert_audit(conn: &mut SqliteConnection, e: &AuditEntry) -> Result<i64> {
    let id = sqlx::query(
        "INSERT INTO audit (at, caller, method, request_digest, outcome) VALUES (?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(e.at)
    .bind(&e.caller)
    .bind(&e.method)
    .bind(&e.request_digest)
    .bind(&e.outcome)
    .fetch_one(&mut *conn)
    .await?
    .try_get("id")?;
    Ok(id)
}

/// Releases the chunks named by deleted `revision_chunks` rows (`chunks_v4`, `chunks_v6`).
async fn release_lists(conn: &mut SqliteConnection, rows: &[SqliteRow]) -> Result<()> {
    let mut lists = Vec::with_capacity(rows.len() * 2);
    for r in rows {
        lists.push(r.try_get::<String, _>("chunks_v4")?);
        lists.push(r.try_get::<String, _>("chunks_v6")?);
    }
    chunks::release(conn, &lists).await
}

async fn set_state(
    tx: &mut Transaction<'_, Sqlite>,
    ruleset: &str,
    number: u64,
    state: RevisionState,
) -> Result<()> {
    sqlx::query("UPDATE revisions SET state = ? WHERE ruleset = ? AND number = ?")
        .bind(state.as_str())
        .bind(ruleset)
        .bind(i64_of(number))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn check_etag(rs: &RulesetRow, expected: Option<&str>) -> Result<()> {
    match expected {
        Some(e) if !e.is_empty() && e != rs.etag => Err(Error::EtagMismatch {
            name: format!("rulesets/{}", rs.name),
            given: e.to_string(),
            current: rs.etag.clone(),
        }),
        _ => Ok(()),
    }
}

// === impl Store ===

impl Store {
    /// Opens (creating it and its directory when missing) the database at `path`, in WAL mode
    /// with `synchronous = FULL`, and applies pending migrations.
    ///
    /// Errors: [`Error::Store`] when the file cannot be opened, [`Error::Migrate`] when a
    /// migration fails, [`Error::Internal`] when the directory cannot be created.
    pub async fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Internal(format!("create {}: {e}", dir.display())))?;
        }
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            // A local file has no connection to lose: no ping round trip to the connection's
            // worker thread before every use.
            .test_before_acquire(false)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("../migrations").run(&pool).await?;
        Ok(Store {
            pool,
            revisions_kept: 0,
        })
    }

    /// This store, keeping at most `n` revisions per ruleset (0: all): every transaction that
    /// adds a revision deletes the oldest ones beyond `n`, never the active revision, one
    /// waiting for confirmation, the revision a pending confirm would restore, nor the
    /// revision the transaction itself made or replaced (see [`crate::limits::revisions_to_prune`]).
    pub fn with_revisions_kept(mut self, n: usize) -> Store {
        self.revisions_kept = n;
        self
    }

    /// Closes the pool (waits for connections to finish).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// One ruleset.
    ///
    /// Errors: [`Error::Store`].
    pub async fn get_ruleset(&self, name: &str) -> Result<Option<RulesetRow>> {
        let row = sqlx::query("SELECT * FROM rulesets WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(ruleset_row).transpose()
    }

    /// Every ruleset, by name.
    ///
    /// Errors: [`Error::Store`].
    pub async fn list_rulesets(&self) -> Result<Vec<RulesetRow>> {
        let rows = sqlx::query("SELECT * FROM rulesets ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(ruleset_row).collect()
    }

    /// One revision.
    ///
    /// Errors: [`Error::Store`].
    pub async fn get_revision(&self, ruleset: &str, number: u64) -> Result<Option<RevisionRow>> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(revision_select!("WHERE r.ruleset = ? AND r.number = ?"))
            .bind(ruleset)
            .bind(i64_of(number))
            .fetch_all(&mut *conn)
            .await?;
        Ok(revision_rows(&mut conn, &rows).await?.pop())
    }

    /// Revisions with `number > after`, ascending, at most `limit`.
    ///
    /// Errors: [`Error::Store`].
    pub async fn list_revisions(
        &self,
        ruleset: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<RevisionRow>> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(revision_select!(
            "WHERE r.ruleset = ? AND r.number > ? ORDER BY r.number LIMIT ?"
        ))
        .bind(ruleset)
        .bind(i64_of(after))
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
        revision_rows(&mut conn, &rows).await
    }

    /// The rulesets with an active revision, with that revision: what the engine must run.
    ///
    /// Errors: [`Error::Store`].
    pub async fn active(&self) -> Result<Vec<(RulesetRow, RevisionRow)>> {
        let mut out = Vec::new();
        for rs in self.list_rulesets().await? {
            if let Some(n) = rs.active_revision {
                let rev = self.get_revision(&rs.name, n).await?.ok_or_else(|| {
                    Error::Internal(format!("active revision {n} of {} is missing", rs.name))
                })?;
                out.push((rs, rev));
            }
        }
        Ok(out)
    }

    /// Stores a STAGED revision (creating the ruleset on first use).
    ///
    /// Errors: [`Error::EtagMismatch`] when `expected_etag` is given and differs;
    /// [`Error::Store`].
    pub async fn stage(
        &self,
        new: &NewRevision,
        expected_etag: Option<&str>,
    ) -> Result<(RulesetRow, RevisionRow)> {
        let now = now_ns();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let rs = ensure_ruleset(&mut tx, &new.ruleset, new.priority, now).await?;
        check_etag(&rs, expected_etag)?;
        // The rows written here are known: nothing is read back.
        let rev = insert_revision(&mut tx, &rs, new, RevisionState::Staged, now).await?;
        let rs = set_ruleset_heads(&mut tx, &rs, rev.number, rs.active_revision, now).await?;
        prune_revisions(&mut tx, &new.ruleset, self.revisions_kept, &[rev.number]).await?;
        tx.commit().await?;
        Ok((rs, rev))
    }

    /// The durable half of a commit, in one transaction that is on disk when this returns:
    /// the target revision gets `state`, the previous active one `previous_state`, the
    /// ruleset points at the target, pending confirm deadlines of the ruleset are cleared
    /// (a new commit settles them), and a commit row is written.
    ///
    /// Errors: [`Error::NotFound`] for a missing ruleset or revision,
    /// [`Error::Precondition`] when a revision to commit is not STAGED,
    /// [`Error::EtagMismatch`], [`Error::Store`].
    pub async fn persist_commit(&self, c: &PersistCommit) -> Result<Persisted> {
        let now = now_ns();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let rs = match &c.target {
            CommitTarget::New(new) => {
                ensure_ruleset(&mut tx, &c.ruleset, new.priority, now).await?
            }
            CommitTarget::Staged(_) => {
                ruleset_in(&mut tx, &c.ruleset)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        kind: "ruleset",
                        name: format!("rulesets/{}", c.ruleset),
                    })?
            }
        };
        check_etag(&rs, c.expected_etag.as_deref())?;
        // A new revision's row is the one written here: it is not read back.
        let mut written = None;
        let number = match &c.target {
            CommitTarget::New(new) => {
                let rev = insert_revision(&mut tx, &rs, new, c.state, now).await?;
                let n = rev.number;
                written = Some(rev);
                n
            }
            CommitTarget::Staged(n) => {
                let state = revision_state_in(&mut tx, &c.ruleset, *n)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        kind: "revision",
                        name: format!("rulesets/{}/revisions/{n}", c.ruleset),
                    })?;
                if state != RevisionState::Staged {
                    return Err(Error::Precondition {
                        kind: "REVISION_STATE",
                        subject: format!("rulesets/{}/revisions/{n}", c.ruleset),
                        message: format!(
                            "revision is {}, only STAGED revisions can be committed (use Rollback to reactivate an earlier one)",
                            state.as_str()
                        ),
                    });
                }
                set_state(&mut tx, &c.ruleset, *n, c.state).await?;
                *n
            }
        };
        let mut previous = None;
        if let Some(p) = rs.active_revision.filter(|p| *p != number) {
            if let Some(state) = revision_state_in(&mut tx, &c.ruleset, p).await? {
                previous = Some((p, state));
                set_state(&mut tx, &c.ruleset, p, c.previous_state).await?;
            }
        }
        sqlx::query(
            "UPDATE commits SET confirm_deadline = NULL WHERE ruleset = ? AND confirm_deadline IS NOT NULL",
        )
        .bind(&c.ruleset)
        .execute(&mut *tx)
        .await?;
        let latest = rs.latest_revision.max(number);
        let ruleset = set_ruleset_heads(&mut tx, &rs, latest, Some(number), now).await?;
        let commit_id: i64 = sqlx::query(
            "INSERT INTO commits (ruleset, revision, previous, outcome, validate_ns, started_at, confirm_deadline) \
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(&c.ruleset)
        .bind(i64_of(number))
        .bind(previous.map(|(p, _)| i64_of(p)))
        .bind(c.outcome.as_str())
        .bind(i64_of(c.validate_ns))
        .bind(c.started_at)
        .bind(c.confirm_deadline)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        let audit_id = match &c.audit {
            Some(a) => Some(insert_audit(&mut tx, a).await?),
            None => None,
        };
        // The previous active revision stays: revert_commit restores it if the engine refuses.
        let mut keep = vec![number];
        keep.extend(rs.active_revision);
        prune_revisions(&mut tx, &c.ruleset, self.revisions_kept, &keep).await?;
        let revision = match written {
            Some(rev) => rev,
            None => revision_in(&mut tx, &c.ruleset, number)
                .await?
                .ok_or_else(|| Error::Internal("committed revision vanished".into()))?,
        };
        tx.commit().await?;
        Ok(Persisted {
            commit_id,
            ruleset,
            revision,
            previous,
            audit_id,
        })
    }

    /// Records the phase durations of a commit after publish.
    ///
    /// Errors: [`Error::Store`].
    pub async fn finish_commit(&self, commit_id: i64, p: &Phases) -> Result<()> {
        sqlx::query(
            "UPDATE commits SET validate_ns = ?, compile_ns = ?, persist_ns = ?, publish_ns = ?, \
             quiesce_ns = ?, carry_ns = ?, total_ns = ?, cores_waited = ? WHERE id = ?",
        )
        .bind(i64_of(p.validate_ns))
        .bind(i64_of(p.compile_ns))
        .bind(i64_of(p.persist_ns))
        .bind(i64_of(p.publish_ns))
        .bind(i64_of(p.quiesce_ns))
        .bind(i64_of(p.carry_ns))
        .bind(i64_of(p.total_ns))
        .bind(i64::from(p.cores_waited))
        .bind(commit_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Undoes [`Store::persist_commit`] when the engine refused the commit: the revision is
    /// REJECTED, the previous one active again, the commit row FAILED with `error`, and the
    /// audit record written with the commit (if any) gets `outcome` (a reason name).
    ///
    /// Errors: [`Error::Store`].
    pub async fn revert_commit(&self, p: &Persisted, error: &str, outcome: &str) -> Result<()> {
        let now = now_ns();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(id) = p.audit_id {
            sqlx::query("UPDATE audit SET outcome = ? WHERE id = ?")
                .bind(outcome)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        let name = &p.ruleset.name;
        set_state(&mut tx, name, p.revision.number, RevisionState::Rejected).await?;
        if let Some((prev, state)) = p.previous {
            set_state(&mut tx, name, prev, state).await?;
        }
        if let Some(rs) = ruleset_in(&mut tx, name).await? {
            set_ruleset_heads(
                &mut tx,
                &rs,
                rs.latest_revision,
                p.previous.map(|x| x.0),
                now,
            )
            .await?;
        }
        sqlx::query("UPDATE commits SET outcome = 'FAILED', error = ?, confirm_deadline = NULL WHERE id = ?")
            .bind(error)
            .bind(p.commit_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deactivates a ruleset whose first commit was not confirmed in time: no revision is
    /// active afterwards, `revision` is REJECTED and a ROLLED_BACK commit row is written.
    ///
    /// Errors: [`Error::Store`].
    pub async fn deactivate(&self, ruleset: &str, revision: u64, started_at: i64) -> Result<i64> {
        let now = now_ns();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        set_state(&mut tx, ruleset, revision, RevisionState::Rejected).await?;
        if let Some(rs) = ruleset_in(&mut tx, ruleset).await? {
            set_ruleset_heads(&mut tx, &rs, rs.latest_revision, None, now).await?;
        }
        sqlx::query(
            "UPDATE commits SET confirm_deadline = NULL WHERE ruleset = ? AND confirm_deadline IS NOT NULL",
        )
        .bind(ruleset)
        .execute(&mut *tx)
        .await?;
        let id: i64 = sqlx::query(
            "INSERT INTO commits (ruleset, revision, previous, outcome, started_at) VALUES (?, ?, ?, 'ROLLED_BACK', ?) RETURNING id",
        )
        .bind(ruleset)
        .bind(i64_of(revision))
        .bind(i64_of(revision))
        .bind(started_at)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        tx.commit().await?;
        Ok(id)
    }

    /// Confirms the pending commit of `revision`: the revision becomes ACTIVE and the commit
    /// row CONFIRMED. Returns the revision, or `None` when no commit of it is pending.
    ///
    /// Errors: [`Error::Store`].
    pub async fn confirm(&self, ruleset: &str, revision: u64) -> Result<Option<RevisionRow>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let done = sqlx::query(
            "UPDATE commits SET outcome = 'CONFIRMED', confirm_deadline = NULL \
             WHERE ruleset = ? AND revision = ? AND confirm_deadline IS NOT NULL",
        )
        .bind(ruleset)
        .bind(i64_of(revision))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done == 0 {
            return Ok(None);
        }
        set_state(&mut tx, ruleset, revision, RevisionState::Active).await?;
        let rev = revision_in(&mut tx, ruleset, revision).await?;
        tx.commit().await?;
        Ok(rev)
    }

    /// Commits waiting for ConfirmCommit, earliest deadline first.
    ///
    /// Errors: [`Error::Store`].
    pub async fn pending_confirms(&self) -> Result<Vec<CommitRow>> {
        let rows = sqlx::query(
            "SELECT * FROM commits WHERE confirm_deadline IS NOT NULL ORDER BY confirm_deadline",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(commit_row).collect()
    }

    /// The commit rows of a ruleset, oldest first.
    ///
    /// Errors: [`Error::Store`].
    pub async fn commits(&self, ruleset: &str) -> Result<Vec<CommitRow>> {
        let rows = sqlx::query("SELECT * FROM commits WHERE ruleset = ? ORDER BY id")
            .bind(ruleset)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(commit_row).collect()
    }

    /// Deletes a ruleset with its revisions and commit rows. Returns whether it existed.
    ///
    /// Errors: [`Error::EtagMismatch`], [`Error::Store`].
    pub async fn delete_ruleset(&self, name: &str, expected_etag: Option<&str>) -> Result<bool> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let Some(rs) = ruleset_in(&mut tx, name).await? else {
            return Ok(false);
        };
        check_etag(&rs, expected_etag)?;
        let lists = sqlx::query(
            "DELETE FROM revision_chunks WHERE ruleset = ? RETURNING chunks_v4, chunks_v6",
        )
        .bind(name)
        .fetch_all(&mut *tx)
        .await?;
        release_lists(&mut tx, &lists).await?;
        sqlx::query("DELETE FROM revisions WHERE ruleset = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM commits WHERE ruleset = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM rulesets WHERE name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The stored response of an earlier call with this request id.
    ///
    /// Errors: [`Error::Store`].
    pub async fn idempotent_get(&self, method: &str, request_id: &str) -> Result<Option<Vec<u8>>> {
        let row =
            sqlx::query("SELECT response FROM idempotency WHERE method = ? AND request_id = ?")
                .bind(method)
                .bind(request_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| r.try_get("response")).transpose()?)
    }

    /// Stores the response of a call with this request id (the first one wins).
    ///
    /// Errors: [`Error::Store`].
    pub async fn idempotent_put(
        &self,
        method: &str,
        request_id: &str,
        response: &[u8],
    ) -> Result<()> {
        sqlx::query(
            "INSERT OR IGNORE INTO idempotency (method, request_id, response, created_at) VALUES (?, ?, ?, ?)",
        )
        .bind(method)
        .bind(request_id)
        .bind(response)
        .bind(now_ns())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Appends an audit record.
    ///
    /// Errors: [`Error::Store`].
    pub async fn audit(&self, e: &AuditEntry) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        insert_audit(&mut conn, e).await?;
        Ok(())
    }

    /// Number of audit records (for tests and status).
    ///
    /// Errors: [`Error::Store`].
    pub async fn audit_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM audit")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        Ok(u64_of(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::AssertSqlSafe;

    fn new_rev(name: &str, text: &str) -> NewRevision {
        NewRevision {
            ruleset: name.into(),
            priority: 0,
            content: Content {
                v4: text.into(),
                v6: String::new(),
            },
            rule_count: 1,
            author: "test".into(),
            message: "m".into(),
        }
    }

    fn commit(name: &str, target: CommitTarget) -> PersistCommit {
        PersistCommit {
            ruleset: name.into(),
            target,
            state: RevisionState::Active,
            outcome: Outcome::Committed,
            previous_state: RevisionState::Superseded,
            confirm_deadline: None,
            expected_etag: None,
            started_at: now_ns(),
            validate_ns: 1,
            audit: None,
        }
    }

    /// A store written before the texts moved to `revision_content` opens with every revision
    /// and its text intact.
    #[tokio::test]
    async fn revision_texts_survive_the_content_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.db");
        {
            let opts = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            let pool = SqlitePoolOptions::new().connect_with(opts).await.unwrap();
            sqlx::migrate!("../migrations")
                .run_to(20261130070000, &pool)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
                 VALUES ('a', 0, 'e', 2, 2, 1, 1)",
            )
            .execute(&pool)
            .await
            .unwrap();
            for (n, v4, state) in [
                (1, "*filter\n-A INPUT -j DROP\nCOMMIT\n", "SUPERSEDED"),
                (2, "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n", "ACTIVE"),
            ] {
                sqlx::query(
                    "INSERT INTO revisions (ruleset, number, parent, digest, content_v4, content_v6, rule_count, author, message, state, created_at) \
                     VALUES ('a', ?, NULL, 'd', ?, '*filter\nCOMMIT\n', 1, 'me', 'm', ?, 1)",
                )
                .bind(n)
                .bind(v4)
                .bind(state)
                .execute(&pool)
                .await
                .unwrap();
            }
            pool.close().await;
        }
        let store = Store::open(&path).await.unwrap();
        let r1 = store.get_revision("a", 1).await.unwrap().unwrap();
        assert_eq!(r1.content.v4, "*filter\n-A INPUT -j DROP\nCOMMIT\n");
        assert_eq!(r1.content.v6, "*filter\nCOMMIT\n");
        assert_eq!(r1.state, RevisionState::Superseded);
        let listed = store.list_revisions("a", 0, 10).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(
            listed[1].content.v4,
            "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"
        );
        let (rs, active) = store.active().await.unwrap().remove(0);
        assert_eq!((rs.name.as_str(), active.number), ("a", 2));
        assert_eq!(active.content.v4, listed[1].content.v4);
        // The old texts became one chunk each (4 texts); deleting the ruleset frees them.
        assert_eq!(chunk_count(&store).await, (4, 4));
        assert!(store.delete_ruleset("a", None).await.unwrap());
        assert_eq!(chunk_count(&store).await, (0, 0));
    }

    /// Rows of `chunks` and `chunk_texts`.
    async fn chunk_count(store: &Store) -> (i64, i64) {
        let n = |t: &'static str| async move {
            sqlx::query(AssertSqlSafe(format!("SELECT COUNT(*) FROM {t}")))
                .fetch_one(&store.pool)
                .await
                .unwrap()
                .get::<i64, _>(0)
        };
        (n("chunks").await, n("chunk_texts").await)
    }

    /// Revisions that differ in a few rules share their other chunks; pruning and deleting
    /// release exactly the chunks no kept revision names, and every kept text reads back
    /// byte for byte.
    #[tokio::test]
    async fn revisions_share_chunks_and_release_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db"))
            .await
            .unwrap()
            .with_revisions_kept(3);
        let text = |k: usize| {
            let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
            for i in 0..3000 {
                let port = if i == 1500 { 10_000 + k } else { i };
                s.push_str(&format!(
                    "-A INPUT -s 10.0.{}.0/24 -p tcp -m tcp --dport {port} -j ACCEPT\n",
                    i % 256
                ));
            }
            s + "COMMIT\n"
        };
        let mut texts = Vec::new();
        for k in 0..6 {
            let mut rev = new_rev("a", &text(k));
            // The IPv6 text is the same in every revision: all its chunks are shared.
            rev.content.v6 = text(0).replace("10.0.", "2001:db8::");
            texts.push(rev.content.clone());
            store
                .persist_commit(&commit("a", CommitTarget::New(rev)))
                .await
                .unwrap();
        }
        let kept = store.list_revisions("a", 0, 100).await.unwrap();
        assert_eq!(kept.iter().map(|r| r.number).collect::<Vec<_>>(), [4, 5, 6]);
        for r in &kept {
            assert_eq!(r.content, texts[r.number as usize - 1]);
        }
        // One copy of each text plus the changed chunk of each kept revision.
        let one =
            chunks::split(&texts[0].v4).len() as i64 + chunks::split(&texts[0].v6).len() as i64;
        let (c, t) = chunk_count(&store).await;
        assert_eq!(c, t);
        assert!(
            c >= one && c <= one + 2 * 3,
            "{c} chunks for {one} per revision"
        );
        let refs: i64 = sqlx::query("SELECT SUM(refs) FROM chunks")
            .fetch_one(&store.pool)
            .await
            .unwrap()
            .get(0);
        let distinct = |t: &str| {
            chunks::split(t)
                .into_iter()
                .collect::<std::collections::HashSet<_>>()
                .len() as i64
        };
        let expect: i64 = kept
            .iter()
            .map(|r| distinct(&r.content.v4) + distinct(&r.content.v6))
            .sum();
        assert_eq!(refs, expect);
        assert!(store.delete_ruleset("a", None).await.unwrap());
        assert_eq!(chunk_count(&store).await, (0, 0));
    }

    #[tokio::test]
    async fn prunes_old_revisions_but_never_active_pending_or_restore_target() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db"))
            .await
            .unwrap()
            .with_revisions_kept(2);
        let text = "*filter\nCOMMIT\n";
        let numbers = |store: Store| async move {
            let mut out = Vec::new();
            for n in 1..=6 {
                if store.get_revision("a", n).await.unwrap().is_some() {
                    out.push(n);
                }
            }
            out
        };
        store
            .persist_commit(&commit("a", CommitTarget::New(new_rev("a", text))))
            .await
            .unwrap();
        // Revision 2 waits for confirmation; 1 is what a timeout would restore.
        store
            .persist_commit(&PersistCommit {
                state: RevisionState::PendingConfirm,
                confirm_deadline: Some(i64::MAX),
                ..commit("a", CommitTarget::New(new_rev("a", text)))
            })
            .await
            .unwrap();
        store.stage(&new_rev("a", text), None).await.unwrap();
        assert_eq!(numbers(store.clone()).await, vec![1, 2, 3]);
        store.stage(&new_rev("a", text), None).await.unwrap();
        assert_eq!(numbers(store.clone()).await, vec![1, 2, 4]);
        // A plain commit settles the pending one: only it and the replaced active one stay.
        store
            .persist_commit(&commit("a", CommitTarget::New(new_rev("a", text))))
            .await
            .unwrap();
        assert_eq!(numbers(store.clone()).await, vec![2, 5]);
    }

    #[tokio::test]
    async fn stage_commit_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/v.db");
        let store = Store::open(&path).await.unwrap();
        let (rs, r1) = store
            .stage(&new_rev("a", "*filter\nCOMMIT\n"), None)
            .await
            .unwrap();
        assert_eq!(r1.number, 1);
        assert_eq!(r1.state, RevisionState::Staged);
        assert!(matches!(
            store.stage(&new_rev("a", "x"), Some("nope")).await,
            Err(Error::EtagMismatch { .. })
        ));
        let p = store
            .persist_commit(&commit("a", CommitTarget::Staged(1)))
            .await
            .unwrap();
        assert_eq!(p.ruleset.active_revision, Some(1));
        assert_ne!(p.ruleset.etag, rs.etag);
        // Committing it again is refused.
        assert!(matches!(
            store
                .persist_commit(&commit("a", CommitTarget::Staged(1)))
                .await,
            Err(Error::Precondition { .. })
        ));
        // The audit record goes in with the commit.
        let p2 = store
            .persist_commit(&PersistCommit {
                audit: Some(AuditEntry {
                    at: 1,
                    caller: "me".into(),
                    method: "Apply".into(),
                    request_digest: "d".into(),
                    outcome: "OK".into(),
                }),
                ..commit("a", CommitTarget::New(new_rev("a", "y")))
            })
            .await
            .unwrap();
        assert_eq!(store.audit_count().await.unwrap(), 1);
        assert_eq!(p2.revision.number, 2);
        assert_eq!(p2.previous, Some((1, RevisionState::Active)));
        store
            .finish_commit(p2.commit_id, &Phases::default())
            .await
            .unwrap();
        store.close().await;

        let store = Store::open(&path).await.unwrap();
        let active = store.active().await.unwrap();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].1.number, 2);
        assert_eq!(
            store.get_revision("a", 1).await.unwrap().unwrap().state,
            RevisionState::Superseded
        );
        assert_eq!(store.commits("a").await.unwrap().len(), 2);
        store
            .revert_commit(&p2, "boom", "COMMIT_FAILED")
            .await
            .unwrap();
        let outcome: String = sqlx::query("SELECT outcome FROM audit WHERE id = ?")
            .bind(p2.audit_id.expect("audit id"))
            .fetch_one(&store.pool)
            .await
            .unwrap()
            .get(0);
        assert_eq!(outcome, "COMMIT_FAILED");
        assert_eq!(
            store
                .get_ruleset("a")
                .await
                .unwrap()
                .unwrap()
                .active_revision,
            Some(1)
        );
        assert!(store.delete_ruleset("a", None).await.unwrap());
        assert!(store.list_rulesets().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn confirm_and_idempotency() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db")).await.unwrap();
        let mut c = commit("a", CommitTarget::New(new_rev("a", "x")));
        c.state = RevisionState::PendingConfirm;
        c.confirm_deadline = Some(now_ns() + 1_000_000_000);
        store.persist_commit(&c).await.unwrap();
        assert_eq!(store.pending_confirms().await.unwrap().len(), 1);
        assert!(store.confirm("a", 1).await.unwrap().is_some());
        assert!(store.confirm("a", 1).await.unwrap().is_none());
        assert!(store.pending_confirms().await.unwrap().is_empty());
        store.idempotent_put("Apply", "r1", b"one").await.unwrap();
        store.idempotent_put("Apply", "r1", b"two").await.unwrap();
        assert_eq!(
            store.idempotent_get("Apply", "r1").await.unwrap().unwrap(),
            b"one"
        );
        assert!(store.idempotent_get("Stage", "r1").await.unwrap().is_none());
    }
}
