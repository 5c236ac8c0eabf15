//! Bearer-token authentication and role-based authorisation for the gRPC server, as a tower
//! [`Layer`] that wraps tonic's router.
//!
//! # Tokens
//! Tokens come from files, never from literal flags (so they do not show in `ps`):
//! - `--token-file FILE` (`VALLUM_TOKEN_FILE`): one token a line, `ROLE TOKEN [NAME]`, where ROLE is
//!   `admin` or `read-only` (alias `reader`);
//! - `--admin-token-file FILE` (`VALLUM_ADMIN_TOKEN_FILE`) and `--reader-token-file FILE`
//!   (`VALLUM_READER_TOKEN_FILE`): one token a line, `TOKEN [NAME]`, all of that role.
//!
//! A line may end in scope words (`admin TOKEN ci-team-a rulesets=team-a-* ops=apply,sets
//! min-priority=100`): such a token may change only the rulesets and sets its names cover,
//! only by the operations it lists, and only at priorities at or above its floor (see
//! [`Scope`]; as Kubernetes RBAC `resourceNames` and Calico tiers). A line without scope words
//! means what it always meant: everything the role allows. NAME is optional before them
//! (a third word starting `rulesets=`, `ops=` or `min-priority=` is a scope word).
//!
//! Blank lines and lines starting with `#` are skipped. NAME is what the audit log records (the
//! token itself is never logged); it defaults to `ROLE@FILE:LINE`. An error in a token file
//! names the file, the line and the field (`f:3: field 1 (ROLE) is not ...`) but never a
//! value: a line in the wrong order (`TOKEN ROLE`) must not put the secret into the logs. A token is at least 16
//! characters of printable ASCII without spaces (e.g. `openssl rand -hex 32`).
//!
//! A token file that holds no token (empty, or comments only) is refused at start
//! (`TOKEN_FILE_EMPTY`), never read as "no token configured".
//!
//! When no token is configured, a TCP caller is [`Caller::anonymous`]: **read-only** by default
//! (reads, validation, trace; every change is refused with `ANONYMOUS_READ_ONLY`), an admin
//! only with `--insecure-no-auth` (the explicit opt-in to anonymous TCP admin).
//! [`AuthConfig::check_listen`] refuses a non-loopback listen address without tokens unless the
//! operator passes that flag.
//!
//! # The local socket
//! Calls through vallumd's unix socket (`--socket`, default `/run/vallum/vallumd.sock`, as
//! `docker.sock`) without a bearer token are authorized by the peer's credentials
//! (`SO_PEERCRED`, [`LocalPeer`]; [`LocalPolicy`]): uid 0, vallumd's own uid, a process whose
//! effective capabilities hold CAP_NET_ADMIN (what iptables needs; `/proc/PID/status`
//! `CapEff`), or a member of `--socket-group` (primary or supplementary group, `Groups:`) is an
//! admin; any other local user may read (as over loopback TCP without tokens) and is refused
//! every change with `LOCAL_ADMIN_REQUIRED`, the message naming what was missing. The caller
//! the audit log records is `local:uid=U,pid=P` (with `gid=G` for a group member, `cap=net_admin`
//! for a capability holder). A call through the socket that carries a bearer token is decided by
//! the token, as over TCP.
//!
//! # Authorisation
//! A client sends `authorization: Bearer TOKEN`. [`classify`] sorts the full gRPC path
//! (`/vallum.v1.RulesetService/Apply`) into [`Access::Read`] or [`Access::Admin`]: read-only
//! tokens may call Get*/List*/Validate/Diff/Export/Trace/Replay/GetStatus/WatchCommits (and
//! GetShadowReport), gRPC
//! health and reflection (ListSets, GetSet and ExportIpsetSave of the SetService too, and the
//! FleetService's GetRuleset, ListRulesets, GetRolloutStatus, WaitRollout and ListNodes);
//! everything else (Stage, Commit, Confirm, Apply, ShadowRevision, EndShadow, Rollback,
//! Delete, ZeroCounters, conntrack Delete and Flush, every set change, the fleet's PutRuleset
//! and DeleteRuleset, and any method this table does not know) needs admin.
//!
//! | failure | gRPC code | `ErrorInfo.reason` |
//! |---|---|---|
//! | no `authorization` header, or not `Bearer` | UNAUTHENTICATED | `TOKEN_MISSING` |
//! | unknown token | UNAUTHENTICATED | `TOKEN_INVALID` |
//! | read-only token on an admin method | PERMISSION_DENIED | `ADMIN_REQUIRED` |
//! | no tokens configured, a TCP caller on an admin method, no `--insecure-no-auth` | PERMISSION_DENIED | `ANONYMOUS_READ_ONLY` |
//! | local-socket peer without root, CAP_NET_ADMIN or `--socket-group` on an admin method | PERMISSION_DENIED | `LOCAL_ADMIN_REQUIRED` |
//! | scoped token outside its scope (checked by the handler, [`Grant::check`]) | PERMISSION_DENIED | `SCOPE_DENIED`, `metadata["scope"]` the missing word |
//!
//! # The caller in handlers
//! Every request that passes gets a [`Caller`] in its extensions (tonic copies http extensions into
//! `tonic::Request::extensions()`), for the audit log:
//! ```ignore
//! let who = req.extensions().get::<vallum_server::grpc::auth::Caller>().map(|c| c.name.clone());
//! ```
//!
//! Tokens are stored as SHA-256 digests and compared in constant time against every configured
//! digest (no early exit), so neither the token bytes nor which entry matched leak through timing.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use http::{Request, Response};
use subtle::ConstantTimeEq;
use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt};
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{ERROR_DOMAIN, Error, Reason};

