//! `tcpkit-bench mpcat`'s two sections on issue 24 (also alone: `--only dead-link`, `--only
//! rate`), each run with this build and, with `--against`, the old one, interleaved:
//! - a dead link: 4 links × 200 Mbit/s, one of them dropped both ways (nftables, before
//!   routing, on both ends) 2 s into the transfer and never back; the MB/s that arrived in order
//!   (the output file's growth, sampled every 50 ms) in each second, and how many seconds after
//!   the drop carried less than a tenth of the 3 live links' capacity;
//! - `--rate-limit` accuracy: 40M, 60M and 100M with the default chunk sizes and with
//!   `--chunk 1M`, over loopback in a host of its own, 3 s of the rate from a sparse file into
//!   /dev/null; the sender's own MiB/s (its report's bytes over its seconds).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tcpkit_lab::{Host, Lab, MULTIPATH_B4};

use super::{median, random_file, sha256, shaped, wait_listening};
use crate::ab::{Build, Builds};

const PORT: u16 = 5301;
/// When the link goes dead, from the sender's start, and what the 3 live links carry.
const DEAD_AT: f64 = 2.0;
const LIVE_MBS: f64 = 3.0 * 200.0 / 8.0;

fn build_name(b: Build) -> &'static str {
    match b {
        Build::New => "this build",
        Build::Old => "old build",
    }
}

/// One transfer through a link going dead: MB/s in order in each second, and the total time.
struct Dead {
    per_second: Vec<f64>,
    secs: f64,
}

impl Dead {
    /// Whole seconds after the drop (the last, partial one left out) under a tenth of the
    /// live links' capacity.
    fn starved(&self) -> usize {
        self.per_second
            .iter()
            .skip(DEAD_AT as usize)
            .take(self.per_second.len().saturating_sub(DEAD_AT as usize + 1))
            .filter(|r| **r < LIVE_MBS / 10.0)
            .count()
    }
}

/// One transfer from `a` to `b` with `tk`, the link whose ends are `dead` (`a`'s, `b`'s
/// interface) dropped [`DEAD_AT`] s in.
fn dead_once(lab: &mut Lab, (a, b): (&Host, &Host), dead: (&str, &str), tk: &str) -> Result<Dead> {
    let dir = lab.dir().to_path_buf();
    let (input, out) = (dir.join("dead-in.bin"), dir.join("dead-out.bin"));
    let (inp, o) = (
        input.to_str().context("path")?,
        out.to_str().context("path")?,
    );
    let p = PORT.to_string();
    let rx = b.spawn(
        lab,
        "rx",
        &[tk, "mpcat", "-l", "-p", &p, "-o", o, "--quiet"],
    )?;
    wait_listening(b, PORT, &rx)?;
    let t0 = Instant::now();
    let tx = a.spawn(
        lab,
        "tx",
        &[tk, "mpcat", "-i", inp, "--quiet", MULTIPATH_B4, &p],
    )?;
    let mut samples = vec![(0.0, 0u64)];
    let mut dropped = false;
    let limit = Duration::from_secs(120);
    while rx.try_status()?.is_none() {
        if t0.elapsed() > limit {
            let _ = tx.stop();
            let _ = rx.stop();
            bail!("not done after {limit:?}:\n{}", tx.log());
        }
        let t = t0.elapsed().as_secs_f64();
        if !dropped && t >= DEAD_AT {
            b.drop_arriving(dead.1)?;
            a.drop_arriving(dead.0)?;
            dropped = true;
        }
        samples.push((t, std::fs::metadata(&out).map_or(0, |m| m.len())));
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = t0.elapsed().as_secs_f64();
    samples.push((secs, std::fs::metadata(&out).map_or(0, |m| m.len())));
    for (p, what) in [(&rx, "receiver"), (&tx, "sender")] {
        match p.wait_timeout(Duration::from_secs(30))? {
            Some(st) if st.success() => {}
            st => bail!("the {what} ended {st:?}:\n{}", p.log()),
        }
    }
    a.stop_dropping(dead.0)?;
    b.stop_dropping(dead.1)?;
    if sha256(&out)? != sha256(&input)? {
        bail!("the output differs from the input");
    }
    std::fs::remove_file(&out)?;
    // Bytes in order at each whole second, from the samples around it.
    let at = |s: f64| -> f64 {
        let i = samples
            .partition_point(|(t, _)| *t < s)
            .min(samples.len() - 1);
        samples[i].1 as f64
    };
    let per_second = (0..secs.ceil() as usize)
        .map(|k| (at(k as f64 + 1.0) - at(k as f64)) / 1e6)
        .collect();
    Ok(Dead { per_second, secs })
}

/// The dead-link section: `runs` transfers of `size` bytes per build, interleaved.
pub(super) fn dead_link(builds: &Builds, size: u64, runs: usize) -> Result<String> {
    eprintln!("4 links x 200 Mbit/s, one dead {DEAD_AT} s in ...");
    let (mut lab, a, b, links) = Lab::multipath("bmpd", 4, Some(shaped(200)))?;
    let dead = (links[1].a.name.as_str(), links[1].b.name.as_str());
    random_file(&lab.dir().join("dead-in.bin"), size)?;
    let mut t = format!(
        "\n**A link going dead: 4 links × 200 Mbit/s (tbf), {:.0} MB, its second link dropped both ways (nftables) {DEAD_AT:.0} s in and never back; the 3 live links carry {LIVE_MBS:.0} MB/s**\n\n\
         MB/s written in order by the receiver in each second of the transfer (the output's growth, sampled every 50 ms).\n\n\
         | build | run | seconds | MB/s in each second | seconds after the drop under {:.1} MB/s |\n|---|---:|---:|---|---:|\n",
        size as f64 / 1e6,
        LIVE_MBS / 10.0
    );
    let mut starved: Vec<(Build, usize)> = Vec::new();
    for r in 0..runs {
        for build in builds.order(r) {
            let tk = builds.bin(build).to_str().context("path")?;
            eprintln!("  run {} of {runs}: {} ...", r + 1, build_name(build));
            let d = dead_once(&mut lab, (&a, &b), dead, tk)
                .with_context(|| format!("dead link, {}", build_name(build)))?;
            let each: Vec<String> = d.per_second.iter().map(|x| format!("{x:.0}")).collect();
            eprintln!("    {:.2} s: {}", d.secs, each.join(" "));
            let _ = writeln!(
                t,
                "| {} | {} | {:.2} | {} | {} |",
                build_name(build),
                r + 1,
                d.secs,
                each.join(" "),
                d.starved()
            );
            starved.push((build, d.starved()));
        }
    }
    let worst = starved
        .iter()
        .filter(|(b, _)| *b == Build::New)
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        t,
        "\n| target | measured | |\n|---|---|---|\n| no whole second after the drop under a tenth of the live links' capacity | at most {worst} in a run | {} |",
        super::met(worst == 0)
    );
    drop(links);
    lab.close()?;
    Ok(t)
}

