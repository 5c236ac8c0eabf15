//! NFQUEUE end to end (root only; ignored unless asked for, and failing without it): two network namespaces A and B
//! joined by a veth pair (and C behind A, which routes between B and C); in A, `vallumd --source nfqueue --cores 2` and the steering of
//! `vallumctl dataplane install --queues 2`; from B, real ICMP echo, UDP and TCP to echo
//! servers in A.
//!
//! Checks, in order: (a) with an ACCEPT ruleset everything passes; (b) a commit that DROPs
//! ICMP echo, one UDP port and one TCP port blocks exactly those flows; (d) a TCP connection
//! opened before that commit (to a port no rule names) keeps exchanging data after it; (c) the
//! next commit, without the DROPs, lets everything through again with no restart; (e) after
//! zeroing, N pings count exactly N packets and N x 36 bytes (IP length) on the INPUT rule
//! `-p icmp --icmp-type echo-request`; (f) conntrack keeps an established connection across a
//! commit; (g) an ICMP timestamp request with 100 bytes of payload and an information request
//! are counted on their `--icmp-type` rules; (h) `-m mac --mac-source` matches B's address
//! (NFQA_HWADDR), its negation and another address do not; (i) raw PREROUTING runs for
//! INPUT- and FORWARD-queued packets (a Docker-style `-d A ! -i docker0 -j DROP` guard drops ICMP,
//! `CT --notrack` makes UDP UNTRACKED for `--ctstate UNTRACKED -j ACCEPT`); (j) a ufw-style
//! ruleset keeps an established TCP connection after a conntrack flush (mid-stream pick-up);
//! (k) the mark `-j MARK` sets reaches the kernel with the verdict (NFQA_MARK: a rule of
//! the kernel's security table, after filter INPUT, counts the packet with it); (l) `-m
//! owner --uid-owner` in OUTPUT sees the uid of the socket that answers (NFQA_UID);
//! (n) the copy range follows the rules (256 bytes for headers, 65535 for `-m string`) and
//! a datagram with the string 900 bytes in is dropped, also right after the commit; (o) a
//! staged revision that drops the UDP port, shadowed while B probes it, changes no packet and
//! its report names exactly the probes' flows, and `vallumctl apply --shadow-for
//! --max-changed-flows 0` of it refuses to commit; (m) a
//! `-j LOG` rule's hits reach
//! WatchPacketEvents in the kernel's LOG format, field by field the kernel's own line for the
//! same packet (dmesg); and `vallumctl dataplane uninstall` leaves no VALLUM
//! chain in `iptables-save` / `ip6tables-save`.
//!
//! The test thread never changes namespace: every piece that must live in A or B runs on a
//! thread that first `setns(2)`s into it (a namespace is per thread; threads and processes
//! started from there inherit it). The rules of (a)-(e), (g) and (h) are stateless.

use crate::support;
use crate::support::netns;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use netns::{in_netns, on_path};
use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 2);
/// A's address towards C, and C's: B reaches C through A, which forwards (FORWARD-queued).
const AC_ADDR: Ipv4Addr = Ipv4Addr::new(10, 232, 0, 1);
const C_ADDR: Ipv4Addr = Ipv4Addr::new(10, 232, 0, 2);
/// TCP port that stays open through every commit (the established-connection check).
const TCP_KEEP: u16 = 7001;
/// TCP port the DROP commit blocks.
const TCP_BLOCK: u16 = 7002;
/// UDP echo port the DROP commit blocks.
const UDP_PORT: u16 = 7003;
/// The MAC address of B's end of the veth (the source of every frame A receives from B).
const B_MAC: &str = "02:76:61:6c:00:0b";
/// The string (n)'s rule looks for, 900 bytes into a datagram.
const DEEP_STRING: &str = "vallum-deep-string";
/// Pings counted in (e).
const PINGS: u64 = 5;
/// ICMP echo payload bytes (IP length = 20 + 8 + this).
const PING_PAYLOAD: usize = 8;

const ACCEPT_ALL: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
    :OUTPUT ACCEPT [0:0]\n-A INPUT -p icmp -m icmp --icmp-type echo-request -j ACCEPT\nCOMMIT\n";

fn drop_some() -> String {
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p icmp -m icmp --icmp-type echo-request -j DROP\n\
         -A INPUT -p udp -m udp --dport {UDP_PORT} -j DROP\n\
         -A INPUT -p tcp -m tcp --dport {TCP_BLOCK} -j DROP\nCOMMIT\n"
    )
}

/// INPUT drops by policy; established and related flows pass; new TCP connections to
/// TCP_KEEP pass only while `allow_new` (the usual stateful host firewall).
fn stateful(allow_new: bool) -> String {
    let new = if allow_new {
        format!("-A INPUT -p tcp -m tcp --dport {TCP_KEEP} -m conntrack --ctstate NEW -j ACCEPT\n")
    } else {
        String::new()
    };
    format!(
        "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n{new}COMMIT\n"
    )
}

// === prerequisites ===

