//! `-m recent`: libxt_recent's revision-1 grammar and save form (iptables 1.8.9, the `.t`
//! vectors and what ufw writes for `ufw limit`), the kernel's refusals, and enforcement as
//! xt_recent's `recent_mt` in the linear walk and the compiled index alike: hit counts within
//! `--seconds`, masks, `--rdest`, `--rttl`, `--remove`, `--reap`, the 100-entry list; the list
//! kept across commits and dropped with its ruleset; a trace that changes nothing.

use std::net::IpAddr;
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

const SEC: u64 = 1_000_000_000;

/// (family, as written, as iptables-save prints it: the `.t` files' forms and ufw's).
const SAVE_FORMS: &[(Family, &str, &str)] = &[
    (
        Family::Ipv4,
        "-m recent --set",
        "-m recent --set --name DEFAULT --mask 255.255.255.255 --rsource",
    ),
    (
        Family::Ipv4,
        "-m recent --update --rttl",
        "-m recent --update --rttl --name DEFAULT --mask 255.255.255.255 --rsource",
    ),
    (
        Family::Ipv4,
        "-m recent --rsource --name foo --hitcount 8 --rcheck",
        "-m recent --rcheck --hitcount 8 --name foo --mask 255.255.255.255 --rsource",
    ),
    (
        Family::Ipv4,
        "-m recent --update --seconds 30 --hitcount 6 --name DEFAULT --mask 255.255.255.255 --rsource",
        "-m recent --update --seconds 30 --hitcount 6 --name DEFAULT --mask 255.255.255.255 --rsource",
    ),
    (
        Family::Ipv4,
        "-m recent --name ssh --rdest --mask 255.255.255.0 ! --rcheck --seconds 60 --reap",
        "-m recent ! --rcheck --seconds 60 --reap --name ssh --mask 255.255.255.0 --rdest",
    ),
    (
        Family::Ipv4,
        "-m recent --remove --name x",
        "-m recent --remove --name x --mask 255.255.255.255 --rsource",
    ),
    (
        Family::Ipv6,
        "-m recent --set",
        "-m recent --set --name DEFAULT --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource",
    ),
    (
        Family::Ipv6,
        "-m recent --rcheck --hitcount 255 --name foo --mask ffff:ffff:ffff:ffff:: --rsource",
        "-m recent --rcheck --hitcount 255 --name foo --mask ffff:ffff:ffff:ffff:: --rsource",
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
        ("-m recent", "one of --set, --rcheck, --update or --remove"),
        ("-m recent --set --rcheck", "only one of"),
        ("-m recent --set --rttl", "--rttl"),
        ("-m recent --rcheck --hitcount 65536", "at most 65535"),
        ("-m recent --set --seconds 5", "the kernel refuses"),
        ("-m recent --remove --hitcount 2", "the kernel refuses"),
        ("-m recent --rcheck --reap", "--reap needs --seconds"),
        ("-m recent --rcheck --seconds 0", "bad value"),
        ("-m recent --rcheck --seconds x", "bad value"),
        ("-m recent --set --name a/b", "/proc"),
        ("-m recent --set --name ..", "/proc"),
        ("-m recent --set --name", "takes one argument"),
        ("-m recent --set ! --name x", "cannot be inverted"),
        ("-m recent --set --name a --name b", "--name"),
        ("-m recent --set --mask example.com", "hostnames"),
        ("-m recent --set --bogus", "no option '--bogus'"),
    ] {
        match printed(Family::Ipv4, rule) {
            Ok(p) => panic!("{rule}: accepted as {p}"),
            Err(e) => assert!(e.contains(says), "{rule}: {e}"),
        }
    }
    let long = format!("-m recent --set --name {}", "n".repeat(200));
    assert!(printed(Family::Ipv4, &long).is_err());
    let longest = format!("-m recent --set --name {}", "n".repeat(199));
    assert!(printed(Family::Ipv4, &longest).is_ok());
}

fn ruleset(name: &str, family: Family, rules: &[&str]) -> Arc<Ruleset> {
    let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n");
    for r in rules {
        text.push_str(r);
        text.push('\n');
    }
    text.push_str("COMMIT\n");
    let rs = parse_ruleset(name, &text, &opts(family)).expect("parses");
    let errs: Vec<_> = validate(&rs, Some(&NoSets))
        .into_iter()
        .filter(|v| v.severity == Severity::Error)
        .collect();
    assert!(errs.is_empty(), "{errs:?}");
    Arc::new(rs)
}