/// The sender's MiB/s of one `--rate-limit RATE` run over loopback in `h`.
fn paced_once(lab: &mut Lab, h: &Host, tk: &str, rate_mib: u64, chunk: &[&str]) -> Result<f64> {
    let dir = lab.dir().to_path_buf();
    let input = dir.join(format!("rate-{rate_mib}.bin"));
    // Sparse: 3 s of the rate, read from the page cache's zero page.
    std::fs::File::create(&input)?.set_len((rate_mib * 3) << 20)?;
    let p = (PORT + 1).to_string();
    let rx = h.spawn(
        lab,
        "rx",
        &[tk, "mpcat", "-l", "-p", &p, "-o", "/dev/null", "--quiet"],
    )?;
    wait_listening(h, PORT + 1, &rx)?;
    let rate = format!("{rate_mib}M");
    let inp = input.to_str().context("path")?;
    let mut argv = vec![tk, "mpcat", "-i", inp, "--json", "--rate-limit", &rate];
    argv.extend_from_slice(chunk);
    argv.extend_from_slice(&["127.0.0.1", &p]);
    let tx = h.spawn(lab, "tx", &argv)?;
    for (p, what) in [(&tx, "sender"), (&rx, "receiver")] {
        match p.wait_timeout(Duration::from_secs(60))? {
            Some(st) if st.success() => {}
            st => bail!("the {what} ended {st:?}:\n{}", p.log()),
        }
    }
    std::fs::remove_file(&input)?;
    let log = tx.log();
    let (start, end) = (
        log.find("{\n").context("no JSON from the sender")?,
        log.rfind("\n}").context("no JSON end")? + 2,
    );
    let v: Value = serde_json::from_str(&log[start..end])?;
    let bps = v["bytes_per_second"]
        .as_f64()
        .context("no bytes_per_second")?;
    Ok(bps / 1048576.0)
}

/// The rate-limit section: each rate and chunk size `runs` times per build, interleaved.
pub(super) fn rate_limit(builds: &Builds, runs: usize) -> Result<String> {
    eprintln!("--rate-limit accuracy over loopback ...");
    let mut lab = Lab::new("bmpr")?;
    let h = lab.host("a")?;
    let mut t = format!(
        "\n**`--rate-limit` accuracy: loopback, 3 s of the rate from a sparse file into /dev/null, {runs} runs each**\n\n\
         MiB/s = the sender's report: bytes over its seconds (connecting and the receiver's verdict included).\n\n\
         | --rate-limit | chunk | build | MiB/s each run | median | off by |\n|---|---|---|---|---:|---:|\n"
    );
    let mut worst: f64 = 0.0;
    for rate in [40u64, 60, 100] {
        for chunk in [&[][..], &["--chunk", "1M"][..]] {
            let mut got: Vec<(Build, f64)> = Vec::new();
            for r in 0..runs {
                for build in builds.order(r) {
                    let tk = builds.bin(build).to_str().context("path")?;
                    let x = paced_once(&mut lab, &h, tk, rate, chunk).with_context(|| {
                        format!("--rate-limit {rate}M {chunk:?}, {}", build_name(build))
                    })?;
                    eprintln!(
                        "  --rate-limit {rate}M {chunk:?} {}: {x:.2} MiB/s",
                        build_name(build)
                    );
                    got.push((build, x));
                }
            }
            for build in [Build::New, Build::Old] {
                let v: Vec<f64> = got
                    .iter()
                    .filter(|(b, _)| *b == build)
                    .map(|(_, x)| *x)
                    .collect();
                if v.is_empty() {
                    continue;
                }
                let off = (median(&v) / rate as f64 - 1.0) * 100.0;
                if build == Build::New {
                    for x in &v {
                        worst = worst.max((x / rate as f64 - 1.0).abs() * 100.0);
                    }
                }
                let each: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
                let _ = writeln!(
                    t,
                    "| {rate}M | {} | {} | {} | {:.2} | {off:+.1} % |",
                    if chunk.is_empty() {
                        "default (64K-1M)"
                    } else {
                        "1M"
                    },
                    build_name(build),
                    each.join(" "),
                    median(&v)
                );
            }
        }
    }
    let _ = writeln!(
        t,
        "\n| target | measured | |\n|---|---|---|\n| every run within 2 % of --rate-limit, any chunk size | worst {worst:.2} % | {} |",
        super::met(worst <= 2.0)
    );
    drop(h);
    lab.close()?;
    Ok(t)
}
