//! Capture time played on the wall clock, for inputs that are replayed at their own pace
//! (copy's `--input` with `--speed` and `--max-idle`): each gap between two captured packets is
//! capped in capture time (an idle hour in the file need not be waited for), and the capped
//! capture time is divided by the speed. Integer nanoseconds from one start, like
//! [`crate::Schedule`], so the mapping never drifts and both directions are exact.

use crate::{sat_u64, to_micro, MICRO};

/// A speed-up factor (`--speed 2`: twice as fast), kept in millionths so capture time and
/// wall time convert with integer arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speed {
    micro: u128,
}

impl Speed {
    /// `speed` rounded to a millionth; zero, negative, NaN or infinite speeds are clamped (the
    /// config layer rejects them first).
    pub fn new(speed: f64) -> Speed {
        Speed {
            micro: to_micro(speed),
        }
    }

    /// The wall time that `capture_ns` of capture time takes at this speed (rounded down,
    /// saturating).
    pub fn wall(self, capture_ns: u64) -> u64 {
        sat_u64(u128::from(capture_ns) * MICRO / self.micro)
    }

    /// The capture time that passes in `wall_ns` at this speed (rounded down, saturating).
    pub fn capture(self, wall_ns: u64) -> u64 {
        sat_u64(u128::from(wall_ns) * self.micro / MICRO)
    }
}

/// When each packet of a capture played at its own pace is due, as a wall offset in ns from
/// the start: capture gaps capped at `max_gap_ns`, then scaled by the [`Speed`]. Timestamps that
/// go backwards count as a gap of 0. Pure arithmetic, no clock reads.
#[derive(Clone, Copy, Debug)]
pub struct CaptureClock {
    speed: Speed,
    max_gap_ns: u64,
    /// Capture time played so far (capped gaps summed), ns.
    played: u128,
    /// The latest timestamp taken in this pass over the file.
    last_ts: Option<u64>,
}

impl CaptureClock {
    /// A clock at offset 0; `max_gap_ns` None: gaps are not capped.
    pub fn new(speed: Speed, max_gap_ns: Option<u64>) -> CaptureClock {
        CaptureClock {
            speed,
            max_gap_ns: max_gap_ns.unwrap_or(u64::MAX),
            played: 0,
            last_ts: None,
        }
    }

    /// The speed it plays at.
    pub fn speed(&self) -> Speed {
        self.speed
    }

    /// The capped capture gap before a packet stamped `ts_ns`.
    fn gap(&self, ts_ns: u64) -> u64 {
        self.last_ts
            .map_or(0, |l| ts_ns.saturating_sub(l))
            .min(self.max_gap_ns)
    }

    /// Wall offset at which a packet stamped `ts_ns` is due if it is the next one taken.
    pub fn due(&self, ts_ns: u64) -> u64 {
        self.wall(self.played + u128::from(self.gap(ts_ns)))
    }

    /// Takes the packet stamped `ts_ns`: the clock moves to it. Returns its due offset.
    pub fn take(&mut self, ts_ns: u64) -> u64 {
        self.played += u128::from(self.gap(ts_ns));
        self.last_ts = Some(self.last_ts.map_or(ts_ns, |l| l.max(ts_ns)));
        self.wall(self.played)
    }

    /// Wall offset of the last packet taken (0 before any).
    pub fn offset(&self) -> u64 {
        self.wall(self.played)
    }

    /// The capture timestamp the clock shows `wall_ns` after the start: the last packet's
    /// timestamp plus the capture time that passed since it was due (None before any packet
    /// of this pass), so timers in capture time run on while the input waits.
    pub fn capture_now(&self, wall_ns: u64) -> Option<u64> {
        let since = wall_ns.saturating_sub(self.offset());
        self.last_ts
            .map(|l| l.saturating_add(self.speed.capture(since)))
    }

    /// The file starts again (`--loop`): its first packet follows the last one with no gap,
    /// whatever its timestamp.
    pub fn restart(&mut self) {
        self.last_ts = None;
    }

