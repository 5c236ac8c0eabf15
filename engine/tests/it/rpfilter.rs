//! `-m rpfilter` and `-m pkttype`: parsed with libxt_rpfilter's / libxt_pkttype's grammar
//! (iptables 1.8.9), printed as `iptables-legacy-save` 1.8.9 printed each rule below (recorded
//! with iptables-legacy / -save in a scratch namespace), refused where iptables or the kernel
//! refuses, and enforced against the node's routing view and address facts in the linear
//! walk and the compiled index alike; replacing the routes changes verdicts without a commit.

use std::net::IpAddr;
use std::sync::Arc;

use vallum_engine::fib::{Fib, Route, RouteKind};
use vallum_engine::model::{Family, Hook, IpNet};
use vallum_engine::node_addrs::{AddrFacts, LocalRoute, RouteType};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::parse_ruleset;
use vallum_engine::sets::{NoSets, SetManager, SetRegistry};
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::{Severity, validate};

use crate::support::one_rule;
use one_rule::{opts, printed};

/// (family, as written, as iptables-legacy-save 1.8.9 prints it).
const SAVE_FORMS: &[(Family, &str, &str)] = &[
    (Family::Ipv4, "-m rpfilter", "-m rpfilter"),
    (
        Family::Ipv4,
        "-m rpfilter --invert --accept-local --validmark --loose",
        "-m rpfilter --loose --validmark --accept-local --invert",
    ),
    (Family::Ipv6, "-m rpfilter --loose", "-m rpfilter --loose"),
    (
        Family::Ipv4,
        "-m pkttype ! --pkt-type BCAST",
        "-m pkttype ! --pkt-type broadcast",
    ),
    (
        Family::Ipv4,
        "-m pkttype --pkt-type host",
        "-m pkttype --pkt-type unicast",
    ),
    (
        Family::Ipv4,
        "-m pkttype --pkt-type mcast",
        "-m pkttype --pkt-type multicast",
    ),
    (
        Family::Ipv6,
        "-m pkttype --pkt-type multicast",
        "-m pkttype --pkt-type multicast",
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
    for (rule, says) in [
        ("-m rpfilter ! --loose", "cannot be inverted"),
        ("-m rpfilter --loose --loose", "--loose"),
        ("-m rpfilter --strict", "--strict"),
        ("-m pkttype", "needs at least one option"),
        ("-m pkttype --pkt-type wrong", "Bad packet type 'wrong'"),
        (
            "-m pkttype --pkt-type broadcast --pkt-type unicast",
            "--pkt-type",
        ),
    ] {
        match printed(Family::Ipv4, rule) {
            Ok(p) => panic!("{rule}: accepted as {p}"),
            Err(e) => assert!(e.contains(says), "{rule}: {e}"),
        }
    }
}

fn findings(
    table: &str,
    chain: &str,
    rule: &str,
    reg: &dyn SetRegistry,
    severity: Severity,
) -> Vec<String> {
    let text = format!("*{table}\n:{chain} ACCEPT [0:0]\n-A {chain} {rule}\nCOMMIT\n");
    let rs = parse_ruleset("t", &text, &opts(Family::Ipv4)).expect("parses");
    validate(&rs, Some(reg))
        .into_iter()
        .filter(|v| v.severity == severity)
        .map(|v| v.to_string())
        .collect()
}

#[test]
fn tables_hooks_and_missing_views_are_refused() {
    let with_routes = SetManager::new();
    with_routes
        .node_addrs()
        .replace_routes(Some(Fib::with_default_rules([])));
    let no_routes = SetManager::new();
    let err = Severity::Error;
    // As the kernel's rpfilter_check and hook mask.
    let e = findings("filter", "INPUT", "-m rpfilter -j DROP", &with_routes, err);
    assert!(
        e.len() == 2
            && e.iter()
                .any(|e| e.contains("only valid in tables raw and mangle")),
        "{e:?}"
    );
    let e = findings("raw", "OUTPUT", "-m rpfilter -j DROP", &with_routes, err);
    assert!(e.len() == 1 && e[0].contains("OUTPUT"), "{e:?}");
    assert!(
        findings(
            "raw",
            "PREROUTING",
            "-m rpfilter --invert -j DROP",
            &with_routes,
            err
        )
        .is_empty()
    );
    // mangle stores it (firewalld's nftables-less fallback writes it there too).
    assert!(
        findings(
            "mangle",
            "PREROUTING",
            "-m rpfilter -j DROP",
            &no_routes,
            err
        )
        .is_empty()
    );
    // No routing view: refused, saying where vallumd gets one.
    for reg in [&no_routes as &dyn SetRegistry, &NoSets] {
        let e = findings(
            "raw",
            "PREROUTING",
            "-m rpfilter --invert -j DROP",
            reg,
            err,
        );
        assert!(e.len() == 1 && e[0].contains("--routes"), "{e:?}");
    }
    // pkttype: accepted with the node's addresses, with a warning where the class is derived.
    let w = findings(
        "filter",
        "INPUT",
        "-m pkttype --pkt-type broadcast -j DROP",
        &no_routes,
        Severity::Warning,
    );
    assert!(
        w.len() == 1 && w[0].contains("an L2 broadcast or multicast carrying a unicast IP"),
        "{w:?}"
    );
    assert!(
        findings(
            "filter",
            "INPUT",
            "-m pkttype --pkt-type broadcast",
            &no_routes,
            err
        )
        .is_empty()
    );
    let e = findings(
        "filter",
        "INPUT",
        "-m pkttype --pkt-type broadcast",
        &NoSets,
        err,
    );
    assert!(
        e.len() == 1 && e[0].contains("broadcast addresses"),
        "{e:?}"
    );
    // Forwarded packets are always unicast: nothing derived, no warning.
    assert!(
        findings(
            "filter",
            "FORWARD",
            "-m pkttype --pkt-type unicast",
            &no_routes,
            Severity::Warning
        )
        .is_empty()
    );
}

fn route(table: u32, net: &str, kind: RouteKind, devs: &[&str]) -> Route {
    let (a, l) = net.split_once('/').unwrap_or((net, ""));
    let a: IpAddr = a.parse().unwrap();
    Route {
        table,
        net: IpNet::new(a, l.parse().unwrap_or(if a.is_ipv4() { 32 } else { 128 })).unwrap(),
        kind,
        metric: 0,
        devs: devs.iter().map(|d| IfName::new(d).unwrap()).collect(),
    }
}

/// A router: eth0 10.0.0.5/24 (the default route), eth1 192.168.1.5/24; IPv6 eth0
/// 2001:db8::5/64 (the default route), fe80::/64 on both.
fn router() -> Fib {
    use RouteKind::*;
    Fib::with_default_rules([
        route(255, "10.0.0.5", Local, &["eth0"]),
        route(255, "10.0.0.255", Broadcast, &["eth0"]),
        route(255, "192.168.1.5", Local, &["eth1"]),
        route(255, "192.168.1.255", Broadcast, &["eth1"]),
        route(255, "127.0.0.0/8", Local, &["lo"]),
        route(254, "0.0.0.0/0", Unicast, &["eth0"]),
        route(254, "10.0.0.0/24", Unicast, &["eth0"]),
        route(254, "192.168.1.0/24", Unicast, &["eth1"]),
        route(255, "2001:db8::5", Local, &["eth0"]),
        route(254, "2001:db8::/64", Unicast, &["eth0"]),
        route(254, "::/0", Unicast, &["eth0"]),
        route(254, "fe80::/64", Unicast, &["eth0"]),
        route(254, "fe80::/64", Unicast, &["eth1"]),
    ])
}

fn local_table() -> AddrFacts {
    let r = |net: &str, len, kind, dev| LocalRoute {
        net: IpNet::new(net.parse().unwrap(), len).unwrap(),
        kind,
        iface: IfName::new(dev).unwrap(),
    };
    AddrFacts::new([
        r("10.0.0.5", 32, RouteType::Local, "eth0"),
        r("10.0.0.255", 32, RouteType::Broadcast, "eth0"),
        r("192.168.1.255", 32, RouteType::Broadcast, "eth1"),
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

/// Which rule of `table`/`chain` (1-based) each packet hits first, `0` for the policy, in
/// the linear walk and the compiled index (they must agree).
fn first_hits(
    family: Family,
    table: &str,
    chain: &str,
    rules: &[&str],
    mgr: &SetManager,
    packets: &[Packet],
) -> Vec<usize> {
    let mut text = format!("*{table}\n:{chain} ACCEPT [0:0]\n");
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
                    assert_eq!(
                        v == Verdict::Drop,
                        hit != 0,
                        "verdict and trace agree on {p:?}"
                    );
                    hit
                })
                .collect();
            assert_eq!(hits[0], hits[1], "linear and index agree on {p:?}");
            hits[0]
        })
        .collect()
}

