//! The commit path's build: validated [`Ruleset`]s -> [`Snapshot`] ([`Snapshot::compile`],
//! [`Snapshot::compile_with`]), and the incremental [`Snapshot::compile_after`], which shares
//! the bodies of unchanged chains with the active snapshot, splices a body where one run of
//! rules changed (the index updated online, `tuple_merge/build.rs`) and takes counter slots
//! over from the rules a new one continues. Also [`Snapshot::reuse`]. One rule's translation
//! (model rule -> compiled rule) is in `build/rule.rs`.
//!
//! Runs on the committing thread, never on a packet core: it allocates freely, but it must
//! not write anything the published snapshot's readers see (the active snapshot is shared,
//! read-only; the cells' slots it takes are fresh or handed over), and it reads no clock.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::model::{Family, Hook, Rule, RuleList, Ruleset, TableKind, diff_rules};
use crate::sets::SetRegistry;

use super::carry::match_by_content;
use super::chunks::{Chunks, RuleChunks};
use super::counters::CounterCells;
use super::tuple_merge::ChainIndex;
use super::*;

mod rule;

use rule::compile_rule;

/// Why [`Snapshot::build_into`] stopped: a compile error, or no counter slot left in the cells
/// it was given (the caller then builds into fresh cells).
enum Stop {
    Compile(CompileError),
    NoRoom,
}

impl From<CompileError> for Stop {
    fn from(e: CompileError) -> Stop {
        Stop::Compile(e)
    }
}

/// Counter slots for the `new` rules of a chain whose `old` rules counted in `old_slot(i)`:
/// a new rule that has the content identity of an old one ([`match_by_content`]) continues
/// it (`keep` of its slot; one more `continued`), the others take a slot from `fresh`.
fn take_slots<'a>(
    old: impl Iterator<Item = &'a Rule>,
    new: impl Iterator<Item = &'a Rule>,
    old_slot: impl Fn(usize) -> u32,
    (fresh, keep): (
        &impl Fn() -> Result<u32, Stop>,
        &impl Fn(u32) -> Result<u32, Stop>,
    ),
    continued: &mut usize,
) -> Result<Vec<u32>, Stop> {
    let old: Vec<u64> = old.map(content_hash).collect();
    let new: Vec<u64> = new.map(content_hash).collect();
    let mut continues = vec![None; new.len()];
    match_by_content(&old, &new, |n, o| continues[n] = Some(old_slot(o)));
    *continued += continues.iter().flatten().count();
    continues
        .into_iter()
        .map(|o| o.map_or_else(fresh, keep))
        .collect()
}

// === impl Snapshot: building ===

/// Whether a chain's change is small enough to splice its old body (copy the unchanged rules,
/// update the index in place) rather than compile the chain afresh: the changed middle holds
/// at most an eighth of the chain (and always up to 64 rules).
fn splice_pays(old_mid: u32, new_mid: u32, n: usize) -> bool {
    (old_mid + new_mid) as usize <= (n / 8).max(64)
}

/// The table-local jump and goto targets of `rules`, ascending, no repeats.
fn jump_targets<'a>(rules: impl Iterator<Item = &'a CRule>) -> Box<[u32]> {
    let mut t: Vec<u32> = rules
        .filter_map(|r| match r.target {
            CTarget::Jump(t) | CTarget::Goto(t) => Some(t),
            _ => None,
        })
        .collect();
    t.sort_unstable();
    t.dedup();
    t.into_boxed_slice()
}

/// Some match holds an object resolved through the registry (a set, the node's addresses).
fn has_state(r: &CRule) -> bool {
    r.matches
        .iter()
        .any(|m| matches!(m, CMatch::Recent(_) | CMatch::Hashlimit(_)))
}

fn has_set(r: &CRule) -> bool {
    // A verdict map holds its set too (and chain indices resolved at its compile).
    matches!(r.target, CTarget::Vmap(_))
        || r.matches.iter().any(|m| match m {
            CMatch::Set { .. } => true,
            CMatch::AddrType(a) => a.addrs.is_some(),
            CMatch::Rpfilter { .. } => true,
            CMatch::PktType { addrs, .. } => addrs.is_some(),
            _ => false,
        })
}

