//! `iptables -L [CHAIN]` (`-n`, `-v`, `-x`, `--line-numbers`) laid out as iptables 1.8.9
//! (legacy) lists a table: `print_header` and `print_firewall` of iptables.c, the numbers of
//! `xtables_print_num`, and each extension's `print` for the extensions vallumd enforces
//! (tcp, udp, multiport, icmp, state, conntrack's ctstate, comment, mark, limit, addrtype,
//! mac; REJECT, LOG, MARK, DNAT/SNAT/MASQUERADE). The rules and counters are the active
//! revision's, as `iptables-save -c` exports them.
//!
//! Not as iptables: without `-n` nothing is looked up (addresses and ports stay numeric,
//! `0.0.0.0/0` is `anywhere`, a missing interface `any`, protocols by name); an extension
//! without a `print` here shows its iptables-save options.

use vallum_engine::model::{
    Chain, Family, IpNet, Match, MultiportDir, PortRange, RateUnit, Rule, Table, TableKind, Target,
    ct_state,
};
use vallum_engine::restore::{self, ParseOptions};

use super::{Fail, Wait, active_text, failed, with_client};

/// The listing flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct Format {
    /// `-n`: numeric addresses, ports and protocols.
    pub numeric: bool,
    /// `-v`: counters and interfaces.
    pub verbose: bool,
    /// `-x`: exact counters (no K/M/G).
    pub exact: bool,
    /// `--line-numbers`.
    pub line_numbers: bool,
}

/// `-L [CHAIN]` of `table`: every chain (or `chain`), a blank line between chains.
///
/// Errors: exit 1 with "No chain/target/match by that name." for a chain the table lacks.
pub fn run(
    wait: Wait,
    prog: &str,
    table: &str,
    v6: bool,
    chain: Option<&str>,
    f: Format,
) -> Result<String, Fail> {
    let kind = TableKind::from_name(table).ok_or_else(|| {
        failed(format!(
            "{prog} v1.8.9 (vallum): can't initialize iptables table `{table}': Table does not exist"
        ))
    })?;
    let text = with_client(wait, |c| active_text(c, v6, true))?;
    let family = if v6 { Family::Ipv6 } else { Family::Ipv4 };
    let opts = ParseOptions {
        family,
        counters: true,
        ..ParseOptions::default()
    };
    let tables = restore::parse(&text, &opts)
        .map_err(|e| failed(format!("{prog}: the active revision does not parse: {e}")))?
        .tables;
    let t = tables
        .into_iter()
        .find(|t| t.kind == kind)
        .unwrap_or_else(|| empty_table(family, kind));
    list_table(prog, &t, chain, f)
}

/// A table with its builtin chains only, policy ACCEPT (what the kernel lists for a table
/// nothing was written to).
fn empty_table(family: Family, kind: TableKind) -> Table {
    let text = format!("*{}\nCOMMIT\n", kind.name());
    let opts = ParseOptions {
        family,
        ..ParseOptions::default()
    };
    match restore::parse(&text, &opts) {
        Ok(mut r) if !r.tables.is_empty() => r.tables.remove(0),
        _ => Table {
            family,
            kind,
            chains: Vec::new(),
            location: Default::default(),
        },
    }
}

/// The listing of `t` (its chains in iptables-save order, which is libiptc's).
pub fn list_table(prog: &str, t: &Table, chain: Option<&str>, f: Format) -> Result<String, Fail> {
    let mut out = String::new();
    let mut found = false;
    for c in &t.chains {
        if chain.is_some_and(|n| n != c.name) {
            continue;
        }
        if found {
            out.push('\n');
        }
        found = true;
        header(&mut out, t, c, f);
        for (i, r) in c.rules.iter().enumerate() {
            rule_line(&mut out, t.family, r, i + 1, f);
        }
    }
    if !found && chain.is_some() {
        return Err(failed(format!(
            "{prog}: No chain/target/match by that name."
        )));
    }
    Ok(out)
}

