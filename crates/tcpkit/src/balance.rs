//! `tcpkit balance`: what the user typed (clap), resolved into `tcpkit_balance` services, and
//! how the report is given.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;

use clap::{Parser, Subcommand, ValueEnum};
use tcpkit_balance::{Algorithm, RunOptions, Service};
use tcpkit_stats::Report;

use crate::common::OutputFlags;
use crate::Failure;

/// Spread connect() calls to a virtual address over real servers, inside connect() itself
/// (BPF cgroup socket hooks): nothing is paid per packet afterwards.
#[derive(Debug, Parser)]
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
}

#[derive(Debug, Parser)]
pub struct RunArgs {
    /// The virtual address the command connects to: IP:PORT or [IPv6]:PORT. It need not exist
    /// anywhere. An IPv4 VIP is also reached through IPv6 sockets as ::ffff:IP (v4-mapped).
    #[arg(long, value_name = "IP:PORT", value_parser = addr_arg)]
    pub vip: SocketAddr,

    /// A real server for the VIP (IP:PORT or [IPv6]:PORT, the VIP's family; its port may
    /// differ from the VIP's); repeat for several. With none, connect() to the VIP fails with
    /// ECONNREFUSED.
    #[arg(long, value_name = "IP:PORT", value_parser = addr_arg)]
    pub backend: Vec<SocketAddr>,

    /// How each connect picks its backend.
    #[arg(long, value_enum, default_value = "random")]
    pub algorithm: AlgorithmArg,

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

/// Every check that involves more than one flag happens here.
pub fn resolve(a: &RunArgs) -> Result<RunOptions, Failure> {
    let service = Service {
        vip: a.vip,
        backends: a.backend.clone(),
        algorithm: match a.algorithm {
            AlgorithmArg::Random => Algorithm::Random,
            AlgorithmArg::RoundRobin => Algorithm::RoundRobin,
        },
    };
    service.check().map_err(|e| Failure::Usage(e.to_string()))?;
    Ok(RunOptions {
        services: vec![service],
        command: a.command.clone(),
        stdout_to_stderr: a.out.json,
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
        assert!(a.out.json);
        assert_eq!(a.command, ["redis-benchmark", "-h", "198.19.0.1"]);
        let o = resolve(&a).unwrap();
        assert!(o.stdout_to_stderr);
        let a = parse(&["--vip", "198.19.0.1:80", "-q", "--", "true"]).unwrap();
        assert!(matches!(a.algorithm, AlgorithmArg::Random) && a.out.quiet);
        assert!(a.backend.is_empty());
    }

    #[test]
    fn bad_values_name_their_flag() {
        let e = parse(&["--vip", "[::1]:80", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--vip") && e.contains("not an IPv4"), "{e}");
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
