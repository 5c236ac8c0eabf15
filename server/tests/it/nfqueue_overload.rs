//! NFQUEUE above capacity (root only; ignored unless asked for): namespaces A and B joined by
//! a veth pair; in A `vallumd --source nfqueue` slowed down with the hidden test flag
//! `--test-nfqueue-batch-delay-us` (a pause after each batch: about 16k packets/s), the
//! steering of `vallumctl dataplane install --queues 1 --family ipv4`, and two UDP receivers;
//! from B a flood of UDP datagrams, alternately to a port the ruleset accepts and one it
//! drops. Every packet is accounted for, against what B sent and what the receivers got:
//!
//! - fail-open (default queue length): the socket buffer fills, the kernel accepts the rest
//!   unclassified; `vallum_nfqueue_bypassed_total` is exactly the packets the NFQUEUE rule
//!   took (its iptables counter) minus those vallumd received, the receivers got exactly the
//!   accepted plus the bypassed ones, and the port the rules drop received the bypassed share;
//! - fail-closed with `--queue-maxlen 64`: the queue fills, the kernel drops; the NFQUEUE rule's
//!   packets are exactly received + `queue_dropped` + `user_dropped`, the receivers got exactly
//!   what vallumd accepted and the dropped port nothing;
//! - fail-open with `--queue-maxlen 64`: the queue fills before the socket, and the kernel's
//!   accepts there are counted nowhere: `vallum_nfqueue_bypass_exact` is 0, and the receivers
//!   got the accepted plus every packet the rule took that vallumd did not receive.
//!
//! Each run waits until these counts balance (nothing awaiting a verdict, every packet B sent
//! through the NFQUEUE rule), not until they stop moving for a while, and the receivers read
//! what is left in their buffers before they stop: so it holds on a loaded machine where the
//! sender, vallumd, the receivers and the kernel's softirqs all wait for a CPU. The numbers of
//! each run are printed (docs/operations.md quotes them).
//!
//! `new_only_queues_only_new_connections`: with `vallumctl dataplane install --new-only` and
//! `vallumd --steered-new-only`, a rule `--ctstate ESTABLISHED` gets the HOOK_NOT_REACHED
//! warning, and a TCP connection with 20 round trips reaches vallumd as one packet (its SYN):
//! the NFQUEUE rule's counter and vallumd's received count are both 1, the kernel's
//! ESTABLISHED accept took the rest, and vallumd's ESTABLISHED rule counted nothing.

use crate::support;
use crate::support::netns;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use netns::{in_netns, on_path};
use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 233, 0, 1);
const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 233, 0, 2);
/// The port the ruleset accepts, and the one it drops.
const PASS: u16 = 9000;
const BLOCK: u16 = 9001;
/// Datagrams B sends per run, alternating between the two ports.
const FLOOD: u64 = 100_000;
/// The worker's pause after each batch, microseconds.
const DELAY_US: &str = "2000";

const RULES: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    -A INPUT -p udp -m udp --dport 9000 -j ACCEPT\n-A INPUT -p udp -m udp --dport 9001 -j DROP\n\
    COMMIT\n";

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces, iptables and NFQUEUE need it)".into());
    }
    for tool in ["ip", "iptables", "iptables-restore"] {
        if !on_path(tool) {
            return Some(format!("`{tool}` is not on PATH"));
        }
    }
    let _ = Command::new("modprobe").arg("nfnetlink_queue").output();
    if !Path::new("/proc/net/netfilter/nfnetlink_queue").exists() {
        return Some("the nfnetlink_queue kernel module is not available".into());
    }
    None
}

