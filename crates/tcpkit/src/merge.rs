//! `tcpkit merge`: the reports of runs made at the same time joined into one and judged as
//! one. Load reports (several client hosts, or the agents of one fleet run): counts summed,
//! histograms merged, rates over the union of the runs' windows, the runs' seconds on one
//! wall-clock axis as the fleet's series. Copy reports (several online hosts copying into one
//! target): one request loss figure. The limits (`--max-p99`, ...) are judged on the merged run.

use std::path::PathBuf;

use clap::Parser;

use crate::common::{self, LimitFlags, OutputFlags};
use crate::Failure;
use tcpkit_load::merge::MergeError;

/// Merge the `--json` reports of simultaneous runs into one report and judge it. Load reports
/// (`tcpkit load --json`: several client hosts, or the agents of one fleet run): counts
/// summed, latency histograms merged exactly, every report's one-second intervals laid on the
/// controller's clock (agent time minus its measured clock offset) as one per-second series;
/// two reports of one shard are refused, a shard with no report and an agent the barrier
/// stopped fail the merged run. Copy reports (`tcpkit copy --json` of several online hosts
/// into one target): requests added, one request loss ratio. Exits 1 when a limit is broken
/// or a run failed (the reasons on the last line), 2 when a file cannot be used (missing,
/// not a report, damaged, one run or one shard given twice, load and copy reports mixed);
/// runs that did not overlap in time are merged with a warning on stderr.
#[derive(Debug, Parser)]
pub struct Args {
    /// Reports written by `tcpkit load --json`, or by `tcpkit copy --json` (one kind).
    #[arg(required = true, value_name = "REPORT.json")]
    pub files: Vec<PathBuf>,

    #[command(flatten)]
    pub limits: LimitFlags,

    /// Draw the merged run into FILE, an SVG picture (FILE must end in .svg), as `load --plot`
    /// draws one run: latency by percentile (corrected and uncorrected) from the merged
    /// histograms, then latency p50/p99 and the answers per second of the fleet, per second
    /// of the merged series. Load reports only.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    #[command(flatten)]
    pub out: OutputFlags,
}

pub fn main(args: Args) -> Result<(), Failure> {
    // Every refusal is of the files named, found before anything is printed: a usage error.
    let bad = |e: MergeError| Failure::Usage(crate::chain(&e));
    if let Some(p) = &args.plot {
        tcpkit_stats::plot::check_name(p).map_err(Failure::Usage)?;
    }
    let limits = args.limits.limits();
    let mut loads = Vec::with_capacity(args.files.len());
    let mut copies = Vec::new();
    for f in &args.files {
        let name = f.display().to_string();
        let bytes = tcpkit_load::merge::read_bytes(f).map_err(bad)?;
        match tcpkit_load::merge::report_from_slice(&name, &bytes) {
            Ok(r) => loads.push((name, r)),
            Err(MergeError::OtherReport { kind: "copy", .. }) => {
                let r = tcpkit_copy::merged::copy_report_from_slice(&name, &bytes)
                    .map_err(|e| Failure::Usage(crate::chain(&e)))?;
                copies.push((name, r));
            }
            Err(e) => return Err(bad(e)),
        }
    }
    if let (Some((l, _)), Some((c, _))) = (loads.first(), copies.first()) {
        return Err(Failure::Usage(format!(
            "{} is a `tcpkit load --json` report and {} a `tcpkit copy --json` report: merge takes reports of one kind",
            tcpkit_stats::escape_controls(l),
            tcpkit_stats::escape_controls(c)
        )));
    }
    if !copies.is_empty() {
        return merge_copies(&args, &copies, &limits);
    }
    // One run twice is refused; runs that missed each other are merged, with a warning.
    let warnings = tcpkit_load::merge::check_runs(&loads).map_err(bad)?;
    for w in warnings {
        eprintln!("tcpkit merge: warning: {w}");
    }
    let merged = tcpkit_load::merge::merge_run(&loads, &limits).map_err(|e| {
        // "report 2: ..." names the file it was read from.
        let why = crate::chain(&e);
        let why = match e.report().and_then(|i| loads.get(i)) {
            Some((n, _)) => format!("{n}: {why}"),
            None => why,
        };
        Failure::Usage(why)
    })?;
    let plotted = match &args.plot {
        Some(svg) => plot(svg, &merged, loads.len()),
        None => Ok(()),
    };
    // As `load` would: a merged run that fell short exits 1 with the reason(s), so a script
    // that merges the reports of several clients sees what each client's exit status said.
    common::finish(&merged, &args.out)?;
    plotted
}

/// Copy reports: one loss figure, `--max-loss` and `--max-errors` judged on it.
fn merge_copies(
    args: &Args,
    copies: &[(String, tcpkit_copy::report::CopyReport)],
    limits: &tcpkit_stats::Limits,
) -> Result<(), Failure> {
    let cannot = limits.unmeasurable(tcpkit_copy::merged::MEASURES);
    if let Some(flag) = cannot.first() {
        return Err(Failure::Usage(format!(
            "{flag}: copy reports carry no latency histograms or run window to judge it on; a copy merge takes --max-loss and --max-errors"
        )));
    }
    if args.plot.is_some() {
        return Err(Failure::Usage(
            "--plot: copy reports have no intervals to draw; --plot is for load reports".into(),
        ));
    }
    let merged = tcpkit_copy::merged::merge_copies(copies, limits)
        .map_err(|e| Failure::Usage(crate::chain(&e)))?;
    common::finish(&merged, &args.out)
}

/// `--plot`: the merged histograms whole, the fleet's seconds from the merged intervals.
fn plot(
    svg: &std::path::Path,
    m: &tcpkit_load::report::LoadReport,
    n: usize,
) -> Result<(), Failure> {
    let fail = |what: String| Failure::Runtime(format!("--plot {}: {what}", svg.display()));
    let hist = |b64: &str| {
        tcpkit_stats::Histogram::from_base64(b64)
            .map_err(|e| fail(format!("the merged histogram: {e}")))
    };
    let corrected = hist(&m.histograms.intended)?;
    let uncorrected = hist(&m.histograms.sent)?;
    let samples = tcpkit_load::merge::samples(m).map_err(|e| fail(crate::chain(&e)))?;
    let title = format!(
        "tcpkit merge: {n} report{} against {}",
        if n == 1 { "" } else { "s" },
        m.target
    );
    tcpkit_stats::plot::load_svg(svg, &title, &corrected, &uncorrected, &samples)
        .map_err(|e| fail(format!("cannot write: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_parses() {
        let a = Args::try_parse_from([
            "merge",
            "a.json",
            "b.json",
            "--json",
            "--max-p99",
            "2ms",
            "--max-p999",
            "5ms",
            "--min-answered-rate",
            "100",
            "--max-loss",
            "1",
            "--max-errors",
            "0",
            "--plot",
            "f.svg",
        ])
        .unwrap();
        assert_eq!(a.files, [PathBuf::from("a.json"), PathBuf::from("b.json")]);
        assert!(a.out.json);
        assert_eq!(a.plot, Some(PathBuf::from("f.svg")));
        let l = a.limits.limits();
        assert_eq!(l.max_p99_ns, Some(2_000_000));
        assert_eq!(l.max_errors, Some(0));
        assert!(Args::try_parse_from(["merge"]).is_err());
    }
}
