//! The one table of error codes that vallumd sends and vallumctl reads.
//!
//! [`Reason`] is the table: each row gives the UPPER_SNAKE `ErrorInfo.reason`, the gRPC code
//! and the exit code `vallumctl` uses. It holds the reasons of vallumd's services and pipeline
//! and those of the tower layers in front of them (auth: `TOKEN_*`, `ADMIN_REQUIRED`,
//! `SCOPE_DENIED`; limits:
//! `REQUEST_TOO_LARGE`, `TOO_MANY_*`), so `vallumctl` maps every reason it can receive through
//! this one table. vallum-server's `error` module builds gRPC statuses from these rows (with
//! `ErrorInfo` domain [`ERROR_DOMAIN`]); vallumctl reads them back.
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
    /// reach (see vallumd's `steering`), or `--ctstate ESTABLISHED`-style rules where only new
    /// connections are steered (`--steered-new-only`); the ruleset is accepted.
    HookNotReached => ("HOOK_NOT_REACHED", InvalidArgument, EXIT_REJECTED),
    /// A warning: `-m string` rules on a node whose packet source keeps no packet bytes
    /// (pcap replay, synthetic), where they never see a payload; the ruleset is accepted.
    NoPacketBytes => ("NO_PACKET_BYTES", InvalidArgument, EXIT_REJECTED),
    /// A warning: a filter or raw rule waits for what the ruleset's stored-only nat or mangle
    /// table does (`--ctstate DNAT`, `--ctorigdst`, `-m mark` after its MARK), and vallumd
    /// does not hand that table to the kernel (`--kernel-tables`); the ruleset is accepted.
    WaitsForTable => ("WAITS_FOR_TABLE", InvalidArgument, EXIT_REJECTED),
    /// The ruleset relies on state outside the text (iptables-restore `--noflush` input).
    NoflushUnsupported => ("NOFLUSH_UNSUPPORTED", InvalidArgument, EXIT_REJECTED),
    /// A capture that cannot be read.
    BadCapture => ("BAD_CAPTURE", InvalidArgument, EXIT_REJECTED),
    /// The named ruleset or revision does not exist.
    NotFound => ("NOT_FOUND", NotFound, EXIT_REJECTED),
    /// The request's etag differs from the stored one.
    EtagMismatch => ("ETAG_MISMATCH", FailedPrecondition, EXIT_REJECTED),
    /// A `request_id` already used with a different request (the ids are for retries of
    /// the same request, as Stripe's idempotency keys).
    IdempotencyKeyReused => ("IDEMPOTENCY_KEY_REUSED", InvalidArgument, EXIT_REJECTED),
    /// The resource is not in a state that allows the call (e.g. confirming a commit that
    /// is not pending).
    FailedPrecondition => ("FAILED_PRECONDITION", FailedPrecondition, EXIT_REJECTED),
    /// The server is still loading its stored state.
    NotReady => ("NOT_READY", Unavailable, EXIT_UNAVAILABLE),
    /// The engine refused a commit that passed validation.
    CommitFailed => ("COMMIT_FAILED", Internal, EXIT_REJECTED),
    /// The store failed (I/O, corruption, migration).
    Store => ("STORE_ERROR", Internal, EXIT_REJECTED),
    /// The store's disk is full (SQLite's SQLITE_FULL): nothing was changed; the call may
    /// succeed once space is freed.
    StoreFull => ("STORE_FULL", ResourceExhausted, EXIT_REJECTED),
    /// A bug or an unexpected condition.
    Internal => ("INTERNAL", Internal, EXIT_REJECTED),
    /// No bearer token in the request (auth layer).
    TokenMissing => ("TOKEN_MISSING", Unauthenticated, EXIT_REJECTED),
    /// The bearer token is not configured (auth layer).
    TokenInvalid => ("TOKEN_INVALID", Unauthenticated, EXIT_REJECTED),
    /// A read-only token called a method that needs an admin token (auth layer).
    AdminRequired => ("ADMIN_REQUIRED", PermissionDenied, EXIT_REJECTED),
    /// No token is configured and a TCP caller called a method that changes state; without
    /// `--insecure-no-auth` anonymous TCP callers may only read (auth layer).
    AnonymousReadOnly => ("ANONYMOUS_READ_ONLY", PermissionDenied, EXIT_REJECTED),
    /// A local-socket peer without uid 0, CAP_NET_ADMIN or membership of `--socket-group`
    /// called a method that changes state (auth layer, peer credentials).
    LocalAdminRequired => ("LOCAL_ADMIN_REQUIRED", PermissionDenied, EXIT_REJECTED),
    /// A scoped token called outside its scope (a ruleset or set name, an operation or a
    /// priority it does not hold); `ErrorInfo.metadata["scope"]` is the missing scope word,
    /// e.g. `rulesets=team-b`, `ops=conntrack` or `min-priority<=10`.
    ScopeDenied => ("SCOPE_DENIED", PermissionDenied, EXIT_REJECTED),
    /// The request message is larger than `--max-request-bytes` (limits layer).
    RequestTooLarge => ("REQUEST_TOO_LARGE", ResourceExhausted, EXIT_REJECTED),
    /// The requests being received on all connections hold `--max-buffered-request-bytes`
    /// already (vallumd's `connections`); the call may be tried again.
    RequestBuffersFull => ("REQUEST_BUFFERS_FULL", ResourceExhausted, EXIT_REJECTED),
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
    /// vallum-server's `content::Checked::is_empty`).
    EmptyRuleset => ("EMPTY_RULESET", InvalidArgument, EXIT_REJECTED),
    /// Fleet mode: etcd cannot be reached or refused the request.
    FleetUnavailable => ("FLEET_UNAVAILABLE", Unavailable, EXIT_UNAVAILABLE),
    /// Fleet mode: the ruleset is owned by the fleet; change it with FleetService.
    FleetOwned => ("FLEET_OWNED", FailedPrecondition, EXIT_REJECTED),
    /// `vallumd --kernel-tables`: the kernel's iptables-restore refused the tables vallumd
    /// hands to it (an extension the kernel lacks, a rule it rejects), or two rulesets declare
    /// the same chain of one kernel table; nothing was published (see vallum-server's
    /// `kernel_tables`).
    KernelTablesRefused => ("KERNEL_TABLES_REFUSED", FailedPrecondition, EXIT_REJECTED),
    /// A page token's listing changed under it (GetCounters: a commit changed the active
    /// revisions between two pages); list again from the first page.
    ListChanged => ("LIST_CHANGED", Aborted, EXIT_REJECTED),
    /// WatchCommits `start_after` names a point whose following events are no longer kept
    /// (evicted, or from before vallumd's start); the message says which are kept.
    EventsNotKept => ("EVENTS_NOT_KEPT", OutOfRange, EXIT_REJECTED),
    /// Fleet mode: the fleet ruleset's etcd write would be larger than etcd's request limit
    /// (`--max-request-bytes`, 1.5 MiB by default; vallumd `--fleet-max-request-bytes`);
    /// refused before anything is written. `ErrorInfo.metadata`: `bytes`, `limit_bytes`.
    FleetValueTooLarge => ("FLEET_VALUE_TOO_LARGE", ResourceExhausted, EXIT_REJECTED),
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

