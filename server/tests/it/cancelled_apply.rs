//! A client that gives up on an Apply (its deadline passes mid-commit) does not leave the store
//! and the engine disagreeing: the call runs to its end on its own task, so the revision the
//! store names active is the one the engine runs (found by review: before, a deadline between
//! the durable store write and the publish left the store one revision ahead until a restart).
//!
//! How the test knows what happened, without waiting on a clock:
//! - every attempt carries a `request_id`, and is retried with the same id and no deadline:
//!   idempotency makes exactly one commit per id (the first call's, or the retry's when the
//!   first never reached the commit), and the retry returns only once that commit has ended
//!   (it waits for the first call's idempotency slot). So store and engine must agree as soon
//!   as the retry returns;
//! - the retry is the same request (a retry with another body would be refused:
//!   IDEMPOTENCY_KEY_REUSED), sent after the client saw the first call end; the commit's
//!   WatchCommits event gives its span on the wall clock (`time - total .. time`), so a commit
//!   that started before the client saw the first call's error is the first call's. A deadline
//!   landed mid-commit when the client gave up on a call, that call committed, the commit
//!   started before the deadline and ended after the client saw the error. The test asserts
//!   that this happened at least once (deadlines are fractions of a measured commit, tried
//!   over a bounded number of rounds).

use crate::support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

/// A ruleset of `n` rules whose content depends on `tag`.
fn big(tag: usize, n: usize) -> String {
    let mut s =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for i in 0..n {
        s.push_str(&format!(
            "-A INPUT -s 10.{}.{}.0/24 -p tcp -m tcp --dport {} -j DROP\n",
            i / 256 % 256,
            i % 256,
            tag % 60000 + 1
        ));
    }
    s + "COMMIT\n"
}

/// Now on the wall clock (the one vallumd stamps commit events with), Unix ns.
fn wall_ns() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(d.as_nanos()).expect("fits")
}

fn request(k: usize, message: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: "x".into(),
        source: Some(text_source(&big(k, RULES), false, "t.rules")),
        request_id: format!("attempt-{k}"),
        message: message.into(),
        ..Default::default()
    }
}

/// Rules per Apply: a commit long enough (tens of ms in a release build, seconds in a debug
/// one) for a deadline to land inside it.
const RULES: usize = 5_000;

/// Deadlines per round, as fractions (percent) of a measured commit: from "before the
/// commit starts" to "after it ended", so that some land between the store write and the
/// publish.
const FRACTIONS: [u32; 5] = [25, 50, 75, 90, 110];
/// At most this many rounds, until a deadline landed mid-commit.
const ROUNDS: usize = 5;

#[tokio::test]
async fn an_apply_whose_client_gave_up_ends_with_store_and_engine_agreeing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &["--source", "synthetic"]);
    d.wait_serving().await;
    let mut rulesets = d.rulesets().await;
    let mut engine = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let mut events = rulesets
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // How long an Apply of this size takes here (the longer of two, the second a change).
    let mut full = Duration::ZERO;
    for k in 0..2 {
        let t0 = Instant::now();
        rulesets.apply(request(k, "warm-up")).await.unwrap();
        full = full.max(t0.elapsed());
        events.message().await.unwrap().expect("an event");
    }

    let (mut k, mut gave_up, mut mid_commit) = (2, 0, 0);
    for _round in 0..ROUNDS {
        for percent in FRACTIONS {
            let timeout = full * percent / 100;
            let mut req = tonic::Request::new(request(k, "first call"));
            req.set_timeout(timeout);
            let sent = wall_ns();
            let first = rulesets.apply(req).await;
            let seen = wall_ns();
            if let Err(e) = &first {
                assert!(
                    matches!(
                        e.code(),
                        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                    ),
                    "deadline {timeout:?}: {e:?}"
                );
                gave_up += 1;
            }
            // The retry (the same request) returns once the one commit of this request id
            // has ended.
            let retry = rulesets
                .apply(request(k, "first call"))
                .await
                .expect("the retry commits or returns the first call's commit")
                .into_inner();
            let revision = retry.revision.expect("a revision");
            // Store and engine agree now: no wait.
            let stored = rulesets
                .get_ruleset(pb::GetRulesetRequest { name: "x".into() })
                .await
                .unwrap()
                .into_inner()
                .active_revision;
            let status = engine
                .get_status(pb::GetStatusRequest {})
                .await
                .unwrap()
                .into_inner();
            let running = status
                .active
                .iter()
                .find(|a| a.ruleset == "x")
                .map_or(0, |a| a.revision);
            assert_eq!(
                (stored, running),
                (revision.number, revision.number),
                "deadline {timeout:?}: the store names revision {stored} active, the engine runs {running}"
            );
            // Exactly one commit for this request id.
            let ev = events.message().await.unwrap().expect("an event");
            assert_eq!(ev.revision, revision.name, "one commit per request id");
            assert_eq!(ev.outcome, pb::CommitOutcome::Committed as i32);
            let ended = ev
                .time
                .map_or(0, |t| t.seconds * 1_000_000_000 + i64::from(t.nanos));
            let took = ev
                .phases
                .and_then(|p| p.total)
                .map_or(0, |d| d.seconds as u64 * 1_000_000_000 + d.nanos as u64);
            let started = ended - i64::try_from(took).unwrap_or(i64::MAX);
            let deadline = sent + i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
            // The retry was sent after `seen`: a commit that started before is the first call's.
            let by_first = started < seen;
            if first.is_err() && by_first && started < deadline && seen < ended {
                mid_commit += 1;
            }
            k += 1;
        }
        if mid_commit > 0 {
            break;
        }
    }
    println!(
        "{gave_up} of {} Applies hit their deadline, {mid_commit} of them mid-commit (a commit takes {full:?})",
        k - 2
    );
    assert!(
        mid_commit > 0,
        "no deadline landed mid-commit in {} attempts",
        k - 2
    );
}
