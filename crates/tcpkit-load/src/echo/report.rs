//! What `tcpkit echo` prints at exit: the human summary and the `--json` document
//! (docs/schema/echo.schema.json), and the merge of worker processes' reports into one.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use tcpkit_stats::{Report, Verdict};

use super::{EchoConfig, Mode, Totals};

/// Changes when a field changes meaning or disappears.
pub const ECHO_SCHEMA_VERSION: u32 = 1;

/// One run of `tcpkit echo` (all processes and threads together).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoReport {
    pub schema_version: u32,
    /// "echo" or "dns".
    pub mode: String,
    /// Addresses listened on, as bound.
    pub listen: Vec<String>,
    pub processes: u32,
    /// Event-loop threads over all processes.
    pub threads: u32,
    /// RLIMIT_NOFILE of each process after raising it to the hard limit.
    pub fd_limit: u64,
    /// The connection cap (--max-conns, or what the descriptor limit allows), summed over
    /// processes.
    pub max_conns: u64,
    /// Wall-clock seconds served (the longest process).
    pub seconds: f64,
    pub accepted: u64,
    pub closed: u64,
    /// Connections still open when the server stopped.
    pub open_at_exit: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// DNS queries answered (0 in echo mode).
    pub answered: u64,
    /// Connections closed for a malformed or oversized DNS query.
    pub malformed: u64,
    /// accept() failures other than running out of descriptors.
    pub accept_errors: u64,
    /// accept() calls that failed with EMFILE/ENFILE (each followed by a short pause).
    pub fd_exhausted: u64,
    /// The OS error of a failed accept (the last one seen), if any failed.
    pub accept_error: Option<String>,
    /// DNS mode: connections closed for holding the start of a query past --partial-timeout.
    pub partial_timeouts: u64,
    /// Connections closed past --partial-timeout with answers they had not read: the client
    /// stopped reading, so echo stopped reading it (what it had sent is no partial query of
    /// its making). Absent from reports of builds before it (read as 0).
    #[serde(default)]
    pub unread_timeouts: u64,
    /// Connections closed, once the server had been full, for sending no first message
    /// within --first-timeout.
    pub first_timeouts: u64,
    /// Connections that had sent nothing, closed at the cap to make room for a newcomer.
    pub evicted: u64,
    /// Newcomers closed at once at the cap, every connection having spoken.
    pub over_cap: u64,
    /// "duration" or "signal".
    pub stopped_by: String,
    /// `--tls`: handshakes done and failed; absent in clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<EchoTls>,
}

/// echo's TLS counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoTls {
    pub handshakes: EchoHandshakes,
    /// Failed handshakes by reason (`unknown_ca` when a client refused this certificate,
    /// `handshake_timeout` past --tls-handshake-timeout, `reset`, ...).
    pub failures: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoHandshakes {
    pub full: u64,
    pub resumed: u64,
    pub failed: u64,
}

impl EchoTls {
    fn of(t: &Totals) -> EchoTls {
        let failures: std::collections::BTreeMap<String, u64> = tcpkit_tls::Reason::ALL
            .iter()
            .zip(t.tls_failed)
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (r.as_str().to_string(), n))
            .collect();
        EchoTls {
            handshakes: EchoHandshakes {
                full: t.tls_full,
                resumed: t.tls_resumed,
                failed: failures.values().sum(),
            },
            failures,
        }
    }

    fn add(&mut self, o: &EchoTls) {
        self.handshakes.full += o.handshakes.full;
        self.handshakes.resumed += o.handshakes.resumed;
        self.handshakes.failed += o.handshakes.failed;
        for (k, v) in &o.failures {
            *self.failures.entry(k.clone()).or_insert(0) += v;
        }
    }
}

/// What bounded one process: its descriptor limit and its connection cap.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub fd_limit: u64,
    pub max_conns: u64,
}

