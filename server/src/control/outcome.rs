//! How a commit ended: the one vocabulary of commit outcomes. The same [`Outcome`] is the
//! store's `commits.outcome` column ([`Outcome::as_str`]), the label of
//! `vallum_commits_total{outcome}` and `vallum_commit_duration_seconds{outcome}`
//! ([`Outcome::label`]), `CommitEvent.outcome` of WatchCommits (`COMMIT_OUTCOME_` +
//! [`Outcome::as_str`]), the runbook (docs/operations.md, "Commit outcomes") and the alert
//! rules (deploy/prometheus/vallum-rules.yaml: VallumCommitFailures fires on the outcomes
//! whose [`Outcome::is_failure`] is true). `server/tests/it/deploy.rs` keeps them in step.
//!
//! | outcome | what happened | the active revision |
//! |---|---|---|
//! | `committed` | Apply or CommitRevision made a revision active (or PENDING_CONFIRM) | the new one |
//! | `confirmed` | ConfirmCommit confirmed a pending commit-confirmed | unchanged |
//! | `rolled_back` | a deliberate Rollback made an earlier revision's content active | the earlier content, as a new revision |
//! | `reverted` | a commit-confirmed was not confirmed before its deadline: the previous content was made active again (or the ruleset deactivated) | the previous one |
//! | `refused` | Apply, CommitRevision or Rollback refused the ruleset (parse error, validation, a limit such as `--max-rules`); nothing stored but the audit record | unchanged |
//! | `failed` | the engine or the store failed after validation passed; the store was reverted | unchanged |
//!
//! Failures, for alerting, are `failed` (a server-side problem) and `reverted` (a change was
//! not confirmed: often a change that cut the operator off). A deliberate rollback is not a
//! failure, and neither is a refusal (the caller got the error and nothing changed); both
//! are counted and sent on the watch stream.

use std::str::FromStr;

use crate::error::{Error, Result};

/// How a commit ended (see the [module docs](self) for the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A revision became active (ACTIVE or PENDING_CONFIRM).
    Committed,
    /// A pending commit-confirmed was confirmed.
    Confirmed,
    /// A deliberate Rollback made an earlier revision's content active.
    RolledBack,
    /// A commit-confirmed deadline passed: the previous content is active again, or the
    /// ruleset was deactivated when it had none.
    Reverted,
    /// The request's ruleset was refused (parse, validation, limits); nothing changed.
    Refused,
    /// The engine or the store failed after validation; nothing changed.
    Failed,
}

impl Outcome {
    /// Every outcome, in table order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Committed,
        Outcome::Confirmed,
        Outcome::RolledBack,
        Outcome::Reverted,
        Outcome::Refused,
        Outcome::Failed,
    ];

    /// The stored text (`commits.outcome`), also the proto name without `COMMIT_OUTCOME_`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "COMMITTED",
            Outcome::Confirmed => "CONFIRMED",
            Outcome::RolledBack => "ROLLED_BACK",
            Outcome::Reverted => "REVERTED",
            Outcome::Refused => "REFUSED",
            Outcome::Failed => "FAILED",
        }
    }

    /// The metric label value: `committed`, `confirmed`, `rolled_back`, `reverted`,
    /// `refused`, `failed`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Confirmed => "confirmed",
            Outcome::RolledBack => "rolled_back",
            Outcome::Reverted => "reverted",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }

    /// Whether this outcome is a failure that alerting pages on (`failed`, `reverted`).
    pub fn is_failure(self) -> bool {
        match self {
            Outcome::Failed | Outcome::Reverted => true,
            Outcome::Committed | Outcome::Confirmed | Outcome::RolledBack | Outcome::Refused => {
                false
            }
        }
    }

    /// The outcome of a commit request that ended with `error`: [`Outcome::Refused`] when
    /// the request's ruleset was refused before anything was stored (a bad request, a
    /// limit); `None` for errors that are no commit attempt at all (not found, etag
    /// mismatch, wrong state, not ready), and for [`Outcome::Failed`] errors, which the
    /// pipeline reports itself where they happen.
    pub fn of_refusal(error: &Error) -> Option<Outcome> {
        match error {
            Error::BadRequest { .. } | Error::Limit(_) => Some(Outcome::Refused),
            Error::NotFound { .. }
            | Error::AlreadyExists { .. }
            | Error::SetFull { .. }
            | Error::EtagMismatch { .. }
            | Error::Precondition { .. }
            | Error::NotReady
            | Error::Commit(_)
            | Error::Store(_)
            | Error::Migrate(_)
            | Error::Startup { .. }
            | Error::Fleet(_)
            | Error::KernelTables(_)
            | Error::FleetOwned { .. }
            | Error::FleetValueTooLarge { .. }
            | Error::ScopeDenied { .. }
            | Error::ListChanged { .. }
            | Error::EventsNotKept { .. }
            | Error::TaskFailed { .. }
            | Error::StoreCorrupt { .. }
            | Error::Io { .. }
            | Error::Invariant { .. } => None,
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for Outcome {
    type Err = Error;

    /// Parses the stored text ([`Outcome::as_str`]).
    fn from_str(s: &str) -> Result<Self> {
        Outcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| Error::store_corrupt(format!("unknown commit outcome {s:?} in store")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_round_trips_and_labels_are_its_lower_case() {
        for o in Outcome::ALL {
            assert_eq!(o.as_str().parse::<Outcome>().expect("parses"), o);
            assert_eq!(o.label(), o.as_str().to_lowercase());
        }
        assert!("ROLLED-BACK".parse::<Outcome>().is_err());
    }

    /// A deliberate rollback and a refusal are not failures; a missed confirm deadline is.
    #[test]
    fn failures_are_failed_and_reverted() {
        let failures: Vec<_> = Outcome::ALL
            .into_iter()
            .filter(|o| o.is_failure())
            .collect();
        assert_eq!(failures, [Outcome::Reverted, Outcome::Failed]);
    }
}
