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
//! fewer than `COLLIDE_LIMIT` rules. When the relaxed table exists but is full for the
//! rule's key, the new table keeps both addresses (cut to bytes) before it falls back to the
//! rule's exact tuple (`Tuple::new_table`). Why coarser than the paper's 1..4-bit cuts and its
//! `c = 10`: here a collision costs one check of a dense 28-byte filter, not a rule read, so
//! fewer, fuller tables win (ClassBench acl1 1k: 16 tables instead of 26, 10k: 21 instead of
//! 52; about 25% faster lookups).
//!
//! Each table is an array of buckets in compressed (CSR) form whose entries hold the rule's
//! position and a 32-bit tag of its key hash. Every rule also has a [`HeaderFilter`], a
//! 28-byte summary of its addresses, protocol and port ranges (one dense array per chain, in
//! shared chunks of 1024, `snapshot/chunks.rs`). Beside each table's entries is a copy of
//! them with the tag's low 16 bits and the filter inline ([`ProbeEntry`], 32 bytes, same
//! order), so a candidate is checked in the cache line its bucket brought in. Only when the
//! filter passes and is not the whole rule (negations, interfaces, other matches, IPv6) is
//! the rule itself read; ClassBench rules are all "whole-rule" filters, so a lookup there
//! reads no rule at all. Port ranges are not hashed; the filter checks them. Unindexed rules
//! are checked against the filter array.
//!
//! ## Files and paths
//! - this file: the index's form, which both paths read (tuples, hash masks and the key hash,
//!   [`PacketKey`], [`HeaderFilter`], tables, entries, probe entries, [`ChainIndex`]);
//! - `tuple_merge/build.rs`, the commit path: [`ChainIndex::build`] and the online update
//!   [`ChainIndex::update`];
//! - `eval.rs`, the packet path: the packet-by-packet lookup (`Snapshot::indexed_next`)
//!   and the batched probe ([`ChainIndex::probe_batch`]), beside the chain walk that uses
//!   them;
//! - `tuple_merge/tests.rs`: the index against a linear walk, build against update.
//!
//! ## Updates
//! A snapshot is immutable, so the index is never changed in place. A commit that changes a
//! few rules of a chain builds the chain's new index from the old one (TupleMerge's online
//! insert and delete): every entry is copied with its position shifted, the removed rules'
//! entries are left out, and each new rule goes into the first fitting table with room for its
//! key, exactly as the build would place it; no key is hashed again except the new rules'
//! (and a table's whose load doubled, which is rehashed). A table that no rule left or joined
//! and whose positions did not move is shared with the old index (`Arc`, arrays and probe
//! copy), so the cores find it in cache after the commit. A table a change touches is
//! rewritten, its probe copy patched from the old one (unchanged runs copied); the filter
//! array is shared but for the chunk holding the changed rules. Unchanged chains share their
//! whole index with the previous snapshot.
//!
//! ## Batched probes
//! [`Snapshot::classify_batch`](super::Snapshot::classify_batch) looks up a batch of packets a
//! table at a time rather than a packet at a time, as Open vSwitch's userspace datapath
//! classifier does (`dpcls_lookup` in lib/dpif-netdev.c; its tuple space classifier is
//! described in B. Pfaff et al., "The Design and Implementation of Open vSwitch", NSDI 2015;
//! DPDK's `rte_acl_classify` also takes several packets per call): the probe walks the
//! tables in priority order and, for each, hashes the keys of all packets that still could
//! improve, prefetches their buckets, then checks them, so that the cache misses of many
//! packets overlap; a packet drops out once its best match is below the next table's lowest
//! rule. Only the tables' part of the first query of a base chain (from rule 0) is batched;
//! everything after it (unindexed and `-m limit` rules, targets, jumps, later queries) runs
//! per packet in order, so counters, LOG events, token buckets and conntrack see the same
//! sequence as with per-packet calls. A table rule that reads `ct_state` is the one thing the
//! probe cannot decide early (the state is set between the raw chains and the others); a
//! packet whose probe meets one is looked up per packet. Indexes below [`PROBE_MIN_BYTES`]
//! (about 1.3k ClassBench rules) are not batched: they sit in L1/L2 and the batch's
//! bookkeeping costs more than it hides.
//!
//! ## Exactness
//! The index only proposes candidates; every candidate is checked with the evaluator's own
//! match code (`Snapshot::rule_matches`), so negations, interfaces, sets, conntrack and every
//! other match keep the linear walk's meaning. What the index guarantees is: *if a rule
//! matches a packet, the packet's key in the rule's table equals the rule's key*, because the
//! table only looks at fields the rule pins exactly. Rules with nothing to index (no plain
//! prefix, protocol or single port) go into a `fallback` list that is always scanned.
//!
//! A query asks for the lowest-numbered matching rule at or after a start position, because a
//! matching rule whose target does not decide (no target, LOG, NOTRACK, or the return point of
//! a jump) continues the walk right after itself. Rules with a side effect on evaluation
//! (`-m limit` takes a token, `-m recent` and `-m hashlimit` change their tables) must be
//! evaluated exactly when the linear walk would reach them: they sit in an `effects` list that
//! is checked, in order, only below the best side-effect-free match, so a bucket is only ever
//! taken from when every rule before it failed.