fn index() -> Classifier {
    Classifier::TupleMerge {
        min_rules: 1,
        batch_min_bytes: 0,
        rfc_min_rules: 1,
        rfc_max_rules: 1000,
    }
}

fn pkt(src: &str, dst: &str, dport: u16) -> PacketMeta {
    let src: IpAddr = src.parse().expect("address");
    PacketMeta {
        family: if src.is_ipv6() {
            Family::Ipv6
        } else {
            Family::Ipv4
        },
        hook: Hook::Input,
        src,
        dst: dst.parse().expect("address"),
        protocol: 6,
        dport,
        sport: 40000,
        len: 60,
        ttl: 64,
        ..PacketMeta::default()
    }
}

/// The linear walk, the index and the index in batches, each with its own tables.
struct Both(Vec<Snapshot>);

impl Both {
    fn new(rs: &[Arc<Ruleset>]) -> Both {
        Both(
            [Classifier::Linear, index(), index()]
                .into_iter()
                .map(|c| Snapshot::compile_with(rs, &NoSets, 1, c).expect("compiles"))
                .collect(),
        )
    }

    /// Both verdicts, which must agree.
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

/// `ufw limit 22/tcp`: ufw's user rules (ufw-user-input) and ufw-user-limit, flattened.
const UFW_LIMIT: &[&str] = &[
    "-A INPUT -s 192.0.2.0/24 -j ACCEPT",
    "-A INPUT -p tcp --dport 80 -j ACCEPT",
    "-A INPUT -p tcp -m tcp --dport 22 -m recent --set --name DEFAULT --mask 255.255.255.255 --rsource",
    "-A INPUT -p tcp -m tcp --dport 22 -m recent --update --seconds 30 --hitcount 6 --name DEFAULT --mask 255.255.255.255 --rsource -j DROP",
    "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
    "-A INPUT -j DROP",
];

#[test]
fn ufw_limit_drops_the_sixth_attempt_in_30_seconds() {
    let rs = [ruleset("ufw", Family::Ipv4, UFW_LIMIT)];
    let both = Both::new(&rs);
    let a = pkt("198.51.100.7", "203.0.113.1", 22);
    let b = pkt("198.51.100.8", "203.0.113.1", 22);
    let got: Vec<Verdict> = (0..8).map(|i| both.send(&a, i * SEC)).collect();
    let mut want = vec![Verdict::Accept; 5];
    want.extend([Verdict::Drop; 3]);
    assert_eq!(got, want);
    // Another source has its own entry.
    assert_eq!(both.send(&b, 8 * SEC), Verdict::Accept);
    // Port 80 never touches the list.
    assert_eq!(
        both.send(&pkt("198.51.100.7", "203.0.113.1", 80), 8 * SEC),
        Verdict::Accept
    );
    // 30 s after the 8th: only the new stamp (and none older than 30 s) counts.
    assert_eq!(both.send(&a, 7 * SEC + 30 * SEC + 1), Verdict::Accept);
    // Much later, only the stamps of the last 30 s count: the sixth attempt is dropped.
    let base = 100 * SEC;
    let got: Vec<Verdict> = (0..6).map(|i| both.send(&a, base + i)).collect();
    assert_eq!(got.iter().filter(|v| **v == Verdict::Drop).count(), 1);
}

#[test]
fn the_list_survives_a_commit_and_goes_with_its_ruleset() {
    let rs = [ruleset("ufw", Family::Ipv4, UFW_LIMIT)];
    let mut both = Both::new(&rs);
    let a = pkt("198.51.100.7", "203.0.113.1", 22);
    for i in 0..5 {
        assert_eq!(both.send(&a, i), Verdict::Accept);
    }
    // A commit that changes another rule (the limit rules are spliced or recompiled).
    let mut changed = UFW_LIMIT.to_vec();
    changed.insert(0, "-A INPUT -s 192.0.2.99/32 -j DROP");
    let rs2 = [ruleset("ufw", Family::Ipv4, &changed)];
    both.commit(&rs2);
    assert_eq!(both.send(&a, 6), Verdict::Drop, "five stamps kept");
    // A rule that names the list afresh in another chain shares it.
    let mut more = changed.clone();
    more.insert(
        0,
        "-A FORWARD -m recent --rcheck --name DEFAULT --mask 255.255.255.255 --rsource -j DROP",
    );
    both.commit(&[ruleset("ufw", Family::Ipv4, &more)]);
    let mut fwd = a;
    fwd.hook = Hook::Forward;
    assert_eq!(both.send(&fwd, 7), Verdict::Drop);
    // Without the ruleset the list goes; back again, it starts empty.
    both.commit(&[]);
    both.commit(&rs2);
    assert_eq!(both.send(&a, 8), Verdict::Accept);
    // Lists are per ruleset: another ruleset's DEFAULT is another list.
    let other = ruleset(
        "other",
        Family::Ipv4,
        &["-A INPUT -m recent --rcheck --name DEFAULT --mask 255.255.255.255 --rsource -j DROP"],
    );
    both.commit(&[rs2[0].clone(), other]);
    assert_eq!(both.send(&a, 9), Verdict::Accept);
}

#[test]
fn a_trace_changes_no_list() {
    let rs = [ruleset("ufw", Family::Ipv4, UFW_LIMIT)];
    let both = Both::new(&rs);
    let a = pkt("198.51.100.7", "203.0.113.1", 22);
    for _ in 0..10 {
        let t = both.0[0].trace(&a, 0);
        assert_eq!(t.verdict, Verdict::Accept);
        assert!(t.limits_asked >= 1);
    }
    for i in 0..5 {
        assert_eq!(both.send(&a, i), Verdict::Accept);
    }
    assert_eq!(both.send(&a, 5), Verdict::Drop);
    // The trace now sees the entry (and answers what the packet would get).
    assert_eq!(both.0[1].trace(&a, 6).verdict, Verdict::Drop);
}

#[test]
fn masks_directions_ttl_remove_and_reap() {
    let rs = [ruleset(
        "t",
        Family::Ipv4,
        &[
            // port 1: record the /24 of the destination.
            "-A INPUT -p tcp --dport 1 -m recent --set --name net --mask 255.255.255.0 --rdest -j ACCEPT",
            // port 2: drop when that /24 was recorded.
            "-A INPUT -p tcp --dport 2 -m recent --rcheck --name net --rdest -j DROP",
            // port 3: remove the source's entry of `src` (matches when there was one).
            "-A INPUT -p tcp --dport 3 -m recent --remove --name src -j DROP",
            "-A INPUT -p tcp --dport 4 -m recent --set --name src -j ACCEPT",
            // port 5: the entry exists with the same TTL.
            "-A INPUT -p tcp --dport 5 -m recent --rcheck --rttl --name src -j DROP",
            "-A FORWARD -p tcp --dport 5 -m recent --rcheck --rttl --name src -j DROP",
            // port 6: inverted: no entry.
            "-A INPUT -p tcp --dport 6 -m recent ! --rcheck --name src -j DROP",
            // port 7: reap stale entries of `src`, match stamps within 10 s.
            "-A INPUT -p tcp --dport 7 -m recent --rcheck --seconds 10 --reap --name src -j DROP",
        ],
    )];
    let both = Both::new(&rs);
    assert_eq!(
        both.send(&pkt("10.0.0.1", "10.9.9.1", 2), 0),
        Verdict::Accept
    );
    assert_eq!(
        both.send(&pkt("10.0.0.1", "10.9.9.1", 1), 0),
        Verdict::Accept
    );
    // Another host of the same destination /24; the list kept the first rule's mask.
    assert_eq!(
        both.send(&pkt("10.0.0.2", "10.9.9.200", 2), 0),
        Verdict::Drop
    );
    assert_eq!(
        both.send(&pkt("10.0.0.2", "10.9.8.1", 2), 0),
        Verdict::Accept
    );

    let s = "10.1.1.1";
    assert_eq!(
        both.send(&pkt(s, "10.9.9.1", 6), 0),
        Verdict::Drop,
        "no entry yet"
    );
    assert_eq!(
        both.send(&pkt(s, "10.9.9.1", 3), 0),
        Verdict::Accept,
        "nothing to remove"
    );
    assert_eq!(both.send(&pkt(s, "10.9.9.1", 4), 0), Verdict::Accept);
    assert_eq!(
        both.send(&pkt(s, "10.9.9.1", 6), 0),
        Verdict::Accept,
        "entry"
    );
    assert_eq!(
        both.send(&pkt(s, "10.9.9.1", 5), 0),
        Verdict::Drop,
        "same TTL"
    );
    let mut other_ttl = pkt(s, "10.9.9.1", 5);
    other_ttl.ttl = 63;
    assert_eq!(both.send(&other_ttl, 0), Verdict::Accept, "another TTL");
    // A forwarded packet is compared with the TTL it had before this hop.
    other_ttl.hook = Hook::Forward;
    assert_eq!(
        both.send(&other_ttl, 0),
        Verdict::Drop,
        "TTL 63 forwarded was 64"
    );
    assert_eq!(
        both.send(&pkt(s, "10.9.9.1", 3), 0),
        Verdict::Drop,
        "removed"
    );
    assert_eq!(both.send(&pkt(s, "10.9.9.1", 6), 0), Verdict::Drop, "gone");

    // Reap: the oldest entry, last seen 11 s ago, is dropped by a packet of another
    // address; the packet's own entry stays.
    assert_eq!(
        both.send(&pkt("10.2.0.1", "10.9.9.1", 4), 0),
        Verdict::Accept
    );
    assert_eq!(
        both.send(&pkt("10.2.0.2", "10.9.9.1", 4), 5 * SEC),
        Verdict::Accept
    );
    assert_eq!(
        both.send(&pkt("10.2.0.2", "10.9.9.1", 7), 11 * SEC),
        Verdict::Drop
    );
    assert_eq!(
        both.send(&pkt("10.2.0.1", "10.9.9.1", 6), 11 * SEC),
        Verdict::Drop,
        "reaped"
    );
    assert_eq!(
        both.send(&pkt("10.2.0.2", "10.9.9.1", 6), 11 * SEC),
        Verdict::Accept
    );
}

#[test]
fn a_full_list_drops_its_least_recently_seen_entry() {
    let rs = [ruleset(
        "t",
        Family::Ipv4,
        &[
            "-A INPUT -p tcp --dport 1 -m recent --set --name n -j ACCEPT",
            "-A INPUT -p tcp --dport 2 -m recent --rcheck --name n -j DROP",
        ],
    )];
    let both = Both::new(&rs);
    let host = |i: u32| format!("10.3.{}.{}", i / 256, i % 256);
    for i in 0..100 {
        assert_eq!(
            both.send(&pkt(&host(i), "10.9.9.1", 1), u64::from(i)),
            Verdict::Accept
        );
    }
    // Seen again: host 0 is now the most recent, host 1 the oldest.
    assert_eq!(
        both.send(&pkt(&host(0), "10.9.9.1", 1), 100),
        Verdict::Accept
    );
    assert_eq!(
        both.send(&pkt(&host(100), "10.9.9.1", 1), 101),
        Verdict::Accept
    );
    assert_eq!(
        both.send(&pkt(&host(1), "10.9.9.1", 2), 102),
        Verdict::Accept,
        "dropped"
    );
    for i in [0, 2, 99, 100] {
        assert_eq!(
            both.send(&pkt(&host(i), "10.9.9.1", 2), 103),
            Verdict::Drop,
            "{i}"
        );
    }
}

#[test]
fn ipv6_lists_mask_the_address() {
    let rs = [ruleset(
        "t",
        Family::Ipv6,
        &[
            "-A INPUT -p tcp --dport 1 -m recent --set --name n --mask ffff:ffff:ffff:ffff:: -j ACCEPT",
            "-A INPUT -p tcp --dport 2 -m recent --update --hitcount 2 --name n -j DROP",
        ],
    )];
    let both = Both::new(&rs);
    let p = |src: &str, port| pkt(src, "2001:db8:ffff::1", port);
    assert_eq!(both.send(&p("2001:db8:1:2::1", 1), 0), Verdict::Accept);
    assert_eq!(
        both.send(&p("2001:db8:1:2::99", 2), 1),
        Verdict::Accept,
        "one stamp"
    );
    assert_eq!(both.send(&p("2001:db8:1:2::99", 1), 2), Verdict::Accept);
    assert_eq!(
        both.send(&p("2001:db8:1:2:ff::", 2), 3),
        Verdict::Drop,
        "two stamps"
    );
    assert_eq!(
        both.send(&p("2001:db8:1:3::1", 2), 4),
        Verdict::Accept,
        "other /64"
    );
}

/// A burst in one batch (the probes of all its packets first, then the walks in order) is
/// decided as the packets one by one.
#[test]
fn a_burst_in_one_batch_is_decided_in_order() {
    let rs = [ruleset("ufw", Family::Ipv4, UFW_LIMIT)];
    let one_by_one = Both::new(&rs);
    let batched = Snapshot::compile_with(&rs, &NoSets, 1, index()).expect("compiles");
    let mut burst: Vec<PacketMeta> = (0..8)
        .map(|i| {
            pkt(
                if i % 4 == 3 {
                    "198.51.100.8"
                } else {
                    "198.51.100.7"
                },
                "203.0.113.1",
                22,
            )
        })
        .collect();
    let want: Vec<Verdict> = burst.iter().map(|p| one_by_one.send(p, 0)).collect();
    let mut got = vec![Verdict::Accept; burst.len()];
    batched.classify_batch(
        0,
        &mut burst,
        &mut [],
        &mut got,
        0,
        &mut Vec::new(),
        &[],
        &mut NoTracking,
    );
    assert_eq!(got, want);
    assert!(want.contains(&Verdict::Drop));
}

mod through_the_engine {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use vallum_engine::Clock;
    use vallum_engine::conntrack::ConntrackConfig;
    use vallum_engine::dataplane::BarrierStrategy;
    use vallum_engine::engine::{Change, Engine, EngineConfig};
    use vallum_engine::model::tcp_flags::SYN;
    use vallum_engine::restore::{ParseOptions, parse_ruleset};
    use vallum_engine::sets::NoSets;
    use vallum_engine::snapshot::Verdict;

