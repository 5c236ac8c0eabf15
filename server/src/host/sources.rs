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
//! `--worker-nice` (default 10) runs every worker thread that many nice steps below the rest
//! of vallumd (`lower_priority`), so the control plane (gRPC, the commit's compile and store
//! threads) is not starved when the workers decide packets on every core.
//! [`Sources::stop`] asks every thread to finish its batch and joins them.
//!
//! After each batch a core drains its `-j LOG` ring and, when a subscriber asks for them,
//! samples its dropped packets ([`Drain::after_batch`]), and hands the events to
//! [`Events::offer`] without waiting (crate::telemetry::events).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vallum_engine::Clock;
use vallum_engine::engine::{Engine, EngineWorker, LogDrops};
use vallum_engine::packet::pcap::read_capture;
use vallum_engine::packet::synth::{Synth, SynthConfig};
use vallum_engine::packet::{IfName, Packet, PacketFacts, PacketMeta};
use vallum_engine::snapshot::Verdict;

use crate::config::{NfqueueAccept, NfqueueAnswers, NfqueueSource, Source};
use crate::error::{Error, Result};
use crate::telemetry::events::{Events, PacketEvent};

pub mod nfqueue;

/// Packets per batch (one generation round trip each).
pub const BATCH: usize = 32;

/// Running source threads.
#[derive(Debug)]
pub struct Sources {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// With `nfqueue`, each bound queue's counters, in queue order; empty otherwise.
    queues: Vec<Arc<crate::host::nfqueue_stats::QueueCounters>>,
}

enum Feed {
    // Boxed: the generator holds its flows inline, the replay only a pointer.
    Synthetic(Box<Synth>),
    Replay { packets: Arc<[Packet]>, next: usize },
}

impl Feed {
    /// Fills a batch: `out[i]` and its facts `facts[i]` (the synthetic packets all have
    /// [`base_packet`]'s).
    fn fill(&mut self, out: &mut [PacketMeta], facts: &mut [PacketFacts]) {
        match self {
            Feed::Synthetic(s) => out.iter_mut().for_each(|p| *p = s.next_meta()),
            Feed::Replay { packets, next } => {
                for (p, f) in out.iter_mut().zip(facts.iter_mut()) {
                    (*p, *f) = (packets[*next].meta, packets[*next].facts);
                    *next = (*next + 1) % packets.len();
                }
            }
        }
    }
}

/// The packet every source starts from: INPUT hook, input interface `eth0`.
pub fn base_packet() -> Packet {
    Packet {
        meta: PacketMeta::default(),
        facts: PacketFacts {
            in_iface: IfName::new("eth0").unwrap_or_default(),
            ..PacketFacts::default()
        },
    }
}

