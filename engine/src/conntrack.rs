//! A connection tracker for TCP, UDP, ICMP/ICMPv6 (and a generic fallback), after Linux
//! nf_conntrack since the 2014 patchset that removed the central `nf_conntrack_lock`.
//!
//! # Concurrency
//! - **Lookups take no lock.** The table is an array of bucket heads; each entry (`Conn`) is
//!   linked into two chains, by its original and by its reply tuple (`tuplehash[2]`). A link is
//!   a tagged pointer: the low bit says which of the entry's two nodes it points at. Readers walk
//!   chains with `Acquire` loads under a crossbeam-epoch guard (module `reclaim`).
//! - **Inserts and deletes take hashed locks**: `locks` mutexes, lock `i` guarding every bucket
//!   `b` with `b % locks == i`. A writer takes the locks of both of an entry's buckets, lower
//!   index first (one lock when they coincide), so two writers never wait on each other in a
//!   cycle. Every store to a link happens under the locks of that link's bucket.
//! - **Publication**: an entry is fully built (tuples, state, timeout, its `next` links) before
//!   the `Release` store of the bucket head that makes it reachable; readers load links with
//!   `Acquire`, so a reader that sees the pointer sees the built entry. An unlink stores the
//!   successor with `Release` too: the unlinker loaded that successor with `Acquire`, so the
//!   successor's construction happens-before the reader that reaches it through the new link.
//! - **Deletion**: under the locks the writer sets `dying` (`Release`), unlinks both nodes
//!   (a removed node keeps its `next`, so a reader standing on it walks on to the rest of the
//!   chain, as in RCU lists) and retires the entry to the epoch collector, which frees it only
//!   after every reader pinned at that time has unpinned. Nodes are never reused within a
//!   grace period, and they move between chains only in a resize, which readers detect by the
//!   generation seqcount (below), so the kernel's "nulls" end markers are not needed.
//! - **Resize** ([`Conntrack::resize`], and growth from [`Conntrack::gc`]) works like
//!   `nf_conntrack_hash_resize`: the resizer takes every lock (in index order, the order
//!   writers use), makes the `generation` seqcount odd, moves every node into a new bucket
//!   array (unlinking it from the old head, then pushing it onto its new chain), publishes the
//!   new array and makes the generation even again; the old array is retired to the epoch
//!   collector. A reader reads the generation (waiting while it is odd, as
//!   `read_seqcount_begin`), walks the current array, and when it finds nothing re-reads the
//!   generation: if a resize began meanwhile the miss may be false
//!   (a node may have moved under it) and it looks again. A hit needs no re-check: the tuple
//!   matched and the entry is not dying, wherever it was found. Moving a node only ever points
//!   it into the new array, whose chains lead nowhere else, so a walk across a resize is
//!   finite. Writers read the generation, lock their buckets' stripes and check that the
//!   generation did not change (the resizer holds every lock while it is odd), as
//!   `nf_conntrack_double_lock` does.
//! - **The re-check after finding an entry**: in the kernel a reader that matched a tuple takes
//!   a reference and then re-reads the tuple and the confirmed bit with acquire ordering
//!   (SLAB_TYPESAFE_BY_RCU may have recycled the object; "netfilter: conntrack: fix crash due to
//!   confirmed bit load reordering"). Here an entry's tuples are immutable for its whole life and
//!   the memory is not recycled while the reader is pinned, so the key cannot change under it;
//!   what can change is that the entry is being deleted. After the tuple matched, the reader
//!   loads `dying` with `Acquire` (pairing with the deleter's `Release`) and skips dying entries.
//!   An update that races with a delete lands on the retired entry and is lost; the next packet
//!   creates a new one (the kernel has the same window between lookup and GC).
//!
//! # What it tracks
//! TCP: SYN / SYN-ACK / ACK handshake, FIN and RST closing ([`TcpState`], no window tracking),
//! and mid-stream pick-up as `nf_conntrack_tcp_loose=1`: an ACK without an entry opens one in
//! ESTABLISHED (the packet is NEW; [`ConntrackConfig::tcp_loose`] off makes it INVALID, as
//! any other TCP packet without an entry but a SYN is). UDP and generic: NEW
//! until a reply is seen, then ESTABLISHED. ICMP: echo/timestamp/info/address-mask (and ICMPv6
//! echo / node info) requests open entries, replies match them. ICMP errors are RELATED when the
//! header embedded in them belongs to a live entry: [`Conntrack::track`] reads it from
//! [`PacketMeta::embedded`] (filled by the parser), [`Conntrack::track_related`] takes it as an
//! argument; an error without an embedded header is INVALID. Non-first fragments
//! are UNTRACKED (there is no defragmentation before the tracker). Packets already marked
//! UNTRACKED (raw-table NOTRACK) are left alone.
//!
//! The table starts with [`ConntrackConfig::buckets`] buckets and doubles (in [`Conntrack::gc`])
//! while it holds more entries than buckets, up to `max_entries` rounded up to a power of two;
//! [`Conntrack::resize`] sets the size explicitly (the kernel's `nf_conntrack_buckets`
//! sysctl). Lookups wait while a resize runs (milliseconds for 10^5 entries).

