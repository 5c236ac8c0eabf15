//! One commit, phase by phase. [`Pipeline::run`] is the one function a commit reads in (the
//! caller holds the write lock; [`Pipeline::run_answered`] releases it, then waits for the
//! disk as the caller's durability asks); each phase is a named call, in the order they run:
//!
//! 1. limits read: the number of rulesets, for `--max-rulesets` when the ruleset is new
//!    ([`Pipeline::existing_rulesets`]; refused only after validation, a refusal of the text
//!    comes first);
//! 2. validate, then compile: the engine's one validation (against the active rulesets) and
//!    the compile of the snapshot, on one blocking thread ([`Compile::start`]); the verdict
//!    comes back as soon as it is known ([`Pipeline::verdict`]), so a refusal stores nothing;
//! 3. limits: `--max-rulesets` ([`limits::check_rulesets`]);
//! 4. kernel plan: what the kernel tables become (`--kernel-tables`); a clash between rulesets
//!    there is refused before anything is stored ([`Pipeline::kernel_plan`]);
//! 5. persist, while the engine compiles: the revision, its state, the commit row and the
//!    audit record in one transaction, committed to the WAL, its fsync started
//!    ([`Pipeline::persist`]), then the compile joined ([`Compile::join`]);
//! 6. kernel tables: written to the kernel; when it refuses them the store is reverted and
//!    nothing is published ([`Pipeline::kernel_apply`]);
//! 7. publish: the engine swaps the snapshot on a blocking thread ([`Pipeline::publish`]);
//!    every batch that begins after it, so every packet a source hands to a worker after the
//!    reply, runs the new rules. The wait for cores that were mid-batch (quiesce), the carry
//!    of counters that needs it and the drop of the replaced snapshot run after, on another
//!    blocking thread ([`Pipeline::retire_later`], `Engine::settle`): a worker preempted
//!    mid-batch on a busy host no longer holds up the reply. Counter reads and the next
//!    publish wait for a carry still pending (the engine's module docs);
//! 8. record: the active revision, the parse kept for the next Apply, the phase columns
//!    (after the reply), the commit event and the metrics ([`Pipeline::record`]).
//!
//! A failure after persist reverts the store with a compensating transaction
//! ([`Pipeline::fail_after_persist`]) and the kernel tables, and the commit is FAILED. The
//! `commit` span has one child per phase (`validate`, `compile`, `persist`, `publish` with its
//! `quiesce`; see crate::telemetry::metrics::traces).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{MutexGuard, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument as _;
use vallum_engine::engine::{Change, CommitError, CommitReport, Engine, Prepared};
use vallum_engine::model::{Ruleset, Table};
use vallum_engine::sets::SetManager;
use vallum_engine::validate::Violation;

use super::{CommitResult, Job, Origin, Pipeline};
use crate::control::content::{Finding, PreviousParse};
use crate::control::outcome::Outcome;
use crate::control::store::{AuditEntry, Durability, PersistCommit, Persisted, Phases};
use crate::error::{Error, Result};
use crate::grpc::limits;
use crate::host::kernel_tables::Next;

/// How a caller of [`Pipeline::apply_as`] is answered.
#[derive(Debug)]
pub struct Answer<'a> {
    /// How durable the commit is when the call returns; `None`: the store's (`--sync`).
    pub durability: Option<Durability>,
    /// The call's audit record, written with the commit and taken once it is (see
    /// [`Pipeline::apply`]).
    pub audit: &'a mut Option<AuditEntry>,
}

impl Pipeline {
    /// Commits `job`: validates (the commit's one validation), persists (with `audit`, taken
    /// once it is durable) while the engine compiles, and publishes, phase by phase (see the
    /// module docs), in a `commit` span. The caller holds the write lock.
    ///
    /// Errors: [`Error::BadRequest`] (validation), [`Error::Limit`] (`--max-rulesets`),
    /// [`Error::KernelTables`], [`Error::EtagMismatch`], [`Error::Commit`], [`Error::Store`].
    pub(super) async fn run(
        &self,
        job: Job,
        audit: &mut Option<AuditEntry>,
    ) -> Result<CommitResult> {
        let span = tracing::info_span!(
            "commit",
            vallum.ruleset = %job.ruleset,
            vallum.revision = tracing::field::Empty,
            vallum.outcome = tracing::field::Empty,
        );
        self.commit(job, audit, &span)
            .instrument(span.clone())
            .await
    }

