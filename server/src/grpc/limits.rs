//! Resource limits: request size, rules and chains per ruleset, rulesets, revisions kept.
//!
//! This module holds the configuration ([`LimitsConfig`], clap flags with `VALLUM_*` twins), the
//! checks and the error type; the server calls them:
//! - request size: `RulesetServiceServer::new(svc).max_decoding_message_size(cfg.max_request_bytes)`
//!   for every service, and [`RequestLimitLayer`] in the tonic `Server` builder so that tonic's
//!   OUT_OF_RANGE "decoded message length too large" answer becomes RESOURCE_EXHAUSTED with
//!   `ErrorInfo.reason = REQUEST_TOO_LARGE`;
//! - rules and chains: right after a Stage/Apply/Validate source is parsed (a pass linear in
//!   the request, itself bounded by the request size), before it is validated, printed or
//!   compiled, [`LimitsConfig::check_tables`] (RESOURCE_EXHAUSTED with a BadRequest violation
//!   on `source`); the pipeline checks the rules again before it stores a revision;
//! - sets: before a CreateSet or an ImportSets creates sets, [`LimitsConfig::check_new_sets`]
//!   (RESOURCE_EXHAUSTED): at most `--max-sets` sets, none with a `maxelem` above
//!   `--max-set-elements` (a set's elements are then bounded by its `maxelem`, as ipset's
//!   "Hash is full", `SET_FULL`);
//! - rulesets: before creating a new ruleset, `check_rulesets(existing, cfg.max_rulesets)?`
//!   (RESOURCE_EXHAUSTED);
//! - revisions kept: after storing a revision, delete [`revisions_to_prune`]`(&numbers, active,
//!   cfg.max_revisions_kept)` in the same transaction (the active and pending revisions are never
//!   pruned).
//!
//! Every refusal is a [`LimitError`] whose `From<LimitError> for Status` carries
//! `ErrorInfo { reason, domain: "vallum.dev", metadata: { limit, value, max } }`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderValue, Response};
use tonic::{Code, Status};
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{Error, Reason};

/// Default [`LimitsConfig::max_request_bytes`]: 4 MiB (tonic's own default).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 << 20;
/// Default [`LimitsConfig::max_rules_per_ruleset`].
pub const DEFAULT_MAX_RULES: usize = 100_000;
/// Default [`LimitsConfig::max_chains_per_ruleset`]: 65,536. A kube-proxy host (iptables
/// mode) has one `KUBE-SVC-*` chain per Service and one `KUBE-SEP-*` per endpoint, plus a few
/// per Service with external traffic policies: at the Kubernetes scalability threshold of
/// 10,000 Services with ~5 endpoints each that is ~60k chains in its nat table. Validating
/// 65,536 chains takes milliseconds (BENCHMARKS.md, "Validation (issue #13)"); the limit bounds
/// the memory a ruleset's chains hold in the model and in every compiled snapshot.
pub const DEFAULT_MAX_CHAINS: usize = 65_536;
/// Default [`LimitsConfig::max_sets`]: 1,024 (a kube-proxy in ipvs mode uses ~20 sets, Docker
/// and fail2ban a few each).
pub const DEFAULT_MAX_SETS: usize = 1024;
/// Default [`LimitsConfig::max_set_elements`]: 262,144, four times ipset's default `maxelem`
/// of 65,536. Filling a set in one AddElements peaks at ~330 bytes per element (a set of this
/// size: ~85 MiB, docs/operations.md "Sizing"), which the chart's 512 MiB holds beside a
/// ruleset at `--max-rules`; larger sets need `--max-set-elements` and more memory.
pub const DEFAULT_MAX_SET_ELEMENTS: u32 = 1 << 18;
/// Default [`LimitsConfig::max_rulesets`].
pub const DEFAULT_MAX_RULESETS: usize = 256;
/// Default [`LimitsConfig::max_revisions_kept`].
pub const DEFAULT_MAX_REVISIONS_KEPT: usize = 100;