    struct Frozen(AtomicU64);

    impl Clock for Frozen {
        fn now_ns(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    fn ufw(extra: &str) -> vallum_engine::model::Ruleset {
        let text = format!(
            "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n{extra}\
             -A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n{}\nCOMMIT\n",
            super::UFW_LIMIT[2..5]
                .iter()
                .map(|r| r.replace(
                    "-p tcp -m tcp --dport 22",
                    "-p tcp -m tcp --dport 22 -m conntrack --ctstate NEW"
                ))
                .collect::<Vec<_>>()
                .join("\n")
        );
        parse_ruleset("ufw", &text, &ParseOptions::default()).expect("parses")
    }

    /// `ufw limit` through Engine::commit and the workers' batches with conntrack on: each
    /// attempt a new connection; the list survives a commit of the ruleset that changes
    /// another rule, and a Remove drops it.
    #[test]
    fn ufw_limit_survives_engine_commits() {
        let e = Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: Some(ConntrackConfig::default()),
            },
            Arc::new(Frozen(AtomicU64::new(0))),
        );
        e.commit(Change::Put(ufw("")), &NoSets).expect("commits");
        let attempt = |sport: u16, now: u64| {
            let mut p = super::pkt("198.51.100.7", "203.0.113.1", 22);
            p.sport = sport;
            p.tcp_flags = SYN;
            let mut w = e.worker(0).expect("worker");
            let (mut ps, mut vs) = ([p], [Verdict::Accept]);
            w.process_batch(&mut ps, &mut vs, now);
            vs[0]
        };
        for i in 0..5 {
            assert_eq!(
                attempt(1000 + i, u64::from(i)),
                Verdict::Accept,
                "attempt {i}"
            );
        }
        e.commit(Change::Put(ufw("-A INPUT -s 192.0.2.9 -j DROP\n")), &NoSets)
            .expect("commits");
        assert_eq!(
            attempt(1005, 5),
            Verdict::Drop,
            "sixth attempt after the commit"
        );
        e.commit(Change::Remove("ufw".into()), &NoSets)
            .expect("commits");
        e.commit(Change::Put(ufw("")), &NoSets).expect("commits");
        assert_eq!(attempt(1006, 6), Verdict::Accept, "a fresh list");
    }
}
