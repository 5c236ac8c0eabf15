//! The commit path of the TupleMerge index: [`ChainIndex::build`] places every rule of a
//! chain (its relaxed tuple, its key hash, its [`HeaderFilter`]), and [`ChainIndex::update`]
//! makes the next snapshot's index from the active one after an insert, delete or replace,
//! sharing the tables the change does not touch (module docs of `tuple_merge.rs`, "Updates").
//!
//! Runs on the committing thread only. It allocates (new tables, patched probe copies) but
//! never writes the old index, which packet cores may still be reading.

use std::mem::size_of;
use std::sync::Arc;

use super::super::chunks::Chunks;
use super::super::rfc::Rfc;
use super::super::{AddrMatch, CMatch, CRule, RuleChunks};
use super::*;

/// The most removed rules [`ChainIndex::update`] looks up in the tables by their keys
/// ([`ChainIndex::gone_entries`]); beyond that it scans every table's entries for them.
pub(crate) const GONE_LOOKUP_MAX: u32 = 64;

/// The most rules one hash key of a table may hold before a rule looks for another table
/// (TupleMerge's default is `c = 10`; collisions are cheaper here, see the module docs).
pub(crate) const COLLIDE_LIMIT: u32 = 32;

impl Tuple {
    /// A table with tuple `self` may hold a rule with tuple `rule`.
    pub(crate) fn fits(self, rule: Tuple) -> bool {
        self.src <= rule.src
            && self.dst <= rule.dst
            && (!self.proto || rule.proto)
            && (!self.sport || rule.sport)
            && (!self.dport || rule.dport)
    }

    pub(crate) fn is_empty(self) -> bool {
        self.src == 0 && self.dst == 0 && !self.proto && !self.sport && !self.dport
    }

    /// TupleMerge's relaxation for a new table: drop the shorter address when the lengths are
    /// far apart, then cut each address to the byte boundary below it (a /24 to /16, a /32 to
    /// /24) so neighbouring rules fit too. The widths are scaled so IPv6 (128 bits) is relaxed
    /// like IPv4 (32 bits).
    pub(crate) fn relaxed(self, width: u32) -> Tuple {
        let mut t = self;
        let scale = (width / 32) as u8;
        let far = 4 * scale;
        if t.dst > t.src + far {
            t.src = 0;
        } else if t.src > t.dst + far {
            t.dst = 0;
        }
        t.byte_cut(width)
    }

    /// Cuts both addresses to the byte boundary below them and ignores the source port.
    pub(crate) fn byte_cut(self, width: u32) -> Tuple {
        let mut t = self;
        let scale = (width / 32) as u8;
        let shorten = |len: u8| {
            let l = len / scale;
            let r = if l >= 8 { (l - 1) / 8 * 8 } else { 0 };
            r * scale
        };
        t.src = shorten(t.src);
        t.dst = shorten(t.dst);
        // Exact source ports are rare in rule sets (they name client ports); a table that
        // ignores them can take rules with and without one.
        t.sport = false;
        t
    }

    /// The tuple of a new table for a rule with tuple `self` that no existing table takes
    /// (`exists`: a table with that tuple exists, and so is full for the rule's key): the
    /// relaxed tuple, else both addresses cut to the byte boundary (when the relaxation
    /// dropped one), else `self`. Before the middle step, a rule whose relaxed table was full
    /// took its exact tuple: ClassBench acl1 100k had 60 tables, a dozen of them holding a few
    /// rules each (`/23 /32`, `/22 /31`, ...) that fit one `/16 /24` table; now 39, and
    /// 4.2 tables probed per packet instead of 8.4.
    pub(crate) fn new_table(self, width: u32, exists: impl Fn(Tuple) -> bool) -> Tuple {
        [self.relaxed(width), self.byte_cut(width)]
            .into_iter()
            .find(|&t| !exists(t))
            .unwrap_or(self)
    }
}

/// The indexable part of one rule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RuleKey {
    tuple: Tuple,
    src: u128,
    dst: u128,
    l4: u64,
}

/// A plain prefix: `(len, bits)` when the field is not negated and its mask is contiguous
/// within the family's width; `None` (not indexable) otherwise.
pub(crate) fn plain_prefix(field: AddrMatch, negated: bool, width: u32) -> Option<(u8, u128)> {
    let (net, mask) = (field.net(), field.mask());
    let len = mask.count_ones();
    (!negated && len <= width && mask == prefix_mask(width, len as u8))
        .then_some((len as u8, net & mask))
}

