//! Shadow evaluation: a staged revision of one ruleset classifies the live packets beside the
//! active snapshot, and what it would have decided is counted, never applied.
//!
//! [`Engine::start_shadow`](super::Engine::start_shadow) compiles the active rulesets with the
//! staged ruleset in its name's place into a [`Snapshot`] of its own (a from-scratch compile:
//! its own counter cells, so its per-rule counters count only what the shadow matched, and its
//! own `-m limit` buckets and `-m recent` lists, which start empty) and publishes it in the
//! engine's one shadow slot. A worker whose batch finds a shadow there (one load and one
//! predictable branch per batch, after the batch's generation store and reader barrier: the
//! commit protocol's reader side of `crate::dataplane`, which covers any pointer loaded in a
//! batch) classifies each packet twice (`worker.rs`):
//!
//! 1. it copies the packets and their facts as the source parsed them;
//! 2. it classifies them with the active snapshot as always, recording for each packet the
//!    conntrack facts (`ct_state`, `ct_mark`, `ct_reply`) the lookup gave ([`Recording`]);
//! 3. it classifies the copies with the shadow snapshot, whose conntrack step replays what
//!    was recorded ([`Replay`]): the shadow sees the connection state the active rules
//!    produced, and nothing is tracked or confirmed twice. A packet the active raw chains
//!    decided before conntrack's lookup gets a look at the table that changes nothing
//!    ([`Conntrack::peek_into`]). The shadow's `-m connlimit` counts only the packet's own
//!    connection (it is given no table, so it cannot add to the active lists), its LOG hits
//!    are not kept, and its marks stay in the copies: nothing it decides reaches the packet;
//! 4. it counts each packet by (active verdict, shadow verdict) on its core, and a packet whose
//!    verdicts differ in its flow's row of the core's bounded flow table ([`ShadowConfig`]).
//!
//! Retiring a shadow (a new one, [`Engine::end_shadow`](super::Engine::end_shadow), or a
//! publish, which ends it) clears the slot, then runs the writer's half of the protocol
//! ([`Quiescence::start`] and [`Quiescence::wait`]): after that no batch can hold it, and its
//! report is read from the retired shadow.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::conntrack::{Conntrack, Track};
use crate::dataplane::{Backoff, Quiescence};
use crate::eval::{StepOutcome, TraceStep};
use crate::model::{Family, Ruleset};
use crate::packet::{Packet, PacketFacts, PacketMeta};
use crate::sets::SetRegistry;
use crate::snapshot::{LogHit, LogSink, SlotCounters, Snapshot, Verdict};
use crate::sync::{AtomicPtr, Ordering as SyncOrdering};

use super::{Change, CommitError, Engine, WithFacts};

/// The flows a shadow keeps per core by default ([`ShadowConfig::max_flows`]).
pub const DEFAULT_SHADOW_FLOWS: usize = 1024;

/// The differing packets a shadow keeps per core between two drains
/// ([`Engine::drain_shadow_samples`](super::Engine::drain_shadow_samples)).
pub const SHADOW_SAMPLE_CAPACITY: usize = 256;

/// How a shadow reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShadowConfig {
    /// Rows of each core's table of flows whose verdict differs (the first flows seen; a
    /// differing packet of a flow that finds the table full is counted in
    /// [`ShadowReport::overflow_packets`]). The table is allocated with this room when the
    /// shadow starts; at most 1 << 20.
    pub max_flows: usize,
    /// Keep every `sample`-th differing packet of a core as a [`ShadowSample`] (0: none).
    pub sample: u32,
}

impl Default for ShadowConfig {
    fn default() -> Self {
        ShadowConfig {
            max_flows: DEFAULT_SHADOW_FLOWS,
            sample: 1,
        }
    }
}

/// The largest [`ShadowConfig::max_flows`].
pub const MAX_SHADOW_FLOWS: usize = 1 << 20;

/// A flow as the shadow's table keys it: the 5-tuple and the input interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FlowKey {
    family: Family,
    src: IpAddr,
    dst: IpAddr,
    protocol: u8,
    sport: u16,
    dport: u16,
    in_iface: crate::packet::IfName,
}

struct FlowRow {
    packets: u64,
    bytes: u64,
    first_ns: u64,
    last_ns: u64,
    active: Verdict,
    shadow: Verdict,
    /// The flow's first differing packet as the shadow classified it (the conntrack facts of
    /// the active lookup included), traced for the rule paths when the report is made.
    first: Packet,
}

