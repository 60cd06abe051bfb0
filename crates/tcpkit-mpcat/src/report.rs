//! What a side of an mpcat session reports: the summary people read, the `--json` document
//! (docs/schema/mpcat.schema.json) and the verdict (exit 0 only when every byte arrived and
//! its hash was verified).

use serde::Serialize;
use tcpkit_stats::{Report, Verdict};

/// The `--json` document's version (docs/schema/mpcat.schema.json).
pub const SCHEMA_VERSION: u32 = 1;

/// Which side of the session this report is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Send,
    Receive,
}

/// One connection of the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamReport {
    pub index: u16,
    pub local: String,
    pub peer: String,
    /// Payload bytes this connection carried (re-sent bytes included).
    pub bytes: u64,
    /// The member (ECMP nexthop's or bond slave's interface) it leaves by (sending side).
    pub path: Option<String>,
    /// The largest chunk size its adaptation chose (sending side): about 10 ms of what its
    /// socket took, so a slow path's stays small and a fast one's grows.
    pub chunk_max: Option<u64>,
}

/// A connection of the session that failed before the end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathFailure {
    pub stream: u16,
    pub local: String,
    pub peer: String,
    /// Seconds into the session.
    pub at: f64,
    pub why: String,
}

/// Connections the listener turned away (the receiving side; zeros on the sending side).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ConnCounts {
    /// Presented another session's token (or came after the session was complete).
    pub wrong_token: u64,
    /// Sent something that is not an mpcat Hello of this version (or, with --psk-file, an
    /// unencrypted Hello; without it, an encrypted handshake).
    pub bad_handshake: u64,
    /// Opened a --psk-file handshake under another key.
    pub wrong_key: u64,
    /// Sent no Hello within the handshake deadline.
    pub handshake_timeout: u64,
    /// Arrived while the cap on connections in their handshake was reached.
    pub over_cap: u64,
    /// Closed in their handshake to make room for a newcomer: the oldest silent one (else
    /// the oldest) of the listener at its cap, or of an address at its share of it.
    pub evicted: u64,
    /// accept() failed (e.g. out of descriptors: accepting paused, then went on).
    pub accept_errors: u64,
}

/// --mptcp on the sending side: what the kernel's MPTCP did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MptcpReport {
    /// Subflows of the connection at the end (the first included; MPTCP_INFO); 0 when it
    /// fell back.
    pub subflows: u32,
    /// Why the session was striped over TCP instead (no MPTCP in this kernel, or the receiver
    /// does not do it); null when MPTCP carried it.
    pub fallback: Option<String>,
}

/// The reverse direction (duplex): the listener's input to the connecting side's output,
/// over its own connection with its own sequence space, credit, end frame and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReverseReport {
    /// Bytes of it sent (listener) or written out (connecting side).
    pub bytes: u64,
    /// Its length from its end frame, once known.
    pub total: Option<u64>,
    /// "xxh3-128:<hex>" of it, once known.
    pub hash: Option<String>,
    /// Every byte arrived and the connecting side's hash matched the listener's.
    pub verified: bool,
    /// It ended because the connecting side stopped waiting for more (-q, or no -N), not at
    /// the end of the listener's input.
    pub stopped: bool,
    /// Why it failed, if it did.
    pub failure: Option<String>,
}

/// A -k run as a whole (the receiving side): what its sessions moved together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunTotal {
    /// Sessions that began, and of them those verified.
    pub sessions: u64,
    pub sessions_verified: u64,
    /// Stream bytes written out by every session together.
    pub bytes: u64,
    /// From the start of listening to the stop.
    pub seconds: f64,
}

/// --resume: what the receiver already held (checked chunk by chunk, not sent again) and
/// what this session sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResumeReport {
    /// Bytes at the start of the file the receiver held and the sender's hashes matched:
    /// skipped.
    pub held: u64,
    /// Bytes sent (acknowledged, or written out) in this session, after them.
    pub sent: u64,
}

