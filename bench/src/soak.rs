//! `tcpkit-bench soak`: the long-running roles under steady traffic for `--minutes N`, all at
//! once by default, each in a lab of its own (issue 29): copy (relay and transparent, with
//! intercept) on an online nginx at 5k requests/s; echo holding 100,000 connections that churn
//! 1,000 a second; `balance up` under 5,000 connects/s with a reload every 5 s and a backend
//! flapping; mpcat moving 50 GB per 30 minutes over four paths, one going down and up every
//! minute. Every `--sample-secs` each tcpkit process of a role is sampled (VmRSS, open
//! descriptors, utime + stime) with the role's own live counters; at the end each role's
//! counters are set against the other side's. The table (and a CSV of every sample, and an
//! SVG of RSS and descriptors over time) goes to bench/results/soak-DATE.*.
//!
//! The roles live in [`roles`]; the picture in [`plot`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tcpkit_lab::Host;

mod plot;
mod roles;

/// Every role, in the order they start and are shown.
pub(crate) const ROLES: [&str; 4] = ["copy", "echo", "balance", "mpcat"];

/// One target judged at the end of a role: what was compared, the figures, the bound, and
/// whether it was met.
pub(crate) struct Check {
    pub(crate) target: String,
    pub(crate) figures: String,
    pub(crate) bound: String,
    pub(crate) met: bool,
}

impl Check {
    /// `a` and `b` equal: "counters equal", "0 lost".
    pub(crate) fn equal(target: &str, a: (&str, u64), b: (&str, u64)) -> Check {
        Check {
            target: target.to_string(),
            figures: if a.1 == b.1 {
                format!("{} {} vs {} {}", a.0, a.1, b.0, b.1)
            } else {
                let d = a.1.abs_diff(b.1);
                format!(
                    "{} {} vs {} {} (differ by {d}, {:.3} %)",
                    a.0,
                    a.1,
                    b.0,
                    b.1,
                    100.0 * d as f64 / a.1.max(b.1) as f64
                )
            },
            bound: "equal".to_string(),
            met: a.1 == b.1,
        }
    }

    /// `n` is 0: "0 failed connects", "0 bytes wrong".
    pub(crate) fn zero(target: &str, what: &str, n: u64) -> Check {
        Check {
            target: target.to_string(),
            figures: format!("{n} {what}"),
            bound: "0".to_string(),
            met: n == 0,
        }
    }
}

/// A role of the soak, started in its own lab, with its load already running.
pub(crate) trait Role {
    fn name(&self) -> &'static str;
    /// Its tcpkit processes now, each with a label that stays the same over the run.
    fn procs(&self) -> Vec<(String, u32)>;
    /// About every second, `t` seconds into the soak: the role's faults (reloads, flaps,
    /// links going down). An error ends the soak.
    fn tick(&mut self, t: f64) -> Result<()>;
    /// Its live counters now (the metrics endpoint, live lines), for the samples.
    fn counters(&mut self) -> Vec<(String, f64)>;
    /// Stops the traffic and the role, and judges its counters against the other side's.
    fn finish(self: Box<Self>) -> Result<Vec<Check>>;
}

/// A background command in a lab host, its stdout and stderr in files of their own (a JSON
/// report on stdout stays apart from the live lines on stderr); killed with its process
/// group if still running when dropped.
pub(crate) struct Bg {
    pub(crate) name: String,
    child: Child,
    pub(crate) out: PathBuf,
    pub(crate) err: PathBuf,
}

impl Bg {
    pub(crate) fn spawn(host: &Host, dir: &Path, name: &str, argv: &[&str]) -> Result<Bg> {
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let child = host
            .command(argv)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .spawn()
            .with_context(|| format!("start {name}: {argv:?}"))?;
        Ok(Bg {
            name: name.to_string(),
            child,
            out,
            err,
        })
    }

    /// Wraps a child started elsewhere (with pipes of its own) that writes its stderr to
    /// `err`.
    pub(crate) fn adopt(name: &str, child: Child, err: PathBuf) -> Bg {
        Bg {
            name: name.to_string(),
            child,
            out: PathBuf::new(),
            err,
        }
    }

