//! The canonical `nft list ruleset` listing of a [`Ruleset`] (nftables v1.1.6 output).
//!
//! Layout as nft prints it: `table FAMILY NAME {`, then sets and maps, then chains, each
//! block indented by one tab and separated by an empty line; rules two tabs deep; a base
//! chain's first line `type T hook H priority P; policy P;` where P is symbolic when within
//! 10 of a standard priority valid at that hook (`filter + 10`, `srcnat` only at postrouting,
//! `dstnat` only at prerouting). Named sets print their elements 2 (IPv4 addresses, states) or 5
//! (numbers, marks, ports) to a line, or one per line (IPv6, concatenations, other types), as
//! nft's `calculate_delim` does; anonymous sets on one line.

use super::parse::{eliminate_dependencies, expr_types};
use super::types::print_time;
use super::{
    BaseChain, ChainType, CtKey, DataType, Elem, Expr, Family, Hook, Limit, Log, MapData, Match,
    MetaKey, Nat, NatAddr, NatKind, Op, Policy, Proto, Reject, Rule, Ruleset, Set, SetElem, SetRhs,
    SetType, SetValue, Stmt, Table, Verdict, fib_flag_names,
};

/// Prints `rs` as `nft list ruleset` lists it (empty for an empty ruleset).
pub fn print(rs: &Ruleset) -> String {
    print_as(rs, Dialect::V1_1)
}

/// The nft release whose listing to write: the listing of the same ruleset differs between
/// releases in a few places.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// nftables v1.0 (Debian 12): protocols by name (`ip protocol tcp`, from /etc/protocols),
    /// ICMP codes by name, `limit` without its default `burst 5 packets`.
    V1_0,
    /// nftables v1.1 (the nft project's test vectors): protocols and ICMP codes as numbers,
    /// `limit ... burst 5 packets` always.
    V1_1,
}

/// Prints `rs` as `nft list ruleset` of the given release lists it.
pub fn print_as(rs: &Ruleset, d: Dialect) -> String {
    let mut out = String::new();
    for t in &rs.tables {
        print_table(t, d, &mut out);
    }
    out
}

/// The datatypes a listing prints an expression's values with.
fn types_of(e: &Expr, d: Dialect) -> Vec<DataType> {
    let mut t = expr_types(e);
    if d == Dialect::V1_1 {
        // v1.1 lists ICMP codes as numbers (`icmp code 1`); v1.0 by name.
        for slot in &mut t {
            if matches!(slot, DataType::IcmpCode | DataType::Icmpv6Code) {
                *slot = DataType::Integer(8);
            }
        }
    }
    t
}

fn print_table(t: &Table, d: Dialect, out: &mut String) {
    out.push_str(&format!("table {} {} {{\n", t.family.name(), t.name));
    if let Some(c) = &t.comment {
        out.push_str(&format!("\tcomment \"{c}\"\n"));
    }
    let mut first = true;
    for s in &t.sets {
        if !first {
            out.push('\n');
        }
        first = false;
        print_set(s, d, out);
    }
    for c in &t.chains {
        if !first {
            out.push('\n');
        }
        first = false;
        out.push_str(&format!("\tchain {} {{\n", c.name));
        if let Some(cm) = &c.comment {
            out.push_str(&format!("\t\tcomment \"{cm}\"\n"));
        }
        if let Some(b) = &c.base {
            print_base(t.family, b, out);
        }
        for r in &c.rules {
            out.push_str("\t\t");
            print_rule(t.family, r, d, out);
            out.push('\n');
        }
        out.push_str("\t}\n");
    }
    out.push_str("}\n");
}

fn print_base(_family: Family, b: &BaseChain, out: &mut String) {
    let kind = match b.kind {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
        ChainType::Route => "route",
    };
    let hook = match b.hook {
        Hook::Prerouting => "prerouting",
        Hook::Input => "input",
        Hook::Forward => "forward",
        Hook::Output => "output",
        Hook::Postrouting => "postrouting",
    };
    let policy = match b.policy {
        Policy::Accept => "accept",
        Policy::Drop => "drop",
    };
    out.push_str(&format!(
        "\t\ttype {kind} hook {hook} priority {}; policy {policy};\n",
        priority_string(b.hook, b.priority)
    ));
}

