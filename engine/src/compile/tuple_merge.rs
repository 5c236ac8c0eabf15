//! A per-chain packet classification index: TupleMerge over the rule header.
//!
//! ## The structure (tuple space search with merged tuples)
//! Tuple space search (V. Srinivasan, S. Suri, G. Varghese, "Packet Classification using
//! Tuple Space Search", SIGCOMM 1999) groups rules by their *tuple*, the prefix lengths of
//! their fields, and keeps one hash table per tuple keyed by the rule's fields masked to those
//! lengths: a packet masked the same way finds the rules of a tuple with one probe. TupleMerge
//! (J. Daly, E. Torng, "TupleMerge: Building Online Packet Classifiers by Omitting Bits",
//! ICCCN 2017; J. Daly et al., "TupleMerge: Fast Software Packet Processing for Online Packet
//! Classification", IEEE/ACM Transactions on Networking 27(4), 2019) cuts the number of tables
//! by letting a rule sit in any table whose tuple is *shorter or equal* in every field (the
//! table ignores some of the rule's bits, the rule is re-checked in full), and bounds the cost
//! of that with a collision limit per hash key. Tables are kept in order of their best
//! (lowest-numbered) rule, so a lookup stops as soon as no remaining table can beat the match
//! found so far (the "priority sorting" TupleMerge shares with PartitionSort).
//!
//! Here a tuple has five fields: source and destination prefix length (plain `-s`/`-d` with a
//! contiguous mask), protocol (plain `-p`), and source and destination port when `-m tcp` or
//! `-m udp` names a single plain port. As in TupleMerge, a new table does not take the rule's
//! own tuple but a relaxed one (the shorter address dropped when the two differ by more than 4
//! bits, then each address cut to the byte boundary below it, /32 and /25../31 to /24, /17../24
//! to /16 and so on; the source port ignored), so later rules can share it; a rule goes into
//! the first table (in priority order) whose tuple fits it and whose bucket for its key holds
//! fewer than [`COLLIDE_LIMIT`] rules. When the relaxed table exists but is full for the
//! rule's key, the new table keeps both addresses (cut to bytes) before it falls back to the
//! rule's exact tuple ([`Tuple::new_table`]). This is coarser than the paper's 1..4-bit cuts and its
//! `c = 10`: here a collision costs one check of a dense 28-byte filter, not a rule read, so
//! fewer, fuller tables win (ClassBench acl1 1k: 16 tables instead of 26, 10k: 21 instead of
//! 52; about 25% faster lookups measured).
//!
//! Each table is an array of buckets in compressed (CSR) form whose entries hold the rule's
//! position and a 32-bit tag of its key hash. Every rule also has a [`HeaderFilter`], a
//! 28-byte summary of its addresses, protocol and port ranges (one dense array per chain, in
//! shared chunks of 1024, `compile/chunks.rs`). Beside each table's entries is a copy of
//! them with the tag's low 16 bits and the filter inline ([`ProbeEntry`], 32 bytes, same
//! order). The batched probe reads only that copy, so a candidate is checked in the cache
//! line the bucket prefetch brought in, with no dependent read of the filter array; a
//! packet-by-packet lookup walks the 8-byte entries and checks the tag, then the probe
//! entry of a candidate whose tag matches (whose address is known from the bucket bounds, so
//! its load does not wait for the entry's position, and needs no chunk lookup; reading
//! `filters[pos]` there measured 6-10% slower on acl1 1k and 10k once the filters were
//! chunked). Unindexed rules are checked against `filters`. Only when the filter passes and
//! is not the whole rule (negations, interfaces, other matches, IPv6) is the rule itself
//! read. ClassBench rules are all
//! "whole-rule" filters, so a lookup there reads no rule at all. (Port ranges are not hashed;
//! the filter is where they are checked cheaply.) The `(position, tag)` entries are also the
//! form that updates copy and count.
//! A snapshot is immutable, so the index is never changed in place. A commit that changes a
//! few rules of a chain builds the chain's new index from the old one ([`ChainIndex::update`],
//! TupleMerge's online insert and delete): every entry is copied with its position shifted,
//! the removed rules' entries are left out, and each new rule goes into the first fitting
//! table with room for its key, exactly as the build would place it; no key is hashed again
//! except the new rules' (and a table's whose load doubled, which is rehashed). A table that
//! no rule left or joined and whose positions did not move (every table a replace does not
//! touch; the tables before an insert or delete) is not copied: the new index shares its
//! arrays and its probe copy (`Arc`), so the cores find them in cache after the commit.
//! A table a replace does touch gets its probe copy patched from the old one (unchanged runs
//! copied, only the new rules' entries made), and the filter array is shared but for the
//! chunk holding the changed rules: a replace in a 100k-rule chain no longer writes a fresh
//! 2.8 MB filter array nor makes the touched tables' probe entries one by one (those one or
//! two tables are still rewritten whole). Unchanged chains share their whole index with the
//! previous snapshot.
//!
//! ## Batched probes
//! [`Snapshot::classify_batch`] looks up a batch of packets a table at a time rather than a
//! packet at a time, as Open vSwitch's userspace datapath classifier does (`dpcls_lookup` in
//! lib/dpif-netdev.c; its tuple space classifier is described in B. Pfaff et al., "The
//! Design and Implementation of Open vSwitch", NSDI 2015; DPDK's `rte_acl_classify` also
//! takes several packets per call):
//! [`ChainIndex::probe_batch`] walks the tables in priority order and, for each, hashes the
//! keys of all packets that still could improve, prefetches their buckets, then checks them,
//! so that the cache misses of many packets overlap; a packet drops out once its best match
//! is below the next table's lowest rule. Only the tables' part of the first query of a base
//! chain (from rule 0) is batched; everything after it (unindexed and `-m limit` rules,
//! targets, jumps, later queries) runs per packet in order, so counters, LOG events, token
//! buckets and conntrack see the same sequence as with per-packet calls. A table rule that
//! reads `ct_state` is the one thing the probe cannot decide early (the state is set between
//! the raw chains and the others); a packet whose probe meets one is looked up per packet.
//! Indexes below [`PROBE_MIN_BYTES`] (about 1.3k ClassBench rules) are not batched: they
//! sit in L1/L2 and the batch's bookkeeping costs more than it hides.
//!
//! ## Exactness
//! The index only proposes candidates; every candidate is checked with the evaluator's own
//! match code ([`Snapshot::rule_matches`]), so negations, interfaces, sets, conntrack and every
//! other match keep the linear walk's meaning. What the index guarantees is: *if a rule
//! matches a packet, the packet's key in the rule's table equals the rule's key*, because the
//! table only looks at fields the rule pins exactly. Rules with nothing to index (no plain
//! prefix, protocol or single port) go into a `fallback` list that is always scanned.
//!
//! A query asks for the lowest-numbered matching rule at or after a start position, because a
//! matching rule whose target does not decide (no target, LOG, NOTRACK, or the return point of
//! a jump) continues the walk right after itself. Rules with a side effect on evaluation
//! (`-m limit` takes a token) must be evaluated exactly when the linear walk would reach them:
//! they sit in an `effects` list that is checked, in order, only below the best side-effect-free
//! match, so a bucket is only ever taken from when every rule before it failed.

use std::mem::size_of;
use std::sync::Arc;

#[cfg(doc)]
use super::Classifier;
use super::chunks::Chunks;
use super::rfc::{Found, Rfc};
use super::{AddrMatch, CMatch, CRule, Observer, RuleChunks, Snapshot, addr_bits};
use crate::packet::PacketMeta;

/// The most removed rules [`ChainIndex::update`] looks up in the tables by their keys
/// ([`ChainIndex::gone_entries`]); beyond that it scans every table's entries for them.
const GONE_LOOKUP_MAX: u32 = 64;

/// The most rules one hash key of a table may hold before a rule looks for another table
/// (TupleMerge's default is `c = 10`; collisions are cheaper here, see the module docs).
pub(super) const COLLIDE_LIMIT: u32 = 32;

/// The fields a table looks at: prefix lengths and whether protocol and ports are pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tuple {
    src: u8,
    dst: u8,
    proto: bool,
    sport: bool,
    dport: bool,
}

impl Tuple {
    /// A table with tuple `self` may hold a rule with tuple `rule`.
    fn fits(self, rule: Tuple) -> bool {
        self.src <= rule.src
            && self.dst <= rule.dst
            && (!self.proto || rule.proto)
            && (!self.sport || rule.sport)
            && (!self.dport || rule.dport)
    }

    fn is_empty(self) -> bool {
        self.src == 0 && self.dst == 0 && !self.proto && !self.sport && !self.dport
    }

