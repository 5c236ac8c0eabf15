//! The packet side of a [`Snapshot`], each part a call from the classify loop
//! ([`Snapshot::classify_batch`], `engine/worker.rs`) that returns to it: the index probe
//! of a group of packets (`Snapshot::probe`: the TupleMerge hash tables or RFC tables the
//! commit side builds in `snapshot/tuple_merge.rs` and `snapshot/rfc.rs`), and one packet's
//! walk in two parts around conntrack's lookup (`Snapshot::walk_raw`, the raw-table chains;
//! `Snapshot::walk_rest`, the others): the chain walk with its jump stack, the index
//! queries it makes (`indexed_next`), every match, the targets, and a `-j LOG` hit's copy into
//! the worker's ring ([`LogRing`]'s [`LogSink`]). [`Snapshot::trace`] is the same walk with a
//! recording observer (`eval/trace.rs`). A packet's hot part ([`PacketMeta`]) goes to every
//! match; its cold facts ([`PacketFacts`]) only to the matches and targets that read them.
//! The matches that read more than the parsed header have their own files:
//! `eval/string.rs`, `eval/sctp.rs`, `eval/u32_match.rs`, `eval/connlimit.rs`.
//!
//! This file is over 1,200 lines on purpose: a packet's classification reads in one file
//! (docs/architecture.md, "The packet walk"), and the walk, the index it queries and the
//! matches it checks call each other (the index checks rules with the walk's matches), so
//! splitting them would send a reader back and forth between files.
//!
//! Runs on the packet cores against a published, immutable snapshot. It takes no lock and
//! reads no clock (`now` is passed in); per packet it writes only this core's counter block
//! and the `-m limit` buckets of rules the packet reaches. A `-j LOG` hit goes to the caller's
//! [`LogSink`] (a worker's [`LogRing`] copies it into a fixed slot; a `Vec<LogEvent>`
//! allocates an event). Nothing else allocates, except [`Snapshot::trace`]'s steps; the
//! probe's per-group state is in fixed arrays of `PROBE_BATCH`.

use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::sync::Arc;

use crate::conntrack::Conntrack;
use crate::model::{EcnMatch, FragMatch, Hook, MultiportDir, Policy, PortRange, TtlOp, ct_state};
use crate::packet::{Packet, PacketFacts, PacketMeta};

use crate::eval::connlimit::CConnlimit;
use crate::model::ConnmarkTarget;
use crate::snapshot::chunks::RuleChunks;
use crate::snapshot::counters::CoreCounters;
use crate::snapshot::log_ring::{LogHit, LogRecord, LogRing, LogSink};
use crate::snapshot::rfc::{DIRECT, Rfc};
use crate::snapshot::stateful::{CHashlimit, CRecent};
use crate::snapshot::tuple_merge::*;
use crate::snapshot::*;

pub(crate) mod connlimit;
pub(crate) mod sctp;
pub(crate) mod string;
mod trace;
pub(crate) mod u32_match;

#[cfg(test)]
pub(crate) use trace::Tracing;
pub use trace::{StepOutcome, Trace, TraceStep};

// === impl Snapshot: evaluation ===

/// What the evaluator reports on its way; the hot path counts, the trace records.
pub(crate) trait Observer {
    /// Rule `number` (1-based) of `chain` matched; it counts in `slot`.
    fn rule(&mut self, slot: usize, chain: &CChain, number: u32, pkt: &PacketMeta);
    fn policy(&mut self, slot: usize, chain: &CChain, pkt: &PacketMeta);
    fn limit(&mut self, bucket: &TokenBucket, now: u64) -> bool;
    /// A `-m recent` match: the packet path changes the list, a trace only reads it.
    fn recent(&mut self, r: &CRecent, pkt: &PacketMeta, now: u64) -> bool;
    /// A `-m hashlimit` match: the packet path takes a token, a trace only looks.
    fn hashlimit(&mut self, h: &CHashlimit, pkt: &PacketMeta, now: u64) -> bool;
    /// A `-m connlimit` match: the packet path adds the packet's connection to the rule's
    /// list, a trace only counts.
    fn connlimit(
        &mut self,
        c: &CConnlimit,
        pkt: &PacketMeta,
        facts: &PacketFacts,
        now: u64,
    ) -> bool;
    /// The packet's bytes from its network header on, for `-m string` (empty when the caller
    /// gave none).
    fn payload(&self) -> &[u8];
    /// Rule `number` of `chain` (index `chain_index` in the snapshot's chains) is a `-j LOG`
    /// that matched.
    #[allow(clippy::too_many_arguments)] // the hit as the chain walk has it, passed as it is
    fn log(
        &mut self,
        chain: &CChain,
        chain_index: u32,
        number: u32,
        log: &LogSpec,
        pkt: &PacketMeta,
        facts: &PacketFacts,
    );
    fn outcome(&mut self, _what: StepOutcome) {}
    /// A match found the transport-header bytes it reads missing ([`PacketMeta::l4_cut`]):
    /// the packet is dropped on the spot (the kernel's `par->hotdrop`).
    fn hotdrop(&mut self) {}
}

/// Wraps the observer of a packet with a cut transport header on the linear path, to see
/// whether a rule's match hotdropped it ([`Observer::hotdrop`]).
struct HotdropWatch<'o, O> {
    inner: &'o mut O,
    dropped: bool,
}

impl<O: Observer> Observer for HotdropWatch<'_, O> {
    fn rule(&mut self, slot: usize, chain: &CChain, number: u32, pkt: &PacketMeta) {
        self.inner.rule(slot, chain, number, pkt);
    }
    fn policy(&mut self, slot: usize, chain: &CChain, pkt: &PacketMeta) {
        self.inner.policy(slot, chain, pkt);
    }
    fn limit(&mut self, bucket: &TokenBucket, now: u64) -> bool {
        self.inner.limit(bucket, now)
    }
    fn recent(&mut self, r: &CRecent, pkt: &PacketMeta, now: u64) -> bool {
        self.inner.recent(r, pkt, now)
    }
    fn hashlimit(&mut self, h: &CHashlimit, pkt: &PacketMeta, now: u64) -> bool {
        self.inner.hashlimit(h, pkt, now)
    }
    fn connlimit(
        &mut self,
        c: &CConnlimit,
        pkt: &PacketMeta,
        facts: &PacketFacts,
        now: u64,
    ) -> bool {
        self.inner.connlimit(c, pkt, facts, now)
    }
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }
    fn log(
        &mut self,
        chain: &CChain,
        chain_index: u32,
        number: u32,
        log: &LogSpec,
        pkt: &PacketMeta,
        facts: &PacketFacts,
    ) {
        self.inner.log(chain, chain_index, number, log, pkt, facts);
    }
    fn outcome(&mut self, what: StepOutcome) {
        self.inner.outcome(what);
    }
    fn hotdrop(&mut self) {
        self.dropped = true;
        self.inner.hotdrop();
    }
}

/// The hot-path observer ([`Snapshot::counting`]): bumps this core's counters and hands LOG
/// hits to `logs`.
pub(crate) struct Counting<'a, L: ?Sized> {
    counters: &'a CoreCounters,
    /// The connection table `-m connlimit` asks (`None`: no tracker).
    ct: Option<&'a Conntrack>,
    /// The bytes of the packet being evaluated, for `-m string`.
    payload: &'a [u8],
    snapshot: u64,
    names: &'a [Arc<str>],
    logs: &'a mut L,
}