/// nft's `prio2str` for the ip, ip6 and inet families.
pub(crate) fn priority_string(hook: Hook, prio: i32) -> String {
    const STD: [(&str, i32); 6] = [
        ("raw", -300),
        ("mangle", -150),
        ("dstnat", -100),
        ("filter", 0),
        ("security", 50),
        ("srcnat", 100),
    ];
    for (name, std) in STD {
        if (prio - std).abs() <= 10 {
            let compat = match name {
                "dstnat" => hook == Hook::Prerouting,
                "srcnat" => hook == Hook::Postrouting,
                _ => true,
            };
            if !compat {
                break;
            }
            let off = prio - std;
            return match off {
                0 => name.to_string(),
                o if o > 0 => format!("{name} + {o}"),
                o => format!("{name} - {}", -o),
            };
        }
    }
    prio.to_string()
}

fn type_string(t: &SetType) -> String {
    match t {
        SetType::Types(v) => v.iter().map(|t| t.name()).collect::<Vec<_>>().join(" . "),
        SetType::Typeof(e) => expr_string(e),
        SetType::Verdict => "verdict".to_string(),
    }
}

fn set_types(t: &SetType) -> Vec<DataType> {
    match t {
        SetType::Types(v) => v.clone(),
        SetType::Typeof(e) => expr_types(e),
        SetType::Verdict => Vec::new(),
    }
}

fn print_set(s: &Set, d: Dialect, out: &mut String) {
    out.push_str(&format!(
        "\t{} {} {{\n",
        if s.is_map { "map" } else { "set" },
        s.name
    ));
    let kw = if matches!(s.key, SetType::Typeof(_)) {
        "typeof"
    } else {
        "type"
    };
    out.push_str(&format!("\t\t{kw} {}", type_string(&s.key)));
    if let Some(d) = &s.data {
        out.push_str(" : ");
        out.push_str(&type_string(d));
    }
    out.push('\n');
    if let Some(n) = s.size {
        out.push_str(&format!("\t\tsize {n}\n"));
    }
    // nft's order: constant, dynamic, interval, timeout.
    let flags: Vec<&str> = [
        (1u8, "constant"),
        (8, "dynamic"),
        (2, "interval"),
        (4, "timeout"),
    ]
    .iter()
    .filter(|(b, _)| s.flags & b != 0)
    .map(|(_, n)| *n)
    .collect();
    if !flags.is_empty() {
        out.push_str(&format!("\t\tflags {}\n", flags.join(",")));
    }
    if s.counter {
        out.push_str("\t\tcounter\n");
    }
    if let Some(t) = s.timeout_ms {
        out.push_str("\t\ttimeout ");
        print_time(t, out);
        out.push('\n');
    }
    if let Some(t) = s.gc_interval_ms {
        out.push_str("\t\tgc-interval ");
        print_time(t, out);
        out.push('\n');
    }
    if let Some(c) = &s.comment {
        out.push_str(&format!("\t\tcomment \"{c}\"\n"));
    }
    if !s.elements.is_empty() {
        let key = set_types(&s.key);
        let data = s.data.as_ref().map(set_types);
        let per_line = match key.as_slice() {
            [
                DataType::Integer(_)
                | DataType::InetProto
                | DataType::InetService
                | DataType::TcpFlag
                | DataType::Mark
                | DataType::IfIndex
                | DataType::Uid
                | DataType::Gid
                | DataType::CtDir
                | DataType::NfProto,
            ] => 5,
            [DataType::Ipv4Addr | DataType::CtState | DataType::CtStatus | DataType::PktType] => 2,
            _ => 1,
        };
        out.push_str("\t\telements = { ");
        for (k, e) in s.elements.iter().enumerate() {
            if k > 0 {
                if k % per_line == 0 {
                    out.push_str(",\n\t\t\t     ");
                } else {
                    out.push_str(", ");
                }
            }
            print_set_elem(&key, data.as_deref(), e, d, out);
        }
        out.push_str(" }\n");
    }
    out.push_str("\t}\n");
}

fn print_set_elem(
    key: &[DataType],
    data: Option<&[DataType]>,
    e: &SetElem,
    d: Dialect,
    out: &mut String,
) {
    print_elem(key, &e.key, true, d, out);
    if let Some(t) = e.timeout_ms {
        out.push_str(" timeout ");
        print_time(t, out);
    }
    if let Some(t) = e.expires_ms {
        out.push_str(" expires ");
        print_time(t, out);
    }
    if let Some(c) = &e.comment {
        out.push_str(&format!(" comment \"{c}\""));
    }
    match &e.data {
        Some(MapData::Verdict(v)) => {
            out.push_str(" : ");
            print_verdict(v, out);
        }
        Some(MapData::Value(v)) => {
            out.push_str(" : ");
            print_elem(data.unwrap_or(&[]), v, true, d, out);
        }
        None => {}
    }
}