mod local;

pub use local::{LocalPeer, LocalPolicy, resolve_group};

/// Shortest accepted token, in characters.
pub const MIN_TOKEN_LEN: usize = 16;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Reads, validation, trace and replay; no change to stored or active rulesets.
    ReadOnly,
    /// Everything.
    Admin,
}

impl Role {
    /// `read-only` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::Admin => "admin",
        }
    }

    /// Parses `admin`, `read-only`, `readonly` or `reader`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "read-only" | "readonly" | "reader" => Some(Role::ReadOnly),
            _ => None,
        }
    }

    /// Whether this role may call a method of the given access class.
    pub fn allows(self, access: Access) -> bool {
        match access {
            Access::Public | Access::Read => true,
            Access::Admin => self == Role::Admin,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The authenticated caller, put into every passing request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's name (for the audit log), or `anonymous` when auth is off.
    pub name: Arc<str>,
    /// The token's role.
    pub role: Role,
    /// What the token may touch; `None`: everything its role allows (a line without scope
    /// words, as before scopes existed).
    pub scope: Option<Arc<Scope>>,
}

impl Caller {
    /// The caller of a TCP request when no token is configured and `--insecure-no-auth` is
    /// given: an admin named `anonymous`.
    pub fn anonymous() -> Caller {
        Caller {
            name: Arc::from("anonymous"),
            role: Role::Admin,
            scope: None,
        }
    }

    /// The caller of a TCP request when no token is configured (and no `--insecure-no-auth`):
    /// `anonymous`, read-only.
    pub fn anonymous_reader() -> Caller {
        Caller {
            name: Arc::from("anonymous"),
            role: Role::ReadOnly,
            scope: None,
        }
    }

    /// The name the audit log records: the token's name, and for a scoped token its scope in
    /// brackets (`ci-team-a [rulesets=team-a-* ops=apply,sets]`).
    pub fn audit_name(&self) -> String {
        match &self.scope {
            Some(s) => format!("{} [{s}]", self.name),
            None => self.name.to_string(),
        }
    }
}

/// An operation a scoped token may be granted (`ops=` in a token file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// `apply`: StageRevision, CommitRevision, ConfirmCommit, Apply, EditRuleset, Rollback,
    /// UpdateRuleset and DeleteRuleset of the rulesets the token's names match, and
    /// FleetService PutRuleset and DeleteRuleset of the fleet rulesets they match.
    Apply,
    /// `sets`: every SetService change (create, destroy, add, delete, flush, swap, import)
    /// of the sets the token's names match.
    Sets,
    /// `conntrack`: ConntrackService Delete and Flush. The conntrack table is the host's,
    /// not a ruleset's, so this is never implied: it must be named in `ops=`.
    Conntrack,
    /// `counters`: ZeroCounters of the rulesets the token's names match.
    Counters,
}

impl Op {
    /// `apply`, `sets`, `conntrack` or `counters`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Apply => "apply",
            Op::Sets => "sets",
            Op::Conntrack => "conntrack",
            Op::Counters => "counters",
        }
    }

    fn parse(s: &str) -> Option<Op> {
        match s {
            "apply" => Some(Op::Apply),
            "sets" => Some(Op::Sets),
            "conntrack" => Some(Op::Conntrack),
            "counters" => Some(Op::Counters),
            _ => None,
        }
    }
}

