//! Incremental commits ([`Snapshot::compile_after`]) against from-scratch compiles: random
//! sequences of small changes (insert, delete, replace one rule or a short run of rules, and
//! now and then 60 rules in or out at once) in a big indexed chain (ClassBench acl1 1k), in a small user chain that grows and shrinks across
//! the index threshold, and in an untouched second ruleset. After every change the snapshot
//! built from the previous one must
//! - classify exactly like a snapshot compiled from scratch (same [`Trace`] for every header:
//!   verdict and every matched rule), and like the linear walk every few steps;
//! - carry the same counters as a from-scratch snapshot carrying from its own predecessor
//!   (both predecessors having classified the same packets);
//! - share the compiled chains the change did not touch, and splice (not recompile) the big
//!   chain, although every rule after the change moved to another line.
//!
//! Every rule carries a unique comment, so no two rules of a chain are equal and the
//! incremental carry (by position around the changed run) and the from-scratch carry (by
//! content and ordinal) must agree exactly.
//!
//! `cargo test -p vallum-engine --test it -- classify_incremental:: --include-ignored`: the test that reads
//! ../shared/data/classbench is ignored otherwise, and fails when it is absent.
//!
//! [`Trace`]: vallum_engine::snapshot::Trace

use std::sync::Arc;

use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::{Chain, Counters, Location, Match, Rule, RuleList, Ruleset, Target};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot};

use crate::classbench;

use classbench::{Filter, Header};

use crate::support::seeded;
use seeded::{Rng, ZeroClock};

/// Makes rules from filters, each with a unique comment and a mixed target.
struct RuleMaker<'a> {
    filters: &'a [Filter],
    next_id: usize,
}

impl RuleMaker<'_> {
    /// A rule of the big chain: ACCEPT, DROP, no target, or a jump to SMALL.
    fn big(&mut self, rng: &mut Rng) -> Rule {
        let target = match rng.below(12) {
            0 => Target::Jump("SMALL".into()),
            1..=2 => Target::None,
            3..=5 => Target::Drop,
            _ => Target::Accept,
        };
        self.make(rng, target)
    }

    /// A rule of the small user chain: DROP, RETURN or no target.
    fn small(&mut self, rng: &mut Rng) -> Rule {
        let target = match rng.below(4) {
            0 => Target::Return,
            1 => Target::None,
            _ => Target::Drop,
        };
        self.make(rng, target)
    }

    fn make(&mut self, rng: &mut Rng, target: Target) -> Rule {
        loop {
            let f = &self.filters[rng.below(self.filters.len())];
            if let Ok(mut r) = classbench::to_rule(f, target.clone()) {
                r.matches.push(Match::Comment(format!("r{}", self.next_id)));
                self.next_id += 1;
                return r;
            }
        }
    }
}

fn user_chain(name: &str, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.into(),
        policy: None,
        counters: Counters::default(),
        rules: rules.into(),
        location: Location::default(),
        nft_hook: None,
    }
}

/// One random small change to `chain`: insert, delete or replace one rule, or replace a run
/// of up to 4 rules by up to 4 others.
fn mutate(chain: &mut RuleList, rng: &mut Rng, mut make: impl FnMut(&mut Rng) -> Rule) {
    let n = chain.len();
    match rng.below(4) {
        0 => {
            let at = rng.below(n + 1);
            chain.insert(at, make(rng));
        }
        1 if n > 1 => {
            chain.remove(rng.below(n));
        }
        2 if n > 0 => {
            let at = rng.below(n);
            chain.set(at, make(rng));
        }
        _ => {
            let at = rng.below(n + 1);
            let del = rng.below(5).min(n - at);
            let add = rng.below(5);
            let new: Vec<Rule> = (0..add).map(|_| make(rng)).collect();
            chain.splice(at..at + del, new);
        }
    }
}

/// A boundary-ish header: sampled inside a rule, with one field sometimes moved by one.
fn headers(filters: &[Filter], n: usize, seed: u64) -> Vec<Header> {
    let mut rng = Rng(seed);
    classbench::sample_headers(filters, n, seed)
        .into_iter()
        .map(|mut h| {
            match rng.below(6) {
                0 => h.src = h.src.wrapping_add(1),
                1 => h.dst = h.dst.wrapping_sub(1),
                2 => h.dport = h.dport.wrapping_add(1),
                3 => h.sport = h.sport.wrapping_sub(1),
                _ => {}
            }
            h
        })
        .collect()
}

