//! Set contents: one copy of a set's elements (`Content`), the change writers make to it
//! (`Delta`), and the [`SetHandle`] the compiled snapshot holds, whose two copies live in a
//! [`LeftRight`] cell. `SetHandle::contains` is on the packet path: it may not allocate, lock
//! (inside a batch) or read a clock.
//!
//! # Probe
//!
//! Elements are keyed per family: an IPv4 element packs into one `u64` (address, prefix
//! length, protocol, port), an IPv6 one is the [`Element`] itself. A lookup masks the packet's
//! address to each prefix length present in the set, longest first, and probes the Fx hash
//! table once per length: `hash:ip*` sets have one length (one probe), `hash:net*` sets as
//! many as they hold (ipset's hash:net does the same walk over its `nets[]` array). A set
//! whose elements have no timeout and no counters (the common case) keeps keys only (8-byte
//! slots for IPv4), a third of the memory a probe walks through.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::dataplane::left_right::{Absorb, LeftRight, Readers};
use crate::model::{Family, SetDir};
use crate::packet::PacketMeta;
use crate::sets::IpSet;

use super::element::{Element, SetSpec, SetType, mask, proto_name};

// === Content ===

/// Packet and byte counters of one element.
#[derive(Debug, Default)]
pub(in crate::sets) struct Counters {
    pub(in crate::sets) packets: AtomicU64,
    pub(in crate::sets) bytes: AtomicU64,
}

/// One element's value. Both copies of a set hold the same `Arc<Counters>`, so a packet
/// counted through either copy counts once, in one place.
#[derive(Debug, Clone)]
pub(in crate::sets) struct Entry {
    /// Expiry in ns of the caller's clock; `u64::MAX` never expires.
    pub(in crate::sets) expires: u64,
    pub(in crate::sets) counters: Option<Arc<Counters>>,
    /// The element's verdict in a verdict map ([`crate::sets::verdict`]); 0 in a plain set.
    pub(in crate::sets) verdict: u32,
}

/// Options that travel with the content (and so with `swap`, as in ipset).
#[derive(Debug, Clone, Copy)]
pub(in crate::sets) struct Options {
    pub(in crate::sets) timeout: Option<u32>,
    pub(in crate::sets) counters: bool,
    pub(in crate::sets) maxelem: u32,
    pub(in crate::sets) hashsize: u32,
}

/// An IPv4 element as one word: address (32 bits), prefix length, protocol, port.
#[inline]
fn key_v4(addr: u32, prefix: u8, proto: u8, port: u16) -> u64 {
    (u64::from(addr) << 32) | (u64::from(prefix) << 24) | (u64::from(proto) << 16) | u64::from(port)
}

fn unkey_v4(k: u64) -> Element {
    Element {
        addr: u128::from((k >> 32) as u32),
        prefix: (k >> 24) as u8,
        proto: (k >> 16) as u8,
        port: k as u16,
        verdict: 0,
    }
}

/// The IPv4 address `addr` masked to `prefix` bits (0..=32).
#[inline]
fn mask_v4(addr: u32, prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        addr & (u32::MAX << (32 - u32::from(prefix.min(32))))
    }
}

/// The entry of every element of a [`Table::Keys`] table.
static NO_TIMEOUT_NO_COUNTERS: Entry = Entry {
    expires: u64::MAX,
    counters: None,
    verdict: 0,
};

/// A hash table of one family's keys: keys only while every element never expires and has no
/// counters or verdict, with entries once one does (it converts, once, when such an element
/// arrives).
#[derive(Debug, Clone)]
enum Table<K> {
    Keys(FxHashSet<K>),
    Entries(FxHashMap<K, Entry>),
}

impl<K: std::hash::Hash + Eq + Copy> Table<K> {
    fn new() -> Self {
        Table::Keys(FxHashSet::default())
    }

    fn len(&self) -> usize {
        match self {
            Table::Keys(t) => t.len(),
            Table::Entries(t) => t.len(),
        }
    }

