//! The packet side of a [`Snapshot`]: [`Snapshot::classify_batch`], the one classify entry
//! (the worker's; its docs list the steps), the hooks' base chains in order with conntrack's
//! step ([`Track`]) between the raw and the other chains, the chain walk with its jump stack,
//! every match, the targets, and [`Snapshot::trace`] (the same walk with a recording observer,
//! in `eval/trace.rs`). A chain's first matching rule comes from the walk itself or from the
//! index probe in `eval/probe.rs` (the TupleMerge hash tables and the RFC tables, which the
//! commit side builds in `snapshot/tuple_merge.rs` and `snapshot/rfc.rs`). The matches that
//! read more than the parsed header have their own files: `eval/string.rs`, `eval/sctp.rs`,
//! `eval/u32_match.rs`, `eval/connlimit.rs`.
//!
//! Runs on the packet cores against a published, immutable snapshot. It takes no lock and
//! reads no clock (`now` is passed in); per packet it writes only this core's counter block
//! and the `-m limit` buckets of rules the packet reaches. A `-j LOG` hit goes to the caller's
//! [`LogSink`] (a worker's [`LogRing`] copies it into a fixed slot; a
//! `Vec<LogEvent>` allocates an event). Nothing else allocates, except [`Snapshot::trace`]'s
//! steps.

use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::sync::Arc;

use crate::conntrack::{Conntrack, Track};
use crate::model::{EcnMatch, FragMatch, Hook, MultiportDir, Policy, PortRange, TtlOp, ct_state};
use crate::packet::{PacketFacts, PacketMeta};

use crate::eval::connlimit::CConnlimit;
use crate::model::ConnmarkTarget;
use crate::snapshot::counters::CoreCounters;
use crate::snapshot::log_ring::{LogHit, LogSink};
use crate::snapshot::stateful::{CHashlimit, CRecent};
use crate::snapshot::tuple_merge::{self as tuple_merge, PROBE_BATCH, PROBE_UNKNOWN};
use crate::snapshot::*;

pub(crate) mod connlimit;
pub(crate) mod probe;
pub(crate) mod sctp;
pub(crate) mod string;
mod trace;
pub(crate) mod u32_match;

pub use probe::PROBE_MIN_BYTES;

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

