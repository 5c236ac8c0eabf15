//! `-j NFLOG`: parsed with libxt_NFLOG's grammar, printed in its save order, validated (a
//! warning says that vallumd has no consumer for its events yet), and enforced as LOG is:
//! the rule counts, an event with its group and prefix is handed to the caller, and the next
//! rule runs.

use std::sync::Arc;

use vallum_engine::model::{Family, Hook};
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::{ParseOptions, ParseWarningKind, parse_ruleset, parse_ruleset_warned};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::{Severity, ViolationKind, validate};

use crate::support::one_rule;

#[test]
fn nflog_forms_print_as_iptables_save() {
    let f = Family::Ipv4;
    for (rule, want) in [
        ("-j NFLOG", "-j NFLOG"),
        ("-j NFLOG --nflog-group 0", "-j NFLOG"),
        (
            "-j NFLOG --nflog-group 65535",
            "-j NFLOG --nflog-group 65535",
        ),
        (
            "-j NFLOG --nflog-threshold 5 --nflog-group 2 --nflog-prefix \"drop in\"",
            "-j NFLOG --nflog-prefix \"drop in\" --nflog-group 2 --nflog-threshold 5",
        ),
        ("-j NFLOG --nflog-range 1", "-j NFLOG --nflog-range 1"),
        ("-j NFLOG --nflog-size 0", "-j NFLOG --nflog-size 0"),
    ] {
        assert_eq!(one_rule::printed(f, rule).as_deref(), Ok(want), "{rule}");
        assert_eq!(one_rule::printed(f, want).as_deref(), Ok(want), "{want}");
    }
    for bad in [
        "-j NFLOG --nflog-group 65536",
        "-j NFLOG --nflog-range 4294967296",
        "-j NFLOG --nflog-size -1",
        "-j NFLOG --nflog-threshold 65536",
        "-j NFLOG --nflog-group 1 --nflog-group 2",
    ] {
        let e = one_rule::printed(f, bad).expect_err(bad);
        assert!(e.starts_with("3:"), "{bad}: {e}");
    }
    // A prefix longer than the kernel's 63 bytes is cut, with a warning (iptables-legacy).
    let long = "x".repeat(65);
    let text =
        format!("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j NFLOG --nflog-prefix {long}\nCOMMIT\n");
    let w = parse_ruleset_warned("t", &text, &ParseOptions::default(), 1).expect("parses");
    assert_eq!(w.warnings.len(), 1);
    assert!(matches!(
        &w.warnings[0].kind,
        ParseWarningKind::NflogPrefixTruncated { len: 65, kept } if kept.len() == 63
    ));
}

#[test]
fn nflog_counts_reports_its_group_and_continues() {
    let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A INPUT -p udp -j NFLOG --nflog-group 5 --nflog-prefix blocked\n\
        -A INPUT -p udp -j DROP\nCOMMIT\n";
    let rs = Arc::new(parse_ruleset("t", text, &ParseOptions::default()).expect("parses"));
    let v = validate(&rs, None);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].severity, Severity::Warning);
    assert_eq!(v[0].kind, ViolationKind::NflogNoConsumer(5));
    assert_eq!(v[0].rule, Some(1));
    for classifier in [Classifier::Linear, Classifier::default()] {
        let snap = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, classifier)
            .expect("compiles");
        let mut p = PacketMeta {
            hook: Hook::Input,
            protocol: 17,
            len: 40,
            ..PacketMeta::default()
        };
        let mut logs = Vec::new();
        assert_eq!(
            crate::support::classify_one(&snap, 0, &mut p, 0, &mut logs),
            Verdict::Drop
        );
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].nflog_group, Some(5));
        assert_eq!(logs[0].prefix.as_deref(), Some("blocked"));
        assert_eq!(logs[0].rule, 1);
        let c = snap.counters();
        let hits: Vec<u64> = c
            .iter()
            .filter(|c| c.rule.is_some())
            .map(|c| c.packets)
            .collect();
        assert_eq!(hits, [1, 1]);
        assert_eq!(snap.trace(p, 0).logs[0].nflog_group, Some(5));
    }
}
