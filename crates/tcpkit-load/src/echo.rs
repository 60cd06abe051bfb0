//! `tcpkit echo`: the reference server that `tcpkit load` measures against (tcpscaler's
//! tcpserver, with bounded memory).
//!
//! One mio `Poll` (edge-triggered epoll) per thread, each thread with its own `SO_REUSEPORT`
//! listener per address, so the kernel spreads new connections over threads (and over worker
//! processes, see [`procs`]) without a shared accept queue. A connection costs its socket plus a
//! 16-byte slab slot ([`conn`]); bytes that cannot be written back at once are kept in a buffer
//! allocated only while they are pending and capped by `max_conn_buf`: a client that never
//! reads stops being read (back-pressure) instead of growing the server. In DNS mode every
//! complete length-prefixed query gets its answer, in order.
//!
//! Counters are per thread ([`EchoCounters`]), written by their thread only and summed by readers, so the
//! hot path never shares a cache line.
//!
//! Bounded per peer (issue 11): at most `max_conns` connections per process (by default what
//! the descriptor limit allows, less [`fd_reserve`]); over it a newcomer takes the place of
//! the oldest connection that has sent nothing yet, or is refused when all have spoken; once
//! the process has been full, connections silent past `first_timeout` are closed
//! ([`silent`] keeps them in accept order); in DNS mode a partial query has `partial_timeout`
//! to complete; out of descriptors, accepting pauses. Each is counted, none ends the run.

mod conn;
mod http;
pub mod procs;
mod report;
mod silent;
mod sock;

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use report::{EchoReport, ECHO_SCHEMA_VERSION};

/// The port `tcpkit echo` listens on when none is given (tcpscaler's tcpserver uses it too).
pub const DEFAULT_PORT: u16 = 4242;
/// Default per-connection buffer cap (`--max-conn-buf`).
pub const DEFAULT_MAX_CONN_BUF: usize = 16 * 1024;
/// Smallest `--max-conn-buf`: a DNS query (≤ 271 bytes + EDNS) must fit half of it.
pub const MIN_MAX_CONN_BUF: usize = 1024;
/// Largest `--max-conn-buf`: one read's scratch buffer per thread has this size.
pub const MAX_MAX_CONN_BUF: usize = 64 * 1024 * 1024;
/// How long accepting pauses after EMFILE/ENFILE: long enough not to spin on a full fd table,
/// short enough that a freed descriptor is used promptly.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(5);

/// Default `--partial-timeout`: far longer than any honest client takes to send one query.
pub const DEFAULT_PARTIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `--first-timeout`: how long a connection may stay silent once the server has been
/// full. It applies only then, because `tcpkit load` keeps honest connections silent for as
/// long as it likes (`--hold`; `-c 100000 -r 1000` reaches each connection every 100 s;
/// opening a million takes 85 s before the first query), so no fixed deadline could tell them
/// from a slowloris; a server that has run out of room can. 10 s is the partial-query
/// deadline too: far longer than an honest client takes to send a query once it means to.
pub const DEFAULT_FIRST_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `--tls-handshake-timeout`: as long as the first-message deadline, far longer than a
/// handshake takes even on a loaded host.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Descriptors a process keeps out of its connection cap: stdin/out/err, the listen-queue
/// counters file, the one accepted connection a thread holds while deciding whether it may
/// stay, and slack for descriptors inherited or opened by a library; plus, per thread, its
/// epoll and one listener per address.
pub fn fd_reserve(threads: usize, addresses: usize) -> u64 {
    16 + threads as u64 * (1 + addresses as u64)
}

/// The default `--max-conns`: what the descriptor limit leaves after [`fd_reserve`] (at least
/// one connection per thread, so a tiny limit still serves).
pub fn default_max_conns(fd_limit: u64, threads: usize, addresses: usize) -> usize {
    let n = fd_limit.saturating_sub(fd_reserve(threads, addresses));
    usize::try_from(n).unwrap_or(usize::MAX).max(threads.max(1))
}

/// What the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Writes back every byte it reads.
    Echo,
    /// Answers DNS-over-TCP queries: A → `a`, AAAA → `aaaa`, other types NOERROR without answer.
    Dns { a: Ipv4Addr, aaaa: Ipv6Addr },
    /// Answers HTTP/1.1 and HTTP/2 (h2c with prior knowledge) requests, and DoH on
    /// /dns-query with DNS answers as [`Mode::Dns`]'s.
    Http { a: Ipv4Addr, aaaa: Ipv6Addr },
}

