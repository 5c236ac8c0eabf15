//! The service's one error type and its one table of codes.
//!
//! [`Reason`] is the table: each row gives the UPPER_SNAKE `ErrorInfo.reason`, the gRPC code
//! and the exit code `vallumctl` uses. [`Error`]'s `Display` is the human message;
//! `From<Error> for tonic::Status` is the only place errors become gRPC statuses, with
//! `BadRequest` field violations, `PreconditionFailure` and `ErrorInfo` details
//! (domain [`ERROR_DOMAIN`]).

use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every error.
pub const ERROR_DOMAIN: &str = "vallum.dev";

/// The table of error codes: one row per reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A request field is missing or malformed (names, durations, packets).
    InvalidArgument,
    /// The ruleset text or structure does not parse or does not validate.
    InvalidRuleset,
    /// The ruleset uses an extension the engine does not enforce in filter/raw.
    UnsupportedExtension,
    /// The ruleset relies on state outside the text (iptables-restore `--noflush` input).
    NoflushUnsupported,
    /// A capture that cannot be read.
    BadCapture,
    /// The named ruleset or revision does not exist.
    NotFound,
    /// The request's etag differs from the stored one.
    EtagMismatch,
    /// The resource is not in a state that allows the call (e.g. confirming a commit that
    /// is not pending).
    FailedPrecondition,
    /// The server is still loading its stored state.
    NotReady,
    /// The engine refused a commit that passed validation.
    CommitFailed,
    /// The store failed (I/O, corruption, migration).
    Store,
    /// A bug or an unexpected condition.
    Internal,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct ReasonInfo {
    /// UPPER_SNAKE name, as in `ErrorInfo.reason`.
    pub name: &'static str,
    /// The gRPC status code.
    pub code: tonic::Code,
    /// The process exit code of `vallumctl` for this error.
    pub exit_code: u8,
}

impl Reason {
    /// Every reason, in table order.
    pub const ALL: [Reason; 12] = [
        Reason::InvalidArgument,
        Reason::InvalidRuleset,
        Reason::UnsupportedExtension,
        Reason::NoflushUnsupported,
        Reason::BadCapture,
        Reason::NotFound,
        Reason::EtagMismatch,
        Reason::FailedPrecondition,
        Reason::NotReady,
        Reason::CommitFailed,
        Reason::Store,
        Reason::Internal,
    ];

    /// This reason's row of the table.
    pub const fn info(self) -> ReasonInfo {
        use tonic::Code;
        let (name, code, exit_code) = match self {
            Reason::InvalidArgument => ("INVALID_ARGUMENT", Code::InvalidArgument, 2),
            Reason::InvalidRuleset => ("INVALID_RULESET", Code::InvalidArgument, 3),
            Reason::UnsupportedExtension => ("UNSUPPORTED_EXTENSION", Code::InvalidArgument, 4),
            Reason::NoflushUnsupported => ("NOFLUSH_UNSUPPORTED", Code::InvalidArgument, 5),
            Reason::BadCapture => ("BAD_CAPTURE", Code::InvalidArgument, 6),
            Reason::NotFound => ("NOT_FOUND", Code::NotFound, 7),
            Reason::EtagMismatch => ("ETAG_MISMATCH", Code::FailedPrecondition, 8),
            Reason::FailedPrecondition => ("FAILED_PRECONDITION", Code::FailedPrecondition, 9),
            Reason::NotReady => ("NOT_READY", Code::Unavailable, 10),
            Reason::CommitFailed => ("COMMIT_FAILED", Code::Internal, 11),
            Reason::Store => ("STORE_ERROR", Code::Internal, 12),
            Reason::Internal => ("INTERNAL", Code::Internal, 13),
        };
        ReasonInfo {
            name,
            code,
            exit_code,
        }
    }

    /// The reason whose UPPER_SNAKE name is `name` (for clients reading `ErrorInfo`).
    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.info().name == name)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.info().name)
    }
}

