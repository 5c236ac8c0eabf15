//! Tests of [`RuleList`]: room per chain, chunk sharing between clones, edits and the diff.

use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::model::{IpNet, Neg, SetDir, SetMatch};

use crate::test_rng::Rng;

/// A short chain holds room for about its rules, not for a whole chunk (100k one-rule
/// chains took 8 GB when each reserved CHUNK rules); a long one reserves at most one
/// chunk beyond its rules.
#[test]
fn room_grows_with_the_rules() {
    let room = |l: &RuleList| l.chunks.iter().map(|c| c.rules.capacity()).sum::<usize>();
    let mut l = RuleList::new();
    l.push(rule(0));
    assert_eq!(room(&l), 1);
    for i in 1..3 * CHUNK as u32 + 1 {
        l.push(rule(i));
        assert!(
            room(&l) <= 2 * l.len() + CHUNK,
            "{} for {}",
            room(&l),
            l.len()
        );
    }
}

/// Rule `id` (told apart by its source address); one in 16 jumps, one in 16 has a set.
fn rule(id: u32) -> Rule {
    let mut r = Rule {
        src: Some(Neg::plain(
            IpNet::new(IpAddr::V4(Ipv4Addr::from(id)), 32).expect("/32"),
        )),
        target: Target::Accept,
        ..Rule::default()
    };
    match id % 16 {
        3 => r.target = Target::Jump("C".into()),
        7 => r.matches.push(Match::Set(SetMatch {
            negated: false,
            name: "s".into(),
            dirs: vec![SetDir::Src],
            other: Vec::new(),
        })),
        _ => {}
    }
    r
}

fn id(r: &Rule) -> u32 {
    match r.src.expect("src").value.addr {
        IpAddr::V4(a) => a.into(),
        IpAddr::V6(_) => unreachable!(),
    }
}

fn ids<'a>(it: impl Iterator<Item = &'a Rule>) -> Vec<u32> {
    it.map(id).collect()
}

/// The diff compared rule by rule on flat arrays.
fn flat_diff(old: &[Rule], new: &[Rule]) -> (u32, u32, u32) {
    let common = old.len().min(new.len());
    let p = (0..common)
        .take_while(|&i| old[i].same_content(&new[i]))
        .count();
    let s = (0..common - p)
        .take_while(|&k| old[old.len() - 1 - k].same_content(&new[new.len() - 1 - k]))
        .count();
    (
        p as u32,
        (old.len() - p - s) as u32,
        (new.len() - p - s) as u32,
    )
}

