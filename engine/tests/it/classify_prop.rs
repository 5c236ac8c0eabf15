//! Property test: the TupleMerge classifier (alone and with RFC tables) and the linear walk agree on random small
//! rulesets with user chains (jump, goto, RETURN), negations, non-contiguous masks, interface
//! wildcards, conntrack state, marks, IP-header matches (ttl/hl, tos, dscp, ecn, ipv6header,
//! frag, rt), `-m limit` and LOG, in IPv4 and IPv6: the same trace
//! (verdict and every step) for every packet, the same verdicts when classifying with a
//! moving clock, and the same counters afterwards.
//!
//! `cargo test -p vallum-engine --test it -- classify_prop::` (PROPTEST_CASES raises the case count).

use std::net::IpAddr;
use std::sync::Arc;

use proptest::prelude::*;
use vallum_engine::conntrack::Track;
use vallum_engine::model::IpNet;
use vallum_engine::model::{Family, Hook, ct_state, ipv6_ext};
use vallum_engine::node_addrs::{AddrFacts, LocalRoute, RouteType};
use vallum_engine::packet::{
    FragmentHeader, IfName, Ipv6Ext, Packet, PacketFacts, PacketMeta, RoutingHeader,
};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::SetManager;
use vallum_engine::snapshot::{Classifier, RFC_MAX_RULES, Snapshot, Verdict};

const NETS4: [&str; 8] = [
    "10.0.0.0/8",
    "10.1.0.0/16",
    "10.1.2.0/24",
    "10.1.2.3",
    "10.0.1.0/255.0.255.0",
    "192.168.0.0/16",
    "0.0.0.0/1",
    "10.0.0.3/255.0.0.255",
];
const NETS6: [&str; 8] = [
    "2001:db8::/32",
    "2001:db8:1::/48",
    "2001:db8:1:2::/64",
    "2001:db8:1:2::3",
    "2001:db8::/ffff:ffff:0:ffff::",
    "fd00::/8",
    "::/1",
    "2001:db8::3/ffff:ffff::ffff",
];
const ADDRS4: [&str; 7] = [
    "10.1.2.3",
    "10.1.2.4",
    "10.0.1.5",
    "10.2.1.1",
    "192.168.3.4",
    "172.16.0.1",
    "10.1.3.3",
];
const ADDRS6: [&str; 7] = [
    "2001:db8:1:2::3",
    "2001:db8:1:2::4",
    "2001:db8:7:1::5",
    "2001:db8:2::1",
    "fd00::4",
    "fe80::1",
    "2001:db8:1:3::3",
];
const PORTS: [u16; 6] = [22, 80, 443, 1000, 1500, 3000];
const CHAINS: [&str; 4] = ["INPUT", "U1", "U2", "U3"];

/// One rule as indexes into the pools above; rendered per family by [`render`].
#[derive(Clone, Debug)]
struct RuleSpec {
    src: Option<(bool, usize)>,
    dst: Option<(bool, usize)>,
    /// 0: none, 1: tcp, 2: udp, 3: icmp, 4: ! tcp.
    proto: u8,
    /// (negated, port index, range?) for tcp/udp.
    sport: Option<(bool, usize, bool)>,
    dport: Option<(bool, usize, bool)>,
    iface: u8,
    ctstate: u8,
    /// 0: none, 1: `-m mark`, 2: `-m connmark`, 3: `! -m connmark`.
    mark: u8,
    limit: bool,
    /// 0 ACCEPT, 1 DROP, 2 RETURN, 3 none, 4 LOG, 5 jump, 6 goto, 7 MARK --set-xmark,
    /// 8 MARK --xor-mark, 9 CONNMARK --save-mark, 10 CONNMARK --restore-mark, 11 CONNMARK
    /// --set-xmark (the mark-changing targets make later `-m mark` rules of the same packet
    /// see another mark than the index's batch probe saw).
    target: u8,
    /// Which later chain a jump/goto goes to (modulo the chains after this one).
    to: usize,
    /// An IP-header match (see [`HEADER_MATCHES`]); 0 and values past the table: none.
    header: usize,
}