use std::ptr;

use crate::model::{CtZone, ct_state};
use crate::packet::{Packet, PacketFacts, PacketMeta};
use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Mutex, Ordering, spin_loop};

mod buckets;
mod control;
mod count;
pub mod filter;
pub mod persist;
mod reclaim;
mod step;
pub mod tcp;
pub mod tuple;

#[cfg(all(test, loom))]
mod loom_model;
#[cfg(all(test, not(loom)))]
mod tests;

use buckets::{Buckets, Conn, Padded, PairGuard, Stripe, tag};
pub use count::Liveness;
pub use filter::ConnFilter;
pub use persist::{PersistError, Restored};
pub use step::{NoTracking, Track, Tracker};
pub use tcp::TcpState;
pub use tuple::Tuple;
use tuple::{IcmpKind, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP};

const SEC: u64 = 1_000_000_000;
/// UDP timeout before a reply is seen (`nf_conntrack_udp_timeout`), ns.
const UDP_TIMEOUT: u64 = 30 * SEC;
/// UDP timeout once a reply was seen (`nf_conntrack_udp_timeout_stream`), ns.
const UDP_STREAM_TIMEOUT: u64 = 120 * SEC;
/// ICMP / ICMPv6 timeout (`nf_conntrack_icmp_timeout`), ns.
const ICMP_TIMEOUT: u64 = 30 * SEC;
/// Other protocols (`nf_conntrack_generic_timeout`), ns.
const GENERIC_TIMEOUT: u64 = 600 * SEC;
/// How many buckets early drop scans for an unreplied entry (the kernel's `NF_CT_EVICTION_RANGE`).
const EVICTION_RANGE: usize = 8;

/// Sizes and behaviour of a [`Conntrack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConntrackConfig {
    /// Hash buckets (rounded up to a power of two; `nf_conntrack_buckets`).
    pub buckets: usize,
    /// Most entries at once (`nf_conntrack_max`); beyond it an unreplied entry is dropped early.
    pub max_entries: usize,
    /// Number of insert/delete locks (the kernel uses 1024).
    pub locks: usize,
    /// Mid-stream pick-up, as `nf_conntrack_tcp_loose=1` (the kernel's default, and ours): a
    /// TCP ACK (without SYN, FIN or RST) with no entry opens one in ESTABLISHED, the packet
    /// NEW to the rules, so flows established before a restart or a flush carry on once the
    /// rules accept them again. `false` is the strict behaviour: only a SYN opens an entry,
    /// any other TCP packet without one is INVALID.
    pub tcp_loose: bool,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        ConntrackConfig {
            buckets: 1 << 16,
            max_entries: 1 << 18,
            locks: 1024,
            tcp_loose: true,
        }
    }
}

/// Errors of [`Conntrack::new`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConntrackError {
    /// `buckets` was 0 or too large to round up to a power of two.
    #[error("conntrack buckets must be between 1 and 2^62, got {0}")]
    Buckets(usize),
    /// `locks` was 0.
    #[error("conntrack locks must be at least 1")]
    NoLocks,
    /// `max_entries` was 0.
    #[error("conntrack max_entries must be at least 1")]
    NoEntries,
}

/// What the tracker decided about a packet; [`Conntrack::track`] also writes the matching
/// [`ct_state`] bit into [`PacketMeta::ct_state`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtVerdict {
    /// The first packet(s) of a connection, no reply seen yet.
    New,
    /// A reply was seen.
    Established,
    /// An ICMP error about a tracked connection ([`Conntrack::track_related`]).
    Related,
    /// The packet fits no connection (or its state); `ct_state` is INVALID.
    Invalid,
    /// The packet is not tracked; `ct_state` is UNTRACKED.
    Untracked,
    /// The table is full and no entry could be dropped early: drop the packet (the kernel's
    /// "table full, dropping packet"). `ct_state` is INVALID.
    TableFull,
}

/// An epoch pin held across a batch of packets (see [`Conntrack::pin`]): entries unlinked while
/// it lives are not freed, and the per-packet pins inside the batch nest without a fence.
/// Not `Send`: drop it on the thread that made it.
pub struct Pinned {
    _guard: reclaim::Guard,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pinned")
    }
}

impl CtVerdict {
    /// The [`ct_state`] bit a packet with this verdict carries (as [`Conntrack::track`] sets
    /// it): TableFull is INVALID.
    pub fn ct_state(self) -> u8 {
        match self {
            CtVerdict::New => ct_state::NEW,
            CtVerdict::Established => ct_state::ESTABLISHED,
            CtVerdict::Related => ct_state::RELATED,
            CtVerdict::Invalid | CtVerdict::TableFull => ct_state::INVALID,
            CtVerdict::Untracked => ct_state::UNTRACKED,
        }
    }
}