/// A resolved `tcpkit echo` run; every cross-flag check happened before this was built.
#[derive(Debug, Clone)]
pub struct EchoConfig {
    /// Addresses to listen on. `[::]` listens dual-stack (IPV6_V6ONLY off).
    pub listen: Vec<SocketAddr>,
    /// Whether `listen` is the default `[::]`, which falls back to `0.0.0.0` on a host
    /// without IPv6.
    pub listen_is_default: bool,
    /// Event-loop threads (each with its own listener per address).
    pub threads: usize,
    pub mode: Mode,
    /// Most bytes held for one connection (pending output plus a partial query).
    pub max_conn_buf: usize,
    /// Stop after this long; otherwise at the stop flag.
    pub duration: Option<Duration>,
    /// "K/N" when this process is worker K of N (shown in the report).
    pub worker: Option<(u32, u32)>,
    /// DNS mode: a connection holding the start of a query this long without its end is
    /// closed (slowloris: one byte per connection held descriptors forever).
    pub partial_timeout: Duration,
    /// Once the server has been full, a connection that has not sent its first message (echo:
    /// a byte; DNS: a whole query) this long after its accept is closed. Zero: never.
    pub first_timeout: Duration,
    /// Most connections this process holds; None: [`default_max_conns`] of the descriptor
    /// limit in force once raised.
    pub max_conns: Option<usize>,
    /// `--tls`: every connection speaks TLS first (DoT, TLS under the byte echo).
    pub tls: Option<std::sync::Arc<tcpkit_tls::rustls::ServerConfig>>,
    /// With --tls: a connection whose handshake is not done this long after its accept is
    /// closed (a peer that connects and sends half a hello holds a session's memory).
    pub tls_handshake_timeout: Duration,
}

impl EchoConfig {
    /// Listens on `[::]:port` (dual stack), echo mode, one thread per core, default buffer.
    pub fn new(port: u16) -> EchoConfig {
        EchoConfig {
            listen: vec![SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))],
            listen_is_default: true,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mode: Mode::Echo,
            max_conn_buf: DEFAULT_MAX_CONN_BUF,
            duration: None,
            worker: None,
            partial_timeout: DEFAULT_PARTIAL_TIMEOUT,
            first_timeout: DEFAULT_FIRST_TIMEOUT,
            max_conns: None,
            tls: None,
            tls_handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
        }
    }
}

/// Why the server could not start or keep running. Failures of single connections are
/// counted, never returned.
#[derive(Debug, thiserror::Error)]
pub enum EchoError {
    #[error("{what} {addr}")]
    Socket {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("worker {worker}: {why}")]
    Worker { worker: String, why: String },
}

impl EchoError {
    pub(crate) fn io(what: &'static str, source: io::Error) -> EchoError {
        EchoError::Io { what, source }
    }
}

/// One thread's counters. Only its thread writes them (load + store, no locked add); the
/// alignment keeps two threads' counters off one cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ThreadCounters {
    pub accepted: AtomicU64,
    pub closed: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub answered: AtomicU64,
    pub malformed: AtomicU64,
    pub accept_errors: AtomicU64,
    pub fd_exhausted: AtomicU64,
    pub partial_timeouts: AtomicU64,
    /// Connections closed past `partial_timeout` with answers they never read.
    pub unread_timeouts: AtomicU64,
    /// Silent connections closed at the cap to make room for a newcomer.
    pub evicted: AtomicU64,
    /// Newcomers closed at the cap because every connection of their thread had spoken.
    pub over_cap: AtomicU64,
    /// Silent connections closed past `first_timeout` while the server was full.
    pub first_timeouts: AtomicU64,
    /// The OS error number of the last failed accept (0: none yet).
    pub accept_errno: AtomicU64,
    /// `--tls`: handshakes completed, full and resumed.
    pub tls_full: AtomicU64,
    pub tls_resumed: AtomicU64,
    /// Failed handshakes, by [`tcpkit_tls::Reason`] (in `Reason::ALL`'s order).
    pub tls_failed: [AtomicU64; 8],
}

#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    // Single writer: a plain load/store is exact and cheaper than fetch_add.
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// The sum over threads at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub accepted: u64,
    pub closed: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub answered: u64,
    pub malformed: u64,
    pub accept_errors: u64,
    pub fd_exhausted: u64,
    pub partial_timeouts: u64,
    pub unread_timeouts: u64,
    pub evicted: u64,
    pub over_cap: u64,
    pub first_timeouts: u64,
    /// The OS error number of a recent failed accept, 0 if none failed.
    pub accept_errno: u64,
    pub tls_full: u64,
    pub tls_resumed: u64,
    pub tls_failed: [u64; 8],
}

