//! vallumctl's errors, exit codes and error reports.
//!
//! The exit codes are classes (0 ok, 1 rejected, 2 usage, 3 unavailable) and the whole mapping
//! is the error table both sides read, `vallum_api::reason`: a status whose `ErrorInfo.reason` is a
//! row of [`Reason`] exits with that row's code (so `NOT_READY` and
//! `SHUTTING_DOWN` exit 3 whatever the gRPC code); a failure vallumctl finds itself is a row of
//! [`ClientReason`] (usage 2, local 1, unreachable, deadline and lost connection 3); a status
//! without a known reason (another server, a proxy) goes by its gRPC code
//! ([`status_exit_code`]).
//!
//! A status made by tonic in the client (a deadline, a broken connection) carries the error it
//! came from as its `source`; a status the server sent carries none. [`made_in_client`] reads that
//! source to find the [`ClientReason`].
//!
//! [`CliError::report`] prints each fact once: the status line drops a reason equal to the code
//! and the `REASON: ` prefix vallumd puts on its messages, and a field violation printed on its
//! own line is not repeated in the status line.

use std::error::Error as StdError;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;
use vallum_api::Reason;
pub use vallum_api::reason::{ClientReason, EXIT_OK, status_exit_code};
use vallum_api::tls::TlsError;

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
    /// A local file is larger than `--max-file-bytes`; nothing was sent.
    #[error(
        "{path}: {} more than --max-file-bytes ({limit} bytes); nothing was sent (vallumd \
         refuses requests over its --max-request-bytes too)",
        size_words(.size)
    )]
    TooLarge {
        /// The file (`<stdin>` for `-`).
        path: PathBuf,
        /// Its size when known before reading (a regular file).
        size: Option<u64>,
        /// `--max-file-bytes`.
        limit: u64,
    },
    /// An argument is well-formed for clap but not for us (e.g. a revision name); no call was
    /// made.
    #[error("{0}")]
    Argument(String),
    /// The server could not be reached (connect, TLS handshake).
    #[error("cannot connect to {server}: {message}")]
    Connect {
        /// The server URL.
        server: String,
        /// What went wrong (the cause chain, each cause once, or what to do instead).
        message: String,
    },
    /// TLS flags are wrong.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The call failed: the server answered with an error, or tonic made the status in the
    /// client (see [`made_in_client`]).
    #[error("{}", status_line(.status, &[]))]
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
    /// `apply --shadow-for`: the shadow saw more changed flows than allowed, or ended early;
    /// nothing was committed.
    #[error("{0}")]
    ShadowRefused(String),
}

/// `"N bytes,"` for a size known before reading, else `"it holds"` ([`CliError::TooLarge`]).
fn size_words(size: &Option<u64>) -> String {
    match size {
        Some(n) => format!("{n} bytes,"),
        None => "it holds".to_owned(),
    }
}

/// Where the failed call went, for messages about failures in the client.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// `--server`.
    pub server: &'a str,
    /// `--timeout`, when the call had one (not `watch`).
    pub timeout: Option<Duration>,
    /// Whether the command changes state (so a lost connection leaves its outcome unknown).
    pub changes: bool,
}

/// What is printed for an error: detail lines, then the headline.
#[derive(Debug, PartialEq)]
pub struct Report {
    /// Every violation, one line each (`FILE:LINE:COL: message` when the error is about a
    /// local file); `-o json` lists them all.
    pub violations: Vec<String>,
    /// The violations text output prints before the headline: all of them, or none when the
    /// headline already says the only one.
    pub lines: Vec<String>,
    /// The error in one line (`CODE (REASON): message` for a status).
    pub headline: String,
    /// The gRPC code, for statuses and failures of a call.
    pub code: Option<&'static str>,
    /// The `ErrorInfo.reason` or the [`ClientReason`] name.
    pub reason: Option<String>,
    /// The process exit code.
    pub exit_code: u8,
}

impl Report {
    /// The report as the `-o json` error object: `{"error", "exit_code", "violations", "code"?,
    /// "reason"?}`.
    pub fn json(&self) -> Value {
        let mut j = json!({
            "error": self.headline,
            "exit_code": self.exit_code,
            "violations": self.violations,
        });
        if let Some(c) = self.code {
            j["code"] = json!(c);
        }
        if let Some(r) = &self.reason {
            j["reason"] = json!(r);
        }
        j
    }
}