    /// Commits `job` as [`Pipeline::run`], releases the write lock `write`, then waits until
    /// every store write so far (the commit, or its revert) is as durable as `durability`
    /// says (`None`: the store's, `--sync`): with [`Durability::Full`] on disk, in the one
    /// fsync that every commit queued meanwhile shares (group commit, see the module docs of
    /// [`crate::control::store`]).
    ///
    /// Errors: as [`Pipeline::run`]; [`Error::Io`] when the fsync failed (the commit
    /// runs, but its durability is not known).
    pub(super) async fn run_answered(
        &self,
        write: MutexGuard<'_, ()>,
        durability: Option<Durability>,
        job: Job,
        audit: &mut Option<AuditEntry>,
    ) -> Result<CommitResult> {
        let durability = durability.unwrap_or(self.store.durability());
        let job = Job {
            durability: Some(durability),
            ..job
        };
        let result = self.run(job, audit).await;
        let mark = self.store.written();
        drop(write);
        if durability == Durability::Normal {
            return result;
        }
        let synced = self.store.sync(mark).await;
        match (result, synced) {
            (Ok(_), Err(e)) => Err(e),
            (result, _) => result,
        }
    }

    /// [`Pipeline::run`] inside its `commit` span: the phases, in order.
    async fn commit(
        &self,
        job: Job,
        audit: &mut Option<AuditEntry>,
        span: &tracing::Span,
    ) -> Result<CommitResult> {
        let started_at = self.clock.unix_ns();
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
            durability,
        } = job;
        let priority = model.priority;
        // The kernel tables it has after the commit (`--kernel-tables`; cheap clones).
        let kernel_tables = self.kernel.as_ref().map(|k| k.tables_of(&model));