/// What a chain body is compiled with: the table's chain names (table-local indices), the set
/// registry, the classifier, the address width, and the names for error messages.
struct BodyContext<'a> {
    chains: &'a HashMap<&'a str, u32>,
    sets: &'a dyn SetRegistry,
    /// The build's named tables and this ruleset's name in them.
    named: (&'a RefCell<NamedState>, &'a Arc<str>),
    classifier: Classifier,
    width: u32,
    ruleset: &'a str,
    table: TableKind,
    chain: &'a str,
}

impl BodyContext<'_> {
    fn compile<'r>(
        &self,
        rules: impl Iterator<Item = &'r Rule>,
    ) -> Result<Vec<CRule>, CompileError> {
        rules
            .map(|rule| {
                compile_rule(
                    rule,
                    self.chains,
                    self.sets,
                    self.named,
                    self.width == 128,
                    self.table == TableKind::Raw,
                )
                .map_err(|e| {
                    e.in_context((self.ruleset.to_string(), self.table, self.chain.to_string()))
                })
            })
            .collect()
    }

    fn wants_index(&self, n: usize) -> bool {
        matches!(self.classifier, Classifier::TupleMerge { min_rules, .. } if n >= min_rules.max(1) as usize)
    }

    /// [`Classifier::TupleMerge`]'s `(rfc_min_rules, rfc_max_rules)` (none for the linear
    /// walk).
    fn rfc_rules(&self) -> (u32, u32) {
        match self.classifier {
            Classifier::TupleMerge {
                rfc_min_rules,
                rfc_max_rules,
                ..
            } => (rfc_min_rules, rfc_max_rules),
            Classifier::Linear => (1, 0),
        }
    }

    /// The body of `rules`; `index`, `targets` and `has_sets` are computed here unless given.
    fn finish(
        &self,
        rules: RuleChunks,
        slots: Chunks<u32>,
        index: Option<ChainIndex>,
        known: Option<(Box<[u32]>, bool, bool)>,
    ) -> ChainBody {
        let index = index.or_else(|| {
            self.wants_index(rules.len())
                .then(|| ChainIndex::build(&rules, self.width, self.rfc_rules()))
        });
        let (targets, has_sets, stateful) = known.unwrap_or_else(|| {
            (
                jump_targets(rules.iter()),
                rules.iter().any(has_set),
                rules.iter().any(has_state),
            )
        });
        ChainBody {
            targets,
            has_sets,
            stateful,
            rules,
            slots,
            index,
        }
    }
}

impl ChainBody {
    /// Compiles `rules` from scratch, rule `i` counting in `slots[i]`.
    fn compile(
        rules: &RuleList,
        slots: &[u32],
        cx: &BodyContext<'_>,
    ) -> Result<ChainBody, CompileError> {
        let compiled = RuleChunks::new(cx.compile(rules.iter())?);
        Ok(cx.finish(compiled, Chunks::new(slots.to_vec()), None, None))
    }

    /// The body of `rules`, which equal this body's rules except that `old_mid` rules after
    /// the first `prefix` became `new_mid` rules, counting in `mid_slots`: unchanged rules are
    /// copied (cheap clones, their slots with them), only the new ones are compiled, and the
    /// index is updated ([`ChainIndex::update`], TupleMerge's incremental insert and delete)
    /// instead of rebuilt.
    fn splice(
        &self,
        rules: &RuleList,
        (prefix, old_mid, new_mid): (u32, u32, u32),
        mid_slots: &[u32],
        cx: &BodyContext<'_>,
    ) -> Result<ChainBody, CompileError> {
        let (p, om, nm) = (prefix as usize, old_mid as usize, new_mid as usize);
        let new = cx.compile(rules.range(p..p + nm))?;
        // Only set-free bodies are spliced, so only the new rules can bring a set; the
        // targets need a scan of the whole chain only when the old or the new rules jump.
        let has_sets = new.iter().any(has_set);
        let stateful = self.stateful || new.iter().any(has_state);
        let new_jumps = !jump_targets(new.iter()).is_empty();
        let compiled = self.rules.splice(p, om, new);
        let index = match &self.index {
            Some(idx) if cx.wants_index(compiled.len()) => Some(idx.update(
                &self.rules,
                &compiled,
                cx.width,
                (prefix, old_mid, new_mid),
                cx.rfc_rules(),
            )),
            _ => None,
        };
        let targets = if self.targets.is_empty() && !new_jumps {
            Box::default()
        } else {
            jump_targets(compiled.iter())
        };
        let slots = self.slots.splice(p, om, mid_slots.to_vec());
        Ok(cx.finish(compiled, slots, index, Some((targets, has_sets, stateful))))
    }
}

