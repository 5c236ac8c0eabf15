//! REJECT under NFQUEUE answers exactly as the kernel's own REJECT (root, iptables-legacy,
//! ip6tables-legacy, nfnetlink_queue): three runs, each in a fresh pair of network namespaces
//! A (the firewall) -- B (the prober), joined by a veth, IPv4 and IPv6.
//!
//! - **kernel**: A's kernel holds the ruleset [`rules`] itself (`iptables-legacy-restore`);
//! - **vallumd**, twice (`--mode final`, then `continue`, on both sides): A's kernel holds only
//!   `vallumctl dataplane install` (the default reject mark), and `vallumd --source nfqueue`
//!   enforces the same ruleset; a REJECT verdict goes back to the kernel as `NF_REPEAT` with
//!   the answer's code in the mark, and the steering's `VALLUM-REJECT-*` chains answer.
//!
//! In each run B sends the same hand-made frames ([`probes`]: UDP to a port per reject type,
//! TCP SYN/ACK to the tcp-reset port, a SYN to a port whose REJECT has no `--reject-with`, an
//! echo request, and frames that must get no answer: a RST, an ICMP error) from an AF_PACKET
//! socket and captures what A answers on B's side of the veth. Each vallumd run's answers
//! must be the kernel run's bytes from the IP header on, except the IPv4 identification and header
//! checksum of ICMP errors (the kernel picks the id per packet). Each answer is also checked
//! for what it should be (ICMP type and code, RST with the kernel's sequence numbers), so two
//! empty captures cannot pass. Then, with the kernel's ICMP rate limit on (10 s per peer),
//! ten UDP probes from B's second address get the same number of answers in every run, fewer
//! than ten; and real sockets in B see what applications see: `connect()` to the tcp-reset
//! port fails with ECONNREFUSED, a connected UDP socket gets ECONNREFUSED after the port
//! unreachable, both families.

use crate::support;
use crate::support::netns;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use netns::{Sender, in_netns, nsx, nsx_in, sh};
use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

const A4: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 2);
/// B's second address: the rate-limit probes come from it (a peer A has not answered yet).
const B4_RATE: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 3);
const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 2);
const B6_RATE: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 3);

/// UDP port `UDP_BASE + code`: rejected with that ICMP code's `--reject-with`.
const UDP_BASE: u16 = 7000;
/// TCP: `-j REJECT --reject-with tcp-reset`.
const TCP_RESET: u16 = 7100;
/// TCP: `-j REJECT` (the default answer, port unreachable).
const TCP_DEFAULT: u16 = 7101;

/// The `--reject-with` ICMP names of each family with the ICMP code they answer (type 3
/// destination unreachable in IPv4, type 1 in IPv6).
const V4_TYPES: [(&str, u8); 7] = [
    ("icmp-net-unreachable", 0),
    ("icmp-host-unreachable", 1),
    ("icmp-proto-unreachable", 2),
    ("icmp-port-unreachable", 3),
    ("icmp-net-prohibited", 9),
    ("icmp-host-prohibited", 10),
    ("icmp-admin-prohibited", 13),
];
const V6_TYPES: [(&str, u8); 6] = [
    ("icmp6-no-route", 0),
    ("icmp6-adm-prohibited", 1),
    ("icmp6-addr-unreachable", 3),
    ("icmp6-port-unreachable", 4),
    ("icmp6-policy-fail", 5),
    ("icmp6-reject-route", 6),
];

/// The ruleset of every run for one family (iptables-restore input).
fn rules(v6: bool) -> String {
    let (types, icmp, echo, unreach): (&[(&str, u8)], _, _, _) = if v6 {
        (&V6_TYPES, "ipv6-icmp -m icmp6 --icmpv6-type", "128", "1")
    } else {
        (&V4_TYPES, "icmp -m icmp --icmp-type", "8", "3")
    };
    let mut r =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for (name, code) in types {
        r.push_str(&format!(
            "-A INPUT -p udp -m udp --dport {} -j REJECT --reject-with {name}\n",
            UDP_BASE + u16::from(*code)
        ));
    }
    r.push_str(&format!(
        "-A INPUT -p tcp -m tcp --dport {TCP_RESET} -j REJECT --reject-with tcp-reset\n\
         -A INPUT -p tcp -m tcp --dport {TCP_DEFAULT} -j REJECT\n\
         -A INPUT -p {icmp} {echo} -j REJECT\n\
         -A INPUT -p {icmp} {unreach} -j REJECT\n\
         COMMIT\n"
    ));
    r
}