fn try_run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run(cmd: &mut Command) -> String {
    try_run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

fn nsx(ns: &str, args: &[&str]) -> String {
    run(Command::new("ip").args(["netns", "exec", ns]).args(args))
}

/// Namespaces A and B with a veth pair; deleted on drop.
struct Netns {
    a: String,
    b: String,
    vb: String,
}

impl Netns {
    /// Namespaces `vallum-{tag}a-PID` and `vallum-{tag}b-PID` (tests of this file run in
    /// parallel in one process: each uses its own one-letter `tag`).
    fn new(tag: char) -> Result<Netns, String> {
        let id = std::process::id();
        let ns = Netns {
            a: format!("vallum-{tag}a-{id}"),
            b: format!("vallum-{tag}b-{id}"),
            vb: format!("v{tag}b{}", id % 100_000),
        };
        try_run(Command::new("ip").args(["netns", "add", &ns.a]))?;
        try_run(Command::new("ip").args(["netns", "add", &ns.b]))?;
        let va = format!("v{tag}a{}", id % 100_000);
        let ip = |args: &[&str]| run(Command::new("ip").args(args));
        ip(&[
            "-n", &ns.a, "link", "add", &va, "type", "veth", "peer", "name", &ns.vb, "netns", &ns.b,
        ]);
        for (n, dev, addr) in [(&ns.a, &va, A_ADDR), (&ns.b, &ns.vb, B_ADDR)] {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", n, "link", "set", dev, "up"]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// A UDP receiver in A with a large receive buffer, reading on its own thread until `stop`;
/// the thread's result is the datagrams it read. Once it sees `stop` it reads what is still
/// in its buffer without waiting and closes the socket, so the count is every datagram the
/// kernel delivered to the port before `stop` was set, however late the thread was scheduled
/// (the caller sets `stop` only once every packet has its verdict: nothing more arrives).
fn receiver(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let s = UdpSocket::bind((A_ADDR, port)).unwrap_or_else(|e| panic!("bind udp {port}: {e}"));
    let big: libc::c_int = 64 << 20;
    // SAFETY: `big` is a live c_int of the size passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&big as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while !stop.load(Ordering::Acquire) {
            if s.recv_from(&mut buf).is_ok() {
                n += 1;
            }
        }
        s.set_nonblocking(true).expect("nonblocking");
        loop {
            match s.recv_from(&mut buf) {
                Ok(_) => n += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("recv udp {port}: {e}"),
            }
        }
    })
}

/// `GET /metrics` of `d` (from inside A), as name{labels} -> value for the nfqueue series.
fn scrape(a: &str, d: &Daemon) -> BTreeMap<String, u64> {
    let addr = d.metrics_addr.clone();
    let text = in_netns(a, move || {
        let mut s = TcpStream::connect(&addr).expect("connect /metrics");
        write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").expect("request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("response");
        out
    });
    text.lines()
        .filter(|l| l.starts_with("vallum_nfqueue_"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse::<f64>().ok()? as u64))
        })
        .collect()
}

fn metric(m: &BTreeMap<String, u64>, name: &str, labels: &str) -> Option<u64> {
    m.get(&format!("{name}{{{labels}}}")).copied()
}

