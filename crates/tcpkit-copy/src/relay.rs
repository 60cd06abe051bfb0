//! Relay mode: each captured client session replayed over an ordinary TCP connection from the
//! copy host to the target.
//!
//! One thread, one mio loop: frames come from the live capture (its ring's fd is in the loop)
//! or from a capture file at its own pace (`--speed`, `--max-idle`, `--loop`); the
//! reassembler ([`crate::reasm::Tracker`]) turns them into session events; each selected
//! session (rules, `-r` sampling) gets `-n` connections to its target (`Sock`), each with
//! its own queue of the client's bytes cut into requests. A request is the client bytes
//! between two turns of the server; per connection the next request is sent only after the
//! target answered the previous one, and after the think time the client really had (from
//! the end of the server's turn to the request's first byte), unless `--no-wait`. A session
//! whose server spoke first waits for the target's own greeting. A session joined mid-stream
//! is copied from its next request boundary (the first client bytes after a server turn).
//!
//! Nothing is ever sent toward a client: the only sockets are connections to the targets.
//!
//! Faults: a refused connect ends its copy as refused at once (as a RST to transparent mode's
//! SYN does), and holds every other copy to that target behind an exponential back-off (one
//! probe per back-off step, so a down target sees a trickle of SYNs, not a storm); a copy
//! whose `--timeout` comes before its turn ends refused without a SYN of its own
//! (`skipped_in_backoff`). A reset, a close while requests remain, an answer not coming
//! within `--timeout`, bytes the capture lost, and memory over `--max-memory` each end the
//! copy with their own count. Every copy ends exactly once: completed, failed by one cause,
//! or open at the end of the run.
//!
//! `--target-tls`: each connection speaks TLS to its target (tcpkit-tls's client session
//! over the same non-blocking socket). The handshake follows the connect, under the same
//! `--timeout`; a request goes only once it is done, and the answer latency is timed from
//! the request's plaintext taken by the session, so the handshake is in neither. A failed
//! handshake ends its copy (`timeout` past `--timeout`, `reset` otherwise) and is counted
//! by reason; a PROXY header goes in clear before the handshake, as servers expect it.
//!
//! The session front (capture side, request turns, tally, report) is `crate::front`'s;
//! this module is its transport: one kernel TCP connection per copy.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::report::{CopyReport, TargetTlsStats, TlsStats};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token};
use tcpkit_pace::now_ns;
use tcpkit_tls::{Client, Failure, Session};

use crate::backoff::{Backoff, Down, Gate, SILENT_NS};
use crate::config::{CopyConfig, CopyCounters};
use crate::feed::{Input, CAPTURE};
use crate::front::{
    io_err, open_differ, Engine, Front, Item, Outcome, RunError, Transport, CLOSE_LINGER_NS,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the target's back-off to allow a connect.
    Backoff,
    Connecting,
    /// `--target-tls`: connected, the TLS handshake under way.
    Handshaking,
    Up,
    /// Our FIN is sent; reading until the target closes.
    Closing,
}

/// A copy's connection to the target.
#[derive(Debug)]
pub(crate) struct Sock {
    sock: Option<TcpStream>,
    /// `--target-tls`: the connection's TLS session (boxed: rustls' state is large, and a
    /// clear copy's slot stays small).
    tls: Option<Box<Session>>,
    state: State,
    /// Bytes of the front item already written.
    off: usize,
    /// Give up connecting (or, with TLS, the handshake) after this.
    connect_deadline: u64,
    retry_at: u64,
    /// A connect of ours went out (the target saw a SYN of this copy).
    tried: bool,
    /// When the connect in flight counts as unanswered (its SYN needed a retransmission);
    /// 0 once judged, or with none in flight.
    silent_at: u64,
    eof: bool,
    close_deadline: u64,
}

/// Polls per turn while each fills the event buffer (bounds a turn; the rest waits one turn).
const MAX_POLLS_PER_STEP: usize = 16;

/// `--target-tls`: how each copy's connection speaks TLS to its target.
#[derive(Debug, Clone)]
pub struct TargetTls {
    /// A client per target address (each asks for its own name unless `--tls-sni` gave one).
    clients: Vec<(SocketAddr, Client)>,
}

impl TargetTls {
    /// One client per target of the copy rules.
    pub fn new(clients: Vec<(SocketAddr, Client)>) -> TargetTls {
        TargetTls { clients }
    }

    /// `--insecure`: the user is told at the start of every run.
    pub fn insecure(&self) -> bool {
        self.clients.iter().any(|(_, c)| c.insecure)
    }

