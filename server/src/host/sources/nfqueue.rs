//! The NFQUEUE packet source (Linux): worker k binds nfnetlink_queue number `first + k`, reads
//! up to `BATCH` queued packets per `recvmmsg(2)`, classifies them with one
//! `EngineWorker::process` and answers them all with one `sendto(2)` of verdict messages
//! (`NFQNL_MSG_VERDICT_BATCH` per run of equal verdicts).
//!
//! What the kernel tells us becomes the `PacketMeta`: the IP packet (NFQUEUE hands it from
//! the IP header on; `parse_ip`), the hook (`NF_INET_*` numbers, [`hook_from_netfilter`]),
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
//! kernel's remaining rules decide; [`NfqueueAccept`]); DROP -> `NF_DROP`; REJECT ->
//! `NF_REPEAT` with the answer's code in the reject mark field (`--nfqueue-reject-mark`): the
//! steering chain's first rule sends such a packet to the kernel's own `-j REJECT
//! --reject-with TYPE` for that code, so the kernel builds and rate-limits the answer exactly
//! as for its own REJECT ([`answer`]; with the field 0, REJECT drops). A packet whose transport header is
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
//! fail-open `NFQA_CFG_F_FAIL_OPEN` (a full queue accepts instead of dropping),
//! `NFQA_CFG_F_GSO` (a GSO aggregate is queued whole, not segmented for us: one packet of the
//! aggregate's length, as iptables counts it at the hook), `NFQA_CFG_F_UID_GID`, and
//! `NFQA_CFG_F_CONNTRACK` where the kernel has ctnetlink (else bound without it, see
//! [`Queue::open`]). The worker then lowers the copy range to the bytes its rules can read
//! (256 for rules that read headers only; more for `-m string`, `-j NFLOG`) and follows
//! commits that change it; see [`run_worker`] for packets copied short. The queue length is
//! `--queue-maxlen`, by default [`auto_maxlen`](crate::host::nfqueue_stats::auto_maxlen) of the
//! receive buffer, so that under a flood the socket fills before the queue and every
//! fail-open bypass is counted ([`crate::host::nfqueue_stats`]).
//!
//! Counters: each queue's [`QueueCounters`](crate::host::nfqueue_stats::QueueCounters) (received,
//! verdicts sent by kind, send and receive errors), read with the kernel's at scrape time.
//!
//! Test knob: [`Queue::with_batch_delay`] (vallumd's hidden `--test-nfqueue-batch-delay-us`,
//! env `VALLUM_TEST_NFQUEUE_BATCH_DELAY_US`, read once by clap) makes the worker sleep that
//! long after each batch (capacity about 32 packets per delay), so a test can overload a queue
//! with a modest flood. Not for production.

pub mod wire;

use vallum_engine::model::{Hook, RejectWith, ct_state};
use vallum_engine::snapshot::Verdict;

use crate::config::{NfqueueAccept, NfqueueAnswers};

/// `NF_REPEAT`: the kernel runs the packet's hook function (the filter table's chain) again
/// from its first rule.
pub use wire::NF_REPEAT;

