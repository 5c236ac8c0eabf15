//! Connection tuples: the key of a conntrack entry, its reply (inverted) form and its hash.

use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use rustc_hash::FxHasher;

use crate::packet::PacketMeta;

/// IP protocol number of ICMP.
pub const PROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// IP protocol number of ICMPv6.
pub const PROTO_ICMPV6: u8 = 58;

/// One direction of a connection, as nf_conntrack's `nf_conntrack_tuple`.
///
/// For TCP and UDP `sport`/`dport` are the ports (host order). For ICMP/ICMPv6 `sport` is 0
/// (the echo identifier is not in [`PacketMeta`]) and `dport` is `type << 8 | code`; the reply
/// tuple carries the matching reply type (echo request 8 <-> echo reply 0, ...). Other
/// protocols use 0 for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Layer-4 protocol number.
    pub protocol: u8,
    /// Source port (0 when the protocol has none).
    pub sport: u16,
    /// Destination port, or ICMP `type << 8 | code`.
    pub dport: u16,
}

/// How the tracker treats a packet's ICMP type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IcmpKind {
    /// A request that may open an entry (echo, timestamp, info, address mask, node info).
    Request,
    /// A reply: valid only for an existing entry.
    Reply,
    /// An error about another flow (destination unreachable, time exceeded, ...): RELATED
    /// through [`super::Conntrack::track_related`], INVALID through `track`.
    Error,
    /// Neighbour discovery, MLD and the like: never tracked (nf_conntrack leaves them untracked).
    Untracked,
    /// Anything else: INVALID.
    Other,
}

/// The reply type of an ICMP request or the request type of a reply, and the kind of `ty`.
fn icmp_kind(protocol: u8, ty: u8) -> (IcmpKind, u8) {
    if protocol == PROTO_ICMP {
        match ty {
            8 | 13 | 15 | 17 => (IcmpKind::Request, if ty == 8 { 0 } else { ty + 1 }),
            0 => (IcmpKind::Reply, 8),
            14 | 16 | 18 => (IcmpKind::Reply, ty - 1),
            3 | 4 | 5 | 11 | 12 => (IcmpKind::Error, ty),
            _ => (IcmpKind::Other, ty),
        }
    } else {
        match ty {
            128 | 139 => (IcmpKind::Request, ty + 1),
            129 | 140 => (IcmpKind::Reply, ty - 1),
            1..=4 => (IcmpKind::Error, ty),
            130..=137 | 143 => (IcmpKind::Untracked, ty),
            _ => (IcmpKind::Other, ty),
        }
    }
}

/// Whether ICMP (`protocol` 1) or ICMPv6 (58) type `ty` is an error that embeds the header of
/// the packet it is about (the types [`super::Conntrack::track_related`] accepts).
pub(crate) fn is_icmp_error(protocol: u8, ty: u8) -> bool {
    matches!(protocol, PROTO_ICMP | PROTO_ICMPV6) && icmp_kind(protocol, ty).0 == IcmpKind::Error
}

impl Tuple {
    /// The original-direction tuple of `pkt`, and for ICMP the kind of its type.
    pub(crate) fn from_packet(pkt: &PacketMeta) -> (Tuple, Option<IcmpKind>) {
        let mut t = Tuple {
            src: pkt.src,
            dst: pkt.dst,
            protocol: pkt.protocol,
            sport: 0,
            dport: 0,
        };
        match pkt.protocol {
            PROTO_ICMP | PROTO_ICMPV6 => {
                t.dport = u16::from(pkt.icmp_type) << 8 | u16::from(pkt.icmp_code);
                (t, Some(icmp_kind(pkt.protocol, pkt.icmp_type).0))
            }
            PROTO_TCP | PROTO_UDP => {
                t.sport = pkt.sport;
                t.dport = pkt.dport;
                (t, None)
            }
            _ => (t, None),
        }
    }

    /// The tuple the other direction's packets carry.
    pub fn reply(&self) -> Tuple {
        let (sport, dport) = match self.protocol {
            PROTO_ICMP | PROTO_ICMPV6 => {
                let (_, inv) = icmp_kind(self.protocol, (self.dport >> 8) as u8);
                (0, u16::from(inv) << 8 | (self.dport & 0xff))
            }
            _ => (self.dport, self.sport),
        };
        Tuple {
            src: self.dst,
            dst: self.src,
            protocol: self.protocol,
            sport,
            dport,
        }
    }

    /// [`Tuple::hash`] of the tuple in conntrack zone id `zone` (the zone is part of the
    /// key, as in `hash_conntrack_raw`); zone 0 hashes as the tuple alone.
    pub(crate) fn hash_in(&self, zone: u16) -> u64 {
        let h = self.hash();
        if zone == 0 {
            return h;
        }
        // Mixed once more so that the zone moves every bit (the finaliser of `hash`).
        let mut x = h ^ u64::from(zone).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^ (x >> 33)
    }

    /// A 64-bit hash whose every bit is usable as a bucket index (FxHash, then the murmur3
    /// finaliser, since FxHash's low bits mix poorly).
    ///
    /// The hash is unkeyed: a remote sender who knows it can aim flows at one chain. Keying it
    /// (the kernel's `nf_conntrack_hash_rnd`) is left to the caller's config later.
    pub(crate) fn hash(&self) -> u64 {
        let mut h = FxHasher::default();
        Hash::hash(self, &mut h);
        let mut x = h.finish();
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}