impl EchoReport {
    pub(super) fn new(
        cfg: &EchoConfig,
        listen: &[SocketAddr],
        threads: u32,
        Limits {
            fd_limit,
            max_conns,
        }: Limits,
        seconds: f64,
        t: &Totals,
        stopped_by: &str,
    ) -> EchoReport {
        EchoReport {
            schema_version: ECHO_SCHEMA_VERSION,
            mode: match cfg.mode {
                Mode::Echo => "echo",
                Mode::Dns { .. } => "dns",
                Mode::Http { .. } => "http",
            }
            .into(),
            listen: listen.iter().map(ToString::to_string).collect(),
            processes: 1,
            threads,
            fd_limit,
            max_conns,
            seconds,
            accepted: t.accepted,
            closed: t.closed,
            open_at_exit: t.open(),
            bytes_in: t.bytes_in,
            bytes_out: t.bytes_out,
            answered: t.answered,
            malformed: t.malformed,
            accept_errors: t.accept_errors,
            fd_exhausted: t.fd_exhausted,
            accept_error: (t.accept_errno != 0)
                .then(|| std::io::Error::from_raw_os_error(t.accept_errno as i32).to_string()),
            partial_timeouts: t.partial_timeouts,
            unread_timeouts: t.unread_timeouts,
            first_timeouts: t.first_timeouts,
            evicted: t.evicted,
            over_cap: t.over_cap,
            stopped_by: stopped_by.into(),
            tls: cfg.tls.as_ref().map(|_| EchoTls::of(t)),
        }
    }

    /// One report from several processes' reports: counts add up, time is the longest, the
    /// fd limit is the smallest (the one that binds), and a signal to any process is a
    /// signal to the run. None for an empty list.
    pub fn merge(parts: &[EchoReport]) -> Option<EchoReport> {
        let (first, rest) = parts.split_first()?;
        let mut m = first.clone();
        for r in rest {
            m.processes += r.processes;
            m.threads += r.threads;
            m.fd_limit = m.fd_limit.min(r.fd_limit);
            m.max_conns += r.max_conns;
            m.seconds = m.seconds.max(r.seconds);
            m.accepted += r.accepted;
            m.closed += r.closed;
            m.open_at_exit += r.open_at_exit;
            m.bytes_in += r.bytes_in;
            m.bytes_out += r.bytes_out;
            m.answered += r.answered;
            m.malformed += r.malformed;
            m.accept_errors += r.accept_errors;
            m.fd_exhausted += r.fd_exhausted;
            m.partial_timeouts += r.partial_timeouts;
            m.unread_timeouts += r.unread_timeouts;
            m.first_timeouts += r.first_timeouts;
            m.evicted += r.evicted;
            m.over_cap += r.over_cap;
            if m.accept_error.is_none() {
                m.accept_error.clone_from(&r.accept_error);
            }
            if let (Some(a), Some(b)) = (m.tls.as_mut(), &r.tls) {
                a.add(b);
            }
            if r.stopped_by == "signal" {
                m.stopped_by = r.stopped_by.clone();
            }
        }
        Some(m)
    }
}

impl Report for EchoReport {
    /// One line of JSON (workers print it for their parent; `--json` prints it).
    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The human summary.
    fn human(&self) -> String {
        let mut s = format!(
            "Connections: {} accepted, {} closed, {} open at exit\nBytes: {} in, {} out\n",
            self.accepted, self.closed, self.open_at_exit, self.bytes_in, self.bytes_out
        );
        if self.mode == "dns" {
            s.push_str(&format!(
                "DNS: {} queries answered, {} connections closed for a malformed query\n",
                self.answered, self.malformed
            ));
            if self.partial_timeouts > 0 {
                s.push_str(&format!(
                    "DNS: {} connections closed holding a partial query past --partial-timeout\n",
                    self.partial_timeouts
                ));
            }
        }
        if self.unread_timeouts > 0 {
            s.push_str(&format!(
                "Clients that stopped reading: {} connections closed with answers unread past --partial-timeout\n",
                self.unread_timeouts
            ));
        }
        if let Some(t) = &self.tls {
            let h = &t.handshakes;
            s.push_str(&format!(
                "TLS handshakes: {} full, {} resumed, {} failed",
                h.full, h.resumed, h.failed
            ));
            if !t.failures.is_empty() {
                let f: Vec<String> = t.failures.iter().map(|(k, v)| format!("{k} {v}")).collect();
                s.push_str(&format!(" ({})", f.join(", ")));
            }
            s.push('\n');
        }
        if self.first_timeouts + self.evicted + self.over_cap > 0 {
            s.push_str(&format!(
                "Silent connections: {} closed past --first-timeout, {} evicted at the cap for newcomers; {} newcomers refused at the cap\n",
                self.first_timeouts, self.evicted, self.over_cap
            ));
        }
        s.push_str(&format!(
            "Accept failures: {} ({} for lack of file descriptors)",
            self.accept_errors + self.fd_exhausted,
            self.fd_exhausted
        ));
        if let Some(e) = &self.accept_error {
            s.push_str(&format!("; last: {e}"));
        }
        s.push('\n');
        let plural =
            |n: u32, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        s.push_str(&format!(
            "Served {:.3} seconds on {} ({}, {}, fd limit {}, cap {} connections); stopped by {}\n",
            self.seconds,
            self.listen.join(" "),
            plural(self.processes, "process", "processes"),
            plural(self.threads, "thread", "threads"),
            self.fd_limit,
            self.max_conns,
            self.stopped_by
        ));
        s
    }