    /// TupleMerge's relaxation for a new table: drop the shorter address when the lengths are
    /// far apart, then cut each address to the byte boundary below it (a /24 to /16, a /32 to
    /// /24) so neighbouring rules fit too. The widths are scaled so IPv6 (128 bits) is relaxed
    /// like IPv4 (32 bits).
    fn relaxed(self, width: u32) -> Tuple {
        let mut t = self;
        let scale = (width / 32) as u8;
        let far = 4 * scale;
        if t.dst > t.src + far {
            t.src = 0;
        } else if t.src > t.dst + far {
            t.dst = 0;
        }
        t.byte_cut(width)
    }

    /// Cuts both addresses to the byte boundary below them and ignores the source port.
    fn byte_cut(self, width: u32) -> Tuple {
        let mut t = self;
        let scale = (width / 32) as u8;
        let shorten = |len: u8| {
            let l = len / scale;
            let r = if l >= 8 { (l - 1) / 8 * 8 } else { 0 };
            r * scale
        };
        t.src = shorten(t.src);
        t.dst = shorten(t.dst);
        // Exact source ports are rare in rule sets (they name client ports); a table that
        // ignores them can take rules with and without one.
        t.sport = false;
        t
    }

    /// The tuple of a new table for a rule with tuple `self` that no existing table takes
    /// (`exists`: a table with that tuple exists, and so is full for the rule's key): the
    /// relaxed tuple, else both addresses cut to the byte boundary (when the relaxation
    /// dropped one), else `self`. Before the middle step, a rule whose relaxed table was full
    /// took its exact tuple: ClassBench acl1 100k had 60 tables, a dozen of them holding a few
    /// rules each (`/23 /32`, `/22 /31`, ...) that fit one `/16 /24` table; now 39, and
    /// 4.2 tables probed per packet instead of 8.4.
    fn new_table(self, width: u32, exists: impl Fn(Tuple) -> bool) -> Tuple {
        [self.relaxed(width), self.byte_cut(width)]
            .into_iter()
            .find(|&t| !exists(t))
            .unwrap_or(self)
    }
}

/// The masks of a tuple, applied to a packet's (or rule's) fields before hashing.
#[derive(Clone, Copy, Debug)]
struct Masks {
    src: u128,
    dst: u128,
    /// The low 32 bits of `src` and `dst`: an IPv4 packet is hashed with these
    /// ([`Masks::hash4`]), which gives the same hash as [`Masks::hash`] for IPv4 keys.
    src4: u32,
    dst4: u32,
    /// Over `l4_word`: protocol << 32 | sport << 16 | dport.
    l4: u64,
}

impl Masks {
    fn of(t: Tuple, width: u32) -> Masks {
        let mut l4 = 0u64;
        if t.proto {
            l4 |= 0xff << 32;
        }
        if t.sport {
            l4 |= 0xffff << 16;
        }
        if t.dport {
            l4 |= 0xffff;
        }
        let (src, dst) = (prefix_mask(width, t.src), prefix_mask(width, t.dst));
        Masks {
            src,
            dst,
            src4: src as u32,
            dst4: dst as u32,
            l4,
        }
    }

    #[inline]
    fn hash(&self, src: u128, dst: u128, l4: u64) -> u64 {
        key_hash(src & self.src, dst & self.dst, l4 & self.l4)
    }

    /// [`Masks::hash`] of an IPv4 key, on 32-bit halves (the folding of [`key_hash`] packs an
    /// IPv4 pair into one word, so the two agree).
    #[inline]
    fn hash4(&self, src: u32, dst: u32, l4: u64) -> u64 {
        let x = u64::from(src & self.src4) | (u64::from(dst & self.dst4) << 32);
        mix(x, l4 & self.l4)
    }
}

/// The top `len` bits of a `width`-bit address, in the low bits of a `u128`.
fn prefix_mask(width: u32, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        (u128::MAX << (128 - u32::from(len))) >> (128 - width)
    }
}

#[inline]
fn l4_word(proto: u8, sport: u16, dport: u16) -> u64 {
    (u64::from(proto) << 32) | (u64::from(sport) << 16) | u64::from(dport)
}

/// Folds the key into 64 bits (an IPv4 pair is packed without loss) and mixes it with one
/// folded 64x64->128 multiply, as wyhash/ahash do. A collision only costs an extra check.
#[inline]
fn key_hash(src: u128, dst: u128, l4: u64) -> u64 {
    let x = (src as u64)
        ^ (dst as u64).rotate_left(32)
        ^ ((src >> 64) as u64).rotate_left(17)
        ^ ((dst >> 64) as u64).rotate_left(47);
    mix(x, l4)
}

/// The multiply-fold step of [`key_hash`].
#[inline]
fn mix(x: u64, l4: u64) -> u64 {
    const K1: u64 = 0x9e37_79b9_7f4a_7c15;
    const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;
    let m = u128::from(x ^ K1) * u128::from(l4 ^ K2);
    (m as u64) ^ ((m >> 64) as u64)
}

/// The indexable part of one rule.
#[derive(Clone, Copy, Debug)]
struct RuleKey {
    tuple: Tuple,
    src: u128,
    dst: u128,
    l4: u64,
}

/// A plain prefix: `(len, bits)` when the field is not negated and its mask is contiguous
/// within the family's width; `None` (not indexable) otherwise.
fn plain_prefix(field: AddrMatch, negated: bool, width: u32) -> Option<(u8, u128)> {
    let (net, mask) = (field.net(), field.mask());
    let len = mask.count_ones();
    (!negated && len <= width && mask == prefix_mask(width, len as u8))
        .then_some((len as u8, net & mask))
}

fn rule_key(r: &CRule, width: u32) -> RuleKey {
    let (src_len, src) = plain_prefix(r.src, r.src_negated, width).unwrap_or((0, 0));
    let (dst_len, dst) = plain_prefix(r.dst, r.dst_negated, width).unwrap_or((0, 0));
    let proto = match r.protocol {
        Some((false, p)) => Some(p),
        _ => None,
    };
    let (mut sport, mut dport) = (None, None);
    for m in r.matches.iter() {
        let (s, d) = match m {
            CMatch::Tcp { sport, dport, .. } | CMatch::Udp { sport, dport } => (sport, dport),
            _ => continue,
        };
        let single = |p: &Option<(bool, crate::model::PortRange)>| match p {
            Some((false, r)) if r.lo == r.hi => Some(r.lo),
            _ => None,
        };
        sport = sport.or(single(s));
        dport = dport.or(single(d));
    }
    RuleKey {
        tuple: Tuple {
            src: src_len,
            dst: dst_len,
            proto: proto.is_some(),
            sport: sport.is_some(),
            dport: dport.is_some(),
        },
        src,
        dst,
        l4: l4_word(proto.unwrap_or(0), sport.unwrap_or(0), dport.unwrap_or(0)),
    }
}

fn has_side_effects(r: &CRule) -> bool {
    r.matches.iter().any(|m| matches!(m, CMatch::Limit(_)))
}

/// The header fields of a packet that [`HeaderFilter`]s look at, computed once per lookup.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PacketKey {
    /// IPv4 source (0 for IPv6: IPv6 filters do not look at addresses).
    pub(super) src: u32,
    pub(super) dst: u32,
    pub(super) sport: u16,
    pub(super) dport: u16,
    pub(super) proto: u8,
    pub(super) fragment: bool,
}

impl PacketKey {
    #[inline]
    pub(super) fn of(p: &PacketMeta) -> PacketKey {
        let v4 = |ip: std::net::IpAddr| match ip {
            std::net::IpAddr::V4(a) => u32::from(a),
            std::net::IpAddr::V6(_) => 0,
        };
        PacketKey {
            src: v4(p.src),
            dst: v4(p.dst),
            sport: p.sport,
            dport: p.dport,
            proto: p.protocol,
            fragment: p.fragment,
        }
    }
}

/// A compact summary of a rule's header test (28 bytes, one per rule, in a dense array), checked
/// before the rule itself so that most candidates a bucket proposes are turned away without
/// reading the rule. It is always a necessary condition of the rule; when the rule has nothing
/// else (plain IPv4 addresses or masks, plain protocol, at most one `-m tcp`/`-m udp` with
/// plain port ranges and no flags or options), it is the whole rule ([`FILTER_EXACT`]) and the
/// rule is not read at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct HeaderFilter {
    pub(super) src: u32,
    pub(super) src_mask: u32,
    pub(super) dst: u32,
    pub(super) dst_mask: u32,
    pub(super) sport: (u16, u16),
    pub(super) dport: (u16, u16),
    pub(super) proto: u8,
    pub(super) proto_mask: u8,
    pub(super) flags: u8,
}

/// [`HeaderFilter::flags`]: the filter is the whole rule.
pub(super) const FILTER_EXACT: u8 = 1;
/// [`HeaderFilter::flags`]: the rule has a port match, which fails on non-first fragments
/// (as tcp_mt / udp_mt).
pub(super) const FILTER_PORTS: u8 = 2;
/// [`HeaderFilter::flags`]: the rule reads a packet field that changes during an evaluation:
/// `ct_state` (`-m conntrack --ctstate`, `-m state`: raw-table NOTRACK, conntrack after the
/// raw chains), the packet mark (`-m mark`: `-j MARK`, `-j CONNMARK --restore-mark` in an
/// earlier rule or hook) or the conntrack entry's fields (`-m connmark`).
/// [`ChainIndex::probe_batch`] cannot decide such a rule ahead of time.
const FILTER_CTSTATE: u8 = 4;

