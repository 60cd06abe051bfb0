//! The `copy` report: sessions seen, copied, completed and failed by cause; requests and bytes
//! copied and answered with tcpcopy's request loss ratio; the original servers' latency beside
//! the target's; what the capture lost (kernel drops are never hidden); memory. The JSON form
//! is docs/schema/copy.schema.json.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use tcpkit_stats::{fmt_ns, to_json, Percentiles, Report, Verdict};

/// Bumped whenever a JSON field changes meaning or disappears (docs/schema/copy.schema.json).
pub const COPY_SCHEMA_VERSION: u32 = 1;

/// Everything a copy run reports. Field names are the `--json` contract.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CopyReport {
    /// [`COPY_SCHEMA_VERSION`] when written: which layout of this document a reader holds.
    pub schema_version: u32,
    /// `relay`.
    pub mode: String,
    /// `live IFACE` or `file PATH`.
    pub source: String,
    /// The kernel filter expression of a live capture (empty offline).
    pub filter: String,
    /// The `-x` rules, one per entry.
    pub rules: Vec<String>,
    /// `-n`: independent copies of each session.
    pub copies_per_session: u32,
    /// `-r`: percentage of sessions copied.
    pub sample_percent: f64,
    /// How long the copy ran.
    pub seconds: f64,
    /// What became of the client sessions seen: copied, completed, failed by cause.
    pub sessions: SessionStats,
    /// Requests and bytes copied and answered, and tcpcopy's request loss ratio.
    pub requests: RequestStats,
    /// The original servers' answer latency beside the target's.
    pub latency: LatencyStats,
    /// What the capture read and lost.
    pub capture: CaptureStats,
    /// The memory limit and what was held under it.
    pub memory: MemoryStats,
    /// The nice value the copy ran at (`--nice`).
    pub nice: i32,
    /// `--diff`: the target's answers compared with the original server's (absent without it).
    pub diff: Option<DiffStats>,
    /// Transparent mode's own figures (absent in relay mode, and then not in the JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transparent: Option<TransparentStats>,
    /// TLS (issue 27): where the plaintext came from and what became of the TLS sessions;
    /// toward the target with `--target-tls`. Absent without a TLS flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsStats>,
    /// Why the run failed (exit status 1); absent when it did what was asked.
    pub failure: Option<String>,
}

/// Transparent mode: the control connection to intercept and the client TCP copy plays.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TransparentStats {
    /// intercept's control address.
    pub intercept: String,
    /// `-c`: the prefix client addresses were moved into (empty: the clients' own).
    pub client_addr: String,
    /// Copies failed because the control connection was lost while they ran (their answers
    /// could no longer be seen); they count among the failed sessions.
    pub control_lost: u64,
    /// Times the control connection was lost.
    pub control_losses: u64,
    /// Times it was (re)established after a loss.
    pub control_reconnects: u64,
    /// The target's answers (headers) received from intercept.
    pub answers_received: u64,
    /// Segments sent to the targets through the raw socket.
    pub segments_sent: u64,
    /// Of those, retransmissions (an RTO passed without an acknowledgement).
    pub retransmitted_segments: u64,
    /// Segments the raw socket refused (retransmitted later).
    pub send_errors: u64,
    /// Ports passed over because their 4-tuple was in use by another copy.
    pub port_collisions: u64,
    /// Copies not made because every port of the pool was in use (counted as shed).
    pub ports_exhausted: u64,
    /// Copies whose SYN the target answered for another connection on the same 4-tuple
    /// (another copy's, from an online host that saw the same client address and port; or
    /// one the target still held): each left that tuple without a RST and was copied from a
    /// port of the pool instead.
    pub tuple_in_use: u64,
    /// Copies of sessions open before copying started, given a handshake of their own.
    pub synthesized_handshakes: u64,
}

/// TLS: the production sessions' plaintext (from a key log or the server's TLS library) and
/// the copies' own TLS toward the target.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TlsStats {
    /// `keylog` (`--tls-keylog`), `uprobe` (`--tls-uprobe`, `--tls-uprobe-calls`), or `clear` (the capture was
    /// clear TCP; only the copies speak TLS, `--target-tls`).
    pub source: String,
    /// The production TLS sessions, by what became of them.
    pub sessions: TlsSessionStats,
    /// Decrypted sessions by TLS version (`TLSv1.3`, `TLSv1.2`).
    pub versions: BTreeMap<String, u64>,
    /// Decrypted sessions by cipher suite (IANA name).
    pub ciphers: BTreeMap<String, u64>,
    /// `--tls-keylog`: the key log read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keylog: Option<KeylogStats>,
    /// `--tls-uprobe` and `--tls-uprobe-calls`: the probes and their records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uprobe: Option<UprobeStats>,
    /// `--target-tls`: the copies' handshakes with the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetTlsStats>,
}

