//! One event-loop thread of `tcpkit echo`: accepting, the connection slab, and what happens
//! to a connection's bytes (echoed, or answered as DNS queries) under back-pressure.
//!
//! Reads go into one scratch buffer per thread. Only what cannot be handled at once (output
//! the peer has no room for, the start of a query whose end has not arrived) is copied into
//! the connection's own [`Pending`] buffers, which exist only while they hold bytes. While a
//! connection has output pending it is not read: its peer's writes then fill the socket
//! buffers and block, which is the back-pressure that bounds server memory.
//!
//! Against hostile peers (issue 11) the process holds at most `max_conns` connections: a
//! newcomer over the cap takes the place of the oldest connection that has not yet sent a
//! first message ([`Silent`]), or is closed at once when every connection has spoken; and once
//! the server has been full, a connection silent past `first_timeout` is closed.
//!
//! With `--tls` each connection has a TLS session beside its slot (in a parallel vector, so a
//! clear server's slots stay as small as before), boxed and bounded: its handshake has
//! `tls_handshake_timeout`, its buffers rustls' limits ([`tcpkit_tls::session::OUT_LIMIT`]
//! of output, one record of input); above it the modes see plaintext.

use std::io::{self, ErrorKind, Read, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use tcpkit_tls::{Reason, Session};
use tcpkit_wire::dns;

use super::http::{Answers, Fed, HttpConn};
use super::silent::Silent;
use super::{bump, EchoConfig, EchoError, Mode, Shared, ThreadCounters, ACCEPT_BACKOFF};

/// Tokens from here up name listeners; below, slab slots.
const LISTENER_BASE: usize = usize::MAX / 2;
/// Longest sleep in `poll`, so a stop flag set by a signal handled on another thread is seen
/// promptly.
const TICK: Duration = Duration::from_millis(100);
/// Bytes a DNS answer can add to its query: an AAAA record behind a name pointer.
const DNS_ANSWER_GROWTH: usize = 2 + 10 + 16;
/// Most connections accepted from one listener before the loop serves its connections again:
/// under a connection flood the accept queue refills as fast as it is drained, and draining it
/// to the end would starve the clients already connected.
const ACCEPT_BATCH: usize = 256;

/// Bytes a connection could not finish with yet. Boxed so an idle connection pays one
/// pointer for it.
#[derive(Debug, Default)]
struct Pending {
    /// Output not yet written, from `out_pos`.
    output: Vec<u8>,
    out_pos: usize,
    /// DNS mode: the start of a query whose end has not arrived.
    input: Vec<u8>,
    /// When the start of the query in `input` (HTTP: of an unfinished request or frame)
    /// arrived: its end must follow within `partial_timeout` (in the box, so an idle
    /// connection pays nothing for it).
    since: Option<Instant>,
    /// Since when the client has taken none of `output`: a client that stopped reading (echo
    /// then stops reading it too) has `partial_timeout` to take some, and is counted apart.
    stalled: Option<Instant>,
    /// HTTP mode: the connection's protocol state, kept while it lives.
    http: Option<HttpConn>,
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    /// Nonzero until the first message arrived: the tag of its entry in [`Silent`] (in the
    /// padding beside the descriptor, so it costs nothing).
    tag: u32,
    pending: Option<Box<Pending>>,
}

// What an idle connection costs in user memory: a descriptor, its tag and a null pointer (the
// fd's niche makes the Option free), plus 8 bytes in the free list once its slot is reused and
// 12 bytes in the FIFO of silent connections until it sends its first message.
// Checked in optimised builds only: mio's TcpStream carries a debug-only field.
#[cfg(not(debug_assertions))]
const _: () = assert!(std::mem::size_of::<Option<Conn>>() <= 16);

impl Pending {
    /// Output is left unwritten after a write of `n` bytes: the stall starts now if the client
    /// took some (or none was counted yet), and keeps its start if it took nothing.
    fn stall(&mut self, n: usize) {
        if n > 0 || self.stalled.is_none() {
            self.stalled = Some(Instant::now());
        }
    }
}

impl Conn {
    /// Frees the pending buffers once they are empty: an idle connection holds no buffer.
    fn release_if_empty(&mut self) {
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.out_pos >= p.output.len() && p.input.is_empty() && p.http.is_none())
        {
            self.pending = None;
        }
    }

    fn pending_mut(&mut self) -> &mut Pending {
        self.pending.get_or_insert_with(Box::default)
    }
}

