//! Which entries a list or delete applies to, after conntrack-tools' `conntrack -L` / `-D`
//! filters: family (`-f`), protocol (`-p`), original source and destination address or prefix
//! (`-s`, `-d` with `/len`), original ports (`--sport`, `--dport`) and TCP state (`--state`).

use crate::model::{Family, IpNet};

use super::tuple::{PROTO_ICMP, PROTO_ICMPV6};
use super::{ConnView, TcpState};

/// A conjunction of optional conditions on an entry's original tuple; the default (all `None`)
/// matches every entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnFilter {
    /// The entry's family (of its original source address).
    pub family: Option<Family>,
    /// Layer-4 protocol number.
    pub protocol: Option<u8>,
    /// Network holding the original source address (an address of the other family never
    /// matches).
    pub src: Option<IpNet>,
    /// Network holding the original destination address.
    pub dst: Option<IpNet>,
    /// Original source port (TCP, UDP and other protocols with ports; never ICMP).
    pub sport: Option<u16>,
    /// Original destination port (never ICMP, whose tuple keeps type and code there).
    pub dport: Option<u16>,
    /// TCP state; entries of other protocols never match.
    pub tcp_state: Option<TcpState>,
}

impl ConnFilter {
    /// Whether `c` satisfies every condition that is set.
    pub fn matches(&self, c: &ConnView) -> bool {
        let o = &c.original;
        let family = if o.src.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        };
        let icmp = matches!(o.protocol, PROTO_ICMP | PROTO_ICMPV6);
        self.family.is_none_or(|f| f == family)
            && self.protocol.is_none_or(|p| p == o.protocol)
            && self.src.is_none_or(|n| n.contains(o.src))
            && self.dst.is_none_or(|n| n.contains(o.dst))
            && self.sport.is_none_or(|p| !icmp && p == o.sport)
            && self.dport.is_none_or(|p| !icmp && p == o.dport)
            && self.tcp_state.is_none_or(|s| c.tcp_state == Some(s))
    }
}
