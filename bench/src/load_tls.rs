//! `tcpkit-bench load`'s TLS rows (issue 26), in the load lab: `tcpkit load --tls` / `--doh` /
//! `--http-get --tls [--http2]` beside dnsperf `-m dot` / `-m doh`, wrk, h2load and `openssl
//! s_time`, against `tcpkit echo --tls`, unbound (DoT, DoH) and nginx (HTTPS, HTTP/2), every
//! server presenting the same ECDSA P-256 certificate of a CA made for the run (tcpkit-lab's
//! `TestCa`), which tcpkit load checks (`--tls-ca`; the peers check nothing: dnsperf and
//! s_time do not verify, wrk and h2load neither).
//!
//! Rates are found as the plain rows find them (a ladder of [`STEP`]-long runs, the highest
//! rate answered as asked); latency is measured at half of each client's own highest rate in
//! runs interleaved with the peer's (which goes first alternates), the run with the median
//! p99 shown with every run's p99. tcpkit's latency is from the intended send time; dnsperf's
//! from its actual send time; wrk and h2load have no schedule (closed loop: as fast as the
//! server answers), so theirs is at their own top rate and from the actual send time.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use tcpkit_lab::{Lab, NginxConf, Proc, TestCa, UnboundConf, WWW_EXAMPLE};

use crate::ab::Build;
use crate::ab::Table;
use crate::load::{
    bin, dnsperf_outcome, json_u, lat_cell, load_outcome, median_run, rate_flags, run_in,
    start_echo, us, Env, Outcome,
};
use crate::load_pin::{self, Search};

/// What the results file says of the TLS table.
pub(crate) const NOTE: &str = "\nTLS rows (issue 26): every server presents one ECDSA P-256 \
certificate of a CA made for the run; tcpkit load checks it (`--tls-ca`), the peers check nothing. \
Each client searches its own highest rate as above (the peers' closed-loop tools, wrk and h2load, \
run flat out instead: their rate is their top rate); latency at half of each one's rate in runs \
interleaved with the peer's, the run with the median p99 shown. tcpkit's latency is from the \
intended send time, handshakes not included unless a query waited for one. The two searches of a \
row take turns step by step. Every server runs pinned to CPU 0 and every client (tcpkit load and \
each peer alike) to CPU 1 (taskset), so that neither side takes the other's CPU; a step's \
`[c X s Y]` is the CPU µs the client (c) and the server (s) spent per answer in that run, \
connects and handshakes included: the side near 1,000,000 / rate ran out of its CPU. dnsperf \
opens at most 256 connections a thread (its MAX_SOCKETS): asked for 2,000 it holds 256, \
and with a thread per 256 (`-T 8`) on its one CPU it collapsed (5 % answered at 20k q/s), so it \
runs its default one thread and holds 256 where load holds 2,000.\n";

const SRV: &str = "198.18.0.2";
/// `tcpkit echo --dns` in clear (the plain-TCP reference) and over TLS.
const ECHO_PLAIN: u16 = 5310;
const ECHO_DOT: u16 = 5853;
/// unbound's DoT and DoH (the well-known ports), nginx's HTTPS and HTTP/2.
const UNBOUND_DOT: u16 = 853;
const UNBOUND_DOH: u16 = 443;
const NGINX: u16 = 4443;
/// The DoT point: 2,000 connections.
const DOT_CONNS: u32 = 2000;
/// DoH and HTTPS keep fewer connections busier (HTTP/2: many streams each).
const DOH_CONNS: u32 = 100;
const HTTP_CONNS: u32 = 100;
const H2_CONNS: u32 = 10;
const H2_STREAMS: u32 = 100;
/// How fast load opens its connections here: a TLS server handshakes in its one thread, and
/// unbound's listen backlog overflowed at load's plain-row 50,000/s (526 of 2,000 connects
/// timed out); dnsperf opens its own as it goes. 2,000 connections open in 0.4 s.
const CONNECT_RATE: &str = "5000";
/// Seconds of load's -t for opening its connections, on top of a step.
const OPEN_S: f64 = 2.0;
/// Connections in flight at once in the handshake rows (each closed after one answer).
const HS_CONNS: u32 = 100;
/// The page every client asks nginx for.
const PAGE: &str = "/index.html";

/// How long each run is and how many latency runs per client: the full table's, or a quick
/// check that every row runs (`--tls-quick`).
#[derive(Clone, Copy)]
pub(crate) struct Opts {
    pub(crate) step_s: f64,
    pub(crate) runs: usize,
}

/// The full table's: 3 s steps (a second longer than the plain rows': opening 2,000 TLS
/// connections takes a good part of a 2 s run, dnsperf's above all), 3 latency runs per client.
pub(crate) const STEP: Opts = Opts {
    step_s: 3.0,
    runs: 3,
};

/// Flags of tcpkit's this section needs (a build without them gets its cells said, not run).
const LOAD_FLAGS: [&str; 6] = [
    "--tls",
    "--tls-ca",
    "--doh",
    "--http2",
    "--tls-resume",
    "--queries-per-conn",
];
const ECHO_FLAGS: [&str; 3] = ["--tls", "--tls-cert", "--tls-key"];

