//! Optimistic concurrency and idempotency of every mutation, and UpdateRuleset (issue #21,
//! API part 2), against a real `vallumd` (ephemeral port, temporary database).
//!
//! Cases: UpdateRuleset's field mask (unknown and output-only paths refused naming them), etag,
//! dry run, and a priority change that is a commit of its own (a new revision with the same
//! content, an audit record, a COMMITTED event, the dataplane order changed) or, without an
//! active revision, a change of the stored priority only; set etags on every set mutation; a
//! retried `request_id` answering the first call's response without doing it twice
//! (CreateSet, AddElements, DeleteRuleset, ConfirmCommit, a noflush Apply with an etag,
//! conntrack Flush), and refused when the request differs (IDEMPOTENCY_KEY_REUSED).

use crate::support;

use std::time::Duration;

use support::{Daemon, reason, text_source};
use tonic::Code;
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;
use vallum_server::control::store::Store;

type Channel = tonic::transport::Channel;

const BASE: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 23 -j DROP\nCOMMIT\n";

fn apply_req(ruleset: &str, text: &str, priority: i32) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        source: Some(text_source(text, false, "test.rules")),
        priority,
        ..Default::default()
    }
}

fn update(name: &str, priority: i32, etag: &str, paths: &[&str]) -> pb::UpdateRulesetRequest {
    pb::UpdateRulesetRequest {
        ruleset: Some(pb::Ruleset {
            name: name.into(),
            priority,
            etag: etag.into(),
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask {
            paths: paths.iter().map(|p| p.to_string()).collect(),
        }),
        ..Default::default()
    }
}

/// The BadRequest field of a status, with its description.
fn field(e: &tonic::Status) -> (String, String) {
    e.get_error_details()
        .bad_request()
        .and_then(|br| br.field_violations.first())
        .map(|v| (v.field.clone(), v.description.clone()))
        .unwrap_or_default()
}

async fn get(
    c: &mut pb::ruleset_service_client::RulesetServiceClient<Channel>,
    name: &str,
) -> pb::Ruleset {
    c.get_ruleset(pb::GetRulesetRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}

/// The rulesets a traced INPUT packet went through, in order (each once).
async fn trace_order(ch: &Channel) -> Vec<String> {
    let mut tr = pb::trace_service_client::TraceServiceClient::new(ch.clone());
    let t = tr
        .trace_packet(pb::TracePacketRequest {
            packet: Some(pb::PacketSpec {
                hook: pb::Hook::Input as i32,
                source: "192.0.2.1".into(),
                destination: "192.0.2.2".into(),
                protocol: "tcp".into(),
                source_port: 40000,
                destination_port: 80,
                tcp_flags: "S".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut order: Vec<String> = Vec::new();
    for s in &t.steps {
        if order.last() != Some(&s.ruleset) {
            order.push(s.ruleset.clone());
        }
    }
    order
}

#[tokio::test]
async fn update_ruleset_priority_mask_etag_and_commit() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let ch = d.channel().await;
    let mut c = d.rulesets().await;
    c.apply(apply_req("a", BASE, 0)).await.unwrap();
    let b1 = c
        .apply(apply_req("b", BASE, 10))
        .await
        .unwrap()
        .into_inner();
    let b1 = b1.revision.unwrap();
    assert_eq!(
        trace_order(&ch).await,
        ["a", "b"],
        "lower priority runs first"
    );
    let before = get(&mut c, "rulesets/b").await;
    let store = Store::open(&db).await.unwrap();
    let audited = store.audit_count().await.unwrap();

    // Paths that are not updatable fields are named.
    for (paths, bad, what) in [
        (&["description"][..], 0, "is not a field of Ruleset"),
        (&["priority", "etag"][..], 1, "cannot be updated"),
        (&["active_revision"][..], 0, "cannot be updated"),
    ] {
        let e = c
            .update_ruleset(update("rulesets/b", -5, "", paths))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{paths:?}: {e:?}");
        let (f, description) = field(&e);
        assert_eq!(f, format!("update_mask.paths[{bad}]"), "{paths:?}");
        assert!(
            description.contains(paths[bad]) && description.contains(what),
            "{description}"
        );
    }
    // A stale etag: FAILED_PRECONDITION, nothing changes.
    let e = c
        .update_ruleset(update("rulesets/b", -5, "stale", &["priority"]))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e)),
        (Code::FailedPrecondition, "ETAG_MISMATCH".into())
    );
    // A dry run answers the ruleset as it would be and changes nothing.
    let mut dry = update("rulesets/b", -5, &before.etag, &["priority"]);
    dry.validate_only = true;
    let shown = c.update_ruleset(dry).await.unwrap().into_inner();
    assert_eq!(shown.priority, -5);
    assert_eq!(
        get(&mut c, "rulesets/b").await,
        before,
        "refusals and dry runs change nothing"
    );
    // The four refusals are audited (with their reasons), the dry run is not.
    let audited = audited + 4;
    assert_eq!(store.audit_count().await.unwrap(), audited);

    // The change: a commit of its own.
    let mut watch = c
        .watch_commits(pb::WatchCommitsRequest {
            ruleset: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let after = c
        .update_ruleset(update("rulesets/b", -5, &before.etag, &["priority"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.priority, -5);
    assert_ne!(after.etag, before.etag);
    assert_eq!((after.active_revision, after.latest_revision), (2, 2));
    assert_eq!(get(&mut c, "rulesets/b").await, after);
    let event = tokio::time::timeout(Duration::from_secs(60), watch.message())
        .await
        .expect("an event")
        .unwrap()
        .unwrap();
    assert_eq!(event.revision, "rulesets/b/revisions/2");
    assert_eq!(event.outcome, pb::CommitOutcome::Committed as i32);
    let b2 = c
        .get_revision(pb::GetRevisionRequest {
            name: "rulesets/b/revisions/2".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b2.digest, b1.digest, "same content");
    assert_eq!(b2.message, "priority 10 -> -5");
    assert_eq!(b2.state, pb::RevisionState::Active as i32);
    assert_eq!(store.audit_count().await.unwrap(), audited + 1);
    let commits = store.commits("b").await.unwrap();
    assert_eq!(commits.last().map(|c| c.revision), Some(2));
    // The dataplane order follows.
    assert_eq!(trace_order(&ch).await, ["b", "a"]);
    let mut engine = pb::engine_service_client::EngineServiceClient::new(ch.clone());
    let status = engine
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let b = status.active.iter().find(|a| a.ruleset == "b").unwrap();
    assert_eq!((b.revision, b.priority), (2, -5));
    // The same priority again, or an empty mask with nothing set: no commit.
    let same = c
        .update_ruleset(update("rulesets/b", -5, "", &["priority"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same, after);
    let none = c
        .update_ruleset(update("rulesets/b", 0, "", &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(none, after);

    // Without an active revision only the stored priority changes.
    c.stage_revision(pb::StageRevisionRequest {
        ruleset: "c".into(),
        source: Some(text_source(BASE, false, "c.rules")),
        priority: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let c0 = get(&mut c, "rulesets/c").await;
    let c1 = c
        .update_ruleset(update("c", 7, &c0.etag, &["*"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (c1.priority, c1.active_revision, c1.latest_revision),
        (7, 0, 1)
    );
    assert_ne!(c1.etag, c0.etag);
    // The next commit of it runs at that priority.
    c.commit_revision(pb::CommitRevisionRequest {
        name: "rulesets/c/revisions/1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let status = engine
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let cs = status.active.iter().find(|a| a.ruleset == "c").unwrap();
    assert_eq!(cs.priority, 7);
    // Unknown ruleset.
    let e = c
        .update_ruleset(update("rulesets/nope", 1, "", &["priority"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn set_mutations_check_etags_and_answer_retries_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut s = pb::set_service_client::SetServiceClient::new(d.channel().await);
    let create = pb::CreateSetRequest {
        name: "bans".into(),
        r#type: "hash:ip".into(),
        request_id: "create-1".into(),
        ..Default::default()
    };
    let first = s.create_set(create.clone()).await.unwrap().into_inner();
    // A retry gets the first answer, not ALREADY_EXISTS.
    let again = s.create_set(create.clone()).await.unwrap().into_inner();
    assert_eq!(again, first);
    assert!(!first.etag.is_empty());
    let head = |s: &mut pb::set_service_client::SetServiceClient<Channel>| {
        let mut s = s.clone();
        async move {
            s.get_set(pb::GetSetRequest {
                name: "bans".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .set
            .unwrap()
        }
    };
    let add = |texts: &[&str], etag: &str, id: &str| pb::AddElementsRequest {
        set: "bans".into(),
        elements: texts
            .iter()
            .map(|t| pb::SetElement {
                text: t.to_string(),
                ..Default::default()
            })
            .collect(),
        etag: etag.into(),
        request_id: id.into(),
        ..Default::default()
    };
    let e0 = head(&mut s).await.etag;
    assert_eq!(e0, first.etag);
    let r = s
        .add_elements(add(&["192.0.2.1", "192.0.2.2"], &e0, "add-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.added, r.entries), (2, 2));
    let e1 = head(&mut s).await.etag;
    assert_ne!(e1, e0);
    // The retry: same answer, nothing done twice (without -exist a second add would fail).
    let retry = s
        .add_elements(add(&["192.0.2.1", "192.0.2.2"], &e0, "add-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retry, r);
    assert_eq!(head(&mut s).await.etag, e1);
    // The same id with another request is refused and changes nothing.
    let e = s
        .add_elements(add(&["192.0.2.9"], &e1, "add-1"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(reason(&e), "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(field(&e).0, "request_id");
    assert!(field(&e).1.contains("different request"), "{e:?}");
    // A stale etag: FAILED_PRECONDITION ETAG_MISMATCH on every mutation, nothing changes.
    let stale = [
        s.add_elements(add(&["192.0.2.3"], &e0, ""))
            .await
            .unwrap_err(),
        s.delete_elements(pb::DeleteElementsRequest {
            set: "bans".into(),
            elements: vec![pb::SetElement {
                text: "192.0.2.1".into(),
                ..Default::default()
            }],
            etag: e0.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err(),
        s.flush_set(pb::FlushSetRequest {
            name: "bans".into(),
            etag: e0.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err(),
        s.destroy_set(pb::DestroySetRequest {
            name: "bans".into(),
            etag: e0.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err(),
    ];
    for e in &stale {
        assert_eq!(
            (e.code(), reason(e)),
            (Code::FailedPrecondition, "ETAG_MISMATCH".into()),
            "{e:?}"
        );
    }
    s.create_set(pb::CreateSetRequest {
        name: "other".into(),
        r#type: "hash:ip".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let e = s
        .swap_sets(pb::SwapSetsRequest {
            name: "bans".into(),
            other_name: "other".into(),
            etag: e1.clone(),
            other_etag: "stale".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "ETAG_MISMATCH");
    let now = head(&mut s).await;
    assert_eq!(
        (now.entries, now.etag.clone()),
        (2, e1.clone()),
        "refusals change nothing"
    );
    // With the current etag it goes through.
    s.flush_set(pb::FlushSetRequest {
        name: "bans".into(),
        etag: e1.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let listed = s
        .list_sets(pb::ListSetsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let bans = listed.sets.iter().find(|x| x.name == "bans").unwrap();
    assert_eq!(bans.entries, 0);
    assert!(bans.etag != e1 && !bans.etag.is_empty());
}

#[tokio::test]
async fn ruleset_and_conntrack_retries_answer_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    // ConfirmCommit: a stale etag changes nothing; a retry answers as the first call did
    // (a second confirm without the id is FAILED_PRECONDITION: nothing is pending).
    let mut req = apply_req("cc", BASE, 0);
    req.confirm_within = Some(prost_types::Duration {
        seconds: 3600,
        nanos: 0,
    });
    let pending = c.apply(req).await.unwrap().into_inner();
    let name = pending.revision.as_ref().unwrap().name.clone();
    let confirm = |etag: &str, id: &str| pb::ConfirmCommitRequest {
        name: name.clone(),
        etag: etag.into(),
        request_id: id.into(),
    };
    let e = c.confirm_commit(confirm("stale", "")).await.unwrap_err();
    assert_eq!(reason(&e), "ETAG_MISMATCH");
    let state = |c: &mut pb::ruleset_service_client::RulesetServiceClient<Channel>| {
        let (mut c, name) = (c.clone(), name.clone());
        async move {
            c.get_revision(pb::GetRevisionRequest { name })
                .await
                .unwrap()
                .into_inner()
                .state
        }
    };
    assert_eq!(
        state(&mut c).await,
        pb::RevisionState::PendingConfirm as i32
    );
    let first = c
        .confirm_commit(confirm(&pending.etag, "confirm-1"))
        .await
        .unwrap()
        .into_inner();
    let again = c
        .confirm_commit(confirm(&pending.etag, "confirm-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, first);
    assert_eq!(state(&mut c).await, pb::RevisionState::Active as i32);
    let e = c.confirm_commit(confirm("", "")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);

    // A noflush Apply with an etag and an id: the retry gets the first answer (the check of
    // its etag against the ruleset the first call changed used to refuse it).
    let etag = get(&mut c, "rulesets/cc").await.etag;
    let mut edit = apply_req(
        "cc",
        "*filter\n-A INPUT -s 10.9.9.9/32 -j DROP\nCOMMIT\n",
        0,
    );
    if let Some(pb::ruleset_source::Source::Text(t)) =
        edit.source.as_mut().and_then(|s| s.source.as_mut())
    {
        t.noflush = true;
    }
    edit.etag = etag;
    edit.request_id = "noflush-1".into();
    let a = c.apply(edit.clone()).await.unwrap().into_inner();
    let b = c.apply(edit.clone()).await.unwrap().into_inner();
    assert_eq!(a, b);
    let latest = get(&mut c, "rulesets/cc").await.latest_revision;
    assert_eq!(latest, a.revision.unwrap().number, "done once");
    // The same id with another text is refused.
    edit.source = Some(text_source(BASE, false, "other.rules"));
    let e = c.apply(edit).await.unwrap_err();
    assert_eq!(reason(&e), "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(get(&mut c, "rulesets/cc").await.latest_revision, latest);

    // DeleteRuleset: a stale etag keeps it; a retry answers OK instead of NOT_FOUND.
    let del = |etag: &str, id: &str| pb::DeleteRulesetRequest {
        name: "rulesets/cc".into(),
        etag: etag.into(),
        request_id: id.into(),
    };
    let e = c.delete_ruleset(del("stale", "")).await.unwrap_err();
    assert_eq!(reason(&e), "ETAG_MISMATCH");
    get(&mut c, "rulesets/cc").await;
    c.delete_ruleset(del("", "delete-1")).await.unwrap();
    c.delete_ruleset(del("", "delete-1")).await.unwrap();
    let e = c.delete_ruleset(del("", "")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Conntrack Flush and Delete: a retry answers the first count; another filter under the
    // same id is refused.
    let mut ct = pb::conntrack_service_client::ConntrackServiceClient::new(d.channel().await);
    let flush = pb::FlushConntrackRequest {
        request_id: "flush-1".into(),
    };
    let f1 = ct.flush(flush.clone()).await.unwrap().into_inner();
    assert_eq!(ct.flush(flush).await.unwrap().into_inner(), f1);
    let delete = |port: u32| pb::DeleteConntrackRequest {
        filter: Some(pb::ConntrackFilter {
            destination_port: port,
            ..Default::default()
        }),
        request_id: "ct-delete-1".into(),
    };
    ct.delete(delete(22)).await.unwrap();
    let e = ct.delete(delete(23)).await.unwrap_err();
    assert_eq!(reason(&e), "IDEMPOTENCY_KEY_REUSED");
}

/// Issue #28 item 3: request ids are one namespace across methods (AIP-155). Apply with id X,
/// then DeleteRuleset with X is refused (IDEMPOTENCY_KEY_REUSED naming the Apply) and deletes
/// nothing; a retried Apply with X still answers the first Apply. A `validate_only` call with
/// an id never answers from the key store (it validates: an invalid text is refused even
/// with the id of an earlier successful Apply of the same ruleset) and never writes to it
/// (the id stays free for a real call).
#[tokio::test]
async fn request_ids_are_one_namespace_and_dry_runs_skip_the_key_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut c = d.rulesets().await;
    let apply = pb::ApplyRequest {
        request_id: "x-1".into(),
        ..apply_req("ns", BASE, 0)
    };
    let first = c.apply(apply.clone()).await.expect("apply").into_inner();
    let e = c
        .delete_ruleset(pb::DeleteRulesetRequest {
            name: "rulesets/ns".into(),
            etag: String::new(),
            request_id: "x-1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(reason(&e), "IDEMPOTENCY_KEY_REUSED");
    let (f, why) = field(&e);
    assert_eq!(f, "request_id");
    assert!(why.contains("earlier Apply"), "{why}");
    // Not deleted, and the retry of the Apply answers the first one.
    assert_eq!(get(&mut c, "rulesets/ns").await.active_revision, 1);
    let again = c.apply(apply).await.expect("retry").into_inner();
    assert_eq!(again, first);

    // A dry run with the Apply's id and a bad text: validated, not answered from the store.
    let bad = pb::ApplyRequest {
        request_id: "x-1".into(),
        validate_only: true,
        ..apply_req("ns", "*filter\n-A NOPE -j DROP\nCOMMIT\n", 0)
    };
    let e = c.apply(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_ne!(reason(&e), "IDEMPOTENCY_KEY_REUSED", "{e:?}");
    // A dry run with a fresh id writes no key: a real call with that id then runs (and
    // makes revision 2), where an answer from the store would repeat the dry run's preview.
    let dry = pb::ApplyRequest {
        request_id: "x-2".into(),
        validate_only: true,
        ..apply_req("ns", &BASE.replace("23", "24"), 0)
    };
    c.apply(dry.clone()).await.expect("dry run");
    let real = c
        .apply(pb::ApplyRequest {
            validate_only: false,
            ..dry
        })
        .await
        .expect("apply")
        .into_inner();
    assert_eq!(
        real.revision.expect("a revision").name,
        "rulesets/ns/revisions/2"
    );
    let stored = Store::open(&dir.path().join("v.db")).await.expect("open");
    assert_eq!(stored.idempotency_count().await.expect("count"), 2);
}
