//! The NFQUEUE packet source (Linux): worker k binds nfnetlink_queue number `first + k`, reads
//! up to [`BATCH`] queued packets per `recvmmsg(2)`, classifies them with one
//! `EngineWorker::process_batch` and answers them all with one `sendto(2)` of verdict messages
//! (`NFQNL_MSG_VERDICT_BATCH` per run of equal verdicts).
//!
//! What the kernel tells us becomes the [`PacketMeta`]: the IP packet (NFQUEUE hands it from
//! the IP header on; [`parse_ip`]), the hook (`NF_INET_*` numbers, [`hook_from_netfilter`]),
//! the input/output interface indexes (names from [`IfNames`]), for a bridged packet the
//! bridge ports (`NFQA_IFINDEX_PHYSINDEV`/`PHYSOUTDEV`, for `-m physdev`), the mark, the link-layer
//! source address (`NFQA_HWADDR`, for `-m mac`; only from an Ethernet input device, as
//! `mac_mt` checks `skb->dev->type == ARPHRD_ETHER`), and the NAT bits of the kernel's own
//! conntrack entry (`NFQA_CT`'s `CTA_STATUS`, asked for with `NFQA_CFG_F_CONNTRACK`;
//! [`ct_nat`]) for `--ctstate SNAT/DNAT`: the kernel does the NAT, so only it knows. Every
//! other state (NEW, ESTABLISHED, RELATED, INVALID, UNTRACKED) is the engine's own tracker's,
//! which also sees our raw-table NOTRACK rules; `NFQA_CT_INFO` is read but not used. Counters count
//! the IP packet length, as xt_counters do.
//!
//! Verdicts ([`answer`]): ACCEPT -> `NF_ACCEPT` (`--nfqueue-mode final`, the default: the
//! kernel's rules after the steering jump are skipped), or with `--nfqueue-mode continue`
//! `NF_REPEAT` with the continue mark bit OR-ed into the packet's mark (the kernel runs the
//! filter table's chain again, the steering chain RETURNs for the marked packet and the
//! kernel's remaining rules decide; [`NfqueueAccept`]); DROP -> `NF_DROP`; REJECT -> `NF_DROP`
//! as well: NFQUEUE has no verdict that makes the kernel send the ICMP error or TCP RST, so a
//! REJECT rule drops silently in this mode (documented in docs/operations.md). A packet whose transport header is
//! cut short is classified and dropped at the first match that reads a missing byte, as the
//! kernel's hotdrop ([`vallum_engine::packet::parse`]); one that does not parse (cut inside
//! its IP or IPv6 extension headers, or an impossible header) is dropped.
//!
//! Why not a crate: `nfq` (pure Rust) allocates a receive buffer per message held, so a batch
//! of 32 allocates 32 buffers of 72 KiB, panics on malformed attributes and has no batch
//! verdict; `neli` and the `netlink-packet-*` family have no nfnetlink_queue messages. The
//! messages are few and small, so they live in [`wire`] with tests from captured bytes.
//!
//! Queue options (set at bind, in the same config message, so no packet is ever delivered with
//! the default metadata-only copy mode): copy the whole packet (copy range 65535), with
//! fail-open `NFQA_CFG_F_FAIL_OPEN` (a full queue accepts instead of dropping), and
//! `NFQA_CFG_F_CONNTRACK` where the kernel has ctnetlink (else bound without it, see
//! [`Queue::open`]).

pub mod wire;

use vallum_engine::model::{Hook, ct_state};

use crate::config::NfqueueAccept;

/// `NF_REPEAT`: the kernel runs the packet's hook function (the filter table's chain) again
/// from its first rule.
pub const NF_REPEAT: u32 = 4;

