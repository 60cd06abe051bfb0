//! `tcpkit mpcat`: one byte stream over several TCP connections, so that every member of a
//! bond or every nexthop of an ECMP route carries part of it (the L4 hash pins each
//! connection to one link).
//!
//! The sender ([`send`]) reads its input in chunks, hands the next chunk to whichever
//! connection has room in its socket, and keeps each chunk until the receiver acknowledges
//! it. The receiver ([`recv`]) accepts the session's connections on one port, puts chunks
//! back in order in a bounded window ([`reorder`]), writes them out, and advertises credit
//! back, so the sender never overruns the window. The stream ends with its length and BLAKE3
//! hash; the receiver checks both and tells the sender, and each side exits 0 only then.
//! The wire format is in [`frame`].

mod bufpool;
pub mod duplex;
pub mod frame;
pub mod mptcp;
pub mod paths;
pub mod recv;
pub mod reorder;
mod report;
pub mod resume;
pub mod secure;
pub mod send;
mod writeout;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// The name of the stream hash, as the report gives it (`xxh3-128:<hex>`).
pub const HASH_NAME: &str = "xxh3-128";

/// A stream's hash: XXH3-128 of all of its bytes, big-endian.
pub type Digest = [u8; 16];

/// The hash each side computes over the whole stream, checked at the end. XXH3-128, not a
/// cryptographic hash: without --psk-file anyone on the path could rewrite the end frame's
/// hash along with the bytes, whatever the hash; with it, every record is authenticated
/// (ChaCha20-Poly1305) and the hash only has to catch what goes wrong inside mpcat and the
/// machines (a lost, doubled or misplaced chunk, a bad write). BLAKE3 did the same job at
/// ~5.7 GB/s and was a fifth of each side's CPU on one veth; XXH3 runs at ~10 GB/s and more.
pub struct StreamHasher(twox_hash::XxHash3_128);

impl std::fmt::Debug for StreamHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamHasher(xxh3-128)")
    }
}

impl Default for StreamHasher {
    fn default() -> StreamHasher {
        StreamHasher::new()
    }
}

impl StreamHasher {
    pub fn new() -> StreamHasher {
        StreamHasher(twox_hash::XxHash3_128::new())
    }

    pub fn update(&mut self, b: &[u8]) {
        self.0.write(b);
    }

    pub fn finish(&self) -> Digest {
        self.0.finish_128().to_be_bytes()
    }
}

/// The hash of `b` as one stream.
pub fn stream_hash(b: &[u8]) -> Digest {
    let mut h = StreamHasher::new();
    h.update(b);
    h.finish()
}

pub use report::{
    ConnCounts, MpcatReport, MptcpReport, PathFailure, ResumeReport, ReverseReport, Role, RunTotal,
    StreamReport,
};

/// The receiver's default reorder window.
pub const DEFAULT_WINDOW: u64 = 64 << 20;
/// The sender's default largest and smallest chunk: each connection's size adapts between
/// them.
pub const DEFAULT_CHUNK: u32 = 1 << 20;
pub const DEFAULT_CHUNK_MIN: u32 = 64 << 10;
/// At most this many times smaller than the largest (declared in the Hello) may a session's
/// chunks be, but the stream's last: the receiver bounds the separate pieces it holds by it.
pub const CHUNK_SPAN: u32 = 16;

/// The smallest chunk a sender that declares `largest` makes (but the stream's last).
pub fn smallest_chunk(largest: u32) -> u32 {
    (largest / CHUNK_SPAN)
        .max(frame::MIN_CHUNK as u32)
        .min(largest)
}
/// The smallest and largest `--window`.
pub const MIN_WINDOW: u64 = 1 << 20;
pub const MAX_WINDOW: u64 = 4 << 30;
/// How long an accepted connection may take to present its Hello.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default `--path-timeout`.
pub const DEFAULT_PATH_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections still in their handshake at once; more are closed at accept and counted.
pub const MAX_PENDING: usize = 64;

/// Where the sender's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Stdin,
    File(PathBuf),
}

/// Where the receiver's bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout,
    File(PathBuf),
}

/// An error with what was being done, keeping its cause (the OS error, a frame or window
/// error) as its source: `tcpkit_stats::chain` makes the one line the user sees of it.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct Error {
    what: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
    /// The receiver closed a connection before it answered (its handshake slots were full,
    /// or it made room for a newer one): worth trying again.
    closed_early: bool,
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, e: io::Error) -> Error {
        Error::of(what, e)
    }
    /// `what` was being done (or where) when `e` happened.
    pub(crate) fn of(
        what: impl Into<String>,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error {
            what: what.into(),
            source: Some(Box::new(e)),
            closed_early: false,
        }
    }
    pub(crate) fn msg(what: impl Into<String>) -> Error {
        Error {
            what: what.into(),
            source: None,
            closed_early: false,
        }
    }
    /// The receiver closed the connection before answering: the sender tries again.
    pub(crate) fn closed_early(mut self) -> Error {
        self.closed_early = true;
        self
    }
    pub(crate) fn is_closed_early(&self) -> bool {
        self.closed_early
    }
    /// The one line the user sees: what was being done, then each cause once.
    pub fn line(&self) -> String {
        tcpkit_stats::chain(self)
    }
}

