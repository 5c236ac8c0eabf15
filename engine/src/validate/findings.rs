//! What validation reports: a [`Violation`] (where, how serious) and its [`ViolationKind`]
//! (what is wrong; its `Display` is the message). Commit path; plain data, no checks here.

use std::fmt;

use crate::snapshot::MAX_CALL_DEPTH;

use crate::model::{Family, Hook, Location, TableKind};

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
        /// Why those hooks are not evaluated ([`ReachedHooks::why`](super::ReachedHooks::why)).
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
    /// limit with a zero rate or burst, a rate above 10000/second or a burst above 10000, or
    /// a rate and burst whose product overflows the kernel's credits (xt_limit refuses them).
    #[error(
        "limit needs a rate of 1 to 10000/second and a burst of 1 to 10000 whose product the kernel's credits hold (xt_limit: \"Overflow, try lower\")"
    )]
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
    /// registry that has none ([`SetRegistry::node_addrs`](crate::sets::SetRegistry::node_addrs)).
    #[error(
        "-m addrtype {0} needs the node's addresses, which this engine was not given (vallumd reads the host's, or takes --local-addresses)"
    )]
    NodeAddrsUnknown(String),
    /// `-m rpfilter` in an enforced table, validated against a registry whose node handle has
    /// no routing view ([`crate::node_addrs::NodeAddrs::load_routes`] is `None`).
    #[error(
        "-m rpfilter needs the node's routing rules and tables, which this engine was not given (vallumd reads the host's over rtnetlink, or takes --routes)"
    )]
    NodeRoutesUnknown,
    /// `-m rpfilter` outside the raw and mangle tables (the kernel's `rpfilter_check`
    /// refuses it).
    #[error("-m rpfilter is only valid in tables raw and mangle, not {0} (as the kernel)")]
    RpfilterTable(TableKind),
    /// `-m pkttype` in an enforced chain reached at PREROUTING or INPUT (warning): the
    /// class is derived from the destination address, not read from the frame.
    #[error(
        "-m pkttype --pkt-type {0}: the class is derived from the IP destination (multicast, broadcast, else unicast) because NFQUEUE does not give the frame's destination MAC; a frame whose link-layer destination disagrees (an L2 broadcast or multicast carrying a unicast IP) is classed differently from the kernel"
    )]
    PktTypeDerived(&'static str),
    /// `-m pkttype` in an enforced table, validated against a registry that has no node
    /// addresses: the subnet broadcast addresses are unknown.
    #[error(
        "-m pkttype needs the node's local table (its broadcast addresses), which this engine was not given (vallumd reads the host's, or takes --local-addresses)"
    )]
    PktTypeNoAddrs,
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
    /// `-m string` on a node whose packet source keeps no packet bytes (warning): the rule
    /// never sees a payload there, so `--string` is false and `! --string` true.
    #[error(
        "-m string searches the packet's bytes, which {0}: here --string never matches and ! --string always does"
    )]
    NoPacketBytes(String),
    /// A filter or raw rule that waits for what the ruleset's stored-only nat or mangle table
    /// does (warning, at the rule): that table is not run here, and the kernel does not run
    /// it either (no `--kernel-tables`), so the rule never sees it.
    #[error(
        "{what} waits for what table {table} does ({target} at line {line}); {table} is stored only here and not handed to the kernel, so this rule never sees it: run vallumd with --kernel-tables {table} (e.g. --kernel-tables nat,mangle) and the kernel's facts reach the rule with the packet"
    )]
    WaitsForTable {
        /// The rule's match that waits, e.g. "--ctstate DNAT" or "-m mark".
        what: String,
        /// The table it waits for (nat or mangle).
        table: TableKind,
        /// The target there that does it (DNAT, MARK, ...).
        target: String,
        /// The line of that rule (0 for structured input).
        line: u32,
    },
    /// More distinct kernel-decided expressions ([`crate::kernel_decided`]) over the active
    /// rulesets than the steering's facts field has bits (error, at the first rule whose
    /// expression finds no bit).
    #[error(
        "{text} is decided by the kernel's steering, one bit of the facts field each, and the field's {bits} bits are taken by other expressions of the active rulesets (widen --nfqueue-facts-mark and vallumctl dataplane install --facts-mark, or use fewer distinct expressions)"
    )]
    TooManyKernelFacts {
        /// The expression, as iptables-save prints it.
        text: String,
        /// The field's width.
        bits: u8,
    },
    /// A match other than `-m string` that reads the packet's bytes (`-m sctp
    /// --chunk-types`, `-m u32`) in an enforced table on a node whose packet source keeps
    /// none (warning): it never matches here (and negated, always does).
    #[error(
        "{what} reads the packet's bytes, which {why}: here it never matches (negated, it always does)"
    )]
    NoBytesFor {
        /// The match and option, e.g. "-m sctp --chunk-types".
        what: &'static str,
        /// Why the source has no bytes ([`super::ReachedHooks::no_bytes`]).
        why: String,
    },
    /// `--ctstate` / `--state` naming only ESTABLISHED and RELATED (warning) on a node whose
    /// steering queues only the other packets ([`super::ReachedHooks::new_only`]): the
    /// packets it could match are accepted in the kernel before they reach the rules, so it
    /// never matches (and with `!` always does). Fields: the option as written, and why.
    #[error(
        "{0} matches only packets of established or related connections, which {1}: here it never matches{neg}",
        neg = if .0.starts_with('!') { " (and its negation always does)" } else { "" }
    )]
    StateNotQueued(String, String),
    /// A rule that can match only loopback packets (`-i lo`, `-o lo`, a source or destination
    /// inside 127.0.0.0/8 or `::1`) on a node whose steering never queues them
    /// ([`super::ReachedHooks::without_loopback`]): it never matches there. Fields: what in
    /// the rule says loopback (`-o lo`), and why they do not come.
    #[error(
        "{0}: the rule matches only loopback packets, which {1}: here it never matches (steer loopback with `vallumctl dataplane install --include-loopback` and tell vallumd with --steered-loopback)"
    )]
    LoopbackNotSteered(String, String),
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
