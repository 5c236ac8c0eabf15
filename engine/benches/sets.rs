//! ipset-style sets (issue #4 part 3): bulk load and lock-free lookups under a writer.
//!
//! Cases:
//! - `bulk_add/hash_ip/1M`: one `SetManager::add` of 1,000,000 distinct IPv4 hosts into an
//!   empty `hash:ip` set (elements built beforehand; one publication: staged, applied to the
//!   standby copy, flipped, replayed on the other copy).
//! - `lookup/<variant>`: one thread tests 1,024 packets (half hits) against a 10,000-element
//!   `hash:ip` set, in one dataplane batch; throughput in lookups/s. Variants, same run:
//!   - `sethandle/no_writer`: `SetHandle::lookup` inside a batch of the dataplane the manager
//!     was built for (one pointer load + packed Fx probe);
//!   - `sethandle/writer_10k_per_s`: the same while another thread adds 50 and deletes 50
//!     elements every 10 ms (10k element changes/s, one `SetManager::update` publication
//!     per batch);
//!   - `rwlock_hashset/no_writer` and `rwlock_hashset/writer_10k_per_s`: a
//!     `RwLock<FxHashSet<IpAddr>>` read-locked per lookup, with the same writer pattern.
//!
//! - `readers/<type>/<size>/<variant>/<writer>/<N>r` (issue #19 item 1, what the ipset seed
//!   measured): N reader threads at once (`VALLUM_SET_READERS`, a comma list, default `1,2`;
//!   up to 16 on a bigger machine), each classifying 1,024 packets (half hits) through
//!   `-A FORWARD -m set --match-set s ... -j DROP` with `Snapshot::classify_batch` (one packet at a time), in one
//!   `Dataplane` batch on its own core (the manager built for that dataplane).
//!   Types: `hash_ip` (src), `hash_net` (src; /24 and /16 networks), `hash_ip_port`
//!   (src,dst; tcp). Sizes 10k and 1M elements. Variants: `sethandle` (the `SetManager`'s
//!   handle) and, for `hash_ip`, `rwlock` (an `IpSet` that read-locks a
//!   `RwLock<FxHashSet<IpAddr>>` per lookup), with no writer and with the 10k changes/s
//!   writer above. Throughput counts packets of all readers (elements/s); per-packet ns =
//!   N / throughput.
//!
//! Run: `cargo bench -p vallum-engine --bench sets` (`-- readers` for the multi-reader cases)

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::{BTreeMap, HashSet};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rustc_hash::FxBuildHasher;
use vallum_engine::conntrack::NoTracking;
use vallum_engine::dataplane::{BarrierStrategy, Dataplane};
use vallum_engine::model::{Family, Hook, SetDir};
use vallum_engine::packet::PacketMeta;
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::sets::{AddOptions, Element, IpSet, SetManager, SetRegistry, SetSpec, SetType};
use vallum_engine::snapshot::{LogEvent, Snapshot, Verdict};

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

struct WallClock(Instant);

impl vallum_engine::Clock for WallClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

fn dataplane<S>(initial: S, cores: usize) -> Dataplane<S> {
    Dataplane::new(
        initial,
        cores,
        BarrierStrategy::SeqCst,
        Arc::new(WallClock(Instant::now())),
    )
}

