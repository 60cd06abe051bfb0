//! `--tls-keylog`: the layer between the reassembler and the session front that turns each
//! TLS session's ciphertext events into its plaintext events, so the front (turns, `--diff`,
//! both transports) copies plaintext as it copies clear TCP.
//!
//! A session is opened toward the front only once one of its records authenticated with the
//! key log's secrets: a session never reaches the target as ciphertext, and one that cannot be
//! decrypted is never copied at all, but counted by reason in the report's `tls` object. A
//! session whose secret is not in the key log yet (a live client appends it while copy runs)
//! waits with its events held, for at most [`KEY_WAIT_NS`] and [`PENDING_PER_SESSION`] bytes
//! (all waiting sessions together: an eighth of `--max-memory`); then it counts `no_secret`.
//! Plaintext offsets and sequence numbers are the plaintext stream's; the request count a
//! session closes with is its plaintext request turns.

mod file;
mod probe;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use mio::{Events, Registry};
use rustc_hash::FxHashMap;
use tcpkit_pace::now_ns;
use tcpkit_tls::decrypt::{Conn, KeyLog, Side, Status, Stop};

use crate::config::{CopyConfig, CopyCounters};
use crate::feed::Consumer;
use crate::reasm::{CloseKind, Dir, Event, SessionId, TrackerConfig};
use crate::report::{CopyReport, KeylogStats, TlsStats};
use file::KeyLogFile;
use probe::ProbeKeys;

/// Where the sessions' secrets come from.
#[derive(Debug)]
pub(crate) enum Keys {
    /// `--tls-keylog`: an NSS key log file, read as it grows.
    File(KeyLogFile),
    /// `--tls-uprobe`: the secrets the server's TLS library held at each handshake's end.
    Probes(Box<ProbeKeys>),
}

impl Keys {
    /// `--tls-keylog FILE`.
    pub(crate) fn file(path: &Path) -> Keys {
        Keys::File(KeyLogFile::new(path))
    }

    /// `--tls-uprobe`: the secrets probes, attached.
    pub(crate) fn probes(p: tcpkit_tlsprobe::SecretProbes) -> Keys {
        Keys::Probes(Box::new(ProbeKeys::new(p)))
    }

    fn poll(&mut self) -> bool {
        match self {
            Keys::File(f) => f.poll(),
            Keys::Probes(p) => p.poll(),
        }
    }

    fn log(&self) -> &KeyLog {
        match self {
            Keys::File(f) => &f.log,
            Keys::Probes(p) => &p.log,
        }
    }

    /// Probes only: their handshake on this connection was seen.
    fn saw(&self, client: SocketAddr, server: SocketAddr) -> bool {
        match self {
            Keys::File(_) => false,
            Keys::Probes(p) => p.saw(client, server),
        }
    }
}

/// Why a session the probes saw complete its handshake has no secret: the client random they
/// read is not its ClientHello's.
pub(crate) const LAYOUT_MISMATCH: &str = "probe_layout_mismatch";

/// How long a session waits for its secret in the key log.
pub(crate) const KEY_WAIT_NS: u64 = 3_000_000_000;
/// Captured bytes a session waiting for its secret may hold.
pub(crate) const PENDING_PER_SESSION: usize = 1 << 20;
/// How often the key log is read again while a session waits for it.
const POLL_NS: u64 = 10_000_000;

/// A session's opening, held until it is known to decrypt.
#[derive(Debug)]
struct Opening {
    client: std::net::SocketAddr,
    server: std::net::SocketAddr,
    syn_seen: bool,
    ts_ns: u64,
}

#[derive(Debug)]
struct Sess {
    conn: Conn,
    opening: Opening,
    opened: bool,
    /// Counted in the report (decrypted or a reason): said once.
    counted: bool,
    /// Ended by a reason: its further events are dropped.
    dead: bool,
    /// Waiting for a secret: since when (wall clock), and the capture time and direction of
    /// the bytes that wait; its later events held.
    waiting: Option<(u64, u64, Dir)>,
    held: VecDeque<Event>,
    held_bytes: usize,
    /// Plaintext offsets of each direction.
    off: [u64; 2],
    /// The capture lost server bytes: the server's records can no longer be followed.
    server_lost: bool,
    last: Option<Side>,
    requests: u64,
}

