//! Classification throughput on ClassBench sets (one core, no dataplane barrier): the linear
//! walk (the reference), the TupleMerge index packet by packet, the TupleMerge index with
//! batched probes, and TupleMerge with RFC tables for chains of `RFC_MIN_RULES` to
//! `RFC_MAX_RULES` rules (the default classifier), with and without batches, side by side, in
//! the same run.
//!
//! Cases:
//! - `classify/<linear|tuplemerge|tuplemerge-batch|rfc|rfc-batch>/<set>/<rules>`: every header
//!   of the case classified once per iteration (throughput in packets/s); `linear`,
//!   `tuplemerge` and `rfc` call `Snapshot::classify_batch` with one packet at a time, the `-batch` cases call
//!   `Snapshot::classify_batch` on
//!   batches of 64 (as `EngineWorker::process_batch` does). Each packet is copied once in all
//!   three (into the batch buffer, or into a local). Sets: CutSplit acl_1k (whole and cut to 10 and
//!   100 rules) and fw_10k with their traces (fw_10k: the first 2000 headers); NeuroCuts
//!   acl1, fw1, ipc1 at 1k and 10k, and the generated 100k sets, with 10,000 headers sampled
//!   from the rules (no trace exists for them).
//! - `cold/<plain|tcp-option|iface>/acl1/<rules>`: the batched path (`rfc-batch`) on acl1 at
//!   1k and 10k as it is (`plain`), and with one rule put first that reads a packet fact
//!   (`vallum_engine::packet::PacketFacts`): `-p tcp -m tcp --tcp-option 2 -j DROP` or
//!   `-i eth9 -j DROP` (the packets come in on eth0, so neither rule matches and every packet
//!   goes on to the acl rules). What a ruleset pays for the facts beside the batch.
//! - `build/<linear|tuplemerge|rfc>/<set>/<rules>`: `Snapshot::compile_with` of the whole set.
//! - Printed to stderr, not timed by criterion: index tables and bytes per rule (without and
//!   with RFC tables).
//!
//! Set `VALLUM_BENCH_100K=0` to skip the 100k sets (their linear case is slow). Fails with the
//! reason when ../shared/data/classbench is absent (nothing measured).
//!
//! Run: `cargo bench -p vallum-engine --bench classify`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use vallum_engine::conntrack::NoTracking;
use vallum_engine::model::Ruleset;
use vallum_engine::packet::{IfName, PacketFacts, PacketMeta};
use vallum_engine::restore;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{CLASSIFY_BATCH, Classifier, LogEvent, Snapshot, Verdict};

#[path = "support/classbench.rs"]
mod classbench;

const VARIANTS: [(&str, Classifier); 3] = [
    ("linear", Classifier::Linear),
    (
        "tuplemerge",
        Classifier::TupleMerge {
            min_rules: 16,
            batch_min_bytes: vallum_engine::snapshot::PROBE_MIN_BYTES,
            rfc_min_rules: 0,
            rfc_max_rules: 0,
        },
    ),
    (
        "rfc",
        Classifier::TupleMerge {
            min_rules: 16,
            batch_min_bytes: vallum_engine::snapshot::PROBE_MIN_BYTES,
            rfc_min_rules: vallum_engine::snapshot::RFC_MIN_RULES,
            rfc_max_rules: vallum_engine::snapshot::RFC_MAX_RULES,
        },
    ),
];

struct Case {
    set: String,
    ruleset: Arc<Ruleset>,
    rules: usize,
    headers: Vec<classbench::Header>,
}

