//! Compiled snapshots: the immutable, published form of all active rulesets.
//!
//! [`Snapshot::compile`] turns validated [`Ruleset`]s into flat arrays: per (family, hook) the
//! base chains to run in order, every chain's rules with jump and goto targets resolved to
//! indices, and one counter slot per rule and per chain policy. A snapshot never changes after
//! it is built, except its counters and the state of `-m limit` token buckets.
//!
//! ## Evaluation (iptables semantics within a chain, nftables semantics across base chains)
//! At a hook, the base chains of the packet's family run in this order: tables by kernel
//! priority (raw before filter, as NF_IP_PRI_RAW < NF_IP_PRI_FILTER), and within a table kind
//! the rulesets by ascending priority (ties by name). A packet handed over at INPUT or FORWARD
//! has passed PREROUTING in the kernel, so it runs the PREROUTING chains first (raw
//! PREROUTING, conntrack, the other PREROUTING chains, then the hook's chains), seen there
//! with hook PREROUTING and no output interface; a packet at OUTPUT runs raw OUTPUT,
//! conntrack, then filter OUTPUT (locally generated packets never pass PREROUTING). A DROP
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
//! Only filter and raw are enforced; nat, mangle and security tables are not compiled
//! ([`crate::validate`] reports them).
//!
//! ## Incremental commits
//! Each chain's compiled rules and TupleMerge index live in an immutable `ChainBody` behind
//! an `Arc`, and jump/goto targets are table-local, so [`Snapshot::compile_after`] builds the
//! next snapshot from the active one without touching it: a chain whose rules (by content,
//! not location) and whose table's chain names are unchanged shares the old body; a chain
//! where one contiguous run of rules changed (an insert, a delete, a replace; at most an eighth
//! of the chain or 64 rules) gets a body spliced from the old one (new rules compiled, the
//! index updated by TupleMerge's online insert/delete in `compile/tuple_merge.rs`, and the
//! rules kept in chunks of 1024 shared by `Arc`, `compile/chunks.rs`: only the chunks from
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
//! Recursive Flow Classification tables over its header filters (`compile/rfc.rs`), which
//! answer most lookups with a fixed number of table reads; the TupleMerge tables stay for
//! what they cannot decide. A commit that changes such a chain rebuilds its RFC tables.
//!
//! ## Batches
//! [`Snapshot::classify_batch`] gives each packet exactly what [`Snapshot::classify`] gives
//! it, but first probes the hash tables of each packet's first large indexed base chain for
//! up to [`CLASSIFY_BATCH`] packets together, their memory accesses interleaved a table at a
//! time as Open vSwitch's `dpcls_lookup` does (`compile/tuple_merge.rs`); the evaluation
//! then starts that chain from the probe's answer.
//!
//! ## Counters
//! Each core has its own cache-line-aligned block of (packets, bytes) pairs, one pair (slot)
//! per rule and per chain policy, like xt_counters in per-cpu memory. Only that core's worker
//! writes its block (a Relaxed load and store of an `AtomicU64`, which compiles to plain moves;
//! no read-modify-write shared between cores). A reader sums the cores plus a `base` pair
//! that holds counts carried over from other cells and the offsets of
//! [`Snapshot::zero_counters`]. A rule keeps its slot (`ChainBody::slots`) while it exists, and a
//! snapshot built from the active one shares its cells (`compile/counters.rs`): a commit
//! allocates no counters, and [`Snapshot::carry_from`] has nothing to copy.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::{
    AddrTypeLimit, EcnMatch, Family, FragMatch, Hook, IdRange, IpNet, Ipv6HeaderMatch, Match,
    MultiportDir, Neg, Policy, PortRange, RejectWith, RtMatch, Rule, RuleList, Ruleset, SetDir,
    TableKind, Target, TtlMatch, TtlOp, ct_state, diff_rules,
};
use crate::node_addrs::{AddrFacts, NodeAddrs};
use crate::packet::{IfName, PacketMeta};
use crate::sets::{IpSet, SetRegistry};
use crate::validate::RuleDiffs;

mod chunks;
mod counters;
mod rfc;
mod tuple_merge;

use chunks::{Chunks, RuleChunks};
use counters::{CoreCounters, CounterCells};

pub use rfc::{RFC_MAX_RULES, RFC_MIN_RULES};
pub use tuple_merge::PROBE_MIN_BYTES;
use tuple_merge::{ChainIndex, PROBE_BATCH, PROBE_UNKNOWN};

/// Commit-path maps hash with FxHash: keys are our own (names, content hashes), and SipHash's
/// DoS resistance would cost ~15% of a 10k-rule compile.
type HashMap<K, V> = rustc_hash::FxHashMap<K, V>;

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
    /// `compile/tuple_merge.rs`) for chains with at least `min_rules` rules; shorter chains
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
        /// `rfc_max_rules` rules also get RFC tables (`compile/rfc.rs`, Recursive Flow
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

/// A `-j LOG` hit, handed to the caller of [`Snapshot::classify`].
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
    /// `--log-level` (syslog 0..=7, default 4 = warning as xt_LOG).
    pub level: u8,
    /// The packet as it was when the rule matched.
    pub packet: PacketMeta,
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

/// Why [`Snapshot::build_into`] stopped: a compile error, or no counter slot left in the cells
/// it was given (the caller then builds into fresh cells).
enum Stop {
    Compile(CompileError),
    NoRoom,
}

impl From<CompileError> for Stop {
    fn from(e: CompileError) -> Stop {
        Stop::Compile(e)
    }
}

/// Counter slots for the `new` rules of a chain whose `old` rules counted in `old_slot(i)`:
/// a new rule that has the content identity of an old one ([`match_by_content`]) continues
/// it (`keep` of its slot; one more `continued`), the others take a slot from `fresh`.
fn take_slots<'a>(
    old: impl Iterator<Item = &'a Rule>,
    new: impl Iterator<Item = &'a Rule>,
    old_slot: impl Fn(usize) -> u32,
    (fresh, keep): (
        &impl Fn() -> Result<u32, Stop>,
        &impl Fn(u32) -> Result<u32, Stop>,
    ),
    continued: &mut usize,
) -> Result<Vec<u32>, Stop> {
    let old: Vec<u64> = old.map(content_hash).collect();
    let new: Vec<u64> = new.map(content_hash).collect();
    let mut continues = vec![None; new.len()];
    match_by_content(&old, &new, |n, o| continues[n] = Some(old_slot(o)));
    *continued += continues.iter().flatten().count();
    continues
        .into_iter()
        .map(|o| o.map_or_else(fresh, keep))
        .collect()
}

// === compiled form ===

#[derive(Debug)]
struct CChain {
    ruleset: u32,
    family: Family,
    table: TableKind,
    name: Arc<str>,
    /// Global index of the first chain of this chain's table: jump and goto targets are
    /// table-local, so a [`ChainBody`] can be shared by snapshots where the table sits at
    /// another place.
    table_base: u32,
    /// Where the chain's rules are in the model: `rulesets[ruleset].tables[table_at]
    /// .chains[chain_at]`.
    table_at: u32,
    /// See `table_at`.
    chain_at: u32,
    /// Counter slot of the chain's policy (every chain has one; only builtin chains use it).
    policy_slot: u32,
    /// `Some` for builtin chains.
    policy: Option<Policy>,
    body: Arc<ChainBody>,
}

/// The compiled rules of one chain and their index. Immutable; consecutive snapshots share a
/// body (by `Arc`) while the chain's rules and its table's chain names are unchanged, and a
/// commit that changes a few rules of a chain builds its new body from the old one
/// ([`ChainBody::splice`]).
#[derive(Debug)]
struct ChainBody {
    /// In chunks shared with the previous body where a splice left them unchanged.
    rules: RuleChunks,
    /// Where rule `i` counts in the snapshot's [`CounterCells`], kept by the rule as long as it
    /// exists (`compile/counters.rs`); chunked and shared like `rules`. An array beside the
    /// rules, not a field of [`CRule`]: a counter's address then does not wait on a (cold)
    /// rule's cache line, and at 4 bytes a rule it mostly stays cached (with the slot in the
    /// rule, a per-packet lookup at 100k rules measured 15-20% slower).
    slots: Chunks<u32>,
    /// The classification index, or `None` where the chain is walked linearly.
    index: Option<ChainIndex>,
    /// Table-local indices of the chains this chain jumps or goes to, ascending, no repeats.
    targets: Box<[u32]>,
    /// Some rule has `-m set` (or an addrtype match with the node's addresses): such a body is
    /// never shared, because the registry may hold a new set object under the same name (or
    /// another address handle).
    has_sets: bool,
}

/// `-s` or `-d` as (address & mask, mask); an absent field has mask 0, which every address
/// matches. Two `u64` halves rather than `u128`s keep `CRule` 8-byte aligned (a `u128` field
/// pads it to 16 and costs 16 bytes a rule).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct AddrMatch {
    net: [u64; 2],
    mask: [u64; 2],
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
    fn matches(&self, addr: u128) -> bool {
        addr & self.mask() == self.net()
    }
}

