//! The rule model: ruleset -> tables -> chains -> rules (matches + target).
//!
//! These are plain data types, the common language of the parser ([`crate::restore`]), the
//! validator ([`crate::validate`]) and the compiler ([`crate::snapshot`]). They mirror what
//! `iptables-save` prints: a [`Rule`] holds the "IP header" part of an iptables rule (`-s`, `-d`,
//! `-i`, `-o`, `-p`, `-f`) as fields, then the `-m` matches in the order they were given, then the
//! target. Nothing here knows about protobuf, SQLite or the clock.
//!
//! Tables `filter` and `raw` are enforced by the engine, and so are [`TableKind::Nft`] tables,
//! the chains of nftables tables lowered by [`crate::nft::lower()`] (their base chains carry
//! their own hook and priority, [`ChainHook`]). `nat`, `mangle` and `security` are
//! parsed, stored and printed back, and [`crate::validate`] reports them as "not enforced":
//! they are never dropped silently. Matches and targets of extensions the engine does not
//! implement are kept as [`Match::Opaque`] / [`Target::Opaque`] so that a real ruleset survives
//! a round trip; validation rejects them in enforced tables, naming the extension.
//!
//! The types are split by what they hold: this file the structure (ruleset, table, chain,
//! [`Rule`], hooks); `addresses` the values of a rule's own fields ([`IpNet`], [`Iface`],
//! [`PortRange`], [`AddrRange`]); `matches` the `-m` matches ([`Match`] and its values);
//! `match_list` a rule's list of them ([`MatchList`]); `targets` the `-j` targets
//! ([`Target`]); `stateful` the matches that keep state (recent, hashlimit); `connlimit` and
//! `string` those two matches' values; `sctp` the SCTP match; `u32_match` the u32 match; `physdev` the bridge-port match; `ct_zone` conntrack
//! zones; `rules` a
//! chain's list of rules ([`RuleList`]); `edit` the edits of a stored ruleset. Plain data on
//! both paths: built on the commit path, read by the compiler; nothing here allocates on the
//! packet path, locks or reads a clock.

use std::fmt;

mod addresses;
mod connlimit;
mod ct_zone;
mod edit;
mod match_list;
mod matches;
mod physdev;
mod rpfilter;
mod rules;
mod sctp;
mod stateful;
mod string;
mod targets;
mod u32_match;

// Globs: every public item of these files is a `crate::model::` item, as it was when they
// were one file.
pub use addresses::*;
pub use connlimit::ConnlimitMatch;
pub use ct_zone::{CtZone, CtZoneSpec};
pub use edit::{EditError, EditOp, RuleEdit};
pub use match_list::*;
pub use matches::*;
pub use physdev::PhysdevMatch;
pub use rpfilter::{PktType, RpfilterMatch};
pub use rules::{Iter as RuleIter, IterMut as RuleIterMut, RuleList};
pub use sctp::{SCTP_CHUNK_NAMES, SCTP_MAX_FLAGS, SctpChunkMode, SctpChunks, SctpFlag, SctpMatch};
pub use stateful::{
    HASHLIMIT_BURST_MAX, HASHLIMIT_NAME_MAX, HASHLIMIT_SCALE, HashlimitMatch, RECENT_LIST_TOT,
    RECENT_MAX_STAMPS, RECENT_NAME_MAX, RecentMatch, RecentOp, full_mask, hashlimit_mode,
    hashlimit_overflows, recent_stamps,
};
pub use string::{STRING_MAX_PATTERN, StringAlgo, StringMatch};
pub use targets::*;
pub use u32_match::{U32_MAX_ITEMS, U32Match, U32Op, U32Test};
/// Address family of a table: `iptables` (IPv4) or `ip6tables` (IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (`iptables`, `-4`).
    Ipv4,
    /// IPv6 (`ip6tables`, `-6`).
    Ipv6,
}

