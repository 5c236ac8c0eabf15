//! The node's address facts for `-m addrtype`, and the kernel's address-type decision over them.
//!
//! The kernel decides an address's type with a route lookup: IPv4 `inet_dev_addr_type` looks the
//! address up in the *local* routing table only (table 255: one `local` route per address the
//! host has, `local 127.0.0.0/8` for loopback prefixes, `broadcast` routes for subnet
//! broadcasts), IPv6 `match_type6` classifies by address bits and asks the routing table for
//! `RTF_LOCAL`. The engine does no I/O, so these facts are an input: [`AddrFacts`] is that local
//! table (each entry a prefix, local or broadcast, with its device), and the server fills it
//! from the host (or from a flag) and replaces it when the host's addresses change.
//!
//! ## Design: a lock-free input, not part of the commit
//! Addresses change without a ruleset commit (DHCP, a new container interface), so a compiled
//! snapshot does not copy them: it keeps an `Arc<NodeAddrs>` (resolved at compile time through
//! [`SetRegistry::node_addrs`](crate::sets::SetRegistry::node_addrs), the way `-m set` resolves
//! a set), and each addrtype match loads the current [`AddrFacts`] with one `ArcSwap` load (as
//! ipset contents are read, `sets/ipset.rs`). [`NodeAddrs::replace`] publishes a new table
//! whole; a packet sees either the old or the new one, never a mix.
//!
//! Why `ArcSwap` and not the dataplane's generation counters (which snapshots and set contents
//! ride on): a table is replaced rarely (an address change), by a host-watching task of the
//! server that must not wait for the cores, and it is read also outside batches (traces,
//! `vallumd`'s address view), by threads that have no generation. `ArcSwap` gives both
//! without a wait: the old table is freed when its last reader drops it. The cost on the
//! packet path is one load per addrtype match; a cell on `dataplane/left_right.rs`
//! (one Acquire load in a batch) would save that only for rulesets that use `-m addrtype`.
//!
//! ## Which types the engine decides
//! - IPv4 (`addrtype_mt_v1` -> `inet_dev_addr_type`): `0.0.0.0/8` and `255.255.255.255` are
//!   BROADCAST, `224.0.0.0/4` MULTICAST, otherwise the longest [`LocalRoute`] containing the
//!   address gives LOCAL or BROADCAST (with `--limit-iface-*`: only when its device is the
//!   packet's, else UNICAST), and an address no entry holds is UNICAST. The kernel never gives
//!   an IPv4 address the type UNSPEC, so UNSPEC never matches.
//! - IPv6 (`match_type6`): `::` is UNSPEC, `ff00::/8` MULTICAST, UNICAST is every other
//!   address but the IPv4-mapped `::ffff:0:0/96` (`ipv6_addr_type`); several types in one list
//!   must all hold (the kernel's quirk, not an "any of"); LOCAL is "the longest local entry
//!   holds it" (`RTF_LOCAL`), with `--limit-iface-*` "a /128 entry of that device has it"
//!   (`nf_ipv6_chk_addr(.., dev, strict)`); multicast addresses are never LOCAL (their route
//!   is the `multicast ff00::/8` one).
//!   The local table's other route types decide too: `anycast` gives ANYCAST, `multicast`
//!   MULTICAST; `unicast` and the reject types (whose lookup fails in `fib_table_lookup`)
//!   UNICAST. So BLACKHOLE, UNREACHABLE, PROHIBIT, THROW, NAT and XRESOLVE never match an
//!   IPv4 address, as in the kernel.
//! - IPv6 ANYCAST and UNREACHABLE need a route lookup in the whole routing table
//!   (`match_lookup_rt6`): validation refuses them in the enforced tables (filter, raw), so
//!   no rule is accepted that would not be enforced.
//!
//! Routes of the local table that the host's addresses do not explain (`ip route add local
//! 192.0.2.0/24 dev lo table local`, "AnyIP") are facts too: give them as entries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::fib::Fib;
use crate::model::{Family, Hook, IpNet, PktType, addr_type};
use crate::packet::{IfName, PacketFacts, PacketMeta};

