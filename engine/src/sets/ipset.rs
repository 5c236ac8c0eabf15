//! ipset-style sets: `hash:ip`, `hash:net`, `hash:ip,port`, `hash:net,port`, one family each,
//! with optional per-element timeouts and counters, managed by a [`SetManager`] without a
//! ruleset commit.
//!
//! # Lock-free reads (RCU by `arc-swap`)
//!
//! A set's elements live in an immutable `Content` (an Fx hash table plus the list of prefix
//! lengths present). A [`SetHandle`] is the shared cell the compiled snapshot holds (as
//! `Arc<dyn IpSet>`); it keeps the current content in an [`ArcSwap`]. The packet path does
//! `content.load()` (lock-free: a thread-local debt slot, no lock, no allocation), probes the
//! table and drops the guard. Writers (all serialized by the manager's mutex) clone the
//! content, change the clone and `store` it: copy-on-write, one publication per call, so
//! callers should batch (`add`/`delete` take many elements). A reader sees either the old or
//! the new table, never a half-applied batch. The old table is freed when its last reader
//! drops its guard.
//!
//! # Swap
//!
//! [`SetManager::swap`] exchanges the *contents* (elements and options) of two cells; the cells
//! stay under their names, so every handle a compiled snapshot already holds for `A` sees `B`'s
//! former elements from then on. Each cell flips atomically; a packet that tests both sets
//! during the swap may see both pointing at the same content for a moment (two stores).
//! Only sets of the same type and family can be swapped (as ipset), so a compiled
//! `--match-set` never sees its dimension change.
//!
//! # Destroy
//!
//! [`SetManager::destroy`] removes the name; snapshots still holding the handle keep matching
//! against its last content. Refusing to destroy a set that a committed ruleset references is
//! the caller's job (the server knows the rulesets); [`SetManager::handle_count`] helps.
//!
//! # Counters
//!
//! With `counters`, each element has packet/byte counters shared by every version of the table
//! (an `Arc` the copy-on-write clone keeps), bumped with relaxed atomics on a match.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;

use super::IpSet;
use crate::echo::quoted;
use crate::model::{Family, SetDir};
use crate::packet::PacketMeta;

/// Longest set name in bytes (IPSET_MAXNAMELEN - 1).
pub const MAX_NAME_LEN: usize = 31;

/// The one grammar of set names, for creating a set (API, `ipset restore` text) and for
/// naming it in a rule (`-m set --match-set NAME`): 1 to [`MAX_NAME_LEN`] bytes (ipset's
/// limit), not starting with `-` (the rule parser would read an option), without whitespace,
/// control characters, `"` or `\` (none survives a rule or `ipset save` line). A name that
/// fails here could be created but never used in a rule.
///
/// Errors: what is wrong, for a message (`set name "-x": ...`).
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        Err("a set name has 1 to 31 bytes")
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
const MAX_EXPAND: u128 = 65536;

const NS_PER_S: u64 = 1_000_000_000;

/// Errors of [`SetManager`] operations.
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
}

impl SetType {
    /// The ipset name (`hash:ip`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashNet => "hash:net",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashNetPort => "hash:net,port",
        }
    }

    /// The type named `name`.
    pub fn from_name(name: &str) -> Option<SetType> {
        [
            SetType::HashIp,
            SetType::HashNet,
            SetType::HashIpPort,
            SetType::HashNetPort,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    fn has_net(self) -> bool {
        matches!(self, SetType::HashNet | SetType::HashNetPort)
    }

    fn has_port(self) -> bool {
        matches!(self, SetType::HashIpPort | SetType::HashNetPort)
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

fn expiry(default: Option<u32>, add: &AddOptions, now: u64) -> u64 {
    match add.timeout.or(default) {
        Some(t) if t > 0 => now.saturating_add(u64::from(t).saturating_mul(NS_PER_S)),
        _ => u64::MAX,
    }
}

// === Element ===

/// One exact element: address (masked to `prefix`), and protocol/port on `*,port` types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    /// Address bits (an IPv4 address in the low 32 bits), masked to `prefix`.
    addr: u128,
    /// Prefix length (32/128 on `hash:ip*`).
    prefix: u8,
    /// IP protocol (0 on types without port).
    proto: u8,
    /// Port (0 on types without port).
    port: u16,
}

fn width(family: Family) -> u8 {
    match family {
        Family::Ipv4 => 32,
        Family::Ipv6 => 128,
    }
}

fn mask(addr: u128, prefix: u8, family: Family) -> u128 {
    let w = width(family);
    if prefix == 0 {
        0
    } else {
        addr & ((u128::MAX >> (128 - u32::from(w))) & !((1u128 << (w - prefix)) - 1))
    }
}

fn addr_bits(ip: IpAddr, family: Family) -> Option<u128> {
    match (ip, family) {
        (IpAddr::V4(a), Family::Ipv4) => Some(u128::from(u32::from(a))),
        (IpAddr::V6(a), Family::Ipv6) => Some(u128::from(a)),
        _ => None,
    }
}

fn proto_name(proto: u8) -> Option<&'static str> {
    match proto {
        6 => Some("tcp"),
        17 => Some("udp"),
        132 => Some("sctp"),
        136 => Some("udplite"),
        _ => None,
    }
}

fn proto_number(name: &str) -> Option<u8> {
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
        }
    }

    /// Parses ipset element syntax for `spec` (`192.0.2.1`, `10.0.0.0/8`, `2001:db8::/32`,
    /// `192.0.2.1,tcp:80`, `10.0.0.0/8,udp:53-54`; a port without protocol is tcp). On
    /// `hash:ip*` a CIDR or a port range expands to its elements (at most 65536).
    pub fn parse(spec: &SetSpec, text: &str) -> Result<Vec<Element>, String> {
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
                })
            })
            .collect())
    }

    /// The element in `ipset save` syntax.
    pub fn display(&self, spec: &SetSpec) -> String {
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
        s
    }
}

