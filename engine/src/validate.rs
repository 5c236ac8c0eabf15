//! Validation of a ruleset before it may be compiled and committed, in the spirit of the
//! kernel's `translate_table` / `mark_source_chains` (net/ipv4/netfilter/ip_tables.c).
//!
//! [`validate`] returns every violation it finds, not just the first, each located by
//! ruleset, table, chain, rule number and the [`Location`] in the source text. Errors block a
//! commit; warnings (a table that is stored but not enforced) do not. The checks hold for
//! rulesets that came from text *and* for rulesets built from structured input, so limits
//! that the parser also enforces are checked again here.
//!
//! Checks:
//! - structure: at most one table per (family, kind); chain names unique, non-empty, at most
//!   28 bytes (as iptables: "chain name too long"); builtin chains belong to the table's
//!   hooks; policy only on builtin chains (as iptables-restore);
//! - targets: `-j`/`-g` targets exist in the same table and are user chains (x_tables cannot
//!   jump to a builtin chain); no loops (as mark_source_chains: "iptables: Too many levels of
//!   links"); call depth at most [`MAX_CALL_DEPTH`];
//! - hooks and tables: REJECT only in filter, reachable only from INPUT, FORWARD and OUTPUT
//!   (as ipt_REJECT's `.table`/`.hooks`); NOTRACK and CT only in raw; `-m mac` only reachable
//!   from PREROUTING, INPUT and FORWARD (as xt_mac);
//! - matches: protocol matches need the matching `-p` without `!` (as tcp_mt_check); family
//!   consistency (icmp in IPv4 tables, icmp6 in IPv6, `-f` IPv4 only); limits on names
//!   (interface 15 bytes, set 31, comment 255); multiport at most 15 slots, a range taking 2;
//!   ranges ordered; limit rate and burst positive;
//! - sets: every `--match-set` names a set that exists, when a registry is given, with enough
//!   `src`/`dst` flags for its dimensions;
//! - reach: with the node's [`ReachedHooks`] (from [`SetRegistry::reached_hooks`]), a chain of
//!   an enforced table reached only from hooks the node's packet path never evaluates (raw
//!   OUTPUT while only INPUT is steered, FORWARD with forwarding off) gets a warning at its
//!   first rule naming its rules and why ([`ViolationKind::HookNotReached`]);
//! - enforcement: extensions the engine does not run ([`crate::model::Match::Opaque`], CT
//!   options other than `--notrack`, conntrack options other than `--ctstate`) are errors in
//!   filter and raw, naming the extension; nat, mangle and security tables get a warning.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use crate::compile::MAX_CALL_DEPTH;
use crate::model::{
    AddrTypeLimit, Chain, Family, Hook, IpNet, Location, Match, RejectWith, Rule, Ruleset, Table,
    TableKind, Target, addr_type, diff_rules,
};
use crate::sets::SetRegistry;

/// How serious a [`Violation`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// The ruleset is accepted; the caller should show the message.
    Warning,
    /// The ruleset cannot be committed.
    Error,
}

/// Where a violation is: ruleset, table, chain and rule, plus the source location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Error or warning.
    pub severity: Severity,
    /// Ruleset name.
    pub ruleset: String,
    /// Table family, when the violation is inside a table.
    pub family: Option<Family>,
    /// Table kind, when inside a table.
    pub table: Option<TableKind>,
    /// Chain name, when inside a chain.
    pub chain: Option<String>,
    /// 1-based rule number, when about a rule.
    pub rule: Option<u32>,
    /// LINE:COLUMN in the source text (0:0 for structured input).
    pub location: Location,
    /// What is wrong.
    pub kind: ViolationKind,
}

impl Violation {
    /// A field path for structured input, e.g. `tables[1].chains[3].rules[2]`-style callers
    /// build their own from the indices; this gives the readable form
    /// `filter/INPUT#3` used in messages.
    pub fn path(&self) -> String {
        let mut s = String::new();
        if let Some(t) = self.table {
            s.push_str(t.name());
            if self.family == Some(Family::Ipv6) {
                s.push('6');
            }
        }
        if let Some(c) = &self.chain {
            s.push('/');
            s.push_str(c);
        }
        if let Some(r) = self.rule {
            s.push_str(&format!("#{r}"));
        }
        s
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {sev}: ", self.location)?;
        let path = self.path();
        if !path.is_empty() {
            write!(f, "{path}: ")?;
        }
        write!(f, "{}", self.kind)
    }
}

/// Which hooks the node's packet path evaluates, per family, and why not the others (for
/// messages): what a packet source and its steering deliver. A packet queued at INPUT or
/// FORWARD has passed PREROUTING (the engine runs raw PREROUTING for it first), so steering
/// either of them reaches PREROUTING too; POSTROUTING is never evaluated (no enforced table
/// has it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReachedHooks {
    /// Bit `1 << Hook::index()` per evaluated hook; `[IPv4, IPv6]`.
    bits: [u8; 2],
    /// Why the other hooks are not evaluated, e.g. "the packet source pcap delivers every
    /// packet at INPUT".
    why: String,
}

impl ReachedHooks {
    /// The hooks a source delivering packets at `v4` / `v6` evaluates (each family's steered
    /// hooks, with PREROUTING added where INPUT or FORWARD is among them); `why` says what
    /// limits them, for the warning's message.
    pub fn delivered(v4: &[Hook], v6: &[Hook], why: impl Into<String>) -> ReachedHooks {
        let bits = |hooks: &[Hook]| {
            hooks.iter().fold(0u8, |b, h| {
                let pre = matches!(h, Hook::Input | Hook::Forward);
                b | 1 << h.index()
                    | if pre {
                        1 << Hook::Prerouting.index()
                    } else {
                        0
                    }
            })
        };
        ReachedHooks {
            bits: [bits(v4), bits(v6)],
            why: why.into(),
        }
    }

    /// Whether packets of `family` are evaluated at `hook`.
    pub fn reaches(&self, family: Family, hook: Hook) -> bool {
        self.bits[family_index(family)] & 1 << hook.index() != 0
    }

    /// Why the other hooks are not evaluated.
    pub fn why(&self) -> &str {
        &self.why
    }
}

fn family_index(f: Family) -> usize {
    match f {
        Family::Ipv4 => 0,
        Family::Ipv6 => 1,
    }
}