/// What a local-table entry makes of the addresses it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteType {
    /// `local`: the node's own address(es): LOCAL.
    Local,
    /// `broadcast` (IPv4 only): a subnet broadcast address: BROADCAST.
    Broadcast,
    /// `anycast`: ANYCAST (IPv4; IPv6 anycast routes are not LOCAL).
    Anycast,
    /// `multicast`: MULTICAST (IPv4).
    Multicast,
    /// `unicast`, and the reject types (`blackhole`, `unreachable`, `prohibit`, `throw`,
    /// `nat`): IPv4's lookup gives UNICAST for them (a reject route's lookup fails), and they
    /// hide the shorter routes below them.
    Unicast,
}

/// One entry of the node's local routing table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalRoute {
    /// The prefix (a host address is a /32 or /128). Its bits beyond the prefix are clear.
    pub net: IpNet,
    /// What it makes of the addresses it holds.
    pub kind: RouteType,
    /// The device of the route (`--limit-iface-in/out` compare it with the packet's); an empty
    /// name matches no device.
    pub iface: IfName,
}

/// The node's local routing table for both families: what `-m addrtype` decides against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddrFacts {
    /// IPv4 entries, longest prefix first.
    v4: Vec<(u32, u32, LocalRoute)>,
    /// IPv6 entries, longest prefix first.
    v6: Vec<(u128, u128, LocalRoute)>,
}

impl AddrFacts {
    /// No entry: nothing is LOCAL.
    pub const EMPTY: AddrFacts = AddrFacts {
        v4: Vec::new(),
        v6: Vec::new(),
    };

    /// A table of `routes` (any order; an entry whose mask is not a prefix is kept but
    /// ordered by its number of mask bits).
    pub fn new(routes: impl IntoIterator<Item = LocalRoute>) -> AddrFacts {
        let mut f = AddrFacts::default();
        for r in routes {
            match (r.net.addr, r.net.mask) {
                (IpAddr::V4(a), IpAddr::V4(m)) => {
                    f.v4.push((u32::from(a) & u32::from(m), u32::from(m), r))
                }
                (IpAddr::V6(a), IpAddr::V6(m)) => {
                    f.v6.push((u128::from(a) & u128::from(m), u128::from(m), r))
                }
                // A mixed-family entry holds no address.
                _ => {}
            }
        }
        f.v4.sort_by_key(|(_, m, _)| std::cmp::Reverse(m.count_ones()));
        f.v6.sort_by_key(|(_, m, _)| std::cmp::Reverse(m.count_ones()));
        f.v4.dedup_by(|a, b| a == b);
        f.v6.dedup_by(|a, b| a == b);
        f
    }

    /// The entries, IPv4 then IPv6, each longest prefix first.
    pub fn routes(&self) -> impl Iterator<Item = &LocalRoute> {
        self.v4
            .iter()
            .map(|(_, _, r)| r)
            .chain(self.v6.iter().map(|(_, _, r)| r))
    }

    fn lookup4(&self, a: Ipv4Addr) -> Option<&LocalRoute> {
        let a = u32::from(a);
        self.v4
            .iter()
            .find(|(net, mask, _)| a & mask == *net)
            .map(|(_, _, r)| r)
    }

    fn lookup6(&self, a: Ipv6Addr) -> Option<&LocalRoute> {
        let a = u128::from(a);
        self.v6
            .iter()
            .find(|(net, mask, _)| a & mask == *net)
            .map(|(_, _, r)| r)
    }