/// The verdict and mark sent for one packet: `v` is the engine's verdict (`Drop` for a packet
/// that did not parse), `queued` the mark the packet was queued with, `after` the mark our
/// rules left (`-j MARK`; `None` for a packet that did not parse).
///
/// - ACCEPT, `Final`: `(NF_ACCEPT, mark)`, the mark only when it changed;
/// - ACCEPT, `Continue { mark: B }`: `(NF_REPEAT, after | B)` (only bit B is added; the rest of
///   the mark is the packet's). A packet that arrives with B already set means the steering
///   rules do not skip B (installed in `final` mode, or another bit): it is answered as in
///   `Final` instead, so that it cannot loop through the queue, with
///   [`Answered::loop_guard`] set.
/// - DROP: `(NF_DROP, None)`.
/// - REJECT with a reject field R (`NfqueueAnswers::reject_mark` != 0): `(NF_REPEAT, (after
///   & !R) | code << shift(R))` in both modes: the kernel runs the filter chain again, and the
///   steering chain's first rule sends the packet to the kernel's REJECT of that code (which
///   clears R first), so the kernel answers as its own REJECT would. With R = 0: `NF_DROP`.
///
/// A packet that arrives with a reject code already in R was handed back by us and came to the
/// queue again: the steering has no REJECT rule for that code (installed without
/// `--reject-mark`, or with another field). It is answered as if R were 0, with R cleared
/// from its mark (REJECT drops it), and [`Answered::reject_unsteered`] is set, so it cannot
/// loop either.
pub fn answer(cfg: NfqueueAnswers, v: Verdict, queued: u32, after: Option<u32>) -> Answered {
    let r = cfg.reject_mark;
    let shift = r.trailing_zeros() % 32;
    let unsteered = r != 0 && RejectWith::from_code(((queued & r) >> shift) as u8).is_some();
    // The mark our rules left, without a reject code we set on an earlier pass.
    let left = |m: u32| if unsteered { m & !r } else { m };
    let after = after.map(left);
    let (queued_clean, plain) = (left(queued), |verdict, mark| Answered {
        verdict,
        mark,
        loop_guard: false,
        reject_unsteered: unsteered,
    });
    match v {
        Verdict::Drop => plain(wire::NF_DROP, None),
        Verdict::Reject(_) if r == 0 || unsteered => plain(wire::NF_DROP, None),
        Verdict::Reject(w) => plain(
            NF_REPEAT,
            Some((after.unwrap_or(queued_clean) & !r) | (u32::from(w.code()) << shift)),
        ),
        Verdict::Accept => {
            let changed = after.filter(|&m| m != queued);
            match cfg.accept {
                NfqueueAccept::Continue { mark } if queued & mark != 0 => Answered {
                    loop_guard: true,
                    ..plain(wire::NF_ACCEPT, changed)
                },
                NfqueueAccept::Continue { mark } => {
                    plain(NF_REPEAT, Some(after.unwrap_or(queued_clean) | mark))
                }
                NfqueueAccept::Final => plain(wire::NF_ACCEPT, changed),
            }
        }
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
    /// The packet arrived with a reject code in the reject field: the steering has no kernel
    /// REJECT rule for it, so a REJECT was answered `NF_DROP`.
    pub reject_unsteered: bool,
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

/// Whether the kernel's conntrack state of a packet (`NFQA_CT_INFO`, the kernel's `enum
/// ip_conntrack_info`: ESTABLISHED 0, RELATED 1, NEW 2, ESTABLISHED_REPLY 3, RELATED_REPLY 4)
/// differs from `ours` (the [`ct_state`] bit vallumd's table gave it). `false` without a
/// kernel state (no `NFQA_CT`: the kernel tracks nothing in this namespace, or has no entry
/// for the packet) and for a state we cannot compare (ours UNTRACKED: our raw table's NOTRACK,
/// which the kernel never saw). vallumd's state decides; the count
/// (`vallum_nfqueue_ct_state_disagreements_total`) says how often the two tables differ.
pub fn ct_disagrees(kernel_info: Option<u32>, ours: u8) -> bool {
    let kernel = match kernel_info {
        Some(0 | 3) => ct_state::ESTABLISHED,
        Some(1 | 4) => ct_state::RELATED,
        Some(2) => ct_state::NEW,
        _ => return false,
    };
    ours & ct_state::UNTRACKED == 0 && ours != kernel
}

#[cfg(target_os = "linux")]
pub use linux::{Answer, IfNames, Queue, run_accept_all, run_worker};

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use vallum_engine::Clock;
    use vallum_engine::engine::EngineWorker;
    use vallum_engine::packet::parse::parse_ip;
    use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
    use vallum_engine::snapshot::Verdict;

    use std::sync::Arc;

    use super::wire::{self, Message, PacketMsg};
    use super::{QueueError, answer, ct_disagrees, ct_nat, hook_from_netfilter};
    use crate::config::{NfqueueAccept, NfqueueAnswers};
    use crate::host::nfqueue_stats::{QueueCounters, auto_maxlen};
    use crate::host::sources::{BATCH, Drain};
    use crate::telemetry::events::Events;

    /// The largest copy range (`NFQNL_MAX_COPY_RANGE`): what a queue is bound with, before
    /// its worker sets the range its rules need.
    const COPY_RANGE: u32 = vallum_engine::snapshot::copy_range::MAX_COPY_RANGE;
    /// One receive slot: the copied packet plus the message's metadata attributes.
    const SLOT: usize = COPY_RANGE as usize + 8192;
    /// The most the kernel copies whatever the range asked: `NFQNL_MAX_COPY_RANGE`, 65535
    /// less a netlink attribute header since Linux 5.x (the copy range reads 65531 in
    /// /proc/net/netfilter/nfnetlink_queue); a packet cut there has no more bytes to give.
    const KERNEL_MAX_COPY: usize = 0xffff - 4;
    /// How long a copy range raised to the whole packet for a packet whose headers ran past
    /// the rules' range (a long IPv6 extension chain) stays before it is lowered again.
    const RAISED_HOLD_NS: u64 = 1_000_000_000;
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
        /// What the worker counts, shared with the metrics.
        counters: Arc<QueueCounters>,
        /// The test-only pause after each batch ([`Queue::with_batch_delay`]).
        batch_delay: Option<Duration>,
    }

    /// The socket and what we send on it.
    struct Link {
        fd: OwnedFd,
        num: u16,
        seq: u32,
        /// Outgoing messages (reused: no allocation once grown).
        tx: Vec<u8>,
        /// What our ACCEPT and REJECT send (`--nfqueue-mode`, `--nfqueue-reject-mark`).
        answers: NfqueueAnswers,
        /// Packets `continue` mode answered as `final` because they arrived with the continue
        /// bit already set ([`super::Answered::loop_guard`]); warned about once.
        loop_guarded: u64,
        /// Packets that arrived with a reject code set ([`super::Answered::reject_unsteered`]);
        /// warned about once.
        reject_unsteered: u64,
        /// One slot for the answers to our requests (and packets that come meanwhile), apart
        /// from the batch's slots, so a request can be made while a batch is answered.
        ctl: Vec<u8>,
        /// The copy range the queue was last configured with.
        copy_range: u32,
        /// The least copy range the worker sets ([`Queue::set_min_copy_range`]).
        min_copy_range: u32,
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

    fn getsockopt_int(fd: &OwnedFd, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are live and writable; the kernel writes at most `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                level,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
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
            Queue::open_with(num, fail_open, None)
        }

        /// [`Queue::open`], then sets the queue length (`NFQA_CFG_QUEUE_MAXLEN`) to `maxlen`,
        /// or with `None` to [`auto_maxlen`] of the receive buffer the kernel granted. The
        /// kernel's default (1024) holds until then, a few microseconds after the bind.
        ///
        /// Errors: as [`Queue::open`]; the step `queue maxlen` when the kernel refuses it.
        pub fn open_with(
            num: u16,
            fail_open: bool,
            maxlen: Option<u32>,
        ) -> Result<Queue, QueueError> {
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
                    ctl: vec![0; SLOT],
                    copy_range: COPY_RANGE,
                    min_copy_range: 1,
                    answers: NfqueueAnswers::default(),
                    loop_guarded: 0,
                    reject_unsteered: 0,
                },
                kernel_ct: true,
                rx: vec![0; BATCH * SLOT],
                lens: [0; BATCH],
                counters: Arc::new(QueueCounters::new(num, fail_open, 0, 0)),
                batch_delay: None,
            };
            // Bind, copy mode and flags in one message: the kernel creates the queue and
            // applies the parameters before it can deliver any packet. It checks the flags
            // before it binds, so a refused NFQA_CFG_F_CONNTRACK leaves nothing bound.
            wire::config_bind(&mut q.link.tx, 1, num, COPY_RANGE, fail_open, true);
            match q.link.request("bind queue") {
                Ok(()) => {}
                Err(e) if e.source.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    q.kernel_ct = false;
                    q.link.tx.clear();
                    q.link.seq = q.link.seq.wrapping_add(1);
                    let seq = q.link.seq;
                    wire::config_bind(&mut q.link.tx, seq, num, COPY_RANGE, fail_open, false);
                    q.link.request("bind queue")?;
                }
                Err(e) => return Err(e),
            }
            let rcvbuf = getsockopt_int(&q.link.fd, libc::SOL_SOCKET, libc::SO_RCVBUF)
                .map_err(err(num, "SO_RCVBUF"))?;
            let rcvbuf = u32::try_from(rcvbuf).unwrap_or(0);
            let maxlen = maxlen.unwrap_or_else(|| auto_maxlen(rcvbuf, BATCH as u32));
            q.link.tx.clear();
            q.link.seq = q.link.seq.wrapping_add(1);
            wire::config_maxlen(&mut q.link.tx, q.link.seq, num, maxlen);
            q.link.request("queue maxlen")?;
            q.counters = Arc::new(QueueCounters::new(num, fail_open, maxlen, rcvbuf));
            Ok(q)
        }

        /// This queue's counters (what it was bound with, and what its worker counted).
        pub fn counters(&self) -> Arc<QueueCounters> {
            self.counters.clone()
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
            self.link.answers.accept = accept;
            self
        }

        /// Sets the reject mark field (`--nfqueue-reject-mark`; 0, REJECT drops, when not
        /// called): see [`answer`].
        pub fn with_reject_mark(mut self, reject_mark: u32) -> Queue {
            self.link.answers.reject_mark = reject_mark;
            self
        }

        /// Sets the facts field (`--nfqueue-facts-mark`; 0, none, when not called): the
        /// packet path reads it as `kernel_facts`, the rules see the mark without it.
        pub fn with_facts_mark(mut self, facts_mark: u32) -> Queue {
            self.link.answers.facts_mark = facts_mark;
            self
        }

        /// Sets the test-only pause after each batch (`None`, the default: no pause); see the
        /// module docs.
        pub fn with_batch_delay(mut self, delay: Option<Duration>) -> Queue {
            self.batch_delay = delay.filter(|d| !d.is_zero());
            self
        }

        /// The queue number.
        pub fn num(&self) -> u16 {
            self.link.num
        }

        /// The bytes of each packet the kernel copies to us (the copy range): the kernel's
        /// maximum after [`Queue::open`]; [`run_worker`] sets what its rules read.
        pub fn copy_range(&self) -> u32 {
            self.link.copy_range
        }

        /// Sets the copy range to `range` bytes (1 to 65535) and waits for the kernel's
        /// ack; packets that come meanwhile are answered `NF_REPEAT`. [`run_worker`] sets
        /// its own range after its first batch (see [`Queue::set_min_copy_range`]).
        ///
        /// Errors: [`QueueError`] with the OS error or the kernel's answer.
        pub fn set_copy_range(&mut self, range: u32) -> Result<(), QueueError> {
            self.link.set_copy_range(range.clamp(1, COPY_RANGE))
        }

        /// Makes [`run_worker`] copy at least `range` bytes (1 to 65535) of each packet,
        /// whatever its rules read: 65535 copies whole packets always (the NFQUEUE bench
        /// compares that with the rules' range).
        pub fn set_min_copy_range(&mut self, range: u32) {
            self.link.min_copy_range = range.clamp(1, COPY_RANGE);
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

        /// Sends one verdict per `(id, verdict, mark)`; see `Link::send_verdicts`.
        ///
        /// Errors: the OS error of `sendto`.
        pub fn send_verdicts(&mut self, answers: &[Answer]) -> io::Result<()> {
            self.link.send_verdicts(answers)
        }
    }

    impl Link {
        /// Sends `tx` (one request with NLM_F_ACK and sequence `seq`) and waits for its ack.
        /// Packets that arrive first are answered `NF_REPEAT`.
        fn request(&mut self, step: &'static str) -> Result<(), QueueError> {
            let num = self.num;
            self.send_tx().map_err(err(num, step))?;
            let want = self.seq;
            // The ack is queued during our sendto, behind the packets already in the socket
            // (at most the queue's length, or what the receive buffer holds): a few
            // timeouts' worth of waiting is ample, and the datagrams read are bounded.
            let mut timeouts = 0;
            for _ in 0..1 << 16 {
                let n = match self.recv_ctl() {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && timeouts < 50 => {
                        timeouts += 1;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(err(num, step)(e)),
                };
                let mut repeat = Vec::new();
                let mut acked = None;
                for m in wire::messages(&self.ctl[..n]) {
                    match m {
                        Ok(Message::Ack { seq, errno }) if seq == want => acked = Some(errno),
                        Ok(Message::Packet(p)) => repeat.push(p.id),
                        _ => {}
                    }
                }
                if !repeat.is_empty() {
                    let l = &mut *self;
                    l.tx.clear();
                    // NF_REPEAT: the answer to a packet that arrives before the bind is
                    // acknowledged; the kernel runs the hook again, so the packet is queued
                    // again and classified normally.
                    for id in repeat {
                        l.seq = l.seq.wrapping_add(1);
                        wire::verdict(&mut l.tx, l.seq, num, id, wire::NF_REPEAT, false);
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

        fn recv_ctl(&mut self) -> io::Result<usize> {
            // SAFETY: `ctl` is a live, writable buffer of `ctl.len()` bytes.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.ctl.as_mut_ptr().cast(),
                    self.ctl.len(),
                    0,
                )
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(r as usize)
        }

        /// Configures the queue to copy `range` bytes of each packet (see
        /// [`wire::config_copy_range`]) and waits for the kernel's ack; the packets that come
        /// meanwhile are answered `NF_REPEAT` (queued again, with the new range).
        ///
        /// Errors: the OS error of the send, or the kernel's answer.
        fn set_copy_range(&mut self, range: u32) -> Result<(), QueueError> {
            self.tx.clear();
            self.seq = self.seq.wrapping_add(1);
            wire::config_copy_range(&mut self.tx, self.seq, self.num, range);
            self.request("set copy range")?;
            self.copy_range = range;
            Ok(())
        }

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

    /// Builds the [`Packet`] of a queued packet (its hot part and its facts); `None` when the
    /// hook is unknown or the bytes do not parse.
    ///
    /// The source MAC (`-m mac`) is `NFQA_HWADDR` when the input device is Ethernet: mac_mt
    /// matches nothing on other devices (loopback sends an all-zero address).
    /// The facts field `facts` (`--nfqueue-facts-mark`) of the mark is handed as
    /// `kernel_facts` (its lowest bit first) and cleared from the mark the rules see.
    fn meta(p: &PacketMsg<'_>, names: &mut IfNames, now_ns: u64, facts: u32) -> Option<Packet> {
        let (in_iface, in_ether) = names.link(p.indev, now_ns);
        let base = Packet {
            meta: PacketMeta {
                hook: hook_from_netfilter(p.hook)?,
                mark: p.mark & !facts,
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface,
                out_iface: names.get(p.outdev, now_ns),
                phys_in: names.get(p.physindev, now_ns),
                phys_out: names.get(p.physoutdev, now_ns),
                kernel_facts: (p.mark & facts) >> (facts.trailing_zeros() % 32),
                src_mac: p.hw_addr.filter(|_| in_ether),
                ct_nat: ct_nat(p.ct_status),
                // Only the kernel knows the destination before its DNAT (--ctorigdst).
                ct_orig_dst: p
                    .ct_orig_dst
                    .filter(|_| ct_nat(p.ct_status) & vallum_engine::model::ct_state::DNAT != 0),
                owner: p.uid.zip(p.gid),
                ..PacketFacts::default()
            },
        };
        parse_ip(p.payload, base).ok()
    }

    /// The worker loop: receive a batch, classify, answer; until `stop` is set (checked at
    /// least every 100 ms). Unexpected socket errors are printed and retried after 100 ms.
    ///
    /// Copy range: after each batch the queue's copy range follows what the rules of the
    /// snapshot that classified it can read ([`vallum_engine::snapshot::Snapshot::copy_range`]),
    /// so a commit that changes it re-sends `NFQNL_MSG_CONFIG` at the next batch. A packet
    /// copied short of what the rules read (queued before a commit raised the range), or cut
    /// inside its headers (an IPv6 extension chain past the range, which raises the range to
    /// the whole packet for a second), is not classified: once the range is raised it is
    /// answered `NF_REPEAT`, so the kernel runs the hook again and queues it again with the
    /// bytes the rules need; it is counted once, when it is decided (the kernel's rules
    /// before the NFQUEUE rule count it twice). A packet's length, for counters and
    /// `-m length`, is always the IP header's (the kernel's `skb->len`, `NFQA_CAP_LEN` when
    /// the payload is cut), never the bytes copied.
    pub fn run_worker(
        queue: &mut Queue,
        worker: &mut EngineWorker<'_>,
        stop: &AtomicBool,
        clock: &dyn Clock,
        events: &Events,
    ) {
        let mut state = Batch {
            drain: Drain::default(),
            packets: [PacketMeta::default(); BATCH],
            facts: [PacketFacts::default(); BATCH],
            verdicts: [Verdict::Accept; BATCH],
            cut: [false; BATCH],
            skipped: [false; BATCH],
            kernel_ct: [None; BATCH],
            order: [(0, 0, 0); BATCH],
            answers: [(0, 0, None); BATCH],
            raised_at: None,
        };
        let mut names = IfNames::default();
        let counters = queue.counters();
        let delay = queue.batch_delay;
        // Relaxed: the flag only asks the loop to end; nothing is published with it.
        while !stop.load(Ordering::Relaxed) {
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            let n = match queue.recv_batch() {
                Ok(n) => n,
                Err(e) => {
                    counters.add_receive_error();
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
                        state.flush(
                            (&mut queue.link, &counters),
                            worker,
                            events,
                            &headers,
                            m,
                            k,
                            now,
                        );
                        (m, k) = (0, 0);
                    }
                    // Cut by the copy range (the kernel says how long the packet is), with
                    // more bytes to be had: the kernel copies at most KERNEL_MAX_COPY.
                    let cut = p.cap_len.is_some_and(|l| l as usize > p.payload.len());
                    let more = cut && p.payload.len() < KERNEL_MAX_COPY;
                    let facts = queue.link.answers.facts_mark;
                    state.order[m] = match meta(&p, &mut names, now, facts) {
                        // Cut inside the headers the parser reads: get it again whole.
                        Some(pm) if more && pm.l4_cut.is_some() => (p.id, WHOLE, p.mark),
                        None if more => (p.id, WHOLE, p.mark),
                        Some(pm) => {
                            state.packets[k] = pm.meta;
                            state.facts[k] = pm.facts;
                            state.cut[k] = more;
                            state.kernel_ct[k] = p.ct_info;
                            headers[k] = p.payload;
                            k += 1;
                            (p.id, k - 1, p.mark)
                        }
                        None => (p.id, BATCH, p.mark),
                    };
                    m += 1;
                }
            }
            state.flush(
                (&mut queue.link, &counters),
                worker,
                events,
                &headers,
                m,
                k,
                now,
            );
        }
    }

    /// The transport alone, for the NFQUEUE bench's ceiling: [`run_worker`]'s receive and
    /// verdict path (one `recvmmsg` of up to [`BATCH`] datagrams, the same message parsing, one
    /// `sendto` of the batch's verdicts) with classification replaced by `NF_ACCEPT`, at the
    /// queue's copy range as it is ([`Queue::set_copy_range`]). Adds the packets it answered
    /// to `decided` after each batch; returns when `stop` is set (checked at least every
    /// 100 ms).
    pub fn run_accept_all(queue: &mut Queue, stop: &AtomicBool, decided: &AtomicU64) {
        let mut answers: [Answer; BATCH] = [(0, 0, None); BATCH];
        let counters = queue.counters();
        let delay = queue.batch_delay;
        // Relaxed: the flag only asks the loop to end; nothing is published with it.
        while !stop.load(Ordering::Relaxed) {
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            let n = match queue.recv_batch() {
                Ok(n) => n,
                Err(e) => {
                    counters.add_receive_error();
                    tracing::warn!(queue = queue.num(), error = %e, "NFQUEUE receive failed");
                    std::thread::sleep(RECV_TIMEOUT);
                    continue;
                }
            };
            let mut m = 0;
            for i in 0..n {
                for msg in wire::messages(datagram(&queue.rx, &queue.lens, i)) {
                    let Ok(Message::Packet(p)) = msg else {
                        continue;
                    };
                    if m == BATCH {
                        if let Err(e) = queue.link.send_verdicts(&answers[..m]) {
                            tracing::warn!(queue = queue.num(), error = %e, "NFQUEUE verdicts failed");
                        }
                        // Relaxed: a statistic, read after the run.
                        decided.fetch_add(m as u64, Ordering::Relaxed);
                        m = 0;
                    }
                    answers[m] = (p.id, wire::NF_ACCEPT, None);
                    m += 1;
                }
            }
            if let Err(e) = queue.link.send_verdicts(&answers[..m]) {
                tracing::warn!(queue = queue.num(), error = %e, "NFQUEUE verdicts failed");
            }
            // Relaxed: as above.
            decided.fetch_add(m as u64, Ordering::Relaxed);
        }
    }

    /// `order`'s index of a packet to be queued again with the whole packet copied.
    const WHOLE: usize = BATCH + 1;

    /// The worker loop's arrays (one batch, reused) and its copy-range state.
    struct Batch {
        drain: Drain,
        packets: [PacketMeta; BATCH],
        /// `facts[i]`: the facts of `packets[i]` (interfaces, bridge ports, MAC, owner, the
        /// kernel's NAT and steering facts, parsed header extras).
        facts: [PacketFacts; BATCH],
        verdicts: [Verdict; BATCH],
        /// Whether `packets[i]`'s bytes are cut short of the packet by the copy range, with
        /// more to be had.
        cut: [bool; BATCH],
        /// Whether `packets[i]` was left unclassified, its bytes short of the rules' range.
        skipped: [bool; BATCH],
        /// The kernel's conntrack state of `packets[i]` (`NFQA_CT_INFO`), if it sent one.
        kernel_ct: [Option<u32>; BATCH],
        /// (packet id, index into `packets`, BATCH for "did not parse" or WHOLE, the mark it
        /// was queued with), in arrival order.
        order: [(u32, usize, u32); BATCH],
        answers: [Answer; BATCH],
        /// When the copy range was last raised to the whole packet for a packet cut inside
        /// its headers.
        raised_at: Option<u64>,
    }

    impl Batch {
        /// Classifies `packets[..k]`, sets the copy range the batch's snapshot (or a packet
        /// cut inside its headers) asks for, answers the `m` packets of `order`, then hands
        /// the batch's events over ([`Drain::after_batch`], after the verdicts: the kernel
        /// waits for those).
        #[allow(clippy::too_many_arguments)] // The batch's parts, passed to avoid copies.
        fn flush(
            &mut self,
            (link, counters): (&mut Link, &QueueCounters),
            worker: &mut EngineWorker<'_>,
            events: &Events,
            headers: &[&[u8]; BATCH],
            m: usize,
            k: usize,
            now: u64,
        ) {
            if m == 0 {
                return;
            }
            // The IP packets themselves go along for `-m string`.
            let batch = vallum_engine::engine::Batch {
                packets: &mut self.packets[..k],
                facts: &mut self.facts[..k],
                verdicts: &mut self.verdicts[..k],
                bytes: &headers[..k],
                cut: &self.cut[..k],
                skipped: &mut self.skipped[..k],
            };
            let (_, range) = worker.process(batch, now);
            let disagreed = self.packets[..k]
                .iter()
                .zip(&self.kernel_ct[..k])
                .zip(&self.skipped[..k])
                .filter(|&((p, &kct), &skipped)| !skipped && ct_disagrees(kct, p.ct_state))
                .count();
            if disagreed > 0 {
                counters.add_ct_disagreed(disagreed as u64);
            }
            let whole = self.order[..m].iter().any(|o| o.1 == WHOLE);
            if whole {
                self.raised_at = Some(now);
            }
            let held = self
                .raised_at
                .is_some_and(|t| now.saturating_sub(t) < RAISED_HOLD_NS);
            let want = if held { COPY_RANGE } else { range }.max(link.min_copy_range);
            // A packet to repeat is answered NF_REPEAT only once the range that gets it
            // whole is set: else it would come back as short, forever. It is dropped then,
            // as a packet that does not parse.
            let mut repeat = wire::NF_REPEAT;
            if want != link.copy_range {
                if let Err(e) = link.set_copy_range(want) {
                    tracing::warn!(queue = link.num, error = %e, "NFQUEUE copy range not set");
                    if want > link.copy_range {
                        repeat = wire::NF_DROP;
                    }
                }
            }
            let (guarded_before, unsteered_before) = (link.loop_guarded, link.reject_unsteered);
            // Decided packets by what we answered (`continue` mode's NF_REPEAT is an accept);
            // the packets queued again for more bytes are neither.
            let (mut accepted, mut dropped) = (0u64, 0u64);
            for (a, &(id, idx, queued)) in self.answers.iter_mut().zip(&self.order[..m]) {
                let skipped = self.skipped.get(idx).copied().unwrap_or(false);
                if idx == WHOLE || skipped {
                    // Not decided: the kernel queues it again with the bytes the rules read.
                    *a = (id, repeat, None);
                    dropped += u64::from(repeat == wire::NF_DROP);
                    continue;
                }
                let v = match self.verdicts.get(idx) {
                    Some(&v) if idx < k => v,
                    _ => Verdict::Drop,
                };
                // The mark the rules left (`None` for a packet that did not parse).
                let after = self.packets.get(idx).filter(|_| idx < k).map(|p| p.mark);
                let ans = answer(link.answers, v, queued, after);
                link.loop_guarded += u64::from(ans.loop_guard);
                link.reject_unsteered += u64::from(ans.reject_unsteered);
                // A REJECT handed to the kernel's REJECT (NF_REPEAT) is a drop here too.
                if ans.verdict == wire::NF_DROP || matches!(v, Verdict::Reject(_)) {
                    dropped += 1;
                } else {
                    accepted += 1;
                }
                *a = (id, ans.verdict, ans.mark);
            }
            if guarded_before == 0 && link.loop_guarded > 0 {
                if let NfqueueAccept::Continue { mark } = link.answers.accept {
                    tracing::warn!(
                        queue = link.num,
                        "--nfqueue-mode continue: a packet arrived with the continue mark \
                         {mark:#x} already set, so the steering rules do not skip it (installed \
                         with `vallumctl dataplane install --mode final`, or another --mark?); \
                         such packets are accepted as in final mode, not handed back to the \
                         kernel's rules"
                    );
                }
            }
            if unsteered_before == 0 && link.reject_unsteered > 0 {
                tracing::warn!(
                    queue = link.num,
                    reject_mark = format_args!("{:#x}", link.answers.reject_mark),
                    "a packet we answered REJECT came back to the queue with its reject code in \
                     the mark: the steering has no kernel REJECT rule for it (installed without \
                     `vallumctl dataplane install --reject-mark`, or with another field than \
                     --nfqueue-reject-mark?); such packets are dropped without an answer"
                );
            }
            counters.add_received(m as u64);
            let sent = link.send_verdicts(&self.answers[..m]);
            counters.add_verdicts(accepted, dropped, sent.is_ok());
            if let Err(e) = sent {
                tracing::warn!(queue = link.num, error = %e, "NFQUEUE verdicts failed");
            }
            // A skipped packet was not decided: no dropped-packet sample for it.
            for (v, &s) in self.verdicts[..k].iter_mut().zip(&self.skipped[..k]) {
                if s {
                    *v = Verdict::Accept;
                }
            }
            self.drain.after_batch(
                worker,
                events,
                &self.packets[..k],
                &self.facts[..k],
                &self.verdicts[..k],
                &headers[..k],
            );
        }
    }
}

#[cfg(test)]
mod tests;
