//! The oracle corpus: `corpus/<name>.rules` (iptables-restore text, filter table) with
//! `corpus/<name>.packets` (packets and the hits expected for each).
//!
//! `.rules`: must contain a line `# family: ipv4` or `# family: ipv6` (iptables-restore skips
//! comments). Packets arrive on `vo1` at INPUT.
//!
//! `.packets`: one packet a line, `#` starts a comment line:
//!
//! ```text
//! <id> <proto> <src> <dst> [key=value ...] => [CHAIN:N ...] policy=<CHAIN|->
//! ```
//!
//! `proto` is `tcp`, `udp`, `icmp`, `icmpv6` or a protocol number. Keys: `sport`, `dport`
//! (defaults 40000 and 80), `flags` (TCP flag letters from `FSRPAU`, or `none`; default `S`),
//! `type` and `code` (ICMP; defaults 8 / 128 and 0), `len` (payload bytes after the layer-4
//! header, default 0), `cut` (keep only this many bytes after the IP header: a short transport
//! header, with the IP lengths made to agree), `ttl` (or `hl`; default 64), `tos` (IPv4 TOS
//! byte / IPv6 traffic class, default 0), `payload` (hex bytes instead of `len` zeros), `ext`
//! (IPv6 extension headers `TYPE:HEX`: the first header's type, then the headers' bytes, each
//! starting with its next-header byte; `_` may separate bytes). Flag letters `E` and `C` are
//! ECE and CWR. After `=>`: every rule whose packet counter must go up, as `CHAIN:N`
//! with N the 1-based position of the rule within its chain (any order), and the builtin chain
//! whose policy counter must go up, or `-` for none. No hits and `policy=-` is a packet the
//! filter table dropped without counting it (a match "hotdropped" it: it could not read the
//! header it matches on).

use std::net::IpAddr;
use std::path::Path;

use vallum_engine::model::{Family, tcp_flags};

use super::kernel::{PacketSpec, Proto};

/// One corpus packet and what it must hit.
#[derive(Clone, Debug)]
pub struct CorpusPacket {
    /// The packet.
    pub spec: PacketSpec,
    /// Expected rule hits, sorted.
    pub hits: Vec<(String, usize)>,
    /// Expected policy counter.
    pub policy: Option<String>,
}

/// One ruleset with its packets.
#[derive(Clone, Debug)]
pub struct CorpusCase {
    /// File stem.
    pub name: String,
    /// Address family of the ruleset and packets.
    pub family: Family,
    /// The iptables-restore text.
    pub rules: String,
    /// Packets.
    pub packets: Vec<CorpusPacket>,
}

/// Reads every `*.rules` in `dir` with its `.packets`, sorted by name.
pub fn load_corpus(dir: &Path) -> Result<Vec<CorpusCase>, String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rules"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|path| {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .ok_or("bad file name")?
                .to_string();
            let rules =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let family = if rules.lines().any(|l| l.trim() == "# family: ipv6") {
                Family::Ipv6
            } else if rules.lines().any(|l| l.trim() == "# family: ipv4") {
                Family::Ipv4
            } else {
                return Err(format!("{name}.rules: no `# family: ipv4|ipv6` line"));
            };
            let ppath = path.with_extension("packets");
            let text =
                std::fs::read_to_string(&ppath).map_err(|e| format!("{}: {e}", ppath.display()))?;
            let packets = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                .map(|(i, l)| {
                    parse_packet_line(l, family)
                        .map_err(|e| format!("{name}.packets:{}: {e}", i + 1))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(CorpusCase {
                name,
                family,
                rules,
                packets,
            })
        })
        .collect()
}

/// Hex bytes, `_` allowed between them for readability.
fn hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|b| *b != b'_').collect();
    if digits.len() % 2 != 0 {
        return Err(format!("odd number of hex digits in `{s}`"));
    }
    digits
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("bad hex `{s}`"))
        })
        .collect()
}