    /// A server stopped by its operator (a signal) or by --duration has done its job; what
    /// went wrong on the way (accept failures, malformed queries) is counted in the report.
    fn verdict(&self) -> Verdict {
        Verdict::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EchoReport {
        EchoReport {
            schema_version: 1,
            mode: "dns".into(),
            listen: vec!["[::]:4242".into()],
            processes: 1,
            threads: 2,
            fd_limit: 20000,
            max_conns: 19978,
            seconds: 10.0004,
            accepted: 1000,
            closed: 990,
            open_at_exit: 10,
            bytes_in: 123_456,
            bytes_out: 234_567,
            answered: 5000,
            malformed: 1,
            accept_errors: 2,
            fd_exhausted: 3,
            accept_error: None,
            partial_timeouts: 0,
            unread_timeouts: 0,
            first_timeouts: 0,
            evicted: 0,
            over_cap: 0,
            stopped_by: "signal".into(),
            tls: None,
        }
    }

    #[test]
    fn human_summary_exact_text() {
        assert_eq!(
            sample().human(),
            "Connections: 1000 accepted, 990 closed, 10 open at exit\n\
             Bytes: 123456 in, 234567 out\n\
             DNS: 5000 queries answered, 1 connections closed for a malformed query\n\
             Accept failures: 5 (3 for lack of file descriptors)\n\
             Served 10.000 seconds on [::]:4242 (1 process, 2 threads, fd limit 20000, cap 19978 connections); stopped by signal\n"
        );
        // What the bounds did, and the OS error of the accepts that failed.
        let mut b = sample();
        b.first_timeouts = 19000;
        b.evicted = 23;
        b.accept_error = Some("Too many open files (os error 24)".into());
        b.unread_timeouts = 2;
        assert_eq!(
            b.human(),
            "Connections: 1000 accepted, 990 closed, 10 open at exit\n\
             Bytes: 123456 in, 234567 out\n\
             DNS: 5000 queries answered, 1 connections closed for a malformed query\n\
             Clients that stopped reading: 2 connections closed with answers unread past --partial-timeout\n\
             Silent connections: 19000 closed past --first-timeout, 23 evicted at the cap for newcomers; 0 newcomers refused at the cap\n\
             Accept failures: 5 (3 for lack of file descriptors); last: Too many open files (os error 24)\n\
             Served 10.000 seconds on [::]:4242 (1 process, 2 threads, fd limit 20000, cap 19978 connections); stopped by signal\n"
        );
        let mut e = sample();
        e.mode = "echo".into();
        e.processes = 2;
        assert!(!e.human().contains("DNS:"));
        assert!(e.human().contains("(2 processes, 2 threads"));
        e.threads = 1;
        assert!(e.human().contains("(2 processes, 1 thread, fd limit"));
    }

    #[test]
    fn merge_adds_counts_and_keeps_the_binding_limit() {
        let a = sample();
        let mut b = sample();
        b.fd_limit = 1024;
        b.max_conns = 1000;
        b.seconds = 11.0;
        b.stopped_by = "duration".into();
        b.evicted = 5;
        b.over_cap = 1;
        b.first_timeouts = 7;
        b.unread_timeouts = 3;
        b.accept_error = Some("Too many open files (os error 24)".into());
        let m = EchoReport::merge(&[a.clone(), b]).unwrap();
        assert_eq!((m.processes, m.threads), (2, 4));
        assert_eq!((m.accepted, m.answered, m.fd_exhausted), (2000, 10000, 6));
        assert_eq!((m.evicted, m.over_cap, m.first_timeouts), (5, 1, 7));
        assert_eq!((m.partial_timeouts, m.unread_timeouts), (0, 3));
        assert_eq!(m.max_conns, 20978);
        assert_eq!(
            m.accept_error.as_deref(),
            Some("Too many open files (os error 24)")
        );
        assert_eq!(m.fd_limit, 1024);
        assert_eq!(m.seconds, 11.0);
        assert_eq!(m.stopped_by, "signal");
        assert_eq!(EchoReport::merge(std::slice::from_ref(&a)).unwrap(), a);
        assert!(EchoReport::merge(&[]).is_none());
    }

    #[test]
    fn json_round_trips() {
        let a = sample();
        let back: EchoReport = serde_json::from_str(&a.json()).unwrap();
        assert_eq!(back, a);
        assert!(!a.json().contains('\n'));
    }
}
