//! The canonical iptables-save form: tables, chains, rules with options in iptables-save order
//! (`-s -d -i -o -p -f`, then matches in order, then `-j`/`-g`), and the `iptables -S` form.

use std::fmt::Write as _;

use crate::model::{
    Chain, Counters, Family, IcmpMatch, IpNet, Match, MultiportDir, Neg, OpaqueOption, Policy,
    PortRange, Rule, SetDir, Table, Target,
};

use super::extensions::{
    CT_STATE_NAMES, REJECT_NAMES, TCP_FLAG_NAMES, protocol_name, rate_unit_name,
};

/// How to print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrintOptions {
    /// As `iptables-save -c`: prefix every rule with `[packets:bytes]` (zero when the rule has
    /// none).
    pub counters: bool,
}

/// Prints tables as iptables-save does: `*table`, `:CHAIN POLICY [p:b]` lines (builtin chains
/// in hook order, then user chains sorted by name, as legacy iptables-save), the rules of every
/// chain in that order, `COMMIT`. Tables are printed in the order given.
pub fn print(tables: &[Table], opts: &PrintOptions) -> String {
    let mut out = String::new();
    for t in tables {
        write_table(&mut out, t, opts);
    }
    out
}

fn chain_order(t: &Table) -> Vec<&Chain> {
    let mut builtin: Vec<&Chain> = t.chains.iter().filter(|c| c.policy.is_some()).collect();
    builtin.sort_by_key(|c| c.hook().map(|h| h.index()));
    let mut user: Vec<&Chain> = t.chains.iter().filter(|c| c.policy.is_none()).collect();
    user.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    builtin.extend(user);
    builtin
}

fn policy_name(p: Option<Policy>) -> &'static str {
    match p {
        Some(Policy::Accept) => "ACCEPT",
        Some(Policy::Drop) => "DROP",
        None => "-",
    }
}

/// Prints one table (see [`print`]).
pub fn print_table(t: &Table, opts: &PrintOptions) -> String {
    let mut out = String::new();
    write_table(&mut out, t, opts);
    out
}

fn write_table(out: &mut String, t: &Table, opts: &PrintOptions) {
    let _ = writeln!(out, "*{}", t.kind.name());
    let chains = chain_order(t);
    for c in &chains {
        let _ = writeln!(
            out,
            ":{} {} [{}:{}]",
            c.name,
            policy_name(c.policy),
            c.counters.packets,
            c.counters.bytes
        );
    }
    for c in &chains {
        for r in &c.rules {
            if opts.counters {
                let k = r.counters.unwrap_or_default();
                let _ = write!(out, "[{}:{}] ", k.packets, k.bytes);
            }
            out.push_str("-A ");
            out.push_str(&c.name);
            write_rule_spec(&mut Parts { out, first: false }, r, t.family);
            out.push('\n');
        }
    }
    out.push_str("COMMIT\n");
}

/// Prints a table as `iptables -S` (or `-vS` with `verbose`): `-P` lines for builtin chains,
/// `-N` lines for user chains, then `-A` lines; `verbose` adds `-c PACKETS BYTES` after the
/// policy and after `-A CHAIN`.
pub fn print_s(t: &Table, verbose: bool) -> String {
    let mut out = String::new();
    let chains = chain_order(t);
    for c in &chains {
        match c.policy {
            Some(_) => {
                let _ = write!(out, "-P {} {}", c.name, policy_name(c.policy));
                if verbose {
                    let _ = write!(out, " -c {} {}", c.counters.packets, c.counters.bytes);
                }
                out.push('\n');
            }
            None => {
                let _ = writeln!(out, "-N {}", c.name);
            }
        }
    }
    for c in &chains {
        for r in &c.rules {
            let _ = write!(out, "-A {}", c.name);
            if verbose {
                let k: Counters = r.counters.unwrap_or_default();
                let _ = write!(out, " -c {} {}", k.packets, k.bytes);
            }
            write_rule_spec(
                &mut Parts {
                    out: &mut out,
                    first: false,
                },
                r,
                t.family,
            );
            out.push('\n');
        }
    }
    out
}

/// Quotes as iptables-save's `xtables_save_string`: bare when made only of `[A-Za-z0-9_-]`
/// (and not empty), otherwise in double quotes with `"`, `\` and `'` backslash-escaped.
pub(crate) fn save_string(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return s.to_string();
    }
    quoted(s)
}

fn quoted(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            o.push('\\');
        }
        o.push(c);
    }
    o.push('"');
    o
}

/// Quotes an opaque argument only where the tokenizer needs it (whitespace, `"`, `\`, empty),
/// so real rulesets print byte-identically.
fn opaque_arg(s: &str) -> String {
    if s.is_empty()
        || s.starts_with('-')
        || s.starts_with('!')
        || s.chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\\')
    {
        quoted(s)
    } else {
        s.to_string()
    }
}