/// The report of one side.
#[derive(Debug, Clone, Serialize)]
pub struct MpcatReport {
    /// [`SCHEMA_VERSION`]: changes when a field changes meaning or disappears.
    pub schema_version: u32,
    pub role: Role,
    /// The address connected to, or listened on.
    pub address: String,
    /// Stream bytes moved: read and acknowledged (send), written out in order (receive).
    pub bytes: u64,
    /// The stream's length from its end frame, once known.
    pub total: Option<u64>,
    pub seconds: f64,
    pub bytes_per_second: f64,
    pub chunk_size: u64,
    pub window: u64,
    /// Every connection authenticated and encrypted with the --psk-file key.
    pub encrypted: bool,
    /// --mptcp (sending side): subflows, or why it fell back; null without --mptcp.
    pub mptcp: Option<MptcpReport>,
    pub streams: Vec<StreamReport>,
    /// How connections leave the sender toward the receiver, e.g. `ecmp: eth1 eth2` (sending
    /// side; null on the receiving side).
    pub egress: Option<String>,
    /// Connections that failed (died, or stalled past --path-timeout) before the end.
    pub path_failures: Vec<PathFailure>,
    /// Connections opened again for a failed stream (send), or streams that rejoined
    /// (receive).
    pub reconnects: u64,
    /// Bytes sent again because the connection that carried them failed (send; 0 on the
    /// receiving side).
    pub resent_bytes: u64,
    /// "xxh3-128:<hex>" of the whole stream, once known.
    pub hash: Option<String>,
    /// Every byte arrived and the receiver's hash matched the sender's.
    pub verified: bool,
    pub connections: ConnCounts,
    /// Sessions that began, and of them those verified (receiving side: more than 1 only
    /// with -k; the sending side has one).
    pub sessions: u64,
    pub sessions_verified: u64,
    /// Why the session failed, if it did.
    pub failure: Option<String>,
    /// The reverse direction (listener → connecting side), when the session had one.
    pub reverse: Option<ReverseReport>,
    /// -k: the run's total (the other fields are its last session's); null without -k.
    pub run: Option<RunTotal>,
    /// --resume: what was held and skipped, and what was sent; null without it.
    pub resume: Option<ResumeReport>,
}

impl MpcatReport {
    /// The report of a run that failed before its session began (the first connect refused,
    /// the listener's output not writable): every count zero, `failure` saying why, so
    /// --json still prints its document.
    pub fn failed(role: Role, address: String, why: String) -> MpcatReport {
        MpcatReport {
            schema_version: SCHEMA_VERSION,
            role,
            address,
            bytes: 0,
            total: None,
            seconds: 0.0,
            bytes_per_second: 0.0,
            chunk_size: 0,
            window: 0,
            encrypted: false,
            mptcp: None,
            streams: Vec::new(),
            egress: None,
            path_failures: Vec::new(),
            reconnects: 0,
            resent_bytes: 0,
            hash: None,
            verified: false,
            connections: ConnCounts::default(),
            sessions: 0,
            sessions_verified: 0,
            failure: Some(why),
            reverse: None,
            run: None,
            resume: None,
        }
    }

    /// -k: the run's total line (and what was refused), for the end of a run whose sessions
    /// were each summed up as they ended; empty without -k.
    pub fn run_summary(&self) -> String {
        let Some(r) = &self.run else {
            return String::new();
        };
        let mut s = format!(
            "mpcat: run total: {} sessions, {} verified, {} bytes ({:.1} MiB) in {:.2} s\n",
            r.sessions,
            r.sessions_verified,
            r.bytes,
            mib(r.bytes),
            r.seconds
        );
        s.push_str(&self.refused_line());
        s
    }