/// Limit flags of `vallumd`; flatten into the server's clap parser.
#[derive(Clone, Debug, clap::Args)]
pub struct LimitsConfig {
    /// Largest accepted gRPC request message, bytes.
    #[arg(long, env = "VALLUM_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,
    /// Most rules in one ruleset (all tables and families together).
    #[arg(long = "max-rules", env = "VALLUM_MAX_RULES", default_value_t = DEFAULT_MAX_RULES)]
    pub max_rules_per_ruleset: usize,
    /// Most chains in one ruleset: builtin and user chains of all tables and families
    /// together.
    #[arg(long = "max-chains", env = "VALLUM_MAX_CHAINS", default_value_t = DEFAULT_MAX_CHAINS)]
    pub max_chains_per_ruleset: usize,
    /// Most ipset-style sets.
    #[arg(long, env = "VALLUM_MAX_SETS", default_value_t = DEFAULT_MAX_SETS)]
    pub max_sets: usize,
    /// Largest `maxelem` a set may be created with: the most elements one set holds.
    #[arg(long, env = "VALLUM_MAX_SET_ELEMENTS", default_value_t = DEFAULT_MAX_SET_ELEMENTS)]
    pub max_set_elements: u32,
    /// Most rulesets stored.
    #[arg(long, env = "VALLUM_MAX_RULESETS", default_value_t = DEFAULT_MAX_RULESETS)]
    pub max_rulesets: usize,
    /// Revisions kept per ruleset; older ones (never the active one, nor one waiting for or
    /// restored by a commit-confirmed) are deleted when a revision is added. 0 keeps all.
    #[arg(long, env = "VALLUM_MAX_REVISIONS_KEPT", default_value_t = DEFAULT_MAX_REVISIONS_KEPT)]
    pub max_revisions_kept: usize,
}

impl Default for LimitsConfig {
    fn default() -> LimitsConfig {
        LimitsConfig {
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_rules_per_ruleset: DEFAULT_MAX_RULES,
            max_chains_per_ruleset: DEFAULT_MAX_CHAINS,
            max_sets: DEFAULT_MAX_SETS,
            max_set_elements: DEFAULT_MAX_SET_ELEMENTS,
            max_rulesets: DEFAULT_MAX_RULESETS,
            max_revisions_kept: DEFAULT_MAX_REVISIONS_KEPT,
        }
    }
}

/// A refused request: which limit, the value seen and the maximum.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The request message is larger than `--max-request-bytes`.
    #[error("request of {size} bytes exceeds the limit of {max} bytes (--max-request-bytes)")]
    RequestTooLarge {
        /// Bytes in the request (0 when unknown).
        size: usize,
        /// The limit, bytes.
        max: usize,
    },
    /// The ruleset has more rules than `--max-rules`.
    #[error("ruleset has {count} rules, more than the limit of {max} (--max-rules)")]
    TooManyRules {
        /// Rules in the ruleset.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The `-s a,b,...` / `-d a,b,...` lists of a text stand for more rules than `--max-rules`,
    /// counted before they are expanded (a line of n sources and m destinations is n x m
    /// rules).
    #[error(
        "{at}: -s/-d address lists expand to {count} rules, more than the limit of {max} (--max-rules)"
    )]
    ListTooLarge {
        /// The request field of the text (`source.text`, `edits[2].args`).
        field: String,
        /// `FILE:LINE:COL` of the line that passed the limit.
        at: String,
        /// Rules the lists up to that line stand for (saturating).
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The ruleset has more chains than `--max-chains`.
    #[error("ruleset has {count} chains, more than the limit of {max} (--max-chains)")]
    TooManyChains {
        /// Chains in the ruleset (builtin ones included).
        count: usize,
        /// The limit.
        max: usize,
    },
    /// Creating sets would exceed `--max-sets`.
    #[error("{count} sets would exist, more than the limit of {max} (--max-sets)")]
    TooManySets {
        /// Sets there would be.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A set's `maxelem` is above `--max-set-elements`.
    #[error(
        "set {set} asks for maxelem {maxelem}, more than the limit of {max} (--max-set-elements)"
    )]
    SetTooLarge {
        /// The set.
        set: String,
        /// Its `maxelem`.
        maxelem: u32,
        /// The limit.
        max: u32,
    },
    /// The request bytes buffered on all connections would pass
    /// `--max-buffered-request-bytes` (see `crate::grpc::connections`).
    #[error(
        "the server holds {max} bytes of requests not yet received whole (--max-buffered-request-bytes); try again"
    )]
    RequestBuffersFull {
        /// The limit, bytes.
        max: usize,
    },
    /// Creating the ruleset would exceed `--max-rulesets`.
    #[error("{count} rulesets exist, the limit is {max} (--max-rulesets)")]
    TooManyRulesets {
        /// Rulesets that exist.
        count: usize,
        /// The limit.
        max: usize,
    },
}

