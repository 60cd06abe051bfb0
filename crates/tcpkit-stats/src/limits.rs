//! Pass/fail limits on a whole run (`--max-p99`, `--max-p999`, `--min-answered-rate`,
//! `--max-loss`, `--max-errors`), defined once for every command that takes them: `load` judges
//! its own run, `merge` the merged run of a fleet (k6 judges thresholds per runner; a fleet's
//! p99 is only known once the runners' histograms are merged, so the limits are judged there).
//!
//! A job says what its report measured ([`Measured`]); [`Limits::judge`] checks every limit
//! given and returns a [`LimitsVerdict`] that the report carries in its JSON (`verdict`) and
//! whose broken limits make the last line of a run that exits 1.

use serde::{Deserialize, Serialize};

use crate::hist::fmt_ns;

/// The limits asked for; `None` is a limit not given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// `--max-p99`: the 99th percentile of the latency from the intended send time, ns.
    pub max_p99_ns: Option<u64>,
    /// `--max-p999`: the 99.9th percentile, ns.
    pub max_p999_ns: Option<u64>,
    /// `--min-answered-rate`: answers per second over the run's window.
    pub min_answered_qps: Option<f64>,
    /// `--max-loss`: percent of the requests sent that were never answered.
    pub max_loss_percent: Option<f64>,
    /// `--max-errors`: failed socket calls, protocol errors and failed copies, counted.
    pub max_errors: Option<u64>,
}

/// What a report measured, for the limits to be judged on. `None`: a report of this kind does
/// not measure it (a copy report has no latency histogram), so a limit on it is refused before
/// anything runs ([`Limits::unmeasurable`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    /// The 99th percentile latency, ns.
    pub p99_ns: Option<u64>,
    /// The 99.9th percentile latency, ns.
    pub p999_ns: Option<u64>,
    /// Answers per second.
    pub answered_qps: Option<f64>,
    /// Percent of the requests sent that were not answered.
    pub loss_percent: Option<f64>,
    /// Errors counted.
    pub errors: Option<u64>,
}

/// What each measure a limit reads is, for a `Measured` with it missing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measures {
    /// Latency percentiles (`--max-p99`, `--max-p999`).
    pub latency: bool,
    /// The answered rate.
    pub rate: bool,
    /// The loss.
    pub loss: bool,
    /// The errors.
    pub errors: bool,
}

/// One limit checked: the `--json` report's `verdict.checks[]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LimitCheck {
    /// The flag: `--max-p99`, `--max-p999`, `--min-answered-rate`, `--max-loss`, `--max-errors`.
    pub flag: String,
    /// The limit given, in `unit`.
    pub limit: f64,
    /// What the run measured, in `unit`.
    pub measured: f64,
    /// `ns`, `q/s`, `%` or `count`.
    pub unit: String,
    /// True when the measured value is within the limit.
    pub passed: bool,
}

/// Every limit given, checked: the `--json` report's `verdict`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LimitsVerdict {
    /// True when every limit held.
    pub passed: bool,
    /// One per limit given, in the order of the flags in `--help`.
    pub checks: Vec<LimitCheck>,
}

impl Limits {
    /// True when no limit was given.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The flags given whose measure a report of this kind does not have, so that the command
    /// is refused as a usage error instead of a limit silently passing.
    pub fn unmeasurable(&self, has: Measures) -> Vec<&'static str> {
        [
            (self.max_p99_ns.is_some() && !has.latency, "--max-p99"),
            (self.max_p999_ns.is_some() && !has.latency, "--max-p999"),
            (
                self.min_answered_qps.is_some() && !has.rate,
                "--min-answered-rate",
            ),
            (self.max_loss_percent.is_some() && !has.loss, "--max-loss"),
            (self.max_errors.is_some() && !has.errors, "--max-errors"),
        ]
        .into_iter()
        .filter(|(bad, _)| *bad)
        .map(|(_, flag)| flag)
        .collect()
    }

    /// Checks each limit given against `m`. A limit whose measure `m` lacks is checked against
    /// 0 (callers refuse those first, with [`Limits::unmeasurable`]).
    pub fn judge(&self, m: &Measured) -> LimitsVerdict {
        let mut checks = Vec::new();
        let mut max = |flag: &str, limit: Option<f64>, measured: Option<f64>, unit: &str| {
            if let Some(limit) = limit {
                let measured = measured.unwrap_or(0.0);
                checks.push(LimitCheck {
                    flag: flag.into(),
                    limit,
                    measured,
                    unit: unit.into(),
                    passed: if flag == "--min-answered-rate" {
                        measured >= limit
                    } else {
                        measured <= limit
                    },
                });
            }
        };
        let ns = |v: Option<u64>| v.map(|v| v as f64);
        max("--max-p99", ns(self.max_p99_ns), ns(m.p99_ns), "ns");
        max("--max-p999", ns(self.max_p999_ns), ns(m.p999_ns), "ns");
        max(
            "--min-answered-rate",
            self.min_answered_qps,
            m.answered_qps,
            "q/s",
        );
        max("--max-loss", self.max_loss_percent, m.loss_percent, "%");
        max("--max-errors", ns(self.max_errors), ns(m.errors), "count");
        LimitsVerdict {
            passed: checks.iter().all(|c| c.passed),
            checks,
        }
    }
}

