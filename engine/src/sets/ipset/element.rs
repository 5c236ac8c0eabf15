//! Element types of ipset-style sets: names, [`SetType`], [`SetSpec`], [`Element`] and its
//! `ipset` text grammar, [`AddOptions`], [`SetError`]. Commit path and API only (parsing, printing).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::echo::quoted;
use crate::model::Family;

/// Longest set name in bytes (IPSET_MAXNAMELEN - 1).
pub const MAX_NAME_LEN: usize = 31;

/// Longest name in bytes of the engine set an nft named set or map becomes,
/// `FAMILY.TABLE.SET` ([`crate::nft::lower::set_name`]; nft allows 255-byte table and set
/// names).
pub const MAX_NFT_NAME_LEN: usize = 5 + 1 + 255 + 1 + 255;

/// The one grammar of set names, for creating a set (API, `ipset restore` text) and for
/// naming it in a rule (`-m set --match-set NAME`): 1 to [`MAX_NAME_LEN`] bytes (ipset's
/// limit; up to [`MAX_NFT_NAME_LEN`] for a name of an nft set, `ip.`, `ip6.` or `inet.`
/// followed by `TABLE.SET`), not starting with `-` (the rule parser would read an option),
/// without whitespace, control characters, `"` or `\` (none survives a rule or `ipset save`
/// line). A name that fails here could be created but never used in a rule.
///
/// Errors: what is wrong, for a message (`set name "-x": ...`).
pub fn check_name(name: &str) -> Result<(), &'static str> {
    let nft = ["ip.", "ip6.", "inet."]
        .iter()
        .any(|f| name.strip_prefix(f).is_some_and(|rest| rest.contains('.')));
    if nft && name.len() > MAX_NFT_NAME_LEN {
        Err("the set name of an nft set has at most 517 bytes")
    } else if name.is_empty() || (!nft && name.len() > MAX_NAME_LEN) {
        Err("a set name has 1 to 31 bytes (an nft set's FAMILY.TABLE.SET up to 517)")
    } else if name.starts_with('-') {
        Err("a set name must not start with '-'")
    } else if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\\')
    {
        Err("a set name has no whitespace, control characters, quotes or backslashes")
    } else {
        Ok(())
    }
}

/// Largest range one element text may expand to (`hash:ip` CIDR, port ranges), as ipset's
/// own limit of 65536 elements per add.
pub(in crate::sets) const MAX_EXPAND: u128 = 65536;

pub(in crate::sets) const NS_PER_S: u64 = 1_000_000_000;

/// Errors of [`SetManager`](super::SetManager) operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// The name does not follow [`check_name`]; the reason is its message.
    #[error("set name {}: {}", quoted(.0), .1)]
    BadName(String, &'static str),
    /// `create` of a name that exists.
    #[error("set {} already exists", quoted(.0))]
    Exists(String),
    /// The named set does not exist.
    #[error("set {} does not exist", quoted(.0))]
    NotFound(String),
    /// `swap` of sets of different type or family.
    #[error("sets {} and {} have different type or family and cannot be swapped", quoted(.0), quoted(.1))]
    Incompatible(String, String),
    /// An element text that does not fit the set's type and family.
    #[error("set {}: invalid element {}: {reason}", quoted(.set), quoted(.element))]
    BadElement {
        /// Set name.
        set: String,
        /// The element as written.
        element: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Adding would exceed `maxelem`.
    #[error("set {} is full ({maxelem} elements)", quoted(.set))]
    Full {
        /// Set name.
        set: String,
        /// The set's limit.
        maxelem: u32,
    },
}

// === SetType ===

/// An ipset type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetType {
    /// `hash:ip`: host addresses.
    HashIp,
    /// `hash:net`: networks of any prefix length.
    HashNet,
    /// `hash:ip,port`: host address, protocol and port.
    HashIpPort,
    /// `hash:net,port`: network, protocol and port.
    HashNetPort,
    /// `bitmap:port`: ports alone (the packet's protocol is not part of the key; nft's
    /// `type inet_service` sets, whose rule names the protocol). Its family only says which
    /// table holds the ports: a port matches packets of both families.
    BitmapPort,
}