fn print_elem(types: &[DataType], e: &Elem, in_set: bool, d: Dialect, out: &mut String) {
    let names = d == Dialect::V1_0;
    match (e, types) {
        (Elem::Concat(parts), _) => {
            for (k, p) in parts.iter().enumerate() {
                if k > 0 {
                    out.push_str(" . ");
                }
                let t = types.get(k).copied().unwrap_or(DataType::Integer(32));
                t.print_elem_as(p, in_set, names, out);
            }
        }
        (e, [t, ..]) => t.print_elem_as(e, in_set, names, out),
        (e, []) => DataType::Integer(32).print_elem_as(e, in_set, names, out),
    }
}

fn print_rhs(types: &[DataType], r: &SetRhs, d: Dialect, out: &mut String) {
    match r {
        SetRhs::Value(e) => print_elem(types, e, false, d, out),
        SetRhs::Ref(n) => {
            out.push('@');
            out.push_str(n);
        }
        SetRhs::Set(elems) => {
            out.push_str("{ ");
            for (k, e) in elems.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                print_set_elem(types, None, e, d, out);
            }
            out.push_str(" }");
        }
    }
}

/// The listing of an expression (`ip saddr`, `meta mark`, `fib saddr . iif oif`).
pub(crate) fn expr_string(e: &Expr) -> String {
    match e {
        Expr::Payload(p) => {
            let proto = match p.proto {
                Proto::Ip => "ip",
                Proto::Ip6 => "ip6",
                Proto::Tcp => "tcp",
                Proto::Udp => "udp",
                Proto::Th => "th",
                Proto::Icmp => "icmp",
                Proto::Icmpv6 => "icmpv6",
            };
            format!("{proto} {}", p.field)
        }
        Expr::Meta(k) => match k {
            MetaKey::Iif => "iif".into(),
            MetaKey::Oif => "oif".into(),
            MetaKey::Iifname => "iifname".into(),
            MetaKey::Oifname => "oifname".into(),
            MetaKey::L4proto => "meta l4proto".into(),
            MetaKey::Nfproto => "meta nfproto".into(),
            MetaKey::Mark => "meta mark".into(),
            MetaKey::Pkttype => "meta pkttype".into(),
            MetaKey::Skuid => "meta skuid".into(),
            MetaKey::Skgid => "meta skgid".into(),
            MetaKey::Length => "meta length".into(),
        },
        Expr::Ct(k) => match k {
            CtKey::State => "ct state".into(),
            CtKey::Status => "ct status".into(),
            CtKey::Mark => "ct mark".into(),
            CtKey::Direction => "ct direction".into(),
        },
        Expr::Fib { flags, result } => {
            let fl = fib_flag_names(*flags);
            let r = result.name();
            format!("fib {} {r}", fl.join(" . "))
        }
        Expr::Numgen {
            random,
            modulus,
            offset,
        } => {
            let mut s = format!(
                "numgen {} mod {modulus}",
                if *random { "random" } else { "inc" }
            );
            if *offset != 0 {
                s.push_str(&format!(" offset {offset}"));
            }
            s
        }
        Expr::Concat(parts) => parts
            .iter()
            .map(expr_string)
            .collect::<Vec<_>>()
            .join(" . "),
        Expr::And(inner, m) => format!("{} & 0x{m:08x}", expr_string(inner)),
    }
}

fn print_verdict(v: &Verdict, out: &mut String) {
    match v {
        Verdict::Accept => out.push_str("accept"),
        Verdict::Drop => out.push_str("drop"),
        Verdict::Continue => out.push_str("continue"),
        Verdict::Return => out.push_str("return"),
        Verdict::Jump(c) => {
            out.push_str("jump ");
            out.push_str(c);
        }
        Verdict::Goto(c) => {
            out.push_str("goto ");
            out.push_str(c);
        }
    }
}

/// One rule as `nft list ruleset` lists it in a chain of a table of `family` (nft v1.1),
/// without the indentation and the newline: what a diff or a counter names a rule by.
pub fn rule_text(family: Family, r: &Rule) -> String {
    let mut out = String::new();
    print_rule(family, r, Dialect::V1_1, &mut out);
    out
}

/// Prints one rule (without indentation or newline) as nft lists it in a table of `family`.
pub(crate) fn print_rule(family: Family, r: &Rule, d: Dialect, out: &mut String) {
    let mut stmts = r.stmts.clone();
    eliminate_dependencies(family, d, &mut stmts);
    for (k, s) in stmts.iter().enumerate() {
        if k > 0 {
            out.push(' ');
        }
        print_stmt(family, s, d, out);
    }
    if let Some(c) = &r.comment {
        out.push_str(&format!(" comment \"{c}\""));
    }
}

