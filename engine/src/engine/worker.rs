//! The packet path of one core: [`EngineWorker::process`] takes a [`Batch`] of parsed packets
//! (a source parsed them: `crate::packet::parse`, NFQUEUE in the server) to its verdicts, in
//! named steps a reader follows top to bottom:
//!
//! 1. **enter the batch** ([`crate::dataplane::Worker::batch`]): the core's generation goes
//!    odd, the active [`Snapshot`] is loaded (the commit protocol's reader side);
//! 2. **skip cut packets**: a packet whose copied bytes end before what the snapshot's rules
//!    read ([`Snapshot::copy_range`]) is left for the source to fetch again;
//! 3. **classify** each run of the other packets with [`Snapshot::classify_batch`]
//!    (`eval.rs`): the batched index probe, then per packet the chain walk with
//!    conntrack's lookup between the raw and the other chains and its confirmation after the
//!    verdict ([`Tracker`], `conntrack/step.rs`, the value this worker holds);
//! 4. **count the verdicts** per (family, hook, verdict) on this core;
//! 5. **leave the batch** (generation even). `-j LOG` hits wait in the worker's ring for
//!    [`EngineWorker::drain_logs`], off the packet path.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::conntrack::{Conntrack, NoTracking, Tracker};
use crate::dataplane::{Dataplane, Worker};
use crate::model::{Family, Hook};
use crate::packet::{PacketFacts, PacketMeta};
use crate::snapshot::{LogEvent, LogRecord, LogRing, Snapshot, Verdict};

/// How many `-j LOG` hits an [`EngineWorker`] keeps between two drains
/// ([`EngineWorker::drain_logs`]); further hits are counted in [`LogDrops::full`].
pub const LOG_RING_CAPACITY: usize = 1024;

/// `-j LOG` hits an [`EngineWorker`] did not hand out, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogDrops {
    /// The worker's ring was full ([`LOG_RING_CAPACITY`] hits since the last drain).
    pub full: u64,
    /// A commit replaced the snapshot the hit happened in before [`EngineWorker::drain_logs`]
    /// could name its rule.
    pub stale: u64,
}

/// Verdict counters of one core: `[family][hook][verdict]`, one writer (the core).
#[repr(align(128))]
#[derive(Default)]
pub(super) struct VerdictCounts([[[AtomicU64; 3]; 5]; 2]);

impl VerdictCounts {
    /// Counts packet `p`'s verdict `v`. Single writer per core: Relaxed load + store, no
    /// shared RMW.
    #[inline]
    fn count(&self, p: &PacketMeta, v: Verdict) {
        let fi = match p.family {
            Family::Ipv4 => 0,
            Family::Ipv6 => 1,
        };
        let vi = match v {
            Verdict::Accept => 0,
            Verdict::Drop => 1,
            Verdict::Reject(_) => 2,
        };
        let c = &self.0[fi][p.hook.index()][vi];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// The count of family index `fi` (0 IPv4, 1 IPv6), `hook`, verdict index `vi` (ACCEPT,
    /// DROP, REJECT). Relaxed: a statistic, orders nothing.
    pub(super) fn get(&self, fi: usize, hook: Hook, vi: usize) -> u64 {
        self.0[fi][hook.index()][vi].load(Ordering::Relaxed)
    }
}

/// One batch as a source hands it to [`EngineWorker::process`]: the parsed packets, the
/// verdicts to fill (same index; `min` of the two lengths is processed) and, optionally, the
/// packets' bytes and whether the source copied them whole.
#[derive(Debug)]
pub struct Batch<'a> {
    /// The packets; each comes back with the `ct_state` the non-raw chains saw, and the marks
    /// the rules set.
    pub packets: &'a mut [PacketMeta],
    /// `facts[i]` is the cold part of packet `i` ([`PacketFacts`]), filled by the source with
    /// the packet; the walk reads it only in the matches that use it. A packet beyond the
    /// slice has none known ([`PacketFacts::NONE`]): `&mut []` for sources without facts.
    pub facts: &'a mut [PacketFacts],
    /// One verdict per packet (a skipped packet's is left as it was).
    pub verdicts: &'a mut [Verdict],
    /// `bytes[i]` is packet `i` from its network (IP) header on, which `-m string` searches (a
    /// packet without bytes has none: `--string` is false for it). NFQUEUE's payload.
    pub bytes: &'a [&'a [u8]],
    /// `cut[i]`: `bytes[i]` ends before packet `i` does (NFQUEUE's copy range; absent: false).
    pub cut: &'a [bool],
    /// Written for the indexes it has: set where a cut packet was not classified (step 2 of
    /// the module docs), clear where it was.
    pub skipped: &'a mut [bool],
}

