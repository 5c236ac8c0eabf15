//! The SQLite store: every query of the server lives in this module.
//!
//! The database is opened in WAL mode with `synchronous = FULL`, so a transaction is durable
//! when its commit returns (the commit pipeline relies on that: the revision and commit rows are
//! durable before the engine publishes). Migrations from `migrations/` at the workspace root are
//! embedded and applied at open. Times are Unix nanoseconds, durations nanoseconds.
//!
//! One driver, rusqlite (with its own bundled SQLite), for everything: every write
//! transaction runs on one writer connection and every read in one read transaction on one of
//! a few reader connections, each in one hop to a blocking thread (see [`writer`] for why
//! not sqlx, with the measurements); migrations run on the writer at open ([`migrate`]).
//! Writers are serialised by the writer connection (and by the pipeline's write lock before
//! it); readers never wait (WAL).

use std::path::Path;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::control::content::Content;
use crate::control::outcome::Outcome;
use crate::error::{Error, Result};

pub mod chunks;
mod migrate;
pub mod sets;
mod writer;

use writer::{Readers, Writer};

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

/// Phase durations of a commit, nanoseconds: the one type for them, stored in the commit
/// rows, sent as the API's `CommitPhases` ([`crate::grpc::convert::phases`]) and recorded as
/// `vallum_commit_duration_seconds{phase}` ([`crate::telemetry::metrics::Metrics::record_commit`]).
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

impl Phases {
    /// Every phase but `total` with its `phase` label value.
    pub fn labelled(&self) -> [(&'static str, u64); 6] {
        [
            ("validate", self.validate_ns),
            ("compile", self.compile_ns),
            ("persist", self.persist_ns),
            ("publish", self.publish_ns),
            ("quiesce", self.quiesce_ns),
            ("carry", self.carry_ns),
        ]
    }
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
    /// COMMITTED, ROLLED_BACK (a Rollback) or REVERTED (a confirm deadline passed).
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
    /// The ruleset's new priority, set in the same transaction (UpdateRuleset of an active
    /// ruleset); `None` keeps it.
    pub priority: Option<i32>,
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

/// An active revision that did not load at start: the store names it active, the engine
/// does not run it (table `load_failures`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadFailure {
    /// Ruleset name.
    pub ruleset: String,
    /// The active revision that did not load.
    pub revision: u64,
    /// Why (parse, validation or store error).
    pub error: String,
    /// When it was found, Unix ns.
    pub at: i64,
}

/// The store handle (cheap to clone).
#[derive(Clone, Debug)]
pub struct Store {
    /// The connections reads run on (see [`writer`]).
    readers: Readers,
    /// The connection write transactions run on (see [`writer`]).
    writer: Writer,
    /// Revisions kept per ruleset (`--max-revisions-kept`); 0 keeps all.
    revisions_kept: usize,
    /// How long idempotency keys live and how much audit is kept (see [`Retention`]).
    retention: Retention,
}

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

/// Reader connections (reads run in parallel up to this many).
const READERS: usize = 4;

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A ruleset's etag: what a client can change of it (its revisions, the active one, its
/// priority) under its creation time.
fn etag(created_at: i64, latest: u64, active: Option<u64>, priority: i32) -> String {
    format!(
        "{:x}.{latest}.{}.{priority}",
        created_at,
        active.unwrap_or(0)
    )
}

/// The one mapper of a `rulesets` row (`SELECT *`).
fn ruleset_row(r: &Row<'_>) -> rusqlite::Result<RulesetRow> {
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

/// The small columns of revisions (the texts live in content-addressed chunks, see
/// [`chunks`]; they can be read and updated without touching them), followed by `$tail` (a
/// `WHERE …` literal). Rows go through [`revision_rows`].
macro_rules! revision_select {
    ($tail:literal) => {
        concat!(
            "SELECT ruleset, number, parent, digest, rule_count, author, message, state, ",
            "created_at FROM revisions ",
            $tail
        )
    };
}

/// Revisions from the rows of `stmt` (a [`revision_select!`]) with `args`, with their texts
/// joined from the chunks, in the caller's read transaction.
fn revision_rows<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    args: P,
) -> Result<Vec<RevisionRow>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt
        .query_map(args, |r| {
            Ok(RevisionRow {
                ruleset: r.get("ruleset")?,
                number: u64_of(r.get("number")?),
                parent: r.get::<_, Option<i64>>("parent")?.map(u64_of),
                digest: r.get("digest")?,
                content: Content::default(),
                rule_count: u32::try_from(r.get::<_, i64>("rule_count")?).unwrap_or(u32::MAX),
                author: r.get("author")?,
                message: r.get("message")?,
                state: RevisionState::Staged,
                created_at: r.get("created_at")?,
            })
            .map(|row| (row, r.get::<_, String>("state")))
        })?
        .map(|x| {
            let (mut row, state) = x?;
            row.state = state?.parse()?;
            Ok(row)
        })
        .collect::<Result<Vec<RevisionRow>>>()?;
    let keys: Vec<(&str, i64)> = rows
        .iter()
        .map(|r| (r.ruleset.as_str(), i64_of(r.number)))
        .collect();
    let contents = chunks::contents(conn, &keys)?;
    for (row, content) in rows.iter_mut().zip(contents) {
        row.content = content;
    }
    Ok(rows)
}

/// The one mapper of a `commits` row (`SELECT *`).
fn commit_row(r: &Row<'_>) -> rusqlite::Result<(CommitRow, String)> {
    Ok((
        CommitRow {
            id: r.get("id")?,
            ruleset: r.get("ruleset")?,
            revision: u64_of(r.get("revision")?),
            previous: r.get::<_, Option<i64>>("previous")?.map(u64_of),
            outcome: Outcome::Committed,
            error: r.get("error")?,
            phases: Phases {
                validate_ns: u64_of(r.get("validate_ns")?),
                compile_ns: u64_of(r.get("compile_ns")?),
                persist_ns: u64_of(r.get("persist_ns")?),
                publish_ns: u64_of(r.get("publish_ns")?),
                quiesce_ns: u64_of(r.get("quiesce_ns")?),
                carry_ns: u64_of(r.get("carry_ns")?),
                total_ns: u64_of(r.get("total_ns")?),
                cores_waited: u32::try_from(r.get::<_, i64>("cores_waited")?).unwrap_or(0),
            },
            started_at: r.get("started_at")?,
            confirm_deadline: r.get("confirm_deadline")?,
        },
        r.get("outcome")?,
    ))
}

