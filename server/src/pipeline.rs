//! The commit pipeline: validate -> persist -> publish (compile, swap, quiesce, carry in the
//! engine) -> record phases, and the commit-confirmed timers.
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
//! The engine's commit re-validates and compiles; when it fails after validation passed here
//! (not expected), the store transaction is reverted by a compensating one and the commit is
//! FAILED.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use vallum_engine::Clock;
use vallum_engine::engine::{Change, Engine};
use vallum_engine::model::Ruleset;
use vallum_engine::sets::SetManager;
use vallum_engine::validate::has_errors;

use crate::content::{Checked, PreviousParse, SourceText};
use crate::error::{Error, FieldViolation, Reason, Result};
use crate::hooks::{CommitRecord, Hooks};
use crate::limits;
use crate::outcome::Outcome;
use crate::store::{
    AuditEntry, CommitTarget, LoadFailure, NewRevision, PersistCommit, Phases, RevisionRow,
    RevisionState, RulesetRow, Store, now_ns,
};

pub mod confirm_clock;
pub mod sets;

/// A commit event, as WatchCommits streams it: one per [`Outcome`] of every commit request
/// (refusals included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitEvent {
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
    events: broadcast::Sender<CommitEvent>,
    hooks: Hooks,
    active: Mutex<BTreeMap<String, (u64, i32)>>,
    /// Per ruleset, the texts its last Apply was parsed from and the model (see
    /// [`Pipeline::previous_parse`]).
    parses: Mutex<HashMap<String, PreviousParse>>,
    /// Active revisions that did not load at start, by ruleset (see [`Pipeline::load`]);
    /// the one owner of that fact in memory (the store keeps the durable mark).
    not_loaded: tokio::sync::watch::Sender<BTreeMap<String, LoadFailure>>,
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
    /// The texts `model` was parsed from (an Apply's), kept after the commit for the next
    /// Apply of the ruleset ([`Pipeline::previous_parse`]); empty otherwise.
    sources: Vec<SourceText>,
    /// The model was validated against this pipeline's sets just before (an Apply's
    /// [`crate::content::check`]): `run` does not validate it again (the engine's prepare
    /// still does, under its own lock, so a set removed in between is still caught).
    validated: bool,
    /// `model` was made from the active one by edits ([`Checked::edited`]): committed as
    /// `Change::PutEdited`, which keeps the live counters of the rules it did not touch.
    edited: bool,
}

