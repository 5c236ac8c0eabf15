//! The nft text parser: tokens (after `define` expansion) to a [`Ruleset`].
//!
//! Grammar (nftables v1.1 `nft -f`, the parts modelled): top level `flush ruleset`,
//! `table [FAMILY] NAME { ... }`, `add|create table|chain|rule|set|map|element ...`,
//! `insert rule ...`, `define NAME = VALUE`, `undefine NAME`; inside a table `chain NAME { ... }`,
//! `set|map NAME { ... }`; inside a chain `type T hook H priority P;`, `policy P;` and rules,
//! one per line or `;`. A rule is statements left to right (see [`Stmt`]); a value is typed
//! by the expression on its left ([`DataType`]).
//!
//! This file reads the commands, tables, chains and sets; `parse/rule.rs` reads rules
//! (statements, expressions, values); `parse/rewrite.rs` applies what nft checks and rewrites
//! once a rule or set is read; [`check_refs`] then checks every jump and `@set` reference.

use std::collections::HashMap;

use super::lexer::{Tok, Token, tokenize};
use super::types::{parse_time, prefix_elem};
use super::{
    BaseChain, BitOp, Chain, ChainType, CtKey, DataType, Elem, ErrorKind, Expr, FIB_FLAGS, Family,
    FibResult, Hook, Limit, Log, MapData, Match, MetaKey, Nat, NatAddr, NatKind, NftError,
    NftErrors, Op, Payload, Policy, Pos, Proto, Reject, Rule, Ruleset, SET_FLAGS, Set, SetElem,
    SetRhs, SetType, SetValue, Stmt, Table, Value, Verdict,
};

mod rewrite;
mod rule;

pub(crate) use rewrite::{eliminate_dependencies, finish_rule, merge_intervals};
pub(crate) use rule::{expr_types, meta_key, payload_field};

/// The most tokens a text may have after `$variable` expansion. Each expansion is sized
/// before it is made, so a text whose variables nest (`define b = { $a, $a }`) fails with
/// [`ErrorKind::TooLarge`] at the use that would pass the limit, having built nothing past it.
pub const MAX_EXPANDED_TOKENS: usize = 1_000_000;

/// The most elements one set, map or anonymous set may have (nft's own limit is memory).
pub const MAX_SET_ELEMENTS: usize = 1_000_000;

/// Parses nft text. `file` names the text in errors (`FILE:LINE:COL: ...`). The text is read
/// as `nft -f FILE` reads it into an empty ruleset (`flush ruleset` empties what came
/// before). Errors: the first problem found, at its position; nothing is returned then.
pub fn parse(file: &str, text: &str) -> Result<Ruleset, NftErrors> {
    let one = |e: NftError| NftErrors(vec![e]);
    let toks = tokenize(file, text).map_err(one)?;
    let toks = expand(file, toks).map_err(one)?;
    let mut p = Parser {
        file,
        toks,
        i: 0,
        rs: Ruleset::default(),
        chain_ix: HashMap::new(),
        set_ix: HashMap::new(),
        added: HashMap::new(),
    };
    p.top().map_err(one)?;
    // Elements added by `add element` are sorted and checked once, here, not per command.
    let mut added: Vec<((usize, usize), Pos)> = p.added.drain().collect();
    added.sort_unstable();
    for ((ti, si), pos) in added {
        sort_elements(&mut p.rs.tables[ti].sets[si].elements);
        let set = &p.rs.tables[ti].sets[si];
        p.check_intervals(set, pos).map_err(one)?;
    }
    check_refs(file, &p.rs).map_err(one)?;
    Ok(p.rs)
}

// === define expansion ===

fn at_stmt_start(out: &[Token]) -> bool {
    matches!(
        out.last().map(|t| &t.tok),
        None | Some(Tok::Newline | Tok::Punct(";" | "{" | "}"))
    )
}

