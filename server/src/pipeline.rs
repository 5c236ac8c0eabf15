//! The commit pipeline: validate -> persist (while the engine compiles) -> publish (swap,
//! quiesce, carry in the engine) -> record phases, and the commit-confirmed timers.
//!
//! One validation per commit: the engine's ([`Engine::validate_change`], against the active
//! rulesets, so an unchanged rule is not checked again), under the write lock that set
//! changes and other commits also take, so nothing changes between the verdict and the
//! publish. The pipeline only places the engine's violations in the caller's terms
//! ([`crate::content::Places`]: `FILE:LINE:COL` of an Apply's text, the field `revision` for a
//! stored revision) and refuses before anything is stored. Dry runs and Stage validate once
//! through [`Pipeline::validate`] ([`Engine::validate`]); [`crate::content`] parses only.
//!
//! One owner of "which revision is active" in memory: the engine ([`Engine::revisions`]: the
//! number is given to the prepared commit once the store assigned it, and changes at publish
//! with what the cores run). [`Pipeline::active`], health, the fleet agent and the metrics'
//! `vallum_active_revision` (through [`crate::hooks::Observer::on_active`], called after each
//! change) read it from there; the store keeps the durable fact that [`Pipeline::load`] puts
//! back into the engine at start.
//!
//! Crash safety. A commit's store transaction (the revision row, its new state, the ruleset's
//! `active_revision`, the commit row) is durable (WAL commit with `synchronous = FULL`) BEFORE
//! the engine publishes. At start, [`Pipeline::load`] runs exactly the revisions the store
//! marks active. So after a `kill -9` at any point, the active revision of a ruleset is the
//! last one whose transaction reached the disk: the last acknowledged commit, or a later one
//! that was durable but not yet acknowledged; never a mix (one transaction moves every row).
//! The phase columns of the commit row are filled after publish and may be zero after a crash.
//!
//! Commits (and every other store write) are serialised by one async lock, so the engine sees
//! commits in the order the store made them durable.
//!
//! When the compile or the publish fails after validation passed (not expected; a publish
//! refused as stale), the store transaction is reverted by a compensating one and the commit
//! is FAILED.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tracing::Instrument as _;
use vallum_engine::Clock;
use vallum_engine::engine::{ActiveRevision, Change, CommitError, Engine};
use vallum_engine::model::Ruleset;
use vallum_engine::sets::SetManager;
use vallum_engine::validate::{Severity, Violation};

use crate::content::{self, Checked, Finding, Places, PreviousParse, SourceText};
use crate::error::{Error, FieldViolation, Reason, Result};
use crate::facts_chains::FactsChains;
use crate::hooks::{CommitRecord, Hooks};
use crate::kernel_tables::KernelTables;
use crate::limits;
use crate::outcome::Outcome;
use crate::store::{
    AuditEntry, CommitTarget, LoadFailure, NewRevision, PersistCommit, Phases, RevisionRow,
    RevisionState, RulesetRow, Store, now_ns,
};

pub mod confirm_clock;
pub mod journal;
pub mod sets;

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

