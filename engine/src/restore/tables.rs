//! The block structure of iptables-restore input and the commands' effect on the in-memory
//! tables, as iptables-restore.c (v1.8.11, legacy) applies them line by line.
//!
//! * `#` starts a comment only in column 1; empty (or blank) lines are skipped. Lines that
//!   iptables-restore refuses but that have one clear meaning (CRLF line ends, a line of
//!   blanks, a blank before `*`/`:`/`#`/`COMMIT`, a `COMMIT` with trailing blanks or no
//!   newline) are read as if the blanks were not there, with a warning at the line.
//! * `*table` opens a block, `COMMIT` closes it; commands outside a block are errors, and so is
//!   a block left open.
//! * Without `--noflush` every table named is rebuilt from scratch: its builtin chains exist
//!   with policy ACCEPT and zero counters even when not declared (as iptables does), user chains
//!   exist only once declared (`:NAME - [p:b]` or `-N NAME`) on an earlier line.
//! * `:NAME POLICY [p:b]` sets a builtin chain's policy (`-` keeps it); a user chain's policy
//!   must be `-` and its counters are ignored; declaring an existing user chain again flushes
//!   it (create-or-flush). The counters must be `[p:b]`, and with `--counters` they are
//!   required.

mod commands;
mod read_ahead;
mod reparse;

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

use crate::model::{
    Chain, Counters, Family, Hook, Location, Policy, Rule, RuleList, Table, TableKind, Target,
};

use super::lexer::{Tok, Token};
use super::rule::Ctx;
use super::{
    ExternalRef, ExternalRefKind, ParseError, ParseErrorKind as K, ParseErrors, ParseOptions,
    ParseWarning, ParseWarningKind, Restore,
};
use commands::{apply_line, command_line, declare_chain};
use read_ahead::{Ahead, line_tables, read_ahead, read_command};
pub(crate) use reparse::{parse_after, reparse};

/// At most this many errors are collected; the rest is not reported.
const MAX_ERRORS: usize = 100;

/// A `*table` block being read. Every command costs O(its own size), whatever the number of
/// chains and rules: chains are found by name in [`Block::index`] and whether a chain is the
/// target of a rule (`-X`) is read from [`Block::targeted`].
struct Block {
    /// The table; its chains are in no particular order until COMMIT sorts them.
    table: Table,
    /// Chains whose rules before this text are unknown (noflush: builtin chains and chains only
    /// referenced by commands).
    external_content: HashSet<String>,
    /// The position of each chain of `table.chains`, by name.
    index: HashMap<String, usize>,
    /// How many rules of the table `-j`/`-g` to each chain (entries of 0 are removed).
    targeted: HashMap<String, usize>,
    /// The index of the chain found last by [`Block::chain_index`] (rules come in runs per
    /// chain, and comparing one name is cheaper than hashing it); checked by name before use.
    last_chain: Cell<usize>,
}

/// The chain a rule jumps or goes to, if any.
fn target_chain(r: &Rule) -> Option<&str> {
    match &r.target {
        Target::Jump(t) | Target::Goto(t) => Some(t),
        _ => None,
    }
}

impl Block {
    fn new(family: Family, kind: TableKind, location: Location, noflush: bool) -> Block {
        let chains = kind
            .builtin_hooks()
            .iter()
            .map(|h| Chain {
                name: h.chain_name().to_string(),
                policy: Some(Policy::Accept),
                counters: Counters::default(),
                rules: RuleList::new(),
                location,
                nft_hook: None,
            })
            .collect::<Vec<_>>();
        let external_content = if noflush {
            chains.iter().map(|c| c.name.clone()).collect()
        } else {
            HashSet::new()
        };
        let table = Table {
            family,
            kind,
            chains,
            location,
        };
        Block::with_table(table, external_content)
    }

