//! [`LatencyHistogram`]: a Prometheus histogram whose `observe` is a few relaxed atomic adds
//! (no lock), for request, append and flush latencies on the hot path.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bucket upper bounds (seconds) for latencies from 50 µs to 10 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// Bucket upper bounds (seconds) for slow things such as rebalance convergence: 10 ms to 5 min.
pub const SLOW_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Debug)]
struct Inner {
    /// Upper bounds in seconds (as exported).
    bounds: &'static [f64],
    /// Upper bounds in nanoseconds (for the comparison in `observe`).
    bounds_nanos: Box<[u64]>,
    /// One count per bound plus the `+Inf` bucket (not cumulative).
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

/// A histogram of durations with fixed buckets. Clones share the same counts, so a module can
/// keep a clone on its hot path while the registry encodes another.
///
/// The sum is kept in whole nanoseconds (it wraps after 584 years of accumulated time).
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    inner: Arc<Inner>,
}

impl Default for LatencyHistogram {
    /// Buckets from 50 µs to 10 s ([`LATENCY_BUCKETS`]).
    fn default() -> Self {
        Self::with_buckets(LATENCY_BUCKETS)
    }
}

impl LatencyHistogram {
    /// A histogram with these upper bounds in seconds (ascending; `+Inf` is implied).
    pub fn with_buckets(bounds: &'static [f64]) -> Self {
        let bounds_nanos: Box<[u64]> = bounds.iter().map(|b| (b * 1e9) as u64).collect();
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self {
            inner: Arc::new(Inner {
                bounds,
                bounds_nanos,
                counts,
                sum_nanos: AtomicU64::new(0),
            }),
        }
    }

    /// Records one observation.
    #[inline]
    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self.inner.bounds_nanos.partition_point(|b| *b < nanos);
        if let Some(c) = self.inner.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Records one observation given in seconds (negative values count as zero).
    pub fn observe_secs(&self, secs: f64) {
        self.observe(Duration::from_secs_f64(secs.max(0.0)));
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of all observations, seconds.
    pub fn sum_secs(&self) -> f64 {
        self.inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// `(upper bound, count in that bucket)` pairs, `+Inf` last (not cumulative).
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.inner.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect()
    }

    /// An estimate of quantile `q` (0..=1): the upper bound of the bucket it falls in
    /// (`None` when empty; the largest finite bound when it falls in `+Inf`).
    pub fn quantile_upper_bound(&self, q: f64) -> Option<f64> {
        let buckets = self.buckets();
        let total: u64 = buckets.iter().map(|(_, c)| c).sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bound, c) in &buckets {
            seen += c;
            if seen >= rank {
                return Some(if bound.is_finite() {
                    *bound
                } else {
                    self.inner.bounds.last().copied().unwrap_or(0.0)
                });
            }
        }
        None
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let buckets = self.buckets();
        let count = buckets.iter().map(|(_, c)| c).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum_secs(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_buckets() {
        let h = LatencyHistogram::with_buckets(&[0.001, 0.01]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1)); // on the bound: le="0.001"
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(1));
        assert_eq!(h.buckets(), vec![(0.001, 2), (0.01, 1), (f64::INFINITY, 1)]);
        assert_eq!(h.count(), 4);
        assert!((h.sum_secs() - 1.0065).abs() < 1e-9);
        assert_eq!(h.quantile_upper_bound(0.5), Some(0.001));
        assert_eq!(h.quantile_upper_bound(0.75), Some(0.01));
        assert_eq!(h.quantile_upper_bound(1.0), Some(0.01));
    }

    #[test]
    fn clones_share_counts() {
        let h = LatencyHistogram::default();
        let c = h.clone();
        c.observe_secs(0.2);
        assert_eq!(h.count(), 1);
        assert_eq!(LatencyHistogram::default().quantile_upper_bound(0.5), None);
    }
}