/// Removes `define`/`undefine` lines and replaces each `$name` with its value's tokens.
fn expand(file: &str, toks: Vec<Token>) -> Result<Vec<Token>, NftError> {
    let mut defs: HashMap<String, Vec<Token>> = HashMap::new();
    let mut out: Vec<Token> = Vec::with_capacity(toks.len());
    let mut it = toks.into_iter().peekable();
    while let Some(t) = it.next() {
        let err = |kind| NftError::new(file, t.pos, &t.tok.text(), kind);
        match &t.tok {
            Tok::Word(w) if at_stmt_start(&out) && w == "include" => {
                return Err(err(ErrorKind::Include));
            }
            Tok::Word(w) if at_stmt_start(&out) && (w == "define" || w == "redefine") => {
                let name = match it.next() {
                    Some(Token {
                        tok: Tok::Word(n), ..
                    }) => n,
                    _ => return Err(err(ErrorKind::Unexpected("a variable name after define"))),
                };
                match it.next() {
                    Some(Token {
                        tok: Tok::Punct("="),
                        ..
                    }) => {}
                    _ => return Err(err(ErrorKind::Unexpected("`=` after the variable name"))),
                }
                let mut value = Vec::new();
                let mut depth = 0i32;
                while let Some(v) = it.peek() {
                    match v.tok {
                        Tok::Newline | Tok::Punct(";") if depth == 0 => break,
                        Tok::Punct("{") => depth += 1,
                        Tok::Punct("}") => depth -= 1,
                        _ => {}
                    }
                    let v = it.next().expect("peeked");
                    if let Tok::Var(name) = &v.tok {
                        let d = defs.get(name).ok_or_else(|| {
                            NftError::new(file, v.pos, &v.tok.text(), ErrorKind::UndefinedVariable)
                        })?;
                        if value.len() + d.len() > MAX_EXPANDED_TOKENS {
                            return Err(NftError::new(
                                file,
                                v.pos,
                                &v.tok.text(),
                                ErrorKind::TooLarge(format!(
                                    "variables expand past {MAX_EXPANDED_TOKENS} tokens"
                                )),
                            ));
                        }
                        value.extend(d.iter().filter(|t| t.tok != Tok::Newline).cloned());
                    } else if v.tok != Tok::Newline {
                        value.push(v);
                    }
                }
                if value.is_empty() {
                    return Err(err(ErrorKind::Unexpected("a value after `define NAME =`")));
                }
                defs.insert(name, value);
            }
            Tok::Word(w) if at_stmt_start(&out) && w == "undefine" => {
                if let Some(Token {
                    tok: Tok::Word(n), ..
                }) = it.next()
                {
                    defs.remove(&n);
                }
            }
            Tok::Var(name) => {
                let d = defs
                    .get(name)
                    .ok_or_else(|| err(ErrorKind::UndefinedVariable))?;
                if out.len() + d.len() > MAX_EXPANDED_TOKENS {
                    return Err(err(ErrorKind::TooLarge(format!(
                        "variables expand past {MAX_EXPANDED_TOKENS} tokens"
                    ))));
                }
                out.extend(d.iter().cloned());
            }
            _ => out.push(t),
        }
    }
    Ok(out)
}

// === parser ===

struct Parser<'a> {
    file: &'a str,
    toks: Vec<Token>,
    i: usize,
    rs: Ruleset,
    /// (table index, chain name) -> chain index: a lookup per rule, not a scan.
    chain_ix: HashMap<(usize, String), usize>,
    /// (table index, set name) -> set index.
    set_ix: HashMap<(usize, String), usize>,
    /// Sets that `add element` grew, with the position of the last such command.
    added: HashMap<(usize, usize), Pos>,
}

type R<T> = Result<T, NftError>;

