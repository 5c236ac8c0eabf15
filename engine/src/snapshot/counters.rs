//! Rule and policy counters in cells that consecutive snapshots share.
//!
//! Each core has its own block of cache-line-aligned (packets, bytes) pairs, like xt_counters
//! in per-cpu memory, and a `base` pair per slot holds values carried over from another cell
//! set and the offsets of `iptables -Z`. A rule's slot is fixed when the rule is compiled
//! (`ChainBody::slots`) and stays with the rule while it exists: a snapshot built from the active
//! one ([`super::Snapshot::compile_after`]) shares the active one's [`CounterCells`], its
//! unchanged rules keep their slots and so keep counting where they counted, and only new
//! rules take new slots. A commit thus allocates no counter memory and copies no counts, and
//! the cores write the same (warm) cache lines before and after a publish. This is how
//! nftables keeps counters in the rule's own expression rather than in a per-table array that
//! each ruleset replacement swaps (x_tables' `xt_replace_table`, whose old counters
//! iptables-restore adds back from user space).
//!
//! Slots are handed out by bumping [`CounterCells::alloc`]'s cursor and never reused within a
//! cell set once a snapshot that counts in them was published: a removed rule's slot is
//! dropped with the snapshots that still show it, so a slot never holds counts of two rules
//! and no slot has to be zeroed while a core may still write it. The slots of a build that
//! is never published (a compile error, a prepared commit dropped or found stale) go back
//! when nothing was handed out after them ([`CounterCells::release`]). When the cursor
//! reaches the capacity, the next snapshot is built with a fresh, dense cell set (with room
//! to grow): its rules take new slots in the same correspondence to the old rules (by
//! position around a chain's changed run, by content in it), and the commit's carry copies
//! the counts along that map ([`super::Snapshot::carry_from`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// One cache line of counters: four (packets, bytes) pairs.
#[repr(align(64))]
#[derive(Default)]
pub(crate) struct CounterLine([AtomicU64; 8]);

/// A core's private counter block: `capacity` slots of (packets, bytes).
pub(crate) struct CoreCounters {
    pub(crate) lines: Box<[CounterLine]>,
}

impl CoreCounters {
    fn new(slots: usize) -> CoreCounters {
        CoreCounters {
            lines: (0..slots.div_ceil(4))
                .map(|_| CounterLine::default())
                .collect(),
        }
    }

    pub(crate) fn cell(&self, slot: usize, which: usize) -> &AtomicU64 {
        &self.lines[slot / 4].0[(slot % 4) * 2 + which]
    }

    /// Counts one packet of `bytes` in `slot`. Single writer (the owning core): Relaxed load +
    /// store, no RMW. Readers on other threads may see a stale value, never a torn one.
    #[inline]
    pub(crate) fn bump(&self, slot: usize, bytes: u64) {
        let p = self.cell(slot, 0);
        p.store(p.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        let b = self.cell(slot, 1);
        b.store(
            b.load(Ordering::Relaxed).wrapping_add(bytes),
            Ordering::Relaxed,
        );
    }
}

/// The counter cells of one or more consecutive snapshots: per-core blocks and a base pair
/// per slot, `capacity` slots, of which the first `cursor` are handed out.
pub(crate) struct CounterCells {
    pub(crate) cores: Box<[CoreCounters]>,
    /// Two cells (packets, bytes) per slot: carried-over values minus zeroing offsets
    /// (wrapping arithmetic).
    pub(crate) base: Box<[AtomicU64]>,
    pub(crate) capacity: u32,
    /// Slots handed out so far. Relaxed: it only has to hand each slot out once (the RMW
    /// does that); the cells themselves are published to the cores with the snapshot that
    /// uses them (the dataplane's Release store of the snapshot pointer).
    pub(crate) cursor: AtomicU32,
    /// Held by a build for as long as it hands out slots, so that the slots of one build are
    /// one contiguous range ([`CounterCells::release`] gives back exactly that range).
    pub(crate) builder: Mutex<()>,
}

impl std::fmt::Debug for CounterCells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CounterCells")
            .field("cores", &self.cores.len())
            .field("capacity", &self.capacity)
            .field("used", &self.cursor.load(Ordering::Relaxed))
            .finish()
    }
}