/// What a scoped token may touch, from the `KEY=VALUE` words after a token line's NAME (as
/// Kubernetes RBAC `resourceNames` and Calico tiers scope policy):
/// - `rulesets=a,team-b-*`: the rulesets (and sets) it may change, by exact name or by prefix
///   (a trailing `*`); without it, any name;
/// - `ops=apply,sets,conntrack,counters`: the operations ([`Op`]); without it `apply,sets,counters`
///   (conntrack is host-wide and never implied);
/// - `min-priority=N`: the lowest priority number it may apply or stage with (lower runs
///   first, so it cannot outrank rulesets below N); without it, any.
///
/// A read-only token's scope changes nothing (it changes nothing anyway).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Names or prefixes (ending in `*`); empty: any name.
    pub names: Vec<String>,
    /// Granted operations, sorted.
    pub ops: Vec<Op>,
    /// The lowest priority number allowed.
    pub min_priority: Option<i32>,
}

impl Scope {
    /// Whether `name` is one of the names or prefixes (any name when none is given).
    pub fn covers(&self, name: &str) -> bool {
        self.names.is_empty()
            || self.names.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => p == name,
            })
    }

    /// Parses the scope words of a token line; the error names the word's key, never its value.
    fn parse<'a>(words: impl Iterator<Item = &'a str>) -> Result<Option<Scope>, String> {
        let mut scope = Scope::default();
        let mut any = false;
        let mut ops = None;
        for w in words {
            let Some((key, value)) = w.split_once('=') else {
                return Err("a word after NAME is not KEY=VALUE (values not shown)".to_owned());
            };
            any = true;
            match key {
                "rulesets" => {
                    for n in value.split(',') {
                        let bare = n.strip_suffix('*').unwrap_or(n);
                        if n.is_empty() || bare.contains('*') {
                            return Err(format!(
                                "rulesets={n:?}: a name, or a prefix ending in `*`"
                            ));
                        }
                        scope.names.push(n.to_owned());
                    }
                }
                "ops" => {
                    let mut v = Vec::new();
                    for o in value.split(',') {
                        v.push(Op::parse(o).ok_or_else(|| {
                            format!("ops={o:?}: not one of apply, sets, conntrack, counters")
                        })?);
                    }
                    v.sort();
                    v.dedup();
                    ops = Some(v);
                }
                "min-priority" => {
                    scope.min_priority =
                        Some(value.parse().map_err(|_| {
                            format!("min-priority={value:?}: not a 32-bit integer")
                        })?);
                }
                _ => {
                    return Err(
                        "unknown scope key (expected rulesets=, ops= or min-priority=; \
                         value not shown)"
                            .to_owned(),
                    );
                }
            }
        }
        scope.ops = ops.unwrap_or_else(|| vec![Op::Apply, Op::Sets, Op::Counters]);
        Ok(any.then_some(scope))
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if !self.names.is_empty() {
            write!(f, "rulesets={}", self.names.join(","))?;
            sep = " ";
        }
        let ops: Vec<&str> = self.ops.iter().map(|o| o.as_str()).collect();
        write!(f, "{sep}ops={}", ops.join(","))?;
        if let Some(p) = self.min_priority {
            write!(f, " min-priority={p}")?;
        }
        Ok(())
    }
}

/// The scope of one request's caller, taken from its extensions before the handler consumes
/// the request; [`Grant::check`] then refuses what the scope does not hold. A request that
/// did not pass the auth layer (or an unscoped token) is granted everything.
#[derive(Clone, Debug, Default)]
pub struct Grant {
    caller: Option<(Arc<str>, Arc<Scope>)>,
}

impl Grant {
    /// The grant of a request.
    pub fn of<T>(request: &tonic::Request<T>) -> Grant {
        Grant {
            caller: request
                .extensions()
                .get::<Caller>()
                .and_then(|c| Some((c.name.clone(), c.scope.clone()?))),
        }
    }

    /// Whether the scope caps priorities (`min-priority=`): only then must a caller look up a
    /// ruleset's stored priority for [`Grant::check`].
    pub fn limits_priority(&self) -> bool {
        self.caller
            .as_ref()
            .is_some_and(|(_, s)| s.min_priority.is_some())
    }

    /// Refuses with [`Error::ScopeDenied`] (reason `SCOPE_DENIED`, missing `ops=OP`) unless
    /// the scope holds `op`: the first check of every mutating call
    /// ([`crate::grpc::call::mutate`]), made before the request's fields are read. `what`
    /// names the call (its method).
    pub fn check_op(&self, what: &str, op: Op) -> Result<(), Error> {
        match &self.caller {
            Some((caller, scope)) if !scope.ops.contains(&op) => Err(Error::ScopeDenied {
                caller: caller.to_string(),
                what: what.to_owned(),
                held: scope.to_string(),
                missing: format!("ops={}", op.as_str()),
            }),
            _ => Ok(()),
        }
    }