/// One compiled rule. Its 1-based number is its position in [`ChainBody::rules`] plus one.
/// `Clone` is cheap (one match inline, several shared), which [`ChainBody::splice`] relies on.
#[derive(Debug, Clone)]
struct CRule {
    src: AddrMatch,
    dst: AddrMatch,
    src_negated: bool,
    dst_negated: bool,
    in_iface: Option<(bool, IfacePattern)>,
    out_iface: Option<(bool, IfacePattern)>,
    protocol: Option<(bool, u8)>,
    fragment: Option<bool>,
    matches: Matches,
    target: CTarget,
}

#[derive(Debug, Clone, Copy)]
struct IfacePattern {
    name: IfName,
    wildcard: bool,
}

impl IfacePattern {
    fn matches(&self, ifname: &IfName) -> bool {
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
enum Matches {
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
enum CMatch {
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
    /// Boxed: two address ranges would double the size of every `CMatch`.
    Iprange(Box<IprangeMatch>),
    Set {
        negated: bool,
        set: Arc<dyn IpSet>,
        dirs: Box<[SetDir]>,
    },
    Mark {
        negated: bool,
        value: u32,
        mask: u32,
    },
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
}

/// A compiled `-m addrtype`: `(negated, type bits)` per direction, and the node's addresses
/// (`None` when its types need none, [`crate::node_addrs::needs_facts`]).
#[derive(Debug, Clone)]
struct CAddrType {
    src: Option<(bool, u16)>,
    dst: Option<(bool, u16)>,
    limit: AddrTypeLimit,
    addrs: Option<Arc<NodeAddrs>>,
}

/// What an addrtype match without the node's addresses decides against (it only asks for
/// types the address bits decide).
static NO_ADDRS: AddrFacts = AddrFacts::EMPTY;

/// `-m addrtype`, as addrtype_mt_v1: the source test, then (if it held) the destination test.
fn addrtype_matches(a: &CAddrType, p: &PacketMeta) -> bool {
    let dev = match a.limit {
        AddrTypeLimit::None => None,
        AddrTypeLimit::In => Some(&p.in_iface),
        AddrTypeLimit::Out => Some(&p.out_iface),
    };
    let guard = a.addrs.as_ref().map(|n| n.load());
    let facts: &AddrFacts = guard.as_deref().map_or(&NO_ADDRS, |f| f);
    a.src
        .is_none_or(|(neg, mask)| facts.matches(p.src, dev, mask) != neg)
        && a.dst
            .is_none_or(|(neg, mask)| facts.matches(p.dst, dev, mask) != neg)
}

/// `-m limit` as a generic cell rate algorithm over one atomic: `tat` is the theoretical
/// arrival time (ns) of the next conforming packet. A packet conforms when
/// `tat - burst_ns <= now`; it then moves `tat` to `max(tat, now) + interval`. This is the
/// token bucket of xt_limit (credit = burst, one token per interval) without its spinlock.
#[derive(Debug)]
struct TokenBucket {
    interval_ns: u64,
    /// (burst - 1) * interval: how far ahead of `now` the schedule may run.
    burst_ns: u64,
    /// Relaxed is enough: the bucket is a rate estimate shared by cores, it guards no other
    /// memory, and the compare-exchange makes each update atomic.
    tat: AtomicU64,
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
    fn conforms(&self, now: u64) -> bool {
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

    fn would_conform(&self, now: u64) -> bool {
        self.tat
            .load(Ordering::Relaxed)
            .saturating_sub(self.burst_ns)
            <= now
    }
}

#[derive(Debug, Clone)]
struct IprangeMatch {
    src: Option<(bool, IpAddr, IpAddr)>,
    dst: Option<(bool, IpAddr, IpAddr)>,
}

#[derive(Debug, Clone)]
enum CTarget {
    Continue,
    Accept,
    Drop,
    Reject(RejectWith),
    Return,
    Jump(u32),
    Goto(u32),
    /// `(prefix, level)`, boxed to keep the target (and so every rule) 8 bytes smaller.
    Log(Box<(Option<Arc<str>>, u8)>),
    Notrack,
}

/// Where a chain of a new snapshot came from in its predecessor, for [`Snapshot::reuse`]:
/// old chain `old`, whose body it shares, was spliced from, or neither.
#[derive(Clone, Copy, Debug)]
struct ChainOrigin {
    old: u32,
    /// The body was spliced from the old one ([`ChainBody::splice`]).
    spliced: bool,
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
struct Origin {
    prev: u64,
    chains: Box<[Option<ChainOrigin>]>,
}

/// Snapshot ids, so that [`Snapshot::carry_from`] knows whether it is handed the snapshot its
/// [`Origin`] refers to. Relaxed: the id only needs to be unique.
static NEXT_SNAPSHOT_ID: AtomicU64 = AtomicU64::new(1);

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
    id: u64,
    classifier: Classifier,
    rulesets: Box<[Arc<Ruleset>]>,
    names: Box<[Arc<str>]>,
    /// `[family][hook]` -> base chain indices in evaluation order.
    hooks: [[Box<[u32]>; 5]; 2],
    /// `[family][hook]` -> how many of `hooks`' leading chains are raw-table chains (raw sorts
    /// first): conntrack runs between them and the rest ([`Snapshot::classify_split`]).
    raw_chains: [[u32; 5]; 2],
    chains: Box<[CChain]>,
    /// Number of rules over all chains.
    n_rules: usize,
    /// Where rules (`ChainBody::slots`) and policies ([`CChain::policy_slot`]) count; shared
    /// with the snapshot this one was built from ([`Snapshot::compile_after`]) while it has
    /// room.
    cells: Arc<CounterCells>,
    /// Slots (rules and policies) this snapshot took over from the one it was built from,
    /// with their counts: what [`Snapshot::carry_from`] reports for that snapshot.
    continued: usize,
    /// The slots this snapshot's build took from `cells`, `from..to`, given back when a
    /// commit that prepared it is dropped ([`Snapshot::release_slots`]).
    slots_taken: (u32, u32),
    /// When built from a snapshot into fresh cells: (old slot, new slot) of every rule and
    /// policy that continues one of it, for [`Snapshot::carry_from`] to copy.
    moved: Box<[(u32, u32)]>,
    /// What was taken over from the previous snapshot, when built by
    /// [`Snapshot::compile_after`] into its cells.
    origin: Option<Origin>,
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

fn family_index(f: Family) -> usize {
    match f {
        Family::Ipv4 => 0,
        Family::Ipv6 => 1,
    }
}

fn addr_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn addr_match(n: &Option<Neg<IpNet>>) -> (AddrMatch, bool) {
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
fn content_hash(rule: &Rule) -> u64 {
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

// === impl Snapshot: building ===

/// Whether a chain's change is small enough to splice its old body (copy the unchanged rules,
/// update the index in place) rather than compile the chain afresh: the changed middle holds
/// at most an eighth of the chain (and always up to 64 rules).
fn splice_pays(old_mid: u32, new_mid: u32, n: usize) -> bool {
    (old_mid + new_mid) as usize <= (n / 8).max(64)
}

/// The table-local jump and goto targets of `rules`, ascending, no repeats.
fn jump_targets<'a>(rules: impl Iterator<Item = &'a CRule>) -> Box<[u32]> {
    let mut t: Vec<u32> = rules
        .filter_map(|r| match r.target {
            CTarget::Jump(t) | CTarget::Goto(t) => Some(t),
            _ => None,
        })
        .collect();
    t.sort_unstable();
    t.dedup();
    t.into_boxed_slice()
}

/// Some match holds an object resolved through the registry (a set, the node's addresses).
fn has_set(r: &CRule) -> bool {
    r.matches.iter().any(|m| match m {
        CMatch::Set { .. } => true,
        CMatch::AddrType(a) => a.addrs.is_some(),
        _ => false,
    })
}

/// What a chain body is compiled with: the table's chain names (table-local indices), the set
/// registry, the classifier, the address width, and the names for error messages.
struct BodyContext<'a> {
    chains: &'a HashMap<&'a str, u32>,
    sets: &'a dyn SetRegistry,
    classifier: Classifier,
    width: u32,
    ruleset: &'a str,
    table: TableKind,
    chain: &'a str,
}

impl BodyContext<'_> {
    fn compile<'r>(
        &self,
        rules: impl Iterator<Item = &'r Rule>,
    ) -> Result<Vec<CRule>, CompileError> {
        rules
            .map(|rule| {
                compile_rule(rule, self.chains, self.sets, self.width == 128).map_err(|e| {
                    e.in_context((self.ruleset.to_string(), self.table, self.chain.to_string()))
                })
            })
            .collect()
    }

    fn wants_index(&self, n: usize) -> bool {
        matches!(self.classifier, Classifier::TupleMerge { min_rules, .. } if n >= min_rules.max(1) as usize)
    }

    /// [`Classifier::TupleMerge`]'s `(rfc_min_rules, rfc_max_rules)` (none for the linear
    /// walk).
    fn rfc_rules(&self) -> (u32, u32) {
        match self.classifier {
            Classifier::TupleMerge {
                rfc_min_rules,
                rfc_max_rules,
                ..
            } => (rfc_min_rules, rfc_max_rules),
            Classifier::Linear => (1, 0),
        }
    }

    /// The body of `rules`; `index`, `targets` and `has_sets` are computed here unless given.
    fn finish(
        &self,
        rules: RuleChunks,
        slots: Chunks<u32>,
        index: Option<ChainIndex>,
        known: Option<(Box<[u32]>, bool)>,
    ) -> ChainBody {
        let index = index.or_else(|| {
            self.wants_index(rules.len())
                .then(|| ChainIndex::build(&rules, self.width, self.rfc_rules()))
        });
        let (targets, has_sets) =
            known.unwrap_or_else(|| (jump_targets(rules.iter()), rules.iter().any(has_set)));
        ChainBody {
            targets,
            has_sets,
            rules,
            slots,
            index,
        }
    }
}

impl ChainBody {
    /// Compiles `rules` from scratch, rule `i` counting in `slots[i]`.
    fn compile(
        rules: &RuleList,
        slots: &[u32],
        cx: &BodyContext<'_>,
    ) -> Result<ChainBody, CompileError> {
        let compiled = RuleChunks::new(cx.compile(rules.iter())?);
        Ok(cx.finish(compiled, Chunks::new(slots.to_vec()), None, None))
    }

    /// The body of `rules`, which equal this body's rules except that `old_mid` rules after
    /// the first `prefix` became `new_mid` rules, counting in `mid_slots`: unchanged rules are
    /// copied (cheap clones, their slots with them), only the new ones are compiled, and the
    /// index is updated ([`ChainIndex::update`], TupleMerge's incremental insert and delete)
    /// instead of rebuilt.
    fn splice(
        &self,
        rules: &RuleList,
        (prefix, old_mid, new_mid): (u32, u32, u32),
        mid_slots: &[u32],
        cx: &BodyContext<'_>,
    ) -> Result<ChainBody, CompileError> {
        let (p, om, nm) = (prefix as usize, old_mid as usize, new_mid as usize);
        let new = cx.compile(rules.range(p..p + nm))?;
        // Only set-free bodies are spliced, so only the new rules can bring a set; the
        // targets need a scan of the whole chain only when the old or the new rules jump.
        let has_sets = new.iter().any(has_set);
        let new_jumps = !jump_targets(new.iter()).is_empty();
        let compiled = self.rules.splice(p, om, new);
        let index = match &self.index {
            Some(idx) if cx.wants_index(compiled.len()) => Some(idx.update(
                &self.rules,
                &compiled,
                cx.width,
                (prefix, old_mid, new_mid),
                cx.rfc_rules(),
            )),
            _ => None,
        };
        let targets = if self.targets.is_empty() && !new_jumps {
            Box::default()
        } else {
            jump_targets(compiled.iter())
        };
        let slots = self.slots.splice(p, om, mid_slots.to_vec());
        Ok(cx.finish(compiled, slots, index, Some((targets, has_sets))))
    }
}

impl Snapshot {
    /// An empty snapshot (every hook accepts) with counter blocks for `cores` cores.
    pub fn empty(cores: usize) -> Snapshot {
        Snapshot {
            id: NEXT_SNAPSHOT_ID.fetch_add(1, Ordering::Relaxed),
            classifier: Classifier::default(),
            rulesets: Box::new([]),
            names: Box::new([]),
            hooks: Default::default(),
            raw_chains: [[0; 5]; 2],
            chains: Box::new([]),
            n_rules: 0,
            cells: Arc::new(CounterCells::new(cores, 0)),
            continued: 0,
            slots_taken: (0, 0),
            moved: Box::default(),
            origin: None,
        }
    }

    /// Compiles `rulesets` (already validated) for `cores` worker cores with the default
    /// [`Classifier`]. Set names resolve through `sets`.
    ///
    /// Errors: [`CompileError`] when a ruleset was not validated and refers to something that
    /// does not exist or cannot be enforced.
    pub fn compile(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
    ) -> Result<Snapshot, CompileError> {
        Self::compile_with(rulesets, sets, cores, Classifier::default())
    }

    /// As [`Snapshot::compile`], with the given classifier ([`Classifier::Linear`] forces the
    /// reference walk).
    pub fn compile_with(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
        classifier: Classifier,
    ) -> Result<Snapshot, CompileError> {
        Self::build(rulesets, sets, cores, classifier, None)
    }

    /// As [`Snapshot::compile_with`] with `prev`'s classifier, reusing what `prev` compiled
    /// (incremental update): a chain whose rules are unchanged, in a table whose chain names
    /// are unchanged, shares `prev`'s compiled rules and index (an `Arc`, no copy); a chain
    /// where a contiguous run of at most an eighth of its rules (or 64) changed copies the
    /// unchanged rules and updates the index (`ChainIndex::update`) instead of rebuilding
    /// it. Chains with `-m set` are always recompiled (the registry may hold new set objects).
    /// The result classifies exactly like a from-scratch compile; `prev` is not changed. Shared
    /// `-m limit` rules keep their token bucket state (a from-scratch compile starts them full).
    /// The result counts in `prev`'s counter cells while they have room for its new rules
    /// (`compile/counters.rs`): the rules it keeps go on counting where they counted, so
    /// publish it only in `prev`'s place (as [`crate::engine::Engine`] does); when the cells
    /// are full it gets fresh ones and compiles every chain afresh (its `-m limit`
    /// rules then take over the bucket state of the rules they continue, as at carry).
    ///
    /// Errors: as [`Snapshot::compile`].
    pub fn compile_after(
        prev: &Snapshot,
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
    ) -> Result<Snapshot, CompileError> {
        Self::build(rulesets, sets, cores, prev.classifier, Some((prev, &[])))
    }

    /// As [`Snapshot::compile_after`], taking the chains' diffs from `hints` (computed by
    /// validation against the same old rulesets) instead of comparing the rules again. A hint
    /// is used only for the ruleset `hint.new` when `prev` holds `hint.old` under its name.
    pub(crate) fn compile_after_hinted(
        prev: &Snapshot,
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
        hints: &[DiffHint],
    ) -> Result<Snapshot, CompileError> {
        Self::build(rulesets, sets, cores, prev.classifier, Some((prev, hints)))
    }

    fn build(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        cores: usize,
        classifier: Classifier,
        prev: Option<(&Snapshot, &[DiffHint])>,
    ) -> Result<Snapshot, CompileError> {
        // Counters are shared with `prev` (same cells) only where its cells fit: same cores,
        // and room for the new rules; otherwise fresh cells, into which the carry copies the
        // counts of the rules that continue.
        let prev = prev.filter(|(p, _)| p.classifier == classifier);
        if let Some((p, hints)) = prev.filter(|(p, _)| p.cells.cores() == cores.max(1)) {
            match Self::build_into(rulesets, sets, classifier, Some((p, hints)), &p.cells, None) {
                Err(Stop::NoRoom) => {}
                Err(Stop::Compile(e)) => return Err(e),
                Ok(s) => return Ok(s),
            }
        }
        let slots: usize = rulesets
            .iter()
            .flat_map(|rs| rs.tables.iter().filter(|t| t.kind.is_enforced()))
            .flat_map(|t| t.chains.iter())
            .map(|c| c.rules.len() + 1)
            .sum();
        let cells = Arc::new(CounterCells::with_room(cores, slots));
        let moved = RefCell::new(Vec::new());
        let snapshot = Self::build_into(rulesets, sets, classifier, prev, &cells, Some(&moved))
            .map_err(|e| match e {
                Stop::Compile(e) => e,
                // Unreachable: the cells hold a slot for every rule and policy.
                Stop::NoRoom => CompileError::TooManyRules(slots),
            })?;
        // Compiled afresh, so no chain shares `prev`'s `-m limit` buckets: they go on from
        // the state of the rules they continue (as a splice's copies do), not full again.
        if let Some((p, _)) = prev {
            snapshot.take_limits_from(p);
        }
        Ok(snapshot)
    }

    /// [`Snapshot::build`] with counters in `cells`. Without `moved`, `cells` are `prev`'s:
    /// `prev` lends its compiled chains and the slots of the rules it keeps. With `moved`,
    /// `cells` are fresh: every chain is compiled, and each rule or policy that continues
    /// one of `prev` takes a new slot, noted in `moved` as (old slot, new slot). On error
    /// the slots taken go back to `cells`.
    fn build_into(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        classifier: Classifier,
        prev: Option<(&Snapshot, &[DiffHint])>,
        cells: &Arc<CounterCells>,
        moved: Option<&RefCell<Vec<(u32, u32)>>>,
    ) -> Result<Snapshot, Stop> {
        let _one = cells.build();
        let from = cells.cursor();
        let built = Self::build_body(rulesets, sets, classifier, prev, cells, moved);
        match built {
            Ok(mut s) => {
                s.slots_taken = (from, cells.cursor());
                s.moved = moved
                    .map(|m| m.take().into_boxed_slice())
                    .unwrap_or_default();
                Ok(s)
            }
            Err(e) => {
                // No other build took slots meanwhile (`_one`), and no core saw these.
                let _ = cells.release_locked((from, cells.cursor()));
                Err(e)
            }
        }
    }

    /// The body of [`Snapshot::build_into`], which holds the cells' build lock.
    fn build_body(
        rulesets: &[Arc<Ruleset>],
        sets: &dyn SetRegistry,
        classifier: Classifier,
        prev: Option<(&Snapshot, &[DiffHint])>,
        cells: &Arc<CounterCells>,
        moved: Option<&RefCell<Vec<(u32, u32)>>>,
    ) -> Result<Snapshot, Stop> {
        let (prev, hints) = prev.map_or((None, &[][..]), |(p, h)| (Some(p), h));
        let mut order: Vec<usize> = (0..rulesets.len()).collect();
        order.sort_by(|&a, &b| {
            (rulesets[a].priority, &rulesets[a].name)
                .cmp(&(rulesets[b].priority, &rulesets[b].name))
        });
        for w in order.windows(2) {
            if rulesets[w[0]].name == rulesets[w[1]].name {
                return Err(CompileError::DuplicateRuleset(rulesets[w[0]].name.clone()).into());
            }
        }
        let sorted: Vec<Arc<Ruleset>> = order.iter().map(|&i| rulesets[i].clone()).collect();
        let names: Vec<Arc<str>> = sorted.iter().map(|r| Arc::from(r.name.as_str())).collect();
        let old_rulesets: HashMap<&str, usize> = prev.map_or_else(HashMap::default, |p| {
            p.rulesets
                .iter()
                .enumerate()
                .map(|(i, r)| (r.name.as_str(), i))
                .collect()
        });
        let old_chains = prev.map_or_else(HashMap::default, Snapshot::chain_map);
        let fresh = || cells.alloc().ok_or(Stop::NoRoom);
        // The slot a rule or policy that continues one of `prev` (in `old`) counts in.
        let keep = |old: u32| -> Result<u32, Stop> {
            match moved {
                None => Ok(old),
                Some(m) => {
                    let new = fresh()?;
                    m.borrow_mut().push((old, new));
                    Ok(new)
                }
            }
        };

        let mut chains: Vec<CChain> = Vec::new();
        let mut origins: Vec<Option<ChainOrigin>> = Vec::new();
        let mut n_rules = 0usize;
        let mut continued = 0usize;
        let mut hooks: [[Vec<u32>; 5]; 2] = Default::default();
        // Base chains per (family, hook, table kind), ruleset order already sorted.
        let mut base: Vec<(Family, Hook, TableKind, u32)> = Vec::new();

        for (ri, rs) in sorted.iter().enumerate() {
            let old_rs = prev.and_then(|p| Some(&p.rulesets[*old_rulesets.get(rs.name.as_str())?]));
            let same_rs = old_rs.is_some_and(|o| Arc::ptr_eq(o, rs));
            let hint = old_rs.and_then(|o| {
                hints
                    .iter()
                    .find(|h| Arc::ptr_eq(&h.new, rs) && Arc::ptr_eq(&h.old, o))
            });
            for (ti, table) in rs.tables.iter().enumerate() {
                if !table.kind.is_enforced() {
                    continue;
                }
                let table_base = chains.len() as u32;
                let local: HashMap<&str, u32> = table
                    .chains
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name.as_str(), i as u32))
                    .collect();
                // Sharing needs the same chain names in the same order: targets are
                // table-local indices.
                let old_table = old_rs
                    .and_then(|o| o.table(table.family, table.kind))
                    .filter(|ot| {
                        ot.chains.len() == table.chains.len()
                            && ot
                                .chains
                                .iter()
                                .zip(&table.chains)
                                .all(|(a, b)| a.name == b.name)
                    });
                let width = match table.family {
                    Family::Ipv4 => 32,
                    Family::Ipv6 => 128,
                };
                for (ci, chain) in table.chains.iter().enumerate() {
                    let cx = BodyContext {
                        chains: &local,
                        sets,
                        classifier,
                        width,
                        ruleset: &rs.name,
                        table: table.kind,
                        chain: &chain.name,
                    };
                    // The chain of this name in `prev`, whose slots the rules it keeps take.
                    let named = prev.and_then(|p| {
                        let key = (
                            rs.name.as_str(),
                            table.family,
                            table.kind,
                            chain.name.as_str(),
                        );
                        let oc = *old_chains.get(&key)?;
                        Some((oc, &p.chains[oc as usize]))
                    });
                    let old =
                        named.and_then(|(oc, o)| Some((oc, &o.body, &old_table?.chains[ci].rules)));
                    let (body, origin) = match old {
                        Some((oc, ob, old_rules)) => {
                            let hinted = hint.and_then(|h| *h.diffs.tables.get(ti)?.get(ci)?);
                            let diff = if same_rs {
                                (chain.rules.len() as u32, 0, 0)
                            } else if let Some(d) = hinted {
                                d
                            } else {
                                diff_rules(old_rules, &chain.rules, |_, _| {})
                            };
                            let (p, om, nm) = (diff.0 as usize, diff.1 as usize, diff.2 as usize);
                            let spliced = !ob.has_sets
                                && moved.is_none()
                                && (om != 0 || nm != 0)
                                && splice_pays(diff.1, diff.2, chain.rules.len());
                            let origin = ChainOrigin { old: oc, spliced };
                            // The unchanged rules before and after the change keep their slots;
                            // the changed run takes those of equal old rules, else new ones.
                            continued += chain.rules.len() - nm;
                            let body = if om == 0 && nm == 0 && !ob.has_sets && moved.is_none() {
                                ob.clone()
                            } else {
                                let mid = take_slots(
                                    old_rules.range(p..p + om),
                                    chain.rules.range(p..p + nm),
                                    |q| ob.slots[p + q],
                                    (&fresh, &keep),
                                    &mut continued,
                                )?;
                                if spliced {
                                    Arc::new(ob.splice(&chain.rules, diff, &mid, &cx)?)
                                } else {
                                    let mut slots = Vec::with_capacity(chain.rules.len());
                                    for &s in ob.slots.range(0..p) {
                                        slots.push(keep(s)?);
                                    }
                                    slots.extend_from_slice(&mid);
                                    for &s in ob.slots.range(p + om..ob.slots.len()) {
                                        slots.push(keep(s)?);
                                    }
                                    Arc::new(ChainBody::compile(&chain.rules, &slots, &cx)?)
                                }
                            };
                            (body, Some(origin))
                        }
                        None => {
                            let slots = match (named, prev) {
                                // Same name, other chain names in the table: rules keep their
                                // slots by content identity.
                                (Some((_, o)), Some(p)) => take_slots(
                                    p.model_rules(o).iter(),
                                    chain.rules.iter(),
                                    |q| o.body.slots[q],
                                    (&fresh, &keep),
                                    &mut continued,
                                )?,
                                _ => (0..chain.rules.len())
                                    .map(|_| fresh())
                                    .collect::<Result<_, _>>()?,
                            };
                            (
                                Arc::new(ChainBody::compile(&chain.rules, &slots, &cx)?),
                                None,
                            )
                        }
                    };
                    let policy_slot = match named {
                        Some((_, o)) => {
                            continued += 1;
                            keep(o.policy_slot)?
                        }
                        None => fresh()?,
                    };
                    let gi = chains.len() as u32;
                    if let Some(hook) = chain.hook() {
                        base.push((table.family, hook, table.kind, gi));
                    }
                    chains.push(CChain {
                        ruleset: ri as u32,
                        family: table.family,
                        table: table.kind,
                        name: Arc::from(chain.name.as_str()),
                        table_base,
                        table_at: ti as u32,
                        chain_at: ci as u32,
                        policy_slot,
                        policy: chain.policy,
                        body,
                    });
                    origins.push(origin);
                    n_rules += chain.rules.len();
                }
            }
        }
        if let Some(c) = find_loop(&chains) {
            let c = &chains[c];
            return Err(CompileError::Loop {
                ruleset: sorted[c.ruleset as usize].name.clone(),
                table: c.table,
                chain: c.name.to_string(),
            }
            .into());
        }
        // Tables by kernel priority, then rulesets by priority (stable sort keeps that order).
        base.sort_by_key(|&(_, _, kind, _)| kind);
        let mut raw_chains = [[0u32; 5]; 2];
        for (family, hook, kind, ci) in base {
            hooks[family_index(family)][hook.index()].push(ci);
            if kind == TableKind::Raw {
                raw_chains[family_index(family)][hook.index()] += 1;
            }
        }
        Ok(Snapshot {
            id: NEXT_SNAPSHOT_ID.fetch_add(1, Ordering::Relaxed),
            classifier,
            rulesets: sorted.into_boxed_slice(),
            names: names.into_boxed_slice(),
            hooks: hooks.map(|h| h.map(Vec::into_boxed_slice)),
            raw_chains,
            chains: chains.into_boxed_slice(),
            n_rules,
            cells: cells.clone(),
            continued,
            // Set by `build_into`.
            slots_taken: (0, 0),
            moved: Box::default(),
            origin: prev.map(|p| Origin {
                prev: p.id,
                chains: origins.into_boxed_slice(),
            }),
        })
    }

    /// The rules chain `c` of this snapshot was compiled from.
    fn model_rules(&self, c: &CChain) -> &RuleList {
        &self.rulesets[c.ruleset as usize].tables[c.table_at as usize].chains[c.chain_at as usize]
            .rules
    }

    /// Chain index by (ruleset, family, table, chain name).
    fn chain_map(&self) -> HashMap<(&str, Family, TableKind, &str), u32> {
        self.chains
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    (
                        &*self.names[c.ruleset as usize],
                        c.family,
                        c.table,
                        &*c.name,
                    ),
                    i as u32,
                )
            })
            .collect()
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

    /// How this snapshot reused `prev`, when it was built from it by
    /// [`Snapshot::compile_after`] (all zero but `chains` otherwise).
    pub fn reuse(&self, prev: &Snapshot) -> Reuse {
        let mut r = Reuse {
            chains: self.chains.len(),
            ..Reuse::default()
        };
        if let Some(o) = self.origin.as_ref().filter(|o| o.prev == prev.id) {
            for (c, o) in self.chains.iter().zip(o.chains.iter()) {
                match o {
                    Some(o) if Arc::ptr_eq(&c.body, &prev.chains[o.old as usize].body) => {
                        r.shared += 1;
                    }
                    Some(o) if o.spliced => r.spliced += 1,
                    _ => {}
                }
            }
        }
        r
    }
}