/// The entry of a new connection, built by [`Conntrack::track_unconfirmed`] and not yet in
/// the table (nf_conntrack's unconfirmed conntrack): [`Conntrack::confirm`] inserts it once the
/// packet is accepted; dropping it forgets the connection.
pub struct Unconfirmed {
    conn: Box<Conn>,
    /// Hashes of its original and reply tuples.
    hashes: [u64; 2],
}

impl std::fmt::Debug for Unconfirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unconfirmed")
            .field("original", &self.conn.tuple[0])
            .finish_non_exhaustive()
    }
}

/// A copy of one entry, for listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnView {
    /// The tuple of the packet that opened the connection.
    pub original: Tuple,
    /// The tuple replies carry.
    pub reply: Tuple,
    /// The zone (`-j CT --zone`; the default zone 0 when none).
    pub zone: CtZone,
    /// The TCP state (`None` for other protocols).
    pub tcp_state: Option<TcpState>,
    /// Whether a reply-direction packet was seen.
    pub seen_reply: bool,
    /// The connection mark (`-j CONNMARK`, `-m connmark`).
    pub mark: u32,
    /// When the entry expires, in the caller's `now` nanoseconds.
    pub expires_ns: u64,
}

/// Counters of a [`Conntrack`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConntrackStats {
    /// Entries in the table now (including expired ones not yet collected).
    pub entries: u64,
    /// Entries created since the table was built.
    pub new_total: u64,
    /// Unreplied entries dropped to make room.
    pub early_drops: u64,
    /// New connections refused because the table was full.
    pub insert_failed: u64,
}

/// The connection table. See the module docs for the concurrency scheme.
pub struct Conntrack {
    /// The current bucket array (a `Box` leaked into a pointer; swapped by a resize under
    /// every lock, old arrays retired to the epoch collector).
    table: AtomicPtr<Buckets>,
    /// Seqcount of resizes (`nf_conntrack_generation`): odd while one runs.
    generation: AtomicU64,
    /// Growth stops at this many buckets.
    max_buckets: usize,
    locks: Box<[Stripe]>,
    max_entries: u64,
    /// The entry count that enforces `max_entries` (the kernel's global `nf_conntrack_count`).
    /// `Relaxed` RMW: no other memory access is ordered by it; the count may briefly exceed the
    /// maximum by the number of concurrent inserters, as in the kernel.
    entries: Padded<AtomicU64>,
    /// Rare-event statistics, `Relaxed` RMW (they order nothing).
    early_drops: AtomicU64,
    insert_failed: AtomicU64,
    /// Next bucket [`Conntrack::gc`] scans (`Relaxed` RMW: it only spreads the work).
    gc_cursor: AtomicU64,
    /// [`ConntrackConfig::tcp_loose`].
    tcp_loose: bool,
    retired: reclaim::Retired<Conn>,
    retired_tables: reclaim::Retired<Buckets>,
}

// === impl Conntrack ===

impl Conntrack {
    /// An empty table.
    pub fn new(config: ConntrackConfig) -> Result<Conntrack, ConntrackError> {
        let n = config
            .buckets
            .checked_next_power_of_two()
            .filter(|&n| config.buckets > 0 && n <= 1 << 62)
            .ok_or(ConntrackError::Buckets(config.buckets))?;
        if config.locks == 0 {
            return Err(ConntrackError::NoLocks);
        }
        if config.max_entries == 0 {
            return Err(ConntrackError::NoEntries);
        }
        // Growth stops at `max_entries` rounded up, and at the largest size `resize` takes
        // (a `max_entries` above 2^63 has no power of two to round up to).
        let max_buckets = config
            .max_entries
            .checked_next_power_of_two()
            .map_or(1 << 62, |m| m.min(1 << 62))
            .max(n);
        Ok(Conntrack {
            table: AtomicPtr::new(Box::into_raw(Box::new(Buckets::new(n)))),
            generation: AtomicU64::new(0),
            max_buckets,
            locks: (0..config.locks.min(max_buckets))
                .map(|_| Stripe {
                    lock: Mutex::new(()),
                    new_total: AtomicU64::new(0),
                })
                .collect(),
            max_entries: config.max_entries as u64,
            entries: Padded(AtomicU64::new(0)),
            early_drops: AtomicU64::new(0),
            insert_failed: AtomicU64::new(0),
            gc_cursor: AtomicU64::new(0),
            tcp_loose: config.tcp_loose,
            retired: reclaim::Retired::new(),
            retired_tables: reclaim::Retired::new(),
        })
    }