    #[inline]
    fn get(&self, k: &K) -> Option<&Entry> {
        match self {
            Table::Keys(t) => t.contains(k).then_some(&NO_TIMEOUT_NO_COUNTERS),
            Table::Entries(t) => t.get(k),
        }
    }

    /// Whether `k` was new.
    fn insert(&mut self, k: K, entry: Entry) -> bool {
        if let Table::Keys(t) = self {
            if entry.expires == u64::MAX && entry.counters.is_none() && entry.verdict == 0 {
                return t.insert(k);
            }
            let keys = std::mem::take(t);
            *self = Table::Entries(
                keys.into_iter()
                    .map(|k| (k, NO_TIMEOUT_NO_COUNTERS.clone()))
                    .collect(),
            );
        }
        match self {
            Table::Entries(t) => t.insert(k, entry).is_none(),
            Table::Keys(_) => unreachable!("converted above"),
        }
    }

    /// Whether `k` was there.
    fn remove(&mut self, k: &K) -> bool {
        match self {
            Table::Keys(t) => t.remove(k),
            Table::Entries(t) => t.remove(k).is_some(),
        }
    }

    fn clear(&mut self) {
        *self = Table::new();
    }

    fn reserve(&mut self, n: usize) {
        match self {
            Table::Keys(t) => t.reserve(n),
            Table::Entries(t) => t.reserve(n),
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = (K, &Entry)> + '_> {
        match self {
            Table::Keys(t) => Box::new(t.iter().map(|&k| (k, &NO_TIMEOUT_NO_COUNTERS))),
            Table::Entries(t) => Box::new(t.iter().map(|(&k, v)| (k, v))),
        }
    }
}

/// One copy of a set's elements. The elements of one family only: `v4` or `v6` is empty.
#[derive(Debug, Clone)]
pub(in crate::sets) struct Content {
    pub(in crate::sets) opts: Options,
    family: Family,
    v4: Table<u64>,
    v6: Table<Element>,
    /// How many elements have each prefix length (index = length).
    prefix_counts: Box<[u32; 129]>,
    /// Distinct prefix lengths present, longest first (the probe order of a lookup).
    prefixes: Box<[u8]>,
}

impl Content {
    pub(in crate::sets) fn new(spec: &SetSpec) -> Content {
        Content {
            opts: Options {
                timeout: spec.timeout,
                counters: spec.counters,
                maxelem: spec.maxelem,
                hashsize: spec.hashsize,
            },
            family: spec.family,
            v4: Table::new(),
            v6: Table::new(),
            prefix_counts: Box::new([0; 129]),
            prefixes: Box::new([]),
        }
    }

    pub(in crate::sets) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub(in crate::sets) fn get(&self, e: &Element) -> Option<&Entry> {
        match self.family {
            Family::Ipv4 => self
                .v4
                .get(&key_v4(e.addr as u32, e.prefix, e.proto, e.port)),
            Family::Ipv6 => self.v6.get(e),
        }
    }

    /// Every element (with its verdict) and its entry (expired ones too), in no order.
    pub(in crate::sets) fn iter(&self) -> impl Iterator<Item = (Element, &Entry)> {
        (self.v4.iter().map(|(k, v)| (unkey_v4(k), v)))
            .chain(self.v6.iter())
            .map(|(k, v)| (k.with_verdict(v.verdict), v))
    }

    fn insert(&mut self, e: Element, entry: Entry) {
        let new = match self.family {
            Family::Ipv4 => {
                (self.v4).insert(key_v4(e.addr as u32, e.prefix, e.proto, e.port), entry)
            }
            Family::Ipv6 => self.v6.insert(e, entry),
        };
        if new {
            self.prefix_counts[usize::from(e.prefix.min(128))] += 1;
        }
    }

