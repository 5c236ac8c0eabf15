//! What REJECT costs under NFQUEUE (root, iptables-legacy, nfnetlink_queue): a measurement for
//! BENCHMARKS.md ("REJECT under NFQUEUE"), printed as a table; it asserts only outcomes (every
//! connect refused, every packet decided), never a duration.
//!
//! Cases, each in a fresh pair of network namespaces A (the firewall) -- B (the client):
//! - `kernel`: A's kernel holds `-A INPUT -p tcp --dport 7100 -j REJECT --reject-with
//!   tcp-reset`, `-A INPUT -p udp --dport 7000 -j REJECT` and `-A INPUT -p udp --dport 7001 -j
//!   DROP` itself;
//! - `vallumd`: A's kernel holds `vallumctl dataplane install` (reject mark 0x0f000000) and
//!   vallumd (`--source nfqueue`, 2 cores) enforces the same rules: its REJECT goes back as
//!   `NF_REPEAT` with the code in the mark, and the steering's `VALLUM-REJECT-*` chain answers
//!   with the kernel's REJECT; its DROP is `NF_DROP`.
//!
//! Per case: (1) time to ECONNREFUSED: B calls `connect()` to A:7100 `REFUSALS` times, one
//! after the other, and the median and 99th percentile of the call's duration are printed (a
//! DROP gets no answer: the client retransmits its SYN after 1 s and fails after
//! `tcp_syn_retries`, about 127 s); (2) packets decided per second: B sends `FLOOD` UDP
//! datagrams as fast as one socket can to A:7000 (REJECT; A's ICMP rate limit off, so each
//! gets its port unreachable) and then to A:7001 (DROP), and the rule's counter (vallumd's
//! counters, or iptables-legacy's) is read until it stops moving; the rate is the count over
//! the time from the first datagram sent to the last count seen.
//!
//! Run: `cargo test -p vallum-server --test it -- reject_cost:: --ignored --nocapture` (a debug
//! build unless `--release`; the table says which).

use crate::support;
use crate::support::netns;

