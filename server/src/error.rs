//! The service's one error type and how it becomes a gRPC status.
//!
//! The table of error codes ([`Reason`]: UPPER_SNAKE `ErrorInfo.reason`, gRPC code, `vallumctl`
//! exit code; [`ClientReason`], the client-side rows) lives in `vallum_api::reason`, which
//! vallumctl reads too, and is re-exported here; this module is where the server meets it.
//!
//! [`Error`]'s `Display` is the human message, for the log; [`Error::client_message`] is what
//! a client reads: the same, except that a store failure ([`Error::Store`],
//! [`Error::Migrate`]) and a failed task ([`Error::TaskFailed`]) get a fixed text (SQLite's
//! own text, paths and panic messages stay in vallumd's log).
//! `From<Error> for tonic::Status` is the only place errors become gRPC statuses, with
//! `BadRequest` field violations, `PreconditionFailure` and `ErrorInfo` details
//! (domain [`ERROR_DOMAIN`]).

use tonic_types::{ErrorDetails, StatusExt};

pub use vallum_api::reason::{
    ClientReason, ClientReasonInfo, ERROR_DOMAIN, EXIT_OK, EXIT_REJECTED, EXIT_UNAVAILABLE,
    EXIT_USAGE, Reason, ReasonInfo, status_exit_code,
};

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
    #[error(
        "etag mismatch on {name}: request has {}, current is {current:?}",
        vallum_engine::echo::quoted(.given)
    )]
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
    /// A store query or transaction failed (SQLite, through rusqlite).
    #[error("store: {0}")]
    Store(#[from] rusqlite::Error),
    /// A migration failed at start, or the database's migrations do not match this build's
    /// (see server/src/control/store/migrate.rs).
    #[error("store migration: {0}")]
    Migrate(String),
    /// A configured limit refused the request (rules per ruleset, rulesets).
    #[error(transparent)]
    Limit(#[from] crate::grpc::limits::LimitError),
    /// vallumd cannot start: a token file, certificate, metrics exporter or listener is
    /// wrong. Never sent to a client.
    #[error("{message} ({code})")]
    Startup {
        /// The UPPER_SNAKE code of the cause, e.g. `TOKEN_FILE_INVALID`, `METRICS_BIND`.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A spawned or blocking task ended without its result: it panicked or was cancelled
    /// (a bug, or shutdown). A client reads only which task failed.
    #[error("internal: the {task} task failed: {source}")]
    TaskFailed {
        /// What the task did, e.g. `commit`, `audit`, `store`.
        task: &'static str,
        /// tokio's report (the panic's message, or cancelled).
        #[source]
        source: tokio::task::JoinError,
    },
    /// Stored data that does not read back as this build writes it: a row the schema
    /// promises is missing, a value outside its column's set, a stored text that no longer
    /// parses; in fleet mode, an etcd key whose value is not a fleet ruleset.
    #[error("stored data this build cannot read: {what}")]
    StoreCorrupt {
        /// What was read and what is wrong with it.
        what: String,
    },
    /// An OS call failed: spawning a thread, binding a socket, creating a directory,
    /// reading a file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. `bind 127.0.0.1:50051`.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A broken internal invariant: a bug in vallumd, never the caller's fault.
    #[error("internal: {what}")]
    Invariant {
        /// What should have held.
        what: String,
    },
    /// Fleet mode: etcd cannot be reached, or refused the request (see [`crate::control::fleet`]).
    #[error("fleet: {0}")]
    Fleet(String),
    /// `--kernel-tables`: the kernel refused the tables handed to it, or two rulesets declare
    /// one chain of a kernel table (see [`crate::host::kernel_tables`]); nothing was published.
    #[error("kernel tables: {0}")]
    KernelTables(String),
    /// Fleet mode: a fleet ruleset whose etcd write would exceed etcd's request limit
    /// (checked by FleetService before the write, see [`crate::control::fleet::service`]).
    #[error(
        "fleet ruleset {name}: its etcd write would be {bytes} bytes, over etcd's request limit of {limit} bytes (etcd --max-request-bytes, 1.5 MiB by default; vallumd --fleet-max-request-bytes); nothing was written: split the rules into several fleet rulesets"
    )]
    FleetValueTooLarge {
        /// The ruleset name.
        name: String,
        /// The size of the write: the value, the key and the transaction around them.
        bytes: usize,
        /// The limit (`--fleet-max-request-bytes`).
        limit: usize,
    },
    /// Fleet mode: a local mutation of a ruleset the fleet agent owns.
    #[error(
        "rulesets/{ruleset} is owned by {owner}; change it with FleetService (vallumctl fleet)"
    )]
    FleetOwned {
        /// The ruleset name.
        ruleset: String,
        /// The owner, e.g. `fleet /vallum/v1/ (fleet revision 42)`.
        owner: String,
    },
    /// A page token of a listing whose contents changed between two pages in a way the
    /// token cannot continue over (see [`crate::grpc::service::paging`]).
    #[error(
        "{what} changed since this page token was issued: {detail}; list again from the first page"
    )]
    ListChanged {
        /// What was listed, e.g. `counters`.
        what: &'static str,
        /// What changed.
        detail: String,
    },
    /// WatchCommits was asked to resume after events it no longer keeps.
    #[error(
        "commit events after sequence {start_after} are not kept: {kept}; list the current state (ListRulesets) and watch from now"
    )]
    EventsNotKept {
        /// The request's `start_after`.
        start_after: u64,
        /// Which sequence numbers are kept, in words.
        kept: String,
    },
    /// A scoped token (see [`crate::grpc::auth::Scope`]) asked for something outside its scope.
    #[error("{caller} may not {what}: its scope ({held}) lacks {missing}")]
    ScopeDenied {
        /// The token's name.
        caller: String,
        /// What was asked, e.g. `DeleteRuleset rulesets/team-b`.
        what: String,
        /// The scope it holds, as in the token file.
        held: String,
        /// The missing scope word, e.g. `rulesets=team-b` (also `ErrorInfo.metadata["scope"]`).
        missing: String,
    },
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
            Error::Store(e) if store_full(e) => Reason::StoreFull,
            Error::Store(_) | Error::Migrate(_) => Reason::Store,
            Error::Limit(l) => l.reason(),
            Error::Startup { .. }
            | Error::TaskFailed { .. }
            | Error::StoreCorrupt { .. }
            | Error::Io { .. }
            | Error::Invariant { .. } => Reason::Internal,
            Error::Fleet(_) => Reason::FleetUnavailable,
            Error::KernelTables(_) => Reason::KernelTablesRefused,
            Error::FleetOwned { .. } => Reason::FleetOwned,
            Error::FleetValueTooLarge { .. } => Reason::FleetValueTooLarge,
            Error::ScopeDenied { .. } => Reason::ScopeDenied,
            Error::ListChanged { .. } => Reason::ListChanged,
            Error::EventsNotKept { .. } => Reason::EventsNotKept,
        }
    }
}

