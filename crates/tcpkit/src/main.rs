//! `tcpkit`: parses the command line, runs one job, prints its report. Nothing else lives here.

mod balance;
mod barrier;
mod common;
mod copy;
mod copy_tls;
mod copy_uprobe;
mod docs;
mod echo;
mod fleet;
mod h2_flags;
mod intercept;
mod load;
mod merge;
mod mpcat;
mod replay;
mod replay_prep;
mod tls_flags;
mod tune;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tcpkit",
    // `tcpkit 0.1.0 (abc1234 2026-11-28)`: the version and the commit (build.rs).
    version = env!("TCPKIT_LONG_VERSION"),
    about = "Replay, copy, load and spread TCP traffic: one tool for network and SRE tests"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Send pcap/pcapng captures out of an interface (tcpreplay's job): at their own timing, a
    /// multiple of it, a set pps/Mbps, or top speed; loops, unique IPs per loop, rewriting.
    /// SIGINT/SIGTERM: stops within a batch of packets and prints the report (exit 1: not all
    /// was sent); a second signal exits at once.
    Replay(replay::Args),
    /// The reference server: echo bytes back or answer DNS-over-TCP queries, many connections
    /// with bounded memory each (tcpserver's job). SIGINT/SIGTERM: closes its listeners and
    /// connections and prints the report (exit 0); a second signal exits at once.
    Echo(echo::Args),
    /// Many TCP connections to one server and queries at a set rate (tcpclient, wrk2):
    /// open-loop schedule, latency from the intended and the actual send time, lag reported.
    /// SIGINT/SIGTERM: stops sending, waits at most --timeout for answers still due, prints the
    /// report (exit 1: the run was cut short); a second signal exits at once.
    // Boxed: load has the most flags by far, and every command would otherwise take its size.
    Load(Box<load::Args>),
    /// Copy live TCP sessions (or a capture's) to a test server without touching production
    /// (tcpcopy's job): reassembled and replayed over ordinary connections (relay mode), or
    /// with the clients' own addresses through a raw socket (--transparent, with intercept).
    /// SIGINT/SIGTERM or --duration: copies still running get at most 1 s, then the report;
    /// a second signal exits at once.
    Copy(copy::Args),
    /// For `copy --transparent`: catch the target's answers, on an assistant host (never
    /// forwarded) or on the target itself (--on-target: queued by a netfilter rule and
    /// dropped), and return their headers (and bytes, for `copy --diff`) to the copies over a
    /// control connection. SIGINT/SIGTERM or --duration: stops at once (on the target, after
    /// removing its rule) and prints the report; a second signal exits at once.
    Intercept(intercept::Args),
    /// One byte stream over several TCP connections, so every link of a bond or an ECMP
    /// route carries part of it (netcat striped, MPNC's job): `-l PORT` receives, `HOST PORT`
    /// sends; reordered within --window, verified with XXH3-128 end to end. Duplex as nc: the
    /// listener's stdin (or -i) goes back to the connecting side's stdout (or -o), verified
    /// too; an end of input always gives the peer EOF, and the connecting side waits for the
    /// listener's stream until it ends, as OpenBSD nc (-q SECS: at most SECS; -q 0: not at
    /// all). SIGINT/SIGTERM: stops at once, tells the peer why, and prints the report (exit 1:
    /// the stream is not complete); a second signal exits at once.
    Mpcat(mpcat::Args),
    /// Spread connect() calls to a virtual address over real servers, transparently: BPF
    /// cgroup socket hooks rewrite the address inside connect() (and getpeername() shows the
    /// VIP), so nothing is paid per packet afterwards.
    Balance(balance::Args),
    /// Start load and replay agents on many hosts at one instant, once every one is ready,
    /// and watch them (heartbeats every 250 ms, an agent lost after --lost-after silent, 10 s
    /// by default, or at once when its connection closes): one that cannot get ready or is lost stops the others, named
    /// (exit 1). SIGINT/SIGTERM: tells the agents to stop and prints the report (exit 1).
    Barrier(barrier::Args),
    /// Merge the --json reports of simultaneous runs into one and judge it: load reports
    /// (several client hosts, a fleet's agents) on one time axis, copy reports into one loss
    /// figure; --max-p99, --min-answered-rate, --max-loss ... judged on the whole.
    Merge(merge::Args),
    /// What stops this host from holding many connections (file-descriptor limits, queues,
    /// conntrack, ports, socket memory): each setting OK or CHANGE with the exact command;
    /// --apply makes the changes it can.
    Tune(tune::Args),
    /// Print the shell completion script for SHELL on stdout
    /// (e.g. `tcpkit completions bash > /etc/bash_completion.d/tcpkit`); interface flags
    /// (replay -i, copy -i, intercept --capture) complete with the host's interfaces.
    Completions(docs::CompletionsArgs),
    /// Write the man pages (tcpkit.1 and one per subcommand at every depth, tcpkit-replay.1,
    /// tcpkit-balance-run.1 ...) into DIR/man1/, e.g. `tcpkit man /usr/local/share/man`.
    Man(docs::ManArgs),
}

pub(crate) use common::{chain, Failure};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // --help and --version are not errors: clap prints them as it always does.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let known = |a: &String| Cli::command().get_subcommands().any(|c| c.get_name() == a);
            let sub = std::env::args().nth(1).filter(known);
            return common::usage_exit(&e, sub.as_deref());
        }
    };
    // A worker process (--procs) gets a terminal's Ctrl-C from its process group and again
    // from its parent, which forwards it: for a worker that is one stop, not a second signal.
    // The parent's own second signal still exits it at once, and its workers follow (they die
    // with their parent).
    let worker = match &cli.cmd {
        Cmd::Echo(a) => a.worker.is_some(),
        Cmd::Load(a) => a.worker.is_some(),
        _ => false,
    };
    let interrupted = common::install_signals(!worker);
    if worker {
        tcpkit_workers::stop_signals_ready();
    }
    let (name, result) = match cli.cmd {
        Cmd::Replay(args) => ("replay", replay::main(args, interrupted)),
        Cmd::Echo(args) => ("echo", echo::main(args, interrupted)),
        Cmd::Load(args) => ("load", load::main(*args, interrupted)),
        Cmd::Mpcat(args) => ("mpcat", mpcat::main(args, interrupted)),
        Cmd::Balance(args) => ("balance", balance::main(args, interrupted)),
        Cmd::Barrier(args) => ("barrier", barrier::main(args, interrupted)),
        Cmd::Merge(args) => ("merge", merge::main(args)),
        Cmd::Copy(args) => ("copy", copy::main(args, interrupted)),
        Cmd::Intercept(args) => ("intercept", intercept::main(args, interrupted)),
        Cmd::Tune(args) => ("tune", tune::main(args)),
        Cmd::Completions(args) => ("completions", docs::completions(args, Cli::command())),
        Cmd::Man(args) => ("man", docs::man(args, Cli::command())),
    };
    common::exit(name, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_lists_only_existing_subcommands() {
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "replay",
                "echo",
                "load",
                "copy",
                "intercept",
                "mpcat",
                "balance",
                "barrier",
                "merge",
                "tune",
                "completions",
                "man"
            ]
        );
    }
}
