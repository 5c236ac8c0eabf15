//! Commit cost of the engine on ClassBench rulesets translated to iptables rules, with 2 idle
//! cores.
//!
//! Cases:
//! - `commit/acl1/<rules>`: a whole [`Engine::commit`] (validate, compile, publish, quiesce,
//!   carry) of the same ruleset again (every chain unchanged, so shared). After criterion's
//!   timing it prints the median of each phase over 50 commits, in microseconds.
//! - `update/<full|incremental>/acl1/<rules>`: a one-rule change (the middle rule of the
//!   chain replaced, alternately back and forth) compiled and published on a dataplane:
//!   `full` compiles the snapshot from scratch ([`Snapshot::compile_with`]), `incremental`
//!   from the active one ([`Snapshot::compile_after`]: unchanged chains shared, the changed
//!   chain spliced and its TupleMerge index updated, its RFC tables rebuilt where it has
//!   them). Both then publish (swap + barrier +
//!   quiesce) and carry the counters; the retired snapshot is dropped outside the timing.
//!   Sizes: acl1 1k and 10k (neurocuts) and 100k (generated; set `VALLUM_BENCH_100K=0` to skip).
//!   After the timing it prints the median split (compile / publish / carry) of 30 updates.
//!
//! Run: `cargo bench -p vallum-engine --bench commit`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use vallum_engine::dataplane::{BarrierStrategy, Dataplane, Retired};
use vallum_engine::engine::{Change, CommitReport, Engine, EngineConfig};
use vallum_engine::model::{Ruleset, Target};
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{Classifier, Snapshot};

#[path = "support/clock.rs"]
mod clock;
use clock::MonoClock;

#[path = "support/classbench.rs"]
mod classbench;

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1000.0
}

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

fn whole_commits(c: &mut Criterion, dir: &std::path::Path) {
    let mut group = c.benchmark_group("commit");
    group.sample_size(20);
    for set in ["acl1_1k", "acl1_10k"] {
        let text = std::fs::read_to_string(dir.join("neurocuts").join(set)).expect("read set");
        let filters = classbench::parse_filters(&text).expect("parse set");
        let rs = classbench::to_ruleset("acl1", &filters).expect("translate");
        let engine = engine();
        group.bench_function(format!("acl1/{}", filters.len()), |b| {
            b.iter(|| {
                engine
                    .commit(Change::Put(rs.clone()), &NoSets)
                    .expect("commit")
                    .report
            })
        });
        let reports: Vec<CommitReport> = (0..50)
            .map(|_| {
                engine
                    .commit(Change::Put(rs.clone()), &NoSets)
                    .expect("commit")
                    .report
            })
            .collect();
        let phase = |f: fn(&CommitReport) -> u64| median(reports.iter().map(f).collect());
        println!(
            "commit phases acl1 {} rules (median of 50, us): validate {:.1} compile {:.1} publish {:.1} quiesce {:.1} carry {:.1} | compile+publish+quiesce {:.1} | total {:.1}",
            filters.len(),
            phase(|r| r.validate_ns),
            phase(|r| r.compile_ns),
            phase(|r| r.publish_ns),
            phase(|r| r.quiesce_ns),
            phase(|r| r.carry_ns),
            phase(|r| r.compile_ns + r.publish_ns + r.quiesce_ns),
            phase(CommitReport::total_ns),
        );
    }
    group.finish();
}

/// The two rulesets a one-rule update alternates between: `a`, and `a` with the middle rule
/// of INPUT replaced by a DROP of another filter.
fn update_pair(filters: &[classbench::Filter]) -> [Arc<Ruleset>; 2] {
    let a = classbench::to_ruleset("acl1", filters).expect("translate");
    let mut b = a.clone();
    let rules = &mut b.tables[0].chains[0].rules;
    let mid = rules.len() / 2;
    rules[mid] = classbench::to_rule(&filters[mid / 2], Target::Drop).expect("translate");
    [Arc::new(a), Arc::new(b)]
}

