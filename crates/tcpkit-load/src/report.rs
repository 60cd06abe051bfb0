//! The `load` report: connections, queries, rates, schedule lag, answer codes, errors with
//! their hints, and the two latency distributions (from the intended send time, wrk2's
//! "corrected" one, and from the actual send time), printed as wrk2 prints them. The JSON form
//! carries both histograms serialized (HDR V2 deflate, base64) and the wall-time window, so
//! `tcpkit merge` can join the runs of several processes or hosts into one.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use tcpkit_stats::{
    fmt_ns, to_json, Histogram, Limits, LimitsVerdict, Measured, Percentiles, Report, Verdict,
};

pub use crate::series::{IntervalRec, Series, SeriesRow};

/// Bumped whenever a JSON field changes meaning or disappears (docs/schema/load.schema.json).
pub const LOAD_SCHEMA_VERSION: u32 = 1;

/// Everything a load run reports. Field names are the `--json` contract.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadReport {
    /// [`LOAD_SCHEMA_VERSION`] when written: which layout of this document a reader holds.
    pub schema_version: u32,
    /// This run's identity (128 random bits in hex), so that `tcpkit merge` can refuse one run
    /// given twice. A merged report gets an id of its own.
    #[serde(default)]
    pub run_id: String,
    /// The ids of the runs merged into this report (empty for a run of its own).
    #[serde(default)]
    pub merged_run_ids: Vec<String>,
    /// `HOST:PORT` as given, and the address it resolved to.
    pub target: String,
    /// What each query is (`dns A example.com`, `echo 64 bytes`, ...).
    pub payload: String,
    /// Runs merged into this report (1 for one `tcpkit load`, whatever its processes).
    pub runs: u32,
    /// Processes that ran queries, summed over merged runs (more than 1 when `--procs` asks, or
    /// when `-c` needs more descriptors than one process may hold).
    pub processes: u32,
    /// Event-loop threads, all processes.
    pub threads: u32,
    /// `--shard K/N`: this agent's part of a run several hosts share (its counts and rates
    /// are its share of the command line's); absent when the run is not sharded, and in a
    /// merged report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// Wall time (ns since the Unix epoch) when the query phase began and ended.
    pub start_unix_ns: u64,
    /// Wall time (ns since the Unix epoch) when the query phase ended.
    pub end_unix_ns: u64,
    /// Length of the query phase (the union of the merged windows).
    pub seconds: f64,
    /// How long opening the connections took before the query phase.
    pub connect_seconds: f64,
    /// Connections asked, opened, failed and closed.
    pub connections: ConnStats,
    /// Queries scheduled, sent, answered, and how the others ended.
    pub queries: QueryStats,
    /// Queries per second over `seconds`.
    pub rates: Rates,
    /// How far the client fell behind its schedule.
    pub lag: LagStats,
    /// Answers by code: DNS RCODE names, HTTP status codes, `ERR` for Redis errors, `ok`
    /// for payloads without codes.
    pub codes: BTreeMap<String, u64>,
    /// Failed socket calls by errno name (`ECONNREFUSED`, `EMFILE`, ...) and protocol
    /// errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// One line per limit that was hit, saying what to change.
    pub hints: Vec<String>,
    /// Latency from each query's intended send time (includes time spent behind schedule).
    pub latency: Percentiles,
    /// Latency from each query's actual send time (what the server and network took).
    pub latency_sent: Percentiles,
    /// The two latency distributions whole, for `tcpkit merge`.
    pub histograms: Histograms,
    /// The `-R`/`--per-query` file; absent without `-R`.
    pub per_query: Option<PerQueryStats>,
    /// Why this run counts as failed (exit status 1); absent when it did what was asked.
    pub failure: Option<String>,
    /// `--barrier`: the fleet run this agent was started in; absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<Fleet>,
    /// One entry per second of the query phase (and of the wait for the last answers), on
    /// this host's clock: what `merge` lays on one axis for a fleet. They add up to the whole
    /// run exactly. Empty in reports of older tcpkit.
    #[serde(default)]
    pub intervals: Vec<IntervalRec>,
    /// A merged report's per-second series (every report's intervals on the controller's
    /// clock); absent from a run's own report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<Series>,
    /// A merged report of a fleet run: its agents, their clocks and starts, the shards with no
    /// report, the agents the barrier stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_fleet: Option<MergedFleet>,
    /// `--tls`: handshakes (full, resumed, failed by reason, per second), their latency, and
    /// what was negotiated; absent without --tls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls_report::TlsStats>,
    /// The limits given (`--max-p99`, ...), each checked on the whole run; absent without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<LimitsVerdict>,
}

