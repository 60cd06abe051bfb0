//! The receiving side: one listening port for every stream of a session. Each accepted
//! connection must present a Hello within the handshake deadline; the first valid one opens
//! the session and binds it to its token, and later connections without that token are
//! refused and counted. Chunks go into the reorder window and out in order; credit travels
//! back as acks. When the end frame's length is reached, the hash is checked and the verdict
//! sent to the sender.
//!
//! Bounds against strangers: at most [`MAX_PENDING`](crate::MAX_PENDING) connections in
//! their handshake, a quarter of them from one address (a newcomer past either closes the
//! oldest silent one, as echo does, so strangers cannot keep a sender out), 64 bytes held
//! for each until its Hello, a deadline for the Hello, a frame left unfinished for
//! --path-timeout fails its connection (so a stranger's stalled session ends and frees the
//! port), and running out of descriptors pauses accepting for 100 ms (counted) instead of
//! ending the session.
//!
//! The pieces: [`handshake`] (a connection's Noise handshake and Hello, admitted into the
//! session or refused; the reverse stream's join), [`stream`] (a stream's frames read into
//! the reorder window), [`deliver`] (the bytes in order written out, credit acked back, the
//! verdict). This file owns the listener, the session's connections and the loop.

mod deliver;
mod handshake;
mod resume;
mod stream;

pub(crate) use deliver::{open_output, Sink};

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, Socket, Type};

use crate::duplex::{Feed, Pump};
use crate::frame::{self, Frame};
use crate::reorder::Reorder;
use crate::secure::{Channel, Psk, MAX_RECORD, REC_HDR};
use crate::send::hex;
use crate::writeout::Writer;
use crate::{
    ConnCounts, Error, Input, MpcatCounters, MpcatReport, Output, PathFailure, ReverseReport, Role,
    StreamReport,
};

/// How the receiving side runs.
#[derive(Debug, Clone)]
pub struct RecvConfig {
    pub listen: SocketAddr,
    pub output: Output,
    pub window: u64,
    pub handshake_timeout: Duration,
    pub max_pending: usize,
    /// -k: serve session after session until stopped.
    pub keep: bool,
    /// A stream's connection whose data stays unacknowledged this long has failed; with no
    /// stream connected for this long, the session fails.
    pub path_timeout: Duration,
    /// --psk-file: every connection must complete a Noise handshake under this key.
    pub psk: Option<Psk>,
    /// --mptcp: listen with IPPROTO_MPTCP (plain TCP senders are still accepted).
    pub mptcp: bool,
    /// What goes back to the connecting side when it opens the reverse stream (duplex):
    /// stdin, or -i FILE.
    pub input: Input,
    /// --duration: stop this long after the start, as at SIGINT: with -k a server stopped by
    /// its --duration (every session that began verified, none cut short: exit 0); without
    /// it, the one session asked for must have ended by then.
    pub duration: Option<Duration>,
    /// -6 on an IPv6 address: IPv6 alone (else an unspecified IPv6 address takes IPv4 too).
    pub v6only: bool,
    /// -v: each connection said on stderr as it is accepted or refused.
    pub verbose: bool,
    /// -w: once a session began, no byte written out for this long fails it.
    pub idle: Option<Duration>,
    /// --resume (with -o FILE, one session): the output is kept, not truncated, and a
    /// sender's --resume request is answered with what it holds ([`crate::resume`]).
    pub resume: bool,
}

const LISTENER: Token = Token(0);

/// The write-out thread's wake-ups.
const WRITER: Token = Token(usize::MAX);

/// How long accepting pauses after EMFILE/ENFILE.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Bytes held for a connection before its Hello is accepted.
const PENDING_BUF: usize = 64;

/// Bytes kept for records not yet opened (--psk-file): two of the largest.
const RAW_BUF: usize = 2 * (REC_HDR + MAX_RECORD);

/// A bound listening socket: made before the run so "port in use" is said before anything.
#[derive(Debug)]
pub struct Listener {
    sock: TcpListener,
    addr: SocketAddr,
    /// --mptcp asked for and this kernel has none: why, to be said once.
    mptcp_fallback: Option<String>,
}

impl Listener {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Why --mptcp could not be honoured (the listener is plain TCP then).
    pub fn mptcp_fallback(&self) -> Option<&str> {
        self.mptcp_fallback.as_deref()
    }
}

/// Binds `addr` (with `mptcp`, an IPPROTO_MPTCP listener, which takes plain TCP too; plain
/// TCP when the kernel has no MPTCP). An unspecified IPv6 address takes IPv4 too; on a host
/// without IPv6, `[::]` falls back to `0.0.0.0`.
pub fn bind(addr: SocketAddr, mptcp: bool, v6only: bool) -> Result<Listener, Error> {
    let mut mptcp_fallback = None;
    let mut proto = Protocol::TCP;
    if mptcp {
        match Socket::new(
            Domain::for_address(addr),
            Type::STREAM,
            Some(Protocol::from(crate::mptcp::IPPROTO_MPTCP)),
        ) {
            Ok(_) => proto = Protocol::from(crate::mptcp::IPPROTO_MPTCP),
            Err(e) if crate::mptcp::unsupported(&e) => {
                mptcp_fallback = Some(format!(
                    "--mptcp: this kernel does not do MPTCP (socket: {e}; is net.mptcp.enabled 1?): listening on plain TCP"
                ));
            }
            Err(e) => return Err(Error::io(format!("an MPTCP socket for {addr}"), e)),
        }
    }
    let try_bind = |a: SocketAddr| -> io::Result<Socket> {
        let s = Socket::new(Domain::for_address(a), Type::STREAM, Some(proto))?;
        if a.is_ipv6() {
            s.set_only_v6(v6only)?;
        }
        s.set_reuse_address(true)?;
        s.set_nonblocking(true)?;
        s.bind(&a.into())?;
        s.listen(1024)?;
        Ok(s)
    };
    let s = match try_bind(addr) {
        Ok(s) => s,
        Err(e)
            if addr.ip() == Ipv6Addr::UNSPECIFIED
                && !v6only
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
                ) =>
        {
            let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
            try_bind(v4).map_err(|e| Error::io(format!("listen on {v4}"), e))?
        }
        Err(e) => return Err(Error::io(format!("listen on {addr}"), e)),
    };
    let std: std::net::TcpListener = s.into();
    let addr = std
        .local_addr()
        .map_err(|e| Error::io("getsockname of the listener", e))?;
    Ok(Listener {
        sock: TcpListener::from_std(std),
        addr,
        mptcp_fallback,
    })
}

