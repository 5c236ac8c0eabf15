//! Compiled snapshots: the immutable, published form of all active rulesets.
//!
//! [`Snapshot::compile`] turns validated [`Ruleset`]s into flat arrays: per (family, hook) the
//! base chains to run in order, every chain's rules with jump and goto targets resolved to
//! indices, and one counter slot per rule and per chain policy. A snapshot never changes after
//! it is built, except its counters and the state of `-m limit` token buckets.
//!
//! ## Evaluation (iptables semantics within a chain, nftables semantics across base chains)
//! At a hook, the base chains of the packet's family run in netfilter priority order, as the
//! kernel runs the functions registered at a hook: an x_tables table at its kernel priority
//! ([`TableKind::priority`]: raw -300, filter 0), an nft base chain at its own
//! ([`crate::model::ChainHook`]); at equal priority the rulesets by ascending ruleset priority
//! (ties by name), then in table and chain order. The chains below conntrack's -200 (raw, an
//! nft chain at `priority raw`) run before the conntrack lookup, the others after it. A packet
//! handed over at INPUT or FORWARD has passed PREROUTING in the kernel, so it runs the
//! PREROUTING chains first (those before conntrack, conntrack, the other PREROUTING chains,
//! then the hook's chains), seen there with hook PREROUTING and no output interface; a packet
//! at OUTPUT runs raw OUTPUT, conntrack, then filter OUTPUT (locally generated packets never
//! pass PREROUTING). A DROP
//! or REJECT at PREROUTING is the packet's verdict. Inside a chain the first matching rule's
//! target decides: ACCEPT ends *this* base chain and the packet goes on to the next base chain
//! (as an nftables accept); DROP and REJECT are final for the hook; `-j CHAIN` pushes a return
//! point, `-g CHAIN` does not, RETURN (or the end of a user chain) pops one, and RETURN or the
//! end of a base chain applies the policy. LOG and NOTRACK do not decide and continue with the
//! next rule, as XT_CONTINUE targets do. A matching rule is counted before its target runs, as
//! ipt_do_table counts. A packet whose transport header is cut ([`PacketMeta::l4_cut`]) walks
//! every chain linearly (no index), and the first tcp / udp / multiport / icmp match that
//! reads a missing byte drops it on the spot without counting its rule (the kernel's
//! hotdrop).
//!
//! Only filter, raw and nft tables are enforced; nat, mangle and security tables are not
//! compiled ([`crate::validate`] reports them).
//!
//! ## Incremental commits
//! Each chain's compiled rules and TupleMerge index live in an immutable `ChainBody` behind
//! an `Arc`, and jump/goto targets are table-local, so [`Snapshot::compile_after`] builds the
//! next snapshot from the active one without touching it: a chain whose rules (by content,
//! not location) and whose table's chain names are unchanged shares the old body; a chain
//! where one contiguous run of rules changed (an insert, a delete, a replace; at most an eighth
//! of the chain or 64 rules) gets a body spliced from the old one (new rules compiled, the
//! index updated by TupleMerge's online insert/delete in `snapshot/tuple_merge.rs`, and the
//! rules kept in chunks of 1024 shared by `Arc`, `snapshot/chunks.rs`: only the chunks from
//! the change on are rebuilt, only the changed ones for a replace); anything else is
//! compiled afresh. Readers never see a half-built index: they keep using the old snapshot
//! until the new one is published. The cost left is linear but cheap (comparing the rules,
//! which skips the rule chunks a new model shares with the old one, `model::RuleList`;
//! rewriting the one or two index tables a change touches; the index's per-rule filters are
//! chunked and shared like the rules); counters need no copy (see Counters below;
//! BENCHMARKS.md section 5).
//!
//! ## RFC tables for small chains
//! An IPv4 chain of [`RFC_MIN_RULES`] to [`RFC_MAX_RULES`] rules (by default) also gets
//! Recursive Flow Classification tables over its header filters (`snapshot/rfc.rs`), which
//! answer most lookups with a fixed number of table reads; the TupleMerge tables stay for
//! what they cannot decide. A commit that changes such a chain rebuilds its RFC tables.
//!
//! ## Batches
//! [`Snapshot::classify_batch`] (the classify loop, `engine/worker.rs`) gives each packet exactly what
//! classifying it alone would give it, but first probes the hash tables of each packet's
//! first large indexed base chain for up to [`CLASSIFY_BATCH`] packets together, their memory
//! accesses interleaved a table at a time as Open vSwitch's `dpcls_lookup` does
//! (`Snapshot::probe`, `eval.rs`); the walk then starts that chain from the probe's answer.
//!
//! ## Counters
//! Each core has its own cache-line-aligned block of (packets, bytes) pairs, one pair (slot)
//! per rule and per chain policy, like xt_counters in per-cpu memory. Only that core's worker
//! writes its block (a Relaxed load and store of an `AtomicU64`, which compiles to plain moves;
//! no read-modify-write shared between cores). A reader sums the cores plus a `base` pair
//! that holds counts carried over from other cells and the offsets of
//! [`Snapshot::zero_counters`]. A rule keeps its slot (`ChainBody::slots`) while it exists, and a
//! snapshot built from the active one shares its cells (`snapshot/counters.rs`): a commit
//! allocates no counters, and [`Snapshot::carry_from`] has nothing to copy.
//!
//! ## Files
//! This file holds the compiled form, the types both sides share ([`Snapshot`], `CChain`,
//! `ChainBody`, `CRule`, `CMatch`, `CTarget`), the public result types and the snapshot's
//! inspection ([`Snapshot::memory_bytes`], [`Snapshot::rule_count`]). The commit side reads
//! in `snapshot/`, the packet side in its sibling `eval/`:
//!
//! - the commit side: `snapshot/build.rs` (model -> snapshot, the incremental
//!   [`Snapshot::compile_after`], reuse), the index's build and online update
//!   (`snapshot/tuple_merge.rs`, `snapshot/tuple_merge/build.rs`, `snapshot/rfc.rs`),
//!   `snapshot/chunks.rs`, and `snapshot/carry.rs` (counters and token buckets carried from
//!   the previous snapshot); counters in `snapshot/counters.rs` (per-core cells, reading and
//!   zeroing them); LOG hits in `snapshot/log_ring.rs` ([`LogSink`], the per-core [`LogRing`]
//!   of [`LogRecord`]s, and resolving a record into a [`LogEvent`]);
//! - the packet side: `eval.rs` (the index probe and lookups of the TupleMerge hash tables
//!   and the RFC tables, the chain walk, every match, [`Snapshot::trace`] in
//!   `eval/trace.rs`), called step by step from the one classify entry,
//!   [`Snapshot::classify_batch`] (the worker's loop, `engine/worker.rs`).

