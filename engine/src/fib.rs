//! The node's routing view for `-m rpfilter`, and the kernel's reverse-path decision over it.
//!
//! `rpfilter` asks the kernel's FIB "would a packet *to* this packet's source leave through the
//! interface this one came in on?". The engine does no I/O, so the FIB is an input: a [`Fib`]
//! holds the routing policy rules (`ip rule`) and the routes of every table they name (`ip
//! route show table all`), and the server fills it from the host over rtnetlink (or from a
//! flag) and replaces it whole when the host's routes change ([`NodeAddrs::replace_routes`]).
//!
//! ## The decision, as `ipt_rpfilter.c` / `ip6t_rpfilter.c` (Linux 6.x)
//! - A packet that came in on a loopback device (`lo`, or a device named in
//!   [`Fib::new`]'s `loopback`) matches (`rpfilter_is_loopback`).
//! - IPv4: a source in `0.0.0.0/8` sent to `255.255.255.255` or `224.0.0.0/24` matches (DHCP,
//!   IGMP). Otherwise the lookup's flow is: destination = the packet's source, source = the
//!   packet's destination (0 when that is multicast, limited broadcast or in `0.0.0.0/8`),
//!   mark = the packet's mark with `--validmark` (else 0), TOS = `tos & 0x1c`, input device
//!   `lo` (`LOOPBACK_IFINDEX`), no output device. The rules run by priority; the route found
//!   must be `unicast` (or `local` with `--accept-local`) and one of its next hops must use
//!   the input device (`fib_info_nh_uses_dev`), or `--loose` is given. Blackhole,
//!   unreachable and prohibit (routes or rule actions) and no route at all do not match.
//! - IPv6: an unspecified source (`::`) matches. The flow: destination = source, source = the
//!   packet's destination when that is unicast, mark as IPv4, input `lo`, and output device =
//!   the input device when the source is link-local (then only routes through that device
//!   count, `RT6_LOOKUP_F_IFACE`) or without `--loose` (then a route of the longest prefix
//!   through that device is preferred over the others of that prefix, `rt6_device_match`).
//!   Reject routes and anycast routes do not match; a `local` route matches only with
//!   `--accept-local` (whatever the device); any other route matches when it goes through the
//!   input device, or with `--loose`.
//!
//! Multicast and broadcast sources get no special case beyond these: their lookup usually
//! finds a `broadcast`/`multicast` route (IPv4: not unicast, no match) or no route.
//!
//! ## Rules
//! A rule's selectors are compared with that flow as `fib_rule_match` does: `from` (IPv6:
//! only when the flow has a source), `to`, `fwmark/mask`, `iif` (the flow's is `lo`), `oif`,
//! `tos` (IPv4: `tos & 0x1c`; IPv6: the traffic class's DSCP bits), then `not` inverts the
//! result. Actions: `lookup TABLE` (a `throw` route, no
//! route, or a route whose prefix is not longer than `suppress_prefixlength` goes on with the
//! next rule), `blackhole` / `unreachable` / `prohibit` (no match), `nop` (next rule). A rule
//! with a selector this view does not model ([`FibRule::unmodelled`]: `l3mdev`, `ipproto`,
//! port ranges, a `uidrange` without uid 0, `goto`) is taken as not matching the flow, which
//! is what the kernel does for the flow rpfilter builds (no VRF, protocol and ports 0, uid
//! 0) except for `goto` and IPv6 `ipproto` (documented in docs/extensions.md).
//!
//! Not modelled: VRFs (l3mdev), IPv4 routes with a TOS, IPv6 source-specific routes (`from`
//! in a route), and nexthop objects (`nhid`); the server leaves such routes out.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::model::{Family, IpNet};
use crate::packet::{IfName, PacketFacts, PacketMeta};

#[cfg(doc)]
use crate::node_addrs::NodeAddrs;

/// `--loose`, `--validmark`, `--accept-local`, `--invert` as xt_rpfilter's `XT_RPFILTER_*`.
pub mod rpfilter_flags {
    /// `--loose`: any device the route uses is fine.
    pub const LOOSE: u8 = 1;
    /// `--validmark`: the packet's mark takes part in the lookup.
    pub const VALID_MARK: u8 = 2;
    /// `--accept-local`: a source that is a local address matches.
    pub const ACCEPT_LOCAL: u8 = 4;
    /// `--invert`: match when the reverse path check fails.
    pub const INVERT: u8 = 8;
    /// nft's `fib saddr . iif` (no iptables option): a strict lookup considers only routes
    /// through the input device, as nft_fib4/nft_fib6 set the flow's output interface (a
    /// shorter prefix through it wins over a route through another device, where
    /// xt_rpfilter takes the route and then compares its device).
    pub const NFT: u8 = 16;
    /// Every flag.
    pub const ALL: u8 = 31;
}