impl SetType {
    /// The ipset name (`hash:ip`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashNet => "hash:net",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashNetPort => "hash:net,port",
            SetType::BitmapPort => "bitmap:port",
        }
    }

    /// The type named `name`.
    pub fn from_name(name: &str) -> Option<SetType> {
        [
            SetType::HashIp,
            SetType::HashNet,
            SetType::HashIpPort,
            SetType::HashNetPort,
            SetType::BitmapPort,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    pub(in crate::sets) fn has_net(self) -> bool {
        matches!(self, SetType::HashNet | SetType::HashNetPort)
    }

    pub(in crate::sets) fn has_port(self) -> bool {
        matches!(self, SetType::HashIpPort | SetType::HashNetPort)
    }

    /// Ports alone, no address (`bitmap:port`).
    pub(in crate::sets) fn port_only(self) -> bool {
        self == SetType::BitmapPort
    }
}

/// How a set is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetSpec {
    /// Type.
    pub kind: SetType,
    /// `family inet|inet6`.
    pub family: Family,
    /// Default element timeout in seconds (`timeout N`); `None` when the set has no timeouts.
    /// With a default, an element added with `timeout 0` never expires (as ipset).
    pub timeout: Option<u32>,
    /// Keep packet/byte counters per element (`counters`).
    pub counters: bool,
    /// Largest number of elements (`maxelem`, default 65536).
    pub maxelem: u32,
    /// `hashsize`, kept for `ipset save` output only (the table grows by itself).
    pub hashsize: u32,
}

impl SetSpec {
    /// A spec with ipset's defaults (no timeout, no counters, maxelem 65536, hashsize 1024).
    pub fn new(kind: SetType, family: Family) -> SetSpec {
        SetSpec {
            kind,
            family,
            timeout: None,
            counters: false,
            maxelem: 65536,
            hashsize: 1024,
        }
    }

    /// When an element added at `now` (ns, the caller's clock) with `add` expires, in ns of
    /// the same clock; `u64::MAX` = never. As ipset: the element's `timeout`, else the set's
    /// default; 0 (or no timeout at all) never expires.
    pub fn expiry(&self, add: &AddOptions, now: u64) -> u64 {
        expiry(self.timeout, add, now)
    }
}

pub(in crate::sets) fn expiry(default: Option<u32>, add: &AddOptions, now: u64) -> u64 {
    match add.timeout.or(default) {
        Some(t) if t > 0 => now.saturating_add(u64::from(t).saturating_mul(NS_PER_S)),
        _ => u64::MAX,
    }
}

// === Element ===

/// One exact element: address (masked to `prefix`), and protocol/port on `*,port` types;
/// in a verdict map also its verdict ([`Element::verdict`]), which is the element's value,
/// not part of its key: equality, hash and order ignore it (`delete` finds `10.0.0.1 : drop`
/// by `10.0.0.1`).
#[derive(Clone, Copy, Debug)]
pub struct Element {
    /// Address bits (an IPv4 address in the low 32 bits), masked to `prefix`.
    pub(in crate::sets) addr: u128,
    /// Prefix length (32/128 on `hash:ip*`).
    pub(in crate::sets) prefix: u8,
    /// IP protocol (0 on types without port).
    pub(in crate::sets) proto: u8,
    /// Port (0 on types without port).
    pub(in crate::sets) port: u16,
    /// The verdict of a verdict-map element ([`crate::sets::verdict`]); 0 in a plain set.
    pub(in crate::sets) verdict: u32,
}

impl Element {
    fn key(&self) -> (u128, u8, u8, u16) {
        (self.addr, self.prefix, self.proto, self.port)
    }
}