struct Tls<'a> {
    env: &'a Env,
    ca: String,
    o: Opts,
    /// Why this build cannot run echo --tls (flags echo or load lack), if it cannot.
    lacks: Option<String>,
    /// load's flags of [`LOAD_FLAGS`] this build lacks: a cell whose arguments name one is
    /// said, not run.
    missing: Vec<String>,
    queries: String,
    /// The server process on each port (its CPU is read around every run).
    servers: Vec<(u16, u32)>,
}

impl Tls<'_> {
    /// `tcpkit load TARGET ARGS -c C -r R -t S --threads 1 --json` at `rate` for the step.
    fn load(&self, target: &str, args: &[&str], conns: u32, rate: u64) -> Result<Outcome> {
        // -t bounds load's whole run, opening included, and the rate asked is judged over the
        // query phase its report gives: 2 s more for opening, so that a TLS server slow to
        // handshake 2,000 connections (unbound's one thread: connects whose SYN its full
        // backlog dropped come back a second later) still leaves a query phase of a step.
        let (c, r, s) = (
            conns.to_string(),
            rate.to_string(),
            format!("{}", self.o.step_s + OPEN_S),
        );
        let mut argv = vec![bin(self.env, Build::New)?, "load", target];
        argv.extend_from_slice(args);
        argv.extend(rate_flags(&c, CONNECT_RATE, &r, &s));
        let limit = Duration::from_secs_f64(self.o.step_s + 30.0);
        let port = target.rsplit(':').next().and_then(|p| p.parse().ok());
        let (out, err, cpu) = self.timed(port, &argv, limit)?;
        let mut o = load_outcome(&out, &err, rate, self.o.step_s)?;
        (o.cpu_client, o.cpu_server) = cpu;
        Ok(o)
    }

    /// Runs client `argv` in the client host, pinned to the clients' CPU; its stdout and
    /// stderr, and the CPU seconds it and the server on `port` spent meanwhile.
    fn timed(
        &self,
        port: Option<u16>,
        argv: &[&str],
        limit: Duration,
    ) -> Result<(String, String, load_pin::Cpu)> {
        let server = port.and_then(|p| self.servers.iter().find(|s| s.0 == p).map(|s| s.1));
        let before = server.map(load_pin::cpu_s);
        let (_, out, err) = run_in(&self.env.cli, &load_pin::client_argv(argv), limit)?;
        let srv = server.map(load_pin::cpu_s).zip(before).map(|(a, b)| a - b);
        let client = load_pin::client_cpu(&err);
        Ok((out, err, (client, srv)))
    }

    /// `dnsperf -m MODE -s SRV -p PORT -c C -Q R -l S -v ARGS` (answers' latencies from -v).
    fn dnsperf(
        &self,
        mode: &str,
        port: u16,
        args: &[&str],
        conns: u32,
        rate: u64,
    ) -> Result<Outcome> {
        let (p, c, r, s) = (
            port.to_string(),
            conns.to_string(),
            rate.to_string(),
            format!("{}", self.o.step_s),
        );
        // dnsperf opens at most 256 sockets a thread (its MAX_SOCKETS), so -c 2000 is 256
        // connections; one thread per 256 (-T 8) pinned to one CPU answered 5 % at 20k q/s
        // and 63 % at 4.3k (its 16 threads' wait loops took the CPU), so it keeps its one
        // thread and the table says how many connections it held.
        let mut argv = vec![
            "dnsperf",
            "-m",
            mode,
            "-s",
            SRV,
            "-p",
            &p,
            "-c",
            &c,
            "-Q",
            &r,
            "-l",
            &s,
            "-d",
            &self.queries,
            "-q",
            "20000",
            "-t",
            "2",
            "-v",
        ];
        argv.extend_from_slice(args);
        let limit = Duration::from_secs_f64(self.o.step_s + 30.0);
        let (out, err, cpu) = self.timed(Some(port), &argv, limit)?;
        let asked = rate as f64 * self.o.step_s;
        // dnsperf -m doh has hung past the limit (75,000 lines of "socket not ready") and was
        // killed before its statistics: a step it did not answer, not the end of the bench.
        let mut o = dnsperf_outcome(&out, &err, asked).unwrap_or_else(|e| Outcome {
            asked,
            note: format!("{e:#}").lines().next().unwrap_or("").to_string(),
            ..Outcome::default()
        });
        (o.cpu_client, o.cpu_server) = cpu;
        Ok(o)
    }

    /// A ladder from `from`, ×1.4 a step, 5 steps.
    fn ladder(from: u64) -> Vec<u64> {
        let mut v = vec![from];
        for _ in 0..4 {
            // Whole thousands, or hundreds below 10k (else 1,000 × 1.4 rounds back to 1,000).
            let n = v.last().copied().unwrap_or(from) * 14 / 10;
            let unit = if n >= 10_000 { 1000 } else { 100 };
            v.push((n / unit * unit).max(1000));
        }
        v
    }

    /// Why this build's load cannot run with `args` (flags it lacks), if it cannot.
    fn lacking(&self, args: &[&str]) -> Option<String> {
        let lacking: Vec<&str> = args
            .iter()
            .copied()
            .filter(|a| self.missing.iter().any(|m| m == a))
            .collect();
        (!lacking.is_empty())
            .then(|| format!("not run: this build's load lacks {}", lacking.join(" ")))
    }

    /// tcpkit's highest rate answered as asked, or why it was not run; `between` runs after
    /// each of its steps (a closed-loop peer's runs, interleaved with them).
    fn load_search(
        &self,
        target: &str,
        args: &[&str],
        conns: u32,
        from: u64,
        mut between: impl FnMut() -> Result<()>,
    ) -> Result<Found> {
        if let Some(why) = self.lacking(args) {
            return Ok(Err(why));
        }
        let mut s = Search::new(&Self::ladder(from));
        while let Some(rate) = s.next() {
            let o = self.load(target, args, conns, rate)?;
            s.record(rate, &o);
            between()?;
        }
        Ok(Ok(s.result()))
    }

    /// Latency at half of each one's highest rate: `runs` runs each, interleaved (which goes
    /// first alternates), the run with the median p99 of each.
    fn latency_pair(
        &self,
        mut tk: impl FnMut(u64) -> Result<Outcome>,
        tk_best: &Found,
        mut peer: impl FnMut(u64) -> Result<Outcome>,
        peer_best: u64,
    ) -> Result<(String, String)> {
        let half = |best: u64| (best / 2).max(500);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..self.o.runs {
            if i % 2 == 1 {
                b.push(peer(half(peer_best))?);
            }
            if let Ok((best, _)) = tk_best {
                a.push(tk(half(*best))?);
            }
            if i % 2 == 0 {
                b.push(peer(half(peer_best))?);
            }
        }
        let cell = |runs: Vec<Outcome>, best: u64| {
            format!("at {}: {}", rate(half(best)), median_run(runs, 2, "p99").0)
        };
        let tk_cell = match tk_best {
            Ok((best, _)) => cell(a, *best),
            Err(why) => why.clone(),
        };
        Ok((tk_cell, cell(b, peer_best)))
    }
}

