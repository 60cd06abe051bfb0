//! Relay mode: each captured client session replayed over an ordinary TCP connection from the
//! copy host to the target.
//!
//! One thread, one mio loop: frames come from the live capture (its ring's fd is in the loop)
//! or from a capture file at its own pace (`--speed`, `--max-idle`, `--loop`); the
//! reassembler ([`crate::reasm::Tracker`]) turns them into session events; each selected
//! session (rules, `-r` sampling) gets `-n` connections to its target ([`Conn`]), each with
//! its own queue of the client's bytes cut into requests. A request is the client bytes
//! between two turns of the server; per connection the next request is sent only after the
//! target answered the previous one, and after the think time the client really had (from
//! the end of the server's turn to the request's first byte), unless `--no-wait`. A session
//! whose server spoke first waits for the target's own greeting. A session joined mid-stream
//! is copied from its next request boundary (the first client bytes after a server turn).
//!
//! Nothing is ever sent toward a client: the only sockets are connections to the targets.
//!
//! Faults: a refused connect is retried with an exponential back-off shared by every
//! connection to that target (one probe per back-off step, so a down target sees a trickle of
//! SYNs, not a storm), until the session's `--timeout`; a reset, a close while requests
//! remain, an answer not coming within `--timeout`, bytes the capture lost, and memory over
//! `--max-memory` each end the copy with their own count. Every copy ends exactly once:
//! completed, failed by one cause, or open at the end of the run.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rustc_hash::FxHashMap;
use tcpkit_pace::{now_ns, Speed};
use tcpkit_stats::{CopyReport, Histogram};

use crate::backoff::{Backoff, Down, Gate, SILENT_NS};
use crate::config::{CopyConfig, CopyCounters};
use crate::diff::{ConnMeta, DiffConn, Differ};
use crate::feed::{self, FeedError, Input, CAPTURE};
use crate::reasm::{CloseKind, Dir, SessionId};
use crate::transfer;
use crate::turns::{ClientBytes, ReqStart, Turns};

