//! An nft ruleset lowered onto the engine's rule model ([`crate::model`]), so the one
//! classifier and the same counters enforce it: [`lower`].
//!
//! What it makes of a [`Ruleset`]:
//! - tables: all chains of the ip and inet tables go into one [`TableKind::Nft`] table of
//!   family IPv4, those of the ip6 and inet tables into one of IPv6 (an inet chain is in both,
//!   and a rule that only IPv4 can match, such as `ip saddr ...` or `meta nfproto ipv4`, is
//!   left out of the IPv6 copy, as nft's implied `meta nfproto` makes it never match there).
//!   A chain is named `FAMILY TABLE CHAIN` ([`chain_name`]), so tables of any name coexist;
//! - base chains keep their hook, priority and policy ([`crate::model::ChainHook`]): the
//!   snapshot runs the base chains of a hook in priority order with the x_tables tables at
//!   their kernel priorities, and those below conntrack's -200 before its lookup;
//! - `type filter` and `type route` chains, and every regular chain they reach by jump,
//!   goto or verdict map, are enforced: each statement lowers onto the model's matches and
//!   targets, or the ruleset is refused naming it at its position. `type nat` base chains
//!   and the regular chains only they reach are stored only (the nft text keeps them; with
//!   `--kernel-tables` the kernel runs them), as the iptables nat table: listed in
//!   [`Lowered::stored_only`], never dropped silently;
//! - a chain that runs before conntrack (reached from a base chain below priority -200) has
//!   no connection to read: a `ct` expression or `ct mark set` there is refused by name (the
//!   kernel reads such a packet as `ct state invalid`);
//! - a rule with several actions (`log ... accept`, `meta mark set 1 accept`) becomes a jump
//!   to a helper chain `NAME #N` (N the rule's 1-based place) holding one model rule per
//!   action, so each action runs once and matches written after an action still gate what
//!   follows them;
//! - `limit rate over R` and `EXPR != { a, b }` (where no single model match holds the
//!   negation) become a jump to a helper chain whose first rules return when the limit (or an
//!   element) holds, followed by the rest of the rule;
//! - a `limit` in an inet chain keeps one token bucket per family (the IPv4 and the IPv6
//!   copy of the rule), where the kernel keeps one for both: a rate shared by IPv4 and IPv6
//!   packets passes up to twice as many;
//! - an anonymous set of ports is one multiport match (up to its 15 slots); other anonymous
//!   sets and verdict maps become one model rule per element (nft's interval sets
//!   hold disjoint elements, so a packet matches at most one of them), sized before they are
//!   built ([`MAX_EXPANDED_RULES`]); a named verdict map whose key an engine set holds (as
//!   named sets below) is an engine verdict map ([`crate::sets::verdict`]) and one rule with
//!   [`crate::model::Target::Vmap`], its elements changed without a commit; one whose key
//!   no engine set holds (`oifname`) is lowered with the elements it has at the commit, so
//!   changing them is a commit;
//! - `notrack` in a chain that runs after conntrack does nothing, as in the kernel (the
//!   packet has its entry already);
//! - named sets become engine sets ([`Lowered::sets`]) named `FAMILY.TABLE.SET`
//!   ([`set_name`]): `ipv4_addr`/`ipv6_addr` sets as `hash:ip` (`hash:net` with `flags
//!   interval`), `ADDR . inet_proto . inet_service` sets as `hash:ip,port`, `inet_service`
//!   sets (`tcp dport @ports`, behind the protocol) as `bitmap:port`; the elements of a
//!   verdict map carry their verdicts (`jump`/`goto` a chain of the table). Their elements
//!   change without a commit through the sets API, as `nft add element` changes them
//!   (`nft add element inet filter allowed { 10.0.0.1 }` is an add to `inet.filter.allowed`).
//!
//! Commit path: allocates in proportion to the ruleset, reads no clock, does no I/O.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{
    BitOp, ChainType, CtKey, Elem, ErrorKind, Expr, FibResult, Hook as NftHook, Log, MapData,
    Match as NftMatch, MetaKey, NatKind, NftError, NftErrors, Op, Payload, Policy as NftPolicy,
    Pos, Proto, Reject, Ruleset, SetRhs, SetType as NftSetType, SetValue, Stmt, Table, Value,
    Verdict,
};
use crate::model::{
    self, AddrRange, AddrTypeMatch, ChainHook, ConnmarkTarget, ConntrackMatch, Family, Hook,
    IcmpMatch, IdRange, Iface, IpNet, IprangeMatch, LimitMatch, LogTarget, MarkValue, Match,
    MultiportDir, MultiportMatch, Neg, NflogTarget, OpaqueOption, OwnerMatch, PktType, PortRange,
    RateUnit, RejectWith, RpfilterMatch, RuleList, SetDir, SetMatch, TableKind, Target, TcpFlags,
    TcpMatch, TtlMatch, TtlOp, UdpMatch,
};
use crate::sets::{AddOptions, Element, SetSpec, SetType};