impl CliError {
    /// The client-side row of the table this error is; `None` for a status the server sent
    /// and for [`CliError::Invalid`] (the server's `INVALID_RULESET`).
    pub fn client_reason(&self) -> Option<ClientReason> {
        match self {
            CliError::Argument(_)
            | CliError::Tls(TlsError::Incomplete { .. } | TlsError::ClientCaWithoutTls) => {
                Some(ClientReason::Usage)
            }
            CliError::Read { .. }
            | CliError::TooLarge { .. }
            | CliError::Tls(TlsError::Read { .. } | TlsError::NotPem { .. })
            | CliError::Output(_)
            | CliError::Dataplane(_) => Some(ClientReason::Local),
            CliError::Connect { .. } => Some(ClientReason::Unreachable),
            CliError::ShadowRefused(_) => Some(ClientReason::ShadowLimit),
            CliError::Invalid => None,
            CliError::Status { status, .. } => made_in_client(status),
        }
    }

    /// The row name: the [`ClientReason`], else the status's `ErrorInfo.reason`.
    fn reason(&self) -> Option<String> {
        if let Some(c) = self.client_reason() {
            return Some(c.to_string());
        }
        match self {
            CliError::Status { status, .. } => status.get_details_error_info().map(|i| i.reason),
            _ => Some(Reason::InvalidRuleset.to_string()),
        }
    }

    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        if let Some(c) = self.client_reason() {
            return c.info().exit_code;
        }
        match self {
            CliError::Status { status, .. } => status_exit_code(
                status.code(),
                status.get_details_error_info().map(|i| i.reason).as_deref(),
            ),
            _ => Reason::InvalidRuleset.info().exit_code,
        }
    }

    /// What to print for this error.
    pub fn report(&self, cx: Context<'_>) -> Report {
        let reason = self.reason();
        let exit_code = self.exit_code();
        let CliError::Status { status, file } = self else {
            return Report {
                violations: Vec::new(),
                lines: Vec::new(),
                headline: self.to_string(),
                code: self
                    .client_reason()
                    .and_then(|c| c.info().code)
                    .map(code_name),
                reason,
                exit_code,
            };
        };
        if let Some(c) = made_in_client(status) {
            return Report {
                violations: Vec::new(),
                lines: Vec::new(),
                headline: client_headline(c, status, cx),
                code: c.info().code.map(code_name),
                reason,
                exit_code,
            };
        }
        let (violations, descriptions) = detail_lines(status, file.as_ref());
        // One violation the message already says, about no local file: the headline is enough.
        let said = violations.len() == 1
            && file.is_none()
            && strip_reason(status).contains(descriptions[0].as_str());
        let (lines, printed) = if said {
            (Vec::new(), Vec::new())
        } else {
            (violations.clone(), descriptions)
        };
        Report {
            headline: status_line(status, &printed),
            violations,
            lines,
            code: Some(code_name(status.code())),
            reason,
            exit_code,
        }
    }
}

impl From<tonic::Status> for CliError {
    fn from(status: tonic::Status) -> CliError {
        CliError::Status { status, file: None }
    }
}

