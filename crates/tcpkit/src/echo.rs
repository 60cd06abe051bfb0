//! `tcpkit echo`: what the user typed (clap), then the resolved `tcpkit_load::echo::EchoConfig`
//! and how the run is shaped (worker processes, live lines, report format).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tcpkit_load::echo::{self, EchoConfig, EchoCounters, EchoReport, Mode};
use tcpkit_stats::{Monitor, MonitorOptions, Report};

use crate::common::{self, OutputFlags, RunFlags};
use crate::Failure;

/// The reference server: echoes bytes back or answers DNS-over-TCP queries, with bounded
/// memory per connection. Runs until SIGINT/SIGTERM (then prints its report and exits 0) or
/// for --duration.
#[derive(Debug, Parser)]
pub struct Args {
    /// Port to listen on (for --listen addresses given without one).
    #[arg(long, value_name = "N", default_value_t = echo::DEFAULT_PORT)]
    pub port: u16,

    /// Address to listen on: IP or IP:PORT ([IPv6]:PORT); repeat for several. Default [::],
    /// which takes IPv4 and IPv6 (IPv4 only on a host without IPv6).
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub listen: Vec<String>,

    /// Event-loop threads, each with its own SO_REUSEPORT listener (default: one per core).
    /// Only this echo's listeners share the port: a port another process listens on (another
    /// echo included) is refused, exit 1.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Answer DNS-over-TCP queries (2-byte length prefix) instead of echoing: A and AAAA get
    /// one answer (--dns-a, --dns-aaaa), other types NOERROR without answer; pipelined queries
    /// are answered in order; a malformed query closes its connection.
    #[arg(long)]
    pub dns: bool,

    /// Answer HTTP instead of echoing, as a reference web and DoH server for load --http-get,
    /// --http2 and --doh: HTTP/1.1 keep-alive and HTTP/2 with prior knowledge (h2c: a
    /// connection that starts with the HTTP/2 preface), each request answered at once with
    /// 200 and a short body; on /dns-query, DNS over HTTPS (RFC 8484: GET with ?dns=, POST of
    /// application/dns-message) answered as --dns answers. HTTP/2 announces 256 streams at
    /// once; a request head, frame or body is bounded by half of --max-conn-buf, and one left
    /// unfinished is closed after --partial-timeout. Example: tcpkit echo --http --port 8080.
    #[arg(long, conflicts_with = "dns")]
    pub http: bool,

    /// The address in A answers (--dns).
    #[arg(
        long,
        value_name = "IP",
        requires = "dns",
        default_value = "198.18.0.53"
    )]
    pub dns_a: Ipv4Addr,

    /// The address in AAAA answers (--dns).
    #[arg(
        long,
        value_name = "IP",
        requires = "dns",
        default_value = "fd00:53::53"
    )]
    pub dns_aaaa: Ipv6Addr,

    #[command(flatten)]
    pub run: RunFlags,

    #[command(flatten)]
    pub out: OutputFlags,

    /// Serve from N processes sharing the port (SO_REUSEPORT), for more connections than one
    /// process's file-descriptor limit allows; they report as one.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub procs: u32,

    /// Most bytes held for one connection; a client that does not read its answers is not
    /// read either once this much is pending (back-pressure).
    #[arg(long, value_name = "BYTES", default_value_t = echo::DEFAULT_MAX_CONN_BUF)]
    pub max_conn_buf: usize,

    /// DNS mode: close a connection that holds the start of a query this long without its
    /// end (a client sending one byte and waiting would hold a descriptor forever). DNS and
    /// HTTP mode: close one whose client took none of its answers this long (it stopped
    /// reading), counted apart as unread_timeouts.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg, default_value = "10s")]
    pub partial_timeout: Duration,

    /// Once the server has been full (at --max-conns, or out of descriptors) and until it is
    /// half empty again, close a connection that has not sent its first message (a byte; with
    /// --dns a whole query) this long after it was accepted. Only then, because `tcpkit load`
    /// keeps connections silent as long as it likes (--hold, low rates over many
    /// connections). 0 turns it off.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg, default_value = "10s")]
    pub first_timeout: Duration,

    /// Most connections one process holds (default: its descriptor limit less a reserve for
    /// listeners and the rest). Over it a newcomer takes the place of the oldest connection
    /// that has sent nothing yet, or is closed at once when all have spoken; both are counted.
    #[arg(long, value_name = "N")]
    pub max_conns: Option<usize>,

    /// --tls and its certificate flags: DNS over TLS, and TLS under the byte echo.
    #[command(flatten)]
    pub tls: crate::tls_flags::EchoTls,

    /// Internal: this process is worker K (from 0) of N started by --procs (prints its report
    /// as JSON).
    #[arg(long, value_name = "K/N", hide = true)]
    pub worker: Option<String>,
}

