//! Packet events: the `-j LOG` hits the packet cores drain from their rings, and sampled
//! dropped packets, on their way to the process log and to `WatchPacketEvents` subscribers.
//!
//! Path: a packet core drains its ring after a batch ([`EngineWorker::drain_logs`], only when
//! it holds hits; hits beyond the ring's capacity in one batch, and hits a commit made
//! unnameable, are counted as `reason="ring_full"` and `reason="stale"`) and hands the batch to [`Events::offer`], a `try_send` into a bounded queue
//! ([`QUEUE_BATCHES`] batches): the core never waits; a batch that finds the queue full is
//! counted (`vallum_packet_events_dropped_total{reason="queue_full"}`) and lost. One thread
//! (`vallum-events`) takes the batches, writes each LOG hit to the process log in the
//! kernel's format ([`kernel_line`], through `tracing`, target `vallum::packet_log`, at the
//! rule's `--log-level`) and hands each event to every subscriber whose filter it passes, a
//! `try_send` into the subscriber's own bounded channel ([`SUBSCRIBER_EVENTS`]); a full
//! channel loses the event (`reason="slow_subscriber"`, and the subscriber's next event says
//! how many it lost).
//!
//! Sampled drops (`Sampler`): with a subscriber asking for them, each core takes one in N
//! of its dropped packets (N the smallest any subscriber asked for, at least
//! [`SAMPLE_FLOOR`]), at most [`SAMPLE_RATE`] a second over all cores (a token bucket),
//! without any LOG rule.
//!
//! [`EngineWorker::drain_logs`]: vallum_engine::engine::EngineWorker::drain_logs

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use vallum_engine::model::{Family, IpNet, TableKind};
use vallum_engine::packet::{Packet, PacketMeta};
use vallum_engine::snapshot::LogEvent;

/// Batches the packet cores may have queued for the events thread.
pub const QUEUE_BATCHES: usize = 256;
/// Events a subscriber may have waiting before it loses the next ones.
pub const SUBSCRIBER_EVENTS: usize = 1024;
/// Bytes of a packet (from its IP header) kept with an event, for the kernel-format line.
pub const HEADER_BYTES: usize = 128;
/// The smallest N of "1 in N dropped packets" a subscriber gets.
pub const SAMPLE_FLOOR: u32 = 100;
/// Most sampled drops a second, over all cores and subscribers.
pub const SAMPLE_RATE: u64 = 100;

/// What an event stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A `-j LOG` hit.
    Log,
    /// A sampled dropped packet.
    Drop,
    /// A sampled packet the running shadow would decide differently
    /// ([`vallum_engine::engine::Engine::drain_shadow_samples`]); sent only to subscribers
    /// that ask for this kind.
    Shadow,
}

impl Kind {
    /// `LOG`, `DROP` or `SHADOW` (the API's `PacketEvent.kind`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Log => "LOG",
            Kind::Drop => "DROP",
            Kind::Shadow => "SHADOW",
        }
    }
}

/// One packet event.
#[derive(Clone, Debug)]
pub struct PacketEvent {
    /// LOG hit or sampled drop.
    pub kind: Kind,
    /// When the core drained it (wall clock).
    pub time: SystemTime,
    /// The LOG rule (for a sampled drop: the packet only, with ruleset and chain empty).
    pub log: LogEvent,
    /// The packet's first bytes from its IP header ([`HEADER_BYTES`] at most), when the
    /// source has them (NFQUEUE): [`kernel_line`] reads ID, DF, WINDOW... from them.
    pub header: Option<Box<[u8]>>,
}

impl PacketEvent {
    /// A `-j LOG` hit drained at `time` (the [`Events`] clock's, read once per batch).
    pub fn log(log: LogEvent, header: Option<&[u8]>, time: SystemTime) -> PacketEvent {
        PacketEvent {
            kind: Kind::Log,
            time,
            log,
            header: header.map(|h| h[..h.len().min(HEADER_BYTES)].into()),
        }
    }

    /// A sampled dropped packet (no rule: ruleset and chain empty, rule 0), seen at `time`.
    pub fn dropped(packet: Packet, header: Option<&[u8]>, time: SystemTime) -> PacketEvent {
        let log = LogEvent {
            ruleset: Arc::from(""),
            table: TableKind::Filter,
            chain: Arc::from(""),
            rule: 0,
            prefix: None,
            level: 4,
            nflog_group: None,
            packet,
        };
        PacketEvent {
            kind: Kind::Drop,
            ..PacketEvent::log(log, header, time)
        }
    }

    /// A shadow's sampled differing packet of ruleset `ruleset` (chain empty, rule 0), its
    /// line prefixed `shadow ACTIVE->SHADOW: `, seen at `time`.
    pub fn shadow(
        sample: &vallum_engine::engine::ShadowSample,
        ruleset: &str,
        time: SystemTime,
    ) -> PacketEvent {
        let log = LogEvent {
            ruleset: Arc::from(ruleset),
            table: TableKind::Filter,
            chain: Arc::from(""),
            rule: 0,
            prefix: Some(Arc::from(format!(
                "shadow {}->{}: ",
                sample.active.name(),
                sample.shadow.name()
            ))),
            level: 4,
            nflog_group: None,
            packet: sample.packet,
        };
        PacketEvent {
            kind: Kind::Shadow,
            ..PacketEvent::log(log, None, time)
        }
    }

