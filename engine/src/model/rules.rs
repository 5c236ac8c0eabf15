//! A chain's rules as a copy-on-write list of shared chunks ([`RuleList`]).
//!
//! A commit builds the next model beside the active one, which stays in use until the commit
//! is published (and in the retired snapshot after that). With the rules of a chain in one
//! `Vec`, a one-rule change of a 100k-rule chain meant cloning, comparing and finally dropping
//! two ~30 MB arrays. Here the rules are cut into chunks of about `CHUNK` rules, each behind
//! an `Arc`: cloning a list clones the chunk pointers, an edit copies only the chunk it lands
//! in, and two lists that share chunks are compared chunk by chunk (`Arc::ptr_eq`) without
//! reading the rules in them. The chunks are those of the compiled rules in
//! `snapshot/chunks.rs` (a one-level persistent vector, P. Bagwell, T. Rompf, "RRB-Trees:
//! Efficient Immutable Vectors", EPFL 2011) with variable sizes, so that an insert or a delete
//! moves no rule outside its own chunk.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::iter::FusedIterator;
use std::ops::{Index, IndexMut, Range};
use std::sync::{Arc, OnceLock};

use super::{Location, Match, Rule, Target};

/// Rules per chunk when a list is built or grows at its end; an insert splits a chunk that
/// reaches twice this size, a delete removes a chunk that becomes empty.
pub(crate) const CHUNK: usize = 256;

/// One chunk: at least one rule (a list holds no empty chunk).
#[derive(Clone)]
struct Chunk {
    rules: Vec<Rule>,
    /// `false` only when no rule of the chunk jumps, goes to a chain or has `-m set`
    /// ([`needs_rescan`]): [`diff`] skips a shared chunk without that flag unread. Set
    /// conservatively (`true`) when a rule is handed out mutably.
    special: bool,
    /// What a commit asks of every rule, for the chunk's rules ([`Summary`]), computed on
    /// first use and kept while the chunk is shared; cleared by [`Chunk::make_mut`].
    summary: OnceLock<Summary>,
}

/// What a commit needs to know of all the rules of a chunk, kept with it so that a list
/// edited from a clone of another is summed up from one figure per shared chunk.
#[derive(Clone, Copy, Debug)]
struct Summary {
    /// The bytes of a packet the rules read ([`RuleList::packet_reads`]).
    reads: u32,
    /// Some rule carries counters from its text ([`RuleList::has_counters`]).
    counters: bool,
}

impl Summary {
    fn of(rules: &[Rule]) -> Summary {
        Summary {
            reads: rules
                .iter()
                .map(crate::snapshot::copy_range::rule_reads)
                .max()
                .unwrap_or(0),
            counters: rules.iter().any(|r| r.counters.is_some()),
        }
    }
}

impl Chunk {
    fn new(rules: Vec<Rule>) -> Chunk {
        let special = rules.iter().any(needs_rescan);
        Chunk {
            rules,
            special,
            summary: OnceLock::new(),
        }
    }

    /// The chunk for writing (copied first when shared, as `Arc::make_mut`), its cached
    /// [`Chunk::summary`] cleared: every change to a chunk's rules goes through here.
    fn make_mut(c: &mut Arc<Chunk>) -> &mut Chunk {
        let c = Arc::make_mut(c);
        c.summary = OnceLock::new();
        c
    }

    fn summary(&self) -> Summary {
        *self.summary.get_or_init(|| Summary::of(&self.rules))
    }
}

/// Whether validation must see a rule again even when it is unchanged: it adds an edge to the
/// table's jump graph (`-j CHAIN`, `-g CHAIN`) or depends on the set registry (`-m set`).
pub(crate) fn needs_rescan(r: &Rule) -> bool {
    matches!(r.target, Target::Jump(_) | Target::Goto(_))
        || r.matches.iter().any(|m| matches!(m, Match::Set(_)))
}

/// A chain's rules in evaluation order: a `Vec<Rule>`-like list whose clones share their
/// storage, in chunks of about `CHUNK` rules behind `Arc`s (module docs). `clone` costs one
/// pointer copy and reference count per chunk (a 100k-rule chain: ~400); `insert`, `remove`,
/// `set` and mutable access copy only the chunk they touch when it is shared. Reading rule `i`
/// is a binary search over the chunks' start positions; iteration walks the chunks in order.
///
/// Equality, hashing and `Debug` are those of the `Vec<Rule>` with the same rules, whatever
/// the chunk boundaries.
#[derive(Clone, Default)]
pub struct RuleList {
    chunks: Vec<Arc<Chunk>>,
    /// Position of each chunk's first rule, ascending.
    starts: Vec<usize>,
    len: usize,
}

