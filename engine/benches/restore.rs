//! iptables-restore text: parse and canonical print of ClassBench acl1_10k written as iptables
//! rules (the input of the server's Apply bench, BENCHMARKS.md §6), and the kube-proxy and
//! Docker dumps of `../shared/data/iptables-save/` when present; and [`parse_after`] of the
//! acl1 text with one line added, against a full parse.
//!
//! Run: `cargo bench -p vallum-engine --bench restore`.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

#[path = "support/classbench.rs"]
mod classbench;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use vallum_engine::restore::{
    ParseOptions, PrintOptions, parse_after, parse_ruleset, parse_ruleset_threads, print,
};

fn bench(c: &mut Criterion) {
    let Some(dir) = classbench::data_dir() else {
        panic!(
            "restore bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)"
        );
    };
    let text = std::fs::read_to_string(dir.join("neurocuts/acl1_10k")).expect("read acl1_10k");
    let filters = classbench::parse_filters(&text).expect("parse acl1_10k");
    let rs = classbench::to_ruleset("acl", &filters).expect("convert");
    let text = print(&rs.tables, &PrintOptions::default());
    let rules = rs.rule_count() as u64;
    let opts = ParseOptions::default();
    let parsed = parse_ruleset("acl", &text, &opts).expect("parse");
    assert_eq!(parsed.rule_count() as u64, rules);

    let mut g = c.benchmark_group("restore_acl1_10k");
    g.throughput(Throughput::Elements(rules));
    g.bench_function("parse", |b| {
        b.iter(|| parse_ruleset("acl", &text, &opts).expect("parse"))
    });
    // Rule lines read ahead on two threads (what vallumd does on a 2-CPU machine).
    g.bench_function("parse, 2 threads", |b| {
        b.iter(|| parse_ruleset_threads("acl", &text, &opts, 2).expect("parse"))
    });
    // The text again with one rule line changed near the top, given the parse of the text
    // before (what vallumd does for an Apply of the same ruleset).
    let changed = text.replacen(
        "-A INPUT ",
        "-A INPUT -p tcp -m tcp --dport 1 -j DROP\n-A INPUT ",
        1,
    );
    let expect = parse_ruleset("acl", &changed, &opts).expect("parse");
    assert_eq!(
        parse_after(&text, &parsed.tables, &changed, &opts).as_ref(),
        Some(&expect.tables)
    );
    g.bench_function("parse_after, one line changed", |b| {
        b.iter(|| parse_after(&text, &parsed.tables, &changed, &opts).expect("shortcut"))
    });
    g.bench_function("print", |b| {
        b.iter(|| print(&parsed.tables, &PrintOptions::default()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
