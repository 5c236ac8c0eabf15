//! The model of `-m rpfilter` and `-m pkttype`: both decide from the node's view (its routes,
//! its local table) rather than from the packet's bytes alone; see [`crate::fib`] and
//! [`crate::node_addrs::AddrFacts::pkt_class`] for how the engine decides them.

/// `-m rpfilter [--loose] [--validmark] [--accept-local] [--invert]` (xt_rpfilter revision
/// 0): a reverse-path check of the source address with the input device. Only in the raw and
/// mangle tables' PREROUTING (as the kernel's `rpfilter_check` and the match's hook mask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RpfilterMatch {
    /// [`crate::fib::rpfilter_flags`] bits.
    pub flags: u8,
}

/// `-m pkttype --pkt-type TYPE`: the packet's link-layer class (xt_pkttype).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PktType {
    /// `unicast` (`PACKET_HOST`; also `PACKET_OTHERHOST`, which never reaches a hook).
    Unicast,
    /// `broadcast` (`PACKET_BROADCAST`).
    Broadcast,
    /// `multicast` (`PACKET_MULTICAST`).
    Multicast,
}

impl PktType {
    /// Every type with its name, in libxt_pkttype's table order (`supported_types`).
    pub const NAMES: [(&'static str, PktType); 3] = [
        ("unicast", PktType::Unicast),
        ("broadcast", PktType::Broadcast),
        ("multicast", PktType::Multicast),
    ];

    /// The name libxt_pkttype prints.
    pub fn name(self) -> &'static str {
        match self {
            PktType::Unicast => "unicast",
            PktType::Broadcast => "broadcast",
            PktType::Multicast => "multicast",
        }
    }
}
