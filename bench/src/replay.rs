//! `tcpkit-bench replay`: builds a lab (two namespaces, one veth pair, no addresses, IPv6 off so
//! nothing else is on the link), writes two captures (64-byte frames; an IMIX mix), and runs
//! `tcpkit replay` and tcpreplay 4.4.3 on the same link with the same file: top speed, paced
//! rates, CPU and memory. Rates are measured three ways: the tool's own report, the receiving
//! veth's rx counter, and (at 100k pps) a tcpdump on the receiver. Prints one table and writes
//! it to bench/results/replay-YYYY-MM-DD.md.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tcpkit_lab::{Host, Lab, LinkOpts};
use tcpkit_pcap::{CaptureFile, PcapWriter};

use crate::ab::{old_cells, Table};
use crate::{tcpkit_binary, today};

/// The old build's run of a row (see [`crate::ab::Old`]).
type Old = crate::ab::Old<Run>;

/// Packets in each generated capture.
const PACKETS: u32 = 1_000_000;
/// Top-speed runs per tool; the median is reported (the machine is shared and noisy).
const TOP_RUNS: usize = 3;
/// The AF_XDP reference sender: xdpsock of xdp-project/bpf-examples (AF_XDP-example), built
/// by scripts/setup.sh at a pinned commit. Its tx-only mode writes its frames into the UMEM
/// once and then only fills descriptors: the cheapest an AF_XDP sender can be, so its rate on
/// the same veth is what this machine allows a copy-mode sender.
const XDPSOCK: &str = "/opt/tcpkit-xdpsock/xdpsock";
/// Seconds of each xdpsock run (`-d`); its rate is taken over the middle second.
const XDPSOCK_SECS: u32 = 2;

struct Env {
    /// The lab's directory: captures, logs.
    dir: PathBuf,
    tx: Host,
    rx: Host,
    tx_if: String,
    rx_if: String,
    tcpkit: PathBuf,
    /// `--against`: the old build, and the flags of `replay` it lacks.
    against: Option<(PathBuf, Vec<String>)>,
    /// `--only xdp`: the top speed rows (AF_PACKET, --xdp, tcpreplay) and --xdp's paced row.
    only_xdp: bool,
}

/// One finished run of one tool.
#[derive(Default, Clone)]
struct Run {
    wall_s: f64,
    cpu_s: f64,
    maxrss_kb: u64,
    rx_packets: u64,
    rx_bytes: u64,
    /// From the tool's "Actual:" and "Rated:" lines.
    packets: u64,
    secs: f64,
    pps: f64,
    mbps: f64,
    failed: u64,
    /// tcpkit --xdp: the mode its report names (`copy`, `zerocopy`).
    xdp_mode: Option<String>,
}

impl Run {
    /// Receiver-side rate: frames counted by the receiving veth over the sender's send time.
    fn rx_pps(&self) -> f64 {
        self.rx_packets as f64 / self.secs
    }
    fn rx_mbps(&self) -> f64 {
        self.rx_bytes as f64 * 8.0 / self.secs / 1e6
    }
}

pub(crate) fn field(out: &str, line: &str, before: &str) -> Option<f64> {
    let l = out.lines().find(|l| l.trim_start().starts_with(line))?;
    let i = l.find(before)?;
    let head = l[..i].trim_end();
    let num = head.rsplit([' ', '(']).next()?;
    num.trim_end_matches(',').parse().ok()
}

fn run(env: &Env, argv: &[&str]) -> Result<Run> {
    let before = env.rx.ifstats(&env.rx_if)?;
    // GNU time reports the tool's own peak RSS: wait4's ru_maxrss of our child would also
    // carry the high-water mark this (forking) process had, inherited by the child.
    let time_out = env.dir.join("time.out");
    let time_path = time_out.to_str().context("path")?;
    let mut full = vec!["/usr/bin/time", "-f", "%U %S %M", "-o", time_path];
    full.extend_from_slice(argv);
    let ran = crate::run_wait4(env.tx.command(&full), &format!("{argv:?}"))?;
    let (out, wall_s) = (ran.out, ran.wall_s);
    if ran.code != Some(0) {
        bail!(
            "{argv:?} failed (exit {:?}): {}{}",
            ran.code,
            ran.err.trim(),
            out.trim()
        );
    }
    // Frames still in the receiver's backlog are counted a moment later.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let after = env.rx.ifstats(&env.rx_if)?;
    let timed = std::fs::read_to_string(&time_out).unwrap_or_default();
    let t: Vec<f64> = timed
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let (cpu_s, maxrss_kb) = match t[..] {
        [u, s, m] => (u + s, m as u64),
        _ => (ran.cpu_s, ran.maxrss_kb),
    };
    let r = Run {
        wall_s,
        cpu_s,
        maxrss_kb,
        rx_packets: after.rx_packets - before.rx_packets,
        rx_bytes: after.rx_bytes - before.rx_bytes,
        packets: field(&out, "Actual:", "packets").unwrap_or(0.0) as u64,
        secs: field(&out, "Actual:", "seconds").unwrap_or(f64::NAN),
        pps: field(&out, "Rated:", "pps").unwrap_or(f64::NAN),
        mbps: field(&out, "Rated:", "Mbps").unwrap_or(f64::NAN),
        failed: out
            .lines()
            .find_map(|l| l.trim().strip_prefix("Failed packets:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
        xdp_mode: out.lines().find_map(|l| {
            let rest = l.strip_prefix("Sent through AF_XDP (")?;
            Some(rest.split_once(' ')?.0.to_string())
        }),
    };
    Ok(r)
}

/// The median run by tool-reported pps.
fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.pps.total_cmp(&b.pps));
    runs[runs.len() / 2].clone()
}