/// Why this machine cannot run the test, if it cannot.
fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces, iptables and NFQUEUE need it)".into());
    }
    for tool in [
        "ip",
        "iptables",
        "iptables-restore",
        "iptables-save",
        "ip6tables",
        "ip6tables-restore",
        "ip6tables-save",
    ] {
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

// === namespaces ===

fn run(cmd: &mut Command) -> String {
    try_run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `cmd`; its stdout, or what went wrong.
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

fn ip(args: &[&str]) -> String {
    run(Command::new("ip").args(args))
}

/// Namespaces A and B with a veth pair and addresses; deleted on drop (also on panic), which
/// removes the veth and every rule with them.
struct Netns {
    a: String,
    b: String,
    c: String,
}

impl Netns {
    fn new() -> Result<Netns, String> {
        let id = std::process::id();
        let ns = Netns {
            a: format!("vallum-a-{id}"),
            b: format!("vallum-b-{id}"),
            c: format!("vallum-c-{id}"),
        };
        let st = Command::new("ip").args(["netns", "add", &ns.a]).status();
        if !matches!(st, Ok(s) if s.success()) {
            return Err(format!("`ip netns add` failed ({st:?})"));
        }
        ip(&["netns", "add", &ns.b]);
        let (va, vb) = (
            format!("vla{}", id % 100_000),
            format!("vlb{}", id % 100_000),
        );
        ip(&[
            "-n", &ns.a, "link", "add", &va, "type", "veth", "peer", "name", &vb, "address", B_MAC,
            "netns", &ns.b,
        ]);
        for (n, dev, addr) in [(&ns.a, &va, A_ADDR), (&ns.b, &vb, B_ADDR)] {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", n, "link", "set", dev, "up"]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        // C behind A: A routes between B and C.
        ip(&["netns", "add", &ns.c]);
        let (vac, vc) = (
            format!("vlac{}", id % 100_000),
            format!("vlc{}", id % 100_000),
        );
        ip(&[
            "-n", &ns.a, "link", "add", &vac, "type", "veth", "peer", "name", &vc, "netns", &ns.c,
        ]);
        for (n, dev, addr) in [(&ns.a, &vac, AC_ADDR), (&ns.c, &vc, C_ADDR)] {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", n, "link", "set", dev, "up"]);
        }
        ip(&[
            "-n",
            &ns.b,
            "route",
            "add",
            "10.232.0.0/24",
            "via",
            &A_ADDR.to_string(),
        ]);
        ip(&[
            "-n",
            &ns.c,
            "route",
            "add",
            "10.231.0.0/24",
            "via",
            &AC_ADDR.to_string(),
        ]);
        run(Command::new("ip").args([
            "netns",
            "exec",
            &ns.a,
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward",
        ]));
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in [&self.a, &self.b, &self.c] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

// === echo servers in A ===

fn tcp_echo(port: u16) {
    let l = TcpListener::bind((A_ADDR, port)).expect("bind tcp");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 1500];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

fn udp_echo(port: u16) {
    let s = UdpSocket::bind((A_ADDR, port)).expect("bind udp");
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], from);
        }
    });
}

// === probes from B (each returns whether the echo came back in time) ===

fn udp_probe(timeout: Duration) -> bool {
    let s = UdpSocket::bind((B_ADDR, 0)).expect("bind");
    s.set_read_timeout(Some(timeout)).expect("timeout");
    s.send_to(b"vallum-udp", (A_ADDR, UDP_PORT)).expect("send");
    let mut buf = [0u8; 64];
    matches!(s.recv_from(&mut buf), Ok((10, _)) if &buf[..10] == b"vallum-udp")
}

fn tcp_connect(port: u16, timeout: Duration) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&SocketAddr::from((A_ADDR, port)), timeout).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(s)
}

fn tcp_roundtrip(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).is_err() {
        return false;
    }
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got).is_ok() && got == msg
}

fn tcp_probe(port: u16, timeout: Duration) -> bool {
    tcp_connect(port, timeout).is_some_and(|mut s| tcp_roundtrip(&mut s, b"vallum-tcp"))
}

fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// One ICMP echo request to A over a raw socket; true when the matching reply arrives.
fn ping(seq: u16, timeout: Duration) -> bool {
    ping_to(A_ADDR, seq, timeout)
}

/// One ICMP echo request to `to` over a raw socket; true when the matching reply arrives.
fn ping_to(to: Ipv4Addr, seq: u16, timeout: Duration) -> bool {
    // SAFETY: plain socket(2); the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
    assert!(raw >= 0, "raw socket: {}", std::io::Error::last_os_error());
    // SAFETY: `raw` is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let id = (std::process::id() & 0xffff) as u16;
    let mut pkt = vec![8u8, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(&[0x5a; PING_PAYLOAD]);
    let c = checksum(&pkt);
    pkt[2..4].copy_from_slice(&c.to_be_bytes());
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(to).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `pkt` and `addr` are live for the call; the lengths are theirs.
    let r = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert!(r >= 0, "sendto: {}", std::io::Error::last_os_error());
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 1500];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let tv = libc::timeval {
            tv_sec: left.as_secs() as libc::time_t,
            tv_usec: left.subsec_micros().max(1) as libc::suseconds_t,
        };
        // SAFETY: `tv` is a live timeval of the size passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        // SAFETY: `buf` is a live, writable buffer of the length passed.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return false;
        }
        // A raw IPv4 socket receives the IP header too.
        let ihl = usize::from(buf[0] & 0x0f) * 4;
        let icmp = &buf[ihl..n as usize];
        if icmp.len() >= 8
            && icmp[0] == 0
            && icmp[4..6] == id.to_be_bytes()
            && icmp[6..8] == seq.to_be_bytes()
        {
            return true;
        }
    }
    false
}

/// Sends one ICMP message of type `ty` (code 0) with `payload` bytes after its 8-byte header
/// to A over a raw socket; waits for nothing.
fn send_icmp(ty: u8, payload: usize) {
    // SAFETY: plain socket(2); the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
    assert!(raw >= 0, "raw socket: {}", std::io::Error::last_os_error());
    // SAFETY: `raw` is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut pkt = vec![ty, 0, 0, 0, 0, 1, 0, 1];
    pkt.resize(8 + payload, 0x5a);
    let c = checksum(&pkt);
    pkt[2..4].copy_from_slice(&c.to_be_bytes());
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(A_ADDR).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `pkt` and `addr` are live for the call; the lengths are theirs.
    let r = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert!(r >= 0, "sendto: {}", std::io::Error::last_os_error());
}