/// The commit rows of `sql` with `args`.
fn commit_rows<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    args: P,
) -> Result<Vec<CommitRow>> {
    conn.prepare_cached(sql)?
        .query_map(args, commit_row)?
        .map(|x| {
            let (mut row, outcome) = x?;
            row.outcome = outcome.parse()?;
            Ok(row)
        })
        .collect()
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

/// The transaction of [`Store::persist_commit`]; returns the result and, for a STAGED
/// target, its number (its text is read after the commit).
fn persist_commit_in(
    tx: &writer::Tx<'_>,
    c: PersistCommit,
    keep: usize,
) -> Result<(Persisted, Option<u64>)> {
    let now = now_ns();
    let rs = match &c.target {
        CommitTarget::New(new) => writer::ensure_ruleset(tx, &c.ruleset, new.priority, now)?,
        CommitTarget::Staged(_) => writer::existing_ruleset(tx, &c.ruleset)?,
    };
    check_etag(&rs, c.expected_etag.as_deref())?;
    // The etag is made again with the heads below.
    let rs = match c.priority {
        Some(p) => writer::set_priority(tx, rs, p)?,
        None => rs,
    };
    let (revision, staged) = match c.target {
        // A new revision's row is the one written here: it is not read back.
        CommitTarget::New(new) => (
            Some(writer::insert_revision(tx, &rs, new, c.state, now)?),
            None,
        ),
        CommitTarget::Staged(n) => {
            let state =
                writer::revision_state(tx, &c.ruleset, n)?.ok_or_else(|| Error::NotFound {
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
            writer::set_state(tx, &c.ruleset, n, c.state)?;
            (None, Some(n))
        }
    };
    let number = revision
        .as_ref()
        .map_or_else(|| staged.unwrap_or(0), |r| r.number);
    let mut previous = None;
    if let Some(p) = rs.active_revision.filter(|p| *p != number) {
        if let Some(state) = writer::revision_state(tx, &c.ruleset, p)? {
            previous = Some((p, state));
            writer::set_state(tx, &c.ruleset, p, c.previous_state)?;
        }
    }
    writer::clear_deadlines(tx, &c.ruleset)?;
    let latest = rs.latest_revision.max(number);
    let ruleset = writer::set_ruleset_heads(tx, &rs, latest, Some(number), now)?;
    tx.prepare_cached(
        "INSERT INTO commits (ruleset, revision, previous, outcome, validate_ns, started_at, confirm_deadline) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        c.ruleset,
        i64_of(number),
        previous.map(|(p, _)| i64_of(p)),
        c.outcome.as_str(),
        i64_of(c.validate_ns),
        c.started_at,
        c.confirm_deadline
    ])?;
    let commit_id = tx.last_insert_rowid();
    let audit_id = c
        .audit
        .as_ref()
        .map(|a| writer::insert_audit(tx, a))
        .transpose()?;
    // The previous active revision stays: revert_commit restores it if the engine refuses.
    let mut protect = vec![number];
    protect.extend(rs.active_revision);
    writer::prune_revisions(tx, &c.ruleset, keep, &protect)?;
    // A STAGED target's row is filled in by the caller after the commit.
    let revision = revision.unwrap_or_else(|| RevisionRow {
        ruleset: c.ruleset.clone(),
        number,
        parent: None,
        digest: String::new(),
        content: Content::default(),
        rule_count: 0,
        author: String::new(),
        message: String::new(),
        state: c.state,
        created_at: now,
    });
    Ok((
        Persisted {
            commit_id,
            ruleset,
            revision,
            previous,
            audit_id,
        },
        staged,
    ))
}

// === impl Store ===

impl Store {
    /// Opens (creating it and its directory when missing) the database at `path`, in WAL mode
    /// with `synchronous = FULL`, and applies pending migrations.
    ///
    /// Errors: [`Error::Store`] when the file cannot be opened, [`Error::Migrate`] when a
    /// migration fails, [`Error::Internal`] when the directory cannot be created.
    pub async fn open(path: &Path) -> Result<Store> {
        Store::open_to(path, i64::MAX).await
    }

    /// [`Store::open`], applying the migrations up to and including version `until` only
    /// (tests of a migration make a database as an older build left it).
    async fn open_to(path: &Path, until: i64) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Internal(format!("create {}: {e}", dir.display())))?;
        }
        // SQLite reads a 0-byte file as an empty database; vallumd never leaves one (the
        // first open writes the header), so it is not ours: refused, as a corrupt file is.
        if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            return Err(Error::Migrate(format!(
                "{}: the file is empty (0 bytes), not a vallumd database; move it away to \
                 start with an empty store, or restore a backup",
                path.display()
            )));
        }
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let writer = Writer::open(&path, until)?;
            let readers = Readers::open(&path, READERS)?;
            Ok(Store {
                readers,
                writer,
                revisions_kept: 0,
                retention: Retention::default(),
            })
        })
        .await
        .map_err(|e| Error::Internal(format!("store open task: {e}")))?
    }

    /// This store, keeping at most `n` revisions per ruleset (0: all): every transaction that
    /// adds a revision deletes the oldest ones beyond `n`, never the active revision, one
    /// waiting for confirmation, the revision a pending confirm would restore, nor the
    /// revision the transaction itself made or replaced (see [`crate::grpc::limits::revisions_to_prune`]).
    pub fn with_revisions_kept(mut self, n: usize) -> Store {
        self.revisions_kept = n;
        self
    }

    /// This store with `retention` for idempotency keys and audit records (the default is
    /// [`Retention::default`]).
    pub fn with_retention(mut self, retention: Retention) -> Store {
        self.retention = retention;
        self
    }

    /// Nothing to wait for: every call's transaction is done when it returns, and the
    /// connections close when the last handle is dropped. Kept for callers that close.
    pub async fn close(&self) {}

    /// One ruleset.
    ///
    /// Errors: [`Error::Store`].
    pub async fn get_ruleset(&self, name: &str) -> Result<Option<RulesetRow>> {
        let name = name.to_string();
        self.readers
            .run(move |tx| {
                Ok(tx
                    .prepare_cached("SELECT * FROM rulesets WHERE name = ?1")?
                    .query_row([name], ruleset_row)
                    .optional()?)
            })
            .await
    }

    /// Every ruleset, by name.
    ///
    /// Errors: [`Error::Store`].
    pub async fn list_rulesets(&self) -> Result<Vec<RulesetRow>> {
        self.readers
            .run(|tx| {
                Ok(tx
                    .prepare_cached("SELECT * FROM rulesets ORDER BY name")?
                    .query_map([], ruleset_row)?
                    .collect::<rusqlite::Result<_>>()?)
            })
            .await
    }

    /// At most `limit` rulesets with a name after `after`, by name (a page of ListRulesets).
    ///
    /// Errors: [`Error::Store`].
    pub async fn list_rulesets_after(&self, after: &str, limit: u32) -> Result<Vec<RulesetRow>> {
        let after = after.to_string();
        self.readers
            .run(move |tx| {
                Ok(tx
                    .prepare_cached(
                        "SELECT * FROM rulesets WHERE name > ?1 ORDER BY name LIMIT ?2",
                    )?
                    .query_map(params![after, i64::from(limit)], ruleset_row)?
                    .collect::<rusqlite::Result<_>>()?)
            })
            .await
    }

    /// One revision.
    ///
    /// Errors: [`Error::Store`].
    pub async fn get_revision(&self, ruleset: &str, number: u64) -> Result<Option<RevisionRow>> {
        // One read transaction: the chunk lists and the chunks from the same snapshot (a
        // delete or prune between two autocommit reads freed the chunks in between).
        let ruleset = ruleset.to_string();
        self.readers
            .run(move |tx| {
                Ok(revision_rows(
                    tx,
                    revision_select!("WHERE ruleset = ?1 AND number = ?2"),
                    params![ruleset, i64_of(number)],
                )?
                .pop())
            })
            .await
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
        // One read transaction, as in `get_revision`.
        let ruleset = ruleset.to_string();
        self.readers
            .run(move |tx| {
                revision_rows(
                    tx,
                    revision_select!("WHERE ruleset = ?1 AND number > ?2 ORDER BY number LIMIT ?3"),
                    params![ruleset, i64_of(after), i64::from(limit)],
                )
            })
            .await
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
        new: NewRevision,
        expected_etag: Option<&str>,
    ) -> Result<(RulesetRow, RevisionRow)> {
        let keep = self.revisions_kept;
        let expected_etag = expected_etag.map(str::to_string);
        self.writer
            .run(move |tx| {
                let now = now_ns();
                let name = new.ruleset.clone();
                let rs = writer::ensure_ruleset(tx, &name, new.priority, now)?;
                check_etag(&rs, expected_etag.as_deref())?;
                // The rows written here are known: nothing is read back.
                let rev = writer::insert_revision(tx, &rs, new, RevisionState::Staged, now)?;
                let rs = writer::set_ruleset_heads(tx, &rs, rev.number, rs.active_revision, now)?;
                writer::prune_revisions(tx, &name, keep, &[rev.number])?;
                Ok((rs, rev))
            })
            .await
    }

    /// The durable half of a commit, in one transaction that is on disk when this returns:
    /// the target revision gets `state`, the previous active one `previous_state`, the
    /// ruleset points at the target, pending confirm deadlines of the ruleset are cleared
    /// (a new commit settles them), and a commit row is written. Runs on the writer
    /// connection in one hop (see [`writer`]).
    ///
    /// Errors: [`Error::NotFound`] for a missing ruleset or revision,
    /// [`Error::Precondition`] when a revision to commit is not STAGED,
    /// [`Error::EtagMismatch`], [`Error::Store`].
    pub async fn persist_commit(&self, c: PersistCommit) -> Result<Persisted> {
        let keep = self.revisions_kept;
        let name = c.ruleset.clone();
        let (mut p, staged) = self
            .writer
            .run(move |tx| persist_commit_in(tx, c, keep))
            .await?;
        // A STAGED revision's text is read back after the commit (the pipeline's write lock
        // keeps other writers out meanwhile); a new revision's row is the one written.
        if let Some(n) = staged {
            p.revision = self
                .get_revision(&name, n)
                .await?
                .ok_or_else(|| Error::Internal("committed revision vanished".into()))?;
        }
        Ok(p)
    }

    /// Sets the priority of ruleset `name` (one without an active revision: for an active one
    /// the priority changes with a commit, [`PersistCommit::priority`]); returns the row after,
    /// with a new etag.
    ///
    /// Errors: [`Error::NotFound`]; [`Error::EtagMismatch`] when `expected_etag` is given and
    /// differs; [`Error::Precondition`] when the ruleset has an active revision;
    /// [`Error::Store`].
    pub async fn set_priority(
        &self,
        name: &str,
        priority: i32,
        expected_etag: Option<&str>,
    ) -> Result<RulesetRow> {
        let name = name.to_string();
        let expected = expected_etag.map(str::to_string);
        self.writer
            .run(move |tx| {
                let rs = writer::existing_ruleset(tx, &name)?;
                check_etag(&rs, expected.as_deref())?;
                if let Some(n) = rs.active_revision {
                    return Err(Error::Precondition {
                        kind: "RULESET_ACTIVE",
                        subject: format!("rulesets/{name}"),
                        message: format!(
                            "revision {n} is active: its priority changes with a commit"
                        ),
                    });
                }
                let rs = writer::set_priority(tx, rs, priority)?;
                let (latest, active) = (rs.latest_revision, rs.active_revision);
                writer::set_ruleset_heads(tx, &rs, latest, active, now_ns())
            })
            .await
    }

    /// Records the phase durations of a commit after publish.
    ///
    /// Errors: [`Error::Store`].
    pub async fn finish_commit(&self, commit_id: i64, p: &Phases) -> Result<()> {
        let p = *p;
        self.writer
            .run(move |tx| {
                tx.prepare_cached(
                    "UPDATE commits SET validate_ns = ?1, compile_ns = ?2, persist_ns = ?3, \
                     publish_ns = ?4, quiesce_ns = ?5, carry_ns = ?6, total_ns = ?7, \
                     cores_waited = ?8 WHERE id = ?9",
                )?
                .execute(params![
                    i64_of(p.validate_ns),
                    i64_of(p.compile_ns),
                    i64_of(p.persist_ns),
                    i64_of(p.publish_ns),
                    i64_of(p.quiesce_ns),
                    i64_of(p.carry_ns),
                    i64_of(p.total_ns),
                    i64::from(p.cores_waited),
                    commit_id
                ])?;
                Ok(())
            })
            .await
    }

    /// Undoes [`Store::persist_commit`] when the engine refused the commit: the revision is
    /// REJECTED, the previous one active again, the commit row FAILED with `error`, and the
    /// audit record written with the commit (if any) gets `outcome` (a reason name).
    ///
    /// Errors: [`Error::Store`].
    pub async fn revert_commit(&self, p: &Persisted, error: &str, outcome: &str) -> Result<()> {
        let (name, number, previous) = (p.ruleset.name.clone(), p.revision.number, p.previous);
        let (audit_id, commit_id) = (p.audit_id, p.commit_id);
        let (error, outcome) = (error.to_string(), outcome.to_string());
        self.writer
            .run(move |tx| {
                let now = now_ns();
                if let Some(id) = audit_id {
                    tx.prepare_cached("UPDATE audit SET outcome = ?1 WHERE id = ?2")?
                        .execute(params![outcome, id])?;
                }
                writer::set_state(tx, &name, number, RevisionState::Rejected)?;
                if let Some((prev, state)) = previous {
                    writer::set_state(tx, &name, prev, state)?;
                }
                if let Some(rs) = writer::ruleset(tx, &name)? {
                    let latest = rs.latest_revision;
                    writer::set_ruleset_heads(tx, &rs, latest, previous.map(|x| x.0), now)?;
                }
                tx.prepare_cached(
                    "UPDATE commits SET outcome = 'FAILED', error = ?1, confirm_deadline = NULL WHERE id = ?2",
                )?
                .execute(params![error, commit_id])?;
                Ok(())
            })
            .await
    }

    /// Deactivates a ruleset whose first commit was not confirmed in time: no revision is
    /// active afterwards, `revision` is REJECTED and a REVERTED commit row is written.
    /// Returns the commit row's id.
    ///
    /// Errors: [`Error::Store`].
    pub async fn deactivate(&self, ruleset: &str, revision: u64, started_at: i64) -> Result<i64> {
        let name = ruleset.to_string();
        self.writer
            .run(move |tx| {
                let now = now_ns();
                writer::set_state(tx, &name, revision, RevisionState::Rejected)?;
                if let Some(rs) = writer::ruleset(tx, &name)? {
                    let latest = rs.latest_revision;
                    writer::set_ruleset_heads(tx, &rs, latest, None, now)?;
                }
                writer::clear_deadlines(tx, &name)?;
                tx.prepare_cached(
                    "INSERT INTO commits (ruleset, revision, previous, outcome, started_at) \
                     VALUES (?1, ?2, ?2, 'REVERTED', ?3)",
                )?
                .execute(params![name, i64_of(revision), started_at])?;
                Ok(tx.last_insert_rowid())
            })
            .await
    }

    /// Confirms the pending commit of `revision`: the revision becomes ACTIVE and the commit
    /// row CONFIRMED. Returns the revision, or `None` when no commit of it is pending.
    ///
    /// Errors: [`Error::Store`].
    pub async fn confirm(&self, ruleset: &str, revision: u64) -> Result<Option<RevisionRow>> {
        let name = ruleset.to_string();
        let done = self
            .writer
            .run(move |tx| {
                let done = tx
                    .prepare_cached(
                        "UPDATE commits SET outcome = 'CONFIRMED', confirm_deadline = NULL \
                         WHERE ruleset = ?1 AND revision = ?2 AND confirm_deadline IS NOT NULL",
                    )?
                    .execute(params![name, i64_of(revision)])?;
                if done > 0 {
                    writer::set_state(tx, &name, revision, RevisionState::Active)?;
                }
                Ok(done > 0)
            })
            .await?;
        if !done {
            return Ok(None);
        }
        self.get_revision(ruleset, revision).await
    }

    /// Commits waiting for ConfirmCommit, earliest deadline first.
    ///
    /// Errors: [`Error::Store`].
    pub async fn pending_confirms(&self) -> Result<Vec<CommitRow>> {
        self.readers
            .run(|tx| {
                commit_rows(
                    tx,
                    "SELECT * FROM commits WHERE confirm_deadline IS NOT NULL ORDER BY confirm_deadline",
                    [],
                )
            })
            .await
    }

    /// The commit rows of a ruleset, oldest first.
    ///
    /// Errors: [`Error::Store`].
    pub async fn commits(&self, ruleset: &str) -> Result<Vec<CommitRow>> {
        let ruleset = ruleset.to_string();
        self.readers
            .run(move |tx| {
                commit_rows(
                    tx,
                    "SELECT * FROM commits WHERE ruleset = ?1 ORDER BY id",
                    [ruleset],
                )
            })
            .await
    }

    /// Deletes a ruleset with its revisions and commit rows. Returns whether it existed.
    ///
    /// Errors: [`Error::EtagMismatch`], [`Error::Store`].
    pub async fn delete_ruleset(&self, name: &str, expected_etag: Option<&str>) -> Result<bool> {
        let name = name.to_string();
        let expected = expected_etag.map(str::to_string);
        self.writer
            .run(move |tx| {
                let Some(rs) = writer::ruleset(tx, &name)? else {
                    return Ok(false);
                };
                check_etag(&rs, expected.as_deref())?;
                writer::delete_revisions(tx, &name, None)?;
                tx.prepare_cached("DELETE FROM commits WHERE ruleset = ?1")?
                    .execute([&name])?;
                tx.prepare_cached("DELETE FROM rulesets WHERE name = ?1")?
                    .execute([&name])?;
                Ok(true)
            })
            .await
    }

    /// The earlier call with this request id, whatever its method (one namespace, as
    /// AIP-155: the key names the request), with that method, unless its key expired at
    /// `now` (Unix ns; older than [`Retention::idempotency_ttl`]).
    ///
    /// Errors: [`Error::Store`].
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
    /// Errors: [`Error::Store`].
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
    /// Errors: [`Error::Store`].
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
                match me.prune(now_ns()).await {
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
    /// Errors: [`Error::Store`].
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
    /// Errors: [`Error::Store`].
    pub async fn audit(&self, e: AuditEntry) -> Result<()> {
        self.writer
            .run(move |tx| writer::insert_audit(tx, &e).map(drop))
            .await
    }

    /// Marks `f` as an active revision that did not load, with its audit record, in one
    /// transaction (replacing an earlier mark of the ruleset).
    ///
    /// Errors: [`Error::Store`].
    pub async fn record_load_failure(&self, f: LoadFailure, audit: AuditEntry) -> Result<()> {
        self.writer
            .run(move |tx| {
                writer::insert_audit(tx, &audit)?;
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
    /// Errors: [`Error::Store`].
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
    /// Errors: [`Error::Store`].
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
    /// Errors: [`Error::Store`].
    pub async fn audit_count(&self) -> Result<u64> {
        self.readers
            .run(|tx| {
                let n: i64 = tx.query_row("SELECT COUNT(*) FROM audit", [], |r| r.get(0))?;
                Ok(u64_of(n))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database at `path` migrated up to `until` only, as an older build left it.
    fn old_db(path: &Path, until: i64) -> Connection {
        let mut conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "foreign_keys", true).unwrap();
        migrate::run_to(&mut conn, until).unwrap();
        conn
    }

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
            priority: None,
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
            let conn = old_db(&path, 20261130070000);
            conn.execute(
                "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
                 VALUES ('a', 0, 'e', 2, 2, 1, 1)",
                [],
            )
            .unwrap();
            for (n, v4, state) in [
                (1, "*filter\n-A INPUT -j DROP\nCOMMIT\n", "SUPERSEDED"),
                (2, "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n", "ACTIVE"),
            ] {
                conn.execute(
                    "INSERT INTO revisions (ruleset, number, parent, digest, content_v4, content_v6, rule_count, author, message, state, created_at) \
                     VALUES ('a', ?1, NULL, 'd', ?2, '*filter\nCOMMIT\n', 1, 'me', 'm', ?3, 1)",
                    params![n, v4, state],
                )
                .unwrap();
            }
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

    /// A database made by the build before the store had one driver (sqlx ran its
    /// migrations, chunk lists were comma-separated text with counts kept by hand; made by
    /// `make_fixture` at cd75b4d, see tests/fixtures/README.md) opens in place: every revision
    /// reads back byte-identical, with its rows, commits, sets, idempotency and load failure
    /// marks, the chunk lists are rows SQLite checks, and it keeps working.
    #[tokio::test]
    async fn a_database_made_by_the_two_driver_store_migrates_in_place() {
        let text = |k: usize, fam: &str| {
            let mut s = String::from("*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n");
            for i in 0..1500 {
                let port = if i % 500 == 7 { 20_000 + k } else { i };
                s.push_str(&format!(
                    "-A INPUT -s {fam}{}.0/24 -p tcp -m tcp --dport {port} -j ACCEPT\n",
                    i % 200
                ));
            }
            s + "COMMIT\n"
        };
        let content = |k: usize| Content {
            v4: text(k, "10.0."),
            v6: if k % 2 == 0 {
                text(k, "2001:db8:")
            } else {
                String::new()
            },
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.db");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store_two_drivers.db"),
            &path,
        )
        .unwrap();
        let store = Store::open(&path).await.unwrap().with_revisions_kept(4);
        let a = store.list_revisions("a", 0, 100).await.unwrap();
        // Six commits and a stage, four kept: 4, 5 (replaced), 6 (active), 7 (staged).
        assert_eq!(a.iter().map(|r| r.number).collect::<Vec<_>>(), [4, 5, 6, 7]);
        for r in &a {
            let k = r.number as usize - 1;
            assert_eq!(r.content, content(k), "a/{}", r.number);
            assert_eq!(r.digest, r.content.digest());
            assert_eq!(
                (r.author.clone(), r.message.clone()),
                (format!("author{k}"), format!("message {k}"))
            );
            assert_eq!(r.rule_count, 1500);
        }
        let states: Vec<RevisionState> = a.iter().map(|r| r.state).collect();
        use RevisionState::*;
        assert_eq!(states, [Superseded, Superseded, Active, Staged]);
        let b = store.get_revision("b", 1).await.unwrap().unwrap();
        assert_eq!((b.content.clone(), b.state), (content(2), PendingConfirm));
        let c = store.get_revision("c", 1).await.unwrap().unwrap();
        assert_eq!(c.content, Content::default());
        let rs = store.get_ruleset("a").await.unwrap().unwrap();
        assert_eq!(
            (rs.priority, rs.active_revision, rs.latest_revision),
            (5, Some(6), 7)
        );
        let commits = store.commits("a").await.unwrap();
        assert_eq!(commits.len(), 6);
        assert!(
            commits
                .iter()
                .all(|c| c.phases.total_ns == 99 && c.outcome == Outcome::Committed)
        );
        assert_eq!(store.pending_confirms().await.unwrap()[0].ruleset, "b");
        assert_eq!(store.audit_count().await.unwrap(), 9);
        let kept = Store::open(&path).await.unwrap().with_retention(Retention {
            idempotency_ttl: None,
            ..Retention::default()
        });
        let call = kept.idempotent_get("req-1", now_ns()).await;
        assert_eq!(call.unwrap().unwrap().1.response, b"\x01\x02resp");
        drop(kept);
        assert_eq!(store.load_failures().await.unwrap()[0].error, "boom");
        let sets = store.load_sets(0).await.unwrap();
        assert_eq!((sets[0].name.as_str(), sets[0].elements.len()), ("s4", 2));
        assert_refs_exact(&store).await;
        // sqlx's bookkeeping became ours.
        assert_eq!(
            count(&store, "SELECT COUNT(*) FROM schema_migrations").await,
            migrate::MIGRATIONS.len() as i64
        );
        assert_eq!(
            count(
                &store,
                "SELECT COUNT(*) FROM sqlite_master WHERE name = '_sqlx_migrations'"
            )
            .await,
            0
        );
        // It keeps working: a commit shares the stored chunks, pruning frees the old ones.
        let p = store
            .persist_commit(commit(
                "a",
                CommitTarget::New(NewRevision {
                    content: content(3),
                    ..new_rev("a", "")
                }),
            ))
            .await
            .unwrap();
        assert_eq!(p.revision.number, 8);
        assert_eq!(
            store.get_revision("a", 8).await.unwrap().unwrap().content,
            content(3)
        );
        assert_refs_exact(&store).await;
        for name in ["a", "b", "c"] {
            assert!(store.delete_ruleset(name, None).await.unwrap());
        }
        assert_eq!(chunk_count(&store).await, (0, 0));
        drop(store);
        // And opens again.
        assert!(
            Store::open(&path)
                .await
                .unwrap()
                .list_rulesets()
                .await
                .unwrap()
                .is_empty()
        );
    }

    /// A store written before outcomes were one vocabulary: the confirm timer's ROLLED_BACK
    /// rows (a deactivation, an automatic rollback) become REVERTED, a deliberate rollback
    /// stays ROLLED_BACK; every outcome can be written afterwards.
    #[tokio::test]
    async fn confirm_timeouts_become_reverted_in_the_outcome_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.db");
        {
            let conn = old_db(&path, 20261201140000);
            conn.execute(
                "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
                 VALUES ('a', 0, 'e', 4, 4, 1, 1)",
                [],
            )
            .unwrap();
            for (n, author, message) in [
                (1, "me", "m"),
                (2, "me", "rollback to revision 1"),
                (3, "me", "m"),
                (
                    4,
                    "vallumd",
                    "automatic rollback: revision 3 was not confirmed in time",
                ),
            ] {
                conn.execute(
                    "INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at) \
                     VALUES ('a', ?1, NULL, 'd', 0, ?2, ?3, 'SUPERSEDED', 1)",
                    params![n, author, message],
                )
                .unwrap();
            }
            for (revision, previous, outcome) in [
                (1, None, "COMMITTED"),
                (2, Some(1), "ROLLED_BACK"),
                (3, Some(2), "COMMITTED"),
                (4, Some(3), "ROLLED_BACK"),
                (5, Some(5), "ROLLED_BACK"),
            ] {
                conn.execute(
                    "INSERT INTO commits (ruleset, revision, previous, outcome, started_at) \
                     VALUES ('a', ?1, ?2, ?3, 1)",
                    params![revision, previous, outcome],
                )
                .unwrap();
            }
        }
        let store = Store::open(&path).await.unwrap();
        let outcomes: Vec<Outcome> = store
            .commits("a")
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.outcome)
            .collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Committed,
                Outcome::RolledBack,
                Outcome::Committed,
                Outcome::Reverted,
                Outcome::Reverted,
            ]
        );
        for o in Outcome::ALL {
            store
                .writer
                .run(move |tx| {
                    tx.execute(
                        "INSERT INTO commits (ruleset, revision, previous, outcome, started_at) \
                         VALUES ('b', 1, NULL, ?1, 1)",
                        [o.as_str()],
                    )?;
                    Ok(())
                })
                .await
                .unwrap_or_else(|e| panic!("{o}: {e}"));
        }
        assert_eq!(store.commits("b").await.unwrap().len(), Outcome::ALL.len());
    }

    /// `SELECT COUNT(*)`-style query of one integer.
    async fn count(store: &Store, sql: &'static str) -> i64 {
        store
            .readers
            .run(move |tx| Ok(tx.query_row(sql, [], |r| r.get(0))?))
            .await
            .unwrap()
    }

    /// Rows of `chunks` and `chunk_texts`.
    async fn chunk_count(store: &Store) -> (i64, i64) {
        (
            count(store, "SELECT COUNT(*) FROM chunks").await,
            count(store, "SELECT COUNT(*) FROM chunk_texts").await,
        )
    }

    /// Every stored chunk is named by some list, its count is the number of list rows naming
    /// it, and it has its text; every list row names a stored chunk; every list's positions
    /// run 0.. without a gap, and SQLite finds no foreign key violation.
    async fn assert_refs_exact(store: &Store) {
        let unnamed = count(
            store,
            "SELECT COUNT(*) FROM chunks c WHERE NOT EXISTS \
             (SELECT 1 FROM revision_chunk_list l WHERE l.chunk = c.id)",
        )
        .await;
        assert_eq!(unnamed, 0, "chunks no list names");
        let miscounted = count(
            store,
            "SELECT COUNT(*) FROM chunks c WHERE c.refs <> \
             (SELECT COUNT(*) FROM revision_chunk_list l WHERE l.chunk = c.id)",
        )
        .await;
        assert_eq!(miscounted, 0, "chunks whose count is not their list rows");
        let dangling = count(
            store,
            "SELECT COUNT(*) FROM revision_chunk_list l WHERE NOT EXISTS \
             (SELECT 1 FROM chunks c WHERE c.id = l.chunk)",
        )
        .await;
        assert_eq!(dangling, 0, "list rows naming no chunk");
        let gaps = count(
            store,
            "SELECT COUNT(*) FROM (SELECT ruleset, number, family FROM revision_chunk_list \
             GROUP BY ruleset, number, family HAVING MAX(position) + 1 <> COUNT(*))",
        )
        .await;
        assert_eq!(gaps, 0, "lists with gaps");
        let violations = store
            .readers
            .run(|tx| {
                Ok(tx
                    .prepare("PRAGMA foreign_key_check")?
                    .query_map([], |_| Ok(()))?
                    .count())
            })
            .await
            .unwrap();
        assert_eq!(violations, 0, "foreign key violations");
        let (c, t) = chunk_count(store).await;
        assert_eq!(c, t);
    }

    /// Revisions that alternate between two texts (as an orchestrator re-applying a ruleset
    /// with one rule toggled does): each commit adds one chunk list and prunes another in the
    /// same transaction, so most chunks gain and lose a reference at once (net zero, not
    /// written) and the toggled chunk falls to zero and is deleted, or is named again. The
    /// counts stay exact through it all.
    #[tokio::test]
    async fn alternating_revisions_keep_counts_exact() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db"))
            .await
            .unwrap()
            .with_revisions_kept(2);
        let text = |k: usize| {
            let mut s = String::from("*filter\n:INPUT DROP [0:0]\n");
            for i in 0..2000 {
                let port = if i == 700 { 10_000 + k } else { i };
                s.push_str(&format!(
                    "-A INPUT -s 10.1.{}.0/24 -p udp -m udp --dport {port} -j ACCEPT\n",
                    i % 256
                ));
            }
            s + "COMMIT\n"
        };
        // a, b, a, b, then c (the toggled chunk of a and b falls out), then a again.
        for (n, k) in [0, 1, 0, 1, 2, 3, 0].into_iter().enumerate() {
            store
                .persist_commit(commit("a", CommitTarget::New(new_rev("a", &text(k)))))
                .await
                .unwrap();
            assert_refs_exact(&store).await;
            let kept = store.list_revisions("a", 0, 100).await.unwrap();
            assert_eq!(kept.len(), (n + 1).min(2));
            assert_eq!(kept.last().unwrap().content.v4, text(k));
        }
        // Exactly the chunks of the two kept texts are stored.
        let kept = store.list_revisions("a", 0, 100).await.unwrap();
        let all: std::collections::HashSet<&str> = kept
            .iter()
            .flat_map(|r| chunks::split(&r.content.v4))
            .collect();
        assert_eq!(chunk_count(&store).await.0, all.len() as i64);
        assert!(store.delete_ruleset("a", None).await.unwrap());
        assert_eq!(chunk_count(&store).await, (0, 0));
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
                .persist_commit(commit("a", CommitTarget::New(rev)))
                .await
                .unwrap();
        }
        let kept = store.list_revisions("a", 0, 100).await.unwrap();
        assert_eq!(kept.iter().map(|r| r.number).collect::<Vec<_>>(), [4, 5, 6]);
        for r in &kept {
            assert_eq!(r.content, texts[r.number as usize - 1]);
            assert_eq!(r.digest, r.content.digest());
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
        let refs = count(
            &store,
            "SELECT COUNT(*) FROM (SELECT DISTINCT ruleset, number, family, chunk \
             FROM revision_chunk_list)",
        )
        .await;
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
        assert_refs_exact(&store).await;
        assert!(store.delete_ruleset("a", None).await.unwrap());
        assert_eq!(chunk_count(&store).await, (0, 0));
    }

    /// A revision read while the writer deletes and re-creates its ruleset is either there
    /// with its own text or absent, never half (its chunk lists read, its chunks freed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_see_a_revision_whole_while_it_is_deleted() {
        fn text(tag: u64) -> String {
            let mut s = String::from("*filter\n");
            for i in 0..300 {
                s.push_str(&format!(
                    "-A INPUT -s 10.{}.{}.0/24 -m comment --comment r{tag} -j ACCEPT\n",
                    i / 256 % 256,
                    i % 256
                ));
            }
            s + "COMMIT\n"
        }
        fn rev(tag: u64) -> NewRevision {
            NewRevision {
                author: tag.to_string(),
                ..new_rev("a", &text(tag))
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db")).await.unwrap();
        store.stage(rev(0), None).await.unwrap();
        let w = store.clone();
        let writer = tokio::spawn(async move {
            for tag in 1..150u64 {
                w.delete_ruleset("a", None).await.unwrap();
                w.stage(rev(tag), None).await.unwrap();
            }
        });
        let mut whole = 0;
        while !writer.is_finished() {
            if let Some(r) = store.get_revision("a", 1).await.unwrap() {
                let tag: u64 = r.author.parse().unwrap();
                assert_eq!(r.content.v4, text(tag));
                whole += 1;
            }
            for r in store.list_revisions("a", 0, 10).await.unwrap() {
                assert_eq!(r.content.v4, text(r.author.parse().unwrap()));
            }
        }
        writer.await.unwrap();
        assert!(whole > 0);
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
            .persist_commit(commit("a", CommitTarget::New(new_rev("a", text))))
            .await
            .unwrap();
        // Revision 2 waits for confirmation; 1 is what a timeout would restore.
        store
            .persist_commit(PersistCommit {
                state: RevisionState::PendingConfirm,
                confirm_deadline: Some(i64::MAX),
                ..commit("a", CommitTarget::New(new_rev("a", text)))
            })
            .await
            .unwrap();
        store.stage(new_rev("a", text), None).await.unwrap();
        assert_eq!(numbers(store.clone()).await, vec![1, 2, 3]);
        store.stage(new_rev("a", text), None).await.unwrap();
        assert_eq!(numbers(store.clone()).await, vec![1, 2, 4]);
        // A plain commit settles the pending one: only it and the replaced active one stay.
        store
            .persist_commit(commit("a", CommitTarget::New(new_rev("a", text))))
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
            .stage(new_rev("a", "*filter\nCOMMIT\n"), None)
            .await
            .unwrap();
        assert_eq!(r1.number, 1);
        assert_eq!(r1.state, RevisionState::Staged);
        assert!(matches!(
            store.stage(new_rev("a", "x"), Some("nope")).await,
            Err(Error::EtagMismatch { .. })
        ));
        let p = store
            .persist_commit(commit("a", CommitTarget::Staged(1)))
            .await
            .unwrap();
        assert_eq!(p.ruleset.active_revision, Some(1));
        assert_ne!(p.ruleset.etag, rs.etag);
        // Committing it again is refused.
        assert!(matches!(
            store
                .persist_commit(commit("a", CommitTarget::Staged(1)))
                .await,
            Err(Error::Precondition { .. })
        ));
        // The audit record goes in with the commit.
        let p2 = store
            .persist_commit(PersistCommit {
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
        let id = p2.audit_id.expect("audit id");
        let outcome: String = store
            .readers
            .run(move |tx| {
                Ok(
                    tx.query_row("SELECT outcome FROM audit WHERE id = ?1", [id], |r| {
                        r.get(0)
                    })?,
                )
            })
            .await
            .unwrap();
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
        store.persist_commit(c).await.unwrap();
        assert_eq!(store.pending_confirms().await.unwrap().len(), 1);
        assert!(store.confirm("a", 1).await.unwrap().is_some());
        assert!(store.confirm("a", 1).await.unwrap().is_none());
        assert!(store.pending_confirms().await.unwrap().is_empty());
        let call = |r: &[u8]| IdempotentCall {
            request_digest: "d".into(),
            response: r.to_vec(),
        };
        let now = now_ns();
        store
            .idempotent_put("Apply", "r1", call(b"one"), now)
            .await
            .unwrap();
        store
            .idempotent_put("Apply", "r1", call(b"two"), now)
            .await
            .unwrap();
        let first = store.idempotent_get("r1", now).await.unwrap().unwrap();
        assert_eq!(first.1.response, b"one", "the first one wins");
        // One namespace: the key is found whatever method asks, with its method.
        assert_eq!(first.0, "Apply");
    }

    /// `n` distinct rule lines that each end a chunk (so a text of `k` of them is `k` chunks).
    fn boundary_lines(n: usize, tag: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut i = 0;
        while out.len() < n {
            let l = format!("-A INPUT -m comment --comment {tag}{i} -j ACCEPT\n");
            if chunks::split(&format!("{l}x\n")).len() == 2 {
                out.push(l);
            }
            i += 1;
        }
        out
    }

    /// Chunk lists across the lookup batch size (0, 1, 63, 64, 65, 128, 129, 130 distinct
    /// chunks), with chunks repeated inside a text, shared by the IPv4 and IPv6 lists and by
    /// two rulesets, staged and committed, pruned and deleted: the counts stay exact and
    /// every kept text reads back.
    #[tokio::test]
    async fn chunk_batches_and_sharing_keep_counts_exact() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db"))
            .await
            .unwrap()
            .with_revisions_kept(2);
        let lines = boundary_lines(140, "c");
        let text = |k: usize, rep: usize| -> String {
            lines[..k]
                .iter()
                .flat_map(|l| std::iter::repeat_n(l, rep))
                .cloned()
                .collect()
        };
        let mut step = 0;
        for k in [0, 1, 63, 64, 65, 128, 129, 130] {
            for (name, rep) in [("a", 1), ("b", 2)] {
                step += 1;
                let mut rev = new_rev(name, &text(k, rep));
                // The IPv6 text: the same chunks, a few more, or none.
                rev.content.v6 = match step % 3 {
                    0 => text(k, 1),
                    1 => text((k + 70).min(140), 1),
                    _ => String::new(),
                };
                let content = rev.content.clone();
                let p = if step % 4 == 0 {
                    store.stage(rev, None).await.unwrap().1
                } else {
                    store
                        .persist_commit(commit(name, CommitTarget::New(rev)))
                        .await
                        .unwrap()
                        .revision
                };
                assert_refs_exact(&store).await;
                let back = store.get_revision(name, p.number).await.unwrap().unwrap();
                assert_eq!(back.content, content, "{name} k={k}");
                for r in store.list_revisions(name, 0, 100).await.unwrap() {
                    assert_eq!(r.digest, r.content.digest());
                }
            }
        }
        assert!(store.delete_ruleset("a", None).await.unwrap());
        assert_refs_exact(&store).await;
        for r in store.list_revisions("b", 0, 100).await.unwrap() {
            assert_eq!(r.digest, r.content.digest());
        }
        assert!(store.delete_ruleset("b", None).await.unwrap());
        assert_eq!(chunk_count(&store).await, (0, 0));
    }

    /// A write transaction that fails after storing chunks leaves no chunk and no pending
    /// count behind; one that releases a revision's chunks and stores the same text again
    /// keeps them with exact counts.
    #[tokio::test]
    async fn a_failed_transaction_leaves_no_chunks_or_counts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db")).await.unwrap();
        let lines = boundary_lines(100, "f");
        let text: String = lines.concat();
        store
            .stage(new_rev("a", &text[..text.len() / 2]), None)
            .await
            .unwrap();
        let before = chunk_count(&store).await;
        let t = text.clone();
        let r = store
            .writer
            .run(move |tx| {
                let rs = writer::existing_ruleset(tx, "a")?;
                writer::insert_revision(tx, &rs, new_rev("a", &t), RevisionState::Staged, 1)?;
                Err::<(), _>(Error::Internal("boom".into()))
            })
            .await;
        assert!(r.is_err());
        assert_eq!(chunk_count(&store).await, before);
        assert_refs_exact(&store).await;
        // The next transaction starts from no pending change.
        store.stage(new_rev("a", &text), None).await.unwrap();
        assert_refs_exact(&store).await;
        // Released and put again in one transaction.
        let t = text.clone();
        store
            .writer
            .run(move |tx| {
                writer::delete_revisions(tx, "a", Some(2))?;
                let rs = writer::existing_ruleset(tx, "a")?;
                writer::insert_revision(tx, &rs, new_rev("a", &t), RevisionState::Staged, 1)?;
                Ok(())
            })
            .await
            .unwrap();
        assert_refs_exact(&store).await;
        assert_eq!(
            store
                .get_revision("a", 3)
                .await
                .unwrap()
                .unwrap()
                .content
                .v4,
            text
        );
    }

    /// A chunk stored by a transaction and released again in it (a revision added and
    /// deleted at once) is deleted with it, not left behind with no reference.
    #[tokio::test]
    async fn a_chunk_stored_and_released_in_one_transaction_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db")).await.unwrap();
        store
            .stage(new_rev("a", "*filter\nCOMMIT\n"), None)
            .await
            .unwrap();
        store
            .writer
            .run(|tx| {
                let rs = writer::existing_ruleset(tx, "a")?;
                let text = "*filter\n-A INPUT -j DROP\nCOMMIT\n";
                writer::insert_revision(tx, &rs, new_rev("a", text), RevisionState::Staged, 1)?;
                writer::delete_revisions(tx, "a", Some(2))?;
                Ok(())
            })
            .await
            .unwrap();
        assert_refs_exact(&store).await;
    }

    /// A store written with the chunk index (before the counts) opens with exact counts and
    /// every text intact, and keeps them exact through the next commits.
    #[tokio::test]
    async fn chunk_lists_get_their_counts_in_the_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.db");
        {
            let conn = old_db(&path, 20261216090000);
            conn.execute_batch(
                "INSERT INTO rulesets (name, priority, etag, active_revision, latest_revision, created_at, updated_at) \
                 VALUES ('a', 0, 'e', 2, 2, 1, 1);
                 INSERT INTO revisions (ruleset, number, parent, digest, rule_count, author, message, state, created_at) \
                 VALUES ('a', 1, NULL, 'd1', 1, 't', 'm', 'SUPERSEDED', 1), \
                        ('a', 2, 1, 'd2', 1, 't', 'm', 'ACTIVE', 1);
                 INSERT INTO chunks (id, digest) VALUES (1, x'01'), (2, x'02'), (3, x'03');
                 INSERT INTO chunk_texts (id, text) VALUES (1, 'one\n'), (2, 'two\n'), (3, 'three\n');
                 INSERT INTO revision_chunk_list (ruleset, number, family, position, chunk) \
                 VALUES ('a', 1, 4, 0, 1), ('a', 1, 4, 1, 2), ('a', 1, 4, 2, 1), \
                        ('a', 2, 4, 0, 1), ('a', 2, 4, 1, 3), ('a', 2, 6, 0, 3);",
            )
            .unwrap();
        }
        let store = Store::open(&path).await.unwrap().with_revisions_kept(2);
        assert_refs_exact(&store).await;
        let refs: String = store
            .readers
            .run(|tx| {
                Ok(tx.query_row(
                    "SELECT group_concat(refs, ',') FROM (SELECT refs FROM chunks ORDER BY id)",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(refs, "3,1,2");
        let r1 = store.get_revision("a", 1).await.unwrap().unwrap();
        assert_eq!(r1.content.v4, "one\ntwo\none\n");
        let r2 = store.get_revision("a", 2).await.unwrap().unwrap();
        assert_eq!(
            (r2.content.v4.as_str(), r2.content.v6.as_str()),
            ("one\nthree\n", "three\n")
        );
        // The next commit (a new chunk: the old digests are not sha256) prunes revision 1:
        // chunk 2 goes, 1 and 3 stay.
        store
            .persist_commit(commit("a", CommitTarget::New(new_rev("a", "one\n"))))
            .await
            .unwrap();
        assert_refs_exact(&store).await;
        assert_eq!(chunk_count(&store).await.0, 3);
        assert_eq!(
            count(&store, "SELECT COUNT(*) FROM chunks WHERE id = 2").await,
            0
        );
    }

    /// SQLite itself refuses a list row naming no stored chunk, deleting a chunk a list
    /// names, and changing a list row (which would bypass the counts).
    #[tokio::test]
    async fn sqlite_enforces_the_chunk_counts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("v.db")).await.unwrap();
        let p = store
            .persist_commit(commit(
                "a",
                CommitTarget::New(new_rev("a", "*filter\n-A INPUT -j DROP\nCOMMIT\n")),
            ))
            .await
            .unwrap();
        let n = i64_of(p.revision.number);
        for sql in [
            "INSERT INTO revision_chunk_list (ruleset, number, family, position, chunk) \
             VALUES ('a', ?1, 6, 0, 999999)",
            "DELETE FROM chunks WHERE id = (SELECT chunk FROM revision_chunk_list WHERE number = ?1)",
            "UPDATE revision_chunk_list SET chunk = chunk WHERE number = ?1",
            "UPDATE chunks SET refs = -1 WHERE id = (SELECT chunk FROM revision_chunk_list WHERE number = ?1)",
        ] {
            let r = store.writer.run(move |tx| Ok(tx.execute(sql, [n])?)).await;
            assert!(r.is_err(), "{sql} was allowed");
        }
        assert_refs_exact(&store).await;
    }

    /// Idempotency keys expire after the TTL (at injected times): a lookup after it finds
    /// nothing, a new call replaces the row, and the digest comes back as stored.
    #[tokio::test]
    async fn idempotency_keys_expire_after_the_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let hour = std::time::Duration::from_secs(3600);
        let store = Store::open(&dir.path().join("v.db"))
            .await
            .unwrap()
            .with_retention(Retention {
                idempotency_ttl: Some(hour),
                ..Retention::default()
            });
        let h = i64::try_from(hour.as_nanos()).unwrap();
        let t0 = 1_000 * h;
        let call = |d: &str, r: &[u8]| IdempotentCall {
            request_digest: d.into(),
            response: r.to_vec(),
        };
        store
            .idempotent_put("Apply", "k", call("d1", b"one"), t0)
            .await
            .unwrap();
        let got = store.idempotent_get("k", t0 + h).await.unwrap();
        assert_eq!(
            got,
            Some(("Apply".into(), call("d1", b"one"))),
            "still live at exactly the TTL"
        );
        assert_eq!(store.idempotent_get("k", t0 + h + 1).await.unwrap(), None);
        // An expired key of another method is replaced by the new one.
        store
            .idempotent_put("Rollback", "k", call("d2", b"two"), t0 + 2 * h)
            .await
            .unwrap();
        let got = store.idempotent_get("k", t0 + 2 * h).await.unwrap();
        assert_eq!(got, Some(("Rollback".into(), call("d2", b"two"))));
        assert_eq!(store.idempotency_count().await.unwrap(), 1);
    }

    /// Pruning deletes audit records older than the retention, then the oldest beyond the
    /// row bound, and expired idempotency keys; counts before and after (injected times).
    #[tokio::test]
    async fn prune_deletes_by_age_and_by_rows() {
        let dir = tempfile::tempdir().unwrap();
        let min = 60_000_000_000_i64;
        let store = Store::open(&dir.path().join("v.db"))
            .await
            .unwrap()
            .with_retention(Retention {
                idempotency_ttl: Some(std::time::Duration::from_secs(60)),
                audit_max_age: Some(std::time::Duration::from_secs(600)),
                audit_max_rows: Some(3),
            });
        let now = 1_000 * min;
        // Ten records, one a minute, the oldest 10 minutes ago.
        for i in 0..10 {
            store
                .audit(AuditEntry {
                    at: now - (10 - i) * min,
                    caller: "me".into(),
                    method: format!("M{i}"),
                    request_digest: "d".into(),
                    outcome: "OK".into(),
                })
                .await
                .unwrap();
        }
        for (k, at) in [("old", now - 2 * min), ("new", now - min / 2)] {
            let call = IdempotentCall {
                request_digest: "d".into(),
                response: Vec::new(),
            };
            store.idempotent_put("Apply", k, call, at).await.unwrap();
        }
        assert_eq!(store.audit_count().await.unwrap(), 10);
        let p = store.prune(now).await.unwrap();
        // By age none (the oldest is exactly 10 minutes old: kept); by rows 7 of the 10.
        assert_eq!(
            p,
            Pruned {
                audit: 7,
                idempotency: 1
            }
        );
        assert_eq!(store.audit_count().await.unwrap(), 3);
        let methods: Vec<String> = store
            .readers
            .run(|tx| {
                Ok(tx
                    .prepare("SELECT method FROM audit ORDER BY id")?
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?)
            })
            .await
            .unwrap();
        assert_eq!(methods, ["M7", "M8", "M9"], "the newest stay");
        assert_eq!(store.idempotency_count().await.unwrap(), 1);
        // Later, by age alone: the records are now older than 10 minutes.
        let p = store.prune(now + 9 * min).await.unwrap();
        assert_eq!(
            p,
            Pruned {
                audit: 2,
                idempotency: 1
            }
        );
        assert_eq!(store.audit_count().await.unwrap(), 1);
        // Nothing left to prune.
        assert_eq!(store.prune(now + 9 * min).await.unwrap(), Pruned::default());
        // No bounds: nothing is ever pruned.
        let keep = Store::open(&dir.path().join("v.db"))
            .await
            .unwrap()
            .with_retention(Retention {
                idempotency_ttl: None,
                audit_max_age: None,
                audit_max_rows: None,
            });
        assert_eq!(keep.prune(i64::MAX).await.unwrap(), Pruned::default());
    }
}
