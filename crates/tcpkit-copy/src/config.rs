//! The copy's settings and live counters, the same for every mode: the input loops
//! ([`crate::feed`]) and each mode read them, so they belong to neither.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::diff::DiffConfig;
use crate::sample::Sampler;
use crate::transfer::Rule;

/// What a copy does with the sessions it sees, in every mode (transparent mode adds its own
/// [`crate::transparent::TransparentConfig`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CopyConfig {
    pub rules: Vec<Rule>,
    /// `-n`: independent connections per session.
    pub copies: u32,
    pub sampler: Sampler,
    /// Start each connection with a PROXY v2 header naming the original client and server.
    pub proxy_protocol: bool,
    /// Send each request as soon as it is captured, without waiting for the target's answer.
    pub no_wait: bool,
    /// Only sessions whose SYN was seen.
    pub only_full: bool,
    /// Request bytes waiting for the target plus reassembly buffers, at most.
    pub max_memory: usize,
    /// How long a connect (with its retries) or an awaited answer may take.
    pub timeout_ns: u64,
    /// `--max-lag`: how far behind its client's schedule a session's copy may fall before it
    /// stops waiting out think times ([`crate::turns::ReqStart::send_at`]).
    pub max_lag_ns: u64,
    /// `--diff`: compare the target's answers with the original ones.
    pub diff: Option<DiffConfig>,
    /// `--max-loss`: the request loss ratio (percent) above which the run failed.
    pub max_loss_percent: f64,
    /// `-F`: a tcpdump expression the live capture must also match (tcpcopy's capture filter).
    pub filter: Option<String>,
    /// `--tls-keylog`: every session is TLS, decrypted with this NSS key log's secrets (read
    /// as it grows) before it is copied.
    pub tls_keylog: Option<std::path::PathBuf>,
    /// `--tls-uprobe`: every session is TLS, decrypted with the secrets these probes read
    /// from the server's TLS library at each handshake's end.
    pub tls_secrets: Option<SecretProbe>,
}

/// `--tls-uprobe PATH... [--pid PID]`: the libraries whose handshakes give the secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretProbe {
    pub targets: Vec<std::path::PathBuf>,
    pub pid: Option<u32>,
}

impl SecretProbe {
    /// Whether every target's OpenSSL version has a layout the probes know (else why not:
    /// the file and its version).
    pub fn layout_known(&self) -> Result<(), String> {
        tcpkit_tlsprobe::layout_of(&self.targets)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Counters every copy mode publishes for the live line (relaxed stores once per loop turn).
#[derive(Debug, Default)]
pub struct CopyCounters {
    pub sessions_seen: AtomicU64,
    pub copies: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub open: AtomicU64,
    pub requests_at_source: AtomicU64,
    pub requests_copied: AtomicU64,
    pub requests_answered: AtomicU64,
    /// Requests seen at the source that can no longer be answered (their copy ended first)
    /// or are past their `--timeout` unanswered: the live loss figure's numerator, so a
    /// request whose answer may still come does not count as lost while the run goes on. At
    /// the end it is at the source less answered.
    pub requests_lost: AtomicU64,
    pub kernel_drops: AtomicU64,
    pub held_bytes: AtomicU64,
    pub bytes_copied: AtomicU64,
    pub bytes_answered: AtomicU64,
    pub diff_compared: AtomicU64,
    pub diff_equal: AtomicU64,
    pub diff_different: AtomicU64,
}

impl CopyCounters {
    /// The request loss ratio (percent) of what can be judged so far: lost over seen.
    pub fn loss_percent(&self) -> f64 {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (seen, lost) = (g(&self.requests_at_source), g(&self.requests_lost));
        crate::report::loss_ratio_percent(seen, seen.saturating_sub(lost))
    }

    /// One line: sessions, requests with the loss ratio, capture drops, memory held.
    pub fn line(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (c, a) = (g(&self.requests_copied), g(&self.requests_answered));
        let loss = self.loss_percent();
        format!(
            "sessions {} seen, {} copies, {} open, {} completed, {} failed | requests {} copied, {} answered, loss {:.3} % | kernel drops {} | held {} KiB",
            g(&self.sessions_seen),
            g(&self.copies),
            g(&self.open),
            g(&self.completed),
            g(&self.failed),
            c,
            a,
            loss,
            g(&self.kernel_drops),
            g(&self.held_bytes) / 1024
        )
    }
}