/// IP-header matches (IPv4, IPv6): residual filters in the index, checked per rule.
/// The addrtype entries decide against [`node_facts`].
const HEADER_MATCHES: [(&str, &str); 10] = [
    ("-m ttl --ttl-lt 64", "-m hl --hl-lt 64"),
    ("-m ttl ! --ttl-eq 64", "-m hl ! --hl-eq 64"),
    ("-m tos --tos 0x10/0x3f", "-m tos --tos 0x10/0x3f"),
    ("-m dscp --dscp 0x2e", "-m dscp ! --dscp 0x2e"),
    ("-m ecn --ecn-ip-ect 1", "-m ecn ! --ecn-ip-ect 1"),
    (
        "-m ttl --ttl-gt 100",
        "-m ipv6header --header hop-by-hop,protocol",
    ),
    ("-m tos ! --tos 0x00/0x03", "-m frag --fragmore"),
    ("-m dscp ! --dscp 0", "-m rt --rt-type 0 --rt-segsleft 1:9"),
    (
        "-m addrtype --dst-type LOCAL --limit-iface-in",
        "-m addrtype --dst-type UNICAST,LOCAL --limit-iface-in",
    ),
    (
        "-m addrtype ! --src-type LOCAL,BROADCAST --dst-type LOCAL",
        "-m addrtype ! --dst-type LOCAL",
    ),
];

/// The node's local table for the addrtype matches: some pool addresses are local (one as a
/// prefix on lo), one on eth0.
fn node_facts() -> SetManager {
    let e = |net: &str, len: u8, kind: RouteType, dev: &str| LocalRoute {
        net: IpNet::new(net.parse().expect("address"), len).expect("prefix"),
        kind,
        iface: IfName::new(dev).expect("name"),
    };
    let m = SetManager::new();
    m.node_addrs().replace(AddrFacts::new([
        e("10.1.2.3", 32, RouteType::Local, "eth0"),
        e("10.1.3.0", 24, RouteType::Local, "lo"),
        e("10.1.3.255", 32, RouteType::Broadcast, "lo"),
        e("2001:db8:1:2::3", 128, RouteType::Local, "eth0"),
        e("fd00::", 8, RouteType::Local, "lo"),
        e("fe80::1", 128, RouteType::Local, "wlan0"),
    ]));
    m
}

fn rule_spec() -> impl Strategy<Value = RuleSpec> {
    let net = prop::option::weighted(0.5, (prop::bool::weighted(0.2), 0..NETS4.len()));
    let port = prop::option::weighted(
        0.5,
        (
            prop::bool::weighted(0.2),
            0..PORTS.len(),
            prop::bool::weighted(0.3),
        ),
    );
    (
        net.clone(),
        net,
        0u8..5,
        port.clone(),
        port,
        0u8..6,
        0u8..5,
        prop::sample::select(vec![0u8, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3]),
        prop::bool::weighted(0.08),
        0u8..12,
        0usize..3,
        0usize..(2 * HEADER_MATCHES.len() + 1),
    )
        .prop_map(
            |(src, dst, proto, sport, dport, iface, ctstate, mark, limit, target, to, header)| {
                RuleSpec {
                    src,
                    dst,
                    proto,
                    sport,
                    dport,
                    iface,
                    ctstate,
                    mark,
                    limit,
                    target,
                    to,
                    header,
                }
            },
        )
}

