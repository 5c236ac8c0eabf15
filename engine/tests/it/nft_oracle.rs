//! Kernel nftables as the oracle of the engine's verdicts and counters for nft rulesets: every
//! ruleset in `tests/nft-rulesets/` (Debian's default, OpenWrt fw4, Docker 29's nftables
//! backend, kube-proxy's nftables mode, firewalld's nft backend, a workstation, the implied
//! matches) is loaded into kernel nftables in a private namespace ([`oracle::nft`]) and lowered
//! onto the engine (`nft::lower`); the same probe packets (TCP SYNs, UDP, ICMP and ICMPv6 echo,
//! from an on-link and an off-link source) arrive at INPUT in both, and the verdict (accept,
//! drop, reject with a reset or an ICMP error) and the packets counted by each rule with a
//! `counter` statement must agree. Every ruleset must lower (a refusal fails the test with
//! what was refused).
//!
//! Needs root, nft, conntrack and iptables-legacy: ignored unless asked for, and fails when one
//! is missing.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use vallum_engine::fib::{Fib, Route, RouteKind};
use vallum_engine::model::{Hook, IpNet, RejectWith, ct_state};
use vallum_engine::nft::{self, Stmt};
use vallum_engine::packet::parse::parse_ethernet;
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::sets::{SetManager, SetRegistry};
use vallum_engine::snapshot::{Snapshot, Verdict};
use vallum_engine::validate;

use crate::oracle::kernel::{
    FW_IFACE, FW_MAC, KernelOracle, PacketSpec, Proto, Setup, build_frame, oracle_local_table,
};
use crate::oracle::nft::{self as knft, Outcome};
use crate::support::classify_one;

fn rulesets() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/nft-rulesets");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/nft-rulesets")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "nft"))
        .collect();
    v.sort();
    v
}

fn spec(id: &str, proto: Proto, src: &str, dst: &str, dport: u16, icmp_type: u8) -> PacketSpec {
    PacketSpec {
        id: id.to_string(),
        proto,
        src: src.parse().expect("address"),
        dst: dst.parse().expect("address"),
        sport: 0,
        dport,
        flags: vallum_engine::model::tcp_flags::SYN,
        icmp_type,
        icmp_code: 0,
        payload_len: 0,
        cut: None,
        ttl: 64,
        tos: 0,
        payload: None,
        ext: None,
    }
}

/// The probes: services real rulesets open or close, from an on-link source (10.99.0.0/24 on
/// vo1) and an off-link one, in both families.
fn probes() -> Vec<PacketSpec> {
    let mut v = Vec::new();
    for (tag, src4, src6) in [
        ("onlink", "10.99.0.5", "fe80::5"),
        ("offlink", "192.0.2.7", "2001:db8::7"),
    ] {
        for port in [22, 53, 68, 80, 443, 500, 546, 8080] {
            v.push(spec(
                &format!("{tag} tcp {port}"),
                Proto::Tcp,
                src4,
                "10.99.0.1",
                port,
                0,
            ));
            v.push(spec(
                &format!("{tag} udp {port}"),
                Proto::Udp,
                src4,
                "10.99.0.1",
                port,
                0,
            ));
            v.push(spec(
                &format!("{tag} tcp6 {port}"),
                Proto::Tcp,
                src6,
                "2001:db8::1",
                port,
                0,
            ));
            v.push(spec(
                &format!("{tag} udp6 {port}"),
                Proto::Udp,
                src6,
                "2001:db8::1",
                port,
                0,
            ));
        }
        v.push(spec(
            &format!("{tag} ping"),
            Proto::Icmp,
            src4,
            "10.99.0.1",
            0,
            8,
        ));
        v.push(spec(
            &format!("{tag} timestamp"),
            Proto::Icmp,
            src4,
            "10.99.0.1",
            0,
            13,
        ));
        v.push(spec(
            &format!("{tag} ping6"),
            Proto::Icmpv6,
            src6,
            "2001:db8::1",
            0,
            128,
        ));
        v.push(spec(
            &format!("{tag} gre"),
            Proto::Other(47),
            src4,
            "10.99.0.1",
            0,
            0,
        ));
    }
    v
}

