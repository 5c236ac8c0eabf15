//! Packet and connection marks: `-j MARK`, `-j CONNMARK` and `-m connmark` (with `-m mark`)
//! parsed into typed rules, printed as iptables-save prints them, validated in filter and
//! raw, and enforced by the linear walk and the TupleMerge index alike:
//!
//! - a filter table modelled on what Calico Felix writes (11 MARK rules: accept / pass /
//!   scratch bits set and cleared across policy chains, a raw PREROUTING bit read in filter
//!   FORWARD), where the verdict of each packet depends on marks set by earlier rules of the
//!   same packet and the final mark is what NFQUEUE sends back with the verdict;
//! - the connection mark through the engine's conntrack: `--save-mark` on a new connection,
//!   `--restore-mark` and `-m connmark` on its later packets, a mark set on an existing entry
//!   by a reply;
//! - in raw, where no conntrack entry exists yet, `-m connmark` never matches and CONNMARK
//!   changes nothing (as the kernel), with a validation warning naming the rule.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vallum_engine::Clock;
use vallum_engine::conntrack::{ConntrackConfig, NoTracking};
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::tcp_flags::{ACK, SYN};
use vallum_engine::model::{ConnmarkTarget, Family, Hook, MarkValue, Target, ct_state};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::{Severity, validate};

use crate::support::one_rule;

/// Written from the shape of Felix's filter table (not copied): bits 0x10000 accept,
/// 0x20000 pass (to the profile), 0x40000 egress allowed (scratch), 0x800000 "from a
/// workload" set in raw PREROUTING. 11 MARK rules.
const FELIX: &str = "\
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -m comment --comment \"cali:clear\" -j MARK --set-xmark 0x0/0xf00000
-A PREROUTING -i cali+ -m comment --comment \"cali:from-wl\" -j MARK --set-mark 0x800000/0x800000
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:cali-FORWARD - [0:0]
:cali-from-wl-dispatch - [0:0]
:cali-fw-cali0a1 - [0:0]
:cali-pi-allow-web - [0:0]
:cali-pro-default - [0:0]
:cali-to-wl-dispatch - [0:0]
:cali-tw-cali0a1 - [0:0]
-A INPUT -i cali+ -m comment --comment \"cali:wl-to-host\" -j MARK --set-xmark 0x0/0x70000
-A FORWARD -m comment --comment \"cali:fwd\" -j cali-FORWARD
-A cali-FORWARD -j MARK --and-mark 0xfff8ffff
-A cali-FORWARD -m mark --mark 0x800000/0x800000 -j cali-from-wl-dispatch
-A cali-FORWARD -m mark --mark 0x10000/0x10000 -j MARK --set-xmark 0x40000/0x50000
-A cali-FORWARD -o cali+ -j cali-to-wl-dispatch
-A cali-FORWARD -m mark --mark 0x10000/0x10000 -j ACCEPT
-A cali-FORWARD -o cali+ -j DROP
-A cali-FORWARD -m mark --mark 0x40000/0x40000 -j ACCEPT
-A cali-from-wl-dispatch -i cali0a1 -g cali-fw-cali0a1
-A cali-from-wl-dispatch -j DROP
-A cali-fw-cali0a1 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A cali-fw-cali0a1 -m conntrack --ctstate INVALID -j DROP
-A cali-fw-cali0a1 -j MARK --set-xmark 0x0/0x20000
-A cali-fw-cali0a1 -j cali-pro-default
-A cali-fw-cali0a1 -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-fw-cali0a1 -j DROP
-A cali-pi-allow-web -p tcp -m multiport --dports 80,443 -j MARK --or-mark 0x10000
-A cali-pi-allow-web -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-pi-allow-web -s 10.65.0.0/16 -p udp -m udp --dport 53 -j MARK --set-xmark 0x20000/0x20000
-A cali-pi-allow-web -m mark --mark 0x20000/0x20000 -j RETURN
-A cali-pro-default -s 10.65.0.0/16 -j MARK --set-xmark 0x10000/0x10000
-A cali-pro-default -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-to-wl-dispatch -o cali0a1 -g cali-tw-cali0a1
-A cali-to-wl-dispatch -j DROP
-A cali-tw-cali0a1 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A cali-tw-cali0a1 -m conntrack --ctstate INVALID -j DROP
-A cali-tw-cali0a1 -j MARK --set-xmark 0x0/0x20000
-A cali-tw-cali0a1 -j cali-pi-allow-web
-A cali-tw-cali0a1 -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-tw-cali0a1 -m mark --mark 0x0/0x20000 -j DROP
-A cali-tw-cali0a1 -j MARK --set-xmark 0x0/0x20000
-A cali-tw-cali0a1 -j cali-pro-default
-A cali-tw-cali0a1 -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-tw-cali0a1 -j DROP
COMMIT
";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn fwd(src: &str, dst: &str, proto: u8, dport: u16, in_if: &str, out_if: &str) -> Packet {
    Packet {
        meta: PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Forward,
            src: ip(src),
            dst: ip(dst),
            protocol: proto,
            sport: 40000,
            dport,
            tcp_flags: if proto == 6 { SYN } else { 0 },
            len: 60,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new(in_if).expect("name"),
            out_iface: IfName::new(out_if).expect("name"),
            ..PacketFacts::default()
        },
    }
}

