//! A small etcd v3 client: the calls fleet mode makes (prefix range, put, compare-and-swap
//! and delete in one Txn, watch, lease grant and keep-alive, compact).
//!
//! Generated from `proto/etcd/rpc.proto`, a subset of etcd's API written from its reference
//! (same field numbers). Not the `etcd-client` crate: its build script runs a system `protoc`,
//! and Vallum builds with the Rust toolchain alone (protox).
//!
//! Endpoints: one lazily connecting channel each (creating a client never waits for etcd:
//! fail-static start); calls go to the current endpoint, and a call failing with UNAVAILABLE
//! (connection refused, member down) moves the client to the next one, so with one member
//! of three down at most one call per client fails. (tonic's `balance_list` kept sending a
//! share of the calls to the dead member.) `http://` endpoints are plaintext; `https://` ones
//! need a TLS config ([`Etcd::connect_with`], from `--fleet-ca`/`--fleet-cert`/`--fleet-key`):
//! rustls (tonic's `tls-ring`), the server name checked against the endpoint's host.
//!
//! Deadlines: every call is bounded (see [`Etcd`]): by the call timeout (vallumd's
//! `--fleet-call-timeout`, [`CALL_TIMEOUT`] by default) and by a caller's deadline
//! ([`Etcd::until`]); an etcd that does not answer in time is DEADLINE_EXCEEDED here, which
//! FleetService reports as FLEET_UNAVAILABLE.
//!
//! Leases: [`Etcd::keep_alive`] opens a LeaseKeepAlive stream by sending its first request
//! before it waits for the response headers (etcd answers nothing, headers included, before
//! a request); [`LeaseKeeper::renew`] then renews once per call and says when etcd no longer
//! knows the lease (TTL 0).
//!
//! Reads of a prefix that may hold thousands of keys (the nodes' reports) go page by page
//! ([`Etcd::range_prefix_paged`]): etcd caps one request at 1.5 MiB by default and a large
//! response costs it memory in one piece.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
// Call deadlines are on tokio's clock, not the injected `crate::clock::Clock`: they bound
// socket I/O with etcd (`timeout_at`, the `grpc-timeout` header), an I/O edge that must
// follow real time; tests drive tokio's clock with `tokio::time::pause`.
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use vallum_proto::etcdserverpb as pb;
use vallum_proto::etcdserverpb::kv_client::KvClient;
use vallum_proto::etcdserverpb::lease_client::LeaseClient;
use vallum_proto::etcdserverpb::watch_client::WatchClient;

pub use pb::KeyValue;

/// What an etcd call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// An endpoint is not a URL.
    #[error("etcd endpoint {endpoint:?}: {message}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// The call failed (etcd unreachable, or it refused the request).
    #[error("etcd: {}", .0.message())]
    Status(#[from] tonic::Status),
    /// A watch start revision was compacted: list again. Holds etcd's compact revision.
    #[error("etcd: revision compacted (oldest kept {0})")]
    Compacted(i64),
    /// The watch ended (etcd closed it or cancelled it for another reason).
    #[error("etcd: watch ended: {0}")]
    WatchEnded(String),
}

impl From<EtcdError> for crate::Error {
    fn from(e: EtcdError) -> Self {
        crate::Error::Fleet(e.to_string())
    }
}

/// Result of an etcd call.
pub type EtcdResult<T> = std::result::Result<T, EtcdError>;

/// The end of the range of every key starting with `prefix` (its last byte plus one).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): every key from `prefix` on.
    vec![0]
}

/// The outcome of a compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Swap {
    /// Done at this etcd revision.
    Done(i64),
    /// The key's mod revision was not the expected one: here is the current one (0: absent).
    Moved(i64),
}

/// One Range of [`Etcd::read_many`].
#[derive(Clone, Debug)]
pub struct Read(pb::RangeRequest);

