//! The run contract, once for every subcommand: the common flags (`--duration`, `--stats`,
//! `--json`, `--quiet`; the limits `load` and `merge` judge a run by) and their one parser, the one signal handler, the error-chain printer,
//! and the tail every job ends with (summary or JSON on stdout, verdict → exit status).
//!
//! Exit status, decided here and nowhere else ([`exit`], [`usage_exit`]): 0 the run did what
//! was asked; 1 the run started and did not, or the environment refused it (interface down,
//! port in use, peer refused, data found bad mid-run): the reason is the last line on stderr;
//! 2 a usage error: the command line is wrong, or a file it names cannot be used as given
//! (missing, unreadable, wrong mode, not the expected format), one line naming the flag and
//! file, nothing run. With `--json`, stdout holds one JSON document and nothing else: live
//! lines and hints go to stderr.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tcpkit_stats::{Report, Verdict};

/// How a job failed: one line on stderr, exit 2 for usage, 1 at runtime.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line is wrong, or a file it names cannot be used as given: exit 2.
    Usage(String),
    /// The run started and fell short, or the environment refused it: exit 1.
    Runtime(String),
}

/// A usage error's exit status (as clap, getopt and the peers' tools give it).
pub(crate) const EXIT_USAGE: u8 = 2;
/// A run that did not do what was asked.
pub(crate) const EXIT_FAILED: u8 = 1;

impl Failure {
    /// The exit status this failure gives: README's rule, in this one place.
    pub(crate) fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Runtime(_) => EXIT_FAILED,
        }
    }

    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Usage(m) | Failure::Runtime(m) => m,
        }
    }
}

/// A job's end: its failure, if any, as the one line `tcpkit NAME: <why>` on stderr, and the
/// exit status.
pub(crate) fn exit(name: &str, result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("tcpkit {name}: {}", f.message());
            ExitCode::from(f.code())
        }
    }
}

/// What clap refused, as one line on stderr and the usage exit status: clap's message up to
/// its usage block, folded onto one line, named after the subcommand `sub` when it is known.
pub(crate) fn usage_exit(e: &clap::Error, sub: Option<&str>) -> ExitCode {
    let text = e.to_string();
    let what: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
        .collect();
    let what = what.join(" ");
    let first = what.strip_prefix("error: ").unwrap_or(&what);
    match sub {
        Some(c) => eprintln!("tcpkit {c}: {first} (see 'tcpkit {c} --help')"),
        None => eprintln!("tcpkit: {first} (see 'tcpkit --help')"),
    }
    ExitCode::from(EXIT_USAGE)
}

/// How long a run lasts and what it shows while it runs; flattened into every job that runs
/// for a while.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct RunFlags {
    /// Stop after this long (2, 2s, 500ms, 1m), then report as at a normal end.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub duration: Option<Duration>,

    /// A live line on stderr every DURATION (2, 2s, 500ms), elapsed time first.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub stats: Option<Duration>,
}

/// How the report is given; flattened into every job.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct OutputFlags {
    /// Print the report as one JSON document (schema under docs/schema/); stdout holds it and
    /// nothing else, live lines go to stderr.
    #[arg(long)]
    pub json: bool,

    /// No summary and no progress line: only errors, and the exit status (JSON still printed
    /// with --json).
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

impl OutputFlags {
    /// Whether a progress line may be drawn on a terminal.
    pub fn progress(&self) -> bool {
        !self.json && !self.quiet
    }
}

