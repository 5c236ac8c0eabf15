//! `-m physdev`: the bridge ports of a bridged packet, printed as iptables-save prints them
//! (physdev_save's order), refused where the kernel refuses them (physdev_mt_check: the output
//! port at OUTPUT without `--physdev-is-bridged`), and decided as physdev_mt from
//! [`PacketMeta::phys_in`] / [`PacketMeta::phys_out`] (NFQUEUE's NFQA_IFINDEX_PHYSINDEV /
//! PHYSOUTDEV) by the linear and the indexed classifier, one packet at a time and in a batch.

use std::sync::Arc;

use vallum_engine::conntrack::NoTracking;
use vallum_engine::model::{Family, Hook};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::validate;

use crate::support::one_rule;

#[test]
fn physdev_forms_and_refusals() {
    for f in [Family::Ipv4, Family::Ipv6] {
        for (rule, want) in [
            ("-m physdev --physdev-in lo", "-m physdev --physdev-in lo"),
            (
                "-m physdev --physdev-in lo --physdev-is-in",
                "-m physdev --physdev-is-in --physdev-in lo",
            ),
            (
                "-m physdev --physdev-is-bridged --physdev-out tap3f2a1b4c-5",
                "-m physdev --physdev-out tap3f2a1b4c-5 --physdev-is-bridged",
            ),
            (
                "-m physdev ! --physdev-is-bridged ! --physdev-out eth0 ! --physdev-is-out ! --physdev-in tap+ ! --physdev-is-in",
                "-m physdev ! --physdev-is-in ! --physdev-in tap+ ! --physdev-is-out ! --physdev-out eth0 ! --physdev-is-bridged",
            ),
        ] {
            assert_eq!(one_rule::printed(f, rule).as_deref(), Ok(want), "{rule}");
            assert_eq!(one_rule::printed(f, want).as_deref(), Ok(want), "{want}");
        }
        for bad in [
            "-m physdev",
            "-m physdev --physdev-in lo --physdev-in eth0",
            "-m physdev --physdev-is-bridged --physdev-is-bridged",
            "-m physdev --physdev-in",
            "-m physdev --physdev-in a23456789012345x",
            "-m physdev --physdev-is-in x",
            "-m physdev --physdev-mode x",
        ] {
            let e = one_rule::printed(f, bad).expect_err(bad);
            assert!(e.starts_with("3:"), "{bad}: {e}");
        }
    }
    // physdev_mt_check: the output port at OUTPUT only for bridged traffic (EINVAL from
    // iptables-legacy 1.8.9 on Linux 6.18 for the first; the others load).
    let check = |rule: &str| {
        let text = format!(
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{rule}\nCOMMIT\n"
        );
        let rs = parse_ruleset("t", &text, &ParseOptions::default()).expect("parses");
        validate(&rs, None)
    };
    let v = check("-A OUTPUT -m physdev ! --physdev-is-bridged --physdev-out lo");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].to_string().contains("--physdev-is-bridged"),
        "{}",
        v[0]
    );
    assert!(check("-A OUTPUT -m physdev --physdev-is-out").len() == 1);
    for ok in [
        "-A OUTPUT -m physdev --physdev-out lo --physdev-is-bridged",
        "-A OUTPUT -m physdev --physdev-in lo",
        "-A FORWARD -m physdev --physdev-out lo",
        "-A INPUT -m physdev --physdev-is-out",
    ] {
        assert!(check(ok).is_empty(), "{ok}: {:?}", check(ok));
    }
}

fn name(s: &str) -> IfName {
    IfName::new(s).expect("short name")
}

#[test]
fn physdev_decides_by_the_bridge_ports() {
    // Rule n ACCEPTs with mark n so that the case can tell which rule decided; the policy
    // drops.
    let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A FORWARD -m physdev --physdev-in tap1 --physdev-out tap2 --physdev-is-bridged -j ACCEPT\n\
        -A FORWARD -m physdev ! --physdev-is-bridged -j DROP\n\
        -A FORWARD -m physdev --physdev-in tap+ ! --physdev-out tap9 -j ACCEPT\n\
        -A FORWARD -m physdev ! --physdev-in eth+ --physdev-is-out -j REJECT\n\
        COMMIT\n";
    let rs = Arc::new(parse_ruleset("t", text, &ParseOptions::default()).expect("parses"));
    assert!(validate(&rs, None).is_empty(), "{:?}", validate(&rs, None));
    let reject = Verdict::Reject(vallum_engine::model::RejectWith::PortUnreachable);
    let cases = [
        // Not bridged: rule 2's negation holds (every given option negated).
        ("", "", Verdict::Drop),
        // Bridged tap1 -> tap2: rule 1.
        ("tap1", "tap2", Verdict::Accept),
        // Bridged tap1 -> tap9: rule 3's `! --physdev-out tap9` fails; rule 4's
        // `! --physdev-in eth+` holds and it has an output port.
        ("tap1", "tap9", reject),
        // Bridged eth0 -> tap2: not tap+ (rule 3), eth+ (rule 4): the policy.
        ("eth0", "tap2", Verdict::Drop),
        // An input port only (delivered to the host): not bridged to rule 2 (no output
        // port), `--physdev-out` skipped without an output port in rule 3.
        ("tap1", "", Verdict::Drop),
        ("tap7", "tap8", Verdict::Accept),
    ];
    let mk = |i: &str, o: &str| Packet {
        meta: PacketMeta {
            hook: Hook::Forward,
            protocol: 17,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: name("br0"),
            out_iface: name("br0"),
            phys_in: name(i),
            phys_out: name(o),
            ..PacketFacts::default()
        },
    };
    for classifier in [Classifier::Linear, Classifier::default()] {
        let snap = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, classifier)
            .expect("compiles");
        let (mut batch, mut facts): (Vec<PacketMeta>, Vec<PacketFacts>) = (Vec::new(), Vec::new());
        for &(i, o, want) in &cases {
            let p = mk(i, o);
            assert_eq!(snap.trace(&p, 0).verdict, want, "trace {i} -> {o}");
            let mut q = p;
            assert_eq!(
                crate::support::classify_one(&snap, 0, &mut q, 0, &mut Vec::new()),
                want,
                "{i} -> {o}"
            );
            batch.push(p.meta);
            facts.push(p.facts);
        }
        let mut verdicts = vec![Verdict::Accept; batch.len()];
        snap.classify_batch(
            0,
            &mut batch,
            &mut facts,
            &mut verdicts,
            0,
            &mut Vec::new(),
            &[],
            &mut NoTracking,
        );
        let want: Vec<Verdict> = cases.iter().map(|c| c.2).collect();
        assert_eq!(verdicts, want, "batch");
    }
}
