//! WatchCommits resumes (`start_after`) against a real `vallumd`: a controller that saw one
//! commit, disconnected, and reconnects after two more gets both, in order, then the live
//! ones; a resume point vallumd no longer keeps (after a restart) is OUT_OF_RANGE with what
//! is kept; a sequence number not issued yet is INVALID_ARGUMENT on `start_after`.

use crate::support;

use std::time::Duration;

use support::{Daemon, reason, text_source};
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;

const RULES: &str = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";

async fn apply(d: &Daemon, ruleset: &str) -> String {
    d.rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: ruleset.into(),
            source: Some(text_source(RULES, false, "t.rules")),
            ..Default::default()
        })
        .await
        .expect("apply")
        .into_inner()
        .revision
        .expect("a revision")
        .name
}

/// A watch of `ruleset` (empty: all) resuming after `start_after` (0: from now). A refused
/// resume is the call's error (the handler answers before any event).
async fn watch(
    d: &Daemon,
    ruleset: &str,
    start_after: u64,
) -> Result<tonic::Streaming<pb::CommitEvent>, tonic::Status> {
    Ok(d.rulesets()
        .await
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: ruleset.into(),
            start_after,
        })
        .await?
        .into_inner())
}

async fn next(s: &mut tonic::Streaming<pb::CommitEvent>) -> pb::CommitEvent {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("an event in time")
        .expect("stream ok")
        .expect("stream open")
}

#[tokio::test(flavor = "current_thread")]
async fn a_reconnecting_watcher_misses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    let mut d = Daemon::start(&db, &[]);
    d.wait_serving().await;

    // Commit, seen by a watcher.
    let mut w = watch(&d, "", 0).await.expect("watch");
    let first = apply(&d, "web").await;
    let seen = next(&mut w).await;
    assert_eq!(seen.revision, first);
    assert!(seen.sequence > 0);
    drop(w);

    // Two commits while disconnected (one of another ruleset in between).
    let second = apply(&d, "web").await;
    let other = apply(&d, "db").await;
    let third = apply(&d, "web").await;

    // Resumed after the last one seen: both, in order, then live events.
    let mut w = watch(&d, "web", seen.sequence).await.expect("resume");
    let a = next(&mut w).await;
    let b = next(&mut w).await;
    assert_eq!(
        [a.revision.as_str(), b.revision.as_str()],
        [second.as_str(), third.as_str()]
    );
    assert!(seen.sequence < a.sequence && a.sequence < b.sequence);
    let fourth = apply(&d, "web").await;
    let c = next(&mut w).await;
    assert_eq!(
        c.revision, fourth,
        "then the live events, no gap, no duplicate"
    );
    drop(w);

    // All rulesets: the other one too, at its place.
    let mut all = watch(&d, "", seen.sequence).await.expect("resume all");
    let mut names = Vec::new();
    for _ in 0..4 {
        names.push(next(&mut all).await.revision);
    }
    assert_eq!(names, [second, other, third, fourth.clone()]);
    drop(all);

    // Not issued yet.
    let e = watch(&d, "", c.sequence + 1)
        .await
        .expect_err("a future sequence");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let field = e
        .get_details_bad_request()
        .and_then(|b| b.field_violations.into_iter().next())
        .map(|v| v.field);
    assert_eq!(field.as_deref(), Some("start_after"));

    // After a restart the events of the previous run are gone: OUT_OF_RANGE, saying so.
    assert!(d.terminate(), "vallumd stops");
    let d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let e = watch(&d, "web", c.sequence)
        .await
        .expect_err("events of the last run");
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    assert_eq!(reason(&e), "EVENTS_NOT_KEPT");
    assert!(e.message().contains("keeps"), "{}", e.message());
    // The new run's numbers start above the old ones.
    let mut w = watch(&d, "", 0).await.expect("watch");
    apply(&d, "web").await;
    assert!(next(&mut w).await.sequence > c.sequence);
}