impl HeaderFilter {
    fn of(r: &CRule, width: u32) -> HeaderFilter {
        let mut exact = width == 32;
        let mut f = HeaderFilter {
            sport: (0, u16::MAX),
            dport: (0, u16::MAX),
            ..HeaderFilter::default()
        };
        let addr = |m: AddrMatch, negated: bool, exact: &mut bool| -> (u32, u32) {
            if width == 32 && !negated {
                (m.net() as u32, m.mask() as u32)
            } else {
                *exact &= width == 32 && m.mask() == 0 && !negated;
                (0, 0)
            }
        };
        (f.src, f.src_mask) = addr(r.src, r.src_negated, &mut exact);
        (f.dst, f.dst_mask) = addr(r.dst, r.dst_negated, &mut exact);
        exact &= r.in_iface.is_none() && r.out_iface.is_none() && r.fragment.is_none();
        match r.protocol {
            Some((false, p)) => (f.proto, f.proto_mask) = (p, 0xff),
            Some((true, _)) => exact = false,
            None => {}
        }
        let mut ports_seen = 0;
        for m in r.matches.iter() {
            let (sport, dport) = match m {
                CMatch::Tcp {
                    sport,
                    dport,
                    flags,
                    option,
                } => {
                    exact &= flags.is_none() && option.is_none();
                    (sport, dport)
                }
                CMatch::Udp { sport, dport } => (sport, dport),
                CMatch::CtState { .. }
                | CMatch::Conntrack(_)
                | CMatch::Mark { .. }
                | CMatch::Connmark { .. } => {
                    exact = false;
                    f.flags |= FILTER_CTSTATE;
                    continue;
                }
                _ => {
                    exact = false;
                    continue;
                }
            };
            ports_seen += 1;
            f.flags |= FILTER_PORTS;
            if ports_seen > 1 {
                // A second port match: keep the first as the necessary condition.
                exact = false;
                continue;
            }
            let range = |p: &Option<(bool, crate::model::PortRange)>, exact: &mut bool| match p {
                None => (0, u16::MAX),
                Some((false, r)) => (r.lo, r.hi),
                Some((true, _)) => {
                    *exact = false;
                    (0, u16::MAX)
                }
            };
            f.sport = range(sport, &mut exact);
            f.dport = range(dport, &mut exact);
        }
        if exact {
            f.flags |= FILTER_EXACT;
        }
        f
    }

    /// Whether the packet passes the filter (branch-free).
    #[inline]
    fn passes(&self, k: &PacketKey) -> bool {
        ((k.src & self.src_mask) == self.src)
            & ((k.dst & self.dst_mask) == self.dst)
            & ((k.proto & self.proto_mask) == self.proto)
            & (self.sport.0 <= k.sport)
            & (k.sport <= self.sport.1)
            & (self.dport.0 <= k.dport)
            & (k.dport <= self.dport.1)
            & !(k.fragment & (self.flags & FILTER_PORTS != 0))
    }
}

// === ChainIndex ===

/// One hash table of a tuple: buckets in compressed form (`entries[starts[b]..starts[b+1]]`
/// are bucket `b`'s rules, ascending by position). Each entry carries the high 32 bits of its
/// key's hash as a tag, so a packet whose key differs is turned away without reading the rule.
#[derive(Debug, Clone)]
struct Table {
    masks: Masks,
    tuple: Tuple,
    /// Lowest and highest rule position held.
    min: u32,
    max: u32,
    bucket_mask: u64,
    /// Shared (`Arc`) with the previous index when an update left the table as it was, so
    /// that the cores keep reading the memory they have in cache after a commit.
    starts: Arc<[u32]>,
    entries: Arc<[Entry]>,
}

/// A rule in a bucket: its position in the chain and the high half of its key hash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    pos: u32,
    tag: u32,
}

/// What [`ChainIndex::probe_batch`] reads of a bucket entry: the rule's position, 16 bits of
/// its key hash and its [`HeaderFilter`], in 32 bytes (two to a cache line, never straddling
/// one), so checking a candidate reads no second array. `entries[i]` of a [`Table`] is
/// `probes[t][i]` of its [`ChainIndex`]. (The packet-by-packet lookup walks `entries` and
/// reads a probe entry only for a candidate whose tag matches: walking the 32-byte entries
/// was 3-10% slower on 1k-rule chains, which stay in L1/L2.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, align(32))]
struct ProbeEntry {
    src: u32,
    src_mask: u32,
    dst: u32,
    dst_mask: u32,
    sport: (u16, u16),
    dport: (u16, u16),
    pos: u32,
    /// The low 16 bits of [`Entry::tag`]. IPv4 filters pin every bit a table hashes, so for
    /// them it is redundant; IPv6 filters hold no addresses and rely on it.
    tag: u16,
    proto: u8,
    /// [`HeaderFilter::flags`], plus [`PROBE_PROTO`] when the protocol is pinned.
    flags: u8,
}

/// A table's probe copy ([`ChainIndex::probes`]). An `Arc<Vec<_>>` rather than an
/// `Arc<[_]>`: an update assembles a patched copy in a `Vec` ([`Table::patched`]), and an
/// `Arc<[_]>` (counts and items in one allocation) cannot take over the `Vec`'s buffer but
/// copies it once more, about a seventh of a replace's commit in a 100k-rule chain
/// (measured). The extra load (`Arc` -> `Vec` -> entries) is paid once per table probed, not
/// per entry; it did not show in the batched lookup at 100k (BENCHMARKS.md section 5).
type Probes = Arc<Vec<ProbeEntry>>;

/// [`ProbeEntry::flags`]: the filter pins the protocol (`proto_mask` 0xff; otherwise 0).
const PROBE_PROTO: u8 = 0x80;

impl ProbeEntry {
    /// The entry after a table's last (`pos` is `u32::MAX`, so a bucket walk stops there):
    /// [`ChainIndex::probe_batch`] reads `probes[hi]` unguarded.
    const SENTINEL: ProbeEntry = ProbeEntry {
        src: 0,
        src_mask: 0,
        dst: 0,
        dst_mask: 0,
        sport: (0, 0),
        dport: (0, 0),
        pos: u32::MAX,
        tag: 0,
        proto: 0,
        flags: 0,
    };

    fn of(e: Entry, f: &HeaderFilter) -> ProbeEntry {
        ProbeEntry {
            src: f.src,
            src_mask: f.src_mask,
            dst: f.dst,
            dst_mask: f.dst_mask,
            sport: f.sport,
            dport: f.dport,
            pos: e.pos,
            tag: e.tag as u16,
            proto: f.proto,
            flags: f.flags | if f.proto_mask != 0 { PROBE_PROTO } else { 0 },
        }
    }

    /// [`HeaderFilter::passes`] and the tag equal to `tag` (the low 16 bits of the packet's
    /// key hash in this table), branch-free.
    #[inline(always)]
    fn passes(&self, k: &PacketKey, tag: u16) -> bool {
        let proto_mask = 0u8.wrapping_sub(self.flags >> 7);
        (self.tag == tag)
            & ((k.src & self.src_mask) == self.src)
            & ((k.dst & self.dst_mask) == self.dst)
            & ((k.proto & proto_mask) == self.proto)
            & (self.sport.0 <= k.sport)
            & (k.sport <= self.sport.1)
            & (self.dport.0 <= k.dport)
            & (k.dport <= self.dport.1)
            & !(k.fragment & (self.flags & FILTER_PORTS != 0))
    }
}

/// The index of one chain. Rule positions are 0-based within the chain.
#[derive(Debug)]
pub(super) struct ChainIndex {
    /// In ascending order of `min`.
    tables: Box<[Table]>,
    /// The lookup's copy of each table's entries (same order as `tables`, each its `entries`
    /// plus a sentinel whose `pos` is `u32::MAX`), with the filters inline. `entries` are
    /// what an update copies and counts; these follow them ([`Table::updated`]): shared with
    /// the previous index, as the table's arrays, where the table is unchanged, copied with
    /// positions moved or patched where that is all that changed, else built from `entries`
    /// and `filters`.
    probes: Box<[Probes]>,
    /// Side-effect-free rules with nothing to index, ascending.
    fallback: Box<[u32]>,
    /// Rules whose matches have side effects (`-m limit`), ascending.
    effects: Box<[u32]>,
    /// One [`HeaderFilter`] per rule of the chain, by position, in chunks shared with the
    /// previous index where an update left them as they were (a replace copies only the
    /// chunk of the changed filters, not 28 bytes times the chain's length).
    filters: Chunks<HeaderFilter>,
    /// The RFC tables over `filters` (`compile/rfc.rs`), for small IPv4 chains; queries
    /// use them first and the tables above only when they cannot decide.
    rfc: Option<Rfc>,
    /// [`ChainIndex::memory_bytes`], kept for [`Snapshot::classify_batch`]'s choice of the
    /// chains worth probing in batches.
    bytes: usize,
}

