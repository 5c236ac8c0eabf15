//! The gRPC listener's connections: how many there are and from whom, how long one may stay
//! without a request, and how many request bytes all of them hold together.
//!
//! - Caps ([`Connections::admit`]): at most `--max-connections` open TCP connections, at most
//!   `--max-connections-per-peer` from one IP address. A connection over either cap is closed
//!   as soon as it is accepted, before anything is read from it (the client sees the
//!   connection close; a gRPC client reports UNAVAILABLE).
//! - Accepting ([`Connections::incoming`]): a failed `accept` for lack of descriptors or
//!   memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) pauses accepting, 10 ms at first and doubling to
//!   1 s while it keeps failing, with one warning per run of failures; the connection waits in
//!   the kernel's backlog meanwhile. Other accept errors (a peer that reset before `accept`)
//!   are skipped.
//! - Deadlines ([`Guarded`]): a connection must deliver a whole first request (TLS handshake,
//!   HTTP/2 preface, SETTINGS, HEADERS and the request message) within
//!   `--handshake-timeout`, and later a whole next request within `--idle-timeout` of the last
//!   answer; a connection with a request being answered (a Watch stream included) is never
//!   closed for it. A request whose message stalls half sent does not count as being
//!   answered. A closed connection frees what it held. HTTP/2 keepalive pings (hyper, through
//!   tonic's builder, [`ConnectionsConfig::keepalive`]) drop a peer that stops answering.
//! - Buffered bytes ([`ConnectionLayer`]): the request bytes read off every connection (the
//!   TCP listener and the local socket) and not yet decoded into a message are at most
//!   `--max-buffered-request-bytes` together; a request whose next bytes would pass it fails
//!   with RESOURCE_EXHAUSTED `REQUEST_BUFFERS_FULL` and its bytes are freed. A message counts
//!   with the length its 5-byte gRPC prefix declares as soon as the prefix arrives (tonic
//!   reserves that much for it then; up to `--max-request-bytes`, past which tonic refuses
//!   it), so a few bytes that declare 4 MiB count as 4 MiB.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::codegen::Bytes;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};
use tower_layer::Layer;
use tower_service::Service;

use crate::config::parse_seconds;
use crate::grpc::limits::LimitError;

/// Default [`ConnectionsConfig::max_connections`]: 1,024 (the unit's `LimitNOFILE=8192` leaves
/// room for the store, the packet sources and /metrics).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default [`ConnectionsConfig::max_connections_per_peer`].
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 128;
/// Default [`ConnectionsConfig::handshake_timeout`], seconds.
pub const DEFAULT_HANDSHAKE_TIMEOUT_SECS: u64 = 20;
/// Default [`ConnectionsConfig::idle_timeout`], seconds.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 300;
/// Default [`ConnectionsConfig::keepalive_interval`], seconds.
pub const DEFAULT_KEEPALIVE_INTERVAL_SECS: u64 = 60;
/// Default [`ConnectionsConfig::keepalive_timeout`], seconds.
pub const DEFAULT_KEEPALIVE_TIMEOUT_SECS: u64 = 20;
/// Default [`ConnectionsConfig::max_buffered_request_bytes`]: 64 MiB, sixteen requests of the
/// default `--max-request-bytes` at once.
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: usize = 64 << 20;
/// The largest header block (HPACK-decoded) a request may carry, bytes: gRPC requests carry a
/// few hundred bytes of headers (a token, a deadline); h2's default is 16 MiB.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;
/// HTTP/2 streams open at once on one connection (gRPC calls in flight).
pub const MAX_CONCURRENT_STREAMS: u32 = 64;

