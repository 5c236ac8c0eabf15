//! Fleet mode at scale, by simulation: N node agents in one process against a real etcd on
//! loopback. Each runs the same [`Agent`] code as vallumd (list, watch, reconcile, report,
//! lease heartbeat) with vallumd's allocator (mimalloc); only the node-local side is lighter
//! ([`SimLocal`]: no engine and no SQLite, it records the publish time). Agents share one etcd client (one HTTP/2 connection) per 50.
//!
//! Cases: N = 100, 1,000, 5,000 (`VALLUM_FLEET_BENCH_NODES=100,1000` picks others). For each:
//! one ruleset write selecting every node; programming latency write -> each node's publish
//! (p50, p99, max); the time until WaitRollout's code ([`follow`]: one read, then an etcd
//! watch) shows every ACK; etcd's and this process's (the agents') CPU time over the
//! rollout, etcd's RSS. `VALLUM_FLEET_BENCH_WAIT=watch,poll` runs each N twice: waiting as
//! WaitRollout does (`watch`, the default) and by reading the whole status every 20 ms
//! (`poll`, as WaitRollout did before it watched) — the A/B of what a waiting caller costs
//! the rollout. A scenario with its own report, not a criterion bench.
//!
//! Run: `cargo bench -p vallum-server --bench fleet` (prints `SKIP etcd not installed` without
//! etcd). `VALLUM_FLEET_BENCH_PERF=DIR` records a `perf record -g` profile of etcd and the
//! agents over each rollout alone (`DIR/fleet-N.perf`).

#[path = "../tests/support/etcd.rs"]
mod etcd_server;

// vallumd's allocator, so the agents allocate as they do there.
#[global_allocator]
static ALLOCATOR: vallum_server::allocator::MiMalloc = vallum_server::allocator::MiMalloc;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vallum_server::error::Error;
use vallum_server::fleet::agent::{Agent, Applied, FleetStats, Local};
use vallum_server::fleet::etcd::Etcd;
use vallum_server::fleet::service::{Rollout, follow, rollout_status};
use vallum_server::fleet::{Desired, Keys, Labels, Owners};
use vallum_server::metrics::{Metrics, MetricsConfig};

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
        let now = vallum_server::store::now_ns();
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

async fn case(n: usize, poll: bool, metrics: &Metrics) {
    let Some(etcd) = etcd_server::EtcdServer::start() else {
        return;
    };
    let pid = etcd.pid().unwrap_or(0);
    let keys = Keys::new("/vallum/v1/");
    let clients: Vec<Etcd> = (0..n.div_ceil(50))
        .map(|_| Etcd::connect(&[etcd.url()]).unwrap())
        .collect();
    let published = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let stats = FleetStats::new(metrics);
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
                Duration::from_secs(30),
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
    let (cpu0, _) = usage(pid);
    let (self0, _) = usage(std::process::id());
    let desired = Desired {
        content: "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 23 -j DROP\nCOMMIT\n"
            .into(),
        selector: "role=web".into(),
        message: "bench".into(),
        author: "bench".into(),
        write_time_ns: vallum_server::store::now_ns(),
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
    let all_acked = if poll {
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
        follow(&writer, rollout, 0, deadline, |_, s| {
            let done = s.applied.len() == n;
            if done {
                acked = Some(write.elapsed());
            }
            async move { !done }
        })
        .await
        .expect("follow the rollout");
        acked.expect("rollout stuck: not every node ACKed within 300 s")
    };
    let (cpu1, rss) = usage(pid);
    let (self1, _) = usage(std::process::id());
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
        "fleet N={n:>5} wait={}: registered in {:.2}s; write->publish p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; all ACKs visible {:.0} ms; etcd CPU {:.2} s, RSS {:.0} MiB; agents CPU {:.2} s",
        if poll { "poll" } else { "watch" },
        registered.as_secs_f64(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
        all_acked.as_secs_f64() * 1e3,
        cpu1 - cpu0,
        rss,
        self1 - self0
    );
    for a in agents {
        a.abort();
    }
}

fn main() {
    vallum_server::allocator::keep_freed_memory();
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
