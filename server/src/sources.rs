//! Packet sources: one OS thread per engine core, each claiming its core and classifying
//! batches of [`BATCH`] packets with `EngineWorker::process_batch`.
//!
//! - `none`: no thread;
//! - `pcap:FILE`: the file is read and parsed once at start; each core replays all of it in a
//!   loop, starting at its own offset;
//! - `synthetic`: the engine's deterministic generator, seeded per core;
//! - `nfqueue[:FIRST][,fail-closed]` (Linux): real packets, worker k on NFQUEUE `FIRST + k`
//!   ([`nfqueue`]); every queue is bound before any thread starts, so a queue that cannot be
//!   bound is a startup error. `--rate` does not apply.
//!
//! `--rate` paces the total over all cores (each core gets `rate / cores`); 0 is full speed.
//! [`Sources::stop`] asks every thread to finish its batch and joins them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vallum_engine::Clock;
use vallum_engine::compile::Verdict;
use vallum_engine::engine::{Engine, EngineWorker};
use vallum_engine::packet::pcap::read_capture;
use vallum_engine::packet::synth::{Synth, SynthConfig};
use vallum_engine::packet::{IfName, PacketMeta};

use crate::config::{NfqueueSource, Source};
use crate::error::{Error, Result};

pub mod nfqueue;

/// Packets per batch (one generation round trip each).
pub const BATCH: usize = 32;

/// Running source threads.
#[derive(Debug)]
pub struct Sources {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

enum Feed {
    // Boxed: the generator holds packets inline (PacketMeta grew), the replay only a pointer.
    Synthetic(Box<Synth>),
    Replay {
        packets: Arc<[PacketMeta]>,
        next: usize,
    },
}

impl Feed {
    fn fill(&mut self, out: &mut [PacketMeta]) {
        match self {
            Feed::Synthetic(s) => out.iter_mut().for_each(|p| *p = s.next_meta()),
            Feed::Replay { packets, next } => {
                for p in out.iter_mut() {
                    *p = packets[*next];
                    *next = (*next + 1) % packets.len();
                }
            }
        }
    }
}

/// The packet metadata every source starts from: INPUT hook, input interface `eth0`.
pub fn base_packet() -> PacketMeta {
    PacketMeta {
        in_iface: IfName::new("eth0").unwrap_or_default(),
        ..PacketMeta::default()
    }
}

impl Sources {
    /// Starts the threads of `source` on every core of `engine`.
    ///
    /// Errors: [`Error::Internal`] when a pcap file cannot be read or holds no IP packet, or a
    /// thread cannot be spawned.
    pub fn start(
        engine: Arc<Engine>,
        source: &Source,
        rate: u64,
        clock: Arc<dyn Clock>,
    ) -> Result<Sources> {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = engine.cores();
        let replay: Option<Arc<[PacketMeta]>> = match source {
            Source::None => {
                return Ok(Sources {
                    stop,
                    threads: Vec::new(),
                });
            }
            Source::Synthetic => None,
            Source::Nfqueue(q) => return start_nfqueue(engine, *q, clock, stop),
            Source::Pcap(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| Error::Internal(format!("read {}: {e}", path.display())))?;
                let caps = read_capture(&bytes)
                    .map_err(|e| Error::Internal(format!("{}: {e}", path.display())))?;
                let metas: Vec<PacketMeta> = caps
                    .iter()
                    .filter_map(|c| c.parse(base_packet()).ok())
                    .collect();
                if metas.is_empty() {
                    return Err(Error::Internal(format!("{}: no IP packet", path.display())));
                }
                Some(metas.into())
            }
        };
        let per_core = if rate == 0 {
            0
        } else {
            (rate / cores as u64).max(1)
        };
        let mut threads = Vec::with_capacity(cores);
        for core in 0..cores {
            let mut feed = match &replay {
                None => Feed::Synthetic(Box::new(
                    Synth::new(core as u64 + 1, SynthConfig::default()).with_base(base_packet()),
                )),
                Some(p) => Feed::Replay {
                    packets: p.clone(),
                    next: core * p.len() / cores,
                },
            };
            let stop = stop.clone();
            let clock = clock.clone();
            let t = spawn_worker(&engine, core, "vallum-core", move |worker| {
                let mut packets = [PacketMeta::default(); BATCH];
                let mut verdicts = [Verdict::Accept; BATCH];
                let start = Instant::now();
                let mut sent: u64 = 0;
                // Relaxed: the flag only asks the loop to end; nothing is published with it.
                while !stop.load(Ordering::Relaxed) {
                    feed.fill(&mut packets);
                    worker.process_batch(&mut packets, &mut verdicts, clock.now_ns());
                    // LOG events have no consumer yet (issue: log sink); drop them.
                    worker.drain_log_records().for_each(drop);
                    sent += BATCH as u64;
                    if per_core > 0 {
                        let due = Duration::from_secs_f64(sent as f64 / per_core as f64);
                        if let Some(wait) = due.checked_sub(start.elapsed()) {
                            std::thread::sleep(wait.min(Duration::from_millis(100)));
                        }
                    }
                }
            })?;
            threads.push(t);
        }
        Ok(Sources { stop, threads })
    }

