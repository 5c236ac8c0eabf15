//! The packet path of one core, read top to bottom in two functions of this file:
//! [`EngineWorker::process`] takes a [`Batch`] of parsed packets (a source parsed them:
//! `crate::packet::parse`, NFQUEUE in the server) to its verdicts, and
//! [`Snapshot::classify_batch`],
//! the one classify entry, is its loop over the packets. Each step is a call into the module
//! that owns it, which returns here:
//!
//! 1. **enter the batch** ([`crate::dataplane::Worker::enter`], `dataplane.rs`): the core's
//!    generation goes odd, the active [`Snapshot`] is loaded (the commit protocol's reader
//!    side);
//! 2. **skip cut packets**: a packet whose copied bytes end before what the snapshot's rules
//!    read ([`Snapshot::copy_range`]) is left for the source to fetch again;
//! 3. **index probe** (`Snapshot::probe`, `eval.rs`) of each group of [`CLASSIFY_BATCH`]
//!    packets, their memory accesses interleaved;
//! 4. per packet, **the raw-table chains** (`Snapshot::walk_raw`, `eval.rs`): the chain
//!    walk up to conntrack's lookup;
//! 5. **conntrack's lookup** ([`Track::lookup`], `conntrack/step.rs`; [`Tracker`] is the
//!    value this worker holds);
//! 6. **the other chains** (`Snapshot::walk_rest`, `eval.rs`);
//! 7. **confirm** ([`Track::decided`], `conntrack/step.rs`), before the next packet's walk;
//! 8. **count the verdicts** per (family, hook, verdict) on this core;
//! 9. **leave the batch** (generation even).
//!
//! With a shadow in the engine's slot (loaded once per batch after step 1; without one, the
//! run takes the branch above and nothing else changes), steps 3-7 of each run go through
//! `ShadowBuf::run` below: the packets are copied, classified with the active snapshot as
//! above while conntrack's answers are recorded, then the copies are classified with the
//! shadow's snapshot, and each packet is counted by its (active, shadow) verdict pair
//! (`engine/shadow.rs`, its module docs). The packets and their verdicts are the active
//! snapshot's.
//!
//! A `-j LOG` hit is copied into the worker's ring by the walk (the ring's sink is beside
//! the walk in `eval.rs`) and waits there for [`EngineWorker::drain_logs`], off the packet
//! path.

use std::sync::atomic::{AtomicU64, Ordering};

use super::shadow::{CtSeen, NoLogs, PairCounts, Recording, Replay, Shadow, ShadowSlot};
use crate::conntrack::{Conntrack, NoTracking, Track, Tracker};
use crate::dataplane::{Dataplane, Worker};
use crate::eval::Hint;
use crate::model::CtZone;
use crate::model::{Family, Hook};
use crate::packet::{Packet, PacketFacts, PacketMeta};
use crate::snapshot::{CLASSIFY_BATCH, LogEvent, LogRecord, LogRing, LogSink, Snapshot, Verdict};

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
    /// The engine's shadow slot ([`super::shadow`]).
    shadow: &'a ShadowSlot,
    /// The copies a shadow classifies (empty until the first batch with a shadow).
    shadow_buf: ShadowBuf,
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
        shadow: &'a ShadowSlot,
    ) -> EngineWorker<'a> {
        EngineWorker {
            inner,
            dataplane,
            verdicts,
            logs: LogRing::with_capacity(LOG_RING_CAPACITY),
            logs_stale: 0,
            tracker: conntrack.map(Tracker::new),
            shadow,
            shadow_buf: ShadowBuf::default(),
        }
    }
}

impl EngineWorker<'_> {
    /// The core index.
    pub fn core(&self) -> usize {
        self.inner.core()
    }

    /// Takes one batch to its verdicts (module docs: steps 1-9) at time `now_ns`, in one
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
        // Step 1: enter the batch (the generation goes odd until `batch` is dropped).
        let batch = self.inner.enter();
        let snap = batch.snapshot();
        // The shadow, if any, loaded inside the batch (after its generation store and reader
        // barrier): one load and one predictable branch per batch without one.
        let shadow = self.shadow.load();
        // Step 2: which packets were cut short of what the rules read.
        let range = snap.copy_range();
        let short = |i: usize| {
            cut.get(i).copied().unwrap_or(false)
                && bytes.get(i).map_or(0, |b| b.len()) < range as usize
        };
        for (i, s) in skipped.iter_mut().enumerate().take(n) {
            *s = short(i);
        }
        // Steps 3 to 7 for each run between skipped packets (one run, the whole batch, when
        // none is), then step 8: count its verdicts.
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
            let fs =
                (facts.get_mut(start.min(facts.len())..end.min(facts.len()))).unwrap_or(&mut []);
            let core = batch.core();
            let logs = &mut self.logs;
            if shadow.is_null() {
                match &mut self.tracker {
                    Some(t) => snap.classify_batch(core, ps, fs, vs, now_ns, logs, run_bytes, t),
                    None => {
                        let t = &mut NoTracking;
                        snap.classify_batch(core, ps, fs, vs, now_ns, logs, run_bytes, t)
                    }
                };
            } else {
                // SAFETY: `shadow` was loaded inside this batch, after its odd generation
                // store and reader barrier, and the batch is still open (`batch` lives until
                // step 9). The slot's writer clears the pointer and waits for the quiescence
                // grace of this dataplane before it drops the shadow (`ShadowSlot::replace`),
                // so by Claims A and B of `crate::dataplane` the shadow outlives this batch.
                let sh = unsafe { &*shadow };
                let run = ShadowRun {
                    snap,
                    core,
                    now: now_ns,
                    bytes: run_bytes,
                };
                match &mut self.tracker {
                    Some(t) => self.shadow_buf.run(sh, run, ps, fs, vs, logs, t),
                    None => self
                        .shadow_buf
                        .run(sh, run, ps, fs, vs, logs, &mut NoTracking),
                }
            }
            for (p, &v) in ps.iter().zip(vs.iter()) {
                self.verdicts.count(p, v);
            }
            classified += end - start;
            start = end;
        }
        batch.add_packets(classified as u64);
        // Step 9: leave the batch (generation even).
        drop(batch);
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

