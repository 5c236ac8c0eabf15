//! Counters through engine commits against a reference that compiles every snapshot from
//! scratch and carries counts by rule identity ([`Snapshot::carry_from`] between two
//! from-scratch snapshots): random sequences of `Put`, `Edit`, `Remove` and `ReplaceAll` of
//! three rulesets (IPv4 and IPv6 filter tables, user chains with jumps that come and go so a
//! table's chain names change, `-m set` rules, priorities that change), zeroing of one
//! ruleset or all, prepared commits that go stale, bulk replacements that run the shared
//! counter cells out of slots, and traffic on two cores between the commits and between a
//! prepare and its publish. After every step [`Engine::counters`] must equal the reference's
//! counters and every commit's `carried` the reference's.
//!
//! Every rule carries a unique comment, so no two rules of a chain are equal and the
//! incremental identity (position around the changed run) and the from-scratch one (content
//! and ordinal) agree.
//!
//! `cargo test -p vallum-engine --test it -- counter_cells::`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, CommitError, Engine, EngineConfig, EngineWorker};
use vallum_engine::model::{EditOp, Family, Hook, IpNet, RuleEdit, Ruleset, TableKind};
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::{FrozenSet, IpSet};
use vallum_engine::snapshot::{Snapshot, Verdict};

use crate::support::seeded;
use seeded::{Rng, ZeroClock};

type Sets = BTreeMap<String, Arc<dyn IpSet>>;

fn sets() -> Sets {
    let mut s = Sets::new();
    let set: Arc<dyn IpSet> = Arc::new(FrozenSet::new([
        IpNet::new("10.0.0.1".parse().unwrap(), 32).unwrap(),
        IpNet::new("fd00::1".parse().unwrap(), 128).unwrap(),
    ]));
    s.insert("S".into(), set);
    s
}

const PORTS: usize = 24;
const USER: [&str; 3] = ["U0", "U1", "U2"];

#[derive(Clone, Debug)]
struct RuleSpec {
    id: u64,
    port: u16,
    set: bool,
    /// "ACCEPT", "DROP", "RETURN", "" (no target), or a user chain.
    target: String,
}

#[derive(Clone, Debug)]
struct ChainSpec {
    name: String,
    policy: Option<&'static str>,
    rules: Vec<RuleSpec>,
}

#[derive(Clone, Debug)]
struct RsSpec {
    name: String,
    priority: i32,
    /// Per family (IPv4, IPv6): INPUT, FORWARD, OUTPUT, then user chains.
    chains: [Vec<ChainSpec>; 2],
}

struct Gen {
    rng: Rng,
    next_id: u64,
}

impl Gen {
    fn rule(&mut self, chain: &str, users: &[String]) -> RuleSpec {
        self.next_id += 1;
        // User chains only jump to later user chains (no loops); builtins to any.
        let later: Vec<&String> = users
            .iter()
            .filter(|u| !USER.contains(&chain) || u.as_str() > chain)
            .collect();
        let target = match self.rng.below(10) {
            0..=1 if !later.is_empty() => later[self.rng.below(later.len())].clone(),
            0..=2 => String::new(),
            3..=4 => "DROP".into(),
            5 if USER.contains(&chain) => "RETURN".into(),
            _ => "ACCEPT".into(),
        };
        RuleSpec {
            id: self.next_id,
            port: 1 + self.rng.below(PORTS) as u16,
            set: self.rng.below(8) == 0,
            target,
        }
    }

    fn chain(&mut self, name: &str, policy: Option<&'static str>, users: &[String]) -> ChainSpec {
        let n = self.rng.below(8);
        ChainSpec {
            name: name.into(),
            policy,
            rules: (0..n).map(|_| self.rule(name, users)).collect(),
        }
    }