impl RuleList {
    /// No rules.
    pub const fn new() -> RuleList {
        RuleList {
            chunks: Vec::new(),
            starts: Vec::new(),
            len: 0,
        }
    }

    /// Number of rules.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no rule.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// (chunk, offset in it) of position `i < len`.
    #[inline]
    fn locate(&self, i: usize) -> (usize, usize) {
        debug_assert!(i < self.len);
        let c = self.starts.partition_point(|&s| s <= i) - 1;
        (c, i - self.starts[c])
    }

    /// Rule `i` (0-based), or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&Rule> {
        (i < self.len).then(|| {
            let (c, o) = self.locate(i);
            &self.chunks[c].rules[o]
        })
    }

    /// Rule `i` for writing, or `None` past the end; copies its chunk first when it is shared.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Rule> {
        if i >= self.len {
            return None;
        }
        let (c, o) = self.locate(i);
        let chunk = Chunk::make_mut(&mut self.chunks[c]);
        chunk.special = true;
        Some(&mut chunk.rules[o])
    }

    /// The first rule.
    pub fn first(&self) -> Option<&Rule> {
        self.chunks.first().and_then(|c| c.rules.first())
    }

    /// The last rule.
    pub fn last(&self) -> Option<&Rule> {
        self.chunks.last().and_then(|c| c.rules.last())
    }

    /// All rules, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            chunks: self.chunks.iter(),
            front: [].iter(),
            back: [].iter(),
            len: self.len,
        }
    }

    /// Rules `range` (0-based positions), in order.
    ///
    /// Panics when `range` is not within `0..len()` or starts after its end, as slicing does.
    pub fn range(&self, range: Range<usize>) -> Iter<'_> {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "rule range {range:?} out of 0..{}",
            self.len
        );
        if range.is_empty() {
            return Iter {
                chunks: [].iter(),
                front: [].iter(),
                back: [].iter(),
                len: 0,
            };
        }
        let (cs, os) = self.locate(range.start);
        let (ce, oe) = self.locate(range.end - 1);
        if cs == ce {
            return Iter {
                chunks: [].iter(),
                front: self.chunks[cs].rules[os..=oe].iter(),
                back: [].iter(),
                len: range.len(),
            };
        }
        Iter {
            chunks: self.chunks[cs + 1..ce].iter(),
            front: self.chunks[cs].rules[os..].iter(),
            back: self.chunks[ce].rules[..=oe].iter(),
            len: range.len(),
        }
    }

    /// All rules for writing, in order; copies every shared chunk first.
    pub fn iter_mut(&mut self) -> IterMut<'_> {
        IterMut {
            len: self.len,
            chunks: self.chunks.iter_mut(),
            front: [].iter_mut(),
            back: [].iter_mut(),
        }
    }

    /// Appends a rule.
    pub fn push(&mut self, rule: Rule) {
        let special = needs_rescan(&rule);
        match self.chunks.last_mut() {
            Some(last) if last.rules.len() < CHUNK => {
                let last = Chunk::make_mut(last);
                last.special |= special;
                last.rules.push(rule);
            }
            _ => {
                // A chain's first chunk grows as a `Vec` does (most chains hold a few rules:
                // reserving CHUNK rules, ~80 KB, for each made 10k one-rule chains take
                // 0.8 GB); a later one is reserved whole, as its chain is long.
                let mut rules = if self.chunks.is_empty() {
                    Vec::with_capacity(1)
                } else {
                    Vec::with_capacity(CHUNK)
                };
                rules.push(rule);
                self.starts.push(self.len);
                self.chunks.push(Arc::new(Chunk {
                    rules,
                    special,
                    summary: OnceLock::new(),
                }));
            }
        }
        self.len += 1;
    }

    /// Inserts `rule` at position `i` (0-based), moving the rules from `i` on one place back,
    /// as `Vec::insert`. Copies only the chunk it lands in (and splits it when it reaches
    /// twice `CHUNK`).
    ///
    /// Panics when `i > len()`.
    pub fn insert(&mut self, i: usize, rule: Rule) {
        assert!(
            i <= self.len,
            "insertion index (is {i}) should be <= len (is {})",
            self.len
        );
        if i == self.len {
            self.push(rule);
            return;
        }
        let (c, o) = self.locate(i);
        let chunk = Chunk::make_mut(&mut self.chunks[c]);
        chunk.rules.insert(o, rule);
        let split = chunk.rules.len() >= 2 * CHUNK;
        if split {
            let tail = chunk.rules.split_off(CHUNK);
            chunk.special = chunk.rules.iter().any(needs_rescan);
            self.chunks.insert(c + 1, Arc::new(Chunk::new(tail)));
            // Its position already counts the new rule.
            self.starts.insert(c + 1, self.starts[c] + CHUNK);
        } else {
            chunk.special = chunk.rules.iter().any(needs_rescan);
        }
        self.len += 1;
        let after = if split { c + 2 } else { c + 1 };
        for s in &mut self.starts[after..] {
            *s += 1;
        }
    }

    /// Removes and returns rule `i` (0-based), moving the rules after it one place forward,
    /// as `Vec::remove`. Copies only its chunk (or drops it when it held only this rule).
    ///
    /// Panics when `i >= len()`.
    pub fn remove(&mut self, i: usize) -> Rule {
        assert!(
            i < self.len,
            "removal index (is {i}) should be < len (is {})",
            self.len
        );
        let (c, o) = self.locate(i);
        let chunk = Chunk::make_mut(&mut self.chunks[c]);
        let rule = chunk.rules.remove(o);
        let after = if chunk.rules.is_empty() {
            self.chunks.remove(c);
            self.starts.remove(c);
            c
        } else {
            chunk.special = chunk.rules.iter().any(needs_rescan);
            c + 1
        };
        for s in &mut self.starts[after..] {
            *s -= 1;
        }
        self.len -= 1;
        rule
    }

    /// Replaces rule `i` (0-based) and returns the old one. Copies only its chunk.
    ///
    /// Panics when `i >= len()`.
    pub fn set(&mut self, i: usize, rule: Rule) -> Rule {
        assert!(
            i < self.len,
            "index (is {i}) should be < len (is {})",
            self.len
        );
        let (c, o) = self.locate(i);
        let chunk = Chunk::make_mut(&mut self.chunks[c]);
        let old = std::mem::replace(&mut chunk.rules[o], rule);
        chunk.special = chunk.rules.iter().any(needs_rescan);
        old
    }

    /// Replaces rules `range` (0-based positions) by `with`, as `Vec::splice` (the removed
    /// rules are dropped, not returned). Chunks wholly outside `range` are kept (shared); the
    /// chunks it touches are rebuilt, with the rules of theirs outside `range` cloned.
    ///
    /// Panics when `range` is not within `0..len()` or starts after its end.
    pub fn splice(&mut self, range: Range<usize>, with: impl IntoIterator<Item = Rule>) {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "rule range {range:?} out of 0..{}",
            self.len
        );
        // Chunks before `first` lie wholly before the range, chunks from `last` on wholly
        // after it.
        let first = if range.start == self.len {
            self.chunks.len()
        } else {
            self.locate(range.start).0
        };
        let last = if range.end == self.len {
            self.chunks.len()
        } else {
            match self.locate(range.end) {
                (c, 0) => c,
                (c, _) => c + 1,
            }
        };
        let from = self.starts.get(first).copied().unwrap_or(self.len);
        let to = self.starts.get(last).copied().unwrap_or(self.len);
        let mut mid: Vec<Rule> = self.range(from..range.start).cloned().collect();
        mid.extend(with);
        mid.extend(self.range(range.end..to).cloned());
        let tail = self.chunks.split_off(last);
        self.chunks.truncate(first);
        let mut rest = mid.into_iter();
        while rest.len() > 0 {
            let chunk: Vec<Rule> = rest.by_ref().take(CHUNK).collect();
            self.chunks.push(Arc::new(Chunk::new(chunk)));
        }
        self.chunks.extend(tail);
        self.starts.clear();
        let mut at = 0;
        for c in &self.chunks {
            self.starts.push(at);
            at += c.rules.len();
        }
        self.len = at;
    }

    /// Sets the location of every rule from position `from` on to `f` of it (a re-parse
    /// whose lines moved: `restore::parse_after`); copies each shared chunk it touches. Only
    /// locations change, so the chunks keep their validation flag.
    pub fn map_locations_from(&mut self, from: usize, mut f: impl FnMut(Location) -> Location) {
        for (c, &start) in self.chunks.iter_mut().zip(&self.starts) {
            let len = c.rules.len();
            if start + len <= from {
                continue;
            }
            let skip = from.saturating_sub(start);
            for r in &mut Chunk::make_mut(c).rules[skip..] {
                r.location = f(r.location);
            }
        }
    }

    /// Removes every rule.
    pub fn clear(&mut self) {
        *self = RuleList::new();
    }

    /// The rules as a `Vec`, cloned.
    pub fn to_vec(&self) -> Vec<Rule> {
        let mut v = Vec::with_capacity(self.len);
        v.extend(self.iter().cloned());
        v
    }

    /// The rules as a `Vec`; chunks no other list shares are moved, not cloned.
    pub fn into_vec(self) -> Vec<Rule> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks {
            match Arc::try_unwrap(c) {
                Ok(c) => v.extend(c.rules),
                Err(c) => v.extend_from_slice(&c.rules),
            }
        }
        v
    }

    /// The bytes of a packet, from its IP header on, that these rules read beyond the headers
    /// (the largest [`crate::snapshot::copy_range::rule_reads`] of them; 0 for none). Each
    /// chunk's figure is computed once and kept while the chunk is shared, so a list edited
    /// from a clone of another costs a walk of the chunks plus the rules of the chunks the edit
    /// copied.
    pub(crate) fn packet_reads(&self) -> u32 {
        self.chunks
            .iter()
            .map(|c| c.summary().reads)
            .max()
            .unwrap_or(0)
    }

    /// Whether some rule carries counters from its text ([`Rule::counters`]); kept per chunk as
    /// the bytes the rules read are.
    pub fn has_counters(&self) -> bool {
        self.chunks.iter().any(|c| c.summary().counters)
    }

    /// How many of this list's chunks `other` holds too (the same storage, not equal rules).
    #[cfg(test)]
    pub(crate) fn shared_chunks(&self, other: &RuleList) -> usize {
        self.chunks
            .iter()
            .filter(|c| other.chunks.iter().any(|o| Arc::ptr_eq(c, o)))
            .count()
    }

    /// Checks the invariants (tests only): starts, lengths, no empty chunk, exact or
    /// conservative `special` flags.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert_eq!(self.chunks.len(), self.starts.len());
        let mut at = 0;
        for (c, s) in self.chunks.iter().zip(&self.starts) {
            assert_eq!(*s, at);
            assert!(!c.rules.is_empty());
            assert!(c.special || !c.rules.iter().any(needs_rescan));
            at += c.rules.len();
        }
        assert_eq!(at, self.len);
    }
}