/// Pass/fail limits judged on the whole run (`load`: this run, all its processes; `merge`: the
/// merged run of every report), flattened into both from this one definition. A limit broken
/// makes the run exit 1 with which limit, what was measured and by how much on the last line;
/// `--json` reports carry a `verdict` with each limit checked.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct LimitFlags {
    /// Fail (exit 1) when the 99th percentile latency, from the intended send time (wrk2's
    /// corrected one), is above DURATION (2ms, 500us, 0.1s).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub max_p99: Option<Duration>,

    /// Fail when the 99.9th percentile latency, from the intended send time, is above DURATION.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub max_p999: Option<Duration>,

    /// Fail when fewer than QPS answers per second came back, over the run's wall-clock window
    /// (merged runs: the union of their windows).
    #[arg(long, value_name = "QPS", value_parser = rate_arg)]
    pub min_answered_rate: Option<f64>,

    /// Fail when more than PERCENT of the requests were never answered: load, the queries sent
    /// (timed out, lost, unanswered at the end); copy reports, tcpcopy's request loss ratio over
    /// every copy (requests at the sources the target never answered).
    #[arg(long, value_name = "PERCENT", value_parser = percent_arg)]
    pub max_loss: Option<f64>,

    /// Fail when more than N errors were counted: load, the report's errors (failed socket
    /// calls by errno, protocol errors by kind); copy reports, the failed copies.
    #[arg(long, value_name = "N")]
    pub max_errors: Option<u64>,
}

impl LimitFlags {
    /// The limits given.
    pub(crate) fn limits(&self) -> tcpkit_stats::Limits {
        tcpkit_stats::Limits {
            max_p99_ns: self.max_p99.map(|d| d.as_nanos() as u64),
            max_p999_ns: self.max_p999.map(|d| d.as_nanos() as u64),
            min_answered_qps: self.min_answered_rate,
            max_loss_percent: self.max_loss,
            max_errors: self.max_errors,
        }
    }
}

/// clap's value parser for `--min-answered-rate`: a rate above 0.
fn rate_arg(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{text:?}: expected answers per second above 0, like 1000 or 2.5"
        )),
    }
}

/// clap's value parser for `--max-loss`: a percentage from 0 to 100.
fn percent_arg(text: &str) -> Result<f64, String> {
    match text.trim().trim_end_matches('%').parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{text:?}: expected a percentage from 0 to 100, like 1 or 0.5"
        )),
    }
}

/// clap's value parser for every duration flag.
pub(crate) fn duration_arg(text: &str) -> Result<Duration, String> {
    tcpkit_pace::parse_duration(text)
}

/// clap's value parser for every size flag.
pub(crate) fn size_arg(text: &str) -> Result<u64, String> {
    tcpkit_pace::parse_size(text)
}

/// `--shard K/N` (load and replay), as typed: this agent's shard, or a usage error naming the
/// flag and what was wrong.
pub(crate) fn shard(text: Option<&str>) -> Result<Option<tcpkit_workers::Shard>, Failure> {
    text.map(|t| tcpkit_workers::Shard::parse(t).map_err(Failure::Usage))
        .transpose()
}

/// A duration flag given as text (for flags whose value is parsed after other flags).
pub(crate) fn duration(flag: &str, text: &str) -> Result<Duration, Failure> {
    tcpkit_pace::parse_duration(text).map_err(|e| Failure::Usage(format!("{flag} {e}")))
}

/// Installs the one handler for SIGINT and SIGTERM. The first sets the returned flag: every
/// job polls it, stops promptly (a bounded drain, said in its `--help`) and prints its report.
/// The second exits at once with 128 + the signal's number, as a shell reports a killed job
/// (unless `second_exits` is false: a worker process, which hears every signal twice).
pub(crate) fn install_signals(second_exits: bool) -> &'static AtomicBool {
    let flag: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // One swap, not signal-hook's load-then-store pair (`register_conditional_shutdown`
        // + `flag::register`): a multi-threaded job can take two signals at the same moment
        // on two threads, and with a load and a later store both saw "first" and neither
        // exited (CI, contract.rs: SIGINT and SIGTERM delivered together after SIGCONT).
        let action = move || {
            if flag.swap(true, Ordering::SeqCst) && second_exits {
                signal_hook::low_level::exit(128 + sig);
            }
        };
        // SAFETY: the action only touches an atomic and calls _exit, both async-signal-safe.
        let _ = unsafe { signal_hook::low_level::register(sig, action) };
    }
    flag
}

