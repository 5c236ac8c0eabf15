//! The Linux kernel as oracle: which iptables rules does the kernel's x_tables (legacy) hit for a
//! packet? The Rust counterpart of `shared/tools/kernel_oracle.py`.
//!
//! [`KernelOracle::setup`] makes two private network namespaces, `vallum-fw-<pid>-<n>` (the
//! firewall) and `vallum-src-<pid>-<n>` (the sender), joined by a veth pair `vo0` (sender) -
//! `vo1` (firewall). The firewall namespace routes every IPv4 and IPv6 address to itself
//! ("AnyIP": `local 0.0.0.0/0` and `local ::/0` routes in table local, no reverse-path filter),
//! so any packet arriving on `vo1` reaches the filter table's INPUT chain. Everything the firewall
//! namespace sends itself (RSTs, echo replies, router solicitations) is dropped in `raw OUTPUT`
//! before it can loop back. The sender namespace has IPv6 disabled, so its kernel sends nothing
//! on its own (no DAD, no router solicitation); only the frames this module writes leave `vo0`.
//!
//! [`KernelOracle::load`] restores a filter-table ruleset with `iptables-legacy-restore` (or
//! `ip6tables-legacy-restore`) inside the firewall namespace and zeroes the counters.
//! [`KernelOracle::hits`] reads `iptables-legacy-save -c -t filter`, writes one Ethernet frame on
//! `vo0` from an AF_PACKET socket opened inside the sender namespace (a helper thread `setns`es
//! into it, opens the socket and exits; the socket stays bound to that namespace), polls the
//! counters until they have moved and settled, and reports the rules whose packet counters went
//! up and the builtin chain whose policy counter went up. Dropping the oracle deletes both
//! namespaces (also when a test panics); nothing outside them is touched.
//!
//! [`availability`] says why the oracle cannot run here (not root, a tool missing, namespaces
//! not permitted); the tests that use it are ignored unless asked for, and fail with that reason.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use etherparse::{IpNumber, PacketBuilder};
use vallum_engine::model::{Family, tcp_flags};

/// MAC of the sender's `vo0`.
pub const SRC_MAC: [u8; 6] = [0x02, 0x76, 0x61, 0x6c, 0x00, 0x01];
/// MAC of the firewall's `vo1` (the destination of every frame).
pub const FW_MAC: [u8; 6] = [0x02, 0x76, 0x61, 0x6c, 0x00, 0x02];
/// The interface packets arrive on in the firewall namespace (`-i vo1` matches).
pub const FW_IFACE: &str = "vo1";

const TOOLS: [&str; 7] = [
    "ip",
    "iptables-legacy-restore",
    "ip6tables-legacy-restore",
    "iptables-legacy-save",
    "ip6tables-legacy-save",
    "iptables-legacy",
    "ip6tables-legacy",
];

/// The firewall namespace's local routing table (`ip route show table local`, both families)
/// as the engine's address facts for `-m addrtype`: the AnyIP routes `local 0.0.0.0/0` and
/// `local ::/0` on lo, loopback's `local 127.0.0.0/8`, 127.0.0.1 and broadcast
/// 127.255.255.255, `::1`, vo1's 10.99.0.1/24 (broadcast 10.99.0.255) and its link-local
/// address (from [`FW_MAC`]).
pub fn oracle_local_table() -> vallum_engine::node_addrs::AddrFacts {
    use vallum_engine::model::IpNet;
    use vallum_engine::node_addrs::{AddrFacts, LocalRoute, RouteType};
    use vallum_engine::packet::IfName;
    let e = |net: &str, len: u8, kind: RouteType, dev: &str| LocalRoute {
        net: IpNet::new(net.parse().expect("address"), len).expect("prefix"),
        kind,
        iface: IfName::new(dev).expect("name"),
    };
    AddrFacts::new([
        e("0.0.0.0", 0, RouteType::Local, "lo"),
        e("127.0.0.0", 8, RouteType::Local, "lo"),
        e("127.0.0.1", 32, RouteType::Local, "lo"),
        e("127.255.255.255", 32, RouteType::Broadcast, "lo"),
        e("10.99.0.1", 32, RouteType::Local, FW_IFACE),
        e("10.99.0.255", 32, RouteType::Broadcast, FW_IFACE),
        e("::", 0, RouteType::Local, "lo"),
        e("::1", 128, RouteType::Local, "lo"),
        e("fe80::76:61ff:fe6c:2", 128, RouteType::Local, FW_IFACE),
    ])
}