impl Pipeline {
    /// A pipeline around `engine` and `store`.
    pub fn new(engine: Arc<Engine>, store: Store, clock: Arc<dyn Clock>, hooks: Hooks) -> Self {
        let (events, _) = broadcast::channel(1024);
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
            active: Mutex::new(BTreeMap::new()),
            parses: Mutex::new(HashMap::new()),
            not_loaded: tokio::sync::watch::Sender::new(BTreeMap::new()),
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

    /// Active rulesets: name -> (revision, priority).
    pub fn active(&self) -> BTreeMap<String, (u64, i32)> {
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Loads every active revision of the store into the engine (one atomic engine commit)
    /// and returns those that did not load: a revision whose text no longer parses or
    /// validates (e.g. it names a set that is gone), or that the store cannot read. Each of
    /// those is marked in the store (table `load_failures`) with an audit record (caller
    /// `vallumd`, method `Load`, outcome ACTIVE_REVISION_NOT_LOADED), reported to the
    /// observer (`vallum_rulesets_not_loaded`) and kept in [`Pipeline::not_loaded`]; the
    /// caller decides whether to serve without them (`--on-load-failure`). The marks of
    /// rulesets that loaded are cleared.
    ///
    /// Errors: [`Error::Store`] when the rulesets cannot be listed or a mark cannot be
    /// written; [`Error::Commit`] when the engine refuses the revisions that did load.
    pub async fn load(&self) -> Result<Vec<LoadFailure>> {
        let _w = self.write.lock().await;
        let mut models = Vec::new();
        let mut heads = BTreeMap::new();
        let mut failed = Vec::new();
        for rs in self.store.list_rulesets().await? {
            let Some(number) = rs.active_revision else {
                continue;
            };
            match self.load_one(&rs, number).await {
                Ok(m) => {
                    heads.insert(rs.name.clone(), (number, rs.priority));
                    models.push(m);
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
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        let committed =
            tokio::task::spawn_blocking(move || engine.commit(Change::ReplaceAll(models), &*sets))
                .await
                .map_err(|e| Error::Internal(format!("load task: {e}")))?
                .map_err(|e| Error::Commit(e.to_string()))?;
        drop(committed);
        for (name, (rev, _)) in &heads {
            self.hooks.observer.on_active(name, Some(*rev));
        }
        *self.active.lock().unwrap_or_else(|e| e.into_inner()) = heads.clone();
        for old in self.store.load_failures().await? {
            if heads.contains_key(&old.ruleset) {
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

    /// The model of revision `number` of `rs`, or why it does not load: (the revision's
    /// digest when it could be read, the error).
    async fn load_one(
        &self,
        rs: &RulesetRow,
        number: u64,
    ) -> std::result::Result<Ruleset, (String, String)> {
        let rev = match self.store.get_revision(&rs.name, number).await {
            Ok(Some(rev)) => rev,
            Ok(None) => return Err((String::new(), "the revision is missing".into())),
            Err(e) => return Err((String::new(), e.to_string())),
        };
        let model = rev
            .content
            .to_ruleset(&rs.name, rs.priority)
            .map_err(|e| (rev.digest.clone(), e.to_string()))?;
        let violations = self.engine.validate(&model, &*self.sets);
        if has_errors(&violations) {
            let errors: Vec<String> = violations
                .iter()
                .filter(|v| v.severity == vallum_engine::validate::Severity::Error)
                .take(3)
                .map(ToString::to_string)
                .collect();
            return Err((
                rev.digest.clone(),
                format!("no longer valid: {}", errors.join("; ")),
            ));
        }
        Ok(model)
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

    /// Stores a checked input as a STAGED revision.
    ///
    /// Errors: [`Error::BadRequest`] when `checked` has errors; [`Error::EtagMismatch`];
    /// [`Error::Store`].
    pub async fn stage(
        &self,
        checked: Checked,
        author: &str,
        message: &str,
        etag: Option<&str>,
    ) -> Result<(RulesetRow, RevisionRow)> {
        let checked = checked.into_valid()?;
        self.check_rules(&checked)?;
        let new = new_revision(&checked, author, message);
        let _w = self.write.lock().await;
        self.check_rulesets(&new.ruleset).await?;
        self.store.stage(new, etag).await
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
                validated: false,
                sources: Vec::new(),
                edited: false,
            },
            audit,
        )
        .await
    }

    /// Stage + commit in one store transaction.
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
        let checked = checked.into_valid()?;
        self.check_rules(&checked)?;
        let new = new_revision(&checked, author, message);
        let (state, deadline) = self.confirm_state(confirm_within);
        let _w = self.write.lock().await;
        let sources = checked.sources;
        let edited = checked.edited;
        let mut model = checked.ruleset;
        // A ruleset's priority is fixed when it is created: an active one's is in memory.
        match self.active_priority(&new.ruleset) {
            Some(priority) => model.priority = priority,
            None => match self.store.get_ruleset(&new.ruleset).await? {
                Some(rs) => model.priority = rs.priority,
                None => self.check_rulesets(&new.ruleset).await?,
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
                validated: true,
                sources,
                edited,
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
                validated: false,
                sources: Vec::new(),
                edited: false,
            },
            audit,
        )
        .await
    }

    /// Confirms the pending commit-confirmed of revision `number`.
    ///
    /// Errors: [`Error::NotFound`]; [`Error::Precondition`] when no commit of it is pending;
    /// [`Error::Store`].
    pub async fn confirm(&self, ruleset: &str, number: u64) -> Result<RevisionRow> {
        let _w = self.write.lock().await;
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
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        let name = ruleset.to_string();
        tokio::task::spawn_blocking(move || engine.commit(Change::Remove(name), &*sets))
            .await
            .map_err(|e| Error::Internal(format!("commit task: {e}")))?
            .map_err(|e| Error::Commit(e.to_string()))?;
        self.set_active(ruleset, None);
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
                            validated: false,
                            sources: Vec::new(),
                            edited: false,
                        },
                        &mut None,
                    )
                    .await?;
                }
                None => {
                    self.store.deactivate(&c.ruleset, c.revision, now).await?;
                    let engine = self.engine.clone();
                    let sets = self.sets.clone();
                    let name = c.ruleset.clone();
                    tokio::task::spawn_blocking(move || {
                        engine.commit(Change::Remove(name), &*sets)
                    })
                    .await
                    .map_err(|e| Error::Internal(format!("commit task: {e}")))?
                    .map_err(|e| Error::Commit(e.to_string()))?;
                    self.set_active(&c.ruleset, None);
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

    /// Records `ruleset`'s active (revision, priority), or that it has none, and tells the
    /// observer.
    /// The priority of `ruleset` when it has an active revision.
    fn active_priority(&self, ruleset: &str) -> Option<i32> {
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        active.get(ruleset).map(|h| h.1)
    }

    fn set_active(&self, ruleset: &str, head: Option<(u64, i32)>) {
        {
            let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
            match head {
                Some(h) => active.insert(ruleset.to_string(), h),
                None => active.remove(ruleset),
            };
        }
        if head.is_none() {
            self.parses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(ruleset);
        }
        self.hooks.observer.on_active(ruleset, head.map(|h| h.0));
    }

    /// The model the engine runs for `ruleset` and the number of its revision, read so that
    /// the two belong together: the revision the pipeline marked active before and after the
    /// engine was asked is the same (a commit publishes before it marks), so the model is
    /// that revision's or a later one's; a caller that pairs it with the store's active
    /// revision and commits with that revision's etag is refused (ETAG_MISMATCH) in the
    /// second case. `None` when the ruleset is not active.
    pub fn active_model(&self, ruleset: &str) -> Option<(u64, Arc<Ruleset>)> {
        let revision = |p: &Pipeline| {
            let active = p.active.lock().unwrap_or_else(|e| e.into_inner());
            active.get(ruleset).map(|h| h.0)
        };
        let before = revision(self)?;
        let model = self.engine.rulesets().remove(ruleset)?;
        (revision(self)? == before).then_some((before, model))
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
            Some(name) if self.active_priority(name).is_some() => true,
            Some(name) => matches!(self.store.get_ruleset(name).await, Ok(Some(_))),
            None => false,
        };
        if let Some(name) = ruleset {
            let _ = self.events.send(CommitEvent {
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

    fn emit(
        &self,
        ruleset: &str,
        revision: Option<u64>,
        outcome: Outcome,
        phases: Phases,
        error: Option<String>,
        rules: u64,
    ) {
        let _ = self.events.send(CommitEvent {
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
    /// Validates, persists (with `audit`, taken once it is durable) and publishes `job`.
    async fn run(&self, job: Job, audit: &mut Option<AuditEntry>) -> Result<CommitResult> {
        let wall = std::time::Instant::now();
        let started_at = now_ns();
        let t0 = self.clock.now_ns();
        // validate (an Apply's model was, a moment ago, by the same validator)
        let violations = if job.validated {
            Vec::new()
        } else {
            self.engine.validate(&job.model, &*self.sets)
        };
        if has_errors(&violations) {
            return Err(Error::BadRequest {
                reason: Reason::InvalidRuleset,
                violations: violations
                    .iter()
                    .filter(|v| v.severity == vallum_engine::validate::Severity::Error)
                    .map(|v| FieldViolation::new("revision", v.to_string()))
                    .collect(),
            });
        }
        let t1 = self.clock.now_ns();
        // The engine validates and compiles (prepare, nothing visible yet) while the revision
        // is written: both need only the model, and the store write waits on the disk.
        let priority = job.model.priority;
        let engine = self.engine.clone();
        let sets = self.sets.clone();
        let change = if job.edited {
            Change::PutEdited(job.model)
        } else {
            Change::Put(job.model)
        };
        let prepare = tokio::task::spawn_blocking(move || engine.prepare(change, &*sets));
        // persist: durable before publish
        let persisted = self
            .store
            .persist_commit(PersistCommit {
                ruleset: job.ruleset.clone(),
                target: job.target,
                state: job.state,
                outcome: job.outcome,
                previous_state: job.previous_state,
                confirm_deadline: job.confirm_deadline,
                expected_etag: job.etag,
                started_at,
                validate_ns: t1.saturating_sub(t0),
                audit: audit.clone(),
            })
            .await;
        let t2 = self.clock.now_ns();
        let prepared = prepare
            .await
            .map_err(|e| Error::Internal(format!("commit task: {e}")));
        let parsed = match &prepared {
            Ok(Ok(p)) if !job.sources.is_empty() => p.ruleset(&job.ruleset).map(Arc::downgrade),
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
                    self.emit(
                        &job.ruleset,
                        None,
                        Outcome::Failed,
                        Phases::default(),
                        Some(e.to_string()),
                        0,
                    );
                }
                return Err(e);
            }
        };
        // publish (swap, quiesce, carry counters): only now that the revision is durable.
        let engine = self.engine.clone();
        let committed = match prepared {
            // The model's priority is the stored one (callers read it before `run`); should
            // that ever differ, the engine must not run something else than the store says.
            Ok(Ok(_)) if persisted.ruleset.priority != priority => Err(Error::Internal(format!(
                "ruleset priority changed during the commit ({priority} -> {})",
                persisted.ruleset.priority
            ))),
            Ok(Ok(p)) => tokio::task::spawn_blocking(move || {
                engine.publish(p).map(|c| {
                    // Free the old snapshot off the async workers, and after the reply: no
                    // core reads it any more (publish waited for them).
                    let retired = c.retired;
                    tokio::task::spawn_blocking(move || drop(retired));
                    c.report
                })
            })
            .await
            .map_err(|e| Error::Internal(format!("commit task: {e}"))),
            Ok(Err(e)) => Ok(Err(e)),
            Err(e) => Err(e),
        };
        let report = match committed {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                let msg = e.to_string();
                let outcome = Error::Commit(msg.clone()).reason().info().name;
                self.store.revert_commit(&persisted, &msg, outcome).await?;
                self.emit(
                    &job.ruleset,
                    Some(persisted.revision.number),
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
                    &job.ruleset,
                    Some(persisted.revision.number),
                    Outcome::Failed,
                    Phases::default(),
                    Some(e.to_string()),
                    0,
                );
                return Err(e);
            }
        };
        let phases = Phases {
            validate_ns: t1.saturating_sub(t0) + report.validate_ns,
            compile_ns: report.compile_ns,
            persist_ns: t2.saturating_sub(t1),
            publish_ns: report.publish_ns,
            quiesce_ns: report.quiesce_ns,
            carry_ns: report.carry_ns,
            total_ns: u64::try_from(wall.elapsed().as_nanos()).unwrap_or(u64::MAX),
            cores_waited: u32::try_from(report.cores_waited).unwrap_or(u32::MAX),
        };
        self.set_active(
            &job.ruleset,
            Some((persisted.revision.number, persisted.ruleset.priority)),
        );
        self.forget_not_loaded(&job.ruleset).await;
        if let Some(model) = parsed {
            let previous = PreviousParse {
                texts: job.sources,
                model,
            };
            self.parses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(job.ruleset.clone(), previous);
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
        self.emit(
            &job.ruleset,
            Some(persisted.revision.number),
            job.outcome,
            phases,
            None,
            report.rules as u64,
        );
        Ok(CommitResult {
            revision: persisted.revision,
            phases,
            confirm_deadline: job.confirm_deadline,
            etag: persisted.ruleset.etag,
        })
    }
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

    fn checked(p: &Pipeline, rules: usize) -> Checked {
        let mut text = String::from("*filter\n:INPUT DROP [0:0]\n");
        for i in 0..rules {
            text.push_str(&format!("-A INPUT -p tcp --dport {} -j ACCEPT\n", i + 1));
        }
        text.push_str("COMMIT\n");
        let input = RulesetInput {
            parts: vec![TextPart {
                text,
                family: Family::Ipv4,
                filename: "t.rules".into(),
                field: "source.text.content".into(),
                line_fields: None,
            }],
        };
        crate::content::check("web", 0, &input, p.sets().as_ref()).expect("checks")
    }

    /// A pipeline on a one-core engine and a store in a temporary directory (kept alive by
    /// the returned guard).
    async fn pipeline(hooks: Hooks) -> (Pipeline, Arc<Engine>, Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("v.db")).await.expect("store");
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::default());
        let engine = Arc::new(Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: None,
            },
            clock.clone(),
        ));
        let p = Pipeline::new(engine.clone(), store.clone(), clock, hooks);
        (p, engine, store, dir)
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
        p.apply(checked(&p, 1), "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        let within = Duration::from_secs(60);
        let r = p
            .apply(checked(&p, 2), "me", "m", Some(within), None, &mut None)
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
        let c = checked(&p, 3);
        assert!(c.sources.is_empty());
        p.apply(c, "me", "m", None, None, &mut None)
            .await
            .expect("commits");
        assert!(p.previous_parse("web").is_none());

        let mut c = checked(&p, 4);
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
        let c = checked(&p, 3);
        let r = p.apply(c, "me", "m", None, None, &mut audit).await;
        assert_eq!(r.expect("commits").revision.number, 1);
        assert!(audit.is_none(), "written with the commit");
        assert_eq!(store.audit_count().await.expect("count"), 1);
        // Same text again: the chunks are shared, the revision is new.
        let mut audit = Some(entry());
        let c = checked(&p, 3);
        let r = p.apply(c, "me", "m", None, None, &mut audit).await;
        assert_eq!(r.expect("commits").revision.number, 2);
        assert_eq!(store.audit_count().await.expect("count"), 2);

        // Over --max-rules: refused before the store; the record is still the caller's.
        let mut audit = Some(entry());
        let c = checked(&p, 6);
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