use std::sync::Arc;

#[cfg(doc)]
use super::Classifier;
use super::chunks::Chunks;
use super::rfc::Rfc;
use crate::packet::PacketMeta;

mod build;
#[cfg(test)]
mod tests;

/// The fields a table looks at: prefix lengths and whether protocol and ports are pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tuple {
    pub(crate) src: u8,
    pub(crate) dst: u8,
    pub(crate) proto: bool,
    pub(crate) sport: bool,
    pub(crate) dport: bool,
}

/// The masks of a tuple, applied to a packet's (or rule's) fields before hashing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Masks {
    pub(crate) src: u128,
    pub(crate) dst: u128,
    /// The low 32 bits of `src` and `dst`: an IPv4 packet is hashed with these
    /// ([`Masks::hash4`]), which gives the same hash as [`Masks::hash`] for IPv4 keys.
    pub(crate) src4: u32,
    pub(crate) dst4: u32,
    /// Over `l4_word`: protocol << 32 | sport << 16 | dport.
    pub(crate) l4: u64,
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
    pub(crate) fn hash(&self, src: u128, dst: u128, l4: u64) -> u64 {
        key_hash(src & self.src, dst & self.dst, l4 & self.l4)
    }

    /// [`Masks::hash`] of an IPv4 key, on 32-bit halves (the folding of [`key_hash`] packs an
    /// IPv4 pair into one word, so the two agree).
    #[inline]
    pub(crate) fn hash4(&self, src: u32, dst: u32, l4: u64) -> u64 {
        let x = u64::from(src & self.src4) | (u64::from(dst & self.dst4) << 32);
        mix(x, l4 & self.l4)
    }
}

/// The top `len` bits of a `width`-bit address, in the low bits of a `u128`.
pub(crate) fn prefix_mask(width: u32, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        (u128::MAX << (128 - u32::from(len))) >> (128 - width)
    }
}

#[inline]
pub(crate) fn l4_word(proto: u8, sport: u16, dport: u16) -> u64 {
    (u64::from(proto) << 32) | (u64::from(sport) << 16) | u64::from(dport)
}

/// Folds the key into 64 bits (an IPv4 pair is packed without loss) and mixes it with one
/// folded 64x64->128 multiply, as wyhash/ahash do. A collision only costs an extra check.
#[inline]
pub(crate) fn key_hash(src: u128, dst: u128, l4: u64) -> u64 {
    let x = (src as u64)
        ^ (dst as u64).rotate_left(32)
        ^ ((src >> 64) as u64).rotate_left(17)
        ^ ((dst >> 64) as u64).rotate_left(47);
    mix(x, l4)
}

/// The multiply-fold step of [`key_hash`].
#[inline]
pub(crate) fn mix(x: u64, l4: u64) -> u64 {
    const K1: u64 = 0x9e37_79b9_7f4a_7c15;
    const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;
    let m = u128::from(x ^ K1) * u128::from(l4 ^ K2);
    (m as u64) ^ ((m >> 64) as u64)
}

/// The header fields of a packet that [`HeaderFilter`]s look at, computed once per lookup.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PacketKey {
    /// IPv4 source (0 for IPv6: IPv6 filters do not look at addresses).
    pub(crate) src: u32,
    pub(crate) dst: u32,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
    pub(crate) fragment: bool,
}