impl CounterCells {
    /// Zeroed cells for `cores` cores (at least one) and `capacity` slots.
    pub(crate) fn new(cores: usize, capacity: usize) -> CounterCells {
        let capacity = capacity.min(u32::MAX as usize);
        CounterCells {
            cores: (0..cores.max(1))
                .map(|_| CoreCounters::new(capacity))
                .collect(),
            base: (0..capacity * 2).map(|_| AtomicU64::new(0)).collect(),
            capacity: capacity as u32,
            cursor: AtomicU32::new(0),
            builder: Mutex::new(()),
        }
    }

    /// Cells for a snapshot of `slots` slots that will change: half as many again (at least
    /// 1,024) free for the rules later commits add before a new cell set is needed.
    pub(crate) fn with_room(cores: usize, slots: usize) -> CounterCells {
        CounterCells::new(cores, slots + (slots / 2).max(1024))
    }

    /// Number of per-core blocks.
    pub(crate) fn cores(&self) -> usize {
        self.cores.len()
    }

    /// The block of `core` (the last one for a core past the end).
    #[inline]
    pub(crate) fn core(&self, core: usize) -> &CoreCounters {
        &self.cores[core.min(self.cores.len() - 1)]
    }

    /// Starts a build that takes slots: while the guard lives no other build does, and
    /// [`CounterCells::cursor`] tells where its range begins.
    pub(crate) fn build(&self) -> std::sync::MutexGuard<'_, ()> {
        self.builder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next slot [`CounterCells::alloc`] hands out (past the capacity once full).
    pub(crate) fn cursor(&self) -> u32 {
        self.cursor.load(Ordering::Relaxed)
    }

    /// A new, never used slot, or `None` when all `capacity` slots are handed out.
    pub(crate) fn alloc(&self) -> Option<u32> {
        // Relaxed: see `cursor`. A failed bump leaves the cursor past the capacity, which
        // only makes later calls fail too (and `release` can take it back).
        let slot = self.cursor.fetch_add(1, Ordering::Relaxed);
        (slot < self.capacity).then_some(slot)
    }

    /// Gives back the slots `from..to` one build took, when no slot was handed out after
    /// them; returns whether it did. Only for slots no core ever counted in: those of a
    /// snapshot that was never published.
    pub(crate) fn release(&self, range: (u32, u32)) -> bool {
        let _one = self.build();
        self.release_locked(range)
    }

