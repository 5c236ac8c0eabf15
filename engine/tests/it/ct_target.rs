//! `-j CT` in the raw table: `--zone`, `--zone-orig`, `--zone-reply` (id or `mark`) printed
//! as iptables-save prints them (libxt_CT's ct_print_zone; the cases checked against
//! iptables-legacy 1.8.9), enforced as part of the tracker's key (per-port zones, as
//! Neutron writes them: the same addresses and ports behind two ports are two connections),
//! the first CT/NOTRACK rule a packet meets deciding (xt_ct_target); `--helper` accepted with
//! a warning that says what is not done; `--timeout` and the event masks refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vallum_engine::Clock;
use vallum_engine::conntrack::ConntrackConfig;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::{Family, Hook};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse, parse_ruleset, print};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;
use vallum_engine::validate::{Severity, ViolationKind, validate};

/// `-A PREROUTING -j CT OPTIONS` in raw, printed back; the first error as text otherwise.
fn printed(options: &str) -> Result<String, String> {
    let text = format!("*raw\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j CT {options}\nCOMMIT\n");
    let r = parse(&text, &ParseOptions::default()).map_err(|e| e.0[0].to_string())?;
    let out = print(&r.tables, &Default::default());
    Ok(out
        .lines()
        .find_map(|l| l.strip_prefix("-A PREROUTING "))
        .expect("the rule")
        .to_string())
}

#[test]
fn zone_forms_print_as_iptables_save() {
    for (options, want) in [
        ("--zone 5", "-j CT --zone 5"),
        ("--zone 65535", "-j CT --zone 65535"),
        ("--zone 0", "-j CT"),
        ("--zone-orig 0", "-j CT"),
        ("--zone-orig 7 --zone 0", "-j CT"),
        ("--zone-orig 5", "-j CT --zone-orig 5"),
        ("--zone-reply mark", "-j CT --zone-reply mark"),
        ("--zone mark", "-j CT --zone mark"),
        ("--zone-orig 5 --zone-reply 6", "-j CT --zone 6"),
        ("--zone 5 --zone-orig 6", "-j CT --zone-orig 6"),
        ("--zone 0x10", "-j CT --zone 16"),
        (
            "--helper ftp --zone 4 --notrack",
            "-j CT --notrack --helper ftp --zone 4",
        ),
    ] {
        assert_eq!(printed(options).as_deref(), Ok(want), "{options}");
        let again = want.strip_prefix("-j CT").unwrap_or(want);
        assert_eq!(printed(again).as_deref(), Ok(want), "{want}");
    }
    for bad in [
        "--zone 65536",
        "--zone -1",
        "--zone 1 --zone 2",
        "--zone-orig 3 --zone-orig 4",
        "--zone x",
    ] {
        let e = printed(bad).expect_err(bad);
        assert!(e.starts_with("3:"), "{bad}: {e}");
    }
}

fn violations(raw_rules: &str) -> Vec<(Severity, ViolationKind)> {
    let text = format!("*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{raw_rules}COMMIT\n");
    let rs = parse_ruleset("t", &text, &ParseOptions::default()).expect("parses");
    validate(&rs, None)
        .into_iter()
        .map(|v| (v.severity, v.kind))
        .collect()
}

#[test]
fn helper_warns_and_unenforced_options_are_refused() {
    for ok in [
        "-A PREROUTING -j CT --zone 3\n",
        "-A PREROUTING -j CT\n",
        "-A PREROUTING -j CT --zone-orig mark\n",
        // With --notrack the kernel uses no other option.
        "-A PREROUTING -j CT --notrack --helper ftp --zone 4\n",
    ] {
        assert!(violations(ok).is_empty(), "{ok}: {:?}", violations(ok));
    }
    let v = violations("-A PREROUTING -p tcp --dport 21 -j CT --helper ftp --zone 2\n");
    assert_eq!(
        v,
        [(
            Severity::Warning,
            ViolationKind::CtHelperNotRun("ftp".into())
        )]
    );
    assert!(
        v[0].1.to_string().contains("NEW, not RELATED"),
        "{}",
        v[0].1
    );
    for bad in [
        "-A PREROUTING -j CT --ctevents new\n",
        "-A PREROUTING -j CT --expevents new\n",
    ] {
        let v = violations(bad);
        assert_eq!(v.len(), 1, "{bad}: {v:?}");
        assert_eq!(v[0].0, Severity::Error, "{bad}");
        assert!(
            matches!(&v[0].1, ViolationKind::Unsupported { name, .. } if name.contains("no conntrack events")),
            "{bad}: {v:?}"
        );
    }
}

