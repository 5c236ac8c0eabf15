//! Capture files: legacy pcap and pcapng, read from bytes the caller supplies (the engine does no
//! file I/O), with the pcap-parser crate underneath.
//!
//! [`read_capture`] copies each packet out of the capture with its timestamp and link type;
//! [`CapturedPacket::parse`] (or [`parse_link`]) turns one into a [`Packet`]. Reading a
//! capture allocates (it is not on the packet path); parsing a packet does not.
//!
//! Supported link types ([`linktype`]): Ethernet (1), raw IP (12, 14, 101), raw IPv4 (228),
//! raw IPv6 (229), Linux cooked SLL (113), BSD null/loopback (0, 108). Any other link type is
//! rejected by [`read_capture`] with [`CaptureError::UnsupportedLinktype`], naming it.

use pcap_parser::traits::PcapNGPacketBlock;
use pcap_parser::{Block, PcapBlockOwned, PcapHeader, PcapNGSlice};

use crate::packet::Packet;
use crate::packet::parse::{PacketError, parse_ethernet, parse_ip, parse_linux_sll};

/// Link-type numbers (tcpdump.org `LINKTYPE_*`) this module understands.
pub mod linktype {
    /// BSD loopback: a 4-byte address family in the capturing host's byte order, then IP.
    pub const NULL: u32 = 0;
    /// Ethernet II.
    pub const ETHERNET: u32 = 1;
    /// Raw IP (DLT_RAW on some BSDs).
    pub const RAW_BSD: u32 = 12;
    /// Raw IP (DLT_RAW on OpenBSD).
    pub const RAW_OPENBSD: u32 = 14;
    /// Raw IP, version from the first nibble.
    pub const RAW: u32 = 101;
    /// OpenBSD loopback: like [`NULL`] with the family in network byte order.
    pub const LOOP: u32 = 108;
    /// Linux "cooked" capture v1 (16-byte SLL header).
    pub const LINUX_SLL: u32 = 113;
    /// Raw IPv4.
    pub const IPV4: u32 = 228;
    /// Raw IPv6.
    pub const IPV6: u32 = 229;

    /// Whether [`super::parse_link`] can read packets of this link type.
    pub fn is_supported(lt: u32) -> bool {
        matches!(
            lt,
            NULL | ETHERNET | RAW_BSD | RAW_OPENBSD | RAW | LOOP | LINUX_SLL | IPV4 | IPV6
        )
    }
}

/// Why a capture could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    /// The bytes start with neither a pcap nor a pcapng magic number.
    #[error("not a pcap or pcapng capture (unrecognised magic number)")]
    NotACapture,
    /// Record / block number `index` (0-based, counting every block) is cut short or corrupt.
    #[error("capture record {index} is truncated or malformed")]
    Malformed {
        /// 0-based index of the record (pcap) or block (pcapng).
        index: usize,
    },
    /// The capture (or a pcapng interface a packet refers to) uses a link type this module
    /// cannot parse.
    #[error(
        "unsupported capture link type {linktype} (supported: 0, 1, 12, 14, 101, 108, 113, 228, 229)"
    )]
    UnsupportedLinktype {
        /// The `LINKTYPE_*` number.
        linktype: u32,
    },
    /// A pcapng packet block refers to an interface no Interface Description Block declared.
    #[error("pcapng packet block {index} refers to undeclared interface {interface}")]
    UnknownInterface {
        /// 0-based block index.
        index: usize,
        /// The interface id in the packet block.
        interface: u32,
    },
}

/// One packet copied out of a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedPacket {
    /// Capture timestamp in nanoseconds since the Unix epoch (saturating at `u64::MAX`).
    pub timestamp_ns: u64,
    /// The `LINKTYPE_*` of the interface it was captured on (see [`linktype`]).
    pub linktype: u32,
    /// The packet's length on the wire in bytes (may exceed `data.len()` when the capture
    /// used a snap length).
    pub orig_len: u32,
    /// The captured bytes, starting with the link-layer header.
    pub data: Vec<u8>,
}

impl CapturedPacket {
    /// Parses this packet's headers, see [`parse_link`].
    pub fn parse(&self, base: Packet) -> Result<Packet, PacketError> {
        parse_link(self.linktype, &self.data, base)
    }
}

