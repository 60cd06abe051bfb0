//! tcpkit-bench: one command per benchmark, each building its own namespace lab and printing
//! tcpkit beside its peer measured in the same run; each writes its table, with the date and
//! the command, to bench/results/<name>-YYYY-MM-DD.md (see bench/README.md).
//!
//! - [`replay`]: `tcpkit replay` vs tcpreplay 4.4.3 on one veth (top speed, paced rates, CPU).
//! - [`load`]: `tcpkit load` + `echo` vs dnsperf and unbound; idle memory, a million connections;
//!   [`load_tls`]: its TLS rows (DoT, DoH, HTTPS, HTTP/2, handshakes) vs dnsperf, wrk, h2load, s_time.
//! - [`copy`]: what `tcpkit copy` (relay, transparent) costs an online nginx under load;
//!   [`copy_tls`]: its TLS rows (from a key log, from uprobes, to a TLS target).
//! - [`mpcat`]: `tcpkit mpcat` vs socat, `iperf3 -P 4` and MPTCP over ECMP links.
//! - [`balance`]: `tcpkit balance` vs direct, iptables and nftables DNAT with redis.
//! - [`fleet`]: three agents started by the playbook and the barrier vs dnsperf over an ssh loop.
//! - [`soak`]: copy, echo, balance and mpcat for `--minutes N` under steady traffic and faults:
//!   RSS, descriptors and CPU of every tcpkit process over time, counters against the other side's.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

mod ab;
mod balance;
mod copy;
mod copy_tls;
mod fleet;
mod load;
mod load_pin;
mod load_tls;
mod mpcat;
mod replay;
mod replay_flows;
mod soak;

const USAGE: &str = "usage: tcpkit-bench replay [--flows] [--against PATH [--against-label L]] [--packets N] [--only xdp] | load [--skip-max-conns] [--same-rate-only] [--tls-only] [--tls-quick] [--skip-tls] [--max-conns N] [--open-secs S] [--against PATH [--against-label L]] | copy [--only MODE[:TRAFFIC[:RATE]]] [--tls-only] [--against PATH [--against-label L] [--runs N]] | mpcat [--quick] [--only dead-link|rate] [--against PATH [--against-label L]] | balance [--quick] [--only cpu|rps|connect] [--cpu-secs S] | fleet [--quick] [--only tcpkit|dnsperf] [--rounds N] [--secs S] [--rate QPS] [--conns PER_AGENT] [--connect-rate N] | soak [--minutes N] [--sample-secs S] [--only copy|echo|balance|mpcat ...]";

/// Each bench's flags: those that take a value, then switches. A flag outside them is a usage
/// error before anything runs: `copy --help` once ran the whole 17-minute bench.
fn flags_of(bench: &str) -> Option<(&'static [&'static str], &'static [&'static str])> {
    Some(match bench {
        "replay" => (
            &["--against", "--against-label", "--packets", "--only"],
            &["--flows"],
        ),
        "load" => (
            &["--max-conns", "--open-secs", "--against", "--against-label"],
            &[
                "--skip-max-conns",
                "--same-rate-only",
                "--tls-only",
                "--tls-quick",
                "--skip-tls",
            ],
        ),
        "copy" => (
            &["--only", "--against", "--against-label", "--runs"],
            &["--tls-only"],
        ),
        "mpcat" => (&["--only", "--against", "--against-label"], &["--quick"]),
        "balance" => (&["--only", "--cpu-secs"], &["--quick"]),
        "fleet" => (
            &["--rounds", "--secs", "--rate", "--conns", "--only"],
            &["--quick"],
        ),
        "soak" => (&["--minutes", "--sample-secs", "--only"], &[]),
        _ => return None,
    })
}