use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::OwnerMatch;
use crate::model::{
    AddrTypeLimit, ConnmarkTarget, EcnMatch, Family, FragMatch, IdRange, IpNet, Ipv6HeaderMatch,
    MarkValue, MultiportDir, Neg, Policy, PortRange, RejectWith, RtMatch, Rule, Ruleset, SetDir,
    TableKind, TtlMatch,
};
use crate::node_addrs::{AddrFacts, NodeAddrs};
use crate::packet::{IfName, Packet, PacketFacts, PacketMeta};
use crate::sets::SetRef;
use crate::validate::RuleDiffs;

mod build;
mod carry;
pub(crate) mod chunks;
pub mod copy_range;
pub(crate) mod counters;
pub(crate) mod log_ring;
pub(crate) mod rfc;
pub(crate) mod stateful;
pub(crate) mod tuple_merge;

use chunks::{Chunks, RuleChunks};
use counters::CounterCells;
use stateful::{CHashlimit, CRecent, NamedState};

use crate::eval::connlimit::CConnlimit;
use crate::eval::string::CString;
pub use crate::eval::{CLASSIFY_BATCH, PROBE_MIN_BYTES, StepOutcome, Trace, TraceStep};
pub use log_ring::{LogHit, LogRecord, LogRing, LogSink};
pub use rfc::{RFC_MAX_RULES, RFC_MIN_RULES};
use tuple_merge::ChainIndex;

/// Commit-path maps hash with FxHash: keys are our own (names, content hashes), and SipHash's
/// DoS resistance would cost ~15% of a 10k-rule compile.
pub(crate) type HashMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// The deepest chain call stack a packet may build with `-j` (goto does not add depth).
/// Validation rejects rulesets that could go deeper; at run time a deeper call drops the
/// packet, as x_tables does when its jump stack overflows.
pub const MAX_CALL_DEPTH: usize = 64;

/// How a snapshot finds the first matching rule of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Classifier {
    /// Check every rule in order: the reference evaluator.
    Linear,
    /// A TupleMerge index per chain (see [`tuple_merge`](self) module docs in
    /// `snapshot/tuple_merge.rs`) for chains with at least `min_rules` rules; shorter chains
    /// are walked linearly. Returns exactly what [`Classifier::Linear`] returns.
    TupleMerge {
        /// Chains with fewer rules are not indexed (a short scan beats hashing).
        min_rules: u32,
        /// [`Snapshot::classify_batch`] probes a chain's index for a whole batch at once only
        /// when the index takes at least this many bytes ([`Snapshot::memory_bytes`]); smaller
        /// ones are looked up packet by packet (default [`PROBE_MIN_BYTES`]; 0 batches every
        /// index, as the differential tests do). Chains with RFC tables are always batched.
        batch_min_bytes: usize,
        /// IPv4 chains with at least `rfc_min_rules` (and `min_rules`) and at most
        /// `rfc_max_rules` rules also get RFC tables (`snapshot/rfc.rs`, Recursive Flow
        /// Classification), which queries use before the TupleMerge tables; they take at least
        /// 768 KiB a chain, so shorter chains do without (defaults [`RFC_MIN_RULES`] and
        /// [`RFC_MAX_RULES`]; `rfc_max_rules` 0 builds none).
        rfc_min_rules: u32,
        /// See `rfc_min_rules`.
        rfc_max_rules: u32,
    },
}

impl Default for Classifier {
    /// TupleMerge for chains of 16 rules or more, batched probes from [`PROBE_MIN_BYTES`],
    /// RFC tables up to [`RFC_MAX_RULES`] rules.
    fn default() -> Self {
        Classifier::TupleMerge {
            min_rules: 16,
            batch_min_bytes: PROBE_MIN_BYTES,
            rfc_min_rules: RFC_MIN_RULES,
            rfc_max_rules: RFC_MAX_RULES,
        }
    }
}