/// First and longest pause of the accept loop after EMFILE and the like.
const ACCEPT_PAUSE: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Connection flags of `vallumd`; flattened into the server's clap parser.
#[derive(Clone, Debug, clap::Args)]
pub struct ConnectionsConfig {
    /// Most open gRPC TCP connections; more are closed as soon as they are accepted.
    #[arg(long, env = "VALLUM_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Most open gRPC TCP connections from one IP address.
    #[arg(
        long,
        env = "VALLUM_MAX_CONNECTIONS_PER_PEER",
        default_value_t = DEFAULT_MAX_CONNECTIONS_PER_PEER
    )]
    pub max_connections_per_peer: usize,
    /// Seconds a new connection has to deliver its first whole request (TLS handshake,
    /// HTTP/2 preface, headers and message); it is closed otherwise.
    #[arg(long, env = "VALLUM_HANDSHAKE_TIMEOUT", default_value = "20", value_parser = parse_seconds)]
    pub handshake_timeout: Duration,
    /// Seconds a connection may stay with no request being answered; it is closed then.
    #[arg(long, env = "VALLUM_IDLE_TIMEOUT", default_value = "300", value_parser = parse_seconds)]
    pub idle_timeout: Duration,
    /// Seconds between HTTP/2 keepalive pings on every connection.
    #[arg(long, env = "VALLUM_KEEPALIVE_INTERVAL", default_value = "60", value_parser = parse_seconds)]
    pub keepalive_interval: Duration,
    /// Seconds a peer has to answer a keepalive ping before its connection is closed.
    #[arg(long, env = "VALLUM_KEEPALIVE_TIMEOUT", default_value = "20", value_parser = parse_seconds)]
    pub keepalive_timeout: Duration,
    /// Most request bytes received and not yet decoded, all connections together.
    #[arg(
        long,
        env = "VALLUM_MAX_BUFFERED_REQUEST_BYTES",
        default_value_t = DEFAULT_MAX_BUFFERED_REQUEST_BYTES
    )]
    pub max_buffered_request_bytes: usize,
}

impl Default for ConnectionsConfig {
    fn default() -> ConnectionsConfig {
        ConnectionsConfig {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            handshake_timeout: Duration::from_secs(DEFAULT_HANDSHAKE_TIMEOUT_SECS),
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS),
            keepalive_interval: Duration::from_secs(DEFAULT_KEEPALIVE_INTERVAL_SECS),
            keepalive_timeout: Duration::from_secs(DEFAULT_KEEPALIVE_TIMEOUT_SECS),
            max_buffered_request_bytes: DEFAULT_MAX_BUFFERED_REQUEST_BYTES,
        }
    }
}

impl ConnectionsConfig {
    /// `(interval, timeout)` of the HTTP/2 keepalive pings, for tonic's
    /// `http2_keepalive_interval` / `http2_keepalive_timeout`.
    pub fn keepalive(&self) -> (Duration, Duration) {
        (self.keepalive_interval, self.keepalive_timeout)
    }
}

// === impl Connections ===

/// The open connections of the TCP listener (per peer and in all) and the request bytes
/// buffered on every listener; one per vallumd.
#[derive(Debug)]
pub struct Connections {
    config: ConnectionsConfig,
    /// Open connections per peer address; the sum is the total.
    peers: Mutex<HashMap<IpAddr, usize>>,
    open: AtomicUsize,
    buffered: Arc<Budget>,
}

impl Connections {
    /// Counters for `config`, nothing open yet.
    pub fn new(config: &ConnectionsConfig) -> Arc<Connections> {
        Arc::new(Connections {
            config: config.clone(),
            peers: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            buffered: Arc::new(Budget {
                used: AtomicUsize::new(0),
                max: config.max_buffered_request_bytes,
            }),
        })
    }

    /// Open connections now (the TCP listener's).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Request bytes buffered now (every listener's).
    pub fn buffered(&self) -> usize {
        self.buffered.used.load(Ordering::Relaxed)
    }

    /// The layer that counts buffered request bytes and tells each connection when it has a
    /// request being answered (for every listener); `max_message` is `--max-request-bytes`
    /// (a declared length past it is not reserved: tonic refuses the message).
    pub fn layer(&self, max_message: usize) -> ConnectionLayer {
        ConnectionLayer {
            budget: self.buffered.clone(),
            max_message,
        }
    }

