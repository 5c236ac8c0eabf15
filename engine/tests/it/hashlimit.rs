//! `-m hashlimit` with packet rates: libxt_hashlimit's revision-3 grammar and save form
//! (iptables 1.8.9 and its `.t` vectors), the refusals, and enforcement as xt_hashlimit's
//! `hashlimit_mt_common` in the linear walk and the compiled index alike: a bucket per key
//! of the mode's fields, masks, expiry, the table's configuration kept from the rule that
//! made it (across commits too, until no rule holds it); byte rates refused in filter/raw.

use std::sync::Arc;

use vallum_engine::conntrack::NoTracking;
use vallum_engine::model::{Family, Hook, Ruleset};
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::parse_ruleset;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::{Severity, validate};

use crate::support::one_rule;
use one_rule::{opts, printed};

const MS: u64 = 1_000_000;

const SAVE_FORMS: &[(Family, &str, &str)] = &[
    (
        Family::Ipv4,
        "-m hashlimit --hashlimit-upto 1/sec --hashlimit-name mini1",
        "-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 5 --hashlimit-name mini1",
    ),
    (
        Family::Ipv4,
        "-m hashlimit --hashlimit 120/minute --hashlimit-name a",
        "-m hashlimit --hashlimit-upto 2/sec --hashlimit-burst 5 --hashlimit-name a --hashlimit-htable-expire 60000",
    ),
    (
        Family::Ipv4,
        "-m hashlimit ! --hashlimit-upto 3/h --hashlimit-name a --hashlimit-mode dstport,srcip|dstip --hashlimit-srcmask 24 --hashlimit-dstmask 32",
        "-m hashlimit --hashlimit-above 3/hour --hashlimit-burst 5 --hashlimit-mode srcip,dstip,dstport --hashlimit-name a --hashlimit-srcmask 24",
    ),
    (
        Family::Ipv4,
        "-m hashlimit --hashlimit-name a --hashlimit-htable-expire 1000 --hashlimit-upto 1/s --hashlimit-htable-gcinterval 1000 --hashlimit-htable-size 64",
        "-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 5 --hashlimit-name a --hashlimit-htable-size 64",
    ),
    (
        Family::Ipv6,
        "-m hashlimit --hashlimit-above 10/sec --hashlimit-burst 20 --hashlimit-mode srcip --hashlimit-srcmask 64 --hashlimit-name v6",
        "-m hashlimit --hashlimit-above 10/sec --hashlimit-burst 20 --hashlimit-mode srcip --hashlimit-name v6 --hashlimit-srcmask 64",
    ),
    // Byte rates stay opaque, printed as written.
    (
        Family::Ipv4,
        "-m hashlimit --hashlimit-upto 4kb/s --hashlimit-burst 400kb --hashlimit-name mini5",
        "-m hashlimit --hashlimit-upto 4kb/s --hashlimit-burst 400kb --hashlimit-name mini5",
    ),
];

#[test]
fn prints_as_iptables_save() {
    for (family, rule, want) in SAVE_FORMS {
        let got = printed(*family, rule).unwrap_or_else(|e| panic!("{rule}: {e}"));
        assert_eq!(&got, want, "{rule}");
        assert_eq!(&printed(*family, want).expect("re-parse"), want);
    }
}

