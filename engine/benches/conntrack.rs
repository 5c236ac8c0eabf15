//! New connections per second under a SYN flood: the lock-free-lookup conntrack table against a
//! single `Mutex<HashMap>` table (the design before the kernel's 2014 removal of the central
//! `nf_conntrack_lock`), in the same run.
//!
//! Cases (`<table>` is `lockfree`, `lockfree_batch32` (the same table fed through
//! `track_batch` 32 packets at a time, one epoch pin per batch; criterion only) or
//! `mutex_hashmap`; `<threads>` from `VALLUM_BENCH_THREADS`, default "1,2"):
//! - `syn_flood/<table>/pcap/<threads>`: the TCP SYNs of `../shared/data/pcap/ndpi-synscan.pcap`
//!   (2011 packets, 2002 distinct 5-tuples, 1994 distinct pure-SYN flows), repeated with the
//!   source port varied until [`FLOWS`] distinct flows; not measured (`NOT MEASURED` and why) when the
//!   capture is absent.
//! - `syn_flood/<table>/synth/<threads>`: [`FLOWS`] generated distinct SYNs (source address and
//!   port varied).
//!
//! Each iteration builds an empty table (untimed), splits the flows into one contiguous slice
//! per thread, starts the threads on a barrier and times until the last one finished; every
//! packet misses and inserts. Throughput is in new connections per second. After criterion,
//! a second pass outside criterion ([`RATIO_RUNS`] runs, median and best) prints the ratios
//! lockfree / mutex_hashmap and the scaling of each table to stderr.
//!
//! Run: `cargo bench -p vallum-engine --bench conntrack` (e.g. `VALLUM_BENCH_THREADS=1,2,4,8,16`
//! on a larger machine).

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rustc_hash::FxBuildHasher;
use vallum_engine::conntrack::{Conntrack, ConntrackConfig, CtVerdict, Tuple};
use vallum_engine::model::{ct_state, tcp_flags};
use vallum_engine::packet::pcap::read_capture;
use vallum_engine::packet::{Packet, PacketFacts, PacketMeta};

/// Distinct flows per iteration.
const FLOWS: usize = 1 << 17;
/// Runs per (table, case, threads) in the ratio pass.
const RATIO_RUNS: usize = 11;
/// The capture, under `<repo>/../shared/data` or `$VALLUM_SHARED_DATA`.
const CAPTURE: &str = "pcap/ndpi-synscan.pcap";

fn threads() -> Vec<usize> {
    std::env::var("VALLUM_BENCH_THREADS")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|t| t.trim().parse().ok())
                .filter(|&n| n > 0)
                .collect()
        })
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 2])
}

fn syn(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> PacketMeta {
    PacketMeta {
        src,
        dst,
        protocol: 6,
        sport,
        dport,
        tcp_flags: tcp_flags::SYN,
        ..PacketMeta::default()
    }
}

/// [`FLOWS`] distinct SYNs from the capture, or why not.
fn pcap_flows() -> Result<Vec<PacketMeta>, String> {
    let base_dir = std::env::var_os("VALLUM_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    let path = base_dir.join(CAPTURE);
    let shown = path.display();
    let bytes = std::fs::read(&path).map_err(|e| format!("{shown}: {e}"))?;
    let caps = read_capture(&bytes).map_err(|e| format!("{shown}: {e}"))?;
    let mut base: Vec<PacketMeta> = Vec::new();
    let mut seen = HashSet::new();
    for c in &caps {
        let Ok(p) = c.parse(Packet::default()) else {
            continue;
        };
        if p.protocol == 6
            && p.tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN
            && seen.insert((p.src, p.sport, p.dst, p.dport))
        {
            base.push(syn(p.src, p.sport, p.dst, p.dport));
        }
    }
    if base.is_empty() {
        return Err(format!("{shown}: no TCP SYNs"));
    }
    eprintln!(
        "conntrack bench: {} distinct SYN flows in the capture",
        base.len()
    );
    let mut out = base.clone();
    let mut k: u16 = 1;
    while out.len() < FLOWS && k != 0 {
        for p in &base {
            let sport = p.sport.wrapping_add(k.wrapping_mul(7919));
            if out.len() < FLOWS && seen.insert((p.src, sport, p.dst, p.dport)) {
                out.push(syn(p.src, sport, p.dst, p.dport));
            }
        }
        k = k.wrapping_add(1);
    }
    Ok(out)
}

/// [`FLOWS`] generated distinct SYNs.
fn synth_flows() -> Vec<PacketMeta> {
    let dst = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    (0..FLOWS as u32)
        .map(|i| {
            let src = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (i >> 4)));
            syn(src, 1024 + (i & 0xf) as u16 * 3001, dst, 80)
        })
        .collect()
}