/// Layer-4 protocol of a [`PacketSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// TCP (6).
    Tcp,
    /// UDP (17).
    Udp,
    /// ICMP (1), IPv4 only.
    Icmp,
    /// ICMPv6 (58), IPv6 only.
    Icmpv6,
    /// Any other protocol number; the payload is sent as is.
    Other(u8),
}

impl Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Icmp => 1,
            Proto::Icmpv6 => 58,
            Proto::Other(n) => n,
        }
    }
}

/// One test packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketSpec {
    /// Name used in messages.
    pub id: String,
    /// Layer-4 protocol.
    pub proto: Proto,
    /// Source address (its family is the packet's).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// TCP/UDP source port.
    pub sport: u16,
    /// TCP/UDP destination port.
    pub dport: u16,
    /// TCP flags ([`tcp_flags`] bits).
    pub flags: u8,
    /// ICMP/ICMPv6 type.
    pub icmp_type: u8,
    /// ICMP/ICMPv6 code.
    pub icmp_code: u8,
    /// Payload bytes after the layer-4 header (zeros).
    pub payload_len: usize,
    /// Keep only this many bytes after the IP header (the layer-4 header cut short), with
    /// the IP length fields (and the IPv4 header checksum) made to agree; `None`: whole.
    pub cut: Option<usize>,
    /// IPv4 TTL / IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 TOS byte / IPv6 traffic class.
    pub tos: u8,
    /// The payload bytes (replacing `payload_len` zeros) when given.
    pub payload: Option<Vec<u8>>,
    /// IPv6 extension headers inserted between the IPv6 header and the layer-4 header:
    /// (first header's type, the headers' bytes, each with its own next-header byte; the last
    /// one names the layer-4 protocol).
    pub ext: Option<(u8, Vec<u8>)>,
}

/// Builds the Ethernet frame for `spec`, from [`SRC_MAC`] to `dst_mac`, with correct checksums.
pub fn build_frame(spec: &PacketSpec, dst_mac: [u8; 6]) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(SRC_MAC, dst_mac);
    let ip = match (spec.src, spec.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), spec.ttl),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), spec.ttl),
        _ => panic!("packet {}: source and destination families differ", spec.id),
    };
    let payload = spec
        .payload
        .clone()
        .unwrap_or_else(|| vec![0u8; spec.payload_len]);
    let mut out = Vec::new();
    let r = match spec.proto {
        Proto::Tcp => {
            let mut t = ip.tcp(spec.sport, spec.dport, 1, 65535);
            let f = spec.flags;
            for (bit, set) in [
                (tcp_flags::FIN, 0),
                (tcp_flags::SYN, 1),
                (tcp_flags::RST, 2),
                (tcp_flags::PSH, 3),
                (tcp_flags::ACK, 4),
                (tcp_flags::URG, 5),
                (0x40, 6),
                (0x80, 7),
            ] {
                if f & bit != 0 {
                    t = match set {
                        0 => t.fin(),
                        1 => t.syn(),
                        2 => t.rst(),
                        3 => t.psh(),
                        4 => t.ack(1),
                        5 => t.urg(0),
                        6 => t.ece(),
                        _ => t.cwr(),
                    };
                }
            }
            t.write(&mut out, &payload)
        }
        Proto::Udp => ip.udp(spec.sport, spec.dport).write(&mut out, &payload),
        Proto::Icmp => ip
            .icmpv4_raw(spec.icmp_type, spec.icmp_code, [0, 1, 0, 1])
            .write(&mut out, &payload),
        Proto::Icmpv6 => ip
            .icmpv6_raw(spec.icmp_type, spec.icmp_code, [0, 1, 0, 1])
            .write(&mut out, &payload),
        Proto::Other(n) => ip.write(&mut out, IpNumber(n), &payload),
    };
    r.unwrap_or_else(|e| panic!("packet {}: cannot build frame: {e}", spec.id));
    if let Some(n) = spec.cut {
        cut_transport(&mut out, n);
    }
    const ETH: usize = 14;
    if out[ETH] >> 4 == 4 {
        out[ETH + 1] = spec.tos;
        fix_ipv4_checksum(&mut out);
    } else {
        out[ETH] = 0x60 | (spec.tos >> 4);
        out[ETH + 1] = (spec.tos << 4) | (out[ETH + 1] & 0x0f);
        if let Some((first, bytes)) = &spec.ext {
            // The layer-4 checksum does not cover extension headers (only the final
            // destination would change with a routing header, and the kernel's filter INPUT
            // does not check it).
            out[ETH + 6] = *first;
            let len = u16::from_be_bytes([out[ETH + 4], out[ETH + 5]]) + bytes.len() as u16;
            out[ETH + 4..ETH + 6].copy_from_slice(&len.to_be_bytes());
            out.splice(ETH + 40..ETH + 40, bytes.iter().copied());
        }
    }
    out
}