/// `--shard K/N` (tcpkit-workers' one type) and the agent's `fleet` object (tcpkit-fleet's),
/// as the reports carry them.
pub use tcpkit_fleet::FleetReport as Fleet;
pub use tcpkit_workers::Shard;

/// A merged fleet run: who took part, when each started on the controller's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedFleet {
    /// The fleet run's id (empty when the reports were not started by a barrier).
    pub run_id: String,
    /// N of the reports' `--shard K/N` (null without shards).
    pub shards: Option<u32>,
    /// One per report, in the order given.
    pub agents: Vec<Agent>,
    /// Shards 1..N with no report.
    pub missing_shards: Vec<u32>,
    /// The latest actual start minus the earliest, on the controller's clock (0 with fewer
    /// than two agents with a `fleet`).
    pub start_spread_ns: u64,
}

/// One agent of a merged fleet run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    /// The file its report was read from.
    pub report: String,
    pub shard: Option<Shard>,
    /// Its hostname (empty without `fleet`).
    pub host: String,
    pub clock_offset_ns: i64,
    pub offset_rtt_ns: u64,
    /// Its first query, on the controller's clock (0 without `fleet`).
    pub actual_start_unix_ns: u64,
    pub answered: u64,
    /// Why the barrier stopped it early.
    pub stopped_by: Option<String>,
}

impl LoadReport {
    /// What the limits are judged on: the corrected latency (from the intended send time),
    /// the answered rate, the queries sent and never answered in percent of those sent (0
    /// when none was sent), and the errors (the `errors` counts).
    pub fn measured(&self) -> Measured {
        let q = &self.queries;
        Measured {
            p99_ns: Some(self.latency.p99_ns),
            p999_ns: Some(self.latency.p999_ns),
            answered_qps: Some(self.rates.answered_qps),
            loss_percent: Some(if q.sent == 0 {
                0.0
            } else {
                q.sent.saturating_sub(q.answered) as f64 * 100.0 / q.sent as f64
            }),
            errors: Some(self.errors.values().fold(0u64, |a, b| a.saturating_add(*b))),
        }
    }

    /// Judges `limits` on this report: its `verdict`, and a broken limit appended to its
    /// `failure` (so it is the last line, and the exit status 1). Nothing without limits.
    pub fn judge_limits(&mut self, limits: &Limits) {
        if limits.is_empty() {
            return;
        }
        let v = limits.judge(&self.measured());
        if let Some(broken) = v.broken() {
            self.failure = Some(match self.failure.take() {
                Some(f) => format!("{f}; {broken}"),
                None => broken,
            });
        }
        self.verdict = Some(v);
    }
}

/// Connections: asked, opened, failed and closed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConnStats {
    /// `-c` as asked.
    pub asked: u64,
    /// Most connections open at once.
    pub peak_open: u64,
    /// Connections open when the query phase ended.
    pub open_at_end: u64,
    /// Connects started, successful ones, and failed ones (refused, unreachable, timed out).
    pub attempts: u64,
    /// Connects that completed.
    pub established: u64,
    /// Connects that failed: refused, unreachable, out of descriptors or ports, or timed out.
    pub failed: u64,
    /// Failed connects that timed out (`--connect-timeout`); included in `failed`.
    pub timeouts: u64,
    /// Connects retried after a failure.
    pub retries: u64,
    /// Connections the server closed or reset during the run.
    pub closed_by_server: u64,
    /// Connections re-opened during the query phase (after a close, or `--queries-per-conn`).
    pub reconnects: u64,
    /// Source addresses × local ports: the most connections this host can open to the target.
    pub reachable_max: u64,
    /// Connects answered only after a second or more: the first SYN went unanswered and was
    /// sent again, as when the server's accept queue is full (it drops SYNs, then answers a
    /// retransmission once it has room).
    #[serde(default)]
    pub slow: u64,
}