#[test]
fn rpfilter_drops_spoofed_sources_as_the_kernel() {
    let mgr = SetManager::new();
    mgr.node_addrs().replace_routes(Some(router()));
    let p = Hook::Prerouting;
    // firewalld's IPv6 rule and Calico's, each with a near miss in front.
    let rules = ["-s 10.9.9.9/32 -m rpfilter", "-m rpfilter --invert"];
    let packets = [
        packet(p, "8.8.8.8", "10.0.0.5", "eth0"),
        packet(p, "8.8.8.8", "192.168.1.5", "eth1"),
        packet(p, "192.168.1.7", "192.168.1.5", "eth1"),
        packet(p, "192.168.1.7", "10.0.0.5", "eth0"),
        packet(p, "10.0.0.5", "10.0.0.5", "eth0"),
        packet(p, "10.0.0.5", "10.0.0.5", "lo"),
        packet(p, "0.0.0.0", "255.255.255.255", "eth1"),
        packet(p, "10.9.9.9", "10.0.0.5", "eth0"),
    ];
    assert_eq!(
        first_hits(Family::Ipv4, "raw", "PREROUTING", &rules, &mgr, &packets),
        [0, 2, 0, 2, 2, 0, 0, 1]
    );
    let rules = ["-m rpfilter --loose --accept-local --invert"];
    assert_eq!(
        first_hits(Family::Ipv4, "raw", "PREROUTING", &rules, &mgr, &packets),
        [0, 0, 0, 0, 0, 0, 0, 0]
    );
    let rules = ["-m rpfilter --invert"];
    let packets = [
        packet(p, "2001:db8::7", "2001:db8::5", "eth0"),
        packet(p, "2001:db8::7", "2001:db8::5", "eth1"),
        packet(p, "fe80::1", "ff02::1", "eth1"),
        packet(p, "::", "ff02::1:ff00:5", "eth1"),
        packet(p, "2001:db8::5", "2001:db8::5", "eth0"),
    ];
    assert_eq!(
        first_hits(Family::Ipv6, "raw", "PREROUTING", &rules, &mgr, &packets),
        [0, 1, 0, 0, 1]
    );
}

