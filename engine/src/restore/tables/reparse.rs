//! Parsing a text again after a small change: [`parse_after`] reuses the rules parsed from
//! the previous text and parses only the lines that differ.
//!
//! Orchestrators re-send the whole ruleset when one rule changes (kube-proxy's
//! `iptables-restore` on every sync, a platform's Apply); parsing 10k unchanged rule lines
//! again was most of a 10k-rule Apply's time. When the previous text and its parse are at
//! hand, the common first and last lines of the two texts are found (one comparison per
//! line), only the lines between are parsed, and the result is assembled from the previous
//! rules (their locations moved by the change in line count) and the new ones.
//!
//! That gives what a full parse gives only when the text is a plain dump: each command line
//! appends one rule (as every `iptables-save` output; `-I`, `-D`, `-R`, `-N`, `-X`, `-P`,
//! `-F`, `-Z`, `-E` lines, or a table written twice, make positions and chain existence
//! depend on order), and the changed lines are `-A` lines inside one `*table` block that
//! parse without error. Anything else returns `None` and the caller parses in full (which
//! also reports every error of a bad text with its position).

use std::collections::{HashMap, HashSet};

use super::super::lexer::{Token, tokenize_into};
use super::super::print::{self, PrintOptions};
use super::super::rule::{Command, Ctx};
use super::super::{ParseOptions, TextSplice};
use super::read_command;
use crate::model::{Chain, Hook, Location, Rule, RuleList, Table, TableKind, Target};

/// How a line of a restore text is read by the parser's main loop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LineKind {
    /// A comment or a blank line.
    Skip,
    /// A `*table` line, with the table when the name is known.
    Table(Option<TableKind>),
    /// A `:CHAIN` or `COMMIT` line (or one that starts like them).
    Structure,
    /// Anything else: a command such as `-A CHAIN ...`.
    Command,
}

/// The kind of `raw` (one `\n`-separated line), by the same tests the parser's main loop
/// uses.
fn kind(raw: &str) -> LineKind {
    let line = raw.strip_suffix('\r').unwrap_or(raw);
    if line.starts_with('#') || line.trim().is_empty() {
        return LineKind::Skip;
    }
    let lead = line.trim_start_matches([' ', '\t']);
    if let Some(name) = lead.strip_prefix('*') {
        let name = name.trim_end_matches(['\r', ' ', '\t']);
        return LineKind::Table(TableKind::from_name(name).filter(|_| !name.contains([' ', '\t'])));
    }
    if lead.starts_with(':') || lead.starts_with("COMMIT") {
        return LineKind::Structure;
    }
    LineKind::Command
}

/// Parses `text` as [`super::parse_with`] would (the tables of `opts.family`, in the same
/// order, with the same locations), given `previous_text` and `previous`: the tables a parse
/// of `previous_text` with the same options returned (tables of other families are
/// ignored). Returns `None` when the shortcut does not apply (see the module docs) or the
/// changed lines do not parse; the caller then parses `text` in full.
///
/// Cost: a comparison of the two texts, one pass over the previous text's lines and a copy
/// of the unchanged rules (acl1 10k with one line added: ~1.0 ms against ~4-5 ms for a full
/// parse on one thread; `cargo bench -p vallum-engine --bench restore`, 2-vCPU VM).
pub(crate) fn parse_after(
    previous_text: &str,
    previous: &[Table],
    text: &str,
    opts: &ParseOptions<'_>,
) -> Option<Vec<Table>> {
    reparse(previous_text, previous, text, opts, false).map(|(t, _)| t)
}