/// Why `args` are not a use of `bench`'s flags, if they are not.
fn check_flags(bench: &str, args: &[String]) -> Result<(), String> {
    let Some((valued, switches)) = flags_of(bench) else {
        return Ok(());
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if valued.contains(&a.as_str()) {
            if it.next().is_none_or(|v| v.starts_with("--")) {
                return Err(format!("{bench}: {a} needs a value"));
            }
        } else if !switches.contains(&a.as_str()) {
            return Err(format!("{bench}: unknown argument {a:?}"));
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    let bench = args.first().map_or("", String::as_str);
    if let Err(why) = check_flags(bench, &args[1.min(args.len())..]) {
        eprintln!("tcpkit-bench {why}\n{USAGE}");
        std::process::exit(2);
    }
    let r = match bench {
        "replay" => replay::replay(&args[1..]),
        "load" => load::load(&args[1..]),
        "copy" => copy::copy(&args[1..]),
        "mpcat" => mpcat::mpcat_bench(&args[1..]),
        "balance" => balance::balance_bench(&args[1..]),
        "fleet" => fleet::fleet_bench(&args[1..]),
        "soak" => soak::soak(&args[1..]),
        // Not a benchmark: the soak's balance client, run inside balance's cgroup.
        "soak-connect" => soak::connect_client(&args[1..]),
        // Not a benchmark: the connect loop `balance` runs inside its client hosts.
        "connect-loop" => balance::connect_loop(&args[1..]),
        // Nor this: the CPU figure's snapshot of /proc/stat, kernel threads and one process.
        "snap" => balance::snap(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("tcpkit-bench: {e:#}");
        std::process::exit(1);
    }
}

/// The tcpkit binary beside this one in the target directory, built first when run by cargo.
fn tcpkit_binary() -> Result<PathBuf> {
    if let Ok(cargo) = std::env::var("CARGO") {
        let st = std::process::Command::new(cargo)
            .args(["build", "--release", "-q", "-p", "tcpkit"])
            .status()
            .context("cargo build -p tcpkit")?;
        if !st.success() {
            bail!("cargo build --release -p tcpkit failed");
        }
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let bin = exe.with_file_name("tcpkit");
    if !bin.exists() {
        bail!(
            "{}: not built (cargo build --release -p tcpkit)",
            bin.display()
        );
    }
    Ok(bin)
}

/// `--against PATH [--against-label L]`: another tcpkit build (an older tree) run beside this
/// one, interleaved, so that a before/after comparison is made in one run on the same machine
/// state rather than against a results file from another day (this VM's throughput swings 2x
/// between minutes).
pub(crate) struct Against {
    pub bin: PathBuf,
    /// Names the old build in the results: `--against-label`, else its `--version`.
    pub label: String,
    /// Names this build: the workspace's commit (and whether it had changes), else `--version`.
    pub new_label: String,
}

/// The value after `flag` in `args`, or an error naming the flag when it has none.
pub(crate) fn flag_value<'a>(
    args: &'a [String],
    flag: &str,
    what: &str,
) -> Result<Option<&'a str>> {
    args.iter()
        .position(|a| a == flag)
        .map(|i| {
            args.get(i + 1)
                .map(String::as_str)
                .filter(|v| !v.starts_with("--"))
                .with_context(|| format!("{flag} needs {what}"))
        })
        .transpose()
}

impl Against {
    pub(crate) fn parse(args: &[String], new_bin: &Path) -> Result<Option<Against>> {
        let label = flag_value(args, "--against-label", "a label (a commit)")?;
        let Some(path) = flag_value(args, "--against", "the path of another tcpkit binary")? else {
            if label.is_some() {
                bail!("--against-label: only with --against PATH");
            }
            return Ok(None);
        };
        let bin = PathBuf::from(path);
        let version = version_of(&bin).with_context(|| format!("--against {path}"))?;
        let label = label.map_or_else(|| format!("{version} ({path})"), str::to_string);
        let new_version = version_of(new_bin)?;
        let new_label = workspace_commit().map_or(new_version, |c| format!("commit {c}"));
        Ok(Some(Against {
            bin,
            label,
            new_label,
        }))
    }
}

/// `BIN --version`'s line: also proves BIN is a tcpkit that runs.
fn version_of(bin: &Path) -> Result<String> {
    let o = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("run {} --version", bin.display()))?;
    let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() || !v.starts_with("tcpkit") {
        bail!("{} --version: not a tcpkit binary ({v:?})", bin.display());
    }
    Ok(v)
}

/// This workspace's commit, "+ changes" when the tree differs from it.
fn workspace_commit() -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |a: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(a)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{head} + changes")
    } else {
        head
    })
}

