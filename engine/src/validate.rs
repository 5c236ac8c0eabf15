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
//! - enforcement: extensions the engine does not run ([`crate::model::Match::Opaque`], CT
//!   options other than `--notrack`, conntrack options other than `--ctstate`) are errors in
//!   filter and raw, naming the extension; nat, mangle and security tables get a warning.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use crate::compile::MAX_CALL_DEPTH;
use crate::model::{
    Chain, Family, Hook, IpNet, Location, Match, RejectWith, Rule, Ruleset, Table, TableKind,
    Target,
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

/// What is wrong. Each variant's message names the offending item.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ViolationKind {
    /// A nat, mangle or security table: stored and printed, not evaluated (warning).
    #[error("table {0} is stored but not enforced by the engine")]
    TableNotEnforced(TableKind),
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
    /// The jump graph has a cycle through these chains.
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
        if !seen_tables.insert((table.family, table.kind)) {
            v.at_table(ViolationKind::DuplicateTable(table.kind));
            continue;
        }
        if !table.kind.is_enforced() {
            v.push(
                Severity::Warning,
                None,
                None,
                table.location,
                ViolationKind::TableNotEnforced(table.kind),
            );
        }
        v.check(sets);
    }
    out.sort_by_key(|v| v.location);
    out
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
        let table = self.table;
        let hooks = table.kind.builtin_hooks();
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, c) in table.chains.iter().enumerate() {
            if names.insert(&c.name, i).is_some() {
                self.at_chain(c, ViolationKind::DuplicateChain(c.name.clone()));
            }
            if c.name.is_empty()
                || c.name.len() > 28
                || c.name.starts_with(['-', '!'])
                || c.name
                    .chars()
                    .any(|ch| ch.is_whitespace() || ch.is_control() || ch == '"' || ch == '\\')
            {
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
        for (ci, c) in table.chains.iter().enumerate() {
            for (ri, r) in c.rules.iter().enumerate() {
                let (name, jump) = match &r.target {
                    Target::Jump(t) => (t, true),
                    Target::Goto(t) => (t, false),
                    _ => continue,
                };
                match names.get(name.as_str()) {
                    None => self.at_rule(c, ri, r, ViolationKind::UnknownChain(name.clone())),
                    Some(&ti) if table.chains[ti].policy.is_some() => {
                        self.at_rule(c, ri, r, ViolationKind::JumpToBuiltin(name.clone()))
                    }
                    Some(&ti) => edges[ci].push((ti, jump)),
                }
            }
        }

        // Loops and depth: DFS with colours, as mark_source_chains walks the graph.
        let mut state = vec![0u8; n]; // 0 new, 1 on stack, 2 done
        let mut depth = vec![0usize; n];
        let mut loops = Vec::new();
        fn dfs(
            c: usize,
            edges: &[Vec<(usize, bool)>],
            state: &mut [u8],
            depth: &mut [usize],
            path: &mut Vec<usize>,
            loops: &mut Vec<Vec<usize>>,
        ) {
            state[c] = 1;
            path.push(c);
            let mut d = 0;
            for &(t, jump) in &edges[c] {
                match state[t] {
                    1 => {
                        let start = path.iter().position(|&x| x == t).unwrap_or(0);
                        let mut cycle = path[start..].to_vec();
                        cycle.push(t);
                        loops.push(cycle);
                    }
                    0 => dfs(t, edges, state, depth, path, loops),
                    _ => {}
                }
                if state[t] == 2 {
                    d = d.max(depth[t] + usize::from(jump));
                }
            }
            depth[c] = d;
            path.pop();
            state[c] = 2;
        }
        for c in 0..n {
            if state[c] == 0 {
                dfs(
                    c,
                    &edges,
                    &mut state,
                    &mut depth,
                    &mut Vec::new(),
                    &mut loops,
                );
            }
        }
        for cycle in loops {
            let first = &table.chains[cycle[0]];
            let names = cycle
                .iter()
                .map(|&i| table.chains[i].name.clone())
                .collect();
            self.at_chain(first, ViolationKind::Loop(names));
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

        for (ci, c) in table.chains.iter().enumerate() {
            for (ri, r) in c.rules.iter().enumerate() {
                self.check_rule(c, ri, r, reach[ci], sets);
            }
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
                            errs.push(ViolationKind::Unsupported {
                                what: "match",
                                name: format!("conntrack {}", o.name),
                                table: table.kind,
                            });
                        }
                    }
                }
                Match::State(_) | Match::Mark(_) => {}
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
                Match::Opaque(o) => {
                    if enforced {
                        errs.push(ViolationKind::Unsupported {
                            what: "match",
                            name: o.name.clone(),
                            table: table.kind,
                        });
                    }
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
                if let Target::Ct(ct) = &r.target {
                    if enforced && (!ct.notrack || !ct.other.is_empty()) {
                        let name = ct
                            .other
                            .first()
                            .map_or_else(|| "CT".to_string(), |o| format!("CT {}", o.name));
                        errs.push(ViolationKind::Unsupported {
                            what: "target",
                            name,
                            table: table.kind,
                        });
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
            Target::None
            | Target::Accept
            | Target::Drop
            | Target::Return
            | Target::Jump(_)
            | Target::Goto(_) => {}
        }
        for e in errs {
            self.at_rule(c, ri, r, e);
        }
    }
}