/// A table under construction.
struct TableBuilder {
    tuple: Tuple,
    masks: Masks,
    /// Rules per key hash (the collision count of TupleMerge).
    load: rustc_hash::FxHashMap<u64, u32>,
    members: Vec<(u32, u64)>,
}

impl TableBuilder {
    fn new(tuple: Tuple, width: u32) -> TableBuilder {
        TableBuilder {
            tuple,
            masks: Masks::of(tuple, width),
            load: Default::default(),
            members: Vec::new(),
        }
    }

    fn insert(&mut self, pos: u32, h: u64) {
        *self.load.entry(h).or_insert(0) += 1;
        self.members.push((pos, h));
    }

    fn finish(self) -> Table {
        let n = self.members.len();
        let buckets = (2 * n).next_power_of_two().max(1);
        let bucket_mask = buckets as u64 - 1;
        let mut starts = vec![0u32; buckets + 1];
        for &(_, h) in &self.members {
            starts[(h & bucket_mask) as usize + 1] += 1;
        }
        for b in 0..buckets {
            starts[b + 1] += starts[b];
        }
        let mut fill: Vec<u32> = starts[..buckets].to_vec();
        let mut entries = vec![Entry::default(); n];
        // Members come in ascending position order, so every bucket ends up ascending.
        for &(pos, h) in &self.members {
            let b = (h & bucket_mask) as usize;
            entries[fill[b] as usize] = Entry {
                pos,
                tag: (h >> 32) as u32,
            };
            fill[b] += 1;
        }
        Table {
            masks: self.masks,
            tuple: self.tuple,
            min: self.members.first().map_or(u32::MAX, |m| m.0),
            max: self.members.last().map_or(0, |m| m.0),
            bucket_mask,
            starts: starts.into(),
            entries: entries.into(),
        }
    }
}

impl Table {
    /// The probe copy of this table's entries, built from them and `filters` (the index's),
    /// with the sentinel.
    fn probes(&self, filters: &Chunks<HeaderFilter>) -> Probes {
        Arc::new(
            self.entries
                .iter()
                .map(|&e| ProbeEntry::of(e, &filters[e.pos as usize]))
                .chain([ProbeEntry::SENTINEL])
                .collect(),
        )
    }

    /// Rules in this table (those still present after `remap`) whose key hashes to `h`.
    fn load(&self, h: u64, remap: &impl Fn(u32) -> Option<u32>) -> u32 {
        let b = (h & self.bucket_mask) as usize;
        let tag = (h >> 32) as u32;
        self.entries[self.starts[b] as usize..self.starts[b + 1] as usize]
            .iter()
            .filter(|e| e.tag == tag && remap(e.pos).is_some())
            .count() as u32
    }

    /// This table with positions mapped by `remap` (`None`: the rule is gone) and the entries
    /// `ins` (position, key hash; ascending positions) added; `None` when it ends up empty.
    /// Keeps the bucket array unless the table outgrew it (more entries than buckets) or
    /// shrank below an eighth, then rebuilds it from the rules' keys. `gone`: the indices
    /// (ascending) of the entries `remap` drops, where known ([`ChainIndex::gone_entries`];
    /// otherwise they are found by a scan of the entries).
    ///
    /// With it comes its probe copy where it is had for less than a build from the entries
    /// (`None` otherwise; `probe` is this table's, `filters` the new index's): `probe` itself
    /// when the table is this one, its arrays shared (nothing left or joined and `remap` moved
    /// none of its positions; `shifts_from`: the first position `remap` moves, if any);
    /// `probe` with positions remapped when nothing left or joined; `probe` patched
    /// ([`Table::patched`]) when rules left or joined but no position moved.
    #[allow(clippy::too_many_arguments)] // the update's state, passed as it is
    fn updated(
        &self,
        probe: &Probes,
        remap: &impl Fn(u32) -> Option<u32>,
        shifts_from: Option<u32>,
        mut ins: Vec<(u32, u64)>,
        gone: Option<&[u32]>,
        rules: &RuleChunks,
        filters: &Chunks<HeaderFilter>,
        width: u32,
    ) -> Option<(Table, Option<Probes>)> {
        let buckets = self.starts.len() - 1;
        let scan = || {
            self.entries
                .iter()
                .filter(|e| remap(e.pos).is_some())
                .count()
        };
        let kept = match gone {
            Some(gone) => {
                debug_assert_eq!(self.entries.len() - gone.len(), scan());
                self.entries.len() - gone.len()
            }
            None => scan(),
        };
        if ins.is_empty() && kept == self.entries.len() {
            if shifts_from.is_none_or(|f| self.max < f) {
                // Not a position changes: the same table.
                return Some((self.clone(), Some(probe.clone())));
            }
            // Nothing leaves or joins (most tables of a small change): `remap` is monotonic,
            // so every bucket stays in order and the bucket array is kept as it is.
            let entries: Arc<[Entry]> = self
                .entries
                .iter()
                .filter_map(|e| remap(e.pos).map(|pos| Entry { pos, tag: e.tag }))
                .collect();
            // The same filters, moved with their rules: only the positions change.
            let moved: Probes = Arc::new(
                probe[..self.entries.len()]
                    .iter()
                    .map(|p| ProbeEntry {
                        pos: remap(p.pos).unwrap_or(p.pos),
                        ..*p
                    })
                    .chain([ProbeEntry::SENTINEL])
                    .collect(),
            );
            return Some((
                Table {
                    masks: self.masks,
                    tuple: self.tuple,
                    min: remap(self.min).unwrap_or(self.min),
                    max: remap(self.max).unwrap_or(self.max),
                    bucket_mask: self.bucket_mask,
                    starts: self.starts.clone(),
                    entries,
                },
                Some(moved),
            ));
        }
        let n = kept + ins.len();
        if n == 0 {
            return None;
        }
        if n > buckets || (buckets > 16 && n * 8 < buckets) {
            let mut positions: Vec<u32> =
                self.entries.iter().filter_map(|e| remap(e.pos)).collect();
            positions.extend(ins.iter().map(|e| e.0));
            positions.sort_unstable();
            let mut b = TableBuilder::new(self.tuple, width);
            for pos in positions {
                let k = rule_key(&rules[pos as usize], width);
                b.insert(pos, b.masks.hash(k.src, k.dst, k.l4));
            }
            return Some((b.finish(), None));
        }
        ins.sort_unstable_by_key(|&(pos, h)| (h & self.bucket_mask, pos));
        if shifts_from.is_none_or(|f| self.max < f) {
            let (t, probe) = self.patched(probe, remap, ins, gone, filters);
            return Some((t, Some(probe)));
        }
        let mut starts = Vec::with_capacity(buckets + 1);
        let mut entries = Vec::with_capacity(n);
        let mut ins = ins.into_iter().peekable();
        let (mut min, mut max) = (u32::MAX, 0);
        starts.push(0u32);
        for b in 0..buckets {
            let old = &self.entries[self.starts[b] as usize..self.starts[b + 1] as usize];
            let mut old = old
                .iter()
                .filter_map(|e| remap(e.pos).map(|pos| Entry { pos, tag: e.tag }))
                .peekable();
            // Merge two ascending runs: the bucket's kept entries and its insertions.
            loop {
                let next_ins = ins.next_if(|&(pos, h)| {
                    (h & self.bucket_mask) as usize == b && old.peek().is_none_or(|e| pos < e.pos)
                });
                let e = match next_ins {
                    Some((pos, h)) => Entry {
                        pos,
                        tag: (h >> 32) as u32,
                    },
                    None => match old.next() {
                        Some(e) => e,
                        None => break,
                    },
                };
                min = min.min(e.pos);
                max = max.max(e.pos);
                entries.push(e);
            }
            starts.push(entries.len() as u32);
        }
        Some((
            Table {
                masks: self.masks,
                tuple: self.tuple,
                min,
                max,
                bucket_mask: self.bucket_mask,
                starts: starts.into(),
                entries: entries.into(),
            },
            None,
        ))
    }

