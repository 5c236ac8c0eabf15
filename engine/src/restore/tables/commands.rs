//! Carrying a command out on the table block being read, in order, as iptables-restore does:
//! chain declarations (`:NAME POLICY [p:b]`), and `-A`/`-I`/`-R`/`-D`/`-F`/`-N`/`-X`/`-P`/`-E`
//! with what depends on the table's state (chain existence, positions, `-D` matching, jump
//! targets). Commit path (parsing); each command costs O(its own size), takes no lock and reads
//! no clock.

use super::super::extensions::is_target_name;
use super::super::lexer::{Tok, Token};
use super::super::rule::{AddrLists, Command, Ctx, check_chain_name};
use super::super::{ExternalRefKind, ParseError, ParseErrorKind as K};
use super::read_ahead::{Parsed, read_command};
use super::{Block, State, parse_counters};
use crate::model::{Chain, Counters, Hook, Location, Policy, Rule, RuleList, Target};

pub(super) fn declare_chain(
    b: &mut Block,
    w: &[Tok],
    line: u32,
    st: &mut State<'_, '_>,
) -> Result<(), ParseError> {
    let err = |tok: &Tok, kind: K| ParseError::new(line, tok.column, tok.text, kind);
    let first = &w[0];
    let name = Tok {
        text: &first.text[1..],
        column: first.column + 1,
    };
    let ctx = Ctx {
        family: st.opts.family,
        table: b.table.kind,
        line,
        set_exists: None,
        resolve_owner: None,
    };
    check_chain_name(&name, &ctx)?;
    let Some(policy) = w.get(1) else {
        return Err(err(first, K::BadPolicy));
    };
    let counters = match w.get(2) {
        Some(c) => Some(parse_counters(c.text).ok_or_else(|| err(c, K::BadCounters))?),
        None if st.opts.counters => return Err(err(policy, K::BadCounters)),
        None => None,
    };
    if let Some(extra) = w.get(3) {
        return Err(err(extra, K::BadArgument));
    }
    let location = Location {
        line,
        column: name.column,
    };
    if b.is_builtin(name.text) {
        let p = match policy.as_str() {
            "ACCEPT" => Some(Policy::Accept),
            "DROP" => Some(Policy::Drop),
            "-" => None,
            _ => return Err(err(policy, K::BadPolicy)),
        };
        let noflush = st.opts.noflush;
        if p.is_none() && noflush {
            st.external(b, &name, line, ExternalRefKind::KeepPolicy);
        }
        let keep_counters = st.opts.counters;
        if let Some(i) = b.chain_index(name.text) {
            let c = &mut b.table.chains[i];
            if let Some(p) = p {
                c.policy = Some(p);
                if keep_counters {
                    c.counters = counters.unwrap_or_default();
                }
            }
            c.location = location;
        }
        return Ok(());
    }
    if policy.text != "-" {
        return Err(err(policy, K::BadPolicy));
    }
    if is_target_name(name.text) {
        return Err(err(&name, K::ChainExists(name.text.to_string())));
    }
    match b.chain_index(name.text) {
        Some(i) => {
            // Create-or-flush, as iptables-restore.
            b.flush(i);
            b.table.chains[i].location = location;
        }
        None => b.push_chain(Chain {
            name: name.text.to_string(),
            policy: None,
            counters: Counters::default(),
            rules: RuleList::new(),
            location,
            nft_hook: None,
        }),
    }
    b.external_content.remove(name.as_str());
    Ok(())
}

/// Parses and applies one command line; `toks` is a buffer for the line's tokens.
pub(super) fn command_line<'a>(
    b: &mut Block,
    line: &'a str,
    line_no: u32,
    st: &mut State<'_, '_>,
    toks: &mut Vec<Token<'a>>,
) -> Result<(), ParseError> {
    let ctx = Ctx {
        family: st.opts.family,
        table: b.table.kind,
        line: line_no,
        set_exists: st.opts.set_exists,
        resolve_owner: st.opts.resolve_owner,
    };
    match read_command(line, &ctx, toks)? {
        Some(parsed) => apply_line(b, parsed, &ctx, st),
        None => Ok(()),
    }
}

