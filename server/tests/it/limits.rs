//! Requests that are too big or too deep, against a real `vallumd` (ephemeral port, temporary
//! database): the text of issue #13 (chains jumping in one long line, which overflowed a
//! worker's stack at 12k chains) is refused with the depth error by Validate and Apply and the
//! server keeps answering; a ruleset over `--max-chains` or `--max-rules` is refused with
//! RESOURCE_EXHAUSTED naming the limit and its flag, and nothing is stored.

use crate::support;

use support::{Daemon, reason, text_source};
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;

/// INPUT jumps to C0, each Ci to C(i+1).
fn line_of_jumps(n: usize) -> String {
    let mut t = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..n {
        t.push_str(&format!(":C{i} - [0:0]\n"));
    }
    t.push_str("-A INPUT -j C0\n");
    for i in 0..n - 1 {
        t.push_str(&format!("-A C{i} -j C{}\n", i + 1));
    }
    t.push_str("COMMIT\n");
    t
}

const SMALL: &str = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";

fn apply_req(ruleset: &str, text: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        source: Some(text_source(text, false, "deep.rules")),
        ..Default::default()
    }
}

fn validate_req(text: &str) -> pb::ValidateRulesetRequest {
    pb::ValidateRulesetRequest {
        ruleset: "web".into(),
        source: Some(text_source(text, false, "deep.rules")),
    }
}

#[tokio::test]
async fn a_long_line_of_jumps_is_refused_and_the_server_keeps_answering() {
    const N: usize = 12_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("v.db"), &["--insecure-no-auth"]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let text = line_of_jumps(N);

    let v = c
        .validate_ruleset(validate_req(&text))
        .await
        .expect("validate answers")
        .into_inner();
    assert!(!v.valid);
    let messages: Vec<&str> = v.violations.iter().map(|v| v.message.as_str()).collect();
    assert_eq!(
        messages,
        [format!(
            "chain calls nest {N} deep, more than the limit of 64"
        )]
    );
    assert_eq!(v.violations[0].path, "filter/INPUT");

    let e = c.apply(apply_req("web", &text)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(reason(&e), "INVALID_RULESET");
    assert!(
        e.message().contains(&format!("nest {N} deep")),
        "{}",
        e.message()
    );

    // Still serving, and nothing was stored.
    let v = c
        .validate_ruleset(validate_req(SMALL))
        .await
        .expect("validate answers")
        .into_inner();
    assert!(v.valid, "{v:?}");
    let all = c
        .list_rulesets(pb::ListRulesetsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(all.rulesets.is_empty(), "{all:?}");
    c.apply(apply_req("web", SMALL)).await.expect("applies");
}

#[tokio::test]
async fn chains_and_rules_over_their_limits_are_resource_exhausted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &[
            "--insecure-no-auth",
            "--max-chains",
            "100",
            "--max-rules",
            "100",
        ],
    );
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    // 3 builtin chains and 97 user chains: at the limit.
    let at_limit = line_of_jumps(60).replace(":C0 -", &{
        let mut s = String::new();
        for i in 0..37 {
            s.push_str(&format!(":E{i} - [0:0]\n"));
        }
        s + ":C0 -"
    });
    let v = c
        .validate_ruleset(validate_req(&at_limit))
        .await
        .expect("validate answers")
        .into_inner();
    assert!(v.valid, "{v:?}");

    let over = line_of_jumps(98);
    let mut refusals = Vec::new();
    refusals.push(c.apply(apply_req("web", &over)).await.unwrap_err());
    refusals.push(c.validate_ruleset(validate_req(&over)).await.unwrap_err());
    for e in &refusals {
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert_eq!(
            e.message(),
            "ruleset has 101 chains, more than the limit of 100 (--max-chains)"
        );
        let info = e.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "TOO_MANY_CHAINS");
        assert_eq!(info.metadata["limit"], "max-chains");
        assert_eq!(info.metadata["value"], "101");
    }

    let mut many_rules = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..101 {
        many_rules.push_str(&format!("-A INPUT -s 10.0.0.{i} -j DROP\n"));
    }
    many_rules.push_str("COMMIT\n");
    let e = c
        .validate_ruleset(validate_req(&many_rules))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(reason(&e), "TOO_MANY_RULES");
    assert!(e.message().contains("(--max-rules)"), "{}", e.message());

    let all = c
        .list_rulesets(pb::ListRulesetsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(all.rulesets.is_empty(), "{all:?}");
}

