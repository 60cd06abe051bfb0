//! A token bucket on absolute time (GCRA), for rate limits with a burst.

use crate::{sat_u64, to_micro, MICRO};

/// `rate` tokens per second, up to `burst` at once; starts full.
///
/// Implemented as GCRA (the "virtual scheduling" form of a token bucket): it keeps the
/// theoretical arrival time of the next token instead of a token count, so there is no refill
/// step, no floating point after construction and no drift. Time is kept in units of
/// 10⁻⁶ ns × rate_micro, in which one token costs exactly 10¹⁵ units.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate_micro: u128,
    /// Cost of `burst` tokens, in internal units.
    tolerance: u128,
    burst: u64,
    /// Theoretical arrival time, in internal units.
    tat: u128,
}

/// One token in internal units: 1 s in ns × 10⁶.
const TOKEN: u128 = 1_000_000_000 * MICRO;

impl TokenBucket {
    /// A bucket of `burst` tokens (at least 1) refilled at `rate` tokens per second (clamped to
    /// at least one per 10⁶ s).
    pub fn new(rate: f64, burst: u32) -> TokenBucket {
        let burst = u64::from(burst.max(1));
        TokenBucket {
            rate_micro: to_micro(rate),
            tolerance: u128::from(burst) * TOKEN,
            burst,
            tat: 0,
        }
    }

    fn after_take(&self, now_ns: u64, n: u64) -> (u128, u128) {
        let now = u128::from(now_ns) * self.rate_micro;
        (now, self.tat.max(now) + u128::from(n) * TOKEN)
    }

    /// Take `n` tokens at `now_ns` if they are there. `n` above the burst never succeeds.
    pub fn try_take(&mut self, now_ns: u64, n: u64) -> bool {
        if n > self.burst {
            return false;
        }
        let (now, tat) = self.after_take(now_ns, n);
        if tat - now <= self.tolerance {
            self.tat = tat;
            true
        } else {
            false
        }
    }

    /// Ns from `now_ns` until `n` tokens are there (0 if they are now); `u64::MAX` if `n` is
    /// above the burst and never will be.
    pub fn time_until(&self, now_ns: u64, n: u64) -> u64 {
        if n > self.burst {
            return u64::MAX;
        }
        let (now, tat) = self.after_take(now_ns, n);
        let wait = (tat - now).saturating_sub(self.tolerance);
        // Round up: waiting the rounded-down ns would find the bucket a fraction short.
        sat_u64(wait.div_ceil(self.rate_micro))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn starts_full_then_refills_at_rate() {
        let mut b = TokenBucket::new(10.0, 5);
        let t0 = 1000 * S;
        for _ in 0..5 {
            assert!(b.try_take(t0, 1));
        }
        assert!(!b.try_take(t0, 1));
        assert_eq!(b.time_until(t0, 1), S / 10);
        assert!(!b.try_take(t0 + S / 10 - 1, 1));
        assert!(b.try_take(t0 + S / 10, 1));
        assert_eq!(b.time_until(t0 + S / 10, 2), 2 * S / 10);
    }

    #[test]
    fn idle_time_does_not_overfill() {
        let mut b = TokenBucket::new(1000.0, 3);
        assert!(b.try_take(0, 3));
        // An hour idle still allows only the burst.
        let t = 3600 * S;
        assert!(b.try_take(t, 3));
        assert!(!b.try_take(t, 1));
    }

    #[test]
    fn more_than_burst_never_fits() {
        let mut b = TokenBucket::new(1000.0, 4);
        assert!(!b.try_take(10 * S, 5));
        assert_eq!(b.time_until(10 * S, 5), u64::MAX);
    }

    #[test]
    fn long_run_rate_is_exact() {
        // Taking greedily at each time_until for 10⁶ tokens at 3/s, burst 2: the first two at
        // once, token k at (k-1)/3 s after that, exact to the 1 ns rounding of the last wait (a
        // wait rounded up never leaks into the next one: the debt is kept in exact units).
        let mut b = TokenBucket::new(3.0, 2);
        let mut now = 0u64;
        for _ in 0..1_000_000 {
            now += b.time_until(now, 1);
            assert!(b.try_take(now, 1));
        }
        let expected = (999_998u128 * 1_000_000_000).div_ceil(3) as u64;
        assert!(now.abs_diff(expected) <= 1, "{now} vs {expected}");
    }

    #[test]
    fn late_taker_with_burst_one_loses_the_idle_time() {
        // A full bucket discards refill: taking 1 ns late each time costs that ns.
        let mut b = TokenBucket::new(1.0, 1);
        assert!(b.try_take(0, 1));
        assert_eq!(b.time_until(S + 1, 1), 0);
        assert!(b.try_take(S + 1, 1));
        assert_eq!(b.time_until(S + 1, 1), S);
    }
}
