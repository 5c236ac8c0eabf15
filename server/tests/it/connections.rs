//! Issue #28 item 2: no idle socket or half-sent request can take vallumd down or hold it up.
//! Socket tests against a real `vallumd` (ephemeral port, temporary database), with raw TCP
//! and raw HTTP/2 (the `h2` crate) clients that stop halfway:
//! - the connection caps (`--max-connections`, `--max-connections-per-peer`): connections over
//!   either are closed at once, the others kept; a freed place is taken again;
//! - the deadlines: a connection that sends nothing, one that stops inside its first HEADERS,
//!   one whose request stops inside its message, are closed after `--handshake-timeout`; one
//!   that makes requests stays over several `--idle-timeout` periods and is closed once idle;
//! - the buffered bytes (`--max-buffered-request-bytes`): a request whose bytes would pass it
//!   is RESOURCE_EXHAUSTED REQUEST_BUFFERS_FULL, and the bytes are freed with the request;
//! - EMFILE (vallumd with 64 descriptors and more connections waiting): accepting pauses
//!   instead of spinning, and serving resumes when descriptors are freed;
//! - many connections holding half-sent 60 KB messages under a 1 GiB address-space ceiling:
//!   vallumd stays up and answers.
//!
//! Every wait is a bounded loop on a condition; timeouts of the flags are seconds, the waits
//! allow tens of them.

use crate::support;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use support::{Daemon, Rlimits};
use tonic::codegen::Bytes;

/// The HTTP/2 client preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.x: a peer of its
/// own for the per-peer cap), as a blocking std stream with a 60 s read timeout.
async fn connect_from(from: &str, addr: &str) -> TcpStream {
    let local: IpAddr = from.parse().expect("address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(local, 0)).expect("bind");
    let stream = socket
        .connect(addr.parse().expect("address"))
        .await
        .expect("connect");
    let std = stream.into_std().expect("std stream");
    std.set_nonblocking(false).expect("blocking");
    std.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    std
}

/// Whether vallumd keeps `s`: after the client preface it answers with its SETTINGS (true);
/// a connection it refused is closed without a byte (false).
fn kept(s: &mut TcpStream) -> bool {
    let _ = s.write_all(PREFACE);
    let mut buf = [0u8; 9];
    match s.read(&mut buf) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => false,
        Err(e) => panic!("neither kept nor closed: {e}"),
    }
}

/// Reads until vallumd closes `s` (true), or the 60 s read timeout passes (false).
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return true;
            }
            Err(_) => return false,
        }
    }
}