    /// [`Table::updated`] when no position moves (`remap` is the identity but for the
    /// removed rules, whose entries are `gone`, when known) and the bucket array stays: the
    /// runs of buckets that neither lose nor gain an entry are copied whole (their starts
    /// shifted by what the buckets before them gained or lost) and only the touched buckets
    /// are merged. `ins` is sorted by (bucket,
    /// position). Gives exactly the arrays of the bucket-by-bucket merge.
    ///
    /// The probe copy is patched alongside from `probe` (this table's): a kept entry's rule
    /// and filter are where they were, so its probe entry is copied with it (whole runs for
    /// the untouched buckets) and only the inserted entries' are made, from `filters` (the
    /// new index's). Equals the probe copy built from the new entries.
    fn patched(
        &self,
        probe: &[ProbeEntry],
        remap: &impl Fn(u32) -> Option<u32>,
        ins: Vec<(u32, u64)>,
        gone: Option<&[u32]>,
        filters: &Chunks<HeaderFilter>,
    ) -> (Table, Probes) {
        let buckets = self.starts.len() - 1;
        let bucket = |h: u64| (h & self.bucket_mask) as usize;
        // Buckets that lose or gain an entry, ascending, no repeats.
        let mut touched: Vec<usize> = ins.iter().map(|&(_, h)| bucket(h)).collect();
        let scanned: Vec<u32>;
        let gone = match gone {
            Some(gone) => gone,
            None => {
                scanned = (0..self.entries.len() as u32)
                    .filter(|&i| remap(self.entries[i as usize].pos).is_none())
                    .collect();
                &scanned
            }
        };
        let removed = gone.len();
        for &i in gone {
            touched.push(self.starts.partition_point(|&s| s <= i) - 1);
        }
        touched.sort_unstable();
        touched.dedup();
        let (ins_min, ins_max) = (
            ins.iter().map(|e| e.0).min().unwrap_or(u32::MAX),
            ins.iter().map(|e| e.0).max().unwrap_or(0),
        );
        let mut starts: Vec<u32> = Vec::with_capacity(buckets + 1);
        let n = self.entries.len() - removed + ins.len();
        let mut entries: Vec<Entry> = Vec::with_capacity(n);
        let mut probes: Vec<ProbeEntry> = Vec::with_capacity(n + 1);
        let mut ins = ins.into_iter().peekable();
        // Appends the unchanged buckets `from..to` (`to` may be `buckets`, the end mark).
        let copy = |starts: &mut Vec<u32>,
                    entries: &mut Vec<Entry>,
                    probes: &mut Vec<ProbeEntry>,
                    from: usize,
                    to: usize| {
            let lo = self.starts[from] as usize;
            let hi = self.starts[to.min(buckets)] as usize;
            let shift = entries.len() as i64 - lo as i64;
            let end = if to == buckets { to + 1 } else { to };
            starts.extend(
                self.starts[from..end]
                    .iter()
                    .map(|&s| (i64::from(s) + shift) as u32),
            );
            entries.extend_from_slice(&self.entries[lo..hi]);
            probes.extend_from_slice(&probe[lo..hi]);
        };
        let mut from = 0;
        for &b in &touched {
            copy(&mut starts, &mut entries, &mut probes, from, b);
            starts.push(entries.len() as u32);
            // The bucket's kept entries, by index into `self.entries` (and `probe`).
            let mut old = (self.starts[b] as usize..self.starts[b + 1] as usize)
                .filter(|&i| remap(self.entries[i].pos).is_some())
                .peekable();
            // Merge two ascending runs: the bucket's kept entries and its insertions.
            loop {
                let next_ins = ins.next_if(|&(pos, h)| {
                    bucket(h) == b && old.peek().is_none_or(|&i| pos < self.entries[i].pos)
                });
                match next_ins {
                    Some((pos, h)) => {
                        let e = Entry {
                            pos,
                            tag: (h >> 32) as u32,
                        };
                        entries.push(e);
                        probes.push(ProbeEntry::of(e, &filters[pos as usize]));
                    }
                    None => match old.next() {
                        Some(i) => {
                            entries.push(self.entries[i]);
                            probes.push(probe[i]);
                        }
                        None => break,
                    },
                }
            }
            from = b + 1;
        }
        copy(&mut starts, &mut entries, &mut probes, from, buckets);
        probes.push(ProbeEntry::SENTINEL);
        debug_assert_eq!(starts.len(), buckets + 1);
        let scan = || entries.iter().map(|e| e.pos);
        let min = if remap(self.min).is_some() {
            self.min.min(ins_min)
        } else {
            scan().min().unwrap_or(u32::MAX)
        };
        let max = if remap(self.max).is_some() {
            self.max.max(ins_max)
        } else {
            scan().max().unwrap_or(0)
        };
        let table = Table {
            masks: self.masks,
            tuple: self.tuple,
            min,
            max,
            bucket_mask: self.bucket_mask,
            starts: starts.into(),
            entries: entries.into(),
        };
        (table, Arc::new(probes))
    }
}

impl ChainIndex {
    /// Builds the index of a chain's rules (`width`: 32 for IPv4, 128 for IPv6), with RFC
    /// tables when `width` is 32 and the chain's length is within `rfc_rules` (min, max).
    pub(super) fn build(rules: &RuleChunks, width: u32, rfc_rules: (u32, u32)) -> ChainIndex {
        let mut tables: Vec<TableBuilder> = Vec::new();
        let mut fallback = Vec::new();
        let mut effects = Vec::new();
        for (pos, r) in rules.iter().enumerate() {
            let pos = pos as u32;
            if has_side_effects(r) {
                effects.push(pos);
                continue;
            }
            let key = rule_key(r, width);
            if key.tuple.is_empty() {
                fallback.push(pos);
                continue;
            }
            // The first fitting table (tables are in creation order, which is the order of
            // their best rule) with room for this key.
            let mut chosen = None;
            for (ti, t) in tables.iter().enumerate() {
                if t.tuple.fits(key.tuple) {
                    let h = t.masks.hash(key.src, key.dst, key.l4);
                    if t.load.get(&h).copied().unwrap_or(0) < COLLIDE_LIMIT {
                        chosen = Some((ti, h));
                        break;
                    }
                }
            }
            let (ti, h) = match chosen {
                Some(c) => c,
                None => {
                    // Every existing table that fits is full for this key: a new table with
                    // the relaxed tuple, else with both addresses kept (cut to bytes), else
                    // the rule's exact tuple (which may exceed the limit when many rules pin
                    // the same values).
                    let tuple = key
                        .tuple
                        .new_table(width, |tu| tables.iter().any(|t| t.tuple == tu));
                    let ti = match tables.iter().position(|t| t.tuple == tuple) {
                        Some(ti) => ti,
                        None => {
                            tables.push(TableBuilder::new(tuple, width));
                            tables.len() - 1
                        }
                    };
                    (ti, tables[ti].masks.hash(key.src, key.dst, key.l4))
                }
            };
            tables[ti].insert(pos, h);
        }
        let mut tables: Vec<Table> = tables.into_iter().map(TableBuilder::finish).collect();
        tables.sort_by_key(|t| t.min);
        let probes = vec![None; tables.len()];
        ChainIndex {
            tables: tables.into_boxed_slice(),
            probes: Box::default(),
            fallback: fallback.into_boxed_slice(),
            effects: effects.into_boxed_slice(),
            filters: rules.iter().map(|r| HeaderFilter::of(r, width)).collect(),
            rfc: None,
            bytes: 0,
        }
        .with_rfc(probes, width, rfc_rules)
    }

