//! Apply of a 10k-rule ruleset through gRPC, including the SQLite write (durable WAL commit)
//! and the engine commit, against an in-process server on an ephemeral port.
//!
//! Cases:
//! - `apply/acl1_10k`: ClassBench acl1_10k (neurocuts) converted to iptables rules (one INPUT
//!   chain, see engine/benches/support/classbench.rs), applied alternately with a variant that
//!   has one more rule at the top (so every Apply is a real change); 2 engine cores, no
//!   traffic. The
//!   server parses each text incrementally against the previous one of the ruleset
//!   (`restore::parse_after`) and splices the canonical content.
//! - `apply/acl1_10k, full parse`: the same with an `-I` rule at the end of both texts, which
//!   makes the server parse and print each text in full (a first Apply, or a text that is not
//!   a plain dump, costs this).
//!
//! Prints p50/p99 of the whole call and of the server-reported phases. Fails with the reason
//! when ../shared/data/classbench is absent (nothing measured); the kernel baselines print
//! `NOT MEASURED` and why when they cannot run (not root, a tool missing). Run:
//! `cargo bench -p vallum-server --bench apply`

// criterion_group! generates undocumented items.
#![allow(missing_docs)]

#[path = "../../engine/benches/support/classbench.rs"]
mod classbench;
// vallumd's allocator and its settings (server/src/allocator.rs), so the in-process server
// runs as in vallumd.
#[global_allocator]
static ALLOCATOR: vallum_server::host::allocator::MiMalloc =
    vallum_server::host::allocator::MiMalloc;