impl LimitCheck {
    /// `--max-p99 2.00 ms broken: p99 3.10 ms, 1.10 ms over` (what, measured, by how much).
    pub fn line(&self) -> String {
        let what = match self.flag.as_str() {
            "--max-p99" => "p99",
            "--max-p999" => "p99.9",
            "--min-answered-rate" => "answered",
            "--max-loss" => "loss",
            _ => "errors",
        };
        let v = |x: f64| match self.unit.as_str() {
            "ns" => fmt_ns(x as u64),
            "q/s" => format!("{x:.1} q/s"),
            "%" => format!("{x:.3} %"),
            _ => format!("{x:.0}"),
        };
        let by = (self.measured - self.limit).abs();
        let side = if self.flag.starts_with("--min") {
            "under"
        } else {
            "over"
        };
        let state = if self.passed { "kept" } else { "broken" };
        format!(
            "{} {} {state}: {what} {}{}",
            self.flag,
            v(self.limit),
            v(self.measured),
            if self.passed {
                String::new()
            } else {
                format!(", {} {side}", v(by))
            }
        )
    }
}

impl LimitsVerdict {
    /// The broken limits on one line (`limit broken: ...; ...`), or `None` when all held.
    pub fn broken(&self) -> Option<String> {
        let broken: Vec<String> = self
            .checks
            .iter()
            .filter(|c| !c.passed)
            .map(LimitCheck::line)
            .collect();
        (!broken.is_empty()).then(|| broken.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> Measured {
        Measured {
            p99_ns: Some(3_100_000),
            p999_ns: Some(9_000_000),
            answered_qps: Some(850.25),
            loss_percent: Some(2.5),
            errors: Some(3),
        }
    }

    #[test]
    fn each_limit_is_checked_and_a_broken_one_says_by_how_much() {
        let l = Limits {
            max_p99_ns: Some(2_000_000),
            max_p999_ns: Some(10_000_000),
            min_answered_qps: Some(1000.0),
            max_loss_percent: Some(5.0),
            max_errors: Some(3),
        };
        let v = l.judge(&measured());
        assert!(!v.passed);
        let passed: Vec<(&str, bool)> = v
            .checks
            .iter()
            .map(|c| (c.flag.as_str(), c.passed))
            .collect();
        assert_eq!(
            passed,
            [
                ("--max-p99", false),
                ("--max-p999", true),
                ("--min-answered-rate", false),
                ("--max-loss", true),
                ("--max-errors", true)
            ]
        );
        assert_eq!(
            v.broken().unwrap(),
            "--max-p99 2000.0 us broken: p99 3100.0 us, 1100.0 us over; --min-answered-rate 1000.0 q/s broken: answered 850.2 q/s, 149.8 q/s under"
        );
        assert_eq!(
            v.checks[4].line(),
            "--max-errors 3 kept: errors 3",
            "a limit equal to the measure holds"
        );
        let none = Limits::default().judge(&measured());
        assert!(none.passed && none.checks.is_empty());
        assert!(Limits::default().is_empty() && !l.is_empty());
    }

    #[test]
    fn limits_a_report_cannot_measure_are_named() {
        let l = Limits {
            max_p99_ns: Some(1),
            max_loss_percent: Some(1.0),
            max_errors: Some(0),
            ..Limits::default()
        };
        let copy = Measures {
            loss: true,
            errors: true,
            ..Measures::default()
        };
        assert_eq!(l.unmeasurable(copy), ["--max-p99"]);
        let all = Measures {
            latency: true,
            rate: true,
            loss: true,
            errors: true,
        };
        assert!(l.unmeasurable(all).is_empty());
    }
}