impl<'a, L: ?Sized> Counting<'a, L> {
    /// The bytes of the packet the next walk is for, from its network header on (`-m
    /// string`, `-m u32`, `-m sctp`; empty: none).
    #[inline]
    pub(crate) fn set_payload(&mut self, payload: &'a [u8]) {
        self.payload = payload;
    }
}

impl<L: LogSink + ?Sized> Observer for Counting<'_, L> {
    #[inline]
    fn rule(&mut self, slot: usize, _: &CChain, _: u32, pkt: &PacketMeta) {
        self.counters.bump(slot, u64::from(pkt.len));
    }
    #[inline]
    fn policy(&mut self, slot: usize, _: &CChain, pkt: &PacketMeta) {
        self.counters.bump(slot, u64::from(pkt.len));
    }
    #[inline]
    fn limit(&mut self, bucket: &TokenBucket, now: u64) -> bool {
        bucket.conforms(now)
    }
    #[inline]
    fn recent(&mut self, r: &CRecent, pkt: &PacketMeta, now: u64) -> bool {
        r.matches(pkt, now, true)
    }
    #[inline]
    fn hashlimit(&mut self, h: &CHashlimit, pkt: &PacketMeta, now: u64) -> bool {
        h.matches(pkt, now, true)
    }
    #[inline]
    fn connlimit(
        &mut self,
        c: &CConnlimit,
        pkt: &PacketMeta,
        facts: &PacketFacts,
        now: u64,
    ) -> bool {
        c.matches(pkt, facts, now, self.ct, true)
    }
    #[inline]
    fn payload(&self) -> &[u8] {
        self.payload
    }
    fn log(
        &mut self,
        chain: &CChain,
        chain_index: u32,
        number: u32,
        log: &LogSpec,
        pkt: &PacketMeta,
        facts: &PacketFacts,
    ) {
        let hit = LogHit::new(
            self.snapshot,
            self.names,
            chain,
            chain_index,
            number,
            log,
            pkt,
            facts,
        );
        self.logs.log(&hit);
    }
}

impl<'a> LogHit<'a> {
    /// The hit of `rule` (1-based) of `chain`, index `chain_index` in the snapshot (number
    /// `snapshot`, its ruleset names `names`), a `-j LOG`/`-j NFLOG` with `log`'s options, on
    /// `packet` with its `facts`: what both observers of the chain walk (the counting one and
    /// the trace) hand their sink. Borrows only; no allocation, no `Arc` clone.
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
    #[inline]
    pub(crate) fn whole(&self) -> Packet {
        let mut facts = *self.facts;
        facts.out_iface = *self.facts.out_iface_at(self.packet.hook);
        Packet {
            meta: *self.packet,
            facts,
        }
    }
}

/// A worker's `-j LOG` hit: a plain copy of the rule's indices and the packet into the ring's
/// next slot (no allocation, no `Arc`, no atomic), or one more [`LogRing::dropped`] when the
/// ring is full (the records not yet drained stay).
impl LogSink for LogRing {
    #[inline]
    fn log(&mut self, hit: &LogHit<'_>) {
        match self.records.get_mut(self.len) {
            Some(slot) => {
                *slot = LogRecord {
                    snapshot: hit.snapshot,
                    ruleset: hit.chain.ruleset,
                    chain: hit.chain_index,
                    rule: hit.rule,
                    level: hit.level,
                    packet: hit.whole(),
                };
                self.len += 1;
            }
            None => self.dropped += 1,
        }
    }
}

/// `-m ecn`, as ecn_mt4/ecn_mt6: the IP ECN field, then the TCP ECE/CWR flags of a TCP packet
/// (for IPv6 also behind extension headers: the kernel oracle's `header-v6/cwr-ect2-dst`
/// matches). A non-first fragment has no TCP header here: a TCP-flag test is false on it (the
/// kernel would read the fragment's payload bytes as flags).
fn ecn_matches(e: &EcnMatch, p: &PacketMeta) -> bool {
    if let Some(ect) = e.ect {
        if (p.tos & 3 == ect.value) == ect.negated {
            return false;
        }
    }
    if e.ece.is_none() && e.cwr.is_none() {
        return true;
    }
    if p.protocol != 6 || p.fragment {
        return false;
    }
    let flag = |want: Option<bool>, bit: u8| {
        want.is_none_or(|negated| (p.tcp_flags & bit != 0) != negated)
    };
    flag(e.ece, 0x40) && flag(e.cwr, 0x80)
}

/// `-m frag`, as frag_mt6 (`--fraglen` is not compared, as there).
fn frag_matches(f: &FragMatch, h: &crate::packet::FragmentHeader) -> bool {
    let off = h.offset_flags;
    f.id.value.contains(h.id) != f.id.negated
        && !(f.res && (h.reserved != 0 || off & 0x6 != 0))
        && !(f.first && off & !0x7 != 0)
        && !(f.more && off & 1 == 0)
        && !(f.last && off & 1 != 0)
}

/// Whether the packet has a conntrack entry to read or change: not INVALID (none found)
/// nor UNTRACKED (NOTRACK), as `nf_ct_get` returns NULL for both. With no tracker the
/// packet's own `ct_state` (NEW by default) says so.
#[inline]
fn has_entry(p: &PacketMeta) -> bool {
    p.ct_state & (ct_state::INVALID | ct_state::UNTRACKED) == 0
}

/// `--ctstate`, as conntrack_mt: SNAT / DNAT join the state of a packet with an entry; an
/// INVALID (no entry) or UNTRACKED packet has no status bits to read.
#[inline]
fn ct_state_matches(negated: bool, bits: u8, p: &PacketMeta, f: &PacketFacts) -> bool {
    // The NAT bits are facts: read only when the match asks for SNAT or DNAT.
    let nat = if bits & (ct_state::SNAT | ct_state::DNAT) != 0 && has_entry(p) {
        f.ct_nat
    } else {
        0
    };
    ((p.ct_state | nat) & bits != 0) != negated
}

/// `-m conntrack` with tuple options, as conntrack_mt: the state first; without an entry the
/// match holds only if a state was asked (and held); then the direction, the protocol, and
/// the tuples of the entry. The engine's tracker sees packets as the kernel hands them over
/// (after the kernel's NAT, if any), so its original tuple is the packet's own addresses and
/// ports in the original direction and their swap in the reply direction, and the reply tuple
/// the swap of the original.
fn conntrack_matches(c: &CConntrack, p: &PacketMeta, f: &PacketFacts) -> bool {
    if let Some((neg, bits)) = c.state {
        if !ct_state_matches(neg, bits, p, f) {
            return false;
        }
    }
    if !has_entry(p) {
        return c.state.is_some();
    }
    if c.reply.is_some_and(|r| r != p.ct_reply) {
        return false;
    }
    if c.proto.is_some_and(|(neg, n)| (p.protocol == n) == neg) {
        return false;
    }
    let (os, od, osp, odp) = if p.ct_reply {
        (p.dst, p.src, p.dport, p.sport)
    } else {
        (p.src, p.dst, p.sport, p.dport)
    };
    // Under the kernel's DNAT its original destination is not the packet's (translated)
    // one; the reply tuple's source is the translated address either way.
    let (kd, kdp) = match f.ct_orig_dst {
        Some((a, port)) => (a, port.unwrap_or(odp)),
        None => (od, odp),
    };
    let addrs = [os, kd, od, os];
    let ports = [osp, kdp, odp, osp];
    c.addrs
        .iter()
        .zip(addrs)
        .all(|(m, a)| m.is_none_or(|(neg, net)| net.matches(addr_bits(a)) != neg))
        && c.ports
            .iter()
            .zip(ports)
            .all(|(m, port)| m.is_none_or(|(neg, r)| r.contains(port) != neg))
}