/// How a snapshot built by [`Snapshot::compile_after`] reused its predecessor
/// ([`Snapshot::reuse`]). Chains neither shared nor spliced were compiled afresh.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reuse {
    /// Chains in the snapshot.
    pub chains: usize,
    /// Chains whose compiled rules and index are the predecessor's (shared, not copied).
    pub shared: usize,
    /// Changed chains built from the predecessor's: unchanged rules copied, index updated.
    pub spliced: usize,
}

/// A chain on a cycle of jumps and gotos, if any: iterative DFS with colours over the
/// resolved targets (validation reports loops with locations; this keeps an unvalidated
/// ruleset from hanging the packet path).
fn find_loop(chains: &[CChain]) -> Option<usize> {
    let target = |c: usize, i: usize| {
        let ch = &chains[c];
        ch.body
            .targets
            .get(i)
            .map(|&t| (ch.table_base + t) as usize)
    };
    // 0 new, 1 on the stack, 2 done.
    let mut state = vec![0u8; chains.len()];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in 0..chains.len() {
        if state[root] != 0 {
            continue;
        }
        state[root] = 1;
        stack.push((root, 0));
        while let Some(&mut (c, ref mut i)) = stack.last_mut() {
            match target(c, *i) {
                Some(t) => {
                    *i += 1;
                    match state[t] {
                        0 => {
                            state[t] = 1;
                            stack.push((t, 0));
                        }
                        1 => return Some(t),
                        _ => {}
                    }
                }
                None => {
                    state[c] = 2;
                    stack.pop();
                }
            }
        }
    }
    None
}