    fn ruleset(&mut self, name: &str) -> RsSpec {
        let fam = |g: &mut Gen| {
            let users: Vec<String> = USER
                .iter()
                .filter(|_| g.rng.below(2) == 0)
                .map(|s| s.to_string())
                .collect();
            let mut chains = vec![
                g.chain("INPUT", Some("DROP"), &users),
                g.chain("FORWARD", Some("ACCEPT"), &users),
                g.chain("OUTPUT", Some("ACCEPT"), &users),
            ];
            for u in &users {
                chains.push(g.chain(u, None, &users));
            }
            chains
        };
        RsSpec {
            name: name.into(),
            priority: self.rng.below(3) as i32 * 10,
            chains: [fam(self), fam(self)],
        }
    }

    /// One random change of one chain (or of the chain list) of `rs`.
    fn mutate(&mut self, rs: &mut RsSpec) {
        let f = self.rng.below(2);
        let users: Vec<String> = rs.chains[f][3..].iter().map(|c| c.name.clone()).collect();
        match self.rng.below(12) {
            // Add or remove a user chain: the table's chain names change.
            0 => {
                let missing: Vec<&str> = USER
                    .iter()
                    .copied()
                    .filter(|u| !users.iter().any(|x| x == u))
                    .collect();
                if missing.is_empty() {
                    return;
                }
                let name = missing[self.rng.below(missing.len())];
                let mut all = users.clone();
                all.push(name.into());
                let c = self.chain(name, None, &all);
                let chains = &mut rs.chains[f];
                chains.push(c);
                chains[3..].sort_by(|a, b| a.name.cmp(&b.name));
            }
            1 => {
                if users.is_empty() {
                    return;
                }
                let name = users[self.rng.below(users.len())].clone();
                let chains = &mut rs.chains[f];
                chains.retain(|c| c.name != name);
                for c in chains.iter_mut() {
                    c.rules.retain(|r| r.target != name);
                }
            }
            2 => rs.priority = self.rng.below(3) as i32 * 10,
            3 => {
                let c = &mut rs.chains[f][self.rng.below(3)];
                c.policy = Some(if c.policy == Some("DROP") {
                    "ACCEPT"
                } else {
                    "DROP"
                });
            }
            _ => {
                let ci = self.rng.below(rs.chains[f].len());
                let name = rs.chains[f][ci].name.clone();
                let fresh = self.rule(&name, &users);
                let rules = &mut rs.chains[f][ci].rules;
                let n = rules.len();
                match self.rng.below(5) {
                    0 if n > 0 => {
                        rules.remove(self.rng.below(n));
                    }
                    1 if n > 0 => rules[self.rng.below(n)] = fresh,
                    2 if n > 1 => {
                        let at = self.rng.below(n - 1);
                        rules.swap(at, at + 1);
                    }
                    3 if n > 2 => {
                        // Move a rule elsewhere (same content: the same identity).
                        let r = rules.remove(self.rng.below(n));
                        rules.insert(self.rng.below(n), r);
                    }
                    _ if n < 16 => rules.insert(self.rng.below(n + 1), fresh),
                    _ => {}
                }
            }
        }
    }
}

fn rule_text(chain: &str, r: &RuleSpec) -> String {
    let mut s = format!("-A {chain} -p tcp --dport {}", r.port);
    if r.set {
        s.push_str(" -m set --match-set S src");
    }
    s.push_str(&format!(" -m comment --comment r{}", r.id));
    if !r.target.is_empty() {
        s.push_str(&format!(" -j {}", r.target));
    }
    s
}

fn parse(spec: &RsSpec) -> Ruleset {
    let mut out: Option<Ruleset> = None;
    for (fi, family) in [Family::Ipv4, Family::Ipv6].into_iter().enumerate() {
        let mut text = String::from("*filter\n");
        for c in &spec.chains[fi] {
            text.push_str(&format!(":{} {} [0:0]\n", c.name, c.policy.unwrap_or("-")));
        }
        for c in &spec.chains[fi] {
            for r in &c.rules {
                text.push_str(&rule_text(&c.name, r));
                text.push('\n');
            }
        }
        text.push_str("COMMIT\n");
        let opts = ParseOptions {
            family,
            ..ParseOptions::default()
        };
        let rs =
            parse_ruleset(&spec.name, &text, &opts).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        match &mut out {
            None => out = Some(rs),
            Some(o) => o.tables.extend(rs.tables),
        }
    }
    let mut rs = out.unwrap();
    rs.priority = spec.priority;
    rs
}

