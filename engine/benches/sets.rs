//! ipset-style sets (issue #4 part 3): bulk load and lock-free lookups under a writer.
//!
//! Cases:
//! - `bulk_add/hash_ip/1M`: one `SetManager::add` of 1,000,000 distinct IPv4 hosts into an
//!   empty `hash:ip` set (elements built beforehand; one copy-on-write publication).
//! - `lookup/<variant>`: one thread tests 1,024 packets (half hits) against a 10,000-element
//!   `hash:ip` set; throughput in lookups/s. Variants, in the same run:
//!   - `sethandle/no_writer`: `IpSet::contains` on a `SetHandle` (arc-swap load + Fx probe);
//!   - `sethandle/writer_10k_per_s`: the same while another thread adds 50 and deletes 50
//!     elements every 10 ms (10k element changes/s, one `SetManager::update` publication
//!     per batch);
//!   - `rwlock_hashset/no_writer` and `rwlock_hashset/writer_10k_per_s`: a
//!     `RwLock<FxHashSet<IpAddr>>` read-locked per lookup, with the same writer pattern.
//!
//! Run: `cargo bench -p vallum-engine --bench sets`

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::HashSet;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rustc_hash::FxBuildHasher;
use vallum_engine::model::{Family, SetDir};
use vallum_engine::packet::PacketMeta;
use vallum_engine::sets::{AddOptions, Element, IpSet, SetManager, SetSpec, SetType};

const SET_SIZE: u32 = 10_000;
const BASE: u32 = 0x0a00_0000; // 10.0.0.0

fn host(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(BASE + i))
}

fn spec(maxelem: u32) -> SetSpec {
    SetSpec {
        maxelem,
        ..SetSpec::new(SetType::HashIp, Family::Ipv4)
    }
}

fn bulk_add(c: &mut Criterion) {
    let n = 1_000_000u32;
    let elements: Vec<(Element, AddOptions)> = (0..n)
        .map(|i| (Element::new(host(i), 32, None), AddOptions::default()))
        .collect();
    let mut g = c.benchmark_group("bulk_add");
    g.sample_size(10);
    g.throughput(Throughput::Elements(u64::from(n)));
    g.bench_function("hash_ip/1M", |b| {
        b.iter_batched(
            || {
                let m = SetManager::new();
                m.create("big", spec(2_000_000)).unwrap();
                (m, elements.clone())
            },
            |(m, els)| {
                m.add("big", els, 0).unwrap();
                m
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// 1,024 packets whose source alternates between members and non-members.
fn packets() -> Vec<PacketMeta> {
    (0..1024u32)
        .map(|i| PacketMeta {
            src: if i % 2 == 0 {
                host((i * 7919) % SET_SIZE)
            } else {
                host(SET_SIZE + 100_000 + i)
            },
            dst: host(0),
            protocol: 6,
            ..PacketMeta::default()
        })
        .collect()
}

/// Every 10 ms: adds 50 elements outside the looked-up range, deletes the 50 of the previous
/// round (10k changes/s), until `stop`.
fn writer(
    stop: Arc<AtomicBool>,
    mut batch: impl FnMut(&[IpAddr], &[IpAddr]) + Send + 'static,
) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut round = 0u32;
        let mut prev: Vec<IpAddr> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let add: Vec<IpAddr> = (0..50)
                .map(|k| host(SET_SIZE + 1 + (round % 1000) * 50 + k))
                .collect();
            batch(&add, &prev);
            prev = add;
            round += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        u64::from(round)
    })
}

fn lookup(c: &mut Criterion) {
    let pkts = packets();
    let mut g = c.benchmark_group("lookup");
    g.throughput(Throughput::Elements(pkts.len() as u64));

    let m = Arc::new(SetManager::new());
    m.create("s", spec(1_000_000)).unwrap();
    m.add(
        "s",
        (0..SET_SIZE).map(|i| (Element::new(host(i), 32, None), AddOptions::default())),
        0,
    )
    .unwrap();
    let set = m.handle("s").unwrap();
    let dirs = [SetDir::Src];
    let run_handle = |b: &mut criterion::Bencher<'_>| {
        b.iter(|| {
            let mut hits = 0u32;
            for p in &pkts {
                hits += u32::from(set.contains(black_box(p), &dirs, 0));
            }
            assert_eq!(hits, 512);
            hits
        })
    };
    g.bench_function("sethandle/no_writer", run_handle);
    let stop = Arc::new(AtomicBool::new(false));
    let wm = Arc::clone(&m);
    let w = writer(Arc::clone(&stop), move |add, del| {
        let add = add
            .iter()
            .map(|&a| (Element::new(a, 32, None), AddOptions::default()));
        let del = del.iter().map(|&a| Element::new(a, 32, None));
        wm.update("s", add, del, 0).unwrap();
    });
    g.bench_function("sethandle/writer_10k_per_s", run_handle);
    stop.store(true, Ordering::Relaxed);
    eprintln!("sethandle writer: {} rounds", w.join().unwrap());

    let rw: Arc<RwLock<HashSet<IpAddr, FxBuildHasher>>> =
        Arc::new(RwLock::new((0..SET_SIZE).map(host).collect()));
    let run_rw = |b: &mut criterion::Bencher<'_>| {
        b.iter(|| {
            let mut hits = 0u32;
            for p in &pkts {
                let p = black_box(p);
                hits += u32::from(rw.read().unwrap().contains(&p.src));
            }
            assert_eq!(hits, 512);
            hits
        })
    };
    g.bench_function("rwlock_hashset/no_writer", run_rw);
    let stop = Arc::new(AtomicBool::new(false));
    let wrw = Arc::clone(&rw);
    let w = writer(Arc::clone(&stop), move |add, del| {
        let mut s = wrw.write().unwrap();
        s.extend(add.iter().copied());
        for d in del {
            s.remove(d);
        }
    });
    g.bench_function("rwlock_hashset/writer_10k_per_s", run_rw);
    stop.store(true, Ordering::Relaxed);
    eprintln!("rwlock writer: {} rounds", w.join().unwrap());
    g.finish();
}

criterion_group!(benches, bulk_add, lookup);
criterion_main!(benches);