/// Forward position in a [`RuleList`]: chunk and offset in it.
#[derive(Clone, Copy)]
struct Cursor {
    c: usize,
    o: usize,
}

/// The longest common prefix and, of what follows it, the longest common suffix of `old` and
/// `new` by [`Rule::same_content`], as `(prefix, old_mid, new_mid)` (see
/// [`super::diff_rules`]). A chunk the two lists share at the same place is skipped whole; of
/// its rules only those [`needs_rescan`] are passed to `unchanged` (prefix in order, suffix
/// from the end, as the rules compared one by one).
pub(crate) fn diff(
    old: &RuleList,
    new: &RuleList,
    mut unchanged: impl FnMut(usize, &Rule),
) -> (u32, u32, u32) {
    let common = old.len.min(new.len);
    let mut prefix = 0;
    let (mut oc, mut nc) = (Cursor { c: 0, o: 0 }, Cursor { c: 0, o: 0 });
    let step = |l: &RuleList, k: &mut Cursor| {
        k.o += 1;
        if k.o == l.chunks[k.c].rules.len() {
            k.c += 1;
            k.o = 0;
        }
    };
    while prefix < common {
        if oc.o == 0 && nc.o == 0 && Arc::ptr_eq(&old.chunks[oc.c], &new.chunks[nc.c]) {
            let chunk = &new.chunks[nc.c];
            if chunk.special {
                for (k, r) in chunk.rules.iter().enumerate() {
                    if needs_rescan(r) {
                        unchanged(prefix + k, r);
                    }
                }
            }
            prefix += chunk.rules.len();
            oc.c += 1;
            nc.c += 1;
            continue;
        }
        let n = &new.chunks[nc.c].rules[nc.o];
        if !old.chunks[oc.c].rules[oc.o].same_content(n) {
            break;
        }
        unchanged(prefix, n);
        prefix += 1;
        step(old, &mut oc);
        step(new, &mut nc);
    }
    // Backward: the rule before the cursor is chunks[c].rules[o - 1] (o >= 1 while in use).
    let back_start = |l: &RuleList| Cursor {
        c: l.chunks.len().saturating_sub(1),
        o: l.chunks.last().map_or(0, |c| c.rules.len()),
    };
    let back = |l: &RuleList, k: &mut Cursor| {
        k.o -= 1;
        if k.o == 0 && k.c > 0 {
            k.c -= 1;
            k.o = l.chunks[k.c].rules.len();
        }
    };
    let (mut oc, mut nc) = (back_start(old), back_start(new));
    let mut suffix = 0;
    while suffix < common - prefix {
        let budget = common - prefix - suffix;
        let (och, nch) = (&old.chunks[oc.c], &new.chunks[nc.c]);
        if oc.o == och.rules.len()
            && nc.o == nch.rules.len()
            && nch.rules.len() <= budget
            && Arc::ptr_eq(och, nch)
        {
            let end = new.len - suffix;
            if nch.special {
                for (k, r) in nch.rules.iter().enumerate().rev() {
                    if needs_rescan(r) {
                        unchanged(end - nch.rules.len() + k, r);
                    }
                }
            }
            suffix += nch.rules.len();
            if suffix < common - prefix {
                oc.c -= 1;
                oc.o = old.chunks[oc.c].rules.len();
                nc.c -= 1;
                nc.o = new.chunks[nc.c].rules.len();
            }
            continue;
        }
        let n = &nch.rules[nc.o - 1];
        if !och.rules[oc.o - 1].same_content(n) {
            break;
        }
        unchanged(new.len - 1 - suffix, n);
        suffix += 1;
        if suffix < common - prefix {
            back(old, &mut oc);
            back(new, &mut nc);
        }
    }
    (
        prefix as u32,
        (old.len - prefix - suffix) as u32,
        (new.len - prefix - suffix) as u32,
    )
}