/// Bytes a snapshot's rules and index take, as counted by [`Snapshot::memory_bytes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Compiled rules: the rule structs (a single match is held inline) and the arrays they
    /// own (several matches, multiport lists); shared objects such as sets are not counted.
    pub rules: usize,
    /// The classification index of every chain: hash tables, lists and the 28-byte header
    /// filter of every indexed rule.
    pub index: usize,
    /// Hash tables over all chain indexes.
    pub tables: usize,
    /// Chains whose index has RFC tables (counted in `index`).
    pub rfc_chains: usize,
}

/// The verdict of a hook for one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Every base chain accepted the packet (or none exists).
    Accept,
    /// Dropped silently.
    Drop,
    /// Dropped with an answer (ICMP error or TCP RST) the caller may send.
    Reject(RejectWith),
}

impl Verdict {
    /// Upper-case name as used in metrics labels (`ACCEPT`, `DROP`, `REJECT`).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Accept => "ACCEPT",
            Verdict::Drop => "DROP",
            Verdict::Reject(_) => "REJECT",
        }
    }
}

/// What a `-j LOG` / `-j NFLOG` rule reports.
#[derive(Debug, Clone)]
pub(crate) struct LogSpec {
    pub(crate) prefix: Option<Arc<str>>,
    pub(crate) level: u8,
    pub(crate) nflog_group: Option<u16>,
}

/// A `-j LOG` (or `-j NFLOG`) hit with its rule named: what a `Vec<LogEvent>` sink of [`Snapshot::classify_batch`]
/// collects, and what [`Snapshot::log_event`] makes of a [`LogRecord`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEvent {
    /// Ruleset name.
    pub ruleset: Arc<str>,
    /// Table of the rule.
    pub table: TableKind,
    /// Chain of the rule.
    pub chain: Arc<str>,
    /// 1-based rule number in its chain.
    pub rule: u32,
    /// `--log-prefix`, if set.
    pub prefix: Option<Arc<str>>,
    /// `--log-level` (syslog 0..=7, default 4 = warning as xt_LOG; 4 for NFLOG).
    pub level: u8,
    /// `Some(--nflog-group)` (0 when not written, as xt_NFLOG) for an NFLOG hit, `None` for
    /// LOG.
    pub nflog_group: Option<u16>,
    /// The packet as it was when the rule matched.
    pub packet: Packet,
}

/// Why a ruleset could not be compiled. Validation ([`crate::validate`]) catches all of these
/// first, with locations; the compiler re-checks so that it never builds a broken snapshot.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CompileError {
    /// A jump or goto names a chain that does not exist in the same table.
    #[error("ruleset {ruleset}: {table} chain {chain}: target chain {target} does not exist")]
    UnknownChain {
        /// Ruleset name.
        ruleset: String,
        /// Table.
        table: TableKind,
        /// Chain holding the rule.
        chain: String,
        /// Missing chain.
        target: String,
    },
    /// A match or target the packet path cannot run in an enforced table.
    #[error("ruleset {ruleset}: {table} chain {chain}: extension {extension} is not enforced")]
    Unsupported {
        /// Ruleset name.
        ruleset: String,
        /// Table.
        table: TableKind,
        /// Chain holding the rule.
        chain: String,
        /// Extension name.
        extension: String,
    },
    /// `--match-set` names a set the registry does not know.
    #[error("ruleset {ruleset}: set {set} does not exist")]
    UnknownSet {
        /// Ruleset name.
        ruleset: String,
        /// Set name.
        set: String,
    },
    /// Two active rulesets have the same name.
    #[error("ruleset {0} is given twice")]
    DuplicateRuleset(String),
    /// Jumps and gotos form a cycle through this chain: a packet would never leave it (a goto
    /// loop adds no call depth, so the depth limit would not stop it).
    #[error("ruleset {ruleset}: {table} chain {chain}: jumps and gotos loop back to it")]
    Loop {
        /// Ruleset name.
        ruleset: String,
        /// Table.
        table: TableKind,
        /// A chain on the cycle.
        chain: String,
    },
    /// More rules and chains than counter slots can number (2^32 - 1).
    #[error("{0} rules and chains are more than a snapshot can count")]
    TooManyRules(usize),
}

// === compiled form ===

#[derive(Debug)]
pub(crate) struct CChain {
    pub(crate) ruleset: u32,
    pub(crate) family: Family,
    pub(crate) table: TableKind,
    pub(crate) name: Arc<str>,
    /// Global index of the first chain of this chain's table: jump and goto targets are
    /// table-local, so a [`ChainBody`] can be shared by snapshots where the table sits at
    /// another place.
    pub(crate) table_base: u32,
    /// Where the chain's rules are in the model: `rulesets[ruleset].tables[table_at]
    /// .chains[chain_at]`.
    pub(crate) table_at: u32,
    /// See `table_at`.
    pub(crate) chain_at: u32,
    /// Counter slot of the chain's policy (every chain has one; only builtin chains use it).
    pub(crate) policy_slot: u32,
    /// `Some` for builtin chains.
    pub(crate) policy: Option<Policy>,
    pub(crate) body: Arc<ChainBody>,
}