impl Totals {
    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.accepted.saturating_sub(self.closed)
    }
}

/// Live counters of a run, readable from another thread (`--stats`).
#[derive(Debug)]
pub struct EchoCounters {
    threads: Box<[ThreadCounters]>,
}

impl EchoCounters {
    pub fn new(threads: usize) -> EchoCounters {
        EchoCounters {
            threads: (0..threads.max(1))
                .map(|_| ThreadCounters::default())
                .collect(),
        }
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for c in self.threads.iter() {
            let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
            t.accepted += g(&c.accepted);
            t.closed += g(&c.closed);
            t.bytes_in += g(&c.bytes_in);
            t.bytes_out += g(&c.bytes_out);
            t.answered += g(&c.answered);
            t.partial_timeouts += g(&c.partial_timeouts);
            t.unread_timeouts += g(&c.unread_timeouts);
            t.malformed += g(&c.malformed);
            t.accept_errors += g(&c.accept_errors);
            t.fd_exhausted += g(&c.fd_exhausted);
            t.evicted += g(&c.evicted);
            t.over_cap += g(&c.over_cap);
            t.first_timeouts += g(&c.first_timeouts);
            t.tls_full += g(&c.tls_full);
            t.tls_resumed += g(&c.tls_resumed);
            for (a, b) in t.tls_failed.iter_mut().zip(&c.tls_failed) {
                *a += g(b);
            }
            let errno = g(&c.accept_errno);
            if errno != 0 {
                t.accept_errno = errno;
            }
        }
        t
    }

    /// The `--stats` line.
    pub fn line(&self, mode: Mode) -> String {
        let t = self.totals();
        let mut s = format!(
            "open {}, accepted {}, bytes in {}, bytes out {}",
            t.open(),
            t.accepted,
            t.bytes_in,
            t.bytes_out
        );
        if matches!(mode, Mode::Dns { .. } | Mode::Http { .. }) {
            s.push_str(&format!(
                ", answered {}, malformed {}",
                t.answered, t.malformed
            ));
        }
        if t.fd_exhausted > 0 {
            s.push_str(&format!(", out of fds {}", t.fd_exhausted));
        }
        for (n, what) in [
            (t.evicted, "evicted"),
            (t.over_cap, "over cap"),
            (t.first_timeouts, "silent timed out"),
            (t.unread_timeouts, "stopped reading"),
        ] {
            if n > 0 {
                s.push_str(&format!(", {what} {n}"));
            }
        }
        s
    }
}

/// The kernel's listen-queue counters in this network namespace (`/proc/self/net/netstat`,
/// TcpExt): connections dropped because the accept or SYN queue was full, and SYN cookies
/// sent (the kernel's "possible SYN flooding" state). None when it cannot be read.
/// The file stays open and is re-read from its start: a server out of descriptors (when a
/// full queue is most likely) could not open it again.
fn listen_queue_drops(f: &mut std::fs::File, text: &mut String) -> Option<u64> {
    use std::io::{Read, Seek};
    text.clear();
    f.rewind().ok()?;
    f.read_to_string(text).ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let names: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let mut sum = 0u64;
    for (n, v) in names.iter().zip(&values) {
        if matches!(*n, "ListenOverflows" | "ListenDrops" | "SyncookiesSent") {
            sum += v.parse::<u64>().ok()?;
        }
    }
    Some(sum)
}

/// Watches the listen-queue counters while the server runs and says once, in one line, when
/// connections were dropped or answered with SYN cookies because a queue was full: the
/// clients then see slow or failed connects that the server's own counters never show.
fn watch_listen_queue(sh: &Shared<'_>, done: &AtomicBool) {
    let Ok(mut f) = std::fs::File::open("/proc/self/net/netstat") else {
        return;
    };
    let mut text = String::new();
    let Some(base) = listen_queue_drops(&mut f, &mut text) else {
        return;
    };
    while !done.load(Ordering::SeqCst) && !sh.stop.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = listen_queue_drops(&mut f, &mut text).unwrap_or(base);
        if now > base {
            let advice =
                crate::tune::hint(crate::tune::Limit::SynBacklog, crate::tune::Role::Server);
            (sh.hint)(&format!(
                "{} connections overflowed the listen queue: {advice}",
                now - base
            ));
            return;
        }
    }
}