    /// `stream` from `peer`, as a [`Guarded`] connection, or `None` (and the stream closed)
    /// when it is over `--max-connections` or `--max-connections-per-peer`.
    pub fn admit(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr) -> Option<Guarded> {
        let ip = peer.ip();
        {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            let from_peer = peers.get(&ip).copied().unwrap_or(0);
            let total = self.open.load(Ordering::Relaxed);
            if total >= self.config.max_connections
                || from_peer >= self.config.max_connections_per_peer
            {
                tracing::debug!(
                    %peer,
                    total,
                    from_peer,
                    "connection refused: over --max-connections or --max-connections-per-peer"
                );
                return None;
            }
            peers.insert(ip, from_peer + 1);
            // Relaxed: the count is changed only under the `peers` lock; readers outside it
            // (`open`, metrics) want an estimate.
            self.open.fetch_add(1, Ordering::Relaxed);
        }
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity {
            state: Mutex::new(ActivityState {
                active: 0,
                begun: false,
                // tokio's clock: starts a socket's idle timer (`Sleep` below), an I/O deadline.
                since: Instant::now(),
                waker: None,
            }),
            handshake: self.config.handshake_timeout,
            idle: self.config.idle_timeout,
        });
        Some(Guarded {
            timer: Box::pin(tokio::time::sleep(self.config.handshake_timeout)),
            io: stream,
            activity,
            _slot: Slot {
                connections: self.clone(),
                peer: ip,
            },
        })
    }

    /// The connections of `listener`, each admitted by [`Connections::admit`], for tonic's
    /// `serve_with_incoming`. The stream never yields an error: accept errors are handled
    /// here (the module docs).
    pub fn incoming(
        self: &Arc<Self>,
        listener: TcpListener,
    ) -> impl Stream<Item = io::Result<Guarded>> + Send + 'static {
        let state = (listener, self.clone(), ACCEPT_PAUSE.0, false);
        futures_util::stream::unfold(
            state,
            |(listener, conns, mut pause, mut warned)| async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, peer)) => {
                            pause = ACCEPT_PAUSE.0;
                            warned = false;
                            if let Some(g) = conns.admit(stream, peer) {
                                return Some((Ok(g), (listener, conns, pause, warned)));
                            }
                        }
                        Err(e) if out_of_resources(&e) => {
                            if !warned {
                                tracing::warn!(
                                    error = %e,
                                    open = conns.open(),
                                    "accept failed: {e}; accepting again in up to {} ms \
                                     (raise LimitNOFILE, or lower --max-connections)",
                                    ACCEPT_PAUSE.1.as_millis()
                                );
                                warned = true;
                            }
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(ACCEPT_PAUSE.1);
                        }
                        Err(e) => tracing::debug!(error = %e, "accept failed"),
                    }
                }
            },
        )
    }
}

/// EMFILE, ENFILE, ENOBUFS, ENOMEM: `accept` fails until something is freed, so retrying at
/// once would spin.
pub(crate) fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// One admitted connection's place in the counts, given back on drop.
#[derive(Debug)]
struct Slot {
    connections: Arc<Connections>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut peers = (self.connections.peers.lock()).unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = peers.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                peers.remove(&self.peer);
            }
        }
        self.connections.open.fetch_sub(1, Ordering::Relaxed);
    }
}

// === impl Activity ===

/// Whether a connection has a request being answered, and since when it has had none.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
    handshake: Duration,
    idle: Duration,
}

#[derive(Debug)]
struct ActivityState {
    /// Requests received whole and not yet answered (their response not yet finished).
    active: usize,
    /// Whether a first request was received whole.
    begun: bool,
    /// When `active` last became 0 (or the connection was accepted).
    since: Instant,
    /// The connection's reader, woken when `active` becomes 0 (its deadline starts).
    waker: Option<Waker>,
}

impl Activity {
    /// When the connection is to be closed, `None` while a request is being answered;
    /// remembers `waker` to be woken when that changes.
    fn deadline(&self, waker: &Waker) -> Option<Instant> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            s.waker = Some(waker.clone());
        }
        (s.active == 0).then(|| s.since + if s.begun { self.idle } else { self.handshake })
    }

    fn begin(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.active += 1;
        s.begun = true;
    }

    fn end(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.active -= 1;
        if s.active == 0 {
            // tokio's clock: restarts the socket's idle timer, an I/O deadline.
            s.since = Instant::now();
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    }
}

// === impl Guarded ===

