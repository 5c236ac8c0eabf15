//! The commit pipeline: validate -> persist (while the engine compiles) -> publish (swap,
//! quiesce, carry in the engine) -> record phases, and the commit-confirmed timers.
//!
//! The entry points here (Apply, commit of a staged revision, rollback, priority, confirm,
//! revert) build a job under the write lock; one commit then reads in one function of named
//! phases, `Pipeline::run` in `pipeline/commit.rs`.
//!
//! One validation per commit: the engine's ([`Engine::validate_change`], against the active
//! rulesets, so an unchanged rule is not checked again), under the write lock that set
//! changes and other commits also take, so nothing changes between the verdict and the
//! publish. The pipeline only places the engine's violations in the caller's terms
//! ([`crate::control::content::Places`]: `FILE:LINE:COL` of an Apply's text, the field `revision` for a
//! stored revision) and refuses before anything is stored. Dry runs and Stage validate once
//! through [`Pipeline::validate`] ([`Engine::validate`]); [`crate::control::content`] parses only.
//!
//! One owner of "which revision is active" in memory: the engine ([`Engine::revisions`]: the
//! number is given to the prepared commit once the store assigned it, and changes at publish
//! with what the cores run). [`Pipeline::active`], health, the fleet agent and the metrics'
//! `vallum_active_revision` (through [`crate::control::hooks::Observer::on_active`], called after each
//! change) read it from there; the store keeps the durable fact that [`Pipeline::load`] puts
//! back into the engine at start.
//!
//! Crash safety. A commit's store transaction (the revision row, its new state, the ruleset's
//! `active_revision`, the commit row) is in the WAL (committed: a crash of vallumd keeps it)
//! BEFORE the engine publishes. At start, [`Pipeline::load`] runs exactly the revisions the
//! store marks active. So after a `kill -9` at any point, the active revision of a ruleset is
//! the last one whose transaction was committed: the last acknowledged commit, or a later one
//! that was committed but not yet acknowledged; never a mix (one transaction moves every row).
//! The phase columns of the commit row are filled after publish and may be zero after a crash.
//!
//! Durability and group commit. The caller's answer waits for what its
//! [`Durability`] promises: with `full` (the default of `--sync`) until the WAL is fsynced
//! up to the commit, a wait made AFTER the write lock is released
//! (`Pipeline::run_answered`), so the commits that queue behind the lock meanwhile share the
//! next fsync (as PostgreSQL flushes its WAL after the insert lock); the fsync is asked for as
//! soon as the transaction is committed, so one caller alone waits for it while the engine
//! compiles and publishes. A host crash before the fsync loses commits nobody was told of;
//! the engine that ran them is gone with the host.
//!
//! Commits (and every other store write) are serialised by one async lock, so the engine sees
//! commits in the order the store committed them.
//!
//! When the compile or the publish fails after validation passed (not expected; a publish
//! refused as stale), the store transaction is reverted by a compensating one and the commit
//! is FAILED.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use vallum_engine::engine::{ActiveRevision, Change, CommitError, Engine};
use vallum_engine::model::Ruleset;
use vallum_engine::sets::SetManager;
use vallum_engine::validate::{Severity, Violation};

use crate::clock::Clock;
use crate::control::content::{self, Checked, Content, Finding, Places, PreviousParse, SourceText};
use crate::control::hooks::{CommitRecord, Hooks};
use crate::control::outcome::Outcome;
use crate::control::store::{
    AuditEntry, CommitTarget, Durability, LoadFailure, NewRevision, Phases, RevisionRow,
    RevisionState, RulesetRow, Store, check_etag,
};
use crate::error::{Error, FieldViolation, Reason, Result};
use crate::grpc::limits;
use crate::host::facts_chains::FactsChains;
use crate::host::kernel_tables::KernelTables;

mod commit;
mod confirm;
pub use commit::Answer;
pub mod journal;
pub mod sets;
pub mod shadow;

/// A commit event, as WatchCommits streams it: one per [`Outcome`] of every commit request
/// (refusals included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitEvent {
    /// Position in the event stream ([`journal`] numbers it when it is sent).
    pub sequence: u64,
    /// Ruleset name.
    pub ruleset: String,
    /// Revision number; `None` for a refused request (no revision was made).
    pub revision: Option<u64>,
    /// Outcome.
    pub outcome: Outcome,
    /// Phase durations.
    pub phases: Phases,
    /// Error text of a failed or refused commit.
    pub error: Option<String>,
    /// Unix ns.
    pub time_ns: i64,
}

/// The result of a successful commit.
#[derive(Clone, Debug)]
pub struct CommitResult {
    /// The revision made active (state ACTIVE or PENDING_CONFIRM).
    pub revision: RevisionRow,
    /// Phase durations.
    pub phases: Phases,
    /// The confirm deadline, Unix ns, for a commit-confirmed.
    pub confirm_deadline: Option<i64>,
    /// The ruleset's new etag.
    pub etag: String,
    /// The warnings of an Apply's text (the parser's, then validation's, at their
    /// `FILE:LINE:COL`); empty for a commit of a stored revision.
    pub warnings: Vec<Finding>,
}

