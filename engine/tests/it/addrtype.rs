//! `-m addrtype`: parsed with libxt_addrtype's revision-1 grammar (iptables 1.8.9), printed as
//! `iptables-legacy-save` 1.8.9 printed each rule below (recorded with iptables-legacy-restore /
//! -save in a scratch namespace), refused where iptables or the kernel refuses, refused in
//! filter/raw for the types the engine cannot decide, and enforced against the node's address
//! facts in the linear walk and the compiled index alike; replacing the facts changes verdicts
//! without a commit.

use std::net::IpAddr;
use std::sync::Arc;

use vallum_engine::model::{Family, Hook, IpNet};
use vallum_engine::node_addrs::{AddrFacts, LocalRoute, RouteType};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::parse_ruleset;
use vallum_engine::sets::{NoSets, SetManager};
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::{Severity, validate};

use crate::support::one_rule;
use one_rule::{opts, printed};

/// (family, as written, as iptables-legacy-save 1.8.9 prints it).
const SAVE_FORMS: &[(Family, &str, &str)] = &[
    (
        Family::Ipv4,
        "-m addrtype --src-type loc",
        "-m addrtype --src-type LOCAL",
    ),
    (
        Family::Ipv4,
        "-m addrtype ! --dst-type ANYCAST,LOCAL",
        "-m addrtype ! --dst-type LOCAL,ANYCAST",
    ),
    (
        Family::Ipv4,
        "-m addrtype --dst-type local,unspec ! --src-type multicast --limit-iface-in",
        "-m addrtype ! --src-type MULTICAST --dst-type UNSPEC,LOCAL --limit-iface-in",
    ),
    (
        Family::Ipv4,
        "-m addrtype --dst-type U",
        "-m addrtype --dst-type UNSPEC",
    ),
    (
        Family::Ipv4,
        "-m addrtype --dst-type LOCAL,LOCAL",
        "-m addrtype --dst-type LOCAL",
    ),
    (
        Family::Ipv4,
        "-m addrtype --dst-type xresolve,blackhole,prohibit,throw,nat,unreachable,broadcast",
        "-m addrtype --dst-type BROADCAST,BLACKHOLE,UNREACHABLE,PROHIBIT,THROW,NAT,XRESOLVE",
    ),
    (
        Family::Ipv6,
        "-m addrtype --dst-type ANYCAST",
        "-m addrtype --dst-type ANYCAST",
    ),
    (
        Family::Ipv6,
        "-m addrtype --src-type UNICAST,LOCAL",
        "-m addrtype --src-type UNICAST,LOCAL",
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
fn refused_as_iptables_refuses() {
    for (family, rule, says) in [
        (Family::Ipv4, "-m addrtype", "at least one option"),
        (
            Family::Ipv4,
            "-m addrtype --limit-iface-in",
            "--src-type or --dst-type",
        ),
        (
            Family::Ipv4,
            "-m addrtype --src-type wrong",
            "bad type \"wrong\"",
        ),
        (
            Family::Ipv4,
            "-m addrtype --dst-type LOCAL,",
            "bad type \"\"",
        ),
        (
            Family::Ipv4,
            "-m addrtype --src-type LOCAL --src-type UNICAST",
            "--src-type",
        ),
        (
            Family::Ipv4,
            "-m addrtype --src-type LOCAL --limit-iface-in --limit-iface-out",
            "cannot be used together",
        ),
        (
            Family::Ipv4,
            "-m addrtype --src-type LOCAL ! --limit-iface-in",
            "cannot be inverted",
        ),
        (Family::Ipv4, "-m addrtype --src-type", "--src-type"),
        (
            Family::Ipv6,
            "-m addrtype --dst-type BROADCAST",
            "BROADCAST",
        ),
        (
            Family::Ipv6,
            "-m addrtype --dst-type BLACKHOLE",
            "BLACKHOLE",
        ),
        (
            Family::Ipv6,
            "-m addrtype --dst-type LOCAL,PROHIBIT",
            "PROHIBIT",
        ),
    ] {
        match printed(family, rule) {
            Ok(p) => panic!("{rule}: accepted as {p}"),
            Err(e) => assert!(e.contains(says), "{rule}: {e}"),
        }
    }
}

fn errors(family: Family, table: &str, chain: &str, rule: &str, with_addrs: bool) -> Vec<String> {
    let text = format!("*{table}\n:{chain} ACCEPT [0:0]\n-A {chain} {rule}\nCOMMIT\n");
    let rs = parse_ruleset("t", &text, &opts(family)).expect("parses");
    let mgr = SetManager::new();
    let reg: &dyn vallum_engine::sets::SetRegistry = if with_addrs { &mgr } else { &NoSets };
    validate(&rs, Some(reg))
        .into_iter()
        .filter(|v| v.severity == Severity::Error)
        .map(|v| v.to_string())
        .collect()
}

#[test]
fn undecidable_types_and_wrong_hooks_are_refused() {
    let v4 = Family::Ipv4;
    // IPv4: every type is the local table's (BLACKHOLE..XRESOLVE never match): accepted.
    for rule in [
        "-m addrtype ! --dst-type LOCAL,ANYCAST,NAT",
        "-m addrtype --src-type BLACKHOLE",
    ] {
        let e = errors(v4, "raw", "PREROUTING", rule, true);
        assert!(e.is_empty(), "{rule}: {e:?}");
    }
    // IPv6 ANYCAST and UNREACHABLE need a lookup in the whole routing table: refused.
    let e = errors(
        Family::Ipv6,
        "filter",
        "INPUT",
        "-m addrtype ! --dst-type LOCAL,ANYCAST,UNREACHABLE",
        true,
    );
    assert!(
        e.len() == 1 && e[0].contains("addrtype ANYCAST,UNREACHABLE") && e[0].contains("filter"),
        "{e:?}"
    );
    // nat stores them (kube-proxy, Docker).
    assert!(
        errors(
            v4,
            "nat",
            "PREROUTING",
            "-m addrtype --dst-type LOCAL,ANYCAST",
            true
        )
        .is_empty()
    );
    // As addrtype_mt_checkentry.
    let e = errors(
        v4,
        "filter",
        "INPUT",
        "-m addrtype --dst-type LOCAL --limit-iface-out",
        true,
    );
    assert!(
        e.len() == 1 && e[0].contains("--limit-iface-out") && e[0].contains("INPUT"),
        "{e:?}"
    );
    let e = errors(
        v4,
        "filter",
        "OUTPUT",
        "-m addrtype --dst-type LOCAL --limit-iface-in",
        true,
    );
    assert!(
        e.len() == 1 && e[0].contains("--limit-iface-in") && e[0].contains("OUTPUT"),
        "{e:?}"
    );
    assert!(
        errors(
            v4,
            "filter",
            "FORWARD",
            "-m addrtype --dst-type LOCAL --limit-iface-out",
            true
        )
        .is_empty()
    );
    // Without the node's addresses, only the types the address bits decide are accepted.
    let e = errors(v4, "filter", "INPUT", "-m addrtype --dst-type LOCAL", false);
    assert!(e.len() == 1 && e[0].contains("node's addresses"), "{e:?}");
    assert!(
        errors(
            v4,
            "filter",
            "INPUT",
            "-m addrtype --dst-type MULTICAST",
            false
        )
        .is_empty()
    );
    let v6 = Family::Ipv6;
    assert!(
        errors(
            v6,
            "filter",
            "INPUT",
            "-m addrtype --dst-type UNICAST",
            false
        )
        .is_empty()
    );
    let e = errors(
        v6,
        "filter",
        "INPUT",
        "-m addrtype --dst-type UNREACHABLE",
        true,
    );
    assert!(e.len() == 1 && e[0].contains("UNREACHABLE"), "{e:?}");
}

fn route(net: &str, len: u8, kind: RouteType, dev: &str) -> LocalRoute {
    LocalRoute {
        net: IpNet::new(net.parse().unwrap(), len).unwrap(),
        kind,
        iface: IfName::new(dev).unwrap(),
    }
}

/// eth0 10.0.0.5/24 (broadcast 10.0.0.255) and 2001:db8::5/64, lo 127.0.0.1/8 and ::1.
fn host() -> AddrFacts {
    AddrFacts::new([
        route("10.0.0.5", 32, RouteType::Local, "eth0"),
        route("10.0.0.255", 32, RouteType::Broadcast, "eth0"),
        route("127.0.0.0", 8, RouteType::Local, "lo"),
        route("127.255.255.255", 32, RouteType::Broadcast, "lo"),
        route("::1", 128, RouteType::Local, "lo"),
        route("2001:db8::5", 128, RouteType::Local, "eth0"),
    ])
}

fn packet(hook: Hook, src: &str, dst: &str, iif: &str) -> Packet {
    let src: IpAddr = src.parse().unwrap();
    Packet {
        meta: PacketMeta {
            family: if src.is_ipv6() {
                Family::Ipv6
            } else {
                Family::Ipv4
            },
            hook,
            src,
            dst: dst.parse().unwrap(),
            protocol: 17,
            len: 40,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new(iif).unwrap(),
            ..PacketFacts::default()
        },
    }
}

/// Which rule of `chain` (1-based) each packet hits first, `0` for the policy, in the linear
/// walk and the compiled index (they must agree); the snapshots read `mgr`'s address facts.
fn first_hits(
    family: Family,
    chain: &str,
    rules: &[&str],
    mgr: &SetManager,
    packets: &[Packet],
) -> Vec<usize> {
    let mut text = format!("*filter\n:{chain} ACCEPT [0:0]\n");
    for r in rules {
        text.push_str(&format!("-A {chain} {r} -j DROP\n"));
    }
    text.push_str("COMMIT\n");
    let rs = Arc::new(parse_ruleset("t", &text, &opts(family)).expect("parses"));
    let errs: Vec<_> = validate(&rs, Some(mgr))
        .into_iter()
        .filter(|v| v.severity == Severity::Error)
        .collect();
    assert!(errs.is_empty(), "{errs:?}");
    let index = Classifier::TupleMerge {
        min_rules: 1,
        batch_min_bytes: 0,
        rfc_min_rules: 1,
        rfc_max_rules: 1000,
    };
    let snaps: Vec<Snapshot> = [Classifier::Linear, index]
        .into_iter()
        .map(|c| Snapshot::compile_with(std::slice::from_ref(&rs), mgr, 1, c).expect("compiles"))
        .collect();
    packets
        .iter()
        .map(|p| {
            let hits: Vec<usize> = snaps
                .iter()
                .map(|s| {
                    let t = s.trace(p, 0);
                    let hit = t.steps.first().and_then(|st| st.rule).unwrap_or(0) as usize;
                    let mut p2 = *p;
                    let v = crate::support::classify_one(s, 0, &mut p2, 0, &mut Vec::new());
                    assert_eq!(v == Verdict::Drop, hit != 0, "verdict and trace agree");
                    hit
                })
                .collect();
            assert_eq!(hits[0], hits[1], "linear and index agree on {p:?}");
            hits[0]
        })
        .collect()
}

#[test]
fn ufw_style_ipv4_rules_follow_the_node_addresses() {
    let mgr = SetManager::new();
    mgr.node_addrs().replace(host());
    // ufw's before.rules / after.rules and Calico's shapes.
    let rules = [
        "-m addrtype --dst-type BROADCAST",
        "-m addrtype --dst-type MULTICAST",
        "-m addrtype ! --dst-type LOCAL",
        "-m addrtype --src-type LOCAL --dst-type LOCAL",
        "-m addrtype --dst-type LOCAL --limit-iface-in",
        "-m addrtype --src-type UNSPEC",
    ];
    let i = Hook::Input;
    let packets = [
        packet(i, "192.0.2.1", "10.0.0.255", "eth0"),
        packet(i, "192.0.2.1", "255.255.255.255", "eth0"),
        packet(i, "192.0.2.1", "0.0.0.0", "eth0"),
        packet(i, "192.0.2.1", "224.0.0.251", "eth0"),
        packet(i, "192.0.2.1", "10.0.0.6", "eth0"),
        packet(i, "127.0.0.1", "127.0.0.53", "lo"),
        packet(i, "192.0.2.1", "10.0.0.5", "eth0"),
        packet(i, "192.0.2.1", "10.0.0.5", "eth1"),
    ];
    assert_eq!(
        first_hits(Family::Ipv4, "INPUT", &rules, &mgr, &packets),
        [1, 1, 1, 2, 3, 4, 5, 0]
    );
    // New addresses (a DHCP renewal) take effect at once, without a commit; the old local
    // address is now UNICAST.
    let rules = ["! -i eth9 -m addrtype ! --dst-type LOCAL"];
    let packets = [packet(i, "192.0.2.1", "10.0.0.5", "eth0")];
    let rs = Arc::new(
        parse_ruleset(
            "t",
            &format!(
                "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT {} -j DROP\nCOMMIT\n",
                rules[0]
            ),
            &opts(Family::Ipv4),
        )
        .unwrap(),
    );
    let s = Snapshot::compile(std::slice::from_ref(&rs), &mgr, 1).unwrap();
    assert_eq!(s.trace(&packets[0], 0).verdict, Verdict::Accept);
    mgr.node_addrs().replace(AddrFacts::new([route(
        "10.0.0.7",
        32,
        RouteType::Local,
        "eth0",
    )]));
    assert_eq!(s.trace(&packets[0], 0).verdict, Verdict::Drop);
}

#[test]
fn ipv6_rules_follow_match_type6() {
    let mgr = SetManager::new();
    mgr.node_addrs().replace(host());
    let rules = [
        "-m addrtype --src-type UNSPEC",
        "-m addrtype --dst-type MULTICAST",
        "-m addrtype --dst-type UNICAST,LOCAL --limit-iface-in",
        "-m addrtype ! --dst-type LOCAL",
    ];
    let i = Hook::Input;
    let packets = [
        packet(i, "::", "ff02::1:ff00:5", "eth0"),
        packet(i, "fe80::1", "ff02::1", "eth0"),
        packet(i, "fe80::1", "2001:db8::5", "eth0"),
        packet(i, "fe80::1", "2001:db8::5", "eth1"),
        packet(i, "fe80::1", "2001:db8::6", "eth0"),
        packet(i, "::1", "::1", "lo"),
    ];
    assert_eq!(
        first_hits(Family::Ipv6, "INPUT", &rules, &mgr, &packets),
        [1, 2, 3, 0, 4, 3]
    );
}

#[test]
fn forward_limits_to_the_output_device() {
    let mgr = SetManager::new();
    mgr.node_addrs().replace(host());
    let rules = ["-m addrtype --dst-type BROADCAST --limit-iface-out"];
    let mut on_eth0 = packet(Hook::Forward, "192.0.2.1", "10.0.0.255", "eth1");
    on_eth0.facts.out_iface = IfName::new("eth0").unwrap();
    let mut on_eth2 = on_eth0;
    on_eth2.facts.out_iface = IfName::new("eth2").unwrap();
    assert_eq!(
        first_hits(Family::Ipv4, "FORWARD", &rules, &mgr, &[on_eth0, on_eth2]),
        [1, 0]
    );
}