/// Carries out a parsed command line on the table block (the part of a restore that must run
/// in order: chain existence, positions, `-D` matching).
pub(super) fn apply_line(
    b: &mut Block,
    parsed: Parsed<'_>,
    ctx: &Ctx<'_>,
    st: &mut State<'_, '_>,
) -> Result<(), ParseError> {
    let Parsed {
        command,
        command_token,
        chain,
        has_spec,
        target_token,
        mut rule,
        location,
        lists,
        warnings,
    } = parsed;
    st.warnings.extend(warnings);
    let line_no = ctx.line;
    rule.location = location;
    // With --counters every rule has counters (zero when not written), as in the kernel;
    // without, none are kept.
    rule.counters = st.opts.counters.then(|| rule.counters.unwrap_or_default());
    let noflush = st.opts.noflush;
    let takes_rule = matches!(
        command,
        Command::Append | Command::Insert(_) | Command::Replace(_) | Command::Delete(None)
    );
    if !takes_rule && has_spec {
        return Err(ctx.err(
            &command_token,
            K::UnexpectedLine("this command takes no rule options"),
        ));
    }
    let chain_tok = chain;
    // Commands with a chain that this text does not know.
    let missing = |b: &Block, name: &Tok| b.chain_index(name.text).is_none();
    match command {
        Command::Append | Command::Insert(_) | Command::Replace(_) | Command::Delete(_) => {
            let Some(ch) = chain_tok else {
                return Err(ctx.err(&command_token, K::NoCommand));
            };
            if takes_rule && !matches!(command, Command::Delete(_)) {
                check_target(b, &rule, target_token, ctx, st, line_no)?;
            }
            if missing(b, &ch) {
                if !noflush {
                    return Err(ctx.err(&ch, K::NoSuchChain(ch.text.to_string())));
                }
                if b.is_builtin(ch.text) {
                    return Err(ctx.err(&ch, K::NoSuchChain(ch.text.to_string())));
                }
                b.push_chain(Chain {
                    name: ch.text.to_string(),
                    policy: None,
                    counters: Counters::default(),
                    rules: RuleList::new(),
                    location: Location {
                        line: line_no,
                        column: ch.column,
                    },
                    nft_hook: None,
                });
                b.external_content.insert(ch.text.to_string());
            }
            let external = b.external_content.contains(ch.as_str());
            let Some(i) = b.chain_index(ch.text) else {
                return Err(ctx.err(&ch, K::NoSuchChain(ch.text.to_string())));
            };
            let len = b.table.chains[i].rules.len();
            let bad_number = |n: u32| ctx.err(&ch, K::BadRuleNumber(n.to_string()));
            if let Some(lists) = lists {
                return apply_list(b, i, command, &lists, &rule, external, (ctx, st, &ch));
            }
            match command {
                Command::Append => {
                    if external {
                        st.external(b, &ch, line_no, ExternalRefKind::AddRules);
                    }
                    b.append(i, rule);
                }
                Command::Insert(n) => {
                    let pos = n as usize - 1;
                    if external {
                        // Positions count rules that already exist; we only know ours.
                        st.external(b, &ch, line_no, ExternalRefKind::AddRules);
                        b.insert(i, pos.min(len), rule);
                    } else if pos > len {
                        return Err(bad_number(n));
                    } else {
                        b.insert(i, pos, rule);
                    }
                }
                Command::Replace(n) | Command::Delete(Some(n)) => {
                    let pos = n as usize - 1;
                    if pos < len {
                        b.remove_rule(i, pos);
                        if let Command::Replace(_) = command {
                            b.insert(i, pos, rule);
                        }
                    } else if external {
                        st.external(b, &ch, line_no, ExternalRefKind::ChangeRule);
                    } else {
                        return Err(bad_number(n));
                    }
                }
                Command::Delete(None) => {
                    let found = b.table.chains[i]
                        .rules
                        .iter()
                        .position(|r| same_rule(r, &rule));
                    match found {
                        Some(p) => b.remove_rule(i, p),
                        None if external => {
                            st.external(b, &ch, line_no, ExternalRefKind::ChangeRule);
                        }
                        None => return Err(ctx.err(&command_token, K::NoSuchRule)),
                    }
                }
                _ => {}
            }
        }
        Command::NewChain => {
            let Some(ch) = chain_tok else {
                return Err(ctx.err(&command_token, K::NoCommand));
            };
            if b.chain_index(ch.text).is_some()
                || is_target_name(ch.text)
                || Hook::from_chain_name(ch.text).is_some()
            {
                return Err(ctx.err(&ch, K::ChainExists(ch.text.to_string())));
            }
            b.push_chain(Chain {
                name: ch.text.to_string(),
                policy: None,
                counters: Counters::default(),
                rules: RuleList::new(),
                location: Location {
                    line: line_no,
                    column: ch.column,
                },
                nft_hook: None,
            });
            b.external_content.remove(ch.as_str());
        }
        Command::DeleteChain => match chain_tok {
            Some(ch) => match b.chain_index(ch.text) {
                Some(i) => {
                    let c = &b.table.chains[i];
                    if c.policy.is_some() || !c.rules.is_empty() || b.referenced(ch.text) {
                        return Err(ctx.err(&ch, K::ChainInUse(ch.text.to_string())));
                    }
                    b.remove_chain(i);
                    b.external_content.remove(ch.as_str());
                    if noflush {
                        st.external(b, &ch, line_no, ExternalRefKind::Delete);
                    }
                }
                None if noflush && !st.known => {
                    st.external(b, &ch, line_no, ExternalRefKind::Delete)
                }
                None => return Err(ctx.err(&ch, K::NoSuchChain(ch.text.to_string()))),
            },
            None => {
                // The first busy user chain by name, the order libiptc keeps user chains in.
                let busy = (b.table.chains.iter())
                    .filter(|c| c.policy.is_none())
                    .filter(|c| !c.rules.is_empty() || b.referenced(&c.name))
                    .min_by(|x, y| x.name.as_bytes().cmp(y.name.as_bytes()));
                if let Some(c) = busy {
                    return Err(ctx.err(&command_token, K::ChainInUse(c.name.clone())));
                }
                b.table.chains.retain(|c| c.policy.is_some());
                let index = (b.table.chains.iter().enumerate())
                    .map(|(i, c)| (c.name.clone(), i))
                    .collect();
                b.index = index;
            }
        },
        Command::Flush => match chain_tok {
            Some(ch) => match b.chain_index(ch.text) {
                Some(i) => {
                    b.flush(i);
                    if b.external_content.remove(ch.as_str()) {
                        st.external(b, &ch, line_no, ExternalRefKind::Flush);
                    }
                }
                None if noflush => st.external(b, &ch, line_no, ExternalRefKind::Flush),
                None => return Err(ctx.err(&ch, K::NoSuchChain(ch.text.to_string()))),
            },
            None => {
                for c in &mut b.table.chains {
                    c.rules.clear();
                }
                *b.targeted.get_mut() = Some(Default::default());
                b.external_content.clear();
            }
        },
        Command::Rename(new) => {
            let Some(ch) = chain_tok else {
                return Err(ctx.err(&command_token, K::NoCommand));
            };
            let Some(i) = b.chain_index(ch.text) else {
                return Err(ctx.err(&ch, K::NoSuchChain(ch.text.to_string())));
            };
            if b.table.chains[i].policy.is_some() {
                return Err(ctx.err(&ch, K::UnexpectedLine("a builtin chain cannot be renamed")));
            }
            if b.chain_index(new.text).is_some()
                || is_target_name(new.text)
                || Hook::from_chain_name(new.text).is_some()
            {
                return Err(ctx.err(&new, K::ChainExists(new.text.to_string())));
            }
            b.rename_chain(i, new.text);
        }
        Command::Policy(p) => {
            let Some(ch) = chain_tok else {
                return Err(ctx.err(&command_token, K::NoCommand));
            };
            if !b.is_builtin(ch.text) {
                return Err(ctx.err(&p, K::BadPolicy));
            }
            let pol = match p.as_str() {
                "ACCEPT" => Policy::Accept,
                "DROP" => Policy::Drop,
                _ => return Err(ctx.err(&p, K::BadPolicy)),
            };
            if let Some(i) = b.chain_index(ch.text) {
                b.table.chains[i].policy = Some(pol);
            }
        }
    }
    Ok(())
}

