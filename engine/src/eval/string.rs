//! `-m string` on the packet path, as xt_string: `skb_find_text(skb, from, to, ts)` over the
//! packet from its network header, which finds the first occurrence of the pattern at or
//! after offset `from` and accepts it when it ends at or before offset `to` (`ret + patlen <=
//! to - from`). Since that occurrence is the leftmost one, the rule matches exactly when the
//! pattern lies wholly inside `bytes[from..min(to, len)]`: one that straddles `to` does not
//! count, even when the packet goes on.
//!
//! The searcher is built at compile time ([`CString::new`], the commit path) and searches
//! without allocating:
//! - case-sensitive: `memchr::memmem::Finder` (two-way with SIMD prefilters), which reports
//!   whether an occurrence exists, the only thing the rule asks; the kernel's bm and kmp
//!   find the same leftmost occurrence in a linear packet, so one searcher serves both
//!   `--algo` names;
//! - `--icase`: Knuth-Morris-Pratt over the bytes mapped by the kernel's `toupper`
//!   (lib/ctype.c: ASCII letters and the Latin-1 lowercase range 0xdf-0xff but 0xf7), as
//!   ts_kmp with `TS_IGNORECASE` (the pattern upper-cased, each text byte mapped as read);
//!   memmem has no case-folding mode.
//!
//! Where it differs from the kernel: Linux's ts_bm restarts at each block of a non-linear
//! skb, so it misses a pattern split across two fragments of a large (GRO-merged or paged)
//! packet; the engine searches the whole buffer it was given and finds it. The bytes come
//! from the packet source (NFQUEUE hands the whole packet, copy range 65535); a packet
//! evaluated without its bytes (a trace, the synthetic source) has none: `--string` is false
//! and `! --string` true for it.

use memchr::memmem::Finder;

use crate::model::StringMatch;

/// The kernel's `toupper` (lib/ctype.c `_ctype`): lowercase ASCII and Latin-1 letters minus
/// 0x20.
const fn kernel_toupper(c: u8) -> u8 {
    match c {
        b'a'..=b'z' | 0xdf..=0xf6 | 0xf8..=0xff => c - 0x20,
        _ => c,
    }
}

const TOUPPER: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = kernel_toupper(i as u8);
        i += 1;
    }
    t
};

// One per compiled rule, itself boxed in `CMatch::String`: boxing the finder as well would
// add a pointer chase per packet for no memory saved.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Searcher {
    Exact(Finder<'static>),
    /// The upper-cased pattern and its KMP failure table (`prefix[i]`: length of the longest
    /// proper border of `pattern[..=i]`; patterns are at most 128 bytes).
    Fold {
        pattern: Box<[u8]>,
        prefix: Box<[u8]>,
    },
}

/// A compiled `-m string`.
#[derive(Debug, Clone)]
pub(crate) struct CString {
    negated: bool,
    from: usize,
    to: usize,
    len: usize,
    searcher: Searcher,
}

impl CString {
    /// Builds the searcher for `m` (commit path; allocates).
    pub(crate) fn new(m: &StringMatch) -> CString {
        let searcher = if m.icase {
            let pattern: Box<[u8]> = m.pattern.iter().map(|&b| TOUPPER[usize::from(b)]).collect();
            let mut prefix = vec![0u8; pattern.len()].into_boxed_slice();
            let mut k = 0usize;
            for i in 1..pattern.len() {
                while k > 0 && pattern[k] != pattern[i] {
                    k = usize::from(prefix[k - 1]);
                }
                if pattern[k] == pattern[i] {
                    k += 1;
                }
                prefix[i] = k as u8;
            }
            Searcher::Fold { pattern, prefix }
        } else {
            Searcher::Exact(Finder::new(&m.pattern).into_owned())
        };
        CString {
            negated: m.negated,
            from: usize::from(m.from),
            to: usize::from(m.to),
            len: m.pattern.len(),
            searcher,
        }
    }

    /// Whether the rule matches a packet whose bytes, from the network header on, are
    /// `packet`. Allocates nothing.
    pub(crate) fn matches(&self, packet: &[u8]) -> bool {
        let end = self.to.min(packet.len());
        let found =
            self.from < end && end - self.from >= self.len && self.occurs(&packet[self.from..end]);
        found != self.negated
    }

    fn occurs(&self, text: &[u8]) -> bool {
        match &self.searcher {
            Searcher::Exact(f) => f.find(text).is_some(),
            Searcher::Fold { pattern, prefix } => {
                let mut q = 0usize;
                for &b in text {
                    let c = TOUPPER[usize::from(b)];
                    while q > 0 && pattern[q] != c {
                        q = usize::from(prefix[q - 1]);
                    }
                    if pattern[q] == c {
                        q += 1;
                    }
                    if q == pattern.len() {
                        return true;
                    }
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StringAlgo;

    fn rule(p: &[u8], from: u16, to: u16, icase: bool, negated: bool) -> CString {
        CString::new(&StringMatch {
            negated,
            pattern: p.to_vec(),
            algo: StringAlgo::Bm,
            from,
            to,
            icase,
        })
    }

    #[test]
    fn the_pattern_must_lie_within_from_and_to() {
        let pkt = b"0123456789abcdef";
        assert!(rule(b"abc", 0, u16::MAX, false, false).matches(pkt));
        assert!(
            rule(b"abc", 10, 13, false, false).matches(pkt),
            "ends at to"
        );
        assert!(
            !rule(b"abc", 10, 12, false, false).matches(pkt),
            "straddles to"
        );
        assert!(
            !rule(b"abc", 11, 100, false, false).matches(pkt),
            "starts before from"
        );
        assert!(
            !rule(b"abc", 20, 100, false, false).matches(pkt),
            "from past the end"
        );
        assert!(!rule(b"f0", 0, u16::MAX, false, false).matches(pkt));
        assert!(
            rule(b"zz", 0, u16::MAX, false, true).matches(pkt),
            "inverted"
        );
        assert!(
            rule(b"abc", 0, 0, false, true).matches(pkt),
            "--to 0: never found"
        );
    }

    #[test]
    fn icase_folds_as_the_kernels_toupper() {
        let r = rule(b"get /WP-login", 0, u16::MAX, true, false);
        assert!(r.matches(b"xxGeT /wp-LOGIN.php"));
        assert!(!r.matches(b"xxGeT /wp_LOGIN.php"));
        // KMP restarts inside a partial match: "aab" in "aaab".
        assert!(rule(b"AAB", 0, u16::MAX, true, false).matches(b"aaab"));
        // Latin-1: 0xe9 (e acute) folds to 0xc9; 0xf7 (division sign) does not fold to 0xd7.
        assert!(rule(&[0xc9], 0, u16::MAX, true, false).matches(&[0xe9]));
        assert!(!rule(&[0xd7], 0, u16::MAX, true, false).matches(&[0xf7]));
        assert!(!rule(b"A", 0, u16::MAX, false, false).matches(b"a"));
    }
}