/// Shared by all threads of a run: when to stop, the connection cap, and the one-time hints.
pub(crate) struct Shared<'a> {
    pub stop: &'a AtomicBool,
    pub deadline: Option<Instant>,
    pub fd_limit: u64,
    /// The cap on connections in this process, and how many are open now (changed once per
    /// accept and per close, never per read or write).
    pub max_conns: usize,
    pub open: AtomicUsize,
    /// The process has been full (at the cap, or out of descriptors) and has not yet fallen
    /// below `low_water`: silent connections get `first_timeout`.
    pub full: AtomicBool,
    pub low_water: usize,
    /// The out-of-descriptors hint was given.
    pub hint_given: AtomicBool,
    /// The at-the-cap hint was given.
    pub cap_hint_given: AtomicBool,
    pub hint: &'a (dyn Fn(&str) + Sync),
}

/// Runs the server until `stop` is set or the duration ends, then reports. `live` must have
/// at least `cfg.threads` thread slots. `hint` receives one-line advice (printed by the binary
/// as `tcpkit echo: <hint>`), at most once per kind per run.
pub fn run(
    cfg: &EchoConfig,
    stop: &AtomicBool,
    live: &EchoCounters,
    hint: &(dyn Fn(&str) + Sync),
) -> Result<EchoReport, EchoError> {
    let fd_limit =
        crate::raise_nofile_limit().map_err(|e| EchoError::io("raise RLIMIT_NOFILE", e))?;
    let threads = cfg.threads.clamp(1, live.threads.len());
    // Bind everything before serving anything, so a port in use is one error at start.
    let (listen, per_thread) = sock::bind_all(cfg, threads)?;
    let max_conns = cfg
        .max_conns
        .unwrap_or_else(|| default_max_conns(fd_limit, threads, listen.len()));
    let start = Instant::now();
    let shared = Shared {
        stop,
        deadline: cfg.duration.map(|d| start + d),
        fd_limit,
        max_conns,
        open: AtomicUsize::new(0),
        full: AtomicBool::new(false),
        // Half of what the process can hold (the cap, or the descriptors when --max-conns
        // asks for more than they allow): well clear of full, so the deadline does not
        // flicker on and off at the edge.
        low_water: max_conns.min(usize::try_from(fd_limit).unwrap_or(usize::MAX)) / 2,
        hint_given: AtomicBool::new(false),
        cap_hint_given: AtomicBool::new(false),
        hint,
    };
    let done = AtomicBool::new(false);
    let results: Vec<Result<(), EchoError>> = std::thread::scope(|s| {
        let watch = s.spawn(|| watch_listen_queue(&shared, &done));
        let handles: Vec<_> = per_thread
            .into_iter()
            .zip(live.threads.iter())
            .enumerate()
            .map(|(i, (listeners, counters))| {
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("tcpkit-echo-{i}"))
                    .spawn_scoped(s, move || {
                        conn::serve(cfg, listeners, counters, shared).inspect_err(|_| {
                            // One thread failing stops the others: the run is broken.
                            shared.stop.store(true, Ordering::SeqCst);
                        })
                    })
            })
            .collect();
        let results = handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(EchoError::io(
                        "event-loop thread",
                        io::Error::other("panicked"),
                    ))
                }),
                Err(e) => Err(EchoError::io("spawn event-loop thread", e)),
            })
            .collect();
        done.store(true, Ordering::SeqCst);
        let _ = watch.join();
        results
    });
    let seconds = start.elapsed().as_secs_f64();
    for r in results {
        r?;
    }
    let t = live.totals();
    let stopped_by = if stop.load(Ordering::Relaxed) {
        "signal"
    } else {
        "duration"
    };
    Ok(EchoReport::new(
        cfg,
        &listen,
        threads as u32,
        report::Limits {
            fd_limit,
            max_conns: max_conns as u64,
        },
        seconds,
        &t,
        stopped_by,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_the_reserve_and_serves_under_a_tiny_limit() {
        // 2 threads, 1 address: 16 + 2 × (epoll + listener).
        assert_eq!(fd_reserve(2, 1), 20);
        assert_eq!(default_max_conns(20_000, 2, 1), 19_980);
        assert_eq!(default_max_conns(1024, 1, 3), 1024 - 20);
        // Below the reserve: one connection per thread still.
        assert_eq!(default_max_conns(10, 4, 1), 4);
        assert_eq!(default_max_conns(0, 0, 1), 1);
    }
}
