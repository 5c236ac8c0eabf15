//! The node's addresses for `-m addrtype`: read from the host's local routing table over
//! rtnetlink (what the kernel's `inet_dev_addr_type` and `ip6_route` consult), or given with
//! `--local-addresses`, and published to the engine's [`NodeAddrs`] (which the packet path
//! reads without a lock; see `vallum_engine::node_addrs`).
//!
//! Host mode (no `--local-addresses`): at start vallumd dumps table 255 (`ip route show table
//! local`, both families) with an `RTM_GETROUTE` dump and the links (`RTM_GETLINK`) for their
//! names, keeps the `local` and `broadcast` routes with their prefix and device, and refuses
//! to start when the dump fails. Then it dumps again every `--local-addresses-refresh`
//! (default 1 s), so an address added or removed on the host takes effect in addrtype rules
//! within one interval, without a commit; a failed refresh keeps the last table and is
//! reported on stderr.
//!
//! Flag mode: `--local-addresses` takes a comma-separated list of `[broadcast:]ADDR[/LEN][@DEV]`
//! (e.g. `10.0.0.5@eth0,broadcast:10.0.0.255@eth0,127.0.0.0/8@lo,::1@lo`): each a local (or
//! broadcast) route of the local table. An entry without `@DEV` belongs to no device
//! (`--limit-iface-*` never counts it). The empty string is an empty table (nothing is LOCAL).
//! The facts never change while vallumd runs (pcap and synthetic sources, tests).
//!
//! The same dumps give the routing view `-m rpfilter` reads (`crate::host::routes`).

use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use vallum_engine::fib::Fib;
use vallum_engine::model::IpNet;
use vallum_engine::node_addrs::{AddrFacts, LocalRoute, NodeAddrs, RouteType};
use vallum_engine::packet::IfName;

/// `--local-addresses`: the node's local table, given by hand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalAddresses(pub Vec<LocalRoute>);

impl FromStr for LocalAddresses {
    type Err = String;

    /// Parses `[broadcast:]ADDR[/LEN][@DEV],...`; errors name the entry and what is wrong.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = |why: &str| format!("--local-addresses entry {item:?}: {why}");
            let (kind, rest) = match item.strip_prefix("broadcast:") {
                Some(r) => (RouteType::Broadcast, r),
                None => (RouteType::Local, item),
            };
            let (net, dev) = match rest.split_once('@') {
                Some((n, d)) => (n, d),
                None => (rest, ""),
            };
            let iface = if dev.is_empty() {
                IfName::default()
            } else {
                IfName::new(dev).ok_or_else(|| bad("device names are at most 15 bytes"))?
            };
            let (addr, len) = match net.split_once('/') {
                Some((a, l)) => (a, Some(l)),
                None => (net, None),
            };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| bad("not an IPv4 or IPv6 address"))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let len = match len {
                None => max,
                Some(l) => l
                    .parse::<u8>()
                    .ok()
                    .filter(|l| *l <= max)
                    .ok_or_else(|| bad("the prefix length is out of range"))?,
            };
            if kind == RouteType::Broadcast && (addr.is_ipv6() || len != 32) {
                return Err(bad("broadcast entries are single IPv4 addresses"));
            }
            let net = IpNet::new(addr, len).ok_or_else(|| bad("bad prefix"))?;
            out.push(LocalRoute { net, kind, iface });
        }
        Ok(LocalAddresses(out))
    }
}

impl std::fmt::Display for LocalAddresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.kind == RouteType::Broadcast {
                f.write_str("broadcast:")?;
            }
            write!(f, "{}/{}", r.net.addr, r.net.prefix_len().unwrap_or(0))?;
            if !r.iface.as_str().is_empty() {
                write!(f, "@{}", r.iface.as_str())?;
            }
        }
        Ok(())
    }
}

/// Why the host's addresses could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the host's local routing table (rtnetlink): {0}")]
pub struct ReadError(String);

