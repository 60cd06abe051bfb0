//! The agent's clock against the barrier's: NTP's four timestamps per round trip (`t1` the
//! agent sends, `t2` the barrier receives, `t3` it answers, `t4` the agent receives), several
//! samples, the one with the smallest round trip kept (the least queueing, so the tightest
//! bound: the true offset lies within half its round trip of the estimate, whatever the
//! asymmetry). Never taken from chrony: two hosts that both think they are synchronised can
//! still differ by milliseconds, and the report says what was measured.

/// Samples taken before saying ready.
pub const SAMPLES: usize = 8;

/// The wall clock (CLOCK_REALTIME) in Unix ns: the clock the barrier and agents compare.
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One round trip's four timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Agent clock, sent.
    pub t1: u64,
    /// Barrier clock, received.
    pub t2: u64,
    /// Barrier clock, answered.
    pub t3: u64,
    /// Agent clock, answer received.
    pub t4: u64,
}

impl Sample {
    /// The agent's clock minus the barrier's: ((t1 - t2) + (t4 - t3)) / 2.
    pub fn offset_ns(&self) -> i64 {
        let d = (i128::from(self.t1) - i128::from(self.t2))
            + (i128::from(self.t4) - i128::from(self.t3));
        (d / 2).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    /// The time on the wire both ways: (t4 - t1) - (t3 - t2), never below 0.
    pub fn rtt_ns(&self) -> u64 {
        let r = (i128::from(self.t4) - i128::from(self.t1))
            - (i128::from(self.t3) - i128::from(self.t2));
        r.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// The offset and round trip of the sample with the smallest round trip.
pub fn best(samples: &[Sample]) -> Option<(i64, u64)> {
    samples
        .iter()
        .min_by_key(|s| s.rtt_ns())
        .map(|s| (s.offset_ns(), s.rtt_ns()))
}

/// A barrier instant on the agent's clock.
pub fn to_agent(barrier_ns: u64, offset_ns: i64) -> u64 {
    barrier_ns.saturating_add_signed(offset_ns)
}

/// The monotonic instant ([`tcpkit_pace::now_ns`]) of the wall instant `wall`: schedules run on
/// the monotonic clock, which no NTP step moves.
pub fn mono_of(wall: u64) -> u64 {
    let (w, m) = (wall_ns(), tcpkit_pace::now_ns());
    m.saturating_add_signed(wall.wrapping_sub(w) as i64)
}

/// Waits until the wall instant `wall` with tcpkit-pace's hybrid sleep then spin; returns how
/// late it woke, in ns.
pub fn wait_until_wall(wall: u64) -> u64 {
    tcpkit_pace::Pacer::default().wait_until(mono_of(wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_and_round_trip_of_a_symmetric_path() {
        // Agent 5 ms ahead; 100 µs each way; the barrier holds it 20 µs.
        let ahead = 5_000_000u64;
        let t1 = 1_000_000_000 + ahead;
        let t2 = 1_000_000_000 + 100_000;
        let t3 = t2 + 20_000;
        let t4 = t3 + 100_000 + ahead;
        let s = Sample { t1, t2, t3, t4 };
        assert_eq!(s.offset_ns(), 5_000_000);
        assert_eq!(s.rtt_ns(), 200_000);
        // Behind: negative.
        let s = Sample {
            t1: 1_000,
            t2: 10_001_100,
            t3: 10_001_100,
            t4: 1_200,
        };
        assert_eq!(s.offset_ns(), -10_000_000);
        assert_eq!(s.rtt_ns(), 200);
    }

    #[test]
    fn an_asymmetric_path_errs_by_at_most_half_the_round_trip() {
        // 10 µs out, 290 µs back, true offset 0: the estimate is off by 140 µs < 300/2.
        let s = Sample {
            t1: 0,
            t2: 10_000,
            t3: 10_000,
            t4: 300_000,
        };
        assert_eq!(s.rtt_ns(), 300_000);
        assert_eq!(s.offset_ns(), 140_000);
        assert!(s.offset_ns().unsigned_abs() <= s.rtt_ns() / 2);
    }

    #[test]
    fn the_sample_with_the_smallest_round_trip_wins() {
        let queued = Sample {
            t1: 0,
            t2: 900_000,
            t3: 900_000,
            t4: 1_000_000,
        };
        let clean = Sample {
            t1: 2_000_000,
            t2: 2_050_000,
            t3: 2_050_000,
            t4: 2_100_000,
        };
        assert_eq!(best(&[queued, clean]), Some((0, 100_000)));
        assert_eq!(best(&[]), None);
        // Clocks far apart or samples out of order neither overflow nor go negative.
        let wild = Sample {
            t1: u64::MAX,
            t2: 0,
            t3: 0,
            t4: 0,
        };
        assert_eq!(wild.rtt_ns(), 0);
        assert!(wild.offset_ns() > 0);
    }

    #[test]
    fn instants_convert_between_clocks() {
        assert_eq!(to_agent(1_000, -300), 700);
        assert_eq!(to_agent(1_000, 300), 1_300);
        assert_eq!(to_agent(100, -300), 0);
        let w = wall_ns() + 20_000_000;
        let m = mono_of(w);
        let d = i128::from(m) - i128::from(tcpkit_pace::now_ns());
        assert!((19_000_000..=20_500_000).contains(&d), "{d}");
        let late = wait_until_wall(wall_ns() + 2_000_000);
        assert!(late < 5_000_000, "{late}");
    }
}