/// How the run is carried out, beside what the server does.
#[derive(Debug)]
pub struct Run {
    pub procs: u32,
    pub stats: Option<Duration>,
    pub out: OutputFlags,
    pub worker: Option<(u32, u32)>,
    /// A self-signed certificate and its key (PEM), for --procs workers to serve the same.
    pub tls_pem: Option<String>,
}

fn usage(msg: String) -> Failure {
    Failure::Usage(msg)
}

fn parse_listen(text: &str, port: u16) -> Result<SocketAddr, Failure> {
    if let Ok(sa) = text.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(usage(format!(
                "--listen '{text}': port 0 is not a port to serve on"
            )));
        }
        return Ok(sa);
    }
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| {
            usage(format!(
                "--listen '{text}': not an address: give IP or IP:PORT ([IPv6]:PORT)"
            ))
        })
}

fn parse_worker(text: &str) -> Result<(u32, u32), Failure> {
    let w = tcpkit_workers::WorkerId::parse(text).map_err(usage)?;
    if w.threads.is_some() {
        return Err(usage(format!("--worker '{text}': echo's workers take K/N")));
    }
    Ok((w.k, w.n))
}

/// Every check that involves more than one flag, or a value's meaning, happens here.
pub fn resolve(a: &Args) -> Result<(EchoConfig, Run), Failure> {
    if a.port == 0 {
        return Err(usage("--port 0: give a port from 1 to 65535".into()));
    }
    let mut cfg = EchoConfig::new(a.port);
    if !a.listen.is_empty() {
        cfg.listen = a
            .listen
            .iter()
            .map(|l| parse_listen(l, a.port))
            .collect::<Result<_, _>>()?;
        cfg.listen_is_default = false;
    }
    if let Some(t) = a.threads {
        if !(1..=1024).contains(&t) {
            return Err(usage(format!("--threads {t}: must be 1 to 1024")));
        }
        cfg.threads = t;
    }
    if a.dns {
        cfg.mode = Mode::Dns {
            a: a.dns_a,
            aaaa: a.dns_aaaa,
        };
    }
    if a.http {
        cfg.mode = Mode::Http {
            a: a.dns_a,
            aaaa: a.dns_aaaa,
        };
    }
    if !(echo::MIN_MAX_CONN_BUF..=echo::MAX_MAX_CONN_BUF).contains(&a.max_conn_buf) {
        return Err(usage(format!(
            "--max-conn-buf {}: must be {} to {} bytes",
            a.max_conn_buf,
            echo::MIN_MAX_CONN_BUF,
            echo::MAX_MAX_CONN_BUF
        )));
    }
    cfg.max_conn_buf = a.max_conn_buf;
    cfg.partial_timeout = a.partial_timeout;
    cfg.first_timeout = a.first_timeout;
    if a.max_conns == Some(0) {
        return Err(usage(
            "--max-conns 0: give at least 1 (the default follows the descriptor limit)".into(),
        ));
    }
    cfg.max_conns = a.max_conns;
    cfg.duration = a.run.duration;
    // DNS over TLS names itself by ALPN `dot` (RFC 7858); the byte echo takes any (or none).
    let alpn: &[&str] = match cfg.mode {
        Mode::Dns { .. } => &["dot"],
        Mode::Echo => &[],
        // HTTP mode tells HTTP/2 from HTTP/1.1 by the client's preface, so both are offered.
        Mode::Http { .. } => &["h2", "http/1.1"],
    };
    let mut tls_pem = None;
    if let Some(t) = a.tls.resolve(&cfg.listen, alpn)? {
        if let Some(key) = &t.key_pem {
            tls_pem = Some(format!("{}{key}", t.cert_pem));
        }
        // Said once: by the process that made it (a worker makes its own; see below).
        if a.worker.is_none() {
            if a.tls.tls_self_signed {
                eprintln!("tcpkit echo: TLS certificate sha256 {}", t.fingerprint);
            }
            if let Some(out) = &a.tls.tls_cert_out {
                std::fs::write(out, &t.cert_pem).map_err(|e| {
                    usage(format!(
                        "--tls-cert-out {}: cannot write: {e}",
                        out.display()
                    ))
                })?;
            }
        }
        cfg.tls = Some(t.config);
        cfg.tls_handshake_timeout = a.tls.tls_handshake_timeout;
    }
    if !(1..=256).contains(&a.procs) {
        return Err(usage(format!("--procs {}: must be 1 to 256", a.procs)));
    }
    let worker = a.worker.as_deref().map(parse_worker).transpose()?;
    cfg.worker = worker;
    let stats = a.run.stats.filter(|d| !d.is_zero());
    let run = Run {
        // A worker is one process whatever --procs its parent was given.
        procs: if worker.is_some() { 1 } else { a.procs },
        stats,
        out: a.out.clone(),
        worker,
        tls_pem,
    };
    Ok((cfg, run))
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    let (cfg, run) = resolve(&args)?;
    let report = if run.procs > 1 {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::Runtime(format!("find own executable for --procs: {e}")))?;
        let mut argv: Vec<_> = std::env::args_os().skip(1).collect();
        // The workers serve the certificate made here, from a file only root can read,
        // removed when the run ends.
        let pem_dir = match &run.tls_pem {
            Some(pem) => {
                let dir = private_dir().map_err(|e| {
                    Failure::Runtime(format!("--tls-self-signed with --procs: {e}"))
                })?;
                let file = dir.join("tls.pem");
                std::fs::write(&file, pem).map_err(|e| {
                    Failure::Runtime(format!(
                        "--tls-self-signed with --procs: {}: {e}",
                        file.display()
                    ))
                })?;
                argv.push("--tls-worker-pem".into());
                argv.push(file.into());
                Some(dir)
            }
            None => None,
        };
        let r = echo::procs::run_workers(&cfg, &exe, &argv, run.procs, interrupt)
            .map_err(|e| Failure::Runtime(crate::chain(&e)));
        if let Some(d) = pem_dir {
            let _ = std::fs::remove_dir_all(d);
        }
        r?
    } else {
        serve(&cfg, &run, interrupt)?
    };
    if run.worker.is_some() {
        // A worker's report is its parent's input: one JSON line, whatever was asked.
        common::print(&(report.json() + "\n"));
        return Ok(());
    }
    common::finish(&report, &run.out)
}

