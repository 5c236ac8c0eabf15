//! Rules: statements, expressions and the values they compare with (`impl Parser` for the
//! part after `add rule ... CHAIN` or inside a chain block), and the tables of modelled header
//! fields and meta keys with their datatypes.

use super::*;
use crate::nft::{SetUpdate, SetUpdateOp};

impl Parser<'_> {
    pub(super) fn rule(&mut self, ti: usize, family: Family) -> R<Rule> {
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
                "add" | "update" | "delete"
                    if self
                        .toks
                        .get(self.i + 1)
                        .is_some_and(|t| t.tok == Tok::Punct("@")) =>
                {
                    self.i += 2;
                    stmts.push(Stmt::SetUpdate(self.set_update(&w, family)?));
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
                    crate::nft::print::expr_string(&left)
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

    /// After `add @`: `NAME { KEY [timeout T] [limit ... | counter ...] }`.
    fn set_update(&mut self, op: &str, family: Family) -> R<SetUpdate> {
        let op = match op {
            "add" => SetUpdateOp::Add,
            "update" => SetUpdateOp::Update,
            _ => SetUpdateOp::Delete,
        };
        let (set, _) = self.name("a set name")?;
        self.expect_punct("{", "`{` after the set name")?;
        let key = self.concat_expr(family)?;
        let mut timeout_ms = None;
        let mut stmts = Vec::new();
        loop {
            let t = self.peek().clone();
            match &t.tok {
                Tok::Punct("}") => {
                    self.i += 1;
                    break;
                }
                Tok::Word(w) if w == "timeout" => {
                    self.i += 1;
                    let (v, _) = self.word("a time")?;
                    timeout_ms = Some(parse_time(&v).ok_or_else(|| {
                        self.err_at(&t, ErrorKind::Unexpected("a time such as 30s"))
                    })?);
                }
                Tok::Word(w) if w == "limit" => {
                    self.i += 1;
                    stmts.push(Stmt::Limit(self.limit()?));
                }
                Tok::Word(w) if w == "counter" => {
                    self.i += 1;
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
                Tok::Word(w) => {
                    let w = format!("`{w}` in a set update");
                    return Err(self.err(ErrorKind::Unsupported(w)));
                }
                _ => return Err(self.err(ErrorKind::Unexpected("`}`, timeout, limit or counter"))),
            }
        }
        Ok(SetUpdate {
            op,
            set,
            key,
            timeout_ms,
            stmts,
        })
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
                    crate::nft::print::expr_string(&expr)
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
    pub(super) fn concat_expr(&mut self, family: Family) -> R<Expr> {
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
                let Some(result) = FibResult::from_name(&r) else {
                    return Err(NftError::new(
                        self.file,
                        rpos,
                        &r,
                        ErrorKind::Unsupported(format!("fib result `{r}`")),
                    ));
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
        Proto::Icmp => &[("type", D::IcmpType), ("code", D::IcmpCode)],
        Proto::Icmpv6 => &[("type", D::Icmpv6Type), ("code", D::Icmpv6Code)],
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