impl Error {
    /// An [`Error::Io`]: `what` failed with `source`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// An [`Error::StoreCorrupt`].
    pub fn store_corrupt(what: impl Into<String>) -> Error {
        Error::StoreCorrupt { what: what.into() }
    }

    /// An [`Error::Invariant`].
    pub fn invariant(what: impl Into<String>) -> Error {
        Error::Invariant { what: what.into() }
    }

    /// What a client reads (the gRPC status message, a WatchCommits event's error): the
    /// `Display` text, except for [`Error::Store`] and [`Error::Migrate`] (a fixed text per
    /// reason: SQLite's message can name paths, tables and queries) and
    /// [`Error::TaskFailed`] (the task's name without the panic message).
    pub fn client_message(&self) -> String {
        match self {
            Error::Store(e) if store_full(e) => STORE_FULL_MESSAGE.to_string(),
            Error::Store(_) | Error::Migrate(_) => STORE_MESSAGE.to_string(),
            Error::TaskFailed { task, .. } => {
                format!("internal: the {task} task failed; vallumd's log says why")
            }
            other => other.to_string(),
        }
    }
}

/// What a client reads for a store failure ([`Error::client_message`]).
pub const STORE_MESSAGE: &str = "store: the database call failed; vallumd's log says why";

/// What a client reads when the store's disk is full ([`Error::client_message`]).
pub const STORE_FULL_MESSAGE: &str =
    "store: the disk holding the database is full; free space and retry";

/// SQLite's SQLITE_FULL: the disk (or the file system's quota) is full. The call changed
/// nothing (its transaction rolled back) and may succeed once space is freed.
fn store_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// The most bytes of `grpc-message` an error sends (cut with an ellipsis). With
/// [`MAX_DETAIL_BYTES`] it keeps a status well inside the 16 KiB header list a client accepts
/// by default (hyper's `max_header_list_size`; beyond it the client sees
/// RESOURCE_EXHAUSTED "metadata size exceeds hard limit" instead of the error). Messages echo
/// input through `vallum_engine::echo`, so this only cuts lists of many violations.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// The most bytes of `BadRequest` violations (fields and descriptions) one status carries;
/// the violations past it are counted in a last one, field `""`.
pub const MAX_DETAIL_BYTES: usize = 6 * 1024;

