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
//! | [`EXIT_USAGE`] 2 | the command line is wrong (clap's code for bad flags); no call was made |
//! | [`EXIT_UNAVAILABLE`] 3 | the server is unreachable, loading or stopping, the deadline passed or the connection broke |
//!
//! [`ClientReason`] holds the rows of failures `vallumctl` finds itself (no answer from the
//! server, so no `ErrorInfo`), and [`status_exit_code`] maps a status without a known reason;
//! together with [`Reason`] they are the whole exit-code mapping.
//!
//! The table is one list in the `reasons!` invocation below: adding a reason is one row
//! there, which declares the variant, puts it in [`Reason::ALL`] and gives its
//! [`Reason::info`].
//!
//! [`Error`]'s `Display` is the human message;
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

/// Declares [`Reason`], [`Reason::ALL`] and [`Reason::info`] from one list, so a row is
/// added in one place: `/// doc` then `Variant => ("NAME", tonic::Code variant, exit code),`.
macro_rules! reasons {
    ($(
        $(#[doc = $doc:literal])+
        $variant:ident => ($name:literal, $code:ident, $exit:expr),
    )+) => {
        /// The table of error codes: one row per reason.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl Reason {
            /// Every reason, in table order.
            pub const ALL: [Reason; [$(stringify!($variant)),+].len()] = [$(Reason::$variant),+];

            /// This reason's row of the table.
            pub const fn info(self) -> ReasonInfo {
                match self {
                    $(Reason::$variant => ReasonInfo {
                        name: $name,
                        code: tonic::Code::$code,
                        exit_code: $exit,
                    },)+
                }
            }
        }
    };
}

reasons! {
    /// A request field is missing or malformed (names, durations, packets).
    InvalidArgument => ("INVALID_ARGUMENT", InvalidArgument, EXIT_REJECTED),
    /// The ruleset text or structure does not parse or does not validate.
    InvalidRuleset => ("INVALID_RULESET", InvalidArgument, EXIT_REJECTED),
    /// The ruleset uses an extension the engine does not enforce in filter/raw.
    UnsupportedExtension => ("UNSUPPORTED_EXTENSION", InvalidArgument, EXIT_REJECTED),
    /// A warning: rules of a chain that only hooks this node's packet path never evaluates
    /// reach (see `steering`); the ruleset is accepted.
    HookNotReached => ("HOOK_NOT_REACHED", InvalidArgument, EXIT_REJECTED),
    /// The ruleset relies on state outside the text (iptables-restore `--noflush` input).
    NoflushUnsupported => ("NOFLUSH_UNSUPPORTED", InvalidArgument, EXIT_REJECTED),
    /// A capture that cannot be read.
    BadCapture => ("BAD_CAPTURE", InvalidArgument, EXIT_REJECTED),
    /// The named ruleset or revision does not exist.
    NotFound => ("NOT_FOUND", NotFound, EXIT_REJECTED),
    /// The request's etag differs from the stored one.
    EtagMismatch => ("ETAG_MISMATCH", FailedPrecondition, EXIT_REJECTED),
    /// The resource is not in a state that allows the call (e.g. confirming a commit that
    /// is not pending).
    FailedPrecondition => ("FAILED_PRECONDITION", FailedPrecondition, EXIT_REJECTED),
    /// The server is still loading its stored state.
    NotReady => ("NOT_READY", Unavailable, EXIT_UNAVAILABLE),
    /// The engine refused a commit that passed validation.
    CommitFailed => ("COMMIT_FAILED", Internal, EXIT_REJECTED),
    /// The store failed (I/O, corruption, migration).
    Store => ("STORE_ERROR", Internal, EXIT_REJECTED),
    /// A bug or an unexpected condition.
    Internal => ("INTERNAL", Internal, EXIT_REJECTED),
    /// No bearer token in the request (auth layer).
    TokenMissing => ("TOKEN_MISSING", Unauthenticated, EXIT_REJECTED),
    /// The bearer token is not configured (auth layer).
    TokenInvalid => ("TOKEN_INVALID", Unauthenticated, EXIT_REJECTED),
    /// A read-only token called a method that needs an admin token (auth layer).
    AdminRequired => ("ADMIN_REQUIRED", PermissionDenied, EXIT_REJECTED),
    /// The request message is larger than `--max-request-bytes` (limits layer).
    RequestTooLarge => ("REQUEST_TOO_LARGE", ResourceExhausted, EXIT_REJECTED),
    /// The ruleset has more rules than `--max-rules`.
    TooManyRules => ("TOO_MANY_RULES", ResourceExhausted, EXIT_REJECTED),
    /// The ruleset has more chains than `--max-chains`.
    TooManyChains => ("TOO_MANY_CHAINS", ResourceExhausted, EXIT_REJECTED),
    /// Creating a set would exceed `--max-sets`.
    TooManySets => ("TOO_MANY_SETS", ResourceExhausted, EXIT_REJECTED),
    /// A set's `maxelem` is above `--max-set-elements`.
    SetTooLarge => ("SET_TOO_LARGE", ResourceExhausted, EXIT_REJECTED),
    /// Creating the ruleset would exceed `--max-rulesets`.
    TooManyRulesets => ("TOO_MANY_RULESETS", ResourceExhausted, EXIT_REJECTED),
    /// The server is stopping.
    ShuttingDown => ("SHUTTING_DOWN", Unavailable, EXIT_UNAVAILABLE),
    /// The set (or set element) to create or add exists already (as ipset without `-exist`).
    AlreadyExists => ("ALREADY_EXISTS", AlreadyExists, EXIT_REJECTED),
    /// Adding would exceed the set's `maxelem` (as ipset: "Hash is full").
    SetFull => ("SET_FULL", ResourceExhausted, EXIT_REJECTED),
    /// A stored active revision did not load at start (the audit outcome of the `Load`
    /// record, and vallumd's exit code under `--on-load-failure refuse`).
    ActiveRevisionNotLoaded => ("ACTIVE_REVISION_NOT_LOADED", FailedPrecondition, EXIT_REJECTED),
    /// An Apply/Stage of an empty ruleset without `allow_empty` (see
    /// [`crate::content::Checked::is_empty`]).
    EmptyRuleset => ("EMPTY_RULESET", InvalidArgument, EXIT_REJECTED),
    /// Fleet mode: etcd cannot be reached or refused the request.
    FleetUnavailable => ("FLEET_UNAVAILABLE", Unavailable, EXIT_UNAVAILABLE),
    /// Fleet mode: the ruleset is owned by the fleet; change it with FleetService.
    FleetOwned => ("FLEET_OWNED", FailedPrecondition, EXIT_REJECTED),
}

