//! The checks of a table's structure: one table per family and kind, chain names and
//! policies, the jump graph (unknown targets, jumps to builtin chains, loops, call depth) and
//! which hooks reach each chain, then each rule through `check_rule` (all of it, or with a
//! previous table, only the rules that changed). Commit path: allocates in proportion to the
//! table, reads no clock, takes no lock; the graph walk is iterative, so no input recurses.

use std::collections::{HashMap, HashSet};

use super::{ReachedHooks, Severity, TableCheck, ViolationKind};
use crate::model::{Family, Hook, Match, Rule, Table, TableKind, Target, diff_rules};
use crate::sets::SetRegistry;
use crate::snapshot::MAX_CALL_DEPTH;

/// What [`walk_calls`] finds in a table's jump graph.
struct CallGraph {
    /// Per chain, the most `-j` calls nested below it (a `-g` adds none).
    depth: Vec<usize>,
    /// Each cycle found, from the chain jumped back to around to it again.
    loops: Vec<Cycle>,
}

/// A cycle of [`walk_calls`]: its chain indices from the chain jumped back to around to it
/// again (the first and last entry are the same chain); of a cycle longer than
/// [`LOOP_NAMES`], only the first and last `LOOP_NAMES / 2`, with `omitted` counting the
/// chains between them, so that a graph with many long cycles costs O(chains + jumps).
struct Cycle {
    chains: Vec<usize>,
    omitted: usize,
}

/// Loops and call depth of a jump graph (`edges[c]`: chain `c`'s targets in rule order, and
/// whether each is a `-j`), as mark_source_chains walks it: a depth-first search with
/// colours, on an explicit stack, so that a chain of jumps of any length (100k chains, each
/// jumping to the next) neither recurses nor needs more than O(chains + jumps) memory; a
/// cycle costs the length of its path once. The order of `loops` is that of a recursive DFS
/// from chain 0 upwards.
fn walk_calls(edges: &[Vec<(usize, bool)>]) -> CallGraph {
    const NEW: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let n = edges.len();
    let mut state = vec![NEW; n];
    let mut depth = vec![0usize; n];
    // Where an ON_PATH chain is in `path`.
    let mut at = vec![0usize; n];
    let mut path: Vec<usize> = Vec::new();
    // Per chain on the path: the next edge to look at and the depth found so far.
    let mut frames: Vec<(usize, usize, usize)> = Vec::new();
    let mut loops = Vec::new();
    for root in 0..n {
        if state[root] != NEW {
            continue;
        }
        state[root] = ON_PATH;
        at[root] = 0;
        path.push(root);
        frames.push((root, 0, 0));
        while let Some(frame) = frames.last_mut() {
            let (c, i) = (frame.0, frame.1);
            let Some(&(t, jump)) = edges[c].get(i) else {
                depth[c] = frame.2;
                state[c] = DONE;
                path.pop();
                frames.pop();
                continue;
            };
            match state[t] {
                NEW => {
                    // Descend; this edge is looked at again once `t` is done.
                    state[t] = ON_PATH;
                    at[t] = path.len();
                    path.push(t);
                    frames.push((t, 0, 0));
                    continue;
                }
                ON_PATH => {
                    let on = &path[at[t]..];
                    let len = on.len() + 1;
                    let half = LOOP_NAMES / 2;
                    let (mut chains, omitted) = if len <= LOOP_NAMES {
                        (on.to_vec(), 0)
                    } else {
                        let mut v = on[..half].to_vec();
                        v.extend_from_slice(&on[on.len() + 1 - half..]);
                        (v, len - 2 * half)
                    };
                    chains.push(t);
                    loops.push(Cycle { chains, omitted });
                }
                _ => frame.2 = frame.2.max(depth[t] + usize::from(jump)),
            }
            frame.1 += 1;
        }
    }
    CallGraph { depth, loops }
}

/// Longest loop named in full in a [`ViolationKind::Loop`]; a longer one names its first and
/// last chains around a count of the ones left out, so that a message stays short whatever
/// the ruleset.
pub(super) const LOOP_NAMES: usize = 16;