        // 1. limits read
        let existing = self.existing_rulesets(creates).await?;
        // 2. validate, then compile
        let (verdict, compile) = Compile::start(&self.engine, &self.sets, model, edited, span);
        let (warnings, compile) = self.verdict(&ruleset, &mut from, verdict, compile).await?;
        // 3. limits
        if let Some(existing) = existing
            && let Err(e) = limits::check_rulesets(existing, self.hooks.limits.max_rulesets)
        {
            // The compile's result is dropped on its own thread when it ends.
            drop(compile);
            return Err(e.into());
        }
        // 4. kernel plan
        let kernel_next = match self.kernel_plan(&ruleset, priority, kernel_tables) {
            Ok(next) => next,
            Err(e) => {
                drop(compile);
                self.emit_failed(&ruleset, &e);
                return Err(e);
            }
        };
        let t1 = self.clock.now_ns();
        // 5. persist, while the engine compiles
        let persisted = self
            .persist(PersistCommit {
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
            .await;
        let t2 = self.clock.now_ns();
        let prepared = compile.join().await;
        let parsed = kept_parse(&from, &prepared, &ruleset);
        let persisted = match persisted {
            Ok(p) => {
                if durability.unwrap_or(self.store.durability()) == Durability::Full {
                    // The fsync runs while the compile ends and the engine publishes.
                    self.store.request_sync(p.mark);
                }
                // The audit record is durable with the commit; a refusal below corrects it.
                audit.take();
                p
            }
            Err(e) => {
                // Nothing was published.
                retire(prepared);
                if is_server_failure(&e) {
                    self.emit_failed(&ruleset, &e);
                }
                return Err(e);
            }
        };
        #[cfg(test)]
        super::tests::before_publish();
        // 6. kernel tables
        let kernel_undo = match self.kernel_apply(kernel_next).await {
            Ok(undo) => undo,
            Err(e) => {
                retire(prepared);
                return Err(self.fail_after_persist(&ruleset, &persisted, e).await?);
            }
        };
        // 6b. the steering's facts chains of the snapshot about to run (`--nfqueue-facts-mark`):
        // a kernel that refuses them fails the commit
        if let (Some(f), Ok(p)) = (&self.facts, &prepared) {
            if let Err(e) = f.apply(p.kernel_facts()).await {
                retire(prepared);
                self.kernel_undo(kernel_undo).await;
                self.facts_restore().await;
                return Err(self.fail_after_persist(&ruleset, &persisted, e).await?);
            }
        }
        // 7. publish, quiesce, carry
        let number = persisted.revision.number;
        // As i64: OTel attributes have no unsigned integers.
        span.record("vallum.revision", i64::try_from(number).unwrap_or(i64::MAX));
        let report = match self
            .publish(prepared, &ruleset, priority, &persisted, span)
            .await
        {
            Ok(report) => report,
            Err(e) => {
                self.kernel_undo(kernel_undo).await;
                self.facts_restore().await;
                return Err(self.fail_after_persist(&ruleset, &persisted, e).await?);
            }
        };
        let phases = Phases {
            validate_ns: t1.saturating_sub(t0),
            compile_ns: report.compile_ns,
            persist_ns: t2.saturating_sub(t1),
            publish_ns: report.publish_ns,
            quiesce_ns: report.quiesce_ns,
            carry_ns: report.carry_ns,
            total_ns: self.clock.now_ns().saturating_sub(t0),
            cores_waited: u32::try_from(report.cores_waited).unwrap_or(u32::MAX),
        };
        // 8. record
        self.record(
            &ruleset, &persisted, outcome, phases, &report, parsed, from, span,
        )
        .await;
        Ok(CommitResult {
            revision: persisted.revision,
            phases,
            confirm_deadline,
            etag: persisted.ruleset.etag,
            warnings,
        })
    }

    /// Phase 1: the number of rulesets when the commit creates one (`--max-rulesets` is
    /// checked after validation); `None` otherwise.
    ///
    /// Errors: [`Error::Store`].
    async fn existing_rulesets(&self, creates: bool) -> Result<Option<usize>> {
        if !creates {
            return Ok(None);
        }
        Ok(Some(self.store.list_rulesets().await?.len()))
    }

    /// Phase 2's verdict: validation's warnings in the caller's terms, and the compile still
    /// running.
    ///
    /// Errors: [`Error::BadRequest`] when validation found errors (placed where the model
    /// came from); [`Error::Commit`] when the engine refused the change otherwise (a FAILED
    /// event); [`Error::TaskFailed`] when the task panicked ([`Error::Invariant`] when it ended
    /// without a verdict otherwise).
    async fn verdict(
        &self,
        ruleset: &str,
        from: &mut Origin,
        verdict: oneshot::Receiver<std::result::Result<Vec<Violation>, CommitError>>,
        compile: Compile,
    ) -> Result<(Vec<Finding>, Compile)> {
        match verdict.await {
            Ok(Ok(w)) => Ok((from.warnings(&w), compile)),
            Ok(Err(CommitError::Invalid(v))) => Err(from.refusal(&v)),
            Ok(Err(e)) => {
                let msg = e.to_string();
                self.emit(
                    ruleset,
                    None,
                    Outcome::Failed,
                    Phases::default(),
                    Some(msg.clone()),
                    0,
                );
                Err(Error::Commit(msg))
            }
            // The task ended without a verdict: it panicked.
            Err(_) => match compile.task.await {
                Err(e) => Err(Error::TaskFailed {
                    task: "commit",
                    source: e,
                }),
                Ok(_) => Err(Error::invariant("the commit task ended without a verdict")),
            },
        }
    }

    /// Phase 4: what the kernel tables become when `ruleset` has `tables` at `priority`
    /// (`None`: nothing changes there, or no `--kernel-tables`).
    ///
    /// Errors: [`Error::KernelTables`] when rulesets clash there.
    fn kernel_plan(
        &self,
        ruleset: &str,
        priority: i32,
        tables: Option<Vec<Table>>,
    ) -> Result<Option<Next>> {
        Ok(tables
            .map(|t| self.kernel_next(ruleset, Some((priority, t))))
            .transpose()?
            .flatten())
    }

    /// Phase 5: the commit's store transaction, durable when it returns.
    ///
    /// Errors: [`Error::EtagMismatch`], [`Error::NotFound`], [`Error::Store`].
    async fn persist(&self, commit: PersistCommit) -> Result<Persisted> {
        self.store
            .persist_commit(commit)
            .instrument(tracing::info_span!("persist"))
            .await
    }

    /// Phase 7: publishes `prepared` (made from a model at `priority`) as revision `persisted`
    /// of `ruleset` (the swap; quiesce, carry and the free of the replaced snapshot follow off
    /// the caller's path, [`Pipeline::retire_later`]), only now that the revision is durable,
    /// numbered with the store's revision so that the engine's answer to "which revision is
    /// active" changes with what the cores run.
    ///
    /// Errors: [`Error::Commit`] when the compile or the publish failed (a publish refused as
    /// stale); [`Error::Invariant`] when the priority changed, [`Error::TaskFailed`] when the task
    /// panicked.
    async fn publish(
        &self,
        prepared: Result<Prepared>,
        ruleset: &str,
        priority: i32,
        persisted: &Persisted,
        span: &tracing::Span,
    ) -> Result<CommitReport> {
        let mut prepared = prepared?;
        // The model's priority is the stored one (callers read it before `run`); should that
        // ever differ, the engine must not run something else than the store says.
        if persisted.ruleset.priority != priority {
            retire(Ok(prepared));
            return Err(Error::invariant(format!(
                "ruleset priority changed during the commit ({priority} -> {})",
                persisted.ruleset.priority
            )));
        }
        prepared.set_revision(ruleset, persisted.revision.number);
        let engine = self.engine.clone();
        let commit_span = span.clone();
        let clock = self.clock.clone();
        let published = tokio::task::spawn_blocking(move || {
            let publishing = tracing::info_span!(parent: &commit_span, "publish");
            // The quiesce child is placed while `publish` is still entered, so that it ends
            // before its parent does (the parent's end is taken when it is left).
            let published = publishing.in_scope(|| {
                let published = engine.publish(prepared);
                if let Ok(c) = &published {
                    quiesce_span(&publishing, &c.report, clock.system_time());
                }
                published
            });
            published.map(|c| {
                // Earlier replaced snapshots no core reads any more: freed off the async
                // workers, after the reply.
                let retired = c.retired;
                if !retired.is_empty() {
                    tokio::task::spawn_blocking(move || drop(retired));
                }
                c.report
            })
        })
        .await
        .map_err(|e| Error::TaskFailed {
            task: "commit",
            source: e,
        })?;
        let report = published.map_err(|e| Error::Commit(e.to_string()))?;
        self.retire_later(report.cores_waited);
        Ok(report)
    }

    /// After a publish at which `cores_waited` cores were mid-batch: retires the snapshots it
    /// replaced on a blocking thread, off the caller's path (`Engine::settle`: waits for those
    /// cores, finishes a pending counter carry, drops the snapshots there), and records that
    /// wait as the commit's `quiesce` phase in the metrics
    /// ([`crate::control::hooks::Observer::on_retired`]; 0 when the publish found no core
    /// mid-batch and retired them itself).
    pub(super) fn retire_later(&self, cores_waited: usize) {
        let engine = self.engine.clone();
        let observer = self.hooks.observer.clone();
        tokio::task::spawn_blocking(move || {
            let settled = engine.settle();
            observer.on_retired(settled.quiesce_ns, cores_waited);
            drop(settled);
        });
    }

    /// Phase 8: a published commit of `ruleset` told to its readers: the active revision, the
    /// parse kept for the next Apply, the phase columns (written after the reply: a
    /// transaction and an fsync the caller need not wait for; a failure to write them does not
    /// undo the commit), the commit event and the observer.
    #[allow(clippy::too_many_arguments)] // The phases' results, each used once.
    async fn record(
        &self,
        ruleset: &str,
        persisted: &Persisted,
        outcome: Outcome,
        phases: Phases,
        report: &CommitReport,
        parsed: Option<Weak<Ruleset>>,
        from: Origin,
        span: &tracing::Span,
    ) {
        let number = persisted.revision.number;
        self.activated(ruleset, Some(number));
        // For the next `--noflush` edit (shared with the revision row, not copied).
        self.keep_content(ruleset, number, persisted.revision.content.clone());
        self.forget_not_loaded(ruleset).await;
        if let (Some(model), Origin::Request { texts, .. }) = (parsed, from) {
            let previous = PreviousParse { texts, model };
            self.parses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ruleset.to_string(), previous);
        }
        let store = self.store.clone();
        let commit_id = persisted.commit_id;
        tokio::spawn(async move {
            if let Err(e) = store.finish_commit(commit_id, &phases).await {
                tracing::warn!(commit = commit_id, error = %e, "recording commit phases failed");
            }
        });
        span.record("vallum.outcome", outcome.label());
        self.emit(
            ruleset,
            Some(number),
            outcome,
            phases,
            None,
            report.rules as u64,
        );
    }

