//! Recursive Flow Classification over a chain's IPv4 header filters, for small chains.
//!
//! ## The structure
//! RFC (P. Gupta, N. McKeown, "Packet Classification on Multiple Fields", SIGCOMM 1999)
//! splits the header into chunks and maps each chunk's value, through a direct table, to an
//! *equivalence class*: the id of the set of rules whose condition on that chunk the value
//! meets (phase 0). Later phases combine two class ids through a cross-product table whose
//! entry is the class of the intersection of the two sets, until one class remains: the
//! rules that pass on every chunk. A lookup is a fixed number of table reads, independent of
//! the number of rules; the price is memory and build time, which grow with the number of
//! distinct classes, so it is built only for chains of at most [`RFC_MAX_RULES`] rules and
//! given up (the chain keeps its TupleMerge lookup alone) when the cross products together
//! would exceed [`MAX_PRODUCT`] entries.
//!
//! Here the condition of a rule is its [`HeaderFilter`] (`snapshot/tuple_merge.rs`), which is
//! a conjunction of per-field tests and so splits exactly into chunks: phase 0 has seven
//! chunks, the 16-bit halves of source and destination address (`(v & m) == n` per half: a
//! range when the half of the mask is a prefix, else checked value by value), source and
//! destination port (ranges) and protocol (256 values). The filter's fragment test is left
//! out: a non-first fragment is always looked up in the TupleMerge tables. The phases are
//! `S = (src hi, src lo)`, `D = (dst hi, dst lo)`, `P = (proto, sport)`, then
//! `SD = (S, D)`, then `SDP = (SD, P)`, then the final `(SDP, dport)` (the order that kept
//! the ClassBench fw1 and ipc1 tables small; pairing `(SD, (P, dport))` last made them 5 to
//! 7 M entries). Rules with side effects (`-m limit`) pass every chunk, so they stay in every
//! class and are evaluated in order.
//!
//! The final table does not give one rule but a candidate list: the rules whose filter the
//! packet passes, ascending, cut after the first one whose filter is the whole rule
//! ([`FILTER_EXACT`]; nothing after it can be the first match from a start at or before it).
//! A list of one exact rule, the common case, is stored in the final entry itself
//! (`Found::Exact`). Every phase's sets are cut the same way, after their first exact rule
//! that ignores all the chunks the phase has not seen yet (such a rule passes every packet of
//! the class, so the final list would be cut there anyway): this merges classes, and it is
//! what keeps the cross products of the 1k sets below a million entries.
//!
//! A query walks the list from its start: an exact rule is the answer, any other is checked
//! with the evaluator's own match code, so negations, interfaces, `ct_state` and `-m limit`
//! keep the linear walk's meaning. A query that starts past the end of a cut list is not
//! decided here (`Snapshot::indexed_next` falls back to the TupleMerge tables).
//! This file is the commit side (the tables and their build); the lookups, `Rfc::lookup` and
//! `Rfc::lookup_batch`, are the packet side's, in `eval.rs`.

use std::mem::size_of;

#[cfg(doc)]
use super::Snapshot;
use super::tuple_merge::{FILTER_EXACT, HeaderFilter};

/// The most rules a chain may have for its index to get RFC tables (the default of
/// `Classifier::TupleMerge`'s `rfc_max_rules`). Measured builds: 3-28 ms for the ClassBench
/// 1k sets, 31-41 ms for 2k-rule prefixes of acl1/ipc1 10k (fw1 10k's prefixes from 1k on
/// exceed the product budget); the cross products grow roughly with the square of the rules,
/// so larger chains keep the TupleMerge lookup alone.
pub const RFC_MAX_RULES: u32 = 2048;

/// The fewest rules a chain must have to get RFC tables by default (the default of
/// `Classifier::TupleMerge`'s `rfc_min_rules`): the phase-0 tables take 768 KiB whatever
/// the chain's length, and a short chain's TupleMerge lookup is fast already (ClassBench acl
/// cut to 100 rules: 28 Mpps packet by packet, 33 batched; RFC tables 27.7 and 41).
pub const RFC_MIN_RULES: u32 = 256;

/// The most entries all cross-product tables together may have (2 bytes each, 4 in the final
/// table) before the build is given up; each entry costs one intersection of two rule sets
/// to build, so this also bounds the build time (ClassBench 1k sets: 0.1 to 0.8 M entries).
pub(crate) const MAX_PRODUCT: usize = 1 << 20;

/// A phase-0 table over a 16-bit chunk.
pub(crate) type Chunk16 = Box<[u16; 1 << 16]>;