/// Queries, and how each one ended: `sent = answered + timeouts + lost + unanswered_at_end`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueryStats {
    /// Intended send times that fell inside the query phase.
    pub scheduled: u64,
    /// Queries written to a socket.
    pub sent: u64,
    /// Queries answered (matched to a query in flight), `echoed` included.
    pub answered: u64,
    /// Answers that were the query itself sent back (DNS: same ID, QR bit clear), as a plain
    /// echo server does; included in `answered`, not in `codes`.
    #[serde(default)]
    pub echoed: u64,
    /// Queries unanswered after `--timeout`.
    pub timeouts: u64,
    /// Queries outstanding on a connection that closed or failed.
    pub lost: u64,
    /// Queries still unanswered when the run ended (after waiting up to `--timeout`).
    pub unanswered_at_end: u64,
    /// Answers that broke the protocol (bad DNS, echo bytes that differ, garbage); each
    /// closes its connection (the stream cannot be trusted past it).
    pub malformed: u64,
    /// Well-formed answers that matched no outstanding query (late after a timeout, unknown ID).
    pub unmatched: u64,
    /// Bytes of queries written to the sockets.
    pub bytes_sent: u64,
    /// Bytes read from the sockets (answers, whole or not).
    pub bytes_received: u64,
}

/// Rates, queries per second over `seconds` (for merged runs, of the union of their windows).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Rates {
    /// Mean rate asked over the query phase; absent when no rate was asked (idle connections).
    pub asked_qps: Option<f64>,
    /// `queries.sent` per second.
    pub sent_qps: f64,
    /// `queries.answered` per second.
    pub answered_qps: f64,
}

/// The schedule's lag: how far behind its intended send times the client fell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LagStats {
    /// Scheduled queries never sent because the client was behind.
    pub behind: u64,
    /// Largest distance between now and the oldest unsent intended send time.
    pub max_ns: u64,
    /// That distance when the query phase ended.
    pub end_ns: u64,
}

/// Both histograms, HDR V2 deflate in base64 (`Histogram::to_base64`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Histograms {
    /// Latency from the intended send time, nanoseconds.
    pub intended: String,
    /// Latency from the actual send time, nanoseconds.
    pub sent: String,
}

/// The `-R`/`--per-query` file: one line per query.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PerQueryStats {
    /// Where it was written.
    pub path: String,
    /// Lines written.
    pub lines: u64,
    /// Lines not written because the writer thread fell behind (the run is never slowed).
    pub dropped: u64,
}

fn pct_block(s: &mut String, title: &str, p: &Percentiles) {
    let _ = writeln!(s, "  {title}");
    if p.count == 0 {
        // Rows of `0.0 us` would read as answers in no time.
        let _ = writeln!(s, "  no samples");
        return;
    }
    let _ = writeln!(
        s,
        "  min {}, mean {}, stdev {}",
        fmt_ns(p.min_ns).trim_start(),
        fmt_ns(p.mean_ns).trim_start(),
        fmt_ns(p.stdev_ns).trim_start()
    );
    for (q, v) in [
        ("50.000%", p.p50_ns),
        ("90.000%", p.p90_ns),
        ("99.000%", p.p99_ns),
        ("99.900%", p.p999_ns),
        ("99.990%", p.p9999_ns),
        ("100.000%", p.max_ns),
    ] {
        let _ = writeln!(s, " {q:>8}  {:>10}", fmt_ns(v));
    }
}