    /// Tracks one packet at time `now` (ns): finds or creates its entry, advances the state and
    /// timeout, and writes the packet's [`ct_state`] bit. Lock-free unless it creates or
    /// deletes an entry.
    pub fn track(&self, pkt: &mut Packet, now: u64) -> CtVerdict {
        let Packet { meta: pkt, facts } = pkt;
        let (v, unconfirmed) = self.track_unconfirmed(pkt, facts, now);
        match unconfirmed {
            Some(u) => {
                let v = self.confirm(u, pkt, now);
                pkt.ct_state = v.ct_state();
                v
            }
            None => v,
        }
    }

    /// [`Conntrack::track`] without inserting: a packet that opens a connection gets
    /// [`CtVerdict::New`] and its entry back as an [`Unconfirmed`], which joins the table only
    /// through [`Conntrack::confirm`], as nf_conntrack confirms a new entry only when its first
    /// packet leaves the last hook accepted (`__nf_conntrack_confirm`): a packet the rules drop
    /// leaves no entry behind (so a dropped, possibly spoofed, first packet cannot open a flow
    /// that its forged "reply" would then make ESTABLISHED). Packets of existing entries update
    /// them at once, as in the kernel. Writes the packet's [`ct_state`] bit. The packet path's
    /// step: the packet's hot part and its facts (zone, embedded ICMP header) apart.
    pub fn track_unconfirmed(
        &self,
        pkt: &mut PacketMeta,
        facts: &PacketFacts,
        now: u64,
    ) -> (CtVerdict, Option<Unconfirmed>) {
        let (v, u) = self.state_of(pkt, facts, now);
        pkt.ct_state = v.ct_state();
        (v, u)
    }

    /// Inserts the entry of a new connection whose first packet (`pkt`) was accepted. When
    /// another packet confirmed the same connection meanwhile (the first packets of both
    /// directions at once), `pkt` updates that entry instead. [`CtVerdict::TableFull`] when
    /// the table is full and no entry could be dropped early: drop the packet.
    pub fn confirm(&self, unconfirmed: Unconfirmed, pkt: &PacketMeta, now: u64) -> CtVerdict {
        // The rules may have set the new connection's mark (`-j CONNMARK`).
        unconfirmed
            .conn
            .mark
            .store(u64::from(pkt.ct_mark), Ordering::Relaxed);
        let guard = reclaim::pin();
        match self.insert(unconfirmed.conn, unconfirmed.hashes, now, &guard) {
            Insert::Done => CtVerdict::New,
            Insert::Clash(conn, dir) => update(conn, dir, pkt, now),
            Insert::Full => CtVerdict::TableFull,
        }
    }

    /// Pins the calling thread for a batch: hold the result while calling [`Conntrack::track`]
    /// on the batch's packets, so each packet's own pin nests (no fence per packet), as
    /// [`Conntrack::track_batch`] does. Keep batches short: a pinned thread delays the freeing
    /// of every entry deleted meanwhile.
    pub fn pin(&self) -> Pinned {
        Pinned {
            _guard: reclaim::pin(),
        }
    }

    /// [`Conntrack::track`] for each packet of a batch, with the epoch pinned once for the
    /// whole batch (the per-packet pins nest and skip the fence); `verdicts[i]` receives packet
    /// `i`'s verdict (the shorter of the two slices bounds the work). Drop the packets whose
    /// verdict is [`CtVerdict::TableFull`].
    pub fn track_batch(&self, pkts: &mut [Packet], now: u64, verdicts: &mut [CtVerdict]) {
        let _guard = reclaim::pin();
        for (p, v) in pkts.iter_mut().zip(verdicts.iter_mut()) {
            *v = self.track(p, now);
        }
    }

    /// Tracks an ICMP/ICMPv6 error (destination unreachable, time exceeded, parameter problem,
    /// ...; source quench and redirect for IPv4, packet too big for IPv6) whose embedded
    /// header the caller parsed into `inner` (as it was sent: source, destination, ports or
    /// ICMP `type << 8 | code`). RELATED when `inner` is either tuple of an entry that has not
    /// expired at `now` (ns), INVALID otherwise; sets `pkt.ct_state` likewise. The entry's
    /// timeout is not refreshed (nor is it in nf_conntrack).
    ///
    /// nf_conntrack looks up the inverted embedded tuple; since every entry is hashed under
    /// both its tuples, looking up `inner` itself finds the same entry.
    pub fn track_related(&self, pkt: &mut Packet, inner: &Tuple, now: u64) -> CtVerdict {
        let v = if pkt.ct_state == ct_state::UNTRACKED {
            CtVerdict::Untracked
        } else if pkt.fragment || !matches!(Tuple::from_packet(pkt).1, Some(IcmpKind::Error)) {
            CtVerdict::Invalid
        } else {
            self.related(Some(inner), zone_of(&pkt.facts), now)
        };
        pkt.ct_state = match v {
            CtVerdict::Related => ct_state::RELATED,
            CtVerdict::Untracked => ct_state::UNTRACKED,
            _ => ct_state::INVALID,
        };
        v
    }