impl Snapshot {
    /// An empty snapshot (every hook accepts) with counter blocks for `cores` cores.
    pub fn empty(cores: usize) -> Snapshot {
        Snapshot {
            id: NEXT_SNAPSHOT_ID.fetch_add(1, Ordering::Relaxed),
            classifier: Classifier::default(),
            rulesets: Box::new([]),
            names: Box::new([]),
            hooks: Default::default(),
            raw_chains: [[0; 5]; 2],
            chains: Box::new([]),
            n_rules: 0,
            cells: Arc::new(CounterCells::new(cores, 0)),
            continued: 0,
            slots_taken: (0, 0),
            moved: Box::default(),
            origin: None,
            named: NamedState::default(),
            copy_range: super::copy_range::HEADER_BYTES,
        }
    }

    /// Compiles `rulesets` (already validated) for `cores` worker cores with the default
    /// [`Classifier`]. Set names resolve through `sets`.
    ///
    /// Errors: [`CompileError`] when a ruleset was not validated and refers to something that
    /// does not exist or cannot be enforced.
    pub fn compile(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
    ) -> Result<Snapshot, CompileError> {
        Self::compile_with(rulesets, sets, cores, Classifier::default())
    }

    /// As [`Snapshot::compile`], with the given classifier ([`Classifier::Linear`] forces the
    /// reference walk).
    pub fn compile_with(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
        classifier: Classifier,
    ) -> Result<Snapshot, CompileError> {
        Self::build(rulesets, sets, cores, classifier, None)
    }

    /// As [`Snapshot::compile_with`] with `prev`'s classifier, reusing what `prev` compiled
    /// (incremental update): a chain whose rules are unchanged, in a table whose chain names
    /// are unchanged, shares `prev`'s compiled rules and index (an `Arc`, no copy); a chain
    /// where a contiguous run of at most an eighth of its rules (or 64) changed copies the
    /// unchanged rules and updates the index (`ChainIndex::update`) instead of rebuilding
    /// it. Chains with `-m set` are always recompiled (the registry may hold new set objects).
    /// The result classifies exactly like a from-scratch compile; `prev` is not changed. Shared
    /// `-m limit` rules keep their token bucket state (a from-scratch compile starts them full).
    /// The result counts in `prev`'s counter cells while they have room for its new rules
    /// (`snapshot/counters.rs`): the rules it keeps go on counting where they counted, so
    /// publish it only in `prev`'s place (as [`crate::engine::Engine`] does); when the cells
    /// are full it gets fresh ones and compiles every chain afresh (its `-m limit`
    /// rules then take over the bucket state of the rules they continue, as at carry).
    ///
    /// Errors: as [`Snapshot::compile`].
    pub fn compile_after(
        prev: &Snapshot,
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
    ) -> Result<Snapshot, CompileError> {
        Self::build(rulesets, sets, cores, prev.classifier, Some((prev, &[])))
    }

    /// As [`Snapshot::compile_after`], taking the chains' diffs from `hints` (computed by
    /// validation against the same old rulesets) instead of comparing the rules again. A hint
    /// is used only for the ruleset `hint.new` when `prev` holds `hint.old` under its name.
    pub(crate) fn compile_after_hinted(
        prev: &Snapshot,
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
        hints: &[DiffHint],
    ) -> Result<Snapshot, CompileError> {
        Self::build(rulesets, sets, cores, prev.classifier, Some((prev, hints)))
    }

