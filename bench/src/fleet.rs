//! `tcpkit-bench fleet`: many hosts as one run (issue 25). Three agent namespaces hold 40,000
//! connections each (120,000: two source addresses per agent and round, past one address's
//! 28,232 ports) to one `tcpkit echo --dns` in a server namespace, started by deploy/ansible's
//! playbook (`fleet.yml`: barrier on the controller, agents over SSH, reports fetched and
//! merged); beside it, in the same run and interleaved, the peers' way: dnsperf on the same
//! three namespaces, started over SSH by a shell loop on the controller, its counts summed by
//! hand. Measured for both: the spread of the agents' first queries at the server (tcpdump:
//! the first query from each agent's addresses) and the time from "go" to each; for tcpkit also
//! the spread of the actual starts its reports give (fleet fields, on the controller's clock),
//! the merged answered count against the sum of the agents' own and echo's own, and what the
//! barrier costs (its CPU and memory, the lead it gives the start, the wait for ready).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tcpkit_lab::{Fleet, Host, Proc, Signal, SSH_PORT};

/// Where echo listens in the server namespace.
const PORT: u16 = 5300;
/// The name every query asks.
const QNAME: &str = "www.example";

/// What one run of one way gave.
#[derive(Debug, Default, Clone)]
struct Outcome {
    /// Per agent (in agent order): the first query at the server, unix ns (tcpdump).
    first_at_server: Vec<Option<u64>>,
    /// The "go" instant, unix ns: tcpkit's start instant (the barrier's, controller clock);
    /// for the shell loop, when the loop began.
    go_ns: u64,
    /// When the run was launched (the playbook or the loop started), unix ns.
    launched_ns: u64,
    /// Per agent: its actual start on the controller's clock (tcpkit reports only).
    actual_starts: Vec<u64>,
    /// Answered: merged (tcpkit merge), the sum of the agents' own counts, echo's own count.
    merged: Option<u64>,
    agents_sum: u64,
    echo: u64,
    /// The merged run's answered rate (tcpkit), or the sum of the agents' rates (dnsperf).
    rate: f64,
    /// Connections held at the start, summed over agents.
    conns: u64,
    /// tcpkit only: what the barrier cost.
    barrier: Option<BarrierCost>,
    /// The whole run, launch to end.
    wall_s: f64,
}

/// The barrier's own costs, from GNU time around it.
#[derive(Debug, Default, Clone, Copy)]
struct BarrierCost {
    cpu_s: f64,
    rss_kb: u64,
    /// Launch to the last agent's ready (barrier clock): the playbook reaching every host,
    /// each agent preparing (opening its connections) and its clock samples.
    ready_s: f64,
    /// The start's lead over the moment the barrier gave it (the barrier's `lead_ns`): what
    /// the barrier adds past the last ready.
    lead_ms: f64,
    /// The agents' actual starts' spread as the barrier laid them on its clock.
    spread_ms: f64,
}

struct Params {
    rounds: usize,
    secs: u64,
    rate: u64,
    conns_per_agent: u64,
    /// The fleet's --connect-rate (each agent opens its share of it).
    connect_rate: u64,
    dnsperf_clients: u64,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn spread_ms(v: &[u64]) -> Option<f64> {
    let (lo, hi) = (v.iter().min()?, v.iter().max()?);
    Some((hi - lo) as f64 / 1e6)
}

/// The lab: a controller, three agents with two source addresses each per tcpkit round, one
/// server.
struct Env {
    fleet: Fleet,
    bin: PathBuf,
    dir: PathBuf,
    /// Each agent's addresses, its LAN address first: what its queries may come from.
    sources: Vec<Vec<String>>,
    /// tcpkit rounds so far: each takes two fresh addresses per agent.
    tcpkit_rounds: usize,
}

impl Env {
    fn server(&self) -> &Host {
        &self.fleet.servers[0].host
    }

    fn server_addr(&self) -> String {
        self.fleet.servers[0].addr.to_string()
    }