fn net(n: &IpNet) -> String {
    match n.prefix_len() {
        Some(l) => format!("{}/{l}", n.addr),
        None => format!("{}/{}", n.addr, n.mask),
    }
}

fn neg<T>(v: &Neg<T>) -> &'static str {
    if v.negated { "! " } else { "" }
}

fn range(r: &PortRange) -> String {
    if r.lo == r.hi {
        r.lo.to_string()
    } else {
        format!("{}:{}", r.lo, r.hi)
    }
}

fn tcp_flags(f: u8) -> String {
    if f & 0x3f == 0 {
        return "NONE".into();
    }
    TCP_FLAG_NAMES
        .iter()
        .filter(|(_, b)| f & b != 0)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",")
}

fn states(bits: u8) -> String {
    CT_STATE_NAMES
        .iter()
        .filter(|(_, b)| bits & b != 0)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",")
}

fn icmp(o: &mut Parts<'_>, m: &IcmpMatch, opt: &str) {
    let mut s = String::new();
    if m.negated {
        s.push_str("! ");
    }
    s.push_str(opt);
    match m.icmp_type {
        None => s.push_str(" any"),
        Some(t) => {
            let _ = write!(s, " {t}");
            if m.code != (0, 255) {
                if m.code.0 == m.code.1 {
                    let _ = write!(s, "/{}", m.code.0);
                } else {
                    let _ = write!(s, "/{}:{}", m.code.0, m.code.1);
                }
            }
        }
    }
    o.push(&s);
}

fn opaque_opts(o: &mut Parts<'_>, opts: &[OpaqueOption]) {
    for op in opts {
        let mut s = String::new();
        if op.negated {
            s.push_str("! ");
        }
        s.push_str(&op.name);
        match op.args.as_slice() {
            // An argument that reads as an option (it came as `--opt=-x`) stays attached.
            [a] if a.starts_with('-') || a == "!" => {
                s.push('=');
                s.push_str(&opaque_arg(a));
            }
            args => {
                for a in args {
                    s.push(' ');
                    s.push_str(&opaque_arg(a));
                }
            }
        }
        o.push(&s);
    }
}

/// Prints a rule's options in iptables-save order without `-A CHAIN` (empty for a rule with no
/// options). This canonical text is the rule's identity elsewhere in Vallum.
pub fn print_rule_spec(r: &Rule, family: Family) -> String {
    let mut out = String::new();
    write_rule_spec(
        &mut Parts {
            out: &mut out,
            first: true,
        },
        r,
        family,
    );
    out
}

/// The options of one rule, written into one string with a space before each but the first.
struct Parts<'a> {
    out: &'a mut String,
    first: bool,
}

impl Parts<'_> {
    fn sep(&mut self) {
        if !self.first {
            self.out.push(' ');
        }
        self.first = false;
    }

    fn push(&mut self, part: &str) {
        self.sep();
        self.out.push_str(part);
    }

    fn push_fmt(&mut self, part: std::fmt::Arguments<'_>) {
        self.sep();
        let _ = self.out.write_fmt(part);
    }
}

fn write_rule_spec(o: &mut Parts<'_>, r: &Rule, family: Family) {
    if let Some(s) = &r.src {
        o.push_fmt(format_args!("{}-s {}", neg(s), net(&s.value)));
    }
    if let Some(d) = &r.dst {
        o.push_fmt(format_args!("{}-d {}", neg(d), net(&d.value)));
    }
    if let Some(i) = &r.in_iface {
        o.push_fmt(format_args!("{}-i {}", neg(i), i.value.name));
    }
    if let Some(i) = &r.out_iface {
        o.push_fmt(format_args!("{}-o {}", neg(i), i.value.name));
    }
    if let Some(p) = &r.protocol {
        let name = protocol_name(p.value)
            .map(str::to_string)
            .unwrap_or_else(|| p.value.to_string());
        o.push_fmt(format_args!("{}-p {name}", neg(p)));
    }
    match r.fragment {
        Some(true) => o.push("-f"),
        Some(false) => o.push("! -f"),
        None => {}
    }
    for m in &r.matches {
        o.push_fmt(format_args!("-m {}", m.extension()));
        print_match(o, m);
    }
    print_target(o, &r.target, family);
}