    /// `ip netns exec` execs the command in place: this is the tool's own pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the process group of a child we started and have not reaped.
        unsafe {
            libc::kill(-(self.child.id() as i32), sig);
        }
    }

    /// Waits up to `limit` for it to exit; then SIGKILL. Ok(true) when it exited with 0.
    pub(crate) fn wait(&mut self, limit: Duration) -> Result<bool> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st.success());
            }
            if Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                let _ = self.child.wait();
                bail!(
                    "{} still running {limit:?} after it was told to stop",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGINT (tcpkit's stop: it reports and exits), then [`Bg::wait`].
    pub(crate) fn stop(&mut self, limit: Duration) -> Result<bool> {
        self.signal(libc::SIGINT);
        self.wait(limit)
    }

    /// Its stdout as one JSON document (`--json`).
    pub(crate) fn json(&self) -> Result<serde_json::Value> {
        let s = std::fs::read_to_string(&self.out).unwrap_or_default();
        serde_json::from_str(&s).with_context(|| {
            format!(
                "{}: no JSON report on stdout; stderr ends {:?}",
                self.name,
                self.err_tail()
            )
        })
    }

    /// The last line of its stderr.
    pub(crate) fn err_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.err).unwrap_or_default();
        s.lines().last().unwrap_or_default().to_string()
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if self.running() {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A role's live counters at one sample: seconds into the run, the role, name and value.
type Counters = (f64, &'static str, Vec<(String, f64)>);

/// One sample of one process.
#[derive(Clone, Copy)]
pub(crate) struct Point {
    /// Seconds since the soak began.
    pub(crate) t: f64,
    pub(crate) rss_kib: u64,
    /// RssAnon: the heap and stacks alone, without the pages of files and shared mappings
    /// (copy's capture ring is one: VmRSS grows as the kernel writes round it the first
    /// time, to the ring's size).
    pub(crate) anon_kib: u64,
    pub(crate) fds: u64,
    pub(crate) cpu_s: f64,
}

/// VmRSS (KiB), open descriptors and utime + stime of `pid`; None once it is gone.
fn sample(pid: u32, t: f64) -> Option<Point> {
    // Until `ip netns exec` has exec'd the tool, the pid is `ip`'s: not a sample of tcpkit.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    if comm.trim_end() != "tcpkit" {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    let rss_kib = field("VmRSS:")?;
    let anon_kib = field("RssAnon:")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let (cpu_s, _) = crate::copy::usage(pid);
    Some(Point {
        t,
        rss_kib,
        anon_kib,
        fds,
        cpu_s,
    })
}

/// A process's samples, and the role it belongs to.
pub(crate) struct Series {
    pub(crate) role: &'static str,
    pub(crate) label: String,
    pub(crate) pid: u32,
    pub(crate) points: Vec<Point>,
}

/// Least-squares slope of `ys` over `xs`; None with fewer than 3 points.
fn slope(xs: &[f64], ys: &[f64]) -> Option<f64> {
    let n = xs.len() as f64;
    if xs.len() < 3 {
        return None;
    }
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

fn median_u(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The RSS bound: what the slope would add over the whole run must stay under 2 % of the
/// process's median RSS or 1 MiB, whichever is larger (KiB).
pub(crate) fn rss_bound_kib(median_kib: u64) -> f64 {
    (median_kib as f64 * 0.02).max(1024.0)
}

/// The descriptor bound: what the slope would add over the whole run must stay under 1 %
/// of the median count, 5, or half the spread of the counts (5th to 95th percentile) after
/// the warm-up, whichever is largest. A process whose descriptors come and go with its
/// traffic (a load opening a connection per request, echo's workers under churn) draws a
/// slope out of noise on short runs; a leak keeps growing past its own spread.
pub(crate) fn fd_bound(counts: &[u64]) -> f64 {
    let mut v = counts.to_vec();
    v.sort_unstable();
    let at = |q: f64| {
        v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
    };
    let spread = match (at(0.05), at(0.95)) {
        (Some(lo), Some(hi)) => (hi - lo) as f64 / 2.0,
        _ => 0.0,
    };
    (median_u(counts) as f64 * 0.01).max(5.0).max(spread)
}

/// One process's row: its figures and the two verdicts.
struct ProcRow {
    cells: Vec<String>,
    rss_met: Option<bool>,
    fd_met: Option<bool>,
}

fn proc_row(s: &Series, warm_s: f64, run_min: f64) -> ProcRow {
    let p = &s.points;
    let (first, last) = (p[0], p[p.len() - 1]);
    let after: Vec<&Point> = p.iter().filter(|x| x.t >= warm_s).collect();
    let xs: Vec<f64> = after.iter().map(|x| x.t / 60.0).collect();
    let rss: Vec<f64> = after.iter().map(|x| x.rss_kib as f64).collect();
    let fds: Vec<f64> = after.iter().map(|x| x.fds as f64).collect();
    let rss_med = median_u(&after.iter().map(|x| x.rss_kib).collect::<Vec<_>>());
    let fd_counts: Vec<u64> = after.iter().map(|x| x.fds).collect();
    let rss_slope = slope(&xs, &rss);
    let anon: Vec<f64> = after.iter().map(|x| x.anon_kib as f64).collect();
    let anon_slope = slope(&xs, &anon);
    let fd_slope = slope(&xs, &fds);
    let cpu_pct = if last.t > first.t {
        100.0 * (last.cpu_s - first.cpu_s) / (last.t - first.t)
    } else {
        f64::NAN
    };
    let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
    let max_rss = p.iter().map(|x| x.rss_kib).max().unwrap_or(0);
    let max_fd = p.iter().map(|x| x.fds).max().unwrap_or(0);
    let rss_met = rss_slope.map(|sl| sl * run_min < rss_bound_kib(rss_med));
    let fd_met = fd_slope.map(|sl| sl.abs() * run_min <= fd_bound(&fd_counts));
    let verdict = |m: Option<bool>| match m {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "too few samples",
    };
    let cells = vec![
        s.role.to_string(),
        format!("{} ({})", s.label, s.pid),
        format!(
            "{} / {} / {}",
            mib(first.rss_kib),
            mib(last.rss_kib),
            mib(max_rss)
        ),
        rss_slope.map_or("—".into(), |v| format!("{v:+.1}")),
        format!("{} ({:.0} KiB)", verdict(rss_met), rss_bound_kib(rss_med)),
        format!(
            "{} / {} ({})",
            mib(first.anon_kib),
            mib(last.anon_kib),
            anon_slope.map_or("—".into(), |v| format!("{v:+.1}"))
        ),
        format!("{} / {} / {}", first.fds, last.fds, max_fd),
        fd_slope.map_or("—".into(), |v| format!("{v:+.2}")),
        format!("{} ({:.0})", verdict(fd_met), fd_bound(&fd_counts)),
        format!("{cpu_pct:.1}"),
    ];
    ProcRow {
        cells,
        rss_met,
        fd_met,
    }
}

struct Opts {
    minutes: f64,
    sample_secs: f64,
    only: Vec<&'static str>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let num = |flag: &str, what: &str, min: f64| -> Result<Option<f64>> {
        crate::flag_value(args, flag, what)?
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= min)
                    .with_context(|| format!("{flag} {v:?}: {what} (at least {min})"))
            })
            .transpose()
    };
    let minutes = num("--minutes", "a number of minutes", 0.5)?.unwrap_or(30.0);
    let sample_secs = num("--sample-secs", "a number of seconds", 1.0)?.unwrap_or(10.0);
    let mut only = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--only" {
            let v = it.next().context("--only needs a role")?;
            let r = ROLES
                .iter()
                .find(|r| **r == v.as_str())
                .with_context(|| format!("--only {v:?}: one of {}", ROLES.join(", ")))?;
            if !only.contains(r) {
                only.push(*r);
            }
        }
    }
    if only.is_empty() {
        only = ROLES.to_vec();
    }
    if sample_secs * 3.0 > minutes * 60.0 {
        bail!("--sample-secs {sample_secs}: at most a third of the run ({minutes} min)");
    }
    Ok(Opts {
        minutes,
        sample_secs,
        only,
    })
}

