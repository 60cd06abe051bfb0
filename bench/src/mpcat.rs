//! `tcpkit-bench mpcat`: `tcpkit mpcat` (automatic striping) beside its peers, as MB/s of one
//! transfer of a random file (400 MB; 40 MB with `--quick`), received into a file whose
//! SHA-256 is compared with the input's (iperf3 excepted: it sends its own bytes).
//!
//! Three labs, one after the other, each tool's runs interleaved with the others' so that load
//! from elsewhere on the shared machine hits them alike:
//! - the lab's `multipath` topology, 4 links × 200 Mbit/s (tbf on both ends), ECMP routes
//!   hashed on the L4 tuple: one TCP stream (socat), `iperf3 -P 4`, MPTCP (`mptcpize run
//!   iperf3`: both hosts' MPTCP limits allow 8 subflows, and the sender has one `subflow`
//!   endpoint per link, bound to its device, so up to 4 joins form beside the first subflow;
//!   subflows per connection = 1 + the receiver's MPJoinAckRx over its MPCapableACKRX, iperf3's
//!   control connection being MPTCP too), `tcpkit mpcat`, and the ceiling: 4 iperf3 streams
//!   each bound to one link's own addresses (so no hash decides), at once, each sending a share
//!   in proportion to its link's rate;
//!   MPTCP runs under iperf3 rather than socat because socat closes its listening socket once
//!   it has accepted, and a join that arrives after that is refused: in trial runs here the
//!   socat transfer kept its one subflow in 3 of 4;
//! - the same 4 links shaped 300/200/100/50 Mbit/s (target: mpcat at ≥ 90 % of the sum);
//! - one unshaped veth, as the lab makes links (offloads off) and as the kernel makes a veth
//!   (TSO/GSO on), 7 runs each: mpcat (one stream on a plain route) vs one socat stream, and
//!   mpcat -Z (the file sent with sendfile) beside them;
//! - then a link going dead mid-transfer and `--rate-limit`'s accuracy ([`faults`]; either
//!   alone with `--only dead-link` or `--only rate`).
//!
//! Rates are bytes received over the wall time from the sender's start to the receiver's exit.
//! Each link's share is its sender-side tx byte counter over the run. The mpcat receiver runs
//! under GNU time for its peak RSS (target: its --window, 64 MiB by default, + 16 MB), and
//! socat's receiver under the same wrapper so that both carry its cost. Every other round runs
//! the tools in reverse order. socat
//! runs with `-b 131072` so that its default 8 KiB copies do not hold the peer back on the
//! unshaped veth.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tcpkit_lab::{Host, Lab, Link, LinkOpts, Proc, Tbf, MULTIPATH_B4};

use crate::ab::{Build, Builds};

mod faults;

const PORT: u16 = 5201;
/// mpcat's default --window.
const WINDOW: u64 = 64 << 20;
const MB: f64 = 1e6;

fn shaped(mbit: u64) -> Tbf {
    // The same shape as the mpcat tests': a 64 kB bucket, 100 ms of queue.
    Tbf {
        rate_bit_s: mbit * 1_000_000,
        burst_bytes: 64_000,
        latency_ms: 100,
    }
}

/// One finished transfer.
#[derive(Clone, Default)]
struct Xfer {
    secs: f64,
    bytes: u64,
    /// Sender-side tx bytes per link over the run.
    link_tx: Vec<u64>,
    /// MPTCP: subflows that carried the connection (1 + joins).
    subflows: Option<u64>,
    /// mpcat receiver's peak RSS, kB.
    rss_kb: Option<u64>,
    /// socat and mpcat: TCP segments the sending host retransmitted over the run. On one veth
    /// with TSO on, nearly all are spurious (reordering between the two CPUs' backlogs: the
    /// receiver's DSACKs match them), and they follow whichever side is short of CPU.
    retrans: Option<u64>,
}

impl Xfer {
    fn mbs(&self) -> f64 {
        self.bytes as f64 / self.secs / MB
    }
    fn shares(&self) -> String {
        let all: u64 = self.link_tx.iter().sum();
        if self.link_tx.len() < 2 || all == 0 {
            return String::new();
        }
        self.link_tx
            .iter()
            .map(|b| format!("{:.0}", *b as f64 * 100.0 / all as f64))
            .collect::<Vec<_>>()
            .join("/")
    }
}

struct Env<'a> {
    a: &'a Host,
    b: &'a Host,
    links: &'a [Link],
    /// The receiver's address every tool but the ceiling connects to.
    dst: &'a str,
    /// The tcpkit builds mpcat runs with (`--against`: two).
    builds: &'a Builds,
    input: PathBuf,
    out: PathBuf,
    size: u64,
    sha: String,
    /// Each link's rate, Mbit/s (the ceiling's split).
    rates: Vec<u64>,
}

