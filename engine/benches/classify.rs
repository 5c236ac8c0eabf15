//! Linear classification throughput on ClassBench sets (one core, no dataplane barrier).
//!
//! Cases (`classify/linear/<set>/<rules>`), each classifying every header of the matching
//! trace once per iteration (throughput reported in packets/s):
//! - acl_1k truncated to 10 and 100 rules, and whole (~1k), with acl_1k_trace;
//! - fw_10k (~10k rules) with the first 2000 headers of fw_10k_trace.
//!
//! Skips with a printed reason when ../shared/data/classbench is absent.
//!
//! Run: `cargo bench -p vallum-engine --bench classify`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use vallum_engine::compile::Snapshot;
use vallum_engine::sets::NoSets;

#[path = "support/classbench.rs"]
mod classbench;

fn bench(c: &mut Criterion) {
    let Some(dir) = classbench::data_dir() else {
        eprintln!("SKIP classify bench: ../shared/data/classbench not found");
        return;
    };
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).expect("read classbench file");
    let acl = classbench::parse_filters(&read("cutsplit/acl_1k")).expect("acl_1k");
    let acl_trace = classbench::parse_trace(&read("cutsplit/acl_1k_trace")).expect("acl trace");
    let fw = classbench::parse_filters(&read("cutsplit/fw_10k")).expect("fw_10k");
    let fw_trace = classbench::parse_trace(&read("cutsplit/fw_10k_trace")).expect("fw trace");

    let cases: Vec<(&str, &[classbench::Filter], &[classbench::Header])> = vec![
        ("acl1", &acl[..10], &acl_trace),
        ("acl1", &acl[..100], &acl_trace),
        ("acl1", &acl[..], &acl_trace),
        ("fw1", &fw[..], &fw_trace[..fw_trace.len().min(2000)]),
    ];
    let mut group = c.benchmark_group("classify/linear");
    for (set, filters, trace) in cases {
        let rs = classbench::to_ruleset(set, filters).expect("translate");
        let snap = Snapshot::compile(&[Arc::new(rs)], &NoSets, 1).expect("compile");
        let packets: Vec<_> = trace.iter().map(classbench::to_packet).collect();
        group.throughput(Throughput::Elements(packets.len() as u64));
        group.sample_size(if filters.len() > 5000 { 10 } else { 50 });
        let mut logs = Vec::new();
        group.bench_function(format!("{set}/{}", filters.len()), |b| {
            b.iter(|| {
                let mut accepted = 0u32;
                for p in &packets {
                    let mut p = *p;
                    if snap.classify(0, &mut p, 0, &mut logs)
                        == vallum_engine::compile::Verdict::Accept
                    {
                        accepted += 1;
                    }
                }
                accepted
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