    /// The name asked of `target`.
    pub fn sni(&self, target: SocketAddr) -> Option<&str> {
        self.client(target).map(|c| c.sni.as_str())
    }

    fn client(&self, target: SocketAddr) -> Option<&Client> {
        self.clients
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, c)| c)
    }
}

/// The copies' handshakes with the target, and the first failure's line (the run's own
/// when every handshake failed).
#[derive(Debug, Default)]
struct TlsTally {
    stats: TargetTlsStats,
    first_failure: Option<String>,
}

/// Relay mode's transport: the event loop, the back-off, a read buffer.
pub(crate) struct Relay {
    poll: Poll,
    /// The shared back-off toward targets that refuse or answer nothing.
    backoff: Backoff,
    scratch: Vec<u8>,
    /// `--target-tls`.
    tls: Option<TargetTls>,
    tally: TlsTally,
}

type RelayEngine<'a> = Engine<'a, Relay>;

impl Transport for Relay {
    type Conn = Sock;
    type Seed = ();
    type Error = RunError;
    const MODE: &'static str = "relay";
    const LIVE_WAIT: Duration = Duration::from_millis(10);
    const DRAIN_WAIT: Duration = Duration::from_millis(50);

    fn registry(&self) -> &Registry {
        self.poll.registry()
    }

