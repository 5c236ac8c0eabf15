//! The classification anchor: our default classifier against DPDK's rte_acl on the same rules
//! and the same headers, in the same run, one core each.
//!
//! Cases: NeuroCuts' ClassBench sets acl1, fw1, ipc1 at 1k and 10k, and the generated 100k
//! sets (`VALLUM_SHARED_DATA/classbench`, see its SOURCES.md); per set, 10,000 headers sampled
//! from the rules with the classify bench's sampler (`support/classbench.rs`, seed 7).
//!
//! - **rte_acl**: the rules and headers are written in `dpdk-test-acl`'s ClassBench format to a
//!   temporary directory and classified by `dpdk-test-acl --verbose=0` (Debian's `dpdk-dev`), once
//!   per algorithm (`avx512x16`, `avx2`, `sse`, when the CPU has them) in the first round and
//!   with the fastest of them afterwards; its reported packets/s.
//! - **ours**: `Snapshot::classify_batch` with the default classifier (TupleMerge + RFC tables)
//!   on batches of `CLASSIFY_BATCH`, every header copied into the batch buffer first, as the
//!   classify bench's `rfc-batch` case does.
//!
//! The two sides alternate `VALLUM_ANCHOR_ROUNDS` times (default 5) and each keeps its best
//! round, so a loaded machine slows both alike. Printed: one table row per set with both rates
//! (Mpps), rte_acl's cycles/packet, the ratio ours / rte_acl and the best rte_acl algorithm.
//! Every sampled header matches its own rule, and every rule accepts: our side asserts that
//! no header was dropped.
//!
//! `VALLUM_BENCH_100K=0` skips the 100k sets. Fails with the reason when `dpdk-test-acl` or
//! the data set is missing (nothing measured).
//!
//! Run: `cargo bench -p vallum-engine --bench acl_anchor`

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use vallum_engine::conntrack::NoTracking;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::{CLASSIFY_BATCH, Snapshot, Verdict};

#[path = "support/classbench.rs"]
mod classbench;

/// Headers per set (as the classify bench and the table).
const HEADERS: usize = 10_000;
/// Passes over the headers per timed round, both sides.
const ITER: usize = 20;

