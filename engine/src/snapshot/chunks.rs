//! A chain's compiled rules (and its index's per-rule filters) in fixed-size chunks shared
//! between snapshots.
//!
//! A snapshot is immutable, so a commit that changes a few rules of a chain builds the chain's
//! new rule array beside the old one. With one flat array that meant copying every rule (168
//! bytes each: 17 MB for a 100k-rule chain) and, once the old snapshot retires, dropping every
//! old rule: ~30% of a 100k-rule incremental commit (BENCHMARKS.md section 5). Here the array
//! is cut into chunks of [`CHUNK`] rules, each behind an `Arc`; a new array shares every
//! chunk the change leaves in place: all chunks before the first changed rule, and, when the
//! change keeps the rule count (a replace), all chunks after the changed run too. A change
//! that moves the rules after it (an insert or delete) rebuilds the chunks from the change to
//! the end. This is the copy-on-write chunking persistent vectors use (a one-level RRB/radix
//! tree without relaxed nodes; P. Bagwell, T. Rompf, "RRB-Trees: Efficient Immutable
//! Vectors", EPFL 2011).
//!
//! Reading rule `i` is one more load than a flat array (the chunk pointer, from a table of
//! `len / CHUNK` fat pointers that stays in L1 for the chains the engine sees).
//!
//! The same structure, [`Chunks`], holds the TupleMerge index's [`HeaderFilter`]s (one per
//! rule, 28 bytes: 2.8 MB for 100k rules, which an update used to copy whole; a chunk of them
//! is 28 KiB), so a replace shares all but the changed filters' chunk there too.

use std::ops::Index;
use std::sync::Arc;

use super::CRule;
#[cfg(doc)]
use super::tuple_merge::HeaderFilter;

/// log2 of [`CHUNK`].
pub(crate) const SHIFT: u32 = 10;

/// Items per chunk (1024: 168 KiB of rules; a 100k chain has 98 chunks).
pub(crate) const CHUNK: usize = 1 << SHIFT;

/// A chain's items (rules, filters), by position, in shared chunks of [`CHUNK`] (the last
/// one may be shorter).
#[derive(Debug)]
pub(crate) struct Chunks<T> {
    pub(crate) chunks: Box<[Arc<[T]>]>,
    pub(crate) len: usize,
}

/// A chain's compiled rules, by position.
pub(crate) type RuleChunks = Chunks<CRule>;

impl<T> Default for Chunks<T> {
    fn default() -> Chunks<T> {
        Chunks {
            chunks: Box::default(),
            len: 0,
        }
    }
}

impl<T> FromIterator<T> for Chunks<T> {
    /// Chunks of the items, in order, each collected straight into its `Arc`.
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Chunks<T> {
        let mut rest = items.into_iter();
        let mut chunks = Vec::new();
        let mut len = 0;
        loop {
            let chunk: Arc<[T]> = rest.by_ref().take(CHUNK).collect();
            if chunk.is_empty() {
                break;
            }
            len += chunk.len();
            chunks.push(chunk);
        }
        Chunks {
            chunks: chunks.into_boxed_slice(),
            len,
        }
    }
}

impl<T> Chunks<T> {
    /// Chunks of `items`, in order.
    pub(crate) fn new(items: Vec<T>) -> Chunks<T> {
        items.into_iter().collect()
    }

