//! nft JSON (libnftables-json, what `nft -j list ruleset` prints and `nft -j -f` reads) to and
//! from the [`Ruleset`] model.
//!
//! [`to_json`] writes the listing form: `{"nftables": [metainfo, table, its chains, its sets
//! and maps, its rules, next table ...]}`, values typed as in the text listing (numbers for
//! ports, protocols, marks and integers; strings for addresses, names and symbols).
//! [`from_json`] reads that form and the command form (`{"add": {"rule": ...}}`,
//! `{"flush": {"ruleset": null}}`); the rules go through the same checks and rewrites as text
//! ([`super::parse`]), so `print(from_json(j))` is the listing nft prints for `j`. Anything
//! outside the model is refused by name with the JSON path of the object (`nftables[3].rule.
//! expr[1]`), never dropped.
//!
//! Why not the `nftables` crate's schema types (the maintained Rust model of libnftables-json):
//! its `SetType` has seven datatypes and no `verdict`, so a verdict map (`"map": "verdict"`,
//! kube-proxy's service dispatch) or a `typeof` set does not deserialize, and its set timeouts
//! and numbers are 32-bit. We read and write the documented schema with `serde_json` instead.

use serde_json::{Map, Value as J, json};

use super::parse::{
    check_refs, eliminate_dependencies, expr_types, finish_rule, merge_intervals, meta_key,
    payload_field, set_key_types, sort_elements,
};
use super::print::{Dialect, expr_string};
use super::types::DataType;
use super::{
    BaseChain, BitOp, Chain, ChainType, CtKey, Elem, ErrorKind, Expr, FIB_FLAGS, Family, FibResult,
    Hook, Limit, Log, MapData, Match, MetaKey, Nat, NatAddr, NatKind, NftError, NftErrors, Op,
    Payload, Policy, Pos, Proto, Reject, Rule, Ruleset, SET_FLAGS, Set, SetElem, SetRhs, SetType,
    SetUpdate, SetUpdateOp, SetValue, Stmt, Table, Value, Verdict, fib_flag_names,
};

// === model -> JSON ===

/// The `nft -j list ruleset` form of `rs`.
pub fn to_json(rs: &Ruleset) -> J {
    to_json_as(rs, Dialect::V1_1)
}

/// As [`to_json`] for the given nft release: v1.0's JSON reader knows no `dynamic` set flag
/// (its listing omits it too), so that flag is left out.
pub fn to_json_as(rs: &Ruleset, d: Dialect) -> J {
    let mut out = vec![json!({"metainfo": {"json_schema_version": 1}})];
    for t in &rs.tables {
        let fam = t.family.name();
        let mut to = Map::new();
        to.insert("family".into(), fam.into());
        to.insert("name".into(), t.name.clone().into());
        if let Some(c) = &t.comment {
            to.insert("comment".into(), c.clone().into());
        }
        out.push(json!({ "table": to }));
        for c in &t.chains {
            let mut o = Map::new();
            o.insert("family".into(), fam.into());
            o.insert("table".into(), t.name.clone().into());
            o.insert("name".into(), c.name.clone().into());
            if let Some(b) = &c.base {
                o.insert("type".into(), chain_type(b.kind).into());
                o.insert("hook".into(), hook_name(b.hook).into());
                o.insert("prio".into(), b.priority.into());
                o.insert("policy".into(), policy_name(b.policy).into());
            }
            if let Some(cm) = &c.comment {
                o.insert("comment".into(), cm.clone().into());
            }
            out.push(json!({"chain": o}));
        }
        for s in &t.sets {
            out.push(set_json(t, s, d));
        }
        for c in &t.chains {
            for r in &c.rules {
                let mut o = Map::new();
                o.insert("family".into(), fam.into());
                o.insert("table".into(), t.name.clone().into());
                o.insert("chain".into(), c.name.clone().into());
                let mut stmts = r.stmts.clone();
                eliminate_dependencies(t.family, d, &mut stmts);
                o.insert(
                    "expr".into(),
                    J::Array(stmts.iter().map(stmt_json).collect()),
                );
                if let Some(cm) = &r.comment {
                    o.insert("comment".into(), cm.clone().into());
                }
                out.push(json!({"rule": o}));
            }
        }
    }
    json!({ "nftables": out })
}