/// A TLS connection's session and when it was accepted (for the handshake deadline).
#[derive(Debug)]
struct PeerTls {
    session: Session,
    since: Instant,
}

/// Connections by token: a Vec of slots and a free list, so a slot is reused in O(1) and a
/// token stays valid exactly as long as its connection. `tls` (empty in clear) holds each
/// TLS connection's session at its slot's index.
#[derive(Debug, Default)]
struct Slab {
    slots: Vec<Option<Conn>>,
    free: Vec<usize>,
    tls: Vec<Option<Box<PeerTls>>>,
}

impl Slab {
    fn insert(&mut self, c: Conn) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(c);
                i
            }
            None => {
                self.slots.push(Some(c));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) -> Option<Conn> {
        let c = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        if let Some(t) = self.tls.get_mut(i) {
            *t = None;
        }
        Some(c)
    }

    fn set_tls(&mut self, i: usize, t: Box<PeerTls>) {
        if self.tls.len() <= i {
            self.tls.resize_with(i + 1, || None);
        }
        self.tls[i] = Some(t);
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Conn> {
        self.slots.get_mut(i)?.as_mut()
    }

    /// Whether slot `i` holds the silent connection tagged `tag` (not one that spoke, nor a
    /// later connection in a reused slot).
    fn is_silent(&self, i: usize, tag: u32) -> bool {
        self.slots
            .get(i)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.tag == tag)
    }
}

/// One thread's connections: the slab, which of them are silent, and the process-wide count
/// kept in step.
struct Conns<'s> {
    slab: Slab,
    silent: Silent,
    /// `--tls`: each accepted connection gets a session of this configuration.
    tls: Option<std::sync::Arc<tcpkit_tls::rustls::ServerConfig>>,
    /// Accept times are kept as milliseconds since this instant.
    epoch: Instant,
    shared: &'s Shared<'s>,
}

impl Conns<'_> {
    fn ms(&self, t: Instant) -> u32 {
        // Truncated to 32 bits on purpose: ages are taken with wrapping arithmetic.
        t.saturating_duration_since(self.epoch).as_millis() as u32
    }

    /// Takes a connection just accepted (already counted in `shared.open`).
    fn admit(&mut self, stream: TcpStream, now: Instant) -> usize {
        let tag = self.silent.next_tag();
        let i = self.slab.insert(Conn {
            stream,
            tag,
            pending: None,
        });
        let at = self.ms(now);
        let slab = &self.slab;
        self.silent.push(i, tag, at, |s, t| slab.is_silent(s, t));
        i
    }

    /// Takes connection `i` out (dropping it closes the socket, which also removes it from
    /// epoll). The caller counts why.
    fn remove(&mut self, i: usize) -> Option<Conn> {
        let c = self.slab.remove(i)?;
        if c.tag != 0 {
            self.silent.left();
        }
        self.shared.open.fetch_sub(1, Ordering::Relaxed);
        Some(c)
    }

    /// Closes the oldest silent connection (older than `older_than`, if given); false when
    /// there is none.
    fn close_oldest_silent(&mut self, now: Instant, older_than: Option<Duration>) -> bool {
        let now_ms = self.ms(now);
        let limit = older_than.map(|d| d.as_millis().min(u128::from(u32::MAX)) as u32);
        let slab = &self.slab;
        match self
            .silent
            .pop_oldest(now_ms, limit, |s, t| slab.is_silent(s, t))
        {
            Some(i) => self.remove(i).is_some(),
            None => false,
        }
    }
}

/// What a round of work on a connection ended with.
enum Next {
    /// Nothing more until the next event.
    Wait,
    /// Close it (peer closed, error, or malformed query).
    Close,
}

struct Loop<'a> {
    mode: Mode,
    max_buf: usize,
    scratch: Vec<u8>,
    out: Vec<u8>,
    c: &'a ThreadCounters,
}

