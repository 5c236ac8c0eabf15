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
//!   links"); call depth at most [`crate::snapshot::MAX_CALL_DEPTH`];
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
//!   first rule naming its rules and why ([`ViolationKind::HookNotReached`]); where only new
//!   connections are steered ([`ReachedHooks::new_only`]), a `--ctstate` / `--state` that
//!   matches only ESTABLISHED and RELATED packets gets a warning ([`ViolationKind::StateNotQueued`]);
//!   where loopback is not steered ([`ReachedHooks::without_loopback`]), a rule that can match
//!   only loopback packets gets one ([`ViolationKind::LoopbackNotSteered`]);
//! - tables only stored: with the node's [`ReachedHooks`], a filter or raw rule that waits for
//!   what the ruleset's stored-only nat or mangle table does (`--ctstate DNAT/SNAT`,
//!   `--ctorig*`/`--ctrepl*`, `--ctstatus` after its DNAT/SNAT; `-m mark` after its MARK)
//!   gets a warning at the rule naming the table and `--kernel-tables` (`kernel_facts`), unless
//!   the kernel runs that table ([`ReachedHooks::with_kernel_tables`]);
//! - enforcement: extensions the engine does not run ([`crate::model::Match::Opaque`], CT
//!   options other than `--notrack`, conntrack options other than `--ctstate`) are errors in
//!   filter and raw, naming the extension; nat, mangle and security tables get a warning.
//!
//! Validation is on the commit path: it may allocate (in proportion to the ruleset) but it
//! reads no clock, takes no lock and does no I/O. Its parts:
//! - `findings`: [`Severity`], [`Violation`] and [`ViolationKind`], what it reports;
//! - `structure`: tables, chains, the jump graph (loops, depth) and which hooks reach a chain;
//! - `matches`: each rule's own fields (`-s`, `-d`, `-i`, `-o`, `-p`, `-f`) and its `-m` matches;
//! - `targets`: each rule's target.

use std::collections::HashSet;

use crate::model::{Chain, Family, Hook, Location, Rule, Ruleset, Table, TableKind};
use crate::sets::SetRegistry;

mod findings;
mod kernel_facts;
mod matches;
mod structure;
mod targets;

pub use findings::{Severity, Violation, ViolationKind};

/// Which hooks the node's packet path evaluates, per family, and why not the others (for
/// messages): what a packet source and its steering deliver. A packet queued at INPUT or
/// FORWARD has passed PREROUTING (the engine runs raw PREROUTING for it first), so steering
/// either of them reaches PREROUTING too; POSTROUTING is never evaluated (no enforced table
/// has it). Also whether the source keeps each packet's bytes, which `-m string` searches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReachedHooks {
    /// Bit `1 << Hook::index()` per evaluated hook; `[IPv4, IPv6]`.
    bits: [u8; 2],
    /// Why the other hooks are not evaluated, e.g. "the packet source pcap delivers every
    /// packet at INPUT".
    why: String,
    /// Why the packets come without their bytes (`None`: they come with them).
    no_bytes: Option<String>,
    /// Why only packets that are not ESTABLISHED or RELATED in the kernel's conntrack reach
    /// the packet path (`None`: every packet does).
    new_only: Option<String>,
    /// Why loopback packets (in or out of `lo`) never reach the packet path (`None`: they do).
    no_loopback: Option<String>,
    /// The stored-only tables the kernel runs (`--kernel-tables`): what they do (NAT, marks)
    /// reaches the packet path with the packet.
    kernel_tables: Vec<TableKind>,
    /// The width of the steering's facts field: how many kernel-decided expressions the
    /// kernel evaluates for the packet path ([`crate::kernel_decided`]); 0: none.
    fact_bits: u8,
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
            no_bytes: None,
            new_only: None,
            no_loopback: None,
            kernel_tables: Vec::new(),
            fact_bits: 0,
        }
    }

    /// The same, where the steering evaluates up to `bits` kernel-decided expressions into a
    /// mark field (vallumd's `--nfqueue-facts-mark`; see [`crate::kernel_decided`]).
    pub fn with_fact_bits(self, bits: u8) -> ReachedHooks {
        ReachedHooks {
            fact_bits: bits,
            ..self
        }
    }

    /// How many kernel-decided expressions the steering evaluates (0: none).
    pub fn fact_bits(&self) -> u8 {
        self.fact_bits
    }

    /// The same, for steering that never hands the packet path a loopback packet (one that
    /// comes in on or goes out of `lo`); `why` completes "loopback packets, which ..." (e.g.
    /// "`vallumctl dataplane install` exempts (vallumd is told so: no --steered-loopback)").
    pub fn without_loopback(self, why: impl Into<String>) -> ReachedHooks {
        ReachedHooks {
            no_loopback: Some(why.into()),
            ..self
        }
    }

    /// The same, where the kernel runs `tables` of each ruleset (vallumd's `--kernel-tables`):
    /// filter rules that wait for what they do (a DNAT, a mark) are not warned.
    pub fn with_kernel_tables(self, tables: &[TableKind]) -> ReachedHooks {
        ReachedHooks {
            kernel_tables: tables.to_vec(),
            ..self
        }
    }

    /// Why loopback packets never come, `None` when they do.
    pub fn no_loopback(&self) -> Option<&str> {
        self.no_loopback.as_deref()
    }

    /// Whether the kernel runs table `kind` (see [`ReachedHooks::with_kernel_tables`]).
    pub fn kernel_runs(&self, kind: TableKind) -> bool {
        self.kernel_tables.contains(&kind)
    }

    /// The same, for steering that hands the packet path only packets the kernel's conntrack
    /// does not see as ESTABLISHED or RELATED (it accepts those itself); `why` completes "the
    /// packets of established or related connections, which ..." (e.g. "vallumd is told
    /// (--steered-new-only) the kernel accepts before they are queued").
    pub fn new_only(self, why: impl Into<String>) -> ReachedHooks {
        ReachedHooks {
            new_only: Some(why.into()),
            ..self
        }
    }

    /// Why only new (not ESTABLISHED or RELATED) packets come, `None` when all do.
    pub fn only_new(&self) -> Option<&str> {
        self.new_only.as_deref()
    }

    /// The same, for a source that hands the packet path no packet bytes; `why` completes
    /// "the packet's bytes, which ..." (e.g. "the packet source `pcap:x` does not keep").
    pub fn without_bytes(self, why: impl Into<String>) -> ReachedHooks {
        ReachedHooks {
            no_bytes: Some(why.into()),
            ..self
        }
    }

    /// Why the packets come without their bytes, `None` when they come with them.
    pub fn no_bytes(&self) -> Option<&str> {
        self.no_bytes.as_deref()
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
    kernel_facts::waits_for_tables(ruleset, sets, &mut out);
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
    kernel_facts::waits_for_tables(ruleset, sets, &mut out);
    out.sort_by_key(|v| v.location);
    (out, diffs)
}

/// Whether any violation is an error.
pub fn has_errors(violations: &[Violation]) -> bool {
    violations.iter().any(|v| v.severity == Severity::Error)
}

/// The checks of one `table` of `ruleset`, each violation pushed to `out`; its methods are
/// in `structure`, `matches` and `targets`.
struct TableCheck<'a> {
    ruleset: &'a Ruleset,
    table: &'a Table,
    out: &'a mut Vec<Violation>,
}

// === impl TableCheck ===

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
mod tests;

#[cfg(test)]
mod reach_tests;