/// An admitted TCP connection: its place in the caps (given back when it is dropped) and its
/// deadline (see the module docs). Reads fail with `TimedOut` once the deadline passed, which
/// ends the connection.
#[derive(Debug)]
pub struct Guarded {
    io: TcpStream,
    activity: Arc<Activity>,
    timer: Pin<Box<Sleep>>,
    _slot: Slot,
}

/// What a request on a [`Guarded`] connection finds in its extensions: the TCP addresses
/// (also inserted as tonic's `TcpConnectInfo`, so `Request::remote_addr` works) and the
/// connection's activity.
#[derive(Clone, Debug)]
pub struct GuardedInfo {
    tcp: TcpConnectInfo,
    activity: Arc<Activity>,
}

impl Connected for Guarded {
    type ConnectInfo = GuardedInfo;

    fn connect_info(&self) -> GuardedInfo {
        GuardedInfo {
            tcp: self.io.connect_info(),
            activity: self.activity.clone(),
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // The h2 connection always has a read pending, so this is where the deadline is kept;
        // `Activity::end` wakes it when a deadline starts.
        if let Some(deadline) = this.activity.deadline(cx.waker()) {
            if this.timer.deadline() != deadline {
                this.timer.as_mut().reset(deadline);
            }
            if this.timer.as_mut().poll(cx).is_ready() {
                tracing::debug!(
                    peer = ?this.io.peer_addr().ok(),
                    "connection closed: no whole request within --handshake-timeout or \
                     --idle-timeout"
                );
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request within --handshake-timeout / --idle-timeout",
                )));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

// === impl Budget ===

/// Request bytes buffered on every connection, and the most there may be.
#[derive(Debug)]
struct Budget {
    used: AtomicUsize,
    max: usize,
}

impl Budget {
    /// Takes `n` bytes; false (nothing taken) when that would pass the maximum.
    fn take(&self, n: usize) -> bool {
        // Relaxed: the counter orders nothing else; the update is atomic, so the sum never
        // passes `max`.
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(n).filter(|v| *v <= self.max)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

// === impl ConnectionLayer ===

/// Counts each request's bytes against `--max-buffered-request-bytes` until the request is
/// decoded, and marks its connection (a [`Guarded`] one) as answering a request from then
/// until its response ends. See [`Connections::layer`].
#[derive(Clone, Debug)]
pub struct ConnectionLayer {
    budget: Arc<Budget>,
    max_message: usize,
}

impl<S> Layer<S> for ConnectionLayer {
    type Service = ConnectionService<S>;

    fn layer(&self, inner: S) -> ConnectionService<S> {
        ConnectionService {
            inner,
            budget: self.budget.clone(),
            max_message: self.max_message,
        }
    }
}

/// The service made by [`ConnectionLayer`].
#[derive(Clone, Debug)]
pub struct ConnectionService<S> {
    inner: S,
    budget: Arc<Budget>,
    max_message: usize,
}

impl<S, RB> Service<http::Request<Body>> for ConnectionService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let ext = req.extensions();
        let info = (ext.get::<GuardedInfo>().cloned()).or_else(|| {
            ext.get::<TlsConnectInfo<GuardedInfo>>()
                .map(|t| t.get_ref().clone())
        });
        let answer = info.map(|i| {
            req.extensions_mut().insert(i.tcp.clone());
            Arc::new(Answering {
                activity: i.activity,
                begun: Mutex::new(false),
            })
        });
        let budget = self.budget.clone();
        let held = answer.clone();
        let max_message = self.max_message;
        let req = req.map(move |b| {
            Body::new(Counted {
                inner: b,
                budget,
                taken: 0,
                frames: Frames::new(max_message),
                answer: held,
            })
        });
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|b| {
                Body::new(Answered {
                    inner: Box::pin(b),
                    _answer: answer,
                })
            }))
        })
    }
}

/// One request of a [`Guarded`] connection: it is being answered from when its message was
/// received whole (its body ended or was dropped) until its response ends (the last
/// holder drops).
#[derive(Debug)]
struct Answering {
    activity: Arc<Activity>,
    begun: Mutex<bool>,
}

