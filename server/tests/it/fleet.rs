//! Fleet mode against real etcd and real vallumd processes: selection by labels, the writer's
//! validation, per-node ACK/NACK, etags, delete, fail-static across an etcd outage and a
//! restart, re-listing after compaction, a 3-member cluster with one member down and then all
//! of them, kill -9 mid-rollout, a NACK retried when its local cause is fixed, canary
//! rollouts, TLS to etcd, status read page by page; nodes that stay registered over three
//! lease TTLs and register again when their lease is lost, FleetService answering
//! FLEET_UNAVAILABLE within the deadline while etcd hangs (SIGSTOP), a rollout that selects no
//! live node (NO_NODES), a ruleset over etcd's request limit (FLEET_VALUE_TOO_LARGE), and a
//! bounded soak (three nodes, a rollout every few seconds through a hung, killed and compacted
//! etcd and a node restart).
//!
//! Every test needs etcd: they are ignored unless asked for (`-- --include-ignored`), and fail
//! when etcd is absent.

use crate::support::etcd;
use crate::support::vallumd;

use std::future::Future;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use etcd::{EtcdCluster, EtcdServer};
use tonic::Code;
use tonic::transport::Channel;
use vallum_proto::v1 as pb;
use vallum_proto::v1::fleet_service_client::FleetServiceClient;
use vallum_proto::v1::set_service_client::SetServiceClient;
use vallum_proto::v1::trace_service_client::TraceServiceClient;
use vallumd::{Daemon, reason, text_source};

const DROP_23: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 23 -j DROP\nCOMMIT\n";
const DROP_24: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 24 -j DROP\nCOMMIT\n";
const USES_SET: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -m set --match-set trusted src -j ACCEPT\nCOMMIT\n";
const BAD: &str = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 70000 -j DROP\nCOMMIT\n";

/// A vallumd in fleet mode with database `{dir}/{name}.db`.
fn node(dir: &Path, endpoints: &str, name: &str, labels: &str) -> Daemon {
    Daemon::start(
        &dir.join(format!("{name}.db")),
        &[
            "--fleet-endpoints",
            endpoints,
            "--node-name",
            name,
            "--node-labels",
            labels,
            "--fleet-lease-ttl",
            "3",
        ],
    )
}

async fn fleet(v: &Daemon) -> FleetServiceClient<Channel> {
    FleetServiceClient::new(v.channel().await)
}

fn put(name: &str, text: &str, selector: &str, etag: &str) -> pb::PutFleetRulesetRequest {
    pb::PutFleetRulesetRequest {
        name: name.into(),
        source: Some(text_source(text, false, "fleet.rules")),
        selector: selector.into(),
        message: format!("{name} for {selector:?}"),
        etag: etag.into(),
        ..Default::default()
    }
}