// === Content ===

/// Packet and byte counters of one element.
#[derive(Debug, Default)]
struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Expiry in ns of the caller's clock; `u64::MAX` never expires.
    expires: u64,
    counters: Option<Arc<Counters>>,
}

/// Options that travel with the content (and so with `swap`, as in ipset).
#[derive(Debug, Clone, Copy)]
struct Options {
    timeout: Option<u32>,
    counters: bool,
    maxelem: u32,
    hashsize: u32,
}

/// One immutable version of a set's elements.
#[derive(Debug, Clone)]
struct Content {
    opts: Options,
    map: FxHashMap<Element, Entry>,
    /// How many elements have each prefix length.
    prefix_counts: BTreeMap<u8, u32>,
    /// Distinct prefix lengths present, longest first (the probe order of a lookup).
    prefixes: Box<[u8]>,
}

impl Content {
    fn new(spec: &SetSpec) -> Content {
        Content {
            opts: Options {
                timeout: spec.timeout,
                counters: spec.counters,
                maxelem: spec.maxelem,
                hashsize: spec.hashsize,
            },
            map: FxHashMap::default(),
            prefix_counts: BTreeMap::new(),
            prefixes: Box::new([]),
        }
    }

    fn insert(&mut self, e: Element, entry: Entry) {
        if self.map.insert(e, entry).is_none() {
            *self.prefix_counts.entry(e.prefix).or_insert(0) += 1;
        }
    }

    fn remove(&mut self, e: &Element) -> bool {
        if self.map.remove(e).is_none() {
            return false;
        }
        if let Some(n) = self.prefix_counts.get_mut(&e.prefix) {
            *n -= 1;
            if *n == 0 {
                self.prefix_counts.remove(&e.prefix);
            }
        }
        true
    }

    /// Recomputes the probe order; call before publishing.
    fn seal(mut self) -> Arc<Content> {
        self.prefixes = self.prefix_counts.keys().rev().copied().collect();
        Arc::new(self)
    }

    /// The live entry matching a packet's key: longest prefix first (as ipset's hash:net).
    #[inline]
    fn find(&self, addr: u128, proto: u8, port: u16, family: Family, now: u64) -> Option<&Entry> {
        self.prefixes.iter().find_map(|&prefix| {
            let key = Element {
                addr: mask(addr, prefix, family),
                prefix,
                proto,
                port,
            };
            self.map.get(&key).filter(|e| now < e.expires)
        })
    }
}

// === SetHandle ===

/// The shared cell a compiled snapshot holds for one set name.
pub struct SetHandle {
    kind: SetType,
    family: Family,
    content: ArcSwap<Content>,
}

impl fmt::Debug for SetHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetHandle")
            .field("kind", &self.kind)
            .field("family", &self.family)
            .field("len", &self.content.load().map.len())
            .finish()
    }
}

impl SetHandle {
    fn spec(&self, c: &Content) -> SetSpec {
        SetSpec {
            kind: self.kind,
            family: self.family,
            timeout: c.opts.timeout,
            counters: c.opts.counters,
            maxelem: c.opts.maxelem,
            hashsize: c.opts.hashsize,
        }
    }

    /// Whether `element` is in the set at `now` (as `ipset test`; counts no packet).
    pub fn test(&self, element: &Element, now: u64) -> bool {
        self.content
            .load()
            .map
            .get(element)
            .is_some_and(|e| now < e.expires)
    }
}

impl IpSet for SetHandle {
    fn contains(&self, packet: &PacketMeta, dirs: &[SetDir], now: u64) -> bool {
        let dir_ip = match dirs.first() {
            Some(SetDir::Src) => packet.src,
            Some(SetDir::Dst) | None => packet.dst,
        };
        let Some(addr) = addr_bits(dir_ip, self.family) else {
            return false;
        };
        let (proto, port) = if self.kind.has_port() {
            if proto_name(packet.protocol).is_none() || packet.fragment {
                return false;
            }
            // Fewer flags than dimensions is refused by validation; reuse the last one.
            let port = match dirs.get(1).or(dirs.last()) {
                Some(SetDir::Src) => packet.sport,
                Some(SetDir::Dst) | None => packet.dport,
            };
            (packet.protocol, port)
        } else {
            (0, 0)
        };
        // Lock-free: arc-swap's load takes a debt slot, no lock, no allocation.
        let content = self.content.load();
        let Some(entry) = content.find(addr, proto, port, self.family, now) else {
            return false;
        };
        if let Some(c) = &entry.counters {
            // Relaxed: statistics only; nothing else is published through them.
            c.packets.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(u64::from(packet.len), Ordering::Relaxed);
        }
        true
    }

    fn dimensions(&self) -> usize {
        if self.kind.has_port() { 2 } else { 1 }
    }
}

// === SetManager ===

/// One element as listed: element, seconds left (with timeouts), counters (with counters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedElement {
    /// The element.
    pub element: Element,
    /// Its text (`ipset save` syntax).
    pub text: String,
    /// Seconds until expiry (rounded up; 0 = never), when the set has timeouts.
    pub timeout: Option<u64>,
    /// `(packets, bytes)`, when the set has counters.
    pub counters: Option<(u64, u64)>,
}

/// A set as `ipset list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetInfo {
    /// Name.
    pub name: String,
    /// Type, family and options.
    pub spec: SetSpec,
    /// Live elements, sorted.
    pub elements: Vec<ListedElement>,
}

/// Options of one element to add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddOptions {
    /// `timeout N` (seconds; 0 = never expires); `None` takes the set's default.
    pub timeout: Option<u32>,
    /// Initial `(packets, bytes)` (as `ipset restore` gives them).
    pub counters: Option<(u64, u64)>,
}