/// Fills `addrs` from `given`, or from the host, and its routing view (`-m rpfilter`,
/// `crate::host::routes`) from `routes`, or from the host when the addresses come from the host
/// too (with `given` and no `routes` it stays unknown). In host mode, keeps what came from
/// the host fresh every `refresh` until the returned task is aborted. Errors: the first host
/// dump failed.
pub fn start(
    addrs: Arc<NodeAddrs>,
    given: Option<&LocalAddresses>,
    routes: Option<&crate::host::routes::Routes>,
    refresh: Duration,
) -> Result<Option<tokio::task::JoinHandle<()>>, ReadError> {
    if let Some(r) = routes {
        addrs.replace_routes(Some(r.fib()));
    }
    if let Some(g) = given {
        addrs.replace(AddrFacts::new(g.0.iter().copied()));
        return Ok(None);
    }
    let host_routes = routes.is_none();
    let publish = move |addrs: &NodeAddrs, (facts, fib): (AddrFacts, Fib)| {
        addrs.replace(facts);
        if host_routes {
            addrs.replace_routes(Some(fib));
        }
    };
    publish(&addrs, read_host_view()?);
    Ok(Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(refresh.max(Duration::from_millis(100)));
        tick.tick().await;
        loop {
            tick.tick().await;
            match tokio::task::spawn_blocking(read_host_view).await {
                Ok(Ok(view)) => publish(&addrs, view),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "keeping the last local addresses and routes")
                }
                Err(e) => tracing::warn!(error = %e, "local address refresh failed"),
            }
        }
    })))
}

/// The host's local routing table (both families), read over rtnetlink.
pub fn read_host() -> Result<AddrFacts, ReadError> {
    read_host_view().map(|(facts, _)| facts)
}

/// The host's local routing table and its whole routing view (rules and every table, both
/// families), read over rtnetlink from one dump of each.
#[cfg(target_os = "linux")]
pub fn read_host_view() -> Result<(AddrFacts, Fib), ReadError> {
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};
    use netlink_packet_route::route::{
        RouteAddress, RouteAttribute, RouteMessage, RouteType as NlRouteType,
    };
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

    let links = dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))?;
    let mut names: Vec<(u32, IfName)> = Vec::new();
    for m in &links {
        if let RouteNetlinkMessage::NewLink(l) = m {
            for a in &l.attributes {
                if let LinkAttribute::IfName(n) = a {
                    if let Some(n) = IfName::new(n) {
                        names.push((l.header.index, n));
                    }
                }
            }
        }
    }
    let routes = dump(RouteNetlinkMessage::GetRoute(RouteMessage::default()))?;
    let rules = dump(RouteNetlinkMessage::GetRule(
        netlink_packet_route::rule::RuleMessage::default(),
    ))?;
    let fib = crate::host::routes::fib_from_netlink(&links, &rules, &routes);
    let mut out = Vec::new();
    for m in &routes {
        let RouteNetlinkMessage::NewRoute(r) = m else {
            continue;
        };
        let mut table = u32::from(r.header.table);
        let mut dst = None;
        let mut oif = 0;
        for a in &r.attributes {
            match a {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = Some(IpAddr::V4(*a)),
                RouteAttribute::Destination(RouteAddress::Inet6(a)) => dst = Some(IpAddr::V6(*a)),
                RouteAttribute::Oif(i) => oif = *i,
                _ => {}
            }
        }
        // RT_TABLE_LOCAL.
        if table != 255 {
            continue;
        }
        let kind = match r.header.kind {
            NlRouteType::Local => RouteType::Local,
            NlRouteType::Broadcast => RouteType::Broadcast,
            NlRouteType::Anycast => RouteType::Anycast,
            NlRouteType::Multicast => RouteType::Multicast,
            // IPv4's lookup gives UNICAST for these (a reject route's lookup fails).
            NlRouteType::Unicast
            | NlRouteType::BlackHole
            | NlRouteType::Unreachable
            | NlRouteType::Prohibit
            | NlRouteType::Throw
            | NlRouteType::Nat => RouteType::Unicast,
            _ => continue,
        };
        let dst = match (dst, r.header.address_family) {
            (Some(d), _) => d,
            // A default route (`local 0.0.0.0/0`, AnyIP) has no destination attribute.
            (None, AddressFamily::Inet) => IpAddr::from([0u8; 4]),
            (None, AddressFamily::Inet6) => IpAddr::from([0u8; 16]),
            (None, _) => continue,
        };
        let Some(net) = IpNet::new(dst, r.header.destination_prefix_length) else {
            continue;
        };
        let iface = names
            .iter()
            .find(|(i, _)| *i == oif)
            .map(|(_, n)| *n)
            .unwrap_or_default();
        out.push(LocalRoute { net, kind, iface });
    }
    Ok((AddrFacts::new(out), fib))
}