impl PartialEq for Element {
    fn eq(&self, other: &Element) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Element {}

impl std::hash::Hash for Element {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl PartialOrd for Element {
    fn partial_cmp(&self, other: &Element) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Element {
    fn cmp(&self, other: &Element) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

pub(in crate::sets) fn width(family: Family) -> u8 {
    match family {
        Family::Ipv4 => 32,
        Family::Ipv6 => 128,
    }
}

pub(in crate::sets) fn mask(addr: u128, prefix: u8, family: Family) -> u128 {
    let w = width(family);
    if prefix == 0 {
        0
    } else {
        addr & ((u128::MAX >> (128 - u32::from(w))) & !((1u128 << (w - prefix)) - 1))
    }
}

pub(in crate::sets) fn addr_bits(ip: IpAddr, family: Family) -> Option<u128> {
    match (ip, family) {
        (IpAddr::V4(a), Family::Ipv4) => Some(u128::from(u32::from(a))),
        (IpAddr::V6(a), Family::Ipv6) => Some(u128::from(a)),
        _ => None,
    }
}

pub(in crate::sets) fn proto_name(proto: u8) -> Option<&'static str> {
    match proto {
        6 => Some("tcp"),
        17 => Some("udp"),
        132 => Some("sctp"),
        136 => Some("udplite"),
        _ => None,
    }
}

pub(in crate::sets) fn proto_number(name: &str) -> Option<u8> {
    [6, 17, 132, 136]
        .into_iter()
        .find(|&p| proto_name(p) == Some(name))
}

impl Element {
    /// An element from an address (masked to `prefix`, clamped to the family's width) and,
    /// on `*,port` types, `(protocol, port)`. The set checks nothing more: an element of the
    /// wrong family or shape simply never matches.
    pub fn new(addr: IpAddr, prefix: u8, proto_port: Option<(u8, u16)>) -> Element {
        let family = match addr {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        };
        let prefix = prefix.min(width(family));
        let (proto, port) = proto_port.unwrap_or((0, 0));
        Element {
            addr: mask(addr_bits(addr, family).unwrap_or(0), prefix, family),
            prefix,
            proto,
            port,
            verdict: 0,
        }
    }

    /// The element of port `port` in a `bitmap:port` set.
    pub fn port(port: u16) -> Element {
        Element {
            addr: 0,
            prefix: 0,
            proto: 0,
            port,
            verdict: 0,
        }
    }

    /// This element with verdict `verdict` (a number of [`crate::sets::verdict`]).
    pub fn with_verdict(self, verdict: u32) -> Element {
        Element { verdict, ..self }
    }

    /// The verdict of a verdict-map element ([`crate::sets::verdict`]); 0 in a plain set.
    pub fn verdict(&self) -> u32 {
        self.verdict
    }

    /// Parses ipset element syntax for `spec` (`192.0.2.1`, `10.0.0.0/8`, `2001:db8::/32`,
    /// `192.0.2.1,tcp:80`, `10.0.0.0/8,udp:53-54`; a port without protocol is tcp). On
    /// `hash:ip*` a CIDR or a port range expands to its elements (at most 65536). An element
    /// of a verdict map ends in ` : VERDICT` as nft writes it (`10.0.0.1,tcp:80 : goto svc`,
    /// [`crate::sets::verdict::parse`]); every element it expands to has that verdict.
    pub fn parse(spec: &SetSpec, text: &str) -> Result<Vec<Element>, String> {
        let (text, verdict) = match text.split_once(" : ") {
            Some((key, v)) => (key.trim(), crate::sets::verdict::parse(v)?),
            None => (text, crate::sets::verdict::NONE),
        };
        let mut out = Self::parse_key(spec, text)?;
        for e in &mut out {
            e.verdict = verdict;
        }
        Ok(out)
    }