    fn build(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
        classifier: Classifier,
        prev: Option<(&Snapshot, &[DiffHint])>,
    ) -> Result<Snapshot, CompileError> {
        // Counters are shared with `prev` (same cells) only where its cells fit: same cores,
        // and room for the new rules; otherwise fresh cells, into which the carry copies the
        // counts of the rules that continue.
        let prev = prev.filter(|(p, _)| p.classifier == classifier);
        if let Some((p, hints)) = prev.filter(|(p, _)| p.cells.cores() == cores.max(1)) {
            match Self::build_into(rulesets, sets, classifier, Some((p, hints)), &p.cells, None) {
                Err(Stop::NoRoom) => {}
                Err(Stop::Compile(e)) => return Err(e),
                Ok(s) => return Ok(s),
            }
        }
        let slots: usize = rulesets
            .iter()
            .flat_map(|rs| rs.tables.iter().filter(|t| t.kind.is_enforced()))
            .flat_map(|t| t.chains.iter())
            .map(|c| c.rules.len() + 1)
            .sum();
        let cells = Arc::new(CounterCells::with_room(cores, slots));
        let moved = RefCell::new(Vec::new());
        let snapshot = Self::build_into(rulesets, sets, classifier, prev, &cells, Some(&moved))
            .map_err(|e| match e {
                Stop::Compile(e) => e,
                // Unreachable: the cells hold a slot for every rule and policy.
                Stop::NoRoom => CompileError::TooManyRules(slots),
            })?;
        // Compiled afresh, so no chain shares `prev`'s `-m limit` buckets: they go on from
        // the state of the rules they continue (as a splice's copies do), not full again.
        if let Some((p, _)) = prev {
            snapshot.take_limits_from(p);
        }
        Ok(snapshot)
    }

    /// [`Snapshot::build`] with counters in `cells`. Without `moved`, `cells` are `prev`'s:
    /// `prev` lends its compiled chains and the slots of the rules it keeps. With `moved`,
    /// `cells` are fresh: every chain is compiled, and each rule or policy that continues
    /// one of `prev` takes a new slot, noted in `moved` as (old slot, new slot). On error
    /// the slots taken go back to `cells`.
    fn build_into(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        classifier: Classifier,
        prev: Option<(&Snapshot, &[DiffHint])>,
        cells: &Arc<CounterCells>,
        moved: Option<&RefCell<Vec<(u32, u32)>>>,
    ) -> Result<Snapshot, Stop> {
        let _one = cells.build();
        let from = cells.cursor();
        let built = Self::build_body(rulesets, sets, classifier, prev, cells, moved);
        match built {
            Ok(mut s) => {
                s.slots_taken = (from, cells.cursor());
                s.moved = moved
                    .map(|m| m.take().into_boxed_slice())
                    .unwrap_or_default();
                Ok(s)
            }
            Err(e) => {
                // No other build took slots meanwhile (`_one`), and no core saw these.
                let _ = cells.release_locked((from, cells.cursor()));
                Err(e)
            }
        }
    }