/// The hot-path observer: bumps this core's counters and hands LOG hits to `logs`.
struct Counting<'a, L: ?Sized> {
    counters: &'a CoreCounters,
    /// The connection table `-m connlimit` asks (`None`: no tracker).
    ct: Option<&'a Conntrack>,
    /// The bytes of the packet being evaluated, for `-m string`.
    payload: &'a [u8],
    snapshot: u64,
    names: &'a [Arc<str>],
    logs: &'a mut L,
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
            match &r.target {
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

    /// Runs the base chains a packet handed over at `p.hook` has passed in the kernel, in
    /// the kernel's order, and returns the verdict:
    /// - at INPUT and FORWARD, first the PREROUTING chains (a packet the kernel queues there
    ///   has passed PREROUTING): raw PREROUTING, then `after_raw` (conntrack, priority -200),
    ///   then the other PREROUTING chains; with the packet's hook set to PREROUTING and no
    ///   output interface while they run, as the kernel sees it there;
    /// - then the hook's own chains: raw, `after_raw` if it has not run yet (OUTPUT: raw
    ///   OUTPUT, conntrack, filter OUTPUT; PREROUTING alone), then the others.
    ///
    /// A `Some` verdict of `after_raw` is final, as is a DROP or REJECT of any chain (the
    /// later hooks never see the packet). With `after_raw = |_| None` this is the plain walk:
    /// the closure is inlined away, so the path without conntrack pays nothing for the split.
    #[inline]
    fn evaluate<'t, O: Observer>(
        &self,
        p: &mut PacketMeta,
        facts: &mut PacketFacts,
        now: u64,
        obs: &mut O,
        hint: Hint,
        track: &mut impl Track<'t>,
    ) -> Verdict {
        let f = family_index(p.family);
        let hook = p.hook;
        let mut after_raw = Some(track);
        if matches!(hook, Hook::Input | Hook::Forward)
            && !self.hooks[f][Hook::Prerouting.index()].is_empty()
        {
            // No output interface at PREROUTING: `PacketFacts::out_iface_at` hides it (the
            // facts are not written, so a ruleset without `-o` never touches them).
            p.hook = Hook::Prerouting;
            let v = self.run_hook(
                f,
                Hook::Prerouting,
                p,
                facts,
                now,
                obs,
                hint,
                &mut after_raw,
            );
            p.hook = hook;
            if let Some(v) = v {
                return v;
            }
        }
        self.run_hook(f, hook, p, facts, now, obs, hint, &mut after_raw)
            .unwrap_or(Verdict::Accept)
    }

    /// One hook's base chains: raw, then `after_raw` (taken: it runs once per packet), then
    /// the rest. `Some` is a final verdict; `None` means the packet passed the hook.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn run_hook<'t, O: Observer>(
        &self,
        f: usize,
        hook: Hook,
        p: &mut PacketMeta,
        facts: &mut PacketFacts,
        now: u64,
        obs: &mut O,
        hint: Hint,
        after_raw: &mut Option<&mut impl Track<'t>>,
    ) -> Option<Verdict> {
        let h = hook.index();
        let chains = &self.hooks[f][h];
        let (raw, rest) = chains.split_at((self.raw_chains[f][h] as usize).min(chains.len()));
        for &base in raw {
            if let Some(v) = self.run_chain(base, p, facts, now, obs, hint) {
                return Some(v);
            }
        }
        if let Some(v) = after_raw.take().and_then(|t| t.lookup(p, facts, now)) {
            return Some(v);
        }
        for &base in rest {
            if let Some(v) = self.run_chain(base, p, facts, now, obs, hint) {
                return Some(v);
            }
        }
        None
    }
}

/// The batch probe's answer for one packet ([`Snapshot::classify_batch`]): the tables' part
/// of the first index query of base chain `chain` from rule 0 (`best`: a rule position,
/// `u32::MAX` for none, or [`PROBE_UNKNOWN`]).
#[derive(Clone, Copy, Debug)]
struct Hint {
    chain: u32,
    best: u32,
}

impl Hint {
    /// No probe was made: every query goes to the index.
    const NONE: Hint = Hint {
        chain: u32::MAX,
        best: PROBE_UNKNOWN,
    };
}

/// Packets [`Snapshot::classify_batch`] probes together; a longer slice is taken in chunks of
/// this many.
pub const CLASSIFY_BATCH: usize = PROBE_BATCH;