/// One cross-product table: `table[a * stride + b]` is the class of classes `a` and `b`.
#[derive(Debug)]
pub(crate) struct Product {
    pub(crate) stride: u32,
    pub(crate) table: Box<[u16]>,
}

impl Product {
    #[inline(always)]
    pub(crate) fn get(&self, a: u16, b: u16) -> u16 {
        self.table[a as usize * self.stride as usize + b as usize]
    }

    fn bytes(&self) -> usize {
        size_of::<Product>() + 2 * self.table.len()
    }
}

/// The RFC tables of one IPv4 chain (see the module docs).
#[derive(Debug)]
pub(crate) struct Rfc {
    pub(crate) src_hi: Chunk16,
    pub(crate) src_lo: Chunk16,
    pub(crate) dst_hi: Chunk16,
    pub(crate) dst_lo: Chunk16,
    pub(crate) sport: Chunk16,
    pub(crate) dport: Chunk16,
    pub(crate) proto: Box<[u16; 256]>,
    pub(crate) s: Product,
    pub(crate) d: Product,
    pub(crate) p: Product,
    pub(crate) sd: Product,
    pub(crate) sdp: Product,
    /// Final phase, `fin[sdp * fin_stride + dport class]`: [`DIRECT`] | the rule position
    /// when the candidate list is one exact rule, else the list's id.
    pub(crate) fin_stride: u32,
    pub(crate) fin: Box<[u32]>,
    /// `lists[starts[l]..starts[l + 1]]` are list `l`'s rule positions, ascending.
    pub(crate) starts: Box<[u32]>,
    pub(crate) lists: Box<[u32]>,
}

/// [`Rfc::fin`]'s mark of an entry that is the answer itself.
pub(crate) const DIRECT: u32 = 1 << 31;

impl Rfc {
    /// Bytes held by the tables.
    pub(crate) fn memory_bytes(&self) -> usize {
        size_of::<Rfc>()
            + 6 * 2 * (1 << 16)
            + 2 * 256
            + [&self.s, &self.d, &self.p, &self.sd, &self.sdp]
                .iter()
                .map(|p| p.bytes())
                .sum::<usize>()
            + 4 * self.fin.len()
            + 4 * (self.starts.len() + self.lists.len())
    }