/// A monotonic clock for the engine (ns since the process started using it).
#[derive(Debug)]
pub struct MonotonicClock(std::time::Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(std::time::Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The pipeline: engine, store, ipset-style sets, event channel and hooks.
pub struct Pipeline {
    engine: Arc<Engine>,
    store: Store,
    /// The set registry every validation and commit resolves `--match-set` against; changed
    /// by the methods in [`sets`] (under the write lock, durable before published).
    sets: Arc<SetManager>,
    clock: Arc<dyn Clock>,
    write: tokio::sync::Mutex<()>,
    events: journal::Journal,
    hooks: Hooks,
    /// Per ruleset, the texts its last Apply was parsed from and the model (see
    /// [`Pipeline::previous_parse`]).
    parses: Mutex<HashMap<String, PreviousParse>>,
    /// Active revisions that did not load at start, by ruleset (see [`Pipeline::load`]);
    /// the one owner of that fact in memory (the store keeps the durable mark).
    not_loaded: tokio::sync::watch::Sender<BTreeMap<String, LoadFailure>>,
    /// `--kernel-tables`: the tables handed to the kernel with each commit, before the
    /// publish ([`crate::kernel_tables`]).
    kernel: Option<Arc<KernelTables>>,
    /// `--nfqueue-facts-mark`: the steering's facts chains, written with each commit whose
    /// kernel-decided expressions change, before the publish ([`crate::facts_chains`]).
    facts: Option<Arc<FactsChains>>,
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
                Ok(_) => Error::Internal("validation failed without an error".into()),
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
    /// A pipeline around `engine` and `store`.
    pub fn new(engine: Arc<Engine>, store: Store, clock: Arc<dyn Clock>, hooks: Hooks) -> Self {
        let events = journal::Journal::new(u64::try_from(now_ns()).unwrap_or(1), journal::KEPT);
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
            not_loaded: tokio::sync::watch::Sender::new(BTreeMap::new()),
            kernel: None,
            facts: None,
        }
    }

    /// This pipeline handing `kernel`'s tables to the kernel with each commit that changes
    /// them (after the store, before the publish; see [`crate::kernel_tables`]).
    pub fn with_kernel_tables(mut self, kernel: Arc<KernelTables>) -> Self {
        self.kernel = Some(kernel);
        self
    }

    /// This pipeline writing the steering's facts chains ([`crate::facts_chains`]) with each
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
    ) -> Result<Option<crate::kernel_tables::Next>> {
        match &self.kernel {
            Some(k) => k.next(ruleset, change, &self.engine.rulesets()),
            None => Ok(None),
        }
    }

    /// Writes `next` to the kernel (see [`Pipeline::kernel_next`]).
    async fn kernel_apply(
        &self,
        next: Option<crate::kernel_tables::Next>,
    ) -> Result<Option<crate::kernel_tables::Undo>> {
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
    async fn kernel_undo(&self, undo: Option<crate::kernel_tables::Undo>) {
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
    /// Errors: [`Error::Internal`] when the validation task fails.
    pub async fn validate(&self, checked: Checked) -> Result<Checked> {
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        tokio::task::spawn_blocking(move || {
            let violations = engine.validate(&checked.ruleset, &*sets);
            checked.with_violations(&violations)
        })
        .await
        .map_err(|e| Error::Internal(format!("validation task: {e}")))
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
                        at: now_ns(),
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
            .map_err(|e| Error::Internal(format!("load task: {e}")))?;
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
                return Err(Error::Internal("validation failed without an error".into()));
            }
            for (name, errors) in errors {
                let Some((_, number, digest)) = loading.remove(name) else {
                    return Err(Error::Internal(format!(
                        "validation named ruleset {name}, which is not loading"
                    )));
                };
                let shown: Vec<String> = errors.into_iter().take(3).collect();
                failed.push((
                    LoadFailure {
                        ruleset: name.to_string(),
                        revision: number,
                        error: format!("no longer valid: {}", shown.join("; ")),
                        at: now_ns(),
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
        let committed = tokio::task::spawn_blocking(move || engine.publish(prepared))
            .await
            .map_err(|e| Error::Internal(format!("load task: {e}")))?
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
                at: f.at,
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
        let new = new_revision(&checked, author, message);
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
        let _w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        let rev = self.revision(ruleset, number).await?;
        let model = rev.content.to_ruleset(ruleset, rs.priority)?;
        let (state, deadline) = self.confirm_state(confirm_within);
        self.run(
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
        self.check_rules(&checked)?;
        let new = new_revision(&checked, author, message);
        let (state, deadline) = self.confirm_state(confirm_within);
        let _w = self.write.lock().await;
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
        self.run(
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
            },
            audit,
        )
        .await
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
        let _w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        let rev = self.revision(ruleset, number).await?;
        let model = rev.content.to_ruleset(ruleset, rs.priority)?;
        let message = if message.is_empty() {
            format!("rollback to revision {number}")
        } else {
            message.to_string()
        };
        self.run(
            Job {
                ruleset: ruleset.to_string(),
                model,
                target: CommitTarget::New(NewRevision {
                    ruleset: ruleset.to_string(),
                    priority: rs.priority,
                    content: rev.content.clone(),
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
        let _w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        if let Some(e) = etag.filter(|e| !e.is_empty() && *e != rs.etag) {
            return Err(Error::EtagMismatch {
                name: format!("rulesets/{ruleset}"),
                given: e.to_string(),
                current: rs.etag,
            });
        }
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
        self.run(
            Job {
                ruleset: ruleset.to_string(),
                model,
                target: CommitTarget::New(NewRevision {
                    ruleset: ruleset.to_string(),
                    priority,
                    content: rev.content.clone(),
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
            },
            audit,
        )
        .await?;
        self.ruleset(ruleset).await
    }

    /// Confirms the pending commit-confirmed of revision `number`; with `etag`, only while it
    /// is the ruleset's.
    ///
    /// Errors: [`Error::NotFound`]; [`Error::EtagMismatch`]; [`Error::Precondition`] when no
    /// commit of it is pending; [`Error::Store`].
    pub async fn confirm(
        &self,
        ruleset: &str,
        number: u64,
        etag: Option<&str>,
    ) -> Result<RevisionRow> {
        let _w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        if let Some(e) = etag.filter(|e| !e.is_empty() && *e != rs.etag) {
            return Err(Error::EtagMismatch {
                name: format!("rulesets/{ruleset}"),
                given: e.to_string(),
                current: rs.etag,
            });
        }
        self.revision(ruleset, number).await?;
        let rev =
            self.store
                .confirm(ruleset, number)
                .await?
                .ok_or_else(|| Error::Precondition {
                    kind: "REVISION_STATE",
                    subject: format!("rulesets/{ruleset}/revisions/{number}"),
                    message: "no commit of this revision is waiting for confirmation".into(),
                })?;
        self.emit(
            ruleset,
            Some(number),
            Outcome::Confirmed,
            Phases::default(),
            None,
            0,
        );
        Ok(rev)
    }

    /// Deactivates a ruleset in the engine and deletes it from the store.
    ///
    /// Errors: [`Error::NotFound`], [`Error::EtagMismatch`], [`Error::Commit`],
    /// [`Error::Store`].
    pub async fn delete(&self, ruleset: &str, etag: Option<&str>) -> Result<()> {
        let _w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        if let Some(e) = etag.filter(|e| !e.is_empty() && *e != rs.etag) {
            return Err(Error::EtagMismatch {
                name: format!("rulesets/{ruleset}"),
                given: e.to_string(),
                current: rs.etag,
            });
        }
        // Its kernel tables leave the kernel first (see `kernel_tables`).
        let next = self.kernel_next(ruleset, None)?;
        let undo = self.kernel_apply(next).await?;
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        let name = ruleset.to_string();
        let removed =
            tokio::task::spawn_blocking(move || engine.commit(Change::Remove(name), &*sets))
                .await
                .map_err(|e| Error::Internal(format!("commit task: {e}")))
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

    /// Reverts every commit-confirmed whose deadline passed: the previous revision's content
    /// is committed as a new revision (outcome REVERTED, the unconfirmed revision REJECTED),
    /// or the ruleset is deactivated when it had no previous revision (outcome REVERTED).
    /// Returns how many were reverted.
    ///
    /// Errors: [`Error::Store`], [`Error::Commit`].
    pub async fn expire_confirms(&self) -> Result<usize> {
        let now = self.hooks.confirm_clock.unix_ns();
        let mut done = 0;
        let _w = self.write.lock().await;
        for c in self.store.pending_confirms().await? {
            if c.confirm_deadline.is_none_or(|d| d > now) {
                continue;
            }
            let rs = self.ruleset(&c.ruleset).await?;
            match c.previous {
                Some(prev) => {
                    let rev = self.revision(&c.ruleset, prev).await?;
                    let model = rev.content.to_ruleset(&c.ruleset, rs.priority)?;
                    self.run(
                        Job {
                            ruleset: c.ruleset.clone(),
                            model,
                            target: CommitTarget::New(NewRevision {
                                ruleset: c.ruleset.clone(),
                                priority: rs.priority,
                                content: rev.content.clone(),
                                rule_count: rev.rule_count,
                                author: "vallumd".into(),
                                message: format!(
                                    "automatic rollback: revision {} was not confirmed in time",
                                    c.revision
                                ),
                            }),
                            state: RevisionState::Active,
                            outcome: Outcome::Reverted,
                            previous_state: RevisionState::Rejected,
                            confirm_deadline: None,
                            etag: None,
                            from: Origin::Stored,
                            creates: false,
                            edited: false,
                            priority: None,
                        },
                        &mut None,
                    )
                    .await?;
                }
                None => {
                    self.store.deactivate(&c.ruleset, c.revision, now).await?;
                    let next = self.kernel_next(&c.ruleset, None)?;
                    self.kernel_apply(next).await?;
                    let engine = self.engine.clone();
                    let sets = self.sets.clone();
                    let name = c.ruleset.clone();
                    tokio::task::spawn_blocking(move || {
                        engine.commit(Change::Remove(name), &*sets)
                    })
                    .await
                    .map_err(|e| Error::Internal(format!("commit task: {e}")))?
                    .map_err(|e| Error::Commit(e.to_string()))?;
                    self.activated(&c.ruleset, None);
                    self.forget_not_loaded(&c.ruleset).await;
                    self.emit(
                        &c.ruleset,
                        Some(c.revision),
                        Outcome::Reverted,
                        Phases::default(),
                        None,
                        0,
                    );
                }
            }
            done += 1;
        }
        Ok(done)
    }

    /// The state and deadline (Unix ns on [`Hooks::confirm_clock`]) of a commit made with
    /// `confirm_within` (none or zero: ACTIVE, no deadline).
    fn confirm_state(&self, within: Option<Duration>) -> (RevisionState, Option<i64>) {
        match within.filter(|d| !d.is_zero()) {
            Some(d) => {
                let now = self.hooks.confirm_clock.unix_ns();
                let within = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
                (
                    RevisionState::PendingConfirm,
                    Some(now.saturating_add(within)),
                )
            }
            None => (RevisionState::Active, None),
        }
    }

    /// Runs [`Pipeline::expire_confirms`] every `interval` until the returned task is aborted.
    pub fn spawn_confirm_timer(
        self: &Arc<Self>,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
            loop {
                tick.tick().await;
                if let Err(e) = me.expire_confirms().await {
                    tracing::warn!(error = %e, "commit-confirmed check failed");
                }
            }
        })
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
    /// forgets a deactivated ruleset's previous parse and tells the observer.
    fn activated(&self, ruleset: &str, revision: Option<u64>) {
        if revision.is_none() {
            self.parses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(ruleset);
        }
        self.hooks.observer.on_active(ruleset, revision);
    }

    /// The model the engine runs for `ruleset` and the number of its revision, read together
    /// from the one owner ([`Engine::revision_model`]): that revision's model. `None` when the
    /// ruleset is not active.
    pub fn active_model(&self, ruleset: &str) -> Option<(u64, Arc<Ruleset>)> {
        self.engine.revision_model(ruleset)
    }

    /// The texts the last Apply of `ruleset` was parsed from and the model it gave, for
    /// [`crate::content::check_after`] (`None` before the first Apply, after a delete).
    /// Its model may no longer be active: the pair is still a text and its parse.
    pub fn previous_parse(&self, ruleset: &str) -> Option<PreviousParse> {
        self.parses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(ruleset)
            .cloned()
    }

    /// `--max-rules`: refuses a ruleset with too many rules.
    fn check_rules(&self, checked: &Checked) -> Result<()> {
        limits::check_rules(
            checked.ruleset.rule_count(),
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
                error: Some(error.to_string()),
                time_ns: now_ns(),
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
            Some(e.to_string()),
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
            time_ns: now_ns(),
        });
        self.hooks.observer.on_commit(&CommitRecord {
            ruleset: ruleset.to_string(),
            revision,
            outcome,
            phases,
            rules,
        });
    }

    /// The pipeline proper; the caller holds the write lock.
    /// Validates (the commit's one validation), persists (with `audit`, taken once it is
    /// durable) while the engine compiles, and publishes `job`; in a `commit` span with one
    /// child per phase (crate::metrics::traces).
    async fn run(&self, job: Job, audit: &mut Option<AuditEntry>) -> Result<CommitResult> {
        let span = tracing::info_span!(
            "commit",
            vallum.ruleset = %job.ruleset,
            vallum.revision = tracing::field::Empty,
            vallum.outcome = tracing::field::Empty,
        );
        self.run_phases(job, audit, &span)
            .instrument(span.clone())
            .await
    }

    /// [`Pipeline::run`] inside its `commit` span.
    async fn run_phases(
        &self,
        job: Job,
        audit: &mut Option<AuditEntry>,
        span: &tracing::Span,
    ) -> Result<CommitResult> {
        let wall = std::time::Instant::now();
        let started_at = now_ns();
        let t0 = self.clock.now_ns();
        let Job {
            ruleset,
            model,
            target,
            state,
            outcome,
            previous_state,
            confirm_deadline,
            etag,
            mut from,
            creates,
            edited,
            priority: new_priority,
        } = job;
        let priority = model.priority;
        // The kernel tables it has after the commit (`--kernel-tables`; cheap clones).
        let kernel_tables = self.kernel.as_ref().map(|k| k.tables_of(&model));
        // `--max-rulesets` for a new ruleset, refused after validation (a refusal of the text
        // comes first).
        let within_limits = if creates {
            let existing = self.store.list_rulesets().await?.len();
            limits::check_rulesets(existing, self.hooks.limits.max_rulesets)
        } else {
            Ok(())
        };
        // validate, then compile, on one blocking thread: the verdict comes back as soon as
        // it is known, so that a refusal stores nothing and the revision is written while
        // the snapshot compiles (both need only the model; the store write waits on the
        // disk). Under the write lock, no set or other commit changes in between.
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        // Made from the active model by edits: untouched rules keep counting where they
        // are (`Change::PutEdited`).
        let change = if edited {
            Change::PutEdited(model)
        } else {
            Change::Put(model)
        };
        let (verdict, validated) = tokio::sync::oneshot::channel();
        let commit_span = span.clone();
        let compiling = tokio::task::spawn_blocking(move || {
            let validating = tracing::info_span!(parent: &commit_span, "validate").entered();
            let v = match engine.validate_change(change, &*sets) {
                Ok(v) => v,
                Err(e) => {
                    let _ = verdict.send(Err(e));
                    return None;
                }
            };
            let _ = verdict.send(Ok(v.warnings().to_vec()));
            drop(validating);
            let _compiling = tracing::info_span!(parent: &commit_span, "compile").entered();
            Some(engine.compile(v, &*sets))
        });
        let warnings = match validated.await {
            Ok(Ok(w)) => from.warnings(&w),
            Ok(Err(CommitError::Invalid(v))) => return Err(from.refusal(&v)),
            Ok(Err(e)) => {
                let msg = e.to_string();
                self.emit(
                    &ruleset,
                    None,
                    Outcome::Failed,
                    Phases::default(),
                    Some(msg.clone()),
                    0,
                );
                return Err(Error::Commit(msg));
            }
            // The task ended without a verdict: it panicked.
            Err(_) => {
                let e = match compiling.await {
                    Err(e) => format!("commit task: {e}"),
                    Ok(_) => "commit task: no verdict".to_string(),
                };
                return Err(Error::Internal(e));
            }
        };
        if let Err(e) = within_limits {
            // The compile's result is dropped on its own thread when it ends.
            drop(compiling);
            return Err(e.into());
        }
        // What the kernel tables become; a clash between rulesets there is refused before
        // anything is stored.
        let kernel_next = match kernel_tables
            .map(|t| self.kernel_next(&ruleset, Some((priority, t))))
            .transpose()
        {
            Ok(next) => next.flatten(),
            Err(e) => {
                drop(compiling);
                self.emit_failed(&ruleset, &e);
                return Err(e);
            }
        };
        let t1 = self.clock.now_ns();
        // persist: durable before publish
        let persisted = self
            .store
            .persist_commit(PersistCommit {
                ruleset: ruleset.clone(),
                target,
                state,
                outcome,
                previous_state,
                confirm_deadline,
                expected_etag: etag,
                started_at,
                validate_ns: t1.saturating_sub(t0),
                priority: new_priority,
                audit: audit.clone(),
            })
            .instrument(tracing::info_span!("persist"))
            .await;
        let t2 = self.clock.now_ns();
        let prepared = match compiling.await {
            Ok(Some(p)) => Ok(p),
            Ok(None) => Err(Error::Internal("commit task: no compile".into())),
            Err(e) => Err(Error::Internal(format!("commit task: {e}"))),
        };
        let keep_texts = matches!(&from, Origin::Request { texts, .. } if !texts.is_empty());
        let parsed = match &prepared {
            Ok(Ok(p)) if keep_texts => p.ruleset(&ruleset).map(Arc::downgrade),
            _ => None,
        };
        let persisted = match persisted {
            Ok(p) => {
                // The audit record is durable with the commit; a refusal below corrects it.
                audit.take();
                p
            }
            Err(e) => {
                // Nothing was published; the prepared snapshot is dropped off the async
                // workers.
                if let Ok(Ok(p)) = prepared {
                    tokio::task::spawn_blocking(move || drop(p));
                }
                if is_server_failure(&e) {
                    self.emit_failed(&ruleset, &e);
                }
                return Err(e);
            }
        };
        #[cfg(test)]
        tests::before_publish();
        // The kernel tables first (durable in the store, not yet ours): when the kernel
        // refuses them, the store is reverted and nothing is published.
        let kernel_undo = match self.kernel_apply(kernel_next).await {
            Ok(undo) => undo,
            Err(e) => {
                if let Ok(Ok(p)) = prepared {
                    tokio::task::spawn_blocking(move || drop(p));
                }
                let outcome = e.reason().info().name;
                self.store
                    .revert_commit(&persisted, &e.to_string(), outcome)
                    .await?;
                self.emit(
                    &ruleset,
                    Some(persisted.revision.number),
                    Outcome::Failed,
                    Phases::default(),
                    Some(e.to_string()),
                    0,
                );
                return Err(e);
            }
        };
        // publish (swap, quiesce, carry counters): only now that the revision is durable,
        // numbered with the store's revision so that the engine's answer to "which revision
        // is active" changes with what the cores run.
        let number = persisted.revision.number;
        // As i64: OTel attributes have no unsigned integers.
        span.record("vallum.revision", i64::try_from(number).unwrap_or(i64::MAX));
        let engine = self.engine.clone();
        let commit_span = span.clone();
        let committed = match prepared {
            // The model's priority is the stored one (callers read it before `run`); should
            // that ever differ, the engine must not run something else than the store says.
            Ok(Ok(_)) if persisted.ruleset.priority != priority => Err(Error::Internal(format!(
                "ruleset priority changed during the commit ({priority} -> {})",
                persisted.ruleset.priority
            ))),
            Ok(Ok(mut p)) => {
                p.set_revision(&ruleset, number);
                // The steering's facts chains of the snapshot before it runs: a kernel that
                // refuses them fails the commit.
                if let Some(Err(e)) = match &self.facts {
                    Some(f) => Some(f.apply(p.kernel_facts()).await),
                    None => None,
                } {
                    tokio::task::spawn_blocking(move || drop(p));
                    self.kernel_undo(kernel_undo).await;
                    self.facts_restore().await;
                    let outcome = e.reason().info().name;
                    self.store
                        .revert_commit(&persisted, &e.to_string(), outcome)
                        .await?;
                    self.emit(
                        &ruleset,
                        Some(number),
                        Outcome::Failed,
                        Phases::default(),
                        Some(e.to_string()),
                        0,
                    );
                    return Err(e);
                }
                tokio::task::spawn_blocking(move || {
                    let publishing = tracing::info_span!(parent: &commit_span, "publish");
                    let published = publishing.in_scope(|| engine.publish(p));
                    published.map(|c| {
                        quiesce_span(&publishing, &c.report);
                        // Free the old snapshot off the async workers, and after the reply:
                        // no core reads it any more (publish waited for them).
                        let retired = c.retired;
                        tokio::task::spawn_blocking(move || drop(retired));
                        c.report
                    })
                })
                .await
                .map_err(|e| Error::Internal(format!("commit task: {e}")))
            }
            Ok(Err(e)) => Ok(Err(e)),
            Err(e) => Err(e),
        };
        if !matches!(committed, Ok(Ok(_))) {
            self.kernel_undo(kernel_undo).await;
            self.facts_restore().await;
        }
        let report = match committed {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                let msg = e.to_string();
                let outcome = Error::Commit(msg.clone()).reason().info().name;
                self.store.revert_commit(&persisted, &msg, outcome).await?;
                self.emit(
                    &ruleset,
                    Some(number),
                    Outcome::Failed,
                    Phases::default(),
                    Some(msg.clone()),
                    0,
                );
                return Err(Error::Commit(msg));
            }
            Err(e) => {
                let outcome = e.reason().info().name;
                self.store
                    .revert_commit(&persisted, &e.to_string(), outcome)
                    .await?;
                self.emit(
                    &ruleset,
                    Some(number),
                    Outcome::Failed,
                    Phases::default(),
                    Some(e.to_string()),
                    0,
                );
                return Err(e);
            }
        };
        let phases = Phases {
            validate_ns: t1.saturating_sub(t0),
            compile_ns: report.compile_ns,
            persist_ns: t2.saturating_sub(t1),
            publish_ns: report.publish_ns,
            quiesce_ns: report.quiesce_ns,
            carry_ns: report.carry_ns,
            total_ns: u64::try_from(wall.elapsed().as_nanos()).unwrap_or(u64::MAX),
            cores_waited: u32::try_from(report.cores_waited).unwrap_or(u32::MAX),
        };
        self.activated(&ruleset, Some(number));
        self.forget_not_loaded(&ruleset).await;
        if let (Some(model), Origin::Request { texts, .. }) = (parsed, from) {
            let previous = PreviousParse { texts, model };
            self.parses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ruleset.clone(), previous);
        }
        // Phase columns are informative: written after the reply (a transaction and an fsync
        // the caller need not wait for); a failure to write them does not undo the commit.
        let store = self.store.clone();
        let commit_id = persisted.commit_id;
        tokio::spawn(async move {
            if let Err(e) = store.finish_commit(commit_id, &phases).await {
                tracing::warn!(commit = commit_id, error = %e, "recording commit phases failed");
            }
        });
        span.record("vallum.outcome", outcome.label());
        self.emit(
            &ruleset,
            Some(number),
            outcome,
            phases,
            None,
            report.rules as u64,
        );
        Ok(CommitResult {
            revision: persisted.revision,
            phases,
            confirm_deadline,
            etag: persisted.ruleset.etag,
            warnings,
        })
    }
}

/// The `quiesce` child of `publish`, placed from the engine's report just after its publish
/// call returned: the wait ended where the counter carry began (`carry_ns` ago) and lasted
/// `quiesce_ns`.
fn quiesce_span(publish: &tracing::Span, report: &vallum_engine::engine::CommitReport) {
    let now = std::time::SystemTime::now();
    let end = now - Duration::from_nanos(report.carry_ns);
    let start = end - Duration::from_nanos(report.quiesce_ns);
    crate::metrics::traces::record_interval(publish, "quiesce", start, end);
}

/// Whether a persist error is the server's failure (store, internal) rather than an answer
/// to the request (etag mismatch, not found), which is no commit attempt.
fn is_server_failure(e: &Error) -> bool {
    matches!(e, Error::Store(_) | Error::Migrate(_) | Error::Internal(_))
}

fn new_revision(c: &Checked, author: &str, message: &str) -> NewRevision {
    NewRevision {
        ruleset: c.ruleset.name.clone(),
        priority: c.ruleset.priority,
        content: c.content.clone(),
        rule_count: u32::try_from(c.ruleset.rule_count()).unwrap_or(u32::MAX),
        author: author.to_string(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::{RulesetInput, TextPart};
    use vallum_engine::dataplane::BarrierStrategy;
    use vallum_engine::engine::EngineConfig;
    use vallum_engine::model::Family;

    fn entry() -> AuditEntry {
        AuditEntry {
            at: 1,
            caller: "me".into(),
            method: "Apply".into(),
            request_digest: "d".into(),
            outcome: "OK".into(),
        }
    }

    thread_local! {
        /// Run (once) by a commit on this thread just before it publishes.
        static BEFORE_PUBLISH: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
            std::cell::RefCell::new(None);
    }

    /// Called by [`Pipeline::run`] once the revision is durable, just before it publishes
    /// (on the test's thread: `#[tokio::test]` runs on one).
    pub(super) fn before_publish() {
        if let Some(hook) = BEFORE_PUBLISH.with(|h| h.borrow_mut().take()) {
            hook();
        }
    }

    fn input(text: String) -> RulesetInput {
        RulesetInput {
            parts: vec![TextPart {
                text,
                family: Family::Ipv4,
                filename: "t.rules".into(),
                field: "source.text.content".into(),
                line_fields: None,
            }],
        }
    }

    fn text(rules: usize) -> String {
        let mut text = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..rules {
            text.push_str(&format!("-A INPUT -p tcp --dport {} -j ACCEPT\n", i + 1));
        }
        text.push_str("COMMIT\n");
        text
    }

    fn checked(rules: usize) -> Checked {
        crate::content::check("web", 0, &input(text(rules))).expect("checks")
    }

    fn engine(clock: Arc<dyn Clock>) -> Arc<Engine> {
        Arc::new(Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: None,
            },
            clock,
        ))
    }

    /// A pipeline on a one-core engine and a store in a temporary directory (kept alive by
    /// the returned guard).
    async fn pipeline(hooks: Hooks) -> (Pipeline, Arc<Engine>, Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (p, engine, store) = reopen(&dir, hooks).await;
        (p, engine, store, dir)
    }

    /// A new engine and pipeline on the store in `dir` (a restart), not loaded yet.
    async fn reopen(dir: &tempfile::TempDir, hooks: Hooks) -> (Pipeline, Arc<Engine>, Store) {
        let store = Store::open(&dir.path().join("v.db")).await.expect("store");
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::default());
        let engine = engine(clock.clone());
        let p = Pipeline::new(engine.clone(), store.clone(), clock, hooks);
        (p, engine, store)
    }

    /// The field violations of a bad request.
    fn bad_request(e: Error) -> (Reason, Vec<FieldViolation>) {
        match e {
            Error::BadRequest { reason, violations } => (reason, violations),
            other => panic!("expected a bad request, got {other:?}"),
        }
    }

    /// Each commit runs the validator once (the engine's, counted by
    /// `Engine::validations`): Apply, a commit of a staged revision, a rollback, a revert and
    /// the load at start; Stage and a dry run once too. A refused Apply is validated once
    /// and refused with what the check of the text and the engine's validation gave before
    /// they were one (content::check validated, then the engine's prepare validated again):
    /// the same reason and `FILE:LINE:COL` descriptions, compared with that older path run
    /// by hand here.
    #[tokio::test]
    async fn a_commit_validates_once() {
        use confirm_clock::ManualWallClock;
        let clock = ManualWallClock::starting_now();
        let hooks = Hooks {
            confirm_clock: Arc::new(clock.clone()),
            ..Hooks::default()
        };
        let (p, engine, _store, dir) = pipeline(hooks.clone()).await;
        let counted = |before: u64| engine.validations() - before;

        let n = engine.validations();
        p.apply(checked(1), "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        assert_eq!(counted(n), 1, "apply");
        let n = engine.validations();
        let (_, staged, _) = p.stage(checked(2), "me", "m", None).await.expect("stages");
        assert_eq!(counted(n), 1, "stage");
        let n = engine.validations();
        p.commit_staged("web", staged.number, None, None, &mut None)
            .await
            .expect("commits");
        assert_eq!(counted(n), 1, "commit of a staged revision");
        let n = engine.validations();
        p.rollback("web", 1, "me", "", None, &mut None)
            .await
            .expect("rolls back");
        assert_eq!(counted(n), 1, "rollback");
        let within = Duration::from_secs(60);
        p.apply(checked(3), "me", "m", Some(within), None, &mut None)
            .await
            .expect("commits");
        clock.advance(within);
        let n = engine.validations();
        assert_eq!(p.expire_confirms().await.expect("reverts"), 1);
        assert_eq!(counted(n), 1, "revert");
        let n = engine.validations();
        let dry = p.validate(checked(4)).await.expect("validates");
        assert!(dry.validated() && dry.valid());
        assert_eq!(counted(n), 1, "dry run");

        // Refused: a loop of jumps (validation), an extension not enforced.
        for (bad, reason) in [
            (
                "*filter\n:INPUT ACCEPT [0:0]\n:x - [0:0]\n:y - [0:0]\n-A INPUT -j x\n-A x -j y\n-A y -j x\nCOMMIT\n",
                Reason::InvalidRuleset,
            ),
            (
                "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m hashlimit --hashlimit-upto 10mb/s --hashlimit-name b -j ACCEPT\nCOMMIT\n",
                Reason::UnsupportedExtension,
            ),
        ] {
            let c = crate::content::check("web", 0, &input(bad.into())).expect("parses");
            // The older path: the check's validation of the text, placed in the request.
            let v = vallum_engine::validate::validate(&c.ruleset, Some(&*p.sets));
            let before = bad_request(c.clone().with_violations(&v).into_valid().unwrap_err());
            let n = engine.validations();
            let e = p.apply(c, "me", "m", None, None, &mut None).await;
            assert_eq!(counted(n), 1, "refused apply");
            let now = bad_request(e.expect_err("refused"));
            assert_eq!(now, before, "{bad}");
            assert_eq!(now.0, reason);
            assert!(
                now.1
                    .iter()
                    .all(|v| v.field == "source.text.content"
                        && v.description.starts_with("t.rules:")),
                "{now:?}"
            );
        }

        // The load at start validates each active revision once.
        drop(p);
        let (p, engine, _store) = reopen(&dir, hooks).await;
        assert!(p.load().await.expect("loads").is_empty());
        assert_eq!(engine.validations(), 1, "load");
    }

    /// A text checked while its set existed, whose set is destroyed before the commit, is
    /// refused by the commit's validation at its `FILE:LINE:COL`, before anything is stored
    /// (no revision, no FAILED commit). Before, the check's validation passed, the revision
    /// was stored, the engine's second validation refused it and the store was reverted: a
    /// REJECTED revision 1 and a FAILED outcome.
    #[tokio::test]
    async fn a_set_destroyed_after_the_check_is_refused_before_the_store() {
        use vallum_engine::sets::{SetSpec, SetType};
        let (p, _engine, store, _dir) = pipeline(Hooks::default()).await;
        p.create_set(
            "blocked",
            SetSpec::new(SetType::HashIp, Family::Ipv4),
            false,
        )
        .await
        .expect("creates");
        let t = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m set --match-set blocked src -j DROP\nCOMMIT\n";
        let c = crate::content::check("web", 0, &input(t.into())).expect("parses");
        assert!(p.validate(c.clone()).await.expect("validates").valid());
        p.destroy_set("blocked", None).await.expect("destroys");
        let mut events = p.subscribe();
        let e = p.apply(c, "me", "m", None, None, &mut None).await;
        let (reason, v) = bad_request(e.expect_err("refused"));
        assert_eq!(reason, Reason::InvalidRuleset);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].field, "source.text.content");
        assert!(v[0].description.starts_with("t.rules:3:"), "{v:?}");
        assert!(v[0].description.contains("blocked"), "{v:?}");
        assert!(store.get_ruleset("web").await.expect("reads").is_none());
        assert!(events.try_recv().is_err(), "no FAILED commit");
    }

    /// Records the last `on_active` per ruleset (what `vallum_active_revision` shows).
    #[derive(Default)]
    struct ActiveSeen(Mutex<BTreeMap<String, Option<u64>>>);

    impl crate::hooks::Observer for ActiveSeen {
        fn on_active(&self, ruleset: &str, revision: Option<u64>) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ruleset.to_string(), revision);
        }
    }

    /// The active revision of `web` as every reader sees it, asserting they agree: the
    /// store's row, the pipeline (health, GetStatus, the fleet agent), the engine's number,
    /// the observer (the metric) and the rules the engine runs (`rules` of that revision).
    async fn readers_agree(p: &Pipeline, seen: &ActiveSeen) -> Option<u64> {
        let stored = p
            .store()
            .get_ruleset("web")
            .await
            .expect("reads")
            .and_then(|r| r.active_revision);
        let pipeline = p.active().get("web").map(|a| a.revision);
        let engine = p.engine().revision("web").map(|a| a.revision);
        let metric = seen
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get("web")
            .copied()
            .flatten();
        assert_eq!(
            [pipeline, engine, metric],
            [stored; 3],
            "pipeline, engine, metric vs the store"
        );
        if let Some(n) = stored {
            let rev = p.store().get_revision("web", n).await.expect("reads");
            let rules = rev.expect("stored").rule_count as usize;
            assert_eq!(p.engine().rulesets()["web"].rule_count(), rules);
        } else {
            assert!(!p.engine().rulesets().contains_key("web"));
        }
        stored
    }

    /// One owner of the active revision: after a commit, a publish that fails (another
    /// commit reached the engine between prepare and publish: stale), a revert of an
    /// unconfirmed commit, a restart and a delete, every reader names the same revision.
    #[tokio::test]
    async fn readers_agree_on_the_active_revision() {
        use confirm_clock::ManualWallClock;
        let clock = ManualWallClock::starting_now();
        let seen = Arc::new(ActiveSeen::default());
        let hooks = Hooks {
            confirm_clock: Arc::new(clock.clone()),
            ..Hooks::default()
        }
        .with_observer(seen.clone());
        let (p, engine, _store, dir) = pipeline(hooks.clone()).await;
        assert_eq!(readers_agree(&p, &seen).await, None);
        p.apply(checked(1), "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        assert_eq!(readers_agree(&p, &seen).await, Some(1));

        // A failed publish: the store is reverted, the engine runs revision 1 still.
        BEFORE_PUBLISH.with(|h| {
            let engine = engine.clone();
            *h.borrow_mut() = Some(Box::new(move || {
                let other = crate::content::check("other", 0, &input(text(1)))
                    .expect("checks")
                    .ruleset;
                engine
                    .commit(Change::Put(other), &vallum_engine::sets::NoSets)
                    .expect("commits");
            }))
        });
        let e = p.apply(checked(2), "me", "m", None, None, &mut None).await;
        assert!(matches!(e, Err(Error::Commit(_))), "{e:?}");
        assert_eq!(readers_agree(&p, &seen).await, Some(1));
        assert_eq!(
            p.store()
                .get_revision("web", 2)
                .await
                .expect("reads")
                .map(|r| r.state),
            Some(RevisionState::Rejected)
        );
        engine
            .commit(Change::Remove("other".into()), &vallum_engine::sets::NoSets)
            .expect("removes");

        // A commit-confirmed, then its revert.
        let within = Duration::from_secs(60);
        let r = p
            .apply(checked(3), "me", "m", Some(within), None, &mut None)
            .await
            .expect("commits");
        assert_eq!(readers_agree(&p, &seen).await, Some(r.revision.number));
        clock.advance(within);
        assert_eq!(p.expire_confirms().await.expect("reverts"), 1);
        let reverted = readers_agree(&p, &seen).await.expect("active");
        assert!(reverted > r.revision.number);
        assert_eq!(p.engine().rulesets()["web"].rule_count(), 1);

        // A restart.
        drop(p);
        let seen = Arc::new(ActiveSeen::default());
        let (p, _engine, _store) = reopen(&dir, hooks.clone().with_observer(seen.clone())).await;
        assert!(p.load().await.expect("loads").is_empty());
        assert_eq!(readers_agree(&p, &seen).await, Some(reverted));

        // A delete.
        p.delete("web", None).await.expect("deletes");
        assert_eq!(readers_agree(&p, &seen).await, None);
    }

    /// A commit-confirmed is rolled back when its deadline passes on the injected clock and
    /// not before, and a new pipeline on the same store (a restart) keeps the deadline: the
    /// clock is advanced, nothing waits.
    #[tokio::test]
    async fn confirm_deadline_passes_on_the_injected_clock() {
        use confirm_clock::{ManualWallClock, WallClock};
        let clock = ManualWallClock::starting_now();
        let hooks = Hooks {
            confirm_clock: Arc::new(clock.clone()),
            ..Hooks::default()
        };
        let (p, _engine, store, dir) = pipeline(hooks.clone()).await;
        p.apply(checked(1), "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        let within = Duration::from_secs(60);
        let r = p
            .apply(checked(2), "me", "m", Some(within), None, &mut None)
            .await
            .expect("commits");
        assert_eq!(r.revision.state, RevisionState::PendingConfirm);
        assert_eq!(r.confirm_deadline, Some(clock.unix_ns() + 60_000_000_000));
        clock.advance(within - Duration::from_secs(1));
        assert_eq!(p.expire_confirms().await.expect("checks"), 0);

        // Restart: a new engine and pipeline on the same database.
        drop(p);
        store.close().await;
        let store = Store::open(&dir.path().join("v.db")).await.expect("store");
        let engine_clock: Arc<dyn Clock> = Arc::new(MonotonicClock::default());
        let engine = Arc::new(Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: None,
            },
            engine_clock.clone(),
        ));
        let p = Pipeline::new(engine.clone(), store.clone(), engine_clock, hooks);
        assert!(p.load().await.expect("loads").is_empty());
        assert_eq!(p.expire_confirms().await.expect("checks"), 0);
        let rev = |n| {
            let store = store.clone();
            async move {
                store
                    .get_revision("web", n)
                    .await
                    .expect("read")
                    .expect("revision")
            }
        };
        assert_eq!(rev(2).await.state, RevisionState::PendingConfirm);
        assert_eq!(engine.rulesets()["web"].rule_count(), 2);

        let mut events = p.subscribe();
        clock.advance(Duration::from_secs(1));
        assert_eq!(p.expire_confirms().await.expect("checks"), 1);
        let ev = events.try_recv().expect("an event");
        assert_eq!((ev.revision, ev.outcome), (Some(3), Outcome::Reverted));
        let rs = store
            .get_ruleset("web")
            .await
            .expect("read")
            .expect("ruleset");
        assert_eq!(rs.active_revision, Some(3));
        assert_eq!(rev(2).await.state, RevisionState::Rejected);
        assert_eq!(rev(3).await.digest, rev(1).await.digest);
        assert_eq!(engine.rulesets()["web"].rule_count(), 1);
        // Once is enough.
        assert_eq!(p.expire_confirms().await.expect("checks"), 0);
    }

    /// After an Apply that carries its texts, the pipeline keeps them with the model the
    /// engine now runs (the same `Arc`); a delete forgets them; an Apply without texts keeps
    /// nothing.
    #[tokio::test]
    async fn apply_keeps_the_parse_for_the_next_check() {
        let (p, engine, _store, _dir) = pipeline(Hooks::default()).await;
        let c = checked(3);
        assert!(c.sources.is_empty());
        p.apply(c, "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        assert!(p.previous_parse("web").is_none());

        let mut c = checked(4);
        let text = Arc::new(String::from("the text"));
        let source = SourceText {
            family: Family::Ipv4,
            text,
            canonical: false,
        };
        c.sources = vec![source.clone()];
        p.apply(c, "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        let kept = p.previous_parse("web").expect("kept");
        assert_eq!(kept.texts, [source]);
        let model = kept.model.upgrade().expect("the engine runs it");
        assert!(Arc::ptr_eq(&model, &engine.rulesets()["web"]));
        assert_eq!(model.rule_count(), 4);
        drop(model);

        p.delete("web", None).await.expect("deletes");
        assert!(p.previous_parse("web").is_none());
        assert!(kept.model.upgrade().is_none(), "the engine dropped it");
    }

    /// The audit record of an Apply is written in the commit's own transaction (the slot is
    /// emptied); one refused before anything is stored is left to the caller to write.
    #[tokio::test]
    async fn apply_writes_its_audit_record_with_the_commit() {
        let mut hooks = Hooks::default();
        hooks.limits.max_rules_per_ruleset = 5;
        let (p, _engine, store, _dir) = pipeline(hooks).await;

        let mut audit = Some(entry());
        let c = checked(3);
        let r = p.apply(c, "me", "m", None, None, &mut audit).await;
        assert_eq!(r.expect("commits").revision.number, 1);
        assert!(audit.is_none(), "written with the commit");
        assert_eq!(store.audit_count().await.expect("count"), 1);
        // Same text again: the chunks are shared, the revision is new.
        let mut audit = Some(entry());
        let c = checked(3);
        let r = p.apply(c, "me", "m", None, None, &mut audit).await;
        assert_eq!(r.expect("commits").revision.number, 2);
        assert_eq!(store.audit_count().await.expect("count"), 2);

        // Over --max-rules: refused before the store; the record is still the caller's.
        let mut audit = Some(entry());
        let c = checked(6);
        assert!(p.apply(c, "me", "m", None, None, &mut audit).await.is_err());
        assert!(audit.is_some());
        assert_eq!(store.audit_count().await.expect("count"), 2);
        let rev = store
            .get_revision("web", 2)
            .await
            .expect("read")
            .expect("rev 2");
        assert!(
            rev.content.v4.contains("--dport 3 -j ACCEPT"),
            "{}",
            rev.content.v4
        );
    }
}
