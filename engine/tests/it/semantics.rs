//! Behaviour of the engine as a whole: several rulesets at a hook (nftables semantics), raw
//! before filter, LOG and NOTRACK, limit, sets, counters with carry-over across commits, and
//! validation errors with locations. Rulesets are written as iptables-restore text.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vallum_engine::Clock;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, CommitError, Engine, EngineConfig};
use vallum_engine::model::{Family, Hook, IpNet, RejectWith, Ruleset, TableKind, ct_state};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::{FrozenSet, IpSet, NoSets};
use vallum_engine::snapshot::{Snapshot, StepOutcome, Verdict};
use vallum_engine::validate::{Severity, ViolationKind, validate};

/// A clock the test moves by hand.
#[derive(Default)]
struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

fn ruleset(name: &str, priority: i32, text: &str) -> Ruleset {
    let mut rs = parse_ruleset(name, text, &ParseOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    rs.priority = priority;
    rs
}

fn ruleset6(name: &str, text: &str) -> Ruleset {
    let opts = ParseOptions {
        family: Family::Ipv6,
        ..ParseOptions::default()
    };
    parse_ruleset(name, text, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn snapshot(rulesets: Vec<Ruleset>) -> Snapshot {
    let list: Vec<Arc<Ruleset>> = rulesets.into_iter().map(Arc::new).collect();
    Snapshot::compile(&list, &NoSets, 2).expect("compiles")
}

fn tcp(src: &str, dst: &str, dport: u16) -> Packet {
    let src: IpAddr = src.parse().unwrap();
    Packet {
        meta: PacketMeta {
            family: if src.is_ipv6() {
                Family::Ipv6
            } else {
                Family::Ipv4
            },
            src,
            dst: dst.parse().unwrap(),
            protocol: 6,
            sport: 40000,
            dport,
            tcp_flags: 0x02,
            len: 60,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new("eth0").unwrap(),
            ..PacketFacts::default()
        },
    }
}

fn classify(s: &Snapshot, mut p: impl crate::support::OnePacket) -> Verdict {
    crate::support::classify_one(s, 0, &mut p, 0, &mut Vec::new())
}

#[test]
fn accept_in_one_ruleset_passes_to_the_next_and_drop_is_final() {
    let low = ruleset(
        "platform",
        -10,
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp --dport 23 -j DROP\nCOMMIT\n",
    );
    let high = ruleset(
        "app",
        10,
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j DROP\n-A INPUT -p tcp --dport 80 -j REJECT --reject-with tcp-reset\nCOMMIT\n",
    );
    let s = snapshot(vec![high, low]);
    // 22: accepted by "platform" (priority -10), then dropped by "app": ACCEPT is not final.
    assert_eq!(classify(&s, tcp("10.0.0.1", "10.0.0.2", 22)), Verdict::Drop);
    // 23: dropped by "platform" first; "app" never runs.
    let t = s.trace(&tcp("10.0.0.1", "10.0.0.2", 23), 0);
    assert_eq!(t.verdict, Verdict::Drop);
    assert!(t.steps.iter().all(|st| &*st.ruleset == "platform"));
    assert_eq!(
        classify(&s, tcp("10.0.0.1", "10.0.0.2", 80)),
        Verdict::Reject(RejectWith::TcpReset)
    );
    assert_eq!(
        classify(&s, tcp("10.0.0.1", "10.0.0.2", 443)),
        Verdict::Accept
    );
    // The trace of 22 visits platform's rule 1 then app's rule 1, in priority order.
    let t = s.trace(&tcp("10.0.0.1", "10.0.0.2", 22), 0);
    let path: Vec<(&str, Option<u32>)> = t.steps.iter().map(|s| (&*s.ruleset, s.rule)).collect();
    assert_eq!(path, vec![("platform", Some(1)), ("app", Some(1))]);
    assert_eq!(t.steps[0].outcome, StepOutcome::Accept);
    assert_eq!(t.steps[1].outcome, StepOutcome::Drop);
}

#[test]
fn policy_drop_of_one_ruleset_is_final_and_families_are_separate() {
    let rs = ruleset(
        "host",
        0,
        "*filter\n:INPUT DROP [0:0]\n-A INPUT -s 192.0.2.0/24 -j ACCEPT\nCOMMIT\n",
    );
    let rs6 = ruleset6(
        "host6",
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s 2001:db8::/32 -j DROP\nCOMMIT\n",
    );
    let s = snapshot(vec![rs, rs6]);
    assert_eq!(
        classify(&s, tcp("192.0.2.9", "10.0.0.1", 1)),
        Verdict::Accept
    );
    assert_eq!(
        classify(&s, tcp("198.51.100.9", "10.0.0.1", 1)),
        Verdict::Drop
    );
    let t = s.trace(&tcp("198.51.100.9", "10.0.0.1", 1), 0);
    assert_eq!(t.steps.len(), 1);
    assert_eq!(t.steps[0].rule, None);
    assert_eq!(
        t.steps[0].outcome,
        StepOutcome::Policy(vallum_engine::model::Policy::Drop)
    );
    // IPv6 packets only see the ip6 table.
    assert_eq!(
        classify(&s, tcp("2001:db8::1", "2001:db8::2", 1)),
        Verdict::Drop
    );
    assert_eq!(
        classify(&s, tcp("2001:db9::1", "2001:db8::2", 1)),
        Verdict::Accept
    );
}

#[test]
fn raw_notrack_runs_before_filter_and_log_continues() {
    let rs = ruleset(
        "host",
        0,
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -p udp --dport 53 -j NOTRACK\nCOMMIT\n\
         *filter\n:INPUT DROP [0:0]\n-A INPUT -m conntrack --ctstate UNTRACKED -j ACCEPT\n\
         -A INPUT -j LOG --log-prefix \"in-drop: \" --log-level 6\nCOMMIT\n",
    );
    let s = snapshot(vec![rs]);
    let mut dns = PacketMeta {
        protocol: 17,
        dport: 53,
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2".parse().unwrap(),
        hook: Hook::Prerouting,
        len: 80,
        ..PacketMeta::default()
    };
    let mut logs = Vec::new();
    assert_eq!(
        crate::support::classify_one(&s, 0, &mut dns, 0, &mut logs),
        Verdict::Accept
    );
    assert_eq!(
        dns.ct_state,
        ct_state::UNTRACKED,
        "NOTRACK marks the packet"
    );
    dns.hook = Hook::Input;
    assert_eq!(
        crate::support::classify_one(&s, 0, &mut dns, 0, &mut logs),
        Verdict::Accept
    );
    assert!(logs.is_empty());

    let mut other = PacketMeta {
        dport: 54,
        ct_state: ct_state::NEW,
        ..dns
    };
    assert_eq!(
        crate::support::classify_one(&s, 0, &mut other, 0, &mut logs),
        Verdict::Drop
    );
    assert_eq!(
        logs.len(),
        1,
        "LOG does not decide; the policy drops after it"
    );
    assert_eq!(logs[0].prefix.as_deref(), Some("in-drop: "));
    assert_eq!(logs[0].level, 6);
    assert_eq!((&*logs[0].chain, logs[0].rule), ("INPUT", 2));
}

#[test]
fn limit_is_a_token_bucket_driven_by_the_callers_clock() {
    let rs = ruleset(
        "host",
        0,
        "*filter\n:INPUT DROP [0:0]\n-A INPUT -m limit --limit 2/sec --limit-burst 3 -j ACCEPT\nCOMMIT\n",
    );
    let s = snapshot(vec![rs]);
    let p = tcp("10.0.0.1", "10.0.0.2", 1);
    let at = |now: u64| {
        let mut q = p;
        crate::support::classify_one(&s, 0, &mut q, now, &mut Vec::new())
    };
    let t0 = 1_000_000_000;
    // The burst of 3 passes at once, the 4th is over the limit.
    assert_eq!(
        [at(t0), at(t0), at(t0), at(t0)],
        [
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Accept,
            Verdict::Drop
        ]
    );
    // One token comes back every 500 ms.
    assert_eq!(at(t0 + 499_000_000), Verdict::Drop);
    assert_eq!(at(t0 + 1_500_000_000), Verdict::Accept);
    // 1.5 s after the burst, three tokens came back and one was just used: two are left.
    // A trace never consumes one.
    let t1 = t0 + 1_500_000_000;
    assert_eq!(s.trace(&p, t1).verdict, Verdict::Accept);
    assert_eq!(s.trace(&p, t1).verdict, Verdict::Accept);
    assert_eq!(
        [at(t1), at(t1), at(t1)],
        [Verdict::Accept, Verdict::Accept, Verdict::Drop]
    );
    assert_eq!(s.trace(&p, t1).verdict, Verdict::Drop);
}

#[test]
fn set_match_uses_the_registry() {
    let rs = ruleset(
        "docker",
        0,
        "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m set --match-set blocked src -j DROP\nCOMMIT\n",
    );
    let mut sets: BTreeMap<String, Arc<dyn IpSet>> = BTreeMap::new();
    let err = Snapshot::compile(&[Arc::new(rs.clone())], &sets, 1).unwrap_err();
    assert!(err.to_string().contains("blocked"), "{err}");
    let v = validate(&rs, Some(&sets));
    assert!(matches!(&v[0].kind, ViolationKind::UnknownSet(n) if n == "blocked"));
    assert_eq!(v[0].location.line, 3, "located at the rule: {}", v[0]);

    sets.insert(
        "blocked".into(),
        Arc::new(FrozenSet::new([IpNet::new(
            "198.51.100.0".parse().unwrap(),
            24,
        )
        .unwrap()])),
    );
    let s = Snapshot::compile(&[Arc::new(rs)], &sets, 1).unwrap();
    let fwd = |src: &str| {
        let mut p = tcp(src, "10.0.0.2", 80);
        p.hook = Hook::Forward;
        p
    };
    assert_eq!(classify(&s, fwd("198.51.100.7")), Verdict::Drop);
    assert_eq!(classify(&s, fwd("198.51.101.7")), Verdict::Accept);
}

#[test]
fn validation_reports_every_problem_with_its_location() {
    let text = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
                -A POSTROUTING -o eth0 -j MASQUERADE\nCOMMIT\n\
                *filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n\
                -A INPUT -j A\n-A A -j B\n-A B -j A\n-A INPUT -m quota --quota 5 -j ACCEPT\nCOMMIT\n";
    let rs = ruleset("mixed", 0, text);
    let v = validate(&rs, None);
    let errors: Vec<String> = v
        .iter()
        .filter(|v| v.severity == Severity::Error)
        .map(ToString::to_string)
        .collect();
    let warnings: Vec<String> = v
        .iter()
        .filter(|v| v.severity == Severity::Warning)
        .map(ToString::to_string)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("1:1: warning") && warnings[0].contains("nat"),
        "{warnings:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("loop: A -> B -> A")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("17:") && e.contains("quota") && e.contains("filter")),
        "{errors:?}"
    );
    // The MASQUERADE target lives in nat, which is not enforced: no error for it.
    assert!(
        !errors.iter().any(|e| e.contains("MASQUERADE")),
        "{errors:?}"
    );
}

#[test]
fn reject_is_refused_where_the_kernel_refuses_it() {
    let rs = ruleset(
        "x",
        0,
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:R - [0:0]\n-A PREROUTING -j R\nCOMMIT\n",
    );
    assert!(validate(&rs, None).is_empty());
    let mut bad = rs.clone();
    bad.tables[0]
        .chains
        .iter_mut()
        .find(|c| c.name == "R")
        .unwrap()
        .rules
        .push(vallum_engine::model::Rule {
            target: vallum_engine::model::Target::Reject(RejectWith::PortUnreachable),
            ..Default::default()
        });
    let v = validate(&bad, None);
    assert!(
        v.iter().any(|v| matches!(
            v.kind,
            ViolationKind::TargetTable {
                target: "REJECT",
                allowed: TableKind::Filter
            }
        )),
        "{v:?}"
    );
    assert!(
        v.iter().any(|v| matches!(
            v.kind,
            ViolationKind::WrongHook {
                what: "REJECT",
                hook: Hook::Prerouting
            }
        )),
        "{v:?}"
    );
}

fn engine(cores: usize) -> Engine {
    Engine::new(
        EngineConfig {
            cores,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ManualClock::default()),
    )
}

const WEB: &str = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp --dport 80 -j ACCEPT\nCOMMIT\n";

#[test]
fn counters_sum_cores_and_survive_a_commit_for_unchanged_rules() {
    let e = engine(2);
    e.commit(Change::Put(ruleset("web", 0, WEB)), &NoSets)
        .unwrap();
    let mut w0 = e.worker(0).unwrap();
    let mut w1 = e.worker(1).unwrap();
    let mut batch = vec![tcp("10.0.0.1", "10.0.0.2", 22).meta; 3];
    batch.push(tcp("10.0.0.1", "10.0.0.2", 80).meta);
    batch.push(tcp("10.0.0.1", "10.0.0.2", 9).meta);
    let mut verdicts = vec![Verdict::Accept; batch.len()];
    assert_eq!(w0.process_batch(&mut batch.clone(), &mut verdicts, 0), 5);
    assert_eq!(verdicts[4], Verdict::Drop);
    w1.process_batch(&mut batch.clone(), &mut verdicts, 0);

    let count = |e: &Engine, rule: Option<u32>| {
        e.counters()
            .into_iter()
            .find(|c| c.rule == rule && &*c.chain == "INPUT")
            .map(|c| (c.packets, c.bytes))
    };
    assert_eq!(count(&e, Some(1)), Some((6, 360)));
    assert_eq!(count(&e, Some(2)), Some((2, 120)));
    assert_eq!(count(&e, None), Some((2, 120)), "policy counter");

    // Insert a rule at the top: rule 1 is new, the old rules move to 2 and 3 and keep counts.
    let next = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 443 -j ACCEPT\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -p tcp --dport 80 -j ACCEPT\nCOMMIT\n";
    let c = e
        .commit(Change::Put(ruleset("web", 0, next)), &NoSets)
        .unwrap();
    assert_eq!(c.report.rules, 3);
    assert_eq!(c.report.cores_waited, 0, "idle cores are never waited for");
    drop(c.retired);
    assert_eq!(count(&e, Some(1)), Some((0, 0)));
    assert_eq!(count(&e, Some(2)), Some((6, 360)));
    assert_eq!(count(&e, Some(3)), Some((2, 120)));
    assert_eq!(count(&e, None), Some((2, 120)));

    // Counting goes on in the new snapshot on top of the carried values.
    w0.process_batch(&mut batch.clone(), &mut verdicts, 0);
    assert_eq!(count(&e, Some(2)), Some((9, 540)));

    e.zero_counters(Some("web"));
    assert_eq!(count(&e, Some(2)), Some((0, 0)));
    w1.process_batch(&mut batch, &mut verdicts, 0);
    assert_eq!(count(&e, Some(2)), Some((3, 180)));

    let by_verdict = e.verdict_counts();
    let accepted: u64 = by_verdict
        .iter()
        .filter(|v| v.verdict == "ACCEPT")
        .map(|v| v.packets)
        .sum();
    let dropped: u64 = by_verdict
        .iter()
        .filter(|v| v.verdict == "DROP")
        .map(|v| v.packets)
        .sum();
    assert_eq!((accepted, dropped), (16, 4));
    assert_eq!(e.core_packets(), vec![10, 10]);
    assert!(e.generations().iter().all(|g| g % 2 == 0));
}

#[test]
fn a_refused_commit_changes_nothing() {
    let e = engine(1);
    e.commit(Change::Put(ruleset("web", 0, WEB)), &NoSets)
        .unwrap();
    let bad = ruleset(
        "web",
        0,
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m addrtype --dst-type LOCAL -j ACCEPT\nCOMMIT\n",
    );
    match e.commit(Change::Put(bad), &NoSets) {
        Err(CommitError::Invalid(v)) => assert!(v[0].to_string().contains("addrtype")),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(
        e.trace(&tcp("10.0.0.1", "10.0.0.2", 9), 0).verdict,
        Verdict::Drop
    );
    assert_eq!(e.rulesets()["web"].rule_count(), 2);
}

/// Prepare then publish: nothing is visible before publish, a dropped `Prepared` changes
/// nothing, and a `Prepared` made before another commit was published is refused as stale.
#[test]
fn prepare_publishes_only_when_asked_and_never_stale() {
    let e = engine(1);
    let open = "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";
    e.commit(Change::Put(ruleset("web", 0, open)), &NoSets)
        .unwrap();
    let p = e
        .prepare(Change::Put(ruleset("web", 0, WEB)), &NoSets)
        .unwrap();
    let probe = tcp("10.0.0.1", "10.0.0.2", 9);
    assert_eq!(
        e.trace(&probe, 0).verdict,
        Verdict::Accept,
        "not yet published"
    );
    assert_eq!(e.rulesets()["web"].rule_count(), 0);
    let c = e.publish(p).unwrap();
    assert_eq!(c.report.rules, 2);
    assert_eq!(e.trace(&probe, 0).verdict, Verdict::Drop);
    assert_eq!(e.rulesets()["web"].rule_count(), 2);

    // Dropped: nothing happens.
    drop(e.prepare(Change::Remove("web".into()), &NoSets).unwrap());
    assert_eq!(e.trace(&probe, 0).verdict, Verdict::Drop);

    // Stale: another commit came first.
    let late = e.prepare(Change::Remove("web".into()), &NoSets).unwrap();
    e.commit(Change::Put(ruleset("web", 0, open)), &NoSets)
        .unwrap();
    assert!(matches!(e.publish(late), Err(CommitError::Stale)));
    assert_eq!(e.trace(&probe, 0).verdict, Verdict::Accept);
    assert_eq!(e.rulesets().len(), 1);
}

#[test]
fn commits_while_workers_classify_never_lose_a_packet() {
    let e = Arc::new(engine(2));
    e.commit(Change::Put(ruleset("web", 0, WEB)), &NoSets)
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|core| {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut w = e.worker(core).unwrap();
                let mut verdicts = vec![Verdict::Accept; 32];
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut batch = vec![tcp("10.0.0.1", "10.0.0.2", 22).meta; 32];
                    sent += w.process_batch(&mut batch, &mut verdicts, 0) as u64;
                    assert!(verdicts.iter().all(|v| *v == Verdict::Accept));
                }
                sent
            })
        })
        .collect();
    for i in 0..200 {
        // Alternate between two texts whose rule 1 is unchanged, so its count carries.
        let text = if i % 2 == 0 {
            WEB.to_string()
        } else {
            WEB.replace("--dport 80", "--dport 8080")
        };
        e.commit(Change::Put(ruleset("web", 0, &text)), &NoSets)
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let sent: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let rule1 = e
        .counters()
        .into_iter()
        .find(|c| c.rule == Some(1))
        .unwrap();
    assert_eq!(
        rule1.packets, sent,
        "every classified packet is counted exactly once"
    );
    assert_eq!(e.core_packets().iter().sum::<u64>(), sent);
}

