//! The packet path of the TupleMerge index: `Snapshot::indexed_next` (the first matching
//! rule at or after a position, from the RFC tables, then the hash tables, the unindexed
//! rules and the `-m limit` rules in order) and the batched probe
//! ([`ChainIndex::probe_batch`]) that `Snapshot::classify_batch` runs over the first large
//! indexed base chain.
//!
//! Runs on the packet cores against an immutable index: no allocation (the batch's state is
//! in fixed arrays of [`PROBE_BATCH`]), no lock, no clock (`now` is passed in for `-m limit`).

use super::Observer;
use crate::packet::{PacketFacts, PacketMeta};
use crate::snapshot::chunks::RuleChunks;
use crate::snapshot::rfc::{DIRECT, Rfc};
use crate::snapshot::tuple_merge::*;
use crate::snapshot::{Snapshot, addr_bits};

// === batched probe ===

/// Most packets one [`ChainIndex::probe_batch`] call takes (a `u64` bit set covers them).
pub(crate) const PROBE_BATCH: usize = 64;

/// The default of [`Classifier::TupleMerge`](crate::snapshot::Classifier::TupleMerge)'s `batch_min_bytes` (112 KiB): the smallest
/// chain index (bytes as [`Snapshot::memory_bytes`] counts them) that
/// [`Snapshot::classify_batch`] probes in batches. A smaller one sits in L1/L2, where there
/// is no latency to hide and the batch's bookkeeping (hash, bounds and tags stored per packet and table, then read back)
/// cost 10-15% on the 1k ClassBench sets; from about 1.5k rules the batch gained 24-32% on
/// acl1 and 4-7% on ipc1 and lost 7-9% on fw1 (whose lookups are dominated by filter
/// checks, not misses); at 10k it gains 2-25%, at 100k 60-100% (measured at 64 KiB when the
/// index took ~49 bytes a rule; the `ProbeEntry` copies brought that to ~82, and the
/// threshold moved with it so that it still falls near 1.3k ClassBench rules: at 64 KiB the
/// 1k sets were batched and 3-14% slower).
pub const PROBE_MIN_BYTES: usize = 112 << 10;

/// [`ChainIndex::probe_batch`]'s answer when a rule that reads `ct_state` passed its filter
/// below every pure match: the evaluation must query the index itself.
pub(crate) const PROBE_UNKNOWN: u32 = u32::MAX - 1;

/// Asks the CPU to bring the cache line holding `p` into L1. A hint: it never faults and
/// changes nothing visible, so any address, even one past an array's end, is fine.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: PREFETCHT0 reads no memory architecturally and cannot fault, whatever the
        // address (Intel SDM vol. 2, PREFETCHh); SSE is part of the x86_64 baseline.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A packet's hash inputs and filter key, computed once per batch.
#[derive(Clone, Copy, Default)]
pub(crate) struct ProbeKey {
    src: u128,
    dst: u128,
    l4: u64,
    key: PacketKey,
    v4: bool,
}

/// An observer for side-effect-free rules, which never report anything: such rules have no
/// `-m limit`, `-m recent`, `-m hashlimit` or `-m connlimit` (those sit in `effects`), and only the evaluator
/// reports matches.
pub(crate) struct Silent;

impl Observer for Silent {
    fn rule(&mut self, _: usize, _: &crate::snapshot::CChain, _: u32, _: &PacketMeta) {}
    fn policy(&mut self, _: usize, _: &crate::snapshot::CChain, _: &PacketMeta) {}
    fn limit(&mut self, _: &crate::snapshot::TokenBucket, _: u64) -> bool {
        false
    }
    fn recent(&mut self, _: &crate::snapshot::stateful::CRecent, _: &PacketMeta, _: u64) -> bool {
        false
    }
    fn hashlimit(
        &mut self,
        _: &crate::snapshot::stateful::CHashlimit,
        _: &PacketMeta,
        _: u64,
    ) -> bool {
        false
    }
    fn connlimit(
        &mut self,
        _: &super::connlimit::CConnlimit,
        _: &PacketMeta,
        _: &PacketFacts,
        _: u64,
    ) -> bool {
        false
    }
    fn payload(&self) -> &[u8] {
        &[]
    }
    fn log(
        &mut self,
        _: &crate::snapshot::CChain,
        _: u32,
        _: u32,
        _: &crate::snapshot::LogSpec,
        _: &PacketMeta,
        _: &PacketFacts,
    ) {
    }
}