fn chain_type(k: ChainType) -> &'static str {
    match k {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
        ChainType::Route => "route",
    }
}

fn hook_name(h: Hook) -> &'static str {
    match h {
        Hook::Prerouting => "prerouting",
        Hook::Input => "input",
        Hook::Forward => "forward",
        Hook::Output => "output",
        Hook::Postrouting => "postrouting",
    }
}

fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Accept => "accept",
        Policy::Drop => "drop",
    }
}

fn set_type_json(t: &SetType) -> J {
    match t {
        SetType::Types(v) if v.len() == 1 => v[0].name().into(),
        SetType::Types(v) => J::Array(v.iter().map(|t| t.name().into()).collect()),
        SetType::Typeof(e) => json!({"typeof": expr_json(e)}),
        SetType::Verdict => "verdict".into(),
    }
}

fn set_json(t: &Table, s: &Set, d: Dialect) -> J {
    let mut o = Map::new();
    o.insert("family".into(), t.family.name().into());
    o.insert("name".into(), s.name.clone().into());
    o.insert("table".into(), t.name.clone().into());
    o.insert("type".into(), set_type_json(&s.key));
    if let Some(d) = &s.data {
        o.insert("map".into(), set_type_json(d));
    }
    // Bit 8 is `dynamic` (SET_FLAGS).
    let set_flags = if d == Dialect::V1_0 {
        s.flags & !8
    } else {
        s.flags
    };
    if set_flags != 0 {
        let flags: Vec<J> = SET_FLAGS
            .iter()
            .enumerate()
            .filter(|(b, _)| set_flags & (1 << b) != 0)
            .map(|(_, n)| (*n).into())
            .collect();
        o.insert("flags".into(), J::Array(flags));
    }
    if let Some(n) = s.size {
        o.insert("size".into(), n.into());
    }
    if let Some(t) = s.timeout_ms {
        o.insert("timeout".into(), (t / 1000).into());
    }
    if let Some(t) = s.gc_interval_ms {
        o.insert("gc-interval".into(), (t / 1000).into());
    }
    if s.counter {
        o.insert("stmt".into(), json!([{"counter": null}]));
    }
    if let Some(c) = &s.comment {
        o.insert("comment".into(), c.clone().into());
    }
    if !s.elements.is_empty() {
        let key = set_key_types(&s.key);
        let data = s.data.as_ref().map(set_key_types);
        let elems = s
            .elements
            .iter()
            .map(|e| elem_item_json(&key, data.as_deref(), e))
            .collect();
        o.insert("elem".into(), J::Array(elems));
    }
    let kind = if s.is_map { "map" } else { "set" };
    json!({ kind: o })
}

fn elem_item_json(key: &[DataType], data: Option<&[DataType]>, e: &SetElem) -> J {
    let mut k = elem_json(key, &e.key);
    if e.timeout_ms.is_some() || e.expires_ms.is_some() || e.comment.is_some() {
        let mut o = Map::new();
        o.insert("val".into(), k);
        if let Some(t) = e.timeout_ms {
            o.insert("timeout".into(), (t / 1000).into());
        }
        if let Some(t) = e.expires_ms {
            o.insert("expires".into(), (t / 1000).into());
        }
        if let Some(c) = &e.comment {
            o.insert("comment".into(), c.clone().into());
        }
        k = json!({ "elem": o });
    }
    match &e.data {
        None => k,
        Some(MapData::Verdict(v)) => json!([k, verdict_json(v)]),
        Some(MapData::Value(v)) => json!([k, elem_json(data.unwrap_or(&[]), v)]),
    }
}

/// A value as nft's JSON writes it: a number for numeric types, else the listing's string.
fn value_json(t: DataType, v: &Value) -> J {
    match (t, v) {
        (_, Value::Str(s)) => s.clone().into(),
        (DataType::Boolean, Value::Num(n)) => J::Bool(*n != 0),
        (
            DataType::Integer(_)
            | DataType::InetService
            | DataType::InetProto
            | DataType::Mark
            | DataType::Uid
            | DataType::Gid,
            Value::Num(n),
        ) if *n <= u128::from(u64::MAX) => J::from(*n as u64),
        (t, v) if t.is_flags() => {
            let mut s = String::new();
            t.print_value(v, &mut s);
            if s.contains(',') {
                J::Array(s.split(',').map(|x| J::from(x.to_string())).collect())
            } else {
                s.into()
            }
        }
        (t, v) => {
            let mut s = String::new();
            t.print_value(v, &mut s);
            s.into()
        }
    }
}