    /// Refuses with [`Error::ScopeDenied`] (reason `SCOPE_DENIED`, naming the missing scope
    /// word) unless the scope holds `op`, covers `name` (when one is named; `None` means
    /// "every ruleset", which only an unrestricted name list covers) and allows `priority`.
    /// `what` describes the call for the message, e.g. `DeleteRuleset rulesets/team-b`.
    pub fn check(
        &self,
        what: &str,
        op: Op,
        name: Option<&str>,
        priority: Option<i32>,
    ) -> Result<(), Error> {
        let Some((caller, scope)) = &self.caller else {
            return Ok(());
        };
        let missing = if !scope.ops.contains(&op) {
            Some(format!("ops={}", op.as_str()))
        } else if !name.map_or(scope.names.is_empty(), |n| scope.covers(n)) {
            Some(format!("rulesets={}", name.unwrap_or("*")))
        } else {
            match (scope.min_priority, priority) {
                (Some(min), Some(p)) if p < min => Some(format!("min-priority<={p}")),
                _ => None,
            }
        };
        match missing {
            None => Ok(()),
            Some(missing) => Err(Error::ScopeDenied {
                caller: caller.to_string(),
                what: what.to_owned(),
                held: scope.to_string(),
                missing,
            }),
        }
    }
}

/// The access class of a gRPC method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// grpc.health.v1 only: no token needed. Kubernetes' native gRPC probes cannot send an
    /// `authorization` header, and the answer reveals nothing but SERVING / NOT_SERVING.
    Public,
    /// Reading, validating, tracing: any valid token.
    Read,
    /// Changing rulesets, revisions, the engine or counters: admin tokens only.
    Admin,
}

/// Methods of `vallum.v1` that a read-only token may call, as `Service/Method`.
const READ_METHODS: &[&str] = &[
    "RulesetService/ValidateRuleset",
    "RulesetService/GetRuleset",
    "RulesetService/ListRulesets",
    "RulesetService/ListRevisions",
    "RulesetService/GetRevision",
    "RulesetService/GetShadowReport",
    "RulesetService/DiffRevisions",
    "RulesetService/ExportRevision",
    "RulesetService/WatchCommits",
    "CounterService/GetCounters",
    "TraceService/TracePacket",
    "TraceService/ReplayCapture",
    "TraceService/WatchPacketEvents",
    "EngineService/GetStatus",
    "ConntrackService/List",
    "ConntrackService/GetStats",
    "SetService/ListSets",
    "SetService/GetSet",
    "SetService/ExportIpsetSave",
    "FleetService/GetRuleset",
    "FleetService/ListRulesets",
    "FleetService/GetRolloutStatus",
    "FleetService/WaitRollout",
    "FleetService/ListNodes",
];

/// Methods of `vallum.v1` that need an admin token, as `Service/Method`.
const ADMIN_METHODS: &[&str] = &[
    "RulesetService/StageRevision",
    "RulesetService/CommitRevision",
    "RulesetService/ConfirmCommit",
    "RulesetService/Apply",
    "RulesetService/ShadowRevision",
    "RulesetService/EndShadow",
    "RulesetService/Rollback",
    "RulesetService/DeleteRuleset",
    "RulesetService/UpdateRuleset",
    "RulesetService/EditRuleset",
    "CounterService/ZeroCounters",
    "ConntrackService/Delete",
    "ConntrackService/Flush",
    "SetService/CreateSet",
    "SetService/DestroySet",
    "SetService/AddElements",
    "SetService/DeleteElements",
    "SetService/FlushSet",
    "SetService/SwapSets",
    "SetService/ImportIpsetSave",
    "FleetService/PutRuleset",
    "FleetService/DeleteRuleset",
];

/// Every method of `vallum.v1` as `(Service/Method, access)`: [`Access::Read`] or
/// [`Access::Admin`] (the mutating ones).
pub fn api_methods() -> impl Iterator<Item = (&'static str, Access)> {
    (READ_METHODS.iter().map(|m| (*m, Access::Read)))
        .chain(ADMIN_METHODS.iter().map(|m| (*m, Access::Admin)))
}

/// Health and reflection methods, as full paths.
const INFRA_METHODS: &[(&str, &str)] = &[
    ("grpc.health.v1.Health", "Check"),
    ("grpc.health.v1.Health", "Watch"),
    (
        "grpc.reflection.v1.ServerReflection",
        "ServerReflectionInfo",
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        "ServerReflectionInfo",
    ),
];