/// `-m owner`, as owner_mt (see [`crate::model::OwnerMatch`]).
fn owner_matches(w: &crate::model::OwnerMatch, f: &PacketFacts) -> bool {
    let Some((uid, gid)) = f.owner else {
        // No socket: true only when every given option is negated.
        return w.socket.is_none_or(|n| n)
            && w.uid.is_none_or(|v| v.negated)
            && w.gid.is_none_or(|v| v.negated);
    };
    if w.socket == Some(true) {
        return false;
    }
    w.uid.is_none_or(|v| v.value.contains(uid) != v.negated)
        && w.gid.is_none_or(|v| v.value.contains(gid) != v.negated)
}

/// `-m physdev`, as physdev_mt (see [`crate::model::PhysdevMatch`]).
fn physdev_matches(d: &CPhysdev, p: &PacketFacts) -> bool {
    let (indev, outdev) = (!p.phys_in.is_empty(), !p.phys_out.is_empty());
    if !indev && !outdev {
        // No bridge information: only when every given option is negated.
        return d.is_bridged.is_none_or(|n| n)
            && d.is_in.is_none_or(|n| n)
            && d.physdev_in.is_none_or(|(n, _)| n)
            && d.is_out.is_none_or(|n| n)
            && d.physdev_out.is_none_or(|(n, _)| n);
    }
    d.is_bridged.is_none_or(|n| outdev != n)
        && d.is_in.is_none_or(|n| indev != n)
        && d.is_out.is_none_or(|n| outdev != n)
        // A name test whose port is absent is skipped, negated or not.
        && d.physdev_in.is_none_or(|(n, pat)| !indev || pat.matches(&p.phys_in) != n)
        && d.physdev_out.is_none_or(|(n, pat)| !outdev || pat.matches(&p.phys_out) != n)
}

/// `-j CONNMARK`, as connmark_tg (xt_connmark revision 1): nothing without an entry.
fn connmark(c: &ConnmarkTarget, p: &mut PacketMeta) {
    if !has_entry(p) {
        return;
    }
    match *c {
        ConnmarkTarget::Set(m) => p.ct_mark = m.apply(p.ct_mark),
        ConnmarkTarget::Save { nfmask, ctmask } => {
            p.ct_mark = (p.ct_mark & !ctmask) ^ (p.mark & nfmask);
        }
        ConnmarkTarget::Restore { nfmask, ctmask } => {
            p.mark = (p.mark & !nfmask) ^ (p.ct_mark & ctmask);
        }
    }
}

#[inline]
fn port_in(r: &Option<(bool, PortRange)>, port: u16) -> bool {
    match r {
        None => true,
        Some((neg, range)) => range.contains(port) != *neg,
    }
}

#[inline]
fn has_ports(proto: u8) -> bool {
    // TCP, UDP, DCCP, SCTP, UDP-Lite: the protocols multiport accepts.
    matches!(proto, 6 | 17 | 33 | 132 | 136)
}

impl Snapshot {
    #[inline]
    fn header_matches(r: &CRule, p: &PacketMeta, f: &PacketFacts) -> bool {
        if r.src.matches(addr_bits(p.src)) == r.src_negated
            || r.dst.matches(addr_bits(p.dst)) == r.dst_negated
        {
            return false;
        }
        if let Some((neg, pat)) = &r.in_iface {
            if pat.matches(&f.in_iface) == *neg {
                return false;
            }
        }
        if let Some((neg, pat)) = &r.out_iface {
            if pat.matches(f.out_iface_at(p.hook)) == *neg {
                return false;
            }
        }
        if let Some((neg, proto)) = r.protocol {
            if (p.protocol == proto) == neg {
                return false;
            }
        }
        if let Some(frag) = r.fragment {
            if p.fragment != frag {
                return false;
            }
        }
        true
    }