/// `s` cut to at most `max` bytes on a character boundary, with an ellipsis when cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let reason = e.reason();
        let info = reason.info();
        if matches!(
            e,
            Error::Store(_) | Error::Migrate(_) | Error::TaskFailed { .. }
        ) {
            // The client reads a fixed text (`client_message`); the cause is logged here.
            tracing::error!(error = %e, reason = info.name, "answered a client with {}", info.name);
        }
        let message = cut(&e.client_message(), MAX_MESSAGE_BYTES);
        let mut details = ErrorDetails::new();
        let mut metadata = std::collections::HashMap::new();
        match &e {
            Error::BadRequest { violations, .. } => {
                let mut budget = MAX_DETAIL_BYTES;
                for (i, v) in violations.iter().enumerate() {
                    let field = cut(&v.field, MAX_MESSAGE_BYTES);
                    let description = cut(&v.description, MAX_MESSAGE_BYTES);
                    let size = field.len() + description.len();
                    if size > budget {
                        details.add_bad_request_violation(
                            "",
                            format!(
                                "{} more violations not shown ({i} of {} shown)",
                                violations.len() - i,
                                violations.len()
                            ),
                        );
                        break;
                    }
                    budget -= size;
                    details.add_bad_request_violation(field, description);
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
                if let crate::grpc::limits::LimitError::TooManyRules { .. }
                | crate::grpc::limits::LimitError::TooManyChains { .. } = l
                {
                    details.add_bad_request_violation("source", message.clone());
                }
                if let crate::grpc::limits::LimitError::ListTooLarge { field, .. } = l {
                    details.add_bad_request_violation(field.clone(), message.clone());
                }
            }
            Error::FleetOwned { ruleset, .. } => {
                details.add_precondition_failure_violation(
                    "FLEET_OWNED",
                    format!("rulesets/{ruleset}"),
                    message.clone(),
                );
            }
            Error::FleetValueTooLarge { bytes, limit, .. } => {
                metadata.insert("bytes".to_string(), bytes.to_string());
                metadata.insert("limit_bytes".to_string(), limit.to_string());
            }
            Error::ScopeDenied { missing, .. } => {
                metadata.insert("scope".to_string(), missing.clone());
            }
            Error::EventsNotKept { start_after, .. } => {
                metadata.insert("start_after".to_string(), start_after.to_string());
            }
            Error::NotFound { .. }
            | Error::ListChanged { .. }
            | Error::Fleet(_)
            | Error::KernelTables(_)
            | Error::NotReady
            | Error::Commit(_)
            | Error::Store(_)
            | Error::Migrate(_)
            | Error::Startup { .. }
            | Error::TaskFailed { .. }
            | Error::StoreCorrupt { .. }
            | Error::Io { .. }
            | Error::Invariant { .. } => {}
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
    crate::grpc::auth::AuthError,
    crate::grpc::tls::TlsError,
    crate::telemetry::metrics::MetricsError
);

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// However many violations and however long their text, a status stays small enough for
    /// a client's header limit (found by review: a 10,000-character name overflowed it), and
    /// says how many violations it left out.
    #[test]
    fn status_stays_small() {
        let violations: Vec<FieldViolation> = (0..10_000)
            .map(|i| FieldViolation::new(format!("elements[{i}]"), "x".repeat(100 + i % 3000)))
            .collect();
        let s: tonic::Status = Error::BadRequest {
            reason: Reason::InvalidArgument,
            violations,
        }
        .into();
        assert!(
            s.message().len() <= MAX_MESSAGE_BYTES,
            "{}",
            s.message().len()
        );
        assert!(
            s.details().len() < 8 * 1024,
            "{} bytes of details",
            s.details().len()
        );
        let shown = s
            .get_error_details()
            .bad_request()
            .unwrap()
            .field_violations
            .clone();
        let last = shown.last().unwrap();
        assert_eq!(last.field, "");
        assert!(
            last.description.ends_with("of 10000 shown)"),
            "{}",
            last.description
        );
        assert_eq!(shown[0].field, "elements[0]");
    }

    /// A real SQLite error reaches the client as the fixed store message (its text names
    /// the table), with the STORE_ERROR reason; the log keeps the text (`Display`).
    #[test]
    fn a_store_error_sends_a_fixed_message() {
        let conn = rusqlite::Connection::open_in_memory().expect("sqlite");
        let e = conn
            .execute("INSERT INTO secret_table_name VALUES (1)", [])
            .unwrap_err();
        let e = Error::Store(e);
        assert!(e.to_string().contains("secret_table_name"), "{e}");
        let s: tonic::Status = e.into();
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(s.message(), STORE_MESSAGE);
        assert_eq!(
            s.get_error_details().error_info().expect("info").reason,
            "STORE_ERROR"
        );
    }

    /// A panicked task names the task to the client, not the panic's message.
    #[tokio::test]
    async fn a_failed_task_hides_the_panic_message() {
        let join = tokio::spawn(async { panic!("secret panic text") })
            .await
            .unwrap_err();
        let e = Error::TaskFailed {
            task: "commit",
            source: join,
        };
        assert!(e.to_string().contains("secret panic text"), "{e}");
        let s: tonic::Status = e.into();
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(
            s.message(),
            "internal: the commit task failed; vallumd's log says why"
        );
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
        // The request's etag is echoed cut.
        let long: tonic::Status = Error::EtagMismatch {
            name: "rulesets/a".into(),
            given: "e".repeat(10_000),
            current: "y".into(),
        }
        .into();
        assert!(long.message().len() < 200, "{}", long.message());
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