fn main() {
    let Some(dir) = classbench::data_dir() else {
        panic!("acl_anchor not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)");
    };
    if Command::new("dpdk-test-acl")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("acl_anchor not run: dpdk-test-acl not found (Debian package dpdk-dev)");
    }
    let rounds: usize = std::env::var("VALLUM_ANCHOR_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let algs = algorithms();
    let tmp = std::env::temp_dir().join(format!("vallum-acl-anchor-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");

    println!(
        "# acl_anchor: {HEADERS} headers sampled from the rules (seed 7), best of {rounds} rounds, rte_acl best of {algs:?}"
    );
    println!("| set | rules | ours Mpps | rte_acl Mpps | rte_acl cycles/pkt | ratio | rte alg |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    let mut sizes = vec!["1k", "10k"];
    if std::env::var("VALLUM_BENCH_100K").as_deref() != Ok("0") {
        sizes.push("100k");
    }
    for size in sizes {
        for set in ["acl1", "fw1", "ipc1"] {
            let text = if size == "100k" {
                let path = dir.join(format!("generated/{set}_100k.gz"));
                match classbench::read_gz(&path) {
                    Some(t) => t,
                    None => {
                        eprintln!("NOT MEASURED {set}_100k: cannot gunzip {}", path.display());
                        continue;
                    }
                }
            } else {
                std::fs::read_to_string(dir.join(format!("neurocuts/{set}_{size}")))
                    .expect("read neurocuts set")
            };
            let filters = classbench::parse_filters(&text).expect("parse filters");
            let headers = classbench::sample_headers(&filters, HEADERS, 7);
            let rules_path = tmp.join(format!("{set}_{size}.rules"));
            let trace_path = tmp.join(format!("{set}_{size}.trace"));
            std::fs::write(&rules_path, rte_rules(&filters)).expect("write rules");
            std::fs::write(&trace_path, rte_trace(&headers)).expect("write trace");

            let ruleset = Arc::new(classbench::to_ruleset(set, &filters).expect("translate"));
            let snap =
                Snapshot::compile(std::slice::from_ref(&ruleset), &NoSets, 1).expect("compile");
            let packets: Vec<_> = headers.iter().map(classbench::to_packet).collect();

            let mut ours_best = 0f64;
            let mut rte_best: Option<Rte> = None;
            for round in 0..rounds {
                ours_best = ours_best.max(ours_mpps(&snap, &packets));
                // Every algorithm in the first round, then the fastest one (a 100k context
                // takes rte_acl seconds to build per run).
                let algs = match (&rte_best, round) {
                    (Some(b), 1..) => vec![b.alg],
                    _ => algs.clone(),
                };
                for alg in algs {
                    let r = run_rte(&rules_path, &trace_path, filters.len(), alg);
                    if rte_best.as_ref().is_none_or(|b| r.mpps > b.mpps) {
                        rte_best = Some(r);
                    }
                }
            }
            let rte = rte_best.expect("at least one algorithm");
            println!(
                "| {set} | {} | {ours_best:.1} | {:.1} | {:.1} | {:.2}x | {} |",
                filters.len(),
                rte.mpps,
                rte.cycles,
                ours_best / rte.mpps,
                rte.alg
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Million packets per second of one timed round: `ITER` passes over `packets`.
fn ours_mpps(snap: &Snapshot, packets: &[vallum_engine::packet::PacketMeta]) -> f64 {
    let mut buf = Vec::with_capacity(CLASSIFY_BATCH);
    // No facts: the ClassBench rules read none.
    let mut facts = vec![vallum_engine::packet::PacketFacts::default(); CLASSIFY_BATCH];
    let mut verdicts = vec![Verdict::Drop; CLASSIFY_BATCH];
    let mut logs = Vec::new();
    let mut accepted = 0usize;
    let start = Instant::now();
    for _ in 0..ITER {
        for chunk in packets.chunks(CLASSIFY_BATCH) {
            buf.clear();
            buf.extend_from_slice(chunk);
            let n = snap.classify_batch(
                0,
                &mut buf,
                &mut facts,
                &mut verdicts,
                0,
                &mut logs,
                &[],
                &mut NoTracking,
            );
            accepted += verdicts[..n]
                .iter()
                .filter(|&&v| v == Verdict::Accept)
                .count();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Every sampled header matches the rule it was drawn from, and every rule accepts.
    assert_eq!(
        accepted,
        ITER * packets.len(),
        "a sampled header was dropped"
    );
    (ITER * packets.len()) as f64 / secs / 1e6
}

/// One `dpdk-test-acl` result.
struct Rte {
    alg: &'static str,
    mpps: f64,
    cycles: f64,
}

/// The rte_acl algorithms this CPU can run, fastest first.
fn algorithms() -> Vec<&'static str> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut algs = Vec::new();
    if cpu.contains("avx512bw") {
        algs.push("avx512x16");
    }
    if cpu.contains("avx2") {
        algs.push("avx2");
    }
    algs.push("sse");
    algs
}

/// Runs `dpdk-test-acl` on the files (no hugepages, no PCI, a private runtime directory so
/// concurrent runs do not share one) and parses its `search_ip5tuples` line.
fn run_rte(rules: &Path, trace: &Path, n_rules: usize, alg: &'static str) -> Rte {
    let prefix = format!("vallum-anchor-{}", std::process::id());
    let out = Command::new("dpdk-test-acl")
        .args([
            "--no-huge",
            "--no-pci",
            "-m",
            "1024",
            "--lcores",
            "0@(0-1)",
            "--log-level=lib.eal:error",
        ])
        .arg(format!("--file-prefix={prefix}"))
        .arg("--")
        .arg(format!("--rulesf={}", rules.display()))
        .arg(format!("--tracef={}", trace.display()))
        .arg(format!("--rulenum={}", n_rules + 1))
        .arg(format!("--tracenum={HEADERS}"))
        .arg(format!("--iter={ITER}"))
        .arg(format!("--alg={alg}"))
        .arg("--verbose=0")
        .output()
        .expect("run dpdk-test-acl");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("search_ip5tuples"))
        .unwrap_or_else(|| {
            panic!(
                "dpdk-test-acl --alg={alg}: no result line\nstdout:\n{text}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    // "... 5291318 cycles (0.00 sec), 52.91 cycles/pkt, 39687654.38 pkt/sec"
    let num_before = |unit: &str| -> f64 {
        let end = line.find(unit).expect("unit in result line");
        let start = line[..end].trim_end().rfind(' ').map_or(0, |i| i + 1);
        line[start..end]
            .trim()
            .parse()
            .expect("number in result line")
    };
    Rte {
        alg,
        mpps: num_before(" pkt/sec") / 1e6,
        cycles: num_before(" cycles/pkt"),
    }
}

fn ip(a: u32) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::from(a)
}

/// The filters in ClassBench's rule format as `dpdk-test-acl` reads it (first line = highest
/// priority, the same order our chain walks).
fn rte_rules(filters: &[classbench::Filter]) -> String {
    let mut s = String::new();
    for f in filters {
        let (proto, mask) = f.proto.map_or((0, 0), |p| (p, 0xff));
        writeln!(
            s,
            "@{}/{}\t{}/{}\t{} : {}\t{} : {}\t0x{proto:02x}/0x{mask:02x}",
            ip(f.src.0),
            f.src.1,
            ip(f.dst.0),
            f.dst.1,
            f.sport.0,
            f.sport.1,
            f.dport.0,
            f.dport.1
        )
        .expect("write to String");
    }
    s
}

/// The headers as `dpdk-test-acl`'s trace: `SRC DST SPORT DPORT PROTO`, numbers in decimal.
fn rte_trace(headers: &[classbench::Header]) -> String {
    let mut s = String::new();
    for h in headers {
        writeln!(s, "{} {} {} {} {}", h.src, h.dst, h.sport, h.dport, h.proto)
            .expect("write to String");
    }
    s
}