    /// A block over `table` as it is (a `--noflush` block continuing an earlier one).
    fn with_table(table: Table, external_content: HashSet<String>) -> Block {
        let index = (table.chains.iter().enumerate())
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        let mut b = Block {
            table,
            external_content,
            index,
            targeted: HashMap::new(),
            last_chain: Cell::new(0),
        };
        let chains = std::mem::take(&mut b.table.chains);
        for r in chains.iter().flat_map(|c| &c.rules) {
            b.count_target(r, true);
        }
        b.table.chains = chains;
        b
    }

    fn chain_index(&self, name: &str) -> Option<usize> {
        let last = self.last_chain.get();
        if self.table.chains.get(last).is_some_and(|c| c.name == name) {
            return Some(last);
        }
        let i = *self.index.get(name)?;
        self.last_chain.set(i);
        Some(i)
    }

    /// Adds a chain (its name must be new in the table).
    fn push_chain(&mut self, chain: Chain) {
        self.index
            .insert(chain.name.clone(), self.table.chains.len());
        self.table.chains.push(chain);
    }

    /// Removes chain `i` (which holds no rules), moving the last chain into its place.
    fn remove_chain(&mut self, i: usize) {
        let c = self.table.chains.swap_remove(i);
        self.index.remove(&c.name);
        if let Some(moved) = self.table.chains.get(i) {
            self.index.insert(moved.name.clone(), i);
        }
    }

    /// Counts `r`'s target chain in or out of [`Block::targeted`].
    fn count_target(&mut self, r: &Rule, added: bool) {
        let Some(t) = target_chain(r) else { return };
        if added {
            *self.targeted.entry(t.to_string()).or_insert(0) += 1;
        } else if let Some(n) = self.targeted.get_mut(t) {
            *n -= 1;
            if *n == 0 {
                self.targeted.remove(t);
            }
        }
    }

    /// Appends a rule to chain `i` (a [`crate::model::RuleList`] grows a chunk at a time and
    /// never copies the rules it holds).
    fn append(&mut self, i: usize, rule: Rule) {
        self.count_target(&rule, true);
        self.table.chains[i].rules.push(rule);
    }

    /// Inserts a rule into chain `i` at `pos` (at most its length).
    fn insert(&mut self, i: usize, pos: usize, rule: Rule) {
        self.count_target(&rule, true);
        self.table.chains[i].rules.insert(pos, rule);
    }

    /// Removes rule `pos` of chain `i`.
    fn remove_rule(&mut self, i: usize, pos: usize) {
        let r = self.table.chains[i].rules.remove(pos);
        self.count_target(&r, false);
    }

    /// Removes every rule of chain `i`.
    fn flush(&mut self, i: usize) {
        let rules = std::mem::take(&mut self.table.chains[i].rules);
        for r in &rules {
            self.count_target(r, false);
        }
    }

    /// Renames chain `i` to `new` (a name no chain has), with every rule of the table that
    /// jumps or goes to it: as libiptc's `iptc_rename_chain`, references follow. Only the
    /// rule chunks holding such a rule are copied.
    fn rename_chain(&mut self, i: usize, new: &str) {
        let old = std::mem::replace(&mut self.table.chains[i].name, new.to_string());
        self.index.remove(&old);
        self.index.insert(new.to_string(), i);
        if self.external_content.remove(&old) {
            self.external_content.insert(new.to_string());
        }
        let Some(n) = self.targeted.remove(&old) else {
            return;
        };
        self.targeted.insert(new.to_string(), n);
        for c in &mut self.table.chains {
            let at: Vec<usize> = (c.rules.iter().enumerate())
                .filter(|(_, r)| target_chain(r) == Some(old.as_str()))
                .map(|(k, _)| k)
                .collect();
            for k in at {
                if let Some(r) = c.rules.get_mut(k) {
                    match &mut r.target {
                        Target::Jump(t) | Target::Goto(t) => *t = new.to_string(),
                        _ => {}
                    }
                }
            }
        }
    }

