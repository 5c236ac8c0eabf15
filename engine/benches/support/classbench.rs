//! A reader for ClassBench filter sets and header traces (Taylor & Turner's format), shared by
//! benches and tests through `#[path]`. Formats (see shared/data/SOURCES.md):
//! - filter: `@SRC/LEN\tDST/LEN\tSPLO : SPHI\tDPLO : DPHI\tPROTO/MASK\tFLAGS/MASK`
//! - trace: `SRC DST SPORT DPORT PROTO FLAGS RULE#` (decimal; RULE# is the generating rule,
//!   not always the first match).
//!
//! Rules become iptables rules of one INPUT chain: `-s -d -p (tcp|udp|N) [-m tcp|udp --sport
//! --dport] -j ACCEPT`, policy DROP. The TCP flags column is not translated (ClassBench sets
//! use it rarely and neither evaluator under comparison needs it); a port range on a protocol
//! without ports cannot be written in iptables and is reported as an error, never dropped.

#![allow(dead_code)] // Each bench or test uses a different part of this module.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use vallum_engine::model::{
    Chain, Counters, Family, Hook, IpNet, Location, Match, Neg, Policy, PortRange, Rule, Ruleset,
    Table, TableKind, Target, TcpMatch, UdpMatch,
};
use vallum_engine::packet::PacketMeta;

/// One ClassBench filter.
#[derive(Clone, Copy, Debug)]
pub struct Filter {
    pub src: (u32, u8),
    pub dst: (u32, u8),
    pub sport: (u16, u16),
    pub dport: (u16, u16),
    /// `None` for any protocol (mask 0x00).
    pub proto: Option<u8>,
}

/// One trace header.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

/// `<repo>/../shared/data/classbench`, or `$VALLUM_SHARED_DATA/classbench`.
pub fn data_dir() -> Option<PathBuf> {
    let base = std::env::var_os("VALLUM_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    let dir = base.join("classbench");
    dir.is_dir().then_some(dir)
}

fn prefix(s: &str) -> Result<(u32, u8), String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("no '/' in {s:?}"))?;
    let addr: Ipv4Addr = a.parse().map_err(|e| format!("{s:?}: {e}"))?;
    let len: u8 = l.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if len > 32 {
        return Err(format!("{s:?}: prefix longer than 32"));
    }
    Ok((u32::from(addr), len))
}

fn range(s: &str) -> Result<(u16, u16), String> {
    let (lo, hi) = s
        .split_once(':')
        .ok_or_else(|| format!("no ':' in {s:?}"))?;
    let lo = lo.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    let hi = hi.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    Ok((lo, hi))
}

fn hex_u8(s: &str) -> Result<u8, String> {
    u8::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| format!("{s:?}: {e}"))
}

/// Parses a filter set. Errors carry the 1-based line number.
pub fn parse_filters(text: &str) -> Result<Vec<Filter>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let err = |e: String| format!("line {}: {e}", i + 1);
        let line = line
            .strip_prefix('@')
            .ok_or_else(|| err("no leading '@'".into()))?;
        let f: Vec<&str> = line
            .split('\t')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if f.len() < 5 {
            return Err(err(format!("{} fields, want at least 5", f.len())));
        }
        let (p, m) = f[4]
            .split_once('/')
            .ok_or_else(|| err("bad protocol".into()))?;
        let proto = match hex_u8(m).map_err(err)? {
            0 => None,
            _ => Some(hex_u8(p).map_err(err)?),
        };
        out.push(Filter {
            src: prefix(f[0]).map_err(err)?,
            dst: prefix(f[1]).map_err(err)?,
            sport: range(f[2]).map_err(err)?,
            dport: range(f[3]).map_err(err)?,
            proto,
        });
    }
    Ok(out)
}

/// Parses a header trace.
pub fn parse_trace(text: &str) -> Result<Vec<Header>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f.len() < 5 {
            return Err(format!("line {}: {} fields, want 7", i + 1, f.len()));
        }
        let num = |k: usize| {
            f[k].parse::<u64>()
                .map_err(|e| format!("line {}: {e}", i + 1))
        };
        out.push(Header {
            src: num(0)? as u32,
            dst: num(1)? as u32,
            sport: num(2)? as u16,
            dport: num(3)? as u16,
            proto: num(4)? as u8,
        });
    }
    Ok(out)
}

