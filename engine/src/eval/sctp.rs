//! `-m sctp` on the packet path, as xt_sctp's `sctp_mt`: a non-first fragment never matches;
//! the 12-byte common header must be there (else the kernel drops the packet: a hotdrop);
//! the ports are compared first, then, with `--chunk-types`, the chunks from offset 12 of
//! the transport header to the end of the packet (`match_packet`): each chunk header's type
//! and flags, the next one `length` rounded up to 4 bytes further on; a missing chunk header
//! or a chunk of length 0 is a hotdrop.
//!
//! The chunks are read from the packet's bytes as the source hands them (NFQUEUE copies the
//! whole packet while an enforced rule has `--chunk-types`: [`super::copy_range`]); a packet
//! evaluated without bytes (a trace, the pcap and synthetic sources) has no chunks to read:
//! `--chunk-types` is false for it and `! --chunk-types` true, as `-m string` (validation
//! warns where the source keeps no bytes). The ports come from the parsed header.
//!
//! No allocation; the loop is bounded by the packet's length (each step moves at least 4
//! bytes).

use crate::model::{SctpChunkMode, SctpChunks, SctpMatch};
use crate::packet::PacketMeta;

/// The answer of `sctp_mt`: whether the rule matches, or the kernel's hotdrop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SctpAnswer {
    /// Matches or not.
    Match(bool),
    /// The kernel drops the packet on the spot (`par->hotdrop`).
    Hotdrop,
}

/// The offset of the transport header in `bytes` (the packet from its network header on):
/// the IPv4 header length, or the IPv6 header and the extension headers before `protocol`
/// (hop-by-hop, routing, destination options: `(len + 1) * 8`; fragment: 8; AH: `(len + 2)
/// * 4`), as `ipv6_skip_exthdr`. `None` when the bytes end first.
pub(crate) fn transport_offset(p: &PacketMeta, bytes: &[u8]) -> Option<usize> {
    let first = *bytes.first()?;
    if first >> 4 == 4 {
        return Some(usize::from(first & 0x0f) * 4);
    }
    let mut next = *bytes.get(6)?;
    let mut at = 40usize;
    // At most as many headers as fit in the bytes (each is 8 bytes or more).
    while next != p.protocol {
        let len = usize::from(*bytes.get(at + 1)?);
        let size = match next {
            0 | 43 | 60 => (len + 1) * 8,
            44 => 8,
            51 => (len + 2) * 4,
            _ => return None,
        };
        next = *bytes.get(at)?;
        at += size;
    }
    Some(at)
}

/// `sctp_mt` for `p` with its bytes from the network header on (empty: none were given).
pub(crate) fn sctp_matches(m: &SctpMatch, p: &PacketMeta, bytes: &[u8]) -> SctpAnswer {
    if p.fragment {
        return SctpAnswer::Match(false);
    }
    let th = if bytes.is_empty() {
        None
    } else {
        match transport_offset(p, bytes) {
            Some(th) if th + 12 <= bytes.len() => Some(th),
            _ => return SctpAnswer::Hotdrop,
        }
    };
    if th.is_none() && p.l4_cut.is_some() {
        return SctpAnswer::Hotdrop;
    }
    let port_ok = |r: &Option<crate::model::Neg<crate::model::PortRange>>, v: u16| {
        r.as_ref()
            .is_none_or(|r| (r.value.lo <= v && v <= r.value.hi) != r.negated)
    };
    if !port_ok(&m.sport, p.sport) || !port_ok(&m.dport, p.dport) {
        return SctpAnswer::Match(false);
    }
    let Some(c) = &m.chunks else {
        return SctpAnswer::Match(true);
    };
    let Some(th) = th else {
        return SctpAnswer::Match(c.negated);
    };
    // skb->len: the packet's layer-3 length (what the kernel trimmed the skb to).
    let end = (p.len as usize).min(bytes.len().max(th + 12));
    match chunks_match(c, bytes, th + 12, end) {
        Some(hit) => SctpAnswer::Match(hit != c.negated),
        None => SctpAnswer::Hotdrop,
    }
}

/// xt_sctp's `match_flags`: the first flag entry of the chunk's type decides.
fn flags_fit(c: &SctpChunks, chunk_type: u8, flags: u8) -> bool {
    c.flags
        .iter()
        .find(|f| f.chunk_type == chunk_type)
        .is_none_or(|f| flags & f.mask == f.flag)
}

