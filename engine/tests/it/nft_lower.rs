//! nft rulesets lowered onto the engine (`nft::lower`) and classified: base chains, regular
//! chains, verdicts and matches give the verdicts nft gives; what the engine does not run is
//! refused by name at its position; nat chains are stored only; nft base chains and iptables
//! tables at one hook run in netfilter priority order, those below conntrack's -200 before
//! its lookup.

use std::sync::Arc;

use vallum_engine::model::{Family, Hook, TableKind};
use vallum_engine::nft::{self, ErrorKind};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore;
use vallum_engine::sets::{NoSets, SetManager, SetRegistry};
use vallum_engine::snapshot::{Snapshot, Verdict};
use vallum_engine::validate;

use crate::support::classify_one;

/// `text` parsed and lowered as ruleset `name` at ruleset priority 0.
fn lowered(name: &str, text: &str) -> nft::Lowered {
    let rs = nft::parse("rules.nft", text).unwrap_or_else(|e| panic!("{e}"));
    nft::lower(&rs, "rules.nft", text, name, 0).unwrap_or_else(|e| panic!("{e}"))
}

/// The first lowering error of `text`.
fn refused(text: &str) -> nft::NftError {
    let rs = nft::parse("rules.nft", text).unwrap_or_else(|e| panic!("{e}"));
    nft::lower(&rs, "rules.nft", text, "t", 0)
        .expect_err("must be refused")
        .0
        .remove(0)
}

/// Validated (no errors) and compiled.
fn compile(rulesets: Vec<vallum_engine::model::Ruleset>, sets: &dyn SetRegistry) -> Snapshot {
    for rs in &rulesets {
        let v = validate::validate(rs, Some(sets));
        assert!(!validate::has_errors(&v), "{v:#?}");
    }
    let rs: Vec<_> = rulesets.into_iter().map(Arc::new).collect();
    Snapshot::compile(&rs, sets, 1).expect("compiles")
}

fn v4(hook: Hook, src: &str, dst: &str, proto: u8, dport: u16) -> PacketMeta {
    PacketMeta {
        family: Family::Ipv4,
        hook,
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        protocol: proto,
        sport: 40000,
        dport,
        len: 60,
        ..PacketMeta::default()
    }
}

fn on(mut p: PacketMeta, iface: &str) -> Packet {
    p.len = 60;
    let mut facts = PacketFacts::NONE;
    facts.in_iface = IfName::new(iface).unwrap();
    Packet { meta: p, facts }
}

fn verdict(s: &Snapshot, mut p: impl crate::support::OnePacket) -> Verdict {
    classify_one(s, 0, &mut p, 0, &mut Vec::new())
}

const WORKSTATION: &str = "table inet filter {
	chain input {
		type filter hook input priority filter; policy drop;
		ct state invalid drop
		ct state { established, related } accept
		iif \"lo\" accept
		ip saddr 192.0.2.0/24 jump trusted
		tcp dport { 22, 80-81 } accept
		udp dport 53 counter accept
		ip6 nexthdr icmpv6 icmpv6 type echo-request accept
		icmp type echo-request limit rate 5/second accept
		tcp dport 23 log prefix \"telnet \" reject with tcp reset
		meta l4proto udp reject
	}

	chain trusted {
		tcp dport 8080 accept
		ip saddr 192.0.2.66 drop
		return
	}
}
";