    fn wall(&self, played: u128) -> u64 {
        sat_u64(played * MICRO / self.speed.micro)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const BASE: u64 = 1_700_000_000 * 1_000_000_000;

    fn dues(c: &mut CaptureClock, ts: &[u64]) -> Vec<u64> {
        ts.iter().map(|&t| c.take(BASE + t)).collect()
    }

    #[test]
    fn speed_multipliers_scale_gaps_exactly() {
        let ts = [0, 10 * MS, 15 * MS, 1000 * MS];
        let mut one = CaptureClock::new(Speed::new(1.0), None);
        assert_eq!(dues(&mut one, &ts), ts);
        let mut four = CaptureClock::new(Speed::new(4.0), None);
        assert_eq!(dues(&mut four, &ts), [0, 2_500_000, 3_750_000, 250 * MS]);
        let mut half = CaptureClock::new(Speed::new(0.5), None);
        assert_eq!(dues(&mut half, &ts), [0, 20 * MS, 30 * MS, 2000 * MS]);
        // A third: 10⁶ gaps of 1 ns land where one gap of 999 999 ns does, no rounding summed.
        let mut third = CaptureClock::new(Speed::new(1.0 / 3.0), None);
        let mut last = 0;
        for i in 0..1_000_000 {
            last = third.take(i);
        }
        assert_eq!(last, (999_999u128 * 1_000_000 / 333_333) as u64);
        assert_eq!(Speed::new(4.0).wall(10), 2);
        assert_eq!(Speed::new(4.0).capture(10), 40);
    }

    #[test]
    fn due_looks_ahead_without_moving() {
        let mut c = CaptureClock::new(Speed::new(2.0), None);
        c.take(BASE);
        assert_eq!(c.due(BASE + 10 * MS), 5 * MS);
        assert_eq!(c.due(BASE + 10 * MS), 5 * MS);
        assert_eq!(c.offset(), 0);
        assert_eq!(c.take(BASE + 10 * MS), 5 * MS);
        assert_eq!(c.offset(), 5 * MS);
    }

    #[test]
    fn idle_gaps_are_capped_in_capture_time_before_the_speed() {
        // --max-idle 100ms --speed 2: an hour's gap costs 50 ms of wall time.
        let mut c = CaptureClock::new(Speed::new(2.0), Some(100 * MS));
        let got = dues(&mut c, &[0, 10 * MS, 3_600_000 * MS, 3_600_010 * MS]);
        assert_eq!(got, [0, 5 * MS, 55 * MS, 60 * MS]);
    }

    #[test]
    fn backwards_timestamps_and_loops_add_no_gap() {
        let mut c = CaptureClock::new(Speed::new(1.0), None);
        assert_eq!(
            dues(&mut c, &[100 * MS, 110 * MS, 50 * MS, 120 * MS]),
            [0, 10 * MS, 10 * MS, 20 * MS]
        );
        // A second pass starts where the first ended.
        c.restart();
        assert_eq!(c.take(BASE), 20 * MS);
        assert_eq!(c.take(BASE + MS), 21 * MS);
    }

    #[test]
    fn capture_now_runs_on_between_packets() {
        let mut c = CaptureClock::new(Speed::new(4.0), None);
        assert_eq!(c.capture_now(5 * MS), None);
        c.take(BASE);
        c.take(BASE + 40 * MS); // due at 10 ms
        assert_eq!(c.capture_now(10 * MS), Some(BASE + 40 * MS));
        assert_eq!(c.capture_now(12 * MS), Some(BASE + 48 * MS));
        // Before its due time (a late caller): no time runs backwards.
        assert_eq!(c.capture_now(3 * MS), Some(BASE + 40 * MS));
    }

    #[test]
    fn extremes_saturate_instead_of_overflowing() {
        let mut c = CaptureClock::new(Speed::new(1e-6), None);
        c.take(0);
        assert_eq!(c.take(u64::MAX), u64::MAX);
        assert_eq!(c.take(u64::MAX), u64::MAX);
        let fast = Speed::new(1e6);
        assert_eq!(fast.capture(u64::MAX), u64::MAX);
        assert_eq!(fast.wall(u64::MAX), u64::MAX / 1_000_000);
        // Nonsense speeds are clamped, never a division by zero.
        assert_eq!(Speed::new(0.0), Speed::new(-3.0));
        assert_eq!(Speed::new(f64::NAN).wall(1), 1_000_000);
        let mut nan = CaptureClock::new(Speed::new(f64::NAN), Some(1));
        nan.take(0);
        assert_eq!(nan.take(u64::MAX), 1_000_000);
        let mut far = CaptureClock::new(Speed::new(1.0), None);
        let _ = far.capture_now(u64::MAX);
        far.take(u64::MAX);
        assert_eq!(far.capture_now(u64::MAX), Some(u64::MAX));
    }
}