fn lookup(c: &mut Criterion) {
    let pkts = packets();
    let mut g = c.benchmark_group("lookup");
    g.throughput(Throughput::Elements(pkts.len() as u64));

    let dp = dataplane((), 1);
    let m = Arc::new(SetManager::for_dataplane(Arc::clone(dp.quiescence())));
    m.create("s", spec(1_000_000)).unwrap();
    m.add(
        "s",
        (0..SET_SIZE).map(|i| (Element::new(host(i), 32, None), AddOptions::default())),
        0,
    )
    .unwrap();
    let set = m.handle("s").unwrap();
    let dirs = [SetDir::Src];
    let core0 = std::cell::RefCell::new(dp.worker(0).unwrap());
    let run_handle = |b: &mut criterion::Bencher<'_>| {
        b.iter(|| {
            core0.borrow_mut().batch(|_, _| {
                let mut hits = 0u32;
                for p in &pkts {
                    hits += u32::from(set.lookup(black_box(p), &dirs, 0));
                }
                assert_eq!(hits, 512);
                hits
            })
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
            core0.borrow_mut().batch(|_, _| {
                let mut hits = 0u32;
                for p in &pkts {
                    let p = black_box(p);
                    hits += u32::from(rw.read().unwrap().contains(&p.src));
                }
                assert_eq!(hits, 512);
                hits
            })
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

/// A `hash:ip` set read-locked per lookup (the seed's "before"), compiled into the same rule.
#[derive(Debug)]
struct RwSet(Arc<RwLock<HashSet<IpAddr, FxBuildHasher>>>);

impl IpSet for RwSet {
    fn contains(&self, packet: &PacketMeta, dirs: &[SetDir], _now: u64) -> bool {
        let ip = match dirs.first() {
            Some(SetDir::Src) => packet.src,
            _ => packet.dst,
        };
        self.0.read().unwrap().contains(&ip)
    }

    fn dimensions(&self) -> usize {
        1
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Ip,
    Net,
    IpPort,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ip => "hash_ip",
            Kind::Net => "hash_net",
            Kind::IpPort => "hash_ip_port",
        }
    }

    fn set_type(self) -> SetType {
        match self {
            Kind::Ip => SetType::HashIp,
            Kind::Net => SetType::HashNet,
            Kind::IpPort => SetType::HashIpPort,
        }
    }

    fn flags(self) -> &'static str {
        if self == Kind::IpPort {
            "src,dst"
        } else {
            "src"
        }
    }

    /// Element `i` (i < 2^24): a host; a /24 network (every 1,000th element a /16 in a block
    /// of its own, so a lookup probes two prefix lengths); or a host with a tcp port.
    fn element(self, i: u32) -> Element {
        match self {
            Kind::Ip => Element::new(host(i), 32, None),
            Kind::Net if i % 1000 == 999 => Element::new(
                IpAddr::V4(Ipv4Addr::from(0xc000_0000 + ((i / 1000) << 16))),
                16,
                None,
            ),
            Kind::Net => Element::new(IpAddr::V4(Ipv4Addr::from(0x1000_0000 + (i << 8))), 24, None),
            Kind::IpPort => Element::new(host(i), 32, Some((6, 80 + (i % 100) as u16))),
        }
    }

    /// A packet that hits element `i`, or misses every element (`hit` false).
    fn packet(self, i: u32, hit: bool, size: u32) -> PacketMeta {
        let src = match (self, hit) {
            (Kind::Net, true) if i % 1000 == 999 => {
                IpAddr::V4(Ipv4Addr::from(0xc000_0000 + ((i / 1000) << 16) + 0x0107))
            }
            (Kind::Net, true) => IpAddr::V4(Ipv4Addr::from(0x1000_0000 + (i << 8) + 7)),
            (Kind::Net, false) => IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + i)),
            (_, true) => host(i),
            (_, false) => host(size + 100_000 + i),
        };
        PacketMeta {
            hook: Hook::Forward,
            family: Family::Ipv4,
            src,
            dst: host(0),
            protocol: 6,
            sport: 40_000,
            dport: if self == Kind::IpPort {
                80 + (i % 100) as u16
            } else {
                80
            },
            len: 100,
            ..PacketMeta::default()
        }
    }
}

