//! The corpus of real-world rulesets (`tests/fixtures/corpus`, see its `MANIFEST`): rulesets
//! of our own written after what ufw, fail2ban, firewalld (iptables backend), Docker 24/28,
//! kube-proxy, Calico Felix, Neutron, libvirt and hardening guides generate.
//!
//! - [`corpus_imports_and_exports_as_the_kernel`]: every file goes to a real vallumd (Apply);
//!   one listed `accept` must be accepted, one listed `refuse EXT,...` refused with an error
//!   naming each extension, so the manifest tracks what is supported. As root with the
//!   `*tables-legacy` tools, every file must also be accepted by the kernel
//!   (`iptables-legacy-restore` in a private network namespace), and every accepted file's
//!   export must be what `iptables-legacy-save` prints for it, table by table, apart from
//!   comment lines and counters: that is [`corpus_imports_and_exports_as_the_kernel_as_root`],
//!   ignored unless asked for (`-- --include-ignored`), which fails when it cannot run.
//! - [`corpus_packets_through_nfqueue`] (root, NFQUEUE; ignored likewise): see there.

use crate::support;
use crate::support::netns;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use netns::{Sender, in_netns, nsx, nsx_in, on_path, sh};
use support::{Daemon, text_source};
use vallum_proto::v1 as pb;

/// One line of the manifest.
#[derive(Clone, Debug)]
struct Entry {
    file: String,
    v6: bool,
    text: String,
    /// `None`: accepted; `Some(exts)`: refused naming each.
    refused: Option<Vec<String>>,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus")
}

fn manifest() -> Vec<Entry> {
    let dir = corpus_dir();
    let text = std::fs::read_to_string(dir.join("MANIFEST")).expect("MANIFEST");
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        let refused = match w.as_slice() {
            [_, "accept"] => None,
            [_, "refuse", exts] => Some(exts.split(',').map(str::to_owned).collect()),
            _ => panic!(
                "MANIFEST:{}: expected `FILE accept` or `FILE refuse EXT[,EXT]`",
                i + 1
            ),
        };
        let file = w[0].to_owned();
        let body = std::fs::read_to_string(dir.join(&file))
            .unwrap_or_else(|e| panic!("MANIFEST:{}: {file}: {e}", i + 1));
        out.push(Entry {
            v6: file.ends_with(".rules6"),
            file,
            text: body,
            refused,
        });
    }
    // Every file of the directory is listed.
    let mut listed: Vec<&str> = out.iter().map(|e| e.file.as_str()).collect();
    listed.sort_unstable();
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".rules") || n.ends_with(".rules6"))
        .collect();
    present.sort_unstable();
    assert_eq!(listed, present, "MANIFEST lists every corpus file once");
    out
}

/// A ruleset name for a file: its stem.
fn ruleset_name(file: &str) -> String {
    file.trim_end_matches('6')
        .trim_end_matches(".rules")
        .replace('.', "-")
}

/// Why the kernel part cannot run here, if it cannot.
fn kernel_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    for t in [
        "unshare",
        "iptables-legacy-restore",
        "iptables-legacy-save",
        "ip6tables-legacy-restore",
        "ip6tables-legacy-save",
    ] {
        if !on_path(t) {
            return Some(format!("`{t}` is not on PATH"));
        }
    }
    None
}

