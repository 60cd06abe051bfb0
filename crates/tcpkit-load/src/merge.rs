//! `tcpkit merge`: joins `tcpkit load --json` reports of runs made at the same time (from
//! several client hosts, or the worker processes of one run) into one report: counts summed,
//! histograms merged from their serialized form (so percentiles are exact, not averaged),
//! rates over the union of the runs' wall-clock windows, the runs' one-second intervals laid
//! on one wall-clock axis (each report's clock offset to the controller taken off:
//! [`crate::series`]) as the fleet's series. Reports of one fleet run are checked as one: a
//! shard given twice is refused, a shard with no report and an agent the barrier stopped are
//! named, and the limits are judged on the whole ([`merge_run`]).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use crate::report::{Agent, LoadReport, MergedFleet, Shard, LOAD_SCHEMA_VERSION};
use crate::series::{lay_out, total, IntervalRec, LayoutError};
use crate::tls_report::TlsStats;
use tcpkit_stats::{Histogram, Limits};

/// Why reports could not be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("{path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a tcpkit load --json report")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: schema version {found}, this tcpkit reads {LOAD_SCHEMA_VERSION}")]
    Version { path: String, found: u32 },
    #[error("{what}")]
    Histogram {
        /// The report's number, from 1.
        report: usize,
        what: String,
        #[source]
        source: tcpkit_stats::HistDecodeError,
    },
    #[error("{path}: larger than {MAX_REPORT} bytes, not a load report")]
    TooBig { path: String },
    /// Another command's report: named for what it is, with what merge takes.
    #[error("{path}: a `tcpkit {kind} --json` report, not a load report: merge takes the reports of `tcpkit load --json` (or of `tcpkit copy --json`)")]
    OtherReport { path: String, kind: &'static str },
    /// A field merge sums, absent: a report that lacks it cannot be summed honestly.
    #[error("{path}: no `{field}` field: not a complete tcpkit load --json report")]
    Missing { path: String, field: &'static str },
    /// A sum that does not fit: the reports are not of real runs.
    #[error("report {report}: {field}: the sum overflows ({have} + {add})")]
    Overflow {
        report: usize,
        field: String,
        have: u64,
        add: u64,
    },
    #[error("report {report}: rates.asked_qps is {value}, not a rate")]
    BadRate { report: usize, value: f64 },
    #[error("nothing to merge")]
    Empty,
    /// The intervals cannot be laid out (a histogram that cannot be read, a sum that
    /// overflows, a span of centuries).
    #[error("report {report}: {source}")]
    Series {
        /// The report's number, from 1.
        report: usize,
        #[source]
        source: LayoutError,
    },
    /// One shard of one fleet run in two reports: a retried agent or pod is counted once.
    #[error("{first} and {second} are both shard {shard}{of}: a retried agent is counted once; merge the report of the run that counted")]
    SameShard {
        first: String,
        second: String,
        shard: String,
        of: String,
    },
    /// Reports of two fleet runs, or shards of two different splits.
    #[error(
        "{first} {what_first} and {second} {what_second}: merge takes the reports of one fleet run"
    )]
    OtherFleet {
        first: String,
        what_first: String,
        second: String,
        what_second: String,
    },
    /// One run given twice (under one name or two): its counts would be added twice.
    #[error("{first} and {second} are the same run (run id {id}): merging would count it twice")]
    SameRun {
        first: String,
        second: String,
        id: String,
    },
}

impl MergeError {
    /// The index (from 0) of the report an error of [`merge_reports`] is about, so that the
    /// caller can name the file it was read from.
    pub fn report(&self) -> Option<usize> {
        match self {
            MergeError::Histogram { report, .. }
            | MergeError::Overflow { report, .. }
            | MergeError::Series { report, .. }
            | MergeError::BadRate { report, .. } => report.checked_sub(1),
            _ => None,
        }
    }
}

/// The runs inside a report: its own id, or the ids it was merged from.
fn run_ids(r: &LoadReport) -> Vec<&str> {
    if r.merged_run_ids.is_empty() {
        (!r.run_id.is_empty())
            .then_some(r.run_id.as_str())
            .into_iter()
            .collect()
    } else {
        r.merged_run_ids.iter().map(String::as_str).collect()
    }
}

/// Checks reports, each with the name it was read from, before they are merged: one run given
/// twice is refused ([`MergeError::SameRun`]); runs that did not overlap in time are merged,
/// but each such pair gets a warning saying by how much they missed each other, since the
/// merged rates are over a window that neither run filled. Returns the warnings.
pub fn check_runs(named: &[(String, LoadReport)]) -> Result<Vec<String>, MergeError> {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, r) in named {
        for id in run_ids(r) {
            if let Some(first) = seen.insert(id, name) {
                return Err(MergeError::SameRun {
                    first: first.to_string(),
                    second: name.clone(),
                    id: id.to_string(),
                });
            }
        }
    }
    check_shards(named)?;
    let mut warnings = Vec::new();
    for (name, r) in named {
        warnings.extend(interval_warning(name, r));
    }
    let windows: Vec<(&str, u64, u64)> = named
        .iter()
        .filter(|(_, r)| r.start_unix_ns > 0 && r.end_unix_ns > r.start_unix_ns)
        .map(|(n, r)| (n.as_str(), r.start_unix_ns, r.end_unix_ns))
        .collect();
    for (i, a) in windows.iter().enumerate() {
        for b in &windows[i + 1..] {
            let (early, late) = if a.1 <= b.1 { (a, b) } else { (b, a) };
            if late.1 >= early.2 {
                warnings.push(format!(
                    "{} and {} did not overlap in time: {} began {:.1} s after {} ended; the merged rates are over a window neither run filled",
                    a.0,
                    b.0,
                    late.0,
                    (late.1 - early.2) as f64 / 1e9,
                    early.0
                ));
            }
        }
    }
    Ok(warnings)
}