    /// The packet in the kernel's LOG format ([`kernel_line`]).
    pub fn line(&self) -> String {
        kernel_line(&self.log, self.header.as_deref())
    }
}

/// What a subscriber wants ([`vallum_proto::v1::WatchPacketEventsRequest`], checked).
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this ruleset's LOG hits.
    pub ruleset: Option<String>,
    /// Only LOG hits of rules in this chain.
    pub chain: Option<String>,
    /// Only this kind.
    pub kind: Option<Kind>,
    /// Only packets from or to this network.
    pub address: Option<IpNet>,
    /// Sampled drops: 1 in N (already raised to [`SAMPLE_FLOOR`]); `None`: none.
    pub sample_one_in: Option<u32>,
}

impl Filter {
    /// Whether `e` passes.
    pub fn admits(&self, e: &PacketEvent) -> bool {
        let p = &e.log.packet;
        match e.kind {
            Kind::Drop if self.sample_one_in.is_none() => return false,
            Kind::Shadow if self.kind != Some(Kind::Shadow) => return false,
            _ => {}
        }
        self.kind.is_none_or(|k| k == e.kind)
            && self
                .ruleset
                .as_deref()
                .is_none_or(|r| e.kind != Kind::Drop && *e.log.ruleset == *r)
            && self
                .chain
                .as_deref()
                .is_none_or(|c| e.kind == Kind::Log && *e.log.chain == *c)
            && self
                .address
                .is_none_or(|n| n.contains(p.src) || n.contains(p.dst))
    }
}

/// An event as a subscriber gets it: shared with the other subscribers, and how many events
/// the subscriber lost just before it.
#[derive(Clone, Debug)]
pub struct Delivered {
    /// The event.
    pub event: Arc<PacketEvent>,
    /// Events lost (channel full) since the previous delivered one.
    pub lost_before: u64,
}

struct Subscriber {
    id: u64,
    filter: Filter,
    tx: tokio::sync::mpsc::Sender<Delivered>,
    lost: u64,
}

/// Events lost, by why.
#[derive(Debug, Default)]
pub struct EventDrops {
    /// A `-j LOG` hit found its core's ring full (more hits in one batch than the ring
    /// holds; the engine's [`LogDrops::full`], summed over the cores).
    ///
    /// [`LogDrops::full`]: vallum_engine::engine::LogDrops::full
    pub ring_full: AtomicU64,
    /// A commit replaced the snapshot of a `-j LOG` hit before its core drained it, so its
    /// rule could not be named ([`LogDrops::stale`], summed over the cores).
    ///
    /// [`LogDrops::stale`]: vallum_engine::engine::LogDrops::stale
    pub stale: AtomicU64,
    /// A batch found the events thread's queue full.
    pub queue_full: AtomicU64,
    /// A subscriber's channel was full.
    pub slow_subscriber: AtomicU64,
}

/// Where packet cores hand their events; see the module docs. Cheap to clone.
#[derive(Clone)]
pub struct Events {
    inner: Arc<Inner>,
}

struct Inner {
    tx: std::sync::mpsc::SyncSender<Vec<PacketEvent>>,
    subscribers: Mutex<Vec<Subscriber>>,
    next_id: AtomicU64,
    drops: EventDrops,
    /// 0: no subscriber asks for samples; else the smallest N asked.
    sample_one_in: AtomicU32,
    sample_bucket: Mutex<Bucket>,
    /// The clock of event times and of the sample budget's refill.
    clock: crate::clock::Clock,
}

struct Bucket {
    tokens: u64,
    at: std::time::Instant,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("drops", &self.inner.drops)
            .finish_non_exhaustive()
    }
}