#[derive(Debug)]
struct State {
    keylog: Keys,
    sessions: FxHashMap<SessionId, Sess>,
    stats: TlsStats,
    held_bytes: usize,
    max_held: usize,
    last_poll: u64,
    /// The sessions that may be waiting for a secret (some may have stopped since: they are
    /// dropped from it at the next retry), so a turn of the loop never walks every session.
    waiting: Vec<SessionId>,
    /// Key log secrets when the waiting sessions were last tried.
    tried_at_secrets: u64,
    input: Vec<Event>,
    chunks: Vec<(Side, Bytes)>,
}

/// A copy mode with the TLS layer in front of it.
pub(crate) struct Layer<'a, C> {
    inner: &'a mut C,
    st: State,
}

fn dir_side(dir: Dir) -> Side {
    match dir {
        Dir::ClientToServer => Side::Client,
        Dir::ServerToClient => Side::Server,
    }
}

fn side_dir(side: Side) -> Dir {
    match side {
        Side::Client => Dir::ClientToServer,
        Side::Server => Dir::ServerToClient,
    }
}

fn event_bytes(ev: &Event) -> usize {
    match ev {
        Event::Data { bytes, .. } => bytes.len(),
        _ => 0,
    }
}

impl<'a, C: Consumer> Layer<'a, C> {
    pub(crate) fn new(inner: &'a mut C, keylog: Keys) -> Layer<'a, C> {
        let max_held = (inner.cfg().max_memory / 8).max(PENDING_PER_SESSION);
        Layer {
            inner,
            st: State::new(keylog, max_held),
        }
    }

    /// The input ended: the key log is read a last time, the sessions still waiting get
    /// their secret or count `no_secret`, and the report gets the `tls` object.
    pub(crate) fn finish(mut self) {
        let mut out = Vec::new();
        self.st.keylog.poll();
        self.st.retry_waiting(u64::MAX, true, &mut out);
        self.inner.on_events(&mut out, 0);
        let st = &mut self.st;
        match &st.keylog {
            Keys::File(f) => {
                let k = &f.log;
                st.stats.keylog = Some(KeylogStats {
                    lines: k.lines,
                    bad_lines: k.bad_lines,
                    secrets: k.secrets,
                });
            }
            Keys::Probes(p) => {
                st.stats.source = "uprobe".into();
                st.stats.uprobe = Some(p.stats());
            }
        }
        self.inner.report().tls = Some(std::mem::take(&mut st.stats));
    }
}

impl State {
    fn new(mut keylog: Keys, max_held: usize) -> State {
        let mut stats = TlsStats {
            source: "keylog".into(),
            ..TlsStats::default()
        };
        for v in ["TLSv1.2", "TLSv1.3"] {
            stats.versions.insert(v.into(), 0);
        }
        keylog.poll();
        State {
            keylog,
            sessions: FxHashMap::default(),
            stats,
            held_bytes: 0,
            max_held,
            last_poll: 0,
            tried_at_secrets: 0,
            waiting: Vec::new(),
            input: Vec::new(),
            chunks: Vec::new(),
        }
    }

    fn count(&mut self, stop: &Stop) {
        let s = &mut self.stats.sessions;
        match stop {
            Stop::NotTls => s.not_tls += 1,
            Stop::Unsupported(name) => *s.unsupported.entry(name.clone()).or_insert(0) += 1,
            Stop::Failed(_) => s.failed += 1,
        }
    }

    fn unsupported(&mut self, why: &str) {
        *self
            .stats
            .sessions
            .unsupported
            .entry(why.into())
            .or_insert(0) += 1;
    }

    /// The input's events in, the front's events out.
    fn process(&mut self, evs: &mut Vec<Event>, now: u64) {
        let mut input = std::mem::take(&mut self.input);
        std::mem::swap(&mut input, evs);
        for ev in input.drain(..) {
            self.event(ev, now, evs);
        }
        self.input = input;
        self.tick(now, evs);
    }

