//! The SQLite store: every query of the server lives in this module.
//!
//! The database is opened in WAL mode. A write transaction is in the WAL when its commit
//! returns (a crash of vallumd keeps it: the pipeline writes the revision and commit rows
//! before the engine publishes) and on disk once the group flusher fsynced the WAL up to it
//! (`flush`): what a caller waits for is its [`Durability`] (`--sync`). Migrations from
//! `migrations/` at the workspace root are embedded and applied at open. Times are Unix
//! nanoseconds, durations nanoseconds.
//!
//! One driver, rusqlite (with its own bundled SQLite), for everything: every write
//! transaction runs on one writer connection and every read in one read transaction on one of
//! a few reader connections, each in one hop to a blocking thread (see `writer` for why
//! not sqlx, with the measurements), except the read of one ruleset's row, which every edit
//! makes and which runs on the calling thread when a reader is free ([`Store::get_ruleset`]);
//! migrations run on the writer at open (`migrate`).
//! Writers are serialised by the writer connection (and by the pipeline's write lock before
//! it); readers never wait (WAL).
//!
//! By what it stores: rulesets, revisions and commits here (this file: the rows, the commit
//! transaction and the reads), revision texts as content-addressed chunks in [`chunks`], named
//! sets in [`sets`], the audit log, idempotency keys and load failures in `audit` (with
//! their [`Retention`]), the schema in `migrate`.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::clock::Clock;
use crate::control::content::Content;
use crate::control::outcome::Outcome;
use crate::error::{Error, Result};

mod audit;
pub mod chunks;
mod flush;
mod migrate;
pub mod sets;
mod writer;

pub use audit::{IdempotentCall, Pruned, Retention};
pub use flush::Mark;
use writer::{Readers, Writer};

/// How durable a change is when vallumd answers it (`--sync`, `VALLUM_SYNC`; per call, the
/// `durability` field of Apply and EditRuleset). See docs/operations.md "Durability".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Durability {
    /// On disk before the reply (the WAL fsynced up to the change; concurrent callers share
    /// one fsync): survives a crash of vallumd and of the host (power loss).
    #[default]
    Full,
    /// In the WAL before the reply (written to the OS, not fsynced): survives a crash or
    /// kill -9 of vallumd, not a crash of the host, which may lose the changes answered since
    /// the last fsync (a `full` caller's, a checkpoint's, or the OS's own writeback). As the
    /// kernel's own iptables, which keeps nothing across a power loss.
    Normal,
}

impl Durability {
    /// The flag's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Normal => "normal",
        }
    }
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
                return Err(Error::store_corrupt(format!(
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
    /// The content's digest, hex: the root of its digest tree (sha256 over the sha256 of
    /// each chunk of the combined text, [`Content::digest`]).
    pub digest: String,
    /// Canonical content (shared: the pipeline keeps the active one without a copy).
    pub content: Arc<Content>,
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
    /// The commit's place in the WAL: on disk once [`Store::sync`] to it returned.
    pub mark: Mark,
}

/// One audit record; its time (Unix ns) is the store's clock when the row is written (see
/// [`Store::open_on`]), in the same transaction as the change it records.
#[derive(Clone, Debug)]
pub struct AuditEntry {
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
    /// The wall clock of the rows' times (see [`Store::open_on`]).
    clock: Clock,
    /// Phase columns waiting for their transaction ([`Store::finish_commit`]).
    finishing: Arc<std::sync::Mutex<Finishing>>,
}

/// The phase columns of commits not written yet, and whether a transaction that will write
/// them is on its way ([`Store::finish_commit`]).
#[derive(Debug, Default)]
struct Finishing {
    rows: Vec<(i64, Phases)>,
    scheduled: bool,
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
                content: Arc::default(),
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
        row.content = Arc::new(content);
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

/// As HTTP's If-Match: `expected`, when given and not empty, must be the ruleset's etag.
///
/// Errors: [`Error::EtagMismatch`] naming `rulesets/{name}`.
pub fn check_etag(rs: &RulesetRow, expected: Option<&str>) -> Result<()> {
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
    now: i64,
) -> Result<(Persisted, Option<u64>)> {
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
        .map(|a| writer::insert_audit(tx, a, now))
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
        content: Arc::default(),
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
            // Set by the caller, once committed.
            mark: 0,
        },
        staged,
    ))
}