/// The firewall namespace's routes as the engine's routing view: AnyIP (`local 0.0.0.0/0`
/// and `local ::/0` on lo), loopback, vo1's 10.99.0.1/24 and link-local addresses.
fn fw_routes() -> Fib {
    let r = |table: u32, net: &str, kind: RouteKind, dev: &str| {
        let (a, l) = net.split_once('/').unwrap_or((net, ""));
        let a: IpAddr = a.parse().expect("address");
        Route {
            table,
            net: IpNet::new(a, l.parse().unwrap_or(if a.is_ipv4() { 32 } else { 128 }))
                .expect("prefix"),
            kind,
            metric: 0,
            devs: vec![IfName::new(dev).expect("name")],
        }
    };
    use RouteKind::*;
    Fib::with_default_rules([
        r(255, "0.0.0.0/0", Local, "lo"),
        r(255, "127.0.0.0/8", Local, "lo"),
        r(255, "10.99.0.1", Local, FW_IFACE),
        r(255, "10.99.0.255", Broadcast, FW_IFACE),
        r(255, "::/0", Local, "lo"),
        r(255, "::1", Local, "lo"),
        r(255, "fe80::76:61ff:fe6c:2", Local, FW_IFACE),
        r(254, "10.99.0.0/24", Unicast, FW_IFACE),
        r(254, "fe80::/64", Unicast, FW_IFACE),
    ])
}

/// The engine's outcome for `frame` and the packets each counting rule of `rs` counted.
struct Engine {
    snapshot: Snapshot,
    /// Per nft rule with a `counter` statement of an enforced chain (listing order): where
    /// it counts in the engine (`Lowered::counted`, per family).
    counting: Vec<Vec<nft::CountedAt>>,
    /// Per nft rule with a `counter` statement (listing order): whether its chain is
    /// enforced (the kernel's counts of stored-only nat chains have no engine twin).
    enforced: Vec<bool>,
}

impl Engine {
    /// `lowered` (named `t`) with the iptables rulesets `beside` at the same hooks.
    fn new(
        rs: &nft::Ruleset,
        lowered: nft::Lowered,
        beside: Vec<vallum_engine::model::Ruleset>,
        sets: &SetManager,
    ) -> Engine {
        for s in &lowered.sets {
            sets.create(&s.name, s.spec).expect("create set");
            sets.add(&s.name, s.elements.iter().copied(), 0)
                .expect("add elements");
        }
        let v = validate::validate(&lowered.ruleset, Some(sets as &dyn SetRegistry));
        assert!(!validate::has_errors(&v), "{v:#?}");
        let counted = lowered.counted.clone();
        let stored: Vec<String> = lowered
            .stored_only
            .iter()
            .map(|s| s.chain.clone())
            .collect();
        let mut all = vec![Arc::new(lowered.ruleset)];
        all.extend(beside.into_iter().map(Arc::new));
        let snapshot = Snapshot::compile(&all, sets, 1).expect("compiles");
        let (mut counting, mut enforced) = (Vec::new(), Vec::new());
        for t in &rs.tables {
            for c in &t.chains {
                let name = nft::lower::chain_name(t.family, &t.name, &c.name);
                for r in &c.rules {
                    if r.stmts.iter().any(|s| matches!(s, Stmt::Counter { .. })) {
                        enforced.push(!stored.contains(&name));
                        if !stored.contains(&name) {
                            let at = counted.iter().filter(|c| c.rule == r.pos).cloned();
                            counting.push(at.collect());
                        }
                    }
                }
            }
        }
        Engine {
            snapshot,
            counting,
            enforced,
        }
    }