/// The compiled rules of one chain and their index. Immutable; consecutive snapshots share a
/// body (by `Arc`) while the chain's rules and its table's chain names are unchanged, and a
/// commit that changes a few rules of a chain builds its new body from the old one
/// ([`ChainBody::splice`]).
#[derive(Debug)]
pub(crate) struct ChainBody {
    /// In chunks shared with the previous body where a splice left them unchanged.
    pub(crate) rules: RuleChunks,
    /// Where rule `i` counts in the snapshot's [`CounterCells`], kept by the rule as long as it
    /// exists (`snapshot/counters.rs`); chunked and shared like `rules`. An array beside the
    /// rules, not a field of [`CRule`]: a counter's address then does not wait on a (cold)
    /// rule's cache line, and at 4 bytes a rule it mostly stays cached (with the slot in the
    /// rule, a per-packet lookup at 100k rules measured 15-20% slower).
    pub(crate) slots: Chunks<u32>,
    /// The classification index, or `None` where the chain is walked linearly.
    pub(crate) index: Option<ChainIndex>,
    /// Table-local indices of the chains this chain jumps or goes to, ascending, no repeats.
    pub(crate) targets: Box<[u32]>,
    /// Some rule has `-m set` (or an addrtype match with the node's addresses): such a body is
    /// never shared, because the registry may hold a new set object under the same name (or
    /// another address handle).
    pub(crate) has_sets: bool,
    /// Some rule may hold a named table (`-m recent`, `-m hashlimit`); conservative (a splice
    /// keeps the old body's flag): the build collects the tables of such bodies
    /// (`snapshot/stateful.rs`).
    pub(crate) stateful: bool,
}

/// `-s` or `-d` as (address & mask, mask); an absent field has mask 0, which every address
/// matches. Two `u64` halves rather than `u128`s keep `CRule` 8-byte aligned (a `u128` field
/// pads it to 16 and costs 16 bytes a rule).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AddrMatch {
    pub(crate) net: [u64; 2],
    pub(crate) mask: [u64; 2],
}

impl AddrMatch {
    fn new(net: u128, mask: u128) -> AddrMatch {
        let halves = |x: u128| [(x >> 64) as u64, x as u64];
        AddrMatch {
            net: halves(net),
            mask: halves(mask),
        }
    }

    #[inline]
    fn net(&self) -> u128 {
        (u128::from(self.net[0]) << 64) | u128::from(self.net[1])
    }

    #[inline]
    fn mask(&self) -> u128 {
        (u128::from(self.mask[0]) << 64) | u128::from(self.mask[1])
    }

    #[inline]
    pub(crate) fn matches(&self, addr: u128) -> bool {
        addr & self.mask() == self.net()
    }
}

/// One compiled rule. Its 1-based number is its position in [`ChainBody::rules`] plus one.
/// `Clone` is cheap (one match inline, several shared), which [`ChainBody::splice`] relies on.
#[derive(Debug)]
pub(crate) struct CRule {
    pub(crate) src: AddrMatch,
    pub(crate) dst: AddrMatch,
    pub(crate) src_negated: bool,
    pub(crate) dst_negated: bool,
    pub(crate) in_iface: Option<(bool, IfacePattern)>,
    pub(crate) out_iface: Option<(bool, IfacePattern)>,
    pub(crate) protocol: Option<(bool, u8)>,
    pub(crate) fragment: Option<bool>,
    pub(crate) matches: Matches,
    pub(crate) target: CTarget,
}

/// Written out to be inlined always: [`ChainBody::splice`] (in `snapshot/build.rs`) copies up to
/// a chunk of rules with it, and a call per rule costs that copy a move of each rule through
/// the stack (with the derive, a one-rule edit of a 10k-rule chain took 50 -> 60 us of
/// compile in `commit_cpu` once `splice` left this file).
impl Clone for CRule {
    #[inline(always)]
    fn clone(&self) -> CRule {
        CRule {
            src: self.src,
            dst: self.dst,
            src_negated: self.src_negated,
            dst_negated: self.dst_negated,
            in_iface: self.in_iface,
            out_iface: self.out_iface,
            protocol: self.protocol,
            fragment: self.fragment,
            matches: self.matches.clone(),
            target: self.target.clone(),
        }
    }
}

/// `-m physdev` with its name patterns compiled (see [`crate::model::PhysdevMatch`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CPhysdev {
    pub(crate) physdev_in: Option<(bool, IfacePattern)>,
    pub(crate) physdev_out: Option<(bool, IfacePattern)>,
    pub(crate) is_in: Option<bool>,
    pub(crate) is_out: Option<bool>,
    pub(crate) is_bridged: Option<bool>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct IfacePattern {
    pub(crate) name: IfName,
    pub(crate) wildcard: bool,
}

impl IfacePattern {
    pub(crate) fn matches(&self, ifname: &IfName) -> bool {
        let p = self.name.as_str().as_bytes();
        let n = ifname.as_str().as_bytes();
        if self.wildcard {
            n.starts_with(p)
        } else {
            n == p
        }
    }
}