// === impl Store ===

impl Store {
    /// Opens (creating it and its directory when missing) the database at `path`, in WAL mode,
    /// and applies pending migrations; writes answer at [`Durability::Full`] (see
    /// [`Store::with_durability`]).
    ///
    /// Errors: [`Error::Store`] when the file cannot be opened, [`Error::Migrate`] when a
    /// migration fails, [`Error::Io`] when the directory cannot be created.
    pub async fn open(path: &Path) -> Result<Store> {
        Store::open_on(path, Clock::system()).await
    }

    /// [`Store::open`], on `clock`: the wall time of every row it writes (revisions, audit,
    /// idempotency keys, migrations) and of [`Store::spawn_prune`]'s expiry.
    ///
    /// Errors: as [`Store::open`].
    pub async fn open_on(path: &Path, clock: Clock) -> Result<Store> {
        Store::open_to(path, i64::MAX, clock).await
    }

    /// This store answering writes as `durability` says (the default is
    /// [`Durability::Full`]; see [`Durability`]).
    pub fn with_durability(mut self, durability: Durability) -> Store {
        self.writer = self.writer.with_durability(durability);
        self
    }

    /// The store's durability (`--sync`).
    pub fn durability(&self) -> Durability {
        self.writer.durability()
    }

    /// The mark of the last committed write transaction: [`Store::sync`] to it waits for
    /// everything written so far.
    pub fn written(&self) -> Mark {
        self.writer.written()
    }

    /// Waits until every write up to `mark` is on disk (sharing the fsync with every other
    /// waiter, see the module `flush`).
    ///
    /// Errors: [`Error::Io`] when the fsync of the WAL failed (every later call fails
    /// too: restart vallumd).
    pub async fn sync(&self, mark: Mark) -> Result<()> {
        self.writer.sync(mark).await
    }

    /// Asks for every write up to `mark` to be put on disk, without waiting: the fsync
    /// starts now, a later [`Store::sync`] waits for it.
    pub fn request_sync(&self, mark: Mark) {
        self.writer.request(mark);
    }

    /// The fsyncs of the WAL the group flusher did so far (a bench divides commits by it).
    pub fn fsyncs(&self) -> u64 {
        self.writer.fsyncs()
    }