impl<'a> Batch<'a> {
    /// A batch of packets without bytes (none cut) and without facts.
    pub fn new(packets: &'a mut [PacketMeta], verdicts: &'a mut [Verdict]) -> Batch<'a> {
        Batch {
            packets,
            facts: &mut [],
            verdicts,
            bytes: &[],
            cut: &[],
            skipped: &mut [],
        }
    }
}

/// A worker's handle on one core: classifies batches of packets against the active snapshot.
pub struct EngineWorker<'a> {
    inner: Worker<'a, Snapshot>,
    dataplane: &'a Dataplane<Snapshot>,
    verdicts: &'a VerdictCounts,
    /// This core's `-j LOG` hits (fixed capacity, allocated once).
    logs: LogRing,
    logs_stale: u64,
    /// Conntrack's steps for this core's packets; `None` when conntrack is off.
    tracker: Option<Tracker<'a>>,
}

impl std::fmt::Debug for EngineWorker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineWorker")
            .field("core", &self.inner.core())
            .finish_non_exhaustive()
    }
}

impl<'a> EngineWorker<'a> {
    /// The worker of a claimed core (`Engine::worker`).
    pub(super) fn new(
        inner: Worker<'a, Snapshot>,
        dataplane: &'a Dataplane<Snapshot>,
        verdicts: &'a VerdictCounts,
        conntrack: Option<&'a Conntrack>,
    ) -> EngineWorker<'a> {
        EngineWorker {
            inner,
            dataplane,
            verdicts,
            logs: LogRing::with_capacity(LOG_RING_CAPACITY),
            logs_stale: 0,
            tracker: conntrack.map(Tracker::new),
        }
    }
}