    /// The IPv4 address type as `inet_dev_addr_type(net, dev, addr)` gives it: one of the
    /// [`addr_type`] bits (never UNSPEC). `dev` is the device of `--limit-iface-in/out`.
    pub fn type_v4(&self, a: Ipv4Addr, dev: Option<&IfName>) -> u16 {
        let o = a.octets();
        if o[0] == 0 || a == Ipv4Addr::BROADCAST {
            return addr_type::BROADCAST;
        }
        if a.is_multicast() {
            return addr_type::MULTICAST;
        }
        match self.lookup4(a) {
            Some(r) if dev.is_none_or(|d| !r.iface.as_str().is_empty() && *d == r.iface) => {
                match r.kind {
                    RouteType::Local => addr_type::LOCAL,
                    RouteType::Broadcast => addr_type::BROADCAST,
                    RouteType::Anycast => addr_type::ANYCAST,
                    RouteType::Multicast => addr_type::MULTICAST,
                    RouteType::Unicast => addr_type::UNICAST,
                }
            }
            _ => addr_type::UNICAST,
        }
    }

    /// Whether the IPv6 address matches the type list `mask` as `match_type6` decides (every
    /// listed class must hold; LOCAL asks the local table). `mask` holds only UNSPEC, UNICAST,
    /// LOCAL and MULTICAST bits (validation refuses the others).
    pub fn matches_v6(&self, a: Ipv6Addr, dev: Option<&IfName>, mask: u16) -> bool {
        let bits = u128::from(a);
        let multicast = bits >> 120 == 0xff;
        let any = bits == 0;
        let mapped = bits >> 32 == 0xffff;
        if mask & addr_type::MULTICAST != 0 && !multicast {
            return false;
        }
        if mask & addr_type::UNICAST != 0 && (any || multicast || mapped) {
            return false;
        }
        if mask & addr_type::UNSPEC != 0 && !any {
            return false;
        }
        if mask & addr_type::LOCAL != 0 {
            return !multicast && self.is_local6(a, dev);
        }
        true
    }

    fn is_local6(&self, a: Ipv6Addr, dev: Option<&IfName>) -> bool {
        match dev {
            None => self.lookup6(a).is_some_and(|r| r.kind == RouteType::Local),
            Some(d) => {
                let bits = u128::from(a);
                self.v6.iter().any(|(net, mask, r)| {
                    *mask == u128::MAX
                        && *net == bits
                        && r.kind == RouteType::Local
                        && !d.as_str().is_empty()
                        && r.iface == *d
                })
            }
        }
    }

    /// Whether `addr` (of `family`) matches the type list `mask` (see the module docs).
    pub fn matches(&self, addr: IpAddr, dev: Option<&IfName>, mask: u16) -> bool {
        match addr {
            IpAddr::V4(a) => mask & self.type_v4(a, dev) != 0,
            IpAddr::V6(a) => self.matches_v6(a, dev, mask),
        }
    }
}

/// Which types of a `-m addrtype` list need the local table in `family` (the others are
/// decided from the address bits alone).
pub fn needs_facts(family: Family, mask: u16) -> bool {
    match family {
        // Any answer but MULTICAST/BROADCAST-by-class/UNSPEC depends on the table (a
        // `multicast` route of the local table is a rare exception: without the table, a
        // unicast-class address is never MULTICAST).
        Family::Ipv4 => {
            mask & (addr_type::LOCAL
                | addr_type::UNICAST
                | addr_type::BROADCAST
                | addr_type::ANYCAST)
                != 0
        }
        Family::Ipv6 => mask & addr_type::LOCAL != 0,
    }
}