/// The fleet run id of a report (empty without `fleet`).
fn fleet_id(r: &LoadReport) -> &str {
    r.fleet.as_ref().map_or("", |f| f.run_id.as_str())
}

/// Reports of one fleet run only, one report per shard, shards of one split.
fn check_shards(named: &[(String, LoadReport)]) -> Result<(), MergeError> {
    let fleet: Vec<(&str, &str)> = named
        .iter()
        .filter(|(_, r)| r.fleet.is_some())
        .map(|(n, r)| (n.as_str(), fleet_id(r)))
        .collect();
    if let Some((a, b)) = fleet
        .iter()
        .zip(fleet.iter().skip(1))
        .find(|(a, b)| a.1 != b.1)
    {
        return Err(MergeError::OtherFleet {
            first: a.0.to_string(),
            what_first: format!("is of fleet run {}", a.1),
            second: b.0.to_string(),
            what_second: format!("of fleet run {}", b.1),
        });
    }
    let shards: Vec<(&str, &LoadReport, Shard)> = named
        .iter()
        .filter_map(|(n, r)| r.shard.map(|k| (n.as_str(), r, k)))
        .collect();
    if let Some((a, b)) = shards
        .iter()
        .zip(shards.iter().skip(1))
        .find(|(a, b)| a.2.count != b.2.count)
    {
        return Err(MergeError::OtherFleet {
            first: a.0.to_string(),
            what_first: format!("is shard {}", a.2),
            second: b.0.to_string(),
            what_second: format!("shard {}", b.2),
        });
    }
    if let Some((name, _, k)) = shards
        .iter()
        .find(|(_, _, k)| k.index == 0 || k.index > k.count || k.count > MAX_SHARDS)
    {
        return Err(MergeError::OtherFleet {
            first: name.to_string(),
            what_first: format!("says shard {}", k),
            second: "that".into(),
            what_second: format!(
                "is not a shard K/N with K from 1 to N and N at most {MAX_SHARDS}"
            ),
        });
    }
    let mut seen: BTreeMap<u32, &str> = BTreeMap::new();
    for (name, r, k) in &shards {
        if let Some(first) = seen.insert(k.index, name) {
            let id = fleet_id(r);
            return Err(MergeError::SameShard {
                first: first.to_string(),
                second: name.to_string(),
                shard: k.to_string(),
                of: if id.is_empty() {
                    String::new()
                } else {
                    format!(" of fleet run {id}")
                },
            });
        }
    }
    Ok(())
}

/// A report whose intervals do not add up to its whole (an older tcpkit wrote none, or the
/// file was edited): its counts are in the whole but the series misses them; said, not fatal.
fn interval_warning(name: &str, r: &LoadReport) -> Option<String> {
    if r.intervals.is_empty() {
        return (r.queries.sent > 0).then(|| {
            format!("{name} has no intervals (written by an older tcpkit): its queries are in the totals but not in the per-second series")
        });
    }
    let (t, h) = total(&r.intervals).ok()?;
    let whole = Histogram::from_base64(&r.histograms.intended).ok()?;
    (t.answered != r.queries.answered || t.sent != r.queries.sent || h.count() != whole.count())
        .then(|| {
            format!(
                "{name}: its intervals add up to {} sent, {} answered, {} latencies, its totals say {} sent, {} answered, {} latencies: the series and the totals disagree",
                t.sent,
                t.answered,
                h.count(),
                r.queries.sent,
                r.queries.answered,
                whole.count()
            )
        })
}

/// The largest report file read: real ones are a few KiB (two histograms and counts).
pub const MAX_REPORT: u64 = 64 << 20;

/// Fields `merge` sums or keeps that serde would quietly default when absent (an `Option`
/// reads as `None`): present in every report `load --json` writes, if only as `null`.
const REQUIRED: &[(&str, &str, &str)] = &[
    ("per_query", "", "per_query"),
    ("failure", "", "failure"),
    ("rates", "asked_qps", "rates.asked_qps"),
];

/// A field only one other command's `--json` report has (docs/schema/), and that command: a
/// load report has none of them.
const OTHER_REPORTS: &[(&str, &str)] = &[
    ("loops_completed", "replay"),
    ("copies_per_session", "copy"),
    ("copies_connected", "intercept"),
    ("chunk_size", "mpcat"),
    ("fd_limit", "echo"),
    ("procs_needed", "tune"),
    ("getpeername_vip", "balance"),
];

/// Which other tcpkit command wrote the document `v`, if one did.
fn other_kind(v: &serde_json::Value) -> Option<&'static str> {
    OTHER_REPORTS
        .iter()
        .find(|(field, _)| v.get(field).is_some())
        .map(|&(_, kind)| kind)
}

