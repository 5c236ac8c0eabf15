//! End-to-end tests against real `vallumd` processes (ephemeral ports, temporary databases);
//! the commit-confirmed ones run vallumd in the test process with an injected clock, which
//! the test advances past a deadline instead of waiting for it.
//!
//! Cases: health NOT_SERVING -> SERVING and reflection; the Quick start (example + synthetic
//! traffic) with traces; every real ruleset of ../shared/data (commit, or a clear
//! INVALID_ARGUMENT); pcap replay checked against the engine run in the test; kill -9 during
//! commits, of one client and of 16 concurrent ones (group commit, `full` and `normal`); 8 concurrent clients x 50 commits under traffic; idempotency, etags, diff and
//! rollback; commit-confirmed rollback at the deadline and confirmation; a confirm deadline
//! kept across a kill -9.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::{Daemon, join, poll, reason, shared_data, text_source};
use vallum_engine::packet::Packet;
use vallum_engine::packet::pcap::read_capture;
use vallum_engine::restore::{ParseOptions, parse, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Snapshot;
use vallum_engine::validate::{Severity, ViolationKind, validate};
use vallum_proto::v1 as pb;
use vallum_server::clock::ManualClock;
use vallum_server::control::hooks::Hooks;

type Rulesets = pb::ruleset_service_client::RulesetServiceClient<tonic::transport::Channel>;

const BASE: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 23 -j DROP\nCOMMIT\n";

fn numbered(i: usize) -> String {
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -s 10.{}.{}.0/24 -j DROP\nCOMMIT\n",
        (i / 256) % 256,
        i % 256
    )
}

fn apply_req(ruleset: &str, text: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        source: Some(text_source(text, false, "test.rules")),
        ..Default::default()
    }
}