/// Iterator over a [`RuleList`]'s rules ([`RuleList::iter`], [`RuleList::range`]).
#[derive(Clone)]
pub struct Iter<'a> {
    chunks: std::slice::Iter<'a, Arc<Chunk>>,
    front: std::slice::Iter<'a, Rule>,
    back: std::slice::Iter<'a, Rule>,
    len: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Rule;

    #[inline]
    fn next(&mut self) -> Option<&'a Rule> {
        loop {
            if let Some(r) = self.front.next() {
                self.len -= 1;
                return Some(r);
            }
            match self.chunks.next() {
                Some(c) => self.front = c.rules.iter(),
                None => {
                    let r = self.back.next();
                    if r.is_some() {
                        self.len -= 1;
                    }
                    return r;
                }
            }
        }
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len, Some(self.len))
    }

    fn nth(&mut self, mut n: usize) -> Option<&'a Rule> {
        // Whole chunks are skipped without visiting their rules.
        loop {
            let f = self.front.len();
            if n < f {
                self.len -= n + 1;
                return self.front.nth(n);
            }
            n -= f;
            self.len -= f;
            self.front = [].iter();
            match self.chunks.next() {
                Some(c) => self.front = c.rules.iter(),
                None => {
                    let b = self.back.len();
                    if n < b {
                        self.len -= n + 1;
                        return self.back.nth(n);
                    }
                    self.len -= b;
                    self.back = [].iter();
                    return None;
                }
            }
        }
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(r) = self.back.next_back() {
                self.len -= 1;
                return Some(r);
            }
            match self.chunks.next_back() {
                Some(c) => self.back = c.rules.iter(),
                None => {
                    let r = self.front.next_back();
                    if r.is_some() {
                        self.len -= 1;
                    }
                    return r;
                }
            }
        }
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl FusedIterator for Iter<'_> {}