use rpfilter_flags as F;

/// What a route does with the addresses it holds (`ip route`'s type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// `unicast` (the default).
    Unicast,
    /// `local`: the node's own address(es).
    Local,
    /// `broadcast`.
    Broadcast,
    /// `anycast`.
    Anycast,
    /// `multicast`.
    Multicast,
    /// `blackhole`.
    Blackhole,
    /// `unreachable`.
    Unreachable,
    /// `prohibit`.
    Prohibit,
    /// `throw`: the lookup goes on with the next rule.
    Throw,
    /// `nat`, `xresolve` and unknown types.
    Other,
}

/// One route of one table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The table (`main` is 254, `local` 255, `default` 253).
    pub table: u32,
    /// The destination prefix.
    pub net: IpNet,
    /// The type.
    pub kind: RouteKind,
    /// The metric (`ip route ... metric N`): of two routes of one prefix, the lower one wins.
    pub metric: u32,
    /// The devices of its next hops (one, or several for a multipath route; none for reject
    /// types).
    pub devs: Vec<IfName>,
}

/// What a rule does when it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleAction {
    /// `lookup TABLE`.
    Lookup(u32),
    /// `blackhole`.
    Blackhole,
    /// `unreachable`.
    Unreachable,
    /// `prohibit`.
    Prohibit,
    /// `nop`: go on with the next rule.
    Nop,
}

/// One routing policy rule (`ip rule`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FibRule {
    /// `pref`: rules run from the lowest.
    pub priority: u32,
    /// `not`: the selectors' result inverted.
    pub invert: bool,
    /// `from PREFIX`.
    pub src: Option<IpNet>,
    /// `to PREFIX`.
    pub dst: Option<IpNet>,
    /// `fwmark VALUE/MASK` (mask 0: no fwmark selector).
    pub fwmark: (u32, u32),
    /// `iif DEV`.
    pub iif: Option<IfName>,
    /// `oif DEV`.
    pub oif: Option<IfName>,
    /// IPv4 `tos` (0: none).
    pub tos: u8,
    /// `suppress_prefixlength N`.
    pub suppress_prefixlen: Option<u8>,
    /// A selector or action this view does not model (see the module docs): the rule never
    /// matches.
    pub unmodelled: bool,
    /// The action.
    pub action: RuleAction,
}

impl FibRule {
    /// A rule at `priority` that looks up `table` for every flow.
    pub fn lookup(priority: u32, table: u32) -> FibRule {
        FibRule {
            priority,
            invert: false,
            src: None,
            dst: None,
            fwmark: (0, 0),
            iif: None,
            oif: None,
            tos: 0,
            suppress_prefixlen: None,
            unmodelled: false,
            action: RuleAction::Lookup(table),
        }
    }

    /// The kernel's default rules of either family: `0: lookup local`, `32766: lookup main`,
    /// `32767: lookup default`.
    pub fn defaults() -> Vec<FibRule> {
        vec![
            FibRule::lookup(0, 255),
            FibRule::lookup(32766, 254),
            FibRule::lookup(32767, 253),
        ]
    }
}

/// The flow of a reverse-path lookup (see the module docs).
struct Flow {
    /// The address looked up: the packet's source.
    daddr: u128,
    /// The packet's destination, when the flow has one.
    saddr: Option<u128>,
    mark: u32,
    tos: u8,
    oif: Option<IfName>,
    /// IPv6 `RT6_LOOKUP_F_IFACE`: only routes through `oif` count.
    iface_strict: bool,
}

/// One table of one family: per prefix length (longest first) the routes by prefix, each
/// prefix's routes by ascending metric.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Table {
    by_len: Vec<(u8, HashMap<u128, Vec<Route>>)>,
}