#[derive(Debug)]
enum State {
    /// Accepted, waiting for its Hello.
    Pending {
        deadline: Instant,
        buf: [u8; PENDING_BUF],
        len: usize,
    },
    /// One of the session's streams.
    Stream {
        index: u16,
        /// Frames not yet parsed (plaintext).
        inbuf: Vec<u8>,
        in_len: usize,
        bytes: u64,
        /// --psk-file: records not yet opened into `inbuf` (empty without).
        raw: Vec<u8>,
        raw_len: usize,
        /// Plain: the data frame whose payload is being read straight into the window, as
        /// (its first offset, the next offset to read, its end).
        payload: Option<(u64, u64, u64)>,
    },
}

#[derive(Debug)]
struct Conn {
    sock: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    state: State,
    /// Frames for the sender not yet written (acks, the verdict).
    out: Vec<u8>,
    out_pos: usize,
    /// --psk-file: this connection's keys, once its Noise handshake is done.
    chan: Option<Channel>,
    /// When bytes last arrived on it (a stream's): a frame begun and left unfinished for
    /// --path-timeout fails the connection.
    last_in: Instant,
}

impl Conn {
    /// Queues a frame for the sender: sealed into a record when encrypted.
    fn put(&mut self, f: &Frame<'_>) {
        let mut b = [0u8; 64 + frame::MAX_REASON];
        let n = f.emit(&mut b);
        match self.chan.as_mut() {
            Some(ch) => ch.seal(&b[..n], &mut self.out),
            None => self.out.extend_from_slice(&b[..n]),
        }
    }
}

/// The reverse connection (duplex), once one joined.
enum Reverse {
    None,
    /// Joined before the session's first stream: it waits for it (at most the Hello
    /// deadline), and its token must be the session's.
    Parked {
        token: frame::Token,
        sock: std::net::TcpStream,
        chan: Option<Channel>,
        unsent: Vec<u8>,
        chunk: u32,
        since: Instant,
    },
    Running(Pump),
}

struct Session {
    token: frame::Token,
    streams: u16,
    chunk: u32,
    reorder: Reorder,
    /// Writes out (and hashes) what the window hands out; started with the first of it.
    writer: Option<Writer>,
    /// With an inline writer: where a payload that comes in order is read before it is
    /// written, past the ring. Small enough to stay in the CPU's cache between the two
    /// copies, as socat's 128 KiB buffer does; the ring (the credit's size) cycles through
    /// more memory than the cache holds, and each read into it wrote to memory.
    direct: Vec<u8>,
    end: Option<(u64, crate::Digest)>,
    /// The furthest end of a data frame whose payload is being read (its header checked):
    /// an end frame below it is refused as one below bytes already held.
    reading_to: u64,
    /// Connection of each stream index, once it joined.
    joined: Vec<Option<Token>>,
    /// Each stream index has joined once.
    seen: Vec<bool>,
    last_ack: u64,
    /// Stream bytes of every stream that has left (its connection closed after the end).
    verdict: Option<bool>,
    /// --resume: where the session's resumption stands.
    resume: resume::Step,
    /// --resume: the stream hash over the held part, for the write-out to go on from.
    seed: Option<crate::StreamHasher>,
}