/// The pipeline: engine, store, ipset-style sets, event channel and hooks.
pub struct Pipeline {
    engine: Arc<Engine>,
    store: Store,
    /// The set registry every validation and commit resolves `--match-set` against; changed
    /// by the methods in [`sets`] (under the write lock, durable before published).
    sets: Arc<SetManager>,
    /// [`Hooks::clock`]: the engine's clock (the engine was made with it) and the wall clock
    /// of commit times, audit rows and commit-confirmed deadlines.
    clock: Clock,
    write: tokio::sync::Mutex<()>,
    events: journal::Journal,
    hooks: Hooks,
    /// Per ruleset, the texts its last Apply was parsed from and the model (see
    /// [`Pipeline::previous_parse`]).
    parses: Mutex<HashMap<String, PreviousParse>>,
    /// Per ruleset, the number and canonical content of the revision its last commit published
    /// (see [`Pipeline::active_content`]).
    contents: Mutex<HashMap<String, (u64, Arc<Content>)>>,
    /// Active revisions that did not load at start, by ruleset (see [`Pipeline::load`]);
    /// the one owner of that fact in memory (the store keeps the durable mark).
    not_loaded: tokio::sync::watch::Sender<BTreeMap<String, LoadFailure>>,
    /// `--kernel-tables`: the tables handed to the kernel with each commit, before the
    /// publish ([`crate::host::kernel_tables`]).
    kernel: Option<Arc<KernelTables>>,
    /// `--nfqueue-facts-mark`: the steering's facts chains, written with each commit whose
    /// kernel-decided expressions change, before the publish ([`crate::host::facts_chains`]).
    facts: Option<Arc<FactsChains>>,
    /// The running shadow's deadline ([`shadow`]); the engine owns the shadow itself.
    shadow: Mutex<Option<shadow::ShadowDeadline>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").finish_non_exhaustive()
    }
}

/// What to commit, internally.
struct Job {
    ruleset: String,
    model: Ruleset,
    target: CommitTarget,
    state: RevisionState,
    outcome: Outcome,
    previous_state: RevisionState,
    confirm_deadline: Option<i64>,
    etag: Option<String>,
    /// Where `model` came from: where its findings are placed.
    from: Origin,
    /// The ruleset does not exist yet: `--max-rulesets` is checked (after validation).
    creates: bool,
    /// `model` was made from the active one by edits ([`Checked::edited`]): committed as
    /// `Change::PutEdited`, which keeps the live counters of the rules it did not touch.
    edited: bool,
    /// The ruleset's new priority (`model`'s), stored with the commit
    /// ([`Pipeline::set_priority`]); `None` keeps the stored one.
    priority: Option<i32>,
    /// What the caller waits for (`None`: the store's, `--sync`); with `Full` the fsync is
    /// asked for as soon as the transaction is committed ([`Pipeline::run_answered`] sets it).
    durability: Option<Durability>,
}

/// Where a commit's model came from.
enum Origin {
    /// An Apply's texts.
    Request {
        /// The parser's findings (warnings).
        findings: Vec<Finding>,
        /// Where validation's are placed.
        places: Places,
        /// The texts, kept after the commit for the next Apply of the ruleset
        /// ([`Pipeline::previous_parse`]); may be empty.
        texts: Vec<SourceText>,
    },
    /// A stored revision (a commit of a staged one, a rollback, a revert): errors are on the
    /// field `revision`.
    Stored,
}

impl Origin {
    /// Validation's `warnings` in the caller's terms (none for a stored revision, whose
    /// warnings the caller got when it was stored).
    fn warnings(&mut self, warnings: &[Violation]) -> Vec<Finding> {
        match self {
            Origin::Request {
                findings, places, ..
            } => {
                let mut all = std::mem::take(findings);
                all.extend(places.findings(warnings));
                all
            }
            Origin::Stored => Vec::new(),
        }
    }

    /// The refusal of a model whose validation found errors (`violations`: all of them,
    /// warnings too).
    fn refusal(&mut self, violations: &[Violation]) -> Error {
        match self {
            Origin::Request { .. } => match content::accept(self.warnings(violations)) {
                Err(e) => e,
                Ok(_) => Error::invariant("validation failed without an error"),
            },
            Origin::Stored => Error::BadRequest {
                reason: Reason::InvalidRuleset,
                violations: violations
                    .iter()
                    .filter(|v| v.severity == Severity::Error)
                    .map(|v| FieldViolation::new("revision", v.to_string()))
                    .collect(),
            },
        }
    }
}

impl Pipeline {
    /// A pipeline around `engine` and `store`, on [`Hooks::clock`] (which must be the clock
    /// `engine` was made with: set expiries are on the engine's clock).
    pub fn new(engine: Arc<Engine>, store: Store, hooks: Hooks) -> Self {
        let clock = hooks.clock.clone();
        let events =
            journal::Journal::new(u64::try_from(clock.unix_ns()).unwrap_or(1), journal::KEPT);
        // Set lookups in the engine's batches read through its generations (no lock).
        let sets = Arc::new(SetManager::for_dataplane(Arc::clone(engine.quiescence())));
        Pipeline {
            engine,
            store,
            sets,
            clock,
            write: tokio::sync::Mutex::new(()),
            events,
            hooks,
            parses: Mutex::new(HashMap::new()),
            contents: Mutex::new(HashMap::new()),
            not_loaded: tokio::sync::watch::Sender::new(BTreeMap::new()),
            kernel: None,
            facts: None,
            shadow: Mutex::new(None),
        }
    }