impl LimitError {
    /// This refusal's row of the error table ([`Reason`]), which gives the gRPC code
    /// (RESOURCE_EXHAUSTED for every limit).
    pub fn reason(&self) -> Reason {
        match self {
            LimitError::RequestTooLarge { .. } => Reason::RequestTooLarge,
            LimitError::TooManyRules { .. } | LimitError::ListTooLarge { .. } => {
                Reason::TooManyRules
            }
            LimitError::TooManyChains { .. } => Reason::TooManyChains,
            LimitError::TooManySets { .. } => Reason::TooManySets,
            LimitError::SetTooLarge { .. } => Reason::SetTooLarge,
            LimitError::TooManyRulesets { .. } => Reason::TooManyRulesets,
            LimitError::RequestBuffersFull { .. } => Reason::RequestBuffersFull,
        }
    }

    /// The gRPC code (from the table).
    pub fn code(&self) -> Code {
        self.reason().info().code
    }

    /// `(limit flag, value, max)`.
    fn parts(&self) -> (&'static str, usize, usize) {
        match self {
            LimitError::TooManySets { count, max } => ("max-sets", *count, *max),
            LimitError::SetTooLarge { maxelem, max, .. } => {
                ("max-set-elements", *maxelem as usize, *max as usize)
            }
            LimitError::RequestTooLarge { size, max } => ("max-request-bytes", *size, *max),
            LimitError::TooManyRules { count, max }
            | LimitError::ListTooLarge { count, max, .. } => ("max-rules", *count, *max),
            LimitError::TooManyChains { count, max } => ("max-chains", *count, *max),
            LimitError::TooManyRulesets { count, max } => ("max-rulesets", *count, *max),
            LimitError::RequestBuffersFull { max } => ("max-buffered-request-bytes", *max, *max),
        }
    }

    /// The `ErrorInfo.metadata`: `limit` (the flag), `value` and `max`.
    pub fn metadata(&self) -> HashMap<String, String> {
        let (limit, value, max) = self.parts();
        [
            ("limit".to_owned(), limit.to_owned()),
            ("value".to_owned(), value.to_string()),
            ("max".to_owned(), max.to_string()),
        ]
        .into_iter()
        .collect()
    }
}

/// Through [`Error::Limit`], the one place errors become statuses.
impl From<LimitError> for Status {
    fn from(e: LimitError) -> Status {
        Status::from(Error::Limit(e))
    }
}

/// Refuses a ruleset with more than `max` rules.
pub fn check_rules(count: usize, max: usize) -> Result<(), LimitError> {
    if count > max {
        return Err(LimitError::TooManyRules { count, max });
    }
    Ok(())
}

impl LimitsConfig {
    /// `--max-chains` and `--max-rules` for a parsed ruleset's `tables`: chains first (a
    /// ruleset of many empty chains has few rules). O(chains): called before the ruleset is
    /// validated, printed or compiled.
    pub fn check_tables(&self, tables: &[vallum_engine::model::Table]) -> Result<(), LimitError> {
        let chains = tables.iter().map(|t| t.chains.len()).sum();
        check_chains(chains, self.max_chains_per_ruleset)?;
        let rules = (tables.iter().flat_map(|t| &t.chains))
            .map(|c| c.rules.len())
            .sum();
        check_rules(rules, self.max_rules_per_ruleset)
    }
}