/// `a 2, b 1` (or `none`).
fn counts(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl TlsStats {
    /// The summary's `TLS:` lines: the production sessions (from a key log or the probes),
    /// and the copies' handshakes with the target.
    fn human(&self, s: &mut String) {
        if self.source != "clear" {
            let n = &self.sessions;
            let _ = writeln!(
                s,
                "TLS: from {}, sessions {} decrypted, {} no secret, {} not TLS, {} failed, unsupported: {}; versions: {}; ciphers: {}",
                self.source,
                n.decrypted,
                n.no_secret,
                n.not_tls,
                n.failed,
                counts(&n.unsupported),
                counts(&self.versions),
                counts(&self.ciphers)
            );
        }
        if let Some(k) = &self.keylog {
            let _ = writeln!(
                s,
                "TLS key log: {} lines ({} not key log lines), {} secrets",
                k.lines, k.bad_lines, k.secrets
            );
        }
        if let Some(u) = &self.uprobe {
            let _ = writeln!(
                s,
                "TLS probes: {} in {} processes, {} records ({} lost, {} not of a copied connection)",
                u.targets.join(", "),
                u.pids,
                u.records,
                u.lost_records,
                u.unmatched
            );
        }
        if let Some(t) = &self.target {
            let _ = writeln!(
                s,
                "TLS to the target: {} handshakes, {} failed{}",
                t.handshakes,
                t.failed,
                if t.failures.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", counts(&t.failures))
                }
            );
        }
    }
}

/// What became of the production TLS sessions (a session is never copied as ciphertext).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TlsSessionStats {
    /// Decrypted and copied (with `--tls-uprobe-calls`: connections whose plaintext was
    /// copied).
    pub decrypted: u64,
    /// No secret for the session in the key log (in time).
    pub no_secret: u64,
    /// A version or suite that cannot be decrypted, by reason or suite name.
    pub unsupported: BTreeMap<String, u64>,
    /// Not TLS at all.
    pub not_tls: u64,
    /// A record that failed authentication (or could not be parsed).
    pub failed: u64,
}

/// `--tls-keylog`: the NSS key log.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KeylogStats {
    pub lines: u64,
    /// Lines that are not key log lines (counted, passed over).
    pub bad_lines: u64,
    pub secrets: u64,
}

/// `--tls-uprobe` / `--tls-uprobe-calls`: the probes on the server's TLS library.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UprobeStats {
    /// The libraries or binaries probed.
    pub targets: Vec<String>,
    /// Processes whose SSL_read/SSL_write were seen.
    pub pids: u64,
    pub records: u64,
    /// Records the ring buffer had no room for.
    pub lost_records: u64,
    /// Records not tied to a connection of the copy rules (secrets mode: handshake records
    /// that were not usable: a version, suite or key length the layout cannot have given).
    pub unmatched: u64,
    /// `secrets` (`--tls-uprobe`: one record per handshake, the capture decrypted) or `calls`
    /// (`--tls-uprobe-calls`: every SSL_read/SSL_write's plaintext).
    #[serde(default)]
    pub mode: String,
    /// Secrets mode: the library's version, whose layout the probes read (`OpenSSL 3.0.19`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
}

/// `--target-tls`: the copies' TLS handshakes with the target.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetTlsStats {
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes failed (their copies count among the failed sessions: `timeout` for a
    /// handshake past `--timeout`, `reset` otherwise).
    pub failed: u64,
    /// Failed handshakes by reason (`unknown_ca`, `bad_name`, `expired`,
    /// `no_common_protocol`, `handshake_timeout`, `reset`, `other`).
    pub failures: BTreeMap<String, u64>,
}

/// Client sessions and the copies made of them. Every copy ends exactly one way: completed,
/// failed by one cause, or open at the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionStats {
    /// Client sessions to a copied server seen in the capture.
    pub seen: u64,
    /// Of those, joined mid-stream (open before the capture saw their SYN).
    pub joined_mid_stream: u64,
    /// Left out by `-r` sampling (or its ramp).
    pub sampled_out: u64,
    /// Chosen for copying.
    pub selected: u64,
    /// Connections to the target made for them: `selected` × `-n`. Each ends completed,
    /// failed, or open at the end.
    pub copies: u64,
    /// Copies that sent all their requests, got every awaited answer and closed.
    pub completed: u64,
    /// Copies that failed, by cause.
    pub failed: FailStats,
    /// Of `failed.target_refused`, copies never tried: the target was refusing and its
    /// shared back-off outlasted their `--timeout`, so no SYN was sent for them.
    pub skipped_in_backoff: u64,
    /// Copies still running when the copy stopped (cut at the end of the run).
    pub open_at_end: u64,
}

