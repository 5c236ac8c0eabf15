//! The local socket's two protocols: gRPC over HTTP/2 (vallumctl, any gRPC client) and local
//! calls (`vallum_proto::local`: one unary call per frame, no HTTP/2; `vallum-iptables`).
//!
//! [`incoming`] accepts the socket's connections and tells them apart by their first byte
//! (the HTTP/2 preface begins `P`, a local-call connection `V`): an HTTP/2 connection goes to
//! tonic's server ([`Http2Conn`], the bytes read so far read back first); a local-call
//! connection is served here, on its own task, one call after another (each awaited to its
//! end on that task, which is the task [`crate::grpc::call::to_completion`] needs: no second
//! one), each by the same tower stack that serves gRPC (the
//! connection layer's byte budget, RPC metrics, the request-size answer, auth with the peer's
//! `SO_PEERCRED` credentials as tonic's `UdsConnectInfo`, the routes and their handlers), so
//! an edit takes the one path every edit takes. A call becomes an HTTP/2-less `http::Request`
//! (`POST` of the path, `content-type: application/grpc`, the `authorization` value, the
//! message behind its 5-byte gRPC prefix) and its answer (a gRPC response message, or the
//! status from the trailers with its `grpc-status-details-bin`) goes back as one frame.
//!
//! Deadlines as [`crate::grpc::connections`] keeps them for TCP: a connection must send its
//! first byte, and then each whole frame, within `--handshake-timeout` of being accepted and
//! `--idle-timeout` of the last answer, or it is closed. A frame longer than
//! `vallum_proto::local::request_frame_limit(--max-request-bytes)` is refused
//! (RESOURCE_EXHAUSTED `REQUEST_TOO_LARGE`) from its length prefix, before its bytes are read,
//! and the connection closed; a shorter frame is read as its bytes arrive (its buffer grows
//! with them, not with the declared length) and counts against
//! `--max-buffered-request-bytes` when it is handed to the stack. Once tonic's server stops
//! (shutdown), no connection is accepted and no new call is read; a call being answered
//! finishes.
//!
//! The module's own code because the framing is ours (the module head of
//! `vallum_proto::local` says why).

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use http_body_util::{BodyExt, Full};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf,
};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::codegen::Bytes;
use tonic::transport::server::{Connected, UdsConnectInfo};
use tonic::{Code, Status};
use tower_service::Service;
use vallum_proto::local;

use crate::grpc::limits::LimitError;

/// HTTP/2 connections waiting to be taken by tonic's server.
const HTTP2_QUEUE: usize = 64;
/// The pause after an `accept` that failed for lack of descriptors or memory.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);
/// The read buffer of a connection: one `read` takes the magic, a request frame's length
/// and a short frame whole (a drop-in command's EditRuleset is ~130 bytes), where reading
/// each part on its own costs a system call (and a wakeup when it is not there yet).
const READ_BUFFER: usize = 8 << 10;

/// What local calls are served with.
#[derive(Clone, Debug)]
pub struct LocalCallConfig {
    /// `--max-request-bytes`: the largest request message.
    pub max_message: usize,
    /// `--handshake-timeout`: until the first byte and the first whole frame.
    pub handshake_timeout: Duration,
    /// `--idle-timeout`: from an answer until the next whole frame.
    pub idle_timeout: Duration,
}

/// The connections of the local socket `listener` that speak HTTP/2, for tonic's
/// `serve_with_incoming`; local-call connections are served on tasks of their own with
/// `service` (see the module docs). Must run inside a tokio runtime. The stream never yields
/// an error; accepting stops when it is dropped.
pub fn incoming<S>(
    listener: UnixListener,
    service: S,
    config: LocalCallConfig,
) -> impl Stream<Item = io::Result<Http2Conn>> + Send + 'static
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Http2Conn>(HTTP2_QUEUE);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                // tonic's server stopped: no more connections.
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((io, _)) => {
                    let (tx, service, config) = (tx.clone(), service.clone(), config.clone());
                    tokio::spawn(sort(io, tx, service, config));
                }
                Err(e) if crate::grpc::connections::out_of_resources(&e) => {
                    tracing::debug!(error = %e, "local socket: accept failed");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
                Err(e) => tracing::debug!(error = %e, "local socket: accept failed"),
            }
        }
    });
    futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) },
    )
}

/// Reads `io`'s first bytes and hands it to tonic (HTTP/2) or serves its local calls.
async fn sort<S>(io: UnixStream, tx: mpsc::Sender<Http2Conn>, service: S, config: LocalCallConfig)
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
{
    let mut io = BufReader::with_capacity(READ_BUFFER, io);
    let first = match tokio::time::timeout(config.handshake_timeout, io.fill_buf()).await {
        Ok(Ok([b, ..])) => *b,
        // Closed, failed, or silent for --handshake-timeout.
        _ => return,
    };
    if first != local::MAGIC[0] {
        let read = Bytes::copy_from_slice(io.buffer());
        let io = io.into_inner();
        let _ = tx.send(Http2Conn { read, io }).await;
        return;
    }
    let mut magic = [0u8; local::MAGIC.len()];
    let rest = tokio::time::timeout(config.handshake_timeout, io.read_exact(&mut magic));
    if !matches!(rest.await, Ok(Ok(_))) || &magic != local::MAGIC {
        tracing::debug!("local socket: neither HTTP/2 nor a local call; closed");
        return;
    }
    serve(io, tx, service, config).await;
}

/// Why no frame was read.
enum ReadError {
    /// Closed, failed or timed out: nothing to answer.
    Gone,
    /// The declared length is over the limit.
    TooLarge(usize),
}