/// The failure in the client behind a status tonic made itself, read from its source chain:
/// tonic's `TimeoutExpired` (the `--timeout` deadline), tonic's `ConnectError` (a reconnect
/// failed), or hyper/h2/io errors that mean the connection broke. `None` for a status the
/// server sent (it has no source) and for client-side errors that are the server's doing (an
/// h2 protocol error, oversized headers), which go by their gRPC code.
pub fn made_in_client(status: &tonic::Status) -> Option<ClientReason> {
    let first = StdError::source(status)?;
    for e in causes(first) {
        if e.is::<tonic::TimeoutExpired>() {
            return Some(ClientReason::DeadlineExceeded);
        }
        if e.is::<tonic::ConnectError>() {
            return Some(ClientReason::Unreachable);
        }
        if let Some(h) = e.downcast_ref::<h2::Error>() {
            if h.is_io() || (h.is_go_away() && h.is_remote()) {
                return Some(ClientReason::ConnectionLost);
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_closed() || h.is_incomplete_message() || h.is_canceled() {
                return Some(ClientReason::ConnectionLost);
            }
        }
        if e.is::<std::io::Error>() {
            return Some(ClientReason::ConnectionLost);
        }
    }
    None
}

/// Whether a failed call may have met a TLS server over plaintext: the connection broke, or our
/// h2 gave up on the answer (a GOAWAY of our own with PROTOCOL_ERROR or FRAME_SIZE_ERROR: the
/// bytes back were not HTTP/2, e.g. a TLS alert). Which of the two a TLS server causes is a race.
pub fn maybe_tls_peer(e: &CliError) -> bool {
    let CliError::Status { status, .. } = e else {
        return false;
    };
    if made_in_client(status) == Some(ClientReason::ConnectionLost) {
        return true;
    }
    let Some(first) = StdError::source(status) else {
        return false;
    };
    causes(first).any(|c| {
        c.downcast_ref::<h2::Error>().is_some_and(|h| {
            h.is_go_away()
                && h.is_library()
                && matches!(
                    h.reason(),
                    Some(h2::Reason::PROTOCOL_ERROR | h2::Reason::FRAME_SIZE_ERROR)
                )
        })
    })
}

/// The HTTP status of an answer that was not gRPC: tonic's status for a response without
/// `grpc-status` ("grpc-status header missing, mapped from HTTP status code N"), which an HTTP
/// server that is not a gRPC one gives (vallumd's metrics port answers a gRPC call with 404).
/// `None` for every other error.
pub fn http_not_grpc(e: &CliError) -> Option<u16> {
    let CliError::Status { status, .. } = e else {
        return None;
    };
    status
        .message()
        .strip_prefix("grpc-status header missing, mapped from HTTP status code ")?
        .trim()
        .parse()
        .ok()
}

/// Whether a TLS connect attempt got a TLS answer: it succeeded, or rustls failed on something
/// other than the message format (a certificate we do not trust, an alert).
pub fn tls_answered(result: Result<(), &(dyn StdError + 'static)>) -> bool {
    match result {
        Ok(()) => true,
        Err(e) => causes(e).any(|c| {
            c.downcast_ref::<rustls::Error>()
                .is_some_and(|r| !matches!(r, rustls::Error::InvalidMessage(_)))
        }),
    }
}

/// The headline of a failure in the client.
fn client_headline(c: ClientReason, status: &tonic::Status, cx: Context<'_>) -> String {
    let server = cx.server;
    let detail = status_chain(status);
    match c {
        ClientReason::DeadlineExceeded => match cx.timeout {
            Some(t) => format!(
                "DEADLINE_EXCEEDED: no answer from {server} within {} (--timeout)",
                friendly(t)
            ),
            None => format!("DEADLINE_EXCEEDED: no answer from {server} in time"),
        },
        ClientReason::ConnectionLost => format!(
            "UNAVAILABLE (CONNECTION_LOST): the connection to {server} broke during the call \
             ({detail}){}",
            if cx.changes {
                "; the change may or may not have been made"
            } else {
                ""
            }
        ),
        ClientReason::Unreachable => format!("cannot connect to {server}: {detail}"),
        ClientReason::Usage | ClientReason::Local | ClientReason::ShadowLimit => detail,
    }
}

/// A duration as `200ms`, `30s`, `1m 30s`.
pub fn friendly(d: Duration) -> String {
    match jiff::SignedDuration::try_from(d) {
        Ok(d) => format!("{d:#}"),
        Err(_) => format!("{d:?}"),
    }
}

/// A status's message and then its source chain, each cause once.
fn status_chain(status: &tonic::Status) -> String {
    let mut parts = vec![status.message().to_owned()];
    if let Some(first) = StdError::source(status) {
        parts.extend(causes(first).map(|e| e.to_string()));
    }
    join_once(parts)
}

/// An error and its causes, joined with `: `, each once (see [`join_once`]).
pub fn chain(e: &(dyn StdError + 'static)) -> String {
    join_once(causes(e).map(|e| e.to_string()))
}

/// Joins messages with `: `, leaving out one that an earlier part already says (hyper, tonic
/// and io errors repeat their cause's text: `tcp connect error: tcp connect error`), empty ones,
/// and tonic's bare `transport error` wrapper when a cause follows.
fn join_once(parts: impl IntoIterator<Item = String>) -> String {
    let mut kept: Vec<String> = Vec::new();
    for p in parts {
        if p.is_empty() || kept.iter().any(|k| k.contains(p.as_str())) {
            continue;
        }
        kept.push(p);
    }
    if kept.len() > 1 && kept[0] == "transport error" {
        kept.remove(0);
    }
    kept.join(": ")
}

/// `e` and its causes. An `io::Error` wrapping another error is followed into that error
/// (`io::Error::source` skips it, and rustls' errors arrive that way).
fn causes<'a>(
    e: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(e), |&e: &&'a (dyn StdError + 'static)| match e
        .downcast_ref::<std::io::Error>()
    {
        Some(io) => match io.get_ref() {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => io.source(),
        },
        None => e.source(),
    })
}