fn render(rules: &[Vec<RuleSpec>], policy_drop: bool, v6: bool) -> String {
    let nets = if v6 { &NETS6 } else { &NETS4 };
    let mut t = String::from("*filter\n");
    t += &format!(
        ":INPUT {} [0:0]\n",
        if policy_drop { "DROP" } else { "ACCEPT" }
    );
    t += ":FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n";
    for c in &CHAINS[1..] {
        t += &format!(":{c} - [0:0]\n");
    }
    for (ci, chain) in rules.iter().enumerate() {
        for r in chain {
            let mut l = format!("-A {}", CHAINS[ci]);
            let neg = |n: bool| if n { "! " } else { "" };
            if let Some((n, i)) = r.src {
                l += &format!(" {}-s {}", neg(n), nets[i]);
            }
            if let Some((n, i)) = r.dst {
                l += &format!(" {}-d {}", neg(n), nets[i]);
            }
            match r.iface {
                1 => l += " -i eth0",
                2 => l += " -i eth+",
                3 => l += " ! -i eth1",
                4 => l += " ! -i wl+",
                _ => {}
            }
            let icmp = if v6 { "ipv6-icmp" } else { "icmp" };
            let proto = match r.proto {
                1 => Some("tcp"),
                2 => Some("udp"),
                3 => Some(icmp),
                4 => {
                    l += " ! -p tcp";
                    None
                }
                _ => None,
            };
            if let Some(p) = proto {
                l += &format!(" -p {p}");
                if p == "tcp" || p == "udp" {
                    let ports = |(n, i, range): (bool, usize, bool), opt: &str| {
                        let v = if range {
                            format!("{}:{}", PORTS[i], PORTS[i] + 500)
                        } else {
                            PORTS[i].to_string()
                        };
                        format!(" {}{opt} {v}", neg(n))
                    };
                    let mut m = String::new();
                    if let Some(s) = r.sport {
                        m += &ports(s, "--sport");
                    }
                    if let Some(d) = r.dport {
                        m += &ports(d, "--dport");
                    }
                    if !m.is_empty() {
                        l += &format!(" -m {p}{m}");
                    }
                }
            }
            match r.ctstate {
                1 => l += " -m conntrack --ctstate NEW",
                2 => l += " -m conntrack --ctstate RELATED,ESTABLISHED",
                3 => l += " -m conntrack ! --ctstate NEW",
                _ => {}
            }
            match r.mark {
                1 => l += " -m mark --mark 0x1/0x1",
                2 => l += " -m connmark --mark 0x2/0x2",
                3 => l += " -m connmark ! --mark 0x1/0x3",
                _ => {}
            }
            if let Some(h) = r.header.checked_sub(1).and_then(|i| HEADER_MATCHES.get(i)) {
                l.push(' ');
                l += if v6 { h.1 } else { h.0 };
            }
            if r.limit {
                l += " -m limit --limit 2/sec --limit-burst 1";
            }
            let later = &CHAINS[ci + 1..];
            let target = match r.target {
                0 => " -j ACCEPT".to_string(),
                1 => " -j DROP".to_string(),
                2 => " -j RETURN".to_string(),
                3 => String::new(),
                4 => " -j LOG".to_string(),
                // Only forward jumps: no loops, so both walks terminate.
                5 | 6 if !later.is_empty() => {
                    let flag = if r.target == 5 { "-j" } else { "-g" };
                    format!(" {flag} {}", later[r.to % later.len()])
                }
                7 => " -j MARK --set-xmark 0x1/0x1".to_string(),
                8 => " -j MARK --xor-mark 0x3".to_string(),
                9 => " -j CONNMARK --save-mark --mask 0x3".to_string(),
                10 => " -j CONNMARK --restore-mark --nfmask 0x1 --ctmask 0x3".to_string(),
                11 => " -j CONNMARK --set-xmark 0x2/0x2".to_string(),
                _ => " -j ACCEPT".to_string(),
            };
            l += &target;
            t += &l;
            t.push('\n');
        }
    }
    t += "COMMIT\n";
    t
}

#[derive(Clone, Debug)]
struct PacketSpec {
    src: usize,
    dst: usize,
    proto: u8,
    sport: u16,
    dport: u16,
    iface: usize,
    ct: u8,
    mark: u32,
    /// Indexes into the TTL, TOS and IPv6 extension-header pools of [`packet`].
    header: (usize, usize, usize),
}

