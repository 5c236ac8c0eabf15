//! Validation of rulesets with many chains (issue #13): time and peak heap, to show that
//! both grow linearly with the number of chains.
//!
//! Cases, each at 10k, 100k and 1M chains (`N`), in one filter table:
//! - `flat`: `N` empty user chains;
//! - `flat_jumps`: `N` user chains, each holding one `-j ACCEPT`, and INPUT jumping to every
//!   one of them (`N` chains + `N` jumps);
//! - `deep`: the text of the issue, INPUT -> C0 -> C1 -> ... -> C(N-1), far beyond the call
//!   depth limit of 64 (the answer is one `TooDeep(N)`).
//!
//! For each case and size, two benchmarks: `parse_validate/<case>/<N>` (text to violations,
//! what a Validate call does before printing) and `validate/<case>/<N>` (the parsed ruleset
//! only). Before criterion runs, one pass prints a table per case and size: the time of one
//! parse + validate, and the peak heap of it above what was allocated before (the text
//! itself is not counted), measured with a counting global allocator.
//!
//! Run: `cargo bench -p vallum-engine --bench validate`; `VALLUM_BENCH_CHAINS=10000,100000`
//! and `VALLUM_BENCH_CASES=flat,deep` pick sizes and cases.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use vallum_engine::model::Ruleset;
use vallum_engine::restore::{ParseOptions, parse_ruleset};
use vallum_engine::validate::{ViolationKind, validate};

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    // Relaxed: the counters are read after the measured work, on the same thread.
    let now = IN_USE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` with the caller's arguments; the counting has no
// effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through `alloc`/`realloc` above) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc` for `ptr` and `layout`; the caller checked `new_size`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                IN_USE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The chain counts: 10k, 100k and 1M, or those listed in `VALLUM_BENCH_CHAINS`
/// (comma-separated; to measure a slower build of the parser on the small sizes only).
fn sizes() -> Vec<usize> {
    std::env::var("VALLUM_BENCH_CHAINS")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|n| n.trim().parse().expect("a chain count"))
                .collect()
        })
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000])
}

/// The cases: all, or those named in `VALLUM_BENCH_CASES` (comma-separated).
fn cases() -> Vec<Case> {
    let only = std::env::var("VALLUM_BENCH_CASES").ok();
    (Case::ALL.into_iter())
        .filter(|c| {
            only.as_ref()
                .is_none_or(|o| o.split(',').any(|n| n == c.name()))
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Case {
    Flat,
    FlatJumps,
    Deep,
}

impl Case {
    const ALL: [Case; 3] = [Case::Flat, Case::FlatJumps, Case::Deep];

    fn name(self) -> &'static str {
        match self {
            Case::Flat => "flat",
            Case::FlatJumps => "flat_jumps",
            Case::Deep => "deep",
        }
    }

    fn text(self, n: usize) -> String {
        use std::fmt::Write;
        let mut t = String::with_capacity(n * 40);
        t.push_str("*filter\n:INPUT ACCEPT [0:0]\n");
        for i in 0..n {
            let _ = writeln!(t, ":C{i} - [0:0]");
        }
        match self {
            Case::Flat => {}
            Case::FlatJumps => {
                for i in 0..n {
                    let _ = writeln!(t, "-A INPUT -j C{i}");
                    let _ = writeln!(t, "-A C{i} -j ACCEPT");
                }
            }
            Case::Deep => {
                t.push_str("-A INPUT -j C0\n");
                for i in 0..n - 1 {
                    let _ = writeln!(t, "-A C{i} -j C{}", i + 1);
                }
            }
        }
        t.push_str("COMMIT\n");
        t
    }

    /// The violations the ruleset must have.
    fn check(self, n: usize, kinds: &[ViolationKind]) {
        match self {
            Case::Flat | Case::FlatJumps => assert!(kinds.is_empty(), "{kinds:?}"),
            Case::Deep => assert_eq!(kinds, [ViolationKind::TooDeep(n)]),
        }
    }
}

fn parse(text: &str) -> Ruleset {
    parse_ruleset("bench", text, &ParseOptions::default()).expect("parses")
}

/// One parse + validate of each case and size: time and peak heap above the start.
fn report() {
    eprintln!("case        chains     text MB   parse+validate   peak heap MB   bytes/chain");
    for case in cases() {
        for n in sizes() {
            let text = case.text(n);
            let base = IN_USE.load(Ordering::Relaxed);
            PEAK.store(base, Ordering::Relaxed);
            let t0 = Instant::now();
            let rs = parse(&text);
            let v = validate(&rs, None);
            let took = t0.elapsed();
            let peak = PEAK.load(Ordering::Relaxed) - base;
            case.check(n, &v.iter().map(|v| v.kind.clone()).collect::<Vec<_>>());
            drop((v, rs));
            eprintln!(
                "{:<11} {:>9} {:>9.1} {:>13.1} ms {:>14.1} {:>13}",
                case.name(),
                n,
                text.len() as f64 / 1e6,
                took.as_secs_f64() * 1e3,
                peak as f64 / 1e6,
                peak / n
            );
        }
    }
}

fn bench(c: &mut Criterion) {
    report();
    let mut g = c.benchmark_group("validate_chains");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for case in cases() {
        for n in sizes() {
            let text = case.text(n);
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("parse_validate/{}", case.name()), n),
                &text,
                |b, text| b.iter(|| validate(&parse(black_box(text)), None)),
            );
            let rs = parse(&text);
            g.bench_with_input(
                BenchmarkId::new(format!("validate/{}", case.name()), n),
                &rs,
                |b, rs| b.iter(|| validate(black_box(rs), None)),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
