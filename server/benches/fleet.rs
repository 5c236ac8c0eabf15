//! Fleet mode at scale, by simulation: N node agents in one process against a real etcd on
//! loopback. Each runs the same [`Agent`] code as vallumd (list, watch, reconcile, report,
//! lease heartbeat) with vallumd's allocator (mimalloc); only the node-local side is lighter
//! ([`SimLocal`]: no engine and no SQLite, it records the publish time).
//!
//! Cases: N = 100, 1,000, 5,000 (`VALLUM_FLEET_BENCH_NODES=100,1000` picks others). For each:
//! the agents register and keep their leases alive (TTL `VALLUM_FLEET_BENCH_TTL` seconds,
//! default 10 as vallumd's `--fleet-lease-ttl`) for three TTLs before the write — etcd's CPU
//! and lease renewals over that window are the keep-alives' alone, and every node key must
//! still exist after it — and on through the rollout (every node key must exist after it too);
//! then one ruleset write selecting every node; programming latency write -> each node's publish
//! (p50, p99, max); the time until WaitRollout's code ([`follow`]: one read, then an etcd
//! watch) shows every ACK; etcd's and this process's (the agents') CPU time over the
//! rollout, etcd's RSS. `VALLUM_FLEET_BENCH_WAIT=watch,poll` runs each N twice: waiting as
//! WaitRollout does (`watch`, the default) and by reading the whole status every 20 ms
//! (`poll`, as WaitRollout did before it watched) — the A/B of what a waiting caller costs
//! the rollout. A scenario with its own report, not a criterion bench.
//!
//! Run: `cargo bench -p vallum-server --bench fleet` (needs etcd: panics without it).
//! `VALLUM_FLEET_BENCH_PERF=DIR` records a `perf record -g` profile of etcd and the
//! agents over each rollout alone (`DIR/fleet-N.perf`); `VALLUM_FLEET_BENCH_PPROF=DIR` etcd's
//! own Go CPU profile (`DIR/etcd-N.pprof`). After each case it prints what etcd did over the
//! rollout, from etcd's `/metrics` before and after: requests by gRPC method, MVCC puts,
//! ranges and txns, watch events sent, lease renewals, raft proposals, fsyncs, GC cycles.
//! Agents have one etcd client (one HTTP/2 connection) each, as vallumd nodes do;
//! `VALLUM_FLEET_BENCH_PER_CONNECTION=50` shares one per 50.

#[path = "../tests/it/support/etcd.rs"]
mod etcd_server;

// vallumd's allocator, so the agents allocate as they do there.
#[global_allocator]
static ALLOCATOR: vallum_server::host::allocator::MiMalloc =
    vallum_server::host::allocator::MiMalloc;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vallum_server::control::fleet::agent::{Agent, Applied, FleetStats, Local};
use vallum_server::control::fleet::etcd::Etcd;
use vallum_server::control::fleet::service::{Rollout, follow, rollout_status};
use vallum_server::control::fleet::{Desired, Keys, Labels, Owners};
use vallum_server::error::Error;
use vallum_server::telemetry::metrics::{Metrics, MetricsConfig};

/// A node without engine or store: "publishes" by recording (write time, publish time).
#[derive(Debug, Default)]
struct SimLocal {
    active: Mutex<BTreeMap<String, u64>>,
    published: Arc<Mutex<Vec<i64>>>,
}

#[tonic::async_trait]
impl Local for SimLocal {
    fn active(&self, name: &str) -> Option<u64> {
        self.active.lock().unwrap().get(name).copied()
    }

    async fn apply(
        &self,
        name: &str,
        _rev: i64,
        d: &Desired,
        _value: &[u8],
    ) -> Result<Applied, Error> {
        let now = vallum_server::clock::Clock::system().unix_ns();
        self.published.lock().unwrap().push(now - d.write_time_ns);
        let mut a = self.active.lock().unwrap();
        let n = a.get(name).map_or(1, |n| n + 1);
        a.insert(name.to_string(), n);
        Ok(Applied {
            local_revision: n,
            ..Default::default()
        })
    }

    async fn remove(&self, name: &str) -> Result<(), Error> {
        self.active.lock().unwrap().remove(name);
        Ok(())
    }
}

/// utime + stime (s) and VmRSS (MiB) of `pid`.
fn usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    // After the comm field: state is index 0, utime 11, stime 12 (man 5 proc).
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    (ticks / hz.max(1.0), rss_kb / 1024.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The agents' lease TTL: `VALLUM_FLEET_BENCH_TTL` seconds, default 10 (vallumd's).
fn lease_ttl() -> Duration {
    Duration::from_secs(
        std::env::var("VALLUM_FLEET_BENCH_TTL")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10u64)
            .max(2),
    )
}