fn is_end(t: &Tok) -> bool {
    matches!(t, Tok::Newline | Tok::Punct(";" | "}"))
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        &self.toks[self.i.min(self.toks.len() - 1)]
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.i < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn done(&self) -> bool {
        self.i >= self.toks.len()
    }

    fn err_at(&self, t: &Token, kind: ErrorKind) -> NftError {
        NftError::new(self.file, t.pos, &t.tok.text(), kind)
    }

    fn err(&self, kind: ErrorKind) -> NftError {
        self.err_at(self.peek(), kind)
    }

    fn peek_word(&self) -> Option<&str> {
        match &self.peek().tok {
            Tok::Word(w) => Some(w),
            _ => None,
        }
    }

    fn eat_word(&mut self, w: &str) -> bool {
        if self.peek_word() == Some(w) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        if matches!(&self.peek().tok, Tok::Punct(q) if *q == p) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, p: &'static str, what: &'static str) -> R<()> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            Err(self.err(ErrorKind::Unexpected(what)))
        }
    }

    fn word(&mut self, what: &'static str) -> R<(String, Pos)> {
        let t = self.next();
        match t.tok {
            Tok::Word(w) if w != ":" && w != "." => Ok((w, t.pos)),
            _ => Err(self.err_at(&t, ErrorKind::Unexpected(what))),
        }
    }

    /// A name: a word or a quoted string.
    fn name(&mut self, what: &'static str) -> R<(String, Pos)> {
        let t = self.next();
        match t.tok {
            Tok::Word(w) if w != ":" && w != "." => Ok((w, t.pos)),
            Tok::Str(s) => Ok((s, t.pos)),
            _ => Err(self.err_at(&t, ErrorKind::Unexpected(what))),
        }
    }

    fn number<T: std::str::FromStr>(&mut self, what: &'static str) -> R<T> {
        let t = self.next();
        match &t.tok {
            Tok::Word(w) => w
                .parse()
                .map_err(|_| self.err_at(&t, ErrorKind::Unexpected(what))),
            _ => Err(self.err_at(&t, ErrorKind::Unexpected(what))),
        }
    }

    fn skip_seps(&mut self) {
        while !self.done() && matches!(self.peek().tok, Tok::Newline | Tok::Punct(";")) {
            self.i += 1;
        }
    }

    fn skip_newlines(&mut self) {
        while !self.done() && self.peek().tok == Tok::Newline {
            self.i += 1;
        }
    }

    /// The end of a statement: newline, `;`, or (not consumed) `}`.
    fn end_stmt(&mut self) -> R<()> {
        match self.peek().tok {
            Tok::Newline | Tok::Punct(";") => {
                self.i += 1;
                Ok(())
            }
            Tok::Punct("}") => Ok(()),
            _ => Err(self.err(ErrorKind::Unexpected("the end of the statement"))),
        }
    }

    // --- top level ---

    fn top(&mut self) -> R<()> {
        loop {
            self.skip_seps();
            if self.done() {
                return Ok(());
            }
            let t = self.next();
            let Tok::Word(w) = &t.tok else {
                return Err(self.err_at(&t, ErrorKind::Unexpected("a command (table, add, flush)")));
            };
            match w.as_str() {
                "flush" => {
                    let (what, _) = self.word("`ruleset` after flush")?;
                    if what != "ruleset" {
                        return Err(
                            self.err_at(&t, ErrorKind::Unsupported(format!("`flush {what}`")))
                        );
                    }
                    self.rs.tables.clear();
                    self.chain_ix.clear();
                    self.set_ix.clear();
                    self.added.clear();
                    self.end_stmt()?;
                }
                "table" => self.table_cmd()?,
                "add" | "create" | "insert" => {
                    let insert = w == "insert";
                    let (obj, opos) = self.word("table, chain, rule, set, map or element")?;
                    match (obj.as_str(), insert) {
                        ("table", false) => self.table_cmd()?,
                        ("chain", false) => self.chain_cmd()?,
                        ("rule", _) => self.rule_cmd(insert)?,
                        ("set", false) | ("map", false) => self.set_cmd(obj == "map")?,
                        ("element", false) => self.element_cmd()?,
                        _ => {
                            return Err(NftError::new(
                                self.file,
                                opos,
                                &obj,
                                ErrorKind::Unsupported(format!("`{w} {obj}`")),
                            ));
                        }
                    }
                }
                other => {
                    return Err(
                        self.err_at(&t, ErrorKind::Unsupported(format!("command `{other}`")))
                    );
                }
            }
        }
    }

    fn family(&mut self) -> R<Family> {
        let f = match self.peek_word() {
            Some("ip") => Family::Ip,
            Some("ip6") => Family::Ip6,
            Some("inet") => Family::Inet,
            Some(w @ ("bridge" | "arp" | "netdev")) => {
                let w = w.to_string();
                return Err(self.err(ErrorKind::Family(w)));
            }
            _ => return Ok(Family::Ip),
        };
        self.i += 1;
        Ok(f)
    }

    fn table_index(&mut self, family: Family, name: &str, pos: Pos, create: bool) -> R<usize> {
        if let Some(i) = self
            .rs
            .tables
            .iter()
            .position(|t| t.family == family && t.name == name)
        {
            return Ok(i);
        }
        if !create {
            return Err(NftError::new(
                self.file,
                pos,
                name,
                ErrorKind::Name(format!("no table {} {name}", family.name())),
            ));
        }
        self.rs.tables.push(Table {
            family,
            name: name.to_string(),
            sets: Vec::new(),
            chains: Vec::new(),
            comment: None,
            pos,
        });
        Ok(self.rs.tables.len() - 1)
    }

    fn table_cmd(&mut self) -> R<()> {
        let family = self.family()?;
        let (name, pos) = self.name("a table name")?;
        let ti = self.table_index(family, &name, pos, true)?;
        if self.eat_punct("{") {
            self.table_body(ti)?;
        }
        self.end_stmt()
    }

    fn table_body(&mut self, ti: usize) -> R<()> {
        loop {
            self.skip_seps();
            if self.eat_punct("}") {
                return Ok(());
            }
            let t = self.next();
            let Tok::Word(w) = &t.tok else {
                return Err(self.err_at(&t, ErrorKind::Unexpected("chain, set, map or `}`")));
            };
            match w.as_str() {
                "chain" => {
                    let (name, pos) = self.name("a chain name")?;
                    let ci = self.chain_index(ti, &name, pos, true)?;
                    self.expect_punct("{", "`{` after the chain name")?;
                    self.chain_body(ti, ci)?;
                }
                "set" | "map" => {
                    let is_map = w == "map";
                    let (name, pos) = self.name("a set name")?;
                    self.expect_punct("{", "`{` after the set name")?;
                    self.set_body(ti, name, pos, is_map)?;
                }
                "comment" => {
                    let (c, _) = self.name("a quoted comment")?;
                    self.rs.tables[ti].comment = Some(c);
                    self.end_stmt()?;
                }
                other => {
                    return Err(
                        self.err_at(&t, ErrorKind::Unsupported(format!("`{other}` in a table")))
                    );
                }
            }
        }
    }

    fn chain_index(&mut self, ti: usize, name: &str, pos: Pos, create: bool) -> R<usize> {
        if let Some(i) = self.chain_ix.get(&(ti, name.to_string())) {
            return Ok(*i);
        }
        let table = &mut self.rs.tables[ti];
        if !create {
            return Err(NftError::new(
                self.file,
                pos,
                name,
                ErrorKind::Name(format!("no chain {name} in table {}", table.name)),
            ));
        }
        table.chains.push(Chain {
            name: name.to_string(),
            base: None,
            rules: Vec::new(),
            comment: None,
            pos,
        });
        let ci = table.chains.len() - 1;
        self.chain_ix.insert((ti, name.to_string()), ci);
        Ok(ci)
    }

    fn table_ref(&mut self, create: bool) -> R<usize> {
        let family = self.family()?;
        let (name, pos) = self.name("a table name")?;
        self.table_index(family, &name, pos, create)
    }

    fn chain_cmd(&mut self) -> R<()> {
        let ti = self.table_ref(false)?;
        let (name, pos) = self.name("a chain name")?;
        let ci = self.chain_index(ti, &name, pos, true)?;
        if self.eat_punct("{") {
            self.chain_body(ti, ci)?;
        }
        self.end_stmt()
    }

    fn rule_cmd(&mut self, insert: bool) -> R<()> {
        let ti = self.table_ref(false)?;
        let (name, pos) = self.name("a chain name")?;
        let ci = self.chain_index(ti, &name, pos, false)?;
        let family = self.rs.tables[ti].family;
        let rule = self.rule(ti, family)?;
        let rules = &mut self.rs.tables[ti].chains[ci].rules;
        if insert {
            rules.insert(0, rule);
        } else {
            rules.push(rule);
        }
        self.end_stmt()
    }

    fn set_cmd(&mut self, is_map: bool) -> R<()> {
        let ti = self.table_ref(false)?;
        let (name, pos) = self.name("a set name")?;
        self.expect_punct("{", "`{` after the set name")?;
        self.set_body(ti, name, pos, is_map)?;
        self.end_stmt()
    }

    fn element_cmd(&mut self) -> R<()> {
        let ti = self.table_ref(false)?;
        let (name, pos) = self.name("a set name")?;
        let Some(si) = self.set_ix.get(&(ti, name.clone())).copied() else {
            return Err(NftError::new(
                self.file,
                pos,
                &name,
                ErrorKind::Name(format!("no set {name}")),
            ));
        };
        let set = &self.rs.tables[ti].sets[si];
        let (key, data) = (self.set_types(&set.key), set.data.clone());
        self.expect_punct("{", "`{` before the elements")?;
        let elems = self.set_literal(&key, data.as_ref(), true)?;
        let set = &mut self.rs.tables[ti].sets[si];
        if set.elements.len() + elems.len() > MAX_SET_ELEMENTS {
            return Err(NftError::new(
                self.file,
                pos,
                &name,
                ErrorKind::TooLarge(format!("more than {MAX_SET_ELEMENTS} elements")),
            ));
        }
        set.elements.extend(elems);
        self.added.insert((ti, si), pos);
        self.end_stmt()
    }

    // --- chains ---

    fn chain_body(&mut self, ti: usize, ci: usize) -> R<()> {
        let family = self.rs.tables[ti].family;
        loop {
            self.skip_seps();
            if self.eat_punct("}") {
                return Ok(());
            }
            match self.peek_word() {
                Some("type") => {
                    let t = self.next();
                    let base = self.base_chain(&t)?;
                    self.rs.tables[ti].chains[ci].base = Some(base);
                    self.end_stmt()?;
                }
                Some("policy") => {
                    let t = self.next();
                    let policy = self.policy()?;
                    match &mut self.rs.tables[ti].chains[ci].base {
                        Some(b) => b.policy = policy,
                        None => {
                            return Err(self.err_at(
                                &t,
                                ErrorKind::Unexpected("`type ... hook ...` before the policy"),
                            ));
                        }
                    }
                    self.end_stmt()?;
                }
                Some("comment") => {
                    self.i += 1;
                    let (c, _) = self.name("a quoted comment")?;
                    self.rs.tables[ti].chains[ci].comment = Some(c);
                    self.end_stmt()?;
                }
                Some(w @ ("devices" | "device" | "flags")) => {
                    let w = format!("`{w}` in a chain");
                    return Err(self.err(ErrorKind::Unsupported(w)));
                }
                _ => {
                    let rule = self.rule(ti, family)?;
                    self.rs.tables[ti].chains[ci].rules.push(rule);
                    self.end_stmt()?;
                }
            }
        }
    }

    fn policy(&mut self) -> R<Policy> {
        let t = self.next();
        match &t.tok {
            Tok::Word(w) if w == "accept" => Ok(Policy::Accept),
            Tok::Word(w) if w == "drop" => Ok(Policy::Drop),
            _ => Err(self.err_at(&t, ErrorKind::Unexpected("accept or drop"))),
        }
    }

    fn base_chain(&mut self, _type_tok: &Token) -> R<BaseChain> {
        let t = self.next();
        let kind = match &t.tok {
            Tok::Word(w) if w == "filter" => ChainType::Filter,
            Tok::Word(w) if w == "nat" => ChainType::Nat,
            Tok::Word(w) if w == "route" => ChainType::Route,
            _ => return Err(self.err_at(&t, ErrorKind::Unexpected("filter, nat or route"))),
        };
        if !self.eat_word("hook") {
            return Err(self.err(ErrorKind::Unexpected("`hook`")));
        }
        let t = self.next();
        let hook = match &t.tok {
            Tok::Word(w) => match w.as_str() {
                "prerouting" => Hook::Prerouting,
                "input" => Hook::Input,
                "forward" => Hook::Forward,
                "output" => Hook::Output,
                "postrouting" => Hook::Postrouting,
                "ingress" | "egress" => {
                    return Err(self.err_at(&t, ErrorKind::Unsupported(format!("hook `{w}`"))));
                }
                _ => return Err(self.err_at(&t, ErrorKind::Unexpected("a hook name"))),
            },
            _ => return Err(self.err_at(&t, ErrorKind::Unexpected("a hook name"))),
        };
        if self.peek_word() == Some("device") {
            return Err(self.err(ErrorKind::Unsupported("`device`".into())));
        }
        if !self.eat_word("priority") {
            return Err(self.err(ErrorKind::Unexpected("`priority`")));
        }
        let priority = self.priority()?;
        let mut policy = Policy::Accept;
        // `; policy P` may follow on the same line or the next ones.
        if matches!(self.peek().tok, Tok::Punct(";")) {
            let mut j = self.i + 1;
            while j < self.toks.len() && self.toks[j].tok == Tok::Newline {
                j += 1;
            }
            if matches!(&self.toks.get(j).map(|t| &t.tok), Some(Tok::Word(w)) if w == "policy") {
                self.i = j + 1;
                policy = self.policy()?;
            }
        }
        Ok(BaseChain {
            kind,
            hook,
            priority,
            policy,
        })
    }

    /// `N`, `NAME`, `NAME + N`, `NAME - N` (also written without blanks).
    fn priority(&mut self) -> R<i32> {
        let t = self.next();
        let Tok::Word(w) = &t.tok else {
            return Err(self.err_at(&t, ErrorKind::Unexpected("a priority")));
        };
        let bad = |p: &Self| {
            p.err_at(
                &t,
                ErrorKind::Unexpected(
                    "a priority (a number or raw, mangle, dstnat, filter, security, srcnat)",
                ),
            )
        };
        let (name, mut rest) = match w.find(['+', '-']) {
            Some(k) if k > 0 => (&w[..k], w[k..].to_string()),
            _ => (w.as_str(), String::new()),
        };
        let base = match name {
            "raw" => -300,
            "mangle" => -150,
            "dstnat" => -100,
            "filter" => 0,
            "security" => 50,
            "srcnat" => 100,
            _ => return w.parse::<i32>().map_err(|_| bad(self)),
        };
        if rest.is_empty() {
            if let Some(op @ ("+" | "-")) = self.peek_word() {
                let op = op.to_string();
                self.i += 1;
                let (n, _) = self.word("a number")?;
                rest = format!("{op}{n}");
            }
        }
        if rest.is_empty() {
            return Ok(base);
        }
        let off: i32 = rest
            .trim_start_matches('+')
            .parse()
            .map_err(|_| bad(self))?;
        Ok(base + off)
    }

    // --- sets ---

    fn set_types(&self, t: &SetType) -> Vec<DataType> {
        set_key_types(t)
    }

    fn set_type(&mut self, allow_verdict: bool, ti: usize) -> R<SetType> {
        let family = self.rs.tables[ti].family;
        if self.eat_word("typeof") {
            let e = self.concat_expr(family)?;
            return Ok(SetType::Typeof(e));
        }
        if !self.eat_word("type") {
            return Err(self.err(ErrorKind::Unexpected("`type` or `typeof`")));
        }
        self.datatypes(allow_verdict)
    }

    /// `A` or `A . B . ...`: a datatype or a concatenation of them (`verdict` alone, when
    /// `allow_verdict`: a map's data); an unknown name is refused by name at its position.
    fn datatypes(&mut self, allow_verdict: bool) -> R<SetType> {
        let mut types = Vec::new();
        loop {
            let (w, pos) = self.word("a datatype")?;
            if allow_verdict && w == "verdict" && types.is_empty() {
                return Ok(SetType::Verdict);
            }
            match DataType::from_name(&w) {
                Some(t) => types.push(t),
                None => {
                    return Err(NftError::new(
                        self.file,
                        pos,
                        &w,
                        ErrorKind::Unsupported(format!("datatype `{w}`")),
                    ));
                }
            }
            if !self.eat_word(".") {
                return Ok(SetType::Types(types));
            }
        }
    }

    fn set_body(&mut self, ti: usize, name: String, pos: Pos, is_map: bool) -> R<()> {
        if self.set_ix.contains_key(&(ti, name.clone())) {
            return Err(NftError::new(
                self.file,
                pos,
                &name,
                ErrorKind::Name(format!("set {name} is declared twice")),
            ));
        }
        let mut set = Set {
            name,
            is_map,
            key: SetType::Types(Vec::new()),
            data: None,
            flags: 0,
            timeout_ms: None,
            gc_interval_ms: None,
            size: None,
            counter: false,
            comment: None,
            elements: Vec::new(),
            pos,
        };
        let mut typed = false;
        loop {
            self.skip_seps();
            if self.eat_punct("}") {
                break;
            }
            let t = self.peek().clone();
            let Tok::Word(w) = &t.tok else {
                return Err(self.err(ErrorKind::Unexpected("a set property or `}`")));
            };
            match w.as_str() {
                "type" | "typeof" => {
                    set.key = self.set_type(false, ti)?;
                    if self.eat_word(":") {
                        if !is_map {
                            return Err(self.err(ErrorKind::Unexpected("a map for `type A : B`")));
                        }
                        set.data = Some(self.set_type_data(ti)?);
                    } else if is_map {
                        return Err(self.err(ErrorKind::Unexpected("`: DATATYPE` in a map")));
                    }
                    typed = true;
                }
                "flags" => {
                    self.i += 1;
                    loop {
                        let (f, fpos) = self.word("a set flag")?;
                        match SET_FLAGS.iter().position(|x| *x == f) {
                            Some(b) => set.flags |= 1 << b,
                            None => {
                                return Err(NftError::new(
                                    self.file,
                                    fpos,
                                    &f,
                                    ErrorKind::Unsupported(format!("set flag `{f}`")),
                                ));
                            }
                        }
                        if !self.eat_punct(",") {
                            break;
                        }
                    }
                }
                "timeout" | "gc-interval" => {
                    let which = w.clone();
                    self.i += 1;
                    let (v, _) = self.word("a time")?;
                    let ms = parse_time(&v).ok_or_else(|| {
                        self.err_at(&t, ErrorKind::Unexpected("a time such as 30s or 1h"))
                    })?;
                    if which == "timeout" {
                        set.timeout_ms = Some(ms);
                        set.flags |= 4;
                    } else {
                        set.gc_interval_ms = Some(ms);
                    }
                }
                "size" => {
                    self.i += 1;
                    set.size = Some(self.number("a size")?);
                }
                "counter" => {
                    self.i += 1;
                    set.counter = true;
                }
                "comment" => {
                    self.i += 1;
                    set.comment = Some(self.name("a quoted comment")?.0);
                }
                "elements" => {
                    if !typed {
                        return Err(self.err(ErrorKind::Unexpected("`type` before `elements`")));
                    }
                    self.i += 1;
                    self.expect_punct("=", "`=` after elements")?;
                    self.expect_punct("{", "`{` before the elements")?;
                    let key = self.set_types(&set.key);
                    let elems = self.set_literal(&key, set.data.as_ref(), true)?;
                    set.elements.extend(elems);
                }
                other => {
                    return Err(self.err(ErrorKind::Unsupported(format!("`{other}` in a set"))));
                }
            }
            // Properties end at a newline or `;`, but `{ type ipv4_addr timeout 60s }` on one
            // line is accepted too, as nft does.
            if matches!(self.peek().tok, Tok::Newline | Tok::Punct(";")) {
                self.i += 1;
            }
        }
        if !typed {
            return Err(NftError::new(
                self.file,
                pos,
                &set.name,
                ErrorKind::Unexpected("a `type` or `typeof` line in the set"),
            ));
        }
        sort_elements(&mut set.elements);
        self.check_intervals(&set, pos)?;
        self.set_ix
            .insert((ti, set.name.clone()), self.rs.tables[ti].sets.len());
        self.rs.tables[ti].sets.push(set);
        Ok(())
    }

    fn set_type_data(&mut self, ti: usize) -> R<SetType> {
        if self.eat_word("verdict") {
            return Ok(SetType::Verdict);
        }
        if self.peek_word() == Some("typeof") || self.peek_word() == Some("type") {
            return self.set_type(true, ti);
        }
        // `type A : B`: B is a bare datatype (or a concatenation of them); `verdict` was
        // taken above.
        self.datatypes(false)
    }

    /// Elements after `{` up to and including `}`. `named`: element options (`timeout`)
    /// are allowed. `data`: the map's data type (None for a set).
    fn set_literal(
        &mut self,
        key: &[DataType],
        data: Option<&SetType>,
        named: bool,
    ) -> R<Vec<SetElem>> {
        let mut out = Vec::new();
        self.set_literal_into(key, data, named, &mut out)?;
        Ok(out)
    }

    fn set_literal_into(
        &mut self,
        key: &[DataType],
        data: Option<&SetType>,
        named: bool,
        out: &mut Vec<SetElem>,
    ) -> R<()> {
        loop {
            self.skip_newlines();
            if self.eat_punct("}") {
                return Ok(());
            }
            if out.len() >= MAX_SET_ELEMENTS {
                return Err(self.err(ErrorKind::TooLarge(format!(
                    "more than {MAX_SET_ELEMENTS} elements"
                ))));
            }
            if self.eat_punct("{") {
                // A nested anonymous set (from a variable): its elements join this one.
                self.set_literal_into(key, data, named, out)?;
            } else {
                let k = self.elem(key, false)?;
                let mut e = SetElem {
                    key: k,
                    data: None,
                    timeout_ms: None,
                    expires_ms: None,
                    comment: None,
                };
                loop {
                    match self.peek_word() {
                        Some("timeout") if named => {
                            let t = self.next();
                            let (v, _) = self.word("a time")?;
                            e.timeout_ms = Some(parse_time(&v).ok_or_else(|| {
                                self.err_at(&t, ErrorKind::Unexpected("a time such as 30s"))
                            })?);
                        }
                        Some("comment") if named => {
                            self.i += 1;
                            e.comment = Some(self.name("a quoted comment")?.0);
                        }
                        Some("expires") if named => {
                            let t = self.next();
                            let (v, _) = self.word("a time")?;
                            e.expires_ms = Some(parse_time(&v).ok_or_else(|| {
                                self.err_at(&t, ErrorKind::Unexpected("a time such as 29s500ms"))
                            })?);
                        }
                        Some(w @ ("expires" | "counter" | "comment" | "timeout")) => {
                            let w = format!("element option `{w}`");
                            return Err(self.err(ErrorKind::Unsupported(w)));
                        }
                        _ => break,
                    }
                }
                if self.eat_word(":") {
                    let Some(dt) = data else {
                        return Err(self.err(ErrorKind::Unexpected(
                            "`,` or `}` (this is a set, not a map)",
                        )));
                    };
                    e.data = Some(match dt {
                        SetType::Verdict => MapData::Verdict(self.verdict_word()?),
                        t => {
                            let types = self.set_types(t);
                            MapData::Value(self.elem(&types, false)?)
                        }
                    });
                } else if data.is_some() {
                    return Err(
                        self.err(ErrorKind::Unexpected("`:` and the data of the map element"))
                    );
                }
                out.push(e);
            }
            self.skip_newlines();
            if !self.eat_punct(",") {
                self.skip_newlines();
                self.expect_punct("}", "`,` or `}`")?;
                return Ok(());
            }
        }
    }

    fn verdict_word(&mut self) -> R<Verdict> {
        let t = self.next();
        let Tok::Word(w) = &t.tok else {
            return Err(self.err_at(&t, ErrorKind::Unexpected("a verdict")));
        };
        Ok(match w.as_str() {
            "accept" => Verdict::Accept,
            "drop" => Verdict::Drop,
            "continue" => Verdict::Continue,
            "return" => Verdict::Return,
            "jump" => Verdict::Jump(self.name("a chain name")?.0),
            "goto" => Verdict::Goto(self.name("a chain name")?.0),
            _ => {
                return Err(self.err_at(
                    &t,
                    ErrorKind::Unexpected("a verdict (accept, drop, continue, return, jump, goto)"),
                ));
            }
        })
    }

    /// One value of the given types (a concatenation `a . b` when there are several);
    /// `flag_list`: `a,b,c` of a flag type is one value.
    fn elem(&mut self, types: &[DataType], flag_list: bool) -> R<Elem> {
        if types.is_empty() {
            return Err(self.err(ErrorKind::Unexpected("no value here")));
        }
        let mut parts = Vec::with_capacity(types.len());
        for (k, t) in types.iter().enumerate() {
            if k > 0 && !self.eat_word(".") {
                return Err(self.err(ErrorKind::Unexpected(
                    "` . ` and the next part of the concatenation",
                )));
            }
            parts.push(self.single(*t, flag_list && types.len() == 1)?);
        }
        if self.peek_word() == Some(".") {
            return Err(self.err(ErrorKind::Unexpected("no more concatenation parts")));
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Elem::Concat(parts)
        })
    }

    fn single(&mut self, t: DataType, flag_list: bool) -> R<Elem> {
        let tok = self.next();
        let (w, quoted) = match &tok.tok {
            Tok::Word(w) => (w.clone(), false),
            Tok::Str(s) => (s.clone(), true),
            _ => return Err(self.err_at(&tok, ErrorKind::Unexpected("a value"))),
        };
        let bad = |p: &Self| {
            p.err_at(
                &tok,
                ErrorKind::BadValue {
                    value: tok.tok.text(),
                    dtype: t.name(),
                },
            )
        };
        let mut e = t.parse_elem(&w, quoted).ok_or_else(|| bad(self))?;
        if t.is_flags() && flag_list {
            while matches!(self.peek().tok, Tok::Punct("," | "|")) {
                self.i += 1;
                let nt = self.next();
                let more = match &nt.tok {
                    Tok::Word(w) => t.parse_value(w, false),
                    _ => None,
                };
                match (&mut e, more) {
                    (Elem::Value(Value::Num(a)), Some(Value::Num(b))) => *a |= b,
                    _ => {
                        return Err(self.err_at(
                            &nt,
                            ErrorKind::BadValue {
                                value: nt.tok.text(),
                                dtype: t.name(),
                            },
                        ));
                    }
                }
            }
        }
        if let (Elem::Prefix(..), false) = (&e, t.is_addr()) {
            return Err(bad(self));
        }
        if let Elem::Prefix(a, len) = e {
            e = prefix_elem(t, a, len);
        }
        Ok(e)
    }

    /// A named set's elements may not overlap (nft: "conflicting intervals").
    fn check_intervals(&self, set: &Set, pos: Pos) -> R<()> {
        let types = self.set_types(&set.key);
        if let [t] = types.as_slice() {
            let mut elems = set.elements.clone();
            merge_intervals(*t, false, &mut elems)
                .map_err(|m| NftError::new(self.file, pos, &set.name, ErrorKind::Invalid(m)))?;
        }
        Ok(())
    }
}