    /// What [`Conntrack::track`] would decide for `pkt` at `now` (ns), without creating,
    /// updating or deleting anything: a lookup only, for tracing. A packet that would open an
    /// entry is NEW (even when the table is full: whether an early drop would make room is
    /// only known by trying); an expired entry counts as absent.
    pub fn peek(&self, pkt: &Packet, now: u64) -> CtVerdict {
        let mut p = *pkt;
        self.peek_into(&mut p.meta, &p.facts, now)
    }

    /// [`Conntrack::peek`], writing what [`Conntrack::track`] would write into the packet:
    /// its `ct_state`, and the entry's mark and the packet's direction (`ct_mark`,
    /// `ct_reply`). The packet's hot part and its facts apart, as a trace's conntrack step
    /// has them.
    pub fn peek_into(&self, pkt: &mut PacketMeta, facts: &PacketFacts, now: u64) -> CtVerdict {
        pkt.ct_mark = 0;
        pkt.ct_reply = false;
        let v = self.peek_entry(pkt, facts, now);
        pkt.ct_state = v.ct_state();
        v
    }

    fn peek_entry(&self, pkt: &mut PacketMeta, facts: &PacketFacts, now: u64) -> CtVerdict {
        if pkt.ct_state == ct_state::UNTRACKED || pkt.fragment {
            return CtVerdict::Untracked;
        }
        if pkt.l4_cut.is_some() {
            return CtVerdict::Invalid;
        }
        let (t, icmp) = Tuple::from_packet(pkt);
        match icmp {
            Some(IcmpKind::Untracked) => return CtVerdict::Untracked,
            Some(IcmpKind::Error) => {
                let (v, mark) = self.related_mark(facts.embedded.as_ref(), zone_of(facts), now);
                pkt.ct_mark = mark;
                return v;
            }
            Some(IcmpKind::Other) => return CtVerdict::Invalid,
            _ => {}
        }
        let guard = reclaim::pin();
        match self.lookup(&t, zone_of(facts), &guard) {
            Some((conn, dir)) if conn.timeout.load(Ordering::Relaxed) > now => {
                match transition(conn.status.load(Ordering::Relaxed), dir, pkt) {
                    Some((new, reopened)) => {
                        pkt.ct_mark = conn.mark.load(Ordering::Relaxed) as u32;
                        pkt.ct_reply = dir == 1;
                        verdict_of(new, reopened)
                    }
                    None => CtVerdict::Invalid,
                }
            }
            _ if opens(pkt, icmp, self.tcp_loose) => CtVerdict::New,
            _ => CtVerdict::Invalid,
        }
    }

    /// RELATED when `inner` (an ICMP error's embedded header) is either tuple of an entry live
    /// at `now`, INVALID otherwise (also when there is no embedded header).
    fn related(&self, inner: Option<&Tuple>, zone: CtZone, now: u64) -> CtVerdict {
        self.related_mark(inner, zone, now).0
    }

    /// [`Conntrack::related`] and the mark of the entry the error belongs to (0 when none).
    fn related_mark(&self, inner: Option<&Tuple>, zone: CtZone, now: u64) -> (CtVerdict, u32) {
        let Some(inner) = inner else {
            return (CtVerdict::Invalid, 0);
        };
        let guard = reclaim::pin();
        match self.lookup(inner, zone, &guard) {
            Some((conn, _)) if conn.timeout.load(Ordering::Relaxed) > now => {
                (CtVerdict::Related, conn.mark.load(Ordering::Relaxed) as u32)
            }
            _ => (CtVerdict::Invalid, 0),
        }
    }