    /// Builds the tables for a chain whose rules have `filters` (by position) and whose rules
    /// at the positions `effects` have side effects; `None` when the chain is too large or a
    /// table would grow past its limit.
    pub(crate) fn build(filters: &[HeaderFilter], effects: &[u32]) -> Option<Rfc> {
        let n = filters.len();
        if n == 0 || n > RFC_MAX_RULES as usize {
            return None;
        }
        let words = n.div_ceil(64);
        let is_effect = {
            let mut v = vec![false; n];
            for &e in effects {
                v[e as usize] = true;
            }
            v
        };
        // Each rule's test on a 16-bit chunk: a range, or a (value, mask) pair whose mask is
        // not a prefix of the chunk.
        let half = |v: u32, m: u32, shift: u32| -> Test {
            let (v, m) = ((v >> shift) as u16, (m >> shift) as u16);
            if v & !m != 0 {
                Test::Never
            } else if m.leading_ones() + m.trailing_zeros() == 16 {
                Test::Range(v, v | !m)
            } else {
                Test::Masked(v, m)
            }
        };
        // Chunk bits: which chunks a rule ignores (passes for every value).
        const SH: u8 = 1;
        const SL: u8 = 2;
        const DH: u8 = 4;
        const DL: u8 = 8;
        const PR: u8 = 16;
        const SP: u8 = 32;
        const DP: u8 = 64;
        const ALL: u8 = 127;
        let wild: Vec<u8> = filters
            .iter()
            .zip(&is_effect)
            .map(|(f, &e)| {
                let full = |(lo, hi): (u16, u16)| lo == 0 && hi == u16::MAX;
                let none = |v: u32, m: u32, shift: u32| {
                    (v >> shift) as u16 == 0 && (m >> shift) as u16 == 0
                };
                if e {
                    return ALL;
                }
                [
                    (none(f.src, f.src_mask, 16), SH),
                    (none(f.src, f.src_mask, 0), SL),
                    (none(f.dst, f.dst_mask, 16), DH),
                    (none(f.dst, f.dst_mask, 0), DL),
                    (f.proto_mask == 0 && f.proto == 0, PR),
                    (full(f.sport), SP),
                    (full(f.dport), DP),
                ]
                .iter()
                .filter(|c| c.0)
                .fold(0, |w, c| w | c.1)
            })
            .collect();
        let exact: Vec<bool> = filters
            .iter()
            .zip(&is_effect)
            .map(|(f, &e)| !e && f.flags & FILTER_EXACT != 0)
            .collect();
        // The rules that end a class of a phase over `chunks`: exact, and ignoring every
        // other chunk, so they pass every packet of the class and nothing after them can be
        // its first match (see the module docs).
        let ends = |chunks: u8| -> Vec<u64> {
            let mut set = vec![0u64; words];
            for i in 0..n {
                if exact[i] && wild[i] | chunks == ALL {
                    set[i / 64] |= 1 << (i % 64);
                }
            }
            set
        };
        let chunk = |test: &dyn Fn(&HeaderFilter) -> Test, bit: u8| -> Option<(Chunk16, Classes)> {
            let tests: Vec<Test> = filters
                .iter()
                .zip(&is_effect)
                .map(|(f, &e)| if e { Test::Range(0, u16::MAX) } else { test(f) })
                .collect();
            chunk16(&tests, &ends(bit))
        };
        let (src_hi, c_src_hi) = chunk(&|f| half(f.src, f.src_mask, 16), SH)?;
        let (src_lo, c_src_lo) = chunk(&|f| half(f.src, f.src_mask, 0), SL)?;
        let (dst_hi, c_dst_hi) = chunk(&|f| half(f.dst, f.dst_mask, 16), DH)?;
        let (dst_lo, c_dst_lo) = chunk(&|f| half(f.dst, f.dst_mask, 0), DL)?;
        let (sport, c_sport) = chunk(&|f| Test::Range(f.sport.0, f.sport.1), SP)?;
        let (dport, c_dport) = chunk(&|f| Test::Range(f.dport.0, f.dport.1), DP)?;
        // Protocol: 256 values, checked one by one.
        let mut c_proto = Classes::new(ends(PR));
        let mut proto = Box::new([0u16; 256]);
        let mut set = vec![0u64; words];
        for (v, slot) in proto.iter_mut().enumerate() {
            set.fill(0);
            for (i, f) in filters.iter().enumerate() {
                if is_effect[i] || (v as u8 & f.proto_mask) == f.proto {
                    set[i / 64] |= 1 << (i % 64);
                }
            }
            *slot = c_proto.intern(&mut set)?;
        }
        let mut budget = MAX_PRODUCT;
        let (s, c_s) = product(&mut budget, &c_src_hi, &c_src_lo, ends(SH | SL))?;
        let (d, c_d) = product(&mut budget, &c_dst_hi, &c_dst_lo, ends(DH | DL))?;
        let (p, c_p) = product(&mut budget, &c_proto, &c_sport, ends(PR | SP))?;
        let (sd, c_sd) = product(&mut budget, &c_s, &c_d, ends(SH | SL | DH | DL))?;
        let (sdp, c_sdp) = product(&mut budget, &c_sd, &c_p, ends(ALL & !DP))?;
        // Final phase: candidate lists instead of classes.
        let (a, b) = (&c_sdp.sets, &c_dport.sets);
        if a.len() * b.len() > budget {
            return None;
        }
        let mut ids: rustc_hash::FxHashMap<Vec<u32>, u32> = Default::default();
        let mut starts = vec![0u32];
        let mut lists = Vec::new();
        let mut table = Vec::with_capacity(a.len() * b.len());
        let mut list = Vec::new();
        for x in a {
            for y in b {
                list.clear();
                'words: for (w, (&x, &y)) in x.iter().zip(y.iter()).enumerate() {
                    let mut bits = x & y;
                    while bits != 0 {
                        let i = w * 64 + bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        list.push(i as u32);
                        if exact[i] {
                            break 'words;
                        }
                    }
                }
                if list.len() == 1 && exact[list[0] as usize] {
                    table.push(DIRECT | list[0]);
                    continue;
                }
                let next = ids.len() as u32;
                let id = *ids.entry(list.clone()).or_insert_with(|| {
                    lists.extend_from_slice(&list);
                    starts.push(lists.len() as u32);
                    next
                });
                table.push(id);
            }
        }
        Some(Rfc {
            src_hi,
            src_lo,
            dst_hi,
            dst_lo,
            sport,
            dport,
            proto,
            s,
            d,
            p,
            sd,
            sdp,
            fin_stride: b.len() as u32,
            fin: table.into_boxed_slice(),
            starts: starts.into_boxed_slice(),
            lists: lists.into_boxed_slice(),
        })
    }
}

