//! Real packets at the NFQUEUE transport's limit (root only; otherwise it fails with the
//! reason; a column or size it cannot run prints `NOT MEASURED` and why).
//!
//! Two private network namespaces, a sender and a firewall, joined by a veth pair. The sender
//! writes a fixed ring of prebuilt Ethernet frames (IPv4/UDP, 1,024 flows) to its end of the
//! veth with `sendmmsg(2)` on an `AF_PACKET` socket (`PACKET_QDISC_BYPASS`), as fast as it can
//! (the kernel's pktgen would be cheaper, but this kernel has no `CONFIG_NET_PKTGEN`). In the
//! firewall every address is local (AnyIP: `local 0.0.0.0/0 dev lo`), so each frame reaches
//! INPUT. The flows are the 1,024 of 6,000 random UDP flows whose first matching rule lies
//! furthest down every set (a linear scan; the bench prints the least share of rules walked:
//! at 1k rules they match none, past 10k ClassBench's broad `0.0.0.0/0 -> X/6` rules at the
//! end catch everything), so every packet walks (nearly) every rule; rules and policy
//! ACCEPT. (Each set's last rule, ClassBench's default "any to any", is left out: it is the
//! policy.) Kernel columns count what reached filter INPUT with a counter that runs before
//! it (mangle INPUT / an nft chain at priority -150).
//!
//! Columns, each measured for every packet size and (NFQUEUE columns) queue count:
//! - `accept-all`: `INPUT -j NFQUEUE --queue-num 0` (`--queue-balance 0:N-1` for N queues,
//!   `--queue-bypass`), one thread per queue running `nfqueue::run_accept_all`: vallumd's own
//!   receive and verdict code with classification replaced by ACCEPT (the ceiling of our
//!   transport);
//! - `accept-all-256`: the same copying 256 bytes of each packet (the copy range vallumd sets
//!   for rules that read headers only);
//! - `vallumd R`: the same steering; vallumd's NFQUEUE worker (`nfqueue::run_worker`, one
//!   engine core per queue) with ClassBench acl1 R rules (1k, 10k: neurocuts; 100k:
//!   ../shared/data/classbench/generated) in filter INPUT, policy ACCEPT; it copies what the
//!   rules read (256 bytes);
//! - `vallumd-full R`: the same copying whole packets (`Queue::set_min_copy_range(65535)`,
//!   what vallumd did before it followed the rules' range);
//! - `libnfq`: libnetfilter_queue's own consumer (a C accept-all reader built here with `cc`,
//!   in the style of its `nfqnl_test.c`: `recv`, `nfq_handle_packet`, one `nfq_set_verdict`
//!   per packet), one process per queue; skipped when `cc` or the headers are missing
//!   (Debian: `libnetfilter-queue-dev`);
//! - `ipt-legacy R`: the same rules in the kernel, `iptables-legacy-restore` into INPUT;
//! - `nft R`: the same rules as nft rules of one `inet`-free `ip` table's input chain;
//! - `nft-set R`: the same rules as one lookup in a concatenated interval set
//!   (`ip saddr . ip daddr . meta l4proto . th sport . th dport`): every acl1 rule is
//!   prefixes, a protocol (or any: 0-255) and two port ranges, so the set holds them all;
//!   skipped (with the kernel's answer) when the kernel refuses the set.
//!
//! Reported per cell: frames sent/s, packets that reached the steering rule or the policy
//! (`steered`), packets decided/s (what the consumer answered: `run_accept_all`'s count, the
//! engine's per-core packet counts, the C reader's count; the policy counter for the kernel
//! columns), the queue's `queue_dropped + user_dropped` from
//! /proc/net/netfilter/nfnetlink_queue, and decided as a ratio of accept-all's for the same
//! size and queues. Rates are over the sending time; a consumer's count includes the few
//! packets (at most the queue's 1,024) it answered after the sender stopped.
//!
//! Environment (defaults in brackets): `NFQBENCH_RULES` [1k,10k,100k], `NFQBENCH_SIZES`
//! (Ethernet frame bytes, without FCS) [64,512,1400], `NFQBENCH_QUEUES` [1,2],
//! `NFQBENCH_SECS` per cell [2], `NFQBENCH_COLUMNS` [accept-all,accept-all-256,libnfq,
//! vallumd,vallumd-full,ipt-legacy,nft,nft-set]. Run:
//! `cargo bench -p vallum-server --bench nfqueue`

#![allow(missing_docs)]