/// A structured model may carry IPv4 ICMP type 255 with a code range; the kernel matches every
/// ICMP packet for it (icmp_type_code_match tests `test_type == 0xFF` first). ICMPv6 does not.
#[test]
fn icmp_type_255_matches_every_icmp_packet_in_ipv4_only() {
    use vallum_engine::model::{IcmpMatch, Match};
    let mut rs = ruleset(
        "icmp",
        0,
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p icmp -j DROP\nCOMMIT\n",
    );
    let rule = &mut rs.tables[0].chains[0].rules[0];
    rule.matches.push(Match::Icmp(IcmpMatch {
        negated: false,
        icmp_type: Some(255),
        code: (0, 0),
    }));
    assert!(validate(&rs, None).is_empty());
    let s = snapshot(vec![rs]);
    let echo = PacketMeta {
        protocol: 1,
        icmp_type: 8,
        icmp_code: 0,
        ..PacketMeta::default()
    };
    assert_eq!(classify(&s, echo), Verdict::Drop);

    let mut rs6 = ruleset6(
        "icmp6",
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 255/0 -j DROP\nCOMMIT\n",
    );
    rs6.name = "icmp6".into();
    let s6 = snapshot(vec![rs6]);
    let echo6 = PacketMeta {
        family: Family::Ipv6,
        src: "2001:db8::1".parse().unwrap(),
        dst: "2001:db8::2".parse().unwrap(),
        protocol: 58,
        icmp_type: 128,
        ..PacketMeta::default()
    };
    assert_eq!(classify(&s6, echo6), Verdict::Accept);
}

