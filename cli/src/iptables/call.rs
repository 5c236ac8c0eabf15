//! How `vallum-iptables` calls vallumd: unary methods by path with the API's messages, over
//! one of two transports, chosen by the endpoint:
//!
//! - `unix:PATH` (the default when vallumd's local socket exists): local calls
//!   (`vallum_proto::local`) on one blocking socket: no runtime, no threads, no HTTP/2, so a
//!   call costs the process little more than a `connect`, a `write` and a `read` (issue #33
//!   item 7). vallumd answers them with the same layers and handlers as gRPC calls.
//! - `http://` / `https://`: gRPC through tonic on a current-thread runtime (one thread), with
//!   TLS from `VALLUM_CA`/`VALLUM_CERT`/`VALLUM_KEY`/`VALLUM_TLS_DOMAIN` as vallumctl's; the
//!   TLS settings apply to TCP endpoints only (the local socket is plaintext).
//!
//! A refusal is a `google.rpc.Status` ([`Refusal`]) either way: tonic's status with its
//! `grpc-status-details-bin`, or the local answer's body.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use prost::Message;
use vallum_proto::local::{self, RpcStatus};

use super::{Fail, Wait, env, failed};

/// A refused (or failed) call: its gRPC code, message and details.
pub type Refusal = RpcStatus;

/// gRPC's NOT_FOUND.
pub const NOT_FOUND: i32 = 5;
/// gRPC's UNAVAILABLE.
const UNAVAILABLE: i32 = 14;
/// The largest answer read (as vallumctl's `max_decoding_message_size`).
const MAX_ANSWER: usize = 256 << 20;

/// The first field violation's description of a refusal, or its message.
pub fn text(r: &Refusal) -> String {
    r.first_violation().unwrap_or_else(|| r.message.clone())
}

/// Whether vallumd refused the call because it is still loading (NOT_READY).
fn not_ready(r: &Refusal) -> bool {
    r.code == UNAVAILABLE
        && (r.reason().as_deref() == Some("NOT_READY") || r.message.contains("still loading"))
}

/// The time left before `until` (`None`: no limit); zero once it passed.
fn left(until: Option<Instant>) -> Option<Duration> {
    until.map(|u| u.saturating_duration_since(Instant::now()))
}

/// Sleeps `pause` (no longer than what is left) and doubles it up to 100 ms; `false` when
/// no time is left.
fn pause_before_retry(until: Option<Instant>, pause: &mut Duration) -> bool {
    let nap = match left(until) {
        Some(l) if l.is_zero() => return false,
        Some(l) => (*pause).min(l),
        None => *pause,
    };
    std::thread::sleep(nap);
    *pause = (*pause * 2).min(Duration::from_millis(100));
    true
}

/// A connection to vallumd and the time a call may wait for it until.
pub struct Conn {
    transport: Transport,
    /// The `authorization` value (`Bearer TOKEN`), empty without `VALLUM_TOKEN`.
    authorization: String,
    until: Option<Instant>,
    /// Where vallumd is, for messages.
    server: String,
}

enum Transport {
    /// Local calls; the magic is sent with the first frame.
    Local {
        io: UnixStream,
        greeted: bool,
    },
    Grpc(Box<grpc::Grpc>),
}

