//! Named sets for `-m set --match-set NAME src|dst` (ipset-style).
//!
//! The compiled snapshot resolves each set name once, at compile time, through a
//! [`SetRegistry`], and keeps a [`SetRef`]: for a [`SetHandle`] (the [`SetManager`]'s sets)
//! the handle itself, called without dynamic dispatch and, inside a batch, without lock or
//! reference count (ipset went from 8 to 11.3 Mpps when its rwlock became RCU); for any other
//! [`IpSet`] the trait object, whose `contains` must not block. [`FrozenSet`] is an immutable
//! implementation for rulesets whose sets do not change between commits; [`SetManager`]
//! (in [`ipset`]) holds ipset-style sets that change without a ruleset commit, and [`save`]
//! reads and writes their `ipset save` text; [`verdict`] numbers the verdicts of nft verdict
//! maps' elements.
//!
//! Time: [`IpSet::contains`] takes the caller's `now` (ns, same clock as the packet path), so
//! an element with a timeout stops matching exactly when it expires; [`SetManager::gc`] only
//! frees the memory of expired elements later.

pub mod ipset;
pub mod save;
pub mod verdict;

pub use ipset::{
    AddOptions, Element, ListedElement, Prepared, SetError, SetHandle, SetInfo, SetManager,
    SetSpec, SetSummary, SetType,
};
pub use save::{PreparedRestore, RestoredSet, SaveError, SaveErrorKind};

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::{IpNet, SetDir};
use crate::packet::PacketMeta;

/// A set the packet path can query.
pub trait IpSet: std::any::Any + Send + Sync + std::fmt::Debug {
    /// Whether the packet's key (address for `dirs[0]`, and port for `dirs[1]` on
    /// `hash:ip,port`-type sets) is an element at time `now` (ns, the packet path's clock;
    /// elements whose timeout passed do not match). Must not block.
    fn contains(&self, packet: &PacketMeta, dirs: &[SetDir], now: u64) -> bool;

    /// How many flags (`src`/`dst`) a `--match-set` on this set needs at least (1 for
    /// `hash:ip`/`hash:net`, 2 for `hash:ip,port`).
    fn dimensions(&self) -> usize;
}

/// A set as a compiled `-m set` match holds it: a [`SetManager`]'s [`SetHandle`], probed
/// directly ([`SetHandle::lookup`]), or any other [`IpSet`] through its trait object.
#[derive(Debug, Clone)]
pub enum SetRef {
    /// A managed set (no dynamic dispatch per packet).
    Handle(Arc<SetHandle>),
    /// Another implementation.
    Other(Arc<dyn IpSet>),
}

impl SetRef {
    /// The set a registry returned, as a [`SetRef::Handle`] when it is a [`SetHandle`].
    pub fn new(set: Arc<dyn IpSet>) -> SetRef {
        let any: Arc<dyn std::any::Any + Send + Sync> = set.clone();
        match any.downcast::<SetHandle>() {
            Ok(h) => SetRef::Handle(h),
            Err(_) => SetRef::Other(set),
        }
    }

    /// As [`IpSet::contains`].
    #[inline]
    pub fn contains(&self, packet: &PacketMeta, dirs: &[SetDir], now: u64) -> bool {
        match self {
            SetRef::Handle(h) => h.lookup(packet, dirs, now),
            SetRef::Other(s) => s.contains(packet, dirs, now),
        }
    }
}

/// Where the compiler and the validator look sets up by name.
pub trait SetRegistry {
    /// The set named `name`, if it exists.
    fn lookup(&self, name: &str) -> Option<Arc<dyn IpSet>>;

    /// The node's address facts for `-m addrtype` ([`crate::node_addrs`]); `None` (the
    /// default) when this registry has none: rules whose types depend on them are refused.
    fn node_addrs(&self) -> Option<Arc<crate::node_addrs::NodeAddrs>> {
        None
    }

    /// The hooks the node's packet path evaluates ([`crate::validate::ReachedHooks`]);
    /// `None` (the default) when unknown: validation then warns about no chain's reach.
    fn reached_hooks(&self) -> Option<Arc<crate::validate::ReachedHooks>> {
        None
    }

    /// The facts-field bit of kernel-decided expression `text` of `family`
    /// ([`crate::kernel_decided`]); `None` (the default) when it has none: the match is then
    /// decided as without a facts field.
    fn kernel_fact_bit(&self, _family: crate::model::Family, _text: &str) -> Option<u8> {
        None
    }
}