/// Failed copies by cause.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FailStats {
    /// The target refused the connection, through every retry.
    pub target_refused: u64,
    /// The target reset the connection (or a send failed).
    pub reset: u64,
    /// The target did not answer a request, or a connect, within `--timeout`.
    pub timeout: u64,
    /// The target closed the connection while the session still had requests.
    pub closed_early: u64,
    /// The target went away under the copy (a restart, a crash): it reset or closed the
    /// connection and then refused (or left unanswered) a connect within 2 s. Counted here
    /// instead of `reset` or `closed_early`.
    #[serde(default)]
    pub target_gone: u64,
    /// The capture lost bytes of the session (a hole not filled in time): the session is
    /// copied up to the hole and ended there.
    pub lost_capture_data: u64,
    /// Ended to stay within `--max-memory` (or the reassembler's buffer limits).
    pub shed: u64,
}

/// Requests of the selected sessions, their bytes, and how many the target answered.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RequestStats {
    /// Requests (client bytes between two server turns) of the selected sessions seen in the
    /// capture, once per copy. Those seen only past a hole the capture left in their session
    /// count too: never copied, they are lost like any other (the ratio must not hide what
    /// the capture dropped).
    pub at_source: u64,
    /// HTTP/1 requests of the selected sessions a client sent before the answer to the one
    /// before (pipelining), once per copy: they share that one's turn, so at_source counts
    /// them with it, and `at_source + pipelined` is what the server's access log counts.
    /// Counted where the client's stream frames as HTTP/1 (see [`crate::pipeline`]); 0 for
    /// other protocols. Absent from reports older than it (read as 0).
    #[serde(default)]
    pub pipelined: u64,
    /// Requests sent to the target.
    pub copied: u64,
    /// Requests the target answered.
    pub answered: u64,
    /// The request loss ratio as tcpcopy defines it: (requests at the source − requests the
    /// target answered) / requests at the source, in percent. Requests that were never copied
    /// (their session failed to connect, was shed, or ended early) count as lost.
    pub loss_ratio_percent: f64,
    /// `--max-loss`: a loss ratio above it fails the run (exit status 1), as does a run whose
    /// target answered none of the requests seen.
    pub max_loss_percent: f64,
    /// Bytes of requests written to the target (all copies, `-n` included).
    pub bytes_copied: u64,
    /// Bytes the target sent back (all copies).
    pub bytes_answered: u64,
    /// Client bytes of sessions joined mid-stream before their first whole request (skipped).
    pub bytes_skipped_joining: u64,
}

/// Answer latencies, nanoseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LatencyStats {
    /// The production server's: from a request's last captured byte to the first byte of
    /// its answer in the capture.
    pub original: Percentiles,
    /// The target's: from a request's last byte written to the first byte of the answer.
    pub target: Percentiles,
}

/// What the capture read, and what it dropped or could not use.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CaptureStats {
    /// Packets the capture read (frames of the file offline).
    pub packets: u64,
    /// Packets the kernel dropped because the capture ring was full (live only).
    pub kernel_drops: u64,
    /// Not TCP/IP, or a cut TCP header.
    pub not_tcp: u64,
    /// Bytes seen again after they were delivered (retransmissions).
    pub retransmitted_bytes: u64,
    /// TCP segments that arrived ahead of a byte still missing (held until the hole was filled
    /// or given up).
    pub out_of_order_segments: u64,
    /// Sessions whose bytes had a hole the capture never filled.
    pub sessions_with_lost_data: u64,
    /// Sessions not tracked because the session table was full.
    pub sessions_not_tracked: u64,
    /// Bytes of the servers' answers the capture lost (holes passed over): their sessions
    /// are still copied whole; only those answers' timing and `--diff` lack them.
    #[serde(default)]
    pub server_bytes_lost: u64,
    /// Times the live capture's interface went down (live, `-i IFACE`).
    #[serde(default)]
    pub interface_downs: u64,
    /// Seconds it was down, over all those times: nothing was captured then.
    #[serde(default)]
    pub interface_down_seconds: f64,
}

/// Memory: the `--max-memory` limit, the process's size, and the peak held under the limit.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemoryStats {
    /// `--max-memory`.
    pub limit_bytes: u64,
    /// Resident set size of the process at the end.
    pub rss_bytes: u64,
    /// Largest amount of request bytes waiting to be sent to the target plus reassembly
    /// buffers, the figure held under the limit.
    pub peak_held_bytes: u64,
}

/// `--diff`: per request, the target's answer against the original one.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DiffStats {
    /// `bytes` or `http` (`--diff-mode`).
    pub mode: String,
    /// Pairs of answers compared.
    pub compared: u64,
    /// Of the compared, answers the same as the original's (after `--diff-ignore`).
    pub equal: u64,
    /// Of the compared, answers that differ from the original's (each written to the diff
    /// output, up to its limit).
    pub different: u64,
    /// Of the compared, those with a body over `cap_bytes`, compared by length and hash
    /// (`--diff-ignore` does not apply to such a body).
    pub compared_by_hash: u64,
    /// Body bytes kept per answer.
    pub cap_bytes: u64,
    /// Requests sent whose answer was cut by a failed copy or the end of the run.
    pub not_compared: u64,
    /// Answers not compared because the capture lost part of the original one (the session
    /// was still copied whole).
    #[serde(default)]
    pub original_incomplete: u64,
    /// Differences written to `out` (at most `--diff-max`).
    pub written: u64,
    /// `--diff-out`.
    pub out: Option<String>,
    /// Why writing `out` stopped, if it did (the comparisons went on).
    pub write_error: Option<String>,
    /// Differences `out` should have held (within `--diff-max`) but did not, writing having
    /// failed (a full disk).
    #[serde(default)]
    pub not_written: u64,
}