impl Events {
    /// Starts the events thread (`vallum-events`); it ends when the last [`Events`] clone is
    /// dropped. Event times and the sample budget are read on `clock`.
    ///
    /// Errors: the thread cannot be spawned.
    pub fn start(clock: crate::clock::Clock) -> std::io::Result<Events> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<PacketEvent>>(QUEUE_BATCHES);
        let inner = Arc::new(Inner {
            tx,
            subscribers: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            drops: EventDrops::default(),
            sample_one_in: AtomicU32::new(0),
            sample_bucket: Mutex::new(Bucket {
                tokens: SAMPLE_RATE,
                at: clock.now(),
            }),
            clock,
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("vallum-events".to_owned())
            .spawn(move || {
                // Ends when every sender (in `Inner`) is gone.
                while let Ok(batch) = rx.recv() {
                    let Some(inner) = weak.upgrade() else { break };
                    inner.dispatch(batch);
                }
            })?;
        Ok(Events { inner })
    }

    /// Hands a core's batch over without waiting: when the queue is full the batch is lost
    /// and counted in [`EventDrops::queue_full`].
    pub fn offer(&self, batch: Vec<PacketEvent>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        if self.inner.tx.try_send(batch).is_err() {
            self.inner.drops.queue_full.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Events lost so far.
    pub fn drops(&self) -> &EventDrops {
        &self.inner.drops
    }

    /// The clock event times are read on.
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.inner.clock
    }

    /// A new subscriber: its events arrive on the receiver until it is dropped.
    pub fn subscribe(&self, filter: Filter) -> Subscription {
        let (tx, rx) = tokio::sync::mpsc::channel(SUBSCRIBER_EVENTS);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut subs = self.inner.lock();
        subs.push(Subscriber {
            id,
            filter,
            tx,
            lost: 0,
        });
        self.inner.resample(&subs);
        Subscription {
            rx,
            events: self.clone(),
            id,
        }
    }

    /// The N of "1 in N dropped packets" the cores should sample now (0: none). One
    /// Relaxed load: the packet cores read it once a batch.
    #[inline]
    pub fn sample_one_in(&self) -> u32 {
        self.inner.sample_one_in.load(Ordering::Relaxed)
    }

    /// Takes one token of the global sample budget ([`SAMPLE_RATE`] a second); false when
    /// it is spent. Off the per-packet path: a core calls it for a packet it chose to sample.
    pub fn take_sample_token(&self) -> bool {
        let mut b = self
            .inner
            .sample_bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.inner.clock.now();
        let refill = now.duration_since(b.at).as_millis() as u64 * SAMPLE_RATE / 1000;
        if refill > 0 {
            b.tokens = (b.tokens + refill).min(SAMPLE_RATE);
            b.at = now;
        }
        if b.tokens == 0 {
            return false;
        }
        b.tokens -= 1;
        true
    }
}

/// One subscriber's events ([`Events::subscribe`]); unsubscribes when dropped.
#[derive(Debug)]
pub struct Subscription {
    /// The events, in the order the cores drained them (per core).
    pub rx: tokio::sync::mpsc::Receiver<Delivered>,
    events: Events,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subs = self.events.inner.lock();
        subs.retain(|s| s.id != self.id);
        self.events.inner.resample(&subs);
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Subscriber>> {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn resample(&self, subs: &[Subscriber]) {
        let n = subs
            .iter()
            .filter_map(|s| s.filter.sample_one_in)
            .min()
            .unwrap_or(0);
        self.sample_one_in.store(n, Ordering::Relaxed);
    }

    fn dispatch(&self, batch: Vec<PacketEvent>) {
        for e in batch {
            // As the kernel: LOG writes the line to the log, NFLOG only to its group (here:
            // the stream).
            if e.kind == Kind::Log && e.log.nflog_group.is_none() {
                log_line(e.log.level, &e.line());
            }
            let e = Arc::new(e);
            let mut subs = self.lock();
            subs.retain_mut(|s| {
                if !s.filter.admits(&e) {
                    return true;
                }
                let d = Delivered {
                    event: e.clone(),
                    lost_before: s.lost,
                };
                match s.tx.try_send(d) {
                    Ok(()) => {
                        s.lost = 0;
                        true
                    }
                    Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                        s.lost += 1;
                        self.drops.slow_subscriber.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => false,
                }
            });
        }
    }
}

/// Writes one kernel-format line to the process log at the syslog `level` (0..=3 ERROR,
/// 4 WARN, 5 and 6 INFO, 7 DEBUG), target `vallum::packet_log`, the line as the message and
/// nothing else, so that a parser of the kernel's lines (fail2ban, logwatch) finds them.
pub fn log_line(level: u8, line: &str) {
    match level {
        0..=3 => tracing::error!(target: "vallum::packet_log", "{line}"),
        4 => tracing::warn!(target: "vallum::packet_log", "{line}"),
        5 | 6 => tracing::info!(target: "vallum::packet_log", "{line}"),
        _ => tracing::debug!(target: "vallum::packet_log", "{line}"),
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// `%pI6`: all eight groups, four hex digits each (the kernel's LOG does not compress).
fn ipv6_full(a: &Ipv6Addr) -> String {
    let mut s = String::with_capacity(39);
    for (i, g) in a.segments().iter().enumerate() {
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{g:04x}");
    }
    s
}

/// The packet of `e` as the kernel's `-j LOG` writes it (net/netfilter/nf_log_syslog.c,
/// without the options `--log-tcp-sequence`, `--log-tcp-options`, `--log-ip-options`,
/// `--log-uid`, `--log-macdecode`): the prefix, `IN= OUT=`, `MAC=` (for a packet with an
/// input interface: destination, source, EtherType; the destination is not known to
/// Vallum and is written as the input interface's own address (SIOCGIFHWADDR, one call per
/// line), zeros when it is not known; loopback: all zeros, as the kernel), then for IPv4 `SRC= DST= LEN= TOS= PREC=
/// TTL= ID=` and `CE DF MF FRAG:`, for IPv6 `SRC= DST=` (uncompressed) `LEN= TC= HOPLIMIT=
/// FLOWLBL=` and `FRAG:`, then the transport (`PROTO=TCP SPT= DPT= WINDOW= RES= flags URGP=`,
/// `PROTO=UDP SPT= DPT= LEN=`, `PROTO=ICMP TYPE= CODE=` with `ID= SEQ=` / the quoted header
/// of an error in brackets / `MTU=`, `PROTO=AH|ESP SPI=`, else `PROTO=n`) and `MARK=0x..`
/// when the mark is set; every field ends with a space, as the kernel's.
///
/// `header` is the packet from its IP header on; without it (the pcap and synthetic
/// sources), the fields the engine does not keep are written as 0 (ID, FLOWLBL, WINDOW, RES,
/// URGP) or left out (DF, MF, FRAG).
pub fn kernel_line(e: &LogEvent, header: Option<&[u8]>) -> String {
    let p = &e.packet;
    let mut s = String::with_capacity(256);
    if let Some(prefix) = &e.prefix {
        s.push_str(prefix);
    }
    let _ = write!(
        s,
        "IN={} OUT={} ",
        p.facts.in_iface.as_str(),
        p.facts.out_iface.as_str()
    );
    if !p.facts.in_iface.is_empty() {
        mac(&mut s, p);
    }
    let header = header.filter(|h| match p.family {
        Family::Ipv4 => h.len() >= 20 && h[0] >> 4 == 4,
        Family::Ipv6 => h.len() >= 40 && h[0] >> 4 == 6,
    });
    match (p.family, header) {
        (Family::Ipv4, Some(h)) => ipv4(&mut s, h, false),
        (Family::Ipv6, Some(h)) => ipv6(&mut s, h, false),
        (_, None) => from_meta(&mut s, p),
    }
    if p.mark != 0 {
        let _ = write!(s, "MARK=0x{:x} ", p.mark);
    }
    s
}

fn mac(s: &mut String, p: &Packet) {
    s.push_str("MAC=");
    let ethertype: u16 = match p.family {
        Family::Ipv4 => 0x0800,
        Family::Ipv6 => 0x86dd,
    };
    let parts = if p.facts.in_iface.as_str() == "lo" {
        Some(([0u8; 6], [0u8; 6]))
    } else {
        (p.facts.src_mac).map(|src| (own_mac(p.facts.in_iface.as_str()).unwrap_or([0; 6]), src))
    };
    if let Some((dst, src)) = parts {
        for (i, b) in dst.iter().chain(src.iter()).enumerate() {
            if i > 0 {
                s.push(':');
            }
            let _ = write!(s, "{b:02x}");
        }
        let _ = write!(s, ":{:02x}:{:02x}", ethertype >> 8, ethertype & 0xff);
    }
    s.push(' ');
}

/// The interface's own link-layer address (SIOCGIFHWADDR in this process's network
/// namespace, as the kernel's device), the destination MAC of a unicast packet it received.
#[cfg(target_os = "linux")]
fn own_mac(iface: &str) -> Option<[u8; 6]> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let name = iface.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: socket(2) has no memory preconditions; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a socket this function just opened and owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &b) in req.ifr_name.iter_mut().zip(name) {
        *d = b as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq with a NUL-terminated name (zeroed, name shorter than
    // IFNAMSIZ); SIOCGIFHWADDR writes only into it.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful SIOCGIFHWADDR the union holds `ifru_hwaddr`.
    let addr = unsafe { req.ifr_ifru.ifru_hwaddr };
    if addr.sa_family != libc::ARPHRD_ETHER {
        return None;
    }
    let mut out = [0u8; 6];
    for (o, &b) in out.iter_mut().zip(&addr.sa_data) {
        *o = b as u8;
    }
    Some(out)
}

/// Not known off Linux.
#[cfg(not(target_os = "linux"))]
fn own_mac(_iface: &str) -> Option<[u8; 6]> {
    None
}

fn ipv4(s: &mut String, h: &[u8], inner: bool) {
    let ihl = usize::from(h[0] & 0x0f) * 4;
    let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
    let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
    let tos = h[1];
    let frag = be16(h, 6).unwrap_or(0);
    let _ = write!(
        s,
        "SRC={src} DST={dst} LEN={} TOS=0x{:02X} PREC=0x{:02X} TTL={} ID={} ",
        be16(h, 2).unwrap_or(0),
        tos & 0x1e,
        tos & 0xe0,
        h[8],
        be16(h, 4).unwrap_or(0)
    );
    if frag & 0x8000 != 0 {
        s.push_str("CE ");
    }
    if frag & 0x4000 != 0 {
        s.push_str("DF ");
    }
    if frag & 0x2000 != 0 {
        s.push_str("MF ");
    }
    let offset = frag & 0x1fff;
    if offset != 0 {
        let _ = write!(s, "FRAG:{offset} ");
    }
    let l4 = h.get(ihl..).unwrap_or(&[]);
    transport(s, h[9], l4, offset != 0, Family::Ipv4, inner);
}

fn ipv6(s: &mut String, h: &[u8], inner: bool) {
    let addr = |at: usize| -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&h[at..at + 16]);
        Ipv6Addr::from(a)
    };
    let word = be32(h, 0).unwrap_or(0);
    let _ = write!(
        s,
        "SRC={} DST={} LEN={} TC={} HOPLIMIT={} FLOWLBL={} ",
        ipv6_full(&addr(8)),
        ipv6_full(&addr(24)),
        usize::from(be16(h, 4).unwrap_or(0)) + 40,
        (word & 0x0ff0_0000) >> 20,
        h[7],
        word & 0x000f_ffff
    );
    let (mut next, mut at, mut fragment) = (h[6], 40usize, false);
    loop {
        match next {
            // Hop-by-hop, routing, destination options: skipped (no --log-ip-options).
            0 | 43 | 60 => {
                let (Some(&n), Some(&len)) = (h.get(at), h.get(at + 1)) else {
                    s.push_str("TRUNCATED ");
                    return;
                };
                next = n;
                at += (usize::from(len) + 1) * 8;
            }
            44 => {
                let (Some(&n), Some(off)) = (h.get(at), be16(h, at + 2)) else {
                    s.push_str("TRUNCATED ");
                    return;
                };
                let _ = write!(s, "FRAG:{} ", off & 0xfff8);
                if off & 1 != 0 {
                    s.push_str("MF ");
                }
                fragment = off & 0xfff8 != 0;
                next = n;
                at += 8;
                if fragment {
                    break;
                }
            }
            _ => break,
        }
    }
    transport(
        s,
        next,
        h.get(at..).unwrap_or(&[]),
        fragment,
        Family::Ipv6,
        inner,
    );
}

fn incomplete(s: &mut String, l4: &[u8]) {
    let _ = write!(s, "INCOMPLETE [{} bytes] ", l4.len());
}

fn transport(s: &mut String, proto: u8, l4: &[u8], fragment: bool, family: Family, inner: bool) {
    match (proto, family) {
        (6, _) => {
            s.push_str("PROTO=TCP ");
            if fragment {
                return;
            }
            if l4.len() < 20 {
                return incomplete(s, l4);
            }
            let word = be32(l4, 12).unwrap_or(0);
            let _ = write!(
                s,
                "SPT={} DPT={} WINDOW={} RES=0x{:02x} ",
                be16(l4, 0).unwrap_or(0),
                be16(l4, 2).unwrap_or(0),
                be16(l4, 14).unwrap_or(0),
                (word & 0x0f00_0000) >> 22
            );
            tcp_flags(s, l4[13]);
            let _ = write!(s, "URGP={} ", be16(l4, 18).unwrap_or(0));
        }
        (17 | 136, _) => {
            s.push_str(if proto == 17 {
                "PROTO=UDP "
            } else {
                "PROTO=UDPLITE "
            });
            if fragment {
                return;
            }
            if l4.len() < 8 {
                return incomplete(s, l4);
            }
            let _ = write!(
                s,
                "SPT={} DPT={} LEN={} ",
                be16(l4, 0).unwrap_or(0),
                be16(l4, 2).unwrap_or(0),
                be16(l4, 4).unwrap_or(0)
            );
        }
        (1, Family::Ipv4) => {
            s.push_str("PROTO=ICMP ");
            if fragment {
                return;
            }
            if l4.len() < 8 {
                return incomplete(s, l4);
            }
            let (ty, code) = (l4[0], l4[1]);
            let _ = write!(s, "TYPE={ty} CODE={code} ");
            match ty {
                0 | 8 => {
                    let _ = write!(
                        s,
                        "ID={} SEQ={} ",
                        be16(l4, 4).unwrap_or(0),
                        be16(l4, 6).unwrap_or(0)
                    );
                }
                12 => {
                    let _ = write!(s, "PARAMETER={} ", l4[4]);
                }
                5 => {
                    let _ = write!(s, "GATEWAY={}.{}.{}.{} ", l4[4], l4[5], l4[6], l4[7]);
                }
                3 | 4 | 11 => {
                    if !inner {
                        s.push('[');
                        let quoted = &l4[8..];
                        if quoted.len() >= 20 && quoted[0] >> 4 == 4 {
                            ipv4(s, quoted, true);
                        } else {
                            incomplete(s, quoted);
                        }
                        s.push_str("] ");
                    }
                    if ty == 3 && code == 4 {
                        let _ = write!(s, "MTU={} ", be16(l4, 6).unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
        (58, Family::Ipv6) => {
            s.push_str("PROTO=ICMPv6 ");
            if fragment {
                return;
            }
            if l4.len() < 8 {
                return incomplete(s, l4);
            }
            let (ty, code) = (l4[0], l4[1]);
            let _ = write!(s, "TYPE={ty} CODE={code} ");
            match ty {
                128 | 129 => {
                    let _ = write!(
                        s,
                        "ID={} SEQ={} ",
                        be16(l4, 4).unwrap_or(0),
                        be16(l4, 6).unwrap_or(0)
                    );
                }
                4 => {
                    let _ = write!(s, "POINTER={:08x} ", be32(l4, 4).unwrap_or(0));
                }
                1..=3 => {
                    if !inner {
                        s.push('[');
                        let quoted = &l4[8..];
                        if quoted.len() >= 40 && quoted[0] >> 4 == 6 {
                            ipv6(s, quoted, true);
                        } else {
                            incomplete(s, quoted);
                        }
                        s.push_str("] ");
                    }
                    if ty == 2 {
                        let _ = write!(s, "MTU={} ", be32(l4, 4).unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
        (50 | 51, _) => {
            s.push_str(if proto == 50 {
                "PROTO=ESP "
            } else {
                "PROTO=AH "
            });
            if fragment {
                return;
            }
            if l4.len() < 8 {
                return incomplete(s, l4);
            }
            let spi = if proto == 50 {
                be32(l4, 0)
            } else {
                be32(l4, 4)
            };
            let _ = write!(s, "SPI=0x{:x} ", spi.unwrap_or(0));
        }
        _ => {
            let _ = write!(s, "PROTO={proto} ");
        }
    }
}

fn tcp_flags(s: &mut String, flags: u8) {
    for (bit, name) in [
        (0x80, "CWR "),
        (0x40, "ECE "),
        (0x20, "URG "),
        (0x10, "ACK "),
        (0x08, "PSH "),
        (0x04, "RST "),
        (0x02, "SYN "),
        (0x01, "FIN "),
    ] {
        if flags & bit != 0 {
            s.push_str(name);
        }
    }
}

/// The line from the engine's metadata only (no header bytes).
fn from_meta(s: &mut String, p: &PacketMeta) {
    match (p.family, p.src, p.dst) {
        (Family::Ipv6, IpAddr::V6(src), IpAddr::V6(dst)) => {
            let _ = write!(
                s,
                "SRC={} DST={} LEN={} TC={} HOPLIMIT={} FLOWLBL=0 ",
                ipv6_full(&src),
                ipv6_full(&dst),
                p.len,
                p.tos,
                p.ttl
            );
        }
        _ => {
            let _ = write!(
                s,
                "SRC={} DST={} LEN={} TOS=0x{:02X} PREC=0x{:02X} TTL={} ID=0 ",
                p.src,
                p.dst,
                p.len,
                p.tos & 0x1e,
                p.tos & 0xe0,
                p.ttl
            );
        }
    }
    let ip_len = match p.family {
        Family::Ipv4 => 20,
        Family::Ipv6 => 40,
    };
    match p.protocol {
        6 => {
            let _ = write!(
                s,
                "PROTO=TCP SPT={} DPT={} WINDOW=0 RES=0x00 ",
                p.sport, p.dport
            );
            tcp_flags(s, p.tcp_flags);
            s.push_str("URGP=0 ");
        }
        17 | 136 => {
            let name = if p.protocol == 17 { "UDP" } else { "UDPLITE" };
            let _ = write!(
                s,
                "PROTO={name} SPT={} DPT={} LEN={} ",
                p.sport,
                p.dport,
                p.len.saturating_sub(ip_len)
            );
        }
        1 if p.family == Family::Ipv4 => {
            let _ = write!(s, "PROTO=ICMP TYPE={} CODE={} ", p.icmp_type, p.icmp_code);
        }
        58 if p.family == Family::Ipv6 => {
            let _ = write!(s, "PROTO=ICMPv6 TYPE={} CODE={} ", p.icmp_type, p.icmp_code);
        }
        n => {
            let _ = write!(s, "PROTO={n} ");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vallum_engine::packet::parse::parse_ip;
    use vallum_engine::packet::{IfName, PacketFacts};

    /// A SYN from 192.0.2.10:55478 to 198.51.100.5:22, TTL 52, ID 41830, DF, window 29200,
    /// 20 bytes of TCP options (IP length 60).
    fn syn() -> Vec<u8> {
        let mut b = vec![
            0x45, 0x00, 0x00, 0x3c, 0xa3, 0x66, 0x40, 0x00, 52, 6, 0, 0, 192, 0, 2, 10, 198, 51,
            100, 5,
        ];
        b.extend_from_slice(&[
            0xd8, 0xb6, 0x00, 0x16, 0, 0, 0, 1, 0, 0, 0, 0, 0xa0, 0x02, 0x72, 0x10, 0, 0, 0, 0,
        ]);
        b.extend_from_slice(&[1; 20]);
        b
    }

    fn event(bytes: &[u8], prefix: Option<&str>) -> LogEvent {
        let base = Packet {
            meta: PacketMeta {
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface: IfName::new("lo").unwrap_or_default(),
                ..PacketFacts::default()
            },
        };
        LogEvent {
            ruleset: Arc::from("r"),
            table: TableKind::Filter,
            chain: Arc::from("INPUT"),
            rule: 1,
            prefix: prefix.map(Arc::from),
            level: 4,
            nflog_group: None,
            packet: parse_ip(bytes, base).expect("parses"),
        }
    }

    /// Compares field by field, so a failure names the field.
    fn same_fields(ours: &str, kernel: &str) {
        let (a, b): (Vec<_>, Vec<_>) = (ours.split(' ').collect(), kernel.split(' ').collect());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x, y, "field {i}\nours:   {ours}\nkernel: {kernel}");
        }
        assert_eq!(a.len(), b.len(), "\nours:   {ours}\nkernel: {kernel}");
    }

    /// The line the kernel's `-j LOG --log-prefix "[UFW BLOCK] "` writes for this SYN on
    /// loopback (nf_log_syslog.c: dump_ipv4_packet and nf_log_dump_tcp_header; the
    /// trailing space is the kernel's too).
    #[test]
    fn ipv4_tcp_syn_as_the_kernel_writes_it() {
        let b = syn();
        let line = kernel_line(&event(&b, Some("[UFW BLOCK] ")), Some(&b));
        same_fields(
            &line,
            "[UFW BLOCK] IN=lo OUT= MAC=00:00:00:00:00:00:00:00:00:00:00:00:08:00 \
             SRC=192.0.2.10 DST=198.51.100.5 LEN=60 TOS=0x00 PREC=0x00 TTL=52 ID=41830 DF \
             PROTO=TCP SPT=55478 DPT=22 WINDOW=29200 RES=0x00 SYN URGP=0 ",
        );
        // fail2ban's ufw filter: `\[UFW BLOCK\].+SRC=<ADDR> DST`.
        let after = line.split_once("[UFW BLOCK] ").expect("prefix").1;
        let src = after.split_once(" SRC=").expect("SRC").1;
        assert!(src.starts_with("192.0.2.10 DST="), "{line}");
    }

    /// Without the header bytes (pcap, synthetic sources) the fields the engine keeps are
    /// the same; ID, WINDOW are 0 and DF is not known.
    #[test]
    fn from_metadata_only() {
        let b = syn();
        let line = kernel_line(&event(&b, None), None);
        same_fields(
            &line,
            "IN=lo OUT= MAC=00:00:00:00:00:00:00:00:00:00:00:00:08:00 \
             SRC=192.0.2.10 DST=198.51.100.5 LEN=60 TOS=0x00 PREC=0x00 TTL=52 ID=0 \
             PROTO=TCP SPT=55478 DPT=22 WINDOW=0 RES=0x00 SYN URGP=0 ",
        );
    }

    /// IPv6 UDP: uncompressed addresses (`%pI6`), TC, HOPLIMIT, FLOWLBL, UDP's LEN; no MAC
    /// for a packet without an input interface (OUTPUT); MARK when set.
    #[test]
    fn ipv6_udp_at_output_with_a_mark() {
        let mut b = vec![0x60, 0x00, 0x30, 0x39, 0x00, 0x10, 17, 64];
        b.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        b.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        b.extend_from_slice(&[0x13, 0x88, 0x00, 0x35, 0x00, 0x10, 0, 0]);
        b.extend_from_slice(&[0; 8]);
        let mut e = event(&b, Some("v6: "));
        e.packet.facts.in_iface = IfName::default();
        e.packet.facts.out_iface = IfName::new("eth1").unwrap();
        e.packet.mark = 0x2a;
        same_fields(
            &kernel_line(&e, Some(&b)),
            "v6: IN= OUT=eth1 SRC=2001:0db8:0000:0000:0000:0000:0000:0001 \
             DST=2001:0db8:0000:0000:0000:0000:0000:0002 LEN=56 TC=0 HOPLIMIT=64 \
             FLOWLBL=12345 PROTO=UDP SPT=5000 DPT=53 LEN=16 MARK=0x2a ",
        );
    }

    /// ICMP echo: TYPE, CODE, ID, SEQ; a port unreachable quotes the packet it is about.
    #[test]
    fn icmp_echo_and_an_error_quoting_its_packet() {
        let mut echo = vec![
            0x45, 0, 0, 36, 0, 7, 0, 0, 64, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        echo.extend_from_slice(&[8, 0, 0, 0, 0x12, 0x34, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0]);
        let line = kernel_line(&event(&echo, None), Some(&echo));
        assert!(
            line.ends_with("ID=7 PROTO=ICMP TYPE=8 CODE=0 ID=4660 SEQ=3 "),
            "{line}"
        );
        let mut unreach = vec![
            0x45, 0, 0, 56, 0, 9, 0, 0, 64, 1, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1,
        ];
        unreach.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
        unreach.extend_from_slice(&[
            0x45, 0, 0, 28, 0, 5, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
        unreach.extend_from_slice(&[0x30, 0x39, 0x00, 0x35, 0, 8, 0, 0]);
        let line = kernel_line(&event(&unreach, None), Some(&unreach));
        assert!(
            line.ends_with(
                "PROTO=ICMP TYPE=3 CODE=3 [SRC=10.0.0.1 DST=10.0.0.2 LEN=28 TOS=0x00 \
                 PREC=0x00 TTL=64 ID=5 PROTO=UDP SPT=12345 DPT=53 LEN=8 ] "
            ),
            "{line}"
        );
    }

    fn drop_event(src: &str) -> PacketEvent {
        let packet = PacketMeta {
            src: src.parse().unwrap(),
            ..PacketMeta::default()
        };
        PacketEvent::dropped(
            packet.into(),
            None,
            crate::clock::Clock::system().system_time(),
        )
    }

    /// A shadow's sample reaches only subscribers asking for kind SHADOW (of its ruleset,
    /// when they name one), as the kernel's LOG line prefixed with the two verdicts.
    #[test]
    fn shadow_samples_go_to_shadow_subscribers() {
        use vallum_engine::engine::ShadowSample;
        use vallum_engine::snapshot::Verdict;
        let sample = ShadowSample {
            packet: PacketMeta {
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                protocol: 17,
                sport: 5353,
                dport: 53,
                len: 60,
                ..PacketMeta::default()
            }
            .into(),
            active: Verdict::Accept,
            shadow: Verdict::Drop,
            now_ns: 1,
        };
        let e = PacketEvent::shadow(&sample, "web", crate::clock::Clock::system().system_time());
        assert_eq!(e.kind, Kind::Shadow);
        let line = e.line();
        assert!(line.starts_with("shadow ACCEPT->DROP: IN= OUT= "), "{line}");
        assert!(line.contains("SRC=10.0.0.1 DST=10.0.0.2 LEN=60 "), "{line}");
        assert!(line.contains("PROTO=UDP SPT=5353 DPT=53 "), "{line}");
        let kind = |k| Filter {
            kind: Some(k),
            ..Filter::default()
        };
        assert!(!Filter::default().admits(&e), "only when asked for");
        assert!(!kind(Kind::Log).admits(&e));
        assert!(kind(Kind::Shadow).admits(&e));
        let of = |r: &str| Filter {
            ruleset: Some(r.into()),
            ..kind(Kind::Shadow)
        };
        assert!(of("web").admits(&e));
        assert!(!of("db").admits(&e));
    }

    #[test]
    fn filters() {
        let b = syn();
        let log = PacketEvent::log(
            event(&b, None),
            Some(&b),
            crate::clock::Clock::system().system_time(),
        );
        let all = Filter::default();
        assert!(all.admits(&log));
        assert!(
            !all.admits(&drop_event("10.0.0.1")),
            "samples only when asked"
        );
        let sampled = Filter {
            sample_one_in: Some(100),
            ..Filter::default()
        };
        assert!(sampled.admits(&drop_event("10.0.0.1")));
        let by_ruleset = |r: &str| Filter {
            ruleset: Some(r.into()),
            ..Filter::default()
        };
        assert!(by_ruleset("r").admits(&log));
        assert!(!by_ruleset("other").admits(&log));
        let by_chain = Filter {
            chain: Some("FORWARD".into()),
            ..Filter::default()
        };
        assert!(!by_chain.admits(&log));
        let by_addr = |a: &str, len| Filter {
            address: IpNet::new(a.parse().unwrap(), len),
            ..Filter::default()
        };
        assert!(by_addr("198.51.100.0", 24).admits(&log), "destination");
        assert!(by_addr("192.0.2.10", 32).admits(&log), "source");
        assert!(!by_addr("203.0.113.0", 24).admits(&log));
        let only_drops = Filter {
            kind: Some(Kind::Drop),
            ..Filter::default()
        };
        assert!(!only_drops.admits(&log));
    }

    async fn recv(sub: &mut Subscription) -> Delivered {
        tokio::time::timeout(std::time::Duration::from_secs(10), sub.rx.recv())
            .await
            .expect("an event within 10 s")
            .expect("open")
    }

    /// A subscriber that does not read loses the events beyond its channel (counted, and
    /// told with its next event); another subscriber gets every event; the offering side
    /// never waits.
    #[tokio::test]
    async fn a_slow_subscriber_loses_events_and_is_told() {
        let events = Events::start(crate::clock::Clock::system()).unwrap();
        let mut slow = events.subscribe(Filter::default());
        let mut fast = events.subscribe(Filter::default());
        let b = syn();
        let total = SUBSCRIBER_EVENTS + 10;
        let mut got = 0;
        for _ in 0..total {
            events.offer(vec![PacketEvent::log(
                event(&b, None),
                Some(&b),
                crate::clock::Clock::system().system_time(),
            )]);
            recv(&mut fast).await;
            got += 1;
        }
        assert_eq!(got, total);
        assert_eq!(events.drops().queue_full.load(Ordering::Relaxed), 0);
        assert_eq!(events.drops().slow_subscriber.load(Ordering::Relaxed), 10);
        for _ in 0..SUBSCRIBER_EVENTS {
            assert_eq!(recv(&mut slow).await.lost_before, 0);
        }
        events.offer(vec![PacketEvent::log(
            event(&b, None),
            Some(&b),
            crate::clock::Clock::system().system_time(),
        )]);
        assert_eq!(recv(&mut slow).await.lost_before, 10);
    }

    /// Sampling is on while a subscriber asks for it, at the smallest N asked.
    #[test]
    fn sampling_follows_the_subscribers() {
        let events = Events::start(crate::clock::Clock::system()).unwrap();
        assert_eq!(events.sample_one_in(), 0);
        let a = events.subscribe(Filter {
            sample_one_in: Some(500),
            ..Filter::default()
        });
        let b = events.subscribe(Filter {
            sample_one_in: Some(200),
            ..Filter::default()
        });
        assert_eq!(events.sample_one_in(), 200);
        drop(b);
        assert_eq!(events.sample_one_in(), 500);
        drop(a);
        assert_eq!(events.sample_one_in(), 0);
        let taken = (0..SAMPLE_RATE * 3)
            .filter(|_| events.take_sample_token())
            .count() as u64;
        assert!((SAMPLE_RATE..SAMPLE_RATE * 2).contains(&taken), "{taken}");
    }
}