    fn remove(&mut self, e: &Element) {
        let had = match self.family {
            Family::Ipv4 => (self.v4).remove(&key_v4(e.addr as u32, e.prefix, e.proto, e.port)),
            Family::Ipv6 => self.v6.remove(e),
        };
        if had {
            self.prefix_counts[usize::from(e.prefix.min(128))] -= 1;
        }
    }

    /// Recomputes the probe order.
    fn seal(&mut self) {
        self.prefixes = (0..=128u8)
            .rev()
            .filter(|&l| self.prefix_counts[usize::from(l)] > 0)
            .collect();
    }

    /// The live entry matching an IPv4 key: longest prefix first (as ipset's hash:net).
    #[inline]
    fn find_v4(&self, addr: u32, proto: u8, port: u16, now: u64) -> Option<&Entry> {
        if let [prefix] = *self.prefixes {
            // One length (every hash:ip set): one probe, no loop.
            return (self.v4)
                .get(&key_v4(mask_v4(addr, prefix), prefix, proto, port))
                .filter(|e| now < e.expires);
        }
        self.prefixes.iter().find_map(|&prefix| {
            (self.v4)
                .get(&key_v4(mask_v4(addr, prefix), prefix, proto, port))
                .filter(|e| now < e.expires)
        })
    }

    /// The live entry matching an IPv6 key, longest prefix first.
    #[inline]
    fn find_v6(&self, addr: u128, proto: u8, port: u16, now: u64) -> Option<&Entry> {
        self.prefixes.iter().find_map(|&prefix| {
            let key = Element {
                addr: mask(addr, prefix, Family::Ipv6),
                prefix,
                proto,
                port,
                verdict: 0,
            };
            self.v6.get(&key).filter(|e| now < e.expires)
        })
    }
}

// === Delta ===

/// A change of one set: optionally remove everything first, then set or remove each element
/// (the last value per element wins; `None` removes). Applied to both copies in turn.
#[derive(Debug, Default)]
pub(in crate::sets) struct Delta {
    pub(in crate::sets) clear: bool,
    pub(in crate::sets) changes: FxHashMap<Element, Option<Entry>>,
}

impl Absorb<Delta> for Content {
    fn absorb(&mut self, op: &Delta) {
        if op.clear {
            self.v4.clear();
            self.v6.clear();
            self.prefix_counts.fill(0);
        }
        let adds = op.changes.values().filter(|v| v.is_some()).count();
        match self.family {
            Family::Ipv4 => self.v4.reserve(adds),
            Family::Ipv6 => self.v6.reserve(adds),
        }
        for (e, v) in &op.changes {
            match v {
                Some(entry) => self.insert(*e, entry.clone()),
                None => self.remove(e),
            }
        }
        self.seal();
    }

    fn op_size(op: &Delta) -> usize {
        op.changes.len()
    }

    fn size(&self) -> usize {
        self.len()
    }

    fn copy_from(&mut self, live: &Content) {
        self.clone_from(live);
    }
}

// === SetHandle ===

/// The shared cell a compiled snapshot holds for one set name: type, family and the set's two
/// copies (module docs of [`crate::sets::ipset`]).
pub struct SetHandle {
    pub(in crate::sets) kind: SetType,
    pub(in crate::sets) family: Family,
    pub(in crate::sets) content: LeftRight<Content, Delta>,
    /// Whether the set is a verdict map: [`UNDECIDED`] until its first element (or a compiled
    /// `vmap` on it) decides, then [`PLAIN`] or [`MAP`] for good. Every element of a map has
    /// a verdict, no element of a plain set has one.
    pub(in crate::sets) map: AtomicU8,
    /// The `jump`/`goto` verdict numbers the last compiled `vmap` on this map resolves
    /// ([`SetHandle::resolve_verdicts`]); `None` before any compile. An element whose verdict
    /// is not among them is refused (its chain is not in the table).
    pub(in crate::sets) resolvable: std::sync::RwLock<Option<Arc<rustc_hash::FxHashSet<u32>>>>,
}

/// [`SetHandle::map`]: not decided yet.
pub(in crate::sets) const UNDECIDED: u8 = 0;
/// [`SetHandle::map`]: a plain set.
pub(in crate::sets) const PLAIN: u8 = 1;
/// [`SetHandle::map`]: a verdict map.
pub(in crate::sets) const MAP: u8 = 2;

impl fmt::Debug for SetHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetHandle")
            .field("kind", &self.kind)
            .field("family", &self.family)
            .field("len", &self.content.lock().live().len())
            .finish()
    }
}