pub(crate) fn rule_key(r: &CRule, width: u32) -> RuleKey {
    let (src_len, src) = plain_prefix(r.src, r.src_negated, width).unwrap_or((0, 0));
    let (dst_len, dst) = plain_prefix(r.dst, r.dst_negated, width).unwrap_or((0, 0));
    let proto = match r.protocol {
        Some((false, p)) => Some(p),
        _ => None,
    };
    let (mut sport, mut dport) = (None, None);
    for m in r.matches.iter() {
        let (s, d) = match m {
            CMatch::Tcp { sport, dport, .. } | CMatch::Udp { sport, dport } => (sport, dport),
            _ => continue,
        };
        let single = |p: &Option<(bool, crate::model::PortRange)>| match p {
            Some((false, r)) if r.lo == r.hi => Some(r.lo),
            _ => None,
        };
        sport = sport.or(single(s));
        dport = dport.or(single(d));
    }
    RuleKey {
        tuple: Tuple {
            src: src_len,
            dst: dst_len,
            proto: proto.is_some(),
            sport: sport.is_some(),
            dport: dport.is_some(),
        },
        src,
        dst,
        l4: l4_word(proto.unwrap_or(0), sport.unwrap_or(0), dport.unwrap_or(0)),
    }
}

/// Whether `r` must be decided by the evaluator's own observer, not the probe's `Silent`: it
/// changes state (`-m limit`, `recent`, `hashlimit`, `connlimit`) or reads what only the
/// evaluator has (`-m string`, `-m sctp`, `-m u32`: the packet's bytes).
pub(crate) fn has_side_effects(r: &CRule) -> bool {
    r.matches.iter().any(|m| {
        matches!(
            m,
            CMatch::Limit(_)
                | CMatch::Recent(_)
                | CMatch::Hashlimit(_)
                | CMatch::Connlimit(_)
                | CMatch::String(_)
                | CMatch::Sctp(_)
                | CMatch::U32(_)
        )
    })
}

impl HeaderFilter {
    pub(crate) fn of(r: &CRule, width: u32) -> HeaderFilter {
        let mut exact = width == 32;
        let mut f = HeaderFilter {
            sport: (0, u16::MAX),
            dport: (0, u16::MAX),
            ..HeaderFilter::default()
        };
        let addr = |m: AddrMatch, negated: bool, exact: &mut bool| -> (u32, u32) {
            if width == 32 && !negated {
                (m.net() as u32, m.mask() as u32)
            } else {
                *exact &= width == 32 && m.mask() == 0 && !negated;
                (0, 0)
            }
        };
        (f.src, f.src_mask) = addr(r.src, r.src_negated, &mut exact);
        (f.dst, f.dst_mask) = addr(r.dst, r.dst_negated, &mut exact);
        exact &= r.in_iface.is_none() && r.out_iface.is_none() && r.fragment.is_none();
        match r.protocol {
            Some((false, p)) => (f.proto, f.proto_mask) = (p, 0xff),
            Some((true, _)) => exact = false,
            None => {}
        }
        let mut ports_seen = 0;
        for m in r.matches.iter() {
            let (sport, dport) = match m {
                CMatch::Tcp {
                    sport,
                    dport,
                    flags,
                    option,
                } => {
                    exact &= flags.is_none() && option.is_none();
                    (sport, dport)
                }
                CMatch::Udp { sport, dport } => (sport, dport),
                CMatch::CtState { .. }
                | CMatch::Conntrack(_)
                | CMatch::KernelFact(_)
                | CMatch::Mark { .. }
                | CMatch::Connmark { .. }
                | CMatch::Rpfilter { .. }
                | CMatch::PktType { .. } => {
                    exact = false;
                    f.flags |= FILTER_CTSTATE;
                    continue;
                }
                _ => {
                    exact = false;
                    continue;
                }
            };
            ports_seen += 1;
            f.flags |= FILTER_PORTS;
            if ports_seen > 1 {
                // A second port match: keep the first as the necessary condition.
                exact = false;
                continue;
            }
            let range = |p: &Option<(bool, crate::model::PortRange)>, exact: &mut bool| match p {
                None => (0, u16::MAX),
                Some((false, r)) => (r.lo, r.hi),
                Some((true, _)) => {
                    *exact = false;
                    (0, u16::MAX)
                }
            };
            f.sport = range(sport, &mut exact);
            f.dport = range(dport, &mut exact);
        }
        if exact {
            f.flags |= FILTER_EXACT;
        }
        f
    }
}