struct Frozen(AtomicU64);

impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Per-port zones as Neutron writes them (one zone per VM port, both the port and the
/// network side of the router in it); the tap2 NOTRACK rule comes after tap2's CT rule and
/// does nothing (the template is attached).
const ZONES: &str = "\
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -i tap1 -j CT --zone 1
-A PREROUTING -i eth1 -j CT --zone 1
-A PREROUTING -i tap2 -j CT --zone 2
-A PREROUTING -i tap2 -j NOTRACK
-A PREROUTING -i eth2 -j CT --zone 2
-A PREROUTING -i eth3 -j NOTRACK
-A PREROUTING -i eth3 -j CT --zone 3
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -m conntrack --ctstate ESTABLISHED -j ACCEPT
-A FORWARD -i tap+ -m conntrack --ctstate NEW -j ACCEPT
-A FORWARD -m conntrack --ctstate UNTRACKED -j ACCEPT
COMMIT
";

fn udp(src: &str, sport: u16, dst: &str, dport: u16, i: &str) -> Packet {
    Packet {
        meta: PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Forward,
            src: src.parse().expect("address"),
            dst: dst.parse().expect("address"),
            protocol: 17,
            sport,
            dport,
            len: 40,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new(i).expect("name"),
            out_iface: IfName::new("br0").expect("name"),
            ..PacketFacts::default()
        },
    }
}

fn run(e: &Engine, p: Packet, now: u64) -> Verdict {
    let mut w = e.worker(0).expect("core");
    let (mut ps, mut vs) = ([p], [Verdict::Accept]);
    crate::support::process_packets(&mut w, &mut ps, &mut vs, now);
    vs[0]
}