/// Which of `flags` `BIN SUB --help` does not list: an older build may predate a flag the
/// bench passes, and its row then says so instead of failing.
pub(crate) fn missing_flags(bin: &Path, sub: &str, flags: &[&str]) -> Result<Vec<String>> {
    let o = std::process::Command::new(bin)
        .args([sub, "--help"])
        .output()
        .with_context(|| format!("run {} {sub} --help", bin.display()))?;
    let help = String::from_utf8_lossy(&o.stdout);
    Ok(flags
        .iter()
        .filter(|f| !lists_flag(&help, f))
        .map(|f| (*f).to_string())
        .collect())
}

/// Whether a clap help text lists `flag` (as a whole flag: `-t` is not `--threads`).
fn lists_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().next_back();
        let after = help[i + flag.len()..].chars().next();
        !before.is_some_and(|c| c == '-' || c.is_alphanumeric())
            && !after.is_some_and(|c| c == '-' || c == '_' || c.is_alphanumeric())
    })
}

/// `new / old` as a ratio cell; "—" when either is missing or the old one is zero.
pub(crate) fn new_over_old(new: Option<f64>, old: Option<f64>) -> String {
    match (new, old) {
        (Some(n), Some(o)) if o != 0.0 && n.is_finite() && o.is_finite() => format!("{:.2}", n / o),
        _ => "—".to_string(),
    }
}

/// Reads `child`'s stdout and stderr to their ends on threads of their own, so that neither
/// pipe fills and stalls it while the caller watches it; join each for its text.
pub(crate) fn drain(
    child: &mut std::process::Child,
) -> Result<(
    std::thread::JoinHandle<String>,
    std::thread::JoinHandle<String>,
)> {
    fn read_all(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    }
    let out = child.stdout.take().context("stdout")?;
    let err = child.stderr.take().context("stderr")?;
    Ok((read_all(out), read_all(err)))
}

/// What a command run by [`run_wait4`] did.
struct Ran {
    out: String,
    err: String,
    /// Its exit code (None: killed by a signal).
    code: Option<i32>,
    /// Its user + system CPU seconds.
    cpu_s: f64,
    /// Its peak RSS in KiB as wait4 reports it.
    maxrss_kb: u64,
    /// From the spawn to the exit.
    wall_s: f64,
}

/// Runs `cmd`, reading its stdout and stderr whole, and reaps it with wait4 rather than
/// Child::wait: that also gives its CPU time and peak RSS (`ip netns exec` execs the tool in
/// place, so the child is the tool).
fn run_wait4(mut cmd: std::process::Command, what: &str) -> Result<Ran> {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let t0 = std::time::Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("spawn {what}"))?;
    let (out_thread, err_thread) = drain(&mut child)?;
    let mut status = 0;
    // SAFETY: rusage is plain old data, filled by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with pointers to values we own.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    let wall_s = t0.elapsed().as_secs_f64();
    let out = out_thread.join().unwrap_or_default();
    let err = err_thread.join().unwrap_or_default();
    if pid < 0 {
        bail!("wait4 for {what}: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Ran {
        out,
        err,
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
        maxrss_kb: u64::try_from(ru.ru_maxrss).unwrap_or(0),
        wall_s,
    })
}

/// A figure of dnsperf's summary in `out`: the number after the colon on the line that starts
/// with `label` ("Queries completed", "Queries per second", ...).
pub(crate) fn dnsperf_figure(out: &str, label: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.trim_start().starts_with(label))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
}