// === namespaces ===

/// A -- B (module docs); deleted on drop, with every rule in them.
struct Pair {
    a: String,
    b: String,
    /// B's end of the veth.
    b_dev: String,
    a_mac: [u8; 6],
    b_mac: [u8; 6],
}

fn mac(ns: &str, dev: &str) -> [u8; 6] {
    let out = nsx(ns, &["cat", &format!("/sys/class/net/{dev}/address")]).expect("mac");
    let mut m = [0u8; 6];
    for (b, h) in m.iter_mut().zip(out.trim().split(':')) {
        *b = u8::from_str_radix(h, 16).expect("hex");
    }
    m
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let id = std::process::id() % 100_000;
        let p = Pair {
            a: format!("vrj-{tag}a-{id}"),
            b: format!("vrj-{tag}b-{id}"),
            b_dev: format!("vrj{tag}b{id}"),
            a_mac: [0; 6],
            b_mac: [0; 6],
        };
        let a_dev = format!("vrj{tag}a{id}");
        sh(&["ip", "netns", "add", &p.a]).expect("netns add");
        sh(&["ip", "netns", "add", &p.b]).expect("netns add");
        sh(&[
            "ip", "-n", &p.a, "link", "add", &a_dev, "type", "veth", "peer", "name", &p.b_dev,
            "netns", &p.b,
        ])
        .expect("veth");
        for (n, dev, addrs) in [
            (&p.a, &a_dev, vec![format!("{A4}/24"), format!("{A6}/64")]),
            (
                &p.b,
                &p.b_dev,
                vec![
                    format!("{B4}/24"),
                    format!("{B4_RATE}/24"),
                    format!("{B6}/64"),
                    format!("{B6_RATE}/64"),
                ],
            ),
        ] {
            for addr in addrs {
                let mut cmd = vec!["ip", "-n", n, "addr", "add", &addr, "dev", dev];
                if addr.contains(':') {
                    cmd.push("nodad");
                }
                sh(&cmd).expect("addr");
            }
            sh(&["ip", "-n", n, "link", "set", dev, "up"]).expect("up");
            sh(&["ip", "-n", n, "link", "set", "lo", "up"]).expect("lo up");
        }
        let mut p = p;
        p.a_mac = mac(&p.a, &a_dev);
        p.b_mac = mac(&p.b, &p.b_dev);
        // A knows B's addresses from the start: no ARP or neighbour discovery (nor an ICMP
        // error that warms it up) before a probe.
        let lladdr = p.b_mac.map(|b| format!("{b:02x}")).join(":");
        for addr in [
            B4.to_string(),
            B4_RATE.to_string(),
            B6.to_string(),
            B6_RATE.to_string(),
        ] {
            sh(&[
                "ip",
                "-n",
                &p.a,
                "neigh",
                "replace",
                &addr,
                "lladdr",
                &lladdr,
                "dev",
                &a_dev,
                "nud",
                "permanent",
            ])
            .expect("neigh");
        }
        p
    }

    /// Sets A's ICMP rate limits: `on` as the kernel's defaults but 10 s per peer (IPv6: per
    /// /128, scaled by the route's prefix); off: no limit at all.
    fn rate_limit(&self, on: bool) {
        let set = |k: &str, v: &str| {
            nsx(&self.a, &["sysctl", "-qw", &format!("{k}={v}")]).expect("sysctl");
        };
        if on {
            set("net.ipv4.icmp_ratemask", "6168");
            set("net.ipv4.icmp_ratelimit", "10000");
            set("net.ipv6.icmp.ratelimit", "10000");
        } else {
            set("net.ipv4.icmp_ratemask", "0");
            set("net.ipv6.icmp.ratelimit", "0");
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

// === frames ===

fn csum(data: &[u8], init: u32) -> u16 {
    let mut s = init;
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An IP packet from `src` to `dst` carrying `l4` of protocol `proto`, its checksum at
/// `sum_at` filled in (ICMPv4 without the pseudo header).
fn ip_packet(src: IpAddr, dst: IpAddr, proto: u8, mut l4: Vec<u8>, sum_at: usize) -> Vec<u8> {
    let len = l4.len();
    let mut pseudo = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            if proto != 1 {
                pseudo.extend_from_slice(&s.octets());
                pseudo.extend_from_slice(&d.octets());
                pseudo.extend_from_slice(&[0, proto]);
                pseudo.extend_from_slice(&(len as u16).to_be_bytes());
            }
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&(len as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => unreachable!("one family"),
    }
    pseudo.extend_from_slice(&l4);
    let c = csum(&pseudo, 0);
    l4[sum_at..sum_at + 2].copy_from_slice(&c.to_be_bytes());
    let mut p = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend_from_slice(&[0x45, 0]);
            p.extend_from_slice(&((20 + len) as u16).to_be_bytes());
            p.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            let c = csum(&p, 0);
            p[10..12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend_from_slice(&[0x60, 0, 0, 0]);
            p.extend_from_slice(&(len as u16).to_be_bytes());
            p.extend_from_slice(&[proto, 64]);
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
        }
        _ => unreachable!("one family"),
    }
    p.extend_from_slice(&l4);
    p
}

fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&16u16.to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(b"vallum-r");
    ip_packet(src, dst, 17, u, 6)
}

/// A TCP segment with sequence 1000, acknowledgment `ack` (0 without the ACK flag).
fn tcp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, flags: u8, ack: u32) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&1000u32.to_be_bytes());
    t.extend_from_slice(&ack.to_be_bytes());
    t.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    ip_packet(src, dst, 6, t, 16)
}