pub fn soak(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    for (tool, pkg) in [
        ("/usr/sbin/nginx", "nginx-light"),
        ("/usr/bin/redis-server", "redis-server"),
    ] {
        if !Path::new(tool).exists() {
            bail!("{tool} missing (apt-get install -y {pkg})");
        }
    }
    let started = Instant::now();
    let tcpkit = crate::tcpkit_binary()?;
    let bench = std::env::current_exe()?;
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let secs = o.minutes * 60.0;
    // Warm-up: what the slopes leave out. Opening echo's 100,000 connections, nginx's and
    // the kernel's buffers and the allocators' first arenas all grow early and then stay.
    let warm_s = (secs / 3.0).min(300.0);
    let mut roles: Vec<Box<dyn Role>> = Vec::new();
    for r in &o.only {
        eprintln!("soak: starting {r} ...");
        let role: Box<dyn Role> = match *r {
            "copy" => Box::new(roles::CopyRole::start(&tcpkit, secs)?),
            "echo" => Box::new(roles::EchoRole::start(&tcpkit, secs)?),
            "balance" => Box::new(roles::BalanceRole::start(&tcpkit, &bench, secs)?),
            _ => Box::new(roles::MpcatRole::start(&tcpkit, secs)?),
        };
        roles.push(role);
    }
    eprintln!(
        "soak: {} running for {:.1} min, sampled every {} s (set-up took {:.0} s)",
        o.only.join(", "),
        o.minutes,
        o.sample_secs,
        started.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    let mut series: Vec<Series> = Vec::new();
    let mut counters: Vec<Counters> = Vec::new();
    let mut next_sample = 0.0;
    let mut next_tick = 0.0;
    loop {
        let t = t0.elapsed().as_secs_f64();
        if t >= next_tick {
            for r in roles.iter_mut() {
                r.tick(t)
                    .with_context(|| format!("{} at {t:.0} s", r.name()))?;
            }
            next_tick += 1.0;
        }
        if t >= next_sample || t >= secs {
            for r in roles.iter_mut() {
                let name = r.name();
                for (label, pid) in r.procs() {
                    let Some(pt) = sample(pid, t) else { continue };
                    match series.iter_mut().find(|s| s.role == name && s.pid == pid) {
                        Some(s) => s.points.push(pt),
                        None => series.push(Series {
                            role: name,
                            label,
                            pid,
                            points: vec![pt],
                        }),
                    }
                }
                counters.push((t, name, r.counters()));
            }
            eprintln!("soak: {t:.0} s: {}", live_line(&series, t));
            next_sample += o.sample_secs;
        }
        if t >= secs {
            break;
        }
        let wake = next_tick.min(next_sample).min(secs);
        std::thread::sleep(Duration::from_secs_f64((wake - t).clamp(0.01, 1.0)));
    }
    let mut checks: Vec<(&'static str, Check)> = Vec::new();
    for r in roles {
        let name = r.name();
        eprintln!("soak: stopping {name} ...");
        match r.finish() {
            Ok(cs) => checks.extend(cs.into_iter().map(|c| (name, c))),
            Err(e) => checks.push((
                name,
                Check {
                    target: "the role ended and reported".into(),
                    figures: format!("{e:#}"),
                    bound: "—".into(),
                    met: false,
                },
            )),
        }
    }
    // The machine's load at the end too: on a shared machine it tells how much of the CPU
    // the roles had.
    let loadavg = format!(
        "{} (at the end: {})",
        first3(&loadavg),
        first3(&std::fs::read_to_string("/proc/loadavg").unwrap_or_default())
    );
    let date = crate::today();
    let svg_name = format!("soak-{date}.svg");
    let md = document(
        &o, args, &loadavg, warm_s, &series, &checks, &counters, &svg_name,
    );
    println!("{md}");
    let dir = crate::results_dir();
    let md_path = crate::free_name(&dir, "soak", &date);
    // The picture and the samples take the table's name, whatever suffix a second run gave.
    let stem = md_path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("soak")
        .to_string();
    let md = md.replace(&svg_name, &format!("{stem}.svg"));
    std::fs::write(dir.join(format!("{stem}.svg")), plot::svg(&series, warm_s)?)?;
    std::fs::write(dir.join(format!("{stem}.csv")), csv(&series, &counters))?;
    std::fs::write(&md_path, &md).with_context(|| format!("write {}", md_path.display()))?;
    eprintln!(
        "wrote {} (+ .svg, .csv) ({:.0} s)",
        md_path.display(),
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<String> = checks
        .iter()
        .filter(|(_, c)| !c.met)
        .map(|(r, c)| format!("{r}: {}", c.target))
        .collect();
    if !failed.is_empty() {
        bail!("targets not met: {}", failed.join("; "));
    }
    Ok(())
}

/// The 1, 5 and 15 minute figures of /proc/loadavg.
fn first3(loadavg: &str) -> String {
    loadavg
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The progress line: each role's summed RSS and descriptors at the latest sample.
fn live_line(series: &[Series], t: f64) -> String {
    let mut by: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for s in series {
        if let Some(p) = s.points.last().filter(|p| p.t == t) {
            let e = by.entry(s.role).or_default();
            e.0 += p.rss_kib;
            e.1 += p.fds;
        }
    }
    by.iter()
        .map(|(r, (k, f))| format!("{r} {:.0} MiB {f} fds", *k as f64 / 1024.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn csv(series: &[Series], counters: &[Counters]) -> String {
    let mut s = String::from("t_s,role,process,pid,rss_kib,anon_kib,fds,cpu_s\n");
    for x in series {
        for p in &x.points {
            let _ = writeln!(
                s,
                "{:.1},{},{},{},{},{},{},{:.2}",
                p.t, x.role, x.label, x.pid, p.rss_kib, p.anon_kib, p.fds, p.cpu_s
            );
        }
    }
    s.push_str("\nt_s,role,counter,value\n");
    for (t, role, cs) in counters {
        for (k, v) in cs {
            let _ = writeln!(s, "{t:.1},{role},{k},{v}");
        }
    }
    s
}

#[expect(
    clippy::too_many_arguments,
    reason = "one document from every part of the run"
)]
fn document(
    o: &Opts,
    args: &[String],
    loadavg: &str,
    warm_s: f64,
    series: &[Series],
    checks: &[(&'static str, Check)],
    counters: &[Counters],
    svg_name: &str,
) -> String {
    let mut md = String::new();
    let run_min = o.minutes;
    let _ = writeln!(
        md,
        "# soak: {} for {run_min} min, sampled every {} s\n",
        o.only.join(", "),
        o.sample_secs
    );
    let _ = writeln!(
        md,
        "{} · `cargo run --release -p tcpkit-bench -- soak {}` · load average at start {}\n",
        crate::today(),
        args.join(" "),
        loadavg
    );
    let _ = writeln!(
        md,
        "Slopes are least squares over the samples after a warm-up of {warm_s:.0} s (a third of \
         the run, at most 5 min). RSS bound: the slope × the run's length ({run_min} min) < 2 % of \
         the process's median RSS or 1 MiB, whichever is larger. Descriptors flat: |slope| × the \
         run's length ≤ 1 % of the median count, 5, or half the 5th-95th percentile spread of the \
         counts after the warm-up, whichever is largest. CPU % is utime + stime \
         over the run (100 % = one core). RssAnon (heap and stacks, without file and shared pages \
         such as copy's capture ring) is shown beside VmRSS to tell a heap that grows from pages mapped \
         once.\n\n![RSS and descriptors over time]({svg_name})\n"
    );
    md.push_str(
        "| role | process (pid) | RSS first / last / max (MiB) | RSS slope (KiB/min) | RSS verdict (bound) | RssAnon first / last (MiB) (slope, KiB/min) | fds first / last / max | fd slope (/min) | fd verdict (bound) | CPU % |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut bad = Vec::new();
    for s in series {
        let r = proc_row(s, warm_s, run_min);
        let _ = writeln!(md, "| {} |", r.cells.join(" | "));
        if r.rss_met == Some(false) {
            bad.push(format!("{} {}: RSS grows", s.role, s.label));
        }
        if r.fd_met == Some(false) {
            bad.push(format!("{} {}: descriptors not flat", s.role, s.label));
        }
    }
    md.push_str("\n| role | target | figures | bound | verdict |\n|---|---|---|---|---|\n");
    for (role, c) in checks {
        let _ = writeln!(
            md,
            "| {role} | {} | {} | {} | {} |",
            c.target,
            c.figures.replace('|', "/").replace('\n', " "),
            c.bound,
            if c.met { "met" } else { "**not met**" }
        );
    }
    md.push_str("\nThe roles' live counters at the last sample:\n\n");
    for role in &o.only {
        if let Some((t, _, cs)) = counters.iter().rev().find(|(_, r, _)| r == role) {
            let cells: Vec<String> = cs.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(md, "- {role} at {t:.0} s: {}", cells.join(", "));
        }
    }
    if !bad.is_empty() {
        let _ = writeln!(md, "\nNot met: {}", bad.join("; "));
    }
    md
}

/// The hidden `soak-connect ADDR RATE THREADS CGROUP`: the balance role's client, run in
/// balance's cgroup: connect + PING + close at RATE a second over THREADS threads until
/// SIGINT. Prints `LIVE made failed` every second, `FAIL unix_ms why` for each failure, and
/// `DONE made failed` at the end.
pub fn connect_client(args: &[String]) -> Result<()> {
    roles::connect_client(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_too_little() {
        let xs = [0.0, 1.0, 2.0, 3.0];
        let ys = [10.0, 12.0, 14.0, 16.0];
        assert!((slope(&xs, &ys).unwrap() - 2.0).abs() < 1e-9);
        assert!(slope(&xs[..2], &ys[..2]).is_none());
        assert_eq!(slope(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), None);
    }

    #[test]
    fn bounds_take_the_larger() {
        assert_eq!(rss_bound_kib(10_000), 1024.0);
        assert_eq!(rss_bound_kib(1_000_000), 20_000.0);
        assert_eq!(fd_bound(&[100; 9]), 5.0);
        assert_eq!(fd_bound(&[20_000; 9]), 200.0);
        // Counts that come and go by 60 around 40: half their spread.
        assert_eq!(fd_bound(&[10, 70, 10, 70, 10, 70, 10, 70, 10, 70]), 30.0);
    }

    #[test]
    fn a_growing_process_fails_and_a_flat_one_passes() {
        let mk = |grow: u64| Series {
            role: "echo",
            label: "echo".into(),
            pid: 1,
            points: (0..30)
                .map(|i| Point {
                    t: i as f64 * 10.0,
                    rss_kib: 50_000 + grow * i,
                    anon_kib: 40_000 + grow * i,
                    fds: 100,
                    cpu_s: i as f64,
                })
                .collect(),
        };
        // 5 min; 1 MiB bound: 2 KiB per 10 s is 12 KiB/min, 60 KiB in all.
        let flat = proc_row(&mk(2), 100.0, 5.0);
        assert_eq!((flat.rss_met, flat.fd_met), (Some(true), Some(true)));
        // 50 KiB per 10 s is 1.5 MiB over the run.
        let leak = proc_row(&mk(50), 100.0, 5.0);
        assert_eq!(leak.rss_met, Some(false));
        assert_eq!(leak.cells[9], "10.0");
    }

    #[test]
    fn only_takes_roles_and_repeats() {
        let a = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        let o = parse(&a(&[
            "--only",
            "echo",
            "--only",
            "mpcat",
            "--only",
            "echo",
            "--minutes",
            "2",
        ]))
        .unwrap();
        assert_eq!(o.only, vec!["echo", "mpcat"]);
        assert_eq!(o.minutes, 2.0);
        assert_eq!(parse(&a(&[])).unwrap().only.len(), 4);
        assert!(parse(&a(&["--only", "replay"])).is_err());
        assert!(parse(&a(&["--minutes", "0"])).is_err());
        assert!(parse(&a(&["--minutes", "1", "--sample-secs", "30"])).is_err());
    }
}
