//! Validation says when a rule sits on a hook this node's packet path never evaluates
//! (`steering`): with `--source synthetic` (every packet at INPUT) the FORWARD chain, a user
//! chain only FORWARD jumps to and raw OUTPUT are HOOK_NOT_REACHED warnings at
//! FILE:LINE:COL naming their rules; the ruleset stays valid and applies. With `--source none`
//! (nothing classified here) no such warning. A `-m string` rule where the source keeps no
//! packet bytes (synthetic, pcap) is a NO_PACKET_BYTES warning. Under NFQUEUE (root), a rule
//! that can match only loopback packets is a HOOK_NOT_REACHED warning unless vallumd is told
//! `--steered-loopback`.

use crate::support;
use crate::support::netns;

use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const TEXT: &str = "*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -p udp -m udp --dport 53 -j CT --notrack
-A OUTPUT -p udp -m udp --sport 53 -j CT --notrack
COMMIT
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A DOCKER -d 172.17.0.2/32 -p tcp -m tcp --dport 80 -j ACCEPT
-A DOCKER -d 172.17.0.3/32 -p tcp -m tcp --dport 443 -j ACCEPT
COMMIT
";

/// The HOOK_NOT_REACHED violations of a Validate of TEXT, as `LOCATION PATH: MESSAGE`.
async fn unreached(d: &Daemon) -> Vec<String> {
    let r = d
        .rulesets()
        .await
        .validate_ruleset(pb::ValidateRulesetRequest {
            ruleset: "host".into(),
            source: Some(text_source(TEXT, false, "host.rules")),
        })
        .await
        .expect("validate")
        .into_inner();
    assert!(r.valid, "warnings only: {:?}", r.violations);
    r.violations
        .iter()
        .filter(|v| v.reason == "HOOK_NOT_REACHED")
        .map(|v| {
            assert_eq!(v.severity, pb::Severity::Warning as i32, "{v:?}");
            format!("{} {}: {}", v.location, v.path, v.message)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_on_hooks_the_source_never_delivers_are_warned() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--source", "synthetic", "--rate", "10"],
    );
    d.wait_serving().await;
    let why = "the packet source `synthetic` delivers every packet at INPUT";
    assert_eq!(
        unreached(&d).await,
        [
            format!(
                "host.rules:5:1 raw/OUTPUT#1: rules 1-1 of this chain (lines 5-5) are never \
                 evaluated on this node: the chain is reached only from OUTPUT, and {why}"
            ),
            format!(
                "host.rules:13:1 filter/FORWARD#1: rules 1-1 of this chain (lines 13-13) are \
                 never evaluated on this node: the chain is reached only from FORWARD, and {why}"
            ),
            format!(
                "host.rules:14:1 filter/DOCKER#1: rules 1-2 of this chain (lines 14-15) are \
                 never evaluated on this node: the chain is reached only from FORWARD, and {why}"
            ),
        ]
    );
    // A warning does not block the commit.
    let applied = d
        .rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: "host".into(),
            source: Some(text_source(TEXT, false, "host.rules")),
            ..Default::default()
        })
        .await
        .expect("apply")
        .into_inner();
    let revision = applied.revision.expect("revision");
    let warned = revision
        .warnings
        .iter()
        .filter(|v| v.reason == "HOOK_NOT_REACHED")
        .count();
    assert_eq!(warned, 3, "{:?}", revision.warnings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_packet_source_says_nothing_about_hooks() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    assert_eq!(unreached(&d).await, Vec::<String>::new());
}

/// `-m string` with a source that keeps no packet bytes: a NO_PACKET_BYTES warning at the
/// rule, the ruleset still valid; without a packet source, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_rules_without_packet_bytes_are_warned() {
    const STRING: &str = "*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp -m tcp --dport 80 -m string --string \"GET /wp-login.php\" --algo kmp -j DROP
COMMIT
";
    async fn warned(d: &Daemon) -> Vec<String> {
        let r = d
            .rulesets()
            .await
            .validate_ruleset(pb::ValidateRulesetRequest {
                ruleset: "web".into(),
                source: Some(text_source(STRING, false, "web.rules")),
            })
            .await
            .expect("validate")
            .into_inner();
        assert!(r.valid, "warnings only: {:?}", r.violations);
        r.violations
            .iter()
            .filter(|v| v.reason == "NO_PACKET_BYTES")
            .map(|v| {
                assert_eq!(v.severity, pb::Severity::Warning as i32, "{v:?}");
                format!("{} {}: {}", v.location, v.path, v.message)
            })
            .collect()
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("v.db"),
        &["--source", "synthetic", "--rate", "10"],
    );
    d.wait_serving().await;
    assert_eq!(
        warned(&d).await,
        [
            "web.rules:5:1 filter/INPUT#1: -m string searches the packet's bytes, which the \
          packet source `synthetic` does not keep: here --string never matches and ! --string \
          always does"
        ]
    );
    drop(d);
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    assert_eq!(warned(&d).await, Vec::<String>::new());
}

