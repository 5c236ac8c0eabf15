//! Reading a command line into a [`Parsed`] command: its tokens, a `[p:b]` prefix and
//! `parse_line`, everything that depends only on the line, the family and the block's table.
//! That is why it can run ahead of the sequential pass on other threads ([`read_ahead`]).
//! Commit path (parsing); allocates the rule it reads, takes no lock, reads no clock.

use super::super::lexer::{Tok, Token, tokenize_into};
use super::super::rule::{AddrLists, Command, Ctx, parse_line};
use super::super::{ParseError, ParseErrorKind as K, ParseWarning, ResolveOwner};
use super::parse_counters;
use crate::model::{Family, Location, Rule, TableKind};

/// The part of a command line that depends only on the line and `ctx` (shared by
/// [`command_line`](super::commands::command_line) and [`read_line`]): tokens, a `[p:b]` prefix, `parse_line`.
pub(super) fn read_command<'t, 'a: 't>(
    line: &'a str,
    ctx: &Ctx<'_>,
    toks: &'t mut Vec<Token<'a>>,
) -> Result<Option<Parsed<'t>>, ParseError> {
    let line_no = ctx.line;
    tokenize_into(line, toks)
        .map_err(|u| ParseError::new(line_no, u.column, "\"", K::UnterminatedQuote))?;
    let mut toks = &toks[..];
    let mut prefix = None;
    let location = Location {
        line: line_no,
        column: toks.first().map_or(1, |t| t.column),
    };
    if let Some(t) = toks.first().filter(|t| t.text.starts_with('[')) {
        prefix = Some(
            parse_counters(&t.text)
                .ok_or_else(|| ParseError::new(line_no, t.column, &*t.text, K::BadCounters))?,
        );
        toks = &toks[1..];
    }
    let mut rule = Rule::default();
    let Some(l) = parse_line(toks, ctx, prefix, &mut rule)? else {
        return Ok(None);
    };
    Ok(Some(Parsed {
        command: l.command,
        command_token: l.command_token,
        chain: l.chain,
        has_spec: l.has_spec,
        target_token: l.target_token,
        rule,
        location,
        lists: l.lists,
        warnings: l.warnings,
    }))
}

/// What [`read_ahead`] made of one line: the table it was read for, and the parsed `-A`
/// command or the line's error.
pub(super) type Ahead<'a> = Option<(TableKind, Result<Parsed<'a>, ParseError>)>;

/// The table of each line: that of the last `*table` line before it (`None` after a bad one,
/// and before the first).
pub(super) fn line_tables(lines: &[&str]) -> Vec<Option<TableKind>> {
    let mut table = None;
    lines
        .iter()
        .map(|raw| {
            let lead = raw.trim_start_matches([' ', '\t']);
            if let Some(name) = lead.strip_prefix('*') {
                let name = name.trim_end_matches(['\r', ' ', '\t']);
                table = TableKind::from_name(name).filter(|_| !name.contains([' ', '\t']));
            }
            table
        })
        .collect()
}

/// Reads the rule lines `from..to` of `lines` ahead of the sequential pass (on another
/// thread): tokenizing and `parse_line` depend only on the line, the family and the table of
/// the block it is in, not on what came before, so they can run out of order; the sequential
/// pass then only carries the commands out ([`apply_line`](super::commands::apply_line)), in order, as iptables-restore
/// does. A line gets `Some` when it is an `-A` command whose tokens are slices of the line
/// (not rebuilt from quotes), or when it has an error; every other line is parsed by the
/// sequential pass as usual, which also uses a result only when its block has the table the
/// line was read for (`tables`, from [`line_tables`]).
pub(super) fn read_ahead<'a>(
    lines: &[&'a str],
    tables: &[Option<TableKind>],
    family: Family,
    owner: Option<ResolveOwner<'_>>,
    from: usize,
    to: usize,
) -> Vec<Ahead<'a>> {
    let mut toks: Vec<Token<'a>> = Vec::with_capacity(32);
    (from..to)
        .map(|idx| {
            let line = lines[idx].strip_suffix('\r').unwrap_or(lines[idx]);
            let lead = line.trim_start_matches([' ', '\t']);
            if line.starts_with('#')
                || line.trim().is_empty()
                || lead.starts_with(['*', ':'])
                || lead.starts_with("COMMIT")
            {
                return None;
            }
            let kind = tables[idx]?;
            let line_no = u32::try_from(idx + 1).ok()?;
            read_line(line, line_no, family, owner, kind, &mut toks).map(|r| (kind, r))
        })
        .collect()
}

/// One line of [`read_ahead`]: [`read_command`], kept only for an `-A` command whose tokens
/// lie in the line, or an error.
fn read_line<'a>(
    line: &'a str,
    line_no: u32,
    family: Family,
    owner: Option<ResolveOwner<'_>>,
    table: TableKind,
    toks: &mut Vec<Token<'a>>,
) -> Option<Result<Parsed<'a>, ParseError>> {
    let ctx = Ctx {
        family,
        table,
        line: line_no,
        set_exists: None,
        resolve_owner: owner,
    };
    let p = match read_command(line, &ctx, toks) {
        Err(e) => return Some(Err(e)),
        Ok(None) => return None,
        Ok(Some(p)) => p,
    };
    if !matches!(p.command, Command::Append) {
        return None;
    }
    let target_token = match p.target_token {
        Some(t) => Some(in_line(line, t)?),
        None => None,
    };
    Some(Ok(Parsed {
        command: Command::Append,
        command_token: in_line(line, p.command_token)?,
        chain: Some(in_line(line, p.chain?)?),
        has_spec: p.has_spec,
        target_token,
        rule: p.rule,
        location: p.location,
        lists: p.lists,
        warnings: p.warnings,
    }))
}

/// `tok` as a slice of `line` when its text is one (an unquoted token's is; a token rebuilt
/// from quotes lives in the token buffer and gives `None`).
fn in_line<'a>(line: &'a str, tok: Tok<'_>) -> Option<Tok<'a>> {
    let start = (tok.text.as_ptr() as usize).checked_sub(line.as_ptr() as usize)?;
    let text = line.get(start..start.checked_add(tok.text.len())?)?;
    (text.as_ptr() == tok.text.as_ptr()).then_some(Tok {
        text,
        column: tok.column,
    })
}

/// A command line after `parse_line`, the part that does not depend on the table's state.
pub(super) struct Parsed<'t> {
    pub(super) command: Command<'t>,
    pub(super) command_token: Tok<'t>,
    pub(super) chain: Option<Tok<'t>>,
    pub(super) has_spec: bool,
    pub(super) target_token: Option<Tok<'t>>,
    pub(super) rule: Rule,
    pub(super) location: Location,
    /// `-s a,b` / `-d a,b`: `rule` stands for several rules.
    pub(super) lists: Option<Box<AddrLists>>,
    /// The line's warnings.
    pub(super) warnings: Vec<ParseWarning>,
}
