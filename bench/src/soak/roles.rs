//! The soak's four roles, each in a lab of its own: how each is set up, driven, faulted and
//! judged (see the parent module).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use tcpkit_lab::{Cgroup, Host, Lab, LinkOpts, Proc, Tbf, MULTIPATH_B4};

use super::{Bg, Check, Role};
use crate::copy::{self, CopyLab};
use crate::load::json_u;

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Waits until `addr` accepts from inside `host` (10 s), failing with `p`'s stderr if it ends.
fn wait_accepts(host: &Host, addr: &str, p: &mut Bg) -> Result<()> {
    let addr: SocketAddr = addr.parse()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host.enter(|| TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()) {
        if !p.running() || Instant::now() > deadline {
            bail!("{} never accepted on {addr}: {}", p.name, p.err_tail());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `GET /metrics` from `addr` inside `host`: each `tcpkit_...` sample line's name (with its
/// labels) and value; empty when it does not answer (the soak goes on).
fn scrape(host: &Host, addr: &str) -> Vec<(String, f64)> {
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        return Vec::new();
    };
    let text = host.enter(|| -> Option<String> {
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut s = String::new();
        c.take(1 << 20).read_to_string(&mut s).ok()?;
        Some(s)
    });
    text.unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("tcpkit_"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples of metric `name` (over its labels).
fn metric(m: &[(String, f64)], name: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

/// The traffic runs this long past the last sample, so that every sample, the last
/// included, sees the roles under load rather than winding down.
const TRAFFIC_TAIL_S: f64 = 10.0;

// ---------------------------------------------------------------- copy

const COPY_RATE: u32 = 2_500;

/// Copy: relay and transparent copies of an online nginx's traffic to a target nginx, at
/// 5k requests/s from two loads (keep-alive, and a new connection per request).
pub(crate) struct CopyRole {
    cl: CopyLab,
    intercept: Proc,
    copies: Vec<(Bg, String)>,
    loads: Vec<Bg>,
    secs: f64,
}

impl CopyRole {
    pub(crate) fn start(tcpkit: &Path, secs: f64) -> Result<CopyRole> {
        let mut cl = copy::copy_lab("bscopy", tcpkit.to_path_buf())?;
        let ast_if = cl.ast_if.clone();
        let ast = cl.ast.clone();
        let intercept = copy::start_intercept(
            &cl.env,
            &mut cl.lab,
            &ast,
            &cl.env.intercept,
            &["--capture", &ast_if, "--filter", "src port 8080"],
        )?;
        Ok(CopyRole {
            cl,
            intercept,
            copies: Vec::new(),
            loads: Vec::new(),
            secs,
        })
    }

    fn go(&mut self) -> Result<()> {
        let tk = s(&self.cl.env.tcpkit).to_string();
        let dir = self.cl.lab.dir().to_path_buf();
        let rule = format!("8080-{}:8080", copy::TARGET);
        // The copies outlive the loads by the tail: what is in flight when the loads end is
        // still copied.
        let d = (self.secs + 60.0).to_string();
        for (name, metrics, extra) in [
            ("copy-relay", "127.0.0.1:9101", vec![]),
            (
                "copy-transparent",
                "127.0.0.1:9102",
                vec![
                    "--transparent",
                    "--intercept",
                    self.cl.env.intercept.as_str(),
                ],
            ),
        ] {
            let mut argv = vec![
                tk.as_str(),
                "copy",
                "-x",
                &rule,
                "-i",
                &self.cl.env.cap_if,
                "--duration",
                &d,
                "--json",
                "--metrics",
                metrics,
                // The copy's default (nice 10) lets production go first; here the other
                // roles' load generators, which are not its production, starved it of the
                // CPU it needs to keep up, and the soak is after leaks, not priorities.
                "--nice",
                "0",
            ];
            argv.extend_from_slice(&extra);
            let mut b = Bg::spawn(&self.cl.env.onl, &dir, name, &argv)?;
            wait_accepts(&self.cl.env.onl, metrics, &mut b)?;
            self.copies.push((b, metrics.to_string()));
        }
        // The ring and filter are up well within this (the copy bench's settle).
        std::thread::sleep(Duration::from_millis(400));
        let target = format!("{}:8080", copy::ONLINE);
        let (r, t) = (
            COPY_RATE.to_string(),
            format!("{}", self.secs + TRAFFIC_TAIL_S),
        );
        let reopen = (COPY_RATE + COPY_RATE / 5).to_string();
        let ka = [
            tk.as_str(),
            "load",
            &target,
            "--http-get",
            "/index.html",
            "-r",
            &r,
            "-c",
            // 50 req/s per connection: a relay copy answers one request of a session after
            // another, and at the copy bench's 500/s per connection (5 connections) the
            // copies of the keep-alive sessions fell behind on the loaded VM.
            "50",
            "-t",
            &t,
            "--json",
        ];
        self.loads
            .push(Bg::spawn(&self.cl.env.cli, &dir, "load-keepalive", &ka)?);
        let mut nc = ka.to_vec();
        nc[8] = "64";
        nc.extend_from_slice(&["--queries-per-conn", "1", "--connect-rate", &reopen]);
        self.loads
            .push(Bg::spawn(&self.cl.env.cli, &dir, "load-newconn", &nc)?);
        Ok(())
    }
}

/// nginx access-log lines (`$remote_addr $status`) by whether the address starts `prefix`.
fn log_count(p: &Path, prefix: &str) -> Result<u64> {
    let f = std::fs::File::open(p).with_context(|| format!("open {}", p.display()))?;
    let mut n = 0;
    for l in std::io::BufRead::lines(std::io::BufReader::new(f)) {
        if l?.starts_with(prefix) {
            n += 1;
        }
    }
    Ok(n)
}

impl Role for CopyRole {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn procs(&self) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = self
            .copies
            .iter()
            .map(|(b, _)| (b.name.clone(), b.pid()))
            .collect();
        v.push(("intercept".into(), self.intercept.pid()));
        v.extend(self.loads.iter().map(|b| (b.name.clone(), b.pid())));
        v
    }

    fn tick(&mut self, _t: f64) -> Result<()> {
        if self.copies.is_empty() {
            self.go()?;
        }
        for (b, _) in &mut self.copies {
            if !b.running() {
                bail!("{} ended early: {}", b.name, b.err_tail());
            }
        }
        Ok(())
    }

    fn counters(&mut self) -> Vec<(String, f64)> {
        let mut v = Vec::new();
        for (b, addr) in &self.copies {
            let m = scrape(&self.cl.env.onl, addr);
            for k in [
                "tcpkit_copy_requests_copied_total",
                "tcpkit_copy_requests_lost_total",
                // What the copy holds for its copies (requests not yet sent or answered):
                // a copy falling behind grows its heap by this, which is not a leak.
                "tcpkit_copy_memory_held_bytes",
            ] {
                v.push((format!("{} {k}", b.name), metric(&m, k)));
            }
        }
        v.push((
            "online nginx log lines".into(),
            copy::log_lines(&self.cl.env.on_log) as f64,
        ));
        v
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<Check>> {
        let mut checks = Vec::new();
        let (mut sent, mut answered, mut failed_conns, mut scheduled) = (0, 0, 0, 0);
        for l in &mut self.loads {
            l.wait(Duration::from_secs(120))?;
            let v = l.json()?;
            scheduled += json_u(&v, "queries.scheduled");
            sent += json_u(&v, "queries.sent");
            answered += json_u(&v, "queries.answered");
            failed_conns += json_u(&v, "connections.failed");
        }
        std::thread::sleep(Duration::from_secs_f64(copy::COPY_TAIL_S + 1.0));
        let mut reports = Vec::new();
        for (c, _) in &mut self.copies {
            c.stop(Duration::from_secs(60))?;
            reports.push((c.name.clone(), c.json()?));
        }
        let _ = self.intercept.stop();
        // nginx flushes its log buffer every 100 ms.
        std::thread::sleep(Duration::from_millis(500));
        let online = log_count(&self.cl.env.on_log, "")?;
        let relay_t = log_count(&self.cl.env.tg_log, &format!("{} ", copy::ONLINE_T))?;
        let transp_t = log_count(&self.cl.env.tg_log, &format!("{} ", copy::CLIENT))?;
        checks.push(Check::equal(
            "0 lost at production (loads' requests answered vs the online nginx's log)",
            ("answered", answered),
            ("logged", online),
        ));
        checks.push(Check::equal(
            "loads: the rate asked (every request scheduled was sent: the generators kept up)",
            ("scheduled", scheduled),
            ("sent", sent),
        ));
        checks.push(Check::equal(
            "loads: every request sent answered",
            ("sent", sent),
            ("answered", answered),
        ));
        checks.push(Check::zero(
            "loads: 0 failed connects",
            "failed",
            failed_conns,
        ));
        for ((name, r), at_target) in reports.iter().zip([relay_t, transp_t]) {
            let mut lost = Check::equal(
                &format!("{name}: 0 lost (online log vs the target's log of this copy)"),
                ("online", online),
                ("at target", at_target),
            );
            // Whether the copy fell behind (a backlog held in its heap) or dropped: its own
            // account of where the requests went.
            let _ = write!(
                lost.figures,
                "; its report: {} copied, {} kernel drops, {} copies failed, {} open at the \
                 end, peak held {:.1} MB",
                json_u(r, "requests.copied"),
                json_u(r, "capture.kernel_drops"),
                [
                    "reset",
                    "timeout",
                    "target_gone",
                    "lost_capture_data",
                    "shed",
                    "closed_early"
                ]
                .iter()
                .map(|k| json_u(r, &format!("sessions.failed.{k}")))
                .sum::<u64>(),
                json_u(r, "sessions.open_at_end"),
                json_u(r, "memory.peak_held_bytes") as f64 / 1e6
            );
            checks.push(lost);
            // copy's requests are turns: HTTP/1 requests the keep-alive load pipelined (sent
            // before the answer to the one before, whenever nginx was slower than the 20 ms
            // between a connection's requests) share one, and copy counts them apart.
            let piped = json_u(r, "requests.pipelined");
            checks.push(Check::equal(
                &format!(
                    "{name}: counters equal (its requests at source, pipelined ones included, \
                     vs the online log)"
                ),
                (
                    "at source + pipelined",
                    json_u(r, "requests.at_source") + piped,
                ),
                ("online", online),
            ));
            // The answers are counted by turn too, and which turns held pipelined requests
            // is not told apart at the answer: the target's log lies between. A request sent
            // whose answer had not reached the copy when it stopped is in the target's log
            // and not answered (soak-2026-11-28-d: 1 and 5 of them), so the top is what was
            // copied.
            let answered = json_u(r, "requests.answered");
            let copied = json_u(r, "requests.copied");
            checks.push(Check {
                target: format!(
                    "{name}: counters agree (its requests answered vs the target's log)"
                ),
                figures: format!(
                    "answered {answered}, copied {copied}, pipelined {piped} vs at target \
                     {at_target}"
                ),
                bound: "answered ≤ at target ≤ copied + pipelined".to_string(),
                met: answered <= at_target && at_target <= copied + piped,
            });
        }
        Ok(checks)
    }
}

// ---------------------------------------------------------------- echo

const ECHO_CONNS: u64 = 100_000;
const ECHO_CHURN: u64 = 1_000;
/// Queries per second over all connections; with 2 queries per connection, 1,000 closes and
/// reopens a second.
const ECHO_QPC: u64 = 2;

/// Echo: 100,000 connections held from a load of several processes (6 source addresses),
/// churning 1,000 a second, against an echo of 7 processes (a process cannot hold more than
/// 20,000 descriptors here).
pub(crate) struct EchoRole {
    _lab: Lab,
    cli: Host,
    dir: PathBuf,
    tcpkit: String,
    sources: String,
    echo: Bg,
    load: Option<Bg>,
    secs: f64,
}

impl EchoRole {
    pub(crate) fn start(tcpkit: &Path, secs: f64) -> Result<EchoRole> {
        let (lab, cli, srv, link) = Lab::pair("bsecho")?;
        cli.sysctl("net.ipv4.ip_local_port_range", "1024 65535")?;
        cli.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
        srv.sysctl("net.core.somaxconn", "8192")?;
        srv.sysctl("net.ipv4.tcp_max_syn_backlog", "16384")?;
        let mut sources = Vec::new();
        for k in 0..6 {
            let ip = format!("198.18.0.{}", 100 + k);
            cli.run(&[
                "ip",
                "addr",
                "add",
                &format!("{ip}/32"),
                "dev",
                &link.a.name,
            ])?;
            sources.push(ip);
        }
        let dir = lab.dir().to_path_buf();
        let tk = s(tcpkit).to_string();
        let mut echo = Bg::spawn(
            &srv,
            &dir,
            "echo",
            &[
                &tk,
                "echo",
                "--port",
                "7000",
                "--procs",
                "7",
                "--threads",
                "1",
                "--json",
            ],
        )?;
        wait_accepts(&cli, "198.18.0.2:7000", &mut echo)?;
        Ok(EchoRole {
            _lab: lab,
            cli,
            dir,
            tcpkit: tk,
            sources: sources.join(","),
            echo,
            load: None,
            secs,
        })
    }
}

/// `pid` and its descendants, labelled `name` and `name wK` in pid order.
fn tree_labels(name: &str, pid: u32) -> Vec<(String, u32)> {
    let mut t = crate::load::tree(pid);
    t[1..].sort_unstable();
    t.iter()
        .enumerate()
        .map(|(k, p)| {
            if k == 0 {
                (name.to_string(), *p)
            } else {
                (format!("{name} w{k}"), *p)
            }
        })
        .collect()
}

impl Role for EchoRole {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn procs(&self) -> Vec<(String, u32)> {
        let mut v = tree_labels("echo", self.echo.pid());
        if let Some(l) = &self.load {
            v.extend(tree_labels("load", l.pid()));
        }
        v
    }

    fn tick(&mut self, _t: f64) -> Result<()> {
        if self.load.is_none() {
            let rate = (ECHO_CHURN * ECHO_QPC).to_string();
            let (c, t, q) = (
                ECHO_CONNS.to_string(),
                format!("{}", self.secs + TRAFFIC_TAIL_S),
                ECHO_QPC.to_string(),
            );
            let argv = [
                self.tcpkit.as_str(),
                "load",
                "198.18.0.2:7000",
                "--echo-bytes",
                "16",
                "-c",
                &c,
                "-r",
                &rate,
                "--queries-per-conn",
                &q,
                "--connect-rate",
                "20000",
                "--connect-timeout",
                "30s",
                "--source",
                &self.sources,
                "-t",
                &t,
                "--json",
            ];
            self.load = Some(Bg::spawn(&self.cli, &self.dir, "load", &argv)?);
        }
        if !self.echo.running() {
            bail!("echo ended early: {}", self.echo.err_tail());
        }
        Ok(())
    }

    fn counters(&mut self) -> Vec<(String, f64)> {
        // The client side's own count of its TCP sockets (both ends are ours).
        let out = self
            .cli
            .run(&["cat", "/proc/net/sockstat"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let inuse = out
            .lines()
            .find_map(|l| l.strip_prefix("TCP: inuse "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        vec![("client TCP sockets in use".into(), inuse)]
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<Check>> {
        let mut load = self.load.take().context("the load never started")?;
        load.wait(Duration::from_secs(180))?;
        let l = load.json()?;
        self.echo.stop(Duration::from_secs(30))?;
        let e = self.echo.json()?;
        let est = json_u(&l, "connections.established");
        let secs = l["seconds"].as_f64().unwrap_or(self.secs);
        // Queries go round the connections in turn, so none has had its ECHO_QPC queries
        // (and closed) before ECHO_QPC - 1 rounds (50 s): the churn runs from then on.
        let round = (ECHO_CONNS * (ECHO_QPC - 1)) as f64 / (ECHO_CHURN * ECHO_QPC) as f64;
        let churn = est.saturating_sub(ECHO_CONNS) as f64 / (secs - round).max(1.0);
        Ok(vec![
            Check {
                target: "100,000 connections held".into(),
                figures: format!("peak open {}", json_u(&l, "connections.peak_open")),
                bound: format!("≥ {ECHO_CONNS}"),
                met: json_u(&l, "connections.peak_open") >= ECHO_CONNS,
            },
            Check {
                target: "1,000 new connections a second".into(),
                figures: format!(
                    "{churn:.0}/s ({} reopened over the {:.0} s after the first round of \
                     queries)",
                    est.saturating_sub(ECHO_CONNS),
                    (secs - round).max(0.0)
                ),
                bound: "≥ 900/s".into(),
                met: churn >= 900.0,
            },
            Check::zero(
                "0 failed connects",
                "failed",
                json_u(&l, "connections.failed"),
            ),
            Check::equal(
                "0 lost (load's queries sent vs echoed back intact)",
                ("sent", json_u(&l, "queries.sent")),
                ("echoed", json_u(&l, "queries.answered")),
            ),
            Check::equal(
                "counters equal (connections: load established vs echo accepted, less the \
                 bench's one readiness probe)",
                ("established", est),
                ("accepted", json_u(&e, "accepted").saturating_sub(1)),
            ),
            Check::equal(
                "counters equal (bytes: load sent vs echo read)",
                ("sent", json_u(&l, "queries.bytes_sent")),
                ("read", json_u(&e, "bytes_in")),
            ),
            Check::equal(
                "counters equal (bytes: echo wrote vs load read)",
                ("wrote", json_u(&e, "bytes_out")),
                ("read", json_u(&l, "queries.bytes_received")),
            ),
        ])
    }
}

// ---------------------------------------------------------------- balance

const BAL_RATE: u64 = 5_000;
const VIP: &str = "198.19.0.1:6379";
/// A failed connect within this of a backend's stop is the health check's to catch
/// (200 ms interval, 200 ms timeout, fall 1): not a fault of the balancer.
const DETECT_MS: u64 = 1_500;

/// `balance up` over two redis backends under 5,000 connects/s from a client in its cgroup, a
/// `balance reload` every 5 s (the algorithm alternating), one backend stopped for 10 s of
/// every 20.
pub(crate) struct BalanceRole {
    lab: Lab,
    cli: Host,
    srv: Host,
    cgroup: Cgroup,
    tcpkit: String,
    bench: String,
    config: PathBuf,
    socket: PathBuf,
    up: Bg,
    client: Option<Bg>,
    flapper: Option<Proc>,
    stops_ms: Vec<u64>,
    reloads: (u64, u64),
    last_reload: f64,
    flaps: u64,
    secs: f64,
}

const BAL_METRICS: &str = "127.0.0.1:9477";

/// Where cgroup2 is mounted here (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid
/// host).
fn cgroup2_mount() -> Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .find(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|t| t.starts_with("cgroup2 "))
        })
        .and_then(|l| l.split_whitespace().nth(4))
        .map(PathBuf::from)
        .context("no cgroup2 mount on this host (balance needs one)")
}

fn lb_toml(algorithm: &str) -> String {
    format!(
        "[[service]]\nname = \"redis\"\nvip = \"{VIP}\"\nalgorithm = \"{algorithm}\"\n\
         backends = [ {{ addr = \"198.18.1.2:6379\" }}, {{ addr = \"198.18.1.2:6380\" }} ]\n\
         health = {{ interval = \"200ms\", timeout = \"200ms\", rise = 1, fall = 1, \
         send = 'PING\\r\\n', expect = \"+PONG\" }}\n"
    )
}

impl BalanceRole {
    pub(crate) fn start(tcpkit: &Path, bench: &Path, secs: f64) -> Result<BalanceRole> {
        let mut lab = Lab::new("bsbal")?;
        let cli = lab.host("cli")?;
        let srv = lab.host("srv")?;
        lab.link(
            &cli,
            &srv,
            &LinkOpts::addrs("198.18.1.1/24", "198.18.1.2/24"),
        )?;
        cli.sysctl("net.ipv4.ip_local_port_range", "10000 65000")?;
        cli.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
        srv.sysctl("net.core.somaxconn", "4096")?;
        srv.sysctl("net.ipv4.tcp_max_syn_backlog", "8192")?;
        crate::balance::redis_server(&mut lab, &srv, "6379", "redis-6379")?;
        let flapper = crate::balance::redis_server(&mut lab, &srv, "6380", "redis-6380")?;
        let cgroup = Cgroup::new(&cgroup2_mount()?, "soak")?;
        let config = lab.dir().join("lb.toml");
        std::fs::write(&config, lb_toml("random"))?;
        let socket = lab.dir().join("up.sock");
        let tk = s(tcpkit).to_string();
        let dir = lab.dir().to_path_buf();
        let up = Bg::spawn(
            &cli,
            &dir,
            "balance-up",
            &[
                &tk,
                "balance",
                "up",
                "--config",
                s(&config),
                "--cgroup",
                cgroup.rel(),
                "--socket",
                s(&socket),
                "--metrics",
                BAL_METRICS,
                "--json",
            ],
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&up.err)
            .unwrap_or_default()
            .contains("status: tcpkit balance status")
        {
            if Instant::now() > deadline {
                bail!("balance up not ready in 20 s: {}", up.err_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(BalanceRole {
            lab,
            cli,
            srv,
            cgroup,
            tcpkit: tk,
            bench: s(bench).to_string(),
            config,
            socket,
            up,
            client: None,
            flapper: Some(flapper),
            stops_ms: Vec::new(),
            reloads: (0, 0),
            last_reload: 0.0,
            flaps: 0,
            secs,
        })
    }

    fn go(&mut self) -> Result<()> {
        let dir = self.lab.dir().to_path_buf();
        let (r, t) = (
            BAL_RATE.to_string(),
            format!("{}", self.secs + TRAFFIC_TAIL_S),
        );
        let c = Bg::spawn(
            &self.cli,
            &dir,
            "connect-client",
            &[
                &self.bench,
                "soak-connect",
                VIP,
                &r,
                "4",
                &t,
                self.cgroup.rel(),
            ],
        )?;
        // The client waits until it sees itself in the cgroup before its first connect.
        self.cgroup.join(c.pid())?;
        self.client = Some(c);
        Ok(())
    }

    fn client_lines(&self, tag: &str) -> Vec<String> {
        let Some(c) = &self.client else {
            return Vec::new();
        };
        std::fs::read_to_string(&c.out)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(tag))
            .map(str::to_string)
            .collect()
    }
}

/// `made failed` of a `LIVE`/`DONE` line.
fn made_failed(line: &str) -> (u64, u64) {
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    (
        f.first().copied().unwrap_or(0),
        f.get(1).copied().unwrap_or(0),
    )
}

impl Role for BalanceRole {
    fn name(&self) -> &'static str {
        "balance"
    }

    fn procs(&self) -> Vec<(String, u32)> {
        vec![("balance up".into(), self.up.pid())]
    }

    fn tick(&mut self, t: f64) -> Result<()> {
        if self.client.is_none() {
            self.go()?;
            self.last_reload = t;
        }
        if !self.up.running() {
            bail!("balance up ended early: {}", self.up.err_tail());
        }
        if t - self.last_reload >= 5.0 {
            self.last_reload = t;
            let alg = if self.reloads.0.is_multiple_of(2) {
                "round-robin"
            } else {
                "random"
            };
            std::fs::write(&self.config, lb_toml(alg))?;
            let o = self
                .cli
                .command(&[
                    &self.tcpkit,
                    "balance",
                    "reload",
                    "--socket",
                    s(&self.socket),
                ])
                .output()?;
            self.reloads.0 += 1;
            if !o.status.success() {
                self.reloads.1 += 1;
                eprintln!(
                    "soak: balance reload refused: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
        }
        // One backend stopped at 10 s, 30 s, 50 s ... and started again 10 s later.
        let phase = ((t / 10.0).floor() as u64) % 2 == 1;
        match (&self.flapper, phase) {
            (Some(p), true) if t < self.secs - 5.0 => {
                self.stops_ms.push(unix_ms());
                let _ = p.stop();
                self.flapper = None;
                self.flaps += 1;
            }
            (None, false) => {
                let name = format!("redis-6380-{}", self.flaps);
                self.flapper = Some(crate::balance::redis_server(
                    &mut self.lab,
                    &self.srv,
                    "6380",
                    &name,
                )?);
            }
            _ => {}
        }
        Ok(())
    }

    fn counters(&mut self) -> Vec<(String, f64)> {
        let m = scrape(&self.cli, BAL_METRICS);
        let mut v: Vec<(String, f64)> = [
            "tcpkit_balance_translated_total",
            "tcpkit_balance_refused_total",
            "tcpkit_balance_reloads_total",
            "tcpkit_balance_reloads_refused_total",
        ]
        .iter()
        .map(|k| (k.to_string(), metric(&m, k)))
        .collect();
        if let Some(l) = self.client_lines("LIVE").last() {
            let (made, failed) = made_failed(l);
            v.push(("client connects made".into(), made as f64));
            v.push(("client connects failed".into(), failed as f64));
        }
        v
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<Check>> {
        let mut c = self.client.take().context("the client never started")?;
        c.wait(Duration::from_secs(120))?;
        self.client = Some(c);
        let m = scrape(&self.cli, BAL_METRICS);
        let done = self
            .client_lines("DONE")
            .last()
            .cloned()
            .with_context(|| "the connect client did not finish".to_string())?;
        let (made, failed) = made_failed(&done);
        let fails: Vec<u64> = self
            .client_lines("FAIL")
            .iter()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        let in_window = |ms: u64| self.stops_ms.iter().any(|s| ms >= *s && ms < s + DETECT_MS);
        let caught = fails.iter().filter(|m| in_window(**m)).count() as u64;
        let outside = failed.saturating_sub(caught);
        let reasons: Vec<String> = self
            .client_lines("FAIL")
            .iter()
            .filter(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .is_some_and(|ms| !in_window(ms))
            })
            .take(3)
            .cloned()
            .collect();
        self.up.stop(Duration::from_secs(30))?;
        let translated = metric(&m, "tcpkit_balance_translated_total") as u64;
        // Each flap: the stopped backend's half of the connects for the detection time.
        let allowed = self.stops_ms.len() as u64 * BAL_RATE / 2 * DETECT_MS / 1000;
        Ok(vec![
            Check {
                target: "0 failed connects while no backend had just stopped".into(),
                figures: format!(
                    "{outside} failed of {} ({} flaps){}",
                    made + failed,
                    self.stops_ms.len(),
                    if reasons.is_empty() {
                        String::new()
                    } else {
                        format!("; e.g. {}", reasons.join("; "))
                    }
                ),
                bound: "0".into(),
                met: outside == 0,
            },
            Check {
                target: format!(
                    "failed connects within {DETECT_MS} ms of a backend's stop (the health \
                     check's to catch: 200 ms interval, fall 1)"
                ),
                figures: format!("{caught}"),
                bound: format!("≤ {allowed} (half of {BAL_RATE}/s × {DETECT_MS} ms per flap)"),
                met: caught <= allowed,
            },
            Check::equal(
                "counters equal (connects the client made or failed vs balance's translated)",
                ("client", made + failed),
                ("translated", translated),
            ),
            Check::equal(
                "reloads: every one in force",
                ("asked", self.reloads.0),
                (
                    "in force",
                    metric(&m, "tcpkit_balance_reloads_total") as u64,
                ),
            ),
            Check::zero(
                "reloads: 0 refused",
                "refused",
                metric(&m, "tcpkit_balance_reloads_refused_total") as u64 + self.reloads.1,
            ),
        ])
    }
}

/// The balance role's client (see [`super::connect_client`]).
pub(crate) fn connect_client(args: &[String]) -> Result<()> {
    let [addr, rate, threads, secs, cgroup] = args else {
        bail!("soak-connect ADDR RATE THREADS SECS CGROUP");
    };
    let addr: SocketAddr = addr.parse().context("soak-connect: ADDR")?;
    let rate: f64 = rate.parse().context("soak-connect: RATE")?;
    let threads: usize = threads.parse().context("soak-connect: THREADS")?;
    let secs: f64 = secs.parse().context("soak-connect: SECS")?;
    // Balance translates only connects made inside its cgroup: none before we are in it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .contains(cgroup.as_str())
    {
        if Instant::now() > deadline {
            bail!("soak-connect: not moved into {cgroup} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let made = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let t0 = Instant::now();
    let gap = Duration::from_secs_f64(threads as f64 / rate);
    let workers: Vec<_> = (0..threads)
        .map(|k| {
            let (made, failed, out) = (made.clone(), failed.clone(), out.clone());
            std::thread::spawn(move || {
                // Each thread's schedule is offset by its share of one gap.
                let mut next = t0 + gap.mul_f64(k as f64 / threads as f64);
                while t0.elapsed().as_secs_f64() < secs {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    next += gap;
                    let r = crate::balance::connect_ping(addr, Duration::from_secs(2));
                    match r {
                        Ok(_) => {
                            made.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            let n = failed.fetch_add(1, Ordering::Relaxed);
                            // Bounded: a broken run must not fill the disk with lines.
                            if n < 100_000 {
                                if let Ok(mut o) = out.lock() {
                                    let _ = writeln!(o, "FAIL {} {e}", unix_ms());
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(mut o) = out.lock() {
            let _ = writeln!(
                o,
                "LIVE {} {}",
                made.load(Ordering::Relaxed),
                failed.load(Ordering::Relaxed)
            );
            let _ = o.flush();
        }
        std::thread::sleep(Duration::from_millis(800));
    }
    for w in workers {
        let _ = w.join();
    }
    let mut o = out.lock().map_err(|_| anyhow::anyhow!("stdout lock"))?;
    writeln!(
        o,
        "DONE {} {} {:.1}",
        made.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64()
    )?;
    Ok(())
}

// ---------------------------------------------------------------- mpcat

/// 50 GB in 30 minutes: 27.75 MB/s (222 Mbit/s), a little over a path's 200 Mbit/s.
const MPCAT_RATE_BPS: u64 = 27_750_000;
const MPCAT_PORT: &str = "5201";

/// The stream mpcat carries: xorshift64 words from a fixed seed, so the receiving side can
/// check every byte against the same generator without keeping anything.
struct Stream(u64);

impl Stream {
    fn new() -> Stream {
        Stream(0x9e37_79b9_7f4a_7c15)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_exact_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            c.copy_from_slice(&self.0.to_le_bytes());
        }
    }
}

/// mpcat over four paths of 200 Mbit/s (tbf) with ECMP, paced so 50 GB take 30 minutes, one
/// path's link set down for 20 s of every minute.
pub(crate) struct MpcatRole {
    _lab: Lab,
    a: Host,
    b: Host,
    flip_dev: String,
    dir: PathBuf,
    tcpkit: String,
    size: u64,
    secs: f64,
    tx: Option<Bg>,
    rx: Option<Bg>,
    received: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
    checker: Option<std::thread::JoinHandle<()>>,
    feeder: Option<std::thread::JoinHandle<()>>,
    down: bool,
    flips: u64,
}

impl MpcatRole {
    pub(crate) fn start(tcpkit: &Path, secs: f64) -> Result<MpcatRole> {
        let tbf = Tbf {
            rate_bit_s: 200_000_000,
            burst_bytes: 64_000,
            latency_ms: 100,
        };
        let (lab, a, b, links) = Lab::multipath("bsmp", 4, Some(tbf))?;
        let flip_dev = links[1].a.name.clone();
        let size = (MPCAT_RATE_BPS as f64 * (secs + TRAFFIC_TAIL_S)) as u64 & !7;
        Ok(MpcatRole {
            dir: lab.dir().to_path_buf(),
            _lab: lab,
            a,
            b,
            flip_dev,
            tcpkit: s(tcpkit).to_string(),
            size,
            secs,
            tx: None,
            rx: None,
            received: Arc::new(AtomicU64::new(0)),
            wrong: Arc::new(AtomicU64::new(0)),
            checker: None,
            feeder: None,
            down: false,
            flips: 0,
        })
    }

    fn go(&mut self) -> Result<()> {
        let err = self.dir.join("mpcat-rx.err");
        let mut rx = self
            .b
            .command(&[&self.tcpkit, "mpcat", "-l", "-p", MPCAT_PORT])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err)?)
            .spawn()
            .context("start the mpcat receiver")?;
        let mut out = rx.stdout.take().context("receiver stdout")?;
        let (received, wrong) = (self.received.clone(), self.wrong.clone());
        self.checker = Some(std::thread::spawn(move || {
            let mut want = Stream::new();
            let mut got = vec![0u8; 1 << 20];
            let mut exp = vec![0u8; 1 << 20];
            // Bytes read but not yet checked: the expected stream is made 8 bytes at a time.
            let mut have = 0usize;
            loop {
                let n = match out.read(&mut got[have..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                have += n;
                let whole = have & !7;
                want.fill(&mut exp[..whole]);
                let bad = got[..whole]
                    .iter()
                    .zip(&exp[..whole])
                    .filter(|(x, y)| x != y)
                    .count();
                wrong.fetch_add(bad as u64, Ordering::Relaxed);
                received.fetch_add(whole as u64, Ordering::Relaxed);
                got.copy_within(whole..have, 0);
                have -= whole;
            }
            received.fetch_add(have as u64, Ordering::Relaxed);
        }));
        let mut rx = Bg::adopt("mpcat-rx", rx, err);
        let addr = format!("{MULTIPATH_B4}:{MPCAT_PORT}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .b
            .run(&["ss", "-Hltn", "sport = :5201"])?
            .stdout
            .is_empty()
        {
            if !rx.running() || Instant::now() > deadline {
                bail!(
                    "the mpcat receiver never listened on {addr}: {}",
                    rx.err_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.rx = Some(rx);
        let size = self.size.to_string();
        let txerr = self.dir.join("mpcat-tx.err");
        let txout = self.dir.join("mpcat-tx.out");
        let mut tx = self
            .a
            .command(&[
                &self.tcpkit,
                "mpcat",
                "--size",
                &size,
                "--rate-limit",
                "222Mbit",
                "--json",
                MULTIPATH_B4,
                MPCAT_PORT,
            ])
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&txout)?)
            .stderr(std::fs::File::create(&txerr)?)
            .spawn()
            .context("start the mpcat sender")?;
        let mut input = tx.stdin.take().context("sender stdin")?;
        let total = self.size;
        self.feeder = Some(std::thread::spawn(move || {
            let mut g = Stream::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut left = total;
            while left > 0 {
                let n = (buf.len() as u64).min(left) as usize;
                g.fill(&mut buf[..n]);
                if input.write_all(&buf[..n]).is_err() {
                    break;
                }
                left -= n as u64;
            }
        }));
        let mut b = Bg::adopt("mpcat-tx", tx, txerr);
        b.out = txout;
        self.tx = Some(b);
        Ok(())
    }

    fn link(&self, up: bool) -> Result<()> {
        let state = if up { "up" } else { "down" };
        self.a
            .run(&["ip", "link", "set", "dev", &self.flip_dev, state])?;
        Ok(())
    }
}

impl Role for MpcatRole {
    fn name(&self) -> &'static str {
        "mpcat"
    }

    fn procs(&self) -> Vec<(String, u32)> {
        [(&self.tx, "mpcat sender"), (&self.rx, "mpcat receiver")]
            .into_iter()
            .filter_map(|(b, n)| Some((n.to_string(), b.as_ref()?.pid())))
            .collect()
    }

    fn tick(&mut self, t: f64) -> Result<()> {
        if self.tx.is_none() {
            self.go()?;
        }
        // Down at 30 s of each minute, up at 50 s.
        let in_minute = t % 60.0;
        let want_down = (30.0..50.0).contains(&in_minute) && t < self.secs - 10.0;
        if want_down != self.down {
            self.link(!want_down)?;
            self.down = want_down;
            if want_down {
                self.flips += 1;
            }
        }
        Ok(())
    }

    fn counters(&mut self) -> Vec<(String, f64)> {
        vec![
            (
                "bytes received and checked".into(),
                self.received.load(Ordering::Relaxed) as f64,
            ),
            (
                "bytes wrong".into(),
                self.wrong.load(Ordering::Relaxed) as f64,
            ),
        ]
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<Check>> {
        if self.down {
            self.link(true)?;
        }
        let limit = Duration::from_secs_f64(120.0 + self.secs * 0.25);
        let mut tx = self.tx.take().context("the sender never started")?;
        let mut rx = self.rx.take().context("the receiver never started")?;
        let tx_ok = tx.wait(limit);
        let rx_ok = rx.wait(Duration::from_secs(60));
        if let Some(f) = self.feeder.take() {
            let _ = f.join();
        }
        if let Some(c) = self.checker.take() {
            let _ = c.join();
        }
        let got = self.received.load(Ordering::Relaxed);
        let wrong = self.wrong.load(Ordering::Relaxed);
        let v = tx.json().unwrap_or_default();
        let exited = |r: Result<bool>, b: &Bg| match r {
            Ok(true) => String::new(),
            Ok(false) => format!("{} exited non-zero: {}", b.name, b.err_tail()),
            Err(e) => format!("{e:#}"),
        };
        let (tx_why, rx_why) = (exited(tx_ok, &tx), exited(rx_ok, &rx));
        Ok(vec![
            Check::equal(
                "bytes sent vs received (all of the stream)",
                ("sent", self.size),
                ("received", got),
            ),
            Check::zero("0 bytes wrong (checked against the stream)", "wrong", wrong),
            Check {
                target: format!(
                    "both ends verified the hash and exited 0 ({} link flips)",
                    self.flips
                ),
                figures: format!(
                    "sender verified {}, {} reconnects, {} bytes resent{}{}",
                    v["verified"],
                    json_u(&v, "reconnects"),
                    json_u(&v, "resent_bytes"),
                    if tx_why.is_empty() { "" } else { "; " },
                    [tx_why.as_str(), rx_why.as_str()].join(" ").trim()
                ),
                bound: "verified, exit 0".into(),
                met: v["verified"] == serde_json::Value::Bool(true)
                    && tx_why.is_empty()
                    && rx_why.is_empty(),
            },
        ])
    }
}
