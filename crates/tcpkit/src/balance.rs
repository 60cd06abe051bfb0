//! `tcpkit balance`: what the user typed (clap), resolved into `tcpkit_balance` services, and
//! how the report is given.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::{Parser, Subcommand, ValueEnum};
use std::time::Duration;

use tcpkit_balance::{Algorithm, Backend, HashKey, HealthOptions, Protocol, RunOptions, Service};
use tcpkit_stats::Report;

use crate::common::{self, OutputFlags};
use crate::Failure;

/// Spread connect() calls to a virtual address over real servers, inside connect() itself
/// (BPF cgroup socket hooks): nothing is paid per packet afterwards.
#[derive(Debug, Parser)]
#[command(subcommand_required = true, arg_required_else_help = false)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Sub,
}

#[derive(Debug, Subcommand)]
pub enum Sub {
    /// Run CMD (and its children) in a fresh cgroup v2 where connect() to --vip goes to one of
    /// the --backend addresses and getpeername() shows the VIP; the cgroup and the BPF links
    /// go when CMD ends (the links also when balance is killed, and CMD is sent SIGTERM then).
    /// Exits with CMD's status (128 + N when signal N ended it; 127 when CMD is not found, 126
    /// when it cannot be executed, as shells). The summary goes to stderr,
    /// as time(1)'s does. SIGINT/SIGTERM: forwarded to CMD as SIGTERM; what is left in the
    /// cgroup 5 s later is killed; a second signal exits at once.
    Run(RunArgs),
    /// Balance the services of a TOML configuration file for every process of a cgroup (the
    /// whole host unless --cgroup), until SIGINT/SIGTERM; the BPF links go with this process
    /// however it ends (unless --pin). SIGHUP (or `balance reload`) re-reads the file and swaps each
    /// service's backends atomically, established connections untouched; a bad file is
    /// refused with its one line and the running configuration stays. On stop, the status
    /// report (as `balance status` shows it) goes to stdout; exit 0.
    Up(UpArgs),
    /// Ask the running `balance up` to re-read its configuration file (as SIGHUP does) and wait
    /// for the answer: exit 0 when the new file is in force, 1 with the file's error when it
    /// was refused (the running configuration stays).
    Reload(ReloadArgs),
    /// Remove what `balance up --pin DIR` left pinned (its links and maps): the programs are
    /// detached and the maps freed by the kernel with the last pin. Exit 1 when nothing is
    /// pinned there, and while the `balance up` that pinned them still runs (it is named: stop
    /// it first; its pins stay).
    Down(DownArgs),
    /// Show the running `balance up`: per service its VIP and algorithm, per backend its
    /// weight, health, last change and connections sent to it, and the kernel features found.
    /// Exit 1 when no `up` answers.
    Status(StatusArgs),
}

#[derive(Debug, Parser)]
pub struct UpArgs {
    /// The configuration file (TOML): [[service]] tables with vip, protocol (tcp, udp),
    /// algorithm, hash_key, backends = [{ addr, weight }] and health = { interval, timeout,
    /// rise, fall }; see README.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,

    /// The cgroup v2 whose processes are balanced: a directory (/sys/fs/cgroup/app.slice) or a
    /// path in the hierarchy as /proc/PID/cgroup shows it (/app.slice; that form also works
    /// under `ip netns exec`). Default: the root, every process of the host.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,

    /// Where `balance status` and `balance reload` reach this process (a unix socket, mode
    /// 600, its directory created with mode 700).
    #[arg(long, value_name = "PATH", default_value = tcpkit_balance::control::DEFAULT_SOCKET)]
    pub socket: PathBuf,

    /// Print every selection on stderr as it happens (pid, cgroup id, VIP -> backend).
    #[arg(long)]
    pub trace: bool,