#[tokio::test]
async fn sets_over_their_limits_are_resource_exhausted() {
    use vallum_proto::v1::set_service_client::SetServiceClient;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &[
            "--insecure-no-auth",
            "--max-sets",
            "2",
            "--max-set-elements",
            "1000",
        ],
    );
    d.wait_serving().await;
    let mut s = SetServiceClient::new(d.channel().await);
    let create = |name: &str, maxelem: u32| pb::CreateSetRequest {
        name: name.into(),
        r#type: "hash:ip".into(),
        maxelem,
        ..Default::default()
    };
    let e = s.create_set(create("big", 0)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(reason(&e), "SET_TOO_LARGE");
    assert_eq!(
        e.message(),
        "set big asks for maxelem 65536, more than the limit of 1000 (--max-set-elements)"
    );
    s.create_set(create("a", 1000)).await.expect("creates a");
    let two = "create b hash:ip family inet hashsize 64 maxelem 10\ncreate c hash:ip family inet hashsize 64 maxelem 10\nadd b 10.0.0.1\n";
    let e = s
        .import_ipset_save(pb::ImportIpsetSaveRequest {
            text: two.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(reason(&e), "TOO_MANY_SETS");
    assert!(e.message().contains("(--max-sets)"), "{}", e.message());
    s.create_set(create("b", 10)).await.expect("creates b");
    let e = s.create_set(create("c", 10)).await.unwrap_err();
    assert_eq!(reason(&e), "TOO_MANY_SETS");
    assert_eq!(
        e.message(),
        "3 sets would exist, more than the limit of 2 (--max-sets)"
    );
    let names: Vec<String> = (s.list_sets(pb::ListSetsRequest::default()).await)
        .expect("lists")
        .into_inner()
        .sets
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["a", "b"]);
}

/// `-A INPUT -s <n addresses> -d <n addresses> -j DROP`: one line, n x n rules.
fn address_lists(n: usize) -> String {
    let list = |net: u8| {
        (0..n)
            .map(|i| format!("10.{net}.{}.{}", i / 256, i % 256))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -s {} -d {} -j DROP\nCOMMIT\n",
        list(1),
        list(2)
    )
}

/// Issue #28 item 1: a 27 KB text of two 1,000-address lists stands for 1,000,000 rules. It is
/// counted before it is expanded: ValidateRuleset, Apply and EditRuleset (the path of
/// `vallum-iptables -A`) refuse it at the line with RESOURCE_EXHAUSTED naming --max-rules, in a
/// vallumd whose address space is limited to 1 GiB (expanding it takes several GiB), which then
/// still answers; nothing is stored.
#[tokio::test]
async fn address_lists_are_counted_before_they_are_expanded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = support::Rlimits {
        address_space: Some(1 << 30),
        ..Default::default()
    };
    let d = Daemon::start_limited(&dir.path().join("v.db"), &[], &[], limits);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let text = address_lists(1000);
    let list = |n: u8| {
        (0..1000)
            .map(|i| format!("10.{n}.{}.{}", i / 256, i % 256))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut refusals = vec![
        c.validate_ruleset(validate_req(&text)).await.unwrap_err(),
        c.apply(apply_req("web", &text)).await.unwrap_err(),
    ];
    for e in &refusals {
        assert_eq!(
            e.message(),
            "deep.rules:4:4: -s/-d address lists expand to 1000000 rules, more than the limit of 100000 (--max-rules)"
        );
    }
    let edit = pb::EditRulesetRequest {
        ruleset: "web".into(),
        edits: vec![pb::RuleCommand {
            args: ["-A", "INPUT", "-s", &list(1), "-d", &list(2), "-j", "DROP"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = c.edit_ruleset(edit).await.unwrap_err();
    // The edits are read as the lines of a text named `edits` (line 1 is `*filter`).
    assert_eq!(
        e.message(),
        "edits:2:4: -s/-d address lists expand to 1000000 rules, more than the limit of 100000 (--max-rules)"
    );
    refusals.push(e);
    for e in &refusals {
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        let info = e.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "TOO_MANY_RULES");
        assert_eq!(info.metadata["limit"], "max-rules");
        assert_eq!(info.metadata["value"], "1000000");
        let bad = e.get_details_bad_request().expect("BadRequest");
        assert!(
            bad.field_violations[0].field.starts_with("source"),
            "{bad:?}"
        );
    }
    // Just under the limit (316 x 316 = 99,856 rules) is accepted.
    let v = c
        .validate_ruleset(validate_req(&address_lists(316)))
        .await
        .expect("validate answers")
        .into_inner();
    assert!(v.valid, "{v:?}");
    let all = c
        .list_rulesets(pb::ListRulesetsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(all.rulesets.is_empty(), "{all:?}");
}