    fn session_seen(_e: &mut RelayEngine<'_>, _client: SocketAddr, _server: SocketAddr) {}

    fn new_conn(
        e: &mut RelayEngine<'_>,
        _seed: &mut (),
        _client: SocketAddr,
        _target: SocketAddr,
        _k: u32,
        now: u64,
    ) -> Option<Sock> {
        Some(Sock {
            sock: None,
            tls: None,
            state: State::Backoff,
            off: 0,
            connect_deadline: now + e.f.cfg.timeout_ns,
            retry_at: now,
            tried: false,
            silent_at: 0,
            eof: false,
            close_deadline: 0,
        })
    }

    fn drive(e: &mut RelayEngine<'_>, idx: usize, now: u64) -> bool {
        let Some(c) = e.f.conns.get_mut(idx) else {
            return false;
        };
        let x = &mut c.x;
        match x.state {
            State::Backoff => {
                if now >= x.retry_at {
                    e.start_connect(idx, now);
                }
                false
            }
            State::Connecting => {
                if now >= x.connect_deadline {
                    e.end(idx, Outcome::Timeout, true);
                } else if x.silent_at != 0 && now >= x.silent_at {
                    // No SYN-ACK in time: the target is off or firewalled. The first to find
                    // out keeps trying (the kernel retransmits its SYN); the others stand
                    // back, so the target does not get every session's SYN retransmitted,
                    // and go through the gate's probes again.
                    let since = x.silent_at - SILENT_NS;
                    x.silent_at = 0;
                    if e.t.backoff.silent(c.target, now, since) {
                        let at = x.connect_deadline;
                        e.f.arm(idx, at, now);
                    } else {
                        drop(x.sock.take());
                        x.state = State::Backoff;
                        e.start_connect(idx, now);
                    }
                } else {
                    let at = if x.silent_at == 0 {
                        x.connect_deadline
                    } else {
                        x.silent_at.min(x.connect_deadline)
                    };
                    e.f.arm(idx, at, now);
                }
                false
            }
            State::Handshaking => {
                if now >= x.connect_deadline {
                    let limit = Duration::from_nanos(e.f.cfg.timeout_ns);
                    e.tls_failed(idx, &Failure::timeout(limit));
                } else {
                    let at = x.connect_deadline;
                    e.f.arm(idx, at, now);
                }
                false
            }
            State::Closing => {
                if x.eof || now >= x.close_deadline {
                    let how = c.ending;
                    e.end(idx, how, true);
                } else {
                    let at = x.close_deadline;
                    e.f.arm(idx, at, now);
                }
                false
            }
            State::Up => true,
        }
    }

    fn peer_closed(x: &Sock) -> bool {
        x.eof
    }

    fn write(e: &mut RelayEngine<'_>, idx: usize, now: u64) -> bool {
        let f = &mut e.f;
        let Some(c) = f.conns.get_mut(idx) else {
            return false;
        };
        let Some(Item::Data { bytes, .. }) = c.queue.front() else {
            return false;
        };
        let Some(s) = c.x.sock.as_mut() else {
            return false;
        };
        let rest = &bytes[c.x.off..];
        let wrote = match c.x.tls.as_mut() {
            Some(t) => t.write(s, rest),
            None => s.write(rest),
        };
        match wrote {
            Ok(n) => {
                c.x.off += n;
                c.last_write_ns = now;
                f.report.requests.bytes_copied += n as u64;
                if c.x.off == bytes.len() {
                    let len = bytes.len();
                    c.queue.pop_front();
                    c.x.off = 0;
                    c.held -= len;
                    f.held -= len;
                }
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
            Err(_) => {
                e.end(idx, Outcome::Reset, true);
                false
            }
        }
    }

    fn close(e: &mut RelayEngine<'_>, idx: usize, now: u64, ending: Outcome) -> bool {
        let Some(c) = e.f.conns.get_mut(idx) else {
            return false;
        };
        c.queue.pop_front();
        if let Some(s) = c.x.sock.as_mut() {
            if let Some(t) = c.x.tls.as_mut() {
                t.close(s);
            }
            let _ = s.shutdown(Shutdown::Write);
        }
        c.x.state = State::Closing;
        c.x.close_deadline = now + CLOSE_LINGER_NS;
        c.ending = ending;
        true
    }

    /// Closing the descriptor (when the copy is dropped) takes it out of the epoll set: no
    /// deregister call, and nothing else to undo.
    fn release(_e: &mut RelayEngine<'_>, _idx: usize, _how: Outcome, _reset: bool) {}

    fn backoff(&mut self) -> &mut Backoff {
        &mut self.backoff
    }

    fn gated(x: &Sock) -> Option<bool> {
        (x.state == State::Backoff).then_some(x.tried)
    }

    fn finish(&mut self, _f: &Front<'_, Sock>, r: &mut CopyReport) {
        if self.tls.is_none() {
            return;
        }
        let t = std::mem::take(&mut self.tally);
        if t.stats.handshakes == 0 && r.failure.is_none() {
            // Every handshake failed: the one line that says why (the first failure's), as
            // load says it.
            r.failure = t.first_failure;
        }
        r.tls
            .get_or_insert_with(|| TlsStats {
                source: "clear".into(),
                ..TlsStats::default()
            })
            .target = Some(t.stats);
    }

    fn io(e: &mut RelayEngine<'_>, events: &mut Events, wait: Duration) -> Result<(), RunError> {
        let mut wait = wait;
        // Every connection that is ready, not one buffer of them: a turn of capture can open
        // thousands of connections, and those left unserved kept their requests unsent until
        // the target dropped them as idle (at 20k new connections/s the copy held 15k open).
        for _ in 0..MAX_POLLS_PER_STEP {
            match e.t.poll.poll(events, Some(wait)) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(io_err("wait for events (epoll_wait)")(err)),
            }
            let full = events.iter().count() >= events.capacity();
            let now = now_ns();
            for ev in events.iter() {
                if ev.token() != CAPTURE {
                    // A FIN or an error already queued must be read to be seen; an event
                    // that only says writable (a connect that finished) has nothing to read.
                    let hup = ev.is_read_closed() || ev.is_error();
                    let readable = ev.is_readable() || hup;
                    e.on_io(ev.token().0, now, readable, hup);
                }
            }
            if !full {
                break;
            }
            wait = Duration::ZERO;
        }
        Ok(())
    }
}

impl RelayEngine<'_> {
    /// Connects now if the target's back-off allows, or waits for it.
    fn start_connect(&mut self, idx: usize, now: u64) {
        let Some(c) = self.f.conns.get_mut(idx) else {
            return;
        };
        let target = c.target;
        let x = &mut c.x;
        if let Gate::Wait(next_try) = self.t.backoff.gate(target, now) {
            if next_try >= x.connect_deadline {
                let how = match self.t.backoff.down(target) {
                    Some(Down::Refused) => Outcome::Refused,
                    _ => Outcome::Timeout,
                };
                if !x.tried {
                    self.f.report.sessions.skipped_in_backoff += 1;
                }
                self.end(idx, how, true);
                return;
            }
            x.state = State::Backoff;
            x.retry_at = next_try;
            self.f.arm(idx, next_try, now);
            return;
        }
        match TcpStream::connect(target) {
            Ok(mut s) => {
                if self
                    .t
                    .poll
                    .registry()
                    .register(&mut s, Token(idx), Interest::READABLE | Interest::WRITABLE)
                    .is_err()
                {
                    self.end(idx, Outcome::Reset, true);
                    return;
                }
                let _ = s.set_nodelay(true);
                x.sock = Some(s);
                x.state = State::Connecting;
                x.tried = true;
                x.silent_at = now + SILENT_NS;
                let at = x.silent_at.min(x.connect_deadline);
                self.f.arm(idx, at, now);
            }
            Err(e) => self.connect_failed(idx, &e, now),
        }
    }

    fn connect_failed(&mut self, idx: usize, e: &io::Error, now: u64) {
        let Some(c) = self.f.conns.get_mut(idx) else {
            return;
        };
        // Closing the descriptor takes it out of the epoll set: no deregister call.
        drop(c.x.sock.take());
        let refused = matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
        );
        if !refused {
            // Out of ports or descriptors, or the like: not the target's doing, but the copy
            // cannot be made; counted as a reset of the attempt.
            self.end(idx, Outcome::Reset, true);
            return;
        }
        // Counted at once, as transparent mode counts a RST to its SYN: retrying until the
        // --timeout left a run shorter than it reporting every such copy as open, and the
        // user told nothing meanwhile. The copies after it wait for the back-off's probes.
        let target = c.target;
        self.t.backoff.refused(target, now, e);
        self.end(idx, Outcome::Refused, true);
    }