/// Under NFQUEUE with the installer's default steering (`lo` exempt), every rule that can
/// match only loopback packets (`-i lo`, `-o lo`, 127.0.0.0/8, `::1`) is a HOOK_NOT_REACHED
/// warning at its FILE:LINE:COL, as in a Tails-like ruleset whose Tor isolation rules are all
/// on `lo`; a rule that also matches other packets is not. With `--steered-loopback` none.
#[test]
#[ignore = "needs root, nfnetlink_queue and a network namespace"]
fn loopback_rules_are_warned_where_lo_is_not_steered() {
    const TAILS: &str = "*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT DROP [0:0]
-A INPUT -m state --state RELATED,ESTABLISHED -j ACCEPT
-A INPUT -i lo -p tcp -m tcp --dport 9050 -j ACCEPT
-A INPUT ! -i lo -p tcp -m tcp --dport 22 -j ACCEPT
-A OUTPUT -d 127.0.0.1/32 -o lo -p tcp -m tcp --dport 9050 -m owner --uid-owner 108 -j ACCEPT
-A OUTPUT -d 127.0.0.1/32 -p udp -m udp --dport 5353 -j ACCEPT
-A OUTPUT -s 10.0.0.0/8 -j ACCEPT
COMMIT
";
    const TAILS6: &str = "*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT DROP [0:0]
-A OUTPUT -d ::1/128 -p tcp -m tcp --dport 9050 -j ACCEPT
-A OUTPUT -o lo+ -j ACCEPT
COMMIT
";
    fn warned(flags: &'static [&'static str]) -> Vec<String> {
        let ns = format!("vallum-lo-{}", std::process::id());
        let st = std::process::Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .expect("ip netns add");
        assert!(st.success(), "ip netns add {ns}");
        let st = std::process::Command::new("ip")
            .args(["-n", &ns, "link", "set", "lo", "up"])
            .status()
            .expect("ip link set lo up");
        assert!(st.success(), "lo up in {ns}");
        let _ = std::process::Command::new("modprobe")
            .arg("nfnetlink_queue")
            .status();
        let got = netns::in_netns(&ns, move || {
            let dir = tempfile::tempdir().unwrap();
            let mut args = vec!["--source", "nfqueue"];
            args.extend_from_slice(flags);
            let d = Daemon::start(&dir.path().join("v.db"), &args);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(async {
                    d.wait_serving().await;
                    let mut src = text_source(TAILS, false, "tails.rules");
                    if let Some(pb::ruleset_source::Source::Text(t)) = &mut src.source {
                        t.content_v6 = TAILS6.into();
                    }
                    let r = d
                        .rulesets()
                        .await
                        .validate_ruleset(pb::ValidateRulesetRequest {
                            ruleset: "tails".into(),
                            source: Some(src),
                        })
                        .await
                        .expect("validate")
                        .into_inner();
                    assert!(r.valid, "warnings only: {:?}", r.violations);
                    r.violations
                        .iter()
                        .filter(|v| v.reason == "HOOK_NOT_REACHED")
                        .map(|v| {
                            assert_eq!(v.severity, pb::Severity::Warning as i32, "{v:?}");
                            let first = v.message.split(": the rule").next().unwrap_or("");
                            format!("{} {}: {first}", v.location, v.path)
                        })
                        .collect::<Vec<_>>()
                })
        });
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .status();
        got
    }
    let got = warned(&[]);
    assert_eq!(
        got,
        [
            "tails.rules (v6):5:1 filter6/OUTPUT#1: -d ::1",
            "tails.rules:6:1 filter/INPUT#2: -i lo",
            "tails.rules:8:1 filter/OUTPUT#1: -o lo",
            "tails.rules:9:1 filter/OUTPUT#2: -d 127.0.0.1",
        ],
        "{got:#?}"
    );
    assert_eq!(warned(&["--steered-loopback"]), Vec::<String>::new());
}
