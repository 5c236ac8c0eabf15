//! `-m string` (xt_string revision 1): the plain rule value. The searcher is built at compile
//! time (`eval/string.rs`).

/// Longest pattern of `-m string`, in bytes (`XT_STRING_MAX_PATTERN_SIZE`).
pub const STRING_MAX_PATTERN: usize = 128;

/// `--algo` of `-m string`: the kernel's textsearch algorithm. Both find the same matches in
/// a linear packet, so the engine runs one searcher for either (`eval/string.rs`); the
/// name is kept for printing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StringAlgo {
    /// `bm`: Boyer-Moore (lib/ts_bm.c).
    Bm,
    /// `kmp`: Knuth-Morris-Pratt (lib/ts_kmp.c).
    Kmp,
}

impl StringAlgo {
    /// The name as `--algo` takes and iptables-save prints it.
    pub fn name(self) -> &'static str {
        match self {
            StringAlgo::Bm => "bm",
            StringAlgo::Kmp => "kmp",
        }
    }
}

/// `-m string`, as libxt_string 1.8.9 writes it (`string_save`): matches when `pattern`
/// occurs in the packet's bytes, counted from the first byte of the network (IP) header,
/// starting at or after offset `from` and ending at or before offset `to` (the kernel's
/// `skb_find_text(skb, from, to, ...)`: the first occurrence from `from` on must satisfy
/// `pos + len <= to`). `!` inverts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StringMatch {
    /// `!` before `--string` / `--hex-string`.
    pub negated: bool,
    /// The bytes searched for, 1 to [`STRING_MAX_PATTERN`].
    pub pattern: Vec<u8>,
    /// `--algo`.
    pub algo: StringAlgo,
    /// `--from N` (default 0), an offset from the network header.
    pub from: u16,
    /// `--to N` (default 65535), likewise.
    pub to: u16,
    /// `--icase`: compare with the kernel's `toupper` (ASCII and Latin-1 letters, as
    /// lib/ctype.c).
    pub icase: bool,
}

impl StringMatch {
    /// What xt_string's `string_mt_check` (and `textsearch_prepare`) refuse, as a reason.
    pub fn kernel_refusal(&self) -> Option<&'static str> {
        if self.from > self.to {
            return Some("--from is after --to");
        }
        if self.pattern.is_empty() {
            return Some("the pattern is empty");
        }
        if self.pattern.len() > STRING_MAX_PATTERN {
            return Some("the pattern is longer than 128 bytes");
        }
        None
    }

    /// Whether libxt_string prints the pattern as `--hex-string` (`is_hex_string`: some byte
    /// is not printable ASCII, or the last is a backslash).
    pub fn prints_as_hex(&self) -> bool {
        self.pattern.iter().any(|&b| !(0x20..=0x7e).contains(&b))
            || self.pattern.last() == Some(&b'\\')
    }
}