/// Writes `n` frames to `path`: UDP/IPv4, 16384 flows (1024 sources x 16 destinations),
/// sizes cycling through `sizes` (Ethernet frame length without FCS), 1 µs apart.
fn write_capture(path: &Path, sizes: &[usize], n: u32) -> Result<(u64, u64)> {
    let mut w = PcapWriter::create(path, 1, 0, true)?;
    let mut buf = Vec::with_capacity(2048);
    let mut bytes = 0;
    for i in 0..n {
        let len = sizes[i as usize % sizes.len()];
        // Every field is a function of the flow number, so there are exactly 16384 flows.
        let flow = i % 16384;
        let src = [10, 0, (flow >> 8 & 3) as u8, flow as u8];
        let dst = [10, 1, 0, (flow >> 10) as u8];
        // Unicast to an address nobody has: the receiver drops it at the IP layer.
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(src, dst, 64)
            .udp(1024 + (flow % 1000) as u16, 9);
        let payload = vec![0x5a; len - 42];
        buf.clear();
        b.write(&mut buf, &payload)?;
        w.write_packet(
            1_600_000_000_000_000_000 + u64::from(i) * 1000,
            &buf,
            len as u32,
        )?;
        bytes += len as u64;
    }
    drop(w);
    Ok((std::fs::metadata(path)?.len(), bytes))
}

/// Inter-arrival gaps and rate from a receiver-side capture.
struct Arrivals {
    captured: u64,
    dropped: u64,
    p50_us: f64,
    p99_us: f64,
    pps: f64,
}

fn arrivals(path: &Path, captured: u64, dropped: u64) -> Result<Arrivals> {
    let f = CaptureFile::open(path)?;
    let mut ts = Vec::with_capacity(captured as usize);
    for p in f.packets() {
        ts.push(p?.ts_ns);
    }
    let mut gaps: Vec<u64> = ts.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
    gaps.sort_unstable();
    let pct = |q: f64| {
        if gaps.is_empty() {
            f64::NAN
        } else {
            gaps[((gaps.len() - 1) as f64 * q).round() as usize] as f64 / 1e3
        }
    };
    let span = ts.last().zip(ts.first()).map(|(l, f)| l - f).unwrap_or(0);
    Ok(Arrivals {
        captured,
        dropped,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        pps: if span > 0 {
            (ts.len() - 1) as f64 * 1e9 / span as f64
        } else {
            f64::NAN
        },
    })
}

/// tcpkit's run, tcpreplay's run, and their receiver-side captures if one was asked for; the
/// old build's run and capture with `--against`.
type Paced = (
    Run,
    Run,
    Option<(Arrivals, Arrivals)>,
    Old,
    Option<Arrivals>,
);

/// The median of the old build's runs (by tool-reported pps), or why it did not run.
fn old_median(runs: &[Old]) -> Old {
    let mut ok = Vec::new();
    for r in runs {
        match r {
            None => return None,
            Some(Err(e)) => return Some(Err(e.clone())),
            Some(Ok(r)) => ok.push(r.clone()),
        }
    }
    (!ok.is_empty()).then(|| Ok(median(ok)))
}

/// A row of the table: the measurement, tcpkit's and tcpreplay's figures, their ratio, and
/// the old build's cells (left out without `--against`).
fn row(t: &mut Table, what: &str, tk: String, tr: String, ratio: String, old: [String; 2]) {
    t.row_ab(vec![what.to_string(), tk, tr, ratio], old);
}

/// The table: replay's columns, and with `--against` the old build's figure and new / old.
fn table(against: bool) -> Table {
    Table::new(
        &["measurement", "tcpkit", "tcpreplay", "ratio"],
        "tcpkit, old build",
        true,
        against,
    )
}

fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}x", a / b)
}
fn k(pps: f64) -> String {
    format!("{:.1}k", pps / 1e3)
}
fn err_pct(got: f64, want: f64) -> String {
    format!("{:+.3}%", (got - want) / want * 100.0)
}
/// Rx-counter figure, flagged when not every reported frame arrived.
fn rx(r: &Run, v: String) -> String {
    if r.rx_packets == r.packets {
        v
    } else {
        format!("{v} ({} of {} arrived)", r.rx_packets, r.packets)
    }
}