/// What the live view (`--stats`, the progress line) reads while a side runs: relaxed
/// stores from the event loop, loads from the monitor's thread.
#[derive(Debug)]
pub struct MpcatCounters {
    /// Stream bytes done (acknowledged on the sending side, written on the receiving side).
    pub bytes: std::sync::atomic::AtomicU64,
    /// The stream's length when known beforehand (-i FILE), else 0.
    pub total: std::sync::atomic::AtomicU64,
    /// Streams of the session so far.
    pub streams: std::sync::atomic::AtomicU64,
    /// Payload bytes each stream carried.
    pub per_stream: Vec<std::sync::atomic::AtomicU64>,
}

impl Default for MpcatCounters {
    fn default() -> MpcatCounters {
        MpcatCounters {
            bytes: Default::default(),
            total: Default::default(),
            streams: Default::default(),
            per_stream: (0..frame::MAX_STREAMS)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        }
    }
}

impl MpcatCounters {
    pub(crate) fn set_stream(&self, i: usize, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(s) = self.per_stream.get(i) {
            s.store(bytes, Relaxed);
            self.streams.fetch_max(i as u64 + 1, Relaxed);
        }
    }

    /// A live line's text: bytes, the rate since `prev` (`(elapsed, bytes, per-stream
    /// bytes)` of the previous line, updated), each stream's rate, and percent and ETA when
    /// the length is known.
    pub fn line(&self, elapsed: Duration, prev: &mut (Duration, u64, Vec<u64>)) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let bytes = self.bytes.load(Relaxed);
        let n = self.streams.load(Relaxed) as usize;
        let per: Vec<u64> = self.per_stream[..n]
            .iter()
            .map(|a| a.load(Relaxed))
            .collect();
        let dt = elapsed.saturating_sub(prev.0).as_secs_f64();
        let mib = |b: u64| b as f64 / 1048576.0;
        let rate = |now: u64, then: u64| {
            if dt > 0.0 {
                mib(now.saturating_sub(then)) / dt
            } else {
                0.0
            }
        };
        let mut s = format!("{:.1} MiB  {:.2} MiB/s", mib(bytes), rate(bytes, prev.1));
        if n > 0 {
            s.push_str("  streams");
            for (k, b) in per.iter().enumerate() {
                let then = prev.2.get(k).copied().unwrap_or(0);
                s.push_str(&format!(" {:.1}", rate(*b, then)));
            }
            s.push_str(" MiB/s");
        }
        s.push_str(&tcpkit_stats::percent_eta(
            bytes,
            self.total.load(Relaxed),
            elapsed,
        ));
        *prev = (elapsed, bytes, per);
        s
    }
}

/// How long a side that failed mid-session spends telling its peer ([`frame::Frame::Abort`]):
/// finishing the frames its connections are in the middle of, the abort, and waiting for the
/// peer to close. A live peer takes milliseconds; a dead one costs this much at the exit.
pub(crate) const ABORT_GRACE: Duration = Duration::from_secs(1);

/// After an abort: half-closes each connection and reads (and drops) what still comes until
/// the peer closes it too, or `until`. Closing with unread bytes would reset the connection,
/// and the peer could lose the abort frame with it.
pub(crate) fn linger(socks: &mut [&mut mio::net::TcpStream], until: std::time::Instant) {
    use std::io::Read;
    for s in socks.iter_mut() {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut open = vec![true; socks.len()];
    let mut buf = vec![0u8; 64 << 10];
    while open.iter().any(|o| *o) && std::time::Instant::now() < until {
        for (s, o) in socks.iter_mut().zip(open.iter_mut()) {
            while *o {
                match s.read(&mut buf) {
                    Ok(0) => *o = false,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => *o = false,
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A connection gives up after `path_timeout` of data unacknowledged (TCP_USER_TIMEOUT), and
/// an idle one is probed from then on (keepalive every second, 3 probes), so a dead path is
/// noticed on both sides even when nothing is being sent.
pub(crate) fn set_path_timeout(
    s: &impl std::os::fd::AsFd,
    path_timeout: Duration,
) -> io::Result<()> {
    let s = socket2::SockRef::from(s);
    s.set_tcp_user_timeout(Some(path_timeout))?;
    s.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(path_timeout.max(Duration::from_secs(1)))
            .with_interval(Duration::from_secs(1))
            .with_retries(3),
    )
}

/// A random session token from the kernel's generator.
pub(crate) fn random_token() -> Result<frame::Token, Error> {
    let mut t = [0u8; 16];
    let mut got = 0;
    while got < t.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `t`.
        let n = unsafe { libc::getrandom(t[got..].as_mut_ptr().cast(), t.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("getrandom for the session token", e));
        }
        got += n as usize;
    }
    Ok(t)
}