    /// [`Store::open`], applying the migrations up to and including version `until` only
    /// (tests of a migration make a database as an older build left it).
    async fn open_to(path: &Path, until: i64, clock: Clock) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
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
            let writer = Writer::open(&path, until, clock.unix_ns())?;
            let readers = Readers::open(&path, READERS)?;
            Ok(Store {
                readers,
                writer,
                revisions_kept: 0,
                retention: Retention::default(),
                clock,
                finishing: Arc::default(),
            })
        })
        .await
        .map_err(|e| Error::TaskFailed {
            task: "store open",
            source: e,
        })?
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

    /// Puts every write so far on disk (a `normal` write too: a stopped vallumd leaves
    /// nothing unsynced); the connections close when the last handle is dropped. A failed
    /// fsync is logged.
    pub async fn close(&self) {
        if let Err(e) = self.sync(self.written()).await {
            tracing::error!(error = %e, "store: the last writes are not on disk");
        }
    }

    /// One ruleset. Read on the calling thread when a reader connection is free (a point
    /// read costs microseconds, a hop to a blocking thread and back more), else on a blocking
    /// thread.
    ///
    /// Errors: [`Error::Store`].
    pub async fn get_ruleset(&self, name: &str) -> Result<Option<RulesetRow>> {
        fn read(tx: &rusqlite::Transaction<'_>, name: &str) -> Result<Option<RulesetRow>> {
            Ok(tx
                .prepare_cached("SELECT * FROM rulesets WHERE name = ?1")?
                .query_row([name], ruleset_row)
                .optional()?)
        }
        // One row by its key: on this thread when a reader is free (every edit reads it).
        if let Some(row) = self.readers.run_here(|tx| read(tx, name)) {
            return row;
        }
        let name = name.to_string();
        self.readers.run(move |tx| read(tx, &name)).await
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
                    Error::store_corrupt(format!("active revision {n} of {} is missing", rs.name))
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
        let clock = self.clock.clone();
        self.writer
            .run(move |tx| {
                let now = clock.unix_ns();
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

    /// The durable half of a commit, in one transaction that is in the WAL when this returns
    /// (on disk after [`Store::sync`] to [`Store::written`]; with [`Durability::Full`] the
    /// fsync has started):
    /// the target revision gets `state`, the previous active one `previous_state`, the
    /// ruleset points at the target, pending confirm deadlines of the ruleset are cleared
    /// (a new commit settles them), and a commit row is written. Runs on the writer
    /// connection in one hop (see `writer`).
    ///
    /// Errors: [`Error::NotFound`] for a missing ruleset or revision,
    /// [`Error::Precondition`] when a revision to commit is not STAGED,
    /// [`Error::EtagMismatch`], [`Error::Store`].
    pub async fn persist_commit(&self, c: PersistCommit) -> Result<Persisted> {
        let keep = self.revisions_kept;
        let name = c.ruleset.clone();
        let clock = self.clock.clone();
        // The pipeline waits for the disk after it released its write lock (group commit).
        let ((mut p, staged), mark) = self
            .writer
            .run_unsynced(move |tx| persist_commit_in(tx, c, keep, clock.unix_ns()))
            .await?;
        p.mark = mark;
        // A STAGED revision's text is read back after the commit (the pipeline's write lock
        // keeps other writers out meanwhile); a new revision's row is the one written.
        if let Some(n) = staged {
            p.revision = self
                .get_revision(&name, n)
                .await?
                .ok_or_else(|| Error::store_corrupt("committed revision vanished"))?;
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
        let clock = self.clock.clone();
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
                writer::set_ruleset_heads(tx, &rs, latest, active, clock.unix_ns())
            })
            .await
    }

    /// Records the phase durations of a commit after publish (in the WAL when this returns;
    /// on disk with the next fsync). The rows of commits that finish while the writer is busy
    /// (concurrent commits of other rulesets: the group commit) share one transaction: a call
    /// that finds one on its way queues its row there and returns; that transaction's caller
    /// returns once all of them are written.
    ///
    /// Errors: [`Error::Store`] (for the caller whose transaction failed: its rows and those
    /// queued with them are not written).
    pub async fn finish_commit(&self, commit_id: i64, p: &Phases) -> Result<()> {
        {
            let mut f = self.finishing.lock().unwrap_or_else(|e| e.into_inner());
            f.rows.push((commit_id, *p));
            if std::mem::replace(&mut f.scheduled, true) {
                return Ok(());
            }
        }
        let finishing = self.finishing.clone();
        // Rides on the next fsync: nobody waits for the phase columns.
        self.writer
            .run_unsynced(move |tx| {
                let rows = {
                    let mut f = finishing.lock().unwrap_or_else(|e| e.into_inner());
                    f.scheduled = false;
                    std::mem::take(&mut f.rows)
                };
                let mut update = tx.prepare_cached(
                    "UPDATE commits SET validate_ns = ?1, compile_ns = ?2, persist_ns = ?3, \
                     publish_ns = ?4, quiesce_ns = ?5, carry_ns = ?6, total_ns = ?7, \
                     cores_waited = ?8 WHERE id = ?9",
                )?;
                for (commit_id, p) in rows {
                    update.execute(params![
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
                }
                Ok(())
            })
            .await
            .map(|((), _)| ())
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
        let clock = self.clock.clone();
        self.writer
            .run(move |tx| {
                let now = clock.unix_ns();
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
        let clock = self.clock.clone();
        self.writer
            .run(move |tx| {
                let now = clock.unix_ns();
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
}

#[cfg(test)]
mod tests;
