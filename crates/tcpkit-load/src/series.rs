//! Time in load reports: the one-second intervals a run records (the report's `intervals`:
//! queries asked, sent, answered, errors, timeouts and a histogram of that second's latencies),
//! kept bounded over runs of days by coarsening the oldest, and many runs' intervals laid on one
//! wall-clock axis (each report's clock offset to the controller taken off) into one series:
//! what `merge` prints per second for a fleet, what `load` builds from its threads and worker
//! processes, and what the fleet's plot is drawn from.
//!
//! The interval histograms of a run add up to its whole-run histogram (every answer is
//! recorded in both): exactly while the intervals are seconds; a merged interval (a long run's
//! old ones) keeps its latencies to within 0.8 % ([`MERGED_BITS`]), its counts exact.

use serde::{Deserialize, Serialize};

use tcpkit_stats::{HistDecodeError, Histogram};

pub(crate) const SECOND_NS: u64 = 1_000_000_000;

/// At most this many intervals are kept per series (per event-loop thread, their share of it,
/// and in a report): past it the oldest are merged in pairs. 4096 one-second intervals cover
/// an hour and eight minutes exactly; a day ends with 32-second ones at the old end.
pub const MAX_INTERVALS: usize = 4096;

/// The most heap a load process keeps for its intervals while it runs ([`held_bytes`]; each
/// event-loop thread its share): past it the oldest are merged in pairs, as past
/// [`MAX_INTERVALS`]. A second's histogram is a few hundred bytes at a few hundred answers a
/// second and KiB at tens of thousands, and merged ones grow with their spread, so a count
/// alone let load's memory grow for over an hour and by MiB (issue 29: +36-46 KiB/min per
/// worker in the 30-minute soak). 512 KiB stops the growth within minutes at any rate and
/// keeps it under the soak's 1 MiB flatness bound for any run length; every second stays in
/// `--hdr-log`.
pub const INTERVAL_BYTES: usize = 512 << 10;

/// The least of [`INTERVAL_BYTES`] one thread keeps however many threads share it: with one
/// thread per core on a large host, 512 KiB split 64 ways would hold a few seconds each and
/// coarsen the whole report (its rows are as long as its longest interval: at 32 KiB a
/// thread, a 5-minute run of 16 threads at 16k answers a second came out as 4 rows of 79 s);
/// a process of that many threads holds 1 MiB of histograms per thread anyway.
pub const INTERVAL_BYTES_PER_THREAD_MIN: usize = 128 << 10;

/// One event-loop thread's share of [`INTERVAL_BYTES`] among `threads`.
pub fn thread_budget(threads: usize) -> usize {
    (INTERVAL_BYTES / threads.max(1)).max(INTERVAL_BYTES_PER_THREAD_MIN)
}

/// The most rows a series laid out from reports may have: reports are files anyone can write,
/// and two intervals a century apart must not make a series of billions of seconds.
pub const MAX_ROWS: u64 = 1 << 17;

/// One interval of a run: the report's `intervals[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IntervalRec {
    /// Wall-clock start, ns since the Unix epoch, on the clock of the host that ran it (in a
    /// merged report: the controller's).
    pub start_unix_ns: u64,
    /// Its length in seconds: 1, or more for the old intervals of a run longer than
    /// [`MAX_INTERVALS`] seconds (merged in pairs); absent when 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub seconds: u64,
    /// Queries whose intended send time fell in it.
    pub asked: u64,
    /// Queries written to a socket in it.
    pub sent: u64,
    /// Answers in it.
    pub answered: u64,
    /// Errors counted in it (the report's `errors`, by errno and kind).
    pub errors: u64,
    /// Queries that timed out in it.
    pub timeouts: u64,
    /// The latencies (from the intended send time) of its answers: HDR V2 deflate, base64.
    pub hist: String,
}

fn one() -> u64 {
    1
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_one(v: &u64) -> bool {
    *v == 1
}

/// The counts of an interval, or their running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub asked: u64,
    pub sent: u64,
    pub answered: u64,
    pub errors: u64,
    pub timeouts: u64,
}

impl Tally {
    /// The counts of `r`.
    pub fn of(r: &IntervalRec) -> Tally {
        Tally {
            asked: r.asked,
            sent: r.sent,
            answered: r.answered,
            errors: r.errors,
            timeouts: r.timeouts,
        }
    }