/// Recomputes the IPv4 header checksum of an Ethernet frame.
fn fix_ipv4_checksum(frame: &mut [u8]) {
    const ETH: usize = 14;
    let ihl = usize::from(frame[ETH] & 0x0f) * 4;
    frame[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
    let mut sum: u32 = frame[ETH..ETH + ihl]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[ETH + 10..ETH + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// Cuts an Ethernet + IPv4/IPv6 frame (no extension headers) to `n` bytes after the IP
/// header and fixes the IP length fields (and the IPv4 header checksum) to match, so that the
/// kernel's ip_rcv / ipv6_rcv take it as a whole packet with a short transport header.
fn cut_transport(frame: &mut Vec<u8>, n: usize) {
    const ETH: usize = 14;
    if frame[ETH] >> 4 == 4 {
        let ihl = usize::from(frame[ETH] & 0x0f) * 4;
        frame.truncate(ETH + ihl + n);
        let total = u16::try_from(ihl + n).expect("short packet");
        frame[ETH + 2..ETH + 4].copy_from_slice(&total.to_be_bytes());
        frame[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
        let mut sum: u32 = frame[ETH..ETH + ihl]
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        frame[ETH + 10..ETH + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    } else {
        frame.truncate(ETH + 40 + n);
        let payload = u16::try_from(n).expect("short packet");
        frame[ETH + 4..ETH + 6].copy_from_slice(&payload.to_be_bytes());
    }
}

/// What the kernel did with one packet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelHits {
    /// Rules whose packet counter went up, as (chain, 1-based index within the chain), in
    /// iptables-save order.
    pub rules: Vec<(String, usize)>,
    /// The builtin chain whose policy counter went up, if any.
    pub policy: Option<String>,
}

/// Why the oracle cannot run on this machine; `Ok` when it can (as far as can be told without
/// creating a namespace).
pub fn availability() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root".into());
    }
    for tool in TOOLS {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Err(format!("`{tool}` not found in PATH"));
        }
    }
    Ok(())
}

fn run(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if let Some(input) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().ok_or("no stdin pipe")?;
        pipe.write_all(input.as_bytes())
            .map_err(|e| format!("{}: writing stdin: {e}", args.join(" ")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `args` inside namespace `ns` with `ip netns exec`.
pub fn run_in(ns: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    run(&full, stdin)
}

/// Counter snapshot: per rule ((chain, index), packets) in save order, per builtin chain
/// policy packets.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Counters {
    rules: Vec<((String, usize), u64)>,
    policies: Vec<(String, u64)>,
}

/// Parses `iptables-save -c` output of one table: `:CHAIN POLICY [p:b]` and `[p:b] -A CHAIN ...`.
fn parse_counters(save: &str) -> Result<Counters, String> {
    let mut rules: Vec<((String, usize), u64)> = Vec::new();
    let mut policies = Vec::new();
    let packets = |s: &str| -> Result<u64, String> {
        let inner = s
            .trim()
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .ok_or_else(|| format!("bad counter `{s}`"))?;
        let (p, _) = inner
            .split_once(':')
            .ok_or_else(|| format!("bad counter `{s}`"))?;
        p.parse().map_err(|_| format!("bad counter `{s}`"))
    };
    for line in save.lines() {
        if let Some(rest) = line.strip_prefix(':') {
            let mut it = rest.splitn(3, ' ');
            let (Some(name), Some(policy), Some(cnt)) = (it.next(), it.next(), it.next()) else {
                return Err(format!("bad chain line `{line}`"));
            };
            if policy != "-" {
                policies.push((name.to_string(), packets(cnt)?));
            }
        } else if line.starts_with('[') {
            let (cnt, rest) = line
                .split_once("] ")
                .ok_or_else(|| format!("bad rule line `{line}`"))?;
            let chain = rest
                .split_whitespace()
                .nth(1)
                .ok_or_else(|| format!("bad rule line `{line}`"))?;
            let index = rules.iter().filter(|((c, _), _)| c == chain).count() + 1;
            rules.push(((chain.to_string(), index), packets(&format!("{cnt}]"))?));
        }
    }
    Ok(Counters { rules, policies })
}

static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// Two namespaces and a raw socket into the veth; see the module docs. Deletes the namespaces
/// on drop.
pub struct KernelOracle {
    fw: String,
    src: String,
    /// Namespaces created so far (for Drop, also on a half-finished setup).
    created: Vec<String>,
    sock: Option<OwnedFd>,
    ifindex: i32,
}

impl Drop for KernelOracle {
    fn drop(&mut self) {
        self.sock = None;
        for ns in self.created.drain(..).rev() {
            let _ = run(&["ip", "netns", "del", &ns], None);
        }
    }
}

/// Outcome of [`KernelOracle::setup`]: the oracle, a reason to skip, or a setup failure.
pub enum Setup {
    /// Ready.
    Ready(KernelOracle),
    /// The machine cannot run the oracle (not root, tools missing, namespaces refused).
    Skip(String),
}

impl KernelOracle {
    /// Creates the namespaces and the veth pair. `Ok(Setup::Skip(reason))` when this machine
    /// cannot do it; `Err` when setup failed part-way (a real failure).
    pub fn setup() -> Result<Setup, String> {
        if let Err(reason) = availability() {
            return Ok(Setup::Skip(reason));
        }
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let mut o = KernelOracle {
            fw: format!("vallum-fw-{pid}-{n}"),
            src: format!("vallum-src-{pid}-{n}"),
            created: Vec::new(),
            sock: None,
            ifindex: 0,
        };
        // The first namespace decides whether this environment permits them at all.
        if let Err(e) = run(&["ip", "netns", "add", &o.fw], None) {
            return Ok(Setup::Skip(format!(
                "cannot create a network namespace: {e}"
            )));
        }
        o.created.push(o.fw.clone());
        run(&["ip", "netns", "add", &o.src], None)?;
        o.created.push(o.src.clone());
        o.configure()?;
        Ok(Setup::Ready(o))
    }

    fn configure(&mut self) -> Result<(), String> {
        let (fw, src) = (self.fw.clone(), self.src.clone());
        // The sender's kernel must stay silent: no IPv6 on its interfaces (set before vo0
        // exists so that it never gets a link-local address).
        run_in(
            &src,
            &[
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
            None,
        )?;
        // A rule that counts every packet arriving at INPUT before the filter table sees it
        // (mangle runs first): tells a packet the filter table dropped without moving any
        // counter (a match's hotdrop) from one that never arrived.
        for tool in ["iptables-legacy", "ip6tables-legacy"] {
            run_in(&fw, &[tool, "-t", "mangle", "-A", "INPUT"], None)?;
        }
        // Drop everything the firewall namespace sends, before its interfaces come up.
        run_in(
            &fw,
            &["iptables-legacy", "-t", "raw", "-A", "OUTPUT", "-j", "DROP"],
            None,
        )?;
        run_in(
            &fw,
            &[
                "ip6tables-legacy",
                "-t",
                "raw",
                "-A",
                "OUTPUT",
                "-j",
                "DROP",
            ],
            None,
        )?;
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        let (smac, fmac) = (mac(SRC_MAC), mac(FW_MAC));
        run(
            &[
                "ip", "link", "add", "vo0", "netns", &src, "address", &smac, "type", "veth",
                "peer", "name", FW_IFACE, "netns", &fw, "address", &fmac,
            ],
            None,
        )?;
        run_in(
            &fw,
            &[
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=0",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.conf.vo1.rp_filter=0",
                "net.ipv4.conf.vo1.accept_local=1",
                "net.ipv6.conf.vo1.accept_dad=0",
                "net.ipv6.conf.vo1.disable_ipv6=0",
            ],
            None,
        )?;
        for (ns, dev) in [(&fw, "lo"), (&fw, FW_IFACE), (&src, "lo"), (&src, "vo0")] {
            run(&["ip", "-n", ns, "link", "set", dev, "up"], None)?;
        }
        run(
            &[
                "ip",
                "-n",
                &fw,
                "route",
                "add",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
                "table",
                "local",
            ],
            None,
        )?;
        run(
            &[
                "ip", "-n", &fw, "-6", "route", "add", "local", "::/0", "dev", "lo", "table",
                "local",
            ],
            None,
        )?;
        // One IPv4 subnet on vo1, for `-m addrtype`: local 10.99.0.1 and broadcast
        // 10.99.0.255 on vo1 (see [`oracle_local_table`]).
        run(
            &[
                "ip",
                "-n",
                &fw,
                "addr",
                "add",
                "10.99.0.1/24",
                "broadcast",
                "10.99.0.255",
                "dev",
                FW_IFACE,
            ],
            None,
        )?;
        let (sock, ifindex) = open_sender(&src, "vo0")?;
        self.sock = Some(sock);
        self.ifindex = ifindex;
        Ok(())
    }

    /// The names of the two namespaces (firewall, sender).
    pub fn namespaces(&self) -> Vec<String> {
        vec![self.fw.clone(), self.src.clone()]
    }

    /// Loads `rules` (iptables-restore text with a `*filter` table) for `family`, resets the
    /// other family's filter table to empty ACCEPT chains, and zeroes the counters.
    pub fn load(&self, family: Family, rules: &str) -> Result<(), String> {
        let empty =
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
        let (this, other) = match family {
            Family::Ipv4 => ("iptables-legacy", "ip6tables-legacy"),
            Family::Ipv6 => ("ip6tables-legacy", "iptables-legacy"),
        };
        run_in(&self.fw, &[&format!("{other}-restore")], Some(empty))?;
        run_in(&self.fw, &[&format!("{this}-restore")], Some(rules))?;
        run_in(&self.fw, &[this, "-t", "filter", "-Z"], None)?;
        Ok(())
    }

    fn counters(&self, family: Family) -> Result<Counters, String> {
        let save = match family {
            Family::Ipv4 => "iptables-legacy-save",
            Family::Ipv6 => "ip6tables-legacy-save",
        };
        parse_counters(&run_in(&self.fw, &[save, "-c", "-t", "filter"], None)?)
    }

    /// Packets that reached INPUT so far (the mangle INPUT rule added at setup).
    fn arrived(&self, family: Family) -> Result<u64, String> {
        let save = match family {
            Family::Ipv4 => "iptables-legacy-save",
            Family::Ipv6 => "ip6tables-legacy-save",
        };
        let c = parse_counters(&run_in(&self.fw, &[save, "-c", "-t", "mangle"], None)?)?;
        c.rules
            .iter()
            .find(|((chain, _), _)| chain == "INPUT")
            .map(|(_, n)| *n)
            .ok_or_else(|| "the mangle INPUT counting rule is gone".to_string())
    }

    /// Sends `frame` (whose IP version is `family`) and reports which counters went up. A
    /// packet that reached INPUT but moved no filter counter (hotdropped by a match that could
    /// not read its header) reports no rule and no policy.
    pub fn hits(&self, family: Family, frame: &[u8]) -> Result<KernelHits, String> {
        let before = self.counters(family)?;
        let arrived_before = self.arrived(family)?;
        self.send(frame)?;
        // Poll until the counters move (or the packet has arrived and the filter table has had
        // its turn: the mangle and filter hooks run in one softirq pass, so once the mangle
        // counter is read as moved, the filter table is done with the packet), then until two
        // reads 30 ms apart agree.
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut last = before.clone();
        let mut moved = false;
        loop {
            std::thread::sleep(Duration::from_millis(if moved { 30 } else { 5 }));
            let now = self.counters(family)?;
            if moved && now == last {
                break;
            }
            if !moved && now == before && self.arrived(family)? > arrived_before {
                // Arrived; read the filter counters once more, after the mangle counter.
                let now = self.counters(family)?;
                if now == before {
                    break;
                }
                last = now;
                moved = true;
                continue;
            }
            moved |= now != before;
            last = now;
            if Instant::now() > deadline {
                if !moved {
                    return Err("the packet never reached INPUT (no counter moved)".into());
                }
                return Err("counters did not settle".into());
            }
        }
        let after = last;
        if after.rules.len() != before.rules.len() {
            return Err("the ruleset changed while a packet was in flight".into());
        }
        let rules = after
            .rules
            .iter()
            .zip(&before.rules)
            .filter(|((_, a), (_, b))| a > b)
            .map(|((k, _), _)| k.clone())
            .collect();
        let policy = after
            .policies
            .iter()
            .zip(&before.policies)
            .find(|((_, a), (_, b))| a > b)
            .map(|((c, _), _)| c.clone());
        Ok(KernelHits { rules, policy })
    }

    /// Writes `frame` on the sender's `vo0` (it arrives on the firewall's `vo1`).
    pub fn send(&self, frame: &[u8]) -> Result<(), String> {
        let sock = self.sock.as_ref().ok_or("no sender socket")?;
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = self.ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&FW_MAC);
        // SAFETY: the fd is an open AF_PACKET socket; the buffer and address pointers are valid
        // for the lengths passed.
        let n = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 || n as usize != frame.len() {
            return Err(format!(
                "sendto on vo0 failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}

/// Opens an AF_PACKET socket inside namespace `ns` and finds `dev`'s ifindex there. A helper
/// thread does the `setns` (which changes only the calling thread's namespace) and exits; the
/// socket keeps the namespace it was created in.
fn open_sender(ns: &str, dev: &str) -> Result<(OwnedFd, i32), String> {
    let ns_file =
        File::open(format!("/run/netns/{ns}")).map_err(|e| format!("open /run/netns/{ns}: {e}"))?;
    let dev = std::ffi::CString::new(dev).map_err(|e| e.to_string())?;
    std::thread::spawn(move || -> Result<(OwnedFd, i32), String> {
        // SAFETY: setns takes an open namespace fd and a namespace type; it affects only this
        // thread, which exits right after.
        if unsafe { libc::setns(ns_file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: plain socket(2) call. Protocol 0: the socket sends only, receives nothing.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(format!(
                "socket(AF_PACKET): {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: dev is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) };
        if ifindex == 0 {
            return Err(format!(
                "if_nametoindex: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok((sock, ifindex as i32))
    })
    .join()
    .map_err(|_| "sender thread panicked".to_string())?
}

/// What the kernel keeps of a restore text: `text` restored with `iptables-legacy-restore` (or
/// `ip6tables-legacy-restore`) in a fresh network namespace of its own (`unshare -n`, gone
/// when the command exits), then `iptables-legacy-save -t TABLE` of it. `Err` carries the
/// tool's message when the restore fails.
pub fn restore_and_save(family: Family, table: &str, text: &str) -> Result<String, String> {
    let tool = match family {
        Family::Ipv4 => "iptables-legacy",
        Family::Ipv6 => "ip6tables-legacy",
    };
    let script = format!("{tool}-restore && {tool}-save -t {table}");
    run(&["unshare", "-n", "sh", "-c", &script], Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_save_counters() {
        let save = "# Generated\n*filter\n:INPUT DROP [3:120]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:X - [0:0]\n[1:40] -A INPUT -p tcp -j X\n[0:0] -A INPUT -j ACCEPT\n[5:9] -A X -j RETURN\nCOMMIT\n";
        let c = parse_counters(save).unwrap();
        assert_eq!(
            c.rules,
            vec![
                (("INPUT".into(), 1), 1),
                (("INPUT".into(), 2), 0),
                (("X".into(), 1), 5)
            ]
        );
        assert_eq!(c.policies[0], ("INPUT".into(), 3));
        assert_eq!(c.policies.len(), 3);
    }
}