/// The registry of ipset-style sets. Writers are serialized by one mutex; readers (the packet
/// path, through handles) never take it. Implements [`SetRegistry`](super::SetRegistry).
#[derive(Debug, Default)]
pub struct SetManager {
    sets: Mutex<BTreeMap<String, Arc<SetHandle>>>,
    /// The node's address facts that `-m addrtype` reads (empty until its owner fills them).
    node_addrs: Arc<crate::node_addrs::NodeAddrs>,
    /// The hooks the node's packet path evaluates, once its owner has said
    /// ([`SetManager::set_reached_hooks`]).
    reached_hooks: std::sync::RwLock<Option<Arc<crate::validate::ReachedHooks>>>,
}

impl super::SetRegistry for SetManager {
    fn lookup(&self, name: &str) -> Option<Arc<dyn IpSet>> {
        self.handle(name).map(|h| h as Arc<dyn IpSet>)
    }

    fn node_addrs(&self) -> Option<Arc<crate::node_addrs::NodeAddrs>> {
        Some(self.node_addrs.clone())
    }

    fn reached_hooks(&self) -> Option<Arc<crate::validate::ReachedHooks>> {
        self.reached_hooks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A staged change of one set, published by [`Staged::publish`].
pub(super) struct Staged {
    pub(super) handle: Arc<SetHandle>,
    content: Content,
    /// With [`Staged::logged`]: every element added, with its expiry.
    log: Option<Vec<(Element, u64)>>,
}

impl SetManager {
    /// An empty manager.
    pub fn new() -> SetManager {
        SetManager::default()
    }

    /// The node's address facts compiled `-m addrtype` matches read; replace them with
    /// [`NodeAddrs::replace`](crate::node_addrs::NodeAddrs::replace) when the host's
    /// addresses change.
    pub fn node_addrs(&self) -> &Arc<crate::node_addrs::NodeAddrs> {
        &self.node_addrs
    }

    /// Says which hooks the node's packet path evaluates, for validation's
    /// [`crate::validate::ViolationKind::HookNotReached`] warnings (`None`: unknown, no
    /// warning).
    pub fn set_reached_hooks(&self, hooks: Option<crate::validate::ReachedHooks>) {
        *self
            .reached_hooks
            .write()
            .unwrap_or_else(|e| e.into_inner()) = hooks.map(Arc::new);
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Arc<SetHandle>>> {
        // A writer that panicked left the map itself consistent (contents are published whole).
        self.sets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The handle of `name` (what a compiled snapshot keeps).
    pub fn handle(&self, name: &str) -> Option<Arc<SetHandle>> {
        self.lock().get(name).cloned()
    }

    /// How many handles of `name` exist besides the manager's own (compiled snapshots, ...);
    /// `None` when the set does not exist.
    pub fn handle_count(&self, name: &str) -> Option<usize> {
        self.lock().get(name).map(|h| Arc::strong_count(h) - 1)
    }

    /// Set names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Creates an empty set.
    pub fn create(&self, name: &str, spec: SetSpec) -> Result<(), SetError> {
        let mut sets = self.lock();
        Self::create_locked(&mut sets, name, spec)
    }

    pub(super) fn create_locked(
        sets: &mut BTreeMap<String, Arc<SetHandle>>,
        name: &str,
        spec: SetSpec,
    ) -> Result<(), SetError> {
        check_name(name).map_err(|why| SetError::BadName(name.into(), why))?;
        if sets.contains_key(name) {
            return Err(SetError::Exists(name.into()));
        }
        let handle = SetHandle {
            kind: spec.kind,
            family: spec.family,
            content: ArcSwap::new(Content::new(&spec).seal()),
        };
        sets.insert(name.into(), Arc::new(handle));
        Ok(())
    }

    /// Removes the set's name. Handles still held keep its last content (see module docs).
    pub fn destroy(&self, name: &str) -> Result<(), SetError> {
        self.lock()
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| SetError::NotFound(name.into()))
    }

    /// Parses element texts for set `name` (see [`Element::parse`]).
    pub fn parse_elements(&self, name: &str, texts: &[&str]) -> Result<Vec<Element>, SetError> {
        let h = self
            .handle(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        let spec = h.spec(&h.content.load());
        let mut out = Vec::new();
        for t in texts {
            out.extend(
                Element::parse(&spec, t).map_err(|reason| SetError::BadElement {
                    set: name.into(),
                    element: (*t).into(),
                    reason,
                })?,
            );
        }
        Ok(out)
    }

    /// Adds elements in one publication (all or none). An element already present gets its
    /// timeout renewed and keeps its counters (as `ipset add -exist`).
    pub fn add(
        &self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, AddOptions)>,
        now: u64,
    ) -> Result<(), SetError> {
        let sets = self.lock();
        let mut st = Self::stage(&sets, name)?;
        st.add(name, elements, now)?;
        st.publish();
        Ok(())
    }

    /// Adds element texts with default options (convenience over [`SetManager::add`]).
    pub fn add_str(&self, name: &str, texts: &[&str], now: u64) -> Result<(), SetError> {
        let elements = self.parse_elements(name, texts)?;
        self.add(
            name,
            elements.into_iter().map(|e| (e, AddOptions::default())),
            now,
        )
    }

    /// Adds `add` and deletes `delete` in one publication (readers see both or neither);
    /// returns how many deleted elements were present. Deletions apply after additions.
    pub fn update(
        &self,
        name: &str,
        add: impl IntoIterator<Item = (Element, AddOptions)>,
        delete: impl IntoIterator<Item = Element>,
        now: u64,
    ) -> Result<usize, SetError> {
        let sets = self.lock();
        let p = Self::prepare_locked(&sets, name, add, delete, now)?;
        let n = p.deleted;
        p.publish();
        Ok(n)
    }

    /// As [`SetManager::update`], but returns the change unpublished (see [`Prepared`] for
    /// the caller's part). Errors as `update`; on error nothing is staged.
    pub fn prepare_update(
        &self,
        name: &str,
        add: impl IntoIterator<Item = (Element, AddOptions)>,
        delete: impl IntoIterator<Item = Element>,
        now: u64,
    ) -> Result<Prepared, SetError> {
        let sets = self.lock();
        Self::prepare_locked(&sets, name, add, delete, now)
    }

    fn prepare_locked(
        sets: &BTreeMap<String, Arc<SetHandle>>,
        name: &str,
        add: impl IntoIterator<Item = (Element, AddOptions)>,
        delete: impl IntoIterator<Item = Element>,
        now: u64,
    ) -> Result<Prepared, SetError> {
        let mut st = Self::stage(sets, name)?;
        st.add(name, add, now)?;
        let deleted = delete.into_iter().filter(|e| st.content.remove(e)).count();
        Ok(Prepared {
            staged: st,
            deleted,
        })
    }

    /// Adds elements with absolute expiries (ns on the caller's clock, `u64::MAX` never) and
    /// fresh counters, in one publication (all or none): how a persisted set is loaded back.
    ///
    /// Errors: [`SetError::NotFound`], [`SetError::Full`].
    pub fn load(
        &self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, u64)>,
    ) -> Result<(), SetError> {
        let sets = self.lock();
        let mut st = Self::stage(&sets, name)?;
        st.insert_until(name, elements)?;
        st.publish();
        Ok(())
    }

    /// The header of `name`.
    pub fn summary(&self, name: &str) -> Option<SetSummary> {
        let sets = self.lock();
        sets.get(name).map(|h| Self::summary_of(name, h))
    }

    /// The headers of every set, by name.
    pub fn summaries(&self) -> Vec<SetSummary> {
        let sets = self.lock();
        sets.iter().map(|(n, h)| Self::summary_of(n, h)).collect()
    }

    fn summary_of(name: &str, h: &SetHandle) -> SetSummary {
        let c = h.content.load();
        SetSummary {
            name: name.into(),
            spec: h.spec(&c),
            entries: c.map.len(),
        }
    }

    /// Deletes elements in one publication; returns how many were present.
    pub fn delete(
        &self,
        name: &str,
        elements: impl IntoIterator<Item = Element>,
    ) -> Result<usize, SetError> {
        let sets = self.lock();
        let mut st = Self::stage(&sets, name)?;
        let n = elements
            .into_iter()
            .filter(|e| st.content.remove(e))
            .count();
        st.publish();
        Ok(n)
    }

    /// Deletes element texts (convenience over [`SetManager::delete`]).
    pub fn delete_str(&self, name: &str, texts: &[&str]) -> Result<usize, SetError> {
        let elements = self.parse_elements(name, texts)?;
        self.delete(name, elements)
    }

    /// Removes every element.
    pub fn flush(&self, name: &str) -> Result<(), SetError> {
        let sets = self.lock();
        let h = sets
            .get(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        let spec = h.spec(&h.content.load());
        h.content.store(Content::new(&spec).seal());
        Ok(())
    }

    /// Exchanges the contents (elements and options) of two sets of the same type and family;
    /// existing handles see the exchanged contents (see module docs).
    pub fn swap(&self, a: &str, b: &str) -> Result<(), SetError> {
        let sets = self.lock();
        let ha = sets.get(a).ok_or_else(|| SetError::NotFound(a.into()))?;
        let hb = sets.get(b).ok_or_else(|| SetError::NotFound(b.into()))?;
        if ha.kind != hb.kind || ha.family != hb.family {
            return Err(SetError::Incompatible(a.into(), b.into()));
        }
        let ca = ha.content.load_full();
        let cb = hb.content.swap(ca);
        ha.content.store(cb);
        Ok(())
    }

    /// Frees expired elements (matching already ignores them); returns how many.
    pub fn gc(&self, now: u64) -> usize {
        let sets = self.lock();
        let mut freed = 0;
        for h in sets.values() {
            let cur = h.content.load();
            if cur.map.values().all(|e| now < e.expires) {
                continue;
            }
            let mut c = Content::clone(&cur);
            let dead: Vec<Element> = c
                .map
                .iter()
                .filter(|(_, e)| now >= e.expires)
                .map(|(k, _)| *k)
                .collect();
            for k in &dead {
                c.remove(k);
            }
            freed += dead.len();
            h.content.store(c.seal());
        }
        freed
    }

    /// The set as `ipset list` shows it at `now` (live elements only, sorted).
    pub fn list(&self, name: &str, now: u64) -> Result<SetInfo, SetError> {
        let sets = self.lock();
        Self::list_locked(&sets, name, now)
    }

    pub(super) fn list_locked(
        sets: &BTreeMap<String, Arc<SetHandle>>,
        name: &str,
        now: u64,
    ) -> Result<SetInfo, SetError> {
        let h = sets
            .get(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        let c = h.content.load();
        let spec = h.spec(&c);
        let mut elements: Vec<ListedElement> = c
            .map
            .iter()
            .filter(|(_, e)| now < e.expires)
            .map(|(k, e)| ListedElement {
                element: *k,
                text: k.display(&spec),
                timeout: spec.timeout.map(|_| {
                    if e.expires == u64::MAX {
                        0
                    } else {
                        (e.expires - now).div_ceil(NS_PER_S)
                    }
                }),
                counters: e.counters.as_ref().map(|c| {
                    (
                        c.packets.load(Ordering::Relaxed),
                        c.bytes.load(Ordering::Relaxed),
                    )
                }),
            })
            .collect();
        elements.sort_by_key(|e| e.element);
        Ok(SetInfo {
            name: name.into(),
            spec,
            elements,
        })
    }

    /// A copy of `name`'s content to change and publish later.
    pub(super) fn stage(
        sets: &BTreeMap<String, Arc<SetHandle>>,
        name: &str,
    ) -> Result<Staged, SetError> {
        let h = sets
            .get(name)
            .ok_or_else(|| SetError::NotFound(name.into()))?;
        Ok(Staged {
            handle: Arc::clone(h),
            content: Content::clone(&h.content.load()),
            log: None,
        })
    }
}

impl Staged {
    pub(super) fn spec(&self) -> SetSpec {
        self.handle.spec(&self.content)
    }

    pub(super) fn add(
        &mut self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, AddOptions)>,
        now: u64,
    ) -> Result<(), SetError> {
        let opts = self.content.opts;
        for (e, add) in elements {
            // As ipset: per-element options need the set to have been created with them.
            let unsupported = if add.timeout.is_some() && opts.timeout.is_none() {
                Some("the set was created without timeout")
            } else if add.counters.is_some() && !opts.counters {
                Some("the set was created without counters")
            } else {
                None
            };
            if let Some(reason) = unsupported {
                return Err(SetError::BadElement {
                    set: name.into(),
                    element: e.display(&self.spec()),
                    reason: reason.into(),
                });
            }
            let expires = expiry(opts.timeout, &add, now);
            // Explicit counters go into fresh ones: the old `Arc` is shared with the published
            // content, and writing it now would change the live set before (or without) a
            // publish. Otherwise the element keeps its counters.
            let old = self.content.map.get(&e).and_then(|o| o.counters.clone());
            let counters = opts.counters.then(|| match add.counters {
                Some((p, b)) => Arc::new(Counters {
                    packets: AtomicU64::new(p),
                    bytes: AtomicU64::new(b),
                }),
                None => old.unwrap_or_default(),
            });
            let present = self.content.map.contains_key(&e);
            if !present && self.content.map.len() >= opts.maxelem as usize {
                return Err(SetError::Full {
                    set: name.into(),
                    maxelem: opts.maxelem,
                });
            }
            self.content.insert(e, Entry { expires, counters });
            if let Some(log) = &mut self.log {
                log.push((e, expires));
            }
        }
        Ok(())
    }

    /// Inserts elements with absolute expiries (ns; `u64::MAX` never), fresh counters.
    fn insert_until(
        &mut self,
        name: &str,
        elements: impl IntoIterator<Item = (Element, u64)>,
    ) -> Result<(), SetError> {
        let opts = self.content.opts;
        for (e, expires) in elements {
            if !self.content.map.contains_key(&e) && self.content.map.len() >= opts.maxelem as usize
            {
                return Err(SetError::Full {
                    set: name.into(),
                    maxelem: opts.maxelem,
                });
            }
            let counters = opts.counters.then(Arc::default);
            self.content.insert(e, Entry { expires, counters });
        }
        Ok(())
    }

    /// Keeps a log of every element [`Staged::add`] inserts, with its expiry.
    pub(super) fn logged(mut self) -> Staged {
        self.log = Some(Vec::new());
        self
    }

    /// The logged additions (empty unless [`Staged::logged`]).
    pub(super) fn log(&self) -> &[(Element, u64)] {
        self.log.as_deref().unwrap_or(&[])
    }

    pub(super) fn publish(self) {
        self.handle.content.store(self.content.seal());
    }
}

// === Prepared ===

/// A change of one set, checked against its content and built on a private copy, not yet
/// visible to readers: [`SetManager::prepare_update`] makes it, [`Prepared::publish`] makes
/// it visible in one store; dropping it discards it. This lets a caller make the change
/// durable elsewhere (the server's SQLite store) between the check and the publication.
///
/// Contract: between prepare and publish the caller keeps every other writer of this set
/// out (the server holds its write lock); a publish overwrites changes made in between.
pub struct Prepared {
    staged: Staged,
    deleted: usize,
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("len", &self.staged.content.map.len())
            .field("deleted", &self.deleted)
            .finish()
    }
}

impl Prepared {
    /// How many of the elements to delete were present.
    pub fn deleted(&self) -> usize {
        self.deleted
    }

    /// The set's spec.
    pub fn spec(&self) -> SetSpec {
        self.staged.spec()
    }

    /// Makes the change visible (one atomic store; readers see all of it or none).
    pub fn publish(self) {
        self.staged.publish();
    }
}

/// A set's header as `ipset list -terse` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSummary {
    /// Name.
    pub name: String,
    /// Type, family and options.
    pub spec: SetSpec,
    /// Elements held, including expired ones not yet freed by [`SetManager::gc`] (as ipset's
    /// "Number of entries").
    pub entries: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sets::SetRegistry;

    fn pkt(src: &str, dst: &str, proto: u8, sport: u16, dport: u16) -> PacketMeta {
        let src: IpAddr = src.parse().unwrap();
        PacketMeta {
            family: if src.is_ipv6() {
                Family::Ipv6
            } else {
                Family::Ipv4
            },
            src,
            dst: dst.parse().unwrap(),
            protocol: proto,
            sport,
            dport,
            len: 100,
            ..PacketMeta::default()
        }
    }

    fn mgr(name: &str, kind: SetType, family: Family, elems: &[&str]) -> SetManager {
        let m = SetManager::new();
        m.create(name, SetSpec::new(kind, family)).unwrap();
        m.add_str(name, elems, 0).unwrap();
        m
    }

    const SRC: &[SetDir] = &[SetDir::Src];
    const SRC_DST: &[SetDir] = &[SetDir::Src, SetDir::Dst];

    #[test]
    fn hash_ip_v4_v6() {
        let m = mgr(
            "a",
            SetType::HashIp,
            Family::Ipv4,
            &["192.0.2.1", "10.0.0.0/30"],
        );
        let s = m.lookup("a").unwrap();
        assert_eq!(s.dimensions(), 1);
        for (ip, hit) in [
            ("192.0.2.1", true),
            ("192.0.2.2", false),
            ("10.0.0.3", true),
            ("10.0.0.4", false),
        ] {
            assert_eq!(
                s.contains(&pkt(ip, "1.1.1.1", 6, 1, 2), SRC, 0),
                hit,
                "{ip}"
            );
        }
        assert_eq!(m.list("a", 0).unwrap().elements.len(), 5);
        // Wrong family never matches.
        assert!(!s.contains(&pkt("::1", "::2", 6, 1, 2), SRC, 0));

        let m = mgr("b", SetType::HashIp, Family::Ipv6, &["2001:db8::1"]);
        let s = m.lookup("b").unwrap();
        assert!(s.contains(&pkt("2001:db8::1", "::2", 6, 1, 2), SRC, 0));
        assert!(!s.contains(&pkt("2001:db8::2", "::2", 6, 1, 2), SRC, 0));
        assert!(!s.contains(&pkt("::2", "2001:db8::1", 6, 1, 2), SRC, 0));
        assert!(s.contains(&pkt("::2", "2001:db8::1", 6, 1, 2), &[SetDir::Dst], 0));
        assert!(m.add_str("b", &["192.0.2.1"], 0).is_err());
    }

    #[test]
    fn hash_net_several_prefixes() {
        let m = mgr(
            "n",
            SetType::HashNet,
            Family::Ipv4,
            &[
                "10.0.0.0/8",
                "172.16.5.0/24",
                "192.0.2.77",
                "198.51.100.128/25",
            ],
        );
        let s = m.lookup("n").unwrap();
        for (ip, hit) in [
            ("10.255.1.1", true),
            ("11.0.0.1", false),
            ("172.16.5.200", true),
            ("172.16.6.1", false),
            ("192.0.2.77", true),
            ("192.0.2.78", false),
            ("198.51.100.200", true),
            ("198.51.100.127", false),
        ] {
            assert_eq!(
                s.contains(&pkt("1.1.1.1", ip, 6, 1, 2), &[SetDir::Dst], 0),
                hit,
                "{ip}"
            );
        }
        // Deleting the /8 leaves the others.
        assert_eq!(m.delete_str("n", &["10.0.0.0/8"]).unwrap(), 1);
        assert!(!s.contains(&pkt("1.1.1.1", "10.1.1.1", 6, 1, 2), &[SetDir::Dst], 0));
        assert!(s.contains(&pkt("1.1.1.1", "192.0.2.77", 6, 1, 2), &[SetDir::Dst], 0));

        let m = mgr(
            "n6",
            SetType::HashNet,
            Family::Ipv6,
            &["2001:db8::/32", "fd00:1::/64"],
        );
        let s = m.lookup("n6").unwrap();
        assert!(s.contains(&pkt("2001:db8:ffff::1", "::1", 6, 1, 2), SRC, 0));
        assert!(s.contains(&pkt("fd00:1::9", "::1", 6, 1, 2), SRC, 0));
        assert!(!s.contains(&pkt("fd00:1:0:1::9", "::1", 6, 1, 2), SRC, 0));
        assert!(!s.contains(&pkt("2001:db9::1", "::1", 6, 1, 2), SRC, 0));
    }

    #[test]
    fn port_types() {
        let m = mgr(
            "p",
            SetType::HashIpPort,
            Family::Ipv4,
            &[
                "192.0.2.1,tcp:80",
                "192.0.2.1,udp:53",
                "192.0.2.2,8000-8001",
            ],
        );
        let s = m.lookup("p").unwrap();
        assert_eq!(s.dimensions(), 2);
        let dst_dst = &[SetDir::Dst, SetDir::Dst];
        for (dst, proto, port, hit) in [
            ("192.0.2.1", 6, 80, true),
            ("192.0.2.1", 17, 80, false),
            ("192.0.2.1", 17, 53, true),
            ("192.0.2.2", 6, 8001, true),
            ("192.0.2.2", 6, 8002, false),
            ("192.0.2.3", 6, 80, false),
            ("192.0.2.1", 1, 80, false),
        ] {
            assert_eq!(
                s.contains(&pkt("1.1.1.1", dst, proto, 9, port), dst_dst, 0),
                hit,
                "{dst} {proto} {port}"
            );
        }
        // src address, dst port.
        assert!(s.contains(&pkt("192.0.2.1", "1.1.1.1", 6, 9, 80), SRC_DST, 0));
        assert!(!s.contains(&pkt("192.0.2.1", "1.1.1.1", 6, 80, 9), SRC_DST, 0));

        let m = mgr(
            "np",
            SetType::HashNetPort,
            Family::Ipv6,
            &["2001:db8::/48,udp:53", "2001:db8:1::/64,tcp:443"],
        );
        let s = m.lookup("np").unwrap();
        assert!(s.contains(
            &pkt("2001:db8:0:5::1", "::1", 17, 53, 9),
            &[SetDir::Src, SetDir::Src],
            0
        ));
        assert!(!s.contains(
            &pkt("2001:db8:0:5::1", "::1", 6, 53, 9),
            &[SetDir::Src, SetDir::Src],
            0
        ));
        assert!(s.contains(
            &pkt("::1", "2001:db8:1::7", 6, 9, 443),
            &[SetDir::Dst, SetDir::Dst],
            0
        ));
        assert!(!s.contains(
            &pkt("::1", "2001:db8:1:1::7", 6, 9, 443),
            &[SetDir::Dst, SetDir::Dst],
            0
        ));
        let m4 = mgr(
            "np4",
            SetType::HashNetPort,
            Family::Ipv4,
            &["10.0.0.0/8,tcp:22"],
        );
        let s = m4.lookup("np4").unwrap();
        assert!(s.contains(&pkt("10.9.9.9", "1.1.1.1", 6, 9, 22), SRC_DST, 0));
        assert!(!s.contains(&pkt("10.9.9.9", "1.1.1.1", 6, 9, 23), SRC_DST, 0));
    }

    #[test]
    fn swap_is_visible_through_existing_handles() {
        let m = mgr("a", SetType::HashIp, Family::Ipv4, &["192.0.2.1"]);
        m.create("b", SetSpec::new(SetType::HashIp, Family::Ipv4))
            .unwrap();
        m.add_str("b", &["192.0.2.2"], 0).unwrap();
        let ha = m.lookup("a").unwrap();
        let hb = m.lookup("b").unwrap();
        let p1 = pkt("192.0.2.1", "1.1.1.1", 6, 1, 2);
        let p2 = pkt("192.0.2.2", "1.1.1.1", 6, 1, 2);
        assert!(ha.contains(&p1, SRC, 0) && !ha.contains(&p2, SRC, 0));
        m.swap("a", "b").unwrap();
        assert!(!ha.contains(&p1, SRC, 0) && ha.contains(&p2, SRC, 0));
        assert!(hb.contains(&p1, SRC, 0) && !hb.contains(&p2, SRC, 0));
        assert_eq!(m.handle_count("a"), Some(1));
        m.create("c", SetSpec::new(SetType::HashNet, Family::Ipv4))
            .unwrap();
        assert!(matches!(m.swap("a", "c"), Err(SetError::Incompatible(..))));
        m.flush("a").unwrap();
        assert!(!ha.contains(&p2, SRC, 0));
        m.destroy("a").unwrap();
        assert!(m.lookup("a").is_none());
        assert_eq!(m.destroy("a"), Err(SetError::NotFound("a".into())));
    }

    #[test]
    fn timeouts_follow_now() {
        let m = SetManager::new();
        let spec = SetSpec {
            timeout: Some(10),
            counters: true,
            ..SetSpec::new(SetType::HashIp, Family::Ipv4)
        };
        m.create("t", spec).unwrap();
        let s = m.lookup("t").unwrap();
        let sec = NS_PER_S;
        m.add_str("t", &["192.0.2.1"], 5 * sec).unwrap();
        let e = m.parse_elements("t", &["192.0.2.2", "192.0.2.3"]).unwrap();
        m.add(
            "t",
            [
                (
                    e[0],
                    AddOptions {
                        timeout: Some(0),
                        counters: None,
                    },
                ),
                (
                    e[1],
                    AddOptions {
                        timeout: Some(2),
                        counters: Some((7, 700)),
                    },
                ),
            ],
            5 * sec,
        )
        .unwrap();
        let p = |ip| pkt(ip, "1.1.1.1", 6, 1, 2);
        assert!(s.contains(&p("192.0.2.1"), SRC, 15 * sec - 1));
        assert!(!s.contains(&p("192.0.2.1"), SRC, 15 * sec));
        assert!(s.contains(&p("192.0.2.3"), SRC, 6 * sec));
        assert!(!s.contains(&p("192.0.2.3"), SRC, 7 * sec));
        assert!(s.contains(&p("192.0.2.2"), SRC, u64::MAX - 1));
        let l = m.list("t", 6 * sec).unwrap();
        assert_eq!(l.elements[0].timeout, Some(9));
        assert_eq!(l.elements[1].timeout, Some(0));
        assert_eq!(l.elements[2].timeout, Some(1));
        assert_eq!(l.elements[2].counters, Some((8, 800)));
        assert_eq!(m.gc(15 * sec), 2);
        assert_eq!(m.list("t", 0).unwrap().elements.len(), 1);
    }

    #[test]
    fn create_checks_and_maxelem() {
        let m = SetManager::new();
        let spec = SetSpec {
            maxelem: 2,
            ..SetSpec::new(SetType::HashIp, Family::Ipv4)
        };
        assert!(matches!(
            m.create(&"x".repeat(32), spec),
            Err(SetError::BadName(..))
        ));
        // Names no `--match-set` could name are refused at creation (found by review: `-x`
        // was created, and no rule could use it).
        for bad in ["-x", "a b", "q\"", "b\\s", "nul\0", ""] {
            assert!(
                matches!(m.create(bad, spec), Err(SetError::BadName(..))),
                "{bad:?}"
            );
        }
        let long = m.create(&"y".repeat(10_000), spec).unwrap_err().to_string();
        assert!(long.len() < 200, "{long}");
        m.create(&"x".repeat(31), spec).unwrap();
        m.create("m", spec).unwrap();
        assert_eq!(m.create("m", spec), Err(SetError::Exists("m".into())));
        m.add_str("m", &["192.0.2.1", "192.0.2.2"], 0).unwrap();
        assert!(matches!(
            m.add_str("m", &["192.0.2.3"], 0),
            Err(SetError::Full { .. })
        ));
        // Failed batch published nothing; re-adding is fine.
        m.add_str("m", &["192.0.2.1"], 0).unwrap();
        assert!(matches!(
            m.add_str("m", &["192.0.2.0/8"], 0),
            Err(SetError::BadElement { .. })
        ));
        assert_eq!(m.names().len(), 2);
    }

    #[test]
    fn prepared_changes_are_invisible_until_published() {
        let m = mgr("p", SetType::HashIp, Family::Ipv4, &["192.0.2.1"]);
        let s = m.lookup("p").unwrap();
        let e = m.parse_elements("p", &["192.0.2.2", "192.0.2.1"]).unwrap();
        let p = m
            .prepare_update("p", [(e[0], AddOptions::default())], [e[1]], 0)
            .unwrap();
        assert_eq!(p.deleted(), 1);
        let (a, b) = (
            pkt("192.0.2.1", "1.1.1.1", 6, 1, 2),
            pkt("192.0.2.2", "1.1.1.1", 6, 1, 2),
        );
        assert!(s.contains(&a, SRC, 0) && !s.contains(&b, SRC, 0));
        p.publish();
        assert!(!s.contains(&a, SRC, 0) && s.contains(&b, SRC, 0));
        // Dropped: nothing happens.
        drop(
            m.prepare_update("p", [(e[1], AddOptions::default())], [], 0)
                .unwrap(),
        );
        assert!(!s.contains(&a, SRC, 0));
        // Errors stage nothing.
        assert!(matches!(
            m.prepare_update("nope", [], [], 0),
            Err(SetError::NotFound(_))
        ));
    }

    #[test]
    fn load_keeps_absolute_expiries_and_summaries_count() {
        let m = SetManager::new();
        let spec = SetSpec {
            timeout: Some(100),
            maxelem: 2,
            ..SetSpec::new(SetType::HashNet, Family::Ipv4)
        };
        assert_eq!(spec.expiry(&AddOptions::default(), 5), 5 + 100 * NS_PER_S);
        assert_eq!(
            spec.expiry(
                &AddOptions {
                    timeout: Some(0),
                    counters: None
                },
                5
            ),
            u64::MAX
        );
        m.create("l", spec).unwrap();
        let e = m
            .parse_elements("l", &["10.0.0.0/8", "192.0.2.0/24"])
            .unwrap();
        m.load("l", [(e[0], 7 * NS_PER_S), (e[1], u64::MAX)])
            .unwrap();
        let s = m.lookup("l").unwrap();
        let p = pkt("10.1.1.1", "1.1.1.1", 6, 1, 2);
        assert!(s.contains(&p, SRC, 7 * NS_PER_S - 1));
        assert!(!s.contains(&p, SRC, 7 * NS_PER_S));
        let third = m.parse_elements("l", &["172.16.0.0/12"]).unwrap()[0];
        assert!(matches!(
            m.load("l", [(third, u64::MAX)]),
            Err(SetError::Full { .. })
        ));
        let sum = m.summary("l").unwrap();
        assert_eq!((sum.entries, sum.spec), (2, spec));
        assert_eq!(m.summaries().len(), 1);
        assert!(m.summary("x").is_none());
    }

    #[test]
    fn concurrent_readers_see_whole_batches() {
        // Each batch exchanges a /24 for a /32 inside it (or back), so 10.0.i.5 is covered in
        // every published version; a reader that saw half a batch (or a probe order that does
        // not belong to the table) would miss it. 10.1.0.1 is never touched.
        let m = Arc::new(mgr("c", SetType::HashNet, Family::Ipv4, &["10.1.0.1"]));
        for i in 0..64 {
            m.add_str("c", &[&format!("10.0.{i}.0/24")], 0).unwrap();
        }
        let s = m.lookup("c").unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let s = Arc::clone(&s);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut probes = 0u64;
                    while !stop.load(Ordering::Relaxed) || probes == 0 {
                        for i in 0..64u8 {
                            let p = pkt(&format!("10.0.{i}.5"), "1.1.1.1", 6, 1, 2);
                            assert!(s.contains(&p, SRC, 0), "10.0.{i}.5 uncovered");
                            probes += 1;
                        }
                        assert!(s.contains(&pkt("10.1.0.1", "1.1.1.1", 6, 1, 2), SRC, 0));
                    }
                    probes
                })
            })
            .collect();
        for round in 0..2000u32 {
            let i = round % 64;
            let net = m.parse_elements("c", &[&format!("10.0.{i}.0/24")]).unwrap()[0];
            let host = m.parse_elements("c", &[&format!("10.0.{i}.5")]).unwrap()[0];
            let (add, del) = if (round / 64) % 2 == 0 {
                (host, net)
            } else {
                (net, host)
            };
            // One batch: the new element is published together with the removal.
            m.update("c", [(add, AddOptions::default())], [del], 0)
                .unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        assert_eq!(m.list("c", 0).unwrap().elements.len(), 65);
    }

    /// `hash:ip` of family inet6 with a /0 (or any prefix that expands past 2^127 hosts) is
    /// refused like every other too-large CIDR, without a shift overflow.
    #[test]
    fn huge_ipv6_cidr_on_hash_ip_is_refused() {
        let spec = SetSpec::new(SetType::HashIp, Family::Ipv6);
        for text in ["::/0", "::/1", "2001:db8::/16", "2001:db8::/111"] {
            let r = Element::parse(&spec, text);
            assert!(r.is_err(), "{text}: {:?}", r.map(|v| v.len()));
        }
        assert_eq!(
            Element::parse(&spec, "2001:db8::/112").unwrap().len(),
            65536
        );
        let v4 = SetSpec::new(SetType::HashIp, Family::Ipv4);
        assert!(Element::parse(&v4, "0.0.0.0/0").is_err());
    }

    /// A failed change leaves every element's counters as they were: explicit counters on an
    /// element that is already there must not be written into the live (shared) counters
    /// before the change is published.
    #[test]
    fn failed_restore_leaves_counters_alone() {
        let m = SetManager::new();
        let mut spec = SetSpec::new(SetType::HashIp, Family::Ipv4);
        spec.counters = true;
        m.create("c", spec).unwrap();
        m.add_str("c", &["192.0.2.1"], 0).unwrap();
        let s = m.lookup("c").unwrap();
        assert!(s.contains(&pkt("192.0.2.1", "1.1.1.1", 6, 1, 2), SRC, 0));
        let before = m.list("c", 0).unwrap().elements[0].counters;
        assert_eq!(before, Some((1, 100)));
        let text = "add c 192.0.2.1 packets 5 bytes 6\nadd c not-an-address\n";
        assert!(m.restore(text, 0).is_err());
        assert_eq!(m.list("c", 0).unwrap().elements[0].counters, before);
        // A prepared update dropped unpublished changes nothing either.
        let e = m.parse_elements("c", &["192.0.2.1"]).unwrap()[0];
        let add = AddOptions {
            timeout: None,
            counters: Some((7, 8)),
        };
        drop(m.prepare_update("c", [(e, add)], [], 0).unwrap());
        assert_eq!(m.list("c", 0).unwrap().elements[0].counters, before);
        // Published, the counters are the given ones.
        m.add("c", [(e, add)], 0).unwrap();
        assert_eq!(m.list("c", 0).unwrap().elements[0].counters, Some((7, 8)));
    }
}
