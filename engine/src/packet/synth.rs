//! Deterministic synthetic traffic: a seeded generator of [`PacketMeta`] values (and, for
//! pcap-like tests, Ethernet frames built with etherparse's `PacketBuilder`).
//!
//! The same seed and [`SynthConfig`] give the same packets on every platform: the only source of
//! randomness is a SplitMix64 stream, and floating point is used only to turn configured shares
//! into integer thresholds once, in [`Synth::new`]. [`Synth::next_meta`] does not allocate.
//!
//! Traffic model: `flows` flows are drawn up front (family, protocol, addresses, ports or ICMP
//! type); each packet picks a flow uniformly and a TCP flag combination and payload length of
//! its own. Addresses come from 10.0.0.0/8 -> 172.16.0.0/12 (IPv4) and 2001:db8::/32 (IPv6).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{IpNumber, PacketBuilder};

use crate::model::{Family, tcp_flags};
use crate::packet::PacketMeta;

/// What to generate. Protocol weights are relative (`tcp: 8, udp: 3, icmp: 1` means 8 in 12
/// flows are TCP); ICMP means ICMPv6 for IPv6 flows; `other` flows use protocol 47 (GRE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SynthConfig {
    /// Number of distinct flows (at least 1 is used).
    pub flows: u32,
    /// Share of IPv6 flows, 0.0..=1.0 (clamped).
    pub v6_share: f64,
    /// Relative weight of TCP flows.
    pub tcp: u32,
    /// Relative weight of UDP flows.
    pub udp: u32,
    /// Relative weight of ICMP / ICMPv6 flows.
    pub icmp: u32,
    /// Relative weight of flows of another protocol (GRE, no ports).
    pub other: u32,
    /// Largest layer-4 payload in bytes (each packet draws 0..=max).
    pub max_payload: u16,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            flows: 1000,
            v6_share: 0.2,
            tcp: 8,
            udp: 3,
            icmp: 1,
            other: 0,
            max_payload: 1400,
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and every seed (including 0) is fine.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by the multiply-shift method (bias < 2^-32 for our n).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next() >> 32) * u128::from(n)) >> 32) as u64
    }
}

/// One generated flow.
#[derive(Clone, Copy, Debug)]
struct Flow {
    src: IpAddr,
    dst: IpAddr,
    protocol: u8,
    sport: u16,
    dport: u16,
    icmp_type: u8,
}

/// Well-known destination ports, so rules on common services see traffic.
const PORTS: [u16; 8] = [22, 53, 80, 123, 443, 3306, 8080, 51820];

/// The generator. Also an endless [`Iterator`] of [`PacketMeta`].
#[derive(Clone, Debug)]
pub struct Synth {
    rng: SplitMix64,
    flows: Vec<Flow>,
    max_payload: u16,
    base: PacketMeta,
}