#[test]
fn a_workstation_ruleset_gives_nfts_verdicts() {
    let l = lowered("ws", WORKSTATION);
    assert!(l.stored_only.is_empty(), "{:?}", l.stored_only);
    let t4 = l
        .ruleset
        .table(Family::Ipv4, TableKind::Nft)
        .expect("IPv4 table");
    let t6 = l
        .ruleset
        .table(Family::Ipv6, TableKind::Nft)
        .expect("IPv6 table");
    // `ip saddr`, `icmp type` are IPv4 only, `icmpv6 type` IPv6 only.
    let input4 = t4.chain("inet filter input").unwrap();
    let input6 = t6.chain("inet filter input").unwrap();
    assert_eq!((input4.rules.len(), input6.rules.len()), (9, 8));
    assert!(
        t4.chain("inet filter input #9").is_some(),
        "the log+reject helper"
    );
    let s = compile(vec![l.ruleset], &NoSets);
    let at = |src: &str, proto, dport| v4(Hook::Input, src, "198.51.100.1", proto, dport);
    assert_eq!(verdict(&s, at("203.0.113.9", 6, 22)), Verdict::Accept);
    assert_eq!(verdict(&s, at("203.0.113.9", 6, 81)), Verdict::Accept);
    assert_eq!(verdict(&s, at("203.0.113.9", 6, 82)), Verdict::Drop);
    assert_eq!(verdict(&s, at("203.0.113.9", 17, 53)), Verdict::Accept);
    assert_eq!(
        verdict(&s, at("203.0.113.9", 6, 23)),
        Verdict::Reject(vallum_engine::model::RejectWith::TcpReset)
    );
    assert_eq!(
        verdict(&s, at("203.0.113.9", 17, 54)),
        Verdict::Reject(vallum_engine::model::RejectWith::PortUnreachable)
    );
    // The regular chain: accept, drop, or return to the next rule of input.
    assert_eq!(verdict(&s, at("192.0.2.7", 6, 8080)), Verdict::Accept);
    assert_eq!(verdict(&s, at("192.0.2.66", 6, 22)), Verdict::Drop);
    assert_eq!(verdict(&s, at("192.0.2.7", 6, 22)), Verdict::Accept);
    assert_eq!(verdict(&s, at("192.0.2.7", 6, 9)), Verdict::Drop);
    // Conntrack state and the input interface.
    let mut est = at("203.0.113.9", 6, 9);
    est.ct_state = vallum_engine::model::ct_state::ESTABLISHED;
    assert_eq!(verdict(&s, est), Verdict::Accept);
    assert_eq!(
        verdict(&s, on(at("127.0.0.1", 6, 9), "lo")),
        Verdict::Accept
    );
    // ICMP echo in each family.
    let mut ping = at("203.0.113.9", 1, 0);
    ping.icmp_type = 8;
    assert_eq!(verdict(&s, ping), Verdict::Accept);
    let mut ping6 = PacketMeta {
        family: Family::Ipv6,
        src: "2001:db8::7".parse().unwrap(),
        dst: "2001:db8::1".parse().unwrap(),
        ..ping
    };
    ping6.protocol = 58;
    ping6.icmp_type = 128;
    assert_eq!(verdict(&s, ping6), Verdict::Accept);
    ping6.icmp_type = 129;
    assert_eq!(verdict(&s, ping6), Verdict::Drop);
}

#[test]
fn what_the_engine_does_not_run_is_refused_by_name_at_its_position() {
    let e = refused(
        "table ip t {\n\tchain c {\n\t\ttype filter hook input priority 0;\n\
         \t\ttcp dport 22 numgen random mod 2 vmap { 0 : accept, 1 : drop }\n\t}\n}\n",
    );
    assert_eq!((e.pos.line, e.pos.column), (4, 16), "{e}");
    assert!(e.to_string().contains("`numgen`"), "{e}");
    let e = refused(
        "table ip t {\n\tchain c {\n\t\ttype filter hook forward priority 0;\n\
         \t\tip saddr 10.0.0.0/8 dnat to 192.0.2.1\n\t}\n}\n",
    );
    assert_eq!((e.pos.line, e.pos.column), (4, 23), "{e}");
    assert!(
        matches!(e.kind, ErrorKind::Unsupported(ref w) if w.contains("`dnat`")),
        "{e}"
    );
    // A regular chain reached from a filter chain is enforced too.
    let e = refused(
        "table ip t {\n\tchain c {\n\t\ttype filter hook input priority 0;\n\t\tjump d\n\t}\n\
         \tchain d {\n\t\tct status assured drop\n\t}\n}\n",
    );
    assert_eq!((e.pos.line, e.pos.column), (7, 6), "{e}");
    assert!(
        e.to_string()
            .contains("`ct status` other than snat and dnat"),
        "{e}"
    );
}

