//! `tcpkit-bench replay`'s issue-28 rows: a bigFlows-like capture (many short TCP flows,
//! generated: no public one is bundled) looped at top speed with `--unique-ip`,
//! `--unique-ports` and both, beside tcpreplay `--unique-ip`, counting the distinct flows that
//! reach the receiver; and the two-interface split (`-i -I`) at top speed beside tcpreplay's
//! (`-i -I -c`, tcpprep `--auto=client`), with the reordering measured at the receiver.
//! `tcpkit-bench replay --flows` runs only these rows, short; the whole bench adds them long.
//!
//! The receiver counts with its own tcpdump (64-byte snaps into a 128 MiB TPACKET_V3 ring, no
//! immediate mode, so a top-speed burst of a million frames fits and none is dropped; drops
//! would be shown); distinct flows are tcpreplay's (direction-specific 5-tuples,
//! `tcpkit_wire::flow_key`). Reordering is read off `tcpdump -i any` on the receiver, which
//! sees both interfaces' frames in the order its kernel took them: each frame carries its
//! number, and the row gives the inversions and the largest displacement.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tcpkit_lab::{Host, Lab, LinkOpts};
use tcpkit_pcap::{CaptureFile, PcapWriter};

use crate::ab::Table;
use crate::replay::field;

struct Env {
    lab: Lab,
    tx: Host,
    rx: Host,
    /// (sender end, receiver end) of the client-side and server-side links.
    one: (String, String),
    two: (String, String),
}

/// What one sender run gave: its reported time and rate, and what the receiver counted.
struct Got {
    secs: f64,
    pps: f64,
    frames: u64,
    dropped: u64,
    path: PathBuf,
}

fn env() -> Result<Env> {
    let mut lab = Lab::new("bflows")?;
    let tx = lab.host("tx")?;
    let rx = lab.host("rx")?;
    for h in [&tx, &rx] {
        h.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        h.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
    }
    let l1 = lab.link(&tx, &rx, &LinkOpts::default())?;
    let l2 = lab.link(&tx, &rx, &LinkOpts::default())?;
    Ok(Env {
        one: (l1.a.name.clone(), l1.b.name.clone()),
        two: (l2.a.name.clone(), l2.b.name.clone()),
        lab,
        tx,
        rx,
    })
}