/// xt_sctp's `match_packet` over `bytes[offset..end]`; `None`: a hotdrop (a chunk header
/// missing, or of length 0).
fn chunks_match(c: &SctpChunks, bytes: &[u8], mut offset: usize, end: usize) -> Option<bool> {
    let mut left = c.map;
    loop {
        let h = bytes.get(offset..offset + 4)?;
        let (t, flags) = (h[0], h[1]);
        let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
        if len == 0 {
            return None;
        }
        offset += (len + 3) & !3;
        if c.has(t) {
            match c.mode {
                SctpChunkMode::Any => {
                    if flags_fit(c, t, flags) {
                        return Some(true);
                    }
                }
                SctpChunkMode::All => {
                    if flags_fit(c, t, flags) {
                        left[usize::from(t / 32)] &= !(1 << (t % 32));
                    }
                }
                SctpChunkMode::Only => {
                    if !flags_fit(c, t, flags) {
                        return Some(false);
                    }
                }
            }
        } else if c.mode == SctpChunkMode::Only {
            return Some(false);
        }
        if offset >= end {
            break;
        }
    }
    Some(match c.mode {
        SctpChunkMode::All => left == [0; 8],
        SctpChunkMode::Any => false,
        SctpChunkMode::Only => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Neg, PortRange, SctpFlag};

    /// An IPv4 SCTP packet from 1.2.3.4:5000 to :80 with the given chunks (type, flags, value
    /// bytes).
    fn packet(chunks: &[(u8, u8, usize)]) -> (PacketMeta, Vec<u8>) {
        let mut b = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 132, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        b.extend_from_slice(&[0x13, 0x88, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0]);
        for &(t, f, n) in chunks {
            let len = (4 + n) as u16;
            b.extend_from_slice(&[t, f]);
            b.extend_from_slice(&len.to_be_bytes());
            b.extend(std::iter::repeat_n(0xaa, n));
            while b.len() % 4 != 0 {
                b.push(0);
            }
        }
        let meta = PacketMeta {
            protocol: 132,
            sport: 5000,
            dport: 80,
            len: b.len() as u32,
            ..PacketMeta::default()
        };
        (meta, b)
    }

    fn chunks(mode: SctpChunkMode, types: &[u8], flags: Vec<SctpFlag>) -> SctpMatch {
        let mut map = [0u32; 8];
        for &t in types {
            map[usize::from(t / 32)] |= 1 << (t % 32);
        }
        SctpMatch {
            sport: None,
            dport: None,
            chunks: Some(SctpChunks {
                negated: false,
                mode,
                map,
                flags,
            }),
        }
    }

    #[test]
    fn modes_as_match_packet() {
        let (p, b) = packet(&[(1, 0, 16), (0, 0x03, 5)]);
        let m = |mode, types: &[u8]| sctp_matches(&chunks(mode, types, vec![]), &p, &b);
        assert_eq!(m(SctpChunkMode::Any, &[0]), SctpAnswer::Match(true));
        assert_eq!(m(SctpChunkMode::Any, &[3]), SctpAnswer::Match(false));
        assert_eq!(m(SctpChunkMode::All, &[0, 1]), SctpAnswer::Match(true));
        assert_eq!(m(SctpChunkMode::All, &[0, 1, 3]), SctpAnswer::Match(false));
        assert_eq!(m(SctpChunkMode::Only, &[0, 1, 3]), SctpAnswer::Match(true));
        assert_eq!(m(SctpChunkMode::Only, &[1]), SctpAnswer::Match(false));
        // DATA with flags B and E set: `DATA:BE` fits, `DATA:Be` does not.
        let flag = |flag, mask| SctpFlag {
            chunk_type: 0,
            flag,
            mask,
        };
        let with = |f| sctp_matches(&chunks(SctpChunkMode::Any, &[0], vec![f]), &p, &b);
        assert_eq!(with(flag(3, 3)), SctpAnswer::Match(true));
        assert_eq!(with(flag(2, 3)), SctpAnswer::Match(false));
    }

    #[test]
    fn ports_first_then_hotdrops() {
        let (p, b) = packet(&[(1, 0, 0)]);
        let mut m = chunks(SctpChunkMode::Any, &[1], vec![]);
        m.dport = Some(Neg {
            negated: false,
            value: PortRange { lo: 81, hi: 90 },
        });
        assert_eq!(sctp_matches(&m, &p, &b), SctpAnswer::Match(false));
        m.dport = None;
        assert_eq!(sctp_matches(&m, &p, &b), SctpAnswer::Match(true));
        // A chunk of length 0, and a header cut short, are hotdrops.
        let (p0, mut b0) = packet(&[(1, 0, 0)]);
        b0[35] = 0;
        assert_eq!(sctp_matches(&m, &p0, &b0), SctpAnswer::Hotdrop);
        assert_eq!(sctp_matches(&m, &p, &b[..28]), SctpAnswer::Hotdrop);
        // Without bytes the chunks are unknown: false, and true when negated.
        assert_eq!(sctp_matches(&m, &p, &[]), SctpAnswer::Match(false));
        if let Some(c) = m.chunks.as_mut() {
            c.negated = true;
        }
        assert_eq!(sctp_matches(&m, &p, &[]), SctpAnswer::Match(true));
        // A non-first fragment never matches.
        let frag = PacketMeta {
            fragment: true,
            ..p
        };
        assert_eq!(sctp_matches(&m, &frag, &b), SctpAnswer::Match(false));
    }
}