/// What passes from B right now: (icmp, udp, tcp to TCP_KEEP, tcp to TCP_BLOCK). A flow is
/// tried up to 3 times when it should pass, once when it should not.
fn reachability(b: &str, timeout: Duration) -> [bool; 4] {
    in_netns(b, move || {
        let retry = |f: &dyn Fn() -> bool| (0..3).any(|_| f());
        [
            retry(&|| ping(1, timeout)),
            retry(&|| udp_probe(timeout)),
            retry(&|| tcp_probe(TCP_KEEP, timeout)),
            retry(&|| tcp_probe(TCP_BLOCK, timeout)),
        ]
    })
}

// === gRPC ===

async fn apply(d: &Daemon, text: &str) {
    d.rulesets()
        .await
        .apply(pb::ApplyRequest {
            ruleset: "nfq".into(),
            source: Some(text_source(text, false, "nfq.rules")),
            ..Default::default()
        })
        .await
        .expect("apply");
}

fn vallumctl(ns: &str, args: &[&str]) -> String {
    run(vallumctl_cmd(ns).args(args))
}

/// `vallumctl dataplane` in namespace `ns`.
fn vallumctl_cmd(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .arg(support::vallumctl())
        .arg("dataplane");
    c
}

#[test]
#[ignore = "needs root, iptables, iproute2 and nfnetlink_queue"]
fn nfqueue_two_namespaces() {
    if let Some(why) = skip_reason() {
        panic!("nfqueue_two_namespaces: {why}");
    }
    let ns = match Netns::new() {
        Ok(ns) => ns,
        Err(why) => {
            panic!("nfqueue_two_namespaces: {why}");
        }
    };
    let (a, b) = (ns.a.clone(), ns.b.clone());
    // The first iptables call in a fresh namespace is where a kernel without the needed
    // netfilter modules (or a container without the privilege to load them) shows.
    let installed = match try_run(vallumctl_cmd(&a).args(["install", "--queues", "2"])) {
        Ok(out) => out,
        Err(why) => {
            panic!("nfqueue_two_namespaces: steering rules cannot be installed here: {why}");
        }
    };
    assert!(
        installed.contains("--queue-balance 0:1 --queue-bypass"),
        "{installed}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("v.db");
    // (m) compares with the kernel's LOG lines, written from namespace A only with this set
    // (in the initial namespace); restored below.
    let log_all_before = std::fs::read_to_string(LOG_ALL_NETNS).ok();
    let set = std::fs::write(LOG_ALL_NETNS, "1").is_ok();
    KERNEL_LOGS.store(set, std::sync::atomic::Ordering::Relaxed);
    // vallumd, the echo servers and the gRPC client all live in A.
    let b2 = b.clone();
    in_netns(&a, move || {
        tcp_echo(TCP_KEEP);
        tcp_echo(TCP_BLOCK);
        udp_echo(UDP_PORT);
        let d = Daemon::start(&db, &["--source", "nfqueue"]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(scenario(&d, &b2));
    });
    if let Some(v) = log_all_before {
        let _ = std::fs::write(LOG_ALL_NETNS, v.trim());
    }
    // Steering out: no VALLUM chain left in either family.
    vallumctl(&a, &["uninstall"]);
    for save in ["iptables-save", "ip6tables-save"] {
        let out = run(Command::new("ip").args(["netns", "exec", &a, save]));
        assert!(!out.contains("VALLUM"), "{save} after uninstall:\n{out}");
    }
    drop(ns);
}

async fn scenario(d: &Daemon, b: &str) {
    d.wait_serving().await;
    let pass = Duration::from_secs(2);
    let block = Duration::from_millis(500);

    // (a) ACCEPT: everything passes.
    apply(d, ACCEPT_ALL).await;
    assert_eq!(
        reachability(b, pass),
        [true; 4],
        "(a) accept ruleset: icmp, udp, tcp, tcp"
    );

    // (d) a connection opened before the next commit ...
    let b1 = b.to_owned();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(bool, bool, bool)>();
    let keeper = std::thread::spawn(move || {
        in_netns(&b1, move || {
            let mut s = tcp_connect(TCP_KEEP, pass).expect("connect before commit");
            let before = tcp_roundtrip(&mut s, b"before");
            // Wait for the DROP commit, then for the commit that removes it.
            rx.recv().expect("signal");
            let after_drop = tcp_roundtrip(&mut s, b"after the drop commit");
            rx.recv().expect("signal");
            let after_accept = tcp_roundtrip(&mut s, b"after the accept commit");
            done_tx
                .send((before, after_drop, after_accept))
                .expect("report");
        })
    });

    // (b) DROP ICMP echo, UDP_PORT and TCP_BLOCK: those fail, TCP_KEEP still passes.
    apply(d, &drop_some()).await;
    tx.send(()).expect("signal");
    let got = in_netns(b, move || {
        [
            ping(2, block),
            udp_probe(block),
            tcp_probe(TCP_KEEP, pass),
            tcp_probe(TCP_BLOCK, block),
        ]
    });
    assert_eq!(
        got,
        [false, false, true, false],
        "(b) drop ruleset: icmp, udp, tcp keep, tcp block"
    );

    // (c) the next commit without the DROPs lets them through again, no restart.
    apply(d, ACCEPT_ALL).await;
    tx.send(()).expect("signal");
    assert_eq!(
        reachability(b, pass),
        [true; 4],
        "(c) accept again: icmp, udp, tcp, tcp"
    );
    keeper.join().expect("keeper");
    let (before, after_drop, after_accept) = done_rx.recv().expect("keeper report");
    assert!(
        before && after_drop && after_accept,
        "(d) established tcp: {before} {after_drop} {after_accept}"
    );

    // (e) N pings -> exactly N packets and N x IP length bytes on the echo-request rule.
    let mut counters = pb::counter_service_client::CounterServiceClient::new(d.channel().await);
    counters
        .zero_counters(pb::ZeroCountersRequest {
            ruleset: "nfq".into(),
            ..Default::default()
        })
        .await
        .expect("zero");
    let answered = in_netns(b, move || {
        (0..PINGS).filter(|&i| ping(100 + i as u16, pass)).count()
    });
    assert_eq!(answered as u64, PINGS, "every ping answered");
    let c = counters
        .get_counters(pb::GetCountersRequest {
            ruleset: "nfq".into(),
            ..Default::default()
        })
        .await
        .expect("counters")
        .into_inner();
    let rule = c
        .counters
        .iter()
        .find(|c| c.chain == "INPUT" && c.rule == 1 && c.family == pb::Family::Ipv4 as i32)
        .unwrap_or_else(|| panic!("no INPUT rule 1 counter: {:#?}", c.counters));
    assert!(rule.text.contains("icmp"), "{rule:?}");
    assert_eq!(rule.packets, PINGS, "{rule:?}");
    assert_eq!(
        rule.bytes,
        PINGS * (20 + 8 + PING_PAYLOAD as u64),
        "{rule:?}"
    );

    // (f) stateful: with conntrack, a commit that stops admitting new connections leaves the
    // established one working (its entry lives outside the snapshot), and new ones fail.
    apply(d, &stateful(true)).await;
    let b1 = b.to_owned();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel::<bool>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<bool>();
    let keeper = std::thread::spawn(move || {
        in_netns(&b1, move || {
            let mut s = tcp_connect(TCP_KEEP, pass).expect("connect while NEW is allowed");
            opened_tx
                .send(tcp_roundtrip(&mut s, b"stateful before"))
                .expect("report");
            rx.recv().expect("signal");
            done_tx
                .send(tcp_roundtrip(&mut s, b"stateful after"))
                .expect("report");
        })
    });
    assert!(
        opened_rx.recv().expect("keeper"),
        "(f) new connection admitted"
    );
    let mut ct = pb::conntrack_service_client::ConntrackServiceClient::new(d.channel().await);
    let listed = ct
        .list(pb::ListConntrackRequest {
            filter: Some(pb::ConntrackFilter {
                protocol: "tcp".into(),
                destination_port: u32::from(TCP_KEEP),
                state: "ESTABLISHED".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("conntrack list")
        .into_inner();
    assert!(
        !listed.entries.is_empty(),
        "(f) the open connection is ESTABLISHED in the table"
    );
    apply(d, &stateful(false)).await;
    tx.send(()).expect("signal");
    assert!(
        done_rx.recv().expect("keeper"),
        "(f) established connection survives the commit"
    );
    keeper.join().expect("keeper");
    let fresh = in_netns(b, move || tcp_probe(TCP_KEEP, block));
    assert!(!fresh, "(f) a new connection is dropped after the commit");

    // (g) ICMP whose length is not its type's usual one is matched on type and code, as the
    // kernel's icmp_match does: a timestamp request with 100 bytes of payload (usually 20
    // bytes in all) and an information request with 3.
    apply(d, ICMP_ODD_LENGTHS).await;
    in_netns(b, move || {
        send_icmp(13, 100);
        send_icmp(15, 3);
    });
    let hits = counts_once_moved(&mut counters, &[1, 2], &[1, 2]).await;
    assert_eq!(
        hits,
        [(1, 20 + 8 + 100), (1, 20 + 8 + 3)],
        "(g) timestamp and information requests counted on their rules"
    );

    // (h) -m mac: the source MAC comes from NFQA_HWADDR. B's address matches, its negation
    // does not, another address does not.
    apply(d, &mac_rules()).await;
    // Rule 4's text is (g)'s rule 2: its counter carries over the commit.
    counters
        .zero_counters(pb::ZeroCountersRequest {
            ruleset: "nfq".into(),
            ..Default::default()
        })
        .await
        .expect("zero");
    in_netns(b, move || {
        send_icmp(13, 0);
        send_icmp(15, 0);
    });
    let hits = counts_once_moved(&mut counters, &[1, 2, 3, 4], &[1, 4]).await;
    let packets: Vec<u64> = hits.iter().map(|h| h.0).collect();
    assert_eq!(packets, [1, 0, 0, 1], "(h) -m mac --mac-source {B_MAC}");

    // (i) raw PREROUTING decides INPUT- and FORWARD-queued packets first: Docker 28's guard
    // drops ICMP to A's and to C's address (routed through A) from any interface but docker0,
    // and CT --notrack makes the UDP query UNTRACKED, so `--ctstate UNTRACKED -j ACCEPT`
    // admits it past INPUT's DROP policy. First, C answers through A (FORWARD ACCEPT).
    let retry = |f: &(dyn Fn() -> bool + Send)| (0..3).any(|_| f());
    assert!(
        in_netns(b, move || retry(&|| ping_to(C_ADDR, 4, pass))),
        "(i) C answers a ping forwarded by A"
    );
    apply(d, &raw_prerouting_rules()).await;
    let got = in_netns(b, move || {
        let retry = |f: &dyn Fn() -> bool| (0..3).any(|_| f());
        [
            ping(3, block),
            ping_to(C_ADDR, 5, block),
            retry(&|| udp_probe(pass)),
            retry(&|| tcp_probe(TCP_KEEP, pass)),
        ]
    });
    assert_eq!(
        got,
        [false, false, true, true],
        "(i) raw PREROUTING: icmp to A (INPUT) and to C (FORWARD) dropped by the guard, \
         untracked udp accepted, tcp"
    );

    // (j) a ufw-style host keeps an established TCP flow when our table forgets it (a flush
    // here, a vallumd restart in life): the next segment is a plain ACK, picked up as NEW
    // (nf_conntrack_tcp_loose=1) and accepted by the port rule, not INVALID and dropped.
    apply(d, &ufw_style()).await;
    let b1 = b.to_owned();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel::<bool>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<bool>();
    let keeper = std::thread::spawn(move || {
        in_netns(&b1, move || {
            let mut s = tcp_connect(TCP_KEEP, pass).expect("connect (j)");
            opened_tx
                .send(tcp_roundtrip(&mut s, b"before the flush"))
                .expect("report");
            rx.recv().expect("signal");
            done_tx
                .send(tcp_roundtrip(&mut s, b"after the flush"))
                .expect("report");
        })
    });
    assert!(opened_rx.recv().expect("keeper"), "(j) connection opened");
    let flushed = ct
        .flush(pb::FlushConntrackRequest::default())
        .await
        .expect("conntrack flush")
        .into_inner();
    assert!(flushed.deleted > 0, "(j) the flush deleted the flow");
    tx.send(()).expect("signal");
    assert!(
        done_rx.recv().expect("keeper"),
        "(j) the established flow carries on after the flush (picked up mid-stream)"
    );
    keeper.join().expect("keeper");

    // (k) the mark the rules leave goes back to the kernel with the verdict (NFQA_MARK): the
    // kernel's own security table, whose INPUT runs after filter INPUT (where the steering
    // queued the packet), counts the UDP query only when its skb->mark is 0x5a.
    apply(d, &mark_rules()).await;
    let port = UDP_PORT.to_string();
    let rule = [
        "-p", "udp", "-m", "udp", "--dport", &port, "-m", "mark", "--mark", "0x5a",
    ];
    run(Command::new("iptables")
        .args(["-w", "-t", "security", "-A", "INPUT"])
        .args(rule));
    assert!(
        in_netns(b, move || (0..3).any(|_| udp_probe(pass))),
        "(k) the marked udp query is accepted"
    );
    let save = run(Command::new("iptables-save").args(["-c", "-t", "security"]));
    let counted = save
        .lines()
        .find(|l| l.contains("--mark 0x5a"))
        .and_then(|l| l.strip_prefix('['))
        .and_then(|l| l.split(':').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(
        counted.is_some_and(|n| n >= 1),
        "(k) the kernel saw the mark set by -j MARK:\n{save}"
    );
    run(Command::new("iptables").args(["-w", "-t", "security", "-F", "INPUT"]));

    // (l) `-m owner` in OUTPUT reads the sending socket's uid (NFQA_UID, asked for with
    // NFQA_CFG_F_UID_GID): the echo server runs as root, so its answer passes an allow-list
    // of uid 0 and is dropped by one of another uid.
    apply(d, &owner_rules(0)).await;
    assert!(
        in_netns(b, move || (0..3).any(|_| udp_probe(pass))),
        "(l) the answer of root's socket passes --uid-owner 0"
    );
    apply(d, &owner_rules(4242)).await;
    assert!(
        !in_netns(b, move || udp_probe(block)),
        "(l) the answer of root's socket is dropped by an allow-list of uid 4242"
    );

    // (m) LOG hits on the stream and as the kernel writes them.
    log_hits(d, b).await;

    // (n) the copy range follows the rules: headers-only rules copy 256 bytes, and a
    // `-m string` rule that reads the whole packet raises it to 65535, so a datagram with the
    // string 900 bytes in is dropped as the kernel would drop it, also when it was queued
    // with the short range before the worker saw the commit (answered NF_REPEAT, queued again
    // whole).
    copy_range_follows_the_rules(d, b, pass, block).await;

    // (o) a shadow on live traffic.
    shadow_on_live_traffic(d, b, pass).await;
}

/// UDP probes (o) sends while a shadow runs, each from a new socket (a new source port: one
/// flow of one packet at INPUT).
const SHADOW_PROBES: usize = 5;

/// (o) A staged revision that would drop UDP_PORT, shadowed while B sends: every probe is
/// answered (the active rules decide), the report names exactly the probes' flows (B to
/// UDP_PORT, one packet each, ACCEPT -> DROP, the shadow's rule 1) and nothing else; then
/// `vallumctl apply --shadow-for 2s --max-changed-flows 0` of the same file refuses to commit
/// (exit 1, SHADOW_LIMIT_EXCEEDED) and the active revision stays.
async fn shadow_on_live_traffic(d: &Daemon, b: &str, pass: Duration) {
    let drop_udp = format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p udp -m udp --dport {UDP_PORT} -j DROP\nCOMMIT\n"
    );
    apply(d, ACCEPT_ALL).await;
    let mut c = d.rulesets().await;
    let active = c
        .get_ruleset(pb::GetRulesetRequest {
            name: "rulesets/nfq".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .active_revision;
    let staged = c
        .stage_revision(pb::StageRevisionRequest {
            ruleset: "nfq".into(),
            source: Some(text_source(&drop_udp, false, "drop-udp.rules")),
            ..Default::default()
        })
        .await
        .expect("stage")
        .into_inner();
    c.shadow_revision(pb::ShadowRevisionRequest {
        name: staged.name.clone(),
        duration: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        ..Default::default()
    })
    .await
    .expect("shadow");
    let answered = in_netns(b, move || {
        (0..SHADOW_PROBES)
            .map(|_| udp_probe(pass))
            .collect::<Vec<_>>()
    });
    assert_eq!(
        answered, [true; SHADOW_PROBES],
        "(o) the shadow changes no packet"
    );
    // The shadow's own counters, by the revision's name: its rule 1 counted the probes.
    let counters = pb::counter_service_client::CounterServiceClient::new(d.channel().await)
        .get_counters(pb::GetCountersRequest {
            ruleset: staged.name.clone(),
            ..Default::default()
        })
        .await
        .expect("counters of the shadow")
        .into_inner()
        .counters;
    let rule1 = counters
        .iter()
        .find(|c| c.chain == "INPUT" && c.rule == 1)
        .expect("rule 1");
    assert_eq!(
        (rule1.packets, rule1.bytes),
        (SHADOW_PROBES as u64, 38 * SHADOW_PROBES as u64)
    );
    let r = c
        .end_shadow(pb::EndShadowRequest {
            ruleset: "nfq".into(),
        })
        .await
        .expect("end")
        .into_inner();
    assert_eq!(r.name, staged.name);
    assert_eq!(
        (r.changed_packets, r.changed_flows),
        (SHADOW_PROBES as u64, SHADOW_PROBES as u64),
        "(o) {r:?}"
    );
    // vallumctl shows the same report (the last one, ended).
    let shown = Command::new(support::vallumctl())
        .args([
            "--server",
            &format!("http://{}", d.addr),
            "-o",
            "json",
            "shadow",
            "report",
            "nfq",
        ])
        .output()
        .expect("vallumctl runs");
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    assert_eq!(
        (
            shown["name"].as_str(),
            shown["ended"].as_str(),
            shown["changed_flows"].as_u64()
        ),
        (
            Some(staged.name.as_str()),
            Some("ended"),
            Some(SHADOW_PROBES as u64)
        )
    );
    let mut ports = std::collections::BTreeSet::new();
    for f in &r.flows {
        assert_eq!(
            (
                f.source.as_str(),
                f.destination.as_str(),
                f.protocol,
                f.destination_port,
                f.packets,
                f.bytes,
            ),
            (
                B_ADDR.to_string().as_str(),
                A_ADDR.to_string().as_str(),
                17,
                u32::from(UDP_PORT),
                1,
                38
            ),
            "(o) {f:?}"
        );
        assert_eq!(
            (f.active_verdict, f.shadow_verdict),
            (pb::Verdict::Accept as i32, pb::Verdict::Drop as i32)
        );
        assert_eq!(f.shadow_rule, "nfq filter INPUT 1", "(o) {f:?}");
        ports.insert(f.source_port);
    }
    assert_eq!(ports.len(), SHADOW_PROBES, "(o) one flow per probe");
    let pair = r
        .pairs
        .iter()
        .find(|p| p.active == pb::Verdict::Accept as i32 && p.shadow == pb::Verdict::Drop as i32)
        .expect("an ACCEPT -> DROP pair");
    assert_eq!(pair.packets, SHADOW_PROBES as u64);

    // The same file through `apply --shadow-for --max-changed-flows 0`, with B sending.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("drop-udp.rules");
    std::fs::write(&file, &drop_udp).expect("write");
    // B probes until vallumctl returned (the shadow starts some time after the command).
    let b2 = b.to_owned();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let sender = std::thread::spawn(move || {
        in_netns(&b2, move || {
            let mut answered = 0;
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                answered += usize::from(udp_probe(Duration::from_millis(500)));
                std::thread::sleep(Duration::from_millis(50));
            }
            answered
        })
    });
    let out = Command::new(support::vallumctl())
        .args([
            "--server",
            &format!("http://{}", d.addr),
            "-o",
            "json",
            "apply",
            "nfq",
        ])
        .arg(&file)
        .args(["--shadow-for", "3s", "--max-changed-flows", "0"])
        .output()
        .expect("vallumctl runs");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = sender.join().expect("sender");
    assert!(
        answered >= 1,
        "(o) B's probes were answered during the shadow"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "(o) refused: {stderr}");
    assert!(stderr.contains("SHADOW_LIMIT_EXCEEDED"), "(o) {stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the report on stdout");
    assert!(
        report["changed_flows"].as_u64().is_some_and(|n| n >= 1),
        "(o) {report}"
    );
    let now = c
        .get_ruleset(pb::GetRulesetRequest {
            name: "rulesets/nfq".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .active_revision;
    assert_eq!(now, active, "(o) the active revision stays");
}

/// Each queue bound in this thread's namespace: (queue, copy range, id sequence), from
/// /proc/net/netfilter/nfnetlink_queue (queue, portid, waiting, copy mode, copy range,
/// queue dropped, user dropped, id sequence, 1). The id sequence is the id of the queue's last
/// packet: it moves by one for every packet queued there, whatever its hook or sender.
fn queues() -> Vec<(u16, u32, u32)> {
    let t = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue")
        .expect("nfnetlink_queue");
    t.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(4)?.parse().ok()?,
                f.get(7)?.parse().ok()?,
            ))
        })
        .collect()
}

/// The queues that carried a packet since `before` (a [`queues`] reading): which queue the
/// kernel picks for a flow is its own choice (a hash of the addresses with a random seed, or
/// the sender's CPU), so the test asks the kernel instead of assuming one.
fn carried_since(before: &[(u16, u32, u32)]) -> Vec<u16> {
    queues()
        .into_iter()
        .filter(|&(q, _, seq)| !before.iter().any(|&(bq, _, bseq)| bq == q && bseq == seq))
        .map(|(q, _, _)| q)
        .collect()
}

/// Waits (up to 10 s) until every queue that carried a packet since `before` has a copy range
/// that `ok` accepts, and at least one did; the queues that carried one, or a panic with
/// `what` and the queues as they are.
async fn carriers_reach(before: &[(u16, u32, u32)], ok: fn(u32) -> bool, what: &str) -> Vec<u16> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let carried = carried_since(before);
        let now = queues();
        let all_ok = carried
            .iter()
            .all(|q| now.iter().any(|&(nq, range, _)| nq == *q && ok(range)));
        if !carried.is_empty() && all_ok {
            return carried;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: queues that carried packets {carried:?}, now (queue, copy range, id) \
             {now:?}, before {before:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One UDP datagram of 1000 bytes to the echo service with `DEEP_STRING` at byte 900 (or
/// not); whether the echo came back.
fn udp_deep_probe(with: bool, timeout: Duration) -> bool {
    let s = UdpSocket::bind((B_ADDR, 0)).expect("bind");
    s.set_read_timeout(Some(timeout)).expect("timeout");
    let mut msg = vec![b'.'; 1000];
    if with {
        msg[900..900 + DEEP_STRING.len()].copy_from_slice(DEEP_STRING.as_bytes());
    }
    s.send_to(&msg, (A_ADDR, UDP_PORT)).expect("send");
    let mut buf = [0u8; 1500];
    matches!(s.recv_from(&mut buf), Ok((1000, _)) if buf[..1000] == msg[..])
}

/// (n): see the scenario.
async fn copy_range_follows_the_rules(d: &Daemon, b: &str, pass: Duration, block: Duration) {
    let deep = format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p udp -m udp --dport {UDP_PORT} -m string --string {DEEP_STRING} --algo bm \
         -j DROP\nCOMMIT\n"
    );
    // Headers only: once a batch ran on the new snapshot, its queue copies 256 bytes. Which
    // queue carries B's datagrams is the kernel's choice (a seeded hash of the addresses):
    // every queue that carried a packet after the commit is asked, whichever it was.
    apply(d, ACCEPT_ALL).await;
    let before = queues();
    assert!(
        in_netns(b, move || (0..3).any(|_| udp_probe(pass))),
        "(n) a datagram passes the ACCEPT ruleset"
    );
    carriers_reach(
        &before,
        |r| r == 256,
        "(n) headers-only rules copy 256 bytes",
    )
    .await;
    // The string rule reads the whole packet: packets copied short are queued again whole.
    apply(d, &deep).await;
    let before = queues();
    assert!(
        !in_netns(b, move || udp_deep_probe(true, block)),
        "(n) the string 900 bytes in is found (queues {:?})",
        queues()
    );
    assert!(
        in_netns(b, move || (0..3).any(|_| udp_deep_probe(false, pass))),
        "(n) a datagram without the string passes"
    );
    // 65535 asked; the kernel keeps 65531 (NFQNL_MAX_COPY_RANGE less an attribute header).
    carriers_reach(
        &before,
        |r| r >= 65531,
        "(n) the queues that carried B's datagrams copy the whole packet",
    )
    .await;
    assert!(
        !in_netns(b, move || udp_deep_probe(true, block)),
        "(n) the string is found with the whole packet copied"
    );
}

/// (l): only `uid`'s sockets may answer from the UDP service.
fn owner_rules(uid: u32) -> String {
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A OUTPUT -p udp -m udp --sport {UDP_PORT} -m owner --uid-owner {uid} -j ACCEPT\n\
         -A OUTPUT -p udp -m udp --sport {UDP_PORT} -j DROP\nCOMMIT\n"
    )
}

/// (k): MARK on the UDP service, and the mark read back by a later rule of the same packet.
fn mark_rules() -> String {
    format!(
        "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p udp -m udp --dport {UDP_PORT} -j MARK --set-mark 0x5a\n\
         -A INPUT -p udp -m udp --dport {UDP_PORT} -m mark --mark 0x5a -j ACCEPT\nCOMMIT\n"
    )
}

/// The kernel's switch for LOG lines from namespaces other than the initial one.
const LOG_ALL_NETNS: &str = "/proc/sys/net/netfilter/nf_log_all_netns";
/// Whether [`LOG_ALL_NETNS`] could be set for (m).
static KERNEL_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// (m) a `-j LOG` rule's hits for real packets arrive on WatchPacketEvents in the kernel's
/// format, compared field by field with the line the kernel's own LOG target writes for the
/// same packet (a kernel rule before the steering jump; `dmesg`; needs
/// net.netfilter.nf_log_all_netns=1, set for the check and restored after). Where the kernel
/// line cannot be had (no dmesg access, sysctl not writable), only the stream is checked.
async fn log_hits(d: &Daemon, b: &str) {
    use vallum_proto::v1::trace_service_client::TraceServiceClient;
    let rules = format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p tcp -m tcp --dport {TCP_BLOCK} -j LOG --log-prefix \"VALLUM-K \"\n\
         -A INPUT -p tcp -m tcp --dport {TCP_BLOCK} -j DROP\nCOMMIT\n"
    );
    apply(d, &rules).await;
    let mut stream = TraceServiceClient::new(d.channel().await)
        .watch_packet_events(pb::WatchPacketEventsRequest {
            ruleset: "nfq".into(),
            kind: pb::PacketEventKind::Log as i32,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    // nf_log_all_netns lives in the initial namespace only: the test thread set it.
    let dport = TCP_BLOCK.to_string();
    let kernel_rule = [
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        &dport,
        "-j",
        "LOG",
        "--log-prefix",
        "KERNEL-K ",
    ];
    let kernel_logs = KERNEL_LOGS.load(std::sync::atomic::Ordering::Relaxed)
        && try_run(Command::new("iptables").args(["-I"]).args(kernel_rule)).is_ok();
    let b1 = b.to_owned();
    let blocked = in_netns(&b1, || tcp_probe(TCP_BLOCK, Duration::from_millis(500)));
    assert!(!blocked, "(m) the LOG-then-DROP port is closed");
    let e = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("(m) a LOG event within 10 s")
        .expect("stream")
        .expect("open");
    if kernel_logs {
        run(Command::new("iptables").args(["-D"]).args(kernel_rule));
    }
    assert_eq!(e.chain, "INPUT", "{e:?}");
    assert_eq!(e.destination_port, u32::from(TCP_BLOCK), "{e:?}");
    let ours = e.line.strip_prefix("VALLUM-K ").expect("our prefix");
    assert!(
        ours.contains(&format!("SRC={B_ADDR} DST={A_ADDR} ")) && ours.contains(" SYN URGP=0 "),
        "(m) {ours}"
    );
    if !kernel_logs {
        panic!("(m) kernel line comparison: nf_log_all_netns could not be set");
    }
    // The kernel's line for the same SYN (same IP ID).
    let id = ours
        .split(' ')
        .find(|f| f.starts_with("ID="))
        .expect("ID field")
        .to_owned();
    let dmesg = match try_run(&mut Command::new("dmesg")) {
        Ok(t) => t,
        Err(why) => {
            panic!("(m) kernel line comparison: {why}");
        }
    };
    let kernel = dmesg
        .lines()
        .filter_map(|l| l.split_once("KERNEL-K ").map(|(_, k)| k))
        .find(|k| k.contains(&format!(" {id} ")) && k.contains(&format!("DPT={TCP_BLOCK} ")))
        .unwrap_or_else(|| panic!("(m) no kernel LOG line with {id} in dmesg"));
    let (a, k): (Vec<&str>, Vec<&str>) = (
        ours.trim_end().split(' ').collect(),
        kernel.trim_end().split(' ').collect(),
    );
    assert_eq!(a, k, "(m) ours vs the kernel's LOG line, field by field");
}

/// (j): ufw's shape: established accepted, INVALID dropped, the service port open with no
/// `--ctstate`.
fn ufw_style() -> String {
    format!(
        "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A INPUT -m conntrack --ctstate INVALID -j DROP\n\
         -A INPUT -p tcp -m tcp --dport {TCP_KEEP} -j ACCEPT\nCOMMIT\n"
    )
}

/// (i): Docker 28's raw guard (for A's address) and a NOTRACKed UDP service.
fn raw_prerouting_rules() -> String {
    format!(
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A PREROUTING -d {A_ADDR}/32 ! -i docker0 -p icmp -j DROP\n\
         -A PREROUTING -d {C_ADDR}/32 ! -i docker0 -p icmp -j DROP\n\
         -A PREROUTING -p udp -m udp --dport {UDP_PORT} -j CT --notrack\nCOMMIT\n\
         *filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -m conntrack --ctstate UNTRACKED -j ACCEPT\n\
         -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A INPUT -p tcp -m tcp --dport {TCP_KEEP} -j ACCEPT\nCOMMIT\n"
    )
}

/// (packets, bytes) of INPUT rules `rules` (IPv4) once each of `wait_for` has counted a
/// packet, or after 60 s (a bound for a loaded machine; it returns as soon as they moved).
async fn counts_once_moved(
    counters: &mut pb::counter_service_client::CounterServiceClient<tonic::transport::Channel>,
    rules: &[u32],
    wait_for: &[u32],
) -> Vec<(u64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = counters
            .get_counters(pb::GetCountersRequest {
                ruleset: "nfq".into(),
                ..Default::default()
            })
            .await
            .expect("counters")
            .into_inner();
        let of = |n: u32| {
            c.counters
                .iter()
                .find(|c| c.chain == "INPUT" && c.rule == n && c.family == pb::Family::Ipv4 as i32)
                .map_or((0, 0), |c| (c.packets, c.bytes))
        };
        if wait_for.iter().all(|&n| of(n).0 > 0) || Instant::now() > deadline {
            return rules.iter().map(|&n| of(n)).collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (h): allow by B's MAC, a negated MAC, another MAC, then a catch-all counted rule.
fn mac_rules() -> String {
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -p icmp -m icmp --icmp-type 13 -m mac --mac-source {B_MAC} -j ACCEPT\n\
         -A INPUT -p icmp -m icmp --icmp-type 15 -m mac ! --mac-source {B_MAC} -j DROP\n\
         -A INPUT -p icmp -m icmp --icmp-type 15 -m mac --mac-source 02:00:00:00:00:99 -j DROP\n\
         -A INPUT -p icmp -m icmp --icmp-type 15 -j ACCEPT\nCOMMIT\n"
    )
}

/// (g): ICMP types the kernel matches whatever their length.
const ICMP_ODD_LENGTHS: &str = "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n\
    :OUTPUT ACCEPT [0:0]\n-A INPUT -p icmp -m icmp --icmp-type 13 -j ACCEPT\n\
    -A INPUT -p icmp -m icmp --icmp-type 15 -j ACCEPT\nCOMMIT\n";