    /// End the sockets still connected to a backend when it goes down (health) or
    /// leaves the file (reload): `udp` (the
    /// default when given bare) ends connected UDP sockets, `tcp` TCP connections (ECONNABORTED
    /// here, a reset to the backend), `all` both. Only sockets balance sent there (by cookie,
    /// their peer still that backend), in balance's network namespace, through sock_diag
    /// SOCK_DESTROY as `ss -K` does. Unconnected UDP sockets tied to it pick again.
    #[arg(long, value_enum, value_name = "udp|tcp|all", num_args = 0..=1,
          require_equals = true, default_missing_value = "udp")]
    pub drain_kill: Option<DrainArg>,

    /// Pin the links and maps under DIR (on a bpf filesystem, e.g. /sys/fs/bpf/tcpkit/balance):
    /// the balancing then stays after this process ends, even by SIGKILL (for upgrades),
    /// with the backend sets as they last were (health checks, reload and status end with
    /// the process), until `tcpkit balance down --pin DIR`. A DIR holding the pins of an up
    /// that has ended is adopted: the sets are read back from the pinned maps (a backend out
    /// of its set stays down until --rise probes pass), the new programs replace the old ones
    /// in the pinned links atomically, then the file is put in force as by reload; so an
    /// upgrade is: stop the old up (SIGTERM, or SIGKILL), start the new one with the same
    /// flags; no connect is refused or lost in between. The bpf filesystem must outlive this
    /// process: under `ip netns exec` (its own /sys) mount one outside first, e.g. at
    /// /run/tcpkit/bpf, and pin under it.
    #[arg(long, value_name = "DIR")]
    pub pin: Option<PathBuf>,

    /// Serve Prometheus metrics on ADDR (IP:PORT; port 0 picks one, said on stderr): per
    /// backend connections, health, probes; reloads, trace drops. HTTP/1.0 GET /metrics,
    /// 32 connections at once (silent ones make room), head at most 8 KiB within 2 s.
    #[arg(long, value_name = "IP:PORT", value_parser = addr_arg)]
    pub metrics: Option<SocketAddr>,

    #[command(flatten)]
    pub out: OutputFlags,
}

#[derive(Debug, Parser)]
pub struct DownArgs {
    /// The directory `balance up --pin` was given (on a bpf filesystem).
    #[arg(long, value_name = "DIR", default_value = tcpkit_balance::pin::DEFAULT_DIR)]
    pub pin: PathBuf,
}

#[derive(Debug, Parser)]
pub struct ReloadArgs {
    /// The control socket of the `balance up` to ask (the answer is waited for at most 60 s,
    /// as a reload waits for the old probes to end; SIGINT/SIGTERM end the wait, exit 1).
    #[arg(long, value_name = "PATH", default_value = tcpkit_balance::control::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

#[derive(Debug, Parser)]
pub struct StatusArgs {
    /// The control socket of the `balance up` to ask (an answer is waited for at most 10 s;
    /// SIGINT/SIGTERM end the wait at once, exit 1).
    #[arg(long, value_name = "PATH", default_value = tcpkit_balance::control::DEFAULT_SOCKET)]
    pub socket: PathBuf,

