//! Boot and memory (issue #33 items 5 and 6): how long vallumd takes from exec to serving a
//! stored ruleset of 10k and 100k rules, against `iptables-legacy-restore` loading the same
//! rules in the same run, and what vallumd keeps in memory (RSS) idle and with those rules.
//!
//! Per size (ClassBench acl1: NeuroCuts' `acl1_10k` and the generated `acl1_100k`, converted to
//! iptables rules of one INPUT chain as the apply bench does): the text is applied once through
//! gRPC to a fresh database and that vallumd stopped (SIGTERM). Then `VALLUM_BOOT_ROUNDS`
//! (default 7) rounds alternate the two sides, so a busy machine slows both alike:
//!
//! - **vallumd**: spawned on that database (`--cores 1 --socket none`, no packet source), timed
//!   from the spawn to its `serving` line on stdout (the bench blocks on the pipe: no polling
//!   interval in the figure); VmRSS read from `/proc/PID/status` at that line and again 500 ms
//!   later ("settled"); then SIGTERM and wait (untimed).
//! - **iptables-legacy-restore** of the same text, a whole process, in a private network
//!   namespace (a thread of this bench that `unshare(CLONE_NEWNET)`s, so the children it spawns
//!   live there); the table is emptied between rounds (untimed), so every round loads into an
//!   empty table as a boot does.
//!
//! A vallumd on an empty database gives the idle RSS; bytes per rule is the settled RSS with N
//! rules less the idle settled RSS, over N. Printed: min and p50 of each side, the ratio of the p50s (target
//! <= 0.5x), and the RSS figures (targets: idle <= 30 MB, <= 0.5 KB per rule at 100k).
//!
//! `VALLUM_BOOT_LOAD=K` keeps K busy threads spinning in this process during the rounds (both
//! sides): the "at load" figure. `VALLUM_BENCH_100K=0` skips the 100k set. Fails with the reason
//! when ../shared/data/classbench is absent; the kernel side prints `NOT MEASURED` and why when
//! it cannot run (not root, a tool missing).
//!
//! Run: `cargo bench -p vallum-server --bench boot` (root for the kernel side).

#![allow(missing_docs)]

#[path = "../../engine/benches/support/classbench.rs"]
mod classbench;
// The tests' vallumd harness: `Daemon::start` seeds each database.
#[path = "../tests/it/support/vallumd.rs"]
mod vallumd;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vallum_engine::restore::{PrintOptions, print};
use vallum_proto::v1 as pb;

/// One vallumd boot: ms from spawn to `serving`, RSS at `serving` and 500 ms later (bytes).
struct Boot {
    ms: f64,
    rss: u64,
    settled: u64,
}