/// A rule's test on one 16-bit chunk.
#[derive(Clone, Copy)]
pub(crate) enum Test {
    /// No value passes (the rule's value has bits outside its mask).
    Never,
    /// `lo..=hi` pass.
    Range(u16, u16),
    /// `v & mask == value` passes, for a mask that is not a prefix.
    Masked(u16, u16),
}

/// The distinct rule sets (bit sets over rule positions) of one phase, by class id.
pub(crate) struct Classes {
    pub(crate) sets: Vec<Box<[u64]>>,
    pub(crate) ids: rustc_hash::FxHashMap<Box<[u64]>, u16>,
    /// The rules that end a set of this phase (bits above the first are cleared).
    pub(crate) ends: Vec<u64>,
}

impl Classes {
    fn new(ends: Vec<u64>) -> Classes {
        Classes {
            sets: Vec::new(),
            ids: Default::default(),
            ends,
        }
    }

    /// The class id of `set` (cut after its first rule in `ends`, in place), new if unseen;
    /// `None` past `u16` ids.
    fn intern(&mut self, set: &mut [u64]) -> Option<u16> {
        if let Some(w) = set.iter().zip(&self.ends).position(|(s, e)| s & e != 0) {
            let first = (set[w] & self.ends[w]).trailing_zeros();
            // Keep bits 0..=first of word w.
            set[w] &= u64::MAX >> (63 - first);
            set[w + 1..].fill(0);
        }
        if let Some(&id) = self.ids.get(&*set) {
            return Some(id);
        }
        let id = u16::try_from(self.sets.len()).ok()?;
        self.sets.push(set.into());
        self.ids.insert(set.into(), id);
        Some(id)
    }
}

/// Phase 0 for a 16-bit chunk: a sweep over the range tests' end points (the class only
/// changes where some range starts or ends), with the rare masked tests added value by value.
pub(crate) fn chunk16(tests: &[Test], ends: &[u64]) -> Option<(Chunk16, Classes)> {
    let words = ends.len();
    let mut events: Vec<(u32, u32)> = Vec::with_capacity(2 * tests.len());
    let mut masked = Vec::new();
    for (i, t) in tests.iter().enumerate() {
        match *t {
            Test::Never => {}
            Test::Range(lo, hi) => {
                events.push((u32::from(lo), i as u32));
                events.push((u32::from(hi) + 1, i as u32));
            }
            Test::Masked(v, m) => masked.push((i, v, m)),
        }
    }
    events.sort_unstable();
    let mut classes = Classes::new(ends.to_vec());
    let mut table: Chunk16 = vec![0u16; 1 << 16]
        .into_boxed_slice()
        .try_into()
        .expect("65536 entries");
    let mut cur = vec![0u64; words];
    let mut with = vec![0u64; words];
    let mut e = 0;
    let mut lo = 0u32;
    while lo < 1 << 16 {
        // Toggle every rule whose range starts or ends here (a start and an end of the same
        // rule never share a point: an end is one past the range).
        while e < events.len() && events[e].0 == lo {
            let i = events[e].1 as usize;
            cur[i / 64] ^= 1 << (i % 64);
            e += 1;
        }
        let hi = events.get(e).map_or(1 << 16, |ev| ev.0.min(1 << 16));
        if masked.is_empty() {
            with.copy_from_slice(&cur);
            let id = classes.intern(&mut with)?;
            table[lo as usize..hi as usize].fill(id);
        } else {
            for v in lo..hi {
                with.copy_from_slice(&cur);
                for &(i, val, m) in &masked {
                    if v as u16 & m == val {
                        with[i / 64] |= 1 << (i % 64);
                    }
                }
                table[v as usize] = classes.intern(&mut with)?;
            }
        }
        lo = hi;
    }
    Some((table, classes))
}

/// A cross-product phase: the class of every pair of classes of `a` and `b`.
/// `None` when the table would take more than `budget` entries (which it then uses up).
pub(crate) fn product(
    budget: &mut usize,
    a: &Classes,
    b: &Classes,
    ends: Vec<u64>,
) -> Option<(Product, Classes)> {
    *budget = budget.checked_sub(a.sets.len() * b.sets.len())?;
    let mut set = vec![0u64; ends.len()];
    let mut out = Classes::new(ends);
    let mut table = Vec::with_capacity(a.sets.len() * b.sets.len());
    for x in &a.sets {
        for y in &b.sets {
            for ((s, &x), &y) in set.iter_mut().zip(x.iter()).zip(y.iter()) {
                *s = x & y;
            }
            table.push(out.intern(&mut set)?);
        }
    }
    Some((
        Product {
            stride: b.sets.len() as u32,
            table: table.into_boxed_slice(),
        },
        out,
    ))
}
