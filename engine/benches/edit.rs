//! The engine's part of a one-rule change to a large ruleset, as vallumd runs it (issue #33
//! item 1): the text applied to the active model, then one commit (validate, compile,
//! publish, quiesce, carry) on an engine with 2 idle cores. ClassBench acl1 as one
//! filter/INPUT chain of ACCEPT rules: 1k and 10k (neurocuts) and 100k (generated; set
//! `VALLUM_BENCH_100K=0` to skip).
//!
//! Cases (each alternates a change and its undo, both timed):
//! - `edit/append/acl1/<rules>`: an EditRuleset / `iptables -A` as vallumd makes it:
//!   `restore::parse_onto` of `-A INPUT ...` onto the active model, then
//!   [`Change::PutEdited`]; undone by `-D INPUT <rulespec>` (a search of the chain by
//!   rulespec, as iptables does).
//! - `edit/insert/acl1/<rules>`: the same with `-I INPUT 1 ...`, undone by `-D INPUT 1`:
//!   every rule after the change moves one place.
//! - `apply/replace/acl1/<rules>`: an Apply of the whole canonical text with the middle rule's
//!   target changed (alternately back): `restore::parse_after_canonical` against the previous
//!   text and its model, then [`Change::Put`].
//! - `apply/insert/acl1/<rules>`: the same with a rule line added below the first rule (and
//!   removed again): the line of every rule below it moves.
//!
//! After criterion's timing each case prints the median of its two steps over 40 changes,
//! in microseconds.
//!
//! Run: `cargo bench -p vallum-engine --bench edit`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::{Family, Ruleset};
use vallum_engine::restore::{
    ParseOptions, PrintOptions, parse_after_canonical, parse_onto, parse_ruleset, print,
};
use vallum_engine::sets::NoSets;

#[path = "support/clock.rs"]
mod clock;
use clock::MonoClock;

#[path = "support/classbench.rs"]
mod classbench;

fn engine() -> Engine {
    Engine::new(
        EngineConfig {
            cores: 2,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(MonoClock(Instant::now())),
    )
}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1000.0
}

fn active(engine: &Engine) -> Arc<Ruleset> {
    engine.rulesets().get("acl1").cloned().expect("active")
}

/// One noflush text applied to the active model and committed: (parse ns, commit ns).
fn noflush(engine: &Engine, text: &str) -> (u64, u64) {
    let opts = ParseOptions {
        family: Family::Ipv4,
        noflush: true,
        ..ParseOptions::default()
    };
    let t0 = Instant::now();
    let old = active(engine);
    let r = parse_onto(&old.tables, text, &opts).expect("parses");
    let next = Ruleset {
        tables: r.tables,
        ..(*old).clone()
    };
    let t1 = Instant::now();
    let done = engine
        .commit(Change::PutEdited(next), &NoSets)
        .expect("commits");
    let t2 = Instant::now();
    // The retired snapshot is freed off the reply path in vallumd.
    drop(done);
    ((t1 - t0).as_nanos() as u64, (t2 - t1).as_nanos() as u64)
}

const RULE: &str = "-s 10.9.8.7/32 -p tcp -m tcp --dport 22 -j ACCEPT";

fn edits(c: &mut Criterion, name: &str, filters: &[classbench::Filter], summary: &mut Vec<String>) {
    let mut group = c.benchmark_group("edit");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(2));
    let n = filters.len();
    for (case, change, undo) in [
        (
            "append",
            format!("*filter\n-A INPUT {RULE}\nCOMMIT\n"),
            format!("*filter\n-D INPUT {RULE}\nCOMMIT\n"),
        ),
        (
            "insert",
            format!("*filter\n-I INPUT 1 {RULE}\nCOMMIT\n"),
            "*filter\n-D INPUT 1\nCOMMIT\n".to_string(),
        ),
    ] {
        let engine = engine();
        let rs = classbench::to_ruleset("acl1", filters).expect("translate");
        engine.commit(Change::Put(rs), &NoSets).expect("commit");
        let mut turn = 0usize;
        group.bench_function(BenchmarkId::new(case, format!("{name}/{n}")), |b| {
            b.iter(|| {
                turn += 1;
                noflush(&engine, if turn % 2 == 1 { &change } else { &undo })
            })
        });
        if turn % 2 == 1 {
            noflush(&engine, &undo);
        }
        let (mut p, mut k, mut up, mut uk) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..40 {
            let (a, b) = noflush(&engine, &change);
            p.push(a);
            k.push(b);
            let (a, b) = noflush(&engine, &undo);
            up.push(a);
            uk.push(b);
        }
        summary.push(format!(
            "edit {case} {name} {n} rules (median of 40, us): change: parse {:.1} commit {:.1} | undo: parse {:.1} commit {:.1}",
            median(p),
            median(k),
            median(up),
            median(uk)
        ));
    }
    group.finish();
}

