//! Per-packet send offsets for `replay`, computed from one start in integer ns.

use crate::{sat_u64, to_micro, MICRO};

/// How fast to replay.
#[derive(Clone, Copy, Debug)]
pub enum Rate {
    /// Capture timing, gaps divided by `multiplier` (`-x`): 2.0 replays twice as fast.
    Capture {
        /// Speed-up factor: capture gaps are divided by it.
        multiplier: f64,
    },
    /// Packets per second (`--pps`), sent in groups of `burst` (`--pps-multi`; 1 = no groups).
    Pps {
        /// Packets per second.
        pps: f64,
        /// Packets sent together at each due time (1: one at a time).
        burst: u32,
    },
    /// Megabits per second of wire bytes (`--mbps`).
    Mbps(f64),
    /// As fast as the sink takes them (`--topspeed`).
    Topspeed,
}

impl Rate {
    /// Rejects rates that cannot be scheduled (zero, negative, NaN, infinite, burst 0), with the
    /// reason; for the config layer. [`Schedule::new`] clamps such values instead of failing.
    pub fn check(&self) -> Result<(), &'static str> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        match *self {
            Rate::Capture { multiplier } if !ok(multiplier) => {
                Err("the multiplier must be a positive number")
            }
            Rate::Pps { pps, .. } if !ok(pps) => Err("the packet rate must be a positive number"),
            Rate::Pps { burst: 0, .. } => Err("the burst must be at least 1"),
            Rate::Mbps(m) if !ok(m) => Err("the bit rate must be a positive number"),
            _ => Ok(()),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `acc` is virtual time in units of ns × 10⁻⁶ × multiplier_micro, so that
    /// `offset = acc / multiplier_micro` is exact whatever the multiplier.
    Capture {
        multiplier_micro: u128,
        acc: u128,
        prev_ts: Option<u64>,
        /// Set by `restart_timeline`: the next gap, in real ns.
        forced_gap: Option<u64>,
        /// `max_sleep` in accumulator units.
        cap: Option<u128>,
    },
    Pps {
        pps_micro: u128,
        burst: u64,
        n: u64,
    },
    Mbps {
        mbps_micro: u128,
        bytes_before: u128,
    },
    Topspeed,
}

/// When each packet of a replay is due, as an offset in ns from the run's start.
///
/// Pure arithmetic, no clock reads. Offsets are computed from counters kept since the start
/// (packet count, byte count, virtual capture time), never as `previous + gap`, so rounding never
/// accumulates and a run of days or terabytes neither drifts nor overflows (u128 products).
#[derive(Clone, Debug)]
pub struct Schedule {
    mode: Mode,
    /// Sum of loop delays inserted so far (rate modes), in ns.
    pauses: u128,
    /// Whether any packet was scheduled: a restart before the first packet adds no delay.
    started: bool,
}

impl Schedule {
    /// A schedule for `rate`. `max_sleep_ns` (`--maxsleep`) caps each gap of capture timing, as
    /// tcpreplay does: the cap applies to the real wait, i.e. after dividing by the multiplier.
    /// Rates that [`Rate::check`] rejects are clamped to the smallest representable positive
    /// value (one millionth), a burst of 0 to 1.
    pub fn new(rate: Rate, max_sleep_ns: Option<u64>) -> Schedule {
        let mode = match rate {
            Rate::Capture { multiplier } => {
                let multiplier_micro = to_micro(multiplier);
                Mode::Capture {
                    multiplier_micro,
                    acc: 0,
                    prev_ts: None,
                    forced_gap: None,
                    cap: max_sleep_ns.map(|m| u128::from(m) * multiplier_micro),
                }
            }
            Rate::Pps { pps, burst } => Mode::Pps {
                pps_micro: to_micro(pps),
                burst: u64::from(burst.max(1)),
                n: 0,
            },
            Rate::Mbps(m) => Mode::Mbps {
                mbps_micro: to_micro(m),
                bytes_before: 0,
            },
            Rate::Topspeed => Mode::Topspeed,
        };
        Schedule {
            mode,
            pauses: 0,
            started: false,
        }
    }

