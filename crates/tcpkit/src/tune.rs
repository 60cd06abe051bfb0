//! `tcpkit tune`: what the user typed (clap), resolved into `tcpkit_load::tune::TuneConfig`,
//! and the report printed with the exit status it implies.

use std::path::Path;

use clap::{Parser, ValueEnum};
use tcpkit_load::echo;
use tcpkit_load::tune::{self, Role, TuneConfig};

use crate::common::{self, OutputFlags};
use crate::Failure;

/// Checks and explains what stops this host, in its current network namespace, from holding
/// many TCP connections: each setting as OK or CHANGE with the exact command. Exits 0 when
/// nothing needs a change, 1 when something does.
#[derive(Debug, Parser)]
pub struct Args {
    /// Which end of the connections this host is: server (accepts them) or client (opens
    /// them).
    #[arg(long, value_enum, value_name = "ROLE")]
    pub role: RoleArg,

    /// Connections this host must hold at once.
    #[arg(long, value_name = "N", default_value_t = tune::DEFAULT_CONNECTIONS)]
    pub connections: u64,

    /// The server's port, for the conntrack NOTRACK rule.
    // The default is `tcpkit echo`'s port: the binary composes the two jobs, so `tune` need
    // not know `echo`.
    #[arg(long, value_name = "P", default_value_t = echo::DEFAULT_PORT)]
    pub port: u16,

    /// Make the changes that can be made from here (sysctls, written under /proc/sys and
    /// read back), say which and why not the others, and judge the host again.
    #[arg(long)]
    pub apply: bool,

    #[command(flatten)]
    pub out: OutputFlags,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    Server,
    Client,
}

/// How the run is carried out, beside what is checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Run {
    pub apply: bool,
}

/// Every check of a value's meaning happens here.
pub fn resolve(a: &Args) -> Result<(TuneConfig, Run), Failure> {
    if !(1..=tune::MAX_CONNECTIONS).contains(&a.connections) {
        return Err(Failure::Usage(format!(
            "--connections {}: must be 1 to {}",
            a.connections,
            tune::MAX_CONNECTIONS
        )));
    }
    if a.port == 0 {
        return Err(Failure::Usage(
            "--port 0: give a port from 1 to 65535".into(),
        ));
    }
    let role = match a.role {
        RoleArg::Server => Role::Server,
        RoleArg::Client => Role::Client,
    };
    Ok((
        TuneConfig {
            role,
            connections: a.connections,
            port: a.port,
        },
        Run { apply: a.apply },
    ))
}

pub fn main(args: Args) -> Result<(), Failure> {
    let (cfg, run) = resolve(&args)?;
    let mut report = tune::run(&cfg, run.apply, Path::new(tune::PROC_SYS));
    report.json = args.out.json;
    common::finish(&report, &args.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(TuneConfig, Run), String> {
        common::resolved(&[&["tune"], args].concat(), resolve)
    }

    #[test]
    fn defaults() {
        let (c, r) = parse(&["--role", "server"]).unwrap();
        assert_eq!(
            c,
            TuneConfig {
                role: Role::Server,
                connections: 1_000_000,
                port: 4242
            }
        );
        assert_eq!(r, Run { apply: false });
    }

    #[test]
    fn every_flag_parses() {
        let (c, r) = parse(&[
            "--role",
            "client",
            "--connections",
            "45000",
            "--port",
            "53",
            "--apply",
            "--json",
        ])
        .unwrap();
        assert_eq!(
            c,
            TuneConfig {
                role: Role::Client,
                connections: 45_000,
                port: 53
            }
        );
        assert_eq!(r, Run { apply: true });
    }

    #[test]
    fn bad_values_say_which_flag() {
        let e = |args: &[&str]| parse(args).unwrap_err();
        assert!(e(&[]).contains("--role"));
        assert!(e(&["--role", "both"]).contains("'both'"));
        assert!(e(&["--role", "server", "--connections", "0"]).contains("--connections 0"));
        assert!(e(&["--role", "server", "--connections", "-5"]).contains("'-5'"));
        assert!(e(&["--role", "server", "--connections", "2000000000"])
            .contains("--connections 2000000000: must be 1 to 1000000000"));
        assert!(e(&["--role", "server", "--port", "0"]).contains("--port 0"));
        assert!(e(&["--role", "server", "--port", "70000"]).contains("--port"));
    }
}