    /// The index of `rules`, which equal the rules this index was built for (`old_rules`)
    /// except that the `removed` rules at position `at` were replaced by the `added` rules
    /// now at `at`
    /// (TupleMerge's online update, without touching `self`). Costs a copy of the entries
    /// (no hashing) plus one placement per added rule; a table whose entries outgrow its
    /// buckets is rehashed. RFC tables (`rfc_rules` as for [`ChainIndex::build`]) are
    /// built afresh: they have no online update.
    pub(super) fn update(
        &self,
        old_rules: &RuleChunks,
        rules: &RuleChunks,
        width: u32,
        (at, removed, added): (u32, u32, u32),
        rfc_rules: (u32, u32),
    ) -> ChainIndex {
        let end = at + removed;
        let remap = |pos: u32| -> Option<u32> {
            if pos < at {
                Some(pos)
            } else if pos < end {
                None
            } else {
                Some(pos - removed + added)
            }
        };
        let remap_list =
            |list: &[u32]| -> Vec<u32> { list.iter().filter_map(|&p| remap(p)).collect() };
        let mut fallback = remap_list(&self.fallback);
        let mut effects = remap_list(&self.effects);
        // New placements per table (index into `self.tables`, then into `fresh`).
        let mut inserts: Vec<Vec<(u32, u64)>> = vec![Vec::new(); self.tables.len()];
        let mut fresh: Vec<TableBuilder> = Vec::new();
        for pos in at..at + added {
            let r = &rules[pos as usize];
            if has_side_effects(r) {
                effects.push(pos);
                continue;
            }
            let key = rule_key(r, width);
            if key.tuple.is_empty() {
                fallback.push(pos);
                continue;
            }
            let mut chosen = false;
            for (ti, t) in self.tables.iter().enumerate() {
                if !t.tuple.fits(key.tuple) {
                    continue;
                }
                let h = t.masks.hash(key.src, key.dst, key.l4);
                let load =
                    t.load(h, &remap) + inserts[ti].iter().filter(|e| e.1 == h).count() as u32;
                if load < COLLIDE_LIMIT {
                    inserts[ti].push((pos, h));
                    chosen = true;
                    break;
                }
            }
            if chosen {
                continue;
            }
            if let Some(t) = fresh.iter_mut().find(|t| {
                t.tuple.fits(key.tuple) && {
                    let h = t.masks.hash(key.src, key.dst, key.l4);
                    t.load.get(&h).copied().unwrap_or(0) < COLLIDE_LIMIT
                }
            }) {
                let h = t.masks.hash(key.src, key.dst, key.l4);
                t.insert(pos, h);
                continue;
            }
            let exists = |tuple: Tuple| {
                self.tables.iter().any(|t| t.tuple == tuple)
                    || fresh.iter().any(|t| t.tuple == tuple)
            };
            let tuple = key.tuple.new_table(width, exists);
            let ti = match self.tables.iter().position(|t| t.tuple == tuple) {
                Some(ti) => {
                    let h = self.tables[ti].masks.hash(key.src, key.dst, key.l4);
                    inserts[ti].push((pos, h));
                    continue;
                }
                None => match fresh.iter().position(|t| t.tuple == tuple) {
                    Some(fi) => fi,
                    None => {
                        fresh.push(TableBuilder::new(tuple, width));
                        fresh.len() - 1
                    }
                },
            };
            let h = fresh[ti].masks.hash(key.src, key.dst, key.l4);
            fresh[ti].insert(pos, h);
        }
        fallback.sort_unstable();
        effects.sort_unstable();
        // The new rules' filters replace the removed ones'; the chunks the change leaves in
        // place are shared (all of them but the changed run's for a replace).
        let filters = self.filters.splice(
            at as usize,
            removed as usize,
            rules
                .range(at as usize..(at + added) as usize)
                .map(|r| HeaderFilter::of(r, width))
                .collect(),
        );
        // A table no rule left or joined keeps its arrays and its probe copy (`Arc`s) when
        // no position moved: always for a replace (as many rules added as removed), and for
        // tables wholly before the change otherwise. A table whose positions stay but which
        // lost or gained rules gets its probe copy patched from the old one.
        let shifts_from = (removed != added).then_some(at);
        let gone = (removed <= GONE_LOOKUP_MAX)
            .then(|| self.gone_entries(old_rules, width, at..end))
            .flatten();
        let mut tables: Vec<(Table, Option<Probes>)> = self
            .tables
            .iter()
            .zip(self.probes.iter())
            .zip(inserts)
            .enumerate()
            .filter_map(|(ti, ((t, probe), ins))| {
                let gone = gone.as_ref().map(|g| g[ti].as_slice());
                t.updated(
                    probe,
                    &remap,
                    shifts_from,
                    ins,
                    gone,
                    rules,
                    &filters,
                    width,
                )
            })
            .chain(fresh.into_iter().map(|b| (b.finish(), None)))
            .collect();
        tables.sort_by_key(|t| t.0.min);
        let (tables, probes): (Vec<Table>, Vec<_>) = tables.into_iter().unzip();
        ChainIndex {
            tables: tables.into_boxed_slice(),
            probes: Box::default(),
            fallback: fallback.into_boxed_slice(),
            effects: effects.into_boxed_slice(),
            filters,
            rfc: None,
            bytes: 0,
        }
        .with_rfc(probes, width, rfc_rules)
    }

    /// For each table, the indices (ascending) of its entries for the rules at `positions`
    /// of `old_rules` (the rules this index was built for), found through the rules' keys
    /// (one bucket per fitting table) rather than by a scan of every table's entries; `None`
    /// when one is not where its key says (not expected; the caller then scans).
    fn gone_entries(
        &self,
        old_rules: &RuleChunks,
        width: u32,
        positions: std::ops::Range<u32>,
    ) -> Option<Vec<Vec<u32>>> {
        if old_rules.len() != self.filters.len() {
            return None;
        }
        let mut gone = vec![Vec::new(); self.tables.len()];
        for pos in positions {
            let r = &old_rules[pos as usize];
            if has_side_effects(r) {
                continue;
            }
            let key = rule_key(r, width);
            if key.tuple.is_empty() {
                continue;
            }
            let (ti, i) = self
                .tables
                .iter()
                .enumerate()
                .filter(|(_, t)| t.tuple.fits(key.tuple))
                .find_map(|(ti, t)| {
                    let b = (t.masks.hash(key.src, key.dst, key.l4) & t.bucket_mask) as usize;
                    (t.starts[b]..t.starts[b + 1])
                        .find(|&i| t.entries[i as usize].pos == pos)
                        .map(|i| (ti, i))
                })?;
            gone[ti].push(i);
        }
        for g in &mut gone {
            g.sort_unstable();
        }
        Some(gone)
    }

    /// Bytes held by the index (structs and arrays, not the rules it points at).
    pub(super) fn memory_bytes(&self) -> usize {
        size_of::<ChainIndex>()
            + self
                .tables
                .iter()
                .map(|t| {
                    size_of::<Table>() + 4 * t.starts.len() + size_of_val::<[Entry]>(&t.entries)
                })
                .sum::<usize>()
            + self
                .probes
                .iter()
                .map(|p| {
                    size_of::<Probes>()
                        + size_of::<Vec<ProbeEntry>>()
                        + size_of_val::<[ProbeEntry]>(p)
                })
                .sum::<usize>()
            + 4 * (self.fallback.len() + self.effects.len())
            + size_of::<HeaderFilter>() * self.filters.len()
            + self.rfc.as_ref().map_or(0, Rfc::memory_bytes)
    }

    /// Fills [`ChainIndex::probes`] (`probes[t]`: table `t`'s copy where it is known, else
    /// built here), adds RFC tables where the chain qualifies, then sets
    /// [`ChainIndex::bytes`].
    fn with_rfc(
        mut self,
        probes: Vec<Option<Probes>>,
        width: u32,
        (min, max): (u32, u32),
    ) -> ChainIndex {
        self.probes = self
            .tables
            .iter()
            .zip(probes)
            .map(|(t, known)| known.unwrap_or_else(|| t.probes(&self.filters)))
            .collect();
        let n = self.filters.len();
        if width == 32 && n >= min as usize && n <= max as usize {
            // RFC is for small chains: a flat copy of their filters costs little.
            let filters: Vec<HeaderFilter> = self.filters.iter().copied().collect();
            self.rfc = Rfc::build(&filters, &self.effects);
        }
        self.bytes = self.memory_bytes();
        self
    }

    /// Whether queries go through RFC tables first ([`Snapshot::classify_batch`] probes
    /// such a chain in batches whatever its size).
    pub(super) fn has_rfc(&self) -> bool {
        self.rfc.is_some()
    }

    /// [`ChainIndex::memory_bytes`], computed when the index was built.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of hash tables.
    pub(super) fn tables(&self) -> usize {
        self.tables.len()
    }
}

// === batched probe ===

/// Most packets one [`ChainIndex::probe_batch`] call takes (a `u64` bit set covers them).
pub(super) const PROBE_BATCH: usize = 64;

/// The default of [`Classifier::TupleMerge`]'s `batch_min_bytes` (112 KiB): the smallest
/// chain index (bytes as [`Snapshot::memory_bytes`] counts them) that
/// [`Snapshot::classify_batch`] probes in batches. A smaller one sits in L1/L2, where there
/// is no latency to hide and the batch's bookkeeping (hash, bounds and tags stored per packet and table, then read back)
/// cost 10-15% on the 1k ClassBench sets; from about 1.5k rules the batch gained 24-32% on
/// acl1 and 4-7% on ipc1 and lost 7-9% on fw1 (whose lookups are dominated by filter
/// checks, not misses); at 10k it gains 2-25%, at 100k 60-100% (measured at 64 KiB when the
/// index took ~49 bytes a rule; the [`ProbeEntry`] copies brought that to ~82, and the
/// threshold moved with it so that it still falls near 1.3k ClassBench rules: at 64 KiB the
/// 1k sets were batched and 3-14% slower).
pub const PROBE_MIN_BYTES: usize = 112 << 10;

/// [`ChainIndex::probe_batch`]'s answer when a rule that reads `ct_state` passed its filter
/// below every pure match: the evaluation must query the index itself.
pub(super) const PROBE_UNKNOWN: u32 = u32::MAX - 1;

