//! Counting and telling, what every job's report is made of: the report contract ([`Report`],
//! [`Verdict`], the one-line error [`chain`], [`to_json`], reading report files bounded and
//! printing their strings safely), the pass/fail [`Limits`] on a whole run, latency/timing histograms and HDR
//! logs, flow tables, the live line ([`Monitor`]), SVG plots and tcpreplay's rates.
//!
//! Each job's report type lives in its job crate (`tcpkit_replay::ReplayReport`,
//! `tcpkit_copy::report::CopyReport`, `tcpkit_load::report::LoadReport`, mpcat's, balance's,
//! echo's and tune's beside them) and is built from these pieces; only what several jobs share
//! lives here. Nothing here sends or parses packets; the jobs feed it numbers. Hot paths touch
//! only plain integers and per-thread histograms; the live line reads shared atomics from its
//! own thread.

#![warn(missing_docs)]

mod flows;
mod hist;
pub mod limits;
mod live;
pub mod plot;
mod report;

pub use flows::FlowTable;
pub use hist::{fmt_ns, HdrLog, HistDecodeError, Histogram, Percentiles};
pub use limits::{LimitCheck, Limits, LimitsVerdict, Measured, Measures};
pub use live::{percent_eta, stamp, LiveCounters, Monitor, MonitorOptions};
pub use report::{chain, escape_controls, read_capped, to_json, ReadCapped, Report, Verdict};

/// Bytes per second, megabits per second and packets per second over `secs`, as tcpreplay rates
/// them (0 when no time passed, never NaN or infinity in output).
pub fn rates(packets: u64, bytes: u64, secs: f64) -> (f64, f64, f64) {
    if secs <= 0.0 || !secs.is_finite() {
        return (0.0, 0.0, 0.0);
    }
    let bps = bytes as f64 / secs;
    (bps, bps * 8.0 / 1_000_000.0, packets as f64 / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_zero_time_is_zero() {
        assert_eq!(rates(10, 100, 0.0), (0.0, 0.0, 0.0));
        let (bps, mbps, pps) = rates(100, 1_000_000, 2.0);
        assert_eq!(bps, 500_000.0);
        assert_eq!(mbps, 4.0);
        assert_eq!(pps, 50.0);
    }
}
