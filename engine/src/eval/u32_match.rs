//! `-m u32` on the packet path, as xt_u32's `u32_match_it` over the packet from its network
//! header (`skb->len` is the layer-3 length): each test reads the 4 bytes at its start
//! (big-endian), applies its operations (`&`, `<<`, `>>` with the shift below 32, `@`: the
//! base moves by the value, the 4 bytes at base + N are read), and holds when the value is in
//! one of its ranges; every test must hold. A read past the packet, or a base that wraps,
//! makes the test (and the rule) false, not a drop.
//!
//! The bytes are the packet source's (NFQUEUE copies the whole packet while an enforced rule
//! has `-m u32`: [`super::copy_range`]); a packet evaluated without bytes (a trace, the pcap
//! and synthetic sources) has none: `--u32` is false and `! --u32` true for it, as `-m
//! string` (validation warns where the source keeps no bytes). Bounded: at most 10 tests of
//! at most 10 steps; no allocation.

use crate::model::{U32Match, U32Op};

/// Whether `m` matches a packet with `bytes` (from its network header; empty: none given)
/// whose layer-3 length is `len`.
pub(crate) fn u32_matches(m: &U32Match, bytes: &[u8], len: u32) -> bool {
    if bytes.is_empty() {
        return m.negated;
    }
    // skb->len, within the bytes we have (the copy is the whole packet).
    let len = (len as usize).min(bytes.len()) as u32;
    let word = |pos: u32| -> u32 {
        let p = pos as usize;
        u32::from_be_bytes([bytes[p], bytes[p + 1], bytes[p + 2], bytes[p + 3]])
    };
    let all = m.tests.iter().all(|t| {
        if len < 4 || t.start > len - 4 {
            return false;
        }
        let mut val = word(t.start);
        let mut at: u32 = 0;
        for &(op, number) in &t.ops {
            match op {
                U32Op::And => val &= number,
                U32Op::Shl => val = val.wrapping_shl(number),
                U32Op::Shr => val = val.wrapping_shr(number),
                U32Op::At => {
                    let Some(base) = at.checked_add(val) else {
                        return false;
                    };
                    at = base;
                    let Some(end) = at.checked_add(4) else {
                        return false;
                    };
                    if len < end || number > len - at - 4 {
                        return false;
                    }
                    val = word(at + number);
                }
            }
        }
        t.ranges.iter().any(|&(lo, hi)| lo <= val && val <= hi)
    });
    all != m.negated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::U32Test;

    fn test(start: u32, ops: &[(U32Op, u32)], ranges: &[(u32, u32)]) -> U32Test {
        U32Test {
            start,
            ops: ops.to_vec(),
            ranges: ranges.to_vec(),
        }
    }

    #[test]
    fn reads_as_u32_match_it() {
        // IPv4, IHL 5, TCP to port 80 with a payload starting "GET ".
        let mut b = vec![
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        b.extend_from_slice(&[0x13, 0x88, 0, 80, 0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x18, 0, 0]);
        b.extend_from_slice(&[0, 0, 0, 0]);
        b.extend_from_slice(b"GET / HTTP/1.1");
        let len = b.len() as u32;
        let m = |tests: Vec<U32Test>, negated| U32Match { negated, tests };
        // "6 & 0xFF = 6": protocol TCP.
        let tcp = test(6, &[(U32Op::And, 0xff)], &[(6, 6)]);
        assert!(u32_matches(&m(vec![tcp.clone()], false), &b, len));
        assert!(!u32_matches(&m(vec![tcp.clone()], true), &b, len));
        // "0>>22&0x3C@12>>26&0x3C@0=0x47455420": the payload starts with "GET ".
        let get = test(
            0,
            &[
                (U32Op::Shr, 22),
                (U32Op::And, 0x3c),
                (U32Op::At, 12),
                (U32Op::Shr, 26),
                (U32Op::And, 0x3c),
                (U32Op::At, 0),
            ],
            &[(0x4745_5420, 0x4745_5420)],
        );
        assert!(u32_matches(&m(vec![tcp, get.clone()], false), &b, len));
        // Past the end: false, also for the inverted test's inner tests.
        assert!(!u32_matches(
            &m(vec![test(len - 3, &[], &[(0, u32::MAX)])], false),
            &b,
            len
        ));
        assert!(u32_matches(
            &m(vec![test(len - 4, &[], &[(0, u32::MAX)])], false),
            &b,
            len
        ));
        // The at-jump past the end.
        let far = test(0, &[(U32Op::At, len)], &[(0, u32::MAX)]);
        assert!(!u32_matches(&m(vec![far], false), &b, len));
        // No bytes: false, negated true.
        assert!(!u32_matches(&m(vec![get.clone()], false), &[], len));
        assert!(u32_matches(&m(vec![get], true), &[], len));
    }
}