impl Tls<'_> {
    /// Two rows: each client's highest rate answered as asked (tcpkit load's from `target`,
    /// `args`, `conns` and a ladder from `from`; the peer's by `peer` at a rate, from
    /// `peer_from`), then the latency at half of each one's. The two results (the peer's rate).
    fn search_rows(
        &self,
        tab: &mut Table,
        what: &str,
        (target, args, conns, from): (&str, &[&str], u32, u64),
        mut peer: impl FnMut(u64) -> Result<Outcome>,
        peer_from: u64,
    ) -> Result<(Found, u64)> {
        let mut dp_s = Search::new(&Tls::ladder(peer_from));
        let tk = match self.lacking(args) {
            Some(why) => {
                while let Some(r) = dp_s.next() {
                    let o = peer(r)?;
                    dp_s.record(r, &o);
                }
                Err(why)
            }
            None => {
                let mut tk_s = Search::new(&Self::ladder(from));
                load_pin::search_pair(
                    (&mut tk_s, |r| self.load(target, args, conns, r)),
                    (&mut dp_s, &mut peer),
                )?;
                Ok(tk_s.result())
            }
        };
        let dp = dp_s.result();
        tab.row(vec![
            format!("highest rate answered as asked (≥ 99 %): {what}"),
            found_cell(&tk),
            peer_cell(&dp),
        ]);
        let (a, b) =
            self.latency_pair(|r| self.load(target, args, conns, r), &tk, &mut peer, dp.0)?;
        tab.row(vec![
            format!(
                "latency p50 / p90 / p99 / p99.9 / max at 50 % of each one's rate, the run with the median p99 of {}",
                self.o.runs
            ),
            a,
            b,
        ]);
        Ok((tk, dp.0))
    }
}

/// A search's result (rate, steps), or why tcpkit's cell was not run.
type Found = std::result::Result<(u64, String), String>;

fn rate(r: u64) -> String {
    if r >= 1000 {
        format!("{:.1}k/s", r as f64 / 1000.0)
    } else {
        format!("{r}/s")
    }
}

fn found_cell(f: &Found) -> String {
    match f {
        Ok((r, steps)) => format!("**{}** <br>steps {steps}", rate(*r)),
        Err(why) => why.clone(),
    }
}

fn peer_cell((r, steps): &(u64, String)) -> String {
    format!("**{}** <br>steps {steps}", rate(*r))
}

/// `met` / `not met` of a target.
fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

/// wrk's or h2load's latency figure (`1.23ms`, `456.78us`, `1.02s`) in µs.
fn dur_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    Some(num.parse::<f64>().ok()? * mul)
}