/// What is wrong. Each variant's message names the offending item.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ViolationKind {
    /// A nat, mangle or security table: stored and printed, not evaluated (warning).
    #[error("table {0} is stored but not enforced by the engine")]
    TableNotEnforced(TableKind),
    /// A chain of an enforced table that only hooks the node never evaluates reach (warning,
    /// at the chain's first rule): its rules never see a packet here.
    #[error(
        "rules {first}-{last} of this chain (lines {first_line}-{last_line}) are never evaluated on this node: the chain is reached only from {}, and {why}",
        hooks.iter().map(|h| h.chain_name()).collect::<Vec<_>>().join(", ")
    )]
    HookNotReached {
        /// The hooks that reach the chain.
        hooks: Vec<Hook>,
        /// First and last rule number (1-based).
        first: u32,
        /// Last rule number.
        last: u32,
        /// Source lines of the first and last rule (0 for structured input).
        first_line: u32,
        /// Source line of the last rule.
        last_line: u32,
        /// Why those hooks are not evaluated ([`ReachedHooks::why`]).
        why: String,
    },
    /// Two tables of the same family and kind.
    #[error("table {0} appears twice")]
    DuplicateTable(TableKind),
    /// Two chains with one name in a table.
    #[error("chain {0} is declared twice")]
    DuplicateChain(String),
    /// Chain name empty, longer than 28 bytes, or not writable in iptables-restore text
    /// (starts with `-` or `!`, holds whitespace, control characters, quotes or backslashes).
    #[error(
        "chain name {0:?} must be 1 to 28 bytes, not start with - or !, and hold no whitespace, control characters, quotes or backslashes"
    )]
    BadChainName(String),
    /// A chain with a policy whose name is not a hook of the table.
    #[error(
        "chain {chain} is not a builtin chain of table {table}; only builtin chains have a policy"
    )]
    PolicyOnUserChain {
        /// Chain name.
        chain: String,
        /// Table.
        table: TableKind,
    },
    /// A builtin chain name declared without a policy.
    #[error("builtin chain {0} needs a policy")]
    BuiltinWithoutPolicy(String),
    /// A jump or goto to a chain missing from the table.
    #[error(
        "target chain {0} does not exist in this table (as iptables-restore: chains must be declared before use)"
    )]
    UnknownChain(String),
    /// A jump or goto to a builtin chain.
    #[error("cannot jump to builtin chain {0}")]
    JumpToBuiltin(String),
    /// The jump graph has a cycle through these chains (a long one names its first and last
    /// 8 chains around `... (N more)`).
    #[error("loop: {}", .0.join(" -> "))]
    Loop(Vec<String>),
    /// Calls nest deeper than [`MAX_CALL_DEPTH`].
    #[error("chain calls nest {0} deep, more than the limit of {MAX_CALL_DEPTH}")]
    TooDeep(usize),
    /// A match or target the engine does not run, in an enforced table.
    #[error("{what} extension {name} is not supported in enforced table {table}")]
    Unsupported {
        /// "match" or "target".
        what: &'static str,
        /// Extension (and option) name.
        name: String,
        /// Table.
        table: TableKind,
    },
    /// A target only allowed in some tables.
    #[error("target {target} is only valid in table {allowed}")]
    TargetTable {
        /// Target name.
        target: &'static str,
        /// The table it belongs to.
        allowed: TableKind,
    },
    /// A target or match used in a chain reachable from a hook it does not support.
    #[error("{what} is not valid in a chain reachable from {hook}")]
    WrongHook {
        /// The target or match.
        what: &'static str,
        /// The hook.
        hook: Hook,
    },
    /// A protocol match without the matching `-p`.
    #[error("-m {ext} needs `-p {proto}` (not negated)")]
    NeedsProtocol {
        /// Match name.
        ext: &'static str,
        /// Protocol name.
        proto: &'static str,
    },
    /// Something of the other family (icmp in ip6tables, `-f` in IPv6, ...).
    #[error("{0} is not valid for this family")]
    WrongFamily(String),
    /// A name or text too long, empty, or with characters its text form cannot carry.
    #[error(
        "{what} {value:?} is empty, longer than {max} bytes or holds characters iptables text cannot carry"
    )]
    TooLong {
        /// What it is.
        what: &'static str,
        /// The value.
        value: String,
        /// The limit.
        max: usize,
    },
    /// An inverted or otherwise empty range.
    #[error("range {0} is empty")]
    BadRange(String),
    /// multiport with more than 15 slots.
    #[error("multiport takes at most 15 ports, a range counting 2 (got {0})")]
    TooManyPorts(usize),
    /// limit with a zero rate or burst, a rate above 10000/second or a burst above 10000.
    #[error("limit needs a rate of 1 to 10000/second and a burst of 1 to 10000")]
    BadLimit,
    /// A set that does not exist.
    #[error("set {0} does not exist")]
    UnknownSet(String),
    /// Fewer `src`/`dst` flags than the set has dimensions.
    #[error("set {set} needs {needed} src/dst flags, got {given}")]
    SetDimensions {
        /// Set name.
        set: String,
        /// Required flags.
        needed: usize,
        /// Given flags.
        given: usize,
    },
    /// No flag at all given to --match-set.
    #[error("--match-set {0} needs src or dst flags")]
    SetNoFlags(String),
    /// `-m addrtype` with types that depend on the node's addresses, validated against a
    /// registry that has none ([`SetRegistry::node_addrs`]).
    #[error(
        "-m addrtype {0} needs the node's addresses, which this engine was not given (vallumd reads the host's, or takes --local-addresses)"
    )]
    NodeAddrsUnknown(String),
    /// `-j NFLOG` (warning): its events are counted and handed to the engine's caller like
    /// LOG events, and vallumd has no consumer for either yet: nothing reaches the nflog
    /// group.
    #[error(
        "-j NFLOG --nflog-group {0}: the rule counts and its events are kept like LOG events, but vallumd has no consumer for them yet: nothing is sent to nflog group {0}"
    )]
    NflogNoConsumer(u16),
    /// `-m connmark` or `-j CONNMARK` in the raw table (warning): raw runs before conntrack
    /// (priority -300 against -200), so the packet has no entry there yet and, as in the
    /// kernel, the match never matches and the target changes nothing.
    #[error(
        "{0} in table raw sees no conntrack entry (raw runs before conntrack): it never matches / changes nothing, as in the kernel"
    )]
    NoConntrackInRaw(&'static str),
    /// `-j CT --helper NAME` (warning): the template (and its zone) is enforced, but no
    /// connection-tracking helper runs for the connection: the engine has no ALGs, and the
    /// kernel's conntrack (NFQUEUE mode) attaches a helper only where the kernel's own
    /// ruleset says `-j CT --helper`, which vallumd's steering does not. So the connections
    /// the helper would expect (FTP data, TFTP, SIP media, ...) are NEW, not RELATED.
    #[error(
        "-j CT --helper {0}: no conntrack helper runs for these connections (the engine has no ALGs and does not attach the kernel's): the connections it would expect (e.g. FTP data) are NEW, not RELATED; allow them by port, or keep `{0}` in the kernel's own ruleset"
    )]
    CtHelperNotRun(String),
    /// A value the kernel (or iptables) refuses, or one the engine would evaluate differently
    /// from what its text form means (structured input only; the parser never builds these).
    #[error("{what} {value}: {reason}")]
    BadValue {
        /// What it is (`address`, `protocol`, ...).
        what: &'static str,
        /// The value as written.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

/// Validates a ruleset. With `sets`, every `--match-set` must name an existing set; without,
/// set references are not checked. Returns all violations in source order (errors and
/// warnings); the ruleset may be committed when none has [`Severity::Error`].
pub fn validate(ruleset: &Ruleset, sets: Option<&dyn SetRegistry>) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut seen_tables = HashSet::new();
    for table in &ruleset.tables {
        let mut v = TableCheck {
            ruleset,
            table,
            out: &mut out,
        };
        if !v.table_head(&mut seen_tables) {
            continue;
        }
        v.check(sets);
    }
    out.sort_by_key(|v| v.location);
    out
}

/// Per table (by index in the ruleset) and chain (by index in the table): how a chain's rules
/// differ from the previous ruleset's chain of that name, `(prefix, old_mid, new_mid)` as
/// [`crate::model::diff_rules`] gives it; `None` where no diff was computed (the table's chain
/// names differ from the previous ruleset's, or there is no previous table). Computed once by
/// [`validate_after`] and reused by the incremental compile.
#[derive(Clone, Debug, Default)]
pub(crate) struct RuleDiffs {
    pub(crate) tables: Vec<Vec<Option<(u32, u32, u32)>>>,
}

/// As [`validate`], given `prev`: the ruleset of the same name that is active now, which
/// passed validation without errors when it was committed. A rule whose content is unchanged
/// (by [`Rule::same_content`], in the same chain, a prefix or suffix of the chain's rules)
/// validates as it did then, as long as its context is the same: the table's chain names and
/// builtin-ness are unchanged and no changed rule jumps (so every chain is reached from the
/// same hooks) and it has no `-m set` (the registry may have changed). Only the other rules
/// are checked rule by rule; the structure and the jump graph are checked in full. Returns
/// exactly what [`validate`] returns (when this finds an error it runs [`validate`] for the
/// full list), and the per-chain diffs it computed on the way.
pub(crate) fn validate_after(
    ruleset: &Ruleset,
    prev: &Ruleset,
    sets: Option<&dyn SetRegistry>,
) -> (Vec<Violation>, RuleDiffs) {
    let mut out = Vec::new();
    let mut seen_tables = HashSet::new();
    let mut diffs = RuleDiffs {
        tables: vec![Vec::new(); ruleset.tables.len()],
    };
    for (ti, table) in ruleset.tables.iter().enumerate() {
        let mut v = TableCheck {
            ruleset,
            table,
            out: &mut out,
        };
        if !v.table_head(&mut seen_tables) {
            continue;
        }
        let old = prev.table(table.family, table.kind);
        diffs.tables[ti] = v.check_after(sets, old);
    }
    if has_errors(&out) {
        return (validate(ruleset, sets), diffs);
    }
    out.sort_by_key(|v| v.location);
    (out, diffs)
}