#[tokio::test]
async fn health_reflection_quickstart_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--example", "--source", "synthetic", "--load-delay", "1.5"],
    );
    // NOT_SERVING while loading.
    {
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
        let mut h = HealthClient::new(d.channel().await);
        let r = h
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(r.get_ref().status, ServingStatus::NotServing as i32);
        let r = h
            .check(HealthCheckRequest {
                service: "vallum.v1.RulesetService".into(),
            })
            .await
            .unwrap();
        assert_eq!(r.get_ref().status, ServingStatus::NotServing as i32);
        // Mutations are refused with UNAVAILABLE meanwhile.
        let e = d
            .rulesets()
            .await
            .apply(apply_req("x", BASE))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert_eq!(reason(&e), "NOT_READY");
    }
    d.wait_serving().await;
    // Reflection lists the services.
    {
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        let mut c = ServerReflectionClient::new(d.channel().await);
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = c
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .unwrap()
            .into_inner();
        let resp = stream.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(l)) = resp.message_response else {
            panic!("no list")
        };
        let names: Vec<String> = l.service.into_iter().map(|s| s.name).collect();
        for s in [
            "vallum.v1.RulesetService",
            "vallum.v1.CounterService",
            "vallum.v1.TraceService",
            "vallum.v1.EngineService",
            "grpc.health.v1.Health",
        ] {
            assert!(names.iter().any(|n| n == s), "{s} missing from {names:?}");
        }
    }
    // The example is active and traffic flows.
    let eng = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let st = poll("a packet counted", 400, Duration::from_millis(25), || {
        let mut eng = eng.clone();
        async move {
            let st = eng
                .get_status(pb::GetStatusRequest {})
                .await
                .unwrap()
                .into_inner();
            (st.cores.iter().map(|c| c.packets).sum::<u64>() > 0).then_some(st)
        }
    })
    .await;
    assert_eq!(st.active.len(), 1);
    assert_eq!(st.active[0].ruleset, "host-firewall");
    assert_eq!(st.packet_source, "synthetic");
    // Trace: ssh from the outside is accepted through SSH-LIMIT, telnet dropped via LOG-DROP.
    let mut tr = pb::trace_service_client::TraceServiceClient::new(d.channel().await);
    let pkt = |port: u32| pb::PacketSpec {
        source: "198.51.100.7".into(),
        destination: "192.0.2.10".into(),
        protocol: "tcp".into(),
        source_port: 40000,
        destination_port: port,
        tcp_flags: "S".into(),
        in_interface: "eth0".into(),
        ..Default::default()
    };
    let t = tr
        .trace_packet(pb::TracePacketRequest {
            packet: Some(pkt(443)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.verdict(), pb::Verdict::Accept, "{t:#?}");
    assert_eq!(
        t.steps.last().unwrap().text,
        "-p tcp -m multiport --dports 80,443 -j ACCEPT",
        "{t:#?}"
    );
    // ssh goes through SSH-LIMIT; its verdict depends on the live -m limit bucket, which the
    // synthetic traffic drains.
    let t = tr
        .trace_packet(pb::TracePacketRequest {
            packet: Some(pkt(22)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(t.steps.iter().any(|s| s.chain == "SSH-LIMIT"), "{t:#?}");
    let t = tr
        .trace_packet(pb::TracePacketRequest {
            packet: Some(pkt(23)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.verdict(), pb::Verdict::Drop);
    assert!(
        t.steps
            .iter()
            .any(|s| s.chain == "LOG-DROP" && s.text == "-j DROP"),
        "{t:#?}"
    );
    // Counters move and export with counters shows them.
    let cs = pb::counter_service_client::CounterServiceClient::new(d.channel().await);
    poll(
        "a rule counter moved",
        400,
        Duration::from_millis(25),
        || {
            let mut cs = cs.clone();
            async move {
                let c = cs
                    .get_counters(pb::GetCountersRequest {
                        ruleset: "host-firewall".into(),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                c.counters.iter().any(|c| c.packets > 0).then_some(())
            }
        },
    )
    .await;
    let mut rs = d.rulesets().await;
    let ex = rs
        .export_revision(pb::ExportRevisionRequest {
            name: "rulesets/host-firewall/revisions/1".into(),
            format: 0,
            counters: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        ex.content.contains("-A LOG-DROP") && ex.content.contains("# ---- ip6tables-save ----")
    );
    let json = rs
        .export_revision(pb::ExportRevisionRequest {
            name: "rulesets/host-firewall/revisions/1".into(),
            format: pb::ExportFormat::Json as i32,
            counters: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(serde_json::from_str::<serde_json::Value>(&json.content).is_ok());
}

/// What the engine says about a file: commit, or which error.
fn expectation(text: &str, v6: bool) -> Result<(), (&'static str, Option<String>)> {
    let family = if v6 {
        vallum_engine::model::Family::Ipv6
    } else {
        vallum_engine::model::Family::Ipv4
    };
    let opts = ParseOptions {
        family,
        ..ParseOptions::default()
    };
    match parse_ruleset("t", text, &opts) {
        Err(errs) => {
            let nf = ParseOptions {
                noflush: true,
                ..opts
            };
            // Jumps alone to chains outside the text are undeclared chains (as
            // iptables-restore without --noflush); changing such chains is noflush input.
            let only_jumps = errs.0.iter().all(|e| {
                matches!(
                    e.kind,
                    vallum_engine::restore::ParseErrorKind::UnknownTarget { .. }
                )
            });
            match parse(text, &nf) {
                Ok(r) if !r.external.is_empty() && !only_jumps => {
                    Err(("NOFLUSH_UNSUPPORTED", None))
                }
                _ => Err(("INVALID_RULESET", None)),
            }
        }
        Ok(rs) => {
            // As vallumd validates: with a node view (pkttype and addrtype need the local table).
            let v = validate(&rs, Some(&vallum_engine::sets::SetManager::default()));
            let unsupported = v.iter().find_map(|v| match &v.kind {
                ViolationKind::Unsupported { name, .. } if v.severity == Severity::Error => {
                    Some(name.clone())
                }
                _ => None,
            });
            if let Some(name) = unsupported {
                Err(("UNSUPPORTED_EXTENSION", Some(name)))
            } else if v.iter().any(|v| v.severity == Severity::Error) {
                Err(("INVALID_RULESET", None))
            } else {
                Ok(())
            }
        }
    }
}

#[tokio::test]
#[ignore = "needs ../shared/data"]
async fn real_rulesets_commit_or_fail_clearly() {
    let Some(data) = shared_data() else {
        panic!("real_rulesets: ../shared/data not found");
    };
    let mut files = Vec::new();
    for sub in ["iptables-save", "iptables-tests/shell-dumps"] {
        match std::fs::read_dir(data.join(sub)) {
            Ok(rd) => files.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_file())),
            Err(e) => panic!("{sub}: {e}"),
        }
    }
    files.sort();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let (mut committed, mut refused) = (0, 0);
    for (i, f) in files.iter().enumerate() {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let fname = f.file_name().unwrap().to_string_lossy().to_string();
        let v6 = fname.contains("ip6tables");
        let expect = expectation(&text, v6);
        let mut req = apply_req(&format!("real-{i}"), &text);
        req.source = Some(text_source(&text, v6, &fname));
        let got = c.apply(req).await;
        match (&expect, &got) {
            (Ok(()), Ok(r)) => {
                committed += 1;
                assert_eq!(r.get_ref().revision.as_ref().unwrap().number, 1);
                eprintln!("{fname}: committed");
            }
            (Err((why, ext)), Err(s)) => {
                refused += 1;
                assert_eq!(s.code(), tonic::Code::InvalidArgument, "{fname}: {s:?}");
                assert_eq!(reason(s), *why, "{fname}: {}", s.message());
                if let Some(ext) = ext {
                    assert!(
                        s.message().contains(ext.as_str()),
                        "{fname}: message does not name {ext}: {}",
                        s.message()
                    );
                }
                eprintln!(
                    "{fname}: {why}: {}",
                    s.message().lines().next().unwrap_or("")
                );
            }
            _ => panic!("{fname}: expected {expect:?}, got {got:?}"),
        }
    }
    eprintln!("real rulesets: {committed} committed, {refused} refused");
    assert!(committed + refused > 0);
}

#[tokio::test]
#[ignore = "needs ../shared/data"]
async fn replay_pcaps_match_the_engine() {
    let Some(data) = shared_data() else {
        panic!("replay: ../shared/data not found");
    };
    let mut pcaps: Vec<_> = std::fs::read_dir(data.join("pcap"))
        .map(|r| {
            r.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
                .collect()
        })
        .unwrap_or_default();
    pcaps.sort();
    if pcaps.is_empty() {
        panic!("replay: no pcap");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    // No -m limit here: limit buckets are live state, so totals would depend on time.
    let active_text = "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:WEB - [0:0]\n-A INPUT -p icmp -j ACCEPT\n-A INPUT -p udp -m udp --dport 53 -j ACCEPT\n-A INPUT -p tcp -m multiport --dports 80,443,6346 -j WEB\n-A INPUT -p tcp -m tcp --tcp-flags SYN,RST,ACK,FIN SYN -j REJECT --reject-with tcp-reset\n-A WEB -s 10.0.0.0/8 -j DROP\n-A WEB -j ACCEPT\nCOMMIT\n";
    let staged_text = active_text.replace("80,443,6346", "443");
    rs.apply(apply_req("replay", active_text)).await.unwrap();
    let staged = rs
        .stage_revision(pb::StageRevisionRequest {
            ruleset: "replay".into(),
            source: Some(text_source(&staged_text, false, "staged")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let compile = |t: &str| {
        Snapshot::compile(
            &[Arc::new(
                parse_ruleset("replay", t, &ParseOptions::default()).unwrap(),
            )],
            &NoSets,
            1,
        )
        .unwrap()
    };
    let active = compile(active_text);
    let staged_snap = compile(&staged_text);
    let mut tr = pb::trace_service_client::TraceServiceClient::new(d.channel().await)
        .max_decoding_message_size(64 << 20);
    for p in pcaps {
        let bytes = std::fs::read(&p).unwrap();
        let r = tr
            .replay_capture(pb::ReplayCaptureRequest {
                capture: bytes.clone(),
                revision: staged.name.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let (mut a, mut s) = (pb::VerdictTotals::default(), pb::VerdictTotals::default());
        let caps = read_capture(&bytes).unwrap();
        let add = |t: &mut pb::VerdictTotals, v: &str| match v {
            "ACCEPT" => t.accepted += 1,
            "DROP" => t.dropped += 1,
            _ => t.rejected += 1,
        };
        for c in &caps {
            match c.parse(Packet::default()) {
                Ok(m) => {
                    add(&mut a, active.trace(&m, 0).verdict.name());
                    add(&mut s, staged_snap.trace(&m, 0).verdict.name());
                }
                Err(_) => {
                    a.unparsed += 1;
                    s.unparsed += 1;
                }
            }
        }
        eprintln!(
            "{}: {} packets, active {:?}, staged {:?}, {} changed flows",
            p.display(),
            r.packets,
            r.active,
            r.staged,
            r.changed_flows.len()
        );
        assert_eq!(r.packets, caps.len() as u64);
        assert_eq!(r.active.unwrap(), a, "{}", p.display());
        assert_eq!(r.staged.unwrap(), s, "{}", p.display());
        for f in &r.changed_flows {
            assert_ne!(f.active_verdict, f.staged_verdict);
        }
    }
}

#[tokio::test]
async fn kill9_during_commits_keeps_a_whole_revision() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let mut d = Daemon::start(&db, &["--source", "synthetic"]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    // The last acknowledged revision number, published by the committer.
    let (acked, mut last_acked) = tokio::sync::watch::channel(0u64);
    let committer = tokio::spawn(async move {
        for i in 0.. {
            match c.apply(apply_req("crash", &numbered(i))).await {
                Ok(r) => {
                    let n = r.into_inner().revision.unwrap().number;
                    assert_eq!(n, i as u64 + 1);
                    acked.send_replace(n);
                }
                Err(_) => break,
            }
        }
    });
    // Kill once some commits were acknowledged, while the committer keeps committing. When
    // the committer ended first (its assertion failed), `join` below reports why.
    let reached = last_acked.wait_for(|n| *n >= 20).await.is_ok();
    d.kill9();
    join(committer).await;
    assert!(reached, "the committer stopped before 20 commits");
    let last = *last_acked.borrow();
    let d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let rs = c
        .get_ruleset(pb::GetRulesetRequest {
            name: "crash".into(),
        })
        .await
        .unwrap()
        .into_inner();
    // Defined outcome: the last acknowledged revision, or the one in flight when its
    // transaction was already durable; never anything else.
    assert!(
        rs.active_revision == last || rs.active_revision == last + 1,
        "active {} last acked {last}",
        rs.active_revision
    );
    let rev = c
        .get_revision(pb::GetRevisionRequest {
            name: format!("rulesets/crash/revisions/{}", rs.active_revision),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rev.state, pb::RevisionState::Active as i32);
    let want = format!(
        "-A INPUT -s 10.{}.{}.0/24 -j DROP",
        ((rs.active_revision - 1) / 256) % 256,
        (rs.active_revision - 1) % 256
    );
    assert!(rev.content.contains(&want), "{} lacks {want}", rev.content);
    // The engine runs exactly that revision.
    let mut eng = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let st = eng
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.active[0].revision, rs.active_revision);
    eprintln!(
        "kill -9: last acked {last}, active after restart {}",
        rs.active_revision
    );
}

/// Group commit keeps every acknowledged commit: 16 clients, each on its own connection and
/// ruleset, commit as fast as they are answered (half ask for `full`, half for `normal`:
/// both promise to survive a crash of vallumd) until vallumd is killed with SIGKILL; after a
/// restart each ruleset's active revision is its last acknowledged one or the one in flight,
/// with that revision's text, and the engine runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_concurrent_commits_keeps_every_acknowledged_one() {
    const CLIENTS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let mut d = Daemon::start(&db, &["--source", "synthetic"]);
    d.wait_serving().await;
    let (acked, mut total) = tokio::sync::watch::channel(0usize);
    let acked = Arc::new(acked);
    let mut lasts = Vec::new();
    let mut committers = Vec::new();
    for k in 0..CLIENTS {
        let mut c = d.rulesets().await;
        let (last, rx) = tokio::sync::watch::channel(0u64);
        lasts.push(rx);
        let acked = acked.clone();
        let durability = if k % 2 == 0 {
            pb::Durability::Full
        } else {
            pb::Durability::Normal
        };
        committers.push(tokio::spawn(async move {
            for i in 0.. {
                let req = pb::ApplyRequest {
                    durability: durability as i32,
                    ..apply_req(&format!("crash-{k}"), &numbered(i))
                };
                match c.apply(req).await {
                    Ok(r) => {
                        let n = r.into_inner().revision.unwrap().number;
                        assert_eq!(n, i as u64 + 1, "client {k}");
                        last.send_replace(n);
                        acked.send_modify(|t| *t += 1);
                    }
                    Err(_) => break,
                }
            }
        }));
    }
    let reached = total.wait_for(|n| *n >= 20 * CLIENTS).await.is_ok();
    d.kill9();
    for t in committers {
        join(t).await;
    }
    assert!(
        reached,
        "the committers stopped before {} commits",
        20 * CLIENTS
    );
    let d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let mut eng = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let st = eng
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut acked_total = 0;
    for (k, last) in lasts.iter().enumerate() {
        let last = *last.borrow();
        acked_total += last;
        let name = format!("crash-{k}");
        let rs = c
            .get_ruleset(pb::GetRulesetRequest { name: name.clone() })
            .await
            .unwrap()
            .into_inner();
        assert!(
            rs.active_revision == last || rs.active_revision == last + 1,
            "{name}: active {} last acked {last}",
            rs.active_revision
        );
        let rev = c
            .get_revision(pb::GetRevisionRequest {
                name: format!("rulesets/{name}/revisions/{}", rs.active_revision),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(rev.state, pb::RevisionState::Active as i32, "{name}");
        let want = format!(
            "-A INPUT -s 10.{}.{}.0/24 -j DROP",
            ((rs.active_revision - 1) / 256) % 256,
            (rs.active_revision - 1) % 256
        );
        assert!(
            rev.content.contains(&want),
            "{name}: {} lacks {want}",
            rev.content
        );
        let running = st.active.iter().find(|a| a.ruleset == name);
        assert_eq!(
            running.map(|a| a.revision),
            Some(rs.active_revision),
            "{name}: the engine runs another revision"
        );
    }
    eprintln!("kill -9 with {CLIENTS} clients: {acked_total} commits acknowledged, all kept");
}

/// The nice values of vallumd `pid`'s threads, from `/proc/PID/task/*/stat` (proc(5): field
/// 19 is the nice value): the packet workers (`vallum-core-K`), sorted, and the others.
type Nices = Vec<(String, i32)>;
fn thread_nices(pid: u32) -> (Nices, Nices) {
    let tasks = format!("/proc/{pid}/task");
    let (mut workers, mut others) = (Vec::new(), Vec::new());
    for t in std::fs::read_dir(&tasks).unwrap() {
        let Ok(stat) = std::fs::read_to_string(t.unwrap().path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        // `pid (comm) state ...`: the fields after the last ')' start at field 3.
        let (head, rest) = stat.rsplit_once(')').unwrap();
        let comm = head.split_once('(').unwrap().1.to_string();
        let nice: i32 = rest
            .split_whitespace()
            .nth(19 - 3)
            .unwrap()
            .parse()
            .unwrap();
        if comm.starts_with("vallum-core-") {
            workers.push((comm, nice));
        } else {
            others.push((comm, nice));
        }
    }
    workers.sort();
    (workers, others)
}

/// [`thread_nices`] once vallumd's two workers exist at nice `want` (each sets its own nice
/// when it starts, which may come after SERVING), or as they are after 10 s.
async fn worker_nices(pid: u32, want: i32) -> (Nices, Nices) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (workers, others) = thread_nices(pid);
        let settled = workers.len() == 2 && workers.iter().all(|(_, n)| *n == want);
        if settled || tokio::time::Instant::now() > until {
            return (workers, others);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `--worker-nice N`: every packet worker thread (`vallum-core-K`) runs at nice N, the rest
/// of vallumd (the gRPC runtime, the store's threads) at its own nice 0.
#[tokio::test]
async fn worker_nice_lowers_only_the_packet_workers() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--source", "synthetic", "--worker-nice", "7"],
    );
    d.wait_serving().await;
    let (workers, others) = worker_nices(d.pid(), 7).await;
    // One worker per engine core (the harness gives vallumd 2).
    assert_eq!(
        workers,
        [
            ("vallum-core-0".to_string(), 7),
            ("vallum-core-1".to_string(), 7)
        ]
    );
    assert!(
        others.iter().all(|(_, nice)| *nice == 0),
        "other threads were lowered too: {others:?}"
    );
    assert!(others.len() >= 2, "{others:?}");
}

/// Without `--worker-nice` the workers run 10 steps below vallumd's own nice, whatever it
/// started with (here 3: workers at 13), and never past 19 (started at 15: workers at 19).
#[tokio::test]
async fn workers_run_ten_nice_steps_below_vallumd_by_default() {
    for (start, want) in [(3, 13), (15, 19)] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = support::vallumd::command();
        cmd.arg("--db")
            .arg(dir.path().join("v.db"))
            .args(["--cores", "2", "--source", "synthetic"])
            .args(support::vallumd::harness_flags(&[]))
            .env_remove("VALLUM_WORKER_NICE");
        // SAFETY: the closure runs in the forked child before exec and only calls
        // setpriority(2), which is async-signal-safe; it takes no lock and allocates nothing.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                if libc::setpriority(libc::PRIO_PROCESS, 0, start) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let d = Daemon::spawn(cmd, |_| {});
        d.wait_serving().await;
        let (workers, others) = worker_nices(d.pid(), want).await;
        assert_eq!(
            workers,
            [
                ("vallum-core-0".to_string(), want),
                ("vallum-core-1".to_string(), want)
            ],
            "vallumd started at nice {start}"
        );
        assert!(
            others.iter().all(|(_, nice)| *nice == start),
            "vallumd started at nice {start}: {others:?}"
        );
    }
}

#[tokio::test]
async fn concurrent_commits_under_traffic() {
    let dir = tempfile::tempdir().unwrap();
    // Keep every revision (0), so that all 200 per ruleset can be listed below.
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--source", "synthetic", "--max-revisions-kept", "0"],
    );
    d.wait_serving().await;
    let mut tasks = Vec::new();
    for client in 0..8 {
        let mut c = d.rulesets().await;
        tasks.push(tokio::spawn(async move {
            let ruleset = format!("shared-{}", client % 2);
            let mut seen = Vec::new();
            for i in 0..50 {
                let r = c
                    .apply(apply_req(&ruleset, &numbered(client * 100 + i)))
                    .await
                    .expect("apply");
                seen.push(r.into_inner().revision.unwrap().number);
            }
            assert!(
                seen.windows(2).all(|w| w[0] < w[1]),
                "not increasing: {seen:?}"
            );
            (ruleset, seen)
        }));
    }
    let mut all: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for t in tasks {
        let (r, seen) = join(t).await;
        all.entry(r).or_default().extend(seen);
    }
    let mut c = d.rulesets().await;
    for (r, mut nums) in all {
        nums.sort();
        assert_eq!(
            nums,
            (1..=200).collect::<Vec<u64>>(),
            "{r}: lost or duplicated revisions"
        );
        let rs = c
            .get_ruleset(pb::GetRulesetRequest { name: r.clone() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(rs.latest_revision, 200);
        assert_eq!(rs.active_revision, 200);
        let list = c
            .list_revisions(pb::ListRevisionsRequest {
                ruleset: r.clone(),
                page_size: 1000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(list.revisions.len(), 200);
    }
    let eng = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    poll("a packet counted", 400, Duration::from_millis(25), || {
        let mut eng = eng.clone();
        async move {
            let st = eng
                .get_status(pb::GetStatusRequest {})
                .await
                .unwrap()
                .into_inner();
            (st.cores.iter().map(|c| c.packets).sum::<u64>() > 0).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn etags_idempotency_diff_rollback_and_parse_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let r1 = c.apply(apply_req("cc", BASE)).await.unwrap().into_inner();
    // Wrong etag: FAILED_PRECONDITION with PreconditionFailure.
    let mut bad = apply_req("cc", &numbered(1));
    bad.etag = "nope".into();
    let e = c.apply(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&e), "ETAG_MISMATCH");
    // Idempotent retry.
    let mut req = apply_req("cc", &numbered(2));
    req.request_id = "req-1".into();
    req.etag = r1.etag.clone();
    let a = c.apply(req.clone()).await.unwrap().into_inner();
    let b = c.apply(req).await.unwrap().into_inner();
    assert_eq!(a.revision.unwrap().number, b.revision.unwrap().number);
    // Diff and rollback.
    let r3 = c
        .apply(apply_req("cc", &numbered(5)))
        .await
        .unwrap()
        .into_inner()
        .revision
        .unwrap();
    let diff = c
        .diff_revisions(pb::DiffRevisionsRequest {
            base: "rulesets/cc/revisions/1".into(),
            target: r3.name.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(diff.chains.len(), 1);
    assert_eq!(diff.chains[0].added, vec!["-s 10.0.5.0/24 -j DROP"]);
    let rb = c
        .rollback(pb::RollbackRequest {
            name: "rulesets/cc/revisions/1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rb.revision.unwrap().digest, r1.revision.unwrap().digest);
    // A parse error names FILE:LINE:COL.
    let e = c
        .apply(apply_req(
            "cc",
            "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT --bogus\nCOMMIT\n",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    use tonic_types::StatusExt;
    let br = e.get_error_details().bad_request().cloned().unwrap();
    assert!(
        br.field_violations[0]
            .description
            .starts_with("test.rules:3:"),
        "{br:?}"
    );
}

/// Hooks whose clock (confirm deadlines included) is `clock`.
fn on_clock(clock: &ManualClock) -> Hooks {
    Hooks {
        clock: clock.clock(),
        ..Hooks::default()
    }
}

/// The next event of `watch` (the bound only turns a hang into a failure).
async fn next_event(watch: &mut tonic::Streaming<pb::CommitEvent>) -> pb::CommitEvent {
    tokio::time::timeout(Duration::from_secs(60), watch.message())
        .await
        .expect("an event")
        .expect("the stream")
        .expect("not ended")
}

async fn state(c: &mut Rulesets, ruleset: &str, n: u64) -> pb::Revision {
    c.get_revision(pb::GetRevisionRequest {
        name: format!("rulesets/{ruleset}/revisions/{n}"),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Commit-confirmed over gRPC, on an injected clock (vallumd in this process): pending until
/// the clock passes the deadline, then rolled back to the previous content as a new
/// revision; a confirmed one stays after its deadline. Nothing waits for real time.
#[tokio::test]
async fn commit_confirmed_rolls_back_at_the_deadline_and_stays_when_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let d = Daemon::in_process(
        &dir.path().join("v.db"),
        &["--confirm-check-interval", "0.01"],
        on_clock(&clock),
    )
    .await;
    let mut c = d.rulesets().await;
    c.apply(apply_req("cc", BASE)).await.unwrap();
    c.apply(apply_req("cc", &numbered(2))).await.unwrap();
    let mut watch = c
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: "cc".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Revision 3, to be confirmed within 300 s: the deadline is on the injected clock.
    let mut req = apply_req("cc", &numbered(3));
    req.confirm_within = Some(prost_types::Duration {
        seconds: 300,
        nanos: 0,
    });
    let r3 = c.apply(req).await.unwrap().into_inner();
    let deadline = r3.confirm_deadline.expect("a deadline");
    let want = clock.unix_ns() + 300_000_000_000;
    assert_eq!(
        (deadline.seconds, deadline.nanos),
        (want / 1_000_000_000, (want % 1_000_000_000) as i32)
    );
    assert_eq!(
        r3.revision.as_ref().unwrap().state,
        pb::RevisionState::PendingConfirm as i32
    );
    let ev = next_event(&mut watch).await;
    assert_eq!(ev.outcome, pb::CommitOutcome::Committed as i32);
    // The clock has not moved: still pending, whatever the timer did meanwhile.
    assert_eq!(
        state(&mut c, "cc", 3).await.state,
        pb::RevisionState::PendingConfirm as i32
    );
    clock.advance(Duration::from_secs(300));
    let ev = next_event(&mut watch).await;
    assert_eq!(ev.outcome, pb::CommitOutcome::Reverted as i32);
    assert_eq!(ev.revision, "rulesets/cc/revisions/4");
    let rs = c
        .get_ruleset(pb::GetRulesetRequest { name: "cc".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rs.active_revision, 4);
    assert_eq!(
        state(&mut c, "cc", 3).await.state,
        pb::RevisionState::Rejected as i32
    );
    let (r2, r4) = (state(&mut c, "cc", 2).await, state(&mut c, "cc", 4).await);
    assert_eq!(r2.digest, r4.digest);

    // Confirmed in time (5): it stays once its deadline passed. Revision 6, not confirmed,
    // with the same deadline, shows that the timer ran after the clock moved past it.
    let within = Some(prost_types::Duration {
        seconds: 30,
        nanos: 0,
    });
    let mut req = apply_req("cc", &numbered(5));
    req.confirm_within = within;
    let r5 = c.apply(req).await.unwrap().into_inner().revision.unwrap();
    c.confirm_commit(pb::ConfirmCommitRequest {
        name: r5.name.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let e = c
        .confirm_commit(pb::ConfirmCommitRequest {
            name: r5.name.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let mut req = apply_req("cc", &numbered(6));
    req.confirm_within = within;
    c.apply(req).await.unwrap();
    clock.advance(Duration::from_secs(30));
    let mut outcomes = Vec::new();
    while outcomes.len() < 4 {
        let ev = next_event(&mut watch).await;
        outcomes.push((ev.revision, ev.outcome));
    }
    let name = |n: u64| format!("rulesets/cc/revisions/{n}");
    assert_eq!(
        outcomes,
        [
            (name(5), pb::CommitOutcome::Committed as i32),
            (name(5), pb::CommitOutcome::Confirmed as i32),
            (name(6), pb::CommitOutcome::Committed as i32),
            (name(7), pb::CommitOutcome::Reverted as i32),
        ]
    );
    let r7 = state(&mut c, "cc", 7).await;
    assert_eq!(r7.state, pb::RevisionState::Active as i32);
    assert_eq!(r7.digest, state(&mut c, "cc", 5).await.digest);
    d.stop().await;
}

/// The confirm deadline is stored: a commit made with `confirm_within` by a vallumd process,
/// then a kill -9, is still pending in the vallumd started next on the same database (in this
/// process, on an injected clock) and rolled back by it once its clock passes the deadline.
#[tokio::test]
async fn confirm_deadline_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let mut d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    c.apply(apply_req("cr", &numbered(1))).await.unwrap();
    let mut req = apply_req("cr", &numbered(2));
    // An hour on the system clock: the restarted vallumd's clock starts at the system time,
    // so the deadline has not passed there until the test advances it.
    req.confirm_within = Some(prost_types::Duration {
        seconds: 3600,
        nanos: 0,
    });
    let r2 = c.apply(req).await.unwrap().into_inner();
    assert_eq!(
        r2.revision.as_ref().unwrap().state,
        pb::RevisionState::PendingConfirm as i32
    );
    d.kill9();

    let clock = ManualClock::starting_now();
    let d = Daemon::in_process(&db, &["--confirm-check-interval", "0.01"], on_clock(&clock)).await;
    let mut c = d.rulesets().await;
    let mut watch = c
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: "cr".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        state(&mut c, "cr", 2).await.state,
        pb::RevisionState::PendingConfirm as i32
    );
    clock.advance(Duration::from_secs(3600));
    let ev = next_event(&mut watch).await;
    assert_eq!(
        (ev.revision.as_str(), ev.outcome),
        (
            "rulesets/cr/revisions/3",
            pb::CommitOutcome::Reverted as i32
        )
    );
    let rs = c
        .get_ruleset(pb::GetRulesetRequest { name: "cr".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rs.active_revision, 3);
    let r1 = state(&mut c, "cr", 1).await;
    let r2 = state(&mut c, "cr", 2).await;
    let r3 = state(&mut c, "cr", 3).await;
    assert_eq!(r2.state, pb::RevisionState::Rejected as i32);
    assert_eq!(r3.state, pb::RevisionState::Active as i32);
    assert_eq!(r1.digest, r3.digest);
    d.stop().await;
}