    fn is_builtin(&self, name: &str) -> bool {
        Hook::from_chain_name(name).is_some_and(|h| self.table.kind.builtin_hooks().contains(&h))
    }

    /// Whether a rule of the table jumps or goes to chain `name`.
    fn referenced(&self, name: &str) -> bool {
        self.targeted.contains_key(name)
    }
}

/// Whether iptables-restore (legacy, 1.8.9: `ip[6]tables_restore_main` reads each line with
/// `fgets` and compares `COMMIT\n` whole) refuses a line that this parser reads: `Some((column,
/// token, why))`. `raw` is the line without its `\n`, `line` without a final `\r` as well;
/// `unterminated` when no `\n` ends it (the text's last line). Measured against
/// iptables-legacy-restore: an empty line and a comment are fine, a `\r` after a chain's
/// counters is read by `sscanf` and fine.
fn restore_refuses(
    raw: &str,
    line: &str,
    unterminated: bool,
) -> Option<(u32, &'static str, &'static str)> {
    if raw.is_empty() || raw.starts_with('#') {
        return None;
    }
    let end = u32::try_from(line.len())
        .unwrap_or(u32::MAX)
        .saturating_add(1);
    if line.trim_matches([' ', '\t']).is_empty() {
        return Some((
            1,
            "",
            "a line of blanks, which it reads as a rule line without a command",
        ));
    }
    let lead = line.trim_start_matches([' ', '\t']);
    if lead.len() != line.len() && (lead.starts_with(['*', ':', '#']) || lead.starts_with("COMMIT"))
    {
        return Some((1, "", "a blank before *, :, # or COMMIT"));
    }
    let mut words = line.split([' ', '\t']).filter(|w| !w.is_empty());
    let first = words.next().unwrap_or("");
    if first == "COMMIT" && (raw != "COMMIT" || unterminated) {
        return Some((
            1,
            "COMMIT",
            "COMMIT must be the whole line, ended by a newline",
        ));
    }
    if raw.len() == line.len() {
        return None;
    }
    if first.starts_with(':') && words.count() >= 2 {
        return None;
    }
    Some((
        end,
        "\\r",
        "a carriage return at its end (CRLF line ends), which it reads as part of the last word",
    ))
}

/// Whether a line outside any `*table` block, split into `w`, is an nftables statement (`nft
/// list ruleset` / `nft -f` syntax): `table FAMILY NAME {`, `flush ruleset`, `define`,
/// `include`, or `add|insert|create|delete|flush|replace table|chain|rule|set|map|element`.
fn looks_like_nft(w: &[Tok<'_>]) -> bool {
    const FAMILIES: [&str; 6] = ["ip", "ip6", "inet", "arp", "bridge", "netdev"];
    const VERBS: [&str; 6] = ["add", "insert", "create", "delete", "flush", "replace"];
    const OBJECTS: [&str; 6] = ["table", "chain", "rule", "set", "map", "element"];
    let word = |i: usize| w.get(i).map(|t| t.text);
    match (word(0), word(1)) {
        (Some("table"), Some(f)) => {
            FAMILIES.contains(&f) || word(2) == Some("{") || f.ends_with('{')
        }
        (Some("flush"), Some("ruleset")) => true,
        (Some("define" | "include"), Some(_)) => true,
        (Some(v), Some(o)) => VERBS.contains(&v) && OBJECTS.contains(&o),
        _ => false,
    }
}

/// Splits a line on blanks with 1-based columns (for `:` and `*` lines, which iptables-restore
/// splits with strtok, without quote handling).
fn words(line: &str) -> Vec<Tok<'_>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line
        .char_indices()
        .chain(std::iter::once((line.len(), ' ')))
    {
        if c == ' ' || c == '\t' {
            if let Some(s) = start.take() {
                out.push(Tok {
                    text: &line[s..i],
                    column: s as u32 + 1,
                });
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    out
}

/// `[packets:bytes]`.
fn parse_counters(s: &str) -> Option<Counters> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    let (p, b) = inner.split_once(':')?;
    let digits = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit());
    if !digits(p) || !digits(b) {
        return None;
    }
    Some(Counters {
        packets: p.parse().ok()?,
        bytes: b.parse().ok()?,
    })
}

struct State<'o, 'a> {
    opts: &'o ParseOptions<'a>,
    errors: Vec<ParseError>,
    external: Vec<ExternalRef>,
    warnings: Vec<ParseWarning>,
    done: Vec<Table>,
    /// Rules the `-s`/`-d` list lines carried out so far stand for (see
    /// [`ParseOptions::max_rules`]).
    listed: usize,
    /// The tables' content before the text is known (`parse_onto`): a chain that is not
    /// there does not exist, so `-X` of it fails as iptables' "No chain/target/match by that
    /// name" instead of being recorded as external.
    known: bool,
}

impl State<'_, '_> {
    fn error(&mut self, e: ParseError) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(e);
        }
    }

    fn external(&mut self, b: &Block, chain: &Tok, line: u32, kind: ExternalRefKind) {
        self.external.push(ExternalRef {
            family: self.opts.family,
            table: b.table.kind,
            chain: chain.text.to_string(),
            kind,
            location: Location {
                line,
                column: chain.column,
            },
        });
    }
}

