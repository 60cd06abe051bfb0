//! `tcpkit merge` of `tcpkit copy --json` reports: several online hosts copying into one
//! target, as tcpcopy's README example copies two and computes the request loss over both.
//! The requests are added and the loss is computed as each copy's own report computes it
//! ([`crate::report::loss_ratio_percent`]: requests at the sources the target never answered,
//! in percent of those at the sources); `--max-loss` and `--max-errors` (failed copies) are
//! judged on the sum.
//!
//! Report files are untrusted: read bounded by the caller, every sum checked, every string
//! escaped before it reaches a terminal.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::report::{loss_ratio_percent, CopyReport, COPY_SCHEMA_VERSION};
use tcpkit_stats::{
    escape_controls, to_json, Limits, LimitsVerdict, Measured, Measures, Report, Verdict,
};

/// Bumped whenever a JSON field changes meaning or disappears
/// (docs/schema/merge-copy.schema.json).
pub const MERGE_COPY_SCHEMA_VERSION: u32 = 1;

/// What limits a copy merge can judge: the loss and the failed copies (a copy report has
/// percentiles, not histograms, so no merged latency; and no wall-clock window for a rate).
pub const MEASURES: Measures = Measures {
    latency: false,
    rate: false,
    loss: true,
    errors: true,
};

/// Copy reports merged. Field names are the `--json` contract.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CopyMergeReport {
    /// [`MERGE_COPY_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `copy`: what was merged.
    pub kind: String,
    /// Each report: the file it was read from, its source, and its own counts.
    pub reports: Vec<CopySource>,
    /// The longest of the copies' run times.
    pub seconds: f64,
    /// The requests of every copy added, and the loss over all of them.
    pub requests: MergedRequests,
    /// Copies made, completed and failed, added.
    pub copies: MergedCopies,
    /// The limits given, each checked; absent without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<LimitsVerdict>,
    /// Why the merged run counts as failed: each copy's own failure, then the broken limits.
    pub failure: Option<String>,
}

/// One merged copy report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CopySource {
    /// The file.
    pub report: String,
    /// Its `source` (`live IFACE`, `file PATH`).
    pub source: String,
    pub at_source: u64,
    pub answered: u64,
    pub loss_ratio_percent: f64,
}

/// Requests over every copy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MergedRequests {
    /// Requests seen at the sources (once per copy).
    pub at_source: u64,
    /// Requests sent to the target.
    pub copied: u64,
    /// Requests the target answered.
    pub answered: u64,
    /// `at_source - answered`: requests the target never answered (never copied included).
    pub lost: u64,
    /// `lost / at_source` in percent (0 when nothing was seen), tcpcopy's request loss ratio.
    pub loss_ratio_percent: f64,
}

/// Copies over every report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MergedCopies {
    pub made: u64,
    pub completed: u64,
    /// Failed, every cause.
    pub failed: u64,
    pub open_at_end: u64,
}

