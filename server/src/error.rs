//! The service's one error type and its one table of codes.
//!
//! [`Reason`] is the table: each row gives the UPPER_SNAKE `ErrorInfo.reason`, the gRPC code
//! and the exit code `vallumctl` uses. It holds the reasons of the services and pipeline and
//! those of the tower layers in front of them ([`crate::auth`]: `TOKEN_*`, `ADMIN_REQUIRED`;
//! [`crate::limits`]: `REQUEST_TOO_LARGE`, `TOO_MANY_*`), so `vallumctl` maps every reason it
//! can receive through this one table.
//!
//! Exit codes of `vallumctl` are classes, not one number per reason:
//!
//! | exit | meaning |
//! |---|---|
//! | [`EXIT_OK`] 0 | success |
//! | [`EXIT_REJECTED`] 1 | the server (or a local check) refused the input or the call |
//! | [`EXIT_USAGE`] 2 | usage (clap's own code for bad flags) |
//! | [`EXIT_UNAVAILABLE`] 3 | the server is unreachable, loading or stopping | [`Error`]'s `Display` is the human message;
//! `From<Error> for tonic::Status` is the only place errors become gRPC statuses, with
//! `BadRequest` field violations, `PreconditionFailure` and `ErrorInfo` details
//! (domain [`ERROR_DOMAIN`]).

use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every error.
pub const ERROR_DOMAIN: &str = "vallum.dev";