/// A table under test.
trait Table: Send + Sync + 'static {
    fn build(flows: usize) -> Self;
    fn track(&self, p: &mut PacketMeta, now: u64);
    /// Tracks every packet of `pkts` (a copy of each).
    fn track_slice(&self, pkts: &[PacketMeta]) {
        for (i, p) in pkts.iter().enumerate() {
            let mut p = *p;
            self.track(&mut p, i as u64);
            std::hint::black_box(p.ct_state);
        }
    }
}

impl Table for Conntrack {
    fn build(flows: usize) -> Self {
        Conntrack::new(ConntrackConfig {
            buckets: flows,
            max_entries: 2 * flows,
            locks: 1024,
            tcp_loose: true,
        })
        .expect("valid config")
    }
    /// As the packet path tracks (the worker's lookup, then the confirmation).
    fn track(&self, p: &mut PacketMeta, now: u64) {
        let (_, new) = self.track_unconfirmed(p, &PacketFacts::NONE, now);
        if let Some(u) = new {
            p.ct_state = self.confirm(u, p, now).ct_state();
        }
    }
}

/// The conntrack table fed in batches of 32 packets (one epoch pin per batch), as a worker's
/// `process_batch` would.
struct Batched(Conntrack);

impl Table for Batched {
    fn build(flows: usize) -> Self {
        Batched(<Conntrack as Table>::build(flows))
    }
    fn track(&self, p: &mut PacketMeta, now: u64) {
        Table::track(&self.0, p, now);
    }
    fn track_slice(&self, pkts: &[PacketMeta]) {
        let mut v = [CtVerdict::New; 32];
        for (i, chunk) in pkts.chunks(32).enumerate() {
            let mut batch = [Packet::default(); 32];
            for (b, p) in batch.iter_mut().zip(chunk) {
                b.meta = *p;
            }
            self.0
                .track_batch(&mut batch[..chunk.len()], i as u64, &mut v);
            std::hint::black_box(&batch);
        }
    }
}

/// The baseline: one mutex around a map keyed by both tuples of each connection (as the
/// pre-2014 kernel hashed both directions under one lock). Value: (state, timeout ns, is reply).
struct MutexTable(Mutex<HashMap<Tuple, (u8, u64, bool), FxBuildHasher>>);

impl Table for MutexTable {
    fn build(flows: usize) -> Self {
        MutexTable(Mutex::new(HashMap::with_capacity_and_hasher(
            2 * flows,
            FxBuildHasher,
        )))
    }
    fn track(&self, p: &mut PacketMeta, now: u64) {
        let t = Tuple {
            src: p.src,
            dst: p.dst,
            protocol: p.protocol,
            sport: p.sport,
            dport: p.dport,
        };
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = map.get_mut(&t) {
            e.1 = now + 120_000_000_000;
            p.ct_state = if e.2 {
                ct_state::ESTABLISHED
            } else {
                ct_state::NEW
            };
            return;
        }
        map.insert(t, (1, now + 120_000_000_000, false));
        map.insert(t.reply(), (1, now + 120_000_000_000, true));
        p.ct_state = ct_state::NEW;
    }
}