    /// The body of [`Snapshot::build_into`], which holds the cells' build lock.
    fn build_body(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        classifier: Classifier,
        prev: Option<(&Snapshot, &[DiffHint])>,
        cells: &Arc<CounterCells>,
        moved: Option<&RefCell<Vec<(u32, u32)>>>,
    ) -> Result<Snapshot, Stop> {
        let (prev, hints) = prev.map_or((None, &[][..]), |(p, h)| (Some(p), h));
        let mut order: Vec<usize> = (0..rulesets.len()).collect();
        order.sort_by(|&a, &b| {
            (rulesets[a].priority, &rulesets[a].name)
                .cmp(&(rulesets[b].priority, &rulesets[b].name))
        });
        for w in order.windows(2) {
            if rulesets[w[0]].name == rulesets[w[1]].name {
                return Err(CompileError::DuplicateRuleset(rulesets[w[0]].name.clone()).into());
            }
        }
        let sorted: Vec<Arc<Ruleset>> = order.iter().map(|&i| rulesets[i].clone()).collect();
        let names: Vec<Arc<str>> = sorted.iter().map(|r| Arc::from(r.name.as_str())).collect();
        let old_rulesets: HashMap<&str, usize> = prev.map_or_else(HashMap::default, |p| {
            p.rulesets
                .iter()
                .enumerate()
                .map(|(i, r)| (r.name.as_str(), i))
                .collect()
        });
        let old_chains = prev.map_or_else(HashMap::default, Snapshot::chain_map);
        let named = RefCell::new(
            prev.map_or_else(NamedState::default, |p| NamedState::kept(&p.named, &names)),
        );
        let fresh = || cells.alloc().ok_or(Stop::NoRoom);
        // The slot a rule or policy that continues one of `prev` (in `old`) counts in.
        let keep = |old: u32| -> Result<u32, Stop> {
            match moved {
                None => Ok(old),
                Some(m) => {
                    let new = fresh()?;
                    m.borrow_mut().push((old, new));
                    Ok(new)
                }
            }
        };

        let mut chains: Vec<CChain> = Vec::new();
        let mut origins: Vec<Option<ChainOrigin>> = Vec::new();
        let mut n_rules = 0usize;
        let mut continued = 0usize;
        let mut hooks: [[Vec<u32>; 5]; 2] = Default::default();
        // Base chains per (family, hook, netfilter priority), ruleset order already sorted.
        let mut base: Vec<(Family, Hook, i32, u32)> = Vec::new();

        for (ri, rs) in sorted.iter().enumerate() {
            let old_rs = prev.and_then(|p| Some(&p.rulesets[*old_rulesets.get(rs.name.as_str())?]));
            let same_rs = old_rs.is_some_and(|o| Arc::ptr_eq(o, rs));
            let hint = old_rs.and_then(|o| {
                hints
                    .iter()
                    .find(|h| Arc::ptr_eq(&h.new, rs) && Arc::ptr_eq(&h.old, o))
            });
            for (ti, table) in rs.tables.iter().enumerate() {
                if !table.kind.is_enforced() {
                    continue;
                }
                let table_base = chains.len() as u32;
                let local: HashMap<&str, u32> = table
                    .chains
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name.as_str(), i as u32))
                    .collect();
                // Sharing needs the same chain names in the same order: targets are
                // table-local indices.
                let old_table = old_rs
                    .and_then(|o| o.table(table.family, table.kind))
                    .filter(|ot| {
                        ot.chains.len() == table.chains.len()
                            && ot
                                .chains
                                .iter()
                                .zip(&table.chains)
                                .all(|(a, b)| a.name == b.name)
                    });
                let width = match table.family {
                    Family::Ipv4 => 32,
                    Family::Ipv6 => 128,
                };
                for (ci, chain) in table.chains.iter().enumerate() {
                    let cx = BodyContext {
                        chains: &local,
                        sets,
                        named: (&named, &names[ri]),
                        classifier,
                        width,
                        ruleset: &rs.name,
                        table: table.kind,
                        chain: &chain.name,
                    };
                    // The chain of this name in `prev`, whose slots the rules it keeps take.
                    let named = prev.and_then(|p| {
                        let key = (
                            rs.name.as_str(),
                            table.family,
                            table.kind,
                            chain.name.as_str(),
                        );
                        let oc = *old_chains.get(&key)?;
                        Some((oc, &p.chains[oc as usize]))
                    });
                    let old =
                        named.and_then(|(oc, o)| Some((oc, &o.body, &old_table?.chains[ci].rules)));
                    let (body, origin) = match old {
                        Some((oc, ob, old_rules)) => {
                            let hinted = hint.and_then(|h| *h.diffs.tables.get(ti)?.get(ci)?);
                            let diff = if same_rs {
                                (chain.rules.len() as u32, 0, 0)
                            } else if let Some(d) = hinted {
                                d
                            } else {
                                diff_rules(old_rules, &chain.rules, |_, _| {})
                            };
                            let (p, om, nm) = (diff.0 as usize, diff.1 as usize, diff.2 as usize);
                            let spliced = !ob.has_sets
                                && moved.is_none()
                                && (om != 0 || nm != 0)
                                && splice_pays(diff.1, diff.2, chain.rules.len());
                            let origin = ChainOrigin { old: oc, spliced };
                            // The unchanged rules before and after the change keep their slots;
                            // the changed run takes those of equal old rules, else new ones.
                            continued += chain.rules.len() - nm;
                            let body = if om == 0 && nm == 0 && !ob.has_sets && moved.is_none() {
                                ob.clone()
                            } else {
                                let mid = take_slots(
                                    old_rules.range(p..p + om),
                                    chain.rules.range(p..p + nm),
                                    |q| ob.slots[p + q],
                                    (&fresh, &keep),
                                    &mut continued,
                                )?;
                                if spliced {
                                    Arc::new(ob.splice(&chain.rules, diff, &mid, &cx)?)
                                } else {
                                    let mut slots = Vec::with_capacity(chain.rules.len());
                                    for &s in ob.slots.range(0..p) {
                                        slots.push(keep(s)?);
                                    }
                                    slots.extend_from_slice(&mid);
                                    for &s in ob.slots.range(p + om..ob.slots.len()) {
                                        slots.push(keep(s)?);
                                    }
                                    Arc::new(ChainBody::compile(&chain.rules, &slots, &cx)?)
                                }
                            };
                            (body, Some(origin))
                        }
                        None => {
                            let slots = match (named, prev) {
                                // Same name, other chain names in the table: rules keep their
                                // slots by content identity.
                                (Some((_, o)), Some(p)) => take_slots(
                                    p.model_rules(o).iter(),
                                    chain.rules.iter(),
                                    |q| o.body.slots[q],
                                    (&fresh, &keep),
                                    &mut continued,
                                )?,
                                _ => (0..chain.rules.len())
                                    .map(|_| fresh())
                                    .collect::<Result<_, _>>()?,
                            };
                            (
                                Arc::new(ChainBody::compile(&chain.rules, &slots, &cx)?),
                                None,
                            )
                        }
                    };
                    let policy_slot = match named {
                        Some((_, o)) => {
                            continued += 1;
                            keep(o.policy_slot)?
                        }
                        None => fresh()?,
                    };
                    let gi = chains.len() as u32;
                    if let (Some(hook), Some(prio)) = (chain.hook(), chain.priority(table.kind)) {
                        base.push((table.family, hook, prio, gi));
                    }
                    chains.push(CChain {
                        ruleset: ri as u32,
                        family: table.family,
                        table: table.kind,
                        name: Arc::from(chain.name.as_str()),
                        table_base,
                        table_at: ti as u32,
                        chain_at: ci as u32,
                        policy_slot,
                        policy: chain.policy,
                        body,
                    });
                    origins.push(origin);
                    n_rules += chain.rules.len();
                }
            }
        }
        if let Some(c) = find_loop(&chains) {
            let c = &chains[c];
            return Err(CompileError::Loop {
                ruleset: sorted[c.ruleset as usize].name.clone(),
                table: c.table,
                chain: c.name.to_string(),
            }
            .into());
        }
        // The named tables the new snapshot's rules hold (and no other: a table no rule
        // names any more goes, as in the kernel).
        let named = NamedState::held(chains.iter().filter(|c| c.body.stateful).flat_map(|c| {
            let rs = &names[c.ruleset as usize];
            c.body
                .rules
                .iter()
                .flat_map(move |r| r.matches.iter().map(move |m| (rs, m)))
        }));
        // Base chains by netfilter priority (an x_tables table's, an nft chain's own), then
        // rulesets by priority (the stable sort keeps that order), as the kernel runs the hook
        // functions registered at one hook. Those below conntrack's priority run before its
        // lookup (the walk's raw step): they sort first.
        base.sort_by_key(|&(_, _, prio, _)| prio);
        let mut raw_chains = [[0u32; 5]; 2];
        for (family, hook, prio, ci) in base {
            hooks[family_index(family)][hook.index()].push(ci);
            if prio < crate::model::CONNTRACK_PRIORITY {
                raw_chains[family_index(family)][hook.index()] += 1;
            }
        }
        let copy_range = super::copy_range::copy_range(sorted.iter().map(|r| &**r));
        Ok(Snapshot {
            id: NEXT_SNAPSHOT_ID.fetch_add(1, Ordering::Relaxed),
            classifier,
            rulesets: sorted.into_boxed_slice(),
            names: names.into_boxed_slice(),
            hooks: hooks.map(|h| h.map(Vec::into_boxed_slice)),
            raw_chains,
            chains: chains.into_boxed_slice(),
            n_rules,
            cells: cells.clone(),
            continued,
            // Set by `build_into`.
            slots_taken: (0, 0),
            moved: Box::default(),
            origin: prev.map(|p| Origin {
                prev: p.id,
                chains: origins.into_boxed_slice(),
            }),
            named,
            copy_range,
        })
    }

    /// The rules chain `c` of this snapshot was compiled from.
    pub(crate) fn model_rules(&self, c: &CChain) -> &RuleList {
        &self.rulesets[c.ruleset as usize].tables[c.table_at as usize].chains[c.chain_at as usize]
            .rules
    }

    /// Chain index by (ruleset, family, table, chain name).
    pub(crate) fn chain_map(&self) -> HashMap<(&str, Family, TableKind, &str), u32> {
        self.chains
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    (
                        &*self.names[c.ruleset as usize],
                        c.family,
                        c.table,
                        &*c.name,
                    ),
                    i as u32,
                )
            })
            .collect()
    }

    /// How this snapshot reused `prev`, when it was built from it by
    /// [`Snapshot::compile_after`] (all zero but `chains` otherwise).
    pub fn reuse(&self, prev: &Snapshot) -> Reuse {
        let mut r = Reuse {
            chains: self.chains.len(),
            ..Reuse::default()
        };
        if let Some(o) = self.origin.as_ref().filter(|o| o.prev == prev.id) {
            for (c, o) in self.chains.iter().zip(o.chains.iter()) {
                match o {
                    Some(o) if Arc::ptr_eq(&c.body, &prev.chains[o.old as usize].body) => {
                        r.shared += 1;
                    }
                    Some(o) if o.spliced => r.spliced += 1,
                    _ => {}
                }
            }
        }
        r
    }
}