    /// The waiting sessions: the key log read again (at most every POLL_NS), tried again when
    /// it brought secrets, given up past their wait.
    fn tick(&mut self, now: u64, out: &mut Vec<Event>) {
        if self.waiting.is_empty() {
            // The probes' ring is drained all the same: its records are each handshake's,
            // and a ring left full loses the next ones.
            if matches!(self.keylog, Keys::Probes(_)) && now >= self.last_poll + POLL_NS {
                self.last_poll = now;
                self.keylog.poll();
            }
            return;
        }
        if now >= self.last_poll + POLL_NS {
            self.last_poll = now;
            self.keylog.poll();
        }
        self.retry_waiting(now, false, out);
    }

    fn retry_waiting(&mut self, now: u64, last: bool, out: &mut Vec<Event>) {
        let fresh = self.keylog.log().secrets != self.tried_at_secrets;
        self.tried_at_secrets = self.keylog.log().secrets;
        let mut ids = std::mem::take(&mut self.waiting);
        ids.retain(|id| self.sessions.get(id).is_some_and(|s| s.waiting.is_some()));
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            if fresh {
                self.resume(id, now, out);
            }
            let Some(s) = self.sessions.get_mut(&id) else {
                continue;
            };
            let Some((since, _, _)) = s.waiting else {
                continue;
            };
            let o = &s.opening;
            if self.keylog.saw(o.client, o.server) {
                // The probes read this connection's handshake, yet no secret fits it.
                self.give_up(id, Some(&Stop::Unsupported(LAYOUT_MISMATCH.into())));
            } else if last || now.saturating_sub(since) > KEY_WAIT_NS {
                self.give_up(id, None);
            } else {
                self.waiting.push(id);
            }
        }
    }

