//! tcpkit-bench: one command per benchmark, each building its own namespace lab and printing
//! tcpkit beside its peer measured in the same run; each writes its table, with the date and
//! the command, to bench/results/<name>-YYYY-MM-DD.md (see bench/README.md).
//!
//! - [`replay`]: `tcpkit replay` vs tcpreplay 4.4.3 on one veth (top speed, paced rates, CPU).
//! - [`load`]: `tcpkit load` + `echo` vs dnsperf and unbound; idle memory, a million connections.
//! - [`copy`]: what `tcpkit copy` (relay, transparent) costs an online nginx under load.
//! - [`mpcat`]: `tcpkit mpcat` vs socat, `iperf3 -P 4` and MPTCP over ECMP links.
//! - [`balance`]: `tcpkit balance` vs direct, iptables and nftables DNAT with redis.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

mod balance;
mod copy;
mod load;
mod mpcat;
mod replay;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("replay") => replay::replay(&args[1..]),
        Some("load") => load::load(&args[1..]),
        Some("copy") => copy::copy(&args[1..]),
        Some("mpcat") => mpcat::mpcat_bench(&args[1..]),
        Some("balance") => balance::balance_bench(&args[1..]),
        // Not a benchmark: the connect loop `balance` runs inside its client hosts.
        Some("connect-loop") => balance::connect_loop(&args[1..]),
        // Nor this: the CPU figure's snapshot of /proc/stat, kernel threads and one process.
        Some("snap") => balance::snap(&args[1..]),
        _ => {
            eprintln!(
                "usage: tcpkit-bench replay | load [--skip-max-conns] [--max-conns N] [--open-secs S] | copy [--only MODE[:TRAFFIC[:RATE]]] | mpcat [--quick] | balance [--quick]"
            );
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
    use std::io::Read;
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let t0 = std::time::Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("spawn {what}"))?;
    let mut err_pipe = child.stderr.take().context("stderr")?;
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let mut out = String::new();
    child
        .stdout
        .take()
        .context("stdout")?
        .read_to_string(&mut out)?;
    let mut status = 0;
    // SAFETY: rusage is plain old data, filled by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with pointers to values we own.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    let wall_s = t0.elapsed().as_secs_f64();
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
    let out = results_dir().join(format!("{name}-{date}.md"));
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
