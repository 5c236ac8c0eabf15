//! Barrier cost per packet on the worker side (one thread, no commits running).
//!
//! Cases, each at batch sizes 1, 8 and 32 packets (criterion group `barrier/<batch>`):
//! - `baseline`: the per-packet work on a plain `&Snap`, no protocol at all;
//! - `seqcst`: `Worker::batch` with `BarrierStrategy::SeqCst` (one `fence(SeqCst)` per batch);
//! - `membarrier`: `Worker::batch` with `BarrierStrategy::Membarrier` (compiler fence only; falls
//!   back to SeqCst where membarrier is unavailable, which the table says);
//! - `rwlock`: a `std::sync::RwLock` read lock taken per packet.
//!
//! The per-packet work is trivial (add one `u64` field of the snapshot) so the barrier dominates.
//! After criterion, unless run with `--test`, a table of ns per packet and the ratio to the
//! baseline, measured in this same run, is printed for BENCHMARKS.md.
//!
//! Run: `cargo bench -p vallum-engine --bench barrier` (smoke: `-- --test`, short: `-- --quick`).

use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use vallum_engine::dataplane::{BarrierStrategy, Dataplane, Worker};

const BATCHES: [u64; 3] = [1, 8, 32];

#[path = "support/clock.rs"]
mod clock;
use clock::MonoClock;

struct Snap {
    data: [u64; 64],
}

impl Snap {
    fn new() -> Snap {
        let mut data = [0; 64];
        for (i, d) in data.iter_mut().enumerate() {
            *d = i as u64 * 3 + 1;
        }
        Snap { data }
    }
}

/// The per-packet work item.
#[inline(always)]
fn work(s: &Snap, packet: u64) -> u64 {
    s.data[(packet & 63) as usize]
}

fn dataplane(strategy: BarrierStrategy) -> Dataplane<Snap> {
    Dataplane::new(
        Snap::new(),
        1,
        strategy,
        Arc::new(MonoClock(Instant::now())),
    )
}

/// One batch of `n` packets for each variant; returns the checksum.
enum Variant {
    Baseline(Snap),
    Worker(Dataplane<Snap>),
    RwLock(RwLock<Snap>),
}

impl Variant {
    fn all() -> Vec<(String, Variant)> {
        let seq = dataplane(BarrierStrategy::SeqCst);
        let mb = dataplane(BarrierStrategy::Membarrier);
        let mb_name = match mb.fallback_reason() {
            None => "membarrier".to_string(),
            Some(why) => format!("membarrier (fell back to seqcst: {why})"),
        };
        vec![
            ("baseline".into(), Variant::Baseline(Snap::new())),
            ("seqcst".into(), Variant::Worker(seq)),
            (mb_name, Variant::Worker(mb)),
            ("rwlock".into(), Variant::RwLock(RwLock::new(Snap::new()))),
        ]
    }

    /// Runs `batches` batches of `n` packets.
    fn run(&self, batches: u64, n: u64) -> u64 {
        let mut acc = 0u64;
        match self {
            Variant::Baseline(s) => {
                for _ in 0..batches {
                    let s = black_box(s);
                    for p in 0..n {
                        acc = acc.wrapping_add(work(s, p));
                    }
                }
            }
            Variant::Worker(dp) => {
                let mut w = dp.worker(0).expect("core 0 is free");
                for _ in 0..batches {
                    acc = acc.wrapping_add(batch(&mut w, n));
                }
            }
            Variant::RwLock(l) => {
                for _ in 0..batches {
                    for p in 0..n {
                        let g = l.read().unwrap_or_else(|e| e.into_inner());
                        acc = acc.wrapping_add(work(&g, p));
                    }
                }
            }
        }
        black_box(acc)
    }
}

/// One dataplane batch of `n` packets.
#[inline(always)]
fn batch(w: &mut Worker<'_, Snap>, n: u64) -> u64 {
    w.batch(|s, b| {
        let mut a = 0u64;
        for p in 0..n {
            a = a.wrapping_add(work(s, p));
        }
        b.add_packets(n);
        a
    })
}

fn bench(c: &mut Criterion, variants: &[(String, Variant)]) {
    for n in BATCHES {
        let mut g = c.benchmark_group(format!("barrier/{n}"));
        g.throughput(Throughput::Elements(n));
        for (name, v) in variants {
            let id = name.split(' ').next().unwrap_or(name);
            g.bench_function(BenchmarkId::from_parameter(id), |b| match v {
                // Claim the core once, outside the timed loop.
                Variant::Worker(dp) => {
                    let mut w = dp.worker(0).expect("core 0 is free");
                    b.iter(|| batch(&mut w, n));
                }
                _ => b.iter(|| v.run(1, n)),
            });
        }
        g.finish();
    }
}

/// ns per packet for each variant and batch size, measured back to back in this run.
fn table(variants: &[(String, Variant)]) {
    const PACKETS: u64 = 1 << 24;
    println!();
    println!("barrier cost, ns per packet ({PACKETS} packets per cell, best of 3)");
    print!("| variant |");
    for n in BATCHES {
        print!(" batch {n} | ratio |");
    }
    println!();
    println!("|---|{}", "---|---|".repeat(BATCHES.len()));
    let mut base = [0f64; BATCHES.len()];
    for (name, v) in variants {
        print!("| {name} |");
        for (i, n) in BATCHES.into_iter().enumerate() {
            let best = (0..3)
                .map(|_| {
                    let t = Instant::now();
                    v.run(PACKETS / n, n);
                    t.elapsed().as_nanos() as f64 / PACKETS as f64
                })
                .fold(f64::INFINITY, f64::min);
            if name == "baseline" {
                base[i] = best;
            }
            print!(" {best:.3} | {:.1}x |", best / base[i]);
        }
        println!();
    }
    for (name, v) in variants {
        if let Variant::Worker(dp) = v {
            let h = dp.barrier_histogram();
            let q = |q| h.quantile_ps(q).unwrap_or(0.0) / 1000.0;
            println!(
                "sampled barrier histogram {name}: {} samples, p50 {:.3} ns/packet, p99 {:.3} ns/packet",
                h.count(),
                q(0.5),
                q(0.99)
            );
        }
    }
}

fn main() {
    let variants = Variant::all();
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &variants);
    c.final_summary();
    if !std::env::args().any(|a| a == "--test" || a == "--list") {
        table(&variants);
    }
}