#[test]
fn refused_as_iptables_and_the_kernel_refuse() {
    for (rule, says) in [
        (
            "-m hashlimit --hashlimit-name a",
            "--hashlimit-upto or --hashlimit-above",
        ),
        ("-m hashlimit --hashlimit-upto 1/sec", "--hashlimit-name"),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-above 1/sec --hashlimit-name a",
            "exclude",
        ),
        (
            "-m hashlimit --hashlimit-upto 0/sec --hashlimit-name a",
            "bad value",
        ),
        (
            "-m hashlimit --hashlimit-upto 2000000/sec --hashlimit-name a",
            "bad value",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/week --hashlimit-name a",
            "bad value",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 0 --hashlimit-name a",
            "1-1000000",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 1000001 --hashlimit-name a",
            "1-1000000",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/day --hashlimit-burst 1000000 --hashlimit-name a",
            "overflow",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-mode bogus --hashlimit-name a",
            "bad value",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-srcmask 33 --hashlimit-name a",
            "bad value",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-htable-expire 0 --hashlimit-name a",
            "must not be 0",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-name a/b",
            "/proc",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec ! --hashlimit-name a",
            "cannot be inverted",
        ),
        (
            "-m hashlimit --hashlimit-upto 1/sec --hashlimit-name a --hashlimit-name b",
            "--hashlimit-name",
        ),
    ] {
        match printed(Family::Ipv4, rule) {
            Ok(p) => panic!("{rule}: accepted as {p}"),
            Err(e) => assert!(e.contains(says), "{rule}: {e}"),
        }
    }
    let long = format!(
        "-m hashlimit --hashlimit-upto 1/sec --hashlimit-name {}",
        "n".repeat(32)
    );
    assert!(printed(Family::Ipv4, &long).is_err());
}

fn ruleset(family: Family, rules: &[&str]) -> Arc<Ruleset> {
    let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for r in rules {
        text.push_str("-A INPUT ");
        text.push_str(r);
        text.push('\n');
    }
    text.push_str("COMMIT\n");
    let rs = parse_ruleset("t", &text, &opts(family)).expect("parses");
    let errs: Vec<_> = validate(&rs, Some(&NoSets))
        .into_iter()
        .filter(|v| v.severity == Severity::Error)
        .map(|v| v.to_string())
        .collect();
    assert!(errs.is_empty(), "{errs:?}");
    Arc::new(rs)
}

#[test]
fn byte_rates_are_refused_where_enforced() {
    let text = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m hashlimit --hashlimit-upto 4kb/s --hashlimit-name b -j ACCEPT\nCOMMIT\n";
    let rs = parse_ruleset("t", text, &opts(Family::Ipv4)).expect("parses");
    let errs: Vec<String> = validate(&rs, Some(&NoSets))
        .into_iter()
        .filter(|v| v.severity == Severity::Error)
        .map(|v| v.to_string())
        .collect();
    assert!(
        errs.iter().any(|e| e.contains("hashlimit (byte rates")),
        "{errs:?}"
    );
}

fn pkt(src: &str, dport: u16) -> PacketMeta {
    PacketMeta {
        family: Family::Ipv4,
        hook: Hook::Input,
        src: src.parse().expect("address"),
        dst: "203.0.113.1".parse().expect("address"),
        protocol: 6,
        sport: 40000,
        dport,
        len: 60,
        ..PacketMeta::default()
    }
}

struct Both(Vec<Snapshot>);

impl Both {
    fn new(rs: &[Arc<Ruleset>]) -> Both {
        let index = Classifier::TupleMerge {
            min_rules: 1,
            batch_min_bytes: 0,
            rfc_min_rules: 1,
            rfc_max_rules: 1000,
        };
        Both(
            [Classifier::Linear, index, index]
                .into_iter()
                .map(|c| Snapshot::compile_with(rs, &NoSets, 1, c).expect("compiles"))
                .collect(),
        )
    }

    fn send(&self, p: &PacketMeta, now: u64) -> Verdict {
        // The linear walk, the index packet by packet, and the index through a batch (the
        // probe path the engine's workers take), each with its own tables.
        let mut v: Vec<Verdict> = self.0[..2]
            .iter()
            .map(|s| crate::support::classify_one(s, 0, &mut p.clone(), now, &mut Vec::new()))
            .collect();
        let mut batch = [Verdict::Accept];
        self.0[2].classify_batch(
            0,
            &mut [*p],
            &mut [],
            &mut batch,
            now,
            &mut Vec::new(),
            &[],
            &mut NoTracking,
        );
        v.push(batch[0]);
        assert_eq!(v[0], v[1], "linear and index agree on {p:?} at {now}");
        assert_eq!(v[0], v[2], "linear and batch agree on {p:?} at {now}");
        v[0]
    }