    /// Sets the mark of `pkt`'s entry (the one [`Conntrack::track`] found for it: by its
    /// tuple, or for an ICMP error the embedded one) to `mark`, as `-j CONNMARK` does to
    /// ct->mark; whether an entry was there. The packet path calls it after the verdict of a
    /// packet whose rules changed [`PacketMeta::ct_mark`] (a lookup only for those packets).
    pub fn set_mark(&self, pkt: &PacketMeta, facts: &PacketFacts, mark: u32) -> bool {
        let (t, icmp) = Tuple::from_packet(pkt);
        let t = match (icmp, facts.embedded) {
            (Some(IcmpKind::Error), Some(inner)) => inner,
            _ => t,
        };
        let guard = reclaim::pin();
        match self.lookup(&t, zone_of(facts), &guard) {
            Some((conn, _)) => {
                conn.mark.store(u64::from(mark), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    fn state_of(
        &self,
        pkt: &mut PacketMeta,
        facts: &PacketFacts,
        now: u64,
    ) -> (CtVerdict, Option<Unconfirmed>) {
        pkt.ct_mark = 0;
        pkt.ct_reply = false;
        if pkt.ct_state == ct_state::UNTRACKED || pkt.fragment {
            return (CtVerdict::Untracked, None);
        }
        // A cut transport header: nf_conntrack's tuple or header check fails ("short
        // packet", "truncated packet"), the packet goes on without an entry: INVALID.
        if pkt.l4_cut.is_some() {
            return (CtVerdict::Invalid, None);
        }
        let (t, icmp) = Tuple::from_packet(pkt);
        match icmp {
            Some(IcmpKind::Untracked) => return (CtVerdict::Untracked, None),
            Some(IcmpKind::Error) => {
                let (v, mark) = self.related_mark(facts.embedded.as_ref(), zone_of(facts), now);
                pkt.ct_mark = mark;
                return (v, None);
            }
            Some(IcmpKind::Other) => return (CtVerdict::Invalid, None),
            _ => {}
        }
        let guard = reclaim::pin();
        // Rounds: an expired entry found is deleted and the lookup repeats; otherwise the
        // packet opens an unconfirmed entry. A fourth round needs other threads to keep
        // re-creating and expiring this very tuple; it counts INVALID.
        let zone = zone_of(facts);
        for _ in 0..4 {
            if let Some((conn, dir)) = self.lookup(&t, zone, &guard) {
                if conn.timeout.load(Ordering::Relaxed) <= now {
                    self.delete_conn(conn, &guard);
                    continue;
                }
                let v = update(conn, dir, pkt, now);
                if v != CtVerdict::Invalid {
                    pkt.ct_mark = conn.mark.load(Ordering::Relaxed) as u32;
                    pkt.ct_reply = dir == 1;
                }
                return (v, None);
            }
            if !opens(pkt, icmp, self.tcp_loose) {
                return (CtVerdict::Invalid, None);
            }
            let status = match pkt.protocol {
                PROTO_TCP if tcp::opens(pkt.tcp_flags) => tcp::word(TcpState::SynSent),
                // Picked up mid-stream (tcp_new with nf_conntrack_tcp_loose): the history is
                // lost, the connection is taken as established (its first packet counts NEW).
                PROTO_TCP => tcp::word(TcpState::Established),
                _ => 0,
            };
            let reply = t.reply();
            let hashes = [t.hash_in(zone.id(0)), reply.hash_in(zone.id(1))];
            let new = Box::new(Conn {
                tuple: [t, reply],
                zone,
                next: [
                    AtomicPtr::new(ptr::null_mut()),
                    AtomicPtr::new(ptr::null_mut()),
                ],
                status: AtomicU64::new(status),
                timeout: AtomicU64::new(now.saturating_add(timeout_of(t.protocol, status))),
                dying: AtomicBool::new(false),
                mark: AtomicU64::new(0),
            });
            return (CtVerdict::New, Some(Unconfirmed { conn: new, hashes }));
        }
        (CtVerdict::Invalid, None)
    }

    /// The reader half of the generation seqcount (`read_seqcount_begin`): waits while a
    /// resize runs, then returns the generation and the current bucket array.
    fn begin<'g>(&self, _guard: &'g reclaim::Guard) -> (u64, &'g Buckets) {
        loop {
            // Acquire: pairs with the resizer's Release store of the even generation, so the
            // array it published and every node it moved are visible to our walk.
            let generation = self.generation.load(Ordering::Acquire);
            if generation & 1 == 0 {
                // Acquire: pairs with the Release store that published the array.
                let p = self.table.load(Ordering::Acquire);
                // SAFETY: arrays are freed only through `retired_tables`, after every reader
                // pinned when the array was replaced has unpinned; we are pinned (`_guard`)
                // and loaded `p` while pinned.
                return (generation, unsafe { &*p });
            }
            spin_loop();
        }
    }

    /// Whether a resize began since [`Conntrack::begin`] returned `generation`
    /// (`read_seqcount_retry`).
    fn resized_since(&self, generation: u64) -> bool {
        // Relaxed suffices, without the Acquire fence of a general seqlock reader (Boehm, "Can
        // seqlocks get along with programming language memory models?", 2012): every link a
        // resize stores is a Release store made after its odd generation store, and our walk
        // loaded links with Acquire, so if the walk saw any link a resize moved, that resize's
        // odd store happens-before this load, which then returns it or a later value. (The
        // loom model `peek_races_with_resize` fails when this check is skipped.)
        self.generation.load(Ordering::Relaxed) != generation
    }

    /// The live entry holding `t` in `zone`, and which of its tuples matched, as
    /// `nf_conntrack_find_get`: looked up with the zone's original-direction id, then, when
    /// it differs, with its reply-direction id.
    fn lookup<'g>(
        &self,
        t: &Tuple,
        zone: CtZone,
        guard: &'g reclaim::Guard,
    ) -> Option<(&'g Conn, usize)> {
        let (orig, reply) = (zone.id(0), zone.id(1));
        self.find(t, zone, t.hash_in(orig), guard).or_else(|| {
            (reply != orig)
                .then(|| self.find(t, zone, t.hash_in(reply), guard))
                .flatten()
        })
    }

    /// The live entry holding `t` in `zone` in the chain of `hash`, and which of its tuples
    /// matched.
    fn find<'g>(
        &self,
        t: &Tuple,
        zone: CtZone,
        hash: u64,
        guard: &'g reclaim::Guard,
    ) -> Option<(&'g Conn, usize)> {
        loop {
            let (generation, table) = self.begin(guard);
            if let Some(hit) = table.find(t, zone, hash, guard) {
                return Some(hit);
            }
            if !self.resized_since(generation) {
                return None;
            }
        }
    }

    /// Locks the stripes of the buckets of `hashes` in the current array and returns the
    /// guard, the array and the two bucket indices; no resize can start while the guard lives.
    fn lock_buckets<'g>(
        &self,
        hashes: [u64; 2],
        guard: &'g reclaim::Guard,
    ) -> (PairGuard<'_>, &'g Buckets, [usize; 2]) {
        loop {
            let (generation, table) = self.begin(guard);
            let b = hashes.map(|h| table.index(h));
            let locks = self.lock_pair(b[0], b[1]);
            // Relaxed: a resize changes the generation only while it holds every lock; if one
            // ran since `begin`, its unlock happens-before our lock and we see its stores, and
            // none can start before we unlock.
            if self.generation.load(Ordering::Relaxed) == generation {
                return (locks, table, b);
            }
        }
    }