/// The kind of an x_tables table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableKind {
    /// `raw`: PREROUTING and OUTPUT, before conntrack; enforced (NOTRACK / CT --notrack).
    Raw,
    /// `mangle`: parsed and printed, not enforced.
    Mangle,
    /// `nat`: parsed and printed, not enforced.
    Nat,
    /// `filter`: INPUT, FORWARD, OUTPUT; enforced.
    Filter,
    /// `security`: parsed and printed, not enforced.
    Security,
    /// The chains of nftables tables of one family, lowered by [`crate::nft::lower()`]:
    /// enforced. Unlike the x_tables kinds its base chains are not found by name: each carries
    /// its own hook and priority ([`Chain::nft_hook`]). Not in [`TableKind::ALL`] (no
    /// iptables-restore text names it).
    Nft,
}

impl TableKind {
    /// All kinds, in the order the kernel runs them at a hook (raw first, as
    /// NF_IP_PRI_RAW < NF_IP_PRI_MANGLE < NF_IP_PRI_NAT_DST < NF_IP_PRI_FILTER < NF_IP_PRI_SECURITY).
    pub const ALL: [TableKind; 5] = [
        TableKind::Raw,
        TableKind::Mangle,
        TableKind::Nat,
        TableKind::Filter,
        TableKind::Security,
    ];

    /// The name used after `*` in iptables-restore text.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Raw => "raw",
            TableKind::Mangle => "mangle",
            TableKind::Nat => "nat",
            TableKind::Filter => "filter",
            TableKind::Security => "security",
            TableKind::Nft => "nft",
        }
    }

    /// Parses a table name (`filter`, `raw`, ...); `None` for anything else.
    pub fn from_name(s: &str) -> Option<TableKind> {
        TableKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether the engine evaluates this table on the packet path (filter, raw and nft).
    pub fn is_enforced(self) -> bool {
        matches!(self, TableKind::Filter | TableKind::Raw | TableKind::Nft)
    }

    /// The netfilter priority this table's base chains hook in with, as the kernel registers
    /// the x_tables tables (`NF_IP_PRI_RAW` -300, `NF_IP_PRI_MANGLE` -150,
    /// `NF_IP_PRI_NAT_DST` -100, `NF_IP_PRI_FILTER` 0, `NF_IP_PRI_SECURITY` 50; the nat
    /// table's POSTROUTING and INPUT chains hook in at `NF_IP_PRI_NAT_SRC` 100, which no
    /// enforced table needs). An [`TableKind::Nft`] chain carries its own
    /// ([`Chain::nft_hook`]); 0 here.
    pub fn priority(self) -> i32 {
        match self {
            TableKind::Raw => -300,
            TableKind::Mangle => -150,
            TableKind::Nat => -100,
            TableKind::Filter | TableKind::Nft => 0,
            TableKind::Security => 50,
        }
    }

    /// The builtin chains (hooks) of this table, in iptables-save order.
    pub fn builtin_hooks(self) -> &'static [Hook] {
        use Hook::*;
        match self {
            TableKind::Raw => &[Prerouting, Output],
            TableKind::Mangle => &[Prerouting, Input, Forward, Output, Postrouting],
            TableKind::Nat => &[Prerouting, Input, Output, Postrouting],
            TableKind::Filter => &[Input, Forward, Output],
            TableKind::Security => &[Input, Forward, Output],
            // Any hook: a base chain names its own (`Chain::nft_hook`).
            TableKind::Nft => &[Prerouting, Input, Forward, Output, Postrouting],
        }
    }
}

impl fmt::Display for TableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A netfilter hook: where in the stack a builtin chain is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// Before routing, every packet that arrives.
    Prerouting,
    /// Packets for a local address.
    Input,
    /// Routed packets.
    Forward,
    /// Locally generated packets.
    Output,
    /// Every packet that leaves.
    Postrouting,
}

impl Hook {
    /// All hooks, in packet-path order.
    pub const ALL: [Hook; 5] = [
        Hook::Prerouting,
        Hook::Input,
        Hook::Forward,
        Hook::Output,
        Hook::Postrouting,
    ];