#[test]
fn felix_marks_decide_as_written_in_both_classifiers() {
    let rs = Arc::new(parse_ruleset("felix", FELIX, &ParseOptions::default()).expect("parses"));
    let marks = rs
        .tables
        .iter()
        .flat_map(|t| t.chains.iter())
        .flat_map(|c| c.rules.iter())
        .filter(|r| matches!(r.target, Target::Mark(_)))
        .count();
    assert_eq!(marks, 11, "MARK rules");
    let v = validate(&rs, None);
    assert!(v.is_empty(), "{v:?}");
    // The text prints back in iptables-save's form: every MARK as --set-xmark.
    let printed = vallum_engine::restore::print(&rs.tables, &Default::default());
    assert!(printed.contains("-A cali-FORWARD -j MARK --set-xmark 0x0/0x70000\n"));
    assert!(printed.contains("-j MARK --set-xmark 0x800000/0x800000\n"));
    assert!(printed.contains("-j MARK --set-xmark 0x10000/0x10000\n"));
    assert!(!printed.contains("--or-mark") && !printed.contains("--set-mark"));

    let linear = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, Classifier::Linear)
        .expect("compiles");
    let indexed = Snapshot::compile_with(
        std::slice::from_ref(&rs),
        &NoSets,
        1,
        Classifier::TupleMerge {
            min_rules: 0,
            batch_min_bytes: 0,
            rfc_min_rules: 0,
            rfc_max_rules: vallum_engine::snapshot::RFC_MAX_RULES,
        },
    )
    .expect("compiles");
    let pod = "10.65.1.5";
    let cases = [
        // A pod's connection out: raw PREROUTING marks it "from a workload", the profile
        // accepts it (accept bit), cali-FORWARD turns that into "egress allowed".
        (
            fwd(pod, "8.8.8.8", 6, 443, "cali0a1", "eth0"),
            Verdict::Accept,
            0x84_0000,
        ),
        // The web policy admits port 80 from anywhere.
        (
            fwd("203.0.113.9", pod, 6, 80, "eth0", "cali0a1"),
            Verdict::Accept,
            0x1_0000,
        ),
        // No policy and no pass: dropped in the to-workload chain.
        (
            fwd("203.0.113.9", pod, 6, 22, "eth0", "cali0a1"),
            Verdict::Drop,
            0,
        ),
        // DNS from the pod network: the policy passes it to the profile (the pass bit is
        // cleared on the way), which accepts.
        (
            fwd("10.65.2.2", pod, 17, 53, "eth0", "cali0a1"),
            Verdict::Accept,
            0x1_0000,
        ),
        // DNS from outside: no pass bit, dropped.
        (
            fwd("203.0.113.9", pod, 17, 53, "eth0", "cali0a1"),
            Verdict::Drop,
            0,
        ),
        // Through the host between two non-workload devices: FORWARD's policy.
        (
            fwd("203.0.113.9", "198.51.100.1", 6, 80, "eth0", "eth1"),
            Verdict::Drop,
            0,
        ),
    ];
    for (i, (p, want, mark)) in cases.iter().enumerate() {
        for stale in [0, 0x87_0000] {
            // A mark the kernel queued the packet with: the clearing rules take it away.
            let mut p = *p;
            p.mark = stale;
            let t = linear.trace(&p, 0);
            assert_eq!(t, indexed.trace(&p, 0), "case {i}");
            assert_eq!(
                (t.verdict, t.mark),
                (*want, *mark),
                "case {i}: {:?}",
                t.steps
            );
            let (mut a, mut b) = (p, p);
            let mut logs = Vec::new();
            assert_eq!(
                crate::support::classify_one(&linear, 0, &mut a, 0, &mut logs),
                *want,
                "case {i}"
            );
            assert_eq!(
                crate::support::classify_one(&indexed, 0, &mut b, 0, &mut logs),
                *want,
                "case {i}"
            );
            assert_eq!((a.mark, b.mark), (*mark, *mark), "case {i}");
        }
    }
    // The batch path (index probes made before the raw chain set the mark) agrees.
    let mut batch: Vec<PacketMeta> = cases.iter().map(|c| c.0.meta).collect();
    let mut facts: Vec<PacketFacts> = cases.iter().map(|c| c.0.facts).collect();
    let mut verdicts = vec![Verdict::Accept; batch.len()];
    let mut logs = Vec::new();
    indexed.classify_batch(
        0,
        &mut batch,
        &mut facts,
        &mut verdicts,
        0,
        &mut logs,
        &[],
        &mut NoTracking,
    );
    for (i, c) in cases.iter().enumerate() {
        assert_eq!((verdicts[i], batch[i].mark), (c.1, c.2), "batch case {i}");
    }
}