pub(crate) fn parse(text: &str, opts: &ParseOptions<'_>) -> Result<Restore, ParseErrors> {
    parse_with(text, opts, 1)
}

/// Texts with fewer lines are parsed on one thread (starting a thread costs more).
const READ_AHEAD_MIN_LINES: usize = 2048;

/// As [`parse`], reading the rule lines ahead on up to `threads` threads first (see
/// [`read_ahead`](fn@read_ahead)); the result is the same as [`parse`]'s, errors included.
pub(crate) fn parse_with(
    text: &str,
    opts: &ParseOptions<'_>,
    threads: usize,
) -> Result<Restore, ParseErrors> {
    let lines: Vec<&str> = text.split('\n').collect();
    let n = lines.len();
    if threads <= 1 || n < READ_AHEAD_MIN_LINES || opts.set_exists.is_some() {
        return parse_lines(&lines, opts, None, usize::MAX, Vec::new);
    }
    // The calling thread parses and carries out lines [0, m) itself while `threads - 1`
    // others read [m, n) ahead; it then carries those out. Carrying a line out costs about a
    // quarter of reading it, so m is where both finish together: m * 5 = (n - m) * 4 / (t - 1).
    let threads = threads.min(8);
    let m = n * 4 / ((threads - 1) * 5 + 4);
    let tables = line_tables(&lines);
    let (lines, tables, family, owner) = (&lines[..], &tables[..], opts.family, opts.resolve_owner);
    std::thread::scope(|s| {
        let per = (n - m).div_ceil(threads - 1);
        let readers: Vec<_> = (0..threads - 1)
            .map(|k| {
                let from = (m + k * per).min(n);
                let to = (from + per).min(n);
                s.spawn(move || read_ahead(lines, tables, family, owner, from, to))
            })
            .collect();
        // The readers' parts in order, not joined into one vector: an entry holds a parsed
        // rule (a few hundred bytes), and copying 10k of them showed in profiles.
        let fetch = move || {
            readers
                .into_iter()
                .map(|r| match r.join() {
                    Ok(part) => part,
                    // A panic in a reader is a parser bug: re-raise it here, as the
                    // one-thread parser would have.
                    Err(p) => std::panic::resume_unwind(p),
                })
                .collect()
        };
        parse_lines(lines, opts, None, m, fetch)
    })
}