mod rule;

/// The most model rules one nft rule may become through anonymous sets and verdict maps
/// (counted before any is built): past it the rule is refused as too large.
pub const MAX_EXPANDED_RULES: usize = 4096;

/// The most model rules one lowered ruleset may hold (both families, helper chains
/// included), counted as they are made: past it the ruleset is refused as too large.
pub const MAX_LOWERED_RULES: usize = 2_000_000;

/// What [`lower`] made of an nft ruleset.
#[derive(Clone, Debug, PartialEq)]
pub struct Lowered {
    /// The engine's ruleset: at most one [`TableKind::Nft`] table per family.
    pub ruleset: model::Ruleset,
    /// The named sets enforced chains refer to, as engine sets to create before the commit.
    pub sets: Vec<LoweredSet>,
    /// The chains stored but not enforced (nat chains and what only they reach).
    pub stored_only: Vec<StoredOnly>,
    /// Where each lowered nft rule counts, per family: the sum of these model rules' counters
    /// is the packets that passed all of the rule's matches (what its `counter` statement
    /// counts when it stands before the verdict, as nft writes it).
    pub counted: Vec<CountedAt>,
}

/// The model rules that count one nft rule's packets in one family ([`Lowered::counted`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountedAt {
    /// The nft rule's position.
    pub rule: Pos,
    /// The family of the model table.
    pub family: Family,
    /// The model chain (the rule's own, or the helper chain its action runs in).
    pub chain: String,
    /// 1-based rule numbers in that chain.
    pub rules: std::ops::Range<u32>,
}

/// A named nft set as an engine set ([`crate::sets::SetManager::create`] and `add`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoweredSet {
    /// The engine set's name, [`set_name`].
    pub name: String,
    /// Type, family and timeout.
    pub spec: SetSpec,
    /// The elements with their own timeouts (an interval that is not a prefix is split into
    /// the prefixes that cover it), for [`crate::sets::SetManager::add`].
    pub elements: Vec<(Element, AddOptions)>,
    /// Where the set was declared.
    pub pos: Pos,
}

/// A chain the engine stores but does not enforce, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredOnly {
    /// [`chain_name`] of the chain.
    pub chain: String,
    /// Where it was declared.
    pub pos: Pos,
    /// Why: `type nat`, or reached only from nat chains or from no base chain.
    pub why: &'static str,
}

/// The engine chain name of chain `chain` of nft table `FAMILY TABLE`: `FAMILY TABLE CHAIN`.
pub fn chain_name(family: super::Family, table: &str, chain: &str) -> String {
    format!("{} {table} {chain}", family.name())
}

/// The engine set name of named set `@set` of nft table `FAMILY TABLE`: `FAMILY.TABLE.SET`
/// (at most [`crate::sets::ipset::MAX_NFT_NAME_LEN`] bytes; a longer one is refused where it
/// is used).
pub fn set_name(family: super::Family, table: &str, set: &str) -> String {
    format!("{}.{table}.{set}", family.name())
}