/// Whether any violation is an error.
pub fn has_errors(violations: &[Violation]) -> bool {
    violations.iter().any(|v| v.severity == Severity::Error)
}

/// A `BadRange` for each `--sport`/`--dport` range whose low end is above its high end.
fn empty_port_ranges(
    errs: &mut Vec<ViolationKind>,
    ranges: [&Option<crate::model::Neg<crate::model::PortRange>>; 2],
) {
    for p in ranges.into_iter().flatten() {
        if p.value.lo > p.value.hi {
            errs.push(ViolationKind::BadRange(format!(
                "{}:{}",
                p.value.lo, p.value.hi
            )));
        }
    }
}

/// Whether a network's address has no bits outside its mask (`contains(addr)`, read in place:
/// this runs for every address of every rule).
fn masked(n: &IpNet) -> bool {
    match (&n.addr, &n.mask) {
        (IpAddr::V4(a), IpAddr::V4(m)) => a.to_bits() & m.to_bits() == a.to_bits(),
        (IpAddr::V6(a), IpAddr::V6(m)) => a.to_bits() & m.to_bits() == a.to_bits(),
        _ => false,
    }
}

/// What [`walk_calls`] finds in a table's jump graph.
struct CallGraph {
    /// Per chain, the most `-j` calls nested below it (a `-g` adds none).
    depth: Vec<usize>,
    /// Each cycle found, from the chain jumped back to around to it again.
    loops: Vec<Cycle>,
}

/// A cycle of [`walk_calls`]: its chain indices from the chain jumped back to around to it
/// again (the first and last entry are the same chain); of a cycle longer than
/// [`LOOP_NAMES`], only the first and last `LOOP_NAMES / 2`, with `omitted` counting the
/// chains between them, so that a graph with many long cycles costs O(chains + jumps).
struct Cycle {
    chains: Vec<usize>,
    omitted: usize,
}

/// Loops and call depth of a jump graph (`edges[c]`: chain `c`'s targets in rule order, and
/// whether each is a `-j`), as mark_source_chains walks it: a depth-first search with
/// colours, on an explicit stack, so that a chain of jumps of any length (100k chains, each
/// jumping to the next) neither recurses nor needs more than O(chains + jumps) memory; a
/// cycle costs the length of its path once. The order of `loops` is that of a recursive DFS
/// from chain 0 upwards.
fn walk_calls(edges: &[Vec<(usize, bool)>]) -> CallGraph {
    const NEW: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let n = edges.len();
    let mut state = vec![NEW; n];
    let mut depth = vec![0usize; n];
    // Where an ON_PATH chain is in `path`.
    let mut at = vec![0usize; n];
    let mut path: Vec<usize> = Vec::new();
    // Per chain on the path: the next edge to look at and the depth found so far.
    let mut frames: Vec<(usize, usize, usize)> = Vec::new();
    let mut loops = Vec::new();
    for root in 0..n {
        if state[root] != NEW {
            continue;
        }
        state[root] = ON_PATH;
        at[root] = 0;
        path.push(root);
        frames.push((root, 0, 0));
        while let Some(frame) = frames.last_mut() {
            let (c, i) = (frame.0, frame.1);
            let Some(&(t, jump)) = edges[c].get(i) else {
                depth[c] = frame.2;
                state[c] = DONE;
                path.pop();
                frames.pop();
                continue;
            };
            match state[t] {
                NEW => {
                    // Descend; this edge is looked at again once `t` is done.
                    state[t] = ON_PATH;
                    at[t] = path.len();
                    path.push(t);
                    frames.push((t, 0, 0));
                    continue;
                }
                ON_PATH => {
                    let on = &path[at[t]..];
                    let len = on.len() + 1;
                    let half = LOOP_NAMES / 2;
                    let (mut chains, omitted) = if len <= LOOP_NAMES {
                        (on.to_vec(), 0)
                    } else {
                        let mut v = on[..half].to_vec();
                        v.extend_from_slice(&on[on.len() + 1 - half..]);
                        (v, len - 2 * half)
                    };
                    chains.push(t);
                    loops.push(Cycle { chains, omitted });
                }
                _ => frame.2 = frame.2.max(depth[t] + usize::from(jump)),
            }
            frame.1 += 1;
        }
    }
    CallGraph { depth, loops }
}

/// Longest loop named in full in a [`ViolationKind::Loop`]; a longer one names its first and
/// last chains around a count of the ones left out, so that a message stays short whatever
/// the ruleset.
const LOOP_NAMES: usize = 16;

/// The chain names of a cycle from [`walk_calls`], `... (N more)` standing for the ones
/// omitted.
fn loop_names(table: &Table, cycle: &Cycle) -> Vec<String> {
    let name = |&i: &usize| table.chains[i].name.clone();
    let mut out: Vec<String> = cycle.chains.iter().map(name).collect();
    if cycle.omitted > 0 {
        out.insert(LOOP_NAMES / 2, format!("... ({} more)", cycle.omitted));
    }
    out
}

struct TableCheck<'a> {
    ruleset: &'a Ruleset,
    table: &'a Table,
    out: &'a mut Vec<Violation>,
}

fn target_name(t: &Target) -> &'static str {
    match t {
        Target::Reject(_) => "REJECT",
        Target::Notrack => "NOTRACK",
        Target::Ct(_) => "CT",
        _ => "target",
    }
}