impl ChainIndex {
    /// The hash tables' part of [`Snapshot::indexed_next`] from start 0, for the packets
    /// `packets[which[k]]` at once; writes `out[which[k]]`: the position of the lowest matching
    /// rule any table holds, `u32::MAX` when none, or [`PROBE_UNKNOWN`] when a rule reading
    /// `ct_state` passed its filter below that (the state may still change before the packet
    /// reaches this chain). Every other field a table rule reads is fixed for the packet's
    /// evaluation, so the answer holds whenever the evaluation queries this chain from rule 0.
    ///
    /// The probes of the packets are interleaved, a table at a time, as in Open vSwitch's
    /// `dpcls_lookup` (lib/dpif-netdev.c: every subtable is probed for all still-unmatched
    /// packets of a batch, with prefetches between hashing and reading the buckets): first
    /// every live packet's key is hashed and its bucket bounds prefetched, then the bounds
    /// are read and the entries prefetched, then the entries are checked, so the cache misses
    /// of up to [`PROBE_BATCH`] packets overlap instead of following each other. A packet leaves
    /// the batch (in the hashing pass) once its best match is below the table's lowest rule
    /// (tables ascend by `min`), the per-packet early exit of the scalar lookup.
    pub(crate) fn probe_batch(
        &self,
        rules: &RuleChunks,
        packets: &[PacketMeta],
        facts: &[PacketFacts],
        which: &[u8],
        now: u64,
        out: &mut [u32; PROBE_BATCH],
    ) {
        let m = which.len().min(PROBE_BATCH);
        if let Some(rfc) = &self.rfc {
            let mut keys = [PacketKey::default(); PROBE_BATCH];
            for (key, &i) in keys.iter_mut().zip(&which[..m]) {
                *key = PacketKey::of(&packets[i as usize]);
            }
            let mut found = [0u32; PROBE_BATCH];
            rfc.lookup_batch(&keys[..m], &mut found[..m], PROBE_UNKNOWN);
            for (&f, &i) in found.iter().zip(&which[..m]) {
                // RFC tables leave out the fragment bit (see `Snapshot::indexed_next`).
                let fragment = packets[i as usize].fragment;
                out[i as usize] = if fragment { PROBE_UNKNOWN } else { f };
            }
            return;
        }
        let mut keys = [ProbeKey::default(); PROBE_BATCH];
        for (k, &i) in which[..m].iter().enumerate() {
            let p = &packets[i as usize];
            keys[k] = ProbeKey {
                src: addr_bits(p.src),
                dst: addr_bits(p.dst),
                l4: l4_word(p.protocol, p.sport, p.dport),
                key: PacketKey::of(p),
                v4: p.src.is_ipv4(),
            };
        }
        let mut best = [u32::MAX; PROBE_BATCH];
        // `best[k]` came from a rule reading ct_state (the answer is then PROBE_UNKNOWN).
        let mut unsure = [false; PROBE_BATCH];
        let mut live = [0u8; PROBE_BATCH];
        for (k, l) in live[..m].iter_mut().enumerate() {
            *l = k as u8;
        }
        let mut n_live = m;
        let mut tag = [0u32; PROBE_BATCH];
        let mut span = [(0u32, 0u32); PROBE_BATCH];
        // Indices below are masked with `LANES` (a no-op: every index is below PROBE_BATCH)
        // so the compiler drops the bounds checks.
        const LANES: usize = PROBE_BATCH - 1;
        for (t, probes) in self.tables.iter().zip(self.probes.iter()) {
            let probes: &[ProbeEntry] = probes;
            // 1. Retire the packets no table from here on can improve; hash the others' keys
            //    and prefetch their bucket bounds (one pass: a retired packet's slot is
            //    overwritten by the next packet's).
            let mut j = 0;
            for q in 0..n_live {
                let k = live[q & LANES];
                let key = &keys[k as usize & LANES];
                let h = if key.v4 {
                    t.masks.hash4(key.key.src, key.key.dst, key.l4)
                } else {
                    t.masks.hash(key.src, key.dst, key.l4)
                };
                let b = (h & t.bucket_mask) as u32;
                live[j & LANES] = k;
                span[j & LANES].0 = b;
                tag[j & LANES] = (h >> 32) as u32;
                prefetch(t.starts.as_ptr().wrapping_add(b as usize));
                j += usize::from(best[k as usize & LANES] > t.min);
            }
            n_live = j;
            if n_live == 0 {
                break;
            }
            // 2. Read the bounds, prefetch the bucket's entries.
            for s in &mut span[..n_live] {
                let b = s.0 as usize;
                *s = (t.starts[b], t.starts[b + 1]);
                prefetch(probes.as_ptr().wrapping_add(s.0 as usize));
            }
            // 3. Check the entries whose tag matches, in position order, below the best.
            for q in 0..n_live {
                let k = live[q & LANES] as usize & LANES;
                let (lo, hi) = span[q & LANES];
                let tag = tag[q & LANES] as u16;
                // Most buckets are decided by their first entry (a whole-rule filter that
                // passes, or none below the best): that case takes no data-dependent branch.
                // `probes[hi]` exists (a sentinel ends every table) and is ignored when empty.
                let e = &probes[lo as usize];
                let first = (lo < hi) & (e.pos < best[k]);
                let pass = first & e.passes(&keys[k].key, tag);
                let exact = pass & (e.flags & FILTER_EXACT != 0);
                best[k] = if exact { e.pos } else { best[k] };
                unsure[k] &= !exact;
                // Left to the loop below: a filter that is not the whole rule, or more entries
                // after a first one that failed.
                let more = (pass & !exact) | (first & !pass & (hi - lo > 1));
                if !more {
                    continue;
                }
                for e in &probes[lo as usize..hi as usize] {
                    let pos = e.pos;
                    if pos >= best[k] {
                        break;
                    }
                    if !e.passes(&keys[k].key, tag) {
                        continue;
                    }
                    if e.flags & FILTER_EXACT != 0 {
                        (best[k], unsure[k]) = (pos, false);
                        break;
                    }
                    if e.flags & FILTER_CTSTATE != 0 {
                        // Undecidable now; whatever lies above it no longer matters.
                        (best[k], unsure[k]) = (pos, true);
                        break;
                    }
                    let i = which[k] as usize;
                    let f = facts.get(i).unwrap_or(&PacketFacts::NONE);
                    if Snapshot::rule_matches(
                        &rules[pos as usize],
                        &packets[i],
                        f,
                        now,
                        &mut Silent,
                    ) {
                        (best[k], unsure[k]) = (pos, false);
                        break;
                    }
                }
            }
        }
        for (k, &i) in which[..m].iter().enumerate() {
            out[i as usize] = if unsure[k] { PROBE_UNKNOWN } else { best[k] };
        }
    }
}