impl Read {
    /// The key `key`.
    pub fn key(key: &str) -> Read {
        Read(pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })
    }

    /// The first `limit` keys under `prefix` (the response's `more` says whether there are
    /// others: [`Etcd::range_prefix_after`] reads them).
    pub fn prefix(prefix: &str, limit: usize) -> Read {
        Read(pb::RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix.as_bytes()),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            ..Default::default()
        })
    }

    /// Whether any key exists under `prefix`: limit 1, keys only.
    pub fn any_under(prefix: &str) -> Read {
        Read(pb::RangeRequest {
            keys_only: true,
            ..Read::prefix(prefix, 1).0
        })
    }
}

/// An etcd client (cheap to clone; clones share the current endpoint).
///
/// Every call waits at most [`Etcd::call_timeout`] (default [`CALL_TIMEOUT`], vallumd's
/// `--fleet-call-timeout`) and never past the deadline of [`Etcd::until`] (a FleetService
/// caller's): past it the call fails with DEADLINE_EXCEEDED, "etcd did not answer within
/// ...", and the client moves to the next endpoint (a hung member is as good as a dead one).
/// The remaining time also travels to etcd as a unary request's `grpc-timeout` (not a
/// stream's: etcd would end the stream there); a stream's opening (a watch's create, a
/// lease's first keep-alive) and each keep-alive answer are bounded here.
#[derive(Clone, Debug)]
pub struct Etcd {
    channels: Arc<Vec<Channel>>,
    current: Arc<AtomicUsize>,
    /// The longest one call may wait.
    timeout: Duration,
    /// No call of this clone waits past this (a caller's deadline).
    deadline: Option<Instant>,
}

/// What a unary request's `grpc-timeout` adds to the time left (see [`Etcd::request`]).
const HEADER_SLACK: Duration = Duration::from_millis(100);

/// The default of [`Etcd::call_timeout`]: 5 s, above etcd's own 5 s bound of a request it
/// is working on (`request timed out` after its election timeout plus 2 s), so etcd's own
/// answer comes first when etcd is alive but slow.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

const MAX_MESSAGE: usize = 64 << 20;

/// Operations per Txn of `Etcd::get_many`: etcd's default `--max-txn-ops`.
pub const TXN_OPS: usize = 128;

impl Etcd {
    /// A plaintext client over `endpoints` (`http://host:port`), connecting lazily.
    ///
    /// Errors: [`EtcdError::Endpoint`].
    pub fn connect(endpoints: &[String]) -> EtcdResult<Etcd> {
        Etcd::connect_with(endpoints, None)
    }

