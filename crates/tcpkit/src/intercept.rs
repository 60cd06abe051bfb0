//! `tcpkit intercept`: what the user typed (clap), the resolved `tcpkit_copy::intercept`
//! configuration, and how the run is shown (live line, `--stats`, summary or `--json`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tcpkit_copy::auth::Key;
use tcpkit_copy::control::DEFAULT_PORT;
use tcpkit_copy::intercept::{self, AnswerRule, InterceptConfig, InterceptLive, Source};
use tcpkit_copy::transparent::Cidr;
use tcpkit_stats::{Monitor, MonitorOptions};

use crate::common::{self, OutputFlags, RunFlags};
use crate::Failure;

/// Catch the target's answers to `tcpkit copy --transparent` and return their TCP/IP headers
/// (and payload, to a copy that asks: `copy --diff`) to the copies that connect. Either on an
/// assistant host the target routes the clients' addresses to (--capture; the answers are
/// never forwarded: forwarding must be off there, checked at start and every second), or on
/// the target itself (--on-target; the answers are queued by a netfilter rule intercept
/// installs, and dropped). Runs until SIGINT/SIGTERM.
#[derive(Debug, Parser)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Interface the target's answers arrive on (on the assistant). Not with --on-target.
    #[arg(
        long = "capture",
        value_name = "IFACE",
        required_unless_present = "on_target",
        conflicts_with = "on_target"
    )]
    pub capture: Option<String>,

    /// tcpdump expression choosing the answers (default: all TCP), e.g. 'src port 8080'.
    /// The control port is always left out. Not with --on-target (use --server-port and
    /// --clients).
    #[arg(long, value_name = "EXPR", conflicts_with = "on_target")]
    pub filter: Option<String>,

    /// Run on the target itself, no assistant needed: install an nftables table
    /// `inet tcpkit_intercept_<QUEUE>` whose output-hook rule queues the target's answers
    /// (TCP from --server-port, to --clients) to netfilter queue --queue; each queued answer
    /// goes to the copies and is then dropped, so it never leaves the target. If intercept is
    /// killed, the rule stays and the kernel drops what it queues (nothing leaks); the next
    /// intercept replaces it. At exit the target's connections the rule matches are aborted
    /// (`ss -K`) and the rule is removed. On kernels without nftables' queue expression the
    /// rule is an iptables chain TCPKIT-INTERCEPT-<QUEUE> with the NFQUEUE target. Needs root,
    /// nft (and iptables on such kernels).
    #[arg(long, requires = "server_port")]
    pub on_target: bool,

    /// With --on-target: the target's server port(s) whose answers are caught, e.g.
    /// 8080 or 80,443 (at most 15). Must not be --listen's port.
    #[arg(long, value_name = "PORT[,PORT...]", value_delimiter = ',')]
    pub server_port: Vec<u16>,

    /// With --on-target: only answers to these addresses are caught (the clients' prefix, or
    /// copy's -c prefix), IPv4 and/or IPv6, e.g. 198.51.100.0/24,2001:db8::/64. Default: every
    /// destination, so the server answers nobody else on --server-port while intercept runs.
    #[arg(long, value_name = "CIDR[,CIDR...]", value_delimiter = ',')]
    pub clients: Vec<String>,

    /// With --on-target: the netfilter queue number (0-65535) the rule queues to; one
    /// intercept per queue. Default 36524.
    #[arg(long, value_name = "NUM")]
    pub queue: Option<u16>,

    /// Address and port copies connect to. Required without --auth-key-file (intercept then
    /// listens only where it is told); with a key, default 0.0.0.0:36524.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,

    /// Copies must prove this shared key (HMAC-SHA256 challenge-response over nonces from
    /// both sides) before intercept sends them anything; give copy the same file. At least
    /// 16 bytes (trailing whitespace left out), readable by its owner only: make one with
    /// `openssl rand -base64 32 > FILE; chmod 600 FILE`. The channel is authenticated, not
    /// encrypted.
    #[arg(long, value_name = "FILE")]
    pub auth_key_file: Option<PathBuf>,

    /// Accept copies only from this prefix, IPv4 or IPv6, e.g. 198.18.4.0/24 (repeatable;
    /// default: from anywhere). Other connections are closed at once, told nothing, and
    /// counted.
    #[arg(long, value_name = "CIDR")]
    pub allow: Vec<String>,

    /// How long a control connection may take to complete its Hello (and, with
    /// --auth-key-file, the key's proof), and any later message to arrive whole once begun;
    /// past it the connection is closed and counted (copies_timed_out). At least 1s: the
    /// deadlines are checked once a second.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg, default_value = "5s")]
    pub hello_timeout: Duration,

    #[command(flatten)]
    pub run: RunFlags,

    #[command(flatten)]
    pub out: OutputFlags,
}