/// `wrk -t1 -c C -d S --latency URL`: its rate and latency percentiles (50/90/99 %; wrk
/// prints no 99.9 %: its max stands there).
fn wrk(t: &Tls, url: &str, conns: u32) -> Result<(f64, Outcome)> {
    let (c, d) = (conns.to_string(), format!("{}s", t.o.step_s.ceil()));
    let argv = ["wrk", "-t", "1", "-c", &c, "-d", &d, "--latency", url];
    let limit = Duration::from_secs_f64(t.o.step_s + 30.0);
    let (out, err, (cpu_client, cpu_server)) = t.timed(Some(NGINX), &argv, limit)?;
    let rps = out
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("wrk printed no rate: {out} {err}"))?;
    let pct = |p: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(p))
            .and_then(dur_us)
            .unwrap_or(f64::NAN)
    };
    let max = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Latency"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(dur_us)
        .unwrap_or(f64::NAN);
    let errors = out
        .lines()
        .find(|l| l.contains("Socket errors") || l.contains("Non-2xx"))
        .map_or("no errors".to_string(), |l| l.trim().to_string());
    Ok((
        rps,
        Outcome {
            answered: (rps * t.o.step_s) as u64,
            asked: rps * t.o.step_s,
            lat: Some([pct("50%"), pct("90%"), pct("99%"), max, max]),
            note: errors,
            cpu_client,
            cpu_server,
            ..Outcome::default()
        },
    ))
}

/// What h2load printed: requests per second, (done, succeeded), and its time-for-request
/// line (min, max, mean in µs: h2load prints no percentiles), the time it finished in (s).
struct H2load {
    rps: f64,
    succeeded: u64,
    req: [f64; 3],
    secs: f64,
    /// CPU seconds of h2load and of nginx over the run.
    cpu: load_pin::Cpu,
}

impl H2load {
    /// ` [c X s Y]`: h2load's and nginx's CPU µs per request, as the search steps say it.
    fn cpu_cell(&self) -> String {
        load_pin::cpu_cell(self.cpu.0, self.cpu.1, self.succeeded)
    }
}

fn h2load(t: &Tls, args: &[&str]) -> Result<H2load> {
    let mut argv = vec!["h2load", "-t", "1"];
    argv.extend_from_slice(args);
    let limit = Duration::from_secs_f64(t.o.step_s + 60.0);
    let (out, err, cpu) = t.timed(Some(NGINX), &argv, limit)?;
    // "finished in 2.00s, 51234.50 req/s, 30.12MB/s"
    let fin = out
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))
        .with_context(|| format!("h2load printed no summary: {out} {err}"))?;
    let mut f = fin.split(", ");
    let secs = f.next().and_then(dur_us).unwrap_or(f64::NAN) / 1e6;
    let rps = f
        .next()
        .and_then(|r| r.strip_suffix(" req/s"))
        .and_then(|r| r.parse().ok())
        .unwrap_or(f64::NAN);
    let succeeded = out
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .and_then(|l| {
            l.split(", ")
                .find_map(|x| x.strip_suffix(" succeeded")?.parse().ok())
        })
        .unwrap_or(0);
    let req = out
        .lines()
        .find_map(|l| l.strip_prefix("time for request:"))
        .map(|l| {
            let v: Vec<f64> = l.split_whitespace().filter_map(dur_us).collect();
            [
                v.first().copied().unwrap_or(f64::NAN),
                v.get(1).copied().unwrap_or(f64::NAN),
                v.get(2).copied().unwrap_or(f64::NAN),
            ]
        })
        .unwrap_or([f64::NAN; 3]);
    Ok(H2load {
        rps,
        succeeded,
        req,
        secs,
        cpu,
    })
}

/// `openssl s_time -connect SRV:PORT -new|-reuse -time S`: connections per second (one at a
/// time: s_time is one sequential client).
fn s_time(t: &Tls, port: u16, mode: &str) -> Result<f64> {
    let (a, s) = (format!("{SRV}:{port}"), format!("{}", t.o.step_s.ceil()));
    let argv = ["openssl", "s_time", "-connect", &a, mode, "-time", &s];
    let limit = Duration::from_secs_f64(t.o.step_s + 30.0);
    let (out, err, _) = t.timed(Some(port), &argv, limit)?;
    // "1234 connections in 2 real seconds, 0 bytes read per connection"
    let n = out
        .lines()
        .find(|l| l.contains("real seconds"))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .with_context(|| format!("s_time printed no count: {out} {err}"))?;
    Ok(n / t.o.step_s.ceil())
}

/// The `tls` object of a tcpkit load report: handshakes per second, full/resumed/failed, and
/// the handshake latency's p50 and p99, full and resumed apart (what resumption saves).
fn handshakes(o: &Outcome) -> String {
    let v = &o.report;
    if v.get("tls").is_none() {
        return "no tls object in the report".into();
    }
    let lat = |kind: &str| {
        let k = format!("tls.handshake_latency_{kind}");
        if json_u(v, &format!("{k}.count")) == 0 {
            return String::new();
        }
        format!(
            "; {kind} handshake p50 {} p99 {}",
            us(json_u(v, &format!("{k}.p50_ns")) as f64 / 1e3),
            us(json_u(v, &format!("{k}.p99_ns")) as f64 / 1e3)
        )
    };
    format!(
        "{:.0} handshakes/s ({} full, {} resumed, {} failed){}{}",
        v["tls"]["handshakes"]["per_sec"].as_f64().unwrap_or(0.0),
        json_u(v, "tls.handshakes.full"),
        json_u(v, "tls.handshakes.resumed"),
        json_u(v, "tls.handshakes.failed"),
        lat("full"),
        lat("resumed"),
    )
}

