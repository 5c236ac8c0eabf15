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

use super::super::ParseOptions;
use super::super::lexer::{Token, tokenize_into};
use super::super::print::{self, PrintOptions};
use super::super::rule::{Command, Ctx};
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
) -> Option<(Vec<Table>, Option<String>)> {
    if opts.noflush || opts.set_exists.is_some() {
        return None;
    }
    let family = opts.family;
    let old: Vec<&Table> = previous.iter().filter(|t| t.family == family).collect();
    let (ob, nb) = (previous_text.as_bytes(), text.as_bytes());
    // Lines as the parser splits them: `n` newlines make `n + 1` lines.
    let (n_old, n_new) = (newlines(ob) + 1, newlines(nb) + 1);
    // The common first lines end at the last newline both texts share before they differ;
    // the common last lines start after a newline in the common end that lies past them.
    let differ = common_prefix(ob, nb);
    let head = ob[..differ]
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |i| i + 1);
    let same = newlines(&ob[..head]);
    let room = ob.len().min(nb.len()) - head;
    let end = common_suffix(ob, nb).min(room);
    // Each newline in the common end starts a common line; so does the start of the common
    // end itself when it is a line start in both texts (it then reaches back to the first
    // changed line of the shorter text).
    let line_start = |b: &[u8]| b.len() == end || b[b.len() - end - 1] == b'\n';
    let start_counts = end == room && line_start(ob) && line_start(nb);
    let tail = newlines(&ob[ob.len() - end..]) + usize::from(start_counts);
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
    let block = block?;
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
    let table = old.iter().position(|t| t.kind == block)?;

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