impl<'a> Env<'a> {
    /// The transfers from `a` to `b` over `links` at `rates`: a random input of `size` bytes
    /// written in the lab's folder, and its SHA-256 that every output is checked against.
    fn new(
        lab: &Lab,
        (a, b): (&'a Host, &'a Host),
        (links, rates): (&'a [Link], Vec<u64>),
        dst: &'a str,
        builds: &'a Builds,
        size: u64,
    ) -> Result<Env<'a>> {
        let input = lab.dir().join("in.bin");
        random_file(&input, size)?;
        let sha = sha256(&input)?;
        Ok(Env {
            a,
            b,
            links,
            dst,
            builds,
            input,
            out: lab.dir().join("out.bin"),
            size,
            sha,
            rates,
        })
    }
}

fn sha256(path: &Path) -> Result<String> {
    let out = std::process::Command::new("sha256sum").arg(path).output()?;
    if !out.status.success() || out.stdout.len() < 64 {
        bail!("sha256sum {}", path.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout[..64]).into_owned())
}

fn wait_listening(host: &Host, port: u16, p: &Proc) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = host.run(&["ss", "-Hltn", &format!("sport = :{port}")])?;
        if !out.stdout.is_empty() {
            return Ok(());
        }
        if p.try_status()?.is_some() || Instant::now() > deadline {
            bail!("{} does not listen on {port}:\n{}", p.name(), p.log());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn tx_counters(env: &Env) -> Result<Vec<u64>> {
    env.links
        .iter()
        .map(|l| Ok(env.a.ifstats(&l.a.name)?.tx_bytes))
        .collect()
}

/// A counter of the host's /proc/net/netstat (`MPTcpExt`, `TcpExt`, ...).
fn netstat(host: &Host, group: &str, name: &str) -> Result<u64> {
    counter(host, "/proc/net/netstat", group, name)
}

/// The TCP segments `host` retransmitted so far (/proc/net/snmp's Tcp RetransSegs).
fn retrans(host: &Host) -> Result<u64> {
    counter(host, "/proc/net/snmp", "Tcp", "RetransSegs")
}

/// One counter of a /proc/net file made of pairs of "Group: names" / "Group: values" lines.
fn counter(host: &Host, file: &str, group: &str, name: &str) -> Result<u64> {
    let out = host.run(&["cat", file])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{group}:")))
        .collect();
    if let [names, values] = lines[..] {
        if let Some((_, v)) = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == name)
        {
            return Ok(v.parse()?);
        }
    }
    bail!("{group} {name} not in {file}")
}