use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use netns::{in_netns, nsx, nsx_in, sh};
use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const A4: Ipv4Addr = Ipv4Addr::new(10, 246, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(10, 246, 0, 2);
const REFUSALS: usize = 300;
const FLOOD: usize = 50_000;

const RULES: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    -A INPUT -p tcp -m tcp --dport 7100 -j REJECT --reject-with tcp-reset\n\
    -A INPUT -p udp -m udp --dport 7000 -j REJECT --reject-with icmp-port-unreachable\n\
    -A INPUT -p udp -m udp --dport 7001 -j DROP\nCOMMIT\n";

struct Pair {
    a: String,
    b: String,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let id = std::process::id() % 100_000;
        let p = Pair {
            a: format!("vrc-{tag}a-{id}"),
            b: format!("vrc-{tag}b-{id}"),
        };
        let (a_dev, b_dev) = (format!("vrc{tag}a{id}"), format!("vrc{tag}b{id}"));
        sh(&["ip", "netns", "add", &p.a]).expect("netns add");
        sh(&["ip", "netns", "add", &p.b]).expect("netns add");
        sh(&[
            "ip", "-n", &p.a, "link", "add", &a_dev, "type", "veth", "peer", "name", &b_dev,
            "netns", &p.b,
        ])
        .expect("veth");
        for (n, dev, addr) in [(&p.a, &a_dev, A4), (&p.b, &b_dev, B4)] {
            sh(&[
                "ip",
                "-n",
                n,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                dev,
            ])
            .expect("addr");
            sh(&["ip", "-n", n, "link", "set", dev, "up"]).expect("up");
            sh(&["ip", "-n", n, "link", "set", "lo", "up"]).expect("lo up");
        }
        // Every REJECT answered: no ICMP rate limit in A.
        nsx(&p.a, &["sysctl", "-qw", "net.ipv4.icmp_ratemask=0"]).expect("sysctl");
        // A connection to a refused port must not wait for ARP.
        let warm = in_netns(&p.b, || {
            TcpStream::connect_timeout(&SocketAddr::from((A4, 7100)), Duration::from_secs(3))
        });
        assert!(warm.is_err());
        p
    }

    /// The durations of `REFUSALS` connects to A:7100, each of which must be refused.
    fn refusals(&self) -> Vec<Duration> {
        in_netns(&self.b, || {
            (0..REFUSALS)
                .map(|_| {
                    let t = Instant::now();
                    let e = TcpStream::connect_timeout(
                        &SocketAddr::from((A4, 7100)),
                        Duration::from_secs(5),
                    )
                    .expect_err("refused");
                    let d = t.elapsed();
                    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
                    d
                })
                .collect()
        })
    }

    /// Sends `FLOOD` datagrams to A:`port`; returns when the sending started.
    fn flood(&self, port: u16) -> Instant {
        in_netns(&self.b, move || {
            let s = UdpSocket::bind((B4, 0)).expect("bind");
            let to = SocketAddr::from((A4, port));
            let t = Instant::now();
            let mut sent = 0;
            while sent < FLOOD {
                match s.send_to(&[0u8; 18], to) {
                    Ok(_) => sent += 1,
                    // A full socket buffer (or an ICMP error reported on the socket).
                    Err(_) => std::thread::yield_now(),
                }
            }
            t
        })
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Reads `count` until it has not moved for 300 ms; returns the last count and when it was
/// first seen.
fn settle(mut count: impl FnMut() -> u64) -> (u64, Instant) {
    let (mut last, mut at) = (count(), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let n = count();
        if n != last {
            (last, at) = (n, Instant::now());
        } else if at.elapsed() > Duration::from_millis(300) {
            return (last, at);
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

/// The kernel's packet count of the INPUT rule for `dport` (iptables-legacy-save -c).
fn kernel_count(ns: &str, dport: u16) -> u64 {
    let save = nsx(ns, &["iptables-legacy-save", "-c", "-t", "filter"]).expect("save");
    let pat = format!("--dport {dport} ");
    save.lines()
        .filter(|l| l.contains(&pat))
        .filter_map(|l| l.strip_prefix('[')?.split(':').next()?.parse::<u64>().ok())
        .sum()
}

/// vallumd's packet count of its INPUT rule for `dport`.
fn vallumd_count(ns: &str, addr: &str, dport: u16) -> u64 {
    let addr = addr.to_owned();
    let rule = match dport {
        7100 => 1,
        7000 => 2,
        _ => 3,
    };
    in_netns(ns, move || {
        block_on(async move {
            let ch = support::connect(&addr).await;
            pb::counter_service_client::CounterServiceClient::new(ch)
                .get_counters(pb::GetCountersRequest {
                    ruleset: "rc".into(),
                    ..Default::default()
                })
                .await
                .expect("counters")
                .into_inner()
                .counters
                .iter()
                .filter(|c| c.chain == "INPUT" && c.rule == rule)
                .map(|c| c.packets)
                .sum()
        })
    })
}

struct Row {
    case: &'static str,
    p50: Duration,
    p99: Duration,
    reject_pps: f64,
    drop_pps: f64,
    reject_seen: u64,
    drop_seen: u64,
}

fn measure(p: &Pair, case: &'static str, count: &dyn Fn(u16) -> u64) -> Row {
    let mut d = p.refusals();
    d.sort();
    let (p50, p99) = (d[d.len() / 2], d[d.len() * 99 / 100]);
    let rate = |port: u16| {
        let before = count(port);
        let t0 = p.flood(port);
        let (n, at) = settle(|| count(port));
        let n = n - before;
        (n as f64 / at.duration_since(t0).as_secs_f64(), n)
    };
    let (reject_pps, reject_seen) = rate(7000);
    let (drop_pps, drop_seen) = rate(7001);
    Row {
        case,
        p50,
        p99,
        reject_pps,
        drop_pps,
        reject_seen,
        drop_seen,
    }
}

fn vallumd_case(db: &Path) -> Row {
    let p = Pair::new("v");
    nsx(
        &p.a,
        &[
            support::vallumctl().to_str().expect("a UTF-8 path"),
            "dataplane",
            "install",
            "--iptables",
            "iptables-legacy",
            "--family",
            "ipv4",
            "--queues",
            "2",
        ],
    )
    .expect("dataplane install");
    let db = db.to_owned();
    let d = in_netns(&p.a, move || {
        let d = Daemon::start(&db, &["--source", "nfqueue"]);
        block_on(async {
            d.wait_serving().await;
            d.rulesets()
                .await
                .apply(pb::ApplyRequest {
                    ruleset: "rc".into(),
                    source: Some(text_source(RULES, false, "rc.rules")),
                    ..Default::default()
                })
                .await
                .expect("apply");
        });
        d
    });
    let (a, addr) = (p.a.clone(), d.addr.clone());
    let row = measure(&p, "vallumd (NF_REPEAT to the kernel's REJECT)", &|port| {
        vallumd_count(&a, &addr, port)
    });
    drop(d);
    row
}

#[test]
#[ignore = "a measurement: needs root, iptables-legacy, nfnetlink_queue and network namespaces"]
fn reject_cost() {
    let _ = Command::new("modprobe").arg("nfnetlink_queue").output();
    let kernel = {
        let p = Pair::new("k");
        nsx_in(&p.a, &["iptables-legacy-restore"], RULES).expect("load");
        let a = p.a.clone();
        measure(&p, "kernel (its own REJECT, DROP)", &|port| {
            kernel_count(&a, port)
        })
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ours = vallumd_case(&dir.path().join("v.db"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "REJECT under NFQUEUE ({profile} build, load {}): {REFUSALS} connects, {FLOOD} datagrams a flood",
        load.trim()
    );
    println!(
        "| case | connect to ECONNREFUSED p50 | p99 | REJECT kpps | DROP kpps | REJECT / DROP |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for r in [&kernel, &ours] {
        // The rules decided packets of both floods (a queue that overflows lets the rest
        // through uncounted: fail-open, vallumd's default; the table says how many).
        assert!(r.reject_seen > 0 && r.drop_seen > 0, "{}", r.case);
        println!(
            "| {} | {:.0} us | {:.0} us | {:.1} ({} of {FLOOD}) | {:.1} ({} of {FLOOD}) | {:.2} |",
            r.case,
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            r.reject_pps / 1e3,
            r.reject_seen,
            r.drop_pps / 1e3,
            r.drop_seen,
            r.reject_pps / r.drop_pps
        );
    }
}