/// A rule's matches in written order. Most rules have at most one (`-m tcp`/`-m udp` in
/// ClassBench sets), which is kept inline: no pointer to chase on the packet path, and a
/// clone (when [`ChainBody::splice`] copies unchanged rules) touches no other memory.
#[derive(Debug, Clone)]
pub(crate) enum Matches {
    Inline(Option<CMatch>),
    Shared(Arc<[CMatch]>),
}

impl Matches {
    fn new(mut v: Vec<CMatch>) -> Matches {
        if v.len() <= 1 {
            Matches::Inline(v.pop())
        } else {
            Matches::Shared(Arc::from(v))
        }
    }
}

impl std::ops::Deref for Matches {
    type Target = [CMatch];

    #[inline]
    fn deref(&self) -> &[CMatch] {
        match self {
            Matches::Inline(m) => m.as_slice(),
            Matches::Shared(a) => a,
        }
    }
}

/// `Clone` copies a `-m limit` bucket with its state at the time of the copy: a spliced
/// chain's copy of an unchanged limit rule goes on from where the old snapshot was.
#[derive(Debug, Clone)]
pub(crate) enum CMatch {
    Tcp {
        sport: Option<(bool, PortRange)>,
        dport: Option<(bool, PortRange)>,
        flags: Option<(bool, u8, u8)>,
        option: Option<(bool, u8)>,
    },
    Udp {
        sport: Option<(bool, PortRange)>,
        dport: Option<(bool, PortRange)>,
    },
    Multiport {
        dir: MultiportDir,
        negated: bool,
        ports: Box<[PortRange]>,
    },
    Icmp {
        negated: bool,
        icmp_type: Option<u8>,
        code: (u8, u8),
    },
    CtState {
        negated: bool,
        bits: u8,
    },
    /// `-m conntrack` with tuple or direction options (boxed: bigger than the others).
    Conntrack(Box<CConntrack>),
    /// Boxed: two address ranges would double the size of every `CMatch`.
    Iprange(Box<IprangeMatch>),
    Set {
        negated: bool,
        set: SetRef,
        dirs: Box<[SetDir]>,
    },
    Mark {
        negated: bool,
        value: u32,
        mask: u32,
    },
    /// `-m connmark` outside the raw table.
    Connmark {
        negated: bool,
        value: u32,
        mask: u32,
    },
    /// `-m owner`.
    Owner(OwnerMatch),
    /// `-m physdev`.
    Physdev(Box<CPhysdev>),
    /// A match that never holds: `-m connmark` in the raw table, where the packet has no
    /// conntrack entry yet (connmark_mt returns false without one, negated or not).
    Never,
    /// A match the kernel decided for the packet ([`crate::kernel_decided`]): holds when the
    /// packet's `kernel_facts` has this bit.
    KernelFact(u32),
    Length {
        negated: bool,
        range: PortRange,
    },
    Limit(TokenBucket),
    Mac {
        negated: bool,
        mac: [u8; 6],
    },
    /// `-m ttl` / `-m hl`.
    Ttl(TtlMatch),
    /// `-m tos`, and `-m dscp` as `(tos & 0xfc) == dscp << 2`.
    Tos {
        negated: bool,
        value: u8,
        mask: u8,
    },
    Ecn(EcnMatch),
    Ah {
        negated: bool,
        spi: IdRange,
    },
    /// Boxed: bigger than the other variants.
    Frag(Box<FragMatch>),
    /// Boxed; `other` (the type-0 options) is empty (refused at compile time).
    Rt(Box<RtMatch>),
    Ipv6Header(Ipv6HeaderMatch),
    /// `-m addrtype` (boxed: it holds a handle).
    AddrType(Box<CAddrType>),
    /// `-m rpfilter`: [`crate::fib::rpfilter_flags`] and the node's handle, whose routing
    /// view it reads.
    Rpfilter {
        flags: u8,
        addrs: Arc<NodeAddrs>,
    },
    /// `-m pkttype`, with the node's addresses (for the local table's broadcast entries;
    /// `None`: only `255.255.255.255` is a broadcast).
    PktType {
        negated: bool,
        kind: crate::model::PktType,
        addrs: Option<Arc<NodeAddrs>>,
    },
    /// `-m recent` (boxed: it holds its list).
    Recent(Box<CRecent>),
    /// `-m hashlimit` with a packet rate (boxed: it holds its table).
    Hashlimit(Box<CHashlimit>),
    /// `-m connlimit` (boxed: it holds its lists).
    Connlimit(Box<CConnlimit>),
    /// `-m string` (boxed: it holds its searcher).
    String(Box<CString>),
    /// `-m sctp` (boxed: it holds a 256-bit chunk map).
    Sctp(Box<crate::model::SctpMatch>),
    /// `-m u32` (boxed: it holds its tests).
    U32(Box<crate::model::U32Match>),
}