/// Carries out `-A/-I/-D/-R` of a line with `-s a,b` / `-d a,b` on chain `i`, as iptables'
/// `append_entry` / `insert_entry` / `delete_entry` loop over the addresses (see
/// [`AddrLists`]): every expanded rule is appended, inserted at the line's position, or
/// deleted (each must exist); `-R` is refused.
fn apply_list(
    b: &mut Block,
    i: usize,
    command: Command<'_>,
    lists: &AddrLists,
    rule: &Rule,
    external: bool,
    (ctx, st, ch): (&Ctx<'_>, &mut State<'_, '_>, &Tok<'_>),
) -> Result<(), ParseError> {
    // Counted before it is built: a few kilobytes of addresses stand for millions of rules.
    let count = st.listed.saturating_add(lists.count());
    if count > st.opts.max_rules {
        return Err(ctx.err(
            ch,
            K::TooManyRules {
                count,
                max: st.opts.max_rules,
            },
        ));
    }
    st.listed = count;
    let rules = lists.expand(rule);
    let len = b.table.chains[i].rules.len();
    match command {
        Command::Append => {
            if external {
                st.external(b, ch, ctx.line, ExternalRefKind::AddRules);
            }
            for r in rules {
                b.append(i, r);
            }
        }
        Command::Insert(n) => {
            let pos = n as usize - 1;
            if external {
                st.external(b, ch, ctx.line, ExternalRefKind::AddRules);
            } else if pos > len {
                return Err(ctx.err(ch, K::BadRuleNumber(n.to_string())));
            }
            for r in rules {
                b.table.chains[i].rules.insert(pos.min(len), r);
            }
        }
        Command::Delete(None) => {
            for r in &rules {
                let found = b.table.chains[i].rules.iter().position(|x| same_rule(x, r));
                match found {
                    Some(p) => {
                        b.table.chains[i].rules.remove(p);
                    }
                    None if external => {
                        st.external(b, ch, ctx.line, ExternalRefKind::ChangeRule);
                    }
                    None => return Err(ctx.err(ch, K::NoSuchRule)),
                }
            }
        }
        _ => return Err(ctx.err(ch, K::ReplaceWithList)),
    }
    Ok(())
}