/// Random edits applied to a list and to a `Vec` alike agree in every read, and the diff
/// of the list against its edited clone is the flat diff (with every unchanged rule that
/// needs a rescan reported, at its position).
#[test]
fn edits_read_and_diff_as_a_vec() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut next = 0u32;
    let mut fresh = || {
        next += 1;
        rule(next)
    };
    for round in 0..60 {
        let n = [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK + 17][round % 5];
        let flat: Vec<Rule> = (0..n).map(|_| fresh()).collect();
        let base = if round % 2 == 0 {
            RuleList::from(flat.clone())
        } else {
            flat.iter().cloned().collect()
        };
        base.check();
        let (mut list, mut vec) = (base.clone(), flat.clone());
        for _ in 0..1 + rng.below(40) {
            let len = vec.len();
            match rng.below(6) {
                0 => {
                    let at = rng.below(len + 1);
                    let r = fresh();
                    vec.insert(at, r.clone());
                    list.insert(at, r);
                }
                1 if len > 0 => {
                    let at = rng.below(len);
                    assert_eq!(id(&list.remove(at)), id(&vec.remove(at)));
                }
                2 if len > 0 => {
                    let at = rng.below(len);
                    let r = fresh();
                    vec[at] = r.clone();
                    assert_ne!(id(&list.set(at, r)), 0);
                }
                3 => {
                    let at = rng.below(len + 1);
                    let del = rng.below(2 * CHUNK).min(len - at);
                    let add: Vec<Rule> = (0..rng.below(CHUNK + 3)).map(|_| fresh()).collect();
                    vec.splice(at..at + del, add.clone());
                    list.splice(at..at + del, add);
                }
                4 if len > 0 => {
                    let at = rng.below(len);
                    let r = fresh();
                    vec[at] = r.clone();
                    list[at] = r;
                }
                _ => {
                    let r = fresh();
                    vec.push(r.clone());
                    list.push(r);
                }
            }
            list.check();
            assert_eq!(list.len(), vec.len());
        }
        assert_eq!(ids(list.iter()), ids(vec.iter()), "round {round}");
        assert_eq!(ids(list.iter().rev()), ids(vec.iter().rev()));
        assert_eq!(list, vec);
        assert_eq!(list, RuleList::from(vec.clone()));
        assert_eq!(format!("{list:?}"), format!("{vec:?}"));
        let hash = |x: &dyn Fn(&mut rustc_hash::FxHasher)| {
            let mut h = rustc_hash::FxHasher::default();
            x(&mut h);
            h.finish()
        };
        assert_eq!(hash(&|h| list.hash(h)), hash(&|h| vec.hash(h)));
        for i in [0, 1, vec.len() / 2, vec.len().saturating_sub(1), vec.len()] {
            assert_eq!(list.get(i).map(id), vec.get(i).map(id));
            for j in [i, i + 1, i + CHUNK + 1, vec.len()] {
                if j <= vec.len() {
                    assert_eq!(ids(list.range(i..j)), ids(vec[i..j].iter()));
                    let mut it = list.iter();
                    assert_eq!(it.nth(i).map(id), vec.get(i).map(id));
                    assert_eq!(it.len(), vec.len().saturating_sub(i + 1));
                }
            }
        }
        assert_eq!(list.first().map(id), vec.first().map(id));
        assert_eq!(list.last().map(id), vec.last().map(id));
        let mut seen = Vec::new();
        let d = diff(&base, &list, |i, r| seen.push((i, id(r))));
        assert_eq!(d, flat_diff(&flat, &vec), "round {round}");
        let (p, _, nm) = (d.0 as usize, d.1, d.2 as usize);
        for (i, r) in vec.iter().enumerate() {
            let unchanged = i < p || i >= p + nm;
            let reported = seen.contains(&(i, id(r)));
            assert!(!reported || unchanged, "changed rule {i} reported");
            assert!(
                !unchanged || !needs_rescan(r) || reported,
                "rule {i} missed"
            );
        }
        assert_eq!(ids(list.clone().into_vec().iter()), ids(vec.iter()));
        assert_eq!(ids(list.iter_mut().map(|r| &*r)), ids(vec.iter()));
    }
}

#[test]
fn an_edit_copies_only_its_chunk() {
    let base = RuleList::from((0..10 * CHUNK as u32).map(rule).collect::<Vec<_>>());
    let mut replaced = base.clone();
    replaced.set(5 * CHUNK + 3, rule(1_000_000));
    assert_eq!(replaced.shared_chunks(&base), 9);
    let mut inserted = base.clone();
    inserted.insert(5 * CHUNK + 3, rule(1_000_000));
    assert_eq!(inserted.shared_chunks(&base), 9);
    let mut removed = base.clone();
    removed.remove(5 * CHUNK + 3);
    assert_eq!(removed.shared_chunks(&base), 9);
    assert_eq!(
        diff(&base, &inserted, |_, _| {}),
        (5 * CHUNK as u32 + 3, 0, 1)
    );
    assert_eq!(
        diff(&base, &removed, |_, _| {}),
        (5 * CHUNK as u32 + 3, 1, 0)
    );
    assert_eq!(
        diff(&base, &replaced, |_, _| {}),
        (5 * CHUNK as u32 + 3, 1, 1)
    );
}

/// Moving the lines of the rules from a position on copies only the chunks that hold
/// them; the rules before keep theirs, shared with the original.
#[test]
fn moved_locations_copy_only_their_chunks() {
    let located = |n: u32| Rule {
        location: Location {
            line: n + 1,
            column: 1,
        },
        ..rule(n)
    };
    let base = RuleList::from((0..10 * CHUNK as u32).map(located).collect::<Vec<_>>());
    let mut moved = base.clone();
    moved.map_locations_from(6 * CHUNK + 10, |l| Location {
        line: l.line + 7,
        ..l
    });
    assert_eq!(moved.shared_chunks(&base), 6);
    for (i, (a, b)) in base.iter().zip(moved.iter()).enumerate() {
        let want = if i >= 6 * CHUNK + 10 {
            a.location.line + 7
        } else {
            a.location.line
        };
        assert_eq!(b.location.line, want, "rule {i}");
        assert_eq!(b.target, a.target);
    }
    // Past the end: nothing changes.
    let mut same = base.clone();
    same.map_locations_from(base.len(), |_| Location::default());
    assert_eq!(same.shared_chunks(&base), 10);
}