#[test]
fn mark_and_connmark_forms_print_as_iptables_save() {
    let f = Family::Ipv4;
    let cases = [
        (
            "-j MARK --set-mark 0x5",
            "-j MARK --set-xmark 0x5/0xffffffff",
        ),
        (
            "-j MARK --set-mark 0x100/0xff",
            "-j MARK --set-xmark 0x100/0x1ff",
        ),
        (
            "-j MARK --and-mark 0xf",
            "-j MARK --set-xmark 0x0/0xfffffff0",
        ),
        ("-j MARK --or-mark 4", "-j MARK --set-xmark 0x4/0x4"),
        ("-j MARK --xor-mark 4", "-j MARK --set-xmark 0x4/0x0"),
        (
            "-j CONNMARK --save-mark",
            "-j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff",
        ),
        (
            "-j CONNMARK --restore-mark --mask 0xff",
            "-j CONNMARK --restore-mark --nfmask 0xff --ctmask 0xff",
        ),
        (
            "-j CONNMARK --set-mark 1 --mask 2",
            "-j CONNMARK --set-xmark 0x1/0x2",
        ),
        ("-m connmark --mark 1", "-m connmark --mark 0x1"),
        (
            "-m connmark ! --mark 0x1/0xff",
            "-m connmark ! --mark 0x1/0xff",
        ),
    ];
    for (rule, want) in cases {
        assert_eq!(one_rule::printed(f, rule).as_deref(), Ok(want), "{rule}");
        // The printed form parses back to itself.
        assert_eq!(one_rule::printed(f, want).as_deref(), Ok(want), "{want}");
    }
    // Typed, not opaque: the model holds the kernel's operation.
    let rs = parse_ruleset(
        "t",
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j CONNMARK --restore-mark --nfmask 0xff --ctmask 0xf\n-A INPUT -j MARK --or-mark 4\nCOMMIT\n",
        &ParseOptions::default(),
    )
    .expect("parses");
    let rules: Vec<_> = rs.tables[0].chains[0].rules.iter().collect();
    assert_eq!(
        rules[0].target,
        Target::Connmark(ConnmarkTarget::Restore {
            nfmask: 0xff,
            ctmask: 0xf
        })
    );
    assert_eq!(
        rules[1].target,
        Target::Mark(MarkValue { value: 4, mask: 4 })
    );
    // Bad input: a clear error on the rule's line, nothing accepted.
    for bad in [
        "-j MARK",
        "-j MARK --set-mark 1 --or-mark 2",
        "-j MARK --set-mark x",
        "-j CONNMARK --save-mark --restore-mark",
        "-m connmark",
        "-m connmark --mark 0x100000000",
    ] {
        let e = one_rule::printed(f, bad).expect_err(bad);
        assert!(e.starts_with("3:"), "{bad}: {e}");
    }
}