/// The agents of a merged fleet run, one line each, and the spread of their starts.
fn fleet_block(s: &mut String, f: &MergedFleet) {
    let id = if f.run_id.is_empty() {
        String::new()
    } else {
        format!(" {}", f.run_id)
    };
    let shards = f
        .shards
        .map_or(String::new(), |n| format!(" of {n} shards"));
    let _ = writeln!(
        s,
        "Fleet run{id}: {} report{}{shards}; actual starts within {:.3} ms (controller clock)",
        f.agents.len(),
        if f.agents.len() == 1 { "" } else { "s" },
        f.start_spread_ns as f64 / 1e6
    );
    for a in &f.agents {
        let shard = a.shard.map_or(String::new(), |k| format!("shard {} ", k));
        let host = if a.host.is_empty() {
            String::new()
        } else {
            format!(
                " on {}, clock {:+.3} ms (+/- {:.3} ms)",
                a.host,
                a.clock_offset_ns as f64 / 1e6,
                a.offset_rtt_ns as f64 / 2e6
            )
        };
        let stopped = a
            .stopped_by
            .as_ref()
            .map_or(String::new(), |w| format!("; stopped by the barrier: {w}"));
        let _ = writeln!(
            s,
            "  {shard}{}{host}: {} answered{stopped}",
            a.report, a.answered
        );
    }
    for k in &f.missing_shards {
        let _ = writeln!(s, "  shard {k}/{}: no report", f.shards.unwrap_or_default());
    }
}

/// Rows the series table prints at most: longer series are shown in groups of rows.
const TABLE_ROWS: usize = 30;

/// The per-second series as wrk2 and k6 print a time series: one short line per row (rows
/// grouped so that at most [`TABLE_ROWS`] are printed), latency from the merged intervals.
fn series_table(s: &mut String, series: &Series, intervals: &[IntervalRec]) {
    if series.rows.is_empty() {
        return;
    }
    let g = series.rows.len().div_ceil(TABLE_ROWS);
    let width = series.seconds.saturating_mul(g as u64);
    let _ = writeln!(
        s,
        "Per {width} s (controller clock, from {}):",
        wall_time(series.start_unix_ns)
    );
    let _ = writeln!(
        s,
        "  {:>7} {:>9} {:>9} {:>9} {:>7} {:>8} {:>10} {:>10}",
        "t", "asked", "sent", "answered", "errors", "timeouts", "p50", "p99"
    );
    let w_ns = series.seconds.saturating_mul(crate::series::SECOND_NS);
    for (i, rows) in series.rows.chunks(g).enumerate() {
        let sum = |f: fn(&SeriesRow) -> u64| rows.iter().fold(0u64, |a, r| a.saturating_add(f(r)));
        let (p50, p99) = if g == 1 {
            (rows[0].p50_ns, rows[0].p99_ns)
        } else {
            // A group's percentiles from its rows' histograms, not from their percentiles.
            let from = series.start_unix_ns + (i * g) as u64 * w_ns;
            let to = from + rows.len() as u64 * w_ns;
            let mut h = Histogram::new();
            for iv in intervals
                .iter()
                .filter(|iv| (from..to).contains(&iv.start_unix_ns))
            {
                if let Ok(x) = Histogram::from_base64(&iv.hist) {
                    h.merge(&x);
                }
            }
            let p = h.percentiles();
            (p.p50_ns, p.p99_ns)
        };
        let answered = sum(|r| r.answered);
        let lat = |v: u64| {
            if answered == 0 {
                "-".to_string()
            } else {
                fmt_ns(v)
            }
        };
        let _ = writeln!(
            s,
            "  {:>6}s {:>9} {:>9} {:>9} {:>7} {:>8} {:>10} {:>10}",
            rows[0].t_s,
            sum(|r| r.asked),
            sum(|r| r.sent),
            answered,
            sum(|r| r.errors),
            sum(|r| r.timeouts),
            lat(p50),
            lat(p99)
        );
    }
}

/// Unix ns as UTC wall-clock time to the millisecond (RFC 3339).
fn wall_time(ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
    humantime::format_rfc3339_millis(t).to_string()
}