impl SetHandle {
    /// An empty set whose readers `readers` protects.
    pub(in crate::sets) fn new(spec: &SetSpec, readers: Arc<Readers>) -> SetHandle {
        SetHandle {
            kind: spec.kind,
            family: spec.family,
            content: LeftRight::new(Content::new(spec), Content::new(spec), readers),
            map: AtomicU8::new(UNDECIDED),
            resolvable: std::sync::RwLock::new(None),
        }
    }

    pub(in crate::sets) fn spec(&self, c: &Content) -> SetSpec {
        self.spec_of(&c.opts)
    }

    pub(in crate::sets) fn spec_of(&self, o: &Options) -> SetSpec {
        SetSpec {
            kind: self.kind,
            family: self.family,
            timeout: o.timeout,
            counters: o.counters,
            maxelem: o.maxelem,
            hashsize: o.hashsize,
        }
    }

    /// Whether `element` is in the set at `now` (as `ipset test`; counts no packet).
    pub fn test(&self, element: &Element, now: u64) -> bool {
        (self.content.lock().live())
            .get(element)
            .is_some_and(|e| now < e.expires)
    }

    /// The verdict the element with `element`'s key has now (0 in a plain set), expired or
    /// not; `None` when the set has no such element. What a store keyed by element text needs
    /// to find the row of a map element whose verdict changes or that is deleted.
    pub fn verdict_of(&self, element: &Element) -> Option<u32> {
        (self.content.lock().live()).get(element).map(|e| e.verdict)
    }

    /// [`IpSet::contains`] without the trait object: what compiled `-m set` matches call
    /// (through [`crate::sets::SetRef`]). Inside a batch of the dataplane the set's manager was
    /// built for, the content is read through one pointer load (no lock, no reference count);
    /// elsewhere under a read lock.
    #[inline]
    pub fn lookup(&self, packet: &PacketMeta, dirs: &[SetDir], now: u64) -> bool {
        self.probe(packet, dirs, now) != NOT_FOUND
    }

    /// The verdict ([`crate::sets::verdict`]) of the element the packet's key finds in this
    /// verdict map, counting it as [`SetHandle::lookup`] does; [`crate::sets::verdict::NONE`]
    /// when none does. Packet path, as `lookup`.
    #[inline]
    pub fn lookup_verdict(&self, packet: &PacketMeta, dirs: &[SetDir], now: u64) -> u32 {
        match self.probe(packet, dirs, now) {
            NOT_FOUND => crate::sets::verdict::NONE,
            v => v as u32,
        }
    }

    /// Whether this set is (or is now made) a verdict map: false when it already holds, or
    /// held, elements without a verdict. What a compiled `vmap` asks of its set.
    pub fn bind_map(&self) -> bool {
        match self
            .map
            .compare_exchange(UNDECIDED, MAP, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => true,
            Err(now) => now == MAP,
        }
    }