impl Sources {
    /// Starts the threads of `source` on every core of `engine`; `answers` is what an NFQUEUE
    /// worker sends for ACCEPT and REJECT (`--nfqueue-mode`, `--nfqueue-reject-mark`).
    ///
    /// Errors: [`Error::Io`] when a pcap file cannot be read or a thread cannot be spawned,
    /// [`Error::Startup`] (`PCAP_INVALID`) when the file is not a capture or holds no IP
    /// packet.
    pub fn start(
        engine: Arc<Engine>,
        source: &Source,
        rate: u64,
        clock: Arc<dyn Clock>,
        events: Events,
        answers: NfqueueAnswers,
        nice: i32,
    ) -> Result<Sources> {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = engine.cores();
        let replay: Option<Arc<[Packet]>> = match source {
            Source::None => {
                return Ok(Sources {
                    stop,
                    threads: Vec::new(),
                    queues: Vec::new(),
                });
            }
            Source::Synthetic => None,
            Source::Nfqueue(q) => {
                return start_nfqueue(engine, *q, answers, clock, stop, events, nice);
            }
            Source::Pcap(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
                let caps = read_capture(&bytes).map_err(|e| Error::Startup {
                    code: "PCAP_INVALID",
                    message: format!("{}: {e}", path.display()),
                })?;
                let metas: Vec<Packet> = caps
                    .iter()
                    .filter_map(|c| c.parse(base_packet()).ok())
                    .collect();
                if metas.is_empty() {
                    return Err(Error::Startup {
                        code: "PCAP_INVALID",
                        message: format!("{}: no IP packet", path.display()),
                    });
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
                    Synth::new(core as u64 + 1, SynthConfig::default())
                        .with_base(base_packet().meta),
                )),
                Some(p) => Feed::Replay {
                    packets: p.clone(),
                    next: core * p.len() / cores,
                },
            };
            let stop = stop.clone();
            let clock = clock.clone();
            let events = events.clone();
            let t = spawn_worker(&engine, core, "vallum-core", nice, move |worker| {
                let mut drain = Drain::default();
                let mut packets = [PacketMeta::default(); BATCH];
                let mut facts = [base_packet().facts; BATCH];
                let mut verdicts = [Verdict::Accept; BATCH];
                // Pacing against real sleeps (`thread::sleep` below), so real time: a packet
                // source's I/O edge, not the injected clock (which a test may hold still).
                let start = Instant::now();
                let mut sent: u64 = 0;
                // Relaxed: the flag only asks the loop to end; nothing is published with it.
                while !stop.load(Ordering::Relaxed) {
                    feed.fill(&mut packets, &mut facts);
                    let batch = vallum_engine::engine::Batch {
                        facts: &mut facts,
                        ..vallum_engine::engine::Batch::new(&mut packets, &mut verdicts)
                    };
                    worker.process(batch, clock.now_ns());
                    drain.after_batch(worker, &events, &packets, &facts, &verdicts, &[]);
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
        Ok(Sources {
            stop,
            threads,
            queues: Vec::new(),
        })
    }

    /// The counters of the bound NFQUEUE queues (empty for the other sources), for
    /// [`crate::telemetry::metrics::Metrics::observe_nfqueue`].
    pub fn nfqueue_counters(&self) -> Vec<Arc<crate::host::nfqueue_stats::QueueCounters>> {
        self.queues.clone()
    }

    /// Stops every thread after its current batch (NFQUEUE: within 100 ms) and joins them; a
    /// thread that panicked is logged with its panic message.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let name = t.thread().name().unwrap_or("packet worker").to_string();
            if let Err(panic) = t.join() {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(thread = %name, panic = %what, "packet worker thread panicked");
            }
        }
    }
}

/// Starts thread `{name}-{core}` at `nice` ([`lower_priority`]), which claims `core` of
/// `engine` and runs `body` with it (a core that cannot be claimed is reported on stderr and
/// the thread ends).
///
/// Errors: [`Error::Io`] when the thread cannot be spawned.
fn spawn_worker(
    engine: &Arc<Engine>,
    core: usize,
    name: &str,
    nice: i32,
    body: impl FnOnce(&mut EngineWorker<'_>) + Send + 'static,
) -> Result<JoinHandle<()>> {
    let engine = engine.clone();
    std::thread::Builder::new()
        .name(format!("{name}-{core}"))
        .spawn(move || {
            lower_priority(core, nice);
            match engine.worker(core) {
                Ok(mut w) => body(&mut w),
                Err(e) => tracing::error!(core, error = %e, "cannot claim the core"),
            }
        })
        .map_err(|e| Error::io(format!("spawn core {core}"), e))
}

/// Lowers the calling thread's priority by `steps` nice steps (0..=19; 0 leaves it) below the
/// nice it inherited from vallumd (at most nice 19): on Linux nice is per thread
/// (`setpriority(PRIO_PROCESS, gettid())`, sched(7)), a new thread starts with its creator's,
/// and a lower priority needs no privilege. Under the CFS scheduler a worker 10 steps below
/// weighs 110 against the 1024 of a control-plane thread, so one that wakes on a busy core runs
/// almost at once and takes ~90% of it while it has work; with nothing else to run the worker
/// still gets the whole core. A failure is logged (the worker runs at its inherited priority).
#[cfg(target_os = "linux")]
fn lower_priority(core: usize, steps: i32) {
    if steps == 0 {
        return;
    }
    // SAFETY: gettid(2), getpriority(2) and setpriority(2) take and return plain integers and
    // touch no memory of this process; `__errno_location` is this thread's errno, which
    // getpriority's -1 (a valid nice) needs cleared before the call to be told from an error;
    // setpriority on our own thread id changes only this thread.
    let rc = unsafe {
        let tid = libc::gettid() as libc::id_t;
        *libc::__errno_location() = 0;
        let own = libc::getpriority(libc::PRIO_PROCESS, tid);
        if own == -1 && *libc::__errno_location() != 0 {
            -1
        } else {
            libc::setpriority(libc::PRIO_PROCESS, tid, (own + steps).min(19))
        }
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(core, steps, error = %e, "cannot lower the worker's priority");
    }
}

/// Elsewhere the workers run at the inherited priority.
#[cfg(not(target_os = "linux"))]
fn lower_priority(_core: usize, _nice: i32) {}

/// Binds NFQUEUE `q.first + k` for every core k, then starts the workers.
///
/// Errors: [`Error::Startup`] when a queue cannot be bound, or the continue bit lies inside
/// the reject field.
#[cfg(target_os = "linux")]
fn start_nfqueue(
    engine: Arc<Engine>,
    q: NfqueueSource,
    answers: NfqueueAnswers,
    clock: Arc<dyn Clock>,
    stop: Arc<AtomicBool>,
    events: Events,
    nice: i32,
) -> Result<Sources> {
    let cores = engine.cores();
    if let NfqueueAccept::Continue { mark } = answers.accept {
        if mark & answers.reject_mark != 0 {
            return Err(Error::Startup {
                code: "NFQUEUE_OPEN",
                message: format!(
                    "--nfqueue-mark {mark:#x} lies inside --nfqueue-reject-mark {:#x}: pick \
                     bits that do not overlap (and the same for vallumctl dataplane install \
                     --mark / --reject-mark)",
                    answers.reject_mark
                ),
            });
        }
    }
    let continue_bit = match answers.accept {
        NfqueueAccept::Continue { mark } => mark,
        NfqueueAccept::Final => 0,
    };
    if answers.facts_mark & (answers.reject_mark | continue_bit) != 0 {
        return Err(Error::Startup {
            code: "NFQUEUE_OPEN",
            message: format!(
                "--nfqueue-facts-mark {:#x} overlaps --nfqueue-reject-mark {:#x} or the \
                 continue bit {continue_bit:#x}: pick bits that do not overlap",
                answers.facts_mark, answers.reject_mark
            ),
        });
    }
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
        let queue = nfqueue::Queue::open_with(num, !q.fail_closed, q.maxlen)
            .map_err(|e| Error::Startup {
                code: "NFQUEUE_OPEN",
                message: e.to_string(),
            })?
            .with_accept(answers.accept)
            .with_reject_mark(answers.reject_mark)
            .with_facts_mark(answers.facts_mark)
            .with_batch_delay(q.batch_delay);
        let c = queue.counters();
        if k == 0 && !c.bypass_exact(BATCH as u32) {
            tracing::warn!(
                queue = num,
                maxlen = c.maxlen,
                exact_from = crate::host::nfqueue_stats::auto_maxlen(c.rcvbuf, BATCH as u32),
                "fail-open with a short queue: packets accepted because the queue is full are \
                 counted nowhere, so vallum_nfqueue_bypassed_total is a lower bound (raise \
                 --queue-maxlen, or use fail-closed)"
            );
        }
        if k == 0 && !queue.kernel_conntrack() && answers.facts_mark != 0 {
            tracing::info!(
                queue = num,
                "the kernel does not hand over its conntrack entries (NFQA_CFG_F_CONNTRACK \
                 refused); --ctstate SNAT/DNAT, --ctstatus and --ctorig*/--ctrepl* are decided by \
                 the steering's facts chains (--nfqueue-facts-mark)"
            );
        } else if k == 0 && !queue.kernel_conntrack() {
            tracing::warn!(
                queue = num,
                "the kernel does not hand over its conntrack entries (NFQA_CFG_F_CONNTRACK \
                 refused: a kernel without CONFIG_NETFILTER_NETLINK_GLUE_CT, or no \
                 nf_conntrack_netlink), so --ctstate SNAT and DNAT never match and \
                 --ctorigdst/--ctorigdstport read the translated destination (unless \
                 --nfqueue-facts-mark hands the kernel's decisions)"
            );
        }
        queues.push(queue);
    }
    let counters = queues.iter().map(|q| q.counters()).collect();
    let mut threads = Vec::with_capacity(cores);
    for (core, mut queue) in queues.into_iter().enumerate() {
        let stop = stop.clone();
        let clock = clock.clone();
        let events = events.clone();
        threads.push(spawn_worker(
            &engine,
            core,
            "vallum-nfq",
            nice,
            move |worker| {
                nfqueue::run_worker(&mut queue, worker, &stop, &*clock, &events);
            },
        )?);
    }
    Ok(Sources {
        stop,
        threads,
        queues: counters,
    })
}

/// NFQUEUE is a Linux interface.
#[cfg(not(target_os = "linux"))]
fn start_nfqueue(
    _engine: Arc<Engine>,
    _q: NfqueueSource,
    _answers: NfqueueAnswers,
    _clock: Arc<dyn Clock>,
    _stop: Arc<AtomicBool>,
    _events: Events,
    _nice: i32,
) -> Result<Sources> {
    Err(Error::Startup {
        code: "NFQUEUE_UNSUPPORTED",
        message: "--source nfqueue needs Linux (nfnetlink_queue)".to_owned(),
    })
}

/// One core's side of the packet events: after each batch, its `-j LOG` hits and (when a
/// subscriber asks, [`Events::sample_one_in`]) one in N of its dropped packets, rate-limited
/// by [`Events::take_sample_token`].
#[derive(Debug, Default)]
pub struct Drain {
    /// Dropped packets seen while sampling was on.
    drops_seen: u64,
    /// The worker's LOG hits lost so far, as already added to [`Events::drops`].
    log_drops: LogDrops,
}

impl Drain {
    /// Drains `worker`'s LOG ring, samples the drops of the batch just classified
    /// (`packets[i]`, with the facts `facts[i]` when the source has them, got `verdicts[i]`)
    /// and offers the events to `events` (never waits).
    /// `headers[i]`, when the source has it, is `packets[i]` from its IP header on, for the
    /// kernel-format line; a LOG hit is paired with the first packet of the batch, from the
    /// previous hit's on, with its addresses, ports, protocol and length. Allocates only when
    /// there is an event. The LOG hits the worker lost (ring full, stale) since the last
    /// batch are added to [`Events::drops`].
    pub fn after_batch(
        &mut self,
        worker: &mut EngineWorker<'_>,
        events: &Events,
        packets: &[PacketMeta],
        facts: &[PacketFacts],
        verdicts: &[Verdict],
        headers: &[&[u8]],
    ) {
        let logs = worker.drain_logs();
        let lost = worker.log_drops();
        if lost != self.log_drops {
            let d = events.drops();
            // Relaxed: counters read at scrape; nothing is ordered against them.
            d.ring_full
                .fetch_add(lost.full - self.log_drops.full, Ordering::Relaxed);
            d.stale
                .fetch_add(lost.stale - self.log_drops.stale, Ordering::Relaxed);
            self.log_drops = lost;
        }
        let one_in = u64::from(events.sample_one_in());
        if logs.is_empty() && one_in == 0 {
            return;
        }
        let mut out = Vec::with_capacity(logs.len());
        let time = events.clock().system_time();
        let mut cursor = 0;
        for log in logs {
            let found = packets[cursor.min(packets.len())..]
                .iter()
                .position(|p| same_packet(p, &log.packet.meta))
                .map(|i| cursor + i);
            let header = found.and_then(|i| headers.get(i).copied());
            if let Some(i) = found {
                cursor = i;
            }
            out.push(PacketEvent::log(log, header, time));
        }
        if one_in != 0 {
            for (i, (p, v)) in packets.iter().zip(verdicts).enumerate() {
                if matches!(v, Verdict::Accept) {
                    continue;
                }
                self.drops_seen += 1;
                if self.drops_seen % one_in == 0 && events.take_sample_token() {
                    let facts = facts.get(i).copied().unwrap_or_default();
                    let packet = Packet { meta: *p, facts };
                    out.push(PacketEvent::dropped(packet, headers.get(i).copied(), time));
                }
            }
        }
        events.offer(out);
    }
}

/// Whether a LOG hit's packet copy is `p` (the fields a rule cannot change).
fn same_packet(p: &PacketMeta, q: &PacketMeta) -> bool {
    p.src == q.src
        && p.dst == q.dst
        && p.protocol == q.protocol
        && p.sport == q.sport
        && p.dport == q.dport
        && p.len == q.len
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use vallum_engine::dataplane::BarrierStrategy;
    use vallum_engine::engine::{Change, Engine, EngineConfig, LOG_RING_CAPACITY};
    use vallum_engine::model::{Family, Hook};
    use vallum_engine::packet::PacketMeta;
    use vallum_engine::restore::{ParseOptions, parse_ruleset};
    use vallum_engine::sets::NoSets;
    use vallum_engine::snapshot::Verdict;

    use super::Drain;
    use crate::telemetry::events::Events;
    use crate::telemetry::metrics::{Metrics, MetricsConfig};

    struct Zero;

    impl vallum_engine::Clock for Zero {
        fn now_ns(&self) -> u64 {
            0
        }
    }

    const LOGGING: &str = "*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp --dport 22 -j LOG --log-prefix \"ssh: \"
COMMIT
";

    fn ssh() -> PacketMeta {
        PacketMeta {
            family: Family::Ipv4,
            hook: Hook::Input,
            src: Ipv4Addr::new(10, 0, 0, 1).into(),
            dst: Ipv4Addr::new(10, 0, 0, 2).into(),
            protocol: 6,
            sport: 40000,
            dport: 22,
            len: 60,
            ..PacketMeta::default()
        }
    }

    /// A batch with more LOG hits than a core's ring holds: the hits it lost reach
    /// `vallum_packet_events_dropped_total{reason="ring_full"}`, counted once.
    #[test]
    fn a_full_log_ring_is_counted_in_the_events_drops() {
        let engine = Engine::new(
            EngineConfig {
                cores: 1,
                barrier: BarrierStrategy::SeqCst,
                conntrack: None,
            },
            Arc::new(Zero),
        );
        let rs = parse_ruleset("web", LOGGING, &ParseOptions::default()).unwrap();
        drop(engine.commit(Change::Put(rs), &NoSets).unwrap().retired);
        let events = Events::start(crate::clock::Clock::system()).unwrap();
        let metrics = Metrics::new(&MetricsConfig::default()).unwrap();
        metrics.observe_events(events.clone());

        let over = 10;
        let mut packets = vec![ssh(); LOG_RING_CAPACITY + over];
        let mut verdicts = vec![Verdict::Drop; packets.len()];
        let mut worker = engine.worker(0).unwrap();
        let mut drain = Drain::default();
        worker.process_batch(&mut packets, &mut verdicts, 1);
        drain.after_batch(&mut worker, &events, &packets, &[], &verdicts, &[]);
        assert_eq!(
            events.drops().ring_full.load(Ordering::Relaxed),
            over as u64
        );

        // A batch within the ring's capacity loses nothing more; nothing is counted twice.
        let mut few = vec![ssh(); 3];
        let mut few_verdicts = vec![Verdict::Drop; 3];
        worker.process_batch(&mut few, &mut few_verdicts, 2);
        drain.after_batch(&mut worker, &events, &few, &[], &few_verdicts, &[]);
        assert_eq!(
            events.drops().ring_full.load(Ordering::Relaxed),
            over as u64
        );
        assert_eq!(events.drops().stale.load(Ordering::Relaxed), 0);

        let text = metrics.render().unwrap();
        assert!(
            text.contains(&format!(
                "vallum_packet_events_dropped_total{{reason=\"ring_full\"}} {over}\n"
            )),
            "{text}"
        );
        assert!(
            text.contains("vallum_packet_events_dropped_total{reason=\"stale\"} 0\n"),
            "{text}"
        );
    }
}