/// Starts this build's `tcpkit echo --dns --threads 1 --port PORT ARGS` in the server host.
fn echo(env: &Env, lab: &mut Lab, port: u16, args: &[&str]) -> Result<Proc> {
    start_echo(env, lab, Build::New, port, args, &format!("echo-{port}"))
}

/// The TLS section of the load table: servers started here in `env`'s server host, run, and
/// stopped again.
pub(crate) fn rows(env: &Env, lab: &mut Lab, t: &mut Table, o: Opts) -> Result<()> {
    let new = env.builds.bin(Build::New);
    let missing = crate::missing_flags(new, "load", &LOAD_FLAGS)?;
    let mut echo_missing = crate::missing_flags(new, "echo", &ECHO_FLAGS)?;
    echo_missing.extend(missing.iter().filter(|f| *f == "--tls").cloned());
    let lacks = (!echo_missing.is_empty())
        .then(|| format!("not run: this build lacks {}", echo_missing.join(" ")));
    // The handshake rows close tens of thousands of connections a minute: without reusing
    // TIME_WAIT ports the client host ran out of them (s_time: Cannot assign requested address).
    env.cli.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
    let ca = TestCa::new(&env.dir.join("ca"), "tcpkit bench CA")?;
    let cert = ca.server("server", &["localhost", SRV])?;
    let (cert_s, key_s) = (
        cert.cert.to_string_lossy().into_owned(),
        cert.key.to_string_lossy().into_owned(),
    );
    let queries = env.dir.join("tls-queries.txt");
    std::fs::write(&queries, format!("{WWW_EXAMPLE} A\n"))?;
    let mut tls = Tls {
        env,
        ca: ca.cert().to_string_lossy().into_owned(),
        o,
        lacks,
        missing,
        queries: queries.to_string_lossy().into_owned(),
        servers: Vec::new(),
    };
    let mut procs = vec![echo(env, lab, ECHO_PLAIN, &[])?];
    if tls.lacks.is_none() {
        procs.push(echo(
            env,
            lab,
            ECHO_DOT,
            &["--tls", "--tls-cert", &cert_s, "--tls-key", &key_s],
        )?);
    }
    let mut ub_conf = UnboundConf::tls(SRV.parse()?, cert.clone());
    ub_conf.dns_port = None;
    ub_conf.dot_port = Some(UNBOUND_DOT);
    ub_conf.doh_port = Some(UNBOUND_DOH);
    ub_conf.tcp_conns = 4 * DOT_CONNS;
    let ub = lab.unbound(&env.srv, &ub_conf)?;
    let mut ng_conf = NginxConf::https(format!("{SRV}:{NGINX}").parse()?, cert.clone());
    ng_conf.access_log = false;
    ng_conf.max_conns = 4 * DOT_CONNS;
    let ng = lab.nginx(&env.srv, &ng_conf)?;
    // Each server on its own CPU, the clients on the other (see NOTE); and which process
    // answers on which port, for its CPU per answer.
    let mut ports = vec![ECHO_PLAIN];
    if tls.lacks.is_none() {
        ports.push(ECHO_DOT);
    }
    for (port, p) in ports.into_iter().zip(&procs) {
        tls.servers.push((port, p.pid()));
    }
    tls.servers.push((UNBOUND_DOT, ub.proc.pid()));
    tls.servers.push((UNBOUND_DOH, ub.proc.pid()));
    tls.servers.push((NGINX, ng.proc.pid()));
    for (_, pid) in &tls.servers {
        load_pin::pin_server(*pid)?;
    }
    let tls = tls;

    dot_rows(&tls, t)?;
    doh_rows(&tls, t)?;
    http_rows(&tls, t)?;
    handshake_rows(&tls, t)?;

    for p in procs.iter().chain([&ub.proc, &ng.proc]) {
        let _ = p.stop();
    }
    Ok(())
}