/// `xtables_print_num`: `%8llu ` with `-x`, else up to 99999 as `%5llu `, then K, M, G, T
/// rounded; `notable` drops the padding (chain headers).
fn num(out: &mut String, n: u64, f: Format, notable: bool) {
    if f.exact {
        if notable {
            out.push_str(&format!("{n} "));
        } else {
            out.push_str(&format!("{n:8} "));
        }
        return;
    }
    if n <= 99999 {
        if notable {
            out.push_str(&format!("{n} "));
        } else {
            out.push_str(&format!("{n:5} "));
        }
        return;
    }
    let mut n = n;
    for unit in ["K", "M", "G"] {
        n = n.saturating_add(500) / 1000;
        if n <= 9999 {
            if notable {
                out.push_str(&format!("{n}{unit} "));
            } else {
                out.push_str(&format!("{n:4}{unit} "));
            }
            return;
        }
    }
    n = n.saturating_add(500) / 1000;
    if notable {
        out.push_str(&format!("{n}T "));
    } else {
        out.push_str(&format!("{n:4}T "));
    }
}

/// `print_header`: the chain line and the column titles.
fn header(out: &mut String, t: &Table, c: &Chain, f: Format) {
    out.push_str("Chain ");
    out.push_str(&c.name);
    match c.policy {
        Some(p) => {
            out.push_str(" (policy ");
            out.push_str(&format!("{p:?}").to_uppercase());
            if f.verbose {
                out.push(' ');
                num(out, c.counters.packets, f, true);
                out.push_str("packets, ");
                num(out, c.counters.bytes, f, true);
                out.push_str("bytes");
            }
            out.push_str(")\n");
        }
        None => {
            let refs = t
                .chains
                .iter()
                .flat_map(|x| x.rules.iter())
                .filter(|r| matches!(&r.target, Target::Jump(n) | Target::Goto(n) if *n == c.name))
                .count();
            out.push_str(&format!(" ({refs} references)\n"));
        }
    }
    if f.line_numbers {
        out.push_str("num  ");
    }
    if f.verbose {
        if f.exact {
            out.push_str("    pkts      bytes ");
        } else {
            out.push_str(" pkts bytes ");
        }
    }
    out.push_str("target    ");
    out.push_str(" prot opt");
    if f.verbose {
        out.push_str(" in     out    ");
    }
    out.push_str(" source              ");
    out.push_str(" destination         ");
    out.push('\n');
}

/// The protocol column: a number with `-n` (as iptables 1.8.9), else the name of the
/// protocols iptables names itself (`all` for none).
fn protocol(p: u8, numeric: bool) -> String {
    if numeric {
        return p.to_string();
    }
    match p {
        0 => "all",
        1 => "icmp",
        6 => "tcp",
        17 => "udp",
        47 => "gre",
        50 => "esp",
        51 => "ah",
        58 => "ipv6-icmp",
        132 => "sctp",
        136 => "udplite",
        _ => return p.to_string(),
    }
    .to_owned()
}

/// An address column: `addr[/len]` (no `/32` or `/128`), `anywhere` for none without `-n`.
fn address(net: Option<&IpNet>, family: Family, numeric: bool) -> String {
    let any = match family {
        Family::Ipv4 => "0.0.0.0/0",
        Family::Ipv6 => "::/0",
    };
    let Some(n) = net else {
        return if numeric { any } else { "anywhere" }.to_owned();
    };
    let full = match family {
        Family::Ipv4 => 32,
        Family::Ipv6 => 128,
    };
    match n.prefix_len() {
        Some(0) if !numeric => "anywhere".to_owned(),
        Some(l) if l == full => n.addr.to_string(),
        Some(l) => format!("{}/{l}", n.addr),
        None => format!("{}/{}", n.addr, n.mask),
    }
}

/// `print_firewall`: one rule's line.
fn rule_line(out: &mut String, family: Family, r: &Rule, number: usize, f: Format) {
    if f.line_numbers {
        out.push_str(&format!("{number:<4} "));
    }
    if f.verbose {
        let k = r.counters.unwrap_or_default();
        num(out, k.packets, f, false);
        num(out, k.bytes, f, false);
    }
    out.push_str(&format!("{:<9} ", target_name(&r.target)));
    let (pneg, p) = r.protocol.map_or((false, 0), |p| (p.negated, p.value));
    out.push(if pneg { '!' } else { ' ' });
    out.push_str(&format!("{:<5}", protocol(p, f.numeric)));
    match r.fragment {
        Some(true) => out.push_str("-f "),
        Some(false) => out.push_str("!f "),
        None => out.push_str("-- "),
    }
    if f.verbose {
        let iface = |i: &Option<vallum_engine::model::Neg<vallum_engine::model::Iface>>| match i {
            Some(n) => format!("{}{}", if n.negated { "!" } else { "" }, n.value.name),
            None if f.numeric => "*".to_owned(),
            None => "any".to_owned(),
        };
        out.push_str(&format!(" {:<6} ", iface(&r.in_iface)));
        out.push_str(&format!("{:<6} ", iface(&r.out_iface)));
    }
    let neg = |n: Option<bool>| if n == Some(true) { '!' } else { ' ' };
    out.push(neg(r.src.as_ref().map(|s| s.negated)));
    let src = address(r.src.as_ref().map(|s| &s.value), family, f.numeric);
    out.push_str(&format!("{src:<19} "));
    out.push(neg(r.dst.as_ref().map(|s| s.negated)));
    let dst = address(r.dst.as_ref().map(|s| &s.value), family, f.numeric);
    out.push_str(&format!("{dst:<19} "));
    if matches!(r.target, Target::Goto(_)) {
        out.push_str("[goto] ");
    }
    for m in r.matches.iter() {
        match_text(out, m, family);
    }
    target_text(out, r, family);
    out.push('\n');
}