impl EngineWorker<'_> {
    /// The core index.
    pub fn core(&self) -> usize {
        self.inner.core()
    }

    /// Takes one batch to its verdicts (module docs: steps 1-5) at time `now_ns`, in one
    /// generation-counter round trip. The verdicts are those of classifying the packets one
    /// by one, in order (the index probes of the batch's packets overlap). Each packet comes
    /// back with the `ct_state` the non-raw chains saw: UNTRACKED when raw-table rules said
    /// NOTRACK, else the tracker's (`crate::engine` docs, "Conntrack"; unchanged when conntrack
    /// is off). `-j LOG` hits are kept in the worker's fixed-capacity ring until
    /// [`EngineWorker::drain_logs`] or [`EngineWorker::drain_log_records`] (no allocation per
    /// hit; hits beyond [`LOG_RING_CAPACITY`] are counted in [`EngineWorker::log_drops`]).
    ///
    /// A cut packet (`batch.cut[i]`) whose bytes end before what the rules of this batch's
    /// snapshot can read ([`Snapshot::copy_range`]) is not classified: no counter, no
    /// conntrack, its verdict left as it was, and `batch.skipped[i]` set (the source must get
    /// the packet again with more bytes: NFQUEUE's `NF_REPEAT` once the copy range is
    /// raised). Returns the number of packets looked at (`min(packets, verdicts)`) and the
    /// snapshot's copy range, so the source can follow a commit that changed it.
    pub fn process(&mut self, batch: Batch<'_>, now_ns: u64) -> (usize, u32) {
        let Batch {
            packets,
            facts,
            verdicts,
            bytes,
            cut,
            skipped,
        } = batch;
        let n = packets.len().min(verdicts.len());
        // One epoch pin for the whole batch: the per-packet pins inside the lookups nest.
        let _pin = self.tracker.as_ref().map(|t| t.conntrack().pin());
        let (logs, counts, tracker) = (&mut self.logs, self.verdicts, &mut self.tracker);
        // Step 1: enter the batch.
        let range = self.inner.batch(|snap, batch| {
            // Step 2: which packets were cut short of what the rules read.
            let range = snap.copy_range();
            let short = |i: usize| {
                cut.get(i).copied().unwrap_or(false)
                    && bytes.get(i).map_or(0, |b| b.len()) < range as usize
            };
            for (i, s) in skipped.iter_mut().enumerate().take(n) {
                *s = short(i);
            }
            // Step 3: classify each run between skipped packets (one run, the whole batch,
            // when none is), then step 4: count its verdicts.
            let mut classified = 0;
            let mut start = 0;
            while start < n {
                if short(start) {
                    start += 1;
                    continue;
                }
                let end = (start + 1..n).find(|&i| short(i)).unwrap_or(n);
                let run_bytes = bytes
                    .get(start.min(bytes.len())..end.min(bytes.len()))
                    .unwrap_or(&[]);
                let (ps, vs) = (&mut packets[start..end], &mut verdicts[start..end]);
                let fs = (facts.get_mut(start.min(facts.len())..end.min(facts.len())))
                    .unwrap_or(&mut []);
                let core = batch.core();
                match tracker {
                    Some(t) => snap.classify_batch(core, ps, fs, vs, now_ns, logs, run_bytes, t),
                    None => snap.classify_batch(
                        core,
                        ps,
                        fs,
                        vs,
                        now_ns,
                        logs,
                        run_bytes,
                        &mut NoTracking,
                    ),
                };
                for (p, &v) in ps.iter().zip(vs.iter()) {
                    counts.count(p, v);
                }
                classified += end - start;
                start = end;
            }
            batch.add_packets(classified as u64);
            // Step 5: leave the batch (when this closure returns).
            range
        });
        (n, range)
    }

    /// [`EngineWorker::process`] of a batch without bytes: shorthand for
    /// `process(Batch::new(packets, verdicts), now_ns).0`.
    pub fn process_batch(
        &mut self,
        packets: &mut [PacketMeta],
        verdicts: &mut [Verdict],
        now_ns: u64,
    ) -> usize {
        self.process(Batch::new(packets, verdicts), now_ns).0
    }

    /// The `-j LOG` hits since the last drain, as events naming their rule (ruleset, table,
    /// chain, number, prefix), oldest first; empties the ring. Off the packet path: it
    /// allocates the events and resolves them on the active snapshot under the commit lock
    /// ([`Dataplane::with_active`]; nothing when the ring is empty). A hit whose snapshot a
    /// commit replaced meanwhile cannot be named and is counted in [`LogDrops::stale`].
    pub fn drain_logs(&mut self) -> Vec<LogEvent> {
        if self.logs.is_empty() {
            return Vec::new();
        }
        let logs = &mut self.logs;
        let (events, stale) = self.dataplane.with_active(|snap| {
            let records = logs.drain();
            let n = records.len();
            let events: Vec<LogEvent> = records.filter_map(|r| snap.log_event(&r)).collect();
            let stale = (n - events.len()) as u64;
            (events, stale)
        });
        self.logs_stale += stale;
        events
    }

    /// The `-j LOG` hits since the last drain as records (indices into their snapshot and
    /// the packet; `Engine::log_event` names them), oldest first, without allocating;
    /// empties the ring.
    pub fn drain_log_records(&mut self) -> impl ExactSizeIterator<Item = LogRecord> + '_ {
        self.logs.drain()
    }

    /// The `-j LOG` hits this worker did not hand out.
    pub fn log_drops(&self) -> LogDrops {
        LogDrops {
            full: self.logs.dropped(),
            stale: self.logs_stale,
        }
    }
}
