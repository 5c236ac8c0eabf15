//! Commit outcomes against a real `vallumd`: one vocabulary (server/src/control/outcome.rs) in the
//! metrics and on the watch stream. A deliberate rollback is `rolled_back`, not a failure; an
//! Apply refused by validation is `refused`, counted and sent on the watch stream.

use crate::support;

use std::time::Duration;

use support::{Daemon, text_source};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vallum_proto::v1 as pb;

const GOOD: &str = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";
const BAD: &str = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT --bogus-flag -j DROP\nCOMMIT\n";

fn apply_req(ruleset: &str, text: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        source: Some(text_source(text, false, "t.rules")),
        ..Default::default()
    }
}

/// `GET /metrics`; the body.
async fn scrape(addr: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: vallumd\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("utf-8");
    let (_, body) = text.split_once("\r\n\r\n").expect("http");
    body.to_string()
}

/// `vallum_commits_total{ruleset, outcome}`, 0 when absent.
fn commits(body: &str, ruleset: &str, outcome: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with("vallum_commits_total{"))
        .filter(|l| {
            l.contains(&format!("ruleset=\"{ruleset}\""))
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn next_event(w: &mut tonic::Streaming<pb::CommitEvent>) -> pb::CommitEvent {
    tokio::time::timeout(Duration::from_secs(10), w.message())
        .await
        .expect("an event in time")
        .expect("stream ok")
        .expect("stream open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_is_not_a_failure_and_refusals_are_counted_and_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let mut watch = c
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: "web".into(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();

    c.apply(apply_req("web", GOOD)).await.expect("apply 1");
    c.apply(apply_req("web", GOOD)).await.expect("apply 2");
    c.rollback(pb::RollbackRequest {
        name: "rulesets/web/revisions/1".into(),
        ..Default::default()
    })
    .await
    .expect("rollback");
    let e = c.apply(apply_req("web", BAD)).await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // A refused Apply of a ruleset that does not exist: on the stream under its name, in
    // the metrics without it (made-up names must not grow the label set).
    let mut watch_new = c
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: "new".into(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    c.apply(apply_req("new", BAD)).await.expect_err("refused");

    let outcomes = [
        (pb::CommitOutcome::Committed, "rulesets/web/revisions/1"),
        (pb::CommitOutcome::Committed, "rulesets/web/revisions/2"),
        (pb::CommitOutcome::RolledBack, "rulesets/web/revisions/3"),
        (pb::CommitOutcome::Refused, "rulesets/web"),
    ];
    for (outcome, revision) in outcomes {
        let ev = next_event(&mut watch).await;
        assert_eq!(
            (ev.outcome, ev.revision.as_str()),
            (outcome as i32, revision),
            "{ev:?}"
        );
        if outcome == pb::CommitOutcome::Refused {
            assert!(ev.error.contains("--bogus-flag"), "{ev:?}");
        }
    }
    let ev = next_event(&mut watch_new).await;
    assert_eq!(
        (ev.outcome, ev.revision.as_str()),
        (pb::CommitOutcome::Refused as i32, "rulesets/new"),
        "{ev:?}"
    );

    let body = scrape(&d.metrics_addr).await;
    assert_eq!(commits(&body, "web", "committed"), 2.0, "{body}");
    assert_eq!(commits(&body, "web", "rolled_back"), 1.0, "{body}");
    assert_eq!(commits(&body, "web", "refused"), 1.0, "{body}");
    assert_eq!(commits(&body, "", "refused"), 1.0, "{body}");
    assert_eq!(commits(&body, "new", "refused"), 0.0, "{body}");
    for failure in ["failed", "reverted"] {
        assert_eq!(commits(&body, "web", failure), 0.0, "{failure}: {body}");
    }
}