impl Answering {
    fn begin(&self) {
        let mut b = self.begun.lock().unwrap_or_else(PoisonError::into_inner);
        if !*b {
            *b = true;
            self.activity.begin();
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if *self.begun.get_mut().unwrap_or_else(PoisonError::into_inner) {
            self.activity.end();
        }
    }
}

/// A request body whose bytes are counted against the budget until it is dropped.
struct Counted {
    inner: Body,
    budget: Arc<Budget>,
    /// Bytes taken from the budget.
    taken: usize,
    frames: Frames,
    answer: Option<Arc<Answering>>,
}

/// Where a request body is in its gRPC framing (`[flag u8][length u32 BE][message]`
/// repeated), to count each message at its declared length as soon as its prefix is read.
#[derive(Debug)]
struct Frames {
    /// Bytes of the current prefix read so far (up to 5).
    prefix: [u8; 5],
    have: usize,
    /// Message bytes still to come after a complete prefix.
    left: usize,
    max_message: usize,
}

impl Frames {
    fn new(max_message: usize) -> Frames {
        Frames {
            prefix: [0; 5],
            have: 0,
            left: 0,
            max_message,
        }
    }

    /// The bytes to count for `data`, the next bytes of the body: the data itself, plus for
    /// each prefix completed in it the message length it declares (up to `max_message`),
    /// less the message bytes that arrive in `data` (already counted once).
    fn charge(&mut self, mut data: &[u8]) -> usize {
        let mut n = data.len();
        while !data.is_empty() {
            if self.left > 0 {
                let k = self.left.min(data.len());
                // Counted with its prefix: not again.
                n -= k;
                self.left -= k;
                data = &data[k..];
                continue;
            }
            let k = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + k].copy_from_slice(&data[..k]);
            self.have += k;
            data = &data[k..];
            if self.have == 5 {
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]) as usize;
                self.have = 0;
                self.left = len;
                // tonic refuses a longer message before reserving for it: count what comes.
                if len <= self.max_message {
                    n += len;
                } else {
                    self.left = 0;
                }
            }
        }
        n
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => f,
            Poll::Ready(None) => {
                if let Some(a) = &self.answer {
                    a.begin();
                }
                return Poll::Ready(None);
            }
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let n = self.frames.charge(data);
            if !self.budget.take(n) {
                let max = self.budget.max;
                return Poll::Ready(Some(Err(LimitError::RequestBuffersFull { max }.into())));
            }
            self.taken += n;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.budget.give_back(self.taken);
        // A body dropped before its end (the message was decoded, or the call refused): the
        // request is being answered now.
        if let Some(a) = &self.answer {
            a.begin();
        }
    }
}

/// A response body that keeps its request marked as being answered until it is dropped.
struct Answered<B> {
    inner: Pin<Box<B>>,
    /// Held for its `Drop` (the request is answered when the body goes).
    _answer: Option<Arc<Answering>>,
}

impl<B> http_body::Body for Answered<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        self.get_mut().inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message counts at its declared length from its prefix on, whether the prefix comes
    /// whole or split, and its bytes are not counted twice; one over the maximum counts only
    /// what arrives.
    #[test]
    fn frames_charge_declared_lengths() {
        let mut f = Frames::new(1 << 20);
        // A 1,000-byte message: prefix and 100 bytes, then the rest.
        let mut first = vec![0u8, 0, 0, 0x03, 0xe8];
        first.extend_from_slice(&[7; 100]);
        assert_eq!(f.charge(&first), 5 + 1000);
        assert_eq!(f.charge(&[7; 900]), 0);
        // The next prefix split over two frames, a 10-byte message.
        assert_eq!(f.charge(&[0, 0, 0]), 3);
        assert_eq!(f.charge(&[0, 10, 1, 2]), 2 + 10);
        assert_eq!(f.charge(&[3; 8]), 0);
        // Over the maximum: only the bytes.
        let mut f = Frames::new(100);
        assert_eq!(f.charge(&[0, 0, 0, 0x03, 0xe8, 1, 2]), 7);
    }

    #[test]
    fn budget_never_passes_its_maximum() {
        let b = Budget {
            used: AtomicUsize::new(0),
            max: 10,
        };
        assert!(b.take(6));
        assert!(!b.take(5));
        assert!(b.take(4));
        b.give_back(6);
        assert!(b.take(6));
        assert_eq!(b.used.load(Ordering::Relaxed), 10);
    }
}