struct Input {
    name: String,
    path: PathBuf,
    packets: u64,
    file_bytes: u64,
    /// --mbps 1000 runs this many packets (about 2 s where the rate is reachable).
    mbps_limit: u64,
    /// Frames all of this size (FCS included): the AF_XDP reference sender runs beside.
    reference_size: Option<usize>,
}

/// One xdpsock tx-only run on queue 0 of the sending veth, `size`-byte frames (FCS included,
/// as xdpsock counts them) to a MAC nobody has, as the captures' are. Its rate is the
/// receiver's counter over the middle second of its run, timed here: xdpsock stops its
/// `-d` run from a thread that wakes once a second, so its own end is not a clock.
fn xdpsock_run(env: &Env, size: usize) -> Result<Run> {
    let (secs, size) = (XDPSOCK_SECS.to_string(), size.to_string());
    let argv = [
        XDPSOCK,
        "-t",
        "-i",
        env.tx_if.as_str(),
        "-q",
        "0",
        "-d",
        &secs,
        "-s",
        &size,
    ];
    let cmd = env.tx.command(&argv);
    let start = env.rx.ifstats(&env.rx_if)?;
    let sender = std::thread::spawn(move || crate::run_wait4(cmd, "xdpsock"));
    let at = |d: f64| std::thread::sleep(std::time::Duration::from_secs_f64(d));
    at(0.5);
    let (before, t0) = (env.rx.ifstats(&env.rx_if)?, Instant::now());
    at(1.0);
    let (after, t1) = (env.rx.ifstats(&env.rx_if)?, Instant::now());
    let ran = sender
        .join()
        .map_err(|_| anyhow::anyhow!("xdpsock's waiting thread panicked"))??;
    if ran.code != Some(0) {
        bail!("xdpsock failed (exit {:?}): {}", ran.code, ran.err.trim());
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let end = env.rx.ifstats(&env.rx_if)?;
    let rx_packets = after.rx_packets - before.rx_packets;
    let secs = (t1 - t0).as_secs_f64();
    Ok(Run {
        wall_s: ran.wall_s,
        cpu_s: ran.cpu_s,
        // The middle second's frames, and (as "packets") the whole run's.
        rx_packets,
        rx_bytes: after.rx_bytes - before.rx_bytes,
        packets: end.rx_packets - start.rx_packets,
        secs,
        pps: rx_packets as f64 / secs,
        ..Run::default()
    })
}

/// A replayer's words (tcpkit's and tcpreplay's take the same): `head`, the interface, `-K`
/// (the file in memory) unless `extra` holds `--no-preload` (a word of ours, never passed
/// on), the rest of `extra`, the file.
fn replay_argv<'a>(
    head: &[&'a str],
    ifc: &'a str,
    extra: &[&'a str],
    file: &'a str,
) -> Vec<&'a str> {
    let mut v = head.to_vec();
    v.extend(["-i", ifc]);
    if !extra.contains(&"--no-preload") {
        v.push("-K");
    }
    v.extend(extra.iter().copied().filter(|a| *a != "--no-preload"));
    v.push(file);
    v
}

fn bench_file(env: &Env, lab: &mut Lab, t: &mut Table, inp: &Input) -> Result<()> {
    let file = inp.path.to_str().context("path")?;
    let ifc = env.tx_if.as_str();
    let tkr_bin = |bin: &Path, extra: &[&str]| -> Result<Run> {
        let tk = bin.to_str().context("path")?;
        run(env, &replay_argv(&[tk, "replay"], ifc, extra, file))
    };
    let tkr = |extra: &[&str]| tkr_bin(&env.tcpkit, extra);
    // Whether the old build runs with these flags: None without --against, Some(Some(why))
    // when it lacks some of them.
    let old_lacks = |extra: &[&str]| -> Option<Option<String>> {
        let (_, lacks) = env.against.as_ref()?;
        let mut used = vec!["-i", "-K"];
        used.extend(
            extra
                .iter()
                .filter(|a| a.starts_with('-') && **a != "--no-preload"),
        );
        let missing: Vec<&str> = used
            .into_iter()
            .filter(|f| lacks.iter().any(|l| l == f))
            .collect();
        Some((!missing.is_empty()).then(|| format!("not in the old build: {}", missing.join(" "))))
    };
    // The old build's run with the same flags, or which of them it lacks.
    let old = |extra: &[&str]| -> Result<Old> {
        Ok(match (old_lacks(extra), &env.against) {
            (Some(None), Some((bin, _))) => Some(Ok(tkr_bin(bin, extra)?)),
            (Some(Some(why)), _) => Some(Err(why)),
            _ => None,
        })
    };
    let trr = |extra: &[&str]| run(env, &replay_argv(&["tcpreplay"], ifc, extra, file));
    t.section(&format!(
        "{}: {} packets, {:.1} MB file",
        inp.name,
        inp.packets,
        inp.file_bytes as f64 / 1e6
    ));

    // Top speed, interleaved so that load from elsewhere hits both tools alike; with
    // --against the old build runs beside this one, which of the two goes first alternating
    // (new, old, old, new, ...), the same number of runs each.
    let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
    let (mut ao, mut co) = (vec![], vec![]);
    // --xdp, one and two threads (a socket on each of the link's two queues).
    let (mut x1, mut x2) = (vec![], vec![]);
    let xdp1 = ["-t", "--xdp"];
    let xdp2 = ["-t", "--xdp", "--threads", "2"];
    // The reference sender's runs, or why it cannot run.
    let reference = inp.reference_size.map(|size| {
        if Path::new(XDPSOCK).exists() {
            Ok(size)
        } else {
            Err(format!("{XDPSOCK} is missing: scripts/setup.sh builds it"))
        }
    });
    let mut xs = vec![];
    for i in 0..TOP_RUNS {
        let new_first = i % 2 == 0;
        if !new_first {
            ao.push(old(&["-t"])?);
        }
        a.push(tkr(&["-t"])?);
        if new_first {
            ao.push(old(&["-t"])?);
        }
        x1.push(tkr(&xdp1)?);
        if let Some(Ok(size)) = reference {
            xs.push(xdpsock_run(env, size)?);
        }
        b.push(trr(&["-t"])?);
        if new_first {
            c.push(tkr(&["-t", "--threads", "2"])?);
        }
        co.push(old(&["-t", "--threads", "2"])?);
        if !new_first {
            c.push(tkr(&["-t", "--threads", "2"])?);
        }
        x2.push(tkr(&xdp2)?);
    }
    let (x1o, x2o) = (old(&xdp1)?, old(&xdp2)?);
    let (x1, x2) = (median(x1), median(x2));
    let peak_tk = a.iter().map(|r| r.maxrss_kb).max().unwrap_or(0);
    let peak_tr = b.iter().map(|r| r.maxrss_kb).max().unwrap_or(0);
    let peak_old = old_median(&ao).map(|o| {
        o.map(|_| Run {
            maxrss_kb: ao
                .iter()
                .filter_map(|r| r.as_ref().and_then(|r| r.as_ref().ok()))
                .map(|r| r.maxrss_kb)
                .max()
                .unwrap_or(0),
            ..Run::default()
        })
    });
    let (ao, co) = (old_median(&ao), old_median(&co));
    let (a, b, c) = (median(a), median(b), median(c));
    row(
        t,
        &format!("top speed pps (-t, median of {TOP_RUNS}), tool report"),
        k(a.pps),
        k(b.pps),
        ratio(a.pps, b.pps),
        old_cells(&a, &ao, |r| k(r.pps), |r| r.pps),
    );
    row(
        t,
        "top speed pps, rx counter",
        rx(&a, k(a.rx_pps())),
        rx(&b, k(b.rx_pps())),
        ratio(a.rx_pps(), b.rx_pps()),
        old_cells(&a, &ao, |r| rx(r, k(r.rx_pps())), Run::rx_pps),
    );
    row(
        t,
        "top speed pps, tcpkit --threads 2 vs tcpreplay (tool / rx)",
        format!("{} / {}", k(c.pps), rx(&c, k(c.rx_pps()))),
        format!("{} / {}", k(b.pps), k(b.rx_pps())),
        ratio(c.pps, b.pps),
        old_cells(
            &c,
            &co,
            |r| format!("{} / {}", k(r.pps), rx(r, k(r.rx_pps()))),
            |r| r.pps,
        ),
    );
    let mode = x1.xdp_mode.clone().unwrap_or_else(|| "?".into());
    let tool_rx = |r: &Run| format!("{} / {}", k(r.pps), rx(r, k(r.rx_pps())));
    row(
        t,
        &format!("top speed pps, tcpkit --xdp ({mode} mode, queue 0) vs tcpreplay (tool / rx)"),
        tool_rx(&x1),
        format!("{} / {}", k(b.pps), k(b.rx_pps())),
        ratio(x1.rx_pps(), b.rx_pps()),
        old_cells(&x1, &x1o, tool_rx, Run::rx_pps),
    );
    row(
        t,
        "top speed pps, tcpkit --xdp --threads 2 (queues 0, 1) vs tcpreplay (tool / rx)",
        tool_rx(&x2),
        format!("{} / {}", k(b.pps), k(b.rx_pps())),
        ratio(x2.rx_pps(), b.rx_pps()),
        old_cells(&x2, &x2o, tool_rx, Run::rx_pps),
    );
    row(
        t,
        "top speed, --xdp over AF_PACKET at the rx counter (1 thread / 2 threads)",
        format!(
            "{} / {}",
            ratio(x1.rx_pps(), a.rx_pps()),
            ratio(x2.rx_pps(), c.rx_pps())
        ),
        "—".into(),
        "—".into(),
        [String::new(), String::new()],
    );
    if let Some(r) = reference {
        let cpu_ns = |r: &Run| r.cpu_s * 1e9 / r.packets.max(1) as f64;
        // tcpkit's CPU for the sending alone: its run's less that of a run sending one frame
        // (the -K load, the flow marks made with it, the socket's setup), as xdpsock's whole
        // run is its sending.
        let one = tkr(&["-t", "--xdp", "-L", "1"])?;
        let sending_ns =
            (x1.cpu_s - one.cpu_s).max(0.0) * 1e9 / x1.packets.saturating_sub(1).max(1) as f64;
        let (ref_cell, ref_ratio) = match r {
            Ok(_) => {
                let xs = median(xs);
                (
                    format!(
                        "xdpsock {}, CPU {:.0} ns/frame",
                        k(xs.rx_pps()),
                        cpu_ns(&xs)
                    ),
                    ratio(x1.rx_pps(), xs.rx_pps()),
                )
            }
            Err(why) => (why, "—".into()),
        };
        row(
            t,
            &format!("AF_XDP reference on the same veth: tcpkit --xdp vs xdpsock (bpf-examples, tx-only, copy mode, queue 0; median of {TOP_RUNS}): rx counter pps; CPU per frame sending (tcpkit: its run less a 1-frame run's -K load and setup; whole process in brackets)"),
            format!(
                "{}, CPU {sending_ns:.0} ns/frame ({:.0})",
                k(x1.rx_pps()),
                cpu_ns(&x1)
            ),
            ref_cell,
            ref_ratio,
            [String::new(), String::new()],
        );
    }
    if env.only_xdp {
        return xdp_paced_row(env, lab, t, &tkr, &trr);
    }
    row(
        t,
        "top speed Mbps (tool report)",
        format!("{:.0}", a.mbps),
        format!("{:.0}", b.mbps),
        ratio(a.mbps, b.mbps),
        old_cells(&a, &ao, |r| format!("{:.0}", r.mbps), |r| r.mbps),
    );
    row(
        t,
        "top speed CPU s (user+sys) / wall s",
        format!("{:.2} / {:.2}", a.cpu_s, a.wall_s),
        format!("{:.2} / {:.2}", b.cpu_s, b.wall_s),
        ratio(a.cpu_s, b.cpu_s),
        old_cells(
            &a,
            &ao,
            |r| format!("{:.2} / {:.2}", r.cpu_s, r.wall_s),
            |r| r.cpu_s,
        ),
    );
    let budget = (inp.file_bytes + 16 * inp.packets) as f64 / 1e6;
    let peak_new = Run {
        maxrss_kb: peak_tk,
        ..Run::default()
    };
    row(
        t,
        &format!("peak RSS with -K, MB (target <= file + 16 B/pkt = {budget:.1})"),
        format!("{:.1}", peak_tk as f64 / 1e3),
        format!("{:.1}", peak_tr as f64 / 1e3),
        ratio(peak_tk as f64, peak_tr as f64),
        old_cells(
            &peak_new,
            &peak_old,
            |r| format!("{:.1}", r.maxrss_kb as f64 / 1e3),
            |r| r.maxrss_kb as f64,
        ),
    );

    // Which build goes first in the next paced pair (alternating, as in the top speed runs).
    let mut paced_new_first = true;
    let mut paced = |flag: &str, val: &str, limit: u64, capture: bool| -> Result<Paced> {
        let lim = limit.to_string();
        // The CPU run measures pacing, not reading a whole file into memory for 3000 packets.
        let preload = if flag == "--pps" && val == "1000" {
            "--no-preload"
        } else {
            ""
        };
        let mut args = vec![flag, val, "-L", lim.as_str()];
        if !preload.is_empty() {
            args.push(preload);
        }
        // 0: this build, 1: tcpreplay, 2: the old build.
        let mut one = |who: u8| -> Result<(Old, Option<Arrivals>)> {
            if who == 2 {
                match old_lacks(&args) {
                    None => return Ok((None, None)),
                    Some(Some(why)) => return Ok((Some(Err(why)), None)),
                    Some(None) => {}
                }
            }
            let cap = if capture {
                Some(lab.tcpdump(&env.rx, &env.rx_if, "inbound")?)
            } else {
                None
            };
            let r = match who {
                0 => tkr(&args)?,
                1 => trr(&args)?,
                _ => old(&args)?
                    .context("old build")?
                    .map_err(anyhow::Error::msg)?,
            };
            let a = match cap {
                Some(td) => {
                    let c = td.stop()?;
                    Some(arrivals(&c.path, c.captured, c.dropped_by_kernel)?)
                }
                None => None,
            };
            Ok((Some(Ok(r)), a))
        };
        let ran = |o: Old| o.context("run")?.map_err(anyhow::Error::msg);
        let new_first = paced_new_first;
        paced_new_first = !paced_new_first;
        let (z, za) = if new_first { (None, None) } else { one(2)? };
        let (x, xa) = one(0)?;
        let (y, ya) = one(1)?;
        let (z, za) = if new_first { one(2)? } else { (z, za) };
        Ok((ran(x)?, ran(y)?, xa.zip(ya), z, za))
    };

    let (x, y, cap, z, zcap) = paced("--pps", "100000", 300_000, true)?;
    let tool = |want: f64| move |r: &Run| format!("{:.1} ({})", r.pps, err_pct(r.pps, want));
    let rxc = |want: f64| {
        move |r: &Run| {
            rx(
                r,
                format!("{:.1} ({})", r.rx_pps(), err_pct(r.rx_pps(), want)),
            )
        }
    };
    // A --pps run's two rows: the rate the tool says it reached and the one the receiver's
    // counter saw, each with its error against the rate asked.
    let pps_rows = |t: &mut Table, want: f64, x: &Run, y: &Run, z: &Old| {
        let what = |m: &str| format!("--pps {want}: {m}, error");
        row(
            t,
            &what("achieved pps (tool)"),
            tool(want)(x),
            tool(want)(y),
            ratio(x.pps, y.pps),
            old_cells(x, z, tool(want), |r| r.pps),
        );
        row(
            t,
            &what("rx counter pps"),
            rxc(want)(x),
            rxc(want)(y),
            ratio(x.rx_pps(), y.rx_pps()),
            old_cells(x, z, rxc(want), Run::rx_pps),
        );
    };
    pps_rows(t, 1e5, &x, &y, &z);
    if let Some((ca, cb)) = cap {
        let show = |c: &Arrivals| show_arrivals(c, 1e5);
        let old = match (&z, zcap) {
            (Some(Ok(_)), Some(cz)) => [
                show(&cz),
                if ca.dropped == 0 && cz.dropped == 0 {
                    format!(
                        "p99 {}",
                        crate::new_over_old(Some(ca.p99_us), Some(cz.p99_us))
                    )
                } else {
                    "-".into()
                },
            ],
            (Some(Err(why)), _) => [why.clone(), "—".into()],
            _ => [String::new(), String::new()],
        };
        row(
            t,
            "--pps 100000: receiver tcpdump (rate, inter-arrival gap)",
            show(&ca),
            show(&cb),
            if ca.dropped == 0 && cb.dropped == 0 {
                format!("p99 {}", ratio(ca.p99_us, cb.p99_us))
            } else {
                "-".into()
            },
            old,
        );
    }
    let (x, y, _, z, _) = paced("--pps", "500000", 1_000_000, false)?;
    pps_rows(t, 5e5, &x, &y, &z);
    let (x, y, _, z, _) = paced("--mbps", "1000", inp.mbps_limit, false)?;
    let mbps = |r: &Run| format!("{:.2} ({})", r.mbps, err_pct(r.mbps, 1000.0));
    row(
        t,
        "--mbps 1000: achieved Mbps (tool), error",
        mbps(&x),
        mbps(&y),
        ratio(x.mbps, y.mbps),
        old_cells(&x, &z, mbps, |r| r.mbps),
    );
    let rx_mbps = |r: &Run| rx(r, format!("{:.2}", r.rx_mbps()));
    row(
        t,
        "--mbps 1000: rx counter Mbps",
        rx_mbps(&x),
        rx_mbps(&y),
        ratio(x.rx_mbps(), y.rx_mbps()),
        old_cells(&x, &z, rx_mbps, Run::rx_mbps),
    );
    let (x, y, _, z, _) = paced("--pps", "1000", 3000, false)?;
    let pct = |r: &Run| r.cpu_s / r.wall_s * 100.0;
    let cpu = |r: &Run| format!("{:.3} s, {:.2} %", r.cpu_s, pct(r));
    row(
        t,
        "--pps 1000 (3000 pkts, no -K): CPU s, % of a core (target < 5 %)",
        cpu(&x),
        cpu(&y),
        ratio(x.cpu_s, y.cpu_s),
        old_cells(&x, &z, cpu, |r| r.cpu_s),
    );
    xdp_paced_row(env, lab, t, &tkr, &trr)?;
    let failed = [
        a.failed, b.failed, c.failed, x1.failed, x2.failed, x.failed, y.failed,
    ];
    if failed.iter().any(|&f| f > 0) {
        t.row(vec![
            "failed packets (any run above)".into(),
            format!("{failed:?}"),
        ]);
    }
    Ok(())
}

/// The receiver tcpdump's figures of a --pps 100000 run: rate and error, inter-arrival gaps;
/// or that tcpdump dropped frames, which makes them unusable.
fn show_arrivals(c: &Arrivals, want: f64) -> String {
    if c.dropped == 0 {
        format!(
            "{:.1} pps ({}), gap p50 {:.2} us, p99 {:.2} us",
            c.pps,
            err_pct(c.pps, want),
            c.p50_us,
            c.p99_us
        )
    } else {
        format!(
            "tcpdump dropped {} of {}: not used",
            c.dropped,
            c.captured + c.dropped
        )
    }
}

/// `--xdp --pps 100000` beside tcpreplay's `--pps 100000`, each with a tcpdump on the receiver
/// (tcpkit first, then tcpreplay): the tool's rate, the rx counter's, and tcpdump's.
fn xdp_paced_row(
    env: &Env,
    lab: &mut Lab,
    t: &mut Table,
    tkr: &dyn Fn(&[&str]) -> Result<Run>,
    trr: &dyn Fn(&[&str]) -> Result<Run>,
) -> Result<()> {
    let want = 1e5;
    let args = ["--pps", "100000", "-L", "300000"];
    let mut captured =
        |f: &dyn Fn(&[&str]) -> Result<Run>, extra: &[&str]| -> Result<(Run, Arrivals)> {
            let td = lab.tcpdump(&env.rx, &env.rx_if, "inbound")?;
            let mut a = extra.to_vec();
            a.extend(args);
            let r = f(&a)?;
            let c = td.stop()?;
            Ok((r, arrivals(&c.path, c.captured, c.dropped_by_kernel)?))
        };
    let (x, xa) = captured(tkr, &["--xdp"])?;
    // A part run alone has no AF_PACKET paced row above: one here, in the same turn.
    let af_packet = if env.only_xdp {
        Some(captured(tkr, &[])?)
    } else {
        None
    };
    let (y, ya) = captured(trr, &[])?;
    let cell = |r: &Run, a: &Arrivals| {
        format!(
            "{:.1} ({}) / {} / {}",
            r.pps,
            err_pct(r.pps, want),
            rx(
                r,
                format!("{:.1} ({})", r.rx_pps(), err_pct(r.rx_pps(), want))
            ),
            show_arrivals(a, want)
        )
    };
    // tcpkit's run (`r`, its capture `a`) beside tcpreplay's, the p99 gaps' ratio when both
    // captures are whole.
    let mut beside = |what: &str, r: &Run, a: &Arrivals| {
        let p99 = if a.dropped == 0 && ya.dropped == 0 {
            format!("p99 {}", ratio(a.p99_us, ya.p99_us))
        } else {
            "-".into()
        };
        row(
            t,
            what,
            cell(r, a),
            cell(&y, &ya),
            p99,
            [String::new(), String::new()],
        );
    };
    beside(
        "--pps 100000 with --xdp vs tcpreplay: tool / rx counter / receiver tcpdump",
        &x,
        &xa,
    );
    if let Some((p, pa)) = af_packet {
        beside(
            "--pps 100000 through AF_PACKET (the same turn) vs tcpreplay",
            &p,
            &pa,
        );
    }
    Ok(())
}

pub(crate) fn replay(args: &[String]) -> Result<()> {
    let started = Instant::now();
    let tcpkit = tcpkit_binary()?;
    if args.iter().any(|a| a == "--flows") {
        return crate::replay_flows::only(&tcpkit);
    }
    let against = crate::Against::parse(args, &tcpkit)?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut lab = Lab::new("bench")?;
    let tx = lab.host("tx")?;
    let rx = lab.host("rx")?;
    for h in [&tx, &rx] {
        h.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        h.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
    }
    // Two queues, so that --xdp --threads 2 has a socket on each; AF_PACKET and tcpreplay
    // see no difference (without NAPI on the receiving end, veth ignores its queues).
    let link = lab.link(
        &tx,
        &rx,
        &LinkOpts {
            queues: Some(2),
            ..LinkOpts::default()
        },
    )?;
    let only_xdp = match crate::flag_value(args, "--only", "xdp")? {
        None => false,
        Some("xdp") => true,
        Some(other) => bail!("--only {other}: the one part is xdp"),
    };
    let packets: u32 = match crate::flag_value(args, "--packets", "a count")? {
        None => PACKETS,
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n >= 1000)
            .with_context(|| format!("--packets {n}: a count of at least 1000"))?,
    };
    let env = Env {
        dir: lab.dir().to_path_buf(),
        tx_if: link.a.name.clone(),
        rx_if: link.b.name.clone(),
        tx,
        rx,
        against: match &against {
            Some(a) => Some((
                a.bin.clone(),
                crate::missing_flags(
                    &a.bin,
                    "replay",
                    &[
                        "-i",
                        "-K",
                        "-t",
                        "--threads",
                        "--pps",
                        "--mbps",
                        "-L",
                        "--xdp",
                    ],
                )?,
            )),
            None => None,
        },
        tcpkit,
        only_xdp,
    };
    let dir = lab.dir().to_path_buf();

    eprintln!("writing captures ...");
    let small = dir.join("64b.pcap");
    let (small_size, _) = write_capture(&small, &[60], packets)?;
    // IMIX 7:4:1 of 64/594/1518-byte frames (60/590/1514 without FCS), interleaved.
    let imix_sizes = [60, 590, 60, 60, 590, 60, 1514, 60, 590, 60, 590, 60];
    let imix = dir.join("imix.pcap");
    let (imix_size, imix_bytes) = write_capture(&imix, &imix_sizes, packets)?;
    let imix_avg = imix_bytes as f64 / f64::from(packets);

    let mut t = table(against.is_some());
    let inputs = [
        Input {
            name: "64-byte frames (60 B + FCS), UDP, 16k flows".into(),
            path: small,
            packets: u64::from(packets),
            file_bytes: small_size,
            // 1000 Mbit/s of 60-byte frames is 2.08 Mpps, above both tools' top speed here:
            // the row then shows how close each gets.
            mbps_limit: u64::from(packets),
            reference_size: Some(64),
        },
        Input {
            name: format!("IMIX 7:4:1 of 64/594/1518 B frames (avg {imix_avg:.0} B), 16k flows"),
            path: imix,
            packets: u64::from(packets),
            file_bytes: imix_size,
            mbps_limit: (2.0 * 1e9 / 8.0 / imix_avg) as u64,
            reference_size: None,
        },
    ];
    for inp in &inputs {
        eprintln!("{} ...", inp.name);
        bench_file(&env, &mut lab, &mut t, inp)?;
    }
    eprintln!("flows per second and the two-interface split ...");
    let table = format!(
        "{}\n{}",
        t.markdown(),
        crate::replay_flows::rows(&env.tcpkit, false)?.markdown()
    );
    println!("{table}");

    // The flags too: an --against run names the build it compared with.
    let cmd = format!(
        "cargo run --release -p tcpkit-bench -- replay{}",
        args.iter().map(|a| format!(" {a}")).collect::<String>()
    );
    let date = today();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let md = format!(
        "# tcpkit replay vs tcpreplay 4.4.3 — {date}\n\n\
         Command: `{cmd}` (from the workspace root, as root)\n\n\
         Machine: Linux {}, {cpus} CPUs; load average at start: {}; whole bench took {:.0} s.\n\
         Link: one veth pair between two namespaces (two queues each end), no addresses, IPv6\n\
         off; frames go to a MAC nobody has, so the receiver drops them at the IP layer. Both\n\
         tools run with -K except the --pps 1000 CPU row. Top speed rows: median of 3\n\
         interleaved runs per tool (AF_PACKET, --xdp and tcpreplay take turns).\n\
         Rx counter = the receiving veth's rx_packets delta / the tool's reported send time.\n\
         AF_XDP reference: xdpsock of xdp-project/bpf-examples (scripts/setup.sh builds it),\n\
         tx-only on the same veth's queue 0 with 64-byte frames to the same absent MAC, its rate\n\
         the rx counter over the middle second of a 2 s run: what this VM allows an AF_XDP\n\
         copy-mode sender (veth builds an skb per frame, and the receiving end's drop runs on\n\
         the sender's CPU).\n\
         {}\n\
         {table}",
        kernel.trim(),
        load.trim(),
        started.elapsed().as_secs_f64(),
        crate::ab::header(against.as_ref(), &env.tcpkit)
    );
    // A part of the bench, or fewer packets, is a quick look: printed, not kept as results.
    let partial = if only_xdp {
        Some("--only xdp")
    } else {
        (packets != PACKETS).then_some("--packets")
    };
    crate::write_results("replay", &date, &md, started, partial)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pps: f64) -> Run {
        Run {
            pps,
            ..Run::default()
        }
    }

    #[test]
    fn without_against_the_table_is_as_before() {
        let mut t = table(false);
        t.section("64 B");
        row(
            &mut t,
            "top",
            "2.0k".into(),
            "1.0k".into(),
            "2.00x".into(),
            old_cells(&run(2e3), &None, |r| k(r.pps), |r| r.pps),
        );
        assert_eq!(
            t.markdown(),
            "| measurement | tcpkit | tcpreplay | ratio |\n|---|---:|---:|---:|\n\
             | **64 B** |  |  |  |\n| top | 2.0k | 1.0k | 2.00x |\n"
        );
    }

    #[test]
    fn against_adds_the_old_figure_and_new_over_old() {
        let mut t = table(true);
        t.section("64 B");
        let new = run(3e3);
        row(
            &mut t,
            "top",
            k(new.pps),
            "1.0k".into(),
            "3.00x".into(),
            old_cells(&new, &Some(Ok(run(2e3))), |r| k(r.pps), |r| r.pps),
        );
        // A flag the old build lacks: said in its cell, no ratio.
        row(
            &mut t,
            "threads",
            k(new.pps),
            "1.0k".into(),
            "3.00x".into(),
            old_cells(
                &new,
                &Some(Err("not in the old build: --threads".into())),
                |r| k(r.pps),
                |r| r.pps,
            ),
        );
        // A row with no old figure (tcpreplay's own) keeps the columns aligned.
        t.row(vec!["other".into(), "a".into(), "b".into(), "c".into()]);
        assert_eq!(
            t.markdown(),
            "| measurement | tcpkit | tcpreplay | ratio | tcpkit, old build | new / old |\n\
             |---|---:|---:|---:|---:|---:|\n\
             | **64 B** |  |  |  |  |  |\n\
             | top | 3.0k | 1.0k | 3.00x | 2.0k | 1.50 |\n\
             | threads | 3.0k | 1.0k | 3.00x | not in the old build: --threads | — |\n\
             | other | a | b | c |  |  |\n"
        );
    }

    #[test]
    fn the_old_median_is_by_pps_and_a_missing_flag_wins() {
        let runs = vec![Some(Ok(run(5.0))), Some(Ok(run(1.0))), Some(Ok(run(3.0)))];
        assert_eq!(old_median(&runs).unwrap().unwrap().pps, 3.0);
        assert!(old_median(&[None, None]).is_none());
        let e = old_median(&[Some(Ok(run(1.0))), Some(Err("x".into()))]);
        assert_eq!(e.unwrap().err().unwrap(), "x");
    }
}