#[test]
fn nat_chains_and_what_only_they_reach_are_stored_only() {
    let l = lowered(
        "nat",
        "table ip nat {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat;\n\
         \t\toifname \"eth0\" jump masq\n\t}\n\tchain masq {\n\t\tmasquerade\n\t}\n}\n\
         table ip filter {\n\tchain fwd {\n\t\ttype filter hook forward priority 0; policy drop;\n\
         \t\tiifname \"eth1\" accept\n\t}\n}\n",
    );
    let stored: Vec<&str> = l.stored_only.iter().map(|s| s.chain.as_str()).collect();
    assert_eq!(stored, ["ip nat post", "ip nat masq"]);
    let t = l.ruleset.table(Family::Ipv4, TableKind::Nft).unwrap();
    let names: Vec<&str> = t.chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["ip filter fwd"]);
    let s = compile(vec![l.ruleset], &NoSets);
    let p = v4(Hook::Forward, "10.0.0.1", "10.0.1.1", 6, 80);
    assert_eq!(verdict(&s, on(p, "eth1")), Verdict::Accept);
    assert_eq!(verdict(&s, on(p, "eth2")), Verdict::Drop);
}

/// Named sets become engine sets named `FAMILY.TABLE.SET`; their elements are what the set
/// declared, and an element added later through the sets API matches without a commit.
#[test]
fn named_sets_are_engine_sets_that_change_without_a_commit() {
    let l = lowered(
        "sets",
        "table inet filter {\n\tset allowed { type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 192.0.2.1-192.0.2.6 } }\n\
         \tset svc { type ipv4_addr . inet_proto . inet_service; elements = { 198.51.100.1 . tcp . 443 } }\n\
         \tchain input {\n\t\ttype filter hook input priority 0; policy drop;\n\
         \t\tip saddr @allowed accept\n\t\tip daddr . meta l4proto . th dport @svc accept\n\t}\n}\n",
    );
    let names: Vec<&str> = l.sets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["inet.filter.allowed", "inet.filter.svc"]);
    // 192.0.2.1-192.0.2.6 is 192.0.2.1/32, 192.0.2.2/31, 192.0.2.4/31, 192.0.2.6/32.
    assert_eq!(l.sets[0].elements.len(), 5);
    let m = SetManager::new();
    for s in &l.sets {
        m.create(&s.name, s.spec).unwrap();
        m.add(&s.name, s.elements.iter().copied(), 0).unwrap();
    }
    let s = compile(vec![l.ruleset], &m);
    let at = |src: &str, dst: &str, dport| v4(Hook::Input, src, dst, 6, dport);
    assert_eq!(
        verdict(&s, at("10.1.2.3", "198.51.100.9", 1)),
        Verdict::Accept
    );
    assert_eq!(
        verdict(&s, at("192.0.2.6", "198.51.100.9", 1)),
        Verdict::Accept
    );
    assert_eq!(
        verdict(&s, at("192.0.2.7", "198.51.100.9", 1)),
        Verdict::Drop
    );
    assert_eq!(
        verdict(&s, at("203.0.113.1", "198.51.100.1", 443)),
        Verdict::Accept
    );
    assert_eq!(
        verdict(&s, at("203.0.113.1", "198.51.100.1", 444)),
        Verdict::Drop
    );
    m.add_str("inet.filter.allowed", &["192.0.2.7"], 0).unwrap();
    assert_eq!(
        verdict(&s, at("192.0.2.7", "198.51.100.9", 1)),
        Verdict::Accept
    );
}