fn cases() -> Option<Vec<Case>> {
    let Some(dir) = classbench::data_dir() else {
        panic!(
            "classify bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)"
        );
    };
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).expect("read classbench file");
    let mut out = Vec::new();
    let mut push = |set: &str, filters: &[classbench::Filter], headers: Vec<classbench::Header>| {
        let rs = classbench::to_ruleset(set, filters).expect("translate");
        out.push(Case {
            set: set.to_string(),
            ruleset: Arc::new(rs),
            rules: filters.len(),
            headers,
        });
    };
    let acl = classbench::parse_filters(&read("cutsplit/acl_1k")).expect("acl_1k");
    let acl_trace = classbench::parse_trace(&read("cutsplit/acl_1k_trace")).expect("acl trace");
    for n in [10, 100, acl.len()] {
        push("cs-acl", &acl[..n], acl_trace.clone());
    }
    let fw = classbench::parse_filters(&read("cutsplit/fw_10k")).expect("fw_10k");
    let fw_trace = classbench::parse_trace(&read("cutsplit/fw_10k_trace")).expect("fw trace");
    push("cs-fw", &fw, fw_trace[..fw_trace.len().min(2000)].to_vec());
    for size in ["1k", "10k"] {
        for set in ["acl1", "fw1", "ipc1"] {
            let f = classbench::parse_filters(&read(&format!("neurocuts/{set}_{size}")))
                .expect("neurocuts set");
            let h = classbench::sample_headers(&f, 10_000, 7);
            push(set, &f, h);
        }
    }
    if std::env::var("VALLUM_BENCH_100K").as_deref() != Ok("0") {
        for set in ["acl1", "fw1", "ipc1"] {
            let path = dir.join(format!("generated/{set}_100k.gz"));
            let Some(text) = classbench::read_gz(&path) else {
                eprintln!("NOT MEASURED {set}_100k: cannot gunzip {}", path.display());
                continue;
            };
            let f = classbench::parse_filters(&text).expect("generated set");
            let h = classbench::sample_headers(&f, 10_000, 7);
            push(set, &f, h);
        }
    }
    Some(out)
}

fn bench(c: &mut Criterion) {
    let Some(cases) = cases() else {
        return;
    };
    eprintln!("set rules tables rule_bytes/rule index_bytes/rule rfc_chains index_bytes/rule(rfc)");
    for case in &cases {
        let compile = |c| {
            Snapshot::compile_with(std::slice::from_ref(&case.ruleset), &NoSets, 1, c)
                .expect("compile")
                .memory_bytes()
        };
        let (m, r) = (compile(VARIANTS[1].1), compile(VARIANTS[2].1));
        eprintln!(
            "{} {} {} {:.1} {:.1} {} {:.1}",
            case.set,
            case.rules,
            m.tables,
            m.rules as f64 / case.rules as f64,
            m.index as f64 / case.rules as f64,
            r.rfc_chains,
            r.index as f64 / case.rules as f64
        );
    }

    let mut group = c.benchmark_group("classify");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    group.sample_size(10);
    for case in &cases {
        let packets: Vec<_> = case.headers.iter().map(classbench::to_packet).collect();
        group.throughput(Throughput::Elements(packets.len() as u64));
        for (name, classifier) in VARIANTS {
            let snap =
                Snapshot::compile_with(std::slice::from_ref(&case.ruleset), &NoSets, 1, classifier)
                    .expect("compile");
            let mut logs = Vec::new();
            let id = BenchmarkId::new(name, format!("{}/{}", case.set, case.rules));
            group.bench_function(id, |b| {
                b.iter(|| {
                    let mut accepted = 0u32;
                    let mut v = [Verdict::Drop];
                    for p in &packets {
                        let mut p = [*p];
                        let none = &mut [];
                        snap.classify_batch(
                            0,
                            &mut p,
                            none,
                            &mut v,
                            0,
                            &mut logs,
                            &[],
                            &mut NoTracking,
                        );
                        if v[0] == Verdict::Accept {
                            accepted += 1;
                        }
                    }
                    accepted
                })
            });
            if classifier == Classifier::Linear {
                continue;
            }
            let id = BenchmarkId::new(
                format!("{name}-batch"),
                format!("{}/{}", case.set, case.rules),
            );
            let mut buf = Vec::with_capacity(CLASSIFY_BATCH);
            let mut facts = vec![eth0(); CLASSIFY_BATCH];
            let mut verdicts = vec![Verdict::Drop; CLASSIFY_BATCH];
            group.bench_function(id, |b| {
                b.iter(|| {
                    accepted_batched(
                        &snap,
                        &packets,
                        &mut buf,
                        &mut facts,
                        &mut verdicts,
                        &mut logs,
                    )
                })
            });
        }
    }
    group.finish();

    cold(c, &cases);

    let mut group = c.benchmark_group("build");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    group.sample_size(10);
    for case in cases.iter().filter(|c| c.rules >= 500) {
        for (name, classifier) in VARIANTS {
            let id = BenchmarkId::new(name, format!("{}/{}", case.set, case.rules));
            group.bench_function(id, |b| {
                b.iter(|| {
                    Snapshot::compile_with(
                        std::slice::from_ref(&case.ruleset),
                        &NoSets,
                        1,
                        classifier,
                    )
                    .expect("compile")
                })
            });
        }
    }
    group.finish();
}