impl Snapshot {
    /// Classifies `packets` on `core` at `now`, each in order, with connection tracking by
    /// `track`, counting every matched rule and applied policy in that core's counters and
    /// handing `-j LOG` hits to `logs` ([`LogSink`]), and writes each verdict into `verdicts`
    /// (same index); processes `min(packets.len(), verdicts.len())` packets and returns that
    /// number. Counters, LOG events, `-m limit` tokens and `ct_state` come out exactly as from
    /// classifying the packets one by one (a slice of one is that). Allocates nothing, unless
    /// the sink does (`Vec<LogEvent>` does; [`LogRing`] does not).
    /// `core` must be below [`Snapshot::cores`]; a larger index is folded onto the last core.
    ///
    /// The one classify entry ([`crate::engine::EngineWorker::process`] calls it; tools and
    /// tests pass a slice of one), in this order:
    /// 1. **index probe** (`probe`, into `eval/probe.rs`): the hash tables
    ///    (or RFC tables) of each packet's first indexed base chain are probed for
    ///    [`CLASSIFY_BATCH`] packets at a time with their memory accesses interleaved (after
    ///    Open vSwitch's `dpcls_lookup`);
    /// 2. per packet, **the walk** (`evaluate`): the hook's raw-table chains, then
    ///    [`Track::lookup`] (conntrack, priority -200), then the other chains, each with
    ///    `run_chain` (index query, matches in `match_one`, targets, jump stack); the probed
    ///    chain starts from the probe's answer, later queries use the per-packet lookup;
    /// 3. **confirm** ([`Track::decided`]) with the packet's verdict, before the next packet.
    ///
    /// `bytes[i]` is packet `i` from its network header on, which `-m string` searches (a
    /// packet beyond the slice has none: `--string` is false for it); `-m connlimit` counts in
    /// [`Track::table`]. Pass `&[]` and [`NoTracking`](crate::conntrack::NoTracking) for neither.
    /// `facts[i]` is the cold part of packet `i` ([`PacketFacts`]), read only by the matches
    /// and targets that use it (and written by `-j CT`); a packet beyond the slice is
    /// classified with [`PacketFacts::default`] (nothing known: no interfaces, no options),
    /// so sources without facts pass `&mut []`.
    #[allow(clippy::too_many_arguments)]
    pub fn classify_batch<'t>(
        &self,
        core: usize,
        packets: &mut [PacketMeta],
        facts: &mut [PacketFacts],
        verdicts: &mut [Verdict],
        now: u64,
        logs: &mut (impl LogSink + ?Sized),
        bytes: &[&[u8]],
        track: &mut impl Track<'t>,
    ) -> usize {
        let n = packets.len().min(verdicts.len());
        let counters: &CoreCounters = self.cells.core(core);
        let mut obs = Counting {
            counters,
            ct: track.table(),
            payload: &[],
            snapshot: self.id,
            names: &self.names,
            logs,
        };
        let mut chains = [u32::MAX; PROBE_BATCH];
        let mut best = [PROBE_UNKNOWN; PROBE_BATCH];
        // The facts of packets beyond `facts` (reset for each).
        let mut none = PacketFacts::NONE;
        let mut lo = 0;
        while lo < n {
            let hi = (lo + PROBE_BATCH).min(n);
            let fs = facts
                .get(lo.min(facts.len())..hi.min(facts.len()))
                .unwrap_or(&[]);
            self.probe(&packets[lo..hi], fs, now, &mut chains, &mut best);
            // What each evaluation reads first, requested for all packets before the first
            // one runs: the probed rule (its target) and its counter line.
            for (&c, &b) in chains.iter().zip(best.iter()).take(hi - lo) {
                if c == u32::MAX || b >= PROBE_UNKNOWN {
                    continue;
                }
                let body = &self.chains[c as usize].body;
                if let Some(r) = body.rules.get(b as usize) {
                    tuple_merge::prefetch(&r.target);
                }
                if let Some(&slot) = body.slots.get(b as usize) {
                    if let Some(line) = counters.lines.get(slot as usize / 4) {
                        tuple_merge::prefetch(line);
                    }
                }
            }
            for i in lo..hi {
                let hint = Hint {
                    chain: chains[i - lo],
                    best: best[i - lo],
                };
                let p = &mut packets[i];
                let f = match facts.get_mut(i) {
                    Some(f) => f,
                    None => {
                        // The walk writes only the zone (`-j CT`) into the facts (the
                        // output interface it hides at PREROUTING comes back).
                        none.ct_zone = None;
                        debug_assert_eq!(none, PacketFacts::NONE);
                        &mut none
                    }
                };
                obs.payload = bytes.get(i).copied().unwrap_or(&[]);
                let v = self.evaluate(p, f, now, &mut obs, hint, &mut *track);
                verdicts[i] = track.decided(p, f, v, now);
            }
            lo = hi;
        }
        n
    }

    /// Picks each packet's first base chain with an index worth probing in batches
    /// (`chains[i]`, `u32::MAX` if its hook has none) and probes that chain's tables for all its packets at once (`best[i]`).
    fn probe(
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