impl ProbeEntry {
    pub(crate) fn of(e: Entry, f: &HeaderFilter) -> ProbeEntry {
        ProbeEntry {
            src: f.src,
            src_mask: f.src_mask,
            dst: f.dst,
            dst_mask: f.dst_mask,
            sport: f.sport,
            dport: f.dport,
            pos: e.pos,
            tag: e.tag as u16,
            proto: f.proto,
            flags: f.flags | if f.proto_mask != 0 { PROBE_PROTO } else { 0 },
        }
    }
}

/// A table under construction.
pub(crate) struct TableBuilder {
    tuple: Tuple,
    masks: Masks,
    /// Rules per key hash (the collision count of TupleMerge).
    load: rustc_hash::FxHashMap<u64, u32>,
    members: Vec<(u32, u64)>,
}

impl TableBuilder {
    pub(crate) fn new(tuple: Tuple, width: u32) -> TableBuilder {
        TableBuilder {
            tuple,
            masks: Masks::of(tuple, width),
            load: Default::default(),
            members: Vec::new(),
        }
    }

    pub(crate) fn insert(&mut self, pos: u32, h: u64) {
        *self.load.entry(h).or_insert(0) += 1;
        self.members.push((pos, h));
    }

    pub(crate) fn finish(self) -> Table {
        let n = self.members.len();
        let buckets = (2 * n).next_power_of_two().max(1);
        let bucket_mask = buckets as u64 - 1;
        let mut starts = vec![0u32; buckets + 1];
        for &(_, h) in &self.members {
            starts[(h & bucket_mask) as usize + 1] += 1;
        }
        for b in 0..buckets {
            starts[b + 1] += starts[b];
        }
        let mut fill: Vec<u32> = starts[..buckets].to_vec();
        let mut entries = vec![Entry::default(); n];
        // Members come in ascending position order, so every bucket ends up ascending.
        for &(pos, h) in &self.members {
            let b = (h & bucket_mask) as usize;
            entries[fill[b] as usize] = Entry {
                pos,
                tag: (h >> 32) as u32,
            };
            fill[b] += 1;
        }
        Table {
            masks: self.masks,
            tuple: self.tuple,
            min: self.members.first().map_or(u32::MAX, |m| m.0),
            max: self.members.last().map_or(0, |m| m.0),
            bucket_mask,
            starts: starts.into(),
            entries: entries.into(),
        }
    }
}

impl Table {
    /// The probe copy of this table's entries, built from them and `filters` (the index's),
    /// with the sentinel.
    pub(crate) fn probes(&self, filters: &Chunks<HeaderFilter>) -> Probes {
        Arc::new(
            self.entries
                .iter()
                .map(|&e| ProbeEntry::of(e, &filters[e.pos as usize]))
                .chain([ProbeEntry::SENTINEL])
                .collect(),
        )
    }

    /// Rules in this table (those still present after `remap`) whose key hashes to `h`.
    pub(crate) fn load(&self, h: u64, remap: &impl Fn(u32) -> Option<u32>) -> u32 {
        let b = (h & self.bucket_mask) as usize;
        let tag = (h >> 32) as u32;
        self.entries[self.starts[b] as usize..self.starts[b + 1] as usize]
            .iter()
            .filter(|e| e.tag == tag && remap(e.pos).is_some())
            .count() as u32
    }

