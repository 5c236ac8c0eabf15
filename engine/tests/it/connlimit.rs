//! `-m connlimit` in the rule model: printed as iptables-save 1.8.9 prints it (checked with
//! `iptables-legacy-save` in a namespace: `! --connlimit-above` becomes `--connlimit-upto`, the
//! mask and `--connlimit-saddr` are always printed), refused where iptables refuses it, and
//! accepted by validation in filter and raw (enforced: `tests/it/kernel_connlimit.rs`).

use vallum_engine::model::Family;
use vallum_engine::restore::parse_ruleset;
use vallum_engine::sets::NoSets;
use vallum_engine::validate::validate;

use crate::support::one_rule;
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

#[test]
fn validation_accepts_it_where_the_engine_enforces() {
    for (table, chain) in [("filter", "INPUT"), ("raw", "PREROUTING")] {
        let text = format!(
            "*{table}\n:{chain} ACCEPT [0:0]\n-A {chain} -p tcp -m tcp --syn -m connlimit --connlimit-above 3 --connlimit-mask 24 --connlimit-saddr -j DROP\nCOMMIT\n"
        );
        let rs = parse_ruleset("t", &text, &opts(Family::Ipv4)).expect("parses");
        let v = validate(&rs, Some(&NoSets));
        assert!(v.is_empty(), "{table}: {v:?}");
    }
}