    /// A commit of `ruleset` that failed with `e` after its store transaction: the store is
    /// reverted by a compensating transaction and a FAILED event sent. Returns `e`.
    ///
    /// Errors: [`Error::Store`] when the revert fails.
    async fn fail_after_persist(
        &self,
        ruleset: &str,
        persisted: &Persisted,
        e: Error,
    ) -> Result<Error> {
        // The engine's own words for a commit it refused, the error's client text for the
        // rest (the commit row and the event are read by clients: no SQLite text).
        let message = match &e {
            Error::Commit(m) => m.clone(),
            e => e.client_message(),
        };
        let outcome = e.reason().info().name;
        self.store
            .revert_commit(persisted, &message, outcome)
            .await?;
        self.emit(
            ruleset,
            Some(persisted.revision.number),
            Outcome::Failed,
            Phases::default(),
            Some(message),
            0,
        );
        Ok(e)
    }
}

/// Phase 2's task: validation, then compilation, of one commit on one blocking thread. Both
/// need only the model, so the revision is written while the snapshot compiles (the store
/// write waits on the disk). Under the write lock, no set or other commit changes in between.
/// Dropping it leaves the task to end on its own thread (its result dropped there).
struct Compile {
    task: JoinHandle<Option<std::result::Result<Prepared, CommitError>>>,
}