    /// This table with positions mapped by `remap` (`None`: the rule is gone) and the entries
    /// `ins` (position, key hash; ascending positions) added; `None` when it ends up empty.
    /// Keeps the bucket array unless the table outgrew it (more entries than buckets) or
    /// shrank below an eighth, then rebuilds it from the rules' keys. `gone`: the indices
    /// (ascending) of the entries `remap` drops, where known ([`ChainIndex::gone_entries`];
    /// otherwise they are found by a scan of the entries).
    ///
    /// With it comes its probe copy where it is had for less than a build from the entries
    /// (`None` otherwise; `probe` is this table's, `filters` the new index's): `probe` itself
    /// when the table is this one, its arrays shared (nothing left or joined and `remap` moved
    /// none of its positions; `shifts_from`: the first position `remap` moves, if any);
    /// `probe` with positions remapped when nothing left or joined; `probe` patched
    /// ([`Table::patched`]) when rules left or joined but no position moved.
    #[allow(clippy::too_many_arguments)] // the update's state, passed as it is
    #[inline] // one caller, `ChainIndex::update`: called, an edit's compile was ~10 us slower
    pub(crate) fn updated(
        &self,
        probe: &Probes,
        remap: &impl Fn(u32) -> Option<u32>,
        shifts_from: Option<u32>,
        mut ins: Vec<(u32, u64)>,
        gone: Option<&[u32]>,
        rules: &RuleChunks,
        filters: &Chunks<HeaderFilter>,
        width: u32,
    ) -> Option<(Table, Option<Probes>)> {
        let buckets = self.starts.len() - 1;
        let scan = || {
            self.entries
                .iter()
                .filter(|e| remap(e.pos).is_some())
                .count()
        };
        let kept = match gone {
            Some(gone) => {
                debug_assert_eq!(self.entries.len() - gone.len(), scan());
                self.entries.len() - gone.len()
            }
            None => scan(),
        };
        if ins.is_empty() && kept == self.entries.len() {
            if shifts_from.is_none_or(|f| self.max < f) {
                // Not a position changes: the same table.
                return Some((self.clone(), Some(probe.clone())));
            }
            // Nothing leaves or joins (most tables of a small change): `remap` is monotonic,
            // so every bucket stays in order and the bucket array is kept as it is.
            let entries: Arc<[Entry]> = self
                .entries
                .iter()
                .filter_map(|e| remap(e.pos).map(|pos| Entry { pos, tag: e.tag }))
                .collect();
            // The same filters, moved with their rules: only the positions change.
            let moved: Probes = Arc::new(
                probe[..self.entries.len()]
                    .iter()
                    .map(|p| ProbeEntry {
                        pos: remap(p.pos).unwrap_or(p.pos),
                        ..*p
                    })
                    .chain([ProbeEntry::SENTINEL])
                    .collect(),
            );
            return Some((
                Table {
                    masks: self.masks,
                    tuple: self.tuple,
                    min: remap(self.min).unwrap_or(self.min),
                    max: remap(self.max).unwrap_or(self.max),
                    bucket_mask: self.bucket_mask,
                    starts: self.starts.clone(),
                    entries,
                },
                Some(moved),
            ));
        }
        let n = kept + ins.len();
        if n == 0 {
            return None;
        }
        if n > buckets || (buckets > 16 && n * 8 < buckets) {
            let mut positions: Vec<u32> =
                self.entries.iter().filter_map(|e| remap(e.pos)).collect();
            positions.extend(ins.iter().map(|e| e.0));
            positions.sort_unstable();
            let mut b = TableBuilder::new(self.tuple, width);
            for pos in positions {
                let k = rule_key(&rules[pos as usize], width);
                b.insert(pos, b.masks.hash(k.src, k.dst, k.l4));
            }
            return Some((b.finish(), None));
        }
        ins.sort_unstable_by_key(|&(pos, h)| (h & self.bucket_mask, pos));
        if shifts_from.is_none_or(|f| self.max < f) {
            let (t, probe) = self.patched(probe, remap, ins, gone, filters);
            return Some((t, Some(probe)));
        }
        let mut starts = Vec::with_capacity(buckets + 1);
        let mut entries = Vec::with_capacity(n);
        let mut ins = ins.into_iter().peekable();
        let (mut min, mut max) = (u32::MAX, 0);
        starts.push(0u32);
        for b in 0..buckets {
            let old = &self.entries[self.starts[b] as usize..self.starts[b + 1] as usize];
            let mut old = old
                .iter()
                .filter_map(|e| remap(e.pos).map(|pos| Entry { pos, tag: e.tag }))
                .peekable();
            // Merge two ascending runs: the bucket's kept entries and its insertions.
            loop {
                let next_ins = ins.next_if(|&(pos, h)| {
                    (h & self.bucket_mask) as usize == b && old.peek().is_none_or(|e| pos < e.pos)
                });
                let e = match next_ins {
                    Some((pos, h)) => Entry {
                        pos,
                        tag: (h >> 32) as u32,
                    },
                    None => match old.next() {
                        Some(e) => e,
                        None => break,
                    },
                };
                min = min.min(e.pos);
                max = max.max(e.pos);
                entries.push(e);
            }
            starts.push(entries.len() as u32);
        }
        Some((
            Table {
                masks: self.masks,
                tuple: self.tuple,
                min,
                max,
                bucket_mask: self.bucket_mask,
                starts: starts.into(),
                entries: entries.into(),
            },
            None,
        ))
    }

