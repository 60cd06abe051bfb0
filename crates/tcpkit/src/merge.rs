//! `tcpkit merge`: the reports of load runs made at the same time (from several client hosts)
//! joined into one summary: counts summed, histograms merged, rates over the union of the
//! runs' wall-clock windows.

use std::path::PathBuf;

use clap::Parser;

use crate::common::{self, OutputFlags};
use crate::Failure;

/// Merge `tcpkit load --json` reports of simultaneous runs (several client hosts loading one
/// server) into one report. Exits 1, with the reasons, when any of the runs failed; 2 when a
/// file cannot be used (missing, not a load report, damaged, or one run given twice: each
/// report carries its run id); runs that did not overlap in time are merged with a warning on
/// stderr.
#[derive(Debug, Parser)]
pub struct Args {
    /// Reports written by `tcpkit load --json`.
    #[arg(required = true, value_name = "REPORT.json")]
    pub files: Vec<PathBuf>,

    #[command(flatten)]
    pub out: OutputFlags,
}

pub fn main(args: Args) -> Result<(), Failure> {
    // Every refusal is of the files named, found before anything is printed: a usage error.
    let bad = |e: tcpkit_load::merge::MergeError| Failure::Usage(crate::chain(&e));
    let mut named = Vec::with_capacity(args.files.len());
    for f in &args.files {
        named.push((
            f.display().to_string(),
            tcpkit_load::merge::read_report(f).map_err(bad)?,
        ));
    }
    // One run twice is refused; runs that missed each other are merged, with a warning.
    let warnings = tcpkit_load::merge::check_runs(&named).map_err(bad)?;
    for w in warnings {
        eprintln!("tcpkit merge: warning: {w}");
    }
    let (names, reports): (Vec<_>, Vec<_>) = named.into_iter().unzip();
    let merged = tcpkit_load::merge::merge_reports(&reports).map_err(|e| {
        // "report 2: ..." names the file it was read from.
        let why = crate::chain(&e);
        let why = match e.report() {
            Some(i) => match names.get(i) {
                Some(n) => format!("{n}: {why}"),
                None => why,
            },
            None => why,
        };
        Failure::Usage(why)
    })?;
    // As `load` would: a merged run that fell short exits 1 with the reason(s), so a script
    // that merges the reports of several clients sees what each client's exit status said.
    common::finish(&merged, &args.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_parses() {
        let a = Args::try_parse_from(["merge", "a.json", "b.json", "--json"]).unwrap();
        assert_eq!(a.files, [PathBuf::from("a.json"), PathBuf::from("b.json")]);
        assert!(a.out.json);
        assert!(Args::try_parse_from(["merge"]).is_err());
    }
}