/// Lowers `rs` (parsed from `text` of file `file`, which only positions errors: `""` for
/// JSON input, whose errors carry the rule's position) into the engine ruleset `name` at
/// ruleset priority `priority` (the tie-break among base chains of equal netfilter priority).
///
/// Errors: every statement of an enforced chain that the engine does not run, named at its
/// position ([`ErrorKind::Unsupported`]); expansions past [`MAX_EXPANDED_RULES`], rulesets
/// past [`MAX_LOWERED_RULES`] and engine sets past [`super::MAX_SET_ELEMENTS`] elements
/// ([`ErrorKind::TooLarge`]).
pub fn lower(
    rs: &Ruleset,
    file: &str,
    text: &str,
    name: &str,
    priority: i32,
) -> Result<Lowered, NftErrors> {
    let mut out = Lowered {
        ruleset: model::Ruleset {
            name: name.to_string(),
            priority,
            tables: Vec::new(),
        },
        sets: Vec::new(),
        stored_only: Vec::new(),
        counted: Vec::new(),
    };
    let mut tables: [Vec<model::Chain>; 2] = [Vec::new(), Vec::new()];
    let mut errors = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut sets_seen: HashSet<String> = HashSet::new();
    let mut made = 0usize;
    for table in &rs.tables {
        let (enforced, before_ct) = enforced_chains(table, &mut out.stored_only);
        for (ci, chain) in table.chains.iter().enumerate() {
            if !enforced[ci] {
                continue;
            }
            for &fam in families(table.family) {
                let mut cx = rule::Cx {
                    file,
                    lines: &lines,
                    table,
                    family: fam,
                    before_ct: before_ct[ci],
                    helpers: Vec::new(),
                    helper_rules: 0,
                    sets: Vec::new(),
                };
                let name = chain_name(table.family, &table.name, &chain.name);
                let mut rules = Vec::new();
                for (ri, r) in chain.rules.iter().enumerate() {
                    match cx.lower_rule(r, &name, ri + 1) {
                        Ok((mut rs, counted)) => {
                            if let Some(c) = counted {
                                let (chain, base) = match c.helper {
                                    Some(h) => (h, 0),
                                    None => (name.clone(), rules.len()),
                                };
                                let first = (base + c.first + 1) as u32;
                                out.counted.push(CountedAt {
                                    rule: r.pos,
                                    family: fam,
                                    chain,
                                    rules: first..first + c.len as u32,
                                });
                            }
                            rules.append(&mut rs);
                        }
                        Err(e) => errors.push(e),
                    }
                    if made + rules.len() + cx.helper_rules > MAX_LOWERED_RULES {
                        errors.push(NftError::new(
                            file,
                            r.pos,
                            "",
                            ErrorKind::TooLarge(format!(
                                "the ruleset lowers to more than {MAX_LOWERED_RULES} rules"
                            )),
                        ));
                        return Err(NftErrors(errors));
                    }
                }
                made += rules.len() + cx.helper_rules;
                let loc = location(chain.pos);
                let (nft_hook, policy) = match chain.base {
                    Some(b) => (
                        Some(ChainHook {
                            hook: hook(b.hook),
                            priority: b.priority,
                        }),
                        Some(match b.policy {
                            NftPolicy::Accept => model::Policy::Accept,
                            NftPolicy::Drop => model::Policy::Drop,
                        }),
                    ),
                    None => (None, None),
                };
                let t = &mut tables[usize::from(fam == Family::Ipv6)];
                t.push(model::Chain {
                    name,
                    policy,
                    counters: model::Counters::default(),
                    rules: RuleList::from(rules),
                    location: loc,
                    nft_hook,
                });
                for (hname, hrules) in cx.helpers.drain(..) {
                    t.push(model::Chain {
                        name: hname,
                        policy: None,
                        counters: model::Counters::default(),
                        rules: RuleList::from(hrules),
                        location: loc,
                        nft_hook: None,
                    });
                }
                for s in cx.sets.drain(..) {
                    if sets_seen.insert(s.name.clone()) {
                        out.sets.push(s);
                    }
                }
            }
        }
    }
    if !errors.is_empty() {
        errors.sort_by_key(|e: &NftError| e.pos);
        return Err(NftErrors(errors));
    }
    for (fam, chains) in [Family::Ipv4, Family::Ipv6].into_iter().zip(tables) {
        if !chains.is_empty() {
            out.ruleset.tables.push(model::Table {
                family: fam,
                kind: TableKind::Nft,
                chains,
                location: model::Location::default(),
            });
        }
    }
    Ok(out)
}

