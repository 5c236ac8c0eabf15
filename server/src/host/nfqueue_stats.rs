//! What happened to every packet handed to an NFQUEUE queue, from both sides: the kernel's
//! per-queue counters (`/proc/net/netfilter/nfnetlink_queue`, [`KernelQueue`]), the receive
//! drops of our netlink socket (`/proc/net/netlink`, [`netlink_drops`]), and our own per-queue
//! counters ([`QueueCounters`], fed by the worker). [`QueueCounters::snapshot`] joins them into
//! the `vallum_nfqueue_*` metrics ([`crate::telemetry::metrics::Metrics::observe_nfqueue`]).
//!
//! ## Where each packet the NFQUEUE target takes ends up (Linux 3.6 .. 6.18)
//! `nfqnl_enqueue_packet` / `__nfqnl_enqueue_packet` in `net/netfilter/nfnetlink_queue.c`:
//!
//! 1. the queue holds `queue_maxlen` packets already (`waiting`): with `NFQA_CFG_F_FAIL_OPEN`
//!    the packet is **accepted** and counted nowhere (no id is taken, `queue_dropped` is not
//!    incremented); without it, it is dropped and `queue_dropped` counts it;
//! 2. otherwise it takes the next id (`id_sequence` + 1) and the message goes to our socket;
//!    when the socket's receive buffer is full (`netlink_attachskb` -> `netlink_overrun`, which
//!    increments the socket's `sk_drops`, the `Drops` column of `/proc/net/netlink`, in both
//!    modes) it is **accepted** with fail-open, counted nowhere by the queue; without
//!    fail-open it is dropped and `user_dropped` counts it;
//! 3. otherwise it waits for our verdict (`waiting` + 1), and we count it as received.
//!
//! So with fail-open the packets that bypassed the firewall are exactly the socket drops of
//! case 2 (also `id_sequence - received` once nothing is in flight) **plus** the case-1
//! accepts, which no counter has. vallumd makes case 1 impossible by default: the queue
//! length it binds with ([`auto_maxlen`]) exceeds the messages our receive buffer can hold plus
//! one batch in our hands, so the socket fills first and every bypass is counted. A smaller
//! `--queue-maxlen` with fail-open makes `vallum_nfqueue_bypassed_total` a lower bound, which
//! vallumd says at start and the metric's help says.
//!
//! GSO: a GSO packet the kernel segments for us counts once per segment in every counter (each
//! segment takes its own id).

use std::sync::atomic::{AtomicU64, Ordering};

/// One line of `/proc/net/netfilter/nfnetlink_queue`: one bound queue of the reader's network
/// namespace. The kernel prints it with `"%5u %6u %5u %1u %5u %5u %5u %8u %2d\n"` (`seq_show`);
/// the counters are the kernel's `unsigned int`s, reset when the queue is bound (the instance
/// is created zeroed) and wrapping at 2^32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelQueue {
    /// The queue number (`queue_num`).
    pub queue: u16,
    /// The netlink port id of the socket bound to it (`peer_portid`): ours, when vallumd holds
    /// the queue; the key into `/proc/net/netlink`.
    pub portid: u32,
    /// Packets queued and not yet given a verdict (`queue_total`): in our socket's buffer or
    /// in the worker's hands.
    pub waiting: u32,
    /// `NFQNL_COPY_NONE` (0), `NFQNL_COPY_META` (1) or `NFQNL_COPY_PACKET` (2).
    pub copy_mode: u8,
    /// Bytes of each packet copied to us (`copy_range`; 0 unless copy mode is PACKET).
    pub copy_range: u32,
    /// Packets dropped because the queue was full, without fail-open (`queue_dropped`).
    pub queue_dropped: u32,
    /// Packets dropped because our socket's receive buffer was full, without fail-open
    /// (`queue_user_dropped`).
    pub user_dropped: u32,
    /// The last packet id given out (`id_sequence`): packets that reached our socket or were
    /// lost at its full buffer (in both modes).
    pub id_sequence: u32,
}

/// Why a line of `/proc/net/netfilter/nfnetlink_queue` does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("/proc/net/netfilter/nfnetlink_queue:{line}: {what}")]
pub struct ProcError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong, with the offending text.
    pub what: String,
}