    /// One JSON document on stdout (docs/schema/balance-status.schema.json).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DrainArg {
    /// Connected UDP sockets.
    Udp,
    /// TCP connections.
    Tcp,
    /// Both.
    All,
}

impl DrainArg {
    fn kind(self) -> tcpkit_balance::drain::DrainKill {
        use tcpkit_balance::drain::DrainKill;
        match self {
            DrainArg::Udp => DrainKill::Udp,
            DrainArg::Tcp => DrainKill::Tcp,
            DrainArg::All => DrainKill::All,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProtocolArg {
    /// TCP connects.
    Tcp,
    /// UDP: connected sockets through connect, unconnected ones per datagram.
    Udp,
    /// TCP and UDP alike.
    Both,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AlgorithmArg {
    /// Uniformly at random, independently for each connect.
    Random,
    /// In turn (one counter per VIP shared by every CPU). ipvsadm: rr.
    #[value(alias = "rr")]
    RoundRobin,
    /// At random, in proportion to the backends' weights (@W); `weighted` is its old name.
    #[value(alias = "weighted")]
    WeightedRandom,
    /// In turn, in proportion to the weights, interleaved (smooth weighted round robin).
    /// ipvsadm: wrr.
    #[value(alias = "wrr")]
    WeightedRoundRobin,
    /// The backend with the fewest sockets open now (ties in turn). ipvsadm: lc.
    #[value(alias = "lc")]
    LeastConn,
    /// The fewest open sockets per unit of weight. ipvsadm: wlc.
    #[value(alias = "wlc")]
    WeightedLeastConn,
    /// Maglev consistent hashing, weighted: the same --hash-key lands on the same backend
    /// while the set is stable. ipvsadm: mh.
    #[value(alias = "mh")]
    Maglev,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum HashKeyArg {
    /// The client's address and port (IPVS mh with its port flag): the socket's bound source
    /// address in its network namespace and its bound port; a socket with no port bound yet
    /// (most) is placed by its cookie, each on its own.
    Client,
    /// The client host only: the bound source address in its network namespace (unbound
    /// sockets of one namespace are one client, all on one backend).
    Host,
    /// The socket cookie: each socket is placed on its own.
    Cookie,
}

#[derive(Debug, Parser)]
pub struct RunArgs {
    /// The virtual address the command connects to: IP:PORT or [IPv6]:PORT. It need not exist
    /// anywhere. An IPv4 VIP is also reached through IPv6 sockets as ::ffff:IP (v4-mapped).
    #[arg(long, value_name = "IP:PORT", value_parser = addr_arg)]
    pub vip: SocketAddr,

    /// A real server for the VIP (IP:PORT or [IPv6]:PORT, the VIP's family; its port may
    /// differ from the VIP's), with @W a weight from 0 to 1000 (above 1 for the weighted
    /// algorithms and maglev; 0 drains: no new sockets go there); repeat for several. With
    /// none, connect() to the VIP fails with ECONNREFUSED.
    #[arg(long, value_name = "IP:PORT[@W]", value_parser = backend_arg)]
    pub backend: Vec<Backend>,

    /// Which sockets the VIP balances: TCP connects, UDP (connected and unconnected), or
    /// both. With tcp, the UDP hooks (which run on every datagram the command sends and
    /// receives) are not attached.
    #[arg(long, value_enum, default_value = "both")]
    pub protocol: ProtocolArg,

    /// How each connect picks its backend.
    #[arg(long, value_enum, default_value = "random")]
    pub algorithm: AlgorithmArg,

    /// What maglev hashes (--algorithm maglev; default client).
    #[arg(long, value_enum)]
    pub hash_key: Option<HashKeyArg>,

    /// A client (its bound source address in its network namespace: one host) keeps its
    /// backend for DURATION after its last connect, as ipvsadm -p; a backend that left the
    /// set (down, drained) is replaced.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg)]
    pub persistent: Option<Duration>,

    /// Probe every backend with a TCP connect this often (from outside the balanced cgroup,
    /// so never translated); a backend failing --fall probes in a row leaves the selection
    /// at once, and returns after --rise successes. At least 10ms. Without it every backend
    /// is used.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg)]
    pub health_interval: Option<Duration>,

    /// How long a probe's connect may take before it counts as failed.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg,
          default_value = "1s", requires = "health_interval")]
    pub health_timeout: Duration,

    /// Successful probes in a row that bring a down backend back.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2,
        requires = "health_interval"
    )]
    pub rise: u32,

    /// Failed probes in a row that take a backend out.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 3,
        requires = "health_interval"
    )]
    pub fall: u32,

    /// Application probe: send these bytes on each probe's connection (C-style escapes:
    /// \r \n \t \0 \\ \xHH; at most 4096 bytes), e.g. 'PING\r\n'. With --health-expect
    /// alone (a server that speaks first), nothing is sent.
    #[arg(long, value_name = "BYTES", value_parser = payload_arg, requires = "health_interval")]
    pub health_send: Option<Payload>,

    /// Application probe: the reply must start with these bytes (same escapes; at most 1024)
    /// within --health-timeout, e.g. '+PONG'. With --health-send alone any reply will do.
    #[arg(long, value_name = "BYTES", value_parser = payload_arg, requires = "health_interval")]
    pub health_expect: Option<Payload>,

    /// Probe over UDP (a UDP service such as DNS): --health-send is sent as one datagram and
    /// a reply starting with --health-expect (any reply without it) is success. Without
    /// --health-send an empty datagram is sent, and only ICMP port unreachable counts as a
    /// failure (the backend host rate-limits those: keep --health-interval at 1s or more).
    #[arg(long, requires = "health_interval")]
    pub health_udp: bool,