fn icmp(src: IpAddr, dst: IpAddr, ty: u8, code: u8, body: &[u8]) -> Vec<u8> {
    let mut i = vec![ty, code, 0, 0, 0, 0, 0, 0];
    if ty == 8 || ty == 128 {
        i[4..8].copy_from_slice(&[0x12, 0x34, 0, 1]);
    }
    i.extend_from_slice(body);
    let proto = if src.is_ipv4() { 1 } else { 58 };
    ip_packet(src, dst, proto, i, 2)
}

/// One probe: its IP packet, and whether A must answer it.
struct Probe {
    what: String,
    packet: Vec<u8>,
    answered: Expect,
}

/// What the answer to a probe must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// ICMP destination unreachable with this code (IPv4 type 3, IPv6 type 1).
    Unreachable(u8),
    /// TCP RST with this sequence number (and ACK with this acknowledgment, if `Some`).
    Reset { seq: u32, ack: Option<u32> },
    /// No answer at all (an answer to a RST or an ICMP error).
    Nothing,
}

fn probes(v6: bool) -> Vec<Probe> {
    let (a, b): (IpAddr, IpAddr) = if v6 {
        (A6.into(), B6.into())
    } else {
        (A4.into(), B4.into())
    };
    let types: &[(&str, u8)] = if v6 { &V6_TYPES } else { &V4_TYPES };
    let port_unreach = if v6 { 4 } else { 3 };
    let mut p = Vec::new();
    for (i, (name, code)) in types.iter().enumerate() {
        p.push(Probe {
            what: format!("udp -> {name}"),
            packet: udp(b, a, 40000 + i as u16, UDP_BASE + u16::from(*code)),
            answered: Expect::Unreachable(*code),
        });
    }
    // A SYN: RST with sequence 0 acknowledging 1001 (nf_reject's answer to a SYN).
    p.push(Probe {
        what: "tcp syn -> tcp-reset".into(),
        packet: tcp(b, a, 41000, TCP_RESET, 0x02, 0),
        answered: Expect::Reset {
            seq: 0,
            ack: Some(1001),
        },
    });
    // An ACK mid-connection: RST with the segment's acknowledgment as its sequence.
    p.push(Probe {
        what: "tcp ack -> tcp-reset".into(),
        packet: tcp(b, a, 41001, TCP_RESET, 0x10, 0xdead_beef),
        answered: Expect::Reset {
            seq: 0xdead_beef,
            ack: None,
        },
    });
    p.push(Probe {
        what: "tcp rst -> tcp-reset (no answer to a reset)".into(),
        packet: tcp(b, a, 41002, TCP_RESET, 0x04, 0),
        answered: Expect::Nothing,
    });
    p.push(Probe {
        what: "tcp syn -> plain REJECT".into(),
        packet: tcp(b, a, 41003, TCP_DEFAULT, 0x02, 0),
        answered: Expect::Unreachable(port_unreach),
    });
    p.push(Probe {
        what: "echo request -> REJECT".into(),
        packet: icmp(b, a, if v6 { 128 } else { 8 }, 0, b"ping"),
        answered: Expect::Unreachable(port_unreach),
    });
    // An ICMP error about a datagram A sent: REJECTed, never answered.
    let inner = udp(a, b, 9, 9);
    p.push(Probe {
        what: "icmp error -> REJECT (no error about an error)".into(),
        packet: icmp(b, a, if v6 { 1 } else { 3 }, port_unreach, &inner),
        answered: Expect::Nothing,
    });
    p
}