    /// The builtin chain name (`INPUT`, ...).
    pub fn chain_name(self) -> &'static str {
        match self {
            Hook::Prerouting => "PREROUTING",
            Hook::Input => "INPUT",
            Hook::Forward => "FORWARD",
            Hook::Output => "OUTPUT",
            Hook::Postrouting => "POSTROUTING",
        }
    }

    /// Parses a builtin chain name; `None` for user chains.
    pub fn from_chain_name(s: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.chain_name() == s)
    }

    /// Index 0..5, for per-hook arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.chain_name())
    }
}

/// Where something came from in iptables-restore text: 1-based line and column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// 1-based line number (0 when the item did not come from text).
    pub line: u32,
    /// 1-based column of the first byte of the token (0 when unknown).
    pub column: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Packet and byte counters, as `[packets:bytes]` in iptables-save text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    /// Packets.
    pub packets: u64,
    /// Bytes (layer 3 length, as xt_counters).
    pub bytes: u64,
}

/// A ruleset: one owner's tables. Several rulesets can be active at once; at each hook they run
/// in ascending `priority` order with nftables semantics (see [`crate::snapshot`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ruleset {
    /// Owner-chosen name, unique among active rulesets.
    pub name: String,
    /// Lower runs first (as nftables base-chain priority).
    pub priority: i32,
    /// Tables, at most one per (family, kind).
    pub tables: Vec<Table>,
}

impl Ruleset {
    /// The table of this family and kind, if present.
    pub fn table(&self, family: Family, kind: TableKind) -> Option<&Table> {
        self.tables
            .iter()
            .find(|t| t.family == family && t.kind == kind)
    }

    /// Number of rules over all tables and chains.
    pub fn rule_count(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|t| &t.chains)
            .map(|c| c.rules.len())
            .sum()
    }
}

/// One table (`*filter` ... `COMMIT`) of one family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Table {
    /// IPv4 or IPv6.
    pub family: Family,
    /// filter, raw, nat, mangle or security.
    pub kind: TableKind,
    /// Builtin chains first in hook order, then user chains, as iptables-save prints them.
    pub chains: Vec<Chain>,
    /// Where `*table` was written.
    pub location: Location,
}

impl Table {
    /// The chain with this name, if present.
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }
}

/// Conntrack's netfilter priority (`NF_IP_PRI_CONNTRACK`): base chains of a lower priority
/// run before the packet's conntrack lookup (the raw step of the walk), the others after it.
pub const CONNTRACK_PRIORITY: i32 = -200;

/// Where an nft base chain hooks in: the hook and the priority nft's `type ... hook HOOK
/// priority PRIO` gave it (lower runs first; ties keep ruleset, then table, then chain order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChainHook {
    /// The hook.
    pub hook: Hook,
    /// The priority, as a number (nft's symbolic names resolved: raw -300 ... srcnat 100).
    pub priority: i32,
}

/// A builtin chain's policy: the verdict when the packet reaches the end of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// `ACCEPT`.
    Accept,
    /// `DROP`.
    Drop,
}

/// A chain: builtin (has a hook and a policy) or user-defined (`-` in `:NAME - [0:0]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Chain {
    /// Chain name, at most 28 bytes (XT_EXTENSION_MAXNAMELEN - 1 minus the kernel's own needs,
    /// as iptables: "chain name too long").
    pub name: String,
    /// `Some` for builtin chains only (as iptables-restore: "policy only on builtin chains").
    pub policy: Option<Policy>,
    /// The policy counters `[p:b]` of a builtin chain (zero for user chains).
    pub counters: Counters,
    /// Rules in evaluation order, in chunks shared between clones ([`RuleList`]).
    pub rules: RuleList,
    /// Where the chain was declared (`:NAME` or `-N NAME`; an nft chain's `chain NAME`).
    pub location: Location,
    /// `Some` for a base chain of a [`TableKind::Nft`] table: its hook and priority. `None`
    /// for x_tables chains, whose builtins take the hook from their name and the priority
    /// from their table ([`TableKind::priority`]).
    pub nft_hook: Option<ChainHook>,
}