/// The target column.
fn target_name(t: &Target) -> String {
    match t {
        Target::None => "",
        Target::Accept => "ACCEPT",
        Target::Drop => "DROP",
        Target::Return => "RETURN",
        Target::Reject(_) => "REJECT",
        Target::Jump(c) | Target::Goto(c) => c,
        Target::Log(_) => "LOG",
        Target::Nflog(_) => "NFLOG",
        Target::Notrack => "NOTRACK",
        Target::Ct(_) => "CT",
        Target::Mark(_) => "MARK",
        Target::Connmark(_) => "CONNMARK",
        Target::Opaque(o) => &o.name,
        // Only nft tables hold it; `iptables -L` shows no nft table.
        Target::Vmap(_) => "VMAP",
    }
    .to_owned()
}

/// The iptables-save words of `m` alone (`-m NAME --opt ...`), tokenized.
fn save_words(m: &Match, family: Family) -> Vec<String> {
    let rule = Rule {
        matches: vec![m.clone()].into(),
        ..Rule::default()
    };
    words(&restore::print_rule_spec(&rule, family))
}

fn words(spec: &str) -> Vec<String> {
    restore::tokenize(spec)
        .map(|t| t.into_iter().map(|t| t.text.into_owned()).collect())
        .unwrap_or_else(|_| spec.split(' ').map(str::to_owned).collect())
}

/// An extension without a `print` here: its save options (without `-m NAME`), `--` dropped.
fn fallback(out: &mut String, words: &[String]) {
    let skip = if words.first().is_some_and(|w| w == "-m" || w == "-j") {
        2
    } else {
        0
    };
    for w in words.iter().skip(skip) {
        out.push(' ');
        out.push_str(w.strip_prefix("--").unwrap_or(w));
    }
}

/// libxt_tcp/udp `print_ports`: ` spt:N`, ` spts:A:B`, `!` after the colon.
fn ports(out: &mut String, name: &str, p: &Option<vallum_engine::model::Neg<PortRange>>) {
    let Some(p) = p else { return };
    let inv = if p.negated { "!" } else { "" };
    if p.value.lo == p.value.hi {
        out.push_str(&format!(" {name}:{inv}{}", p.value.lo));
    } else {
        out.push_str(&format!(" {name}s:{inv}{}:{}", p.value.lo, p.value.hi));
    }
}

fn states(bits: u8) -> String {
    let names = [
        ("INVALID", ct_state::INVALID),
        ("NEW", ct_state::NEW),
        ("RELATED", ct_state::RELATED),
        ("ESTABLISHED", ct_state::ESTABLISHED),
        ("UNTRACKED", ct_state::UNTRACKED),
        ("SNAT", ct_state::SNAT),
        ("DNAT", ct_state::DNAT),
    ];
    names
        .iter()
        .filter(|(_, b)| bits & b != 0)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",")
}