    /// Whether `r` matches `p`: header fields, then every match in written order (a `-m limit`
    /// is only asked when everything before it matched, as in the kernel).
    #[inline]
    pub(crate) fn rule_matches<O: Observer>(
        r: &CRule,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> bool {
        Self::header_matches(r, p, f)
            && r.matches.iter().all(|m| Self::match_one(m, p, f, now, obs))
    }

    #[inline]
    fn match_one<O: Observer>(
        m: &CMatch,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> bool {
        match m {
            CMatch::Tcp {
                sport,
                dport,
                flags,
                option,
            } => {
                // As tcp_mt: a non-first fragment has no TCP header to look at; the 20-byte
                // header (and the options, for --tcp-option) must be there, else hotdrop.
                if p.fragment {
                    return false;
                }
                if let Some(n) = p.l4_cut {
                    if n < 20 || option.is_some() {
                        obs.hotdrop();
                        return false;
                    }
                }
                port_in(sport, p.sport)
                    && port_in(dport, p.dport)
                    && flags.is_none_or(|(neg, mask, comp)| (p.tcp_flags & mask == comp) != neg)
                    && option.is_none_or(|(neg, kind)| f.has_tcp_option(kind) != neg)
            }
            CMatch::Udp { sport, dport } => {
                if p.fragment {
                    return false;
                }
                // As udp_mt: the 8-byte header must be there (a cut one is shorter).
                if p.l4_cut.is_some() {
                    obs.hotdrop();
                    return false;
                }
                port_in(sport, p.sport) && port_in(dport, p.dport)
            }
            CMatch::Multiport {
                dir,
                negated,
                ports,
            } => {
                if p.fragment || !has_ports(p.protocol) {
                    return false;
                }
                // As multiport_mt: the 4 port bytes.
                if p.l4_cut.is_some_and(|n| n < 4) {
                    obs.hotdrop();
                    return false;
                }
                let hit = ports.iter().any(|r| match dir {
                    MultiportDir::Source => r.contains(p.sport),
                    MultiportDir::Destination => r.contains(p.dport),
                    MultiportDir::Either => r.contains(p.sport) || r.contains(p.dport),
                });
                hit != *negated
            }
            CMatch::Icmp {
                negated,
                icmp_type,
                code,
            } => {
                if p.fragment {
                    return false;
                }
                // As icmp_match / icmp6_match: the 8-byte header.
                if p.l4_cut.is_some() {
                    obs.hotdrop();
                    return false;
                }
                let hit = match icmp_type {
                    None => true,
                    Some(t) => p.icmp_type == *t && code.0 <= p.icmp_code && p.icmp_code <= code.1,
                };
                hit != *negated
            }
            CMatch::CtState { negated, bits } => ct_state_matches(*negated, *bits, p, f),
            CMatch::Conntrack(c) => conntrack_matches(c, p, f),
            CMatch::Iprange(r) => {
                let IprangeMatch { src, dst } = &**r;
                let within = |ip: IpAddr, lo: IpAddr, hi: IpAddr| {
                    addr_bits(lo) <= addr_bits(ip) && addr_bits(ip) <= addr_bits(hi)
                };
                src.is_none_or(|(neg, lo, hi)| within(p.src, lo, hi) != neg)
                    && dst.is_none_or(|(neg, lo, hi)| within(p.dst, lo, hi) != neg)
            }
            CMatch::Set { negated, set, dirs } => set.contains(p, dirs, now) != *negated,
            CMatch::Mark {
                negated,
                value,
                mask,
            } => (p.mark & mask == *value) != *negated,
            CMatch::Connmark {
                negated,
                value,
                mask,
            } => has_entry(p) && (p.ct_mark & mask == *value) != *negated,
            CMatch::Never => false,
            CMatch::KernelFact(bit) => f.kernel_facts & bit != 0,
            CMatch::Owner(w) => owner_matches(w, f),
            CMatch::Physdev(d) => physdev_matches(d, f),
            CMatch::Length { negated, range } => {
                (u64::from(range.lo) <= u64::from(p.len) && u64::from(p.len) <= u64::from(range.hi))
                    != *negated
            }
            CMatch::Limit(bucket) => obs.limit(bucket, now),
            // As mac_mt: no link-layer source, no match (even when negated).
            CMatch::Mac { negated, mac } => f.src_mac.is_some_and(|m| (m == *mac) != *negated),
            CMatch::Ttl(t) => match t.op {
                TtlOp::Eq => p.ttl == t.value,
                TtlOp::Ne => p.ttl != t.value,
                TtlOp::Lt => p.ttl < t.value,
                TtlOp::Gt => p.ttl > t.value,
            },
            CMatch::Tos {
                negated,
                value,
                mask,
            } => (p.tos & mask == *value) != *negated,
            CMatch::Ecn(e) => ecn_matches(e, p),
            // As ah_mt: a non-first fragment has no AH header.
            CMatch::Ah { negated, spi } => !p.fragment && spi.contains(f.ah_spi) != *negated,
            CMatch::Frag(m) => f.ipv6_ext.fragment.is_some_and(|h| frag_matches(m, &h)),
            CMatch::Rt(r) => f.ipv6_ext.routing.is_some_and(|h| {
                r.segsleft.value.contains(u32::from(h.segments_left)) != r.segsleft.negated
                    && r.len
                        .is_none_or(|l| (l.value == u32::from(h.len)) != l.negated)
                    && r.rt_type
                        .is_none_or(|t| (t.value == h.rt_type) != t.negated)
            }),
            CMatch::AddrType(a) => addrtype_matches(a, p, f),
            CMatch::Rpfilter { flags, addrs } => rpfilter_matches(*flags, addrs, p, f),
            CMatch::PktType {
                negated,
                kind,
                addrs,
            } => pkttype_matches(*negated, *kind, addrs.as_deref(), p, f),
            CMatch::Recent(r) => obs.recent(r, p, now),
            CMatch::Hashlimit(h) => {
                // As hashlimit_init_dst: the ports must be there when the key has them.
                if p.l4_cut.is_some_and(|n| n < 4) && h.reads_ports(p) {
                    obs.hotdrop();
                    return false;
                }
                obs.hashlimit(h, p, now)
            }
            CMatch::Connlimit(c) => obs.connlimit(c, p, f, now),
            CMatch::String(s) => s.matches(obs.payload()),
            CMatch::U32(u) => u32_match::u32_matches(u, obs.payload(), p.len),
            CMatch::Sctp(s) => match sctp::sctp_matches(s, p, obs.payload()) {
                sctp::SctpAnswer::Match(hit) => hit,
                sctp::SctpAnswer::Hotdrop => {
                    obs.hotdrop();
                    false
                }
            },
            CMatch::Ipv6Header(h) => {
                let have = f.ipv6_ext.mask;
                if h.soft {
                    // ip6t_ipv6header: `!((temp ^ matchflags ^ invflags) & matchflags)`, with
                    // invflags 0xff when negated: each listed header present (absent).
                    let inv = if h.negated { 0xff } else { 0 };
                    (have ^ h.headers ^ inv) & h.headers == 0
                } else {
                    (have == h.headers) != h.negated
                }
            }
        }
    }

    /// Runs one base chain; `None` means ACCEPT-and-continue with the next base chain.
    fn run_chain<O: Observer>(
        &self,
        base: u32,
        p: &mut PacketMeta,
        f: &mut PacketFacts,
        now: u64,
        obs: &mut O,
        hint: Hint,
    ) -> Option<Verdict> {
        // Return points of `-j`: (chain, next rule). Left uninitialised: zeroing 512 bytes for
        // every packet and base chain cost ~6% of a 1k-rule lookup, and most packets never jump.
        let mut stack = [MaybeUninit::<(u32, u32)>::uninit(); MAX_CALL_DEPTH];
        let mut depth = 0usize;
        // Verdict-map dispatches of this walk: an element added without a commit may close a
        // `goto` loop that validation never saw; past MAX_CALL_DEPTH the packet is dropped
        // (the kernel refuses such an element instead).
        let mut vmap_hops = 0usize;
        let mut chain = base;
        let mut next = 0u32;
        loop {
            let c = &self.chains[chain as usize];
            let body = &*c.body;
            let n = body.rules.len() as u32;
            if next >= n {
                if depth == 0 {
                    return self.apply_policy(base, p, obs);
                }
                depth -= 1;
                // SAFETY: every slot below the old `depth` was written by the push below (the
                // only place `depth` grows), so `stack[depth]` is initialised.
                (chain, next) = unsafe { stack[depth].assume_init() };
                continue;
            }
            let rules = &body.rules;
            let found = match &body.index {
                // A cut transport header takes the linear walk: the kernel evaluates rules in
                // order, and the first match that reads a missing byte drops the packet, which
                // an index (which skips rules by their ports) cannot see.
                _ if p.l4_cut.is_some() => {
                    let mut watch = HotdropWatch {
                        inner: &mut *obs,
                        dropped: false,
                    };
                    let at = rules.find_from(next, |r| {
                        Self::rule_matches(r, p, f, now, &mut watch) || watch.dropped
                    });
                    if watch.dropped {
                        return Some(Verdict::Drop);
                    }
                    at
                }
                Some(idx) if next == 0 && chain == hint.chain && hint.best != PROBE_UNKNOWN => {
                    if idx.has_rfc() {
                        // The RFC probe's answer is the first match itself.
                        (hint.best != u32::MAX).then_some(hint.best)
                    } else {
                        self.indexed_rest(idx, rules, 0, hint.best, p, f, now, obs)
                    }
                }
                Some(idx) => self.indexed_next(idx, rules, next, p, f, now, obs),
                None => rules.find_from(next, |r| Self::rule_matches(r, p, f, now, obs)),
            };
            let Some(at) = found else {
                next = n;
                continue;
            };
            next = at + 1;
            let r = &rules[at as usize];
            obs.rule(c.body.slots[at as usize] as usize, c, next, p);
            // A named verdict map's rule acts as its element's verdict; no element: the
            // next rule.
            let target = match &r.target {
                CTarget::Vmap(v) => match v.target(p, now) {
                    Some(t) => {
                        vmap_hops += 1;
                        if vmap_hops > MAX_CALL_DEPTH {
                            obs.outcome(StepOutcome::Drop);
                            return Some(Verdict::Drop);
                        }
                        t
                    }
                    None => continue,
                },
                t => t,
            };
            match target {
                CTarget::Continue => {}
                CTarget::Accept => {
                    obs.outcome(StepOutcome::Accept);
                    return None;
                }
                CTarget::Drop => {
                    obs.outcome(StepOutcome::Drop);
                    return Some(Verdict::Drop);
                }
                CTarget::Reject(w) => {
                    obs.outcome(StepOutcome::Reject);
                    return Some(Verdict::Reject(*w));
                }
                CTarget::Return => {
                    obs.outcome(StepOutcome::Return);
                    if depth == 0 {
                        return self.apply_policy(base, p, obs);
                    }
                    depth -= 1;
                    // SAFETY: every slot below the old `depth` was written by the push below (the
                    // only place `depth` grows), so `stack[depth]` is initialised.
                    (chain, next) = unsafe { stack[depth].assume_init() };
                }
                CTarget::Jump(t) => {
                    obs.outcome(StepOutcome::Jump);
                    if depth == MAX_CALL_DEPTH {
                        return Some(Verdict::Drop);
                    }
                    stack[depth] = MaybeUninit::new((chain, next));
                    depth += 1;
                    chain = c.table_base + *t;
                    next = 0;
                }
                CTarget::Goto(t) => {
                    obs.outcome(StepOutcome::Goto);
                    chain = c.table_base + *t;
                    next = 0;
                }
                CTarget::Log(log) => obs.log(c, chain, next, log, p, f),
                // xt_ct_target / notrack_tg: only the first of them a packet meets acts.
                CTarget::Notrack => {
                    if f.ct_zone.is_none() {
                        p.ct_state = ct_state::UNTRACKED;
                    }
                }
                CTarget::Ct(z) => {
                    if f.ct_zone.is_none() && p.ct_state != ct_state::UNTRACKED {
                        f.ct_zone = Some(z.resolve(p.mark));
                    }
                }
                CTarget::Mark(m) => p.mark = m.apply(p.mark),
                CTarget::Connmark(cm) => connmark(cm, p),
                // A map element's verdict is never another map.
                CTarget::Vmap(_) => {}
            }
        }
    }

    fn apply_policy<O: Observer>(&self, base: u32, p: &PacketMeta, obs: &mut O) -> Option<Verdict> {
        let c = &self.chains[base as usize];
        obs.policy(c.policy_slot as usize, c, p);
        match c.policy {
            Some(Policy::Drop) => Some(Verdict::Drop),
            Some(Policy::Accept) | None => None,
        }
    }

    /// The walk's first part, up to conntrack's lookup (netfilter priority -200): the
    /// raw-table chains of the first hook the packet passes in the kernel. A packet handed over
    /// at INPUT or FORWARD has passed PREROUTING: when PREROUTING has chains, the walk starts
    /// there, with the packet's hook set to PREROUTING (so no output interface:
    /// `PacketFacts::out_iface_at`, as the kernel sees it there) until
    /// [`Snapshot::walk_rest`] leaves PREROUTING. `Err` is a final
    /// verdict (DROP or REJECT; the lookup and the later chains never see the packet); `Ok`
    /// is where the walk stands, for [`Snapshot::walk_rest`] after the lookup.
    #[inline]
    pub(crate) fn walk_raw<O: Observer>(
        &self,
        p: &mut PacketMeta,
        facts: &mut PacketFacts,
        now: u64,
        obs: &mut O,
        hint: Hint,
    ) -> Result<Walk, Verdict> {
        let f = family_index(p.family);
        let hook = p.hook;
        let mut walk = Walk {
            f,
            hook,
            at_prerouting: false,
        };
        if matches!(hook, Hook::Input | Hook::Forward)
            && !self.hooks[f][Hook::Prerouting.index()].is_empty()
        {
            // No output interface at PREROUTING: `PacketFacts::out_iface_at` hides it (the
            // facts are not written, so a ruleset without `-o` never touches them).
            walk.at_prerouting = true;
            p.hook = Hook::Prerouting;
        }
        let (raw, _) = self.hook_chains(f, p.hook);
        for &base in raw {
            if let Some(v) = self.run_chain(base, p, facts, now, obs, hint) {
                walk.leave_prerouting(p);
                return Err(v);
            }
        }
        Ok(walk)
    }

    /// The walk's second part, after conntrack's lookup: `ct` is the lookup's verdict (`Some`
    /// is final: DROP when the table had no room), else the other chains of the hook the walk
    /// stands at, then, when that was PREROUTING, all chains of the packet's own hook (raw
    /// ones included: conntrack ran once). A DROP or REJECT of any chain is final; a packet
    /// that passes every hook is ACCEPTed. The packet leaves with its own hook.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the walk's state, passed as it is
    pub(crate) fn walk_rest<O: Observer>(
        &self,
        walk: Walk,
        ct: Option<Verdict>,
        p: &mut PacketMeta,
        facts: &mut PacketFacts,
        now: u64,
        obs: &mut O,
        hint: Hint,
    ) -> Verdict {
        if let Some(v) = ct {
            walk.leave_prerouting(p);
            return v;
        }
        let (_, rest) = self.hook_chains(walk.f, p.hook);
        for &base in rest {
            if let Some(v) = self.run_chain(base, p, facts, now, obs, hint) {
                walk.leave_prerouting(p);
                return v;
            }
        }
        if walk.leave_prerouting(p) {
            let chains = &self.hooks[walk.f][walk.hook.index()];
            for &base in chains {
                if let Some(v) = self.run_chain(base, p, facts, now, obs, hint) {
                    return v;
                }
            }
        }
        Verdict::Accept
    }

    /// The base chains of `hook` for family index `f`, split into the raw-table ones (before
    /// conntrack's lookup) and the others.
    #[inline]
    fn hook_chains(&self, f: usize, hook: Hook) -> (&[u32], &[u32]) {
        let h = hook.index();
        let chains = &self.hooks[f][h];
        chains.split_at((self.raw_chains[f][h] as usize).min(chains.len()))
    }
}

/// Where a packet's walk stands between [`Snapshot::walk_raw`] and [`Snapshot::walk_rest`]:
/// the packet's own hook, and whether the walk is at PREROUTING for it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk {
    f: usize,
    hook: Hook,
    /// The walk is at PREROUTING for a packet of INPUT or FORWARD.
    at_prerouting: bool,
}

impl Walk {
    /// Gives the packet back its own hook if the walk was at PREROUTING; says whether it
    /// was.
    #[inline]
    fn leave_prerouting(&self, p: &mut PacketMeta) -> bool {
        if self.at_prerouting {
            p.hook = self.hook;
        }
        self.at_prerouting
    }
}

/// The batch probe's answer for one packet (`Snapshot::probe`): the tables' part of the
/// first index query of base chain `chain` from rule 0 (`best`: a rule position, `u32::MAX`
/// for none, or [`PROBE_UNKNOWN`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hint {
    chain: u32,
    best: u32,
}