/// Parses `/proc/net/netfilter/nfnetlink_queue` (no header; one [`KernelQueue`] per line, 9
/// whitespace-separated decimal columns, the last always 1). Empty lines are skipped.
///
/// Errors: a line with another number of columns or a column that is not a number in range.
pub fn parse_queues(text: &str) -> Result<Vec<KernelQueue>, ProcError> {
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let cols: Vec<&str> = l.split_whitespace().collect();
        if cols.is_empty() {
            continue;
        }
        let bad = |what: String| ProcError { line: i + 1, what };
        if cols.len() != 9 {
            return Err(bad(format!("{} columns, not 9: {l:?}", cols.len())));
        }
        let num = |k: usize| -> Result<u32, ProcError> {
            cols[k]
                .parse::<u32>()
                .map_err(|_| bad(format!("column {}: {:?} is not a number", k + 1, cols[k])))
        };
        let queue = u16::try_from(num(0)?).map_err(|_| bad(format!("queue {}", cols[0])))?;
        let copy_mode = u8::try_from(num(3)?).map_err(|_| bad(format!("copy mode {}", cols[3])))?;
        out.push(KernelQueue {
            queue,
            portid: num(1)?,
            waiting: num(2)?,
            copy_mode,
            copy_range: num(4)?,
            queue_dropped: num(5)?,
            user_dropped: num(6)?,
            id_sequence: num(7)?,
        });
    }
    Ok(out)
}

/// The `Drops` column (`sk_drops`: messages the kernel could not queue on the socket) of the
/// `NETLINK_NETFILTER` socket with port id `portid` in `/proc/net/netlink` text (header `sk Eth
/// Pid Groups Rmem Wmem Dump Locks Drops Inode`); `None` when there is no such socket.
pub fn netlink_drops(text: &str, portid: u32) -> Option<u64> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (eth, pid, drops) = (col("Eth")?, col("Pid")?, col("Drops")?);
    lines.find_map(|l| {
        let c: Vec<&str> = l.split_whitespace().collect();
        let is = c.get(eth) == Some(&"12") // NETLINK_NETFILTER
            && c.get(pid).and_then(|p| p.parse::<u32>().ok()) == Some(portid);
        is.then(|| c.get(drops)?.parse().ok()).flatten()
    })
}

/// Smallest `truesize` we assume of one queued-packet message in our socket's receive buffer:
/// less than any real one (an `sk_buff` alone is over 200 bytes, and `SKB_TRUESIZE` adds the
/// shared info and the data), so `rcvbuf / MIN_TRUESIZE` bounds the messages it can hold.
pub const MIN_TRUESIZE: u32 = 256;

/// The queue length vallumd binds with when `--queue-maxlen` is not given: more than the
/// messages a receive buffer of `rcvbuf` bytes (what `SO_RCVBUF` reads back: the kernel's
/// doubled value, the limit it compares `sk_rmem_alloc` against) can hold, plus the `batch`
/// packets the worker holds while it classifies, so the socket fills before the queue does
/// and every fail-open bypass shows in the socket's drop count.
pub fn auto_maxlen(rcvbuf: u32, batch: u32) -> u32 {
    (rcvbuf / MIN_TRUESIZE)
        .saturating_add(1)
        .saturating_add(batch)
}

/// Our side of one queue, fed by its worker (relaxed atomics: each is a statistic read at
/// scrape time; nothing else is published with them), plus what the worker bound it with.
#[derive(Debug)]
pub struct QueueCounters {
    /// The queue number.
    pub queue: u16,
    /// Bound with `NFQA_CFG_F_FAIL_OPEN`.
    pub fail_open: bool,
    /// The queue length bound with (`NFQA_CFG_QUEUE_MAXLEN`).
    pub maxlen: u32,
    /// The socket's receive buffer, bytes (as `SO_RCVBUF` reads it).
    pub rcvbuf: u32,
    received: AtomicU64,
    accepted: AtomicU64,
    dropped: AtomicU64,
    verdict_errors: AtomicU64,
    receive_errors: AtomicU64,
    ct_disagreed: AtomicU64,
    /// `id_sequence` unwrapped: the high 32 bits count wraps seen by [`QueueCounters::snapshot`].
    ids: std::sync::Mutex<(u32, u64)>,
}