    /// This pipeline handing `kernel`'s tables to the kernel with each commit that changes
    /// them (after the store, before the publish; see [`crate::host::kernel_tables`]).
    pub fn with_kernel_tables(mut self, kernel: Arc<KernelTables>) -> Self {
        self.kernel = Some(kernel);
        self
    }

    /// This pipeline writing the steering's facts chains ([`crate::host::facts_chains`]) with each
    /// commit whose kernel-decided expressions change (after the kernel tables, before the
    /// publish) and at start ([`Pipeline::sync_kernel_tables`]).
    pub fn with_facts_chains(mut self, facts: Arc<FactsChains>) -> Self {
        self.facts = Some(facts);
        self
    }

    /// The kernel tables (`--kernel-tables`), if any.
    pub fn kernel_tables(&self) -> Option<&Arc<KernelTables>> {
        self.kernel.as_ref()
    }

    /// Writes every kernel table of the active rulesets to the kernel (at start, after
    /// [`Pipeline::load`]), and the steering's facts chains of what the engine runs;
    /// nothing without `--kernel-tables` and `--nfqueue-facts-mark`.
    ///
    /// Errors: [`Error::KernelTables`] when the kernel refuses them.
    pub async fn sync_kernel_tables(&self) -> Result<()> {
        let _w = self.write.lock().await;
        if let Some(f) = &self.facts {
            f.apply(&self.engine.kernel_facts()).await?;
        }
        match &self.kernel {
            Some(k) => k.sync(&self.engine.rulesets()).await,
            None => Ok(()),
        }
    }

    /// What the kernel tables become when `ruleset` is `change` (`None`: removed); `None`
    /// when nothing changes there (or without `--kernel-tables`). The caller holds the write
    /// lock.
    fn kernel_next(
        &self,
        ruleset: &str,
        change: Option<(i32, Vec<vallum_engine::model::Table>)>,
    ) -> Result<Option<crate::host::kernel_tables::Next>> {
        match &self.kernel {
            Some(k) => k.next(ruleset, change, &self.engine.rulesets()),
            None => Ok(None),
        }
    }

    /// Writes `next` to the kernel (see [`Pipeline::kernel_next`]).
    async fn kernel_apply(
        &self,
        next: Option<crate::host::kernel_tables::Next>,
    ) -> Result<Option<crate::host::kernel_tables::Undo>> {
        match (&self.kernel, next) {
            (Some(k), Some(next)) => k.apply(next).await.map(Some),
            _ => Ok(None),
        }
    }

    /// Puts the facts chains back to what the engine runs after a commit failed past them
    /// (a failure is logged: the next commit writes them again).
    async fn facts_restore(&self) {
        if let Some(f) = &self.facts {
            if let Err(e) = f.apply(&self.engine.kernel_facts()).await {
                tracing::warn!(error = %e, "putting the facts chains back failed");
            }
        }
    }

    /// Puts the kernel tables back after what followed [`Pipeline::kernel_apply`] failed.
    async fn kernel_undo(&self, undo: Option<crate::host::kernel_tables::Undo>) {
        if let (Some(k), Some(undo)) = (&self.kernel, undo) {
            k.undo(undo).await;
        }
    }

    /// Active revisions of the store that the engine does not run because they did not load
    /// at start, by ruleset (empty when everything loaded).
    pub fn not_loaded(&self) -> BTreeMap<String, LoadFailure> {
        self.not_loaded.borrow().clone()
    }

