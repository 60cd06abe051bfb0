//! tcpkit-pace: time and rate.
//!
//! Everything here answers "when is the next event due?" from one absolute start, in integer
//! nanoseconds, so that schedules never drift on long runs (wrk2: `start + n / rate`, never
//! `last + gap`):
//! - [`Schedule`]: per-packet offsets for `replay` (capture timing with a multiplier, `--pps`,
//!   `--pps-multi`, `--mbps`, `--topspeed`, `--maxsleep`, loops with a loop delay);
//! - [`CaptureClock`] and [`Speed`]: a capture played at its own pace (copy's `--input`,
//!   `--speed`, `--max-idle`), idle gaps capped, and capture time scaled both ways;
//! - [`Pacer`]: the hybrid wait (sleep on an absolute deadline, then spin) that turns an offset
//!   into a send time without holding a core at low rates;
//! - [`ArrivalClock`]: open-loop arrival times for `load` (constant or Poisson);
//! - [`TokenBucket`]: an absolute-time (GCRA) rate limiter with a burst;
//! - [`units`]: how every flag spells a duration (`2`, `2s`, `500ms`), a size (`64M`) or bytes
//!   (`PING\r\n`, `\x00`).
//!
//! Schedules, arrivals and buckets do no clock reads: they are pure arithmetic over the
//! caller's `now_ns()`, which keeps them exact and unit-testable.

#![warn(missing_docs)]

mod arrivals;
mod bucket;
mod capture;
mod clock;
mod schedule;
pub mod units;

pub use arrivals::{constant_at, ArrivalClock, Arrivals};
pub use bucket::TokenBucket;
pub use capture::{CaptureClock, Speed};
pub use clock::{now_ns, Pacer, DEFAULT_SPIN_NS};
pub use schedule::{Rate, Schedule};
pub use units::{parse_duration, parse_size};

/// Rates given as `f64` (pps, Mbps, multipliers, arrivals/s) are turned into integers in units
/// of one millionth, so every product and quotient after that is exact integer arithmetic.
pub(crate) const MICRO: u128 = 1_000_000;

/// `x` in millionths, at least 1: a rate of zero, a negative rate or NaN would otherwise
/// divide by zero; the caller's config layer rejects those ([`Rate::check`]), so this clamp only
/// keeps the arithmetic total.
pub(crate) fn to_micro(x: f64) -> u128 {
    let v = (x * 1e6).round();
    if v.is_nan() || v < 1.0 {
        1
    } else if v >= 1e30 {
        // Far beyond any real rate; keeps the u128 products below from overflowing.
        1_000_000_000_000_000_000_000_000_000_000
    } else {
        v as u128
    }
}

/// Narrow an offset to u64, saturating: u64 ns is 584 years, so saturation means "never".
pub(crate) fn sat_u64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_micro_clamps_nonsense_to_one() {
        assert_eq!(to_micro(0.0), 1);
        assert_eq!(to_micro(-5.0), 1);
        assert_eq!(to_micro(f64::NAN), 1);
        assert_eq!(to_micro(2.5), 2_500_000);
        assert!(to_micro(f64::INFINITY) > 1_000_000_000_000);
    }
}
