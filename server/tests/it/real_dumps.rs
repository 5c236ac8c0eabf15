//! What real dumps need from vallumd, through a real `vallumd` with `--source synthetic`:
//! - a filter rule that waits for what the ruleset's stored-only nat or mangle table does
//!   (firewalld's forward-port `--ctstate DNAT`, Docker's DOCKER-USER `--ctorigdst`, a
//!   mangle MARK read by `-m mark`) is a WAITS_FOR_TABLE warning at its FILE:LINE:COL in
//!   Validate and Apply, naming the table and `--kernel-tables`; the ruleset applies;
//! - a CRLF line (which iptables-restore refuses) is a warning at its line;
//! - `-m owner --uid-owner root` is looked up on the host and exported as the number, as
//!   iptables-save prints it; an unknown name is an error at the rule.

use crate::support;

use support::{Daemon, reason, text_source};
use vallum_proto::v1 as pb;

const TEXT: &str = "*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.0.2:80
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -s 10.1.0.0/16 -j MARK --set-xmark 0x64/0xffffffff
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -m conntrack --ctstate DNAT -j ACCEPT
-A FORWARD -m conntrack --ctorigdst 192.0.2.1/32 --ctorigdstport 8080 -j ACCEPT
-A FORWARD -m mark --mark 0x64/0x65 -j ACCEPT\r
-A OUTPUT -m owner --uid-owner root -j ACCEPT
COMMIT
";

/// The warnings of a Validate of `text`, as `REASON LOCATION: MESSAGE`.
async fn warnings(d: &Daemon, text: &str) -> Vec<String> {
    let r = d
        .rulesets()
        .await
        .validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: "fw".into(),
            source: Some(text_source(text, false, "fw.rules")),
        })
        .await
        .expect("validate")
        .into_inner();
    assert!(r.valid, "warnings only: {:?}", r.violations);
    r.violations
        .iter()
        .filter(|v| v.reason != "HOOK_NOT_REACHED")
        .map(|v| {
            assert_eq!(v.severity, pb::Severity::Warning as i32, "{v:?}");
            format!("{} {}: {}", v.reason, v.location, v.message)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependent_rules_quirks_and_owner_names() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--source", "synthetic", "--rate", "10"],
    );
    d.wait_serving().await;
    let got = warnings(&d, TEXT).await;
    let waits = |line: u32, what: &str, table: &str, target: &str, at: u32| {
        format!(
            "WAITS_FOR_TABLE fw.rules:{line}:1: {what} waits for what table {table} does \
             ({target} at line {at}); {table} is stored only here and not handed to the kernel, \
             so this rule never sees it: run vallumd with --kernel-tables {table} (e.g. \
             --kernel-tables nat,mangle) and the kernel's facts reach the rule with the packet"
        )
    };
    let crlf = "INVALID_RULESET fw.rules:22:46: iptables-restore refuses this line (a carriage \
                return at its end (CRLF line ends), which it reads as part of the last word); \
                accepted here as if it were not there, and exported in iptables-save's form \
                near '\\r'";
    let mut want = vec![
        waits(20, "--ctstate DNAT", "nat", "DNAT", 6),
        waits(21, "--ctorigdst, --ctorigdstport", "nat", "DNAT", 6),
        waits(22, "-m mark", "mangle", "MARK", 14),
        crlf.to_string(),
        "INVALID_RULESET fw.rules:1:1: table nat is stored but not enforced by the engine".into(),
        "INVALID_RULESET fw.rules:8:1: table mangle is stored but not enforced by the engine"
            .into(),
    ];
    want.sort();
    let mut got_sorted = got.clone();
    got_sorted.sort();
    assert_eq!(got_sorted, want, "{got:#?}");

    // Apply: the same warnings do not stop it; the owner name is exported as its number.
    let mut rs = d.rulesets().await;
    let r = rs
        .apply(pb::ApplyRequest {
            ruleset: "fw".into(),
            source: Some(text_source(TEXT, false, "fw.rules")),
            ..Default::default()
        })
        .await
        .expect("apply")
        .into_inner();
    let revision = r.revision.expect("a revision").name;
    let export = rs
        .export_revision(pb::ExportRevisionRequest {
            name: revision,
            ..Default::default()
        })
        .await
        .expect("export")
        .into_inner()
        .content;
    assert!(
        export.contains("-A OUTPUT -m owner --uid-owner 0 -j ACCEPT\n"),
        "{export}"
    );
    assert!(!export.contains('\r'), "{export:?}");

    // A name this host does not have is an error at the rule.
    let e = rs
        .apply(pb::ApplyRequest {
            ruleset: "fw".into(),
            source: Some(text_source(
                &TEXT.replace("--uid-owner root", "--uid-owner no-such-user-h34a"),
                false,
                "fw.rules",
            )),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "INVALID_RULESET", "{e:?}");
    assert!(e.message().contains("does not exist on this host"), "{e:?}");
}