impl Table {
    fn insert(&mut self, len: u8, net: u128, r: Route) {
        let at = match self.by_len.iter().position(|(l, _)| *l <= len) {
            Some(i) if self.by_len[i].0 == len => i,
            Some(i) => {
                self.by_len.insert(i, (len, HashMap::new()));
                i
            }
            None => {
                self.by_len.push((len, HashMap::new()));
                self.by_len.len() - 1
            }
        };
        let v = self.by_len[at].1.entry(net).or_default();
        let i = v.partition_point(|o| o.metric <= r.metric);
        v.insert(i, r);
    }

    /// The route the kernel's table lookup returns for `f` (`bits`: the family's width).
    fn lookup(&self, f: &Flow, bits: u32) -> Option<&Route> {
        for (len, nets) in &self.by_len {
            let net = f.daddr & prefix_mask(*len, bits);
            let Some(routes) = nets.get(&net) else {
                continue;
            };
            let via_oif = |r: &&Route| f.oif.is_some_and(|o| r.devs.contains(&o));
            if f.iface_strict {
                // Only a route through the device; else a shorter prefix (fib6_backtrack).
                if let Some(r) = routes.iter().find(via_oif) {
                    return Some(r);
                }
                continue;
            }
            return routes.iter().find(via_oif).or(routes.first());
        }
        None
    }
}

fn prefix_mask(len: u8, bits: u32) -> u128 {
    let len = u32::from(len).min(bits);
    if len == 0 {
        0
    } else {
        (u128::MAX << (128 - len)) >> (128 - bits)
    }
}

fn addr_bits(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn net_contains(n: &IpNet, a: u128) -> bool {
    a & addr_bits(n.mask) == addr_bits(n.addr) & addr_bits(n.mask)
}

/// What a family's lookup found.
enum Found<'a> {
    Route(&'a Route),
    /// An error (reject action or route, or no route at all).
    None,
}

/// One family's rules and tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct FamilyFib {
    rules: Vec<FibRule>,
    tables: HashMap<u32, Table>,
}

impl FamilyFib {
    fn lookup(&self, f: &Flow, bits: u32) -> Found<'_> {
        let lo = IfName::new("lo").unwrap_or_default();
        for r in &self.rules {
            let hit = !r.unmodelled
                && r.src
                    .is_none_or(|n| f.saddr.is_some_and(|s| net_contains(&n, s)))
                && r.dst.is_none_or(|n| net_contains(&n, f.daddr))
                && (r.fwmark.0 ^ f.mark) & r.fwmark.1 == 0
                && r.iif.is_none_or(|i| i == lo)
                && r.oif.is_none_or(|o| f.oif == Some(o))
                && (r.tos == 0 || r.tos == f.tos);
            if hit == r.invert {
                continue;
            }
            match r.action {
                RuleAction::Nop => continue,
                RuleAction::Blackhole | RuleAction::Unreachable | RuleAction::Prohibit => {
                    return Found::None;
                }
                RuleAction::Lookup(t) => {
                    let Some(route) = self.tables.get(&t).and_then(|t| t.lookup(f, bits)) else {
                        continue;
                    };
                    match route.kind {
                        RouteKind::Throw => continue,
                        RouteKind::Blackhole | RouteKind::Unreachable | RouteKind::Prohibit => {
                            return Found::None;
                        }
                        _ => {}
                    }
                    if r.suppress_prefixlen
                        .is_some_and(|s| route.net.prefix_len().unwrap_or(0) <= s)
                    {
                        continue;
                    }
                    return Found::Route(route);
                }
            }
        }
        Found::None
    }
}

/// The node's routing policy and tables for both families: what `-m rpfilter` decides against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fib {
    v4: FamilyFib,
    v6: FamilyFib,
    loopback: Vec<IfName>,
}

impl Fib {
    /// A view of `rules` (each with its family) and `routes` (any order; the family is the
    /// route's prefix's). `loopback` lists the loopback devices (`IFF_LOOPBACK`) besides `lo`.
    pub fn new(
        rules: impl IntoIterator<Item = (Family, FibRule)>,
        routes: impl IntoIterator<Item = Route>,
        loopback: impl IntoIterator<Item = IfName>,
    ) -> Fib {
        let mut f = Fib::default();
        for (fam, r) in rules {
            match fam {
                Family::Ipv4 => f.v4.rules.push(r),
                Family::Ipv6 => f.v6.rules.push(r),
            }
        }
        for fam in [&mut f.v4, &mut f.v6] {
            fam.rules.sort_by_key(|r| r.priority);
        }
        for r in routes {
            let Some(len) = r.net.prefix_len() else {
                continue;
            };
            let net = addr_bits(r.net.addr) & addr_bits(r.net.mask);
            let fam = if r.net.addr.is_ipv4() {
                &mut f.v4
            } else {
                &mut f.v6
            };
            fam.tables.entry(r.table).or_default().insert(len, net, r);
        }
        f.loopback = loopback.into_iter().collect();
        if let Some(lo) = IfName::new("lo") {
            if !f.loopback.contains(&lo) {
                f.loopback.push(lo);
            }
        }
        f
    }