impl Synth {
    /// A generator for `seed`; header fields are generated, everything else (hook, interfaces,
    /// mark, ct_state) is [`PacketMeta::default`]'s, see [`Synth::with_base`].
    pub fn new(seed: u64, config: SynthConfig) -> Synth {
        let mut rng = SplitMix64(seed);
        // Shares as thresholds out of 2^32, computed once.
        let v6_threshold = (config.v6_share.clamp(0.0, 1.0) * 4_294_967_296.0) as u64;
        let total = u64::from(config.tcp)
            + u64::from(config.udp)
            + u64::from(config.icmp)
            + u64::from(config.other);
        let n = config.flows.max(1);
        let mut flows = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let v6 = (rng.next() >> 32) < v6_threshold;
            let pick = if total == 0 { 0 } else { rng.below(total) };
            let protocol = if pick < u64::from(config.tcp) || total == 0 {
                6
            } else if pick < u64::from(config.tcp) + u64::from(config.udp) {
                17
            } else if pick < total - u64::from(config.other) {
                if v6 { 58 } else { 1 }
            } else {
                47
            };
            let (src, dst) = if v6 {
                let mut s = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                let mut d = s;
                s[4..12].copy_from_slice(&rng.next().to_be_bytes());
                s[12..].copy_from_slice(&(rng.next() as u32).to_be_bytes());
                d[4..12].copy_from_slice(&rng.next().to_be_bytes());
                d[12..].copy_from_slice(&(rng.next() as u32).to_be_bytes());
                (IpAddr::V6(Ipv6Addr::from(s)), IpAddr::V6(Ipv6Addr::from(d)))
            } else {
                let s = 0x0A00_0000 | (rng.next() as u32 & 0x00FF_FFFF);
                let d = 0xAC10_0000 | (rng.next() as u32 & 0x000F_FFFF);
                (IpAddr::V4(Ipv4Addr::from(s)), IpAddr::V4(Ipv4Addr::from(d)))
            };
            let (sport, dport, icmp_type) = match protocol {
                6 | 17 => {
                    let sport = 1024 + rng.below(64512) as u16;
                    let dport = if rng.below(4) == 0 {
                        1 + rng.below(65535) as u16
                    } else {
                        PORTS[rng.below(PORTS.len() as u64) as usize]
                    };
                    (sport, dport, 0)
                }
                // echo request, destination unreachable, time exceeded
                1 => (0, 0, [8, 3, 11][rng.below(3) as usize]),
                // echo request, destination unreachable, neighbour solicitation
                58 => (0, 0, [128, 1, 135][rng.below(3) as usize]),
                _ => (0, 0, 0),
            };
            flows.push(Flow {
                src,
                dst,
                protocol,
                sport,
                dport,
                icmp_type,
            });
        }
        Synth {
            rng,
            flows,
            max_payload: config.max_payload,
            base: PacketMeta::default(),
        }
    }

    /// Uses `base` for the fields that are not generated (hook, interfaces, mark, ct_state).
    pub fn with_base(mut self, base: PacketMeta) -> Synth {
        self.base = base;
        self
    }

    /// The next packet. Does not allocate.
    pub fn next_meta(&mut self) -> PacketMeta {
        let idx = self.rng.below(self.flows.len() as u64) as usize;
        let f = self.flows[idx];
        let payload = self.rng.below(u64::from(self.max_payload) + 1) as u32;
        let v6 = f.src.is_ipv6();
        let l3 = if v6 { 40 } else { 20 };
        let (l4, tcp_flags) = match f.protocol {
            6 => {
                // mostly established traffic, some handshakes and teardowns
                let flags = match self.rng.below(10) {
                    0 => tcp_flags::SYN,
                    1 => tcp_flags::SYN | tcp_flags::ACK,
                    2 => tcp_flags::FIN | tcp_flags::ACK,
                    3 => tcp_flags::RST,
                    4..=6 => tcp_flags::ACK,
                    _ => tcp_flags::PSH | tcp_flags::ACK,
                };
                (20, flags)
            }
            17 | 1 | 58 => (8, 0),
            _ => (0, 0),
        };
        PacketMeta {
            family: if v6 { Family::Ipv6 } else { Family::Ipv4 },
            src: f.src,
            dst: f.dst,
            protocol: f.protocol,
            fragment: false,
            sport: f.sport,
            dport: f.dport,
            tcp_flags,
            icmp_type: f.icmp_type,
            icmp_code: 0,
            len: l3 + l4 + payload,
            ..self.base
        }
    }

    /// The Ethernet frame for `meta` (as produced by [`Synth::next_meta`]): correct checksums,
    /// zero payload bytes, so that parsing it gives `meta` back (the facts: `src_mac`, and for
    /// IPv6 an upper-layer header after no extension headers).
    pub fn to_ethernet(meta: &PacketMeta, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
        let eth = PacketBuilder::ethernet2(src_mac, dst_mac);
        let ip = match (meta.src, meta.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), 64),
            (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), 64),
            // Mixed families cannot come from this generator; build an IPv4 frame anyway.
            (s, d) => eth.ipv4(v4_or_zero(s), v4_or_zero(d), 64),
        };
        let l3 = if meta.src.is_ipv6() { 40 } else { 20 };
        let hdr = match meta.protocol {
            6 => 20,
            17 | 1 | 58 => 8,
            _ => 0,
        };
        let payload = vec![0u8; (meta.len as usize).saturating_sub(l3 + hdr)];
        let mut out = Vec::with_capacity(14 + meta.len as usize);
        let written = match meta.protocol {
            6 => {
                let mut t = ip.tcp(meta.sport, meta.dport, 1, 65535);
                let f = meta.tcp_flags;
                if f & tcp_flags::FIN != 0 {
                    t = t.fin();
                }
                if f & tcp_flags::SYN != 0 {
                    t = t.syn();
                }
                if f & tcp_flags::RST != 0 {
                    t = t.rst();
                }
                if f & tcp_flags::PSH != 0 {
                    t = t.psh();
                }
                if f & tcp_flags::ACK != 0 {
                    t = t.ack(1);
                }
                if f & tcp_flags::URG != 0 {
                    t = t.urg(0);
                }
                t.write(&mut out, &payload)
            }
            17 => ip.udp(meta.sport, meta.dport).write(&mut out, &payload),
            1 => ip
                .icmpv4_raw(meta.icmp_type, meta.icmp_code, [0; 4])
                .write(&mut out, &payload),
            58 => ip
                .icmpv6_raw(meta.icmp_type, meta.icmp_code, [0; 4])
                .write(&mut out, &payload),
            p => ip.write(&mut out, IpNumber(p), &payload),
        };
        // Writing into a Vec cannot fail with an I/O error, and the payload sizes are far
        // below the IP length limits, so this is not expected; keep whatever was written.
        debug_assert!(written.is_ok(), "PacketBuilder failed: {written:?}");
        out
    }
}

