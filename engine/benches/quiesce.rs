//! Commit latency (publish + wait until the old snapshot is unreachable) with busy workers.
//!
//! Cases, each run twice: W = cores - 1 (a CPU is free for the committer) and W = cores (every
//! CPU busy), or only W = `VALLUM_BENCH_WORKERS` when that is set:
//! - `dataplane/seqcst`: `Dataplane::commit` with `BarrierStrategy::SeqCst`;
//! - `dataplane/membarrier`: `Dataplane::commit` with `BarrierStrategy::Membarrier`;
//! - `rcu/arc-swap`: `ArcSwap::swap(new)`, then wait until the old `Arc`'s strong count is 1
//!   (every reader's guard gone; arc-swap converts outstanding debts into counts in `swap`);
//! - `rcu/epoch`: crossbeam-epoch `Atomic::swap` + `defer_destroy`, then `pin().flush()` until
//!   the old snapshot's destructor ran (the global epoch advanced twice and garbage was collected).
//!
//! Workers run batches back to back; each batch holds the snapshot for a fixed amount of work
//! (~`VALLUM_BENCH_BATCH_NS`, default 2000 ns, calibrated at start). The committer commits
//! `VALLUM_BENCH_COMMITS` times (default 2000; 20 with `--test`), sleeping 100 us between
//! commits, and timing each commit with `Instant`. The variants take turns in
//! `VALLUM_BENCH_ROUNDS` rounds (default 10) so that machine noise spreads over all of them.
//! All waits, the baselines' too, use the same `Backoff` (default: spin 1024, yield once, then
//! sleep 20 us; override with `VALLUM_BENCH_BACKOFF=spins,yields,sleep_us`). Percentiles are
//! computed from all samples (criterion reports means only, so this bench has its own `main` and
//! prints a Markdown table).
//!
//! Run: `cargo bench -p vallum-engine --bench quiesce` (smoke: `-- --test`).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_epoch as epoch;
use vallum_engine::Clock;
use vallum_engine::dataplane::{Backoff, BarrierStrategy, Dataplane};

struct Snap {
    data: Vec<u64>,
}

impl Snap {
    fn new(seed: u64) -> Snap {
        Snap {
            data: (0..256).map(|i| i * 7 + seed).collect(),
        }
    }
}

/// A batch's work: `rounds` passes over the snapshot.
fn work(s: &Snap, rounds: u32) -> u64 {
    let mut acc = 0u64;
    for _ in 0..rounds {
        for &d in black_box(&s.data) {
            acc = acc.wrapping_add(d);
        }
    }
    acc
}

struct MonoClock(Instant);

impl Clock for MonoClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[derive(Clone, Copy)]
struct Config {
    backoff: Backoff,
    commits: usize,
    rounds: u32,
    gap: Duration,
}

/// Waits until `done` with the same backoff as `Dataplane::commit` (see `Backoff`), so that the
/// baselines are compared fairly.
fn wait_until(backoff: &Backoff, mut done: impl FnMut() -> bool) {
    let mut rounds = 0u64;
    let spins = u64::from(backoff.spins);
    while !done() {
        rounds += 1;
        if rounds <= spins {
            std::hint::spin_loop();
        } else if rounds <= spins + u64::from(backoff.yields) {
            thread::yield_now();
        } else {
            thread::sleep(Duration::from_micros(backoff.sleep_us));
        }
    }
}

