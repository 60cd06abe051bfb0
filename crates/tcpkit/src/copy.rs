//! `tcpkit copy`: what the user typed (clap), then the resolved `tcpkit_copy::relay`
//! configuration and how the run is shown (live line, `--stats`, summary or `--json`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tcpkit_copy::config::{CopyConfig, CopyCounters};
use tcpkit_copy::diff::{self, DiffConfig, DiffMode};
use tcpkit_copy::feed::Input;
use tcpkit_copy::metrics;
use tcpkit_copy::relay;
use tcpkit_copy::sample::Sampler;
use tcpkit_copy::transfer;
use tcpkit_copy::transparent::{self, Cidr, TransparentConfig};
use tcpkit_stats::{Monitor, MonitorOptions};

use crate::common::{self, duration_arg, size_arg, OutputFlags, RunFlags};
use crate::Failure;

/// Copy live TCP sessions (or those of a capture file) to a test server, in relay mode: each
/// client session's bytes are reassembled from a passive capture and replayed over an ordinary
/// connection from this host to the target, paced like the client (next request after the
/// target's answer, with the client's think time). Nothing is sent toward a client.
/// Runs until SIGINT/SIGTERM, --duration, or the end of --input; then prints its report.
/// After a signal or --duration the copies still running get at most 1 s to finish (the rest
/// count as open at the end); after the end of --input each gets its --timeout. A second
/// signal exits at once.
#[derive(Debug, Parser)]
pub struct Args {
    /// Copy rules `[srcIP:]port-targetIP:port`, comma-separated or repeated: sessions to
    /// server `port` (on `srcIP` only, when given) are replayed to `targetIP:port`.
    #[arg(short = 'x', long = "copy", value_name = "RULES", required = true)]
    pub rules: Vec<String>,

