//! Matches the kernel decides for vallumd (`--nfqueue-facts-mark`, `vallumctl dataplane install
//! --facts-mark`) decide as in the kernel's own ruleset (root, iptables-legacy,
//! nfnetlink_queue): two runs, each in a fresh pair of network namespaces A (the firewall,
//! with TCP echo servers) -- B (the client), joined by a veth.
//!
//! - **kernel**: A's kernel holds the ruleset [`RULES`] itself (`iptables-legacy-restore`);
//! - **vallumd**: A's kernel holds the steering (with the facts chains) and the ruleset's nat
//!   table (`--kernel-tables nat`); `vallumd --source nfqueue` enforces the filter table, whose
//!   `--ctstate DNAT`, `--ctorigdst/--ctorigdstport`, `--ctstatus SEEN_REPLY`, `! --ctstatus
//!   SEEN_REPLY`, `--ctstatus ASSURED` and `-m policy` rules read the bits the kernel set.
//!
//! An IPv6 ruleset beside it reads `-m addrtype --src-type UNREACHABLE`, which needs the
//! kernel's lookup in its whole routing table.
//!
//! In each run B opens a TCP connection to each probe port of A and sends a line; the probe
//! passes when the echo comes back. Every probe's outcome must be what [`PROBES`] says (so two
//! runs that both drop everything cannot pass) and the same in both runs. Then a ruleset with
//! more distinct kernel-decided expressions than the field's 8 bits is refused at the first
//! rule that does not fit, and the active one keeps deciding.

use crate::support;
use crate::support::netns;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use netns::{in_netns, nsx, nsx_in, sh};
use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const A4: Ipv4Addr = Ipv4Addr::new(10, 245, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(10, 245, 0, 2);
const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x245, 0, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x245, 0, 0, 0, 0, 0, 2);

/// The facts field of the vallumd run: 8 bits.
const FACTS: &str = "0x00ff0000";

/// The ruleset of both runs: nat DNATs 80 to 8080 and 81 to 8081; filter's INPUT drops
/// everything no rule accepts.
fn rules() -> String {
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n\
         -A PREROUTING -d {A4}/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination {A4}:8080\n\
         -A PREROUTING -d {A4}/32 -p tcp -m tcp --dport 81 -j DNAT --to-destination {A4}:8081\n\
         COMMIT\n\
         *filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p tcp -m tcp --dport 8080 -m conntrack --ctstate DNAT -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8081 -m conntrack --ctorigdst {A4} --ctorigdstport 81 -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8082 --tcp-flags FIN,SYN,RST,ACK SYN -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8082 -m conntrack --ctstatus SEEN_REPLY -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8083 --tcp-flags FIN,SYN,RST,ACK SYN -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8083 -m conntrack ! --ctstatus SEEN_REPLY -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8086 --tcp-flags FIN,SYN,RST,ACK SYN -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8086 -m conntrack --ctstatus ASSURED -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8084 -m policy --dir in --pol none -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport 8085 -m policy --dir in --pol ipsec -j ACCEPT\n\
         COMMIT\n"
    )
}

/// The IPv6 ruleset of both runs: `-m addrtype` UNREACHABLE needs the kernel's route lookup
/// (ICMPv6 accepted for neighbour discovery).
const RULES_V6: &str = "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    -A INPUT -p ipv6-icmp -j ACCEPT\n\
    -A INPUT -p tcp -m tcp --dport 8087 -m addrtype ! --src-type UNREACHABLE -j ACCEPT\n\
    -A INPUT -p tcp -m tcp --dport 8088 -m addrtype --src-type UNREACHABLE -j ACCEPT\n\
    COMMIT\n";