fn parse_flags(s: &str) -> Result<u8, String> {
    if s == "none" {
        return Ok(0);
    }
    s.chars().try_fold(0u8, |acc, c| {
        Ok(acc
            | match c {
                'F' => tcp_flags::FIN,
                'S' => tcp_flags::SYN,
                'R' => tcp_flags::RST,
                'P' => tcp_flags::PSH,
                'A' => tcp_flags::ACK,
                'U' => tcp_flags::URG,
                'E' => 0x40,
                'C' => 0x80,
                _ => return Err(format!("unknown TCP flag `{c}`")),
            })
    })
}

/// Parses one `.packets` line (see the module docs).
pub fn parse_packet_line(line: &str, family: Family) -> Result<CorpusPacket, String> {
    let (left, right) = line.split_once("=>").ok_or("missing `=>`")?;
    let mut it = left.split_whitespace();
    let id = it.next().ok_or("missing id")?.to_string();
    let proto = match it.next().ok_or("missing protocol")? {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        "icmp" => Proto::Icmp,
        "icmpv6" => Proto::Icmpv6,
        n => Proto::Other(n.parse().map_err(|_| format!("bad protocol `{n}`"))?),
    };
    let addr = |s: Option<&str>| -> Result<IpAddr, String> {
        let s = s.ok_or("missing address")?;
        s.parse().map_err(|_| format!("bad address `{s}`"))
    };
    let src = addr(it.next())?;
    let dst = addr(it.next())?;
    let want_v6 = family == Family::Ipv6;
    if src.is_ipv6() != want_v6 || dst.is_ipv6() != want_v6 {
        return Err("address family differs from the ruleset's".into());
    }
    let mut spec = PacketSpec {
        id,
        proto,
        src,
        dst,
        sport: 40000,
        dport: 80,
        flags: tcp_flags::SYN,
        icmp_type: if want_v6 { 128 } else { 8 },
        icmp_code: 0,
        payload_len: 0,
        cut: None,
        ttl: 64,
        tos: 0,
        payload: None,
        ext: None,
    };
    for kv in it {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("bad field `{kv}`"))?;
        let num = |v: &str| -> Result<u64, String> {
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => v.parse(),
            }
            .map_err(|_| format!("bad number in `{kv}`"))
        };
        let small = |v: &str, max: u64| -> Result<u64, String> {
            let n = num(v)?;
            if n > max {
                return Err(format!("`{kv}` out of range"));
            }
            Ok(n)
        };
        match k {
            "sport" => spec.sport = small(v, 65535)? as u16,
            "dport" => spec.dport = small(v, 65535)? as u16,
            "flags" => spec.flags = parse_flags(v)?,
            "type" => spec.icmp_type = small(v, 255)? as u8,
            "code" => spec.icmp_code = small(v, 255)? as u8,
            "len" => spec.payload_len = small(v, 1400)? as usize,
            "cut" => spec.cut = Some(small(v, 60)? as usize),
            "ttl" | "hl" => spec.ttl = small(v, 255)? as u8,
            "tos" => spec.tos = small(v, 255)? as u8,
            "payload" => spec.payload = Some(hex(v)?),
            "ext" => {
                let (first, bytes) = v.split_once(':').ok_or("ext=TYPE:HEX")?;
                spec.ext = Some((small(first, 255)? as u8, hex(bytes)?));
            }
            _ => return Err(format!("unknown key `{k}`")),
        }
    }
    let mut hits = Vec::new();
    let mut policy = None;
    let mut saw_policy = false;
    for tok in right.split_whitespace() {
        if let Some(p) = tok.strip_prefix("policy=") {
            saw_policy = true;
            policy = (p != "-").then(|| p.to_string());
        } else {
            let (chain, n) = tok
                .rsplit_once(':')
                .ok_or_else(|| format!("bad hit `{tok}` (want CHAIN:N)"))?;
            let n: usize = n
                .parse()
                .map_err(|_| format!("bad rule number in `{tok}`"))?;
            hits.push((chain.to_string(), n));
        }
    }
    if !saw_policy {
        return Err("missing `policy=CHAIN|-`".into());
    }
    hits.sort();
    Ok(CorpusPacket { spec, hits, policy })
}
