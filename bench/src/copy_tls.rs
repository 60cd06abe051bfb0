//! `tcpkit-bench copy`'s TLS rows (issue 27), in the copy lab: nginx over TLS as production
//! (online, port 8443) and as the target, HTTPS clients (`tcpkit load https://...`, open loop)
//! at 1k and 5k requests/s keep-alive and with a new connection per request; the copy takes
//! the plaintext from the clients' key log (`--tls-keylog`: load writes it through
//! SSLKEYLOGFILE, as curl and browsers do; wrk cannot write one) or from the secrets probes on
//! production nginx's libssl read at each handshake (`--tls-uprobe`, the capture decrypted
//! with them), and re-encrypts it toward the target (`--target-tls`).
//!
//! Per row: request loss (the target's access log against production's), the copy's CPU per
//! request it copied, and production nginx's own CPU per request and the clients' p50/p99
//! with no copy running and copying. With the probes, the copying run sits between two runs
//! without them, so the difference can be told from the drift of the machine.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tcpkit_lab::{Lab, Proc, TestCa};

use crate::copy::{
    copy_report_kept, failed_causes, load_to, log_lines, nginx, spawn_copy, threads_on_cpu, usage,
    Env, Finished, Load, COPY_TAIL_S, ONLINE, RUN_S, TARGET,
};

/// Where the copy's plaintext comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Keylog,
    Uprobe,
    /// Production in clear (the clear rows' nginx), copied to the TLS target: what
    /// `--target-tls` costs the copy.
    Clear,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Keylog => "key log",
            Source::Uprobe => "uprobe secrets",
            Source::Clear => "clear TCP",
        }
    }

    /// Production's port.
    fn port(self) -> u16 {
        if self == Source::Clear {
            8080
        } else {
            8443
        }
    }

    /// The flags of tcpkit copy this source needs (a build without them gets its rows said,
    /// not run).
    fn flags(self) -> &'static [&'static str] {
        match self {
            Source::Keylog => &["--tls-keylog", "--target-tls", "--tls-ca"],
            Source::Uprobe => &["--tls-uprobe", "--pid", "--target-tls", "--tls-ca"],
            Source::Clear => &["--target-tls", "--tls-ca"],
        }
    }
}

/// What the rows share: both TLS nginx, the CA the copy trusts the target with.
struct TlsEnv<'a> {
    env: &'a Env,
    ca: PathBuf,
    on_log: PathBuf,
    tg_log: PathBuf,
    /// Production nginx over TLS (its master; the worker is its child).
    online: Proc,
    /// The clear rows' production nginx (its master).
    clear_pid: u32,
    dir: PathBuf,
}

impl TlsEnv<'_> {
    /// Production for `source`: its nginx's master and access log.
    fn prod(&self, source: Source) -> (u32, &Path) {
        match source {
            Source::Clear => (self.clear_pid, &self.env.on_log),
            _ => (self.online.pid(), &self.on_log),
        }
    }
}

/// One row: a source, a kind of traffic, a rate.
struct TlsRow {
    source: Source,
    new_conn: bool,
    rate: u32,
    online: u64,
    target: u64,
    copy_cpu_pct: f64,
    copy_per_req_us: Option<f64>,
    /// The copy's TLS counts worth a look (sessions not decrypted, handshakes failed) and
    /// its failed copies by cause.
    note: String,
    /// Production nginx's CPU per request (µs): without the copy (one run, or the two around
    /// the copying run with the probes), and copying.
    server_per_req_us: (Vec<f64>, Option<f64>),
    /// The clients' view: without the copy, and copying.
    clients: (Vec<Load>, Load),
    error: Option<String>,
}

/// The processes of nginx `master` (the master and its workers).
fn nginx_pids(master: u32) -> Vec<u32> {
    let kids = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
        .unwrap_or_default();
    std::iter::once(master)
        .chain(kids.split_whitespace().filter_map(|p| p.parse().ok()))
        .collect()
}

/// CPU seconds nginx `master` and its workers have used so far (the scheduler's count).
fn nginx_cpu(master: u32) -> f64 {
    nginx_pids(master).into_iter().map(threads_on_cpu).sum()
}

