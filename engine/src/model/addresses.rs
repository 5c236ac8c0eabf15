//! The values of a rule's own fields: addresses with masks ([`IpNet`], `-s`/`-d`),
//! interfaces ([`Iface`], `-i`/`-o`), port ranges ([`PortRange`]) and address ranges
//! ([`AddrRange`], `-m iprange`). Plain data, on both paths; their `contains` and `matches`
//! allocate nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address with a mask, as `-s 10.0.0.0/8` or `-s 10.0.0.0/255.0.0.0`.
/// The mask need not be contiguous (iptables accepts any dotted mask); `prefix_len()` returns
/// `None` then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    /// The address, already ANDed with the mask (as iptables stores it).
    pub addr: IpAddr,
    /// The mask, same family as `addr`.
    pub mask: IpAddr,
}

impl IpNet {
    /// A network from an address and a prefix length (0..=32 or 0..=128). Bits of `addr` beyond
    /// the prefix are cleared. Returns `None` when `len` is too long for the family.
    pub fn new(addr: IpAddr, len: u8) -> Option<IpNet> {
        match addr {
            IpAddr::V4(a) => {
                if len > 32 {
                    return None;
                }
                let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                Some(IpNet {
                    addr: IpAddr::V4(Ipv4Addr::from(u32::from(a) & m)),
                    mask: IpAddr::V4(Ipv4Addr::from(m)),
                })
            }
            IpAddr::V6(a) => {
                if len > 128 {
                    return None;
                }
                let m = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                Some(IpNet {
                    addr: IpAddr::V6(Ipv6Addr::from(u128::from(a) & m)),
                    mask: IpAddr::V6(Ipv6Addr::from(m)),
                })
            }
        }
    }

    /// The prefix length when the mask is contiguous.
    pub fn prefix_len(&self) -> Option<u8> {
        let (bits, width) = match self.mask {
            IpAddr::V4(m) => (u32::from(m) as u128, 32u32),
            IpAddr::V6(m) => (u128::from(m), 128u32),
        };
        let ones = bits.count_ones();
        let expected = if ones == 0 {
            0
        } else {
            (u128::MAX >> (128 - width)) & !((1u128 << (width - ones)) - 1)
        };
        (bits == expected).then_some(ones as u8)
    }

    /// Whether `ip` is inside this network (false across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, self.mask, ip) {
            (IpAddr::V4(a), IpAddr::V4(m), IpAddr::V4(x)) => {
                u32::from(x) & u32::from(m) == u32::from(a)
            }
            (IpAddr::V6(a), IpAddr::V6(m), IpAddr::V6(x)) => {
                u128::from(x) & u128::from(m) == u128::from(a)
            }
            _ => false,
        }
    }
}

/// An interface name pattern (`-i eth0`, `-i eth+`): at most 15 bytes (IFNAMSIZ - 1); a trailing
/// `+` matches every name with that prefix, and `+` alone matches every interface.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Iface {
    /// The name as written, including a trailing `+`.
    pub name: String,
}

impl Iface {
    /// Whether an interface name matches this pattern (as xt's ifname compare).
    pub fn matches(&self, ifname: &str) -> bool {
        match self.name.strip_suffix('+') {
            Some(prefix) => ifname.starts_with(prefix),
            None => self.name == ifname,
        }
    }
}

/// An inclusive port range; a single port has `lo == hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port (>= lo).
    pub hi: u16,
}

impl PortRange {
    /// Whether `port` is within the range.
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }
}

/// An inclusive range of IP addresses (`-m iprange --src-range a-b`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddrRange {
    /// First address.
    pub lo: IpAddr,
    /// Last address (same family).
    pub hi: IpAddr,
}

impl AddrRange {
    /// Whether `ip` is within the range (false across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.lo, self.hi, ip) {
            (IpAddr::V4(l), IpAddr::V4(h), IpAddr::V4(x)) => l <= x && x <= h,
            (IpAddr::V6(l), IpAddr::V6(h), IpAddr::V6(x)) => l <= x && x <= h,
            _ => false,
        }
    }
}