fn families(f: super::Family) -> &'static [Family] {
    match f {
        super::Family::Ip => &[Family::Ipv4],
        super::Family::Ip6 => &[Family::Ipv6],
        super::Family::Inet => &[Family::Ipv4, Family::Ipv6],
    }
}

fn hook(h: NftHook) -> Hook {
    match h {
        NftHook::Prerouting => Hook::Prerouting,
        NftHook::Input => Hook::Input,
        NftHook::Forward => Hook::Forward,
        NftHook::Output => Hook::Output,
        NftHook::Postrouting => Hook::Postrouting,
    }
}

fn location(p: Pos) -> model::Location {
    model::Location {
        line: p.line,
        column: p.column,
    }
}

/// The chains of `table` the engine enforces (`type filter`/`type route` base chains and the
/// chains they reach; the others are noted in `stored_only`), and those of them that a base
/// chain below conntrack's priority reaches (they run before the conntrack lookup).
fn enforced_chains(table: &Table, stored_only: &mut Vec<StoredOnly>) -> (Vec<bool>, Vec<bool>) {
    let index: HashMap<&str, usize> = table
        .chains
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    let edges: Vec<Vec<usize>> = table
        .chains
        .iter()
        .map(|c| {
            let mut to = Vec::new();
            for r in &c.rules {
                for s in &r.stmts {
                    targets_of(s, table, &mut |name| {
                        if let Some(&i) = index.get(name) {
                            to.push(i);
                        }
                    });
                }
            }
            to
        })
        .collect();
    let reach = |roots: &mut dyn Iterator<Item = usize>| {
        let mut seen = vec![false; table.chains.len()];
        let mut stack: Vec<usize> = roots.collect();
        while let Some(c) = stack.pop() {
            if !std::mem::replace(&mut seen[c], true) {
                stack.extend(edges[c].iter().copied());
            }
        }
        seen
    };
    let base_of = |k: fn(ChainType) -> bool| {
        table
            .chains
            .iter()
            .enumerate()
            .filter(move |(_, c)| c.base.is_some_and(|b| k(b.kind)))
            .map(|(i, _)| i)
    };
    let enforced = reach(&mut base_of(|k| k != ChainType::Nat));
    let before_ct = reach(
        &mut table
            .chains
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.base.is_some_and(|b| {
                    b.kind != ChainType::Nat && b.priority < model::CONNTRACK_PRIORITY
                })
            })
            .map(|(i, _)| i),
    );
    let nat = reach(&mut base_of(|k| k == ChainType::Nat));
    for (i, c) in table.chains.iter().enumerate() {
        if enforced[i] {
            continue;
        }
        let why = if c.base.is_some() {
            "a `type nat` chain: stored, not enforced by the engine (as the iptables nat table)"
        } else if nat[i] {
            "reached only from `type nat` chains: stored, not enforced by the engine"
        } else {
            "reached from no base chain: stored, not enforced"
        };
        stored_only.push(StoredOnly {
            chain: chain_name(table.family, &table.name, &c.name),
            pos: c.pos,
            why,
        });
    }
    (enforced, before_ct)
}

/// Calls `f` with every chain statement `s` jumps or goes to (verdicts, verdict maps, named
/// verdict maps of `table`).
fn targets_of(s: &Stmt, table: &Table, f: &mut dyn FnMut(&str)) {
    let mut verdict = |v: &Verdict| {
        if let Verdict::Jump(c) | Verdict::Goto(c) = v {
            f(c);
        }
    };
    match s {
        Stmt::Verdict(v) => verdict(v),
        Stmt::Vmap { map, .. } => match map {
            SetRhs::Set(elems) => {
                for e in elems {
                    if let Some(MapData::Verdict(v)) = &e.data {
                        verdict(v);
                    }
                }
            }
            SetRhs::Ref(name) => {
                for set in table.sets.iter().filter(|s| &s.name == name) {
                    for e in &set.elements {
                        if let Some(MapData::Verdict(v)) = &e.data {
                            verdict(v);
                        }
                    }
                }
            }
            SetRhs::Value(_) => {}
        },
        _ => {}
    }
}