fn packet_spec() -> impl Strategy<Value = PacketSpec> {
    let port = prop_oneof![
        (0..PORTS.len()).prop_map(|i| PORTS[i]),
        (0..PORTS.len()).prop_map(|i| PORTS[i] + 500),
        (0..PORTS.len()).prop_map(|i| PORTS[i] + 501),
        any::<u16>(),
    ];
    (
        0..ADDRS4.len(),
        0..ADDRS4.len(),
        prop::sample::select(vec![6u8, 17, 1, 58, 47]),
        port.clone(),
        port,
        0usize..4,
        prop::sample::select(vec![
            ct_state::NEW,
            ct_state::ESTABLISHED,
            ct_state::RELATED,
        ]),
        0u32..3,
        (0usize..3, 0usize..4, 0usize..4),
    )
        .prop_map(
            |(src, dst, proto, sport, dport, iface, ct, mark, header)| PacketSpec {
                src,
                dst,
                proto,
                sport,
                dport,
                iface,
                ct,
                mark,
                header,
            },
        )
}

fn packet(s: &PacketSpec, v6: bool) -> Packet {
    let addrs = if v6 { &ADDRS6 } else { &ADDRS4 };
    let ip = |i: usize| -> IpAddr { addrs[i].parse().expect("pool address") };
    Packet {
        meta: PacketMeta {
            family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
            hook: Hook::Input,
            src: ip(s.src),
            dst: ip(s.dst),
            protocol: s.proto,
            sport: s.sport,
            dport: s.dport,
            len: 100,
            ct_state: s.ct,
            ct_mark: (s.mark + u32::from(s.sport)) % 4,
            mark: s.mark,
            ttl: [64, 1, 200][s.header.0],
            tos: [0, 0x10, 0xb8, 0x01][s.header.1],
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new(["eth0", "eth1", "wlan0", "lo"][s.iface]).expect("short name"),
            ipv6_ext: if v6 {
                ipv6_ext(s.header.2)
            } else {
                Ipv6Ext::default()
            },
            ..PacketFacts::default()
        },
    }
}