// === impl Snapshot: indexed lookup ===

impl Snapshot {
    /// The position (0-based in the chain) of the first rule at or after `start` that matches
    /// `p`, exactly as the linear walk from `start` would find it, with the same `-m limit`
    /// side effects.
    #[inline]
    pub(crate) fn indexed_next<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> Option<u32> {
        // RFC tables leave out the fragment bit: a non-first fragment takes the tables.
        if let Some(rfc) = idx.rfc.as_ref().filter(|_| !p.fragment) {
            match rfc.lookup(&PacketKey::of(p)) {
                Found::Exact(pos) if pos >= start => return Some(pos),
                // A cut list whose exact rule lies before `start`: the tables decide.
                Found::Exact(_) => {}
                Found::List(list) => {
                    let from = if start == 0 {
                        0
                    } else {
                        list.partition_point(|&r| r < start)
                    };
                    for &pos in &list[from..] {
                        if idx.filters[pos as usize].flags & FILTER_EXACT != 0
                            || Self::rule_matches(&rules[pos as usize], p, f, now, obs)
                        {
                            return Some(pos);
                        }
                    }
                    let cut = list
                        .last()
                        .is_some_and(|&l| idx.filters[l as usize].flags & FILTER_EXACT != 0);
                    if !cut {
                        return None;
                    }
                }
            }
        }
        self.tm_next(idx, rules, start, p, f, now, obs)
    }

