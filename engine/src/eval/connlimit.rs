//! `-m connlimit` on the packet path, as xt_connlimit with nf_conncount (Linux 6.x): each
//! compiled rule keeps its own lists of connections, one list per masked address, and a
//! packet's count is the length of its address's list after the list was cleaned and the
//! packet's own connection added.
//!
//! # What counts
//! As `__nf_conncount_add`: a list holds the original tuples of the connections whose packets
//! reached the rule. When the rule is asked, every remembered tuple other than the packet's
//! own is looked up in the engine's conntrack table ([`Conntrack::liveness`]); a TCP entry in
//! TIME_WAIT or CLOSE is dropped from the list (`already_closed`), and so is a tuple no live
//! entry holds (`find_or_evict`: its first packet was dropped, or the entry expired), unless
//! it was remembered less than [`UNCONFIRMED_GRACE_NS`] ago (another core's packet whose new
//! entry is not confirmed yet; the kernel waits two jiffies, or none on the same CPU). The
//! packet's own connection (its entry's original tuple; the packet's tuple when it has no
//! entry, as the kernel's `nf_ct_get_tuplepfn`) is then added once. A packet whose connection
//! is already confirmed (in the table) neither cleans nor adds: it gets the list's length as
//! it stands, stale tuples included, as Linux 6.18 answers. The grouping address is the
//! packet's source (`--connlimit-saddr`) or destination (`--connlimit-daddr`), masked.
//!
//! So only connections that met the rule count (a rule behind `--syn` counts the SYNs that
//! reached it), as in the kernel, and not every entry of the table from that address.
//!
//! # Where it differs from the kernel
//! - The kernel cleans at most 8 stale tuples a call and skips cleaning when the list was
//!   cleaned in the same jiffy; the engine cleans the whole list each time, so its count is
//!   exact where the kernel's may lag by stale tuples for a jiffy.
//! - The lists are per compiled rule: a commit that recompiles the rule's chain starts it
//!   empty (as the kernel, whose `iptables-restore` replaces every rule); a chain a commit
//!   does not change keeps them.
//! - NFQUEUE mode: the table asked is vallumd's own, which holds the connections whose
//!   packets vallumd accepted, not the kernel's (which also tracks what is never queued).
//!   A restart of vallumd starts the lists empty.
//! - A trace is a dry run: it counts as the packet would be counted and changes no list.
//!
//! # Cost
//! The lists live in [`SHARDS`] mutex-guarded maps by address; a packet takes one shard's
//! lock and does one lock-free conntrack lookup per remembered tuple of its address (its
//! list is at most the limit plus the connections still being set up, for a rule that
//! refuses above it). A new address or connection allocates (the kernel allocates its tree
//! node and tuple too). Memory is bounded by a sweep: when a shard holds more than twice the
//! tuples it held after its last sweep (and at least [`SWEEP_MIN`]), every list of the shard
//! is cleaned and empty ones removed, so each insert pays O(1) amortised.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::conntrack::{Conntrack, Liveness, Tuple};
use crate::model::{ConnlimitMatch, CtZone};
use crate::packet::{PacketFacts, PacketMeta};

use crate::snapshot::HashMap;

/// Shards of a rule's lists (each a mutex and a map by masked address).
pub(crate) const SHARDS: usize = 16;

/// A remembered tuple that no live entry holds is kept this long (ns) after it was added:
/// its first packet may still be on its way to being accepted on another core.
pub(crate) const UNCONFIRMED_GRACE_NS: u64 = 1_000_000;

/// A shard is swept only once it holds at least this many tuples.
pub(crate) const SWEEP_MIN: usize = 64;

/// The lists of one compiled `-m connlimit` rule.
#[derive(Debug)]
pub(crate) struct ConnCounts {
    shards: Box<[Mutex<Shard>]>,
}

#[derive(Debug, Default)]
struct Shard {
    /// By masked address (IPv4 in the low 32 bits).
    lists: HashMap<u128, Vec<Remembered>>,
    /// Tuples in all lists of the shard.
    tuples: usize,
    /// `tuples` after the last sweep.
    after_sweep: usize,
}

#[derive(Debug, Clone, Copy)]
struct Remembered {
    tuple: Tuple,
    /// The conntrack zone of its entry (nf_conncount keeps the zone with the tuple).
    zone: CtZone,
    /// When it was (last) added, in the caller's `now` ns.
    added: u64,
}

