//! Scoped tokens against an in-process vallumd (issue #20 §3): a token scoped to
//! `rulesets=team-a-*`, `ops=apply,sets` and `min-priority=100` cannot delete, apply, roll
//! back, confirm or outrank another owner's ruleset, nor touch sets or conntrack outside its
//! scope; every refusal is PERMISSION_DENIED `SCOPE_DENIED` naming the missing scope word
//! (`ErrorInfo.metadata["scope"]`), changes nothing, and the audit log records the caller
//! with its scope.

use crate::support;

use std::time::Duration;

use support::{Daemon, reason, text_source};
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;
use vallum_proto::v1::conntrack_service_client::ConntrackServiceClient;
use vallum_proto::v1::counter_service_client::CounterServiceClient;
use vallum_proto::v1::set_service_client::SetServiceClient;

const ROOT: &str = "root-token-0123456789abcdef";
const TEAM_A: &str = "team-a-token-0123456789abcdef";
const TEAM_A_SCOPE: &str = "rulesets=team-a-* ops=apply,sets min-priority=100";
const BASE: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 23 -j DROP\nCOMMIT\n";

fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn apply_req(ruleset: &str, priority: i32) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        priority,
        source: Some(text_source(BASE, false, "test.rules")),
        ..Default::default()
    }
}

/// The refusal's code, reason and missing scope word.
fn denied(e: &tonic::Status) -> (tonic::Code, String, String) {
    let scope = e
        .get_details_error_info()
        .and_then(|i| i.metadata.get("scope").cloned())
        .unwrap_or_default();
    (e.code(), reason(e), scope)
}

fn scope_denied(missing: &str) -> (tonic::Code, String, String) {
    (
        tonic::Code::PermissionDenied,
        "SCOPE_DENIED".to_string(),
        missing.to_string(),
    )
}

