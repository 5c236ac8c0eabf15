//! Pagination (AIP-158) against a real `vallumd`: GetCounters of a 100,000-rule ruleset page
//! by page (every rule once, in order), `vallumctl counters` of a 60,000-rule ruleset (one
//! unpaged answer would be ~4.6 MB, past gRPC's 4 MiB: "decoded message length too large"
//! before pages), page tokens that are not ours or belong to another request, a token
//! outliving a commit, and ListRulesets / ListSets / ListRevisions pages.

use crate::support;

use std::collections::BTreeSet;

use support::{Daemon, reason, text_source};
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;
use vallum_proto::v1::counter_service_client::CounterServiceClient;

/// `n` distinct rules in INPUT (`-s 10.a.b.c/32 -j ACCEPT`), policy DROP.
fn rules(n: u32) -> String {
    let mut s =
        String::from("*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for i in 0..n {
        s.push_str(&format!(
            "-A INPUT -s 10.{}.{}.{}/32 -j ACCEPT\n",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        ));
    }
    s.push_str("COMMIT\n");
    s
}

async fn apply(d: &Daemon, name: &str, text: &str) {
    d.rulesets()
        .await
        .max_encoding_message_size(64 << 20)
        .apply(pb::ApplyRequest {
            ruleset: name.into(),
            source: Some(text_source(text, false, "big.rules")),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

fn field(e: &tonic::Status) -> String {
    e.get_details_bad_request()
        .and_then(|b| b.field_violations.into_iter().next())
        .map(|v| v.field)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_page_over_100k_rules_and_the_cli_reads_every_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--max-request-bytes", "16777216", "--max-rules", "100000"],
    );
    d.wait_serving().await;
    const N: u32 = 100_000;
    apply(&d, "big", &rules(N)).await;

    let mut c = CounterServiceClient::new(d.channel().await);
    let page = |token: String, size: u32| pb::GetCountersRequest {
        ruleset: "big".into(),
        page_size: size,
        page_token: token,
    };
    // Every page fits the client's default 4 MiB limit; the union is every rule once, in
    // order: per chain its policy (rule 0) then 1..=n.
    let mut seen: Vec<(String, u32)> = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let r = c
            .get_counters(page(token.clone(), 5000))
            .await
            .unwrap_or_else(|e| panic!("page {pages}: {e}"))
            .into_inner();
        pages += 1;
        assert!(r.counters.len() <= 5000, "page size: {}", r.counters.len());
        seen.extend(r.counters.into_iter().map(|c| (c.chain, c.rule)));
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    let input: Vec<u32> = seen
        .iter()
        .filter(|(chain, r)| chain == "INPUT" && *r > 0)
        .map(|(_, r)| *r)
        .collect();
    // (Compared without printing 100,000 numbers on failure.)
    let in_order = input.iter().copied().eq(1..=N);
    assert!(
        in_order,
        "INPUT: every rule once, in order; got {} rules, first out of place at {:?}",
        input.len(),
        input.iter().zip(1..=N).position(|(a, b)| *a != b)
    );
    let policies = seen.iter().filter(|(_, r)| *r == 0).count();
    assert_eq!(policies, 3, "INPUT, FORWARD and OUTPUT policies once each");
    let unique: BTreeSet<_> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no counter twice");
    // INPUT's 100,001 plus FORWARD's and OUTPUT's policies.
    assert_eq!(seen.len(), N as usize + 3);
    assert_eq!(pages, 21, "100,003 counters in pages of 5000");

    // page_size 0: the default, 1000.
    let r = c
        .get_counters(page(String::new(), 0))
        .await
        .expect("default page")
        .into_inner();
    assert_eq!(r.counters.len(), 1000);

    // A larger page size is lowered to the maximum (10,000).
    let r = c
        .get_counters(page(String::new(), u32::MAX))
        .await
        .expect("max page")
        .into_inner();
    assert_eq!(r.counters.len(), 10_000);
    let second = r.next_page_token;

    // A token that is not ours, and one of another request: INVALID_ARGUMENT on page_token.
    for bad in ["garbage", "00", "7631"] {
        let e = c
            .get_counters(page(bad.into(), 0))
            .await
            .expect_err("a made-up token");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        assert_eq!(field(&e), "page_token", "{bad}");
    }
    let e = c
        .get_counters(pb::GetCountersRequest {
            ruleset: String::new(),
            page_size: 0,
            page_token: second.clone(),
        })
        .await
        .expect_err("the token of another request");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(field(&e), "page_token");

    // vallumctl counters of a 60,000-rule ruleset: one answer would pass 4 MiB; the CLI pages.
    apply(&d, "cli60k", &rules(60_000)).await;
    let out = std::process::Command::new(support::vallumctl())
        .args(["--server", &d.url(), "counters", "cli60k"])
        .output()
        .expect("run vallumctl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "vallumctl counters: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule_lines = stdout.lines().filter(|l| l.contains(" 10.")).count();
    assert_eq!(rule_lines, 60_000, "every rule printed once");

    // A commit between two pages: the next page is ABORTED (LIST_CHANGED), not a listing
    // that mixes two revisions.
    apply(&d, "big", &rules(10)).await;
    let e = c
        .get_counters(page(second, 0))
        .await
        .expect_err("a token from before the commit");
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    assert_eq!(reason(&e), "LIST_CHANGED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rulesets_sets_and_revisions_page_by_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let names = ["a", "b", "c", "d", "e"];
    for n in names {
        apply(&d, n, &rules(1)).await;
    }
    apply(&d, "c", &rules(2)).await;
    apply(&d, "c", &rules(3)).await;
    let mut rs = d.rulesets().await;

    // ListRulesets by two: three pages; a ruleset deleted between pages does not shift them.
    let mut got = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let r = rs
            .list_rulesets(pb::ListRulesetsRequest {
                page_size: 2,
                page_token: token.clone(),
            })
            .await
            .expect("list")
            .into_inner();
        pages += 1;
        assert!(r.rulesets.len() <= 2);
        got.extend(r.rulesets.into_iter().map(|r| r.name));
        if pages == 1 {
            rs.delete_ruleset(pb::DeleteRulesetRequest {
                name: "rulesets/a".into(),
                ..Default::default()
            })
            .await
            .expect("delete a listed one");
        }
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    assert_eq!(
        got,
        ["a", "b", "c", "d", "e"].map(|n| format!("rulesets/{n}"))
    );
    assert_eq!(pages, 3);

    // A ListRulesets token is not a ListRevisions token.
    let foreign = token_of_first_page(&mut rs).await;
    let e = rs
        .list_revisions(pb::ListRevisionsRequest {
            ruleset: "c".into(),
            page_size: 1,
            page_token: foreign,
        })
        .await
        .expect_err("another method's token");
    assert_eq!(field(&e), "page_token");

    // ListRevisions by one: 1, 2, 3; the token names its ruleset.
    let r = rs
        .list_revisions(pb::ListRevisionsRequest {
            ruleset: "c".into(),
            page_size: 1,
            page_token: String::new(),
        })
        .await
        .expect("revisions")
        .into_inner();
    assert_eq!(r.revisions[0].number, 1);
    let e = rs
        .list_revisions(pb::ListRevisionsRequest {
            ruleset: "b".into(),
            page_size: 1,
            page_token: r.next_page_token.clone(),
        })
        .await
        .expect_err("a token of ruleset c for ruleset b");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(field(&e), "page_token");
    let mut numbers = vec![1];
    let mut token = r.next_page_token;
    while !token.is_empty() {
        let r = rs
            .list_revisions(pb::ListRevisionsRequest {
                ruleset: "c".into(),
                page_size: 1,
                page_token: token,
            })
            .await
            .expect("revisions")
            .into_inner();
        numbers.extend(r.revisions.iter().map(|r| r.number));
        token = r.next_page_token;
    }
    assert_eq!(numbers, [1, 2, 3]);

    // ListSets by two.
    let mut sets = pb::set_service_client::SetServiceClient::new(d.channel().await);
    for n in ["s3", "s1", "s5", "s2", "s4"] {
        sets.create_set(pb::CreateSetRequest {
            name: n.into(),
            r#type: "hash:ip".into(),
            ..Default::default()
        })
        .await
        .expect("create set");
    }
    let mut got = Vec::new();
    let mut token = String::new();
    loop {
        let r = sets
            .list_sets(pb::ListSetsRequest {
                page_size: 2,
                page_token: token,
            })
            .await
            .expect("list sets")
            .into_inner();
        assert!(r.sets.len() <= 2);
        got.extend(r.sets.into_iter().map(|s| s.name));
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    assert_eq!(got, ["s1", "s2", "s3", "s4", "s5"]);
}

async fn token_of_first_page(
    rs: &mut pb::ruleset_service_client::RulesetServiceClient<tonic::transport::Channel>,
) -> String {
    let t = rs
        .list_rulesets(pb::ListRulesetsRequest {
            page_size: 1,
            page_token: String::new(),
        })
        .await
        .expect("list")
        .into_inner()
        .next_page_token;
    assert!(!t.is_empty());
    t
}