    /// Follows [`Pipeline::not_loaded`]: changes when a load fails and when a failed ruleset
    /// gets a new active revision or is deleted (for health).
    pub fn watch_not_loaded(&self) -> tokio::sync::watch::Receiver<BTreeMap<String, LoadFailure>> {
        self.not_loaded.subscribe()
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The configured limits (`--max-rules`, `--max-chains`, ...).
    pub fn limits(&self) -> &limits::LimitsConfig {
        &self.hooks.limits
    }

    /// The set registry (ipset-style sets) rules are validated and compiled against.
    pub fn sets(&self) -> &Arc<SetManager> {
        &self.sets
    }

    /// Now on the engine's clock (ns): the time base of `-m limit` and of the workers.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// The clock (engine time and wall time) this pipeline runs on.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The hooks.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// Subscribes to commit events (those after the call).
    pub fn subscribe(&self) -> broadcast::Receiver<CommitEvent> {
        self.events.subscribe()
    }

    /// The kept commit events after sequence `after`, and the events after them (see
    /// [`journal::Journal::resume`]).
    ///
    /// Errors: [`Error::EventsNotKept`], [`Error::BadRequest`] on `start_after`.
    pub fn resume_events(
        &self,
        after: u64,
    ) -> Result<(Vec<CommitEvent>, broadcast::Receiver<CommitEvent>)> {
        self.events.resume(after)
    }

    /// Active rulesets: name -> revision and priority, as the engine runs them now
    /// ([`Engine::revisions`], the one owner; a stored active revision that did not load is
    /// in [`Pipeline::not_loaded`] instead).
    pub fn active(&self) -> BTreeMap<String, ActiveRevision> {
        self.engine.revisions()
    }

    /// Validates `checked` as a commit of it would now (the engine's validator against the
    /// active rulesets and this pipeline's sets), without committing: for dry runs, Stage
    /// and the fleet's check. Off the async workers (a large ruleset takes milliseconds).
    ///
    /// Errors: [`Error::TaskFailed`] when the validation task fails.
    ///
    /// The engine sets an nft input's named sets become ([`Checked::nft_sets`]) count as
    /// existing, as they will once its commit creates them
    /// ([`Pipeline::ensure_nft_sets`]).
    pub async fn validate(&self, checked: Checked) -> Result<Checked> {
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        tokio::task::spawn_blocking(move || {
            let planned = sets::Planned::new(&sets, checked.nft_sets());
            let violations = engine.validate(&checked.ruleset, &planned);
            checked.with_violations(&violations)
        })
        .await
        .map_err(|e| Error::TaskFailed {
            task: "validation",
            source: e,
        })
    }

    /// Loads every active revision of the store into the engine (one atomic engine commit,
    /// each revision numbered in the engine) and returns those that did not load: a revision
    /// whose text no longer parses or validates (e.g. it names a set that is gone), or that
    /// the store cannot read. Each of those is marked in the store (table `load_failures`)
    /// with an audit record (caller `vallumd`, method `Load`, outcome
    /// ACTIVE_REVISION_NOT_LOADED), reported to the observer (`vallum_rulesets_not_loaded`)
    /// and kept in [`Pipeline::not_loaded`]; the caller decides whether to serve without them
    /// (`--on-load-failure`). The marks of rulesets that loaded are cleared.
    ///
    /// Validation is the commit's: every revision is validated once, in the one engine
    /// commit; when some fail, the others are validated again without them.
    ///
    /// Errors: [`Error::Store`] when the rulesets cannot be listed or a mark cannot be
    /// written; [`Error::Commit`] when the engine refuses the revisions that did load.
    pub async fn load(&self) -> Result<Vec<LoadFailure>> {
        let _w = self.write.lock().await;
        // Per ruleset that parsed: the model, its revision and digest.
        let mut loading: BTreeMap<String, (Ruleset, u64, String)> = BTreeMap::new();
        let mut failed = Vec::new();
        for rs in self.store.list_rulesets().await? {
            let Some(number) = rs.active_revision else {
                continue;
            };
            match self.load_one(&rs, number).await {
                Ok((model, digest)) => {
                    loading.insert(rs.name.clone(), (model, number, digest));
                }
                Err((digest, error)) => failed.push((
                    LoadFailure {
                        ruleset: rs.name.clone(),
                        revision: number,
                        error,
                        at: self.clock.unix_ns(),
                    },
                    digest,
                )),
            }
        }
        let prepared = loop {
            let engine = self.engine.clone();
            let sets = self.sets.clone();
            let models: Vec<Ruleset> = loading.values().map(|(m, _, _)| m.clone()).collect();
            let prepared = tokio::task::spawn_blocking(move || {
                engine.prepare(Change::ReplaceAll(models), &*sets)
            })
            .await
            .map_err(|e| Error::TaskFailed {
                task: "load",
                source: e,
            })?;
            let violations = match prepared {
                Err(CommitError::Invalid(v)) => v,
                other => break other.map_err(|e| Error::Commit(e.to_string()))?,
            };
            // Those with errors do not load; the others are committed without them.
            let mut errors: BTreeMap<&str, Vec<String>> = BTreeMap::new();
            for v in violations.iter().filter(|v| v.severity == Severity::Error) {
                errors.entry(&v.ruleset).or_default().push(v.to_string());
            }
            if errors.is_empty() {
                return Err(Error::invariant("validation failed without an error"));
            }
            for (name, errors) in errors {
                let Some((_, number, digest)) = loading.remove(name) else {
                    return Err(Error::invariant(format!(
                        "validation named ruleset {name}, which is not loading"
                    )));
                };
                let shown: Vec<String> = errors.into_iter().take(3).collect();
                failed.push((
                    LoadFailure {
                        ruleset: name.to_string(),
                        revision: number,
                        error: format!("no longer valid: {}", shown.join("; ")),
                        at: self.clock.unix_ns(),
                    },
                    digest,
                ));
            }
        };
        let mut prepared = prepared;
        for (name, (_, number, _)) in &loading {
            prepared.set_revision(name, *number);
        }
        let engine = self.engine.clone();
        // At start no packet source runs yet: the replaced (empty) snapshot retires at once.
        let committed = tokio::task::spawn_blocking(move || {
            let published = engine.publish(prepared);
            drop(engine.settle());
            published
        })
        .await
        .map_err(|e| Error::TaskFailed {
            task: "load",
            source: e,
        })?
        .map_err(|e| Error::Commit(e.to_string()))?;
        drop(committed);
        for (name, (_, number, _)) in &loading {
            self.hooks.observer.on_active(name, Some(*number));
        }
        for old in self.store.load_failures().await? {
            if loading.contains_key(&old.ruleset) {
                self.store.clear_load_failure(&old.ruleset).await?;
            }
        }
        let mut marks = BTreeMap::new();
        for (f, digest) in failed {
            tracing::error!(
                reason = "ACTIVE_REVISION_NOT_LOADED",
                ruleset = %f.ruleset,
                revision = f.revision,
                error = %f.error,
                "active revision not loaded: the engine does not run it"
            );
            let audit = AuditEntry {
                caller: "vallumd".into(),
                method: "Load".into(),
                request_digest: digest,
                outcome: Reason::ActiveRevisionNotLoaded.info().name.into(),
            };
            self.store.record_load_failure(f.clone(), audit).await?;
            marks.insert(f.ruleset.clone(), f);
        }
        let failed: Vec<LoadFailure> = marks.values().cloned().collect();
        self.hooks.observer.on_not_loaded(marks.len());
        self.not_loaded.send_replace(marks);
        Ok(failed)
    }

    /// The model of revision `number` of `rs` and the revision's digest, or why it does not
    /// parse: (the revision's digest when it could be read, the error).
    async fn load_one(
        &self,
        rs: &RulesetRow,
        number: u64,
    ) -> std::result::Result<(Ruleset, String), (String, String)> {
        let rev = match self.store.get_revision(&rs.name, number).await {
            Ok(Some(rev)) => rev,
            Ok(None) => return Err((String::new(), "the revision is missing".into())),
            Err(e) => return Err((String::new(), e.to_string())),
        };
        let model = rev
            .content
            .to_ruleset(&rs.name, rs.priority)
            .map_err(|e| (rev.digest.clone(), e.to_string()))?;
        Ok((model, rev.digest))
    }

    /// Forgets that `ruleset`'s active revision did not load (it has another one now, or
    /// none): the store's mark, [`Pipeline::not_loaded`] and the observer. A failure to
    /// clear the durable mark is reported on stderr; the next start clears it.
    async fn forget_not_loaded(&self, ruleset: &str) {
        if !self.not_loaded.borrow().contains_key(ruleset) {
            return;
        }
        if let Err(e) = self.store.clear_load_failure(ruleset).await {
            tracing::warn!(ruleset, error = %e, "clearing the load failure failed");
        }
        let mut left = 0;
        self.not_loaded.send_modify(|m| {
            m.remove(ruleset);
            left = m.len();
        });
        self.hooks.observer.on_not_loaded(left);
    }

    /// Validates a checked input ([`Pipeline::validate`]) and stores it as a STAGED revision;
    /// returns its warnings too (the parser's and validation's).
    ///
    /// Errors: [`Error::BadRequest`] when `checked` has errors; [`Error::EtagMismatch`];
    /// [`Error::Store`].
    pub async fn stage(
        &self,
        checked: Checked,
        author: &str,
        message: &str,
        etag: Option<&str>,
    ) -> Result<(RulesetRow, RevisionRow, Vec<Finding>)> {
        let mut checked = self.validate(checked).await?.into_valid()?;
        self.check_rules(&checked)?;
        let new = new_revision(&mut checked, author, message);
        let _w = self.write.lock().await;
        self.check_rulesets(&new.ruleset).await?;
        let (rs, rev) = self.store.stage(new, etag).await?;
        Ok((rs, rev, std::mem::take(&mut checked.findings)))
    }

    /// Makes staged revision `number` of `ruleset` active; with `confirm_within`, it is
    /// rolled back unless confirmed in time.
    ///
    /// Errors: [`Error::NotFound`], [`Error::Precondition`] (not STAGED),
    /// [`Error::EtagMismatch`], [`Error::Commit`], [`Error::Store`].
    pub async fn commit_staged(
        &self,
        ruleset: &str,
        number: u64,
        confirm_within: Option<Duration>,
        etag: Option<&str>,
        audit: &mut Option<AuditEntry>,
    ) -> Result<CommitResult> {
        let created = self.ensure_stored_nft_sets(ruleset, number).await?;
        let done = self
            .commit_staged_locked(ruleset, number, confirm_within, etag, audit)
            .await;
        self.settle_nft_sets(&created, done).await
    }

    /// [`Pipeline::commit_staged`] once the sets of an nft revision exist.
    async fn commit_staged_locked(
        &self,
        ruleset: &str,
        number: u64,
        confirm_within: Option<Duration>,
        etag: Option<&str>,
        audit: &mut Option<AuditEntry>,
    ) -> Result<CommitResult> {
        let w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        let rev = self.revision(ruleset, number).await?;
        let model = rev.content.to_ruleset(ruleset, rs.priority)?;
        let (state, deadline) = self.confirm_state(confirm_within);
        self.run_answered(
            w,
            None,
            Job {
                ruleset: ruleset.to_string(),
                model,
                target: CommitTarget::Staged(number),
                state,
                outcome: Outcome::Committed,
                previous_state: RevisionState::Superseded,
                confirm_deadline: deadline,
                etag: etag.map(str::to_string),
                from: Origin::Stored,
                creates: false,
                edited: false,
                priority: None,
                durability: None,
            },
            audit,
        )
        .await
    }

    /// Stage + commit in one store transaction: `checked` is validated by the commit (the
    /// engine's one validation, under the write lock), its findings placed at their
    /// `FILE:LINE:COL`.
    ///
    /// Errors: as [`Pipeline::stage`] and [`Pipeline::commit_staged`].
    pub async fn apply(
        &self,
        checked: Checked,
        author: &str,
        message: &str,
        confirm_within: Option<Duration>,
        etag: Option<&str>,
        audit: &mut Option<AuditEntry>,
    ) -> Result<CommitResult> {
        let answer = Answer {
            durability: None,
            audit,
        };
        self.apply_as(checked, author, message, confirm_within, etag, answer)
            .await
    }

    /// [`Pipeline::apply`], answered when the commit is as durable as `answer` asks (the
    /// store's `--sync` when it does not say): a caller's own `durability`.
    ///
    /// Errors: as [`Pipeline::apply`].
    pub async fn apply_as(
        &self,
        mut checked: Checked,
        author: &str,
        message: &str,
        confirm_within: Option<Duration>,
        etag: Option<&str>,
        answer: Answer<'_>,
    ) -> Result<CommitResult> {
        let Answer { durability, audit } = answer;
        self.check_rules(&checked)?;
        // An nft ruleset's named sets exist before its commit validates against them.
        let created = self.ensure_nft_sets(checked.nft_sets()).await?;
        let new = new_revision(&mut checked, author, message);
        let (state, deadline) = self.confirm_state(confirm_within);
        let w = self.write.lock().await;
        let edited = checked.edited;
        let from = Origin::Request {
            findings: checked.findings,
            places: checked.places,
            texts: checked.sources,
        };
        let mut model = checked.ruleset;
        // A ruleset's priority is fixed when it is created: an active one's is the engine's.
        let mut creates = false;
        match self.engine.priority(&new.ruleset) {
            Some(priority) => model.priority = priority,
            None => match self.store.get_ruleset(&new.ruleset).await? {
                Some(rs) => model.priority = rs.priority,
                None => creates = true,
            },
        }
        let done = self
            .run_answered(
                w,
                durability,
                Job {
                    ruleset: new.ruleset.clone(),
                    model,
                    target: CommitTarget::New(new),
                    state,
                    outcome: Outcome::Committed,
                    previous_state: RevisionState::Superseded,
                    confirm_deadline: deadline,
                    etag: etag.map(str::to_string),
                    from,
                    creates,
                    edited,
                    priority: None,
                    durability: None,
                },
                audit,
            )
            .await;
        self.settle_nft_sets(&created, done).await
    }

    /// [`Pipeline::ensure_nft_sets`] for stored revision `number` of `ruleset` when its
    /// content is nft (before a commit of it takes the write lock); the names created.
    ///
    /// Errors: as [`Pipeline::ensure_nft_sets`]; [`Error::Store`]; a revision that does not
    /// exist is left to the commit to report.
    async fn ensure_stored_nft_sets(&self, ruleset: &str, number: u64) -> Result<Vec<String>> {
        let Some(rev) = self.store.get_revision(ruleset, number).await? else {
            return Ok(Vec::new());
        };
        if !rev.content.is_nft() {
            return Ok(Vec::new());
        }
        let lowered = crate::control::content::nft::lower_stored(rev.content.v4(), ruleset, 0)?;
        self.ensure_nft_sets(&lowered.sets).await
    }

    /// Commits the content of revision `number` as a new revision.
    ///
    /// Errors: [`Error::NotFound`], [`Error::EtagMismatch`], [`Error::Commit`],
    /// [`Error::Store`].
    pub async fn rollback(
        &self,
        ruleset: &str,
        number: u64,
        author: &str,
        message: &str,
        etag: Option<&str>,
        audit: &mut Option<AuditEntry>,
    ) -> Result<CommitResult> {
        let created = self.ensure_stored_nft_sets(ruleset, number).await?;
        let done = self
            .rollback_locked(ruleset, number, author, message, etag, audit)
            .await;
        self.settle_nft_sets(&created, done).await
    }

    /// [`Pipeline::rollback`] once the sets of an nft revision exist.
    async fn rollback_locked(
        &self,
        ruleset: &str,
        number: u64,
        author: &str,
        message: &str,
        etag: Option<&str>,
        audit: &mut Option<AuditEntry>,
    ) -> Result<CommitResult> {
        let w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        let rev = self.revision(ruleset, number).await?;
        let model = rev.content.to_ruleset(ruleset, rs.priority)?;
        let message = if message.is_empty() {
            format!("rollback to revision {number}")
        } else {
            message.to_string()
        };
        self.run_answered(
            w,
            None,
            Job {
                ruleset: ruleset.to_string(),
                model,
                target: CommitTarget::New(NewRevision {
                    ruleset: ruleset.to_string(),
                    priority: rs.priority,
                    content: (*rev.content).clone(),
                    rule_count: rev.rule_count,
                    author: author.to_string(),
                    message,
                }),
                state: RevisionState::Active,
                outcome: Outcome::RolledBack,
                previous_state: RevisionState::Superseded,
                confirm_deadline: None,
                etag: etag.map(str::to_string),
                from: Origin::Stored,
                creates: false,
                edited: false,
                priority: None,
                durability: None,
            },
            audit,
        )
        .await
    }

    /// Changes the priority of `ruleset` (UpdateRuleset). With an active revision it is a
    /// commit of its own, because the priority orders the rulesets in the dataplane: a new
    /// revision with the active content (author `author`, message `priority A -> B`), made
    /// active with the new priority in one store transaction, with the call's `audit` record
    /// and a COMMITTED event; without one only the stored priority changes. An unchanged
    /// priority changes nothing. Returns the ruleset after.
    ///
    /// Errors: [`Error::NotFound`]; [`Error::EtagMismatch`]; [`Error::Precondition`]
    /// (`REVISION_STATE`) while a commit of the ruleset waits for ConfirmCommit (a commit
    /// would settle it); [`Error::Commit`]; [`Error::Store`].
    pub async fn set_priority(
        &self,
        ruleset: &str,
        priority: i32,
        author: &str,
        etag: Option<&str>,
        audit: &mut Option<AuditEntry>,
    ) -> Result<RulesetRow> {
        let w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        check_etag(&rs, etag)?;
        if rs.priority == priority {
            return Ok(rs);
        }
        let Some(active) = rs.active_revision else {
            return self.store.set_priority(ruleset, priority, etag).await;
        };
        if let Some(c) = (self.store.pending_confirms().await?)
            .into_iter()
            .find(|c| c.ruleset == ruleset)
        {
            return Err(Error::Precondition {
                kind: "REVISION_STATE",
                subject: format!("rulesets/{ruleset}/revisions/{}", c.revision),
                message: "the revision waits for ConfirmCommit: confirm it (or let it revert) \
                          before changing the priority"
                    .into(),
            });
        }
        let rev = self.revision(ruleset, active).await?;
        let model = rev.content.to_ruleset(ruleset, priority)?;
        self.run_answered(
            w,
            None,
            Job {
                ruleset: ruleset.to_string(),
                model,
                target: CommitTarget::New(NewRevision {
                    ruleset: ruleset.to_string(),
                    priority,
                    content: (*rev.content).clone(),
                    rule_count: rev.rule_count,
                    author: author.to_string(),
                    message: format!("priority {} -> {priority}", rs.priority),
                }),
                state: RevisionState::Active,
                outcome: Outcome::Committed,
                previous_state: RevisionState::Superseded,
                confirm_deadline: None,
                etag: etag.map(str::to_string),
                from: Origin::Stored,
                creates: false,
                edited: false,
                priority: Some(priority),
                durability: None,
            },
            audit,
        )
        .await?;
        self.ruleset(ruleset).await
    }

    /// Deactivates a ruleset in the engine and deletes it from the store.
    ///
    /// Errors: [`Error::NotFound`], [`Error::EtagMismatch`], [`Error::Commit`],
    /// [`Error::Store`].
    pub async fn delete(&self, ruleset: &str, etag: Option<&str>) -> Result<()> {
        let _w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        check_etag(&rs, etag)?;
        // Its kernel tables leave the kernel first (see `kernel_tables`).
        let next = self.kernel_next(ruleset, None)?;
        let undo = self.kernel_apply(next).await?;
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        let name = ruleset.to_string();
        let removed =
            tokio::task::spawn_blocking(move || engine.commit(Change::Remove(name), &*sets))
                .await
                .map_err(|e| Error::TaskFailed {
                    task: "commit",
                    source: e,
                })
                .and_then(|r| r.map_err(|e| Error::Commit(e.to_string())));
        if let Err(e) = removed {
            self.kernel_undo(undo).await;
            return Err(e);
        }
        self.activated(ruleset, None);
        self.store.delete_ruleset(ruleset, etag).await?;
        self.forget_not_loaded(ruleset).await;
        Ok(())
    }

    async fn ruleset(&self, name: &str) -> Result<RulesetRow> {
        self.store
            .get_ruleset(name)
            .await?
            .ok_or_else(|| Error::NotFound {
                kind: "ruleset",
                name: format!("rulesets/{name}"),
            })
    }

    async fn revision(&self, ruleset: &str, number: u64) -> Result<RevisionRow> {
        self.store
            .get_revision(ruleset, number)
            .await?
            .ok_or_else(|| Error::NotFound {
                kind: "revision",
                name: format!("rulesets/{ruleset}/revisions/{number}"),
            })
    }

    /// After the engine published `ruleset`'s new active revision (or that it has none):
    /// forgets a deactivated ruleset's previous parse and kept content (a ruleset deleted and
    /// made again numbers its revisions from 1 again), and tells the observer.
    fn activated(&self, ruleset: &str, revision: Option<u64>) {
        if revision.is_none() {
            self.parses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(ruleset);
            self.contents
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(ruleset);
        }
        self.hooks.observer.on_active(ruleset, revision);
    }

    /// Keeps `content`, the canonical content of revision `number` of `ruleset` that a commit
    /// just published, for [`Pipeline::active_content`] (replacing the one kept before).
    fn keep_content(&self, ruleset: &str, number: u64, content: Arc<Content>) {
        self.contents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ruleset.to_string(), (number, content));
    }