pub use tcpkit_stats::escape_controls;

/// Every string of a read report with its control characters escaped ([`escape_controls`]).
fn escape_report(r: &mut LoadReport) {
    let e = |s: &mut String| *s = escape_controls(s);
    e(&mut r.target);
    e(&mut r.payload);
    e(&mut r.run_id);
    r.merged_run_ids.iter_mut().for_each(e);
    r.hints.iter_mut().for_each(e);
    if let Some(f) = &mut r.failure {
        e(f);
    }
    if let Some(p) = &mut r.per_query {
        e(&mut p.path);
    }
    if let Some(f) = &mut r.fleet {
        e(&mut f.run_id);
        e(&mut f.controller);
        e(&mut f.host);
        if let Some(w) = &mut f.stopped_by {
            e(w);
        }
    }
    if let Some(f) = &mut r.merged_fleet {
        e(&mut f.run_id);
        for a in &mut f.agents {
            e(&mut a.report);
            e(&mut a.host);
            if let Some(w) = &mut a.stopped_by {
                e(w);
            }
        }
    }
    for m in [&mut r.codes, &mut r.errors] {
        if m.keys().any(|k| k.chars().any(char::is_control)) {
            *m = std::mem::take(m)
                .into_iter()
                .map(|(k, v)| (escape_controls(&k), v))
                .collect();
        }
    }
}

/// Reads one report file: at most [`MAX_REPORT`] bytes, the fields merge sums required, its
/// strings' control characters escaped.
pub fn read_report(path: &Path) -> Result<LoadReport, MergeError> {
    let p = path.display().to_string();
    let text = read_bytes(path)?;
    report_from_slice(&p, &text)
}

/// A report file's bytes, at most [`MAX_REPORT`] of them (any kind of report: `merge` reads
/// them once and looks at what they hold).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, MergeError> {
    let p = path.display().to_string();
    tcpkit_stats::read_capped(path, MAX_REPORT).map_err(|e| match e {
        tcpkit_stats::ReadCapped::Io(e) => MergeError::Read { path: p, source: e },
        tcpkit_stats::ReadCapped::TooBig => MergeError::TooBig { path: p },
    })
}

/// [`read_report`] of bytes already read (`path` names them in errors); the body of the
/// `merge_report` fuzz target.
pub fn report_from_slice(p: &str, text: &[u8]) -> Result<LoadReport, MergeError> {
    let parse = |e| MergeError::Parse {
        path: p.to_string(),
        source: e,
    };
    let v: serde_json::Value = serde_json::from_slice(text).map_err(parse)?;
    if let Some(kind) = other_kind(&v) {
        return Err(MergeError::OtherReport {
            path: p.to_string(),
            kind,
        });
    }
    if let Some(found) = v.get("schema_version").and_then(|x| x.as_u64()) {
        if found != u64::from(LOAD_SCHEMA_VERSION) {
            return Err(MergeError::Version {
                path: p.to_string(),
                found: u32::try_from(found).unwrap_or(u32::MAX),
            });
        }
    }
    if v.is_object() {
        for &(outer, inner, field) in REQUIRED {
            let o = v.get(outer);
            let present = if inner.is_empty() {
                o.is_some()
            } else {
                o.and_then(|o| o.get(inner)).is_some()
            };
            if !present {
                return Err(MergeError::Missing {
                    path: p.to_string(),
                    field,
                });
            }
        }
    }
    let mut r: LoadReport = serde_json::from_value(v).map_err(parse)?;
    if r.schema_version != LOAD_SCHEMA_VERSION {
        return Err(MergeError::Version {
            path: p.to_string(),
            found: r.schema_version,
        });
    }
    escape_report(&mut r);
    Ok(r)
}