    /// A tcpdump filter expression the live capture must also match (tcpcopy's -F), e.g.
    /// 'net 10.1.0.0/16': only what it lets through is copied. Name both directions of a
    /// session ('host', 'net', not 'src host'): the server's answers pace the copy. Live
    /// capture only (filter a file first: tcpdump -r IN -w OUT EXPR).
    #[arg(
        short = 'F',
        long = "filter",
        value_name = "EXPR",
        conflicts_with = "input"
    )]
    pub filter: Option<String>,

    /// The run fails (exit status 1, the reason as the last line) when more than PCT percent
    /// of the requests seen go unanswered (tcpcopy's request loss ratio, which counts the
    /// requests of failed copies and those cut at the end), or when the target answered
    /// none of them.
    #[arg(long, value_name = "PCT", default_value_t = 1.0)]
    pub max_loss: f64,

    /// Interface to capture on (live mode); "any" for all.
    #[arg(
        short = 'i',
        long = "capture",
        value_name = "IFACE",
        default_value = "any"
    )]
    pub capture: String,

    /// Copy the sessions of a pcap or pcapng file instead of a live capture.
    #[arg(long, value_name = "FILE", conflicts_with = "capture")]
    pub input: Option<PathBuf>,

    /// With --input: play the file F times as fast as it was captured (think times too).
    #[arg(long, value_name = "F", default_value_t = 1.0, requires = "input")]
    pub speed: f64,

    /// With --input: cap every gap between packets at DURATION (2, 2s, 500ms).
    #[arg(long, value_name = "DURATION", requires = "input", value_parser = duration_arg)]
    pub max_idle: Option<Duration>,

    /// With --input: play the file N times (each time as new sessions).
    #[arg(
        long = "loop",
        value_name = "N",
        default_value_t = 1,
        requires = "input"
    )]
    pub loops: u32,

    /// Copy each session N times, as N independent connections.
    #[arg(short = 'n', value_name = "N", default_value_t = 1)]
    pub copies: u32,

    /// Copy PCT percent of the sessions, chosen by their exact client and server address (a
    /// session is wholly in or out, the same in every run).
    #[arg(short = 'r', value_name = "PCT", default_value_t = 100.0)]
    pub percent: f64,

    /// Ramp the sampling percentage from 0 to -r over DURATION (30, 30s, 1m).
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub ramp: Option<Duration>,

    /// Start each connection to the target with a PROXY protocol v2 header carrying the
    /// original client's and server's addresses.
    #[arg(long)]
    pub proxy_protocol: bool,

    /// Only copy sessions whose SYN was seen (not those open when copying started).
    #[arg(long)]
    pub only_full: bool,

    /// Send each request as captured, without waiting for the target's answer to the previous.
    #[arg(long)]
    pub no_wait: bool,

    /// How far behind its client a session's copy may fall. Each request waits for the
    /// target's answer to the one before plus the client's think time (tcpcopy's pacing);
    /// once that would leave it more than DURATION behind the client's own schedule, it
    /// goes at that bound or as soon as the answer is in, so a slow or distant target costs
    /// at most this much lag (and the backlog it holds) instead of more with every request.
    /// A large value (1h) keeps answer + think throughout.
    // 1 s: a 30-minute soak at 5k requests a second on a busy host (answers a few ms late now
    // and then, each lateness over the 2 ms slack kept for good) ended with every keep-alive
    // copy over 80 s behind and its backlog growing 700 KiB a minute; a second keeps tcpcopy's
    // pacing for a target slower by a little and bounds what a slow or far one costs.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration_arg)]
    pub max_lag: Duration,

    /// How long connecting to the target (waiting behind the shared back-off while it refuses
    /// or answers nothing; a refused connect ends its copy at once) and waiting for an answer
    /// the next request needs may take before the session counts as failed. At the end
    /// of --input the copies still running get this long to finish; after SIGINT/SIGTERM or
    /// --duration at most 1 s (then they count as open at the end); a second signal exits at
    /// once.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_arg)]
    pub timeout: Duration,

    /// Request bytes waiting for the target plus reassembly buffers, at most (65536, 64M,
    /// 1G; default an eighth of RAM). Over it, sessions are shed and counted.
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub max_memory: Option<u64>,

    /// Lower this process's CPU priority by N (0 to keep it), so production goes first.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub nice: i32,

    #[command(flatten)]
    pub run: RunFlags,

    #[command(flatten)]
    pub uprobe: crate::copy_uprobe::UprobeFlags,

    #[command(flatten)]
    pub out: OutputFlags,

    /// Transparent mode (tcpcopy's): the target sees the clients' own addresses (or -c's).
    /// Copy plays the client's TCP through a raw socket; the target's answers are caught by
    /// `tcpkit intercept` (--intercept), on an assistant host the target routes the clients'
    /// addresses to, or on the target itself (intercept --on-target), which returns their
    /// headers, and their bytes too with --diff. Live capture or --input; IPv4 and IPv6.
    #[arg(long, requires = "intercept")]
    pub transparent: bool,

    /// With --transparent: intercept's control address, IP[:PORT]: the assistant's, or the
    /// target's when intercept runs there (port 36524 when none is given; [v6addr]:PORT for
    /// IPv6).
    #[arg(long, value_name = "HOST[:PORT]", requires = "transparent")]
    pub intercept: Option<String>,

    /// With --transparent: the key intercept was started with (its --auth-key-file): this
    /// copy proves it, and checks intercept's proof, before any answer is sent. `--check`
    /// says whether the keys match.
    #[arg(long, value_name = "FILE", requires = "transparent")]
    pub auth_key_file: Option<PathBuf>,

    /// With --transparent: the target sees the client addresses moved into this prefix, their
    /// host bits kept (10.9.0.0/16 turns 198.18.1.7 into 10.9.1.7); route it to the assistant,
    /// or give it to intercept --on-target's --clients.
    #[arg(
        short = 'c',
        long = "client-addr",
        value_name = "CIDR",
        requires = "transparent"
    )]
    pub client_addr: Option<String>,

    /// Compare each request's answer from the target with the original server's (from the
    /// capture) and count equal and different answers. Each next request then waits until
    /// the target's answer looks whole (or 50 ms of silence). Not with --no-wait.
    #[arg(long)]
    pub diff: bool,

    /// What --diff compares: `bytes` (every byte) or `http` (status line, headers as a set,
    /// de-chunked body of HTTP/1.x answers; anything else as bytes).
    #[arg(long, value_name = "MODE", default_value = "bytes", requires = "diff")]
    pub diff_mode: String,

    /// A regular expression for what legitimately differs (repeatable). Bytes mode: every
    /// match is removed from both answers before comparing (^ and $ match at line starts and
    /// ends). http mode: header lines it matches (e.g. '^Date:') are left out of both.
    #[arg(long, value_name = "REGEX", requires = "diff")]
    pub diff_ignore: Vec<String>,

    /// Write the first differences, one JSON object per line with both answers (escaped) and
    /// the session and request ids, to FILE.
    #[arg(long, value_name = "FILE", requires = "diff")]
    pub diff_out: Option<PathBuf>,

    /// With --diff-out: write at most N differences (all are counted).
    #[arg(long, value_name = "N", default_value_t = 100, requires = "diff_out")]
    pub diff_max: u64,

    /// Serve the live counters (sessions, requests, bytes, loss ratio, capture drops,
    /// memory) in Prometheus' text format at http://ADDR/metrics while copying, e.g.
    /// 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,

    /// Verify, without copying, what usually breaks a copy setup with these same flags
    /// (capture permission and interface, each target reachable, with --transparent the
    /// intercept reachable and of the same protocol version, conntrack headroom, the memory
    /// limit, --diff-out, --metrics) and print one OK/FAIL line per check with the
    /// fix. Exit status 0 when all are OK, 1 otherwise.
    #[arg(long)]
    pub check: bool,

    #[command(flatten)]
    pub target_tls: crate::copy_tls::TargetTlsFlags,

    /// Every session of the copy rules is TLS: decrypt it with the secrets in FILE, an NSS
    /// key log (what curl, Firefox and Chrome write when SSLKEYLOGFILE is set, and OpenSSL's
    /// keylog callback), and copy its plaintext requests to the target, whose port then
    /// speaks clear text (or TLS, with --target-tls). TLS 1.3, and TLS 1.2 with ECDHE, AES-GCM or ChaCha20-Poly1305.
    /// The file is read as it grows; live, it need not exist yet (its directory must). A
    /// session whose secret does not come within 3 s, or that cannot be decrypted, is
    /// counted by reason and never copied. E.g. `SSLKEYLOGFILE=/tmp/keys curl ...` beside
    /// `tcpkit copy -i eth0 -x 443-10.0.0.2:8080 --tls-keylog /tmp/keys`.
    /// Not with --tls-uprobe (the probes give the secrets) nor --tls-uprobe-calls (the
    /// plaintext).
    #[arg(long, value_name = "FILE")]
    pub tls_keylog: Option<PathBuf>,
}