    fn parse_key(spec: &SetSpec, text: &str) -> Result<Vec<Element>, String> {
        if spec.kind.port_only() {
            let port = |s: &str| s.parse::<u16>().map_err(|_| format!("bad port {s:?}"));
            let (lo, hi) = match text.split_once('-') {
                Some((lo, hi)) => (port(lo)?, port(hi)?),
                None => (port(text)?, port(text)?),
            };
            if lo > hi {
                return Err(format!("bad port range {text:?}"));
            }
            return Ok((lo..=hi)
                .map(|port| Element {
                    addr: 0,
                    prefix: 0,
                    proto: 0,
                    port,
                    verdict: 0,
                })
                .collect());
        }
        let (addr_text, port_text) = match (spec.kind.has_port(), text.split_once(',')) {
            (true, Some((a, p))) => (a, Some(p)),
            (true, None) => return Err("expected ADDRESS,[PROTO:]PORT".into()),
            (false, Some(_)) => return Err("this set type takes no port".into()),
            (false, None) => (text, None),
        };
        let (ip_text, len_text) = match addr_text.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (addr_text, None),
        };
        let ip: IpAddr = match spec.family {
            Family::Ipv4 => ip_text.parse::<Ipv4Addr>().map(IpAddr::V4),
            Family::Ipv6 => ip_text.parse::<Ipv6Addr>().map(IpAddr::V6),
        }
        .map_err(|_| format!("{ip_text:?} is not an address of this set's family"))?;
        let w = width(spec.family);
        let prefix = match len_text {
            None => w,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|&l| l <= w && (l > 0 || !spec.kind.has_net()))
                .ok_or_else(|| format!("bad prefix length {l:?}"))?,
        };
        let bits = addr_bits(ip, spec.family).unwrap_or(0);
        // hash:net keeps the prefix; hash:ip expands it to hosts.
        let addrs: Vec<(u128, u8)> = if spec.kind.has_net() || prefix == w {
            vec![(mask(bits, prefix, spec.family), prefix)]
        } else {
            // `::/0` would shift by 128: no count, refused like any other too-large one.
            let count = 1u128.checked_shl(u32::from(w - prefix));
            let Some(count) = count.filter(|&c| c <= MAX_EXPAND) else {
                return Err(format!("/{prefix} expands to more than {MAX_EXPAND} hosts"));
            };
            let base = mask(bits, prefix, spec.family);
            (0..count).map(|i| (base + i, w)).collect()
        };
        let ports: Vec<(u8, u16)> = match port_text {
            None => vec![(0, 0)],
            Some(p) => {
                let (proto, range) = match p.split_once(':') {
                    Some((name, r)) => (
                        proto_number(name)
                            .ok_or_else(|| format!("unsupported protocol {name:?}"))?,
                        r,
                    ),
                    None => (6, p),
                };
                let port = |s: &str| s.parse::<u16>().map_err(|_| format!("bad port {s:?}"));
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (port(lo)?, port(hi)?),
                    None => (port(range)?, port(range)?),
                };
                if lo > hi {
                    return Err(format!("bad port range {range:?}"));
                }
                (lo..=hi).map(|port| (proto, port)).collect()
            }
        };
        if addrs.len() as u128 * ports.len() as u128 > MAX_EXPAND {
            return Err(format!("expands to more than {MAX_EXPAND} elements"));
        }
        Ok(addrs
            .iter()
            .flat_map(|&(addr, prefix)| {
                ports.iter().map(move |&(proto, port)| Element {
                    addr,
                    prefix,
                    proto,
                    port,
                    verdict: 0,
                })
            })
            .collect())
    }

    /// The element in `ipset save` syntax.
    pub fn display(&self, spec: &SetSpec) -> String {
        if spec.kind.port_only() {
            let mut s = self.port.to_string();
            if self.verdict != 0 {
                s.push_str(" : ");
                s.push_str(&crate::sets::verdict::text(self.verdict));
            }
            return s;
        }
        let ip = match spec.family {
            Family::Ipv4 => IpAddr::V4(Ipv4Addr::from(self.addr as u32)),
            Family::Ipv6 => IpAddr::V6(Ipv6Addr::from(self.addr)),
        };
        let mut s = ip.to_string();
        if self.prefix != width(spec.family) {
            s.push_str(&format!("/{}", self.prefix));
        }
        if spec.kind.has_port() {
            let proto = proto_name(self.proto).unwrap_or("tcp");
            s.push_str(&format!(",{proto}:{}", self.port));
        }
        if self.verdict != 0 {
            s.push_str(" : ");
            s.push_str(&crate::sets::verdict::text(self.verdict));
        }
        s
    }
}

/// Options of one element to add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddOptions {
    /// `timeout N` (seconds; 0 = never expires); `None` takes the set's default.
    pub timeout: Option<u32>,
    /// Initial `(packets, bytes)` (as `ipset restore` gives them).
    pub counters: Option<(u64, u64)>,
}