/// The edits that make `new` of `old` (same chain names): for each chain, the rules of the
/// changed run between the common prefix and suffix deleted and the new ones inserted.
fn edits(old: &RsSpec, new: &RsSpec, parsed: &Ruleset) -> Option<Vec<RuleEdit>> {
    let mut out = Vec::new();
    for (fi, family) in [Family::Ipv4, Family::Ipv6].into_iter().enumerate() {
        let (oc, nc) = (&old.chains[fi], &new.chains[fi]);
        if oc.len() != nc.len() || oc.iter().zip(nc).any(|(a, b)| a.name != b.name) {
            return None;
        }
        if oc.iter().zip(nc).any(|(a, b)| a.policy != b.policy) || old.priority != new.priority {
            return None;
        }
        let table = parsed.table(family, TableKind::Filter).unwrap();
        for (a, b) in oc.iter().zip(nc) {
            let (ar, br) = (&a.rules, &b.rules);
            let p = ar.iter().zip(br).take_while(|(x, y)| x.id == y.id).count();
            let s = ar[p..]
                .iter()
                .rev()
                .zip(br[p..].iter().rev())
                .take_while(|(x, y)| x.id == y.id)
                .count();
            let chain = table.chains.iter().find(|c| c.name == b.name).unwrap();
            for _ in p..ar.len() - s {
                out.push(RuleEdit {
                    family,
                    table: TableKind::Filter,
                    chain: b.name.clone(),
                    number: p as u32 + 1,
                    op: EditOp::Delete,
                });
            }
            for i in p..br.len() - s {
                out.push(RuleEdit {
                    family,
                    table: TableKind::Filter,
                    chain: b.name.clone(),
                    number: i as u32 + 1,
                    op: EditOp::Insert(chain.rules.range(i..i + 1).next().unwrap().clone()),
                });
            }
        }
    }
    Some(out)
}

fn packet(rng: &mut Rng) -> PacketMeta {
    let v6 = rng.below(3) == 0;
    let (src, dst): (IpAddr, IpAddr) = match (v6, rng.below(2)) {
        (false, 0) => ("10.0.0.1".parse().unwrap(), "10.0.0.9".parse().unwrap()),
        (false, _) => ("10.0.0.2".parse().unwrap(), "10.0.0.9".parse().unwrap()),
        (true, 0) => ("fd00::1".parse().unwrap(), "fd00::9".parse().unwrap()),
        (true, _) => ("fd00::2".parse().unwrap(), "fd00::9".parse().unwrap()),
    };
    PacketMeta {
        family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
        hook: [Hook::Input, Hook::Forward, Hook::Output][rng.below(3)],
        src,
        dst,
        protocol: 6,
        sport: 40000,
        dport: 1 + rng.below(PORTS + 2) as u16,
        len: 40 + rng.below(1000) as u32,
        ..PacketMeta::default()
    }
}

