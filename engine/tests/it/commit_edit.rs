//! [`Change::Edit`] against [`Change::Put`]: random sequences of rule edits (insert, delete,
//! replace; one to three per commit, in a 1k-rule indexed chain built from ClassBench acl1 1k
//! and in a small user chain it jumps to) are committed to one engine as edits of its active
//! ruleset, and to a second engine as the whole edited ruleset, built from plain `Vec`s of
//! rules (so it shares nothing with the active one and is diffed rule by rule). After every
//! commit the two engines must agree on
//! - the outcome: both committed, with the same warnings, rule count and carried slots, or
//!   both refused with the same violations (some edits bring a jump to a missing chain);
//! - the active model (rule for rule);
//! - the verdict and every matched rule ([`Trace`]) for 2,000 headers;
//! - every counter: both engines classified the same packets before the commit, and
//!   [`Engine::counters`] lists (ruleset, table, chain, rule number, packets, bytes), so a
//!   counter carried to another rule shows.
//!
//! Edits naming a missing chain or a rule number out of range must be refused with
//! [`CommitError::Edit`] and leave the engine as it was.
//!
//! `cargo test -p vallum-engine --test it -- commit_edit:: --include-ignored`: the test that reads
//! ../shared/data/classbench is ignored otherwise, and fails when it is absent.
//!
//! [`Trace`]: vallum_engine::snapshot::Trace

use std::sync::Arc;

use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, CommitError, Engine, EngineConfig};
use vallum_engine::model::{
    Chain, Counters, EditOp, Family, Location, Rule, RuleEdit, Ruleset, TableKind, Target,
};
use vallum_engine::packet::PacketMeta;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;

use crate::classbench;

use classbench::Filter;

use crate::support::seeded;
use seeded::{Rng, ZeroClock};

/// A rule from a random filter with a mixed target; one in 25 jumps to a missing chain.
fn make(filters: &[Filter], rng: &mut Rng, small: bool) -> Rule {
    let target = match rng.below(25) {
        0 => Target::Jump("MISSING".into()),
        1..=3 if !small => Target::Jump("SMALL".into()),
        1..=3 => Target::Return,
        4..=7 => Target::None,
        8..=12 => Target::Drop,
        _ => Target::Accept,
    };
    loop {
        let f = &filters[rng.below(filters.len())];
        if let Ok(r) = classbench::to_rule(f, target.clone()) {
            return r;
        }
    }
}

/// The ruleset with INPUT and SMALL taken from plain `Vec`s (fresh chunks, nothing shared).
fn assemble(template: &Ruleset, input: &[Rule], small: &[Rule]) -> Ruleset {
    let mut rs = template.clone();
    rs.tables[0].chains[0].rules = input.to_vec().into();
    let s = rs.tables[0]
        .chains
        .iter_mut()
        .find(|c| c.name == "SMALL")
        .expect("SMALL");
    s.rules = small.to_vec().into();
    rs
}

fn engine() -> Engine {
    Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    )
}