    /// Packets counted so far by each counting rule: the rules lowered from it in its own
    /// chain (both families).
    fn counts(&self) -> Vec<u64> {
        let all = self.snapshot.counters();
        self.counting
            .iter()
            .map(|at| {
                all.iter()
                    .filter(|c| &*c.ruleset == "t")
                    .filter(|c| {
                        at.iter().any(|a| {
                            a.family == c.family
                                && *c.chain == *a.chain
                                && c.rule.is_some_and(|n| a.rules.contains(&n))
                        })
                    })
                    .map(|c| c.packets)
                    .sum()
            })
            .collect()
    }

    fn outcome(&self, frame: &[u8]) -> Outcome {
        let base = Packet {
            meta: PacketMeta {
                hook: Hook::Input,
                ct_state: ct_state::NEW,
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface: IfName::new(FW_IFACE).expect("short name"),
                ..PacketFacts::default()
            },
        };
        let mut p = parse_ethernet(frame, base).expect("probe parses");
        match classify_one(&self.snapshot, 0, &mut p, 0, &mut Vec::new()) {
            Verdict::Accept => Outcome::Accept,
            Verdict::Drop => Outcome::Drop,
            Verdict::Reject(RejectWith::TcpReset) => Outcome::RejectTcp,
            Verdict::Reject(_) => Outcome::RejectIcmp,
        }
    }
}

#[test]
#[ignore = "needs root, nft, conntrack and iptables-legacy"]
fn kernel_nftables_and_the_engine_agree_on_every_ruleset() {
    let o = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(why)) => panic!("the kernel oracle cannot run: {why}"),
        Err(e) => panic!("oracle setup failed: {e}"),
    };
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    let mut compared = 0usize;
    let mut total_counted = 0u64;
    let mut sport = 20_000u16;
    for path in rulesets() {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).expect("read ruleset");
        let rs = nft::parse(&file, &text).unwrap_or_else(|e| panic!("{e}"));
        let lowered = match nft::lower(&rs, &file, &text, "t", 0) {
            Ok(l) => l,
            Err(e) => {
                refused.insert(file, e.0[0].to_string());
                continue;
            }
        };
        let sets = SetManager::new();
        sets.node_addrs().replace(oracle_local_table());
        sets.node_addrs().replace_routes(Some(fw_routes()));
        let engine = Engine::new(&rs, lowered, Vec::new(), &sets);
        knft::load(&o, &text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let (n, c) = compare(&o, &engine, &file, &mut sport);
        compared += n;
        total_counted += c;
    }
    eprintln!("{compared} probes compared, {total_counted} rule counts; refused: {refused:#?}");
    let names: Vec<&str> = refused.keys().map(String::as_str).collect();
    // Every ruleset lowers (kube-proxy's service maps and numgen sit in nat chains, stored
    // only); one that stops lowering shows up here with what it refused.
    assert!(names.is_empty(), "{refused:#?}");
}

/// Sends every probe through the kernel (loaded) and `engine`; panics listing the probes whose
/// verdict or rule counts differ. Returns (probes, packets counted by counting rules).
fn compare(o: &KernelOracle, engine: &Engine, what: &str, sport: &mut u16) -> (usize, u64) {
    let mut mismatches = Vec::new();
    let (mut n, mut counted_total) = (0, 0);
    for mut p in probes() {
        *sport += 1;
        p.sport = *sport;
        let frame = build_frame(&p, FW_MAC);
        let mut want = knft::hits(o, &frame).unwrap_or_else(|e| panic!("{what} {}: {e}", p.id));
        assert_eq!(
            want.counted.len(),
            engine.enforced.len(),
            "{what}: counting rules"
        );
        let mut keep = engine.enforced.iter();
        want.counted.retain(|_| keep.next() == Some(&true));
        let before = engine.counts();
        let got = engine.outcome(&frame);
        let counted: Vec<u64> = engine
            .counts()
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect();
        if got != want.outcome || counted != want.counted {
            mismatches.push(format!(
                "{}: kernel {:?} counted {:?}, engine {got:?} counted {counted:?}",
                p.id, want.outcome, want.counted
            ));
        }
        n += 1;
        counted_total += want.counted.iter().sum::<u64>();
    }
    assert!(mismatches.is_empty(), "{what}:\n{}", mismatches.join("\n"));
    (n, counted_total)
}