fn ports(r: (u16, u16)) -> Option<Neg<PortRange>> {
    (r != (0, 65535)).then_some(Neg::plain(PortRange { lo: r.0, hi: r.1 }))
}

/// Translates one filter into an iptables rule with the given target.
pub fn to_rule(f: &Filter, target: Target) -> Result<Rule, String> {
    let net = |(a, l): (u32, u8)| {
        (l > 0)
            .then(|| Neg::plain(IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), l).expect("len <= 32")))
    };
    let mut rule = Rule {
        src: net(f.src),
        dst: net(f.dst),
        protocol: f.proto.map(Neg::plain),
        target,
        ..Rule::default()
    };
    let (sport, dport) = (ports(f.sport), ports(f.dport));
    match f.proto {
        Some(6) => rule.matches.push(Match::Tcp(TcpMatch {
            sport,
            dport,
            ..Default::default()
        })),
        Some(17) => rule.matches.push(Match::Udp(UdpMatch { sport, dport })),
        _ if sport.is_some() || dport.is_some() => {
            return Err(format!(
                "port range on protocol {:?} cannot be written in iptables",
                f.proto
            ));
        }
        _ => {}
    }
    if matches!(f.proto, Some(6 | 17)) && sport.is_none() && dport.is_none() {
        rule.matches.clear();
    }
    Ok(rule)
}

/// A ruleset with one filter/INPUT chain holding `filters` as ACCEPT rules, policy DROP.
pub fn to_ruleset(name: &str, filters: &[Filter]) -> Result<Ruleset, String> {
    to_ruleset_with(name, filters, |_| Target::Accept)
}

/// As [`to_ruleset`], with the target of rule `i` (0-based) given by `target(i)`.
pub fn to_ruleset_with(
    name: &str,
    filters: &[Filter],
    target: impl Fn(usize) -> Target,
) -> Result<Ruleset, String> {
    let rules = filters
        .iter()
        .enumerate()
        .map(|(i, f)| to_rule(f, target(i)))
        .collect::<Result<Vec<_>, _>>()?;
    let chain = |hook: Hook, rules: Vec<Rule>, policy| Chain {
        name: hook.chain_name().to_string(),
        policy: Some(policy),
        counters: Counters::default(),
        rules: rules.into(),
        location: Location::default(),
        nft_hook: None,
    };
    Ok(Ruleset {
        name: name.to_string(),
        priority: 0,
        tables: vec![Table {
            family: Family::Ipv4,
            kind: TableKind::Filter,
            chains: vec![
                chain(Hook::Input, rules, Policy::Drop),
                chain(Hook::Forward, Vec::new(), Policy::Accept),
                chain(Hook::Output, Vec::new(), Policy::Accept),
            ],
            location: Location::default(),
        }],
    })
}

/// Packet metadata at INPUT for a trace header (length 64 bytes).
pub fn to_packet(h: &Header) -> PacketMeta {
    PacketMeta {
        src: IpAddr::V4(Ipv4Addr::from(h.src)),
        dst: IpAddr::V4(Ipv4Addr::from(h.dst)),
        protocol: h.proto,
        sport: h.sport,
        dport: h.dport,
        len: 64,
        ..PacketMeta::default()
    }
}

/// `n` headers sampled from the rules: each picks a random rule and a random point inside
/// every field of it (a random protocol when the rule has none), so each header matches at
/// least its rule. Deterministic for a given `seed` (splitmix64). For sets without a trace.
pub fn sample_headers(filters: &[Filter], n: usize, seed: u64) -> Vec<Header> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let inside = |(addr, len): (u32, u8), r: u64| {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        (addr & mask) | (r as u32 & !mask)
    };
    let within = |(lo, hi): (u16, u16), r: u64| lo + (r % (u64::from(hi - lo) + 1)) as u16;
    (0..n)
        .map(|_| {
            let f = &filters[(next() % filters.len() as u64) as usize];
            Header {
                src: inside(f.src, next()),
                dst: inside(f.dst, next()),
                sport: within(f.sport, next()),
                dport: within(f.dport, next()),
                proto: f.proto.unwrap_or([6, 17, 1][(next() % 3) as usize]),
            }
        })
        .collect()
}

/// Reads a gzip-compressed set (the generated 100k sets) with the system's `gzip -dc`;
/// `None` when gzip is missing or fails.
pub fn read_gz(path: &Path) -> Option<String> {
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(path)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).ok())
        .flatten()
}