/// The chain names of a cycle from [`walk_calls`], `... (N more)` standing for the ones
/// omitted.
fn loop_names(table: &Table, cycle: &Cycle) -> Vec<String> {
    let name = |&i: &usize| table.chains[i].name.clone();
    let mut out: Vec<String> = cycle.chains.iter().map(name).collect();
    if cycle.omitted > 0 {
        out.insert(LOOP_NAMES / 2, format!("... ({} more)", cycle.omitted));
    }
    out
}

impl TableCheck<'_> {
    /// The checks of the table itself: a second table of the same family and kind is an
    /// error (`false`: check nothing else of it), one that is not enforced a warning.
    pub(super) fn table_head(&mut self, seen: &mut HashSet<(Family, TableKind)>) -> bool {
        let table = self.table;
        if !seen.insert((table.family, table.kind)) {
            self.at_table(ViolationKind::DuplicateTable(table.kind));
            return false;
        }
        if !table.kind.is_enforced() {
            self.push(
                Severity::Warning,
                None,
                None,
                table.location,
                ViolationKind::TableNotEnforced(table.kind),
            );
        }
        true
    }

    pub(super) fn check(&mut self, sets: Option<&dyn SetRegistry>) {
        self.check_after(sets, None);
    }

    /// [`TableCheck::check`], knowing the table `old` of the active ruleset (valid): see
    /// [`validate_after`](super::validate_after). Returns the per-chain diffs against `old` (empty when its chains
    /// differ).
    pub(super) fn check_after(
        &mut self,
        sets: Option<&dyn SetRegistry>,
        old: Option<&Table>,
    ) -> Vec<Option<(u32, u32, u32)>> {
        let table = self.table;
        let hooks = table.kind.builtin_hooks();
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, c) in table.chains.iter().enumerate() {
            if names.insert(&c.name, i).is_some() {
                self.at_chain(c, ViolationKind::DuplicateChain(c.name.clone()));
            }
            // The parser's grammar (as iptables-restore), for structured input too.
            // An nft table's lowered names (`nft::lower`) follow nft's grammar, checked there.
            let nft = table.kind == TableKind::Nft;
            if !nft && crate::restore::check_chain_name(&c.name).is_err() {
                self.at_chain(c, ViolationKind::BadChainName(c.name.clone()));
            }
            let builtin = if nft {
                c.nft_hook.is_some()
            } else {
                c.nft_hook.is_none()
                    && Hook::from_chain_name(&c.name).is_some_and(|h| hooks.contains(&h))
            };
            if c.policy.is_some() && !builtin {
                self.at_chain(
                    c,
                    ViolationKind::PolicyOnUserChain {
                        chain: c.name.clone(),
                        table: table.kind,
                    },
                );
            }
            if c.policy.is_none() && builtin {
                self.at_chain(c, ViolationKind::BuiltinWithoutPolicy(c.name.clone()));
            }
        }

        // Jump graph: edges (from, to, is_jump) per rule.
        let n = table.chains.len();
        let mut edges: Vec<Vec<(usize, bool)>> = vec![Vec::new(); n];
        let mut edge = |this: &mut Self, ci: usize, ri: usize, r: &Rule| {
            let (name, jump) = match &r.target {
                Target::Jump(t) => (t, true),
                Target::Goto(t) => (t, false),
                _ => return,
            };
            let c = &table.chains[ci];
            match names.get(name.as_str()) {
                None => this.at_rule(c, ri, r, ViolationKind::UnknownChain(name.clone())),
                Some(&ti) if table.chains[ti].policy.is_some() => {
                    this.at_rule(c, ri, r, ViolationKind::JumpToBuiltin(name.clone()))
                }
                Some(&ti) => edges[ci].push((ti, jump)),
            }
        };
        // With a previous table of the same chains (names, builtin or not, in order), each
        // chain's rules are diffed against the old chain's in one pass that also collects the
        // unchanged rules' edges; `recheck` gets the rules that must be checked one by one.
        let same_chains = old.filter(|o| {
            o.chains.len() == n
                && o.chains
                    .iter()
                    .zip(&table.chains)
                    .all(|(a, b)| a.name == b.name && a.policy.is_some() == b.policy.is_some())
        });
        let mut diffs = vec![None; if same_chains.is_some() { n } else { 0 }];
        let mut recheck: Vec<(usize, usize)> = Vec::new();
        let mut jumps_changed = same_chains.is_none();
        for (ci, c) in table.chains.iter().enumerate() {
            let Some(o) = same_chains else {
                for (ri, r) in c.rules.iter().enumerate() {
                    edge(self, ci, ri, r);
                }
                continue;
            };
            let old_rules = &o.chains[ci].rules;
            let d = diff_rules(old_rules, &c.rules, |ri, r| {
                edge(self, ci, ri, r);
                if r.matches.iter().any(|m| matches!(m, Match::Set(_))) {
                    recheck.push((ci, ri));
                }
            });
            diffs[ci] = Some(d);
            let (p, om, nm) = (d.0 as usize, d.1 as usize, d.2 as usize);
            for (ri, r) in (p..p + nm).zip(c.rules.range(p..p + nm)) {
                edge(self, ci, ri, r);
                recheck.push((ci, ri));
                jumps_changed |= matches!(r.target, Target::Jump(_) | Target::Goto(_));
            }
            jumps_changed |= old_rules
                .range(p..p + om)
                .any(|r| matches!(r.target, Target::Jump(_) | Target::Goto(_)));
        }

        // Loops and depth: DFS with colours, as mark_source_chains walks the graph.
        let CallGraph { depth, loops } = walk_calls(&edges);
        for cycle in loops {
            let first = &table.chains[cycle.chains[0]];
            self.at_chain(first, ViolationKind::Loop(loop_names(table, &cycle)));
        }
        for (ci, c) in table.chains.iter().enumerate() {
            if c.policy.is_some() && depth[ci] > MAX_CALL_DEPTH {
                self.at_chain(c, ViolationKind::TooDeep(depth[ci]));
            }
        }

        // Which hooks reach each chain (mark_source_chains' comefrom bits).
        let mut reach = vec![0u8; n];
        for (ci, c) in table.chains.iter().enumerate() {
            if let (Some(_), Some(h)) = (c.policy, c.hook()) {
                let mut stack = vec![ci];
                while let Some(x) = stack.pop() {
                    if reach[x] & (1 << h.index()) != 0 {
                        continue;
                    }
                    reach[x] |= 1 << h.index();
                    stack.extend(edges[x].iter().map(|&(t, _)| t));
                }
            }
        }

        if let Some(live) = sets.and_then(|s| s.reached_hooks()) {
            self.unreached_chains(&reach, &live);
        }

        if jumps_changed {
            for (ci, c) in table.chains.iter().enumerate() {
                for (ri, r) in c.rules.iter().enumerate() {
                    self.check_rule(c, ri, r, reach[ci], sets);
                }
            }
        } else {
            // Every chain is reached from the hooks it was reached from before, so an
            // unchanged rule (without a set) checks as it did when `old` was committed.
            recheck.sort_unstable();
            for (ci, ri) in recheck {
                let c = &table.chains[ci];
                self.check_rule(c, ri, &c.rules[ri], reach[ci], sets);
            }
        }
        diffs
    }

    /// A [`ViolationKind::HookNotReached`] warning for every chain with rules that some hook
    /// reaches (`reach`, per chain) but none that `live` evaluates. Every chain, every time
    /// (also in [`validate_after`](super::validate_after): an unchanged rule keeps its warning).
    fn unreached_chains(&mut self, reach: &[u8], live: &ReachedHooks) {
        let table = self.table;
        if !table.kind.is_enforced() {
            return;
        }
        for (c, &bits) in table.chains.iter().zip(reach) {
            let hooks: Vec<Hook> = Hook::ALL
                .into_iter()
                .filter(|h| bits & 1 << h.index() != 0)
                .collect();
            if hooks.is_empty() || hooks.iter().any(|&h| live.reaches(table.family, h)) {
                continue;
            }
            let (Some(first), Some(last)) = (c.rules.iter().next(), c.rules.iter().next_back())
            else {
                continue;
            };
            let kind = ViolationKind::HookNotReached {
                hooks,
                first: 1,
                last: c.rules.len() as u32,
                first_line: first.location.line,
                last_line: last.location.line,
                why: live.why().to_owned(),
            };
            self.push(Severity::Warning, Some(c), Some(1), first.location, kind);
        }
    }
}