/// Why the relay could not run.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The capture or the capture file.
    #[error(transparent)]
    Input(#[from] FeedError),
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> RelayError {
    move |source| RelayError::Io { what, source }
}

#[derive(Debug)]
enum Item {
    Data {
        bytes: Bytes,
        start: Option<ReqStart>,
    },
    End {
        wait_answer: bool,
        lost: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the target's back-off to allow a connect.
    Backoff,
    Connecting,
    Up,
    /// Our FIN is sent; reading until the target closes.
    Closing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Completed,
    Refused,
    Reset,
    Timeout,
    ClosedEarly,
    LostData,
    Shed,
    OpenAtEnd,
}

#[derive(Debug)]
struct Conn {
    gen: u32,
    target: SocketAddr,
    sock: Option<TcpStream>,
    state: State,
    queue: VecDeque<Item>,
    /// Bytes of the front item already written.
    off: usize,
    /// Request bytes queued (counted against the memory limit).
    held: usize,
    /// Give up connecting after this.
    connect_deadline: u64,
    retry_at: u64,
    refused: bool,
    /// A connect of ours went out (the target saw a SYN of this copy).
    tried: bool,
    /// When the connect in flight counts as unanswered (its SYN needed a retransmission);
    /// 0 once judged, or with none in flight.
    silent_at: u64,
    /// The target sent bytes since the last request started (or since connecting).
    answered: bool,
    /// Requests started and not answered yet.
    unanswered: u64,
    last_rx_ns: u64,
    last_write_ns: u64,
    eof: bool,
    close_deadline: u64,
    /// What the end will count as once the connection is closed.
    ending: Outcome,
    timer_at: u64,
    /// `--diff`: this copy's answers, paired with the original ones.
    diff: Option<Box<DiffConn>>,
}

/// A session being copied, on the capture side.
#[derive(Debug)]
struct Sess {
    conns: Vec<(usize, u32)>,
    turns: Turns,
}

/// How long a closing connection waits for the target's FIN before it is dropped.
const CLOSE_LINGER_NS: u64 = 1_000_000_000;
/// Polls per turn while each fills the event buffer (bounds a turn; the rest waits one turn).
const MAX_POLLS_PER_STEP: usize = 16;

/// The relay: sessions, connections, timers, counters.
struct Relay<'a> {
    cfg: &'a CopyConfig,
    poll: Poll,
    sessions: FxHashMap<SessionId, Sess>,
    conns: Vec<Option<Conn>>,
    gens: Vec<u32>,
    free: Vec<usize>,
    timers: BinaryHeap<Reverse<(u64, usize, u32)>>,
    /// The shared back-off toward targets that refuse or answer nothing.
    backoff: Backoff,
    start_ns: u64,
    held: usize,
    open: u64,
    scratch: Vec<u8>,
    report: CopyReport,
    orig: Histogram,
    target_lat: Histogram,
    /// Think times are scaled by this (offline `--speed`).
    speed: Speed,
    /// Think times are capped at this (offline `--max-idle`), like the gaps between frames.
    max_think_ns: u64,
    differ: Option<Differ>,
}

impl<'a> Relay<'a> {
    fn new(cfg: &'a CopyConfig, speed: Speed, max_think_ns: u64) -> Result<Relay<'a>, RelayError> {
        Ok(Relay {
            cfg,
            poll: Poll::new().map_err(io_err("create the event loop (epoll)"))?,
            sessions: FxHashMap::default(),
            conns: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            timers: BinaryHeap::new(),
            backoff: Backoff::default(),
            start_ns: now_ns(),
            held: 0,
            open: 0,
            scratch: vec![0; 64 << 10],
            report: CopyReport::default(),
            orig: Histogram::new(),
            target_lat: Histogram::new(),
            speed,
            max_think_ns,
            differ: cfg
                .diff
                .clone()
                .map(Differ::new)
                .transpose()
                .map_err(io_err("create the --diff-out file"))?,
        })
    }

    // ---- capture side -------------------------------------------------------------------

    fn shed_session(&mut self, id: SessionId, _now: u64) {
        if let Some(s) = self.sessions.remove(&id) {
            for (idx, gen) in s.conns {
                if self.conn_mut(idx, gen).is_some() {
                    self.end_conn(idx, Outcome::Shed);
                }
            }
        }
    }

    // ---- connections --------------------------------------------------------------------

    fn conn_mut(&mut self, idx: usize, gen: u32) -> Option<&mut Conn> {
        self.conns
            .get_mut(idx)
            .and_then(Option::as_mut)
            .filter(|c| c.gen == gen)
    }

    fn new_conn(
        &mut self,
        target: SocketAddr,
        client: SocketAddr,
        server: SocketAddr,
        now: u64,
    ) -> usize {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.gens.push(0);
            self.conns.len() - 1
        });
        self.gens[idx] = self.gens[idx].wrapping_add(1);
        let mut queue = VecDeque::new();
        if self.cfg.proxy_protocol {
            let mut h = Vec::with_capacity(crate::proxy::header_len(client, server));
            crate::proxy::emit(client, server, &mut h);
            queue.push_back(Item::Data {
                bytes: Bytes::from(h),
                start: None,
            });
        }
        self.conns[idx] = Some(Conn {
            gen: self.gens[idx],
            target,
            sock: None,
            state: State::Backoff,
            queue,
            off: 0,
            held: 0,
            connect_deadline: now + self.cfg.timeout_ns,
            retry_at: now,
            refused: false,
            tried: false,
            silent_at: 0,
            answered: false,
            unanswered: 0,
            last_rx_ns: now,
            last_write_ns: now,
            eof: false,
            close_deadline: 0,
            ending: Outcome::Completed,
            timer_at: 0,
            diff: None,
        });
        self.report.sessions.copies += 1;
        self.open += 1;
        idx
    }

    fn arm(&mut self, idx: usize, at: u64) {
        let Some(c) = self.conns[idx].as_mut() else {
            return;
        };
        if c.timer_at != at {
            c.timer_at = at;
            self.timers.push(Reverse((at, idx, c.gen)));
        }
    }

    /// Connects now if the target's back-off allows, or waits for it.
    fn start_connect(&mut self, idx: usize, now: u64) {
        let Some(c) = self.conns[idx].as_mut() else {
            return;
        };
        if let Gate::Wait(next_try) = self.backoff.gate(c.target, now) {
            if next_try >= c.connect_deadline {
                let how = match self.backoff.down(c.target) {
                    _ if c.refused => Outcome::Refused,
                    Some(Down::Refused) => Outcome::Refused,
                    _ => Outcome::Timeout,
                };
                if !c.tried {
                    self.report.sessions.skipped_in_backoff += 1;
                }
                self.end_conn(idx, how);
                return;
            }
            c.state = State::Backoff;
            c.retry_at = next_try;
            self.arm(idx, next_try);
            return;
        }
        match TcpStream::connect(c.target) {
            Ok(mut s) => {
                if self
                    .poll
                    .registry()
                    .register(&mut s, Token(idx), Interest::READABLE | Interest::WRITABLE)
                    .is_err()
                {
                    self.end_conn(idx, Outcome::Reset);
                    return;
                }
                let _ = s.set_nodelay(true);
                c.sock = Some(s);
                c.state = State::Connecting;
                c.tried = true;
                c.silent_at = now + SILENT_NS;
                let at = c.silent_at.min(c.connect_deadline);
                self.arm(idx, at);
            }
            Err(e) => self.connect_failed(idx, &e, now),
        }
    }

    fn connect_failed(&mut self, idx: usize, e: &io::Error, now: u64) {
        let Some(c) = self.conns[idx].as_mut() else {
            return;
        };
        // Closing the descriptor takes it out of the epoll set: no deregister call.
        drop(c.sock.take());
        let refused = matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
        );
        if !refused {
            // Out of ports or descriptors, or the like: not the target's doing, but the copy
            // cannot be made; counted as a reset of the attempt.
            self.end_conn(idx, Outcome::Reset);
            return;
        }
        c.refused = true;
        let target = c.target;
        self.backoff.refused(target, now);
        self.start_connect(idx, now);
    }

    /// The first event of a connecting socket: the end of the handshake (registered
    /// edge-triggered while connecting). A failed connect raises EPOLLERR, so only an event
    /// with `err` (error or hang-up) needs SO_ERROR to tell why; asking it on every success
    /// was one of the copy's ten syscalls per session with a connection per request.
    fn connected(&mut self, idx: usize, now: u64, err: bool) {
        let Some(c) = self.conns[idx].as_mut() else {
            return;
        };
        let Some(s) = c.sock.as_ref() else { return };
        if err {
            match s.take_error() {
                Ok(Some(e)) | Err(e) => return self.connect_failed(idx, &e, now),
                // Connected, then closed by the target at once: the read that follows sees it.
                Ok(None) => {}
            }
        }
        c.state = State::Up;
        c.silent_at = 0;
        c.last_write_ns = now;
        c.last_rx_ns = now;
        let target = c.target;
        self.backoff.accepted(target);
    }

    fn end_conn(&mut self, idx: usize, how: Outcome) {
        let Some(mut c) = self.conns[idx].take() else {
            return;
        };
        // Closing the descriptor takes it out of the epoll set: no deregister call.
        drop(c.sock.take());
        if let (Some(d), Some(df)) = (c.diff.take(), self.differ.as_mut()) {
            d.closed(df, how == Outcome::Completed);
        }
        self.held -= c.held;
        self.open -= 1;
        self.free.push(idx);
        let s = &mut self.report.sessions;
        let f = &mut s.failed;
        match how {
            Outcome::Completed => s.completed += 1,
            Outcome::Refused => f.target_refused += 1,
            Outcome::Reset => f.reset += 1,
            Outcome::Timeout => f.timeout += 1,
            Outcome::ClosedEarly => f.closed_early += 1,
            Outcome::LostData => f.lost_capture_data += 1,
            Outcome::Shed => f.shed += 1,
            Outcome::OpenAtEnd => s.open_at_end += 1,
        }
    }

    fn on_io(&mut self, idx: usize, now: u64, readable: bool, hup: bool) {
        let Some(c) = self.conns.get(idx).and_then(Option::as_ref) else {
            return;
        };
        if c.state == State::Connecting {
            self.connected(idx, now, hup);
        }
        if readable {
            self.read(idx, now, hup);
        }
        self.pump(idx, now);
    }

    /// Reads what the target sent. A read shorter than the buffer emptied the socket (more
    /// data would raise a new edge), so the read that could only say EAGAIN is skipped unless
    /// `hup` says a FIN or an error waits behind the data: with a new connection per request
    /// that read was 1.7 of the copy's 12 syscalls per session.
    fn read(&mut self, idx: usize, now: u64, hup: bool) {
        let no_wait = self.cfg.no_wait;
        let Some(c) = self.conns[idx].as_mut() else {
            return;
        };
        if !matches!(c.state, State::Up | State::Closing) {
            return;
        }
        let Some(s) = c.sock.as_mut() else { return };
        loop {
            match s.read(&mut self.scratch) {
                Ok(0) => {
                    c.eof = true;
                    break;
                }
                Ok(n) => {
                    self.report.requests.bytes_answered += n as u64;
                    if let Some(d) = c.diff.as_mut() {
                        d.target_bytes(&self.scratch[..n]);
                    }
                    if c.unanswered > 0 {
                        self.target_lat.record(now.saturating_sub(c.last_write_ns));
                        // Waiting, one request is outstanding; with --no-wait an answer
                        // stands for every request before it on the stream.
                        let k = if no_wait { c.unanswered } else { 1 };
                        self.report.requests.answered += k;
                        c.unanswered -= k;
                    }
                    c.answered = true;
                    c.last_rx_ns = now;
                    if n < self.scratch.len() && !hup {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.end_conn(idx, Outcome::Reset);
                    return;
                }
            }
        }
    }

    /// Moves connection `idx` as far as it can go now; arms its timer when it must wait.
    fn pump(&mut self, idx: usize, now: u64) {
        let (no_wait, timeout, speed) = (self.cfg.no_wait, self.cfg.timeout_ns, self.speed);
        loop {
            let Some(c) = self.conns[idx].as_mut() else {
                return;
            };
            match c.state {
                State::Backoff => {
                    if now >= c.retry_at {
                        self.start_connect(idx, now);
                    }
                    return;
                }
                State::Connecting => {
                    if now >= c.connect_deadline {
                        let how = if c.refused {
                            Outcome::Refused
                        } else {
                            Outcome::Timeout
                        };
                        self.end_conn(idx, how);
                    } else if c.silent_at != 0 && now >= c.silent_at {
                        // No SYN-ACK in time: the target is off or firewalled. The first
                        // to find out keeps trying (the kernel retransmits its SYN); the
                        // others stand back, so the target does not get every session's
                        // SYN retransmitted, and go through the gate's probes again.
                        c.silent_at = 0;
                        let target = c.target;
                        if self.backoff.silent(target, now) {
                            let at = c.connect_deadline;
                            self.arm(idx, at);
                        } else {
                            drop(c.sock.take());
                            c.state = State::Backoff;
                            self.start_connect(idx, now);
                        }
                    } else {
                        let at = if c.silent_at == 0 {
                            c.connect_deadline
                        } else {
                            c.silent_at.min(c.connect_deadline)
                        };
                        self.arm(idx, at);
                    }
                    return;
                }
                State::Closing => {
                    if c.eof || now >= c.close_deadline {
                        let how = c.ending;
                        self.end_conn(idx, how);
                    } else {
                        let at = c.close_deadline;
                        self.arm(idx, at);
                    }
                    return;
                }
                State::Up => {}
            }
            let Some(front) = c.queue.front_mut() else {
                return;
            };
            match front {
                Item::Data { bytes, start } => {
                    if c.eof {
                        self.end_conn(idx, Outcome::ClosedEarly);
                        return;
                    }
                    if let Some(r) = *start {
                        if r.wait_answer && !no_wait {
                            if !c.answered {
                                let dl = c.last_write_ns + timeout;
                                if now >= dl {
                                    self.end_conn(idx, Outcome::Timeout);
                                } else {
                                    self.arm(idx, dl);
                                }
                                return;
                            }
                            // --diff: an answer arriving in pieces is not cut by the next
                            // request (bounded by a short silence).
                            if c.diff.as_ref().is_some_and(|d| !d.answer_whole()) {
                                let at = c.last_rx_ns + crate::diff::SETTLE_NS;
                                if now < at {
                                    self.arm(idx, at);
                                    return;
                                }
                            }
                            let at = c.last_rx_ns + speed.wall(r.think_ns);
                            if now < at {
                                self.arm(idx, at);
                                return;
                            }
                        }
                        *start = None;
                        c.answered = false;
                        c.unanswered += 1;
                        self.report.requests.copied += 1;
                        if let (Some(d), Some(df)) = (c.diff.as_deref_mut(), self.differ.as_mut()) {
                            d.request_sent(df);
                        }
                    }
                    let Some(s) = c.sock.as_mut() else { return };
                    match s.write(&bytes[c.off..]) {
                        Ok(n) => {
                            c.off += n;
                            c.last_write_ns = now;
                            self.report.requests.bytes_copied += n as u64;
                            if c.off == bytes.len() {
                                let len = bytes.len();
                                c.queue.pop_front();
                                c.off = 0;
                                c.held -= len;
                                self.held -= len;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            self.end_conn(idx, Outcome::Reset);
                            return;
                        }
                    }
                }
                Item::End { wait_answer, lost } => {
                    let lost = *lost;
                    if *wait_answer && !no_wait && c.unanswered > 0 && !c.eof {
                        let dl = c.last_write_ns + timeout;
                        if now >= dl {
                            // A session with a hole in its capture: its last request may be
                            // the part before the hole, which no target answers. The hole is
                            // the cause, whatever the clock says.
                            self.end_conn(
                                idx,
                                if lost {
                                    Outcome::LostData
                                } else {
                                    Outcome::Timeout
                                },
                            );
                        } else {
                            self.arm(idx, dl);
                        }
                        return;
                    }
                    c.queue.pop_front();
                    if let Some(s) = c.sock.as_ref() {
                        let _ = s.shutdown(Shutdown::Write);
                    }
                    c.state = State::Closing;
                    c.close_deadline = now + CLOSE_LINGER_NS;
                    c.ending = if lost {
                        Outcome::LostData
                    } else {
                        Outcome::Completed
                    };
                }
            }
        }
    }

    fn fire_timers(&mut self, now: u64) {
        while let Some(Reverse((at, idx, gen))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let live = self.conns[idx]
                .as_mut()
                .filter(|c| c.gen == gen && c.timer_at == at);
            if let Some(c) = live {
                c.timer_at = 0;
                self.pump(idx, now);
            }
        }
    }

    /// Timers, then one wait for I/O of at most `max_wait`, then the I/O.
    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), RelayError> {
        self.fire_timers(now_ns());
        let now = now_ns();
        let mut wait = max_wait;
        if let Some(Reverse((at, _, _))) = self.timers.peek() {
            wait = wait.min(Duration::from_nanos(at.saturating_sub(now)));
        }
        // Every connection that is ready, not one buffer of them: a turn of capture can open
        // thousands of connections, and those left unserved kept their requests unsent until
        // the target dropped them as idle (at 20k new connections/s the copy held 15k open).
        for _ in 0..MAX_POLLS_PER_STEP {
            match self.poll.poll(events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("wait for events (epoll_wait)")(e)),
            }
            let full = events.iter().count() >= events.capacity();
            self.on_io_events(events);
            if !full {
                break;
            }
            wait = Duration::ZERO;
        }
        self.fire_timers(now_ns());
        Ok(())
    }

    fn on_io_events(&mut self, events: &Events) {
        let now = now_ns();
        for ev in events.iter() {
            if ev.token() != CAPTURE {
                // A FIN or an error already queued must be read to be seen; an event that
                // only says writable (a connect that finished) has nothing to read.
                let hup = ev.is_read_closed() || ev.is_error();
                let readable = ev.is_readable() || hup;
                self.on_io(ev.token().0, now, readable, hup);
            }
        }
    }

    fn publish(&self, live: &CopyCounters) {
        let s = &self.report.sessions;
        let f = &s.failed;
        let st = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        st(&live.sessions_seen, s.seen);
        st(&live.copies, s.copies);
        st(&live.completed, s.completed);
        st(
            &live.failed,
            f.target_refused + f.reset + f.timeout + f.closed_early + f.lost_capture_data + f.shed,
        );
        st(&live.open, self.open);
        st(&live.requests_at_source, self.report.requests.at_source);
        st(&live.requests_copied, self.report.requests.copied);
        st(&live.requests_answered, self.report.requests.answered);
        st(&live.held_bytes, self.held as u64);
        st(&live.kernel_drops, self.report.capture.kernel_drops);
        st(&live.bytes_copied, self.report.requests.bytes_copied);
        st(&live.bytes_answered, self.report.requests.bytes_answered);
        if let Some(d) = self.differ.as_ref().map(Differ::stats) {
            st(&live.diff_compared, d.compared);
            st(&live.diff_equal, d.equal);
            st(&live.diff_different, d.different);
        }
    }

    /// After the input ended: lets the connections finish (each waits at most `--timeout`
    /// for an answer and a second for the target's FIN; at most [`feed::STOP_DRAIN`] in all
    /// when the run was `stopped`, or is stopped meanwhile), then counts the rest as open.
    fn drain(
        &mut self,
        events: &mut Events,
        stop: &AtomicBool,
        live: &CopyCounters,
        mut stopped: bool,
    ) -> Result<(), RelayError> {
        let mut deadline = feed::drain_deadline(self.cfg, stopped, CLOSE_LINGER_NS);
        while self.open > 0 && now_ns() < deadline {
            if !stopped && stop.load(Ordering::Relaxed) {
                stopped = true;
                deadline = deadline.min(feed::drain_deadline(self.cfg, true, 0));
            }
            self.step(events, Duration::from_millis(50))?;
            self.publish(live);
        }
        for idx in 0..self.conns.len() {
            if self.conns[idx].is_some() {
                self.end_conn(idx, Outcome::OpenAtEnd);
            }
        }
        Ok(())
    }

    fn finish(mut self, seconds: f64) -> CopyReport {
        let mut r = std::mem::take(&mut self.report);
        r.mode = "relay".into();
        r.rules = self.cfg.rules.iter().map(ToString::to_string).collect();
        r.copies_per_session = self.cfg.copies;
        r.sample_percent = self.cfg.sampler.percent;
        r.seconds = seconds;
        r.latency.original = self.orig.percentiles();
        r.latency.target = self.target_lat.percentiles();
        r.memory.limit_bytes = self.cfg.max_memory as u64;
        r.memory.rss_bytes = tcpkit_stats::host::rss_bytes();
        r.diff = self.differ.as_mut().map(Differ::finish);
        r.requests.max_loss_percent = self.cfg.max_loss_percent;
        r.finish();
        r
    }
}