    /// A waiting session tried again with the key log as it is now.
    fn resume(&mut self, id: SessionId, now: u64, out: &mut Vec<Event>) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let mut chunks = std::mem::take(&mut self.chunks);
        let r = s
            .conn
            .push(Side::Client, &[], self.keylog.log(), &mut |side, p| {
                chunks.push((side, Bytes::copy_from_slice(p)));
            });
        self.chunks = chunks;
        if r == Ok(Status::NeedSecret) {
            return;
        }
        let Some((_, ts_ns, dir)) = s.waiting.take() else {
            return;
        };
        self.after_push(id, r, dir, ts_ns, out);
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let held = std::mem::take(&mut s.held);
        self.held_bytes -= std::mem::take(&mut s.held_bytes);
        for ev in held {
            self.event(ev, now, out);
        }
    }

    /// Gives a session up: counted by `why` (None: no secret), its held events dropped, and
    /// the front told when it had been opened.
    fn give_up(&mut self, id: SessionId, why: Option<&Stop>) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let closed = s.held.iter().any(|e| matches!(e, Event::Close { .. }));
        self.held_bytes -= std::mem::take(&mut s.held_bytes);
        s.held.clear();
        s.waiting = None;
        s.dead = true;
        let counted = std::mem::replace(&mut s.counted, true);
        match why {
            None if !counted => self.stats.sessions.no_secret += 1,
            // A session decrypted at first whose later record failed counts in both.
            Some(stop @ Stop::Failed(_)) => self.count(stop),
            Some(stop) if !counted => self.count(stop),
            _ => {}
        }
        if closed {
            self.sessions.remove(&id);
        }
    }

    fn event(&mut self, ev: Event, now: u64, out: &mut Vec<Event>) {
        let id = match &ev {
            Event::Open { id, .. }
            | Event::Data { id, .. }
            | Event::Gap { id, .. }
            | Event::Close { id, .. } => *id,
        };
        if let Event::Open {
            client,
            server,
            syn_seen,
            ts_ns,
            ..
        } = ev
        {
            if self.sessions.contains_key(&id) {
                // A new input loop's tracker numbers its sessions again.
                self.end(id, CloseKind::Idle, ts_ns, out);
            }
            let mut s = Sess {
                conn: Conn::new(),
                opening: Opening {
                    client,
                    server,
                    syn_seen,
                    ts_ns,
                },
                opened: false,
                counted: false,
                dead: false,
                waiting: None,
                held: VecDeque::new(),
                held_bytes: 0,
                off: [0; 2],
                server_lost: false,
                last: None,
                requests: 0,
            };
            if !syn_seen {
                // The handshake is the key to everything after it.
                s.dead = true;
                s.counted = true;
                self.unsupported("joined mid-stream");
            }
            self.sessions.insert(id, s);
            return;
        }
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.dead {
            if matches!(ev, Event::Close { .. }) {
                self.sessions.remove(&id);
            }
            return;
        }
        if s.waiting.is_some() {
            let n = event_bytes(&ev);
            if s.held_bytes + n > PENDING_PER_SESSION || self.held_bytes + n > self.max_held {
                s.held.push_back(ev);
                self.give_up(id, None);
                return;
            }
            // Out of the reassembler's shared blocks: a wait must not pin them.
            let ev = match ev {
                Event::Data {
                    id,
                    dir,
                    seq,
                    offset,
                    bytes,
                    ts_ns,
                } => Event::Data {
                    id,
                    dir,
                    seq,
                    offset,
                    bytes: Bytes::copy_from_slice(&bytes),
                    ts_ns,
                },
                other => other,
            };
            s.held_bytes += n;
            self.held_bytes += n;
            s.held.push_back(ev);
            return;
        }
        match ev {
            Event::Open { .. } => {}
            Event::Data {
                dir, bytes, ts_ns, ..
            } => {
                if dir == Dir::ServerToClient && s.server_lost {
                    let len = bytes.len() as u64;
                    emit_gap(s, id, len, ts_ns, out);
                    return;
                }
                let mut chunks = std::mem::take(&mut self.chunks);
                let r = s
                    .conn
                    .push(dir_side(dir), &bytes, self.keylog.log(), &mut |side, p| {
                        chunks.push((side, Bytes::copy_from_slice(p)));
                    });
                self.chunks = chunks;
                if r == Ok(Status::NeedSecret) {
                    s.waiting = Some((now, ts_ns, dir));
                    self.waiting.push(id);
                    if now >= self.last_poll + POLL_NS {
                        self.last_poll = now;
                        self.keylog.poll();
                        self.tried_at_secrets = 0;
                    }
                }
                self.after_push(id, r, dir, ts_ns, out);
            }
            Event::Gap {
                dir, len, ts_ns, ..
            } => {
                if !s.opened || dir == Dir::ClientToServer {
                    // The handshake (or the client's records) lost: nothing can follow.
                    self.give_up(id, Some(&Stop::Failed("capture_lost_handshake")));
                    return;
                }
                s.server_lost = true;
                emit_gap(s, id, len, ts_ns, out);
            }
            Event::Close { how, ts_ns, .. } => self.end(id, how, ts_ns, out),
        }
    }

    /// After a push: the session opened toward the front when it first authenticated, its
    /// plaintext out as Data, and a stop counted.
    fn after_push(
        &mut self,
        id: SessionId,
        r: Result<Status, Stop>,
        dir: Dir,
        ts_ns: u64,
        out: &mut Vec<Event>,
    ) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if !s.opened && s.conn.authenticated() {
            s.opened = true;
            s.counted = true;
            let o = &s.opening;
            out.push(Event::Open {
                id,
                client: o.client,
                server: o.server,
                syn_seen: o.syn_seen,
                ts_ns: o.ts_ns,
            });
            let st = &mut self.stats;
            st.sessions.decrypted += 1;
            if let Some(suite) = s.conn.suite() {
                *st.versions.entry(suite.version.name().into()).or_insert(0) += 1;
                *st.ciphers.entry(suite.name.into()).or_insert(0) += 1;
            }
        }
        for (side, bytes) in self.chunks.drain(..) {
            if bytes.is_empty() || (side == Side::Server && s.server_lost) {
                continue;
            }
            let d = side_dir(side);
            let off = &mut s.off[d_index(d)];
            if side == Side::Client && s.last != Some(Side::Client) {
                s.requests += 1;
            }
            s.last = Some(side);
            let len = bytes.len() as u64;
            out.push(Event::Data {
                id,
                dir: d,
                seq: *off as u32,
                offset: *off,
                bytes,
                ts_ns,
            });
            *off += len;
        }
        if let Err(stop) = r {
            let opened = s.opened;
            let at = s.off[d_index(dir)];
            self.give_up(id, Some(&stop));
            if opened {
                // The copy has begun: it ends where the plaintext could no longer follow.
                out.push(Event::Close {
                    id,
                    how: CloseKind::LostData {
                        dir,
                        at_seq: at as u32,
                    },
                    requests_seen: self.sessions.get(&id).map_or(0, |s| s.requests),
                    ts_ns,
                });
            }
        }
    }

    /// The session closed in the capture.
    fn end(&mut self, id: SessionId, how: CloseKind, ts_ns: u64, out: &mut Vec<Event>) {
        let Some(s) = self.sessions.remove(&id) else {
            return;
        };
        if s.opened {
            // A hole's place is said in the plaintext's numbering.
            let how = match how {
                CloseKind::LostData { dir, .. } => CloseKind::LostData {
                    dir,
                    at_seq: s.off[d_index(dir)] as u32,
                },
                other => other,
            };
            out.push(Event::Close {
                id,
                how,
                requests_seen: s.requests,
                ts_ns,
            });
            return;
        }
        if !s.counted {
            if s.conn.hello_seen() {
                self.unsupported("incomplete handshake");
            } else {
                self.stats.sessions.not_tls += 1;
            }
        }
    }
}

