//! Shadow evaluation, the pipeline's side: making a stored revision the engine's shadow
//! ([`vallum_engine::engine::Engine::start_shadow`]), ending it on request or when its
//! duration passed (checked by the commit-confirmed timer, [`Pipeline::spawn_confirm_timer`],
//! on the pipeline's injected clock), and its report. The engine ends a shadow at every
//! publish by itself.

use vallum_engine::engine::{ShadowConfig, ShadowEnd, ShadowReport};

use super::*;

/// The longest a shadow may run.
pub const MAX_SHADOW: Duration = Duration::from_secs(24 * 3600);

/// The running shadow as the pipeline started it: its ruleset, revision and deadline (Unix
/// ns on [`Hooks::clock`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowDeadline {
    /// The shadowed ruleset.
    pub ruleset: String,
    /// The shadowed revision's number.
    pub revision: u64,
    /// When it ends, Unix ns.
    pub ends: i64,
}

impl Pipeline {
    /// Makes revision `number` of `ruleset` the engine's shadow for `duration` (module docs),
    /// replacing a shadow of the same ruleset. Returns its (empty) report and deadline.
    ///
    /// Errors: [`Error::NotFound`] for a missing ruleset or revision;
    /// [`Error::Precondition`] when the ruleset has no active revision (type RULESET_STATE)
    /// or another ruleset's shadow runs (type SHADOW_RUNNING); [`Error::BadRequest`] at
    /// `name` when the revision no longer validates beside the active rulesets (a set it
    /// names is gone); [`Error::Commit`] when the engine refused it otherwise.
    pub async fn shadow(
        &self,
        ruleset: &str,
        number: u64,
        duration: Duration,
        config: ShadowConfig,
    ) -> Result<(ShadowReport, ShadowDeadline)> {
        // Under the write lock: no commit between the check and the start.
        let _w = self.write.lock().await;
        let rs = self.ruleset(ruleset).await?;
        let rev = self.revision(ruleset, number).await?;
        let subject = format!("rulesets/{ruleset}");
        if self.engine.priority(ruleset).is_none() {
            return Err(Error::Precondition {
                kind: "RULESET_STATE",
                subject,
                message: "the ruleset has no active revision to compare the shadow with".into(),
            });
        }
        if let Some((other, n)) = self.engine.shadow_revision()
            && other != ruleset
        {
            return Err(Error::Precondition {
                kind: "SHADOW_RUNNING",
                subject: format!("rulesets/{other}/revisions/{n}"),
                message: "a shadow of another ruleset runs: end it first (one at a time)".into(),
            });
        }
        let model = rev.content.to_ruleset(ruleset, rs.priority)?;
        let (engine, sets) = (self.engine.clone(), self.sets.clone());
        let started = tokio::task::spawn_blocking(move || {
            engine.start_shadow(model, number, config, sets.as_ref())
        })
        .await
        .map_err(|e| Error::TaskFailed {
            task: "shadow",
            source: e,
        })?;
        match started {
            Ok(_) => {}
            Err(CommitError::Invalid(v)) => {
                return Err(Error::BadRequest {
                    reason: Reason::InvalidRuleset,
                    violations: v
                        .iter()
                        .filter(|v| v.severity == Severity::Error)
                        .map(|v| FieldViolation::new("name", v.to_string()))
                        .collect(),
                });
            }
            Err(e) => return Err(Error::Commit(e.to_string())),
        }
        let within = i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX);
        let deadline = ShadowDeadline {
            ruleset: ruleset.to_string(),
            revision: number,
            ends: self.clock.unix_ns().saturating_add(within),
        };
        *self.shadow_deadline() = Some(deadline.clone());
        let report = self
            .engine
            .shadow_report()
            .ok_or_else(|| Error::invariant("a shadow just started has no report"))?;
        Ok((report, deadline))
    }

    /// Ends `ruleset`'s running shadow and returns its last report.
    ///
    /// Errors: [`Error::NotFound`] (kind `shadow`) when no shadow of `ruleset` runs.
    pub async fn end_shadow(&self, ruleset: &str) -> Result<ShadowReport> {
        let _w = self.write.lock().await;
        if self
            .engine
            .shadow_revision()
            .is_none_or(|(r, _)| r != ruleset)
        {
            return Err(Error::NotFound {
                kind: "shadow",
                name: format!("rulesets/{ruleset}"),
            });
        }
        *self.shadow_deadline() = None;
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || engine.end_shadow())
            .await
            .map_err(|e| Error::TaskFailed {
                task: "shadow",
                source: e,
            })?
            .ok_or_else(|| Error::NotFound {
                kind: "shadow",
                name: format!("rulesets/{ruleset}"),
            })
    }

    /// `ruleset`'s shadow report (of the running shadow, or of the last one that ended) and,
    /// while it runs, its deadline.
    ///
    /// Errors: [`Error::NotFound`] (kind `shadow`) when `ruleset` had no shadow.
    pub fn shadow_report(&self, ruleset: &str) -> Result<(ShadowReport, Option<ShadowDeadline>)> {
        let not_found = || Error::NotFound {
            kind: "shadow",
            name: format!("rulesets/{ruleset}"),
        };
        let report = self.engine.shadow_report().ok_or_else(not_found)?;
        if report.ruleset != ruleset {
            return Err(not_found());
        }
        let deadline = match report.ended {
            None => self.shadow_deadline().clone(),
            Some(_) => None,
        };
        Ok((report, deadline))
    }

    /// Ends the running shadow when its deadline passed (its report says
    /// [`ShadowEnd::Expired`]); returns whether it did.
    pub async fn expire_shadow(&self) -> bool {
        let now = self.clock.unix_ns();
        let due = {
            let d = self.shadow_deadline();
            d.as_ref().is_some_and(|d| d.ends <= now)
        };
        if !due {
            return false;
        }
        let _w = self.write.lock().await;
        let Some(d) = self.shadow_deadline().take() else {
            return false;
        };
        // Only the shadow the deadline is for (a commit may have ended it meanwhile).
        if self.engine.shadow_revision() != Some((d.ruleset, d.revision)) {
            return false;
        }
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || engine.end_shadow_as(ShadowEnd::Expired).is_some())
            .await
            .unwrap_or(false)
    }

    fn shadow_deadline(&self) -> std::sync::MutexGuard<'_, Option<ShadowDeadline>> {
        self.shadow.lock().unwrap_or_else(|e| e.into_inner())
    }
}