impl TableCheck<'_> {
    fn push(
        &mut self,
        severity: Severity,
        chain: Option<&Chain>,
        rule: Option<u32>,
        location: Location,
        kind: ViolationKind,
    ) {
        self.out.push(Violation {
            severity,
            ruleset: self.ruleset.name.clone(),
            family: Some(self.table.family),
            table: Some(self.table.kind),
            chain: chain.map(|c| c.name.clone()),
            rule,
            location,
            kind,
        });
    }

    /// The checks of the table itself: a second table of the same family and kind is an
    /// error (`false`: check nothing else of it), one that is not enforced a warning.
    fn table_head(&mut self, seen: &mut HashSet<(Family, TableKind)>) -> bool {
        let table = self.table;
        if !seen.insert((table.family, table.kind)) {
            self.at_table(ViolationKind::DuplicateTable(table.kind));
            return false;
        }
        if !table.kind.is_enforced() {
            self.push(
                Severity::Warning,
                None,
                None,
                table.location,
                ViolationKind::TableNotEnforced(table.kind),
            );
        }
        true
    }

    fn at_table(&mut self, kind: ViolationKind) {
        let loc = self.table.location;
        self.push(Severity::Error, None, None, loc, kind);
    }

    fn at_chain(&mut self, c: &Chain, kind: ViolationKind) {
        self.push(Severity::Error, Some(c), None, c.location, kind);
    }

    fn at_rule(&mut self, c: &Chain, n: usize, r: &Rule, kind: ViolationKind) {
        self.push(
            Severity::Error,
            Some(c),
            Some(n as u32 + 1),
            r.location,
            kind,
        );
    }

    fn check(&mut self, sets: Option<&dyn SetRegistry>) {
        self.check_after(sets, None);
    }

    /// [`TableCheck::check`], knowing the table `old` of the active ruleset (valid): see
    /// [`validate_after`]. Returns the per-chain diffs against `old` (empty when its chains
    /// differ).
    fn check_after(
        &mut self,
        sets: Option<&dyn SetRegistry>,
        old: Option<&Table>,
    ) -> Vec<Option<(u32, u32, u32)>> {
        let table = self.table;
        let hooks = table.kind.builtin_hooks();
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, c) in table.chains.iter().enumerate() {
            if names.insert(&c.name, i).is_some() {
                self.at_chain(c, ViolationKind::DuplicateChain(c.name.clone()));
            }
            // The parser's grammar (as iptables-restore), for structured input too.
            if crate::restore::check_chain_name(&c.name).is_err() {
                self.at_chain(c, ViolationKind::BadChainName(c.name.clone()));
            }
            let builtin = Hook::from_chain_name(&c.name).is_some_and(|h| hooks.contains(&h));
            if c.policy.is_some() && !builtin {
                self.at_chain(
                    c,
                    ViolationKind::PolicyOnUserChain {
                        chain: c.name.clone(),
                        table: table.kind,
                    },
                );
            }
            if c.policy.is_none() && builtin {
                self.at_chain(c, ViolationKind::BuiltinWithoutPolicy(c.name.clone()));
            }
        }

        // Jump graph: edges (from, to, is_jump) per rule.
        let n = table.chains.len();
        let mut edges: Vec<Vec<(usize, bool)>> = vec![Vec::new(); n];
        let mut edge = |this: &mut Self, ci: usize, ri: usize, r: &Rule| {
            let (name, jump) = match &r.target {
                Target::Jump(t) => (t, true),
                Target::Goto(t) => (t, false),
                _ => return,
            };
            let c = &table.chains[ci];
            match names.get(name.as_str()) {
                None => this.at_rule(c, ri, r, ViolationKind::UnknownChain(name.clone())),
                Some(&ti) if table.chains[ti].policy.is_some() => {
                    this.at_rule(c, ri, r, ViolationKind::JumpToBuiltin(name.clone()))
                }
                Some(&ti) => edges[ci].push((ti, jump)),
            }
        };
        // With a previous table of the same chains (names, builtin or not, in order), each
        // chain's rules are diffed against the old chain's in one pass that also collects the
        // unchanged rules' edges; `recheck` gets the rules that must be checked one by one.
        let same_chains = old.filter(|o| {
            o.chains.len() == n
                && o.chains
                    .iter()
                    .zip(&table.chains)
                    .all(|(a, b)| a.name == b.name && a.policy.is_some() == b.policy.is_some())
        });
        let mut diffs = vec![None; if same_chains.is_some() { n } else { 0 }];
        let mut recheck: Vec<(usize, usize)> = Vec::new();
        let mut jumps_changed = same_chains.is_none();
        for (ci, c) in table.chains.iter().enumerate() {
            let Some(o) = same_chains else {
                for (ri, r) in c.rules.iter().enumerate() {
                    edge(self, ci, ri, r);
                }
                continue;
            };
            let old_rules = &o.chains[ci].rules;
            let d = diff_rules(old_rules, &c.rules, |ri, r| {
                edge(self, ci, ri, r);
                if r.matches.iter().any(|m| matches!(m, Match::Set(_))) {
                    recheck.push((ci, ri));
                }
            });
            diffs[ci] = Some(d);
            let (p, om, nm) = (d.0 as usize, d.1 as usize, d.2 as usize);
            for (ri, r) in (p..p + nm).zip(c.rules.range(p..p + nm)) {
                edge(self, ci, ri, r);
                recheck.push((ci, ri));
                jumps_changed |= matches!(r.target, Target::Jump(_) | Target::Goto(_));
            }
            jumps_changed |= old_rules
                .range(p..p + om)
                .any(|r| matches!(r.target, Target::Jump(_) | Target::Goto(_)));
        }

        // Loops and depth: DFS with colours, as mark_source_chains walks the graph.
        let CallGraph { depth, loops } = walk_calls(&edges);
        for cycle in loops {
            let first = &table.chains[cycle.chains[0]];
            self.at_chain(first, ViolationKind::Loop(loop_names(table, &cycle)));
        }
        for (ci, c) in table.chains.iter().enumerate() {
            if c.policy.is_some() && depth[ci] > MAX_CALL_DEPTH {
                self.at_chain(c, ViolationKind::TooDeep(depth[ci]));
            }
        }

        // Which hooks reach each chain (mark_source_chains' comefrom bits).
        let mut reach = vec![0u8; n];
        for (ci, c) in table.chains.iter().enumerate() {
            if let (Some(_), Some(h)) = (c.policy, Hook::from_chain_name(&c.name)) {
                let mut stack = vec![ci];
                while let Some(x) = stack.pop() {
                    if reach[x] & (1 << h.index()) != 0 {
                        continue;
                    }
                    reach[x] |= 1 << h.index();
                    stack.extend(edges[x].iter().map(|&(t, _)| t));
                }
            }
        }

        if let Some(live) = sets.and_then(|s| s.reached_hooks()) {
            self.unreached_chains(&reach, &live);
        }

        if jumps_changed {
            for (ci, c) in table.chains.iter().enumerate() {
                for (ri, r) in c.rules.iter().enumerate() {
                    self.check_rule(c, ri, r, reach[ci], sets);
                }
            }
        } else {
            // Every chain is reached from the hooks it was reached from before, so an
            // unchanged rule (without a set) checks as it did when `old` was committed.
            recheck.sort_unstable();
            for (ci, ri) in recheck {
                let c = &table.chains[ci];
                self.check_rule(c, ri, &c.rules[ri], reach[ci], sets);
            }
        }
        diffs
    }

    /// A [`ViolationKind::HookNotReached`] warning for every chain with rules that some hook
    /// reaches (`reach`, per chain) but none that `live` evaluates. Every chain, every time
    /// (also in [`validate_after`]: an unchanged rule keeps its warning).
    fn unreached_chains(&mut self, reach: &[u8], live: &ReachedHooks) {
        let table = self.table;
        if !table.kind.is_enforced() {
            return;
        }
        for (c, &bits) in table.chains.iter().zip(reach) {
            let hooks: Vec<Hook> = Hook::ALL
                .into_iter()
                .filter(|h| bits & 1 << h.index() != 0)
                .collect();
            if hooks.is_empty() || hooks.iter().any(|&h| live.reaches(table.family, h)) {
                continue;
            }
            let (Some(first), Some(last)) = (c.rules.iter().next(), c.rules.iter().next_back())
            else {
                continue;
            };
            let kind = ViolationKind::HookNotReached {
                hooks,
                first: 1,
                last: c.rules.len() as u32,
                first_line: first.location.line,
                last_line: last.location.line,
                why: live.why().to_owned(),
            };
            self.push(Severity::Warning, Some(c), Some(1), first.location, kind);
        }
    }

    fn check_rule(
        &mut self,
        c: &Chain,
        ri: usize,
        r: &Rule,
        reach: u8,
        sets: Option<&dyn SetRegistry>,
    ) {
        let table = self.table;
        let family = table.family;
        let enforced = table.kind.is_enforced();
        let reached = |h: Hook| reach & (1 << h.index()) != 0;
        let mut errs: Vec<ViolationKind> = Vec::new();
        let mut warns: Vec<ViolationKind> = Vec::new();

        for i in [&r.in_iface, &r.out_iface].into_iter().flatten() {
            // As the parser: no whitespace, control characters, '/', quotes or backslashes
            // (iptables: "Invalid character"), so that the printed rule parses back.
            let bad_char =
                |ch: char| ch.is_whitespace() || ch.is_control() || matches!(ch, '/' | '"' | '\\');
            if i.value.name.is_empty()
                || i.value.name.len() > 15
                || i.value.name.chars().any(bad_char)
            {
                errs.push(ViolationKind::TooLong {
                    what: "interface",
                    value: i.value.name.clone(),
                    max: 15,
                });
            }
        }
        if r.fragment.is_some() && family == Family::Ipv6 {
            errs.push(ViolationKind::WrongFamily("-f".into()));
        }
        for net in [&r.src, &r.dst].into_iter().flatten() {
            let n = &net.value;
            if n.addr.is_ipv6() != (family == Family::Ipv6)
                || n.mask.is_ipv6() != (family == Family::Ipv6)
            {
                errs.push(ViolationKind::WrongFamily(format!(
                    "address {}/{}",
                    n.addr, n.mask
                )));
            } else if !masked(n) {
                // The kernel compares `(ip & mask) == addr`, so such a rule never matches, but
                // its text form `ADDR/MASK` is masked again by iptables-restore and does.
                errs.push(ViolationKind::BadValue {
                    what: "address",
                    value: format!("{}/{}", n.addr, n.mask),
                    reason: "has bits set outside its mask",
                });
            }
        }
        if r.protocol.is_some_and(|p| p.value == 0) {
            // The model spells `-p all` as `None`; the compiled rule would compare the
            // packet's protocol with 0 instead of matching every protocol.
            errs.push(ViolationKind::BadValue {
                what: "protocol",
                value: "0".into(),
                reason: "`-p all` is written as no protocol",
            });
        }
        let proto = r.protocol.filter(|p| !p.negated).map(|p| p.value);
        let mut mac_used = false;
        let mut owner_used = false;
        let mut physdev_out_used = false;
        for m in &r.matches {
            let needs = |ext: &'static str, protos: &[u8], pname: &'static str| {
                (!proto.is_some_and(|p| protos.contains(&p)))
                    .then_some(ViolationKind::NeedsProtocol { ext, proto: pname })
            };
            match m {
                Match::Tcp(t) => {
                    errs.extend(needs("tcp", &[6], "tcp"));
                    empty_port_ranges(&mut errs, [&t.sport, &t.dport]);
                }
                Match::Udp(u) => {
                    errs.extend(needs("udp", &[17], "udp"));
                    empty_port_ranges(&mut errs, [&u.sport, &u.dport]);
                }
                Match::Multiport(mp) => {
                    errs.extend(needs(
                        "multiport",
                        &[6, 17, 33, 132, 136],
                        "tcp|udp|udplite|sctp|dccp",
                    ));
                    let slots: usize = mp
                        .ports
                        .iter()
                        .map(|p| if p.lo == p.hi { 1 } else { 2 })
                        .sum();
                    if slots > 15 || mp.ports.is_empty() {
                        errs.push(ViolationKind::TooManyPorts(slots));
                    }
                    if mp.ports.iter().any(|p| p.lo > p.hi) {
                        errs.push(ViolationKind::BadRange("multiport".into()));
                    }
                }
                Match::Icmp(i) | Match::Icmpv6(i) if i.code.0 > i.code.1 => {
                    errs.push(ViolationKind::BadRange(format!(
                        "icmp code {}:{}",
                        i.code.0, i.code.1
                    )));
                }
                Match::Icmp(_) => {
                    if family != Family::Ipv4 {
                        errs.push(ViolationKind::WrongFamily("-m icmp".into()));
                    }
                    errs.extend(needs("icmp", &[1], "icmp"));
                }
                Match::Icmpv6(_) => {
                    if family != Family::Ipv6 {
                        errs.push(ViolationKind::WrongFamily("-m icmp6".into()));
                    }
                    errs.extend(needs("icmp6", &[58], "ipv6-icmp"));
                }
                Match::Conntrack(ct) => {
                    if enforced {
                        for o in &ct.other {
                            let one = crate::model::ConntrackMatch {
                                ctstate: None,
                                other: vec![o.clone()],
                            };
                            if let Err(name) = one.tuple_conditions(family) {
                                errs.push(ViolationKind::Unsupported {
                                    what: "match",
                                    name,
                                    table: table.kind,
                                });
                            }
                        }
                    }
                }
                Match::State(_) | Match::Mark(_) => {}
                Match::Physdev(d) => physdev_out_used |= d.needs_bridged_output(),
                Match::Owner(w) => {
                    owner_used = true;
                    if enforced && w.suppl_groups {
                        errs.push(ViolationKind::Unsupported {
                            what: "match",
                            name: "owner --suppl-groups (NFQUEUE sends no supplementary groups)"
                                .into(),
                            table: table.kind,
                        });
                    }
                }
                Match::Connmark(_) => {
                    if table.kind == TableKind::Raw {
                        warns.push(ViolationKind::NoConntrackInRaw("-m connmark"));
                    }
                }
                Match::Iprange(ir) => {
                    for rg in [ir.src, ir.dst].into_iter().flatten() {
                        let fam_ok = rg.value.lo.is_ipv6() == (family == Family::Ipv6)
                            && rg.value.hi.is_ipv6() == (family == Family::Ipv6);
                        if !fam_ok {
                            errs.push(ViolationKind::WrongFamily("iprange address".into()));
                        } else if rg.value.lo > rg.value.hi {
                            errs.push(ViolationKind::BadRange(format!(
                                "{}-{}",
                                rg.value.lo, rg.value.hi
                            )));
                        }
                    }
                }
                Match::Set(s) => {
                    if s.name.is_empty()
                        || s.name.len() > 31
                        || s.name
                            .chars()
                            .any(|ch| ch.is_whitespace() || ch.is_control())
                    {
                        errs.push(ViolationKind::TooLong {
                            what: "set name",
                            value: s.name.clone(),
                            max: 31,
                        });
                    }
                    if s.dirs.is_empty() {
                        errs.push(ViolationKind::SetNoFlags(s.name.clone()));
                    }
                    if let Some(reg) = sets {
                        match reg.lookup(&s.name) {
                            None => errs.push(ViolationKind::UnknownSet(s.name.clone())),
                            Some(set) if set.dimensions() > s.dirs.len() && !s.dirs.is_empty() => {
                                errs.push(ViolationKind::SetDimensions {
                                    set: s.name.clone(),
                                    needed: set.dimensions(),
                                    given: s.dirs.len(),
                                })
                            }
                            Some(_) => {}
                        }
                    }
                    if enforced {
                        for o in &s.other {
                            errs.push(ViolationKind::Unsupported {
                                what: "match",
                                name: format!("set {}", o.name),
                                table: table.kind,
                            });
                        }
                    }
                }
                Match::Comment(text) => {
                    if text.len() > 255 || text.chars().any(char::is_control) {
                        errs.push(ViolationKind::TooLong {
                            what: "comment",
                            value: text.clone(),
                            max: 255,
                        });
                    }
                }
                Match::Length(l) => {
                    if l.value.lo > l.value.hi {
                        errs.push(ViolationKind::BadRange(format!(
                            "{}:{}",
                            l.value.lo, l.value.hi
                        )));
                    }
                }
                Match::Limit(l) => {
                    // As libxt_limit: at most 10000 packets a second (XT_LIMIT_SCALE) and a
                    // burst of at most 10000. A faster rate would make the token interval 0 ns
                    // and the match true for every packet.
                    let too_fast = u128::from(l.rate) * 100_000 > u128::from(l.unit.ns());
                    if l.rate == 0 || l.burst == 0 || too_fast || l.burst > 10_000 {
                        errs.push(ViolationKind::BadLimit);
                    }
                }
                Match::Mac(_) => mac_used = true,
                Match::Ttl(_) | Match::Ah(_) if family != Family::Ipv4 => {
                    errs.push(ViolationKind::WrongFamily(format!("-m {}", m.extension())));
                }
                Match::Hl(_) | Match::Frag(_) | Match::Rt(_) | Match::Ipv6Header(_)
                    if family != Family::Ipv6 =>
                {
                    errs.push(ViolationKind::WrongFamily(format!("-m {}", m.extension())));
                }
                Match::Ttl(_) | Match::Hl(_) | Match::Tos(_) | Match::Ipv6Header(_) => {}
                Match::Dscp(d) => {
                    if d.value > 63 {
                        errs.push(ViolationKind::BadValue {
                            what: "dscp",
                            value: d.value.to_string(),
                            reason: "DSCP is 0-63",
                        });
                    }
                }
                Match::Ecn(e) => {
                    if e.ece.is_some() || e.cwr.is_some() {
                        errs.extend(needs("ecn --ecn-tcp-ece/--ecn-tcp-cwr", &[6], "tcp"));
                    }
                    if e.ect.is_some_and(|v| v.value > 3) {
                        errs.push(ViolationKind::BadValue {
                            what: "ecn --ecn-ip-ect",
                            value: e.ect.map_or(0, |v| v.value).to_string(),
                            reason: "the ECN field is 0-3",
                        });
                    }
                }
                Match::Ah(a) => {
                    errs.extend(needs("ah", &[51], "ah"));
                    if a.value.lo > a.value.hi {
                        errs.push(ViolationKind::BadRange("ah --ahspi".into()));
                    }
                }
                Match::Frag(f) => {
                    if f.id.value.lo > f.id.value.hi {
                        errs.push(ViolationKind::BadRange("frag --fragid".into()));
                    }
                }
                Match::Rt(rt) => {
                    if rt.segsleft.value.lo > rt.segsleft.value.hi {
                        errs.push(ViolationKind::BadRange("rt --rt-segsleft".into()));
                    }
                    if enforced {
                        if let Some(o) = rt.other.first() {
                            errs.push(ViolationKind::Unsupported {
                                what: "match",
                                name: format!("rt {}", o.name),
                                table: table.kind,
                            });
                        }
                    }
                }
                Match::AddrType(a) => {
                    let all = a.src.map_or(0, |v| v.value) | a.dst.map_or(0, |v| v.value);
                    if a.src.is_none() && a.dst.is_none() {
                        errs.push(ViolationKind::BadValue {
                            what: "addrtype",
                            value: String::new(),
                            reason: "needs --src-type or --dst-type",
                        });
                    }
                    if all >> 12 != 0 {
                        errs.push(ViolationKind::BadValue {
                            what: "addrtype",
                            value: format!("{all:#x}"),
                            reason: "holds bits that name no route type",
                        });
                    }
                    let v6_refused = addr_type::BROADCAST | addr_type::BLACKHOLE | 0xff00;
                    if family == Family::Ipv6 && all & v6_refused != 0 {
                        errs.push(ViolationKind::WrongFamily(format!(
                            "-m addrtype {}",
                            addr_type::names(all & v6_refused)
                        )));
                    }
                    // As addrtype_mt_checkentry.
                    let bad_hooks: &[Hook] = match a.limit {
                        AddrTypeLimit::None => &[],
                        AddrTypeLimit::In => &[Hook::Output, Hook::Postrouting],
                        AddrTypeLimit::Out => &[Hook::Prerouting, Hook::Input],
                    };
                    for &h in bad_hooks {
                        if reached(h) {
                            errs.push(ViolationKind::WrongHook {
                                what: if a.limit == AddrTypeLimit::In {
                                    "-m addrtype --limit-iface-in"
                                } else {
                                    "-m addrtype --limit-iface-out"
                                },
                                hook: h,
                            });
                        }
                    }
                    let undecided = all & !addr_type::DECIDED & 0x0fff;
                    if enforced && undecided != 0 {
                        errs.push(ViolationKind::Unsupported {
                            what: "match",
                            name: format!(
                                "addrtype {} (needs routes beyond the node's local table)",
                                addr_type::names(undecided)
                            ),
                            table: table.kind,
                        });
                    }
                    let needs = a
                        .src
                        .iter()
                        .chain(a.dst.iter())
                        .any(|v| crate::node_addrs::needs_facts(family, v.value));
                    if enforced && needs && sets.is_some_and(|r| r.node_addrs().is_none()) {
                        errs.push(ViolationKind::NodeAddrsUnknown(addr_type::names(all)));
                    }
                }
                Match::Recent(r) => {
                    if let Some(reason) = r.kernel_refusal() {
                        errs.push(ViolationKind::BadValue {
                            what: "recent",
                            value: r.name.clone(),
                            reason,
                        });
                    }
                    if r.mask.is_ipv4() != (family == Family::Ipv4) {
                        errs.push(ViolationKind::WrongFamily("-m recent --mask".into()));
                    }
                }
                Match::Hashlimit(h) => {
                    if let Some(reason) = h.kernel_refusal(family) {
                        errs.push(ViolationKind::BadValue {
                            what: "hashlimit",
                            value: h.name.clone(),
                            reason,
                        });
                    }
                }
                Match::Opaque(o) => {
                    if enforced {
                        errs.push(ViolationKind::Unsupported {
                            what: "match",
                            name: with_why(false, &o.name, &o.name),
                            table: table.kind,
                        });
                    }
                }
            }
        }
        if physdev_out_used && reached(Hook::Output) {
            // As physdev_mt_check: the output port of a locally sent packet is not known
            // at OUTPUT unless the rule asks for bridged traffic.
            errs.push(ViolationKind::WrongHook {
                what: "-m physdev --physdev-out/--physdev-is-out without --physdev-is-bridged",
                hook: Hook::Output,
            });
        }
        if owner_used {
            // As xt_owner's hooks: only locally generated packets have a socket.
            for h in [Hook::Prerouting, Hook::Input, Hook::Forward] {
                if reached(h) {
                    errs.push(ViolationKind::WrongHook {
                        what: "-m owner",
                        hook: h,
                    });
                }
            }
        }
        if mac_used {
            for h in [Hook::Output, Hook::Postrouting] {
                if reached(h) {
                    errs.push(ViolationKind::WrongHook {
                        what: "-m mac",
                        hook: h,
                    });
                }
            }
        }

        match &r.target {
            Target::Reject(w) => {
                if table.kind != TableKind::Filter {
                    errs.push(ViolationKind::TargetTable {
                        target: "REJECT",
                        allowed: TableKind::Filter,
                    });
                }
                for h in [Hook::Prerouting, Hook::Postrouting] {
                    if reached(h) {
                        errs.push(ViolationKind::WrongHook {
                            what: "REJECT",
                            hook: h,
                        });
                    }
                }
                let v4_only = matches!(
                    w,
                    RejectWith::ProtoUnreachable
                        | RejectWith::NetProhibited
                        | RejectWith::HostProhibited
                );
                let v6_only = matches!(w, RejectWith::PolicyFail | RejectWith::RejectRoute);
                if (v4_only && family == Family::Ipv6) || (v6_only && family == Family::Ipv4) {
                    errs.push(ViolationKind::WrongFamily(format!("--reject-with {w:?}")));
                }
                if *w == RejectWith::TcpReset && proto != Some(6) {
                    errs.push(ViolationKind::NeedsProtocol {
                        ext: "REJECT --reject-with tcp-reset",
                        proto: "tcp",
                    });
                }
            }
            Target::Notrack | Target::Ct(_) => {
                if table.kind != TableKind::Raw {
                    errs.push(ViolationKind::TargetTable {
                        target: target_name(&r.target),
                        allowed: TableKind::Raw,
                    });
                }
                // With --notrack the kernel uses no other option (xt_ct_tg_check); without,
                // the zone is enforced (the tracker's key), --helper warns.
                if let Target::Ct(ct) = &r.target {
                    for o in ct.other.iter().filter(|_| enforced && !ct.notrack) {
                        if o.name == "--helper" {
                            let helper = o.args.first().cloned().unwrap_or_default();
                            warns.push(ViolationKind::CtHelperNotRun(helper));
                        } else {
                            let name = format!("CT {}", o.name);
                            errs.push(ViolationKind::Unsupported {
                                what: "target",
                                name: with_why(true, &name, &name),
                                table: table.kind,
                            });
                        }
                    }
                }
            }
            Target::Opaque(o) => {
                if enforced {
                    errs.push(ViolationKind::Unsupported {
                        what: "target",
                        name: o.name.clone(),
                        table: table.kind,
                    });
                }
            }
            Target::Log(l) => {
                if l.prefix
                    .as_ref()
                    .is_some_and(|p| p.len() > 29 || p.chars().any(char::is_control))
                {
                    errs.push(ViolationKind::TooLong {
                        what: "log prefix",
                        value: l.prefix.clone().unwrap_or_default(),
                        max: 29,
                    });
                }
                if let Some(level) = l.level.filter(|&lv| lv > 7) {
                    // xt_LOG's checkentry: "level %u >= 8".
                    errs.push(ViolationKind::BadValue {
                        what: "log level",
                        value: level.to_string(),
                        reason: "syslog levels are 0 to 7",
                    });
                }
            }
            Target::Nflog(n) => {
                if n.prefix
                    .as_ref()
                    .is_some_and(|p| p.len() > 63 || p.chars().any(char::is_control))
                {
                    errs.push(ViolationKind::TooLong {
                        what: "nflog prefix",
                        value: n.prefix.clone().unwrap_or_default(),
                        max: 63,
                    });
                }
                if enforced {
                    warns.push(ViolationKind::NflogNoConsumer(n.group));
                }
            }
            Target::Connmark(_) => {
                if table.kind == TableKind::Raw {
                    warns.push(ViolationKind::NoConntrackInRaw("-j CONNMARK"));
                }
            }
            Target::None
            | Target::Accept
            | Target::Drop
            | Target::Return
            | Target::Mark(_)
            | Target::Jump(_)
            | Target::Goto(_) => {}
        }
        for e in errs {
            self.at_rule(c, ri, r, e);
        }
        for w in warns {
            self.push(
                Severity::Warning,
                Some(c),
                Some(ri as u32 + 1),
                r.location,
                w,
            );
        }
    }
}

