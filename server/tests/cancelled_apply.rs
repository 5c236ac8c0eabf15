//! A client that gives up on an Apply (its deadline passes mid-commit) does not leave the store
//! and the engine disagreeing: the call runs to its end on its own task, so the revision the
//! store names active is the one the engine runs (found by review: before, a deadline between
//! the durable store write and the publish left the store one revision ahead until a restart).

#[path = "support/vallumd.rs"]
mod support;

use std::time::{Duration, Instant};

use support::{Vallumd, text_source};
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

#[tokio::test]
async fn an_apply_whose_client_gave_up_ends_with_store_and_engine_agreeing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Vallumd::start(&dir.path().join("v.db"), &["--source", "synthetic"]);
    d.wait_serving().await;
    let mut rulesets = d.rulesets().await;
    let mut engine = pb::engine_service_client::EngineServiceClient::new(d.channel().await);
    let mut gave_up = 0;
    // Deadlines from "before the commit starts" to "after it ended", so that some land
    // between the store write and the publish.
    for (k, ms) in [5u64, 20, 40, 80, 120, 160, 240, 320, 480]
        .into_iter()
        .enumerate()
    {
        let mut req = tonic::Request::new(pb::ApplyRequest {
            ruleset: "x".into(),
            source: Some(text_source(&big(k, 20_000), false, "t.rules")),
            ..Default::default()
        });
        req.set_timeout(Duration::from_millis(ms));
        if rulesets.apply(req).await.is_err() {
            gave_up += 1;
        }
        // The call may still be running: wait until it has ended (store and engine agree).
        let t0 = Instant::now();
        loop {
            let stored = rulesets
                .get_ruleset(pb::GetRulesetRequest { name: "x".into() })
                .await
                .map(|r| r.into_inner().active_revision)
                .unwrap_or(0);
            let status = engine
                .get_status(pb::GetStatusRequest {})
                .await
                .unwrap()
                .into_inner();
            let running = status
                .active
                .iter()
                .find(|a| a.ruleset == "x" || a.ruleset.ends_with("/x"))
                .map_or(0, |a| a.revision);
            if stored == running {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "deadline {ms} ms: the store names revision {stored} active, the engine runs {running}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    println!("{gave_up} of 9 Applies hit their deadline");
}
