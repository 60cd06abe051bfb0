//! `tcpkit-bench copy`: `tcpkit copy` on an online nginx under load, copied to a target nginx
//! in relay mode, in transparent mode with intercept on an assistant, and in transparent mode
//! with intercept on the target itself, in a lab of clients → online → target (→ assistant).
//! For each mode, rate (1k, 5k, 20k req/s) and kind of traffic (keep-alive, a new connection per request), one run without
//! the copy and one with it: request loss ratio from the two access logs, the copy's CPU and
//! peak RSS, and the online server's latency as the clients see it with and without the copy.
//! The rates come from `tcpkit load --http-get` (open loop, latency from the intended send
//! time): Debian's wrk has no fixed-rate mode and cannot open a connection per request. One
//! more row runs wrk (keep-alive, as fast as it goes) the way tcpcopy's figures were taken
//! with ab -k. tcpcopy is not packaged in Debian; its figures from the issue are printed
//! beside ours for reference. Prints one table and writes it to bench/results/copy-DATE.md.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tcpkit_lab::{CertKey, Host, Lab, Proc};
use tcpkit_pcap::CaptureFile;
use tcpkit_wire::tcp::Segment;

mod lab;
pub(crate) use lab::{copy_lab, CopyLab};

pub(crate) const CLIENT: &str = "198.18.1.1";
pub(crate) const ONLINE: &str = "198.18.1.2";
pub(crate) const ONLINE_T: &str = "198.18.2.1";
pub(crate) const TARGET: &str = "198.18.2.2";
const NGINX: &str = "/usr/sbin/nginx";
/// Seconds of load per run.
pub(crate) const RUN_S: f64 = 5.0;
/// The copy captures this long past the load: when the CPUs run short its copies fall behind
/// the capture, and what is still in flight when it stops is not copied (open at end).
pub(crate) const COPY_TAIL_S: f64 = 2.0;

pub(crate) struct Env {
    pub(crate) tcpkit: PathBuf,
    pub(crate) cli: Host,
    pub(crate) onl: Host,
    pub(crate) tgt: Host,
    pub(crate) cap_if: String,
    /// The copy host's receive threads (see `copy`): toward the target and toward intercept.
    copy_rx: Vec<u32>,
    /// Every end of the links with receive threads: a full receive queue there drops.
    rx_ifaces: Vec<(Host, String)>,
    pub(crate) on_log: PathBuf,
    pub(crate) tg_log: PathBuf,
    /// intercept's control address on the assistant (transparent mode).
    pub(crate) intercept: String,
    /// intercept's control address on the target itself (--on-target rows).
    intercept_on_target: String,
}

/// How the copy reaches the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Ordinary TCP connections from the online host.
    Relay,
    /// The clients' own addresses through a raw socket; answers caught by intercept.
    Transparent,
    /// Transparent, with intercept on the target itself (`--on-target`: a netfilter queue
    /// rule there) instead of on an assistant.
    OnTarget,
}

/// Target ↔ assistant, and online ↔ assistant (the copy's control connection to intercept).
const TGT_A: &str = "198.18.3.1";
const ASSIST: &str = "198.18.3.2";
const ONLINE_M: &str = "198.18.4.1";
const ASSIST_M: &str = "198.18.4.2";
const INTERCEPT_PORT: u16 = 7878;

/// nginx on `ip`:8080 serving a 612-byte /index.html (nginx's own page size), one access-log
/// line per request, with enough connections and workers for 20k new connections a second;
/// with `tls`, HTTPS on `ip`:8443 with that certificate instead (TLS 1.2 and 1.3, tickets
/// and a session cache as a production server has them).
pub(crate) fn nginx(
    lab: &mut Lab,
    host: &Host,
    ip: &str,
    name: &str,
    tls: Option<&CertKey>,
) -> Result<(Proc, PathBuf)> {
    let d = lab.dir().join(format!("nginx-{name}"));
    std::fs::create_dir_all(d.join("www"))?;
    std::fs::write(d.join("www/index.html"), vec![b'x'; 612])?;
    let log = d.join("access.log");
    let conf = d.join("nginx.conf");
    let (port, listen) = match tls {
        Some(c) => (
            8443,
            format!(
                "{ip}:8443 ssl backlog=4096 reuseport; ssl_certificate {}; ssl_certificate_key {};\n\
                 ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:b:10m; ssl_session_tickets on",
                c.cert.display(),
                c.key.display()
            ),
        ),
        None => (8080, format!("{ip}:8080 backlog=4096 reuseport")),
    };
    std::fs::write(
        &conf,
        format!(
            "user root; daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\n\
             worker_rlimit_nofile 65536; events {{ worker_connections 16384; }}\n\
             http {{ log_format t '$remote_addr $status'; access_log {l} t buffer=64k flush=100ms;\n\
               keepalive_requests 1000000; client_body_temp_path {d}; proxy_temp_path {d};\n\
               fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n\
               server {{ listen {listen}; root {d}/www; }} }}\n",
            d = d.display(),
            l = log.display(),
        ),
    )?;
    let p = host.spawn(
        lab,
        &format!("nginx-{name}"),
        &[NGINX, "-c", conf.to_str().unwrap_or_default()],
    )?;
    let addr = format!("{ip}:{port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host
        .enter(|| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
    {
        if Instant::now() > deadline {
            bail!("nginx-{name} never listened: {}", p.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((p, log))
}

pub(crate) fn log_lines(p: &Path) -> u64 {
    std::fs::read(p)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count() as u64)
        .unwrap_or(0)
}

/// Packets the receive-thread links dropped so far (a receive queue full while the CPUs are
/// short), both directions of every end.
fn rx_drops(env: &Env) -> u64 {
    env.rx_ifaces
        .iter()
        .filter_map(|(h, i)| h.ifstats(i).ok())
        .map(|s| s.rx_dropped + s.tx_dropped)
        .sum()
}

/// The copy's failed sessions by cause, those that are not zero.
pub(crate) fn failed_causes(report: &serde_json::Value) -> String {
    report["sessions"]["failed"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|s| !s.is_empty())
        .map(|s| format!("failed: {s}"))
        .unwrap_or_default()
}

/// Nanoseconds a thread has run, from its scheduler statistics file.
fn run_ns(schedstat: &str) -> Option<u64> {
    std::fs::read_to_string(schedstat)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Seconds the threads `pids` have run, from the scheduler.
fn on_cpu(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|p| run_ns(&format!("/proc/{p}/schedstat")))
        .sum::<u64>() as f64
        / 1e9
}

/// Seconds every live thread of process `pid` has run, from the scheduler (exact: the
/// counter wait4's rusage reports at the end, where /proc/PID/stat's are whole ticks).
pub(crate) fn threads_on_cpu(pid: u32) -> f64 {
    let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.iter()
        .filter_map(|t| run_ns(&format!("/proc/{pid}/task/{t}/schedstat")))
        .sum::<u64>() as f64
        / 1e9
}

/// User + system CPU seconds and peak RSS (KiB) of a live process.
pub(crate) fn usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ticks: u64 = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse::<u64>().ok())
        .sum();
    let hwm = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks as f64 / hz, hwm)
}

#[derive(Default, Clone)]
pub(crate) struct Load {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) note: String,
}

