//! The canonical iptables-save form: tables, chains, rules with options in iptables-save order
//! (`-s -d -i -o -p -f`, then matches in order, then `-j`/`-g`), and the `iptables -S` form.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use crate::model::{
    AddrTypeLimit, Chain, ConnmarkTarget, Counters, Family, IcmpMatch, IdRange, IpNet, Match,
    MultiportDir, Neg, OpaqueOption, Policy, PortRange, Rule, SetDir, Table, Target, TtlOp,
};

use super::header_matches::IPV6_HEADER_NAMES;

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
    let mut out = String::with_capacity(tables.iter().map(text_estimate).sum());
    for t in tables {
        write_table(&mut out, t, opts);
    }
    out
}

/// About how many bytes a table prints as (rules of plain 5-tuple rulesets take about 60), so
/// that the output is allocated once in the common case.
fn text_estimate(t: &Table) -> usize {
    t.chains
        .iter()
        .map(|c| 48 + 64 * c.rules.len())
        .sum::<usize>()
        + 32
}

/// The chains of `t` in the order [`print`] writes them.
pub(crate) fn chain_order(t: &Table) -> Vec<&Chain> {
    chain_order_index(t)
        .into_iter()
        .map(|i| &t.chains[i])
        .collect()
}

/// The positions in `t.chains` of the chains in the order [`print`] writes them: builtin
/// chains by hook, then user chains by name.
pub(crate) fn chain_order_index(t: &Table) -> Vec<usize> {
    let chains = &t.chains;
    let mut builtin: Vec<usize> = (0..chains.len())
        .filter(|&i| chains[i].policy.is_some())
        .collect();
    builtin.sort_by_key(|&i| chains[i].hook().map(|h| h.index()));
    let mut user: Vec<usize> = (0..chains.len())
        .filter(|&i| chains[i].policy.is_none())
        .collect();
    user.sort_by(|&a, &b| chains[a].name.as_bytes().cmp(chains[b].name.as_bytes()));
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

/// Prints one table (see [`print()`]).
pub fn print_table(t: &Table, opts: &PrintOptions) -> String {
    let mut out = String::with_capacity(text_estimate(t));
    write_table(&mut out, t, opts);
    out
}

/// `[packets:bytes]`.
fn write_counters(out: &mut String, k: &Counters) {
    out.push('[');
    write_uint(out, k.packets);
    out.push(':');
    write_uint(out, k.bytes);
    out.push(']');
}

/// The `*table` line and the `:CHAIN POLICY [p:b]` lines of [`print`].
fn write_table_head(out: &mut String, t: &Table, _opts: &PrintOptions) {
    out.push('*');
    out.push_str(t.kind.name());
    out.push('\n');
    for c in chain_order(t) {
        out.push(':');
        out.push_str(&c.name);
        out.push(' ');
        out.push_str(policy_name(c.policy));
        out.push(' ');
        write_counters(out, &c.counters);
        out.push('\n');
    }
}

fn write_table(out: &mut String, t: &Table, opts: &PrintOptions) {
    write_table_head(out, t, opts);
    let chains = chain_order(t);
    for c in &chains {
        for r in &c.rules {
            write_rule_line(out, &c.name, r, t.family, opts);
        }
    }
    out.push_str("COMMIT\n");
}

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

/// The line changes that turn [`print()`] of `old` (default options) into [`print()`] of `new`,
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

/// Where [`chain_order_index`] puts a chain: builtin chains by hook, then user chains by name.
fn print_key(c: &Chain) -> (bool, Option<usize>, &[u8]) {
    match c.policy {
        Some(_) => (false, c.hook().map(|h| h.index()), &[]),
        None => (true, None, c.name.as_bytes()),
    }
}

/// One rule's line of [`print`]: `[p:b] ` with `opts.counters`, `-A CHAIN`, the rule, `\n`.
pub(crate) fn write_rule_line(
    out: &mut String,
    chain: &str,
    r: &Rule,
    family: Family,
    opts: &PrintOptions,
) {
    if opts.counters {
        write_counters(out, &r.counters.unwrap_or_default());
        out.push(' ');
    }
    out.push_str("-A ");
    out.push_str(chain);
    write_rule_spec(&mut Parts { out, first: false }, r, family);
    out.push('\n');
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
fn write_save_string(out: &mut String, s: &str) {
    if !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    {
        out.push_str(s);
    } else {
        write_quoted(out, s);
    }
}

fn write_quoted(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// Writes an opaque argument, quoted only where the tokenizer needs it (whitespace, `"`, `\`,
/// empty), so real rulesets print byte-identically.
fn write_opaque_arg(out: &mut String, s: &str) {
    if s.is_empty()
        || s.starts_with('-')
        || s.starts_with('!')
        || s.chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\\')
    {
        write_quoted(out, s);
    } else {
        out.push_str(s);
    }
}

// === numbers and addresses, written without core::fmt ===

/// Writes an unsigned integer in decimal.
fn write_uint(out: &mut String, v: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(v));
}

/// Writes an IPv4 address in dotted decimal, as its `Display` does (no leading zeros).
fn write_ipv4(out: &mut String, a: Ipv4Addr) {
    let mut buf = [0u8; 15];
    let mut n = 0;
    for (i, o) in a.octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            buf[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            buf[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        buf[n] = b'0' + o % 10;
        n += 1;
    }
    // Only ASCII digits and dots were written.
    if let Ok(s) = std::str::from_utf8(&buf[..n]) {
        out.push_str(s);
    }
}

fn write_addr(out: &mut String, a: &IpAddr) {
    match a {
        IpAddr::V4(a) => write_ipv4(out, *a),
        IpAddr::V6(a) => {
            let _ = write!(out, "{a}");
        }
    }
}

/// `ADDR/LEN`, or `ADDR/MASK` when the mask is not contiguous.
fn write_net(out: &mut String, n: &IpNet) {
    write_addr(out, &n.addr);
    out.push('/');
    match n.prefix_len() {
        Some(l) => write_uint(out, l),
        None => write_addr(out, &n.mask),
    }
}

/// `LO` or `LO:HI`.
fn write_range(out: &mut String, r: &PortRange) {
    write_uint(out, r.lo);
    if r.lo != r.hi {
        out.push(':');
        write_uint(out, r.hi);
    }
}

/// libxt_sctp's `print_chunks` after the mode: `NONE`, `ALL`, or each listed type in number
/// order with the flags stored under that number.
fn write_sctp_chunks(out: &mut String, c: &crate::model::SctpChunks) {
    use crate::model::SCTP_CHUNK_NAMES;
    if c.map == [0; 8] {
        out.push_str("NONE");
        return;
    }
    if c.map == [u32::MAX; 8] {
        out.push_str("ALL");
        return;
    }
    let mut first = true;
    for t in 0..=255u8 {
        if !c.has(t) {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        // print_chunk prints the name of every table row with this number (one, or none
        // for a type that has no name).
        for (name, _, _) in SCTP_CHUNK_NAMES.iter().filter(|(_, n, _)| *n == t) {
            out.push_str(name);
        }
        for f in c.flags.iter().filter(|f| f.chunk_type == t) {
            if f.mask != 0 {
                out.push(':');
            }
            // print_chunk_flags indexes the name table by the type number.
            let letters = SCTP_CHUNK_NAMES
                .get(usize::from(t))
                .map_or("--------", |(_, _, l)| l)
                .as_bytes();
            for bit in (0..8).rev() {
                if f.mask & (1 << bit) != 0 {
                    let ch = char::from(letters[7 - bit]);
                    out.push(if f.flag & (1 << bit) != 0 {
                        ch
                    } else {
                        ch.to_ascii_lowercase()
                    });
                }
            }
        }
    }
}

/// The names of the set bits, comma-separated, in table order.
fn write_names<T: Copy + std::ops::BitAnd<Output = T> + PartialEq + Default>(
    out: &mut String,
    names: &[(&str, T)],
    bits: T,
) {
    let mut first = true;
    for (n, b) in names {
        if bits & *b != T::default() {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(n);
        }
    }
}

fn write_tcp_flags(out: &mut String, f: u8) {
    if f & 0x3f == 0 {
        out.push_str("NONE");
    } else {
        write_names(out, &TCP_FLAG_NAMES, f);
    }
}

fn icmp(o: &mut Parts<'_>, m: &IcmpMatch, opt: &str) {
    o.opt(m.negated, opt);
    let out = &mut *o.out;
    match m.icmp_type {
        None => out.push_str(" any"),
        Some(t) => {
            out.push(' ');
            write_uint(out, t);
            if m.code != (0, 255) {
                out.push('/');
                write_uint(out, m.code.0);
                if m.code.0 != m.code.1 {
                    out.push(':');
                    write_uint(out, m.code.1);
                }
            }
        }
    }
}

/// An `--ahspi` / `--fragid` / `--rt-segsleft` range: nothing for the whole range, `N` or
/// `LO:HI` otherwise (a negated whole range keeps its `!`: see `header_matches`).
fn id_range(o: &mut Parts<'_>, opt: &str, r: &Neg<IdRange>) {
    if r.value == IdRange::ALL && !r.negated {
        return;
    }
    o.opt(r.negated, opt);
    write_uint(o.out, r.value.lo);
    if r.value.lo != r.value.hi {
        o.out.push(':');
        write_uint(o.out, r.value.hi);
    }
}

/// [`opaque_opts`], with the options iptables-save prints in double quotes
/// ([`super::opaque::QUOTED`]: `-m cgroup --path "/"`) always quoted.
fn opaque_opts_of(o: &mut Parts<'_>, ext: &str, opts: &[OpaqueOption]) {
    if !super::opaque::QUOTED.iter().any(|(e, _)| *e == ext) {
        return opaque_opts(o, opts);
    }
    for op in opts {
        let quoted = super::opaque::QUOTED.contains(&(ext, op.name.as_str()));
        match op.args.as_slice() {
            [a] if quoted => {
                o.opt(op.negated, &op.name);
                o.out.push(' ');
                write_quoted(o.out, a);
            }
            _ => opaque_opts(o, std::slice::from_ref(op)),
        }
    }
}

fn opaque_opts(o: &mut Parts<'_>, opts: &[OpaqueOption]) {
    for op in opts {
        o.opt(op.negated, &op.name);
        let out = &mut *o.out;
        match op.args.as_slice() {
            // An argument that reads as an option (it came as `--opt=-x`) stays attached.
            [a] if a.starts_with('-') || a == "!" => {
                out.push('=');
                write_opaque_arg(out, a);
            }
            args => {
                for a in args {
                    out.push(' ');
                    write_opaque_arg(out, a);
                }
            }
        }
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

/// One match as iptables-save prints it in a rule: `-m NAME` and its options
/// (`-m conntrack --ctstate DNAT`).
pub fn print_match_spec(m: &Match) -> String {
    let mut out = String::new();
    let mut o = Parts {
        out: &mut out,
        first: true,
    };
    o.push("-m ");
    o.out.push_str(m.extension());
    print_match(&mut o, m);
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

    /// Starts an option: the separator, `! ` when negated, then `text`; the caller appends
    /// the option's arguments to `out`.
    fn opt(&mut self, negated: bool, text: &str) {
        self.sep();
        if negated {
            self.out.push_str("! ");
        }
        self.out.push_str(text);
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
        o.opt(s.negated, "-s ");
        write_net(o.out, &s.value);
    }
    if let Some(d) = &r.dst {
        o.opt(d.negated, "-d ");
        write_net(o.out, &d.value);
    }
    if let Some(i) = &r.in_iface {
        o.opt(i.negated, "-i ");
        o.out.push_str(&i.value.name);
    }
    if let Some(i) = &r.out_iface {
        o.opt(i.negated, "-o ");
        o.out.push_str(&i.value.name);
    }
    if let Some(p) = &r.protocol {
        o.opt(p.negated, "-p ");
        match protocol_name(p.value) {
            Some(name) => o.out.push_str(name),
            None => write_uint(o.out, p.value),
        }
    }
    match r.fragment {
        Some(true) => o.push("-f"),
        Some(false) => o.push("! -f"),
        None => {}
    }
    for m in &r.matches {
        o.push("-m ");
        o.out.push_str(m.extension());
        print_match(o, m);
    }
    print_target(o, &r.target, family);
}

fn print_match(o: &mut Parts<'_>, m: &Match) {
    let ports = |o: &mut Parts<'_>, name: &str, p: &Option<Neg<PortRange>>| {
        if let Some(p) = p {
            o.opt(p.negated, name);
            write_range(o.out, &p.value);
        }
    };
    match m {
        Match::Tcp(t) => {
            ports(o, "--sport ", &t.sport);
            ports(o, "--dport ", &t.dport);
            if let Some(p) = &t.option {
                o.opt(p.negated, "--tcp-option ");
                write_uint(o.out, p.value);
            }
            if let Some(f) = &t.flags {
                o.opt(f.negated, "--tcp-flags ");
                write_tcp_flags(o.out, f.value.mask);
                o.out.push(' ');
                write_tcp_flags(o.out, f.value.comp);
            }
        }
        Match::Udp(u) => {
            ports(o, "--sport ", &u.sport);
            ports(o, "--dport ", &u.dport);
        }
        Match::Multiport(m) => {
            let opt = match m.dir {
                MultiportDir::Source => "--sports ",
                MultiportDir::Destination => "--dports ",
                MultiportDir::Either => "--ports ",
            };
            o.opt(m.negated, opt);
            for (i, r) in m.ports.iter().enumerate() {
                if i > 0 {
                    o.out.push(',');
                }
                write_range(o.out, r);
            }
        }
        Match::Icmp(i) => icmp(o, i, "--icmp-type"),
        Match::Icmpv6(i) => icmp(o, i, "--icmpv6-type"),
        Match::Conntrack(c) => {
            if let Some(s) = &c.ctstate {
                o.opt(s.negated, "--ctstate ");
                write_names(o.out, &CT_STATE_NAMES, s.value);
            }
            opaque_opts(o, &c.other);
        }
        Match::State(s) => {
            o.opt(s.negated, "--state ");
            write_names(o.out, &CT_STATE_NAMES, s.value);
        }
        Match::Iprange(i) => {
            for (r, opt) in [(&i.src, "--src-range "), (&i.dst, "--dst-range ")] {
                if let Some(r) = r {
                    o.opt(r.negated, opt);
                    write_addr(o.out, &r.value.lo);
                    o.out.push('-');
                    write_addr(o.out, &r.value.hi);
                }
            }
        }
        Match::Set(s) => {
            o.opt(s.negated, "--match-set ");
            o.out.push_str(&s.name);
            o.out.push(' ');
            for (i, d) in s.dirs.iter().enumerate() {
                if i > 0 {
                    o.out.push(',');
                }
                o.out.push_str(match d {
                    SetDir::Src => "src",
                    SetDir::Dst => "dst",
                });
            }
            opaque_opts(o, &s.other);
        }
        Match::Comment(c) => {
            o.push("--comment ");
            write_save_string(o.out, c);
        }
        Match::Mark(m) | Match::Connmark(m) => {
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
        Match::Length(l) => {
            o.opt(l.negated, "--length ");
            write_range(o.out, &l.value);
        }
        Match::Limit(l) => {
            o.push("--limit ");
            write_uint(o.out, l.rate);
            o.out.push('/');
            o.out.push_str(rate_unit_name(l.unit));
            if l.burst != 5 {
                o.push("--limit-burst ");
                write_uint(o.out, l.burst);
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
        Match::Opaque(op) => opaque_opts_of(o, &op.name, &op.options),
        Match::Physdev(d) => {
            // physdev_save's order.
            if let Some(neg) = d.is_in {
                o.opt(neg, "--physdev-is-in");
            }
            if let Some(i) = &d.physdev_in {
                o.opt(i.negated, "--physdev-in ");
                o.out.push_str(&i.value.name);
            }
            if let Some(neg) = d.is_out {
                o.opt(neg, "--physdev-is-out");
            }
            if let Some(i) = &d.physdev_out {
                o.opt(i.negated, "--physdev-out ");
                o.out.push_str(&i.value.name);
            }
            if let Some(neg) = d.is_bridged {
                o.opt(neg, "--physdev-is-bridged");
            }
        }
        Match::Owner(w) => {
            // owner_mt_save's order.
            if let Some(neg) = w.socket {
                o.opt(neg, "--socket-exists");
            }
            for (v, name) in [(w.uid, "--uid-owner "), (w.gid, "--gid-owner ")] {
                if let Some(v) = v {
                    o.opt(v.negated, name);
                    write_uint(o.out, v.value.lo);
                    if v.value.hi != v.value.lo {
                        o.out.push('-');
                        write_uint(o.out, v.value.hi);
                    }
                }
            }
            if w.suppl_groups {
                o.push("--suppl-groups");
            }
        }
        Match::Ttl(t) | Match::Hl(t) => {
            let ext = m.extension();
            let (neg, k) = match t.op {
                TtlOp::Eq => (false, "eq"),
                TtlOp::Ne => (true, "eq"),
                TtlOp::Lt => (false, "lt"),
                TtlOp::Gt => (false, "gt"),
            };
            o.opt(neg, "");
            o.out.push_str("--");
            o.out.push_str(ext);
            o.out.push('-');
            o.out.push_str(k);
            o.out.push(' ');
            write_uint(o.out, t.value);
        }
        Match::Tos(t) => {
            o.opt(t.negated, "--tos ");
            let _ = write!(o.out, "0x{:02x}/0x{:02x}", t.value.value, t.value.mask);
        }
        Match::Dscp(d) => {
            o.opt(d.negated, "--dscp ");
            let _ = write!(o.out, "0x{:02x}", d.value);
        }
        Match::Ecn(e) => {
            if let Some(neg) = e.ece {
                o.opt(neg, "--ecn-tcp-ece");
            }
            if let Some(neg) = e.cwr {
                o.opt(neg, "--ecn-tcp-cwr");
            }
            if let Some(ect) = e.ect {
                o.opt(ect.negated, "--ecn-ip-ect ");
                write_uint(o.out, ect.value);
            }
        }
        Match::Ah(spi) => id_range(o, "--ahspi ", spi),
        Match::Frag(f) => {
            id_range(o, "--fragid ", &f.id);
            if let Some(l) = f.len {
                o.opt(l.negated, "--fraglen ");
                write_uint(o.out, l.value);
            }
            for (on, name) in [
                (f.res, "--fragres"),
                (f.first, "--fragfirst"),
                (f.more, "--fragmore"),
                (f.last, "--fraglast"),
            ] {
                if on {
                    o.push(name);
                }
            }
        }
        Match::Rt(r) => {
            if let Some(t) = r.rt_type {
                o.opt(t.negated, "--rt-type ");
                write_uint(o.out, t.value);
            }
            id_range(o, "--rt-segsleft ", &r.segsleft);
            if let Some(l) = r.len {
                o.opt(l.negated, "--rt-len ");
                write_uint(o.out, l.value);
            }
            opaque_opts(o, &r.other);
        }
        Match::AddrType(a) => {
            for (v, opt) in [(a.src, "--src-type "), (a.dst, "--dst-type ")] {
                if let Some(v) = v {
                    o.opt(v.negated, opt);
                    o.out.push_str(&crate::model::addr_type::names(v.value));
                }
            }
            match a.limit {
                AddrTypeLimit::None => {}
                AddrTypeLimit::In => o.push("--limit-iface-in"),
                AddrTypeLimit::Out => o.push("--limit-iface-out"),
            }
        }
        Match::Rpfilter(r) => {
            // As libxt_rpfilter's rpfilter_print_prefix with "--".
            for (name, bit) in super::rpfilter::RPFILTER_OPTIONS {
                if r.flags & bit != 0 {
                    o.push(name);
                }
            }
        }
        Match::PktType(t) => {
            // As libxt_pkttype's pkttype_save.
            o.opt(t.negated, "--pkt-type ");
            o.out.push_str(t.value.name());
        }
        Match::Recent(r) => {
            // As libxt_recent's recent_save.
            o.opt(r.negated, r.op.option());
            if r.seconds != 0 {
                o.push("--seconds ");
                write_uint(o.out, r.seconds);
            }
            if r.reap {
                o.push("--reap");
            }
            if r.hitcount != 0 {
                o.push("--hitcount ");
                write_uint(o.out, r.hitcount);
            }
            if r.rttl {
                o.push("--rttl");
            }
            o.push("--name ");
            o.out.push_str(&r.name);
            o.push("--mask ");
            write_addr(o.out, &r.mask);
            o.push(if r.dest { "--rdest" } else { "--rsource" });
        }
        Match::Hashlimit(h) => {
            // As libxt_hashlimit's hashlimit_mt_print, revision 3.
            o.push(if h.above {
                "--hashlimit-above "
            } else {
                "--hashlimit-upto "
            });
            let (n, unit, quantum) = super::hashlimit::rate_parts(h.avg);
            write_uint(o.out, n);
            o.out.push('/');
            o.out.push_str(unit);
            // A packet rate's burst is always printed, the default 5 too.
            o.push("--hashlimit-burst ");
            write_uint(o.out, h.burst);
            if h.mode != 0 {
                o.push("--hashlimit-mode ");
                let names = crate::model::hashlimit_mode::NAMES.iter();
                for (i, (name, _)) in names.filter(|(_, b)| h.mode & b != 0).enumerate() {
                    if i > 0 {
                        o.out.push(',');
                    }
                    o.out.push_str(name);
                }
            }
            o.push("--hashlimit-name ");
            o.out.push_str(&h.name);
            for (v, default, opt) in [
                (h.size, 0, "--hashlimit-htable-size "),
                (h.max, 0, "--hashlimit-htable-max "),
                (h.gc_interval, 1000, "--hashlimit-htable-gcinterval "),
            ] {
                if v != default {
                    o.push(opt);
                    write_uint(o.out, v);
                }
            }
            if u64::from(h.expire) != quantum {
                o.push("--hashlimit-htable-expire ");
                write_uint(o.out, h.expire);
            }
            for (v, opt) in [
                (h.srcmask, "--hashlimit-srcmask "),
                (h.dstmask, "--hashlimit-dstmask "),
            ] {
                if let Some(len) = v {
                    o.push(opt);
                    write_uint(o.out, len);
                }
            }
        }
        Match::String(s) => {
            // As libxt_string's string_save.
            let hex = s.prints_as_hex();
            o.opt(
                s.negated,
                if hex {
                    "--hex-string \"|"
                } else {
                    "--string \""
                },
            );
            for &b in &s.pattern {
                if hex {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    o.out.push(char::from(HEX[usize::from(b >> 4)]));
                    o.out.push(char::from(HEX[usize::from(b & 15)]));
                } else {
                    if b == b'"' || b == b'\\' {
                        o.out.push('\\');
                    }
                    o.out.push(char::from(b));
                }
            }
            o.out.push_str(if hex { "|\"" } else { "\"" });
            o.push("--algo ");
            o.out.push_str(s.algo.name());
            if s.from != 0 {
                o.push("--from ");
                write_uint(o.out, s.from);
            }
            if s.to != u16::MAX {
                o.push("--to ");
                write_uint(o.out, s.to);
            }
            if s.icase {
                o.push("--icase");
            }
        }
        Match::U32(u) => {
            // As libxt_u32's u32_save: every number in hex, the whole in double quotes.
            o.opt(u.negated, "--u32 \"");
            for (k, t) in u.tests.iter().enumerate() {
                if k > 0 {
                    o.out.push_str("&&");
                }
                let _ = write!(o.out, "{:#x}", t.start);
                for (op, n) in &t.ops {
                    let _ = write!(o.out, "{}{n:#x}", op.text());
                }
                o.out.push('=');
                for (k, &(a, b)) in t.ranges.iter().enumerate() {
                    if k > 0 {
                        o.out.push(',');
                    }
                    let _ = write!(o.out, "{a:#x}");
                    if a != b {
                        let _ = write!(o.out, ":{b:#x}");
                    }
                }
            }
            o.out.push('"');
        }
        Match::Sctp(s) => {
            // As libxt_sctp's sctp_save.
            ports(o, "--sport ", &s.sport);
            ports(o, "--dport ", &s.dport);
            if let Some(c) = &s.chunks {
                o.opt(c.negated, "--chunk-types ");
                o.out.push_str(c.mode.name());
                o.out.push(' ');
                write_sctp_chunks(o.out, c);
            }
        }
        Match::Connlimit(c) => {
            // As libxt_connlimit's connlimit_save (revision 1).
            o.push(if c.upto {
                "--connlimit-upto "
            } else {
                "--connlimit-above "
            });
            write_uint(o.out, c.limit);
            o.push("--connlimit-mask ");
            write_uint(o.out, c.prefix);
            o.push(if c.daddr {
                "--connlimit-daddr"
            } else {
                "--connlimit-saddr"
            });
        }
        Match::Ipv6Header(h) => {
            o.opt(h.negated, "--header ");
            write_names(o.out, &IPV6_HEADER_NAMES, h.headers);
            if h.soft {
                o.push("--soft");
            }
        }
    }
}

fn neg<T>(v: &Neg<T>) -> &'static str {
    if v.negated { "! " } else { "" }
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
            o.push("-j REJECT --reject-with ");
            o.out.push_str(name);
        }
        Target::Jump(c) => {
            o.push("-j ");
            o.out.push_str(c);
        }
        Target::Goto(c) => {
            o.push("-g ");
            o.out.push_str(c);
        }
        Target::Log(l) => {
            o.push("-j LOG");
            if let Some(p) = &l.prefix {
                o.push("--log-prefix ");
                write_save_string(o.out, p);
            }
            if let Some(lv) = l.level {
                o.push("--log-level ");
                write_uint(o.out, lv);
            }
            for f in &l.flags {
                o.push(f);
            }
        }
        Target::Nflog(n) => {
            // libxt_NFLOG's nflog_print order.
            o.push("-j NFLOG");
            if let Some(p) = &n.prefix {
                o.push("--nflog-prefix ");
                write_save_string(o.out, p);
            }
            if n.group != 0 {
                o.push("--nflog-group ");
                write_uint(o.out, n.group);
            }
            if let Some(size) = n.size {
                o.push("--nflog-size ");
                write_uint(o.out, size);
            } else if n.range != 0 {
                o.push("--nflog-range ");
                write_uint(o.out, n.range);
            }
            if n.threshold != 0 {
                o.push("--nflog-threshold ");
                write_uint(o.out, n.threshold);
            }
        }
        Target::Notrack => o.push("-j NOTRACK"),
        Target::Ct(c) => {
            o.push("-j CT");
            if c.notrack {
                o.push("--notrack");
            }
            opaque_opts(o, &c.other);
            if let Some(z) = c.zone {
                // libxt_CT's ct_print_zone: one direction named, else --zone.
                o.push(match z.dirs {
                    crate::model::CtZone::ORIG => "--zone-orig ",
                    crate::model::CtZone::REPLY => "--zone-reply ",
                    _ => "--zone ",
                });
                if z.from_mark {
                    o.out.push_str("mark");
                } else {
                    write_uint(o.out, z.id);
                }
            }
        }
        Target::Mark(m) => {
            o.push_fmt(format_args!(
                "-j MARK --set-xmark {:#x}/{:#x}",
                m.value, m.mask
            ));
        }
        Target::Connmark(c) => match *c {
            ConnmarkTarget::Set(m) => o.push_fmt(format_args!(
                "-j CONNMARK --set-xmark {:#x}/{:#x}",
                m.value, m.mask
            )),
            ConnmarkTarget::Save { nfmask, ctmask } => o.push_fmt(format_args!(
                "-j CONNMARK --save-mark --nfmask {nfmask:#x} --ctmask {ctmask:#x}"
            )),
            ConnmarkTarget::Restore { nfmask, ctmask } => o.push_fmt(format_args!(
                "-j CONNMARK --restore-mark --nfmask {nfmask:#x} --ctmask {ctmask:#x}"
            )),
        },
        Target::Opaque(op) => {
            o.push("-j ");
            o.out.push_str(&op.name);
            opaque_opts(o, &op.options);
        }
        // No iptables syntax: printed as nft writes it (only nft tables hold it).
        Target::Vmap(v) => {
            o.push_fmt(format_args!("vmap @{}", v.map));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Neg;

    fn rule_with(src: IpNet, dst: IpNet) -> Rule {
        Rule {
            src: Some(Neg {
                negated: true,
                value: src,
            }),
            dst: Some(Neg::plain(dst)),
            ..Rule::default()
        }
    }

    fn v4(a: [u8; 4], m: [u8; 4]) -> IpNet {
        IpNet {
            addr: IpAddr::V4(Ipv4Addr::from(a)),
            mask: IpAddr::V4(Ipv4Addr::from(m)),
        }
    }

    #[test]
    fn ipv4_writer_matches_display() {
        let mut samples = vec![[0, 0, 0, 0], [255, 255, 255, 255], [10, 0, 0, 1]];
        for v in [0u8, 1, 9, 10, 11, 99, 100, 101, 199, 200, 249, 250, 255] {
            samples.push([v, 255 - v, v / 2, 7]);
        }
        for a in samples {
            let mut s = String::new();
            write_ipv4(&mut s, Ipv4Addr::from(a));
            assert_eq!(s, Ipv4Addr::from(a).to_string());
        }
    }

    #[test]
    fn nets_print_as_prefix_or_mask() {
        let r = rule_with(v4([0, 0, 0, 0], [0, 0, 0, 0]), v4([1, 2, 3, 4], [255; 4]));
        assert_eq!(
            print_rule_spec(&r, Family::Ipv4),
            "! -s 0.0.0.0/0 -d 1.2.3.4/32"
        );
        let r = rule_with(
            v4([10, 0, 2, 0], [255, 0, 255, 0]),
            v4([192, 168, 100, 0], [255, 255, 255, 0]),
        );
        assert_eq!(
            print_rule_spec(&r, Family::Ipv4),
            "! -s 10.0.2.0/255.0.255.0 -d 192.168.100.0/24"
        );
        let six = IpNet::new("2001:db8::1".parse().expect("v6"), 64).expect("net");
        let r = rule_with(six, six);
        assert_eq!(
            print_rule_spec(&r, Family::Ipv6),
            "! -s 2001:db8::/64 -d 2001:db8::/64"
        );
    }
}