#[test]
fn rpfilter_follows_new_routes_without_a_commit() {
    let mgr = SetManager::new();
    mgr.node_addrs().replace_routes(Some(router()));
    let text =
        "*raw\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m rpfilter --invert -j DROP\nCOMMIT\n";
    let rs = Arc::new(parse_ruleset("t", text, &opts(Family::Ipv4)).unwrap());
    let s = Snapshot::compile(std::slice::from_ref(&rs), &mgr, 1).unwrap();
    // INPUT-queued: raw PREROUTING runs first.
    let pkt = packet(Hook::Input, "172.20.0.9", "10.0.0.5", "wg0");
    assert_eq!(s.trace(&pkt, 0).verdict, Verdict::Drop);
    let mut routes: Vec<Route> = vec![route(254, "172.20.0.0/16", RouteKind::Unicast, &["wg0"])];
    routes.push(route(254, "0.0.0.0/0", RouteKind::Unicast, &["eth0"]));
    assert!(
        mgr.node_addrs()
            .replace_routes(Some(Fib::with_default_rules(routes)))
    );
    assert_eq!(s.trace(&pkt, 0).verdict, Verdict::Accept);
}

#[test]
fn pkttype_classes_from_the_destination() {
    let mgr = SetManager::new();
    mgr.node_addrs().replace(local_table());
    let rules = [
        "-m pkttype --pkt-type broadcast",
        "-m pkttype --pkt-type multicast",
        "-m pkttype ! --pkt-type unicast",
    ];
    let i = Hook::Input;
    let packets = [
        packet(i, "10.0.0.9", "10.0.0.255", "eth0"),
        packet(i, "10.0.0.9", "255.255.255.255", "eth0"),
        packet(i, "192.168.1.9", "192.168.1.255", "eth1"),
        packet(i, "10.0.0.9", "224.0.0.251", "eth0"),
        packet(i, "10.0.0.9", "10.0.0.5", "eth0"),
        // Not a broadcast address of the node: unicast.
        packet(i, "10.0.0.9", "10.0.1.255", "eth0"),
    ];
    assert_eq!(
        first_hits(Family::Ipv4, "filter", "INPUT", &rules, &mgr, &packets),
        [1, 1, 1, 2, 0, 0]
    );
    // Forwarded packets are PACKET_HOST: unicast.
    let fwd = packet(Hook::Forward, "10.0.0.9", "10.0.0.255", "eth1");
    assert_eq!(
        first_hits(Family::Ipv4, "filter", "FORWARD", &rules, &mgr, &[fwd]),
        [0]
    );
    let packets = [
        packet(i, "fe80::1", "ff02::1", "eth0"),
        packet(i, "fe80::1", "2001:db8::5", "eth0"),
    ];
    assert_eq!(
        first_hits(Family::Ipv6, "filter", "INPUT", &rules, &mgr, &packets),
        [2, 0]
    );
}