    /// The canonical content of revision `number` of `ruleset` when it is the one the last
    /// commit of `ruleset` published (kept in memory since: a revision's content never
    /// changes), so a `--noflush` edit of the active revision does not read its text back from
    /// the store; `None` otherwise (the caller reads the store).
    pub fn active_content(&self, ruleset: &str, number: u64) -> Option<Arc<Content>> {
        self.contents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(ruleset)
            .filter(|(n, _)| *n == number)
            .map(|(_, c)| c.clone())
    }

    /// The model the engine runs for `ruleset` and the number of its revision, read together
    /// from the one owner ([`Engine::revision_model`]): that revision's model. `None` when the
    /// ruleset is not active.
    pub fn active_model(&self, ruleset: &str) -> Option<(u64, Arc<Ruleset>)> {
        self.engine.revision_model(ruleset)
    }

    /// The texts the last Apply of `ruleset` was parsed from and the model it gave, for
    /// [`crate::control::content::check_after`] (`None` before the first Apply, after a delete).
    /// Its model may no longer be active: the pair is still a text and its parse.
    pub fn previous_parse(&self, ruleset: &str) -> Option<PreviousParse> {
        self.parses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(ruleset)
            .cloned()
    }

    /// For revision `number` of `ruleset` when its content is nft: the nft rule each engine
    /// rule of its lowering enforces ([`crate::control::content::nft::rule_refs`]), for
    /// counters and trace steps; `None` for iptables content or a revision that is gone.
    /// The content is the copy the last commit kept when it is that revision, else the
    /// store's.
    ///
    /// Errors: [`Error::Store`]; [`Error::StoreCorrupt`] for a listing that does not lower.
    pub async fn nft_rule_refs(
        &self,
        ruleset: &str,
        number: u64,
    ) -> Result<Option<crate::control::content::nft::NftRuleRefs>> {
        let content = match self.active_content(ruleset, number) {
            Some(c) => c,
            None => match self.store.get_revision(ruleset, number).await? {
                Some(rev) => rev.content,
                None => return Ok(None),
            },
        };
        if !content.is_nft() {
            return Ok(None);
        }
        crate::control::content::nft::rule_refs(content.v4(), ruleset).map(Some)
    }