    /// [`Snapshot::indexed_next`] on the TupleMerge tables.
    #[inline]
    pub(crate) fn tm_next<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> Option<u32> {
        let src = addr_bits(p.src);
        let dst = addr_bits(p.dst);
        let l4 = l4_word(p.protocol, p.sport, p.dport);
        let key = PacketKey::of(p);
        let v4 = p.src.is_ipv4();
        let mut best = u32::MAX;
        // Packet by packet, the 8-byte entries are walked (walking the 32-byte probe entries
        // measured 3-10% slower here on the 1k ClassBench sets, whose tables then take more
        // of L1), and a candidate whose tag matches is checked against the filter in its
        // probe entry (same index as the bucket entry): its address is known from the bucket
        // bounds, not from the entry's position, and it needs no chunk lookup in `filters`.
        for (t, probes) in idx.tables.iter().zip(idx.probes.iter()) {
            if t.min >= best {
                break;
            }
            if t.max < start {
                continue;
            }
            let h = if v4 {
                t.masks.hash4(key.src, key.dst, l4)
            } else {
                t.masks.hash(src, dst, l4)
            };
            let b = (h & t.bucket_mask) as usize;
            let tag = (h >> 32) as u32;
            let (lo, hi) = (t.starts[b] as usize, t.starts[b + 1] as usize);
            let probes = &probes[lo..hi];
            for (e, &Entry { pos, tag: t_tag }) in probes.iter().zip(&t.entries[lo..hi]) {
                if pos >= best {
                    break;
                }
                if t_tag == tag
                    && pos >= start
                    && e.passes(&key, tag as u16)
                    && (e.flags & FILTER_EXACT != 0
                        || Self::rule_matches(&rules[pos as usize], p, f, now, obs))
                {
                    best = pos;
                    break;
                }
            }
        }
        self.indexed_rest(idx, rules, start, best, p, f, now, obs)
    }