/// `n` packets through the engine's workers and the reference snapshot, on random cores.
fn traffic(rng: &mut Rng, workers: &mut [EngineWorker<'_>], reference: &Snapshot, n: usize) {
    let mut logs = Vec::new();
    for _ in 0..n {
        let p = packet(rng);
        let core = rng.below(workers.len());
        let mut a = [p];
        let mut v = [Verdict::Accept];
        workers[core].process_batch(&mut a, &mut v, 0);
        let mut q = p;
        let r = crate::support::classify_one(reference, core, &mut q, 0, &mut logs);
        assert_eq!(v[0], r, "verdict of {p:?}");
    }
}

#[test]
fn engine_counters_equal_from_scratch_compiles_carried_by_identity() {
    let sets = sets();
    let cores = 2;
    let engine = Engine::new(
        EngineConfig {
            cores,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    );
    let mut workers: Vec<EngineWorker<'_>> =
        (0..cores).map(|c| engine.worker(c).unwrap()).collect();
    let mut g = Gen {
        rng: Rng(std::env::var("SEED").map_or(0xc0ffee, |s| s.parse().unwrap())),
        next_id: 0,
    };
    let mut traffic_rng = Rng(0x7aff1c);
    let names = ["a", "b", "c"];
    let mut active: BTreeMap<String, RsSpec> = BTreeMap::new();
    let mut reference = Snapshot::compile(&[], &sets, cores).unwrap();
    let mut fallbacks = 0;
    let mut stale = 0;
    let mut last_cap: Option<String> = None;

    // Commits `change` (made of the specs `next`) on the engine and the reference.
    let steps = std::env::var("STEPS").map_or(600, |s| s.parse().unwrap());
    for step in 0..steps {
        traffic(&mut traffic_rng, &mut workers, &reference, 12);
        let mut next = active.clone();
        let change = match g.rng.below(16) {
            0 => {
                let n = names[g.rng.below(3)];
                next.remove(n);
                Change::Remove(n.into())
            }
            1 => {
                // Replace all: some mutated, one maybe dropped or fresh.
                for n in names {
                    match g.rng.below(4) {
                        0 => {
                            next.remove(n);
                        }
                        1 => {
                            let r = g.ruleset(n);
                            next.insert(n.into(), r);
                        }
                        _ => {
                            if let Some(r) = next.get_mut(n) {
                                let mut m = r.clone();
                                g.mutate(&mut m);
                                *r = m;
                            }
                        }
                    }
                }
                Change::ReplaceAll(next.values().map(parse).collect())
            }
            2 => {
                // Bulk: every chain of one ruleset gets fresh rules (runs the cells dry).
                let n = names[g.rng.below(3)];
                let mut r = next.get(n).cloned().unwrap_or_else(|| g.ruleset(n));
                for f in 0..2 {
                    let users: Vec<String> =
                        r.chains[f][3..].iter().map(|c| c.name.clone()).collect();
                    for c in r.chains[f].iter_mut() {
                        let k = 8 + g.rng.below(40);
                        c.rules = (0..k).map(|_| g.rule(&c.name, &users)).collect();
                    }
                }
                next.insert(n.into(), r.clone());
                Change::Put(parse(&r))
            }
            3..=6 if !active.is_empty() => {
                // An edit of an active ruleset.
                let n = active
                    .keys()
                    .nth(g.rng.below(active.len()))
                    .unwrap()
                    .clone();
                let old = active[&n].clone();
                let mut r = old.clone();
                for _ in 0..1 + g.rng.below(3) {
                    g.mutate(&mut r);
                }
                let parsed = parse(&r);
                next.insert(n.clone(), r.clone());
                match edits(&old, &r, &parsed) {
                    Some(e) => Change::Edit {
                        ruleset: n,
                        edits: e,
                    },
                    None => Change::Put(parsed),
                }
            }
            _ => {
                let n = names[g.rng.below(3)];
                let r = match next.get(n) {
                    Some(r) if g.rng.below(8) != 0 => {
                        let mut r = r.clone();
                        for _ in 0..1 + g.rng.below(2) {
                            g.mutate(&mut r);
                        }
                        r
                    }
                    _ => g.ruleset(n),
                };
                next.insert(n.into(), r.clone());
                Change::Put(parse(&r))
            }
        };
        let prepared = engine
            .prepare(change, &sets)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        // Now and then a second prepare of another change from the same active snapshot,
        // which goes stale when the first is published.
        let second = if g.rng.below(4) == 0 {
            let n = names[g.rng.below(3)];
            let mut r = next.get(n).cloned().unwrap_or_else(|| g.ruleset(n));
            g.mutate(&mut r);
            Some(engine.prepare(Change::Put(parse(&r)), &sets).unwrap())
        } else {
            None
        };
        // Traffic on the old snapshot between the compile and the publish.
        traffic(&mut traffic_rng, &mut workers, &reference, 6);
        if g.rng.below(10) == 0 {
            engine.zero_counters(None);
            reference.zero_counters(None);
        } else if g.rng.below(10) == 0 {
            let n = names[g.rng.below(3)];
            engine.zero_counters(Some(n));
            reference.zero_counters(Some(n));
        }
        let committed = engine
            .publish(prepared)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        if let Some(s) = second {
            assert!(matches!(engine.publish(s), Err(CommitError::Stale)));
            stale += 1;
        }
        let list: Vec<Arc<Ruleset>> = engine.rulesets().into_values().collect();
        let fresh = Snapshot::compile(&list, &sets, cores).unwrap();
        let carried = fresh.carry_from(&reference);
        reference = fresh;
        active = next;
        // The retired snapshot of commit k+1 is the one commit k published: a change of
        // capacity between consecutive ones is a fresh cell set.
        // No core is mid-batch (the traffic runs on this thread), so publish retired it.
        let retired = committed
            .retired
            .last()
            .expect("the replaced snapshot, retired");
        let cap = cells_of(&format!("{:?}", **retired));
        if last_cap.as_ref().is_some_and(|c| *c != cap) {
            fallbacks += 1;
        }
        last_cap = Some(cap);
        assert_eq!(committed.report.carried, carried, "step {step}: carried");
        assert_eq!(engine.counters(), reference.counters(), "step {step}");
        if g.rng.below(13) == 0 {
            let n = names[g.rng.below(3)];
            engine.zero_counters(Some(n));
            reference.zero_counters(Some(n));
        }
    }
    traffic(&mut traffic_rng, &mut workers, &reference, 50);
    assert_eq!(engine.counters(), reference.counters(), "at the end");
    assert!(
        engine.counters().iter().any(|c| c.packets > 0),
        "nothing counted"
    );
    assert!(fallbacks >= 3, "only {fallbacks} fresh cell sets");
    assert!(stale > 50, "only {stale} stale prepares");
}

/// The capacity part of a snapshot's debug form ("capacity: N"), which tells its cell set
/// apart from the next fresh one (each fresh set is sized to its snapshot).
fn cells_of(debug: &str) -> String {
    let at = debug.find("capacity").expect("cells in debug form");
    debug[at..].split(',').next().unwrap().to_string()
}

/// A commit of one ruleset leaves the `-m limit` buckets of another, untouched ruleset as
/// they are (its compiled chains are shared with the active snapshot), also on the commit
/// whose snapshot runs the shared counter cells out of slots and gets fresh ones: a bucket
/// spent at time 0 (`--limit 1/hour --limit-burst 1`) stays spent however many commits of
/// other rules follow.
#[test]
fn limit_buckets_of_untouched_rulesets_survive_fresh_cells() {
    let sets = sets();
    let engine = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    );
    let text = "*filter\n:INPUT DROP [0:0]\n\
                -A INPUT -p tcp --dport 22 -m limit --limit 1/hour --limit-burst 1 -j ACCEPT\n\
                COMMIT\n";
    let limited = parse_ruleset("limited", text, &ParseOptions::default()).unwrap();
    engine.commit(Change::Put(limited), &sets).unwrap();
    let mut worker = engine.worker(0).unwrap();
    let ssh = |worker: &mut EngineWorker<'_>| {
        let mut p = [PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Input,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            protocol: 6,
            sport: 40000,
            dport: 22,
            len: 60,
            ..PacketMeta::default()
        }];
        let mut v = [Verdict::Accept];
        worker.process_batch(&mut p, &mut v, 0);
        v[0]
    };
    assert_eq!(ssh(&mut worker), Verdict::Accept, "the burst of one");
    assert_eq!(ssh(&mut worker), Verdict::Drop, "the bucket is spent");
    // Another ruleset, all of its 200 rules new on every commit: ~10 commits fill the cells.
    let mut id = 0;
    for step in 0..40 {
        let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
        for _ in 0..200 {
            id += 1;
            text.push_str(&format!(
                "-A INPUT -p udp --dport 5000 -m comment --comment c{id} -j ACCEPT\n"
            ));
        }
        text.push_str("COMMIT\n");
        let churn = parse_ruleset("churn", &text, &ParseOptions::default()).unwrap();
        engine.commit(Change::Put(churn), &sets).unwrap();
        assert_eq!(
            ssh(&mut worker),
            Verdict::Drop,
            "step {step}: the untouched ruleset's limit bucket was refilled"
        );
    }
}

