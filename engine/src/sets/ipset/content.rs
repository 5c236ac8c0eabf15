//! Set contents: one immutable version of a set's elements (`Content`) and the
//! [`SetHandle`] cell the compiled snapshot holds. `SetHandle::contains` is on the packet
//! path: it may not allocate, lock or read a clock.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;

use crate::model::{Family, SetDir};
use crate::packet::PacketMeta;
use crate::sets::IpSet;

use super::element::{Element, SetSpec, SetType, addr_bits, mask, proto_name};

// === Content ===

/// Packet and byte counters of one element.
#[derive(Debug, Default)]
pub(in crate::sets) struct Counters {
    pub(in crate::sets) packets: AtomicU64,
    pub(in crate::sets) bytes: AtomicU64,
}

#[derive(Debug, Clone)]
pub(in crate::sets) struct Entry {
    /// Expiry in ns of the caller's clock; `u64::MAX` never expires.
    pub(in crate::sets) expires: u64,
    pub(in crate::sets) counters: Option<Arc<Counters>>,
}

/// Options that travel with the content (and so with `swap`, as in ipset).
#[derive(Debug, Clone, Copy)]
pub(in crate::sets) struct Options {
    pub(in crate::sets) timeout: Option<u32>,
    pub(in crate::sets) counters: bool,
    pub(in crate::sets) maxelem: u32,
    pub(in crate::sets) hashsize: u32,
}

/// One immutable version of a set's elements.
#[derive(Debug, Clone)]
pub(in crate::sets) struct Content {
    pub(in crate::sets) opts: Options,
    pub(in crate::sets) map: FxHashMap<Element, Entry>,
    /// How many elements have each prefix length.
    pub(in crate::sets) prefix_counts: BTreeMap<u8, u32>,
    /// Distinct prefix lengths present, longest first (the probe order of a lookup).
    pub(in crate::sets) prefixes: Box<[u8]>,
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
            map: FxHashMap::default(),
            prefix_counts: BTreeMap::new(),
            prefixes: Box::new([]),
        }
    }

    pub(in crate::sets) fn insert(&mut self, e: Element, entry: Entry) {
        if self.map.insert(e, entry).is_none() {
            *self.prefix_counts.entry(e.prefix).or_insert(0) += 1;
        }
    }

    pub(in crate::sets) fn remove(&mut self, e: &Element) -> bool {
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
    pub(in crate::sets) fn seal(mut self) -> Arc<Content> {
        self.prefixes = self.prefix_counts.keys().rev().copied().collect();
        Arc::new(self)
    }

    /// The live entry matching a packet's key: longest prefix first (as ipset's hash:net).
    #[inline]
    pub(in crate::sets) fn find(
        &self,
        addr: u128,
        proto: u8,
        port: u16,
        family: Family,
        now: u64,
    ) -> Option<&Entry> {
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
    pub(in crate::sets) kind: SetType,
    pub(in crate::sets) family: Family,
    pub(in crate::sets) content: ArcSwap<Content>,
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
    pub(in crate::sets) fn spec(&self, c: &Content) -> SetSpec {
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