#[path = "../../engine/benches/support/classbench.rs"]
mod classbench;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vallum_engine::compile::copy_range::{HEADER_BYTES, MAX_COPY_RANGE};
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::{Policy, Ruleset, Target};
use vallum_engine::restore::{PrintOptions, print};
use vallum_engine::sets::NoSets;
use vallum_server::host::sources::nfqueue;
use vallum_server::telemetry::events::Events;

// vallumd's allocator, as in vallumd.
#[global_allocator]
static ALLOCATOR: vallum_server::host::allocator::MiMalloc =
    vallum_server::host::allocator::MiMalloc;

const FW: &str = "vnfqb-fw";
const SND: &str = "vnfqb-snd";
const FW_DEV: &str = "vnqb-fw";
const SND_DEV: &str = "vnqb-snd";
const FW_MAC: [u8; 6] = [0x02, 0x76, 0x6e, 0x71, 0x00, 0x01];
const SND_MAC: [u8; 6] = [0x02, 0x76, 0x6e, 0x71, 0x00, 0x02];
/// Flows in the frame ring.
const FLOWS: usize = 1024;
/// Frames per `sendmmsg`.
const SEND_BATCH: usize = 64;

// === set-up ===

fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn fw(args: &[&str]) -> Result<String, String> {
    let mut full = vec!["ip", "netns", "exec", FW];
    full.extend_from_slice(args);
    sh(&full)
}

fn fw_in(args: &[&str], input: &str) -> Result<String, String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", FW])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // A broken pipe shows as the command's failure below.
    let _ = child
        .stdin
        .take()
        .ok_or("stdin")?
        .write_all(input.as_bytes());
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces, AF_PACKET and NFQUEUE need it)".into());
    }
    for tool in ["ip", "iptables-legacy", "iptables-legacy-restore"] {
        if !on_path(tool) {
            return Some(format!("`{tool}` is not on PATH"));
        }
    }
    let _ = Command::new("modprobe").arg("nfnetlink_queue").output();
    if !Path::new("/proc/net/netfilter/nfnetlink_queue").exists() {
        return Some("the nfnetlink_queue kernel module is not available".into());
    }
    if classbench::data_dir().is_none() {
        return Some("../shared/data/classbench not found".into());
    }
    None
}

/// The two namespaces and the veth pair; deleted on drop.
struct Netns;

