//! Commit-confirmed, the pipeline's side: confirming a pending revision, the timer that
//! rolls back the revisions whose deadline passed (as JunOS `commit confirmed`), and the
//! state a commit with a deadline is stored in. The deadlines are read from the pipeline's
//! injected clock.

use super::*;

impl Pipeline {
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
        check_etag(&rs, etag)?;
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

    /// Reverts every commit-confirmed whose deadline passed: the previous revision's content
    /// is committed as a new revision (outcome REVERTED, the unconfirmed revision REJECTED),
    /// or the ruleset is deactivated when it had no previous revision (outcome REVERTED).
    /// Returns how many were reverted.
    ///
    /// Errors: [`Error::Store`], [`Error::Commit`].
    pub async fn expire_confirms(&self) -> Result<usize> {
        let now = self.clock.unix_ns();
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
                                content: (*rev.content).clone(),
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
                            durability: None,
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
                    .map_err(|e| Error::TaskFailed {
                        task: "commit",
                        source: e,
                    })?
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

    /// The state and deadline (Unix ns on [`Hooks::clock`]) of a commit made with
    /// `confirm_within` (none or zero: ACTIVE, no deadline).
    pub(super) fn confirm_state(&self, within: Option<Duration>) -> (RevisionState, Option<i64>) {
        match within.filter(|d| !d.is_zero()) {
            Some(d) => {
                let now = self.clock.unix_ns();
                let within = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
                (
                    RevisionState::PendingConfirm,
                    Some(now.saturating_add(within)),
                )
            }
            None => (RevisionState::Active, None),
        }
    }

    /// Runs [`Pipeline::expire_confirms`] and [`Pipeline::expire_shadow`] every `interval`
    /// until the returned task is aborted.
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
                me.expire_shadow().await;
            }
        })
    }
}