fn main() {
    let Some(dir) = classbench::data_dir() else {
        panic!("boot bench not run: ../shared/data/classbench not found (or $VALLUM_SHARED_DATA)");
    };
    let rounds: usize = env_num("VALLUM_BOOT_ROUNDS").unwrap_or(7).max(1);
    let load: usize = env_num("VALLUM_BOOT_LOAD").unwrap_or(0);
    let mut sets = vec![(
        "acl1_10k",
        std::fs::read_to_string(dir.join("neurocuts/acl1_10k")).expect("read acl1_10k"),
    )];
    if std::env::var("VALLUM_BENCH_100K").as_deref() != Ok("0") {
        let path = dir.join("generated/acl1_100k.gz");
        match classbench::read_gz(&path) {
            Some(t) => sets.push(("acl1_100k", t)),
            None => println!("NOT MEASURED acl1_100k: cannot gunzip {}", path.display()),
        }
    }
    let kernel = Kernel::start();
    if let Err(why) = &kernel {
        println!("NOT MEASURED iptables-legacy-restore: {why}");
    }

    let spin = Arc::new(AtomicBool::new(load > 0));
    let spinners: Vec<_> = (0..load)
        .map(|_| {
            let spin = spin.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while spin.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();

    let tmp = tempfile::tempdir().expect("tempdir");
    let idle_db = tmp.path().join("idle.db");
    // The idle database: migrated, no ruleset.
    Seed::apply(&idle_db, None);
    let idle: Vec<Boot> = (0..rounds).map(|_| boot(&idle_db)).collect();
    let idle_settled = median(idle.iter().map(|b| b.settled as f64).collect());

    println!(
        "# boot: {rounds} rounds alternated, load {} (+{load} busy threads in the bench), {} CPUs",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "| ruleset | rules | vallumd start -> serving, min / p50 | iptables-legacy-restore, min / p50 | ratio of p50s | RSS at serving | RSS settled | bytes/rule over idle |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let idle_ms: Vec<f64> = idle.iter().map(|b| b.ms).collect();
    println!(
        "| (none) | 0 | {:.1} / {:.1} ms | | | {:.1} MB | {:.1} MB | |",
        min(&idle_ms),
        median(idle_ms.clone()),
        median(idle.iter().map(|b| b.rss as f64).collect()) / 1e6,
        idle_settled / 1e6
    );
    for (name, text) in &sets {
        let filters = classbench::parse_filters(text).expect("parse filters");
        let rs = classbench::to_ruleset("acl", &filters).expect("convert");
        let rules = rs.rule_count();
        let restore = print(&rs.tables, &PrintOptions::default());
        let db = tmp.path().join(format!("{name}.db"));
        Seed::apply(&db, Some(&restore));
        let rules_file = tmp.path().join(format!("{name}.rules"));
        std::fs::write(&rules_file, &restore).expect("write rules");

        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            ours.push(boot(&db));
            if let Ok(k) = &kernel {
                match k.restore(&rules_file) {
                    Ok(ms) => theirs.push(ms),
                    Err(e) => println!("iptables-legacy-restore failed: {e}"),
                }
            }
        }
        let ms: Vec<f64> = ours.iter().map(|b| b.ms).collect();
        let settled = median(ours.iter().map(|b| b.settled as f64).collect());
        let (kernel_col, ratio) = if theirs.is_empty() {
            ("not measured".to_string(), String::new())
        } else {
            (
                format!("{:.1} / {:.1} ms", min(&theirs), median(theirs.clone())),
                format!("{:.2}x", median(ms.clone()) / median(theirs.clone())),
            )
        };
        println!(
            "| {name} | {rules} | {:.1} / {:.1} ms | {kernel_col} | {ratio} | {:.1} MB | {:.1} MB | {:.0} |",
            min(&ms),
            median(ms.clone()),
            median(ours.iter().map(|b| b.rss as f64).collect()) / 1e6,
            settled / 1e6,
            (settled - idle_settled) / rules as f64
        );
    }
    spin.store(false, Ordering::Relaxed);
    for s in spinners {
        s.join().expect("spinner");
    }
}

/// Starts vallumd on `db` and times it to its `serving` line.
fn boot(db: &Path) -> Boot {
    let mut cmd = vallumd::command();
    cmd.arg("--db")
        .arg(db)
        .args(["--cores", "1", "--socket", "none", "--insecure-no-auth"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawn vallumd");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let served = lines.by_ref().any(|l| l.is_ok_and(|l| l == "serving"));
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    assert!(served, "vallumd ended before `serving`: {:?}", child.wait());
    let rss = rss_bytes(child.id());
    std::thread::sleep(Duration::from_millis(500));
    let settled = rss_bytes(child.id());
    // SAFETY: kill(2) with the pid of our own child, which has not been waited for yet.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    for _ in lines {}
    let status = child.wait().expect("wait vallumd");
    assert!(status.success(), "vallumd exited with {status}");
    Boot { ms, rss, settled }
}

/// VmRSS of `pid` in bytes (0 when /proc does not say).
fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// A database seeded by a vallumd of its own: migrated, and with `text` applied as ruleset
/// `acl` when given.
struct Seed;

impl Seed {
    fn apply(db: &Path, text: Option<&str>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // A 100k-rule text is ~8 MB: over the default --max-request-bytes.
        let d = vallumd::Daemon::start(db, &["--max-request-bytes", "67108864"]);
        rt.block_on(async {
            d.wait_serving().await;
            if let Some(text) = text {
                let mut c = d
                    .rulesets()
                    .await
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20);
                c.apply(pb::ApplyRequest {
                    ruleset: "acl".into(),
                    source: Some(vallumd::text_source(text, false, "acl.rules")),
                    ..Default::default()
                })
                .await
                .expect("apply");
            }
            d.stop().await;
        });
    }
}

/// `iptables-legacy-restore` run from a thread that lives in a private network namespace.
struct Kernel {
    jobs: mpsc::Sender<(std::path::PathBuf, mpsc::Sender<Result<f64, String>>)>,
}

impl Kernel {
    fn start() -> Result<Kernel, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let have = Command::new("iptables-legacy-restore")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !have {
            return Err("iptables-legacy-restore not found".into());
        }
        let (tx, rx) = mpsc::channel::<(std::path::PathBuf, mpsc::Sender<Result<f64, String>>)>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: unshare(2) with CLONE_NEWNET moves only this thread into a new network
            // namespace (namespaces are per task); no memory is involved.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            if rc != 0 {
                let _ = ready_tx.send(Err(format!(
                    "unshare(CLONE_NEWNET): {}",
                    std::io::Error::last_os_error()
                )));
                return;
            }
            let _ = ready_tx.send(Ok(()));
            let empty =
                std::env::temp_dir().join(format!("vallum-boot-empty-{}", std::process::id()));
            std::fs::write(&empty, "*filter\nCOMMIT\n").expect("write empty table");
            for (file, answer) in rx {
                let run = |f: &Path| -> Result<f64, String> {
                    let t0 = Instant::now();
                    let out = Command::new("iptables-legacy-restore")
                        .arg(f)
                        .output()
                        .map_err(|e| e.to_string())?;
                    let ms = t0.elapsed().as_secs_f64() * 1e3;
                    if out.status.success() {
                        Ok(ms)
                    } else {
                        Err(String::from_utf8_lossy(&out.stderr).into_owned())
                    }
                };
                let r = run(&file);
                // Untimed: empty the table for the next round, as a boot starts from none.
                let _ = run(&empty);
                let _ = answer.send(r);
            }
            let _ = std::fs::remove_file(&empty);
        });
        ready_rx.recv().map_err(|e| e.to_string())??;
        Ok(Kernel { jobs: tx })
    }

    /// ms of one `iptables-legacy-restore FILE` into an empty table.
    fn restore(&self, file: &Path) -> Result<f64, String> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send((file.to_path_buf(), tx))
            .map_err(|e| e.to_string())?;
        rx.recv().map_err(|e| e.to_string())?
    }
}

fn env_num(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