/// An nft ruleset and an iptables ruleset at one hook run as in the kernel: by netfilter
/// priority (the iptables filter table at 0), an accept ending only its own base chain.
#[test]
fn nft_and_iptables_base_chains_run_in_priority_order() {
    let ipt = restore::parse_ruleset(
        "ipt",
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j DROP\n-A INPUT -p tcp --dport 80 -j ACCEPT\nCOMMIT\n\
         *raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -p tcp --dport 7 -j DROP\nCOMMIT\n",
        &restore::ParseOptions::default(),
    )
    .unwrap();
    let nft = lowered(
        "nft",
        "table ip early {\n\tchain in {\n\t\ttype filter hook input priority filter - 10;\n\
         \t\ttcp dport 22 accept\n\t\ttcp dport 443 drop\n\t}\n}\n\
         table ip late {\n\tchain in {\n\t\ttype filter hook input priority 10;\n\t\ttcp dport 80 drop\n\t}\n\
         \tchain pre {\n\t\ttype filter hook prerouting priority -250;\n\t\ttcp dport 7 accept\n\t\ttcp dport 8 drop\n\t}\n}\n",
    );
    let s = compile(vec![ipt, nft.ruleset], &NoSets);
    let at = |dport| v4(Hook::Input, "192.0.2.7", "192.0.2.1", 6, dport);
    // -10 accepts 22 (its own chain only), then iptables' filter (0) drops it.
    assert_eq!(verdict(&s, at(22)), Verdict::Drop);
    // -10 drops 443 before iptables sees it.
    assert_eq!(verdict(&s, at(443)), Verdict::Drop);
    // iptables accepts 80 (its chain), then the chain at 10 drops it.
    assert_eq!(verdict(&s, at(80)), Verdict::Drop);
    // Prerouting: iptables raw (-300) drops 7 before the nft chain at -250 accepts it.
    assert_eq!(verdict(&s, at(7)), Verdict::Drop);
    assert_eq!(verdict(&s, at(8)), Verdict::Drop);
    assert_eq!(verdict(&s, at(9)), Verdict::Accept);
    // Both prerouting chains run before conntrack (-300 and -250 < -200): a lookup that
    // drops shows the chains walked before it.
    let p = Packet {
        meta: at(9),
        facts: PacketFacts::NONE,
    };
    let trace = s.trace_tracked(&p, &[], 0, None, |_, _| Some(Verdict::Drop));
    let mut chains: Vec<String> = trace.steps.iter().map(|st| st.chain.to_string()).collect();
    chains.dedup();
    assert_eq!(chains, ["PREROUTING", "ip late pre"]);
}

/// A limit after an anonymous set is one bucket, not one per element: the elements' rules
/// jump to a helper chain that holds the limit.
#[test]
fn a_limit_after_an_anonymous_set_is_one_bucket() {
    let l = lowered(
        "lim",
        "table ip t {\n\tchain c {\n\t\ttype filter hook input priority 0; policy drop;\n\
         \t\ticmp type { echo-request, echo-reply } limit rate 1/minute burst 1 packets accept\n\t}\n}\n",
    );
    let t = l.ruleset.table(Family::Ipv4, TableKind::Nft).unwrap();
    let names: Vec<&str> = t.chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["ip t c", "ip t c #1"]);
    assert_eq!(t.chains[0].rules.len(), 2);
    let s = compile(vec![l.ruleset], &NoSets);
    let mut p = v4(Hook::Input, "192.0.2.7", "192.0.2.1", 1, 0);
    p.icmp_type = 8;
    assert_eq!(verdict(&s, p), Verdict::Accept);
    p.icmp_type = 0;
    assert_eq!(verdict(&s, p), Verdict::Drop, "the bucket is shared");
    p.icmp_type = 8;
    assert_eq!(verdict(&s, p), Verdict::Drop);
}