/// Whether a gRPC health check over a new connection says SERVING (retried up to 200 times:
/// a freed place is given back when vallumd sees the close).
async fn serving_again(addr: &str) -> bool {
    for _ in 0..200 {
        if support::serving_once(addr).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn connections_over_the_caps_are_closed_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &[
            "--max-connections",
            "6",
            "--max-connections-per-peer",
            "3",
            "--handshake-timeout",
            "600",
        ],
    );
    d.wait_serving().await;
    // The harness's health channel may still hold a place: wait until it is given back.
    let addr = d.addr.clone();
    let mut from2 = Vec::new();
    for _ in 0..3 {
        from2.push(connect_from("127.0.0.2", &addr).await);
    }
    for s in &mut from2 {
        assert!(kept(s), "within the per-peer cap");
    }
    let mut fourth = connect_from("127.0.0.2", &addr).await;
    assert!(!kept(&mut fourth), "over the per-peer cap");
    let mut from3 = Vec::new();
    for _ in 0..3 {
        from3.push(connect_from("127.0.0.3", &addr).await);
    }
    let kept3 = from3.iter_mut().map(kept).filter(|k| *k).count();
    // 6 in all: the three of .3 are kept unless the harness's channel still holds one.
    assert!(kept3 >= 2, "within the total cap: {kept3} kept");
    let mut other = connect_from("127.0.0.4", &addr).await;
    assert!(!kept(&mut other), "over the total cap");
    // A freed place is taken again.
    drop(from2.pop());
    let mut again = false;
    for _ in 0..100 {
        let mut s = connect_from("127.0.0.2", &addr).await;
        if kept(&mut s) {
            again = true;
            from2.push(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again, "the freed place was not given back");
    drop(from2);
    drop(from3);
    assert!(
        serving_again(&addr).await,
        "not serving after the idle connections left"
    );
}

/// A raw HTTP/2 connection to `addr` (h2's client), its driver spawned; the join handle ends
/// when the connection does.
async fn h2_connect(
    addr: &str,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    (send, tokio::spawn(conn))
}

/// A gRPC request's head for `path`.
fn grpc_request(path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://vallumd{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

/// One whole health check on `send`: true when it answers grpc-status 0.
async fn health_over(send: &mut h2::client::SendRequest<Bytes>) -> bool {
    let Ok(ready) = send.clone().ready().await else {
        return false;
    };
    *send = ready;
    let Ok((resp, mut body)) =
        send.send_request(grpc_request("/grpc.health.v1.Health/Check"), false)
    else {
        return false;
    };
    // An empty HealthCheckRequest: flag 0, length 0.
    if body
        .send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .is_err()
    {
        return false;
    }
    let Ok(resp) = resp.await else { return false };
    let mut resp = resp.into_body();
    while let Some(chunk) = resp.data().await {
        if chunk.is_err() {
            return false;
        }
    }
    matches!(resp.trailers().await, Ok(Some(t)) if t.get("grpc-status").is_some_and(|s| s == "0"))
}

/// A connection that makes a request every 0.4 s stays over four periods of `--idle-timeout`
/// (2 s); left idle, it is closed. Connections that send nothing, that stop inside their first
/// HEADERS, or whose first request stops inside its message are closed after
/// `--handshake-timeout` (1 s). vallumd serves throughout.
#[tokio::test]
async fn idle_and_half_sent_connections_are_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--handshake-timeout", "1", "--idle-timeout", "2"],
    );
    d.wait_serving().await;
    let addr = d.addr.clone();

    // Sends nothing at all.
    let mut silent = connect_from("127.0.0.1", &addr).await;
    // The preface, SETTINGS, and a HEADERS frame of stream 1 without END_HEADERS whose block
    // is cut short (a continuation that never comes).
    let mut half_headers = connect_from("127.0.0.1", &addr).await;
    half_headers.write_all(PREFACE).expect("preface");
    half_headers
        .write_all(&[
            0x00, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x83, 0x86, 0x44, 0x10,
        ])
        .expect("headers");
    let silent_t = std::thread::spawn(move || closed_by_server(&mut silent));
    let half_t = std::thread::spawn(move || closed_by_server(&mut half_headers));

    // A request whose message says 1000 bytes and stops after 100.
    let (mut send, conn) = h2_connect(&addr).await;
    let (_resp, mut body) = send
        .send_request(grpc_request("/grpc.health.v1.Health/Check"), false)
        .expect("send");
    let mut partial = vec![0u8, 0, 0, 0x03, 0xe8];
    partial.extend_from_slice(&[0x0a; 100]);
    body.send_data(Bytes::from(partial), false).expect("data");
    let stalled = tokio::time::timeout(Duration::from_secs(60), conn).await;
    assert!(stalled.is_ok(), "a half-sent request held its connection");

    // Busy for four idle periods: kept.
    let (mut send, conn) = h2_connect(&addr).await;
    for i in 0..20 {
        assert!(
            health_over(&mut send).await,
            "request {i} on a busy connection"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Then idle: closed.
    let idle = tokio::time::timeout(Duration::from_secs(60), conn).await;
    assert!(idle.is_ok(), "an idle connection stayed");

    assert!(
        silent_t.join().expect("thread"),
        "a silent connection stayed"
    );
    assert!(half_t.join().expect("thread"), "a half-sent HEADERS stayed");
    assert!(serving_again(&addr).await);
}

/// With `--max-buffered-request-bytes 100000`, one request holding 60,000 bytes of a message
/// it does not finish, a second one's 60,000 bytes would pass the limit: it is refused
/// RESOURCE_EXHAUSTED (REQUEST_BUFFERS_FULL) while the first waits; once the first is gone,
/// requests are served.
#[tokio::test]
async fn buffered_request_bytes_are_bounded_across_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &[
            "--max-buffered-request-bytes",
            "100000",
            "--handshake-timeout",
            "600",
        ],
    );
    d.wait_serving().await;
    let addr = d.addr.clone();
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..2 {
        let (mut send, conn) = h2_connect(&addr).await;
        let (resp, mut body) = send
            .send_request(
                grpc_request("/vallum.v1.RulesetService/ValidateRuleset"),
                false,
            )
            .expect("send");
        // A message of 1,000,000 bytes, 60,000 of them sent.
        let mut partial = vec![0u8, 0x00, 0x0f, 0x42, 0x40];
        partial.extend(std::iter::repeat_n(0x0au8, 60_000 - 5));
        body.send_data(Bytes::from(partial), false).expect("data");
        held.push((send, conn, body));
        if held.len() == 2 {
            refused = Some(resp);
        }
    }
    let resp = tokio::time::timeout(Duration::from_secs(60), refused.expect("second"))
        .await
        .expect("the second request was answered")
        .expect("a response");
    let status = resp
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap_or("").to_string());
    let status = match status {
        Some(s) => s,
        None => {
            let mut body = resp.into_body();
            while body.data().await.is_some() {}
            let t = body.trailers().await.expect("trailers").expect("trailers");
            t.get("grpc-status")
                .expect("grpc-status")
                .to_str()
                .expect("text")
                .to_string()
        }
    };
    assert_eq!(status, "8", "RESOURCE_EXHAUSTED");
    drop(held);
    assert!(serving_again(&addr).await);
    let mut c = d.rulesets().await;
    c.validate_ruleset(vallum_proto::v1::ValidateRulesetRequest {
        ruleset: "web".into(),
        source: Some(support::text_source("*filter\nCOMMIT\n", false, "t.rules")),
    })
    .await
    .expect("served once the bytes are freed");
}