// === capture ===

/// An AF_PACKET socket on B's veth that reads what arrives for B.
struct Capture {
    fd: OwnedFd,
}

impl Capture {
    fn open(ns: &str, dev: &str) -> Capture {
        let dev = std::ffi::CString::new(dev).expect("name");
        in_netns(ns, move || {
            let proto = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain socket(2); checked below.
            let fd = unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    i32::from(proto),
                )
            };
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            // SAFETY: a new descriptor nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: sockaddr_ll is plain data; zero is valid.
            let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            a.sll_family = libc::AF_PACKET as u16;
            a.sll_protocol = proto;
            // SAFETY: `dev` is NUL-terminated.
            a.sll_ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) } as i32;
            assert!(a.sll_ifindex > 0, "if_nametoindex");
            // SAFETY: `a` is a live sockaddr_ll of the length passed.
            let r = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&a as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 20_000,
            };
            // SAFETY: `tv` is a live timeval of the size passed.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0, "SO_RCVTIMEO");
            Capture { fd }
        })
    }

    /// The IP packets of the answers (ICMP/ICMPv6 errors, TCP) that arrive for B within
    /// `wait`, in order; `stop_after` ends the wait early once that many came.
    fn answers(&self, wait: Duration, stop_after: usize) -> Vec<Vec<u8>> {
        let end = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 2048];
        while Instant::now() < end && got.len() < stop_after {
            // SAFETY: sockaddr_ll is plain data; zero is valid.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `buf` and `from` are live and writable for the lengths passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 14 || from.sll_pkttype != libc::PACKET_HOST {
                continue;
            }
            let f = &buf[..n as usize];
            let ip = &f[14..];
            let answer = match u16::from_be_bytes([f[12], f[13]]) {
                0x0800 if ip.len() >= 20 => ip[9] == 6 || (ip[9] == 1 && ip[20] == 3),
                // ICMPv6 errors (types below 128; not neighbour discovery) and TCP.
                0x86dd if ip.len() >= 41 => ip[6] == 6 || (ip[6] == 58 && ip[40] < 128),
                _ => false,
            };
            if answer {
                got.push(ip.to_vec());
            }
        }
        got
    }
}

/// An answer with what the kernel picks per packet zeroed: the IPv4 identification and header
/// checksum.
fn normalized(ip: &[u8]) -> Vec<u8> {
    let mut v = ip.to_vec();
    if v[0] >> 4 == 4 {
        v[4..6].fill(0);
        v[10..12].fill(0);
    }
    v
}

/// Checks `ip` is the answer `want` asks for; `Err` saying why not.
fn check(ip: &[u8], want: Expect) -> Result<(), String> {
    let v6 = ip[0] >> 4 == 6;
    let (proto, l4) = if v6 {
        (ip[6], &ip[40..])
    } else {
        (ip[9], &ip[20..])
    };
    match want {
        Expect::Unreachable(code) => {
            let ty = if v6 { 1 } else { 3 };
            if proto != if v6 { 58 } else { 1 } || l4[0] != ty || l4[1] != code {
                return Err(format!(
                    "want ICMP {ty}/{code}, got proto {proto} {:?}",
                    &l4[..2]
                ));
            }
        }
        Expect::Reset { seq, ack } => {
            let got_seq = u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]);
            let got_ack = u32::from_be_bytes([l4[8], l4[9], l4[10], l4[11]]);
            let flags = l4[13];
            let want_flags = if ack.is_some() { 0x14 } else { 0x04 };
            if proto != 6
                || flags != want_flags
                || got_seq != seq
                || ack.is_some_and(|a| a != got_ack)
            {
                return Err(format!(
                    "want RST seq {seq} ack {ack:?}, got proto {proto} flags {flags:#x} seq \
                     {got_seq} ack {got_ack}"
                ));
            }
        }
        Expect::Nothing => return Err("an answer where none is due".into()),
    }
    Ok(())
}