/// Why copy reports could not be merged.
#[derive(Debug, thiserror::Error)]
pub enum CopyMergeError {
    #[error("{path}: not a tcpkit copy --json report")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: copy report schema version {found}, this tcpkit reads {COPY_SCHEMA_VERSION}")]
    Version { path: String, found: u32 },
    #[error("{path}: {field}: the sum overflows")]
    Overflow { path: String, field: &'static str },
    #[error("nothing to merge")]
    Empty,
}

/// A copy report from bytes read from `path` (named in errors), its strings escaped; the
/// body of the copy half of the `merge_report` fuzz target with [`merge_copies`].
pub fn copy_report_from_slice(path: &str, text: &[u8]) -> Result<CopyReport, CopyMergeError> {
    let mut r: CopyReport = serde_json::from_slice(text).map_err(|e| CopyMergeError::Parse {
        path: path.to_string(),
        source: e,
    })?;
    if r.schema_version != COPY_SCHEMA_VERSION {
        return Err(CopyMergeError::Version {
            path: path.to_string(),
            found: r.schema_version,
        });
    }
    for s in [&mut r.mode, &mut r.source, &mut r.filter] {
        *s = escape_controls(s);
    }
    if let Some(f) = &mut r.failure {
        *f = escape_controls(f);
    }
    Ok(r)
}

/// Merges copy reports (each with the file it came from) and judges `limits` on the sum.
pub fn merge_copies(
    named: &[(String, CopyReport)],
    limits: &Limits,
) -> Result<CopyMergeReport, CopyMergeError> {
    if named.is_empty() {
        return Err(CopyMergeError::Empty);
    }
    let mut m = CopyMergeReport {
        schema_version: MERGE_COPY_SCHEMA_VERSION,
        kind: "copy".into(),
        ..CopyMergeReport::default()
    };
    let mut failures = Vec::new();
    for (name, r) in named {
        let add = |have: &mut u64, v: u64, field: &'static str| {
            *have = have
                .checked_add(v)
                .ok_or_else(|| CopyMergeError::Overflow {
                    path: escape_controls(name),
                    field,
                })?;
            Ok::<(), CopyMergeError>(())
        };
        let q = &r.requests;
        add(&mut m.requests.at_source, q.at_source, "requests.at_source")?;
        add(&mut m.requests.copied, q.copied, "requests.copied")?;
        add(&mut m.requests.answered, q.answered, "requests.answered")?;
        let ss = &r.sessions;
        add(&mut m.copies.made, ss.copies, "sessions.copies")?;
        add(&mut m.copies.completed, ss.completed, "sessions.completed")?;
        add(&mut m.copies.failed, r.failed_copies(), "sessions.failed")?;
        add(
            &mut m.copies.open_at_end,
            ss.open_at_end,
            "sessions.open_at_end",
        )?;
        if r.seconds.is_finite() {
            m.seconds = m.seconds.max(r.seconds);
        }
        m.reports.push(CopySource {
            report: escape_controls(name),
            source: r.source.clone(),
            at_source: q.at_source,
            answered: q.answered,
            loss_ratio_percent: loss_ratio_percent(q.at_source, q.answered),
        });
        if let Some(f) = &r.failure {
            failures.push(format!("{}: {f}", escape_controls(name)));
        }
    }
    let q = &mut m.requests;
    q.lost = q.at_source.saturating_sub(q.answered);
    q.loss_ratio_percent = loss_ratio_percent(q.at_source, q.answered);
    if !limits.is_empty() {
        let v = limits.judge(&Measured {
            loss_percent: Some(q.loss_ratio_percent),
            errors: Some(m.copies.failed),
            ..Measured::default()
        });
        failures.extend(v.broken());
        m.verdict = Some(v);
    }
    if !failures.is_empty() {
        m.failure = Some(failures.join("; "));
    }
    Ok(m)
}

impl Report for CopyMergeReport {
    fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Copies merged: {} report{}, the longest {:.3} s",
            self.reports.len(),
            if self.reports.len() == 1 { "" } else { "s" },
            self.seconds
        );
        for r in &self.reports {
            let _ = writeln!(
                s,
                "  {} ({}): {} at source, {} answered, loss {:.3} %",
                r.report, r.source, r.at_source, r.answered, r.loss_ratio_percent
            );
        }
        let q = &self.requests;
        let _ = writeln!(
            s,
            "Requests: {} at source, {} copied, {} answered, {} lost; request loss ratio {:.3} %",
            q.at_source, q.copied, q.answered, q.lost, q.loss_ratio_percent
        );
        let c = &self.copies;
        let _ = writeln!(
            s,
            "Copies: {} made, {} completed, {} failed, {} open at end",
            c.made, c.completed, c.failed, c.open_at_end
        );
        if let Some(v) = &self.verdict {
            for c in &v.checks {
                let _ = writeln!(s, "Limit {}", c.line());
            }
        }
        if let Some(f) = &self.failure {
            let _ = writeln!(s, "Failed: {f}");
        }
        s
    }

    fn json(&self) -> String {
        to_json(self)
    }

    fn verdict(&self) -> Verdict {
        Verdict::from_failure(self.failure.as_deref())
    }
}