/// Lowered expressions with a counter on every rule, in base chains before conntrack, at
/// `filter - 5` and at 10, beside an iptables-legacy filter table (priority 0) in the same
/// kernel: the engine's verdicts and every rule's count equal the kernel's.
const COVERAGE: &str = r#"table inet cov {
	set blocked4 {
		type ipv4_addr
		flags interval
		elements = { 192.0.2.128/25 }
	}

	set svc {
		type ipv4_addr . inet_proto . inet_service
		elements = { 10.99.0.1 . tcp . 8080 }
	}

	chain pre {
		type filter hook prerouting priority raw; policy accept;
		udp dport 500 counter notrack
	}

	chain input {
		type filter hook input priority filter - 5; policy drop;
		ip saddr @blocked4 counter drop
		ct state untracked counter accept
		ip daddr . meta l4proto . th dport @svc counter accept
		tcp dport { 22, 80 } counter accept
		udp dport 53 ip saddr 10.99.0.0/24 counter accept
		meta l4proto icmp icmp type { echo-request, timestamp-request } counter accept
		icmpv6 type echo-request counter accept
		ip6 saddr fe80::/64 udp dport 546 counter accept
		tcp dport 443 counter reject with tcp reset
		tcp flags & (syn | ack) == syn tcp dport 68 counter drop
		ip daddr 10.99.0.1 tcp dport 500 limit rate over 1/minute burst 1 packets counter drop
		tcp dport 500 counter accept
		ip daddr . meta l4proto . th dport vmap { 10.99.0.1 . udp . 8080 : accept, 10.99.0.1 . tcp . 546 : drop }
		meta l4proto udp udp dport 546 iifname != { "lo", "vo9" } counter accept
		iifname != { "vo1", "lo" } udp dport 8080 counter drop
		meta l4proto udp udp dport != 68 counter reject with icmpx admin-prohibited
		fib daddr type local meta l4proto gre counter jump gre
		ip ttl 64 ip length < 1000 counter continue
		counter
	}

	chain gre {
		ip saddr 10.99.0.0/24 counter accept
		counter return
	}
}
table ip later {
	chain input {
		type filter hook input priority 10; policy accept;
		tcp dport 80 counter drop
	}
}
"#;

#[test]
#[ignore = "needs root, nft, conntrack and iptables-legacy"]
fn lowered_expressions_count_and_order_as_in_the_kernel() {
    let o = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(why)) => panic!("the kernel oracle cannot run: {why}"),
        Err(e) => panic!("oracle setup failed: {e}"),
    };
    let ipt = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
               -A INPUT -p tcp --dport 22 -s 192.0.2.0/24 -j DROP\nCOMMIT\n";
    let rs = nft::parse("coverage", COVERAGE).unwrap_or_else(|e| panic!("{e}"));
    let lowered = nft::lower(&rs, "coverage", COVERAGE, "t", 0).unwrap_or_else(|e| panic!("{e}"));
    let legacy = vallum_engine::restore::parse_ruleset("ipt", ipt, &Default::default())
        .expect("iptables text parses");
    let sets = SetManager::new();
    sets.node_addrs().replace(oracle_local_table());
    sets.node_addrs().replace_routes(Some(fw_routes()));
    let engine = Engine::new(&rs, lowered, vec![legacy], &sets);
    knft::load(&o, COVERAGE).unwrap_or_else(|e| panic!("{e}"));
    o.load(vallum_engine::model::Family::Ipv4, ipt)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut sport = 30_000;
    let (n, counted) = compare(&o, &engine, "coverage", &mut sport);
    eprintln!("{n} probes, {counted} rule counts");
    assert!(
        counted >= n as u64,
        "every probe reaches at least one counting rule"
    );
}