const EXAMPLES: &str = "\
Examples:
  # a shared key, the same file (mode 600) on every host
  online$ openssl rand -base64 32 > tk.key; chmod 600 tk.key

  # on an assistant host the target routes the clients' addresses to (forwarding off)
  assistant$ tcpkit intercept --capture eth0 --filter 'src port 8080' --auth-key-file tk.key
  online$    tcpkit copy --transparent -x 80-<target>:8080 --intercept <assistant> --auth-key-file tk.key

  # on the target itself: its answers from 8080 to the clients' 198.51.100.0/24 are queued
  # and dropped (the target routes that prefix anywhere, e.g. its default route)
  target$ tcpkit intercept --on-target --server-port 8080 --clients 198.51.100.0/24 --auth-key-file tk.key
  online$ tcpkit copy --transparent -x 80-<target>:8080 --intercept <target> --auth-key-file tk.key

  # no key: copies are not authenticated, so intercept listens only where it is told
  assistant$ tcpkit intercept --capture eth0 --listen 10.0.0.5:36524 --allow 10.0.0.0/24";

/// Every check that involves a value's meaning.
fn resolve(a: &Args) -> Result<(InterceptConfig, Option<Duration>), Failure> {
    let stats = a.run.stats.filter(|d| !d.is_zero());
    let key = a
        .auth_key_file
        .as_deref()
        .map(Key::from_file)
        .transpose()
        // A file that cannot be used as given: a usage error, the flag and file named.
        .map_err(|e| Failure::Usage(crate::chain(&e)))?;
    // Without a key there is no default address: checked last, after the other flags.
    let listen = a.listen.or_else(|| {
        key.is_some()
            .then(|| SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))
    });
    let source = if a.on_target {
        let mut ports = a.server_port.clone();
        ports.sort_unstable();
        ports.dedup();
        if ports.contains(&0) {
            return Err(Failure::Usage("--server-port 0: not a port".into()));
        }
        if ports.len() > 15 {
            return Err(Failure::Usage(format!(
                "--server-port: {} ports, at most 15",
                ports.len()
            )));
        }
        if let Some(p) = listen.map(|l| l.port()).filter(|p| ports.contains(p)) {
            return Err(Failure::Usage(format!(
                "--server-port {p}: is --listen's port; intercept would catch its own control connections"
            )));
        }
        // In the order given, without repeats.
        let mut given = Vec::new();
        for p in &a.server_port {
            if !given.contains(p) {
                given.push(*p);
            }
        }
        let mut clients = Vec::new();
        for c in &a.clients {
            let cidr: Cidr = c
                .parse()
                .map_err(|e| Failure::Usage(format!("--clients '{c}': {e}")))?;
            clients.push(cidr);
        }
        Source::OnTarget(AnswerRule {
            queue: a.queue.unwrap_or(DEFAULT_PORT),
            ports: given,
            clients,
        })
    } else {
        // clap's `requires` cannot name a flag (it always has a value): checked here.
        for (given, flag) in [
            (!a.server_port.is_empty(), "--server-port"),
            (!a.clients.is_empty(), "--clients"),
            (a.queue.is_some(), "--queue"),
        ] {
            if given {
                return Err(Failure::Usage(format!("{flag}: only with --on-target")));
            }
        }
        let capture = a.capture.clone().unwrap_or_default();
        if capture.is_empty() || capture.len() > 15 {
            return Err(Failure::Usage(format!(
                "--capture '{capture}': an interface name has 1 to 15 characters"
            )));
        }
        if a.filter.as_deref().is_some_and(|f| f.trim().is_empty()) {
            return Err(Failure::Usage("--filter: empty expression".into()));
        }
        Source::Capture {
            ifname: capture,
            filter: a.filter.clone(),
        }
    };
    let mut allow = Vec::new();
    for c in &a.allow {
        let cidr: Cidr = c
            .parse()
            .map_err(|e| Failure::Usage(format!("--allow '{c}': {e}")))?;
        allow.push(cidr);
    }
    if a.hello_timeout < Duration::from_secs(1) {
        return Err(Failure::Usage(format!(
            "--hello-timeout {:?}: at least 1s (intercept checks its deadlines once a second)",
            a.hello_timeout
        )));
    }
    let Some(listen) = listen else {
        return Err(Failure::Usage(format!(
            "--listen: required without --auth-key-file: copies are then not authenticated, so intercept listens only where it is told (the address the online hosts reach it on, e.g. --listen 10.0.0.5:{DEFAULT_PORT}); or give --auth-key-file FILE to listen on 0.0.0.0:{DEFAULT_PORT}"
        )));
    };
    Ok((
        InterceptConfig {
            source,
            listen,
            allow,
            key,
            hello_timeout: a.hello_timeout,
        },
        stats,
    ))
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    let (cfg, stats) = resolve(&args)?;
    let stop = common::stop_flag(interrupt, args.run.duration);
    let live = Arc::new(InterceptLive::default());
    let mut monitor = {
        let live = Arc::clone(&live);
        Monitor::start(
            MonitorOptions {
                stats_every: stats,
                progress: args.out.progress(),
            },
            move |_| live.line(),
        )
    };
    let result = intercept::run(&cfg, stop, &live);
    monitor.stop();
    let report = result.map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    common::finish(&report, &args.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(InterceptConfig, Option<Duration>), String> {
        common::resolved(&[&["intercept"], args].concat(), resolve)
    }

    #[test]
    fn defaults() {
        // Without a key intercept listens only where it is told.
        let e = parse(&["--capture", "eth1"]).unwrap_err();
        assert!(
            e.starts_with("--listen: required without --auth-key-file")
                && e.contains("--listen 10.0.0.5:36524"),
            "{e}"
        );
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("k");
        std::fs::write(&key, "0123456789abcdef\n").unwrap();
        let kp = key.to_str().unwrap();
        let e = parse(&["--capture", "eth1", "--auth-key-file", kp]).unwrap_err();
        assert!(
            e.starts_with(&format!("--auth-key-file {kp}: readable by others"))
                && e.contains("chmod 600"),
            "{e}"
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (c, s) = parse(&["--capture", "eth1", "--auth-key-file", kp]).unwrap();
        assert_eq!(
            c.source,
            Source::Capture {
                ifname: "eth1".into(),
                filter: None
            }
        );
        assert_eq!(c.listen, "0.0.0.0:36524".parse().unwrap());
        assert!(c.key.is_some());
        assert_eq!(s, None);
        let (c, _) = parse(&[
            "--on-target",
            "--server-port",
            "8080",
            "--listen",
            "10.0.0.5:36524",
        ])
        .unwrap();
        assert_eq!(c.key, None);
        assert_eq!(
            c.source,
            Source::OnTarget(AnswerRule {
                queue: 36524,
                ports: vec![8080],
                clients: vec![]
            })
        );
    }

    #[test]
    fn every_flag_parses() {
        let a = Args::try_parse_from([
            "intercept",
            "--capture",
            "eth2",
            "--filter",
            "src port 8080",
            "--listen",
            "198.18.3.2:4000",
            "--json",
            "--stats",
            "0.5",
            "--allow",
            "198.18.4.0/24",
            "--allow",
            "fd00::1/128",
        ])
        .unwrap();
        assert!(a.out.json);
        let (c, s) = resolve(&a).map_err(|_| ()).unwrap();
        assert_eq!(
            c.source,
            Source::Capture {
                ifname: "eth2".into(),
                filter: Some("src port 8080".into())
            }
        );
        assert_eq!(c.listen, "198.18.3.2:4000".parse().unwrap());
        assert_eq!(s, Some(Duration::from_millis(500)));
        assert_eq!(
            c.allow,
            vec![
                "198.18.4.0/24".parse().unwrap(),
                "fd00::1/128".parse().unwrap()
            ]
        );
        let e = parse(&["--capture", "eth1", "--allow", "10.0.0.0/33"]).unwrap_err();
        assert!(e.starts_with("--allow '10.0.0.0/33': "), "{e}");
    }

    #[test]
    fn every_on_target_flag_parses() {
        let (c, _) = parse(&[
            "--on-target",
            "--server-port",
            "8080,80",
            "--server-port",
            "8080",
            "--clients",
            "198.18.1.0/24,fd00:18:1::/64",
            "--clients",
            "10.0.0.7",
            "--queue",
            "7",
            "--listen",
            "198.18.2.2:4000",
        ])
        .unwrap();
        assert_eq!(
            c.source,
            Source::OnTarget(AnswerRule {
                queue: 7,
                ports: vec![8080, 80],
                clients: ["198.18.1.0/24", "fd00:18:1::/64", "10.0.0.7"]
                    .iter()
                    .map(|c| c.parse().unwrap())
                    .collect()
            })
        );
        assert_eq!(c.listen, "198.18.2.2:4000".parse().unwrap());
    }

    #[test]
    fn hello_timeout_defaults_to_5s_takes_a_duration_and_at_least_1s() {
        let l = ["--capture", "eth1", "--listen", "10.0.0.5:36524"];
        assert_eq!(parse(&l).unwrap().0.hello_timeout, Duration::from_secs(5));
        let (c, _) = parse(&[&l[..], &["--hello-timeout", "2s"]].concat()).unwrap();
        assert_eq!(c.hello_timeout, Duration::from_secs(2));
        let e = parse(&[&l[..], &["--hello-timeout", "500ms"]].concat()).unwrap_err();
        assert!(e.starts_with("--hello-timeout 500ms: at least 1s"), "{e}");
        let e = parse(&[&l[..], &["--hello-timeout", "soon"]].concat()).unwrap_err();
        assert!(e.contains("--hello-timeout"), "{e}");
    }

    #[test]
    fn bad_values_say_which_flag() {
        assert!(parse(&[]).unwrap_err().contains("--capture"));
        assert!(parse(&["--capture", "a-very-long-interface-name"])
            .unwrap_err()
            .contains("1 to 15"));
        assert!(parse(&["--capture", "e", "--filter", " "])
            .unwrap_err()
            .contains("--filter"));
        assert!(parse(&["--capture", "e", "--listen", "nowhere"])
            .unwrap_err()
            .contains("--listen"));
        assert!(parse(&["--capture", "e", "--stats=-1"])
            .unwrap_err()
            .contains("--stats"));
    }

    #[test]
    fn bad_on_target_values_say_which_flag() {
        let e = |args: &[&str]| parse(args).unwrap_err();
        // Mode flags that do not go together, or need each other.
        assert!(e(&["--on-target"]).contains("--server-port"));
        assert!(
            e(&["--on-target", "--server-port", "80", "--capture", "eth0"]).contains("--capture")
        );
        assert!(e(&["--on-target", "--server-port", "80", "--filter", "tcp"]).contains("--filter"));
        for f in [
            &["--capture", "e", "--server-port", "80"][..],
            &["--capture", "e", "--clients", "10.0.0.0/8"],
            &["--capture", "e", "--queue", "3"],
        ] {
            assert!(e(f).contains("--on-target"), "{f:?}: {}", e(f));
        }
        let on = |extra: &[&str]| {
            let mut v = vec!["--on-target", "--server-port"];
            v.extend_from_slice(extra);
            e(&v)
        };
        assert!(on(&["http"]).contains("--server-port"));
        assert!(on(&["0"]).contains("--server-port 0: not a port"));
        assert!(on(&["1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"]).contains("at most 15"));
        assert!(on(&["36524", "--listen", "10.0.0.5:36524"]).contains("--listen's port"));
        assert!(on(&["80", "--clients", "10.0.0.0/33"]).contains("--clients '10.0.0.0/33'"));
        assert!(on(&["80", "--clients", "nowhere"]).contains("--clients 'nowhere'"));
        assert!(on(&["80", "--queue", "65536"]).contains("--queue"));
    }
}