    /// End the sockets still connected to a backend when it goes down (needs
    /// --health-interval): `udp` (the
    /// default when given bare) ends connected UDP sockets, `tcp` TCP connections (ECONNABORTED
    /// here, a reset to the backend), `all` both. Only sockets balance sent there (by cookie,
    /// their peer still that backend), in balance's network namespace, through sock_diag
    /// SOCK_DESTROY as `ss -K` does. Unconnected UDP sockets tied to it pick again.
    #[arg(long, value_enum, value_name = "udp|tcp|all", num_args = 0..=1,
          require_equals = true, default_missing_value = "udp",
          requires = "health_interval")]
    pub drain_kill: Option<DrainArg>,

    /// Print every selection on stderr as it happens (pid, cgroup id, VIP -> backend), from
    /// the BPF programs' ring buffer: a VIP never shows in tcpdump.
    #[arg(long)]
    pub trace: bool,

    /// With --json, CMD's stdout goes to stderr so that stdout holds the report alone.
    #[command(flatten)]
    pub out: OutputFlags,

    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn addr_arg(text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>()
        .map_err(|_| format!("'{text}': not an IP:PORT ([IPv6]:PORT)"))
}

/// A probe's bytes (a type of its own: clap would take `Vec<u8>` for a list of numbers).
#[derive(Debug, Clone)]
pub struct Payload(pub Vec<u8>);

fn payload_arg(text: &str) -> Result<Payload, String> {
    tcpkit_pace::units::unescape(text)
        .map(Payload)
        .map_err(|e| format!("'{text}': {e}"))
}

fn backend_arg(text: &str) -> Result<Backend, String> {
    let (addr, weight) = match text.rsplit_once('@') {
        Some((a, w)) => (
            a,
            w.parse::<u32>()
                .map_err(|_| format!("'{text}': the weight after @ is not a number"))?,
        ),
        None => (text, 1),
    };
    Ok(Backend {
        addr: addr_arg(addr)?,
        weight,
    })
}

/// Every check that involves more than one flag happens here.
pub fn resolve(a: &RunArgs) -> Result<RunOptions, Failure> {
    let service = Service {
        vip: a.vip,
        protocol: match a.protocol {
            ProtocolArg::Tcp => Protocol::Tcp,
            ProtocolArg::Udp => Protocol::Udp,
            ProtocolArg::Both => Protocol::Both,
        },
        backends: a.backend.clone(),
        persistence: a.persistent,
        algorithm: match (a.algorithm, a.hash_key) {
            (AlgorithmArg::Maglev, k) => Algorithm::Maglev(match k {
                None | Some(HashKeyArg::Client) => HashKey::Client,
                Some(HashKeyArg::Host) => HashKey::Host,
                Some(HashKeyArg::Cookie) => HashKey::Cookie,
            }),
            (_, Some(_)) => {
                return Err(Failure::Usage(
                    "--hash-key: only --algorithm maglev hashes".into(),
                ))
            }
            (AlgorithmArg::Random, None) => Algorithm::Random,
            (AlgorithmArg::RoundRobin, None) => Algorithm::RoundRobin,
            (AlgorithmArg::WeightedRandom, None) => Algorithm::WeightedRandom,
            (AlgorithmArg::WeightedRoundRobin, None) => Algorithm::WeightedRoundRobin,
            (AlgorithmArg::LeastConn, None) => Algorithm::LeastConn,
            (AlgorithmArg::WeightedLeastConn, None) => Algorithm::WeightedLeastConn,
        },
    };
    service.check().map_err(|e| Failure::Usage(e.to_string()))?;
    let health = match a.health_interval {
        None => None,
        Some(interval) => Some(
            HealthOptions::new(
                interval,
                a.health_timeout,
                a.rise,
                a.fall,
                tcpkit_balance::health::Probe::new(
                    a.health_udp,
                    a.health_send.clone().map(|p| p.0),
                    a.health_expect.clone().map(|p| p.0),
                )
                .map_err(|e| Failure::Usage(e.to_string()))?,
            )
            .map_err(|e| Failure::Usage(e.to_string()))?,
        ),
    };
    Ok(RunOptions {
        services: vec![service],
        command: a.command.clone(),
        stdout_to_stderr: a.out.json,
        health,
        trace: a.trace,
        drain: a.drain_kill.map(DrainArg::kind),
    })
}

pub fn main(args: Args, interrupted: &'static AtomicBool) -> Result<(), Failure> {
    match args.cmd {
        Sub::Run(a) => run(a, interrupted),
        Sub::Up(a) => up(a, interrupted),
        Sub::Reload(a) => reload(a, interrupted),
        Sub::Down(a) => down(a),
        Sub::Status(a) => status(a, interrupted),
    }
}