/// Starts the receivers, waits until each listens, starts the senders, and returns the wall
/// time from the senders' start to the last receiver's exit. Every process must exit 0.
fn transfer(
    env: &Env,
    lab: &mut Lab,
    rx: &[(Vec<String>, u16)],
    tx: &[Vec<String>],
) -> Result<(f64, Vec<Proc>, Vec<Proc>)> {
    let limit = Duration::from_secs(60 + env.size / 2_000_000);
    let mut rxp = Vec::new();
    for (argv, port) in rx {
        let v: Vec<&str> = argv.iter().map(String::as_str).collect();
        let p = env.b.spawn(lab, "rx", &v)?;
        wait_listening(env.b, *port, &p)?;
        rxp.push(p);
    }
    let t0 = Instant::now();
    let mut txp = Vec::new();
    for argv in tx {
        let v: Vec<&str> = argv.iter().map(String::as_str).collect();
        txp.push(env.a.spawn(lab, "tx", &v)?);
    }
    let mut end = None;
    while end.is_none() {
        let mut all = true;
        for p in &rxp {
            match p.try_status()? {
                Some(st) if !st.success() => bail!("{} failed ({st}):\n{}", p.name(), p.log()),
                Some(_) => {}
                None => all = false,
            }
        }
        if all {
            end = Some(t0.elapsed().as_secs_f64());
        } else if t0.elapsed() > limit {
            for p in rxp.iter().chain(&txp) {
                let _ = p.stop();
            }
            bail!(
                "transfer not done after {limit:?}: {}",
                txp.iter().map(|p| p.log()).collect::<String>()
            );
        } else {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    for p in &txp {
        match p.wait_timeout(Duration::from_secs(10))? {
            Some(st) if st.success() => {}
            st => bail!("{} ended {st:?}:\n{}", p.name(), p.log()),
        }
    }
    Ok((end.unwrap_or(0.0), rxp, txp))
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The output file arrived whole and identical; removed afterwards.
fn verify(env: &Env, what: &str) -> Result<u64> {
    let len = std::fs::metadata(&env.out)?.len();
    let sha = sha256(&env.out)?;
    std::fs::remove_file(&env.out)?;
    if len != env.size || sha != env.sha {
        bail!(
            "{what}: {len} of {} bytes arrived, sha256 {sha} (sent {})",
            env.size,
            env.sha
        );
    }
    Ok(len)
}

fn socat(env: &Env, lab: &mut Lab) -> Result<Xfer> {
    let out = env.out.to_str().context("path")?;
    let input = env.input.to_str().context("path")?;
    // Under the same GNU time as mpcat's receiver (its figure unused): the wrapper's own
    // start and its wait at the end are then in both tools' time alike.
    let time_out = lab.dir().join("socat-rx.time");
    let tf = time_out.to_str().context("path")?;
    let rx = s(&[
        "/usr/bin/time",
        "-f",
        "%M",
        "-o",
        tf,
        "socat",
        "-u",
        "-b",
        "131072",
        &format!("TCP4-LISTEN:{PORT},reuseaddr"),
        &format!("OPEN:{out},creat,trunc,wronly"),
    ]);
    let tx = s(&[
        "socat",
        "-u",
        "-b",
        "131072",
        &format!("OPEN:{input},rdonly"),
        &format!("TCP4:{}:{PORT}", env.dst),
    ]);
    let before = tx_counters(env)?;
    let r0 = retrans(env.a)?;
    let (secs, _, _) = transfer(env, lab, &[(rx, PORT)], &[tx])?;
    let r1 = retrans(env.a)?;
    let after = tx_counters(env)?;
    let bytes = verify(env, "socat")?;
    Ok(Xfer {
        secs,
        bytes,
        link_tx: after.iter().zip(&before).map(|(x, y)| x - y).collect(),
        subflows: None,
        rss_kb: None,
        retrans: Some(r1 - r0),
    })
}

/// The flags the bench passes `mpcat`, looked up in an `--against` build's `--help`.
const MPCAT_FLAGS: [&str; 6] = ["-l", "-p", "-o", "--quiet", "-i", "-Z"];

fn mpcat(env: &Env, lab: &mut Lab, extra: &[&str], build: Build) -> Result<Xfer> {
    let tk = env.builds.bin(build).to_str().context("path")?;
    let out = env.out.to_str().context("path")?;
    let input = env.input.to_str().context("path")?;
    let time_out = lab.dir().join("mpcat-rx.time");
    let tf = time_out.to_str().context("path")?;
    let port = PORT + 2;
    let p = port.to_string();
    let rx = s(&[
        "/usr/bin/time",
        "-f",
        "%M",
        "-o",
        tf,
        tk,
        "mpcat",
        "-l",
        "-p",
        &p,
        "-o",
        out,
        "--quiet",
    ]);
    let mut tx = s(&[tk, "mpcat", "-i", input, "--quiet"]);
    tx.extend(s(extra));
    tx.extend(s(&[env.dst, &p]));
    let before = tx_counters(env)?;
    let r0 = retrans(env.a)?;
    let (secs, _, _) = transfer(env, lab, &[(rx, port)], &[tx])?;
    let r1 = retrans(env.a)?;
    let after = tx_counters(env)?;
    let bytes = verify(env, "mpcat")?;
    let rss_kb = std::fs::read_to_string(&time_out)?
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok());
    Ok(Xfer {
        secs,
        bytes,
        link_tx: after.iter().zip(&before).map(|(x, y)| x - y).collect(),
        subflows: None,
        rss_kb,
        retrans: Some(r1 - r0),
    })
}

fn iperf_received(p: &Proc) -> Result<u64> {
    let log = p.log();
    let start = log.find('{').context("no JSON from iperf3")?;
    let v: Value = serde_json::from_str(&log[start..])
        .with_context(|| format!("iperf3 JSON: {}", &log[..log.len().min(400)]))?;
    v["end"]["sum_received"]["bytes"]
        .as_u64()
        .with_context(|| format!("iperf3: no end.sum_received.bytes in {log}"))
}

#[derive(Clone, Copy, PartialEq)]
enum Iperf {
    /// `iperf3 -P 4` to the receiver's routed address: the ECMP hash places the streams.
    Ecmp4,
    /// `mptcpize run iperf3`, one MPTCP connection.
    Mptcp,
    /// The ceiling: one client per link, bound to that link's own addresses, each sending a
    /// share of the bytes in proportion to its link's rate.
    Pinned,
}

fn iperf(env: &Env, lab: &mut Lab, mode: Iperf) -> Result<Xfer> {
    let mut rx = Vec::new();
    let mut tx = Vec::new();
    let server = |port: u16, pre: &[&str]| {
        let mut v = s(pre);
        v.extend(s(&["iperf3", "-s", "-1", "-J", "-p", &port.to_string()]));
        (v, port)
    };
    match mode {
        Iperf::Pinned => {
            let all: u64 = env.rates.iter().sum();
            for (i, (l, r)) in env.links.iter().zip(&env.rates).enumerate() {
                let port = PORT + 4 + i as u16;
                let local = l.a.addrs[0].split('/').next().context("addr")?;
                let peer = l.b.addrs[0].split('/').next().context("addr")?;
                let each = (env.size * r / all).to_string();
                rx.push(server(port, &[]));
                tx.push(s(&[
                    "iperf3",
                    "-c",
                    peer,
                    "-B",
                    local,
                    "-p",
                    &port.to_string(),
                    "-n",
                    &each,
                ]));
            }
        }
        Iperf::Ecmp4 | Iperf::Mptcp => {
            let (port, pre, p): (u16, &[&str], &str) = if mode == Iperf::Mptcp {
                (PORT + 1, &["mptcpize", "run"], "1")
            } else {
                (PORT + 3, &[], "4")
            };
            rx.push(server(port, pre));
            let mut v = s(pre);
            v.extend(s(&[
                "iperf3",
                "-c",
                env.dst,
                "-p",
                &port.to_string(),
                "-P",
                p,
                "-n",
                &env.size.to_string(),
            ]));
            tx.push(v);
        }
    }
    let mp0 = if mode == Iperf::Mptcp {
        Some((
            netstat(env.b, "MPTcpExt", "MPCapableACKRX")?,
            netstat(env.b, "MPTcpExt", "MPJoinAckRx")?,
        ))
    } else {
        None
    };
    let before = tx_counters(env)?;
    let (secs, rxp, _) = transfer(env, lab, &rx, &tx)?;
    let after = tx_counters(env)?;
    let mut bytes = 0;
    for p in &rxp {
        bytes += iperf_received(p)?;
    }
    let subflows = match mp0 {
        Some((c0, j0)) => {
            // iperf3's control connection is MPTCP too, and takes its own joins: subflows per
            // connection.
            let conns = netstat(env.b, "MPTcpExt", "MPCapableACKRX")? - c0;
            if conns == 0 {
                bail!("mptcpize run iperf3: no MPTCP connection (MPCapableACKRX did not move)");
            }
            let joins = netstat(env.b, "MPTcpExt", "MPJoinAckRx")? - j0;
            Some(1 + joins / conns)
        }
        None => None,
    };
    Ok(Xfer {
        secs,
        bytes,
        link_tx: after.iter().zip(&before).map(|(x, y)| x - y).collect(),
        subflows,
        rss_kb: None,
        retrans: None,
    })
}

/// MPTCP limits in both hosts, and on the sender one `subflow` endpoint per link bound to its
/// device (a join from it then leaves by that link: a socket bound to a device skips the ECMP
/// choice).
fn mptcp_setup(a: &Host, b: &Host, links: &[Link]) -> Result<()> {
    for h in [a, b] {
        h.sysctl("net.mptcp.enabled", "1")?;
        h.run(&[
            "ip",
            "mptcp",
            "limits",
            "set",
            "subflow",
            "8",
            "add_addr_accepted",
            "8",
        ])?;
    }
    for l in links {
        let addr = l.a.addrs[0].split('/').next().context("addr")?;
        a.run(&[
            "ip", "mptcp", "endpoint", "add", addr, "dev", &l.a.name, "subflow",
        ])?;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Tool {
    Socat,
    Iperf,
    Mptcp,
    Mpcat,
    /// mpcat -Z: the input file sent with sendfile (the unshaped veths only).
    MpcatZerocopy,
    Ceiling,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Socat => "one TCP stream (socat)",
            Tool::Iperf => "iperf3 -P 4 (ECMP hash places the streams)",
            Tool::Mptcp => "MPTCP (mptcpize run iperf3)",
            Tool::Mpcat => "tcpkit mpcat (automatic)",
            Tool::MpcatZerocopy => "tcpkit mpcat -Z (automatic, the file sent with sendfile)",
            Tool::Ceiling => {
                "ceiling: 4 iperf3 streams, one pinned per link, bytes in proportion to its rate"
            }
        }
    }

    /// The flags a tcpkit tool's run passes mpcat (None: not tcpkit's).
    fn mpcat_flags(self) -> Option<&'static [&'static str]> {
        match self {
            Tool::Mpcat => Some(&MPCAT_FLAGS[..5]),
            Tool::MpcatZerocopy => Some(&MPCAT_FLAGS),
            Tool::Socat | Tool::Iperf | Tool::Mptcp | Tool::Ceiling => None,
        }
    }
}

/// A tool and the tcpkit build it runs (`Build::New` for the peers).
type Entry = (Tool, Build);

/// The table's entries: every tool, a tcpkit tool's old build (`--against`) right after its
/// new one, so that reversing the order every other round alternates which of the two builds
/// goes first.
fn entries(tools: &[Tool], builds: &Builds) -> Vec<Entry> {
    let mut v = Vec::new();
    for t in tools {
        v.push((*t, Build::New));
        if builds.against.is_some() && t.mpcat_flags().is_some() {
            v.push((*t, Build::Old));
        }
    }
    v
}

fn label((t, b): Entry) -> String {
    match b {
        Build::New => t.name().to_string(),
        Build::Old => format!("{}, old build", t.name()),
    }
}

/// Why the entry does not run: the old build lacks a flag its run passes.
fn lacking(builds: &Builds, (t, b): Entry) -> Option<String> {
    builds.lacking(b, "mpcat", t.mpcat_flags()?)
}

fn one(env: &Env, lab: &mut Lab, (t, b): Entry) -> Result<Xfer> {
    match t {
        Tool::Socat => socat(env, lab),
        Tool::Mptcp => iperf(env, lab, Iperf::Mptcp),
        Tool::Iperf => iperf(env, lab, Iperf::Ecmp4),
        Tool::Ceiling => iperf(env, lab, Iperf::Pinned),
        Tool::Mpcat => mpcat(env, lab, &[], b),
        Tool::MpcatZerocopy => mpcat(env, lab, &["-Z"], b),
    }
}

/// Runs every entry `runs` times, interleaved; returns each entry's runs in order (none for
/// one the old build cannot run). Every other round runs the entries in reverse order, so that
/// no tool always comes first (after the lab's set-up) or always right after the same other
/// tool's run and output check, and the old build goes first every other round. `round`
/// counts the rounds of the whole bench, so that with one run per lab (`--quick`) the order
/// still alternates from lab to lab.
fn scenario(
    env: &Env,
    lab: &mut Lab,
    tools: &[Entry],
    runs: usize,
    round: &mut usize,
) -> Result<Vec<Vec<Xfer>>> {
    let mut all = vec![Vec::new(); tools.len()];
    for r in 0..runs {
        let mut order: Vec<usize> = (0..tools.len()).collect();
        if *round % 2 == 1 {
            order.reverse();
        }
        *round += 1;
        for i in order {
            let e = tools[i];
            if lacking(env.builds, e).is_some() {
                continue;
            }
            eprintln!("  run {} of {runs}: {} ...", r + 1, label(e));
            let x = one(env, lab, e).with_context(|| label(e))?;
            eprintln!(
                "    {:.1} MB/s in {:.2} s{}{}{}",
                x.mbs(),
                x.secs,
                if x.link_tx.len() > 1 {
                    format!(", link shares {} %", x.shares())
                } else {
                    String::new()
                },
                x.subflows
                    .map(|n| format!(", {n} subflows"))
                    .unwrap_or_default(),
                x.retrans
                    .map(|n| format!(", {n} segments retransmitted"))
                    .unwrap_or_default()
            );
            all[i].push(x);
        }
    }
    Ok(all)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn met(ok: bool) -> &'static str {
    if ok {
        "**met**"
    } else {
        "**not met**"
    }
}

/// The tables' head; with `--against`, a last column: a tcpkit tool's new / old medians.
fn head(against: bool) -> String {
    let mut h = String::from("| tool | median MB/s | min MB/s | each run: MB/s (link tx shares %) [TCP segments the sender retransmitted] | target |");
    if against {
        h.push_str(" new / old (medians) |\n|---|---:|---:|---|---|---:|");
    } else {
        h.push_str("\n|---|---:|---:|---|---|");
    }
    h
}

/// One table row per entry: median and min MB/s, each run's rate, link shares and
/// retransmitted segments; an old build's row also new / old of the medians.
fn rows(
    t: &mut String,
    builds: &Builds,
    tools: &[Entry],
    res: &[Vec<Xfer>],
    target: Option<(Tool, f64, &str)>,
) {
    let medians = |e: Entry| -> Option<f64> {
        let i = tools.iter().position(|x| *x == e)?;
        let rates: Vec<f64> = res[i].iter().map(Xfer::mbs).collect();
        (!rates.is_empty()).then(|| median(&rates))
    };
    for (e, runs) in tools.iter().zip(res) {
        let (tool, build) = *e;
        let ratio = match build {
            Build::Old => format!(
                " {} |",
                crate::new_over_old(medians((tool, Build::New)), medians(*e))
            ),
            Build::New if builds.against.is_some() => " |".to_string(),
            Build::New => String::new(),
        };
        if let Some(why) = lacking(builds, *e) {
            let _ = writeln!(t, "| {} | — | — | {why} | |{ratio}", label(*e));
            continue;
        }
        let rates: Vec<f64> = runs.iter().map(Xfer::mbs).collect();
        let each = runs
            .iter()
            .map(|x| {
                let mut c = format!("{:.1}", x.mbs());
                let sh = x.shares();
                if !sh.is_empty() {
                    let _ = write!(c, " ({sh})");
                }
                if let Some(n) = x.subflows {
                    let _ = write!(c, " {n} subflows");
                }
                if let Some(n) = x.retrans {
                    let _ = write!(c, " [{n} rtx]");
                }
                c
            })
            .collect::<Vec<_>>()
            .join("; ");
        let verdict = match target {
            Some((tt, want, what)) if tt == tool && build == Build::New => {
                format!(
                    "{} ({what}: min {:.1})",
                    met(min(&rates) >= want),
                    min(&rates)
                )
            }
            _ => String::new(),
        };
        let _ = writeln!(
            t,
            "| {} | {:.1} | {:.1} | {each} | {verdict} |{ratio}",
            label(*e),
            median(&rates),
            min(&rates),
        );
    }
}

fn random_file(path: &Path, bytes: u64) -> Result<()> {
    let st = std::process::Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/urandom"])
        .stdout(std::fs::File::create(path)?)
        .status()?;
    if !st.success() || std::fs::metadata(path)?.len() != bytes {
        bail!("head -c {bytes} /dev/urandom > {}", path.display());
    }
    Ok(())
}

pub fn mpcat_bench(args: &[String]) -> Result<()> {
    // main.rs checked the flags (--quick, --only S, --against PATH, --against-label L).
    let quick = args.iter().any(|a| a == "--quick");
    for tool in ["socat", "iperf3", "mptcpize", "sha256sum", "/usr/bin/time"] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            bail!("{tool} missing (scripts/setup.sh installs it)");
        }
    }
    let (size, runs) = if quick {
        (40_000_000, 1)
    } else {
        (400_000_000, 3)
    };
    let started = Instant::now();
    let builds = Builds::parse(args, crate::tcpkit_binary()?, &[("mpcat", &MPCAT_FLAGS)])?;
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let only = args
        .windows(2)
        .find(|w| w[0] == "--only")
        .map(|w| w[1].as_str());
    if let Some(o) = only.filter(|o| !matches!(*o, "dead-link" | "rate")) {
        bail!("--only {o}: dead-link or rate");
    }
    let mut t = String::new();
    if only.is_none() {
        t.push_str(&throughput(&builds, size, runs, quick)?);
    }
    if only.is_none_or(|o| o == "dead-link") {
        t.push_str(&faults::dead_link(&builds, size.min(300_000_000), runs)?);
    }
    if only.is_none_or(|o| o == "rate") {
        t.push_str(&faults::rate_limit(&builds, runs)?);
    }
    println!("{t}");

    // The flags too: an --against run names the build it compared with.
    let cmd = format!(
        "cargo run --release -p tcpkit-bench -- mpcat{}",
        args.iter().map(|a| format!(" {a}")).collect::<String>()
    );
    let date = crate::today();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let title = match only {
        Some("dead-link") => "through a link going dead (`--only dead-link`)",
        Some(_) => "`--rate-limit` accuracy (`--only rate`)",
        None => "vs one TCP stream, iperf3 -P 4 and MPTCP",
    };
    let md = format!(
        "# tcpkit mpcat {title} — {date}\n\n\
         Command: `{cmd}` (from the workspace root, as root)\n\n\
         Machine: Linux {}, {cpus} CPUs shared with other work; load average at start: {}; whole bench took {:.0} s.\n\
         Lab: `Lab::multipath` (hosts a → b, ECMP routes to b's {MULTIPATH_B4} hashed on the L4 tuple; tbf on both ends of\n\
         each veth, 64 kB burst, 100 ms latency) and one veth between two fresh hosts for the unshaped runs. Every transfer is a random file\n\
         received into a file whose SHA-256 was compared with the input's (iperf3: its own bytes, counted by its server).\n\
         MB/s = bytes received / wall time from the sender's start to the receiver's exit (MB = 10^6 bytes). Link shares\n\
         are each link's sender-side tx bytes over the run, in link order. MPTCP: `mptcpize run iperf3` on both ends, limits\n\
         subflow 8 / add_addr_accepted 8 in both hosts, one `subflow` endpoint per link (bound to its device) on the sender;\n\
         subflows per connection = 1 + the receiver's MPJoinAckRx / MPCapableACKRX. The ceiling: 4 `iperf3 -B <link i's a>\n\
         -c <link i's b>` at once, {:.0} MB in all, split in proportion to the links' rates. Tools interleaved run by run, in reverse order every other round; socat's receiver under the same GNU time wrapper as mpcat's.\n\
         The mpcat receiver's peak RSS is GNU time's %M (this build's runs only).\n{}\n\
         {t}\n",
        kernel.trim(),
        loadavg.trim(),
        started.elapsed().as_secs_f64(),
        size as f64 / MB,
        builds.header(),
    );
    crate::write_results("mpcat", &date, &md, started, quick.then_some("--quick"))
}