fn print_stmt(family: Family, s: &Stmt, d: Dialect, out: &mut String) {
    match s {
        Stmt::Match(Match {
            left: Expr::And(inner, mask),
            op,
            right: SetRhs::Value(Elem::Value(v)),
        }) if expr_types(inner).first().is_some_and(|t| t.is_flags()) => {
            // nft's flag comparisons: `VALUE / MASK`, `! MASK`, or `& BIT == VALUE`.
            let t = expr_types(inner)[0];
            let flags = |n: u128| {
                let mut s = String::new();
                t.print_value(&super::Value::Num(n), &mut s);
                s
            };
            let value = flags(match v {
                super::Value::Num(n) => *n,
                super::Value::Str(_) => 0,
            });
            out.push_str(&expr_string(inner));
            let is_zero = matches!(v, super::Value::Num(0));
            let multi = mask.count_ones() > 1;
            let ne = *op == Op::Ne;
            // v1.1 writes the and-form as given: `& (fin | syn) == syn | ack`.
            let piped = |s: String| s.replace(',', " | ");
            match (d, multi, ne, is_zero) {
                (_, _, false, true) => out.push_str(&format!(" ! {}", flags(*mask))),
                (Dialect::V1_0, true, true, _) => {
                    out.push_str(&format!(" != {value} / {}", flags(*mask)))
                }
                (Dialect::V1_0, true, false, _) => {
                    out.push_str(&format!(" {value} / {}", flags(*mask)))
                }
                (Dialect::V1_1, true, ..) => out.push_str(&format!(
                    " & ({}) {} {}",
                    piped(flags(*mask)),
                    if ne { "!=" } else { "==" },
                    piped(value)
                )),
                (_, false, ..) => out.push_str(&format!(
                    " & {} {} {value}",
                    flags(*mask),
                    if ne { "!=" } else { "==" }
                )),
            }
        }
        Stmt::Match(Match { left, op, right }) => {
            out.push_str(&expr_string(left));
            let op = match op {
                Op::Implicit => " ",
                Op::Eq => " == ",
                Op::Ne => " != ",
                Op::Lt => " < ",
                Op::Gt => " > ",
                Op::Le => " <= ",
                Op::Ge => " >= ",
            };
            out.push_str(op);
            print_rhs(&types_of(left, d), right, d, out);
        }
        Stmt::Verdict(v) => print_verdict(v, out),
        Stmt::Counter { packets, bytes } => {
            out.push_str(&format!("counter packets {packets} bytes {bytes}"));
        }
        Stmt::CounterRef(n) => out.push_str(&format!("counter name \"{n}\"")),
        Stmt::Limit(l) => print_limit(l, d, out),
        Stmt::Log(l) => print_log(l, out),
        Stmt::Reject(r) => {
            let (kind, code, t) = match (r, family) {
                (Reject::Default, _)
                | (Reject::Icmp(3), Family::Ip)
                | (Reject::Icmpv6(4), Family::Ip6)
                | (Reject::Icmpx(1), Family::Inet) => {
                    out.push_str("reject");
                    return;
                }
                (Reject::TcpReset, _) => {
                    out.push_str("reject with tcp reset");
                    return;
                }
                (Reject::Icmp(c), _) => ("icmp", *c, DataType::IcmpCode),
                (Reject::Icmpv6(c), _) => ("icmpv6", *c, DataType::Icmpv6Code),
                (Reject::Icmpx(c), _) => ("icmpx", *c, DataType::IcmpxCode),
            };
            out.push_str(&format!("reject with {kind} "));
            t.print_value(&super::Value::Num(u128::from(code)), out);
        }
        Stmt::Notrack => out.push_str("notrack"),
        Stmt::SetUpdate(u) => {
            out.push_str(&format!(
                "{} @{} {{ {}",
                u.op.name(),
                u.set,
                expr_string(&u.key)
            ));
            if let Some(t) = u.timeout_ms {
                out.push_str(" timeout ");
                print_time(t, out);
            }
            for s in &u.stmts {
                out.push(' ');
                print_stmt(family, s, d, out);
            }
            out.push_str(" }");
        }
        Stmt::Nat(n) => print_nat(family, n, d, out),
        Stmt::Vmap { key, map } => {
            out.push_str(&expr_string(key));
            out.push_str(" vmap ");
            match map {
                SetRhs::Set(elems) => {
                    let types = types_of(key, d);
                    out.push_str("{ ");
                    for (k, e) in elems.iter().enumerate() {
                        if k > 0 {
                            out.push_str(", ");
                        }
                        print_set_elem(&types, None, e, d, out);
                    }
                    out.push_str(" }");
                }
                other => print_rhs(&[], other, d, out),
            }
        }
        Stmt::Set { key, value } => {
            out.push_str(&expr_string(key));
            out.push_str(" set ");
            match value {
                SetValue::Value(e) => print_elem(&types_of(key, d), e, false, d, out),
                SetValue::From { expr, op } => {
                    out.push_str(&expr_string(expr));
                    if let Some((op, m)) = op {
                        out.push_str(&format!(" {} 0x{m:08x}", op.symbol()));
                    }
                }
            }
        }
    }
}

