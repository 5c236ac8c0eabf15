//! `-m physdev` (xt_physdev): the bridge ports a bridged packet came in on and goes out of.

use super::{Iface, Neg};

/// `-m physdev` (xt_physdev revision 0): the bridge ports of a packet that crosses a Linux
/// bridge with br_netfilter (`net.bridge.bridge-nf-call-iptables=1`). Each field is one
/// option, `None` when not given. As physdev_mt:
///
/// - a packet without bridge information (routed, or sent locally to a non-bridge device)
///   matches only when every given option is negated;
/// - otherwise `--physdev-is-bridged` holds when it has an output port (it is being bridged,
///   not delivered to the host), `--physdev-is-in` / `--physdev-is-out` when it has an input /
///   output port, and `--physdev-in` / `--physdev-out` compare the port's name with the
///   pattern (a trailing `+` is a prefix, as `-i`); a name test whose port is absent (the
///   input port of a packet the host sent, the output port at INPUT) is skipped, negated or
///   not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PhysdevMatch {
    /// `[!] --physdev-in NAME`.
    pub physdev_in: Option<Neg<Iface>>,
    /// `[!] --physdev-out NAME`.
    pub physdev_out: Option<Neg<Iface>>,
    /// `[!] --physdev-is-in`: `Some(negated)`.
    pub is_in: Option<bool>,
    /// `[!] --physdev-is-out`: `Some(negated)`.
    pub is_out: Option<bool>,
    /// `[!] --physdev-is-bridged`: `Some(negated)`.
    pub is_bridged: Option<bool>,
}

impl PhysdevMatch {
    /// Whether physdev_mt_check refuses the match in OUTPUT (the kernel's "--physdev-out and
    /// --physdev-is-out only supported in the FORWARD and POSTROUTING chains with bridged
    /// traffic", EINVAL): it tests the output port without a plain `--physdev-is-bridged`.
    pub fn needs_bridged_output(&self) -> bool {
        (self.physdev_out.is_some() || self.is_out.is_some()) && self.is_bridged != Some(false)
    }
}