/// `(service, method)` of a path that names a method of our API, health or reflection, as
/// static strings (for metric labels of bounded cardinality); `None` for any other path.
pub fn known_method(path: &str) -> Option<(&'static str, &'static str)> {
    let rest = path.strip_prefix('/')?;
    let (service, method) = rest.split_once('/')?;
    if let Some(&(s, m)) = INFRA_METHODS
        .iter()
        .find(|(s, m)| *s == service && *m == method)
    {
        return Some((s, m));
    }
    let short = rest.strip_prefix("vallum.v1.")?;
    let entry = READ_METHODS
        .iter()
        .chain(ADMIN_METHODS)
        .find(|e| **e == short)?;
    let (s, m) = entry.split_once('/')?;
    // The service name with its package, from a static table so the label is `'static`.
    let service = match s {
        "RulesetService" => "vallum.v1.RulesetService",
        "CounterService" => "vallum.v1.CounterService",
        "TraceService" => "vallum.v1.TraceService",
        "EngineService" => "vallum.v1.EngineService",
        "ConntrackService" => "vallum.v1.ConntrackService",
        "SetService" => "vallum.v1.SetService",
        "FleetService" => "vallum.v1.FleetService",
        _ => return None,
    };
    Some((service, m))
}

/// Services anyone may call, token or not (see [`Access::Public`]).
const PUBLIC_SERVICES: &[&str] = &["/grpc.health.v1.Health/"];

/// Services whose every method is read-only (reflection).
const READ_SERVICES: &[&str] = &[
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// Classifies a full gRPC path such as `/vallum.v1.RulesetService/Apply`. Unknown methods need
/// admin (deny by default), so a method added to the API is safe until it is listed here.
pub fn classify(path: &str) -> Access {
    if PUBLIC_SERVICES.iter().any(|s| path.starts_with(s)) {
        return Access::Public;
    }
    if READ_SERVICES.iter().any(|s| path.starts_with(s)) {
        return Access::Read;
    }
    match path.strip_prefix("/vallum.v1.") {
        Some(m) if READ_METHODS.contains(&m) => Access::Read,
        _ => Access::Admin,
    }
}

/// Why a token file could not be loaded, or why auth refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token file could not be read.
    #[error("cannot read token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line of a token file is malformed.
    #[error("{source_name}:{line}: {message}")]
    Syntax {
        /// The file (or other source) name.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong (never contains the token).
        message: String,
    },
    /// The same token is configured twice.
    #[error("{source_name}:{line}: duplicate token (also named {other})")]
    Duplicate {
        /// The file name.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// The name of the first entry with this token.
        other: Arc<str>,
    },
    /// A configured token file holds no token (empty, or only blank lines and comments).
    /// Refused rather than read as "auth off": a secret mount that came up empty must not
    /// open every mutation to every caller.
    #[error(
        "token file {path} holds no token (only blank lines and comments); without tokens \
         authentication would be off: add a token or drop the flag"
    )]
    NoTokens {
        /// The file.
        path: PathBuf,
    },
    /// `--socket-group` names no group.
    #[error("--socket-group {group}: no such group")]
    UnknownGroup {
        /// The name given.
        group: String,
    },
    /// Auth is off but the server listens beyond loopback.
    #[error(
        "refusing to listen on {addr} without tokens: configure --token-file/--admin-token-file \
         or pass --insecure-no-auth"
    )]
    OpenListener {
        /// The listen address.
        addr: SocketAddr,
    },
    /// A reload ([`TokenReloader::reload`]) would turn auth on or off; the tokens in use
    /// stay.
    #[error("a reload cannot turn authentication on or off: restart vallumd with other flags")]
    ReloadChangesMode,
}

impl AuthError {
    /// UPPER_SNAKE code of this startup error, printed by vallumd. It never reaches a client,
    /// so it is not a row of the [`crate::Reason`] table.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Read { .. } => "TOKEN_FILE_UNREADABLE",
            AuthError::Syntax { .. } => "TOKEN_FILE_INVALID",
            AuthError::Duplicate { .. } => "TOKEN_DUPLICATE",
            AuthError::NoTokens { .. } => "TOKEN_FILE_EMPTY",
            AuthError::OpenListener { .. } => "AUTH_REQUIRED_OFF_LOOPBACK",
            AuthError::ReloadChangesMode => "TOKEN_RELOAD_CHANGES_MODE",
            AuthError::UnknownGroup { .. } => "SOCKET_GROUP_UNKNOWN",
        }
    }
}