/// `shown` with the reason the support table gives for not enforcing `key`, when it gives one
/// ("connlimit (counts a source's connections ...)").
fn with_why(target: bool, key: &str, shown: &str) -> String {
    match crate::restore::why_not_enforced(target, key) {
        Some(why) => format!("{shown} ({why})"),
        None => shown.to_string(),
    }
}

#[cfg(test)]
mod tests {
    //! `validate_after` against `validate`: random valid rulesets, random changes (runs of
    //! rules replaced, inserted, deleted, in one or two chains; sometimes a chain added, a
    //! set removed from the registry), the same violations and the diffs `diff_rules` gives.

    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use super::*;
    use crate::model::{IpNet, Neg, Policy, SetDir, SetMatch, TcpMatch};
    use crate::sets::{FrozenSet, IpSet};

    use crate::test_rng::Rng;

    fn pool(i: usize) -> Rule {
        let with = |matches: Vec<Match>, target: Target| Rule {
            matches: matches.into(),
            target,
            ..Rule::default()
        };
        match i {
            0 => with(vec![], Target::Accept),
            1 => with(
                vec![Match::Mac(Neg::plain([2, 0, 0, 0, 0, 1]))],
                Target::Accept,
            ),
            2 => with(vec![], Target::Jump("A".into())),
            3 => with(vec![], Target::Jump("B".into())),
            4 => with(vec![], Target::Goto("B".into())),
            5 => with(vec![], Target::Reject(RejectWith::PortUnreachable)),
            6 => with(
                vec![Match::Set(SetMatch {
                    negated: false,
                    name: "s1".into(),
                    dirs: vec![SetDir::Src],
                    other: vec![],
                })],
                Target::Drop,
            ),
            7 => with(vec![Match::Comment("bad\u{1}".into())], Target::Accept),
            8 => Rule {
                protocol: Some(Neg::plain(6)),
                ..with(vec![Match::Tcp(TcpMatch::default())], Target::Drop)
            },
            9 => with(vec![Match::Tcp(TcpMatch::default())], Target::Drop),
            10 => with(vec![], Target::Return),
            11 => with(vec![], Target::Jump("INPUT".into())),
            12 => with(vec![], Target::Jump("nope".into())),
            13 => with(vec![], Target::Notrack),
            _ => Rule {
                src: IpNet::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8).map(Neg::plain),
                ..with(vec![], Target::Accept)
            },
        }
    }

    const POOL: usize = 15;

    fn chain(name: &str, policy: Option<Policy>, rules: Vec<Rule>) -> Chain {
        Chain {
            name: name.into(),
            policy,
            counters: Default::default(),
            rules: rules.into(),
            location: Location::default(),
        }
    }

    fn random_ruleset(rng: &mut Rng) -> Ruleset {
        let rules = |rng: &mut Rng, n: usize| -> Vec<Rule> {
            // Mostly harmless rules, so that most rulesets are valid.
            (0..rng.below(n))
                .map(|_| match rng.below(4) {
                    0 => pool(rng.below(POOL)),
                    _ => pool([0, 8, 14][rng.below(3)]),
                })
                .collect()
        };
        let table = |kind: TableKind, chains: Vec<Chain>| Table {
            family: Family::Ipv4,
            kind,
            chains,
            location: Location::default(),
        };
        Ruleset {
            name: "r".into(),
            priority: 0,
            tables: vec![
                table(
                    TableKind::Filter,
                    vec![
                        chain("INPUT", Some(Policy::Accept), rules(rng, 12)),
                        chain("FORWARD", Some(Policy::Drop), rules(rng, 6)),
                        chain("OUTPUT", Some(Policy::Accept), rules(rng, 6)),
                        chain("A", None, rules(rng, 6)),
                        chain("B", None, rules(rng, 6)),
                    ],
                ),
                table(
                    TableKind::Raw,
                    vec![
                        chain("PREROUTING", Some(Policy::Accept), rules(rng, 6)),
                        chain("OUTPUT", Some(Policy::Accept), rules(rng, 6)),
                        chain("A", None, rules(rng, 4)),
                    ],
                ),
            ],
        }
    }

    fn mutate(rng: &mut Rng, rs: &mut Ruleset) {
        for _ in 0..1 + rng.below(2) {
            let t = rng.below(rs.tables.len());
            let table = &mut rs.tables[t];
            if rng.below(15) == 0 {
                table.chains.push(chain("C", None, vec![pool(0)]));
                continue;
            }
            let c = rng.below(table.chains.len());
            let rules = &mut table.chains[c].rules;
            let at = rng.below(rules.len() + 1);
            let removed = rng.below(3).min(rules.len() - at);
            let added: Vec<Rule> = (0..rng.below(3)).map(|_| pool(rng.below(POOL))).collect();
            for _ in 0..removed {
                rules.remove(at);
            }
            for (k, r) in added.into_iter().enumerate() {
                rules.insert(at + k, r);
            }
        }
    }

    /// A filter table whose INPUT jumps to `C0`, each `Ci` with the rules `rules(i)`.
    fn chains_table(n: usize, rules: impl Fn(usize) -> Vec<Rule>) -> Ruleset {
        let mut chains = vec![chain(
            "INPUT",
            Some(Policy::Accept),
            vec![Rule {
                target: Target::Jump("C0".into()),
                ..Rule::default()
            }],
        )];
        chains.extend((0..n).map(|i| chain(&format!("C{i}"), None, rules(i))));
        Ruleset {
            name: "deep".into(),
            priority: 0,
            tables: vec![Table {
                family: Family::Ipv4,
                kind: TableKind::Filter,
                chains,
                location: Location::default(),
            }],
        }
    }

    fn jump(to: usize) -> Rule {
        Rule {
            target: Target::Jump(format!("C{to}")),
            ..Rule::default()
        }
    }

    /// Runs `f` on a thread with a 256 KiB stack (a recursion on chain depth overflows it).
    fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let t = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(f)
            .expect("spawn");
        match t.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    }

    /// 100k chains jumping in one line: the depth is found without recursion (the recursive
    /// DFS overflowed this stack, and a tokio worker's at 12k).
    #[test]
    fn a_long_line_of_jumps_is_too_deep_on_a_small_stack() {
        const N: usize = 100_000;
        let v = small_stack(|| {
            let rs = chains_table(N, |i| if i + 1 < N { vec![jump(i + 1)] } else { vec![] });
            validate(&rs, None)
        });
        let kinds: Vec<&ViolationKind> = v.iter().map(|v| &v.kind).collect();
        assert_eq!(kinds, [&ViolationKind::TooDeep(N)]);
        assert_eq!(v[0].chain.as_deref(), Some("INPUT"));
    }

    /// A loop through 100k chains, and 100k loops through a line of them: every loop is
    /// reported, each naming at most 17 items, so the cost stays linear.
    #[test]
    fn long_loops_are_named_in_short() {
        const N: usize = 100_000;
        let (one, many) = small_stack(|| {
            let ring = chains_table(N, |i| vec![jump((i + 1) % N)]);
            let back = chains_table(N, |i| {
                let mut r = vec![jump(0)];
                if i + 1 < N {
                    r.push(jump(i + 1));
                }
                r
            });
            (validate(&ring, None), validate(&back, None))
        });
        let loops = |v: &[Violation]| -> Vec<Vec<String>> {
            v.iter()
                .filter_map(|v| match &v.kind {
                    ViolationKind::Loop(names) => Some(names.clone()),
                    _ => None,
                })
                .collect()
        };
        let ring = loops(&one);
        assert_eq!(ring.len(), 1);
        assert_eq!(ring[0].len(), LOOP_NAMES + 1);
        assert_eq!(ring[0][0], "C0");
        assert_eq!(
            ring[0][LOOP_NAMES / 2],
            format!("... ({} more)", N + 1 - 16)
        );
        assert_eq!(ring[0][LOOP_NAMES], "C0");
        assert_eq!(ring[0][LOOP_NAMES - 1], format!("C{}", N - 1));
        let back = loops(&many);
        assert_eq!(back.len(), N);
        assert!(back.iter().all(|l| l.len() <= LOOP_NAMES + 1));
        // The first loop: C0 jumping to itself; a short one is named in full.
        assert_eq!(back[0], ["C0", "C0"]);
        assert_eq!(back[3], ["C0", "C1", "C2", "C3", "C0"]);
    }

    #[test]
    fn validate_after_matches_validate() {
        let with_s1: BTreeMap<String, Arc<dyn IpSet>> = BTreeMap::from([(
            "s1".to_string(),
            Arc::new(FrozenSet::new([])) as Arc<dyn IpSet>,
        )]);
        let without: BTreeMap<String, Arc<dyn IpSet>> = BTreeMap::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut checked, mut invalid, mut fast) = (0, 0, 0);
        while checked < 4000 {
            let old = random_ruleset(&mut rng);
            if has_errors(&validate(&old, Some(&with_s1))) {
                continue;
            }
            let mut new = old.clone();
            mutate(&mut rng, &mut new);
            let sets: &dyn SetRegistry = if rng.below(4) == 0 {
                &without
            } else {
                &with_s1
            };
            let full = validate(&new, Some(sets));
            let (after, diffs) = validate_after(&new, &old, Some(sets));
            assert_eq!(after, full, "old {old:#?}\nnew {new:#?}");
            for (ti, t) in new.tables.iter().enumerate() {
                let ot = old.table(t.family, t.kind).expect("same tables");
                for (ci, d) in diffs.tables[ti].iter().enumerate() {
                    let d = d.expect("same chains: every chain diffed");
                    assert_eq!(
                        d,
                        diff_rules(&ot.chains[ci].rules, &t.chains[ci].rules, |_, _| {})
                    );
                }
            }
            invalid += usize::from(has_errors(&full));
            fast += usize::from(diffs.tables.iter().all(|t| !t.is_empty()));
            checked += 1;
        }
        // Both outcomes and both paths were exercised.
        assert!(invalid > 400 && invalid < 3600, "{invalid} invalid of 4000");
        assert!(fast > 2000, "{fast} of 4000 diffed every table");
    }

    #[test]
    fn unchanged_rule_reached_from_a_new_hook_is_checked_again() {
        // `-m mac` in A is fine while only INPUT jumps to A; a new OUTPUT rule jumping to A
        // makes that unchanged rule an error.
        let mut rs = random_ruleset(&mut Rng(1));
        let filter = &mut rs.tables[0];
        for c in &mut filter.chains {
            c.rules.clear();
        }
        filter.chains[0].rules.push(pool(2));
        filter.chains[3].rules.push(pool(1));
        assert!(!has_errors(&validate(&rs, None)));
        let mut next = rs.clone();
        next.tables[0].chains[2].rules.push(pool(2));
        let (v, _) = validate_after(&next, &rs, None);
        assert!(
            v.iter().any(|v| v.kind
                == ViolationKind::WrongHook {
                    what: "-m mac",
                    hook: Hook::Output
                }),
            "{v:?}"
        );
        assert_eq!(v, validate(&next, None));
    }
}