/// The body of the next frame of `io`, at most `limit` bytes.
async fn read_frame(io: &mut BufReader<UnixStream>, limit: usize) -> Result<Vec<u8>, ReadError> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await.map_err(|_| ReadError::Gone)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > limit {
        return Err(ReadError::TooLarge(len));
    }
    // Grown as the bytes arrive: a peer that declares much and sends little holds little.
    let mut body = Vec::new();
    let n = (&mut *io)
        .take(len as u64)
        .read_to_end(&mut body)
        .await
        .map_err(|_| ReadError::Gone)?;
    if n != len {
        return Err(ReadError::Gone);
    }
    Ok(body)
}

/// Serves the local calls of `io` until it closes, a deadline passes, or tonic's server
/// stops (`tx` closed).
async fn serve<S>(
    mut io: BufReader<UnixStream>,
    tx: mpsc::Sender<Http2Conn>,
    mut service: S,
    config: LocalCallConfig,
) where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
{
    let info = io.get_ref().connect_info();
    let limit = local::request_frame_limit(config.max_message);
    let mut wait = config.handshake_timeout;
    loop {
        let frame = tokio::select! {
            _ = tx.closed() => return,
            f = tokio::time::timeout(wait, read_frame(&mut io, limit)) => f,
        };
        let answer = match frame {
            Ok(Ok(body)) => crate::grpc::call::on_own_task(call(&mut service, &info, body)).await,
            Ok(Err(ReadError::TooLarge(size))) => {
                let status = Status::from(LimitError::RequestTooLarge {
                    size,
                    max: config.max_message,
                });
                let _ = (io.get_mut())
                    .write_all(&local::encode_refusal(&rpc_status(&status)))
                    .await;
                return;
            }
            Ok(Err(ReadError::Gone)) => return,
            Err(_) => {
                tracing::debug!(
                    "local socket: no whole call within --handshake-timeout or --idle-timeout; closed"
                );
                return;
            }
        };
        if io.get_mut().write_all(&answer).await.is_err() {
            return;
        }
        wait = config.idle_timeout;
    }
}

/// The answer frame of one call (`body`: a request frame's body) through `service`.
async fn call<S>(service: &mut S, info: &UdsConnectInfo, body: Vec<u8>) -> Vec<u8>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Error: std::fmt::Display,
{
    let refuse = |code: Code, message: String| {
        local::encode_refusal(&local::RpcStatus {
            code: code as i32,
            message,
            details: Vec::new(),
        })
    };
    let (path, authorization, at) = match local::decode_request(&body) {
        Ok(r) => (
            r.path.to_owned(),
            r.authorization.to_owned(),
            body.len() - r.message.len(),
        ),
        Err(e) => return refuse(Code::InvalidArgument, e.to_string()),
    };
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(path.as_str())
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers");
    if !authorization.is_empty() {
        req = req.header(http::header::AUTHORIZATION, authorization);
    }
    // The message behind its gRPC prefix, in place: the frame's header before it (path
    // length, path, authorization length: at least 3 bytes, 7 for any path `/S/M`) is
    // overwritten, so the message is not copied.
    let len = body.len() - at;
    let (Some(start), Ok(len32)) = (at.checked_sub(5), u32::try_from(len)) else {
        return refuse(Code::Unimplemented, format!("no method {path:?}"));
    };
    let mut body = body;
    body[start] = 0;
    body[start + 1..at].copy_from_slice(&len32.to_be_bytes());
    let grpc = Bytes::from(body).slice(start..);
    let mut req = match req.body(Body::new(Full::new(grpc))) {
        Ok(r) => r,
        Err(e) => return refuse(Code::InvalidArgument, format!("local call: {e}")),
    };
    req.extensions_mut().insert(info.clone());

    if let Err(e) = poll_fn(|cx| service.poll_ready(cx)).await {
        return refuse(Code::Unavailable, e.to_string());
    }
    let resp = match service.call(req).await {
        Ok(r) => r,
        Err(e) => return refuse(Code::Internal, e.to_string()),
    };
    let (parts, body) = resp.into_parts();
    let collected = match body.collect().await {
        Ok(c) => c,
        Err(e) => return refuse(Code::Internal, e.to_string()),
    };
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    let status = trailers
        .as_ref()
        .and_then(Status::from_header_map)
        .or_else(|| Status::from_header_map(&parts.headers))
        .unwrap_or_else(|| Status::internal("local call: the answer carries no grpc-status"));
    if status.code() != Code::Ok {
        return local::encode_refusal(&rpc_status(&status));
    }
    match data.split_first_chunk::<5>() {
        Some(([0, l @ ..], msg)) if u32::from_be_bytes(*l) as usize == msg.len() => {
            local::encode_ok(msg)
        }
        _ => refuse(
            Code::Internal,
            "local call: the answer is not one uncompressed message".to_owned(),
        ),
    }
}

/// `status` as `google.rpc.Status`: its `grpc-status-details-bin` when it has one (tonic-types
/// writes code, message and details there), else its code and message.
fn rpc_status(status: &Status) -> local::RpcStatus {
    let mut out =
        <local::RpcStatus as prost::Message>::decode(status.details()).unwrap_or_default();
    out.code = status.code() as i32;
    out.message = status.message().to_owned();
    out
}

// === impl Http2Conn ===

/// A local-socket connection that speaks HTTP/2, for tonic's server: the bytes [`incoming`]
/// read to tell the protocols apart come first.
#[derive(Debug)]
pub struct Http2Conn {
    /// Read from `io` already, not yet by tonic.
    read: Bytes,
    io: UnixStream,
}

impl Connected for Http2Conn {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> UdsConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Http2Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.read.is_empty() && buf.remaining() > 0 {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Http2Conn {
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