/// How the run is shown and bounded, beside what the relay does.
#[derive(Debug)]
pub struct Run {
    pub input: Input,
    pub duration: Option<Duration>,
    pub stats: Option<Duration>,
    pub out: OutputFlags,
    pub nice: i32,
    /// `--metrics`.
    pub metrics: Option<SocketAddr>,
    /// `--check`: verify the setup instead of copying.
    pub check: bool,
    /// `--transparent`: how copies reach the target and its answers come back.
    pub transparent: Option<TransparentConfig>,
    /// `--target-tls`: relay mode's copies speak TLS to the target.
    pub target_tls: Option<relay::TargetTls>,
}

/// `--transparent`, `--intercept`, `-c`: checked against the rest of the flags.
fn resolve_transparent(
    a: &Args,
    rules: &[transfer::Rule],
) -> Result<Option<TransparentConfig>, Failure> {
    if !a.transparent {
        return Ok(None);
    }
    if a.proxy_protocol {
        return Err(usage(
            "--transparent cannot be used with --proxy-protocol (the target sees the client itself)"
                .into(),
        ));
    }
    let text = a.intercept.as_deref().unwrap_or_default();
    let intercept = text
        .parse::<SocketAddr>()
        .or_else(|_| {
            text.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .map(|ip| SocketAddr::new(ip, tcpkit_copy::control::DEFAULT_PORT))
        })
        .map_err(|_| {
            usage(format!(
                "--intercept '{text}': expected an IP address with an optional :PORT"
            ))
        })?;
    let client_cidr = match &a.client_addr {
        Some(t) => {
            let c: Cidr = t.parse().map_err(|e| usage(format!("-c '{t}': {e}")))?;
            if let Some(r) = rules
                .iter()
                .find(|r| r.target.is_ipv4() != c.addr().is_ipv4())
            {
                return Err(usage(format!(
                    "-c '{t}': the target {} is of the other address family",
                    r.target
                )));
            }
            Some(c)
        }
        None => None,
    };
    let key = a
        .auth_key_file
        .as_deref()
        .map(tcpkit_copy::auth::Key::from_file)
        .transpose()
        // A file that cannot be used as given: a usage error, the flag and file named.
        .map_err(|e| usage(crate::chain(&e)))?;
    Ok(Some(TransparentConfig {
        intercept,
        client_cidr,
        port_pool: transparent::DEFAULT_PORT_POOL,
        key,
    }))
}

fn usage(msg: String) -> Failure {
    Failure::Usage(msg)
}