/// A stop flag for a job that runs until it is stopped: set when `interrupt` is (a signal) or
/// when `duration` has passed, whichever comes first. The watcher looks every 20 ms, so a stop
/// is seen at most that much later than the signal.
pub(crate) fn stop_flag(
    interrupt: &'static AtomicBool,
    duration: Option<Duration>,
) -> &'static AtomicBool {
    let Some(d) = duration else {
        return interrupt;
    };
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let deadline = std::time::Instant::now() + d;
    let _ = std::thread::Builder::new()
        .name("tcpkit-deadline".into())
        .spawn(move || {
            while !interrupt.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            stop.store(true, Ordering::SeqCst);
        });
    stop
}

pub(crate) use tcpkit_stats::chain;

/// Writes `text` to stdout. A closed stdout (a pipe into `head`) is not the run's failure:
/// the report was not wanted.
pub(crate) fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The tail of every job: the report on stdout (JSON with --json, the summary unless --quiet),
/// then the verdict as the exit status.
pub(crate) fn finish(report: &dyn Report, out: &OutputFlags) -> Result<(), Failure> {
    if out.json {
        print(&(report.json() + "\n"));
    } else if !out.quiet {
        print(&report.human());
    }
    match report.verdict() {
        Verdict::Done => Ok(()),
        Verdict::Failed(why) => Err(Failure::Runtime(why)),
    }
}

/// For each job's flag tests: `argv` (the subcommand's name first) parsed by clap and resolved
/// by `resolve`, giving the resolved config or the one line the user would see (clap's, or the
/// resolver's).
#[cfg(test)]
pub(crate) fn resolved<A: clap::Parser, T>(
    argv: &[&str],
    resolve: impl FnOnce(&A) -> Result<T, Failure>,
) -> Result<T, String> {
    let a = A::try_parse_from(argv).map_err(|e| e.to_string())?;
    resolve(&a).map_err(|f| f.message().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        run: RunFlags,
        #[command(flatten)]
        out: OutputFlags,
    }

    #[derive(Debug, Parser)]
    struct L {
        #[command(flatten)]
        limits: LimitFlags,
    }

    #[test]
    fn limit_flags_parse_and_refuse_what_is_not_a_limit() {
        let l = L::try_parse_from([
            "x",
            "--max-p99",
            "2ms",
            "--max-p999",
            "0.5s",
            "--min-answered-rate",
            "1000",
            "--max-loss",
            "0.5%",
            "--max-errors",
            "3",
        ])
        .unwrap()
        .limits
        .limits();
        assert_eq!(
            l,
            tcpkit_stats::Limits {
                max_p99_ns: Some(2_000_000),
                max_p999_ns: Some(500_000_000),
                min_answered_qps: Some(1000.0),
                max_loss_percent: Some(0.5),
                max_errors: Some(3),
            }
        );
        assert!(L::try_parse_from(["x"]).unwrap().limits.limits().is_empty());
        for bad in [
            ["--max-loss", "101"],
            ["--max-loss", "-1"],
            ["--min-answered-rate", "0"],
            ["--min-answered-rate", "inf"],
            ["--max-p99", "soon"],
            ["--max-errors", "-1"],
        ] {
            let arg = format!("{}={}", bad[0], bad[1]);
            let e = L::try_parse_from(["x", &arg]).unwrap_err().to_string();
            assert!(e.contains(bad[0]), "{e}");
        }
    }

    #[test]
    fn common_flags_parse_every_duration_form() {
        for d in ["2", "2s", "2000ms"] {
            let t =
                T::try_parse_from(["t", "--duration", d, "--stats", "500ms", "--json"]).unwrap();
            assert_eq!(t.run.duration, Some(Duration::from_secs(2)));
            assert_eq!(t.run.stats, Some(Duration::from_millis(500)));
            assert!(t.out.json && !t.out.quiet && !t.out.progress());
        }
        let t = T::try_parse_from(["t", "-q"]).unwrap();
        assert!(t.out.quiet && !t.out.progress());
    }

    #[test]
    fn a_bad_duration_names_its_flag() {
        let e = T::try_parse_from(["t", "--duration", "soon"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--duration") && e.contains("soon"), "{e}");
    }
}