/// A compile error before the chain context is known.
enum RuleError {
    UnknownChain(String),
    Unsupported(String),
    UnknownSet(String),
}

impl RuleError {
    fn in_context(self, (ruleset, table, chain): (String, TableKind, String)) -> CompileError {
        match self {
            RuleError::UnknownChain(target) => CompileError::UnknownChain {
                ruleset,
                table,
                chain,
                target,
            },
            RuleError::Unsupported(extension) => CompileError::Unsupported {
                ruleset,
                table,
                chain,
                extension,
            },
            RuleError::UnknownSet(set) => CompileError::UnknownSet { ruleset, set },
        }
    }
}

fn iface_pattern(i: &Neg<crate::model::Iface>) -> Option<(bool, IfacePattern)> {
    let (name, wildcard) = match i.value.name.strip_suffix('+') {
        Some(p) => (p, true),
        None => (i.value.name.as_str(), false),
    };
    Some((
        i.negated,
        IfacePattern {
            name: IfName::new(name)?,
            wildcard,
        },
    ))
}

fn compile_rule(
    rule: &Rule,
    chains: &HashMap<&str, u32>,
    sets: &dyn SetRegistry,
    v6: bool,
) -> Result<CRule, RuleError> {
    let mut matches = Vec::with_capacity(rule.matches.len());
    for m in &rule.matches {
        let neg = |n: &Option<Neg<PortRange>>| n.map(|p| (p.negated, p.value));
        let c = match m {
            Match::Tcp(t) => CMatch::Tcp {
                sport: neg(&t.sport),
                dport: neg(&t.dport),
                flags: t.flags.map(|f| (f.negated, f.value.mask, f.value.comp)),
                option: t.option.map(|o| (o.negated, o.value)),
            },
            Match::Udp(u) => CMatch::Udp {
                sport: neg(&u.sport),
                dport: neg(&u.dport),
            },
            Match::Multiport(mp) => CMatch::Multiport {
                dir: mp.dir,
                negated: mp.negated,
                ports: mp.ports.clone().into_boxed_slice(),
            },
            // IPv4 type 255 matches every ICMP packet whatever the code range (the kernel's
            // icmp_type_code_match tests `test_type == 0xFF` first). The parser keeps
            // `--icmp-type 255/0` as `Some(255)` so that it prints back as written (as newer
            // iptables-save does), and a structured model may carry it too.
            Match::Icmp(i) => CMatch::Icmp {
                negated: i.negated,
                icmp_type: i.icmp_type.filter(|&t| t != 255),
                code: i.code,
            },
            Match::Icmpv6(i) => CMatch::Icmp {
                negated: i.negated,
                icmp_type: i.icmp_type,
                code: i.code,
            },
            Match::Conntrack(ct) => {
                if let Some(o) = ct.other.first() {
                    return Err(RuleError::Unsupported(format!("conntrack {}", o.name)));
                }
                match ct.ctstate {
                    Some(s) => CMatch::CtState {
                        negated: s.negated,
                        bits: s.value,
                    },
                    None => continue,
                }
            }
            Match::State(s) => CMatch::CtState {
                negated: s.negated,
                bits: s.value,
            },
            Match::Iprange(r) => CMatch::Iprange(Box::new(IprangeMatch {
                src: r.src.map(|n| (n.negated, n.value.lo, n.value.hi)),
                dst: r.dst.map(|n| (n.negated, n.value.lo, n.value.hi)),
            })),
            Match::Set(s) => {
                if let Some(o) = s.other.first() {
                    return Err(RuleError::Unsupported(format!("set {}", o.name)));
                }
                let set = sets
                    .lookup(&s.name)
                    .ok_or_else(|| RuleError::UnknownSet(s.name.clone()))?;
                CMatch::Set {
                    negated: s.negated,
                    set,
                    dirs: s.dirs.clone().into_boxed_slice(),
                }
            }
            Match::Comment(_) => continue,
            Match::Mark(mk) => CMatch::Mark {
                negated: mk.negated,
                value: mk.value.value,
                mask: mk.value.mask,
            },
            Match::Length(l) => CMatch::Length {
                negated: l.negated,
                range: l.value,
            },
            Match::Limit(l) => {
                let interval_ns = l.interval_ns();
                CMatch::Limit(TokenBucket {
                    interval_ns,
                    burst_ns: interval_ns.saturating_mul(u64::from(l.burst.max(1) - 1)),
                    tat: AtomicU64::new(0),
                })
            }
            Match::Mac(mac) => CMatch::Mac {
                negated: mac.negated,
                mac: mac.value,
            },
            Match::Ttl(t) | Match::Hl(t) => CMatch::Ttl(*t),
            Match::Tos(t) => CMatch::Tos {
                negated: t.negated,
                value: t.value.value,
                mask: t.value.mask,
            },
            // xt_dscp: `(dsfield >> 2) == dscp`.
            Match::Dscp(d) => CMatch::Tos {
                negated: d.negated,
                value: d.value << 2,
                mask: 0xfc,
            },
            Match::Ecn(e) => CMatch::Ecn(*e),
            Match::Ah(a) => CMatch::Ah {
                negated: a.negated,
                spi: a.value,
            },
            Match::Frag(f) => CMatch::Frag(Box::new(*f)),
            Match::Rt(r) => {
                if let Some(o) = r.other.first() {
                    return Err(RuleError::Unsupported(format!("rt {}", o.name)));
                }
                CMatch::Rt(Box::new(r.clone()))
            }
            Match::Ipv6Header(h) => CMatch::Ipv6Header(*h),
            Match::AddrType(a) => {
                let family = if v6 { Family::Ipv6 } else { Family::Ipv4 };
                let masks = a.src.iter().chain(a.dst.iter());
                let undecided = masks.clone().map(|v| v.value).fold(0, |x, y| x | y)
                    & !crate::model::addr_type::DECIDED;
                if undecided != 0 {
                    return Err(RuleError::Unsupported(format!(
                        "addrtype {}",
                        crate::model::addr_type::names(undecided)
                    )));
                }
                let addrs = if masks
                    .clone()
                    .any(|v| crate::node_addrs::needs_facts(family, v.value))
                {
                    Some(sets.node_addrs().ok_or_else(|| {
                        RuleError::Unsupported("addrtype without the node's addresses".into())
                    })?)
                } else {
                    None
                };
                CMatch::AddrType(Box::new(CAddrType {
                    src: a.src.map(|v| (v.negated, v.value)),
                    dst: a.dst.map(|v| (v.negated, v.value)),
                    limit: a.limit,
                    addrs,
                }))
            }
            Match::Opaque(o) => return Err(RuleError::Unsupported(o.name.clone())),
        };
        matches.push(c);
    }
    let resolve = |name: &str| {
        chains
            .get(name)
            .copied()
            .ok_or_else(|| RuleError::UnknownChain(name.to_string()))
    };
    let target = match &rule.target {
        Target::None => CTarget::Continue,
        Target::Accept => CTarget::Accept,
        Target::Drop => CTarget::Drop,
        Target::Return => CTarget::Return,
        Target::Reject(w) => CTarget::Reject(*w),
        Target::Jump(c) => CTarget::Jump(resolve(c)?),
        Target::Goto(c) => CTarget::Goto(resolve(c)?),
        Target::Log(l) => CTarget::Log(Box::new((
            l.prefix.as_deref().map(Arc::from),
            l.level.unwrap_or(4),
        ))),
        Target::Notrack => CTarget::Notrack,
        Target::Ct(ct) if ct.notrack && ct.other.is_empty() => CTarget::Notrack,
        Target::Ct(ct) => {
            let what = ct
                .other
                .first()
                .map_or_else(|| "CT".to_string(), |o| format!("CT {}", o.name));
            return Err(RuleError::Unsupported(what));
        }
        Target::Opaque(o) => return Err(RuleError::Unsupported(o.name.clone())),
    };
    let iface = |i: &Option<Neg<crate::model::Iface>>| -> Result<_, RuleError> {
        match i {
            None => Ok(None),
            Some(n) => iface_pattern(n)
                .map(Some)
                .ok_or_else(|| RuleError::Unsupported(format!("interface {}", n.value.name))),
        }
    };
    let (src, src_negated) = addr_match(&rule.src);
    let (dst, dst_negated) = addr_match(&rule.dst);
    Ok(CRule {
        src,
        dst,
        src_negated,
        dst_negated,
        in_iface: iface(&rule.in_iface)?,
        out_iface: iface(&rule.out_iface)?,
        protocol: rule.protocol.map(|p| (p.negated, p.value)),
        fragment: rule.fragment,
        matches: Matches::new(matches),
        target,
    })
}