fn print_match(o: &mut Parts<'_>, m: &Match) {
    match m {
        Match::Tcp(t) => {
            if let Some(p) = &t.sport {
                o.push_fmt(format_args!("{}--sport {}", neg(p), range(&p.value)));
            }
            if let Some(p) = &t.dport {
                o.push_fmt(format_args!("{}--dport {}", neg(p), range(&p.value)));
            }
            if let Some(p) = &t.option {
                o.push_fmt(format_args!("{}--tcp-option {}", neg(p), p.value));
            }
            if let Some(f) = &t.flags {
                o.push_fmt(format_args!(
                    "{}--tcp-flags {} {}",
                    neg(f),
                    tcp_flags(f.value.mask),
                    tcp_flags(f.value.comp)
                ));
            }
        }
        Match::Udp(u) => {
            if let Some(p) = &u.sport {
                o.push_fmt(format_args!("{}--sport {}", neg(p), range(&p.value)));
            }
            if let Some(p) = &u.dport {
                o.push_fmt(format_args!("{}--dport {}", neg(p), range(&p.value)));
            }
        }
        Match::Multiport(m) => {
            let opt = match m.dir {
                MultiportDir::Source => "--sports",
                MultiportDir::Destination => "--dports",
                MultiportDir::Either => "--ports",
            };
            let list = m.ports.iter().map(range).collect::<Vec<_>>().join(",");
            o.push_fmt(format_args!(
                "{}{opt} {list}",
                if m.negated { "! " } else { "" }
            ));
        }
        Match::Icmp(i) => icmp(o, i, "--icmp-type"),
        Match::Icmpv6(i) => icmp(o, i, "--icmpv6-type"),
        Match::Conntrack(c) => {
            if let Some(s) = &c.ctstate {
                o.push_fmt(format_args!("{}--ctstate {}", neg(s), states(s.value)));
            }
            opaque_opts(o, &c.other);
        }
        Match::State(s) => o.push_fmt(format_args!("{}--state {}", neg(s), states(s.value))),
        Match::Iprange(i) => {
            if let Some(r) = &i.src {
                o.push_fmt(format_args!(
                    "{}--src-range {}-{}",
                    neg(r),
                    r.value.lo,
                    r.value.hi
                ));
            }
            if let Some(r) = &i.dst {
                o.push_fmt(format_args!(
                    "{}--dst-range {}-{}",
                    neg(r),
                    r.value.lo,
                    r.value.hi
                ));
            }
        }
        Match::Set(s) => {
            let dirs = s
                .dirs
                .iter()
                .map(|d| match d {
                    SetDir::Src => "src",
                    SetDir::Dst => "dst",
                })
                .collect::<Vec<_>>()
                .join(",");
            o.push_fmt(format_args!(
                "{}--match-set {} {dirs}",
                if s.negated { "! " } else { "" },
                s.name
            ));
            opaque_opts(o, &s.other);
        }
        Match::Comment(c) => o.push_fmt(format_args!("--comment {}", save_string(c))),
        Match::Mark(m) => {
            let v = &m.value;
            if v.mask == u32::MAX {
                o.push_fmt(format_args!("{}--mark {:#x}", neg(m), v.value));
            } else {
                o.push_fmt(format_args!(
                    "{}--mark {:#x}/{:#x}",
                    neg(m),
                    v.value,
                    v.mask
                ));
            }
        }
        Match::Length(l) => o.push_fmt(format_args!("{}--length {}", neg(l), range(&l.value))),
        Match::Limit(l) => {
            o.push_fmt(format_args!(
                "--limit {}/{}",
                l.rate,
                rate_unit_name(l.unit)
            ));
            if l.burst != 5 {
                o.push_fmt(format_args!("--limit-burst {}", l.burst));
            }
        }
        Match::Mac(m) => {
            let v = &m.value;
            o.push_fmt(format_args!(
                "{}--mac-source {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                neg(m),
                v[0],
                v[1],
                v[2],
                v[3],
                v[4],
                v[5]
            ));
        }
        Match::Opaque(op) => opaque_opts(o, &op.options),
    }
}

fn print_target(o: &mut Parts<'_>, t: &Target, family: Family) {
    match t {
        Target::None => {}
        Target::Accept => o.push("-j ACCEPT"),
        Target::Drop => o.push("-j DROP"),
        Target::Return => o.push("-j RETURN"),
        Target::Reject(w) => {
            let name = REJECT_NAMES
                .iter()
                .find(|e| e.2 == *w)
                .and_then(|(n4, n6, _)| match family {
                    Family::Ipv4 => n4.first(),
                    Family::Ipv6 => n6.first(),
                })
                .copied()
                .unwrap_or("icmp-port-unreachable");
            o.push_fmt(format_args!("-j REJECT --reject-with {name}"));
        }
        Target::Jump(c) => o.push_fmt(format_args!("-j {c}")),
        Target::Goto(c) => o.push_fmt(format_args!("-g {c}")),
        Target::Log(l) => {
            o.push("-j LOG");
            if let Some(p) = &l.prefix {
                o.push_fmt(format_args!("--log-prefix {}", save_string(p)));
            }
            if let Some(lv) = l.level {
                o.push_fmt(format_args!("--log-level {lv}"));
            }
            for f in &l.flags {
                o.push(f);
            }
        }
        Target::Notrack => o.push("-j NOTRACK"),
        Target::Ct(c) => {
            o.push("-j CT");
            if c.notrack {
                o.push("--notrack");
            }
            opaque_opts(o, &c.other);
        }
        Target::Opaque(op) => {
            o.push_fmt(format_args!("-j {}", op.name));
            opaque_opts(o, &op.options);
        }
    }
}