/// Two worker threads classify while a third commits: a rule and a policy that every commit
/// keeps count every packet that reached them exactly once, through commits that share the
/// counter cells and commits that get fresh ones (carried after the quiesce).
#[test]
fn kept_rules_count_every_packet_under_concurrent_commits() {
    let sets = sets();
    let cores = 2;
    let engine = Engine::new(
        EngineConfig {
            cores,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    );
    let keep = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n";
    let keep = parse_ruleset("keep", keep, &ParseOptions::default()).unwrap();
    engine.commit(Change::Put(keep.clone()), &sets).unwrap();
    let per_thread = 2_000_000u64;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let commits = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cores)
            .map(|core| {
                let engine = &engine;
                s.spawn(move || {
                    let mut w = engine.worker(core).unwrap();
                    let mut rng = Rng(core as u64 + 1);
                    let mut sent = 0;
                    while sent < per_thread {
                        let mut batch: Vec<PacketMeta> = (0..32)
                            .map(|_| PacketMeta {
                                family: Family::Ipv4,
                                hook: Hook::Input,
                                src: "10.0.0.1".parse().unwrap(),
                                dst: "10.0.0.2".parse().unwrap(),
                                protocol: 6,
                                sport: 40000,
                                dport: if rng.below(2) == 0 { 22 } else { 23 },
                                len: 100,
                                ..PacketMeta::default()
                            })
                            .collect();
                        let mut v = vec![Verdict::Drop; batch.len()];
                        w.process_batch(&mut batch, &mut v, 0);
                        sent += batch.len() as u64;
                    }
                })
            })
            .collect();
        let committer = s.spawn(|| {
            let mut id = 0;
            let mut n = 0;
            let mut rng = Rng(99);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
                for _ in 0..1 + rng.below(300) {
                    id += 1;
                    text.push_str(&format!(
                        "-A INPUT -p udp --dport 5000 -m comment --comment c{id} -j ACCEPT\n"
                    ));
                }
                text.push_str("COMMIT\n");
                let churn = parse_ruleset("churn", &text, &ParseOptions::default()).unwrap();
                engine.commit(Change::Put(churn), &sets).unwrap();
                if n % 7 == 3 {
                    // The kept ruleset again, as a new model (equal rules): diffed, kept.
                    engine.commit(Change::Put(keep.clone()), &sets).unwrap();
                }
                n += 1;
            }
            n
        });
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        committer.join().unwrap()
    });
    let counters = engine.counters();
    let of = |rule: Option<u32>| {
        counters
            .iter()
            .find(|c| &*c.ruleset == "keep" && &*c.chain == "INPUT" && c.rule == rule)
            .map(|c| c.packets)
            .unwrap()
    };
    let total = per_thread * cores as u64;
    assert!(commits > 20, "only {commits} commits");
    assert_eq!(of(Some(1)) + of(None), total, "{commits} commits");
}