/// A clock nobody reads here: every call passes `now` explicitly.
struct Frozen(AtomicU64);

impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Marks a connection on its first packet and reads the mark back on later ones: port 22
/// gets 0x1 (saved from the packet mark), port 23 0x2 (set on the entry), a UDP flow whose
/// reply (OUTPUT) marks its existing entry 0x2. A packet whose restored mark is 0x1 is
/// accepted by rule 2; one whose entry holds 0x2 is dropped by rule 3.
const CONNMARKS: &str = "\
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -j CONNMARK --restore-mark --mask 0xff
-A INPUT -m mark --mark 0x1/0xff -j ACCEPT
-A INPUT -m connmark --mark 0x2/0xff -j DROP
-A INPUT -p tcp -m tcp --dport 22 -j MARK --set-mark 0x1/0xff
-A INPUT -j CONNMARK --save-mark --mask 0xff
-A INPUT -p tcp -m tcp --dport 23 -j CONNMARK --set-xmark 0x2/0xff
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -p tcp -m tcp --dport 23 -j ACCEPT
-A INPUT -p udp -m udp --dport 24 -j ACCEPT
-A OUTPUT -p udp -m udp --sport 24 -j CONNMARK --set-xmark 0x2/0xff
COMMIT
";

const ME: &str = "10.0.0.1";
const PEER: &str = "192.0.2.7";

fn pkt(hook: Hook, proto: u8, src: &str, sport: u16, dst: &str, dport: u16, f: u8) -> PacketMeta {
    PacketMeta {
        family: Family::Ipv4,
        hook,
        src: ip(src),
        dst: ip(dst),
        protocol: proto,
        sport,
        dport,
        tcp_flags: f,
        len: 60,
        ..PacketMeta::default()
    }
}

fn run(e: &Engine, p: PacketMeta, now: u64) -> (Verdict, PacketMeta) {
    let mut w = e.worker(0).expect("core");
    let mut ps = [p];
    let mut vs = [Verdict::Accept];
    assert_eq!(w.process_batch(&mut ps, &mut vs, now), 1);
    (vs[0], ps[0])
}

fn rule_packets(e: &Engine, chain: &str, n: u32) -> u64 {
    e.counters()
        .into_iter()
        .find(|c| &*c.chain == chain && c.rule == Some(n))
        .map_or(0, |c| c.packets)
}

fn entry_mark(e: &Engine, port: u16) -> Option<u32> {
    let ct = e.conntrack().expect("conntrack on");
    ct.list()
        .into_iter()
        .find(|c| c.original.dport == port)
        .map(|c| c.mark)
}