// === impl ShadowBuf: a batch beside a shadow ===

/// What one run of a batch is classified with, besides its packets.
struct ShadowRun<'s> {
    snap: &'s Snapshot,
    core: usize,
    now: u64,
    bytes: &'s [&'s [u8]],
}

/// The copies of a batch the shadow classifies ([`super::shadow`] module docs, steps 1-4);
/// they grow to the largest batch once and are reused.
#[derive(Default)]
struct ShadowBuf {
    /// The packets as the source parsed them.
    metas: Vec<PacketMeta>,
    /// The copies the shadow's walk changes.
    work: Vec<PacketMeta>,
    /// The facts' `ct_zone` as the source gave it (the only field of the facts a walk
    /// writes, with `-j CT`), then as the active walk left it: the shadow walks the batch's
    /// own facts with the first, and the batch gets the second back.
    zones: Vec<Option<CtZone>>,
    active_zones: Vec<Option<CtZone>>,
    verdicts: Vec<Verdict>,
    /// What the active lookup gave each packet.
    seen: Vec<CtSeen>,
}

impl ShadowBuf {
    /// Classifies a run with the active snapshot (as without a shadow, its tracker recording
    /// what conntrack gave) and again with the shadow's, then counts each packet's pair.
    #[allow(clippy::too_many_arguments)] // a run's inputs, as `process` has them
    #[inline(never)] // off the batch loop's code when no shadow runs
    fn run<'t, T: Track<'t>>(
        &mut self,
        sh: &Shadow,
        run: ShadowRun<'_>,
        ps: &mut [PacketMeta],
        fs: &mut [PacketFacts],
        vs: &mut [Verdict],
        logs: &mut LogRing,
        track: &mut T,
    ) {
        let ShadowRun {
            snap,
            core,
            now,
            bytes,
        } = run;
        let n = ps.len().min(vs.len());
        let fs_len = fs.len().min(n);
        let fs = &mut fs[..fs_len];
        // Step 1: the packets as parsed.
        self.metas.clear();
        self.metas.extend_from_slice(&ps[..n]);
        self.zones.clear();
        self.zones.extend(fs.iter().map(|f| f.ct_zone));
        // Step 2: the active classification, recording conntrack's answers.
        self.seen.clear();
        let table = track.table();
        let mut rec = Recording {
            inner: track,
            seen: &mut self.seen,
            cur: CtSeen::default(),
        };
        snap.classify_batch(core, ps, fs, vs, now, logs, bytes, &mut rec);
        // Step 3: the shadow's, on copies of the packets and on the facts as they came,
        // replaying conntrack.
        self.work.clear();
        self.work.extend_from_slice(&self.metas);
        self.active_zones.clear();
        for (f, &z) in fs.iter_mut().zip(&self.zones) {
            self.active_zones.push(std::mem::replace(&mut f.ct_zone, z));
        }
        self.verdicts.clear();
        self.verdicts.resize(n, Verdict::Accept);
        let mut replay = Replay {
            seen: &self.seen,
            i: 0,
            table,
        };
        let (work, sv) = (&mut self.work, &mut self.verdicts);
        sh.snapshot
            .classify_batch(core, work, fs, sv, now, &mut NoLogs, bytes, &mut replay);
        // Step 4: count, then give the batch its facts back as the active walk left them.
        let mut pairs = PairCounts::default();
        for (i, (&av, &sv)) in vs.iter().zip(&self.verdicts).enumerate().take(n) {
            if pairs.count(self.metas[i].len, av, sv) {
                let mut meta = self.metas[i];
                if let Some(s) = self.seen.get(i) {
                    s.apply(&mut meta);
                }
                let mut facts = fs.get(i).copied().unwrap_or(PacketFacts::NONE);
                facts.ct_zone = self.zones.get(i).copied().flatten();
                let packet = Packet { meta, facts };
                sh.differing(core, &packet, av, sv, now);
            }
        }
        sh.add(core, &pairs);
        for (f, &z) in fs.iter_mut().zip(&self.active_zones) {
            f.ct_zone = z;
        }
    }
}