/// Runs `argv` in the sender while the receiver's tcpdump records `iface` (snap `snap`).
fn run(e: &mut Env, iface: &str, snap: &str, name: &str, argv: &[&str]) -> Result<Got> {
    let path = e.lab.dir().join(format!("{name}.pcap"));
    let p = path.to_str().context("path")?.to_string();
    let d = e.rx.spawn(
        &mut e.lab,
        &format!("tcpdump-{name}"),
        &[
            "tcpdump", "-i", iface, "-w", &p, "-s", snap, "-B", "131072", "-nn",
        ],
    )?;
    let t0 = Instant::now();
    while !d.log().contains("listening on") {
        if t0.elapsed().as_secs() > 10 {
            bail!("tcpdump did not start: {}", d.log());
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let ran = crate::run_wait4(e.tx.command(argv), &format!("{argv:?}"))?;
    if ran.code != Some(0) {
        bail!("{argv:?} failed: {}{}", ran.err.trim(), ran.out.trim());
    }
    // The ring is flushed when tcpdump stops; give the last frames their moment.
    std::thread::sleep(std::time::Duration::from_millis(300));
    d.signal(tcpkit_lab::Signal::SIGINT)?;
    d.wait_timeout(std::time::Duration::from_secs(30))?;
    let log = d.log();
    let count = |what: &str| {
        log.lines()
            .find(|l| l.ends_with(what))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(Got {
        secs: field(&ran.out, "Actual:", "seconds").unwrap_or(f64::NAN),
        pps: field(&ran.out, "Rated:", "pps").unwrap_or(f64::NAN),
        frames: count("packets captured"),
        dropped: count("packets dropped by kernel"),
        path,
    })
}

/// A bigFlows-like capture: `flows` short TCP connections (SYN, SYN-ACK, ACK, a request of
/// 200 bytes, an answer of 800, FIN), from 2000 clients to 50 servers, each client port used
/// once per client; 8 connections in flight at a time, their packets interleaved.
fn write_bigflows(path: &Path, flows: u32) -> Result<()> {
    let mut w = PcapWriter::create(path, 1, 0, true)?;
    let mut buf = Vec::with_capacity(1100);
    let mut ts = 1_600_000_000_000_000_000u64;
    let steps: [(bool, u8, usize); 6] = [
        (true, 0x02, 0),
        (false, 0x12, 0),
        (true, 0x10, 0),
        (true, 0x18, 200),
        (false, 0x18, 800),
        (true, 0x11, 0),
    ];
    for group in (0..flows).step_by(8) {
        for (up, flags, len) in steps {
            for f in group..(group + 8).min(flows) {
                let c = [10, 1, (f / 250 % 8) as u8, (f % 250) as u8 + 1];
                let s = [10, 2, 0, (f % 50) as u8 + 1];
                let cp = 1024 + (f / 2000) as u16;
                let (src, dst, sp, dp) = if up { (c, s, cp, 80) } else { (s, c, 80, cp) };
                let mut b =
                    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                        .ipv4(src, dst, 64)
                        .tcp(sp, dp, 1000, 65535);
                b = if flags & 0x02 != 0 { b.syn() } else { b };
                b = if flags & 0x10 != 0 { b.ack(1) } else { b };
                b = if flags & 0x08 != 0 { b.psh() } else { b };
                b = if flags & 0x01 != 0 { b.fin() } else { b };
                buf.clear();
                b.write(&mut buf, &vec![0x5a; len])?;
                w.write_packet(ts, &buf, buf.len() as u32)?;
                ts += 10_000;
            }
        }
    }
    drop(w);
    Ok(())
}

/// Frames numbered 0..n in runs of 1-4 per side (UDP 40000 -> 53 and its answers, so
/// tcpprep --auto=client puts 10.1.0.1 on the client side and 10.2.0.1 on the server side).
fn write_numbered(path: &Path, n: u32) -> Result<()> {
    let mut w = PcapWriter::create(path, 1, 0, true)?;
    let mut buf = Vec::with_capacity(128);
    for (i, side) in (0..n).zip(tcpkit_lab::client_server_runs(n)) {
        let mut body = [0u8; 18];
        body[2..4].copy_from_slice(if side { &[1, 0] } else { &[0x81, 0x80] });
        body[4..8].copy_from_slice(&i.to_be_bytes());
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let b = if side {
            b.ipv4([10, 1, 0, 1], [10, 2, 0, 1], 64).udp(40000, 53)
        } else {
            b.ipv4([10, 2, 0, 1], [10, 1, 0, 1], 64).udp(53, 40000)
        };
        buf.clear();
        b.write(&mut buf, &body)?;
        w.write_packet(u64::from(i) * 1000, &buf, buf.len() as u32)?;
    }
    drop(w);
    Ok(())
}

/// Distinct direction-specific flows in a receiver capture.
fn distinct_flows(path: &Path) -> Result<u64> {
    let f = CaptureFile::open(path)?;
    let mut seen = HashSet::new();
    for p in f.packets() {
        if let Some(k) = tcpkit_wire::flow_key(p?.data) {
            seen.insert(k);
        }
    }
    Ok(seen.len() as u64)
}

/// (inversions, largest displacement) of the numbered frames in an `-i any` capture.
fn reordering(path: &Path) -> Result<(u64, u64, u64)> {
    let f = CaptureFile::open(path)?;
    let mut nums = Vec::new();
    for p in f.packets() {
        let p = p?;
        let ip = match p.linktype {
            113 => 16,
            276 => 20,
            _ => continue,
        };
        // The number sits 4 bytes into the UDP payload.
        let at = ip + 20 + 8 + 4;
        if let Some(b) = p.data.get(at..at + 4) {
            nums.push(u32::from_be_bytes(b.try_into()?));
        }
    }
    let inversions = nums.windows(2).filter(|w| w[1] < w[0]).count() as u64;
    // Displacement against the order the frames arrived in: place i held frame nums[i].
    let mut sorted = nums.clone();
    sorted.sort_unstable();
    let displaced = nums
        .iter()
        .zip(&sorted)
        .map(|(a, b)| u64::from(a.abs_diff(*b)))
        .max()
        .unwrap_or(0);
    Ok((nums.len() as u64, inversions, displaced))
}

/// The rows, in a table of their own: `quick` is the short version (`--flows`).
pub(crate) fn rows(tcpkit: &Path, quick: bool) -> Result<Table> {
    let mut e = env()?;
    let tk = tcpkit.to_str().context("path")?.to_string();
    let dir = e.lab.dir().to_path_buf();
    let (flows, loops, numbered) = if quick {
        (5_000u32, 8u32, 200_000u32)
    } else {
        (20_000, 8, 1_000_000)
    };
    let big = dir.join("bigflows.pcap");
    write_bigflows(&big, flows)?;
    let bigp = big.to_str().context("path")?.to_string();
    let mut t = Table::new(
        &["measurement", "tcpkit", "tcpreplay", "ratio"],
        "",
        true,
        false,
    );
    t.section(&format!(
        "bigFlows-like: {flows} TCP flows x 6 packets (2 flows each way), {loops} loops, top speed, -K; distinct flows at the receiver per second of sending"
    ));
    let expect = u64::from(flows) * 2 * u64::from(loops);
    let (one_tx, one_rx) = e.one.clone();
    let l = loops.to_string();
    let cell = |e: &mut Env, name: &str, argv: &[&str]| -> Result<(String, f64)> {
        let g = run(e, &one_rx, "64", name, argv)?;
        let d = distinct_flows(&g.path)?;
        let fps = d as f64 / g.secs;
        let _ = std::fs::remove_file(&g.path);
        Ok((
            format!(
                "{:.0} k flows/s ({d} of {expect} distinct; {} frames, {} dropped; {:.0} kpps)",
                fps / 1e3,
                g.frames,
                g.dropped,
                g.pps / 1e3
            ),
            fps,
        ))
    };
    // The same words for both tools: sender, interface, preloaded, top speed, the loops.
    let words = |tool: &'static str| -> Vec<String> {
        let mut v: Vec<String> = match tool {
            "tcpreplay" => vec!["tcpreplay".into()],
            _ => vec![tk.clone(), "replay".into()],
        };
        v.extend(["-i", &one_tx, "-K", "-t", "--loop", &l].map(String::from));
        v
    };
    let mut trv = words("tcpreplay");
    trv.extend(["--unique-ip".to_string(), bigp.clone()]);
    let trv: Vec<&str> = trv.iter().map(String::as_str).collect();
    let tr = cell(&mut e, "tr-uip", &trv)?;
    for (what, flags) in [
        ("--unique-ip", &["--unique-ip"][..]),
        ("--unique-ports", &["--unique-ports"][..]),
        (
            "--unique-ip --unique-ports",
            &["--unique-ip", "--unique-ports"][..],
        ),
    ] {
        let tkv = words("tcpkit");
        let mut argv: Vec<&str> = tkv.iter().map(String::as_str).collect();
        argv.extend_from_slice(flags);
        argv.push(&bigp);
        let (c, fps) = cell(&mut e, "tk", &argv)?;
        t.row(vec![
            format!("tcpkit {what} vs tcpreplay --unique-ip"),
            c,
            tr.0.clone(),
            format!("{:.2}x", fps / tr.1),
        ]);
    }

    let num = dir.join("numbered.pcap");
    write_numbered(&num, numbered)?;
    let nump = num.to_str().context("path")?.to_string();
    let cache = dir.join("numbered.cache");
    let cachep = cache.to_str().context("path")?.to_string();
    let prep =
        e.tx.run(&["tcpprep", "--auto=client", "-i", &nump, "-o", &cachep])?;
    if !prep.status.success() {
        bail!("tcpprep: {}", String::from_utf8_lossy(&prep.stderr));
    }
    t.section(&format!(
        "two interfaces (-i -I), {numbered} frames in runs of 1-4 per side, top speed, -K; the receiver's tcpdump -i any sees both"
    ));
    let (two_tx, _) = e.two.clone();
    let split = |e: &mut Env, name: &str, argv: &[&str]| -> Result<(String, f64)> {
        let g = run(e, "any", "96", name, argv)?;
        let (n, inv, disp) = reordering(&g.path)?;
        let _ = std::fs::remove_file(&g.path);
        Ok((
            format!(
                "{:.0} kpps; {n} of {numbered} arrived ({} dropped), {inv} inversions, largest displacement {disp}",
                g.pps / 1e3,
                g.dropped
            ),
            g.pps,
        ))
    };
    let tr = split(
        &mut e,
        "tr-split",
        &[
            "tcpreplay",
            "-i",
            &one_tx,
            "-I",
            &two_tx,
            "-c",
            &cachep,
            "-K",
            "-t",
            &nump,
        ],
    )?;
    let tkc = split(
        &mut e,
        "tk-split",
        &[
            &tk, "replay", "-i", &one_tx, "-I", &two_tx, "-c", &cachep, "-K", "-t", &nump,
        ],
    )?;
    t.row(vec![
        "split by the same tcpprep --auto=client cache".into(),
        tkc.0,
        tr.0.clone(),
        format!("{:.2}x", tkc.1 / tr.1),
    ]);
    let tka = split(
        &mut e,
        "tk-auto",
        &[
            &tk, "replay", "-i", &one_tx, "-I", &two_tx, "-K", "-t", &nump,
        ],
    )?;
    t.row(vec![
        "tcpkit's automatic split (no cache) vs tcpreplay's cache".into(),
        tka.0,
        tr.0,
        format!("{:.2}x", tka.1 / tr.1),
    ]);
    Ok(t)
}

/// `tcpkit-bench replay --flows`: only these rows, short, printed and written to
/// bench/results/replay-flows-DATE.md.
pub(crate) fn only(tcpkit: &Path) -> Result<()> {
    let started = Instant::now();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let t = rows(tcpkit, true)?;
    let table = t.markdown();
    println!("{table}");
    let date = crate::today();
    let md = format!(
        "# tcpkit replay: flows per second and the two-interface split — {date}\n\n\
         Command: `cargo run --release -p tcpkit-bench -- replay --flows` (from the workspace root, as root)\n\n\
         Load average at start: {}; took {:.0} s. One run per row (the short version).\n\n{table}",
        load.trim(),
        started.elapsed().as_secs_f64()
    );
    crate::write_results("replay-flows", &date, &md, started, None)
}