/// An nft ruleset and the iptables ruleset that says the same lower to the same model rules
/// (content, not names): the one classifier runs the same compiled rules for both, so the nft
/// form classifies as fast as the iptables form.
#[test]
fn an_nft_ruleset_lowers_to_the_rules_of_its_iptables_twin() {
    let ipt = restore::parse_ruleset(
        "ipt",
        "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -m state --state RELATED,ESTABLISHED -j ACCEPT\n\
         -A INPUT -i lo -j ACCEPT\n\
         -A INPUT -s 10.0.0.0/8 -p tcp -m tcp --dport 22 -j ACCEPT\n\
         -A INPUT -i eth0 -p udp -m udp --dport 53 -j ACCEPT\n\
         -A INPUT -p tcp -m multiport --dports 80,443 -j ACCEPT\n\
         -A INPUT -p icmp -m icmp --icmp-type 8 -j ACCEPT\n\
         -A INPUT -m mark --mark 0x1 -j DROP\n\
         -A INPUT -j REJECT --reject-with icmp-port-unreachable\nCOMMIT\n",
        &restore::ParseOptions::default(),
    )
    .unwrap();
    let nft = lowered(
        "nft",
        "table ip filter {\n\tchain INPUT {\n\t\ttype filter hook input priority filter; policy drop;\n\
         \t\tct state established,related accept\n\t\tiifname \"lo\" accept\n\
         \t\tip saddr 10.0.0.0/8 tcp dport 22 accept\n\t\tiifname \"eth0\" udp dport 53 accept\n\
         \t\ttcp dport { 80, 443 } accept\n\t\ticmp type echo-request accept\n\
         \t\tmeta mark 0x00000001 drop\n\t\treject\n\t}\n}\n",
    );
    let a = &ipt
        .table(Family::Ipv4, TableKind::Filter)
        .unwrap()
        .chain("INPUT")
        .unwrap()
        .rules;
    let b = &nft
        .ruleset
        .table(Family::Ipv4, TableKind::Nft)
        .unwrap()
        .chain("ip filter INPUT")
        .unwrap()
        .rules;
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b.iter()) {
        assert!(x.same_content(y), "\n{x:?}\n{y:?}");
    }
}

/// `limit rate over` and a negated set no single match holds: behind a gate, rules that
/// return when the limit holds (or an element matches), so the action runs only otherwise.
#[test]
fn limit_over_and_negated_sets_return_from_a_helper() {
    let l = lowered(
        "over",
        "table ip t {\n\tchain c {\n\t\ttype filter hook input priority 0; policy accept;\n\
         \t\ttcp dport 22 limit rate over 1/minute burst 2 packets drop\n\
         \t\tiifname != { \"lo\", \"eth0\" } udp dport 53 reject\n\t}\n}\n",
    );
    let t = l.ruleset.table(Family::Ipv4, TableKind::Nft).unwrap();
    let names: Vec<&str> = t.chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["ip t c", "ip t c #1", "ip t c #2"]);
    let s = compile(vec![l.ruleset], &NoSets);
    let ssh = v4(Hook::Input, "192.0.2.7", "192.0.2.1", 6, 22);
    assert_eq!(verdict(&s, ssh), Verdict::Accept);
    assert_eq!(verdict(&s, ssh), Verdict::Accept);
    assert_eq!(verdict(&s, ssh), Verdict::Drop, "over the rate");
    let dns = v4(Hook::Input, "192.0.2.7", "192.0.2.1", 17, 53);
    assert_eq!(verdict(&s, on(dns, "eth0")), Verdict::Accept);
    assert_eq!(verdict(&s, on(dns, "lo")), Verdict::Accept);
    assert_eq!(
        verdict(&s, on(dns, "eth1")),
        Verdict::Reject(vallum_engine::model::RejectWith::PortUnreachable)
    );
    // A rule that ends in `return` cannot return from the helper for it.
    let e = refused(
        "table ip t {\n\tchain c {\n\t\ttype filter hook input priority 0;\n\t\tjump d\n\t}\n\
         \tchain d {\n\t\tlimit rate over 1/second return\n\t}\n}\n",
    );
    assert!(e.to_string().contains("`limit rate over`"), "{e}");
}

