//! `-m u32` (xt_u32): the plain rule value, as libxt_u32 (iptables 1.8.9) builds `struct
//! xt_u32`. The packet test is `snapshot/u32.rs`.

/// Most tests (`&&`-joined), numbers of a location and ranges of a test (`XT_U32_MAXSIZE`).
pub const U32_MAX_ITEMS: usize = 10;

/// An operator of a u32 location (`enum xt_u32_ops`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum U32Op {
    /// `&N`: AND with N.
    And,
    /// `<<N`: shift left (the kernel refuses N above 31).
    Shl,
    /// `>>N`: shift right (N at most 31).
    Shr,
    /// `@N`: move the base by the value and read the 4 bytes at base + N.
    At,
}

impl U32Op {
    /// As u32_dump prints it.
    pub fn text(self) -> &'static str {
        match self {
            U32Op::And => "&",
            U32Op::Shl => "<<",
            U32Op::Shr => ">>",
            U32Op::At => "@",
        }
    }
}

/// One test: the 4 bytes at `start` (big-endian), each `(op, number)` of `ops` applied in
/// turn, and the result within one of `ranges` (inclusive; a range whose `min` is above its
/// `max` holds nothing).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct U32Test {
    /// The first location number: a byte offset from the network header.
    pub start: u32,
    /// At most [`U32_MAX_ITEMS`] - 1 operations.
    pub ops: Vec<(U32Op, u32)>,
    /// 1 to [`U32_MAX_ITEMS`] ranges `(min, max)`.
    pub ranges: Vec<(u32, u32)>,
}

/// `[!] --u32 TESTS`: every test holds (1 to [`U32_MAX_ITEMS`] of them); `!` inverts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct U32Match {
    /// `!` before `--u32`.
    pub negated: bool,
    /// The `&&`-joined tests.
    pub tests: Vec<U32Test>,
}

impl U32Match {
    /// What the kernel's `u32_mt_checkentry` refuses: too many tests, numbers or ranges, or a
    /// shift by 32 or more (measured: Linux 6.18 refuses `<<32` and `>>32`).
    pub fn kernel_refusal(&self) -> Option<&'static str> {
        if self.tests.is_empty() || self.tests.len() > U32_MAX_ITEMS {
            return Some("1 to 10 tests");
        }
        for t in &self.tests {
            if t.ops.len() + 1 > U32_MAX_ITEMS || t.ranges.is_empty() {
                return Some("a test has 1 to 10 location numbers and 1 to 10 ranges");
            }
            if t.ranges.len() > U32_MAX_ITEMS {
                return Some("a test has 1 to 10 location numbers and 1 to 10 ranges");
            }
            if t.ops
                .iter()
                .any(|&(op, n)| matches!(op, U32Op::Shl | U32Op::Shr) && n > 31)
            {
                return Some("a shift is by 0 to 31 bits");
            }
        }
        None
    }
}