    /// `tcpkit echo --dns --json` in the server, with enough processes for every connection
    /// under a 20,000-descriptor limit, once it listens.
    fn echo(&mut self, conns: u64) -> Result<Proc> {
        let procs = conns.div_ceil(19_000).max(1).to_string();
        let bin = self.bin.to_string_lossy().into_owned();
        let port = PORT.to_string();
        let argv = [
            bin.as_str(),
            "echo",
            "--dns",
            "--port",
            &port,
            "--procs",
            &procs,
            "--json",
        ];
        let host = self.fleet.servers[0].host.clone();
        let p = host.spawn(&mut self.fleet.lab, "echo", &argv)?;
        let addr = format!("{}:{PORT}", self.server_addr()).parse()?;
        let up = self.fleet.controller.host.enter(|| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        });
        if !up {
            bail!("echo never listened: {}", p.log());
        }
        Ok(p)
    }

    /// tcpdump of every query arriving at the server (TCP with data toward echo's port), so
    /// the first query from each agent's addresses is on record.
    fn capture(&mut self) -> Result<tcpkit_lab::Tcpdump> {
        let host = self.server().clone();
        Ok(self.fleet.lab.tcpdump(
            &host,
            "eth0",
            &format!("tcp dst port {PORT} and (tcp[tcpflags] & tcp-push != 0)"),
        )?)
    }

    /// Per agent, the first query's arrival in `cap` (unix ns).
    fn first_queries(&self, cap: &tcpkit_lab::Capture) -> Result<Vec<Option<u64>>> {
        let f = tcpkit_pcap::CaptureFile::open(&cap.path)?;
        let mut first: Vec<Option<u64>> = vec![None; self.sources.len()];
        for p in f.packets() {
            let p = p?;
            let Ok(s) = etherparse::SlicedPacket::from_ethernet(p.data) else {
                continue;
            };
            let Some(etherparse::NetSlice::Ipv4(ip)) = s.net else {
                continue;
            };
            let src = ip.header().source_addr().to_string();
            if let Some(k) = self.sources.iter().position(|a| a.contains(&src)) {
                first[k].get_or_insert(p.ts_ns);
            }
            if first.iter().all(Option::is_some) {
                break;
            }
        }
        Ok(first)
    }
}

impl Env {
    /// The binary the playbook runs: tcpkit itself, the barrier under GNU time so its CPU and
    /// peak memory are on record (`barrier.time` in the lab's directory).
    fn timed_bin(&self) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let w = self.dir.join("tcpkit-timed");
        let real = self.bin.display();
        std::fs::write(
            &w,
            format!(
                "#!/bin/sh\n\
                 if [ \"$1\" = barrier ]; then\n\
                 exec /usr/bin/time -o {t} -f '%U %S %M' {real} \"$@\"\n\
                 fi\n\
                 exec {real} \"$@\"\n",
                t = self.dir.join("barrier.time").display()
            ),
        )?;
        std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755))?;
        Ok(w)
    }
}

fn stop_echo(p: &Proc) -> Result<u64> {
    p.signal(Signal::SIGTERM)?;
    p.wait_timeout(Duration::from_secs(20))?
        .context("echo did not stop on SIGTERM")?;
    let log = p.log();
    let line = log
        .lines()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no echo report: {log}"))?;
    let v: Value = serde_json::from_str(line)?;
    v["answered"].as_u64().context("echo report: answered")
}