/// Mutable iterator over a [`RuleList`]'s rules ([`RuleList::iter_mut`]); copies each shared
/// chunk as it reaches it.
pub struct IterMut<'a> {
    chunks: std::slice::IterMut<'a, Arc<Chunk>>,
    front: std::slice::IterMut<'a, Rule>,
    back: std::slice::IterMut<'a, Rule>,
    len: usize,
}

fn chunk_mut(c: &mut Arc<Chunk>) -> std::slice::IterMut<'_, Rule> {
    let c = Chunk::make_mut(c);
    c.special = true;
    c.rules.iter_mut()
}

impl<'a> Iterator for IterMut<'a> {
    type Item = &'a mut Rule;

    fn next(&mut self) -> Option<&'a mut Rule> {
        loop {
            if let Some(r) = self.front.next() {
                self.len -= 1;
                return Some(r);
            }
            match self.chunks.next() {
                Some(c) => self.front = chunk_mut(c),
                None => {
                    let r = self.back.next();
                    if r.is_some() {
                        self.len -= 1;
                    }
                    return r;
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len, Some(self.len))
    }
}

impl DoubleEndedIterator for IterMut<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(r) = self.back.next_back() {
                self.len -= 1;
                return Some(r);
            }
            match self.chunks.next_back() {
                Some(c) => self.back = chunk_mut(c),
                None => {
                    let r = self.front.next_back();
                    if r.is_some() {
                        self.len -= 1;
                    }
                    return r;
                }
            }
        }
    }
}