/// Declares [`ClientReason`], [`ClientReason::ALL`] and [`ClientReason::info`] from one list,
/// as `reasons!` does for [`Reason`]: `/// doc` then `Variant => ("NAME", Some(Code) or None,
/// exit code),`.
macro_rules! client_reasons {
    ($(
        $(#[doc = $doc:literal])+
        $variant:ident => ($name:literal, $code:expr, $exit:expr),
    )+) => {
        /// The client-side rows of the table: failures that `vallumctl` finds itself, with no
        /// answer from the server. vallumd never sends these names; `vallumctl -o json` prints
        /// them as `reason`, and each row gives the exit code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ClientReason {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl ClientReason {
            /// Every client-side reason, in table order.
            pub const ALL: [ClientReason; [$(stringify!($variant)),+].len()] =
                [$(ClientReason::$variant),+];

            /// This reason's row.
            pub const fn info(self) -> ClientReasonInfo {
                #[allow(unused_imports)] // Used by the rows' codes.
                use tonic::Code;
                match self {
                    $(ClientReason::$variant => ClientReasonInfo {
                        name: $name,
                        code: $code,
                        exit_code: $exit,
                    },)+
                }
            }
        }
    };
}

client_reasons! {
    /// The command line is wrong and no call was made: clap's usage errors (unknown command or
    /// flag, a value that does not parse), a malformed revision name or `--server` URL, a
    /// token that is not printable ASCII or an empty `--token-file`, `--cert` without `--key`.
    Usage => ("USAGE", None, EXIT_USAGE),
    /// A local step failed: a ruleset, capture, token or TLS file cannot be read or is not PEM,
    /// stdout cannot be written, an iptables program (`dataplane`) failed.
    Local => ("LOCAL_ERROR", None, EXIT_REJECTED),
    /// `vallumctl apply --shadow-for`: more flows would change their verdict than
    /// `--max-changed-flows` allows, or the shadow ended before its time; nothing was
    /// committed (the new revision stays staged).
    ShadowLimit => ("SHADOW_LIMIT_EXCEEDED", None, EXIT_REJECTED),
    /// The server cannot be reached: connection refused, no route, a TLS handshake that failed
    /// (`https://` against a plaintext server included).
    Unreachable => ("UNREACHABLE", Some(Code::Unavailable), EXIT_UNAVAILABLE),
    /// The call's deadline (`--timeout`) passed before the answer came (tonic reports this as
    /// CANCELLED `Timeout expired`; gRPC's name for it is DEADLINE_EXCEEDED).
    DeadlineExceeded => ("DEADLINE_EXCEEDED", Some(Code::DeadlineExceeded), EXIT_UNAVAILABLE),
    /// The connection broke during the call (the server was killed, the peer reset it); a
    /// change may or may not have been made.
    ConnectionLost => ("CONNECTION_LOST", Some(Code::Unavailable), EXIT_UNAVAILABLE),
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
}
