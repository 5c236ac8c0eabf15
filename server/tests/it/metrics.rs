//! Metrics end to end: a real engine classifying packets, commits recorded, a tonic server with
//! the gRPC metrics and auth layers, and a scrape of `/metrics` over HTTP that must contain every
//! metric name of DESIGN.md (and pass `promtool check metrics`: an ignored test, it needs
//! promtool).

use crate::support::served;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use vallum_engine::Clock;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::{Family, Hook};
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::{NoSets, SetManager, SetSpec, SetType};
use vallum_engine::snapshot::Verdict;
use vallum_server::control::outcome::Outcome;
use vallum_server::control::store::Phases;
use vallum_server::grpc::auth::{AuthLayer, Role, TokenSet};
use vallum_server::telemetry::metrics::{Metrics, MetricsConfig};

/// A clock whose k-th reading is 10·k² ns: steps grow, so the engine's sampled barrier cost
/// (two timed steps minus twice the cost of one reading) is positive (80 ns per batch).
struct TickClock(AtomicU64);

impl Clock for TickClock {
    fn now_ns(&self) -> u64 {
        let k = self.0.fetch_add(1, Ordering::Relaxed);
        10 * k * k
    }
}

const RULES: &str = "*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp --dport 22 -j ACCEPT
COMMIT
";

fn engine() -> Arc<Engine> {
    let engine = Arc::new(Engine::new(
        EngineConfig {
            cores: 2,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(TickClock(AtomicU64::new(0))),
    ));
    let rs = parse_ruleset("web", RULES, &ParseOptions::default()).unwrap();
    let committed = engine.commit(Change::Put(rs), &NoSets).unwrap();
    drop(committed.retired);
    let mut worker = engine.worker(0).unwrap();
    let mut packets: Vec<PacketMeta> = (0..8u16)
        .map(|i| PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Input,
            src: Ipv4Addr::new(10, 0, 0, 1).into(),
            dst: Ipv4Addr::new(10, 0, 0, 2).into(),
            protocol: 6,
            sport: 40000,
            dport: if i % 2 == 0 { 22 } else { 80 },
            len: 100,
            ..PacketMeta::default()
        })
        .collect();
    let mut verdicts = vec![Verdict::Accept; packets.len()];
    // Enough batches for the 1-in-1024 barrier sample to fire.
    for i in 0..2100u64 {
        worker.process_batch(&mut packets, &mut verdicts, i);
    }
    drop(worker);
    engine
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let (_, body) = out.split_once("\r\n\r\n").unwrap();
    body.to_owned()
}

/// The value of the first sample line starting with `prefix`.
fn value(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix} in\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn scrape_has_every_design_metric() {
    every_design_metric(false).await;
}

/// As [`scrape_has_every_design_metric`], and the scrape passes `promtool check metrics`.
#[tokio::test]
#[ignore = "needs promtool (Debian prometheus)"]
async fn scrape_has_every_design_metric_and_passes_promtool() {
    every_design_metric(true).await;
}