    /// A client over `endpoints`, connecting lazily: over TLS with `tls` (every endpoint
    /// `https://`), else plaintext (every endpoint `http://`).
    ///
    /// Errors: [`EtcdError::Endpoint`] for a URL that does not parse or whose scheme does
    /// not match `tls`.
    pub fn connect_with(endpoints: &[String], tls: Option<ClientTlsConfig>) -> EtcdResult<Etcd> {
        let mut list = Vec::new();
        for e in endpoints {
            let bad = |message: String| EtcdError::Endpoint {
                endpoint: e.clone(),
                message,
            };
            let https = e.starts_with("https://");
            match (&tls, https) {
                (Some(_), false) => {
                    return Err(bad(
                        "--fleet-ca/--fleet-cert are given: the endpoint must be https://".into(),
                    ));
                }
                (None, true) => {
                    return Err(bad(
                        "an https:// endpoint needs --fleet-ca (the CA of etcd's certificate)"
                            .into(),
                    ));
                }
                _ => {}
            }
            let mut ep = Endpoint::from_shared(e.clone()).map_err(|err| bad(err.to_string()))?;
            if let Some(tls) = &tls {
                ep = ep
                    .tls_config(tls.clone())
                    .map_err(|err| bad(format!("TLS: {err}")))?;
            }
            let ep = ep
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                // Above etcd's --grpc-keepalive-min-time (5 s): pinging at it gets GOAWAY
                // ("too many pings").
                .http2_keep_alive_interval(Duration::from_secs(15))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true);
            list.push(ep);
        }
        if list.is_empty() {
            return Err(EtcdError::Endpoint {
                endpoint: String::new(),
                message: "no endpoint given".into(),
            });
        }
        Ok(Etcd {
            channels: Arc::new(list.into_iter().map(|e| e.connect_lazy()).collect()),
            current: Arc::default(),
            timeout: CALL_TIMEOUT,
            deadline: None,
        })
    }

    /// This client with `timeout` as the longest one call may wait (at least 1 ms).
    pub fn call_timeout(mut self, timeout: Duration) -> Etcd {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest one call waits ([`Etcd::call_timeout`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A clone whose calls never wait past `deadline` (`None`: only the call timeout), e.g.
    /// a FleetService caller's deadline ([`super::service::caller_deadline`]).
    pub fn until(&self, deadline: Option<Instant>) -> Etcd {
        Etcd {
            deadline,
            ..self.clone()
        }
    }

    /// When a call starting now must have its answer.
    fn budget(&self) -> Instant {
        // tokio's clock: an etcd call's I/O deadline (see the import).
        let by_timeout = Instant::now() + self.timeout;
        self.deadline.map_or(by_timeout, |d| d.min(by_timeout))
    }

    /// `msg` as a request that carries the time left until `until` as its `grpc-timeout`,
    /// plus [`HEADER_SLACK`]: tonic's client enforces that header too (rounded to its unit),
    /// and [`Etcd::bounded`]'s own timer, with its message, is to fire first.
    fn request<T>(&self, msg: T, until: Instant) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        // tokio's clock: an etcd call's I/O deadline (see the import).
        r.set_timeout(until.saturating_duration_since(Instant::now()) + HEADER_SLACK);
        r
    }

    /// Waits for `call` until `until`; past it, DEADLINE_EXCEEDED ("etcd did not answer").
    async fn bounded<T>(
        &self,
        until: Instant,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        // tokio's clock: an etcd call's I/O deadline (see the import).
        let waited = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout_at(until, call).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            // Failed once the time was up: tonic's enforcement of the header, or etcd's.
            // tokio's clock: an etcd call's I/O deadline (see the import).
            Ok(Err(_)) if Instant::now() >= until => Err(timed_out(waited)),
            Ok(Err(s)) => Err(s),
            Err(_) => Err(timed_out(waited)),
        }
    }

    fn channel(&self) -> Channel {
        // Relaxed: an endpoint choice; any value is a valid index and nothing pairs with it.
        let i = self.current.load(Ordering::Relaxed) % self.channels.len();
        self.channels[i].clone()
    }

    fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel()).max_decoding_message_size(MAX_MESSAGE)
    }

    fn watch_client(&self) -> WatchClient<Channel> {
        WatchClient::new(self.channel()).max_decoding_message_size(MAX_MESSAGE)
    }

    fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel()).max_decoding_message_size(MAX_MESSAGE)
    }

    /// Moves to the next endpoint after an UNAVAILABLE answer or none in time; returns the
    /// error.
    fn failed(&self, s: tonic::Status) -> EtcdError {
        if matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded
        ) {
            // Relaxed: as in `channel`.
            self.current.fetch_add(1, Ordering::Relaxed);
        }
        EtcdError::Status(s)
    }

    /// Every key under `prefix` at `revision` (0: the newest), and the store revision read.
    ///
    /// Errors: [`EtcdError::Status`]; [`EtcdError::Compacted`] for a compacted `revision`.
    pub async fn range_prefix(
        &self,
        prefix: &str,
        revision: i64,
    ) -> EtcdResult<(i64, Vec<KeyValue>)> {
        let until = self.budget();
        let request = self.request(
            pb::RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix.as_bytes()),
                revision,
                ..Default::default()
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().range(request))
            .await
            .map_err(|s| match compacted(s, revision) {
                EtcdError::Status(s) => self.failed(s),
                other => other,
            })?;
        Ok((r.header.map_or(0, |h| h.revision), r.kvs))
    }

    /// Every key under `prefix` at `revision` (0: the newest), `page` keys per request
    /// (etcd Range with `limit`, continuing after the last key read, every page at the
    /// revision of the first), handed to `each`; returns the store revision read.
    ///
    /// Errors: as [`Etcd::range_prefix`].
    pub async fn range_prefix_paged(
        &self,
        prefix: &str,
        revision: i64,
        page: usize,
        mut each: impl FnMut(KeyValue),
    ) -> EtcdResult<i64> {
        let end = prefix_end(prefix.as_bytes());
        let mut from = prefix.as_bytes().to_vec();
        let mut at = revision;
        loop {
            let until = self.budget();
            let request = self.request(
                pb::RangeRequest {
                    key: from.clone(),
                    range_end: end.clone(),
                    revision: at,
                    limit: i64::try_from(page).unwrap_or(i64::MAX),
                    ..Default::default()
                },
                until,
            );
            let r = self
                .bounded(until, self.kv().range(request))
                .await
                .map_err(|s| match compacted(s, at) {
                    EtcdError::Status(s) => self.failed(s),
                    other => other,
                })?;
            if at == 0 {
                at = r.header.map_or(0, |h| h.revision);
            }
            let more = r.more;
            let Some(last) = r.kvs.last().map(|kv| kv.key.clone()) else {
                return Ok(at);
            };
            r.kvs.into_iter().for_each(&mut each);
            if !more {
                return Ok(at);
            }
            // The smallest key after `last`.
            from = last;
            from.push(0);
        }
    }

    /// Every key under `prefix` after `after` (exclusive) at `revision`, `page` keys per
    /// request, handed to `each`: the rest of a prefix whose first page came from
    /// [`Etcd::read_many`] at `revision`. Serializable reads (no raft read index: the
    /// revision pins what they see, and the member that answered the first page has it), so
    /// the pages do not queue behind a burst of writes; a member that does not have
    /// `revision` yet (the client moved to another) is asked again linearizably.
    ///
    /// Errors: as [`Etcd::range_prefix`].
    pub async fn range_prefix_after(
        &self,
        prefix: &str,
        after: &[u8],
        revision: i64,
        page: usize,
        mut each: impl FnMut(KeyValue),
    ) -> EtcdResult<()> {
        let end = prefix_end(prefix.as_bytes());
        let mut from = after.to_vec();
        from.push(0);
        loop {
            let mut request = pb::RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                revision,
                limit: i64::try_from(page).unwrap_or(i64::MAX),
                serializable: true,
                ..Default::default()
            };
            let until = self.budget();
            let first = self.request(request.clone(), until);
            let r = match self.bounded(until, self.kv().range(first)).await {
                Err(s) if s.message().contains("future revision") => {
                    request.serializable = false;
                    let again = self.request(request, until);
                    self.bounded(until, self.kv().range(again)).await
                }
                other => other,
            }
            .map_err(|s| match compacted(s, revision) {
                EtcdError::Status(s) => self.failed(s),
                other => other,
            })?;
            let more = r.more;
            let Some(last) = r.kvs.last().map(|kv| kv.key.clone()) else {
                return Ok(());
            };
            r.kvs.into_iter().for_each(&mut each);
            if !more {
                return Ok(());
            }
            from = last;
            from.push(0);
        }
    }

    /// The reads `reads` in one Txn: one round trip and one linearizable read, every read at
    /// the same revision; returns that revision and each read's response, in order.
    ///
    /// Errors: [`EtcdError::Status`] (also for more reads than etcd's `--max-txn-ops`).
    pub async fn read_many(&self, reads: &[Read]) -> EtcdResult<(i64, Vec<pb::RangeResponse>)> {
        let until = self.budget();
        let request = self.request(
            pb::TxnRequest {
                compare: Vec::new(),
                success: reads
                    .iter()
                    .map(|read| pb::RequestOp {
                        request: Some(pb::request_op::Request::RequestRange(read.0.clone())),
                    })
                    .collect(),
                failure: Vec::new(),
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().txn(request))
            .await
            .map_err(|e| self.failed(e))?;
        let revision = r.header.map_or(0, |h| h.revision);
        let out = r
            .responses
            .into_iter()
            .map(|op| match op.response {
                Some(pb::response_op::Response::ResponseRange(rr)) => rr,
                _ => pb::RangeResponse::default(),
            })
            .collect();
        Ok((revision, out))
    }

    /// The key `key`, if present.
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn get(&self, key: &str) -> EtcdResult<Option<KeyValue>> {
        self.get_at(key, 0).await
    }

    /// The key `key` at `revision` (0: the newest), if present then.
    ///
    /// Errors: [`EtcdError::Status`]; [`EtcdError::Compacted`] for a compacted `revision`.
    pub async fn get_at(&self, key: &str, revision: i64) -> EtcdResult<Option<KeyValue>> {
        let until = self.budget();
        let request = self.request(
            pb::RangeRequest {
                key: key.as_bytes().to_vec(),
                revision,
                ..Default::default()
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().range(request))
            .await
            .map_err(|s| match compacted(s, revision) {
                EtcdError::Status(s) => self.failed(s),
                other => other,
            })?;
        Ok(r.kvs.into_iter().next())
    }

    /// Puts `value` at `key` (on `lease`, 0 for none); returns the etcd revision of the write.
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn put(&self, key: &str, value: Vec<u8>, lease: i64) -> EtcdResult<i64> {
        let until = self.budget();
        let request = self.request(
            pb::PutRequest {
                key: key.as_bytes().to_vec(),
                value,
                lease,
                prev_kv: false,
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().put(request))
            .await
            .map_err(|e| self.failed(e))?;
        Ok(r.header.map_or(0, |h| h.revision))
    }

    /// Puts `value` at `key` in one Txn, if the key's mod revision is `expect` (0: the key
    /// does not exist) or unconditionally for `None`.
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn put_if(&self, key: &str, value: Vec<u8>, expect: Option<i64>) -> EtcdResult<Swap> {
        let put = pb::request_op::Request::RequestPut(pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            ..Default::default()
        });
        self.swap(key, expect, put).await
    }

    /// Deletes `key` in one Txn, if its mod revision is `expect` (or unconditionally for
    /// `None`), and with it every key under `with_prefix` (when given); `Moved(0)` when the
    /// key does not exist.
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn delete_if(
        &self,
        key: &str,
        expect: Option<i64>,
        with_prefix: Option<&str>,
    ) -> EtcdResult<Swap> {
        // "Exists" is mod revision > 0; with an expected revision, equality implies it.
        let expect = Some(expect.unwrap_or(-1));
        let mut ops = vec![pb::request_op::Request::RequestDeleteRange(
            pb::DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            },
        )];
        if let Some(prefix) = with_prefix {
            ops.push(pb::request_op::Request::RequestDeleteRange(
                pb::DeleteRangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix.as_bytes()),
                    ..Default::default()
                },
            ));
        }
        self.swap_ops(key, expect, ops).await
    }

    /// Deletes every key under `prefix`; returns the etcd revision.
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn delete_prefix(&self, prefix: &str) -> EtcdResult<i64> {
        let until = self.budget();
        let request = self.request(
            pb::DeleteRangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix.as_bytes()),
                ..Default::default()
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().delete_range(request))
            .await
            .map_err(|e| self.failed(e))?;
        Ok(r.header.map_or(0, |h| h.revision))
    }

    /// Whether any key exists under `prefix` at `revision` (0: the newest): one Range of
    /// limit 1, keys only.
    ///
    /// Errors: as [`Etcd::range_prefix`].
    pub async fn any_under(&self, prefix: &str, revision: i64) -> EtcdResult<bool> {
        let until = self.budget();
        let request = self.request(
            pb::RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix.as_bytes()),
                revision,
                limit: 1,
                keys_only: true,
                ..Default::default()
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().range(request))
            .await
            .map_err(|s| match compacted(s, revision) {
                EtcdError::Status(s) => self.failed(s),
                other => other,
            })?;
        Ok(!r.kvs.is_empty())
    }

    /// The keys `keys` (each `None` when absent) as of `revision` (a revision this client
    /// read, e.g. by [`Etcd::read_many`]), [`TXN_OPS`] at a time in one Txn of Range
    /// operations each. Serializable, as [`Etcd::range_prefix_after`]: no raft read index;
    /// a member that does not have `revision` yet is asked again linearizably.
    ///
    /// Errors: [`EtcdError::Status`]; [`EtcdError::Compacted`] for a compacted `revision`.
    pub async fn get_many_at(
        &self,
        keys: &[String],
        revision: i64,
    ) -> EtcdResult<Vec<Option<KeyValue>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(TXN_OPS) {
            let txn = |serializable: bool| pb::TxnRequest {
                compare: Vec::new(),
                success: chunk
                    .iter()
                    .map(|k| pb::RequestOp {
                        request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                            key: k.as_bytes().to_vec(),
                            revision,
                            serializable,
                            ..Default::default()
                        })),
                    })
                    .collect(),
                failure: Vec::new(),
            };
            let until = self.budget();
            let first = self.request(txn(true), until);
            let r = match self.bounded(until, self.kv().txn(first)).await {
                Err(s) if s.message().contains("future revision") => {
                    let again = self.request(txn(false), until);
                    self.bounded(until, self.kv().txn(again)).await
                }
                other => other,
            }
            .map_err(|s| match compacted(s, revision) {
                EtcdError::Status(s) => self.failed(s),
                other => other,
            })?;
            for op in r.responses {
                out.push(match op.response {
                    Some(pb::response_op::Response::ResponseRange(rr)) => rr.kvs.into_iter().next(),
                    _ => None,
                });
            }
        }
        Ok(out)
    }

    /// `op` if the key's mod revision is `expect` (-1: any existing key).
    async fn swap(
        &self,
        key: &str,
        expect: Option<i64>,
        op: pb::request_op::Request,
    ) -> EtcdResult<Swap> {
        self.swap_ops(key, expect, vec![op]).await
    }

    /// `ops`, in one Txn, if the key's mod revision is `expect` (-1: any existing key).
    async fn swap_ops(
        &self,
        key: &str,
        expect: Option<i64>,
        ops: Vec<pb::request_op::Request>,
    ) -> EtcdResult<Swap> {
        use pb::compare::{CompareResult, CompareTarget, TargetUnion};
        let compare = expect.map(|rev| {
            let (result, rev) = if rev < 0 {
                (CompareResult::Greater, 0)
            } else {
                (CompareResult::Equal, rev)
            };
            pb::Compare {
                result: result as i32,
                target: CompareTarget::Mod as i32,
                key: key.as_bytes().to_vec(),
                target_union: Some(TargetUnion::ModRevision(rev)),
            }
        });
        let read = pb::request_op::Request::RequestRange(pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            keys_only: true,
            ..Default::default()
        });
        let until = self.budget();
        let request = self.request(
            pb::TxnRequest {
                compare: compare.into_iter().collect(),
                success: ops
                    .into_iter()
                    .map(|op| pb::RequestOp { request: Some(op) })
                    .collect(),
                failure: vec![pb::RequestOp {
                    request: Some(read),
                }],
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().txn(request))
            .await
            .map_err(|e| self.failed(e))?;
        if r.succeeded {
            return Ok(Swap::Done(r.header.map_or(0, |h| h.revision)));
        }
        let current = r
            .responses
            .into_iter()
            .find_map(|op| match op.response {
                Some(pb::response_op::Response::ResponseRange(rr)) => {
                    Some(rr.kvs.first().map_or(0, |kv| kv.mod_revision))
                }
                _ => None,
            })
            .unwrap_or(0);
        Ok(Swap::Moved(current))
    }

    /// Deletes `key`; returns the etcd revision.
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn delete(&self, key: &str) -> EtcdResult<i64> {
        let until = self.budget();
        let request = self.request(
            pb::DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            },
            until,
        );
        let r = self
            .bounded(until, self.kv().delete_range(request))
            .await
            .map_err(|e| self.failed(e))?;
        Ok(r.header.map_or(0, |h| h.revision))
    }

    /// Compacts the store's history up to `revision` (waits until it is physical).
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn compact(&self, revision: i64) -> EtcdResult<()> {
        let until = self.budget();
        let request = self.request(
            pb::CompactionRequest {
                revision,
                physical: true,
            },
            until,
        );
        self.bounded(until, self.kv().compact(request))
            .await
            .map_err(|e| self.failed(e))?;
        Ok(())
    }

    /// Grants a lease of `ttl` seconds; returns its id and the TTL etcd granted (etcd
    /// raises a TTL below its minimum, 1.5 election timeouts rounded up to a second).
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn lease_grant(&self, ttl: i64) -> EtcdResult<(i64, i64)> {
        let until = self.budget();
        let request = self.request(pb::LeaseGrantRequest { ttl, id: 0 }, until);
        let r = self
            .bounded(until, self.lease().lease_grant(request))
            .await
            .map_err(|e| self.failed(e))?;
        if !r.error.is_empty() {
            return Err(tonic::Status::unavailable(r.error).into());
        }
        Ok((r.id, r.ttl))
    }

    /// Revokes lease `id` (its keys are deleted).
    ///
    /// Errors: [`EtcdError::Status`].
    pub async fn lease_revoke(&self, id: i64) -> EtcdResult<()> {
        let until = self.budget();
        let request = self.request(pb::LeaseRevokeRequest { id }, until);
        self.bounded(until, self.lease().lease_revoke(request))
            .await
            .map_err(|e| self.failed(e))?;
        Ok(())
    }

    /// Opens a LeaseKeepAlive stream for lease `id` and renews it once; returns the stream
    /// and the TTL etcd granted (0: the lease does not exist any more).
    ///
    /// The first request goes into the stream *before* the call waits for etcd's response
    /// headers: etcd sends nothing, headers included, until it has a request (as the watch's
    /// create request, [`Etcd::watch_prefix`]). The whole exchange waits at most the call
    /// timeout.
    ///
    /// Errors: [`EtcdError::Status`] (DEADLINE_EXCEEDED when etcd did not answer in time),
    /// [`EtcdError::WatchEnded`] when etcd closed the stream.
    pub async fn keep_alive(&self, id: i64) -> EtcdResult<(LeaseKeeper, i64)> {
        let (tx, rx) = mpsc::channel(1);
        tx.send(pb::LeaseKeepAliveRequest { id })
            .await
            .map_err(|_| EtcdError::WatchEnded("keep-alive request stream closed".into()))?;
        let until = self.budget();
        // No `grpc-timeout` on a stream: etcd would end it there.
        let request = tonic::Request::new(ReceiverStream::new(rx));
        let responses = self
            .bounded(until, self.lease().lease_keep_alive(request))
            .await
            .map_err(|e| self.failed(e))?;
        let mut keeper = LeaseKeeper {
            etcd: self.clone(),
            id,
            requests: tx,
            responses,
        };
        let ttl = keeper.answer(until).await?;
        Ok((keeper, ttl))
    }

    /// Watches every key under `prefix` from `start` (inclusive).
    ///
    /// Errors: [`EtcdError::Status`]; [`EtcdError::Compacted`] when `start` was compacted.
    pub async fn watch_prefix(&self, prefix: &str, start: i64) -> EtcdResult<Watcher> {
        let (tx, rx) = mpsc::channel(4);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix.as_bytes()),
                    start_revision: start,
                    progress_notify: true,
                    ..Default::default()
                },
            )),
        };
        tx.send(create)
            .await
            .map_err(|_| EtcdError::WatchEnded("request stream closed".into()))?;
        // The create and its answer wait at most the call timeout; the events after it as
        // long as the caller reads them.
        let until = self.budget();
        // No `grpc-timeout` on a stream: etcd would end it there.
        let request = tonic::Request::new(ReceiverStream::new(rx));
        let mut stream = self
            .bounded(until, self.watch_client().watch(request))
            .await
            .map_err(|e| self.failed(e))?;
        // The first response says whether the watch was created (or compacted).
        let mut w = Watcher {
            etcd: self.clone(),
            _requests: tx,
            stream: None,
            first: None,
        };
        let first = tokio::time::timeout_at(until, stream.message())
            .await
            // tokio's clock: an etcd call's I/O deadline (see the import).
            .unwrap_or_else(|_| Err(timed_out(until.saturating_duration_since(Instant::now()))));
        match first.map_err(|e| self.failed(e))? {
            Some(r) => {
                check_response(&r)?;
                if !r.events.is_empty() {
                    w.first = Some(r);
                }
            }
            None => return Err(EtcdError::WatchEnded("no response to create".into())),
        }
        w.stream = Some(stream);
        Ok(w)
    }
}

