//! `-m conntrack --ctorigsrc/--ctorigdst/--ctreplsrc/--ctrepldst`, their `...port` twins,
//! `--ctproto` and `--ctdir`, read from the engine's conntrack entry: Docker's documented
//! DOCKER-USER recipes (restrict a published port by the original destination port, allow
//! replies by direction) through the engine with its tracker, and every option in the index
//! and the linear walk alike. `--ctstatus` and `--ctexpire` stay refused in filter/raw.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vallum_engine::Clock;
use vallum_engine::conntrack::{ConntrackConfig, NoTracking};
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::tcp_flags::{ACK, SYN};
use vallum_engine::model::{Family, Hook, ct_state};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot, Verdict};
use vallum_engine::validate::{Severity, validate};

/// Written after Docker's "restrict connections" recipes (docs.docker.com, packet
/// filtering): published port 8080 only from the LAN 192.168.1.0/24 (matched on the original
/// destination port, which survives the kernel's DNAT), replies by direction, SSH to the
/// container's address by the reply tuple's source.
const DOCKER_USER: &str = "\
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -j ACCEPT
-A DOCKER-USER -m conntrack --ctstate RELATED,ESTABLISHED --ctdir REPLY -j RETURN
-A DOCKER-USER -i eth0 ! -s 192.168.1.0/24 -p tcp -m conntrack --ctorigdstport 8080 --ctdir ORIGINAL -j DROP
-A DOCKER-USER -p tcp -m conntrack --ctproto 6 --ctreplsrc 172.17.0.2 --ctreplsrcport 22 -j DROP
-A DOCKER-USER -m conntrack --ctorigsrc 203.0.113.0/24 -j DROP
-A DOCKER-USER -m conntrack ! --ctorigdst 172.17.0.0/16 --ctdir ORIGINAL -j DROP
COMMIT
";

struct Frozen(AtomicU64);

impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