/// Which of two equal rules a counter goes on with must not depend on how full the counter
/// cells are: the same published commits on three engines give the same counters, where one
/// also had a big commit prepared and dropped (vallumd drops a prepared commit when its store
/// write fails: its slots go back), and one had two prepared and dropped in the order that
/// cannot give the first one's slots back (the cells stay full and the next commit gets
/// fresh ones, which must continue the same rules: by position around the changed run, the
/// count of the one old `--dport 22` rule on the new last one, not on the first equal one).
/// (Before the fix, a dropped prepare's slots never came back and a commit into fresh cells
/// carried by content and ordinal.)
#[test]
fn equal_rules_keep_their_counts_whatever_the_cells_free_slots() {
    let sets = sets();
    let engine = || {
        Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: None,
            },
            Arc::new(ZeroClock),
        )
    };
    let rs = |ports: &[u16]| {
        let mut text = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
        for p in ports {
            text.push_str(&format!("-A INPUT -p tcp --dport {p} -j ACCEPT\n"));
        }
        text.push_str("COMMIT\n");
        parse_ruleset("t", &text, &ParseOptions::default()).unwrap()
    };
    let (roomy, dropped, full) = (engine(), engine(), engine());
    for e in [&roomy, &dropped, &full] {
        e.commit(Change::Put(rs(&[23, 22])), &sets).unwrap();
        let mut w = e.worker(0).unwrap();
        let mut p = [PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Input,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            protocol: 6,
            sport: 40000,
            dport: 22,
            len: 60,
            ..PacketMeta::default()
        }];
        w.process_batch(&mut p, &mut [Verdict::Drop], 0);
    }
    let big: Vec<u16> = (1000..3500).collect();
    drop(dropped.prepare(Change::Put(rs(&big)), &sets).unwrap());
    // 1,000 of the active cells' 1,024 spare slots (2 rules, 3 policies), then one more
    // after them: only the second build's slots can go back.
    let most: Vec<u16> = (1000..2000).collect();
    let first = full.prepare(Change::Put(rs(&most)), &sets).unwrap();
    let second = full.prepare(Change::Put(rs(&[7, 23, 22])), &sets).unwrap();
    drop(first);
    drop(second);
    // 31 new rules (the first `--dport 22` and 30 others) before the kept `23, 22`: more
    // than the 24 slots `full` has left.
    let last: Vec<u16> = [22].into_iter().chain(5000..5030).chain([23, 22]).collect();
    for e in [&roomy, &dropped, &full] {
        e.commit(Change::Put(rs(&last)), &sets).unwrap();
    }
    let counted = roomy.counters();
    assert_eq!(
        counted
            .iter()
            .filter(|c| &*c.chain == "INPUT")
            .map(|c| (c.rule, c.packets))
            .collect::<Vec<_>>(),
        (1..=33)
            .map(|n| (Some(n), u64::from(n == 33)))
            .chain([(None, 0)])
            .collect::<Vec<_>>()
    );
    assert_eq!(counted, dropped.counters());
    assert_eq!(counted, full.counters());
}