    /// Offset in ns from the run's start at which the next packet is due; `None` for topspeed.
    ///
    /// `ts_ns` is the packet's capture timestamp (used by capture timing only), `wire_len` the
    /// bytes that go on the wire (used by `--mbps` only).
    /// - Capture: virtual capture time since the first packet, divided by the multiplier. Virtual
    ///   time adds each packet's gap to the previous packet: a negative gap counts as 0, each
    ///   gap is capped at `max_sleep`, and after [`Schedule::restart_timeline`] the gap is the
    ///   given one, so timestamps that jump backwards or across files and loops are harmless.
    /// - Pps with burst K: packets go in groups of K; group g is due at g·K/pps s.
    /// - Mbps: a packet is due when the bits of all packets before it have had their time,
    ///   `bits_before · 1000 / mbps` ns.
    ///
    /// In the rate modes, loop delays are pauses added to the schedule.
    pub fn next(&mut self, ts_ns: u64, wire_len: u32) -> Option<u64> {
        self.started = true;
        let pauses = self.pauses;
        match &mut self.mode {
            Mode::Capture {
                multiplier_micro,
                acc,
                prev_ts,
                forced_gap,
                cap,
            } => {
                let step = match (forced_gap.take(), *prev_ts) {
                    (Some(gap), _) => u128::from(gap) * *multiplier_micro,
                    (None, Some(prev)) => {
                        let gap = u128::from(ts_ns.saturating_sub(prev)) * MICRO;
                        cap.map_or(gap, |c| gap.min(c))
                    }
                    (None, None) => 0,
                };
                *acc += step;
                *prev_ts = Some(ts_ns);
                Some(sat_u64(*acc / *multiplier_micro))
            }
            Mode::Pps {
                pps_micro,
                burst,
                n,
            } => {
                let first_of_group = u128::from(*n / *burst * *burst);
                *n += 1;
                Some(sat_u64(
                    pauses + first_of_group * MICRO * 1_000_000_000 / *pps_micro,
                ))
            }
            Mode::Mbps {
                mbps_micro,
                bytes_before,
            } => {
                // bits · 1000 / mbps ns = bytes · 8 · 1000 · 10⁶ / mbps_micro ns.
                let offset = pauses + *bytes_before * 8_000_000_000 / *mbps_micro;
                *bytes_before += u128::from(wire_len);
                Some(sat_u64(offset))
            }
            Mode::Topspeed => None,
        }
    }

