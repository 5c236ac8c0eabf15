//! The node's routing view for `-m rpfilter` ([`Fib`], see `vallum_engine::fib`): read from
//! the host over rtnetlink together with the local addresses (`local_addrs`), or given with
//! `--routes`, and published with [`NodeAddrs::replace_routes`].
//!
//! Host mode (no `--routes`): every `--local-addresses-refresh` vallumd dumps the links
//! (`RTM_GETLINK`: names and `IFF_LOOPBACK`), the routing policy rules (`RTM_GETRULE`, `ip
//! rule`) and the routes of every table (`RTM_GETROUTE`, `ip route show table all`) of both
//! families, and publishes them whole; a failed dump keeps the last view. This happens in
//! every packet-source mode; it is what rpfilter decides against in NFQUEUE mode, where the
//! kernel's own routing sees the same tables. Left out of the view (the engine does not
//! model them): routes with a TOS or an IPv6 source prefix, routes through nexthop objects
//! (`nhid`), cloned (cache) routes and next hops marked dead; rules with selectors the
//! engine does not model are kept marked [`FibRule::unmodelled`] (they never match).
//!
//! Flag mode: `--routes` takes a comma-separated list of `[TYPE:]PREFIX[@DEV[+DEV...]]`, each
//! a route under the kernel's default rules (`0: lookup local`, `32766: lookup main`): TYPE
//! `local` and `broadcast` routes go to table local, the others (`unicast`, the default,
//! `blackhole`, `unreachable`, `prohibit`, `throw`) to table main. Example:
//! `0.0.0.0/0@eth0,10.0.0.0/24@eth0,local:10.0.0.5@eth0,blackhole:198.51.100.0/24,::/0@eth0`.
//! The empty string is an empty view: no source has a route (strict and loose rpfilter fail
//! for every packet not from a loopback device). The view never changes while vallumd runs.
//! Without `--routes` in flag mode (`--local-addresses` given) the view is unknown and
//! validation refuses rpfilter rules in enforced tables.

use std::net::IpAddr;
use std::str::FromStr;

use vallum_engine::fib::{Fib, Route, RouteKind};
use vallum_engine::model::IpNet;
use vallum_engine::packet::IfName;

#[cfg(doc)]
use vallum_engine::fib::FibRule;
#[cfg(doc)]
use vallum_engine::node_addrs::NodeAddrs;

/// `--routes`: the node's routes, given by hand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes(pub Vec<Route>);

impl Routes {
    /// The view these routes make under the kernel's default rules.
    pub fn fib(&self) -> Fib {
        Fib::with_default_rules(self.0.iter().cloned())
    }
}

const TYPES: [(&str, RouteKind, u32); 7] = [
    ("unicast", RouteKind::Unicast, 254),
    ("local", RouteKind::Local, 255),
    ("broadcast", RouteKind::Broadcast, 255),
    ("blackhole", RouteKind::Blackhole, 254),
    ("unreachable", RouteKind::Unreachable, 254),
    ("prohibit", RouteKind::Prohibit, 254),
    ("throw", RouteKind::Throw, 254),
];

impl FromStr for Routes {
    type Err = String;

    /// Parses `[TYPE:]PREFIX[@DEV[+DEV...]],...`; errors name the entry and what is wrong.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = |why: &str| format!("--routes entry {item:?}: {why}");
            // An IPv6 prefix holds colons: a type is a known word before the first one.
            let (kind, table, rest) = match item.split_once(':') {
                Some((w, r)) if TYPES.iter().any(|(n, _, _)| *n == w) => {
                    let (_, k, t) = TYPES
                        .iter()
                        .find(|(n, _, _)| *n == w)
                        .copied()
                        .ok_or_else(|| bad("type"))?;
                    (k, t, r)
                }
                _ => (RouteKind::Unicast, 254, item),
            };
            let (net, devs) = match rest.split_once('@') {
                Some((n, d)) => (n, d),
                None => (rest, ""),
            };
            let devs = devs
                .split('+')
                .filter(|d| !d.is_empty())
                .map(|d| IfName::new(d).ok_or_else(|| bad("device names are at most 15 bytes")))
                .collect::<Result<Vec<_>, _>>()?;
            let (addr, len) = match net.split_once('/') {
                Some((a, l)) => (a, Some(l)),
                None => (net, None),
            };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| bad("not an IPv4 or IPv6 prefix"))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let len = match len {
                None => max,
                Some(l) => l
                    .parse::<u8>()
                    .ok()
                    .filter(|l| *l <= max)
                    .ok_or_else(|| bad("the prefix length is out of range"))?,
            };
            let net = IpNet::new(addr, len).ok_or_else(|| bad("bad prefix"))?;
            if matches!(kind, RouteKind::Unicast | RouteKind::Local) && devs.is_empty() {
                return Err(bad("a unicast or local route needs @DEV"));
            }
            out.push(Route {
                table,
                net,
                kind,
                metric: 0,
                devs,
            });
        }
        Ok(Routes(out))
    }
}

