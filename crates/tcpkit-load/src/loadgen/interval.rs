//! One event-loop thread's seconds: the queries asked, sent, answered, the errors and
//! timeouts of each second of the query phase, and the latencies of its answers (from the
//! intended send time; with `--hdr-log` also from the actual one), closed when the second is
//! over and kept as the report's `intervals` (bounded: [`crate::series::coarsen`]) and, with
//! `--hdr-log`, written to the process's interval log. The run's own histograms are kept
//! apart by the engine; these only ever hold one second. The seconds kept are bounded in
//! count and in bytes ([`crate::series::INTERVAL_BYTES`]): past either, the oldest merge,
//! so a run of days holds no more than one of minutes.
//!
//! Counts are running totals sampled when a second closes, so the seconds of a thread add up
//! to its totals exactly: what happened before the first second (failed connects) is in the
//! first, the wait for the last answers after the phase is in the seconds it took.

use std::sync::Mutex;
use std::time::Duration;

use tcpkit_stats::{HdrLog, Histogram};

use super::profile::ArrivalTimes;
use crate::series::{coarsen_within, held_bytes, IntervalRec, Tally, SECOND_NS};

/// The asked schedule replayed beside the one queries are sent on: it counts the intended
/// send times each second held, whether or not the client kept up.
#[derive(Debug)]
pub(crate) struct Asked {
    pub times: ArrivalTimes,
    /// Monotonic ns of the query phase's end: later intended times are not asked.
    pub end: u64,
    /// The thread's share of `-n`, if given.
    pub cap: Option<u64>,
    next: u64,
    count: u64,
}

impl Asked {
    pub(crate) fn new(mut times: ArrivalTimes, start: u64, end: u64, cap: Option<u64>) -> Asked {
        let next = start.saturating_add(times.next_ns());
        Asked {
            times,
            end,
            cap,
            next,
            count: 0,
        }
    }

    /// Intended send times before `until` (and before the end), in all.
    fn upto(&mut self, until: u64, start: u64) -> u64 {
        let until = until.min(self.end);
        while self.next < until && self.cap.is_none_or(|c| self.count < c) {
            self.count += 1;
            self.next = start.saturating_add(self.times.next_ns());
        }
        self.count
    }
}

/// One thread's seconds.
#[derive(Debug)]
pub(crate) struct Interval<'l> {
    log: Option<&'l Mutex<HdrLog>>,
    intended: Histogram,
    /// Only with a log (the report's intervals carry the intended latencies).
    sent: Histogram,
    /// CLOCK_MONOTONIC ns of the query phase's start and of the current second's end; 0
    /// before the phase.
    start: u64,
    next: u64,
    /// The running totals when the current second began.
    base: Tally,
    asked: Option<Asked>,
    /// The seconds closed, `start_unix_ns` counted from the phase's start (the wall-clock
    /// start is added when the threads' seconds are put together).
    recs: Vec<IntervalRec>,
    cap: usize,
    /// The most [`held_bytes`] `recs` may hold, and what they hold.
    budget: usize,
    held: usize,
}

impl<'l> Interval<'l> {
    /// `cap` and `budget`: the intervals and bytes this thread keeps at most (its share of
    /// the process's).
    pub(crate) fn new(log: Option<&'l Mutex<HdrLog>>, cap: usize, budget: usize) -> Self {
        Interval {
            log,
            intended: Histogram::new(),
            sent: Histogram::new(),
            start: 0,
            next: 0,
            base: Tally::default(),
            asked: None,
            recs: Vec::new(),
            cap,
            budget,
            held: 0,
        }
    }

    /// The query phase starts at `start` (monotonic ns): the first second ends a second later.
    pub(crate) fn begin(&mut self, start: u64, asked: Option<Asked>) {
        self.start = start;
        self.next = start + SECOND_NS;
        self.asked = asked;
    }

    /// One answer's latencies (ns).
    #[inline]
    pub(crate) fn record(&mut self, intended: u64, sent: u64) {
        self.intended.record(intended);
        if self.log.is_some() {
            self.sent.record(sent);
        }
    }

    /// At `now`, once the current second is over: closes it with the running totals `now_t`
    /// gives (asked is counted here), and moves on to the second that holds `now` (seconds
    /// with no tick in them are skipped, their counts in the one that closes next).
    #[inline]
    pub(crate) fn tick(&mut self, now: u64, now_t: impl FnOnce() -> Tally) {
        if self.start == 0 || now < self.next {
            return;
        }
        let mut t = now_t();
        t.asked = match &mut self.asked {
            Some(a) => a.upto(self.next, self.start),
            None => 0,
        };
        self.close(t);
        while self.next <= now {
            self.next += SECOND_NS;
        }
    }