/// Runs the receiving side on `listener` until one session is complete (or fails), or
/// `stop`; with `keep`, session after session (each with its own token, written one after
/// another to the output; `on_session` sees each one's report) until `stop`. The output is
/// opened first: a file that cannot be created fails before any connection is accepted.
pub fn run(
    cfg: &RecvConfig,
    mut listener: Listener,
    stop: &AtomicBool,
    live: &MpcatCounters,
    on_session: &dyn Fn(&MpcatReport),
) -> Result<MpcatReport, Error> {
    let mut sink = open_output(&cfg.output, cfg.resume)?;
    // A file to send back is opened now, so a missing one is said before anything is
    // accepted; stdin is read only once a peer asks for the reverse stream.
    let mut feed = match &cfg.input {
        Input::File(_) => Some(Feed::start(&cfg.input)?),
        Input::Stdin => None,
    };
    let mut poll = Poll::new().map_err(|e| Error::io("epoll_create", e))?;
    poll.registry()
        .register(&mut listener.sock, LISTENER, Interest::READABLE)
        .map_err(|e| Error::io("epoll_ctl on the listener", e))?;
    let waker = Arc::new(
        mio::Waker::new(poll.registry(), WRITER)
            .map_err(|e| Error::io("eventfd for the write-out", e))?,
    );
    let mut counts = ConnCounts::default();
    let (mut began, mut verified, mut run_bytes) = (0u64, 0u64, 0u64);
    let run_start = Instant::now();
    let mut last: Option<MpcatReport> = None;
    let until = cfg.duration.map(|d| Instant::now() + d);
    let expired = || until.is_some_and(|u| Instant::now() >= u);
    loop {
        // -k into a file: where this session's bytes begin, to cut them off again unless
        // the session is verified.
        let session_at = cfg.keep.then(|| sink.position()).flatten();
        let mut rx = Receiver {
            cfg,
            conns: HashMap::new(),
            next: 1,
            counts,
            session: None,
            paused_until: None,
            started: None,
            finished: Vec::new(),
            failures: Vec::new(),
            reconnects: 0,
            none_since: None,
            reverse: Reverse::None,
            feed: feed.take(),
            forward_done: false,
            delivered: None,
            again: Vec::new(),
            waker: Arc::clone(&waker),
            until,
            moved: None,
        };
        let failure = rx
            .event_loop(&mut poll, &listener, &mut sink, stop, live)
            .err()
            .map(|e| e.line());
        if let Some(why) = &failure {
            rx.abort(why);
        }
        let reverse = rx.end_reverse(failure.is_some());
        feed = rx.feed.take();
        counts = rx.counts;
        let had_session = rx.session.is_some();
        let mut report = rx.report(failure, &listener);
        if let Some(r) = reverse {
            if let (None, Some(why)) = (&report.failure, &r.failure) {
                report.failure = Some(format!(
                    "the reverse stream (here to the connecting side): {why}"
                ));
            }
            report.reverse = Some(r);
        }
        if had_session {
            began += 1;
            let ok = report.verified && report.failure.is_none();
            verified += u64::from(ok);
            run_bytes += report.bytes;
            if let (false, Some(at)) = (ok, session_at) {
                // A session that failed (a stranger's, a sender cut off) leaves nothing in the
                // file between verified ones: its bytes are cut off again.
                sink.cut_back(at)?;
            }
        }
        report.sessions = began;
        report.sessions_verified = verified;
        if !cfg.keep {
            return Ok(report);
        }
        let stopped = stop.load(Ordering::Relaxed);
        if had_session && !stopped && !expired() {
            on_session(&report);
            last = Some(report);
            // The next session's live line starts from nothing.
            live.bytes.store(0, Ordering::Relaxed);
            live.total.store(0, Ordering::Relaxed);
            continue;
        }
        // Stopped: the last session (or this one, cut short) with the run's verdict.
        let r = if had_session {
            report
        } else {
            last.unwrap_or(report)
        };
        let tally = Tally {
            began,
            verified,
            had_session,
            // A server stopped by its --duration did what was asked, sessions or none.
            by_duration: !stopped && expired(),
        };
        let mut r = tally.verdict(r, counts);
        r.run = Some(crate::RunTotal {
            sessions: began,
            sessions_verified: verified,
            bytes: run_bytes,
            seconds: run_start.elapsed().as_secs_f64(),
        });
        return Ok(r);
    }
}

/// A -k run's sessions when it stops.
struct Tally {
    began: u64,
    verified: u64,
    /// A session was under way when it stopped.
    had_session: bool,
    /// Stopped by --duration, not by a signal.
    by_duration: bool,
}

impl Tally {
    /// The run's report: the last session's (or the one cut short), with the run's counts
    /// and verdict: every session that began verified, and one at least unless --duration
    /// stopped it.
    fn verdict(&self, mut r: MpcatReport, counts: ConnCounts) -> MpcatReport {
        let (began, verified) = (self.began, self.verified);
        r.sessions = began;
        r.sessions_verified = verified;
        r.connections = counts;
        // `verified` is the last session's own, as every field but `run` (which the run's
        // verdict reads from `failure` and the counts): after an earlier failure a verified
        // last session was called "NOT verified". With no session, a server stopped by its
        // --duration did what was asked.
        if began == 0 {
            r.verified = self.by_duration;
        }
        r.failure = match (began, self.had_session) {
            (0, _) if self.by_duration => None,
            (0, _) => Some("stopped before any session began".into()),
            (_, true) => r.failure.take(),
            _ if verified < began => Some(format!(
                "{} of {began} sessions were not verified",
                began - verified
            )),
            _ => None,
        };
        r
    }
}

struct Receiver<'c> {
    cfg: &'c RecvConfig,
    conns: HashMap<Token, Conn>,
    next: usize,
    counts: ConnCounts,
    session: Option<Session>,
    paused_until: Option<Instant>,
    /// When the session's first stream joined.
    started: Option<Instant>,
    /// Streams whose connection is gone, for the report.
    finished: Vec<StreamReport>,
    failures: Vec<PathFailure>,
    reconnects: u64,
    /// Since when no stream of the session has been connected.
    none_since: Option<Instant>,
    reverse: Reverse,
    /// The listener's input, read for the reverse streams of every session of the run.
    feed: Option<Arc<Feed>>,
    /// The forward stream is written and verified (the reverse one may still run).
    forward_done: bool,
    /// When it was.
    delivered: Option<Instant>,
    /// Streams that stopped reading at [`READ_BUDGET`] with bytes still in their socket
    /// (edge-triggered: no new event would say so): read again after the write-out.
    again: Vec<Token>,
    waker: Arc<mio::Waker>,
    /// --duration: when the run stops.
    until: Option<Instant>,
    /// -w: when the bytes written out last changed, and to what.
    moved: Option<(Instant, u64)>,
}