/// A concatenated key (kube-proxy's `ip daddr . meta l4proto . th dport`) in an anonymous set
/// (one rule per element, each part of the key one match) or a named verdict map (an engine
/// verdict map: one rule, elements changed without a commit, as `nft add element`).
#[test]
fn concatenated_keys_in_sets_and_verdict_maps() {
    let l = lowered(
        "kp",
        "table ip kp {\n\tmap no-endpoint-services {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\
         \t\telements = { 172.30.0.44 . tcp . 80 : goto reject-chain, 172.30.0.45 . udp . 53 : drop }\n\t}\n\
         \tchain reject-chain {\n\t\treject\n\t}\n\
         \tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\
         \t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\
         \t\tip saddr . tcp dport { 192.0.2.1 . 22, 192.0.2.2 . 2222 } drop\n\t}\n}\n",
    );
    let m = SetManager::new();
    for s in &l.sets {
        m.create(&s.name, s.spec).unwrap();
        m.add(&s.name, s.elements.iter().copied(), 0).unwrap();
    }
    // A map without `size` takes elements up to nft's own bound, not ipset's 65536.
    assert_eq!(l.sets[0].spec.maxelem as usize, nft::MAX_SET_ELEMENTS);
    // One rule for the map, one per element of the anonymous set.
    assert_eq!(l.ruleset.tables[0].chains[1].rules.len(), 3);
    let s = compile(vec![l.ruleset], &m);
    let at = |src: &str, dst: &str, proto, dport| v4(Hook::Input, src, dst, proto, dport);
    let reject = Verdict::Reject(vallum_engine::model::RejectWith::PortUnreachable);
    assert_eq!(verdict(&s, at("10.0.0.1", "172.30.0.44", 6, 80)), reject);
    // One element added and one deleted, without a commit: the same snapshot sees both.
    let map = "ip.kp.no-endpoint-services";
    assert_eq!(
        verdict(&s, at("10.0.0.1", "172.30.0.46", 6, 443)),
        Verdict::Accept
    );
    m.add_str(map, &["172.30.0.46,tcp:443 : goto reject-chain"], 0)
        .unwrap();
    assert_eq!(verdict(&s, at("10.0.0.1", "172.30.0.46", 6, 443)), reject);
    m.add_str(map, &["172.30.0.46,tcp:443 : drop"], 0).unwrap();
    assert_eq!(
        verdict(&s, at("10.0.0.1", "172.30.0.46", 6, 443)),
        Verdict::Drop,
        "a new verdict replaces the old one"
    );
    assert_eq!(m.delete_str(map, &["172.30.0.44,tcp:80"]).unwrap(), 1);
    assert_eq!(
        verdict(&s, at("10.0.0.1", "172.30.0.44", 6, 80)),
        Verdict::Accept
    );
    // Listed with their verdicts; a chain the table does not have, an element without a
    // verdict, and a verdict in a plain set are refused, and change nothing.
    let listed: Vec<String> = m
        .list(map, 0)
        .unwrap()
        .elements
        .into_iter()
        .map(|e| e.text)
        .collect();
    assert_eq!(
        listed,
        ["172.30.0.45,udp:53 : drop", "172.30.0.46,tcp:443 : drop"]
    );
    for bad in [
        "172.30.0.47,tcp:80 : goto no-such-chain",
        "172.30.0.47,tcp:80",
        "172.30.0.47,tcp:80 : queue",
    ] {
        let e = m.add_str(map, &[bad], 0).expect_err(bad);
        assert!(e.to_string().contains("172.30.0.47"), "{e}");
    }
    assert_eq!(m.list(map, 0).unwrap().elements.len(), 2);
    m.create(
        "plain",
        vallum_engine::sets::SetSpec::new(vallum_engine::sets::SetType::HashIp, Family::Ipv4),
    )
    .unwrap();
    m.add_str("plain", &["10.0.0.1"], 0).unwrap();
    assert!(m.add_str("plain", &["10.0.0.2 : drop"], 0).is_err());
    assert_eq!(
        verdict(&s, at("10.0.0.1", "172.30.0.44", 17, 80)),
        Verdict::Accept
    );
    assert_eq!(
        verdict(&s, at("10.0.0.1", "172.30.0.45", 17, 53)),
        Verdict::Drop
    );
    assert_eq!(
        verdict(&s, at("192.0.2.1", "10.0.0.9", 6, 22)),
        Verdict::Drop
    );
    assert_eq!(
        verdict(&s, at("192.0.2.1", "10.0.0.9", 6, 2222)),
        Verdict::Accept
    );
    assert_eq!(
        verdict(&s, at("192.0.2.2", "10.0.0.9", 6, 2222)),
        Verdict::Drop
    );
}

