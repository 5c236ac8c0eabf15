//! The lines a change of the model makes in the canonical print: a one-rule edit prints one
//! rule and walks the chains, never the old text (a revision's text is spliced from these).

use crate::model::{Chain, Table};

use super::{PrintOptions, chain_order, write_rule_line, write_table_head};

/// One change of [`print_changes`]: the `old_lines` lines of the old print that start at line
/// `line` (from 0) become `text` (whole lines, each with its `\n`; empty: the lines go).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineChange {
    /// The first old line replaced (or the line `text` goes before, when `old_lines` is 0).
    pub line: usize,
    /// How many old lines are replaced.
    pub old_lines: usize,
    /// What replaces them.
    pub text: String,
}

/// The line changes that turn [`super::print()`] of `old` (default options) into [`super::print()`] of `new`,
/// in order and not overlapping, and the number of lines `old` prints as: for each table, its
/// `*table` / `:CHAIN` head when it differs, the rules that `crate::model::diff_rules` finds
/// changed in each chain (a shared chunk is skipped unread), a chain created or deleted. Only
/// the changed rules are printed, and nothing of the old text is read: a one-rule edit of a
/// 100k-rule table costs one rule's print and the chains' walk, wherever its text is held.
///
/// `None` when the two lists do not hold the same tables (family and kind) in the same order:
/// print `new` in full then.
pub fn print_changes(old: &[Table], new: &[Table]) -> Option<(Vec<LineChange>, usize)> {
    if old.len() != new.len()
        || old
            .iter()
            .zip(new)
            .any(|(o, t)| o.family != t.family || o.kind != t.kind)
    {
        return None;
    }
    let opts = PrintOptions::default();
    let mut out = Vec::new();
    let mut line = 0;
    for (o, t) in old.iter().zip(new) {
        let old_chains = chain_order(o);
        let new_chains = chain_order(t);
        let (mut old_head, mut new_head) = (String::new(), String::new());
        write_table_head(&mut old_head, o, &opts);
        write_table_head(&mut new_head, t, &opts);
        let head_lines = 1 + old_chains.len();
        if old_head != new_head {
            out.push(LineChange {
                line,
                old_lines: head_lines,
                text: new_head,
            });
        }
        line += head_lines;
        // Both lists are in print order (builtin chains by hook, then user chains by name), so
        // the chains both have are met in the same order: a merge.
        let (mut i, mut j) = (0, 0);
        while i < old_chains.len() || j < new_chains.len() {
            let (oc, nc) = (old_chains.get(i), new_chains.get(j));
            match (oc, nc) {
                (Some(oc), Some(nc)) if oc.name == nc.name => {
                    let (prefix, old_mid, new_mid) =
                        crate::model::diff_rules(&oc.rules, &nc.rules, |_, _| {});
                    let (prefix, old_mid, new_mid) =
                        (prefix as usize, old_mid as usize, new_mid as usize);
                    if old_mid > 0 || new_mid > 0 {
                        let mut text = String::new();
                        for r in nc.rules.range(prefix..prefix + new_mid) {
                            write_rule_line(&mut text, &nc.name, r, t.family, &opts);
                        }
                        out.push(LineChange {
                            line: line + prefix,
                            old_lines: old_mid,
                            text,
                        });
                    }
                    line += oc.rules.len();
                    i += 1;
                    j += 1;
                }
                (Some(oc), None) => {
                    if !oc.rules.is_empty() {
                        out.push(LineChange {
                            line,
                            old_lines: oc.rules.len(),
                            text: String::new(),
                        });
                    }
                    line += oc.rules.len();
                    i += 1;
                }
                (Some(oc), Some(nc)) if print_key(oc) < print_key(nc) => {
                    // A chain of `old` only: its rules go.
                    if !oc.rules.is_empty() {
                        out.push(LineChange {
                            line,
                            old_lines: oc.rules.len(),
                            text: String::new(),
                        });
                    }
                    line += oc.rules.len();
                    i += 1;
                }
                (_, Some(nc)) => {
                    // A chain of `new` only: its rules come.
                    let mut text = String::new();
                    for r in &nc.rules {
                        write_rule_line(&mut text, &nc.name, r, t.family, &opts);
                    }
                    if !text.is_empty() {
                        out.push(LineChange {
                            line,
                            old_lines: 0,
                            text,
                        });
                    }
                    j += 1;
                }
                (None, None) => break,
            }
        }
        // COMMIT
        line += 1;
    }
    Some((out, line))
}

/// Where [`super::chain_order_index`] puts a chain: builtin chains by hook, then user chains
/// by name.
fn print_key(c: &Chain) -> (bool, Option<usize>, &[u8]) {
    match c.policy {
        Some(_) => (false, c.hook().map(|h| h.index()), &[]),
        None => (true, None, c.name.as_bytes()),
    }
}