impl Hint {
    /// No probe was made: every query goes to the index.
    pub(crate) const NONE: Hint = Hint {
        chain: u32::MAX,
        best: PROBE_UNKNOWN,
    };
}

/// Packets the classify loop ([`Snapshot::classify_batch`]) probes together; a longer slice
/// is taken in groups of this many.
pub const CLASSIFY_BATCH: usize = PROBE_BATCH;

impl Snapshot {
    /// The hot-path observer of the walk on `core` (folded onto the last core when `core` is
    /// not below [`Snapshot::cores`]): counts every matched rule and applied policy in the
    /// core's counters, hands `-j LOG` hits to `logs`, lets `-m connlimit` count in `ct`.
    /// Set each packet's bytes (for `-m string`) with `Counting::set_payload`.
    pub(crate) fn counting<'a, L: LogSink + ?Sized>(
        &'a self,
        core: usize,
        ct: Option<&'a Conntrack>,
        logs: &'a mut L,
    ) -> Counting<'a, L> {
        Counting {
            counters: self.cells.core(core),
            ct,
            payload: &[],
            snapshot: self.id,
            names: &self.names,
            logs,
        }
    }

    /// The index probe of a group of up to [`PROBE_BATCH`] packets (`facts`: theirs, a
    /// packet beyond the slice has none known): picks each packet's first base chain with an
    /// index worth probing in batches, probes that chain's hash tables (or RFC tables) for all
    /// its packets at once with their memory accesses interleaved (after Open vSwitch's
    /// `dpcls_lookup`: [`ChainIndex::probe_batch`]), and writes each packet's answer into
    /// `hints` (same index). Then requests what each walk reads first, for all packets before
    /// the first walk runs: the probed rule (its target) and its counter line in `obs`'s core.
    pub(crate) fn probe<L: LogSink + ?Sized>(
        &self,
        packets: &[PacketMeta],
        facts: &[PacketFacts],
        now: u64,
        obs: &Counting<'_, L>,
        hints: &mut [Hint; PROBE_BATCH],
    ) {
        let mut chains = [u32::MAX; PROBE_BATCH];
        let mut best = [PROBE_UNKNOWN; PROBE_BATCH];
        self.probe_chains(packets, facts, now, &mut chains, &mut best);
        let m = packets.len().min(PROBE_BATCH);
        for ((h, &c), &b) in hints.iter_mut().zip(&chains).zip(&best).take(m) {
            *h = Hint { chain: c, best: b };
            if c == u32::MAX || b >= PROBE_UNKNOWN {
                continue;
            }
            let body = &self.chains[c as usize].body;
            if let Some(r) = body.rules.get(b as usize) {
                prefetch(&r.target);
            }
            if let Some(&slot) = body.slots.get(b as usize) {
                if let Some(line) = obs.counters.lines.get(slot as usize / 4) {
                    prefetch(line);
                }
            }
        }
    }

    /// Picks each packet's first base chain with an index worth probing in batches
    /// (`chains[i]`, `u32::MAX` if its hook has none) and probes that chain's tables for all
    /// its packets at once (`best[i]`).
    fn probe_chains(
        &self,
        packets: &[PacketMeta],
        facts: &[PacketFacts],
        now: u64,
        chains: &mut [u32; PROBE_BATCH],
        best: &mut [u32; PROBE_BATCH],
    ) {
        let min_bytes = match self.classifier {
            Classifier::TupleMerge {
                batch_min_bytes, ..
            } => batch_min_bytes,
            Classifier::Linear => usize::MAX,
        };
        let mut memo: Option<((usize, usize), u32)> = None;
        let mut pending = 0u64;
        for (i, p) in packets.iter().enumerate().take(PROBE_BATCH) {
            let fh = (family_index(p.family), p.hook.index());
            let c = match memo {
                Some((k, c)) if k == fh => c,
                _ => {
                    let c = self.hooks[fh.0][fh.1]
                        .iter()
                        .copied()
                        .find(|&c| {
                            let body = &self.chains[c as usize].body;
                            body.index
                                .as_ref()
                                .is_some_and(|i| i.bytes() >= min_bytes || i.has_rfc())
                        })
                        .unwrap_or(u32::MAX);
                    memo = Some((fh, c));
                    c
                }
            };
            chains[i] = c;
            if c != u32::MAX {
                pending |= 1 << i;
            }
        }
        let mut which = [0u8; PROBE_BATCH];
        while pending != 0 {
            let c = chains[pending.trailing_zeros() as usize];
            let mut m = 0;
            let mut rest = pending;
            while rest != 0 {
                let j = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                if chains[j] == c {
                    which[m] = j as u8;
                    m += 1;
                    pending &= !(1 << j);
                }
            }
            let body = &*self.chains[c as usize].body;
            if let Some(idx) = &body.index {
                idx.probe_batch(&body.rules, packets, facts, &which[..m], now, best);
            }
        }
    }
}

