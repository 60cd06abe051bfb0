//! Counting and telling: latency/timing histograms, flow tables, the run summaries users read
//! (tcpreplay's `Actual:/Rated:/Flows:` vocabulary), their `--json` form, and the live line.
//!
//! Nothing here sends or parses packets; the jobs feed it numbers. Hot paths touch only plain
//! integers and per-thread histograms; the live line reads shared atomics from its own thread.

#![warn(missing_docs)]

mod copy;
mod flows;
mod hist;
pub mod host;
mod live;
mod load;
pub mod metrics;
pub mod plot;
mod replay;
mod report;

pub use copy::{
    loss_ratio_percent, CaptureStats, CopyReport, DiffStats, FailStats, LatencyStats, MemoryStats,
    RequestStats, SessionStats, TransparentStats, COPY_SCHEMA_VERSION,
};
pub use flows::FlowTable;
pub use hist::{HdrLog, HistDecodeError, Histogram, Percentiles};
pub use live::{percent_eta, stamp, LiveCounters, Monitor, MonitorOptions};
pub use load::{
    ConnStats, Histograms, LagStats, LoadReport, PerQueryStats, QueryStats, Rates,
    LOAD_SCHEMA_VERSION,
};
pub use replay::{
    DeviceStats, FlowStats, IfDelta, ReplayReport, TimingError, REPLAY_SCHEMA_VERSION,
};
pub use report::{chain, to_json, Report, Verdict};

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