/// As [`parse_after`]; with `canonical` (the caller knows `previous_text` is the canonical
/// print of `previous`'s tables of the family: `print(.., &PrintOptions::default())`), also
/// the canonical print of the result, made from `previous_text` with the changed lines'
/// rules printed in their place, when they land there (`None` when the new rules belong
/// elsewhere in the print, e.g. lines of two chains in the wrong order; print in full then).
pub(crate) fn reparse(
    previous_text: &str,
    previous: &[Table],
    text: &str,
    opts: &ParseOptions<'_>,
    canonical: bool,
) -> Option<(Vec<Table>, Option<TextSplice>)> {
    if opts.noflush || opts.set_exists.is_some() {
        return None;
    }
    let family = opts.family;
    let old: Vec<&Table> = previous.iter().filter(|t| t.family == family).collect();
    let (ob, nb) = (previous_text.as_bytes(), text.as_bytes());
    // The common first lines end at the last newline both texts share before they differ;
    // the common last lines start after a newline in the common end that lies past them.
    let differ = common_prefix(ob, nb);
    let head = memchr::memrchr(b'\n', &ob[..differ]).map_or(0, |i| i + 1);
    let same = newlines(&ob[..head]);
    let room = ob.len().min(nb.len()) - head;
    let end = common_suffix(ob, nb).min(room);
    let common_end = newlines(&ob[ob.len() - end..]);
    // Lines as the parser splits them: `n` newlines make `n + 1` lines. The texts share the
    // newlines before `head` and those of the common end (`end <= room`: it starts at or
    // after `head` in both), so only the bytes between are counted for each.
    let n_old = same + newlines(&ob[head..ob.len() - end]) + common_end + 1;
    let n_new = same + newlines(&nb[head..nb.len() - end]) + common_end + 1;
    // Each newline in the common end starts a common line; so does the start of the common
    // end itself when it is a line start in both texts (it then reaches back to the first
    // changed line of the shorter text).
    let line_start = |b: &[u8]| b.len() == end || b[b.len() - end - 1] == b'\n';
    let start_counts = end == room && line_start(ob) && line_start(nb);
    let tail = common_end + usize::from(start_counts);
    // Where the old text's common last lines start (its end when there are none).
    let from = ob.len() - end;
    let old_tail_start = if tail == 0 {
        ob.len()
    } else if start_counts {
        from
    } else {
        ob[from..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(ob.len(), |i| from + i + 1)
    };
    // The changed lines: [same, old_end) of the old text, [same, new_end) of the new one.
    let (old_end, new_end) = (n_old - tail, n_new - tail);

    let block = if canonical {
        canonical_block(previous_text, head, old_tail_start)?
    } else {
        dump_block(previous_text, &old, same, old_end, old_tail_start)?
    };
    let table = old.iter().position(|t| t.kind == block)?;
    let mut toks: Vec<Token<'_>> = Vec::with_capacity(32);

    // Lines 1..=above are unchanged above the change, old lines after `below` are below it
    // and move by `delta`.
    let (above, below) = (u32::try_from(same).ok()?, u32::try_from(old_end).ok()?);
    u32::try_from(n_new.max(n_old)).ok()?;
    let delta = i64::try_from(n_new).ok()? - i64::try_from(n_old).ok()?;
    let shift = |l: Location| -> Option<Location> {
        if l.line <= below {
            return Some(l);
        }
        let line = u32::try_from(i64::from(l.line) + delta).ok()?;
        Some(Location { line, ..l })
    };
    // Where the declaration is in the new text (one below the change moved with it).
    // The old table's chains by name: a changed line costs the same whatever their number.
    let chain_at: HashMap<&str, usize> = (old[table].chains.iter().enumerate())
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    let declared_before = |name: &str, line: u32| {
        chain_at
            .get(name)
            .and_then(|&i| shift(old[table].chains[i].location))
            .is_some_and(|l| l.line < line)
    };

    // Parse the new lines; each must be an `-A` of a chain (and a jump to a chain) declared
    // above it in the block, as the parser would find them at that line.
    let mut added: HashMap<usize, Vec<Rule>> = HashMap::new();
    let new_changed = text[head..].split('\n').take(new_end - same);
    for (idx, raw) in (same..).zip(new_changed) {
        match kind(raw) {
            LineKind::Skip => continue,
            LineKind::Command => {}
            _ => return None,
        }
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let line_no = u32::try_from(idx + 1).ok()?;
        let ctx = Ctx {
            family,
            table: block,
            line: line_no,
            set_exists: None,
            resolve_owner: None,
        };
        let parsed = read_command(line, &ctx, &mut toks).ok()??;
        // A line with an address list stands for several rules: not a plain dump's line.
        // One with a warning goes to the full parse, which reports it.
        if !matches!(parsed.command, Command::Append)
            || parsed.lists.is_some()
            || !parsed.warnings.is_empty()
        {
            return None;
        }
        let chain = parsed.chain?.text;
        if !declared_before(chain, line_no) {
            return None;
        }
        let mut rule = parsed.rule;
        match &rule.target {
            Target::Jump(to) | Target::Goto(to) => {
                let builtin = Hook::from_chain_name(to).is_some();
                if builtin || !declared_before(to, line_no) {
                    return None;
                }
            }
            _ => {}
        }
        rule.location = parsed.location;
        rule.counters = opts.counters.then(|| rule.counters.unwrap_or_default());
        let at = *chain_at.get(chain)?;
        added.entry(at).or_default().push(rule);
    }

    let print = if canonical {
        splice_print(previous_text, old[table], &added, head, old_tail_start)
    } else {
        None
    };

    // Assemble: rules above the change as they were, the new rules, then the rules below it
    // with their lines moved; the old rules of the changed lines are dropped.
    let mut out = Vec::with_capacity(old.len());
    for (ti, t) in old.iter().enumerate() {
        let mut chains = Vec::with_capacity(t.chains.len());
        for (ci, c) in t.chains.iter().enumerate() {
            let fresh = if ti == table {
                added.remove(&ci).unwrap_or_default()
            } else {
                Vec::new()
            };
            // The rules of the changed lines, [from, to): by line, ascending.
            let from = first_after(&c.rules, above);
            let to = first_after(&c.rules, below);
            // A copy that shares the chunks the change does not touch.
            let mut rules = c.rules.clone();
            let moved = from + fresh.len();
            if from < to || !fresh.is_empty() {
                rules.splice(from..to, fresh);
            }
            if delta != 0 && moved < rules.len() {
                // Lines below the change fit in u32: checked for the text's line count.
                rules.map_locations_from(moved, |l| shift(l).unwrap_or(l));
            }
            chains.push(Chain {
                name: c.name.clone(),
                policy: c.policy,
                counters: c.counters,
                rules,
                location: shift(c.location)?,
                nft_hook: None,
            });
        }
        out.push(Table {
            family: t.family,
            kind: t.kind,
            chains,
            location: shift(t.location)?,
        });
    }
    Some((out, print))
}

/// The `*table` block the changed lines `[same, old_end)` of `previous_text` are in, when
/// `previous_text` is a plain dump of `old` (as many command lines as rules, each table
/// written once, each chain declared once, every rule after the one before it in its chain,
/// no `-I` below the change) and the changed lines hold only commands and comments; `None`
/// otherwise. One pass over the previous text's lines.
fn dump_block(
    previous_text: &str,
    old: &[&Table],
    same: usize,
    old_end: usize,
    old_tail_start: usize,
) -> Option<TableKind> {
    // The previous text must be a plain dump: as many command lines as rules, each table
    // written once, each chain declared once (`:X` again flushes a user chain, moves a
    // builtin's location). The same pass finds the block the changed lines are in: the last
    // `*table` before them, not closed since.
    let mut commands = 0usize;
    let mut tables_seen: Vec<TableKind> = Vec::new();
    let mut declared: HashSet<(TableKind, &str)> = HashSet::new();
    let mut block = None;
    let mut toks: Vec<Token<'_>> = Vec::with_capacity(32);
    // An `-I` below the change that appended to its chain would insert elsewhere (or fail)
    // once the change moves that chain's rule count. Only the lines that hold `-I`,
    // `--insert` or a quote (which can hide one) are read for it: a byte search.
    let below = &previous_text[old_tail_start..];
    let mut checked = usize::MAX;
    for pat in ["-I", "--insert", "\""] {
        for at in memchr::memmem::find_iter(below.as_bytes(), pat.as_bytes()) {
            let start = below[..at].rfind('\n').map_or(0, |i| i + 1);
            if start == checked {
                continue;
            }
            checked = start;
            let line = below[start..].split('\n').next().unwrap_or("");
            if kind(line) == LineKind::Command && may_insert(line, &mut toks) {
                return None;
            }
        }
    }
    for (idx, raw) in previous_text.split('\n').enumerate() {
        let k = kind(raw);
        if (same..old_end).contains(&idx) {
            // The changed lines hold only commands (and comments): the block structure is
            // the same.
            if !matches!(k, LineKind::Command | LineKind::Skip) {
                return None;
            }
        }
        match k {
            LineKind::Command => commands += 1,
            LineKind::Table(Some(t)) => {
                if tables_seen.contains(&t) {
                    return None;
                }
                tables_seen.push(t);
                if idx < same {
                    block = Some(t);
                }
            }
            LineKind::Table(None) => return None,
            LineKind::Structure => {
                let lead = raw.trim_start_matches([' ', '\t']);
                if let Some(decl) = lead.strip_prefix(':') {
                    let name = decl.split([' ', '\t', '\r']).next().unwrap_or("");
                    let t = *tables_seen.last()?;
                    if !declared.insert((t, name)) {
                        return None;
                    }
                } else if idx < same {
                    // COMMIT
                    block = None;
                }
            }
            LineKind::Skip => {}
        }
    }
    let rules: usize = old
        .iter()
        .flat_map(|t| &t.chains)
        .map(|c| c.rules.len())
        .sum();
    if rules != commands {
        return None;
    }
    // ... and every rule after the one before it in its chain, in line order (so that each
    // command appended its rule).
    let in_order = old.iter().flat_map(|t| &t.chains).all(|c| {
        let mut last = 0;
        c.rules.iter().all(|r| {
            let after = r.location.line > last;
            last = r.location.line;
            after
        })
    });
    if !in_order {
        return None;
    }
    block
}

/// [`dump_block`] for a canonical `previous_text` (the print of `old`, which is a plain dump
/// by construction: one `-A` line per rule, in chain order, each table and chain once, no
/// `-I`): only the changed lines (bytes `[head, old_tail_start)`) and the lines above them
/// back to their `*table` line are read, not the whole text.
fn canonical_block(previous_text: &str, head: usize, old_tail_start: usize) -> Option<TableKind> {
    let changed = previous_text.get(head..old_tail_start)?;
    if !changed
        .split('\n')
        .all(|l| matches!(kind(l), LineKind::Command | LineKind::Skip))
    {
        return None;
    }
    let above = &previous_text.as_bytes()[..head];
    // The last line above that starts with `*` (a byte search from the end; `*` is rare
    // elsewhere in a print).
    let start = memchr::memrchr_iter(b'*', above).find(|&i| i == 0 || above[i - 1] == b'\n')?;
    // A COMMIT between that `*table` line and the change closes its block.
    if memchr::memmem::find(&above[start..], b"\nCOMMIT").is_some() {
        return None;
    }
    let line = previous_text[start..].split('\n').next().unwrap_or("");
    match kind(line) {
        LineKind::Table(t) => t,
        _ => None,
    }
}

/// The canonical print of the new tables as a change to `previous` (the canonical print of
/// the old ones): its changed lines, bytes `[head, old_end)` (all rule lines of `table`, each
/// the print of an old rule), replaced by the print of the `added` rules, grouped by chain in
/// print order; `None` unless that is where the print puts them: every chain with added rules must lie
/// between the chain of the rule line before the change and that of the rule line after it
/// (in a canonical print, the chains between have no other rules).
fn splice_print(
    previous: &str,
    table: &Table,
    added: &HashMap<usize, Vec<Rule>>,
    head: usize,
    old_end: usize,
) -> Option<TextSplice> {
    let order = print::chain_order_index(table);
    let ord = |line: &str| -> Option<usize> {
        let name = line.strip_prefix("-A ")?.split(' ').next()?;
        order.iter().position(|&i| table.chains[i].name == name)
    };
    let before = previous[..head].strip_suffix('\n').unwrap_or("");
    let before = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
    let after = previous[old_end..].split('\n').next().unwrap_or("");
    // The rules section starts after the `:CHAIN` lines and ends at COMMIT.
    let low = if before.starts_with("-A ") {
        ord(before)?
    } else if before.starts_with(':') || before.starts_with('*') {
        0
    } else {
        return None;
    };
    let high = if after.starts_with("-A ") {
        ord(after)?
    } else if after == "COMMIT" {
        order.len()
    } else {
        return None;
    };
    let mut region = String::new();
    for (o, &ci) in order.iter().enumerate() {
        let c = &table.chains[ci];
        let Some(rules) = added.get(&ci) else {
            continue;
        };
        if !(low..=high).contains(&o) {
            return None;
        }
        for r in rules {
            print::write_rule_line(
                &mut region,
                &c.name,
                r,
                table.family,
                &PrintOptions::default(),
            );
        }
    }
    Some(TextSplice {
        range: head..old_end,
        text: region,
    })
}

/// The position of the first rule of `rules` (in line order) written after line `line`.
fn first_after(rules: &RuleList, line: u32) -> usize {
    let (mut lo, mut hi) = (0, rules.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if rules[mid].location.line <= line {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Whether command line `raw` may be an `-I` (`--insert`): one of its tokens starts with
/// `-I` or is `--insert` (`=...`). An argument that looks so only costs the shortcut.
fn may_insert<'a>(raw: &'a str, toks: &mut Vec<Token<'a>>) -> bool {
    let insert = |t: &str| t.starts_with("-I") || t == "--insert" || t.starts_with("--insert=");
    if !raw.contains('"') {
        return raw.split([' ', '\t', '\r']).any(insert);
    }
    // Quotes group and escape (`-"I"`, `"\-I"`): the tokenizer's tokens.
    tokenize_into(raw, toks).map_or(true, |()| toks.iter().any(|t| insert(&t.text)))
}

/// The number of newlines in `b`, 64 bytes at a time (a byte count per block vectorizes;
/// counting into a `usize` per byte did not).
fn newlines(b: &[u8]) -> usize {
    let mut blocks = b.chunks_exact(64);
    let n: usize = (&mut blocks)
        .map(|c| usize::from(c.iter().fold(0u8, |a, &x| a + u8::from(x == b'\n'))))
        .sum();
    n + blocks.remainder().iter().filter(|&&x| x == b'\n').count()
}

/// The length of the longest common prefix of `a` and `b`, in bytes: 4 KiB blocks (each a
/// memcmp), then 64-byte blocks within the first that differs, then bytes.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    for step in [4096, 64] {
        while i + step <= n && a[i..i + step] == b[i..i + step] {
            i += step;
        }
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// The length of the longest common suffix of `a` and `b`, in bytes (as [`common_prefix`],
/// from the ends).
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut i = 0;
    for step in [4096, 64] {
        while i + step <= n && a[n - i - step..n - i] == b[n - i - step..n - i] {
            i += step;
        }
    }
    i + a[..n - i]
        .iter()
        .rev()
        .zip(b[..n - i].iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests;
