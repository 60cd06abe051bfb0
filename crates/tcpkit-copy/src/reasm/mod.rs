//! TCP session tracking and exact stream reassembly of captured packets.
//!
//! [`Tracker`] owns every session seen in a capture, keyed by the exact 4-tuple (a hash map
//! compares whole keys, so two connections never share state). Each captured frame goes
//! through [`Tracker::push`]; out come [`Event`]s: a session opened, bytes of one direction
//! became deliverable, a session closed and why.
//!
//! What the events promise:
//! - Each direction's [`Event::Data`] come in sequence order, contiguous, each byte exactly
//!   once, whatever the capture did: retransmissions, overlaps, reordering, duplicates, SACK'd
//!   data, GRO/TSO super-frames, sequence wrap-around at 2^32.
//! - Across directions and sessions, events come in the order their data became deliverable
//!   (capture time), which is how a request/response turn shows.
//! - **First-seen bytes win.** A retransmission that carries different bytes for a range
//!   already delivered or buffered is counted in [`TrackerStats::conflicting_bytes`] and
//!   dropped. Delivered bytes are compared only as far back as
//!   [`TrackerConfig::recheck_bytes`] per direction (they have already left).
//! - **No byte is silently skipped.** A hole (bytes known to exist: later data seen, a FIN,
//!   the peer's ACK beyond what was delivered, a frame cut by the snaplen) that is not filled
//!   within [`TrackerConfig::hole_timeout_ns`] of the last progress ends the session with
//!   [`CloseKind::LostData`] at the hole's sequence number. A session that ends any other way
//!   with a hole left also ends as `LostData`. Bytes of its connection past any seen before
//!   start a new session, joined mid-stream (the connection went on past the hole).
//! - Memory is bounded: out-of-order bytes per direction and in all, and the number of
//!   sessions; over a limit a session is shed ([`CloseKind::Shed`]) or not tracked, and
//!   counted. Nothing grows with the length of a capture.
//!
//! Roles: the sender of a SYN is the client (of a SYN-ACK, the server). A session joined
//! mid-stream (no SYN seen) takes its roles from [`TrackerConfig::server_ports`] (or, when
//! that is empty, the lower port is the server's, as ephemeral ports are high), starts each
//! direction at the first segment seen in it, and opens with `syn_seen: false`.
//!
//! Time is the capture's: `ts_ns` of each frame (never going back: a late timestamp counts as
//! the latest seen). Timeouts are checked for a session when one of its frames arrives and for
//! all sessions by a sweep at most every 1/8 of the shortest timeout, so a timeout fires at
//! most 1/8 late; [`Tracker::tick`] runs that sweep when no frames come.

mod fuzz;
mod half;
#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use tcpkit_wire::tcp::{Flags, Segment, SegmentError};

pub use fuzz::fuzz_reasm;
use half::{Blocks, Delivery, Half};

/// What a [`Tracker`] tracks, and within which limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerConfig {
    /// Server ports. A session is tracked only if its server's port is here; empty means all
    /// ports (and mid-stream the lower port is taken as the server's).
    pub server_ports: Vec<u16>,
    /// Only sessions whose SYN or SYN-ACK was seen (`--only-full`); mid-stream ones are
    /// ignored and counted in [`TrackerStats::untracked_frames`].
    pub only_full: bool,
    /// Out-of-order bytes one direction may buffer before its session is shed.
    pub max_buffered_per_dir: usize,
    /// Out-of-order bytes all sessions together may buffer; the session whose segment goes
    /// over is shed.
    pub max_buffered_total: usize,
    /// Sessions tracked at once (closed ones linger, see `closed_linger_ns`); further new
    /// sessions are not tracked and counted in [`TrackerStats::table_full`].
    pub max_sessions: usize,
    /// A hole not filled for this long ends its session as `LostData`.
    pub hole_timeout_ns: u64,
    /// A session without frames for this long ends as `Idle`.
    pub idle_timeout_ns: u64,
    /// How long a closed session is remembered, so late retransmissions and ACKs are not
    /// taken for a new mid-stream session. One closed on lost data is left as soon as new
    /// bytes of it come: the connection went on, and is joined again mid-stream.
    pub closed_linger_ns: u64,
    /// Delivered bytes kept per direction to compare retransmissions against (0: none).
    pub recheck_bytes: usize,
    /// A hole in the server's direction does not end the session: it is passed over with an
    /// [`Event::Gap`] once the client acknowledged past it (the capture missed bytes the
    /// client got: they will never come again), when it outlives `hole_timeout_ns`, or when
    /// the session ends. For a copy, which replays the client's stream: a lost piece of an
    /// answer must not cost the client's bytes that follow.
    pub skip_server_holes: bool,
}