    /// The first event of a connecting socket: the end of the handshake (registered
    /// edge-triggered while connecting). A failed connect raises EPOLLERR, so only an event
    /// with `err` (error or hang-up) needs SO_ERROR to tell why; asking it on every success
    /// was one of the copy's ten syscalls per session with a connection per request.
    fn connected(&mut self, idx: usize, now: u64, err: bool) {
        let Some(c) = self.f.conns.get_mut(idx) else {
            return;
        };
        let Some(s) = c.x.sock.as_ref() else { return };
        if err {
            match s.take_error() {
                Ok(Some(e)) | Err(e) => return self.connect_failed(idx, &e, now),
                // Connected, then closed by the target at once: the read that follows sees it.
                Ok(None) => {}
            }
        }
        c.x.silent_at = 0;
        let target = c.target;
        self.t.backoff.accepted(target, now);
        if self.t.tls.is_some() {
            self.start_tls(idx, now);
        } else {
            self.up(idx, now);
        }
    }

    /// The connection carries requests from now on: their answers are timed from here.
    fn up(&mut self, idx: usize, now: u64) {
        let Some(c) = self.f.conns.get_mut(idx) else {
            return;
        };
        c.x.state = State::Up;
        c.last_write_ns = now;
        c.last_rx_ns = now;
    }

    /// `--target-tls`: the PROXY header (in clear, before the ClientHello, where servers
    /// read it), then the handshake, under the connect's deadline.
    fn start_tls(&mut self, idx: usize, now: u64) {
        let proxy = self.f.cfg.proxy_protocol;
        let Some(c) = self.f.conns.get_mut(idx) else {
            return;
        };
        let Some(client) = self.t.tls.as_ref().and_then(|t| t.client(c.target)) else {
            return;
        };
        let session = match client.session() {
            Ok(s) => s,
            Err(err) => {
                let f = Failure {
                    reason: tcpkit_tls::Reason::Other,
                    detail: err.to_string(),
                };
                return self.tls_failed(idx, &f);
            }
        };
        if proxy {
            // The first item is the header (queued at the copy's start, nothing written
            // yet); a fresh connection's send buffer takes its few dozen bytes whole.
            if let (Some(Item::Data { bytes, .. }), Some(s)) = (c.queue.front(), c.x.sock.as_mut())
            {
                match s.write(bytes) {
                    Ok(n) if n == bytes.len() => {
                        self.f.report.requests.bytes_copied += n as u64;
                        c.queue.pop_front();
                        c.held -= n;
                        self.f.held -= n;
                    }
                    _ => return self.end(idx, Outcome::Reset, true),
                }
            }
        }
        c.x.tls = Some(Box::new(session));
        c.x.state = State::Handshaking;
        c.x.connect_deadline = now + self.f.cfg.timeout_ns;
        self.handshake(idx, now);
    }

    /// Moves the TLS handshake on; once done the copy is up, and what the target may
    /// already have sent is read.
    fn handshake(&mut self, idx: usize, now: u64) {
        let Some(c) = self.f.conns.get_mut(idx) else {
            return;
        };
        let (Some(s), Some(t)) = (c.x.sock.as_mut(), c.x.tls.as_mut()) else {
            return;
        };
        match t.handshake(s) {
            Ok(false) => {
                let at = c.x.connect_deadline;
                self.f.arm(idx, at, now);
            }
            Ok(true) => {
                self.t.tally.stats.handshakes += 1;
                self.up(idx, now);
                self.read(idx, now, true);
            }
            Err(err) => {
                let target = c.target;
                let Some(client) = self.t.tls.as_ref().and_then(|t| t.client(target)) else {
                    return;
                };
                let f = Failure::of(&err, &client.offer());
                self.tls_failed(idx, &f);
            }
        }
    }