impl LimitsConfig {
    /// `--max-sets` and `--max-set-elements` before `new` sets (name, `maxelem`) are created
    /// beside the `existing` ones.
    pub fn check_new_sets<'a>(
        &self,
        existing: usize,
        new: impl IntoIterator<Item = (&'a str, u32)>,
    ) -> Result<(), LimitError> {
        let mut count = existing;
        for (set, maxelem) in new {
            if maxelem > self.max_set_elements {
                return Err(LimitError::SetTooLarge {
                    set: set.to_string(),
                    maxelem,
                    max: self.max_set_elements,
                });
            }
            count += 1;
        }
        if count > self.max_sets && count > existing {
            return Err(LimitError::TooManySets {
                count,
                max: self.max_sets,
            });
        }
        Ok(())
    }
}

/// Refuses a ruleset with more than `max` chains.
pub fn check_chains(count: usize, max: usize) -> Result<(), LimitError> {
    if count > max {
        return Err(LimitError::TooManyChains { count, max });
    }
    Ok(())
}

/// Refuses to create one more ruleset when `existing` already reach `max`.
pub fn check_rulesets(existing: usize, max: usize) -> Result<(), LimitError> {
    if existing >= max {
        return Err(LimitError::TooManyRulesets {
            count: existing,
            max,
        });
    }
    Ok(())
}

/// Refuses a request body of `size` bytes over `max` (for paths that read bytes themselves).
pub fn check_request_size(size: usize, max: usize) -> Result<(), LimitError> {
    if size > max {
        return Err(LimitError::RequestTooLarge { size, max });
    }
    Ok(())
}

/// The revision numbers to delete so that at most `keep` remain: the oldest first, never one in
/// `protected` (the active revision, one pending confirmation). `keep = 0` keeps all.
pub fn revisions_to_prune(numbers: &[u64], protected: &[u64], keep: usize) -> Vec<u64> {
    if keep == 0 || numbers.len() <= keep {
        return Vec::new();
    }
    let mut sorted = numbers.to_vec();
    sorted.sort_unstable();
    let mut excess = sorted.len() - keep;
    let mut out = Vec::new();
    for n in sorted {
        if excess == 0 {
            break;
        }
        if protected.contains(&n) {
            continue;
        }
        out.push(n);
        excess -= 1;
    }
    out
}

// === impl RequestLimitLayer ===

/// Rewrites tonic's answer to an oversized request (OUT_OF_RANGE, "decoded message length too
/// large") into RESOURCE_EXHAUSTED with `ErrorInfo.reason = REQUEST_TOO_LARGE`, and prost's
/// INTERNAL "failed to decode Protobuf message" (services generated with prost's codec: health)
/// into INVALID_ARGUMENT as `vallum_proto::codec::decode_failed`. tonic answers a
/// failed decode of a unary request with a trailers-only response, so the status is in the
/// response headers, where this layer looks. Other responses pass untouched.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimitLayer {
    max: usize,
}

impl RequestLimitLayer {
    /// A layer reporting `max` (bytes) as the limit.
    pub fn new(max: usize) -> RequestLimitLayer {
        RequestLimitLayer { max }
    }
}

impl<S> Layer<S> for RequestLimitLayer {
    type Service = RequestLimitService<S>;

    fn layer(&self, inner: S) -> RequestLimitService<S> {
        RequestLimitService {
            inner,
            max: self.max,
        }
    }
}

/// The service made by [`RequestLimitLayer`].
#[derive(Clone, Debug)]
pub struct RequestLimitService<S> {
    inner: S,
    max: usize,
}