    /// [`Table::updated`] when no position moves (`remap` is the identity but for the
    /// removed rules, whose entries are `gone`, when known) and the bucket array stays: the
    /// runs of buckets that neither lose nor gain an entry are copied whole (their starts
    /// shifted by what the buckets before them gained or lost) and only the touched buckets
    /// are merged. `ins` is sorted by (bucket,
    /// position). Gives exactly the arrays of the bucket-by-bucket merge.
    ///
    /// The probe copy is patched alongside from `probe` (this table's): a kept entry's rule
    /// and filter are where they were, so its probe entry is copied with it (whole runs for
    /// the untouched buckets) and only the inserted entries' are made, from `filters` (the
    /// new index's). Equals the probe copy built from the new entries.
    pub(crate) fn patched(
        &self,
        probe: &[ProbeEntry],
        remap: &impl Fn(u32) -> Option<u32>,
        ins: Vec<(u32, u64)>,
        gone: Option<&[u32]>,
        filters: &Chunks<HeaderFilter>,
    ) -> (Table, Probes) {
        let buckets = self.starts.len() - 1;
        let bucket = |h: u64| (h & self.bucket_mask) as usize;
        // Buckets that lose or gain an entry, ascending, no repeats.
        let mut touched: Vec<usize> = ins.iter().map(|&(_, h)| bucket(h)).collect();
        let scanned: Vec<u32>;
        let gone = match gone {
            Some(gone) => gone,
            None => {
                scanned = (0..self.entries.len() as u32)
                    .filter(|&i| remap(self.entries[i as usize].pos).is_none())
                    .collect();
                &scanned
            }
        };
        let removed = gone.len();
        for &i in gone {
            touched.push(self.starts.partition_point(|&s| s <= i) - 1);
        }
        touched.sort_unstable();
        touched.dedup();
        let (ins_min, ins_max) = (
            ins.iter().map(|e| e.0).min().unwrap_or(u32::MAX),
            ins.iter().map(|e| e.0).max().unwrap_or(0),
        );
        let mut starts: Vec<u32> = Vec::with_capacity(buckets + 1);
        let n = self.entries.len() - removed + ins.len();
        let mut entries: Vec<Entry> = Vec::with_capacity(n);
        let mut probes: Vec<ProbeEntry> = Vec::with_capacity(n + 1);
        let mut ins = ins.into_iter().peekable();
        // Appends the unchanged buckets `from..to` (`to` may be `buckets`, the end mark).
        let copy = |starts: &mut Vec<u32>,
                    entries: &mut Vec<Entry>,
                    probes: &mut Vec<ProbeEntry>,
                    from: usize,
                    to: usize| {
            let lo = self.starts[from] as usize;
            let hi = self.starts[to.min(buckets)] as usize;
            let shift = entries.len() as i64 - lo as i64;
            let end = if to == buckets { to + 1 } else { to };
            starts.extend(
                self.starts[from..end]
                    .iter()
                    .map(|&s| (i64::from(s) + shift) as u32),
            );
            entries.extend_from_slice(&self.entries[lo..hi]);
            probes.extend_from_slice(&probe[lo..hi]);
        };
        let mut from = 0;
        for &b in &touched {
            copy(&mut starts, &mut entries, &mut probes, from, b);
            starts.push(entries.len() as u32);
            // The bucket's kept entries, by index into `self.entries` (and `probe`).
            let mut old = (self.starts[b] as usize..self.starts[b + 1] as usize)
                .filter(|&i| remap(self.entries[i].pos).is_some())
                .peekable();
            // Merge two ascending runs: the bucket's kept entries and its insertions.
            loop {
                let next_ins = ins.next_if(|&(pos, h)| {
                    bucket(h) == b && old.peek().is_none_or(|&i| pos < self.entries[i].pos)
                });
                match next_ins {
                    Some((pos, h)) => {
                        let e = Entry {
                            pos,
                            tag: (h >> 32) as u32,
                        };
                        entries.push(e);
                        probes.push(ProbeEntry::of(e, &filters[pos as usize]));
                    }
                    None => match old.next() {
                        Some(i) => {
                            entries.push(self.entries[i]);
                            probes.push(probe[i]);
                        }
                        None => break,
                    },
                }
            }
            from = b + 1;
        }
        copy(&mut starts, &mut entries, &mut probes, from, buckets);
        probes.push(ProbeEntry::SENTINEL);
        debug_assert_eq!(starts.len(), buckets + 1);
        let scan = || entries.iter().map(|e| e.pos);
        let min = if remap(self.min).is_some() {
            self.min.min(ins_min)
        } else {
            scan().min().unwrap_or(u32::MAX)
        };
        let max = if remap(self.max).is_some() {
            self.max.max(ins_max)
        } else {
            scan().max().unwrap_or(0)
        };
        let table = Table {
            masks: self.masks,
            tuple: self.tuple,
            min,
            max,
            bucket_mask: self.bucket_mask,
            starts: starts.into(),
            entries: entries.into(),
        };
        (table, Arc::new(probes))
    }
}