#[test]
#[should_panic(expected = "insertion index")]
fn insert_past_the_end_panics() {
    RuleList::new().insert(1, rule(1));
}

/// A rule that reads `to` bytes of the packet (`-m string --to`), told apart by `id`.
fn reading(id: u32, to: u16) -> Rule {
    let mut r = rule(id);
    r.matches
        .push(Match::String(Box::new(crate::model::StringMatch {
            negated: false,
            pattern: b"x".to_vec(),
            algo: crate::model::StringAlgo::Bm,
            from: 0,
            to,
            icase: false,
        })));
    r
}

/// The bytes a list's rules read, by a walk of every rule (what the cache must equal).
fn reads_of(rules: &[Rule]) -> u32 {
    rules
        .iter()
        .map(crate::snapshot::copy_range::rule_reads)
        .max()
        .unwrap_or(0)
}

/// [`RuleList::packet_reads`] and [`RuleList::has_counters`] keep one figure per chunk; every
/// way of changing a chunk's
/// rules (insert, remove, set, splice, push, `IndexMut`, `iter_mut`) must drop the figure of
/// the chunk it copies, and a clone's edit must leave the original's figure alone.
#[test]
fn packet_reads_follow_every_edit() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut next = 0u32;
    let mut fresh = |rng: &mut Rng| {
        next += 1;
        match rng.below(12) {
            0 => reading(next, 100 + rng.below(60_000) as u16),
            1 => Rule {
                counters: Some(crate::model::Counters {
                    packets: 1,
                    bytes: 2,
                }),
                ..rule(next)
            },
            _ => rule(next),
        }
    };
    for round in 0..40 {
        let n = [0, 1, CHUNK, 3 * CHUNK + 17][round % 4];
        let flat: Vec<Rule> = (0..n).map(|_| fresh(&mut rng)).collect();
        let base = RuleList::from(flat.clone());
        // Warm every chunk's figure before the edits.
        assert_eq!(base.packet_reads(), reads_of(&flat));
        let (mut list, mut vec) = (base.clone(), flat.clone());
        for step in 0..1 + rng.below(30) {
            let len = vec.len();
            match rng.below(7) {
                0 => {
                    let at = rng.below(len + 1);
                    let r = fresh(&mut rng);
                    vec.insert(at, r.clone());
                    list.insert(at, r);
                }
                1 if len > 0 => {
                    let at = rng.below(len);
                    vec.remove(at);
                    list.remove(at);
                }
                2 if len > 0 => {
                    let at = rng.below(len);
                    let r = fresh(&mut rng);
                    vec[at] = r.clone();
                    list.set(at, r);
                }
                3 if len > 0 => {
                    // In place, through `IndexMut`: the rule's matches change.
                    let at = rng.below(len);
                    let to = 200 + rng.below(65_000) as u16;
                    for r in [&mut vec[at], &mut list[at]] {
                        *r = reading(id(r), to);
                    }
                }
                4 if len > 0 => {
                    // Every rule through `iter_mut`: drop the string matches.
                    for r in vec.iter_mut().chain(list.iter_mut()) {
                        *r = rule(id(r));
                    }
                }
                5 => {
                    let at = rng.below(len + 1);
                    let del = rng.below(CHUNK).min(len - at);
                    let add: Vec<Rule> = (0..rng.below(CHUNK)).map(|_| fresh(&mut rng)).collect();
                    vec.splice(at..at + del, add.clone());
                    list.splice(at..at + del, add);
                }
                _ => {
                    let r = fresh(&mut rng);
                    vec.push(r.clone());
                    list.push(r);
                }
            }
            assert_eq!(
                list.packet_reads(),
                reads_of(&vec),
                "round {round}, step {step}"
            );
            assert_eq!(
                list.has_counters(),
                vec.iter().any(|r| r.counters.is_some()),
                "round {round}, step {step}"
            );
        }
        assert_eq!(base.packet_reads(), reads_of(&flat), "round {round}: base");
        assert_eq!(
            base.has_counters(),
            flat.iter().any(|r| r.counters.is_some())
        );
    }
}