    /// Stops every thread after its current batch (NFQUEUE: within 100 ms) and joins them.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts thread `{name}-{core}`, which claims `core` of `engine` and runs `body` with it (a
/// core that cannot be claimed is reported on stderr and the thread ends).
///
/// Errors: [`Error::Internal`] when the thread cannot be spawned.
fn spawn_worker(
    engine: &Arc<Engine>,
    core: usize,
    name: &str,
    body: impl FnOnce(&mut EngineWorker<'_>) + Send + 'static,
) -> Result<JoinHandle<()>> {
    let engine = engine.clone();
    std::thread::Builder::new()
        .name(format!("{name}-{core}"))
        .spawn(move || match engine.worker(core) {
            Ok(mut w) => body(&mut w),
            Err(e) => tracing::error!(core, error = %e, "cannot claim the core"),
        })
        .map_err(|e| Error::Internal(format!("spawn core {core}: {e}")))
}

/// Binds NFQUEUE `q.first + k` for every core k, then starts the workers.
#[cfg(target_os = "linux")]
fn start_nfqueue(
    engine: Arc<Engine>,
    q: NfqueueSource,
    clock: Arc<dyn Clock>,
    stop: Arc<AtomicBool>,
) -> Result<Sources> {
    let cores = engine.cores();
    let first = usize::from(q.first);
    if first + cores - 1 > usize::from(u16::MAX) {
        return Err(Error::Startup {
            code: "NFQUEUE_OPEN",
            message: format!(
                "NFQUEUE {first}..{}: queue numbers end at 65535 (lower the first queue or --cores)",
                first + cores - 1
            ),
        });
    }
    let mut queues = Vec::with_capacity(cores);
    for k in 0..cores {
        let num = (first + k) as u16;
        let queue = nfqueue::Queue::open(num, !q.fail_closed).map_err(|e| Error::Startup {
            code: "NFQUEUE_OPEN",
            message: e.to_string(),
        })?;
        if k == 0 && !queue.kernel_conntrack() {
            tracing::warn!(
                queue = num,
                "the kernel does not hand over its conntrack entries (NFQA_CFG_F_CONNTRACK \
                 refused: no nf_conntrack_netlink), so --ctstate SNAT and DNAT never match"
            );
        }
        queues.push(queue);
    }
    let mut threads = Vec::with_capacity(cores);
    for (core, mut queue) in queues.into_iter().enumerate() {
        let stop = stop.clone();
        let clock = clock.clone();
        threads.push(spawn_worker(&engine, core, "vallum-nfq", move |worker| {
            nfqueue::run_worker(&mut queue, worker, &stop, &*clock);
        })?);
    }
    Ok(Sources { stop, threads })
}

/// NFQUEUE is a Linux interface.
#[cfg(not(target_os = "linux"))]
fn start_nfqueue(
    _engine: Arc<Engine>,
    _q: NfqueueSource,
    _clock: Arc<dyn Clock>,
    _stop: Arc<AtomicBool>,
) -> Result<Sources> {
    Err(Error::Startup {
        code: "NFQUEUE_UNSUPPORTED",
        message: "--source nfqueue needs Linux (nfnetlink_queue)".to_owned(),
    })
}