/// Parses a packet whose link-layer header is of type `linktype` (a [`linktype`] constant).
/// Unsupported link types give [`PacketError::NotIp`].
pub fn parse_link(linktype: u32, bytes: &[u8], base: Packet) -> Result<Packet, PacketError> {
    match linktype {
        linktype::ETHERNET => parse_ethernet(bytes, base),
        linktype::RAW_BSD | linktype::RAW_OPENBSD | linktype::RAW => parse_ip(bytes, base),
        linktype::IPV4 => match bytes.first() {
            Some(b) if b >> 4 == 4 => parse_ip(bytes, base),
            Some(_) => Err(PacketError::Malformed),
            None => Err(PacketError::Truncated),
        },
        linktype::IPV6 => match bytes.first() {
            Some(b) if b >> 4 == 6 => parse_ip(bytes, base),
            Some(_) => Err(PacketError::Malformed),
            None => Err(PacketError::Truncated),
        },
        linktype::LINUX_SLL => parse_linux_sll(bytes, base),
        // The 4-byte family's values differ between systems (AF_INET6 is 10, 24, 28 or 30);
        // the IP version nibble says the same thing portably.
        linktype::NULL | linktype::LOOP => {
            parse_ip(bytes.get(4..).ok_or(PacketError::Truncated)?, base)
        }
        _ => Err(PacketError::NotIp),
    }
}

/// Reads every packet of a legacy pcap (either byte order, micro- or nanosecond timestamps)
/// or pcapng (any number of sections and interfaces) capture.
pub fn read_capture(bytes: &[u8]) -> Result<Vec<CapturedPacket>, CaptureError> {
    match bytes.get(..4) {
        Some([0x0a, 0x0d, 0x0d, 0x0a]) => read_pcapng(bytes),
        _ => read_pcap(bytes),
    }
}

fn checked_linktype(raw: i32) -> Result<u32, CaptureError> {
    match u32::try_from(raw) {
        Ok(lt) if linktype::is_supported(lt) => Ok(lt),
        // A negative number cannot be a link type; report its bit pattern.
        _ => Err(CaptureError::UnsupportedLinktype {
            linktype: raw as u32,
        }),
    }
}

fn read_pcap(bytes: &[u8]) -> Result<Vec<CapturedPacket>, CaptureError> {
    let (mut rest, header): (&[u8], PcapHeader) =
        pcap_parser::parse_pcap_header(bytes).map_err(|_| CaptureError::NotACapture)?;
    let linktype = checked_linktype(header.network.0)?;
    let frac_ns: u64 = if header.is_nanosecond_precision() {
        1
    } else {
        1_000
    };
    let parse_frame = if header.is_modified_format() {
        pcap_parser::parse_pcap_frame_modified
    } else if header.is_bigendian() {
        pcap_parser::parse_pcap_frame_be
    } else {
        pcap_parser::parse_pcap_frame
    };
    let mut out = Vec::new();
    while !rest.is_empty() {
        let index = out.len();
        let (next, frame) = parse_frame(rest).map_err(|_| CaptureError::Malformed { index })?;
        out.push(CapturedPacket {
            timestamp_ns: u64::from(frame.ts_sec)
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::from(frame.ts_usec).saturating_mul(frac_ns)),
            linktype,
            orig_len: frame.origlen,
            data: frame.data.to_vec(),
        });
        rest = next;
    }
    Ok(out)
}

/// A pcapng interface: link type (unchecked until a packet uses it), timestamp units per
/// second, timestamp offset in seconds.
struct Interface {
    linktype: i32,
    units_per_s: Option<u64>,
    offset_s: i64,
}

/// Nanoseconds since the epoch from a pcapng 64-bit timestamp; `None` when the interface's
/// resolution is invalid.
fn pcapng_ns(iface: &Interface, high: u32, low: u32) -> Option<u64> {
    let units = (u128::from(high) << 32) | u128::from(low);
    let per_s = u128::from(iface.units_per_s?);
    let ns = units * 1_000_000_000 / per_s;
    let ns = i128::try_from(ns).ok()? + i128::from(iface.offset_s) * 1_000_000_000;
    Some(u64::try_from(ns.max(0)).unwrap_or(u64::MAX))
}