/// One `NLM_F_DUMP` request and all its answers.
#[cfg(target_os = "linux")]
fn dump(
    request: netlink_packet_route::RouteNetlinkMessage,
) -> Result<Vec<netlink_packet_route::RouteNetlinkMessage>, ReadError> {
    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    let err = |what: &str, e: &dyn std::fmt::Display| ReadError(format!("{what}: {e}"));
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| err("socket", &e))?;
    socket.bind_auto().map_err(|e| err("bind", &e))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(|e| err("connect", &e))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(request));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf[..]);
    socket.send(&buf, 0).map_err(|e| err("send", &e))?;
    let mut out = Vec::new();
    // Dumps come in datagrams of at most 32 KiB (the kernel sizes them to the reader's
    // buffer, at least a page).
    let mut rx: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        rx.clear();
        let n = socket.recv(&mut rx, 0).map_err(|e| err("recv", &e))?;
        let mut at = 0;
        while at < n {
            let msg = NetlinkMessage::<netlink_packet_route::RouteNetlinkMessage>::deserialize(
                &rx[at..n],
            )
            .map_err(|e| err("decode", &e))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => return Err(err("kernel", &e)),
                NetlinkPayload::InnerMessage(m) => out.push(m),
                _ => {}
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

/// Not Linux: there is no rtnetlink; `--local-addresses` is required for addrtype rules.
#[cfg(not(target_os = "linux"))]
pub fn read_host_view() -> Result<(AddrFacts, Fib), ReadError> {
    Err(ReadError("not Linux; give --local-addresses".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_entries_parse_and_print() {
        let a: LocalAddresses = "10.0.0.5@eth0, broadcast:10.0.0.255@eth0,127.0.0.0/8@lo,::1"
            .parse()
            .unwrap();
        assert_eq!(a.0.len(), 4);
        assert_eq!(a.0[1].kind, RouteType::Broadcast);
        assert_eq!(a.0[3].iface.as_str(), "");
        assert_eq!(
            a.to_string(),
            "10.0.0.5/32@eth0,broadcast:10.0.0.255/32@eth0,127.0.0.0/8@lo,::1/128"
        );
        assert_eq!("".parse::<LocalAddresses>(), Ok(LocalAddresses::default()));
        for bad in [
            "10.0.0.300",
            "10.0.0.0/33",
            "broadcast:::1",
            "1.2.3.4@waytoolongdevicename",
        ] {
            let e = bad.parse::<LocalAddresses>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    /// The host's table has loopback: 127.0.0.1 is LOCAL, as the kernel says.
    #[cfg(target_os = "linux")]
    #[test]
    fn reads_the_hosts_local_table() {
        let f = match read_host() {
            Ok(f) => f,
            Err(e) => {
                panic!("rtnetlink: {e}");
            }
        };
        let lo = f
            .routes()
            .find(|r| r.net.addr == IpAddr::from([127, 0, 0, 1]) || r.net.prefix_len() == Some(8));
        let Some(lo) = lo else {
            panic!("rtnetlink: no loopback address in this namespace");
        };
        assert_eq!(lo.iface.as_str(), "lo");
        assert_eq!(
            f.type_v4([127, 0, 0, 1].into(), None),
            vallum_engine::model::addr_type::LOCAL
        );
    }

    /// The same dumps give the routing view: the host's rules and its loopback routes, so
    /// strict rpfilter passes 127.0.0.1 on lo and refuses it on another device.
    #[cfg(target_os = "linux")]
    #[test]
    fn reads_the_hosts_rules_and_routes() {
        let (_, fib) = match read_host_view() {
            Ok(v) => v,
            Err(e) => {
                panic!("rtnetlink: {e}");
            }
        };
        assert!(!fib.is_empty());
        let p = vallum_engine::packet::PacketMeta {
            src: IpAddr::from([127, 0, 0, 1]),
            dst: IpAddr::from([127, 0, 0, 1]),
            ..Default::default()
        };
        let dev = |dev: &str| vallum_engine::packet::PacketFacts {
            in_iface: IfName::new(dev).unwrap(),
            ..Default::default()
        };
        assert!(fib.rpfilter(&p, &dev("lo"), 0));
        // 127.0.0.1 is local (table local): from another device only with --accept-local
        // and --loose.
        assert!(!fib.rpfilter(&p, &dev("vallum-none0"), 0));
    }
}