    /// A failed handshake: counted by reason, the copy ended (a timeout as one).
    fn tls_failed(&mut self, idx: usize, f: &Failure) {
        let Some(c) = self.f.conns.get(idx) else {
            return;
        };
        let target = c.target;
        let tally = &mut self.t.tally;
        tally.stats.failed += 1;
        *tally
            .stats
            .failures
            .entry(f.reason.as_str().to_string())
            .or_insert(0) += 1;
        tally
            .first_failure
            .get_or_insert_with(|| format!("TLS handshake with {target} failed: {}", f.detail));
        let how = if f.reason == tcpkit_tls::Reason::HandshakeTimeout {
            Outcome::Timeout
        } else {
            Outcome::Reset
        };
        self.end(idx, how, true);
    }

    fn on_io(&mut self, idx: usize, now: u64, readable: bool, hup: bool) {
        let Some(c) = self.f.conns.get(idx) else {
            return;
        };
        match c.x.state {
            State::Connecting => self.connected(idx, now, hup),
            State::Handshaking => self.handshake(idx, now),
            _ => {}
        }
        if readable {
            self.read(idx, now, hup);
        }
        self.flush_tls(idx);
        self.pump(idx, now);
    }

    /// Reads what the target sent. A read shorter than the buffer emptied the socket (more
    /// data would raise a new edge), so the read that could only say EAGAIN is skipped unless
    /// `hup` says a FIN or an error waits behind the data: with a new connection per request
    /// that read was 1.7 of the copy's 12 syscalls per session.
    fn read(&mut self, idx: usize, now: u64, hup: bool) {
        // A TLS session may hold decrypted bytes the socket no longer signals: read until
        // it says the socket would block.
        let hup = hup || self.f.conns.get(idx).is_some_and(|c| c.x.tls.is_some());
        let f = &mut self.f;
        let no_wait = f.cfg.no_wait;
        let Some(c) = f.conns.get_mut(idx) else {
            return;
        };
        if !matches!(c.x.state, State::Up | State::Closing) {
            return;
        }
        let scratch = &mut self.t.scratch;
        loop {
            let Some(s) = c.x.sock.as_mut() else { return };
            let got = match c.x.tls.as_mut() {
                Some(t) => t.read(s, scratch),
                None => s.read(scratch),
            };
            match got {
                Ok(0) => {
                    c.x.eof = true;
                    break;
                }
                Ok(n) => {
                    c.answer_bytes(
                        n as u64,
                        &scratch[..n],
                        &mut f.report,
                        &mut f.target_lat,
                        no_wait,
                        now,
                    );
                    if n < scratch.len() && !hup {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.end(idx, Outcome::Reset, true);
                    return;
                }
            }
        }
    }
}

impl RelayEngine<'_> {
    /// Writes TLS output the socket could not take before (the tail of a request, a key
    /// update): a writable edge is its only chance.
    fn flush_tls(&mut self, idx: usize) {
        let Some(c) = self.f.conns.get_mut(idx) else {
            return;
        };
        let (Some(s), Some(t)) = (c.x.sock.as_mut(), c.x.tls.as_mut()) else {
            return;
        };
        if t.wants_write() && t.flush(s).is_err() {
            self.end(idx, Outcome::Reset, true);
        }
    }
}

/// Runs the relay until the input ends (a file), `stop` is set, or `duration` passes; then
/// lets the copies finish and returns the report. A capture file that turns out truncated
/// ends the input early with the reason in `failure`. `say` gives the user a line as it
/// happens (a target refusing, or back).
pub fn run(
    cfg: &CopyConfig,
    tls: Option<TargetTls>,
    input: &Input,
    duration: Option<Duration>,
    stop: &AtomicBool,
    live: &CopyCounters,
    say: &dyn Fn(&str),
) -> Result<CopyReport, RunError> {
    let start = now_ns();
    let differ = open_differ(cfg)?;
    let relay = Relay {
        poll: Poll::new().map_err(io_err("create the event loop (epoll)"))?,
        backoff: Backoff::default(),
        scratch: vec![0; 64 << 10],
        tls,
        tally: TlsTally::default(),
    };
    Engine::new(cfg, relay, differ, input, start, say).run(input, duration, stop, live)
}