    /// Number of items.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Item `i`, or `None` past the end.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i >> SHIFT)?.get(i & (CHUNK - 1))
    }

    /// All items, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + Clone {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// Items `range`, in order.
    pub(crate) fn range(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = &T> + Clone {
        let first = (range.start >> SHIFT).min(self.chunks.len());
        self.chunks[first..]
            .iter()
            .flat_map(|c| c.iter())
            .skip(range.start & (CHUNK - 1))
            .take(range.len())
    }

    /// Chunk `c` (tests check which chunks two arrays share).
    #[cfg(test)]
    pub(crate) fn chunk(&self, c: usize) -> &Arc<[T]> {
        &self.chunks[c]
    }

    /// Items `range` as slices of the chunks, in order.
    fn slices(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = &[T]> {
        let first = range.start >> SHIFT;
        let last = range.end.div_ceil(CHUNK).min(self.chunks.len());
        self.chunks[first.min(last)..last]
            .iter()
            .enumerate()
            .map(move |(k, c)| {
                let base = (first + k) << SHIFT;
                let lo = range.start.max(base) - base;
                let hi = range.end.min(base + c.len()) - base;
                &c[lo..hi]
            })
    }

    /// The first position in `start..len` whose item satisfies `f`, a chunk slice at a time
    /// (the linear walk; no per-rule chunk lookup).
    #[inline]
    pub(crate) fn find_from(&self, start: u32, mut f: impl FnMut(&T) -> bool) -> Option<u32> {
        let mut c = start as usize >> SHIFT;
        let mut off = start as usize & (CHUNK - 1);
        while let Some(chunk) = self.chunks.get(c) {
            if let Some(k) = chunk.get(off..).and_then(|s| s.iter().position(&mut f)) {
                return Some(((c << SHIFT) + off + k) as u32);
            }
            c += 1;
            off = 0;
        }
        None
    }

    /// These items with the `removed` items at `at` replaced by `added`: chunks before `at`
    /// are shared, and when `added.len() == removed` so are the chunks after the change; the
    /// others are built anew (the unchanged items in them cloned, which is cheap).
    pub(crate) fn splice(&self, at: usize, removed: usize, added: Vec<T>) -> Chunks<T>
    where
        T: Clone,
    {
        let first = at >> SHIFT;
        let len = self.len - removed + added.len();
        let mut chunks: Vec<Arc<[T]>> = Vec::with_capacity(len.div_ceil(CHUNK));
        chunks.extend_from_slice(&self.chunks[..first.min(self.chunks.len())]);
        let start = first << SHIFT;
        if added.len() == removed {
            // Positions stay: rebuild only the chunks that hold a changed item.
            let end = at + removed;
            let last = if removed == 0 {
                first
            } else {
                (end - 1) >> SHIFT
            };
            let mut added = added.into_iter();
            for c in first..=last.min(self.chunks.len().saturating_sub(1)) {
                let base = c << SHIFT;
                let chunk: Arc<[T]> = self.chunks[c]
                    .iter()
                    .enumerate()
                    .map(|(k, r)| {
                        let pos = base + k;
                        if (at..end).contains(&pos) {
                            added.next().expect("one new item per replaced one")
                        } else {
                            r.clone()
                        }
                    })
                    .collect();
                chunks.push(chunk);
            }
            chunks.extend_from_slice(&self.chunks[(last + 1).min(self.chunks.len())..]);
            return Chunks {
                chunks: chunks.into_boxed_slice(),
                len,
            };
        }
        // Positions after the change move: rebuild from the change's chunk to the end, a
        // slice at a time (a copy for `Copy` items; an iterator chain per item measured slower).
        let mut buf: Vec<T> = Vec::with_capacity(CHUNK);
        let pieces = self
            .slices(start..at)
            .chain([added.as_slice()])
            .chain(self.slices(at + removed..self.len));
        for mut piece in pieces {
            while !piece.is_empty() {
                let k = (CHUNK - buf.len()).min(piece.len());
                buf.extend_from_slice(&piece[..k]);
                piece = &piece[k..];
                if buf.len() == CHUNK {
                    chunks.push(buf.drain(..).collect());
                }
            }
        }
        if !buf.is_empty() {
            chunks.push(buf.into());
        }
        Chunks {
            chunks: chunks.into_boxed_slice(),
            len,
        }
    }
}

impl<T> Index<usize> for Chunks<T> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.chunks[i >> SHIFT][i & (CHUNK - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::AddrMatch;

    /// A rule told apart by its source address `i`.
    fn rule(template: &CRule, i: u32) -> CRule {
        CRule {
            src: AddrMatch::new(u128::from(i), u128::from(u32::MAX)),
            ..template.clone()
        }
    }

    fn ids(rules: &RuleChunks) -> Vec<u32> {
        rules.iter().map(|r| r.src.net() as u32).collect()
    }

    fn template() -> CRule {
        let text = "*filter\n:INPUT DROP [0:0]\n-A INPUT -s 10.0.0.1 -j ACCEPT\nCOMMIT\n";
        let rs = crate::restore::parse_ruleset("t", text, &Default::default()).expect("parses");
        let snap =
            crate::snapshot::Snapshot::compile(&[std::sync::Arc::new(rs)], &crate::sets::NoSets, 1)
                .expect("compiles");
        let input = snap
            .chains
            .iter()
            .find(|c| &*c.name == "INPUT")
            .expect("INPUT");
        input.body.rules[0].clone()
    }

    #[test]
    fn splices_equal_a_flat_splice_and_share_untouched_chunks() {
        let t = template();
        let mut flat: Vec<u32> = (0..3 * CHUNK as u32 + 100).collect();
        let mut chunks = RuleChunks::new(flat.iter().map(|&i| rule(&t, i)).collect());
        let mut next_id = 1_000_000;
        // (at, removed, added): replaces inside a chunk and across a boundary, inserts and
        // deletes at the start, middle and end, down to nothing and back.
        let steps: Vec<(usize, usize, usize)> = vec![
            (5, 1, 1),
            (CHUNK - 2, 4, 4),
            (2 * CHUNK + 7, 0, 3),
            (0, 2, 0),
            (CHUNK, 1, 70),
            (3 * CHUNK, 30, 30),
            (usize::MAX, 0, 5),
            (17, CHUNK + 3, 1),
            (0, usize::MAX, 0),
            (0, 0, 2 * CHUNK + 1),
        ];
        for (n, &(at, removed, added)) in steps.iter().enumerate() {
            let at = at.min(flat.len());
            let removed = removed.min(flat.len() - at);
            let new: Vec<u32> = (0..added as u32).map(|k| next_id + k).collect();
            next_id += added as u32;
            let old = chunks;
            chunks = old.splice(at, removed, new.iter().map(|&i| rule(&t, i)).collect());
            flat.splice(at..at + removed, new);
            assert_eq!(ids(&chunks), flat, "step {n}");
            assert_eq!(chunks.len(), flat.len());
            // Every chunk but the last is full, so rule i is at chunk i / CHUNK.
            for i in [0, CHUNK - 1, CHUNK, flat.len().saturating_sub(1)] {
                if i < flat.len() {
                    assert_eq!(chunks[i].src.net() as u32, flat[i], "step {n}, rule {i}");
                    assert_eq!(chunks.get(i).map(|r| r.src.net() as u32), Some(flat[i]));
                }
            }
            assert!(chunks.get(flat.len()).is_none());
            // Chunks wholly before the change are shared; after it too for a replace.
            let shared = |c: usize| {
                old.chunks
                    .get(c)
                    .zip(chunks.chunks.get(c))
                    .is_some_and(|(a, b)| Arc::ptr_eq(a, b))
            };
            for c in 0..at / CHUNK {
                assert!(shared(c), "step {n}: chunk {c} before the change copied");
            }
            if added == removed && removed > 0 {
                for c in (at + removed - 1) / CHUNK + 1..chunks.chunks.len() {
                    assert!(shared(c), "step {n}: chunk {c} after a replace copied");
                }
            }
            // The linear walk's search crosses chunk boundaries.
            if let Some(&want) = flat.get(CHUNK + 5) {
                assert_eq!(
                    chunks.find_from(3, |r| r.src.net() as u32 == want),
                    flat.iter().position(|&i| i == want).map(|p| p as u32)
                );
            }
            assert_eq!(chunks.find_from(0, |_| false), None);
            let r = flat.len() / 3..flat.len() / 2;
            assert_eq!(
                chunks
                    .range(r.clone())
                    .map(|x| x.src.net() as u32)
                    .collect::<Vec<_>>(),
                flat[r].to_vec()
            );
        }
    }
}
