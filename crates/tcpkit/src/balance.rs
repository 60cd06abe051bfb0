//! `tcpkit balance`: what the user typed (clap), resolved into `tcpkit_balance` services, and
//! how the report is given.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;

use clap::{Parser, Subcommand, ValueEnum};
use std::time::Duration;

use tcpkit_balance::{Algorithm, Backend, HashKey, HealthOptions, RunOptions, Service};
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
    /// Exits with CMD's status (128 + N when signal N ended it). The summary goes to stderr,
    /// as time(1)'s does. SIGINT/SIGTERM: forwarded to CMD as SIGTERM; what is left in the
    /// cgroup 5 s later is killed; a second signal exits at once.
    Run(RunArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AlgorithmArg {
    /// Uniformly at random, independently for each connect.
    Random,
    /// In turn (one counter per VIP shared by every CPU).
    RoundRobin,
    /// At random, in proportion to the backends' weights (@W).
    Weighted,
    /// Maglev consistent hashing, weighted: the same --hash-key lands on the same backend
    /// while the set is stable.
    Maglev,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum HashKeyArg {
    /// The socket's bound source address in its network namespace (unbound sockets of one
    /// namespace are one client): a client keeps its backend across reconnects.
    Client,
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
    /// differ from the VIP's), with @W a weight from 1 to 1000 (weighted, maglev); repeat for
    /// several. With none, connect() to the VIP fails with ECONNREFUSED.
    #[arg(long, value_name = "IP:PORT[@W]", value_parser = backend_arg)]
    pub backend: Vec<Backend>,

    /// How each connect picks its backend.
    #[arg(long, value_enum, default_value = "random")]
    pub algorithm: AlgorithmArg,

    /// What maglev hashes (--algorithm maglev; default client).
    #[arg(long, value_enum)]
    pub hash_key: Option<HashKeyArg>,

    /// Probe every backend with a TCP connect this often (from outside the balanced cgroup,
    /// so never translated); a backend failing --fall probes in a row leaves the selection
    /// at once, and returns after --rise successes. Without it every backend is used.
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
        backends: a.backend.clone(),
        algorithm: match (a.algorithm, a.hash_key) {
            (AlgorithmArg::Maglev, k) => Algorithm::Maglev(match k {
                None | Some(HashKeyArg::Client) => HashKey::Client,
                Some(HashKeyArg::Cookie) => HashKey::Cookie,
            }),
            (_, Some(_)) => {
                return Err(Failure::Usage(
                    "--hash-key: only --algorithm maglev hashes".into(),
                ))
            }
            (AlgorithmArg::Random, None) => Algorithm::Random,
            (AlgorithmArg::RoundRobin, None) => Algorithm::RoundRobin,
            (AlgorithmArg::Weighted, None) => Algorithm::Weighted,
        },
    };
    service.check().map_err(|e| Failure::Usage(e.to_string()))?;
    let health = match a.health_interval {
        None => None,
        Some(i) if i.is_zero() => {
            return Err(Failure::Usage(
                "--health-interval 0: give a duration above 0".into(),
            ))
        }
        Some(_) if a.health_timeout.is_zero() => {
            return Err(Failure::Usage(
                "--health-timeout 0: give a duration above 0".into(),
            ))
        }
        Some(_) if a.rise == 0 || a.fall == 0 => {
            return Err(Failure::Usage(
                "--rise and --fall count probes: 1 or more".into(),
            ))
        }
        Some(interval) => Some(HealthOptions {
            interval,
            timeout: a.health_timeout,
            rise: a.rise,
            fall: a.fall,
        }),
    };
    Ok(RunOptions {
        services: vec![service],
        command: a.command.clone(),
        stdout_to_stderr: a.out.json,
        health,
        trace: a.trace,
    })
}

pub fn main(args: Args, interrupted: &'static AtomicBool) -> Result<(), Failure> {
    match args.cmd {
        Sub::Run(a) => run(a, interrupted),
    }
}

fn run(a: RunArgs, interrupted: &'static AtomicBool) -> Result<(), Failure> {
    let opts = resolve(&a)?;
    let report =
        tcpkit_balance::run(&opts, interrupted).map_err(|e| Failure::Runtime(crate::chain(&e)))?;
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
            Algorithm::Weighted
        );
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
            vec!["--backend", "198.18.0.2:80@0", "--algorithm", "weighted"],
            vec!["--hash-key", "client"],
            vec!["--health-interval", "0"],
            vec!["--health-interval", "1s", "--fall", "0"],
        ] {
            let mut v = vec!["--vip", "198.19.0.1:80"];
            v.extend(bad.iter().copied());
            v.extend(["--", "true"]);
            let a = parse(&v).unwrap();
            assert!(matches!(resolve(&a), Err(Failure::Usage(_))), "{bad:?}");
        }
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
