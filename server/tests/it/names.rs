//! Request validation over real gRPC against a real `vallumd` (ephemeral port, temporary
//! database): names and echoed input.
//!
//! Cases: a 10,000-character ruleset, revision, set or file name, a long token and thousands
//! of bad lines each come back as INVALID_ARGUMENT with a short message (not the client's
//! RESOURCE_EXHAUSTED "metadata size exceeds hard limit"); `.`/`..` ruleset names and a set
//! named `-x` are refused; a TracePacket with nothing to trace is INVALID_ARGUMENT.

use crate::support;

use support::{Daemon, reason, text_source};
use tonic::Code;
use vallum_proto::v1 as pb;
use vallum_proto::v1::set_service_client::SetServiceClient;
use vallum_proto::v1::trace_service_client::TraceServiceClient;

const RULES: &str = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";

/// A refusal as the client sees it: the code, and a message short enough to read.
fn refused(r: Result<impl std::fmt::Debug, tonic::Status>, code: Code) -> tonic::Status {
    let s = r.expect_err("expected a refusal");
    assert_eq!(s.code(), code, "{s:?}");
    assert!(
        s.message().len() <= 1024,
        "{} bytes: {}",
        s.message().len(),
        s.message()
    );
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_and_odd_names_are_refused_with_short_messages() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let mut sets = SetServiceClient::new(d.channel().await);
    let long = "x".repeat(10_000);

    // Ruleset names: too long, `.`, `..`, in every call that takes one.
    for name in [long.as_str(), ".", "..", "rulesets/.."] {
        let s = refused(
            rs.apply(pb::ApplyRequest {
                ruleset: name.into(),
                source: Some(text_source(RULES, false, "a.rules")),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
        );
        assert_eq!(reason(&s), "INVALID_ARGUMENT");
        assert!(
            s.message().starts_with("INVALID_ARGUMENT: ruleset:"),
            "{}",
            s.message()
        );
    }
    let s = refused(
        rs.validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: long.clone(),
            source: Some(text_source(RULES, false, "a.rules")),
        })
        .await,
        Code::InvalidArgument,
    );
    assert!(s.message().contains("(10000 bytes)"), "{}", s.message());
    refused(
        rs.get_revision(pb::GetRevisionRequest {
            name: format!("rulesets/{long}/revisions/1"),
        })
        .await,
        Code::InvalidArgument,
    );
    refused(
        rs.get_revision(pb::GetRevisionRequest {
            name: "rulesets/../revisions/1".into(),
        })
        .await,
        Code::InvalidArgument,
    );
    // A file name that long, a token that long, and many bad lines: short statuses.
    refused(
        rs.validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: String::new(),
            source: Some(text_source(RULES, false, &long)),
        })
        .await,
        Code::InvalidArgument,
    );
    let token = format!("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j {long}\nCOMMIT\n");
    let s = refused(
        rs.validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: String::new(),
            source: Some(text_source(&token, false, "t.rules")),
        })
        .await,
        Code::InvalidArgument,
    );
    assert_eq!(reason(&s), "INVALID_RULESET");
    let mut many = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for i in 0..5000 {
        many.push_str(&format!("-A INPUT -p tcp --nosuch-{i}-{long:.100} 1\n"));
    }
    many.push_str("COMMIT\n");
    let s = refused(
        rs.validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: String::new(),
            source: Some(text_source(&many, false, "many.rules")),
        })
        .await,
        Code::InvalidArgument,
    );
    assert_eq!(reason(&s), "INVALID_RULESET");

    // Set names: too long, or what no `--match-set` can name.
    for name in [long.as_str(), "-x", "a\"b"] {
        let s = refused(
            sets.create_set(pb::CreateSetRequest {
                name: name.into(),
                r#type: "hash:ip".into(),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
        );
        assert!(
            s.message().starts_with("INVALID_ARGUMENT: name:"),
            "{}",
            s.message()
        );
    }
    refused(
        sets.get_set(pb::GetSetRequest {
            name: long.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    // Nothing was created by the refusals.
    let listed = sets
        .list_sets(pb::ListSetsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sets.is_empty(), "{listed:?}");
    let listed = rs
        .list_rulesets(pb::ListRulesetsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.rulesets.is_empty(), "{listed:?}");

    // TracePacket with nothing to trace.
    let mut tr = TraceServiceClient::new(d.channel().await);
    let s = refused(
        tr.trace_packet(pb::TracePacketRequest::default()).await,
        Code::InvalidArgument,
    );
    assert!(s.message().contains("packet"), "{}", s.message());
}

/// A ValidateRulesetRequest whose `ruleset` (field 1, a string) can carry any bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawValidate {
    #[prost(bytes = "vec", tag = "1")]
    ruleset: Vec<u8>,
}

/// A string field that is not UTF-8 is the caller's error: INVALID_ARGUMENT naming the field
/// (found by review: prost's codec answered INTERNAL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_decode_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut grpc = tonic::client::Grpc::new(d.channel().await);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/vallum.v1.RulesetService/ValidateRuleset");
    let r: Result<tonic::Response<pb::ValidateRulesetResponse>, _> = grpc
        .unary(
            tonic::Request::new(RawValidate {
                ruleset: vec![b'a', 0xff, 0xfe],
            }),
            path,
            vallum_proto::codec::Codec::default(),
        )
        .await;
    let s = refused(r, Code::InvalidArgument);
    assert_eq!(reason(&s), "INVALID_ARGUMENT");
    assert!(s.message().contains("ruleset"), "{}", s.message());
    assert!(s.message().contains("UTF-8"), "{}", s.message());
    // The server is still serving.
    let mut rs = d.rulesets().await;
    let ok = rs
        .validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: String::new(),
            source: Some(text_source(RULES, false, "a.rules")),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.valid, "{ok:?}");
}

/// An Apply or Stage of an empty ruleset is refused unless the caller says allow_empty, and
/// the refusal stores nothing (found by review: `apply web /dev/null` committed an empty
/// revision without a word).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_ruleset_needs_allow_empty() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let apply = |content: &str, allow_empty: bool| pb::ApplyRequest {
        ruleset: "web".into(),
        source: Some(text_source(content, false, "empty.rules")),
        allow_empty,
        ..Default::default()
    };
    rs.apply(apply(RULES, false)).await.unwrap();
    for empty in ["", "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"] {
        let s = refused(rs.apply(apply(empty, false)).await, Code::InvalidArgument);
        assert_eq!(reason(&s), "EMPTY_RULESET", "{s:?}");
        assert!(s.message().contains("allow_empty"), "{}", s.message());
        let s = refused(
            rs.stage_revision(pb::StageRevisionRequest {
                ruleset: "web".into(),
                source: Some(text_source(empty, false, "empty.rules")),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
        );
        assert_eq!(reason(&s), "EMPTY_RULESET", "{s:?}");
    }
    let web = rs
        .get_ruleset(pb::GetRulesetRequest { name: "web".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (web.active_revision, web.latest_revision),
        (1, 1),
        "{web:?}"
    );
    // Said explicitly: committed.
    let c = rs.apply(apply("", true)).await.unwrap().into_inner();
    assert_eq!(c.revision.unwrap().number, 2);
    // A DROP policy alone is not empty.
    rs.apply(apply("*filter\n:INPUT DROP [0:0]\nCOMMIT\n", false))
        .await
        .unwrap();

    // vallumctl: refused (exit 1, the reason on stderr), then said with --allow-empty.
    let empty = dir.path().join("empty.rules");
    std::fs::write(&empty, "").unwrap();
    let ctl = |extra: &[&str]| {
        std::process::Command::new(support::vallumctl())
            .env_clear()
            .env("VALLUM_SERVER", d.url())
            .args(["apply", "web"])
            .arg(&empty)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = ctl(&[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("EMPTY_RULESET"),
        "{out:?}"
    );
    let out = ctl(&["--allow-empty"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