    /// Whether the rule at `pos` (side-effect free) matches: the filter first (dense array, no
    /// rule read), the rule only when the filter is not the whole rule.
    #[inline(always)]
    pub(crate) fn filter_hit<O: Observer>(
        idx: &ChainIndex,
        rules: &RuleChunks,
        pos: u32,
        key: &PacketKey,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> bool {
        let filter = &idx.filters[pos as usize];
        filter.passes(key)
            && (filter.flags & FILTER_EXACT != 0
                || Self::rule_matches(&rules[pos as usize], p, f, now, obs))
    }

    /// The rest of [`Snapshot::indexed_next`] once the tables said `best` (the lowest matching
    /// rule they hold at or after `start`, `u32::MAX` for none): the unindexed rules below it,
    /// then the rules with side effects below the result, in order.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the evaluator's state, passed as it is
    pub(crate) fn indexed_rest<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        mut best: u32,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> Option<u32> {
        let from = idx.fallback.partition_point(|&r| r < start);
        if from < idx.fallback.len() && idx.fallback[from] < best {
            let key = PacketKey::of(p);
            for &pos in &idx.fallback[from..] {
                if pos >= best {
                    break;
                }
                if Self::filter_hit(idx, rules, pos, &key, p, f, now, obs) {
                    best = pos;
                    break;
                }
            }
        }
        // Every side-effect-free rule in [start, best) failed, so the linear walk would
        // evaluate exactly these, in this order, before reaching `best`.
        let from = idx.effects.partition_point(|&r| r < start);
        for &pos in &idx.effects[from..] {
            if pos >= best {
                break;
            }
            if Self::rule_matches(&rules[pos as usize], p, f, now, obs) {
                return Some(pos);
            }
        }
        (best != u32::MAX).then_some(best)
    }
}

/// What the RFC tables say about a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found<'a> {
    /// The candidates are this one rule, whose filter is the whole rule: it matches, and no
    /// rule before it can.
    Exact(u32),
    /// Every rule whose filter the packet passes (rules with side effects always),
    /// ascending, cut after the first rule whose filter is exact.
    List(&'a [u32]),
}

// === impl Rfc: lookup ===

impl Rfc {
    /// The class ids of phase 0 and 1 for one packet, then `(sdp, dport)` classes.
    #[inline(always)]
    fn classes(&self, k: &PacketKey) -> (u16, u16, u16) {
        let s = self.s.get(
            self.src_hi[(k.src >> 16) as usize],
            self.src_lo[(k.src & 0xffff) as usize],
        );
        let d = self.d.get(
            self.dst_hi[(k.dst >> 16) as usize],
            self.dst_lo[(k.dst & 0xffff) as usize],
        );
        let p = self.p.get(
            self.proto[usize::from(k.proto)],
            self.sport[usize::from(k.sport)],
        );
        (self.sd.get(s, d), p, self.dport[usize::from(k.dport)])
    }

    /// The final phase's answer for an entry of `fin`.
    #[inline(always)]
    fn found(&self, e: u32) -> Found<'_> {
        if e & DIRECT != 0 {
            Found::Exact(e & !DIRECT)
        } else {
            let l = e as usize;
            Found::List(&self.lists[self.starts[l] as usize..self.starts[l + 1] as usize])
        }
    }

    /// The candidates of a (not fragmented) IPv4 packet.
    #[inline]
    pub(crate) fn lookup(&self, k: &PacketKey) -> Found<'_> {
        let (sd, p, dport) = self.classes(k);
        let sdp = self.sdp.get(sd, p);
        self.found(self.fin[sdp as usize * self.fin_stride as usize + dport as usize])
    }

    /// [`Rfc::lookup`] for the packets `keys[..m]` a phase at a time, so that the table reads
    /// of different packets overlap (the batching of TupleMerge's probes); writes
    /// `out[k]`: the first matching rule's position, `u32::MAX` for none, `unsure` when the
    /// candidates need the evaluator.
    pub(crate) fn lookup_batch(&self, keys: &[PacketKey], out: &mut [u32], unsure: u32) {
        const N: usize = PROBE_BATCH;
        let m = keys.len().min(N).min(out.len());
        let mut mid = [(0u16, 0u16, 0u16); N];
        for (c, k) in mid.iter_mut().zip(&keys[..m]) {
            *c = self.classes(k);
        }
        let mut at = [0u32; N];
        for (a, &(sd, p, dport)) in at.iter_mut().zip(&mid[..m]) {
            *a = u32::from(self.sdp.get(sd, p)) * self.fin_stride + u32::from(dport);
        }
        for (o, &a) in out[..m].iter_mut().zip(&at[..m]) {
            *o = match self.found(self.fin[a as usize]) {
                Found::Exact(pos) => pos,
                Found::List([]) => u32::MAX,
                Found::List(_) => unsure,
            };
        }
    }
}
