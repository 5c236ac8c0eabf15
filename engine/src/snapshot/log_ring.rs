//! Where `-j LOG` hits go: the [`LogSink`] the evaluator hands each hit to, and the two sinks
//! there are. A `Vec<LogEvent>` resolves each hit into a [`LogEvent`] on the spot (names and
//! prefix cloned: for tests, tools and [`Snapshot::trace`]); a [`LogRing`] is what a packet
//! core uses: a fixed-capacity buffer of [`LogRecord`]s, each holding the rule's indices in
//! its snapshot (ruleset, chain, rule) and a copy of the packet's metadata (interfaces, MAC,
//! addresses, ports, flags, length: what a kernel-format log line needs), with a drop
//! counter when it is full. [`Snapshot::log_event`] turns a record back into a [`LogEvent`]
//! while its snapshot is active.
//!
//! On the packet path: [`LogRing`]'s sink allocates nothing, takes no lock, clones no `Arc`
//! and touches no atomic (a record is a plain copy into a slot the ring allocated when it was
//! made). Resolving records ([`Snapshot::log_event`]) is off the packet path.

use std::sync::Arc;

use super::{CChain, CTarget, LogEvent, LogSpec, Snapshot};
use crate::packet::{Packet, PacketFacts, PacketMeta};

/// Receives the `-j LOG` hits of [`Snapshot::classify_batch`] and [`Snapshot::trace`], in
/// evaluation order.
pub trait LogSink {
    /// A `-j LOG` rule matched `hit`'s packet.
    fn log(&mut self, hit: &LogHit<'_>);
}

/// One `-j LOG` hit as the evaluator sees it: the rule in its snapshot and the packet.
#[derive(Debug)]
pub struct LogHit<'a> {
    pub(crate) snapshot: u64,
    pub(crate) names: &'a [Arc<str>],
    pub(crate) chain: &'a CChain,
    /// Index of `chain` in the snapshot's chains.
    pub(crate) chain_index: u32,
    /// 1-based rule number in the chain.
    pub(crate) rule: u32,
    pub(crate) prefix: &'a Option<Arc<str>>,
    pub(crate) level: u8,
    /// `Some(--nflog-group)` for a `-j NFLOG` hit.
    pub(crate) nflog_group: Option<u16>,
    pub(crate) packet: &'a PacketMeta,
    pub(crate) facts: &'a PacketFacts,
}

impl<'a> LogHit<'a> {
    /// The hit of `rule` (1-based) of `chain`, index `chain_index` in the snapshot (number
    /// `snapshot`, its ruleset names `names`), a `-j LOG`/`-j NFLOG` with `log`'s options, on
    /// `packet`: what both observers of the chain walk (the counting one and the trace) hand
    /// their sink. Borrows only; no allocation, no `Arc` clone.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the hit as the chain walk has it, passed as it is
    pub(crate) fn new(
        snapshot: u64,
        names: &'a [Arc<str>],
        chain: &'a CChain,
        chain_index: u32,
        rule: u32,
        log: &'a LogSpec,
        packet: &'a PacketMeta,
        facts: &'a PacketFacts,
    ) -> LogHit<'a> {
        LogHit {
            snapshot,
            names,
            chain,
            chain_index,
            rule,
            prefix: &log.prefix,
            level: log.level,
            nflog_group: log.nflog_group,
            packet,
            facts,
        }
    }

    /// The packet as the rule saw it: its facts with the output interface as at its hook
    /// ([`PacketFacts::out_iface_at`]).
    fn whole(&self) -> Packet {
        let mut facts = *self.facts;
        facts.out_iface = *self.facts.out_iface_at(self.packet.hook);
        Packet {
            meta: *self.packet,
            facts,
        }
    }

    /// The hit as a self-contained event (clones the names and the prefix).
    pub fn event(&self) -> LogEvent {
        LogEvent {
            ruleset: self.names[self.chain.ruleset as usize].clone(),
            table: self.chain.table,
            chain: self.chain.name.clone(),
            rule: self.rule,
            prefix: self.prefix.clone(),
            level: self.level,
            nflog_group: self.nflog_group,
            packet: self.whole(),
        }
    }

    /// The hit as indices into its snapshot plus the packet (no allocation, no `Arc`).
    pub fn record(&self) -> LogRecord {
        LogRecord {
            snapshot: self.snapshot,
            ruleset: self.chain.ruleset,
            chain: self.chain_index,
            rule: self.rule,
            level: self.level,
            packet: self.whole(),
        }
    }
}