/// The libssl production nginx has mapped (what the probes go on), and its worker's pid.
fn libssl_of(master: u32) -> Result<(String, u32)> {
    let pids = nginx_pids(master);
    let worker = *pids.get(1).context("nginx has no worker process")?;
    let maps = std::fs::read_to_string(format!("/proc/{worker}/maps"))?;
    let lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libssl.so"))
        .context("nginx's worker maps no libssl")?;
    Ok((lib.to_string(), worker))
}

/// A load run against production (HTTPS, or clear HTTP for [`Source::Clear`]), its figures
/// and nginx's CPU per request it served.
fn prod_load(
    t: &TlsEnv,
    source: Source,
    rate: u32,
    new_conn: bool,
    keylog: Option<&Path>,
) -> Result<(Load, f64)> {
    let (pid, log) = t.prod(source);
    let ca = t.ca.to_str().unwrap_or_default();
    let (c0, n0) = (nginx_cpu(pid), log_lines(log));
    let l = match source {
        Source::Clear => load_to(t.env, &format!("{ONLINE}:8080"), rate, new_conn, &[], None)?,
        _ => {
            let url = format!("https://{ONLINE}:8443/index.html");
            load_to(t.env, &url, rate, new_conn, &["--tls-ca", ca], keylog)?
        }
    };
    // nginx flushes its access log every 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    let (c1, n1) = (nginx_cpu(pid), log_lines(log));
    Ok((l, (c1 - c0) * 1e6 / (n1 - n0).max(1) as f64))
}

/// The copy of production to the target's 8443, from `source`, for RUN_S + the tail.
fn start_copy(t: &TlsEnv, source: Source, keylog: &Path) -> Result<Child> {
    let rule = format!("{ONLINE}:{}-{TARGET}:8443", source.port());
    // The probes' copy is stopped by a signal once the load and the tail are over: attaching
    // them takes a while, which must not come out of the copy's time.
    let d = match source {
        Source::Uprobe => RUN_S + COPY_TAIL_S + PROBE_ATTACH_S,
        _ => RUN_S + COPY_TAIL_S,
    }
    .to_string();
    let tk = t.env.tcpkit.to_str().unwrap_or_default();
    let ca = t.ca.to_str().unwrap_or_default();
    let mut argv = vec![
        tk.to_string(),
        "copy".into(),
        "-x".into(),
        rule,
        "--duration".into(),
        d,
        "--json".into(),
        "--target-tls".into(),
        "--tls-ca".into(),
        ca.into(),
    ];
    match source {
        Source::Clear => argv.extend(["-i".into(), t.env.cap_if.clone()]),
        Source::Keylog => {
            // Made empty now: the copy reads it as the clients write it.
            std::fs::write(keylog, "")?;
            argv.extend([
                "-i".into(),
                t.env.cap_if.clone(),
                "--tls-keylog".into(),
                keylog.display().to_string(),
            ]);
        }
        Source::Uprobe => {
            // The worker alone: the target's nginx maps the same libssl. The secrets mode:
            // the handshakes' secrets from the probes, the sessions from the capture.
            let (lib, worker) = libssl_of(t.online.pid())?;
            argv.extend([
                "-i".into(),
                t.env.cap_if.clone(),
                "--tls-uprobe".into(),
                lib,
                "--pid".into(),
                worker.to_string(),
            ]);
        }
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    if source != Source::Uprobe {
        // The capture is in place well within this.
        return spawn_copy(t.env, &argv, Duration::from_millis(600));
    }
    let child = spawn_copy(t.env, &argv, Duration::ZERO)?;
    wait_attached(child.id())?;
    // The capture opens once the probes are attached: in place well within this.
    std::thread::sleep(Duration::from_millis(600));
    Ok(child)
}

/// How long the probes may take to attach.
const PROBE_ATTACH_S: f64 = 20.0;

/// The BPF links process `pid` holds.
fn bpf_links(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy() == "anon_inode:bpf_link")
                .count()
        })
        .unwrap_or(0)
}