impl ChainIndex {
    /// Builds the index of a chain's rules (`width`: 32 for IPv4, 128 for IPv6), with RFC
    /// tables when `width` is 32 and the chain's length is within `rfc_rules` (min, max).
    pub(crate) fn build(rules: &RuleChunks, width: u32, rfc_rules: (u32, u32)) -> ChainIndex {
        let mut tables: Vec<TableBuilder> = Vec::new();
        let mut fallback = Vec::new();
        let mut effects = Vec::new();
        for (pos, r) in rules.iter().enumerate() {
            let pos = pos as u32;
            if has_side_effects(r) {
                effects.push(pos);
                continue;
            }
            let key = rule_key(r, width);
            if key.tuple.is_empty() {
                fallback.push(pos);
                continue;
            }
            // The first fitting table (tables are in creation order, which is the order of
            // their best rule) with room for this key.
            let mut chosen = None;
            for (ti, t) in tables.iter().enumerate() {
                if t.tuple.fits(key.tuple) {
                    let h = t.masks.hash(key.src, key.dst, key.l4);
                    if t.load.get(&h).copied().unwrap_or(0) < COLLIDE_LIMIT {
                        chosen = Some((ti, h));
                        break;
                    }
                }
            }
            let (ti, h) = match chosen {
                Some(c) => c,
                None => {
                    // Every existing table that fits is full for this key: a new table with
                    // the relaxed tuple, else with both addresses kept (cut to bytes), else
                    // the rule's exact tuple (which may exceed the limit when many rules pin
                    // the same values).
                    let tuple = key
                        .tuple
                        .new_table(width, |tu| tables.iter().any(|t| t.tuple == tu));
                    let ti = match tables.iter().position(|t| t.tuple == tuple) {
                        Some(ti) => ti,
                        None => {
                            tables.push(TableBuilder::new(tuple, width));
                            tables.len() - 1
                        }
                    };
                    (ti, tables[ti].masks.hash(key.src, key.dst, key.l4))
                }
            };
            tables[ti].insert(pos, h);
        }
        let mut tables: Vec<Table> = tables.into_iter().map(TableBuilder::finish).collect();
        tables.sort_by_key(|t| t.min);
        let probes = vec![None; tables.len()];
        ChainIndex {
            tables: tables.into_boxed_slice(),
            probes: Box::default(),
            fallback: fallback.into_boxed_slice(),
            effects: effects.into_boxed_slice(),
            filters: rules.iter().map(|r| HeaderFilter::of(r, width)).collect(),
            rfc: None,
            bytes: 0,
        }
        .with_rfc(probes, width, rfc_rules)
    }