impl Netns {
    fn new() -> Result<Netns, String> {
        for ns in [FW, SND] {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
        sh(&["ip", "netns", "add", FW])?;
        let ns = Netns;
        sh(&["ip", "netns", "add", SND])?;
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        sh(&[
            "ip",
            "-n",
            SND,
            "link",
            "add",
            SND_DEV,
            "address",
            &mac(SND_MAC),
            "type",
            "veth",
            "peer",
            "name",
            FW_DEV,
            "address",
            &mac(FW_MAC),
            "netns",
            FW,
        ])?;
        for (n, dev) in [(FW, FW_DEV), (SND, SND_DEV)] {
            sh(&["ip", "-n", n, "link", "set", "lo", "up"])?;
            sh(&["ip", "-n", n, "link", "set", dev, "up"])?;
        }
        fw(&["ip", "addr", "add", "10.233.0.1/24", "dev", FW_DEV])?;
        for k in [
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            &format!("net.ipv4.conf.{FW_DEV}.rp_filter=0"),
            &format!("net.ipv4.conf.{FW_DEV}.accept_local=1"),
            // The UDP datagrams go to closed ports: keep the port unreachables rare.
            "net.ipv4.icmp_ratelimit=1000",
            "net.ipv4.icmp_msgs_per_sec=10",
        ] {
            fw(&["sysctl", "-qw", k])?;
        }
        // AnyIP: every destination is local, so every frame reaches INPUT.
        fw(&[
            "ip",
            "route",
            "add",
            "local",
            "0.0.0.0/0",
            "dev",
            "lo",
            "table",
            "local",
        ])?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in [FW, SND] {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}

/// Moves the calling thread into network namespace `name`.
fn enter(name: &str) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{name}"))?;
    // SAFETY: `f` is an open namespace file; setns only changes this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

// === traffic ===

/// One flow: IPv4 source, destination, UDP ports.
#[derive(Clone, Copy, Debug)]
struct Flow {
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
}

fn matches(f: &classbench::Filter, h: &Flow) -> bool {
    let pre = |(a, l): (u32, u8), x: u32| l == 0 || (a ^ x) >> (32 - u32::from(l)) == 0;
    f.proto.is_none_or(|p| p == 17)
        && pre(f.src, h.src)
        && pre(f.dst, h.dst)
        && (f.sport.0..=f.sport.1).contains(&h.sport)
        && (f.dport.0..=f.dport.1).contains(&h.dport)
}

/// Candidate flows drawn to find the `FLOWS` that walk the most rules.
const CANDIDATES: usize = 6000;

/// The `FLOWS` UDP flows, of `CANDIDATES` drawn (splitmix64, fixed seed), whose first
/// matching rule lies furthest down every set of `sets` (none: the whole set), and the least
/// fraction of any set's rules one of them walks. ClassBench puts its broad rules last (in
/// acl1 100k, `0.0.0.0/0 -> X/6` rules cover every address), so past 10k rules every flow
/// matches one near the end.
fn flows(sets: &[&[classbench::Filter]]) -> (Vec<Flow>, f64) {
    let mut state = 0x5eed_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut scored: Vec<(f64, Flow)> = Vec::with_capacity(CANDIDATES);
    while scored.len() < CANDIDATES {
        let r = next();
        let h = Flow {
            // Unicast, not 0/8, 127/8 or multicast.
            src: ((r as u32) % 0xdf00_0000).max(0x0100_0000) | 0x0100_0000,
            dst: (((r >> 32) as u32) % 0xdf00_0000).max(0x0100_0000) | 0x0100_0000,
            sport: (next() as u16).max(1),
            dport: (next() as u16).max(1),
        };
        if (h.src >> 24) == 127 || (h.dst >> 24) == 127 {
            continue;
        }
        let walked = sets
            .iter()
            .map(|s| {
                s.iter()
                    .position(|f| matches(f, &h))
                    .map_or(1.0, |i| i as f64 / s.len() as f64)
            })
            .fold(1.0, f64::min);
        scored.push((walked, h));
    }
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.truncate(FLOWS);
    let least = scored.last().map_or(1.0, |s| s.0);
    (scored.into_iter().map(|s| s.1).collect(), least)
}

fn csum(b: &[u8]) -> u16 {
    let mut s: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An Ethernet/IPv4/UDP frame of `size` bytes (at least 42) for `f`.
fn frame(f: &Flow, size: usize, id: u16) -> Vec<u8> {
    let mut b = vec![0u8; size];
    b[0..6].copy_from_slice(&FW_MAC);
    b[6..12].copy_from_slice(&SND_MAC);
    b[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (size - 14) as u16;
    let ip = &mut b[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&f.src.to_be_bytes());
    ip[16..20].copy_from_slice(&f.dst.to_be_bytes());
    let c = csum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp = &mut b[34..42];
    udp[0..2].copy_from_slice(&f.sport.to_be_bytes());
    udp[2..4].copy_from_slice(&f.dport.to_be_bytes());
    udp[4..6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    // UDP checksum 0: none (IPv4).
    b
}

/// Sends the ring of `frames` from the sender namespace until `stop`; adds to `sent`.
fn sender(frames: Arc<Vec<Vec<u8>>>, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    enter(SND).expect("enter the sender namespace");
    // SAFETY: plain socket(2); checked below.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from((libc::ETH_P_ALL as u16).to_be()),
        )
    };
    assert!(
        raw >= 0,
        "AF_PACKET socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let name = std::ffi::CString::new(SND_DEV).expect("name");
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(ifindex != 0, "no {SND_DEV}");
    let one: libc::c_int = 1;
    // SAFETY: a live c_int of the size passed. Failure only costs the qdisc layer.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    // SAFETY: sockaddr_ll is plain data; zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    addr.sll_ifindex = ifindex as i32;
    // SAFETY: `addr` is a live sockaddr_ll of the length passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    assert!(
        r == 0,
        "bind AF_PACKET: {}",
        std::io::Error::last_os_error()
    );
    let mut iov: Vec<libc::iovec> = frames
        .iter()
        .map(|f| libc::iovec {
            iov_base: f.as_ptr() as *mut libc::c_void,
            iov_len: f.len(),
        })
        .collect();
    // SAFETY: mmsghdr is plain data; zero is valid.
    let mut hdrs: Vec<libc::mmsghdr> = (0..iov.len())
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (h, v) in hdrs.iter_mut().zip(iov.iter_mut()) {
        h.msg_hdr.msg_iov = v;
        h.msg_hdr.msg_iovlen = 1;
    }
    let mut at = 0;
    while !stop.load(Ordering::Relaxed) {
        let n = SEND_BATCH.min(hdrs.len() - at);
        // SAFETY: `hdrs[at..at + n]` point at live iovecs over `frames`, all kept alive by
        // this function for the call; the socket is bound.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs[at..].as_mut_ptr(),
                n as libc::c_uint,
                0,
            )
        };
        if r > 0 {
            sent.fetch_add(r as u64, Ordering::Relaxed);
            at = (at + r as usize) % hdrs.len();
        }
    }
}

// === consumers ===

/// A column that answers packets in userspace: started before the sender, stopped after.
enum Consumer {
    Ours {
        stop: Arc<AtomicBool>,
        threads: Vec<std::thread::JoinHandle<()>>,
        decided: Arc<AtomicU64>,
        engine: Option<Arc<Engine>>,
    },
    Libnfq(Vec<(Child, BufReader<std::process::ChildStdout>)>),
}

impl Consumer {
    /// `run_accept_all` on `queues` queues copying `copy` bytes of each packet.
    fn accept_all(queues: u16, copy: u32) -> Consumer {
        let stop = Arc::new(AtomicBool::new(false));
        let decided = Arc::new(AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads = (0..queues)
            .map(|q| {
                let (stop, decided, tx) = (stop.clone(), decided.clone(), tx.clone());
                std::thread::spawn(move || {
                    enter(FW).expect("enter the firewall namespace");
                    let mut queue = nfqueue::Queue::open(q, true).expect("bind queue");
                    queue.set_copy_range(copy).expect("copy range");
                    tx.send(()).expect("ready");
                    nfqueue::run_accept_all(&mut queue, &stop, &decided);
                })
            })
            .collect();
        for _ in 0..queues {
            rx.recv().expect("a consumer did not start");
        }
        Consumer::Ours {
            stop,
            threads,
            decided,
            engine: None,
        }
    }

    /// vallumd's worker on `queues` queues with `rules`, copying at least `min_copy` bytes.
    fn vallumd(queues: u16, rules: &Ruleset, min_copy: u32) -> Consumer {
        let clock: Arc<dyn vallum_engine::Clock> = Arc::new(vallum_server::clock::Clock::system());
        let engine = Arc::new(Engine::new(
            EngineConfig {
                cores: usize::from(queues),
                // vallumd's default (--barrier seqcst).
                barrier: vallum_engine::dataplane::BarrierStrategy::SeqCst,
                conntrack: Some(Default::default()),
            },
            clock.clone(),
        ));
        engine
            .commit(Change::Put(rules.clone()), &NoSets)
            .expect("commit the rules");
        let events = Events::start(vallum_server::clock::Clock::system()).expect("events");
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads = (0..queues)
            .map(|q| {
                let (stop, tx, engine, clock, events) = (
                    stop.clone(),
                    tx.clone(),
                    engine.clone(),
                    clock.clone(),
                    events.clone(),
                );
                std::thread::spawn(move || {
                    enter(FW).expect("enter the firewall namespace");
                    let mut queue = nfqueue::Queue::open(q, true).expect("bind queue");
                    queue.set_min_copy_range(min_copy);
                    let mut worker = engine.worker(usize::from(q)).expect("claim a core");
                    tx.send(()).expect("ready");
                    nfqueue::run_worker(&mut queue, &mut worker, &stop, &*clock, &events);
                })
            })
            .collect();
        for _ in 0..queues {
            rx.recv().expect("a worker did not start");
        }
        Consumer::Ours {
            stop,
            threads,
            decided: Arc::new(AtomicU64::new(0)),
            engine: Some(engine),
        }
    }

    fn libnfq(bin: &Path, queues: u16) -> Result<Consumer, String> {
        let mut procs = Vec::new();
        for q in 0..queues {
            let mut child = Command::new("ip")
                .args(["netns", "exec", FW])
                .arg(bin)
                .arg(q.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())?;
            let mut out = BufReader::new(child.stdout.take().ok_or("stdout")?);
            let mut line = String::new();
            out.read_line(&mut line).map_err(|e| e.to_string())?;
            if !line.starts_with("ready") {
                return Err(format!("libnfq reader for queue {q}: {line:?}"));
            }
            procs.push((child, out));
        }
        Ok(Consumer::Libnfq(procs))
    }

    /// Stops the consumer; what it decided.
    fn finish(self) -> u64 {
        match self {
            Consumer::Ours {
                stop,
                threads,
                decided,
                engine,
            } => {
                stop.store(true, Ordering::Relaxed);
                for t in threads {
                    t.join().expect("consumer thread panicked");
                }
                match engine {
                    Some(e) => e.core_packets().iter().sum(),
                    None => decided.load(Ordering::Relaxed),
                }
            }
            Consumer::Libnfq(procs) => {
                let mut total = 0;
                for (mut child, mut out) in procs {
                    // SAFETY: kill(2) on a child we started and have not reaped.
                    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                    let mut line = String::new();
                    let _ = out.read_line(&mut line);
                    let _ = child.wait();
                    total += line
                        .split_whitespace()
                        .nth(1)
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                total
            }
        }
    }
}

const LIBNFQ_READER: &str = r#"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

static volatile sig_atomic_t stop;
static unsigned long decided;

static void on_term(int sig) { (void)sig; stop = 1; }

static int cb(struct nfq_q_handle *qh, struct nfgenmsg *m, struct nfq_data *d, void *data) {
    (void)m; (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(d);
    if (!ph) return 0;
    decided++;
    return nfq_set_verdict(qh, ntohl(ph->packet_id), NF_ACCEPT, 0, NULL);
}

int main(int argc, char **argv) {
    static char buf[65536 + 8192] __attribute__((aligned));
    int q = argc > 1 ? atoi(argv[1]) : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    struct nfq_handle *h = nfq_open();
    if (!h) { printf("error nfq_open\n"); return 1; }
    struct nfq_q_handle *qh = nfq_create_queue(h, q, cb, NULL);
    if (!qh) { printf("error nfq_create_queue %s\n", strerror(errno)); return 1; }
    if (nfq_set_mode(qh, NFQNL_COPY_PACKET, 0xffff) < 0) { printf("error mode\n"); return 1; }
    nfq_set_queue_flags(qh, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
    nfnl_rcvbufsiz(nfq_nfnlh(h), 8 << 20);
    int fd = nfq_fd(h);
    int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    struct timeval tv = {0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    printf("ready %d\n", q);
    fflush(stdout);
    while (!stop) {
        int r = recv(fd, buf, sizeof buf, 0);
        if (r >= 0) nfq_handle_packet(h, buf, r);
    }
    printf("decided %lu\n", decided);
    fflush(stdout);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
"#;

/// Builds the libnetfilter_queue reader into `dir`; why not, when it cannot.
fn build_libnfq(dir: &Path) -> Result<PathBuf, String> {
    if !on_path("cc") {
        return Err("no `cc`".into());
    }
    let src = dir.join("nfq_accept.c");
    let bin = dir.join("nfq_accept");
    std::fs::write(&src, LIBNFQ_READER).map_err(|e| e.to_string())?;
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(["-lnetfilter_queue", "-lnfnetlink"])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "cc failed (libnetfilter-queue-dev installed?): {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        ));
    }
    Ok(bin)
}

// === kernel rules ===

/// The rules as nft rules in table `ip vnfqb`, input chain, policy accept; a counter rule last.
fn nft_rules(filters: &[classbench::Filter]) -> String {
    let mut s = String::from(
        "table ip vnfqb {\n chain input {\n  type filter hook input priority 0; policy accept;\n",
    );
    for f in filters {
        s.push_str("  ");
        let pre = |(a, l): (u32, u8)| format!("{}/{l}", std::net::Ipv4Addr::from(a));
        if f.src.1 > 0 {
            s.push_str(&format!("ip saddr {} ", pre(f.src)));
        }
        if f.dst.1 > 0 {
            s.push_str(&format!("ip daddr {} ", pre(f.dst)));
        }
        let ports = |(lo, hi): (u16, u16)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        };
        let (sp, dp) = (f.sport != (0, 65535), f.dport != (0, 65535));
        match f.proto {
            Some(p @ (6 | 17)) => {
                let name = if p == 6 { "tcp" } else { "udp" };
                if !sp && !dp {
                    s.push_str(&format!("meta l4proto {name} "));
                }
                if sp {
                    s.push_str(&format!("{name} sport {} ", ports(f.sport)));
                }
                if dp {
                    s.push_str(&format!("{name} dport {} ", ports(f.dport)));
                }
            }
            Some(p) => s.push_str(&format!("meta l4proto {p} ")),
            None => {}
        }
        s.push_str("accept\n");
    }
    s.push_str(NFT_PRE);
    s
}

/// The rules as one concatenated interval set lookup; a counter rule after it.
fn nft_set(filters: &[classbench::Filter]) -> String {
    let mut s = String::from(
        "table ip vnfqb {\n set acl {\n  type ipv4_addr . ipv4_addr . inet_proto . inet_service . \
         inet_service\n  flags interval\n  elements = {\n",
    );
    let pre = |(a, l): (u32, u8)| format!("{}/{l}", std::net::Ipv4Addr::from(a));
    let range = |(lo, hi): (u16, u16)| format!("{lo}-{hi}");
    // Rules that differ only in the TCP flags column (not translated) are one element; the
    // kernel refuses the same element twice (EEXIST).
    let mut seen = std::collections::HashSet::new();
    let filters: Vec<_> = filters
        .iter()
        .filter(|f| seen.insert((f.src, f.dst, f.proto, f.sport, f.dport)))
        .collect();
    for (i, f) in filters.iter().enumerate() {
        let proto = f.proto.map_or("0-255".to_string(), |p| p.to_string());
        s.push_str(&format!(
            "   {} . {} . {proto} . {} . {}{}\n",
            pre(f.src),
            pre(f.dst),
            range(f.sport),
            range(f.dport),
            if i + 1 < filters.len() { "," } else { "" }
        ));
    }
    s.push_str(
        "  }\n }\n chain input {\n  type filter hook input priority 0; policy accept;\n  \
         ip saddr . ip daddr . meta l4proto . th sport . th dport @acl accept\n",
    );
    s.push_str(NFT_PRE);
    s
}

/// The end of the nft table: the input chain closed, and chain `pre` counting what reaches
/// the input hook before the filter chain (priority -150).
const NFT_PRE: &str =
    " }\n chain pre {\n  type filter hook input priority -150; policy accept;\n  counter\n }\n}\n";

/// The packet count of chain `pre`'s counter (what reached the input chain).
fn nft_counter() -> u64 {
    let out = fw(&["nft", "list", "chain", "ip", "vnfqb", "pre"]).unwrap_or_default();
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("counter packets "))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .next_back()
        .unwrap_or(0)
}

/// INPUT's policy packet count and its first rule's packet count, iptables-legacy.
fn ipt_counts() -> (u64, u64) {
    let out = fw(&["iptables-legacy", "-L", "INPUT", "-n", "-v", "-x"]).unwrap_or_default();
    let mut lines = out.lines();
    let policy = lines
        .next()
        .and_then(|l| l.split("policy ACCEPT ").nth(1))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let first = lines
        .nth(1)
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (policy, first)
}

/// The mangle INPUT counter rule's packets (what reached filter INPUT).
fn ipt_reached() -> u64 {
    let out = fw(&[
        "iptables-legacy",
        "-t",
        "mangle",
        "-L",
        "INPUT",
        "-n",
        "-v",
        "-x",
    ])
    .unwrap_or_default();
    out.lines()
        .nth(2)
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Counts packets at INPUT before filter: mangle INPUT for iptables-legacy.
const MANGLE_COUNTER: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n\
    :FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A INPUT\nCOMMIT\n";

fn ipt_restore(text: &str) -> Result<(), String> {
    fw_in(&["iptables-legacy-restore"], text).map(drop)
}

fn nft_flush() {
    let _ = fw(&["nft", "delete", "table", "ip", "vnfqb"]);
}

/// `queue_dropped + user_dropped` summed over the queues of /proc/net/netfilter/nfnetlink_queue.
fn queue_drops() -> u64 {
    let out = fw(&["cat", "/proc/net/netfilter/nfnetlink_queue"]).unwrap_or_default();
    out.lines()
        .map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            f.get(5).copied().unwrap_or(0) + f.get(6).copied().unwrap_or(0)
        })
        .sum()
}

// === the run ===

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

struct Cell {
    column: String,
    size: usize,
    queues: u16,
    secs: f64,
    sent: u64,
    steered: u64,
    decided: u64,
    drops: u64,
}

/// Sends the ring for `secs` from a new thread; returns (frames sent, seconds it sent).
fn send_for(frames: &Arc<Vec<Vec<u8>>>, secs: f64) -> (u64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let t = {
        let (frames, stop, sent) = (frames.clone(), stop.clone(), sent.clone());
        std::thread::spawn(move || sender(frames, stop, sent))
    };
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    t.join().expect("sender panicked");
    (sent.load(Ordering::Relaxed), start.elapsed().as_secs_f64())
}

fn steering(queues: u16) -> String {
    let target = if queues == 1 {
        "--queue-num 0".to_string()
    } else {
        format!("--queue-balance 0:{}", queues - 1)
    };
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         -A INPUT -j NFQUEUE {target} --queue-bypass\nCOMMIT\n"
    )
}

fn main() {
    if let Some(why) = skip_reason() {
        // Nothing can be measured here: fail, so a run never reads as a result.
        panic!("nfqueue bench not run: {why}");
    }
    let rules = env_list("NFQBENCH_RULES", "1k,10k,100k");
    let sizes: Vec<usize> = env_list("NFQBENCH_SIZES", "64,512,1400")
        .iter()
        .map(|s| s.parse().expect("NFQBENCH_SIZES: frame bytes"))
        .collect();
    let queue_counts: Vec<u16> = env_list("NFQBENCH_QUEUES", "1,2")
        .iter()
        .map(|s| s.parse().expect("NFQBENCH_QUEUES: numbers"))
        .collect();
    let secs: f64 = std::env::var("NFQBENCH_SECS")
        .ok()
        .map(|s| s.parse().expect("NFQBENCH_SECS: seconds"))
        .unwrap_or(2.0);
    let columns = env_list(
        "NFQBENCH_COLUMNS",
        "accept-all,accept-all-256,libnfq,vallumd,vallumd-full,ipt-legacy,nft,nft-set",
    );
    let want = |c: &str| columns.iter().any(|x| x == c);
    assert!(
        sizes.iter().all(|&s| (60..=1514).contains(&s)),
        "sizes 60..=1514"
    );

    let dir = classbench::data_dir().expect("checked");
    let mut sets: BTreeMap<String, Vec<classbench::Filter>> = BTreeMap::new();
    for r in &rules {
        let text = match r.as_str() {
            "1k" => std::fs::read_to_string(dir.join("neurocuts/acl1_1k")).ok(),
            "10k" => std::fs::read_to_string(dir.join("neurocuts/acl1_10k")).ok(),
            "100k" => classbench::read_gz(&dir.join("generated/acl1_100k.gz")),
            other => panic!("NFQBENCH_RULES: {other:?} is not 1k, 10k or 100k"),
        };
        let Some(text) = text else {
            println!("NOT MEASURED rules {r}: the acl1 set is not readable");
            continue;
        };
        let mut filters = classbench::parse_filters(&text).expect("parse acl1");
        // ClassBench's last rule is the default, any to any: the policy (ACCEPT) here.
        filters.retain(|f| {
            (f.src.1, f.dst.1, f.proto, f.sport, f.dport) != (0, 0, None, (0, 65535), (0, 65535))
        });
        sets.insert(r.clone(), filters);
    }
    let all: Vec<&[classbench::Filter]> = sets.values().map(Vec::as_slice).collect();
    let (flows, walked) = flows(&all);
    let rulesets: BTreeMap<String, Ruleset> = sets
        .iter()
        .map(|(name, f)| {
            let mut rs =
                classbench::to_ruleset_with("acl", f, |_| Target::Accept).expect("convert");
            for c in &mut rs.tables[0].chains {
                c.policy = Some(Policy::Accept);
            }
            (name.clone(), rs)
        })
        .collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "nfqueue bench: {} UDP flows, each walking at least {:.1}% of every set {:?} before \
         its first match, {secs} s a cell, load {}",
        flows.len(),
        100.0 * walked,
        sets.iter()
            .map(|(k, v)| format!("{k}={}", v.len()))
            .collect::<Vec<_>>(),
        load.trim()
    );

    let _ns = match Netns::new() {
        Ok(ns) => ns,
        Err(e) => {
            panic!("nfqueue bench not run: namespaces: {e}");
        }
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let libnfq = if want("libnfq") {
        match build_libnfq(tmp.path()) {
            Ok(b) => Some(b),
            Err(e) => {
                println!("NOT MEASURED column libnfq: {e}");
                None
            }
        }
    } else {
        None
    };
    let nft = (want("nft") || want("nft-set")) && on_path("nft");
    if !nft && (want("nft") || want("nft-set")) {
        println!("NOT MEASURED columns nft, nft-set: `nft` is not on PATH");
    }

    let mut cells: Vec<Cell> = Vec::new();
    let mut report = |c: Cell| {
        println!(
            "{:<16} {:>5} B {} q: sent {:>9.0}/s steered {:>9.0}/s decided {:>9.0}/s nfq drops {}",
            c.column,
            c.size,
            c.queues,
            c.sent as f64 / c.secs,
            c.steered as f64 / c.secs,
            c.decided as f64 / c.secs,
            c.drops
        );
        cells.push(c);
    };
    for &size in &sizes {
        let frames: Arc<Vec<Vec<u8>>> = Arc::new(
            flows
                .iter()
                .enumerate()
                .map(|(i, f)| frame(f, size, i as u16))
                .collect(),
        );
        // NFQUEUE columns.
        for &queues in &queue_counts {
            let mut nfq_cols: Vec<(String, Option<&Ruleset>)> = Vec::new();
            for c in ["accept-all", "accept-all-256", "libnfq"] {
                if want(c) && (c != "libnfq" || libnfq.is_some()) {
                    nfq_cols.push((c.into(), None));
                }
            }
            for c in ["vallumd", "vallumd-full"] {
                if want(c) {
                    for (name, rs) in &rulesets {
                        nfq_cols.push((format!("{c} {name}"), Some(rs)));
                    }
                }
            }
            for (column, rs) in nfq_cols {
                ipt_restore(&steering(queues)).expect("steering");
                let consumer = match (column.as_str(), rs) {
                    ("accept-all", _) => Consumer::accept_all(queues, MAX_COPY_RANGE),
                    ("accept-all-256", _) => Consumer::accept_all(queues, HEADER_BYTES),
                    ("libnfq", _) => {
                        match Consumer::libnfq(libnfq.as_deref().expect("built"), queues) {
                            Ok(c) => c,
                            Err(e) => {
                                println!("NOT MEASURED libnfq: {e}");
                                continue;
                            }
                        }
                    }
                    (c, Some(rs)) if c.starts_with("vallumd-full") => {
                        Consumer::vallumd(queues, rs, MAX_COPY_RANGE)
                    }
                    (_, Some(rs)) => Consumer::vallumd(queues, rs, 1),
                    _ => unreachable!(),
                };
                let (sent, s) = send_for(&frames, secs);
                // Let the queue empty before reading what it dropped.
                std::thread::sleep(Duration::from_millis(200));
                let drops = queue_drops();
                let decided = consumer.finish();
                let (_, steered) = ipt_counts();
                report(Cell {
                    column,
                    size,
                    queues,
                    secs: s,
                    sent,
                    steered,
                    decided,
                    drops,
                });
            }
        }
        ipt_restore(
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
        )
        .expect("flush");
        // Kernel columns.
        for (name, rs) in &rulesets {
            if want("ipt-legacy") {
                let text = print(&rs.tables, &PrintOptions::default()) + MANGLE_COUNTER;
                ipt_restore(&text).expect("load rules");
                let (sent, s) = send_for(&frames, secs);
                let policy = ipt_reached();
                report(Cell {
                    column: format!("ipt-legacy {name}"),
                    size,
                    queues: 0,
                    secs: s,
                    sent,
                    steered: policy,
                    decided: policy,
                    drops: 0,
                });
                ipt_restore(
                    "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
                )
                .expect("flush");
            }
            for (col, text) in [
                ("nft", want("nft").then(|| nft_rules(&sets[name]))),
                ("nft-set", want("nft-set").then(|| nft_set(&sets[name]))),
            ] {
                let Some(text) = text.filter(|_| nft) else {
                    continue;
                };
                nft_flush();
                if let Err(e) = fw_in(&["nft", "-f", "-"], &text) {
                    println!(
                        "NOT MEASURED {col} {name}: {}",
                        e.lines().next().unwrap_or("")
                    );
                    continue;
                }
                let (sent, s) = send_for(&frames, secs);
                let n = nft_counter();
                report(Cell {
                    column: format!("{col} {name}"),
                    size,
                    queues: 0,
                    secs: s,
                    sent,
                    steered: n,
                    decided: n,
                    drops: 0,
                });
                nft_flush();
            }
        }
    }

    // The table: decided kpps, and for the NFQUEUE columns the ratio to accept-all.
    println!(
        "\n| column | size B | queues | sent kpps | decided kpps | x accept-all | not decided % | nfq drops |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for c in &cells {
        let base = cells
            .iter()
            .find(|b| b.column == "accept-all" && b.size == c.size && b.queues == c.queues.max(1))
            .map(|b| b.decided as f64 / b.secs);
        let rate = c.decided as f64 / c.secs;
        let not = if c.steered > 0 {
            format!(
                "{:.1}",
                100.0 * c.steered.saturating_sub(c.decided) as f64 / c.steered as f64
            )
        } else {
            "-".into()
        };
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {} | {} |",
            c.column,
            c.size,
            if c.queues == 0 {
                "kernel".to_string()
            } else {
                c.queues.to_string()
            },
            c.sent as f64 / c.secs / 1e3,
            rate / 1e3,
            base.map_or("-".into(), |b| format!("{:.2}", rate / b)),
            not,
            c.drops
        );
    }
}