/// DoT against echo --tls (with the plain-TCP reference and the targets) and against
/// unbound, at 2,000 connections.
fn dot_rows(t: &Tls, tab: &mut Table) -> Result<()> {
    let ca = t.ca.as_str();
    let dot_args = ["--dns", "--qname", WWW_EXAMPLE, "--tls", "--tls-ca", ca];
    for (server, port, from_tk, from_dp) in [
        (
            "tcpkit echo --tls --dns (1 thread)",
            ECHO_DOT,
            100_000,
            // Pinned to its own CPU dnsperf answered 168k q/s against echo --tls (256
            // connections): a ladder from 20k stopped at 75k with every step answered.
            40_000,
        ),
        ("unbound 1.17.1 DoT (1 thread)", UNBOUND_DOT, 20_000, 10_000),
    ] {
        tab.section(&format!(
            "DNS over TLS against {server}, {DOT_CONNS} connections"
        ));
        eprintln!("DoT against {server}: searching ...");
        let target = format!("{SRV}:{port}");
        if port == ECHO_DOT {
            if let Some(why) = &t.lacks {
                tab.row(vec![
                    "load --tls --dns and dnsperf -m dot against echo --tls".into(),
                    why.clone(),
                    format!("echo --tls {why}"),
                ]);
                continue;
            }
        }
        let peer = |r| t.dnsperf("dot", port, &[], DOT_CONNS, r);
        let what = "load --tls --dns (2000 connections) vs dnsperf -m dot -c 2000 (256 connections: its most per thread)";
        let tk = t.search_rows(
            tab,
            what,
            (&target, &dot_args, DOT_CONNS, from_tk),
            peer,
            from_dp,
        )?;
        if port == ECHO_DOT {
            let plain_target = format!("{SRV}:{ECHO_PLAIN}");
            let plain = t.load_search(
                &plain_target,
                &["--dns", "--qname", WWW_EXAMPLE],
                DOT_CONNS,
                200_000,
                || Ok(()),
            )?;
            tab.row(vec![
                "the same in clear: load --dns vs tcpkit echo --dns (the plain-TCP rate)".into(),
                found_cell(&plain),
                String::new(),
            ]);
            if let (Ok((tls_r, _)), Ok((plain_r, _))) = (&tk.0, &plain) {
                let (share, over) = (
                    *tls_r as f64 / *plain_r as f64,
                    *tls_r as f64 / tk.1.max(1) as f64,
                );
                let vs_peer = if tk.1 == 0 {
                    "dnsperf answered no rate as asked: not judged".to_string()
                } else {
                    format!("{over:.1}× dnsperf ({})", verdict(over >= 2.0))
                };
                tab.row(vec![
                    "issue 26's targets: DoT ≥ 50 % of plain TCP, ≥ 2× dnsperf -m dot".into(),
                    format!(
                        "{:.0} % of plain ({}); {vs_peer}",
                        share * 100.0,
                        verdict(share >= 0.5),
                    ),
                    String::new(),
                ]);
            }
        }
    }
    Ok(())
}

/// DoH (HTTP/2 over TLS, POST) against unbound: load --doh vs dnsperf -m doh.
fn doh_rows(t: &Tls, tab: &mut Table) -> Result<()> {
    tab.section(&format!(
        "DNS over HTTPS (HTTP/2, POST) against unbound 1.17.1 (1 thread), {DOH_CONNS} connections"
    ));
    eprintln!("DoH against unbound: searching ...");
    let target = format!("{SRV}:{UNBOUND_DOH}");
    let args = [
        "--doh",
        "--tls",
        "--tls-ca",
        t.ca.as_str(),
        "--qname",
        WWW_EXAMPLE,
    ];
    let uri = format!("doh-uri=https://{SRV}:{UNBOUND_DOH}/dns-query");
    let dp_args = ["-O", uri.as_str(), "-O", "doh-method=POST"];
    let peer = |r| t.dnsperf("doh", UNBOUND_DOH, &dp_args, DOH_CONNS, r);
    let what = "load --doh --tls vs dnsperf -m doh";
    let _found = t.search_rows(tab, what, (&target, &args, DOH_CONNS, 10_000), peer, 10_000)?;
    Ok(())
}