impl ExactSizeIterator for IterMut<'_> {}

impl FusedIterator for IterMut<'_> {}

impl Index<usize> for RuleList {
    type Output = Rule;

    fn index(&self, i: usize) -> &Rule {
        match self.get(i) {
            Some(r) => r,
            None => panic!("rule index {i} out of range for {} rules", self.len),
        }
    }
}

impl IndexMut<usize> for RuleList {
    fn index_mut(&mut self, i: usize) -> &mut Rule {
        let len = self.len;
        match self.get_mut(i) {
            Some(r) => r,
            None => panic!("rule index {i} out of range for {len} rules"),
        }
    }
}

impl PartialEq for RuleList {
    fn eq(&self, other: &RuleList) -> bool {
        if self.len != other.len {
            return false;
        }
        if self.starts == other.starts {
            // Same boundaries: shared chunks need no rule compared.
            return self
                .chunks
                .iter()
                .zip(&other.chunks)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a.rules == b.rules);
        }
        self.iter().eq(other.iter())
    }
}

impl Eq for RuleList {}

impl PartialEq<Vec<Rule>> for RuleList {
    fn eq(&self, other: &Vec<Rule>) -> bool {
        self.len == other.len() && self.iter().eq(other.iter())
    }
}

impl Hash for RuleList {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `[Rule]` hashes: the length, then each rule.
        state.write_usize(self.len);
        for r in self.iter() {
            r.hash(state);
        }
    }
}

impl fmt::Debug for RuleList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Vec<Rule>> for RuleList {
    fn from(rules: Vec<Rule>) -> RuleList {
        let mut list = RuleList::new();
        list.len = rules.len();
        let mut rest = rules.into_iter();
        while rest.len() > 0 {
            list.starts.push(list.chunks.len() * CHUNK);
            let chunk: Vec<Rule> = rest.by_ref().take(CHUNK).collect();
            list.chunks.push(Arc::new(Chunk::new(chunk)));
        }
        list
    }
}

impl FromIterator<Rule> for RuleList {
    fn from_iter<I: IntoIterator<Item = Rule>>(iter: I) -> RuleList {
        let mut list = RuleList::new();
        list.extend(iter);
        list
    }
}

impl Extend<Rule> for RuleList {
    fn extend<I: IntoIterator<Item = Rule>>(&mut self, iter: I) {
        for r in iter {
            self.push(r);
        }
    }
}

impl<'a> IntoIterator for &'a RuleList {
    type Item = &'a Rule;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut RuleList {
    type Item = &'a mut Rule;
    type IntoIter = IterMut<'a>;

    fn into_iter(self) -> IterMut<'a> {
        self.iter_mut()
    }
}

impl IntoIterator for RuleList {
    type Item = Rule;
    type IntoIter = std::vec::IntoIter<Rule>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

#[cfg(test)]
mod tests;
