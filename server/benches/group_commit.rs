//! Group commit: acknowledged commits per second when many clients commit at once, each to
//! its own ruleset, through gRPC against an in-process vallumd (2 engine cores, no traffic)
//! whose database is on the disk of the temporary directory (`$TMPDIR`, else /tmp; give
//! `VALLUM_BENCH_DIR` to measure another disk).
//!
//! Cases, each for `--sync full` and `--sync normal`, with 1, 8 and 64 clients (each on its
//! own HTTP/2 connection, one call at a time, as separate processes would): every client
//! sends `EditRuleset` with one `-A INPUT -s ... -j DROP` to its own ruleset (so a ruleset
//! grows by one rule per call, from empty) for `VALLUM_BENCH_SECS` seconds (default 3) after a
//! warm-up of 0.5 s, and counts the calls answered OK. Prints commits/s, p50/p99 of a call,
//! and writes per fsync of the store's WAL (from `/metrics`: how many commits shared one).
//! A scenario, not criterion (harness = false). Run:
//! `cargo bench -p vallum-server --bench group_commit`

// The tests' vallumd harness has items this bench does not use.
#![allow(missing_docs, dead_code)]

// vallumd's allocator and its settings (server/src/host/allocator.rs).
#[global_allocator]
static ALLOCATOR: vallum_server::host::allocator::MiMalloc =
    vallum_server::host::allocator::MiMalloc;
// The tests' vallumd harness: `Daemon::in_process` on this bench's runtime.
#[path = "../tests/it/support/vallumd.rs"]
mod vallumd;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vallum_proto::v1 as pb;
use vallum_proto::v1::ruleset_service_client::RulesetServiceClient;

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// `name`'s value in the `/metrics` of `addr` (a series without labels).
fn metric(addr: &str, name: &str) -> u64 {
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").expect("ask /metrics");
    let mut body = String::new();
    conn.read_to_string(&mut body).expect("read /metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .trim()
        .parse()
        .expect("a number")
}

fn edit(k: usize, i: usize) -> pb::EditRulesetRequest {
    pb::EditRulesetRequest {
        ruleset: format!("gc-{k}"),
        edits: vec![pb::RuleCommand {
            family: pb::Family::Ipv4 as i32,
            table: "filter".into(),
            args: [
                "-A",
                "INPUT",
                "-s",
                &format!("10.{}.{}.{}", k % 256, (i / 256) % 256, i % 256),
                "-j",
                "DROP",
            ]
            .map(String::from)
            .to_vec(),
        }],
        ..Default::default()
    }
}

struct Row {
    commits_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    writes_per_fsync: f64,
}

async fn case(sync: &str, clients: usize, secs: f64) -> Row {
    let base = std::env::var_os("VALLUM_BENCH_DIR").map(std::path::PathBuf::from);
    let tmp = match base {
        Some(b) => tempfile::tempdir_in(b),
        None => tempfile::tempdir(),
    }
    .expect("tempdir");
    let db = tmp.path().join("bench.db");
    let server = vallumd::Daemon::in_process(&db, &["--sync", sync], Default::default()).await;
    let port = server.port();
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(
            RulesetServiceClient::connect(format!("http://127.0.0.1:{port}"))
                .await
                .expect("connect"),
        );
    }
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(k, mut c)| {
            let (measuring, stop) = (measuring.clone(), stop.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = 0;
                // Relaxed: lone flags the driver flips; a call more or less at an edge does
                // not matter.
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    c.edit_ruleset(edit(k, i)).await.expect("EditRuleset");
                    i += 1;
                    if measuring.load(Ordering::Relaxed) {
                        lat.push(t.elapsed().as_micros() as u64);
                    }
                }
                lat
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (w0, f0) = (
        metric(&server.metrics_addr, "vallum_store_writes_total"),
        metric(&server.metrics_addr, "vallum_store_fsyncs_total"),
    );
    measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let (w1, f1) = (
        metric(&server.metrics_addr, "vallum_store_writes_total"),
        metric(&server.metrics_addr, "vallum_store_fsyncs_total"),
    );
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("client task"));
    }
    drop(server);
    Row {
        commits_per_s: lat.len() as f64 / elapsed,
        p50_us: pct(&mut lat, 0.5),
        p99_us: pct(&mut lat, 0.99),
        writes_per_fsync: if f1 > f0 {
            (w1 - w0) as f64 / (f1 - f0) as f64
        } else {
            f64::INFINITY
        },
    }
}

fn main() {
    let secs: f64 = std::env::var("VALLUM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    vallum_server::host::allocator::keep_freed_memory();
    println!("| --sync | clients | commits/s | p50 ms | p99 ms | writes per fsync |");
    println!("|---|---|---|---|---|---|");
    for sync in ["full", "normal"] {
        for clients in [1, 8, 64] {
            let r = rt.block_on(case(sync, clients, secs));
            println!(
                "| {sync} | {clients} | {:.0} | {:.2} | {:.2} | {} |",
                r.commits_per_s,
                r.p50_us as f64 / 1000.0,
                r.p99_us as f64 / 1000.0,
                if r.writes_per_fsync.is_finite() {
                    format!("{:.1}", r.writes_per_fsync)
                } else {
                    "no fsync".into()
                },
            );
        }
    }
}