    /// What happened since `before` (running totals only grow; a total that went back
    /// counts as nothing).
    pub fn since(&self, before: &Tally) -> Tally {
        Tally {
            asked: self.asked.saturating_sub(before.asked),
            sent: self.sent.saturating_sub(before.sent),
            answered: self.answered.saturating_sub(before.answered),
            errors: self.errors.saturating_sub(before.errors),
            timeouts: self.timeouts.saturating_sub(before.timeouts),
        }
    }

    /// `self + o`, or the name of the first count that overflows.
    pub fn checked_add(&self, o: &Tally) -> Result<Tally, &'static str> {
        let add = |a: u64, b: u64, f: &'static str| a.checked_add(b).ok_or(f);
        Ok(Tally {
            asked: add(self.asked, o.asked, "asked")?,
            sent: add(self.sent, o.sent, "sent")?,
            answered: add(self.answered, o.answered, "answered")?,
            errors: add(self.errors, o.errors, "errors")?,
            timeouts: add(self.timeouts, o.timeouts, "timeouts")?,
        })
    }

    /// True when nothing was counted.
    pub fn is_zero(&self) -> bool {
        *self == Tally::default()
    }

    /// The interval record of these counts.
    pub fn rec(&self, start_unix_ns: u64, seconds: u64, hist: String) -> IntervalRec {
        IntervalRec {
            start_unix_ns,
            seconds,
            asked: self.asked,
            sent: self.sent,
            answered: self.answered,
            errors: self.errors,
            timeouts: self.timeouts,
            hist,
        }
    }
}

/// Keeps `list` (in time order) within `cap` entries: while it is longer, the adjacent pair
/// with the smallest combined length (the oldest of equals) becomes one interval. Without
/// gaps this makes aligned power-of-two lengths, coarsest at the old end; the recent
/// seconds stay whole.
pub fn coarsen(list: &mut Vec<IntervalRec>, cap: usize) -> Result<(), HistDecodeError> {
    coarsen_within(list, cap, usize::MAX, &mut Histogram::new()).map(|_| ())
}

/// A merged interval's latencies are kept to this many significant bits (within 0.8 %; a
/// second's own are whole): its histogram, spread over decades on a long run, then takes an
/// eighth of the buckets and a third of the bytes, so [`INTERVAL_BYTES`] holds about three
/// times the intervals.
pub const MERGED_BITS: u32 = 8;

/// The heap one kept interval holds: its record and its histogram's text.
pub fn held_bytes(r: &IntervalRec) -> usize {
    std::mem::size_of::<IntervalRec>() + r.hist.capacity()
}

/// [`coarsen`] to at most `cap` entries and `bytes` of [`held_bytes`] (down to two entries,
/// however large those are), merging histograms in `scratch` (left cleared), so a caller
/// that does this every second allocates no histogram. Returns the bytes `list` holds.
/// A histogram that cannot be read stops it with the list whole (what was merged stays
/// merged).
pub fn coarsen_within(
    list: &mut Vec<IntervalRec>,
    cap: usize,
    bytes: usize,
    scratch: &mut Histogram,
) -> Result<usize, HistDecodeError> {
    let cap = cap.max(2);
    let mut held: usize = list.iter().map(held_bytes).sum();
    while list.len() > cap || (held > bytes && list.len() > 2) {
        let span = |a: &IntervalRec, b: &IntervalRec| {
            (b.start_unix_ns + b.seconds.saturating_mul(SECOND_NS)).saturating_sub(a.start_unix_ns)
        };
        let Some(i) = (0..list.len() - 1).min_by_key(|&i| span(&list[i], &list[i + 1])) else {
            break;
        };
        scratch.clear();
        let read = scratch
            .add_base64_within(&list[i].hist, MERGED_BITS)
            .and_then(|()| scratch.add_base64_within(&list[i + 1].hist, MERGED_BITS));
        if let Err(e) = read {
            scratch.clear();
            return Err(e);
        }
        let b = list.remove(i + 1);
        let a = &mut list[i];
        held -= held_bytes(a) + held_bytes(&b);
        let t = Tally::of(a)
            .checked_add(&Tally::of(&b))
            .unwrap_or_else(|_| Tally::of(a));
        let secs = span(a, &b).div_ceil(SECOND_NS).max(1);
        *a = t.rec(a.start_unix_ns, secs, scratch.to_base64());
        held += held_bytes(a);
    }
    scratch.clear();
    Ok(held)
}