/// `-j CHAIN` / `-g CHAIN` must name a user chain declared on an earlier line (as
/// iptables-restore: "Couldn't load target"); with `--noflush` an unknown chain is recorded.
fn check_target(
    b: &Block,
    rule: &Rule,
    tok: Option<Tok>,
    ctx: &Ctx<'_>,
    st: &mut State<'_, '_>,
    line: u32,
) -> Result<(), ParseError> {
    let (name, kind) = match &rule.target {
        Target::Jump(n) => (n, ExternalRefKind::Jump),
        Target::Goto(n) => (n, ExternalRefKind::Goto),
        _ => return Ok(()),
    };
    let tok = tok.unwrap_or(Tok {
        text: name,
        column: 0,
    });
    if b.is_builtin(name) || Hook::from_chain_name(name).is_some() {
        return Err(ctx.err(&tok, K::JumpToBuiltin(name.clone())));
    }
    if b.chain_index(name).is_some() {
        return Ok(());
    }
    if st.opts.noflush {
        st.external(b, &tok, line, kind);
        return Ok(());
    }
    let hint = nearest_target(name, b.table.chains.iter().map(|c| c.name.as_str()));
    Err(ctx.err(
        &tok,
        K::UnknownTarget {
            name: name.clone(),
            hint,
        },
    ))
}

/// The target or chain (of `chains`) nearest to `name`: the same name in another case, else
/// one within a Damerau-Levenshtein distance of 2 (at most a third of the name), the nearest
/// first. For the hint of an unknown `-j NAME`; runs only on that error.
fn nearest_target<'a>(name: &str, chains: impl Iterator<Item = &'a str>) -> Option<String> {
    use crate::restore::extensions::{KNOWN_TARGETS, OPAQUE_TARGETS};
    let candidates: Vec<&str> = KNOWN_TARGETS
        .iter()
        .chain(OPAQUE_TARGETS)
        .copied()
        .chain(chains)
        .collect();
    if let Some(c) = candidates.iter().find(|c| c.eq_ignore_ascii_case(name)) {
        return Some((*c).to_owned());
    }
    let upper = name.to_ascii_uppercase();
    let most = (name.chars().count() / 3).clamp(1, 2);
    candidates
        .iter()
        .map(|c| {
            (
                strsim::damerau_levenshtein(&upper, &c.to_ascii_uppercase()),
                *c,
            )
        })
        .filter(|&(d, _)| d <= most)
        .min()
        .map(|(_, c)| c.to_owned())
}

/// Rule equality for `-D CHAIN rulespec`: everything but location and counters
/// ([`Rule::same_content`], which compares in place: `-D` by rulespec walks the chain, as
/// iptables does, and a copy of each rule it passes made that walk ~6 ms at 100k rules).
fn same_rule(a: &Rule, b: &Rule) -> bool {
    a.same_content(b)
}