/// HTTPS (HTTP/1.1) and HTTP/2 against nginx: load vs wrk, load --http2 vs h2load.
fn http_rows(t: &Tls, tab: &mut Table) -> Result<()> {
    let target = format!("{SRV}:{NGINX}");
    let url = format!("https://{SRV}:{NGINX}{PAGE}");
    let ca = t.ca.as_str();
    tab.section(&format!(
        "HTTPS (HTTP/1.1 keep-alive) against nginx 1.22 (1 worker), {HTTP_CONNS} connections: load vs wrk 4.1"
    ));
    eprintln!("HTTPS against nginx: searching ...");
    let h1 = ["--http-get", PAGE, "--tls", "--tls-ca", ca];
    // wrk's runs between load's search steps, so that both meet the same minutes.
    let mut wrk_runs = Vec::new();
    let tk = t.load_search(&target, &h1, HTTP_CONNS, 10_000, || {
        if wrk_runs.len() < t.o.runs {
            wrk_runs.push(wrk(t, &url, HTTP_CONNS)?);
        }
        Ok(())
    })?;
    while wrk_runs.len() < t.o.runs {
        wrk_runs.push(wrk(t, &url, HTTP_CONNS)?);
    }
    wrk_runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let rates: Vec<String> = wrk_runs
        .iter()
        .map(|(r, o)| {
            let cpu = load_pin::cpu_cell(o.cpu_client, o.cpu_server, o.answered);
            format!("{}{cpu}", rate(*r as u64))
        })
        .collect();
    let (wrk_rate, wrk_o) = wrk_runs[wrk_runs.len() / 2].clone();
    tab.row(vec![
        "highest rate answered as asked (≥ 99 %) vs wrk's top rate (closed loop; median of its runs)"
            .into(),
        found_cell(&tk),
        format!("**{}** <br>runs: {}", rate(wrk_rate as u64), rates.join(", ")),
    ]);
    let a = match &tk {
        Ok((best, _)) => {
            let mut runs = Vec::new();
            for _ in 0..t.o.runs {
                runs.push(t.load(&target, &h1, HTTP_CONNS, (best / 2).max(500))?);
            }
            format!("at {}: {}", rate(best / 2), median_run(runs, 2, "p99").0)
        }
        Err(why) => why.clone(),
    };
    tab.row(vec![
        "latency p50 / p90 / p99 / p99.9 / max: load at 50 % of its rate (from the intended send time); wrk at its top rate (p50 / p90 / p99 / max / max, from the actual send time)".into(),
        a,
        format!("at {}: {} ({})", rate(wrk_rate as u64), lat_cell(&wrk_o), wrk_o.note),
    ]);

    tab.section(&format!(
        "HTTP/2 over TLS against nginx 1.22 (1 worker), {H2_CONNS} connections × {H2_STREAMS} streams: load --http2 vs h2load"
    ));
    eprintln!("HTTP/2 against nginx: searching ...");
    let streams = H2_STREAMS.to_string();
    let h2 = [
        "--http-get",
        PAGE,
        "--tls",
        "--tls-ca",
        ca,
        "--http2",
        "--h2-streams",
        &streams,
    ];
    let (c, m, d) = (
        H2_CONNS.to_string(),
        H2_STREAMS.to_string(),
        format!("{}", t.o.step_s.ceil()),
    );
    let mut h2_runs = Vec::new();
    let flat_out = ["-c", &c, "-m", &m, "-D", &d, &url];
    let tk = t.load_search(&target, &h2, H2_CONNS, 20_000, || {
        if h2_runs.len() < t.o.runs {
            h2_runs.push(h2load(t, &flat_out)?);
        }
        Ok(())
    })?;
    while h2_runs.len() < t.o.runs {
        h2_runs.push(h2load(t, &flat_out)?);
    }
    h2_runs.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    let rates: Vec<String> = h2_runs
        .iter()
        .map(|h| format!("{}{}", rate(h.rps as u64), h.cpu_cell()))
        .collect();
    let top = &h2_runs[h2_runs.len() / 2];
    tab.row(vec![
        "highest rate answered as asked (≥ 99 %) vs h2load's top rate (closed loop; median of its runs)"
            .into(),
        found_cell(&tk),
        format!("**{}** <br>runs: {}", rate(top.rps as u64), rates.join(", ")),
    ]);
    let (a, b) = match &tk {
        Ok((best, _)) => {
            let half = (best / 2).max(500);
            let per_client = (half / u64::from(H2_CONNS)).max(1).to_string();
            let rps = format!("--rps={per_client}");
            let mut runs = Vec::new();
            let mut peer = Vec::new();
            for i in 0..t.o.runs {
                let h2load_at = || h2load(t, &["-c", &c, "-m", &m, "-D", &d, &rps, &url]);
                if i % 2 == 1 {
                    peer.push(h2load_at()?);
                }
                runs.push(t.load(&target, &h2, H2_CONNS, half)?);
                if i % 2 == 0 {
                    peer.push(h2load_at()?);
                }
            }
            peer.sort_by(|a, b| a.req[2].total_cmp(&b.req[2]));
            let p = &peer[peer.len() / 2];
            (
                format!("at {}: {}", rate(half), median_run(runs, 2, "p99").0),
                format!(
                    "at the same {} (--rps): time for request min {} / mean {} / max {} (h2load prints no percentiles; the run with the median mean of {})",
                    rate(half),
                    us(p.req[0]),
                    us(p.req[2]),
                    us(p.req[1]),
                    t.o.runs
                ),
            )
        }
        Err(why) => (why.clone(), String::new()),
    };
    tab.row(vec![
        "latency p50 / p90 / p99 / p99.9 / max at 50 % of load's rate".into(),
        a,
        b,
    ]);
    Ok(())
}