    /// The end of the run: the second in progress closed with the final totals (`asked`: the
    /// queries scheduled), and the seconds.
    pub(crate) fn finish(mut self, now: u64, last: Tally) -> Vec<IntervalRec> {
        if self.start == 0 {
            return Vec::new();
        }
        let t = last;
        self.tick(now, || Tally { asked: 0, ..t });
        self.close(last);
        self.recs
    }

    fn close(&mut self, t: Tally) {
        let d = t.since(&self.base);
        self.base = t;
        let from = self.next.saturating_sub(SECOND_NS + self.start);
        if let Some(log) = self.log {
            if self.intended.count() > 0 || self.sent.count() > 0 {
                // A log that cannot be written loses its lines, not the run: the report
                // holds the whole run's histograms.
                if let Ok(mut log) = log.lock() {
                    let from = Duration::from_nanos(from);
                    let second = Duration::from_secs(1);
                    let _ = log.write(&self.intended, from, second, "intended");
                    let _ = log.write(&self.sent, from, second, "sent");
                }
            }
        }
        let kept = !d.is_zero() || self.intended.count() > 0;
        if kept {
            let rec = d.rec(from, 1, self.intended.to_base64());
            self.held += held_bytes(&rec);
            self.recs.push(rec);
        }
        self.intended.clear();
        self.sent.clear();
        if kept && (self.recs.len() > self.cap || self.held > self.budget) {
            // The second's histogram, just cleared, merges the old ones: no histogram is
            // made per second. Histograms this thread encoded itself always decode; if one
            // ever did not, the list would stay a little longer rather than lose a second.
            self.held = coarsen_within(&mut self.recs, self.cap, self.budget, &mut self.intended)
                .unwrap_or_else(|_| self.recs.iter().map(held_bytes).sum());
        }
    }