    /// `--max-rules`: refuses a ruleset with too many rules.
    fn check_rules(&self, checked: &Checked) -> Result<()> {
        limits::check_rules(
            checked.rule_count(),
            self.hooks.limits.max_rules_per_ruleset,
        )?;
        Ok(())
    }

    /// `--max-rulesets`: refuses to create `ruleset` when it is new and the store is full.
    /// The caller holds the write lock, so the count cannot change before the insert.
    async fn check_rulesets(&self, ruleset: &str) -> Result<()> {
        if self.store.get_ruleset(ruleset).await?.is_none() {
            let existing = self.store.list_rulesets().await?.len();
            limits::check_rulesets(existing, self.hooks.limits.max_rulesets)?;
        }
        Ok(())
    }

    /// Reports a commit request that ended with `error` before anything changed: when the
    /// error is a refusal of the request's ruleset ([`Outcome::of_refusal`]), a REFUSED
    /// event goes to the watch stream (for a valid `ruleset` name) and to the observer (the
    /// metrics). Other errors are no commit attempt (not found, etag, state) or were
    /// reported as FAILED where they happened.
    ///
    /// The observer's ruleset is empty unless the ruleset exists: refusals of made-up names
    /// must not grow the metrics' label sets without bound.
    pub async fn refused(&self, ruleset: Option<&str>, error: &Error) {
        let Some(outcome) = Outcome::of_refusal(error) else {
            return;
        };
        let known = match ruleset {
            Some(name) if self.engine.priority(name).is_some() => true,
            Some(name) => matches!(self.store.get_ruleset(name).await, Ok(Some(_))),
            None => false,
        };
        if let Some(name) = ruleset {
            self.events.send(CommitEvent {
                sequence: 0,
                ruleset: name.to_string(),
                revision: None,
                outcome,
                phases: Phases::default(),
                error: Some(error.client_message()),
                time_ns: self.clock.unix_ns(),
            });
        }
        self.hooks.observer.on_commit(&CommitRecord {
            ruleset: ruleset.filter(|_| known).unwrap_or_default().to_string(),
            revision: None,
            outcome,
            phases: Phases::default(),
            rules: 0,
        });
    }