/// The `found N bytes` number of tonic's message, if present.
fn found_size(message: &str) -> usize {
    message
        .split_once("found ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn rewrite<RB: Default>(resp: Response<RB>, max: usize) -> Response<RB> {
    let h = resp.headers();
    // INTERNAL from prost's codec (the health service's): the request did not decode, the
    // sender's error, answered as vallum.v1's own codec answers it.
    if h.get("grpc-status") == Some(&HeaderValue::from_static("13")) {
        if let Some(s) = Status::from_header_map(h)
            .filter(|s| s.message().starts_with("failed to decode Protobuf message"))
        {
            return vallum_proto::codec::decode_failed(s.message()).into_http();
        }
        return resp;
    }
    let out_of_range = h.get("grpc-status") == Some(&HeaderValue::from_static("11"));
    if !out_of_range {
        return resp;
    }
    let Some(status) = Status::from_header_map(h) else {
        return resp;
    };
    if !status
        .message()
        .contains("decoded message length too large")
    {
        return resp;
    }
    let size = found_size(status.message());
    Status::from(LimitError::RequestTooLarge { size, max }).into_http()
}

impl<S, B, RB> Service<http::Request<B>> for RequestLimitService<S>
where
    S: Service<http::Request<B>, Response = Response<RB>>,
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

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let fut = self.inner.call(req);
        let max = self.max;
        Box::pin(async move { fut.await.map(|r| rewrite(r, max)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::StatusExt;

    #[test]
    fn checks() {
        assert!(check_rules(10, 10).is_ok());
        let e = check_rules(11, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ruleset has 11 rules, more than the limit of 10 (--max-rules)"
        );
        let s = Status::from(e);
        assert_eq!(s.code(), Code::ResourceExhausted);
        let d = s.get_error_details();
        let info = d.error_info().unwrap();
        assert_eq!(info.reason, "TOO_MANY_RULES");
        assert_eq!(info.metadata["max"], "10");
        assert_eq!(d.bad_request().unwrap().field_violations[0].field, "source");

        let s = Status::from(check_chains(11, 10).unwrap_err());
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            s.message(),
            "ruleset has 11 chains, more than the limit of 10 (--max-chains)"
        );
        let d = s.get_error_details();
        let info = d.error_info().unwrap();
        assert_eq!(info.reason, "TOO_MANY_CHAINS");
        assert_eq!(info.metadata["limit"], "max-chains");
        assert_eq!(d.bad_request().unwrap().field_violations[0].field, "source");

        assert!(check_rulesets(1, 2).is_ok());
        let s = Status::from(check_rulesets(2, 2).unwrap_err());
        assert_eq!(s.code(), Code::ResourceExhausted);
        let s = Status::from(check_request_size(5, 4).unwrap_err());
        assert_eq!(
            s.get_details_error_info().unwrap().reason,
            "REQUEST_TOO_LARGE"
        );
    }

    #[test]
    fn set_limits() {
        let l = LimitsConfig {
            max_sets: 2,
            max_set_elements: 10,
            ..LimitsConfig::default()
        };
        assert!(l.check_new_sets(1, [("a", 10)]).is_ok());
        // Sets that exist already are not refused (a lowered limit stops only new ones).
        assert!(l.check_new_sets(5, []).is_ok());
        let e = l.check_new_sets(1, [("a", 1), ("b", 1)]).unwrap_err();
        assert_eq!(e, LimitError::TooManySets { count: 3, max: 2 });
        let s = Status::from(l.check_new_sets(0, [("a", 11)]).unwrap_err());
        assert_eq!(s.code(), Code::ResourceExhausted);
        let info = s.get_details_error_info().unwrap();
        assert_eq!(info.reason, "SET_TOO_LARGE");
        assert_eq!(info.metadata["limit"], "max-set-elements");
        assert_eq!(info.metadata["value"], "11");
    }

    #[test]
    fn prunes_oldest_but_protected() {
        assert_eq!(revisions_to_prune(&[1, 2, 3], &[], 3), Vec::<u64>::new());
        assert_eq!(revisions_to_prune(&[5, 1, 4, 2, 3], &[], 3), vec![1, 2]);
        assert_eq!(revisions_to_prune(&[1, 2, 3, 4, 5], &[1], 3), vec![2, 3]);
        assert_eq!(
            revisions_to_prune(&[1, 2, 3], &[1, 2, 3], 1),
            Vec::<u64>::new()
        );
        assert_eq!(revisions_to_prune(&[1, 2, 3], &[], 0), Vec::<u64>::new());
    }

    #[test]
    fn rewrites_tonic_size_error() {
        let tonic_err = Status::out_of_range(
            "Error, decoded message length too large: found 5000 bytes, the limit is: 100 bytes",
        );
        let r: Response<()> = rewrite(tonic_err.into_http(), 100);
        let s = Status::from_header_map(r.headers()).unwrap();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("5000 bytes"), "{}", s.message());
        let other: Response<()> = rewrite(Status::out_of_range("page 9").into_http(), 100);
        assert_eq!(
            Status::from_header_map(other.headers()).unwrap().code(),
            Code::OutOfRange
        );
    }
}