impl PacketKey {
    #[inline]
    pub(crate) fn of(p: &PacketMeta) -> PacketKey {
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
pub(crate) struct HeaderFilter {
    pub(crate) src: u32,
    pub(crate) src_mask: u32,
    pub(crate) dst: u32,
    pub(crate) dst_mask: u32,
    pub(crate) sport: (u16, u16),
    pub(crate) dport: (u16, u16),
    pub(crate) proto: u8,
    pub(crate) proto_mask: u8,
    pub(crate) flags: u8,
}

/// [`HeaderFilter::flags`]: the filter is the whole rule.
pub(crate) const FILTER_EXACT: u8 = 1;
/// [`HeaderFilter::flags`]: the rule has a port match, which fails on non-first fragments
/// (as tcp_mt / udp_mt).
pub(crate) const FILTER_PORTS: u8 = 2;
/// [`HeaderFilter::flags`]: the rule reads a packet field that changes during an evaluation:
/// `ct_state` (`-m conntrack --ctstate`, `-m state`: raw-table NOTRACK, conntrack after the
/// raw chains), the packet mark (`-m mark`: `-j MARK`, `-j CONNMARK --restore-mark` in an
/// earlier rule or hook) or the conntrack entry's fields (`-m connmark`, `-m conntrack`
/// tuples), and the matches that read the node's view with the packet's mark and hook
/// (`-m rpfilter --validmark`, `-m pkttype`). [`ChainIndex::probe_batch`] cannot decide such
/// a rule ahead of time.
pub(crate) const FILTER_CTSTATE: u8 = 4;

impl HeaderFilter {
    /// Whether the packet passes the filter (branch-free).
    #[inline]
    pub(crate) fn passes(&self, k: &PacketKey) -> bool {
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
pub(crate) struct Table {
    pub(crate) masks: Masks,
    pub(crate) tuple: Tuple,
    /// Lowest and highest rule position held.
    pub(crate) min: u32,
    pub(crate) max: u32,
    pub(crate) bucket_mask: u64,
    /// Shared (`Arc`) with the previous index when an update left the table as it was, so
    /// that the cores keep reading the memory they have in cache after a commit.
    pub(crate) starts: Arc<[u32]>,
    pub(crate) entries: Arc<[Entry]>,
}

/// A rule in a bucket: its position in the chain and the high half of its key hash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) pos: u32,
    pub(crate) tag: u32,
}

/// What [`ChainIndex::probe_batch`] reads of a bucket entry: the rule's position, 16 bits of
/// its key hash and its [`HeaderFilter`], in 32 bytes (two to a cache line, never straddling
/// one), so checking a candidate reads no second array. `entries[i]` of a [`Table`] is
/// `probes[t][i]` of its [`ChainIndex`]. (The packet-by-packet lookup walks `entries` and
/// reads a probe entry only for a candidate whose tag matches: walking the 32-byte entries
/// was 3-10% slower on 1k-rule chains, which stay in L1/L2.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, align(32))]
pub(crate) struct ProbeEntry {
    pub(crate) src: u32,
    pub(crate) src_mask: u32,
    pub(crate) dst: u32,
    pub(crate) dst_mask: u32,
    pub(crate) sport: (u16, u16),
    pub(crate) dport: (u16, u16),
    pub(crate) pos: u32,
    /// The low 16 bits of [`Entry::tag`]. IPv4 filters pin every bit a table hashes, so for
    /// them it is redundant; IPv6 filters hold no addresses and rely on it.
    pub(crate) tag: u16,
    pub(crate) proto: u8,
    /// [`HeaderFilter::flags`], plus [`PROBE_PROTO`] when the protocol is pinned.
    pub(crate) flags: u8,
}

/// A table's probe copy ([`ChainIndex::probes`]). An `Arc<Vec<_>>` rather than an
/// `Arc<[_]>`: an update assembles a patched copy in a `Vec` ([`Table::patched`]), and an
/// `Arc<[_]>` (counts and items in one allocation) cannot take over the `Vec`'s buffer but
/// copies it once more, about a seventh of a replace's commit in a 100k-rule chain
/// (measured). The extra load (`Arc` -> `Vec` -> entries) is paid once per table probed, not
/// per entry; it did not show in the batched lookup at 100k (BENCHMARKS.md section 5).
pub(crate) type Probes = Arc<Vec<ProbeEntry>>;

/// [`ProbeEntry::flags`]: the filter pins the protocol (`proto_mask` 0xff; otherwise 0).
pub(crate) const PROBE_PROTO: u8 = 0x80;

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

    /// [`HeaderFilter::passes`] and the tag equal to `tag` (the low 16 bits of the packet's
    /// key hash in this table), branch-free.
    #[inline(always)]
    pub(crate) fn passes(&self, k: &PacketKey, tag: u16) -> bool {
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
pub(crate) struct ChainIndex {
    /// In ascending order of `min`.
    pub(crate) tables: Box<[Table]>,
    /// The lookup's copy of each table's entries (same order as `tables`, each its `entries`
    /// plus a sentinel whose `pos` is `u32::MAX`), with the filters inline. `entries` are
    /// what an update copies and counts; these follow them ([`Table::updated`]): shared with
    /// the previous index, as the table's arrays, where the table is unchanged, copied with
    /// positions moved or patched where that is all that changed, else built from `entries`
    /// and `filters`.
    pub(crate) probes: Box<[Probes]>,
    /// Side-effect-free rules with nothing to index, ascending.
    pub(crate) fallback: Box<[u32]>,
    /// Rules whose matches have side effects (`-m limit`, `-m recent`, `-m hashlimit`), ascending.
    pub(crate) effects: Box<[u32]>,
    /// One [`HeaderFilter`] per rule of the chain, by position, in chunks shared with the
    /// previous index where an update left them as they were (a replace copies only the
    /// chunk of the changed filters, not 28 bytes times the chain's length).
    pub(crate) filters: Chunks<HeaderFilter>,
    /// The RFC tables over `filters` (`snapshot/rfc.rs`), for small IPv4 chains; queries
    /// use them first and the tables above only when they cannot decide.
    pub(crate) rfc: Option<Rfc>,
    /// [`ChainIndex::memory_bytes`], kept for [`Snapshot::classify_batch`]'s choice of the
    /// chains worth probing in batches.
    pub(crate) bytes: usize,
}
