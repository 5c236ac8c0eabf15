//! Whole-commit cost of the engine: validate + compile + publish + quiesce + carry for ClassBench
//! rulesets translated to iptables rules (acl1 1k and 10k from neurocuts), with 2 idle cores.
//! Each iteration commits the same ruleset again (so every counter slot is carried).
//!
//! Cases: `commit/acl1/<rules>`. After criterion's timing it prints the median of each phase
//! over 50 commits, in microseconds, for BENCHMARKS.md.
//!
//! Run: `cargo bench -p vallum-engine --bench commit`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use vallum_engine::Clock;
use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, CommitReport, Engine, EngineConfig};
use vallum_engine::sets::NoSets;

#[path = "support/classbench.rs"]
mod classbench;

struct MonoClock(Instant);

impl Clock for MonoClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1000.0
}

fn bench(c: &mut Criterion) {
    let Some(dir) = classbench::data_dir() else {
        eprintln!("SKIP commit bench: ../shared/data/classbench not found");
        return;
    };
    let mut group = c.benchmark_group("commit");
    group.sample_size(20);
    for set in ["acl1_1k", "acl1_10k"] {
        let text = std::fs::read_to_string(dir.join("neurocuts").join(set)).expect("read set");
        let filters = classbench::parse_filters(&text).expect("parse set");
        let rs = classbench::to_ruleset("acl1", &filters).expect("translate");
        let engine = Engine::new(
            EngineConfig {
                cores: 2,
                barrier: BarrierStrategy::SeqCst,
                conntrack: None,
            },
            Arc::new(MonoClock(Instant::now())),
        );
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

criterion_group!(benches, bench);
criterion_main!(benches);