/// The throughput sections: 4 × 200 Mbit/s, unequal links, one unshaped veth; their tables
/// and targets.
fn throughput(builds: &Builds, size: u64, runs: usize, quick: bool) -> Result<String> {
    let four = [
        Tool::Socat,
        Tool::Iperf,
        Tool::Mptcp,
        Tool::Mpcat,
        Tool::Ceiling,
    ];

    let mut t = String::new();
    let head = head(builds.against.is_some());
    let four = entries(&four, builds);

    // 4 × 200 Mbit/s.
    eprintln!("4 links x 200 Mbit/s ...");
    let (mut lab, a, b, links) = Lab::multipath("bmp4", 4, Some(shaped(200)))?;
    mptcp_setup(&a, &b, &links)?;
    let env = Env::new(
        &lab,
        (&a, &b),
        (&links, vec![200; 4]),
        MULTIPATH_B4,
        builds,
        size,
    )?;
    let mut round = 0;
    let eq = scenario(&env, &mut lab, &four, runs, &mut round)?;
    let mpcat_i = four
        .iter()
        .position(|e| *e == (Tool::Mpcat, Build::New))
        .unwrap_or(0);
    let mut rss: Vec<u64> = eq[mpcat_i].iter().filter_map(|x| x.rss_kb).collect();
    let _ = writeln!(
        t,
        "**4 links × 200 Mbit/s (tbf), ECMP L4 hash; {:.0} MB per transfer, {runs} runs each**\n\n{head}",
        size as f64 / MB
    );
    rows(
        &mut t,
        builds,
        &four,
        &eq,
        Some((Tool::Mpcat, 93.0, "≥ 93 MB/s in every run")),
    );
    drop(env);
    lab.close()?;

    // Unequal links: tbf per link on both ends, as the lab shapes.
    let rates = [300u64, 200, 100, 50];
    eprintln!("4 links at {rates:?} Mbit/s ...");
    let (mut lab, a, b, links) = Lab::multipath("bmpu", 4, None)?;
    for (l, mbit) in links.iter().zip(rates) {
        for (h, ifc) in [(&a, &l.a.name), (&b, &l.b.name)] {
            let sh = shaped(mbit);
            h.run(&[
                "tc",
                "qdisc",
                "replace",
                "dev",
                ifc,
                "root",
                "tbf",
                "rate",
                &format!("{}bit", sh.rate_bit_s),
                "burst",
                &sh.burst_bytes.to_string(),
                "latency",
                &format!("{}ms", sh.latency_ms),
            ])?;
        }
    }
    mptcp_setup(&a, &b, &links)?;
    let env = Env::new(
        &lab,
        (&a, &b),
        (&links, rates.to_vec()),
        MULTIPATH_B4,
        builds,
        size,
    )?;
    let sum_mbs = rates.iter().sum::<u64>() as f64 * 1e6 / 8.0 / MB;
    let un = scenario(&env, &mut lab, &four, runs, &mut round)?;
    rss.extend(un[mpcat_i].iter().filter_map(|x| x.rss_kb));
    let _ = writeln!(
        t,
        "\n**4 links at 300/200/100/50 Mbit/s (sum {sum_mbs:.2} MB/s), same tools**\n\n{head}"
    );
    let want = 0.9 * sum_mbs;
    let what = format!("≥ 90 % of the sum = {want:.1} MB/s in every run");
    rows(&mut t, builds, &four, &un, Some((Tool::Mpcat, want, &what)));
    drop(env);
    lab.close()?;

    // One unshaped veth, twice: as the lab makes links (offloads off, so every segment is a
    // packet the stacks handle one by one) and as the kernel makes a veth (TSO/GSO on).
    // Transfers take about a second here, so more runs than the shaped labs' for the medians.
    let veth_runs = if quick { 1 } else { 7 };
    let mut veths = Vec::new();
    for (tag, offloads) in [("bmpv", false), ("bmpo", true)] {
        eprintln!(
            "one unshaped veth, offloads {} ...",
            if offloads { "on" } else { "off" }
        );
        let tools = entries(&VETH_TOOLS, builds);
        let ve = veth(tag, offloads, (builds, &tools), size, veth_runs, &mut round)?;
        let of = |tool: Tool| {
            let i = tools.iter().position(|e| *e == (tool, Build::New));
            i.map_or(&[][..], |i| &ve[i][..])
        };
        rss.extend(
            of(Tool::Mpcat)
                .iter()
                .chain(of(Tool::MpcatZerocopy))
                .filter_map(|x| x.rss_kb),
        );
        let socat_med = median(&of(Tool::Socat).iter().map(Xfer::mbs).collect::<Vec<_>>());
        let mpcat_med = median(&of(Tool::Mpcat).iter().map(Xfer::mbs).collect::<Vec<_>>());
        let _ = writeln!(
            t,
            "\n**one unshaped veth, {}; {veth_runs} runs each**\n\n{head}",
            if offloads {
                "offloads as the kernel sets them (TSO/GSO on)"
            } else {
                "offloads off as the lab's links (TSO/GSO/GRO off)"
            }
        );
        rows(&mut t, builds, &tools, &ve, None);
        veths.push((offloads, socat_med, mpcat_med));
    }
    let mut veth_rows = String::new();
    for (offloads, socat_med, mpcat_med) in veths {
        let _ = writeln!(
            veth_rows,
            "| mpcat within 10 % of one socat stream on one unshaped veth, offloads {} (medians) | {mpcat_med:.0} vs {socat_med:.0} MB/s ({:+.1} %) | {} |",
            if offloads { "on" } else { "off" },
            (mpcat_med / socat_med - 1.0) * 100.0,
            met(mpcat_med >= 0.9 * socat_med),
        );
    }
    let peak = rss.iter().copied().max().unwrap_or(0) as f64 * 1024.0 / MB;
    let budget = (WINDOW as f64 + 16e6) / MB;
    let _ = writeln!(
        t,
        "\n| target | measured | |\n|---|---|---|\n\
         | mpcat ≥ 93 MB/s in every run on 4 × 200 Mbit/s | min {:.1} MB/s | {} |\n\
         | mpcat ≥ 90 % of the sum on 300/200/100/50 Mbit/s | min {:.1} of {:.1} MB/s ({:.0} %) | {} |\n\
{veth_rows}| mpcat receiver peak RSS ≤ window (64 MiB) + 16 MB | {peak:.1} MB of {budget:.1} (max over every mpcat run) | {} |",
        min(&eq[mpcat_i].iter().map(Xfer::mbs).collect::<Vec<_>>()),
        met(min(&eq[mpcat_i].iter().map(Xfer::mbs).collect::<Vec<_>>()) >= 93.0),
        min(&un[mpcat_i].iter().map(Xfer::mbs).collect::<Vec<_>>()),
        sum_mbs,
        min(&un[mpcat_i].iter().map(Xfer::mbs).collect::<Vec<_>>()) * 100.0 / sum_mbs,
        met(min(&un[mpcat_i].iter().map(Xfer::mbs).collect::<Vec<_>>()) >= want),
        met(peak > 0.0 && peak <= budget),
    );
    Ok(t)
}