/// CPU time (user + system) of process `pid`, clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = stat.rsplit_once(')').expect("comm").1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are 12 and 13 after the state.
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// vallumd with 64 descriptors and 100 idle connections waiting: accept fails with EMFILE;
/// vallumd pauses accepting instead of spinning (it uses well under half a core while they
/// wait, over a window of 3 s) and logs it; once the connections go, it serves again.
#[tokio::test]
async fn emfile_pauses_accepting_without_spinning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Rlimits {
        open_files: Some(64),
        ..Default::default()
    };
    let d = Daemon::start_limited(
        &dir.path().join("v.db"),
        &["--max-connections", "1000", "--handshake-timeout", "600"],
        &[],
        limits,
    );
    d.wait_serving().await;
    let addr = d.addr.clone();
    let mut idle = Vec::new();
    for i in 0..100 {
        idle.push(connect_from(&format!("127.0.0.{}", 2 + i % 8), &addr).await);
    }
    // Let the accept loop reach EMFILE.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hz = 100; // USER_HZ on Linux.
    let before = cpu_ticks(d.pid());
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let used = cpu_ticks(d.pid()) - before;
    assert!(
        used < window.as_secs() * hz / 2,
        "vallumd used {used} ticks in {window:?} while accept failed"
    );
    drop(idle);
    assert!(
        serving_again(&addr).await,
        "not serving after descriptors were freed"
    );
}

/// 1,000 connections from 16 peers (under the default `--max-connections` 1024, so that a
/// client still gets in), each holding the first 60 KB of a message that declares 1 MB, in a
/// vallumd whose address space is limited to 1 GiB: tonic would reserve 1 MB for each (1 GB
/// in all); counted at their declared length against `--max-buffered-request-bytes` (64 MiB)
/// most are refused, and vallumd stays up and answers.
#[tokio::test]
async fn many_half_sent_messages_stay_within_memory() {
    // This process needs a descriptor per connection.
    // SAFETY: getrlimit/setrlimit on this process with valid pointers.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(65536);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Rlimits {
        address_space: Some(1 << 30),
        open_files: Some(4096),
    };
    let d = Daemon::start_limited(
        &dir.path().join("v.db"),
        &["--handshake-timeout", "600"],
        &[],
        limits,
    );
    d.wait_serving().await;
    let addr = d.addr.clone();
    let mut conns = Vec::new();
    for i in 0..1000 {
        let mut s = connect_from(&format!("127.0.1.{}", 1 + i % 16), &addr).await;
        s.set_write_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        let mut out = PREFACE.to_vec();
        // HEADERS (END_HEADERS) of stream 1: :method POST, :scheme http, :path
        // /grpc.health.v1.Health/Check, content-type application/grpc.
        let path = b"/grpc.health.v1.Health/Check";
        let ct = b"application/grpc";
        let mut block = vec![0x83, 0x86, 0x04, path.len() as u8];
        block.extend_from_slice(path);
        block.extend_from_slice(&[0x0f, 0x10, ct.len() as u8]);
        block.extend_from_slice(ct);
        out.extend_from_slice(&[0, 0, block.len() as u8, 0x01, 0x04, 0, 0, 0, 1]);
        out.extend_from_slice(&block);
        // DATA frames of stream 1: a 1,000,000-byte message, its first 60,000 bytes.
        let mut data = vec![0u8, 0x00, 0x0f, 0x42, 0x40];
        data.extend(std::iter::repeat_n(0x0au8, 60_000 - 5));
        for chunk in data.chunks(16_384) {
            let n = chunk.len();
            out.extend_from_slice(&[
                (n >> 16) as u8,
                (n >> 8) as u8,
                n as u8,
                0x00,
                0x00,
                0,
                0,
                0,
                1,
            ]);
            out.extend_from_slice(chunk);
        }
        // A refused or stalled connection may not take it all: that is its business.
        let _ = s.write_all(&out);
        conns.push(s);
    }
    assert!(
        support::serving_once(&addr).await || serving_again(&addr).await,
        "vallumd does not answer"
    );
    let mut c = d.rulesets().await;
    c.validate_ruleset(vallum_proto::v1::ValidateRulesetRequest {
        ruleset: "web".into(),
        source: Some(support::text_source("*filter\nCOMMIT\n", false, "t.rules")),
    })
    .await
    .expect("served while the connections wait");
    let hwm = std::fs::read_to_string(format!("/proc/{}/status", d.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_string)
        });
    println!("vallumd after 1,000 half-sent messages: {hwm:?}");
    drop(conns);
    let mut d = d;
    assert!(d.exited().is_none(), "vallumd exited");
    assert!(d.terminate(), "vallumd did not stop cleanly");
}