/// A ruleset parsed with `--counters` starts its rules (and non-zero policies) at the text's
/// `[p:b]`; a later put without counters carries them as any other; one of another ruleset
/// does not touch them. Fails before `Snapshot::start_counters` (every count started at 0).
#[test]
fn counters_parsed_with_counters_start_there() {
    let engine = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    );
    let with = ParseOptions {
        counters: true,
        ..ParseOptions::default()
    };
    let text = "*filter\n:INPUT DROP [7:700]\n[5:300] -A INPUT -p tcp --dport 22 -j ACCEPT\n\
                -A INPUT -p tcp --dport 80 -j ACCEPT\nCOMMIT\n";
    let sets = sets();
    let put = |name: &str, opts: &ParseOptions<'_>, text: &str| {
        let rs = parse_ruleset(name, text, opts).unwrap();
        engine.commit(Change::Put(rs), &sets).unwrap();
    };
    let of = |name: &str| -> Vec<(Option<u32>, u64, u64)> {
        engine
            .counters()
            .into_iter()
            .filter(|c| &*c.ruleset == name && &*c.chain == "INPUT")
            .map(|c| (c.rule, c.packets, c.bytes))
            .collect()
    };
    put("a", &with, text);
    assert_eq!(
        of("a"),
        [(Some(1), 5, 300), (Some(2), 0, 0), (None, 7, 700)]
    );
    // Without --counters the text's counts are ignored: the rules keep what they had.
    put(
        "a",
        &ParseOptions::default(),
        &text.replace("[5:300]", "[9:9]"),
    );
    put("b", &with, text);
    assert_eq!(
        of("a"),
        [(Some(1), 5, 300), (Some(2), 0, 0), (None, 7, 700)]
    );
    // With them again, they are set.
    put("a", &with, &text.replace("[5:300]", "[1:60]"));
    assert_eq!(of("a"), [(Some(1), 1, 60), (Some(2), 0, 0), (None, 7, 700)]);
}