/// Merges reports into one. The failure of any run is kept (joined), so a merged report of
/// runs that fell short says so.
pub fn merge_reports(reports: &[LoadReport]) -> Result<LoadReport, MergeError> {
    let first = reports.first().ok_or(MergeError::Empty)?;
    let mut hi = Histogram::new();
    let mut hs = Histogram::new();
    let mut m = LoadReport {
        schema_version: LOAD_SCHEMA_VERSION,
        target: first.target.clone(),
        payload: first.payload.clone(),
        ..LoadReport::default()
    };
    let mut start = u64::MAX;
    let mut end = 0u64;
    let mut asked: Option<f64> = None;
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures: Vec<String> = Vec::new();
    m.merged_run_ids = reports
        .iter()
        .flat_map(run_ids)
        .map(str::to_string)
        .collect();
    if !m.merged_run_ids.is_empty() {
        // A merged report is a run of its own to a later merge, made of these.
        m.run_id = crate::run_id::new_run_id();
    }
    // Every sum is checked: reports are files anyone can write, and a wrapped count
    // (`18446744073709551614 sent`) would be printed as if measured.
    let mut hints_seen: HashSet<String> = HashSet::new();
    for (i, r) in reports.iter().enumerate() {
        let add = |have: &mut u64, add: u64, field: &str| -> Result<(), MergeError> {
            *have = have.checked_add(add).ok_or_else(|| MergeError::Overflow {
                report: i + 1,
                field: field.to_string(),
                have: *have,
                add,
            })?;
            Ok(())
        };
        let add32 = |have: &mut u32, a: u32, field: &str| -> Result<(), MergeError> {
            let mut h = u64::from(*have);
            add(&mut h, u64::from(a), field)?;
            *have = u32::try_from(h).map_err(|_| MergeError::Overflow {
                report: i + 1,
                field: field.to_string(),
                have: u64::from(*have),
                add: u64::from(a),
            })?;
            Ok(())
        };
        let decode = |text: &str, which: &str| {
            Histogram::from_base64(text).map_err(|e| MergeError::Histogram {
                report: i + 1,
                what: format!("report {} ({}): {which} histogram", i + 1, r.target),
                source: e,
            })
        };
        hi.merge(&decode(&r.histograms.intended, "intended")?);
        hs.merge(&decode(&r.histograms.sent, "sent")?);
        if r.target != m.target && !m.target.contains(&r.target) {
            m.target = format!("{}, {}", m.target, r.target);
        }
        add32(&mut m.runs, r.runs.max(1), "runs")?;
        add32(&mut m.processes, r.processes, "processes")?;
        add32(&mut m.threads, r.threads, "threads")?;
        // The window on the controller's clock, as the intervals are.
        let off = offset(r);
        if r.seconds > 0.0 {
            start = start.min(on_controller(r.start_unix_ns, off));
            end = end.max(on_controller(r.end_unix_ns, off));
        }
        m.connect_seconds = m.connect_seconds.max(r.connect_seconds);
        let (c, rc) = (&mut m.connections, &r.connections);
        add(&mut c.asked, rc.asked, "connections.asked")?;
        add(&mut c.peak_open, rc.peak_open, "connections.peak_open")?;
        add(
            &mut c.open_at_end,
            rc.open_at_end,
            "connections.open_at_end",
        )?;
        add(&mut c.attempts, rc.attempts, "connections.attempts")?;
        add(
            &mut c.established,
            rc.established,
            "connections.established",
        )?;
        add(&mut c.failed, rc.failed, "connections.failed")?;
        add(&mut c.timeouts, rc.timeouts, "connections.timeouts")?;
        add(&mut c.retries, rc.retries, "connections.retries")?;
        add(
            &mut c.closed_by_server,
            rc.closed_by_server,
            "connections.closed_by_server",
        )?;
        add(&mut c.reconnects, rc.reconnects, "connections.reconnects")?;
        add(&mut c.slow, rc.slow, "connections.slow")?;
        c.reachable_max = c.reachable_max.max(rc.reachable_max);
        let (q, rq) = (&mut m.queries, &r.queries);
        add(&mut q.scheduled, rq.scheduled, "queries.scheduled")?;
        add(&mut q.sent, rq.sent, "queries.sent")?;
        add(&mut q.answered, rq.answered, "queries.answered")?;
        add(&mut q.echoed, rq.echoed, "queries.echoed")?;
        add(&mut q.timeouts, rq.timeouts, "queries.timeouts")?;
        add(&mut q.lost, rq.lost, "queries.lost")?;
        add(
            &mut q.unanswered_at_end,
            rq.unanswered_at_end,
            "queries.unanswered_at_end",
        )?;
        add(&mut q.malformed, rq.malformed, "queries.malformed")?;
        add(&mut q.unmatched, rq.unmatched, "queries.unmatched")?;
        add(&mut q.bytes_sent, rq.bytes_sent, "queries.bytes_sent")?;
        add(
            &mut q.bytes_received,
            rq.bytes_received,
            "queries.bytes_received",
        )?;
        // Runs at the same time: the asked rates add up.
        if let Some(a) = r.rates.asked_qps {
            let sum = asked.unwrap_or(0.0) + a;
            if !(a >= 0.0 && sum.is_finite()) {
                return Err(MergeError::BadRate {
                    report: i + 1,
                    value: a,
                });
            }
            asked = Some(sum);
        }
        add(&mut m.lag.behind, r.lag.behind, "lag.behind")?;
        m.lag.max_ns = m.lag.max_ns.max(r.lag.max_ns);
        m.lag.end_ns = m.lag.end_ns.max(r.lag.end_ns);
        for (k, v) in &r.codes {
            add(
                codes.entry(k.clone()).or_insert(0),
                *v,
                &format!("codes.{k}"),
            )?;
        }
        for (k, v) in &r.errors {
            add(
                errors.entry(k.clone()).or_insert(0),
                *v,
                &format!("errors.{k}"),
            )?;
        }
        // A set beside the list: first-seen order kept, linear in the hints however many.
        for h in &r.hints {
            if hints_seen.insert(h.clone()) {
                m.hints.push(h.clone());
            }
        }
        if let Some(f) = &r.failure {
            failures.push(f.clone());
        }
        if let Some(p) = &r.per_query {
            let mp = m.per_query.get_or_insert_with(Default::default);
            if mp.path.is_empty() {
                mp.path = p.path.clone();
            } else {
                mp.path.push_str(", ");
                mp.path.push_str(&p.path);
            }
            add(&mut mp.lines, p.lines, "per_query.lines")?;
            add(&mut mp.dropped, p.dropped, "per_query.dropped")?;
        }
    }
    if start < end {
        m.start_unix_ns = start;
        m.end_unix_ns = end;
        m.seconds = (end - start) as f64 / 1e9;
    }
    let per_sec = |n: u64| {
        if m.seconds > 0.0 {
            n as f64 / m.seconds
        } else {
            0.0
        }
    };
    m.rates.asked_qps = asked;
    m.rates.sent_qps = per_sec(m.queries.sent);
    m.rates.answered_qps = per_sec(m.queries.answered);
    m.codes = codes;
    m.errors = errors;
    m.latency = hi.percentiles();
    m.latency_sent = hs.percentiles();
    m.histograms.intended = hi.to_base64();
    m.histograms.sent = hs.to_base64();
    if !failures.is_empty() {
        m.failure = Some(failures.join("; "));
    }
    let tls: Vec<_> = reports.iter().filter_map(|r| r.tls.as_ref()).collect();
    if !tls.is_empty() {
        m.tls = Some(TlsStats::merge(&tls).map_err(|e| MergeError::Histogram {
            report: 0,
            what: "a tls handshake histogram".into(),
            source: e,
        })?);
    }
    let runs: Vec<(&[IntervalRec], i64)> = reports
        .iter()
        .map(|r| (r.intervals.as_slice(), offset(r)))
        .collect();
    let (intervals, series) = lay_out(&runs).map_err(|e| MergeError::Series {
        report: match e {
            LayoutError::Hist { run, .. } | LayoutError::Overflow { run, .. } => run + 1,
            LayoutError::Span { .. } => 0,
        },
        source: e,
    })?;
    if !intervals.is_empty() {
        m.intervals = intervals;
        m.series = Some(series);
    }
    Ok(m)
}