/// Body of the copy half of the `merge_report` fuzz target (and of the stable test over its
/// seed corpus): any bytes as a copy report, merged with itself under every limit and
/// printed, give a report or an error, never a panic, a wrapped sum or a control character
/// on the terminal.
pub fn fuzz_merge_copy_report(data: &[u8]) {
    let Ok(r) = copy_report_from_slice("fuzz.json", data) else {
        return;
    };
    let named = [("a".to_string(), r.clone()), ("b\u{1b}[2J".to_string(), r)];
    let limits = Limits {
        max_loss_percent: Some(1.0),
        max_errors: Some(0),
        ..Limits::default()
    };
    if let Ok(m) = merge_copies(&named, &limits) {
        let text = m.human();
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'));
        assert!(m.requests.lost <= m.requests.at_source);
        let _ = m.json();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::RequestStats;

    fn copy(at_source: u64, answered: u64, failed: u64) -> CopyReport {
        let mut r = CopyReport {
            source: "file a.pcap".into(),
            requests: RequestStats {
                at_source,
                copied: at_source,
                answered,
                max_loss_percent: 100.0,
                ..RequestStats::default()
            },
            ..CopyReport::default()
        };
        r.sessions.copies = 10;
        r.sessions.failed.reset = failed;
        r.finish();
        r
    }

    /// tcpcopy's example: two online hosts into one target, the loss over both.
    #[test]
    fn two_hosts_give_one_loss_figure_as_copy_computes_it() {
        let named = [
            ("a.json".to_string(), copy(1000, 990, 1)),
            ("b.json".to_string(), copy(3000, 3000, 0)),
        ];
        let m = merge_copies(&named, &Limits::default()).unwrap();
        let q = &m.requests;
        assert_eq!((q.at_source, q.answered, q.lost), (4000, 3990, 10));
        assert_eq!(q.loss_ratio_percent, loss_ratio_percent(4000, 3990));
        assert_eq!(q.loss_ratio_percent, 0.25);
        assert_eq!(m.copies.failed, 1);
        assert!(m.verdict().is_done() && m.verdict.is_none());
        let limits = Limits {
            max_loss_percent: Some(0.2),
            max_errors: Some(1),
            ..Limits::default()
        };
        let m = merge_copies(&named, &limits).unwrap();
        assert_eq!(
            m.verdict(),
            Verdict::Failed("--max-loss 0.200 % broken: loss 0.250 %, 0.050 % over".into())
        );
        assert_eq!(m.verdict.as_ref().unwrap().checks.len(), 2);
        assert!(m.human().ends_with(
            "Limit --max-errors 1 kept: errors 1\nFailed: --max-loss 0.200 % broken: loss 0.250 %, 0.050 % over\n"
        ));
    }

    #[test]
    fn a_copy_that_failed_is_named_and_sums_are_checked() {
        let mut bad = copy(10, 0, 0);
        assert!(bad.failure.is_some());
        bad.failure = Some("no\u{1b}[31m answers".into());
        let text = serde_json::to_vec(&bad).unwrap();
        let bad = copy_report_from_slice("b.json", &text).unwrap();
        let m = merge_copies(
            &[("a.json".into(), copy(10, 10, 0)), ("b.json".into(), bad)],
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(m.failure.as_deref(), Some("b.json: no\\u{1b}[31m answers"));
        let e = merge_copies(
            &[
                ("a.json".into(), copy(u64::MAX, 0, 0)),
                ("b.json".into(), copy(1, 1, 0)),
            ],
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.json: requests.at_source: the sum overflows"
        );
        let e = copy_report_from_slice("l.json", br#"{"schema_version": 1}"#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("l.json: not a tcpkit copy --json report"),
            "{e}"
        );
    }

    #[test]
    fn fuzz_body_over_seed_corpus() {
        let mut n = 0;
        for seed in tcpkit_lab::corpus::seeds("merge_report") {
            fuzz_merge_copy_report(&seed.bytes);
            if seed.grown() || !seed.name.starts_with("copy") {
                continue;
            }
            n += 1;
            let data = seed.bytes;
            for cut in (0..data.len()).step_by(7) {
                fuzz_merge_copy_report(&data[..cut]);
            }
            let mut m = data.clone();
            for i in 0..m.len() {
                m[i] ^= 0x01;
                fuzz_merge_copy_report(&m);
                m[i] ^= 0x01;
            }
        }
        assert!(n >= 2, "{n} hand-written copy seeds, expected at least 2");
    }

    #[test]
    #[ignore = "writes the seed corpus; run once by hand"]
    fn write_seeds() {
        let put = |name: &str, r: &CopyReport| {
            let json = serde_json::to_string_pretty(r).unwrap();
            tcpkit_lab::corpus::write("merge_report", name, json.as_bytes());
        };
        put("copy-good", &copy(2000, 1999, 1));
        let mut big = copy(u64::MAX - 1, u64::MAX, 0);
        big.source = "live \u{1b}]0;x\u{7}".into();
        put("copy-near-overflow", &big);
    }
}