    /// A new file or loop begins: the next packet's gap from the previous one is `gap_ns` (the
    /// loop delay, real time, not scaled by the multiplier) instead of being derived from
    /// timestamps. In the rate modes `gap_ns` is a pause added to the schedule (so the rate is
    /// kept on either side of it). Before the first packet, and for topspeed (nothing is
    /// scheduled: the caller sleeps the loop delay itself), this does nothing.
    pub fn restart_timeline(&mut self, gap_ns: u64) {
        if !self.started {
            return;
        }
        match &mut self.mode {
            Mode::Capture { forced_gap, .. } => *forced_gap = Some(gap_ns),
            Mode::Pps { .. } | Mode::Mbps { .. } => self.pauses += u128::from(gap_ns),
            Mode::Topspeed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn capture(mult: f64, max_sleep: Option<u64>) -> Schedule {
        Schedule::new(Rate::Capture { multiplier: mult }, max_sleep)
    }

    fn offsets(s: &mut Schedule, ts: &[u64]) -> Vec<u64> {
        ts.iter()
            .map(|&t| s.next(t, 60).unwrap_or(u64::MAX))
            .collect()
    }

    #[test]
    fn capture_timing_follows_timestamps() {
        let base = 1_700_000_000 * 1_000_000_000;
        let mut s = capture(1.0, None);
        let got = offsets(
            &mut s,
            &[base, base + 10 * MS, base + 15 * MS, base + 1000 * MS],
        );
        assert_eq!(got, vec![0, 10 * MS, 15 * MS, 1000 * MS]);
    }

    #[test]
    fn multiplier_two_halves_gaps() {
        let mut s = capture(2.0, None);
        let got = offsets(&mut s, &[0, 10 * MS, 15 * MS, 16 * MS + 1]);
        assert_eq!(got, vec![0, 5 * MS, 7_500_000, 8_000_000]);
    }

    #[test]
    fn fractional_multiplier_is_exact_not_accumulated() {
        // 1/3 speed: each 1 ns gap becomes 3 ns; 10⁶ gaps of 1 ns must land exactly at 3·10⁶.
        let mut s = capture(1.0 / 3.0, None);
        let mut last = 0;
        for i in 0..1_000_000u64 {
            last = s.next(i, 60).unwrap_or(0);
        }
        // multiplier 0.333333 (micro-units): 999_999 ns of capture time / 0.333333.
        assert_eq!(last, (999_999u128 * 1_000_000 / 333_333) as u64);
    }

    #[test]
    fn maxsleep_caps_each_gap() {
        let mut s = capture(1.0, Some(100 * MS));
        let got = offsets(&mut s, &[0, 10 * MS, 5000 * MS, 5001 * MS]);
        assert_eq!(got, vec![0, 10 * MS, 110 * MS, 111 * MS]);
    }

    #[test]
    fn maxsleep_caps_the_real_wait_after_the_multiplier() {
        // Gap 300 ms at 2x is a 150 ms wait, capped at 100 ms; a 100 ms gap is 50 ms.
        let mut s = capture(2.0, Some(100 * MS));
        let got = offsets(&mut s, &[0, 300 * MS, 400 * MS]);
        assert_eq!(got, vec![0, 100 * MS, 150 * MS]);
    }

    #[test]
    fn negative_gaps_count_as_zero() {
        let mut s = capture(1.0, None);
        let got = offsets(&mut s, &[100 * MS, 110 * MS, 50 * MS, 60 * MS]);
        assert_eq!(got, vec![0, 10 * MS, 10 * MS, 20 * MS]);
    }

    #[test]
    fn restart_timeline_uses_loop_delay_not_timestamps() {
        let mut s = capture(2.0, None);
        let mut got = offsets(&mut s, &[1000 * MS, 1010 * MS]);
        // Second loop: timestamps start over at 1000 ms; loop delay 7 ms of real time.
        s.restart_timeline(7 * MS);
        got.extend(offsets(&mut s, &[1000 * MS, 1010 * MS]));
        assert_eq!(got, vec![0, 5 * MS, 12 * MS, 17 * MS]);
    }

    #[test]
    fn restart_before_first_packet_adds_nothing() {
        let mut s = capture(1.0, None);
        s.restart_timeline(50 * MS);
        assert_eq!(offsets(&mut s, &[7, 8]), vec![0, 1]);
        let mut p = Schedule::new(Rate::Pps { pps: 1.0, burst: 1 }, None);
        p.restart_timeline(50 * MS);
        assert_eq!(p.next(0, 60), Some(0));
    }

    #[test]
    fn pps_three_is_from_n_not_accumulated() {
        let mut s = Schedule::new(Rate::Pps { pps: 3.0, burst: 1 }, None);
        let got = offsets(&mut s, &[0, 0, 0, 0]);
        assert_eq!(got, vec![0, 333_333_333, 666_666_666, 1_000_000_000]);
    }

    #[test]
    fn pps_ignores_timestamps() {
        let mut s = Schedule::new(
            Rate::Pps {
                pps: 1000.0,
                burst: 1,
            },
            None,
        );
        let got = offsets(&mut s, &[5, 1, 999_999_999, 0]);
        assert_eq!(got, vec![0, MS, 2 * MS, 3 * MS]);
    }

    #[test]
    fn pps_multi_sends_groups() {
        let mut s = Schedule::new(
            Rate::Pps {
                pps: 10.0,
                burst: 3,
            },
            None,
        );
        let got = offsets(&mut s, &[0; 7]);
        // Groups of 3 at g·3/10 s.
        assert_eq!(got, vec![0, 0, 0, 300 * MS, 300 * MS, 300 * MS, 600 * MS]);
    }

    #[test]
    fn pps_loop_delay_is_a_pause() {
        let mut s = Schedule::new(
            Rate::Pps {
                pps: 100.0,
                burst: 1,
            },
            None,
        );
        let mut got = offsets(&mut s, &[0, 0]);
        s.restart_timeline(3 * MS);
        got.extend(offsets(&mut s, &[0, 0]));
        assert_eq!(got, vec![0, 10 * MS, 23 * MS, 33 * MS]);
    }

    #[test]
    fn mbps_waits_for_bits_before() {
        // 8 Mbps = 1 byte per µs.
        let mut s = Schedule::new(Rate::Mbps(8.0), None);
        let got: Vec<_> = [100u32, 1500, 64, 64]
            .iter()
            .map(|&l| s.next(0, l))
            .collect();
        assert_eq!(
            got,
            vec![Some(0), Some(100_000), Some(1_600_000), Some(1_664_000)]
        );
    }

    #[test]
    fn mbps_fractional_rate() {
        // 1000 bytes at 3 Mbps = 8000 bits / 3 Mbps = 2666.666 µs.
        let mut s = Schedule::new(Rate::Mbps(3.0), None);
        s.next(0, 1000);
        assert_eq!(s.next(0, 1000), Some(2_666_666));
        assert_eq!(s.next(0, 1000), Some(5_333_333));
    }

    #[test]
    fn topspeed_is_unscheduled() {
        let mut s = Schedule::new(Rate::Topspeed, None);
        assert_eq!(s.next(0, 60), None);
        s.restart_timeline(MS);
        assert_eq!(s.next(0, 60), None);
    }

    #[test]
    fn no_overflow_at_a_trillion_packets() {
        let mut s = Schedule::new(Rate::Pps { pps: 1e6, burst: 1 }, None);
        if let Mode::Pps { n, .. } = &mut s.mode {
            *n = 1_000_000_000_000;
        }
        // 10¹² packets at 10⁶ pps = 10⁶ s.
        assert_eq!(s.next(0, 60), Some(1_000_000 * 1_000_000_000));

        // Slow rate and huge n: far past u64 ns, saturates instead of wrapping.
        let mut slow = Schedule::new(
            Rate::Pps {
                pps: 0.001,
                burst: 1,
            },
            None,
        );
        if let Mode::Pps { n, .. } = &mut slow.mode {
            *n = 1_000_000_000_000;
        }
        assert_eq!(slow.next(0, 60), Some(u64::MAX));
    }

    #[test]
    fn no_overflow_at_a_petabyte() {
        let mut s = Schedule::new(Rate::Mbps(10_000.0), None);
        if let Mode::Mbps { bytes_before, .. } = &mut s.mode {
            *bytes_before = 1_000_000_000_000_000;
        }
        // 8·10¹⁵ bits at 10¹⁰ b/s = 8·10⁵ s.
        assert_eq!(s.next(0, 1500), Some(800_000 * 1_000_000_000));
    }

    #[test]
    fn capture_timing_over_days_does_not_overflow() {
        // 30 days of capture at 0.5x: 60 days of replay, exact.
        let day = 86_400 * 1_000_000_000u64;
        let mut s = capture(0.5, None);
        s.next(0, 60);
        assert_eq!(s.next(30 * day, 60), Some(60 * day));
    }

    #[test]
    fn check_rejects_unschedulable_rates() {
        assert!(Rate::Pps { pps: 0.0, burst: 1 }.check().is_err());
        assert!(Rate::Pps { pps: 5.0, burst: 0 }.check().is_err());
        assert!(Rate::Mbps(f64::NAN).check().is_err());
        assert!(Rate::Capture { multiplier: -1.0 }.check().is_err());
        assert!(Rate::Capture { multiplier: 0.5 }.check().is_ok());
        assert!(Rate::Topspeed.check().is_ok());
    }
}