async fn every_design_metric(promtool: bool) {
    let metrics = Metrics::new(&MetricsConfig {
        metrics_rule_counters: true,
        ..MetricsConfig::default()
    })
    .unwrap();
    let engine = engine();
    metrics.observe_engine(engine.clone()).unwrap();
    assert!(
        metrics.observe_engine(engine.clone()).is_err(),
        "second registration"
    );

    let phases = Phases {
        validate_ns: 1_000,
        compile_ns: 20_000,
        persist_ns: 300_000,
        publish_ns: 500,
        quiesce_ns: 2_000,
        carry_ns: 700,
        total_ns: 324_200,
        cores_waited: 1,
    };
    metrics.record_commit("web", Outcome::Committed, &phases);
    // Its replaced snapshot retired after the reply: the quiesce phase and the cores.
    metrics.record_retired(phases.quiesce_ns, phases.cores_waited as usize);
    metrics.record_commit(
        "web",
        Outcome::Failed,
        &Phases {
            validate_ns: 5_000,
            total_ns: 5_000,
            ..Phases::default()
        },
    );
    metrics.set_active_revision("web", Some(7));
    metrics.set_active_revision("gone", Some(1));
    metrics.set_active_revision("gone", None);
    // Sets: one with three elements, one destroyed before the scrape.
    let sets = Arc::new(SetManager::new());
    sets.create("bans", SetSpec::new(SetType::HashNet, Family::Ipv4))
        .unwrap();
    sets.add_str("bans", &["10.0.0.0/8", "192.0.2.1", "198.51.100.0/24"], 0)
        .unwrap();
    sets.create("gone", SetSpec::new(SetType::HashIp, Family::Ipv4))
        .unwrap();
    sets.destroy("gone").unwrap();
    metrics.observe_sets(sets).unwrap();

    // A gRPC server with both layers; one admin token.
    let mut tokens = TokenSet::new();
    tokens
        .add_text("admin-token-0123456789 ops", Some(Role::Admin), "t")
        .unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let grpc = served::serve(|incoming, shutdown| {
        Server::builder()
            .layer(metrics.grpc_layer(vallum_server::clock::Clock::system()))
            .layer(AuthLayer::new(tokens))
            .add_service(health)
            .serve_with_incoming_shutdown(incoming, shutdown)
    })
    .await;
    let grpc_addr = grpc.addr;
    let channel = Channel::from_shared(format!("http://{grpc_addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel.clone());
    // Refused by auth before routing: EngineService is not served here, health needs no token.
    let e = vallum_proto::v1::engine_service_client::EngineServiceClient::new(channel.clone())
        .get_status(vallum_proto::v1::GetStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut req = tonic::Request::new(HealthCheckRequest::default());
    req.metadata_mut().insert(
        "authorization",
        "Bearer admin-token-0123456789".parse().unwrap(),
    );
    client.check(req).await.unwrap();

    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = metrics
        .serve("127.0.0.1:0".parse().unwrap(), async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    let text = scrape(server.local_addr).await;
    // The process_* figures (CPU, RSS, fds) move between two reads.
    let steady = |t: &str| -> String {
        t.lines()
            .filter(|l| !l.starts_with("process_"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    assert_eq!(
        steady(&text),
        steady(&metrics.render().unwrap()),
        "the scrape serves render()"
    );

    for name in [
        "vallum_commit_duration_seconds",
        "vallum_commit_quiesce_cores_waited",
        "vallum_commits_total",
        "vallum_packet_barrier_seconds",
        "vallum_packets_total",
        "vallum_core_generation",
        "vallum_active_revision",
        "vallum_rule_packets_total",
        "vallum_rule_bytes_total",
        "rpc_server_call_duration_seconds",
        "rpc_server_duration_seconds",
        "vallum_set_elements",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "missing {name} in\n{text}"
        );
    }
    // No doubled suffixes.
    assert!(
        !text.contains("_seconds_seconds") && !text.contains("_total_total"),
        "{text}"
    );

    assert_eq!(
        value(
            &text,
            "vallum_commits_total{outcome=\"committed\",ruleset=\"web\""
        ),
        1.0
    );
    let persist = value(
        &text,
        "vallum_commit_duration_seconds_sum{outcome=\"committed\",phase=\"persist\"",
    );
    assert!((persist - 3e-4).abs() < 1e-12, "{persist}");
    assert_eq!(
        value(
            &text,
            "vallum_commit_duration_seconds_count{outcome=\"failed\",phase=\"total\""
        ),
        1.0
    );
    assert!(
        !text.contains("outcome=\"failed\",phase=\"compile\""),
        "phases that did not run are not recorded"
    );
    assert_eq!(value(&text, "vallum_active_revision{ruleset=\"web\""), 7.0);
    assert_eq!(value(&text, "vallum_set_elements{set=\"bans\""), 3.0);
    assert!(!text.contains("set=\"gone\""));
    assert!(!text.contains("ruleset=\"gone\""));
    let n = 2100.0 * 4.0;
    assert_eq!(
        value(
            &text,
            "vallum_packets_total{family=\"ipv4\",hook=\"INPUT\",ruleset=\"all\",verdict=\"ACCEPT\""
        ),
        n
    );
    assert_eq!(
        value(
            &text,
            "vallum_packets_total{family=\"ipv4\",hook=\"INPUT\",ruleset=\"all\",verdict=\"DROP\""
        ),
        n
    );
    assert_eq!(value(&text, "vallum_core_generation{core=\"0\""), 4200.0);
    assert_eq!(value(&text, "vallum_core_generation{core=\"1\""), 0.0);
    assert_eq!(
        value(
            &text,
            "vallum_rule_packets_total{chain=\"INPUT\",family=\"ipv4\",rule=\"1\",ruleset=\"web\",table=\"filter\""
        ),
        n
    );
    assert_eq!(
        value(
            &text,
            "vallum_rule_bytes_total{chain=\"INPUT\",family=\"ipv4\",rule=\"policy\",ruleset=\"web\",table=\"filter\""
        ),
        n * 100.0
    );
    // Barrier: 2 samples (batches 1024 and 2048), bounds from 8e-12 to ~1.05e-6 s.
    let count = value(
        &text,
        "vallum_packet_barrier_seconds_count{strategy=\"seqcst\"",
    );
    assert!(count >= 1.0, "{text}");
    assert_eq!(
        value(
            &text,
            "vallum_packet_barrier_seconds_bucket{strategy=\"seqcst\",le=\"+Inf\""
        ),
        count
    );
    // Tens of ns per batch of 4 packets with this clock: ~1e-8 s per packet and sample.
    let sum = value(
        &text,
        "vallum_packet_barrier_seconds_sum{strategy=\"seqcst\"",
    );
    let mean = sum / count;
    assert!(
        (1e-9..1e-7).contains(&mean),
        "barrier sum {sum}, count {count}"
    );
    // Cumulative buckets at powers of two of picoseconds: 0 up to the sample, `count` after.
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("vallum_packet_barrier_seconds_bucket{strategy=\"seqcst\",le=\"")
        })
        .filter_map(|l| {
            let (le, v) = l.split_once("\"} ")?;
            Some((le.parse().ok()?, v.parse().ok()?))
        })
        .collect();
    assert_eq!(buckets.len(), 18 + 1, "{text}");
    assert!(
        (buckets[0].0 - 8e-12).abs() < 1e-18 && buckets[17].0 > 1e-6,
        "{buckets:?}"
    );
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
    for (le, c) in &buckets {
        let expect = if *le >= mean { count } else { 0.0 };
        assert_eq!(*c, expect, "le={le} mean={mean}");
    }
    // gRPC: one UNAUTHENTICATED (16) GetStatus and one OK (0) health check.
    assert_eq!(
        value(
            &text,
            "rpc_server_call_duration_seconds_count{rpc_method=\"vallum.v1.EngineService/GetStatus\",rpc_response_status_code=\"UNAUTHENTICATED\",rpc_system_name=\"grpc\""
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "rpc_server_call_duration_seconds_count{rpc_method=\"grpc.health.v1.Health/Check\",rpc_response_status_code=\"OK\",rpc_system_name=\"grpc\""
        ),
        1.0
    );
    // The deprecated name, with the attributes of conventions up to 1.37.
    assert_eq!(
        value(
            &text,
            "rpc_server_duration_seconds_count{rpc_grpc_status_code=\"16\",rpc_method=\"GetStatus\",rpc_service=\"vallum.v1.EngineService\""
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "rpc_server_duration_seconds_count{rpc_grpc_status_code=\"0\",rpc_method=\"Check\",rpc_service=\"grpc.health.v1.Health\""
        ),
        1.0
    );

    if promtool {
        promtool_check(&text);
    }
    let _ = tx.send(());
    server.task.await.unwrap().unwrap();
    drop((client, channel));
    grpc.stop().await;
}

/// Pipes the scrape through `promtool check metrics`; panics when promtool cannot run.
fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            panic!("promtool not runnable ({e}); apt-get install prometheus");
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
