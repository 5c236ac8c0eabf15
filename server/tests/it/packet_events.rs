//! Packet events end to end, in this process (vallumd's `run_with`, `--source synthetic`):
//! a `-j LOG` rule's hits reach a `WatchPacketEvents` subscriber and the process log
//! (`tracing`, target `vallum::packet_log`) as the same kernel-format line; the filters
//! (ruleset, chain, address, kind) hold; sampled drops come without any LOG rule when asked;
//! a bad filter is refused with its field. The namespace test with real packets is
//! tests/it/nfqueue.rs (root).

use crate::support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Daemon, text_source};
use tonic::transport::Channel;
use vallum_proto::v1 as pb;
use vallum_proto::v1::trace_service_client::TraceServiceClient;

/// The process log as this test's subscriber writes it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

async fn apply(d: &Daemon, name: &str, text: &str) {
    d.rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: name.into(),
            source: Some(text_source(text, false, "r.rules")),
            ..Default::default()
        })
        .await
        .expect("apply");
}

async fn next(s: &mut tonic::Streaming<pb::PacketEvent>) -> pb::PacketEvent {
    tokio::time::timeout(Duration::from_secs(30), s.message())
        .await
        .expect("an event within 30 s")
        .expect("stream ok")
        .expect("stream open")
}

async fn watch(c: &Channel, r: pb::WatchPacketEventsRequest) -> tonic::Streaming<pb::PacketEvent> {
    TraceServiceClient::new(c.clone())
        .watch_packet_events(r)
        .await
        .expect("watch")
        .into_inner()
}

const LOGGED: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    :LOG_DROP - [0:0]\n-A INPUT -p tcp -j LOG_DROP\n\
    -A LOG_DROP -j LOG --log-prefix \"[VALLUM DROP] \" --log-level 6\n-A LOG_DROP -j DROP\nCOMMIT\n";

const DROPS_UDP: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
    :OUTPUT ACCEPT [0:0]\n-A INPUT -p udp -j DROP\nCOMMIT\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_hits_reach_the_stream_and_the_process_log() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::in_process(
        &dir.path().join("v.db"),
        &["--source", "synthetic", "--rate", "2000"],
        Default::default(),
    )
    .await;
    let c = d.channel().await;

    // A bad filter names its field and changes nothing.
    let bad = TraceServiceClient::new(c.clone())
        .watch_packet_events(pb::WatchPacketEventsRequest {
            address: "10.0.0.300".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("address"), "{}", bad.message());

    let mut all = watch(&c, Default::default()).await;
    let mut other_ruleset = watch(
        &c,
        pb::WatchPacketEventsRequest {
            ruleset: "other".into(),
            ..Default::default()
        },
    )
    .await;
    apply(&d, "edge", LOGGED).await;

    let e = next(&mut all).await;
    assert_eq!(e.kind(), pb::PacketEventKind::Log);
    assert_eq!(
        (
            e.ruleset.as_str(),
            e.table.as_str(),
            e.chain.as_str(),
            e.rule
        ),
        ("edge", "filter", "LOG_DROP", 1)
    );
    assert_eq!(e.log_prefix, "[VALLUM DROP] ");
    assert_eq!(e.log_level, 6);
    assert_eq!(e.protocol, 6);
    assert!(
        e.line.starts_with("[VALLUM DROP] IN=eth0 OUT= MAC="),
        "{}",
        e.line
    );
    assert!(
        e.line.contains(&format!(
            " SPT={} DPT={} ",
            e.source_port, e.destination_port
        )),
        "{}",
        e.line
    );
    let src = e.source.clone();
    // The same line in the process log, at --log-level 6 (INFO), as the message alone.
    let logged = support::poll(
        "the LOG line in the process log",
        200,
        Duration::from_millis(50),
        || {
            let text = log.text();
            let line = e.line.clone();
            async move { text.lines().find(|l| l.ends_with(&line)).map(str::to_owned) }
        },
    )
    .await;
    assert!(
        logged.contains(" INFO vallum::packet_log: [VALLUM DROP] IN=eth0"),
        "{logged}"
    );

    // By address: only packets from or to it.
    let mut by_addr = watch(
        &c,
        pb::WatchPacketEventsRequest {
            address: src.clone(),
            kind: pb::PacketEventKind::Log as i32,
            chain: "LOG_DROP".into(),
            ..Default::default()
        },
    )
    .await;
    for _ in 0..3 {
        let e = next(&mut by_addr).await;
        assert!(e.source == src || e.destination == src, "{e:?}");
    }

    // Sampled drops without a LOG rule, when asked (N raised to the server's floor).
    apply(&d, "edge", DROPS_UDP).await;
    let mut drops = watch(
        &c,
        pb::WatchPacketEventsRequest {
            kind: pb::PacketEventKind::Drop as i32,
            sample_drops_one_in: 1,
            ..Default::default()
        },
    )
    .await;
    let s = next(&mut drops).await;
    assert_eq!(
        (s.kind(), s.protocol),
        (pb::PacketEventKind::Drop, 17),
        "{s:?}"
    );
    assert!(s.line.contains(" PROTO=UDP "), "{}", s.line);

    // vallumctl monitor -o json: one JSON object a line.
    let mut monitor = tokio::process::Command::new(support::vallumctl())
        .args([
            "-o",
            "json",
            "monitor",
            "--verdict",
            "drop",
            "--sample-drops",
            "1",
        ])
        .env_clear()
        .env("VALLUM_SERVER", format!("http://{}", d.addr))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn vallumctl");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        monitor.stdout.take().expect("stdout"),
    ));
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("vallumctl monitor printed within 60 s")
        .expect("read")
        .expect("a line");
    let v: serde_json::Value = serde_json::from_str(&first).expect("JSON");
    assert_eq!(v["kind"], "DROP", "{first}");
    assert_eq!(v["protocol"], 17, "{first}");
    assert!(
        v["line"]
            .as_str()
            .unwrap_or_default()
            .contains(" PROTO=UDP "),
        "{first}"
    );
    assert!(v["time"]["rfc3339"].is_string(), "{first}");
    let _ = monitor.kill().await;

    // The "other" subscriber got nothing: poll it once, briefly, after everything above.
    let nothing = tokio::time::timeout(Duration::from_millis(200), other_ruleset.message()).await;
    assert!(nothing.is_err(), "{nothing:?}");
    d.stop().await;
}