// === impl Snapshot: evaluation ===

/// What the evaluator reports on its way; the hot path counts, the trace records.
trait Observer {
    /// Rule `number` (1-based) of `chain` matched; it counts in `slot`.
    fn rule(&mut self, slot: usize, chain: &CChain, number: u32, pkt: &PacketMeta);
    fn policy(&mut self, slot: usize, chain: &CChain, pkt: &PacketMeta);
    fn limit(&mut self, bucket: &TokenBucket, now: u64) -> bool;
    fn log(
        &mut self,
        chain: &CChain,
        number: u32,
        prefix: &Option<Arc<str>>,
        level: u8,
        pkt: &PacketMeta,
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
    fn log(
        &mut self,
        chain: &CChain,
        number: u32,
        prefix: &Option<Arc<str>>,
        level: u8,
        pkt: &PacketMeta,
    ) {
        self.inner.log(chain, number, prefix, level, pkt);
    }
    fn outcome(&mut self, what: StepOutcome) {
        self.inner.outcome(what);
    }
    fn hotdrop(&mut self) {
        self.dropped = true;
        self.inner.hotdrop();
    }
}

fn log_event(
    names: &[Arc<str>],
    chain: &CChain,
    number: u32,
    prefix: &Option<Arc<str>>,
    level: u8,
    pkt: &PacketMeta,
) -> LogEvent {
    LogEvent {
        ruleset: names[chain.ruleset as usize].clone(),
        table: chain.table,
        chain: chain.name.clone(),
        rule: number,
        prefix: prefix.clone(),
        level,
        packet: *pkt,
    }
}

/// The hot-path observer: bumps this core's counters and collects LOG events.
struct Counting<'a> {
    counters: &'a CoreCounters,
    names: &'a [Arc<str>],
    logs: &'a mut Vec<LogEvent>,
}

