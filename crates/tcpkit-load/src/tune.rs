//! `tcpkit tune`: what stops this host, in its current network namespace, from holding N
//! connections as a server or a client, and the exact command that fixes each setting.
//!
//! The work is split so that the rules can be tested without touching a kernel: [`Facts`]
//! is a snapshot of the limits (read from `/proc/sys`, `getrlimit` and `/proc/self/status`
//! by [`Facts::read`]), [`evaluate`] turns facts into [`Check`]s (pure), [`apply`] writes the
//! sysctls that need a change, and [`TuneReport`] prints the result. [`hint`] is the one-line
//! advice `load` and `echo` give when they hit one of these limits.
//!
//! Sysctls are read under `/proc/sys` of the calling process: inside `ip netns exec` the
//! `net.*` entries are the namespace's own, and host-wide ones (`net.ipv4.tcp_mem`,
//! `net.core.netdev_max_backlog`) are not shown there at all, so they come out as
//! [`Status::Check`]: to be looked at on the host.

mod apply;
mod checks;
mod facts;
mod report;

use std::path::Path;

pub use apply::{apply, Applied, NotApplied};
pub use checks::{evaluate, fd_margin, Evaluation};
pub use facts::{Facts, PROC_SYS, SYSCTLS};
pub use report::{TuneReport, TUNE_SCHEMA_VERSION};

/// Connections `tcpkit tune` plans for when `--connections` is not given.
pub const DEFAULT_CONNECTIONS: u64 = 1_000_000;

/// Most connections `tcpkit tune` plans for: past this the arithmetic stops meaning anything
/// for one host (every estimate would be in terabytes).
pub const MAX_CONNECTIONS: u64 = 1_000_000_000;

/// Which end of the connections this host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Accepts the connections (`tcpkit echo`, a resolver, a broker).
    Server,
    /// Opens the connections (`tcpkit load`).
    Client,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// What to check for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuneConfig {
    pub role: Role,
    /// Connections this host must hold at once.
    pub connections: u64,
    /// The server's port: the NOTRACK rule is for this port only.
    pub port: u16,
}

/// The verdict on one setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Enough for the connections asked.
    Ok,
    /// Stops the host from holding them: run the command.
    Change,
    /// Not visible from here (a host-wide setting seen from inside a network namespace):
    /// look at it on the host.
    Check,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Change => "CHANGE",
            Status::Check => "CHECK",
        }
    }
}

/// How `--apply` can make a change, if it can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// Write `value` to the sysctl `key` (under `/proc/sys`).
    Sysctl { key: String, value: String },
    /// Nothing `tcpkit tune` can do from its own process; the reason says who can.
    Manual(String),
}

/// One setting: where it is, where it should be, why, and how to get there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The sysctl key, or `RLIMIT_NOFILE (soft)` / `RLIMIT_NOFILE (hard)`.
    pub setting: String,
    pub status: Status,
    /// The value now; `None` when it cannot be read from here.
    pub current: Option<String>,
    /// The value wanted (for `>=` settings, the least that will do).
    pub wanted: String,
    pub why: String,
    /// The exact shell command, for CHANGE (and for CHECK: how to read it on the host).
    pub command: Option<String>,
    /// What `--apply` does about a CHANGE.
    pub fix: Option<Fix>,
}

/// Reads the limits under `root` (normally [`PROC_SYS`]) and judges them; with `apply`,
/// makes the changes it can and reads everything again, so the verdict is about the host as
/// it is afterwards.
pub fn run(cfg: &TuneConfig, apply: bool, root: &Path) -> TuneReport {
    let found = evaluate(cfg, &Facts::read(root));
    let applied = apply.then(|| {
        let (done, not) = apply::apply(&found.checks, root);
        (done, not, evaluate(cfg, &Facts::read(root)))
    });
    TuneReport {
        config: *cfg,
        found,
        applied,
        json: false,
    }
}

