//! Intended send times under a rate profile, as ns offsets from the query phase's start.
//!
//! A constant rate uses `tcpkit_pace::ArrivalClock` at that rate directly (exact integer
//! schedule). Steps and ramps use the time-rescaling theorem: arrivals of a unit-rate process
//! (constant or Poisson, from the same `ArrivalClock`) are cumulative expected counts Λ, and
//! each is mapped to the time t where ∫₀ᵗ rate = Λ. A Poisson process stays Poisson (with the
//! varying rate) and a constant one stays evenly spaced in Λ; all times still come from one
//! start, never from the previous send.

use tcpkit_pace::{ArrivalClock, Arrivals};

use super::config::{ArrivalKind, RateProfile};

#[derive(Debug)]
pub(crate) struct ArrivalTimes {
    clock: ArrivalClock,
    map: Map,
}

#[derive(Debug)]
enum Map {
    /// The clock runs at the asked rate: its times are the send times.
    Direct,
    /// Piecewise-constant rate: `(start_ns, start_lambda, rate per ns)` per segment; `seg`
    /// remembers where the last lookup ended (Λ only grows).
    Steps {
        segs: Vec<(f64, f64, f64)>,
        seg: usize,
    },
    /// Rate from `r0` to `r1` (per ns) over `t_ns`, then `r1`.
    Ramp { r0: f64, r1: f64, t_ns: f64 },
}

impl ArrivalTimes {
    pub(crate) fn new(profile: &RateProfile, kind: ArrivalKind) -> ArrivalTimes {
        let unit = |rate: f64| match kind {
            ArrivalKind::Constant => ArrivalClock::new(Arrivals::Constant { rate }),
            ArrivalKind::Poisson { seed } => ArrivalClock::new(Arrivals::Poisson { rate, seed }),
        };
        match profile {
            RateProfile::Constant(r) => ArrivalTimes {
                clock: unit(*r),
                map: Map::Direct,
            },
            RateProfile::Steps(steps) => {
                let mut segs = Vec::with_capacity(steps.len());
                let (mut t, mut l) = (0.0, 0.0);
                for &(d, r) in steps {
                    let per_ns = r / 1e9;
                    segs.push((t, l, per_ns));
                    let d = d.as_nanos() as f64;
                    t += d;
                    l += per_ns * d;
                }
                ArrivalTimes {
                    // One arrival per second of this clock is one unit of Λ.
                    clock: unit(1.0),
                    map: Map::Steps { segs, seg: 0 },
                }
            }
            RateProfile::Ramp { from, to, over } => ArrivalTimes {
                clock: unit(1.0),
                map: Map::Ramp {
                    r0: from / 1e9,
                    r1: to / 1e9,
                    t_ns: over.as_nanos() as f64,
                },
            },
        }
    }

    /// The next intended send time (ns after the start); `u64::MAX` when the rate has dropped
    /// to zero for good.
    pub(crate) fn next_ns(&mut self) -> u64 {
        let raw = self.clock.next().unwrap_or(u64::MAX);
        match &mut self.map {
            Map::Direct => raw,
            Map::Steps { segs, seg } => {
                let lambda = raw as f64 / 1e9;
                // The last segment whose start Λ is at or below `lambda` and whose rate is not
                // zero (a zero-rate segment has no arrivals in it).
                while *seg + 1 < segs.len() && segs[*seg + 1].1 <= lambda {
                    *seg += 1;
                }
                let mut s = *seg;
                while segs[s].2 <= 0.0 {
                    if s + 1 >= segs.len() {
                        return u64::MAX;
                    }
                    s += 1;
                }
                let (t0, l0, r) = segs[s];
                to_ns(t0 + (lambda - l0).max(0.0) / r)
            }
            Map::Ramp { r0, r1, t_ns } => {
                let lambda = raw as f64 / 1e9;
                let a = (*r1 - *r0) / (2.0 * *t_ns);
                let at_end = *r0 * *t_ns + a * *t_ns * *t_ns;
                if lambda <= at_end {
                    // r0·t + a·t² = Λ, in the form that stays exact when a is 0 or negative.
                    let disc = (*r0 * *r0 + 4.0 * a * lambda).max(0.0);
                    let den = *r0 + disc.sqrt();
                    if den <= 0.0 {
                        return 0;
                    }
                    to_ns(2.0 * lambda / den)
                } else if *r1 > 0.0 {
                    to_ns(*t_ns + (lambda - at_end) / *r1)
                } else {
                    u64::MAX
                }
            }
        }
    }
}

fn to_ns(t: f64) -> u64 {
    if (0.0..1.8e19).contains(&t) {
        t as u64
    } else {
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn count_before(p: &RateProfile, kind: ArrivalKind, t_ns: u64) -> u64 {
        let mut a = ArrivalTimes::new(p, kind);
        let mut n = 0;
        while a.next_ns() < t_ns {
            n += 1;
        }
        n
    }

    #[test]
    fn constant_is_the_clock() {
        let mut a = ArrivalTimes::new(&RateProfile::Constant(4.0), ArrivalKind::Constant);
        let v: Vec<u64> = (0..3).map(|_| a.next_ns()).collect();
        assert_eq!(v, [0, 250_000_000, 500_000_000]);
    }

    #[test]
    fn steps_follow_each_rate() {
        let p = RateProfile::Steps(vec![
            (Duration::from_secs(1), 1000.0),
            (Duration::from_secs(1), 0.0),
            (Duration::from_secs(1), 3000.0),
        ]);
        let mut a = ArrivalTimes::new(&p, ArrivalKind::Constant);
        let times: Vec<u64> = (0..4000).map(|_| a.next_ns()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        let in_range =
            |lo: u64, hi: u64| times.iter().filter(|&&t| t >= lo && t < hi).count() as i64;
        assert!((in_range(0, 1_000_000_000) - 1000).abs() <= 1);
        assert_eq!(in_range(1_000_000_000, 2_000_000_000), 0);
        assert!((in_range(2_000_000_000, 3_000_000_000) - 3000).abs() <= 1);
        // Constant within a step: 1 ms gaps in the first, 333 µs in the last.
        assert!((times[11] - times[10]).abs_diff(1_000_000) < 2);
        assert!((times[2011] - times[2010]).abs_diff(333_333) < 2);
    }

    #[test]
    fn ramp_count_matches_the_integral() {
        let p = RateProfile::Ramp {
            from: 1000.0,
            to: 5000.0,
            over: Duration::from_secs(2),
        };
        for kind in [ArrivalKind::Constant, ArrivalKind::Poisson { seed: 3 }] {
            let n = count_before(&p, kind, 2_000_000_000) as f64;
            // Expected 6000; Poisson's sd is ~77.
            assert!((n - 6000.0).abs() < 300.0, "{kind:?}: {n}");
            let n2 = count_before(&p, kind, 3_000_000_000) as f64;
            assert!((n2 - 11_000.0).abs() < 400.0, "{kind:?}: {n2}");
        }
        // Rising rate: the gaps shrink.
        let mut a = ArrivalTimes::new(&p, ArrivalKind::Constant);
        let t: Vec<u64> = (0..5000).map(|_| a.next_ns()).collect();
        assert!(t[11] - t[10] > t[4001] - t[4000]);
        // A falling ramp to zero ends.
        let down = RateProfile::Ramp {
            from: 1000.0,
            to: 0.0,
            over: Duration::from_secs(1),
        };
        assert!((count_before(&down, ArrivalKind::Constant, u64::MAX - 1) as i64 - 500).abs() <= 1);
    }
}
