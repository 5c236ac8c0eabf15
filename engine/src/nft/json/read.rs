//! JSON -> model: [`from_json`] reads the listing form and the command form of libnftables-json
//! into a [`Ruleset`], with the JSON path of every error (the parent module says what it reads).

use super::*;

struct Reader<'a> {
    file: &'a str,
    /// (family, table, chain) -> chain index, filled as rules find their chains: one lookup
    /// per rule instead of a scan of the table's chains.
    chain_ix: std::cell::RefCell<std::collections::HashMap<(Family, String, String), usize>>,
}

type R<T> = Result<T, NftError>;

impl Reader<'_> {
    fn err(&self, path: &str, kind: ErrorKind) -> NftError {
        NftError::new(self.file, Pos::default(), path, kind)
    }

    fn bad(&self, path: &str, what: &'static str) -> NftError {
        self.err(path, ErrorKind::Unexpected(what))
    }

    /// The one key of a JSON object written as `{"KEY": VALUE}` (libnftables-json's form of an
    /// expression, a statement and a command) and its value; `what` names the object when `v`
    /// is not one.
    fn one_key<'j>(&self, v: &'j J, path: &str, what: &'static str) -> R<(&'j str, &'j J)> {
        let o = v
            .as_object()
            .filter(|o| o.len() == 1)
            .ok_or_else(|| self.bad(path, what))?;
        let (k, inner) = o.iter().next().expect("one key");
        Ok((k.as_str(), inner))
    }

    fn unsupported(&self, path: &str, what: String) -> NftError {
        self.err(path, ErrorKind::Unsupported(what))
    }

    fn str<'j>(&self, o: &'j J, key: &str, path: &str) -> R<&'j str> {
        o.get(key)
            .and_then(J::as_str)
            .ok_or_else(|| self.bad(&format!("{path}.{key}"), "a string"))
    }

    fn family(&self, o: &J, path: &str) -> R<Family> {
        match self.str(o, "family", path)? {
            "ip" => Ok(Family::Ip),
            "ip6" => Ok(Family::Ip6),
            "inet" => Ok(Family::Inet),
            other => Err(self.err(&format!("{path}.family"), ErrorKind::Family(other.into()))),
        }
    }

    fn table<'r>(
        &self,
        rs: &'r mut Ruleset,
        o: &J,
        key: &str,
        path: &str,
        create: bool,
    ) -> R<&'r mut Table> {
        let family = self.family(o, path)?;
        let name = self.str(o, key, path)?.to_string();
        if let Some(i) = rs
            .tables
            .iter()
            .position(|t| t.family == family && t.name == name)
        {
            return Ok(&mut rs.tables[i]);
        }
        if !create {
            return Err(self.err(
                &format!("{path}.{key}"),
                ErrorKind::Name(format!("no table {} {name}", family.name())),
            ));
        }
        rs.tables.push(Table {
            family,
            name,
            sets: Vec::new(),
            chains: Vec::new(),
            comment: None,
            pos: Pos::default(),
        });
        Ok(rs.tables.last_mut().expect("pushed"))
    }

    fn object(&self, rs: &mut Ruleset, kind: &str, o: &J, path: &str) -> R<()> {
        match kind {
            "metainfo" => Ok(()),
            "table" => {
                let t = self.table(rs, o, "name", path, true)?;
                if let Some(c) = o.get("comment").and_then(J::as_str) {
                    t.comment = Some(c.to_string());
                }
                Ok(())
            }
            "chain" => {
                let name = self.str(o, "name", path)?.to_string();
                let comment = o.get("comment").and_then(J::as_str).map(str::to_string);
                let base = match o.get("hook") {
                    None => None,
                    Some(_) => Some(self.base_chain(o, path)?),
                };
                let t = self.table(rs, o, "table", path, false)?;
                let key = (t.family, t.name.clone(), name.clone());
                let known = self.chain_ix.borrow().get(&key).copied();
                match known {
                    Some(ci) => {
                        let c = &mut t.chains[ci];
                        c.base = base.or(c.base);
                    }
                    None => {
                        self.chain_ix.borrow_mut().insert(key, t.chains.len());
                        t.chains.push(Chain {
                            name,
                            base,
                            rules: Vec::new(),
                            comment,
                            pos: Pos::default(),
                        });
                    }
                }
                Ok(())
            }
            "set" | "map" => {
                let set = self.set(o, kind == "map", path)?;
                let t = self.table(rs, o, "table", path, false)?;
                if t.sets.iter().any(|s| s.name == set.name) {
                    return Err(self.err(
                        path,
                        ErrorKind::Name(format!("set {} is declared twice", set.name)),
                    ));
                }
                t.sets.push(set);
                Ok(())
            }
            "element" => {
                let name = self.str(o, "name", path)?.to_string();
                let t = self.table(rs, o, "table", path, false)?;
                let Some(set) = t.sets.iter_mut().find(|s| s.name == name) else {
                    return Err(self.err(
                        &format!("{path}.name"),
                        ErrorKind::Name(format!("no set {name}")),
                    ));
                };
                let (key, data) = (set_key_types(&set.key), set.data.clone());
                let elems =
                    self.elems(o.get("elem"), &key, data.as_ref(), &format!("{path}.elem"))?;
                set.elements.extend(elems);
                Ok(())
            }
            "rule" => {
                let chain = self.str(o, "chain", path)?.to_string();
                let comment = o.get("comment").and_then(J::as_str).map(str::to_string);
                let t = self.table(rs, o, "table", path, false)?;
                let family = t.family;
                let exprs = o
                    .get("expr")
                    .and_then(J::as_array)
                    .ok_or_else(|| self.bad(&format!("{path}.expr"), "an array of statements"))?;
                let mut stmts = Vec::with_capacity(exprs.len());
                for (k, s) in exprs.iter().enumerate() {
                    stmts.push(self.stmt(s, family, &format!("{path}.expr[{k}]"))?);
                }
                finish_rule(family, &mut stmts)
                    .map_err(|m| self.err(path, ErrorKind::Invalid(m)))?;
                let key = (family, t.name.clone(), chain.clone());
                let cached = self.chain_ix.borrow().get(&key).copied();
                let ci = match cached {
                    Some(ci) if t.chains.get(ci).is_some_and(|c| c.name == chain) => ci,
                    _ => {
                        let Some(ci) = t.chains.iter().position(|c| c.name == chain) else {
                            return Err(self.err(
                                &format!("{path}.chain"),
                                ErrorKind::Name(format!("no chain {chain}")),
                            ));
                        };
                        self.chain_ix.borrow_mut().insert(key, ci);
                        ci
                    }
                };
                t.chains[ci].rules.push(Rule {
                    stmts,
                    comment,
                    pos: Pos::default(),
                });
                Ok(())
            }
            other => Err(self.unsupported(path, format!("JSON object `{other}`"))),
        }
    }

    fn base_chain(&self, o: &J, path: &str) -> R<BaseChain> {
        let kind = match self.str(o, "type", path)? {
            "filter" => ChainType::Filter,
            "nat" => ChainType::Nat,
            "route" => ChainType::Route,
            _ => return Err(self.bad(&format!("{path}.type"), "filter, nat or route")),
        };
        let hook = match self.str(o, "hook", path)? {
            "prerouting" => Hook::Prerouting,
            "input" => Hook::Input,
            "forward" => Hook::Forward,
            "output" => Hook::Output,
            "postrouting" => Hook::Postrouting,
            h => return Err(self.unsupported(&format!("{path}.hook"), format!("hook `{h}`"))),
        };
        let priority = o
            .get("prio")
            .and_then(J::as_i64)
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| self.bad(&format!("{path}.prio"), "a priority number"))?;
        let policy = match o.get("policy").and_then(J::as_str) {
            None | Some("accept") => Policy::Accept,
            Some("drop") => Policy::Drop,
            Some(_) => return Err(self.bad(&format!("{path}.policy"), "accept or drop")),
        };
        Ok(BaseChain {
            kind,
            hook,
            priority,
            policy,
        })
    }

    fn set_type(&self, v: Option<&J>, verdict_ok: bool, path: &str) -> R<SetType> {
        let one = |s: &str| -> R<DataType> {
            DataType::from_name(s).ok_or_else(|| self.unsupported(path, format!("datatype `{s}`")))
        };
        match v {
            Some(J::String(s)) if verdict_ok && s == "verdict" => Ok(SetType::Verdict),
            Some(J::String(s)) => Ok(SetType::Types(vec![one(s)?])),
            Some(J::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .ok_or_else(|| self.bad(path, "a datatype name"))
                        .and_then(one)
                })
                .collect::<R<Vec<_>>>()
                .map(SetType::Types),
            Some(J::Object(o)) if o.contains_key("typeof") => Ok(SetType::Typeof(
                self.expr(&o["typeof"], &format!("{path}.typeof"))?,
            )),
            _ => Err(self.bad(path, "a datatype, a list of them, or {\"typeof\": ...}")),
        }
    }

    fn set(&self, o: &J, is_map: bool, path: &str) -> R<Set> {
        let name = self.str(o, "name", path)?.to_string();
        let key = self.set_type(o.get("type"), false, &format!("{path}.type"))?;
        let data = if is_map {
            Some(self.set_type(o.get("map"), true, &format!("{path}.map"))?)
        } else {
            None
        };
        let mut flags = 0u8;
        let fl: Vec<&J> = match o.get("flags") {
            None => Vec::new(),
            Some(J::Array(a)) => a.iter().collect(),
            Some(x) => vec![x],
        };
        for f in fl {
            let f = f
                .as_str()
                .ok_or_else(|| self.bad(&format!("{path}.flags"), "flag names"))?;
            match SET_FLAGS.iter().position(|x| *x == f) {
                Some(b) => flags |= 1 << b,
                None => {
                    return Err(
                        self.unsupported(&format!("{path}.flags"), format!("set flag `{f}`"))
                    );
                }
            }
        }
        let secs = |k: &str| o.get(k).and_then(J::as_u64).map(|s| s.saturating_mul(1000));
        let counter = match o.get("stmt") {
            None => false,
            Some(J::Array(a)) if a.iter().all(|s| s.get("counter").is_some()) && a.len() == 1 => {
                true
            }
            Some(_) => {
                return Err(self.unsupported(
                    &format!("{path}.stmt"),
                    "set statements other than `counter`".into(),
                ));
            }
        };
        let mut set = Set {
            name,
            is_map,
            key,
            data,
            flags,
            timeout_ms: secs("timeout"),
            gc_interval_ms: secs("gc-interval"),
            size: o
                .get("size")
                .and_then(J::as_u64)
                .and_then(|n| u32::try_from(n).ok()),
            counter,
            comment: o.get("comment").and_then(J::as_str).map(str::to_string),
            elements: Vec::new(),
            pos: Pos::default(),
        };
        if set.timeout_ms.is_some() {
            set.flags |= 4;
        }
        let key = set_key_types(&set.key);
        set.elements = self.elems(
            o.get("elem"),
            &key,
            set.data.as_ref(),
            &format!("{path}.elem"),
        )?;
        sort_elements(&mut set.elements);
        if let [t] = key.as_slice() {
            let mut check = set.elements.clone();
            merge_intervals(*t, false, &mut check)
                .map_err(|m| self.err(path, ErrorKind::Invalid(m)))?;
        }
        Ok(set)
    }

    fn elems(
        &self,
        v: Option<&J>,
        key: &[DataType],
        data: Option<&SetType>,
        path: &str,
    ) -> R<Vec<SetElem>> {
        let Some(v) = v else {
            return Ok(Vec::new());
        };
        let items = v
            .as_array()
            .ok_or_else(|| self.bad(path, "an array of elements"))?;
        let mut out = Vec::with_capacity(items.len());
        for (k, item) in items.iter().enumerate() {
            let p = format!("{path}[{k}]");
            let (kv, dv) = match (item, data) {
                (J::Array(pair), Some(_)) if pair.len() == 2 => (&pair[0], Some(&pair[1])),
                (_, Some(_)) => return Err(self.bad(&p, "[key, data] for a map element")),
                (kv, None) => (kv, None),
            };
            let (kv, timeout_ms, comment) = match kv.get("elem") {
                Some(e) => (
                    e.get("val").ok_or_else(|| self.bad(&p, "elem.val"))?,
                    e.get("timeout").and_then(J::as_u64).map(|s| s * 1000),
                    e.get("comment").and_then(J::as_str).map(str::to_string),
                ),
                None => (kv, None, None),
            };
            let key_elem = self.elem(kv, key, &p)?;
            let data = match (dv, data) {
                (Some(d), Some(SetType::Verdict)) => Some(MapData::Verdict(
                    self.verdict(d, &p)?
                        .ok_or_else(|| self.bad(&p, "a verdict"))?,
                )),
                (Some(d), Some(t)) => Some(MapData::Value(self.elem(d, &set_key_types(t), &p)?)),
                _ => None,
            };
            let expires_ms = kv_elem_expires(item);
            out.push(SetElem {
                key: key_elem,
                data,
                timeout_ms,
                expires_ms,
                comment,
            });
        }
        Ok(out)
    }

    fn verdict(&self, v: &J, path: &str) -> R<Option<Verdict>> {
        let Some(o) = v.as_object() else {
            return Ok(None);
        };
        let Some((k, inner)) = o.iter().next().filter(|_| o.len() == 1) else {
            return Ok(None);
        };
        let target = || {
            inner
                .get("target")
                .and_then(J::as_str)
                .map(str::to_string)
                .ok_or_else(|| self.bad(&format!("{path}.{k}.target"), "a chain name"))
        };
        Ok(Some(match k.as_str() {
            "accept" => Verdict::Accept,
            "drop" => Verdict::Drop,
            "continue" => Verdict::Continue,
            "return" => Verdict::Return,
            "jump" => Verdict::Jump(target()?),
            "goto" => Verdict::Goto(target()?),
            _ => return Ok(None),
        }))
    }

    /// One value of `types` (a concatenation when there are several).
    fn elem(&self, v: &J, types: &[DataType], path: &str) -> R<Elem> {
        if types.len() > 1 {
            let parts = v
                .get("concat")
                .and_then(J::as_array)
                .filter(|a| a.len() == types.len())
                .ok_or_else(|| self.bad(path, "a concat of one value per type"))?;
            return parts
                .iter()
                .zip(types)
                .map(|(p, t)| self.elem(p, std::slice::from_ref(t), path))
                .collect::<R<Vec<_>>>()
                .map(Elem::Concat);
        }
        let t = *types
            .first()
            .ok_or_else(|| self.bad(path, "no value here"))?;
        let bad = || {
            self.err(
                path,
                ErrorKind::BadValue {
                    value: v.to_string(),
                    dtype: t.name(),
                },
            )
        };
        match v {
            J::String(s) => t.parse_elem(s, t.is_string()).ok_or_else(bad),
            J::Number(n) => t.parse_elem(&n.to_string(), false).ok_or_else(bad),
            J::Bool(b) if t == DataType::Boolean => Ok(Elem::Value(Value::Num(u128::from(*b)))),
            J::Array(a) if t.is_flags() => {
                let mut acc = 0u128;
                for x in a {
                    match x.as_str().and_then(|s| t.parse_value(s, false)) {
                        Some(Value::Num(n)) => acc |= n,
                        _ => return Err(bad()),
                    }
                }
                Ok(Elem::Value(Value::Num(acc)))
            }
            J::Object(o) if o.contains_key("prefix") => {
                let p = &o["prefix"];
                let addr = p.get("addr").and_then(J::as_str).ok_or_else(bad)?;
                let len = p.get("len").and_then(J::as_u64).ok_or_else(bad)?;
                t.parse_elem(&format!("{addr}/{len}"), false)
                    .ok_or_else(bad)
            }
            J::Object(o) if o.contains_key("range") => {
                let r = o["range"]
                    .as_array()
                    .filter(|r| r.len() == 2)
                    .ok_or_else(bad)?;
                let one = |x: &J| match x {
                    J::String(s) => t.parse_value(s, t.is_string()),
                    J::Number(n) => t.parse_value(&n.to_string(), false),
                    _ => None,
                };
                match (one(&r[0]), one(&r[1])) {
                    (Some(lo), Some(hi)) if lo <= hi => Ok(Elem::Range(lo, hi)),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    fn rhs(&self, v: &J, types: &[DataType], data: Option<&SetType>, path: &str) -> R<SetRhs> {
        if let Some(name) = v.as_str().and_then(|s| s.strip_prefix('@')) {
            return Ok(SetRhs::Ref(name.to_string()));
        }
        if let Some(items) = v.get("set") {
            let mut elems = self.elems(Some(items), types, data, &format!("{path}.set"))?;
            sort_elements(&mut elems);
            if let [t] = types {
                merge_intervals(*t, data.is_none(), &mut elems)
                    .map_err(|m| self.err(path, ErrorKind::Invalid(m)))?;
            }
            return Ok(SetRhs::Set(elems));
        }
        Ok(SetRhs::Value(self.elem(v, types, path)?))
    }

    fn expr(&self, v: &J, path: &str) -> R<Expr> {
        let (k, inner) = self.one_key(v, path, "an expression object")?;
        let p = format!("{path}.{k}");
        match k {
            "payload" => {
                let proto = match self.str(inner, "protocol", &p)? {
                    "ip" => Proto::Ip,
                    "ip6" => Proto::Ip6,
                    "tcp" => Proto::Tcp,
                    "udp" => Proto::Udp,
                    "th" => Proto::Th,
                    "icmp" => Proto::Icmp,
                    "icmpv6" => Proto::Icmpv6,
                    other => return Err(self.unsupported(&p, format!("payload `{other}`"))),
                };
                let f = self.str(inner, "field", &p)?;
                match payload_field(proto, f) {
                    Some((field, _)) => Ok(Expr::Payload(Payload { proto, field })),
                    None => Err(self.unsupported(&p, format!("`{} {f}`", proto_name(proto)))),
                }
            }
            "meta" => {
                let key = self.str(inner, "key", &p)?;
                meta_key(key, true)
                    .map(Expr::Meta)
                    .ok_or_else(|| self.unsupported(&p, format!("`meta {key}`")))
            }
            "ct" => {
                if inner.get("dir").is_some() || inner.get("family").is_some() {
                    return Err(self.unsupported(&p, "`ct original|reply ...`".into()));
                }
                let key = match self.str(inner, "key", &p)? {
                    "state" => CtKey::State,
                    "status" => CtKey::Status,
                    "mark" => CtKey::Mark,
                    "direction" => CtKey::Direction,
                    other => return Err(self.unsupported(&p, format!("`ct {other}`"))),
                };
                Ok(Expr::Ct(key))
            }
            "fib" => {
                let r = self.str(inner, "result", &p)?;
                let Some(result) = FibResult::from_name(r) else {
                    return Err(self.unsupported(&p, format!("fib result `{r}`")));
                };
                let fl: Vec<&J> = match inner.get("flags") {
                    Some(J::Array(a)) => a.iter().collect(),
                    Some(x) => vec![x],
                    None => Vec::new(),
                };
                let mut flags = 0u8;
                for f in fl {
                    match f
                        .as_str()
                        .and_then(|f| FIB_FLAGS.iter().position(|x| *x == f))
                    {
                        Some(b) => flags |= 1 << b,
                        None => {
                            return Err(
                                self.bad(&format!("{p}.flags"), "saddr, daddr, mark, iif or oif")
                            );
                        }
                    }
                }
                Ok(Expr::Fib { flags, result })
            }
            "numgen" => {
                let random = match self.str(inner, "mode", &p)? {
                    "random" => true,
                    "inc" => false,
                    _ => return Err(self.bad(&format!("{p}.mode"), "random or inc")),
                };
                let modulus = inner
                    .get("mod")
                    .and_then(J::as_u64)
                    .and_then(|m| u32::try_from(m).ok())
                    .filter(|m| *m > 0)
                    .ok_or_else(|| self.bad(&format!("{p}.mod"), "a modulus above 0"))?;
                let offset = inner
                    .get("offset")
                    .and_then(J::as_u64)
                    .and_then(|m| u32::try_from(m).ok())
                    .unwrap_or(0);
                Ok(Expr::Numgen {
                    random,
                    modulus,
                    offset,
                })
            }
            "concat" => inner
                .as_array()
                .ok_or_else(|| self.bad(&p, "an array"))?
                .iter()
                .enumerate()
                .map(|(k, e)| self.expr(e, &format!("{p}[{k}]")))
                .collect::<R<Vec<_>>>()
                .map(Expr::Concat),
            "&" => {
                let a = inner
                    .as_array()
                    .filter(|a| a.len() == 2)
                    .ok_or_else(|| self.bad(&p, "[expression, mask]"))?;
                let left = self.expr(&a[0], &format!("{p}[0]"))?;
                let types = expr_types(&left);
                let m = match types.as_slice() {
                    [DataType::Mark] => u128::from(
                        a[1].as_u64()
                            .ok_or_else(|| self.bad(&format!("{p}[1]"), "a numeric mask"))?,
                    ),
                    [t] if t.is_flags() => match self.elem(&a[1], &[*t], &format!("{p}[1]"))? {
                        Elem::Value(Value::Num(m)) => m,
                        _ => return Err(self.bad(&format!("{p}[1]"), "flag names")),
                    },
                    _ => {
                        return Err(self.unsupported(
                            &p,
                            "`&` on this expression (marks and flags only)".into(),
                        ));
                    }
                };
                Ok(Expr::And(Box::new(left), m))
            }
            other => Err(self.unsupported(&p, format!("expression `{other}`"))),
        }
    }

    fn stmt(&self, v: &J, family: Family, path: &str) -> R<Stmt> {
        if let Some(verdict) = self.verdict(v, path)? {
            return Ok(Stmt::Verdict(verdict));
        }
        let (k, inner) = self.one_key(v, path, "a statement object")?;
        let p = format!("{path}.{k}");
        match k {
            "match" => {
                let left = self.expr(
                    inner.get("left").ok_or_else(|| self.bad(&p, "left"))?,
                    &format!("{p}.left"),
                )?;
                let types = expr_types(&left);
                let flags = types.iter().any(|t| t.is_flags());
                if inner.get("op").and_then(J::as_str) == Some("!") {
                    let none_of = match types.as_slice() {
                        [t] if t.is_flags() => Some(*t),
                        _ => None,
                    };
                    let Some(t) = none_of else {
                        return Err(self.unsupported(
                            &format!("{p}.op"),
                            "operator `!` on this expression".into(),
                        ));
                    };
                    let right = inner.get("right").ok_or_else(|| self.bad(&p, "right"))?;
                    let m = match self.elem(right, &[t], &format!("{p}.right"))? {
                        Elem::Value(Value::Num(m)) => m,
                        _ => return Err(self.bad(&format!("{p}.right"), "flag names")),
                    };
                    return Ok(Stmt::Match(Match {
                        left: Expr::And(Box::new(left), m),
                        op: Op::Eq,
                        right: SetRhs::Value(Elem::Value(Value::Num(0))),
                    }));
                }
                let op = match inner.get("op").and_then(J::as_str).unwrap_or("==") {
                    "in" => Op::Implicit,
                    "==" if flags || matches!(left, Expr::And(..)) => Op::Eq,
                    "==" => Op::Implicit,
                    "!=" => Op::Ne,
                    "<" => Op::Lt,
                    ">" => Op::Gt,
                    "<=" => Op::Le,
                    ">=" => Op::Ge,
                    other => {
                        return Err(
                            self.unsupported(&format!("{p}.op"), format!("operator `{other}`"))
                        );
                    }
                };
                let right = self.rhs(
                    inner.get("right").ok_or_else(|| self.bad(&p, "right"))?,
                    &types,
                    None,
                    &format!("{p}.right"),
                )?;
                // `==` with a set is membership, what the text writes without an operator.
                let op = match (op, &right) {
                    (Op::Eq, SetRhs::Set(_) | SetRhs::Ref(_)) => Op::Implicit,
                    (op, _) => op,
                };
                Ok(Stmt::Match(Match { left, op, right }))
            }
            "counter" => match inner {
                J::String(n) => Ok(Stmt::CounterRef(n.clone())),
                J::Null => Ok(Stmt::Counter {
                    packets: 0,
                    bytes: 0,
                }),
                o => Ok(Stmt::Counter {
                    packets: o.get("packets").and_then(J::as_u64).unwrap_or(0),
                    bytes: o.get("bytes").and_then(J::as_u64).unwrap_or(0),
                }),
            },
            "limit" => {
                let rate = inner
                    .get("rate")
                    .and_then(J::as_u64)
                    .ok_or_else(|| self.bad(&p, "rate"))?;
                let per = match inner.get("per").and_then(J::as_str).unwrap_or("second") {
                    "second" => "second",
                    "minute" => "minute",
                    "hour" => "hour",
                    "day" => "day",
                    "week" => "week",
                    _ => {
                        return Err(
                            self.bad(&format!("{p}.per"), "second, minute, hour, day or week")
                        );
                    }
                };
                let byte_unit = match inner.get("rate_unit").and_then(J::as_str) {
                    None | Some("packets") => None,
                    Some("bytes") => Some("bytes"),
                    Some("kbytes") => Some("kbytes"),
                    Some("mbytes") => Some("mbytes"),
                    Some(_) => {
                        return Err(self.bad(
                            &format!("{p}.rate_unit"),
                            "packets, bytes, kbytes or mbytes",
                        ));
                    }
                };
                let default_burst = if byte_unit.is_some() { 0 } else { 5 };
                let burst = inner
                    .get("burst")
                    .and_then(J::as_u64)
                    .map_or(Ok(default_burst), u32::try_from)
                    .map_err(|_| self.bad(&p, "a burst"))?;
                let over = inner.get("inv").and_then(J::as_bool).unwrap_or(false);
                Ok(Stmt::Limit(Limit {
                    over,
                    rate,
                    byte_unit,
                    per,
                    burst,
                }))
            }
            "log" => {
                let mut log = Log::default();
                if let Some(o) = inner.as_object() {
                    log.prefix = o.get("prefix").and_then(J::as_str).map(str::to_string);
                    log.group = o
                        .get("group")
                        .and_then(J::as_u64)
                        .and_then(|g| u16::try_from(g).ok());
                    log.snaplen = o
                        .get("snaplen")
                        .and_then(J::as_u64)
                        .and_then(|g| u32::try_from(g).ok());
                    log.queue_threshold = o
                        .get("queue-threshold")
                        .and_then(J::as_u64)
                        .and_then(|g| u16::try_from(g).ok());
                    if let Some(l) = o.get("level").and_then(J::as_str) {
                        const LEVELS: [&str; 9] = [
                            "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
                            "audit",
                        ];
                        log.level = Some(
                            LEVELS
                                .iter()
                                .find(|x| **x == l)
                                .ok_or_else(|| self.bad(&format!("{p}.level"), "a log level"))?,
                        );
                        if log.level == Some("warn") {
                            log.level = None;
                        }
                    }
                    if o.contains_key("flags") {
                        return Err(self.unsupported(&p, "`log flags`".into()));
                    }
                }
                Ok(Stmt::Log(log))
            }
            "reject" => {
                if inner.is_null() {
                    return Ok(Stmt::Reject(Reject::Default));
                }
                let code = |t: DataType| -> R<u8> {
                    let v = inner.get("expr");
                    let parsed = match v {
                        Some(J::String(s)) => t.parse_value(s, false),
                        Some(J::Number(n)) => t.parse_value(&n.to_string(), false),
                        _ => None,
                    };
                    match parsed {
                        Some(Value::Num(n)) => Ok(n as u8),
                        _ => Err(self.bad(&format!("{p}.expr"), "a reject code")),
                    }
                };
                let r = match inner.get("type").and_then(J::as_str) {
                    Some("tcp reset") => Reject::TcpReset,
                    Some("icmp") => Reject::Icmp(code(DataType::IcmpCode)?),
                    Some("icmpv6") => Reject::Icmpv6(code(DataType::Icmpv6Code)?),
                    Some("icmpx") => Reject::Icmpx(code(DataType::IcmpxCode)?),
                    None => Reject::Default,
                    Some(_) => {
                        return Err(
                            self.bad(&format!("{p}.type"), "tcp reset, icmp, icmpv6 or icmpx")
                        );
                    }
                };
                Ok(Stmt::Reject(r))
            }
            "notrack" => Ok(Stmt::Notrack),
            "set" => {
                let op = match self.str(inner, "op", &p)? {
                    "add" => SetUpdateOp::Add,
                    "update" => SetUpdateOp::Update,
                    "delete" => SetUpdateOp::Delete,
                    _ => return Err(self.bad(&format!("{p}.op"), "add, update or delete")),
                };
                let set = self.str(inner, "set", &p)?;
                let set = set.strip_prefix('@').unwrap_or(set).to_string();
                let elem = inner.get("elem").ok_or_else(|| self.bad(&p, "elem"))?;
                let (key_json, timeout_ms) = match elem.get("elem") {
                    Some(e) => (
                        e.get("val")
                            .ok_or_else(|| self.bad(&format!("{p}.elem"), "elem.val"))?,
                        e.get("timeout").and_then(J::as_u64).map(|s| s * 1000),
                    ),
                    None => (elem, None),
                };
                let key = self.expr(key_json, &format!("{p}.elem"))?;
                let mut stmts = Vec::new();
                if let Some(list) = inner.get("stmt").and_then(J::as_array) {
                    for (k, s) in list.iter().enumerate() {
                        let sp = format!("{p}.stmt[{k}]");
                        let st = self.stmt(s, family, &sp)?;
                        if !matches!(st, Stmt::Limit(_) | Stmt::Counter { .. }) {
                            return Err(self.unsupported(
                                &sp,
                                "statements other than limit and counter in a set update".into(),
                            ));
                        }
                        stmts.push(st);
                    }
                }
                Ok(Stmt::SetUpdate(SetUpdate {
                    op,
                    set,
                    key,
                    timeout_ms,
                    stmts,
                }))
            }
            "snat" | "dnat" | "masquerade" | "redirect" => {
                let kind = match k {
                    "snat" => NatKind::Snat,
                    "dnat" => NatKind::Dnat,
                    "masquerade" => NatKind::Masquerade,
                    _ => NatKind::Redirect,
                };
                let nat_family = match inner.get("family").and_then(J::as_str) {
                    None => None,
                    Some("ip") => Some(Family::Ip),
                    Some("ip6") => Some(Family::Ip6),
                    Some(_) => return Err(self.bad(&format!("{p}.family"), "ip or ip6")),
                };
                let addr_type = match nat_family.unwrap_or(family) {
                    Family::Ip6 => DataType::Ipv6Addr,
                    _ => DataType::Ipv4Addr,
                };
                let addr = match inner.get("addr") {
                    None => None,
                    Some(a) => match a.get("map") {
                        Some(m) => {
                            let key = self.expr(
                                m.get("key").ok_or_else(|| self.bad(&p, "map.key"))?,
                                &format!("{p}.addr.map.key"),
                            )?;
                            let types = expr_types(&key);
                            let data = SetType::Types(vec![addr_type]);
                            let map = self.rhs(
                                m.get("data").ok_or_else(|| self.bad(&p, "map.data"))?,
                                &types,
                                Some(&data),
                                &format!("{p}.addr.map.data"),
                            )?;
                            Some(NatAddr::Map { key, map })
                        }
                        None => Some(NatAddr::Value(self.elem(
                            a,
                            &[addr_type],
                            &format!("{p}.addr"),
                        )?)),
                    },
                };
                let port = match inner.get("port") {
                    None => None,
                    Some(v) => {
                        Some(self.elem(v, &[DataType::InetService], &format!("{p}.port"))?)
                    }
                };
                let fl: Vec<&J> = match inner.get("flags") {
                    Some(J::Array(a)) => a.iter().collect(),
                    Some(x) => vec![x],
                    None => Vec::new(),
                };
                let mut flags = 0u8;
                for f in fl {
                    match f.as_str().and_then(|f| {
                        ["random", "fully-random", "persistent"]
                            .iter()
                            .position(|x| *x == f)
                    }) {
                        Some(b) => flags |= 1 << b,
                        None => {
                            return Err(self
                                .bad(&format!("{p}.flags"), "random, fully-random or persistent"));
                        }
                    }
                }
                Ok(Stmt::Nat(Nat {
                    kind,
                    family: nat_family,
                    addr,
                    port,
                    flags,
                }))
            }
            "vmap" => {
                let key = self.expr(
                    inner.get("key").ok_or_else(|| self.bad(&p, "key"))?,
                    &format!("{p}.key"),
                )?;
                let types = expr_types(&key);
                let map = self.rhs(
                    inner.get("data").ok_or_else(|| self.bad(&p, "data"))?,
                    &types,
                    Some(&SetType::Verdict),
                    &format!("{p}.data"),
                )?;
                Ok(Stmt::Vmap { key, map })
            }
            "mangle" => {
                let key = self.expr(
                    inner.get("key").ok_or_else(|| self.bad(&p, "key"))?,
                    &format!("{p}.key"),
                )?;
                if !matches!(key, Expr::Meta(MetaKey::Mark) | Expr::Ct(CtKey::Mark)) {
                    return Err(self.unsupported(&p, format!("setting `{}`", expr_string(&key))));
                }
                let v = inner.get("value").ok_or_else(|| self.bad(&p, "value"))?;
                let vp = format!("{p}.value");
                let bitop = [("&", BitOp::And), ("|", BitOp::Or), ("^", BitOp::Xor)]
                    .into_iter()
                    .find(|(k, _)| v.get(*k).is_some());
                let value = if let Some((sym, op)) = bitop {
                    let a = v[sym]
                        .as_array()
                        .filter(|a| a.len() == 2)
                        .ok_or_else(|| self.bad(&vp, "[mark, constant]"))?;
                    let expr = self.expr(&a[0], &format!("{vp}.{sym}[0]"))?;
                    let m = a[1]
                        .as_u64()
                        .ok_or_else(|| self.bad(&format!("{vp}.{sym}[1]"), "a number"))?;
                    SetValue::From {
                        expr,
                        op: Some((op, u128::from(m))),
                    }
                } else if v.get("meta").is_some() || v.get("ct").is_some() {
                    SetValue::From {
                        expr: self.expr(v, &vp)?,
                        op: None,
                    }
                } else {
                    SetValue::Value(self.elem(v, &expr_types(&key), &vp)?)
                };
                if let SetValue::From { expr, .. } = &value {
                    if !matches!(expr, Expr::Meta(MetaKey::Mark) | Expr::Ct(CtKey::Mark)) {
                        return Err(self.unsupported(
                            &vp,
                            format!("setting a mark from `{}`", expr_string(expr)),
                        ));
                    }
                }
                Ok(Stmt::Set { key, value })
            }
            other => Err(self.unsupported(&p, format!("statement `{other}`"))),
        }
    }
}

/// Reads nft JSON (`nft -j list ruleset` output, or `nft -j -f` input with `add`/`flush`
/// commands). Errors name the JSON path (`nftables[4].rule.expr[0].match.right`) in
/// [`NftError::token`]; a syntax error carries serde_json's line and column.
pub fn from_json(file: &str, text: &str) -> Result<Ruleset, NftErrors> {
    let one = |e: NftError| NftErrors(vec![e]);
    let doc: J = serde_json::from_str(text).map_err(|e| {
        one(NftError::new(
            file,
            Pos {
                line: e.line() as u32,
                column: e.column() as u32,
            },
            "",
            ErrorKind::Invalid(format!("JSON: {e}")),
        ))
    })?;
    let r = Reader {
        file,
        chain_ix: Default::default(),
    };
    let list = doc
        .get("nftables")
        .and_then(J::as_array)
        .ok_or_else(|| one(r.bad("nftables", "{\"nftables\": [...]}")))?;
    let mut rs = Ruleset::default();
    for (k, item) in list.iter().enumerate() {
        let path = format!("nftables[{k}]");
        let (kind, body) = r
            .one_key(item, &path, "an object with one key")
            .map_err(one)?;
        match kind {
            "add" | "create" => {
                let (k2, b2) = r
                    .one_key(body, &path, "an object with one key")
                    .map_err(one)?;
                r.object(&mut rs, k2, b2, &format!("{path}.{kind}.{k2}"))
                    .map_err(one)?;
            }
            "flush" if body.get("ruleset").is_some() => {
                rs.tables.clear();
                r.chain_ix.borrow_mut().clear();
            }
            "flush" | "delete" | "insert" | "replace" | "list" | "reset" | "rename" | "destroy" => {
                return Err(one(r.unsupported(&path, format!("command `{kind}`"))));
            }
            _ => r
                .object(&mut rs, kind, body, &format!("{path}.{kind}"))
                .map_err(one)?,
        }
    }
    // Elements from `element` objects are sorted and checked once, here.
    for t in &mut rs.tables {
        for set in &mut t.sets {
            sort_elements(&mut set.elements);
            if let [k] = set_key_types(&set.key).as_slice() {
                let mut check = set.elements.clone();
                merge_intervals(*k, false, &mut check)
                    .map_err(|m| one(r.err(&set.name, ErrorKind::Invalid(m))))?;
            }
        }
    }
    check_refs(file, &rs).map_err(one)?;
    Ok(rs)
}

/// `expires` (seconds) of an `{"elem": {...}}` item, also inside a `[key, data]` pair.
fn kv_elem_expires(item: &J) -> Option<u64> {
    let e = match item {
        J::Array(pair) => pair.first()?.get("elem")?,
        other => other.get("elem")?,
    };
    e.get("expires").and_then(J::as_u64).map(|s| s * 1000)
}
