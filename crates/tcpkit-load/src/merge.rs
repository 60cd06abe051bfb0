//! `tcpkit merge`: joins `tcpkit load --json` reports of runs made at the same time (from
//! several client hosts, or the worker processes of one run) into one report: counts summed,
//! histograms merged from their serialized form (so percentiles are exact, not averaged),
//! rates over the union of the runs' wall-clock windows.

use std::collections::BTreeMap;
use std::path::Path;

use tcpkit_stats::{Histogram, LoadReport, LOAD_SCHEMA_VERSION};

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
        what: String,
        #[source]
        source: tcpkit_stats::HistDecodeError,
    },
    #[error("nothing to merge")]
    Empty,
    /// One run given twice (under one name or two): its counts would be added twice.
    #[error("{first} and {second} are the same run (run id {id}): merging would count it twice")]
    SameRun {
        first: String,
        second: String,
        id: String,
    },
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
    let mut warnings = Vec::new();
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

/// Reads one report file.
pub fn read_report(path: &Path) -> Result<LoadReport, MergeError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| MergeError::Read {
        path: p.clone(),
        source: e,
    })?;
    let r: LoadReport = serde_json::from_str(&text).map_err(|e| MergeError::Parse {
        path: p.clone(),
        source: e,
    })?;
    if r.schema_version != LOAD_SCHEMA_VERSION {
        return Err(MergeError::Version {
            path: p,
            found: r.schema_version,
        });
    }
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
        m.run_id = crate::load::new_run_id();
    }
    for (i, r) in reports.iter().enumerate() {
        let decode = |text: &str, which: &str| {
            Histogram::from_base64(text).map_err(|e| MergeError::Histogram {
                what: format!("report {} ({}): {which} histogram", i + 1, r.target),
                source: e,
            })
        };
        hi.merge(&decode(&r.histograms.intended, "intended")?);
        hs.merge(&decode(&r.histograms.sent, "sent")?);
        if r.target != m.target && !m.target.contains(&r.target) {
            m.target = format!("{}, {}", m.target, r.target);
        }
        m.runs += r.runs.max(1);
        m.processes += r.processes;
        m.threads += r.threads;
        if r.seconds > 0.0 {
            start = start.min(r.start_unix_ns);
            end = end.max(r.end_unix_ns);
        }
        m.connect_seconds = m.connect_seconds.max(r.connect_seconds);
        let (c, rc) = (&mut m.connections, &r.connections);
        c.asked += rc.asked;
        c.peak_open += rc.peak_open;
        c.open_at_end += rc.open_at_end;
        c.attempts += rc.attempts;
        c.established += rc.established;
        c.failed += rc.failed;
        c.timeouts += rc.timeouts;
        c.retries += rc.retries;
        c.closed_by_server += rc.closed_by_server;
        c.reconnects += rc.reconnects;
        c.slow += rc.slow;
        c.reachable_max = c.reachable_max.max(rc.reachable_max);
        let (q, rq) = (&mut m.queries, &r.queries);
        q.scheduled += rq.scheduled;
        q.sent += rq.sent;
        q.answered += rq.answered;
        q.echoed += rq.echoed;
        q.timeouts += rq.timeouts;
        q.lost += rq.lost;
        q.unanswered_at_end += rq.unanswered_at_end;
        q.malformed += rq.malformed;
        q.unmatched += rq.unmatched;
        q.bytes_sent += rq.bytes_sent;
        q.bytes_received += rq.bytes_received;
        // Runs at the same time: the asked rates add up.
        if let Some(a) = r.rates.asked_qps {
            asked = Some(asked.unwrap_or(0.0) + a);
        }
        m.lag.behind += r.lag.behind;
        m.lag.max_ns = m.lag.max_ns.max(r.lag.max_ns);
        m.lag.end_ns = m.lag.end_ns.max(r.lag.end_ns);
        for (k, v) in &r.codes {
            *codes.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &r.errors {
            *errors.entry(k.clone()).or_insert(0) += v;
        }
        for h in &r.hints {
            if !m.hints.contains(h) {
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
                mp.path = format!("{}, {}", mp.path, p.path);
            }
            mp.lines += p.lines;
            mp.dropped += p.dropped;
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
    Ok(m)
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
            queries: tcpkit_stats::QueryStats {
                sent,
                answered: values.len() as u64,
                ..Default::default()
            },
            rates: tcpkit_stats::Rates {
                asked_qps: Some(sent as f64 / secs as f64),
                ..Default::default()
            },
            codes: [("ok".to_string(), values.len() as u64)]
                .into_iter()
                .collect(),
            latency: h.percentiles(),
            histograms: tcpkit_stats::Histograms {
                intended: h.to_base64(),
                sent: h.to_base64(),
            },
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
}
