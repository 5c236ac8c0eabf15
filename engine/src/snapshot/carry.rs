//! The commit path's carry: what a new snapshot takes from the one it replaces, by rule
//! identity (same ruleset, family, table and chain, same content and ordinal among equal
//! rules): counters ([`Snapshot::carry_from`], nothing to copy when the build shared the old
//! cells) and `-m limit` token bucket state. Also [`Snapshot::release_slots`] for a prepared
//! commit that is dropped.
//!
//! Runs on the committing thread; `carry_from` only once no core can still write the old
//! snapshot (after the commit's quiesce). Never on the packet path.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::*;

/// Calls `f(new_pos, old_pos)` for every rule of `new` whose (content hash, ordinal among
/// equal hashes) also occurs in `old`: the counter identity of a rule within its chain, so
/// that duplicates keep a stable order.
pub(crate) fn match_by_content(old: &[u64], new: &[u64], mut f: impl FnMut(usize, usize)) {
    let mut seen: HashMap<u64, u32> = HashMap::default();
    let mut by_id: HashMap<(u64, u32), usize> = HashMap::default();
    by_id.reserve(old.len());
    for (i, &h) in old.iter().enumerate() {
        let ord = seen.entry(h).or_insert(0);
        by_id.insert((h, *ord), i);
        *ord += 1;
    }
    seen.clear();
    for (i, &h) in new.iter().enumerate() {
        let ord = seen.entry(h).or_insert(0);
        if let Some(&o) = by_id.get(&(h, *ord)) {
            f(i, o);
        }
        *ord += 1;
    }
}

impl Snapshot {
    /// Adds `old`'s counters of `old_slot` into `slot`, unless both are the same cell (a slot
    /// this snapshot took over from `old`, which keeps counting there).
    fn carry_slot(&self, old: &Snapshot, old_slot: u32, slot: u32) {
        if old_slot == slot && Arc::ptr_eq(&self.cells, &old.cells) {
            return;
        }
        let (p, b) = old.slot_total(old_slot as usize);
        if p != 0 || b != 0 {
            self.cells.add_base(slot as usize, (p, b));
        }
    }

    /// Copies the state of `old`'s `-m limit` token buckets into the rules of this snapshot
    /// with the same identity (as [`Snapshot::carry_from`] matches them).
    pub(crate) fn take_limits_from(&self, old: &Snapshot) {
        let is_limit = |m: &CMatch| matches!(m, CMatch::Limit(_));
        for (c, o) in self.named_in(old) {
            if !c.body.rules.iter().any(|r| r.matches.iter().any(is_limit)) {
                continue;
            }
            match_by_content(&old.content_hashes(o), &self.content_hashes(c), |n, q| {
                // Equal content: the same matches in the same order.
                let pairs = c.body.rules[n]
                    .matches
                    .iter()
                    .zip(o.body.rules[q].matches.iter());
                for (new, old) in pairs {
                    if let (CMatch::Limit(new), CMatch::Limit(old)) = (new, old) {
                        new.tat
                            .store(old.tat.load(Ordering::Relaxed), Ordering::Relaxed);
                    }
                }
            });
        }
    }

    /// Each chain of this snapshot with the chain of `old` of the same name (ruleset, family,
    /// table, chain), where there is one.
    fn named_in<'a>(
        &'a self,
        old: &'a Snapshot,
    ) -> impl Iterator<Item = (&'a CChain, &'a CChain)> + 'a {
        let old_chains = old.chain_map();
        self.chains.iter().filter_map(move |c| {
            let key = (
                &*self.names[c.ruleset as usize],
                c.family,
                c.table,
                &*c.name,
            );
            Some((c, &old.chains[*old_chains.get(&key)? as usize]))
        })
    }

    /// [`content_hash`] of each rule of chain `c`: the rules' identity within the chain.
    fn content_hashes(&self, c: &CChain) -> Vec<u64> {
        self.model_rules(c).iter().map(content_hash).collect()
    }

    /// Gives the counter slots this snapshot's build took back to its cells, if none were
    /// handed out after them. Only for a snapshot that was never published (no core counted
    /// in it): [`crate::engine::Engine`] calls it when a prepared commit is dropped.
    pub(crate) fn release_slots(&self) -> bool {
        self.cells.release(self.slots_taken)
    }

    /// Whether [`Snapshot::carry_from`]`(old)` reads `old`'s counts (this snapshot got fresh
    /// cells, or was not built from `old`), so that it must wait until no core can still write
    /// them. `false`: it counts in `old`'s cells and the carry copies nothing.
    pub(crate) fn carry_reads(&self, old: &Snapshot) -> bool {
        !(self.origin.as_ref().is_some_and(|o| o.prev == old.id) && self.moved.is_empty())
    }

    /// Takes over the counters of `old` for every rule and policy whose identity is unchanged:
    /// same ruleset, family, table and chain, and for a rule the same content (canonical form)
    /// and ordinal among equal rules of the chain. Call it only once no core can still write
    /// `old` (after the commit's quiesce), so `old`'s totals are final. Returns how many slots
    /// (rules and chain policies) continue from `old`.
    ///
    /// When this snapshot was built from `old` by [`Snapshot::compile_after`] into `old`'s
    /// counter cells (the common case; `snapshot/counters.rs`), its rules already count in the
    /// slots of the rules they continue, chosen at build time (by position in a changed
    /// chain's unchanged prefix and suffix, and by content in the changed run between them),
    /// so there is nothing to copy. Otherwise the counts are added by identity.
    pub fn carry_from(&self, old: &Snapshot) -> usize {
        if self.origin.as_ref().is_some_and(|o| o.prev == old.id) {
            // Into fresh cells: along the map the build made (empty for shared cells).
            for &(from, to) in self.moved.iter() {
                let (p, b) = old.slot_total(from as usize);
                if p != 0 || b != 0 {
                    self.cells.add_base(to as usize, (p, b));
                }
            }
            return self.continued;
        }
        let mut carried = 0;
        for (c, o) in self.named_in(old) {
            self.carry_slot(old, o.policy_slot, c.policy_slot);
            carried += 1;
            match_by_content(&old.content_hashes(o), &self.content_hashes(c), |n, q| {
                self.carry_slot(old, o.body.slots[q], c.body.slots[n]);
                carried += 1;
            });
        }
        carried
    }
}