/// Rulesets built in code (the gRPC API) can hold values the parser never produces. Each of
/// these would make the compiled rule behave differently from its iptables-save text (or from
/// what the kernel accepts), so validation must refuse them, naming the rule.
#[test]
fn structured_values_the_text_form_cannot_mean_are_refused() {
    use vallum_engine::model::{IcmpMatch, LimitMatch, Match, Neg, RateUnit};
    let base = || {
        ruleset(
            "s",
            0,
            "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p icmp -j DROP\nCOMMIT\n",
        )
    };
    type Edit = Box<dyn Fn(&mut vallum_engine::model::Rule)>;
    let net = |a: &str, m: &str| {
        Some(Neg::plain(IpNet {
            addr: a.parse().unwrap(),
            mask: m.parse().unwrap(),
        }))
    };
    let cases: Vec<(&str, Edit)> = vec![
        ("v6 mask on a v4 address", {
            let n = net("10.0.0.0", "ffff::");
            Box::new(move |r| r.src = n)
        }),
        ("address bits outside the mask", {
            let n = net("10.0.0.1", "255.255.255.0");
            Box::new(move |r| r.dst = n)
        }),
        ("protocol 0", Box::new(|r| r.protocol = Some(Neg::plain(0)))),
        (
            "icmp code range upside down",
            Box::new(|r| {
                r.matches.push(Match::Icmp(IcmpMatch {
                    negated: false,
                    icmp_type: Some(3),
                    code: (5, 1),
                }))
            }),
        ),
        (
            "limit faster than 10000/s",
            Box::new(|r| {
                r.matches.push(Match::Limit(LimitMatch {
                    rate: u32::MAX,
                    unit: RateUnit::Second,
                    burst: 5,
                }))
            }),
        ),
        (
            "limit burst above 10000",
            Box::new(|r| {
                r.matches.push(Match::Limit(LimitMatch {
                    rate: 1,
                    unit: RateUnit::Second,
                    burst: 10_001,
                }))
            }),
        ),
    ];
    for (what, edit) in cases {
        let mut rs = base();
        edit(&mut rs.tables[0].chains[0].rules[0]);
        let v = validate(&rs, None);
        assert!(
            v.iter()
                .any(|v| v.severity == Severity::Error && v.rule == Some(1)),
            "{what}: not refused: {v:?}"
        );
    }
    // The limits themselves are fine.
    let mut rs = base();
    rs.tables[0].chains[0].rules[0]
        .matches
        .push(Match::Limit(LimitMatch {
            rate: 10_000,
            unit: RateUnit::Second,
            burst: 10_000,
        }));
    assert!(validate(&rs, None).is_empty());
}

