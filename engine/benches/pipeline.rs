//! The end-to-end worker pipeline under commits: two worker threads (one per core) classify a
//! ClassBench trace through [`EngineWorker::process_batch`] (batches of 64 packets) while a
//! committer thread commits a changed ruleset (one rule replaced, back and forth) every
//! 100 ms, two ways (the `commit` column): `put` commits the whole ruleset
//! ([`Change::Put`]), built each time from a plain `Vec` of rules (its own memory, as a parse
//! makes it); `edit` commits only the replaced rule ([`Change::Edit`], as `iptables -R`). Rounds without and with commits alternate (so drift in machine load hits both
//! alike); the table gives packets per second over all workers for each, and the dip. The
//! machine has only the two cores the workers use, so the committer takes its CPU time from
//! them: the last column (the committer's CPU time, incl. dropping retired snapshots, over
//! the round's 2 core-seconds per second) is the part of the dip the commit work itself
//! explains; the rest is caches refilled after a publish and scheduling. The column after it
//! is the committer's median CPU time per commit (clone, commit, drop): the share alone
//! depends on how many commits a round completes. Each set also runs
//! with one worker, which leaves the committer a core of its own (the deployed shape: the
//! control plane does not share the workers' cores): that dip is what a commit costs the
//! packet path itself.
//!
//! Sets: acl1 10k (neurocuts) with 10,000 headers sampled from its rules; with
//! `VALLUM_BENCH_100K=1` also the generated acl1 100k. Conntrack is off (the classifier and the
//! commit protocol are what is measured). `VALLUM_PIPELINE_SECS` sets the length of a round
//! (default 2 s), `VALLUM_PIPELINE_ROUNDS` the number of rounds of each kind (default 3). The
//! `dip` column compares the mean rates of all rounds; `median pair dip` is the median over
//! each round with commits against the round without just before it, which a machine whose
//! load drifts (other jobs) moves less.
//!
//! Run: `cargo bench -p vallum-engine --bench pipeline` (prints a table; no criterion).

#![allow(missing_docs)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig};
use vallum_engine::model::{EditOp, Family, Rule, RuleEdit, Ruleset, TableKind, Target};
use vallum_engine::packet::PacketMeta;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;

#[path = "support/clock.rs"]
mod clock;
use clock::{MonoClock, thread_cpu_ns};

#[path = "support/classbench.rs"]
mod classbench;

const CORES: usize = 2;
const BATCH: usize = 64;
const COMMIT_EVERY: Duration = Duration::from_millis(100);

struct RoundResult {
    pps: f64,
    commits: usize,
    /// Median engine commit time (validate .. carry), us.
    commit_us: f64,
    /// CPU time the committer thread spent committing (and dropping retired snapshots), as a
    /// share of the two cores over the round: the dip it alone explains.
    commit_cpu_share: f64,
    /// The committer's CPU time per commit (clone, commit, drop), median, us.
    commit_cpu_us: f64,
}

/// The ruleset the committer alternates: a template, its INPUT rules, and the two versions of
/// the middle rule.
struct Alternating {
    template: Ruleset,
    flat: Vec<Rule>,
    mids: [Rule; 2],
}

impl Alternating {
    /// The whole ruleset with version `turn % 2` of the middle rule, its rules copied from a
    /// `Vec` (nothing shared with earlier versions).
    fn whole(&self, turn: usize) -> Ruleset {
        let mut rs = self.template.clone();
        let mut rules = self.flat.clone();
        let mid = rules.len() / 2;
        rules[mid] = self.mids[turn % 2].clone();
        rs.tables[0].chains[0].rules = rules.into();
        rs
    }

    /// The change to version `turn % 2`, as `put` or `edit`.
    fn change(&self, turn: usize, edit: bool) -> Change {
        if !edit {
            return Change::Put(self.whole(turn));
        }
        Change::Edit {
            ruleset: self.template.name.clone(),
            edits: vec![RuleEdit {
                family: Family::Ipv4,
                table: TableKind::Filter,
                chain: "INPUT".into(),
                number: (self.flat.len() / 2) as u32 + 1,
                op: EditOp::Replace(self.mids[turn % 2].clone()),
            }],
        }
    }
}