/// bench/results/, where every bench writes its table.
fn results_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// Writes a bench's document to bench/results/NAME-DATE.md and says so with the bench's
/// whole time, unless `partial` names the flag that made this run a part of the bench (a
/// part is not the table the results file promises).
fn write_results(
    name: &str,
    date: &str,
    md: &str,
    started: std::time::Instant,
    partial: Option<&str>,
) -> Result<()> {
    let dir = results_dir();
    let out = free_name(&dir, name, date);
    if let Some(flag) = partial {
        eprintln!("{flag}: {} not written", out.display());
        return Ok(());
    }
    std::fs::write(&out, md).with_context(|| format!("write {}", out.display()))?;
    eprintln!(
        "wrote {} ({:.0} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `NAME-DATE.md`, or the first of `NAME-DATE-b.md`, `-c`, ... not yet there: a second run
/// on one day must not overwrite the first, which notes and README may already quote.
fn free_name(dir: &Path, name: &str, date: &str) -> PathBuf {
    let first = dir.join(format!("{name}-{date}.md"));
    if !first.exists() {
        return first;
    }
    ('b'..='z')
        .map(|c| dir.join(format!("{name}-{date}-{c}.md")))
        .find(|p| !p.exists())
        .unwrap_or_else(|| dir.join(format!("{name}-{date}-{}.md", std::process::id())))
}

fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = (secs / 86400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_run_on_a_day_gets_a_name_of_its_own() {
        let d = tempfile::tempdir().unwrap();
        let p = free_name(d.path(), "copy", "2026-11-25");
        assert_eq!(p, d.path().join("copy-2026-11-25.md"));
        std::fs::write(&p, "first").unwrap();
        let p = free_name(d.path(), "copy", "2026-11-25");
        assert_eq!(p, d.path().join("copy-2026-11-25-b.md"));
        std::fs::write(&p, "second").unwrap();
        std::fs::write(d.path().join("copy-2026-11-25-c.md"), "third").unwrap();
        let p = free_name(d.path(), "copy", "2026-11-25");
        assert_eq!(p, d.path().join("copy-2026-11-25-d.md"));
    }

    #[test]
    fn a_bench_takes_only_its_own_flags() {
        let a = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        assert!(check_flags("copy", &a(&["--only", "relay", "--runs", "3"])).is_ok());
        assert!(check_flags("load", &a(&["--skip-max-conns", "--open-secs", "5"])).is_ok());
        let e = check_flags("copy", &a(&["--quick"])).unwrap_err();
        assert!(e.contains("unknown argument \"--quick\""), "{e}");
        let e = check_flags("replay", &a(&["--against"])).unwrap_err();
        assert!(e.contains("--against needs a value"), "{e}");
        let e = check_flags("copy", &a(&["--runs", "--only", "relay"])).unwrap_err();
        assert!(e.contains("--runs needs a value"), "{e}");
        assert!(check_flags(
            "soak",
            &a(&["--minutes", "3", "--only", "echo", "--only", "copy"])
        )
        .is_ok());
        assert!(check_flags("soak", &a(&["--quick"])).is_err());
        // A value is not taken for a flag: `mpcat 3` is a stray argument.
        assert!(check_flags("mpcat", &a(&["3"])).is_err());
        // The helpers the benches run inside their hosts parse their own arguments.
        assert!(check_flags("connect-loop", &a(&["x", "y"])).is_ok());
    }

    #[test]
    fn a_flag_is_listed_whole() {
        let help = "  -t, --topspeed   As fast\n      --threads <N>  Senders\n  -K, --preload\n";
        assert!(lists_flag(help, "-t"));
        assert!(lists_flag(help, "--threads"));
        assert!(lists_flag(help, "-K"));
        // A prefix of a listed flag is not the flag.
        assert!(!lists_flag(help, "--thread"));
        assert!(!lists_flag(help, "--top"));
        assert!(!lists_flag(help, "-L"));
    }

    #[test]
    fn against_needs_a_path_and_its_label_needs_against() {
        let a = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        let new = Path::new("/bin/true");
        let e = Against::parse(&a(&["--against"]), new).err().unwrap();
        assert!(format!("{e:#}").contains("--against needs"), "{e:#}");
        let e = Against::parse(&a(&["--against", "--only", "relay"]), new)
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("--against needs"), "{e:#}");
        let e = Against::parse(&a(&["--against-label", "abc"]), new)
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("only with --against"), "{e:#}");
        // Not a tcpkit: said at the start, not at the first row.
        let e = Against::parse(&a(&["--against", "/bin/true"]), new)
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("not a tcpkit"), "{e:#}");
        assert!(Against::parse(&a(&["--only", "relay"]), new)
            .unwrap()
            .is_none());
    }

    #[test]
    fn new_over_old_is_blank_without_both() {
        assert_eq!(new_over_old(Some(3.0), Some(2.0)), "1.50");
        assert_eq!(new_over_old(Some(3.0), None), "—");
        assert_eq!(new_over_old(Some(3.0), Some(0.0)), "—");
        assert_eq!(new_over_old(Some(f64::NAN), Some(1.0)), "—");
    }
}