fn elem_json(types: &[DataType], e: &Elem) -> J {
    let t = types.first().copied().unwrap_or(DataType::Integer(32));
    match e {
        Elem::Value(v) => value_json(t, v),
        Elem::Prefix(a, len) => {
            json!({"prefix": {"addr": value_json(t, &Value::Num(*a)), "len": len}})
        }
        Elem::Range(lo, hi) => json!({"range": [value_json(t, lo), value_json(t, hi)]}),
        Elem::Concat(parts) => J::Array(
            parts
                .iter()
                .enumerate()
                .map(|(k, p)| elem_json(&types[k.min(types.len().saturating_sub(1))..], p))
                .collect(),
        )
        .pipe(|a| json!({ "concat": a })),
    }
}

trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl Pipe for J {}

fn rhs_json(types: &[DataType], r: &SetRhs) -> J {
    match r {
        SetRhs::Value(e) => elem_json(types, e),
        SetRhs::Ref(n) => format!("@{n}").into(),
        SetRhs::Set(elems) => {
            json!({"set": elems.iter().map(|e| elem_item_json(types, None, e)).collect::<Vec<_>>()})
        }
    }
}

fn expr_json(e: &Expr) -> J {
    match e {
        Expr::Payload(p) => {
            json!({"payload": {"protocol": proto_name(p.proto), "field": p.field}})
        }
        Expr::Meta(k) => {
            let name = expr_string(e);
            let key = name.strip_prefix("meta ").unwrap_or(&name).to_string();
            let _ = k;
            json!({"meta": {"key": key}})
        }
        Expr::Ct(_) => {
            let name = expr_string(e);
            json!({"ct": {"key": name.trim_start_matches("ct ")}})
        }
        Expr::Fib { flags, result } => {
            let fl = fib_flag_names(*flags);
            let r = result.name();
            json!({"fib": {"result": r, "flags": fl}})
        }
        Expr::Numgen {
            random,
            modulus,
            offset,
        } => {
            json!({"numgen": {"mode": if *random { "random" } else { "inc" }, "mod": modulus, "offset": offset}})
        }
        Expr::Concat(parts) => json!({"concat": parts.iter().map(expr_json).collect::<Vec<_>>()}),
        Expr::And(inner, m) => match expr_types(inner).first() {
            Some(t) if t.is_flags() => {
                json!({"&": [expr_json(inner), value_json(*t, &Value::Num(*m))]})
            }
            _ => json!({"&": [expr_json(inner), *m as u64]}),
        },
    }
}

fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Ip => "ip",
        Proto::Ip6 => "ip6",
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
        Proto::Th => "th",
        Proto::Icmp => "icmp",
        Proto::Icmpv6 => "icmpv6",
    }
}

fn verdict_json(v: &Verdict) -> J {
    match v {
        Verdict::Accept => json!({"accept": null}),
        Verdict::Drop => json!({"drop": null}),
        Verdict::Continue => json!({"continue": null}),
        Verdict::Return => json!({"return": null}),
        Verdict::Jump(c) => json!({"jump": {"target": c}}),
        Verdict::Goto(c) => json!({"goto": {"target": c}}),
    }
}