/// How a snapshot built by [`Snapshot::compile_after`] reused its predecessor
/// ([`Snapshot::reuse`]). Chains neither shared nor spliced were compiled afresh.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reuse {
    /// Chains in the snapshot.
    pub chains: usize,
    /// Chains whose compiled rules and index are the predecessor's (shared, not copied).
    pub shared: usize,
    /// Changed chains built from the predecessor's: unchanged rules copied, index updated.
    pub spliced: usize,
}

/// A chain on a cycle of jumps and gotos, if any: iterative DFS with colours over the
/// resolved targets (validation reports loops with locations; this keeps an unvalidated
/// ruleset from hanging the packet path).
fn find_loop(chains: &[CChain]) -> Option<usize> {
    let target = |c: usize, i: usize| {
        let ch = &chains[c];
        ch.body
            .targets
            .get(i)
            .map(|&t| (ch.table_base + t) as usize)
    };
    // 0 new, 1 on the stack, 2 done.
    let mut state = vec![0u8; chains.len()];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in 0..chains.len() {
        if state[root] != 0 {
            continue;
        }
        state[root] = 1;
        stack.push((root, 0));
        while let Some(&mut (c, ref mut i)) = stack.last_mut() {
            match target(c, *i) {
                Some(t) => {
                    *i += 1;
                    match state[t] {
                        0 => {
                            state[t] = 1;
                            stack.push((t, 0));
                        }
                        1 => return Some(t),
                        _ => {}
                    }
                }
                None => {
                    state[c] = 2;
                    stack.pop();
                }
            }
        }
    }
    None
}