// The tests' vallumd harness: `Daemon::in_process` on this bench's runtime.
#[path = "../tests/it/support/vallumd.rs"]
mod vallumd;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use vallum_engine::restore::{PrintOptions, print};
use vallum_proto::v1 as pb;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn bench(c: &mut Criterion) {
    let Some(dir) = classbench::data_dir() else {
        panic!("apply bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)");
    };
    let text = std::fs::read_to_string(dir.join("neurocuts/acl1_10k")).expect("read acl1_10k");
    let filters = classbench::parse_filters(&text).expect("parse acl1_10k");
    let rs = classbench::to_ruleset("acl", &filters).expect("convert");
    let rules = rs.rule_count();
    let a = print(&rs.tables, &PrintOptions::default());
    let b = a.replacen(
        "-A INPUT ",
        "-A INPUT -p tcp -m tcp --dport 1 -j DROP\n-A INPUT ",
        1,
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = tmp.path().join("bench.db");
    vallum_server::host::allocator::keep_freed_memory();
    let server = rt.block_on(vallumd::Daemon::in_process(&db, &[], Default::default()));
    let port = server.port();
    let mut client = rt.block_on(async {
        for _ in 0..200 {
            if let Ok(c) = RulesetServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
                return c
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("server did not start");
    });
    let apply = |client: &mut RulesetServiceClient<tonic::transport::Channel>, t: &str| {
        let req = pb::ApplyRequest {
            ruleset: "acl".into(),
            source: Some(pb::RulesetSource {
                source: Some(pb::ruleset_source::Source::Text(pb::RestoreText {
                    content: t.to_string(),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        };
        rt.block_on(async {
            loop {
                match client.apply(req.clone()).await {
                    Ok(r) => return r.into_inner(),
                    // Still loading (NOT_READY): retry.
                    Err(s) if s.code() == tonic::Code::Unavailable => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    Err(s) => panic!("apply: {s:?}"),
                }
            }
        })
    };
    // The same two texts with an `-I` as their last rule: an insert below the change makes
    // the server parse (and print) each text in full (`restore::parse_after` declines), as
    // it does for a ruleset's first Apply or a text that is not a plain dump.
    let with_insert = |t: &str| {
        t.replace(
            "COMMIT\n",
            "-I INPUT 1 -p udp -m udp --dport 9 -j DROP\nCOMMIT\n",
        )
    };
    let (fa, fb) = (with_insert(&a), with_insert(&b));
    let cases = [
        (format!("acl1_10k ({rules} rules)"), &a, &b),
        (format!("acl1_10k ({rules} rules), full parse"), &fa, &fb),
    ];
    let mut results = Vec::new();
    let mut g = c.benchmark_group("apply");
    g.sample_size(20).measurement_time(Duration::from_secs(20));
    for (label, a, b) in &cases {
        let mut totals = Vec::new();
        let mut phases: Vec<pb::CommitPhases> = Vec::new();
        let mut flip = false;
        g.bench_function(label.as_str(), |bn| {
            bn.iter(|| {
                flip = !flip;
                let t0 = Instant::now();
                let r = apply(&mut client, if flip { a } else { b });
                totals.push(t0.elapsed().as_nanos() as u64);
                phases.push(r.phases.unwrap_or_default());
            })
        });
        results.push((label, totals, phases));
    }
    g.finish();
    let ms = |ns: u64| ns as f64 / 1e6;
    for (label, mut totals, phases) in results {
        println!("apply {label}, {} calls:", totals.len());
        println!(
            "  gRPC call   p50 {:8.2} ms  p99 {:8.2} ms",
            ms(pct(&mut totals, 0.5)),
            ms(pct(&mut totals, 0.99))
        );
        fn ns(d: &Option<prost_types::Duration>) -> u64 {
            d.as_ref()
                .map_or(0, |d| d.seconds as u64 * 1_000_000_000 + d.nanos as u64)
        }
        type Get = fn(&pb::CommitPhases) -> u64;
        let cols: [(&str, Get); 7] = [
            ("validate", |p| ns(&p.validate)),
            ("persist", |p| ns(&p.persist)),
            ("compile", |p| ns(&p.compile)),
            ("publish", |p| ns(&p.publish)),
            ("quiesce", |p| ns(&p.quiesce)),
            ("carry", |p| ns(&p.carry)),
            ("total", |p| ns(&p.total)),
        ];
        for (name, f) in cols {
            let mut v: Vec<u64> = phases.iter().map(f).collect();
            println!(
                "  {name:<10}  p50 {:8.2} ms  p99 {:8.2} ms",
                ms(pct(&mut v, 0.5)),
                ms(pct(&mut v, 0.99))
            );
        }
    }
    rt.block_on(server.stop());
    kernel_baselines(&a, rules);
}

/// The same ruleset loaded by the kernel's own tools as whole processes, in a private network
/// namespace: `iptables-legacy-restore` and `nft -f` (input from `iptables-restore-translate`).
/// Needs root, `ip`, and the tools; prints `NOT MEASURED` and why when it cannot run them.
fn kernel_baselines(text: &str, rules: usize) {
    use std::process::{Command, Stdio};
    let have = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !root {
        println!("NOT MEASURED kernel baselines: not root");
        return;
    }
    for tool in [
        "ip",
        "iptables-legacy-restore",
        "iptables-restore-translate",
        "nft",
    ] {
        if !have(tool) {
            println!("NOT MEASURED kernel baselines: {tool} not found");
            return;
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let save = tmp.path().join("acl1_10k.rules");
    std::fs::write(&save, text).expect("write rules");
    let nft_text = Command::new("iptables-restore-translate")
        .arg("-f")
        .arg(&save)
        .output()
        .expect("iptables-restore-translate");
    if !nft_text.status.success() {
        println!(
            "NOT MEASURED nft baseline: iptables-restore-translate failed: {}",
            String::from_utf8_lossy(&nft_text.stderr)
        );
    }
    let nft = tmp.path().join("acl1_10k.nft");
    let mut body = b"flush ruleset\n".to_vec();
    body.extend_from_slice(&nft_text.stdout);
    std::fs::write(&nft, body).expect("write nft");
    let ns = format!("vallum-bench-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("NOT MEASURED kernel baselines: ip netns add failed");
        return;
    }
    let run = |args: &[&str]| -> Option<u64> {
        let t0 = Instant::now();
        let st = Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(args)
            .stdout(Stdio::null())
            .status()
            .ok()?;
        st.success().then(|| t0.elapsed().as_nanos() as u64)
    };
    let save_s = save.display().to_string();
    let nft_s = nft.display().to_string();
    let cases: [(&str, Vec<&str>); 2] = [
        (
            "iptables-legacy-restore",
            vec!["iptables-legacy-restore", save_s.as_str()],
        ),
        ("nft -f", vec!["nft", "-f", nft_s.as_str()]),
    ];
    for (name, args) in cases {
        let mut times: Vec<u64> = (0..20).filter_map(|_| run(&args)).collect();
        if times.is_empty() {
            println!("  {name:<24} failed in the namespace");
            continue;
        }
        let n = times.len();
        println!(
            "  {name:<24} ({rules} rules, whole process, {n} runs) p50 {:8.2} ms  p99 {:8.2} ms",
            pct(&mut times, 0.5) as f64 / 1e6,
            pct(&mut times, 0.99) as f64 / 1e6
        );
    }
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
}

criterion_group!(benches, bench);
criterion_main!(benches);