/// `Change::PutEdited` keeps the counts of the rules it kept (a model edited from one parsed
/// with `--counters` carries the text's counters; `Change::Put` of it starts them there
/// again, losing what was counted since), and `zero_counters_in` zeroes one rule, one chain
/// or one table as `iptables [-t T] -Z [CHAIN [N]]`, nothing else.
#[test]
fn put_edited_keeps_counts_and_zero_counters_in_scopes() {
    let sets = sets();
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(ZeroClock),
    );
    let text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                [5:300] -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n\
                [0:0] -A OUTPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n";
    let opts = ParseOptions {
        counters: true,
        ..ParseOptions::default()
    };
    e.commit(Change::Put(parse_ruleset("t", text, &opts).unwrap()), &sets)
        .unwrap();
    let mut w = e.worker(0).unwrap();
    let packet = |hook| PacketMeta {
        family: Family::Ipv4,
        hook,
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2".parse().unwrap(),
        protocol: 6,
        sport: 40000,
        dport: 22,
        len: 60,
        ..PacketMeta::default()
    };
    let mut p = [packet(Hook::Input), packet(Hook::Output)];
    w.process_batch(&mut p, &mut [Verdict::Drop, Verdict::Drop], 0);
    let count = |e: &Engine, chain: &str| {
        e.counters()
            .iter()
            .find(|c| &*c.chain == chain && c.rule == Some(1))
            .map(|c| c.packets)
    };
    assert_eq!(count(&e, "INPUT"), Some(6));
    let active = e.rulesets()["t"].clone();
    let edited = vallum_engine::restore::parse_onto(
        &active.tables,
        "*filter\n-A INPUT -j DROP\nCOMMIT\n",
        &ParseOptions::default(),
    )
    .unwrap();
    let edited = Ruleset {
        tables: edited.tables,
        ..(*active).clone()
    };
    e.commit(Change::PutEdited(edited.clone()), &sets).unwrap();
    assert_eq!(
        (count(&e, "INPUT"), count(&e, "OUTPUT")),
        (Some(6), Some(1)),
        "PutEdited keeps the counts"
    );
    e.commit(Change::Put(edited), &sets).unwrap();
    assert_eq!(
        (count(&e, "INPUT"), count(&e, "OUTPUT")),
        (Some(5), Some(0)),
        "Put starts the model's counters"
    );
    let mut p = [packet(Hook::Output)];
    w.process_batch(&mut p, &mut [Verdict::Drop], 0);
    e.zero_counters_in(
        "t",
        Family::Ipv4,
        Some(TableKind::Filter),
        Some("INPUT"),
        Some(1),
    );
    assert_eq!(
        (count(&e, "INPUT"), count(&e, "OUTPUT")),
        (Some(0), Some(1))
    );
    e.zero_counters_in("t", Family::Ipv6, None, None, None);
    e.zero_counters_in("other", Family::Ipv4, None, None, None);
    assert_eq!(count(&e, "OUTPUT"), Some(1), "another family or ruleset");
    e.zero_counters_in(
        "t",
        Family::Ipv4,
        Some(TableKind::Filter),
        Some("OUTPUT"),
        None,
    );
    assert_eq!(count(&e, "OUTPUT"), Some(0));
}
