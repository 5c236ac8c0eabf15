//! End-to-end tests against real `vallumd` processes (ephemeral ports, temporary databases).
//!
//! Cases: health NOT_SERVING -> SERVING and reflection; the Quick start (example + synthetic
//! traffic) with traces; every real ruleset of ../shared/data (commit, or a clear
//! INVALID_ARGUMENT); pcap replay checked against the engine run in the test; kill -9 during
//! commits; 8 concurrent clients x 50 commits under traffic; commit-confirmed rollback;
//! idempotency and etags.

#[path = "support/vallumd.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Vallumd, reason, shared_data, text_source};
use vallum_engine::compile::Snapshot;
use vallum_engine::packet::PacketMeta;
use vallum_engine::packet::pcap::read_capture;
use vallum_engine::restore::{ParseOptions, parse, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::validate::{Severity, ViolationKind, validate};
use vallum_proto::v1 as pb;

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
    let d = Vallumd::start(
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut eng = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let st = eng
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.active.len(), 1);
    assert_eq!(st.active[0].ruleset, "host-firewall");
    assert!(
        st.cores.iter().map(|c| c.packets).sum::<u64>() > 0,
        "{st:?}"
    );
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
    assert_eq!(t.verdict, "ACCEPT", "{t:#?}");
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
    assert_eq!(t.verdict, "DROP");
    assert!(
        t.steps
            .iter()
            .any(|s| s.chain == "LOG-DROP" && s.text == "-j DROP"),
        "{t:#?}"
    );
    // Counters move and export with counters shows them.
    let mut cs = pb::counter_service_client::CounterServiceClient::new(d.channel().await);
    let c = cs
        .get_counters(pb::GetCountersRequest {
            ruleset: "host-firewall".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(c.counters.iter().any(|c| c.packets > 0));
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
        Err(_) => {
            let nf = ParseOptions {
                noflush: true,
                ..opts
            };
            match parse(text, &nf) {
                Ok(r) if !r.external.is_empty() => Err(("NOFLUSH_UNSUPPORTED", None)),
                _ => Err(("INVALID_RULESET", None)),
            }
        }
        Ok(rs) => {
            let v = validate(&rs, Some(&NoSets));
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
async fn real_rulesets_commit_or_fail_clearly() {
    let Some(data) = shared_data() else {
        eprintln!("SKIP real_rulesets: ../shared/data not found");
        return;
    };
    let mut files = Vec::new();
    for sub in ["iptables-save", "iptables-tests/shell-dumps"] {
        match std::fs::read_dir(data.join(sub)) {
            Ok(rd) => files.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_file())),
            Err(_) => eprintln!("SKIP {sub}: not found"),
        }
    }
    files.sort();
    let dir = tempfile::tempdir().unwrap();
    let d = Vallumd::start(&dir.path().join("v.db"), &[]);
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
async fn replay_pcaps_match_the_engine() {
    let Some(data) = shared_data() else {
        eprintln!("SKIP replay: ../shared/data not found");
        return;
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
        eprintln!("SKIP replay: no pcap");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Vallumd::start(&dir.path().join("v.db"), &[]);
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
            match c.parse(PacketMeta::default()) {
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
    let mut d = Vallumd::start(&db, &["--source", "synthetic"]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let a2 = acked.clone();
    let committer = tokio::spawn(async move {
        for i in 0.. {
            match c.apply(apply_req("crash", &numbered(i))).await {
                Ok(r) => {
                    let n = r.into_inner().revision.unwrap().number;
                    assert_eq!(n, i as u64 + 1);
                    a2.store(n, std::sync::atomic::Ordering::SeqCst);
                }
                Err(_) => break,
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.kill9();
    let _ = committer.await;
    let last = acked.load(std::sync::atomic::Ordering::SeqCst);
    assert!(last > 0, "no commit acknowledged before the kill");
    let d = Vallumd::start(&db, &[]);
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
    let expect =
        vallum_server::content::check("crash", 0, &vallum_server::example::input(), &NoSets)
            .map(|_| ())
            .ok();
    let _ = expect;
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

#[tokio::test]
async fn concurrent_commits_under_traffic() {
    let dir = tempfile::tempdir().unwrap();
    // Keep every revision (0), so that all 200 per ruleset can be listed below.
    let d = Vallumd::start(
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
        let (r, seen) = t.await.unwrap();
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
    let mut eng = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let st = eng
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(st.cores.iter().map(|c| c.packets).sum::<u64>() > 0);
}

#[tokio::test]
async fn commit_confirmed_rolls_back_and_etags_and_idempotency() {
    let dir = tempfile::tempdir().unwrap();
    let d = Vallumd::start(
        &dir.path().join("v.db"),
        &["--confirm-check-interval", "0.1"],
    );
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
    // Commit confirmed, not confirmed: reverted to revision 2's content as revision 4.
    let mut req = apply_req("cc", &numbered(3));
    req.confirm_within = Some(prost_types::Duration {
        seconds: 0,
        nanos: 300_000_000,
    });
    let mut watch = c
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: "cc".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let r3 = c.apply(req).await.unwrap().into_inner();
    assert!(r3.confirm_deadline.is_some());
    assert_eq!(
        r3.revision.as_ref().unwrap().state,
        pb::RevisionState::PendingConfirm as i32
    );
    let ev = watch.message().await.unwrap().unwrap();
    assert_eq!(ev.outcome, pb::CommitOutcome::Committed as i32);
    let ev = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.outcome, pb::CommitOutcome::Reverted as i32);
    assert_eq!(ev.revision, "rulesets/cc/revisions/4");
    let rs = c
        .get_ruleset(pb::GetRulesetRequest { name: "cc".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rs.active_revision, 4);
    let r3 = c
        .get_revision(pb::GetRevisionRequest {
            name: "rulesets/cc/revisions/3".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r3.state, pb::RevisionState::Rejected as i32);
    let r2 = c
        .get_revision(pb::GetRevisionRequest {
            name: "rulesets/cc/revisions/2".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let r4 = c
        .get_revision(pb::GetRevisionRequest {
            name: "rulesets/cc/revisions/4".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r2.digest, r4.digest);
    // Confirmed in time: stays.
    let mut req = apply_req("cc", &numbered(5));
    req.confirm_within = Some(prost_types::Duration {
        seconds: 30,
        nanos: 0,
    });
    let r5 = c.apply(req).await.unwrap().into_inner().revision.unwrap();
    c.confirm_commit(pb::ConfirmCommitRequest {
        name: r5.name.clone(),
    })
    .await
    .unwrap();
    let e = c
        .confirm_commit(pb::ConfirmCommitRequest {
            name: r5.name.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    // Diff and rollback.
    let diff = c
        .diff_revisions(pb::DiffRevisionsRequest {
            from: "rulesets/cc/revisions/1".into(),
            to: r5.name.clone(),
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

/// The confirm deadline is stored: a commit made with `confirm_within`, then a kill -9 before
/// the deadline, is rolled back by the restarted vallumd once the deadline passes.
#[tokio::test]
async fn confirm_deadline_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let mut d = Vallumd::start(&db, &["--confirm-check-interval", "0.1"]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    c.apply(apply_req("cr", &numbered(1))).await.unwrap();
    let mut req = apply_req("cr", &numbered(2));
    req.confirm_within = Some(prost_types::Duration {
        seconds: 2,
        nanos: 0,
    });
    let r2 = c.apply(req).await.unwrap().into_inner();
    assert_eq!(
        r2.revision.as_ref().unwrap().state,
        pb::RevisionState::PendingConfirm as i32
    );
    d.kill9();

    let d = Vallumd::start(&db, &["--confirm-check-interval", "0.1"]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    // Still pending right after the restart (the deadline is 2 s after the commit), then rolled
    // back to revision 1's content as revision 3.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let rs = loop {
        let rs = c
            .get_ruleset(pb::GetRulesetRequest { name: "cr".into() })
            .await
            .unwrap()
            .into_inner();
        if rs.active_revision == 3 || std::time::Instant::now() > deadline {
            break rs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rs.active_revision, 3, "not rolled back after the restart");
    let get = |n: u64| pb::GetRevisionRequest {
        name: format!("rulesets/cr/revisions/{n}"),
    };
    let r1 = c.get_revision(get(1)).await.unwrap().into_inner();
    let r2 = c.get_revision(get(2)).await.unwrap().into_inner();
    let r3 = c.get_revision(get(3)).await.unwrap().into_inner();
    assert_eq!(r2.state, pb::RevisionState::Rejected as i32);
    assert_eq!(r3.state, pb::RevisionState::Active as i32);
    assert_eq!(r1.digest, r3.digest);
}