// === batched probe ===

/// Most packets one [`ChainIndex::probe_batch`] call takes (a `u64` bit set covers them).
pub(crate) const PROBE_BATCH: usize = 64;

/// The default of [`Classifier::TupleMerge`]'s `batch_min_bytes` (112 KiB): the smallest
/// chain index (bytes as [`Snapshot::memory_bytes`] counts them) that
/// [`Snapshot::classify_batch`] probes in batches. A smaller one sits in L1/L2, where there
/// is no latency to hide and the batch's bookkeeping (hash, bounds and tags stored per packet and table, then read back)
/// cost 10-15% on the 1k ClassBench sets; from about 1.5k rules the batch gained 24-32% on
/// acl1 and 4-7% on ipc1 and lost 7-9% on fw1 (whose lookups are dominated by filter
/// checks, not misses); at 10k it gains 2-25%, at 100k 60-100% (measured at 64 KiB when the
/// index took ~49 bytes a rule; the `ProbeEntry` copies brought that to ~82, and the
/// threshold moved with it so that it still falls near 1.3k ClassBench rules: at 64 KiB the
/// 1k sets were batched and 3-14% slower).
pub const PROBE_MIN_BYTES: usize = 112 << 10;

/// [`ChainIndex::probe_batch`]'s answer when a rule that reads `ct_state` passed its filter
/// below every pure match: the evaluation must query the index itself.
pub(crate) const PROBE_UNKNOWN: u32 = u32::MAX - 1;

/// Asks the CPU to bring the cache line holding `p` into L1. A hint: it never faults and
/// changes nothing visible, so any address, even one past an array's end, is fine.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: PREFETCHT0 reads no memory architecturally and cannot fault, whatever the
        // address (Intel SDM vol. 2, PREFETCHh); SSE is part of the x86_64 baseline.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A packet's hash inputs and filter key, computed once per batch.
#[derive(Clone, Copy, Default)]
pub(crate) struct ProbeKey {
    src: u128,
    dst: u128,
    l4: u64,
    key: PacketKey,
    v4: bool,
}

/// An observer for side-effect-free rules, which never report anything: such rules have no
/// `-m limit`, `-m recent`, `-m hashlimit` or `-m connlimit` (those sit in `effects`), and only the evaluator
/// reports matches.
pub(crate) struct Silent;

impl Observer for Silent {
    fn rule(&mut self, _: usize, _: &CChain, _: u32, _: &PacketMeta) {}
    fn policy(&mut self, _: usize, _: &CChain, _: &PacketMeta) {}
    fn limit(&mut self, _: &TokenBucket, _: u64) -> bool {
        false
    }
    fn recent(&mut self, _: &CRecent, _: &PacketMeta, _: u64) -> bool {
        false
    }
    fn hashlimit(&mut self, _: &CHashlimit, _: &PacketMeta, _: u64) -> bool {
        false
    }
    fn connlimit(&mut self, _: &CConnlimit, _: &PacketMeta, _: &PacketFacts, _: u64) -> bool {
        false
    }
    fn payload(&self) -> &[u8] {
        &[]
    }
    fn log(&mut self, _: &CChain, _: u32, _: u32, _: &LogSpec, _: &PacketMeta, _: &PacketFacts) {}
}