/// One row of a merged series: the report's `series.rows[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeriesRow {
    /// Seconds from the series' start.
    pub t_s: u64,
    pub asked: u64,
    pub sent: u64,
    pub answered: u64,
    pub errors: u64,
    pub timeouts: u64,
    /// The median and 99th percentile of the row's answers' latency (0 with no answers).
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// A merged run's series: every report's intervals on the controller's clock, added per row.
/// The report's `series`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Wall-clock start of the first row, ns since the Unix epoch on the controller's clock
    /// (`agent time - fleet.clock_offset_ns`; a report without `fleet` as it is).
    pub start_unix_ns: u64,
    /// Each row's length in seconds (1, unless a run long enough to coarsen its intervals is in).
    pub seconds: u64,
    /// One per row from the first interval to the last; a row no report had is zeros.
    pub rows: Vec<SeriesRow>,
}

/// Why intervals could not be laid out.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Interval `interval` (from 0) of run `run` (from 0) has a histogram that cannot be read.
    #[error("intervals[{interval}].hist")]
    Hist {
        run: usize,
        interval: usize,
        #[source]
        source: HistDecodeError,
    },
    #[error("the intervals span {seconds} s, more than {MAX_ROWS} rows of {width} s")]
    Span { seconds: u64, width: u64 },
    #[error("intervals: the sum of {field} overflows")]
    Overflow { run: usize, field: &'static str },
}

/// `runs`' intervals, each run's start moved by its clock offset
/// (`controller time = its time - offset`), laid on one axis: rows as long as the longest interval (1 s unless a long run
/// coarsened), from the earliest start; each interval is added to the row its middle lies in
/// (so two hosts whose seconds begin a few ms apart share rows). Returns the merged
/// intervals (on the controller's clock, those with something in them) and the series.
/// Each interval's histogram is added to its row's straight from its text: memory does not
/// grow with the rows, and no histogram is made per interval.
pub fn lay_out(runs: &[(&[IntervalRec], i64)]) -> Result<(Vec<IntervalRec>, Series), LayoutError> {
    let width = runs
        .iter()
        .flat_map(|(l, _)| l.iter())
        .map(|r| r.seconds.clamp(1, MAX_ROWS))
        .max()
        .unwrap_or(1);
    let w_ns = i128::from(width) * i128::from(SECOND_NS);
    let half = i128::from(SECOND_NS / 2);
    let at = |r: &IntervalRec, off: i64| i128::from(r.start_unix_ns) - i128::from(off);
    let Some(t0) = runs
        .iter()
        .flat_map(|(l, off)| l.iter().map(move |r| at(r, *off)))
        .min()
    else {
        return Ok((Vec::new(), Series::default()));
    };
    let mut order: Vec<(u64, usize, usize)> = Vec::new();
    for (ri, (list, off)) in runs.iter().enumerate() {
        for (ii, r) in list.iter().enumerate() {
            // By its middle: a one-second interval in a two-second row goes to the row it
            // lies in, and two hosts' seconds a few ms apart share a row.
            let mid = at(r, *off) + i128::from(r.seconds.clamp(1, MAX_ROWS)) * half;
            let row = (mid - t0) / w_ns;
            let row = u64::try_from(row).unwrap_or(u64::MAX);
            if row >= MAX_ROWS {
                return Err(LayoutError::Span {
                    seconds: row.saturating_mul(width),
                    width,
                });
            }
            order.push((row, ri, ii));
        }
    }
    order.sort_unstable();
    let start = u64::try_from(t0.max(0)).unwrap_or(u64::MAX);
    let rows_n = order.last().map_or(0, |o| o.0 + 1);
    let mut series = Series {
        start_unix_ns: start,
        seconds: width,
        rows: Vec::with_capacity(rows_n as usize),
    };
    let mut merged = Vec::new();
    let mut acc = Histogram::new();
    let mut k = 0;
    for row in 0..rows_n {
        acc.clear();
        let mut t = Tally::default();
        while k < order.len() && order[k].0 == row {
            let (_, ri, ii) = order[k];
            let r = &runs[ri].0[ii];
            acc.add_base64(&r.hist).map_err(|e| LayoutError::Hist {
                run: ri,
                interval: ii,
                source: e,
            })?;
            t = t
                .checked_add(&Tally::of(r))
                .map_err(|field| LayoutError::Overflow { run: ri, field })?;
            k += 1;
        }
        let p = acc.percentiles();
        series.rows.push(SeriesRow {
            t_s: row * width,
            asked: t.asked,
            sent: t.sent,
            answered: t.answered,
            errors: t.errors,
            timeouts: t.timeouts,
            p50_ns: p.p50_ns,
            p99_ns: p.p99_ns,
        });
        if !t.is_zero() || acc.count() > 0 {
            let from = start.saturating_add(row * width * SECOND_NS);
            merged.push(t.rec(from, width, acc.to_base64()));
        }
    }
    Ok((merged, series))
}