impl Default for TrackerConfig {
    fn default() -> TrackerConfig {
        TrackerConfig {
            server_ports: Vec::new(),
            only_full: false,
            max_buffered_per_dir: 4 << 20,
            max_buffered_total: 1 << 30,
            max_sessions: 1 << 20,
            hole_timeout_ns: 2_000_000_000,
            idle_timeout_ns: 300_000_000_000,
            closed_linger_ns: 10_000_000_000,
            recheck_bytes: 2048,
            skip_server_holes: false,
        }
    }
}

/// Identifies one session for the life of a [`Tracker`] (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// Direction of a byte stream within a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    ClientToServer,
    ServerToClient,
}

impl Dir {
    fn index(self) -> usize {
        match self {
            Dir::ClientToServer => 0,
            Dir::ServerToClient => 1,
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseKind {
    /// Both directions' FINs delivered, after all their bytes.
    Fin,
    /// A reset, with no hole left behind.
    Rst,
    /// No frames for the idle timeout (or the 4-tuple was reused by a new SYN before an end
    /// was seen), with no hole left behind.
    Idle,
    /// Bytes of `dir` starting at sequence number `at_seq` were never captured.
    LostData { dir: Dir, at_seq: u32 },
    /// Over a buffering limit.
    Shed,
}

/// What [`Tracker::push`] and [`Tracker::tick`] report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Open {
        id: SessionId,
        client: SocketAddr,
        server: SocketAddr,
        /// The session's start was seen (SYN or SYN-ACK); false: joined mid-stream.
        syn_seen: bool,
        ts_ns: u64,
    },
    /// The next bytes of one direction. `bytes` shares 256 KiB blocks with other events:
    /// copy out what you keep for long, or the blocks stay alive with it.
    Data {
        id: SessionId,
        dir: Dir,
        /// Sequence number of the first byte.
        seq: u32,
        /// Stream offset of the first byte (0: first byte after the SYN, or first seen).
        offset: u64,
        bytes: Bytes,
        ts_ns: u64,
    },
    /// `len` bytes of one direction at `seq` were never captured and are passed over (only
    /// with [`TrackerConfig::skip_server_holes`], only in the server's direction); the
    /// direction's next Data starts after them.
    Gap {
        id: SessionId,
        dir: Dir,
        seq: u32,
        offset: u64,
        len: u64,
        ts_ns: u64,
    },
    Close {
        id: SessionId,
        how: CloseKind,
        /// Requests the capture saw in the session, delivered or not: client bytes after a
        /// server turn (or the first, unless joined mid-stream), counted in capture order.
        /// Past a hole ([`CloseKind::LostData`]) it exceeds the requests delivered by those
        /// the capture saw but could not hand over.
        requests_seen: u64,
        ts_ns: u64,
    },
}

/// Counters of a [`Tracker`]; the `*_open`, `buffered_bytes` and `memory_bytes` fields are
/// gauges, the rest only grow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrackerStats {
    pub frames: u64,
    /// Frames that are not TCP/IP, or whose TCP header is cut or malformed.
    pub not_tcp_frames: u64,
    /// TCP in IP fragments (not reassembled).
    pub fragment_frames: u64,
    /// Frames of sessions not tracked: port not a server port, `only_full`, or a RST/FIN for
    /// an unknown session.
    pub untracked_frames: u64,
    /// Frames of a closed session arriving within its linger time.
    pub after_close_frames: u64,
    pub sessions_seen: u64,
    pub sessions_joined_mid_stream: u64,
    pub sessions_open: u64,
    pub closed_fin: u64,
    pub closed_rst: u64,
    pub closed_idle: u64,
    pub closed_lost_data: u64,
    pub closed_shed: u64,
    /// New sessions not tracked because `max_sessions` were.
    pub table_full: u64,
    pub bytes_client_to_server: u64,
    pub bytes_server_to_client: u64,
    /// Bytes received again after they were delivered.
    pub retransmitted_bytes: u64,
    /// Bytes received again while buffered out of order.
    pub overlapping_bytes: u64,
    /// Bytes received again with a different value (first seen won), or past a FIN.
    pub conflicting_bytes: u64,
    /// FINs at a different position than the first FIN of their direction.
    pub conflicting_fins: u64,
    pub out_of_order_segments: u64,
    /// Segments the capture cut short (snaplen): their tail is a hole.
    pub truncated_segments: u64,
    /// Segments more than 2^30 away from their direction's delivery point.
    pub out_of_window_segments: u64,
    /// Buffered bytes dropped when their session ended (always behind a hole).
    pub undelivered_bytes: u64,
    /// Holes in the server's direction passed over ([`TrackerConfig::skip_server_holes`]).
    pub skipped_holes: u64,
    /// Bytes in them.
    pub skipped_bytes: u64,
    pub buffered_bytes: u64,
    /// Sessions table, buffers and retransmission check rings; refreshed at each sweep.
    pub memory_bytes: u64,
}