/// Names and texts of a structured ruleset must survive iptables-save -> iptables-restore: the
/// engine persists and shows rulesets as text. A chain name with a space or a leading `-`, an
/// interface with `/`, a comment or log prefix with a newline, a log level above 7 (xt_LOG
/// refuses it) were all accepted and printed as text that does not parse back.
#[test]
fn structured_names_that_cannot_be_printed_are_refused() {
    use vallum_engine::model::{Iface, LogTarget, Match, Neg, SetDir, SetMatch, Target};
    use vallum_engine::restore::print;
    let base = || {
        ruleset(
            "n",
            0,
            "*filter\n:INPUT ACCEPT [0:0]\n:USER - [0:0]\n-A INPUT -j USER\n-A USER -j ACCEPT\nCOMMIT\n",
        )
    };
    type Edit = Box<dyn Fn(&mut Ruleset)>;
    let rename = |name: &'static str| -> Edit {
        Box::new(move |rs: &mut Ruleset| {
            let t = &mut rs.tables[0];
            for c in &mut t.chains {
                if c.name == "USER" {
                    c.name = name.into();
                }
            }
            t.chains[0].rules[0].target = Target::Jump(name.into());
            assert!(t.chain(name).is_some());
        })
    };
    let rule = |f: fn(&mut vallum_engine::model::Rule)| -> Edit {
        Box::new(move |rs: &mut Ruleset| f(&mut rs.tables[0].chains[0].rules[0]))
    };
    let cases: Vec<(&str, Edit)> = vec![
        ("chain name with a space", rename("MY CHAIN")),
        ("chain name starting with -", rename("-X")),
        ("chain name with a quote", rename("A\"B")),
        (
            "interface with /",
            rule(|r| r.in_iface = Some(Neg::plain(Iface { name: "a/b".into() }))),
        ),
        (
            "interface with a space",
            rule(|r| r.out_iface = Some(Neg::plain(Iface { name: "a b".into() }))),
        ),
        (
            "comment with a newline",
            rule(|r| {
                r.matches
                    .push(Match::Comment("ok\n-A INPUT -j DROP".into()))
            }),
        ),
        (
            "log prefix with a newline",
            rule(|r| {
                r.target = Target::Log(LogTarget {
                    prefix: Some("a\nb".into()),
                    ..LogTarget::default()
                })
            }),
        ),
        (
            "log level 9",
            rule(|r| {
                r.target = Target::Log(LogTarget {
                    level: Some(9),
                    ..LogTarget::default()
                })
            }),
        ),
        (
            "set name with a space",
            rule(|r| {
                r.matches.push(Match::Set(SetMatch {
                    negated: false,
                    name: "a b".into(),
                    dirs: vec![SetDir::Src],
                    other: Vec::new(),
                }))
            }),
        ),
    ];
    assert!(validate(&base(), None).is_empty());
    for (what, edit) in cases {
        let mut rs = base();
        edit(&mut rs);
        let v = validate(&rs, None);
        assert!(
            v.iter().any(|v| v.severity == Severity::Error),
            "{what}: not refused, though it prints as:\n{}",
            print(&rs.tables, &Default::default())
        );
    }
}

/// `Snapshot::compile` is public and may be handed an unvalidated ruleset. A goto loop adds no
/// call depth, so the evaluator would spin forever on the first packet; compile must refuse it.
#[test]
fn compile_refuses_a_goto_loop_that_validation_was_not_asked_about() {
    use vallum_engine::model::{Rule, Target};
    use vallum_engine::snapshot::CompileError;
    let mut rs = ruleset(
        "loop",
        0,
        "*filter\n:INPUT ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n-A INPUT -g A\n-A A -g B\nCOMMIT\n",
    );
    for c in &mut rs.tables[0].chains {
        if c.name == "B" {
            c.rules.push(Rule {
                target: Target::Goto("A".into()),
                ..Rule::default()
            });
        }
    }
    assert!(vallum_engine::validate::has_errors(&validate(&rs, None)));
    let r = Snapshot::compile(&[Arc::new(rs)], &NoSets, 1);
    assert!(
        matches!(r, Err(CompileError::Loop { .. })),
        "compiled a loop: {r:?}"
    );
}