/// The sum of `list`'s counts and of its histograms: what the run's whole must equal.
pub fn total(list: &[IntervalRec]) -> Result<(Tally, Histogram), LayoutError> {
    let mut t = Tally::default();
    let mut h = Histogram::new();
    for (i, r) in list.iter().enumerate() {
        t = t
            .checked_add(&Tally::of(r))
            .map_err(|field| LayoutError::Overflow { run: 0, field })?;
        h.add_base64(&r.hist).map_err(|e| LayoutError::Hist {
            run: 0,
            interval: i,
            source: e,
        })?;
    }
    Ok((t, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Second `k` of a run whose first second starts at `start` (agent clock): `n` answers of
    /// `lat` ns.
    fn sec(start: u64, k: u64, n: u64, lat: u64) -> IntervalRec {
        let mut h = Histogram::new();
        for _ in 0..n {
            h.record(lat);
        }
        Tally {
            asked: n,
            sent: n,
            answered: n,
            errors: 0,
            timeouts: 0,
        }
        .rec(start + k * SECOND_NS, 1, h.to_base64())
    }

    /// Two agents whose clocks differ by a known offset (B's reads 5.3 s ahead of the
    /// controller's, A's is the controller's) ran the same three seconds: laid out with the
    /// offsets taken off, their seconds share rows; with the offset ignored they would not.
    #[test]
    fn clocks_that_differ_by_a_known_offset_land_in_the_same_seconds() {
        let t = 1_700_000_000 * SECOND_NS;
        let off_b: i64 = 5_300_000_000;
        // B started 4 ms after A on the controller's clock.
        let b_start = t + 4_000_000 + off_b as u64;
        let a: Vec<_> = (0..3).map(|k| sec(t, k, 10, 1_000)).collect();
        let b: Vec<_> = (0..3).map(|k| sec(b_start, k, 5, 2_000_000)).collect();
        let (merged, s) = lay_out(&[(&a, 0), (&b, off_b)]).unwrap();
        assert_eq!(s.start_unix_ns, t);
        assert_eq!(s.seconds, 1);
        let answered: Vec<u64> = s.rows.iter().map(|r| r.answered).collect();
        assert_eq!(answered, [15, 15, 15]);
        assert_eq!(merged.len(), 3);
        assert_eq!(merged[1].start_unix_ns, t + SECOND_NS);
        // 10 fast answers and 5 slow ones per row: p50 fast, p99 slow.
        assert!(s.rows[0].p50_ns.abs_diff(1_000) <= 1, "{:?}", s.rows[0]);
        assert!(
            s.rows[0].p99_ns.abs_diff(2_000_000) <= 2_000,
            "{:?}",
            s.rows[0]
        );
        // The offset ignored: B's seconds are five rows later, and the series eight long.
        let (_, wrong) = lay_out(&[(&a, 0), (&b, 0)]).unwrap();
        assert_eq!(wrong.rows.len(), 8);
        assert_eq!(wrong.rows[5].answered, 5);
        // A clock behind the controller's (negative offset) works the same way.
        let c: Vec<_> = (0..3)
            .map(|k| sec(t - 2 * SECOND_NS, k, 1, 1_000))
            .collect();
        let (_, s) = lay_out(&[(&a, 0), (&c, -2_000_000_000)]).unwrap();
        assert_eq!(
            s.rows.iter().map(|r| r.answered).collect::<Vec<_>>(),
            [11, 11, 11]
        );
    }

    /// The merged intervals add up to the sum of the runs: counts and histogram, exactly.
    #[test]
    fn the_merged_intervals_sum_to_the_whole() {
        let t = 1_000 * SECOND_NS;
        let a: Vec<_> = (0..4).map(|k| sec(t, k, k + 1, 1_000 * (k + 1))).collect();
        let b: Vec<_> = (1..6).map(|k| sec(t + 300_000_000, k, 2, 7_000)).collect();
        let (merged, s) = lay_out(&[(&a, 0), (&b, 0)]).unwrap();
        let (ta, ha) = total(&a).unwrap();
        let (tb, hb) = total(&b).unwrap();
        let (tm, hm) = total(&merged).unwrap();
        assert_eq!(tm, ta.checked_add(&tb).unwrap());
        let mut whole = ha;
        whole.merge(&hb);
        assert_eq!(hm.to_base64(), whole.to_base64());
        assert_eq!(hm.count(), 20);
        let rows: u64 = s.rows.iter().map(|r| r.answered).sum();
        assert_eq!(rows, 20);
        assert_eq!(s.rows.len(), 6);
    }

    /// A gap (a second no run had) is a row of zeros; a span past MAX_ROWS is refused.
    #[test]
    fn gaps_are_zero_rows_and_absurd_spans_are_refused() {
        let t = 1_000 * SECOND_NS;
        let a = [sec(t, 0, 1, 1_000), sec(t, 3, 1, 1_000)];
        let (merged, s) = lay_out(&[(&a, 0)]).unwrap();
        assert_eq!(s.rows.len(), 4);
        assert_eq!(
            s.rows[1],
            SeriesRow {
                t_s: 1,
                ..SeriesRow::default()
            }
        );
        assert_eq!(merged.len(), 2);
        let far = [sec(0, 0, 1, 1), sec(u64::MAX / 2, 0, 1, 1)];
        let e = lay_out(&[(&far, 0)]).unwrap_err();
        assert!(e.to_string().contains("more than 131072 rows"), "{e}");
        let bad = [IntervalRec {
            hist: "%%".into(),
            ..sec(t, 0, 1, 1)
        }];
        assert!(matches!(
            lay_out(&[(&a, 0), (&bad, 0)]),
            Err(LayoutError::Hist {
                run: 1,
                interval: 0,
                ..
            })
        ));
        assert_eq!(lay_out(&[]).unwrap().1, Series::default());
    }

    /// A run longer than the cap keeps its last seconds whole and merges the oldest in
    /// aligned pairs; nothing is lost.
    #[test]
    fn coarsening_keeps_the_sum_and_the_recent_seconds() {
        let t = 1_000 * SECOND_NS;
        let mut list: Vec<_> = (0..8).map(|k| sec(t, k, 1, 1_000 + k)).collect();
        let (before, hb) = total(&list).unwrap();
        list.push(sec(t, 8, 1, 9_000));
        coarsen(&mut list, 8).unwrap();
        let widths: Vec<u64> = list.iter().map(|r| r.seconds).collect();
        assert_eq!(widths, [2, 1, 1, 1, 1, 1, 1, 1]);
        list.push(sec(t, 9, 1, 9_000));
        coarsen(&mut list, 8).unwrap();
        let widths: Vec<u64> = list.iter().map(|r| r.seconds).collect();
        assert_eq!(widths, [2, 2, 1, 1, 1, 1, 1, 1]);
        assert_eq!(list[1].start_unix_ns, t + 2 * SECOND_NS);
        let (after, ha) = total(&list).unwrap();
        assert_eq!(after.answered, before.answered + 2);
        assert_eq!(ha.count(), hb.count() + 2);
        // Laid out, the rows are as long as the longest interval.
        let (_, s) = lay_out(&[(&list, 0)]).unwrap();
        assert_eq!(s.seconds, 2);
        assert_eq!(s.rows.iter().map(|r| r.answered).sum::<u64>(), 10);
        let json = serde_json::to_value(&list[0]).unwrap();
        assert_eq!(json["seconds"], 2);
        assert!(serde_json::to_value(&list[7])
            .unwrap()
            .get("seconds")
            .is_none());
    }
}