/// One match's part of the last column, as its extension prints it with `-n`.
fn match_text(out: &mut String, m: &Match, family: Family) {
    match m {
        Match::Tcp(t) => {
            out.push_str(" tcp");
            ports(out, "spt", &t.sport);
            ports(out, "dpt", &t.dport);
            if let Some(o) = &t.option {
                let inv = if o.negated { "!" } else { "" };
                out.push_str(&format!(" option={inv}{}", o.value));
            }
            if let Some(fl) = &t.flags {
                let inv = if fl.negated { "!" } else { "" };
                out.push_str(&format!(
                    " flags:{inv}0x{:02X}/0x{:02X}",
                    fl.value.mask, fl.value.comp
                ));
            }
        }
        Match::Udp(u) => {
            out.push_str(" udp");
            ports(out, "spt", &u.sport);
            ports(out, "dpt", &u.dport);
        }
        Match::Multiport(mp) => {
            let dir = match mp.dir {
                MultiportDir::Source => "sports",
                MultiportDir::Destination => "dports",
                MultiportDir::Either => "ports",
            };
            let list: Vec<String> = mp
                .ports
                .iter()
                .map(|p| {
                    if p.lo == p.hi {
                        p.lo.to_string()
                    } else {
                        format!("{}:{}", p.lo, p.hi)
                    }
                })
                .collect();
            let inv = if mp.negated { "!" } else { "" };
            out.push_str(&format!(" multiport {dir} {inv}{}", list.join(",")));
        }
        Match::Icmp(i) => match i.icmp_type {
            Some(t) => {
                let inv = if i.negated { "!" } else { "" };
                out.push_str(&format!(
                    " icmp{}type {inv}{t}",
                    if family == Family::Ipv6 { "v6" } else { "" }
                ));
                let (lo, hi) = i.code;
                if lo == hi {
                    out.push_str(&format!(" code {lo}"));
                } else if (lo, hi) != (0, 0xff) {
                    out.push_str(&format!(" codes {lo}-{hi}"));
                }
            }
            None => out.push_str(" icmp any"),
        },
        Match::State(s) => {
            if s.negated {
                out.push_str(" !");
            }
            out.push_str(&format!(" state {}", states(s.value)));
        }
        Match::Conntrack(c) => {
            if let Some(s) = &c.ctstate {
                if s.negated {
                    out.push_str(" !");
                }
                out.push_str(&format!(" ctstate {}", states(s.value)));
            }
            if !c.other.is_empty() {
                let w = save_words(m, family);
                let from = w
                    .iter()
                    .position(|x| x != "-m" && x != "conntrack")
                    .unwrap_or(0);
                let w: Vec<String> = w[from..]
                    .split(|x| x == "--ctstate")
                    .next()
                    .unwrap_or(&[])
                    .to_vec();
                fallback(out, &w);
            }
        }
        Match::Comment(c) => out.push_str(&format!(" /* {c} */")),
        Match::Mark(mv) => {
            let inv = if mv.negated { "!" } else { "" };
            out.push_str(&format!(" mark match {inv}0x{:x}", mv.value.value));
            if mv.value.mask != u32::MAX {
                out.push_str(&format!("/0x{:x}", mv.value.mask));
            }
        }
        Match::Limit(l) => {
            let unit = match l.unit {
                RateUnit::Second => "sec",
                RateUnit::Minute => "min",
                RateUnit::Hour => "hour",
                RateUnit::Day => "day",
            };
            out.push_str(&format!(" limit: avg {}/{unit} burst {}", l.rate, l.burst));
        }
        Match::AddrType(_) => {
            out.push_str(" ADDRTYPE match");
            let w = save_words(m, family);
            let mut neg = false;
            let mut it = w.iter().skip(2);
            while let Some(x) = it.next() {
                match x.as_str() {
                    "!" => neg = true,
                    "--src-type" | "--dst-type" => {
                        let v = it.next().cloned().unwrap_or_default();
                        let inv = if neg { "!" } else { "" };
                        out.push_str(&format!(" {} {inv}{v}", &x[2..]));
                        neg = false;
                    }
                    "--limit-iface-in" => out.push_str(" limit-in"),
                    "--limit-iface-out" => out.push_str(" limit-out"),
                    _ => {}
                }
            }
        }
        Match::Mac(mac) => {
            let inv = if mac.negated { "! " } else { "" };
            let hex: Vec<String> = mac.value.iter().map(|b| format!("{b:02X}")).collect();
            out.push_str(&format!(" MAC {inv}{}", hex.join(":")));
        }
        _ => fallback(out, &save_words(m, family)),
    }
}