/// None, hop-by-hop, a first fragment with M set, a type-0 routing header with 2 segments
/// left; each followed by the upper layer.
fn ipv6_ext(i: usize) -> Ipv6Ext {
    let mask = [0, ipv6_ext::HOPOPTS, ipv6_ext::FRAGMENT, ipv6_ext::ROUTING][i] | ipv6_ext::PROTO;
    Ipv6Ext {
        mask,
        fragment: (i == 2).then_some(FragmentHeader {
            id: 7,
            offset_flags: 1,
            reserved: 0,
        }),
        routing: (i == 3).then_some(RoutingHeader {
            rt_type: 0,
            segments_left: 2,
            len: 24,
        }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn tuplemerge_equals_linear(
        chains in prop::collection::vec(prop::collection::vec(rule_spec(), 0..24), 4),
        policy_drop in any::<bool>(),
        v6 in any::<bool>(),
        packets in prop::collection::vec(packet_spec(), 1..48),
    ) {
        let text = render(&chains, policy_drop, v6);
        let opts = ParseOptions {
            family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
            ..ParseOptions::default()
        };
        let rs = Arc::new(parse_ruleset("prop", &text, &opts).unwrap_or_else(|e| panic!("{e}\n{text}")));
        // TupleMerge alone, then with RFC tables (every IPv4 chain here is small enough).
        for rfc_max_rules in [0, RFC_MAX_RULES] {
            let classifier = Classifier::TupleMerge { min_rules: 0, batch_min_bytes: 0, rfc_min_rules: 0, rfc_max_rules };
            let linear = Snapshot::compile_with(std::slice::from_ref(&rs), &node_facts(), 1, Classifier::Linear)
                .expect("compiles");
            let indexed = Snapshot::compile_with(std::slice::from_ref(&rs), &node_facts(), 1, classifier)
                .expect("compiles");
            if rfc_max_rules > 0 && !v6 && chains.iter().any(|c| !c.is_empty()) {
                prop_assert!(indexed.memory_bytes().rfc_chains > 0, "no RFC tables built");
            }
            for (i, s) in packets.iter().enumerate() {
                let p = packet(s, v6);
                let now = i as u64 * 300_000_000;
                prop_assert_eq!(indexed.trace(&p, now), linear.trace(&p, now), "rfc {} packet {:?}\n{}", rfc_max_rules, p, text);
            }
            let (mut logs_l, mut logs_i) = (Vec::new(), Vec::new());
            for (i, s) in packets.iter().enumerate() {
                let now = i as u64 * 300_000_000;
                let (mut a, mut b) = (packet(s, v6), packet(s, v6));
                let vl = crate::support::classify_one(&linear, 0, &mut a, now, &mut logs_l);
                let vi = crate::support::classify_one(&indexed, 0, &mut b, now, &mut logs_i);
                prop_assert_eq!(vi, vl, "rfc {} packet {:?}\n{}", rfc_max_rules, a, text);
                prop_assert_eq!((b.mark, b.ct_mark), (a.mark, a.ct_mark));
            }
            prop_assert_eq!(logs_i, logs_l);
            prop_assert_eq!(indexed.counters(), linear.counters());
        }
    }
}

/// The ruleset of [`render`] with the INPUT rules copied into FORWARD (policy ACCEPT), so a
/// batch holds packets bound for two different indexed base chains.
fn render_with_forward(rules: &[Vec<RuleSpec>], policy_drop: bool, v6: bool) -> String {
    let text = render(rules, policy_drop, v6);
    let forward: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("-A INPUT"))
        .map(|rest| format!("-A FORWARD{rest}\n"))
        .collect();
    text.replace("COMMIT\n", &format!("{forward}COMMIT\n"))
}

/// The state `after_raw` gives a packet: not the one it came with, so a `--ctstate` rule
/// must be decided after the batch probe.
/// The conntrack step of the property below: sets a `ct_state` (and `ct_mark`) from the
/// packet between the raw and the filter chains, and counts the verdicts it is told.
#[derive(Default)]
struct SetState {
    decided: usize,
}

impl Track<'_> for SetState {
    fn lookup(&mut self, p: &mut PacketMeta, _: &PacketFacts, _: u64) -> Option<Verdict> {
        p.ct_state = tracked_state(p);
        p.ct_mark = u32::from(p.sport % 4);
        None
    }

    fn decided(&mut self, _: &mut PacketMeta, _: &PacketFacts, v: Verdict, _: u64) -> Verdict {
        self.decided += 1;
        v
    }
}