/// A report's clock minus the controller's (0 without `fleet`).
fn offset(r: &LoadReport) -> i64 {
    r.fleet.as_ref().map_or(0, |f| f.clock_offset_ns)
}

/// `t` of a clock `off` ahead of the controller's, on the controller's.
fn on_controller(t: u64, off: i64) -> u64 {
    u64::try_from((i128::from(t) - i128::from(off)).max(0)).unwrap_or(u64::MAX)
}

/// `merge`'s whole job on reports read from files (each with its name): [`merge_reports`],
/// then the fleet run they make (its agents, shards with no report, agents the barrier
/// stopped: each a reason the merged run failed) and `limits` judged on the whole. The
/// failures are joined on the one last line, the broken limits last.
pub fn merge_run(
    named: &[(String, LoadReport)],
    limits: &Limits,
) -> Result<LoadReport, MergeError> {
    let reports: Vec<LoadReport> = named.iter().map(|(_, r)| r.clone()).collect();
    let mut m = merge_reports(&reports)?;
    let fleet = merged_fleet(named);
    if let Some(f) = &fleet {
        let mut why: Vec<String> = m.failure.take().into_iter().collect();
        let n = f.shards.unwrap_or_default();
        why.extend(
            f.missing_shards
                .iter()
                .map(|k| format!("shard {k}/{n}: no report")),
        );
        for a in &f.agents {
            if let Some(w) = &a.stopped_by {
                let who = a.shard.map_or(a.report.clone(), |k| format!("shard {k}"));
                let on = if a.host.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", a.host)
                };
                why.push(format!("{who}{on} was stopped by the barrier: {w}"));
            }
        }
        if !why.is_empty() {
            m.failure = Some(why.join("; "));
        }
    }
    m.merged_fleet = fleet;
    m.judge_limits(limits);
    Ok(m)
}