impl Observer for Counting<'_> {
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
    fn log(
        &mut self,
        chain: &CChain,
        number: u32,
        prefix: &Option<Arc<str>>,
        level: u8,
        pkt: &PacketMeta,
    ) {
        self.logs
            .push(log_event(self.names, chain, number, prefix, level, pkt));
    }
}

/// What happened at one step of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepOutcome {
    /// The rule matched and its target does not decide (no target, LOG, NOTRACK).
    Continue,
    /// `-j CHAIN`.
    Jump,
    /// `-g CHAIN`.
    Goto,
    /// RETURN (explicit).
    Return,
    /// ACCEPT by a rule: the packet goes on to the next base chain.
    Accept,
    /// DROP by a rule.
    Drop,
    /// REJECT by a rule.
    Reject,
    /// The chain's policy applied.
    Policy(Policy),
}

/// One step of a [`Trace`]: a rule that matched, or a policy that applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceStep {
    /// Ruleset name.
    pub ruleset: Arc<str>,
    /// Family of the table.
    pub family: Family,
    /// Table.
    pub table: TableKind,
    /// Chain.
    pub chain: Arc<str>,
    /// 1-based rule number; `None` when the step is the chain's policy.
    pub rule: Option<u32>,
    /// What the step did.
    pub outcome: StepOutcome,
}

/// The result of [`Snapshot::trace`]: the verdict and every rule that matched on the way, in
/// order (the rules whose counters would go up), like `nft monitor trace`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The hook's verdict.
    pub verdict: Verdict,
    /// Matched rules and applied policies in evaluation order.
    pub steps: Vec<TraceStep>,
    /// LOG events the packet would have produced.
    pub logs: Vec<LogEvent>,
    /// The packet's [`ct_state`] bit at the end of the evaluation: after raw-table NOTRACK
    /// and, in [`Snapshot::trace_split`], after the step between the raw and the other chains
    /// (the engine's conntrack lookup). Only raw-table rules change it, so it is the state the
    /// non-raw chains saw.
    pub ct_state: u8,
    /// The packet was dropped by a match that reads transport-header bytes it lacks
    /// ([`PacketMeta::l4_cut`], the kernel's hotdrop); that rule is not among the steps.
    pub hotdropped: bool,
    /// How many `-m limit` matches the packet's path asked. A trace is a dry run for them:
    /// each answers whether a token is there now without taking it, so a burst of real
    /// packets can be limited where a trace of each of them matched.
    pub limits_asked: u32,
}

struct Tracing<'a> {
    names: &'a [Arc<str>],
    steps: Vec<TraceStep>,
    logs: Vec<LogEvent>,
    limits_asked: u32,
    hotdropped: bool,
}

