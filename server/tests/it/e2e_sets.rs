//! End-to-end tests of the SetService against real `vallumd` processes (ephemeral ports,
//! temporary databases).
//!
//! Cases: create/add/list/get/delete/flush/swap/destroy round trip with the error of each
//! refusal (field paths, ALREADY_EXISTS, NOT_FOUND, FAILED_PRECONDITION for a set in use or a
//! swap of different types); a commit naming a missing set fails with the rule's LINE:COL;
//! persistence across kill -9 and restart (sets, elements, an active ruleset that references
//! them, timeouts not extended); the real Docker ruleset of ../shared/data with its ipset
//! imported from `ipset save` text, traced through TraceService while elements come and go
//! without a commit; vallumctl's `set` commands.

use crate::support;

use std::time::Duration;

use support::{Daemon, reason, shared_data, text_source};
use tonic::transport::Channel;
use tonic_types::StatusExt;
use vallum_proto::v1 as pb;
use vallum_proto::v1::set_service_client::SetServiceClient;

async fn sets(d: &Daemon) -> SetServiceClient<Channel> {
    SetServiceClient::new(d.channel().await).max_decoding_message_size(64 << 20)
}

fn el(text: &str) -> pb::SetElement {
    pb::SetElement {
        text: text.into(),
        ..Default::default()
    }
}

fn add(set: &str, texts: &[&str]) -> pb::AddElementsRequest {
    pb::AddElementsRequest {
        set: set.into(),
        elements: texts.iter().map(|t| el(t)).collect(),
        exist: false,
        ..Default::default()
    }
}

fn del(set: &str, texts: &[&str]) -> pb::DeleteElementsRequest {
    pb::DeleteElementsRequest {
        set: set.into(),
        elements: texts.iter().map(|t| el(t)).collect(),
        exist: false,
        ..Default::default()
    }
}

fn create(name: &str, kind: &str) -> pb::CreateSetRequest {
    pb::CreateSetRequest {
        name: name.into(),
        r#type: kind.into(),
        ..Default::default()
    }
}