#[test]
#[ignore = "needs ../shared/data"]
fn edits_commit_exactly_as_the_edited_ruleset() {
    let Some(dir) = classbench::data_dir() else {
        panic!("edit commits: ../shared/data/classbench not found");
    };
    let text =
        std::fs::read_to_string(dir.join("neurocuts/acl1_1k")).expect("read neurocuts/acl1_1k");
    let filters = classbench::parse_filters(&text).expect("parse acl1_1k");
    let mut rng = Rng(0xed17);

    let mut template = classbench::to_ruleset("main", &filters).expect("translate");
    template.tables[0].chains.push(Chain {
        name: "SMALL".into(),
        policy: None,
        counters: Counters::default(),
        rules: Default::default(),
        location: Location::default(),
        nft_hook: None,
    });
    let valid = |r: &Rule| !matches!(&r.target, Target::Jump(t) if t == "MISSING");
    let mut input: Vec<Rule> = (0..filters.len())
        .map(|_| make(&filters, &mut rng, false))
        .filter(valid)
        .collect();
    let mut small: Vec<Rule> = (0..20)
        .map(|_| make(&filters, &mut rng, true))
        .filter(valid)
        .collect();
    let mut other = classbench::to_ruleset("other", &filters[..50]).expect("translate");
    other.priority = 10;

    let (by_edit, by_put) = (engine(), engine());
    for e in [&by_edit, &by_put] {
        e.commit(Change::Put(other.clone()), &NoSets).unwrap();
        e.commit(Change::Put(assemble(&template, &input, &small)), &NoSets)
            .unwrap();
    }
    let (mut w_edit, mut w_put) = (by_edit.worker(0).unwrap(), by_put.worker(0).unwrap());
    let probe: Vec<PacketMeta> = classbench::sample_headers(&filters, 2_000, 5)
        .iter()
        .map(classbench::to_packet)
        .collect();
    let (mut committed, mut invalid, mut refused) = (0, 0, 0);
    for step in 0..150u64 {
        // The same traffic on both, so that there are counters to carry.
        let traffic: Vec<PacketMeta> = classbench::sample_headers(&filters, 256, step)
            .iter()
            .map(classbench::to_packet)
            .collect();
        for w in [&mut w_edit, &mut w_put] {
            let mut pkts = traffic.clone();
            let mut verdicts = vec![Verdict::Accept; pkts.len()];
            assert_eq!(w.process_batch(&mut pkts, &mut verdicts, 0), pkts.len());
        }

        // One to three edits, applied to the `Vec`s as well; now and then one that must be
        // refused (a missing chain, a number out of range) and changes nothing.
        let (mut next_input, mut next_small) = (input.clone(), small.clone());
        let mut edits = Vec::new();
        let mut bad = false;
        for _ in 0..1 + rng.below(3) {
            let in_small = rng.below(5) == 0;
            let (chain, rules) = if in_small {
                ("SMALL", &mut next_small)
            } else {
                ("INPUT", &mut next_input)
            };
            let len = rules.len();
            let (op, number) = match rng.below(3) {
                0 => {
                    let n = rng.below(len + 1);
                    let r = make(&filters, &mut rng, in_small);
                    rules.insert(n, r.clone());
                    (EditOp::Insert(r), n + 1)
                }
                1 if len > 1 => {
                    let n = rng.below(len);
                    rules.remove(n);
                    (EditOp::Delete, n + 1)
                }
                _ if len > 0 => {
                    let n = rng.below(len);
                    let r = make(&filters, &mut rng, in_small);
                    rules[n] = r.clone();
                    (EditOp::Replace(r), n + 1)
                }
                _ => {
                    let r = make(&filters, &mut rng, in_small);
                    rules.push(r.clone());
                    (EditOp::Insert(r), len + 1)
                }
            };
            let mut edit = RuleEdit {
                family: Family::Ipv4,
                table: TableKind::Filter,
                chain: chain.into(),
                number: number as u32,
                op,
            };
            match rng.below(40) {
                0 => {
                    edit.number = len as u32 + 2;
                    bad = true;
                }
                1 => {
                    edit.chain = "NOPE".into();
                    bad = true;
                }
                _ => {}
            }
            edits.push(edit);
        }

        let before = by_edit.rulesets();
        let got = by_edit.commit(
            Change::Edit {
                ruleset: "main".into(),
                edits,
            },
            &NoSets,
        );
        if bad {
            assert!(
                matches!(got, Err(CommitError::Edit(_))),
                "step {step}: {got:?}"
            );
            refused += 1;
            assert!(
                Arc::ptr_eq(&before["main"], &by_edit.rulesets()["main"]),
                "step {step}: a refused edit changed the model"
            );
        } else {
            let want = by_put.commit(
                Change::Put(assemble(&template, &next_input, &next_small)),
                &NoSets,
            );
            match (got, want) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.warnings, b.warnings, "step {step}");
                    assert_eq!(a.report.rules, b.report.rules, "step {step}");
                    assert_eq!(a.report.carried, b.report.carried, "step {step}");
                    input = next_input;
                    small = next_small;
                    committed += 1;
                }
                (Err(CommitError::Invalid(a)), Err(CommitError::Invalid(b))) => {
                    assert_eq!(a, b, "step {step}");
                    assert!(!a.is_empty());
                    invalid += 1;
                }
                (a, b) => panic!("step {step}: edit gave {a:?}, put gave {b:?}"),
            }
        }
        assert_eq!(
            by_edit.rulesets(),
            by_put.rulesets(),
            "step {step}: models differ"
        );
        for (i, p) in probe.iter().chain(&traffic).enumerate() {
            assert_eq!(
                by_edit.trace_with_state(p, 0),
                by_put.trace_with_state(p, 0),
                "step {step}: header #{i}"
            );
        }
        let counters = by_edit.counters();
        assert_eq!(counters, by_put.counters(), "step {step}: counters");
        assert!(counters.iter().any(|c| c.rule.is_some() && c.packets > 0));
    }
    assert!(
        committed > 80 && invalid > 3 && refused > 3,
        "committed {committed}, invalid {invalid}, refused {refused}"
    );
}

#[test]
fn an_edit_of_a_missing_ruleset_is_refused() {
    let e = engine();
    let got = e.commit(
        Change::Edit {
            ruleset: "none".into(),
            edits: Vec::new(),
        },
        &NoSets,
    );
    assert!(
        matches!(&got, Err(CommitError::NoSuchRuleset(n)) if n == "none"),
        "{got:?}"
    );
    assert!(e.rulesets().is_empty());
}