struct FlowTable {
    /// FxHash: the key is a fixed-size tuple, hashed on the packet path (differing packets).
    rows: rustc_hash::FxHashMap<FlowKey, FlowRow>,
    cap: usize,
    overflow_packets: u64,
    overflow_bytes: u64,
}

/// The differing packets kept for sampling, at most [`SHADOW_SAMPLE_CAPACITY`] per core.
struct SampleRing {
    samples: Vec<ShadowSample>,
    dropped: u64,
}

/// Verdict index: ACCEPT 0, DROP 1, REJECT 2.
fn vi(v: Verdict) -> usize {
    match v {
        Verdict::Accept => 0,
        Verdict::Drop => 1,
        Verdict::Reject(_) => 2,
    }
}

const VERDICT_NAMES: [&str; 3] = ["ACCEPT", "DROP", "REJECT"];

/// One run's packets and bytes by `[active][shadow]` verdict, added to the core's once
/// ([`Shadow::add`]).
#[derive(Default)]
pub(crate) struct PairCounts {
    packets: [[u64; 3]; 3],
    bytes: [[u64; 3]; 3],
}

impl PairCounts {
    /// Counts a packet of `len` bytes; true when its verdicts differ (ACCEPT, DROP or
    /// REJECT: two REJECTs with different answers are the same).
    #[inline]
    pub(crate) fn count(&mut self, len: u32, active: Verdict, shadow: Verdict) -> bool {
        let (a, s) = (vi(active), vi(shadow));
        self.packets[a][s] += 1;
        self.bytes[a][s] += u64::from(len);
        a != s
    }
}

/// One core's shadow statistics. The pair counters have one writer (the core): Relaxed load +
/// store; the tables are behind a mutex no other core takes on the packet path (reports take
/// it briefly).
#[repr(align(128))]
struct ShadowCore {
    /// `[active][shadow]` packets and bytes.
    packets: [[AtomicU64; 3]; 3],
    bytes: [[AtomicU64; 3]; 3],
    /// Differing packets seen, for sampling.
    differing: AtomicU64,
    flows: Mutex<FlowTable>,
    samples: Mutex<SampleRing>,
}

/// A staged revision classifying beside the active snapshot (module docs).
pub(crate) struct Shadow {
    pub(crate) ruleset: String,
    pub(crate) revision: u64,
    pub(crate) started_ns: u64,
    pub(crate) snapshot: Snapshot,
    config: ShadowConfig,
    cores: Box<[ShadowCore]>,
}

impl Shadow {
    pub(crate) fn new(
        ruleset: String,
        revision: u64,
        started_ns: u64,
        snapshot: Snapshot,
        config: ShadowConfig,
    ) -> Shadow {
        let cap = config.max_flows.min(MAX_SHADOW_FLOWS);
        let cores = (0..snapshot.cores())
            .map(|_| ShadowCore {
                packets: Default::default(),
                bytes: Default::default(),
                differing: AtomicU64::new(0),
                flows: Mutex::new(FlowTable {
                    rows: rustc_hash::FxHashMap::with_capacity_and_hasher(cap, Default::default()),
                    cap,
                    overflow_packets: 0,
                    overflow_bytes: 0,
                }),
                samples: Mutex::new(SampleRing {
                    samples: Vec::with_capacity(if config.sample > 0 {
                        SHADOW_SAMPLE_CAPACITY
                    } else {
                        0
                    }),
                    dropped: 0,
                }),
            })
            .collect();
        Shadow {
            ruleset,
            revision,
            started_ns,
            snapshot,
            config: ShadowConfig {
                max_flows: cap,
                ..config
            },
            cores,
        }
    }

    /// Adds a run's pair counts to `core`'s (below the snapshot's cores; a larger index
    /// folds onto the last).
    #[inline]
    pub(crate) fn add(&self, core: usize, run: &PairCounts) {
        let c = &self.cores[core.min(self.cores.len() - 1)];
        // One writer per core: Relaxed load + store, no RMW (a statistic, orders nothing).
        let bump = |x: &AtomicU64, by: u64| {
            if by > 0 {
                x.store(x.load(Ordering::Relaxed) + by, Ordering::Relaxed)
            }
        };
        for a in 0..3 {
            for s in 0..3 {
                bump(&c.packets[a][s], run.packets[a][s]);
                bump(&c.bytes[a][s], run.bytes[a][s]);
            }
        }
    }

