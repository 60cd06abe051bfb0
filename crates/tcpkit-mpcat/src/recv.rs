//! The receiving side: one listening port for every stream of a session. Each accepted
//! connection must present a Hello within the handshake deadline; the first valid one opens
//! the session and binds it to its token, and later connections without that token are
//! refused and counted. Chunks go into the reorder window and out in order; credit travels
//! back as acks. When the end frame's length is reached, the hash is checked and the verdict
//! sent to the sender.
//!
//! Bounds against strangers: at most [`MAX_PENDING`](crate::MAX_PENDING) connections in
//! their handshake (more are closed at accept and counted), 64 bytes held for each until its
//! Hello, a deadline for the Hello, and running out of descriptors pauses accepting for
//! 100 ms (counted) instead of ending the session.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, Socket, Type};

use crate::duplex::{Feed, Pump};
use crate::frame::{self, Frame, FrameError, DATA_HDR, MAX_CHUNK, MAX_STREAMS, MIN_CHUNK};
use crate::reorder::Reorder;
use crate::secure::{Channel, Psk, HANDSHAKE_MSG, MAX_RECORD, REC_HDR};
use crate::send::hex;
use crate::writeout::{Done, Writer};
use crate::{
    ConnCounts, Error, Input, MpcatCounters, MpcatReport, Output, PathFailure, ReverseReport, Role,
    StreamReport,
};
use std::sync::Arc;

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
}

const LISTENER: Token = Token(0);
/// The write-out thread's wake-ups.
const WRITER: Token = Token(usize::MAX);
/// How long accepting pauses after EMFILE/ENFILE.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Bytes held for a connection before its Hello is accepted.
const PENDING_BUF: usize = 64;
/// Unwritten acks a connection may hold before its sender counts as not reading them.
const MAX_ACK_BACKLOG: usize = 4096;
/// Bytes a stream reads before the loop writes out what is in order. Reading a fast
/// connection until its socket is empty took the whole window before a write (400 MB on a
/// veth: 18 writes of ~22 MB, the sender waiting for credit meanwhile, the bytes out of cache
/// when written and hashed); a megabyte keeps the pipeline moving and the bytes warm.
const READ_BUDGET: u64 = 1 << 20;
/// The most a direct read takes ([`Session::direct`]): socat's buffer is 128 KiB.
const DIRECT_BUF: usize = 256 << 10;
/// Bytes kept for records not yet opened (--psk-file): two of the largest.
const RAW_BUF: usize = 2 * (REC_HDR + MAX_RECORD);
/// Why a --psk-file handshake under another key is refused (the sender shows it).
const WRONG_KEY: &str = "the receiver holds another key (--psk-file): not this session's key";
const PSK_WANTED: &str =
    "this receiver takes encrypted sessions only: give the sender the receiver's --psk-file";
const PSK_UNWANTED: &str = "this receiver has no --psk-file: it takes unencrypted sessions only (give it the sender's --psk-file)";

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
pub fn bind(addr: SocketAddr, mptcp: bool) -> Result<Listener, Error> {
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
            s.set_only_v6(false)?;
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
    /// Connection of each stream index, once it joined.
    joined: Vec<Option<Token>>,
    /// Each stream index has joined once.
    seen: Vec<bool>,
    last_ack: u64,
    /// Stream bytes of every stream that has left (its connection closed after the end).
    verdict: Option<bool>,
}

/// Where the stream's bytes are written.
pub(crate) struct Sink {
    pub(crate) w: File,
    pub(crate) name: String,
}

impl Sink {
    /// Closes the output (the peer's stream is whole and verified) while the session goes on
    /// for the reverse stream, so whatever reads it sees EOF now: stdout's descriptor is
    /// pointed at /dev/null, a file closed.
    fn close(&mut self) {
        let Ok(null) = File::options().write(true).open("/dev/null") else {
            return;
        };
        if self.name == "stdout" {
            use std::os::fd::AsRawFd;
            // SAFETY: dup2 onto fd 1 of a descriptor we own; nothing else holds fd 1 open
            // as an object (the sink's own copy is replaced just below).
            unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
        }
        self.w = null;
    }
}