/// The verdict and mark sent for one packet: `nf` is the engine's verdict as `NF_ACCEPT` /
/// `NF_DROP`, `queued` the mark the packet was queued with, `after` the mark our rules left
/// (`-j MARK`; `None` for a packet that did not parse).
///
/// - `Final`: `(nf, mark)`, the mark only when an accepted packet's mark changed;
/// - `Continue { mark: B }`: an accepted packet gets `(NF_REPEAT, after | B)` (only bit B is
///   added; the rest of the mark is the packet's); a dropped one `(NF_DROP, None)`. A packet
///   that arrives with B already set means the steering rules do not skip B (installed in
///   `final` mode, or another bit): it is answered as in `Final` instead, so that it cannot
///   loop through the queue, with [`Answered::loop_guard`] set.
pub fn answer(accept: NfqueueAccept, nf: u32, queued: u32, after: Option<u32>) -> Answered {
    let changed = after.filter(|&m| m != queued && nf == wire::NF_ACCEPT);
    match accept {
        NfqueueAccept::Continue { mark } if nf == wire::NF_ACCEPT => {
            if queued & mark != 0 {
                return Answered {
                    verdict: nf,
                    mark: changed,
                    loop_guard: true,
                };
            }
            Answered {
                verdict: NF_REPEAT,
                mark: Some(after.unwrap_or(queued) | mark),
                loop_guard: false,
            }
        }
        NfqueueAccept::Final | NfqueueAccept::Continue { .. } => Answered {
            verdict: nf,
            mark: changed,
            loop_guard: false,
        },
    }
}

/// What [`answer`] decided for one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answered {
    /// `NF_ACCEPT`, `NF_DROP` or `NF_REPEAT`.
    pub verdict: u32,
    /// The mark to send with it (`NFQA_MARK`), if any.
    pub mark: Option<u32>,
    /// `continue` mode met a packet already carrying the continue bit and answered it as
    /// `final` (the steering rules do not skip the bit).
    pub loop_guard: bool,
}

/// The [`Hook`] of a netfilter hook number (`NF_INET_PRE_ROUTING` = 0, `LOCAL_IN` = 1,
/// `FORWARD` = 2, `LOCAL_OUT` = 3, `POST_ROUTING` = 4); `None` for any other number.
pub fn hook_from_netfilter(hook: u8) -> Option<Hook> {
    match hook {
        0 => Some(Hook::Prerouting),
        1 => Some(Hook::Input),
        2 => Some(Hook::Forward),
        3 => Some(Hook::Output),
        4 => Some(Hook::Postrouting),
        _ => None,
    }
}

/// Why a queue could not be opened. The message names the queue and, for the common causes,
/// what to do.
#[derive(Debug, thiserror::Error)]
#[error("NFQUEUE {queue}: {step}: {source}{}", hint(.source))]
pub struct QueueError {
    /// The queue number.
    pub queue: u16,
    /// What was being done (`socket`, `bind queue`, ...).
    pub step: &'static str,
    /// The OS error.
    pub source: std::io::Error,
}

fn hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        // The kernel answers EPERM both without CAP_NET_ADMIN and when another socket holds
        // the queue (nfqnl_recv_config).
        Some(libc::EPERM) => {
            " (binding a queue needs CAP_NET_ADMIN in the network namespace: run vallumd as root \
             or with that capability; or another process is bound to this queue)"
        }
        Some(libc::EBUSY) => " (another process is bound to this queue)",
        Some(libc::EPROTONOSUPPORT) | Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) => {
            " (is the nfnetlink_queue kernel module available? CONFIG_NETFILTER_NETLINK_QUEUE)"
        }
        _ => "",
    }
}

/// [`PacketMeta::ct_nat`](vallum_engine::packet::PacketMeta::ct_nat) from the kernel's
/// conntrack status (`CTA_STATUS` of `NFQA_CT`): SNAT for `IPS_SRC_NAT`, DNAT for
/// `IPS_DST_NAT`, as xt_conntrack's state bits; 0 without an entry.
pub fn ct_nat(status: Option<u32>) -> u8 {
    let Some(s) = status else { return 0 };
    let bit = |ips: u32, state: u8| if s & ips != 0 { state } else { 0 };
    bit(wire::IPS_SRC_NAT, ct_state::SNAT) | bit(wire::IPS_DST_NAT, ct_state::DNAT)
}

