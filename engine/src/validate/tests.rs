//! `validate_after` against `validate`: random valid rulesets, random changes (runs of
//! rules replaced, inserted, deleted, in one or two chains; sometimes a chain added, a
//! set removed from the registry), the same violations and the diffs `diff_rules` gives.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::structure::LOOP_NAMES;
use super::*;
use crate::model::{
    IpNet, Match, Neg, Policy, RejectWith, SetDir, SetMatch, TableKind, Target, TcpMatch,
    diff_rules,
};
use crate::sets::{FrozenSet, IpSet};

use crate::test_rng::Rng;

fn pool(i: usize) -> Rule {
    let with = |matches: Vec<Match>, target: Target| Rule {
        matches: matches.into(),
        target,
        ..Rule::default()
    };
    match i {
        0 => with(vec![], Target::Accept),
        1 => with(
            vec![Match::Mac(Neg::plain([2, 0, 0, 0, 0, 1]))],
            Target::Accept,
        ),
        2 => with(vec![], Target::Jump("A".into())),
        3 => with(vec![], Target::Jump("B".into())),
        4 => with(vec![], Target::Goto("B".into())),
        5 => with(vec![], Target::Reject(RejectWith::PortUnreachable)),
        6 => with(
            vec![Match::Set(SetMatch {
                negated: false,
                name: "s1".into(),
                dirs: vec![SetDir::Src],
                other: vec![],
            })],
            Target::Drop,
        ),
        7 => with(vec![Match::Comment("bad\u{1}".into())], Target::Accept),
        8 => Rule {
            protocol: Some(Neg::plain(6)),
            ..with(vec![Match::Tcp(TcpMatch::default())], Target::Drop)
        },
        9 => with(vec![Match::Tcp(TcpMatch::default())], Target::Drop),
        10 => with(vec![], Target::Return),
        11 => with(vec![], Target::Jump("INPUT".into())),
        12 => with(vec![], Target::Jump("nope".into())),
        13 => with(vec![], Target::Notrack),
        _ => Rule {
            src: IpNet::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8).map(Neg::plain),
            ..with(vec![], Target::Accept)
        },
    }
}

const POOL: usize = 15;

fn chain(name: &str, policy: Option<Policy>, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.into(),
        policy,
        counters: Default::default(),
        rules: rules.into(),
        location: Location::default(),
        nft_hook: None,
    }
}

fn random_ruleset(rng: &mut Rng) -> Ruleset {
    let rules = |rng: &mut Rng, n: usize| -> Vec<Rule> {
        // Mostly harmless rules, so that most rulesets are valid.
        (0..rng.below(n))
            .map(|_| match rng.below(4) {
                0 => pool(rng.below(POOL)),
                _ => pool([0, 8, 14][rng.below(3)]),
            })
            .collect()
    };
    let table = |kind: TableKind, chains: Vec<Chain>| Table {
        family: Family::Ipv4,
        kind,
        chains,
        location: Location::default(),
    };
    Ruleset {
        name: "r".into(),
        priority: 0,
        tables: vec![
            table(
                TableKind::Filter,
                vec![
                    chain("INPUT", Some(Policy::Accept), rules(rng, 12)),
                    chain("FORWARD", Some(Policy::Drop), rules(rng, 6)),
                    chain("OUTPUT", Some(Policy::Accept), rules(rng, 6)),
                    chain("A", None, rules(rng, 6)),
                    chain("B", None, rules(rng, 6)),
                ],
            ),
            table(
                TableKind::Raw,
                vec![
                    chain("PREROUTING", Some(Policy::Accept), rules(rng, 6)),
                    chain("OUTPUT", Some(Policy::Accept), rules(rng, 6)),
                    chain("A", None, rules(rng, 4)),
                ],
            ),
        ],
    }
}

fn mutate(rng: &mut Rng, rs: &mut Ruleset) {
    for _ in 0..1 + rng.below(2) {
        let t = rng.below(rs.tables.len());
        let table = &mut rs.tables[t];
        if rng.below(15) == 0 {
            table.chains.push(chain("C", None, vec![pool(0)]));
            continue;
        }
        let c = rng.below(table.chains.len());
        let rules = &mut table.chains[c].rules;
        let at = rng.below(rules.len() + 1);
        let removed = rng.below(3).min(rules.len() - at);
        let added: Vec<Rule> = (0..rng.below(3)).map(|_| pool(rng.below(POOL))).collect();
        for _ in 0..removed {
            rules.remove(at);
        }
        for (k, r) in added.into_iter().enumerate() {
            rules.insert(at + k, r);
        }
    }
}

/// A filter table whose INPUT jumps to `C0`, each `Ci` with the rules `rules(i)`.
fn chains_table(n: usize, rules: impl Fn(usize) -> Vec<Rule>) -> Ruleset {
    let mut chains = vec![chain(
        "INPUT",
        Some(Policy::Accept),
        vec![Rule {
            target: Target::Jump("C0".into()),
            ..Rule::default()
        }],
    )];
    chains.extend((0..n).map(|i| chain(&format!("C{i}"), None, rules(i))));
    Ruleset {
        name: "deep".into(),
        priority: 0,
        tables: vec![Table {
            family: Family::Ipv4,
            kind: TableKind::Filter,
            chains,
            location: Location::default(),
        }],
    }
}