    /// [`CounterCells::release`] for a caller that holds [`CounterCells::build`]'s guard.
    pub(crate) fn release_locked(&self, (from, to): (u32, u32)) -> bool {
        from < to
            && self
                .cursor
                .compare_exchange(to, from, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Packets and bytes of `slot`: base plus the sum over cores.
    pub(crate) fn total(&self, slot: usize) -> (u64, u64) {
        let mut packets = self.base[slot * 2].load(Ordering::Relaxed);
        let mut bytes = self.base[slot * 2 + 1].load(Ordering::Relaxed);
        for core in self.cores.iter() {
            packets = packets.wrapping_add(core.cell(slot, 0).load(Ordering::Relaxed));
            bytes = bytes.wrapping_add(core.cell(slot, 1).load(Ordering::Relaxed));
        }
        (packets, bytes)
    }

    /// Adds (wrapping) `packets` and `bytes` to `slot`'s base; subtracting is adding the
    /// negation. RMW: a zeroing reader and a carrying commit may run at once.
    pub(crate) fn add_base(&self, slot: usize, (packets, bytes): (u64, u64)) {
        self.base[slot * 2].fetch_add(packets, Ordering::Relaxed);
        self.base[slot * 2 + 1].fetch_add(bytes, Ordering::Relaxed);
    }
}

// === impl Snapshot: reading and setting counters ===

use super::{CChain, SlotCounters, Snapshot};

impl Snapshot {
    pub(crate) fn slot_total(&self, slot: usize) -> (u64, u64) {
        self.cells.total(slot)
    }

    /// Every rule's and every base chain's policy counters: base plus the sum over cores.
    /// Rules come in (ruleset, table, chain, number) evaluation order, policies after them.
    pub fn counters(&self) -> Vec<SlotCounters> {
        let row = |c: &CChain, slot: usize, rule: Option<u32>| {
            let (packets, bytes) = self.slot_total(slot);
            SlotCounters {
                ruleset: self.names[c.ruleset as usize].clone(),
                family: c.family,
                table: c.table,
                chain: c.name.clone(),
                rule,
                packets,
                bytes,
            }
        };
        let mut out = Vec::with_capacity(self.n_rules + self.chains.len());
        for c in self.chains.iter() {
            for (i, &slot) in c.body.slots.iter().enumerate() {
                out.push(row(c, slot as usize, Some(i as u32 + 1)));
            }
        }
        for c in self.chains.iter() {
            if c.policy.is_some() {
                out.push(row(c, c.policy_slot as usize, None));
            }
        }
        out
    }

    /// Adds `rows` (e.g. a shadow's counters of the revision this snapshot now runs) to the
    /// counters of the same (ruleset, family, table, chain, rule number or policy) that this
    /// snapshot did not take over from the one it was built from (its new rules and
    /// policies: one it took over already counted the same packets while active); rows
    /// naming nothing here are left out.
    pub fn add_counters(&self, rows: &[SlotCounters]) {
        type Key<'k> = (
            &'k str,
            crate::model::Family,
            crate::model::TableKind,
            &'k str,
            Option<u32>,
        );
        let by: std::collections::HashMap<Key<'_>, (u64, u64)> = rows
            .iter()
            .map(|r| {
                let key = (&*r.ruleset, r.family, r.table, &*r.chain, r.rule);
                (key, (r.packets, r.bytes))
            })
            .collect();
        let add = |c: &CChain, slot: u32, rule: Option<u32>| {
            let key = (
                &*self.names[c.ruleset as usize],
                c.family,
                c.table,
                &*c.name,
                rule,
            );
            if let Some(&counts) = by.get(&key)
                && !self.continues(slot)
            {
                self.cells.add_base(slot as usize, counts);
            }
        };
        for c in self.chains.iter() {
            for (i, &slot) in c.body.slots.iter().enumerate() {
                add(c, slot, Some(i as u32 + 1));
            }
            if c.policy.is_some() {
                add(c, c.policy_slot, None);
            }
        }
    }

    /// Whether `slot` continues a rule or policy of the snapshot this one was built from: in
    /// its cells, a slot this build did not take; in fresh cells, one the carry copies into.
    fn continues(&self, slot: u32) -> bool {
        if self.origin.is_some() {
            let (from, to) = self.slots_taken;
            !(from..to).contains(&slot)
        } else {
            self.moved.iter().any(|&(_, new)| new == slot)
        }
    }

    /// Sets every counter (of `ruleset`, or all when `None`) to zero, as `iptables -Z`, without
    /// touching the cores' blocks: the current totals are subtracted from the slots' base.
    pub fn zero_counters(&self, ruleset: Option<&str>) {
        let zero = |slot: u32| {
            let (p, b) = self.slot_total(slot as usize);
            self.cells
                .add_base(slot as usize, (p.wrapping_neg(), b.wrapping_neg()));
        };
        for c in self.chains.iter() {
            if ruleset.is_some_and(|r| &*self.names[c.ruleset as usize] != r) {
                continue;
            }
            c.body.slots.iter().for_each(|&s| zero(s));
            zero(c.policy_slot);
        }
    }

    /// As [`Snapshot::zero_counters`] for ruleset `ruleset`, limited as `iptables [-t TABLE]
    /// -Z [CHAIN [N]]`: the chains of `family`'s table `table` (every table when `None`), of
    /// them chain `chain` only when given, and of it rule `rule` only (1-based; its policy
    /// is kept then) when given. Chains of tables that are not enforced have no counters.
    pub fn zero_counters_in(
        &self,
        ruleset: &str,
        family: crate::model::Family,
        table: Option<crate::model::TableKind>,
        chain: Option<&str>,
        rule: Option<u32>,
    ) {
        let zero = |slot: u32| {
            let (p, b) = self.slot_total(slot as usize);
            self.cells
                .add_base(slot as usize, (p.wrapping_neg(), b.wrapping_neg()));
        };
        for c in self.chains.iter() {
            if &*self.names[c.ruleset as usize] != ruleset
                || c.family != family
                || table.is_some_and(|t| t != c.table)
                || chain.is_some_and(|n| *c.name != *n)
            {
                continue;
            }
            match rule {
                Some(n) => {
                    if let Some(&s) = (n as usize)
                        .checked_sub(1)
                        .and_then(|i| c.body.slots.get(i))
                    {
                        zero(s);
                    }
                }
                None => {
                    c.body.slots.iter().for_each(|&s| zero(s));
                    zero(c.policy_slot);
                }
            }
        }
    }

    /// Sets the counters of the rulesets named to what their model says, as
    /// `iptables-restore --counters` loads them: every rule with [`crate::model::Rule::counters`]
    /// and every policy with non-zero [`crate::model::Chain::counters`] (a policy's `[0:0]`
    /// keeps what was carried: a `--noflush` merge declares untouched builtin chains so).
    /// Other counters keep what [`Snapshot::carry_from`] gave them. Packets counted meanwhile
    /// are kept on top (the base is moved by the difference).
    pub fn start_counters(&self, rulesets: &[String]) {
        if rulesets.is_empty() {
            return;
        }
        let set = |slot: u32, c: &crate::model::Counters| {
            let (p, b) = self.slot_total(slot as usize);
            self.cells.add_base(
                slot as usize,
                (c.packets.wrapping_sub(p), c.bytes.wrapping_sub(b)),
            );
        };
        for c in self.chains.iter() {
            if !rulesets
                .iter()
                .any(|r| **r == *self.names[c.ruleset as usize])
            {
                continue;
            }
            let model = &self.rulesets[c.ruleset as usize].tables[c.table_at as usize].chains
                [c.chain_at as usize];
            for (rule, &slot) in model.rules.iter().zip(c.body.slots.iter()) {
                if let Some(counters) = &rule.counters {
                    set(slot, counters);
                }
            }
            if c.policy.is_some() && model.counters != crate::model::Counters::default() {
                set(c.policy_slot, &model.counters);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_handed_out_once_up_to_the_capacity() {
        let c = CounterCells::new(2, 3);
        assert_eq!(
            (c.alloc(), c.alloc(), c.alloc()),
            (Some(0), Some(1), Some(2))
        );
        assert_eq!(c.alloc(), None);
        assert_eq!(c.alloc(), None, "a failed bump must not wrap around");
        // A build that took 1..5 (two slots past the capacity): given back, 1 is next.
        assert!(c.release((1, 5)));
        assert_eq!(c.alloc(), Some(1));
        // Not when something was handed out after the range.
        assert!(!c.release((0, 1)));
        assert_eq!(c.alloc(), Some(2));
    }

    #[test]
    fn totals_sum_cores_and_base() {
        let c = CounterCells::new(2, 8);
        c.core(0).bump(5, 100);
        c.core(1).bump(5, 40);
        c.core(7).bump(5, 1); // past the end: the last core
        c.add_base(5, (10, 1000));
        assert_eq!(c.total(5), (13, 1141));
        c.add_base(5, (13u64.wrapping_neg(), 1141u64.wrapping_neg()));
        assert_eq!(c.total(5), (0, 0));
        assert_eq!(c.total(4), (0, 0));
    }

    use std::sync::Arc;

    use crate::model::{Family, Hook, Ruleset};
    use crate::packet::PacketMeta;
    use crate::sets::NoSets;
    use crate::snapshot::{Snapshot, Verdict};
    use crate::test_rng::Rng;

    /// filter/INPUT with one `-p tcp --dport N -j ACCEPT` rule per port, in order.
    fn ruleset(ports: &[u16]) -> Arc<Ruleset> {
        let mut text = String::from("*filter\n:INPUT DROP [0:0]\n");
        for p in ports {
            text.push_str(&format!("-A INPUT -p tcp --dport {p} -j ACCEPT\n"));
        }
        text.push_str("COMMIT\n");
        Arc::new(crate::restore::parse_ruleset("t", &text, &Default::default()).expect("parses"))
    }

    /// One TCP packet of 100 bytes to `port` on each of two snapshots, on `core`.
    fn send(a: &Snapshot, b: &Snapshot, port: u16, core: usize) {
        let mut p = PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Input,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            protocol: 6,
            sport: 40000,
            dport: port,
            len: 100,
            ..PacketMeta::default()
        };
        let mut logs = Vec::new();
        let mut q = p;
        let (mut va, mut vb) = ([Verdict::Accept], [Verdict::Accept]);
        let none = &mut crate::conntrack::NoTracking;
        a.classify_batch(
            core,
            std::slice::from_mut(&mut p),
            &mut [],
            &mut va,
            0,
            &mut logs,
            &[],
            none,
        );
        b.classify_batch(
            core,
            std::slice::from_mut(&mut q),
            &mut [],
            &mut vb,
            0,
            &mut logs,
            &[],
            none,
        );
        assert_eq!(va, vb);
    }

    /// A build that is never published gives its new slots back, unless a later build took
    /// slots after them.
    #[test]
    fn unpublished_builds_give_their_slots_back() {
        let a = Snapshot::compile(&[ruleset(&[1, 2, 3])], &NoSets, 1).unwrap();
        let at = a.cells.cursor();
        // 9 and 4 are new.
        let b = Snapshot::compile_after(&a, &[ruleset(&[1, 2, 9, 4])], &NoSets, 1).unwrap();
        assert!(Arc::ptr_eq(&a.cells, &b.cells));
        assert_eq!(b.cells.cursor(), at + 2);
        let c = Snapshot::compile_after(&a, &[ruleset(&[5, 2, 3])], &NoSets, 1).unwrap();
        assert_eq!(c.cells.cursor(), at + 3);
        assert!(!b.release_slots(), "c took slots after b's");
        assert!(c.release_slots());
        assert_eq!(a.cells.cursor(), at + 2);
        assert!(b.release_slots());
        assert_eq!(a.cells.cursor(), at);
        // A build that runs out of room gives back what it took before it did, and the
        // snapshot gets fresh cells.
        let many: Vec<u16> = (100..1200).collect();
        let d = Snapshot::compile_after(&a, &[ruleset(&many)], &NoSets, 1).unwrap();
        assert!(!Arc::ptr_eq(&a.cells, &d.cells));
        assert_eq!(a.cells.cursor(), at);
    }

    /// Snapshots built from their predecessor count in its cells (no copy at carry) until the
    /// cells are full, then in fresh ones; either way every counter equals what a
    /// from-scratch compile with counts carried by rule identity shows, through replaces,
    /// inserts, deletes, swaps of neighbours (matched by content), zeroing, and traffic that
    /// hits the old snapshot after the new one was built (before its publish).
    #[test]
    fn shared_cells_count_as_a_fresh_compile_with_carry() {
        let mut rng = Rng(0x5eed_c0de);
        let mut ports: Vec<u16> = (1..=20).collect();
        let mut next_port = 1000u16;
        let mut inc = Snapshot::compile(&[ruleset(&ports)], &NoSets, 2).unwrap();
        let mut full = Snapshot::compile(&[ruleset(&ports)], &NoSets, 2).unwrap();
        let (mut shared, mut fresh) = (0, 0);
        for step in 0..2000 {
            for _ in 0..4 {
                let port = match rng.below(4) {
                    0 => 5000, // no rule: the policy
                    _ => ports[rng.below(ports.len())],
                };
                send(&inc, &full, port, rng.below(3));
            }
            match rng.below(8) {
                0 if ports.len() > 4 => {
                    ports.remove(rng.below(ports.len()));
                }
                1 if ports.len() < 40 => {
                    ports.insert(rng.below(ports.len() + 1), next_port);
                    next_port += 1;
                }
                2 => {
                    let at = rng.below(ports.len() - 1);
                    ports.swap(at, at + 1);
                }
                _ => {
                    let at = rng.below(ports.len());
                    ports[at] = next_port;
                    next_port += 1;
                }
            }
            let rs = ruleset(&ports);
            let next_inc =
                Snapshot::compile_after(&inc, std::slice::from_ref(&rs), &NoSets, 2).unwrap();
            let next_full = Snapshot::compile(&[rs], &NoSets, 2).unwrap();
            // Packets the old snapshots see between the build and the publish.
            send(&inc, &full, ports[rng.below(ports.len())], 0);
            if Arc::ptr_eq(&inc.cells, &next_inc.cells) {
                shared += 1;
            } else {
                fresh += 1;
            }
            assert_eq!(
                next_inc.carry_from(&inc),
                next_full.carry_from(&full),
                "step {step}: slots carried"
            );
            if step % 97 == 0 {
                next_inc.zero_counters(Some("t"));
                next_full.zero_counters(None);
            }
            let counted = next_inc.counters();
            assert_eq!(counted, next_full.counters(), "step {step}");
            assert!(step % 97 == 0 || counted.iter().any(|c| c.packets > 0));
            (inc, full) = (next_inc, next_full);
        }
        // 21 slots and 1,024 to spare: about 0.75 new rules a step fill them once.
        assert!(
            fresh >= 1 && shared > 1000,
            "shared {shared}, fresh {fresh}"
        );
    }
}