impl AddrFacts {
    /// The packet's link-layer class as `-m pkttype` sees it, derived from its addresses
    /// because no packet source gives the engine the frame's destination MAC (NFQUEUE sends
    /// only the source, NFQA_HWADDR):
    /// - a packet the node sends or forwards (no input device, or any hook but PREROUTING and
    ///   INPUT) is UNICAST: the kernel's `skb->pkt_type` is `PACKET_HOST` for a locally made
    ///   packet, and only `PACKET_HOST` packets are forwarded;
    /// - a received one is MULTICAST for a multicast destination (IPv4 `224.0.0.0/4`, IPv6
    ///   `ff00::/8`), BROADCAST for `255.255.255.255` or an address of a `broadcast` entry
    ///   of the local table, else UNICAST. This is what the sender's neighbour resolution
    ///   puts in the frame, and what xt_pkttype derives for looped-back packets
    ///   (`PACKET_LOOPBACK`); it differs from the kernel for a frame whose destination MAC
    ///   disagrees with its IP destination (an L2 broadcast carrying a unicast IP, a
    ///   unicast MAC carrying a broadcast IP): validation warns about it.
    pub fn pkt_class(&self, p: &PacketMeta, f: &PacketFacts) -> PktType {
        if !matches!(p.hook, Hook::Prerouting | Hook::Input) || f.in_iface.is_empty() {
            return PktType::Unicast;
        }
        match p.dst {
            IpAddr::V4(a) if a.is_multicast() => PktType::Multicast,
            IpAddr::V4(a) if a == Ipv4Addr::BROADCAST => PktType::Broadcast,
            IpAddr::V4(a) => match self.lookup4(a) {
                Some(r) if r.kind == RouteType::Broadcast => PktType::Broadcast,
                _ => PktType::Unicast,
            },
            IpAddr::V6(a) if a.is_multicast() => PktType::Multicast,
            IpAddr::V6(_) => PktType::Unicast,
        }
    }
}

/// The node's addresses (and routes, for `-m rpfilter`) as the packet path reads them: the
/// current [`AddrFacts`], replaced whole by [`NodeAddrs::replace`], and the current
/// [`Fib`], replaced whole by [`NodeAddrs::replace_routes`] (`None` until someone gives
/// it). Shared (`Arc`) by whoever refreshes it and every compiled snapshot with an addrtype,
/// pkttype or rpfilter match.
#[derive(Debug, Default)]
pub struct NodeAddrs {
    facts: ArcSwap<AddrFacts>,
    routes: ArcSwapOption<Fib>,
}

impl NodeAddrs {
    /// A handle holding `facts`.
    pub fn new(facts: AddrFacts) -> NodeAddrs {
        NodeAddrs {
            facts: ArcSwap::from_pointee(facts),
            routes: ArcSwapOption::empty(),
        }
    }

    /// Publishes the node's routing view (`None`: unknown, and validation refuses rpfilter
    /// rules); packets classified after this returns see it. Returns whether it differs from
    /// the previous one.
    pub fn replace_routes(&self, routes: Option<Fib>) -> bool {
        let old = self.routes.swap(routes.map(Arc::new));
        old.as_deref() != self.routes.load().as_deref()
    }

    /// The current routing view (a lock-free load); `None` when none was given.
    #[inline]
    pub fn load_routes(&self) -> arc_swap::Guard<Option<Arc<Fib>>> {
        self.routes.load()
    }

    /// Publishes `facts`; packets classified after this returns see them. Returns whether they
    /// differ from the previous ones.
    pub fn replace(&self, facts: AddrFacts) -> bool {
        let old = self.facts.swap(Arc::new(facts));
        *old != **self.facts.load()
    }