impl feed::Consumer for Relay<'_> {
    type Error = RelayError;
    const LIVE_WAIT: Duration = Duration::from_millis(10);

    fn cfg(&self) -> &CopyConfig {
        self.cfg
    }
    fn registry(&self) -> &mio::Registry {
        self.poll.registry()
    }
    fn report(&mut self) -> &mut CopyReport {
        &mut self.report
    }
    fn open_session(
        &mut self,
        id: SessionId,
        client: SocketAddr,
        server: SocketAddr,
        syn_seen: bool,
        now: u64,
    ) {
        let Some(rule) = transfer::rule_for(&self.cfg.rules, server).copied() else {
            return;
        };
        let s = &mut self.report.sessions;
        s.seen += 1;
        if !syn_seen {
            s.joined_mid_stream += 1;
        }
        if !self
            .cfg
            .sampler
            .selects(client, server, now.saturating_sub(self.start_ns))
        {
            s.sampled_out += 1;
            return;
        }
        s.selected += 1;
        let mut conns = Vec::with_capacity(self.cfg.copies as usize);
        for copy in 1..=self.cfg.copies {
            let idx = self.new_conn(rule.target, client, server, now);
            conns.push((idx, self.gens[idx]));
            if let (Some(d), Some(c)) = (self.differ.as_ref(), self.conns[idx].as_mut()) {
                c.diff = Some(Box::new(d.conn(ConnMeta {
                    session: id.0,
                    copy,
                    client,
                    server,
                    target: rule.target,
                })));
            }
        }
        self.sessions.insert(
            id,
            Sess {
                conns,
                turns: Turns::new(syn_seen, self.differ.as_ref()),
            },
        );
        for i in 0..self.cfg.copies as usize {
            let idx = self.sessions[&id].conns[i].0;
            self.start_connect(idx, now);
        }
    }
    fn session_data(
        &mut self,
        id: SessionId,
        dir: Dir,
        bytes: &Bytes,
        ts: u64,
        now: u64,
        tracker_mem: u64,
    ) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        match dir {
            Dir::ServerToClient => {
                if let Some(lat) = s.turns.server(bytes, ts) {
                    self.orig.record(lat);
                }
            }
            Dir::ClientToServer => {
                let (start, answer) =
                    match s
                        .turns
                        .client(bytes, ts, self.max_think_ns, self.differ.as_ref())
                    {
                        ClientBytes::Skipped => {
                            self.report.requests.bytes_skipped_joining += bytes.len() as u64;
                            return;
                        }
                        ClientBytes::Copy { start, answer } => (start, answer),
                    };
                if start.is_some() {
                    self.report.requests.at_source += u64::from(self.cfg.copies);
                }
                // One copy out of the reassembler's shared block, shared by the -n copies.
                let data = Bytes::copy_from_slice(bytes);
                let conns = s.conns.clone();
                let diff_held = self.differ.as_ref().map_or(0, Differ::held_bytes);
                let over = self.held + data.len() * conns.len() + tracker_mem as usize + diff_held
                    > self.cfg.max_memory;
                if over {
                    self.shed_session(id, now);
                    return;
                }
                for (idx, gen) in conns {
                    if let Some(c) = self.conn_mut(idx, gen) {
                        if let Some(d) = c.diff.as_mut() {
                            if let Some((k, r)) = &answer {
                                d.original(*k, Rc::clone(r));
                            }
                            if start.is_some() {
                                d.request_queued(&data);
                            }
                        }
                        c.queue.push_back(Item::Data {
                            bytes: data.clone(),
                            start,
                        });
                        c.held += data.len();
                        self.held += data.len();
                        self.pump(idx, now);
                    }
                }
                let peak = (self.held + diff_held) as u64 + tracker_mem;
                let m = &mut self.report.memory;
                m.peak_held_bytes = m.peak_held_bytes.max(peak);
            }
        }
    }
    fn session_gap(&mut self, id: SessionId, dir: Dir, len: u64, ts: u64) {
        if let (Some(s), Dir::ServerToClient) = (self.sessions.get_mut(&id), dir) {
            s.turns.server_gap(len, ts);
        }
    }
    fn close_session(&mut self, id: SessionId, how: CloseKind, requests_seen: u64, now: u64) {
        let Some(s) = self.sessions.remove(&id) else {
            return;
        };
        let lost = matches!(how, CloseKind::LostData { .. });
        if lost {
            self.report.requests.at_source +=
                s.turns.unreplayed(requests_seen) * u64::from(self.cfg.copies);
        }
        if matches!(how, CloseKind::Shed) {
            for (idx, gen) in s.conns {
                if self.conn_mut(idx, gen).is_some() {
                    self.end_conn(idx, Outcome::Shed);
                }
            }
            return;
        }
        // Wait for the target's answer to the last request if the server answered it.
        let (wait_answer, answer) = s.turns.close();
        for (idx, gen) in s.conns {
            if let Some(c) = self.conn_mut(idx, gen) {
                if let (Some(d), Some((k, r))) = (c.diff.as_mut(), &answer) {
                    d.original(*k, Rc::clone(r));
                }
                c.queue.push_back(Item::End { wait_answer, lost });
                self.pump(idx, now);
            }
        }
    }
    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), RelayError> {
        Relay::step(self, events, max_wait)
    }
    fn publish(&self, live: &CopyCounters) {
        Relay::publish(self, live);
    }
}

/// Runs the relay until the input ends (a file), `stop` is set, or `duration` passes; then
/// lets the copies finish and returns the report. A capture file that turns out truncated
/// ends the input early with the reason in `failure`.
pub fn run(
    cfg: &CopyConfig,
    input: &Input,
    duration: Option<Duration>,
    stop: &AtomicBool,
    live: &CopyCounters,
) -> Result<CopyReport, RelayError> {
    let start = now_ns();
    let end_at = duration.map(|d| start + d.as_nanos() as u64);
    let (speed, max_think) = feed::pace(input);
    let mut relay = Relay::new(cfg, speed, max_think)?;
    let mut events = Events::with_capacity(1024);
    feed::run(&mut relay, input, end_at, stop, live, &mut events)?;
    let stopped = feed::stopped(stop, end_at);
    relay.drain(&mut events, stop, live, stopped)?;
    relay.publish(live);
    let secs = (now_ns() - start) as f64 / 1e9;
    Ok(relay.finish(secs))
}