fn classify_all(snap: &Snapshot, headers: &[Header]) {
    let mut logs = Vec::new();
    for (i, h) in headers.iter().enumerate() {
        let mut p = classbench::to_packet(h);
        crate::support::classify_one(snap, i % 2, &mut p, 0, &mut logs);
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn incremental_commits_equal_full_compiles() {
    let Some(dir) = classbench::data_dir() else {
        panic!("incremental commits: ../shared/data/classbench not found");
    };
    let text =
        std::fs::read_to_string(dir.join("neurocuts/acl1_1k")).expect("read neurocuts/acl1_1k");
    let filters = classbench::parse_filters(&text).expect("parse acl1_1k");
    let mut rng = Rng(0x1c5e);
    let mut maker = RuleMaker {
        filters: &filters,
        next_id: 0,
    };

    let mut main = classbench::to_ruleset("main", &filters).expect("translate");
    {
        let table = &mut main.tables[0];
        for r in table.chains[0].rules.iter_mut() {
            *r = maker.big(&mut rng);
        }
        let small: Vec<Rule> = (0..15).map(|_| maker.small(&mut rng)).collect();
        table.chains.push(user_chain("SMALL", small));
    }
    let mut other = classbench::to_ruleset("other", &filters[..60]).expect("translate");
    other.priority = 10;
    for r in other.tables[0].chains[0].rules.iter_mut() {
        r.matches
            .push(Match::Comment(format!("o{}", maker.next_id)));
        maker.next_id += 1;
    }
    let other = Arc::new(other);

    let cores = 2;
    let list = |main: &Ruleset| vec![Arc::new(main.clone()), other.clone()];
    let probe = headers(&filters, 3_000, 99);
    let mut prev_inc =
        Snapshot::compile_with(&list(&main), &NoSets, cores, Classifier::default()).unwrap();
    let mut prev_full =
        Snapshot::compile_with(&list(&main), &NoSets, cores, Classifier::default()).unwrap();
    // The same changes committed through an engine: `Engine::commit` takes the chains' diffs
    // from validation (`validate_after`) instead of `compile_after` comparing the rules again.
    let engine = Engine::new(
        EngineConfig {
            cores,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    );
    engine
        .commit(Change::Put((*other).clone()), &NoSets)
        .unwrap();
    engine.commit(Change::Put(main.clone()), &NoSets).unwrap();
    let (mut spliced_steps, mut small_sizes) = (0, Vec::new());
    for step in 0..80u64 {
        // Traffic on the old snapshots, so that carrying has something to carry.
        let traffic = headers(&filters, 300, step);
        classify_all(&prev_inc, &traffic);
        classify_all(&prev_full, &traffic);

        let touched_small = rng.below(3) == 0;
        {
            let chains = &mut main.tables[0].chains;
            if touched_small {
                mutate(&mut chains[3].rules, &mut rng, |r| maker.small(r));
            } else if step % 8 == 5 {
                // A bulk change within the splice limit (an eighth of the chain, at least
                // 64): 60 rules in, or 60 out, so that tables outgrow or empty their bucket
                // arrays (rehash and drop paths of the index update).
                let big = &mut chains[0].rules;
                let at = rng.below(big.len() - 60);
                if step % 16 == 5 {
                    let new: Vec<Rule> = (0..60).map(|_| maker.big(&mut rng)).collect();
                    big.splice(at..at, new);
                } else {
                    big.splice(at..at + 60, []);
                }
            } else {
                mutate(&mut chains[0].rules, &mut rng, |r| maker.big(r));
            }
            // As a new parse would: every rule's location is its line.
            for (i, r) in chains
                .iter_mut()
                .flat_map(|c| c.rules.iter_mut())
                .enumerate()
            {
                r.location.line = i as u32 + 1;
            }
            small_sizes.push(chains[3].rules.len());
        }
        let rulesets = list(&main);
        let inc = Snapshot::compile_after(&prev_inc, &rulesets, &NoSets, cores).unwrap();
        let full =
            Snapshot::compile_with(&rulesets, &NoSets, cores, Classifier::default()).unwrap();

        // Only the changed chain is compiled again: main's other three chains and other's
        // three are shared.
        let reuse = inc.reuse(&prev_inc);
        assert_eq!(reuse.chains, 7, "step {step}");
        assert!(
            reuse.shared >= 6,
            "step {step}: only {} of 7 chains shared",
            reuse.shared
        );
        if !touched_small && reuse.shared == 6 {
            // A few rules of a 1k chain: spliced, whatever the rules' (renumbered) locations.
            assert_eq!(reuse.spliced, 1, "step {step}: big chain not spliced");
            spliced_steps += 1;
        }

        for (i, h) in probe.iter().chain(&traffic).enumerate() {
            let p = classbench::to_packet(h);
            assert_eq!(
                inc.trace(&p, 0),
                full.trace(&p, 0),
                "step {step}: header #{i} {h:?}"
            );
        }
        engine.commit(Change::Put(main.clone()), &NoSets).unwrap();
        for (i, h) in probe.iter().chain(&traffic).enumerate() {
            let p = classbench::to_packet(h);
            assert_eq!(
                engine.trace_with_state(&p, 0),
                full.trace(&p, 0),
                "step {step}: engine, header #{i} {h:?}"
            );
        }
        if step % 10 == 0 {
            let linear =
                Snapshot::compile_with(&rulesets, &NoSets, cores, Classifier::Linear).unwrap();
            for h in &probe {
                let p = classbench::to_packet(h);
                assert_eq!(inc.trace(&p, 0), linear.trace(&p, 0), "step {step}: {h:?}");
            }
        }

        let carried_inc = inc.carry_from(&prev_inc);
        let carried_full = full.carry_from(&prev_full);
        assert_eq!(carried_inc, carried_full, "step {step}: slots carried");
        let (ci, cf) = (inc.counters(), full.counters());
        assert_eq!(ci, cf, "step {step}: counters after carrying");
        assert!(
            ci.iter().any(|c| c.packets > 0),
            "step {step}: nothing was counted"
        );
        prev_inc = inc;
        prev_full = full;
    }
    assert!(
        spliced_steps > 30,
        "the big chain changed {spliced_steps} times"
    );
    // The small chain crossed the index threshold (16 rules) at least once either way.
    assert!(
        small_sizes.iter().any(|&n| n < 16) && small_sizes.iter().any(|&n| n >= 16),
        "small chain sizes {small_sizes:?} never crossed 16"
    );
}