#[cfg(test)]
mod reach_tests {
    //! [`ViolationKind::HookNotReached`]: a chain reached only from hooks the node never
    //! evaluates is a warning at its first rule, through [`validate`] and [`validate_after`].

    use std::sync::Arc;

    use super::*;
    use crate::restore::{ParseOptions, parse_ruleset};
    use crate::sets::{IpSet, SetRegistry};

    /// A registry with no set that says which hooks are evaluated.
    struct Reach(Arc<ReachedHooks>);

    impl SetRegistry for Reach {
        fn lookup(&self, _name: &str) -> Option<Arc<dyn IpSet>> {
            None
        }
        fn reached_hooks(&self) -> Option<Arc<ReachedHooks>> {
            Some(self.0.clone())
        }
    }

    const TEXT: &str = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        -A PREROUTING -p udp --dport 53 -j CT --notrack\n\
        -A OUTPUT -p udp --sport 53 -j CT --notrack\nCOMMIT\n\
        *filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:FWD - [0:0]\n\
        :UNUSED - [0:0]\n\
        -A INPUT -p tcp --dport 22 -j ACCEPT\n-A FORWARD -j FWD\n\
        -A FWD -d 10.0.0.2/32 -j ACCEPT\n-A FWD -d 10.0.0.3/32 -j ACCEPT\n\
        -A UNUSED -j ACCEPT\nCOMMIT\n";