/// A chain that runs before conntrack (priority below -200) has no connection yet: `ct`
/// there is refused by name, in the base chain and in what it reaches.
#[test]
fn ct_before_conntrack_is_refused() {
    let e = refused(
        "table inet t {\n\tchain pre {\n\t\ttype filter hook prerouting priority raw;\n\t\tjump x\n\t}\n\
         \tchain x {\n\t\tct state new drop\n\t}\n}\n",
    );
    assert_eq!((e.pos.line, e.pos.column), (7, 3), "{e}");
    assert!(
        e.to_string()
            .contains("`ct state` in a chain that runs before conntrack"),
        "{e}"
    );
    // At priority mangle (-150) the connection is known.
    lowered(
        "t",
        "table inet t {\n\tchain pre {\n\t\ttype filter hook prerouting priority mangle;\n\t\tct state new drop\n\t}\n}\n",
    );
}

/// An anonymous set is counted before its rules are built: one past `MAX_EXPANDED_RULES`
/// elements is refused as too large at the rule. Two sets in one rule do not multiply: the
/// first one's rules jump to a helper chain holding the second's (64 + 65 rules, not 64 * 65).
#[test]
fn expansions_are_counted_before_they_are_built() {
    let max = nft::lower::MAX_EXPANDED_RULES;
    let addrs = |n: usize| -> String {
        (0..n)
            .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rule = |set: &str| {
        format!(
            "table ip t {{\n\tchain c {{\n\t\ttype filter hook input priority 0;\n\
             \t\ticmp type {{ echo-request, echo-reply }} ip saddr {{ {set} }} accept\n\t}}\n}}\n"
        )
    };
    let e = refused(&rule(&addrs(max + 1)));
    assert!(matches!(e.kind, ErrorKind::TooLarge(_)), "{e}");
    assert_eq!(e.pos.line, 4);
    let l = lowered("t", &rule(&addrs(max)));
    let t = l.ruleset.table(Family::Ipv4, TableKind::Nft).unwrap();
    let sizes: Vec<usize> = t.chains.iter().map(|c| c.rules.len()).collect();
    assert_eq!(sizes, [2, max]);
}

/// `meta l4proto { tcp, udp } th dport 53`: each alternative keeps its protocol, so `th`
/// reads the right header.
#[test]
fn th_after_a_protocol_set_reads_each_protocol() {
    let l = lowered(
        "th",
        "table inet t {\n\tchain c {\n\t\ttype filter hook input priority 0; policy drop;\n\
         \t\tmeta l4proto { tcp, udp } th dport 53 accept\n\t}\n}\n",
    );
    let s = compile(vec![l.ruleset], &NoSets);
    let at = |proto, dport| v4(Hook::Input, "192.0.2.7", "192.0.2.1", proto, dport);
    assert_eq!(verdict(&s, at(6, 53)), Verdict::Accept);
    assert_eq!(verdict(&s, at(17, 53)), Verdict::Accept);
    assert_eq!(verdict(&s, at(17, 54)), Verdict::Drop);
    assert_eq!(verdict(&s, at(132, 53)), Verdict::Drop);
}

/// A named set of ports and a verdict map keyed by port (`type inet_service`) are
/// `bitmap:port` engine sets behind the protocol the expression names, in both families of an
/// inet table; their elements change without a commit.
#[test]
fn port_sets_and_port_maps_change_without_a_commit() {
    let l = lowered(
        "t",
        "table inet filter {\n\tset ports {\n\t\ttype inet_service\n\t\tflags interval\n\
         \t\telements = { 22, 8000-8001 }\n\t}\n\
         \tmap dispatch {\n\t\ttype inet_service : verdict\n\t\telements = { 80 : jump web, 443 : drop }\n\t}\n\
         \tchain web {\n\t\tip saddr 10.0.0.0/8 accept\n\t\tdrop\n\t}\n\
         \tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\
         \t\ttcp dport @ports drop\n\t\ttcp dport vmap @dispatch\n\t}\n}\n",
    );
    let m = SetManager::new();
    for s in &l.sets {
        m.create(&s.name, s.spec).unwrap();
        m.add(&s.name, s.elements.iter().copied(), 0).unwrap();
    }
    let s = compile(vec![l.ruleset], &m);
    let at = |src: &str, proto, dport| v4(Hook::Input, src, "198.51.100.1", proto, dport);
    let v6 = |proto, dport| PacketMeta {
        family: Family::Ipv6,
        src: "2001:db8::1".parse().unwrap(),
        dst: "2001:db8::2".parse().unwrap(),
        ..v4(Hook::Input, "192.0.2.1", "198.51.100.1", proto, dport)
    };
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 22)), Verdict::Drop);
    assert_eq!(verdict(&s, v6(6, 22)), Verdict::Drop, "inet: IPv6 too");
    assert_eq!(
        verdict(&s, at("192.0.2.1", 17, 22)),
        Verdict::Accept,
        "tcp only"
    );
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 8001)), Verdict::Drop);
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 9000)), Verdict::Accept);
    assert_eq!(verdict(&s, at("10.1.1.1", 6, 80)), Verdict::Accept);
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 80)), Verdict::Drop);
    assert_eq!(
        verdict(&s, at("192.0.2.1", 17, 80)),
        Verdict::Accept,
        "tcp only"
    );
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 443)), Verdict::Drop);
    m.add_str("inet.filter.ports", &["9000"], 0).unwrap();
    m.add_str("inet.filter.dispatch", &["8443 : jump web"], 0)
        .unwrap();
    assert_eq!(m.delete_str("inet.filter.ports", &["22"]).unwrap(), 1);
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 9000)), Verdict::Drop);
    assert_eq!(verdict(&s, v6(6, 9000)), Verdict::Drop);
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 22)), Verdict::Accept);
    assert_eq!(verdict(&s, at("10.1.1.1", 6, 8443)), Verdict::Accept);
    assert_eq!(verdict(&s, at("192.0.2.1", 6, 8443)), Verdict::Drop);
    let listed: Vec<String> = m
        .list("inet.filter.dispatch", 0)
        .unwrap()
        .elements
        .into_iter()
        .map(|e| e.text)
        .collect();
    assert_eq!(listed, ["80 : jump web", "443 : drop", "8443 : jump web"]);
}