    /// [`Self::emit`] of a commit of `ruleset` that failed with `e` before any revision or
    /// phase: no revision, no timings, no rules.
    fn emit_failed(&self, ruleset: &str, e: &Error) {
        self.emit(
            ruleset,
            None,
            Outcome::Failed,
            Phases::default(),
            Some(e.client_message()),
            0,
        );
    }

    fn emit(
        &self,
        ruleset: &str,
        revision: Option<u64>,
        outcome: Outcome,
        phases: Phases,
        error: Option<String>,
        rules: u64,
    ) {
        self.events.send(CommitEvent {
            sequence: 0,
            ruleset: ruleset.to_string(),
            revision,
            outcome,
            phases,
            error,
            time_ns: self.clock.unix_ns(),
        });
        self.hooks.observer.on_commit(&CommitRecord {
            ruleset: ruleset.to_string(),
            revision,
            outcome,
            phases,
            rules,
        });
    }
}

/// The revision to store for `c`, its content moved out of `c` (not copied: a 10k-rule text
/// is 0.5 MB).
fn new_revision(c: &mut Checked, author: &str, message: &str) -> NewRevision {
    NewRevision {
        ruleset: c.ruleset.name.clone(),
        priority: c.ruleset.priority,
        content: std::mem::take(&mut c.content),
        rule_count: u32::try_from(c.rule_count()).unwrap_or(u32::MAX),
        author: author.to_string(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests;