impl Reason {
    /// The reason whose UPPER_SNAKE name is `name` (for clients reading `ErrorInfo`).
    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.info().name == name)
    }
}

/// The exit code of `vallumctl` for a status it received: the row of its `ErrorInfo.reason` when
/// that is a [`Reason`] (so `NOT_READY` and `SHUTTING_DOWN` exit 3 whatever the gRPC code);
/// otherwise (another server, a proxy) by the gRPC code: UNAVAILABLE and DEADLINE_EXCEEDED exit
/// [`EXIT_UNAVAILABLE`], OK [`EXIT_OK`], every other code [`EXIT_REJECTED`]. Failures the client
/// finds itself (tonic's own statuses) are [`ClientReason`]s, classified before this is asked.
pub fn status_exit_code(code: tonic::Code, reason: Option<&str>) -> u8 {
    use tonic::Code;
    if code == Code::Ok {
        return EXIT_OK;
    }
    if let Some(r) = reason.and_then(Reason::from_name) {
        return r.info().exit_code;
    }
    match code {
        Code::Ok => EXIT_OK,
        Code::Unavailable | Code::DeadlineExceeded => EXIT_UNAVAILABLE,
        Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::OutOfRange
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Cancelled
        | Code::Unimplemented
        | Code::Internal
        | Code::Unknown
        | Code::DataLoss => EXIT_REJECTED,
    }
}

// === impl ClientReason ===

/// The client-side rows of the table: failures that `vallumctl` finds itself, with no answer
/// from the server. vallumd never sends these names; `vallumctl -o json` prints them as
/// `reason`, and each row gives the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientReason {
    /// The command line is wrong and no call was made: clap's usage errors (unknown command or
    /// flag, a value that does not parse), a malformed revision name or `--server` URL, a
    /// `--token` that is not printable ASCII, `--cert` without `--key`.
    Usage,
    /// A local step failed: a ruleset, capture or TLS file cannot be read or is not PEM,
    /// stdout cannot be written, an iptables program (`dataplane`) failed.
    Local,
    /// The server cannot be reached: connection refused, no route, a TLS handshake that failed
    /// (`https://` against a plaintext server included).
    Unreachable,
    /// The call's deadline (`--timeout`) passed before the answer came (tonic reports this as
    /// CANCELLED `Timeout expired`; gRPC's name for it is DEADLINE_EXCEEDED).
    DeadlineExceeded,
    /// The connection broke during the call (the server was killed, the peer reset it); a
    /// change may or may not have been made.
    ConnectionLost,
}