/// A compiled `-m conntrack` with options beyond `--ctstate`, as conntrack_mt (revision 3):
/// the state test, then (only for a packet with an entry) direction, protocol, the four
/// addresses and the four ports of the entry's tuples.
#[derive(Debug, Clone)]
pub(crate) struct CConntrack {
    pub(crate) state: Option<(bool, u8)>,
    pub(crate) reply: Option<bool>,
    pub(crate) proto: Option<(bool, u8)>,
    /// Original source, original destination, reply source, reply destination.
    pub(crate) addrs: [Option<(bool, AddrMatch)>; 4],
    pub(crate) ports: [Option<(bool, PortRange)>; 4],
}

/// A compiled `-m addrtype`: `(negated, type bits)` per direction, and the node's addresses
/// (`None` when its types need none, [`crate::node_addrs::needs_facts`]).
#[derive(Debug, Clone)]
pub(crate) struct CAddrType {
    pub(crate) src: Option<(bool, u16)>,
    pub(crate) dst: Option<(bool, u16)>,
    pub(crate) limit: AddrTypeLimit,
    pub(crate) addrs: Option<Arc<NodeAddrs>>,
}

/// What an addrtype match without the node's addresses decides against (it only asks for
/// types the address bits decide).
pub(crate) static NO_ADDRS: AddrFacts = AddrFacts::EMPTY;

/// `-m addrtype`, as addrtype_mt_v1: the source test, then (if it held) the destination test.
pub(crate) fn addrtype_matches(a: &CAddrType, p: &PacketMeta, f: &PacketFacts) -> bool {
    let dev = match a.limit {
        AddrTypeLimit::None => None,
        AddrTypeLimit::In => Some(&f.in_iface),
        AddrTypeLimit::Out => Some(f.out_iface_at(p.hook)),
    };
    let guard = a.addrs.as_ref().map(|n| n.load());
    let facts: &AddrFacts = guard.as_deref().map_or(&NO_ADDRS, |f| f);
    a.src
        .is_none_or(|(neg, mask)| facts.matches(p.src, dev, mask) != neg)
        && a.dst
            .is_none_or(|(neg, mask)| facts.matches(p.dst, dev, mask) != neg)
}

/// `-m rpfilter` as rpfilter_mt: the node's routing view decides; with none (never after
/// validation) no route is found, so only `--invert` matches.
pub(crate) fn rpfilter_matches(
    flags: u8,
    addrs: &NodeAddrs,
    p: &PacketMeta,
    f: &PacketFacts,
) -> bool {
    match addrs.load_routes().as_deref() {
        Some(fib) => fib.rpfilter(p, f, flags),
        None => flags & crate::fib::rpfilter_flags::INVERT != 0,
    }
}

/// `-m pkttype` as pkttype_mt, with the class derived from the packet's addresses
/// ([`AddrFacts::pkt_class`]).
pub(crate) fn pkttype_matches(
    negated: bool,
    kind: crate::model::PktType,
    addrs: Option<&NodeAddrs>,
    p: &PacketMeta,
    f: &PacketFacts,
) -> bool {
    let guard = addrs.map(|n| n.load());
    let facts: &AddrFacts = guard.as_deref().map_or(&NO_ADDRS, |a| a);
    (facts.pkt_class(p, f) == kind) != negated
}

/// `-m limit` as a generic cell rate algorithm over one atomic: `tat` is the theoretical
/// arrival time (ns) of the next conforming packet. A packet conforms when
/// `tat - burst_ns <= now`; it then moves `tat` to `max(tat, now) + interval`. This is the
/// token bucket of xt_limit (credit = burst, one token per interval) without its spinlock.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    pub(crate) interval_ns: u64,
    /// (burst - 1) * interval: how far ahead of `now` the schedule may run.
    pub(crate) burst_ns: u64,
    /// Relaxed is enough: the bucket is a rate estimate shared by cores, it guards no other
    /// memory, and the compare-exchange makes each update atomic.
    pub(crate) tat: AtomicU64,
}

impl Clone for TokenBucket {
    fn clone(&self) -> TokenBucket {
        TokenBucket {
            interval_ns: self.interval_ns,
            burst_ns: self.burst_ns,
            tat: AtomicU64::new(self.tat.load(Ordering::Relaxed)),
        }
    }
}

impl TokenBucket {
    pub(crate) fn conforms(&self, now: u64) -> bool {
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            if tat.saturating_sub(self.burst_ns) > now {
                return false;
            }
            let next = tat.max(now).saturating_add(self.interval_ns);
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => tat = seen,
            }
        }
    }

    pub(crate) fn would_conform(&self, now: u64) -> bool {
        self.tat
            .load(Ordering::Relaxed)
            .saturating_sub(self.burst_ns)
            <= now
    }
}

#[derive(Debug, Clone)]
pub(crate) struct IprangeMatch {
    pub(crate) src: Option<(bool, IpAddr, IpAddr)>,
    pub(crate) dst: Option<(bool, IpAddr, IpAddr)>,
}