/// (port B connects to, whether the echo comes back, why); ports from 8087 on are IPv6.
const PROBES: &[(u16, bool, &str)] = &[
    (80, true, "DNATed to 8080: --ctstate DNAT"),
    (8080, false, "8080 itself: not DNATed"),
    (81, true, "DNATed to 8081: --ctorigdst/--ctorigdstport 81"),
    (8081, false, "8081 itself: original port 8081"),
    (8082, true, "SYN, then --ctstatus SEEN_REPLY"),
    (
        8083,
        false,
        "SYN, then ! --ctstatus SEEN_REPLY: the ACK and data are dropped",
    ),
    (8086, true, "SYN, then --ctstatus ASSURED"),
    (8084, true, "-m policy --dir in --pol none"),
    (8085, false, "-m policy --dir in --pol ipsec: no IPsec here"),
    (
        8087,
        true,
        "IPv6: -m addrtype ! --src-type UNREACHABLE (B is routed)",
    ),
    (8088, false, "IPv6: -m addrtype --src-type UNREACHABLE"),
];

/// The ports A listens on (both families).
const LISTEN: [u16; 9] = [8080, 8081, 8082, 8083, 8084, 8085, 8086, 8087, 8088];

struct Pair {
    a: String,
    b: String,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let id = std::process::id() % 100_000;
        let p = Pair {
            a: format!("vkd-{tag}a-{id}"),
            b: format!("vkd-{tag}b-{id}"),
        };
        let (a_dev, b_dev) = (format!("vkd{tag}a{id}"), format!("vkd{tag}b{id}"));
        sh(&["ip", "netns", "add", &p.a]).expect("netns add");
        sh(&["ip", "netns", "add", &p.b]).expect("netns add");
        sh(&[
            "ip", "-n", &p.a, "link", "add", &a_dev, "type", "veth", "peer", "name", &b_dev,
            "netns", &p.b,
        ])
        .expect("veth");
        for (n, dev, addr, addr6) in [(&p.a, &a_dev, A4, A6), (&p.b, &b_dev, B4, B6)] {
            let (v4, v6) = (format!("{addr}/24"), format!("{addr6}/64"));
            sh(&["ip", "-n", n, "addr", "add", &v4, "dev", dev]).expect("addr");
            sh(&["ip", "-n", n, "addr", "add", &v6, "dev", dev, "nodad"]).expect("addr6");
            sh(&["ip", "-n", n, "link", "set", dev, "up"]).expect("up");
            sh(&["ip", "-n", n, "link", "set", "lo", "up"]).expect("lo up");
        }
        // Echo servers in A: one thread per port, each answering one line per connection.
        for port in LISTEN {
            let l = in_netns(&p.a, move || {
                // `::` takes both families (IPV6_V6ONLY is off by default).
                TcpListener::bind(("::", port)).expect("bind")
            });
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(mut s) = s else { return };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut buf = [0u8; 64];
                    if let Ok(n) = s.read(&mut buf) {
                        let _ = s.write_all(&buf[..n]);
                    }
                }
            });
        }
        p
    }

    /// Whether B's connection to A:`port` gets its line echoed (connect and read wait at most
    /// 3 s each: a dropped SYN, ACK or data segment means no echo).
    fn echo(&self, port: u16) -> bool {
        in_netns(&self.b, move || {
            let a: IpAddr = if port >= 8087 { A6.into() } else { A4.into() };
            let to = SocketAddr::from((a, port));
            let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_secs(3)) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
            let line = format!("probe {port}\n");
            if s.write_all(line.as_bytes()).is_err() {
                return false;
            }
            let mut got = vec![0u8; line.len()];
            s.read_exact(&mut got).is_ok() && got == line.as_bytes()
        })
    }

    fn probe_all(&self) -> Vec<(u16, bool)> {
        PROBES.iter().map(|(p, _, _)| (*p, self.echo(*p))).collect()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn apply(addr: &str, name: &str, text: &str, v6: &str) -> Result<(), tonic::Status> {
    let addr = addr.to_owned();
    let (name, text, v6) = (name.to_owned(), text.to_owned(), v6.to_owned());
    block_on(async move {
        let ch = support::connect(&addr).await;
        let mut src = text_source(&text, false, "kd.rules");
        if let Some(pb::ruleset_source::Source::Text(t)) = &mut src.source {
            t.content_v6 = v6;
        }
        pb::ruleset_service_client::RulesetServiceClient::new(ch)
            .apply(pb::ApplyRequest {
                ruleset: name,
                source: Some(src),
                ..Default::default()
            })
            .await
            .map(|_| ())
    })
}

/// The kernel run.
fn kernel_run() -> Vec<(u16, bool)> {
    let p = Pair::new("k");
    nsx_in(&p.a, &["iptables-legacy-restore"], &rules()).expect("load");
    nsx_in(&p.a, &["ip6tables-legacy-restore"], RULES_V6).expect("load v6");
    p.probe_all()
}

/// The vallumd run; also checks the refusal of too many expressions.
fn vallumd_run(db: &Path) -> Vec<(u16, bool)> {
    let p = Pair::new("v");
    nsx(
        &p.a,
        &[
            support::vallumctl().to_str().expect("a UTF-8 path"),
            "dataplane",
            "install",
            "--iptables",
            "iptables-legacy",
            "--queues",
            "2",
            "--facts-mark",
            FACTS,
        ],
    )
    .expect("dataplane install");
    let db = db.to_owned();
    let d = in_netns(&p.a, move || {
        let d = Daemon::start(
            &db,
            &[
                "--source",
                "nfqueue",
                "--nfqueue-facts-mark",
                FACTS,
                "--kernel-tables",
                "nat",
                "--kernel-tables-restore",
                "iptables-legacy-restore",
            ],
        );
        block_on(d.wait_serving());
        d
    });
    let addr = d.addr.clone();
    let a = in_netns(&p.a, move || apply(&addr, "kd", &rules(), RULES_V6));
    a.expect("apply");
    // The kernel's facts chain holds one rule per expression taken at INPUT, after the one
    // that clears the field.
    let save = nsx(&p.a, &["iptables-legacy-save", "-t", "filter"]).expect("save");
    let facts: Vec<&str> = save
        .lines()
        .filter(|l| l.starts_with("-A VALLUM-FACTS-INPUT "))
        .collect();
    assert_eq!(facts.len(), 8, "{save}");
    assert!(
        save.lines().any(|l| l == "-A INPUT -j VALLUM-FACTS-INPUT"),
        "{save}"
    );
    let seen = p.probe_all();
    // Nine distinct expressions do not fit 8 bits: refused at the rule, nothing changes.
    let mut over = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
    for port in 1..=9 {
        over.push_str(&format!(
            "-A INPUT -m conntrack --ctorigdstport {port} -j ACCEPT\n"
        ));
    }
    over.push_str("COMMIT\n");
    let addr = d.addr.clone();
    let e = in_netns(&p.a, move || apply(&addr, "over", &over, "")).expect_err("9 > 8 bits");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("--ctorigdstport") && e.message().contains("8 bits"),
        "{e:?}"
    );
    let again = p.probe_all();
    assert_eq!(seen, again, "the refused commit changed nothing");
    drop(d);
    seen
}

#[test]
#[ignore = "needs root, iptables-legacy, ip6tables-legacy, nfnetlink_queue and network namespaces"]
fn kernel_decided_matches_decide_as_the_kernel() {
    let _ = Command::new("modprobe").arg("nfnetlink_queue").output();
    let kernel = kernel_run();
    let dir = tempfile::tempdir().expect("tempdir");
    let ours = vallumd_run(&dir.path().join("v.db"));
    for (((port, want, why), k), (_, v)) in PROBES.iter().zip(&kernel).zip(&ours) {
        assert_eq!(k.1, *want, "kernel: port {port}: {why}");
        assert_eq!(v, &k.1, "vallumd: port {port}: {why}");
    }
}