impl Receiver<'_> {
    /// -v: a connection's line on stderr.
    fn say(&self, m: &str) {
        if self.cfg.verbose {
            eprintln!("tcpkit mpcat: {m}");
        }
    }

    /// This session's report (`failure`: why its loop ended, if it failed).
    fn report(&mut self, failure: Option<String>, listener: &Listener) -> MpcatReport {
        let cfg = self.cfg;
        let rx = self;
        let started = rx.started.unwrap_or_else(Instant::now);
        // The forward stream's time: a reverse stream waited for afterwards is not in it.
        let secs = rx
            .delivered
            .unwrap_or_else(Instant::now)
            .duration_since(started)
            .as_secs_f64();
        let mut streams = std::mem::take(&mut rx.finished);
        for c in rx.conns.values() {
            if let State::Stream { index, bytes, .. } = c.state {
                streams.push(StreamReport {
                    index,
                    local: c.local.to_string(),
                    peer: c.peer.to_string(),
                    bytes,
                    path: None,
                    chunk_max: None,
                });
            }
        }
        // One line per stream index: a stream that reconnected sums its connections' bytes and
        // shows its latest connection.
        streams.sort_by_key(|s| s.index);
        streams.dedup_by(|later, first| {
            if later.index != first.index {
                return false;
            }
            first.bytes += later.bytes;
            first.local = std::mem::take(&mut later.local);
            first.peer = std::mem::take(&mut later.peer);
            true
        });
        if let Some(s) = rx.session.as_mut() {
            // What was handed out is written before the count (and the output) is final.
            if let Some(mut w) = s.writer.take() {
                s.reorder.release(w.close());
            }
        }
        let s = rx.session.as_ref();
        let written = s.map_or(0, |s| s.reorder.released());
        // --resume: the rate is what moved in this session, not the part held before.
        let moved = written
            - s.and_then(|s| s.resume.report(written))
                .map_or(0, |r| r.held);
        let verified = failure.is_none() && s.and_then(|s| s.verdict) == Some(true);
        let failure = failure.or_else(|| (!verified).then(|| "the stream was not verified".into()));
        MpcatReport {
            schema_version: crate::report::SCHEMA_VERSION,
            role: Role::Receive,
            address: listener.addr.to_string(),
            bytes: written,
            total: s.and_then(|s| s.end.map(|e| e.0)),
            seconds: secs,
            bytes_per_second: if secs > 0.0 { moved as f64 / secs } else { 0.0 },
            chunk_size: s.map_or(0, |s| u64::from(s.chunk)),
            window: s.map_or(cfg.window, |s| s.reorder.window()),
            encrypted: cfg.psk.is_some(),
            mptcp: None,
            streams,
            egress: None,
            path_failures: std::mem::take(&mut rx.failures),
            reconnects: rx.reconnects,
            resent_bytes: 0,
            hash: s.and_then(|s| {
                s.end
                    .map(|(_, h)| format!("{}:{}", crate::HASH_NAME, hex(&h)))
            }),
            verified,
            connections: rx.counts,
            sessions: 0,
            sessions_verified: 0,
            failure,
            reverse: None,
            run: None,
            resume: s.and_then(|s| s.resume.report(written)),
        }
    }

    /// The session failed here (a full disk, Ctrl-C): tells the sender why on every stream
    /// ([`Frame::Abort`]), so it fails at once with this reason instead of finding its
    /// connections closed and waiting out --path-timeout. Frames here are whole in `out`, so
    /// the abort follows them; bounded by [`crate::ABORT_GRACE`].
    fn abort(&mut self, why: &str) {
        let until = Instant::now() + crate::ABORT_GRACE;
        let mut conns: Vec<&mut Conn> = self
            .conns
            .values_mut()
            .filter(|c| matches!(c.state, State::Stream { .. }))
            .collect();
        for c in &mut conns {
            c.put(&Frame::Abort { reason: why });
        }
        loop {
            let mut pending = false;
            for c in &mut conns {
                match flush(c) {
                    Ok(()) => pending |= !c.out.is_empty(),
                    Err(_) => c.out.clear(),
                }
            }
            if !pending || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut socks: Vec<&mut TcpStream> = conns.into_iter().map(|c| &mut c.sock).collect();
        crate::linger(&mut socks, until);
    }

    /// The session is over (`failed`: before its end): the reverse stream's report, once its
    /// thread is done (stopped at once when the session failed).
    fn end_reverse(&mut self, failed: bool) -> Option<ReverseReport> {
        match std::mem::replace(&mut self.reverse, Reverse::None) {
            Reverse::Running(p) => {
                if failed || !p.finished() {
                    p.abort();
                }
                Some(p.join())
            }
            Reverse::Parked { .. } | Reverse::None => None,
        }
    }

    fn event_loop(
        &mut self,
        poll: &mut Poll,
        listener: &Listener,
        sink: &mut Sink,
        stop: &AtomicBool,
        live: &MpcatCounters,
    ) -> Result<(), Error> {
        let mut events = Events::with_capacity(512);
        loop {
            if let Some(d) = self.cfg.duration.filter(|_| {
                self.until.is_some_and(|u| Instant::now() >= u) && !stop.load(Ordering::Relaxed)
            }) {
                return Err(Error::msg(match &self.session {
                    None => format!("--duration {d:?} ended before a session began"),
                    Some(_) if self.forward_done => {
                        format!("--duration {d:?} ended before the reverse stream did")
                    }
                    Some(s) => format!(
                        "--duration {d:?} ended the session: {} bytes written, the stream not complete",
                        s.reorder.written()
                    ),
                }));
            }
            if stop.load(Ordering::Relaxed) {
                return Err(Error::msg(match &self.session {
                    None => "interrupted before a session began".to_string(),
                    Some(_) if self.forward_done => {
                        "interrupted before the reverse stream ended".into()
                    }
                    Some(s) => format!(
                        "interrupted: {} bytes written, the stream not complete",
                        s.reorder.written()
                    ),
                }));
            }
            let wait = if self.again.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
            match poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("epoll_wait", e)),
            }
            let now = Instant::now();
            let mut accept = self.paused_until.is_some_and(|t| now >= t);
            // One read (one budget) per stream per round: a stream left over from the last
            // round and signalled again is read once, below. Read twice, it was left over
            // again twice, and so on: the rounds grew until the socket ran dry (writes of
            // 7-17 MB instead of 1-2, the bytes cold when written and hashed).
            let again = std::mem::take(&mut self.again);
            for ev in events.iter() {
                if ev.token() == LISTENER {
                    accept = true;
                    continue;
                }
                if ev.token() == WRITER {
                    continue;
                }
                let t = ev.token();
                let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
                if readable && !again.contains(&t) {
                    self.read(poll, t)?;
                    if let Some(State::Stream { index, bytes, .. }) =
                        self.conns.get(&t).map(|c| &c.state)
                    {
                        live.set_stream(usize::from(*index), *bytes);
                    }
                }
                if ev.is_writable() {
                    if let Some(c) = self.conns.get_mut(&t) {
                        if let Err(e) = flush(c) {
                            self.lost(poll, t, &e.line())?;
                        }
                    }
                }
            }
            for t in again {
                self.read(poll, t)?;
                if let Some(State::Stream { index, bytes, .. }) =
                    self.conns.get(&t).map(|c| &c.state)
                {
                    live.set_stream(usize::from(*index), *bytes);
                }
            }
            if accept {
                self.accept(poll, listener)?;
            }
            self.expire(poll, now)?;
            self.check_paths(now)?;
            self.answer_resume(sink)?;
            self.write_out(poll, sink)?;
            self.check_idle(now)?;
            if let Some(s) = &self.session {
                live.bytes.store(s.reorder.released(), Ordering::Relaxed);
                if let Some((total, _)) = s.end {
                    live.total.store(total, Ordering::Relaxed);
                }
            }
            if !self.forward_done && self.finish(poll, sink)? {
                self.forward_done = true;
                self.delivered = Some(Instant::now());
                if !matches!(self.reverse, Reverse::Running(_)) {
                    return Ok(());
                }
                // The peer may be waiting for EOF to answer (-N); with -k the output goes
                // on to the next session.
                if !self.cfg.keep {
                    sink.close();
                }
            }
            if self.forward_done {
                match &self.reverse {
                    Reverse::Running(p) if !p.finished() => {}
                    _ => return Ok(()),
                }
            }
        }
    }

    fn accept(&mut self, poll: &mut Poll, listener: &Listener) -> Result<(), Error> {
        self.paused_until = None;
        loop {
            match listener.sock.accept() {
                Ok((mut sock, peer)) => {
                    if !self.make_room(poll, unmapped(peer).ip()) {
                        self.counts.over_cap += 1;
                        continue; // dropped: closed
                    }
                    let t = Token(self.next);
                    self.next += 1;
                    if poll
                        .registry()
                        .register(&mut sock, t, Interest::READABLE | Interest::WRITABLE)
                        .is_err()
                    {
                        self.counts.accept_errors += 1;
                        continue;
                    }
                    let peer = unmapped(peer);
                    let local = unmapped(sock.local_addr().unwrap_or(listener.addr));
                    let _ = sock.set_nodelay(true);
                    self.conns.insert(
                        t,
                        Conn {
                            sock,
                            peer,
                            local,
                            state: State::Pending {
                                deadline: Instant::now() + self.cfg.handshake_timeout,
                                buf: [0; PENDING_BUF],
                                len: 0,
                            },
                            out: Vec::new(),
                            out_pos: 0,
                            chan: None,
                            last_in: Instant::now(),
                        },
                    );
                    // Bytes may have come with the connection: edge-triggered, so look now.
                    self.read(poll, t)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.counts.accept_errors += 1;
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) {
                        // Out of descriptors or memory: the queue waits; try again soon.
                        self.paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Makes a handshake slot for a newcomer from `ip`, as echo does: an address holding a
    /// quarter of the cap (16 of 64), or a listener at its cap, closes its oldest silent connection in
    /// the handshake (else its oldest in the handshake) for it, counted as evicted. A
    /// stranger that keeps the slots full (13 silent connections a second against a 5 s
    /// deadline) then only ever holds slots a sender's newer connection may take; one
    /// address holds at most a quarter of them, so it cannot evict the others'. False only
    /// when there is no slot to take (a cap of 0).
    fn make_room(&mut self, poll: &mut Poll, ip: std::net::IpAddr) -> bool {
        let mut total = 0usize;
        let mut same = 0usize;
        // (silent, accepted when), oldest silent first: the one to close.
        let mut victim: Option<((bool, Instant), Token)> = None;
        let mut own: Option<((bool, Instant), Token)> = None;
        for (t, c) in &self.conns {
            let State::Pending { deadline, len, .. } = c.state else {
                continue;
            };
            total += 1;
            // Sorts silent (false) before spoken, then the oldest first.
            let key = (len > 0 || c.chan.is_some(), deadline);
            let mine = c.peer.ip() == ip;
            same += usize::from(mine);
            if victim.is_none_or(|(k, _)| key < k) {
                victim = Some((key, *t));
            }
            if mine && own.is_none_or(|(k, _)| key < k) {
                own = Some((key, *t));
            }
        }
        let per_source = (self.cfg.max_pending / 4).max(1);
        let out = if same >= per_source {
            own
        } else if total >= self.cfg.max_pending {
            victim
        } else {
            return true;
        };
        let Some((_, t)) = out else {
            return false;
        };
        self.counts.evicted += 1;
        if let Some(c) = self.drop_conn(poll, t) {
            self.say(&format!(
                "closed {} to make room (in its handshake, the oldest{})",
                c.peer,
                if same >= per_source {
                    " of its address"
                } else {
                    ""
                }
            ));
        }
        true
    }

    /// Closes connections whose Hello is late, and a reverse connection whose session's
    /// first stream is.
    fn expire(&mut self, poll: &mut Poll, now: Instant) -> Result<(), Error> {
        if let Reverse::Parked { since, .. } = &self.reverse {
            if self.session.is_none() && now >= *since + self.cfg.handshake_timeout {
                self.counts.handshake_timeout += 1;
                self.reverse = Reverse::None;
            }
        }
        let late: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.state, State::Pending { deadline, .. } if now >= deadline))
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            self.counts.handshake_timeout += 1;
            self.drop_conn(poll, t);
        }
        // A frame begun and not finished for --path-timeout: a sender's path that died
        // mid-frame, or a stranger who opened a session (no key: a Hello is all it takes)
        // and holds it with a frame it never finishes. Either way the connection goes; with
        // none left for --path-timeout the session ends and the port is free again.
        let limit = self.cfg.path_timeout;
        let stalled: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                let State::Stream {
                    in_len,
                    raw_len,
                    payload,
                    ..
                } = &c.state
                else {
                    return false;
                };
                (*in_len > 0 || *raw_len > 0 || payload.is_some())
                    && now.saturating_duration_since(c.last_in) >= limit
            })
            .map(|(t, _)| *t)
            .collect();
        for t in stalled {
            if let Some(c) = self.conns.get_mut(&t) {
                // A reset: the stranger gets no orderly close to wait on.
                let _ = socket2::SockRef::from(&c.sock).set_linger(Some(Duration::ZERO));
            }
            self.lost(
                poll,
                t,
                &format!("a frame begun and not finished for {limit:?}: closed"),
            )?;
        }
        Ok(())
    }

    fn drop_conn(&mut self, poll: &mut Poll, t: Token) -> Option<Conn> {
        let mut c = self.conns.remove(&t)?;
        let _ = poll.registry().deregister(&mut c.sock);
        Some(c)
    }

    /// A session stream's connection failed or closed. Before the end it is a path
    /// failure, counted and named in the report; the sender re-sends its chunks on the
    /// other streams and reopens it. Only with no stream left for --path-timeout does the
    /// session fail (in the event loop).
    fn lost(&mut self, poll: &mut Poll, t: Token, why: &str) -> Result<(), Error> {
        let Some(c) = self.drop_conn(poll, t) else {
            return Ok(());
        };
        let State::Stream { index, bytes, .. } = c.state else {
            return Ok(());
        };
        let (local, peer) = (c.local.to_string(), c.peer.to_string());
        self.finished.push(StreamReport {
            index,
            local: local.clone(),
            peer: peer.clone(),
            bytes,
            path: None,
            chunk_max: None,
        });
        let Some(s) = self.session.as_mut() else {
            return Ok(());
        };
        if let Some(slot) = s.joined.get_mut(usize::from(index)) {
            if *slot == Some(t) {
                *slot = None;
            }
        }
        if s.verdict.is_none() {
            self.failures.push(PathFailure {
                stream: index,
                local,
                peer,
                at: self.started.map_or(0.0, |t| t.elapsed().as_secs_f64()),
                why: why.to_string(),
            });
        }
        Ok(())
    }

    /// -w: fails a session that has written nothing out for that long (the reverse stream
    /// running after the forward one was delivered is not idleness).
    fn check_idle(&mut self, now: Instant) -> Result<(), Error> {
        let (Some(idle), Some(s)) = (self.cfg.idle, self.session.as_ref()) else {
            return Ok(());
        };
        if self.forward_done {
            return Ok(());
        }
        let written = s.reorder.released();
        match self.moved {
            Some((at, n)) if n == written && now.duration_since(at) >= idle => Err(Error::msg(
                format!("-w {idle:?}: nothing arrived for that long, {written} bytes written"),
            )),
            Some((_, n)) if n == written => Ok(()),
            _ => {
                self.moved = Some((now, written));
                Ok(())
            }
        }
    }

    /// Fails the session when no stream has been connected for --path-timeout.
    fn check_paths(&mut self, now: Instant) -> Result<(), Error> {
        let Some(s) = self.session.as_ref() else {
            return Ok(());
        };
        // Delivered: its connections may go while the reverse stream runs.
        if s.joined.iter().any(Option::is_some) || s.verdict.is_some() {
            self.none_since = None;
            return Ok(());
        }
        let since = *self.none_since.get_or_insert(now);
        if now.duration_since(since) < self.cfg.path_timeout {
            return Ok(());
        }
        let of = s
            .end
            .map_or_else(|| "an unknown total".to_string(), |e| e.0.to_string());
        let last = self.failures.last().map_or_else(String::new, |f| {
            format!(" (last: stream {} from {}: {})", f.stream, f.peer, f.why)
        });
        Err(Error::msg(format!(
            "stream connections closed before the end and none came back within {:?}: {} bytes written of {of}{last}",
            self.cfg.path_timeout,
            s.reorder.written()
        )))
    }
}