pub(crate) fn open_output(o: &Output) -> Result<Sink, Error> {
    match o {
        Output::Stdout => {
            let fd = io::stdout()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| Error::io("dup stdout", e))?;
            Ok(Sink {
                w: File::from(fd),
                name: "stdout".into(),
            })
        }
        Output::File(p) => File::create(p)
            .map(|w| Sink {
                w,
                name: p.display().to_string(),
            })
            .map_err(|e| Error::io(format!("create {}", p.display()), e)),
    }
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
    let mut sink = open_output(&cfg.output)?;
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
    let (mut began, mut verified) = (0u64, 0u64);
    let mut last: Option<MpcatReport> = None;
    loop {
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
        };
        let failure = rx
            .event_loop(&mut poll, &listener, &mut sink, stop, live)
            .err();
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
            verified += u64::from(report.verified && report.failure.is_none());
        }
        report.sessions = began;
        report.sessions_verified = verified;
        if !cfg.keep {
            return Ok(report);
        }
        if had_session && !stop.load(Ordering::Relaxed) {
            on_session(&report);
            last = Some(report);
            // The next session's live line starts from nothing.
            live.bytes.store(0, Ordering::Relaxed);
            live.total.store(0, Ordering::Relaxed);
            continue;
        }
        // Stopped: the last session (or this one, cut short) with the run's verdict.
        let mut r = if had_session {
            report
        } else {
            last.unwrap_or(report)
        };
        r.sessions = began;
        r.sessions_verified = verified;
        r.connections = counts;
        r.verified = began > 0 && verified == began;
        r.failure = match (began, had_session) {
            (0, _) => Some("stopped before any session began".into()),
            (_, true) => r.failure.take(),
            _ if verified < began => Some(format!(
                "{} of {began} sessions were not verified",
                began - verified
            )),
            _ => None,
        };
        return Ok(r);
    }
}

impl Receiver<'_> {
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
        let verified = failure.is_none() && s.and_then(|s| s.verdict) == Some(true);
        let failure = failure.or_else(|| (!verified).then(|| "the stream was not verified".into()));
        MpcatReport {
            schema_version: crate::report::SCHEMA_VERSION,
            role: Role::Receive,
            address: listener.addr.to_string(),
            bytes: written,
            total: s.and_then(|s| s.end.map(|e| e.0)),
            seconds: secs,
            bytes_per_second: if secs > 0.0 {
                written as f64 / secs
            } else {
                0.0
            },
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
        }
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

    /// A Hello with the reverse stream's index: welcomed, then handed to its own thread
    /// (at once, or when the session's first stream comes).
    fn join_reverse(
        &mut self,
        poll: &mut Poll,
        t: Token,
        token: frame::Token,
        chunk: u32,
        extra: bool,
    ) -> Result<(), String> {
        if extra {
            self.counts.bad_handshake += 1;
            self.refuse(
                poll,
                t,
                "bytes after the reverse stream's hello, before its welcome",
            );
            return Ok(());
        }
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&(chunk as usize)) {
            self.counts.bad_handshake += 1;
            self.refuse(poll, t, "chunk size out of range");
            return Ok(());
        }
        let late = self
            .session
            .as_ref()
            .is_some_and(|s| s.token != token || s.verdict.is_some());
        if late || !matches!(self.reverse, Reverse::None) {
            self.counts.wrong_token += 1;
            self.refuse(poll, t, "not this session's token");
            return Ok(());
        }
        let Some(mut c) = self.drop_conn(poll, t) else {
            return Ok(());
        };
        let _ = crate::set_path_timeout(&c.sock, self.cfg.path_timeout);
        c.put(&Frame::Welcome {
            version: frame::VERSION,
            window: self.cfg.window,
        });
        // What the socket does not take now, the reverse stream's thread writes first.
        let _ = flush(&mut c);
        let unsent = c.out[c.out_pos..].to_vec();
        let sock = {
            use std::os::fd::{FromRawFd, IntoRawFd};
            // SAFETY: the descriptor comes out of the mio socket, which gives it up.
            unsafe { std::net::TcpStream::from_raw_fd(c.sock.into_raw_fd()) }
        };
        if sock.set_nonblocking(false).is_err() {
            self.counts.accept_errors += 1;
            return Ok(());
        }
        self.reverse = Reverse::Parked {
            token,
            sock,
            chan: c.chan.take(),
            unsent,
            chunk,
            since: Instant::now(),
        };
        if self.session.is_some() {
            self.start_pump()?;
        }
        Ok(())
    }

    /// Starts the parked reverse stream's thread (the session has begun).
    fn start_pump(&mut self) -> Result<(), String> {
        let Reverse::Parked {
            sock,
            chan,
            unsent,
            chunk,
            ..
        } = std::mem::replace(&mut self.reverse, Reverse::None)
        else {
            return Ok(());
        };
        let said = |e: Error| match &e.source {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        };
        let feed = match &self.feed {
            Some(f) => Arc::clone(f),
            None => {
                let f = Feed::start(&self.cfg.input).map_err(said)?;
                self.feed = Some(Arc::clone(&f));
                f
            }
        };
        let pump = Pump::start(sock, chan, unsent, chunk as usize, feed).map_err(said)?;
        self.reverse = Reverse::Running(pump);
        Ok(())
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
}

