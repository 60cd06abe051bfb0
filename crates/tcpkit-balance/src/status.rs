//! What `balance status` shows (and `balance up` reports when it stops): per service its VIP
//! and algorithm, per backend its weight, health, last change, the sockets open on it now and
//! the connects sent to it (per-CPU counters, summed), and the kernel features found. One JSON document
//! (docs/schema/balance-status.schema.json), or a table in the style of
//! `ipvsadm -Ln --stats`.

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use tcpkit_stats::{Report, Verdict};

use crate::control::ControlStats;
use crate::features::Feature;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    pub addr: String,
    pub weight: u32,
    /// `up`, `down`, or `unchecked` (the service has no health checks: always used).
    pub health: String,
    /// Seconds since it last went up or down (since it was configured, if never).
    pub changed_s: f64,
    /// Connects (and unconnected UDP sockets) the BPF programs sent to it.
    pub connections: u64,
    /// Of those, the sockets open now (ipvsadm's ActiveConn: sent there and not yet closed).
    pub active: u64,
    pub probes: u64,
    pub probes_failed: u64,
    /// Times it was marked down.
    pub downs: u64,
    /// Why the last probe failed, while it is down (null when up or unchecked).
    pub down_reason: Option<String>,
    /// Sockets `--drain-kill` ended when it went down.
    pub drained: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    pub name: String,
    pub vip: String,
    /// `tcp`, `udp`, or `tcp+udp`.
    pub protocol: String,
    pub algorithm: String,
    /// What maglev hashes (`client`, `host` or `cookie`); null for the other algorithms.
    pub hash_key: Option<String>,
    /// Seconds a client keeps its backend after its last connect (ipvsadm -p); null: off.
    pub persistence_s: Option<f64>,
    /// How its backends are probed (`health::Probe::kind`); null without health checks.
    pub probe: Option<String>,
    pub backends: Vec<BackendStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Changes when a field changes meaning or disappears.
    pub schema_version: u32,
    /// `status` (asked of a running `up`) or `up` (its report when it stopped).
    pub mode: String,
    pub pid: u32,
    pub config: String,
    /// The cgroup the programs are attached to, as this process sees it.
    pub cgroup: String,
    pub uptime_s: f64,
    /// Configurations taken by SIGHUP or `balance reload`, and those refused.
    pub reloads: u64,
    pub reloads_refused: u64,
    pub services: Vec<ServiceStatus>,
    pub translated: u64,
    pub refused: u64,
    pub getpeername_vip: u64,
    pub stale: u64,
    pub trace_lost: u64,
    /// Where the links and maps are pinned (`--pin DIR`): they outlive the process until
    /// `balance down`. Null without it.
    pub pin: Option<String>,
    /// `--drain-kill`'s choice (`udp`, `tcp`, `all`); null without it.
    pub drain_kill: Option<String>,
    /// Sockets `--drain-kill` ended, for every backend (those removed by a reload included).
    pub drained: u64,
    /// The socket-address hooks attached now (`connect4`, ...): the UDP ones only while a
    /// service balances UDP.
    pub hooks: Vec<String>,
    pub features: Vec<Feature>,
    /// What the control socket met (requests answered, peers turned away).
    pub control: ControlStats,
    /// `up`'s report only: whether it stopped because of SIGINT/SIGTERM.
    pub interrupted: bool,
}