impl ConnCounts {
    fn new() -> ConnCounts {
        ConnCounts {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, key: u128) -> MutexGuard<'_, Shard> {
        let h = ((key as u64) ^ ((key >> 64) as u64)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // A panic under the lock leaves the lists consistent (each change is a push or a
        // retain), so a poisoned lock is used as it is.
        self.shards[(h >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether a remembered tuple (not the packet's own) still counts at `now`.
fn counts(r: &Remembered, now: u64, ct: Option<&Conntrack>) -> bool {
    match ct.map_or(Liveness::Absent, |ct| ct.liveness(&r.tuple, r.zone, now)) {
        Liveness::Live => true,
        Liveness::Closed => false,
        Liveness::Absent => now.saturating_sub(r.added) < UNCONFIRMED_GRACE_NS,
    }
}

/// A compiled `-m connlimit`: the rule's options and its lists.
#[derive(Debug, Clone)]
pub(crate) struct CConnlimit {
    rule: ConnlimitMatch,
    /// The prefix mask of the grouping address (IPv4 in the low 32 bits).
    mask: u128,
    counts: Arc<ConnCounts>,
}

fn addr_bits(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

impl CConnlimit {
    /// The compiled form of `m` in a table of IPv6 (`v6`) or IPv4, with empty lists.
    pub(crate) fn new(m: &ConnlimitMatch, v6: bool) -> CConnlimit {
        let width: u32 = if v6 { 128 } else { 32 };
        let all = if v6 { u128::MAX } else { u128::from(u32::MAX) };
        let len = u32::from(m.prefix).min(width);
        let mask = if len == 0 { 0 } else { all & !(all >> len) };
        CConnlimit {
            rule: *m,
            mask,
            counts: Arc::new(ConnCounts::new()),
        }
    }

    /// Whether the rule matches `p` at `now`, its connections looked up in `ct` (none: every
    /// remembered connection is gone, so only the packet's own counts). With `apply` false
    /// (a trace) no list changes.
    pub(crate) fn matches(
        &self,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        ct: Option<&Conntrack>,
        apply: bool,
    ) -> bool {
        self.rule.decides(self.count(p, f, now, ct, apply))
    }

    /// The connections of `p`'s masked address, its own included (module docs).
    pub(crate) fn count(
        &self,
        p: &PacketMeta,
        f: &PacketFacts,
        now: u64,
        ct: Option<&Conntrack>,
        apply: bool,
    ) -> u64 {
        let (t, _) = Tuple::from_packet(p);
        // The entry's original tuple: a reply-direction packet carries the reply tuple.
        let own = if p.ct_reply { t.reply() } else { t };
        let zone = f.ct_zone.unwrap_or_default();
        let addr = if self.rule.daddr { p.dst } else { p.src };
        let key = addr_bits(addr) & self.mask;
        let mut shard = self.counts.shard(key);
        // A packet of a confirmed connection (one the table holds: a retransmitted SYN, a
        // later packet) is not added and cleans nothing: it gets the list's length as it is
        // (`__nf_conncount_add` returns -EEXIST for `nf_ct_is_confirmed`, and `count_tree`
        // answers `list.count`; checked against Linux 6.18 in tests/it/kernel_connlimit.rs).
        if let Some(list) = shard.lists.get(&key) {
            if ct.is_some_and(|ct| ct.liveness(&own, zone, now) != Liveness::Absent) {
                return list.len() as u64;
            }
        }
        if !apply {
            let others = shard.lists.get(&key).map_or(0, |l| {
                l.iter()
                    .filter(|r| (r.tuple, r.zone) != (own, zone) && counts(r, now, ct))
                    .count()
            });
            return others as u64 + 1;
        }
        let list = shard.lists.entry(key).or_default();
        let before = list.len();
        let mut seen_own = false;
        list.retain_mut(|r| {
            let is_own = (r.tuple, r.zone) == (own, zone);
            if is_own && !seen_own {
                seen_own = true;
                r.added = now;
                return true;
            }
            !is_own && counts(r, now, ct)
        });
        if !seen_own {
            list.push(Remembered {
                tuple: own,
                zone,
                added: now,
            });
        }
        let n = list.len();
        shard.tuples = shard.tuples + n - before;
        if shard.tuples > 2 * shard.after_sweep.max(SWEEP_MIN) {
            sweep(&mut shard, now, ct);
        }
        n as u64
    }

    /// Tuples remembered in all lists (tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.counts
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).tuples)
            .sum()
    }
}

/// Cleans every list of `shard` and removes the empty ones.
fn sweep(shard: &mut Shard, now: u64, ct: Option<&Conntrack>) {
    let mut tuples = 0;
    shard.lists.retain(|_, l| {
        l.retain(|r| counts(r, now, ct));
        tuples += l.len();
        !l.is_empty()
    });
    shard.tuples = tuples;
    shard.after_sweep = tuples;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::ConntrackConfig;
    use crate::model::tcp_flags::{ACK, RST, SYN};
    use crate::packet::Packet;

    fn syn(src: &str, sport: u16) -> PacketMeta {
        PacketMeta {
            src: src.parse().expect("address"),
            dst: "192.0.2.1".parse().expect("address"),
            protocol: 6,
            sport,
            dport: 22,
            tcp_flags: SYN,
            ..PacketMeta::default()
        }
    }

    fn rule(limit: u32, prefix: u8) -> CConnlimit {
        CConnlimit::new(
            &ConnlimitMatch {
                limit,
                upto: false,
                prefix,
                daddr: false,
            },
            false,
        )
    }

    /// Tracks and confirms `p` (its first packet accepted).
    fn open(ct: &Conntrack, p: &PacketMeta, now: u64) {
        ct.track(&mut Packet::from(*p), now);
    }

    #[test]
    fn counts_live_connections_of_the_masked_source_with_the_packets_own() {
        let ct = Conntrack::new(ConntrackConfig::default()).expect("table");
        let r = rule(2, 24);
        let ms = 1_000_000;
        for (i, sport) in [1000u16, 1001].into_iter().enumerate() {
            let p = syn("10.0.0.1", sport);
            let now = (i as u64 + 1) * ms;
            assert!(
                !r.matches(&p, &PacketFacts::NONE, now, Some(&ct), true),
                "connection {}",
                i + 1
            );
            open(&ct, &p, now);
        }
        // The third from the same /24 is above 2; a dry run says so and changes nothing.
        let third = syn("10.0.0.9", 1002);
        assert_eq!(
            r.count(&third, &PacketFacts::NONE, 3 * ms, Some(&ct), false),
            3
        );
        assert_eq!(r.remembered(), 2);
        assert!(r.matches(&third, &PacketFacts::NONE, 3 * ms, Some(&ct), true));
        // Refused, so never confirmed: a later packet no longer counts it.
        assert_eq!(
            r.count(
                &syn("10.0.0.9", 1003),
                &PacketFacts::NONE,
                5 * ms,
                Some(&ct),
                true
            ),
            3
        );
        assert_eq!(r.remembered(), 3, "the refused one was evicted");
        // Another /24 counts on its own.
        assert_eq!(
            r.count(
                &syn("10.0.1.1", 1000),
                &PacketFacts::NONE,
                6 * ms,
                Some(&ct),
                true
            ),
            1
        );
        // A retransmitted SYN of a confirmed connection is not counted twice, nor does it
        // clean the list: the refused 1003 (not yet looked at again) still counts.
        assert_eq!(
            r.count(
                &syn("10.0.0.1", 1000),
                &PacketFacts::NONE,
                7 * ms,
                Some(&ct),
                true
            ),
            3
        );
        assert_eq!(
            r.count(
                &syn("10.0.0.1", 1004),
                &PacketFacts::NONE,
                8 * ms,
                Some(&ct),
                false
            ),
            3
        );
    }

    #[test]
    fn closed_and_expired_connections_stop_counting() {
        let ct = Conntrack::new(ConntrackConfig::default()).expect("table");
        let r = rule(0, 32);
        let a = syn("10.0.0.1", 1000);
        let b = syn("10.0.0.1", 1001);
        for p in [&a, &b] {
            r.count(p, &PacketFacts::NONE, 1, Some(&ct), true);
            open(&ct, p, 1);
        }
        assert_eq!(
            r.count(
                &syn("10.0.0.1", 1002),
                &PacketFacts::NONE,
                2,
                Some(&ct),
                false
            ),
            3
        );
        // `a` is reset by the server (its entry goes to CLOSE).
        let mut rst = a;
        (rst.src, rst.dst, rst.sport, rst.dport) = (a.dst, a.src, a.dport, a.sport);
        rst.tcp_flags = RST | ACK;
        ct.track(&mut Packet::from(rst), 3);
        assert_eq!(
            r.count(
                &syn("10.0.0.1", 1002),
                &PacketFacts::NONE,
                4,
                Some(&ct),
                false
            ),
            2
        );
        // Without a table every remembered connection is gone.
        assert_eq!(
            r.count(
                &syn("10.0.0.1", 1002),
                &PacketFacts::NONE,
                4 * UNCONFIRMED_GRACE_NS,
                None,
                true
            ),
            1
        );
    }

    #[test]
    fn upto_and_daddr() {
        let ct = Conntrack::new(ConntrackConfig::default()).expect("table");
        let upto = CConnlimit::new(
            &ConnlimitMatch {
                limit: 1,
                upto: true,
                prefix: 32,
                daddr: true,
            },
            false,
        );
        let p = syn("10.0.0.1", 1000);
        assert!(upto.matches(&p, &PacketFacts::NONE, 1, Some(&ct), true));
        open(&ct, &p, 1);
        // Another client of the same server: 2 connections to 192.0.2.1, not up to 1.
        assert!(!upto.matches(
            &syn("10.0.0.2", 1000),
            &PacketFacts::NONE,
            2,
            Some(&ct),
            true
        ));
    }

    #[test]
    fn a_sweep_bounds_the_lists_of_gone_connections() {
        let r = rule(u32::MAX, 32);
        let mut now = 0;
        for i in 0..10_000u32 {
            now += UNCONFIRMED_GRACE_NS;
            let src = std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string();
            r.count(&syn(&src, 1000), &PacketFacts::NONE, now, None, true);
        }
        assert!(
            r.remembered() <= 2 * SWEEP_MIN * SHARDS,
            "{}",
            r.remembered()
        );
    }
}