    fn refused_line(&self) -> String {
        let c = &self.connections;
        format!(
            "refused: {} wrong token, {} wrong key, {} bad handshake, {} handshake timeout, {} over the cap, {} evicted, {} accept errors\n",
            c.wrong_token, c.wrong_key, c.bad_handshake, c.handshake_timeout, c.over_cap, c.evicted, c.accept_errors
        )
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

impl Report for MpcatReport {
    fn human(&self) -> String {
        let mut s = String::new();
        let verb = match self.role {
            Role::Send => "sent",
            Role::Receive => "received",
        };
        let dir = match self.role {
            Role::Send => "to",
            Role::Receive => "on",
        };
        s.push_str(&format!(
            "mpcat: {verb} {} bytes ({:.1} MiB) in {:.2} s, {:.2} MiB/s, over {} streams {dir} {}\n",
            self.bytes,
            mib(self.bytes),
            self.seconds,
            mib(self.bytes_per_second as u64),
            self.streams.len(),
            self.address
        ));
        match &self.mptcp {
            Some(MptcpReport {
                fallback: Some(why),
                ..
            }) => s.push_str(&format!("  mptcp: not used, striped over TCP: {why}\n")),
            Some(m) => s.push_str(&format!(
                "  mptcp: one connection, {} subflows at the end\n",
                m.subflows
            )),
            None => {}
        }
        if self.encrypted {
            s.push_str(&format!(
                "  every stream encrypted: {} (--psk-file)\n",
                crate::secure::NOISE_PARAMS
            ));
        }
        match &self.egress {
            Some(e) if e.starts_with("one link") => s.push_str(&format!("  egress {e}\n")),
            Some(e) => s.push_str(&format!(
                "  egress {e} (the receive direction is spread by the peer's routes or the switch)\n"
            )),
            None => {}
        }
        let all: u64 = self.streams.iter().map(|t| t.bytes).sum();
        for t in &self.streams {
            let share = if all == 0 {
                0.0
            } else {
                100.0 * t.bytes as f64 / all as f64
            };
            let via = t
                .path
                .as_ref()
                .map_or_else(String::new, |p| format!(" via {p}"));
            let chunks = t
                .chunk_max
                .map_or_else(String::new, |c| format!("  chunks up to {} KiB", c >> 10));
            s.push_str(&format!(
                "  stream {:>3}  {} -> {}{via}  {} bytes  {:.1} %{chunks}\n",
                t.index, t.local, t.peer, t.bytes, share
            ));
        }
        for f in &self.path_failures {
            s.push_str(&format!(
                "  path failed: stream {} {} -> {} at {:.1} s: {}\n",
                f.stream, f.local, f.peer, f.at, f.why
            ));
        }
        if !self.path_failures.is_empty() || self.reconnects > 0 {
            s.push_str(&format!(
                "  {} path failures, {} reconnects, {} bytes re-sent\n",
                self.path_failures.len(),
                self.reconnects,
                self.resent_bytes
            ));
        }
        if let Some(r) = &self.resume {
            s.push_str(&format!(
                "  resumed: {} bytes held by the receiver and checked chunk by chunk, skipped; {} bytes sent\n",
                r.held, r.sent
            ));
        }
        match (&self.hash, self.verified) {
            (Some(h), true) => s.push_str(&format!("{h}: verified\n")),
            (Some(h), false) => s.push_str(&format!("{h}: NOT verified\n")),
            (None, _) => s.push_str("hash: not known (the stream did not end)\n"),
        }
        if let Some(r) = &self.reverse {
            let (verb, dir) = match self.role {
                Role::Send => ("received", "from the listener"),
                Role::Receive => ("sent", "to the connecting side"),
            };
            let how = match (&r.failure, r.verified, r.stopped) {
                (Some(f), _, _) => format!("FAILED: {f}"),
                // The session failed: what the reverse stream did is not a verdict on it.
                (None, _, _) if self.failure.is_some() => "the session failed".into(),
                (None, true, true) => "verified (stopped by the connecting side)".into(),
                (None, true, false) => "verified".into(),
                (None, false, _) => "NOT verified".into(),
            };
            s.push_str(&format!(
                "  reverse: {verb} {} bytes {dir}, {how}\n",
                r.bytes
            ));
        }
        if self.run.is_some() {
            s.push_str(&self.run_summary());
            return s;
        }
        if self.role == Role::Receive && self.sessions > 1 {
            s.push_str(&format!(
                "sessions: {} verified of {}\n",
                self.sessions_verified, self.sessions
            ));
        }
        if self.role == Role::Receive {
            s.push_str(&self.refused_line());
        }
        s
    }

    fn json(&self) -> String {
        tcpkit_stats::to_json(self)
    }

    fn verdict(&self) -> Verdict {
        match &self.failure {
            Some(f) => Verdict::Failed(f.clone()),
            None if !self.verified => {
                Verdict::Failed("the stream was not verified end to end".into())
            }
            None => Verdict::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> MpcatReport {
        MpcatReport {
            schema_version: SCHEMA_VERSION,
            role: Role::Receive,
            address: "[::]:31337".into(),
            bytes: 3 << 20,
            total: Some(3 << 20),
            seconds: 1.5,
            bytes_per_second: 2.0 * 1048576.0,
            chunk_size: 262_144,
            window: 64 << 20,
            encrypted: false,
            mptcp: None,
            streams: vec![
                StreamReport {
                    index: 0,
                    local: "198.19.0.2:31337".into(),
                    peer: "198.19.0.1:40000".into(),
                    bytes: 1 << 20,
                    path: None,
                    chunk_max: None,
                },
                StreamReport {
                    index: 1,
                    local: "198.19.0.2:31337".into(),
                    peer: "198.19.0.1:40001".into(),
                    bytes: 2 << 20,
                    path: None,
                    chunk_max: None,
                },
            ],
            egress: None,
            path_failures: vec![],
            reconnects: 0,
            resent_bytes: 0,
            hash: Some("xxh3-128:00ff".into()),
            verified: true,
            connections: ConnCounts {
                wrong_token: 2,
                ..ConnCounts::default()
            },
            sessions: 1,
            sessions_verified: 1,
            failure: None,
            reverse: None,
            run: None,
            resume: None,
        }
    }

    #[test]
    fn the_summary_reads_as_written() {
        assert_eq!(
            sample().human(),
            "mpcat: received 3145728 bytes (3.0 MiB) in 1.50 s, 2.00 MiB/s, over 2 streams on [::]:31337\n\
             \x20 stream   0  198.19.0.2:31337 -> 198.19.0.1:40000  1048576 bytes  33.3 %\n\
             \x20 stream   1  198.19.0.2:31337 -> 198.19.0.1:40001  2097152 bytes  66.7 %\n\
             xxh3-128:00ff: verified\n\
             refused: 2 wrong token, 0 wrong key, 0 bad handshake, 0 handshake timeout, 0 over the cap, 0 evicted, 0 accept errors\n"
        );
        let mut r = sample();
        r.path_failures.push(PathFailure {
            stream: 1,
            local: "198.19.0.2:31337".into(),
            peer: "198.19.0.1:40001".into(),
            at: 2.3,
            why: "read: Connection timed out".into(),
        });
        r.reconnects = 1;
        assert!(r.human().contains(
            "  stream   1  198.19.0.2:31337 -> 198.19.0.1:40001  2097152 bytes  66.7 %\n\
             \x20 path failed: stream 1 198.19.0.2:31337 -> 198.19.0.1:40001 at 2.3 s: read: Connection timed out\n\
             \x20 1 path failures, 1 reconnects, 0 bytes re-sent\n\
             xxh3-128:00ff: verified\n"
        ), "{}", r.human());
        let mut r = sample();
        r.role = Role::Send;
        r.egress = Some("ecmp: eth1 eth2".into());
        r.streams[0].path = Some("eth1".into());
        assert!(r.human().contains(
            "  egress ecmp: eth1 eth2 (the receive direction is spread by the peer's routes or the switch)\n\
             \x20 stream   0  198.19.0.2:31337 -> 198.19.0.1:40000 via eth1  1048576 bytes  33.3 %\n"
        ), "{}", r.human());
        r.mptcp = Some(MptcpReport {
            subflows: 3,
            fallback: None,
        });
        assert!(
            r.human()
                .contains("  mptcp: one connection, 3 subflows at the end\n"),
            "{}",
            r.human()
        );
        r.mptcp = None;
        r.encrypted = true;
        assert!(r.human().contains(
            " to [::]:31337\n  every stream encrypted: Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s (--psk-file)\n  egress"
        ), "{}", r.human());
        r.resume = Some(ResumeReport {
            held: 2 << 20,
            sent: 1 << 20,
        });
        assert!(r.human().contains(
            "  resumed: 2097152 bytes held by the receiver and checked chunk by chunk, skipped; 1048576 bytes sent\nxxh3-128:00ff: verified\n"
        ), "{}", r.human());
        r.hash = None;
        r.verified = false;
        let h = r.human();
        assert!(h.starts_with("mpcat: sent 3145728 bytes"), "{h}");
        assert!(
            h.ends_with("hash: not known (the stream did not end)\n"),
            "{h}"
        );
    }

    #[test]
    fn exit_zero_only_when_verified() {
        assert!(sample().verdict().is_done());
        let mut r = sample();
        r.verified = false;
        assert!(!r.verdict().is_done());
        let mut r = sample();
        r.failure = Some("stream 1 closed".into());
        assert_eq!(r.verdict(), Verdict::Failed("stream 1 closed".into()));
    }

    #[test]
    fn the_json_has_every_field() {
        let v: serde_json::Value = serde_json::from_str(&sample().json()).unwrap();
        assert_eq!(v["role"], "receive");
        assert_eq!(v["streams"][1]["bytes"], 2 << 20);
        assert_eq!(v["connections"]["wrong_token"], 2);
        assert_eq!(v["failure"], serde_json::Value::Null);
    }
}