fn readers_list() -> Vec<usize> {
    std::env::var("VALLUM_SET_READERS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2])
}

/// A dataplane running the one-rule ruleset compiled against `registry`.
fn snapshot(registry: &dyn SetRegistry, kind: Kind, dp: &Dataplane<Snapshot>) {
    let text = format!(
        "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m set --match-set s {} -j DROP\nCOMMIT\n",
        kind.flags()
    );
    let rs = parse_ruleset("bench", &text, &ParseOptions::default()).unwrap();
    let snap = Snapshot::compile(&[Arc::new(rs)], registry, dp.cores()).unwrap();
    drop(dp.commit(Box::new(snap)));
}

/// Runs `iters` batches on each of `n` threads (cores) at once; the wall time from a common
/// start.
fn run_readers(dp: &Dataplane<Snapshot>, pkts: &[PacketMeta], n: usize, iters: u64) -> Duration {
    let barrier = Barrier::new(n + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|core| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut w = dp.worker(core).unwrap();
                    let mut logs: Vec<LogEvent> = Vec::new();
                    barrier.wait();
                    for _ in 0..iters {
                        w.batch(|snap, _| {
                            let mut drops = 0u32;
                            let mut v = [Verdict::Accept];
                            for p in pkts {
                                let mut p = [*black_box(p)];
                                let track = &mut NoTracking;
                                snap.classify_batch(
                                    core,
                                    &mut p,
                                    &mut [],
                                    &mut v,
                                    0,
                                    &mut logs,
                                    &[],
                                    track,
                                );
                                drops += u32::from(v[0] == Verdict::Drop);
                            }
                            assert_eq!(drops as usize, pkts.len() / 2);
                        });
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in hs {
            h.join().unwrap();
        }
        start.elapsed()
    })
}

fn readers(c: &mut Criterion) {
    let ns = readers_list();
    let cores = ns.iter().copied().max().unwrap_or(1);
    let mut g = c.benchmark_group("readers");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));
    for kind in [Kind::Ip, Kind::Net, Kind::IpPort] {
        for size in [10_000u32, 1_000_000] {
            let pkts: Vec<PacketMeta> = (0..1024u32)
                .map(|i| kind.packet((i * 7919) % size, i % 2 == 0, size))
                .collect();
            let dp = dataplane(Snapshot::empty(cores), cores);
            let m = Arc::new(SetManager::for_dataplane(Arc::clone(dp.quiescence())));
            let sspec = SetSpec {
                maxelem: 4_000_000,
                ..SetSpec::new(kind.set_type(), Family::Ipv4)
            };
            m.create("s", sspec).unwrap();
            m.add(
                "s",
                (0..size).map(|i| (kind.element(i), AddOptions::default())),
                0,
            )
            .unwrap();
            snapshot(&*m, kind, &dp);
            let rw = (kind == Kind::Ip).then(|| {
                let set: Arc<RwLock<HashSet<IpAddr, FxBuildHasher>>> =
                    Arc::new(RwLock::new((0..size).map(host).collect()));
                let mut reg: BTreeMap<String, Arc<dyn IpSet>> = BTreeMap::new();
                reg.insert("s".into(), Arc::new(RwSet(Arc::clone(&set))));
                let rdp = dataplane(Snapshot::empty(cores), cores);
                snapshot(&reg, kind, &rdp);
                (set, rdp)
            });
            for with_writer in [false, true] {
                let wname = if with_writer {
                    "writer_10k_per_s"
                } else {
                    "no_writer"
                };
                let stop = Arc::new(AtomicBool::new(false));
                let writers = with_writer.then(|| {
                    let wm = Arc::clone(&m);
                    let w1 = writer(Arc::clone(&stop), move |add, del| {
                        let el = |a: &IpAddr| match (kind, a) {
                            (Kind::Net, IpAddr::V4(v)) => Element::new(
                                IpAddr::V4(Ipv4Addr::from(u32::from(*v) & !0xff)),
                                24,
                                None,
                            ),
                            (Kind::IpPort, a) => Element::new(*a, 32, Some((6, 80))),
                            (_, a) => Element::new(*a, 32, None),
                        };
                        // Writer elements lie above every packet's address: no verdict changes.
                        let shift = |a: &IpAddr| match a {
                            IpAddr::V4(v) => {
                                IpAddr::V4(Ipv4Addr::from(u32::from(*v) | 0xe000_0000))
                            }
                            a => *a,
                        };
                        let add = add.iter().map(|a| (el(&shift(a)), AddOptions::default()));
                        let del = del.iter().map(|a| el(&shift(a)));
                        wm.update("s", add, del, 0).unwrap();
                    });
                    let w2 = rw.as_ref().map(|(set, _)| {
                        let set = Arc::clone(set);
                        writer(Arc::clone(&stop), move |add, del| {
                            let mut s = set.write().unwrap();
                            for a in add {
                                if let IpAddr::V4(v) = a {
                                    s.insert(IpAddr::V4(Ipv4Addr::from(
                                        u32::from(*v) | 0xe000_0000,
                                    )));
                                }
                            }
                            for d in del {
                                if let IpAddr::V4(v) = d {
                                    s.remove(&IpAddr::V4(Ipv4Addr::from(
                                        u32::from(*v) | 0xe000_0000,
                                    )));
                                }
                            }
                        })
                    });
                    (w1, w2)
                });
                for &n in &ns {
                    g.throughput(Throughput::Elements((pkts.len() * n) as u64));
                    let id = |v: &str| format!("{}/{}/{v}/{wname}/{n}r", kind.name(), size);
                    g.bench_function(id("sethandle"), |b| {
                        b.iter_custom(|iters| run_readers(&dp, &pkts, n, iters))
                    });
                    if let Some((_, rdp)) = &rw {
                        g.bench_function(id("rwlock"), |b| {
                            b.iter_custom(|iters| run_readers(rdp, &pkts, n, iters))
                        });
                    }
                }
                stop.store(true, Ordering::Relaxed);
                if let Some((w1, w2)) = writers {
                    w1.join().unwrap();
                    if let Some(w2) = w2 {
                        w2.join().unwrap();
                    }
                }
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bulk_add, lookup, readers);
criterion_main!(benches);
