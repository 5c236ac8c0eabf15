//! End-to-end tests of the operational side against real `vallumd` processes (ephemeral ports,
//! temporary databases).
//!
//! Cases: a live `/metrics` scrape under synthetic traffic with the example ruleset (every
//! design metric present with sane values; `promtool check metrics` in an ignored test, it needs
//! promtool); bearer tokens (none, read-only, admin) and the audit author; revisions-kept
//! pruning and the rules limit; `vallumctl` against the real server (status, apply with a
//! syntax error, counters, an unreachable server).

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::{Daemon, reason, text_source};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vallum_proto::v1 as pb;
use vallum_proto::v1::engine_service_client::EngineServiceClient;

const BASE: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 23 -j DROP\nCOMMIT\n";

fn apply_req(ruleset: &str, text: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        source: Some(text_source(text, false, "test.rules")),
        ..Default::default()
    }
}

/// `GET /metrics` over plain HTTP/1.1; the body.
async fn scrape(addr: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: vallumd\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "unexpected chunked body: {head}"
    );
    body.to_string()
}

/// One sample line: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the samples of a text exposition (label values without escaped quotes or commas,
/// which holds for ours).
fn samples(body: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in body.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let rest = rest.strip_suffix('}').unwrap();
                let labels = rest
                    .split(',')
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap();
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), BTreeMap::new()),
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|e| panic!("{line}: {e}")),
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// The samples named `name` whose labels include every pair of `with`.
fn find<'a>(all: &'a [Sample], name: &str, with: &[(&str, &str)]) -> Vec<&'a Sample> {
    all.iter()
        .filter(|s| {
            s.name == name
                && with
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

fn sum(all: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    find(all, name, with).iter().map(|s| s.value).sum()
}

#[tokio::test]
async fn metrics_scrape_under_traffic() {
    scrape_under_traffic(false).await;
}

/// As [`metrics_scrape_under_traffic`], and the scrape passes `promtool check metrics`.
#[tokio::test]
#[ignore = "needs promtool (Debian prometheus)"]
async fn metrics_scrape_under_traffic_passes_promtool() {
    scrape_under_traffic(true).await;
}

async fn scrape_under_traffic(promtool: bool) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--example", "--source", "synthetic"],
    );
    d.wait_serving().await;
    // One more commit over gRPC, under traffic, and one refused call.
    let mut c = d.rulesets().await;
    c.apply(apply_req("web", BASE)).await.unwrap();
    let e = c
        .apply(apply_req("web", "*filter\n-A\n"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // The barrier is sampled one batch in 1024 per core: wait for a sample.
    let mut body = String::new();
    let until = tokio::time::Instant::now() + support::PATIENCE;
    while tokio::time::Instant::now() < until {
        body = scrape(&d.metrics_addr).await;
        let s = samples(&body);
        // The quiesce phase is recorded when the replaced snapshot is retired, after the
        // reply: wait for both commits' (the example's and the Apply's).
        let quiesced = sum(
            &s,
            "vallum_commit_duration_seconds_count",
            &[("phase", "quiesce"), ("outcome", "committed")],
        );
        if sum(&s, "vallum_packet_barrier_seconds_count", &[]) > 0.0 && quiesced >= 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = samples(&body);

    // Commit phases, persist and quiesce included, for the example and the Apply.
    for phase in [
        "validate", "compile", "persist", "publish", "quiesce", "carry", "total",
    ] {
        let count = sum(
            &s,
            "vallum_commit_duration_seconds_count",
            &[("phase", phase), ("outcome", "committed")],
        );
        assert!(count >= 2.0, "phase {phase}: count {count}\n{body}");
        let total = sum(
            &s,
            "vallum_commit_duration_seconds_sum",
            &[("phase", phase), ("outcome", "committed")],
        );
        assert!((0.0..60.0).contains(&total), "phase {phase}: sum {total}");
    }
    assert!(
        sum(
            &s,
            "vallum_commit_duration_seconds_sum",
            &[("phase", "persist"), ("outcome", "committed")]
        ) > 0.0,
        "persist takes time (an fsync)"
    );
    assert!(
        !find(&s, "vallum_commit_quiesce_cores_waited_count", &[]).is_empty(),
        "{body}"
    );
    assert_eq!(
        sum(
            &s,
            "vallum_commits_total",
            &[("ruleset", "host-firewall"), ("outcome", "committed")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &s,
            "vallum_commits_total",
            &[("ruleset", "web"), ("outcome", "committed")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &s,
            "vallum_active_revision",
            &[("ruleset", "host-firewall")]
        ),
        1.0
    );
    assert_eq!(
        sum(&s, "vallum_active_revision", &[("ruleset", "web")]),
        1.0
    );

    // Engine-fed metrics.
    let barrier = sum(&s, "vallum_packet_barrier_seconds_count", &[]);
    assert!(barrier > 0.0, "no barrier sample\n{body}");
    let barrier_sum = sum(&s, "vallum_packet_barrier_seconds_sum", &[]);
    assert!(
        (0.0..1.0).contains(&(barrier_sum / barrier)),
        "mean barrier {barrier_sum}/{barrier}"
    );
    let inf = find(
        &s,
        "vallum_packet_barrier_seconds_bucket",
        &[("le", "+Inf")],
    );
    assert_eq!(inf.len(), 1, "{body}");
    assert_eq!(inf[0].value, barrier);
    assert_eq!(
        inf[0].labels.get("strategy").map(String::as_str),
        Some("seqcst")
    );
    assert!(sum(&s, "vallum_packets_total", &[("ruleset", "all")]) > 0.0);
    let generations = find(&s, "vallum_core_generation", &[]);
    assert_eq!(generations.len(), 2, "--cores 2: {generations:?}");
    assert!(generations.iter().any(|g| g.value > 0.0), "{generations:?}");

    // RPC durations, with method and status code (OTel RPC conventions after 1.37).
    let apply_ok = sum(
        &s,
        "rpc_server_call_duration_seconds_count",
        &[
            ("rpc_system_name", "grpc"),
            ("rpc_method", "vallum.v1.RulesetService/Apply"),
            ("rpc_response_status_code", "OK"),
        ],
    );
    assert_eq!(apply_ok, 1.0, "{body}");
    let apply_bad = sum(
        &s,
        "rpc_server_call_duration_seconds_count",
        &[
            ("rpc_method", "vallum.v1.RulesetService/Apply"),
            ("rpc_response_status_code", "INVALID_ARGUMENT"),
        ],
    );
    assert_eq!(apply_bad, 1.0, "{body}");
    // A refusal is the caller's error, not the server's: no error.type.
    let refused = find(
        &s,
        "rpc_server_call_duration_seconds_count",
        &[("rpc_response_status_code", "INVALID_ARGUMENT")],
    );
    assert!(
        refused.iter().all(|r| !r.labels.contains_key("error_type")),
        "{refused:?}"
    );
    assert!(sum(&s, "rpc_server_call_duration_seconds_sum", &[]) > 0.0);
    // The deprecated name (conventions up to 1.37) still counts the same calls.
    let deprecated_ok = sum(
        &s,
        "rpc_server_duration_seconds_count",
        &[
            ("rpc_service", "vallum.v1.RulesetService"),
            ("rpc_method", "Apply"),
            ("rpc_grpc_status_code", "0"),
        ],
    );
    assert_eq!(deprecated_ok, 1.0, "{body}");

    if !promtool {
        return;
    }
    // promtool's own check of the live scrape.
    match std::process::Command::new("promtool")
        .arg("--version")
        .output()
    {
        Err(e) => panic!("`promtool check metrics`: promtool not runnable ({e})"),
        Ok(_) => {
            use std::io::Write as _;
            let mut child = std::process::Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics: {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

const ADMIN: &str = "admin-token-0123456789abcdef";
const READER: &str = "reader-token-0123456789abcdef";

fn with_token<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p.display().to_string()
}

#[tokio::test]
async fn tokens_and_roles() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write(
        dir.path(),
        "tokens",
        &format!("# role token name\nadmin {ADMIN} alice\nread-only {READER} bob\n"),
    );
    let d = Daemon::start(&dir.path().join("v.db"), &["--token-file", &tokens]);
    let mut c = d.rulesets().await;
    let mut eng = EngineServiceClient::new(d.channel().await);

    // No token: UNAUTHENTICATED, even for reads.
    let e = c
        .apply(with_token(apply_req("web", BASE), None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert_eq!(reason(&e), "TOKEN_MISSING");
    let e = eng
        .get_status(with_token(pb::GetStatusRequest {}, None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    // A wrong token.
    let e = c
        .apply(with_token(
            apply_req("web", BASE),
            Some("not-a-configured-token"),
        ))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (tonic::Code::Unauthenticated, "TOKEN_INVALID")
    );
    // Read-only: Apply refused, GetStatus works.
    let e = c
        .apply(with_token(apply_req("web", BASE), Some(READER)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(reason(&e), "ADMIN_REQUIRED");
    let st = eng
        .get_status(with_token(pb::GetStatusRequest {}, Some(READER)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.cores.len(), 2);

    // Admin: Apply works (retried while the server still loads its state).
    let mut applied = None;
    let until = tokio::time::Instant::now() + support::PATIENCE;
    while tokio::time::Instant::now() < until {
        match c
            .apply(with_token(apply_req("web", BASE), Some(ADMIN)))
            .await
        {
            Ok(r) => {
                applied = Some(r.into_inner());
                break;
            }
            Err(e) if e.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => panic!("admin apply: {e:?}"),
        }
    }
    let rev = applied.expect("admin apply").revision.unwrap();
    // The audit author is the token's name.
    assert_eq!(rev.author, "alice");
    // The reader sees it.
    let st = eng
        .get_status(with_token(pb::GetStatusRequest {}, Some(READER)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.active.len(), 1, "{st:?}");
}

#[tokio::test]
async fn revisions_kept_and_rules_limit() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--max-revisions-kept", "3", "--max-rules", "2"],
    );
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    for i in 0..6 {
        let text =
            format!("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s 10.0.{i}.0/24 -j DROP\nCOMMIT\n");
        c.apply(apply_req("web", &text)).await.unwrap();
    }
    let list = c
        .list_revisions(pb::ListRevisionsRequest {
            ruleset: "web".into(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut numbers: Vec<u64> = list.revisions.iter().map(|r| r.number).collect();
    numbers.sort();
    assert_eq!(numbers, vec![4, 5, 6]);
    let rs = c
        .get_ruleset(pb::GetRulesetRequest { name: "web".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rs.active_revision, 6);

    let big = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s 10.0.0.1 -j DROP\n-A INPUT -s 10.0.0.2 -j DROP\n-A INPUT -s 10.0.0.3 -j DROP\nCOMMIT\n";
    let e = c.apply(apply_req("web", big)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&e), "TOO_MANY_RULES");
    let e = c.apply(apply_req("no/such", big)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // One audit record per Apply: the six commits' went in with their commit transactions,
    // the refused ones on their own, with the reason.
    let db = rusqlite::Connection::open(dir.path().join("v.db")).unwrap();
    let rows: Vec<(String, String)> = db
        .prepare("SELECT method, outcome FROM audit ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let outcomes: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert!(rows.iter().all(|r| r.0 == "Apply"), "{rows:?}");
    assert_eq!(outcomes[..6], ["OK"; 6], "{rows:?}");
    assert_eq!(outcomes[6], "TOO_MANY_RULES", "{rows:?}");
    assert_eq!(outcomes.len(), 8, "{rows:?}");
    assert_ne!(outcomes[7], "OK", "{rows:?}");
    drop(db);
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn vallumctl(server: &str, args: &[&str]) -> Run {
    let out = std::process::Command::new(support::vallumctl())
        .args(["--server", server, "--timeout", "10s"])
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vallumctl_against_vallumd() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--example", "--source", "synthetic"],
    );
    d.wait_serving().await;
    let url = d.url();

    let r = vallumctl(&url, &["status"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("host-firewall"), "{}", r.stdout);

    let bad = write(
        dir.path(),
        "bad.rules",
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT --bogus-flag -j DROP\nCOMMIT\n",
    );
    let r = vallumctl(&url, &["apply", "web", &bad]);
    assert_eq!(r.code, 1, "stdout {} stderr {}", r.stdout, r.stderr);
    let located = format!("{bad}:4:");
    let line = r
        .stderr
        .lines()
        .find(|l| l.starts_with(&located))
        .unwrap_or_else(|| panic!("no {located}COL: line in {}", r.stderr));
    let col = line[located.len()..].split(':').next().unwrap();
    assert!(col.parse::<u32>().is_ok(), "{line}");

    let r = vallumctl(&url, &["counters"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("# ruleset host-firewall, table filter"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("Chain INPUT (policy"), "{}", r.stdout);
    assert!(r.stdout.contains("pkts"), "{}", r.stdout);

    let r = vallumctl("http://127.0.0.1:1", &["status"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
}