    /// Counts a differing packet in its flow's row and, every [`ShadowConfig::sample`]-th,
    /// keeps it as a sample. `first` is the packet as the source parsed it, with the
    /// conntrack facts the active lookup gave. Allocates nothing: the flow table and the
    /// sample ring were sized when the shadow started.
    #[cold]
    pub(crate) fn differing(
        &self,
        core: usize,
        first: &Packet,
        active: Verdict,
        shadow: Verdict,
        now: u64,
    ) {
        let c = &self.cores[core.min(self.cores.len() - 1)];
        let p = &first.meta;
        let len = u64::from(p.len);
        let key = FlowKey {
            family: p.family,
            src: p.src,
            dst: p.dst,
            protocol: p.protocol,
            sport: p.sport,
            dport: p.dport,
            in_iface: first.facts.in_iface,
        };
        {
            let mut t = c.flows.lock().unwrap_or_else(|e| e.into_inner());
            let full = t.rows.len() >= t.cap;
            match t.rows.get_mut(&key) {
                Some(r) => {
                    r.packets += 1;
                    r.bytes += len;
                    r.last_ns = now;
                }
                None if full => {
                    t.overflow_packets += 1;
                    t.overflow_bytes += len;
                }
                None => {
                    t.rows.insert(
                        key,
                        FlowRow {
                            packets: 1,
                            bytes: len,
                            first_ns: now,
                            last_ns: now,
                            active,
                            shadow,
                            first: *first,
                        },
                    );
                }
            }
        }
        let n = c.differing.load(Ordering::Relaxed);
        c.differing.store(n + 1, Ordering::Relaxed);
        let every = u64::from(self.config.sample);
        if every > 0 && n % every == 0 {
            let mut r = c.samples.lock().unwrap_or_else(|e| e.into_inner());
            if r.samples.len() < SHADOW_SAMPLE_CAPACITY {
                r.samples.push(ShadowSample {
                    packet: *first,
                    active,
                    shadow,
                    now_ns: now,
                });
            } else {
                r.dropped += 1;
            }
        }
    }

    /// The sampled differing packets since the last drain, per core in order; empties the
    /// rings.
    pub(crate) fn drain_samples(&self) -> Vec<ShadowSample> {
        let mut out = Vec::new();
        for c in self.cores.iter() {
            let mut r = c.samples.lock().unwrap_or_else(|e| e.into_inner());
            out.append(&mut r.samples);
            r.samples.reserve(SHADOW_SAMPLE_CAPACITY);
        }
        out
    }

    /// Packets and bytes by (active, shadow) verdict pair, summed over cores; pairs without
    /// packets are left out.
    pub(crate) fn pairs(&self) -> Vec<VerdictPair> {
        let mut pairs = Vec::new();
        for (a, active_name) in VERDICT_NAMES.into_iter().enumerate() {
            for (s, shadow_name) in VERDICT_NAMES.into_iter().enumerate() {
                let sum = |m: fn(&ShadowCore) -> &[[AtomicU64; 3]; 3]| -> u64 {
                    self.cores
                        .iter()
                        .map(|c| m(c)[a][s].load(Ordering::Relaxed))
                        .sum()
                };
                let packets = sum(|c| &c.packets);
                if packets > 0 {
                    pairs.push(VerdictPair {
                        active: active_name,
                        shadow: shadow_name,
                        packets,
                        bytes: sum(|c| &c.bytes),
                    });
                }
            }
        }
        pairs
    }