/// Whether a connect error is a plaintext answer to our TLS handshake (rustls: "received
/// corrupt message of type InvalidContentType": the first bytes back are not a TLS record).
pub fn is_plaintext_answer(e: &(dyn StdError + 'static)) -> bool {
    causes(e).any(|c| {
        matches!(
            c.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))
        )
    })
}

/// The detail lines of a status (BadRequest and PreconditionFailure violations) and the
/// descriptions they carry.
fn detail_lines(status: &tonic::Status, file: Option<&PathBuf>) -> (Vec<String>, Vec<String>) {
    let details = status.get_error_details();
    let mut lines = Vec::new();
    let mut descriptions = Vec::new();
    if let Some(br) = details.bad_request() {
        for v in &br.field_violations {
            lines.push(match file {
                Some(f) => localize(&v.description, &f.display().to_string()),
                None if v.field.is_empty() => v.description.clone(),
                None => format!("{}: {}", v.field, v.description),
            });
            descriptions.push(v.description.clone());
        }
    }
    if let Some(pf) = details.precondition_failure() {
        for v in &pf.violations {
            lines.push(format!(
                "precondition {} {}: {}",
                v.r#type, v.subject, v.description
            ));
            descriptions.push(v.description.clone());
        }
    }
    (lines, descriptions)
}

/// The message without the `REASON: ` prefix vallumd's messages start with.
fn strip_reason(s: &tonic::Status) -> &str {
    let m = s.message();
    match s.get_details_error_info() {
        Some(info) if !info.reason.is_empty() => m
            .strip_prefix(info.reason.as_str())
            .and_then(|r| r.strip_prefix(": "))
            .unwrap_or(m),
        _ => m,
    }
}

