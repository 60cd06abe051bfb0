//! What `balance run` reports: the service, each backend's connects, what the programs
//! counted, and how the command ended. The summary goes to stderr (as time(1)'s does: stdout
//! is the command's); `--json` puts one document on stdout (docs/schema/balance.schema.json).

use std::fmt::Write;

use serde::Serialize;
use tcpkit_stats::{Report, Verdict};

#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub addr: String,
    pub weight: u32,
    /// Connects the BPF program sent to this backend.
    pub connects: u64,
    /// Of those, the sockets still open when the command ended (its children's, left
    /// running): 0 once everything it opened was closed.
    pub active: u64,
    /// Health at the end (null without health checks).
    pub up: Option<bool>,
    /// Health probes sent, and how many failed.
    pub probes: u64,
    pub probes_failed: u64,
    /// Times it was marked down.
    pub downs: u64,
    /// Sockets `--drain-kill` ended when it went down.
    pub drained: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServiceReport {
    pub vip: String,
    pub algorithm: &'static str,
    /// What maglev hashes (`client`, `host` or `cookie`); null for the other algorithms.
    pub hash_key: Option<&'static str>,
    /// Seconds a client keeps its backend after its last connect (--persistent); null: off.
    pub persistence_s: Option<f64>,
    pub backends: Vec<BackendReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CommandReport {
    pub argv: Vec<String>,
    pub pid: u32,
    /// The exit code, when the command exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// What `balance run` exits with: the code, or 128 + the signal.
    pub status: u8,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Changes when a field changes meaning or disappears.
    pub schema_version: u32,
    /// Which subcommand made the report.
    pub mode: &'static str,
    pub command: CommandReport,
    /// The cgroup the command ran in (removed at the end).
    pub cgroup: String,
    /// Whether cgroup2 had to be mounted privately (none was visible, e.g. under `ip netns exec`).
    pub private_mount: bool,
    pub elapsed_s: f64,
    pub services: Vec<ServiceReport>,
    /// Connects to a VIP sent to a backend.
    pub translated: u64,
    /// Connects to a VIP refused (ECONNREFUSED) because it had no backend.
    pub refused: u64,
    /// getpeername() calls answered with the VIP, and datagrams received from a backend shown
    /// as the VIP's (recvmsg).
    pub getpeername_vip: u64,
    /// Sockets found no longer on the backend they were sent to (their entry dropped).
    pub stale: u64,
    /// --trace events lost (the ring buffer was full).
    pub trace_lost: u64,
    /// Set when the run was stopped by SIGINT/SIGTERM (forwarded to the command).
    pub interrupted: bool,
}

impl Report for RunReport {
    fn human(&self) -> String {
        let mut s = String::new();
        for svc in &self.services {
            let algo = match svc.hash_key {
                Some(k) => format!("{} by {k}", svc.algorithm),
                None => svc.algorithm.to_string(),
            };
            let _ = writeln!(
                s,
                "Service: {} ({}, {} backend{})",
                svc.vip,
                algo,
                svc.backends.len(),
                if svc.backends.len() == 1 { "" } else { "s" }
            );
            for b in &svc.backends {
                let health = match b.up {
                    Some(up) => {
                        format!(
                            ", {} at end, {} probes ({} failed), down {} time{}",
                            if up { "up" } else { "down" },
                            b.probes,
                            b.probes_failed,
                            b.downs,
                            if b.downs == 1 { "" } else { "s" }
                        ) + &if b.drained > 0 {
                            format!(", {} sockets ended (--drain-kill)", b.drained)
                        } else {
                            String::new()
                        }
                    }
                    None => String::new(),
                };
                let _ = writeln!(
                    s,
                    "  {:<24} weight {:<4} {} connects, {} open at end{health}",
                    b.addr, b.weight, b.connects, b.active
                );
            }
        }
        let _ = writeln!(
            s,
            "Connects: {} translated, {} refused (no backend); getpeername/recvmsg: {} shown the VIP, {} stale",
            self.translated, self.refused, self.getpeername_vip, self.stale
        );
        let how = match (self.command.code, self.command.signal) {
            (Some(c), _) => format!("exited {c}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => "ended".to_string(),
        };
        let _ = writeln!(
            s,
            "Command: {} {} after {:.3} s in cgroup {}{}",
            self.command.argv.first().map(String::as_str).unwrap_or(""),
            how,
            self.elapsed_s,
            self.cgroup,
            if self.private_mount {
                " (cgroup2 mounted privately)"
            } else {
                ""
            }
        );
        s
    }

    fn json(&self) -> String {
        tcpkit_stats::to_json(self)
    }

    fn verdict(&self) -> Verdict {
        // The command's own status is the exit status (`run -- CMD`); the balancer did its part.
        Verdict::Done
    }
}