/// Dataplane commits; returns (latency samples in ns, mean cores waited, effective strategy).
fn dataplane(strategy: BarrierStrategy, workers: usize, cfg: &Config) -> (Vec<u64>, f64, String) {
    let mut dp = Dataplane::new(
        Snap::new(0),
        workers,
        strategy,
        Arc::new(MonoClock(Instant::now())),
    );
    dp.set_backoff(cfg.backoff);
    let label = match dp.fallback_reason() {
        None => dp.barrier().to_string(),
        Some(why) => format!("{} (fallback: {why})", dp.barrier()),
    };
    let stop = AtomicBool::new(false);
    let mut samples = Vec::with_capacity(cfg.commits);
    let mut waited = 0usize;
    thread::scope(|s| {
        for core in 0..workers {
            let (dp, stop) = (&dp, &stop);
            s.spawn(move || {
                let mut w = dp.worker(core).expect("free core");
                while !stop.load(Ordering::Relaxed) {
                    black_box(w.batch(|snap, b| {
                        b.add_packets(32);
                        work(snap, cfg.rounds)
                    }));
                }
            });
        }
        wait_until(&cfg.backoff, || !dp.batches().contains(&0));
        for i in 0..cfg.commits {
            let new = Box::new(Snap::new(i as u64));
            let t = Instant::now();
            let (old, report) = dp.commit(new);
            samples.push(t.elapsed().as_nanos() as u64);
            waited += report.cores_waited;
            drop(old);
            thread::sleep(cfg.gap);
        }
        stop.store(true, Ordering::Relaxed);
    });
    (samples, waited as f64 / cfg.commits as f64, label)
}

fn arc_swap(workers: usize, cfg: &Config) -> Vec<u64> {
    let swap = ArcSwap::from_pointee(Snap::new(0));
    let stop = AtomicBool::new(false);
    let mut samples = Vec::with_capacity(cfg.commits);
    thread::scope(|s| {
        for _ in 0..workers {
            let (swap, stop) = (&swap, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let g = swap.load();
                    black_box(work(&g, cfg.rounds));
                }
            });
        }
        for i in 0..cfg.commits {
            let new = Arc::new(Snap::new(i as u64));
            let t = Instant::now();
            let old = swap.swap(new);
            wait_until(&cfg.backoff, || Arc::strong_count(&old) == 1);
            samples.push(t.elapsed().as_nanos() as u64);
            drop(old);
            thread::sleep(cfg.gap);
        }
        stop.store(true, Ordering::Relaxed);
    });
    samples
}

/// A snapshot whose destructor reports that it ran.
struct Tracked {
    snap: Snap,
    freed: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.freed.store(true, Ordering::Release);
    }
}

fn epoch(workers: usize, cfg: &Config) -> Vec<u64> {
    // The flag of the snapshot currently published (the next one to be retired).
    let mut current_freed = Arc::new(AtomicBool::new(false));
    let active = epoch::Atomic::new(Tracked {
        snap: Snap::new(0),
        freed: Arc::clone(&current_freed),
    });
    let stop = AtomicBool::new(false);
    let mut samples = Vec::with_capacity(cfg.commits);
    thread::scope(|s| {
        for _ in 0..workers {
            let (active, stop) = (&active, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let guard = epoch::pin();
                    let p = active.load(Ordering::Acquire, &guard);
                    // SAFETY: `p` was loaded under `guard`; the committer frees snapshots only
                    // through `defer_destroy`, which waits for every guard pinned before it.
                    if let Some(t) = unsafe { p.as_ref() } {
                        black_box(work(&t.snap, cfg.rounds));
                    }
                }
            });
        }
        for i in 0..cfg.commits {
            let new_freed = Arc::new(AtomicBool::new(false));
            let new = epoch::Owned::new(Tracked {
                snap: Snap::new(i as u64),
                freed: Arc::clone(&new_freed),
            });
            let t = Instant::now();
            {
                let guard = epoch::pin();
                let old = active.swap(new, Ordering::AcqRel, &guard);
                // SAFETY: `old` was just unlinked by the swap and is not reachable from `active`
                // any more; only readers pinned before can hold it, and `defer_destroy` waits
                // for them.
                unsafe { guard.defer_destroy(old) };
                guard.flush();
            }
            wait_until(&cfg.backoff, || {
                epoch::pin().flush();
                current_freed.load(Ordering::Acquire)
            });
            samples.push(t.elapsed().as_nanos() as u64);
            current_freed = new_freed;
            thread::sleep(cfg.gap);
        }
        stop.store(true, Ordering::Relaxed);
    });
    // SAFETY: all readers were joined by the scope; nobody else can reach the last snapshot.
    unsafe {
        drop(active.into_owned());
    }
    samples
}