/// The reorder window of a session of `streams` streams under `--window`. One stream is one
/// TCP connection: its bytes arrive in order, and the window only has to cover what the
/// sockets hold and the write-out's pauses. Its ring is where every byte is received, and a
/// ring larger than the CPU's cache makes each receive a write to memory: on one veth
/// (400 MB, 5 interleaved runs, load 6) a 64 MiB ring gave 588 MB/s against socat's 687,
/// 16 MiB 687 and 8 MiB 702.
pub fn session_window(window: u64, streams: u16) -> u64 {
    if streams == 1 {
        window.min(ONE_STREAM_WINDOW)
    } else {
        window
    }
}

/// What the map of held ranges costs per range, counted against the window: a
/// `BTreeMap<u64, u64>` entry with its share of a node and the allocator's rounding (34 bytes
/// measured with nodes filled in order; 64 leaves room for nodes half emptied).
pub const GAP_COST: usize = 64;

/// The reorder ring's size and the most separate held ranges for a session window of
/// `window` bytes whose largest chunk is `chunk`: the map of held ranges counts against the
/// window, so ring and map together stay within it. Chunks are at least the smallest the
/// declared size allows but the last; twice that many in a window is more separate pieces
/// than an honest sender makes, and a sender that scatters smaller ones (down to one byte)
/// finds the map at most a 64th of the window. Before, the map came on top: 2 x window / 1024
/// ranges for a declared chunk of 1 KiB, 1157 MB of RSS at --window 1G against 1090 stated.
pub fn window_parts(window: usize, chunk: u32) -> (usize, usize) {
    let honest = 2 * window / crate::smallest_chunk(chunk) as usize + 16;
    let max_gaps = honest.min(window / 64 / GAP_COST).max(16);
    (window - max_gaps * GAP_COST, max_gaps)
}