/// One client-side row.
#[derive(Clone, Copy, Debug)]
pub struct ClientReasonInfo {
    /// UPPER_SNAKE name, as `vallumctl -o json` prints it in `reason`.
    pub name: &'static str,
    /// The gRPC code `vallumctl -o json` prints in `code`; `None` when no call was made.
    pub code: Option<tonic::Code>,
    /// The process exit code of `vallumctl`.
    pub exit_code: u8,
}

impl ClientReason {
    /// Every client-side reason, in table order.
    pub const ALL: [ClientReason; 5] = [
        ClientReason::Usage,
        ClientReason::Local,
        ClientReason::Unreachable,
        ClientReason::DeadlineExceeded,
        ClientReason::ConnectionLost,
    ];

    /// This reason's row.
    pub const fn info(self) -> ClientReasonInfo {
        use tonic::Code;
        let (name, code, exit_code) = match self {
            ClientReason::Usage => ("USAGE", None, EXIT_USAGE),
            ClientReason::Local => ("LOCAL_ERROR", None, EXIT_REJECTED),
            ClientReason::Unreachable => ("UNREACHABLE", Some(Code::Unavailable), EXIT_UNAVAILABLE),
            ClientReason::DeadlineExceeded => (
                "DEADLINE_EXCEEDED",
                Some(Code::DeadlineExceeded),
                EXIT_UNAVAILABLE,
            ),
            ClientReason::ConnectionLost => {
                ("CONNECTION_LOST", Some(Code::Unavailable), EXIT_UNAVAILABLE)
            }
        };
        ClientReasonInfo {
            name,
            code,
            exit_code,
        }
    }
}

impl std::fmt::Display for ClientReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.info().name)
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
    /// (see server/src/store/migrate.rs).
    #[error("store migration: {0}")]
    Migrate(String),
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
    /// Fleet mode: etcd cannot be reached, or refused the request (see [`crate::fleet`]).
    #[error("fleet: {0}")]
    Fleet(String),
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
            Error::Store(_) | Error::Migrate(_) => Reason::Store,
            Error::Limit(l) => l.reason(),
            Error::Startup { .. } | Error::Internal(_) => Reason::Internal,
            Error::Fleet(_) => Reason::FleetUnavailable,
            Error::FleetOwned { .. } => Reason::FleetOwned,
        }
    }
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
        let message = cut(&e.to_string(), MAX_MESSAGE_BYTES);
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
                if let crate::limits::LimitError::TooManyRules { .. }
                | crate::limits::LimitError::TooManyChains { .. } = l
                {
                    details.add_bad_request_violation("source", message.clone());
                }
            }
            Error::FleetOwned { ruleset, .. } => {
                details.add_precondition_failure_violation(
                    "FLEET_OWNED",
                    format!("rulesets/{ruleset}"),
                    message.clone(),
                );
            }
            Error::NotFound { .. }
            | Error::Fleet(_)
            | Error::NotReady
            | Error::Commit(_)
            | Error::Store(_)
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

    #[test]
    fn client_rows_do_not_clash_with_server_rows() {
        for c in ClientReason::ALL {
            let info = c.info();
            assert_eq!(Reason::from_name(info.name), None, "{}", info.name);
            // Usage errors make no call; every failure to get an answer is a 3.
            let expected = match info.code {
                None if c == ClientReason::Usage => EXIT_USAGE,
                None => EXIT_REJECTED,
                Some(_) => EXIT_UNAVAILABLE,
            };
            assert_eq!(info.exit_code, expected, "{}", info.name);
        }
    }

    #[test]
    fn status_exit_codes() {
        use tonic::Code;
        assert_eq!(status_exit_code(Code::InvalidArgument, None), 1);
        assert_eq!(
            status_exit_code(Code::Unauthenticated, Some("TOKEN_MISSING")),
            1
        );
        assert_eq!(status_exit_code(Code::Unavailable, None), 3);
        assert_eq!(status_exit_code(Code::DeadlineExceeded, None), 3);
        assert_eq!(status_exit_code(Code::Internal, Some("SHUTTING_DOWN")), 3);
        assert_eq!(status_exit_code(Code::Internal, Some("NOT_READY")), 3);
        assert_eq!(
            status_exit_code(Code::InvalidArgument, Some("INVALID_RULESET")),
            1
        );
        assert_eq!(
            status_exit_code(Code::Unavailable, Some("SOMETHING_ELSE")),
            3
        );
        assert_eq!(status_exit_code(Code::Cancelled, None), 1);
        assert_eq!(status_exit_code(Code::Ok, None), 0);
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