impl Report for LoadReport {
    /// The human summary: counts first, then wrk2's latency distribution.
    fn human(&self) -> String {
        let mut s = String::new();
        let c = &self.connections;
        let q = &self.queries;
        let _ = writeln!(
            s,
            "Target: {}, {}, {} threads in {} process{}{}{}",
            self.target,
            self.payload,
            self.threads,
            self.processes,
            if self.processes == 1 { "" } else { "es" },
            match self.shard {
                Some(s) => format!(", shard {}/{}", s.index, s.count),
                None => String::new(),
            },
            if self.runs > 1 {
                format!(", {} runs merged", self.runs)
            } else {
                String::new()
            }
        );
        if !self.run_id.is_empty() {
            let window = if self.start_unix_ns > 0 {
                format!(
                    ", {} to {}",
                    wall_time(self.start_unix_ns),
                    wall_time(self.end_unix_ns)
                )
            } else {
                String::new()
            };
            let _ = writeln!(s, "Run: {}{window}", self.run_id);
        }
        let _ = writeln!(
            s,
            "Connections: {} asked, {} peak open, {} open at end (opened in {:.3} s, reachable max {})",
            c.asked, c.peak_open, c.open_at_end, self.connect_seconds, c.reachable_max
        );
        let slow = if c.slow > 0 {
            format!(", {} answered late (SYN sent again)", c.slow)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "Connects: {} attempts, {} established, {} failed ({} timed out), {} retries, {} closed by server, {} reconnects{slow}",
            c.attempts, c.established, c.failed, c.timeouts, c.retries, c.closed_by_server, c.reconnects
        );
        let _ = writeln!(
            s,
            "Queries: {} sent, {} answered{} in {:.3} s; {} timeouts, {} lost, {} unanswered at end, {} malformed, {} unmatched",
            q.sent,
            q.answered,
            if q.echoed > 0 {
                format!(" ({} of them the query echoed back)", q.echoed)
            } else {
                String::new()
            },
            self.seconds, q.timeouts, q.lost, q.unanswered_at_end, q.malformed, q.unmatched
        );
        let asked = match self.rates.asked_qps {
            Some(r) => format!("asked {r:.1} q/s, "),
            None => "no rate asked (idle connections), ".into(),
        };
        let _ = writeln!(
            s,
            "Rate: {asked}sent {:.1} q/s, answered {:.1} q/s",
            self.rates.sent_qps, self.rates.answered_qps
        );
        if self.rates.asked_qps.is_some() || q.scheduled > 0 {
            let _ = writeln!(
                s,
                "Schedule lag: max {}, at end {}, {} of {} scheduled queries not sent",
                fmt_ns(self.lag.max_ns),
                fmt_ns(self.lag.end_ns),
                self.lag.behind,
                q.scheduled
            );
        } else {
            let _ = writeln!(s, "Schedule lag: none (no queries scheduled)");
        }
        let _ = writeln!(
            s,
            "Bytes: {} sent, {} received",
            q.bytes_sent, q.bytes_received
        );
        if !self.codes.is_empty() {
            // `HTTP 200: 199`, not `200 199`: a status and a count side by side read as two
            // numbers.
            let http = self.payload.starts_with("http ");
            let codes: Vec<String> = self
                .codes
                .iter()
                .map(|(k, v)| {
                    if http {
                        format!("HTTP {k}: {v}")
                    } else {
                        format!("{k} {v}")
                    }
                })
                .collect();
            let _ = writeln!(s, "Answers: {}", codes.join(", "));
            // wrk's line, for its users' scripts and eyes: answers that were not a success.
            let other: u64 = self
                .codes
                .iter()
                .filter(|(k, _)| !k.parse::<u16>().is_ok_and(|c| (200..400).contains(&c)))
                .map(|(_, v)| v)
                .sum();
            if http && other > 0 {
                let _ = writeln!(s, "Non-2xx or 3xx responses: {other}");
            }
        }
        if !self.errors.is_empty() {
            let errs: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(s, "Errors: {}", errs.join(", "));
        }
        for h in &self.hints {
            let _ = writeln!(s, "Hint: {h}");
        }
        if let Some(p) = &self.per_query {
            let _ = writeln!(
                s,
                "Per-query log: {} lines to {}, {} dropped",
                p.lines, p.path, p.dropped
            );
        }
        if let Some(t) = &self.tls {
            t.human(&mut s);
        }
        if let Some(f) = &self.merged_fleet {
            fleet_block(&mut s, f);
        }
        if let Some(series) = &self.series {
            series_table(&mut s, series, &self.intervals);
        }
        pct_block(
            &mut s,
            "Latency Distribution (HdrHistogram - Recorded Latency, from intended send time)",
            &self.latency,
        );
        pct_block(
            &mut s,
            "Latency Distribution (HdrHistogram - Uncorrected Latency, from actual send time)",
            &self.latency_sent,
        );
        s.push_str(&tcpkit_stats::limits::summary_tail(
            self.verdict.as_ref(),
            self.failure.as_deref(),
        ));
        s
    }