    fn unreached(v: &[Violation]) -> Vec<String> {
        v.iter()
            .filter(|v| matches!(v.kind, ViolationKind::HookNotReached { .. }))
            .map(|v| {
                assert_eq!(v.severity, Severity::Warning, "{v}");
                v.to_string()
            })
            .collect()
    }

    #[test]
    fn chains_only_unsteered_hooks_reach_are_warned_at_their_first_rule() {
        let rs = parse_ruleset("host", TEXT, &ParseOptions::default()).unwrap();
        let only_input = Reach(Arc::new(ReachedHooks::delivered(
            &[Hook::Input],
            &[Hook::Input],
            "the packet source delivers every packet at INPUT",
        )));
        let got = unreached(&validate(&rs, Some(&only_input)));
        assert_eq!(
            got,
            [
                "5:1: warning: raw/OUTPUT#1: rules 1-1 of this chain (lines 5-5) are never \
                 evaluated on this node: the chain is reached only from OUTPUT, and the packet \
                 source delivers every packet at INPUT",
                "14:1: warning: filter/FORWARD#1: rules 1-1 of this chain (lines 14-14) are \
                 never evaluated on this node: the chain is reached only from FORWARD, and the \
                 packet source delivers every packet at INPUT",
                "15:1: warning: filter/FWD#1: rules 1-2 of this chain (lines 15-16) are never \
                 evaluated on this node: the chain is reached only from FORWARD, and the packet \
                 source delivers every packet at INPUT",
            ],
            "raw PREROUTING (run for INPUT-queued packets) and the unused chain are not warned"
        );
        // Incremental validation keeps the warnings of unchanged rules.
        let next = TEXT.replace("--dport 22", "--dport 2222");
        let rs2 = parse_ruleset("host", &next, &ParseOptions::default()).unwrap();
        let (after, _) = validate_after(&rs2, &rs, Some(&only_input));
        assert_eq!(unreached(&after), got);
        assert_eq!(after, validate(&rs2, Some(&only_input)));
    }

    #[test]
    fn every_hook_steered_or_unknown_warns_nothing() {
        let rs = parse_ruleset("host", TEXT, &ParseOptions::default()).unwrap();
        let all = [Hook::Input, Hook::Forward, Hook::Output];
        let steered = Reach(Arc::new(ReachedHooks::delivered(&all, &all, "")));
        assert!(unreached(&validate(&rs, Some(&steered))).is_empty());
        assert!(unreached(&validate(&rs, None)).is_empty());
        // Forwarding off for IPv4 only: the IPv4 FORWARD chains are warned.
        let no_fwd = Reach(Arc::new(ReachedHooks::delivered(
            &[Hook::Input, Hook::Output],
            &all,
            "IPv4 forwarding is off",
        )));
        assert_eq!(unreached(&validate(&rs, Some(&no_fwd))).len(), 2);
    }
}