/// Whether a word of a token line is a scope word (`rulesets=`, `ops=`, `min-priority=`)
/// rather than a NAME.
fn is_scope_word(w: &str) -> bool {
    ["rulesets=", "ops=", "min-priority="]
        .iter()
        .any(|k| w.starts_with(k))
}

// === impl TokenSet ===

struct Entry {
    digest: [u8; 32],
    caller: Caller,
}

/// The configured tokens (as SHA-256 digests) with their callers.
#[derive(Default)]
pub struct TokenSet {
    entries: Vec<Entry>,
}

impl fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print digests; names and roles are enough.
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.caller))
            .finish()
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn check_token(token: &str) -> Result<(), String> {
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!("token is shorter than {MIN_TOKEN_LEN} characters"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("token must be printable ASCII without spaces".to_owned());
    }
    Ok(())
}

impl TokenSet {
    /// An empty set (auth off).
    pub fn new() -> TokenSet {
        TokenSet::default()
    }

    /// Whether no token is configured (auth off).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Adds one token. `source_name` and `line` are for error messages only.
    pub fn insert(
        &mut self,
        token: &str,
        caller: Caller,
        source_name: &str,
        line: usize,
    ) -> Result<(), AuthError> {
        check_token(token).map_err(|message| AuthError::Syntax {
            source_name: source_name.to_owned(),
            line,
            message,
        })?;
        let digest = digest(token.as_bytes());
        if let Some(e) = self.entries.iter().find(|e| e.digest == digest) {
            return Err(AuthError::Duplicate {
                source_name: source_name.to_owned(),
                line,
                other: e.caller.name.clone(),
            });
        }
        self.entries.push(Entry { digest, caller });
        Ok(())
    }

    /// Adds the tokens of a file's text. With `role = None` every line is `ROLE TOKEN [NAME]`;
    /// with `Some(role)` every line is `TOKEN [NAME]`.
    pub fn add_text(
        &mut self,
        text: &str,
        role: Option<Role>,
        source_name: &str,
    ) -> Result<(), AuthError> {
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let syntax = |message: String| AuthError::Syntax {
                source_name: source_name.to_owned(),
                line,
                message,
            };
            let mut words = l.split_whitespace();
            let role_given = role.is_some();
            let role = match role {
                Some(r) => r,
                None => {
                    let w = words.next().unwrap_or_default();
                    // The word is never echoed: a line written as `TOKEN ROLE` or `TOKEN`
                    // would put the secret into the log.
                    Role::parse(w).ok_or_else(|| {
                        syntax(
                            "field 1 (ROLE) is not `admin` or `read-only` (value not shown; \
                             expected `ROLE TOKEN [NAME]`)"
                                .to_owned(),
                        )
                    })?
                }
            };
            let token_field = if role_given { 1 } else { 2 };
            let token = words
                .next()
                .ok_or_else(|| syntax(format!("field {token_field} (TOKEN) is missing")))?;
            check_token(token).map_err(|m| syntax(format!("field {token_field} (TOKEN): {m}")))?;
            let mut rest = words.peekable();
            let name = match rest.next_if(|w| !is_scope_word(w)) {
                Some(n) => n.to_owned(),
                None => format!("{role}@{source_name}:{line}"),
            };
            let scope = Scope::parse(rest).map_err(|m| {
                syntax(if m.starts_with("a word after NAME") {
                    format!(
                        "trailing words after field {} (NAME) (values not shown)",
                        token_field + 1
                    )
                } else {
                    m
                })
            })?;
            self.insert(
                token,
                Caller {
                    name: Arc::from(name),
                    role,
                    scope: scope.map(Arc::new),
                },
                source_name,
                line,
            )?;
        }
        Ok(())
    }

    /// Adds the tokens of a file (see [`TokenSet::add_text`]); a file that holds none is
    /// [`AuthError::NoTokens`].
    pub fn add_file(&mut self, path: &Path, role: Option<Role>) -> Result<(), AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: path.to_owned(),
            source,
        })?;
        let before = self.len();
        self.add_text(&text, role, &path.display().to_string())?;
        if self.len() == before {
            return Err(AuthError::NoTokens {
                path: path.to_owned(),
            });
        }
        Ok(())
    }

    /// The caller whose token this is. Compares the digest with every entry in constant time and
    /// without early exit.
    pub fn authenticate(&self, token: &[u8]) -> Option<&Caller> {
        let d = digest(token);
        let mut found: Option<&Caller> = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&d)) {
                found = Some(&e.caller);
            }
        }
        found
    }
}

// === impl AuthConfig ===