    /// The report: totals, flows (their rule paths traced on `active` and on the shadow's
    /// snapshot; the busiest first, then by first seen) and the shadowed ruleset's counters.
    pub(crate) fn report(
        &self,
        active: &Snapshot,
        ct: Option<&Conntrack>,
        ended: Option<ShadowEnd>,
    ) -> ShadowReport {
        let pairs = self.pairs();
        let mut flows = Vec::new();
        let (mut overflow_packets, mut overflow_bytes, mut samples_dropped) = (0, 0, 0);
        for c in self.cores.iter() {
            let t = c.flows.lock().unwrap_or_else(|e| e.into_inner());
            overflow_packets += t.overflow_packets;
            overflow_bytes += t.overflow_bytes;
            for (k, r) in &t.rows {
                flows.push((
                    *k, r.packets, r.bytes, r.first_ns, r.last_ns, r.active, r.shadow, r.first,
                ));
            }
            samples_dropped += c.samples.lock().unwrap_or_else(|e| e.into_inner()).dropped;
        }
        // The same flow may have rows on several cores: merge them.
        flows.sort_by(|a, b| key_order(&a.0, &b.0));
        let mut merged: Vec<ShadowFlow> = Vec::with_capacity(flows.len());
        let mut last: Option<FlowKey> = None;
        for (k, packets, bytes, first_ns, last_ns, av, sv, first) in flows {
            if last == Some(k) {
                if let Some(m) = merged.last_mut() {
                    m.packets += packets;
                    m.bytes += bytes;
                    m.first_seen_ns = m.first_seen_ns.min(first_ns);
                    m.last_seen_ns = m.last_seen_ns.max(last_ns);
                }
                continue;
            }
            last = Some(k);
            merged.push(ShadowFlow {
                family: k.family,
                src: k.src,
                dst: k.dst,
                protocol: k.protocol,
                sport: k.sport,
                dport: k.dport,
                in_iface: k.in_iface.as_str().to_string(),
                packets,
                bytes,
                first_seen_ns: first_ns,
                last_seen_ns: last_ns,
                active: av.name(),
                shadow: sv.name(),
                active_rule: deciding_step(active, &first, ct),
                shadow_rule: deciding_step(&self.snapshot, &first, ct),
            });
        }
        merged.sort_by(|a, b| {
            b.packets
                .cmp(&a.packets)
                .then(a.first_seen_ns.cmp(&b.first_seen_ns))
        });
        let counters = self
            .snapshot
            .counters()
            .into_iter()
            .filter(|c| *c.ruleset == *self.ruleset)
            .collect();
        ShadowReport {
            ruleset: self.ruleset.clone(),
            revision: self.revision,
            started_ns: self.started_ns,
            max_flows: self.config.max_flows,
            pairs,
            flows: merged,
            overflow_packets,
            overflow_bytes,
            samples_dropped,
            counters,
            ended,
        }
    }
}

fn key_order(a: &FlowKey, b: &FlowKey) -> std::cmp::Ordering {
    (
        a.family as u8,
        a.src,
        a.dst,
        a.protocol,
        a.sport,
        a.dport,
        a.in_iface.as_str(),
    )
        .cmp(&(
            b.family as u8,
            b.src,
            b.dst,
            b.protocol,
            b.sport,
            b.dport,
            b.in_iface.as_str(),
        ))
}

/// The step that gave `packet` its verdict on `snap`: the last rule or policy that accepted,
/// dropped or rejected it, as a trace with the packet's recorded conntrack state finds it.
fn deciding_step(snap: &Snapshot, packet: &Packet, ct: Option<&Conntrack>) -> Option<TraceStep> {
    let t = snap.trace_tracked(packet, &[], 0, ct, |_, _| None);
    t.steps.into_iter().rev().find(|s| {
        matches!(
            s.outcome,
            StepOutcome::Accept | StepOutcome::Drop | StepOutcome::Reject | StepOutcome::Policy(_)
        )
    })
}

/// Packets counted by (active verdict, shadow verdict).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerdictPair {
    /// What the active snapshot decided: `ACCEPT`, `DROP` or `REJECT`.
    pub active: &'static str,
    /// What the shadow would have decided.
    pub shadow: &'static str,
    /// Packets.
    pub packets: u64,
    /// Bytes (layer-3 length).
    pub bytes: u64,
}

/// A flow whose packets the shadow would decide differently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowFlow {
    /// Family.
    pub family: Family,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Layer-4 protocol number.
    pub protocol: u8,
    /// Source port (0 without ports).
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Input interface (empty when unknown or at OUTPUT).
    pub in_iface: String,
    /// Differing packets of the flow.
    pub packets: u64,
    /// Their bytes (layer-3 length).
    pub bytes: u64,
    /// The first differing packet, in the engine's clock (ns, the `now` its batch was given).
    pub first_seen_ns: u64,
    /// The last one.
    pub last_seen_ns: u64,
    /// The active verdict of its first differing packet.
    pub active: &'static str,
    /// The shadow's.
    pub shadow: &'static str,
    /// The rule (or policy) that decided its first differing packet in the active snapshot,
    /// as a trace of that packet finds it (`None`: no base chain, accepted by default).
    pub active_rule: Option<TraceStep>,
    /// The one that decided it in the shadow.
    pub shadow_rule: Option<TraceStep>,
}