/// One update: compile (full or incremental) `next`, publish it, carry counters. Returns the
/// retired snapshot (dropped by the caller, off the timing) and the phase times in ns.
fn update(
    dp: &Dataplane<Snapshot>,
    next: &Arc<Ruleset>,
    incremental: bool,
) -> (Retired<Snapshot>, [u64; 3]) {
    let list = std::slice::from_ref(next);
    let t0 = Instant::now();
    let snap = if incremental {
        dp.with_active(|prev| Snapshot::compile_after(prev, list, &NoSets, 2))
    } else {
        Snapshot::compile_with(list, &NoSets, 2, Classifier::default())
    }
    .expect("compile");
    let t1 = Instant::now();
    let (retired, _) = dp.commit(Box::new(snap));
    let t2 = Instant::now();
    dp.with_active(|s| s.carry_from(&retired));
    let t3 = Instant::now();
    let ns = |a: Instant, b: Instant| (b - a).as_nanos() as u64;
    (retired, [ns(t0, t1), ns(t1, t2), ns(t2, t3)])
}

fn updates(c: &mut Criterion, dir: &std::path::Path) {
    let mut sets: Vec<(String, Vec<classbench::Filter>)> = Vec::new();
    // 1k: the chain has RFC tables, which a commit rebuilds.
    let text = std::fs::read_to_string(dir.join("neurocuts/acl1_1k")).expect("read acl1_1k");
    sets.push((
        "acl1".into(),
        classbench::parse_filters(&text).expect("parse"),
    ));
    let text = std::fs::read_to_string(dir.join("neurocuts/acl1_10k")).expect("read acl1_10k");
    sets.push((
        "acl1".into(),
        classbench::parse_filters(&text).expect("parse"),
    ));
    if std::env::var("VALLUM_BENCH_100K").as_deref() != Ok("0") {
        match classbench::read_gz(&dir.join("generated/acl1_100k.gz")) {
            Some(text) => sets.push((
                "acl1".into(),
                classbench::parse_filters(&text).expect("parse"),
            )),
            None => eprintln!("NOT MEASURED acl1_100k: cannot gunzip generated/acl1_100k.gz"),
        }
    }
    let mut group = c.benchmark_group("update");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    let mut summary = Vec::new();
    for (name, filters) in &sets {
        let pair = update_pair(filters);
        for incremental in [false, true] {
            let variant = if incremental { "incremental" } else { "full" };
            let first =
                Snapshot::compile(std::slice::from_ref(&pair[0]), &NoSets, 2).expect("compile");
            let dp = Dataplane::new(
                first,
                2,
                BarrierStrategy::SeqCst,
                Arc::new(MonoClock(Instant::now())),
            );
            let mut turn = 0usize;
            let id = BenchmarkId::new(variant, format!("{name}/{}", filters.len()));
            group.bench_function(id, |b| {
                b.iter_with_large_drop(|| {
                    turn += 1;
                    update(&dp, &pair[turn % 2], incremental).0
                })
            });
            let phases: Vec<[u64; 3]> = (0..30)
                .map(|_| {
                    turn += 1;
                    let (retired, t) = update(&dp, &pair[turn % 2], incremental);
                    drop(retired);
                    t
                })
                .collect();
            let p = |i: usize| median(phases.iter().map(|t| t[i]).collect());
            summary.push(format!(
                "update {variant} {name} {} rules (median of 30, us): compile {:.1} publish+quiesce {:.1} carry {:.1} | compile+publish {:.1}",
                filters.len(),
                p(0),
                p(1),
                p(2),
                median(phases.iter().map(|t| t[0] + t[1]).collect()),
            ));
        }
    }
    group.finish();
    for line in summary {
        println!("{line}");
    }
}

fn bench(c: &mut Criterion) {
    let Some(dir) = classbench::data_dir() else {
        panic!(
            "commit bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)"
        );
    };
    updates(c, &dir);
    whole_commits(c, &dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