impl Chain {
    /// The hook this chain is attached to, if it is builtin (an nft base chain: its own).
    pub fn hook(&self) -> Option<Hook> {
        if let Some(h) = self.nft_hook {
            return Some(h.hook);
        }
        if self.policy.is_some() {
            Hook::from_chain_name(&self.name)
        } else {
            None
        }
    }

    /// The netfilter priority of this chain in a table of `kind`, if it is a base chain: its
    /// own for an nft base chain, the table's for an x_tables builtin.
    pub fn priority(&self, kind: TableKind) -> Option<i32> {
        match self.nft_hook {
            Some(h) => Some(h.priority),
            None => self.hook().map(|_| kind.priority()),
        }
    }
}

/// A value with an optional `!` in front, as iptables writes `! -s 10.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Neg<T> {
    /// `true` when written with `!`: the match succeeds when the test fails.
    pub negated: bool,
    /// The tested value.
    pub value: T,
}

impl<T> Neg<T> {
    /// A plain (non-negated) value.
    pub fn plain(value: T) -> Self {
        Neg {
            negated: false,
            value,
        }
    }
}

/// One rule: the header fields, the matches in order and the target.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    /// `-s`.
    pub src: Option<Neg<IpNet>>,
    /// `-d`.
    pub dst: Option<Neg<IpNet>>,
    /// `-i`.
    pub in_iface: Option<Neg<Iface>>,
    /// `-o`.
    pub out_iface: Option<Neg<Iface>>,
    /// `-p`: protocol number (0 is never stored: `-p all` is `None`).
    pub protocol: Option<Neg<u8>>,
    /// `-f` / `! -f` (IPv4 only): `Some(true)` matches second and later fragments only.
    pub fragment: Option<bool>,
    /// `-m` matches, in written order.
    pub matches: MatchList,
    /// `-j` / `-g`.
    pub target: Target,
    /// `[p:b]` or `-c p b` counters given in the text, if any.
    pub counters: Option<Counters>,
    /// Where the rule's first token was written.
    pub location: Location,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            src: None,
            dst: None,
            in_iface: None,
            out_iface: None,
            protocol: None,
            fragment: None,
            matches: MatchList::new(),
            target: Target::None,
            counters: None,
            location: Location::default(),
        }
    }
}

impl Rule {
    /// Whether two rules have the same content: every field but where they were written
    /// (`location`) and the counters given in the text (an inserted line moves every later
    /// rule's location, which must not make them "changed"). Two rules with the same content
    /// validate and compile alike in the same chain.
    pub fn same_content(&self, other: &Rule) -> bool {
        // Cheap inline fields first; `matches` (behind a pointer) last.
        self.src == other.src
            && self.dst == other.dst
            && self.protocol == other.protocol
            && self.fragment == other.fragment
            && self.in_iface == other.in_iface
            && self.out_iface == other.out_iface
            && self.target == other.target
            && self.matches == other.matches
    }
}

/// The longest common prefix and, of what follows it, the longest common suffix of `old` and
/// `new` (by [`Rule::same_content`]): `(prefix, old_mid, new_mid)` with `old_mid`/`new_mid`
/// the lengths of what differs. A chunk both lists share at the same place ([`RuleList`]) is
/// taken as equal without reading it, so a list edited from a clone of another is diffed in
/// time proportional to its chunks plus the changed rules. `unchanged(i, rule)` is called for
/// rules of `new` found equal to their counterparts (prefix in order, then suffix from the
/// end), while they are in cache: every one compared rule by rule and, of a shared chunk, at
/// least those that jump, go to a chain or match a set (what validation must see again).
pub(crate) fn diff_rules(
    old: &RuleList,
    new: &RuleList,
    unchanged: impl FnMut(usize, &Rule),
) -> (u32, u32, u32) {
    rules::diff(old, new, unchanged)
}
