//! Extensions real rulesets use that the engine does not enforce yet (CT timeouts, hashlimit
//! byte rates): they import and print as iptables-save prints them, and in filter or raw
//! validation refuses them with an error that names the extension and says why (the reason
//! the support table prints).

use vallum_engine::model::Family;
use vallum_engine::restore::{parse_ruleset, support_markdown};
use vallum_engine::sets::NoSets;
use vallum_engine::validate::{Severity, validate};

// Shared with the other extension tests, which use the parts this one does not.
#[allow(dead_code)]
use crate::support::one_rule;
use one_rule::opts;

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
    let row = md
        .lines()
        .find(|l| l.starts_with("| `hashlimit` |"))
        .expect("row");
    assert!(row.contains("byte rates") && row.len() > 40, "{row}");
}