/// A limit `load` or `echo` ran into, for [`hint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// EMFILE/ENFILE: out of file descriptors.
    Nofile,
    /// EADDRNOTAVAIL: out of local ports for one source address and server address:port.
    Ports,
    /// Connects time out or the kernel warns of a SYN flood: the SYN or accept queue is full.
    SynBacklog,
    /// New connections dropped with "nf_conntrack: table full".
    Conntrack,
}

/// One line of advice for a limit that was hit, with the numbers of this process and
/// namespace, ending with the `tcpkit tune` command that explains more. `role` is the role of
/// the caller (`load`: client, `echo`: server).
pub fn hint(limit: Limit, role: Role) -> String {
    hint_with(limit, role, &Facts::read(Path::new(PROC_SYS)))
}

/// [`hint`] from given facts (testable without the kernel's values).
pub fn hint_with(limit: Limit, role: Role, f: &Facts) -> String {
    let tune = format!("tcpkit tune --role {}", role.name());
    let or_unknown = |v: Option<&str>| v.unwrap_or("unknown").to_string();
    match limit {
        Limit::Nofile => format!(
            "out of file descriptors (limit {} per process): raise it or use --procs ({tune})",
            facts::limit_text(f.nofile_soft)
        ),
        Limit::Ports => match f.port_range() {
            Some((lo, hi)) => format!(
                "out of local ports (net.ipv4.ip_local_port_range {lo}-{hi}: {} per source address and server address:port): add --source addresses or widen the range ({tune})",
                u64::from(hi - lo) + 1
            ),
            None => format!("out of local ports: add --source addresses or widen net.ipv4.ip_local_port_range ({tune})"),
        },
        Limit::SynBacklog => format!(
            "connects time out or SYNs overflow (net.core.somaxconn {}, net.ipv4.tcp_max_syn_backlog {}): raise them on the server, or lower --connect-rate (tcpkit tune --role server)",
            or_unknown(f.get("net.core.somaxconn")),
            or_unknown(f.get("net.ipv4.tcp_max_syn_backlog")),
        ),
        Limit::Conntrack => format!(
            "conntrack table full (net.netfilter.nf_conntrack_max {}): raise it or exempt the port with a NOTRACK rule ({tune})",
            or_unknown(f.get("net.netfilter.nf_conntrack_max")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_quote_the_numbers_and_the_tune_command() {
        let f = Facts::fixture(&[
            ("net.ipv4.ip_local_port_range", "40000\t40999"),
            ("net.core.somaxconn", "128"),
            ("net.ipv4.tcp_max_syn_backlog", "256"),
            ("net.netfilter.nf_conntrack_max", "65536"),
        ]);
        assert_eq!(
            hint_with(Limit::Nofile, Role::Client, &f),
            "out of file descriptors (limit 20000 per process): raise it or use --procs (tcpkit tune --role client)"
        );
        assert_eq!(
            hint_with(Limit::Ports, Role::Client, &f),
            "out of local ports (net.ipv4.ip_local_port_range 40000-40999: 1000 per source address and server address:port): add --source addresses or widen the range (tcpkit tune --role client)"
        );
        assert_eq!(
            hint_with(Limit::SynBacklog, Role::Client, &f),
            "connects time out or SYNs overflow (net.core.somaxconn 128, net.ipv4.tcp_max_syn_backlog 256): raise them on the server, or lower --connect-rate (tcpkit tune --role server)"
        );
        assert_eq!(
            hint_with(Limit::Conntrack, Role::Server, &f),
            "conntrack table full (net.netfilter.nf_conntrack_max 65536): raise it or exempt the port with a NOTRACK rule (tcpkit tune --role server)"
        );
        let empty = Facts::fixture(&[]);
        assert!(hint_with(Limit::Ports, Role::Client, &empty).starts_with("out of local ports: "));
        assert!(
            hint_with(Limit::Conntrack, Role::Client, &empty).contains("nf_conntrack_max unknown")
        );
    }

    #[test]
    fn hint_reads_this_process() {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let h = hint(Limit::Nofile, Role::Server);
        assert!(
            h.contains(&format!(
                "(limit {} per process)",
                facts::limit_text(lim.rlim_cur)
            )),
            "{h}"
        );
    }
}