impl Observer for Tracing<'_> {
    fn rule(&mut self, _: usize, chain: &CChain, number: u32, _: &PacketMeta) {
        self.steps.push(TraceStep {
            ruleset: self.names[chain.ruleset as usize].clone(),
            family: chain.family,
            table: chain.table,
            chain: chain.name.clone(),
            rule: Some(number),
            outcome: StepOutcome::Continue,
        });
    }
    fn policy(&mut self, _: usize, chain: &CChain, _: &PacketMeta) {
        self.steps.push(TraceStep {
            ruleset: self.names[chain.ruleset as usize].clone(),
            family: chain.family,
            table: chain.table,
            chain: chain.name.clone(),
            rule: None,
            outcome: StepOutcome::Policy(chain.policy.unwrap_or(Policy::Accept)),
        });
    }
    fn limit(&mut self, bucket: &TokenBucket, now: u64) -> bool {
        // A trace must not consume tokens that real traffic would get.
        self.limits_asked += 1;
        bucket.would_conform(now)
    }
    fn log(
        &mut self,
        chain: &CChain,
        number: u32,
        prefix: &Option<Arc<str>>,
        level: u8,
        pkt: &PacketMeta,
    ) {
        self.logs
            .push(log_event(self.names, chain, number, prefix, level, pkt));
    }
    fn outcome(&mut self, what: StepOutcome) {
        if let Some(last) = self.steps.last_mut() {
            if last.rule.is_some() {
                last.outcome = what;
            }
        }
    }
    fn hotdrop(&mut self) {
        self.hotdropped = true;
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
    fn header_matches(r: &CRule, p: &PacketMeta) -> bool {
        if r.src.matches(addr_bits(p.src)) == r.src_negated
            || r.dst.matches(addr_bits(p.dst)) == r.dst_negated
        {
            return false;
        }
        if let Some((neg, pat)) = &r.in_iface {
            if pat.matches(&p.in_iface) == *neg {
                return false;
            }
        }
        if let Some((neg, pat)) = &r.out_iface {
            if pat.matches(&p.out_iface) == *neg {
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
    fn rule_matches<O: Observer>(r: &CRule, p: &PacketMeta, now: u64, obs: &mut O) -> bool {
        Self::header_matches(r, p) && r.matches.iter().all(|m| Self::match_one(m, p, now, obs))
    }

    #[inline]
    fn match_one<O: Observer>(m: &CMatch, p: &PacketMeta, now: u64, obs: &mut O) -> bool {
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
                    && option.is_none_or(|(neg, kind)| p.has_tcp_option(kind) != neg)
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
            CMatch::CtState { negated, bits } => {
                // As conntrack_mt: SNAT / DNAT join the state of a packet with an entry; an
                // INVALID (no entry) or UNTRACKED packet has no status bits to read.
                let nat = if p.ct_state & (ct_state::INVALID | ct_state::UNTRACKED) == 0 {
                    p.ct_nat
                } else {
                    0
                };
                ((p.ct_state | nat) & bits != 0) != *negated
            }
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
            CMatch::Length { negated, range } => {
                (u64::from(range.lo) <= u64::from(p.len) && u64::from(p.len) <= u64::from(range.hi))
                    != *negated
            }
            CMatch::Limit(bucket) => obs.limit(bucket, now),
            // As mac_mt: no link-layer source, no match (even when negated).
            CMatch::Mac { negated, mac } => p.src_mac.is_some_and(|m| (m == *mac) != *negated),
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
            CMatch::Ah { negated, spi } => !p.fragment && spi.contains(p.ah_spi) != *negated,
            CMatch::Frag(f) => p.ipv6_ext.fragment.is_some_and(|h| frag_matches(f, &h)),
            CMatch::Rt(r) => p.ipv6_ext.routing.is_some_and(|h| {
                r.segsleft.value.contains(u32::from(h.segments_left)) != r.segsleft.negated
                    && r.len
                        .is_none_or(|l| (l.value == u32::from(h.len)) != l.negated)
                    && r.rt_type
                        .is_none_or(|t| (t.value == h.rt_type) != t.negated)
            }),
            CMatch::AddrType(a) => addrtype_matches(a, p),
            CMatch::Ipv6Header(h) => {
                let have = p.ipv6_ext.mask;
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
                        Self::rule_matches(r, p, now, &mut watch) || watch.dropped
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
                        self.indexed_rest(idx, rules, 0, hint.best, p, now, obs)
                    }
                }
                Some(idx) => self.indexed_next(idx, rules, next, p, now, obs),
                None => rules.find_from(next, |r| Self::rule_matches(r, p, now, obs)),
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
                CTarget::Log(log) => obs.log(c, next, &log.0, log.1, p),
                CTarget::Notrack => p.ct_state = ct_state::UNTRACKED,
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
    fn evaluate<O: Observer>(
        &self,
        p: &mut PacketMeta,
        now: u64,
        obs: &mut O,
        hint: Hint,
        after_raw: impl FnOnce(&mut PacketMeta) -> Option<Verdict>,
    ) -> Verdict {
        let f = family_index(p.family);
        let hook = p.hook;
        let mut after_raw = Some(after_raw);
        if matches!(hook, Hook::Input | Hook::Forward)
            && !self.hooks[f][Hook::Prerouting.index()].is_empty()
        {
            let out_iface = std::mem::take(&mut p.out_iface);
            p.hook = Hook::Prerouting;
            let v = self.run_hook(f, Hook::Prerouting, p, now, obs, hint, &mut after_raw);
            p.hook = hook;
            p.out_iface = out_iface;
            if let Some(v) = v {
                return v;
            }
        }
        self.run_hook(f, hook, p, now, obs, hint, &mut after_raw)
            .unwrap_or(Verdict::Accept)
    }

    /// One hook's base chains: raw, then `after_raw` (taken: it runs once per packet), then
    /// the rest. `Some` is a final verdict; `None` means the packet passed the hook.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn run_hook<O: Observer>(
        &self,
        f: usize,
        hook: Hook,
        p: &mut PacketMeta,
        now: u64,
        obs: &mut O,
        hint: Hint,
        after_raw: &mut Option<impl FnOnce(&mut PacketMeta) -> Option<Verdict>>,
    ) -> Option<Verdict> {
        let h = hook.index();
        let chains = &self.hooks[f][h];
        let (raw, rest) = chains.split_at((self.raw_chains[f][h] as usize).min(chains.len()));
        for &base in raw {
            if let Some(v) = self.run_chain(base, p, now, obs, hint) {
                return Some(v);
            }
        }
        if let Some(v) = after_raw.take().and_then(|a| a(p)) {
            return Some(v);
        }
        for &base in rest {
            if let Some(v) = self.run_chain(base, p, now, obs, hint) {
                return Some(v);
            }
        }
        None
    }

    /// Classifies one packet on `core` at time `now` (ns, caller's monotonic clock, used by
    /// `-m limit`), counting every matched rule and applied policy in that core's counters and
    /// appending LOG events to `logs`. `packet.ct_state` becomes UNTRACKED when a raw-table
    /// NOTRACK rule matched. Never allocates unless a LOG rule matched.
    ///
    /// `core` must be below [`Snapshot::cores`]; a larger index is folded onto the last core.
    #[inline]
    pub fn classify(
        &self,
        core: usize,
        packet: &mut PacketMeta,
        now: u64,
        logs: &mut Vec<LogEvent>,
    ) -> Verdict {
        self.classify_split(core, packet, now, logs, |_| None)
    }

    /// As [`Snapshot::classify`], calling `after_raw` between the hook's raw-table chains
    /// (priority -300) and the others, where netfilter runs conntrack (-200): it may set
    /// `packet.ct_state` (the other chains' `--ctstate` sees it) or return a final verdict
    /// (e.g. DROP when the conntrack table is full). A DROP or REJECT of a raw chain ends the
    /// packet before `after_raw` runs.
    #[inline]
    pub fn classify_split(
        &self,
        core: usize,
        packet: &mut PacketMeta,
        now: u64,
        logs: &mut Vec<LogEvent>,
        after_raw: impl FnOnce(&mut PacketMeta) -> Option<Verdict>,
    ) -> Verdict {
        let counters = self.cells.core(core);
        let mut obs = Counting {
            counters,
            names: &self.names,
            logs,
        };
        self.evaluate(packet, now, &mut obs, Hint::NONE, after_raw)
    }

    /// Evaluates one packet without counting or consuming `-m limit` tokens (a dry run for
    /// them: [`Trace::limits_asked`] says how many were asked), and returns the
    /// verdict with the path taken: every matched rule (ruleset, table, chain, 1-based number)
    /// and every applied policy, in order.
    pub fn trace(&self, packet: &PacketMeta, now: u64) -> Trace {
        self.trace_split(packet, now, |_| None)
    }

    /// As [`Snapshot::trace`], with `after_raw` run between the raw and the other chains as
    /// in [`Snapshot::classify_split`]; [`Trace::ct_state`] is the state the packet had after
    /// it.
    pub fn trace_split(
        &self,
        packet: &PacketMeta,
        now: u64,
        after_raw: impl FnOnce(&mut PacketMeta) -> Option<Verdict>,
    ) -> Trace {
        let mut p = *packet;
        let mut obs = Tracing {
            names: &self.names,
            steps: Vec::new(),
            logs: Vec::new(),
            limits_asked: 0,
            hotdropped: false,
        };
        let verdict = self.evaluate(&mut p, now, &mut obs, Hint::NONE, after_raw);
        Trace {
            verdict,
            steps: obs.steps,
            logs: obs.logs,
            ct_state: p.ct_state,
            limits_asked: obs.limits_asked,
            hotdropped: obs.hotdropped,
        }
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
    /// Classifies `packets` on `core` at `now` as [`Snapshot::classify`] classifies each of
    /// them in order, and writes each verdict into `verdicts` (same index); processes
    /// `min(packets.len(), verdicts.len())` packets and returns that number. Counters, LOG
    /// events, `-m limit` tokens and `ct_state` come out exactly as from the per-packet calls.
    ///
    /// Faster on large chains: before the packets are evaluated one by one, the hash tables
    /// of each packet's first indexed base chain are probed for [`CLASSIFY_BATCH`] packets at
    /// a time with their memory accesses interleaved (`compile/tuple_merge.rs`,
    /// `ChainIndex::probe_batch`, after Open vSwitch's `dpcls_lookup`); the evaluation then
    /// starts that chain from the probe's answer. Later queries (after a jump, a LOG rule, or
    /// in other chains) use the per-packet lookup.
    pub fn classify_batch(
        &self,
        core: usize,
        packets: &mut [PacketMeta],
        verdicts: &mut [Verdict],
        now: u64,
        logs: &mut Vec<LogEvent>,
    ) -> usize {
        self.classify_batch_split(core, packets, verdicts, now, logs, |_| None, |_, v| v)
    }

    /// As [`Snapshot::classify_batch`], with [`Snapshot::classify_split`]'s `after_raw` called
    /// for each packet between its raw-table chains and the others, and `decided` called with
    /// each packet and its verdict right after its evaluation, before the next packet is
    /// evaluated; what `decided` returns is written to `verdicts`. (The engine tracks
    /// connections in `after_raw` and confirms a new one in `decided` when it was accepted,
    /// so a packet sees the connection state every earlier packet of the batch left.)
    #[allow(clippy::too_many_arguments)]
    pub fn classify_batch_split(
        &self,
        core: usize,
        packets: &mut [PacketMeta],
        verdicts: &mut [Verdict],
        now: u64,
        logs: &mut Vec<LogEvent>,
        mut after_raw: impl FnMut(&mut PacketMeta) -> Option<Verdict>,
        mut decided: impl FnMut(&mut PacketMeta, Verdict) -> Verdict,
    ) -> usize {
        let n = packets.len().min(verdicts.len());
        let counters: &CoreCounters = self.cells.core(core);
        let mut obs = Counting {
            counters,
            names: &self.names,
            logs,
        };
        let mut chains = [u32::MAX; PROBE_BATCH];
        let mut best = [PROBE_UNKNOWN; PROBE_BATCH];
        let mut lo = 0;
        while lo < n {
            let hi = (lo + PROBE_BATCH).min(n);
            self.probe(&packets[lo..hi], now, &mut chains, &mut best);
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
                let v = self.evaluate(p, now, &mut obs, hint, &mut after_raw);
                verdicts[i] = decided(p, v);
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
                idx.probe_batch(&body.rules, packets, &which[..m], now, best);
            }
        }
    }
}

// === impl Snapshot: counters ===

/// Calls `f(new_pos, old_pos)` for every rule of `new` whose (content hash, ordinal among
/// equal hashes) also occurs in `old`: the counter identity of a rule within its chain, so
/// that duplicates keep a stable order.
fn match_by_content(old: &[u64], new: &[u64], mut f: impl FnMut(usize, usize)) {
    let mut seen: HashMap<u64, u32> = HashMap::default();
    let mut by_id: HashMap<(u64, u32), usize> = HashMap::default();
    by_id.reserve(old.len());
    for (i, &h) in old.iter().enumerate() {
        let ord = seen.entry(h).or_insert(0);
        by_id.insert((h, *ord), i);
        *ord += 1;
    }
    seen.clear();
    for (i, &h) in new.iter().enumerate() {
        let ord = seen.entry(h).or_insert(0);
        if let Some(&o) = by_id.get(&(h, *ord)) {
            f(i, o);
        }
        *ord += 1;
    }
}

impl Snapshot {
    fn slot_total(&self, slot: usize) -> (u64, u64) {
        self.cells.total(slot)
    }

    /// Every rule's and every base chain's policy counters: base plus the sum over cores.
    /// Rules come in (ruleset, table, chain, number) evaluation order, policies after them.
    pub fn counters(&self) -> Vec<SlotCounters> {
        let row = |c: &CChain, slot: usize, rule: Option<u32>| {
            let (packets, bytes) = self.slot_total(slot);
            SlotCounters {
                ruleset: self.names[c.ruleset as usize].clone(),
                family: c.family,
                table: c.table,
                chain: c.name.clone(),
                rule,
                packets,
                bytes,
            }
        };
        let mut out = Vec::with_capacity(self.n_rules + self.chains.len());
        for c in self.chains.iter() {
            for (i, &slot) in c.body.slots.iter().enumerate() {
                out.push(row(c, slot as usize, Some(i as u32 + 1)));
            }
        }
        for c in self.chains.iter() {
            if c.policy.is_some() {
                out.push(row(c, c.policy_slot as usize, None));
            }
        }
        out
    }

    /// Sets every counter (of `ruleset`, or all when `None`) to zero, as `iptables -Z`, without
    /// touching the cores' blocks: the current totals are subtracted from the slots' base.
    pub fn zero_counters(&self, ruleset: Option<&str>) {
        let zero = |slot: u32| {
            let (p, b) = self.slot_total(slot as usize);
            self.cells
                .add_base(slot as usize, (p.wrapping_neg(), b.wrapping_neg()));
        };
        for c in self.chains.iter() {
            if ruleset.is_some_and(|r| &*self.names[c.ruleset as usize] != r) {
                continue;
            }
            c.body.slots.iter().for_each(|&s| zero(s));
            zero(c.policy_slot);
        }
    }

    /// Sets the counters of the rulesets named to what their model says, as
    /// `iptables-restore --counters` loads them: every rule with [`crate::model::Rule::counters`]
    /// and every policy with non-zero [`crate::model::Chain::counters`] (a policy's `[0:0]`
    /// keeps what was carried: a `--noflush` merge declares untouched builtin chains so).
    /// Other counters keep what [`Snapshot::carry_from`] gave them. Packets counted meanwhile
    /// are kept on top (the base is moved by the difference).
    pub fn start_counters(&self, rulesets: &[String]) {
        if rulesets.is_empty() {
            return;
        }
        let set = |slot: u32, c: &crate::model::Counters| {
            let (p, b) = self.slot_total(slot as usize);
            self.cells.add_base(
                slot as usize,
                (c.packets.wrapping_sub(p), c.bytes.wrapping_sub(b)),
            );
        };
        for c in self.chains.iter() {
            if !rulesets
                .iter()
                .any(|r| **r == *self.names[c.ruleset as usize])
            {
                continue;
            }
            let model = &self.rulesets[c.ruleset as usize].tables[c.table_at as usize].chains
                [c.chain_at as usize];
            for (rule, &slot) in model.rules.iter().zip(c.body.slots.iter()) {
                if let Some(counters) = &rule.counters {
                    set(slot, counters);
                }
            }
            if c.policy.is_some() && model.counters != crate::model::Counters::default() {
                set(c.policy_slot, &model.counters);
            }
        }
    }

    /// Adds `old`'s counters of `old_slot` into `slot`, unless both are the same cell (a slot
    /// this snapshot took over from `old`, which keeps counting there).
    fn carry_slot(&self, old: &Snapshot, old_slot: u32, slot: u32) {
        if old_slot == slot && Arc::ptr_eq(&self.cells, &old.cells) {
            return;
        }
        let (p, b) = old.slot_total(old_slot as usize);
        if p != 0 || b != 0 {
            self.cells.add_base(slot as usize, (p, b));
        }
    }

    /// Copies the state of `old`'s `-m limit` token buckets into the rules of this snapshot
    /// with the same identity (as [`Snapshot::carry_from`] matches them).
    fn take_limits_from(&self, old: &Snapshot) {
        let is_limit = |m: &CMatch| matches!(m, CMatch::Limit(_));
        for (c, o) in self.named_in(old) {
            if !c.body.rules.iter().any(|r| r.matches.iter().any(is_limit)) {
                continue;
            }
            match_by_content(&old.content_hashes(o), &self.content_hashes(c), |n, q| {
                // Equal content: the same matches in the same order.
                let pairs = c.body.rules[n]
                    .matches
                    .iter()
                    .zip(o.body.rules[q].matches.iter());
                for (new, old) in pairs {
                    if let (CMatch::Limit(new), CMatch::Limit(old)) = (new, old) {
                        new.tat
                            .store(old.tat.load(Ordering::Relaxed), Ordering::Relaxed);
                    }
                }
            });
        }
    }

    /// Each chain of this snapshot with the chain of `old` of the same name (ruleset, family,
    /// table, chain), where there is one.
    fn named_in<'a>(
        &'a self,
        old: &'a Snapshot,
    ) -> impl Iterator<Item = (&'a CChain, &'a CChain)> + 'a {
        let old_chains = old.chain_map();
        self.chains.iter().filter_map(move |c| {
            let key = (
                &*self.names[c.ruleset as usize],
                c.family,
                c.table,
                &*c.name,
            );
            Some((c, &old.chains[*old_chains.get(&key)? as usize]))
        })
    }

    /// [`content_hash`] of each rule of chain `c`: the rules' identity within the chain.
    fn content_hashes(&self, c: &CChain) -> Vec<u64> {
        self.model_rules(c).iter().map(content_hash).collect()
    }

    /// Gives the counter slots this snapshot's build took back to its cells, if none were
    /// handed out after them. Only for a snapshot that was never published (no core counted
    /// in it): [`crate::engine::Engine`] calls it when a prepared commit is dropped.
    pub(crate) fn release_slots(&self) -> bool {
        self.cells.release(self.slots_taken)
    }

    /// Takes over the counters of `old` for every rule and policy whose identity is unchanged:
    /// same ruleset, family, table and chain, and for a rule the same content (canonical form)
    /// and ordinal among equal rules of the chain. Call it only once no core can still write
    /// `old` (after the commit's quiesce), so `old`'s totals are final. Returns how many slots
    /// (rules and chain policies) continue from `old`.
    ///
    /// When this snapshot was built from `old` by [`Snapshot::compile_after`] into `old`'s
    /// counter cells (the common case; `compile/counters.rs`), its rules already count in the
    /// slots of the rules they continue, chosen at build time (by position in a changed
    /// chain's unchanged prefix and suffix, and by content in the changed run between them),
    /// so there is nothing to copy. Otherwise the counts are added by identity.
    pub fn carry_from(&self, old: &Snapshot) -> usize {
        if self.origin.as_ref().is_some_and(|o| o.prev == old.id) {
            // Into fresh cells: along the map the build made (empty for shared cells).
            for &(from, to) in self.moved.iter() {
                let (p, b) = old.slot_total(from as usize);
                if p != 0 || b != 0 {
                    self.cells.add_base(to as usize, (p, b));
                }
            }
            return self.continued;
        }
        let mut carried = 0;
        for (c, o) in self.named_in(old) {
            self.carry_slot(old, o.policy_slot, c.policy_slot);
            carried += 1;
            match_by_content(&old.content_hashes(o), &self.content_hashes(c), |n, q| {
                self.carry_slot(old, o.body.slots[q], c.body.slots[n]);
                carried += 1;
            });
        }
        carried
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