/// A new directory only its owner can enter, under the temporary directory.
fn private_dir() -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("tcpkit-echo-{}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

fn serve(cfg: &EchoConfig, run: &Run, interrupt: &AtomicBool) -> Result<EchoReport, Failure> {
    let live = Arc::new(EchoCounters::new(cfg.threads));
    let mut monitor = {
        let live = Arc::clone(&live);
        let mode = cfg.mode;
        let prefix = run
            .worker
            .map(|(k, n)| format!("worker {k}/{n} "))
            .unwrap_or_default();
        Monitor::start(
            MonitorOptions {
                stats_every: run.stats,
                progress: run.out.progress() && run.worker.is_none(),
            },
            move |_| format!("{prefix}{}", live.line(mode)),
        )
    };
    let hint = |m: &str| eprintln!("tcpkit echo: {m}");
    let result = echo::run(cfg, interrupt, &live, &hint);
    monitor.stop();
    result.map_err(|e| Failure::Runtime(crate::chain(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(EchoConfig, Run), String> {
        common::resolved(&[&["echo"], args].concat(), resolve)
    }

    #[test]
    fn partial_timeout_defaults_to_10s_and_takes_a_duration() {
        assert_eq!(
            parse(&[]).unwrap().0.partial_timeout,
            Duration::from_secs(10)
        );
        let (c, _) = parse(&["--dns", "--partial-timeout", "1500ms"]).unwrap();
        assert_eq!(c.partial_timeout, Duration::from_millis(1500));
        let e = parse(&["--partial-timeout", "soon"]).unwrap_err();
        assert!(e.contains("--partial-timeout"), "{e}");
    }

    #[test]
    fn first_timeout_defaults_to_10s_takes_a_duration_and_0_turns_it_off() {
        assert_eq!(parse(&[]).unwrap().0.first_timeout, Duration::from_secs(10));
        let (c, _) = parse(&["--first-timeout", "2s"]).unwrap();
        assert_eq!(c.first_timeout, Duration::from_secs(2));
        let (c, _) = parse(&["--dns", "--first-timeout", "1m 30s"]).unwrap();
        assert_eq!(c.first_timeout, Duration::from_secs(90));
        assert_eq!(
            parse(&["--first-timeout", "0"]).unwrap().0.first_timeout,
            Duration::ZERO
        );
        let e = parse(&["--first-timeout", "soon"]).unwrap_err();
        assert!(e.contains("--first-timeout"), "{e}");
    }

    #[test]
    fn max_conns_defaults_to_the_descriptor_limit_and_refuses_0() {
        assert_eq!(parse(&[]).unwrap().0.max_conns, None);
        assert_eq!(
            parse(&["--max-conns", "5000"]).unwrap().0.max_conns,
            Some(5000)
        );
        let e = parse(&["--max-conns", "0"]).unwrap_err();
        assert!(e.starts_with("--max-conns 0: "), "{e}");
        let e = parse(&["--max-conns=-3"]).unwrap_err();
        assert!(e.contains("--max-conns"), "{e}");
    }

    /// --http: HTTP/1.1, h2c and DoH, whose answers are --dns's defaults; not with --dns.
    #[test]
    fn http_mode_parses_and_is_not_dns() {
        assert_eq!(
            parse(&["--http"]).unwrap().0.mode,
            Mode::Http {
                a: "198.18.0.53".parse().unwrap(),
                aaaa: "fd00:53::53".parse().unwrap()
            }
        );
        let e = parse(&["--http", "--dns"]).unwrap_err();
        assert!(e.contains("--http") && e.contains("--dns"), "{e}");
    }

    #[test]
    fn defaults() {
        let (c, r) = parse(&[]).unwrap();
        assert_eq!(c.listen, vec!["[::]:4242".parse::<SocketAddr>().unwrap()]);
        assert!(c.listen_is_default);
        assert_eq!(c.mode, Mode::Echo);
        assert_eq!(c.max_conn_buf, 16384);
        assert!(c.threads >= 1);
        assert_eq!(
            (r.procs, r.out.json, r.stats, r.worker),
            (1, false, None, None)
        );
        assert_eq!(c.duration, None);
    }

    #[test]
    fn every_flag_parses() {
        let (c, r) = parse(&[
            "--port",
            "53",
            "--listen",
            "198.18.0.2",
            "--listen",
            "[fd00:18::2]:5353",
            "--listen",
            "[::1]",
            "--threads",
            "3",
            "--dns",
            "--dns-a",
            "10.1.2.3",
            "--dns-aaaa",
            "fd00::1",
            "--stats",
            "0.5",
            "--json",
            "--duration",
            "2.5",
            "--procs",
            "4",
            "--max-conn-buf",
            "4096",
            "--worker",
            "2/4",
        ])
        .unwrap();
        assert_eq!(
            c.listen,
            vec![
                "198.18.0.2:53".parse::<SocketAddr>().unwrap(),
                "[fd00:18::2]:5353".parse().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
        assert!(!c.listen_is_default);
        assert_eq!(c.threads, 3);
        assert_eq!(
            c.mode,
            Mode::Dns {
                a: Ipv4Addr::new(10, 1, 2, 3),
                aaaa: "fd00::1".parse().unwrap()
            }
        );
        assert_eq!(c.max_conn_buf, 4096);
        assert_eq!(c.duration, Some(Duration::from_millis(2500)));
        assert_eq!(c.worker, Some((2, 4)));
        assert_eq!(r.stats, Some(Duration::from_millis(500)));
        assert!(r.out.json);
        // A worker is one process.
        assert_eq!(r.procs, 1);
        assert_eq!(parse(&["--procs", "4"]).unwrap().1.procs, 4);
        let (c, _) = parse(&["--dns"]).unwrap();
        assert_eq!(
            c.mode,
            Mode::Dns {
                a: Ipv4Addr::new(198, 18, 0, 53),
                aaaa: "fd00:53::53".parse().unwrap()
            }
        );
    }

    #[test]
    fn bad_values_say_which_flag() {
        let e = |args: &[&str]| parse(args).unwrap_err();
        assert!(e(&["--port", "70000"]).contains("--port"));
        assert!(e(&["--port", "0"]).contains("--port 0"));
        assert!(e(&["--listen", "garbage"]).starts_with("--listen 'garbage': not an address"));
        assert!(e(&["--listen", "1.2.3.4:0"]).contains("port 0"));
        assert!(e(&["--threads", "0"]).contains("--threads 0"));
        assert!(e(&["--dns-a", "1.2.3.4"]).contains("--dns"));
        assert!(e(&["--dns", "--dns-a", "::1"]).contains("--dns-a"));
        assert!(e(&["--max-conn-buf", "10"]).contains("--max-conn-buf 10"));
        assert!(e(&["--duration=-1"]).contains("'-1' for '--duration"));
        assert!(e(&["--stats", "nan"]).contains("--stats"));
        assert!(e(&["--procs", "0"]).contains("--procs 0"));
        assert!(e(&["--worker", "3/2"]).contains("--worker '3/2'"));
        assert!(e(&["--worker", "2/2"]).contains("K/N"));
        assert!(e(&["--worker", "0/2/1"]).contains("K/N"));
        assert!(e(&["--worker", "x"]).contains("K/N"));
    }
}