/// One flood of `flows` over `threads` threads into a fresh table; the time until all finished.
fn flood<T: Table>(flows: &Arc<Vec<PacketMeta>>, threads: usize) -> Duration {
    let table = Arc::new(T::build(flows.len()));
    let barrier = Arc::new(Barrier::new(threads + 1));
    let chunk = flows.len().div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (table, barrier, flows) =
                (Arc::clone(&table), Arc::clone(&barrier), Arc::clone(flows));
            std::thread::spawn(move || {
                let lo = (t * chunk).min(flows.len());
                let hi = ((t + 1) * chunk).min(flows.len());
                barrier.wait();
                table.track_slice(&flows[lo..hi]);
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("bench thread");
    }
    let elapsed = start.elapsed();
    drop(table); // untimed
    elapsed
}

fn cases() -> Vec<(&'static str, Arc<Vec<PacketMeta>>)> {
    let mut v = Vec::new();
    match pcap_flows() {
        Ok(f) => v.push(("pcap", Arc::new(f))),
        Err(why) => eprintln!("NOT MEASURED conntrack pcap case: {why}"),
    }
    v.push(("synth", Arc::new(synth_flows())));
    v
}

fn bench(c: &mut Criterion) {
    let cases = cases();
    let threads = threads();
    let mut g = c.benchmark_group("syn_flood");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, flows) in &cases {
        g.throughput(Throughput::Elements(flows.len() as u64));
        for &n in &threads {
            g.bench_with_input(
                BenchmarkId::new(format!("lockfree/{name}"), n),
                &n,
                |b, &n| {
                    b.iter_custom(|iters| (0..iters).map(|_| flood::<Conntrack>(flows, n)).sum())
                },
            );
            g.bench_with_input(
                BenchmarkId::new(format!("lockfree_batch32/{name}"), n),
                &n,
                |b, &n| b.iter_custom(|iters| (0..iters).map(|_| flood::<Batched>(flows, n)).sum()),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("mutex_hashmap/{name}"), n),
                &n,
                |b, &n| {
                    b.iter_custom(|iters| (0..iters).map(|_| flood::<MutexTable>(flows, n)).sum())
                },
            );
        }
    }
    g.finish();

    // Ratios, both tables measured alternately in the same pass. On a shared machine other
    // processes only ever slow a run down, so the best run is printed beside the median.
    eprintln!("\nconntrack SYN flood, {FLOWS} flows, {RATIO_RUNS} runs each (M new conn/s):");
    eprintln!(
        "case   threads  stat    lockfree  mutex_hashmap  lockfree/mutex  lockfree scaling  mutex scaling"
    );
    for (name, flows) in &cases {
        let mut base: Option<[(f64, f64); 2]> = None;
        for &n in &threads {
            let mut a = Vec::new();
            let mut m = Vec::new();
            for _ in 0..RATIO_RUNS {
                a.push(flood::<Conntrack>(flows, n));
                m.push(flood::<MutexTable>(flows, n));
            }
            a.sort();
            m.sort();
            let rate = |d: Duration| flows.len() as f64 / d.as_secs_f64() / 1e6;
            let now = [
                (rate(a[a.len() / 2]), rate(m[m.len() / 2])),
                (rate(a[0]), rate(m[0])),
            ];
            let first = *base.get_or_insert(now);
            for (i, stat) in ["median", "best"].iter().enumerate() {
                let ((ra, rm), (ba, bm)) = (now[i], first[i]);
                eprintln!(
                    "{name:<6} {n:>7}  {stat:<6} {ra:>8.2}  {rm:>13.2}  {:>14.2}  {:>16.2}  {:>13.2}",
                    ra / rm,
                    ra / ba,
                    rm / bm
                );
            }
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
