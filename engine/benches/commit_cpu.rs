//! What one-rule commits cost the committing thread, by phase: the acl1 ruleset (one
//! filter/INPUT chain) with its middle rule replaced, back and forth, on an idle 2-core engine,
//! as the pipeline bench's committer does, two ways:
//! - `put`: [`Engine::commit`]`(Change::Put(ruleset))` of a whole ruleset built from a plain
//!   `Vec` of rules (its own memory, as a parse makes it; nothing shared with the active one);
//! - `put/sh`: [`Engine::commit`]`(Change::Put(ruleset))` of the active ruleset cloned with the
//!   one rule replaced, so that it shares every other rule chunk with the active one
//!   (`model::RuleList`): what vallumd's Apply commits when its incremental re-parse
//!   (`restore::parse_after`) took the new text;
//! - `edit`: [`Engine::commit`]`(Change::Edit { .. })` replacing the one rule (`iptables -R`);
//! - `ins/del`: [`Engine::commit`]`(Change::Edit { .. })` inserting a rule before the middle
//!   one, then deleting it again (`iptables -I` / `-D N`): every rule after it moves.
//!
//! Per commit: the caller's part (`put`: building the ruleset from a copy of the rules, a
//! stand-in for a parse; `edit`: the edit), the report's validate / compile / publish+quiesce /
//! carry, and dropping the retired snapshot (with the previous model); the last column is the
//! thread's CPU time for all of it. Prints the median over `N` commits (default 20) for acl1
//! 10k and, with `VALLUM_BENCH_100K=1`, the generated acl1 100k, in microseconds.
//!
//! Run: `cargo bench -p vallum-engine --bench commit_cpu` (prints a line per set; no criterion).
#![allow(missing_docs)]
use std::sync::Arc;
use std::time::Instant;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::{EditOp, Family, Rule, RuleEdit, Ruleset, TableKind, Target};
use vallum_engine::sets::NoSets;

#[path = "support/clock.rs"]
mod clock;
use clock::{MonoClock, thread_cpu_ns};

#[path = "support/classbench.rs"]
mod classbench;

fn med(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1e3
}
fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let Some(dir) = classbench::data_dir() else {
        panic!(
            "commit_cpu bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)"
        );
    };
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut sets =
        vec![std::fs::read_to_string(dir.join("neurocuts/acl1_10k")).expect("read acl1_10k")];
    if std::env::var("VALLUM_BENCH_100K").as_deref() == Ok("1") {
        match classbench::read_gz(&dir.join("generated/acl1_100k.gz")) {
            Some(t) => sets.push(t),
            None => eprintln!("NOT MEASURED acl1_100k: cannot gunzip"),
        }
    }
    for text in sets {
        run(&text, n);
    }
}

/// How the committer hands over the changed ruleset.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Put,
    PutShared,
    Edit,
    InsertDelete,
}

fn run(text: &str, n: usize) {
    let filters = classbench::parse_filters(text).unwrap();
    let a = classbench::to_ruleset("acl1", &filters).unwrap();
    let flat = a.tables[0].chains[0].rules.to_vec();
    let mid = flat.len() / 2;
    let changed = classbench::to_rule(&filters[mid / 2], Target::Drop).unwrap();
    let mids = [flat[mid].clone(), changed];
    for mode in [Mode::Put, Mode::PutShared, Mode::Edit, Mode::InsertDelete] {
        run_mode(&a, &flat, &mids, mode, n);
    }
}

/// `a` with its INPUT rules from a fresh copy of `flat` whose rule `mid` is `rule`.
fn whole(a: &Ruleset, flat: &[Rule], mid: usize, rule: &Rule) -> Ruleset {
    let mut rs = Ruleset {
        tables: Vec::new(),
        ..a.clone()
    };
    let mut t = a.tables[0].clone();
    let mut rules = flat.to_vec();
    rules[mid] = rule.clone();
    t.chains[0].rules = rules.into();
    rs.tables.push(t);
    rs
}

fn run_mode(a: &Ruleset, flat: &[Rule], mids: &[Rule; 2], mode: Mode, n: usize) {
    let mid = flat.len() / 2;
    let engine = Engine::new(
        EngineConfig {
            cores: 2,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(MonoClock(Instant::now())),
    );
    engine
        .commit(Change::Put(whole(a, flat, mid, &mids[0])), &NoSets)
        .unwrap();
    let (mut cl, mut va, mut co, mut pu, mut ca, mut dr, mut tot) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let rule = &mids[(i + 1) % 2];
        let c0 = thread_cpu_ns();
        let edit = |op| Change::Edit {
            ruleset: a.name.clone(),
            edits: vec![RuleEdit {
                family: Family::Ipv4,
                table: TableKind::Filter,
                chain: "INPUT".into(),
                number: mid as u32 + 1,
                op,
            }],
        };
        let change = match mode {
            Mode::Put => Change::Put(whole(a, flat, mid, rule)),
            Mode::PutShared => {
                let mut rs = (*engine.rulesets()[&a.name]).clone();
                rs.tables[0].chains[0].rules.set(mid, rule.clone());
                Change::Put(rs)
            }
            Mode::Edit => edit(EditOp::Replace(rule.clone())),
            Mode::InsertDelete if i % 2 == 0 => edit(EditOp::Insert(mids[1].clone())),
            Mode::InsertDelete => edit(EditOp::Delete),
        };
        let c1 = thread_cpu_ns();
        let done = engine.commit(change, &NoSets).unwrap();
        let c2 = thread_cpu_ns();
        drop(done.retired);
        let c3 = thread_cpu_ns();
        cl.push(c1 - c0);
        va.push(done.report.validate_ns);
        co.push(done.report.compile_ns);
        pu.push(done.report.publish_ns + done.report.quiesce_ns);
        ca.push(done.report.carry_ns);
        dr.push(c3 - c2);
        tot.push(c3 - c0);
    }
    println!(
        "{} rules, {}, median of {n} (us): {} {:.0} validate {:.0} compile {:.0} publish {:.1} carry {:.0} drop {:.0} | CPU total {:.0}",
        flat.len(),
        match mode {
            Mode::Put => "put    ",
            Mode::PutShared => "put/sh ",
            Mode::Edit => "edit   ",
            Mode::InsertDelete => "ins/del",
        },
        match mode {
            Mode::Put => "build",
            Mode::PutShared => "clone",
            _ => "edit",
        },
        med(cl),
        med(va),
        med(co),
        med(pu),
        med(ca),
        med(dr),
        med(tot)
    );
}