impl Conn {
    /// Connects to `VALLUM_SERVER` (default: vallumd's local socket when there is one, else
    /// loopback TCP). With `-w`, a server that refuses connections is tried again until the
    /// wait ends.
    ///
    /// Errors: exit 1 when vallumd cannot be reached, the endpoint or `VALLUM_TOKEN` is
    /// malformed, or TLS cannot be set up.
    pub fn open(wait: Wait) -> Result<Conn, Fail> {
        let server = env("VALLUM_SERVER").unwrap_or_else(super::socket::default_server);
        let authorization = match env("VALLUM_TOKEN") {
            Some(t) if t.bytes().all(|b| (0x20..0x7f).contains(&b)) => format!("Bearer {t}"),
            Some(_) => return Err(failed("VALLUM_TOKEN must be printable ASCII")),
            None => String::new(),
        };
        let until = wait.limit.map(|d| Instant::now() + d);
        let transport = match super::socket::unix_path(&server) {
            Some(path) => {
                let mut pause = Duration::from_millis(2);
                let io = loop {
                    match UnixStream::connect(path) {
                        Ok(io) => break io,
                        Err(_) if wait.asked && pause_before_retry(until, &mut pause) => {}
                        Err(e) => {
                            return Err(failed(format!("can't reach vallumd at {server}: {e}")));
                        }
                    }
                };
                Transport::Local { io, greeted: false }
            }
            None => Transport::Grpc(Box::new(grpc::Grpc::connect(
                &server,
                &authorization,
                wait,
                until,
            )?)),
        };
        Ok(Conn {
            transport,
            authorization,
            until,
            server,
        })
    }

    /// Calls `path` (`/vallum.v1.RulesetService/EditRuleset`) with `req`, again after a short
    /// pause while vallumd answers NOT_READY and the wait allows.
    ///
    /// Errors: vallumd's refusal; a broken connection or an answer that does not decode is
    /// UNAVAILABLE / INTERNAL with a message saying so.
    pub fn call<Req, Resp>(&mut self, path: &'static str, req: &Req) -> Result<Resp, Refusal>
    where
        Req: Message + Clone + Send + Sync + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let mut pause = Duration::from_millis(2);
        loop {
            let answer = match &mut self.transport {
                Transport::Local { io, greeted } => {
                    local_call(io, greeted, path, &self.authorization, req, &self.server)
                }
                Transport::Grpc(g) => g.call(path, req),
            };
            match answer {
                Err(r) if not_ready(&r) && pause_before_retry(self.until, &mut pause) => {}
                a => return a,
            }
        }
    }
}

/// One local call on `io`.
fn local_call<Req: Message, Resp: Message + Default>(
    io: &mut UnixStream,
    greeted: &mut bool,
    path: &str,
    authorization: &str,
    req: &Req,
    server: &str,
) -> Result<Resp, Refusal> {
    let broken = |e: std::io::Error| Refusal {
        code: UNAVAILABLE,
        message: format!("vallumd at {server}: {e}"),
        details: Vec::new(),
    };
    let frame =
        local::encode_request(path, authorization.as_bytes(), req).map_err(|e| Refusal {
            code: 3,
            message: e.to_string(),
            details: Vec::new(),
        })?;
    // The magic and the first frame in one write.
    let sent = if !*greeted {
        *greeted = true;
        let mut first = Vec::with_capacity(local::MAGIC.len() + frame.len());
        first.extend_from_slice(local::MAGIC);
        first.extend_from_slice(&frame);
        io.write_all(&first)
    } else {
        io.write_all(&frame)
    };
    // vallumd refuses a frame over its request limit from the length prefix and closes the
    // connection before the rest arrives: its answer is still there to read, and says why.
    let mut len = [0u8; 4];
    if let Err(e) = sent {
        return match io.read_exact(&mut len) {
            Ok(()) => read_answer(io, len, server),
            Err(_) => Err(broken(e)),
        };
    }
    io.read_exact(&mut len).map_err(broken)?;
    read_answer(io, len, server)
}