/// "12s", "3m04s", "2h05m": how long ago, as ipvsadm-style tables show it.
pub fn ago(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

fn scheduler(s: &ServiceStatus) -> String {
    // ipvsadm's short names where it has one; weighted-random has none (ipvs has no random
    // scheduler), so it is never shown as wrr.
    let short = match s.algorithm.as_str() {
        "round-robin" => "rr",
        "weighted-random" => "wrand",
        "weighted-round-robin" => "wrr",
        "least-conn" => "lc",
        "weighted-least-conn" => "wlc",
        "maglev" => "mh",
        other => other,
    };
    match &s.hash_key {
        Some(k) => format!("{short}:{k}"),
        None => short.to_string(),
    }
}

impl Report for StatusReport {
    fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "tcpkit balance up (pid {}), config {}, cgroup {}, up {}, {} reload{} ({} refused)",
            self.pid,
            self.config,
            self.cgroup,
            ago(self.uptime_s),
            self.reloads,
            if self.reloads == 1 { "" } else { "s" },
            self.reloads_refused
        );
        let _ = writeln!(
            s,
            "{:<4} {:<33} {:<24} {:>10} {:>9}",
            "Prot", "LocalAddress:Port", "Scheduler", "ActiveConn", "Conns"
        );
        let _ = writeln!(
            s,
            "  -> {:<31} {:<6} {:<9} {:>11} {:>10} {:>9} {:>8} {:>6}",
            "RemoteAddress:Port",
            "Weight",
            "Health",
            "Changed",
            "ActiveConn",
            "Conns",
            "Probes",
            "Failed"
        );
        for svc in &self.services {
            let total: u64 = svc.backends.iter().map(|b| b.connections).sum();
            let active: u64 = svc.backends.iter().map(|b| b.active).sum();
            let sched = match svc.persistence_s {
                // ipvsadm's way: seconds.
                Some(p) => format!("{} persistent {p}", scheduler(svc)),
                None => scheduler(svc),
            };
            let _ = writeln!(
                s,
                "{:<4} {:<33} {:<24} {:>10} {:>9}  {}{}",
                svc.protocol.to_uppercase(),
                svc.vip,
                sched,
                active,
                total,
                if svc.name != svc.vip {
                    svc.name.as_str()
                } else {
                    ""
                },
                match &svc.probe {
                    Some(p) => format!(" (probe {p})"),
                    None => String::new(),
                }
            );
            for b in &svc.backends {
                let _ = writeln!(
                    s,
                    "  -> {:<31} {:<6} {:<9} {:>7} ago {:>10} {:>9} {:>8} {:>6}",
                    b.addr,
                    b.weight,
                    b.health,
                    ago(b.changed_s),
                    b.active,
                    b.connections,
                    b.probes,
                    b.probes_failed
                );
                if let Some(why) = &b.down_reason {
                    let _ = writeln!(s, "       down: {why}");
                }
            }
        }
        let _ = writeln!(
            s,
            "Connects: {} translated, {} refused (no backend); getpeername/recvmsg: {} shown the VIP, {} stale; trace lost {}",
            self.translated, self.refused, self.getpeername_vip, self.stale, self.trace_lost
        );
        if let Some(w) = &self.drain_kill {
            let _ = writeln!(
                s,
                "Drain-kill ({w}): {} sockets ended on backends that went down or left",
                self.drained
            );
        }
        if let Some(p) = &self.pin {
            let _ = writeln!(
                s,
                "Pinned at {p}: the balancing stays after this process ends, until tcpkit balance down --pin {p}"
            );
        }
        let c = &self.control;
        let _ = writeln!(
            s,
            "Control socket: {} answered, {} turned away (busy), {} timed out, {} bad, {} out of descriptors",
            c.answered, c.refused_busy, c.timed_out, c.bad, c.out_of_fds
        );
        let _ = writeln!(
            s,
            "Hooks attached: {}{}",
            self.hooks.join(" "),
            if self.hooks.iter().any(|h| h.starts_with("sendmsg")) {
                ""
            } else {
                " (sendmsg/recvmsg off: no UDP service)"
            }
        );
        let _ = writeln!(s, "Kernel features:");
        for f in &self.features {
            let _ = writeln!(
                s,
                "  {:<22} {:<6} {:<4}{}",
                f.name,
                f.kind,
                if f.present { "yes" } else { "NO" },
                if f.present {
                    String::new()
                } else {
                    format!("  without it: {}", f.without)
                }
            );
        }
        s
    }

    fn json(&self) -> String {
        tcpkit_stats::to_json(self)
    }

    fn verdict(&self) -> Verdict {
        Verdict::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ago_reads_as_ipvsadm_users_expect() {
        assert_eq!(ago(0.4), "0s");
        assert_eq!(ago(59.9), "59s");
        assert_eq!(ago(184.0), "3m04s");
        assert_eq!(ago(7500.0), "2h05m");
    }

    #[test]
    fn the_table_has_a_line_per_backend_and_feature() {
        let r = StatusReport {
            schema_version: 1,
            mode: "status".into(),
            pid: 7,
            config: "lb.toml".into(),
            cgroup: "/sys/fs/cgroup".into(),
            uptime_s: 12.0,
            reloads: 1,
            reloads_refused: 0,
            services: vec![ServiceStatus {
                name: "redis".into(),
                vip: "198.19.0.1:6379".into(),
                protocol: "tcp".into(),
                algorithm: "round-robin".into(),
                hash_key: None,
                persistence_s: None,
                probe: Some("tcp-send-expect".into()),
                backends: vec![BackendStatus {
                    addr: "198.18.0.2:6379".into(),
                    weight: 1,
                    health: "up".into(),
                    changed_s: 12.0,
                    connections: 10,
                    active: 4,
                    probes: 12,
                    probes_failed: 0,
                    downs: 0,
                    down_reason: None,
                    drained: 0,
                }],
            }],
            translated: 10,
            refused: 0,
            getpeername_vip: 10,
            stale: 0,
            trace_lost: 0,
            drain_kill: Some("all".into()),
            pin: None,
            drained: 3,
            hooks: vec!["connect4".into(), "connect6".into()],
            features: vec![Feature {
                name: "bpf_sock_destroy".into(),
                kind: "kfunc".into(),
                present: false,
                without: "x".into(),
            }],
            control: ControlStats::default(),
            interrupted: false,
        };
        let h = r.human();
        assert!(h.contains("TCP  198.19.0.1:6379"), "{h}");
        // ActiveConn (open now) beside Conns (since start), per service and backend.
        assert!(
            h.contains(&format!("rr{}4{}10", " ".repeat(32), " ".repeat(8))),
            "{h}"
        );
        assert!(h.contains("ActiveConn"), "{h}");
        let m = crate::up::exposition(&r);
        assert!(
            m.contains("tcpkit_balance_backend_active_connections{service=\"redis\",vip=\"198.19.0.1:6379\",protocol=\"tcp\",backend=\"198.18.0.2:6379\"} 4\n"),
            "{m}"
        );
        assert!(h.contains("  -> 198.18.0.2:6379"), "{h}");
        assert!(h.contains("up        "), "{h}");
        assert!(h.contains("Drain-kill (all): 3 sockets ended"), "{h}");
        assert!(
            h.contains("Hooks attached: connect4 connect6 (sendmsg/recvmsg off: no UDP service)\n"),
            "{h}"
        );
        assert!(
            h.contains("bpf_sock_destroy       kfunc  NO    without it: x"),
            "{h}"
        );
        let back: StatusReport = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(back, r);
    }
}