/// The facts of every benchmarked packet: it came in on eth0 (as the NFQUEUE source fills
/// them; the batch cases keep them beside the batch, written once, as a source's parse does).
fn eth0() -> PacketFacts {
    PacketFacts {
        in_iface: IfName::new("eth0").expect("short name"),
        ..PacketFacts::default()
    }
}

/// The rule the `cold` cases put first: none, or one that reads a packet fact.
const COLD_RULES: [(&str, Option<&str>); 3] = [
    ("plain", None),
    ("tcp-option", Some("-p tcp -m tcp --tcp-option 2 -j DROP")),
    ("iface", Some("-i eth9 -j DROP")),
];

/// The `cold` group (module docs).
fn cold(c: &mut Criterion, cases: &[Case]) {
    let mut group = c.benchmark_group("cold");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    group.sample_size(10);
    for case in cases
        .iter()
        .filter(|c| c.set == "acl1" && c.rules <= 10_000)
    {
        let packets: Vec<_> = case.headers.iter().map(classbench::to_packet).collect();
        group.throughput(Throughput::Elements(packets.len() as u64));
        for (name, rule) in COLD_RULES {
            let mut ruleset = (*case.ruleset).clone();
            if let Some(rule) = rule {
                let text = format!("*filter\n:INPUT DROP [0:0]\n-A INPUT {rule}\nCOMMIT\n");
                let one = restore::parse_ruleset("one", &text, &restore::ParseOptions::default())
                    .expect("the cold rule parses");
                let first = one.tables[0].chains[0].rules[0].clone();
                ruleset.tables[0].chains[0].rules.insert(0, first);
            }
            let snap = Snapshot::compile_with(&[Arc::new(ruleset)], &NoSets, 1, VARIANTS[2].1)
                .expect("compile");
            let mut logs = Vec::new();
            let mut buf = Vec::with_capacity(CLASSIFY_BATCH);
            let mut facts = vec![eth0(); CLASSIFY_BATCH];
            let mut verdicts = vec![Verdict::Drop; CLASSIFY_BATCH];
            let id = BenchmarkId::new(name, format!("{}/{}", case.set, case.rules));
            group.bench_function(id, |b| {
                b.iter(|| {
                    accepted_batched(
                        &snap,
                        &packets,
                        &mut buf,
                        &mut facts,
                        &mut verdicts,
                        &mut logs,
                    )
                })
            });
        }
    }
    group.finish();
}

/// The batched path as a source drives it: `packets` copied into the batch buffer
/// `CLASSIFY_BATCH` at a time (facts beside them), classified; the number accepted.
fn accepted_batched(
    snap: &Snapshot,
    packets: &[PacketMeta],
    buf: &mut Vec<PacketMeta>,
    facts: &mut [PacketFacts],
    verdicts: &mut [Verdict],
    logs: &mut Vec<LogEvent>,
) -> u32 {
    let mut accepted = 0u32;
    for chunk in packets.chunks(CLASSIFY_BATCH) {
        buf.clear();
        buf.extend_from_slice(chunk);
        let n = snap.classify_batch(0, buf, facts, verdicts, 0, logs, &[], &mut NoTracking);
        accepted += verdicts[..n]
            .iter()
            .filter(|&&v| v == Verdict::Accept)
            .count() as u32;
    }
    accepted
}

criterion_group!(benches, bench);
criterion_main!(benches);