/// What one run saw: per probe its answer (normalized), the rate-limited answer count per
/// family, and what the sockets got.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    answers: Vec<(String, Option<Vec<u8>>)>,
    rate_limited: [usize; 2],
    sockets: Vec<(String, std::io::ErrorKind)>,
}

/// Sends every probe from B and captures the answers, then the rate-limit probes, then the
/// socket calls.
fn probe_all(p: &Pair) -> Seen {
    let sender = Sender::open(&p.b, &p.b_dev);
    let cap = Capture::open(&p.b, &p.b_dev);
    let frame = |ip: &[u8]| {
        let mut f = Vec::with_capacity(14 + ip.len());
        f.extend_from_slice(&p.a_mac);
        f.extend_from_slice(&p.b_mac);
        f.extend_from_slice(if ip[0] >> 4 == 6 {
            &[0x86, 0xdd]
        } else {
            &[0x08, 0x00]
        });
        f.extend_from_slice(ip);
        f
    };
    p.rate_limit(false);
    let mut answers = Vec::new();
    for v6 in [false, true] {
        for pr in probes(v6) {
            cap.answers(Duration::from_millis(50), usize::MAX); // Drain.
            sender.send(&frame(&pr.packet));
            let wait = match pr.answered {
                Expect::Nothing => Duration::from_millis(500),
                _ => Duration::from_secs(3),
            };
            let got = cap.answers(wait, 1);
            let what = format!("{} {}", if v6 { "ipv6" } else { "ipv4" }, pr.what);
            match (got.first(), pr.answered) {
                (None, Expect::Nothing) => {}
                (None, want) => panic!("{what}: no answer, want {want:?}"),
                (Some(ip), want) => {
                    check(ip, want).unwrap_or_else(|e| panic!("{what}: {e}: {ip:02x?}"))
                }
            }
            answers.push((what, got.first().map(|ip| normalized(ip))));
        }
    }
    p.rate_limit(true);
    let mut rate_limited = [0; 2];
    for (i, (a, b)) in [
        (IpAddr::from(A4), IpAddr::from(B4_RATE)),
        (IpAddr::from(A6), IpAddr::from(B6_RATE)),
    ]
    .into_iter()
    .enumerate()
    {
        cap.answers(Duration::from_millis(50), usize::MAX);
        let port = UDP_BASE + if a.is_ipv4() { 3 } else { 4 };
        for k in 0..10 {
            sender.send(&frame(&udp(b, a, 42000 + k, port)));
        }
        rate_limited[i] = cap.answers(Duration::from_secs(2), 10).len();
    }
    p.rate_limit(false);
    let sockets = in_netns(&p.b, || {
        let mut s = Vec::new();
        for (a, port_unreach) in [(IpAddr::from(A4), 3u16), (IpAddr::from(A6), 4)] {
            let e =
                TcpStream::connect_timeout(&SocketAddr::new(a, TCP_RESET), Duration::from_secs(5))
                    .expect_err("connect to a tcp-reset port");
            s.push((format!("tcp connect {a}"), e.kind()));
            let bind: IpAddr = if a.is_ipv4() { B4.into() } else { B6.into() };
            let u = UdpSocket::bind((bind, 0)).expect("bind");
            u.connect((a, UDP_BASE + port_unreach))
                .expect("connect udp");
            u.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            u.send(b"vallum").expect("send");
            let e = u.recv(&mut [0u8; 16]).expect_err("udp to a rejected port");
            s.push((format!("udp {a}"), e.kind()));
        }
        s
    });
    Seen {
        answers,
        rate_limited,
        sockets,
    }
}