fn json_u(v: &Value, path: &str) -> u64 {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// One tcpkit run: `ansible-playbook fleet.yml` on the controller, echo started and stopped
/// by the play, the reports merged by it.
fn tcpkit_run(env: &mut Env, p: &Params) -> Result<Outcome> {
    let results = env.dir.join(format!("results-{}", now_ns()));
    std::fs::create_dir_all(&results)?;
    let agents = env.fleet.agents.len() as u64;
    let total = p.conns_per_agent * agents;
    // Two fresh source addresses per agent for each round: the last round's 40,000 ports per
    // agent are still in TIME_WAIT (60 s), and a connect from them fails (EADDRNOTAVAIL).
    // Two, because 40,000 connections to one address:port need two under the default port
    // range (28,232 ports).
    let mut host_vars: Vec<(String, Value)> = Vec::new();
    for (i, a) in env.fleet.agents.iter().enumerate() {
        let pair: Vec<String> = (0..2)
            .map(|j| format!("198.18.0.{}", 64 + env.tcpkit_rounds * 8 + i * 2 + j))
            .collect();
        for ip in &pair {
            a.host
                .run(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        }
        host_vars.push((a.name.clone(), json!({ "tcpkit_source": pair.join(",") })));
        env.sources[i].extend(pair);
    }
    env.tcpkit_rounds += 1;
    let host_vars: Vec<(&str, Value)> = host_vars
        .iter()
        .map(|(n, v)| (n.as_str(), v.clone()))
        .collect();
    let vars = json!({
        "tcpkit_install": false,
        "tcpkit_tune": false,
        "tcpkit_bin": env.timed_bin()?,
        "tcpkit_echo": true,
        "tcpkit_echo_port": PORT,
        "tcpkit_echo_args": format!("--dns --procs {}", total.div_ceil(19_000)),
        "tcpkit_target": format!("{}:{PORT}", env.server_addr()),
        "tcpkit_rate": p.rate,
        "tcpkit_connections": total,
        "tcpkit_duration": format!("{}s", p.secs),
        // The fleet's connect rate, shared by the shards: 120,000 open in about 10 s (load's
        // default, 1,000/s, would take two minutes).
        "tcpkit_load_args": format!("--dns --qname {QNAME} --connect-rate {}", p.connect_rate),
        "tcpkit_ready_timeout": "120s",
        "tcpkit_run_dir": env.dir.join("run"),
        "tcpkit_results_dir": results,
        "tcpkit_barrier_host": env.fleet.controller.addr.to_string(),
    });
    let inventory = env.dir.join("inventory.json");
    env.fleet.inventory(&inventory, &vars, &host_vars, &[])?;
    let playbook = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/ansible");
    let cfg = playbook.join("ansible.cfg");
    let inv = inventory.to_string_lossy().into_owned();
    let book = playbook.join("fleet.yml").to_string_lossy().into_owned();
    let cap = env.capture()?;
    let mut cmd = env.fleet.ansible_playbook(&cfg, &["-i", &inv, &book])?;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let launched_ns = now_ns();
    let t0 = Instant::now();
    let ran = crate::run_wait4(cmd, "ansible-playbook")?;
    let wall_s = t0.elapsed().as_secs_f64();
    let pcap = cap.stop()?;
    if ran.code != Some(0) {
        bail!(
            "ansible-playbook exited {:?}: {}{}",
            ran.code,
            tail(&ran.out, 30),
            tail(&ran.err, 10)
        );
    }
    let read = |p: &Path| -> Result<Value> {
        serde_json::from_slice(&std::fs::read(p).with_context(|| p.display().to_string())?)
            .with_context(|| p.display().to_string())
    };
    let mut o = Outcome {
        launched_ns,
        wall_s,
        conns: 0,
        ..Outcome::default()
    };
    let mut go = Vec::new();
    for a in &env.fleet.agents {
        let r = read(&results.join("reports").join(format!("{}.json", a.name)))?;
        let f = &r["fleet"];
        let off = f["clock_offset_ns"].as_i64().unwrap_or(0);
        let on_ctl = |k: &str| (f[k].as_u64().unwrap_or(0) as i64 - off) as u64;
        o.actual_starts.push(on_ctl("actual_start_unix_ns"));
        go.push(on_ctl("intended_start_unix_ns"));
        o.agents_sum += json_u(&r, "queries.answered");
        o.conns += json_u(&r, "connections.peak_open");
    }
    o.go_ns = go.iter().copied().min().unwrap_or(0);
    let merged = read(&results.join("merged.json"))?;
    o.merged = Some(json_u(&merged, "queries.answered"));
    o.rate = merged["rates"]["answered_qps"].as_f64().unwrap_or(0.0);
    let echo = read(&results.join(format!("echo-{}.json", env.fleet.servers[0].name)))?;
    o.echo = json_u(&echo, "answered");
    o.first_at_server = env.first_queries(&pcap)?;
    // GNU time's "%U %S %M" around the barrier (the wrapper Env::timed_bin writes).
    let t = std::fs::read_to_string(env.dir.join("barrier.time")).unwrap_or_default();
    let f: Vec<f64> = t
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let b = read(
        &env.dir
            .join("run")
            .join(&env.fleet.controller.name)
            .join("barrier.json"),
    )?;
    if let [user, sys, rss] = f[..] {
        o.barrier = Some(BarrierCost {
            cpu_s: user + sys,
            rss_kb: rss as u64,
            ready_s: (json_u(&b, "all_ready_unix_ns") as f64 - launched_ns as f64) / 1e9,
            lead_ms: json_u(&b, "lead_ns") as f64 / 1e6,
            spread_ms: json_u(&b, "start_spread_ns") as f64 / 1e6,
        });
    }
    Ok(o)
}

/// One run of the peers' way: a shell loop on the controller starts dnsperf on every agent
/// over SSH at once; the counts are each dnsperf's own, summed.
fn dnsperf_run(env: &mut Env, p: &Params) -> Result<Outcome> {
    let agents = env.fleet.agents.len() as u64;
    let echo = env.echo(p.dnsperf_clients * agents)?;
    let data = env.dir.join("dnsperf.txt");
    std::fs::write(&data, format!("{QNAME} A\n"))?;
    let ssh = env
        .fleet
        .keys
        .client_options(env.fleet.known_hosts())
        .join(" ");
    let mut script = String::from("echo go $(date +%s%N)\n");
    for a in &env.fleet.agents {
        script.push_str(&format!(
            "ssh {ssh} -p {SSH_PORT} {addr} dnsperf -s {srv} -p {PORT} -m tcp -c {c} -Q {r} -l {s} -q 1000 -d {d} > {out} 2>&1 &\n",
            addr = a.addr,
            srv = env.server_addr(),
            c = p.dnsperf_clients,
            r = p.rate / agents,
            s = p.secs,
            d = data.display(),
            out = env.dir.join(format!("dnsperf-{}.txt", a.name)).display(),
        ));
    }
    script.push_str("wait\n");
    let cap = env.capture()?;
    let cmd = env.fleet.controller.host.command(&["sh", "-c", &script]);
    let launched_ns = now_ns();
    let t0 = Instant::now();
    let ran = crate::run_wait4(cmd, "the ssh loop")?;
    let wall_s = t0.elapsed().as_secs_f64();
    let pcap = cap.stop()?;
    let answered = stop_echo(&echo)?;
    let go_ns = ran
        .out
        .lines()
        .find_map(|l| l.strip_prefix("go ")?.trim().parse().ok())
        .context("the loop's go line")?;
    let mut o = Outcome {
        go_ns,
        launched_ns,
        wall_s,
        echo: answered,
        conns: p.dnsperf_clients * agents,
        ..Outcome::default()
    };
    for a in &env.fleet.agents {
        let f = env.dir.join(format!("dnsperf-{}.txt", a.name));
        let out = std::fs::read_to_string(&f)?;
        let num = |label: &str| crate::dnsperf_figure(&out, label);
        let done = num("Queries completed")
            .with_context(|| format!("dnsperf on {}: no statistics: {}", a.name, tail(&out, 5)))?;
        o.agents_sum += done as u64;
        o.rate += num("Queries per second").unwrap_or(0.0);
    }
    o.first_at_server = env.first_queries(&pcap)?;
    Ok(o)
}

/// The play's failure in `err` on one line: its verdict message from the barrier's first
/// line (which names the agent and why) on, whitespace folded.
fn failure_of(err: &str) -> String {
    let flat = err.split_whitespace().collect::<Vec<_>>().join(" ");
    let from = flat
        .find("barrier: exit")
        .or_else(|| flat.find("msg:"))
        .unwrap_or(0);
    let s = &flat[from..];
    let end = s.find("\\nagent").unwrap_or(s.len());
    s[..end].chars().take(400).collect()
}

fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..].join("\n")
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn cell(v: Option<f64>, unit: &str, prec: usize) -> String {
    v.map_or("—".into(), |x| format!("{x:.prec$} {unit}"))
}

/// The rows of the table: tcpkit's figure beside the peers', each the median over rounds.
fn table(t: &[Outcome], d: &[Outcome]) -> String {
    let med = |os: &[Outcome], f: &dyn Fn(&Outcome) -> Option<f64>| {
        median(os.iter().filter_map(f).collect())
    };
    let server_spread = |o: &Outcome| {
        let v: Option<Vec<u64>> = o.first_at_server.iter().copied().collect();
        spread_ms(&v?)
    };
    let go_to_first = |o: &Outcome| {
        o.first_at_server
            .iter()
            .map(|f| {
                f.map_or("—".into(), |f| {
                    format!("{:.1}", (f as f64 - o.go_ns as f64) / 1e6)
                })
            })
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let launch_to_first = |o: &Outcome| {
        let v: Option<Vec<u64>> = o.first_at_server.iter().copied().collect();
        Some((*v?.iter().max()? as f64 - o.launched_ns as f64) / 1e9)
    };
    let counts = |o: &Outcome| {
        format!(
            "{} / {} / {}",
            o.merged.map_or("—".into(), |m| m.to_string()),
            o.agents_sum,
            o.echo
        )
    };
    let per_round = |os: &[Outcome], f: &dyn Fn(&Outcome) -> String| {
        os.iter().map(f).collect::<Vec<_>>().join("; ")
    };
    let mut md = String::from(
        "| measurement | tcpkit (playbook + barrier) | dnsperf (ssh loop) |\n|---|---|---|\n",
    );
    let mut row =
        |name: &str, a: String, b: String| md.push_str(&format!("| {name} | {a} | {b} |\n"));
    row(
        "connections held, all agents",
        per_round(t, &|o| o.conns.to_string()),
        per_round(d, &|o| o.conns.to_string()),
    );
    row(
        "spread of actual starts, from the reports (median)",
        cell(med(t, &|o| spread_ms(&o.actual_starts)), "ms", 3),
        "— (no start in its output)".into(),
    );
    row(
        "spread of first queries at the server, tcpdump (median)",
        cell(med(t, &server_spread), "ms", 3),
        cell(med(d, &server_spread), "ms", 3),
    );
    row(
        "go → first query at the server, per agent, ms (each round)",
        per_round(t, &go_to_first),
        per_round(d, &go_to_first),
    );
    row(
        "launch → last agent's first query (median)",
        cell(med(t, &launch_to_first), "s", 2),
        cell(med(d, &launch_to_first), "s", 2),
    );
    row(
        "answered: merged / sum of agents' own / echo's own (each round)",
        per_round(t, &counts),
        per_round(d, &counts),
    );
    row(
        "merged − echo, % of echo (worst round)",
        cell(
            t.iter()
                .map(|o| {
                    (o.merged.unwrap_or(0) as f64 - o.echo as f64).abs() / o.echo.max(1) as f64
                        * 100.0
                })
                .reduce(f64::max),
            "%",
            3,
        ),
        cell(
            d.iter()
                .map(|o| (o.agents_sum as f64 - o.echo as f64).abs() / o.echo.max(1) as f64 * 100.0)
                .reduce(f64::max),
            "% (sum of agents)",
            3,
        ),
    );
    row(
        "answered rate (median): merged / sum of agents' rates",
        cell(med(t, &|o| Some(o.rate)), "q/s", 0),
        cell(med(d, &|o| Some(o.rate)), "q/s", 0),
    );
    row(
        "spread of actual starts, the barrier's own figure (median)",
        cell(med(t, &|o| o.barrier.map(|b| b.spread_ms)), "ms", 3),
        "—".into(),
    );
    row(
        "barrier: CPU; peak RSS; its lead past the last ready (median)",
        format!(
            "{}; {}; {}",
            cell(med(t, &|o| o.barrier.map(|b| b.cpu_s)), "s", 3),
            cell(med(t, &|o| o.barrier.map(|b| b.rss_kb as f64)), "KiB", 0),
            cell(med(t, &|o| o.barrier.map(|b| b.lead_ms)), "ms", 1),
        ),
        "— (none)".into(),
    );
    row(
        "launch → last agent ready (agents preparing; median)",
        cell(med(t, &|o| o.barrier.map(|b| b.ready_s)), "s", 2),
        "—".into(),
    );
    row(
        "whole run, launch to end (median)",
        cell(med(t, &|o| Some(o.wall_s)), "s", 1),
        cell(med(d, &|o| Some(o.wall_s)), "s", 1),
    );
    md
}

fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name}: needs a number")),
    }
}