#[tokio::test]
async fn a_scoped_token_touches_only_its_own_rulesets_and_sets() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("admin {ROOT} root\nadmin {TEAM_A} team-a {TEAM_A_SCOPE}\n"),
    )
    .unwrap();
    let d = Daemon::in_process(
        &dir.path().join("v.db"),
        &["--token-file", tokens.to_str().unwrap()],
        Default::default(),
    )
    .await;
    let mut c = d.rulesets().await;
    let mut sets = SetServiceClient::new(d.channel().await);
    let mut ct = ConntrackServiceClient::new(d.channel().await);
    let mut counters = CounterServiceClient::new(d.channel().await);

    // Another owner's ruleset (retried while the server still loads its state).
    let mut ok = false;
    let until = tokio::time::Instant::now() + support::PATIENCE;
    while tokio::time::Instant::now() < until {
        match c.apply(with_token(apply_req("team-b-web", 10), ROOT)).await {
            Ok(_) => {
                ok = true;
                break;
            }
            Err(e) if e.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => panic!("root apply: {e:?}"),
        }
    }
    assert!(ok, "the server never became ready");

    // Its own ruleset, at or after its priority floor: allowed; the author names the scope.
    let rev = c
        .apply(with_token(apply_req("team-a-web", 100), TEAM_A))
        .await
        .unwrap()
        .into_inner()
        .revision
        .unwrap();
    assert_eq!(rev.author, format!("team-a [{TEAM_A_SCOPE}]"));

    // Outranking (a lower priority number runs first).
    let e = c
        .apply(with_token(apply_req("team-a-early", 50), TEAM_A))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("min-priority<=50"), "{e:?}");
    assert!(e.message().contains("team-a may not Apply"), "{e:?}");

    // A ruleset of its own names that root created below its floor: the stored priority
    // counts (a ruleset keeps its first stage's priority), so neither an Apply at 100 nor a
    // commit of its revision gets past the floor.
    c.apply(with_token(apply_req("team-a-low", 10), ROOT))
        .await
        .expect("root applies team-a-low at 10");
    let e = c
        .apply(with_token(apply_req("team-a-low", 100), TEAM_A))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("min-priority<=10"), "{e:?}");
    let e = c
        .commit_revision(with_token(
            pb::CommitRevisionRequest {
                name: "rulesets/team-a-low/revisions/1".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("min-priority<=10"), "{e:?}");

    // Another owner's ruleset: no apply, delete, rollback, confirm, stage or commit.
    let missing = scope_denied("rulesets=team-b-web");
    let e = c
        .apply(with_token(apply_req("team-b-web", 200), TEAM_A))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), missing, "{e:?}");
    let e = c
        .delete_ruleset(with_token(
            pb::DeleteRulesetRequest {
                name: "rulesets/team-b-web".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), missing, "{e:?}");
    let e = c
        .rollback(with_token(
            pb::RollbackRequest {
                name: "rulesets/team-b-web/revisions/1".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), missing, "{e:?}");
    let e = c
        .confirm_commit(with_token(
            pb::ConfirmCommitRequest {
                name: "rulesets/team-b-web/revisions/1".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), missing, "{e:?}");
    let e = c
        .stage_revision(with_token(
            pb::StageRevisionRequest {
                ruleset: "team-b-web".into(),
                priority: 200,
                source: Some(text_source(BASE, false, "test.rules")),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), missing, "{e:?}");
    let e = c
        .commit_revision(with_token(
            pb::CommitRevisionRequest {
                name: "rulesets/team-b-web/revisions/1".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), missing, "{e:?}");
    // Nothing changed: team-b-web still has its one revision, active.
    let rs = c
        .get_ruleset(with_token(
            pb::GetRulesetRequest {
                name: "rulesets/team-b-web".into(),
            },
            ROOT,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rs.active_revision, 1, "{rs:?}");

    // Sets: its own names only, both sides of a swap.
    let create = |name: &str| pb::CreateSetRequest {
        name: name.into(),
        r#type: "hash:ip".into(),
        ..Default::default()
    };
    sets.create_set(with_token(create("team-a-blk"), TEAM_A))
        .await
        .unwrap();
    sets.create_set(with_token(create("team-b-blk"), ROOT))
        .await
        .unwrap();
    let e = sets
        .create_set(with_token(create("team-b-new"), TEAM_A))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("rulesets=team-b-new"), "{e:?}");
    let e = sets
        .swap_sets(with_token(
            pb::SwapSetsRequest {
                name: "team-a-blk".into(),
                other_name: "sets/team-b-blk".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("rulesets=team-b-blk"), "{e:?}");
    let e = sets
        .flush_set(with_token(
            pb::FlushSetRequest {
                name: "team-b-blk".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("rulesets=team-b-blk"), "{e:?}");
    // An import names its sets in the text: only a token for every name may.
    let e = sets
        .import_ipset_save(with_token(
            pb::ImportIpsetSaveRequest {
                text: "create team-b-blk hash:ip\n".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("rulesets=*"), "{e:?}");

    // Conntrack is host-wide and counters were not granted.
    let e = ct
        .flush(with_token(pb::FlushConntrackRequest::default(), TEAM_A))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("ops=conntrack"), "{e:?}");
    let e = counters
        .zero_counters(with_token(
            pb::ZeroCountersRequest {
                ruleset: "team-a-web".into(),
                ..Default::default()
            },
            TEAM_A,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("ops=counters"), "{e:?}");

    // EditRuleset is an Apply of its edits: its own ruleset yes, another owner's no; the
    // audit names the method.
    let edit = |ruleset: &str| pb::EditRulesetRequest {
        ruleset: ruleset.into(),
        edits: vec![pb::RuleCommand {
            family: pb::Family::Ipv4 as i32,
            table: "filter".into(),
            args: ["-A", "INPUT", "-p", "tcp", "--dport", "24", "-j", "DROP"]
                .map(String::from)
                .to_vec(),
        }],
        ..Default::default()
    };
    c.edit_ruleset(with_token(edit("team-a-web"), TEAM_A))
        .await
        .expect("team-a edits its own ruleset");
    let e = c
        .edit_ruleset(with_token(edit("team-b-web"), TEAM_A))
        .await
        .unwrap_err();
    assert_eq!(denied(&e), scope_denied("rulesets=team-b-web"), "{e:?}");

    // The audit log records the caller with its scope, refusals included.
    let db = rusqlite::Connection::open(dir.path().join("v.db")).unwrap();
    let rows: Vec<(String, String, String)> = db
        .prepare("SELECT caller, method, outcome FROM audit ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let scoped = format!("team-a [{TEAM_A_SCOPE}]");
    let delete = rows
        .iter()
        .find(|r| r.1 == "DeleteRuleset")
        .unwrap_or_else(|| panic!("no DeleteRuleset record: {rows:?}"));
    assert_eq!(delete.0, scoped, "{rows:?}");
    assert!(delete.2.contains("SCOPE_DENIED"), "{rows:?}");
    assert!(
        rows.iter().any(|r| r.0 == "root" && r.1 == "Apply"),
        "{rows:?}"
    );
    assert_eq!(
        rows.iter()
            .filter(|r| r.0 == scoped && r.1 == "EditRuleset")
            .count(),
        2,
        "{rows:?}"
    );
    d.stop().await;
}