    fn lock_pair(&self, a: usize, b: usize) -> PairGuard<'_> {
        let (la, lb) = (a % self.locks.len(), b % self.locks.len());
        let (lo, hi) = (la.min(lb), la.max(lb));
        let lock = |i: usize| {
            self.locks[i]
                .lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let first = lock(lo);
        let second = (hi != lo).then(|| lock(hi));
        PairGuard {
            _first: first,
            _second: second,
            lower: lo,
        }
    }

    /// Inserts `new`, whose tuples hash to `hashes`, unless either tuple is already present.
    fn insert<'g>(
        &self,
        new: Box<Conn>,
        hashes: [u64; 2],
        now: u64,
        guard: &'g reclaim::Guard,
    ) -> Insert<'g> {
        // As __nf_conntrack_alloc: reserve a slot first; over the maximum, an early drop frees
        // one and the reservation stands (so concurrent inserters cannot take the freed slot
        // from under us and starve this packet). The count exceeds the maximum by at most the
        // number of concurrent inserters, as in the kernel.
        if self.entries.0.fetch_add(1, Ordering::Relaxed) >= self.max_entries
            && !self.early_drop(hashes[0], now, guard)
        {
            self.entries.0.fetch_sub(1, Ordering::Relaxed);
            self.insert_failed.fetch_add(1, Ordering::Relaxed);
            return Insert::Full;
        }
        let (locks, table, b) = self.lock_buckets(hashes, guard);
        // Clash: another thread inserted either tuple since our lookup (both directions:
        // a simultaneous packet of the other direction may have opened the same flow).
        for (d, (t, &h)) in new.tuple.iter().zip(&hashes).enumerate() {
            if let Some((conn, dir)) = table.find(t, new.zone, h, guard) {
                self.entries.0.fetch_sub(1, Ordering::Relaxed);
                return Insert::Clash(conn, dir ^ d);
            }
        }
        let p = Box::into_raw(new);
        for (d, &bucket) in b.iter().enumerate() {
            // Relaxed: we hold the bucket's lock, the only writers of this head take it too.
            let head = table.heads[bucket].load(Ordering::Relaxed);
            // SAFETY: `p` is our own live Box, not yet reachable by other threads.
            unsafe { &*p }.next[d].store(head, Ordering::Relaxed);
            // Release: publishes the whole entry (and `next`) to readers' Acquire loads.
            table.heads[bucket].store(tag(p, d), Ordering::Release);
        }
        // A load and a store, not an RMW: only holders of this stripe's lock write it, and we
        // hold it (readers in `stats` may see either value; Relaxed, it orders nothing).
        let counter = &self.locks[locks.lower].new_total;
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        Insert::Done
    }

    /// Drops one unreplied (or expired) entry in the buckets after the one of `hash`; whether
    /// one was dropped.
    fn early_drop(&self, hash: u64, now: u64, guard: &reclaim::Guard) -> bool {
        let (_, table) = self.begin(guard);
        for i in 0..EVICTION_RANGE {
            let bucket = table.index(hash).wrapping_add(i) & table.mask;
            let victim = table.scan(bucket, guard, |c| {
                c.status.load(Ordering::Relaxed) & tcp::SEEN_REPLY == 0
                    || c.timeout.load(Ordering::Relaxed) <= now
            });
            if let Some(conn) = victim.first() {
                if self.delete_conn(conn, guard) {
                    self.early_drops.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
        false
    }

    /// Deletes `conn` unless another thread already did; whether this call deleted it.
    fn delete_conn(&self, conn: &Conn, guard: &reclaim::Guard) -> bool {
        let (_locks, table, b) = self.lock_buckets([conn.hash(0), conn.hash(1)], guard);
        // Relaxed load: `dying` is only written under these locks, which we hold.
        if conn.dying.load(Ordering::Relaxed) {
            return false;
        }
        // Release: readers that Acquire-load `dying` and see it set skip the entry.
        conn.dying.store(true, Ordering::Release);
        let p = ptr::from_ref(conn).cast_mut();
        table.unlink(b[0], p, 0);
        table.unlink(b[1], p, 1);
        self.entries.0.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: `p` came from Box::into_raw in `insert`; it is now unreachable from both
        // chains, and only the thread that set `dying` (under the locks) retires it.
        unsafe { self.retired.retire(guard, p) };
        true
    }
}

enum Insert<'g> {
    Done,
    Clash(&'g Conn, usize),
    Full,
}

/// The zone a packet is tracked in: its CT template's, else the default zone.
fn zone_of(facts: &PacketFacts) -> CtZone {
    facts.ct_zone.unwrap_or_default()
}

/// The timeout (ns) of an entry of `protocol` with status word `status`.
fn timeout_of(protocol: u8, status: u64) -> u64 {
    match protocol {
        // An ESTABLISHED entry that never saw a reply was picked up mid-stream (a handshake
        // reaches ESTABLISHED only after the SYN-ACK): it gets the unacknowledged-data
        // timeout until a reply shows the flow is real.
        PROTO_TCP
            if status & tcp::SEEN_REPLY == 0
                && tcp::state_of(status) == Some(TcpState::Established) =>
        {
            tcp::PICKUP_TIMEOUT_NS
        }
        PROTO_TCP => tcp::state_of(status).map_or(SEC * 10, TcpState::timeout_ns),
        PROTO_UDP if status & tcp::SEEN_REPLY != 0 => UDP_STREAM_TIMEOUT,
        PROTO_UDP => UDP_TIMEOUT,
        PROTO_ICMP | PROTO_ICMPV6 => ICMP_TIMEOUT,
        _ => GENERIC_TIMEOUT,
    }
}

/// Whether a packet without an entry may create one: a TCP SYN (without ACK, RST, FIN), with
/// `tcp_loose` ([`ConntrackConfig::tcp_loose`]) also a mid-stream ACK; any UDP or
/// other-protocol packet, an ICMP request (not a reply).
fn opens(pkt: &PacketMeta, icmp: Option<IcmpKind>, tcp_loose: bool) -> bool {
    match pkt.protocol {
        PROTO_TCP => tcp::opens(pkt.tcp_flags) || (tcp_loose && tcp::picks_up(pkt.tcp_flags)),
        _ => icmp != Some(IcmpKind::Reply),
    }
}

/// The status word after a packet in direction `dir` on an entry whose word is `old`, and
/// whether the packet reopened a closed TCP entry; `None` when the packet does not fit (INVALID).
fn transition(old: u64, dir: usize, pkt: &PacketMeta) -> Option<(u64, bool)> {
    if pkt.protocol == PROTO_TCP {
        match tcp::step(old, dir, pkt.tcp_flags) {
            tcp::Step::To(w) => Some((w, false)),
            tcp::Step::Reopen(w) => Some((w, true)),
            tcp::Step::Invalid => None,
        }
    } else if dir == 1 {
        Some((old | tcp::SEEN_REPLY, false))
    } else {
        Some((old, false))
    }
}

/// The verdict of a packet that left an entry with status `new`.
fn verdict_of(new: u64, reopened: bool) -> CtVerdict {
    if reopened || new & tcp::SEEN_REPLY == 0 {
        CtVerdict::New
    } else {
        CtVerdict::Established
    }
}

/// Applies one packet in direction `dir` to an existing entry.
fn update(conn: &Conn, dir: usize, pkt: &PacketMeta, now: u64) -> CtVerdict {
    // Relaxed on `status`: the word is self-contained (CAS makes each transition atomic) and
    // orders no other memory; the timeout store below may interleave with another packet's,
    // which only moves the expiry by one packet's worth (as in the kernel).
    let mut old = conn.status.load(Ordering::Relaxed);
    loop {
        let Some((new, reopened)) = transition(old, dir, pkt) else {
            return CtVerdict::Invalid;
        };
        if new != old {
            if let Err(cur) =
                conn.status
                    .compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                old = cur;
                continue;
            }
        }
        let t = now.saturating_add(timeout_of(conn.tuple[0].protocol, new));
        conn.timeout.store(t, Ordering::Relaxed);
        return verdict_of(new, reopened);
    }
}