/// Auth flags of `vallumd`; flatten into the server's clap parser with `#[command(flatten)]`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct AuthConfig {
    /// Token file with lines `ROLE TOKEN [NAME]` (ROLE: admin or read-only).
    #[arg(long, env = "VALLUM_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Token file with admin tokens, lines `TOKEN [NAME]`.
    #[arg(long, env = "VALLUM_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Token file with read-only tokens, lines `TOKEN [NAME]`.
    #[arg(long, env = "VALLUM_READER_TOKEN_FILE", value_name = "FILE")]
    pub reader_token_file: Option<PathBuf>,
    /// With no token configured, let every TCP caller change state as an anonymous admin
    /// (without it they may only read), and allow a listen address beyond loopback. The
    /// local socket is not affected (peer credentials decide there).
    #[arg(long, env = "VALLUM_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Members of this group (name or gid) may change state through the local socket, besides
    /// root and CAP_NET_ADMIN holders (as the `docker` group of docker.sock).
    #[arg(long, env = "VALLUM_SOCKET_GROUP", value_name = "GROUP")]
    pub socket_group: Option<String>,
}

impl AuthConfig {
    /// Loads every configured file into one [`TokenSet`] (empty: auth off).
    pub fn load(&self) -> Result<TokenSet, AuthError> {
        let mut set = TokenSet::new();
        if let Some(p) = &self.token_file {
            set.add_file(p, None)?;
        }
        if let Some(p) = &self.admin_token_file {
            set.add_file(p, Some(Role::Admin))?;
        }
        if let Some(p) = &self.reader_token_file {
            set.add_file(p, Some(Role::ReadOnly))?;
        }
        Ok(set)
    }

    /// The local-socket and anonymous-TCP policy: vallumd's effective uid, `--socket-group`
    /// resolved to a gid, `--insecure-no-auth`.
    ///
    /// Errors: [`AuthError::UnknownGroup`].
    pub fn local_policy(&self) -> Result<LocalPolicy, AuthError> {
        Ok(LocalPolicy {
            // SAFETY: geteuid has no preconditions and cannot fail.
            own_uid: unsafe { libc::geteuid() },
            group: self
                .socket_group
                .as_deref()
                .map(resolve_group)
                .transpose()?,
            anonymous_tcp_admin: self.insecure_no_auth,
            proc_root: PathBuf::from("/proc"),
        })
    }

    /// Refuses to serve `addr` beyond loopback with auth off, unless `--insecure-no-auth`.
    pub fn check_listen(&self, tokens: &TokenSet, addr: SocketAddr) -> Result<(), AuthError> {
        if tokens.is_empty() && !addr.ip().is_loopback() && !self.insecure_no_auth {
            return Err(AuthError::OpenListener { addr });
        }
        Ok(())
    }
}

// === impl AuthLayer ===

/// The tower layer: put it around tonic's router with `Server::builder().layer(...)`.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    /// Swapped whole by [`TokenReloader::reload`]; each request reads the set once.
    tokens: Arc<ArcSwap<TokenSet>>,
    local: Arc<LocalPolicy>,
}

impl AuthLayer {
    /// A layer checking requests against `tokens` under the default [`LocalPolicy`]; with an
    /// empty set every TCP request passes as [`Caller::anonymous_reader`].
    pub fn new(tokens: TokenSet) -> AuthLayer {
        AuthLayer::with_policy(tokens, LocalPolicy::default())
    }

    /// A layer checking requests against `tokens`, local-socket peers and anonymous TCP
    /// callers under `local`.
    pub fn with_policy(tokens: TokenSet, local: LocalPolicy) -> AuthLayer {
        AuthLayer {
            tokens: Arc::new(ArcSwap::from_pointee(tokens)),
            local: Arc::new(local),
        }
    }

    /// The handle that replaces the tokens of this layer and of every service it made
    /// (vallumd reloads on SIGHUP, for token rotation).
    pub fn reloader(&self) -> TokenReloader {
        TokenReloader {
            tokens: self.tokens.clone(),
        }
    }

    /// Decides one request that came through the local socket from `peer` (`None`: the
    /// kernel gave no credentials, so it is refused every change): with a bearer token and
    /// tokens configured, as [`AuthLayer::check`]; otherwise by [`LocalPolicy::caller`].
    pub fn check_local(
        &self,
        path: &str,
        authorization: Option<&[u8]>,
        peer: Option<&LocalPeer>,
    ) -> Result<Caller, Status> {
        if authorization.is_some() && !self.tokens.load().is_empty() {
            return self.check(path, authorization);
        }
        let caller = match peer {
            Some(p) => self.local.caller(p),
            None => Caller {
                name: Arc::from("local:unknown"),
                role: Role::ReadOnly,
                scope: None,
            },
        };
        if !caller.role.allows(classify(path)) {
            return Err(denied(
                Reason::LocalAdminRequired,
                &format!(
                    "{path} changes state: through the local socket that needs {}; {} has none \
                     (or send an admin token)",
                    self.local.missing(),
                    caller.name
                ),
            ));
        }
        Ok(caller)
    }