/// One bad field: a path such as `source.text.content` and a description (for text,
/// `FILE:LINE:COL: message`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldViolation {
    /// Field path in the request.
    pub field: String,
    /// What is wrong.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        FieldViolation {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// Every error the server returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed or the ruleset is invalid; `reason` is one of the
    /// INVALID_ARGUMENT rows; every bad field is listed.
    #[error("{reason}: {}", first(.violations))]
    BadRequest {
        /// Which row of the table.
        reason: Reason,
        /// Every bad field (at least one).
        violations: Vec<FieldViolation>,
    },
    /// A ruleset or revision that does not exist.
    #[error("{kind} {name} not found")]
    NotFound {
        /// `ruleset` or `revision`.
        kind: &'static str,
        /// Its resource name.
        name: String,
    },
    /// The request carried an etag that is not the stored one.
    #[error("etag mismatch on {name}: request has {given:?}, current is {current:?}")]
    EtagMismatch {
        /// Resource name.
        name: String,
        /// The etag in the request.
        given: String,
        /// The stored etag.
        current: String,
    },
    /// The resource is in the wrong state for this call.
    #[error("{subject}: {message}")]
    Precondition {
        /// PreconditionFailure type, e.g. `REVISION_STATE`.
        kind: &'static str,
        /// Resource name.
        subject: String,
        /// What is wrong.
        message: String,
    },
    /// The stored state is not loaded yet.
    #[error("the server is still loading its stored state")]
    NotReady,
    /// The engine refused a commit after validation passed; the store was reverted.
    #[error("commit failed in the engine: {0}")]
    Commit(String),
    /// A store query failed.
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    /// A migration failed at start.
    #[error("store migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Anything else (a bug, or startup I/O).
    #[error("internal: {0}")]
    Internal(String),
}

fn first(v: &[FieldViolation]) -> String {
    match v.first() {
        Some(f) if v.len() > 1 => {
            format!("{}: {} (and {} more)", f.field, f.description, v.len() - 1)
        }
        Some(f) => format!("{}: {}", f.field, f.description),
        None => String::from("bad request"),
    }
}

impl Error {
    /// A bad request with one violation and reason INVALID_ARGUMENT.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Error {
        Error::BadRequest {
            reason: Reason::InvalidArgument,
            violations: vec![FieldViolation::new(field, description)],
        }
    }

    /// This error's row of the table.
    pub fn reason(&self) -> Reason {
        match self {
            Error::BadRequest { reason, .. } => *reason,
            Error::NotFound { .. } => Reason::NotFound,
            Error::EtagMismatch { .. } => Reason::EtagMismatch,
            Error::Precondition { .. } => Reason::FailedPrecondition,
            Error::NotReady => Reason::NotReady,
            Error::Commit(_) => Reason::CommitFailed,
            Error::Store(_) | Error::Migrate(_) => Reason::Store,
            Error::Internal(_) => Reason::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let reason = e.reason();
        let info = reason.info();
        let message = e.to_string();
        let mut details = ErrorDetails::new();
        match &e {
            Error::BadRequest { violations, .. } => {
                for v in violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
            }
            Error::EtagMismatch { name, .. } => {
                details.add_precondition_failure_violation("ETAG", name.clone(), message.clone());
            }
            Error::Precondition {
                kind,
                subject,
                message,
            } => {
                details.add_precondition_failure_violation(*kind, subject.clone(), message.clone());
            }
            Error::NotFound { .. }
            | Error::NotReady
            | Error::Commit(_)
            | Error::Store(_)
            | Error::Migrate(_)
            | Error::Internal(_) => {}
        }
        details.set_error_info(info.name, ERROR_DOMAIN, std::collections::HashMap::new());
        tonic::Status::with_error_details(info.code, message, details)
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_unique_and_round_trips() {
        let mut names = std::collections::HashSet::new();
        let mut exits = std::collections::HashSet::new();
        for r in Reason::ALL {
            assert!(names.insert(r.info().name));
            assert!(exits.insert(r.info().exit_code));
            assert_eq!(Reason::from_name(r.info().name), Some(r));
        }
    }

    #[test]
    fn status_carries_details() {
        let s: tonic::Status = Error::invalid("source.text.content", "f:1:2: bad").into();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        let d = s.get_error_details();
        assert_eq!(d.error_info().unwrap().reason, "INVALID_ARGUMENT");
        assert_eq!(
            d.bad_request().unwrap().field_violations[0].field,
            "source.text.content"
        );
        let s: tonic::Status = Error::EtagMismatch {
            name: "rulesets/a".into(),
            given: "x".into(),
            current: "y".into(),
        }
        .into();
        assert_eq!(s.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            s.get_error_details()
                .precondition_failure()
                .unwrap()
                .violations
                .len(),
            1
        );
    }
}