    /// Records the `jump`/`goto` verdict numbers a compiled `vmap` on this map resolves: from
    /// now on an element may only carry one of them (or `accept`, `drop`, `return`,
    /// `continue`). Commit path.
    pub fn resolve_verdicts(&self, ids: rustc_hash::FxHashSet<u32>) {
        *self
            .resolvable
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(ids));
    }

    /// Adds `ids` to the verdicts an element may carry (after a compile recorded them): the
    /// chain verdicts of a ruleset's listed elements, added before the ruleset's commit
    /// compiles (its chains exist then). Commit path.
    pub fn allow_verdicts(&self, ids: impl IntoIterator<Item = u32>) {
        let mut r = (self.resolvable.write()).unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(have) = r.as_mut() {
            let more: Vec<u32> = ids
                .into_iter()
                .filter(|i| *i > crate::sets::verdict::CONTINUE && !have.contains(i))
                .collect();
            if !more.is_empty() {
                Arc::make_mut(have).extend(more);
            }
        }
    }

    /// Whether an element may carry verdict `id` (see [`SetHandle::resolve_verdicts`]).
    pub(in crate::sets) fn may_carry(&self, id: u32) -> bool {
        id <= crate::sets::verdict::CONTINUE
            || (self.resolvable.read())
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .is_none_or(|r| r.contains(&id))
    }

    /// The found element's verdict (0 in a plain set), or [`NOT_FOUND`].
    #[inline]
    fn probe(&self, packet: &PacketMeta, dirs: &[SetDir], now: u64) -> u64 {
        let dir_ip = match dirs.first() {
            Some(SetDir::Src) => packet.src,
            Some(SetDir::Dst) | None => packet.dst,
        };
        let bump = |entry: &Entry| {
            if let Some(c) = &entry.counters {
                // Relaxed: statistics only; nothing else is published through them.
                c.packets.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(u64::from(packet.len), Ordering::Relaxed);
            }
            u64::from(entry.verdict)
        };
        let has_ports = proto_name(packet.protocol).is_some() && !packet.fragment;
        if self.kind.port_only() {
            // The port of the first flag, in either family; elements are keyed by port alone.
            if !has_ports {
                return NOT_FOUND;
            }
            let port = match dirs.first() {
                Some(SetDir::Src) => packet.sport,
                Some(SetDir::Dst) | None => packet.dport,
            };
            return match self.family {
                Family::Ipv4 => {
                    (self.content).read(|c| c.find_v4(0, 0, port, now).map_or(NOT_FOUND, bump))
                }
                Family::Ipv6 => {
                    (self.content).read(|c| c.find_v6(0, 0, port, now).map_or(NOT_FOUND, bump))
                }
            };
        }
        let (proto, port) = if self.kind.has_port() {
            if !has_ports {
                return NOT_FOUND;
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
        match (dir_ip, self.family) {
            (std::net::IpAddr::V4(a), Family::Ipv4) => {
                let a = u32::from(a);
                (self.content).read(|c| c.find_v4(a, proto, port, now).map_or(NOT_FOUND, bump))
            }
            (std::net::IpAddr::V6(a), Family::Ipv6) => {
                let a = u128::from(a);
                (self.content).read(|c| c.find_v6(a, proto, port, now).map_or(NOT_FOUND, bump))
            }
            // The other family never matches.
            _ => NOT_FOUND,
        }
    }
}

/// What [`SetHandle::probe`] returns when no element matches (a verdict is a `u32`).
const NOT_FOUND: u64 = u64::MAX;

impl IpSet for SetHandle {
    fn contains(&self, packet: &PacketMeta, dirs: &[SetDir], now: u64) -> bool {
        self.lookup(packet, dirs, now)
    }

    fn dimensions(&self) -> usize {
        if self.kind.has_port() { 2 } else { 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_keys_round_trip_and_mask() {
        let e = Element {
            addr: 0xc000_0200,
            prefix: 24,
            proto: 6,
            port: 443,
            verdict: 0,
        };
        assert_eq!(unkey_v4(key_v4(0xc000_0200, 24, 6, 443)), e);
        assert_eq!(mask_v4(0xc000_02ff, 24), 0xc000_0200);
        assert_eq!(mask_v4(0xc000_02ff, 32), 0xc000_02ff);
        assert_eq!(mask_v4(0xc000_02ff, 0), 0);
        assert_eq!(mask_v4(0xc000_02ff, 1), 0x8000_0000);
    }
}
