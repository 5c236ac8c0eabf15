//! vallumctl's errors and exit codes.
//!
//! The exit codes and the reason -> exit code mapping are the server's error table
//! ([`vallum_server::Reason`], see `vallum_server::error`): 0 success, 1 rejected, 2 usage
//! (clap), 3 unavailable. A status whose `ErrorInfo.reason` is a row of that table exits with
//! that row's code (so `NOT_READY` and `SHUTTING_DOWN` exit 3 whatever the gRPC code); a status
//! without a known reason (another server, tonic's own errors) is mapped by its gRPC code:
//! UNAVAILABLE and DEADLINE_EXCEEDED exit 3, every other failure 1. Connection refused and TLS
//! handshake failures exit 3.

use std::path::PathBuf;

use tonic::Code;
use tonic_types::StatusExt;
use vallum_server::Reason;
pub use vallum_server::error::{EXIT_OK, EXIT_REJECTED, EXIT_UNAVAILABLE, EXIT_USAGE};

/// The exit code for a gRPC status code and ErrorInfo reason.
pub fn exit_code(code: Code, reason: Option<&str>) -> u8 {
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

/// What went wrong in a vallumctl run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A local file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An argument is well-formed for clap but not for us (e.g. a revision name).
    #[error("{0}")]
    Argument(String),
    /// The server could not be reached (connect, TLS).
    #[error("cannot connect to {server}: {message}")]
    Connect {
        /// The server URL.
        server: String,
        /// The cause chain.
        message: String,
    },
    /// TLS flags are wrong.
    #[error(transparent)]
    Tls(#[from] vallum_server::tls::TlsError),
    /// The server answered with an error.
    #[error("{}", status_line(.status))]
    Status {
        /// The status.
        status: tonic::Status,
        /// The local file the request was about, for `FILE:LINE:COL` lines.
        file: Option<PathBuf>,
    },
    /// `validate` found errors (already printed).
    #[error("ruleset is invalid")]
    Invalid,
    /// Output could not be written or encoded.
    #[error("output: {0}")]
    Output(String),
    /// `dataplane install|uninstall`: an iptables program could not run or failed.
    #[error("dataplane: {0}")]
    Dataplane(String),
}

impl CliError {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Read { .. } | CliError::Argument(_) | CliError::Tls(_) => EXIT_REJECTED,
            CliError::Invalid | CliError::Output(_) | CliError::Dataplane(_) => EXIT_REJECTED,
            CliError::Connect { .. } => EXIT_UNAVAILABLE,
            CliError::Status { status, .. } => exit_code(
                status.code(),
                status.get_details_error_info().map(|i| i.reason).as_deref(),
            ),
        }
    }
}

impl From<tonic::Status> for CliError {
    fn from(status: tonic::Status) -> CliError {
        CliError::Status { status, file: None }
    }
}

/// `CODE (REASON): message`, e.g. `INVALID_ARGUMENT (PARSE_ERROR): 2 errors`.
pub fn status_line(s: &tonic::Status) -> String {
    let code = code_name(s.code());
    match s.get_details_error_info() {
        Some(info) if !info.reason.is_empty() => {
            format!("{code} ({}): {}", info.reason, s.message())
        }
        _ => format!("{code}: {}", s.message()),
    }
}

/// The UPPER_SNAKE name of a gRPC code.
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Rewrites a location-prefixed message for the local file `path`: `LINE:COL: msg` becomes
/// `PATH:LINE:COL: msg`, `OTHER:LINE:COL: msg` (the name the server saw) becomes
/// `PATH:LINE:COL: msg`, anything else `PATH: msg`.
pub fn localize(message: &str, path: &str) -> String {
    if starts_with_line_col(message) {
        return format!("{path}:{message}");
    }
    // FILE:LINE:COL: with FILE free of whitespace: find the first `:` followed by LINE:COL:.
    for (i, _) in message.match_indices(':') {
        let (file, rest) = message.split_at(i);
        if file.contains(char::is_whitespace) {
            break;
        }
        if starts_with_line_col(&rest[1..]) {
            return format!("{path}{rest}");
        }
    }
    format!("{path}: {message}")
}

/// Whether `s` starts with `DIGITS:DIGITS:`.
fn starts_with_line_col(s: &str) -> bool {
    let mut parts = s.splitn(3, ':');
    let (Some(line), Some(col), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    digits(line) && digits(col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localizes() {
        assert_eq!(localize("3:7: bad", "r.rules"), "r.rules:3:7: bad");
        assert_eq!(
            localize("<request>:3:7: bad", "r.rules"),
            "r.rules:3:7: bad"
        );
        assert_eq!(localize("/tmp/x:3:7: bad", "r.rules"), "r.rules:3:7: bad");
        assert_eq!(localize("no location: here", "r"), "r: no location: here");
        assert_eq!(localize("a b:3:7: x", "r"), "r: a b:3:7: x");
    }

    #[test]
    fn codes() {
        assert_eq!(exit_code(Code::InvalidArgument, None), 1);
        assert_eq!(exit_code(Code::Unauthenticated, Some("TOKEN_MISSING")), 1);
        assert_eq!(exit_code(Code::Unavailable, None), 3);
        assert_eq!(exit_code(Code::DeadlineExceeded, None), 3);
        assert_eq!(exit_code(Code::Internal, Some("SHUTTING_DOWN")), 3);
        assert_eq!(exit_code(Code::Internal, Some("NOT_READY")), 3);
        assert_eq!(exit_code(Code::Unavailable, Some("NOT_READY")), 3);
        assert_eq!(exit_code(Code::InvalidArgument, Some("INVALID_RULESET")), 1);
        assert_eq!(exit_code(Code::PermissionDenied, Some("ADMIN_REQUIRED")), 1);
        assert_eq!(exit_code(Code::Unavailable, Some("SOMETHING_ELSE")), 3);
        assert_eq!(exit_code(Code::Ok, None), 0);
    }
}