    /// The heap the kept seconds hold ([`held_bytes`]).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(sent: u64, answered: u64) -> Tally {
        Tally {
            sent,
            answered,
            ..Tally::default()
        }
    }

    #[test]
    fn writes_each_second_that_ended_and_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.hlog");
        let log = Mutex::new(HdrLog::create(&path, std::time::SystemTime::now()).unwrap());
        let start = 5 * SECOND_NS;
        let mut iv = Interval::new(Some(&log), 64, usize::MAX);
        iv.begin(start, None);
        iv.record(1_000_000, 900_000);
        iv.record(2_000_000, 1_900_000);
        // Not a second yet: nothing written, nothing cleared.
        iv.tick(start + SECOND_NS - 1, || tally(2, 2));
        iv.record(3_000_000, 2_900_000);
        iv.tick(start + SECOND_NS, || tally(3, 3));
        // Two seconds with no tick: skipped, the next one is the fourth.
        iv.record(4_000_000, 3_900_000);
        iv.tick(start + 3 * SECOND_NS + 10, || tally(4, 4));
        iv.record(7_000_000, 6_900_000);
        let recs = iv.finish(start + 3 * SECOND_NS + 20, tally(6, 5));
        log.lock().unwrap().flush().unwrap();

        let got =
            tcpkit_stats::plot::timeline_from_hdr_logs(std::slice::from_ref(&path), "intended")
                .unwrap();
        let seconds: Vec<(f64, u64)> = got.iter().map(|s| (s.t_s, s.count)).collect();
        assert_eq!(seconds, [(0.0, 3), (1.0, 1), (3.0, 1)]);
        assert_eq!(got[2].max_ns / 1_000_000, 7, "{got:?}");
        let sent = tcpkit_stats::plot::timeline_from_hdr_logs(&[path], "sent").unwrap();
        assert_eq!(sent.len(), 3);
        // The same seconds in the report's intervals, their counts adding up to the totals.
        let rows: Vec<(u64, u64, u64)> = recs
            .iter()
            .map(|r| (r.start_unix_ns / SECOND_NS, r.sent, r.answered))
            .collect();
        assert_eq!(rows, [(0, 3, 3), (1, 1, 1), (3, 2, 1)]);
        let (t, h) = crate::series::total(&recs).unwrap();
        assert_eq!((t.sent, t.answered, h.count()), (6, 5, 5));
    }

    #[test]
    fn an_empty_last_second_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.hlog");
        let log = Mutex::new(HdrLog::create(&path, std::time::SystemTime::now()).unwrap());
        let mut iv = Interval::new(Some(&log), 64, usize::MAX);
        iv.begin(SECOND_NS, None);
        iv.record(1_000, 1_000);
        iv.tick(2 * SECOND_NS, || tally(1, 1));
        let recs = iv.finish(2 * SECOND_NS + 5, tally(1, 1));
        log.lock().unwrap().flush().unwrap();
        let got = tcpkit_stats::plot::timeline_from_hdr_logs(&[path], "intended").unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(recs.len(), 1, "{recs:?}");
    }

    /// Asked counts the intended send times each second held, from the schedule replayed:
    /// 100 q/s constant is 100 a second whatever was sent, and the last second gets what
    /// the run scheduled in all.
    #[test]
    fn asked_follows_the_schedule() {
        use super::super::config::{ArrivalKind, RateProfile};
        let start = 10 * SECOND_NS;
        // One thread holding the host's one connection: the whole schedule.
        let whole = super::super::profile::Lanes::of(1, 0, 1, 1, 0, tcpkit_workers::Shard::WHOLE);
        let times = ArrivalTimes::new(&RateProfile::Constant(100.0), ArrivalKind::Constant, whole);
        let end = start + 3 * SECOND_NS;
        let mut iv = Interval::new(None, 64, usize::MAX);
        iv.begin(start, Some(Asked::new(times, start, end, None)));
        iv.tick(start + SECOND_NS, || tally(0, 0));
        iv.tick(start + 2 * SECOND_NS + 1, || tally(0, 0));
        let recs = iv.finish(
            end,
            Tally {
                asked: 300,
                ..Tally::default()
            },
        );
        let asked: Vec<u64> = recs.iter().map(|r| r.asked).collect();
        assert_eq!(asked, [100, 100, 100]);
    }

    /// A run longer than the cap keeps a bounded list that still adds up.
    #[test]
    fn a_long_run_is_bounded() {
        let mut iv = Interval::new(None, 16, usize::MAX);
        let start = SECOND_NS;
        iv.begin(start, None);
        for s in 1..=100u64 {
            iv.record(1_000, 1_000);
            iv.tick(start + s * SECOND_NS, || tally(s, s));
        }
        let recs = iv.finish(start + 100 * SECOND_NS + 1, tally(100, 100));
        assert!(recs.len() <= 16, "{}", recs.len());
        let (t, h) = crate::series::total(&recs).unwrap();
        assert_eq!((t.answered, h.count()), (100, 100));
        assert_eq!(
            recs.last().unwrap().seconds,
            1,
            "the recent seconds stay whole"
        );
    }

    /// Issue 29 (load's workers grew 36-46 KiB a minute in the 30-minute soak): a day of
    /// answers (most within 50-150 us, a tenth spread to 5 ms, as a loaded server's are)
    /// keeps the thread's kept seconds within its byte budget all day, the intervals about
    /// equally long (the report lays them out at the longest) and a few minutes each; what is
    /// kept still adds up to every answer. A second is closed every 32 s (the seconds between hold nothing), so the
    /// test takes about a second.
    #[test]
    fn a_day_of_seconds_stays_within_the_byte_budget() {
        const DAY: u64 = 86_400;
        const STEP: u64 = 32;
        const PER_TICK: u64 = 1_600;
        let budget = crate::series::thread_budget(2);
        let mut iv = Interval::new(None, crate::series::MAX_INTERVALS / 2, budget);
        let start = SECOND_NS;
        iv.begin(start, None);
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let (mut peak, mut full_at, mut n) = (0, None, 0);
        for s in (STEP..=DAY).step_by(STEP as usize) {
            for _ in 0..PER_TICK {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let lat = if x.is_multiple_of(10) {
                    150_000 + x % 4_850_000
                } else {
                    50_000 + x % 100_000
                };
                iv.record(lat, 0);
            }
            n += PER_TICK;
            iv.tick(start + s * SECOND_NS, || tally(n, n));
            peak = peak.max(iv.held());
            if full_at.is_none() && iv.held() + 2048 > budget {
                full_at = Some(s);
            }
        }
        assert_eq!(
            iv.held(),
            iv.recs.iter().map(held_bytes).sum::<usize>(),
            "the running count is the heap held"
        );
        assert!(peak <= budget, "held {peak} bytes, budget {budget}");
        assert!(full_at.is_some(), "the budget fills");
        let widths: Vec<u64> = iv.recs.iter().map(|r| r.seconds).collect();
        let longest = widths.iter().copied().max().unwrap_or(0);
        // About 250 intervals of 4-8 minutes (the merged ones kept to 8 bits; at full
        // precision the same bytes held about 60 of 15-35 minutes).
        assert!(longest <= DAY / 128 && widths.len() >= 128, "{widths:?}");
        let recs = iv.finish(start + DAY * SECOND_NS + 1, tally(n, n));
        let (t, h) = crate::series::total(&recs).unwrap();
        assert_eq!((t.answered, h.count()), (n, n));
    }
}