/// Why a shadow ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShadowEnd {
    /// [`Engine::end_shadow`](super::Engine::end_shadow): on request.
    Ended,
    /// Its time was up ([`Engine::end_shadow_as`](super::Engine::end_shadow_as): the
    /// engine has no timer; the caller's says so).
    Expired,
    /// A commit was published (the shadow was compiled beside the rulesets it replaced).
    Committed,
    /// Another shadow took its place.
    Replaced,
}

/// What a shadow saw ([`Engine::shadow_report`](super::Engine::shadow_report)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowReport {
    /// The shadowed ruleset.
    pub ruleset: String,
    /// Its staged revision (the caller's number).
    pub revision: u64,
    /// When it started, engine clock, ns.
    pub started_ns: u64,
    /// Rows of each core's flow table.
    pub max_flows: usize,
    /// Packets by (active, shadow) verdict; pairs with no packet are left out.
    pub pairs: Vec<VerdictPair>,
    /// The flows whose verdict differs, the busiest first.
    pub flows: Vec<ShadowFlow>,
    /// Differing packets of flows that found their core's flow table full.
    pub overflow_packets: u64,
    /// Their bytes.
    pub overflow_bytes: u64,
    /// Sampled differing packets a full sample ring did not keep.
    pub samples_dropped: u64,
    /// The shadowed ruleset's per-rule and per-policy counters in the shadow.
    pub counters: Vec<SlotCounters>,
    /// `Some` once it ended.
    pub ended: Option<ShadowEnd>,
}

impl ShadowReport {
    /// Packets whose verdict would change.
    pub fn changed_packets(&self) -> u64 {
        self.pairs
            .iter()
            .filter(|p| p.active != p.shadow)
            .map(|p| p.packets)
            .sum()
    }

    /// Flows whose verdict would change: the table's rows, plus one when packets overflowed
    /// it (at least one more flow).
    pub fn changed_flows(&self) -> u64 {
        self.flows.len() as u64 + u64::from(self.overflow_packets > 0)
    }
}

/// A differing packet, kept for the packet-event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShadowSample {
    /// The packet as the shadow classified it.
    pub packet: Packet,
    /// The active verdict.
    pub active: Verdict,
    /// The shadow's.
    pub shadow: Verdict,
    /// Its batch's time, engine clock, ns.
    pub now_ns: u64,
}

// === impl ShadowSlot ===

/// The engine's one shadow: a pointer the workers load inside their batches, and its owner.
pub(crate) struct ShadowSlot {
    /// Null or the shadow `owner` holds. Written under `owner`'s lock.
    ptr: AtomicPtr<Shadow>,
    owner: Mutex<Option<Arc<Shadow>>>,
}

impl Default for ShadowSlot {
    fn default() -> Self {
        ShadowSlot {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            owner: Mutex::new(None),
        }
    }
}

impl ShadowSlot {
    /// The shadow a batch runs beside, for the batch's duration. Call only inside a batch of
    /// the dataplane whose [`Quiescence`] retires this slot's shadows.
    #[inline]
    pub(crate) fn load(&self) -> *const Shadow {
        // Acquire: pairs with the Release store in `replace`, so the shadow is seen built.
        // Inside a batch this load follows the odd generation store and the reader barrier
        // (Claim A of `crate::dataplane` holds for any pointer loaded there).
        self.ptr.load(SyncOrdering::Acquire)
    }

    /// The current shadow (for reports), shared.
    pub(crate) fn current(&self) -> Option<Arc<Shadow>> {
        self.owner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `new` (or nothing) in the slot when `keep(old)` is false for the one there, and
    /// returns the old one once no batch can hold it (`q`'s grace waited).
    pub(crate) fn replace(
        &self,
        new: Option<Arc<Shadow>>,
        keep: impl FnOnce(&Shadow) -> bool,
        q: &Quiescence,
        backoff: &Backoff,
    ) -> Option<Arc<Shadow>> {
        let mut owner = self.owner.lock().unwrap_or_else(|e| e.into_inner());
        if owner.as_deref().is_some_and(keep) {
            return None;
        }
        if owner.is_none() && new.is_none() {
            return None;
        }
        let ptr = new
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| Arc::as_ptr(s).cast_mut());
        // Release: publishes the built shadow to the workers' Acquire load.
        self.ptr.store(ptr, SyncOrdering::Release);
        let old = std::mem::replace(&mut *owner, new);
        if old.is_some() {
            // The writer's half: after the barrier and the wait, no batch holds `old`.
            let grace = q.start();
            q.wait(&grace, backoff);
        }
        old
    }
}

