//! What a shadow costs the worker, and a commit, in the same run.
//!
//! Cases, on NeuroCuts acl1 at 1k and 10k rules (10,000 headers sampled from the rules, the
//! INPUT chain ACCEPTing what a rule matches, DROP by policy), one worker core, conntrack
//! off, batches of 64 through `EngineWorker::process_batch`:
//! - `off`: no shadow (the path every batch takes without one: one load, one branch);
//! - `same`: a shadow of the same ruleset (every packet classified twice, no verdict differs);
//! - `changed`: a shadow whose every tenth rule DROPs (the differing packets go through the
//!   flow table too).
//!
//! The three run alternated, `ROUNDS` rounds of `REPS` passes over the headers each, timed in
//! the thread's CPU time (the machine is shared); the table gives the best round's ns per
//! packet and the ratios to `off`. Then `commit/<off|on>`: a commit that puts the 1k set with
//! every tenth rule changed (and back), without and with a shadow running (the commit ends
//! it), best of `ROUNDS`.
//! Fails with the reason when ../shared/data/classbench is absent.
//!
//! Run: `cargo bench -p vallum-engine --bench shadow`

use std::sync::Arc;
use std::time::Instant;

use vallum_engine::dataplane::BarrierStrategy;
use vallum_engine::engine::{Change, Engine, EngineConfig, ShadowConfig};
use vallum_engine::model::{Ruleset, Target};
use vallum_engine::packet::PacketMeta;
use vallum_engine::sets::NoSets;
use vallum_engine::snapshot::Verdict;

#[path = "support/classbench.rs"]
mod classbench;
#[path = "support/clock.rs"]
mod clock;
use clock::{MonoClock, thread_cpu_ns};

const ROUNDS: usize = 9;
const REPS: usize = 5;
const BATCH: usize = 64;

fn engine(rs: &Ruleset) -> Engine {
    let e = Engine::new(
        EngineConfig {
            cores: 1,
            barrier: BarrierStrategy::SeqCst,
            conntrack: None,
        },
        Arc::new(MonoClock(Instant::now())),
    );
    e.commit(Change::Put(rs.clone()), &NoSets).expect("commit");
    e
}

/// ns per packet of one round: `REPS` passes over `packets` in batches of [`BATCH`].
fn round(e: &Engine, packets: &[PacketMeta]) -> f64 {
    let mut w = e.worker(0).expect("worker");
    let mut buf = [PacketMeta::default(); BATCH];
    let mut verdicts = [Verdict::Accept; BATCH];
    let t0 = thread_cpu_ns();
    for _ in 0..REPS {
        for chunk in packets.chunks(BATCH) {
            let n = chunk.len();
            buf[..n].copy_from_slice(chunk);
            w.process_batch(&mut buf[..n], &mut verdicts[..n], 1);
        }
        std::hint::black_box(&verdicts);
    }
    (thread_cpu_ns() - t0) as f64 / (REPS * packets.len()) as f64
}

fn main() {
    let Some(dir) = classbench::data_dir() else {
        panic!("shadow bench not run: ../shared/data/classbench not found");
    };
    let quick = std::env::args().any(|a| a == "--test");
    let mut commit_set = None;
    for size in ["1k", "10k"] {
        let text =
            std::fs::read_to_string(dir.join(format!("neurocuts/acl1_{size}"))).expect("read acl1");
        let filters = classbench::parse_filters(&text).expect("acl1");
        let headers = classbench::sample_headers(&filters, 10_000, 7);
        let packets: Vec<PacketMeta> = headers.iter().map(classbench::to_packet).collect();
        let active = classbench::to_ruleset("acl1", &filters).expect("ruleset");
        let changed = classbench::to_ruleset_with("acl1", &filters, |i| {
            if i % 10 == 0 {
                Target::Drop
            } else {
                Target::Accept
            }
        })
        .expect("ruleset");
        let e = engine(&active);
        let modes: [(&str, Option<&Ruleset>); 3] = [
            ("off", None),
            ("same", Some(&active)),
            ("changed", Some(&changed)),
        ];
        let mut best = [f64::MAX; 3];
        let rounds = if quick { 1 } else { ROUNDS };
        for _ in 0..rounds {
            for (i, (_, shadow)) in modes.iter().enumerate() {
                e.end_shadow();
                if let Some(rs) = shadow {
                    e.start_shadow((*rs).clone(), 1, ShadowConfig::default(), &NoSets)
                        .expect("shadow");
                }
                best[i] = best[i].min(round(&e, &packets));
            }
        }
        let report = e.shadow_report().expect("the changed shadow runs");
        eprintln!(
            "acl1_{size}: off {:.1} ns/packet, same {:.1} ({:.2}x), changed {:.1} ({:.2}x; {} of {} packets differ)",
            best[0],
            best[1],
            best[1] / best[0],
            best[2],
            best[2] / best[0],
            report.changed_packets(),
            report.pairs.iter().map(|p| p.packets).sum::<u64>(),
        );
        if size == "1k" {
            commit_set = Some((active, changed, packets));
        }
    }
    let Some((active, changed, packets)) = commit_set else {
        return;
    };
    // Commit: replace rule 1 (alternately DROP and ACCEPT), with and without a shadow.
    let e = engine(&active);
    let mut best = [u64::MAX; 2];
    let rounds = if quick { 1 } else { ROUNDS };
    let mut flip = false;
    for _ in 0..rounds {
        for (i, on) in [false, true].into_iter().enumerate() {
            if on {
                e.start_shadow(changed.clone(), 1, ShadowConfig::default(), &NoSets)
                    .expect("shadow");
                round(&e, &packets[..1000]);
            }
            flip = !flip;
            let next = if flip { &changed } else { &active };
            let t0 = Instant::now();
            let c = e
                .commit(Change::Put(next.clone()), &NoSets)
                .expect("commit");
            let ns = t0.elapsed().as_nanos() as u64;
            drop(c);
            // The commit ended the shadow (its report is the last one).
            assert!(e.shadow_revision().is_none());
            best[i] = best[i].min(ns);
        }
    }
    eprintln!(
        "commit acl1_1k (whole ruleset put, every tenth rule changed): off {:.1} us, with a shadow {:.1} us ({:.2}x)",
        best[0] as f64 / 1e3,
        best[1] as f64 / 1e3,
        best[1] as f64 / best[0] as f64
    );
}
