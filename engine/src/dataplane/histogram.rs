//! A small log-linear histogram of picosecond values: the per-core record of sampled barrier
//! cost per packet, and the summed, plain-number [`Histogram`] an exporter reads.
//!
//! Buckets: values 0..=3 ps have one bucket each; above that every power of two `[2^e, 2^(e+1))`
//! is split into 4 equal sub-buckets, so a bucket is at most 25 % wide relative to its lower
//! bound (e.g. 256..320, 320..384, 384..448, 448..512 ps). 252 buckets cover all of `u64`.
//! Picoseconds give sub-nanosecond resolution for targets like "<= 0.2 ns per packet".

use crate::sync::stat::{AtomicU64, Ordering};

/// Number of buckets: 4 exact ones for 0..=3, then 4 per power of two for exponents 2..=63.
pub const BUCKETS: usize = 4 + 4 * 62;

/// The bucket index of a value (in ps).
#[inline]
pub(crate) fn bucket_of(v: u64) -> usize {
    if v < 4 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() as usize; // >= 2
    let sub = ((v >> (e - 2)) & 3) as usize;
    4 * (e - 1) + sub
}

/// The inclusive lower bound of bucket `i`, in ps.
fn lower_bound(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let e = i / 4 + 1;
    let sub = (i % 4) as u64;
    (4 + sub) << (e - 2)
}

/// The exclusive upper bound of bucket `i`, in ps (saturates at `u64::MAX` for the last one).
fn upper_bound(i: usize) -> u64 {
    if i + 1 < BUCKETS {
        lower_bound(i + 1)
    } else {
        u64::MAX
    }
}

// === impl CoreHistogram ===

/// One core's histogram: written only by the core's worker (1 batch in 1024), read by exporters.
pub(crate) struct CoreHistogram {
    buckets: Box<[AtomicU64]>,
    sum_ps: AtomicU64,
}

impl CoreHistogram {
    pub(crate) fn new() -> CoreHistogram {
        CoreHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ps: AtomicU64::new(0),
        }
    }

    /// Records one value (ps). Only the owning worker calls this, so a Relaxed load + store is
    /// an exact increment; readers use Relaxed loads and may see a count and sum from slightly
    /// different moments (acceptable for metrics; no other memory is ordered by these).
    pub(crate) fn record(&self, ps: u64) {
        let b = &self.buckets[bucket_of(ps)];
        b.store(b.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let s = self.sum_ps.load(Ordering::Relaxed);
        self.sum_ps.store(s.wrapping_add(ps), Ordering::Relaxed);
    }

    /// Adds this core's counts into `into`.
    pub(crate) fn add_to(&self, into: &mut Histogram) {
        for (dst, src) in into.buckets.iter_mut().zip(self.buckets.iter()) {
            // Relaxed: a statistics read, see `record`.
            *dst += src.load(Ordering::Relaxed);
        }
        into.sum_ps = into
            .sum_ps
            .wrapping_add(self.sum_ps.load(Ordering::Relaxed));
    }
}

// === impl Histogram ===

/// A point-in-time copy of a histogram of picosecond values (the dataplane's sampled barrier
/// cost per packet, summed over cores).
///
/// For a Prometheus/OTel exporter: iterate [`Histogram::buckets`] for `(upper bound, count)`
/// pairs and convert bounds with [`Histogram::ps_to_seconds`]; `vallum_packet_barrier_seconds`
/// expects seconds. Bounds are exclusive upper bounds (a value equal to a bound lands in the next
/// bucket); Prometheus `le` buckets are inclusive, a difference of one picosecond.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    buckets: Vec<u64>,
    sum_ps: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::new()
    }
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram {
            buckets: vec![0; BUCKETS],
            sum_ps: 0,
        }
    }

    /// Records one value in picoseconds (for tests and for merging foreign samples).
    pub fn record(&mut self, ps: u64) {
        self.buckets[bucket_of(ps)] += 1;
        self.sum_ps = self.sum_ps.wrapping_add(ps);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Sum of recorded values, in picoseconds (wraps after ~213 days of summed time).
    pub fn sum_ps(&self) -> u64 {
        self.sum_ps
    }

    /// Mean of recorded values in picoseconds; `None` when empty.
    pub fn mean_ps(&self) -> Option<f64> {
        let n = self.count();
        (n > 0).then(|| self.sum_ps as f64 / n as f64)
    }

    /// The `q`-quantile (`q` in `0.0..=1.0`, clamped) in picoseconds, linearly interpolated
    /// inside the bucket that holds it (so the error is at most the bucket width, <= 25 %);
    /// `None` when empty.
    pub fn quantile_ps(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        // The rank (1-based) of the value we look for.
        let rank = ((q * n as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.buckets.iter().enumerate() {
            if c == 0 {
                continue;
            }
            if seen + c >= rank {
                let lo = lower_bound(i) as f64;
                let hi = upper_bound(i) as f64;
                let frac = (rank - seen) as f64 / c as f64;
                return Some(lo + (hi - lo) * frac);
            }
            seen += c;
        }
        None
    }

    /// Non-empty buckets as `(exclusive upper bound in ps, count)`, in increasing order.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (upper_bound(i), *c))
    }

    /// Converts picoseconds to seconds (for exporters).
    pub fn ps_to_seconds(ps: u64) -> f64 {
        ps as f64 * 1e-12
    }

    /// Adds another histogram's counts into this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += *b;
        }
        self.sum_ps = self.sum_ps.wrapping_add(other.sum_ps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_their_values() {
        for i in 0..BUCKETS - 1 {
            assert!(lower_bound(i) < upper_bound(i), "bucket {i}");
            assert_eq!(upper_bound(i), lower_bound(i + 1));
        }
        for v in (0..5000u64).chain([u64::MAX, u64::MAX / 3, 1 << 40]) {
            let i = bucket_of(v);
            assert!(lower_bound(i) <= v, "v={v} i={i}");
            assert!(v < upper_bound(i) || i == BUCKETS - 1, "v={v} i={i}");
        }
    }

    #[test]
    fn quantiles_are_within_a_bucket() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 10); // 10 ps .. 10 ns
        }
        assert_eq!(h.count(), 1000);
        let p50 = h.quantile_ps(0.5).unwrap_or_default();
        assert!((4000.0..=6250.0).contains(&p50), "p50 = {p50}");
        let p99 = h.quantile_ps(0.99).unwrap_or_default();
        assert!((9900.0 * 0.8..=9900.0 * 1.25).contains(&p99), "p99 = {p99}");
        assert_eq!(h.mean_ps(), Some(5005.0));
        assert_eq!(Histogram::new().quantile_ps(0.5), None);
    }
}