pub(super) fn serve(
    cfg: &EchoConfig,
    mut listeners: Vec<TcpListener>,
    counters: &ThreadCounters,
    shared: &Shared<'_>,
) -> Result<(), EchoError> {
    let mut poll = Poll::new().map_err(|e| EchoError::io("epoll_create", e))?;
    for (i, l) in listeners.iter_mut().enumerate() {
        poll.registry()
            .register(l, Token(LISTENER_BASE + i), Interest::READABLE)
            .map_err(|e| EchoError::io("register listener with epoll", e))?;
    }
    let mut events = Events::with_capacity(1024);
    let mut conns = Conns {
        slab: Slab::default(),
        silent: Silent::default(),
        tls: cfg.tls.clone(),
        epoch: Instant::now(),
        shared,
    };
    let mut lp = Loop {
        mode: cfg.mode,
        max_buf: cfg.max_conn_buf,
        scratch: vec![0; cfg.max_conn_buf],
        out: Vec::with_capacity(cfg.max_conn_buf),
        c: counters,
    };
    let mut backoff_until: Option<Instant> = None;
    // A listener's accept batch ended before its queue did: accept again before sleeping
    // (edge-triggered listeners report nothing for connections already queued).
    let mut accept_more = false;
    let mut next_sweep = Instant::now() + TICK;
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        if shared.deadline.is_some_and(|d| now >= d) {
            break;
        }
        // Accepting was paused for lack of descriptors: once the pause is over, try again.
        if backoff_until.is_some_and(|t| now >= t) || (accept_more && backoff_until.is_none()) {
            backoff_until = None;
            accept_more = false;
            for l in &listeners {
                match accept_all(l, &poll, &mut conns, counters) {
                    Accepted::Drained => {}
                    Accepted::More => accept_more = true,
                    Accepted::Pause(t) => {
                        backoff_until = Some(t);
                        break;
                    }
                }
            }
        }
        if now >= next_sweep {
            next_sweep = now + TICK;
            // The first-message deadline first: it takes connections in accept order, so under
            // pressure the oldest go first whether or not they hold part of a query.
            sweep_first(&mut conns, now, cfg.first_timeout, counters);
            if matches!(cfg.mode, Mode::Dns { .. } | Mode::Http { .. }) {
                sweep_partial(&mut conns, now, cfg.partial_timeout, counters);
            }
            if conns.tls.is_some() {
                sweep_handshakes(&mut conns, now, cfg.tls_handshake_timeout, counters);
            }
        }
        let mut timeout = TICK;
        for t in [shared.deadline, backoff_until].into_iter().flatten() {
            timeout = timeout.min(t.saturating_duration_since(now));
        }
        if accept_more && backoff_until.is_none() {
            timeout = Duration::ZERO;
        }
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(EchoError::io("epoll_wait", e));
        }
        for ev in events.iter() {
            let t = ev.token().0;
            if t >= LISTENER_BASE {
                if backoff_until.is_none() {
                    if let Some(l) = listeners.get(t - LISTENER_BASE) {
                        match accept_all(l, &poll, &mut conns, counters) {
                            Accepted::Drained => {}
                            Accepted::More => accept_more = true,
                            Accepted::Pause(t) => backoff_until = Some(t),
                        }
                    }
                }
                continue;
            }
            let Some(conn) = conns.slab.slots.get_mut(t).and_then(Option::as_mut) else {
                continue;
            };
            let tls = conns.slab.tls.get_mut(t).and_then(Option::as_deref_mut);
            // A peer's FIN (or an error) must be read to be seen; otherwise a short read
            // means the socket is empty and the next bytes raise a new edge.
            let hup = ev.is_read_closed() || ev.is_error();
            let was_silent = conn.tag != 0;
            let next = lp.work(conn, tls, hup);
            if was_silent && conn.tag == 0 {
                conns.silent.left();
            }
            if let Next::Close = next {
                if conns.remove(t).is_some() {
                    bump(&counters.closed, 1);
                }
            }
        }
    }
    Ok(())
}

/// Closes every connection holding the start of a query, or answers its client takes none
/// of, for longer than `limit` (one pass over the slab per tick: cheap beside the
/// connections it bounds). A client with answers waiting stopped reading, and echo stopped
/// reading it (back-pressure): what it sent and echo has not read is no partial query of its
/// making, so it is judged and counted as a client that stopped reading.
fn sweep_partial(conns: &mut Conns<'_>, now: Instant, limit: Duration, c: &ThreadCounters) {
    for i in 0..conns.slab.slots.len() {
        let stale = conns.slab.slots[i].as_ref().and_then(|conn| {
            let p = conn.pending.as_ref()?;
            let unread = p.out_pos < p.output.len();
            let t = if unread { p.stalled? } else { p.since? };
            (now.duration_since(t) >= limit).then_some(unread)
        });
        if let Some(unread) = stale {
            if conns.remove(i).is_some() {
                let why = if unread {
                    &c.unread_timeouts
                } else {
                    &c.partial_timeouts
                };
                bump(why, 1);
                bump(&c.closed, 1);
            }
        }
    }
}