/// The target's part of the last column.
fn target_text(out: &mut String, r: &Rule, family: Family) {
    let spec = || {
        let rule = Rule {
            target: r.target.clone(),
            ..Rule::default()
        };
        words(&restore::print_rule_spec(&rule, family))
    };
    let value = |w: &[String], opt: &str| {
        w.iter()
            .position(|x| x == opt)
            .and_then(|i| w.get(i + 1).cloned())
    };
    match &r.target {
        Target::None
        | Target::Accept
        | Target::Drop
        | Target::Return
        | Target::Jump(_)
        | Target::Goto(_)
        | Target::Notrack => {}
        Target::Reject(_) => {
            let w = spec();
            if let Some(v) = value(&w, "--reject-with") {
                out.push_str(&format!(" reject-with {v}"));
            }
        }
        Target::Log(l) => {
            let bits = l.flags.iter().fold(0u32, |a, f| {
                a | if f.contains("tcp-sequence") {
                    0x01
                } else if f.contains("tcp-options") {
                    0x02
                } else if f.contains("ip-options") {
                    0x04
                } else if f.contains("uid") {
                    0x08
                } else if f.contains("macdecode") {
                    0x20
                } else {
                    0
                }
            });
            out.push_str(&format!(" LOG flags {bits} level {}", l.level.unwrap_or(4)));
            if let Some(p) = &l.prefix {
                out.push_str(&format!(" prefix \"{p}\""));
            }
        }
        Target::Mark(mv) => {
            if mv.mask == u32::MAX {
                out.push_str(&format!(" MARK set 0x{:x}", mv.value));
            } else {
                out.push_str(&format!(" MARK xset 0x{:x}/0x{:x}", mv.value, mv.mask));
            }
        }
        Target::Opaque(o) => {
            let w = spec();
            match o.name.as_str() {
                "DNAT" | "SNAT" => {
                    let opt = if o.name == "DNAT" {
                        "--to-destination"
                    } else {
                        "--to-source"
                    };
                    if let Some(v) = value(&w, opt) {
                        out.push_str(&format!(" to:{v}"));
                    }
                }
                "MASQUERADE" => {
                    if let Some(v) = value(&w, "--to-ports") {
                        out.push_str(&format!(" masq ports: {v}"));
                    }
                }
                _ => fallback(out, &w),
            }
        }
        _ => fallback(out, &spec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What iptables-legacy 1.8.9 printed for `iptables -L INPUT -n -v -x --line-numbers` of
    /// the same rules (in a private network namespace).
    #[test]
    fn lists_as_iptables_legacy() {
        let text = "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:DOCKER - [0:0]\n\
            -A INPUT -i lo -j ACCEPT\n\
            -A INPUT -s 1.2.3.4/32 ! -d 5.6.7.0/24 -p udp -m udp --sport 53 --dport 1000:2000 -j DROP\n\
            -A INPUT -m conntrack --ctstate NEW -m comment --comment \"hello world\" -j ACCEPT\n\
            -A INPUT -g DOCKER\nCOMMIT\n";
        let t = restore::parse(text, &ParseOptions::default())
            .expect("parses")
            .tables
            .remove(0);
        let f = Format {
            numeric: true,
            verbose: true,
            exact: true,
            line_numbers: true,
        };
        let got = list_table("iptables", &t, Some("INPUT"), f)
            .unwrap_or_else(|e| panic!("{}", e.message));
        let want = "Chain INPUT (policy DROP 0 packets, 0 bytes)\n\
num      pkts      bytes target     prot opt in     out     source               destination         \n\
1           0        0 ACCEPT     0    --  lo     *       0.0.0.0/0            0.0.0.0/0           \n\
2           0        0 DROP       17   --  *      *       1.2.3.4             !5.6.7.0/24           udp spt:53 dpts:1000:2000\n\
3           0        0 ACCEPT     0    --  *      *       0.0.0.0/0            0.0.0.0/0            ctstate NEW /* hello world */\n\
4           0        0 DOCKER     0    --  *      *       0.0.0.0/0            0.0.0.0/0           [goto] \n";
        assert_eq!(got, want);
        let got = list_table("iptables", &t, Some("DOCKER"), Format::default())
            .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(
            got,
            "Chain DOCKER (1 references)\ntarget     prot opt source               destination         \n"
        );
    }

    #[test]
    fn counters_are_rounded_as_xtables_print_num() {
        let mut s = String::new();
        for n in [0, 99999, 100000, 9_999_499, 9_999_500, 123_456_789_012] {
            num(&mut s, n, Format::default(), false);
        }
        assert_eq!(s, "    0 99999  100K 9999K   10M  123G ");
    }
}