impl Compile {
    /// Starts validating `model` (made from the active one by edits when `edited`: untouched
    /// rules keep counting where they are, `Change::PutEdited`), then compiling it; returns
    /// the verdict's receiver (validation's warnings, or why it was refused).
    fn start(
        engine: &Arc<Engine>,
        sets: &Arc<SetManager>,
        model: Ruleset,
        edited: bool,
        span: &tracing::Span,
    ) -> (
        oneshot::Receiver<std::result::Result<Vec<Violation>, CommitError>>,
        Compile,
    ) {
        let change = if edited {
            Change::PutEdited(model)
        } else {
            Change::Put(model)
        };
        let (engine, sets) = (engine.clone(), sets.clone());
        let (verdict, validated) = oneshot::channel();
        let commit_span = span.clone();
        let task = tokio::task::spawn_blocking(move || {
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
        (validated, Compile { task })
    }

    /// The compiled snapshot.
    ///
    /// Errors: [`Error::Commit`] when the engine failed to compile it; [`Error::TaskFailed`]
    /// when the task panicked, [`Error::Invariant`] when it ended without a compile.
    async fn join(self) -> Result<Prepared> {
        match self.task.await {
            Ok(Some(Ok(p))) => Ok(p),
            Ok(Some(Err(e))) => Err(Error::Commit(e.to_string())),
            Ok(None) => Err(Error::invariant("the commit task ended without a compile")),
            Err(e) => Err(Error::TaskFailed {
                task: "commit",
                source: e,
            }),
        }
    }
}

/// The model `prepared` holds for `ruleset`, kept after the commit with the texts of an
/// Apply that had some ([`Pipeline::previous_parse`]).
fn kept_parse(from: &Origin, prepared: &Result<Prepared>, ruleset: &str) -> Option<Weak<Ruleset>> {
    let keep_texts = matches!(from, Origin::Request { texts, .. } if !texts.is_empty());
    match prepared {
        Ok(p) if keep_texts => p.ruleset(ruleset).map(Arc::downgrade),
        _ => None,
    }
}

/// Drops a snapshot that will not be published off the async workers.
fn retire(prepared: Result<Prepared>) {
    if let Ok(p) = prepared {
        tokio::task::spawn_blocking(move || drop(p));
    }
}

/// The `quiesce` child of `publish`, placed from the engine's report just after its publish
/// call returned: the wait ended where the counter carry began (`carry_ns` ago) and lasted
/// `quiesce_ns`.
fn quiesce_span(publish: &tracing::Span, report: &CommitReport, now: std::time::SystemTime) {
    let end = now - Duration::from_nanos(report.carry_ns);
    let start = end - Duration::from_nanos(report.quiesce_ns);
    crate::telemetry::metrics::traces::record_interval(publish, "quiesce", start, end);
}

/// Whether a persist error is the server's failure (store, internal) rather than an answer
/// to the request (etag mismatch, not found), which is no commit attempt.
fn is_server_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::Store(_)
            | Error::Migrate(_)
            | Error::TaskFailed { .. }
            | Error::StoreCorrupt { .. }
            | Error::Io { .. }
            | Error::Invariant { .. }
    )
}
