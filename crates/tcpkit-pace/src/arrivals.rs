//! Open-loop arrival times for `load`: when each request is intended to be sent.

use crate::{sat_u64, to_micro, MICRO};

/// An arrival process.
#[derive(Clone, Copy, Debug)]
pub enum Arrivals {
    /// `rate` arrivals per second, evenly spaced.
    Constant {
        /// Arrivals per second.
        rate: f64,
    },
    /// A Poisson process of `rate` arrivals per second (exponential gaps), reproducible from
    /// `seed`.
    Poisson {
        /// Mean arrivals per second.
        rate: f64,
        /// Seed of the gap generator: the same seed gives the same times.
        seed: u64,
    },
}

/// Intended send times, as ns offsets from one start, in order. Never ends (saturates at
/// `u64::MAX`); the caller's stop condition ends the run.
///
/// Constant: `n · 10⁹ / rate`, computed from n each time. Poisson: the running sum of
/// exponential gaps drawn by inverse transform, with the sub-ns remainder carried so rounding
/// neither drifts nor biases the mean.
#[derive(Clone, Debug)]
pub struct ArrivalClock {
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    Constant {
        rate_micro: u128,
        n: u128,
    },
    Poisson {
        mean_gap_ns: f64,
        rng: SplitMix64,
        whole_ns: u64,
        frac_ns: f64,
        first: bool,
    },
}

impl ArrivalClock {
    /// The arrival times of `arrivals`. A rate that is not a positive finite number is clamped
    /// to one arrival per 10⁶ s (the config layer rejects it first).
    pub fn new(arrivals: Arrivals) -> ArrivalClock {
        let kind = match arrivals {
            Arrivals::Constant { rate } => Kind::Constant {
                rate_micro: to_micro(rate),
                n: 0,
            },
            Arrivals::Poisson { rate, seed } => Kind::Poisson {
                mean_gap_ns: 1e9 * MICRO as f64 / to_micro(rate) as f64,
                rng: SplitMix64::new(seed),
                whole_ns: 0,
                frac_ns: 0.0,
                first: true,
            },
        };
        ArrivalClock { kind }
    }
}

impl Iterator for ArrivalClock {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        match &mut self.kind {
            Kind::Constant { rate_micro, n } => {
                let at = constant_micro_at(*rate_micro, *n);
                *n += 1;
                Some(at)
            }
            Kind::Poisson {
                mean_gap_ns,
                rng,
                whole_ns,
                frac_ns,
                first,
            } => {
                // The first arrival is at the start, like the constant process; gaps follow.
                if std::mem::take(first) {
                    return Some(0);
                }
                let gap = -rng.next_open01().ln() * *mean_gap_ns + *frac_ns;
                let whole = gap.floor();
                *frac_ns = gap - whole;
                // `as` saturates for huge values, and saturating_add keeps the end at u64::MAX.
                *whole_ns = whole_ns.saturating_add(whole as u64);
                Some(*whole_ns)
            }
        }
    }
}

/// When arrival `n` (from 0) of `rate` evenly spaced arrivals per second is due: `n · 10⁹ /
/// rate` ns after the start, exactly as [`ArrivalClock`] gives it. For a caller that takes
/// some of the arrivals of a schedule it shares with others (one of several load shards, or a
/// thread's connections) and must put each exactly where the whole schedule has it.
pub fn constant_at(rate: f64, n: u64) -> u64 {
    constant_micro_at(to_micro(rate), u128::from(n))
}

fn constant_micro_at(rate_micro: u128, n: u128) -> u64 {
    sat_u64(n * MICRO * 1_000_000_000 / rate_micro)
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, passes BigCrush; enough for arrival gaps,
/// and it avoids a dependency on `rand`.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so `ln` is finite.
    fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_is_computed_from_n() {
        let got: Vec<u64> = ArrivalClock::new(Arrivals::Constant { rate: 3.0 })
            .take(4)
            .collect();
        assert_eq!(got, vec![0, 333_333_333, 666_666_666, 1_000_000_000]);
        let millionth = ArrivalClock::new(Arrivals::Constant { rate: 3.0 }).nth(3_000_000);
        assert_eq!(millionth, Some(1_000_000 * 1_000_000_000));
        // Any arrival, computed on its own, is where the clock puts it.
        let clock: Vec<u64> = ArrivalClock::new(Arrivals::Constant { rate: 7.3 })
            .take(50)
            .collect();
        for (n, at) in clock.iter().enumerate() {
            assert_eq!(constant_at(7.3, n as u64), *at);
        }
        // Far past 584 years: never, not a wrapped time.
        assert_eq!(constant_at(3.0, u64::MAX), u64::MAX);
    }

    #[test]
    fn poisson_is_reproducible_and_increasing() {
        let a: Vec<u64> = ArrivalClock::new(Arrivals::Poisson { rate: 1e4, seed: 7 })
            .take(1000)
            .collect();
        let b: Vec<u64> = ArrivalClock::new(Arrivals::Poisson { rate: 1e4, seed: 7 })
            .take(1000)
            .collect();
        assert_eq!(a, b);
        assert_eq!(a[0], 0);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        let c: Vec<u64> = ArrivalClock::new(Arrivals::Poisson { rate: 1e4, seed: 8 })
            .take(1000)
            .collect();
        assert_ne!(a, c);
    }

    /// 10⁶ gaps: mean within 1 %, and Kolmogorov–Smirnov distance to the exponential CDF below
    /// the 1 % critical value 1.628/√n.
    #[test]
    fn poisson_gaps_are_exponential() {
        let n = 1_000_000usize;
        let rate = 20_000.0; // mean gap 50 µs: large against the 1 ns rounding
        let mean = 1e9 / rate;
        let times: Vec<u64> = ArrivalClock::new(Arrivals::Poisson { rate, seed: 42 })
            .take(n + 1)
            .collect();
        let mut gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        let got_mean = (times[n] - times[0]) as f64 / n as f64;
        assert!(
            (got_mean - mean).abs() / mean < 0.01,
            "mean gap {got_mean} vs {mean}"
        );
        gaps.sort_by(f64::total_cmp);
        let mut d: f64 = 0.0;
        for (i, g) in gaps.iter().enumerate() {
            // Gaps are whole ns: compare the CDF at the top of each ns bucket.
            let f = 1.0 - (-(g + 0.5) / mean).exp();
            d = d
                .max(((i + 1) as f64 / n as f64 - f).abs())
                .max((f - i as f64 / n as f64).abs());
        }
        let critical = 1.628 / (n as f64).sqrt();
        assert!(d < critical, "KS statistic {d} >= {critical}");
    }

    #[test]
    fn splitmix_reference_values() {
        // First outputs for seed 0, from the reference C implementation.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }
}