fn read_pcapng(bytes: &[u8]) -> Result<Vec<CapturedPacket>, CaptureError> {
    let blocks = PcapNGSlice::from_slice(bytes).map_err(|_| CaptureError::NotACapture)?;
    let mut interfaces: Vec<Interface> = Vec::new();
    let mut out = Vec::new();
    for (index, block) in blocks.enumerate() {
        let block = block.map_err(|_| CaptureError::Malformed { index })?;
        let PcapBlockOwned::NG(block) = block else {
            continue;
        };
        // (interface id, timestamp high/low or none, wire length, data)
        let (if_id, ts, orig_len, data) = match &block {
            Block::SectionHeader(_) => {
                // Interface ids are per section.
                interfaces.clear();
                continue;
            }
            Block::InterfaceDescription(idb) => {
                interfaces.push(Interface {
                    linktype: idb.linktype.0,
                    units_per_s: idb.ts_resolution(),
                    offset_s: idb.ts_offset(),
                });
                continue;
            }
            Block::EnhancedPacket(epb) => (
                epb.if_id,
                Some((epb.ts_high, epb.ts_low)),
                epb.origlen,
                epb.packet_data(),
            ),
            // A simple packet block belongs to interface 0 and carries no timestamp.
            Block::SimplePacket(spb) => (0, None, spb.origlen, spb.packet_data()),
            _ => continue,
        };
        let iface = usize::try_from(if_id)
            .ok()
            .and_then(|i| interfaces.get(i))
            .ok_or(CaptureError::UnknownInterface {
                index,
                interface: if_id,
            })?;
        let linktype = checked_linktype(iface.linktype)?;
        let timestamp_ns = match ts {
            Some((high, low)) => {
                pcapng_ns(iface, high, low).ok_or(CaptureError::Malformed { index })?
            }
            None => 0,
        };
        out.push(CapturedPacket {
            timestamp_ns,
            linktype,
            orig_len,
            data: data.to_vec(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Family;

    fn le32(v: &mut Vec<u8>, x: u32) {
        v.extend_from_slice(&x.to_le_bytes());
    }

    /// A pcapng block: type, total length, body (padded to 4), total length.
    fn block(v: &mut Vec<u8>, kind: u32, body: &[u8]) {
        let padded = body.len().div_ceil(4) * 4;
        let total = u32::try_from(12 + padded).unwrap();
        le32(v, kind);
        le32(v, total);
        v.extend_from_slice(body);
        v.resize(v.len() + padded - body.len(), 0);
        le32(v, total);
    }

    fn udp_frame() -> Vec<u8> {
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1234, 53)
            .write(&mut f, &[1, 2, 3])
            .unwrap();
        f
    }

    /// A little pcapng file: SHB, IDB (Ethernet, if_tsresol = 9 i.e. ns), two EPBs, one SPB,
    /// then a second section whose only interface is raw IPv6.
    fn pcapng_fixture() -> Vec<u8> {
        let frame = udp_frame();
        let mut v = Vec::new();
        // SHB: byte-order magic, version 1.0, section length -1
        let mut shb = Vec::new();
        le32(&mut shb, 0x1A2B_3C4D);
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        block(&mut v, 0x0A0D_0D0A, &shb);
        // IDB: linktype 1, reserved, snaplen 0, option if_tsresol(9)=9, opt_endofopt
        let mut idb = Vec::new();
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        le32(&mut idb, 0);
        idb.extend_from_slice(&9u16.to_le_bytes());
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&[9, 0, 0, 0]);
        idb.extend_from_slice(&[0, 0, 0, 0]);
        block(&mut v, 1, &idb);
        for (i, ts) in [1_700_000_000_123_456_789u64, 1_700_000_001_000_000_000]
            .into_iter()
            .enumerate()
        {
            let mut epb = Vec::new();
            le32(&mut epb, 0); // interface 0
            le32(&mut epb, (ts >> 32) as u32);
            le32(&mut epb, ts as u32);
            let cap = frame.len() - i; // second packet: snaplen-cut by one byte
            le32(&mut epb, u32::try_from(cap).unwrap());
            le32(&mut epb, u32::try_from(frame.len()).unwrap());
            epb.extend_from_slice(&frame[..cap]);
            block(&mut v, 6, &epb);
        }
        let mut spb = Vec::new();
        le32(&mut spb, u32::try_from(frame.len()).unwrap());
        spb.extend_from_slice(&frame);
        block(&mut v, 3, &spb);
        // second section: interface 0 is now raw IPv6 with the default microsecond resolution
        block(&mut v, 0x0A0D_0D0A, &shb);
        let mut idb = Vec::new();
        idb.extend_from_slice(&229u16.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        le32(&mut idb, 0);
        block(&mut v, 1, &idb);
        let mut ip6 = Vec::new();
        etherparse::PacketBuilder::ipv6([1; 16], [2; 16], 64)
            .tcp(5, 6, 0, 100)
            .write(&mut ip6, &[])
            .unwrap();
        let mut epb = Vec::new();
        le32(&mut epb, 0);
        le32(&mut epb, 0);
        le32(&mut epb, 2_500_000); // 2.5 s in microseconds
        le32(&mut epb, u32::try_from(ip6.len()).unwrap());
        le32(&mut epb, u32::try_from(ip6.len()).unwrap());
        epb.extend_from_slice(&ip6);
        block(&mut v, 6, &epb);
        v
    }

    #[test]
    fn pcapng_sections_interfaces_and_timestamps() {
        let bytes = pcapng_fixture();
        let pkts = read_capture(&bytes).unwrap();
        assert_eq!(pkts.len(), 4);
        assert_eq!(pkts[0].timestamp_ns, 1_700_000_000_123_456_789);
        assert_eq!(pkts[1].timestamp_ns, 1_700_000_001_000_000_000);
        assert_eq!(pkts[1].data.len() + 1, pkts[1].orig_len as usize);
        assert_eq!(pkts[2].timestamp_ns, 0);
        assert_eq!(pkts[3].timestamp_ns, 2_500_000_000);
        assert_eq!(pkts[3].linktype, linktype::IPV6);
        for p in &pkts[..3] {
            assert_eq!(p.linktype, linktype::ETHERNET);
            let m = p.parse(Packet::default()).unwrap();
            assert_eq!((m.protocol, m.sport, m.dport, m.len), (17, 1234, 53, 31));
        }
        let m = pkts[3].parse(Packet::default()).unwrap();
        assert_eq!((m.family, m.protocol, m.dport), (Family::Ipv6, 6, 6));
    }

    #[test]
    fn pcapng_errors() {
        let mut bytes = pcapng_fixture();
        // cut in the middle of the last block
        bytes.truncate(bytes.len() - 10);
        assert!(matches!(
            read_capture(&bytes),
            Err(CaptureError::Malformed { .. })
        ));
        // an interface of an unsupported link type (147, USER0) used by a packet
        let mut v = Vec::new();
        let mut shb = Vec::new();
        le32(&mut shb, 0x1A2B_3C4D);
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        block(&mut v, 0x0A0D_0D0A, &shb);
        let mut idb = Vec::new();
        idb.extend_from_slice(&147u16.to_le_bytes());
        idb.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        block(&mut v, 1, &idb);
        let mut epb = vec![0u8; 20];
        epb[12] = 4;
        epb[16] = 4;
        epb.extend_from_slice(&[0x45, 0, 0, 0]);
        block(&mut v, 6, &epb);
        let err = read_capture(&v).unwrap_err();
        assert_eq!(err, CaptureError::UnsupportedLinktype { linktype: 147 });
        assert!(err.to_string().contains("147"));
        assert_eq!(read_capture(b"hello world"), Err(CaptureError::NotACapture));
        assert_eq!(read_capture(&[]), Err(CaptureError::NotACapture));
    }

    #[test]
    fn legacy_pcap_big_endian_nanoseconds() {
        let frame = udp_frame();
        let mut v = Vec::new();
        v.extend_from_slice(&0xa1b2_3c4du32.to_be_bytes());
        v.extend_from_slice(&2u16.to_be_bytes());
        v.extend_from_slice(&4u16.to_be_bytes());
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&65535u32.to_be_bytes());
        v.extend_from_slice(&1u32.to_be_bytes());
        v.extend_from_slice(&7u32.to_be_bytes());
        v.extend_from_slice(&5u32.to_be_bytes());
        v.extend_from_slice(&u32::try_from(frame.len()).unwrap().to_be_bytes());
        v.extend_from_slice(&u32::try_from(frame.len()).unwrap().to_be_bytes());
        v.extend_from_slice(&frame);
        let pkts = read_capture(&v).unwrap();
        assert_eq!(pkts.len(), 1);
        assert_eq!(pkts[0].timestamp_ns, 7_000_000_005);
        assert_eq!(pkts[0].data, frame);
        // a record cut short
        assert_eq!(
            read_capture(&v[..v.len() - 1]),
            Err(CaptureError::Malformed { index: 0 })
        );
    }

    #[test]
    fn null_and_raw_linktypes() {
        let mut ip = Vec::new();
        etherparse::PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1, 2)
            .write(&mut ip, &[])
            .unwrap();
        let mut null = vec![2, 0, 0, 0];
        null.extend_from_slice(&ip);
        let m = parse_link(linktype::NULL, &null, Packet::default()).unwrap();
        assert_eq!(m.dport, 2);
        assert_eq!(
            parse_link(linktype::RAW, &ip, Packet::default()).unwrap(),
            m
        );
        assert_eq!(
            parse_link(linktype::IPV6, &ip, Packet::default()),
            Err(PacketError::Malformed)
        );
        assert_eq!(
            parse_link(147, &ip, Packet::default()),
            Err(PacketError::NotIp)
        );
    }
}