/// DEADLINE_EXCEEDED: etcd did not answer within `waited`.
fn timed_out(waited: Duration) -> tonic::Status {
    tonic::Status::deadline_exceeded(format!(
        "etcd did not answer within {:.1} s (vallumd --fleet-call-timeout, or the caller's deadline)",
        waited.as_secs_f64()
    ))
}

// === impl LeaseKeeper ===

/// An open LeaseKeepAlive stream of one lease ([`Etcd::keep_alive`]).
#[derive(Debug)]
pub struct LeaseKeeper {
    etcd: Etcd,
    id: i64,
    requests: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    responses: tonic::Streaming<pb::LeaseKeepAliveResponse>,
}

impl LeaseKeeper {
    /// The lease id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Renews the lease once: sends a keep-alive and waits for its answer (at most the
    /// call timeout); returns the TTL etcd granted, seconds (0: the lease is gone: expired,
    /// revoked, or etcd restored from a snapshot without it).
    ///
    /// Errors: as [`Etcd::keep_alive`].
    pub async fn renew(&mut self) -> EtcdResult<i64> {
        let until = self.etcd.budget();
        self.requests
            .send(pb::LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| EtcdError::WatchEnded("keep-alive stream closed".into()))?;
        self.answer(until).await
    }

    /// The next answer, by `until`.
    async fn answer(&mut self, until: Instant) -> EtcdResult<i64> {
        // tokio's clock: an etcd call's I/O deadline (see the import).
        let waited = until.saturating_duration_since(Instant::now());
        let r = tokio::time::timeout_at(until, self.responses.message())
            .await
            .unwrap_or_else(|_| Err(timed_out(waited)))
            .map_err(|e| self.etcd.failed(e))?;
        match r {
            Some(r) => Ok(r.ttl.max(0)),
            None => Err(EtcdError::WatchEnded("keep-alive stream ended".into())),
        }
    }
}

