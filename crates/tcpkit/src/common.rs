//! The run contract, once for every subcommand: the common flags (`--duration`, `--stats`,
//! `--json`, `--quiet`) and their one parser, the one signal handler, the error-chain printer,
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
