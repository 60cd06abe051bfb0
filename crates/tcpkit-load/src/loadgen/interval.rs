//! `--hdr-log`'s per-second histograms of one event-loop thread: the latencies of the answers of
//! the current second (from the intended and from the actual send time), written to the
//! process's interval log when the second is over and at the end of the run, then cleared.
//! The run's own histograms are kept apart by the engine; these only ever hold one second.

use std::sync::Mutex;
use std::time::Duration;

use tcpkit_stats::{HdrLog, Histogram};

const SECOND_NS: u64 = 1_000_000_000;

/// One thread's histograms of the current second, and the log they go to (shared by the
/// process's threads).
#[derive(Debug)]
pub(crate) struct Interval<'l> {
    log: &'l Mutex<HdrLog>,
    intended: Histogram,
    sent: Histogram,
    /// CLOCK_MONOTONIC ns when the current second ends; 0 before the query phase.
    next: u64,
}

impl<'l> Interval<'l> {
    pub(crate) fn new(log: &'l Mutex<HdrLog>) -> Self {
        Interval {
            log,
            intended: Histogram::new(),
            sent: Histogram::new(),
            next: 0,
        }
    }

    /// The query phase starts at `start` (monotonic ns): the first second ends a second later.
    pub(crate) fn begin(&mut self, start: u64) {
        self.next = start + SECOND_NS;
    }

    /// One answer's latencies (ns).
    #[inline]
    pub(crate) fn record(&mut self, intended: u64, sent: u64) {
        self.intended.record(intended);
        self.sent.record(sent);
    }

    /// At `now`, once the current second is over: writes it (as the second starting at
    /// `next - 1 s`, after the query phase's `start`), clears it, and moves on to the second
    /// that holds `now` (seconds with no sweep in them are skipped, not written empty).
    pub(crate) fn roll(&mut self, now: u64, start: u64) {
        if now < self.next {
            return;
        }
        self.write(start);
        self.intended.clear();
        self.sent.clear();
        while self.next <= now {
            self.next += SECOND_NS;
        }
    }

    /// The end of the run: the second in progress, if anything was recorded in it.
    pub(crate) fn finish(&self, start: u64) {
        if self.intended.count() > 0 || self.sent.count() > 0 {
            self.write(start);
        }
    }

    fn write(&self, start: u64) {
        // A log that cannot be written loses its lines, not the run: the report holds the
        // whole run's histograms.
        if let Ok(mut log) = self.log.lock() {
            let from = Duration::from_nanos(self.next.saturating_sub(SECOND_NS + start));
            let second = Duration::from_secs(1);
            let _ = log.write(&self.intended, from, second, "intended");
            let _ = log.write(&self.sent, from, second, "sent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_each_second_that_ended_and_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.hlog");
        let log = Mutex::new(HdrLog::create(&path, std::time::SystemTime::now()).unwrap());
        let start = 5 * SECOND_NS;
        let mut iv = Interval::new(&log);
        iv.begin(start);
        iv.record(1_000_000, 900_000);
        iv.record(2_000_000, 1_900_000);
        // Not a second yet: nothing written, nothing cleared.
        iv.roll(start + SECOND_NS - 1, start);
        iv.record(3_000_000, 2_900_000);
        iv.roll(start + SECOND_NS, start);
        // Two seconds with no sweep: skipped, the next one is the fourth.
        iv.record(4_000_000, 3_900_000);
        iv.roll(start + 3 * SECOND_NS + 10, start);
        iv.record(7_000_000, 6_900_000);
        iv.finish(start);
        log.lock().unwrap().flush().unwrap();

        let got =
            tcpkit_stats::plot::timeline_from_hdr_logs(std::slice::from_ref(&path), "intended")
                .unwrap();
        let seconds: Vec<(f64, u64)> = got.iter().map(|s| (s.t_s, s.count)).collect();
        assert_eq!(seconds, [(0.0, 3), (1.0, 1), (3.0, 1)]);
        assert_eq!(got[2].max_ns / 1_000_000, 7, "{got:?}");
        let sent = tcpkit_stats::plot::timeline_from_hdr_logs(&[path], "sent").unwrap();
        assert_eq!(sent.len(), 3);
    }

    #[test]
    fn an_empty_last_second_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.hlog");
        let log = Mutex::new(HdrLog::create(&path, std::time::SystemTime::now()).unwrap());
        let mut iv = Interval::new(&log);
        iv.begin(SECOND_NS);
        iv.record(1_000, 1_000);
        iv.roll(2 * SECOND_NS, SECOND_NS);
        iv.finish(SECOND_NS);
        log.lock().unwrap().flush().unwrap();
        let got = tcpkit_stats::plot::timeline_from_hdr_logs(&[path], "intended").unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
    }
}