/// `CODE (REASON): message`, e.g. `INVALID_ARGUMENT (PARSE_ERROR): 2 errors`; the reason is
/// left out when it is the code's name. When the message repeats one of `printed` (violations
/// printed on their own lines) it becomes their count.
pub fn status_line(s: &tonic::Status, printed: &[String]) -> String {
    let code = code_name(s.code());
    let mut message = strip_reason(s).to_owned();
    if printed
        .iter()
        .any(|d| !d.is_empty() && message.contains(d.as_str()))
    {
        let n = printed.len();
        message = format!("{n} error{}", if n == 1 { "" } else { "s" });
    }
    match s.get_details_error_info() {
        Some(info) if !info.reason.is_empty() && info.reason != code => {
            format!("{code} ({}): {message}", info.reason)
        }
        _ => format!("{code}: {message}"),
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
    use tonic_types::ErrorDetails;
    use vallum_api::reason::{EXIT_REJECTED, EXIT_UNAVAILABLE, EXIT_USAGE};

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

    fn with_reason(code: Code, reason: &str, message: &str, mut d: ErrorDetails) -> tonic::Status {
        d.set_error_info(reason, "vallum.dev", std::collections::HashMap::new());
        tonic::Status::with_error_details(code, message, d)
    }

    const CX: Context<'static> = Context {
        server: "http://h:1",
        timeout: Some(Duration::from_millis(200)),
        changes: true,
    };

    #[test]
    fn each_fact_once() {
        // vallumd: `REASON: field: description (and N more)` plus the violations.
        let s = with_reason(
            Code::InvalidArgument,
            "INVALID_RULESET",
            "INVALID_RULESET: source.text.content: f:3:1: bad (and 1 more)",
            ErrorDetails::with_bad_request(vec![
                tonic_types::FieldViolation::new("source.text.content", "f:3:1: bad"),
                tonic_types::FieldViolation::new("source.text.content", "f:4:1: worse"),
            ]),
        );
        let r = CliError::Status {
            status: s,
            file: Some("x.rules".into()),
        }
        .report(CX);
        assert_eq!(r.lines, ["x.rules:3:1: bad", "x.rules:4:1: worse"]);
        assert_eq!(r.headline, "INVALID_ARGUMENT (INVALID_RULESET): 2 errors");
        // One violation about no file, and a reason equal to the code: one line.
        let s = with_reason(
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "INVALID_ARGUMENT: name: must not be empty",
            ErrorDetails::with_bad_request_violation("name", "must not be empty"),
        );
        let r = CliError::from(s).report(CX);
        assert!(r.lines.is_empty(), "{r:?}");
        assert_eq!(r.headline, "INVALID_ARGUMENT: name: must not be empty");
        // JSON still lists it.
        assert_eq!(r.json()["violations"][0], "name: must not be empty");
        let s = with_reason(
            Code::NotFound,
            "NOT_FOUND",
            "ruleset rulesets/web not found",
            ErrorDetails::new(),
        );
        assert_eq!(
            CliError::from(s).report(CX).headline,
            "NOT_FOUND: ruleset rulesets/web not found"
        );
        // PreconditionFailure: the message says it.
        let mut d = ErrorDetails::new();
        d.add_precondition_failure_violation(
            "REVISION_STATE",
            "rulesets/w/revisions/1",
            "not pending",
        );
        let s = with_reason(
            Code::FailedPrecondition,
            "FAILED_PRECONDITION",
            "rulesets/w/revisions/1: not pending",
            d,
        );
        let r = CliError::from(s).report(CX);
        assert!(r.lines.is_empty(), "{r:?}");
        assert_eq!(
            r.headline,
            "FAILED_PRECONDITION: rulesets/w/revisions/1: not pending"
        );
    }

    #[test]
    fn joins_causes_once() {
        let parts = [
            "transport error",
            "tcp connect error",
            "tcp connect error",
            "Connection refused (os error 111)",
        ];
        assert_eq!(
            join_once(parts.map(String::from)),
            "tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(join_once(["a: b".into(), "b".into()]), "a: b");
        assert_eq!(join_once(["transport error".into()]), "transport error");
    }

    #[test]
    fn client_side_statuses() {
        // tonic's own deadline: CANCELLED with a TimeoutExpired source.
        let s = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(s.code(), Code::Cancelled);
        assert_eq!(made_in_client(&s), Some(ClientReason::DeadlineExceeded));
        let e = CliError::from(s);
        assert_eq!(e.exit_code(), EXIT_UNAVAILABLE);
        let r = e.report(CX);
        assert_eq!(
            r.headline,
            "DEADLINE_EXCEEDED: no answer from http://h:1 within 200ms (--timeout)"
        );
        assert_eq!(r.reason.as_deref(), Some("DEADLINE_EXCEEDED"));
        assert_eq!(r.code, Some("DEADLINE_EXCEEDED"));
        // A broken connection.
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stream closed");
        let s = tonic::Status::from_error(Box::new(io));
        assert_eq!(made_in_client(&s), Some(ClientReason::ConnectionLost));
        assert_eq!(CliError::from(s).exit_code(), EXIT_UNAVAILABLE);
        // The same code sent by a server is its business: CANCELLED exits 1.
        let s = tonic::Status::cancelled("Timeout expired");
        assert_eq!(made_in_client(&s), None);
        assert_eq!(CliError::from(s).exit_code(), EXIT_REJECTED);
    }

    #[test]
    fn local_errors() {
        assert_eq!(CliError::Argument("x".into()).exit_code(), EXIT_USAGE);
        assert_eq!(
            CliError::Tls(TlsError::Incomplete {
                given: "--cert",
                missing: "--key"
            })
            .exit_code(),
            EXIT_USAGE
        );
        let read = CliError::Read {
            path: "f".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(read.exit_code(), EXIT_REJECTED);
        assert_eq!(read.report(CX).reason.as_deref(), Some("LOCAL_ERROR"));
        let c = CliError::Connect {
            server: "s".into(),
            message: "m".into(),
        };
        assert_eq!(c.exit_code(), EXIT_UNAVAILABLE);
        assert_eq!(CliError::Invalid.exit_code(), EXIT_REJECTED);
    }
}