#[test]
fn zones_separate_connections_through_the_engine() {
    let rs = parse_ruleset("zones", ZONES, &ParseOptions::default()).expect("parses");
    assert!(validate(&rs, None).is_empty(), "{:?}", validate(&rs, None));
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    e.commit(Change::Put(rs), &NoSets).expect("commits");
    const S: u64 = 1_000_000_000;
    let (vm, server) = ("10.0.0.5", "192.0.2.53");
    // The same query from two VMs with the same address (two tenants): two connections.
    assert_eq!(
        run(&e, udp(vm, 4000, server, 53, "tap1"), S),
        Verdict::Accept
    );
    assert_eq!(
        run(&e, udp(vm, 4000, server, 53, "tap2"), S),
        Verdict::Accept
    );
    let ct = e.conntrack().expect("tracker");
    let mut zones: Vec<u16> = ct.list().iter().map(|c| c.zone.id).collect();
    zones.sort_unstable();
    assert_eq!(
        zones,
        [1, 2],
        "one entry per zone (tap2's NOTRACK came too late)"
    );
    // The answer on zone 1's network side is ESTABLISHED in zone 1 only...
    let answer = |i: &str| udp(server, 53, vm, 4000, i);
    assert_eq!(run(&e, answer("eth1"), 2 * S), Verdict::Accept);
    let seen: Vec<(u16, bool)> = {
        let mut v: Vec<_> = ct
            .list()
            .iter()
            .map(|c| (c.zone.id, c.seen_reply))
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(seen, [(1, true), (2, false)]);
    // ... and in the default zone (eth0: no CT rule) it is a new connection, not from a
    // tap: dropped.
    assert_eq!(run(&e, answer("eth0"), 2 * S), Verdict::Drop);
    assert_eq!(run(&e, answer("eth2"), 3 * S), Verdict::Accept, "zone 2");
    // eth3: NOTRACK first, so the CT rule after it does nothing: UNTRACKED.
    let before = ct.list().len();
    assert_eq!(run(&e, answer("eth3"), 3 * S), Verdict::Accept);
    assert_eq!(ct.list().len(), before, "untracked: no entry");
    // A trace keys its lookup by the zone too (a dry run: nothing changes).
    let t = e.trace(&udp(vm, 4000, server, 53, "tap2"), 4 * S);
    assert_eq!(t.verdict, Verdict::Accept);
}

#[test]
fn zone_mark_takes_the_packet_mark() {
    let text = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A PREROUTING -j CT --zone mark\nCOMMIT\n\
        *filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
    let rs = parse_ruleset("m", text, &ParseOptions::default()).expect("parses");
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    e.commit(Change::Put(rs), &NoSets).expect("commits");
    for mark in [0x1_0007u32, 9] {
        let mut p = udp("10.0.0.5", 4000, "192.0.2.53", 53, "tap1");
        p.mark = mark;
        assert_eq!(run(&e, p, 1), Verdict::Accept);
    }
    let mut zones: Vec<u16> = e
        .conntrack()
        .expect("tracker")
        .list()
        .iter()
        .map(|c| c.zone.id)
        .collect();
    zones.sort_unstable();
    // The low 16 bits of the mark, as nf_ct_zone_tmpl.
    assert_eq!(zones, [7, 9]);
}

/// A batch whose source has no facts (`process_batch`: every packet's facts are "nothing
/// known") still keys each packet by its own zone: the zone `-j CT` gave one packet does
/// not carry over to the next one of the batch, and the facts a batch does carry come back
/// with the zone in them.
#[test]
fn the_zone_of_one_packet_stays_with_it_in_a_batch() {
    let text = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A PREROUTING -p udp --dport 53 -j CT --zone 5\nCOMMIT\n\
        *filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
    let rs = parse_ruleset("z", text, &ParseOptions::default()).expect("parses");
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: Some(ConntrackConfig::default()),
        },
        Arc::new(Frozen(AtomicU64::new(0))),
    );
    e.commit(Change::Put(rs), &NoSets).expect("commits");
    let dns = udp("10.0.0.5", 4000, "192.0.2.53", 53, "tap1");
    let ntp = udp("10.0.0.5", 4001, "192.0.2.53", 123, "tap1");
    let mut w = e.worker(0).expect("core");
    let mut metas = [dns.meta, ntp.meta, dns.meta, ntp.meta];
    let mut verdicts = [Verdict::Drop; 4];
    assert_eq!(w.process_batch(&mut metas, &mut verdicts, 1), 4);
    assert_eq!(verdicts, [Verdict::Accept; 4]);
    let zones = |e: &Engine| {
        let mut z: Vec<u16> = e
            .conntrack()
            .expect("tracker")
            .list()
            .iter()
            .map(|c| c.zone.id)
            .collect();
        z.sort_unstable();
        z
    };
    assert_eq!(zones(&e), [0, 5], "ntp in the default zone, dns in zone 5");
    // With facts beside the batch, each packet's own facts take its zone.
    let mut packets = [
        udp("10.0.0.6", 4000, "192.0.2.53", 53, "tap1"),
        udp("10.0.0.6", 4001, "192.0.2.53", 123, "tap1"),
    ];
    crate::support::process_packets(&mut w, &mut packets, &mut verdicts[..2], 2);
    let got: Vec<Option<u16>> = packets
        .iter()
        .map(|p| p.facts.ct_zone.map(|z| z.id))
        .collect();
    assert_eq!(got, [Some(5), None]);
    assert_eq!(zones(&e), [0, 0, 5, 5]);
}