/// The kernel's packet counters of the `VALLUM-REJECT-*` REJECT rules in A, both families.
fn kernel_reject_counts(a: &str) -> u64 {
    let mut n = 0;
    for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let out = nsx(a, &[save, "-c", "-t", "filter"]).expect("save");
        for l in out.lines().filter(|l| l.contains("-j REJECT")) {
            n += l
                .strip_prefix('[')
                .and_then(|l| l.split(':').next())
                .and_then(|p| p.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    n
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The kernel run: A's kernel enforces the ruleset itself.
fn kernel_run() -> Seen {
    let p = Pair::new("k");
    nsx_in(&p.a, &["iptables-legacy-restore"], &rules(false)).expect("load v4");
    nsx_in(&p.a, &["ip6tables-legacy-restore"], &rules(true)).expect("load v6");
    probe_all(&p)
}

/// The vallumd run in `mode` (`final` or `continue`, for the steering and vallumd): the
/// steering and vallumd enforce the ruleset.
fn vallumd_run(db: &Path, mode: &'static str) -> (Seen, u64, u64) {
    let p = Pair::new(&mode[..1]);
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
            "--mode",
            mode,
        ],
    )
    .expect("dataplane install");
    let db = db.to_owned();
    let a = p.a.clone();
    let d = in_netns(&a, move || {
        let d = Daemon::start(&db, &["--source", "nfqueue", "--nfqueue-mode", mode]);
        block_on(async {
            d.wait_serving().await;
            let mut src = text_source(&rules(false), false, "reject.rules");
            if let Some(pb::ruleset_source::Source::Text(t)) = &mut src.source {
                t.content_v6 = rules(true);
            }
            d.rulesets()
                .await
                .apply(pb::ApplyRequest {
                    ruleset: "reject".into(),
                    source: Some(src),
                    ..Default::default()
                })
                .await
                .expect("apply");
        });
        d
    });
    let seen = probe_all(&p);
    // vallumd decided them: its REJECT rules counted the probes.
    let addr = d.addr.clone();
    let ours = in_netns(&a, move || {
        block_on(async {
            let ch = support::connect(&addr).await;
            let c = pb::counter_service_client::CounterServiceClient::new(ch)
                .get_counters(pb::GetCountersRequest {
                    ruleset: "reject".into(),
                    ..Default::default()
                })
                .await
                .expect("counters")
                .into_inner();
            c.counters
                .iter()
                .filter(|c| c.chain == "INPUT")
                .map(|c| c.packets)
                .sum::<u64>()
        })
    });
    let kernel = kernel_reject_counts(&p.a);
    drop(d);
    (seen, ours, kernel)
}

#[test]
#[ignore = "needs root, iptables-legacy, ip6tables-legacy, nfnetlink_queue and network namespaces"]
fn reject_answers_as_the_kernel_does() {
    let _ = Command::new("modprobe").arg("nfnetlink_queue").output();
    let kernel = kernel_run();
    // The kernel's rate limit applied (the comparison below means something).
    assert!(
        kernel.rate_limited.iter().all(|&n| n > 0 && n < 10),
        "the rate limit did not apply: {:?}",
        kernel.rate_limited
    );
    for mode in ["final", "continue"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ours, vallumd_count, kernel_count) = vallumd_run(&dir.path().join("v.db"), mode);
        // Same answers, byte for byte, probe by probe.
        assert_eq!(kernel.answers.len(), ours.answers.len());
        for ((what, k), (_, v)) in kernel.answers.iter().zip(&ours.answers) {
            assert_eq!(
                k.as_ref().map(|b| format!("{b:02x?}")),
                v.as_ref().map(|b| format!("{b:02x?}")),
                "{mode}: {what}: the kernel's answer (left) and vallumd's (right) differ"
            );
        }
        // The kernel's rate limit holds for vallumd's answers too.
        assert_eq!(
            kernel.rate_limited, ours.rate_limited,
            "{mode}: rate-limited answers"
        );
        // What applications see.
        for s in [&kernel.sockets, &ours.sockets] {
            assert!(
                s.iter()
                    .all(|(_, k)| *k == std::io::ErrorKind::ConnectionRefused),
                "{mode}: {s:?}"
            );
        }
        assert_eq!(kernel.sockets, ours.sockets, "{mode}");
        // vallumd decided the REJECTs (its rules counted the probes), and the kernel's REJECT
        // rules of the steering answered them.
        let answered = ours.answers.iter().filter(|a| a.1.is_some()).count() as u64;
        assert!(
            vallumd_count >= answered,
            "{mode}: vallumd counted {vallumd_count} < {answered}"
        );
        assert!(
            kernel_count >= answered,
            "{mode}: steering REJECTs counted {kernel_count} < {answered}"
        );
    }
}