/// Sorts elements as nft lists them: by key value.
pub(crate) fn sort_elements(elems: &mut [SetElem]) {
    elems.sort_by_cached_key(|e| super::types::sort_key(&e.key));
}

fn type_names(t: &[DataType]) -> String {
    t.iter().map(|t| t.name()).collect::<Vec<_>>().join(" . ")
}

/// Every jump/goto names a chain of its table; every `@set` a set or map of it.
pub(crate) fn check_refs(file: &str, rs: &Ruleset) -> R<()> {
    for t in &rs.tables {
        let chains: std::collections::HashSet<&str> =
            t.chains.iter().map(|c| c.name.as_str()).collect();
        let sets: HashMap<&str, &Set> = t.sets.iter().map(|s| (s.name.as_str(), s)).collect();
        let chain_ok = |n: &str| chains.contains(n);
        let set_ok = |n: &str| sets.contains_key(n);
        for c in &t.chains {
            for r in &c.rules {
                let err = |what: String| Err(NftError::new(file, r.pos, "", ErrorKind::Name(what)));
                for s in &r.stmts {
                    let mut verdicts: Vec<&Verdict> = Vec::new();
                    let mut refs: Vec<&SetRhs> = Vec::new();
                    match s {
                        Stmt::Verdict(v) => verdicts.push(v),
                        Stmt::Match(m) => refs.push(&m.right),
                        Stmt::Vmap { map, .. } => refs.push(map),
                        Stmt::Nat(Nat {
                            addr: Some(NatAddr::Map { map, .. }),
                            ..
                        }) => refs.push(map),
                        _ => {}
                    }
                    if let Stmt::Match(Match {
                        left,
                        right: SetRhs::Ref(n),
                        ..
                    }) = s
                    {
                        if let Some(set) = sets.get(n.as_str()).copied() {
                            if set_key_types(&set.key) != expr_types(left) {
                                return err(format!(
                                    "@{n} holds {}, not the type of `{}`",
                                    type_names(&set_key_types(&set.key)),
                                    super::print::expr_string(left)
                                ));
                            }
                        }
                    }
                    if let Stmt::SetUpdate(u) = s {
                        match sets.get(u.set.as_str()).copied() {
                            None => {
                                return err(format!("no set @{} in table {}", u.set, t.name));
                            }
                            Some(set) if set_key_types(&set.key) != expr_types(&u.key) => {
                                return err(format!(
                                    "@{} holds {}, not the type of `{}`",
                                    u.set,
                                    type_names(&set_key_types(&set.key)),
                                    super::print::expr_string(&u.key)
                                ));
                            }
                            Some(_) => {}
                        }
                    }
                    if let Stmt::Vmap {
                        map: SetRhs::Ref(n),
                        ..
                    } = s
                    {
                        if let Some(set) = sets.get(n.as_str()).copied() {
                            if set.data != Some(SetType::Verdict) {
                                return err(format!("@{n} is not a verdict map"));
                            }
                        }
                    }
                    for m in &refs {
                        match m {
                            SetRhs::Ref(n) if !set_ok(n) => {
                                return err(format!("no set or map @{n} in table {}", t.name));
                            }
                            SetRhs::Set(elems) => {
                                for e in elems {
                                    if let Some(MapData::Verdict(v)) = &e.data {
                                        verdicts.push(v);
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                    for v in verdicts {
                        if let Verdict::Jump(n) | Verdict::Goto(n) = v {
                            if !chain_ok(n) {
                                return err(format!(
                                    "no chain {n} in table {} for jump/goto",
                                    t.name
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The datatypes of a set's key or data type.
pub(crate) fn set_key_types(t: &SetType) -> Vec<DataType> {
    match t {
        SetType::Types(v) => v.clone(),
        SetType::Typeof(e) => expr_types(e),
        SetType::Verdict => Vec::new(),
    }
}