#[derive(Debug, Clone)]
pub(crate) enum CTarget {
    Continue,
    Accept,
    Drop,
    Reject(RejectWith),
    Return,
    Jump(u32),
    Goto(u32),
    /// `-j LOG` and `-j NFLOG`, boxed to keep the target (and so every rule) 8 bytes smaller.
    Log(Box<LogSpec>),
    /// `-j NOTRACK`, `-j CT --notrack`: UNTRACKED, unless a CT template came first.
    Notrack,
    /// `-j CT` without `--notrack`: the packet's conntrack zone, unless a CT or NOTRACK
    /// rule came first (xt_ct_target).
    Ct(crate::model::CtZoneSpec),
    /// `-j MARK`: `mark = (mark & !mask) ^ value`.
    Mark(MarkValue),
    /// `-j CONNMARK` outside the raw table (in raw it compiles to `Continue`: no entry yet).
    Connmark(ConnmarkTarget),
    /// nft's `KEY vmap @MAP` ([`crate::model::Target::Vmap`]): boxed, as LOG.
    Vmap(Box<CVmap>),
}

/// A compiled named verdict map: the set, how the key is read, and the chain verdicts the
/// map's elements may carry, by verdict number ([`crate::sets::verdict`]).
#[derive(Debug, Clone)]
pub(crate) struct CVmap {
    pub(crate) set: Arc<crate::sets::SetHandle>,
    pub(crate) dirs: Box<[SetDir]>,
    pub(crate) chains: rustc_hash::FxHashMap<u32, CTarget>,
}

/// What an element's verdict that names no chain of the compiled table does (it cannot be
/// added after the compile; see [`CVmap::target`]): the packet is dropped, never let through.
static VMAP_UNRESOLVED: CTarget = CTarget::Drop;
/// `accept`, `drop`, `return`, `continue` of a map element.
static VMAP_ACCEPT: CTarget = CTarget::Accept;
static VMAP_DROP: CTarget = CTarget::Drop;
static VMAP_RETURN: CTarget = CTarget::Return;
static VMAP_CONTINUE: CTarget = CTarget::Continue;

impl CVmap {
    /// The target of the element the packet's key finds; `None` when none does (the next
    /// rule runs, as nft's lookup that finds nothing). Packet path: one set probe, and one
    /// hash probe for a `jump`/`goto` verdict.
    #[inline]
    pub(crate) fn target(&self, p: &PacketMeta, now: u64) -> Option<&CTarget> {
        use crate::sets::verdict;
        Some(match self.set.lookup_verdict(p, &self.dirs, now) {
            verdict::NONE => return None,
            verdict::ACCEPT => &VMAP_ACCEPT,
            verdict::DROP => &VMAP_DROP,
            verdict::RETURN => &VMAP_RETURN,
            verdict::CONTINUE => &VMAP_CONTINUE,
            id => self.chains.get(&id).unwrap_or(&VMAP_UNRESOLVED),
        })
    }
}

/// Where a chain of a new snapshot came from in its predecessor, for [`Snapshot::reuse`]:
/// old chain `old`, whose body it shares, was spliced from, or neither.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChainOrigin {
    pub(crate) old: u32,
    /// The body was spliced from the old one ([`ChainBody::splice`]).
    pub(crate) spliced: bool,
}

/// The chains' diffs of ruleset `new` against the active ruleset `old` of its name, as
/// validation computed them ([`crate::validate`]'s `validate_after`), for
/// [`Snapshot::compile_after_hinted`].
#[derive(Debug)]
pub(crate) struct DiffHint {
    pub(crate) new: Arc<Ruleset>,
    pub(crate) old: Arc<Ruleset>,
    pub(crate) diffs: RuleDiffs,
}

/// Where every chain of a snapshot came from in the snapshot with id `prev`.
#[derive(Debug)]
pub(crate) struct Origin {
    pub(crate) prev: u64,
    pub(crate) chains: Box<[Option<ChainOrigin>]>,
}

/// Snapshot ids, so that [`Snapshot::carry_from`] knows whether it is handed the snapshot its
/// [`Origin`] refers to. Relaxed: the id only needs to be unique.
pub(crate) static NEXT_SNAPSHOT_ID: AtomicU64 = AtomicU64::new(1);

/// Packet and byte counts of one rule or chain policy, read consistently as the sum of all
/// cores plus carried-over values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotCounters {
    /// Ruleset name.
    pub ruleset: Arc<str>,
    /// Family of the table.
    pub family: Family,
    /// Table.
    pub table: TableKind,
    /// Chain.
    pub chain: Arc<str>,
    /// 1-based rule number, or `None` for the chain's policy.
    pub rule: Option<u32>,
    /// Packets.
    pub packets: u64,
    /// Bytes (layer-3 length).
    pub bytes: u64,
}