fn applies(
    c: &mut Criterion,
    name: &str,
    filters: &[classbench::Filter],
    summary: &mut Vec<String>,
) {
    let rs = classbench::to_ruleset("acl1", filters).expect("translate");
    let a = print(&rs.tables, &PrintOptions::default());
    let lines: Vec<&str> = a.split_inclusive('\n').collect();
    let mid = lines.len() / 2;
    // The middle rule's target changed (no line moves), or a rule line added below the
    // first rule (every rule below it moves one line).
    let replaced: String = (lines.iter().enumerate())
        .map(|(i, l)| {
            if i == mid {
                l.replace("-j ACCEPT", "-j DROP")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_ne!(a, replaced, "the middle line is a rule");
    let first_rule = lines
        .iter()
        .position(|l| l.starts_with("-A "))
        .expect("a rule");
    let inserted: String = (lines.iter().enumerate())
        .flat_map(|(i, l)| {
            let extra = (i == first_rule).then(|| format!("-A INPUT {RULE}\n"));
            [Some(l.to_string()), extra].into_iter().flatten()
        })
        .collect();
    let opts = ParseOptions {
        family: Family::Ipv4,
        ..ParseOptions::default()
    };
    for (case, b) in [("replace", replaced), ("insert", inserted)] {
        let engine = engine();
        let first = parse_ruleset("acl1", &a, &opts).expect("parses");
        engine.commit(Change::Put(first), &NoSets).expect("commit");
        let texts = [a.clone(), b];
        let mut at = 0usize;
        let mut step = || {
            let next = 1 - at;
            let t0 = Instant::now();
            let old = active(&engine);
            let (tables, print) =
                parse_after_canonical(&texts[at], &old.tables, &texts[next], &opts)
                    .expect("a one-rule change parses incrementally");
            assert!(print.is_some(), "and its print is spliced");
            let t1 = Instant::now();
            let done = engine
                .commit(
                    Change::Put(Ruleset {
                        tables,
                        ..(*old).clone()
                    }),
                    &NoSets,
                )
                .expect("commits");
            let t2 = Instant::now();
            drop(done);
            at = next;
            ((t1 - t0).as_nanos() as u64, (t2 - t1).as_nanos() as u64)
        };
        let mut group = c.benchmark_group("apply");
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(2));
        group.bench_function(format!("{case}/{name}/{}", filters.len()), |bch| {
            bch.iter(&mut step)
        });
        group.finish();
        let (mut p, mut k) = (Vec::new(), Vec::new());
        for _ in 0..40 {
            let (a, b) = step();
            p.push(a);
            k.push(b);
        }
        summary.push(format!(
            "apply {case} {name} {} rules, one rule line (median of 40, us): parse {:.1} commit {:.1}",
            filters.len(),
            median(p),
            median(k)
        ));
    }
}

fn bench(c: &mut Criterion) {
    let Some(dir) = classbench::data_dir() else {
        panic!("edit bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)");
    };
    let mut sets: Vec<Vec<classbench::Filter>> = Vec::new();
    for set in ["acl1_1k", "acl1_10k"] {
        let text = std::fs::read_to_string(dir.join("neurocuts").join(set)).expect("read set");
        sets.push(classbench::parse_filters(&text).expect("parse"));
    }
    if std::env::var("VALLUM_BENCH_100K").as_deref() != Ok("0") {
        match classbench::read_gz(&dir.join("generated/acl1_100k.gz")) {
            Some(text) => sets.push(classbench::parse_filters(&text).expect("parse")),
            None => eprintln!("NOT MEASURED acl1_100k: cannot gunzip generated/acl1_100k.gz"),
        }
    }
    let mut summary = Vec::new();
    for filters in &sets {
        edits(c, "acl1", filters, &mut summary);
        applies(c, "acl1", filters, &mut summary);
    }
    for line in summary {
        println!("{line}");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
