//! Extensions real rulesets use that the engine does not enforce yet (connlimit, CT
//! timeouts, hashlimit byte rates): they import and print as
//! iptables-save prints them (connlimit canonically), and in filter or raw validation refuses
//! them with an error that names the extension and says why (the reason the support table
//! prints).

use vallum_engine::model::Family;
use vallum_engine::restore::{parse_ruleset, support_markdown};
use vallum_engine::sets::NoSets;
use vallum_engine::validate::{Severity, validate};

#[path = "support/one_rule.rs"]
mod one_rule;
use one_rule::{opts, printed};

#[test]
fn connlimit_prints_as_iptables_save() {
    for (rule, want) in [
        (
            "-m connlimit --connlimit-above 10",
            "-m connlimit --connlimit-above 10 --connlimit-mask 32 --connlimit-saddr",
        ),
        (
            "-m connlimit ! --connlimit-above 2 --connlimit-daddr --connlimit-mask 24",
            "-m connlimit --connlimit-upto 2 --connlimit-mask 24 --connlimit-daddr",
        ),
    ] {
        assert_eq!(printed(Family::Ipv4, rule).as_deref(), Ok(want), "{rule}");
    }
    assert_eq!(
        printed(Family::Ipv6, "-m connlimit --connlimit-upto 1").as_deref(),
        Ok("-m connlimit --connlimit-upto 1 --connlimit-mask 128 --connlimit-saddr")
    );
    for (rule, says) in [
        ("-m connlimit --connlimit-upto -1", "unknown option '-1'"),
        ("-m connlimit --connlimit-upto x", "bad value"),
        (
            "-m connlimit --connlimit-upto 1 --conlimit-above 1",
            "no option",
        ),
        (
            "-m connlimit --connlimit-above 10 --connlimit-saddr --connlimit-daddr",
            "cannot be used together",
        ),
        (
            "-m connlimit --connlimit-mask 24",
            "--connlimit-above or --connlimit-upto",
        ),
        (
            "-m connlimit --connlimit-above 1 --connlimit-mask 33",
            "bad value",
        ),
    ] {
        match printed(Family::Ipv4, rule) {
            Ok(p) => panic!("{rule}: accepted as {p}"),
            Err(e) => assert!(e.contains(says), "{rule}: {e}"),
        }
    }
}

fn errors(table: &str, chain: &str, rule: &str) -> Vec<String> {
    let text = format!("*{table}\n:{chain} ACCEPT [0:0]\n-A {chain} {rule}\nCOMMIT\n");
    let rs = parse_ruleset("t", &text, &opts(Family::Ipv4)).expect("parses");
    validate(&rs, Some(&NoSets))
        .into_iter()
        .filter(|v| v.severity == Severity::Error)
        .map(|v| v.to_string())
        .collect()
}

#[test]
fn refused_where_enforced_saying_why() {
    for (table, chain, rule, says) in [
        (
            "filter",
            "INPUT",
            "-p tcp --syn -m connlimit --connlimit-above 10 -j REJECT",
            "connlimit (counts a source's connections",
        ),
        (
            "raw",
            "PREROUTING",
            "-p udp --dport 69 -j CT --timeout udp-long",
            "CT --timeout (the engine's tracker has no timeout policies",
        ),
        (
            "filter",
            "INPUT",
            "-m hashlimit --hashlimit-upto 10mb/s --hashlimit-name b -j ACCEPT",
            "hashlimit (byte rates",
        ),
    ] {
        let e = errors(table, chain, rule);
        assert!(e.iter().any(|e| e.contains(says)), "{rule}: {e:?}");
    }
    // Stored in the tables the engine does not enforce.
    assert!(errors("mangle", "PREROUTING", "-m rpfilter -j DROP").is_empty());
    let md = support_markdown();
    for name in ["connlimit"] {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .expect("row");
        assert!(row.contains("stored only") && row.len() > 40, "{row}");
    }
}