/// The compiled, immutable form of all active rulesets. See the module docs.
pub struct Snapshot {
    /// Unique among the snapshots of this process.
    pub(crate) id: u64,
    pub(crate) classifier: Classifier,
    pub(crate) rulesets: Box<[Arc<Ruleset>]>,
    pub(crate) names: Box<[Arc<str>]>,
    /// `[family][hook]` -> base chain indices in evaluation order.
    pub(crate) hooks: [[Box<[u32]>; 5]; 2],
    /// `[family][hook]` -> how many of `hooks`' leading chains are raw-table chains (raw sorts
    /// first): conntrack runs between them and the rest ([`Snapshot::classify_batch`]).
    pub(crate) raw_chains: [[u32; 5]; 2],
    pub(crate) chains: Box<[CChain]>,
    /// Number of rules over all chains.
    pub(crate) n_rules: usize,
    /// Where rules (`ChainBody::slots`) and policies ([`CChain::policy_slot`]) count; shared
    /// with the snapshot this one was built from ([`Snapshot::compile_after`]) while it has
    /// room.
    pub(crate) cells: Arc<CounterCells>,
    /// Slots (rules and policies) this snapshot took over from the one it was built from,
    /// with their counts: what [`Snapshot::carry_from`] reports for that snapshot.
    pub(crate) continued: usize,
    /// The slots this snapshot's build took from `cells`, `from..to`, given back when a
    /// commit that prepared it is dropped ([`Snapshot::release_slots`]).
    pub(crate) slots_taken: (u32, u32),
    /// When built from a snapshot into fresh cells: (old slot, new slot) of every rule and
    /// policy that continues one of it, for [`Snapshot::carry_from`] to copy.
    pub(crate) moved: Box<[(u32, u32)]>,
    /// What was taken over from the previous snapshot, when built by
    /// [`Snapshot::compile_after`] into its cells.
    pub(crate) origin: Option<Origin>,
    /// The named tables of stateful matches (`-m recent`), by ruleset; the next build starts
    /// from them (`snapshot/stateful.rs`).
    pub(crate) named: NamedState,
    /// The bytes of a packet these rules can read ([`copy_range::copy_range`]).
    pub(crate) copy_range: u32,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("rulesets", &self.names)
            .field("chains", &self.chains.len())
            .field("rules", &self.n_rules)
            .field("cells", &self.cells)
            .finish()
    }
}

pub(crate) fn family_index(f: Family) -> usize {
    match f {
        Family::Ipv4 => 0,
        Family::Ipv6 => 1,
    }
}

pub(crate) fn addr_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

pub(crate) fn addr_match(n: &Option<Neg<IpNet>>) -> (AddrMatch, bool) {
    match n {
        None => (AddrMatch::default(), false),
        Some(n) => (
            AddrMatch::new(addr_bits(n.value.addr), addr_bits(n.value.mask)),
            n.negated,
        ),
    }
}

/// A stable 64-bit hash of a rule's content, ignoring where it was written and the counters
/// given in the text: two rules with the same canonical iptables-save form hash the same,
/// because the parser canonicalises into the model.
pub(crate) fn content_hash(rule: &Rule) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    rule.src.hash(&mut h);
    rule.dst.hash(&mut h);
    rule.in_iface.hash(&mut h);
    rule.out_iface.hash(&mut h);
    rule.protocol.hash(&mut h);
    rule.fragment.hash(&mut h);
    rule.matches.hash(&mut h);
    rule.target.hash(&mut h);
    h.finish()
}

// === impl Snapshot: inspection ===

impl Snapshot {
    /// The bytes of each packet, from its IP header on, that these rules can read
    /// ([`copy_range::copy_range`] of the snapshot's rulesets): what a source that copies
    /// packets out of the kernel must copy.
    pub fn copy_range(&self) -> u32 {
        self.copy_range
    }

    /// Bytes taken by the compiled rules and by the classification index (a body shared with
    /// another snapshot is counted in full).
    pub fn memory_bytes(&self) -> MemoryUsage {
        let bodies = self.chains.iter().map(|c| &*c.body);
        let rules = bodies
            .clone()
            .flat_map(|b| b.rules.iter())
            .map(|r| {
                // An inline match lives in the rule; shared ones in an `Arc` (two counters).
                let shared = match &r.matches {
                    Matches::Inline(_) => 0,
                    Matches::Shared(a) => 16 + size_of_val::<[CMatch]>(a),
                };
                size_of::<CRule>()
                    + shared
                    + r.matches
                        .iter()
                        .map(|m| match m {
                            CMatch::Multiport { ports, .. } => size_of_val::<[PortRange]>(ports),
                            CMatch::Set { dirs, .. } => size_of_val::<[SetDir]>(dirs),
                            CMatch::Iprange(_) => size_of::<IprangeMatch>(),
                            _ => 0,
                        })
                        .sum::<usize>()
            })
            .sum();
        let indexes = bodies.filter_map(|b| b.index.as_ref());
        MemoryUsage {
            rules,
            index: indexes.clone().map(ChainIndex::memory_bytes).sum::<usize>(),
            tables: indexes.clone().map(ChainIndex::tables).sum(),
            rfc_chains: indexes.filter(|i| i.has_rfc()).count(),
        }
    }

    /// The rulesets this snapshot was compiled from, in evaluation (priority) order.
    pub fn rulesets(&self) -> &[Arc<Ruleset>] {
        &self.rulesets
    }

    /// Number of compiled rules (enforced tables only).
    pub fn rule_count(&self) -> usize {
        self.n_rules
    }

    /// Number of cores this snapshot has counter blocks for.
    pub fn cores(&self) -> usize {
        self.cells.cores()
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    #[test]
    fn hot_structs_stay_small() {
        // A rule with its one inline match; the packet path reads it without another pointer.
        assert!(
            size_of::<CRule>() <= 168,
            "CRule is {} bytes",
            size_of::<CRule>()
        );
        assert!(
            size_of::<CMatch>() <= 40,
            "CMatch is {} bytes",
            size_of::<CMatch>()
        );
    }
}