impl std::fmt::Display for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if let Some((n, _, _)) = TYPES.iter().find(|(_, k, _)| *k == r.kind) {
                if r.kind != RouteKind::Unicast {
                    write!(f, "{n}:")?;
                }
            }
            write!(f, "{}/{}", r.net.addr, r.net.prefix_len().unwrap_or(0))?;
            for (j, d) in r.devs.iter().enumerate() {
                f.write_str(if j == 0 { "@" } else { "+" })?;
                f.write_str(d.as_str())?;
            }
        }
        Ok(())
    }
}

/// The view of a host's rtnetlink dumps: its links, rules and routes (any families).
#[cfg(target_os = "linux")]
pub fn fib_from_netlink(
    links: &[netlink_packet_route::RouteNetlinkMessage],
    rules: &[netlink_packet_route::RouteNetlinkMessage],
    routes: &[netlink_packet_route::RouteNetlinkMessage],
) -> Fib {
    use netlink_packet_route::link::{LinkAttribute, LinkFlags};
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteType as Nl};
    use netlink_packet_route::rule::{RuleAction as NlAction, RuleAttribute, RuleFlags};
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage as M};
    use vallum_engine::fib::{FibRule, RuleAction};
    use vallum_engine::model::Family;

    let mut names: Vec<(u32, IfName)> = Vec::new();
    let mut loopback = Vec::new();
    for m in links {
        let M::NewLink(l) = m else { continue };
        for a in &l.attributes {
            if let LinkAttribute::IfName(n) = a {
                if let Some(n) = IfName::new(n) {
                    names.push((l.header.index, n));
                    if l.header.flags.contains(LinkFlags::Loopback) {
                        loopback.push(n);
                    }
                }
            }
        }
    }
    let name = |i: u32| names.iter().find(|(x, _)| *x == i).map(|(_, n)| *n);

    let mut out_rules = Vec::new();
    for m in rules {
        let M::NewRule(r) = m else { continue };
        let family = match r.header.family {
            AddressFamily::Inet => Family::Ipv4,
            AddressFamily::Inet6 => Family::Ipv6,
            _ => continue,
        };
        let mut rule = FibRule::lookup(0, u32::from(r.header.table));
        rule.invert = r.header.flags.contains(RuleFlags::Invert);
        rule.tos = r.header.tos;
        let mut mark_given = false;
        for a in &r.attributes {
            match a {
                RuleAttribute::Priority(p) => rule.priority = *p,
                RuleAttribute::Table(t) => rule.action = RuleAction::Lookup(*t),
                RuleAttribute::Source(ip) => rule.src = IpNet::new(*ip, r.header.src_len),
                RuleAttribute::Destination(ip) => rule.dst = IpNet::new(*ip, r.header.dst_len),
                RuleAttribute::FwMark(v) => {
                    rule.fwmark.0 = *v;
                    mark_given = true;
                }
                RuleAttribute::FwMask(v) => rule.fwmark.1 = *v,
                RuleAttribute::Iifname(n) => {
                    rule.iif = Some(IfName::new(n).unwrap_or_default());
                }
                RuleAttribute::Oifname(n) => {
                    rule.oif = Some(IfName::new(n).unwrap_or_default());
                }
                RuleAttribute::SuppressPrefixLen(n) => {
                    // The kernel reports "none" as -1 (0xffffffff).
                    if let Ok(n) = u8::try_from(*n) {
                        rule.suppress_prefixlen = Some(n);
                    }
                }
                // The rpfilter flow has no VRF, uid 0, no ports.
                RuleAttribute::L3MDev(true) => rule.unmodelled = true,
                RuleAttribute::UidRange(u) => rule.unmodelled |= u.start > 0,
                RuleAttribute::IpProtocol(_)
                | RuleAttribute::SourcePortRange(_)
                | RuleAttribute::DestinationPortRange(_)
                | RuleAttribute::TunId(_) => rule.unmodelled = true,
                _ => {}
            }
        }
        // `fwmark V` without a mask compares all bits.
        if mark_given && rule.fwmark.1 == 0 {
            rule.fwmark.1 = u32::MAX;
        }
        rule.action = match r.header.action {
            NlAction::ToTable => rule.action,
            NlAction::Nop => RuleAction::Nop,
            NlAction::Blackhole => RuleAction::Blackhole,
            NlAction::Unreachable => RuleAction::Unreachable,
            NlAction::Prohibit => RuleAction::Prohibit,
            _ => {
                rule.unmodelled = true;
                rule.action
            }
        };
        out_rules.push((family, rule));
    }

    let mut out_routes = Vec::new();
    for m in routes {
        let M::NewRoute(r) = m else { continue };
        let h = &r.header;
        if h.tos != 0 || h.source_prefix_length != 0 || h.flags.contains(RouteFlags::Cloned) {
            continue;
        }
        let kind = match h.kind {
            Nl::Unicast => RouteKind::Unicast,
            Nl::Local => RouteKind::Local,
            Nl::Broadcast => RouteKind::Broadcast,
            Nl::Anycast => RouteKind::Anycast,
            Nl::Multicast => RouteKind::Multicast,
            Nl::BlackHole => RouteKind::Blackhole,
            Nl::Unreachable => RouteKind::Unreachable,
            Nl::Prohibit => RouteKind::Prohibit,
            Nl::Throw => RouteKind::Throw,
            _ => RouteKind::Other,
        };
        let mut table = u32::from(h.table);
        let (mut dst, mut metric, mut devs, mut nhid) = (None, 0, Vec::new(), false);
        let dead = h.flags.contains(RouteFlags::Dead);
        for a in &r.attributes {
            match a {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = Some(IpAddr::V4(*a)),
                RouteAttribute::Destination(RouteAddress::Inet6(a)) => dst = Some(IpAddr::V6(*a)),
                RouteAttribute::Priority(p) => metric = *p,
                RouteAttribute::Oif(i) if !dead => devs.extend(name(*i)),
                RouteAttribute::MultiPath(hops) => {
                    use netlink_packet_route::route::RouteNextHopFlags;
                    for nh in hops {
                        if !nh.flags.contains(RouteNextHopFlags::Dead) {
                            devs.extend(name(nh.interface_index));
                        }
                    }
                }
                RouteAttribute::NhId(_) => nhid = true,
                _ => {}
            }
        }
        let has_dev = matches!(
            kind,
            RouteKind::Unicast | RouteKind::Local | RouteKind::Broadcast | RouteKind::Anycast
        );
        if nhid || (has_dev && devs.is_empty()) {
            continue;
        }
        let dst = match (dst, h.address_family) {
            (Some(d), _) => d,
            (None, AddressFamily::Inet) => IpAddr::from([0u8; 4]),
            (None, AddressFamily::Inet6) => IpAddr::from([0u8; 16]),
            (None, _) => continue,
        };
        let Some(net) = IpNet::new(dst, h.destination_prefix_length) else {
            continue;
        };
        out_routes.push(Route {
            table,
            net,
            kind,
            metric,
            devs,
        });
    }
    Fib::new(out_rules, out_routes, loopback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_entries_parse_and_print() {
        let r: Routes = "0.0.0.0/0@eth0, 10.0.0.0/24@eth0+eth1,local:10.0.0.5@eth0,\
                         blackhole:198.51.100.0/24,::/0@eth0,local:2001:db8::5@eth0"
            .parse()
            .unwrap();
        assert_eq!(r.0.len(), 6);
        assert_eq!(r.0[1].devs.len(), 2);
        assert_eq!(r.0[2].table, 255);
        assert_eq!(r.0[3].kind, RouteKind::Blackhole);
        assert_eq!(r.0[5].kind, RouteKind::Local);
        assert_eq!(
            r.to_string(),
            "0.0.0.0/0@eth0,10.0.0.0/24@eth0+eth1,local:10.0.0.5/32@eth0,\
             blackhole:198.51.100.0/24,::/0@eth0,local:2001:db8::5/128@eth0"
        );
        assert_eq!("".parse::<Routes>(), Ok(Routes::default()));
        for bad in [
            "10.0.0.300@eth0",
            "10.0.0.0/33@eth0",
            "10.0.0.0/8",
            "bogus:1.2.3.4@x",
        ] {
            let e = bad.parse::<Routes>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