/// What runs on the unshaped veths: socat, mpcat as it comes, and mpcat -Z (sendfile, whose
/// price there the -Z help quotes).
const VETH_TOOLS: [Tool; 3] = [Tool::Socat, Tool::Mpcat, Tool::MpcatZerocopy];

/// Runs socat and mpcat (with and without -Z) `runs` times each, interleaved, over one
/// unshaped veth between two fresh hosts, with the lab's offloads (off) or the kernel's
/// (`offloads`); `round` as in [`scenario`].
fn veth(
    tag: &str,
    offloads: bool,
    (builds, tools): (&Builds, &[Entry]),
    size: u64,
    runs: usize,
    round: &mut usize,
) -> Result<Vec<Vec<Xfer>>> {
    let mut lab = Lab::new(tag)?;
    let a = lab.host("a")?;
    let b = lab.host("b")?;
    let link = lab.link(
        &a,
        &b,
        &LinkOpts {
            offloads,
            ..LinkOpts::pair()
        },
    )?;
    let dst = link.b.addrs[0]
        .split('/')
        .next()
        .context("addr")?
        .to_string();
    let links = [link];
    let env = Env::new(&lab, (&a, &b), (&links, vec![1]), &dst, builds, size)?;
    let ve = scenario(&env, &mut lab, tools, runs, round)?;
    drop(env);
    lab.close()?;
    Ok(ve)
}