pub(crate) fn fleet_bench(args: &[String]) -> Result<()> {
    let started = Instant::now();
    let quick = args.iter().any(|a| a == "--quick");
    let p = Params {
        rounds: flag(args, "--rounds", if quick { 1 } else { 3 })?.clamp(1, 20),
        secs: flag(args, "--secs", if quick { 3 } else { 10 })?,
        rate: flag(args, "--rate", 6_000)?,
        conns_per_agent: flag(args, "--conns", if quick { 3_000 } else { 40_000 })?,
        connect_rate: flag(args, "--connect-rate", 12_000)?,
        dnsperf_clients: 100,
    };
    let only = crate::flag_value(args, "--only", "tcpkit or dnsperf")?;
    if only.is_some_and(|o| o != "tcpkit" && o != "dnsperf") {
        bail!("--only: tcpkit or dnsperf");
    }
    let bin = crate::tcpkit_binary()?;
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let fleet = Fleet::new("fleet", 3, 1)?;
    let dir = fleet.lab.dir().to_path_buf();
    let sources = fleet
        .agents
        .iter()
        .map(|a| vec![a.addr.to_string()])
        .collect();
    let mut env = Env {
        fleet,
        bin,
        dir,
        sources,
        tcpkit_rounds: 0,
    };
    let (mut t, mut d, mut failed) = (Vec::new(), Vec::new(), Vec::<String>::new());
    for round in 0..p.rounds {
        // Which way goes first alternates, so neither always runs on the warmer machine.
        for way in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            if only.is_some_and(|o| o != ["tcpkit", "dnsperf"][way]) {
                continue;
            }
            if way == 0 {
                eprintln!("round {}: tcpkit (playbook)", round + 1);
                // A round the play failed is a result too (which agent, why): kept, and the
                // medians are over the rounds that ran.
                match tcpkit_run(&mut env, &p) {
                    Ok(o) => t.push(o),
                    Err(e) => {
                        let why = failure_of(&format!("{e:#}"));
                        eprintln!("round {}: tcpkit failed: {why}", round + 1);
                        failed.push(format!("round {}: {why}", round + 1));
                    }
                }
            } else {
                eprintln!("round {}: dnsperf (ssh loop)", round + 1);
                d.push(dnsperf_run(&mut env, &p)?);
            }
        }
    }
    let mut md = table(&t, &d);
    md.push_str(&format!(
        "\ntcpkit rounds the play failed: {} of {}{}\n",
        failed.len(),
        p.rounds,
        failed
            .iter()
            .map(|f| format!("\n- {f}"))
            .collect::<String>()
    ));
    if t.is_empty() {
        bail!("no tcpkit round ran to its end:\n{md}");
    }
    println!("{md}");
    let date = crate::today();
    let mut cmd = String::from("cargo run --release -p tcpkit-bench -- fleet");
    for a in args {
        cmd.push(' ');
        cmd.push_str(a);
    }
    let doc = format!(
        "# tcpkit fleet: playbook + barrier vs dnsperf over an ssh loop — {date}\n\n\
         Command: `{cmd}` (from the workspace root, as root)\n\n\
         Machine: 2 CPUs shared by every namespace; load average at start: {}; the bench took {:.0} s.\n\
         Lab: controller, 3 agents and 1 server on one bridge (tcpkit-lab's fleet lab, sshd in \
         each agent and the server). Each way runs {} rounds, interleaved (the first way \
         alternates); {} s of queries at {} q/s in all.\n\
         tcpkit: `ansible-playbook deploy/ansible/fleet.yml`: echo `--dns --procs N` on the server, \
         `tcpkit barrier` on the controller, `tcpkit load --shard K/3 --barrier ...` on each agent \
         with {} connections each from two source addresses (`--procs` chosen by load under the \
         20,000-descriptor limit), reports fetched and merged by `tcpkit merge`.\n\
         dnsperf: a shell loop on the controller, `ssh agentK dnsperf -m tcp -c {} -Q {} -l {} &` \
         for each agent, then `wait`; echo started afresh for it. dnsperf holds {} connections per \
         agent (its -c), not 40,000: it has no way to hold idle connections.\n\
         Go: for tcpkit the barrier's start instant (from the reports, on the controller's clock); \
         for the loop, when it began. First query: tcpdump at the server, the first query (TCP with \
         data toward echo) from either of an agent's addresses. All namespaces share one clock here, \
         so the reports' clock offsets are near zero; they are applied all the same.\n\n\
         {md}",
        loadavg.trim(),
        started.elapsed().as_secs_f64(),
        p.rounds,
        p.secs,
        p.rate,
        p.conns_per_agent,
        p.dnsperf_clients,
        p.rate / 3,
        p.secs,
        p.dnsperf_clients,
    );
    let partial = if quick {
        Some("--quick")
    } else {
        only.map(|_| "--only")
    };
    crate::write_results("fleet", &date, &doc, started, partial)
}