/// Polls `f` every 50 ms until it returns `Some` (at most 30 s).
async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every selected node ACKed the current revision of `name` and returns the
/// status; `expect_selected` are the node names.
async fn wait_applied(
    f: &mut FleetServiceClient<Channel>,
    name: &str,
    expect_selected: &[&str],
    revision: i64,
) -> pb::RolloutStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = f
            .get_rollout_status(pb::GetRolloutStatusRequest { name: name.into() })
            .await
            .map(|s| s.into_inner());
        if let Ok(s) = &s {
            let applied: Vec<&str> = s.applied.iter().map(|a| a.node.as_str()).collect();
            if s.fleet_revision == revision && applied == expect_selected && s.pending.is_empty() {
                return s.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {name}@{revision} applied on {expect_selected:?}; last status {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn local_rulesets(v: &Daemon) -> Vec<String> {
    v.rulesets()
        .await
        .list_rulesets(pb::ListRulesetsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .rulesets
        .into_iter()
        .map(|r| r.name.trim_start_matches("rulesets/").to_string())
        .collect()
}

async fn verdict(v: &Daemon, port: u32) -> String {
    TraceServiceClient::new(v.channel().await)
        .trace_packet(pb::TracePacketRequest {
            packet: Some(pb::PacketSpec {
                source: "198.51.100.7".into(),
                destination: "192.0.2.10".into(),
                protocol: "tcp".into(),
                source_port: 40000,
                destination_port: port,
                tcp_flags: "S".into(),
                in_interface: "eth0".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .verdict()
        .as_str_name()
        .trim_start_matches("VERDICT_")
        .to_string()
}

/// The value of the unlabelled sample `metric` on `/metrics`.
fn metric(v: &Daemon, metric: &str) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(&v.metrics_addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines().find_map(|l| {
        l.strip_prefix(metric)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

async fn apply_locally(
    v: &Daemon,
    name: &str,
    text: &str,
) -> Result<pb::CommitResult, tonic::Status> {
    v.rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: name.into(),
            source: Some(text_source(text, false, "fleet.rules")),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn selected_nodes_ack_others_untouched_writer_validates_etag_delete() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node(dir.path(), &url, "n1", "role=web,zone=a");
    let n2 = node(dir.path(), &url, "n2", "role=web,zone=b");
    let n3 = node(dir.path(), &url, "n3", "role=db");
    for n in [&n1, &n2, &n3] {
        n.wait_serving().await;
    }
    let mut f = fleet(&n3).await;

    // A text the writer refuses never reaches etcd, with Apply's very error.
    let refused = f
        .put_ruleset(put("web", BAD, "role=web", ""))
        .await
        .unwrap_err();
    let by_apply = apply_locally(&n3, "web", BAD).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(reason(&refused), "INVALID_RULESET", "{refused:?}");
    assert_eq!(reason(&by_apply), "INVALID_RULESET");
    assert_eq!(refused.message(), by_apply.message());
    assert!(refused.message().contains("fleet.rules:3:"), "{refused:?}");
    let dry = f
        .put_ruleset(pb::PutFleetRulesetRequest {
            validate_only: true,
            ..put("web", DROP_23, "role=web", "")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.fleet_revision, 0);
    let missing = f
        .get_ruleset(pb::GetFleetRulesetRequest { name: "web".into() })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    let bad_selector = f
        .put_ruleset(put("web", DROP_23, "role in web", ""))
        .await
        .unwrap_err();
    assert_eq!(
        bad_selector.code(),
        Code::InvalidArgument,
        "{bad_selector:?}"
    );

    // The right nodes ACK, the other is untouched.
    let w = f
        .put_ruleset(put("web", DROP_23, "role=web", "0"))
        .await
        .unwrap()
        .into_inner();
    assert!(w.fleet_revision > 0);
    assert_eq!(w.etag, w.fleet_revision.to_string());
    let s = wait_applied(&mut f, "web", &["n1", "n2"], w.fleet_revision).await;
    assert_eq!(s.selected, ["n1", "n2"]);
    assert!(s.failed.is_empty() && s.stale.is_empty(), "{s:?}");
    assert!(s.applied.iter().all(|a| a.local_revision == 1), "{s:?}");
    // Each ACK carries its local commit's phases.
    for a in &s.applied {
        let p = a
            .phases
            .as_ref()
            .unwrap_or_else(|| panic!("no phases: {a:?}"));
        let ns = |d: &Option<prost_types::Duration>| {
            d.as_ref()
                .map_or(0, |d| d.seconds as u64 * 1_000_000_000 + d.nanos as u64)
        };
        assert!(
            ns(&p.validate) > 0 && ns(&p.persist) > 0 && ns(&p.total) > 0,
            "{p:?}"
        );
        assert!(ns(&p.total) >= ns(&p.validate), "{p:?}");
    }
    assert_eq!(local_rulesets(&n3).await, Vec::<String>::new());
    assert_eq!(verdict(&n1, 23).await, "DROP");
    assert_eq!(verdict(&n3, 23).await, "ACCEPT");
    let rev = n1
        .rulesets()
        .await
        .get_revision(pb::GetRevisionRequest {
            name: "rulesets/web/revisions/1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rev.author, "fleet");
    assert!(
        rev.message
            .starts_with(&format!("fleet revision {}", w.fleet_revision)),
        "{rev:?}"
    );

    // Local mutations of a fleet-owned ruleset are refused, naming the owner.
    let local = apply_locally(&n1, "web", DROP_24).await.unwrap_err();
    assert_eq!(local.code(), Code::FailedPrecondition, "{local:?}");
    assert_eq!(reason(&local), "FLEET_OWNED");
    assert!(local.message().contains("/vallum/v1/"), "{local:?}");
    let local = n1
        .rulesets()
        .await
        .delete_ruleset(pb::DeleteRulesetRequest {
            name: "web".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&local), "FLEET_OWNED");

    // Two writers with the same etag: exactly one wins.
    let etag = w.etag.clone();
    let (mut fa, mut fb) = (f.clone(), fleet(&n1).await);
    let (a, b) = tokio::join!(
        fa.put_ruleset(put("web", DROP_24, "role=web", &etag)),
        fb.put_ruleset(put("web", DROP_24, "zone=a", &etag)),
    );
    let (won, lost) = match (a, b) {
        (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w.into_inner(), l),
        other => panic!("exactly one writer must win: {other:?}"),
    };
    assert_eq!(lost.code(), Code::FailedPrecondition, "{lost:?}");
    assert_eq!(reason(&lost), "ETAG_MISMATCH");
    let expect: &[&str] = if won.selector == "zone=a" {
        &["n1"]
    } else {
        &["n1", "n2"]
    };
    wait_applied(&mut f, "web", expect, won.fleet_revision).await;
    if expect.len() == 1 {
        // n2 is no longer selected: removed there.
        wait_for("web removed from n2", || async {
            local_rulesets(&n2).await.is_empty().then_some(())
        })
        .await;
    }
    assert_eq!(verdict(&n1, 24).await, "DROP");
    assert_eq!(verdict(&n1, 23).await, "ACCEPT");

    // Delete -> removed from every node; its reports go too, a dead node's included (in
    // the delete's own Txn).
    let client =
        vallum_server::control::fleet::etcd::Etcd::connect(std::slice::from_ref(&url)).unwrap();
    let keys = vallum_server::control::fleet::Keys::new("/vallum/v1/");
    let orphan = keys.report("web", "gone-node");
    client.put(&orphan, b"{}".to_vec(), 0).await.unwrap();
    let stale = f
        .delete_ruleset(pb::DeleteFleetRulesetRequest {
            name: "web".into(),
            etag: w.etag.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&stale), "ETAG_MISMATCH");
    f.delete_ruleset(pb::DeleteFleetRulesetRequest {
        name: "web".into(),
        etag: won.etag.clone(),
    })
    .await
    .unwrap();
    assert_eq!(client.get(&orphan).await.unwrap(), None, "reports deleted");
    for n in [&n1, &n2] {
        wait_for("web removed everywhere", || async {
            local_rulesets(n).await.is_empty().then_some(())
        })
        .await;
    }
    assert_eq!(verdict(&n1, 24).await, "ACCEPT");
    let nodes = f
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes;
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["n1", "n2", "n3"]);
    assert_eq!(nodes[0].labels["zone"], "a");
    // Pages of two: n1 n2, then n3.
    let first = f
        .list_nodes(pb::ListNodesRequest {
            page_size: 2,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let rest = f
        .list_nodes(pb::ListNodesRequest {
            page_size: 2,
            page_token: first.next_page_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let paged: Vec<&str> = first
        .nodes
        .iter()
        .chain(&rest.nodes)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(paged, ["n1", "n2", "n3"]);
    assert!(rest.next_page_token.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn a_node_missing_a_set_nacks_with_the_error_others_ack() {
    // Built (once per test binary) before any node starts: a build of minutes on a loaded
    // machine would outlast the nodes' 3 s leases.
    vallumd::vallumctl();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node(dir.path(), &url, "n1", "role=web");
    let n2 = node(dir.path(), &url, "n2", "role=web");
    let n3 = node(dir.path(), &url, "n3", "role=web");
    for n in [&n1, &n2, &n3] {
        n.wait_serving().await;
    }
    for n in [&n1, &n2] {
        SetServiceClient::new(n.channel().await)
            .create_set(pb::CreateSetRequest {
                name: "trusted".into(),
                r#type: "hash:net".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut f = fleet(&n1).await;
    let w = f
        .put_ruleset(put("trust", USES_SET, "role=web", ""))
        .await
        .unwrap()
        .into_inner();
    let s = wait_for("n3 NACKs, n1 and n2 ACK", || {
        let mut f = f.clone();
        async move {
            let s = f
                .get_rollout_status(pb::GetRolloutStatusRequest {
                    name: "trust".into(),
                })
                .await
                .ok()?
                .into_inner();
            (s.applied.len() == 2 && s.failed.len() == 1).then_some(s)
        }
    })
    .await;
    assert_eq!(s.fleet_revision, w.fleet_revision);
    let applied: Vec<&str> = s.applied.iter().map(|a| a.node.as_str()).collect();
    assert_eq!(applied, ["n1", "n2"]);
    assert_eq!(s.failed[0].node, "n3");
    assert_eq!(s.failed[0].result, pb::NodeResult::Nack as i32);
    assert!(s.failed[0].error.contains("trusted"), "{s:?}");
    assert!(s.pending.is_empty(), "{s:?}");
    assert!(local_rulesets(&n3).await.is_empty());
    assert_eq!(local_rulesets(&n2).await, ["trust"]);

    // vallumctl shows the same, in text and JSON.
    let run = |args: &[&str]| {
        std::process::Command::new(vallumd::vallumctl())
            .args(["--server", &n2.url()])
            .args(args)
            .env_remove("VALLUM_OUTPUT")
            .output()
            .expect("run vallumctl")
    };
    let ctl = |args: &[&str]| {
        let o = run(args);
        assert!(o.status.success(), "{args:?}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let nacked = run(&["fleet", "wait", "trust"]);
    assert_eq!(nacked.status.code(), Some(1), "{nacked:?}");
    let out = String::from_utf8_lossy(&nacked.stdout);
    assert!(out.contains("FAILED") && out.contains("n3  NACK"), "{out}");
    assert!(
        String::from_utf8_lossy(&nacked.stderr).contains("NACKed by n3"),
        "{nacked:?}"
    );
    let text = ctl(&["fleet", "status", "trust"]);
    assert!(text.contains("2/3 applied, 1 failed"), "{text}");
    assert!(text.contains("n3  NACK"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&ctl(&["fleet", "status", "trust", "-o", "json"])).unwrap();
    assert_eq!(json["failed"][0]["node"], "n3");
    assert_eq!(json["failed"][0]["result"], "NACK");
    assert_eq!(json["applied"].as_array().unwrap().len(), 2);
    let nodes: serde_json::Value =
        serde_json::from_str(&ctl(&["fleet", "nodes", "-o", "json"])).unwrap();
    assert_eq!(nodes.as_array().unwrap().len(), 3);
    let file = dir.path().join("drop23.rules");
    std::fs::write(&file, DROP_23).unwrap();
    let put: serde_json::Value = serde_json::from_str(&ctl(&[
        "fleet",
        "apply",
        "ssh",
        file.to_str().unwrap(),
        "--selector",
        "role=web",
        "-o",
        "json",
    ]))
    .unwrap();
    let rev = put["fleet_revision"].as_i64().unwrap();
    let waited: serde_json::Value = serde_json::from_str(&ctl(&[
        "fleet",
        "wait",
        "ssh",
        "--revision",
        &rev.to_string(),
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(waited["phase"], "DONE", "{waited}");
    assert_eq!(waited["applied"].as_array().unwrap().len(), 3);
    wait_applied(&mut f, "ssh", &["n1", "n2", "n3"], rev).await;
    ctl(&["fleet", "delete", "ssh"]);
    wait_for("ssh removed from n3", || async {
        local_rulesets(&n3).await.is_empty().then_some(())
    })
    .await;

    // The NACK's cause goes away on n3 (the set is created there): n3 retries and ACKs the
    // same fleet revision, with no new write.
    SetServiceClient::new(n3.channel().await)
        .create_set(pb::CreateSetRequest {
            name: "trusted".into(),
            r#type: "hash:net".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let s = wait_applied(&mut f, "trust", &["n1", "n2", "n3"], w.fleet_revision).await;
    assert!(s.failed.is_empty(), "{s:?}");
    assert_eq!(local_rulesets(&n3).await, ["trust"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn fail_static_across_an_etcd_outage_and_a_restart_then_catch_up() {
    let mut etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let mut n1 = node(dir.path(), &url, "n1", "role=web");
    n1.wait_serving().await;
    let mut f = fleet(&n1).await;
    let w = f
        .put_ruleset(put("web", DROP_23, "", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, "web", &["n1"], w.fleet_revision).await;
    assert_eq!(metric(&n1, "vallum_fleet_connected"), Some(1.0));

    etcd.stop();
    wait_for("vallum_fleet_connected 0", || async {
        (metric(&n1, "vallum_fleet_connected") == Some(0.0)).then_some(())
    })
    .await;
    assert_eq!(verdict(&n1, 23).await, "DROP");
    let down = f
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(reason(&down), "FLEET_UNAVAILABLE", "{down:?}");

    // Restart with etcd still down: SERVING from SQLite, still fleet-owned.
    n1.kill9();
    let n1 = node(dir.path(), &url, "n1", "role=web");
    n1.wait_serving().await;
    assert_eq!(verdict(&n1, 23).await, "DROP");
    assert_eq!(
        reason(&apply_locally(&n1, "web", DROP_24).await.unwrap_err()),
        "FLEET_OWNED"
    );

    // etcd returns: the agent catches up with a write made meanwhile elsewhere.
    etcd.restart();
    let mut f = fleet(&n1).await;
    let w2 = wait_for("FleetService reaches etcd again", || {
        let mut f = f.clone();
        let etag = w.etag.clone();
        async move {
            f.put_ruleset(put("web", DROP_24, "", &etag))
                .await
                .ok()
                .map(|r| r.into_inner())
        }
    })
    .await;
    wait_applied(&mut f, "web", &["n1"], w2.fleet_revision).await;
    assert_eq!(verdict(&n1, 23).await, "ACCEPT");
    assert_eq!(verdict(&n1, 24).await, "DROP");
    wait_for("vallum_fleet_connected 1", || async {
        (metric(&n1, "vallum_fleet_connected") == Some(1.0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn compacted_while_an_agent_is_down_it_lists_again_and_converges() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node(dir.path(), &url, "n1", "role=web");
    let mut n2 = node(dir.path(), &url, "n2", "role=web");
    n1.wait_serving().await;
    n2.wait_serving().await;
    let mut f = fleet(&n1).await;
    let a = f
        .put_ruleset(put("a", DROP_23, "", ""))
        .await
        .unwrap()
        .into_inner();
    let gone = f
        .put_ruleset(put("gone", DROP_24, "", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, "a", &["n1", "n2"], a.fleet_revision).await;
    wait_applied(&mut f, "gone", &["n1", "n2"], gone.fleet_revision).await;

    n2.kill9();
    let a2 = f
        .put_ruleset(put("a", DROP_24, "", &a.etag))
        .await
        .unwrap()
        .into_inner();
    let d = f
        .delete_ruleset(pb::DeleteFleetRulesetRequest {
            name: "gone".into(),
            etag: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let etcd_client =
        vallum_server::control::fleet::etcd::Etcd::connect(std::slice::from_ref(&url)).unwrap();
    etcd_client.compact(d.fleet_revision).await.unwrap();

    let n2 = node(dir.path(), &url, "n2", "role=web");
    n2.wait_serving().await;
    wait_applied(&mut f, "a", &["n1", "n2"], a2.fleet_revision).await;
    wait_for("gone removed from n2", || async {
        (local_rulesets(&n2).await == ["a"]).then_some(())
    })
    .await;
    assert_eq!(verdict(&n2, 24).await, "DROP");
    assert_eq!(verdict(&n2, 23).await, "ACCEPT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn three_member_cluster_one_member_down_progress_goes_on() {
    let mut cluster = EtcdCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoints = cluster.endpoints();
    let n1 = node(dir.path(), &endpoints, "n1", "role=web");
    let n2 = node(dir.path(), &endpoints, "n2", "role=web");
    n1.wait_serving().await;
    n2.wait_serving().await;
    let mut f = fleet(&n1).await;
    let w = f
        .put_ruleset(put("web", DROP_23, "", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, "web", &["n1", "n2"], w.fleet_revision).await;

    cluster.members[0].stop();
    let w2 = wait_for("a write with one member down", || {
        let mut f = f.clone();
        let etag = w.etag.clone();
        async move {
            f.put_ruleset(put("web", DROP_24, "", &etag))
                .await
                .ok()
                .map(|r| r.into_inner())
        }
    })
    .await;
    wait_applied(&mut f, "web", &["n1", "n2"], w2.fleet_revision).await;
    assert_eq!(verdict(&n2, 24).await, "DROP");

    // Every member down: the agents keep enforcing (same trace verdicts), health SERVING.
    for m in &mut cluster.members {
        m.stop();
    }
    for n in [&n1, &n2] {
        wait_for("vallum_fleet_connected 0", || async {
            (metric(n, "vallum_fleet_connected") == Some(0.0)).then_some(())
        })
        .await;
        assert_eq!(verdict(n, 24).await, "DROP");
        assert_eq!(verdict(n, 23).await, "ACCEPT");
        n.wait_serving().await;
    }
    // etcd returns: both catch up with a write made then.
    cluster.restart_stopped();
    let w3 = wait_for("a write after the outage", || {
        let mut f = f.clone();
        let etag = w2.etag.clone();
        async move {
            f.put_ruleset(put("web", DROP_23, "", &etag))
                .await
                .ok()
                .map(|r| r.into_inner())
        }
    })
    .await;
    wait_applied(&mut f, "web", &["n1", "n2"], w3.fleet_revision).await;
    assert_eq!(verdict(&n1, 23).await, "DROP");

    // kill -9 of an agent mid-rollout (right after the write, before its ACK can be
    // awaited), restarted on its database: it converges.
    let mut n2 = n2;
    let w4 = f
        .put_ruleset(put("web", DROP_24, "", &w3.etag))
        .await
        .unwrap()
        .into_inner();
    n2.kill9();
    let n2 = node(dir.path(), &endpoints, "n2", "role=web");
    n2.wait_serving().await;
    wait_applied(&mut f, "web", &["n1", "n2"], w4.fleet_revision).await;
    assert_eq!(verdict(&n2, 24).await, "DROP");
    assert_eq!(verdict(&n2, 23).await, "ACCEPT");
}

/// A TCP proxy in front of etcd that the test can cut (every connection dropped, new ones
/// refused) and restore: a node's etcd link fails while etcd itself stays up.
struct Proxy {
    url: String,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(to: u16) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (o, c) = (open.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", to)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c.lock().unwrap().push(task);
            }
        });
        Proxy {
            url,
            open,
            conns,
            accept,
        }
    }

    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn a_watch_behind_a_compaction_lists_again_and_converges() {
    let etcd = EtcdServer::start();
    let proxy = Proxy::start(etcd.client_port).await;
    let dir = tempfile::tempdir().unwrap();
    let n1 = node(dir.path(), &proxy.url, "n1", "role=web");
    let writer = node(dir.path(), &etcd.url(), "writer", "role=writer");
    n1.wait_serving().await;
    writer.wait_serving().await;
    let mut f = fleet(&writer).await;
    let a = f
        .put_ruleset(put("a", DROP_23, "role=web", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, "a", &["n1"], a.fleet_revision).await;

    // n1 loses etcd (etcd stays up): meanwhile a changes, b appears, history is compacted.
    proxy.cut();
    wait_for("n1 disconnected", || async {
        (metric(&n1, "vallum_fleet_connected") == Some(0.0)).then_some(())
    })
    .await;
    let a2 = f
        .put_ruleset(put("a", DROP_24, "role=web", &a.etag))
        .await
        .unwrap()
        .into_inner();
    let b = f
        .put_ruleset(put("b", DROP_23, "role=web", ""))
        .await
        .unwrap()
        .into_inner();
    let client = vallum_server::control::fleet::etcd::Etcd::connect(&[etcd.url()]).unwrap();
    client.compact(b.fleet_revision).await.unwrap();
    assert_eq!(verdict(&n1, 23).await, "DROP", "fail-static while cut off");

    proxy.restore();
    wait_applied(&mut f, "a", &["n1"], a2.fleet_revision).await;
    wait_applied(&mut f, "b", &["n1"], b.fleet_revision).await;
    let restarts = metric(
        &n1,
        "vallum_fleet_watch_restarts_total{reason=\"compacted\"}",
    );
    assert!(restarts >= Some(1.0), "{restarts:?}");
    assert_eq!(verdict(&n1, 24).await, "DROP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn canary_nack_stops_the_rollout_others_untouched_canary_ack_proceeds() {
    // Built (once per test binary) before any node starts: a build of minutes on a loaded
    // machine would outlast the nodes' 3 s leases.
    vallumd::vallumctl();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node(dir.path(), &url, "n1", "role=web,canary=yes");
    let n2 = node(dir.path(), &url, "n2", "role=web");
    let n3 = node(dir.path(), &url, "n3", "role=web");
    for n in [&n1, &n2, &n3] {
        n.wait_serving().await;
    }
    let mut f = fleet(&n1).await;
    let w = f
        .put_ruleset(put("web", DROP_23, "role=web", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, "web", &["n1", "n2", "n3"], w.fleet_revision).await;
    let write = |name: &str, text: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        file
    };
    let rollout = |file: &Path, json: bool| {
        let mut cmd = std::process::Command::new(vallumd::vallumctl());
        cmd.args(["--server", &n2.url(), "--timeout", "20s"])
            .args(["fleet", "rollout", "web"])
            .arg(file)
            .args(["--canary", "canary=yes", "--selector", "role=web"])
            .env_remove("VALLUM_OUTPUT");
        if json {
            cmd.args(["-o", "json"]);
        }
        cmd.output().expect("run vallumctl")
    };
    // Local revisions of `web` on n1, n2, n3: one per local commit.
    let revisions = || async {
        let mut out = Vec::new();
        for n in [&n1, &n2, &n3] {
            let r = n
                .rulesets()
                .await
                .list_revisions(pb::ListRevisionsRequest {
                    ruleset: "web".into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            out.push(r.revisions.len());
        }
        out
    };
    let before = revisions().await;

    // The canary (n1) has no set `trusted` (n2, the writer, and n3 have it): n1 NACKs, the
    // rollout stops there, n2 and n3 keep fleet revision w untouched (no new local
    // revision, same verdicts).
    for n in [&n2, &n3] {
        SetServiceClient::new(n.channel().await)
            .create_set(pb::CreateSetRequest {
                name: "trusted".into(),
                r#type: "hash:net".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let o = rollout(&write("uses-set.rules", USES_SET), false);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stdout.contains("n1  NACK") && stdout.contains("trusted"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("NACKed by n1") && stderr.contains("canary step"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("keep fleet revision {}", w.fleet_revision)),
        "{stderr}"
    );
    let s = f
        .get_rollout_status(pb::GetRolloutStatusRequest { name: "web".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.canary, "canary=yes");
    assert_eq!(s.selected, ["n1"]);
    let after_nack = revisions().await;
    assert_eq!(after_nack[1..], before[1..], "non-canary nodes untouched");
    assert_eq!(
        after_nack[0], before[0],
        "the NACKing canary committed nothing"
    );
    for n in [&n2, &n3] {
        assert_eq!(verdict(n, 23).await, "DROP");
    }
    assert_eq!(
        verdict(&n1, 23).await,
        "DROP",
        "the NACKing canary keeps its old"
    );

    // The canary ACKs: the rollout goes on to every selected node.
    let o = rollout(&write("drop24.rules", DROP_24), true);
    assert!(o.status.success(), "{o:?}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["canary"]["phase"], "DONE", "{json}");
    assert_eq!(
        json["canary"]["selected"],
        serde_json::json!(["n1"]),
        "{json}"
    );
    assert_eq!(json["full"]["phase"], "DONE", "{json}");
    assert_eq!(
        json["full"]["applied"].as_array().unwrap().len(),
        3,
        "{json}"
    );
    let s = f
        .get_rollout_status(pb::GetRolloutStatusRequest { name: "web".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.canary, "");
    assert_eq!(s.applied.len(), 3, "{s:?}");
    // One local commit each: the canary's at the canary write (the full write repeats its
    // content, so n1 ACKs it without committing again), the others' at the full write.
    let after = revisions().await;
    let commits: Vec<usize> = after.iter().zip(&after_nack).map(|(a, b)| a - b).collect();
    assert_eq!(commits, [1, 1, 1], "local commits on n1, n2, n3");
    let n1_ack = s.applied.iter().find(|a| a.node == "n1").unwrap();
    assert_eq!(n1_ack.fleet_revision, s.fleet_revision, "{n1_ack:?}");
    for n in [&n1, &n2, &n3] {
        assert_eq!(verdict(n, 24).await, "DROP");
        assert_eq!(verdict(n, 23).await, "ACCEPT");
    }
}

/// A CA, an etcd server certificate for 127.0.0.1 and a client certificate (PEM files).
fn pki(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "vallum fleet test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for (name, sans, eku) in [
        (
            "etcd",
            vec!["127.0.0.1".to_string(), "localhost".to_string()],
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        ),
        (
            "node",
            vec!["node".to_string()],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        ),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans).unwrap();
        params.extended_key_usages = eku;
        let cert = params.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn tls_to_etcd_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let p = |f: &str| dir.path().join(f);
    let etcd = EtcdServer::start_tls(&p("ca.pem"), &p("etcd.pem"), &p("etcd.key"));
    let url = etcd.url();
    assert!(url.starts_with("https://"), "{url}");
    let (ca, cert, key) = (
        p("ca.pem").display().to_string(),
        p("node.pem").display().to_string(),
        p("node.key").display().to_string(),
    );
    let n1 = Daemon::start(
        &p("n1.db"),
        &[
            "--fleet-endpoints",
            &url,
            "--node-name",
            "n1",
            "--fleet-ca",
            &ca,
            "--fleet-cert",
            &cert,
            "--fleet-key",
            &key,
        ],
    );
    n1.wait_serving().await;
    let mut f = fleet(&n1).await;
    let w = f
        .put_ruleset(put("web", DROP_23, "", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, "web", &["n1"], w.fleet_revision).await;
    assert_eq!(verdict(&n1, 23).await, "DROP");
    assert_eq!(metric(&n1, "vallum_fleet_connected"), Some(1.0));

    // The env twins give the same; an https endpoint without a CA, or the TLS flags with
    // an http endpoint, refuse to start, naming the flag.
    let refused = |args: &[&str]| {
        let o = vallumd::command()
            .arg("--db")
            .arg(p("refused.db"))
            .args(["--node-name", "n9"])
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?}: {o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = refused(&["--fleet-endpoints", &url]);
    assert!(e.contains("--fleet-ca"), "{e}");
    let e = refused(&["--fleet-endpoints", "http://127.0.0.1:1", "--fleet-ca", &ca]);
    assert!(e.contains("https://"), "{e}");
    let e = refused(&[
        "--fleet-endpoints",
        &url,
        "--fleet-ca",
        "/nonexistent/ca.pem",
    ]);
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    let n2 = Daemon::start_env(
        &p("n2.db"),
        &["--node-name", "n2"],
        &[
            ("VALLUM_FLEET_ENDPOINTS", url.as_str()),
            ("VALLUM_FLEET_CA", ca.as_str()),
            ("VALLUM_FLEET_CERT", cert.as_str()),
            ("VALLUM_FLEET_KEY", key.as_str()),
        ],
    );
    n2.wait_serving().await;
    wait_applied(&mut f, "web", &["n1", "n2"], w.fleet_revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn rollout_status_pages_through_thousands_of_reports() {
    use vallum_server::control::fleet::etcd::Etcd;
    use vallum_server::control::fleet::service::{REPORT_PAGE, rollout_status};
    use vallum_server::control::fleet::{Ack, Desired, Keys, NodeInfo, NodeReport};
    let etcd = EtcdServer::start();
    let client = Etcd::connect(&[etcd.url()]).unwrap();
    let keys = Keys::new("/vallum/v1/");
    let d = Desired {
        content: DROP_23.into(),
        ..Default::default()
    };
    let rev = client
        .put(&keys.ruleset("web"), serde_json::to_vec(&d).unwrap(), 0)
        .await
        .unwrap();
    // 2.5 pages of nodes, each with a report (one NACK), plus reports of another ruleset.
    let n = REPORT_PAGE * 5 / 2;
    let writes = (0..n).map(|i| {
        let client = client.clone();
        let keys = keys.clone();
        async move {
            let node = format!("node-{i:05}");
            let info = serde_json::to_vec(&NodeInfo::default()).unwrap();
            client.put(&keys.node(&node), info, 0).await.unwrap();
            let report = NodeReport {
                fleet_revision: rev,
                result: if i == 7 { Ack::Nack } else { Ack::Ack },
                error: if i == 7 {
                    "x".repeat(200)
                } else {
                    String::new()
                },
                local_revision: 1,
                time_ns: 1,
                latency_seconds: 0.01,
                phases: None,
            };
            let value = serde_json::to_vec(&report).unwrap();
            client
                .put(&keys.report("web", &node), value.clone(), 0)
                .await
                .unwrap();
            client
                .put(&keys.report("other", &node), value, 0)
                .await
                .unwrap();
        }
    });
    futures_util::future::join_all(writes).await;
    let mut pages = 0;
    let mut count = 0;
    client
        .range_prefix_paged(&keys.reports("web"), 0, REPORT_PAGE, |_| {
            count += 1;
            if count % REPORT_PAGE == 1 {
                pages += 1;
            }
        })
        .await
        .unwrap();
    // `web`'s reports alone: the other ruleset's are not read.
    assert_eq!((count, pages), (n, 3));
    let before = kv_requests(&etcd);
    let s = rollout_status(&client, &keys, "web").await.unwrap();
    // One Txn (the ruleset, the first page of the nodes and of the reports, whether a
    // report of the first layout exists), then two more pages of each (serializable, at the
    // Txn's revision): 5 requests, where one read each made 9.
    assert_eq!(kv_requests(&etcd) - before, 5.0);
    assert_eq!(s.selected.len(), n);
    assert_eq!(s.applied.len(), n - 1);
    assert_eq!(s.failed.len(), 1);
    assert_eq!(s.failed[0].node, "node-00007");
    assert!(s.pending.is_empty() && s.stale.is_empty());
}

/// KV requests etcd answered so far (Range, Txn, Put, DeleteRange...), from its
/// `/metrics` (`grpc_server_handled_total`, counted before the answer is sent).
fn kv_requests(etcd: &EtcdServer) -> f64 {
    let body = etcd.http_get("/metrics", Duration::from_secs(10)).unwrap();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{")
                && l.contains("grpc_service=\"etcdserverpb.KV\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// An agent's list (at start, and after a compaction: every node at once) is two requests:
/// the rulesets with this node's reports of the first layout in one Txn, then its reports
/// on those rulesets (it was three: the rulesets, the reports, the first layout's keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn an_agent_lists_the_fleet_in_two_requests() {
    use std::sync::Arc;
    use vallum_server::control::fleet::agent::{Agent, FleetStats};
    use vallum_server::control::fleet::etcd::Etcd;
    use vallum_server::control::fleet::{Desired, Keys, Owners};
    use vallum_server::telemetry::metrics::{Metrics, MetricsConfig};
    let etcd = EtcdServer::start();
    let client = Etcd::connect(&[etcd.url()]).unwrap();
    let keys = Keys::new("/vallum/v1/");
    for name in ["web", "db"] {
        let d = Desired {
            content: DROP_23.into(),
            ..Default::default()
        };
        client
            .put(&keys.ruleset(name), serde_json::to_vec(&d).unwrap(), 0)
            .await
            .unwrap();
    }
    let local = Arc::new(CountingLocal::default());
    let metrics = Metrics::new(&MetricsConfig::default()).unwrap();
    let agent = Agent::new(
        client.clone(),
        local.clone(),
        Arc::new(Owners::default()),
        keys.clone(),
        "n1".into(),
        vallum_server::control::fleet::Labels::new(),
        Duration::from_secs(10),
        FleetStats::new(&metrics, vallum_server::clock::Clock::system()),
    )
    .spawn();
    // The agent commits after its list (in this process: no etcd read to wait with).
    let deadline = Instant::now() + Duration::from_secs(30);
    while local.commits.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the agent never committed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    agent.abort();
    assert!(agent.await.unwrap_err().is_cancelled());
    // The test's own requests were Puts: every read is the agent's list.
    assert_eq!(kv_reads(&etcd), 2.0, "the list's reads (Range and Txn)");
}

/// Range and Txn requests etcd answered so far.
fn kv_reads(etcd: &EtcdServer) -> f64 {
    let body = etcd.http_get("/metrics", Duration::from_secs(10)).unwrap();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{")
                && (l.contains("grpc_method=\"Range\"") || l.contains("grpc_method=\"Txn\""))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A node-local side that counts commits (the agent's [`Local`] seam, as the scale bench's).
#[derive(Debug, Default)]
struct CountingLocal {
    active: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    commits: std::sync::atomic::AtomicUsize,
}

#[tonic::async_trait]
impl vallum_server::control::fleet::agent::Local for CountingLocal {
    fn active(&self, name: &str) -> Option<u64> {
        self.active.lock().unwrap().get(name).copied()
    }

    async fn apply(
        &self,
        name: &str,
        _rev: i64,
        _d: &vallum_server::control::fleet::Desired,
        _value: &[u8],
    ) -> Result<vallum_server::control::fleet::agent::Applied, vallum_server::error::Error> {
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut a = self.active.lock().unwrap();
        let n = a.get(name).map_or(1, |n| n + 1);
        a.insert(name.to_string(), n);
        Ok(vallum_server::control::fleet::agent::Applied {
            local_revision: n,
            ..Default::default()
        })
    }

    async fn remove(&self, name: &str) -> Result<(), vallum_server::error::Error> {
        self.active.lock().unwrap().remove(name);
        Ok(())
    }
}

/// A running fleet of the first report layout (`status/{node}/{ruleset}`): readers accept
/// those reports, a new agent moves its own to `reports/{ruleset}/{node}` (the same value:
/// no re-apply, latency and local revision kept) and deletes the old keys; once no
/// `status/` key is left, status reads `reports/web/` alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn reports_move_to_keys_by_ruleset_and_readers_accept_both_meanwhile() {
    use std::sync::Arc;
    use vallum_server::control::fleet::agent::{Agent, FleetStats};
    use vallum_server::control::fleet::etcd::Etcd;
    use vallum_server::control::fleet::service::rollout_status;
    use vallum_server::control::fleet::{Ack, Desired, Keys, NodeInfo, NodeReport, Owners};
    use vallum_server::telemetry::metrics::{Metrics, MetricsConfig};
    let etcd = EtcdServer::start();
    let client = Etcd::connect(&[etcd.url()]).unwrap();
    let keys = Keys::new("/vallum/v1/");
    let d = Desired {
        content: DROP_23.into(),
        ..Default::default()
    };
    let rev = client
        .put(&keys.ruleset("web"), serde_json::to_vec(&d).unwrap(), 0)
        .await
        .unwrap();
    let report = |local_revision: u64, latency_seconds: f64| NodeReport {
        fleet_revision: rev,
        result: Ack::Ack,
        error: String::new(),
        local_revision,
        time_ns: 1,
        latency_seconds,
        phases: None,
    };
    // Two nodes of the old version: their node keys and reports, also on a ruleset that
    // no longer exists.
    for (node, local, latency) in [("n1", 7, 0.5), ("old-1", 3, 0.25)] {
        let info = serde_json::to_vec(&NodeInfo::default()).unwrap();
        client.put(&keys.node(node), info, 0).await.unwrap();
        let value = serde_json::to_vec(&report(local, latency)).unwrap();
        for rs in ["web", "gone"] {
            client
                .put(&keys.legacy_status(node, rs), value.clone(), 0)
                .await
                .unwrap();
        }
    }
    let applied = |s: &pb::RolloutStatus| -> Vec<(String, u64)> {
        s.applied
            .iter()
            .map(|a| (a.node.clone(), a.local_revision))
            .collect()
    };
    let s = rollout_status(&client, &keys, "web").await.unwrap();
    assert_eq!(
        applied(&s),
        [("n1".to_string(), 7), ("old-1".to_string(), 3)],
        "{s:?}"
    );

    // n1 upgrades: it enforced `web` at `rev` already (its store says so).
    let local = Arc::new(CountingLocal::default());
    local.active.lock().unwrap().insert("web".into(), 7);
    let owners = Arc::new(Owners::default());
    owners.set("web", rev);
    let metrics = Metrics::new(&MetricsConfig::default()).unwrap();
    let mut labels = vallum_server::control::fleet::Labels::new();
    labels.insert("role".into(), "web".into());
    let agent = Agent::new(
        client.clone(),
        local.clone(),
        owners,
        keys.clone(),
        "n1".into(),
        labels,
        Duration::from_secs(10),
        FleetStats::new(&metrics, vallum_server::clock::Clock::system()),
    )
    .spawn();
    let moved = wait_for("n1's report moved", || async {
        let legacy = client
            .any_under(&keys.legacy_statuses_of("n1"), 0)
            .await
            .unwrap();
        let kv = client.get(&keys.report("web", "n1")).await.unwrap()?;
        (!legacy).then_some(kv)
    })
    .await;
    let moved: NodeReport = serde_json::from_slice(&moved.value).unwrap();
    assert_eq!(moved, report(7, 0.5), "the same report, not a re-apply");
    assert_eq!(
        local.commits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no local commit"
    );
    assert_eq!(client.get(&keys.report("gone", "n1")).await.unwrap(), None);
    // Both layouts at once: n1 by ruleset, old-1 still by node.
    let s = rollout_status(&client, &keys, "web").await.unwrap();
    assert_eq!(
        applied(&s),
        [("n1".to_string(), 7), ("old-1".to_string(), 3)],
        "{s:?}"
    );

    // old-1 moves too (here by hand): no `status/` key is left, and the readers read
    // `reports/web/` alone.
    let value = client
        .get(&keys.legacy_status("old-1", "web"))
        .await
        .unwrap()
        .unwrap()
        .value;
    client
        .put(&keys.report("web", "old-1"), value, 0)
        .await
        .unwrap();
    client
        .delete_prefix(&keys.legacy_statuses_of("old-1"))
        .await
        .unwrap();
    assert!(!client.any_under(&keys.legacy_statuses(), 0).await.unwrap());
    let s = rollout_status(&client, &keys, "web").await.unwrap();
    assert_eq!(
        applied(&s),
        [("n1".to_string(), 7), ("old-1".to_string(), 3)],
        "{s:?}"
    );
    agent.abort();
    assert!(agent.await.unwrap_err().is_cancelled());
}

// === registration, deadlines, wait, size (issue #29) ===

/// A vallumd in fleet mode with a lease of `ttl` seconds and `extra` flags.
fn node_with(
    dir: &Path,
    endpoints: &str,
    name: &str,
    labels: &str,
    ttl: u64,
    extra: &[&str],
) -> Daemon {
    let ttl = ttl.to_string();
    let mut args = vec![
        "--fleet-endpoints",
        endpoints,
        "--node-name",
        name,
        "--node-labels",
        labels,
        "--fleet-lease-ttl",
        &ttl,
    ];
    args.extend_from_slice(extra);
    Daemon::start(&dir.join(format!("{name}.db")), &args)
}

/// The live nodes' names, by ListNodes.
async fn listed(f: &mut FleetServiceClient<Channel>) -> Result<Vec<String>, tonic::Status> {
    Ok(f.list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner()
        .nodes
        .into_iter()
        .map(|n| n.name)
        .collect())
}

/// The fleet's keys under the default prefix.
fn keys() -> vallum_server::control::fleet::Keys {
    vallum_server::control::fleet::Keys::new("/vallum/v1/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn nodes_stay_registered_over_three_lease_ttls_and_a_later_rollout_reaches_them() {
    const TTL: u64 = 2;
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node_with(dir.path(), &url, "n1", "role=web", TTL, &[]);
    let n2 = node_with(dir.path(), &url, "n2", "role=db", TTL, &[]);
    n1.wait_serving().await;
    n2.wait_serving().await;
    let mut f = fleet(&n2).await;
    wait_for("both nodes registered", || {
        let mut f = f.clone();
        async move { (listed(&mut f).await.ok()? == ["n1", "n2"]).then_some(()) }
    })
    .await;

    // For more than three TTLs, both nodes stay listed every time we look; a rollout written
    // after the first TTL reaches the selected node.
    let start = Instant::now();
    let mut rollout = None;
    let mut looks = 0;
    while start.elapsed() < Duration::from_secs(3 * TTL + 1) {
        let nodes = listed(&mut f).await.unwrap();
        assert_eq!(
            nodes,
            ["n1", "n2"],
            "a node dropped out of the fleet {:?} after both registered (lease TTL {TTL} s)",
            start.elapsed()
        );
        looks += 1;
        if rollout.is_none() && start.elapsed() > Duration::from_secs(TTL) {
            let w = f
                .put_ruleset(put("web", DROP_23, "role=web", ""))
                .await
                .unwrap()
                .into_inner();
            rollout = Some(w.fleet_revision);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(looks >= 3 * TTL as usize, "{looks} looks");
    let rev = rollout.expect("written after the first TTL");
    let s = wait_applied(&mut f, "web", &["n1"], rev).await;
    assert!(s.stale.is_empty(), "no report of a gone node: {s:?}");
    assert_eq!(verdict(&n1, 23).await, "DROP");
    assert_eq!(verdict(&n2, 23).await, "ACCEPT");

    // Each node knows its registration is live, and when etcd last renewed it.
    for n in [&n1, &n2] {
        assert_eq!(metric(n, "vallum_fleet_registered"), Some(1.0));
        let ttl = metric(n, "vallum_fleet_lease_ttl_seconds").expect("lease TTL metric");
        assert!(ttl > 0.0 && ttl <= TTL as f64, "lease TTL left {ttl}");
        let renewed = metric(n, "vallum_fleet_last_keepalive_timestamp_seconds")
            .expect("last keep-alive metric");
        assert!(renewed > 0.0);
    }
    // etcd itself holds each node key on a lease that it renewed (its TTL left is set).
    let client =
        vallum_server::control::fleet::etcd::Etcd::connect(std::slice::from_ref(&url)).unwrap();
    for name in ["n1", "n2"] {
        let kv = client.get(&keys().node(name)).await.unwrap();
        assert!(
            kv.is_some_and(|kv| kv.lease != 0),
            "{name}'s key is on a lease"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn a_node_whose_lease_was_lost_registers_again_with_its_labels() {
    const TTL: u64 = 2;
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node_with(dir.path(), &url, "n1", "role=web,zone=a", TTL, &[]);
    n1.wait_serving().await;
    let mut f = fleet(&n1).await;
    let client =
        vallum_server::control::fleet::etcd::Etcd::connect(std::slice::from_ref(&url)).unwrap();
    let first = wait_for("n1 registered", || {
        let client = client.clone();
        async move { client.get(&keys().node("n1")).await.ok()? }
    })
    .await;

    // The lease goes (as after a partition longer than the TTL, or etcd restored from a
    // snapshot without it): etcd deletes the node key with it.
    client.lease_revoke(first.lease).await.unwrap();
    let again = wait_for("n1 registered again on a new lease", || {
        let client = client.clone();
        async move {
            let kv = client.get(&keys().node("n1")).await.ok()??;
            (kv.lease != first.lease).then_some(kv)
        }
    })
    .await;
    let info: vallum_server::control::fleet::NodeInfo =
        serde_json::from_slice(&again.value).unwrap();
    assert_eq!(
        info.labels,
        vallum_server::control::fleet::selector::parse_labels("role=web,zone=a").unwrap(),
        "registered again with its labels"
    );
    assert_eq!(listed(&mut f).await.unwrap(), ["n1"]);
    // And it stays registered on that lease past three TTLs.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3 * TTL + 1) {
        let kv = client.get(&keys().node("n1")).await.unwrap();
        assert_eq!(
            kv.map(|kv| kv.lease),
            Some(again.lease),
            "{:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let w = f
        .put_ruleset(put("web", DROP_23, "zone=a", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, "web", &["n1"], w.fleet_revision).await;
    assert_eq!(metric(&n1, "vallum_fleet_registered"), Some(1.0));
}

/// The calls of FleetService that read or write etcd, all at once, each with `timeout` as
/// the caller's gRPC deadline (`None`: no deadline); returns each call's name and error.
async fn every_fleet_call(
    f: &FleetServiceClient<Channel>,
    timeout: Option<Duration>,
    etag: &str,
) -> Vec<(&'static str, tonic::Status)> {
    fn req<T>(m: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(m);
        if let Some(t) = timeout {
            r.set_timeout(t);
        }
        r
    }
    let name = || "web".to_string();
    let (mut a, mut b, mut c, mut d, mut e, mut g) = (
        f.clone(),
        f.clone(),
        f.clone(),
        f.clone(),
        f.clone(),
        f.clone(),
    );
    let (a, b, c, d, e, g) = tokio::join!(
        async move {
            a.get_rollout_status(req(pb::GetRolloutStatusRequest { name: name() }, timeout))
                .await
                .map(drop)
        },
        async move {
            b.list_nodes(req(pb::ListNodesRequest::default(), timeout))
                .await
                .map(drop)
        },
        async move {
            c.get_ruleset(req(pb::GetFleetRulesetRequest { name: name() }, timeout))
                .await
                .map(drop)
        },
        async move {
            d.list_rulesets(req(pb::ListFleetRulesetsRequest::default(), timeout))
                .await
                .map(drop)
        },
        async move {
            e.put_ruleset(req(put("web", DROP_24, "role=web", etag), timeout))
                .await
                .map(drop)
        },
        async move {
            let r = pb::DeleteFleetRulesetRequest {
                name: "other".into(),
                etag: String::new(),
            };
            g.delete_ruleset(req(r, timeout)).await.map(drop)
        },
    );
    [
        ("GetRolloutStatus", a),
        ("ListNodes", b),
        ("GetRuleset", c),
        ("ListRulesets", d),
        ("PutRuleset", e),
        ("DeleteRuleset", g),
    ]
    .into_iter()
    .map(|(what, r)| match r {
        Ok(()) => panic!("{what} answered while etcd hangs"),
        Err(e) => (what, e),
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn a_hung_etcd_is_fleet_unavailable_within_the_deadline() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    // n1: a short call timeout and callers without deadline; n2: a long call timeout, so
    // only the caller's deadline bounds its calls.
    let n1 = node_with(
        dir.path(),
        &url,
        "n1",
        "role=web",
        3,
        &["--fleet-call-timeout", "1s"],
    );
    let n2 = node_with(
        dir.path(),
        &url,
        "n2",
        "role=web",
        3,
        &["--fleet-call-timeout", "60s"],
    );
    n1.wait_serving().await;
    n2.wait_serving().await;
    let mut f1 = fleet(&n1).await;
    let f2 = fleet(&n2).await;
    let w = f1
        .put_ruleset(put("web", DROP_23, "role=web", ""))
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f1, "web", &["n1", "n2"], w.fleet_revision).await;

    etcd.pause();
    // Each call is FLEET_UNAVAILABLE, not left hanging: from n1 by its call timeout (the
    // test's own guard of 30 s would fail it otherwise), from n2 before the caller's 10 s
    // deadline (else the caller sees DEADLINE_EXCEEDED, or vallumd's CANCELLED).
    let guard = Duration::from_secs(30);
    let (no_deadline, with_deadline) = tokio::join!(
        tokio::time::timeout(guard, every_fleet_call(&f1, None, &w.etag)),
        every_fleet_call(&f2, Some(Duration::from_secs(10)), &w.etag)
    );
    let no_deadline = no_deadline.expect("n1 answered every call within its --fleet-call-timeout");
    for (node, calls) in [("n1", no_deadline), ("n2", with_deadline)] {
        assert_eq!(calls.len(), 6);
        for (what, e) in calls {
            assert_eq!(e.code(), Code::Unavailable, "{node} {what}: {e:?}");
            assert_eq!(reason(&e), "FLEET_UNAVAILABLE", "{node} {what}: {e:?}");
            assert!(
                e.message().contains("did not answer"),
                "{node} {what}: {e:?}"
            );
        }
    }
    // WaitRollout: its first read ends by the wait's timeout.
    let wait = tokio::time::timeout(
        guard,
        f2.clone().wait_rollout(pb::WaitRolloutRequest {
            name: "web".into(),
            timeout: Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            }),
            ..Default::default()
        }),
    )
    .await
    .expect("WaitRollout answered within its timeout");
    let e = wait.expect_err("no status while etcd hangs");
    assert_eq!(reason(&e), "FLEET_UNAVAILABLE", "{e:?}");

    // vallumctl: `fleet wait --wait-timeout 2s` and `--timeout 10s fleet status` exit 3
    // with FLEET_UNAVAILABLE.
    for args in [
        &["fleet", "wait", "web", "--wait-timeout", "2s"][..],
        &["--timeout", "10s", "fleet", "status", "web"][..],
    ] {
        let out = tokio::time::timeout(
            guard,
            tokio::process::Command::new(vallumd::vallumctl())
                .args(["--server", &n2.url(), "-o", "json"])
                .args(args)
                .output(),
        )
        .await
        .expect("vallumctl returned")
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(stderr.contains("FLEET_UNAVAILABLE"), "{args:?}: {stderr}");
    }

    // etcd answers again: so does every call.
    etcd.resume();
    wait_for("FleetService answers again", || {
        let mut f = f2.clone();
        async move { listed(&mut f).await.ok() }
    })
    .await;
    let s = f1
        .get_rollout_status(pb::GetRolloutStatusRequest { name: "web".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.fleet_revision, w.fleet_revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn a_rollout_that_selects_no_live_node_is_not_done() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node_with(dir.path(), &url, "n1", "role=web", 3, &[]);
    n1.wait_serving().await;
    let mut f = fleet(&n1).await;
    let w = f
        .put_ruleset(put("db", DROP_23, "role=db", ""))
        .await
        .unwrap()
        .into_inner();
    let last = |allow: bool| {
        let mut f = f.clone();
        async move {
            let mut s = f
                .wait_rollout(pb::WaitRolloutRequest {
                    name: "db".into(),
                    fleet_revision: w.fleet_revision,
                    timeout: Some(prost_types::Duration {
                        seconds: 20,
                        nanos: 0,
                    }),
                    allow_no_nodes: allow,
                })
                .await
                .unwrap()
                .into_inner();
            let mut last = None;
            while let Some(p) = s.message().await.unwrap() {
                last = Some(p);
            }
            last.expect("a status")
        }
    };
    let refused = last(false).await;
    assert_eq!(refused.phase(), pb::RolloutPhase::NoNodes, "{refused:?}");
    let allowed = last(true).await;
    assert_eq!(allowed.phase(), pb::RolloutPhase::Done, "{allowed:?}");
    assert!(allowed.status.unwrap().selected.is_empty());

    // vallumctl: exit 1 naming it; 0 with --allow-no-nodes.
    let run = |extra: &'static [&'static str]| {
        let url = n1.url();
        async move {
            tokio::process::Command::new(vallumd::vallumctl())
                .args([
                    "--server",
                    &url,
                    "fleet",
                    "wait",
                    "db",
                    "--wait-timeout",
                    "20s",
                ])
                .args(extra)
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(&[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("selects no live node"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("NO_NODES"));
    let out = run(&["--allow-no-nodes"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A ruleset of `n` rules (one `--dport` each).
fn rules(n: usize) -> String {
    let mut t =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for i in 0..n {
        t.push_str(&format!(
            "-A INPUT -p tcp --dport {} -j DROP\n",
            1 + i % 65000
        ));
    }
    t.push_str("COMMIT\n");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn a_ruleset_over_etcds_request_limit_is_resource_exhausted_before_the_write() {
    // etcd and vallumd agree on a 64 KiB request limit: every size our check lets through,
    // etcd takes; every other is FLEET_VALUE_TOO_LARGE, and nothing is written.
    const LIMIT: &str = "65536";
    let etcd = EtcdServer::start_with(&["--max-request-bytes", LIMIT]);
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let n1 = node_with(
        dir.path(),
        &url,
        "n1",
        "role=web",
        3,
        &["--fleet-max-request-bytes", LIMIT],
    );
    n1.wait_serving().await;
    let mut f = fleet(&n1).await;

    let writer = f.clone();
    let try_put = move |n: usize, validate_only: bool| {
        let mut f = writer.clone();
        async move {
            let mut r = put(&format!("big{n}"), &rules(n), "", "");
            r.validate_only = validate_only;
            f.put_ruleset(r).await.map(|r| r.into_inner())
        }
    };
    // Far over: refused, even as validate_only, and not written.
    let e = try_put(4000, false).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(reason(&e), "FLEET_VALUE_TOO_LARGE", "{e:?}");
    assert!(
        e.message().contains("request limit of 65536 bytes"),
        "{e:?}"
    );
    assert!(e.message().contains("--max-request-bytes"), "{e:?}");
    let e = try_put(4000, true).await.unwrap_err();
    assert_eq!(reason(&e), "FLEET_VALUE_TOO_LARGE", "validate_only: {e:?}");
    let e = f
        .get_ruleset(pb::GetFleetRulesetRequest {
            name: "big4000".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // Around the limit (binary search on the rule count): each size is either written by
    // etcd or refused by us, never refused by etcd (FLEET_UNAVAILABLE, "request is too
    // large"), so our count of a write is never below etcd's.
    let (mut lo, mut hi) = (10usize, 4000usize);
    let (mut written, mut refused) = (0, 0);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        match try_put(mid, false).await {
            Ok(_) => {
                written += 1;
                lo = mid;
            }
            Err(e) if reason(&e) == "FLEET_VALUE_TOO_LARGE" => {
                refused += 1;
                hi = mid;
            }
            Err(e) => panic!("{mid} rules: {e:?}"),
        }
    }
    assert!(
        written > 0 && refused > 0,
        "{written} written, {refused} refused"
    );
    // The largest written one reaches the node.
    let w = f
        .get_ruleset(pb::GetFleetRulesetRequest {
            name: format!("big{lo}"),
        })
        .await
        .unwrap()
        .into_inner();
    wait_applied(&mut f, &format!("big{lo}"), &["n1"], w.fleet_revision).await;
}

/// The soak's driver: every FleetService call it makes carries a gRPC deadline and must
/// answer (with anything) within that deadline plus one second.
struct Soak {
    writer: FleetServiceClient<Channel>,
    /// Rollouts written so far (each drops port `PORT0 + k`).
    k: u32,
    /// The last fleet revision written, and its port.
    last: Option<(i64, u32)>,
}

const PORT0: u32 = 1000;

/// The deadline of the soak's unary calls, and the most a call may outlive it.
const CALL_DEADLINE: Duration = Duration::from_secs(4);
const GRACE: Duration = Duration::from_secs(1);

impl Soak {
    /// Runs `call` with `deadline` as its gRPC deadline; fails the test when it answers
    /// more than [`GRACE`] after it.
    async fn call<T, F>(what: &str, deadline: Duration, call: F) -> Result<T, tonic::Status>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(deadline + GRACE, call).await {
            Ok(r) => r.map(|r| r.into_inner()),
            Err(_) => panic!("{what} outlived its deadline of {deadline:?} by more than {GRACE:?}"),
        }
    }

    fn req<T>(m: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(m);
        r.set_timeout(CALL_DEADLINE);
        r
    }

    /// Writes the next rollout (a DROP of the next port, every node selected); `Err` when
    /// etcd cannot take it (then it must be FLEET_UNAVAILABLE).
    async fn write(&mut self) -> Result<i64, tonic::Status> {
        let port = PORT0 + self.k + 1;
        let text = format!(
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport {port} -j DROP\nCOMMIT\n"
        );
        let mut w = self.writer.clone();
        let r = Soak::call(
            "PutRuleset",
            CALL_DEADLINE,
            w.put_ruleset(Soak::req(put("soak", &text, "", ""))),
        )
        .await;
        match r {
            Ok(r) => {
                self.k += 1;
                self.last = Some((r.fleet_revision, port));
                Ok(r.fleet_revision)
            }
            Err(e) => {
                assert_eq!(reason(&e), "FLEET_UNAVAILABLE", "PutRuleset: {e:?}");
                Err(e)
            }
        }
    }

    /// Follows WaitRollout of `revision` (timeout 30 s); returns the last message. A DONE
    /// is checked against the nodes themselves: every node it lists as applied enforces the
    /// revision's rule (nothing is reported DONE that is not).
    async fn wait(&self, revision: i64, nodes: &[(&str, &Daemon)]) -> pb::RolloutProgress {
        let timeout = Duration::from_secs(30);
        let mut w = self.writer.clone();
        let last = tokio::time::timeout(timeout + GRACE, async move {
            let mut s = w
                .wait_rollout(pb::WaitRolloutRequest {
                    name: "soak".into(),
                    fleet_revision: revision,
                    timeout: Some(prost_types::Duration {
                        seconds: timeout.as_secs() as i64,
                        nanos: 0,
                    }),
                    allow_no_nodes: false,
                })
                .await?
                .into_inner();
            let mut last = None;
            while let Some(p) = s.message().await? {
                last = Some(p);
            }
            Ok::<_, tonic::Status>(last.expect("a last status"))
        })
        .await
        .unwrap_or_else(|_| panic!("WaitRollout outlived its timeout by more than {GRACE:?}"))
        .unwrap_or_else(|e| panic!("WaitRollout of {revision}: {e:?}"));
        if last.phase() == pb::RolloutPhase::Done {
            let s = last.status.clone().unwrap_or_default();
            assert!(!s.applied.is_empty(), "DONE with no node: {last:?}");
            let (_, port) = self.last.expect("a rollout written");
            for a in &s.applied {
                let (_, v) = nodes
                    .iter()
                    .find(|(n, _)| *n == a.node)
                    .unwrap_or_else(|| panic!("unknown node {}", a.node));
                assert_eq!(a.fleet_revision, revision, "{a:?}");
                assert_eq!(
                    verdict(v, port).await,
                    "DROP",
                    "DONE lists {} as applied, but it does not enforce revision {revision}",
                    a.node
                );
            }
        }
        last
    }

    /// Writes a rollout (retrying while etcd comes back) and waits until every node in
    /// `nodes` enforces it: listed as applied at that revision, and dropping its port (and
    /// no longer the one before).
    async fn converge(&mut self, when: &str, nodes: &[(&str, &Daemon)]) {
        let revision = loop {
            match self.write().await {
                Ok(rev) => break rev,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let (_, port) = self.last.expect("written");
        // DONE (checked against the nodes), or NO_NODES / TIMED_OUT while the nodes
        // register again after etcd dropped their leases; never a NACK or another writer.
        let last = self.wait(revision, nodes).await;
        assert!(
            matches!(
                last.phase(),
                pb::RolloutPhase::Done | pb::RolloutPhase::NoNodes | pb::RolloutPhase::TimedOut
            ),
            "{when}: {last:?}"
        );
        let names: Vec<&str> = nodes.iter().map(|(n, _)| *n).collect();
        let f = self.writer.clone();
        wait_for(
            &format!("{when}: every node at fleet revision {revision}"),
            || {
                let mut f = f.clone();
                let names = names.clone();
                async move {
                    let s = Soak::call(
                        "GetRolloutStatus",
                        CALL_DEADLINE,
                        f.get_rollout_status(Soak::req(pb::GetRolloutStatusRequest {
                            name: "soak".into(),
                        })),
                    )
                    .await
                    .ok()?;
                    let applied: Vec<&str> = s.applied.iter().map(|a| a.node.as_str()).collect();
                    (s.fleet_revision == revision && applied == names).then_some(())
                }
            },
        )
        .await;
        for (name, v) in nodes {
            assert_eq!(
                verdict(v, port).await,
                "DROP",
                "{when}: {name} at {revision}"
            );
            if port > PORT0 + 1 {
                assert_eq!(verdict(v, port - 1).await, "ACCEPT", "{when}: {name}");
            }
        }
    }

    /// For `period`, a write and a status read every second while etcd hangs: each is
    /// FLEET_UNAVAILABLE within its deadline.
    async fn while_hung(&mut self, period: Duration) {
        let start = Instant::now();
        while start.elapsed() < period {
            assert!(
                self.write().await.is_err(),
                "a write went through a hung etcd"
            );
            let mut f = self.writer.clone();
            let e = Soak::call(
                "GetRolloutStatus",
                CALL_DEADLINE,
                f.get_rollout_status(Soak::req(pb::GetRolloutStatusRequest {
                    name: "soak".into(),
                })),
            )
            .await
            .unwrap_err();
            assert_eq!(reason(&e), "FLEET_UNAVAILABLE", "{e:?}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn soak_three_nodes_through_a_hung_killed_and_compacted_etcd_and_a_node_restart() {
    const TTL: u64 = 2;
    const CYCLES: usize = 3;
    let mut etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let flags = ["--fleet-call-timeout", "1s"];
    let n1 = node_with(dir.path(), &url, "n1", "role=web", TTL, &flags);
    let n2 = node_with(dir.path(), &url, "n2", "role=web", TTL, &flags);
    let mut n3 = node_with(dir.path(), &url, "n3", "role=web", TTL, &flags);
    for n in [&n1, &n2, &n3] {
        n.wait_serving().await;
    }
    let client =
        vallum_server::control::fleet::etcd::Etcd::connect(std::slice::from_ref(&url)).unwrap();
    let mut soak = Soak {
        writer: fleet(&n1).await,
        k: 0,
        last: None,
    };
    for cycle in 0..CYCLES {
        let all = [("n1", &n1), ("n2", &n2), ("n3", &n3)];
        soak.converge(&format!("cycle {cycle}: steady"), &all).await;
        soak.converge(&format!("cycle {cycle}: steady again"), &all)
            .await;

        // etcd hangs for more than three lease TTLs: every call fails in time, the leases
        // expire; when etcd answers again every node registers again and converges.
        etcd.pause();
        soak.while_hung(Duration::from_secs(3 * TTL + 1)).await;
        etcd.resume();
        soak.converge(&format!("cycle {cycle}: after SIGSTOP/SIGCONT"), &all)
            .await;

        // etcd killed and restarted.
        etcd.stop();
        assert!(soak.write().await.is_err(), "a write with etcd down");
        etcd.restart();
        soak.converge(&format!("cycle {cycle}: after kill -9 and restart"), &all)
            .await;

        // One node down while the fleet moves on and etcd compacts its history; it comes
        // back behind the compaction, lists again and converges.
        n3.kill9();
        let two = [("n1", &n1), ("n2", &n2)];
        soak.converge(&format!("cycle {cycle}: n3 down"), &two)
            .await;
        let (rev, _) = soak.last.expect("written");
        client.compact(rev).await.unwrap();
        soak.converge(&format!("cycle {cycle}: n3 down, compacted"), &two)
            .await;
        n3 = node_with(dir.path(), &url, "n3", "role=web", TTL, &flags);
        n3.wait_serving().await;
        let all = [("n1", &n1), ("n2", &n2), ("n3", &n3)];
        soak.converge(&format!("cycle {cycle}: n3 back"), &all)
            .await;
    }
    let mut f = soak.writer.clone();
    assert_eq!(listed(&mut f).await.unwrap(), ["n1", "n2", "n3"]);
    for n in [&n1, &n2, &n3] {
        assert_eq!(metric(n, "vallum_fleet_registered"), Some(1.0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (Debian etcd-server)"]
async fn fleet_reads_are_reads_for_an_anonymous_tcp_caller() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    // No token and no --insecure-no-auth: TCP callers may read, not change.
    let n1 = node_with(dir.path(), &url, "n1", "role=web", 3, &["--socket", "none"]);
    n1.wait_serving().await;
    let mut f = fleet(&n1).await;
    wait_for("n1 listed", || {
        let mut f = f.clone();
        async move { (listed(&mut f).await.ok()? == ["n1"]).then_some(()) }
    })
    .await;
    f.list_rulesets(pb::ListFleetRulesetsRequest::default())
        .await
        .unwrap();
    let e = f
        .get_rollout_status(pb::GetRolloutStatusRequest { name: "web".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "a read, answered: {e:?}");
    let e = f
        .put_ruleset(put("web", DROP_23, "", ""))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "ANONYMOUS_READ_ONLY", "{e:?}");
    assert!(e.message().contains("PutRuleset changes state"), "{e:?}");
}