fn v4_or_zero(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => [0; 4],
    }
}

impl Iterator for Synth {
    type Item = PacketMeta;

    fn next(&mut self) -> Option<PacketMeta> {
        Some(self.next_meta())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::parse::parse_ethernet;
    use crate::packet::{Packet, PacketFacts};
    use std::collections::HashSet;

    #[test]
    fn same_seed_same_packets_other_seed_other_packets() {
        let a: Vec<_> = Synth::new(42, SynthConfig::default()).take(500).collect();
        let b: Vec<_> = Synth::new(42, SynthConfig::default()).take(500).collect();
        let c: Vec<_> = Synth::new(43, SynthConfig::default()).take(500).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn mix_is_roughly_respected() {
        let config = SynthConfig {
            flows: 4000,
            v6_share: 0.25,
            tcp: 6,
            udp: 3,
            icmp: 1,
            other: 0,
            max_payload: 100,
        };
        let pkts: Vec<_> = Synth::new(7, config).take(20_000).collect();
        let n = pkts.len() as f64;
        let share =
            |f: &dyn Fn(&PacketMeta) -> bool| pkts.iter().filter(|p| f(p)).count() as f64 / n;
        let v6 = share(&|p| p.family == Family::Ipv6);
        let tcp = share(&|p| p.protocol == 6);
        let udp = share(&|p| p.protocol == 17);
        let icmp = share(&|p| matches!(p.protocol, 1 | 58));
        // Generous bounds: 4000 flows give a standard error near 0.7 percentage points.
        assert!((0.20..0.30).contains(&v6), "v6 {v6}");
        assert!((0.54..0.66).contains(&tcp), "tcp {tcp}");
        assert!((0.25..0.35).contains(&udp), "udp {udp}");
        assert!((0.06..0.14).contains(&icmp), "icmp {icmp}");
        let flows: HashSet<_> = pkts
            .iter()
            .map(|p| (p.src, p.dst, p.protocol, p.sport, p.dport))
            .collect();
        assert!(flows.len() > 3500 && flows.len() <= 4000, "{}", flows.len());
        assert!(
            pkts.iter()
                .all(|p| p.family == Family::Ipv6 || p.protocol != 58)
        );
        assert!(
            pkts.iter()
                .all(|p| p.family == Family::Ipv4 || p.protocol != 1)
        );
    }

    #[test]
    fn frames_parse_back_to_the_same_meta() {
        let config = SynthConfig {
            other: 1,
            ..SynthConfig::default()
        };
        let mac = [2, 0, 0, 0, 0, 9];
        for meta in Synth::new(1, config).take(2000) {
            let frame = Synth::to_ethernet(&meta, mac, [2, 0, 0, 0, 0, 1]);
            let parsed = parse_ethernet(&frame, meta.into()).unwrap();
            assert_eq!(
                parsed,
                Packet {
                    meta,
                    // What parsing the frame finds besides: the MAC, and for IPv6 no
                    // extension headers, then the upper layer.
                    facts: PacketFacts {
                        src_mac: Some(mac),
                        ipv6_ext: crate::packet::Ipv6Ext {
                            mask: if meta.family == Family::Ipv6 {
                                crate::model::ipv6_ext::PROTO
                            } else {
                                0
                            },
                            ..Default::default()
                        },
                        ..PacketFacts::default()
                    },
                }
            );
        }
    }

    #[test]
    fn degenerate_configs_do_not_panic() {
        let zero = SynthConfig {
            flows: 0,
            tcp: 0,
            udp: 0,
            icmp: 0,
            other: 0,
            v6_share: 7.0,
            max_payload: 0,
        };
        let p = Synth::new(0, zero).next_meta();
        assert_eq!((p.family, p.protocol, p.len), (Family::Ipv6, 6, 60));
    }
}
