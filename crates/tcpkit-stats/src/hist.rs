//! HDR histograms of nanosecond values (timing error, latency), mergeable per worker.

use serde::Serialize;

/// Values from 1 ns to one hour at 3 significant digits: ~200 KiB, allocated once per worker.
#[derive(Debug, Clone)]
pub struct Histogram {
    inner: hdrhistogram::Histogram<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

const HIGHEST_NS: u64 = 3_600_000_000_000;

impl Histogram {
    pub fn new() -> Histogram {
        let inner = hdrhistogram::Histogram::new_with_bounds(1, HIGHEST_NS, 3)
            .expect("static histogram bounds are valid");
        Histogram { inner }
    }

    /// Records one value in ns; values beyond an hour saturate rather than being lost.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.inner.saturating_record(ns.max(1));
    }

    pub fn merge(&mut self, other: &Histogram) {
        // Same bounds on both sides, so addition cannot fail; saturate if it ever did.
        if self.inner.add(&other.inner).is_err() {
            for v in other.inner.iter_recorded() {
                self.inner
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.inner.len()
    }

    pub fn value_at_quantile(&self, q: f64) -> u64 {
        self.inner.value_at_quantile(q)
    }

    pub fn percentiles(&self) -> Percentiles {
        let h = &self.inner;
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            mean_ns: h.mean() as u64,
            p50_ns: h.value_at_quantile(0.50),
            p90_ns: h.value_at_quantile(0.90),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            p9999_ns: h.value_at_quantile(0.9999),
            max_ns: h.max(),
        }
    }
}

/// The percentiles every report prints (wrk2's set), in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub p9999_ns: u64,
    pub max_ns: u64,
}

/// Formats ns the way latency tables read best: µs below 10 ms, ms above.
pub(crate) fn fmt_ns(ns: u64) -> String {
    if ns < 10_000_000 {
        format!("{:.1} us", ns as f64 / 1_000.0)
    } else {
        format!("{:.2} ms", ns as f64 / 1_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_values() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p = h.percentiles();
        assert_eq!(p.count, 1000);
        // 3 significant digits: within 0.1 %.
        assert!(
            (p.p50_ns as f64 - 500_000.0).abs() / 500_000.0 < 0.002,
            "{p:?}"
        );
        assert!(
            (p.p99_ns as f64 - 990_000.0).abs() / 990_000.0 < 0.002,
            "{p:?}"
        );
        assert!(
            (p.max_ns as f64 - 1_000_000.0).abs() / 1_000_000.0 < 0.002,
            "{p:?}"
        );
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        a.record(10);
        b.record(20);
        b.record(u64::MAX);
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert!(a.percentiles().max_ns >= HIGHEST_NS);
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Histogram::new().percentiles(), Percentiles::default());
    }

    #[test]
    fn fmt_units() {
        assert_eq!(fmt_ns(1500), "1.5 us");
        assert_eq!(fmt_ns(25_000_000), "25.00 ms");
    }
}