/// The 4-tuple, lower endpoint first, so both directions find one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key(SocketAddr, SocketAddr);

impl Key {
    fn of(a: SocketAddr, b: SocketAddr) -> Key {
        if a <= b {
            Key(a, b)
        } else {
            Key(b, a)
        }
    }
}

#[derive(Debug)]
struct Session {
    id: SessionId,
    client: SocketAddr,
    server: SocketAddr,
    /// Closed sessions are kept (without buffers) until this time.
    closed_until: Option<u64>,
    /// Closed on lost data: the connection went on past the hole, so new bytes of it start
    /// a session again (joined mid-stream) rather than linger unseen.
    closed_lost: bool,
    last_ts: u64,
    halves: [Half; 2],
    seen: SeenTurns,
}

/// Request starts in capture order, by the rule copy's turns use on delivered bytes (a
/// request starts at the client's first new bytes after the server's; a session joined
/// mid-stream starts counting after the server's first bytes), so that requests lost behind
/// a hole are known by number.
#[derive(Debug, Default)]
struct SeenTurns {
    skipping: bool,
    in_request: bool,
    requests: u64,
}

impl SeenTurns {
    fn new_bytes(&mut self, dir: Dir) {
        match dir {
            Dir::ServerToClient => {
                self.skipping = false;
                self.in_request = false;
            }
            Dir::ClientToServer if !self.skipping && !self.in_request => {
                self.requests += 1;
                self.in_request = true;
            }
            Dir::ClientToServer => {}
        }
    }
}

/// All sessions of a capture; see the module docs.
#[derive(Debug)]
pub struct Tracker {
    cfg: TrackerConfig,
    map: FxHashMap<Key, u32>,
    slots: Vec<Option<Session>>,
    free: Vec<u32>,
    next_id: u64,
    now: u64,
    next_sweep: u64,
    sweep_every: u64,
    blocks: Blocks,
    deliveries: Vec<Delivery>,
    stats: TrackerStats,
}

impl Tracker {
    pub fn new(cfg: TrackerConfig) -> Tracker {
        let shortest = cfg
            .hole_timeout_ns
            .min(cfg.idle_timeout_ns)
            .min(cfg.closed_linger_ns);
        Tracker {
            sweep_every: (shortest / 8).max(1_000_000),
            cfg,
            map: FxHashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            next_id: 1,
            now: 0,
            next_sweep: 0,
            blocks: Blocks::default(),
            deliveries: Vec::new(),
            stats: TrackerStats::default(),
        }
    }

    pub fn stats(&self) -> &TrackerStats {
        &self.stats
    }

    pub fn config(&self) -> &TrackerConfig {
        &self.cfg
    }

    /// Feeds one captured Ethernet frame; appends the events it caused to `out`.
    pub fn push(&mut self, ts_ns: u64, frame: &[u8], out: &mut Vec<Event>) {
        self.now = self.now.max(ts_ns);
        self.stats.frames += 1;
        match Segment::parse(frame) {
            Ok(s) => {
                let payload = frame.get(s.payload.clone()).unwrap_or(&[]);
                self.segment(&s, payload, out);
            }
            Err(SegmentError::Fragment { .. }) => self.stats.fragment_frames += 1,
            Err(_) => self.stats.not_tcp_frames += 1,
        }
        if self.now >= self.next_sweep {
            self.sweep(out);
        }
    }