#[test]
fn connmark_lives_in_the_conntrack_entry() {
    const S: u64 = 1_000_000_000;
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    let rs = parse_ruleset("host", CONNMARKS, &ParseOptions::default()).expect("parses");
    e.commit(Change::Put(rs), &NoSets).expect("commits");

    // Port 22: the SYN is marked 0x1 and the new entry confirmed with it.
    let (v, p) = run(&e, pkt(Hook::Input, 6, PEER, 40000, ME, 22, SYN), S);
    assert_eq!((v, p.mark, p.ct_mark), (Verdict::Accept, 1, 1));
    assert_eq!(entry_mark(&e, 22), Some(1));
    assert_eq!(rule_packets(&e, "INPUT", 7), 1);
    let synack = pkt(Hook::Output, 6, ME, 22, PEER, 40000, SYN | ACK);
    assert_eq!(run(&e, synack, S + 1).0, Verdict::Accept);
    // Its next packet gets the mark back from the entry and is accepted by rule 2.
    let (v, p) = run(&e, pkt(Hook::Input, 6, PEER, 40000, ME, 22, ACK), 2 * S);
    assert_eq!((v, p.mark), (Verdict::Accept, 1));
    assert_eq!(rule_packets(&e, "INPUT", 2), 1);

    // Port 23: the entry is marked 0x2 by CONNMARK --set-xmark (after the save of mark 0).
    let (v, p) = run(&e, pkt(Hook::Input, 6, PEER, 40001, ME, 23, SYN), 3 * S);
    assert_eq!((v, p.mark, p.ct_mark), (Verdict::Accept, 0, 2));
    assert_eq!(entry_mark(&e, 23), Some(2));
    let synack = pkt(Hook::Output, 6, ME, 23, PEER, 40001, SYN | ACK);
    assert_eq!(run(&e, synack, 3 * S + 1).0, Verdict::Accept);
    let (v, p) = run(&e, pkt(Hook::Input, 6, PEER, 40001, ME, 23, ACK), 4 * S);
    assert_eq!((v, p.mark), (Verdict::Drop, 2));
    assert_eq!(rule_packets(&e, "INPUT", 3), 1);

    // UDP: the first packet leaves the entry at 0; the reply (OUTPUT, reply direction)
    // marks the existing entry 0x2, and the next request is dropped by rule 3.
    let (v, _) = run(&e, pkt(Hook::Input, 17, PEER, 5000, ME, 24, 0), 5 * S);
    assert_eq!(v, Verdict::Accept);
    assert_eq!(entry_mark(&e, 24), Some(0));
    let (v, p) = run(&e, pkt(Hook::Output, 17, ME, 24, PEER, 5000, 0), 6 * S);
    assert_eq!((v, p.ct_mark, p.ct_reply), (Verdict::Accept, 2, true));
    assert_eq!(entry_mark(&e, 24), Some(2));
    // A trace sees the entry's mark (and changes nothing).
    let t = e.trace(&pkt(Hook::Input, 17, PEER, 5000, ME, 24, 0), 7 * S);
    assert_eq!((t.verdict, t.mark, t.ct_mark), (Verdict::Drop, 2, 2));
    let (v, p) = run(&e, pkt(Hook::Input, 17, PEER, 5000, ME, 24, 0), 7 * S);
    assert_eq!((v, p.mark, p.ct_reply), (Verdict::Drop, 2, false));

    // A dropped first packet leaves no entry, whatever its rules did to the mark.
    let (v, _) = run(&e, pkt(Hook::Input, 6, PEER, 40009, ME, 25, SYN), 8 * S);
    assert_eq!(v, Verdict::Drop);
    assert_eq!(entry_mark(&e, 25), None);
}