impl ChainIndex {
    /// The hash tables' part of [`Snapshot::indexed_next`] from start 0, for the packets
    /// `packets[which[k]]` at once; writes `out[which[k]]`: the position of the lowest matching
    /// rule any table holds, `u32::MAX` when none, or [`PROBE_UNKNOWN`] when a rule reading
    /// `ct_state` passed its filter below that (the state may still change before the packet
    /// reaches this chain). Every other field a table rule reads is fixed for the packet's
    /// evaluation, so the answer holds whenever the evaluation queries this chain from rule 0.
    ///
    /// The probes of the packets are interleaved, a table at a time, as in Open vSwitch's
    /// `dpcls_lookup` (lib/dpif-netdev.c: every subtable is probed for all still-unmatched
    /// packets of a batch, with prefetches between hashing and reading the buckets): first
    /// every live packet's key is hashed and its bucket bounds prefetched, then the bounds
    /// are read and the entries prefetched, then the entries are checked, so the cache misses
    /// of up to [`PROBE_BATCH`] packets overlap instead of following each other. A packet leaves
    /// the batch (in the hashing pass) once its best match is below the table's lowest rule
    /// (tables ascend by `min`), the per-packet early exit of the scalar lookup.
    pub(crate) fn probe_batch(
        &self,
        rules: &RuleChunks,
        packets: &[PacketMeta],
        facts: &[PacketFacts],
        which: &[u8],
        now: u64,
        out: &mut [u32; PROBE_BATCH],
    ) {
        let m = which.len().min(PROBE_BATCH);
        if let Some(rfc) = &self.rfc {
            let mut keys = [PacketKey::default(); PROBE_BATCH];
            for (key, &i) in keys.iter_mut().zip(&which[..m]) {
                *key = PacketKey::of(&packets[i as usize]);
            }
            let mut found = [0u32; PROBE_BATCH];
            rfc.lookup_batch(&keys[..m], &mut found[..m], PROBE_UNKNOWN);
            for (&f, &i) in found.iter().zip(&which[..m]) {
                // RFC tables leave out the fragment bit (see `Snapshot::indexed_next`).
                let fragment = packets[i as usize].fragment;
                out[i as usize] = if fragment { PROBE_UNKNOWN } else { f };
            }
            return;
        }
        let mut keys = [ProbeKey::default(); PROBE_BATCH];
        for (k, &i) in which[..m].iter().enumerate() {
            let p = &packets[i as usize];
            keys[k] = ProbeKey {
                src: addr_bits(p.src),
                dst: addr_bits(p.dst),
                l4: l4_word(p.protocol, p.sport, p.dport),
                key: PacketKey::of(p),
                v4: p.src.is_ipv4(),
            };
        }
        let mut best = [u32::MAX; PROBE_BATCH];
        // `best[k]` came from a rule reading ct_state (the answer is then PROBE_UNKNOWN).
        let mut unsure = [false; PROBE_BATCH];
        let mut live = [0u8; PROBE_BATCH];
        for (k, l) in live[..m].iter_mut().enumerate() {
            *l = k as u8;
        }
        let mut n_live = m;
        let mut tag = [0u32; PROBE_BATCH];
        let mut span = [(0u32, 0u32); PROBE_BATCH];
        // Indices below are masked with `LANES` (a no-op: every index is below PROBE_BATCH)
        // so the compiler drops the bounds checks.
        const LANES: usize = PROBE_BATCH - 1;
        for (t, probes) in self.tables.iter().zip(self.probes.iter()) {
            let probes: &[ProbeEntry] = probes;
            // 1. Retire the packets no table from here on can improve; hash the others' keys
            //    and prefetch their bucket bounds (one pass: a retired packet's slot is
            //    overwritten by the next packet's).
            let mut j = 0;
            for q in 0..n_live {
                let k = live[q & LANES];
                let key = &keys[k as usize & LANES];
                let h = if key.v4 {
                    t.masks.hash4(key.key.src, key.key.dst, key.l4)
                } else {
                    t.masks.hash(key.src, key.dst, key.l4)
                };
                let b = (h & t.bucket_mask) as u32;
                live[j & LANES] = k;
                span[j & LANES].0 = b;
                tag[j & LANES] = (h >> 32) as u32;
                prefetch(t.starts.as_ptr().wrapping_add(b as usize));
                j += usize::from(best[k as usize & LANES] > t.min);
            }
            n_live = j;
            if n_live == 0 {
                break;
            }
            // 2. Read the bounds, prefetch the bucket's entries.
            for s in &mut span[..n_live] {
                let b = s.0 as usize;
                *s = (t.starts[b], t.starts[b + 1]);
                prefetch(probes.as_ptr().wrapping_add(s.0 as usize));
            }
            // 3. Check the entries whose tag matches, in position order, below the best.
            for q in 0..n_live {
                let k = live[q & LANES] as usize & LANES;
                let (lo, hi) = span[q & LANES];
                let tag = tag[q & LANES] as u16;
                // Most buckets are decided by their first entry (a whole-rule filter that
                // passes, or none below the best): that case takes no data-dependent branch.
                // `probes[hi]` exists (a sentinel ends every table) and is ignored when empty.
                let e = &probes[lo as usize];
                let first = (lo < hi) & (e.pos < best[k]);
                let pass = first & e.passes(&keys[k].key, tag);
                let exact = pass & (e.flags & FILTER_EXACT != 0);
                best[k] = if exact { e.pos } else { best[k] };
                unsure[k] &= !exact;
                // Left to the loop below: a filter that is not the whole rule, or more entries
                // after a first one that failed.
                let more = (pass & !exact) | (first & !pass & (hi - lo > 1));
                if !more {
                    continue;
                }
                for e in &probes[lo as usize..hi as usize] {
                    let pos = e.pos;
                    if pos >= best[k] {
                        break;
                    }
                    if !e.passes(&keys[k].key, tag) {
                        continue;
                    }
                    if e.flags & FILTER_EXACT != 0 {
                        (best[k], unsure[k]) = (pos, false);
                        break;
                    }
                    if e.flags & FILTER_CTSTATE != 0 {
                        // Undecidable now; whatever lies above it no longer matters.
                        (best[k], unsure[k]) = (pos, true);
                        break;
                    }
                    let i = which[k] as usize;
                    let f = facts.get(i).unwrap_or(&PacketFacts::NONE);
                    if Snapshot::rule_matches(
                        &rules[pos as usize],
                        &packets[i],
                        f,
                        now,
                        &mut Silent,
                    ) {
                        (best[k], unsure[k]) = (pos, false);
                        break;
                    }
                }
            }
        }
        for (k, &i) in which[..m].iter().enumerate() {
            out[i as usize] = if unsure[k] { PROBE_UNKNOWN } else { best[k] };
        }
    }
}

// === impl Snapshot: indexed lookup ===

impl Snapshot {
    /// The position (0-based in the chain) of the first rule at or after `start` that matches
    /// `p`, exactly as the linear walk from `start` would find it, with the same `-m limit`
    /// side effects.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the evaluator's state, passed as it is
    pub(crate) fn indexed_next<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> Option<u32> {
        // RFC tables leave out the fragment bit: a non-first fragment takes the tables.
        if let Some(rfc) = idx.rfc.as_ref().filter(|_| !p.fragment) {
            match rfc.lookup(&PacketKey::of(p)) {
                Found::Exact(pos) if pos >= start => return Some(pos),
                // A cut list whose exact rule lies before `start`: the tables decide.
                Found::Exact(_) => {}
                Found::List(list) => {
                    let from = if start == 0 {
                        0
                    } else {
                        list.partition_point(|&r| r < start)
                    };
                    for &pos in &list[from..] {
                        if idx.filters[pos as usize].flags & FILTER_EXACT != 0
                            || Self::rule_matches(&rules[pos as usize], p, f, now, obs)
                        {
                            return Some(pos);
                        }
                    }
                    let cut = list
                        .last()
                        .is_some_and(|&l| idx.filters[l as usize].flags & FILTER_EXACT != 0);
                    if !cut {
                        return None;
                    }
                }
            }
        }
        self.tm_next(idx, rules, start, p, f, now, obs)
    }