    /// Advances time to `now_ns` without a frame: expires holes, idle and closed sessions.
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        self.now = self.now.max(now_ns);
        if self.now >= self.next_sweep {
            self.sweep(out);
        }
    }

    /// Ends every open session as if idle (end of an offline capture) and forgets all.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        for i in 0..self.slots.len() {
            self.close(i, CloseKind::Idle, out);
            self.remove(i);
        }
        self.update_memory();
    }

    fn update_memory(&mut self) {
        let slot = std::mem::size_of::<Option<Session>>();
        let entry = std::mem::size_of::<(Key, u32)>() + 1;
        let halves: usize = self
            .slots
            .iter()
            .flatten()
            .map(|s| s.halves[0].memory() + s.halves[1].memory())
            .sum();
        self.stats.memory_bytes = (self.slots.capacity() * slot
            + self.map.capacity() * entry
            + self.free.capacity() * 4
            + self.blocks.capacity()
            + halves) as u64;
    }

    fn segment(&mut self, s: &Segment, payload: &[u8], out: &mut Vec<Event>) {
        let (syn, ack) = (s.flags.has(Flags::SYN), s.flags.has(Flags::ACK));
        let key = Key::of(s.src, s.dst);
        let mut slot = self.map.get(&key).map(|&i| i as usize);
        if let Some(i) = slot {
            let sess = self.slots.get(i).and_then(Option::as_ref);
            let Some(sess) = sess else { return };
            let new_attempt = syn
                && !ack
                && (sess.closed_until.is_some()
                    || s.src != sess.client
                    || sess.halves[0].isn != Some(s.seq));
            if new_attempt {
                // A new connection on this 4-tuple: the old session ended unseen.
                self.close(i, CloseKind::Idle, out);
                self.remove(i);
                slot = None;
            } else if sess.closed_until.is_some() {
                let half = &sess.halves[usize::from(s.src != sess.client)];
                let len = s.payload_len.max(payload.len());
                if sess.closed_lost && half.would_extend(s.seq, len) {
                    // A connection that lost capture data goes on: its later requests are
                    // copied and counted again from its next turn, where lingering would
                    // have ignored them for the whole linger (a keep-alive client at 50
                    // requests/s lost 500 of them, unseen, to one kernel drop).
                    self.remove(i);
                    slot = None;
                } else {
                    self.stats.after_close_frames += 1;
                    return;
                }
            }
        }
        let i = match slot {
            Some(i) => i,
            None => match self.open(s, syn, ack, payload.is_empty(), out) {
                Some(i) => i,
                None => return,
            },
        };
        let now = self.now;
        let Some(sess) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        sess.last_ts = now;
        let dir = if s.src == sess.client {
            Dir::ClientToServer
        } else {
            Dir::ServerToClient
        };
        let (this, peer) = match &mut sess.halves {
            [c, srv] if dir == Dir::ClientToServer => (c, srv),
            [c, srv] => (srv, c),
        };
        let mut data_seq = s.seq;
        if syn {
            if !this.started() || (this.isn.is_none() && this.pristine()) {
                this.anchor_syn(s.seq);
            }
            if ack && !peer.started() {
                // SYN-ACK without the SYN seen: the client's SYN was the ACK's sequence
                // number less one, and a retransmission of it is no new connection.
                peer.anchor_syn(s.ack.wrapping_sub(1));
            }
            data_seq = s.seq.wrapping_add(1);
        } else if !this.started() {
            this.anchor(s.seq);
        }
        if this.extends(data_seq, s.payload_len.max(payload.len())) {
            sess.seen.new_bytes(dir);
        }
        let before = this.buffered;
        self.deliveries.clear();
        this.segment(
            data_seq,
            payload,
            s.payload_len,
            s.flags.has(Flags::FIN),
            now,
            self.cfg.recheck_bytes,
            &mut self.blocks,
            &mut self.stats,
            &mut self.deliveries,
        );
        if ack {
            peer.acked(s.ack, now);
        }
        let grown = this.buffered as i64 - before as i64;
        self.stats.buffered_bytes = (self.stats.buffered_bytes as i64 + grown).max(0) as u64;
        let over = this.buffered > self.cfg.max_buffered_per_dir
            || self.stats.buffered_bytes > self.cfg.max_buffered_total as u64;
        let id = sess.id;
        for d in self.deliveries.drain(..) {
            match dir {
                Dir::ClientToServer => self.stats.bytes_client_to_server += d.bytes.len() as u64,
                Dir::ServerToClient => self.stats.bytes_server_to_client += d.bytes.len() as u64,
            }
            out.push(Event::Data {
                id,
                dir,
                seq: d.seq,
                offset: d.offset,
                bytes: d.bytes,
                ts_ns: now,
            });
        }
        if ack && dir == Dir::ClientToServer && self.cfg.skip_server_holes {
            let limit = sess.halves[1].acked_to();
            self.skip_server(i, limit, out);
        }
        let Some(sess) = self.slots.get(i).and_then(Option::as_ref) else {
            return;
        };
        let both_fin = sess.halves.iter().all(|h| h.fin_done);
        if over {
            self.close(i, CloseKind::Shed, out);
        } else if s.flags.has(Flags::RST) {
            self.close(i, CloseKind::Rst, out);
        } else if both_fin {
            self.close(i, CloseKind::Fin, out);
        } else {
            self.expire_hole(i, out);
        }
    }

    /// Starts a session for a segment with no session; `None` if it is not to be tracked.
    fn open(
        &mut self,
        s: &Segment,
        syn: bool,
        ack: bool,
        empty: bool,
        out: &mut Vec<Event>,
    ) -> Option<usize> {
        let ports = &self.cfg.server_ports;
        let client = if syn {
            let client = if ack { s.dst } else { s.src };
            let server = if ack { s.src } else { s.dst };
            (ports.is_empty() || ports.contains(&server.port())).then_some(client)
        } else if self.cfg.only_full
            || s.flags.has(Flags::RST)
            || (s.flags.has(Flags::FIN) && empty)
        {
            // A session is not joined on its last frames.
            None
        } else if ports.is_empty() {
            Some(if s.src.port() >= s.dst.port() {
                s.src
            } else {
                s.dst
            })
        } else if ports.contains(&s.dst.port()) {
            Some(s.src)
        } else if ports.contains(&s.src.port()) {
            Some(s.dst)
        } else {
            None
        };
        let Some(client) = client else {
            self.stats.untracked_frames += 1;
            return None;
        };
        if self.map.len() >= self.cfg.max_sessions {
            self.stats.table_full += 1;
            return None;
        }
        let server = if client == s.src { s.dst } else { s.src };
        let id = SessionId(self.next_id);
        self.next_id += 1;
        let sess = Session {
            id,
            client,
            server,
            closed_until: None,
            closed_lost: false,
            last_ts: self.now,
            halves: Default::default(),
            seen: SeenTurns {
                skipping: !syn,
                ..SeenTurns::default()
            },
        };
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.slots.get_mut(i as usize) {
                    *slot = Some(sess);
                }
                i as usize
            }
            None => {
                self.slots.push(Some(sess));
                self.slots.len() - 1
            }
        };
        self.map.insert(Key::of(s.src, s.dst), i as u32);
        self.stats.sessions_seen += 1;
        self.stats.sessions_open += 1;
        if !syn {
            self.stats.sessions_joined_mid_stream += 1;
        }
        out.push(Event::Open {
            id,
            client,
            server,
            syn_seen: syn,
            ts_ns: self.now,
        });
        Some(i)
    }

    /// Passes over the server's holes of session `i` up to stream offset `limit`, with a
    /// Gap event for each and Data events for what was buffered behind it.
    fn skip_server(&mut self, i: usize, limit: u64, out: &mut Vec<Event>) {
        let (now, recheck) = (self.now, self.cfg.recheck_bytes);
        let Some(sess) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if sess.closed_until.is_some() {
            return;
        }
        let (id, h) = (sess.id, &mut sess.halves[Dir::ServerToClient.index()]);
        let before = h.buffered;
        loop {
            self.deliveries.clear();
            let Some((seq, offset, len)) = h.skip_hole(limit, now, recheck, &mut self.deliveries)
            else {
                break;
            };
            self.stats.skipped_holes += 1;
            self.stats.skipped_bytes += len;
            out.push(Event::Gap {
                id,
                dir: Dir::ServerToClient,
                seq,
                offset,
                len,
                ts_ns: now,
            });
            for d in self.deliveries.drain(..) {
                self.stats.bytes_server_to_client += d.bytes.len() as u64;
                out.push(Event::Data {
                    id,
                    dir: Dir::ServerToClient,
                    seq: d.seq,
                    offset: d.offset,
                    bytes: d.bytes,
                    ts_ns: now,
                });
            }
        }
        let freed = before.saturating_sub(h.buffered) as u64;
        self.stats.buffered_bytes = self.stats.buffered_bytes.saturating_sub(freed);
    }

    /// Ends session `i` if its hole outlived the timeout (a server's hole is passed over
    /// instead, with `skip_server_holes`).
    fn expire_hole(&mut self, i: usize, out: &mut Vec<Event>) {
        let Some(sess) = self.slots.get(i).and_then(Option::as_ref) else {
            return;
        };
        let late = |h: &Half| {
            h.hole_since
                .is_some_and(|t| self.now.saturating_sub(t) >= self.cfg.hole_timeout_ns)
        };
        if sess.closed_until.is_some() {
            return;
        }
        let [client, server] = &sess.halves;
        let (client, server) = (late(client), late(server));
        if self.cfg.skip_server_holes {
            if server {
                self.skip_server(i, u64::MAX, out);
            }
            if client {
                self.close(i, CloseKind::Idle, out);
            }
        } else if client || server {
            self.close(i, CloseKind::Idle, out);
        }
    }

    /// Closes session `i` (if open) with `how`, or `LostData` if a hole is left, and keeps it
    /// as a closed entry for the linger time.
    fn close(&mut self, i: usize, how: CloseKind, out: &mut Vec<Event>) {
        if self.cfg.skip_server_holes && how != CloseKind::Shed {
            // What the server sent past its holes is delivered before the session ends.
            self.skip_server(i, u64::MAX, out);
        }
        let (now, linger) = (self.now, self.cfg.closed_linger_ns);
        let Some(sess) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if sess.closed_until.is_some() {
            return;
        }
        let hole = [Dir::ClientToServer, Dir::ServerToClient]
            .into_iter()
            .find(|d| sess.halves[d.index()].has_hole());
        let how = match (how, hole) {
            (CloseKind::Shed, _) | (_, None) => how,
            (_, Some(dir)) => CloseKind::LostData {
                dir,
                at_seq: sess.halves[dir.index()].next_seq(),
            },
        };
        for h in &mut sess.halves {
            self.stats.undelivered_bytes += h.undelivered();
            self.stats.buffered_bytes = self.stats.buffered_bytes.saturating_sub(h.buffered as u64);
            h.release();
        }
        sess.closed_until = Some(now.saturating_add(linger));
        sess.closed_lost = matches!(how, CloseKind::LostData { .. });
        let st = &mut self.stats;
        st.sessions_open = st.sessions_open.saturating_sub(1);
        match how {
            CloseKind::Fin => st.closed_fin += 1,
            CloseKind::Rst => st.closed_rst += 1,
            CloseKind::Idle => st.closed_idle += 1,
            CloseKind::LostData { .. } => st.closed_lost_data += 1,
            CloseKind::Shed => st.closed_shed += 1,
        }
        out.push(Event::Close {
            id: sess.id,
            how,
            requests_seen: sess.seen.requests,
            ts_ns: now,
        });
    }

    /// Forgets session `i` entirely (it must be closed).
    fn remove(&mut self, i: usize) {
        if let Some(sess) = self.slots.get_mut(i).and_then(Option::take) {
            self.map.remove(&Key::of(sess.client, sess.server));
            self.free.push(i as u32);
        }
    }

    /// Expires holes, idle sessions and closed sessions past their linger time.
    fn sweep(&mut self, out: &mut Vec<Event>) {
        self.next_sweep = self.now.saturating_add(self.sweep_every);
        for i in 0..self.slots.len() {
            let Some(sess) = self.slots.get(i).and_then(Option::as_ref) else {
                continue;
            };
            match sess.closed_until {
                Some(t) if self.now >= t => self.remove(i),
                Some(_) => {}
                None if self.now.saturating_sub(sess.last_ts) >= self.cfg.idle_timeout_ns => {
                    self.close(i, CloseKind::Idle, out);
                }
                None => self.expire_hole(i, out),
            }
        }
        // Summing the sessions' buffers walks the table, as the sweep does: the gauge is
        // refreshed here rather than per frame.
        self.update_memory();
    }
}