async fn elements(c: &mut SetServiceClient<Channel>, name: &str) -> Vec<String> {
    c.get_set(pb::GetSetRequest {
        name: name.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .elements
    .into_iter()
    .map(|e| e.text)
    .collect()
}

fn violations(s: &tonic::Status) -> Vec<(String, String)> {
    s.get_error_details()
        .bad_request()
        .map(|b| {
            b.field_violations
                .iter()
                .map(|v| (v.field.clone(), v.description.clone()))
                .collect()
        })
        .unwrap_or_default()
}

const FILTER_WITH_SET: &str = "*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -m set --match-set bans src -j DROP
COMMIT
";

fn apply(ruleset: &str, text: &str, filename: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        ruleset: ruleset.into(),
        source: Some(text_source(text, false, filename)),
        ..Default::default()
    }
}

fn packet(src: &str, dst: &str, dport: u32) -> pb::PacketSpec {
    pb::PacketSpec {
        source: src.into(),
        destination: dst.into(),
        protocol: "tcp".into(),
        source_port: 40000,
        destination_port: dport,
        tcp_flags: "S".into(),
        in_interface: "eth0".into(),
        ..Default::default()
    }
}

async fn trace(d: &Daemon, p: pb::PacketSpec) -> pb::TracePacketResponse {
    pb::trace_service_client::TraceServiceClient::new(d.channel().await)
        .trace_packet(pb::TracePacketRequest {
            packet: Some(p),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn set_round_trip_errors_and_destroy_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut c = sets(&d).await;

    let s = c
        .create_set(create("bans", "hash:net"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (s.r#type.as_str(), s.entries, s.maxelem),
        ("hash:net", 0, 65536)
    );
    // Same name again: ALREADY_EXISTS, unless -exist with the same spec.
    let e = c.create_set(create("bans", "hash:net")).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (tonic::Code::AlreadyExists, "ALREADY_EXISTS")
    );
    c.create_set(pb::CreateSetRequest {
        exist: true,
        ..create("bans", "hash:net")
    })
    .await
    .unwrap();
    let e = c.create_set(create("x", "hash:mac")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(violations(&e)[0].0, "type");

    // Text and structured elements in one call.
    let r = c
        .add_elements(pb::AddElementsRequest {
            set: "bans".into(),
            elements: vec![
                el("10.0.0.0/8"),
                pb::SetElement {
                    address: "192.0.2.0".into(),
                    prefix_len: 24,
                    ..Default::default()
                },
                el("198.51.100.7"),
            ],
            exist: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.added, r.entries), (3, 3));
    assert_eq!(
        elements(&mut c, "bans").await,
        ["10.0.0.0/8", "192.0.2.0/24", "198.51.100.7"]
    );
    // Bad elements are named by field path and change nothing.
    let e = c
        .add_elements(add("bans", &["203.0.113.1", "10.0.0.300", "2001:db8::/32"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let v = violations(&e);
    assert_eq!(
        v.iter().map(|v| v.0.as_str()).collect::<Vec<_>>(),
        ["elements[1]", "elements[2]"],
        "{v:?}"
    );
    // A timeout on a set without timeouts.
    let e = c
        .add_elements(pb::AddElementsRequest {
            set: "bans".into(),
            elements: vec![pb::SetElement {
                timeout: Some(5),
                ..el("203.0.113.1")
            }],
            exist: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&e)[0].0, "elements[0].timeout");
    // Already there: ALREADY_EXISTS naming the element; with exist it is fine.
    let e = c
        .add_elements(add("bans", &["203.0.113.1", "10.0.0.0/8"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists);
    assert!(e.message().contains("elements[1]"), "{}", e.message());
    assert_eq!(elements(&mut c, "bans").await.len(), 3, "all or nothing");
    c.add_elements(pb::AddElementsRequest {
        exist: true,
        ..add("bans", &["203.0.113.1", "10.0.0.0/8"])
    })
    .await
    .unwrap();
    assert_eq!(elements(&mut c, "bans").await.len(), 4);
    // Pagination.
    let p1 = c
        .get_set(pb::GetSetRequest {
            name: "bans".into(),
            page_size: 3,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p1.elements.len(), 3);
    let p2 = c
        .get_set(pb::GetSetRequest {
            name: "bans".into(),
            page_size: 3,
            page_token: p1.next_page_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p2.elements.len(), 1);
    assert!(p2.next_page_token.is_empty());
    // Delete: missing element NOT_FOUND unless exist.
    let e = c
        .delete_elements(del("bans", &["203.0.113.1", "203.0.113.2"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let r = c
        .delete_elements(pb::DeleteElementsRequest {
            exist: true,
            ..del("bans", &["203.0.113.1", "203.0.113.2"])
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.deleted, r.entries), (1, 3));

    // A ruleset that references the set commits; one naming a missing set fails with the
    // rule's LINE:COL.
    let mut rs = d.rulesets().await;
    rs.apply(apply("web", FILTER_WITH_SET, "web.rules"))
        .await
        .unwrap();
    let missing = FILTER_WITH_SET.replace("bans", "nosuchset");
    let e = rs
        .apply(apply("web2", &missing, "web2.rules"))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "INVALID_RULESET");
    let v = violations(&e);
    assert!(
        v.iter()
            .any(|(_, d)| d.starts_with("web2.rules:6:")
                && d.contains("set nosuchset does not exist")),
        "{v:?}"
    );
    // The set rule drops 10.1.2.3, without a commit after the elements changed.
    let t = trace(&d, packet("10.1.2.3", "192.0.2.10", 80)).await;
    assert_eq!(t.verdict(), pb::Verdict::Drop, "{t:#?}");
    assert!(
        t.steps
            .iter()
            .any(|s| s.text.contains("--match-set bans src"))
    );

    // Listed with its user; destroy refused while referenced.
    let l = c
        .list_sets(pb::ListSetsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(l.sets.len(), 1);
    assert_eq!(l.sets[0].referenced_by, ["web"]);
    let e = c
        .destroy_set(pb::DestroySetRequest {
            name: "bans".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("in use by a kernel component") && e.message().contains("web"),
        "{}",
        e.message()
    );
    let details = e.get_error_details();
    assert_eq!(
        details.precondition_failure().unwrap().violations[0].r#type,
        "SET_IN_USE"
    );

    // Swap keeps the rule's reference: after swapping with an empty set, nothing is dropped.
    c.create_set(create("bans-next", "hash:net")).await.unwrap();
    c.add_elements(add("bans-next", &["203.0.113.0/24"]))
        .await
        .unwrap();
    c.swap_sets(pb::SwapSetsRequest {
        name: "bans".into(),
        other_name: "bans-next".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(elements(&mut c, "bans").await, ["203.0.113.0/24"]);
    assert_eq!(elements(&mut c, "bans-next").await.len(), 3);
    assert_eq!(
        trace(&d, packet("10.1.2.3", "192.0.2.10", 80))
            .await
            .verdict(),
        pb::Verdict::Accept
    );
    assert_eq!(
        trace(&d, packet("203.0.113.5", "192.0.2.10", 80))
            .await
            .verdict(),
        pb::Verdict::Drop
    );
    c.create_set(create("ports", "hash:ip,port")).await.unwrap();
    let e = c
        .swap_sets(pb::SwapSetsRequest {
            name: "bans".into(),
            other_name: "ports".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);

    // Flush empties without a commit.
    c.flush_set(pb::FlushSetRequest {
        name: "bans".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(elements(&mut c, "bans").await.is_empty());
    assert_eq!(
        trace(&d, packet("203.0.113.5", "192.0.2.10", 80))
            .await
            .verdict(),
        pb::Verdict::Accept
    );

    // Once the ruleset is gone the set can go.
    rs.delete_ruleset(pb::DeleteRulesetRequest {
        name: "rulesets/web".into(),
        etag: String::new(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.destroy_set(pb::DestroySetRequest {
        name: "bans".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let e = c
        .get_set(pb::GetSetRequest {
            name: "bans".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    // A commit-confirmed whose rollback would restore a revision using the set: destroy is
    // refused too (the rollback would fail).
    rs.apply(apply(
        "cc",
        &FILTER_WITH_SET.replace("bans", "bans-next"),
        "cc.rules",
    ))
    .await
    .unwrap();
    let no_set = FILTER_WITH_SET.replace("-A INPUT -m set --match-set bans src -j DROP\n", "");
    rs.apply(pb::ApplyRequest {
        confirm_within: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        ..apply("cc", &no_set, "cc.rules")
    })
    .await
    .unwrap();
    let l = c
        .list_sets(pb::ListSetsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(l.sets.iter().all(|s| s.referenced_by.is_empty()), "{l:?}");
    let e = c
        .destroy_set(pb::DestroySetRequest {
            name: "bans-next".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("rulesets/cc/revisions/1"),
        "{}",
        e.message()
    );
    // ipset save of what is left.
    let text = c
        .export_ipset_save(pb::ExportIpsetSaveRequest {
            name: "bans-next".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .text;
    assert_eq!(
        text,
        "create bans-next hash:net family inet hashsize 1024 maxelem 65536\nadd bans-next 10.0.0.0/8\nadd bans-next 192.0.2.0/24\nadd bans-next 198.51.100.7\n"
    );
}

/// Inputs an attacker or a typo could send: each is INVALID_ARGUMENT with the element's field
/// path, the server keeps serving, and the set is unchanged.
#[tokio::test]
async fn hostile_set_inputs_are_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut c = sets(&d).await;
    c.create_set(pb::CreateSetRequest {
        family: pb::Family::Ipv6 as i32,
        maxelem: 1000,
        ..create("v6", "hash:ip")
    })
    .await
    .unwrap();
    let bad = |req: pb::AddElementsRequest| {
        let mut c = c.clone();
        async move {
            let e = c.add_elements(req).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
            violations(&e).into_iter().map(|v| v.0).collect::<Vec<_>>()
        }
    };
    // A /0 on hash:ip of inet6 (used to overflow a shift).
    assert_eq!(
        bad(add("v6", &["2001:db8::1", "::/0"])).await,
        ["elements[1]"]
    );
    // A port next to the element text (used to be dropped silently).
    let with_port = pb::AddElementsRequest {
        elements: vec![pb::SetElement {
            port: 80,
            ..el("2001:db8::1")
        }],
        ..add("v6", &[])
    };
    assert_eq!(bad(with_port).await, ["elements[0]"]);
    // Many /112s (65536 hosts each): refused once past maxelem, not expanded in full.
    let many: Vec<&str> = vec!["2001:db8::/112"; 2000];
    assert_eq!(
        bad(pb::AddElementsRequest {
            exist: true,
            ..add("v6", &many)
        })
        .await,
        ["elements[0]"]
    );
    assert!(elements(&mut c, "v6").await.is_empty());
    // The `sets/` resource form names the same set in CreateSet as in the other calls.
    c.create_set(create("sets/res", "hash:ip")).await.unwrap();
    c.add_elements(add("sets/res", &["192.0.2.1"]))
        .await
        .unwrap();
    assert_eq!(elements(&mut c, "sets/res").await, ["192.0.2.1"]);
    c.destroy_set(pb::DestroySetRequest {
        name: "sets/res".into(),
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn sets_survive_kill9_and_restart_without_extending_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let mut d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let mut c = sets(&d).await;
    c.create_set(pb::CreateSetRequest {
        timeout: Some(600),
        counters: true,
        ..create("bans", "hash:ip")
    })
    .await
    .unwrap();
    c.add_elements(pb::AddElementsRequest {
        set: "bans".into(),
        elements: vec![
            // The set's default: 600 s.
            el("10.9.9.9"),
            pb::SetElement {
                timeout: Some(0),
                ..el("10.8.8.8")
            },
            pb::SetElement {
                timeout: Some(2),
                ..el("10.7.7.7")
            },
        ],
        exist: false,
        ..Default::default()
    })
    .await
    .unwrap();
    c.import_ipset_save(pb::ImportIpsetSaveRequest {
        text: "create allow hash:ip,port family inet6\nadd allow 2001:db8::1,udp:53\n".into(),
        filename: "allow.save".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    d.rulesets()
        .await
        .apply(apply("web", FILTER_WITH_SET, "web.rules"))
        .await
        .unwrap();
    let before = c
        .get_set(pb::GetSetRequest {
            name: "bans".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let left_before = before
        .elements
        .iter()
        .find(|e| e.text == "10.9.9.9")
        .and_then(|e| e.timeout)
        .unwrap();
    d.kill9();
    // While vallumd is down, 10.7.7.7's 2 s run out.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let d = Daemon::start(&db, &[]);
    d.wait_serving().await;
    let mut c = sets(&d).await;
    let after = c
        .get_set(pb::GetSetRequest {
            name: "bans".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let set = after.set.unwrap();
    assert_eq!((set.timeout, set.counters), (Some(600), true));
    assert_eq!(set.referenced_by, ["web"]);
    let texts: Vec<&str> = after.elements.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(
        texts,
        ["10.8.8.8", "10.9.9.9"],
        "10.7.7.7 expired while down"
    );
    let left_after = after.elements[1].timeout.unwrap();
    assert!(
        left_after < left_before,
        "timeout extended by the restart: {left_before} s before, {left_after} s after"
    );
    assert_eq!(after.elements[0].timeout, Some(0), "never expires");
    assert_eq!(elements(&mut c, "allow").await, ["2001:db8::1,udp:53"]);
    // The ruleset came back active and matches against the restored set.
    let t = trace(&d, packet("10.9.9.9", "192.0.2.10", 80)).await;
    assert_eq!(t.verdict(), pb::Verdict::Drop, "{t:#?}");
}

#[tokio::test]
#[ignore = "needs ../shared/data"]
async fn docker_ipset_ruleset_commits_once_its_set_exists() {
    let Some(data) = shared_data() else {
        panic!("docker ipset ruleset: ../shared/data not found");
    };
    let fname = "docker-moby-usernet-portmap-ipset.rules";
    let Ok(text) = std::fs::read_to_string(data.join("iptables-save").join(fname)) else {
        panic!("docker ipset ruleset: iptables-save/{fname} not found");
    };
    // The file's comment (and SOURCES.md) name the set it needs: docker-ext-bridges-v4,
    // a hash:net that Docker fills with its bridges' subnets.
    let set = "docker-ext-bridges-v4";
    assert!(
        text.contains(&format!("--match-set {set} dst")),
        "{fname} changed"
    );
    let first_use = text
        .lines()
        .position(|l| l.contains("--match-set"))
        .unwrap()
        + 1;

    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let mut c = sets(&d).await;
    // Without the set: refused, at the first rule that uses it.
    let e = rs.apply(apply("docker", &text, fname)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(reason(&e), "INVALID_RULESET");
    let v = violations(&e);
    let want = format!("{fname}:{first_use}:");
    assert!(
        v.iter()
            .any(|(_, d)| d.starts_with(&want) && d.contains(&format!("set {set} does not exist"))),
        "no violation at {want}: {v:?}"
    );

    // Docker's set, as `ipset save` prints it on a Docker host (only the default bridge yet).
    let r = c
        .import_ipset_save(pb::ImportIpsetSaveRequest {
            text: format!(
                "create {set} hash:net family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x6c1b5a3e\nadd {set} 172.17.0.0/16\n"
            ),
            filename: "docker.ipset".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.lines, r.sets.clone()), (2, vec![set.to_string()]));
    // A bad import names LINE:COL and changes nothing.
    let e = c
        .import_ipset_save(pb::ImportIpsetSaveRequest {
            text: format!("add {set} 192.0.2.0/24\nadd {set} 192.0.2.300/24\n"),
            filename: "bad.ipset".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let v = violations(&e);
    assert_eq!(v[0].0, "text");
    assert!(v[0].1.starts_with("bad.ipset:2:"), "{v:?}");
    assert_eq!(elements(&mut c, set).await, ["172.17.0.0/16"]);

    let r = rs
        .apply(apply("docker", &text, fname))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.revision.as_ref().unwrap().number, 1);

    // A new connection from outside to bridge1's subnet, port 81 (not published).
    let p = pb::PacketSpec {
        hook: pb::Hook::Forward as i32,
        out_interface: "bridge1".into(),
        ..packet("198.51.100.7", "192.0.2.3", 81)
    };
    let t = trace(&d, p.clone()).await;
    assert_eq!(
        t.verdict(),
        pb::Verdict::Accept,
        "bridge1 not in the set yet: {t:#?}"
    );
    assert!(!t.steps.iter().any(|s| s.chain == "DOCKER"), "{t:#?}");
    // Docker adds bridge1's subnet: the set rule jumps to DOCKER, which drops it.
    c.add_elements(add(set, &["192.0.2.0/24"])).await.unwrap();
    let t = trace(&d, p.clone()).await;
    assert_eq!(t.verdict(), pb::Verdict::Drop, "{t:#?}");
    assert!(
        t.steps
            .iter()
            .any(|s| s.chain == "FORWARD"
                && s.text == format!("-m set --match-set {set} dst -j DOCKER")),
        "{t:#?}"
    );
    // And removes it again: back to the policy, still without a commit.
    c.delete_elements(del(set, &["192.0.2.0/24"]))
        .await
        .unwrap();
    let t = trace(&d, p).await;
    assert_eq!(t.verdict(), pb::Verdict::Accept, "{t:#?}");
    let st = pb::engine_service_client::EngineServiceClient::new(d.channel().await)
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.active.len(), 1);
    assert_eq!(st.active[0].revision, 1, "no commit happened");
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn vallumctl(server: &str, args: &[&str]) -> Run {
    vallumctl_stdin(server, args, "")
}

fn vallumctl_stdin(server: &str, args: &[&str], stdin: &str) -> Run {
    use std::io::Write as _;
    let mut child = std::process::Command::new(support::vallumctl())
        .args(["--server", server, "--timeout", "10s"])
        .args(args)
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vallumctl_set_commands_like_ipset() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let url = d.url();
    let ok = |args: &[&str]| {
        let r = vallumctl(&url, args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        r.stdout
    };

    ok(&[
        "set", "create", "f2b", "hash:ip", "timeout", "600", "counters",
    ]);
    ok(&[
        "set", "create", "f2b-new", "hash:ip", "timeout", "600", "counters",
    ]);
    ok(&["set", "create", "nets6", "hash:net", "family", "inet6"]);
    let out = ok(&[
        "set",
        "add",
        "f2b",
        "203.0.113.9",
        "198.51.100.23",
        "timeout",
        "0",
    ]);
    assert!(out.contains("added 2 to f2b"), "{out}");
    let file = dir.path().join("nets.txt");
    std::fs::write(
        &file,
        "# bad networks\n2001:db8:bad::/48\n2001:db8:dead::/48\n",
    )
    .unwrap();
    ok(&["set", "add", "nets6", "-f", file.to_str().unwrap()]);

    // `ipset list NAME` layout.
    let out = ok(&["set", "show", "f2b"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "Name: f2b");
    assert_eq!(lines[1], "Type: hash:ip");
    assert_eq!(
        lines[2],
        "Header: family inet hashsize 1024 maxelem 65536 timeout 600 counters"
    );
    assert!(lines.contains(&"Number of entries: 2"), "{out}");
    let members = lines.iter().position(|l| *l == "Members:").unwrap();
    assert_eq!(
        lines[members + 1],
        "198.51.100.23 timeout 0 packets 0 bytes 0"
    );
    assert!(
        lines[members + 2].starts_with("203.0.113.9 timeout "),
        "{out}"
    );
    let out = ok(&["set", "list", "--terse"]);
    assert_eq!(out.matches("Name: ").count(), 3, "{out}");
    assert!(!out.contains("Members:"), "{out}");
    let j: serde_json::Value =
        serde_json::from_str(&ok(&["-o", "json", "set", "show", "nets6"])).unwrap();
    assert_eq!(j["family"], "inet6");
    assert_eq!(j["members"].as_array().unwrap().len(), 2);

    // Errors: exit 1 with the server's reason; a bad element names its field.
    let r = vallumctl(&url, &["set", "add", "f2b", "203.0.113.9"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("ALREADY_EXISTS"), "{}", r.stderr);
    let r = vallumctl(&url, &["set", "add", "f2b", "203.0.113.10", "not-an-ip"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("elements[1]:"), "{}", r.stderr);
    let r = vallumctl(&url, &["set", "del", "nets6", "2001:db8:beef::/48"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("NOT_FOUND"), "{}", r.stderr);
    ok(&["set", "del", "nets6", "2001:db8:beef::/48", "--exist"]);

    // ipset save / ipset restore round trip into a fresh server.
    let saved = ok(&["set", "save"]);
    assert!(
        saved.contains("create nets6 hash:net family inet6 hashsize 1024 maxelem 65536\n"),
        "{saved}"
    );
    let dir2 = tempfile::tempdir().unwrap();
    let d2 = Daemon::start(&dir2.path().join("v.db"), &[]);
    d2.wait_serving().await;
    let r = vallumctl_stdin(&d2.url(), &["set", "import"], &saved);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("into 3 set(s)"), "{}", r.stdout);
    let again = vallumctl(&d2.url(), &["set", "save", "nets6"]);
    assert_eq!(
        again.stdout,
        "create nets6 hash:net family inet6 hashsize 1024 maxelem 65536\nadd nets6 2001:db8:bad::/48\nadd nets6 2001:db8:dead::/48\n"
    );
    // A bad restore file: FILE:LINE:COL on stderr, nothing applied.
    let bad = dir.path().join("bad.save");
    std::fs::write(&bad, "create x hash:ip\nadd x 10.0.0.1\nadd x 10.0.0.300\n").unwrap();
    let r = vallumctl(&d2.url(), &["set", "import", bad.to_str().unwrap()]);
    assert_eq!(r.code, 1);
    let want = format!("{}:3:7:", bad.display());
    assert!(
        r.stderr.lines().any(|l| l.starts_with(&want)),
        "{}",
        r.stderr
    );
    let r = vallumctl(&d2.url(), &["set", "show", "x"]);
    assert_eq!(r.code, 1, "nothing of the bad file was applied");

    ok(&["set", "swap", "f2b", "f2b-new"]);
    assert!(ok(&["set", "show", "f2b"]).contains("Number of entries: 0"));
    ok(&["set", "flush", "f2b-new"]);
    ok(&["set", "destroy", "f2b-new"]);
    let r = vallumctl(&url, &["set", "destroy", "f2b-new"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("NOT_FOUND"), "{}", r.stderr);
}