/// Closes every TLS connection whose handshake is not done `limit` after its accept (one pass
/// over the sessions per tick).
fn sweep_handshakes(conns: &mut Conns<'_>, now: Instant, limit: Duration, c: &ThreadCounters) {
    for i in 0..conns.slab.tls.len() {
        let late = conns.slab.tls[i]
            .as_ref()
            .is_some_and(|t| t.session.is_handshaking() && now.duration_since(t.since) >= limit);
        if late && conns.remove(i).is_some() {
            tls_failed(c, Reason::HandshakeTimeout);
            bump(&c.closed, 1);
        }
    }
}

fn tls_failed(c: &ThreadCounters, r: Reason) {
    if let Some(k) = Reason::ALL.iter().position(|x| *x == r) {
        bump(&c.tls_failed[k], 1);
    }
}

/// Once the server has been full (at the cap, or out of descriptors), closes the connections
/// silent for `limit` or longer, oldest first (only the FIFO's front is looked at: the cost is
/// the connections closed). The pressure lasts until the process holds fewer than half of what
/// it can: `tcpkit load` keeps connections silent for minutes by design (`--hold`, many
/// connections at a low rate, the opening of a million), so a deadline that applied always
/// would cut honest runs; one that applies only while silent connections crowd out others
/// gives a flood's leftovers back, and what stays below half is evicted first if the cap is
/// reached again.
fn sweep_first(conns: &mut Conns<'_>, now: Instant, limit: Duration, c: &ThreadCounters) {
    let sh = conns.shared;
    if !sh.full.load(Ordering::Relaxed) {
        let slab = &conns.slab;
        conns.silent.tidy(|s, t| slab.is_silent(s, t));
        return;
    }
    loop {
        if sh.open.load(Ordering::Relaxed) < sh.low_water {
            sh.full.store(false, Ordering::Relaxed);
            return;
        }
        if limit.is_zero() || !conns.close_oldest_silent(now, Some(limit)) {
            return;
        }
        bump(&c.first_timeouts, 1);
        bump(&c.closed, 1);
    }
}

/// How a round of accepting ended.
enum Accepted {
    /// The queue is empty; the listener's next edge says when there is more.
    Drained,
    /// The batch ended first: accept again after serving the connections.
    More,
    /// Out of descriptors or kernel memory: accept again at this time (never spin: the
    /// queue stays full until a descriptor frees).
    Pause(Instant),
}

/// Keeps the last accept failure's OS error for the report.
fn record_errno(c: &ThreadCounters, e: &io::Error) {
    if let Some(n) = e.raw_os_error() {
        c.accept_errno.store(n as u64, Ordering::Relaxed);
    }
}