/// `--noflush` input applied to `base`, the complete tables of the family as they are (see
/// [`super::parse_onto`]).
pub(crate) fn parse_onto(
    base: &[Table],
    text: &str,
    opts: &ParseOptions<'_>,
) -> Result<Restore, ParseErrors> {
    let opts = ParseOptions {
        noflush: true,
        ..*opts
    };
    let base: Vec<Table> = base
        .iter()
        .filter(|t| t.family == opts.family)
        .cloned()
        .collect();
    let order: Vec<TableKind> = base.iter().map(|t| t.kind).collect();
    let lines: Vec<&str> = text.split('\n').collect();
    let mut r = parse_lines(&lines, &opts, Some(base), usize::MAX, Vec::new)?;
    // A table continued by a block moves to the end of `done`: back to the base's order, new
    // tables after it in the order of their first block.
    r.tables.sort_by_key(|t| {
        order
            .iter()
            .position(|k| *k == t.kind)
            .unwrap_or(usize::MAX)
    });
    Ok(r)
}

/// The sequential pass of [`parse_with`] over `lines` (the lines of the text); from line index
/// `ahead_from` on, the lines read ahead by `fetch` (one entry per line, in parts) are carried out
/// instead of parsed again.
///
/// With `base` (only with `opts.noflush`), the text continues those tables, whose content is
/// known: a block of a base table starts from it with nothing external, and a table the base
/// lacks starts empty with known (empty) builtin chains.
fn parse_lines<'a>(
    lines: &[&'a str],
    opts: &ParseOptions<'_>,
    base: Option<Vec<Table>>,
    ahead_from: usize,
    fetch: impl FnOnce() -> Vec<Vec<Ahead<'a>>>,
) -> Result<Restore, ParseErrors> {
    let mut fetch = Some(fetch);
    // One entry per line from `ahead_from` on, taken in line order.
    let mut ahead = Vec::new().into_iter().flatten();
    let known = base.is_some();
    let mut st = State {
        opts,
        errors: Vec::new(),
        external: Vec::new(),
        warnings: Vec::new(),
        done: base.unwrap_or_default(),
        listed: 0,
        known,
    };
    let mut cur: Option<Block> = None;
    // Inside a block whose `*table` line was bad: skip until COMMIT.
    let mut skipping = false;
    let mut last_line = 0;
    // One token buffer for every command line.
    let mut toks: Vec<Token<'_>> = Vec::with_capacity(32);
    // The restore quirks warned so far, with their warning's index.
    let mut quirks: Vec<(&'static str, usize)> = Vec::new();
    for (idx, raw) in lines.iter().copied().enumerate() {
        if idx == ahead_from {
            ahead = fetch
                .take()
                .map(|f| f())
                .unwrap_or_default()
                .into_iter()
                .flatten();
        }
        let read_ahead = if idx >= ahead_from {
            ahead.next().flatten()
        } else {
            None
        };
        let line_no = idx as u32 + 1;
        last_line = line_no;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let unterminated = idx + 1 == lines.len();
        if let Some((column, token, why)) = restore_refuses(raw, line, unterminated) {
            // One warning per quirk (at most five kinds), at its first line, counting the
            // others.
            match quirks.iter().find(|(w, _)| *w == why) {
                Some(&(_, at)) => {
                    if let ParseWarningKind::RestoreRefusesLine { more, .. } =
                        &mut st.warnings[at].kind
                    {
                        *more += 1;
                    }
                }
                None => {
                    quirks.push((why, st.warnings.len()));
                    st.warnings.push(ParseWarning::new(
                        line_no,
                        column,
                        token,
                        ParseWarningKind::RestoreRefusesLine { why, more: 0 },
                    ));
                }
            }
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        // Rule lines (the bulk of a restore text) go straight to the tokenizer; only
        // `*table`, `:CHAIN` and `COMMIT` lines are split into words here.
        let lead = line.trim_start_matches([' ', '\t']);
        if !(lead.starts_with(['*', ':']) || lead.starts_with("COMMIT")) {
            if skipping {
                continue;
            }
            match cur.as_mut() {
                Some(block) => {
                    let done = match read_ahead {
                        Some((kind, read)) if kind == block.table.kind => match read {
                            Ok(parsed) => {
                                let ctx = Ctx {
                                    family: st.opts.family,
                                    table: kind,
                                    line: line_no,
                                    set_exists: None,
                                    resolve_owner: st.opts.resolve_owner,
                                };
                                apply_line(block, parsed, &ctx, &mut st)
                            }
                            Err(e) => Err(e),
                        },
                        _ => command_line(block, line, line_no, &mut st, &mut toks),
                    };
                    if let Err(e) = done {
                        st.error(e);
                    }
                }
                None => {
                    let w = words(line);
                    let first = &w[0];
                    if st.errors.is_empty() && looks_like_nft(&w) {
                        st.error(ParseError::new(
                            line_no,
                            first.column,
                            first.text.to_string(),
                            K::NftablesSyntax,
                        ));
                        break;
                    }
                    st.error(ParseError::new(
                        line_no,
                        first.column,
                        first.text.to_string(),
                        K::UnexpectedLine("outside a *table block"),
                    ));
                }
            }
            continue;
        }
        let w = words(line);
        let Some(first) = w.first() else { continue };
        let err = |tok: &Tok, kind: K| ParseError::new(line_no, tok.column, tok.text, kind);
        if let Some(name) = first.text.strip_prefix('*') {
            if let Some(b) = cur.take() {
                st.error(ParseError::new(
                    line_no,
                    first.column,
                    first.text.to_string(),
                    K::MissingCommit(b.table.kind.name().to_string()),
                ));
            }
            skipping = false;
            let Some(kind) = TableKind::from_name(name).filter(|_| w.len() == 1) else {
                st.error(err(first, K::UnknownTable));
                skipping = true;
                continue;
            };
            let location = Location {
                line: line_no,
                column: first.column,
            };
            // A second block for the same table: --noflush continues from the first one,
            // otherwise it replaces it.
            let prev = st.done.iter().position(|t| t.kind == kind);
            cur = Some(match prev {
                Some(i) if opts.noflush => {
                    let table = st.done.remove(i);
                    let external = if known {
                        HashSet::new()
                    } else {
                        Block::new(opts.family, kind, location, true).external_content
                    };
                    Block::with_table(table, external)
                }
                _ => Block::new(opts.family, kind, location, opts.noflush && !known),
            });
            continue;
        }
        if first.text == "COMMIT" && w.len() == 1 {
            match cur.take() {
                Some(b) => {
                    let mut table = b.table;
                    table.chains.sort_by(|a, b| {
                        let key = |c: &Chain| (c.policy.is_none(), c.hook().map(|h| h.index()));
                        key(a).cmp(&key(b)).then_with(|| {
                            if a.policy.is_none() {
                                a.name.as_bytes().cmp(b.name.as_bytes())
                            } else {
                                std::cmp::Ordering::Equal
                            }
                        })
                    });
                    match st.done.iter().position(|t| t.kind == table.kind) {
                        Some(i) => st.done[i] = table,
                        None => st.done.push(table),
                    }
                }
                None if skipping => skipping = false,
                None => st.error(err(
                    first,
                    K::UnexpectedLine("COMMIT outside a *table block"),
                )),
            }
            continue;
        }
        if skipping {
            continue;
        }
        let Some(block) = cur.as_mut() else {
            st.error(err(first, K::UnexpectedLine("outside a *table block")));
            continue;
        };
        if first.text.starts_with(':') {
            if let Err(e) = declare_chain(block, &w, line_no, &mut st) {
                st.error(e);
            }
            continue;
        }
        if let Err(e) = command_line(block, line, line_no, &mut st, &mut toks) {
            st.error(e);
        }
    }
    if let Some(b) = cur {
        st.error(ParseError::new(
            last_line,
            1,
            "",
            K::MissingCommit(b.table.kind.name().to_string()),
        ));
    }
    if !st.errors.is_empty() {
        return Err(ParseErrors(st.errors));
    }
    Ok(Restore {
        tables: st.done,
        external: st.external,
        warnings: st.warnings,
    })
}