fn pct(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

fn row(variant: &str, workers: usize, mut samples: Vec<u64>, waited: Option<f64>) {
    samples.sort_unstable();
    let mean = samples.iter().sum::<u64>() as f64 / samples.len().max(1) as f64 / 1000.0;
    println!(
        "| {variant} | {workers} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
        samples.len(),
        pct(&samples, 0.5),
        pct(&samples, 0.99),
        pct(&samples, 0.999),
        pct(&samples, 1.0),
        mean,
        waited.map_or("-".to_string(), |w| format!("{w:.2}")),
    );
}

/// Rounds of `work` that take about `target_ns` (the fastest of 50 tries, so that preemption
/// by other processes during calibration does not shrink the batches).
fn calibrate(target_ns: u64) -> u32 {
    let s = Snap::new(1);
    let rounds = 16u32;
    let best = (0..50)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..10 {
                black_box(work(&s, rounds));
            }
            t.elapsed().as_nanos() as f64
        })
        .fold(f64::INFINITY, f64::min);
    let per_round = best / (10.0 * f64::from(rounds));
    ((target_ns as f64 / per_round).round() as u32).max(1)
}

fn main() {
    let test = std::env::args().any(|a| a == "--test");
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let batch_ns = env_u64("VALLUM_BENCH_BATCH_NS").unwrap_or(2000);
    // VALLUM_BENCH_BACKOFF="spins,yields,sleep_us" overrides the default backoff.
    let backoff = std::env::var("VALLUM_BENCH_BACKOFF")
        .ok()
        .and_then(|v| {
            let p: Vec<u64> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            (p.len() == 3).then(|| Backoff {
                spins: p[0] as u32,
                yields: p[1] as u32,
                sleep_us: p[2],
            })
        })
        .unwrap_or_default();
    let cfg = Config {
        backoff,
        commits: env_u64("VALLUM_BENCH_COMMITS")
            .map_or(if test { 20 } else { 2000 }, |n| n as usize),
        rounds: calibrate(batch_ns),
        gap: Duration::from_micros(100),
    };
    let worker_counts = match env_u64("VALLUM_BENCH_WORKERS") {
        Some(w) => vec![w as usize],
        None => {
            let mut v = vec![cpus.saturating_sub(1).max(1), cpus];
            v.dedup();
            v
        }
    };
    let rounds =
        env_u64("VALLUM_BENCH_ROUNDS").map_or(if test { 1 } else { 10 }, |r| r.max(1) as usize);
    println!(
        "commit latency, us ({cpus} CPUs, batch ~{batch_ns} ns = {} rounds, {} commits in {rounds} rounds, 100 us apart)",
        cfg.rounds, cfg.commits
    );
    println!("backoff: {backoff:?}");
    println!("| variant | workers | commits | p50 | p99 | p99.9 | max | mean | cores waited |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &w in &worker_counts {
        // Variants alternate in `rounds` rounds, so that a noisy phase of the machine (other
        // processes) hits all of them alike instead of one whole variant.
        let per_round = Config {
            commits: cfg.commits.div_ceil(rounds).max(1),
            ..cfg
        };
        let mut seq = (Vec::new(), 0.0, String::new());
        let mut mb = (Vec::new(), 0.0, String::new());
        let (mut arc, mut ep) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for (acc, strategy) in [
                (&mut seq, BarrierStrategy::SeqCst),
                (&mut mb, BarrierStrategy::Membarrier),
            ] {
                let (samples, waited, label) = dataplane(strategy, w, &per_round);
                acc.0.extend(samples);
                acc.1 += waited / rounds as f64;
                acc.2 = label;
            }
            arc.extend(arc_swap(w, &per_round));
            ep.extend(epoch(w, &per_round));
        }
        row(&format!("dataplane/{}", seq.2), w, seq.0, Some(seq.1));
        row(&format!("dataplane/{}", mb.2), w, mb.0, Some(mb.1));
        row("rcu/arc-swap", w, arc, None);
        row("rcu/epoch", w, ep, None);
    }
}