/// How many node keys exist (registered nodes), retried while etcd is busy.
async fn node_keys(writer: &Etcd, keys: &Keys) -> usize {
    loop {
        match writer.range_prefix(&keys.nodes(), 0).await {
            Ok((_, kvs)) => return kvs.len(),
            Err(e) => eprintln!("bench: list nodes: {e}; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn case(n: usize, poll: bool, metrics: &Metrics) {
    let pprof = std::env::var_os("VALLUM_FLEET_BENCH_PPROF").map(std::path::PathBuf::from);
    let flags: &[&str] = if pprof.is_some() {
        &["--enable-pprof"]
    } else {
        &[]
    };
    let etcd = etcd_server::EtcdServer::start_with(flags);
    let etcd = Arc::new(etcd);
    let pid = etcd.pid().unwrap_or(0);
    let keys = Keys::new("/vallum/v1/");
    let per_connection = agents_per_connection();
    let clients: Vec<Etcd> = (0..n.div_ceil(per_connection))
        .map(|_| Etcd::connect(&[etcd.url()]).unwrap())
        .collect();
    let published = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let stats = FleetStats::new(metrics, vallum_server::clock::Clock::system());
    let started = Instant::now();
    let agents: Vec<_> = (0..n)
        .map(|i| {
            let mut labels = Labels::new();
            labels.insert("role".into(), "web".into());
            Agent::new(
                clients[i % clients.len()].clone(),
                Arc::new(SimLocal {
                    published: published.clone(),
                    ..Default::default()
                }),
                Arc::new(Owners::default()),
                keys.clone(),
                format!("node-{i:05}"),
                labels,
                lease_ttl(),
                stats.clone(),
            )
            .spawn()
        })
        .collect();
    let writer = Etcd::connect(&[etcd.url()]).unwrap();
    // Every node registered (its lease and node key), before the write.
    loop {
        // etcd may answer "request timed out" while thousands register on a loaded VM.
        match writer.range_prefix(&keys.nodes(), 0).await {
            Ok((_, kvs)) if kvs.len() == n => break,
            Ok(_) => {}
            Err(e) => eprintln!("bench: list nodes: {e}; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let registered = started.elapsed();
    // Then, unless `VALLUM_FLEET_BENCH_SETTLE=0`, until every agent is watching and keeps
    // its lease alive (etcd's own gauges), and etcd is idle (under 5% of a core over 200 ms):
    // a rollout to a running fleet, not one racing 5,000 nodes' start. Without it the
    // write lands among the last nodes' watch creations and lists (each, in etcd 3.4, a copy
    // of the backend's uncommitted writes) and their garbage.
    let settle = std::env::var("VALLUM_FLEET_BENCH_SETTLE").map_or(true, |v| v != "0");
    if settle {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let c = etcd_counters(&etcd);
            let watching = c.get("etcd_debugging_mvcc_watcher_total").copied();
            let alive = c.get("grpc_server_started_total LeaseKeepAlive").copied();
            if watching >= Some(n as f64) && alive >= Some(n as f64) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "agents not all watching after 120 s: {watching:?} watchers, {alive:?} keep-alive streams"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        loop {
            let (a, _) = usage(pid);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (b, _) = usage(pid);
            if b - a < 0.01 || Instant::now() > deadline {
                break;
            }
        }
    }
    let settled = started.elapsed();
    // Three lease TTLs of keep-alives alone: etcd's CPU and renewals over them, and every
    // node still registered at the end (a keep-alive that never flows lets the keys expire
    // within one TTL).
    let ttl = lease_ttl();
    let k0 = etcd_counters(&etcd);
    let (kcpu0, _) = usage(pid);
    tokio::time::sleep(3 * ttl).await;
    let (kcpu1, _) = usage(pid);
    let k1 = etcd_counters(&etcd);
    let renewed = k1
        .get("etcd_debugging_lease_renewed_total")
        .copied()
        .unwrap_or(0.0)
        - k0.get("etcd_debugging_lease_renewed_total")
            .copied()
            .unwrap_or(0.0);
    let before_rollout = node_keys(&writer, &keys).await;
    println!(
        "fleet N={n:>5} keep-alives alone over 3 TTLs ({:.0} s, TTL {} s): {renewed:.0} lease renewals ({:.0}/s), etcd CPU {:.2} s ({:.1}% of a core); {before_rollout} of {n} nodes registered after",
        (3 * ttl).as_secs_f64(),
        ttl.as_secs(),
        renewed / (3 * ttl).as_secs_f64(),
        kcpu1 - kcpu0,
        100.0 * (kcpu1 - kcpu0) / (3 * ttl).as_secs_f64(),
    );
    assert_eq!(
        before_rollout, n,
        "nodes dropped out while keeping their leases alive"
    );
    // `VALLUM_FLEET_BENCH_PERF=DIR`: `perf record` of etcd and this process over the
    // rollout alone (write -> all ACKs), to DIR/fleet-N.perf.
    let perf = std::env::var_os("VALLUM_FLEET_BENCH_PERF").map(|dir| {
        let out = std::path::Path::new(&dir).join(format!("fleet-{n}.perf"));
        std::process::Command::new("perf")
            .args(["record", "-F", "1999", "-g", "-o"])
            .arg(&out)
            .args(["-p", &format!("{pid},{}", std::process::id())])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run perf")
    });
    if perf.is_some() {
        // perf needs a moment to attach.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // `VALLUM_FLEET_BENCH_PPROF=DIR`: etcd's own CPU profile (Go pprof, symbolized by
    // etcd) over the first `VALLUM_FLEET_BENCH_PPROF_SECONDS` (default 5) of the rollout, to
    // DIR/etcd-N.pprof (`go tool pprof -top`).
    let profile = pprof.map(|dir| {
        let etcd = etcd.clone();
        let seconds: u64 = std::env::var("VALLUM_FLEET_BENCH_PPROF_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5);
        std::thread::spawn(move || {
            let path = format!("/debug/pprof/profile?seconds={seconds}");
            let body = etcd.http_get(&path, Duration::from_secs(seconds + 30));
            let out = dir.join(format!("etcd-{n}.pprof"));
            std::fs::write(&out, body.unwrap_or_default()).expect("write the profile");
        })
    });
    let before = etcd_counters(&etcd);
    let (cpu0, _) = usage(pid);
    let (self0, _) = usage(std::process::id());
    // The writer and the waiting caller on their own thread and runtime, as in another
    // vallumd (sharing the agents' two workers, the caller's follow queued behind 5,000
    // agents' tasks).
    let caller = {
        let (url, keys) = (etcd.url(), keys.clone());
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("caller runtime")
                .block_on(write_and_wait(url, keys, n, poll))
        })
    };
    let all_acked = tokio::task::spawn_blocking(move || caller.join())
        .await
        .expect("join")
        .expect("the caller thread");
    let (cpu1, rss) = usage(pid);
    let (self1, _) = usage(std::process::id());
    let after = etcd_counters(&etcd);
    if let Some(mut child) = perf {
        // SAFETY: kill(2) with a pid this process spawned and still holds; no memory access.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let _ = child.wait();
    }
    let mut lat: Vec<f64> = published
        .lock()
        .unwrap()
        .iter()
        .map(|ns| *ns as f64 / 1e6)
        .collect();
    lat.sort_by(f64::total_cmp);
    println!(
        "fleet N={n:>5} wait={}: registered in {:.2}s, settled {:.2}s; write->publish p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; all ACKs visible {:.0} ms; etcd CPU {:.2} s, RSS {:.0} MiB; agents CPU {:.2} s",
        if poll { "poll" } else { "watch" },
        registered.as_secs_f64(),
        settled.as_secs_f64(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
        all_acked.as_secs_f64() * 1e3,
        cpu1 - cpu0,
        rss,
        self1 - self0
    );
    println!("  etcd over the rollout (write -> all ACKs visible), total and per node:");
    for (k, v) in &after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        if d != 0.0 {
            println!("    {k:<58} {d:>12.0} {:>9.2}", d / n as f64);
        }
    }
    if let Some(t) = profile {
        t.join().expect("profile thread");
    }
    let after_rollout = node_keys(&writer, &keys).await;
    println!(
        "  {after_rollout} of {n} nodes registered after the rollout ({:.0} s after the first registration)",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(after_rollout, n, "nodes dropped out during the rollout");
    for a in agents {
        a.abort();
    }
}

/// Writes the bench ruleset (selecting every node) over a client of its own, then waits
/// until all `n` nodes ACKed: following as WaitRollout does, or (`poll`) reading the whole
/// status every 20 ms. Returns the time from the write to the last ACK seen.
async fn write_and_wait(url: String, keys: Keys, n: usize, poll: bool) -> Duration {
    let writer = Etcd::connect(&[url]).unwrap();
    let desired = Desired {
        content: "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 23 -j DROP\nCOMMIT\n"
            .into(),
        selector: "role=web".into(),
        message: "bench".into(),
        author: "bench".into(),
        write_time_ns: vallum_server::clock::Clock::system().unix_ns(),
        ..Default::default()
    };
    let write = Instant::now();
    // etcd may answer "request timed out" under this load: retry (the first try may have
    // landed; the value is the same).
    while let Err(e) = writer
        .put(
            &keys.ruleset("web"),
            serde_json::to_vec(&desired).unwrap(),
            0,
        )
        .await
    {
        eprintln!("bench: write: {e}; retrying");
    }
    if poll {
        loop {
            let Ok(s) = rollout_status(&writer, &keys, "web").await else {
                continue;
            };
            if s.applied.len() == n {
                break write.elapsed();
            }
            assert!(
                write.elapsed() < Duration::from_secs(300),
                "rollout stuck: {} of {n}",
                s.applied.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        // As WaitRollout: read once, then follow the watch until every node ACKed.
        let mut acked = None;
        let rollout = loop {
            match Rollout::read(&writer, &keys, "web").await {
                Ok(r) => break r,
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        follow(&writer, rollout, 0, false, deadline, |_, s| {
            let done = s.applied.len() == n;
            if done {
                acked = Some(write.elapsed());
            }
            async move { !done }
        })
        .await
        .expect("follow the rollout");
        acked.expect("rollout stuck: not every node ACKed within 300 s")
    }
}

/// Agents per etcd client (one HTTP/2 connection each): `VALLUM_FLEET_BENCH_PER_CONNECTION`,
/// default 1 as in a real fleet, where each vallumd has its own connection.
fn agents_per_connection() -> usize {
    std::env::var("VALLUM_FLEET_BENCH_PER_CONNECTION")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1usize)
        .max(1)
}

/// The counters of etcd's `/metrics` that say what a rollout asked of it: requests and
/// stream messages by gRPC method (`grpc_server_*`, summed over codes), MVCC operations and
/// watch events sent (`etcd_debugging_mvcc_*`), lease renewals, raft proposals, WAL fsyncs,
/// backend commits, Go GC cycles and bytes allocated, process CPU seconds.
fn etcd_counters(etcd: &etcd_server::EtcdServer) -> BTreeMap<String, f64> {
    const NAMES: [&str; 18] = [
        "etcd_debugging_mvcc_watcher_total",
        "etcd_debugging_mvcc_watch_stream_total",
        "grpc_server_started_total",
        "grpc_server_handled_total",
        "grpc_server_msg_received_total",
        "grpc_server_msg_sent_total",
        "etcd_debugging_mvcc_put_total",
        "etcd_debugging_mvcc_range_total",
        "etcd_debugging_mvcc_txn_total",
        "etcd_debugging_mvcc_delete_total",
        "etcd_debugging_mvcc_events_total",
        "etcd_debugging_lease_renewed_total",
        "etcd_server_proposals_committed_total",
        "etcd_disk_wal_fsync_duration_seconds_count",
        "etcd_disk_backend_commit_duration_seconds_count",
        "go_gc_duration_seconds_count",
        "go_memstats_alloc_bytes_total",
        "process_cpu_seconds_total",
    ];
    let body = etcd
        .http_get("/metrics", Duration::from_secs(10))
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in String::from_utf8_lossy(&body).lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        if !NAMES.contains(&name) {
            continue;
        }
        let key = match labels.split_once("grpc_method=\"") {
            Some((_, rest)) => format!("{name} {}", rest.split('"').next().unwrap_or("")),
            None => name.to_string(),
        };
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}

fn main() {
    vallum_server::host::allocator::keep_freed_memory();
    let nodes: Vec<usize> = std::env::var("VALLUM_FLEET_BENCH_NODES")
        .unwrap_or_else(|_| "100,1000,5000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing else we read.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let metrics = Metrics::new(&MetricsConfig::default()).expect("metrics");
    let waits: Vec<bool> = std::env::var("VALLUM_FLEET_BENCH_WAIT")
        .unwrap_or_else(|_| "watch".into())
        .split(',')
        .map(|w| w.trim() == "poll")
        .collect();
    rt.block_on(async {
        for n in nodes {
            for poll in &waits {
                case(n, *poll, &metrics).await;
            }
        }
    });
}