impl Receiver<'_> {
    fn event_loop(
        &mut self,
        poll: &mut Poll,
        listener: &Listener,
        sink: &mut Sink,
        stop: &AtomicBool,
        live: &MpcatCounters,
    ) -> Result<(), String> {
        let mut events = Events::with_capacity(512);
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(match &self.session {
                    None => "interrupted before a session began".into(),
                    Some(_) if self.forward_done => {
                        "interrupted before the reverse stream ended".into()
                    }
                    Some(s) => format!(
                        "interrupted: {} bytes written, the stream not complete",
                        s.reorder.written()
                    ),
                });
            }
            let wait = if self.again.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
            match poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("epoll_wait: {e}")),
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
                            self.lost(poll, t, &e)?;
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
            self.expire(poll, now);
            self.check_paths(now)?;
            self.write_out(poll, sink)?;
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

    fn accept(&mut self, poll: &mut Poll, listener: &Listener) -> Result<(), String> {
        self.paused_until = None;
        loop {
            match listener.sock.accept() {
                Ok((mut sock, peer)) => {
                    let pending = self
                        .conns
                        .values()
                        .filter(|c| matches!(c.state, State::Pending { .. }))
                        .count();
                    if pending >= self.cfg.max_pending {
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

    /// Closes connections whose Hello is late, and a reverse connection whose session's
    /// first stream is.
    fn expire(&mut self, poll: &mut Poll, now: Instant) {
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
    fn lost(&mut self, poll: &mut Poll, t: Token, why: &str) -> Result<(), String> {
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

    /// Fails the session when no stream has been connected for --path-timeout.
    fn check_paths(&mut self, now: Instant) -> Result<(), String> {
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
        Err(format!(
            "stream connections closed before the end and none came back within {:?}: {} bytes written of {of}{last}",
            self.cfg.path_timeout,
            s.reorder.written()
        ))
    }

    fn read(&mut self, poll: &mut Poll, t: Token) -> Result<(), String> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(());
        };
        if matches!(c.state, State::Pending { .. }) {
            return self.read_hello(poll, t);
        }
        // Bytes that came with the Hello are parsed before anything is read.
        let mut first = true;
        let mut budget = READ_BUDGET;
        loop {
            let Some(c) = self.conns.get_mut(&t) else {
                return Ok(());
            };
            let State::Stream {
                index,
                inbuf,
                in_len,
                bytes,
                raw,
                raw_len,
                payload,
            } = &mut c.state
            else {
                return Ok(());
            };
            let Some(s) = self.session.as_mut() else {
                return Err("a stream without a session".into());
            };
            let peer = c.peer;
            // A plain data frame's payload goes from the socket straight to its place in the
            // window: no copy through `inbuf`.
            if let Some((start, at, end)) = payload.as_mut() {
                let written = s.reorder.written();
                if let (true, true, Some(w)) = (*at == written, s.reorder.idle(), s.writer.as_mut())
                {
                    if w.takes_direct() {
                        if s.direct.is_empty() {
                            s.direct = vec![0; DIRECT_BUF];
                        }
                        let k = ((*end - *at) as usize).min(DIRECT_BUF);
                        match c.sock.read(&mut s.direct[..k]) {
                            Ok(0) => return self.lost(poll, t, "closed"),
                            Ok(n) => {
                                w.direct(&s.direct[..n])?;
                                s.reorder.skip(n as u64);
                                *at += n as u64;
                                *bytes += n as u64;
                                budget = budget.saturating_sub(n as u64);
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return self.lost(poll, t, &format!("failed ({e})")),
                        }
                        if *at == *end {
                            *payload = None;
                        }
                        if budget == 0 {
                            self.again.push(t);
                            return Ok(());
                        }
                        continue;
                    }
                }
                let into = if *at < written {
                    // Written out already (another copy came first): read past it.
                    let k = ((written.min(*end) - *at) as usize).min(inbuf.len());
                    &mut inbuf[..k]
                } else {
                    s.reorder.slot(*at, (*end - *at) as usize)
                };
                match c.sock.read(into) {
                    Ok(0) => return self.lost(poll, t, "closed"),
                    Ok(n) => {
                        *at += n as u64;
                        *bytes += n as u64;
                        budget = budget.saturating_sub(n as u64);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return self.lost(poll, t, &format!("failed ({e})")),
                }
                if *at == *end {
                    let (seq, len) = (*start, *end - *start);
                    *payload = None;
                    s.reorder
                        .commit(seq, len)
                        .map_err(|e| format!("stream {index} ({peer}): {e}"))?;
                }
                if budget == 0 {
                    self.again.push(t);
                    return Ok(());
                }
                continue;
            }
            if !(std::mem::take(&mut first) && (*in_len > 0 || *raw_len > 0)) {
                let into = match c.chan {
                    Some(_) => &mut raw[*raw_len..],
                    // Plain: no further than the next frame, and for a data frame no further
                    // than its header, so its payload can be read into the window.
                    None => {
                        let want = plain_need(&inbuf[..*in_len]).min(inbuf.len());
                        if want <= *in_len {
                            return Err(format!(
                                "stream {index} ({peer}): a frame longer than this session's chunk size allows"
                            ));
                        }
                        &mut inbuf[*in_len..want]
                    }
                };
                match c.sock.read(into) {
                    Ok(0) => return self.lost(poll, t, "closed"),
                    Ok(n) if c.chan.is_some() => {
                        *raw_len += n;
                        budget = budget.saturating_sub(n as u64);
                    }
                    Ok(n) => *in_len += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return self.lost(poll, t, &format!("failed ({e})")),
                }
            }
            // Records open as frames leave inbuf, until none is left to open: after a round
            // inbuf has room for a whole record, so `raw` never fills.
            loop {
                let mut opened = 0;
                if let Some(ch) = c.chan.as_mut() {
                    match ch.open(&raw[..*raw_len], inbuf, in_len) {
                        Ok(n) => opened = n,
                        // Someone on the path, not the sender: this connection goes, the
                        // sender re-sends its chunks on the others.
                        Err(e) => {
                            let why = e.to_string();
                            return self.lost(poll, t, &why);
                        }
                    }
                    raw.copy_within(opened..*raw_len, 0);
                    *raw_len -= opened;
                }
                let mut at = 0;
                loop {
                    match Frame::parse(&inbuf[at..*in_len]) {
                        Ok((f, used)) => {
                            at += used;
                            match f {
                            Frame::Data { seq, payload } => {
                                check_data(s, seq, payload.len())
                                    .map_err(|e| format!("stream {index} ({peer}): {e}"))?;
                                s.reorder
                                    .insert(seq, payload)
                                    .map_err(|e| format!("stream {index} ({peer}): {e}"))?;
                                *bytes += payload.len() as u64;
                            }
                            Frame::End { total, hash } => {
                                if s.end.is_some_and(|e| e != (total, hash)) {
                                    return Err(format!(
                                        "stream {index} ({peer}): a second, different end frame"
                                    ));
                                }
                                if total < s.reorder.written() {
                                    return Err(format!(
                                        "stream {index} ({peer}): the end says {total} bytes, {} already arrived",
                                        s.reorder.written()
                                    ));
                                }
                                s.end = Some((total, hash));
                            }
                            Frame::Refuse { reason } => {
                                return Err(format!("the sender gave up: {reason}"));
                            }
                            other => {
                                return Err(format!(
                                    "stream {index} ({peer}): the sender sent a frame only a receiver sends: {other:?}"
                                ))
                            }
                        }
                        }
                        Err(FrameError::Truncated { .. }) => {
                            // Plain: the rest of the payload is read straight into the window.
                            let head = frame::data_header_of(&inbuf[at..*in_len]);
                            if let (None, Some((seq, len))) = (&c.chan, head) {
                                check_data(s, seq, len)
                                    .map_err(|e| format!("stream {index} ({peer}): {e}"))?;
                                let have = &inbuf[at + DATA_HDR..*in_len];
                                s.reorder.put(seq, have);
                                *bytes += have.len() as u64;
                                let next = seq + have.len() as u64;
                                *payload = Some((seq, next, seq + len as u64));
                                at = *in_len;
                            }
                            break;
                        }
                        Err(e) => return Err(format!("stream {index} ({peer}): {e}")),
                    }
                }
                inbuf.copy_within(at..*in_len, 0);
                *in_len -= at;
                if opened == 0 {
                    break;
                }
            }
            if budget == 0 {
                self.again.push(t);
                return Ok(());
            }
        }
    }

    /// Reads a pending connection's Hello; accepts it into the session or refuses it.
    fn read_hello(&mut self, poll: &mut Poll, t: Token) -> Result<(), String> {
        let cfg = self.cfg;
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(());
        };
        let State::Pending { buf, len, .. } = &mut c.state else {
            return Ok(());
        };
        loop {
            match c.sock.read(&mut buf[*len..]) {
                Ok(0) => {
                    self.counts.bad_handshake += 1;
                    self.drop_conn(poll, t);
                    return Ok(());
                }
                Ok(n) => *len += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.counts.bad_handshake += 1;
                    self.drop_conn(poll, t);
                    return Ok(());
                }
            }
            if *len == buf.len() {
                break;
            }
        }
        // With --psk-file: the Noise handshake first, then the Hello inside a record.
        let mut plain = [0u8; PENDING_BUF];
        let mut plain_len = 0;
        let mut raw_rest = [0u8; PENDING_BUF];
        let mut raw_rest_len = 0;
        if let Some(psk) = &cfg.psk {
            if c.chan.is_none() {
                match Frame::parse(&buf[..*len]) {
                    Err(FrameError::Truncated { .. }) if *len < buf.len() => return Ok(()),
                    Ok((Frame::Noise { version, msg }, used))
                        if version == frame::VERSION && msg.len() == HANDSHAKE_MSG =>
                    {
                        let mut reply = [0u8; HANDSHAKE_MSG];
                        match psk.respond(msg, &mut reply) {
                            Ok(ch) => {
                                Frame::Noise {
                                    version,
                                    msg: &reply,
                                }
                                .emit_vec(&mut c.out);
                                c.chan = Some(ch);
                                buf.copy_within(used..*len, 0);
                                *len -= used;
                                if flush_out(&mut c.sock, &mut c.out, &mut c.out_pos).is_err() {
                                    self.counts.bad_handshake += 1;
                                    self.drop_conn(poll, t);
                                    return Ok(());
                                }
                                if *len == 0 {
                                    return Ok(());
                                }
                            }
                            Err(None) => {
                                self.counts.wrong_key += 1;
                                self.refuse(poll, t, WRONG_KEY);
                                return Ok(());
                            }
                            Err(Some(e)) => {
                                self.counts.bad_handshake += 1;
                                self.refuse(poll, t, &e.to_string());
                                return Ok(());
                            }
                        }
                    }
                    Ok((Frame::Noise { version, .. }, _)) if version != frame::VERSION => {
                        self.counts.bad_handshake += 1;
                        let why = format!(
                            "version {version} not spoken: this receiver speaks {}",
                            frame::VERSION
                        );
                        self.refuse(poll, t, &why);
                        return Ok(());
                    }
                    Ok((Frame::Hello { .. }, _)) => {
                        self.counts.bad_handshake += 1;
                        self.refuse(poll, t, PSK_WANTED);
                        return Ok(());
                    }
                    _ => {
                        self.counts.bad_handshake += 1;
                        self.refuse(poll, t, "not an mpcat handshake");
                        return Ok(());
                    }
                }
            }
            let Some(ch) = c.chan.as_mut() else {
                return Ok(());
            };
            match ch.open(&buf[..*len], &mut plain, &mut plain_len) {
                // The Hello's record is not all there yet.
                Ok(_) if plain_len == 0 => return Ok(()),
                Ok(used) => {
                    raw_rest_len = *len - used;
                    raw_rest[..raw_rest_len].copy_from_slice(&buf[used..*len]);
                }
                Err(_) => {
                    self.counts.bad_handshake += 1;
                    self.drop_conn(poll, t);
                    return Ok(());
                }
            }
        } else {
            plain[..*len].copy_from_slice(&buf[..*len]);
            plain_len = *len;
        }
        let encrypted = cfg.psk.is_some();
        let hello = match Frame::parse(&plain[..plain_len]) {
            // Unencrypted, the Hello may come in pieces; encrypted, its record holds it whole.
            Err(FrameError::Truncated { .. }) if !encrypted && *len < buf.len() => return Ok(()),
            Ok((
                Frame::Hello {
                    version,
                    token,
                    stream,
                    streams,
                    chunk,
                },
                used,
            )) => {
                // Bytes after the Hello (a sender that did not wait for the Welcome) are
                // the stream's first: kept for it.
                let mut rest = [0u8; PENDING_BUF];
                let n = plain_len - used;
                rest[..n].copy_from_slice(&plain[used..plain_len]);
                (version, token, stream, streams, chunk, rest, n)
            }
            Ok((Frame::Noise { .. }, _)) if !encrypted => {
                self.counts.bad_handshake += 1;
                self.refuse(poll, t, PSK_UNWANTED);
                return Ok(());
            }
            _ => {
                self.counts.bad_handshake += 1;
                self.refuse(poll, t, "not an mpcat hello");
                return Ok(());
            }
        };
        let (version, token, stream, streams, chunk, rest, rest_len) = hello;
        if version != frame::VERSION {
            self.counts.bad_handshake += 1;
            let why = format!(
                "version {version} not spoken: this receiver speaks {}",
                frame::VERSION
            );
            self.refuse(poll, t, &why);
            return Ok(());
        }
        if stream == frame::REVERSE_STREAM {
            return self.join_reverse(poll, t, token, chunk, rest_len + raw_rest_len > 0);
        }
        let mut begins = false;
        match &mut self.session {
            None => {
                if matches!(&self.reverse, Reverse::Parked { token: r, .. } if *r != token) {
                    self.counts.wrong_token += 1;
                    self.refuse(poll, t, "not this session's token");
                    return Ok(());
                }
                let ok = (1..=MAX_STREAMS).contains(&streams)
                    && stream < streams
                    && (MIN_CHUNK..=MAX_CHUNK).contains(&(chunk as usize));
                if !ok {
                    self.counts.bad_handshake += 1;
                    self.refuse(
                        poll,
                        t,
                        "stream count, stream index or chunk size out of range",
                    );
                    return Ok(());
                }
                let window = session_window(self.cfg.window, streams) as usize;
                // Chunks are at least the smallest the declared size allows but the last;
                // twice that many in a window is more separate pieces than an honest sender
                // makes.
                let max_gaps = 2 * window / crate::smallest_chunk(chunk) as usize + 16;
                let mut joined = vec![None; usize::from(streams)];
                joined[usize::from(stream)] = Some(t);
                let mut seen = vec![false; usize::from(streams)];
                seen[usize::from(stream)] = true;
                self.session = Some(Session {
                    token,
                    streams,
                    chunk,
                    reorder: Reorder::new(window, max_gaps),
                    writer: None,
                    direct: Vec::new(),
                    end: None,
                    joined,
                    seen,
                    last_ack: 0,
                    verdict: None,
                });
                self.started = Some(Instant::now());
                begins = true;
            }
            Some(s) => {
                if s.token != token || s.verdict.is_some() {
                    self.counts.wrong_token += 1;
                    self.refuse(poll, t, "not this session's token");
                    return Ok(());
                }
                let k = usize::from(stream);
                if k >= s.joined.len() || streams != s.streams || chunk != s.chunk {
                    self.counts.bad_handshake += 1;
                    self.refuse(
                        poll,
                        t,
                        "stream index out of range, or another stream count or chunk size",
                    );
                    return Ok(());
                }
                // The session's own token for a stream already joined: its sender saw that
                // connection fail before this side did. The new one takes its place.
                let old = s.joined[k].replace(t);
                if s.seen[k] {
                    self.reconnects += 1;
                }
                s.seen[k] = true;
                if let Some(old) = old {
                    let _ = self.lost(poll, old, "replaced by a new connection");
                    if let Some(s) = self.session.as_mut() {
                        s.joined[k] = Some(t);
                    }
                }
            }
        }
        if begins {
            self.start_pump()?;
        }
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(());
        };
        let chunk = chunk as usize;
        // Best effort: a socket without these still works, only a dead path is noticed
        // later (when the sender gives up on it).
        let _ = crate::set_path_timeout(&c.sock, self.cfg.path_timeout);
        // Room for one more record's plaintext (64 KiB) beside the longest part of a frame
        // left waiting, so a whole record always opens.
        let mut inbuf = vec![0; DATA_HDR + chunk + (64 << 10)];
        inbuf[..rest_len].copy_from_slice(&rest[..rest_len]);
        let mut raw = Vec::new();
        if c.chan.is_some() {
            raw = vec![0; RAW_BUF];
            raw[..raw_rest_len].copy_from_slice(&raw_rest[..raw_rest_len]);
        }
        c.state = State::Stream {
            index: stream,
            inbuf,
            in_len: rest_len,
            bytes: 0,
            raw,
            raw_len: raw_rest_len,
            payload: None,
        };
        let window = self
            .session
            .as_ref()
            .map_or(self.cfg.window, |s| s.reorder.window());
        c.put(&Frame::Welcome {
            version: frame::VERSION,
            window,
        });
        if let Err(e) = flush(c) {
            return self.lost(poll, t, &e);
        }
        // What came with the Hello, and what is still in the socket: edge-triggered, no
        // new event would say so.
        self.read(poll, t)
    }

    /// Tells a connection why it is refused (best effort) and closes it.
    fn refuse(&mut self, poll: &mut Poll, t: Token, reason: &str) {
        if let Some(mut c) = self.drop_conn(poll, t) {
            c.out.clear();
            c.out_pos = 0;
            c.put(&Frame::Refuse { reason });
            let _ = c.sock.write(&c.out);
        }
    }

    /// Hands the bytes that are in order to the write-out, and acks what it has written
    /// when enough has gone out.
    fn write_out(&mut self, poll: &mut Poll, sink: &mut Sink) -> Result<(), String> {
        let Some(s) = self.session.as_mut() else {
            return Ok(());
        };
        let failed = |e: &std::io::Error| format!("write {}: {e}", sink.name);
        while let Some(p) = s.reorder.hand_out() {
            if s.writer.is_none() {
                let out = sink
                    .w
                    .try_clone()
                    .map_err(|e| format!("dup the output ({}): {e}", sink.name))?;
                let w = if s.streams == 1 && out.metadata().is_ok_and(|m| m.is_file()) {
                    Writer::inline(out, &sink.name)
                } else {
                    Writer::start(out, Arc::clone(&self.waker))
                        .map_err(|e| format!("start the write-out thread: {e}"))?
                };
                s.writer = Some(w);
            }
            if let Some(w) = &mut s.writer {
                if !w.write(p) {
                    break;
                }
            }
        }
        while let Some(d) = s.writer.as_mut().and_then(Writer::poll) {
            match d {
                Done::Wrote(n) => s.reorder.release(n),
                Done::Failed(e) => return Err(failed(&e)),
                Done::Hash(_) => {}
            }
        }
        let written = s.reorder.released();
        let complete = s.end.is_some_and(|e| e.0 == written);
        // Every MiB (or eighth of a small window): credit returns soon, and the sender's live
        // line and its acknowledged count move smoothly. Acks are a few bytes per stream.
        let every = (s.reorder.window() / 8).min(1 << 20);
        if written - s.last_ack >= every || (complete && written > s.last_ack) {
            s.last_ack = written;
            let ack = Frame::Ack {
                acked: written,
                limit: s.reorder.limit(),
            };
            let mut failed = Vec::new();
            for (t, c) in self.conns.iter_mut() {
                if !matches!(c.state, State::Stream { .. }) {
                    continue;
                }
                if c.out_pos == 0 && c.chan.is_none() {
                    // An unwritten older ack says less than this one. (A sealed one stays:
                    // the sender's nonces count every record.)
                    c.out.clear();
                }
                c.put(&ack);
                if c.out.len() > MAX_ACK_BACKLOG {
                    failed.push((
                        *t,
                        "its sender stopped reading acknowledgements".to_string(),
                    ));
                } else if let Err(e) = flush(c) {
                    failed.push((*t, e));
                }
            }
            for (t, why) in failed {
                self.lost(poll, t, &why)?;
            }
        }
        Ok(())
    }

    /// Once every byte is written: checks the hash, sends the verdict on every stream, and
    /// waits (at most 2 s) for it to leave. True when the session is over.
    fn finish(&mut self, poll: &mut Poll, sink: &mut Sink) -> Result<bool, String> {
        let Some(s) = self.session.as_mut() else {
            return Ok(false);
        };
        let Some((total, hash)) = s.end else {
            return Ok(false);
        };
        if s.reorder.released() != total {
            return Ok(false);
        }
        // Every byte is written (released); the write-out's flush and hash, and its
        // descriptor closed, before the output may be closed for the reverse stream.
        let got = match s.writer.take() {
            Some(mut w) => w.finish(),
            // An empty stream: nothing was ever handed out.
            None => sink.w.flush().map(|()| crate::stream_hash(&[])),
        };
        let got = got.map_err(|e| format!("write {}: {e}", sink.name))?;
        let ok = got == hash;
        s.verdict = Some(ok);
        let done = Frame::Done { total, ok };
        for c in self.conns.values_mut() {
            if matches!(c.state, State::Stream { .. }) {
                c.put(&done);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut events = Events::with_capacity(64);
        loop {
            let mut left = false;
            for c in self.conns.values_mut() {
                if matches!(c.state, State::Stream { .. })
                    && flush(c).is_ok()
                    && c.out_pos < c.out.len()
                {
                    left = true;
                }
            }
            if !left || Instant::now() >= deadline {
                break;
            }
            let _ = poll.poll(&mut events, Some(Duration::from_millis(20)));
        }
        if !ok {
            return Err(format!(
                "the stream's hash does not match the sender's: {total} bytes arrived corrupted"
            ));
        }
        Ok(true)
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

/// The most a session of one stream holds ([`session_window`]).
pub const ONE_STREAM_WINDOW: u64 = 16 << 20;

/// Whether a data frame of `len` bytes at `seq` may be taken: no longer than the session's
/// chunk, within the stream's total once it is known, and below the window's credit. Checked
/// before any of its payload is read.
fn check_data(s: &Session, seq: u64, len: usize) -> Result<(), String> {
    if len > s.chunk as usize {
        return Err(format!(
            "a {len}-byte chunk, the session declared {}",
            s.chunk
        ));
    }
    let end = seq + len as u64;
    if let Some((total, _)) = s.end {
        if end > total {
            return Err(format!("bytes up to {end} of a {total}-byte stream"));
        }
    }
    s.reorder.check(seq, len as u64).map_err(|e| e.to_string())
}

/// How far to read a plain connection's bytes (`b`: those not yet parsed) into its frame
/// buffer: to the end of the next frame, or of its header when it is a data frame (whose
/// payload is read into the window).
fn plain_need(b: &[u8]) -> usize {
    match Frame::parse(b) {
        Err(FrameError::Truncated { need, .. })
            if b.first() == Some(&frame::T_DATA) && b.len() < DATA_HDR =>
        {
            need.min(DATA_HDR)
        }
        Err(FrameError::Truncated { need, .. }) => need,
        _ => b.len(),
    }
}

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
fn flush(c: &mut Conn) -> Result<(), String> {
    flush_out(&mut c.sock, &mut c.out, &mut c.out_pos)
}

/// [`flush`] on a connection's parts, for a caller that holds its state borrowed.
fn flush_out(sock: &mut TcpStream, out: &mut Vec<u8>, out_pos: &mut usize) -> Result<(), String> {
    while *out_pos < out.len() {
        match sock.write(&out[*out_pos..]) {
            Ok(0) => return Err("write returned 0".into()),
            Ok(n) => *out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    out.clear();
    *out_pos = 0;
    Ok(())
}