/// One round of `secs`: workers classify until told to stop; with `commits`, a committer
/// alternates between the two rulesets every 100 ms (by `Change::Edit` when `edit`).
fn round(
    engine: &Engine,
    workers: usize,
    packets: &[PacketMeta],
    alt: &Alternating,
    (commits, edit): (bool, bool),
    secs: f64,
) -> RoundResult {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let start = Barrier::new(workers + 1);
    let mut times = Vec::new();
    let mut cpu_ns = 0u64;
    let mut cpu_each = Vec::new();
    let elapsed = std::thread::scope(|s| {
        for core in 0..workers {
            let (stop, total, start) = (&stop, &total, &start);
            s.spawn(move || {
                let mut w = engine.worker(core).expect("worker");
                let mut buf = [PacketMeta::default(); BATCH];
                let mut verdicts = [Verdict::Accept; BATCH];
                // Each core starts at another place of the trace.
                let mut at = core * packets.len() / workers;
                let mut n = 0u64;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..16 {
                        for b in buf.iter_mut() {
                            *b = packets[at];
                            at = if at + 1 == packets.len() { 0 } else { at + 1 };
                        }
                        n += w.process_batch(&mut buf, &mut verdicts, 0) as u64;
                    }
                }
                total.fetch_add(n, Ordering::Relaxed);
            });
        }
        start.wait();
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs_f64(secs);
        let mut turn = 0usize;
        let mut next = t0 + COMMIT_EVERY;
        while Instant::now() < end {
            let now = Instant::now();
            if next > now {
                std::thread::sleep((next - now).min(end - now));
                continue;
            }
            next += COMMIT_EVERY;
            if commits {
                turn += 1;
                let c0 = thread_cpu_ns();
                let done = engine
                    .commit(alt.change(turn, edit), &NoSets)
                    .expect("commit");
                times.push(done.report.total_ns());
                // The retired snapshot is dropped here, on the committer thread.
                drop(done.retired);
                cpu_each.push(thread_cpu_ns() - c0);
                cpu_ns += thread_cpu_ns() - c0;
            }
        }
        stop.store(true, Ordering::Relaxed);
        t0.elapsed()
    });
    times.sort_unstable();
    cpu_each.sort_unstable();
    RoundResult {
        commit_cpu_us: cpu_each
            .get(cpu_each.len() / 2)
            .map_or(0.0, |&t| t as f64 / 1000.0),
        pps: total.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        commits: times.len(),
        commit_us: times
            .get(times.len() / 2)
            .map_or(0.0, |&t| t as f64 / 1000.0),
        commit_cpu_share: cpu_ns as f64 / (elapsed.as_secs_f64() * 1e9 * CORES as f64),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let Some(dir) = classbench::data_dir() else {
        panic!(
            "pipeline bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)"
        );
    };
    let secs: f64 = std::env::var("VALLUM_PIPELINE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let rounds: usize = std::env::var("VALLUM_PIPELINE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut sets = vec![(
        "acl1",
        std::fs::read_to_string(dir.join("neurocuts/acl1_10k")).expect("read acl1_10k"),
    )];
    if std::env::var("VALLUM_BENCH_100K").as_deref() == Ok("1") {
        match classbench::read_gz(&dir.join("generated/acl1_100k.gz")) {
            Some(t) => sets.push(("acl1", t)),
            None => eprintln!("NOT MEASURED acl1_100k: cannot gunzip"),
        }
    }
    println!(
        "| set | rules | workers | commit | without commits (Mpps) | with a commit every 100 ms (Mpps) | dip | median pair dip | commits | median commit wall (us) | committer CPU / 2 cores | committer CPU per commit (us) |"
    );
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, text) in sets {
        for (workers, edit) in [(CORES, false), (CORES, true), (1, false), (1, true)] {
            let filters = classbench::parse_filters(&text).expect("parse");
            let template = classbench::to_ruleset(name, &filters).expect("translate");
            let flat = template.tables[0].chains[0].rules.to_vec();
            let mid = flat.len() / 2;
            let changed = classbench::to_rule(&filters[mid / 2], Target::Drop).expect("translate");
            let alt = Alternating {
                mids: [flat[mid].clone(), changed],
                flat,
                template,
            };
            let packets: Vec<PacketMeta> = classbench::sample_headers(&filters, 10_000, 7)
                .iter()
                .map(classbench::to_packet)
                .collect();
            let engine = Engine::new(
                EngineConfig {
                    cores: CORES,
                    barrier: BarrierStrategy::Membarrier,
                    conntrack: None,
                },
                Arc::new(MonoClock(Instant::now())),
            );
            engine
                .commit(Change::Put(alt.whole(0)), &NoSets)
                .expect("commit");
            // Warm-up.
            round(&engine, workers, &packets, &alt, (false, edit), 0.5);
            let (mut without, mut with) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                without.push(round(&engine, workers, &packets, &alt, (false, edit), secs));
                with.push(round(&engine, workers, &packets, &alt, (true, edit), secs));
            }
            let mean = |v: &[RoundResult]| v.iter().map(|r| r.pps).sum::<f64>() / v.len() as f64;
            let (w0, w1) = (mean(&without), mean(&with));
            let mut commit_us: Vec<f64> = with.iter().map(|r| r.commit_us).collect();
            commit_us.sort_by(f64::total_cmp);
            let share = with.iter().map(|r| r.commit_cpu_share).sum::<f64>() / with.len() as f64;
            let mut cpu_us: Vec<f64> = with.iter().map(|r| r.commit_cpu_us).collect();
            cpu_us.sort_by(f64::total_cmp);
            let mut pair_dips: Vec<f64> = without
                .iter()
                .zip(&with)
                .map(|(a, b)| b.pps / a.pps - 1.0)
                .collect();
            pair_dips.sort_by(f64::total_cmp);
            println!(
                "| {name} | {} | {workers} | {} | {:.2} | {:.2} | {:+.1}% | {:+.1}% | {} | {:.0} | {:.1}% | {:.0} |",
                filters.len(),
                if edit { "edit" } else { "put" },
                w0 / 1e6,
                w1 / 1e6,
                (w1 / w0 - 1.0) * 100.0,
                pair_dips[pair_dips.len() / 2] * 100.0,
                with.iter().map(|r| r.commits).sum::<usize>(),
                commit_us[commit_us.len() / 2],
                share * 100.0,
                cpu_us[cpu_us.len() / 2],
            );
            eprintln!(
                "rounds without: {:?} with: {:?} (Mpps)",
                without
                    .iter()
                    .map(|r| (r.pps / 1e4).round() / 100.0)
                    .collect::<Vec<_>>(),
                with.iter()
                    .map(|r| (r.pps / 1e4).round() / 100.0)
                    .collect::<Vec<_>>()
            );
        }
    }
}