fn up(a: UpArgs, interrupted: &'static AtomicBool) -> Result<(), Failure> {
    let hangup: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let flag = move || hangup.store(true, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the action only stores to an atomic, which is async-signal-safe.
    unsafe { signal_hook::low_level::register(signal_hook::consts::SIGHUP, flag) }
        .map_err(|e| Failure::Runtime(format!("installing the SIGHUP handler: {e}")))?;
    let opts = tcpkit_balance::UpOptions {
        config: a.config,
        cgroup: a.cgroup,
        socket: a.socket,
        trace: a.trace,
        metrics: a.metrics,
        drain: a.drain_kill.map(DrainArg::kind),
        pin: a.pin,
    };
    let report = tcpkit_balance::up(&opts, interrupted, hangup).map_err(|e| match e {
        // The file --config names cannot be used as given: a usage error, nothing attached.
        tcpkit_balance::UpError::File(f) => Failure::Usage(format!("--config {f}")),
        e => Failure::Runtime(crate::chain(&e)),
    })?;
    common::finish(&report, &a.out)
}

/// How long reload waits for its answer (it waits for the probers of the old configuration
/// to end: at most a probe timeout). SIGINT/SIGTERM end the wait at once.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long status waits: an `up` answers in milliseconds unless a reload holds it.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

fn down(a: DownArgs) -> Result<(), Failure> {
    let n = tcpkit_balance::pin::down(&a.pin).map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    eprintln!(
        "tcpkit balance: down: {n} pins removed from {}",
        a.pin.display()
    );
    Ok(())
}

fn reload(a: ReloadArgs, interrupted: &AtomicBool) -> Result<(), Failure> {
    let n = tcpkit_balance::control::ask_reload(&a.socket, RELOAD_TIMEOUT, interrupted)
        .map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    eprintln!("tcpkit balance: reloaded ({n} services)");
    Ok(())
}

fn status(a: StatusArgs, interrupted: &AtomicBool) -> Result<(), Failure> {
    let r = tcpkit_balance::control::ask_status(&a.socket, STATUS_TIMEOUT, interrupted)
        .map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    if a.json {
        crate::common::print(&(r.json() + "\n"));
    } else {
        crate::common::print(&r.human());
    }
    Ok(())
}

fn run(a: RunArgs, interrupted: &'static AtomicBool) -> Result<(), Failure> {
    let opts = resolve(&a)?;
    let report = match tcpkit_balance::run(&opts, interrupted) {
        Ok(r) => r,
        Err(e) => match e.shell_status() {
            // CMD not found or not executable: one line and a shell's status; nothing of
            // balance's is left (nothing was attached, or it went with the error).
            Some(code) => {
                eprintln!("tcpkit balance: {}", crate::chain(&e));
                std::process::exit(i32::from(code));
            }
            None => return Err(Failure::Runtime(crate::chain(&e))),
        },
    };
    if a.out.json {
        crate::common::print(&(report.json() + "\n"));
    } else if !a.out.quiet {
        eprint!("{}", report.human());
    }
    match report.command.status {
        0 => Ok(()),
        // The command's own status, as a shell would give it. Everything balance made is gone
        // by now (cgroup, links, maps), and the report is printed: nothing is left to unwind.
        s => std::process::exit(i32::from(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut v = vec!["run"];
        v.extend_from_slice(args);
        RunArgs::try_parse_from(v)
    }

    #[test]
    fn every_flag_parses() {
        let a = parse(&[
            "--vip",
            "198.19.0.1:6379",
            "--backend",
            "198.18.0.2:6379",
            "--backend",
            "198.18.0.3:6380",
            "--algorithm",
            "round-robin",
            "--json",
            "--",
            "redis-benchmark",
            "-h",
            "198.19.0.1",
        ])
        .unwrap();
        assert_eq!(a.vip, "198.19.0.1:6379".parse().unwrap());
        assert_eq!(a.backend.len(), 2);
        assert!(matches!(a.algorithm, AlgorithmArg::RoundRobin));
        assert!(a.out.json && !a.trace);
        assert_eq!(a.command, ["redis-benchmark", "-h", "198.19.0.1"]);
        let o = resolve(&a).unwrap();
        assert!(o.stdout_to_stderr);
        assert_eq!(o.services[0].protocol, Protocol::Both);
        for (arg, want) in [
            ("tcp", Protocol::Tcp),
            ("udp", Protocol::Udp),
            ("both", Protocol::Both),
        ] {
            let a = parse(&["--vip", "198.19.0.1:80", "--protocol", arg, "--", "true"]).unwrap();
            assert_eq!(resolve(&a).unwrap().services[0].protocol, want);
        }
        let e = parse(&["--vip", "198.19.0.1:80", "--protocol", "sctp", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--protocol"), "{e}");
        let a = parse(&[
            "--vip",
            "198.19.0.1:80",
            "--health-interval",
            "1s",
            "--drain-kill",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(
            resolve(&a).unwrap().drain,
            Some(tcpkit_balance::drain::DrainKill::Udp)
        );
        let a = parse(&[
            "--vip",
            "198.19.0.1:80",
            "--health-interval",
            "1s",
            "--drain-kill=all",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(
            resolve(&a).unwrap().drain,
            Some(tcpkit_balance::drain::DrainKill::All)
        );
        assert!(
            parse(&["--vip", "198.19.0.1:80", "--drain-kill", "--", "true"]).is_err(),
            "--drain-kill needs --health-interval"
        );
        let a = parse(&["--vip", "198.19.0.1:80", "--trace", "--", "true"]).unwrap();
        assert!(resolve(&a).unwrap().trace);
        let a = parse(&["--vip", "198.19.0.1:80", "-q", "--", "true"]).unwrap();
        assert!(matches!(a.algorithm, AlgorithmArg::Random) && a.out.quiet);
        assert!(a.backend.is_empty());
        let a = parse(&[
            "--vip",
            "[fd00:19::1]:80",
            "--backend",
            "[fd00:18::2]:80@3",
            "--algorithm",
            "maglev",
            "--hash-key",
            "cookie",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(a.backend[0].weight, 3);
        let o = resolve(&a).unwrap();
        assert_eq!(o.services[0].algorithm, Algorithm::Maglev(HashKey::Cookie));
        let a = parse(&[
            "--vip",
            "198.19.0.1:80",
            "--algorithm",
            "weighted",
            "--",
            "true",
        ]);
        assert_eq!(
            resolve(&a.unwrap()).unwrap().services[0].algorithm,
            Algorithm::WeightedRandom
        );
        for (name, want) in [
            ("wrr", Algorithm::WeightedRoundRobin),
            ("lc", Algorithm::LeastConn),
            ("weighted-least-conn", Algorithm::WeightedLeastConn),
            ("mh", Algorithm::Maglev(HashKey::Client)),
        ] {
            let a = parse(&["--vip", "198.19.0.1:80", "--algorithm", name, "--", "true"]);
            assert_eq!(resolve(&a.unwrap()).unwrap().services[0].algorithm, want);
        }
    }

    #[test]
    fn up_status_and_reload_flags_parse() {
        let a = Args::try_parse_from([
            "balance",
            "up",
            "--config",
            "lb.toml",
            "--cgroup",
            "/app.slice",
            "--socket",
            "/tmp/b.sock",
            "--trace",
            "--metrics",
            "127.0.0.1:9100",
            "--json",
        ])
        .unwrap();
        let Sub::Up(u) = a.cmd else { panic!("not up") };
        assert_eq!(u.config, PathBuf::from("lb.toml"));
        assert_eq!(u.cgroup.as_deref(), Some("/app.slice"));
        assert_eq!(u.socket, PathBuf::from("/tmp/b.sock"));
        assert!(u.trace && u.out.json);
        assert_eq!(u.metrics, Some("127.0.0.1:9100".parse().unwrap()));
        let a = Args::try_parse_from(["balance", "up", "--config", "lb.toml"]).unwrap();
        let Sub::Up(u) = a.cmd else { panic!("not up") };
        assert_eq!(u.socket, PathBuf::from("/run/tcpkit/balance.sock"));
        assert!(u.cgroup.is_none() && u.metrics.is_none());
        assert!(
            Args::try_parse_from(["balance", "up"]).is_err(),
            "--config is required"
        );
        let e = Args::try_parse_from(["balance", "up", "--config", "x", "--metrics", "9100"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--metrics") && e.contains("not an IP:PORT"),
            "{e}"
        );
        let a = Args::try_parse_from(["balance", "status", "--json", "--socket", "/s"]).unwrap();
        assert!(matches!(a.cmd, Sub::Status(StatusArgs { json: true, .. })));
        let a = Args::try_parse_from([
            "balance",
            "up",
            "--config",
            "lb.toml",
            "--pin",
            "/sys/fs/bpf/x",
            "--drain-kill=tcp",
        ])
        .unwrap();
        let Sub::Up(u) = a.cmd else { panic!("not up") };
        assert_eq!(u.pin, Some(PathBuf::from("/sys/fs/bpf/x")));
        assert!(matches!(u.drain_kill, Some(DrainArg::Tcp)));
        let a = Args::try_parse_from(["balance", "down"]).unwrap();
        assert!(
            matches!(a.cmd, Sub::Down(DownArgs { pin }) if pin.as_os_str() == tcpkit_balance::pin::DEFAULT_DIR)
        );
        let a = Args::try_parse_from(["balance", "reload", "--socket", "/s"]).unwrap();
        assert!(matches!(a.cmd, Sub::Reload(ReloadArgs { socket }) if socket.as_os_str() == "/s"));
    }

    #[test]
    fn balance_alone_names_the_missing_subcommand() {
        let e = Args::try_parse_from(["balance"]).unwrap_err().to_string();
        assert!(e.contains("requires a subcommand"), "{e}");
    }

    #[test]
    fn bad_values_name_their_flag() {
        let e = parse(&["--vip", "fd00:19::1", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--vip") && e.contains("not an IP:PORT"), "{e}");
        let a = parse(&[
            "--vip",
            "[fd00:19::1]:80",
            "--backend",
            "198.18.0.2:80",
            "--",
            "true",
        ])
        .unwrap();
        assert!(matches!(resolve(&a), Err(Failure::Usage(m)) if m.contains("family")));
        let e = parse(&[
            "--vip",
            "198.19.0.1:80",
            "--backend",
            "198.18.0.2:80@x",
            "--",
            "true",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("--backend") && e.contains("weight"), "{e}");
        for bad in [
            vec!["--backend", "198.18.0.2:80@2"],
            vec!["--backend", "198.18.0.2:80@1001", "--algorithm", "weighted"],
            vec!["--persistent", "0s"],
            vec!["--hash-key", "client"],
            vec!["--health-interval", "0"],
            vec!["--health-interval", "1s", "--fall", "0"],
            vec![
                "--health-interval",
                "1s",
                "--health-udp",
                "--health-expect",
                "x",
            ],
        ] {
            let mut v = vec!["--vip", "198.19.0.1:80"];
            v.extend(bad.iter().copied());
            v.extend(["--", "true"]);
            let a = parse(&v).unwrap();
            assert!(matches!(resolve(&a), Err(Failure::Usage(_))), "{bad:?}");
        }
        let e = parse(&[
            "--vip",
            "198.19.0.1:80",
            "--health-interval",
            "1s",
            "--health-send",
            "PING\\q",
            "--",
            "true",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--health-send") && e.contains("unknown escape"),
            "{e}"
        );
        let a = parse(&[
            "--vip",
            "198.19.0.1:80",
            "--health-interval",
            "1s",
            "--health-send",
            "PING\\r\\n",
            "--health-expect",
            "+PONG",
            "--",
            "true",
        ])
        .unwrap();
        let h = resolve(&a).unwrap().health.unwrap();
        assert_eq!(
            h.probe,
            tcpkit_balance::health::Probe::Tcp {
                send: b"PING\r\n".to_vec(),
                expect: b"+PONG".to_vec()
            }
        );
        let e = parse(&["--vip", "198.19.0.1:80", "--backend", "x", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--backend"), "{e}");
        assert!(
            parse(&["--vip", "198.19.0.1:80"]).is_err(),
            "CMD is required"
        );
        let a = parse(&[
            "--vip",
            "198.19.0.1:80",
            "--backend",
            "198.19.0.1:80",
            "--",
            "true",
        ])
        .unwrap();
        assert!(matches!(resolve(&a), Err(Failure::Usage(m)) if m.contains("VIP")));
    }
}