/// A tcpdump of the online server's clients' link, buffered (no `-U`, no immediate mode, as
/// the lab's exact-capture tcpdump has): a write per packet cost the 2 CPUs so much that the
/// load generator fell behind with no copy running. Headers only.
fn wire_dump(env: &Env, lab: &mut Lab, tag: &str) -> Result<(Proc, PathBuf)> {
    let path = lab.dir().join(format!("wire-{tag}.pcap"));
    let file = path.to_str().context("lab path")?.to_string();
    let p = env.onl.spawn(
        lab,
        &format!("tcpdump-{tag}"),
        &[
            "tcpdump",
            "-i",
            &env.cap_if,
            "-w",
            &file,
            "-s",
            "128",
            "-nn",
            "--time-stamp-precision",
            "nano",
            "-B",
            "65536",
            "tcp port 8080",
        ],
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.log().contains("listening on") {
        if Instant::now() > deadline || p.try_status()?.is_some() {
            bail!("tcpdump did not start: {}", p.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((p, path))
}

/// Stops a [`wire_dump`] and reads the online server's latency from it: per connection, from
/// a request's first segment to its answer's first. None when tcpdump dropped packets.
fn wire_stop(p: Proc, path: &Path) -> Result<Option<(f64, f64)>> {
    p.stop()?;
    let dropped: u64 = p
        .log()
        .lines()
        .find_map(|l| l.strip_suffix(" packets dropped by kernel"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    if dropped > 0 {
        return Ok(None);
    }
    let f = CaptureFile::open(path)?;
    let mut pending: HashMap<(SocketAddr, SocketAddr), u64> = HashMap::new();
    let mut lat = Vec::new();
    for pkt in f.packets() {
        let pkt = pkt?;
        let Ok(seg) = Segment::parse(pkt.data) else {
            continue;
        };
        if seg.payload_len == 0 {
            continue;
        }
        if seg.dst.port() == 8080 {
            pending.entry((seg.src, seg.dst)).or_insert(pkt.ts_ns);
        } else if let Some(t0) = pending.remove(&(seg.dst, seg.src)) {
            lat.push(pkt.ts_ns.saturating_sub(t0));
        }
    }
    drop(f);
    let _ = std::fs::remove_file(path);
    lat.sort_unstable();
    let pct = |q: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * q).round() as usize)
            .map_or(f64::NAN, |&v| v as f64 / 1e3)
    };
    Ok((!lat.is_empty()).then(|| (pct(0.5), pct(0.99))))
}

/// `tcpkit intercept` in `host` listening on `listen` with `how` (where and how it catches
/// the target's answers); returns once its control port accepts.
pub(crate) fn start_intercept(
    env: &Env,
    lab: &mut Lab,
    host: &Host,
    listen: &str,
    how: &[&str],
) -> Result<Proc> {
    let tk = env.tcpkit.to_str().unwrap_or_default();
    let mut argv = vec![tk, "intercept", "--listen", listen];
    argv.extend_from_slice(how);
    let p = host.spawn(lab, &format!("intercept-{}", host.name()), &argv)?;
    let addr: SocketAddr = listen.parse()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host
        .enter(|| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
    {
        if Instant::now() > deadline || p.try_status()?.is_some() {
            bail!("intercept never listened: {}", p.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(p)
}

/// `tcpkit load` at `rate` for RUN_S against the online nginx.
fn load(env: &Env, rate: u32, new_conn: bool) -> Result<Load> {
    load_to(env, &format!("{ONLINE}:8080"), rate, new_conn, &[], None)
}

/// `tcpkit load` at `rate` for RUN_S against `target` (`IP:PORT`, or an https:// URL), with
/// `extra` flags; `keylog`: the file its TLS secrets are written to (SSLKEYLOGFILE).
pub(crate) fn load_to(
    env: &Env,
    target: &str,
    rate: u32,
    new_conn: bool,
    extra: &[&str],
    keylog: Option<&Path>,
) -> Result<Load> {
    let conns = if new_conn {
        64
    } else {
        (rate / 500).clamp(4, 40)
    };
    let (r, c, t) = (rate.to_string(), conns.to_string(), RUN_S.to_string());
    let tk = env.tcpkit.to_str().unwrap_or_default();
    let get: &[&str] = if target.starts_with("https://") {
        &[]
    } else {
        &["--http-get", "/index.html"]
    };
    let mut argv = vec![tk, "load", target];
    argv.extend_from_slice(get);
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&["-r", &r, "-c", &c, "-t", &t, "--json"]);
    // Reopening is paced by --connect-rate (1000/s by default): as fast as the queries here.
    let reopen = (rate + rate / 5).to_string();
    if new_conn {
        argv.extend_from_slice(&["--queries-per-conn", "1", "--connect-rate", &reopen]);
    }
    let mut cmd = env.cli.command(&argv);
    if let Some(k) = keylog {
        cmd.env("SSLKEYLOGFILE", k);
    }
    let o = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .context("run tcpkit load")?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .with_context(|| format!("tcpkit load: {}", String::from_utf8_lossy(&o.stderr)))?;
    let us = |k: &str| v["latency"][k].as_f64().unwrap_or(0.0) / 1e3;
    Ok(Load {
        p50_us: us("p50_ns"),
        p99_us: us("p99_ns"),
        note: v["failure"].as_str().unwrap_or_default().to_string(),
    })
}

/// `tcpkit copy` on the online host until `secs`; returns once its capture is up.
fn start_copy(env: &Env, bin: &Path, secs: f64, mode: Mode) -> Result<Child> {
    let rule = format!("8080-{TARGET}:8080");
    let d = secs.to_string();
    let tk = bin.to_str().unwrap_or_default();
    let mut argv = vec![
        tk,
        "copy",
        "-x",
        &rule,
        "-i",
        &env.cap_if,
        "--duration",
        &d,
        "--json",
    ];
    match mode {
        Mode::Relay => {}
        Mode::Transparent => {
            argv.extend_from_slice(&["--transparent", "--intercept", &env.intercept]);
        }
        Mode::OnTarget => {
            argv.extend_from_slice(&["--transparent", "--intercept", &env.intercept_on_target]);
        }
    }
    // The ring and filter are in place well within this; the copy logs nothing before.
    spawn_copy(env, &argv, Duration::from_millis(400))
}

/// Starts `argv` (a tcpkit copy) on the online host, its output piped, and gives it `settle`
/// to set up.
pub(crate) fn spawn_copy(env: &Env, argv: &[&str], settle: Duration) -> Result<Child> {
    let child = env
        .onl
        .command(argv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start tcpkit copy")?;
    std::thread::sleep(settle);
    Ok(child)
}

struct Row {
    what: String,
    asked: String,
    online: u64,
    target: u64,
    cpu_pct: f64,
    /// The copy's CPU per request it copied (µs).
    cpu_per_req_us: Option<f64>,
    /// The copy host's receive path for the copy's traffic (% of a core).
    rx_pct: f64,
    rss_mb: f64,
    /// The copy's failed sessions by cause, and packets the lab's receive queues dropped.
    failed: String,
    base: Load,
    with: Load,
    /// The online server's latency on its wire (p50, p99 µs): no copy, and copying.
    wire: [Option<(f64, f64)>; 2],
    /// Transparent mode: intercept's CPU (% of a core) while copying, and its peak RSS (MB).
    intercept: Option<(f64, f64)>,
    /// Copies still open when the copy's drain ended.
    open_at_end: u64,
    /// The copy failed its run (exit 1: loss over --max-loss): why, as it said.
    error: Option<String>,
}

/// A copy that ended: its report, why it failed (exit 1) when it did, and all the CPU it used.
pub(crate) struct Finished {
    pub(crate) report: serde_json::Value,
    pub(crate) error: Option<String>,
    /// User + system seconds over the copy's whole life, from wait4(2)'s rusage (exact,
    /// where /proc's are whole ticks).
    pub(crate) cpu_s: f64,
}

/// Waits for a copy and returns its JSON report, and why the copy failed (exit 1) when it
/// did: a failed run's report still holds its figures, which an A/B row shows for both builds.
pub(crate) fn copy_report_kept(copy: Child) -> Result<Finished> {
    let (o, cpu_s) = wait_with_cpu(copy).context("wait for tcpkit copy")?;
    if !o.status.success() {
        // The report says where the copies stood (sessions, transparent mode's counters).
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let why = format!(
            "tcpkit copy: {}sessions {} requests {} transparent {}",
            String::from_utf8_lossy(&o.stderr),
            r["sessions"],
            r["requests"],
            r["transparent"]
        );
        if r["requests"].is_object() && o.status.code() == Some(1) {
            return Ok(Finished {
                report: r,
                error: Some(why),
                cpu_s,
            });
        }
        bail!("{why}");
    }
    let report = serde_json::from_slice(&o.stdout).context("tcpkit copy --json")?;
    Ok(Finished {
        report,
        error: None,
        cpu_s,
    })
}

/// `Child::wait_with_output`, and the child's user + system CPU seconds from wait4(2).
/// `ip netns exec` execs the command, so the child is the copy itself.
fn wait_with_cpu(mut child: Child) -> std::io::Result<(std::process::Output, f64)> {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let drain = |p: Option<Box<dyn Read + Send>>| {
        let mut v = Vec::new();
        if let Some(mut p) = p {
            let _ = p.read_to_end(&mut v);
        }
        v
    };
    let (stdout, stderr) = std::thread::scope(|s| {
        let e = s.spawn(|| drain(err.map(|e| Box::new(e) as Box<dyn Read + Send>)));
        let o = drain(out.map(|o| Box::new(o) as Box<dyn Read + Send>));
        (o, e.join().unwrap_or_default())
    });
    let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it and `status`, which live across the call.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: as above; `pid` is our own unreaped child.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = secs(ru.ru_utime) + secs(ru.ru_stime);
    let status = std::process::ExitStatus::from_raw(status);
    Ok((
        std::process::Output {
            status,
            stdout,
            stderr,
        },
        cpu,
    ))
}

impl Row {
    fn loss_pct(&self) -> f64 {
        if self.online == 0 {
            0.0
        } else {
            self.online.saturating_sub(self.target) as f64 * 100.0 / self.online as f64
        }
    }
}

/// One rate and kind: without the copy, then with it.
/// The online server's latency on its wire, with no copy and with one: two more runs, each
/// under a tcpdump, kept apart from the runs that give the loss, the copy's CPU and the
/// clients' view (a tcpdump costs these 2 CPUs enough to move those).
fn wire_pair(
    env: &Env,
    bin: &Path,
    lab: &mut Lab,
    rate: u32,
    new_conn: bool,
    mode: Mode,
) -> Result<[Option<(f64, f64)>; 2]> {
    let tag = format!("{}-{rate}-{mode:?}", if new_conn { "new" } else { "ka" });
    let (dump, path) = wire_dump(env, lab, &format!("{tag}-base"))?;
    load(env, rate, new_conn)?;
    let base = wire_stop(dump, &path)?;
    std::thread::sleep(Duration::from_millis(300));
    let (dump, path) = wire_dump(env, lab, &format!("{tag}-copy"))?;
    let copy = start_copy(env, bin, RUN_S + COPY_TAIL_S, mode)?;
    load(env, rate, new_conn)?;
    // A copy over its --max-loss still gives the server's latency beside it.
    copy_report_kept(copy)?;
    let with = wire_stop(dump, &path)?;
    std::thread::sleep(Duration::from_millis(300));
    Ok([base, with])
}

/// One row with the copy `bin`; a copy that failed its run (loss over --max-loss) still gives
/// the row, with `error` set.
fn scenario(
    env: &Env,
    bin: &Path,
    lab: &mut Lab,
    rate: u32,
    new_conn: bool,
    mode: Mode,
    intercept: Option<&Proc>,
) -> Result<Row> {
    let wire = wire_pair(env, bin, lab, rate, new_conn, mode)?;
    let base = load(env, rate, new_conn)?;
    std::thread::sleep(Duration::from_millis(300));
    let (on0, tg0) = (log_lines(&env.on_log), log_lines(&env.tg_log));
    let copy = start_copy(env, bin, RUN_S + COPY_TAIL_S, mode)?;
    let pid = copy.id();
    let (cpu0, _) = usage(pid);
    let life0 = threads_on_cpu(pid);
    let rx0 = on_cpu(&env.copy_rx);
    let drops0 = rx_drops(env);
    let icpu0 = intercept.map(|p| usage(p.pid()).0);
    let t0 = Instant::now();
    let with = load(env, rate, new_conn)?;
    let (cpu1, hwm) = usage(pid);
    let rx1 = on_cpu(&env.copy_rx);
    let secs = t0.elapsed().as_secs_f64();
    let intercept = intercept.zip(icpu0).map(|(p, c0)| {
        let (c1, ihwm) = usage(p.pid());
        ((c1 - c0) * 100.0 / secs, ihwm as f64 / 1024.0)
    });
    let Finished {
        report,
        error,
        cpu_s,
    } = copy_report_kept(copy)?;
    let copied = report["requests"]["copied"].as_u64().unwrap_or(0);
    let drops = rx_drops(env) - drops0;
    let mut why = vec![failed_causes(&report)];
    let open = report["sessions"]["open_at_end"].as_u64().unwrap_or(0);
    if open > 0 {
        why.push(format!("open at end {open}"));
    }
    if drops > 0 {
        why.push(format!(
            "{drops} packets dropped by full receive queues (TCP resends them)"
        ));
    }
    why.retain(|w| !w.is_empty());
    let why = why.join("; ");
    // nginx flushes its access log every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    Ok(Row {
        what: row_label(new_conn, mode),
        asked: format!("{}k", rate / 1000),
        online: log_lines(&env.on_log) - on0,
        target: log_lines(&env.tg_log) - tg0,
        cpu_pct: (cpu1 - cpu0) * 100.0 / secs,
        cpu_per_req_us: (copied > 0).then(|| (cpu_s - life0) * 1e6 / copied as f64),
        rx_pct: (rx1 - rx0) * 100.0 / secs,
        rss_mb: hwm as f64 / 1024.0,
        failed: why,
        base,
        with,
        wire,
        intercept,
        open_at_end: open,
        error,
    })
}

/// wrk, keep-alive, as fast as it goes for RUN_S with 2 threads and 50 connections, copied
/// by `bin`.
fn wrk_row(env: &Env, bin: &Path) -> Result<Row> {
    let url = format!("http://{ONLINE}:8080/index.html");
    let d = format!("{}s", RUN_S as u32);
    let (on0, tg0) = (log_lines(&env.on_log), log_lines(&env.tg_log));
    let copy = start_copy(env, bin, RUN_S + COPY_TAIL_S, Mode::Relay)?;
    let pid = copy.id();
    let (cpu0, _) = usage(pid);
    let life0 = threads_on_cpu(pid);
    let rx0 = on_cpu(&env.copy_rx);
    let t0 = Instant::now();
    let o = env
        .cli
        .command(&["wrk", "-t2", "-c50", "-d", &d, "--latency", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .context("run wrk (apt-get install -y wrk)")?;
    let (cpu1, hwm) = usage(pid);
    let rx1 = on_cpu(&env.copy_rx);
    let secs = t0.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let Finished {
        report,
        error,
        cpu_s,
    } = copy_report_kept(copy)?;
    if let Some(why) = error {
        bail!("{why}");
    }
    let copied = report["requests"]["copied"].as_u64().unwrap_or(0);
    std::thread::sleep(Duration::from_millis(300));
    let lat = |q: &str| -> f64 {
        text.lines()
            .find(|l| l.trim_start().starts_with(q))
            .and_then(|l| l.split_whitespace().nth(1))
            .map_or(0.0, |v| {
                let (n, mult) = if let Some(x) = v.strip_suffix("us") {
                    (x, 1.0)
                } else if let Some(x) = v.strip_suffix("ms") {
                    (x, 1e3)
                } else if let Some(x) = v.strip_suffix('s') {
                    (x, 1e6)
                } else {
                    (v, 1.0)
                };
                n.parse::<f64>().unwrap_or(0.0) * mult
            })
    };
    let online = log_lines(&env.on_log) - on0;
    Ok(Row {
        what: "keep-alive, wrk -t2 -c50 (max rate)".into(),
        asked: format!("{:.1}k", online as f64 / RUN_S / 1000.0),
        online,
        target: log_lines(&env.tg_log) - tg0,
        cpu_pct: (cpu1 - cpu0) * 100.0 / secs,
        cpu_per_req_us: (copied > 0).then(|| (cpu_s - life0) * 1e6 / copied as f64),
        rx_pct: (rx1 - rx0) * 100.0 / secs,
        rss_mb: hwm as f64 / 1024.0,
        failed: failed_causes(&report),
        base: Load::default(),
        with: Load {
            p50_us: lat("50%"),
            p99_us: lat("99%"),
            note: String::new(),
        },
        wire: [None, None],
        intercept: None,
        open_at_end: report["sessions"]["open_at_end"].as_u64().unwrap_or(0),
        error: None,
    })
}

/// Which rows to run: all, or (`--only MODE[:TRAFFIC[:RATE]]`, MODE relay|transparent|on-target,
/// TRAFFIC keep-alive|new) a few, to look into one; such a run prints its table and writes no
/// results file.
struct Only {
    mode: Option<Mode>,
    new_conn: Option<bool>,
    rate: Option<u32>,
}

impl Only {
    fn parse(args: &[String]) -> Result<Option<Only>> {
        let Some(spec) = args
            .iter()
            .position(|a| a == "--only")
            .map(|i| {
                args.get(i + 1)
                    .context("--only needs MODE[:TRAFFIC[:RATE]]")
            })
            .transpose()?
        else {
            return Ok(None);
        };
        let mut parts = spec.split(':');
        let mode = match parts.next() {
            Some("relay") => Mode::Relay,
            Some("transparent") => Mode::Transparent,
            Some("on-target") => Mode::OnTarget,
            m => bail!("--only: mode {m:?}: relay, transparent or on-target"),
        };
        let new_conn = match parts.next() {
            None => None,
            Some("keep-alive") => Some(false),
            Some("new") => Some(true),
            Some(t) => bail!("--only: traffic {t:?}: keep-alive or new"),
        };
        let rate = parts
            .next()
            .map(|r| {
                r.parse::<u32>()
                    .with_context(|| format!("--only: rate {r:?}"))
            })
            .transpose()?;
        Ok(Some(Only {
            mode: Some(mode),
            new_conn,
            rate,
        }))
    }

    fn wants(o: &Option<Only>, mode: Mode, new_conn: bool, rate: u32) -> bool {
        o.as_ref().is_none_or(|o| {
            o.mode.is_none_or(|m| m == mode)
                && o.new_conn.is_none_or(|n| n == new_conn)
                && o.rate.is_none_or(|r| r == rate)
        })
    }
}

pub fn copy(args: &[String]) -> Result<()> {
    let only = Only::parse(args)?;
    // Issue 27's TLS rows alone.
    let tls_only = args.iter().any(|a| a == "--tls-only");
    if tls_only && (only.is_some() || args.iter().any(|a| a == "--against")) {
        bail!("--tls-only: not with --only or --against (the TLS rows run with this build alone)");
    }
    let started = Instant::now();
    if !Path::new(NGINX).exists() {
        bail!("{NGINX} missing (apt-get install -y nginx-light)");
    }
    let tcpkit = crate::tcpkit_binary()?;
    let against = crate::Against::parse(args, &tcpkit)?;
    let runs = match crate::flag_value(args, "--runs", "a number of runs")? {
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .with_context(|| format!("--runs {v:?}: a whole number from 1"))?,
        None => 1,
    };
    if runs > 1 && against.is_none() {
        bail!("--runs: only with --against PATH (it repeats each build's run of a row)");
    }
    // The old build, and which of the flags the bench passes its copy it lacks.
    let against_env = match &against {
        Some(a) => Some((
            a.bin.clone(),
            crate::missing_flags(&a.bin, "copy", mode_flags(Mode::Transparent))?,
        )),
        None => None,
    };
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let CopyLab {
        mut lab,
        env,
        ast,
        ast_if,
        online_nginx: on,
        target_nginx: _tg,
    } = copy_lab("bcopy", tcpkit)?;
    let mut rows = Vec::new();
    let mut ab_rows: Vec<AbRow> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    for mode in [Mode::Relay, Mode::Transparent, Mode::OnTarget] {
        if tls_only || only.as_ref().is_some_and(|o| o.mode != Some(mode)) {
            continue;
        }
        let intercept = match mode {
            Mode::Relay => None,
            Mode::Transparent => Some(start_intercept(
                &env,
                &mut lab,
                &ast,
                &env.intercept,
                &["--capture", &ast_if, "--filter", "src port 8080"],
            )?),
            // The target still routes the clients' subnet via the assistant; the rule queues
            // the answers in its output path, before they reach that link.
            Mode::OnTarget => Some(start_intercept(
                &env,
                &mut lab,
                &env.tgt.clone(),
                &env.intercept_on_target,
                &[
                    "--on-target",
                    "--server-port",
                    "8080",
                    "--clients",
                    "198.18.1.0/24",
                ],
            )?),
        };
        for new_conn in [false, true] {
            for rate in [1000, 5000, 20_000] {
                if !Only::wants(&only, mode, new_conn, rate) {
                    continue;
                }
                eprintln!(
                    "{mode:?}: {} at {rate} req/s ...",
                    if new_conn {
                        "new connection per request"
                    } else {
                        "keep-alive"
                    }
                );
                let what = format!(
                    "{mode:?}, {}, {rate} req/s",
                    if new_conn {
                        "new connection per request"
                    } else {
                        "keep-alive"
                    }
                );
                let Some((old_bin, lacks)) = &against_env else {
                    // A failed row is told in the results beside the others, and fails the
                    // bench at its end: one row should not hide every figure after it.
                    let r = scenario(
                        &env,
                        &env.tcpkit,
                        &mut lab,
                        rate,
                        new_conn,
                        mode,
                        intercept.as_ref(),
                    );
                    match r {
                        Ok(Row { error: Some(e), .. }) => {
                            eprintln!("  FAILED: {what}: {e}");
                            failed.push(format!("{what}: {e}"));
                        }
                        Ok(r) => rows.push(r),
                        Err(e) => {
                            eprintln!("  FAILED: {what}: {e:#}");
                            failed.push(format!("{what}: {e:#}"));
                        }
                    }
                    continue;
                };
                // Both builds, which goes first alternating from row to row.
                let lacks: Vec<&str> = mode_flags(mode)
                    .iter()
                    .copied()
                    .filter(|f| lacks.iter().any(|l| l == f))
                    .collect();
                let mut ab = AbRow {
                    what: row_label(new_conn, mode),
                    asked: format!("{}k", rate / 1000),
                    new: Err(String::new()),
                    old: Err(String::new()),
                    per_req_runs: [Vec::new(), Vec::new()],
                };
                // Run k of each build: the order flips from run to run and from row to row
                // (new, old, old, new, ...), so neither build always runs on a warmer lab.
                let (mut new_runs, mut old_runs) = (Vec::new(), Vec::new());
                for k in 0..runs {
                    let new_first = (ab_rows.len() + k).is_multiple_of(2);
                    for is_new in [new_first, !new_first] {
                        let bin = if is_new { &env.tcpkit } else { old_bin };
                        let r = if !is_new && !lacks.is_empty() {
                            Err(format!("not in the old build: {}", lacks.join(" ")))
                        } else {
                            scenario(
                                &env,
                                bin,
                                &mut lab,
                                rate,
                                new_conn,
                                mode,
                                intercept.as_ref(),
                            )
                            .map_err(|e| format!("{e:#}"))
                        };
                        let build = if is_new { "new" } else { "old" };
                        match &r {
                            Ok(Row { error: Some(e), .. }) | Err(e) => {
                                eprintln!("  FAILED ({build} build): {what}: {e}");
                                failed.push(format!("{what}, {build} build: {e}"));
                            }
                            Ok(_) => {}
                        }
                        if is_new {
                            new_runs.push(r);
                        } else {
                            old_runs.push(r);
                        }
                    }
                }
                ab.per_req_runs = [per_req_of(&new_runs), per_req_of(&old_runs)];
                ab.new = median_run(new_runs);
                ab.old = median_run(old_runs);
                ab_rows.push(ab);
            }
        }
        // SIGTERM: an on-target intercept removes its rule on the way out.
        if let Some(p) = intercept {
            let _ = p.stop();
        }
    }
    if only.is_none() && !tls_only {
        eprintln!("wrk keep-alive at its top rate ...");
        match &against_env {
            None => rows.push(wrk_row(&env, &env.tcpkit)?),
            Some((old_bin, _)) => {
                let new_first = ab_rows.len().is_multiple_of(2);
                let (mut new, mut old) = (Err(String::new()), Err(String::new()));
                for is_new in [new_first, !new_first] {
                    let bin = if is_new { &env.tcpkit } else { old_bin };
                    let r = wrk_row(&env, bin).map_err(|e| format!("{e:#}"));
                    if let Err(e) = &r {
                        let build = if is_new { "new" } else { "old" };
                        failed.push(format!("wrk, {build} build: {e}"));
                    }
                    if is_new {
                        new = r;
                    } else {
                        old = r;
                    }
                }
                ab_rows.push(AbRow {
                    what: "keep-alive, wrk -t2 -c50 (max rate)".into(),
                    asked: "max".into(),
                    new,
                    old,
                    per_req_runs: [Vec::new(), Vec::new()],
                });
            }
        }
    }

    // The TLS rows, beside the clear ones in a full run (this build only).
    let tls = if only.is_none() && against.is_none() {
        let t = crate::copy_tls::rows(&env, &mut lab, on.pid(), &mut failed)?;
        format!("\n## TLS (issue 27)\n{}\n{t}", crate::copy_tls::NOTE)
    } else {
        String::new()
    };
    let t = match (&against, tls_only) {
        (_, true) => tls.clone() + &failed_list(&failed),
        (None, false) => table(&rows, &failed) + &tls,
        (Some(_), false) => ab_table(&ab_rows, &failed),
    };
    println!("{t}");
    // The flags too: an --against run names the build it compared with.
    let cmd = format!(
        "cargo run --release -p tcpkit-bench -- copy{}",
        args.iter().map(|a| format!(" {a}")).collect::<String>()
    );
    let date = crate::today();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let builds = against.as_ref().map_or_else(String::new, |a| {
        format!(
            "Builds compared (`--against`): new = {} ({}); old = {}. Every row runs with both\n\
             builds' copy, which goes first alternating from row to row (new, old, old, new, ...),\n\
             each with its own run without the copy; the load generator and intercept are the new\n\
             build's in both. Each figure is new / old, and (new/old) their ratio.{}\n",
            a.new_label,
            env.tcpkit.display(),
            a.label,
            if runs > 1 {
                format!(
                    " `--runs {runs}`: each build ran each row {runs} times, the order flipping from run to run; a row shows each build's run whose CPU per request is the median of its runs, and every run's figure after \"runs\"."
                )
            } else {
                String::new()
            }
        )
    });
    let md = format!(
        "# tcpkit copy (relay and transparent modes, intercept on an assistant or on the target) — {date}\n\n\
         Command: `{cmd}` (from the workspace root, as root)\n\n\
         {builds}\
         Machine: Linux {}, {cpus} CPUs (clients, both nginx and the copy share them); load average at start: {}; whole bench took {:.0} s.\n\
         Lab: clients → online (nginx 1 worker, `tcpkit copy -x 8080-{TARGET}:8080 -i <clients' link>`) → target (nginx 1 worker); veth links.\n\
         Transparent rows: `--transparent --intercept {ASSIST_M}:{INTERCEPT_PORT}`; the target routes the clients' subnet via an\n\
         assistant host where `tcpkit intercept --capture <target link> --filter 'src port 8080'` runs (its CPU over the load's\n\
         wall time, its peak RSS over the whole bench). \"intercept on the target\" rows: `tcpkit intercept --on-target\n\
         --server-port 8080 --clients 198.18.1.0/24 --listen {TARGET}:{INTERCEPT_PORT}` on the target (a netfilter queue rule there\n\
         catches the answers; no assistant on their path), the copy's `--intercept {TARGET}:{INTERCEPT_PORT}`.\n\
         Rates: `tcpkit load --http-get /index.html` (612 B) for {RUN_S} s, open loop, latency from the intended send time;\n\
         keep-alive over rate/500 connections (4–40), a new connection per request with `--queries-per-conn 1 --connect-rate 1.2×rate` over 64.\n\
         Debian's wrk has no fixed-rate mode and no connection-per-request mode, so it only runs the last row.\n\
         Request loss = (online access-log lines − target access-log lines) / online lines, during the run with the copy.\n\
         Copy CPU % = the copy's user+system time during the load over the load's wall time. Per request = the copy's CPU from the load's start to its exit (its tail and drain included: a copy that runs late does part of its work after the load ended, and a window closing with the load would leave that out), over the requests it copied. RSS = its VmHWM.\n\
         The links online ↔ target, target ↔ assistant and online ↔ assistant receive in kernel threads of their own (veth\n\
         NAPI, threaded): on a plain veth the receiving host's whole TCP stack runs inside the sender's syscalls, so the\n\
         copy's CPU would include the target's stack taking in every handshake, request and FIN, which on a real network\n\
         runs on the target. \"copy host's receive path\" is the online end's threads (the target's answers and intercept's\n\
         messages coming in), what a NIC's softirq does on a real copy host. The clients' link stays plain: there the\n\
         capture's work runs in production's own sends, as it does on a real host.\n\
         Latency, with no copy running and with the copy: \"on its wire\" is the online server's own, from a request's\n\
         first segment to its answer's first on the server's interface (a buffered tcpdump, headers only, in two runs of\n\
         their own: its CPU moves the other figures);\n\
         \"clients' view\" is the load generator's, from each request's intended send time. The clients, both nginx, the\n\
         copy and the receive threads share 2 CPUs, and the load generator falls behind its own schedule when they run\n\
         short. tcpcopy is not packaged in Debian: its figures are quoted\n\
         from the issue for reference, measured on another setup.\n\n\
         {t}",
        kernel.trim(),
        loadavg.trim(),
        started.elapsed().as_secs_f64()
    );
    let md = if tls_only {
        format!(
            "# tcpkit copy, TLS rows (issue 27) — {date}\n\n\
             Command: `{cmd}` (from the workspace root, as root)\n\n\
             Machine: Linux {}, {cpus} CPUs (clients, both nginx and the copy share them); load average at start: {}; whole bench took {:.0} s.\n\
             Lab: clients → online → target, veth links (the copy bench's; see its full results for the clear rows).\n\
             {t}",
            kernel.trim(),
            loadavg.trim(),
            started.elapsed().as_secs_f64()
        )
    } else {
        md
    };
    crate::write_results(
        if tls_only { "copy-tls" } else { "copy" },
        &date,
        &md,
        started,
        only.is_some().then_some("--only"),
    )?;
    if !failed.is_empty() {
        bail!("{} of the rows failed (see the table's end)", failed.len());
    }
    Ok(())
}

/// The flags a copy in `mode` is started with (see [`start_copy`]).
fn mode_flags(mode: Mode) -> &'static [&'static str] {
    match mode {
        Mode::Relay => &["-x", "-i", "--duration", "--json"],
        Mode::Transparent | Mode::OnTarget => &[
            "-x",
            "-i",
            "--duration",
            "--json",
            "--transparent",
            "--intercept",
        ],
    }
}

fn row_label(new_conn: bool, mode: Mode) -> String {
    format!(
        "{}{}",
        if new_conn {
            "new connection per request"
        } else {
            "keep-alive"
        },
        match mode {
            Mode::Relay => "",
            Mode::Transparent => ", transparent",
            Mode::OnTarget => ", transparent, intercept on the target",
        }
    )
}

/// One row run with both builds (`--against`): each its row, or why it has none.
struct AbRow {
    what: String,
    asked: String,
    /// With `--runs N`, the run whose CPU per request is the median of each build's.
    new: std::result::Result<Row, String>,
    old: std::result::Result<Row, String>,
    /// With `--runs N` (N > 1), every run's CPU per request, new then old, in run order.
    per_req_runs: [Vec<f64>; 2],
}

/// Each run's CPU per request (µs), where the run gave one.
fn per_req_of(runs: &[std::result::Result<Row, String>]) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| r.as_ref().ok()?.cpu_per_req_us)
        .collect()
}

/// The run whose CPU per request is the (lower) median of those that gave one; else the
/// first run, failed as it is.
fn median_run(mut runs: Vec<std::result::Result<Row, String>>) -> std::result::Result<Row, String> {
    let key = |r: &std::result::Result<Row, String>| r.as_ref().ok().and_then(|r| r.cpu_per_req_us);
    let mut with: Vec<usize> = (0..runs.len())
        .filter(|&i| key(&runs[i]).is_some())
        .collect();
    if with.is_empty() {
        return if runs.is_empty() {
            Err("no run".into())
        } else {
            runs.swap_remove(0)
        };
    }
    with.sort_by(|&a, &b| {
        key(&runs[a])
            .partial_cmp(&key(&runs[b]))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    runs.swap_remove(with[(with.len() - 1) / 2])
}

/// With `--runs N`: ", runs 17 18 21 / 15 16 19" (each build's CPU per request, run order).
fn runs_of(runs: &[Vec<f64>; 2]) -> String {
    if runs.iter().all(|r| r.len() < 2) {
        return String::new();
    }
    let one = |v: &Vec<f64>| {
        v.iter()
            .map(|u| format!("{u:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let one = |v: &Vec<f64>| {
        if v.is_empty() {
            "—".to_string()
        } else {
            one(v)
        }
    };
    format!(", runs {} / {}", one(&runs[0]), one(&runs[1]))
}

/// The `--against` table: per row each figure as new / old, and their ratio where a ratio
/// says something (CPU, RSS); rows whose copy failed its run are marked and listed below.
fn ab_table(rows: &[AbRow], failed: &[String]) -> String {
    let mut t = String::new();
    t.push_str("| traffic | rate | requests online, new / old | request loss, new / old | open at the drain's end | copy CPU % of a core (new/old) | per request µs (new/old) | receive path % | copy peak RSS MB (new/old) | intercept CPU % | online server on its wire p99, copying | clients' view p50 / p99, copying |\n");
    t.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let both = |r: &AbRow, f: &dyn Fn(&Row) -> String| {
        let one = |x: &std::result::Result<Row, String>| x.as_ref().map_or("—".to_string(), f);
        format!("{} / {}", one(&r.new), one(&r.old))
    };
    let ratio = |r: &AbRow, f: &dyn Fn(&Row) -> Option<f64>| {
        let v = |x: &std::result::Result<Row, String>| x.as_ref().ok().and_then(f);
        crate::new_over_old(v(&r.new), v(&r.old))
    };
    for r in rows {
        let lat = |l: &Load| {
            if l.p50_us == 0.0 {
                "—".to_string()
            } else {
                format!("{:.0} / {:.0} µs", l.p50_us, l.p99_us)
            }
        };
        t.push_str(&format!(
            "| {} | {} req/s | {} | {} | {} | {} ({}) | {} ({}){} | {} | {} ({}) | {} | {} | {} |\n",
            r.what,
            r.asked,
            both(r, &|x| x.online.to_string()),
            both(r, &|x| format!(
                "{:.4} %{}",
                x.loss_pct(),
                if x.error.is_some() { " (failed)" } else { "" }
            )),
            both(r, &|x| x.open_at_end.to_string()),
            both(r, &|x| format!("{:.1}", x.cpu_pct)),
            ratio(r, &|x| Some(x.cpu_pct)),
            both(r, &|x| x
                .cpu_per_req_us
                .map_or("—".to_string(), |u| format!("{u:.0}"))),
            ratio(r, &|x| x.cpu_per_req_us),
            runs_of(&r.per_req_runs),
            both(r, &|x| format!("{:.1}", x.rx_pct)),
            both(r, &|x| format!("{:.1}", x.rss_mb)),
            ratio(r, &|x| Some(x.rss_mb)),
            both(r, &|x| x
                .intercept
                .map_or("—".to_string(), |(c, _)| format!("{c:.1}"))),
            both(r, &|x| x.wire[1]
                .map_or("—".to_string(), |w| format!("{:.0} µs", w.1))),
            both(r, &|x| lat(&x.with)),
        ));
    }
    if !failed.is_empty() {
        t.push_str("\n**Runs that failed** (marked above):\n\n");
        for f in failed {
            t.push_str(&format!("- {}\n", f.replace('\n', " ")));
        }
    }
    t
}

/// The table without `--against`: one build, failed rows listed at its end.
fn table(rows: &[Row], failed: &[String]) -> String {
    let mut t = String::new();
    t.push_str("| traffic | rate | requests online | at target | request loss | copy CPU (% of a core; per request) | copy host's receive path for it | copy peak RSS | intercept CPU; peak RSS | online server on its wire p50 / p99: no copy | copying | clients' view p50 / p99: no copy | copying |\n");
    t.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let lat = |l: &Load| {
            if l.p50_us == 0.0 {
                "—".to_string()
            } else {
                format!("{:.0} / {:.0} µs", l.p50_us, l.p99_us)
            }
        };
        let wire = |w: Option<(f64, f64)>| match w {
            Some((p50, p99)) => format!("{p50:.0} / {p99:.0} µs"),
            None => "—".to_string(),
        };
        let per = r
            .cpu_per_req_us
            .map(|u| format!("; {u:.0} µs"))
            .unwrap_or_default();
        let note = [&r.base.note, &r.with.note]
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| format!(" ({n})"))
            .collect::<String>();
        t.push_str(&format!(
            "| {} | {} req/s | {} | {} | {:.4} %{} | {:.1} %{per} | {:.1} % | {:.1} MB | {} | {} | {} | {} | {}{} |\n",
            r.what,
            r.asked,
            r.online,
            r.target,
            r.loss_pct(),
            if r.failed.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.failed)
            },
            r.cpu_pct,
            r.rx_pct,
            r.rss_mb,
            r.intercept
                .map_or("—".to_string(), |(c, m)| format!("{c:.1} %; {m:.1} MB")),
            wire(r.wire[0]),
            wire(r.wire[1]),
            lat(&r.base),
            lat(&r.with),
            note
        ));
    }
    t.push_str(
        "| tcpcopy 1.3 + intercept (issue text, not run: not packaged in Debian) | keep-alive, ab -k ~45–50k req/s | | | 0 % | | | | | | | | |\n\
         | tcpcopy 1.3 + intercept (issue text) | new connection per request, ab -c10/-c50 | | | 6–12 % | | | | | | | | |\n\
         | tcpcopy (its README) | 2 × 2.18k req/s → one target | | | 0.0375 % | ~9 % | | | | | | | |\n",
    );
    t.push_str(&failed_list(failed));
    t
}

/// The rows that failed, one list item each, under their table (none: nothing).
fn failed_list(failed: &[String]) -> String {
    if failed.is_empty() {
        return String::new();
    }
    let mut t = String::from("\n**Rows that failed** (not in the table above):\n\n");
    for f in failed {
        // The reports are JSON on several lines: one list item each.
        t.push_str(&format!("- {}\n", f.replace('\n', " ")));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(loss_of_100: u64, cpu: f64, error: Option<&str>) -> Row {
        Row {
            what: row_label(true, Mode::Relay),
            asked: "20k".into(),
            online: 100,
            target: 100 - loss_of_100,
            cpu_pct: cpu,
            cpu_per_req_us: Some(cpu),
            rx_pct: 1.0,
            rss_mb: 80.0,
            failed: String::new(),
            base: Load::default(),
            with: Load {
                p50_us: 100.0,
                p99_us: 900.0,
                note: String::new(),
            },
            wire: [None, Some((40.0, 400.0))],
            intercept: None,
            open_at_end: loss_of_100,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn runs_give_the_run_with_the_median_cpu_per_request() {
        let runs = vec![
            Ok(row(1, 30.0, None)),
            Err("lab broke".to_string()),
            Ok(row(2, 10.0, Some("loss over 1 %"))),
            Ok(row(3, 20.0, None)),
        ];
        assert_eq!(per_req_of(&runs), [30.0, 10.0, 20.0]);
        let Ok(m) = median_run(runs) else {
            panic!("a run with a figure")
        };
        assert_eq!((m.open_at_end, m.cpu_per_req_us), (3, Some(20.0)));
        // Two runs: the lower one, never a blend of two runs' figures.
        let Ok(m) = median_run(vec![Ok(row(1, 30.0, None)), Ok(row(2, 10.0, None))]) else {
            panic!("a run with a figure")
        };
        assert_eq!(m.cpu_per_req_us, Some(10.0));
        // No run gave a figure: the first, as it failed.
        let first = median_run(vec![Err("a".into()), Err("b".into())]);
        assert!(matches!(first, Err(e) if e == "a"));
    }

    #[test]
    fn an_ab_row_shows_both_builds_and_new_over_old() {
        let rows = [
            AbRow {
                what: row_label(true, Mode::Relay),
                asked: "20k".into(),
                new: Ok(row(2, 30.0, Some("loss over 1 %"))),
                old: Ok(row(10, 20.0, Some("loss over 1 %"))),
                per_req_runs: [Vec::new(), Vec::new()],
            },
            AbRow {
                what: row_label(false, Mode::Transparent),
                asked: "1k".into(),
                new: Ok(row(0, 5.0, None)),
                old: Err("not in the old build: --transparent".into()),
                per_req_runs: [vec![4.0, 5.0, 9.0], Vec::new()],
            },
        ];
        let failed = vec!["Relay, new, 20000 req/s, new build: loss over 1 %".to_string()];
        let t = ab_table(&rows, &failed);
        let lines: Vec<&str> = t.lines().collect();
        // Header, rule, two rows; every row as many cells as the header.
        let cells = |l: &str| l.matches(" | ").count();
        assert_eq!(cells(lines[2]), cells(lines[0]), "{t}");
        assert_eq!(cells(lines[3]), cells(lines[0]), "{t}");
        assert_eq!(
            lines[2],
            "| new connection per request | 20k req/s | 100 / 100 | 2.0000 % (failed) / \
             10.0000 % (failed) | 2 / 10 | 30.0 / 20.0 (1.50) | 30 / 20 (1.50) | 1.0 / 1.0 | \
             80.0 / 80.0 (1.00) | — / — | 400 µs / 400 µs | 100 / 900 µs / 100 / 900 µs |"
        );
        // The old build lacks a flag: its side is blank, no ratio.
        assert!(
            lines[3].starts_with("| keep-alive, transparent | 1k req/s | 100 / — | 0.0000 % / — |"),
            "{t}"
        );
        assert!(lines[3].contains("5.0 / — (—)"), "{t}");
        // `--runs`: every run's CPU per request follows the median's ratio.
        assert!(lines[3].contains("| 5 / — (—), runs 4 5 9 / — |"), "{t}");
        assert!(t.contains("**Runs that failed**"), "{t}");
        assert!(
            t.ends_with("- Relay, new, 20000 req/s, new build: loss over 1 %\n"),
            "{t}"
        );
    }

    #[test]
    fn without_against_a_failed_row_is_listed_not_tabled() {
        let t = table(&[row(0, 5.0, None)], &["Relay, x: why".to_string()]);
        assert!(
            t.starts_with("| traffic | rate | requests online | at target |"),
            "{t}"
        );
        assert!(
            t.contains("| new connection per request | 20k req/s | 100 | 100 | 0.0000 % |"),
            "{t}"
        );
        assert!(
            t.contains("**Rows that failed** (not in the table above):\n\n- Relay, x: why\n"),
            "{t}"
        );
    }
}