/// `text` restored by the kernel in a private network namespace, then saved: the save text,
/// or the tool's error.
fn kernel_save(text: &str, v6: bool) -> Result<String, String> {
    let tool = if v6 {
        "ip6tables-legacy"
    } else {
        "iptables-legacy"
    };
    let mut child = Command::new("unshare")
        .args(["-n", "sh", "-c", &format!("{tool}-restore && {tool}-save")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("unshare: {e}"))?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().ok_or("stdin")?;
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A save text as its tables: name -> lines from `*name` to `COMMIT`, without comment lines
/// and with every `[p:b]` counter as `[0:0]`.
fn tables(save: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cur: Option<String> = None;
    for l in save.lines() {
        if l.starts_with('#') || l.trim().is_empty() {
            continue;
        }
        if let Some(t) = l.strip_prefix('*') {
            cur = Some(t.to_owned());
        }
        let Some(t) = &cur else { continue };
        let line = match (l.find('['), l.rfind(']')) {
            (Some(a), Some(b)) if l.starts_with(':') && b > a => format!("{}[0:0]", &l[..a]),
            _ => l.to_owned(),
        };
        out.entry(t.clone()).or_default().push(line);
        if l == "COMMIT" {
            cur = None;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_imports_and_exports_as_the_kernel() {
    corpus_imports_and_exports(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and iptables-legacy"]
async fn corpus_imports_and_exports_as_the_kernel_as_root() {
    if let Some(why) = kernel_unavailable() {
        panic!("the kernel part cannot run: {why}");
    }
    corpus_imports_and_exports(true).await;
}

/// Every corpus file through a real vallumd and, with `kernel`, through the kernel as well.
async fn corpus_imports_and_exports(kernel: bool) {
    let entries = manifest();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let mut failures = Vec::new();
    let (mut kernel_ok, mut ours_ok, mut equal) = (0, 0, 0);
    for e in &entries {
        let name = ruleset_name(&e.file);
        if kernel {
            match kernel_save(&e.text, e.v6) {
                Ok(_) => kernel_ok += 1,
                Err(why) => failures.push(format!("{}: the kernel refuses it: {why}", e.file)),
            }
        }
        let applied = rs
            .apply(pb::ApplyRequest {
                ruleset: name.clone(),
                source: Some(text_source(&e.text, e.v6, &e.file)),
                ..Default::default()
            })
            .await;
        match (&e.refused, applied) {
            (None, Ok(_)) => ours_ok += 1,
            (None, Err(s)) => failures.push(format!(
                "{}: listed `accept`, refused: {}",
                e.file,
                s.message()
            )),
            (Some(exts), Ok(_)) => failures.push(format!(
                "{}: listed `refuse {}`, accepted: move it to `accept` in MANIFEST",
                e.file,
                exts.join(",")
            )),
            (Some(exts), Err(s)) => {
                use tonic_types::StatusExt;
                let mut said = s.message().to_owned();
                for v in s
                    .get_error_details()
                    .bad_request()
                    .into_iter()
                    .flat_map(|b| b.field_violations.iter())
                {
                    said.push('\n');
                    said.push_str(&v.description);
                }
                for x in exts {
                    if !said.contains(x.as_str()) {
                        failures.push(format!("{}: refused without naming {x}: {said}", e.file));
                    }
                }
            }
        }
        if e.refused.is_some() || !kernel {
            continue;
        }
        let ours = rs
            .export_revision(pb::ExportRevisionRequest {
                name: format!("rulesets/{name}/revisions/1"),
                format: pb::ExportFormat::IptablesSave as i32,
                counters: false,
            })
            .await
            .expect("export")
            .into_inner()
            .content;
        let Ok(theirs) = kernel_save(&e.text, e.v6) else {
            continue;
        };
        // Our export holds both families; keep the one of the file.
        let ours = match ours.split_once("# ---- ip6tables-save ----") {
            Some((v4, v6)) => if e.v6 { v6 } else { v4 }.to_owned(),
            None => ours,
        };
        let (a, b) = (tables(&ours), tables(&theirs));
        if a == b {
            equal += 1;
        } else {
            for t in a
                .keys()
                .chain(b.keys())
                .collect::<std::collections::BTreeSet<_>>()
            {
                let (x, y) = (a.get(t), b.get(t));
                if x != y {
                    failures.push(format!(
                        "{}: table {t} exports\n{}\niptables-legacy-save prints\n{}",
                        e.file,
                        x.map(|v| v.join("\n")).unwrap_or_default(),
                        y.map(|v| v.join("\n")).unwrap_or_default()
                    ));
                }
            }
        }
    }
    let listed_accept = entries.iter().filter(|e| e.refused.is_none()).count();
    println!(
        "corpus: {} files ({} IPv6); kernel accepts {}; vallumd accepts {} (manifest: {} accept, \
         {} refuse); exports equal to iptables-legacy-save: {}",
        entries.len(),
        entries.iter().filter(|e| e.v6).count(),
        if kernel {
            kernel_ok.to_string()
        } else {
            "not run".into()
        },
        ours_ok,
        listed_accept,
        entries.len() - listed_accept,
        if kernel {
            equal.to_string()
        } else {
            "not run".into()
        },
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// === packets through NFQUEUE ===
//
// Three private network namespaces: K (the kernel decides: the file's filter and raw tables
// loaded with iptables-legacy-restore), V (vallumd decides: `--source nfqueue` with the
// steering of `vallumctl dataplane install`, the file applied over gRPC) and S, which sends
// every frame once to K and once to V over two veth pairs (`eth0` in K and V). K and V are
// set up alike: every address is local (AnyIP), except 172.16.0.0/12, 192.168.0.0/16 and
// fd00:dead:beef::/48, which are routed out of interfaces docker0, virbr0 and eth1 (veths whose peers are down,
// so what leaves them is dropped), so a
// frame to them goes through FORWARD, and 100.64.0.0/24 and 2001:db8:64::/48, routed back out of
// eth0: for `-m rpfilter` these are the valid sources, the routed ones spoofed (they arrive on
// eth0 but route elsewhere) and every other source a local address (AnyIP); packets with mark
// 0x100000 find 172.16.0.0/12 out of eth0 (table 100, for `--validmark`). What either namespace sends itself (RSTs, ICMP errors,
// echo replies) is dropped in mangle OUTPUT, before it can be queued or loop back (only
// loopback traffic to 127.0.0.0/8, the test's gRPC to vallumd, passes).
//
// Frames are generated from the rules of each accepted file (chains other than OUTPUT): for
// every rule one frame built to hit it (its protocol, addresses, ports, ICMP type, TCP flags,
// TTL / hop limit, iprange start, `--string` pattern as payload) and one that just misses (the next port, another source,
// or the other protocol); every frame is a new flow (its own source port and ICMP id). After
// a file's frames are sent, the packet counters of every rule in filter and raw (OUTPUT
// chains excepted) must be equal in K (`iptables-legacy-save -c`) and V (GetCounters).

const FW_MAC: &str = "02:76:61:6c:00:02";
const SRC_MAC: [u8; 6] = [0x02, 0x76, 0x61, 0x6c, 0x00, 0x01];

/// The three namespaces; deleted on drop (also on panic).
struct Lab {
    k: String,
    v: String,
    s: String,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for n in [&self.k, &self.v, &self.s] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

impl Lab {
    fn new() -> Result<Lab, String> {
        let id = std::process::id();
        let lab = Lab {
            k: format!("vc-k-{id}"),
            v: format!("vc-v-{id}"),
            s: format!("vc-s-{id}"),
        };
        for n in [&lab.k, &lab.v, &lab.s] {
            sh(&["ip", "netns", "add", n])?;
        }
        for (fw, peer) in [(&lab.k, "sk"), (&lab.v, "sv")] {
            sh(&[
                "ip",
                "-n",
                &lab.s,
                "link",
                "add",
                peer,
                "address",
                "02:76:61:6c:00:01",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "address",
                FW_MAC,
                "netns",
                fw,
            ])?;
            sh(&["ip", "-n", &lab.s, "link", "set", peer, "up"])?;
            let setup = "set -e
                sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.accept_dad=0
                sysctl -qw net.ipv6.conf.eth0.accept_dad=0
                ip link set lo up; ip link set eth0 up
                ip addr add 10.99.0.1/24 dev eth0
                for d in docker0 virbr0 eth1; do ip link add $d type veth peer name ${d}p; ip link set $d up; done
                sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
                for k in all default eth0 docker0 virbr0 eth1; do sysctl -qw net.ipv4.conf.$k.rp_filter=0; done
                sysctl -qw net.ipv4.conf.eth0.accept_local=1
                ip route add local 0.0.0.0/0 dev lo table local
                ip -6 route add local ::/0 dev lo table local
                ip route add 172.16.0.0/12 dev docker0
                ip route add 192.168.122.0/24 dev virbr0
                ip route add 192.168.0.0/16 dev eth1
                ip route add 100.64.0.0/24 dev eth0
                ip route add 172.16.0.0/12 dev eth0 table 100
                ip rule add pref 5 fwmark 0x100000/0x100000 lookup 100
                ip -6 route add 2001:db8:64::/48 dev eth0
                ip -6 route add fd00:dead:beef::/48 dev docker0
                ip rule add pref 10 to 172.16.0.0/12 lookup main
                ip rule add pref 10 to 192.168.0.0/16 lookup main
                ip rule add pref 10 to 100.64.0.0/24 lookup main
                ip rule add pref 100 lookup local; ip rule del pref 0 lookup local
                ip -6 rule add pref 10 to fd00:dead:beef::/48 lookup main
                ip -6 rule add pref 10 to 2001:db8:64::/48 lookup main
                ip -6 rule add pref 100 lookup local; ip -6 rule del pref 0 lookup local
                iptables-legacy -t mangle -A OUTPUT -d 127.0.0.0/8 -o lo -j ACCEPT
                iptables-legacy -t mangle -A OUTPUT -j DROP
                ip6tables-legacy -t mangle -A OUTPUT -j DROP";
            nsx(fw, &["sh", "-c", setup])?;
        }
        nsx(
            &lab.s,
            &[
                "sh",
                "-c",
                "ip link set lo up; sysctl -qw net.ipv6.conf.all.disable_ipv6=1",
            ],
        )?;
        Ok(lab)
    }
}

// === frames ===

/// A frame to send: what the generator took from a rule.
#[derive(Clone, Debug)]
struct Pkt {
    src: std::net::IpAddr,
    dst: std::net::IpAddr,
    proto: u8,
    sport: u16,
    dport: u16,
    /// TCP flags, or ICMP type.
    flags: u8,
    code: u8,
    ttl: u8,
    /// ICMP id (each frame its own flow).
    id: u16,
    /// Bytes after the TCP or UDP header (a rule's `--string`, so that its hit frame holds
    /// it).
    payload: Vec<u8>,
}

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

fn frame(p: &Pkt) -> Vec<u8> {
    use std::net::IpAddr;
    let mut l4 = match p.proto {
        6 => {
            let mut t = Vec::new();
            t.extend_from_slice(&p.sport.to_be_bytes());
            t.extend_from_slice(&p.dport.to_be_bytes());
            t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, if p.flags & 0x10 != 0 { 1 } else { 0 }]);
            t.extend_from_slice(&[0x50, p.flags, 0xff, 0xff, 0, 0, 0, 0]);
            t.extend_from_slice(&p.payload);
            t
        }
        17 => {
            let mut u = Vec::new();
            u.extend_from_slice(&p.sport.to_be_bytes());
            u.extend_from_slice(&p.dport.to_be_bytes());
            u.extend_from_slice(&(12 + p.payload.len() as u16).to_be_bytes());
            u.extend_from_slice(&[0, 0, b'v', b'a', b'l', b'm']);
            u.extend_from_slice(&p.payload);
            u
        }
        1 | 58 => {
            let mut i = vec![p.flags, p.code, 0, 0];
            i.extend_from_slice(&p.id.to_be_bytes());
            i.extend_from_slice(&[0, 1, 0, 0, 0, 0]);
            i
        }
        _ => vec![0; 8],
    };
    let len = l4.len() as u32;
    let sum_at = match p.proto {
        6 => Some(16),
        17 => Some(6),
        1 | 58 => Some(2),
        _ => None,
    };
    let mut pseudo: Vec<u8> = Vec::new();
    match (p.src, p.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, p.proto]);
            pseudo.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&len.to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, p.proto]);
        }
        _ => panic!("families differ: {p:?}"),
    }
    if let Some(at) = sum_at {
        let mut body = if p.proto == 1 {
            Vec::new()
        } else {
            pseudo.clone()
        };
        body.extend_from_slice(&l4);
        let mut c = csum(&body, 0);
        if p.proto == 17 && c == 0 {
            c = 0xffff;
        }
        l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
    let mut f: Vec<u8> = Vec::new();
    // A broadcast destination goes to the broadcast MAC (what the kernel's pkttype reads).
    if p.dst == std::net::IpAddr::from([10, 99, 0, 255]) {
        f.extend_from_slice(&[0xff; 6]);
    } else {
        f.extend_from_slice(&[0x02, 0x76, 0x61, 0x6c, 0x00, 0x02]);
    }
    f.extend_from_slice(&SRC_MAC);
    match (p.src, p.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&((20 + len) as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 1, 0x40, 0, p.ttl, p.proto, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let c = csum(&ip, 0);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(len as u16).to_be_bytes());
            f.extend_from_slice(&[p.proto, p.ttl]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => unreachable!(),
    }
    f.extend_from_slice(&l4);
    f
}

/// The first address of `A[/L]` that is a host of it (`.1` past a network address).
fn host_of(spec: &str) -> Option<std::net::IpAddr> {
    let (a, len) = spec.split_once('/').unwrap_or((spec, "999"));
    let addr: std::net::IpAddr = a.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    Some(match addr {
        std::net::IpAddr::V4(v) if len < 31 => std::net::IpAddr::V4((u32::from(v) | 1).into()),
        std::net::IpAddr::V6(v) if len < 127 => std::net::IpAddr::V6((u128::from(v) | 1).into()),
        a => a,
    })
}

fn proto_number(p: &str) -> Option<u8> {
    Some(match p {
        "tcp" => 6,
        "udp" => 17,
        "icmp" => 1,
        "ipv6-icmp" | "icmpv6" => 58,
        "ipencap" => 4,
        "gre" => 47,
        n => n.parse().ok()?,
    })
}

fn tcp_flags(list: &str) -> u8 {
    list.split(',')
        .map(|f| match f {
            "FIN" => 1,
            "SYN" => 2,
            "RST" => 4,
            "PSH" => 8,
            "ACK" => 16,
            "URG" => 32,
            "ALL" => 63,
            _ => 0,
        })
        .fold(0, |a, b| a | b)
}

/// Whether a chain's packets are routed (sent to a forwarded destination) by its name.
fn forwarding_chain(chain: &str) -> bool {
    [
        "FORWARD",
        "FWD",
        "DOCKER",
        "LIBVIRT_FW",
        "neutron-openvswi-sg",
        "syn",
    ]
    .iter()
    .any(|w| chain.contains(w))
        && !chain.contains("INPUT")
}

/// The pattern of a rule's `-m string --string "TEXT"` (quoted, no escapes in the corpus).
fn string_arg(line: &str) -> Option<Vec<u8>> {
    let rest = &line[line.find("--string \"")? + 10..];
    Some(rest.as_bytes()[..rest.find('"')?].to_vec())
}

/// The hit and miss frames of one `-A` line of a filter or raw table.
fn frames_for(line: &str, v6: bool, next: &mut u16) -> Vec<Pkt> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let chain = w.get(1).copied().unwrap_or("");
    let fwd = forwarding_chain(chain);
    let (local, routed, other): (std::net::IpAddr, std::net::IpAddr, std::net::IpAddr) = if v6 {
        (
            "2001:db8:99::1".parse().unwrap(),
            "fd00:dead:beef::2".parse().unwrap(),
            "2001:db8:7::7".parse().unwrap(),
        )
    } else {
        (
            "10.99.0.1".parse().unwrap(),
            "172.17.0.2".parse().unwrap(),
            "203.0.113.7".parse().unwrap(),
        )
    };
    let mut p = Pkt {
        src: other,
        dst: if fwd { routed } else { local },
        proto: 6,
        sport: 0,
        dport: 80,
        flags: 2,
        code: 0,
        ttl: 64,
        id: 0,
        payload: string_arg(line).unwrap_or_default(),
    };
    let (mut has_dport, mut has_src, mut proto_negated) = (false, false, false);
    let mut i = 0;
    while i < w.len() {
        let neg = i > 0 && w[i - 1] == "!";
        let arg = w.get(i + 1).copied().unwrap_or("");
        match w[i] {
            "-p" => {
                if let Some(n) = proto_number(arg) {
                    p.proto = n;
                    proto_negated = neg;
                }
            }
            "-s" if !neg => {
                if let Some(a) = host_of(arg) {
                    p.src = a;
                    has_src = true;
                }
            }
            "-d" if !neg => {
                if let Some(a) = host_of(arg) {
                    p.dst = a;
                }
            }
            "--src-range" => {
                if let Some(a) = arg.split('-').next().and_then(host_of) {
                    p.src = a;
                    has_src = true;
                }
            }
            "--dst-range" => {
                if let Some(a) = arg.split('-').next().and_then(host_of) {
                    p.dst = a;
                }
            }
            "--dport" | "--dports" if !neg => {
                if let Some(n) = arg.split([',', ':']).next().and_then(|n| n.parse().ok()) {
                    p.dport = n;
                    has_dport = true;
                }
            }
            "--sport" | "--sports" if !neg => {
                if let Some(n) = arg.split([',', ':']).next().and_then(|n| n.parse().ok()) {
                    p.sport = n;
                }
            }
            "--icmp-type" | "--icmpv6-type" => {
                let (t, c) = arg.split_once('/').unwrap_or((arg, "0"));
                if let (Ok(t), Ok(c)) = (t.parse(), c.parse()) {
                    p.flags = t;
                    p.code = c;
                }
            }
            "--syn" => p.flags = if neg { 16 } else { 2 },
            "--tcp-flags" => {
                let comp = w.get(i + 2).copied().unwrap_or("");
                p.flags = if neg { 16 } else { tcp_flags(comp) };
            }
            // The subnet broadcast of eth0, sent to the broadcast MAC by `frame`.
            "--pkt-type" if !neg && arg == "broadcast" && !v6 => {
                p.dst = "10.99.0.255".parse().unwrap();
            }
            "--ttl-lt" => p.ttl = arg.parse::<u8>().map_or(64, |t| t.saturating_sub(1)),
            "--ttl-eq" | "--hl-eq" => p.ttl = arg.parse().unwrap_or(64),
            _ => {}
        }
        i += 1;
    }
    if proto_negated {
        p.proto = if p.proto == 6 { 17 } else { 6 };
    }
    match p.proto {
        1 if p.flags == 2 => p.flags = 8,
        58 if p.flags == 2 => p.flags = 128,
        17 if !has_dport => p.dport = 53,
        _ => {}
    }
    // A multicast destination nobody joined is dropped by the kernel's routing before INPUT,
    // where NFQUEUE would queue it: the kernel's raw PREROUTING counts it, vallumd never sees
    // it (a limit of NFQUEUE mode, docs/operations.md); such frames are not sent.
    if p.src.is_ipv4() != p.dst.is_ipv4() || p.dst.is_multicast() {
        return Vec::new();
    }
    let mut miss = p.clone();
    if has_dport {
        miss.dport = p.dport.wrapping_add(1);
    } else if has_src {
        miss.src = other;
    } else {
        miss.proto = if p.proto == 6 { 17 } else { 6 };
        miss.dport = 9;
    }
    let mut out = vec![p, miss];
    for q in &mut out {
        *next = next.wrapping_add(1);
        q.id = *next;
        if q.sport == 0 {
            q.sport = 20_000 + *next % 40_000;
        }
    }
    out
}

/// The filter and raw parts of a file, both always present (so restoring them replaces the
/// previous file's).
fn enforced_tables(text: &str) -> String {
    let t = tables(text);
    let mut out = String::new();
    for (name, empty) in [
        (
            "raw",
            "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
        ),
        (
            "filter",
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
        ),
    ] {
        match t.get(name) {
            Some(lines) => {
                out.push_str(&lines.join("\n"));
                out.push('\n');
            }
            None => out.push_str(empty),
        }
    }
    out
}

type Counts = BTreeMap<(String, String, u32), u64>;

/// Packet counters of every rule of filter and raw outside OUTPUT, from `*tables-save -c`.
fn kernel_counts(ns: &str, v6: bool) -> Counts {
    let save = if v6 {
        "ip6tables-legacy-save"
    } else {
        "iptables-legacy-save"
    };
    let mut out = Counts::new();
    for table in ["filter", "raw"] {
        let text = nsx(ns, &[save, "-c", "-t", table]).expect("save");
        let mut idx: BTreeMap<String, u32> = BTreeMap::new();
        for l in text.lines().filter(|l| l.starts_with('[')) {
            let Some((cnt, rest)) = l.split_once("] ") else {
                continue;
            };
            let chain = rest.split_whitespace().nth(1).unwrap_or("").to_owned();
            let n = idx.entry(chain.clone()).or_default();
            *n += 1;
            let packets = cnt[1..]
                .split(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            if chain != "OUTPUT" {
                out.insert((table.to_owned(), chain, *n), packets);
            }
        }
    }
    out
}

async fn vallumd_counts(
    c: &mut pb::counter_service_client::CounterServiceClient<tonic::transport::Channel>,
    v6: bool,
) -> Counts {
    let fam = if v6 {
        pb::Family::Ipv6
    } else {
        pb::Family::Ipv4
    } as i32;
    c.get_counters(pb::GetCountersRequest {
        ruleset: "corpus".into(),
        ..Default::default()
    })
    .await
    .expect("counters")
    .into_inner()
    .counters
    .into_iter()
    .filter(|c| c.family == fam && c.rule > 0 && c.chain != "OUTPUT")
    .filter(|c| c.table == "filter" || c.table == "raw")
    .map(|c| ((c.table, c.chain, c.rule), c.packets))
    .collect()
}

/// Rules of the rpfilter files the kernel must (`true`) or must not count: the valid source
/// (routed back out of eth0) passes, the spoofed one (routed out of docker0) and the local
/// ones are dropped in raw PREROUTING.
const RPFILTER_EXPECT: &[(&str, &str, &str, u32, bool)] = &[
    ("rpfilter-antispoof.rules", "raw", "PREROUTING", 1, true),
    ("rpfilter-antispoof.rules", "filter", "INPUT", 2, true),
    ("rpfilter-antispoof.rules", "filter", "INPUT", 3, false),
    ("rpfilter6-antispoof.rules6", "raw", "PREROUTING", 1, true),
    ("rpfilter6-antispoof.rules6", "filter", "INPUT", 2, true),
    ("rpfilter6-antispoof.rules6", "filter", "INPUT", 3, false),
    // --loose passes a source routed out of another device; --validmark looks the mark up
    // (fwmark 0x100000 routes 172.16.0.0/12 back out of eth0); a local source passes only
    // with --accept-local, and strictly only on the device of its local route (lo).
    ("rpfilter-modes.rules", "raw", "PREROUTING", 1, true),
    ("rpfilter-modes.rules", "raw", "PREROUTING", 3, true),
    ("rpfilter-modes.rules", "raw", "PREROUTING", 4, false),
    ("rpfilter-modes.rules", "raw", "PREROUTING", 5, false),
    ("rpfilter-modes.rules", "raw", "PREROUTING", 6, false),
    ("pkttype-broadcast.rules", "filter", "INPUT", 1, true),
];

#[test]
#[ignore = "needs root, iptables-legacy, iproute2 and nfnetlink_queue"]
fn corpus_packets_through_nfqueue() {
    if let Some(why) = kernel_unavailable() {
        panic!("corpus_packets_through_nfqueue: {why}");
    }
    if !Path::new("/proc/net/netfilter/nfnetlink_queue").exists() || !on_path("ip") {
        panic!("corpus_packets_through_nfqueue: no nfnetlink_queue or no `ip`");
    }
    let lab = Lab::new().unwrap_or_else(|why| panic!("namespaces: {why}"));
    let ctl = support::vallumctl().to_string_lossy().into_owned();
    if let Err(why) = nsx(
        &lab.v,
        // Every frame of the comparison is steered: the default also exempts SSH (22), which
        // the rulesets' frames use; 50051 and 9464 (vallumd's default ports) none do.
        &[
            &ctl,
            "dataplane",
            "install",
            "--queues",
            "2",
            "--exempt-tcp-ports",
            "50051,9464",
        ],
    ) {
        panic!("steering cannot be installed: {why}");
    }
    let to_k = Sender::open(&lab.s, "sk");
    let to_v = Sender::open(&lab.s, "sv");
    let entries: Vec<Entry> = manifest()
        .into_iter()
        .filter(|e| e.refused.is_none())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let k = lab.k.clone();
    let (files, packets, compared, mismatches) = in_netns(&lab.v, move || {
        let d = Daemon::start(&db, &["--source", "nfqueue"]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            d.wait_serving().await;
            let mut rs = d.rulesets().await;
            let mut counters =
                pb::counter_service_client::CounterServiceClient::new(d.channel().await);
            let (mut packets, mut compared, mut hit) = (0usize, 0usize, 0usize);
            let mut mismatches = Vec::new();
            let mut next = 0u16;
            for e in &entries {
                let restore = if e.v6 {
                    "ip6tables-legacy-restore"
                } else {
                    "iptables-legacy-restore"
                };
                nsx_in(&k, &[restore], &enforced_tables(&e.text)).expect("kernel restore");
                rs.apply(pb::ApplyRequest {
                    ruleset: "corpus".into(),
                    source: Some(text_source(&e.text, e.v6, &e.file)),
                    ..Default::default()
                })
                .await
                .expect("apply");
                counters
                    .zero_counters(pb::ZeroCountersRequest {
                        ruleset: "corpus".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("zero");
                let t = tables(&e.text);
                let frames: Vec<Pkt> = ["raw", "filter"]
                    .iter()
                    .filter_map(|n| t.get(*n))
                    .flatten()
                    .filter(|l| l.starts_with("-A ") && !l.starts_with("-A OUTPUT "))
                    .flat_map(|l| frames_for(l, e.v6, &mut next))
                    .collect();
                for p in &frames {
                    let f = frame(p);
                    to_k.send(&f);
                    to_v.send(&f);
                }
                packets += frames.len();
                // Until both sides' counters stop moving (three readings 60 ms apart) and
                // agree on every rule the kernel counts, or 20 s passed (then the mismatches
                // below are reported): a pause alone is not enough where a worker starved of
                // CPU on a loaded machine catches up later.
                let (mut kc, mut vc) = (Counts::new(), Counts::new());
                let mut steady = 0;
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while std::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
                    let (k2, v2) = (
                        kernel_counts(&k, e.v6),
                        vallumd_counts(&mut counters, e.v6).await,
                    );
                    steady = if k2 == kc && v2 == vc { steady + 1 } else { 0 };
                    (kc, vc) = (k2, v2);
                    let agree = kc
                        .iter()
                        .all(|(key, n)| vc.get(key).copied().unwrap_or(0) == *n);
                    if steady >= 3 && agree {
                        break;
                    }
                }
                // The anti-spoofing files must show the kernel dropping the spoofed sources
                // and passing the valid ones, or their comparison proves nothing.
                for (file, table, chain, rule, hit) in RPFILTER_EXPECT {
                    if e.file == *file {
                        let n = kc.get(&(table.to_string(), chain.to_string(), *rule));
                        if n.is_none_or(|n| (*n > 0) != *hit) {
                            mismatches.push(format!(
                                "{file}: the kernel counts {n:?} packets at {table}/{chain}#{rule};                                  expected {}",
                                if *hit { "some" } else { "none" }
                            ));
                        }
                    }
                }
                for (key, kn) in &kc {
                    compared += 1;
                    hit += usize::from(*kn > 0);
                    let vn = vc.get(key).copied().unwrap_or(0);
                    if *kn != vn {
                        mismatches.push(format!(
                            "{}: {}/{}#{}: kernel {kn} packets, vallumd {vn}",
                            e.file, key.0, key.1, key.2
                        ));
                    }
                }
            }
            (entries.len(), packets, (compared, hit), mismatches)
        })
    });
    let (compared, hit) = compared;
    println!(
        "corpus through NFQUEUE: {files} files, {packets} frames sent to each side, \
         {compared} rule counters compared ({hit} rules hit by some frame), {} mismatches",
        mismatches.len()
    );
    drop(lab);
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