    /// A view with the kernel's default rules for both families over `routes`.
    pub fn with_default_rules(routes: impl IntoIterator<Item = Route>) -> Fib {
        let rules = FibRule::defaults()
            .into_iter()
            .flat_map(|r| [(Family::Ipv4, r.clone()), (Family::Ipv6, r)]);
        Fib::new(rules, routes, [])
    }

    /// The number of rules and routes, both families.
    pub fn len(&self) -> usize {
        [&self.v4, &self.v6]
            .iter()
            .map(|f| {
                f.rules.len()
                    + f.tables
                        .values()
                        .flat_map(|t| t.by_len.iter())
                        .flat_map(|(_, m)| m.values())
                        .map(Vec::len)
                        .sum::<usize>()
            })
            .sum()
    }

    /// Whether the view holds no rule and no route.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `-m rpfilter` with `flags` ([`rpfilter_flags`], `--invert` included) for packet `p`
    /// (its source, destination, mark and TOS; the input device from its facts `f`), as the
    /// module docs describe.
    pub fn rpfilter(&self, p: &PacketMeta, f: &PacketFacts, flags: u8) -> bool {
        let invert = flags & F::INVERT != 0;
        self.reverse_path_ok(p, f, flags) != invert
    }

    fn reverse_path_ok(&self, p: &PacketMeta, f: &PacketFacts, flags: u8) -> bool {
        let dev = f.in_iface;
        if self.loopback.contains(&dev) {
            return true;
        }
        let loose = flags & F::LOOSE != 0;
        let mark = if flags & F::VALID_MARK != 0 {
            p.mark
        } else {
            0
        };
        let accept_local = flags & F::ACCEPT_LOCAL != 0;
        let nft_strict = flags & F::NFT != 0 && !loose;
        match (p.src, p.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let zeronet = |a: std::net::Ipv4Addr| a.octets()[0] == 0;
                let lbcast = d == std::net::Ipv4Addr::BROADCAST;
                if zeronet(s) && (lbcast || u32::from(d) >> 8 == 0x00e0_0000) {
                    return true;
                }
                let flow = Flow {
                    daddr: u128::from(u32::from(s)),
                    saddr: (!(d.is_multicast() || lbcast || zeronet(d)))
                        .then_some(u128::from(u32::from(d))),
                    mark,
                    tos: p.tos & 0x1c,
                    oif: nft_strict.then_some(dev),
                    iface_strict: nft_strict,
                };
                match self.v4.lookup(&flow, 32) {
                    Found::Route(r) => {
                        let ok_type = r.kind == RouteKind::Unicast
                            || (r.kind == RouteKind::Local && accept_local);
                        ok_type && (loose || r.devs.contains(&dev))
                    }
                    Found::None => false,
                }
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let sb = u128::from(s);
                if sb == 0 {
                    return true;
                }
                let db = u128::from(d);
                let d_unicast = db != 0 && db >> 120 != 0xff && db >> 32 != 0xffff;
                // ipv6_addr_type's LINKLOCAL: fe80::/10, and multicast of link scope.
                let link_local =
                    sb >> 118 == 0x3fa || (sb >> 120 == 0xff && (sb >> 112) & 0xf == 2);
                let flow = Flow {
                    daddr: sb,
                    saddr: d_unicast.then_some(db),
                    mark,
                    tos: p.tos & 0xfc,
                    oif: (link_local || !loose).then_some(dev),
                    iface_strict: link_local || nft_strict,
                };
                match self.v6.lookup(&flow, 128) {
                    Found::Route(r) => match r.kind {
                        RouteKind::Anycast => false,
                        RouteKind::Local => accept_local,
                        _ => loose || r.devs.contains(&dev),
                    },
                    Found::None => false,
                }
            }
            // A packet whose addresses are of two families: no route.
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Hook;
    use crate::packet::Packet;

    fn dev(n: &str) -> IfName {
        IfName::new(n).unwrap()
    }

    fn route(table: u32, net: &str, kind: RouteKind, devs: &[&str]) -> Route {
        let (a, l) = net.split_once('/').unwrap_or((net, ""));
        let a: IpAddr = a.parse().unwrap();
        let l = l.parse().unwrap_or(if a.is_ipv4() { 32 } else { 128 });
        Route {
            table,
            net: IpNet::new(a, l).unwrap(),
            kind,
            metric: 0,
            devs: devs.iter().map(|d| dev(d)).collect(),
        }
    }

    /// eth0 10.0.0.5/24 (default via eth0), eth1 192.168.1.5/24, a blackhole, lo; IPv6 eth0
    /// 2001:db8::5/64 with default via eth0 and fe80::/64 on both.
    fn host() -> Fib {
        use RouteKind::*;
        Fib::with_default_rules([
            route(255, "10.0.0.5", Local, &["eth0"]),
            route(255, "10.0.0.255", Broadcast, &["eth0"]),
            route(255, "127.0.0.0/8", Local, &["lo"]),
            route(255, "192.168.1.5", Local, &["eth1"]),
            route(254, "0.0.0.0/0", Unicast, &["eth0"]),
            route(254, "10.0.0.0/24", Unicast, &["eth0"]),
            route(254, "192.168.1.0/24", Unicast, &["eth1"]),
            route(254, "198.51.100.0/24", Blackhole, &[]),
            route(254, "203.0.113.0/24", Unicast, &["eth0", "eth1"]),
            route(255, "2001:db8::5", Local, &["eth0"]),
            route(254, "2001:db8::/64", Unicast, &["eth0"]),
            route(254, "fe80::/64", Unicast, &["eth0"]),
            route(254, "fe80::/64", Unicast, &["eth1"]),
            route(254, "::/0", Unicast, &["eth0"]),
            route(254, "2001:db8:a::/48", Anycast, &["eth1"]),
        ])
    }

    fn pkt(src: &str, dst: &str, inif: &str) -> Packet {
        let src: IpAddr = src.parse().unwrap();
        Packet {
            meta: PacketMeta {
                family: if src.is_ipv4() {
                    Family::Ipv4
                } else {
                    Family::Ipv6
                },
                hook: Hook::Prerouting,
                src,
                dst: dst.parse().unwrap(),
                ..PacketMeta::default()
            },
            facts: PacketFacts {
                in_iface: dev(inif),
                ..PacketFacts::default()
            },
        }
    }

    #[test]
    fn strict_ipv4_needs_the_route_back_through_the_input_device() {
        let f = host();
        let ok = |s, d, i, fl| {
            let p = pkt(s, d, i);
            f.rpfilter(&p, &p.facts, fl)
        };
        assert!(
            ok("8.8.8.8", "10.0.0.5", "eth0", 0),
            "default route via eth0"
        );
        assert!(
            !ok("8.8.8.8", "192.168.1.5", "eth1", 0),
            "spoofed: routes out eth0"
        );
        assert!(
            ok("8.8.8.8", "192.168.1.5", "eth1", F::LOOSE),
            "loose: any route"
        );
        assert!(ok("192.168.1.7", "192.168.1.5", "eth1", 0));
        assert!(!ok("192.168.1.7", "10.0.0.5", "eth0", 0));
        // Multipath: either next hop's device.
        assert!(ok("203.0.113.9", "10.0.0.5", "eth1", 0));
        // A blackhole route: no match, loose or not.
        assert!(!ok("198.51.100.1", "10.0.0.5", "eth0", F::LOOSE));
        // Invert.
        assert!(ok("8.8.8.8", "192.168.1.5", "eth1", F::INVERT));
        assert!(!ok("8.8.8.8", "10.0.0.5", "eth0", F::INVERT));
    }

    #[test]
    fn local_and_loopback_sources() {
        let f = host();
        let ok = |s, d, i, fl| {
            let p = pkt(s, d, i);
            f.rpfilter(&p, &p.facts, fl)
        };
        // A source that is our own address: only with --accept-local (and its device).
        assert!(!ok("10.0.0.5", "10.0.0.5", "eth0", 0));
        assert!(ok("10.0.0.5", "10.0.0.5", "eth0", F::ACCEPT_LOCAL));
        assert!(!ok("10.0.0.5", "10.0.0.5", "eth1", F::ACCEPT_LOCAL));
        assert!(ok(
            "10.0.0.5",
            "10.0.0.5",
            "eth1",
            F::ACCEPT_LOCAL | F::LOOSE
        ));
        // A broadcast source never.
        assert!(!ok(
            "10.0.0.255",
            "10.0.0.5",
            "eth0",
            F::ACCEPT_LOCAL | F::LOOSE
        ));
        // Anything that came in on lo matches, even inverted it does not.
        assert!(ok("10.0.0.5", "10.0.0.5", "lo", 0));
        assert!(!ok("8.8.8.8", "10.0.0.5", "lo", F::INVERT));
        // DHCP discover: 0.0.0.0 -> 255.255.255.255.
        assert!(ok("0.0.0.0", "255.255.255.255", "eth1", 0));
        assert!(ok("0.0.0.0", "224.0.0.22", "eth1", 0));
        // IPv6: local needs --accept-local, whatever the device.
        assert!(!ok("2001:db8::5", "2001:db8::5", "eth1", 0));
        assert!(ok("2001:db8::5", "2001:db8::5", "eth1", F::ACCEPT_LOCAL));
        assert!(ok("::", "ff02::1:ff00:5", "eth1", 0));
    }

    #[test]
    fn ipv6_strict_loose_and_link_local() {
        let f = host();
        let ok = |s, d, i, fl| {
            let p = pkt(s, d, i);
            f.rpfilter(&p, &p.facts, fl)
        };
        assert!(ok("2001:db8::7", "2001:db8::5", "eth0", 0));
        assert!(!ok("2001:db8::7", "2001:db8::5", "eth1", 0));
        assert!(ok("2001:db8::7", "2001:db8::5", "eth1", F::LOOSE));
        assert!(!ok("2600::1", "2001:db8::5", "eth1", 0));
        // Link-local: the fe80::/64 route of the input device, loose or not.
        assert!(ok("fe80::1", "fe80::5", "eth1", 0));
        assert!(ok("fe80::1", "fe80::5", "eth0", 0));
        assert!(!ok("fe80::1", "fe80::5", "eth2", F::LOOSE));
        // Anycast: never.
        assert!(!ok("2001:db8:a::1", "2001:db8::5", "eth1", F::LOOSE));
    }

    #[test]
    fn policy_rules_marks_and_throw() {
        use RouteKind::*;
        let mut r100 = FibRule::lookup(100, 100);
        r100.fwmark = (0x40000, 0x40000);
        let mut to_rule = FibRule::lookup(50, 101);
        to_rule.dst = IpNet::new("172.16.0.0".parse().unwrap(), 12);
        let mut supp = FibRule::lookup(70, 254);
        supp.suppress_prefixlen = Some(0);
        let mut drop = FibRule::lookup(60, 0);
        drop.action = RuleAction::Prohibit;
        drop.dst = IpNet::new("172.31.0.0".parse().unwrap(), 16);
        let rules = [supp, to_rule, drop, r100]
            .into_iter()
            .chain(FibRule::defaults())
            .map(|r| (Family::Ipv4, r));
        let f = Fib::new(
            rules,
            [
                route(254, "0.0.0.0/0", Unicast, &["eth0"]),
                route(254, "172.16.0.0/12", Unicast, &["eth0"]),
                route(100, "0.0.0.0/0", Unicast, &["wg0"]),
                route(101, "172.17.0.0/16", Unicast, &["docker0"]),
                route(101, "172.18.0.0/16", Throw, &[]),
            ],
            [],
        );
        let ok = |s, i, mark: u32, fl| {
            let mut p = pkt(s, "10.0.0.5", i);
            p.mark = mark;
            f.rpfilter(&p, &p.facts, fl)
        };
        // suppress_prefixlength 0 skips main's default route: table 100 (by mark) or main.
        assert!(ok("8.8.8.8", "wg0", 0x40000, F::VALID_MARK));
        assert!(
            !ok("8.8.8.8", "wg0", 0x40000, 0),
            "without --validmark the mark is 0"
        );
        assert!(ok("8.8.8.8", "eth0", 0, 0));
        // `to` rule, table 101; throw goes on (to main's 172.16/12 via eth0).
        assert!(ok("172.17.0.2", "docker0", 0, 0));
        assert!(ok("172.18.0.2", "eth0", 0, 0));
        assert!(!ok("172.18.0.2", "docker0", 0, 0));
        // A prohibit rule: no match even loose.
        assert!(!ok("172.31.0.1", "eth0", 0, F::LOOSE));
    }
}