/// Each hit becomes a [`LogEvent`] (allocates: names and prefix are `Arc` clones, the `Vec`
/// grows).
impl LogSink for Vec<LogEvent> {
    fn log(&mut self, hit: &LogHit<'_>) {
        self.push(hit.event());
    }
}

/// A `-j LOG` hit as a [`LogRing`] keeps it: indices into the snapshot it happened in and a
/// copy of the packet's metadata. [`Snapshot::log_event`] resolves it (names, table, prefix)
/// while that snapshot is active.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogRecord {
    /// The id of the snapshot the indices refer to ([`Snapshot::id`]).
    pub snapshot: u64,
    /// Index of the rule's ruleset among the snapshot's rulesets ([`Snapshot::rulesets`]).
    pub ruleset: u32,
    /// Index of the rule's chain among the snapshot's chains.
    pub chain: u32,
    /// 1-based rule number in its chain.
    pub rule: u32,
    /// `--log-level` (syslog 0..=7).
    pub level: u8,
    /// The packet as it was when the rule matched.
    pub packet: Packet,
}

/// A fixed-capacity buffer of [`LogRecord`]s, in hit order, for one packet core: the slots
/// are allocated once by [`LogRing::with_capacity`], a hit copies into the next free one,
/// and a hit that finds the ring full is counted in [`LogRing::dropped`] and not kept (the
/// records not yet drained stay). [`LogRing::drain`] empties it.
#[derive(Debug, Clone)]
pub struct LogRing {
    pub(crate) records: Box<[LogRecord]>,
    pub(crate) len: usize,
    pub(crate) dropped: u64,
}

impl LogRing {
    /// A ring of `capacity` records (allocated now; `capacity` 0 keeps nothing and counts
    /// every hit as dropped).
    pub fn with_capacity(capacity: usize) -> LogRing {
        LogRing {
            records: vec![LogRecord::default(); capacity].into_boxed_slice(),
            len: 0,
            dropped: 0,
        }
    }

    /// How many records it can hold.
    pub fn capacity(&self) -> usize {
        self.records.len()
    }

    /// Records held (not yet drained).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hits not kept because the ring was full, since it was made.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Keeps `record`, or counts it as dropped when the ring is full.
    #[inline]
    pub fn push(&mut self, record: LogRecord) {
        match self.records.get_mut(self.len) {
            Some(slot) => {
                *slot = record;
                self.len += 1;
            }
            None => self.dropped += 1,
        }
    }

    /// The records held, oldest first; the ring is empty afterwards (even if the iterator is
    /// not run to the end).
    pub fn drain(&mut self) -> impl ExactSizeIterator<Item = LogRecord> + '_ {
        let n = std::mem::take(&mut self.len);
        self.records[..n].iter().copied()
    }
}

/// Each hit becomes a [`LogRecord`] in the ring (no allocation).
impl LogSink for LogRing {
    #[inline]
    fn log(&mut self, hit: &LogHit<'_>) {
        self.push(hit.record());
    }
}

impl Snapshot {
    /// This snapshot's id, unique among the snapshots of the process ([`LogRecord::snapshot`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The [`LogEvent`] a [`LogRing`] record stands for, as a `Vec<LogEvent>` sink would have
    /// made it; `None` when the record is from another snapshot (or names no LOG rule of this
    /// one).
    pub fn log_event(&self, record: &LogRecord) -> Option<LogEvent> {
        if record.snapshot != self.id {
            return None;
        }
        let chain = self.chains.get(record.chain as usize)?;
        let rule = chain.body.rules.get(record.rule.checked_sub(1)? as usize)?;
        let CTarget::Log(log) = &rule.target else {
            return None;
        };
        Some(LogEvent {
            ruleset: self.names.get(chain.ruleset as usize)?.clone(),
            table: chain.table,
            chain: chain.name.clone(),
            rule: record.rule,
            prefix: log.prefix.clone(),
            level: record.level,
            nflog_group: log.nflog_group,
            packet: record.packet,
        })
    }
}