/// The fleet the reports make, when any has a `shard` or a `fleet`.
fn merged_fleet(named: &[(String, LoadReport)]) -> Option<MergedFleet> {
    if !named
        .iter()
        .any(|(_, r)| r.shard.is_some() || r.fleet.is_some())
    {
        return None;
    }
    let shards = named.iter().find_map(|(_, r)| r.shard.map(|k| k.count));
    let agents: Vec<Agent> = named
        .iter()
        .map(|(name, r)| {
            let f = r.fleet.clone().unwrap_or_default();
            Agent {
                report: escape_controls(name),
                shard: r.shard,
                actual_start_unix_ns: if r.fleet.is_some() {
                    on_controller(f.actual_start_unix_ns, f.clock_offset_ns)
                } else {
                    0
                },
                host: f.host,
                clock_offset_ns: f.clock_offset_ns,
                offset_rtt_ns: f.offset_rtt_ns,
                answered: r.queries.answered,
                stopped_by: f.stopped_by,
            }
        })
        .collect();
    let missing_shards = shards.map_or(Vec::new(), |n| {
        (1..=n.min(MAX_SHARDS))
            .filter(|k| {
                !named
                    .iter()
                    .any(|(_, r)| r.shard.is_some_and(|s| s.index == *k))
            })
            .collect()
    });
    let starts: Vec<u64> = named
        .iter()
        .filter_map(|(_, r)| {
            r.fleet
                .as_ref()
                .map(|f| on_controller(f.actual_start_unix_ns, f.clock_offset_ns))
        })
        .collect();
    let spread = match (starts.iter().min(), starts.iter().max()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    Some(MergedFleet {
        run_id: named
            .iter()
            .find_map(|(_, r)| r.fleet.as_ref().map(|f| f.run_id.clone()))
            .unwrap_or_default(),
        shards,
        agents,
        missing_shards,
        start_spread_ns: spread,
    })
}

/// The merged run's seconds as the plot's samples (the same picture `load --plot` draws of
/// one run): each merged interval's percentiles from its histogram, from the series' start.
pub fn samples(
    m: &LoadReport,
) -> Result<Vec<tcpkit_stats::plot::Sample>, tcpkit_stats::HistDecodeError> {
    let t0 = m.series.as_ref().map_or(0, |s| s.start_unix_ns);
    m.intervals
        .iter()
        .map(|iv| {
            let h = Histogram::from_base64(&iv.hist)?;
            Ok(tcpkit_stats::plot::Sample::of(
                iv.start_unix_ns.saturating_sub(t0) as f64 / 1e9,
                iv.seconds as f64,
                &h,
            ))
        })
        .collect()
}

/// Most shards a fleet run's missing ones are listed for: a report saying `1/4294967295`
/// must not make a list of four billion.
pub const MAX_SHARDS: u32 = 65_536;

/// Body of the `merge_report` fuzz target (and of the stable test over its seed corpus): any
/// bytes as a report file, then merged with itself as a second run and printed, must give a
/// report or an error, never a panic, a wrapped count or an allocation the bytes do not
/// warrant.
pub fn fuzz_merge_report(data: &[u8]) {
    let Ok(r) = report_from_slice("fuzz.json", data) else {
        return;
    };
    let mut twin = r.clone();
    twin.run_id = "twin".into();
    twin.merged_run_ids.clear();
    let named = [
        ("a".to_string(), r.clone()),
        ("b".to_string(), twin.clone()),
    ];
    let _ = check_runs(&named);
    // As shards of one fleet run with every limit given: the fleet, the series and the
    // verdict are built from what the file says, whatever it says.
    twin.shard = Some(Shard {
        index: r.shard.map_or(2, |k| k.index.wrapping_add(1)),
        count: r.shard.map_or(3, |k| k.count),
    });
    if let (Some(f), None) = (&r.fleet, &twin.fleet) {
        twin.fleet = Some(f.clone());
    }
    let named = [("a".to_string(), r), ("b".to_string(), twin)];
    if check_runs(&named).is_err() {
        return;
    }
    let limits = Limits {
        max_p99_ns: Some(1_000_000),
        max_p999_ns: Some(2_000_000),
        min_answered_qps: Some(1.0),
        max_loss_percent: Some(1.0),
        max_errors: Some(0),
    };
    if let Ok(m) = merge_run(&named, &limits) {
        let text = tcpkit_stats::Report::human(&m);
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'));
        assert!(m.verdict.is_some());
        if let Some(s) = &m.series {
            assert!(s.rows.len() as u64 <= crate::series::MAX_ROWS);
        }
        let _ = tcpkit_stats::Report::json(&m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start_s: u64, secs: u64, values: &[u64], sent: u64) -> LoadReport {
        let mut h = Histogram::new();
        for &v in values {
            h.record(v);
        }
        LoadReport {
            schema_version: LOAD_SCHEMA_VERSION,
            target: "198.18.0.2:4242".into(),
            runs: 1,
            processes: 1,
            threads: 1,
            start_unix_ns: start_s * 1_000_000_000,
            end_unix_ns: (start_s + secs) * 1_000_000_000,
            seconds: secs as f64,
            queries: crate::report::QueryStats {
                sent,
                answered: values.len() as u64,
                ..Default::default()
            },
            rates: crate::report::Rates {
                asked_qps: Some(sent as f64 / secs as f64),
                ..Default::default()
            },
            codes: [("ok".to_string(), values.len() as u64)]
                .into_iter()
                .collect(),
            latency: h.percentiles(),
            histograms: crate::report::Histograms {
                intended: h.to_base64(),
                sent: h.to_base64(),
            },
            // Everything in its first second: the intervals add up to the totals.
            intervals: vec![crate::series::Tally {
                asked: sent,
                sent,
                answered: values.len() as u64,
                errors: 0,
                timeouts: 0,
            }
            .rec(start_s * 1_000_000_000, 1, h.to_base64())],
            ..Default::default()
        }
    }

    #[test]
    fn counts_add_histograms_merge_rates_use_the_union_window() {
        // Host A 100..110 s, host B 105..115 s: the union is 15 s.
        let a = run(100, 10, &[1_000; 90], 100);
        let b = run(105, 10, &[1_000_000; 10], 50);
        let m = merge_reports(&[a, b]).unwrap();
        assert_eq!(m.runs, 2);
        assert_eq!(m.queries.sent, 150);
        assert_eq!(m.queries.answered, 100);
        assert_eq!(m.codes["ok"], 100);
        assert_eq!(m.seconds, 15.0);
        assert_eq!(m.rates.sent_qps, 10.0);
        assert_eq!(m.rates.asked_qps, Some(15.0));
        // 90 values at 1 µs and 10 at 1 ms: p50 is 1 µs, p99 is 1 ms.
        assert!(m.latency.p50_ns.abs_diff(1_000) <= 1, "{:?}", m.latency);
        assert!(
            m.latency.p99_ns.abs_diff(1_000_000) <= 1_000,
            "{:?}",
            m.latency
        );
        assert_eq!(m.latency.count, 100);
    }

    /// Issue 10, case 11: one run twice is refused, naming both; runs that missed each other
    /// are merged with a warning saying by how much.
    #[test]
    fn the_same_run_twice_is_refused_and_gaps_are_warned() {
        let mut a = run(100, 10, &[1_000], 10);
        a.run_id = "aa".into();
        let mut b = run(112, 10, &[1_000], 10);
        b.run_id = "bb".into();
        let named = |rs: &[(&str, &LoadReport)]| {
            rs.iter()
                .map(|(n, r)| (n.to_string(), (*r).clone()))
                .collect::<Vec<_>>()
        };
        let e = check_runs(&named(&[("a.json", &a), ("copy.json", &a)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.json and copy.json are the same run (run id aa): merging would count it twice"
        );
        let w = check_runs(&named(&[("b.json", &b), ("a.json", &a)])).unwrap();
        assert_eq!(
            w,
            ["b.json and a.json did not overlap in time: b.json began 2.0 s after a.json ended; the merged rates are over a window neither run filled"]
        );
        // Overlapping runs: nothing to say.
        let mut c = run(105, 10, &[1_000], 10);
        c.run_id = "cc".into();
        assert!(check_runs(&named(&[("a.json", &a), ("c.json", &c)]))
            .unwrap()
            .is_empty());
        // A merged report carries what it was made of: with one of its parts, refused.
        let m = merge_reports(&[a.clone(), c.clone()]).unwrap();
        assert_eq!(m.merged_run_ids, ["aa", "cc"]);
        assert_eq!(m.run_id.len(), 32);
        let e = check_runs(&named(&[("m.json", &m), ("c.json", &c)])).unwrap_err();
        assert!(
            matches!(e, MergeError::SameRun { ref id, .. } if id == "cc"),
            "{e}"
        );
    }

    #[test]
    fn failures_are_kept_and_bad_histograms_named() {
        let mut a = run(0, 1, &[5], 1);
        a.failure = Some("no answers".into());
        let m = merge_reports(&[a.clone(), run(0, 1, &[5], 1)]).unwrap();
        assert_eq!(m.failure.as_deref(), Some("no answers"));
        a.histograms.sent = "%%%".into();
        let e = merge_reports(&[a]).unwrap_err();
        assert!(e.to_string().contains("report 1"), "{e}");
        assert!(matches!(merge_reports(&[]), Err(MergeError::Empty)));
    }
    /// Issue 11: the fields merge sums are required; a report that lacks one is refused with
    /// one line naming the file and the field (serde alone would read it as absent).
    #[test]
    fn missing_summed_fields_are_refused_naming_file_and_field() {
        let good = serde_json::to_value(run(0, 1, &[5], 1)).unwrap();
        assert!(report_from_slice("g.json", good.to_string().as_bytes()).is_ok());
        for (outer, inner, field) in REQUIRED {
            let mut v = good.clone();
            if inner.is_empty() {
                v.as_object_mut().unwrap().remove(*outer);
            } else {
                v[*outer].as_object_mut().unwrap().remove(*inner);
            }
            let e = report_from_slice("r.json", v.to_string().as_bytes()).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("r.json: no `{field}` field: not a complete tcpkit load --json report")
            );
        }
    }

    /// Issue 11: `18446744073709551614 sent` came from two wrapped sums; every sum is checked
    /// and an overflow names the field.
    #[test]
    fn an_overflowing_sum_is_an_error_naming_the_field() {
        let mut a = run(0, 1, &[5], u64::MAX - 1);
        let b = run(0, 1, &[5], 3);
        let e = merge_reports(&[a.clone(), b.clone()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "report 2: queries.sent: the sum overflows (18446744073709551614 + 3)"
        );
        a.queries.sent = 1;
        a.codes.insert("NOERROR".into(), u64::MAX);
        let mut b2 = b.clone();
        b2.codes.insert("NOERROR".into(), 1);
        let e = merge_reports(&[a.clone(), b2]).unwrap_err();
        assert!(
            e.to_string().contains("codes.NOERROR: the sum overflows"),
            "{e}"
        );
        a.codes.clear();
        a.runs = u32::MAX;
        let e = merge_reports(&[a.clone(), b.clone()]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("report 2: runs: the sum overflows"),
            "{e}"
        );
        a.runs = 1;
        a.rates.asked_qps = Some(f64::MAX);
        let mut b3 = b;
        b3.rates.asked_qps = Some(f64::MAX);
        let e = merge_reports(&[a, b3]).unwrap_err();
        assert!(e.to_string().contains("asked_qps"), "{e}");
    }

    /// Issue 11: escape sequences, title changes and NUL in a report's strings are written
    /// out, never passed to the terminal.
    #[test]
    fn control_characters_in_report_strings_are_escaped() {
        let mut r = run(0, 1, &[5], 1);
        r.target = "\u{1b}]0;pwned\u{7}\u{1b}[2J".into();
        r.hints = vec!["a\u{0}b".into()];
        r.failure = Some("x\u{1b}[31m".into());
        r.codes.insert("\u{1b}[1m".into(), 1);
        r.per_query = Some(crate::report::PerQueryStats {
            path: "p\rq".into(),
            ..Default::default()
        });
        let text = serde_json::to_string(&r).unwrap();
        let m = merge_reports(&[report_from_slice("r.json", text.as_bytes()).unwrap()]).unwrap();
        let human = tcpkit_stats::Report::human(&m);
        let all = format!("{human}{}", serde_json::to_string(&m).unwrap());
        assert!(!all.chars().any(|c| c.is_control() && c != '\n'), "{all:?}");
        assert!(m.target.contains("\\u{1b}]0;pwned\\u{7}"), "{}", m.target);
        assert_eq!(m.hints, ["a\\u{0}b"]);
        assert!(m.codes.contains_key("\\u{1b}[1m"));
        assert_eq!(m.per_query.unwrap().path, "p\\u{d}q");
    }

    /// Issue 11: 300,000 distinct hints took over 20 s (a list searched per hint); now linear.
    #[test]
    fn many_distinct_hints_merge_in_linear_time() {
        let mut a = run(0, 1, &[5], 1);
        a.hints = (0..300_000).map(|i| format!("hint {i}")).collect();
        let mut b = a.clone();
        b.hints.push("one more".into());
        // This thread's CPU time, not the wall clock: a busy machine stretched the wall time
        // of the linear merge past 2 s (load average 7.6); the quadratic one spent over 20 s
        // of CPU, which no neighbour changes.
        let cpu = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes into the timespec we own.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
        };
        let t = cpu();
        let m = merge_reports(&[a, b]).unwrap();
        let spent = cpu().saturating_sub(t);
        assert_eq!(m.hints.len(), 300_001);
        assert_eq!(m.hints[0], "hint 0");
        assert!(
            spent < std::time::Duration::from_secs(3),
            "{spent:?} of CPU"
        );
    }

    /// A report file larger than any real one is refused before it is parsed.
    #[test]
    fn an_oversized_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.json");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_REPORT + 1).unwrap();
        let e = read_report(&p).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("big.json: larger than 67108864 bytes, not a load report"),
            "{e}"
        );
    }
    #[test]
    fn fuzz_body_over_seed_corpus() {
        let mut n = 0;
        for seed in tcpkit_lab::corpus::seeds("merge_report") {
            fuzz_merge_report(&seed.bytes);
            // The inputs a campaign grew are many: each is replayed once.
            if seed.grown() {
                continue;
            }
            let data = seed.bytes;
            n += 1;
            // Every cut, and a flip of each byte, of each hand-written seed too.
            for cut in (0..data.len()).step_by(7) {
                fuzz_merge_report(&data[..cut]);
            }
            // A flip of each byte, and a case flip of every third: each input is a whole
            // merge of a fleet run now (series, limits), and the seeds carry intervals.
            let mut m = data.clone();
            for i in 0..m.len() {
                let masks: &[u8] = if i % 3 == 0 { &[0x01, 0x20] } else { &[0x01] };
                for &x in masks {
                    m[i] ^= x;
                    fuzz_merge_report(&m);
                    m[i] ^= x;
                }
            }
        }
        assert!(
            n >= 6,
            "seed corpus has {n} hand-written seeds, expected at least 6"
        );
    }

    #[test]
    #[ignore = "writes the seed corpus; run once by hand"]
    fn write_seeds() {
        let put = |name: &str, r: &LoadReport| {
            let json = serde_json::to_string_pretty(r).unwrap();
            tcpkit_lab::corpus::write("merge_report", name, json.as_bytes());
        };
        let mut a = run(100, 10, &[1_000, 2_000, 1_000_000], 3);
        a.run_id = "aa".into();
        put("good", &a);
        let mut b = a.clone();
        b.queries.sent = u64::MAX - 1;
        put("near-overflow", &b);
        let mut c = a.clone();
        c.target = "\u{1b}]0;t\u{7}\u{0}".into();
        c.hints = vec!["h\u{1b}[2J".into(), "h2".into()];
        c.failure = Some("no answers".into());
        c.per_query = Some(crate::report::PerQueryStats {
            path: "q.log".into(),
            lines: 3,
            dropped: 0,
        });
        put("controls", &c);
        let mut d = a.clone();
        d.merged_run_ids = vec!["x".into(), "y".into()];
        d.rates.asked_qps = None;
        d.errors.insert("EMFILE".into(), 4);
        put("merged", &d);
        let mut e = a.clone();
        e.histograms.sent = String::new();
        e.histograms.intended = "HISFHIU=".into();
        put("bad-histogram", &e);
        // A shard of a fleet run, its clock 5.3 s ahead, stopped by the barrier.
        let mut g = a.clone();
        g.shard = Some(Shard { index: 1, count: 3 });
        g.fleet = Some(crate::report::Fleet {
            run_id: "f00d".into(),
            controller: "10.0.0.1:7000".into(),
            host: "agent-1".into(),
            clock_offset_ns: 5_300_000_000,
            offset_rtt_ns: 200_000,
            intended_start_unix_ns: 105_300_000_000,
            actual_start_unix_ns: 105_300_050_000,
            stopped_by: Some("shard 3/3 on agent-3 went silent".into()),
        });
        put("fleet", &g);
        // A V2 header declaring a 4 GiB payload over 3 bytes.
        let mut f = a.clone();
        f.histograms.sent = "HISTE/////8AAAAAAAAAAwAAAAAAAAABAAAAAAAPQkA/8AAAAAAAAAICAg==".into();
        put("hist-4gib", &f);
    }
}