    /// The current facts (a lock-free load).
    #[inline]
    pub fn load(&self) -> arc_swap::Guard<Arc<AddrFacts>> {
        self.facts.load()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(net: &str, len: u8, kind: RouteType, dev: &str) -> LocalRoute {
        LocalRoute {
            net: IpNet::new(net.parse().unwrap(), len).unwrap(),
            kind,
            iface: IfName::new(dev).unwrap(),
        }
    }

    /// A host with eth0 10.0.0.5/24 (broadcast 10.0.0.255), lo 127.0.0.1/8 and ::1,
    /// eth0 2001:db8::5/64.
    fn host() -> AddrFacts {
        AddrFacts::new([
            route("10.0.0.5", 32, RouteType::Local, "eth0"),
            route("10.0.0.255", 32, RouteType::Broadcast, "eth0"),
            route("127.0.0.0", 8, RouteType::Local, "lo"),
            route("127.255.255.255", 32, RouteType::Broadcast, "lo"),
            route("::1", 128, RouteType::Local, "lo"),
            route("2001:db8::5", 128, RouteType::Local, "eth0"),
        ])
    }

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_types_as_inet_addr_type() {
        let f = host();
        let t = |s: &str| f.type_v4(v4(s), None);
        assert_eq!(t("10.0.0.5"), addr_type::LOCAL);
        assert_eq!(t("127.3.4.5"), addr_type::LOCAL);
        assert_eq!(t("10.0.0.255"), addr_type::BROADCAST);
        assert_eq!(t("127.255.255.255"), addr_type::BROADCAST);
        assert_eq!(t("255.255.255.255"), addr_type::BROADCAST);
        assert_eq!(t("0.0.0.0"), addr_type::BROADCAST);
        assert_eq!(t("0.1.2.3"), addr_type::BROADCAST);
        assert_eq!(t("224.0.0.1"), addr_type::MULTICAST);
        assert_eq!(t("239.255.255.250"), addr_type::MULTICAST);
        assert_eq!(t("10.0.0.6"), addr_type::UNICAST);
        assert_eq!(t("8.8.8.8"), addr_type::UNICAST);
    }

    #[test]
    fn limit_iface_counts_only_the_packets_device() {
        let f = host();
        let eth0 = IfName::new("eth0").unwrap();
        let lo = IfName::new("lo").unwrap();
        assert_eq!(f.type_v4(v4("10.0.0.5"), Some(&eth0)), addr_type::LOCAL);
        assert_eq!(f.type_v4(v4("10.0.0.5"), Some(&lo)), addr_type::UNICAST);
        assert_eq!(f.type_v4(v4("127.0.0.1"), Some(&lo)), addr_type::LOCAL);
        let a: Ipv6Addr = "2001:db8::5".parse().unwrap();
        assert!(f.matches_v6(a, None, addr_type::LOCAL));
        assert!(f.matches_v6(a, Some(&eth0), addr_type::LOCAL));
        assert!(!f.matches_v6(a, Some(&lo), addr_type::LOCAL));
    }

    #[test]
    fn longest_prefix_wins() {
        // AnyIP: every address local, but the subnet broadcast stays BROADCAST.
        let f = AddrFacts::new([
            route("0.0.0.0", 0, RouteType::Local, "lo"),
            route("10.0.0.255", 32, RouteType::Broadcast, "eth0"),
        ]);
        assert_eq!(f.type_v4(v4("192.0.2.1"), None), addr_type::LOCAL);
        assert_eq!(f.type_v4(v4("10.0.0.255"), None), addr_type::BROADCAST);
    }

    #[test]
    fn ipv6_classes_as_match_type6() {
        let f = host();
        let m = |s: &str, mask: u16| f.matches_v6(s.parse().unwrap(), None, mask);
        assert!(m("::", addr_type::UNSPEC));
        assert!(!m("::1", addr_type::UNSPEC));
        assert!(m("::1", addr_type::UNICAST));
        assert!(m("fe80::1", addr_type::UNICAST));
        assert!(m("e000::1", addr_type::UNICAST));
        assert!(!m("::ffff:10.0.0.1", addr_type::UNICAST));
        assert!(!m("ff02::1", addr_type::UNICAST));
        assert!(m("ff02::1", addr_type::MULTICAST));
        assert!(m("::1", addr_type::LOCAL));
        assert!(!m("2001:db8::6", addr_type::LOCAL));
        // Every listed class must hold (not "any of").
        assert!(m("2001:db8::5", addr_type::UNICAST | addr_type::LOCAL));
        assert!(!m("2001:db8::6", addr_type::UNICAST | addr_type::LOCAL));
        assert!(!m("ff02::1", addr_type::UNICAST | addr_type::MULTICAST));
    }

    #[test]
    fn pkt_class_from_the_destination_and_hook() {
        let f = host();
        let p = |dst: &str, hook: Hook| PacketMeta {
            hook,
            dst: dst.parse().unwrap(),
            ..PacketMeta::default()
        };
        let eth0 = PacketFacts {
            in_iface: IfName::new("eth0").unwrap(),
            ..PacketFacts::default()
        };
        let c = |dst, hook| f.pkt_class(&p(dst, hook), &eth0);
        assert_eq!(c("10.0.0.5", Hook::Input), PktType::Unicast);
        assert_eq!(c("10.0.0.255", Hook::Input), PktType::Broadcast);
        assert_eq!(c("255.255.255.255", Hook::Prerouting), PktType::Broadcast);
        assert_eq!(c("224.0.0.251", Hook::Input), PktType::Multicast);
        assert_eq!(c("ff02::1", Hook::Input), PktType::Multicast);
        assert_eq!(c("2001:db8::5", Hook::Input), PktType::Unicast);
        // Sent or forwarded: PACKET_HOST.
        assert_eq!(c("10.0.0.255", Hook::Forward), PktType::Unicast);
        assert_eq!(
            f.pkt_class(&p("255.255.255.255", Hook::Output), &PacketFacts::NONE),
            PktType::Unicast
        );
    }

    #[test]
    fn replace_publishes_whole_tables() {
        let n = NodeAddrs::new(AddrFacts::default());
        assert_eq!(n.load().type_v4(v4("10.0.0.5"), None), addr_type::UNICAST);
        assert!(n.replace(host()));
        assert_eq!(n.load().type_v4(v4("10.0.0.5"), None), addr_type::LOCAL);
        assert!(!n.replace(host()));
    }

    /// The local table's other route types, as `inet_dev_addr_type`: `anycast` is ANYCAST
    /// (on its device only with a limit), a reject route hides the AnyIP route below it and
    /// gives UNICAST, as does a `unicast` route.
    #[test]
    fn ipv4_types_of_other_local_routes() {
        let facts = AddrFacts::new([
            route("0.0.0.0", 0, RouteType::Local, "lo"),
            route("203.0.113.7", 32, RouteType::Anycast, "eth0"),
            route("203.0.113.8", 32, RouteType::Unicast, ""),
            route("203.0.113.0", 24, RouteType::Multicast, "eth0"),
        ]);
        let eth0 = IfName::new("eth0").unwrap();
        let eth1 = IfName::new("eth1").unwrap();
        assert_eq!(facts.type_v4(v4("203.0.113.7"), None), addr_type::ANYCAST);
        assert_eq!(
            facts.type_v4(v4("203.0.113.7"), Some(&eth0)),
            addr_type::ANYCAST
        );
        assert_eq!(
            facts.type_v4(v4("203.0.113.7"), Some(&eth1)),
            addr_type::UNICAST
        );
        assert_eq!(facts.type_v4(v4("203.0.113.8"), None), addr_type::UNICAST);
        assert_eq!(facts.type_v4(v4("203.0.113.9"), None), addr_type::MULTICAST);
        assert_eq!(facts.type_v4(v4("198.51.100.1"), None), addr_type::LOCAL);
        let never = addr_type::BLACKHOLE
            | addr_type::UNREACHABLE
            | addr_type::PROHIBIT
            | addr_type::THROW
            | addr_type::NAT
            | addr_type::XRESOLVE
            | addr_type::UNSPEC;
        for a in ["203.0.113.7", "203.0.113.8", "198.51.100.1", "0.0.0.0"] {
            assert!(!facts.matches(v4(a).into(), None, never), "{a}");
        }
    }
}