// === Conntrack as the shadow sees it ===

/// The conntrack facts the active lookup gave one packet; `looked` false when the active raw
/// chains decided it first.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CtSeen {
    looked: bool,
    verdict: Option<Verdict>,
    ct_state: u8,
    ct_mark: u32,
    ct_reply: bool,
}

/// The active classification's tracker, recording what each packet's lookup gave, in
/// packet order (one entry per `decided`, which runs once per packet).
pub(crate) struct Recording<'r, T> {
    pub(crate) inner: &'r mut T,
    pub(crate) seen: &'r mut Vec<CtSeen>,
    pub(crate) cur: CtSeen,
}

impl<'t, T: Track<'t>> Track<'t> for Recording<'_, T> {
    #[inline]
    fn lookup(&mut self, p: &mut PacketMeta, f: &PacketFacts, now: u64) -> Option<Verdict> {
        let verdict = self.inner.lookup(p, f, now);
        self.cur = CtSeen {
            looked: true,
            verdict,
            ct_state: p.ct_state,
            ct_mark: p.ct_mark,
            ct_reply: p.ct_reply,
        };
        verdict
    }

    #[inline]
    fn decided(&mut self, p: &mut PacketMeta, f: &PacketFacts, v: Verdict, now: u64) -> Verdict {
        self.seen.push(std::mem::take(&mut self.cur));
        self.inner.decided(p, f, v, now)
    }

    #[inline]
    fn table(&self) -> Option<&'t Conntrack> {
        self.inner.table()
    }
}

/// The shadow's tracker: gives each packet what [`Recording`] recorded for it, and confirms
/// nothing.
pub(crate) struct Replay<'r> {
    pub(crate) seen: &'r [CtSeen],
    pub(crate) i: usize,
    pub(crate) table: Option<&'r Conntrack>,
}

impl<'t> Track<'t> for Replay<'_> {
    #[inline]
    fn lookup(&mut self, p: &mut PacketMeta, f: &PacketFacts, now: u64) -> Option<Verdict> {
        match self.seen.get(self.i) {
            Some(s) if s.looked => {
                s.apply(p);
                s.verdict
            }
            _ => {
                // The active raw chains decided it: conntrack never saw it; look without
                // changing anything.
                if let Some(t) = self.table {
                    t.peek_into(p, f, now);
                }
                None
            }
        }
    }

    #[inline]
    fn decided(&mut self, _: &mut PacketMeta, _: &PacketFacts, v: Verdict, _: u64) -> Verdict {
        self.i += 1;
        v
    }
}

/// The shadow's LOG hits go nowhere (its rules are not the ones the kernel runs).
pub(crate) struct NoLogs;