/// The filter side of kube-proxy's nftables mode: services without endpoints in a named
/// verdict map (`goto reject-chain` or `drop`), reached for new connections.
const NO_ENDPOINTS: &str = r#"table ip kube-proxy {
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
		elements = { 10.99.0.1 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain,
			     10.99.0.1 . udp . 53 comment "ns2/svc2:dns" : drop }
	}

	chain filter-input {
		type filter hook input priority -110; policy accept;
		ct state new counter jump service-endpoints-check
	}

	chain service-endpoints-check {
		ip daddr . meta l4proto . th dport vmap @no-endpoint-services
	}

	chain reject-chain {
		counter reject
	}
}
"#;

/// A named verdict map's elements added and deleted without a commit (the engine's sets API,
/// `nft add element` / `nft delete element` in the kernel): after each change the same probes
/// get the same verdicts and counts from both.
#[test]
#[ignore = "needs root, nft, conntrack and iptables-legacy"]
fn verdict_map_elements_change_as_nft_add_element_changes_them() {
    let o = match KernelOracle::setup() {
        Ok(Setup::Ready(o)) => o,
        Ok(Setup::Skip(why)) => panic!("the kernel oracle cannot run: {why}"),
        Err(e) => panic!("oracle setup failed: {e}"),
    };
    let rs = nft::parse("kp", NO_ENDPOINTS).unwrap_or_else(|e| panic!("{e}"));
    let lowered = nft::lower(&rs, "kp", NO_ENDPOINTS, "t", 0).unwrap_or_else(|e| panic!("{e}"));
    let sets = SetManager::new();
    sets.node_addrs().replace(oracle_local_table());
    sets.node_addrs().replace_routes(Some(fw_routes()));
    let engine = Engine::new(&rs, lowered, Vec::new(), &sets);
    knft::load(&o, NO_ENDPOINTS).unwrap_or_else(|e| panic!("{e}"));
    let map = "ip.kube-proxy.no-endpoint-services";
    let mut sport = 40_000;
    let outcome = |port: u16, proto: Proto| {
        let p = spec("x", proto, "192.0.2.7", "10.99.0.1", port, 0);
        engine.outcome(&build_frame(&p, FW_MAC))
    };
    compare(&o, &engine, "as loaded", &mut sport);
    assert_eq!(outcome(80, Proto::Tcp), Outcome::RejectIcmp);
    assert_eq!(outcome(8080, Proto::Tcp), Outcome::Accept);

    knft::apply(
        &o,
        "add element ip kube-proxy no-endpoint-services { 10.99.0.1 . tcp . 8080 : goto reject-chain, 10.99.0.1 . udp . 8080 : drop }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    sets.add_str(
        map,
        &[
            "10.99.0.1,tcp:8080 : goto reject-chain",
            "10.99.0.1,udp:8080 : drop",
        ],
        0,
    )
    .expect("add elements");
    compare(&o, &engine, "after add element", &mut sport);
    assert_eq!(outcome(8080, Proto::Tcp), Outcome::RejectIcmp);
    assert_eq!(outcome(8080, Proto::Udp), Outcome::Drop);

    knft::apply(
        &o,
        "delete element ip kube-proxy no-endpoint-services { 10.99.0.1 . tcp . 80, 10.99.0.1 . udp . 53 }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sets.delete_str(map, &["10.99.0.1,tcp:80", "10.99.0.1,udp:53"])
            .expect("delete elements"),
        2
    );
    compare(&o, &engine, "after delete element", &mut sport);
    assert_eq!(outcome(80, Proto::Tcp), Outcome::Accept);
}