#[test]
fn raw_has_no_connmark_yet() {
    let text = "\
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -j CONNMARK --set-xmark 0x5/0xff
-A PREROUTING -m connmark ! --mark 0x1 -j DROP
-A PREROUTING -m connmark --mark 0x0 -j DROP
-A PREROUTING -j MARK --set-xmark 0x7/0xff
COMMIT
";
    let rs = Arc::new(parse_ruleset("raw", text, &ParseOptions::default()).expect("parses"));
    let v = validate(&rs, None);
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(v.iter().all(|v| v.severity == Severity::Warning), "{v:?}");
    assert_eq!(
        v.iter().map(|v| v.rule).collect::<Vec<_>>(),
        [Some(1), Some(2), Some(3)]
    );
    assert!(
        v[0].to_string().contains("sees no conntrack entry"),
        "{}",
        v[0]
    );
    let snap = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, Classifier::Linear)
        .expect("compiles");
    let p = PacketMeta {
        hook: Hook::Input,
        ct_state: ct_state::NEW,
        ..pkt(Hook::Input, 17, PEER, 1, ME, 2, 0)
    };
    let t = snap.trace(&p, 0);
    // Neither connmark rule matched (negated or not), CONNMARK did nothing, MARK did.
    assert_eq!((t.verdict, t.mark, t.ct_mark), (Verdict::Accept, 7, 0));
    assert_eq!(
        t.steps.iter().filter_map(|s| s.rule).collect::<Vec<_>>(),
        [1, 4]
    );
}

/// A mark set in raw PREROUTING is what a filter INPUT `-m mark` rule sees, also when the
/// batch path probed INPUT's index before the raw chain ran (the probe must leave such a
/// rule undecided). Packets of both kinds in one batch, rules past the index's threshold.
#[test]
fn batch_probe_sees_marks_set_before_the_chain() {
    let mut text = String::from(
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A PREROUTING -p tcp -m tcp --dport 22 -j MARK --set-xmark 0x1/0x1\n\
         -A PREROUTING -p udp -j CONNMARK --set-xmark 0x1/0x1\nCOMMIT\n\
         *filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
    );
    for i in 0..20 {
        text += &format!("-A INPUT -s 10.9.{i}.0/24 -j DROP\n");
    }
    text += "-A INPUT -s 192.0.2.7 -p tcp -m mark --mark 0x1/0x1 -j DROP\n";
    text += "-A INPUT -p tcp -m tcp --dport 23 -j MARK --set-xmark 0x1/0x1\n";
    text += "-A INPUT -s 192.0.2.7 -p tcp -m mark --mark 0x1/0x1 -j REJECT\nCOMMIT\n";
    let rs = Arc::new(parse_ruleset("probe", &text, &ParseOptions::default()).expect("parses"));
    let indexed = Snapshot::compile_with(
        std::slice::from_ref(&rs),
        &NoSets,
        1,
        Classifier::TupleMerge {
            min_rules: 0,
            batch_min_bytes: 0,
            rfc_min_rules: 0,
            rfc_max_rules: 0,
        },
    )
    .expect("compiles");
    let linear = Snapshot::compile_with(std::slice::from_ref(&rs), &NoSets, 1, Classifier::Linear)
        .expect("compiles");
    let mk = |dport: u16| pkt(Hook::Input, 6, PEER, 1000, ME, dport, SYN);
    let mut batch = vec![mk(22), mk(80), mk(23), mk(22)];
    let want = [
        Verdict::Drop,
        Verdict::Accept,
        Verdict::Reject(vallum_engine::model::RejectWith::PortUnreachable),
        Verdict::Drop,
    ];
    let mut verdicts = vec![Verdict::Accept; batch.len()];
    let mut logs = Vec::new();
    indexed.classify_batch(
        0,
        &mut batch,
        &mut [],
        &mut verdicts,
        0,
        &mut logs,
        &[],
        &mut NoTracking,
    );
    assert_eq!(verdicts, want);
    for (i, w) in want.iter().enumerate() {
        let mut p = mk([22, 80, 23, 22][i]);
        assert_eq!(
            crate::support::classify_one(&linear, 0, &mut p, 0, &mut logs),
            *w
        );
        assert_eq!(p.mark, batch[i].mark);
    }
}