/// Full handshakes per second on one core (`--threads 1`, each connection closed after one
/// answer), against echo --tls and nginx, beside s_time and h2load; and resumed ones
/// (`--tls-resume tickets`) beside full ones.
fn handshake_rows(t: &Tls, tab: &mut Table) -> Result<()> {
    let ca = t.ca.as_str();
    tab.section(&format!(
        "TLS handshakes per second, one client core, {HS_CONNS} connections in flight, each closed after one answer"
    ));
    eprintln!("handshakes: searching ...");
    let echo_t = format!("{SRV}:{ECHO_DOT}");
    let full = [
        "--dns",
        "--qname",
        WWW_EXAMPLE,
        "--tls",
        "--tls-ca",
        ca,
        "--queries-per-conn",
        "1",
    ];
    let tk = t.load_search(&echo_t, &full, HS_CONNS, 1_000, || Ok(()))?;
    // load's run at its highest rate: its cell, and its handshake p50 of `kind` (ns).
    let at = |args: &[&str], f: &Found, kind: &str| -> Result<(String, Option<u64>)> {
        Ok(match f {
            Ok((0, _)) => ("no rate was answered as asked".into(), None),
            Ok((best, _)) => {
                let o = t.load(&echo_t, args, HS_CONNS, *best)?;
                let k = format!("tls.handshake_latency_{kind}");
                let p50 = (json_u(&o.report, &format!("{k}.count")) > 0)
                    .then(|| json_u(&o.report, &format!("{k}.p50_ns")));
                let cell = format!(
                    "{}; query latency p50 / p90 / p99 / p99.9 / max {}",
                    handshakes(&o),
                    lat_cell(&o)
                );
                (cell, p50)
            }
            Err(why) => (why.clone(), None),
        })
    };
    // s_time needs echo --tls, which a build without the flags does not have.
    let s_time_rate = |mode: &str| -> Result<Option<f64>> {
        Ok(match &t.lacks {
            None => Some(s_time(t, ECHO_DOT, mode)?),
            Some(_) => None,
        })
    };
    let s_time_cell = |r: Option<f64>, what: &str| match (r, &t.lacks) {
        (Some(r), _) => format!("**{}** {what}", rate(r as u64)),
        (None, Some(why)) => format!("echo --tls {why}"),
        (None, None) => String::new(),
    };
    let (full_cell, full_p50) = at(&full, &tk, "full")?;
    let s_new = s_time_rate("-new")?;
    tab.row(vec![
        "full handshakes (DoT query each) against tcpkit echo --tls: load --queries-per-conn 1 --tls-resume off, the highest rate answered as asked, vs openssl s_time -new (one connection at a time)".into(),
        format!("{} <br>at that rate: {full_cell}", found_cell(&tk)),
        s_time_cell(s_new, "full handshakes"),
    ]);
    let mut resumed = full.to_vec();
    resumed.extend(["--tls-resume", "tickets"]);
    let tk_r = t.load_search(&echo_t, &resumed, HS_CONNS, 1_000, || Ok(()))?;
    let (resumed_cell, resumed_p50) = at(&resumed, &tk_r, "resumed")?;
    let s_reuse = s_time_rate("-reuse")?;
    tab.row(vec![
        "resumed handshakes: the same with --tls-resume tickets, vs openssl s_time -reuse".into(),
        format!("{} <br>at that rate: {resumed_cell}", found_cell(&tk_r)),
        s_time_cell(s_reuse, "resumed handshakes"),
    ]);
    let ng_t = format!("{SRV}:{NGINX}");
    let ng_args = [
        "--http-get",
        PAGE,
        "--tls",
        "--tls-ca",
        ca,
        "--http2",
        "--queries-per-conn",
        "1",
    ];
    let tk_ng = t.load_search(&ng_t, &ng_args, HS_CONNS, 1_000, || Ok(()))?;
    let url = format!("https://{SRV}:{NGINX}{PAGE}");
    // h2load makes one connection per client: N clients of one request each are N
    // handshakes, opened at once.
    let n = ((t.o.step_s * 1000.0) as u64).clamp(200, 2000).to_string();
    let h = h2load(t, &["-c", &n, "-n", &n, &url])?;
    let mut cell = String::new();
    let _ = write!(
        cell,
        "**{}** handshakes ({} requests in {:.2} s){}",
        rate((h.succeeded as f64 / h.secs) as u64),
        h.succeeded,
        h.secs,
        h.cpu_cell()
    );
    tab.row(vec![
        "full handshakes (an HTTP/2 GET each) against nginx: load --http2 --queries-per-conn 1 vs h2load -c N -n N".into(),
        found_cell(&tk_ng),
        cell,
    ]);
    // The targets: full handshakes/s at least each peer's against the same server
    // (s_time against echo; h2load against nginx, when load ran there too: a peer's rate
    // against another server says what that server can do), a resumed handshake cheaper.
    let mut judged = Vec::new();
    let mut judge = |tk: &Found, peer: Option<f64>, what: &str| {
        if let (Ok((r, _)), Some(p)) = (tk, peer) {
            judged.push(format!(
                "{} full handshakes/s vs {what}'s {} ({})",
                rate(*r),
                rate(p as u64),
                verdict(*r as f64 >= p)
            ));
        }
    };
    judge(&tk, s_new, "s_time against echo --tls");
    judge(
        &tk_ng,
        Some(h.succeeded as f64 / h.secs),
        "h2load against nginx",
    );
    if let (Some(f), Some(r)) = (full_p50, resumed_p50) {
        judged.push(format!(
            "handshake p50 resumed {} vs full {} ({})",
            us(r as f64 / 1e3),
            us(f as f64 / 1e3),
            verdict(r < f)
        ));
    }
    tab.row(vec![
        "issue 26's targets: full handshakes/s ≥ the peer's against the same server; a resumed handshake cheaper than a full one".into(),
        judged.join("; "),
        String::new(),
    ]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_wrk_and_h2load_units() {
        assert_eq!(dur_us("1.50ms"), Some(1500.0));
        assert_eq!(dur_us("456.00us"), Some(456.0));
        assert_eq!(dur_us("2.00s"), Some(2e6));
        assert_eq!(dur_us("12"), None);
        assert_eq!(crate::load::percentiles(&[]), None);
        assert_eq!(Tls::ladder(1000), [1000, 1400, 1900, 2600, 3600]);
        assert_eq!(
            Tls::ladder(20_000),
            [20_000, 28_000, 39_000, 54_000, 75_000]
        );
    }
}