impl LogSink for NoLogs {
    #[inline]
    fn log(&mut self, _: &LogHit<'_>) {}
}

impl CtSeen {
    /// Gives `p` these conntrack facts (nothing when the lookup did not run).
    pub(crate) fn apply(&self, p: &mut PacketMeta) {
        if self.looked {
            p.ct_state = self.ct_state;
            p.ct_mark = self.ct_mark;
            p.ct_reply = self.ct_reply;
        }
    }
}

impl Engine {
    /// Makes `ruleset` (numbered `revision` by the caller) the shadow of the active ruleset
    /// of its name: validated as a commit of it would be, compiled beside the other active
    /// rulesets into a snapshot of its own, and classified by every worker beside the active
    /// snapshot until [`Engine::end_shadow`], the next publish, or the next `start_shadow`
    /// (module `shadow` docs: what it sees and what it cannot change). One shadow per engine
    /// at a time; the one it replaces comes back with its report ([`ShadowEnd::Replaced`]). Nothing changes on the
    /// packet path but the counting; `config.max_flows` above [`MAX_SHADOW_FLOWS`] is clamped.
    ///
    /// Errors: as [`Engine::prepare`] of `Change::Put(ruleset)`; the shadow slot is then
    /// unchanged.
    pub fn start_shadow(
        &self,
        ruleset: Ruleset,
        revision: u64,
        config: ShadowConfig,
        sets: &dyn SetRegistry,
    ) -> Result<Option<ShadowReport>, CommitError> {
        let name = ruleset.name.clone();
        let validated = self.validate_change(Change::Put(ruleset), sets)?;
        let list: Vec<Arc<Ruleset>> = validated.next.values().cloned().collect();
        let with = WithFacts {
            sets,
            facts: &validated.facts,
        };
        // From scratch: cells of its own (its counters count only what it matched).
        let snapshot = Snapshot::compile_with(
            &list,
            &with,
            self.dataplane.cores(),
            self.dataplane.with_active(|s| s.classifier),
        )?;
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if active.version != validated.base {
            return Err(CommitError::Stale);
        }
        let sh = Arc::new(Shadow::new(
            name,
            revision,
            self.clock.now_ns(),
            snapshot,
            config,
        ));
        let old = self.shadow.replace(
            Some(sh),
            |_| false,
            self.dataplane.quiescence(),
            &self.dataplane.backoff(),
        );
        drop(active);
        Ok(old.map(|old| {
            let report = self.report_of(&old, Some(ShadowEnd::Replaced));
            self.keep_last(&report);
            report
        }))
    }

    /// Ends the shadow, if any, and returns its last report ([`ShadowEnd::Ended`]); no
    /// worker classifies with it once this returns.
    pub fn end_shadow(&self) -> Option<ShadowReport> {
        self.end_shadow_as(ShadowEnd::Ended)
    }

    /// [`Engine::end_shadow`], the report saying `why` (the caller's timer ends a shadow as
    /// [`ShadowEnd::Expired`]).
    pub fn end_shadow_as(&self, why: ShadowEnd) -> Option<ShadowReport> {
        let old = self.retire_shadow()?;
        let report = self.report_of(&old, Some(why));
        self.keep_last(&report);
        Some(report)
    }

    /// The running shadow's report so far, or else the last report of the shadow that ended
    /// last ([`ShadowReport::ended`] says why); `None` when no shadow ran. Off the packet path:
    /// it traces each differing flow's first packet on both snapshots for its rule paths.
    pub fn shadow_report(&self) -> Option<ShadowReport> {
        match self.shadow.current() {
            Some(sh) => Some(self.report_of(&sh, None)),
            None => self
                .shadow_last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    pub(super) fn keep_last(&self, report: &ShadowReport) {
        *self.shadow_last.lock().unwrap_or_else(|e| e.into_inner()) = Some(report.clone());
    }

    /// The running shadow's ruleset, revision and packets by verdict pair, or else those of
    /// the last shadow that ended (its totals stay until the next one starts); cheap: no
    /// flows, no traces; for metrics.
    pub fn shadow_pairs(&self) -> Option<(String, u64, Vec<VerdictPair>)> {
        match self.shadow.current() {
            Some(sh) => Some((sh.ruleset.clone(), sh.revision, sh.pairs())),
            None => {
                let last = self.shadow_last.lock().unwrap_or_else(|e| e.into_inner());
                let r = last.as_ref()?;
                Some((r.ruleset.clone(), r.revision, r.pairs.clone()))
            }
        }
    }

    /// The running shadow's ruleset and revision.
    pub fn shadow_revision(&self) -> Option<(String, u64)> {
        let sh = self.shadow.current()?;
        Some((sh.ruleset.clone(), sh.revision))
    }

    /// The sampled differing packets of the running shadow since the last drain
    /// ([`ShadowConfig::sample`]), per core, oldest first; empty without a shadow.
    pub fn drain_shadow_samples(&self) -> Vec<ShadowSample> {
        self.shadow
            .current()
            .map_or_else(Vec::new, |sh| sh.drain_samples())
    }

    pub(super) fn retire_shadow(&self) -> Option<Arc<Shadow>> {
        self.shadow.replace(
            None,
            |_| false,
            self.dataplane.quiescence(),
            &self.dataplane.backoff(),
        )
    }

    pub(super) fn report_of(&self, sh: &Shadow, ended: Option<ShadowEnd>) -> ShadowReport {
        let ct = self.conntrack.as_ref();
        self.dataplane.with_active(|s| sh.report(s, ct, ended))
    }
}

#[cfg(test)]
mod tests;