fn d_index(d: Dir) -> usize {
    match d {
        Dir::ClientToServer => 0,
        Dir::ServerToClient => 1,
    }
}

fn emit_gap(s: &mut Sess, id: SessionId, len: u64, ts_ns: u64, out: &mut Vec<Event>) {
    let off = &mut s.off[1];
    out.push(Event::Gap {
        id,
        dir: Dir::ServerToClient,
        seq: *off as u32,
        offset: *off,
        len,
        ts_ns,
    });
    *off += len;
}

impl<C: Consumer> Consumer for Layer<'_, C> {
    type Error = C::Error;
    const LIVE_WAIT: Duration = C::LIVE_WAIT;

    fn cfg(&self) -> &CopyConfig {
        self.inner.cfg()
    }
    fn tracker_config(&self) -> TrackerConfig {
        self.inner.tracker_config()
    }
    fn registry(&self) -> &Registry {
        self.inner.registry()
    }
    fn report(&mut self) -> &mut CopyReport {
        self.inner.report()
    }
    fn frame(&mut self, frame: &[u8]) {
        self.inner.frame(frame);
    }
    fn on_events(&mut self, evs: &mut Vec<Event>, tracker_mem: u64) {
        self.st.process(evs, now_ns());
        let held = self.st.held_bytes as u64;
        self.inner.on_events(evs, tracker_mem + held);
    }
    // The front sees only what on_events hands it: these are its own, reached through it.
    fn open_session(
        &mut self,
        id: SessionId,
        client: std::net::SocketAddr,
        server: std::net::SocketAddr,
        syn_seen: bool,
        now: u64,
    ) {
        self.inner.open_session(id, client, server, syn_seen, now);
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
        self.inner
            .session_data(id, dir, bytes, ts, now, tracker_mem);
    }
    fn session_gap(&mut self, id: SessionId, dir: Dir, len: u64, ts: u64) {
        self.inner.session_gap(id, dir, len, ts);
    }
    fn close_session(&mut self, id: SessionId, how: CloseKind, requests_seen: u64, now: u64) {
        self.inner.close_session(id, how, requests_seen, now);
    }
    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), Self::Error> {
        let mut out = Vec::new();
        self.st.tick(now_ns(), &mut out);
        if !out.is_empty() {
            self.inner.on_events(&mut out, self.st.held_bytes as u64);
        }
        let wait = if !self.st.waiting.is_empty() {
            max_wait.min(Duration::from_nanos(POLL_NS))
        } else {
            max_wait
        };
        self.inner.step(events, wait)
    }
    fn publish(&mut self, live: &CopyCounters) {
        self.inner.publish(live);
    }
}