    /// The index of `rules`, which equal the rules this index was built for (`old_rules`)
    /// except that the `removed` rules at position `at` were replaced by the `added` rules
    /// now at `at`
    /// (TupleMerge's online update, without touching `self`). Costs a copy of the entries
    /// (no hashing) plus one placement per added rule; a table whose entries outgrow its
    /// buckets is rehashed. RFC tables (`rfc_rules` as for [`ChainIndex::build`]) are
    /// built afresh: they have no online update.
    pub(crate) fn update(
        &self,
        old_rules: &RuleChunks,
        rules: &RuleChunks,
        width: u32,
        (at, removed, added): (u32, u32, u32),
        rfc_rules: (u32, u32),
    ) -> ChainIndex {
        let end = at + removed;
        let remap = |pos: u32| -> Option<u32> {
            if pos < at {
                Some(pos)
            } else if pos < end {
                None
            } else {
                Some(pos - removed + added)
            }
        };
        let remap_list =
            |list: &[u32]| -> Vec<u32> { list.iter().filter_map(|&p| remap(p)).collect() };
        let mut fallback = remap_list(&self.fallback);
        let mut effects = remap_list(&self.effects);
        // New placements per table (index into `self.tables`, then into `fresh`).
        let mut inserts: Vec<Vec<(u32, u64)>> = vec![Vec::new(); self.tables.len()];
        let mut fresh: Vec<TableBuilder> = Vec::new();
        for pos in at..at + added {
            let r = &rules[pos as usize];
            if has_side_effects(r) {
                effects.push(pos);
                continue;
            }
            let key = rule_key(r, width);
            if key.tuple.is_empty() {
                fallback.push(pos);
                continue;
            }
            let mut chosen = false;
            for (ti, t) in self.tables.iter().enumerate() {
                if !t.tuple.fits(key.tuple) {
                    continue;
                }
                let h = t.masks.hash(key.src, key.dst, key.l4);
                let load =
                    t.load(h, &remap) + inserts[ti].iter().filter(|e| e.1 == h).count() as u32;
                if load < COLLIDE_LIMIT {
                    inserts[ti].push((pos, h));
                    chosen = true;
                    break;
                }
            }
            if chosen {
                continue;
            }
            if let Some(t) = fresh.iter_mut().find(|t| {
                t.tuple.fits(key.tuple) && {
                    let h = t.masks.hash(key.src, key.dst, key.l4);
                    t.load.get(&h).copied().unwrap_or(0) < COLLIDE_LIMIT
                }
            }) {
                let h = t.masks.hash(key.src, key.dst, key.l4);
                t.insert(pos, h);
                continue;
            }
            let exists = |tuple: Tuple| {
                self.tables.iter().any(|t| t.tuple == tuple)
                    || fresh.iter().any(|t| t.tuple == tuple)
            };
            let tuple = key.tuple.new_table(width, exists);
            let ti = match self.tables.iter().position(|t| t.tuple == tuple) {
                Some(ti) => {
                    let h = self.tables[ti].masks.hash(key.src, key.dst, key.l4);
                    inserts[ti].push((pos, h));
                    continue;
                }
                None => match fresh.iter().position(|t| t.tuple == tuple) {
                    Some(fi) => fi,
                    None => {
                        fresh.push(TableBuilder::new(tuple, width));
                        fresh.len() - 1
                    }
                },
            };
            let h = fresh[ti].masks.hash(key.src, key.dst, key.l4);
            fresh[ti].insert(pos, h);
        }
        fallback.sort_unstable();
        effects.sort_unstable();
        // The new rules' filters replace the removed ones'; the chunks the change leaves in
        // place are shared (all of them but the changed run's for a replace).
        let filters = self.filters.splice(
            at as usize,
            removed as usize,
            rules
                .range(at as usize..(at + added) as usize)
                .map(|r| HeaderFilter::of(r, width))
                .collect(),
        );
        // A table no rule left or joined keeps its arrays and its probe copy (`Arc`s) when
        // no position moved: always for a replace (as many rules added as removed), and for
        // tables wholly before the change otherwise. A table whose positions stay but which
        // lost or gained rules gets its probe copy patched from the old one.
        let shifts_from = (removed != added).then_some(at);
        let gone = (removed <= GONE_LOOKUP_MAX)
            .then(|| self.gone_entries(old_rules, width, at..end))
            .flatten();
        let mut tables: Vec<(Table, Option<Probes>)> = self
            .tables
            .iter()
            .zip(self.probes.iter())
            .zip(inserts)
            .enumerate()
            .filter_map(|(ti, ((t, probe), ins))| {
                let gone = gone.as_ref().map(|g| g[ti].as_slice());
                t.updated(
                    probe,
                    &remap,
                    shifts_from,
                    ins,
                    gone,
                    rules,
                    &filters,
                    width,
                )
            })
            .chain(fresh.into_iter().map(|b| (b.finish(), None)))
            .collect();
        tables.sort_by_key(|t| t.0.min);
        let (tables, probes): (Vec<Table>, Vec<_>) = tables.into_iter().unzip();
        ChainIndex {
            tables: tables.into_boxed_slice(),
            probes: Box::default(),
            fallback: fallback.into_boxed_slice(),
            effects: effects.into_boxed_slice(),
            filters,
            rfc: None,
            bytes: 0,
        }
        .with_rfc(probes, width, rfc_rules)
    }