/// A commit that adds a chain and a map element that goes to it, the chain holding the `vmap`
/// rule unchanged: the snapshot built from its predecessor resolves the new chain (the vmap's
/// body is compiled again, never shared).
#[test]
fn a_map_element_to_a_chain_of_the_next_commit_resolves() {
    let text = |extra: &str, elems: &str| {
        format!(
            "table ip kp {{\n\tmap m {{\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\
             \t\telements = {{ {elems} }}\n\t}}\n\
             \tchain input {{\n\t\ttype filter hook input priority 0; policy accept;\n\
             \t\tip daddr . meta l4proto . th dport vmap @m\n\t}}\n\
             \tchain a {{\n\t\tdrop\n\t}}\n{extra}}}\n"
        )
    };
    let one = lowered("kp", &text("", "10.0.0.1 . tcp . 80 : goto a"));
    let m = SetManager::new();
    for s in &one.sets {
        m.create(&s.name, s.spec).unwrap();
        m.add(&s.name, s.elements.iter().copied(), 0).unwrap();
    }
    let first = compile(vec![one.ruleset], &m);
    let two = lowered(
        "kp",
        &text(
            "\tchain b {\n\t\treject\n\t}\n",
            "10.0.0.1 . tcp . 80 : goto a, 10.0.0.2 . tcp . 80 : goto b",
        ),
    );
    // As the server's commit: the listed elements may name the new chain.
    for s in &two.sets {
        m.handle(&s.name)
            .unwrap()
            .allow_verdicts(s.elements.iter().map(|(e, _)| e.verdict()));
        m.add(&s.name, s.elements.iter().copied(), 0).unwrap();
    }
    let next = Snapshot::compile_after(&first, &[Arc::new(two.ruleset)], &m, 1).expect("compiles");
    let at = |dst: &str| v4(Hook::Input, "192.0.2.1", dst, 6, 80);
    assert_eq!(verdict(&next, at("10.0.0.1")), Verdict::Drop);
    assert_eq!(
        verdict(&next, at("10.0.0.2")),
        Verdict::Reject(vallum_engine::model::RejectWith::PortUnreachable)
    );
}