    /// Decides one TCP request: the caller, or the status to answer with.
    pub fn check(&self, path: &str, authorization: Option<&[u8]>) -> Result<Caller, Status> {
        let tokens = self.tokens.load();
        if tokens.is_empty() {
            if self.local.anonymous_tcp_admin {
                return Ok(Caller::anonymous());
            }
            if !Role::ReadOnly.allows(classify(path)) {
                return Err(denied(
                    Reason::AnonymousReadOnly,
                    &format!(
                        "{path} changes state: without tokens vallumd lets TCP callers only read; \
                         use the local socket (vallumctl's default, as root or with CAP_NET_ADMIN), \
                         configure --token-file, or start vallumd with --insecure-no-auth"
                    ),
                ));
            }
            return Ok(Caller::anonymous_reader());
        }
        if classify(path) == Access::Public {
            return Ok(Caller {
                name: Arc::from("health-probe"),
                role: Role::ReadOnly,
                scope: None,
            });
        }
        let token = authorization.and_then(bearer_token).ok_or_else(|| {
            denied(
                Reason::TokenMissing,
                "missing bearer token (vallumctl: --token-file FILE or VALLUM_TOKEN_FILE; other clients: \
                 send `authorization: Bearer TOKEN`)",
            )
        })?;
        let caller = tokens
            .authenticate(token)
            .ok_or_else(|| denied(Reason::TokenInvalid, "invalid token"))?;
        let access = classify(path);
        if !caller.role.allows(access) {
            return Err(denied(
                Reason::AdminRequired,
                &format!("{path} needs an admin token; {} is read-only", caller.name),
            ));
        }
        Ok(caller.clone())
    }
}

/// Replaces an [`AuthLayer`]'s tokens: token rotation without a restart (add the new token to
/// the file, reload, move the clients over, remove the old one, reload).
#[derive(Clone, Debug)]
pub struct TokenReloader {
    tokens: Arc<ArcSwap<TokenSet>>,
}

impl TokenReloader {
    /// Loads `config`'s token files again ([`AuthConfig::load`]) and puts the new set in place
    /// for every later request (a request already past the layer keeps its caller). Returns
    /// the number of tokens now in use. All or nothing: when a file does not load (missing,
    /// malformed, empty) the tokens in use stay, so a bad edit locks nobody out; nor can a
    /// reload turn auth on or off (that needs a restart with other flags).
    ///
    /// Errors: the [`AuthError`] of the file; [`AuthError::ReloadChangesMode`] when the new set
    /// would turn auth on or off.
    pub fn reload(&self, config: &AuthConfig) -> Result<usize, AuthError> {
        let set = config.load()?;
        if set.is_empty() != self.tokens.load().is_empty() {
            return Err(AuthError::ReloadChangesMode);
        }
        let n = set.len();
        self.tokens.store(Arc::new(set));
        Ok(n)
    }
}

/// The token of an `authorization` header value `Bearer TOKEN` (scheme case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// A refusal of the auth layer, with its row of the error table.
fn denied(reason: Reason, message: &str) -> Status {
    let info = reason.info();
    Status::with_error_details(
        info.code,
        message,
        ErrorDetails::with_error_info(
            info.name,
            ERROR_DOMAIN,
            std::collections::HashMap::<String, String>::new(),
        ),
    )
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`AuthLayer`].
#[derive(Clone, Debug)]
pub struct AuthService<S> {
    inner: S,
    layer: AuthLayer,
}

impl<S, B, RB> Service<Request<B>> for AuthService<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let auth = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        // tonic's connection info: present when the request came through the unix socket.
        let local = req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .map(|i| {
                i.peer_cred.map(|c| LocalPeer {
                    uid: c.uid(),
                    gid: c.gid(),
                    pid: c.pid(),
                })
            });
        let decided = match local {
            Some(peer) => self
                .layer
                .check_local(req.uri().path(), auth, peer.as_ref()),
            None => self.layer.check(req.uri().path(), auth),
        };
        match decided {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                Box::pin(self.inner.call(req))
            }
            Err(status) => {
                let resp = status.into_http::<RB>();
                Box::pin(std::future::ready(Ok(resp)))
            }
        }
    }
}

#[cfg(test)]
mod tests;