fn compacted(s: tonic::Status, revision: i64) -> EtcdError {
    if s.message().contains("compacted") {
        EtcdError::Compacted(revision)
    } else {
        EtcdError::Status(s)
    }
}

fn check_response(r: &pb::WatchResponse) -> EtcdResult<()> {
    if r.compact_revision > 0 {
        return Err(EtcdError::Compacted(r.compact_revision));
    }
    if r.canceled {
        return Err(EtcdError::WatchEnded(if r.cancel_reason.is_empty() {
            "cancelled by etcd".into()
        } else {
            r.cancel_reason.clone()
        }));
    }
    Ok(())
}

/// A running watch.
#[derive(Debug)]
pub struct Watcher {
    /// For moving to the next endpoint when the stream fails.
    etcd: Etcd,
    /// Kept open: dropping it would end the watch.
    _requests: mpsc::Sender<pb::WatchRequest>,
    stream: Option<tonic::Streaming<pb::WatchResponse>>,
    first: Option<pb::WatchResponse>,
}

impl Watcher {
    /// The next response with events, or a progress notification (no events; its header
    /// says the store revision every event up to which was sent).
    ///
    /// Errors: [`EtcdError::Status`], [`EtcdError::Compacted`], [`EtcdError::WatchEnded`].
    pub async fn next(&mut self) -> EtcdResult<pb::WatchResponse> {
        if let Some(r) = self.first.take() {
            return Ok(r);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(EtcdError::WatchEnded("not started".into()));
        };
        match stream.message().await.map_err(|e| self.etcd.failed(e))? {
            Some(r) => {
                check_response(&r)?;
                Ok(r)
            }
            None => Err(EtcdError::WatchEnded("stream ended".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