fn stmt_json(s: &Stmt) -> J {
    match s {
        Stmt::Match(Match {
            left: Expr::And(inner, m),
            op: Op::Eq,
            right: SetRhs::Value(Elem::Value(Value::Num(0))),
        }) if expr_types(inner).first().is_some_and(|t| t.is_flags()) => {
            let t = expr_types(inner)[0];
            json!({"match": {"op": "!", "left": expr_json(inner), "right": value_json(t, &Value::Num(*m))}})
        }
        Stmt::Match(Match { left, op, right }) => {
            let types = expr_types(left);
            let op = match op {
                Op::Implicit if types.iter().any(|t| t.is_flags()) => "in",
                Op::Implicit | Op::Eq => "==",
                Op::Ne => "!=",
                Op::Lt => "<",
                Op::Gt => ">",
                Op::Le => "<=",
                Op::Ge => ">=",
            };
            json!({"match": {"op": op, "left": expr_json(left), "right": rhs_json(&types, right)}})
        }
        Stmt::Verdict(v) => verdict_json(v),
        Stmt::Counter { packets, bytes } => {
            json!({"counter": {"packets": packets, "bytes": bytes}})
        }
        Stmt::CounterRef(n) => json!({ "counter": n }),
        Stmt::Limit(l) => {
            let mut o = Map::new();
            o.insert("rate".into(), l.rate.into());
            o.insert("per".into(), l.per.into());
            if let Some(u) = l.byte_unit {
                o.insert("rate_unit".into(), u.into());
                if l.burst != 0 {
                    o.insert("burst".into(), l.burst.into());
                    o.insert("burst_unit".into(), "bytes".into());
                }
            } else {
                o.insert("burst".into(), l.burst.into());
            }
            if l.over {
                o.insert("inv".into(), true.into());
            }
            json!({ "limit": o })
        }
        Stmt::Log(l) => {
            let mut o = Map::new();
            if let Some(p) = &l.prefix {
                o.insert("prefix".into(), p.clone().into());
            }
            if let Some(g) = l.group {
                o.insert("group".into(), g.into());
            }
            if let Some(s) = l.snaplen {
                o.insert("snaplen".into(), s.into());
            }
            if let Some(q) = l.queue_threshold {
                o.insert("queue-threshold".into(), q.into());
            }
            if let Some(lv) = l.level {
                o.insert("level".into(), lv.into());
            }
            if o.is_empty() {
                json!({"log": null})
            } else {
                json!({ "log": o })
            }
        }
        Stmt::Reject(r) => {
            let code = |t: DataType, c: u8| {
                let mut s = String::new();
                t.print_value(&Value::Num(u128::from(c)), &mut s);
                s
            };
            match r {
                Reject::Default => json!({"reject": null}),
                Reject::TcpReset => json!({"reject": {"type": "tcp reset"}}),
                Reject::Icmp(c) => {
                    json!({"reject": {"type": "icmp", "expr": code(DataType::IcmpCode, *c)}})
                }
                Reject::Icmpv6(c) => {
                    json!({"reject": {"type": "icmpv6", "expr": code(DataType::Icmpv6Code, *c)}})
                }
                Reject::Icmpx(c) => {
                    json!({"reject": {"type": "icmpx", "expr": code(DataType::IcmpxCode, *c)}})
                }
            }
        }
        Stmt::Notrack => json!({"notrack": null}),
        Stmt::SetUpdate(u) => {
            let mut elem = expr_json(&u.key);
            if let Some(t) = u.timeout_ms {
                elem = json!({"elem": {"val": elem, "timeout": t / 1000}});
            }
            let mut o = Map::new();
            o.insert("op".into(), u.op.name().into());
            o.insert("elem".into(), elem);
            o.insert("set".into(), format!("@{}", u.set).into());
            if !u.stmts.is_empty() {
                o.insert(
                    "stmt".into(),
                    J::Array(u.stmts.iter().map(stmt_json).collect()),
                );
            }
            json!({ "set": o })
        }
        Stmt::Nat(n) => {
            let kind = match n.kind {
                NatKind::Snat => "snat",
                NatKind::Dnat => "dnat",
                NatKind::Masquerade => "masquerade",
                NatKind::Redirect => "redirect",
            };
            let addr_type = if n.family == Some(Family::Ip6) {
                DataType::Ipv6Addr
            } else {
                DataType::Ipv4Addr
            };
            let mut o = Map::new();
            match &n.addr {
                Some(NatAddr::Value(a)) => {
                    o.insert("addr".into(), elem_json(&[addr_type], a));
                }
                Some(NatAddr::Map { key, map }) => {
                    let types = expr_types(key);
                    let data = match map {
                        SetRhs::Set(elems) => {
                            json!({"set": elems.iter().map(|e| elem_item_json(&types, Some(&[addr_type]), e)).collect::<Vec<_>>()})
                        }
                        other => rhs_json(&types, other),
                    };
                    o.insert(
                        "addr".into(),
                        json!({"map": {"key": expr_json(key), "data": data}}),
                    );
                }
                None => {}
            }
            if let Some(f) = n.family {
                o.insert("family".into(), f.name().into());
            }
            if let Some(p) = &n.port {
                o.insert("port".into(), elem_json(&[DataType::InetService], p));
            }
            let flags: Vec<J> = ["random", "fully-random", "persistent"]
                .iter()
                .enumerate()
                .filter(|(b, _)| n.flags & (1 << b) != 0)
                .map(|(_, f)| J::from(*f))
                .collect();
            if !flags.is_empty() {
                o.insert("flags".into(), J::Array(flags));
            }
            if o.is_empty() {
                json!({ kind: null })
            } else {
                json!({ kind: o })
            }
        }
        Stmt::Vmap { key, map } => {
            let types = expr_types(key);
            json!({"vmap": {"key": expr_json(key), "data": rhs_json(&types, map)}})
        }
        Stmt::Set { key, value } => {
            let value = match value {
                SetValue::Value(e) => elem_json(&expr_types(key), e),
                SetValue::From { expr, op: None } => expr_json(expr),
                SetValue::From {
                    expr,
                    op: Some((op, m)),
                } => {
                    json!({ op.symbol(): [expr_json(expr), *m as u64] })
                }
            };
            json!({"mangle": {"key": expr_json(key), "value": value}})
        }
    }
}