/// Packets the NFQUEUE rule of the steering chain took (its iptables counter).
fn nfqueue_rule_packets(a: &str) -> u64 {
    let out = nsx(
        a,
        &[
            "iptables",
            "-w",
            "-t",
            "filter",
            "-L",
            "VALLUM-NFQUEUE",
            "-v",
            "-x",
            "-n",
        ],
    );
    out.lines()
        .filter(|l| l.contains("NFQUEUE"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `Udp: ... RcvbufErrors` of namespace `ns` (datagrams a full socket buffer dropped).
fn udp_rcvbuf_errors(ns: &str) -> u64 {
    let snmp = nsx(ns, &["cat", "/proc/net/snmp"]);
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (h, v) = (udp.next().unwrap_or(""), udp.next().unwrap_or(""));
    h.split_whitespace()
        .zip(v.split_whitespace())
        .find(|(k, _)| *k == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// TX drops of B's veth end (`ip -s link`): datagrams that never left B.
fn tx_dropped(b: &str, dev: &str) -> u64 {
    let out = nsx(
        b,
        &[
            "cat",
            &format!("/sys/class/net/{dev}/statistics/tx_dropped"),
        ],
    );
    out.trim().parse().unwrap_or(0)
}

/// What one run saw.
#[derive(Debug)]
struct Run {
    sent: u64,
    tx_dropped: u64,
    nfqueue_rule: u64,
    received: u64,
    accepted: u64,
    dropped: u64,
    bypassed: Option<u64>,
    queue_dropped: u64,
    user_dropped: u64,
    socket_drops: u64,
    ids: u64,
    /// Packets a copy-range request answered NF_REPEAT (ids taken, not received, crossing
    /// the NFQUEUE rule twice).
    requeued: u64,
    got_pass: u64,
    got_block: u64,
    rcvbuf_errors: u64,
    exact: u64,
}

/// One flood against vallumd bound fail-closed or not, with `--queue-maxlen` when given.
fn flood(ns: &Netns, fail_closed: bool, maxlen: Option<&'static str>) -> Run {
    let (a, b) = (ns.a.clone(), ns.b.clone());
    let vallumctl = support::vallumctl().to_owned();
    let mut install = vec!["dataplane", "install", "--queues", "1", "--family", "ipv4"];
    if fail_closed {
        install.push("--fail-closed");
    }
    run(Command::new("ip")
        .args(["netns", "exec", &a])
        .arg(&vallumctl)
        .args(&install));
    run(Command::new("ip").args(["netns", "exec", &a, "iptables", "-w", "-Z"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let source = if fail_closed {
        "nfqueue,fail-closed"
    } else {
        "nfqueue"
    };
    let mut flags = vec![
        "--source",
        source,
        "--test-nfqueue-batch-delay-us",
        DELAY_US,
    ];
    if let Some(n) = maxlen {
        flags.extend(["--queue-maxlen", n]);
    }
    let (d, _dir, receivers) = in_netns(&a, move || {
        let receivers = [receiver(PASS, st.clone()), receiver(BLOCK, st)];
        let d = Daemon::start(&db, &flags);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            d.wait_serving().await;
            d.rulesets()
                .await
                .apply(pb::ApplyRequest {
                    ruleset: "overload".into(),
                    source: Some(text_source(RULES, false, "overload.rules")),
                    ..Default::default()
                })
                .await
                .expect("apply");
        });
        (d, dir, receivers)
    });
    let rcvbuf_before = udp_rcvbuf_errors(&a);
    let vb = ns.vb.clone();
    let drop_before = tx_dropped(&b, &vb);
    let began = std::time::Instant::now();
    let sent = in_netns(&b, move || {
        let s = UdpSocket::bind((B_ADDR, 0)).expect("bind");
        let payload = [0x5a_u8; 36];
        (0..FLOOD)
            .filter(|i| {
                let port = if i % 2 == 0 { PASS } else { BLOCK };
                s.send_to(&payload, (A_ADDR, port)).is_ok()
            })
            .count() as u64
    });
    // Printed only, for the docs: the offered rate.
    let took = began.elapsed();
    println!(
        "flood: {sent} datagrams in {took:?} ({:.0} packets/s)",
        sent as f64 / took.as_secs_f64()
    );
    let tx = tx_dropped(&b, &vb) - drop_before;
    // Wait until every packet B sent is accounted for: the kernel holds none awaiting a
    // verdict (`waiting` 0), every packet vallumd read has its verdict counted, and what B
    // sent = what the NFQUEUE rule took (each once) + B's own drops. Nothing is in flight
    // then (packets still in a softirq backlog have not reached the rule yet), however the
    // scheduler delayed the sender, vallumd or the kernel's softirqs. Waiting on these counts
    // rather than on counts that stopped moving for a while is what holds on a loaded
    // machine. A run that never balances ends after the deadline, and the assertions below
    // say which count is off.
    let q = "queue=\"0\"";
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let mut last = None;
    let (m, rule) = loop {
        // The rule's counter first: a packet it counts after this read cannot make the
        // balance below hold, one it counted before is in the scrape's numbers.
        let rule = nfqueue_rule_packets(&a);
        let m = scrape(&a, &d);
        let get = |name: &str| metric(&m, name, q).unwrap_or(0);
        let received = get("vallum_nfqueue_received_total");
        let verdicts = metric(
            &m,
            "vallum_nfqueue_verdicts_total",
            "queue=\"0\",verdict=\"accept\"",
        )
        .unwrap_or(0)
            + metric(
                &m,
                "vallum_nfqueue_verdicts_total",
                "queue=\"0\",verdict=\"drop\"",
            )
            .unwrap_or(0);
        let lost =
            get("vallum_nfqueue_socket_drops_total").max(get("vallum_nfqueue_user_dropped_total"));
        let requeued = get("vallum_nfqueue_kernel_ids_total").saturating_sub(received + lost);
        let balanced = metric(&m, "vallum_nfqueue_waiting", q) == Some(0)
            && received == verdicts
            && sent == rule.saturating_sub(requeued) + tx;
        // Balanced twice in a row with the same counts, or out of time.
        let now = balanced.then_some((rule, received, lost, requeued));
        if (now.is_some() && now == last) || std::time::Instant::now() > deadline {
            break (m, rule);
        }
        last = now;
        std::thread::sleep(Duration::from_millis(200));
    };
    // Every verdict has been given, so every datagram the kernel will deliver is in the
    // receivers' buffers: they read what is left and stop.
    stop.store(true, Ordering::Release);
    let [got_pass, got_block] =
        receivers.map(|r| r.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
    let get = |name: &str| metric(&m, name, q).unwrap_or_else(|| panic!("no {name}: {m:#?}"));
    let (ids, received) = (
        get("vallum_nfqueue_kernel_ids_total"),
        get("vallum_nfqueue_received_total"),
    );
    let lost =
        get("vallum_nfqueue_socket_drops_total").max(get("vallum_nfqueue_user_dropped_total"));
    // A copy-range change during the flood (the worker's first batch lowers it to what the
    // rules read) answers the packets that arrive while it waits for the kernel's ack
    // NF_REPEAT: they took an id, were not counted as received, and cross the NFQUEUE rule a
    // second time. Counted here from the kernel's ids, so each sent packet is one traversal.
    let requeued = ids.saturating_sub(received + lost);
    let r = Run {
        sent,
        tx_dropped: tx,
        nfqueue_rule: rule - requeued,
        received,
        accepted: metric(
            &m,
            "vallum_nfqueue_verdicts_total",
            "queue=\"0\",verdict=\"accept\"",
        )
        .unwrap_or(0),
        dropped: metric(
            &m,
            "vallum_nfqueue_verdicts_total",
            "queue=\"0\",verdict=\"drop\"",
        )
        .unwrap_or(0),
        bypassed: metric(&m, "vallum_nfqueue_bypassed_total", q),
        queue_dropped: get("vallum_nfqueue_queue_dropped_total"),
        user_dropped: get("vallum_nfqueue_user_dropped_total"),
        socket_drops: get("vallum_nfqueue_socket_drops_total"),
        ids,
        requeued,
        got_pass,
        got_block,
        rcvbuf_errors: udp_rcvbuf_errors(&a) - rcvbuf_before,
        exact: get("vallum_nfqueue_bypass_exact"),
    };
    println!(
        "{} --queue-maxlen {}: {r:?}\n/proc/net/netfilter/nfnetlink_queue:\n{}",
        if fail_closed {
            "fail-closed"
        } else {
            "fail-open"
        },
        maxlen.unwrap_or("(default)"),
        nsx(&a, &["cat", "/proc/net/netfilter/nfnetlink_queue"])
    );
    drop(d);
    r
}

#[test]
#[ignore = "needs root, iptables, iproute2 and nfnetlink_queue"]
fn overload_is_counted_fail_open_and_fail_closed() {
    if let Some(why) = skip_reason() {
        panic!("overload_is_counted_fail_open_and_fail_closed: {why}");
    }
    let ns = match Netns::new('o') {
        Ok(ns) => ns,
        Err(why) => {
            panic!("overload_is_counted_fail_open_and_fail_closed: {why}");
        }
    };
    if let Err(why) = try_run(
        Command::new("ip")
            .args(["netns", "exec", &ns.a])
            .arg(support::vallumctl())
            .args([
                "dataplane",
                "install",
                "--queues",
                "1",
                "--family",
                "ipv4",
                "--dry-run",
            ]),
    )
    .and_then(|_| {
        try_run(Command::new("ip").args(["netns", "exec", &ns.a, "iptables", "-w", "-S"]))
    }) {
        panic!("overload_is_counted_fail_open_and_fail_closed: {why}");
    }

    let open = flood(&ns, false, None);
    // Everything B sent reached the NFQUEUE rule (or was dropped on B's side, counted).
    assert_eq!(open.sent, open.nfqueue_rule + open.tx_dropped, "{open:?}");
    let bypassed = open.bypassed.expect("fail-open exports bypassed");
    assert!(bypassed > 0, "the flood must overload the queue: {open:?}");
    assert_eq!(open.exact, 1, "{open:?}");
    // Exact: every packet the rule took was classified or counted as bypassed.
    assert_eq!(open.nfqueue_rule, open.received + bypassed, "{open:?}");
    // Every id the kernel took is a packet received, a socket drop, or one `requeued` (which
    // the first assertion checks against the rule's own counter): never fewer ids.
    assert!(
        open.ids >= open.received + open.socket_drops,
        "{} requeued: {open:?}",
        open.requeued
    );
    assert_eq!((open.queue_dropped, open.user_dropped), (0, 0), "{open:?}");
    assert_eq!(open.received, open.accepted + open.dropped, "{open:?}");
    // What reached the receivers: the accepted plus the bypassed, some of them for the port
    // the rules drop.
    assert_eq!(
        open.got_pass + open.got_block + open.rcvbuf_errors,
        open.accepted + bypassed,
        "{open:?}"
    );
    assert!(
        open.got_block > 0,
        "bypassed packets skip the DROP rule: {open:?}"
    );

    let closed = flood(&ns, true, Some("64"));
    assert_eq!(
        closed.sent,
        closed.nfqueue_rule + closed.tx_dropped,
        "{closed:?}"
    );
    assert_eq!(closed.bypassed, None, "{closed:?}");
    let kernel_drops = closed.queue_dropped + closed.user_dropped;
    assert!(
        kernel_drops > 0,
        "the flood must overload the queue: {closed:?}"
    );
    assert_eq!(
        closed.nfqueue_rule,
        closed.received + kernel_drops,
        "{closed:?}"
    );
    assert_eq!(
        closed.received,
        closed.accepted + closed.dropped,
        "{closed:?}"
    );
    assert_eq!(
        closed.got_pass + closed.rcvbuf_errors,
        closed.accepted,
        "{closed:?}"
    );
    assert_eq!(closed.got_block, 0, "{closed:?}");

    // Fail-open with a short queue: the accepts at the full queue are counted nowhere, the
    // metrics say so (bypass_exact 0), and only the NFQUEUE rule's counter shows them.
    let short = flood(&ns, false, Some("64"));
    assert_eq!(
        short.sent,
        short.nfqueue_rule + short.tx_dropped,
        "{short:?}"
    );
    assert_eq!(short.exact, 0, "{short:?}");
    let counted = short.bypassed.expect("fail-open exports bypassed");
    let unclassified = short.nfqueue_rule - short.received;
    assert!(unclassified > counted, "{short:?}");
    assert_eq!(
        short.got_pass + short.got_block + short.rcvbuf_errors,
        short.accepted + unclassified,
        "{short:?}"
    );
}

/// Port of the TCP echo server of the new-only test.
const TCP_PORT: u16 = 7100;

const STATEFUL: &str = "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
    -A INPUT -p tcp -m tcp --dport 7100 -j ACCEPT\nCOMMIT\n";

#[test]
#[ignore = "needs root, iptables, iproute2 and nfnetlink_queue"]
fn new_only_queues_only_new_connections() {
    if let Some(why) = skip_reason() {
        panic!("new_only_queues_only_new_connections: {why}");
    }
    let ns = match Netns::new('n') {
        Ok(ns) => ns,
        Err(why) => {
            panic!("new_only_queues_only_new_connections: {why}");
        }
    };
    let (a, b) = (ns.a.clone(), ns.b.clone());
    let install = [
        "dataplane",
        "install",
        "--queues",
        "1",
        "--family",
        "ipv4",
        "--new-only",
    ];
    if let Err(why) = try_run(
        Command::new("ip")
            .args(["netns", "exec", &a])
            .arg(support::vallumctl())
            .args(install),
    ) {
        panic!("new_only_queues_only_new_connections: {why}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    let (d, warnings) = in_netns(&a, move || {
        let l = std::net::TcpListener::bind((A_ADDR, TCP_PORT)).expect("bind tcp");
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let d = Daemon::start(&db, &["--source", "nfqueue", "--steered-new-only"]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let warnings = rt.block_on(async {
            d.wait_serving().await;
            let mut rs = d.rulesets().await;
            let v = rs
                .validate_ruleset(pb::ValidateRulesetRequest {
                    ruleset: "new".into(),
                    source: Some(text_source(STATEFUL, false, "new.rules")),
                })
                .await
                .expect("validate")
                .into_inner();
            assert!(v.valid, "warnings only: {:?}", v.violations);
            rs.apply(pb::ApplyRequest {
                ruleset: "new".into(),
                source: Some(text_source(STATEFUL, false, "new.rules")),
                ..Default::default()
            })
            .await
            .expect("apply");
            v.violations
                .iter()
                .filter(|v| v.reason == "HOOK_NOT_REACHED")
                .map(|v| format!("{} {}: {}", v.location, v.path, v.message))
                .collect::<Vec<_>>()
        });
        (d, warnings)
    });
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("new.rules:5:1 ")
            && warnings[0].contains("--ctstate ESTABLISHED,RELATED matches only packets of established or related connections")
            && warnings[0].contains("--steered-new-only"),
        "{warnings:?}"
    );
    let trips = in_netns(&b, || {
        let mut s = TcpStream::connect((A_ADDR, TCP_PORT)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        (0..20)
            .filter(|i| {
                let msg = format!("round trip {i:02}");
                let mut got = [0u8; 13];
                s.write_all(msg.as_bytes()).is_ok()
                    && s.read_exact(&mut got).is_ok()
                    && got == msg.as_bytes()
            })
            .count()
    });
    assert_eq!(trips, 20, "every round trip passes");
    let m = scrape(&a, &d);
    let q = "queue=\"0\"";
    let established = nsx(
        &a,
        &["iptables", "-w", "-L", "VALLUM-NFQUEUE", "-v", "-x", "-n"],
    );
    println!("new-only: {m:#?}\n{established}");
    assert_eq!(
        nfqueue_rule_packets(&a),
        1,
        "only the SYN is queued:\n{established}"
    );
    // Every vallum_nfqueue_* name the dashboard and the alerts use has series here (the
    // Prometheus test, which runs no NFQUEUE source, leaves those queries out).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for f in [
        "deploy/grafana/vallum.json",
        "deploy/prometheus/vallum-rules.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(f)).expect("read");
        for (i, _) in text.match_indices("vallum_nfqueue_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                m.keys().any(|k| k.starts_with(&format!("{name}{{"))),
                "{f} uses {name}, which vallumd does not export: {m:#?}"
            );
        }
    }
    assert_eq!(
        metric(&m, "vallum_nfqueue_received_total", q),
        Some(1),
        "{m:#?}"
    );
    let accepted_in_kernel: u64 = established
        .lines()
        .filter(|l| l.contains("ACCEPT") && l.contains("ESTABLISHED"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!(accepted_in_kernel >= 40, "{established}");
    drop(d);
}