    /// [`Snapshot::indexed_next`] on the TupleMerge tables.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the evaluator's state, passed as it is
    pub(crate) fn tm_next<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> Option<u32> {
        let src = addr_bits(p.src);
        let dst = addr_bits(p.dst);
        let l4 = l4_word(p.protocol, p.sport, p.dport);
        let key = PacketKey::of(p);
        let v4 = p.src.is_ipv4();
        let mut best = u32::MAX;
        // Packet by packet, the 8-byte entries are walked (walking the 32-byte probe entries
        // measured 3-10% slower here on the 1k ClassBench sets, whose tables then take more
        // of L1), and a candidate whose tag matches is checked against the filter in its
        // probe entry (same index as the bucket entry): its address is known from the bucket
        // bounds, not from the entry's position, and it needs no chunk lookup in `filters`.
        for (t, probes) in idx.tables.iter().zip(idx.probes.iter()) {
            if t.min >= best {
                break;
            }
            if t.max < start {
                continue;
            }
            let h = if v4 {
                t.masks.hash4(key.src, key.dst, l4)
            } else {
                t.masks.hash(src, dst, l4)
            };
            let b = (h & t.bucket_mask) as usize;
            let tag = (h >> 32) as u32;
            let (lo, hi) = (t.starts[b] as usize, t.starts[b + 1] as usize);
            let probes = &probes[lo..hi];
            for (e, &Entry { pos, tag: t_tag }) in probes.iter().zip(&t.entries[lo..hi]) {
                if pos >= best {
                    break;
                }
                if t_tag == tag
                    && pos >= start
                    && e.passes(&key, tag as u16)
                    && (e.flags & FILTER_EXACT != 0
                        || Self::rule_matches(&rules[pos as usize], p, f, now, obs))
                {
                    best = pos;
                    break;
                }
            }
        }
        self.indexed_rest(idx, rules, start, best, p, f, now, obs)
    }

    /// Whether the rule at `pos` (side-effect free) matches: the filter first (dense array, no
    /// rule read), the rule only when the filter is not the whole rule.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the evaluator's state, passed as it is
    pub(crate) fn filter_hit<O: Observer>(
        idx: &ChainIndex,
        rules: &RuleChunks,
        pos: u32,
        key: &PacketKey,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> bool {
        let filter = &idx.filters[pos as usize];
        filter.passes(key)
            && (filter.flags & FILTER_EXACT != 0
                || Self::rule_matches(&rules[pos as usize], p, f, now, obs))
    }

    /// The rest of [`Snapshot::indexed_next`] once the tables said `best` (the lowest matching
    /// rule they hold at or after `start`, `u32::MAX` for none): the unindexed rules below it,
    /// then the rules with side effects below the result, in order.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the evaluator's state, passed as it is
    pub(crate) fn indexed_rest<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        mut best: u32,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        obs: &mut O,
    ) -> Option<u32> {
        let from = idx.fallback.partition_point(|&r| r < start);
        if from < idx.fallback.len() && idx.fallback[from] < best {
            let key = PacketKey::of(p);
            for &pos in &idx.fallback[from..] {
                if pos >= best {
                    break;
                }
                if Self::filter_hit(idx, rules, pos, &key, p, f, now, obs) {
                    best = pos;
                    break;
                }
            }
        }
        // Every side-effect-free rule in [start, best) failed, so the linear walk would
        // evaluate exactly these, in this order, before reaching `best`.
        let from = idx.effects.partition_point(|&r| r < start);
        for &pos in &idx.effects[from..] {
            if pos >= best {
                break;
            }
            if Self::rule_matches(&rules[pos as usize], p, f, now, obs) {
                return Some(pos);
            }
        }
        (best != u32::MAX).then_some(best)
    }
}

/// What the RFC tables say about a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found<'a> {
    /// The candidates are this one rule, whose filter is the whole rule: it matches, and no
    /// rule before it can.
    Exact(u32),
    /// Every rule whose filter the packet passes (rules with side effects always),
    /// ascending, cut after the first rule whose filter is exact.
    List(&'a [u32]),
}

// === impl Rfc: lookup ===

impl Rfc {
    /// The class ids of phase 0 and 1 for one packet, then `(sdp, dport)` classes.
    #[inline(always)]
    fn classes(&self, k: &PacketKey) -> (u16, u16, u16) {
        let s = self.s.get(
            self.src_hi[(k.src >> 16) as usize],
            self.src_lo[(k.src & 0xffff) as usize],
        );
        let d = self.d.get(
            self.dst_hi[(k.dst >> 16) as usize],
            self.dst_lo[(k.dst & 0xffff) as usize],
        );
        let p = self.p.get(
            self.proto[usize::from(k.proto)],
            self.sport[usize::from(k.sport)],
        );
        (self.sd.get(s, d), p, self.dport[usize::from(k.dport)])
    }

    /// The final phase's answer for an entry of `fin`.
    #[inline(always)]
    fn found(&self, e: u32) -> Found<'_> {
        if e & DIRECT != 0 {
            Found::Exact(e & !DIRECT)
        } else {
            let l = e as usize;
            Found::List(&self.lists[self.starts[l] as usize..self.starts[l + 1] as usize])
        }
    }

    /// The candidates of a (not fragmented) IPv4 packet.
    #[inline]
    pub(crate) fn lookup(&self, k: &PacketKey) -> Found<'_> {
        let (sd, p, dport) = self.classes(k);
        let sdp = self.sdp.get(sd, p);
        self.found(self.fin[sdp as usize * self.fin_stride as usize + dport as usize])
    }

    /// [`Rfc::lookup`] for the packets `keys[..m]` a phase at a time, so that the table reads
    /// of different packets overlap (the batching of TupleMerge's probes); writes
    /// `out[k]`: the first matching rule's position, `u32::MAX` for none, `unsure` when the
    /// candidates need the evaluator.
    pub(crate) fn lookup_batch(&self, keys: &[PacketKey], out: &mut [u32], unsure: u32) {
        const N: usize = PROBE_BATCH;
        let m = keys.len().min(N).min(out.len());
        let mut mid = [(0u16, 0u16, 0u16); N];
        for (c, k) in mid.iter_mut().zip(&keys[..m]) {
            *c = self.classes(k);
        }
        let mut at = [0u32; N];
        for (a, &(sd, p, dport)) in at.iter_mut().zip(&mid[..m]) {
            *a = u32::from(self.sdp.get(sd, p)) * self.fin_stride + u32::from(dport);
        }
        for (o, &a) in out[..m].iter_mut().zip(&at[..m]) {
            *o = match self.found(self.fin[a as usize]) {
                Found::Exact(pos) => pos,
                Found::List([]) => u32::MAX,
                Found::List(_) => unsure,
            };
        }
    }
}
