//! A deterministic random sequence for the unit tests' generated inputs (xorshift64*: no
//! dependency, the same cases on every run).

/// xorshift64* state; any non-zero seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// A number in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}