/// `vallumctl` exit code: success.
pub const EXIT_OK: u8 = 0;
/// `vallumctl` exit code: the input or call was rejected.
pub const EXIT_REJECTED: u8 = 1;
/// `vallumctl` exit code: usage error (clap).
pub const EXIT_USAGE: u8 = 2;
/// `vallumctl` exit code: the server could not be reached, is not ready or is stopping.
pub const EXIT_UNAVAILABLE: u8 = 3;

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
    /// No bearer token in the request (auth layer).
    TokenMissing,
    /// The bearer token is not configured (auth layer).
    TokenInvalid,
    /// A read-only token called a method that needs an admin token (auth layer).
    AdminRequired,
    /// The request message is larger than `--max-request-bytes` (limits layer).
    RequestTooLarge,
    /// The ruleset has more rules than `--max-rules`.
    TooManyRules,
    /// The ruleset has more chains than `--max-chains`.
    TooManyChains,
    /// Creating a set would exceed `--max-sets`.
    TooManySets,
    /// A set's `maxelem` is above `--max-set-elements`.
    SetTooLarge,
    /// Creating the ruleset would exceed `--max-rulesets`.
    TooManyRulesets,
    /// The server is stopping.
    ShuttingDown,
    /// The set (or set element) to create or add exists already (as ipset without `-exist`).
    AlreadyExists,
    /// Adding would exceed the set's `maxelem` (as ipset: "Hash is full").
    SetFull,
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
    pub const ALL: [Reason; 24] = [
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
        Reason::TokenMissing,
        Reason::TokenInvalid,
        Reason::AdminRequired,
        Reason::RequestTooLarge,
        Reason::TooManyRules,
        Reason::TooManyChains,
        Reason::TooManySets,
        Reason::SetTooLarge,
        Reason::TooManyRulesets,
        Reason::ShuttingDown,
        Reason::AlreadyExists,
        Reason::SetFull,
    ];

    /// This reason's row of the table.
    pub const fn info(self) -> ReasonInfo {
        use tonic::Code;
        const REJECTED: u8 = EXIT_REJECTED;
        const UNAVAILABLE: u8 = EXIT_UNAVAILABLE;
        let (name, code, exit_code) = match self {
            Reason::InvalidArgument => ("INVALID_ARGUMENT", Code::InvalidArgument, REJECTED),
            Reason::InvalidRuleset => ("INVALID_RULESET", Code::InvalidArgument, REJECTED),
            Reason::UnsupportedExtension => {
                ("UNSUPPORTED_EXTENSION", Code::InvalidArgument, REJECTED)
            }
            Reason::NoflushUnsupported => ("NOFLUSH_UNSUPPORTED", Code::InvalidArgument, REJECTED),
            Reason::BadCapture => ("BAD_CAPTURE", Code::InvalidArgument, REJECTED),
            Reason::NotFound => ("NOT_FOUND", Code::NotFound, REJECTED),
            Reason::EtagMismatch => ("ETAG_MISMATCH", Code::FailedPrecondition, REJECTED),
            Reason::FailedPrecondition => {
                ("FAILED_PRECONDITION", Code::FailedPrecondition, REJECTED)
            }
            Reason::NotReady => ("NOT_READY", Code::Unavailable, UNAVAILABLE),
            Reason::CommitFailed => ("COMMIT_FAILED", Code::Internal, REJECTED),
            Reason::Store => ("STORE_ERROR", Code::Internal, REJECTED),
            Reason::Internal => ("INTERNAL", Code::Internal, REJECTED),
            Reason::TokenMissing => ("TOKEN_MISSING", Code::Unauthenticated, REJECTED),
            Reason::TokenInvalid => ("TOKEN_INVALID", Code::Unauthenticated, REJECTED),
            Reason::AdminRequired => ("ADMIN_REQUIRED", Code::PermissionDenied, REJECTED),
            Reason::RequestTooLarge => ("REQUEST_TOO_LARGE", Code::ResourceExhausted, REJECTED),
            Reason::TooManyRules => ("TOO_MANY_RULES", Code::ResourceExhausted, REJECTED),
            Reason::TooManyChains => ("TOO_MANY_CHAINS", Code::ResourceExhausted, REJECTED),
            Reason::TooManySets => ("TOO_MANY_SETS", Code::ResourceExhausted, REJECTED),
            Reason::SetTooLarge => ("SET_TOO_LARGE", Code::ResourceExhausted, REJECTED),
            Reason::TooManyRulesets => ("TOO_MANY_RULESETS", Code::ResourceExhausted, REJECTED),
            Reason::ShuttingDown => ("SHUTTING_DOWN", Code::Unavailable, UNAVAILABLE),
            Reason::AlreadyExists => ("ALREADY_EXISTS", Code::AlreadyExists, REJECTED),
            Reason::SetFull => ("SET_FULL", Code::ResourceExhausted, REJECTED),
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
    /// A ruleset, revision, set or set element that does not exist.
    #[error("{kind} {name} not found")]
    NotFound {
        /// `ruleset`, `revision`, `set` or `element`.
        kind: &'static str,
        /// Its resource name (`sets/NAME`; for an element `sets/NAME: ELEMENT (elements[i])`).
        name: String,
    },
    /// A set (or set element) to create exists already.
    #[error("{kind} {name} already exists")]
    AlreadyExists {
        /// `set` or `element`.
        kind: &'static str,
        /// Its resource name, as in [`Error::NotFound`].
        name: String,
    },
    /// Adding the elements would exceed the set's `maxelem`.
    #[error("set {set} is full ({maxelem} elements, maxelem)")]
    SetFull {
        /// Resource name `sets/NAME`.
        set: String,
        /// The set's limit.
        maxelem: u32,
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
    /// A write transaction on the store's writer connection failed.
    #[error("store: {0}")]
    StoreWrite(#[from] rusqlite::Error),
    /// A migration failed at start.
    #[error("store migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A configured limit refused the request (rules per ruleset, rulesets).
    #[error(transparent)]
    Limit(#[from] crate::limits::LimitError),
    /// vallumd cannot start: a token file, certificate, metrics exporter or listener is
    /// wrong. Never sent to a client.
    #[error("{message} ({code})")]
    Startup {
        /// The UPPER_SNAKE code of the cause, e.g. `TOKEN_FILE_INVALID`, `METRICS_BIND`.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
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
            Error::AlreadyExists { .. } => Reason::AlreadyExists,
            Error::SetFull { .. } => Reason::SetFull,
            Error::EtagMismatch { .. } => Reason::EtagMismatch,
            Error::Precondition { .. } => Reason::FailedPrecondition,
            Error::NotReady => Reason::NotReady,
            Error::Commit(_) => Reason::CommitFailed,
            Error::Store(_) | Error::StoreWrite(_) | Error::Migrate(_) => Reason::Store,
            Error::Limit(l) => l.reason(),
            Error::Startup { .. } | Error::Internal(_) => Reason::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let reason = e.reason();
        let info = reason.info();
        let message = e.to_string();
        let mut details = ErrorDetails::new();
        let mut metadata = std::collections::HashMap::new();
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
            Error::AlreadyExists { kind, name } => {
                details.set_resource_info(*kind, name.clone(), "", message.clone());
            }
            Error::SetFull { set, maxelem } => {
                metadata.insert("maxelem".to_string(), maxelem.to_string());
                details.set_resource_info("set", set.clone(), "", message.clone());
            }
            Error::Limit(l) => {
                metadata = l.metadata();
                if let crate::limits::LimitError::TooManyRules { .. }
                | crate::limits::LimitError::TooManyChains { .. } = l
                {
                    details.add_bad_request_violation("source", message.clone());
                }
            }
            Error::NotFound { .. }
            | Error::NotReady
            | Error::Commit(_)
            | Error::Store(_)
            | Error::StoreWrite(_)
            | Error::Migrate(_)
            | Error::Startup { .. }
            | Error::Internal(_) => {}
        }
        details.set_error_info(info.name, ERROR_DOMAIN, metadata);
        tonic::Status::with_error_details(info.code, message, details)
    }
}

macro_rules! startup_error {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Startup {
                    code: e.reason(),
                    message: e.to_string(),
                }
            }
        }
    )*};
}
startup_error!(
    crate::auth::AuthError,
    crate::tls::TlsError,
    crate::metrics::MetricsError
);

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_unique_and_round_trips() {
        let mut names = std::collections::HashSet::new();
        for r in Reason::ALL {
            let info = r.info();
            assert!(names.insert(info.name));
            assert_eq!(Reason::from_name(info.name), Some(r));
            // UNAVAILABLE rows, and only those, tell vallumctl to exit 3.
            let unavailable = info.code == tonic::Code::Unavailable;
            assert_eq!(
                info.exit_code,
                if unavailable {
                    EXIT_UNAVAILABLE
                } else {
                    EXIT_REJECTED
                },
                "{}",
                info.name
            );
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