    fn json(&self) -> String {
        let mut v = self.clone();
        v.schema_version = LOAD_SCHEMA_VERSION;
        to_json(&v)
    }

    fn verdict(&self) -> Verdict {
        Verdict::from_failure(self.failure.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LoadReport {
        let p = Percentiles {
            count: 3000,
            min_ns: 41_000,
            mean_ns: 60_000,
            stdev_ns: 15_500,
            p50_ns: 52_000,
            p90_ns: 80_000,
            p99_ns: 120_000,
            p999_ns: 900_000,
            p9999_ns: 2_000_000,
            max_ns: 12_500_000,
        };
        LoadReport {
            target: "198.18.0.2:4242".into(),
            payload: "echo 16 bytes".into(),
            runs: 1,
            processes: 1,
            threads: 2,
            seconds: 3.0,
            connect_seconds: 0.01,
            connections: ConnStats {
                asked: 10,
                peak_open: 10,
                open_at_end: 10,
                attempts: 11,
                established: 10,
                failed: 1,
                retries: 1,
                reachable_max: 28232,
                ..Default::default()
            },
            queries: QueryStats {
                scheduled: 3000,
                sent: 3000,
                answered: 2999,
                unanswered_at_end: 1,
                bytes_sent: 48000,
                bytes_received: 47984,
                ..Default::default()
            },
            rates: Rates {
                asked_qps: Some(1000.0),
                sent_qps: 1000.0,
                answered_qps: 999.7,
            },
            lag: LagStats {
                behind: 0,
                max_ns: 45_000,
                end_ns: 0,
            },
            codes: [("ok".to_string(), 2999)].into_iter().collect(),
            errors: [("ECONNREFUSED".to_string(), 1)].into_iter().collect(),
            latency: p,
            latency_sent: Percentiles {
                max_ns: 1_000_000,
                ..p
            },
            ..Default::default()
        }
    }

    #[test]
    fn human_summary_exact_text() {
        let expected = "\
Target: 198.18.0.2:4242, echo 16 bytes, 2 threads in 1 process
Connections: 10 asked, 10 peak open, 10 open at end (opened in 0.010 s, reachable max 28232)
Connects: 11 attempts, 10 established, 1 failed (0 timed out), 1 retries, 0 closed by server, 0 reconnects
Queries: 3000 sent, 2999 answered in 3.000 s; 0 timeouts, 0 lost, 1 unanswered at end, 0 malformed, 0 unmatched
Rate: asked 1000.0 q/s, sent 1000.0 q/s, answered 999.7 q/s
Schedule lag: max 45.0 us, at end 0.0 us, 0 of 3000 scheduled queries not sent
Bytes: 48000 sent, 47984 received
Answers: ok 2999
Errors: ECONNREFUSED 1
  Latency Distribution (HdrHistogram - Recorded Latency, from intended send time)
  min 41.0 us, mean 60.0 us, stdev 15.5 us
  50.000%     52.0 us
  90.000%     80.0 us
  99.000%    120.0 us
  99.900%    900.0 us
  99.990%   2000.0 us
 100.000%    12.50 ms
  Latency Distribution (HdrHistogram - Uncorrected Latency, from actual send time)
  min 41.0 us, mean 60.0 us, stdev 15.5 us
  50.000%     52.0 us
  90.000%     80.0 us
  99.000%    120.0 us
  99.900%    900.0 us
  99.990%   2000.0 us
 100.000%   1000.0 us
";
        assert_eq!(sample().human(), expected);
    }

    /// Issue 10, case 12: a status and its count are not two numbers side by side.
    #[test]
    fn http_status_counts_read_as_status_and_count() {
        let mut r = sample();
        r.payload = "http GET /".into();
        r.codes = [("200".to_string(), 199), ("404".to_string(), 1)]
            .into_iter()
            .collect();
        let text = r.human();
        assert!(
            text.contains("\nAnswers: HTTP 200: 199, HTTP 404: 1\nNon-2xx or 3xx responses: 1\n"),
            "{text}"
        );
        // Other payloads keep their names.
        r.payload = "dns A example.com".into();
        r.codes = [("NOERROR".to_string(), 5)].into_iter().collect();
        assert!(r.human().contains("\nAnswers: NOERROR 5\n"));
    }

    /// Issue 10, case 6: a table of no samples says so instead of rows of `0.0 us`.
    #[test]
    fn a_latency_table_with_no_samples_says_so() {
        let mut r = sample();
        r.latency = Percentiles::default();
        r.latency_sent = Percentiles::default();
        let text = r.human();
        assert!(
            text.ends_with(
                "  Latency Distribution (HdrHistogram - Recorded Latency, from intended send time)
  no samples
  Latency Distribution (HdrHistogram - Uncorrected Latency, from actual send time)
  no samples
"
            ),
            "{text}"
        );
        assert!(!text.contains("%"), "{text}");
    }

    /// The run id and wall-clock window (issue 10, case 11), echoed queries (case 5) and
    /// connects answered late (case 8) in the summary.
    #[test]
    fn run_echoes_and_late_connects_in_the_summary() {
        let mut r = sample();
        r.run_id = "0123456789abcdef0123456789abcdef".into();
        r.start_unix_ns = 1_795_000_000_123_000_000;
        r.end_unix_ns = 1_795_000_003_123_000_000;
        r.queries.echoed = 2999;
        r.connections.slow = 2;
        let text = r.human();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "Run: 0123456789abcdef0123456789abcdef, 2026-11-18T11:06:40.123Z to 2026-11-18T11:06:43.123Z"
        );
        assert!(
            lines[3].ends_with(", 0 reconnects, 2 answered late (SYN sent again)"),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].starts_with("Queries: 3000 sent, 2999 answered (2999 of them the query echoed back) in 3.000 s;"),
            "{}",
            lines[4]
        );
    }

    /// Issue 25: a shard says which it is, in the summary and the JSON; an unsharded run has
    /// no `shard` at all.
    #[test]
    fn a_shard_says_which_it_is() {
        let mut r = sample();
        assert!(!r.json().contains("\"shard\""));
        r.shard = Some(Shard { index: 2, count: 3 });
        assert!(r.human().starts_with(
            "Target: 198.18.0.2:4242, echo 16 bytes, 2 threads in 1 process, shard 2/3\n"
        ));
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["shard"], serde_json::json!({"index": 2, "count": 3}));
        let back: LoadReport = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(back.shard, r.shard);
    }

    #[test]
    fn json_round_trips_and_has_stable_fields() {
        let text = sample().json();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema_version"], LOAD_SCHEMA_VERSION);
        assert_eq!(v["queries"]["answered"], 2999);
        assert_eq!(v["rates"]["asked_qps"], 1000.0);
        assert_eq!(v["latency"]["p99_ns"], 120_000);
        assert_eq!(v["codes"]["ok"], 2999);
        let back: LoadReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back.queries.sent, 3000);
        assert_eq!(back.latency, sample().latency);
    }
}