// === impl Snapshot: the classify loop ===

impl Snapshot {
    /// Classifies `packets` on `core` at `now`, each in order, with connection tracking by
    /// `track`, counting every matched rule and applied policy in that core's counters and
    /// handing `-j LOG` hits to `logs` ([`LogSink`]), and writes each verdict into
    /// `verdicts` (same index); processes `min(packets.len(), verdicts.len())` packets and
    /// returns that number. Counters, LOG events, `-m limit` tokens and `ct_state` come out
    /// exactly as from classifying the packets one by one (a slice of one is that).
    /// Allocates nothing, unless the sink does (`Vec<LogEvent>` does; [`LogRing`] does not).
    /// `core` must be below [`Snapshot::cores`]; a larger index is folded onto the last core.
    ///
    /// The one classify entry: [`EngineWorker::process`] calls it for each run of its batch;
    /// tools, tests and benches call it with a snapshot of their own (a slice of one packet
    /// classifies one). [`Snapshot::trace`] walks the same steps 4 to 6 with a recording
    /// observer. For each group of [`CLASSIFY_BATCH`] packets, the steps of the module docs:
    /// 3. **index probe** (`Snapshot::probe`, `eval.rs`) of the whole group;
    ///
    /// then per packet, each step a call that returns here:
    /// 4. **raw chains** (`Snapshot::walk_raw`, `eval.rs`): the chain walk up to conntrack;
    /// 5. **conntrack lookup** ([`Track::lookup`], `conntrack/step.rs`);
    /// 6. **the other chains** (`Snapshot::walk_rest`, `eval.rs`), the probed chain
    ///    starting from the probe's answer;
    /// 7. **confirm** ([`Track::decided`], `conntrack/step.rs`) with the verdict, before
    ///    the next packet's walk, so each packet sees what the earlier ones left.
    ///
    /// `bytes[i]` is packet `i` from its network header on, which `-m string` searches (a
    /// packet beyond the slice has none: `--string` is false for it); `-m connlimit` counts
    /// in [`Track::table`]. Pass `&[]` and [`NoTracking`] for neither. `facts[i]` is the
    /// cold part of packet `i` ([`PacketFacts`]), read only by the matches and targets that
    /// use it (and written by `-j CT`); a packet beyond the slice is classified with
    /// [`PacketFacts::NONE`] (nothing known: no interfaces, no options), so sources without
    /// facts pass `&mut []`.
    ///
    /// Defined here, not in `eval.rs`, because it is the worker's loop: the packet path
    /// reads top to bottom in this file.
    #[allow(clippy::too_many_arguments)] // the loop's inputs, as a source and the tools have them
    pub fn classify_batch<'t>(
        &self,
        core: usize,
        packets: &mut [PacketMeta],
        facts: &mut [PacketFacts],
        verdicts: &mut [Verdict],
        now: u64,
        logs: &mut (impl LogSink + ?Sized),
        bytes: &[&[u8]],
        track: &mut impl Track<'t>,
    ) -> usize {
        let n = packets.len().min(verdicts.len());
        let mut obs = self.counting(core, track.table(), logs);
        let mut hints = [Hint::NONE; CLASSIFY_BATCH];
        // The facts of packets beyond `facts` (reset for each).
        let mut none = PacketFacts::NONE;
        let mut lo = 0;
        while lo < n {
            let hi = (lo + CLASSIFY_BATCH).min(n);
            let fs = facts
                .get(lo.min(facts.len())..hi.min(facts.len()))
                .unwrap_or(&[]);
            // Step 3: the index probe of the group.
            self.probe(&packets[lo..hi], fs, now, &obs, &mut hints);
            for (i, &hint) in (lo..hi).zip(&hints) {
                let p = &mut packets[i];
                let f = match facts.get_mut(i) {
                    Some(f) => f,
                    None => {
                        // The walk writes only the zone (`-j CT`) into the facts (the
                        // output interface it hides at PREROUTING comes back).
                        none.ct_zone = None;
                        debug_assert_eq!(none, PacketFacts::NONE);
                        &mut none
                    }
                };
                obs.set_payload(bytes.get(i).copied().unwrap_or(&[]));
                // Step 4: the raw-table chains (`Err`: a final verdict there).
                let v = match self.walk_raw(p, f, now, &mut obs, hint) {
                    Err(v) => v,
                    Ok(walk) => {
                        // Step 5: conntrack's lookup (netfilter priority -200).
                        let ct = track.lookup(p, f, now);
                        // Step 6: the other chains.
                        self.walk_rest(walk, ct, p, f, now, &mut obs, hint)
                    }
                };
                // Step 7: confirm.
                verdicts[i] = track.decided(p, f, v, now);
            }
            lo = hi;
        }
        n
    }
}