    fn commit(&mut self, rs: &[Arc<Ruleset>]) {
        for s in &mut self.0 {
            *s = Snapshot::compile_after(s, rs, &NoSets, 1).expect("compiles");
        }
    }
}

const SSH: &str = "-p tcp --dport 22 -m hashlimit --hashlimit-above 1/sec --hashlimit-burst 3 --hashlimit-mode srcip --hashlimit-srcmask 24 --hashlimit-name ssh -j DROP";

#[test]
fn a_bucket_per_source_network() {
    let both = Both::new(&[ruleset(Family::Ipv4, &["-s 192.0.2.1 -j ACCEPT", SSH])]);
    let a = pkt("198.51.100.7", 22);
    let same_net = pkt("198.51.100.200", 22);
    let other = pkt("198.51.101.7", 22);
    let got: Vec<Verdict> = (0..5).map(|i| both.send(&a, i * MS)).collect();
    assert_eq!(
        got,
        [
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Drop,
            Verdict::Drop
        ]
    );
    assert_eq!(
        both.send(&same_net, 5 * MS),
        Verdict::Drop,
        "same /24 bucket"
    );
    assert_eq!(both.send(&other, 5 * MS), Verdict::Accept, "another /24");
    assert_eq!(both.send(&pkt("198.51.100.7", 80), 5 * MS), Verdict::Accept);
    // One token a second; the entry is refreshed by every packet (so it does not expire).
    assert_eq!(both.send(&a, 999 * MS), Verdict::Drop);
    assert_eq!(both.send(&a, 1000 * MS + 1), Verdict::Accept);
    assert_eq!(both.send(&a, 1001 * MS), Verdict::Drop);
    // Idle past the expiry (the unit, 1000 ms): a new, full bucket.
    let later = 1001 * MS + 1001 * MS;
    let got: Vec<Verdict> = (0..4).map(|i| both.send(&a, later + i)).collect();
    assert_eq!(
        got,
        [
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Drop
        ]
    );
    // A trace takes no token.
    assert_eq!(both.0[0].trace(&other, 6 * MS).verdict, Verdict::Accept);
    let t = both.0[1].trace(&a, later + 10);
    assert_eq!(t.verdict, Verdict::Drop);
    assert!(t.limits_asked >= 1);
}

#[test]
fn a_table_keeps_the_configuration_of_the_rule_that_made_it() {
    let mut both = Both::new(&[ruleset(Family::Ipv4, &[SSH])]);
    let a = pkt("198.51.100.7", 22);
    for i in 0..3 {
        assert_eq!(both.send(&a, i), Verdict::Accept);
    }
    // Same name, a larger burst: the table (and its entries) keep the old configuration.
    let bigger = SSH.replace("--hashlimit-burst 3", "--hashlimit-burst 10");
    both.commit(&[ruleset(Family::Ipv4, &[&bigger])]);
    assert_eq!(
        both.send(&a, 3),
        Verdict::Drop,
        "the old bucket, its burst 3"
    );
    // Without a rule holding it the table goes; made again, it takes the new burst.
    both.commit(&[ruleset(Family::Ipv4, &["-p udp -j ACCEPT"])]);
    both.commit(&[ruleset(Family::Ipv4, &[&bigger])]);
    let got = (0..11)
        .filter(|&i| both.send(&a, 10 + i) == Verdict::Accept)
        .count();
    assert_eq!(got, 10);
    // Upto and above on one table: each rule its own direction.
    let both = Both::new(&[ruleset(
        Family::Ipv4,
        &[
            "-p tcp --dport 1 -m hashlimit --hashlimit-upto 1/min --hashlimit-burst 1 --hashlimit-name x -j ACCEPT",
            "-p tcp --dport 2 -m hashlimit --hashlimit-above 1/min --hashlimit-burst 1 --hashlimit-name x -j DROP",
            "-p tcp -j REJECT",
        ],
    )]);
    assert_eq!(both.send(&pkt("10.0.0.1", 1), 0), Verdict::Accept);
    assert_eq!(
        both.send(&pkt("10.0.0.2", 2), 1),
        Verdict::Drop,
        "one bucket, empty"
    );
}