/// The rest of an answer whose length prefix is `len`.
fn read_answer<Resp: Message + Default>(
    io: &mut UnixStream,
    len: [u8; 4],
    server: &str,
) -> Result<Resp, Refusal> {
    let broken = |e: std::io::Error| Refusal {
        code: UNAVAILABLE,
        message: format!("vallumd at {server}: {e}"),
        details: Vec::new(),
    };
    let len = u32::from_be_bytes(len) as usize;
    let undecodable = |m: String| Refusal {
        code: 13,
        message: format!("vallumd at {server}: {m}"),
        details: Vec::new(),
    };
    if len > MAX_ANSWER {
        return Err(undecodable(format!("an answer of {len} bytes")));
    }
    let mut body = Vec::new();
    io.take(len as u64).read_to_end(&mut body).map_err(broken)?;
    if body.len() != len {
        return Err(broken(std::io::ErrorKind::UnexpectedEof.into()));
    }
    match local::decode_response(&body) {
        Ok(Ok(msg)) => Resp::decode(msg).map_err(|e| undecodable(e.to_string())),
        Ok(Err(refusal)) => Err(refusal),
        Err(e) => Err(undecodable(e.to_string())),
    }
}

/// gRPC over TCP (and TLS): tonic on a current-thread runtime.
mod grpc {
    use std::time::Instant;

    use tonic::transport::{Channel, Endpoint};

    use super::{Refusal, Wait, pause_before_retry};
    use crate::{Fail, failed};

    pub struct Grpc {
        rt: tokio::runtime::Runtime,
        client: tonic::client::Grpc<Channel>,
        authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    }

    impl Grpc {
        pub fn connect(
            server: &str,
            authorization: &str,
            wait: Wait,
            until: Option<Instant>,
        ) -> Result<Grpc, Fail> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| failed(format!("runtime: {e}")))?;
            let mut ep = Endpoint::from_shared(server.to_owned())
                .map_err(|e| failed(format!("VALLUM_SERVER {server}: {e}")))?;
            let env = super::env;
            let ca = env("VALLUM_CA").map(std::path::PathBuf::from);
            let cert = env("VALLUM_CERT").map(std::path::PathBuf::from);
            let key = env("VALLUM_KEY").map(std::path::PathBuf::from);
            if server.starts_with("https://") || ca.is_some() || cert.is_some() {
                let cfg = vallum_api::tls::client_config(
                    ca.as_deref(),
                    cert.as_deref(),
                    key.as_deref(),
                    env("VALLUM_TLS_DOMAIN").as_deref(),
                )
                .map_err(|e| failed(format!("TLS: {e}")))?;
                ep = ep
                    .tls_config(cfg)
                    .map_err(|e| failed(format!("TLS: {e}")))?;
            }
            let mut pause = std::time::Duration::from_millis(2);
            let channel = loop {
                match rt.block_on(ep.connect()) {
                    Ok(c) => break c,
                    Err(_) if wait.asked && pause_before_retry(until, &mut pause) => {}
                    Err(e) => return Err(failed(format!("can't reach vallumd at {server}: {e}"))),
                }
            };
            let authorization = match authorization {
                "" => None,
                a => Some(
                    a.parse()
                        .map_err(|_| failed("VALLUM_TOKEN must be printable ASCII"))?,
                ),
            };
            Ok(Grpc {
                rt,
                client: tonic::client::Grpc::new(channel)
                    .max_decoding_message_size(super::MAX_ANSWER),
                authorization,
            })
        }

        pub fn call<Req, Resp>(&mut self, path: &'static str, req: &Req) -> Result<Resp, Refusal>
        where
            Req: prost::Message + Clone + Send + Sync + 'static,
            Resp: prost::Message + Default + Send + 'static,
        {
            let mut request = tonic::Request::new(req.clone());
            if let Some(a) = &self.authorization {
                request.metadata_mut().insert("authorization", a.clone());
            }
            let client = &mut self.client;
            let answer = self.rt.block_on(async {
                client
                    .ready()
                    .await
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                client
                    .unary(
                        request,
                        http::uri::PathAndQuery::from_static(path),
                        vallum_proto::codec::Codec::<Req, Resp>::default(),
                    )
                    .await
            });
            answer.map(tonic::Response::into_inner).map_err(|s| {
                let mut r = <Refusal as prost::Message>::decode(s.details()).unwrap_or_default();
                r.code = s.code() as i32;
                r.message = s.message().to_owned();
                r
            })
        }
    }
}