#[cfg(target_os = "linux")]
pub use linux::{Answer, IfNames, Queue, run_worker};

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use vallum_engine::Clock;
    use vallum_engine::compile::Verdict;
    use vallum_engine::engine::EngineWorker;
    use vallum_engine::packet::parse::parse_ip;
    use vallum_engine::packet::{IfName, PacketMeta};

    use super::wire::{self, Message, PacketMsg};
    use super::{NF_REPEAT, QueueError, answer, ct_nat, hook_from_netfilter};
    use crate::config::NfqueueAccept;
    use crate::events::Events;
    use crate::sources::{BATCH, Drain};

    /// Bytes copied of each packet (the kernel's maximum, `NFQNL_MAX_COPY_RANGE`), so any
    /// header chain is complete.
    const COPY_RANGE: u32 = 0xffff;
    /// One receive slot: the copied packet plus the message's metadata attributes.
    const SLOT: usize = COPY_RANGE as usize + 8192;
    /// Socket receive buffer asked for (`SO_RCVBUFFORCE`, else `SO_RCVBUF` capped by
    /// net.core.rmem_max): room for bursts while a batch is classified.
    const RCVBUF: libc::c_int = 8 << 20;
    /// How long a `recvmmsg` waits for the first packet before the worker checks its stop flag.
    const RECV_TIMEOUT: Duration = Duration::from_millis(100);
    /// How long an interface name is trusted before `if_indextoname` is asked again (names
    /// can change under the same index: `ip link set X name Y`).
    const IFNAME_TTL_NS: u64 = 1_000_000_000;

    /// One answer: packet id, `NF_ACCEPT` / `NF_DROP` / `NF_REPEAT`, and the mark to set with
    /// it (`Some` when the rules changed the packet's mark: `-j MARK`, `-j CONNMARK
    /// --restore-mark`, or in `continue` mode always; see [`answer`]).
    pub type Answer = (u32, u32, Option<u32>);

    /// A bound queue: the netlink socket with its send side, and the receive slots (apart,
    /// so the worker reads a datagram while it sends verdicts).
    pub struct Queue {
        link: Link,
        /// Whether the kernel accepted `NFQA_CFG_F_CONNTRACK` (packets carry `NFQA_CT`).
        kernel_ct: bool,
        /// `BATCH` slots of `SLOT` bytes.
        rx: Vec<u8>,
        /// Bytes received in each slot by the last [`Queue::recv_batch`].
        lens: [usize; BATCH],
    }

    /// The socket and what we send on it.
    struct Link {
        fd: OwnedFd,
        num: u16,
        seq: u32,
        /// Outgoing messages (reused: no allocation once grown).
        tx: Vec<u8>,
        /// What our ACCEPT means (`--nfqueue-mode`).
        accept: NfqueueAccept,
        /// Packets `continue` mode answered as `final` because they arrived with the continue
        /// bit already set ([`super::Answered::loop_guard`]); warned about once.
        loop_guarded: u64,
    }

    impl std::fmt::Debug for Queue {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Queue")
                .field("num", &self.link.num)
                .finish()
        }
    }

    fn err(queue: u16, step: &'static str) -> impl FnOnce(io::Error) -> QueueError {
        move |source| QueueError {
            queue,
            step,
            source,
        }
    }

    fn setsockopt<T>(
        fd: &OwnedFd,
        level: libc::c_int,
        name: libc::c_int,
        value: &T,
    ) -> io::Result<()> {
        // SAFETY: `value` points to a live, initialized object of the size passed; the kernel
        // only reads it during the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                (value as *const T).cast(),
                std::mem::size_of_val(value) as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    impl Queue {
        /// Opens a netlink socket and binds queue `num` in the current network namespace,
        /// copying whole packets; `fail_open` sets `NFQA_CFG_F_FAIL_OPEN`. It asks for the
        /// kernel's conntrack entry with each packet (`NFQA_CFG_F_CONNTRACK`, for
        /// `--ctstate SNAT/DNAT`); where the kernel refuses that (`EOPNOTSUPP`: no
        /// `nf_conntrack_netlink`) it binds without it, and [`Queue::kernel_conntrack`] says
        /// so.
        ///
        /// Errors: [`QueueError`] with the step and errno: `EPERM` without CAP_NET_ADMIN,
        /// `EBUSY` when another socket holds the queue.
        pub fn open(num: u16, fail_open: bool) -> Result<Queue, QueueError> {
            // SAFETY: plain socket(2) call; the result is checked before use.
            let raw = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_NETFILTER,
                )
            };
            if raw < 0 {
                return Err(err(num, "socket")(io::Error::last_os_error()));
            }
            // SAFETY: `raw` is a new, valid descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: sockaddr_nl is plain data; all-zero is a valid value.
            let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            // SAFETY: `addr` is a live sockaddr_nl and the length passed is its size.
            let r = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&addr as *const libc::sockaddr_nl).cast(),
                    std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if r < 0 {
                return Err(err(num, "bind netlink socket")(io::Error::last_os_error()));
            }
            // A full socket buffer drops (or, fail-open, accepts) the packet in the kernel; an
            // ENOBUFS error here would tell us nothing we could act on.
            setsockopt(&fd, libc::SOL_NETLINK, libc::NETLINK_NO_ENOBUFS, &1i32)
                .map_err(err(num, "NETLINK_NO_ENOBUFS"))?;
            if setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF).is_err() {
                setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF)
                    .map_err(err(num, "SO_RCVBUF"))?;
            }
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: RECV_TIMEOUT.as_micros() as libc::suseconds_t,
            };
            setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
                .map_err(err(num, "SO_RCVTIMEO"))?;
            let mut q = Queue {
                link: Link {
                    fd,
                    num,
                    seq: 1,
                    tx: Vec::with_capacity(BATCH * 64),
                    accept: NfqueueAccept::Final,
                    loop_guarded: 0,
                },
                kernel_ct: true,
                rx: vec![0; BATCH * SLOT],
                lens: [0; BATCH],
            };
            // Bind, copy mode and flags in one message: the kernel creates the queue and
            // applies the parameters before it can deliver any packet. It checks the flags
            // before it binds, so a refused NFQA_CFG_F_CONNTRACK leaves nothing bound.
            wire::config_bind(&mut q.link.tx, 1, num, COPY_RANGE, fail_open, true);
            match q.request("bind queue") {
                Ok(()) => {}
                Err(e) if e.source.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    q.kernel_ct = false;
                    q.link.tx.clear();
                    q.link.seq = q.link.seq.wrapping_add(1);
                    let seq = q.link.seq;
                    wire::config_bind(&mut q.link.tx, seq, num, COPY_RANGE, fail_open, false);
                    q.request("bind queue")?;
                }
                Err(e) => return Err(e),
            }
            Ok(q)
        }

        /// Whether packets come with the kernel's conntrack entry (`NFQA_CT`): false when the
        /// kernel refused `NFQA_CFG_F_CONNTRACK` (no ctnetlink), and then `--ctstate SNAT` /
        /// `DNAT` never match.
        pub fn kernel_conntrack(&self) -> bool {
            self.kernel_ct
        }

        /// Sets what our ACCEPT means (`--nfqueue-mode`; [`NfqueueAccept::Final`] when not
        /// called).
        pub fn with_accept(mut self, accept: NfqueueAccept) -> Queue {
            self.link.accept = accept;
            self
        }

        /// The queue number.
        pub fn num(&self) -> u16 {
            self.link.num
        }

        /// Sends `tx` (one request with NLM_F_ACK and sequence `seq`) and waits for its ack.
        /// Packets that arrive first are answered `NF_REPEAT`.
        fn request(&mut self, step: &'static str) -> Result<(), QueueError> {
            let num = self.link.num;
            self.link.send_tx().map_err(err(num, step))?;
            let want = self.link.seq;
            // The ack is queued during our sendto; a few timeouts' worth of waiting is ample.
            for _ in 0..50 {
                let n = match self.recv_into_slot0() {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(err(num, step)(e)),
                };
                let mut repeat = Vec::new();
                let mut acked = None;
                for m in wire::messages(&self.rx[..n]) {
                    match m {
                        Ok(Message::Ack { seq, errno }) if seq == want => acked = Some(errno),
                        Ok(Message::Packet(p)) => repeat.push(p.id),
                        _ => {}
                    }
                }
                if !repeat.is_empty() {
                    let l = &mut self.link;
                    l.tx.clear();
                    // NF_REPEAT: the answer to a packet that arrives before the bind is
                    // acknowledged; the kernel runs the hook again, so the packet is queued
                    // again and classified normally.
                    for id in repeat {
                        l.seq = l.seq.wrapping_add(1);
                        wire::verdict(&mut l.tx, l.seq, num, id, NF_REPEAT, false);
                    }
                    l.send_tx().map_err(err(num, step))?;
                }
                match acked {
                    Some(0) => return Ok(()),
                    Some(errno) => return Err(err(num, step)(io::Error::from_raw_os_error(errno))),
                    None => {}
                }
            }
            Err(err(num, step)(io::Error::new(
                io::ErrorKind::TimedOut,
                "no answer from the kernel",
            )))
        }

        fn recv_into_slot0(&mut self) -> io::Result<usize> {
            // SAFETY: the slot is a live, writable buffer of at least SLOT bytes.
            let r = unsafe {
                libc::recv(
                    self.link.fd.as_raw_fd(),
                    self.rx.as_mut_ptr().cast(),
                    SLOT,
                    0,
                )
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(r as usize)
        }

        /// Receives up to [`BATCH`] datagrams with one `recvmmsg(MSG_WAITFORONE)`: waits up to
        /// 100 ms for the first, then takes what is already there. Returns how many (0 on
        /// timeout or signal); [`Queue::datagram`] reads them.
        ///
        /// Errors: the OS error of `recvmmsg` other than a timeout or EINTR.
        pub fn recv_batch(&mut self) -> io::Result<usize> {
            // SAFETY: iovec and mmsghdr are plain data; all-zero is valid (null pointers,
            // zero lengths), and every field the kernel reads is set below.
            let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            for (i, (v, h)) in iov.iter_mut().zip(hdrs.iter_mut()).enumerate() {
                v.iov_base = self.rx[i * SLOT..].as_mut_ptr().cast();
                v.iov_len = SLOT;
                h.msg_hdr.msg_iov = v;
                h.msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: `hdrs` holds BATCH headers whose iovecs point into `self.rx` (BATCH
            // disjoint slots of SLOT bytes), all live and exclusively borrowed for the call.
            let r = unsafe {
                libc::recvmmsg(
                    self.link.fd.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                    _ => Err(e),
                };
            }
            let n = (r as usize).min(BATCH);
            for (len, h) in self.lens.iter_mut().zip(&hdrs[..n]) {
                *len = (h.msg_len as usize).min(SLOT);
            }
            Ok(n)
        }

        /// Datagram `i` of the last [`Queue::recv_batch`].
        pub fn datagram(&self, i: usize) -> &[u8] {
            datagram(&self.rx, &self.lens, i)
        }

        /// Sends one verdict per `(id, verdict, mark)`; see [`Link::send_verdicts`].
        ///
        /// Errors: the OS error of `sendto`.
        pub fn send_verdicts(&mut self, answers: &[Answer]) -> io::Result<()> {
            self.link.send_verdicts(answers)
        }
    }

    impl Link {
        fn send_tx(&self) -> io::Result<()> {
            // SAFETY: sockaddr_nl is plain data; all-zero is a valid value (pid 0 = kernel).
            let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            // SAFETY: `tx` and `addr` are live for the call, the lengths are theirs.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    self.tx.as_ptr().cast(),
                    self.tx.len(),
                    0,
                    (&addr as *const libc::sockaddr_nl).cast(),
                    std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }

        /// Sends one verdict per id, in order: `NFQNL_MSG_VERDICT_BATCH` with the last id of
        /// each run of equal verdicts and marks (ids of one queue increase, and every earlier
        /// id was answered before, so a run's batch verdict covers exactly that run). A mark
        /// goes with its verdict as `NFQA_MARK` (the kernel sets skb->mark to it).
        ///
        /// Errors: the OS error of `sendto`.
        pub fn send_verdicts(&mut self, answers: &[Answer]) -> io::Result<()> {
            self.tx.clear();
            let mut i = 0;
            while i < answers.len() {
                let (v, mark) = (answers[i].1, answers[i].2);
                let mut j = i;
                while j + 1 < answers.len() && (answers[j + 1].1, answers[j + 1].2) == (v, mark) {
                    j += 1;
                }
                self.seq = self.seq.wrapping_add(1);
                let (seq, num, id) = (self.seq, self.num, answers[j].0);
                wire::verdict_mark(&mut self.tx, seq, num, id, v, j > i, mark);
                i = j + 1;
            }
            if self.tx.is_empty() {
                return Ok(());
            }
            self.send_tx()
        }
    }

    fn datagram<'a>(rx: &'a [u8], lens: &[usize; BATCH], i: usize) -> &'a [u8] {
        let len = lens.get(i).copied().unwrap_or(0);
        rx.get(i * SLOT..i * SLOT + len).unwrap_or(&[])
    }

    /// Interface index -> (name, whether it is an Ethernet device), cached per worker; an
    /// entry older than 1 s is asked again (renames keep the index), a miss asks at once.
    /// Index 0 is "no interface" (empty name, not Ethernet).
    #[derive(Debug, Default)]
    pub struct IfNames {
        entries: Vec<(u32, IfName, bool, u64)>,
    }

    impl IfNames {
        /// The name of interface `index` at time `now_ns`; empty when unknown (gone).
        pub fn get(&mut self, index: u32, now_ns: u64) -> IfName {
            self.link(index, now_ns).0
        }

        /// The name of interface `index` and whether its type is `ARPHRD_ETHER` (what
        /// `mac_mt` asks of `skb->dev` before it reads a source address), at `now_ns`.
        pub fn link(&mut self, index: u32, now_ns: u64) -> (IfName, bool) {
            if index == 0 {
                return (IfName::default(), false);
            }
            let pos = self.entries.iter().position(|e| e.0 == index);
            if let Some(p) = pos {
                let (_, name, ether, at) = self.entries[p];
                if now_ns.saturating_sub(at) < IFNAME_TTL_NS {
                    return (name, ether);
                }
            }
            let (name, ether) = lookup(index).unwrap_or_default();
            match pos {
                Some(p) => self.entries[p] = (index, name, ether, now_ns),
                None => {
                    // Bounded: interfaces come and go (veths); forget all past 1024.
                    if self.entries.len() >= 1024 {
                        self.entries.clear();
                    }
                    self.entries.push((index, name, ether, now_ns));
                }
            }
            (name, ether)
        }
    }

    /// `if_indextoname(3)` in the calling thread's network namespace, and whether the device
    /// is Ethernet (`SIOCGIFHWADDR`'s `sa_family` is `ARPHRD_ETHER`; false when that fails).
    fn lookup(index: u32) -> Option<(IfName, bool)> {
        let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
        let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: on success the buffer holds a NUL-terminated name within IF_NAMESIZE bytes.
        let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        let name = IfName::new(s.to_str().ok()?)?;
        Some((name, is_ether(&buf)))
    }

    /// Whether the device named by the NUL-terminated `name` is `ARPHRD_ETHER`.
    fn is_ether(name: &[libc::c_char; libc::IF_NAMESIZE]) -> bool {
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return false;
        }
        // SAFETY: `raw` is a new, valid descriptor that nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ifreq is plain data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        req.ifr_name = *name;
        // SAFETY: `req` is a live ifreq with a NUL-terminated name, as SIOCGIFHWADDR reads and
        // writes it.
        let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) };
        // SAFETY: after a successful SIOCGIFHWADDR the union holds `ifru_hwaddr`.
        r == 0 && unsafe { req.ifr_ifru.ifru_hwaddr.sa_family } == libc::ARPHRD_ETHER
    }

    /// Builds the [`PacketMeta`] of a queued packet; `None` when the hook is unknown or the
    /// bytes do not parse.
    ///
    /// The source MAC (`-m mac`) is `NFQA_HWADDR` when the input device is Ethernet: mac_mt
    /// matches nothing on other devices (loopback sends an all-zero address).
    fn meta(p: &PacketMsg<'_>, names: &mut IfNames, now_ns: u64) -> Option<PacketMeta> {
        let (in_iface, in_ether) = names.link(p.indev, now_ns);
        let base = PacketMeta {
            hook: hook_from_netfilter(p.hook)?,
            in_iface,
            out_iface: names.get(p.outdev, now_ns),
            phys_in: names.get(p.physindev, now_ns),
            phys_out: names.get(p.physoutdev, now_ns),
            mark: p.mark,
            src_mac: p.hw_addr.filter(|_| in_ether),
            ct_nat: ct_nat(p.ct_status),
            // Only the kernel knows the destination before its DNAT (--ctorigdst).
            ct_orig_dst: p
                .ct_orig_dst
                .filter(|_| ct_nat(p.ct_status) & vallum_engine::model::ct_state::DNAT != 0),
            owner: p.uid.zip(p.gid),
            ..PacketMeta::default()
        };
        parse_ip(p.payload, base).ok()
    }

    fn nf_verdict(v: Verdict) -> u32 {
        match v {
            Verdict::Accept => wire::NF_ACCEPT,
            // NFQUEUE cannot ask the kernel for the ICMP error / RST: REJECT drops.
            Verdict::Drop | Verdict::Reject(_) => wire::NF_DROP,
        }
    }

    /// The worker loop: receive a batch, classify, answer; until `stop` is set (checked at
    /// least every 100 ms). Unexpected socket errors are printed and retried after 100 ms.
    pub fn run_worker(
        queue: &mut Queue,
        worker: &mut EngineWorker<'_>,
        stop: &AtomicBool,
        clock: &dyn Clock,
        events: &Events,
    ) {
        let mut drain = Drain::default();
        let mut names = IfNames::default();
        let mut packets = [PacketMeta::default(); BATCH];
        let mut verdicts = [Verdict::Accept; BATCH];
        // (packet id, index into `packets` or BATCH for "did not parse", the mark it was
        // queued with), in arrival order.
        let mut order = [(0u32, 0usize, 0u32); BATCH];
        let mut answers: [Answer; BATCH] = [(0, 0, None); BATCH];
        // Relaxed: the flag only asks the loop to end; nothing is published with it.
        while !stop.load(Ordering::Relaxed) {
            let n = match queue.recv_batch() {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(queue = queue.num(), error = %e, "NFQUEUE receive failed");
                    std::thread::sleep(RECV_TIMEOUT);
                    continue;
                }
            };
            if n == 0 {
                continue;
            }
            let now = clock.now_ns();
            // Each parsed packet from its IP header (in `queue.rx`), for `-m string` and the
            // LOG lines.
            let mut headers: [&[u8]; BATCH] = [&[]; BATCH];
            let (mut m, mut k) = (0, 0);
            for i in 0..n {
                // The kernel sends one packet per datagram; a longer datagram is read whole,
                // flushing when the arrays are full.
                // Split borrows: the datagram lives in `queue.rx`, `flush` writes `queue.tx`.
                for msg in wire::messages(datagram(&queue.rx, &queue.lens, i)) {
                    let Ok(Message::Packet(p)) = msg else {
                        continue;
                    };
                    if m == BATCH {
                        flush(
                            &mut queue.link,
                            worker,
                            (&mut drain, events, &headers),
                            &mut packets,
                            &mut verdicts,
                            &order,
                            &mut answers,
                            m,
                            k,
                            now,
                        );
                        (m, k) = (0, 0);
                    }
                    order[m] = match meta(&p, &mut names, now) {
                        Some(pm) => {
                            packets[k] = pm;
                            headers[k] = p.payload;
                            k += 1;
                            (p.id, k - 1, p.mark)
                        }
                        None => (p.id, BATCH, p.mark),
                    };
                    m += 1;
                }
            }
            flush(
                &mut queue.link,
                worker,
                (&mut drain, events, &headers),
                &mut packets,
                &mut verdicts,
                &order,
                &mut answers,
                m,
                k,
                now,
            );
        }
    }

    /// Classifies `packets[..k]`, answers the `m` packets of `order`, then hands the batch's
    /// events over ([`Drain::after_batch`], after the verdicts: the kernel waits for those).
    #[allow(clippy::too_many_arguments)] // The worker loop's arrays, passed to avoid copies.
    fn flush(
        link: &mut Link,
        worker: &mut EngineWorker<'_>,
        (drain, events, headers): (&mut Drain, &Events, &[&[u8]; BATCH]),
        packets: &mut [PacketMeta; BATCH],
        verdicts: &mut [Verdict; BATCH],
        order: &[(u32, usize, u32); BATCH],
        answers: &mut [Answer; BATCH],
        m: usize,
        k: usize,
        now: u64,
    ) {
        if m == 0 {
            return;
        }
        // The IP packets themselves go along for `-m string`.
        worker.process_batch_bytes(&mut packets[..k], &headers[..k], &mut verdicts[..k], now);
        let guarded_before = link.loop_guarded;
        for (a, &(id, idx, queued)) in answers.iter_mut().zip(&order[..m]) {
            let v = verdicts.get(idx).map_or(wire::NF_DROP, |&v| nf_verdict(v));
            // The mark the rules left (`None` for a packet that did not parse).
            let after = packets.get(idx).map(|p| p.mark);
            let ans = answer(link.accept, v, queued, after);
            link.loop_guarded += u64::from(ans.loop_guard);
            *a = (id, ans.verdict, ans.mark);
        }
        if guarded_before == 0 && link.loop_guarded > 0 {
            if let NfqueueAccept::Continue { mark } = link.accept {
                tracing::warn!(
                    queue = link.num,
                    "--nfqueue-mode continue: a packet arrived with the continue mark {mark:#x} \
                     already set, so the steering rules do not skip it (installed with `vallumctl \
                     dataplane install --mode final`, or another --mark?); such packets are \
                     accepted as in final mode, not handed back to the kernel's rules"
                );
            }
        }
        if let Err(e) = link.send_verdicts(&answers[..m]) {
            tracing::warn!(queue = link.num, error = %e, "NFQUEUE verdicts failed");
        }
        drain.after_batch(worker, events, &packets[..k], &verdicts[..k], &headers[..k]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netfilter_hook_numbers() {
        let got: Vec<_> = (0..=5).map(hook_from_netfilter).collect();
        assert_eq!(
            got,
            vec![
                Some(Hook::Prerouting),
                Some(Hook::Input),
                Some(Hook::Forward),
                Some(Hook::Output),
                Some(Hook::Postrouting),
                None
            ]
        );
    }

    /// Loopback (ifindex 1 in every network namespace) is not Ethernet: mac_mt matches
    /// nothing on it, though NFQA_HWADDR carries an all-zero address for it.
    #[cfg(target_os = "linux")]
    #[test]
    fn loopback_is_not_ethernet() {
        let mut names = IfNames::default();
        assert_eq!(
            names.link(1, 0),
            (vallum_engine::packet::IfName::new("lo").unwrap(), false)
        );
        assert!(!names.link(0, 0).1);
    }

    #[test]
    fn verdicts_by_mode() {
        use wire::{NF_ACCEPT, NF_DROP};
        let a = |accept, nf, queued, after| {
            let r = answer(accept, nf, queued, after);
            (r.verdict, r.mark, r.loop_guard)
        };
        let fin = NfqueueAccept::Final;
        let cont = NfqueueAccept::Continue { mark: 0x4000_0000 };
        // final: today's answers; the mark only when an accepted packet's mark changed.
        assert_eq!(a(fin, NF_ACCEPT, 7, Some(7)), (NF_ACCEPT, None, false));
        assert_eq!(a(fin, NF_ACCEPT, 7, Some(9)), (NF_ACCEPT, Some(9), false));
        assert_eq!(a(fin, NF_DROP, 7, Some(9)), (NF_DROP, None, false));
        assert_eq!(a(fin, NF_DROP, 7, None), (NF_DROP, None, false));
        // continue: ACCEPT repeats the hook with only our bit added to the mark.
        assert_eq!(
            a(cont, NF_ACCEPT, 0, Some(0)),
            (NF_REPEAT, Some(0x4000_0000), false)
        );
        assert_eq!(
            a(cont, NF_ACCEPT, 0x0000_4001, Some(0x0000_4001)),
            (NF_REPEAT, Some(0x4000_4001), false),
            "a user mark survives"
        );
        assert_eq!(
            a(cont, NF_ACCEPT, 1, Some(0x84)),
            (NF_REPEAT, Some(0x4000_0084), false),
            "our -j MARK survives"
        );
        // Our DROP is a DROP.
        assert_eq!(a(cont, NF_DROP, 0, Some(0)), (NF_DROP, None, false));
        assert_eq!(a(cont, NF_DROP, 0, None), (NF_DROP, None, false));
        // Arrived with our bit: the steering does not skip it; never repeat (no loop).
        assert_eq!(
            a(cont, NF_ACCEPT, 0x4000_0000, Some(0x4000_0000)),
            (NF_ACCEPT, None, true)
        );
    }

    #[test]
    fn kernel_nat_status_bits() {
        assert_eq!(ct_nat(None), 0);
        // IPS_CONFIRMED | IPS_SEEN_REPLY: tracked, no NAT.
        assert_eq!(ct_nat(Some(0x0a)), 0);
        assert_eq!(ct_nat(Some(0x0a | wire::IPS_DST_NAT)), ct_state::DNAT);
        assert_eq!(ct_nat(Some(wire::IPS_SRC_NAT)), ct_state::SNAT);
        assert_eq!(
            ct_nat(Some(wire::IPS_SRC_NAT | wire::IPS_DST_NAT)),
            ct_state::SNAT | ct_state::DNAT
        );
    }

    #[test]
    fn errors_say_what_to_do() {
        let e = QueueError {
            queue: 3,
            step: "bind queue",
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
        let s = e.to_string();
        assert!(s.starts_with("NFQUEUE 3: bind queue: "), "{s}");
        assert!(s.contains("CAP_NET_ADMIN"), "{s}");
        assert!(s.contains("another process"), "{s}");
    }
}