/// The rows of a latency table: quantile label and value.
fn rows(p: &Percentiles) -> [(&'static str, u64); 5] {
    [
        ("50.000%", p.p50_ns),
        ("90.000%", p.p90_ns),
        ("99.000%", p.p99_ns),
        ("99.900%", p.p999_ns),
        ("100.000%", p.max_ns),
    ]
}

fn pct(v: f64) -> String {
    format!("{v:.3} %")
}

fn bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// (at the source − answered) / at the source, in percent; 0 when nothing was seen.
pub fn loss_ratio_percent(at_source: u64, answered: u64) -> f64 {
    if at_source == 0 {
        0.0
    } else {
        at_source.saturating_sub(answered) as f64 * 100.0 / at_source as f64
    }
}

impl CopyReport {
    /// Fills the derived figures (loss ratio) and the schema version, and judges the run: one
    /// that did not do what was asked gets its `failure` (unless it already has one).
    pub fn finish(&mut self) {
        self.schema_version = COPY_SCHEMA_VERSION;
        let r = &mut self.requests;
        r.loss_ratio_percent = loss_ratio_percent(r.at_source, r.answered);
        if self.failure.is_none() {
            self.failure = self.judge();
        }
    }

    /// Why the run failed by its own figures: requests were seen and the target answered none
    /// of them, or it lost more than `max_loss_percent` of them. A run that saw no request
    /// (nothing came, or `-r` left every session out) did not fail.
    fn judge(&self) -> Option<String> {
        if let Some(t) = &self.tls {
            let s = &t.sessions;
            let others = s.no_secret + s.not_tls + s.failed + s.unsupported.values().sum::<u64>();
            if s.decrypted == 0 && others > 0 {
                return Some(format!(
                    "no TLS session was decrypted: {} no secret, {} not TLS, {} failed, \
                     unsupported: {}",
                    s.no_secret,
                    s.not_tls,
                    s.failed,
                    counts(&s.unsupported)
                ));
            }
        }
        let r = &self.requests;
        if r.at_source == 0 {
            return None;
        }
        if r.answered == 0 {
            return Some(format!(
                "the target answered none of the {} requests seen ({})",
                r.at_source,
                self.copies_failed()
            ));
        }
        (r.loss_ratio_percent > r.max_loss_percent).then(|| {
            format!(
                "request loss ratio {} is above --max-loss {} % ({} of {} requests answered; {})",
                pct(r.loss_ratio_percent),
                r.max_loss_percent,
                r.answered,
                r.at_source,
                self.copies_failed()
            )
        })
    }

    /// Copies that failed, every cause (transparent mode's lost control connection too).
    pub fn failed_copies(&self) -> u64 {
        let f = &self.sessions.failed;
        [
            f.target_refused,
            f.reset,
            f.timeout,
            f.closed_early,
            f.target_gone,
            f.lost_capture_data,
            f.shed,
            self.transparent.as_ref().map_or(0, |t| t.control_lost),
        ]
        .iter()
        .fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// `3 of 10 copies failed: 2 target refused, 1 timeout` (the causes that counted).
    fn copies_failed(&self) -> String {
        let ss = &self.sessions;
        let f = &ss.failed;
        let control_lost = self.transparent.as_ref().map_or(0, |t| t.control_lost);
        let causes: Vec<String> = [
            (f.target_refused, "target refused"),
            (f.reset, "reset"),
            (f.timeout, "timeout"),
            (f.closed_early, "closed early"),
            (f.target_gone, "target gone"),
            (f.lost_capture_data, "lost capture data"),
            (f.shed, "shed"),
            (control_lost, "control lost"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        let mut s = format!("{} of {} copies failed", self.failed_copies(), ss.copies);
        if !causes.is_empty() {
            s.push_str(": ");
            s.push_str(&causes.join(", "));
        }
        if ss.open_at_end > 0 {
            s.push_str(&format!(", {} open at the end", ss.open_at_end));
        }
        s
    }

    /// The original and target latency side by side. A column without samples (the target
    /// answered nothing, or the capture held no answer) would be rows of zeros that read as
    /// instant answers: it is left out and said to have no samples.
    fn latency_table(&self, s: &mut String) {
        let cols: Vec<(&str, &Percentiles)> = [
            ("original", &self.latency.original),
            ("target", &self.latency.target),
        ]
        .into_iter()
        .filter(|(_, p)| p.count > 0)
        .collect();
        let empty: Vec<&str> = ["original", "target"]
            .into_iter()
            .filter(|n| cols.iter().all(|(c, _)| c != n))
            .collect();
        match cols.as_slice() {
            [] => {
                let _ = writeln!(s, "  Latency: no samples");
            }
            [(name, p)] => {
                let _ = writeln!(
                    s,
                    "  Latency{name:>19}   ({} requests; {}: no samples)",
                    p.count, empty[0]
                );
                for (q, v) in rows(p) {
                    let _ = writeln!(s, "  {q:<8}{:>18}", fmt_ns(v));
                }
            }
            _ => {
                let (o, t) = (&self.latency.original, &self.latency.target);
                let _ = writeln!(
                    s,
                    "  Latency{:>19}{:>13}   ({} / {} requests)",
                    "original", "target", o.count, t.count
                );
                for ((q, a), (_, b)) in rows(o).into_iter().zip(rows(t)) {
                    let _ = writeln!(s, "  {q:<8}{:>18}{:>13}", fmt_ns(a), fmt_ns(b));
                }
            }
        }
    }
}

impl Report for CopyReport {
    /// The human summary.
    fn human(&self) -> String {
        let mut s = String::new();
        let ss = &self.sessions;
        let f = &ss.failed;
        let r = &self.requests;
        let c = &self.capture;
        let _ = writeln!(
            s,
            "Copy: {} from {}, {} rule{} ({}), {} cop{} per session, {} % of sessions, {:.3} s",
            self.mode,
            self.source,
            self.rules.len(),
            if self.rules.len() == 1 { "" } else { "s" },
            self.rules.join(", "),
            self.copies_per_session,
            if self.copies_per_session == 1 {
                "y"
            } else {
                "ies"
            },
            self.sample_percent,
            self.seconds
        );
        let _ = writeln!(
            s,
            "Sessions: {} seen ({} joined mid-stream), {} sampled out, {} selected, {} copies: {} completed, {} failed, {} open at end",
            ss.seen,
            ss.joined_mid_stream,
            ss.sampled_out,
            ss.selected,
            ss.copies,
            ss.completed,
            f.target_refused
                + f.reset
                + f.timeout
                + f.closed_early
                + f.target_gone
                + f.lost_capture_data
                + f.shed
                + self.transparent.as_ref().map_or(0, |t| t.control_lost),
            ss.open_at_end
        );
        let _ = writeln!(
            s,
            "Failed: {} target refused ({} skipped in back-off), {} reset, {} timeout, {} closed early, {} target gone, {} lost capture data, {} shed",
            f.target_refused,
            ss.skipped_in_backoff,
            f.reset,
            f.timeout,
            f.closed_early,
            f.target_gone,
            f.lost_capture_data,
            f.shed
        );
        let _ = writeln!(
            s,
            "Requests: {} at source, {} copied, {} answered; request loss ratio {}",
            r.at_source,
            r.copied,
            r.answered,
            pct(r.loss_ratio_percent)
        );
        if r.pipelined > 0 {
            // Without it a server's access log shows more requests than at source.
            let _ = writeln!(
                s,
                "Pipelined: {} more HTTP/1 requests sent within those, before the answer to the one before",
                r.pipelined
            );
        }
        let _ = writeln!(
            s,
            "Bytes: {} copied, {} answered, {} skipped joining mid-stream",
            r.bytes_copied, r.bytes_answered, r.bytes_skipped_joining
        );
        let _ = writeln!(
            s,
            "Capture: {} packets, {} dropped by the kernel, {} not TCP, {} retransmitted bytes, {} out of order, {} sessions with lost data, {} not tracked",
            c.packets,
            c.kernel_drops,
            c.not_tcp,
            c.retransmitted_bytes,
            c.out_of_order_segments,
            c.sessions_with_lost_data,
            c.sessions_not_tracked
        );
        if c.interface_downs > 0 {
            let _ = writeln!(
                s,
                "Capture: the interface went down {} times, {:.1} s in all (nothing captured then)",
                c.interface_downs, c.interface_down_seconds
            );
        }
        let _ = writeln!(
            s,
            "Memory: {} resident, {} held at peak, limit {}; nice {}",
            bytes(self.memory.rss_bytes),
            bytes(self.memory.peak_held_bytes),
            bytes(self.memory.limit_bytes),
            self.nice
        );
        if let Some(d) = &self.diff {
            let _ = writeln!(
                s,
                "Diff ({}): {} compared, {} equal, {} different ({} written{}), {} over {} compared by length and hash, {} not compared",
                d.mode,
                d.compared,
                d.equal,
                d.different,
                d.written,
                d.out.as_ref().map(|o| format!(" to {o}")).unwrap_or_default(),
                d.compared_by_hash,
                bytes(d.cap_bytes),
                d.not_compared
            );
            if d.original_incomplete > 0 {
                let _ = writeln!(
                    s,
                    "Diff: {} answers not compared: the capture lost part of the original",
                    d.original_incomplete
                );
            }
            if let Some(e) = &d.write_error {
                let _ = writeln!(
                    s,
                    "Diff: writing the differences stopped: {e} ({} not written)",
                    d.not_written
                );
            }
        }
        if let Some(t) = &self.transparent {
            let _ = writeln!(
                s,
                "Transparent: intercept {}{}, {} answers received; control lost {} times ({} copies failed for it), {} reconnects; {} segments sent, {} retransmitted, {} send errors; {} port collisions avoided, {} tuples in use at the target left, {} pool exhausted; {} synthesized handshakes",
                t.intercept,
                if t.client_addr.is_empty() {
                    String::new()
                } else {
                    format!(", clients as {}", t.client_addr)
                },
                t.answers_received,
                t.control_losses,
                t.control_lost,
                t.control_reconnects,
                t.segments_sent,
                t.retransmitted_segments,
                t.send_errors,
                t.port_collisions,
                t.tuple_in_use,
                t.ports_exhausted,
                t.synthesized_handshakes
            );
        }
        if let Some(t) = &self.tls {
            t.human(&mut s);
        }
        self.latency_table(&mut s);
        if let Some(f) = &self.failure {
            let _ = writeln!(s, "Failed: {f}");
        }
        s
    }

    fn json(&self) -> String {
        let mut v = self.clone();
        v.finish();
        to_json(&v)
    }

    fn verdict(&self) -> Verdict {
        Verdict::from_failure(self.failure.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CopyReport {
        let mut r = CopyReport {
            schema_version: 0,
            mode: "relay".into(),
            source: "live eth1".into(),
            filter: "tcp and (port 80)".into(),
            rules: vec!["80-198.18.2.2:8080".into()],
            copies_per_session: 2,
            sample_percent: 50.0,
            seconds: 2.5,
            sessions: SessionStats {
                seen: 10,
                joined_mid_stream: 1,
                sampled_out: 5,
                selected: 5,
                copies: 10,
                completed: 7,
                failed: FailStats {
                    target_refused: 1,
                    reset: 1,
                    timeout: 0,
                    closed_early: 0,
                    target_gone: 0,
                    lost_capture_data: 1,
                    shed: 0,
                },
                skipped_in_backoff: 0,
                open_at_end: 0,
            },
            requests: RequestStats {
                at_source: 2000,
                pipelined: 0,
                copied: 2000,
                answered: 1999,
                loss_ratio_percent: 0.0,
                max_loss_percent: 1.0,
                bytes_copied: 160_000,
                bytes_answered: 500_000,
                bytes_skipped_joining: 40,
            },
            latency: LatencyStats {
                original: Percentiles {
                    count: 1000,
                    mean_ns: 60_000,
                    p50_ns: 50_000,
                    p90_ns: 80_000,
                    p99_ns: 120_000,
                    p999_ns: 900_000,
                    p9999_ns: 1_000_000,
                    max_ns: 12_500_000,
                    ..Percentiles::default()
                },
                target: Percentiles {
                    count: 1999,
                    p50_ns: 70_000,
                    ..Percentiles::default()
                },
            },
            capture: CaptureStats {
                packets: 9000,
                kernel_drops: 3,
                ..CaptureStats::default()
            },
            memory: MemoryStats {
                limit_bytes: 1 << 30,
                rss_bytes: 12 << 20,
                peak_held_bytes: 2048,
            },
            nice: 10,
            diff: None,
            transparent: None,
            tls: None,
            failure: None,
        };
        r.finish();
        r
    }

    #[test]
    fn loss_ratio_is_tcpcopys() {
        let r = sample();
        assert_eq!(r.requests.loss_ratio_percent, 0.05);
        let mut z = CopyReport::default();
        z.finish();
        assert_eq!(z.requests.loss_ratio_percent, 0.0);
        // Requests whose sessions never reached the target are lost too: at 20k new
        // connections/s the copy once said 0 % with a third of the sessions failed.
        let mut f = CopyReport::default();
        f.requests.at_source = 100;
        f.requests.copied = 60;
        f.requests.answered = 60;
        f.finish();
        assert_eq!(f.requests.loss_ratio_percent, 40.0);
        assert_eq!(z.schema_version, COPY_SCHEMA_VERSION);
    }

    #[test]
    fn human_summary_exact_text() {
        assert_eq!(
            sample().human(),
            "Copy: relay from live eth1, 1 rule (80-198.18.2.2:8080), 2 copies per session, 50 % of sessions, 2.500 s\n\
             Sessions: 10 seen (1 joined mid-stream), 5 sampled out, 5 selected, 10 copies: 7 completed, 3 failed, 0 open at end\n\
             Failed: 1 target refused (0 skipped in back-off), 1 reset, 0 timeout, 0 closed early, 0 target gone, 1 lost capture data, 0 shed\n\
             Requests: 2000 at source, 2000 copied, 1999 answered; request loss ratio 0.050 %\n\
             Bytes: 160000 copied, 500000 answered, 40 skipped joining mid-stream\n\
             Capture: 9000 packets, 3 dropped by the kernel, 0 not TCP, 0 retransmitted bytes, 0 out of order, 0 sessions with lost data, 0 not tracked\n\
             Memory: 12.0 MiB resident, 2.0 KiB held at peak, limit 1.0 GiB; nice 10\n  \
             Latency           original       target   (1000 / 1999 requests)\n  \
             50.000%            50.0 us      70.0 us\n  \
             90.000%            80.0 us       0.0 us\n  \
             99.000%           120.0 us       0.0 us\n  \
             99.900%           900.0 us       0.0 us\n  \
             100.000%          12.50 ms       0.0 us\n"
        );
    }

    /// Issue 10 case 6: a latency column without samples printed rows of `0.0 us`.
    #[test]
    fn a_latency_column_without_samples_says_so() {
        let mut r = sample();
        r.latency.target = Percentiles::default();
        let h = r.human();
        assert!(
            h.ends_with(
                "  Latency           original   (1000 requests; target: no samples)\n  \
                 50.000%            50.0 us\n  \
                 90.000%            80.0 us\n  \
                 99.000%           120.0 us\n  \
                 99.900%           900.0 us\n  \
                 100.000%          12.50 ms\n"
            ),
            "{h}"
        );
        r.latency.original = Percentiles::default();
        let h = r.human();
        assert!(h.ends_with("nice 10\n  Latency: no samples\n"), "{h}");
        let mut r = sample();
        r.latency.original = Percentiles::default();
        assert!(
            r.human()
                .contains("  Latency             target   (1999 requests; original: no samples)\n  50.000%            70.0 us\n"),
            "{}",
            r.human()
        );
    }

    /// Issue 10 case 3: a copy whose target answered nothing reported a 100 % loss and exited 0.
    #[test]
    fn a_run_that_lost_its_requests_is_judged_failed() {
        let mut r = sample();
        r.finish();
        assert_eq!(r.failure, None, "0.05 % is within 1 %");
        r.requests.answered = 1900;
        r.finish();
        assert_eq!(
            r.failure.as_deref(),
            Some("request loss ratio 5.000 % is above --max-loss 1 % (1900 of 2000 requests answered; 3 of 10 copies failed: 1 target refused, 1 reset, 1 lost capture data)")
        );
        assert!(r
            .human()
            .ends_with(&format!("Failed: {}\n", r.failure.as_ref().unwrap())));
        let mut r = sample();
        r.requests.answered = 0;
        r.sessions.failed = FailStats::default();
        r.sessions.open_at_end = 3;
        r.finish();
        assert_eq!(
            r.failure.as_deref(),
            Some("the target answered none of the 2000 requests seen (0 of 10 copies failed, 3 open at the end)")
        );
        // A failure already found (a truncated file) is the one said.
        let mut r = sample();
        r.requests.answered = 0;
        r.failure = Some("capture.pcap: cut short".into());
        r.finish();
        assert_eq!(r.failure.as_deref(), Some("capture.pcap: cut short"));
        // Nothing seen (every session sampled out): not a failure.
        let mut z = CopyReport::default();
        z.finish();
        assert_eq!(z.failure, None);
    }

    #[test]
    fn diff_line_only_with_diff() {
        let mut r = sample();
        r.diff = Some(DiffStats {
            mode: "http".into(),
            compared: 100,
            equal: 97,
            different: 3,
            compared_by_hash: 1,
            cap_bytes: 64 << 10,
            not_compared: 2,
            original_incomplete: 0,
            written: 3,
            out: Some("d.jsonl".into()),
            write_error: None,
            not_written: 0,
        });
        let h = r.human();
        assert!(
            h.contains("\nDiff (http): 100 compared, 97 equal, 3 different (3 written to d.jsonl), 1 over 64.0 KiB compared by length and hash, 2 not compared\n  Latency"),
            "{h}"
        );
        assert!(!sample().human().contains("Diff"));
    }

    #[test]
    fn tls_line_names_each_reason_and_a_run_that_decrypted_nothing_failed() {
        assert!(!sample().human().contains("TLS"));
        assert!(!sample().json().contains("\"tls\""));
        let mut r = sample();
        let mut t = TlsStats {
            source: "keylog".into(),
            keylog: Some(KeylogStats {
                lines: 18,
                bad_lines: 1,
                secrets: 15,
            }),
            ..TlsStats::default()
        };
        t.versions = BTreeMap::from([("TLSv1.2".into(), 2), ("TLSv1.3".into(), 3)]);
        t.ciphers = BTreeMap::from([("TLS_AES_128_GCM_SHA256".into(), 5)]);
        t.sessions.decrypted = 5;
        t.sessions.no_secret = 1;
        t.sessions.unsupported = BTreeMap::from([("TLS_RSA_WITH_AES_128_CBC_SHA".into(), 2)]);
        r.tls = Some(t.clone());
        assert!(
            r.human().contains("\nTLS: from keylog, sessions 5 decrypted, 1 no secret, 0 not TLS, 0 failed, unsupported: TLS_RSA_WITH_AES_128_CBC_SHA 2; versions: TLSv1.2 2, TLSv1.3 3; ciphers: TLS_AES_128_GCM_SHA256 5\nTLS key log: 18 lines (1 not key log lines), 15 secrets\n"),
            "{}",
            r.human()
        );
        let back: CopyReport = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(back.tls.map(|t| t.sessions.no_secret), Some(1));
        // Nothing decrypted while TLS sessions came: the run did not do what was asked.
        t.sessions.decrypted = 0;
        let mut r = CopyReport {
            tls: Some(t),
            ..CopyReport::default()
        };
        r.finish();
        assert!(
            r.failure.as_deref().is_some_and(|f| f
                == "no TLS session was decrypted: 1 no secret, 0 not TLS, 0 failed, unsupported: TLS_RSA_WITH_AES_128_CBC_SHA 2"),
            "{:?}",
            r.failure
        );
    }

    #[test]
    fn transparent_line_only_in_transparent_mode() {
        let mut r = sample();
        r.transparent = Some(TransparentStats {
            intercept: "198.18.3.2:36524".into(),
            client_addr: "10.9.0.0/16".into(),
            control_lost: 2,
            control_losses: 1,
            control_reconnects: 1,
            answers_received: 900,
            segments_sent: 1000,
            retransmitted_segments: 3,
            port_collisions: 2,
            tuple_in_use: 1,
            ..TransparentStats::default()
        });
        let h = r.human();
        assert!(h.contains("7 completed, 5 failed, 0 open at end\n"), "{h}");
        assert!(
            h.contains("\nTransparent: intercept 198.18.3.2:36524, clients as 10.9.0.0/16, 900 answers received; control lost 1 times (2 copies failed for it), 1 reconnects; 1000 segments sent, 3 retransmitted, 0 send errors; 2 port collisions avoided, 1 tuples in use at the target left, 0 pool exhausted; 0 synthesized handshakes\n  Latency"),
            "{h}"
        );
        assert!(!sample().human().contains("Transparent"));
        assert!(!sample().json().contains("transparent"));
        let back: CopyReport = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(
            back.transparent.map(|t| (t.control_lost, t.tuple_in_use)),
            Some((2, 1))
        );
    }

    /// The `tls` object: absent without a TLS flag; with --target-tls alone, from clear TCP,
    /// one line for the target's handshakes; from a key log, the sessions' line too.
    #[test]
    fn tls_lines_say_what_was_decrypted_and_the_targets_handshakes() {
        assert!(!sample().json().contains("\"tls\""));
        let mut r = sample();
        let target = TargetTlsStats {
            handshakes: 9,
            failed: 1,
            failures: [("unknown_ca".to_string(), 1)].into(),
        };
        r.tls = Some(TlsStats {
            source: "clear".into(),
            target: Some(target.clone()),
            ..TlsStats::default()
        });
        let h = r.human();
        assert!(h.contains("\nMemory: "), "{h}");
        assert!(
            h.contains("\nTLS to the target: 9 handshakes, 1 failed (unknown_ca 1)\n  Latency"),
            "{h}"
        );
        assert!(!h.contains("TLS: from"), "{h}");
        r.tls = Some(TlsStats {
            source: "keylog".into(),
            sessions: TlsSessionStats {
                decrypted: 8,
                no_secret: 1,
                unsupported: [("TLS_RSA_WITH_AES_128_GCM_SHA256".to_string(), 1)].into(),
                ..TlsSessionStats::default()
            },
            versions: [("TLSv1.3".to_string(), 8)].into(),
            ciphers: [("TLS13_AES_128_GCM_SHA256".to_string(), 8)].into(),
            keylog: Some(KeylogStats {
                lines: 40,
                bad_lines: 0,
                secrets: 40,
            }),
            uprobe: None,
            target: None,
        });
        let h = r.human();
        assert!(
            h.contains("\nTLS: from keylog, sessions 8 decrypted, 1 no secret, 0 not TLS, 0 failed, unsupported: TLS_RSA_WITH_AES_128_GCM_SHA256 1; versions: TLSv1.3 8; ciphers: TLS13_AES_128_GCM_SHA256 8\nTLS key log: 40 lines (0 not key log lines), 40 secrets\n"),
            "{h}"
        );
        let back: CopyReport = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(back.tls.map(|t| t.sessions.decrypted), Some(8));
    }

    #[test]
    fn json_round_trips() {
        let r = sample();
        let back: CopyReport = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(back.sessions.failed.lost_capture_data, 1);
        assert_eq!(back.requests.loss_ratio_percent, 0.05);
        assert_eq!(back.schema_version, COPY_SCHEMA_VERSION);
    }
}