#[allow(clippy::too_many_arguments)]
fn fwd(src: &str, sport: u16, dst: &str, dport: u16, f: u8, i: &str, o: &str) -> Packet {
    Packet {
        meta: PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Forward,
            src: ip(src),
            dst: ip(dst),
            protocol: 6,
            sport,
            dport,
            tcp_flags: f,
            len: 60,
            ..PacketMeta::default()
        },
        facts: PacketFacts {
            in_iface: IfName::new(i).expect("name"),
            out_iface: IfName::new(o).expect("name"),
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
fn docker_user_recipes_through_the_tracker() {
    let rs = parse_ruleset("docker", DOCKER_USER, &ParseOptions::default()).expect("parses");
    assert!(validate(&rs, None).is_empty(), "{:?}", validate(&rs, None));
    let printed = vallum_engine::restore::print(&rs.tables, &Default::default());
    assert!(printed.contains(
        "-A DOCKER-USER -m conntrack --ctstate RELATED,ESTABLISHED --ctdir REPLY -j RETURN\n"
    ));
    assert!(
        printed.contains(
            "-m conntrack --ctproto 6 --ctreplsrc 172.17.0.2 --ctreplsrcport 22 -j DROP\n"
        )
    );
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
    let c = "172.17.0.2";
    // The kernel DNATed 198.51.100.1:8080 -> 172.17.0.2:8080 before queueing at FORWARD;
    // the engine's tracker sees the translated packet.
    let lan = fwd("192.168.1.9", 40000, c, 8080, SYN, "eth0", "docker0");
    assert_eq!(run(&e, lan, S), Verdict::Accept, "from the LAN");
    let wan = fwd("198.51.100.77", 40000, c, 8080, SYN, "eth0", "docker0");
    assert_eq!(run(&e, wan, S), Verdict::Drop, "port 8080 from outside");
    // The container's answer to the LAN client: the reply direction of an entry, RETURNed
    // by rule 1 before rule 5 (whose --ctdir ORIGINAL would not hold anyway).
    let back = fwd(c, 8080, "192.168.1.9", 40000, SYN | ACK, "docker0", "eth0");
    assert_eq!(run(&e, back, 2 * S), Verdict::Accept, "reply");
    // SSH to the container: the reply tuple's source is the container's port 22.
    let ssh = fwd("192.168.1.9", 40001, c, 22, SYN, "eth0", "docker0");
    assert_eq!(run(&e, ssh, 3 * S), Verdict::Drop, "ssh by reply source");
    // The original source of a blocked network.
    let bad = fwd("203.0.113.5", 40002, c, 80, SYN, "eth0", "docker0");
    assert_eq!(run(&e, bad, 3 * S), Verdict::Drop, "original source");
    // A connection to an address outside the container network (negated --ctorigdst).
    let out = fwd("192.168.1.9", 40003, "10.9.9.9", 80, SYN, "eth0", "eth1");
    assert_eq!(
        run(&e, out, 3 * S),
        Verdict::Drop,
        "negated original destination"
    );
    // An INVALID packet (no entry: a stray SYN-ACK) matches no tuple option, negated or not,
    // and reaches FORWARD's ACCEPT.
    let stray = fwd(
        "192.168.1.9",
        40004,
        "10.9.9.9",
        80,
        SYN | ACK,
        "eth0",
        "eth1",
    );
    assert_eq!(run(&e, stray, 4 * S), Verdict::Accept, "no entry");
}

#[test]
fn every_tuple_option_agrees_in_both_classifiers() {
    let mut text =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    let opts = [
        "--ctorigsrc 10.0.0.0/8",
        "! --ctorigsrc 10.0.0.0/8",
        "--ctorigdst 10.1.2.3",
        "--ctreplsrc 10.1.2.3",
        "! --ctrepldst 10.0.0.0/255.0.0.255",
        "--ctorigsrcport 1000:2000",
        "! --ctorigdstport 80",
        "--ctreplsrcport 80",
        "--ctrepldstport 1500",
        "--ctproto 17",
        "! --ctproto 6",
        "--ctdir REPLY",
        "--ctstate NEW --ctdir ORIGINAL",
        "--ctstate ESTABLISHED --ctorigdst 10.1.2.3",
    ];
    for (i, o) in opts.iter().enumerate() {
        // Indexed fields too (-s, -p), so the TupleMerge tables hold these rules.
        let s = if i % 2 == 0 { "-s 10.0.0.0/8 " } else { "" };
        text += &format!("-A INPUT {s}-m conntrack {o}\n");
    }
    text += "-A INPUT -m conntrack --ctorigdst 10.1.2.3 -j DROP\nCOMMIT\n";
    let rs = Arc::new(parse_ruleset("t", &text, &ParseOptions::default()).expect("parses"));
    assert!(validate(&rs, None).is_empty());
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
    let addrs = ["10.1.2.3", "10.7.0.3", "192.0.2.1"];
    let mut n = 0;
    let mut batch = Vec::new();
    for src in addrs {
        for dst in addrs {
            for (proto, sport, dport) in [(6, 1500, 80), (17, 80, 1500), (6, 3000, 443)] {
                for st in [ct_state::NEW, ct_state::ESTABLISHED, ct_state::INVALID] {
                    for reply in [false, true] {
                        let p = PacketMeta {
                            family: Family::Ipv4,
                            hook: Hook::Input,
                            src: ip(src),
                            dst: ip(dst),
                            protocol: proto,
                            sport,
                            dport,
                            len: 40,
                            ct_state: st,
                            ct_reply: reply,
                            ..PacketMeta::default()
                        };
                        let t = linear.trace(&p, 0);
                        assert_eq!(t, indexed.trace(&p, 0), "{p:?}");
                        n += t.steps.len();
                        batch.push(p);
                    }
                }
            }
        }
    }
    assert!(n > batch.len(), "some options matched");
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
    for (p, v) in batch.iter().zip(&verdicts) {
        assert_eq!(*v, linear.trace(p, 0).verdict, "{p:?}");
    }
    // A REPLY packet of 10.1.2.3's flow has the original destination as its source.
    let reply = PacketMeta {
        family: Family::Ipv4,
        hook: Hook::Input,
        src: ip("10.1.2.3"),
        dst: ip("192.0.2.1"),
        protocol: 6,
        ct_state: ct_state::ESTABLISHED,
        ct_reply: true,
        ..PacketMeta::default()
    };
    assert_eq!(linear.trace(&reply, 0).verdict, Verdict::Drop);
    assert_eq!(
        linear
            .trace(
                &PacketMeta {
                    ct_reply: false,
                    ..reply
                },
                0
            )
            .verdict,
        Verdict::Accept
    );
}

#[test]
fn status_and_expire_stay_refused() {
    for o in ["--ctstatus ASSURED", "--ctexpire 10:20"] {
        let text = format!("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m conntrack {o}\nCOMMIT\n");
        let rs = parse_ruleset("t", &text, &ParseOptions::default()).expect("parses");
        let v = validate(&rs, None);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].severity, Severity::Error);
        assert!(v[0].to_string().contains("not supported"), "{}", v[0]);
    }
}