/// The canonical print of the new tables: `previous` (the canonical print of the old ones)
/// with its changed lines `[head, old_end)` (all rule lines of `table`, each the print of an
/// old rule) replaced by the print of the `added` rules, grouped by chain in print order;
/// `None` unless that is where the print puts them: every chain with added rules must lie
/// between the chain of the rule line before the change and that of the rule line after it
/// (in a canonical print, the chains between have no other rules).
fn splice_print(
    previous: &str,
    table: &Table,
    added: &HashMap<usize, Vec<Rule>>,
    head: usize,
    old_end: usize,
) -> Option<String> {
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
    let mut out = String::with_capacity(previous.len() - (old_end - head) + region.len());
    out.push_str(&previous[..head]);
    out.push_str(&region);
    out.push_str(&previous[old_end..]);
    Some(out)
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

/// The length of the longest common prefix of `a` and `b`, in bytes.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const STEP: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    // Whole blocks first (a slice comparison is a memcmp), then bytes.
    while i + STEP <= n && a[i..i + STEP] == b[i..i + STEP] {
        i += STEP;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// The length of the longest common suffix of `a` and `b`, in bytes.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    const STEP: usize = 64;
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut i = 0;
    while i + STEP <= n && a[n - i - STEP..n - i] == b[n - i - STEP..n - i] {
        i += STEP;
    }
    i + a[..n - i]
        .iter()
        .rev()
        .zip(b[..n - i].iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use crate::model::{Family, Table};
    use crate::restore::{
        ParseOptions, PrintOptions, parse_after, parse_after_canonical, parse_ruleset, print,
    };

    use crate::test_rng::Rng;

    const USER: [&str; 3] = ["KUBE-SVC", "DOCKER", "zone_in"];

    /// A rule line for a chain of `table` (a few of them wrong on purpose: a jump to an
    /// undeclared or builtin chain, a bad option, an `-I`).
    fn rule_line(r: &mut Rng, table: &str, chains: &[&str], v6: bool) -> String {
        let chain = chains[r.below(chains.len())];
        let mut s = format!("-A {chain}");
        if r.below(2) == 0 {
            if v6 {
                s += &format!(" -s 2001:db8:{:x}::/48", r.below(4096));
            } else {
                s += &format!(" -s 10.{}.{}.0/24", r.below(256), r.below(256));
            }
        }
        match r.below(4) {
            0 => s += &format!(" -p tcp -m tcp --dport {}", r.below(65536)),
            1 => {
                s += &format!(
                    " -p udp -m udp --sport {}:{}",
                    r.below(100),
                    100 + r.below(100)
                )
            }
            // Packets going out have no input interface (iptables refuses `-i` there).
            2 if matches!(chain, "OUTPUT" | "POSTROUTING") => {
                s += " -o eth+ -m comment --comment \"a b\""
            }
            2 => s += " -i eth+ -m comment --comment \"a b\"",
            _ => {}
        }
        let target = match r.below(24) {
            0 => "NO_SUCH_CHAIN".to_string(),
            1 => "INPUT".to_string(),
            2 => return format!("-A {chain} --bogus-option 1 -j ACCEPT"),
            3 => return format!("-I {chain} 1 -j DROP"),
            4 => return "# a comment".to_string(),
            5 => return String::new(),
            6..=11 => USER[r.below(USER.len())].to_string(),
            12 if table == "filter" => "REJECT".to_string(),
            13 => "RETURN".to_string(),
            _ => ["ACCEPT", "DROP"][r.below(2)].to_string(),
        };
        format!("{s} -j {target}")
    }

    /// A plain dump: tables with their builtin and user chains declared, then rules.
    fn dump(r: &mut Rng, v6: bool) -> Vec<String> {
        let mut out = vec!["# Generated by a test".to_string()];
        let tables: &[(&str, &[&str])] = &[
            ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
            ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
            ("raw", &["PREROUTING", "OUTPUT"]),
        ];
        for (table, builtin) in tables.iter().take(1 + r.below(3)) {
            out.push(format!("*{table}"));
            for c in *builtin {
                out.push(format!(":{c} ACCEPT [0:0]"));
            }
            for c in USER {
                out.push(format!(":{c} - [0:0]"));
            }
            let mut chains: Vec<&str> = builtin.to_vec();
            chains.extend(USER);
            for _ in 0..r.below(40) {
                let l = rule_line(r, table, &chains, v6);
                // The previous text is mostly a valid plain dump.
                if !l.contains("NO_SUCH")
                    && !l.contains("bogus")
                    && !l.contains("-j INPUT")
                    && !l.starts_with("-I")
                {
                    out.push(l);
                }
            }
            out.push("COMMIT".to_string());
        }
        out
    }

    /// One random change of a line list.
    fn edit(r: &mut Rng, lines: &mut Vec<String>, v6: bool) {
        let chains = ["INPUT", "OUTPUT", "DOCKER", "KUBE-SVC", "zone_in"];
        let at = r.below(lines.len() + 1);
        match r.below(7) {
            0 | 1 => lines.insert(at, rule_line(r, "filter", &chains, v6)),
            2 if at < lines.len() => {
                lines.remove(at);
            }
            3 if at < lines.len() => lines[at] = rule_line(r, "filter", &chains, v6),
            4 if at < lines.len() => {
                let l = lines[r.below(lines.len())].clone();
                lines.insert(at, l);
            }
            5 => lines.insert(at, ":NEWCHAIN - [0:0]".to_string()),
            _ if at + 3 < lines.len() => {
                let a: Vec<String> = lines.drain(at..at + 2).collect();
                lines.splice(at + 1..at + 1, a);
            }
            _ => {}
        }
    }

    fn join(lines: &[String], crlf: bool) -> String {
        let mut s = lines.join(if crlf { "\r\n" } else { "\n" });
        s.push('\n');
        s
    }

    /// Checks `parse_after` against a full parse of `new`; true when the shortcut applied.
    fn agrees(old: &str, new: &str, opts: &ParseOptions<'_>) -> bool {
        let Ok(prev) = parse_ruleset("t", old, opts) else {
            return false;
        };
        let full = parse_ruleset("t", new, opts).map(|r| r.tables);
        // A canonical previous text also gets the new print spliced.
        let canonical = !opts.counters && print(&prev.tables, &PrintOptions::default()) == old;
        if canonical {
            if let Some((tables, spliced)) = parse_after_canonical(old, &prev.tables, new, opts) {
                assert_eq!(
                    Some(&tables),
                    full.as_ref().ok(),
                    "old:\n{old}\nnew:\n{new}"
                );
                if let Some(p) = spliced {
                    assert_eq!(
                        p,
                        print(&tables, &PrintOptions::default()),
                        "old:\n{old}\nnew:\n{new}"
                    );
                    SPLICED.with(|n| n.set(n.get() + 1));
                }
            }
        }
        match parse_after(old, &prev.tables, new, opts) {
            Some(fast) => {
                let full: Vec<Table> = full.unwrap_or_else(|e| {
                    panic!("shortcut parsed a text the parser refuses ({e:?}):\n{old}\n---\n{new}")
                });
                assert_eq!(fast, full, "old:\n{old}\nnew:\n{new}");
                true
            }
            None => false,
        }
    }

    thread_local! {
        /// How many [`agrees`] calls checked a spliced print.
        static SPLICED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Random plain dumps with one to three random line changes (rules added, removed,
    /// replaced, duplicated, moved; chains declared; bad lines; CRLF texts): whenever the
    /// shortcut answers, its tables (locations included) are a full parse's, and it never
    /// answers for a text the full parse refuses. (It found a declaration below the change
    /// compared at its old line.)
    #[test]
    fn parse_after_is_a_full_parse() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut cases, mut fast) = (0, 0);
        for case in 0..4000 {
            let v6 = case % 5 == 4;
            let opts = ParseOptions {
                family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
                counters: case % 7 == 3,
                ..ParseOptions::default()
            };
            let crlf = case % 11 == 5;
            let lines = dump(&mut r, v6);
            let mut changed = lines.clone();
            for _ in 0..1 + r.below(3) {
                edit(&mut r, &mut changed, v6);
            }
            cases += 1;
            if agrees(&join(&lines, crlf), &join(&changed, crlf), &opts) {
                fast += 1;
            }
        }
        // Edits that touch `*`/`:`/COMMIT lines or span blocks rightly fall back (~80% of
        // these random ones); single rule-line changes take the shortcut (real dumps below).
        assert!(
            fast * 100 >= cases * 15,
            "the shortcut applied in {fast} of {cases} cases"
        );
    }

    /// The same from canonical texts (the dumps printed back), with the print spliced
    /// (`parse_after_canonical`): whenever it gives a print, it is the full print of its
    /// tables, and those are a full parse's.
    #[test]
    fn parse_after_canonical_prints_as_print() {
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        let spliced_before = SPLICED.with(std::cell::Cell::get);
        let mut cases = 0;
        for case in 0..3000 {
            let v6 = case % 5 == 4;
            let opts = ParseOptions {
                family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
                ..ParseOptions::default()
            };
            let Ok(rs) = parse_ruleset("t", &join(&dump(&mut r, v6), false), &opts) else {
                continue;
            };
            let canonical = print(&rs.tables, &PrintOptions::default());
            let lines: Vec<String> = canonical.lines().map(str::to_string).collect();
            let mut changed = lines.clone();
            for _ in 0..1 + r.below(2) {
                edit(&mut r, &mut changed, v6);
            }
            cases += 1;
            agrees(&canonical, &join(&changed, false), &opts);
        }
        let spliced = SPLICED.with(std::cell::Cell::get) - spliced_before;
        assert!(
            spliced * 100 >= cases * 15,
            "the print was spliced in {spliced} of {cases} cases"
        );
    }

    /// Texts that are not plain dumps (commands other than `-A`, a table or a chain written
    /// twice, a change outside a block or touching a declaration) fall back to the full
    /// parse, whose result can differ from "drop the old rules, add the new ones".
    #[test]
    fn parse_after_falls_back_for_other_texts() {
        let opts = ParseOptions::default();
        let base =
            "*filter\n:INPUT ACCEPT [0:0]\n:X - [0:0]\n-A INPUT -j X\n-A X -j DROP\nCOMMIT\n";
        let cases: [(&str, &str); 6] = [
            // An `-I` in the old text: positions depend on order.
            (
                "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\n-I INPUT 1 -j ACCEPT\n-A INPUT -p tcp -j DROP\nCOMMIT\n",
                "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\n-I INPUT 1 -j ACCEPT\n-A INPUT -p udp -j DROP\nCOMMIT\n",
            ),
            // `-N` and `-X` lines.
            (
                "*filter\n:INPUT ACCEPT [0:0]\n-N Y\n-A INPUT -j Y\nCOMMIT\n",
                "*filter\n:INPUT ACCEPT [0:0]\n-N Y\n-A INPUT -p tcp -j Y\nCOMMIT\n",
            ),
            // A table written twice (the second replaces the first).
            (
                "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n",
                "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -j DROP\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n",
            ),
            // A user chain declared again after a change that adds rules to it (flushes them).
            (
                "*filter\n:INPUT ACCEPT [0:0]\n:X - [0:0]\n-A INPUT -j X\n:X - [0:0]\nCOMMIT\n",
                "*filter\n:INPUT ACCEPT [0:0]\n:X - [0:0]\n-A X -j DROP\n-A INPUT -j X\n:X - [0:0]\nCOMMIT\n",
            ),
            // A declaration changed.
            (base, &base.replace(":X - [0:0]", ":Y - [0:0]")),
            // A rule outside any block.
            (base, &format!("{base}-A INPUT -j DROP\n")),
        ];
        for (old, new) in cases {
            let prev = parse_ruleset("t", old, &opts).expect("old text parses");
            assert_eq!(
                parse_after(old, &prev.tables, new, &opts),
                None,
                "{old}---\n{new}"
            );
            agrees(old, new, &opts);
        }
        // And a plain change takes the shortcut.
        let new = base.replace("-A X -j DROP", "-A X -p tcp -j DROP\n-A X -j RETURN");
        assert!(agrees(base, &new, &opts));
    }

    /// The same over real dumps (../shared/data: Docker, kube-proxy, firewalld; skipped when
    /// absent): every rule line in turn removed, duplicated, or changed.
    #[test]
    fn parse_after_on_real_dumps() {
        let dir =
            std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data"));
        let dir = std::env::var_os("VALLUM_SHARED_DATA")
            .map(std::path::PathBuf::from)
            .filter(|_| !dir.is_dir())
            .unwrap_or(dir);
        let Some(dir) = dir.is_dir().then_some(dir) else {
            eprintln!("SKIP parse_after_on_real_dumps: ../shared/data not found");
            return;
        };
        let mut files = Vec::new();
        for sub in ["iptables-save", "iptables-tests/shell-dumps"] {
            if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
                files.extend(rd.flatten().map(|e| e.path()));
            }
        }
        files.sort();
        let (mut applied, mut tried) = (0, 0);
        for f in files {
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            let name = f.display().to_string();
            let family = if name.contains("ip6") {
                Family::Ipv6
            } else {
                Family::Ipv4
            };
            let opts = ParseOptions {
                family,
                ..ParseOptions::default()
            };
            let Ok(rs) = parse_ruleset("t", &text, &opts) else {
                continue;
            };
            // As written, and printed back (canonical: the print is spliced too).
            let canonical = print(&rs.tables, &PrintOptions::default());
            for text in [text, canonical] {
                let lines: Vec<String> = text.lines().map(str::to_string).collect();
                for (i, l) in lines.iter().enumerate() {
                    if !l.starts_with("-A ") {
                        continue;
                    }
                    let mut removed = lines.clone();
                    removed.remove(i);
                    let mut doubled = lines.clone();
                    doubled.insert(i, l.clone());
                    let mut changed = lines.clone();
                    changed[i] = format!("{l} -m comment --comment x{i}");
                    for new in [removed, doubled, changed] {
                        tried += 1;
                        if agrees(&text, &join(&new, false), &opts) {
                            applied += 1;
                        }
                    }
                }
            }
        }
        let spliced = SPLICED.with(std::cell::Cell::get);
        eprintln!(
            "parse_after on real dumps: {applied} of {tried} changes took the shortcut, {spliced} with the print spliced"
        );
        assert!(spliced * 3 >= tried, "{spliced} of {tried} spliced");
        // iptables-save output is a plain dump: a changed rule line always takes it.
        assert_eq!(applied, tried);
    }

    /// A line of the wider grammar the differential test below draws from: rules with leading
    /// blanks, `[p:b]`/`-c` counters, quotes, `-4`/`-6`, trailing `\r` or blanks, `-I` that
    /// appends, other commands, declarations, comments, COMMIT variants.
    fn wide_line(r: &mut Rng, chains: &[&str], v6: bool) -> String {
        let chain = chains[r.below(chains.len())];
        let mut s = match r.below(40) {
            0 => return format!(":{} - [0:0]", ["NEWCHAIN", "DOCKER", "X"][r.below(3)]),
            1 => return format!(":{chain} DROP [{}:{}]", r.below(9), r.below(99)),
            2 => return "COMMIT".into(),
            3 => return ["COMMIT x", " COMMIT", "COMMIT ", "COMMITx"][r.below(4)].into(),
            4 => return ["# c", " # c", "", "  ", "\t", "#"][r.below(6)].into(),
            5 => return format!("-N {}", ["NEWCHAIN", "Y"][r.below(2)]),
            6 => return format!("-F {chain}"),
            7 => return format!("-P {chain} DROP"),
            8 => return format!("-X {}", USER[r.below(3)]),
            9 => return format!("-D {chain} 1"),
            10 => return format!("-R {chain} 1 -j DROP"),
            11 => return format!("-Z {chain}"),
            12 => return format!("-E {chain} Z"),
            13 => format!("-I {chain} {}", 1 + r.below(3)),
            14 => format!("-I {chain}"),
            15 => format!("  -A {chain}"),
            16 => format!("[{}:{}] -A {chain}", r.below(9), r.below(99)),
            17 => format!("-A {chain} -c {} {}", r.below(9), r.below(99)),
            18 => format!("-4 -A {chain}"),
            19 => format!("-6 -A {chain}"),
            20 => format!("--append {chain}"),
            21 => format!("-A{chain}"),
            22 => format!("\t-A {chain}"),
            23 => {
                return format!(
                    "*{}",
                    ["filter", "nat", "raw", "bogus", "filter "][r.below(5)]
                );
            }
            _ => format!("-A {chain}"),
        };
        if r.below(3) == 0 {
            s += if v6 {
                " -s 2001:db8::/32"
            } else {
                " -s 10.1.0.0/16"
            };
        }
        match r.below(6) {
            0 => s += &format!(" -p tcp --dport {}", r.below(65536)),
            1 => s += " -m comment --comment \"a b\"",
            2 => s += " -m comment --comment \"ü -A X\"",
            3 => s += " -m comment --comment \"-I x\"",
            _ => {}
        }
        let target = match r.below(12) {
            0 => "NO_SUCH".to_string(),
            1..=5 => USER[r.below(3)].to_string(),
            6 => "RETURN".to_string(),
            _ => "ACCEPT".to_string(),
        };
        s += &format!(" -j {target}");
        match r.below(8) {
            0 => s += " ",
            1 => s += "\r",
            2 => s += "\t",
            _ => {}
        }
        s
    }

    /// A dump mostly made of `-A` lines, with some of [`wide_line`]'s in between.
    fn wide_dump(r: &mut Rng, v6: bool) -> Vec<String> {
        let mut out = Vec::new();
        if r.below(2) == 0 {
            out.push("# Generated".to_string());
        }
        let tables: &[(&str, &[&str])] = &[
            ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
            ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
            ("raw", &["PREROUTING", "OUTPUT"]),
            (
                "mangle",
                &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
            ),
        ];
        let mut order: Vec<usize> = (0..tables.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, r.below(i + 1));
        }
        for &ti in order.iter().take(1 + r.below(3)) {
            let (table, builtin) = tables[ti];
            out.push(if r.below(6) == 0 {
                format!("*{table} ")
            } else {
                format!("*{table}")
            });
            for c in builtin {
                if r.below(4) != 0 {
                    out.push(format!(":{c} ACCEPT [0:0]"));
                }
            }
            for c in USER {
                out.push(format!(":{c} - [0:0]"));
            }
            let mut chains: Vec<&str> = builtin.to_vec();
            chains.extend(USER);
            for _ in 0..r.below(25) {
                if r.below(5) == 0 {
                    out.push(wide_line(r, &chains, v6));
                } else {
                    out.push(rule_line(r, table, &chains, v6));
                }
            }
            out.push("COMMIT".to_string());
        }
        out
    }

    /// A byte-level change of `s`.
    fn byte_edit(r: &mut Rng, s: &mut String) {
        let bytes = [
            " ", "\r", "\n", "\"", "x", "-", "#", "\r\n", "\n\n", "*", ":",
        ];
        let mut at = r.below(s.len() + 1);
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        match r.below(3) {
            0 => s.insert_str(at, bytes[r.below(bytes.len())]),
            1 if at < s.len() => {
                s.remove(at);
            }
            _ => {
                // The end of the text: trailing newline removed or blank lines added.
                if r.below(2) == 0 {
                    while s.ends_with('\n') || s.ends_with('\r') {
                        s.pop();
                    }
                } else {
                    s.push_str(["\n", "\r\n", "\n\n", " \n"][r.below(4)]);
                }
            }
        }
    }

    /// A differential test over a wider grammar than [`parse_after_is_a_full_parse`]: line
    /// edits, byte edits, CRLF mixtures, texts without a final newline, `-I`, other
    /// commands, counters, quotes, IPv6.
    #[test]
    fn parse_after_is_a_full_parse_wide() {
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        let (mut cases, mut fast) = (0, 0);
        for case in 0..30000 {
            let v6 = case % 5 == 4;
            let opts = ParseOptions {
                family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
                counters: case % 3 == 1,
                ..ParseOptions::default()
            };
            let mut lines = wide_dump(&mut r, v6);
            // Mostly valid old texts: drop the lines the parser refuses, a few times.
            for _ in 0..4 {
                let Err(e) = parse_ruleset("t", &join(&lines, false), &opts) else {
                    break;
                };
                let bad: Vec<usize> = e.0.iter().map(|e| e.location.line as usize).collect();
                let mut i = 0;
                lines.retain(|_| {
                    i += 1;
                    !bad.contains(&i)
                });
            }
            let chains = [
                "INPUT",
                "OUTPUT",
                "DOCKER",
                "KUBE-SVC",
                "zone_in",
                "PREROUTING",
            ];
            let mut old = lines.join(if case % 7 == 2 { "\r\n" } else { "\n" });
            if case % 4 != 0 {
                old.push('\n');
            }
            let mut new_lines = lines.clone();
            for _ in 0..1 + r.below(3) {
                match r.below(4) {
                    0 => {
                        let at = r.below(new_lines.len() + 1);
                        new_lines.insert(at, wide_line(&mut r, &chains, v6));
                    }
                    _ => edit(&mut r, &mut new_lines, v6),
                }
            }
            let mut new = new_lines.join(if case % 7 == 2 { "\r\n" } else { "\n" });
            if case % 4 != 0 {
                new.push('\n');
            }
            if r.below(3) == 0 {
                for _ in 0..1 + r.below(2) {
                    byte_edit(&mut r, &mut new);
                }
            }
            cases += 1;
            if agrees(&old, &new, &opts) {
                fast += 1;
            }
            // And the other way round.
            agrees(&new, &old, &opts);
        }
        eprintln!("wide: the shortcut applied in {fast} of {cases} cases");
        assert!(fast > 0);
    }

    /// An `-I` that appended to its chain in the previous text inserts elsewhere once a change
    /// above it adds a rule to that chain, and fails once one removes a rule from it: the
    /// shortcut must fall back (it put the new rule first, and accepted a text the parser
    /// refuses with a bad rule number). Quoted or attached spellings too.
    #[test]
    fn parse_after_falls_back_for_an_insert_below_the_change() {
        let opts = ParseOptions::default();
        for ins in [
            "-I INPUT 1 -j ACCEPT",
            "-I INPUT -j ACCEPT",
            "-IINPUT -j ACCEPT",
            "--insert INPUT -j ACCEPT",
            "-j ACCEPT --insert=INPUT",
            "-\"I\" INPUT -j ACCEPT",
            "\"-\\I\" INPUT -m comment --comment \"a b\" -j ACCEPT",
        ] {
            // The chain is empty at the `-I`: it appends.
            let old = format!("*filter\n:INPUT ACCEPT [0:0]\n{ins}\nCOMMIT\n");
            // A rule added above it: the `-I` then puts its rule first.
            let new = format!("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\n{ins}\nCOMMIT\n");
            let prev = parse_ruleset("t", &old, &opts).expect("old text parses");
            assert_eq!(parse_after(&old, &prev.tables, &new, &opts), None, "{new}");
        }
        // `-I INPUT 2` after one rule appends; without that rule it is a bad rule number.
        let old = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\n-I INPUT 2 -j ACCEPT\nCOMMIT\n";
        let new = "*filter\n:INPUT ACCEPT [0:0]\n-I INPUT 2 -j ACCEPT\nCOMMIT\n";
        assert!(parse_ruleset("t", new, &opts).is_err());
        let prev = parse_ruleset("t", old, &opts).expect("old text parses");
        assert_eq!(parse_after(old, &prev.tables, new, &opts), None);
        // An `-I` above the change is carried out as before: the shortcut applies.
        let old = "*filter\n:INPUT ACCEPT [0:0]\n-I INPUT 1 -j ACCEPT\n-A INPUT -j DROP\nCOMMIT\n";
        let new =
            "*filter\n:INPUT ACCEPT [0:0]\n-I INPUT 1 -j ACCEPT\n-A INPUT -p tcp -j DROP\nCOMMIT\n";
        assert!(agrees(old, new, &opts));
    }
}