/// The most a session of one stream holds ([`session_window`]).
pub const ONE_STREAM_WINDOW: u64 = 16 << 20;

/// An IPv4 peer of the dual-stack listener as IPv4 (`198.19.0.1:40000`, not
/// `[::ffff:198.19.0.1]:40000`).
fn unmapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())),
            None => a,
        },
        SocketAddr::V4(_) => a,
    }
}

/// Writes what `c` has pending for the sender.
fn flush(c: &mut Conn) -> Result<(), Error> {
    flush_out(&mut c.sock, &mut c.out, &mut c.out_pos)
}

/// [`flush`] on a connection's parts, for a caller that holds its state borrowed.
fn flush_out(sock: &mut TcpStream, out: &mut Vec<u8>, out_pos: &mut usize) -> Result<(), Error> {
    while *out_pos < out.len() {
        match sock.write(&out[*out_pos..]) {
            Ok(0) => return Err(Error::msg("write returned 0")),
            Ok(n) => *out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("write", e)),
        }
    }
    out.clear();
    *out_pos = 0;
    Ok(())
}

/// What the receiver's unit tests share: the real receiver on loopback on its own thread,
/// and a sender played by the test over a plain TCP connection, speaking the wire format.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::io::Read;
    use std::net::TcpStream as StdStream;

    /// A receiver's settings for a test: loopback, a small window, short deadlines, its
    /// output in `out`.
    pub(crate) fn config(out: &std::path::Path) -> RecvConfig {
        RecvConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            output: Output::File(out.to_path_buf()),
            window: 1 << 20,
            handshake_timeout: Duration::from_secs(2),
            max_pending: 8,
            keep: false,
            path_timeout: Duration::from_secs(2),
            psk: None,
            mptcp: false,
            input: Input::Stdin,
            duration: None,
            v6only: false,
            verbose: false,
            idle: None,
            resume: false,
        }
    }

    /// A receiver running [`run`] on its own thread.
    pub(crate) struct Running {
        pub(crate) addr: SocketAddr,
        pub(crate) stop: Arc<AtomicBool>,
        thread: std::thread::JoinHandle<Result<MpcatReport, Error>>,
    }

    impl Running {
        pub(crate) fn start(cfg: RecvConfig) -> Running {
            let l = bind(cfg.listen, false, false).unwrap();
            let addr = l.local_addr();
            let stop = Arc::new(AtomicBool::new(false));
            let s = Arc::clone(&stop);
            let thread =
                std::thread::spawn(move || run(&cfg, l, &s, &MpcatCounters::default(), &|_| {}));
            Running { addr, stop, thread }
        }

        /// Its report, once it ends by itself (10 s at most).
        pub(crate) fn report(self) -> MpcatReport {
            let until = Instant::now() + Duration::from_secs(10);
            while !self.thread.is_finished() {
                assert!(Instant::now() < until, "the receiver did not end");
                std::thread::sleep(Duration::from_millis(10));
            }
            self.thread.join().unwrap().unwrap()
        }
    }

    /// A connection to the receiver, answers read with a deadline.
    pub(crate) fn dial(addr: SocketAddr) -> StdStream {
        let s = StdStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    pub(crate) fn put(s: &mut StdStream, f: &Frame<'_>) {
        let mut b = Vec::new();
        f.emit_vec(&mut b);
        s.write_all(&b).unwrap();
    }

    pub(crate) fn hello(token: u8, stream: u16, streams: u16, chunk: u32) -> Frame<'static> {
        Frame::Hello {
            version: frame::VERSION,
            token: [token; 16],
            stream,
            streams,
            chunk,
        }
    }

    /// A data frame of `payload` at `seq`.
    pub(crate) fn data(s: &mut StdStream, seq: u64, payload: &[u8]) {
        s.write_all(&frame::data_header(seq, payload.len()))
            .unwrap();
        s.write_all(payload).unwrap();
    }

    /// Reads frames until `want` says yes to one; every frame read is passed to it. None
    /// when the connection closed first.
    pub(crate) fn until(s: &mut StdStream, want: &mut dyn FnMut(Frame<'_>) -> bool) -> bool {
        let mut buf = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            loop {
                match Frame::parse(&buf) {
                    Ok((f, used)) => {
                        let hit = want(f);
                        buf.drain(..used);
                        if hit {
                            return true;
                        }
                    }
                    Err(frame::FrameError::Truncated { .. }) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            match s.read(&mut b) {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&b[..n]),
            }
        }
    }

    /// The first frame the receiver answers with, as text.
    pub(crate) fn answer(s: &mut StdStream) -> String {
        let mut got = String::from("closed");
        until(s, &mut |f| {
            got = format!("{f:?}");
            true
        });
        got
    }

    /// `len` bytes, `i * 13 + k` each.
    pub(crate) fn pattern(len: usize, k: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(k))
            .collect()
    }

    /// A path under the temp dir for test `tag`, removed when dropped.
    pub(crate) struct Temp(pub(crate) std::path::PathBuf);
    impl Temp {
        pub(crate) fn new(tag: &str) -> Temp {
            Temp(std::env::temp_dir().join(format!("mpcat-recv-{tag}-{}", std::process::id())))
        }
    }
    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    /// The map of held ranges counts against the window: ring and map together stay within
    /// it, however small the chunks a sender declares.
    #[test]
    fn ring_and_map_together_stay_within_the_window() {
        for window in [1usize << 20, 64 << 20, 256 << 20, 1 << 30, 4 << 30] {
            for chunk in [1024u32, 4096, 64 << 10, 1 << 20] {
                let (ring, gaps) = window_parts(window, chunk);
                assert!(ring + gaps * GAP_COST <= window, "{window} {chunk}");
                assert!(
                    gaps * GAP_COST <= window / 64 || gaps == 16,
                    "{window} {chunk}"
                );
                assert!(gaps >= 16);
            }
        }
        // Default chunks: the map's share is small and the ring nearly the whole window.
        let (ring, gaps) = window_parts(1 << 30, 1 << 20);
        assert_eq!(gaps, 2 * (1 << 30) / (64 << 10) + 16);
        assert_eq!(ring, (1 << 30) - gaps * GAP_COST);
        // A declared chunk of 1 KiB: at 1 GiB, 2 Mi ranges before, a 64th of the window now.
        assert_eq!(window_parts(1 << 30, 1024).1, (1 << 30) / 64 / GAP_COST);
    }

    #[test]
    fn an_ipv4_peer_of_the_dual_stack_listener_reads_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:198.19.0.1]:40000".parse().unwrap();
        assert_eq!(unmapped(mapped).to_string(), "198.19.0.1:40000");
        let v6: SocketAddr = "[2001:db8::1]:9".parse().unwrap();
        assert_eq!(unmapped(v6), v6);
    }

    #[test]
    fn a_port_in_use_is_said_before_anything_runs() {
        let first = bind(SocketAddr::from(([127, 0, 0, 1], 0)), false, false).unwrap();
        // SO_REUSEADDR does not let two listeners share a port.
        let e = bind(first.local_addr(), false, false).unwrap_err();
        let line = e.line();
        assert!(
            line.starts_with(&format!("listen on {}: ", first.local_addr())),
            "{line}"
        );
        assert!(line.contains("in use"), "{line}");
    }

    #[test]
    fn one_session_of_two_streams_is_written_in_order_and_verified() {
        let out = Temp::new("two");
        let rx = Running::start(config(&out.0));
        let stream = pattern(300_000, 1);
        let (a, b) = (&stream[..150_000], &stream[150_000..]);
        let mut s0 = dial(rx.addr);
        let mut s1 = dial(rx.addr);
        put(&mut s0, &hello(7, 0, 2, 64 << 10));
        assert!(answer(&mut s0).starts_with("Welcome"));
        put(&mut s1, &hello(7, 1, 2, 64 << 10));
        assert!(answer(&mut s1).starts_with("Welcome"));
        // The second half first, on the other stream: it waits in the window.
        for (k, piece) in b.chunks(64 << 10).enumerate() {
            data(&mut s1, 150_000 + (k * (64 << 10)) as u64, piece);
        }
        for (k, piece) in a.chunks(64 << 10).enumerate() {
            data(&mut s0, (k * (64 << 10)) as u64, piece);
        }
        put(
            &mut s0,
            &Frame::End {
                total: stream.len() as u64,
                hash: crate::stream_hash(&stream),
            },
        );
        let mut done = None;
        until(&mut s0, &mut |f| match f {
            Frame::Done { total, ok } => {
                done = Some((total, ok));
                true
            }
            _ => false,
        });
        assert_eq!(done, Some((stream.len() as u64, true)));
        let r = rx.report();
        assert_eq!(r.failure, None);
        assert!(r.verified);
        assert_eq!(r.bytes, stream.len() as u64);
        assert_eq!(r.streams.len(), 2);
        assert_eq!(r.streams[1].bytes, b.len() as u64);
        assert_eq!(std::fs::read(&out.0).unwrap(), stream);
    }

    #[test]
    fn duration_stops_a_server_with_success_and_one_session_asked_for_with_a_reason() {
        let out = Temp::new("duration");
        let mut cfg = config(&out.0);
        cfg.duration = Some(Duration::from_millis(300));
        cfg.keep = true;
        let started = Instant::now();
        let r = Running::start(cfg.clone()).report();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            (r.failure.as_deref(), r.verified, r.sessions),
            (None, true, 0)
        );
        cfg.keep = false;
        let r = Running::start(cfg).report();
        assert_eq!(
            r.failure.as_deref(),
            Some("--duration 300ms ended before a session began")
        );
    }
}
