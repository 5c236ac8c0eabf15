//! The nft text parser: tokens (after `define` expansion) to a [`Ruleset`].
//!
//! Grammar (nftables v1.1 `nft -f`, the parts modelled): top level `flush ruleset`,
//! `table [FAMILY] NAME { ... }`, `add|create table|chain|rule|set|map|element ...`,
//! `insert rule ...`, `define NAME = VALUE`, `undefine NAME`; inside a table `chain NAME { ... }`,
//! `set|map NAME { ... }`; inside a chain `type T hook H priority P;`, `policy P;` and rules,
//! one per line or `;`. A rule is statements left to right (see [`Stmt`]); a value is typed
//! by the expression on its left ([`DataType`]).

use std::collections::HashMap;

use super::lexer::{Tok, Token, tokenize};
use super::types::{parse_time, prefix_elem};
use super::{
    BaseChain, BitOp, Chain, ChainType, CtKey, DataType, Elem, ErrorKind, Expr, FIB_FLAGS, Family,
    FibResult, Hook, Limit, Log, MapData, Match, MetaKey, Nat, NatAddr, NatKind, NftError,
    NftErrors, Op, Payload, Policy, Pos, Proto, Reject, Rule, Ruleset, SET_FLAGS, Set, SetElem,
    SetRhs, SetType, SetValue, Stmt, Table, Value, Verdict,
};

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
    };
    p.top().map_err(one)?;
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
        let table = &mut self.rs.tables[ti];
        if let Some(i) = table.chains.iter().position(|c| c.name == name) {
            return Ok(i);
        }
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
        Ok(table.chains.len() - 1)
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
        let Some(si) = self.rs.tables[ti].sets.iter().position(|s| s.name == name) else {
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
        set.elements.extend(elems);
        sort_elements(&mut set.elements);
        let set = self.rs.tables[ti].sets[si].clone();
        self.check_intervals(&set, pos)?;
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
        if self.rs.tables[ti].sets.iter().any(|s| s.name == name) {
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
        // `type A : B`: B is a bare datatype (or a concatenation of them).
        let mut types = Vec::new();
        loop {
            let (w, pos) = self.word("a datatype")?;
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

    // --- rules ---

    fn rule(&mut self, ti: usize, family: Family) -> R<Rule> {
        let pos = self.peek().pos;
        let mut stmts = Vec::new();
        let mut comment = None;
        while !is_end(&self.peek().tok) {
            let t = self.peek().clone();
            let Tok::Word(w) = &t.tok else {
                return Err(self.err(ErrorKind::Unexpected("a statement")));
            };
            let w = w.clone();
            match w.as_str() {
                "accept" | "drop" | "continue" | "return" | "jump" | "goto" => {
                    stmts.push(Stmt::Verdict(self.verdict_word()?));
                }
                "counter" => {
                    self.i += 1;
                    if self.eat_word("name") {
                        stmts.push(Stmt::CounterRef(self.name("a counter name")?.0));
                    } else {
                        let (mut packets, mut bytes) = (0, 0);
                        if self.eat_word("packets") {
                            packets = self.number("a packet count")?;
                            if !self.eat_word("bytes") {
                                return Err(self.err(ErrorKind::Unexpected("`bytes N`")));
                            }
                            bytes = self.number("a byte count")?;
                        }
                        stmts.push(Stmt::Counter { packets, bytes });
                    }
                }
                "limit" => {
                    self.i += 1;
                    stmts.push(Stmt::Limit(self.limit()?));
                }
                "log" => {
                    self.i += 1;
                    stmts.push(Stmt::Log(self.log()?));
                }
                "reject" => {
                    self.i += 1;
                    stmts.push(Stmt::Reject(self.reject()?));
                }
                "notrack" => {
                    self.i += 1;
                    stmts.push(Stmt::Notrack);
                }
                "snat" | "dnat" | "masquerade" | "redirect" => {
                    self.i += 1;
                    stmts.push(Stmt::Nat(self.nat(&w, family)?));
                }
                "comment" => {
                    self.i += 1;
                    comment = Some(self.name("a quoted comment")?.0);
                }
                _ => stmts.push(self.expr_stmt(ti, family)?),
            }
        }
        if stmts.is_empty() {
            return Err(self.err(ErrorKind::Unexpected("a statement")));
        }
        finish_rule(family, &mut stmts)
            .map_err(|m| NftError::new(self.file, pos, "", ErrorKind::Invalid(m)))?;
        Ok(Rule {
            stmts,
            comment,
            pos,
        })
    }

    /// A statement that starts with an expression: a match, a vmap or a `set`.
    fn expr_stmt(&mut self, _ti: usize, family: Family) -> R<Stmt> {
        let left = self.concat_expr(family)?;
        let types = expr_types(&left);
        if self.eat_word("vmap") {
            let map = self.rhs(&types, Some(&SetType::Verdict))?;
            return Ok(Stmt::Vmap { key: left, map });
        }
        if self.peek_word() == Some("set") {
            if !matches!(left, Expr::Meta(MetaKey::Mark) | Expr::Ct(CtKey::Mark)) {
                return Err(self.err(ErrorKind::Unsupported(format!(
                    "setting `{}`",
                    super::print::expr_string(&left)
                ))));
            }
            self.i += 1;
            let value = self.set_value(&types, family)?;
            return Ok(Stmt::Set { key: left, value });
        }
        let mut left = left;
        let flags_type = match types.as_slice() {
            [t] if t.is_flags() => Some(*t),
            _ => None,
        };
        if self.eat_punct("&") || self.eat_word("and") {
            let t = self.peek().clone();
            let m = match (types.as_slice(), flags_type) {
                ([DataType::Mark], _) => match self.single(DataType::Mark, false)? {
                    Elem::Value(Value::Num(m)) => m,
                    _ => return Err(self.err_at(&t, ErrorKind::Unexpected("a mask"))),
                },
                (_, Some(ft)) => self.flag_mask(ft)?,
                _ => {
                    return Err(self.err_at(
                        &t,
                        ErrorKind::Unsupported(
                            "`&` on this expression (marks and flags only)".into(),
                        ),
                    ));
                }
            };
            left = Expr::And(Box::new(left), m);
        } else if let (Some(ft), Tok::Punct("!")) = (flags_type, &self.peek().tok) {
            // `tcp flags ! fin,syn`: none of these bits is set.
            self.i += 1;
            let m = self.flag_mask(ft)?;
            return Ok(Stmt::Match(Match {
                left: Expr::And(Box::new(left), m),
                op: Op::Eq,
                right: SetRhs::Value(Elem::Value(Value::Num(0))),
            }));
        }
        for p in ["|", "^"] {
            if matches!(self.peek().tok, Tok::Punct(q) if q == p) {
                return Err(self.err(ErrorKind::Unsupported(format!("`{p}` in a match"))));
            }
        }
        if matches!(self.peek_word(), Some("or" | "xor" | "map")) {
            let w = self.peek_word().unwrap_or_default().to_string();
            return Err(self.err(ErrorKind::Unsupported(format!("`{w}` in a match"))));
        }
        let op = match &self.peek().tok {
            Tok::Punct("==") => Some(Op::Eq),
            Tok::Punct("!=") => Some(Op::Ne),
            Tok::Punct("<") => Some(Op::Lt),
            Tok::Punct(">") => Some(Op::Gt),
            Tok::Punct("<=") => Some(Op::Le),
            Tok::Punct(">=") => Some(Op::Ge),
            Tok::Word(w) => match w.as_str() {
                "eq" => Some(Op::Eq),
                "ne" => Some(Op::Ne),
                "lt" => Some(Op::Lt),
                "gt" => Some(Op::Gt),
                "le" => Some(Op::Le),
                "ge" => Some(Op::Ge),
                _ => None,
            },
            _ => None,
        };
        if op.is_some() {
            self.i += 1;
        }
        // `==` lists as written only where it means something else than no operator.
        let op = match op {
            None | Some(Op::Eq) if matches!(left, Expr::And(..)) => Op::Eq,
            None => Op::Implicit,
            Some(Op::Eq)
                if !matches!(left, Expr::And(..)) && !types.iter().any(|t| t.is_flags()) =>
            {
                Op::Implicit
            }
            Some(op) => op,
        };
        if is_end(&self.peek().tok) {
            return Err(self.err(ErrorKind::Unexpected("a value to compare with")));
        }
        let right = self.rhs(&types, None)?;
        // `tcp flags syn / fin,syn,rst,ack`: VALUE / MASK.
        if let (Some(ft), Some("/"), false) =
            (flags_type, self.peek_word(), matches!(left, Expr::And(..)))
        {
            self.i += 1;
            let m = self.flag_mask(ft)?;
            let op = if op == Op::Ne { Op::Ne } else { Op::Eq };
            return Ok(Stmt::Match(Match {
                left: Expr::And(Box::new(left), m),
                op,
                right,
            }));
        }
        // `tcp flags & (syn | ack) != 0` is "any of these bits": `tcp flags syn,ack`.
        if let (Expr::And(inner, m), Op::Ne, SetRhs::Value(Elem::Value(Value::Num(0)))) =
            (&left, op, &right)
        {
            if flags_type.is_some() {
                return Ok(Stmt::Match(Match {
                    left: (**inner).clone(),
                    op: Op::Implicit,
                    right: SetRhs::Value(Elem::Value(Value::Num(*m))),
                }));
            }
        }
        if !matches!(op, Op::Implicit | Op::Eq | Op::Ne)
            && !matches!(right, SetRhs::Value(Elem::Value(_)))
        {
            return Err(self.err(ErrorKind::Unexpected("one value after <, >, <= or >=")));
        }
        Ok(Stmt::Match(Match { left, op, right }))
    }

    /// A flag mask: `syn`, `fin,syn`, `(fin | syn | rst | ack)`.
    fn flag_mask(&mut self, t: DataType) -> R<u128> {
        let paren = self.eat_punct("(");
        let tok = self.peek().clone();
        let m = match self.single(t, true)? {
            Elem::Value(Value::Num(m)) => m,
            _ => return Err(self.err_at(&tok, ErrorKind::Unexpected("flag names"))),
        };
        if paren {
            self.expect_punct(")", "`)` after the flags")?;
        }
        Ok(m)
    }

    /// After `set`: a constant, or a mark with an optional `& | ^` constant.
    fn set_value(&mut self, types: &[DataType], family: Family) -> R<SetValue> {
        let from = matches!(self.peek_word(), Some("meta" | "ct" | "mark"));
        if !from {
            return Ok(SetValue::Value(self.elem(types, false)?));
        }
        let t = self.peek().clone();
        let expr = self.expr(family)?;
        if !matches!(expr, Expr::Meta(MetaKey::Mark) | Expr::Ct(CtKey::Mark)) {
            return Err(self.err_at(
                &t,
                ErrorKind::Unsupported(format!(
                    "setting a mark from `{}`",
                    super::print::expr_string(&expr)
                )),
            ));
        }
        let op = match &self.peek().tok {
            Tok::Punct("&") => Some(BitOp::And),
            Tok::Punct("|") => Some(BitOp::Or),
            Tok::Punct("^") => Some(BitOp::Xor),
            Tok::Word(w) if w == "and" => Some(BitOp::And),
            Tok::Word(w) if w == "or" => Some(BitOp::Or),
            Tok::Word(w) if w == "xor" => Some(BitOp::Xor),
            _ => None,
        };
        let op = match op {
            None => None,
            Some(op) => {
                self.i += 1;
                let mt = self.peek().clone();
                match self.single(DataType::Mark, false)? {
                    Elem::Value(Value::Num(m)) => Some((op, m)),
                    _ => return Err(self.err_at(&mt, ErrorKind::Unexpected("a constant"))),
                }
            }
        };
        Ok(SetValue::From { expr, op })
    }

    /// A value, `{ set }` or `@name` of the given key types.
    fn rhs(&mut self, types: &[DataType], data: Option<&SetType>) -> R<SetRhs> {
        if self.eat_punct("{") {
            let pos = self.peek().pos;
            let mut elems = self.set_literal(types, data, false)?;
            sort_elements(&mut elems);
            if let [t] = types {
                merge_intervals(*t, data.is_none(), &mut elems)
                    .map_err(|m| NftError::new(self.file, pos, "", ErrorKind::Invalid(m)))?;
            }
            return Ok(SetRhs::Set(elems));
        }
        if self.eat_punct("@") {
            return Ok(SetRhs::Ref(self.name("a set name")?.0));
        }
        if data.is_some() {
            return Err(self.err(ErrorKind::Unexpected("`{ ... }` or `@map`")));
        }
        Ok(SetRhs::Value(self.elem(types, true)?))
    }

    /// `A [. B ...]`.
    fn concat_expr(&mut self, family: Family) -> R<Expr> {
        let first = self.expr(family)?;
        if self.peek_word() != Some(".") {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.eat_word(".") {
            parts.push(self.expr(family)?);
        }
        Ok(Expr::Concat(parts))
    }

    fn expr(&mut self, _family: Family) -> R<Expr> {
        let t = self.next();
        let Tok::Word(w) = &t.tok else {
            return Err(self.err_at(&t, ErrorKind::Unexpected("an expression")));
        };
        let unsupported = |p: &Self, what: String| p.err_at(&t, ErrorKind::Unsupported(what));
        let proto = match w.as_str() {
            "ip" => Some(Proto::Ip),
            "ip6" => Some(Proto::Ip6),
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            "th" => Some(Proto::Th),
            "icmp" => Some(Proto::Icmp),
            "icmpv6" => Some(Proto::Icmpv6),
            _ => None,
        };
        if let Some(proto) = proto {
            let ft = self.next();
            let Tok::Word(f) = &ft.tok else {
                return Err(self.err_at(&ft, ErrorKind::Unexpected("a header field")));
            };
            return match payload_field(proto, f) {
                Some((field, _)) => Ok(Expr::Payload(Payload { proto, field })),
                None => Err(self.err_at(&ft, ErrorKind::Unsupported(format!("`{w} {f}`")))),
            };
        }
        match w.as_str() {
            "meta" => {
                let kt = self.next();
                let Tok::Word(k) = &kt.tok else {
                    return Err(self.err_at(&kt, ErrorKind::Unexpected("a meta key")));
                };
                meta_key(k, true)
                    .map(Expr::Meta)
                    .ok_or_else(|| self.err_at(&t, ErrorKind::Unsupported(format!("`meta {k}`"))))
            }
            "ct" => {
                let kt = self.next();
                let Tok::Word(k) = &kt.tok else {
                    return Err(self.err_at(&kt, ErrorKind::Unexpected("a ct key")));
                };
                let key = match k.as_str() {
                    "state" => CtKey::State,
                    "status" => CtKey::Status,
                    "mark" => CtKey::Mark,
                    "direction" => CtKey::Direction,
                    _ => return Err(self.err_at(&t, ErrorKind::Unsupported(format!("`ct {k}`")))),
                };
                Ok(Expr::Ct(key))
            }
            "fib" => {
                let mut flags = 0u8;
                loop {
                    let (f, fpos) = self.word("a fib flag (saddr, daddr, mark, iif, oif)")?;
                    match FIB_FLAGS.iter().position(|x| *x == f) {
                        Some(b) => flags |= 1 << b,
                        None => {
                            return Err(NftError::new(
                                self.file,
                                fpos,
                                &f,
                                ErrorKind::Unexpected("a fib flag (saddr, daddr, mark, iif, oif)"),
                            ));
                        }
                    }
                    if !self.eat_word(".") {
                        break;
                    }
                }
                let (r, rpos) = self.word("oif, oifname or type")?;
                let result = match r.as_str() {
                    "oif" => FibResult::Oif,
                    "oifname" => FibResult::Oifname,
                    "type" => FibResult::Type,
                    _ => {
                        return Err(NftError::new(
                            self.file,
                            rpos,
                            &r,
                            ErrorKind::Unsupported(format!("fib result `{r}`")),
                        ));
                    }
                };
                Ok(Expr::Fib { flags, result })
            }
            "numgen" => {
                let (m, mpos) = self.word("random or inc")?;
                let random = match m.as_str() {
                    "random" => true,
                    "inc" => false,
                    _ => {
                        return Err(NftError::new(
                            self.file,
                            mpos,
                            &m,
                            ErrorKind::Unexpected("random or inc"),
                        ));
                    }
                };
                if !self.eat_word("mod") {
                    return Err(self.err(ErrorKind::Unexpected("`mod N`")));
                }
                let modulus: u32 = self.number("a modulus")?;
                if modulus == 0 {
                    return Err(self.err_at(&t, ErrorKind::Unexpected("a modulus above 0")));
                }
                let offset = if self.eat_word("offset") {
                    self.number("an offset")?
                } else {
                    0
                };
                Ok(Expr::Numgen {
                    random,
                    modulus,
                    offset,
                })
            }
            other => match meta_key(other, false) {
                Some(k) => Ok(Expr::Meta(k)),
                None => Err(unsupported(self, format!("`{other}`"))),
            },
        }
    }

    // --- statements ---

    fn limit(&mut self) -> R<Limit> {
        if !self.eat_word("rate") {
            return Err(self.err(ErrorKind::Unexpected("`rate`")));
        }
        let over = self.eat_word("over");
        let t = self.next();
        let Tok::Word(w) = &t.tok else {
            return Err(self.err_at(&t, ErrorKind::Unexpected("a rate such as 10/second")));
        };
        let bad = |p: &Self| {
            p.err_at(
                &t,
                ErrorKind::Unexpected("a rate such as 10/second or 1 mbytes/second"),
            )
        };
        // `N/unit`, or `N bytes/unit`, `N kbytes / unit`.
        let (num, mut per) = match w.split_once('/') {
            Some((n, u)) => (n.to_string(), u.to_string()),
            None => (w.clone(), String::new()),
        };
        let rate: u64 = num.parse().map_err(|_| bad(self))?;
        let mut byte_unit = None;
        if per.is_empty() {
            let (u, _) = self.word("a rate unit")?;
            let (unit, rest) = match u.split_once('/') {
                Some((a, b)) => (a.to_string(), b.to_string()),
                None => (u.clone(), String::new()),
            };
            byte_unit = Some(match unit.as_str() {
                "bytes" => "bytes",
                "kbytes" => "kbytes",
                "mbytes" => "mbytes",
                _ => return Err(bad(self)),
            });
            per = rest;
            if per.is_empty() {
                if self.peek_word() == Some("/") {
                    self.i += 1;
                }
                per = self.word("second, minute, hour, day or week")?.0;
                per = per.trim_start_matches('/').to_string();
            }
        }
        let per = match per.as_str() {
            "second" => "second",
            "minute" => "minute",
            "hour" => "hour",
            "day" => "day",
            "week" => "week",
            _ => return Err(bad(self)),
        };
        let mut burst = if byte_unit.is_some() { 0 } else { 5 };
        if self.eat_word("burst") {
            burst = self.number("a burst")?;
            let (u, upos) = self.word("packets or bytes")?;
            let ok = match (u.as_str(), byte_unit.is_some()) {
                ("packets", false) => true,
                ("bytes" | "kbytes" | "mbytes", true) => u == "bytes",
                _ => false,
            };
            if !ok {
                return Err(NftError::new(
                    self.file,
                    upos,
                    &u,
                    ErrorKind::Unexpected("the rate's unit (packets, or bytes for a byte rate)"),
                ));
            }
        }
        Ok(Limit {
            over,
            rate,
            byte_unit,
            per,
            burst,
        })
    }

    fn log(&mut self) -> R<Log> {
        let mut log = Log::default();
        loop {
            match self.peek_word() {
                Some("prefix") => {
                    self.i += 1;
                    log.prefix = Some(self.name("a prefix")?.0);
                }
                Some("level") => {
                    self.i += 1;
                    let (l, lpos) = self.word("a log level")?;
                    const LEVELS: [&str; 9] = [
                        "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug", "audit",
                    ];
                    match LEVELS.iter().find(|x| **x == l) {
                        Some(x) => log.level = Some(x),
                        None => {
                            return Err(NftError::new(
                                self.file,
                                lpos,
                                &l,
                                ErrorKind::Unexpected("a log level"),
                            ));
                        }
                    }
                }
                Some("group") => {
                    self.i += 1;
                    log.group = Some(self.number("a group")?);
                }
                Some("snaplen") => {
                    self.i += 1;
                    log.snaplen = Some(self.number("a snaplen")?);
                }
                Some("queue-threshold") => {
                    self.i += 1;
                    log.queue_threshold = Some(self.number("a threshold")?);
                }
                Some("flags") => {
                    let t = self.next();
                    return Err(self.err_at(&t, ErrorKind::Unsupported("`log flags`".into())));
                }
                _ => break,
            }
        }
        if log.group.is_some() && log.level.is_some() {
            return Err(self.err(ErrorKind::Invalid(
                "`log group` (nflog) takes no `level`".into(),
            )));
        }
        let others = log.prefix.is_some()
            || log.group.is_some()
            || log.snaplen.is_some()
            || log.queue_threshold.is_some();
        if log.level == Some("audit") && others {
            return Err(self.err(ErrorKind::Invalid(
                "`log level audit` takes no other option".into(),
            )));
        }
        if log.level == Some("warn") {
            log.level = None;
        }
        if (log.snaplen.is_some() || log.queue_threshold.is_some()) && log.group.is_none() {
            return Err(self.err(ErrorKind::Invalid(
                "`snaplen` and `queue-threshold` need `group`".into(),
            )));
        }
        Ok(log)
    }

    fn reject(&mut self) -> R<Reject> {
        if !self.eat_word("with") {
            return Ok(Reject::Default);
        }
        let (kind, kpos) = self.word("icmp, icmpv6, icmpx or tcp")?;
        let code = |p: &mut Self, t: DataType| -> R<u8> {
            let tok = p.next();
            let v = match &tok.tok {
                Tok::Word(w) => t.parse_value(w, false),
                _ => None,
            };
            match v {
                Some(Value::Num(n)) => Ok(n as u8),
                _ => Err(p.err_at(
                    &tok,
                    ErrorKind::BadValue {
                        value: tok.tok.text(),
                        dtype: t.name(),
                    },
                )),
            }
        };
        match kind.as_str() {
            "tcp" => {
                if !self.eat_word("reset") {
                    return Err(self.err(ErrorKind::Unexpected("`reset`")));
                }
                Ok(Reject::TcpReset)
            }
            "icmp" => {
                self.eat_word("type");
                Ok(Reject::Icmp(code(self, DataType::IcmpCode)?))
            }
            "icmpv6" => {
                self.eat_word("type");
                Ok(Reject::Icmpv6(code(self, DataType::Icmpv6Code)?))
            }
            "icmpx" => {
                self.eat_word("type");
                Ok(Reject::Icmpx(code(self, DataType::IcmpxCode)?))
            }
            _ => Err(NftError::new(
                self.file,
                kpos,
                &kind,
                ErrorKind::Unexpected("icmp, icmpv6, icmpx or tcp"),
            )),
        }
    }

    fn nat(&mut self, w: &str, family: Family) -> R<Nat> {
        let kind = match w {
            "snat" => NatKind::Snat,
            "dnat" => NatKind::Dnat,
            "masquerade" => NatKind::Masquerade,
            _ => NatKind::Redirect,
        };
        let mut nat = Nat {
            kind,
            family: None,
            addr: None,
            port: None,
            flags: 0,
        };
        let with_addr = matches!(kind, NatKind::Snat | NatKind::Dnat);
        if with_addr {
            match self.peek_word() {
                Some("ip") => {
                    self.i += 1;
                    nat.family = Some(Family::Ip);
                }
                Some("ip6") => {
                    self.i += 1;
                    nat.family = Some(Family::Ip6);
                }
                _ => {}
            }
        }
        let addr_type = match nat.family.unwrap_or(family) {
            Family::Ip6 => DataType::Ipv6Addr,
            Family::Ip => DataType::Ipv4Addr,
            Family::Inet => {
                if with_addr && self.peek_word() == Some("to") {
                    return Err(self.err(ErrorKind::Unexpected(
                        "`ip` or `ip6` before `to` in an inet table",
                    )));
                }
                DataType::Ipv4Addr
            }
        };
        if self.eat_word("to") {
            if with_addr {
                // `to ADDR[:PORT]`, `to KEY map { ... }`.
                let t = self.peek().clone();
                let is_expr = matches!(&t.tok, Tok::Word(w) if meta_key(w, false).is_some() || ["ip", "ip6", "tcp", "udp", "th", "meta", "ct", "numgen"].contains(&w.as_str()));
                if is_expr {
                    let key = self.concat_expr(family)?;
                    if !self.eat_word("map") {
                        return Err(self.err(ErrorKind::Unexpected("`map` after the key")));
                    }
                    let types = expr_types(&key);
                    let data = SetType::Types(vec![addr_type]);
                    let map = self.rhs(&types, Some(&data))?;
                    nat.addr = Some(NatAddr::Map { key, map });
                } else {
                    let Tok::Word(w) = &t.tok else {
                        return Err(self.err(ErrorKind::Unexpected("an address")));
                    };
                    self.i += 1;
                    let (a, port) = split_addr_port(w, addr_type);
                    let bad = |p: &Self, v: &str| {
                        p.err_at(
                            &t,
                            ErrorKind::BadValue {
                                value: v.to_string(),
                                dtype: addr_type.name(),
                            },
                        )
                    };
                    let addr = addr_type.parse_elem(a, false).ok_or_else(|| bad(self, a))?;
                    nat.addr = Some(NatAddr::Value(addr));
                    if let Some(p) = port {
                        nat.port = Some(
                            DataType::InetService
                                .parse_elem(p, false)
                                .ok_or_else(|| bad(self, p))?,
                        );
                    }
                }
            } else {
                let t = self.next();
                let port = match &t.tok {
                    Tok::Word(w) => w
                        .strip_prefix(':')
                        .and_then(|p| DataType::InetService.parse_elem(p, false)),
                    _ => None,
                };
                nat.port =
                    Some(port.ok_or_else(|| {
                        self.err_at(&t, ErrorKind::Unexpected(":PORT or :LOW-HIGH"))
                    })?);
            }
        } else if with_addr {
            return Err(self.err(ErrorKind::Unexpected("`to ADDRESS`")));
        }
        // Flags: random, fully-random, persistent (comma separated).
        const NAT_FLAGS: [&str; 3] = ["random", "fully-random", "persistent"];
        while let Some(b) = self
            .peek_word()
            .and_then(|w| NAT_FLAGS.iter().position(|f| *f == w))
        {
            self.i += 1;
            nat.flags |= 1 << b;
            if !self.eat_punct(",") {
                break;
            }
        }
        Ok(nat)
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

    // --- references ---
}

/// `1.2.3.4:80`, `1.2.3.4-1.2.3.9:80-90`, `[::1]:80`, `::1` (IPv6 without brackets has no port).
fn split_addr_port(w: &str, t: DataType) -> (&str, Option<&str>) {
    if t == DataType::Ipv6Addr {
        if let Some(rest) = w.strip_prefix('[') {
            if let Some((a, p)) = rest.split_once(']') {
                return (a, p.strip_prefix(':'));
            }
        }
        return (w, None);
    }
    match w.split_once(':') {
        Some((a, p)) => (a, Some(p)),
        None => (w, None),
    }
}

/// Sorts elements as nft lists them: by key value.
pub(crate) fn sort_elements(elems: &mut [SetElem]) {
    elems.sort_by_cached_key(|e| super::types::sort_key(&e.key));
}

/// The meta keys; `qualified`: written after `meta` (bare: only those nft accepts bare).
pub(crate) fn meta_key(k: &str, qualified: bool) -> Option<MetaKey> {
    let key = match k {
        "iif" => MetaKey::Iif,
        "oif" => MetaKey::Oif,
        "iifname" => MetaKey::Iifname,
        "oifname" => MetaKey::Oifname,
        "mark" => MetaKey::Mark,
        "pkttype" => MetaKey::Pkttype,
        "skuid" => MetaKey::Skuid,
        "skgid" => MetaKey::Skgid,
        "l4proto" if qualified => MetaKey::L4proto,
        "nfproto" if qualified => MetaKey::Nfproto,
        "length" if qualified => MetaKey::Length,
        _ => return None,
    };
    Some(key)
}

/// The fields of each header we model, with their datatypes.
pub(crate) fn payload_field(proto: Proto, f: &str) -> Option<(&'static str, DataType)> {
    use DataType as D;
    let table: &[(&'static str, DataType)] = match proto {
        Proto::Ip => &[
            ("saddr", D::Ipv4Addr),
            ("daddr", D::Ipv4Addr),
            ("protocol", D::InetProto),
            ("length", D::Integer(16)),
            ("ttl", D::Integer(8)),
            ("dscp", D::Dscp),
            ("id", D::Integer(16)),
        ],
        Proto::Ip6 => &[
            ("saddr", D::Ipv6Addr),
            ("daddr", D::Ipv6Addr),
            ("nexthdr", D::InetProto),
            ("length", D::Integer(16)),
            ("hoplimit", D::Integer(8)),
            ("dscp", D::Dscp),
        ],
        Proto::Tcp => &[
            ("sport", D::InetService),
            ("dport", D::InetService),
            ("flags", D::TcpFlag),
        ],
        Proto::Udp => &[
            ("sport", D::InetService),
            ("dport", D::InetService),
            ("length", D::Integer(16)),
        ],
        Proto::Th => &[("sport", D::InetService), ("dport", D::InetService)],
        Proto::Icmp => &[("type", D::IcmpType), ("code", D::Integer(8))],
        Proto::Icmpv6 => &[("type", D::Icmpv6Type), ("code", D::Integer(8))],
    };
    table.iter().find(|(n, _)| *n == f).copied()
}

/// The datatypes of an expression (one per part of a concatenation).
pub(crate) fn expr_types(e: &Expr) -> Vec<DataType> {
    match e {
        Expr::Concat(parts) => parts.iter().flat_map(expr_types).collect(),
        Expr::And(inner, _) => expr_types(inner),
        Expr::Payload(p) => {
            vec![payload_field(p.proto, p.field).map_or(DataType::Integer(32), |(_, t)| t)]
        }
        Expr::Meta(k) => vec![match k {
            MetaKey::Iif | MetaKey::Oif => DataType::IfIndex,
            MetaKey::Iifname | MetaKey::Oifname => DataType::IfName,
            MetaKey::L4proto => DataType::InetProto,
            MetaKey::Nfproto => DataType::NfProto,
            MetaKey::Mark => DataType::Mark,
            MetaKey::Pkttype => DataType::PktType,
            MetaKey::Skuid => DataType::Uid,
            MetaKey::Skgid => DataType::Gid,
            MetaKey::Length => DataType::Integer(32),
        }],
        Expr::Ct(k) => vec![match k {
            CtKey::State => DataType::CtState,
            CtKey::Status => DataType::CtStatus,
            CtKey::Mark => DataType::Mark,
            CtKey::Direction => DataType::CtDir,
        }],
        Expr::Fib { result, .. } => vec![match result {
            FibResult::Type => DataType::FibAddrType,
            FibResult::Oif | FibResult::Oifname => DataType::Boolean,
        }],
        Expr::Numgen { .. } => vec![DataType::Integer(32)],
    }
}

/// The protocol number a transport header implies (its dependency).
fn transport_number(p: Proto) -> Option<u128> {
    match p {
        Proto::Tcp => Some(6),
        Proto::Udp => Some(17),
        Proto::Icmp => Some(1),
        Proto::Icmpv6 => Some(58),
        _ => None,
    }
}

/// Drops an explicit protocol match that nft drops from its listing because the next
/// match implies it: in `ip` tables `ip protocol tcp tcp dport 22` lists as `tcp dport 22`;
/// in `ip6` and `inet` tables the same holds for `meta l4proto`, and in `inet` tables
/// `meta nfproto ipv4` before an `ip ...` match.
fn eliminate_dependencies(family: Family, stmts: &mut Vec<Stmt>) {
    let mut k = 0;
    while k + 1 < stmts.len() {
        let drop = match (&stmts[k], &stmts[k + 1]) {
            (
                Stmt::Match(Match {
                    left: dep,
                    op: Op::Implicit,
                    right: SetRhs::Value(Elem::Value(Value::Num(n))),
                }),
                Stmt::Match(Match {
                    left: Expr::Payload(p),
                    ..
                }),
            ) => {
                let l4 = transport_number(p.proto) == Some(*n);
                match (family, dep) {
                    (
                        Family::Ip,
                        Expr::Payload(Payload {
                            proto: Proto::Ip,
                            field: "protocol",
                        }),
                    ) => l4,
                    (_, Expr::Meta(MetaKey::L4proto)) => l4,
                    (Family::Inet, Expr::Meta(MetaKey::Nfproto)) => {
                        (*n == 2 && matches!(p.proto, Proto::Ip | Proto::Icmp))
                            || (*n == 10 && matches!(p.proto, Proto::Ip6 | Proto::Icmpv6))
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        if drop {
            stmts.remove(k);
        } else {
            k += 1;
        }
    }
}

fn type_names(t: &[DataType]) -> String {
    t.iter().map(|t| t.name()).collect::<Vec<_>>().join(" . ")
}

/// The inclusive bounds of a numeric element.
fn bounds(t: DataType, e: &Elem) -> Option<(u128, u128)> {
    match e {
        Elem::Value(Value::Num(v)) => Some((*v, *v)),
        Elem::Range(Value::Num(l), Value::Num(h)) => Some((*l, *h)),
        Elem::Prefix(a, len) => {
            let host = t.bits() - u32::from(*len);
            let span = if host >= 128 {
                u128::MAX
            } else {
                (1u128 << host) - 1
            };
            Some((*a, a | span))
        }
        _ => None,
    }
}

/// An element for the bounds `lo..=hi`: a value or a range (listed as a prefix where it is one).
fn from_bounds(lo: u128, hi: u128) -> Elem {
    if lo == hi {
        Elem::Value(Value::Num(lo))
    } else {
        Elem::Range(Value::Num(lo), Value::Num(hi))
    }
}

/// For sets with ranges or prefixes (interval sets): overlapping elements of a map (or
/// of a named set, `merge` false) are an error ("conflicting intervals"); those of an
/// anonymous set are merged with their neighbours, as nft does. `elems` is sorted.
pub(crate) fn merge_intervals(
    t: DataType,
    merge: bool,
    elems: &mut Vec<SetElem>,
) -> Result<(), String> {
    let interval = elems
        .iter()
        .any(|e| matches!(e.key, Elem::Range(..) | Elem::Prefix(..)));
    if !interval {
        return Ok(());
    }
    let mut spans: Vec<(u128, u128)> = Vec::with_capacity(elems.len());
    for e in elems.iter() {
        match bounds(t, &e.key) {
            Some(b) => spans.push(b),
            None => return Ok(()),
        }
    }
    let overlaps = spans.windows(2).any(|w| w[1].0 <= w[0].1);
    let mergeable = merge
        && elems
            .iter()
            .all(|e| e.data.is_none() && e.timeout_ms.is_none());
    if !mergeable {
        if overlaps {
            return Err("conflicting intervals: elements overlap".into());
        }
        return Ok(());
    }
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(spans.len());
    for (lo, hi) in spans {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    *elems = merged
        .into_iter()
        .map(|(lo, hi)| SetElem {
            key: from_bounds(lo, hi),
            data: None,
            timeout_ms: None,
            comment: None,
        })
        .collect();
    Ok(())
}

/// The protocol numbers that reach a rule's statements so far: `Some(n)` once a match fixes
/// the transport protocol.
fn l4_of(s: &Stmt) -> Option<u128> {
    match s {
        Stmt::Match(Match {
            left: Expr::Payload(p),
            ..
        }) => transport_number(p.proto),
        Stmt::Match(Match {
            left,
            op: Op::Implicit,
            right: SetRhs::Value(Elem::Value(Value::Num(n))),
        }) if matches!(left, Expr::Meta(MetaKey::L4proto))
            || matches!(
                left,
                Expr::Payload(Payload {
                    proto: Proto::Ip,
                    field: "protocol"
                })
            )
            || matches!(
                left,
                Expr::Payload(Payload {
                    proto: Proto::Ip6,
                    field: "nexthdr"
                })
            ) =>
        {
            Some(*n)
        }
        _ => None,
    }
}

/// The network protocol a statement fixes (4 or 6).
fn l3_of(s: &Stmt) -> Option<u8> {
    match s {
        Stmt::Match(Match {
            left: Expr::Payload(p),
            ..
        }) => match p.proto {
            Proto::Ip | Proto::Icmp => Some(4),
            Proto::Ip6 | Proto::Icmpv6 => Some(6),
            _ => None,
        },
        Stmt::Match(Match {
            left: Expr::Meta(MetaKey::Nfproto),
            op: Op::Implicit,
            right: SetRhs::Value(Elem::Value(Value::Num(n))),
        }) => match n {
            2 => Some(4),
            10 => Some(6),
            _ => None,
        },
        _ => None,
    }
}

/// `reject` as nft evaluates it: the ICMP flavour must fit the family (and the rule's own
/// matches); `reject with tcp reset` needs TCP, and in inet tables nft adds `meta l4proto 6`
/// in front when the rule does not already say TCP; in inet tables `meta nfproto ipv4`
/// right before a reject becomes part of it (`reject with icmp port-unreachable`).
fn reject_dependencies(family: Family, stmts: &mut Vec<Stmt>) -> Result<(), &'static str> {
    let Some(k) = stmts.iter().position(|s| matches!(s, Stmt::Reject(_))) else {
        return Ok(());
    };
    let l3 = stmts[..k].iter().rev().find_map(l3_of);
    let l4 = stmts[..k].iter().rev().find_map(l4_of);
    let Stmt::Reject(r) = &stmts[k] else {
        return Ok(());
    };
    let r = r.clone();
    match (&r, family, l3) {
        (Reject::Icmp(_), Family::Ip6, _) | (Reject::Icmp(_), _, Some(6)) => {
            return Err("`reject with icmp` in an IPv6 context (use icmpv6 or icmpx)");
        }
        (Reject::Icmpv6(_), Family::Ip, _) | (Reject::Icmpv6(_), _, Some(4)) => {
            return Err("`reject with icmpv6` in an IPv4 context (use icmp or icmpx)");
        }
        _ => {}
    }
    if r == Reject::TcpReset {
        match l4 {
            Some(6) => {}
            Some(_) => {
                return Err(
                    "`reject with tcp reset` needs TCP, but the rule matches another protocol",
                );
            }
            None if family == Family::Inet => stmts.insert(
                0,
                Stmt::Match(Match {
                    left: Expr::Meta(MetaKey::L4proto),
                    op: Op::Implicit,
                    right: SetRhs::Value(Elem::Value(Value::Num(6))),
                }),
            ),
            None => {}
        }
        return Ok(());
    }
    if family == Family::Inet && k > 0 {
        if let Some(v) = l3_of(&stmts[k - 1]).filter(|_| {
            matches!(
                stmts[k - 1],
                Stmt::Match(Match {
                    left: Expr::Meta(MetaKey::Nfproto),
                    ..
                })
            )
        }) {
            let new = match (v, &r) {
                (4, Reject::Default) => Some(Reject::Icmp(3)),
                (6, Reject::Default) => Some(Reject::Icmpv6(4)),
                (4, Reject::Icmp(_)) | (6, Reject::Icmpv6(_)) => Some(r.clone()),
                _ => None,
            };
            if let Some(new) = new {
                stmts[k] = Stmt::Reject(new);
                stmts.remove(k - 1);
            }
        }
    }
    Ok(())
}

/// Bit offset and width of a header field (for nft's merge of adjacent payload matches).
fn field_span(p: &Payload) -> Option<(u32, u32)> {
    let span = match (p.proto, p.field) {
        (Proto::Ip, "length") => (16, 16),
        (Proto::Ip, "id") => (32, 16),
        (Proto::Ip, "ttl") => (64, 8),
        (Proto::Ip, "protocol") => (72, 8),
        (Proto::Ip, "saddr") => (96, 32),
        (Proto::Ip, "daddr") => (128, 32),
        (Proto::Ip6, "length") => (32, 16),
        (Proto::Ip6, "nexthdr") => (48, 8),
        (Proto::Ip6, "hoplimit") => (56, 8),
        (Proto::Ip6, "saddr") => (64, 128),
        (Proto::Ip6, "daddr") => (192, 128),
        (Proto::Tcp | Proto::Udp | Proto::Th, "sport") => (0, 16),
        (Proto::Tcp | Proto::Udp | Proto::Th, "dport") => (16, 16),
        (Proto::Udp, "length") => (32, 16),
        (Proto::Icmp | Proto::Icmpv6, "type") => (0, 8),
        (Proto::Icmp | Proto::Icmpv6, "code") => (8, 8),
        _ => return None,
    };
    Some(span)
}

/// nft merges consecutive `==` matches of adjacent fields of one header into one comparison
/// and lists them in header order: `icmp code 1 icmp type 2` lists as
/// `icmp type 2 icmp code 1`.
fn order_adjacent_payloads(stmts: &mut [Stmt]) {
    let key = |s: &Stmt| match s {
        Stmt::Match(Match {
            left: Expr::Payload(p),
            op: Op::Implicit,
            right: SetRhs::Value(Elem::Value(_)),
        }) => field_span(p).map(|sp| (p.proto, sp)),
        _ => None,
    };
    let mut k = 0;
    while k < stmts.len() {
        let Some((proto, _)) = key(&stmts[k]) else {
            k += 1;
            continue;
        };
        let mut end = k + 1;
        while end < stmts.len() && key(&stmts[end]).is_some_and(|(p, _)| p == proto) {
            end += 1;
        }
        if end - k > 1 {
            let run = &mut stmts[k..end];
            let mut spans: Vec<(u32, u32)> =
                run.iter().filter_map(|s| key(s).map(|x| x.1)).collect();
            spans.sort_unstable();
            let contiguous = spans.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0);
            if contiguous {
                run.sort_by_key(|s| key(s).map(|x| x.1.0));
            }
        }
        k = end;
    }
}

/// Every jump/goto names a chain of its table; every `@set` a set or map of it.
pub(crate) fn check_refs(file: &str, rs: &Ruleset) -> R<()> {
    for t in &rs.tables {
        let chain_ok = |n: &str| t.chains.iter().any(|c| c.name == n);
        let set_ok = |n: &str| t.sets.iter().any(|s| s.name == n);
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
                        if let Some(set) = t.sets.iter().find(|x| x.name == *n) {
                            if set_key_types(&set.key) != expr_types(left) {
                                return err(format!(
                                    "@{n} holds {}, not the type of `{}`",
                                    type_names(&set_key_types(&set.key)),
                                    super::print::expr_string(left)
                                ));
                            }
                        }
                    }
                    if let Stmt::Vmap {
                        map: SetRhs::Ref(n),
                        ..
                    } = s
                    {
                        if let Some(set) = t.sets.iter().find(|x| x.name == *n) {
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

/// What nft checks and rewrites in a rule once it is read: no verdict after a nat statement,
/// one network protocol, the reject flavour, and the dependencies nft drops from its listing
/// (see [`reject_dependencies`], [`eliminate_dependencies`], [`order_adjacent_payloads`]).
pub(crate) fn finish_rule(family: Family, stmts: &mut Vec<Stmt>) -> Result<(), String> {
    if stmts.is_empty() {
        return Err("a rule needs at least one statement".into());
    }
    if let Some(k) = stmts.iter().position(|s| matches!(s, Stmt::Nat(_))) {
        if stmts[k + 1..].iter().any(|s| matches!(s, Stmt::Verdict(_))) {
            return Err("a verdict may not follow a nat statement (it ends the rule)".into());
        }
    }
    let l3: Vec<u8> = stmts.iter().filter_map(l3_of).collect();
    if l3.windows(2).any(|w| w[0] != w[1])
        || (family == Family::Ip && l3.contains(&6))
        || (family == Family::Ip6 && l3.contains(&4))
    {
        return Err("conflicting protocols: IPv4 and IPv6 in one rule".into());
    }
    reject_dependencies(family, stmts).map_err(String::from)?;
    eliminate_dependencies(family, stmts);
    order_adjacent_payloads(stmts);
    Ok(())
}
