//! `tcpkit-bench copy`: `tcpkit copy` in relay mode on an online nginx under load, copied to a
//! target nginx, in a lab of three hosts (clients → online → target). For each rate (1k, 5k,
//! 20k req/s) and kind of traffic (keep-alive, a new connection per request), one run without
//! the copy and one with it: request loss ratio from the two access logs, the copy's CPU and
//! peak RSS, and the online server's latency as the clients see it with and without the copy.
//! The rates come from `tcpkit load --http-get` (open loop, latency from the intended send
//! time): Debian's wrk has no fixed-rate mode and cannot open a connection per request. One
//! more row runs wrk (keep-alive, as fast as it goes) the way tcpcopy's figures were taken
//! with ab -k. tcpcopy is not packaged in Debian; its figures from the issue are printed
//! beside ours for reference. Prints one table and writes it to bench/results/copy-DATE.md.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tcpkit_lab::{Host, Lab, LinkOpts, Proc};

const CLIENT: &str = "198.18.1.1";
const ONLINE: &str = "198.18.1.2";
const ONLINE_T: &str = "198.18.2.1";
const TARGET: &str = "198.18.2.2";
const NGINX: &str = "/usr/sbin/nginx";
/// Seconds of load per run.
const RUN_S: f64 = 5.0;

struct Env {
    tcpkit: PathBuf,
    cli: Host,
    onl: Host,
    cap_if: String,
    on_log: PathBuf,
    tg_log: PathBuf,
}

/// nginx on `ip`:8080 serving a 612-byte /index.html (nginx's own page size), one access-log
/// line per request, with enough connections and workers for 20k new connections a second.
fn nginx(lab: &mut Lab, host: &Host, ip: &str, name: &str) -> Result<(Proc, PathBuf)> {
    let d = lab.dir().join(format!("nginx-{name}"));
    std::fs::create_dir_all(d.join("www"))?;
    std::fs::write(d.join("www/index.html"), vec![b'x'; 612])?;
    let log = d.join("access.log");
    let conf = d.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "user root; daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\n\
             worker_rlimit_nofile 65536; events {{ worker_connections 16384; }}\n\
             http {{ log_format t '$remote_addr $status'; access_log {l} t buffer=64k flush=100ms;\n\
               keepalive_requests 1000000; client_body_temp_path {d}; proxy_temp_path {d};\n\
               fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n\
               server {{ listen {ip}:8080 backlog=4096 reuseport; root {d}/www; }} }}\n",
            d = d.display(),
            l = log.display(),
        ),
    )?;
    let p = host.spawn(
        lab,
        &format!("nginx-{name}"),
        &[NGINX, "-c", conf.to_str().unwrap_or_default()],
    )?;
    let addr = format!("{ip}:8080").parse()?;
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

fn log_lines(p: &Path) -> u64 {
    std::fs::read(p)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count() as u64)
        .unwrap_or(0)
}