impl QueueCounters {
    /// Counters of queue `queue`, all zero.
    pub fn new(queue: u16, fail_open: bool, maxlen: u32, rcvbuf: u32) -> QueueCounters {
        QueueCounters {
            queue,
            fail_open,
            maxlen,
            rcvbuf,
            received: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            verdict_errors: AtomicU64::new(0),
            receive_errors: AtomicU64::new(0),
            ct_disagreed: AtomicU64::new(0),
            ids: std::sync::Mutex::new((0, 0)),
        }
    }

    /// Whether every fail-open bypass is counted: the queue cannot fill before the socket
    /// (`maxlen >= auto_maxlen(rcvbuf, batch)`), or the queue is fail-closed.
    pub fn bypass_exact(&self, batch: u32) -> bool {
        !self.fail_open || self.maxlen >= auto_maxlen(self.rcvbuf, batch)
    }

    /// `n` packets read from the socket.
    pub fn add_received(&self, n: u64) {
        self.received.fetch_add(n, Ordering::Relaxed);
    }

    /// Verdicts sent: `accepted` packets our rules accepted (NF_ACCEPT, or `--nfqueue-mode
    /// continue`'s NF_REPEAT), `dropped` NF_DROP (REJECT and unparsable packets included);
    /// packets answered NF_REPEAT to be queued again with more bytes copied are neither. When
    /// `sent` is false, the batch's `sendto` failed.
    pub fn add_verdicts(&self, accepted: u64, dropped: u64, sent: bool) {
        if sent {
            self.accepted.fetch_add(accepted, Ordering::Relaxed);
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
        } else {
            self.verdict_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `n` packets whose conntrack state in the kernel (`NFQA_CT_INFO`: NEW, ESTABLISHED or
    /// RELATED) differs from the one vallumd's own table gave them (which decides; see
    /// [`crate::host::sources::nfqueue::ct_disagrees`]).
    pub fn add_ct_disagreed(&self, n: u64) {
        self.ct_disagreed.fetch_add(n, Ordering::Relaxed);
    }

    /// One failed receive (an error other than a timeout or EINTR).
    pub fn add_receive_error(&self) {
        self.receive_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Our counters and, when given, the kernel's line for this queue and our socket's drop
    /// count, joined. Call it at least once per 2^32 packets of the queue, so the id sequence
    /// is unwrapped right.
    pub fn snapshot(&self, kernel: Option<&KernelQueue>, socket_drops: Option<u64>) -> QueueStats {
        let ids = kernel.map(|k| {
            let mut g = self.ids.lock().unwrap_or_else(|p| p.into_inner());
            let (last, high) = &mut *g;
            if k.id_sequence < *last {
                *high += 1 << 32;
            }
            *last = k.id_sequence;
            *high + u64::from(k.id_sequence)
        });
        QueueStats {
            queue: self.queue,
            received: self.received.load(Ordering::Relaxed),
            accepted: self.accepted.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            verdict_errors: self.verdict_errors.load(Ordering::Relaxed),
            receive_errors: self.receive_errors.load(Ordering::Relaxed),
            ct_disagreed: self.ct_disagreed.load(Ordering::Relaxed),
            kernel: kernel.copied(),
            ids,
            socket_drops,
            bypassed: socket_drops.filter(|_| self.fail_open),
        }
    }
}

/// One queue's numbers at one moment: the `vallum_nfqueue_*` series of one `queue` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue number.
    pub queue: u16,
    /// Packets read from the socket (`vallum_nfqueue_received_total`).
    pub received: u64,
    /// NF_ACCEPT verdicts sent (`vallum_nfqueue_verdicts_total{verdict="accept"}`).
    pub accepted: u64,
    /// NF_DROP verdicts sent (`{verdict="drop"}`).
    pub dropped: u64,
    /// Failed verdict sends (`vallum_nfqueue_verdict_send_errors_total`), one per batch.
    pub verdict_errors: u64,
    /// Failed receives (`vallum_nfqueue_receive_errors_total`).
    pub receive_errors: u64,
    /// Packets whose kernel conntrack state differed from ours
    /// (`vallum_nfqueue_ct_state_disagreements_total`).
    pub ct_disagreed: u64,
    /// The kernel's line, when the queue is listed.
    pub kernel: Option<KernelQueue>,
    /// `id_sequence` unwrapped (`vallum_nfqueue_kernel_ids_total`).
    pub ids: Option<u64>,
    /// Our socket's receive drops (`vallum_nfqueue_socket_drops_total`).
    pub socket_drops: Option<u64>,
    /// Packets fail-open accepted without a verdict (`vallum_nfqueue_bypassed_total`): the
    /// socket drops of a fail-open queue; `None` for a fail-closed one.
    pub bypassed: Option<u64>,
}

/// Reads both `/proc` files under `proc` (normally `/proc`) and joins them with `counters`,
/// one [`QueueStats`] per queue. A file that cannot be read or parsed leaves the kernel's
/// side out (`kernel`, `ids`, `socket_drops`, `bypassed` are `None`); the parse error is
/// returned beside the stats, for the caller to log.
pub fn read(
    proc: &std::path::Path,
    counters: &[std::sync::Arc<QueueCounters>],
) -> (Vec<QueueStats>, Option<String>) {
    let mut problem = None;
    let queues = match std::fs::read_to_string(proc.join("net/netfilter/nfnetlink_queue")) {
        Ok(t) => parse_queues(&t).unwrap_or_else(|e| {
            problem = Some(e.to_string());
            Vec::new()
        }),
        Err(e) => {
            problem = Some(format!(
                "{}: {e}",
                proc.join("net/netfilter/nfnetlink_queue").display()
            ));
            Vec::new()
        }
    };
    let netlink = std::fs::read_to_string(proc.join("net/netlink")).unwrap_or_default();
    let stats = counters
        .iter()
        .map(|c| {
            let k = queues.iter().find(|k| k.queue == c.queue);
            let drops = k.and_then(|k| netlink_drops(&netlink, k.portid));
            c.snapshot(k, drops)
        })
        .collect();
    (stats, problem)
}

/// [`read`] for the metrics: the callbacks of one scrape share one reading (taken when the
/// last is older than 200 ms), and a parse problem is logged once per change.
#[derive(Debug)]
pub struct Scraper {
    proc: std::path::PathBuf,
    counters: Vec<std::sync::Arc<QueueCounters>>,
    last: std::sync::Mutex<Option<Reading>>,
}

/// One [`read`]: when, the stats, and the parse problem if any.
type Reading = (std::time::Instant, Vec<QueueStats>, Option<String>);

impl Scraper {
    /// Reads under `proc` (normally `/proc`) for `counters`.
    pub fn new(proc: &std::path::Path, counters: Vec<std::sync::Arc<QueueCounters>>) -> Scraper {
        Scraper {
            proc: proc.to_owned(),
            counters,
            last: std::sync::Mutex::new(None),
        }
    }

    /// The queues' counters (what they were bound with).
    pub fn counters(&self) -> &[std::sync::Arc<QueueCounters>] {
        &self.counters
    }

    /// The stats of every queue, read at most every 200 ms.
    pub fn stats(&self) -> Vec<QueueStats> {
        let mut g = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = g
            .as_ref()
            .is_some_and(|(at, _, _)| at.elapsed() < std::time::Duration::from_millis(200));
        if !fresh {
            let (stats, problem) = read(&self.proc, &self.counters);
            let before = g.as_ref().and_then(|(_, _, p)| p.clone());
            if problem.is_some() && problem != before {
                tracing::warn!(
                    problem = problem.as_deref().unwrap_or_default(),
                    "NFQUEUE kernel counters unreadable: the vallum_nfqueue_* series from the \
                     kernel are left out"
                );
            }
            // Real time: this caches a read of the kernel's NFQUEUE counters (/proc), an I/O
            // edge whose freshness is the kernel's, not the injected clock's.
            *g = Some((std::time::Instant::now(), stats, problem));
        }
        g.as_ref().map(|(_, s, _)| s.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured on Linux 6.18 (`server/tests/it/nfqueue_overload.rs`, fail-closed with
    /// `--queue-maxlen 64` after its flood): vallumd's queues 0 and 1; the third line, a queue 7
    /// of another consumer in metadata mode (copy mode 1, range 0), is written by hand in the
    /// same format.
    const CAPTURED: &str = "    0  24815     0 2 65531 93439     0     6561  1\n\
                            \x20   1 2760775579     0 2 65531     0     0        0  1\n\
                            \x20   7   4242    12 1     0     0     3       15  1\n";

    #[test]
    fn parses_every_column_of_a_captured_file() {
        let q = parse_queues(CAPTURED).unwrap();
        assert_eq!(q.len(), 3);
        assert_eq!(
            q[0],
            KernelQueue {
                queue: 0,
                portid: 24815,
                waiting: 0,
                copy_mode: 2,
                copy_range: 65531,
                queue_dropped: 93439,
                user_dropped: 0,
                id_sequence: 6561,
            }
        );
        assert_eq!(q[1].portid, 2760775579);
        assert_eq!(
            (
                q[2].waiting,
                q[2].copy_mode,
                q[2].user_dropped,
                q[2].id_sequence
            ),
            (12, 1, 3, 15)
        );
        assert_eq!(parse_queues("").unwrap(), vec![]);
    }

    #[test]
    fn bad_lines_name_the_line_and_the_text() {
        let e = parse_queues("    0 1 0 2 65535 0 0 1 1\n    1 2 0 2\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("4 columns, not 9"), "{e}");
        let e = parse_queues("70000 1 0 2 65535 0 0 1 1\n").unwrap_err();
        assert!(e.to_string().contains(":1: queue 70000"), "{e}");
        let e = parse_queues("1 1 0 2 65535 x 0 1 1\n").unwrap_err();
        assert!(e.to_string().contains("column 6: \"x\""), "{e}");
    }

    /// `/proc/net/netlink` with the header Linux 6.18 prints (captured) and two lines written
    /// by hand in its format: our NETLINK_NETFILTER (12) socket with 17 drops, and a route (0)
    /// socket with the same port id.
    const NETLINK: &str = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
        00000000d544b6b2 0   3812540112 00000000 0        0        0     2        5        4\n\
        00000000ea56557b 12  3812540112 00000000 212992   0        0     2        17       565\n";

    #[test]
    fn socket_drops_by_port_id() {
        assert_eq!(netlink_drops(NETLINK, 3812540112), Some(17));
        assert_eq!(netlink_drops(NETLINK, 1), None);
        assert_eq!(netlink_drops("", 1), None);
    }

    #[test]
    fn snapshot_unwraps_ids_and_counts_bypass_only_when_fail_open() {
        let open = QueueCounters::new(0, true, auto_maxlen(1 << 24, 32), 1 << 24);
        assert!(open.bypass_exact(32));
        assert!(!QueueCounters::new(0, true, 64, 1 << 24).bypass_exact(32));
        assert!(QueueCounters::new(0, false, 64, 1 << 24).bypass_exact(32));
        open.add_received(10);
        open.add_verdicts(7, 3, true);
        open.add_verdicts(5, 0, false);
        let mut k = parse_queues(CAPTURED).unwrap()[0];
        k.id_sequence = u32::MAX - 1;
        let s = open.snapshot(Some(&k), Some(4));
        assert_eq!(s.ids, Some(u64::from(u32::MAX - 1)));
        assert_eq!((s.received, s.accepted, s.dropped), (10, 7, 3));
        assert_eq!((s.verdict_errors, s.bypassed), (1, Some(4)));
        k.id_sequence = 5;
        assert_eq!(open.snapshot(Some(&k), Some(4)).ids, Some((1 << 32) + 5));
        let closed = QueueCounters::new(1, false, 64, 1 << 24);
        assert_eq!(closed.snapshot(Some(&k), Some(4)).bypassed, None);
        assert_eq!(closed.snapshot(None, None).kernel, None);
    }

    #[test]
    fn auto_maxlen_exceeds_what_the_buffer_holds() {
        // 8 MiB asked with SO_RCVBUFFORCE reads back doubled: 16 MiB.
        assert_eq!(auto_maxlen(16 << 20, 32), 65536 + 1 + 32);
        assert_eq!(auto_maxlen(u32::MAX, u32::MAX), u32::MAX);
    }
}
