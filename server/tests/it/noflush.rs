//! Orchestrator-style updates over real gRPC and `vallumctl` against a real `vallumd`
//! (ephemeral port, temporary database): `iptables-restore --noflush` partial updates,
//! `--counters`, and the parser's warnings.
//!
//! Cases: a kube-proxy-style partial update (one KUBE-SVC chain replaced, a rule deleted)
//! applied on top of the active revision gives the complete merged revision, diffable and
//! revertible, and the untouched rules keep their counters (started with `--counters`); a
//! stale etag is refused; a `-D` of a missing rule is INVALID_RULESET at FILE:LINE:COL and
//! changes nothing; Validate and Stage take `noflush` too; a `--log-prefix` over 29 bytes
//! comes back as a warning at its FILE:LINE:COL from Validate, Apply and `vallumctl`.

use crate::support;

use std::collections::BTreeMap;

use support::{Daemon, reason};
use tonic::Code;
use vallum_proto::v1 as pb;
use vallum_proto::v1::counter_service_client::CounterServiceClient;

/// kube-proxy's shape: KUBE-SERVICES jumps to one chain per service. Counters as
/// `iptables-save -c` prints them.
const BASE: &str = "*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-DNS - [0:0]
:KUBE-SVC-API - [0:0]
[10:1000] -A INPUT -j KUBE-SERVICES
[7:700] -A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-SVC-DNS
[3:300] -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-API
[7:700] -A KUBE-SVC-DNS -s 10.244.1.5/32 -j ACCEPT
[3:300] -A KUBE-SVC-API -s 10.244.2.7/32 -j ACCEPT
COMMIT
";

/// What kube-proxy writes when the DNS service's endpoint moves: only that chain.
const UPDATE: &str = "*filter
:KUBE-SVC-DNS - [0:0]
-A KUBE-SVC-DNS -s 10.244.1.9/32 -j ACCEPT
COMMIT
";

fn source(content: &str, filename: &str, noflush: bool, counters: bool) -> pb::RulesetSource {
    pb::RulesetSource {
        source: Some(pb::ruleset_source::Source::Text(pb::RestoreText {
            content: content.to_string(),
            filename: filename.to_string(),
            noflush,
            counters,
            ..Default::default()
        })),
    }
}

/// `(chain, rule) -> (packets, bytes, text)` of ruleset `k`.
async fn counters(d: &Daemon) -> BTreeMap<(String, u32), (u64, u64, String)> {
    let mut c = CounterServiceClient::new(d.channel().await);
    c.get_counters(pb::GetCountersRequest {
        ruleset: "k".into(),
        ..Default::default()
    })
    .await
    .expect("counters")
    .into_inner()
    .counters
    .into_iter()
    .map(|c| ((c.chain, c.rule), (c.packets, c.bytes, c.text)))
    .collect()
}