/// A registry that knows no set: `--match-set` fails validation with "set does not exist".
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSets;

impl SetRegistry for NoSets {
    fn lookup(&self, _name: &str) -> Option<Arc<dyn IpSet>> {
        None
    }
}

impl SetRegistry for BTreeMap<String, Arc<dyn IpSet>> {
    fn lookup(&self, name: &str) -> Option<Arc<dyn IpSet>> {
        self.get(name).cloned()
    }
}

/// An immutable `hash:ip` / `hash:net` set (addresses of both families may be mixed).
/// Lookups take no lock: single addresses are hashed, networks are checked by prefix length
/// (one hash probe per distinct prefix length, as ipset's hash:net does).
#[derive(Debug, Default, Clone)]
pub struct FrozenSet {
    /// (prefix length, family is v6) -> network addresses with that prefix.
    by_prefix: BTreeMap<(u8, bool), HashSet<IpAddr>>,
}

impl FrozenSet {
    /// A set of the given networks (a host address is a /32 or /128 network).
    pub fn new(elements: impl IntoIterator<Item = IpNet>) -> FrozenSet {
        let mut by_prefix: BTreeMap<(u8, bool), HashSet<IpAddr>> = BTreeMap::new();
        for net in elements {
            let len = net.prefix_len().unwrap_or(match net.addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            });
            by_prefix
                .entry((len, net.addr.is_ipv6()))
                .or_default()
                .insert(net.addr);
        }
        FrozenSet { by_prefix }
    }

    /// Whether `ip` is inside one of the set's networks.
    pub fn contains_addr(&self, ip: IpAddr) -> bool {
        self.by_prefix
            .iter()
            .filter(|((_, v6), _)| *v6 == ip.is_ipv6())
            .any(|((len, _), addrs)| {
                IpNet::new(ip, *len).is_some_and(|net| addrs.contains(&net.addr))
            })
    }
}

impl IpSet for FrozenSet {
    fn contains(&self, packet: &PacketMeta, dirs: &[SetDir], _now: u64) -> bool {
        let ip = match dirs.first() {
            Some(SetDir::Src) => packet.src,
            Some(SetDir::Dst) | None => packet.dst,
        };
        self.contains_addr(ip)
    }

    fn dimensions(&self) -> usize {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_ref_takes_handles_directly_and_others_as_objects() {
        let m = SetManager::new();
        m.create(
            "a",
            SetSpec::new(SetType::HashIp, crate::model::Family::Ipv4),
        )
        .unwrap();
        m.add_str("a", &["192.0.2.1"], 0).unwrap();
        let h = SetRef::new(m.lookup("a").unwrap());
        assert!(matches!(h, SetRef::Handle(_)));
        let p = PacketMeta {
            src: "192.0.2.1".parse().unwrap(),
            ..PacketMeta::default()
        };
        assert!(h.contains(&p, &[SetDir::Src], 0));
        assert!(!h.contains(&p, &[SetDir::Dst], 0));
        let f = SetRef::new(Arc::new(FrozenSet::new([IpNet::new(p.src, 32).unwrap()])));
        assert!(matches!(f, SetRef::Other(_)));
        assert!(f.contains(&p, &[SetDir::Src], 0));
    }

    #[test]
    fn frozen_set_matches_hosts_and_networks_per_family() {
        let set = FrozenSet::new([
            IpNet::new("10.0.0.0".parse().unwrap(), 8).unwrap(),
            IpNet::new("192.0.2.7".parse().unwrap(), 32).unwrap(),
            IpNet::new("2001:db8::".parse().unwrap(), 32).unwrap(),
        ]);
        assert!(set.contains_addr("10.200.3.4".parse().unwrap()));
        assert!(set.contains_addr("192.0.2.7".parse().unwrap()));
        assert!(!set.contains_addr("192.0.2.8".parse().unwrap()));
        assert!(set.contains_addr("2001:db8:1::1".parse().unwrap()));
        assert!(!set.contains_addr("2001:db9::1".parse().unwrap()));
        // ::ffff:10.0.0.1 is an IPv6 address: families never mix.
        assert!(!set.contains_addr("::ffff:10.0.0.1".parse().unwrap()));
    }
}