fn jump(to: usize) -> Rule {
    Rule {
        target: Target::Jump(format!("C{to}")),
        ..Rule::default()
    }
}

/// Runs `f` on a thread with a 256 KiB stack (a recursion on chain depth overflows it).
fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let t = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(f)
        .expect("spawn");
    match t.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// 100k chains jumping in one line: the depth is found without recursion (the recursive
/// DFS overflowed this stack, and a tokio worker's at 12k).
#[test]
fn a_long_line_of_jumps_is_too_deep_on_a_small_stack() {
    const N: usize = 100_000;
    let v = small_stack(|| {
        let rs = chains_table(N, |i| if i + 1 < N { vec![jump(i + 1)] } else { vec![] });
        validate(&rs, None)
    });
    let kinds: Vec<&ViolationKind> = v.iter().map(|v| &v.kind).collect();
    assert_eq!(kinds, [&ViolationKind::TooDeep(N)]);
    assert_eq!(v[0].chain.as_deref(), Some("INPUT"));
}

/// A loop through 100k chains, and 100k loops through a line of them: every loop is
/// reported, each naming at most 17 items, so the cost stays linear.
#[test]
fn long_loops_are_named_in_short() {
    const N: usize = 100_000;
    let (one, many) = small_stack(|| {
        let ring = chains_table(N, |i| vec![jump((i + 1) % N)]);
        let back = chains_table(N, |i| {
            let mut r = vec![jump(0)];
            if i + 1 < N {
                r.push(jump(i + 1));
            }
            r
        });
        (validate(&ring, None), validate(&back, None))
    });
    let loops = |v: &[Violation]| -> Vec<Vec<String>> {
        v.iter()
            .filter_map(|v| match &v.kind {
                ViolationKind::Loop(names) => Some(names.clone()),
                _ => None,
            })
            .collect()
    };
    let ring = loops(&one);
    assert_eq!(ring.len(), 1);
    assert_eq!(ring[0].len(), LOOP_NAMES + 1);
    assert_eq!(ring[0][0], "C0");
    assert_eq!(
        ring[0][LOOP_NAMES / 2],
        format!("... ({} more)", N + 1 - 16)
    );
    assert_eq!(ring[0][LOOP_NAMES], "C0");
    assert_eq!(ring[0][LOOP_NAMES - 1], format!("C{}", N - 1));
    let back = loops(&many);
    assert_eq!(back.len(), N);
    assert!(back.iter().all(|l| l.len() <= LOOP_NAMES + 1));
    // The first loop: C0 jumping to itself; a short one is named in full.
    assert_eq!(back[0], ["C0", "C0"]);
    assert_eq!(back[3], ["C0", "C1", "C2", "C3", "C0"]);
}

#[test]
fn validate_after_matches_validate() {
    let with_s1: BTreeMap<String, Arc<dyn IpSet>> = BTreeMap::from([(
        "s1".to_string(),
        Arc::new(FrozenSet::new([])) as Arc<dyn IpSet>,
    )]);
    let without: BTreeMap<String, Arc<dyn IpSet>> = BTreeMap::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut checked, mut invalid, mut fast) = (0, 0, 0);
    while checked < 4000 {
        let old = random_ruleset(&mut rng);
        if has_errors(&validate(&old, Some(&with_s1))) {
            continue;
        }
        let mut new = old.clone();
        mutate(&mut rng, &mut new);
        let sets: &dyn SetRegistry = if rng.below(4) == 0 {
            &without
        } else {
            &with_s1
        };
        let full = validate(&new, Some(sets));
        let (after, diffs) = validate_after(&new, &old, Some(sets));
        assert_eq!(after, full, "old {old:#?}\nnew {new:#?}");
        for (ti, t) in new.tables.iter().enumerate() {
            let ot = old.table(t.family, t.kind).expect("same tables");
            for (ci, d) in diffs.tables[ti].iter().enumerate() {
                let d = d.expect("same chains: every chain diffed");
                assert_eq!(
                    d,
                    diff_rules(&ot.chains[ci].rules, &t.chains[ci].rules, |_, _| {})
                );
            }
        }
        invalid += usize::from(has_errors(&full));
        fast += usize::from(diffs.tables.iter().all(|t| !t.is_empty()));
        checked += 1;
    }
    // Both outcomes and both paths were exercised.
    assert!(invalid > 400 && invalid < 3600, "{invalid} invalid of 4000");
    assert!(fast > 2000, "{fast} of 4000 diffed every table");
}

#[test]
fn unchanged_rule_reached_from_a_new_hook_is_checked_again() {
    // `-m mac` in A is fine while only INPUT jumps to A; a new OUTPUT rule jumping to A
    // makes that unchanged rule an error.
    let mut rs = random_ruleset(&mut Rng(1));
    let filter = &mut rs.tables[0];
    for c in &mut filter.chains {
        c.rules.clear();
    }
    filter.chains[0].rules.push(pool(2));
    filter.chains[3].rules.push(pool(1));
    assert!(!has_errors(&validate(&rs, None)));
    let mut next = rs.clone();
    next.tables[0].chains[2].rules.push(pool(2));
    let (v, _) = validate_after(&next, &rs, None);
    assert!(
        v.iter().any(|v| v.kind
            == ViolationKind::WrongHook {
                what: "-m mac",
                hook: Hook::Output
            }),
        "{v:?}"
    );
    assert_eq!(v, validate(&next, None));
}