/// Every check that involves more than one flag, or a value's meaning, happens here.
pub fn resolve(a: &Args) -> Result<(CopyConfig, Run), Failure> {
    let rules = transfer::parse_rules(a.rules.iter().map(String::as_str))
        .map_err(|e| usage(format!("-x: {e}")))?;
    if !(1..=1000).contains(&a.copies) {
        return Err(usage(format!("-n {}: must be 1 to 1000", a.copies)));
    }
    if !a.percent.is_finite() || !(0.0..=100.0).contains(&a.percent) {
        return Err(usage(format!(
            "-r {}: must be a percentage from 0 to 100",
            a.percent
        )));
    }
    if !a.max_loss.is_finite() || !(0.0..=100.0).contains(&a.max_loss) {
        return Err(usage(format!(
            "--max-loss {}: must be a percentage from 0 to 100",
            a.max_loss
        )));
    }
    if let Some(f) = &a.filter {
        transfer::check_filter(&rules, f).map_err(|why| usage(format!("-F '{f}': {why}")))?;
    }
    let ramp = a.ramp;
    let timeout = a.timeout;
    if timeout < Duration::from_millis(10) {
        return Err(usage(format!(
            "--timeout {timeout:?}: must be at least 10ms"
        )));
    }
    let max_memory = match a.max_memory {
        Some(b) => {
            if b < 1 << 20 {
                return Err(usage(format!("--max-memory {b}: at least 1M")));
            }
            b
        }
        None => (tcpkit_host::mem_total().unwrap_or(1 << 30) / 8).max(64 << 20),
    };
    if !(0..=19).contains(&a.nice) {
        return Err(usage(format!("--nice {}: must be 0 to 19", a.nice)));
    }
    let input = match &a.input {
        Some(path) => {
            if !a.speed.is_finite() || a.speed <= 0.0 || a.speed > 1e6 {
                return Err(usage(format!(
                    "--speed {}: must be above 0 and at most 1e6",
                    a.speed
                )));
            }
            if a.loops == 0 {
                return Err(usage("--loop 0: play the file at least once".into()));
            }
            Input::File {
                path: path.clone(),
                speed: a.speed,
                max_idle_ns: a.max_idle.map(|d| d.as_nanos() as u64),
                loops: a.loops,
            }
        }
        None => {
            if a.capture.is_empty() || a.capture.len() > 15 {
                return Err(usage(format!(
                    "-i '{}': an interface name has 1 to 15 characters",
                    a.capture
                )));
            }
            Input::Live {
                ifname: a.capture.clone(),
            }
        }
    };
    // --tls-uprobe-calls: the plaintext comes from the probes, not a capture.
    let input = a.uprobe.input()?.unwrap_or(input);
    let tls_secrets = a.uprobe.secrets()?;
    let diff = if a.diff {
        if a.no_wait {
            return Err(usage(
                "--diff with --no-wait: answers are paired with requests by waiting for each"
                    .into(),
            ));
        }
        let mode = match a.diff_mode.as_str() {
            "bytes" => DiffMode::Bytes,
            "http" => DiffMode::Http,
            m => return Err(usage(format!("--diff-mode '{m}': expected bytes or http"))),
        };
        let ignore = a
            .diff_ignore
            .iter()
            .map(|p| {
                diff::ignore_pattern(p).map_err(|e| {
                    let why = e.to_string().replace('\n', " ");
                    usage(format!(
                        "--diff-ignore '{p}': {}",
                        why.split_whitespace().collect::<Vec<_>>().join(" ")
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(DiffConfig {
            mode,
            ignore,
            max_written: a.diff_max,
            out: a.diff_out.clone(),
        })
    } else {
        None
    };
    let cfg = CopyConfig {
        rules,
        copies: a.copies,
        sampler: Sampler {
            percent: a.percent,
            ramp_ns: ramp.map_or(0, |d| d.as_nanos() as u64),
        },
        proxy_protocol: a.proxy_protocol,
        no_wait: a.no_wait,
        only_full: a.only_full,
        max_memory: usize::try_from(max_memory).unwrap_or(usize::MAX),
        timeout_ns: timeout.as_nanos() as u64,
        max_lag_ns: u64::try_from(a.max_lag.as_nanos()).unwrap_or(u64::MAX),
        diff,
        max_loss_percent: a.max_loss,
        filter: a.filter.clone(),
        tls_keylog: a.tls_keylog.clone(),
        tls_secrets,
    };
    let run = Run {
        input,
        duration: a.run.duration,
        stats: a.run.stats.filter(|d| !d.is_zero()),
        out: a.out.clone(),
        nice: a.nice,
        metrics: a
            .metrics
            .as_deref()
            .map(|m| {
                m.parse::<SocketAddr>().map_err(|_| {
                    usage(format!(
                        "--metrics '{m}': expected IP:PORT, e.g. 127.0.0.1:9100 or [::1]:9100"
                    ))
                })
            })
            .transpose()?,
        check: a.check,
        transparent: resolve_transparent(a, &cfg.rules)?,
        target_tls: a.target_tls.resolve(&cfg.rules)?,
    };
    Ok((cfg, run))
}

/// `--check`: one line per check (or a JSON array with --json); exit 1 when one failed.
fn check(cfg: &CopyConfig, run: &Run) -> Result<(), Failure> {
    let checks = tcpkit_copy::check::run(cfg, &run.input, run.metrics, run.transparent.as_ref());
    if run.out.json {
        common::print(&(tcpkit_copy::check::json(&checks) + "\n"));
    } else if !run.out.quiet {
        let text: String = checks.iter().map(|c| c.line() + "\n").collect();
        common::print(&text);
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    if failed == 0 {
        Ok(())
    } else {
        Err(Failure::Runtime(format!(
            "--check: {failed} of {} checks failed",
            checks.len()
        )))
    }
}

/// The files the flags name, tried before the run starts: one that cannot be used as given
/// (missing, unreadable, not a capture, a --diff-out that cannot be created) is a usage
/// error naming the flag and the file, and nothing runs. (`--check` reports them instead.)
fn files_usable(cfg: &CopyConfig, run: &Run) -> Result<(), Failure> {
    run.input
        .file_usable()
        .map_err(|e| usage(format!("--input {}", crate::chain(&e))))?;
    if let Some(k) = &cfg.tls_keylog {
        keylog_usable(k, matches!(run.input, Input::File { .. }))?;
    }
    if let Some(out) = cfg.diff.as_ref().and_then(|d| d.out.as_ref()) {
        std::fs::File::create(out).map_err(|e| {
            usage(format!(
                "--diff-out {}: cannot create: {}",
                out.display(),
                crate::chain(&e)
            ))
        })?;
    }
    Ok(())
}

/// `--tls-keylog FILE`: readable when it exists. Live, a file not there yet is read once
/// it appears (the client that writes it may start after copy, as with Wireshark), but its
/// directory must exist; with --input the secrets are wanted now, so the file must exist.
fn keylog_usable(k: &std::path::Path, offline: bool) -> Result<(), Failure> {
    let bad = |what: String| usage(format!("--tls-keylog {}: {what}", k.display()));
    match std::fs::File::open(k) {
        Ok(f) => match f.metadata() {
            Ok(m) if m.is_dir() => Err(bad("is a directory".into())),
            _ => Ok(()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !offline => {
            let dir = match k.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            if dir.is_dir() {
                Ok(())
            } else {
                Err(bad(format!("no such directory {}", dir.display())))
            }
        }
        Err(e) => Err(bad(format!("cannot open: {}", crate::chain(&e)))),
    }
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    let (cfg, run) = resolve(&args)?;
    if run.check {
        return check(&cfg, &run);
    }
    files_usable(&cfg, &run)?;
    let live = Arc::new(CopyCounters::default());
    // Serves until this function returns, so the final counters can still be scraped.
    let _metrics = run
        .metrics
        .map(|addr| {
            let info = metrics::Info {
                limit_bytes: cfg.max_memory as u64,
                diff: cfg.diff.is_some(),
            };
            metrics::start(addr, Arc::clone(&live), info)
                .map_err(|e| Failure::Runtime(format!("--metrics {addr}: {e}")))
        })
        .transpose()?;
    if run
        .target_tls
        .as_ref()
        .is_some_and(relay::TargetTls::insecure)
    {
        eprintln!("tcpkit copy: --insecure: no TLS certificate of the target is checked; the target is whoever answers (use --tls-ca FILE to check a lab certificate)");
    }
    let nice = tcpkit_host::lower_priority(run.nice);
    let mut monitor = {
        let live = Arc::clone(&live);
        Monitor::start(
            MonitorOptions {
                stats_every: run.stats,
                progress: run.out.progress(),
            },
            move |_| live.line(),
        )
    };
    // A target going down or coming back, said as it happens (not under -q).
    let quiet = run.out.quiet;
    let say = move |m: &str| {
        if !quiet {
            eprintln!("tcpkit copy: {m}");
        }
    };
    let result = match &run.transparent {
        Some(t) => transparent::run(&cfg, t, &run.input, run.duration, interrupt, &live, &say)
            .map_err(|e| Failure::Runtime(crate::chain(&e))),
        None => relay::run(
            &cfg,
            run.target_tls.clone(),
            &run.input,
            run.duration,
            interrupt,
            &live,
            &say,
        )
        .map_err(|e| Failure::Runtime(crate::chain(&e))),
    };
    monitor.stop();
    let mut report = result?;
    report.nice = nice;
    common::finish(&report, &run.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(CopyConfig, Run), String> {
        common::resolved(&[&["copy"], args].concat(), resolve)
    }

    #[test]
    fn defaults() {
        let (c, r) = parse(&["-x", "80-10.0.1.5:8080"]).unwrap();
        assert_eq!(c.rules.len(), 1);
        assert_eq!(c.copies, 1);
        assert_eq!(
            c.sampler,
            Sampler {
                percent: 100.0,
                ramp_ns: 0
            }
        );
        assert!(!c.proxy_protocol && !c.no_wait && !c.only_full);
        assert_eq!(c.timeout_ns, 10_000_000_000);
        assert!(c.max_memory >= 64 << 20);
        assert_eq!((c.max_loss_percent, c.filter.as_deref()), (1.0, None));
        assert_eq!(
            r.input,
            Input::Live {
                ifname: "any".into()
            }
        );
        assert_eq!(
            (r.duration, r.stats, r.out.json, r.nice),
            (None, None, false, 10)
        );
    }

    #[test]
    fn every_flag_parses() {
        let (c, r) = parse(&[
            "-x",
            "80-10.0.1.5:8080,6379-10.0.1.5:6379",
            "-x",
            "10.0.0.1:3306-10.0.1.6:3306",
            "-n",
            "3",
            "-r",
            "50",
            "--ramp",
            "2.5",
            "--proxy-protocol",
            "--only-full",
            "--no-wait",
            "--timeout",
            "1.5",
            "--max-memory",
            "64M",
            "--nice",
            "0",
            "--duration",
            "3",
            "--stats",
            "0.5",
            "--json",
            "-i",
            "eth1",
            "--max-loss",
            "2.5",
            "-F",
            "net 10.1.0.0/16",
        ])
        .unwrap();
        assert_eq!(c.max_loss_percent, 2.5);
        assert_eq!(c.filter.as_deref(), Some("net 10.1.0.0/16"));
        let (f, _) = parse(&["-x", "80-10.0.1.5:80", "--filter", "not port 22"]).unwrap();
        assert_eq!(f.filter.as_deref(), Some("not port 22"));
        assert_eq!(c.rules.len(), 3);
        assert_eq!(c.copies, 3);
        assert_eq!(
            c.sampler,
            Sampler {
                percent: 50.0,
                ramp_ns: 2_500_000_000
            }
        );
        assert!(c.proxy_protocol && c.no_wait && c.only_full);
        assert_eq!(c.timeout_ns, 1_500_000_000);
        assert_eq!(c.max_memory, 64 << 20);
        assert_eq!(
            r.input,
            Input::Live {
                ifname: "eth1".into()
            }
        );
        assert_eq!(r.duration, Some(Duration::from_secs(3)));
        assert_eq!(r.stats, Some(Duration::from_millis(500)));
        assert!(r.out.json);
        assert_eq!(r.nice, 0);
        let (_, r) = parse(&[
            "-x",
            "80-10.0.1.5:80",
            "--input",
            "x.pcap",
            "--speed",
            "4",
            "--max-idle",
            "0.5",
            "--loop",
            "3",
        ])
        .unwrap();
        assert_eq!(
            r.input,
            Input::File {
                path: "x.pcap".into(),
                speed: 4.0,
                max_idle_ns: Some(500_000_000),
                loops: 3
            }
        );
    }

    #[test]
    fn bad_values_say_which_flag() {
        let e = |args: &[&str]| {
            let mut v = vec!["-x", "80-10.0.1.5:8080"];
            v.extend_from_slice(args);
            parse(&v).unwrap_err()
        };
        assert!(parse(&[]).unwrap_err().contains("--copy"));
        assert!(parse(&["-x", "80"])
            .unwrap_err()
            .starts_with("-x: rule '80'"));
        assert!(e(&["-n", "0"]).contains("-n 0"));
        assert!(e(&["-r", "101"]).contains("-r 101"));
        assert!(e(&["-r", "nan"]).contains("-r NaN"));
        assert!(e(&["--ramp=-1"]).contains("'-1' for '--ramp"));
        assert!(e(&["--timeout", "0"]).contains("--timeout 0"));
        assert!(e(&["--max-memory", "lots"]).contains("'lots' for '--max-memory"));
        assert!(e(&["--max-memory", "1000"]).contains("at least 1M"));
        assert!(e(&["--nice", "20"]).contains("--nice 20"));
        assert!(e(&["--duration", "inf"]).contains("--duration"));
        assert!(e(&["--stats=-2"]).contains("--stats"));
        assert!(e(&["-i", "a-very-long-interface-name"]).contains("1 to 15"));
        assert!(e(&["--speed", "2"]).contains("--input"));
        assert!(e(&["--max-idle", "2"]).contains("--input"));
        assert!(e(&["--loop", "2"]).contains("--input"));
        assert!(e(&["--input", "f", "--speed", "0"]).contains("--speed 0"));
        assert!(e(&["--input", "f", "--loop", "0"]).contains("--loop 0"));
        assert!(e(&["--input", "f", "--max-idle=-1"]).contains("'-1' for '--max-idle"));
        assert!(e(&["--input", "f", "-i", "eth0"]).contains("cannot be used with"));
        assert!(e(&["--max-loss", "101"]).contains("--max-loss 101"));
        assert!(e(&["--max-loss=-1"]).contains("--max-loss -1"));
        let m = e(&["-F", "tcp port"]);
        assert!(m.starts_with("-F 'tcp port': ") && !m.contains('\n'), "{m}");
        assert!(e(&["-F", "host 10.1.2.3", "--input", "f"]).contains("cannot be used with"));
    }
}

#[cfg(test)]
mod transparent_flags {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<TransparentConfig>, String> {
        common::resolved(
            &[&["copy", "-x", "80-198.18.2.2:8080"], args].concat(),
            resolve,
        )
        .map(|(_, r)| r.transparent)
    }

    fn parse_all(args: &[&str]) -> Result<(CopyConfig, Run), String> {
        common::resolved(
            &[&["copy", "-x", "80-198.18.2.2:8080"], args].concat(),
            resolve,
        )
    }

    #[test]
    fn off_by_default() {
        assert_eq!(parse(&[]).unwrap(), None);
    }

    #[test]
    fn every_transparent_flag_parses() {
        let t = parse(&["--transparent", "--intercept", "198.18.3.2"])
            .unwrap()
            .unwrap();
        assert_eq!(t.intercept, "198.18.3.2:36524".parse().unwrap());
        assert_eq!(t.client_cidr, None);
        assert_eq!(t.port_pool, transparent::DEFAULT_PORT_POOL);
        let t = parse(&[
            "--transparent",
            "--intercept",
            "198.18.3.2:4000",
            "-c",
            "10.9.0.0/16",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(t.intercept, "198.18.3.2:4000".parse().unwrap());
        assert_eq!(t.client_cidr, Some("10.9.0.0/16".parse().unwrap()));
        let t = parse(&[
            "--transparent",
            "--intercept",
            "[fd00::9]",
            "--client-addr",
            "10.1.2.3",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(t.intercept, "[fd00::9]:36524".parse().unwrap());
        let t = parse(&["--transparent", "--intercept", "[fd00::9]:77"])
            .unwrap()
            .unwrap();
        assert_eq!(t.intercept, "[fd00::9]:77".parse().unwrap());
    }

    #[test]
    fn bad_combinations_say_which_flag() {
        let e = |args: &[&str]| parse(args).unwrap_err();
        assert!(e(&["--transparent"]).contains("--intercept"));
        assert!(e(&["--intercept", "1.2.3.4"]).contains("--transparent"));
        assert!(e(&["-c", "10.0.0.0/8"]).contains("--transparent"));
        assert!(e(&["--transparent", "--intercept", "assistant"])
            .contains("--intercept 'assistant': expected an IP address"));
        assert!(e(&[
            "--transparent",
            "--intercept",
            "1.2.3.4",
            "-c",
            "10.0.0.0/99"
        ])
        .starts_with("-c '10.0.0.0/99'"));
        assert!(
            e(&["--transparent", "--intercept", "1.2.3.4", "-c", "fd00::/64"])
                .contains("other address family")
        );
        assert!(e(&[
            "--transparent",
            "--intercept",
            "1.2.3.4",
            "--proxy-protocol"
        ])
        .contains("--proxy-protocol"));
        // --diff needs answers' bytes back, and waiting for each: --no-wait is refused as in
        // relay mode.
        assert!(e(&[
            "--transparent",
            "--intercept",
            "1.2.3.4",
            "--diff",
            "--no-wait"
        ])
        .contains("--diff with --no-wait"));
    }

    #[test]
    fn transparent_takes_diff_and_an_input_file() {
        let (c, r) = parse_all(&[
            "--transparent",
            "--intercept",
            "198.18.3.2",
            "--diff",
            "--diff-mode",
            "http",
            "--diff-ignore",
            "^Date:",
            "--diff-out",
            "d.jsonl",
            "--diff-max",
            "5",
            "--input",
            "f.pcap",
            "--speed",
            "2",
            "--max-idle",
            "0.5",
            "--loop",
            "3",
        ])
        .unwrap();
        assert!(r.transparent.is_some());
        let d = c.diff.unwrap();
        assert_eq!(d.mode, DiffMode::Http);
        assert_eq!(d.ignore.len(), 1);
        assert_eq!(d.max_written, 5);
        assert_eq!(d.out, Some(PathBuf::from("d.jsonl")));
        assert_eq!(
            r.input,
            Input::File {
                path: PathBuf::from("f.pcap"),
                speed: 2.0,
                max_idle_ns: Some(500_000_000),
                loops: 3,
            }
        );
    }
}

#[cfg(test)]
mod diff_metrics_check_flags {
    use super::*;

    fn parse(args: &[&str]) -> Result<(CopyConfig, Run), String> {
        common::resolved(
            &[&["copy", "-x", "80-198.18.2.2:8080"], args].concat(),
            resolve,
        )
    }

    #[test]
    fn off_by_default() {
        let (c, r) = parse(&[]).unwrap();
        assert_eq!(c.diff, None);
        assert_eq!((r.metrics, r.check), (None, false));
    }

    #[test]
    fn every_diff_flag_parses() {
        let (c, _) = parse(&["--diff"]).unwrap();
        let d = c.diff.unwrap();
        assert_eq!((d.mode, d.max_written, d.out), (DiffMode::Bytes, 100, None));
        assert!(d.ignore.is_empty());
        let (c, _) = parse(&[
            "--diff",
            "--diff-mode",
            "http",
            "--diff-ignore",
            "^Date:",
            "--diff-ignore",
            "(?i)^x-request-id:",
            "--diff-out",
            "d.jsonl",
            "--diff-max",
            "7",
        ])
        .unwrap();
        let d = c.diff.unwrap();
        assert_eq!(d.mode, DiffMode::Http);
        let pats: Vec<&str> = d.ignore.iter().map(|r| r.as_str()).collect();
        assert_eq!(pats, ["^Date:", "(?i)^x-request-id:"]);
        assert_eq!(d.out, Some(PathBuf::from("d.jsonl")));
        assert_eq!(d.max_written, 7);
    }

    #[test]
    fn bad_diff_flags_say_which() {
        let e = |args: &[&str]| parse(args).unwrap_err();
        assert!(e(&["--diff-mode", "http"]).contains("--diff"));
        assert!(e(&["--diff-ignore", "x"]).contains("--diff"));
        assert!(e(&["--diff-out", "f"]).contains("--diff"));
        assert!(e(&["--diff", "--diff-max", "3"]).contains("--diff-out"));
        assert!(e(&["--diff", "--diff-mode", "xml"])
            .contains("--diff-mode 'xml': expected bytes or http"));
        let m = e(&["--diff", "--diff-ignore", "("]);
        assert!(m.starts_with("--diff-ignore '(': "), "{m}");
        assert!(!m.contains('\n'), "one line: {m}");
        assert!(e(&["--diff", "--no-wait"]).contains("--diff with --no-wait"));
    }

    #[test]
    fn metrics_and_check_parse() {
        let (_, r) = parse(&["--metrics", "127.0.0.1:9100", "--check"]).unwrap();
        assert_eq!(r.metrics, Some("127.0.0.1:9100".parse().unwrap()));
        assert!(r.check);
        let (_, r) = parse(&["--metrics", "[::1]:0"]).unwrap();
        assert_eq!(r.metrics, Some("[::1]:0".parse().unwrap()));
        let m = parse(&["--metrics", "9100"]).unwrap_err();
        assert!(m.contains("--metrics '9100': expected IP:PORT"), "{m}");
    }
}