/// User + system CPU seconds and peak RSS (KiB) of a live process.
fn usage(pid: u32) -> (f64, u64) {
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
struct Load {
    p50_us: f64,
    p99_us: f64,
    note: String,
}

/// `tcpkit load` at `rate` for RUN_S against the online nginx.
fn load(env: &Env, rate: u32, new_conn: bool) -> Result<Load> {
    let conns = if new_conn {
        64
    } else {
        (rate / 500).clamp(4, 40)
    };
    let (r, c, t) = (rate.to_string(), conns.to_string(), RUN_S.to_string());
    let target = format!("{ONLINE}:8080");
    let tk = env.tcpkit.to_str().unwrap_or_default();
    let mut argv = vec![
        tk,
        "load",
        &target,
        "--http-get",
        "/index.html",
        "-r",
        &r,
        "-c",
        &c,
        "-t",
        &t,
        "--json",
    ];
    // Reopening is paced by --connect-rate (1000/s by default): as fast as the queries here.
    let reopen = (rate + rate / 5).to_string();
    if new_conn {
        argv.extend_from_slice(&["--queries-per-conn", "1", "--connect-rate", &reopen]);
    }
    let o = env
        .cli
        .command(&argv)
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
fn start_copy(env: &Env, secs: f64) -> Result<Child> {
    let rule = format!("8080-{TARGET}:8080");
    let d = secs.to_string();
    let tk = env.tcpkit.to_str().unwrap_or_default();
    let child = env
        .onl
        .command(&[
            tk,
            "copy",
            "-x",
            &rule,
            "-i",
            &env.cap_if,
            "--duration",
            &d,
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start tcpkit copy")?;
    // The ring and filter are in place well within this; the copy logs nothing before.
    std::thread::sleep(Duration::from_millis(400));
    Ok(child)
}

struct Row {
    what: String,
    asked: String,
    online: u64,
    target: u64,
    cpu_pct: f64,
    rss_mb: f64,
    base: Load,
    with: Load,
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
fn scenario(env: &Env, rate: u32, new_conn: bool) -> Result<Row> {
    let base = load(env, rate, new_conn)?;
    std::thread::sleep(Duration::from_millis(300));
    let (on0, tg0) = (log_lines(&env.on_log), log_lines(&env.tg_log));
    let copy = start_copy(env, RUN_S + 1.0)?;
    let pid = copy.id();
    let (cpu0, _) = usage(pid);
    let t0 = Instant::now();
    let with = load(env, rate, new_conn)?;
    let (cpu1, hwm) = usage(pid);
    let secs = t0.elapsed().as_secs_f64();
    let o = copy.wait_with_output().context("wait for tcpkit copy")?;
    if !o.status.success() {
        bail!("tcpkit copy: {}", String::from_utf8_lossy(&o.stderr));
    }
    // nginx flushes its access log every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    Ok(Row {
        what: if new_conn {
            "new connection per request".into()
        } else {
            "keep-alive".into()
        },
        asked: format!("{}k", rate / 1000),
        online: log_lines(&env.on_log) - on0,
        target: log_lines(&env.tg_log) - tg0,
        cpu_pct: (cpu1 - cpu0) * 100.0 / secs,
        rss_mb: hwm as f64 / 1024.0,
        base,
        with,
    })
}

/// wrk, keep-alive, as fast as it goes for RUN_S with 2 threads and 50 connections.
fn wrk_row(env: &Env) -> Result<Row> {
    let url = format!("http://{ONLINE}:8080/index.html");
    let d = format!("{}s", RUN_S as u32);
    let (on0, tg0) = (log_lines(&env.on_log), log_lines(&env.tg_log));
    let copy = start_copy(env, RUN_S + 1.5)?;
    let pid = copy.id();
    let (cpu0, _) = usage(pid);
    let t0 = Instant::now();
    let o = env
        .cli
        .command(&["wrk", "-t2", "-c50", "-d", &d, "--latency", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .context("run wrk (apt-get install -y wrk)")?;
    let (cpu1, hwm) = usage(pid);
    let secs = t0.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let _ = copy.wait_with_output();
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
        rss_mb: hwm as f64 / 1024.0,
        base: Load::default(),
        with: Load {
            p50_us: lat("50%"),
            p99_us: lat("99%"),
            note: String::new(),
        },
    })
}

pub fn copy(_args: &[String]) -> Result<()> {
    let started = Instant::now();
    if !Path::new(NGINX).exists() {
        bail!("{NGINX} missing (apt-get install -y nginx-light)");
    }
    let tcpkit = crate::tcpkit_binary()?;
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut lab = Lab::new("bcopy")?;
    let cli = lab.host("cli")?;
    let onl = lab.host("onl")?;
    let tgt = lab.host("tgt")?;
    let cli_link = lab.link(
        &cli,
        &onl,
        &LinkOpts {
            addr_a: vec![format!("{CLIENT}/24")],
            addr_b: vec![format!("{ONLINE}/24")],
            ..LinkOpts::default()
        },
    )?;
    lab.link(
        &onl,
        &tgt,
        &LinkOpts {
            addr_a: vec![format!("{ONLINE_T}/24")],
            addr_b: vec![format!("{TARGET}/24")],
            ..LinkOpts::default()
        },
    )?;
    for h in [&cli, &onl, &tgt] {
        // 20k new connections a second for seconds: the clients' ports and both servers'
        // SYN queues must hold them (the namespaces start with the kernel's defaults).
        h.sysctl("net.ipv4.ip_local_port_range", "10000 65000")?;
        h.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
        h.sysctl("net.core.somaxconn", "4096")?;
        h.sysctl("net.ipv4.tcp_max_syn_backlog", "8192")?;
    }
    let (_on, on_log) = nginx(&mut lab, &onl, ONLINE, "online")?;
    let (_tg, tg_log) = nginx(&mut lab, &tgt, TARGET, "target")?;
    let env = Env {
        tcpkit,
        cli,
        onl,
        cap_if: cli_link.b.name.clone(),
        on_log,
        tg_log,
    };
    let mut rows = Vec::new();
    for new_conn in [false, true] {
        for rate in [1000, 5000, 20_000] {
            eprintln!(
                "{} at {rate} req/s ...",
                if new_conn {
                    "new connection per request"
                } else {
                    "keep-alive"
                }
            );
            rows.push(scenario(&env, rate, new_conn)?);
        }
    }
    eprintln!("wrk keep-alive at its top rate ...");
    rows.push(wrk_row(&env)?);

    let mut t = String::new();
    t.push_str("| traffic | rate | requests online | at target | request loss | copy CPU (% of a core) | copy peak RSS | online p50 / p99 without copy | with copy |\n");
    t.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in &rows {
        let lat = |l: &Load| {
            if l.p50_us == 0.0 {
                "—".to_string()
            } else {
                format!("{:.0} / {:.0} µs", l.p50_us, l.p99_us)
            }
        };
        let note = [&r.base.note, &r.with.note]
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| format!(" ({n})"))
            .collect::<String>();
        t.push_str(&format!(
            "| {} | {} req/s | {} | {} | {:.4} % | {:.1} % | {:.1} MB | {} | {}{} |\n",
            r.what,
            r.asked,
            r.online,
            r.target,
            r.loss_pct(),
            r.cpu_pct,
            r.rss_mb,
            lat(&r.base),
            lat(&r.with),
            note
        ));
    }
    t.push_str(
        "| tcpcopy 1.3 + intercept (issue text, not run: not packaged in Debian) | keep-alive, ab -k ~45–50k req/s | | | 0 % | | | | |\n\
         | tcpcopy 1.3 + intercept (issue text) | new connection per request, ab -c10/-c50 | | | 6–12 % | | | | |\n\
         | tcpcopy (its README) | 2 × 2.18k req/s → one target | | | 0.0375 % | ~9 % | | | |\n",
    );
    println!("{t}");
    let cmd = "cargo run --release -p tcpkit-bench -- copy";
    let date = crate::today();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let md = format!(
        "# tcpkit copy (relay mode) — {date}\n\n\
         Command: `{cmd}` (from the workspace root, as root)\n\n\
         Machine: Linux {}, {cpus} CPUs (clients, both nginx and the copy share them); load average at start: {}; whole bench took {:.0} s.\n\
         Lab: clients → online (nginx 1 worker, `tcpkit copy -x 8080-{TARGET}:8080 -i <clients' link>`) → target (nginx 1 worker); veth links.\n\
         Rates: `tcpkit load --http-get /index.html` (612 B) for {RUN_S} s, open loop, latency from the intended send time;\n\
         keep-alive over rate/500 connections (4–40), a new connection per request with `--queries-per-conn 1 --connect-rate 1.2×rate` over 64.\n\
         Debian's wrk has no fixed-rate mode and no connection-per-request mode, so it only runs the last row.\n\
         Request loss = (online access-log lines − target access-log lines) / online lines, during the run with the copy.\n\
         Copy CPU = the copy's user+system time over the load's wall time; RSS = its VmHWM. Latency = the clients' view of\n\
         the online server, without the copy running and with it. tcpcopy is not packaged in Debian: its figures are quoted\n\
         from the issue for reference, measured on another setup.\n\n\
         {t}",
        kernel.trim(),
        loadavg.trim(),
        started.elapsed().as_secs_f64()
    );
    let out = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../results")
        .join(format!("copy-{date}.md"));
    std::fs::write(&out, md).with_context(|| format!("write {}", out.display()))?;
    eprintln!(
        "wrote {} ({:.0} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