fn tracked_state(p: &PacketMeta) -> u8 {
    match (p.sport ^ p.dport) % 3 {
        0 => ct_state::NEW,
        1 => ct_state::ESTABLISHED,
        _ => ct_state::RELATED,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `classify_batch` (batched index probes) gives, packet by packet, what it gives one
    /// packet at a time without the batched probe (and what the linear walk gives), on one snapshot holding an IPv4 and an IPv6 ruleset, with
    /// packets of both families at INPUT (policy from the case) and FORWARD (ACCEPT), a
    /// `ct_state` changed between the raw and the filter chains, a moving clock for `-m limit`,
    /// and batches cut at odd sizes. Verdicts, the packets' `ct_state`, LOG events and counters
    /// must be equal, and equal to the linear walk's.
    #[test]
    fn batched_equals_per_packet(
        chains in prop::collection::vec(prop::collection::vec(rule_spec(), 0..24), 4),
        policy_drop in any::<bool>(),
        packets in prop::collection::vec((packet_spec(), any::<bool>(), any::<bool>()), 1..150),
        cut in 1usize..80,
    ) {
        let mut rulesets = Vec::new();
        for v6 in [false, true] {
            let text = render_with_forward(&chains, policy_drop, v6);
            let opts = ParseOptions {
                family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
                ..ParseOptions::default()
            };
            let name = if v6 { "prop6" } else { "prop4" };
            rulesets.push(Arc::new(
                parse_ruleset(name, &text, &opts).unwrap_or_else(|e| panic!("{e}\n{text}")),
            ));
        }
        let linear = Snapshot::compile_with(&rulesets, &node_facts(), 1, Classifier::Linear)
            .expect("compiles");
        // Indexed, never probed in batches: every query is the per-packet lookup.
        let single = Snapshot::compile_with(&rulesets, &node_facts(), 1, Classifier::TupleMerge { min_rules: 0, batch_min_bytes: usize::MAX, rfc_min_rules: 0, rfc_max_rules: 0 })
            .expect("compiles");
        // RFC tables on the IPv4 chains (never probed in batches), batched probes on the IPv6 ones.
        let batched = Snapshot::compile_with(&rulesets, &node_facts(), 1, Classifier::TupleMerge { min_rules: 0, batch_min_bytes: 0, rfc_min_rules: 0, rfc_max_rules: RFC_MAX_RULES })
            .expect("compiles");
        let packets: Vec<Packet> = packets
            .iter()
            .map(|(s, v6, forward)| {
                let mut p = packet(s, *v6);
                p.hook = if *forward { Hook::Forward } else { Hook::Input };
                p
            })
            .collect();
        let (mut logs_l, mut logs_s, mut logs_b) = (Vec::new(), Vec::new(), Vec::new());
        // Batches of `cut` packets, each batch at its own time (500 ms apart, so `-m limit`
        // refills between some batches and not within one).
        for (c, chunk) in packets.chunks(cut).enumerate() {
            let t = c as u64 * 500_000_000;
            // The batch as a source hands it over: the hot parts, and the facts beside them.
            let mut buf: Vec<PacketMeta> = chunk.iter().map(|p| p.meta).collect();
            let mut facts: Vec<PacketFacts> = chunk.iter().map(|p| p.facts).collect();
            let mut verdicts = vec![Verdict::Accept; buf.len()];
            let mut track = SetState::default();
            let n = batched.classify_batch(0, &mut buf, &mut facts, &mut verdicts, t, &mut logs_b, &[], &mut track);
            prop_assert_eq!(n, chunk.len());
            prop_assert_eq!(track.decided, chunk.len());
            for (i, p) in chunk.iter().enumerate() {
                let (mut a, mut b) = (*p, *p);
                let one = |snap: &Snapshot, p: &mut Packet, logs: &mut Vec<_>| {
                    let mut v = [Verdict::Accept];
                    let (m, f) = (std::slice::from_mut(&mut p.meta), std::slice::from_mut(&mut p.facts));
                    snap.classify_batch(0, m, f, &mut v, t, logs, &[], &mut SetState::default());
                    v[0]
                };
                let vl = one(&linear, &mut a, &mut logs_l);
                let vs = one(&single, &mut b, &mut logs_s);
                prop_assert_eq!(vs, vl, "packet {:?}", p);
                prop_assert_eq!(verdicts[i], vl, "packet {:?}", p);
                prop_assert_eq!(b.ct_state, a.ct_state);
                prop_assert_eq!(buf[i].ct_state, a.ct_state);
                prop_assert_eq!((b.mark, b.ct_mark), (a.mark, a.ct_mark));
                prop_assert_eq!((buf[i].mark, buf[i].ct_mark), (a.mark, a.ct_mark));
            }
        }
        prop_assert_eq!(&logs_s, &logs_l);
        prop_assert_eq!(&logs_b, &logs_l);
        prop_assert_eq!(single.counters(), linear.counters());
        prop_assert_eq!(batched.counters(), linear.counters());
    }
}