fn print_limit(l: &Limit, d: Dialect, out: &mut String) {
    out.push_str("limit rate ");
    if l.over {
        out.push_str("over ");
    }
    match l.byte_unit {
        None => {
            out.push_str(&format!("{}/{}", l.rate, l.per));
            if d == Dialect::V1_1 || l.burst != 5 {
                out.push_str(&format!(" burst {} packets", l.burst));
            }
        }
        Some(unit) => {
            let mult = match unit {
                "kbytes" => 1024,
                "mbytes" => 1024 * 1024,
                _ => 1,
            };
            out.push_str(&bytes_string(l.rate.saturating_mul(mult)));
            out.push('/');
            out.push_str(l.per);
            if l.burst != 0 {
                out.push_str(&format!(" burst {}", bytes_string(u64::from(l.burst))));
            }
        }
    }
}

/// Bytes in the largest unit that divides them (`1049600` is `1025 kbytes`).
fn bytes_string(b: u64) -> String {
    let (mut n, mut unit) = (b, 0);
    while unit < 2 && n >= 1024 && n % 1024 == 0 {
        n /= 1024;
        unit += 1;
    }
    format!("{n} {}", ["bytes", "kbytes", "mbytes"][unit])
}

fn print_log(l: &Log, out: &mut String) {
    out.push_str("log");
    if let Some(p) = &l.prefix {
        out.push_str(&format!(" prefix \"{p}\""));
    }
    if let Some(g) = l.group {
        out.push_str(&format!(" group {g}"));
    }
    if let Some(s) = l.snaplen {
        out.push_str(&format!(" snaplen {s}"));
    }
    if let Some(q) = l.queue_threshold {
        out.push_str(&format!(" queue-threshold {q}"));
    }
    if let Some(level) = l.level.filter(|l| *l != "warn") {
        out.push_str(&format!(" level {level}"));
    }
    if let Some(f) = &l.flags {
        out.push_str(&format!(" flags {f}"));
    }
}

fn print_nat(family: Family, n: &Nat, d: Dialect, out: &mut String) {
    out.push_str(match n.kind {
        NatKind::Snat => "snat",
        NatKind::Dnat => "dnat",
        NatKind::Masquerade => "masquerade",
        NatKind::Redirect => "redirect",
    });
    let addr_type = match n.family.unwrap_or(family) {
        Family::Ip6 => DataType::Ipv6Addr,
        _ => DataType::Ipv4Addr,
    };
    if let Some(f) = n.family {
        out.push(' ');
        out.push_str(f.name());
    }
    match &n.addr {
        Some(NatAddr::Value(a)) => {
            out.push_str(" to ");
            let bracket = addr_type == DataType::Ipv6Addr && n.port.is_some();
            if bracket {
                out.push('[');
            }
            addr_type.print_elem(a, true, out);
            if bracket {
                out.push(']');
            }
        }
        Some(NatAddr::Map { key, map }) => {
            out.push_str(" to ");
            out.push_str(&expr_string(key));
            out.push_str(" map ");
            match map {
                SetRhs::Set(elems) => {
                    let types = types_of(key, d);
                    out.push_str("{ ");
                    for (k, e) in elems.iter().enumerate() {
                        if k > 0 {
                            out.push_str(", ");
                        }
                        print_set_elem(&types, Some(&[addr_type]), e, d, out);
                    }
                    out.push_str(" }");
                }
                other => print_rhs(&[], other, d, out),
            }
        }
        None => {}
    }
    if let Some(p) = &n.port {
        if n.addr.is_none() {
            out.push_str(" to ");
        }
        out.push(':');
        DataType::InetService.print_elem(p, false, out);
    }
    let flags: Vec<&str> = ["random", "fully-random", "persistent"]
        .iter()
        .enumerate()
        .filter(|(b, _)| n.flags & (1 << b) != 0)
        .map(|(_, f)| *f)
        .collect();
    if !flags.is_empty() {
        out.push(' ');
        out.push_str(&flags.join(","));
    }
}