/// Asks the CPU to bring the cache line holding `p` into L1. A hint: it never faults and
/// changes nothing visible, so any address, even one past an array's end, is fine.
#[inline(always)]
pub(super) fn prefetch<T>(p: *const T) {
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
struct ProbeKey {
    src: u128,
    dst: u128,
    l4: u64,
    key: PacketKey,
    v4: bool,
}

/// An observer for side-effect-free rules, which never report anything: such rules have no
/// `-m limit` (those sit in `effects`), and only the evaluator reports matches.
struct Silent;

impl Observer for Silent {
    fn rule(&mut self, _: usize, _: &super::CChain, _: u32, _: &PacketMeta) {}
    fn policy(&mut self, _: usize, _: &super::CChain, _: &PacketMeta) {}
    fn limit(&mut self, _: &super::TokenBucket, _: u64) -> bool {
        false
    }
    fn log(&mut self, _: &super::CChain, _: u32, _: &super::LogSpec, _: &PacketMeta) {}
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
    pub(super) fn probe_batch(
        &self,
        rules: &RuleChunks,
        packets: &[PacketMeta],
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
                    let p = &packets[which[k] as usize];
                    if Snapshot::rule_matches(&rules[pos as usize], p, now, &mut Silent) {
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
    pub(super) fn indexed_next<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        p: &PacketMeta,
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
                            || Self::rule_matches(&rules[pos as usize], p, now, obs)
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
        self.tm_next(idx, rules, start, p, now, obs)
    }

    /// [`Snapshot::indexed_next`] on the TupleMerge tables.
    #[inline]
    fn tm_next<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        p: &PacketMeta,
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
                        || Self::rule_matches(&rules[pos as usize], p, now, obs))
                {
                    best = pos;
                    break;
                }
            }
        }
        self.indexed_rest(idx, rules, start, best, p, now, obs)
    }

    /// Whether the rule at `pos` (side-effect free) matches: the filter first (dense array, no
    /// rule read), the rule only when the filter is not the whole rule.
    #[inline(always)]
    fn filter_hit<O: Observer>(
        idx: &ChainIndex,
        rules: &RuleChunks,
        pos: u32,
        key: &PacketKey,
        p: &PacketMeta,
        now: u64,
        obs: &mut O,
    ) -> bool {
        let f = &idx.filters[pos as usize];
        f.passes(key)
            && (f.flags & FILTER_EXACT != 0
                || Self::rule_matches(&rules[pos as usize], p, now, obs))
    }

    /// The rest of [`Snapshot::indexed_next`] once the tables said `best` (the lowest matching
    /// rule they hold at or after `start`, `u32::MAX` for none): the unindexed rules below it,
    /// then the rules with side effects below the result, in order.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the evaluator's state, passed as it is
    pub(super) fn indexed_rest<O: Observer>(
        &self,
        idx: &ChainIndex,
        rules: &RuleChunks,
        start: u32,
        mut best: u32,
        p: &PacketMeta,
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
                if Self::filter_hit(idx, rules, pos, &key, p, now, obs) {
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
            if Self::rule_matches(&rules[pos as usize], p, now, obs) {
                return Some(pos);
            }
        }
        (best != u32::MAX).then_some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_hash_equals_the_general_hash() {
        let t = Tuple {
            src: 28,
            dst: 24,
            proto: true,
            sport: false,
            dport: true,
        };
        let m = Masks::of(t, 32);
        for (s, d, l4) in [
            (0x0a01_0203u32, 0xc0a8_0101u32, l4_word(6, 1234, 80)),
            (u32::MAX, 0, l4_word(17, 0, 53)),
            (0, u32::MAX, 0),
        ] {
            assert_eq!(m.hash4(s, d, l4), m.hash(u128::from(s), u128::from(d), l4));
        }
    }

    #[test]
    fn prefix_masks_cover_the_family_width() {
        assert_eq!(prefix_mask(32, 0), 0);
        assert_eq!(prefix_mask(32, 8), 0xff00_0000);
        assert_eq!(prefix_mask(32, 32), 0xffff_ffff);
        assert_eq!(prefix_mask(128, 128), u128::MAX);
        assert_eq!(prefix_mask(128, 1), 1 << 127);
    }

    #[test]
    fn non_contiguous_and_negated_prefixes_are_not_indexed() {
        assert_eq!(
            plain_prefix(AddrMatch::new(0x0a00_0000, 0xff00_0000), false, 32),
            Some((8, 0x0a00_0000))
        );
        assert_eq!(
            plain_prefix(AddrMatch::new(0x0a00_0000, 0xff00_ff00), false, 32),
            None
        );
        assert_eq!(
            plain_prefix(AddrMatch::new(0x0a00_0000, 0xff00_0000), true, 32),
            None
        );
        assert_eq!(plain_prefix(AddrMatch::default(), false, 32), Some((0, 0)));
    }

    #[test]
    fn relaxation_follows_tuplemerge() {
        let t = Tuple {
            src: 32,
            dst: 24,
            proto: true,
            sport: false,
            dport: true,
        };
        let r = t.relaxed(32);
        // 32 vs 24 differ by more than 4: the shorter (dst) is dropped, src 32 -> 24.
        assert_eq!((r.src, r.dst), (24, 0));
        assert!(r.fits(t));
        let t6 = Tuple {
            src: 64,
            dst: 64,
            ..t
        };
        let r6 = t6.relaxed(128);
        // 64 bits of 128 scale to 16 of 32, which relax to 8: 32 of 128.
        assert_eq!((r6.src, r6.dst), (32, 32));
    }
    #[test]
    fn a_new_table_keeps_both_addresses_when_the_relaxed_one_is_taken() {
        let t = Tuple {
            src: 23,
            dst: 32,
            proto: true,
            sport: true,
            dport: true,
        };
        let relaxed = t.relaxed(32);
        let cut = t.byte_cut(32);
        assert_eq!((relaxed.src, relaxed.dst, relaxed.sport), (0, 24, false));
        assert_eq!((cut.src, cut.dst, cut.sport), (16, 24, false));
        assert!(cut.fits(t) && relaxed.fits(cut));
        assert_eq!(t.new_table(32, |_| false), relaxed);
        assert_eq!(t.new_table(32, |x| x == relaxed), cut);
        assert_eq!(t.new_table(32, |x| x == relaxed || x == cut), t);
    }

    /// Rules of one chain from iptables text: `-s 10.A.B.0/24 -d 192.168.C.D -p tcp --dport P`
    /// for pseudo-random A..D, P (from `seed`), so they land in a few tables.
    fn rule_lines(n: usize, seed: u64) -> Vec<String> {
        let mut x = seed;
        let mut next = move |m: u64| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % m
        };
        (0..n)
            .map(|_| match next(4) {
                0 => format!("-A INPUT -s 10.{}.{}.0/24 -j ACCEPT", next(4), next(4)),
                1 => format!(
                    "-A INPUT -d 192.168.{}.{} -p tcp -m tcp --dport {} -j DROP",
                    next(4),
                    next(8),
                    next(6) + 20
                ),
                2 => {
                    let (net, lo) = (next(4), next(3) * 100);
                    format!(
                        "-A INPUT -s 10.{net}.0.0/16 -p udp -m udp --dport {lo}:{} -j ACCEPT",
                        lo + 99
                    )
                }
                _ => format!("-A INPUT ! -s 10.{}.0.0/16 -p tcp -j DROP", next(4)),
            })
            .collect()
    }

    fn compiled(lines: &[String]) -> Snapshot {
        let text = format!(
            "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{}\nCOMMIT\n",
            lines.join("\n")
        );
        let rs = crate::restore::parse_ruleset("t", &text, &Default::default()).expect("parses");
        Snapshot::compile_with(
            &[std::sync::Arc::new(rs)],
            &crate::sets::NoSets,
            1,
            crate::compile::Classifier::TupleMerge {
                min_rules: 1,
                batch_min_bytes: 0,
                rfc_min_rules: 0,
                rfc_max_rules: 0,
            },
        )
        .expect("compiles")
    }

    /// Every first match from every start position, over a grid of packets.
    fn answers(snap: &Snapshot, idx: &ChainIndex) -> Vec<Option<u32>> {
        let rules = &snap.chains[0].body.rules;
        let mut obs = super::super::eval::Tracing {
            names: &[],
            steps: Vec::new(),
            logs: Vec::new(),
            limits_asked: 0,
            hotdropped: false,
        };
        let mut out = Vec::new();
        for a in 0..5u8 {
            for b in 0..5u8 {
                for (proto, dport) in [(6u8, 22u16), (6, 25), (17, 150), (17, 250), (1, 0)] {
                    let p = PacketMeta {
                        src: std::net::Ipv4Addr::new(10, a, b, 7).into(),
                        dst: std::net::Ipv4Addr::new(192, 168, a, b).into(),
                        protocol: proto,
                        dport,
                        ..PacketMeta::default()
                    };
                    for start in (0..rules.len() as u32).step_by(7) {
                        out.push(snap.indexed_next(idx, rules, start, &p, 0, &mut obs));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn update_equals_build_through_growth_and_shrink() {
        let mut lines = rule_lines(12, 1);
        let mut snap = compiled(&lines);
        let mut grew = false;
        for round in 0..12u64 {
            // Six rounds of 30 rules in, then six of 30 out: tables outgrow their buckets,
            // then shrink or empty.
            let at = (round as usize * 5) % lines.len().max(1);
            let (removed, added) = if round < 6 {
                let new = rule_lines(30, 100 + round);
                lines.splice(at..at, new);
                (0, 30)
            } else {
                let n = 30.min(lines.len() - at);
                lines.drain(at..at + n);
                (n as u32, 0)
            };
            let next = compiled(&lines);
            let old_idx = snap.chains[0].body.index.as_ref().expect("indexed");
            let rules = &next.chains[0].body.rules;
            let old_rules = &snap.chains[0].body.rules;
            let updated = old_idx.update(old_rules, rules, 32, (at as u32, removed, added), (0, 0));
            let built = next.chains[0].body.index.as_ref().expect("indexed");
            assert_eq!(
                answers(&next, &updated),
                answers(&next, built),
                "round {round}"
            );
            for t in updated.tables.iter() {
                assert!(
                    t.entries.len() < t.starts.len(),
                    "round {round}: table over full"
                );
                assert!(t.entries.windows(2).all(|w| w[0].pos != w[1].pos));
            }
            grew |= updated
                .tables
                .iter()
                .zip(old_idx.tables.iter())
                .any(|(n, o)| n.starts.len() > o.starts.len());
            // The filters are a build's; every probe copy (shared, moved, patched or built)
            // is the one its table's entries give.
            assert!(
                updated.filters.iter().eq(built.filters.iter()),
                "round {round}"
            );
            for (t, probe) in updated.tables.iter().zip(updated.probes.iter()) {
                assert_eq!(**probe, *t.probes(&updated.filters), "round {round}");
            }
            snap = next;
        }
        assert!(grew, "no table was rehashed to more buckets");
    }

    /// The patch of a table whose positions do not move ([`Table::patched`]) gives exactly
    /// the arrays of the bucket-by-bucket merge, for random removals and insertions.
    #[test]
    fn patched_tables_equal_merged_ones() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let tuple = Tuple {
            src: 24,
            dst: 0,
            proto: false,
            sport: false,
            dport: false,
        };
        for round in 0..200 {
            let mut b = TableBuilder::new(tuple, 32);
            let n = 8 + (next() % 300) as u32;
            let mut pos = 0;
            for _ in 0..n {
                pos += 1 + (next() % 5) as u32;
                b.insert(pos, next() % 64);
            }
            let t = b.finish();
            // Remove a few positions the table holds, insert a few it does not.
            let gone: Vec<u32> = t
                .entries
                .iter()
                .map(|e| e.pos)
                .filter(|_| next() % 16 == 0)
                .collect();
            let mut ins: Vec<(u32, u64)> = (0..next() % 4)
                .map(|k| (pos + 1 + k as u32, next() % 64))
                .collect();
            ins.sort_unstable();
            let remap = |p: u32| (!gone.contains(&p)).then_some(p);
            let rules = RuleChunks::default();
            // A filter per position, told apart by its source address.
            let filters: Chunks<HeaderFilter> = (0..pos + 8)
                .map(|p| HeaderFilter {
                    src: p,
                    src_mask: u32::MAX,
                    sport: (0, p as u16),
                    flags: (p % 4) as u8,
                    ..HeaderFilter::default()
                })
                .collect();
            let probe = t.probes(&filters);
            // The removed entries' indices, as `ChainIndex::gone_entries` finds them.
            let gone_at: Vec<u32> = (0..t.entries.len() as u32)
                .filter(|&i| gone.contains(&t.entries[i as usize].pos))
                .collect();
            let update = |shifts_from, gone: Option<&[u32]>| {
                let ins = ins.clone();
                t.updated(&probe, &remap, shifts_from, ins, gone, &rules, &filters, 32)
            };
            let merged = update(Some(0), None);
            // Patched with the removed entries found by a scan, then as looked up.
            let scanned = update(None, None);
            let patched = update(None, Some(&gone_at));
            assert_eq!(
                scanned.as_ref().map(|(t, p)| (&t.entries, &t.starts, p)),
                patched.as_ref().map(|(t, p)| (&t.entries, &t.starts, p)),
                "round {round}"
            );
            match (merged, patched) {
                (Some((m, _)), Some((p, p_probe))) => {
                    // The probe copy is patched (or shared), never left to be rebuilt, and
                    // equals the one built from the merged entries.
                    let p_probe = p_probe.expect("a patched table comes with its probes");
                    assert_eq!(*p_probe, *m.probes(&filters), "round {round}");
                    assert_eq!(m.starts, p.starts, "round {round}");
                    let key = |e: &Entry| (e.pos, e.tag);
                    assert_eq!(
                        m.entries.iter().map(key).collect::<Vec<_>>(),
                        p.entries.iter().map(key).collect::<Vec<_>>(),
                        "round {round}"
                    );
                    assert_eq!((m.min, m.max), (p.min, p.max), "round {round}");
                }
                (m, p) => assert_eq!(m.is_none(), p.is_none(), "round {round}"),
            }
        }
    }

    /// A replace moves no position: every table but those the old and the new rule sit in is
    /// shared with the old index (arrays and probe copy), and the answers are a build's.
    #[test]
    fn a_replace_shares_the_tables_it_does_not_touch() {
        let mut lines = rule_lines(400, 7);
        let snap = compiled(&lines);
        let at = 200;
        lines[at] = rule_lines(1, 999).remove(0);
        let next = compiled(&lines);
        let old_idx = snap.chains[0].body.index.as_ref().expect("indexed");
        let rules = &next.chains[0].body.rules;
        let old_rules = &snap.chains[0].body.rules;
        let updated = old_idx.update(old_rules, rules, 32, (at as u32, 1, 1), (0, 0));
        let built = next.chains[0].body.index.as_ref().expect("indexed");
        assert_eq!(answers(&next, &updated), answers(&next, built));
        let shared = |t: &Table, p: &Probes| {
            old_idx
                .tables
                .iter()
                .zip(old_idx.probes.iter())
                .any(|(o, op)| Arc::ptr_eq(&o.entries, &t.entries) && Arc::ptr_eq(op, p))
        };
        let n = updated
            .tables
            .iter()
            .zip(updated.probes.iter())
            .filter(|(t, p)| shared(t, p))
            .count();
        assert!(updated.tables.len() > 3, "{} tables", updated.tables.len());
        assert!(
            n + 2 >= updated.tables.len(),
            "{n} of {} tables shared",
            updated.tables.len()
        );
    }

    /// A replace in a chain of several filter chunks shares every filter chunk but the
    /// changed rule's, and every probe copy but those of the tables the old and the new rule
    /// sit in, which are patched; filters and probe copies equal what a build gives.
    #[test]
    fn a_replace_shares_filter_chunks_and_patches_probe_copies() {
        use super::super::chunks::CHUNK;
        let mut lines = rule_lines(2 * CHUNK + 500, 11);
        let mut snap = compiled(&lines);
        let mut old_updated: Option<ChainIndex> = None;
        // Two replaces in a row (the second on an updated index), in the middle chunk.
        for (step, at) in [CHUNK + 100, CHUNK + 101].into_iter().enumerate() {
            let old_rules = &snap.chains[0].body.rules;
            let old_idx = match &old_updated {
                Some(idx) => idx,
                None => snap.chains[0].body.index.as_ref().expect("indexed"),
            };
            lines[at] = rule_lines(1, 1000 + at as u64).remove(0);
            let next = compiled(&lines);
            let rules = &next.chains[0].body.rules;
            let updated = old_idx.update(old_rules, rules, 32, (at as u32, 1, 1), (0, 0));
            // The replaced rule's entry is found through its key, not by a scan.
            let gone = old_idx.gone_entries(old_rules, 32, at as u32..at as u32 + 1);
            assert_eq!(gone.map(|g| g.concat().len()), Some(1), "step {step}");
            let built = next.chains[0].body.index.as_ref().expect("indexed");
            assert_eq!(
                answers(&next, &updated),
                answers(&next, built),
                "step {step}"
            );
            assert!(
                updated.filters.iter().eq(built.filters.iter()),
                "step {step}"
            );
            for c in [0, 2] {
                assert!(
                    Arc::ptr_eq(updated.filters.chunk(c), old_idx.filters.chunk(c)),
                    "step {step}: filter chunk {c} copied"
                );
            }
            assert!(!Arc::ptr_eq(
                updated.filters.chunk(1),
                old_idx.filters.chunk(1)
            ));
            let mut changed = 0;
            for (t, probe) in updated.tables.iter().zip(updated.probes.iter()) {
                assert_eq!(**probe, *t.probes(&updated.filters), "step {step}");
                let shared = old_idx.probes.iter().any(|old| Arc::ptr_eq(old, probe));
                changed += usize::from(!shared);
            }
            assert!(updated.tables.len() > 3, "{} tables", updated.tables.len());
            assert!(
                (1..=2).contains(&changed),
                "step {step}: {changed} of {} probe copies not shared",
                updated.tables.len()
            );
            old_updated = Some(updated);
            snap = next;
        }
    }
}