/// Accepts up to [`ACCEPT_BATCH`] connections, keeping to the cap: over it, the oldest silent
/// connection of this thread is closed to make room, or the newcomer is closed at once when
/// every connection here has spoken.
fn accept_all(l: &TcpListener, poll: &Poll, conns: &mut Conns<'_>, c: &ThreadCounters) -> Accepted {
    let sh = conns.shared;
    let now = Instant::now();
    for _ in 0..ACCEPT_BATCH {
        match l.accept() {
            Ok((stream, _)) => {
                bump(&c.accepted, 1);
                // Counted first, so two threads at the cap cannot both take the last place.
                let open = sh.open.fetch_add(1, Ordering::Relaxed) + 1;
                if open > sh.max_conns {
                    sh.full.store(true, Ordering::Relaxed);
                    if !sh.cap_hint_given.swap(true, Ordering::Relaxed) {
                        (sh.hint)(&format!(
                            "at --max-conns ({} connections): each newcomer now takes the place of the oldest connection that has sent nothing, or is refused when all have spoken; if these are real clients, raise --max-conns or --procs (tcpkit tune --role server)",
                            sh.max_conns
                        ));
                    }
                    if conns.close_oldest_silent(now, None) {
                        bump(&c.evicted, 1);
                        bump(&c.closed, 1);
                    } else {
                        // Refused: closed before it is read, counted as opened and closed.
                        drop(stream);
                        sh.open.fetch_sub(1, Ordering::Relaxed);
                        bump(&c.over_cap, 1);
                        bump(&c.closed, 1);
                        continue;
                    }
                }
                // Answers are small and each matters for latency: no Nagle delay.
                let _ = stream.set_nodelay(true);
                let i = conns.admit(stream, now);
                let Some(conn) = conns.slab.get_mut(i) else {
                    continue;
                };
                // Readable and writable from the start: with edge triggering that costs one
                // extra event per connection and saves a re-registration per blocked write.
                if let Err(e) = poll.registry().register(
                    &mut conn.stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                ) {
                    record_errno(c, &e);
                    conns.remove(i);
                    bump(&c.accept_errors, 1);
                    bump(&c.closed, 1);
                    continue;
                }
                if let Some(cfg) = &conns.tls {
                    match Session::server(cfg) {
                        Ok(session) => conns.slab.set_tls(
                            i,
                            Box::new(PeerTls {
                                session,
                                since: now,
                            }),
                        ),
                        Err(_) => {
                            conns.remove(i);
                            tls_failed(c, Reason::Other);
                            bump(&c.closed, 1);
                        }
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Accepted::Drained,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                record_errno(c, &e);
                bump(&c.fd_exhausted, 1);
                // Out of descriptors is being full too: silent connections get their deadline.
                sh.full.store(true, Ordering::Relaxed);
                if !sh.hint_given.swap(true, Ordering::Relaxed) {
                    let n = sh.fd_limit;
                    let advice = if e.raw_os_error() == Some(libc::ENFILE) {
                        "the whole system is out of file descriptors: raise fs.file-max (tcpkit tune --role server)".to_string()
                    } else {
                        format!("more than {n} connections need --procs or a higher hard limit (tcpkit tune --role server)")
                    };
                    (sh.hint)(&format!(
                        "out of file descriptors (limit {n}; accept: {e}): {advice}"
                    ));
                }
                return Accepted::Pause(Instant::now() + ACCEPT_BACKOFF);
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM)) => {
                // The kernel is short of memory: the same pause, rather than a busy loop.
                record_errno(c, &e);
                bump(&c.accept_errors, 1);
                return Accepted::Pause(Instant::now() + ACCEPT_BACKOFF);
            }
            Err(e) => {
                // ECONNABORTED and friends: that connection is gone, the next may be fine.
                record_errno(c, &e);
                bump(&c.accept_errors, 1);
            }
        }
    }
    Accepted::More
}

/// `write` until done or the socket is full (with TLS: the session's output limit); returns
/// bytes written, or None if the connection failed.
fn write_some(stream: &mut TcpStream, mut tls: Option<&mut Session>, buf: &[u8]) -> Option<usize> {
    let mut done = 0;
    while done < buf.len() {
        let r = match tls.as_deref_mut() {
            Some(t) => t.write(stream, &buf[done..]),
            None => stream.write(&buf[done..]),
        };
        match r {
            Ok(0) => return None,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(done)
}

/// Whether the read that returned `n` of `asked` bytes emptied the socket, so that the next
/// read would only say EAGAIN (edge-triggered: new bytes raise a new event): a short read in
/// clear; over TLS, one that returns a record's plaintext says nothing of the records behind
/// it, and the session says whether it found the socket empty.
fn emptied(tls: Option<&Session>, n: usize, asked: usize) -> bool {
    match tls {
        Some(t) => t.drained(),
        None => n < asked,
    }
}

/// One `read`: Some(n > 0) bytes, Some(0) for nothing now, None for closed or failed.
fn read_some(stream: &mut TcpStream, tls: Option<&mut Session>, buf: &mut [u8]) -> Option<usize> {
    let mut tls = tls;
    loop {
        let r = match tls.as_deref_mut() {
            Some(t) => t.read(stream, buf),
            None => stream.read(buf),
        };
        match r {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Some(0),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

impl Loop<'_> {
    /// Writes pending output (with TLS, the session's records first). False when it could
    /// not all be written (wait for writable).
    fn flush(&self, conn: &mut Conn, mut tls: Option<&mut Session>) -> Result<bool, ()> {
        if let Some(t) = tls.as_deref_mut() {
            if !t.flush(&mut conn.stream).map_err(drop)? {
                return Ok(false);
            }
        }
        let Some(p) = conn.pending.as_mut() else {
            return Ok(true);
        };
        if p.out_pos < p.output.len() {
            let n = write_some(&mut conn.stream, tls, &p.output[p.out_pos..]).ok_or(())?;
            bump(&self.c.bytes_out, n as u64);
            p.out_pos += n;
            if p.out_pos < p.output.len() {
                p.stall(n);
                return Ok(false);
            }
            p.output = Vec::new();
            p.out_pos = 0;
            p.stalled = None;
        }
        conn.release_if_empty();
        Ok(true)
    }

    /// Writes the answers built in `out` now; keeps what the socket has no room for.
    fn send_out(&mut self, conn: &mut Conn, tls: Option<&mut Session>) -> Result<(), ()> {
        let out = std::mem::take(&mut self.out);
        let sent = self.send(conn, tls, &out);
        self.out = out;
        sent
    }

    /// Writes `data` now; keeps what the socket has no room for.
    fn send(&self, conn: &mut Conn, tls: Option<&mut Session>, data: &[u8]) -> Result<(), ()> {
        let n = write_some(&mut conn.stream, tls, data).ok_or(())?;
        bump(&self.c.bytes_out, n as u64);
        if n < data.len() {
            let p = conn.pending_mut();
            p.output.clear();
            p.output.extend_from_slice(&data[n..]);
            p.out_pos = 0;
            p.stall(n);
        }
        Ok(())
    }

    /// Everything a readiness event allows: flush, then read and answer until the socket is
    /// empty (edge-triggered: nothing else will tell us) or the peer stops reading. A read
    /// shorter than asked emptied the socket, so the read that would only say EAGAIN is
    /// skipped (it was one recv in two under load) unless `hup` says a FIN waits behind.
    fn work(&mut self, conn: &mut Conn, tls: Option<&mut PeerTls>, hup: bool) -> Next {
        let session = match tls {
            Some(p) => {
                if p.session.is_handshaking() {
                    match p.session.handshake(&mut conn.stream) {
                        Ok(false) => return Next::Wait,
                        Ok(true) => {
                            let resumed = p.session.info().is_some_and(|i| i.resumed);
                            bump(
                                if resumed {
                                    &self.c.tls_resumed
                                } else {
                                    &self.c.tls_full
                                },
                                1,
                            );
                        }
                        Err(e) => {
                            tls_failed(self.c, Reason::of(&e));
                            return Next::Close;
                        }
                    }
                }
                Some(&mut p.session)
            }
            None => None,
        };
        let r = match self.mode {
            Mode::Echo => self.echo(conn, session, hup),
            Mode::Dns { .. } => self.dns(conn, session, hup),
            Mode::Http { .. } => self.http(conn, session, hup),
        };
        r.unwrap_or(Next::Close)
    }

    fn echo(
        &mut self,
        conn: &mut Conn,
        mut tls: Option<&mut Session>,
        hup: bool,
    ) -> Result<Next, ()> {
        loop {
            if !self.flush(conn, tls.as_deref_mut())? {
                return Ok(Next::Wait);
            }
            // At most max_buf per read, so what is left over never exceeds max_buf.
            let n = read_some(&mut conn.stream, tls.as_deref_mut(), &mut self.scratch).ok_or(())?;
            if n == 0 {
                return Ok(Next::Wait);
            }
            // Any byte is an echo client's first message.
            conn.tag = 0;
            bump(&self.c.bytes_in, n as u64);
            let n = write_some(&mut conn.stream, tls.as_deref_mut(), &self.scratch[..n])
                .map(|w| (w, n));
            let (w, n) = n.ok_or(())?;
            bump(&self.c.bytes_out, w as u64);
            if w < n {
                let p = conn.pending_mut();
                p.output.extend_from_slice(&self.scratch[w..n]);
                p.out_pos = 0;
                p.stall(w);
                return Ok(Next::Wait);
            }
            if emptied(tls.as_deref(), n, self.scratch.len()) && !hup {
                return Ok(Next::Wait);
            }
        }
    }

    /// DNS: input is taken in windows of half the buffer and answers are built up to the
    /// other half, so a connection holds at most about `max_buf` bytes.
    fn dns(
        &mut self,
        conn: &mut Conn,
        mut tls: Option<&mut Session>,
        hup: bool,
    ) -> Result<Next, ()> {
        let Mode::Dns { a, aaaa } = self.mode else {
            return Err(());
        };
        let window = self.max_buf / 2;
        let mut drained = false;
        loop {
            // The socket was emptied and everything read is answered and written (a complete
            // query kept back because the answers filled their half still goes round again).
            if drained
                && !hup
                && conn.pending.as_ref().is_none_or(|p| {
                    p.out_pos >= p.output.len() && dns::tcp_message_len(&p.input).is_none()
                })
            {
                return Ok(Next::Wait);
            }
            if !self.flush(conn, tls.as_deref_mut())? {
                return Ok(Next::Wait);
            }
            // The start of a query left from last time goes first.
            let mut have = 0;
            let mut since = None;
            if let Some(p) = conn.pending.as_mut() {
                since = p.since.take();
                have = p.input.len();
                self.scratch[..have].copy_from_slice(&p.input);
                p.input = Vec::new();
                conn.release_if_empty();
            }
            if dns::tcp_message_len(&self.scratch[..have]).is_none() {
                if have >= window {
                    // A query longer than the buffer cannot be answered within the bound.
                    bump(&self.c.malformed, 1);
                    return Ok(Next::Close);
                }
                let n = match read_some(
                    &mut conn.stream,
                    tls.as_deref_mut(),
                    &mut self.scratch[have..window],
                ) {
                    Some(n) => n,
                    None => return Ok(Next::Close),
                };
                bump(&self.c.bytes_in, n as u64);
                if n == 0 {
                    self.keep_input(conn, have, since);
                    return Ok(Next::Wait);
                }
                drained = emptied(tls.as_deref(), n, window - have);
                have += n;
            }
            // Answer every complete query, in order, while the answers fit their half.
            let mut used = 0;
            self.out.clear();
            let mut bad = false;
            while let Some(len) = dns::tcp_message_len(&self.scratch[used..have]) {
                if !self.out.is_empty() && self.out.len() + len + DNS_ANSWER_GROWTH > window {
                    break;
                }
                let msg = &self.scratch[used + 2..used + len];
                match dns::parse_query(msg) {
                    Ok(q) => {
                        dns::write_tcp_response(&mut self.out, msg, &q, a, aaaa);
                        bump(&self.c.answered, 1);
                    }
                    Err(_) => {
                        bump(&self.c.malformed, 1);
                        bad = true;
                        break;
                    }
                }
                used += len;
            }
            if used > 0 {
                // A whole query is a DNS client's first message.
                conn.tag = 0;
            }
            self.send_out(conn, tls.as_deref_mut())?;
            if bad {
                // The answers before it are sent (as far as the socket takes them); the
                // connection goes, because its byte stream can no longer be trusted.
                return Ok(Next::Close);
            }
            if used < have {
                self.scratch.copy_within(used..have, 0);
                // A query completed: the partial one left is new; otherwise it keeps its age.
                let since = if used > 0 { None } else { since };
                self.keep_input(conn, have - used, since);
            }
        }
    }

    /// HTTP: each read is fed to the connection's HTTP/1.1 or HTTP/2 state (decided by its
    /// first bytes) in windows of half the buffer, and the answers written.
    fn http(
        &mut self,
        conn: &mut Conn,
        mut tls: Option<&mut Session>,
        hup: bool,
    ) -> Result<Next, ()> {
        let Mode::Http { a, aaaa } = self.mode else {
            return Err(());
        };
        let ans = Answers {
            a,
            aaaa,
            window: self.max_buf / 2,
        };
        loop {
            if !self.flush(conn, tls.as_deref_mut())? {
                return Ok(Next::Wait);
            }
            let n = read_some(
                &mut conn.stream,
                tls.as_deref_mut(),
                &mut self.scratch[..ans.window],
            )
            .ok_or(())?;
            if n == 0 {
                return Ok(Next::Wait);
            }
            bump(&self.c.bytes_in, n as u64);
            self.out.clear();
            let data = &self.scratch[..n];
            let p = conn.pending_mut();
            let out = &mut self.out;
            let h = p.http.get_or_insert_with(|| HttpConn::new(data, &ans, out));
            let (answered, malformed, close, partial) = match h.feed(data, out, &ans) {
                Fed::Keep { answered, partial } => (answered, 0, false, partial),
                Fed::Close {
                    answered,
                    malformed,
                } => (answered, malformed, true, false),
            };
            p.since = partial.then(|| p.since.unwrap_or_else(Instant::now));
            bump(&self.c.answered, answered);
            bump(&self.c.malformed, malformed);
            if answered > 0 {
                // A whole request is an HTTP client's first message.
                conn.tag = 0;
            }
            self.send_out(conn, tls.as_deref_mut())?;
            if close {
                return Ok(Next::Close);
            }
            if emptied(tls.as_deref(), n, ans.window) && !hup {
                return Ok(Next::Wait);
            }
        }
    }

    fn keep_input(&mut self, conn: &mut Conn, n: usize, since: Option<Instant>) {
        if n > 0 {
            let p = conn.pending_mut();
            p.input.clear();
            p.input.extend_from_slice(&self.scratch[..n]);
            p.since = Some(since.unwrap_or_else(Instant::now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_reuses_slots() {
        let mut s = Slab::default();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let mk = || Conn {
            stream: TcpStream::from_std(std::net::TcpStream::connect(a).unwrap()),
            tag: 7,
            pending: None,
        };
        let i = s.insert(mk());
        let j = s.insert(mk());
        assert_ne!(i, j);
        assert!(s.remove(i).is_some());
        assert!(s.remove(i).is_none());
        assert_eq!(s.insert(mk()), i);
        assert!(s.get_mut(j).is_some());
        assert!(s.get_mut(99).is_none());
        // A silent connection is known by its slot and tag; one that spoke is not silent.
        assert!(s.is_silent(j, 7));
        assert!(!s.is_silent(j, 8));
        s.get_mut(j).unwrap().tag = 0;
        assert!(!s.is_silent(j, 7));
        assert!(!s.is_silent(99, 7));
    }

    /// The thread's connections kept in step with the FIFO and the process-wide count: the
    /// cap evicts the oldest silent one, never one that spoke; the deadline takes only those
    /// older than it.
    #[test]
    fn conns_evict_the_oldest_silent_and_keep_the_open_count() {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let hint = |_: &str| {};
        let shared = Shared {
            stop: &stop,
            deadline: None,
            fd_limit: 1024,
            max_conns: 3,
            open: std::sync::atomic::AtomicUsize::new(0),
            full: std::sync::atomic::AtomicBool::new(false),
            low_water: 1,
            hint_given: std::sync::atomic::AtomicBool::new(false),
            cap_hint_given: std::sync::atomic::AtomicBool::new(false),
            hint: &hint,
        };
        let t0 = Instant::now();
        let mut conns = Conns {
            slab: Slab::default(),
            silent: Silent::default(),
            tls: None,
            epoch: t0,
            shared: &shared,
        };
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let admit = |conns: &mut Conns<'_>, at: Duration| {
            shared.open.fetch_add(1, Ordering::Relaxed);
            let s = TcpStream::from_std(std::net::TcpStream::connect(a).unwrap());
            conns.admit(s, t0 + at)
        };
        let first = admit(&mut conns, Duration::from_millis(0));
        let second = admit(&mut conns, Duration::from_millis(100));
        let third = admit(&mut conns, Duration::from_millis(200));
        // The first speaks: it is no longer a candidate.
        conns.slab.get_mut(first).unwrap().tag = 0;
        conns.silent.left();
        let now = t0 + Duration::from_millis(1000);
        // Nothing has been silent for 2 s.
        assert!(!conns.close_oldest_silent(now, Some(Duration::from_secs(2))));
        assert_eq!(shared.open.load(Ordering::Relaxed), 3);
        // The oldest silent one goes, for the cap.
        assert!(conns.close_oldest_silent(now, None));
        assert!(conns.slab.get_mut(second).is_none());
        assert!(conns.slab.get_mut(first).is_some());
        assert_eq!(shared.open.load(Ordering::Relaxed), 2);
        // The third closes by itself; its slot is taken by a newcomer that must not be
        // mistaken for it.
        assert!(conns.remove(third).is_some());
        let newer = admit(&mut conns, Duration::from_millis(900));
        assert_eq!(newer, third);
        assert!(conns.close_oldest_silent(now, Some(Duration::from_millis(50))));
        assert!(conns.slab.get_mut(newer).is_none());
        // Only the one that spoke is left, and it is never taken.
        assert!(!conns.close_oldest_silent(now, None));
        assert_eq!(shared.open.load(Ordering::Relaxed), 1);
        assert!(conns.remove(first).is_some());
        assert_eq!(shared.open.load(Ordering::Relaxed), 0);
    }
}