mod read;
pub use read::from_json;

#[cfg(test)]
mod tests {
    use super::super::{parse, print};
    use super::*;

    #[test]
    fn text_json_text_round_trip() {
        let text = "table inet fw {\n\tmap svc {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\
                    \t\telements = { 10.0.0.1 . 6 . 80 : goto s1 }\n\t}\n\n\tchain s1 {\n\t}\n\n\
                    \tchain input {\n\t\ttype filter hook input priority filter; policy drop;\n\
                    \t\tct state established,related accept\n\t\tfib saddr . iif oif missing drop\n\
                    \t\tip daddr . meta l4proto . th dport vmap @svc\n\
                    \t\tmeta mark & 0x0000ff00 == 0x00000100 counter packets 3 bytes 180 accept\n\
                    \t\tlimit rate over 1 mbytes/second drop\n\t\treject with icmpx admin-prohibited\n\t}\n}\n";
        let rs = parse("f", text).expect("parses");
        assert_eq!(print(&rs), text);
        let back = from_json("j", &to_json(&rs).to_string()).expect("reads back");
        assert_eq!(print(&back), text);
    }

    #[test]
    fn errors_name_the_json_path_and_unknown_parts_are_refused() {
        let doc = r#"{"nftables": [{"table": {"family": "inet", "name": "t"}},
            {"chain": {"family": "inet", "table": "t", "name": "c"}},
            {"rule": {"family": "inet", "table": "t", "chain": "c", "expr": [
                {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 70000}}]}}]}"#;
        let e = from_json("j", doc).expect_err("bad port").0.remove(0);
        assert_eq!(e.token, "nftables[2].rule.expr[0].match.right");
        assert!(
            matches!(
                e.kind,
                ErrorKind::BadValue {
                    dtype: "inet_service",
                    ..
                }
            ),
            "{e}"
        );
        let doc = doc.replace(
            r#""payload": {"protocol": "tcp", "field": "dport"}"#,
            r#""meta": {"key": "cpu"}"#,
        );
        let e = from_json("j", &doc).expect_err("meta cpu").0.remove(0);
        assert_eq!(e.kind, ErrorKind::Unsupported("`meta cpu`".into()));
        assert_eq!(e.token, "nftables[2].rule.expr[0].match.left.meta");
        let e = from_json(
            "j",
            r#"{"nftables": [{"table": {"family": "bridge", "name": "t"}}]}"#,
        )
        .expect_err("bridge")
        .0
        .remove(0);
        assert_eq!(e.kind, ErrorKind::Family("bridge".into()));
        let e = from_json("j", "{\"nftables\": [\n  {")
            .expect_err("syntax")
            .0
            .remove(0);
        assert_eq!(e.pos.line, 2);
    }
}