async fn content(d: &Daemon, n: u64) -> String {
    d.rulesets()
        .await
        .get_revision(pb::GetRevisionRequest {
            name: format!("rulesets/k/revisions/{n}"),
        })
        .await
        .expect("revision")
        .into_inner()
        .content
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noflush_updates_merge_onto_the_active_revision() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;

    let first = rs
        .apply(pb::ApplyRequest {
            ruleset: "k".into(),
            source: Some(source(BASE, "base.rules", false, true)),
            ..Default::default()
        })
        .await
        .expect("base applies")
        .into_inner();
    let c = counters(&d).await;
    assert_eq!(c[&("KUBE-SVC-API".to_string(), 1)].0, 3, "{c:?}");
    assert_eq!(c[&("INPUT".to_string(), 1)].1, 1000, "{c:?}");

    // The partial update: the DNS chain is replaced, everything else stays and keeps counting.
    let second = rs
        .apply(pb::ApplyRequest {
            ruleset: "k".into(),
            source: Some(source(UPDATE, "update.rules", true, false)),
            ..Default::default()
        })
        .await
        .expect("noflush applies")
        .into_inner();
    let rev = second.revision.as_ref().expect("revision");
    assert_eq!(rev.number, 2);
    assert_eq!(rev.rule_count, 5);
    let merged = content(&d, 2).await;
    let base_printed = content(&d, 1).await;
    assert_eq!(
        merged,
        base_printed.replace("10.244.1.5/32", "10.244.1.9/32"),
        "the merged revision is complete"
    );
    let c = counters(&d).await;
    let at = |chain: &str, n: u32| c[&(chain.to_string(), n)].clone();
    assert_eq!(
        (at("KUBE-SVC-API", 1).0, at("KUBE-SVC-API", 1).1),
        (3, 300),
        "{c:?}"
    );
    assert_eq!((at("INPUT", 1).0, at("INPUT", 1).1), (10, 1000), "{c:?}");
    assert_eq!((at("KUBE-SERVICES", 1).0, at("KUBE-SERVICES", 2).0), (7, 3));
    let dns = at("KUBE-SVC-DNS", 1);
    assert_eq!((dns.0, dns.1), (0, 0), "the new endpoint rule starts at 0");
    assert!(dns.2.contains("10.244.1.9"), "{dns:?}");

    // Diffable like any other revision.
    let diff = rs
        .diff_revisions(pb::DiffRevisionsRequest {
            base: "rulesets/k/revisions/1".into(),
            target: "rulesets/k/revisions/2".into(),
        })
        .await
        .expect("diff")
        .into_inner();
    assert_eq!(diff.chains.len(), 1, "{diff:?}");
    assert_eq!(diff.chains[0].chain, "KUBE-SVC-DNS");
    assert_eq!(diff.chains[0].added, ["-s 10.244.1.9/32 -j ACCEPT"]);
    assert_eq!(diff.chains[0].removed, ["-s 10.244.1.5/32 -j ACCEPT"]);

    // A stale etag (the one before the update) is refused and changes nothing.
    let s = rs
        .apply(pb::ApplyRequest {
            ruleset: "k".into(),
            source: Some(source(UPDATE, "update.rules", true, false)),
            etag: first.etag.clone(),
            ..Default::default()
        })
        .await
        .expect_err("stale etag");
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert_eq!(reason(&s), "ETAG_MISMATCH");

    // A -D of a rule that is not there: refused at its line, nothing changes.
    let bad = "*filter\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-D KUBE-SVC-API -s 10.9.9.9/32 -j ACCEPT\nCOMMIT\n";
    for validate_only in [false, true] {
        let s = rs
            .apply(pb::ApplyRequest {
                ruleset: "k".into(),
                source: Some(source(bad, "bad.rules", true, false)),
                validate_only,
                ..Default::default()
            })
            .await
            .expect_err("missing rule");
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert_eq!(reason(&s), "INVALID_RULESET");
        assert!(
            s.message().contains("bad.rules:3:1: bad rule"),
            "{}",
            s.message()
        );
    }
    let v = rs
        .validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: "k".into(),
            source: Some(source(
                "*filter\n-D KUBE-SERVICES 2\n-F KUBE-SVC-API\n-X KUBE-SVC-API\nCOMMIT\n",
                "v.rules",
                true,
                false,
            )),
        })
        .await
        .expect("validates")
        .into_inner();
    assert!(v.valid, "{v:?}");
    assert_eq!(v.rule_count, 3);
    assert_eq!(content(&d, 2).await, merged);

    // Stage takes it too (on the active revision); then the first revision comes back.
    let staged = rs
        .stage_revision(pb::StageRevisionRequest {
            ruleset: "k".into(),
            source: Some(source(
                "*filter\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n",
                "s.rules",
                true,
                false,
            )),
            ..Default::default()
        })
        .await
        .expect("stages")
        .into_inner();
    assert_eq!(staged.rule_count, 6);
    rs.rollback(pb::RollbackRequest {
        name: "rulesets/k/revisions/1".into(),
        ..Default::default()
    })
    .await
    .expect("rolls back");
    let active = rs
        .get_ruleset(pb::GetRulesetRequest { name: "k".into() })
        .await
        .expect("ruleset")
        .into_inner();
    let n = active.active_revision;
    assert_eq!(content(&d, n).await, base_printed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parser_warnings_reach_validate_apply_and_vallumctl() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let text = "*filter\n:INPUT DROP [0:0]\n-A INPUT -j LOG --log-prefix \"[UFW BLOCK] a very long prefix \"\nCOMMIT\n";

    let v = rs
        .validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: "w".into(),
            source: Some(source(text, "w.rules", false, false)),
        })
        .await
        .expect("validates")
        .into_inner();
    assert!(v.valid, "{v:?}");
    assert_eq!(v.violations.len(), 1, "{v:?}");
    let w = &v.violations[0];
    assert_eq!(w.severity, pb::Severity::Warning as i32);
    assert_eq!(w.location, "w.rules:3:30");
    assert!(w.message.contains("--log-prefix is 31 bytes"), "{w:?}");

    let r = rs
        .apply(pb::ApplyRequest {
            ruleset: "w".into(),
            source: Some(source(text, "w.rules", false, false)),
            ..Default::default()
        })
        .await
        .expect("applies")
        .into_inner();
    let warnings = &r.revision.expect("revision").warnings;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].location, "w.rules:3:30");

    // vallumctl shows them, for validate and apply; `--noflush` applies a partial file.
    let file = dir.path().join("w.rules");
    std::fs::write(&file, text).unwrap();
    let url = d.url();
    let f = file.to_str().unwrap();
    let out = vallumctl(&url, &["validate", f]);
    assert_eq!(out.0, 0, "{out:?}");
    assert!(
        out.1
            .contains("w.rules:3:30: warning: --log-prefix is 31 bytes"),
        "{out:?}"
    );
    let out = vallumctl(&url, &["apply", "w", f]);
    assert_eq!(out.0, 0, "{out:?}");
    assert!(
        out.1.contains("w.rules:3:30: warning: --log-prefix"),
        "{out:?}"
    );
    let part = dir.path().join("part.rules");
    std::fs::write(
        &part,
        "*filter\n-I INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n",
    )
    .unwrap();
    let p = part.to_str().unwrap();
    let out = vallumctl(&url, &["apply", "w", p]);
    assert_eq!(out.0, 0, "without --noflush it replaces: {out:?}");
    let out = vallumctl(&url, &["apply", "w", f]);
    assert_eq!(out.0, 0, "{out:?}");
    let out = vallumctl(&url, &["apply", "--noflush", "w", p]);
    assert_eq!(out.0, 0, "{out:?}");
    assert!(out.1.contains("2 rules"), "{out:?}");
    let bad = dir.path().join("bad.rules");
    std::fs::write(&bad, "*filter\n-A NOPE -j ACCEPT\nCOMMIT\n").unwrap();
    let b = bad.to_str().unwrap();
    let out = vallumctl(&url, &["validate", "--noflush", "--ruleset", "w", b]);
    assert_eq!(out.0, 1, "{out:?}");
    assert!(
        out.2.contains("bad.rules:2:4: chain 'NOPE' does not exist"),
        "{out:?}"
    );
    let out = vallumctl(&url, &["stage", "--noflush", "w", p]);
    assert_eq!(out.0, 0, "{out:?}");
    assert!(out.1.contains("3 rules"), "{out:?}");
}

/// `(exit code, stdout, stderr)` of `vallumctl --server URL ARGS`.
fn vallumctl(server: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(support::vallumctl())
        .args(["--server", server, "--timeout", "10s"])
        .args(args)
        .env_clear()
        .output()
        .expect("run vallumctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