    /// For each table, the indices (ascending) of its entries for the rules at `positions`
    /// of `old_rules` (the rules this index was built for), found through the rules' keys
    /// (one bucket per fitting table) rather than by a scan of every table's entries; `None`
    /// when one is not where its key says (not expected; the caller then scans).
    pub(crate) fn gone_entries(
        &self,
        old_rules: &RuleChunks,
        width: u32,
        positions: std::ops::Range<u32>,
    ) -> Option<Vec<Vec<u32>>> {
        if old_rules.len() != self.filters.len() {
            return None;
        }
        let mut gone = vec![Vec::new(); self.tables.len()];
        for pos in positions {
            let r = &old_rules[pos as usize];
            if has_side_effects(r) {
                continue;
            }
            let key = rule_key(r, width);
            if key.tuple.is_empty() {
                continue;
            }
            let (ti, i) = self
                .tables
                .iter()
                .enumerate()
                .filter(|(_, t)| t.tuple.fits(key.tuple))
                .find_map(|(ti, t)| {
                    let b = (t.masks.hash(key.src, key.dst, key.l4) & t.bucket_mask) as usize;
                    (t.starts[b]..t.starts[b + 1])
                        .find(|&i| t.entries[i as usize].pos == pos)
                        .map(|i| (ti, i))
                })?;
            gone[ti].push(i);
        }
        for g in &mut gone {
            g.sort_unstable();
        }
        Some(gone)
    }

    /// Bytes held by the index (structs and arrays, not the rules it points at).
    pub(crate) fn memory_bytes(&self) -> usize {
        size_of::<ChainIndex>()
            + self
                .tables
                .iter()
                .map(|t| {
                    size_of::<Table>() + 4 * t.starts.len() + size_of_val::<[Entry]>(&t.entries)
                })
                .sum::<usize>()
            + self
                .probes
                .iter()
                .map(|p| {
                    size_of::<Probes>()
                        + size_of::<Vec<ProbeEntry>>()
                        + size_of_val::<[ProbeEntry]>(p)
                })
                .sum::<usize>()
            + 4 * (self.fallback.len() + self.effects.len())
            + size_of::<HeaderFilter>() * self.filters.len()
            + self.rfc.as_ref().map_or(0, Rfc::memory_bytes)
    }

    /// Fills [`ChainIndex::probes`] (`probes[t]`: table `t`'s copy where it is known, else
    /// built here), adds RFC tables where the chain qualifies, then sets
    /// [`ChainIndex::bytes`].
    pub(crate) fn with_rfc(
        mut self,
        probes: Vec<Option<Probes>>,
        width: u32,
        (min, max): (u32, u32),
    ) -> ChainIndex {
        self.probes = self
            .tables
            .iter()
            .zip(probes)
            .map(|(t, known)| known.unwrap_or_else(|| t.probes(&self.filters)))
            .collect();
        let n = self.filters.len();
        if width == 32 && n >= min as usize && n <= max as usize {
            // RFC is for small chains: a flat copy of their filters costs little.
            let filters: Vec<HeaderFilter> = self.filters.iter().copied().collect();
            self.rfc = Rfc::build(&filters, &self.effects);
        }
        self.bytes = self.memory_bytes();
        self
    }

    /// Whether queries go through RFC tables first ([`Snapshot::classify_batch`] probes
    /// such a chain in batches whatever its size).
    pub(crate) fn has_rfc(&self) -> bool {
        self.rfc.is_some()
    }

    /// [`ChainIndex::memory_bytes`], computed when the index was built.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of hash tables.
    pub(crate) fn tables(&self) -> usize {
        self.tables.len()
    }
}