/// Waits until copy `pid` holds its probes' links (some, and no more coming for 300 ms):
/// connections production opens before then are joined mid-stream, or missed.
fn wait_attached(pid: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs_f64(PROBE_ATTACH_S);
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let n = bpf_links(pid);
        if n != last {
            (last, since) = (n, Instant::now());
        } else if n > 0 && since.elapsed() >= Duration::from_millis(300) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("copy {pid} attached no probes within {PROBE_ATTACH_S} s ({n} links)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The copy report's TLS figures worth a row's note: sessions not decrypted, handshakes with
/// the target that failed, records the probes lost.
fn tls_note(r: &serde_json::Value) -> String {
    let t = &r["tls"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let mut v = Vec::new();
    let s = &t["sessions"];
    for k in ["no_secret", "not_tls", "failed"] {
        if n(&s[k]) > 0 {
            v.push(format!("{k} {}", n(&s[k])));
        }
    }
    if let Some(m) = s["unsupported"].as_object() {
        v.extend(m.iter().map(|(k, c)| format!("unsupported {k} {}", n(c))));
    }
    if n(&t["target"]["failed"]) > 0 {
        v.push(format!(
            "target handshakes failed {}",
            t["target"]["failures"]
        ));
    }
    let q = &r["requests"];
    if n(&q["answered"]) < n(&q["at_source"]) {
        v.push(format!(
            "copy: {} of {} request turns answered",
            n(&q["answered"]),
            n(&q["at_source"])
        ));
    }
    if n(&r["sessions"]["open_at_end"]) > 0 {
        v.push(format!("open at end {}", n(&r["sessions"]["open_at_end"])));
    }
    let p = &t["uprobe"];
    if p.is_object() {
        // The probes' own account: the handshakes they read (secrets mode: one record each).
        v.push(format!(
            "probes: {} sessions decrypted, {} handshake records ({} lost, {} unusable)",
            n(&s["decrypted"]),
            n(&p["records"]),
            n(&p["lost_records"]),
            n(&p["unmatched"])
        ));
    }
    v.join(", ")
}

/// One row: production without the copy, then copying (then, with the probes, without again).
fn row(t: &TlsEnv, source: Source, new_conn: bool, rate: u32) -> Result<TlsRow> {
    let tag = format!(
        "{:?}-{}-{rate}",
        source,
        if new_conn { "new" } else { "ka" }
    );
    let keylog = t.dir.join(format!("keys-{tag}.log"));
    let (base, base_cpu) = prod_load(t, source, rate, new_conn, None)?;
    std::thread::sleep(Duration::from_millis(300));
    let (_, prod_log) = t.prod(source);
    let (on0, tg0) = (log_lines(prod_log), log_lines(&t.tg_log));
    let copy = start_copy(t, source, &keylog)?;
    let pid = copy.id();
    let (cpu0, _) = usage(pid);
    let life0 = threads_on_cpu(pid);
    let started = Instant::now();
    let kl = (source == Source::Keylog).then_some(keylog.as_path());
    let (with, with_cpu) = prod_load(t, source, rate, new_conn, kl)?;
    let (cpu1, _) = usage(pid);
    let secs = started.elapsed().as_secs_f64();
    if source == Source::Uprobe {
        std::thread::sleep(Duration::from_secs_f64(COPY_TAIL_S));
        // SAFETY: kill(2) on the copy this row started and has not reaped.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    }
    let Finished {
        report,
        error,
        cpu_s,
    } = copy_report_kept(copy)?;
    std::thread::sleep(Duration::from_millis(300));
    let (online, target) = (log_lines(prod_log) - on0, log_lines(&t.tg_log) - tg0);
    let mut bases = vec![base];
    let mut base_cpus = vec![base_cpu];
    if source == Source::Uprobe {
        let (b, c) = prod_load(t, source, rate, new_conn, None)?;
        bases.push(b);
        base_cpus.push(c);
    }
    let _ = std::fs::remove_file(&keylog);
    let copied = report["requests"]["copied"].as_u64().unwrap_or(0);
    let note = [tls_note(&report), failed_causes(&report)]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Ok(TlsRow {
        source,
        new_conn,
        rate,
        online,
        target,
        copy_cpu_pct: (cpu1 - cpu0) * 100.0 / secs,
        copy_per_req_us: (copied > 0).then(|| (cpu_s - life0) * 1e6 / copied as f64),
        note,
        server_per_req_us: (base_cpus, Some(with_cpu)),
        clients: (bases, with),
        error,
    })
}

/// The TLS rows with this build's copy, in `lab` (the clear rows' lab: clients → online →
/// target): their table, and the rows that failed, each said (`failed`).
/// `clear_pid`: the clear rows' production nginx.
pub(crate) fn rows(
    env: &Env,
    lab: &mut Lab,
    clear_pid: u32,
    failed: &mut Vec<String>,
) -> Result<String> {
    let dir = lab.dir().join("tls");
    let ca = TestCa::new(&dir.join("ca"), "bench CA")?;
    let on_cert = ca.server("online", &[ONLINE])?;
    let tg_cert = ca.server("target", &[TARGET])?;
    let (online, on_log) = nginx(lab, &env.onl, ONLINE, "online-tls", Some(&on_cert))?;
    let (_tg, tg_log) = nginx(lab, &env.tgt, TARGET, "target-tls", Some(&tg_cert))?;
    for h in [&env.cli, &env.onl] {
        // A new TLS connection per request for seconds: the clients' TIME_WAIT ports.
        h.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
    }
    let t = TlsEnv {
        env,
        ca: ca.cert(),
        on_log,
        tg_log,
        online,
        clear_pid,
        dir,
    };
    let mut rows = Vec::new();
    let mut lacking = Vec::new();
    for source in [Source::Keylog, Source::Uprobe, Source::Clear] {
        let lacks = crate::missing_flags(&env.tcpkit, "copy", source.flags())?;
        if !lacks.is_empty() {
            let why = format!(
                "{} rows: not in this build's copy: {}",
                source.name(),
                lacks.join(" ")
            );
            eprintln!("  {why}");
            lacking.push(why);
            continue;
        }
        for new_conn in [false, true] {
            for rate in [1000, 5000] {
                let what = format!(
                    "TLS from the {}, {}, {rate} req/s",
                    source.name(),
                    traffic(new_conn)
                );
                eprintln!("{what} ...");
                match row(&t, source, new_conn, rate) {
                    Ok(r) => {
                        if let Some(e) = &r.error {
                            eprintln!("  FAILED: {what}: {e}");
                            failed.push(format!("{what}: {e}"));
                        }
                        rows.push(r);
                    }
                    Err(e) => {
                        eprintln!("  FAILED: {what}: {e:#}");
                        failed.push(format!("{what}: {e:#}"));
                    }
                }
            }
        }
    }
    if rows.is_empty() && lacking.len() == 3 {
        bail!("no TLS row can run: {}", lacking.join("; "));
    }
    Ok(table(&rows, &lacking))
}

fn traffic(new_conn: bool) -> &'static str {
    if new_conn {
        "new connection per request"
    } else {
        "keep-alive"
    }
}

/// What the results file says of the TLS table.
pub(crate) const NOTE: &str = "\nTLS rows (issue 27): nginx over TLS (1 worker, TLS 1.2 and 1.3, \
ECDSA P-256 certificates of a CA made for the run) as production on online:8443 and as the \
target on target:8443 (the clear TCP rows: the clear rows' production nginx on online:8080, \
copied with `-i <clients' link> --target-tls` to the same TLS target: what re-encrypting \
costs the copy); the clients are `tcpkit load https://online:8443/index.html --tls-ca` \
(open loop; a new connection per request is a full handshake each, no resumption), which \
writes the key log through SSLKEYLOGFILE for the key-log rows. The copy: `tcpkit copy -x \
online:8443-target:8443 --target-tls --tls-ca CA` with `-i <clients' link> --tls-keylog FILE` \
(read as it grows) or `-i <clients' link> --tls-uprobe <nginx's libssl> --pid <nginx's \
worker>` (the secrets mode: a uprobe and uretprobe on SSL_do_handshake read each handshake's \
secrets, the capture is decrypted with them; no probe on SSL_read/SSL_write; the load starts \
once the copy holds its probes' links and its capture is open, and the copy is stopped by \
SIGINT 2 s after the load). Request loss: \
the two access logs. Copy CPU per request: as the clear rows'. nginx CPU per request: the \
scheduler's count of nginx's processes over the requests its access log gained, in the run \
without the copy (with the probes: the runs before and after) and in the run copying. \
Clients' view: load's p50 / p99 from the intended send time.\n";

/// The TLS table; `lacking`: the rows this build could not run, said below it.
fn table(rows: &[TlsRow], lacking: &[String]) -> String {
    let mut t = String::new();
    t.push_str("| plaintext from | traffic | rate | requests online | at target | request loss | copy CPU (% of a core; per request) | nginx CPU per request: no copy | copying | clients' p50 / p99: no copy | copying | notes |\n");
    t.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let lat = |l: &Load| {
        if l.p50_us == 0.0 {
            "—".to_string()
        } else {
            format!("{:.0} / {:.0} µs", l.p50_us, l.p99_us)
        }
    };
    for r in rows {
        let loss = if r.online == 0 {
            0.0
        } else {
            r.online.saturating_sub(r.target) as f64 * 100.0 / r.online as f64
        };
        let (base_cpu, with_cpu) = &r.server_per_req_us;
        let base_mean = base_cpu.iter().sum::<f64>() / base_cpu.len().max(1) as f64;
        let with_cell = with_cpu.map_or("—".to_string(), |w| {
            format!("{w:.0} µs ({:+.1} %)", (w / base_mean - 1.0) * 100.0)
        });
        let notes: Vec<String> = [
            r.note.clone(),
            r.error
                .clone()
                .map(|e| format!("failed: {e}"))
                .unwrap_or_default(),
        ]
        .into_iter()
        .chain(
            r.clients
                .0
                .iter()
                .chain([&r.clients.1])
                .map(|l| l.note.clone()),
        )
        .filter(|s| !s.is_empty())
        .collect();
        t.push_str(&format!(
            "| {} | {} | {}k req/s | {} | {} | {:.4} % | {:.1} %{} | {} | {} | {} | {} | {} |\n",
            r.source.name(),
            traffic(r.new_conn),
            r.rate / 1000,
            r.online,
            r.target,
            loss,
            r.copy_cpu_pct,
            r.copy_per_req_us
                .map_or(String::new(), |u| format!("; {u:.0} µs")),
            base_cpu
                .iter()
                .map(|c| format!("{c:.0} µs"))
                .collect::<Vec<_>>()
                .join(", "),
            with_cell,
            r.clients.0.iter().map(lat).collect::<Vec<_>>().join(", "),
            lat(&r.clients.1),
            notes.join("; ").replace('\n', " ").replace('|', "/"),
        ));
    }
    for l in lacking {
        t.push_str(&format!("\n{l}\n"));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_has_every_cell_and_the_probes_overhead() {
        let l = |p50, p99| Load {
            p50_us: p50,
            p99_us: p99,
            note: String::new(),
        };
        let r = TlsRow {
            source: Source::Uprobe,
            new_conn: false,
            rate: 5000,
            online: 25_000,
            target: 25_000,
            copy_cpu_pct: 12.5,
            copy_per_req_us: Some(20.0),
            note: String::new(),
            server_per_req_us: (vec![40.0, 42.0], Some(43.05)),
            clients: (vec![l(100.0, 900.0), l(110.0, 950.0)], l(105.0, 930.0)),
            error: None,
        };
        let t = table(
            &[r],
            &["key log rows: not in this build's copy: --tls-keylog".into()],
        );
        let lines: Vec<&str> = t.lines().collect();
        let cells = |l: &str| l.matches(" | ").count();
        assert_eq!(cells(lines[2]), cells(lines[0]), "{t}");
        assert_eq!(
            lines[2],
            "| uprobe secrets | keep-alive | 5k req/s | 25000 | 25000 | 0.0000 % | 12.5 %; 20 µs | 40 µs, 42 µs | 43 µs (+5.0 %) | 100 / 900 µs, 110 / 950 µs | 105 / 930 µs |  |"
        );
        assert!(
            t.ends_with("\nkey log rows: not in this build's copy: --tls-keylog\n"),
            "{t}"
        );
    }
}
