//! HTTP/2 framing (RFC 9113) for load's client and echo's server, sans-IO: bytes in, events
//! out, frames written into the caller's buffer. No sockets, no timers, no async: the jobs'
//! mio loops read, call [`Endpoint::next`] until it has nothing more, and write what the
//! endpoint appended to their output buffer.
//!
//! What it owns: the connection preface, SETTINGS (and their ACK), HEADERS/CONTINUATION with
//! HPACK (decoding ours, table-driven Huffman, its dynamic table bounded by what we announce;
//! encoding by hand from the static table, never indexing, so the encoder has no state), DATA
//! with flow control both ways (a body waits for window and goes out when WINDOW_UPDATE
//! comes; what we receive is credited back as it is consumed), PING, RST_STREAM, GOAWAY.
//!
//! Every length is checked before anything is allocated: a frame longer than the
//! SETTINGS_MAX_FRAME_SIZE we announced is a FRAME_SIZE_ERROR before its payload is read; a
//! header block (HEADERS plus CONTINUATIONs) is bounded by the header list size we announce;
//! the decoded header list is counted as RFC 9113 counts it (name + value + 32 each) and
//! refused past the same bound; bodies waiting for window are bounded per connection.
//! Protocol errors are connection errors: the endpoint writes a GOAWAY naming the code and
//! returns the error, and the caller closes after flushing it.

pub mod doh;
pub mod hpack;
pub mod huffman;

use rustc_hash::FxHashMap;

/// What a client sends before its first frame (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types.
pub mod kind {
    #![allow(missing_docs, reason = "the frame type names are RFC 9113's")]
    pub const DATA: u8 = 0;
    pub const HEADERS: u8 = 1;
    pub const PRIORITY: u8 = 2;
    pub const RST_STREAM: u8 = 3;
    pub const SETTINGS: u8 = 4;
    pub const PUSH_PROMISE: u8 = 5;
    pub const PING: u8 = 6;
    pub const GOAWAY: u8 = 7;
    pub const WINDOW_UPDATE: u8 = 8;
    pub const CONTINUATION: u8 = 9;
}

/// Frame flags.
pub mod flag {
    #![allow(missing_docs, reason = "the flag names are RFC 9113's")]
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// Error codes (RFC 9113 §7).
pub mod code {
    #![allow(missing_docs, reason = "the error code names are RFC 9113's")]
    pub const NO_ERROR: u32 = 0;
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INTERNAL_ERROR: u32 = 2;
    pub const FLOW_CONTROL_ERROR: u32 = 3;
    pub const STREAM_CLOSED: u32 = 5;
    pub const FRAME_SIZE_ERROR: u32 = 6;
    pub const REFUSED_STREAM: u32 = 7;
    pub const CANCEL: u32 = 8;
    pub const COMPRESSION_ERROR: u32 = 9;
    pub const ENHANCE_YOUR_CALM: u32 = 11;
}

/// The name of an error code as RFC 9113 writes it (`UNKNOWN` past the registry's first 14).
pub fn error_name(code: u32) -> &'static str {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|c| NAMES.get(c))
        .copied()
        .unwrap_or("UNKNOWN")
}

/// The smallest (and default) SETTINGS_MAX_FRAME_SIZE, and the largest RFC 9113 allows.
pub const MIN_MAX_FRAME: u32 = 16_384;
const MAX_MAX_FRAME: u32 = (1 << 24) - 1;
/// The largest flow-control window.
pub const MAX_WINDOW: u32 = (1 << 31) - 1;
/// The window every connection and stream starts with before SETTINGS or WINDOW_UPDATE.
const DEFAULT_WINDOW: u32 = 65_535;

/// A frame's 9-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload length (24 bits).
    pub len: u32,
    /// Frame type ([`kind`]).
    pub kind: u8,
    /// Flags ([`flag`]).
    pub flags: u8,
    /// Stream identifier (31 bits; the reserved bit is dropped).
    pub stream: u32,
}

impl FrameHeader {
    /// Bytes of a frame header.
    pub const LEN: usize = 9;

    /// The header at the front of `b`; None when fewer than 9 bytes.
    pub fn parse(b: &[u8]) -> Option<FrameHeader> {
        let h: &[u8; 9] = b.get(..Self::LEN)?.try_into().ok()?;
        Some(FrameHeader {
            len: u32::from_be_bytes([0, h[0], h[1], h[2]]),
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & MAX_WINDOW,
        })
    }

    /// Appends the header to `out`. `len` must fit 24 bits (callers split at the peer's
    /// max frame size, which does).
    pub fn emit(&self, out: &mut Vec<u8>) {
        let l = self.len.to_be_bytes();
        out.extend_from_slice(&[l[1], l[2], l[3], self.kind, self.flags]);
        out.extend_from_slice(&(self.stream & MAX_WINDOW).to_be_bytes());
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    FrameHeader {
        len: payload.len() as u32,
        kind,
        flags,
        stream,
    }
    .emit(out);
    out.extend_from_slice(payload);
}

/// A connection error: the GOAWAY carrying `code` is already in the output buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 {}: {detail}", error_name(*.code))]
pub struct H2Error {
    /// The error code sent in the GOAWAY (or received in one, see [`Event::GoAway`]).
    pub code: u32,
    /// What was wrong, for the report's first bad answer.
    pub detail: String,
}

/// Which end of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Opens odd streams, sends the preface.
    Client,
    /// Answers them, expects the preface.
    Server,
}

/// What we announce and hold the peer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// SETTINGS_MAX_CONCURRENT_STREAMS we announce (servers refuse streams past it).
    pub max_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE we announce: each stream's receive window.
    pub stream_window: u32,
    /// The connection's receive window, raised from 65,535 by a WINDOW_UPDATE at the start.
    pub conn_window: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE we announce, and the bound of a header block's bytes.
    pub max_header_list: u32,
    /// Bytes of DATA bodies that may wait for the peer's window, per connection.
    pub max_queued: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_streams: 128,
            stream_window: 1 << 20,
            conn_window: 1 << 24,
            max_header_list: 16 << 10,
            max_queued: 1 << 20,
        }
    }
}

/// What the peer announced in its SETTINGS (RFC 9113 defaults until then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSettings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS (unlimited until announced).
    pub max_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub stream_window: u32,
    /// SETTINGS_MAX_FRAME_SIZE: what we may send in one frame.
    pub max_frame: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE (unlimited until announced).
    pub max_header_list: u32,
}

impl Default for PeerSettings {
    fn default() -> PeerSettings {
        PeerSettings {
            max_streams: u32::MAX,
            stream_window: DEFAULT_WINDOW,
            max_frame: MIN_MAX_FRAME,
            max_header_list: u32::MAX,
        }
    }
}

/// What a frame meant to the application. Connection-level frames the endpoint answers itself
/// (SETTINGS ACK, PING ACK, window credit) come out as `Control` so the caller knows to flush.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A header block ended on `stream` (its fields in [`Endpoint::fields`]); `app` is what
    /// [`Endpoint::open`] or [`Endpoint::set_app`] attached to the stream.
    Headers {
        /// Stream id.
        stream: u32,
        /// The application's tag of the stream.
        app: u32,
        /// The peer sent END_STREAM with it: nothing follows on this stream.
        end_stream: bool,
    },
    /// Body bytes on `stream` (padding removed; already credited back to the peer).
    Data {
        /// Stream id.
        stream: u32,
        /// The application's tag of the stream.
        app: u32,
        /// The bytes of this frame.
        data: &'a [u8],
        /// The last of the stream.
        end_stream: bool,
    },
    /// The peer reset `stream`.
    Reset {
        /// Stream id.
        stream: u32,
        /// The application's tag of the stream.
        app: u32,
        /// The error code ([`error_name`]).
        code: u32,
    },
    /// The peer is going away: streams above `last_stream` were not and will not be
    /// processed ([`Endpoint::take_above`] hands their tags back).
    GoAway {
        /// The highest stream the peer processed or may still process.
        last_stream: u32,
        /// Why ([`error_name`]).
        code: u32,
    },
    /// The peer's settings changed ([`Endpoint::peer`]).
    Settings,
    /// A frame the endpoint handled alone (PING, SETTINGS ACK, PRIORITY, window credit, a frame
    /// on a stream already closed); it may have written an answer.
    Control,
}

#[derive(Debug, Clone, Default)]
struct Stream {
    app: u32,
    /// Window left for what we send, and for what the peer sends.
    send_window: i64,
    recv_window: i64,
    /// Body bytes waiting for window, and whether END_STREAM goes with the last of them.
    queued: Vec<u8>,
    queued_end: bool,
    local_done: bool,
    remote_done: bool,
}

/// Where the partial frame buffer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Buffered {
    /// Holds the start of a frame.
    Filling,
    /// Holds a whole frame that was handed out: cleared on the next call.
    Spent,
}

/// One HTTP/2 connection, either end: the frame reader ([`Endpoint::next`]) over the
/// connection's state ([`Core`], reached through `Deref`). Apart so that an event can borrow
/// a frame from the reader's buffer while the state changes.
#[derive(Debug)]
pub struct Endpoint {
    core: Core,
    /// Bytes of the client preface still expected (server).
    preface_left: u8,
    /// The partial frame, and whether it is still being filled.
    partial: Vec<u8>,
    buffered: Buffered,
}

impl std::ops::Deref for Endpoint {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl std::ops::DerefMut for Endpoint {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.core
    }
}

/// The state of one HTTP/2 connection: settings both ways, streams, windows, HPACK.
#[derive(Debug)]
pub struct Core {
    role: Role,
    limits: Limits,
    /// The peer's first frame must be SETTINGS.
    peer_settings_seen: bool,
    peer: PeerSettings,
    dec: hpack::Decoder,
    /// A header block waiting for its CONTINUATIONs: its stream (0: none), END_STREAM.
    block: Vec<u8>,
    block_stream: u32,
    block_end_stream: bool,
    /// The decoded fields of the last block: `fields` holds name then value bytes; `spans`
    /// their lengths. Reused, so a connection allocates them once.
    field_bytes: Vec<u8>,
    field_spans: Vec<(u32, u32)>,
    /// Keep only pseudo-fields ([`Core::pseudo_fields_only`]).
    pseudo_only: bool,
    send_window: i64,
    recv_window: i64,
    /// Received bytes consumed and not yet credited back to the connection window.
    recv_credit: u32,
    streams: FxHashMap<u32, Stream>,
    /// Client: the next stream id to open. Server: the highest stream the client opened.
    next_stream: u32,
    last_peer_stream: u32,
    queued_bytes: usize,
    goaway_received: bool,
    /// Bodies that found no window when sent (counted once each).
    pub window_stalls: u64,
}

impl Endpoint {
    /// A client: call [`Endpoint::start`] to write the preface and SETTINGS.
    pub fn client(limits: Limits) -> Endpoint {
        Endpoint::new(Role::Client, limits)
    }

    /// A server: expects the client preface first.
    pub fn server(limits: Limits) -> Endpoint {
        Endpoint::new(Role::Server, limits)
    }

    fn new(role: Role, limits: Limits) -> Endpoint {
        let mut dec = hpack::Decoder::new();
        dec.bound(hpack::TABLE_SIZE);
        let core = Core {
            role,
            limits,
            peer_settings_seen: false,
            peer: PeerSettings::default(),
            dec,
            block: Vec::new(),
            block_stream: 0,
            block_end_stream: false,
            field_bytes: Vec::new(),
            field_spans: Vec::new(),
            pseudo_only: false,
            send_window: i64::from(DEFAULT_WINDOW),
            recv_window: i64::from(limits.conn_window.max(DEFAULT_WINDOW)),
            recv_credit: 0,
            streams: FxHashMap::default(),
            next_stream: 1,
            last_peer_stream: 0,
            queued_bytes: 0,
            goaway_received: false,
            window_stalls: 0,
        };
        Endpoint {
            core,
            preface_left: if role == Role::Server {
                PREFACE.len() as u8
            } else {
                0
            },
            partial: Vec::new(),
            buffered: Buffered::Filling,
        }
    }

    /// Nothing half-received: no partial frame or preface, no header block waiting for its
    /// CONTINUATION, no stream open (a server's deadline for an unfinished request).
    pub fn quiet(&self) -> bool {
        (self.partial.is_empty() || self.buffered == Buffered::Spent)
            && self.preface_left == 0
            && self.core.block_stream == 0
            && self.core.streams.is_empty()
    }

    /// The next event from `input` (advanced past what was used), writing any answer the
    /// protocol asks for into `out`. `Ok(None)`: `input` is used up (a partial frame is kept
    /// for the next call). On `Err` a GOAWAY is in `out`: flush it and close.
    pub fn next<'s, 'i: 's>(
        &'s mut self,
        input: &mut &'i [u8],
        out: &mut Vec<u8>,
    ) -> Result<Option<Event<'s>>, H2Error> {
        if self.buffered == Buffered::Spent {
            self.partial.clear();
            self.buffered = Buffered::Filling;
        }
        if self.preface_left > 0 {
            let at = PREFACE.len() - usize::from(self.preface_left);
            let n = input.len().min(usize::from(self.preface_left));
            if input[..n] != PREFACE[at..at + n] {
                return Err(self.core.fail(
                    code::PROTOCOL_ERROR,
                    "the connection does not start with the HTTP/2 preface".into(),
                    out,
                ));
            }
            self.preface_left -= n as u8;
            *input = &input[n..];
            if self.preface_left > 0 {
                return Ok(None);
            }
        }
        let max = MIN_MAX_FRAME as usize + FrameHeader::LEN;
        let whole: &'s [u8] = if self.partial.is_empty() {
            let Some(h) = FrameHeader::parse(input) else {
                self.partial.extend_from_slice(input);
                *input = &[];
                return Ok(None);
            };
            let len = FrameHeader::LEN + h.len as usize;
            if len > max {
                return Err(self.core.too_long(h, out));
            }
            if input.len() < len {
                self.partial.reserve_exact(len);
                self.partial.extend_from_slice(input);
                *input = &[];
                return Ok(None);
            }
            let (f, rest) = input.split_at(len);
            *input = rest;
            f
        } else {
            if self.partial.len() < FrameHeader::LEN {
                let n = input.len().min(FrameHeader::LEN - self.partial.len());
                self.partial.extend_from_slice(&input[..n]);
                *input = &input[n..];
            }
            let Some(h) = FrameHeader::parse(&self.partial) else {
                return Ok(None);
            };
            let len = FrameHeader::LEN + h.len as usize;
            if len > max {
                return Err(self.core.too_long(h, out));
            }
            let n = input.len().min(len - self.partial.len());
            self.partial.extend_from_slice(&input[..n]);
            *input = &input[n..];
            if self.partial.len() < len {
                return Ok(None);
            }
            self.buffered = Buffered::Spent;
            &self.partial
        };
        let Some(h) = FrameHeader::parse(whole) else {
            return Ok(None);
        };
        let payload = &whole[FrameHeader::LEN..];
        self.core.frame(h, payload, out).map(Some)
    }
}

impl Core {
    /// Writes what this end says first: the client its preface, both their SETTINGS and the
    /// WINDOW_UPDATE that raises the connection window to [`Limits::conn_window`].
    pub fn start(&mut self, out: &mut Vec<u8>) {
        if self.role == Role::Client {
            out.extend_from_slice(PREFACE);
        }
        let mut s = [0u8; 24];
        let mut n = 0;
        let mut put = |id: u16, v: u32| {
            s[n..n + 2].copy_from_slice(&id.to_be_bytes());
            s[n + 2..n + 6].copy_from_slice(&v.to_be_bytes());
            n += 6;
        };
        if self.role == Role::Client {
            put(2, 0); // ENABLE_PUSH off: we never take a pushed stream
        } else {
            put(3, self.limits.max_streams);
        }
        put(4, self.limits.stream_window.min(MAX_WINDOW));
        put(6, self.limits.max_header_list);
        frame(out, kind::SETTINGS, 0, 0, &s[..n]);
        let raise = self
            .limits
            .conn_window
            .min(MAX_WINDOW)
            .saturating_sub(DEFAULT_WINDOW);
        if raise > 0 {
            frame(out, kind::WINDOW_UPDATE, 0, 0, &raise.to_be_bytes());
        }
    }

    /// What the peer announced.
    pub fn peer(&self) -> PeerSettings {
        self.peer
    }

    /// Streams open now (either half still open, or a body waiting for window).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Whether the peer said GOAWAY: no stream may be opened on this connection any more.
    pub fn goaway_received(&self) -> bool {
        self.goaway_received
    }

    /// Client: whether one more stream may be opened with at most `limit` open at once (and the
    /// peer's own limit, stream ids left, no GOAWAY, room to queue a body).
    pub fn can_open(&self, limit: u32) -> bool {
        let open = self.streams.len() as u64;
        open < u64::from(limit.min(self.peer.max_streams))
            && self.next_stream <= MAX_WINDOW
            && !self.goaway_received
            && self.queued_bytes < self.limits.max_queued
    }

    /// Client: opens the next stream tagged `app` and writes its HEADERS (`block` from
    /// [`hpack`]) and, when `body` is given, its DATA within the windows (the rest waits for
    /// WINDOW_UPDATE). Returns the stream id.
    pub fn open(&mut self, app: u32, block: &[u8], body: Option<&[u8]>, out: &mut Vec<u8>) -> u32 {
        let id = self.next_stream;
        self.next_stream += 2;
        self.streams.insert(
            id,
            Stream {
                app,
                send_window: i64::from(self.peer.stream_window),
                recv_window: i64::from(self.limits.stream_window),
                ..Stream::default()
            },
        );
        self.send_headers(id, block, body.is_none(), out);
        match body {
            Some(b) => self.send_data(id, b, true, out),
            None => self.local_done(id),
        }
        id
    }

    /// Server: the stream's tag, for [`Event`]s that follow.
    pub fn set_app(&mut self, stream: u32, app: u32) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.app = app;
        }
    }

    /// Server: answers `stream` with the header `block` and `body` (empty: no DATA).
    pub fn respond(&mut self, stream: u32, block: &[u8], body: &[u8], out: &mut Vec<u8>) {
        if !self.streams.contains_key(&stream) {
            return;
        }
        self.send_headers(stream, block, body.is_empty(), out);
        if body.is_empty() {
            self.local_done(stream);
        } else {
            self.send_data(stream, body, true, out);
        }
    }

    /// HEADERS, then CONTINUATIONs when the block is over the peer's max frame size.
    fn send_headers(&mut self, stream: u32, block: &[u8], end_stream: bool, out: &mut Vec<u8>) {
        let max = self.peer.max_frame as usize;
        let mut chunks = block.chunks(max);
        let first = chunks.next().unwrap_or_default();
        let more = block.len() > max;
        let flags = if end_stream { flag::END_STREAM } else { 0 }
            | if more { 0 } else { flag::END_HEADERS };
        frame(out, kind::HEADERS, flags, stream, first);
        let mut rest = chunks.peekable();
        while let Some(c) = rest.next() {
            let last = rest.peek().is_none();
            frame(
                out,
                kind::CONTINUATION,
                if last { flag::END_HEADERS } else { 0 },
                stream,
                c,
            );
        }
    }

    /// Sends as much of `data` as the windows allow; the rest waits in the stream for
    /// WINDOW_UPDATE (counted once in `window_stalls`).
    fn send_data(&mut self, stream: u32, data: &[u8], end: bool, out: &mut Vec<u8>) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        let sent = push_data(
            out,
            stream,
            data,
            end,
            &mut self.send_window,
            &mut s.send_window,
            self.peer.max_frame,
        );
        if sent < data.len() {
            self.window_stalls += 1;
            s.queued.extend_from_slice(&data[sent..]);
            s.queued_end = end;
            self.queued_bytes += data.len() - sent;
        } else if end {
            self.local_done(stream);
        }
    }

    /// Sends what waited for window, as far as the windows now go.
    fn flush_queued(&mut self, out: &mut Vec<u8>) {
        if self.queued_bytes == 0 {
            return;
        }
        let mut done = Vec::new();
        for (&id, s) in self.streams.iter_mut() {
            if s.queued.is_empty() {
                continue;
            }
            let sent = push_data(
                out,
                id,
                &s.queued,
                s.queued_end,
                &mut self.send_window,
                &mut s.send_window,
                self.peer.max_frame,
            );
            s.queued.drain(..sent);
            self.queued_bytes -= sent;
            if s.queued.is_empty() {
                s.queued = Vec::new();
                if s.queued_end {
                    done.push(id);
                }
            }
        }
        for id in done {
            self.local_done(id);
        }
    }

    fn local_done(&mut self, stream: u32) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.local_done = true;
            if s.remote_done {
                self.streams.remove(&stream);
            }
        }
    }

    /// Marks the peer's half closed, and drops the stream once both are.
    fn remote_done(&mut self, stream: u32) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.remote_done = true;
            if s.local_done {
                self.streams.remove(&stream);
            }
        }
    }

    /// Resets the stream tagged `app` (a client giving up on an answer), freeing its slot.
    /// Returns whether such a stream was open.
    pub fn cancel(&mut self, app: u32, out: &mut Vec<u8>) -> bool {
        let Some(id) = self
            .streams
            .iter()
            .find(|(_, s)| s.app == app)
            .map(|(&id, _)| id)
        else {
            return false;
        };
        self.reset(id, code::CANCEL, out);
        true
    }

    /// Writes RST_STREAM for `stream` and forgets it.
    pub fn reset(&mut self, stream: u32, code: u32, out: &mut Vec<u8>) {
        frame(out, kind::RST_STREAM, 0, stream, &code.to_be_bytes());
        if let Some(s) = self.streams.remove(&stream) {
            self.queued_bytes -= s.queued.len();
        }
    }

    /// Writes a GOAWAY (the last stream this end took from the peer, `code`).
    pub fn goaway(&mut self, code: u32, out: &mut Vec<u8>) {
        let mut p = [0u8; 8];
        p[..4].copy_from_slice(&self.last_peer_stream.to_be_bytes());
        p[4..].copy_from_slice(&code.to_be_bytes());
        frame(out, kind::GOAWAY, 0, 0, &p);
    }

    /// After a GOAWAY: forgets the streams above `last_stream` (the peer never processed
    /// them) and appends their tags to `tags`.
    pub fn take_above(&mut self, last_stream: u32, tags: &mut Vec<u32>) {
        let before = tags.len();
        for (&id, s) in &self.streams {
            if id > last_stream {
                tags.push(s.app);
            }
        }
        if tags.len() > before {
            self.streams.retain(|&id, _| id <= last_stream);
            self.queued_bytes = self.streams.values().map(|s| s.queued.len()).sum();
        }
    }

    /// The fields of the last header block, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut at = 0usize;
        self.field_spans.iter().map(move |&(n, v)| {
            let (n, v) = (n as usize, v as usize);
            let name = &self.field_bytes[at..at + n];
            let value = &self.field_bytes[at + n..at + n + v];
            at += n + v;
            (name, value)
        })
    }

    /// From now on [`Core::fields`] holds only each block's pseudo-fields (`:status`...):
    /// load reads nothing else, so the other values are not copied. They are still decoded
    /// and counted, so the HPACK table and the header list bound stay exact.
    pub fn pseudo_fields_only(&mut self) {
        self.pseudo_only = true;
    }

    /// The value of the field `name` in the last header block.
    pub fn field(&self, name: &[u8]) -> Option<&[u8]> {
        self.fields().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    fn too_long(&mut self, h: FrameHeader, out: &mut Vec<u8>) -> H2Error {
        self.fail(
            code::FRAME_SIZE_ERROR,
            format!(
                "a frame of {} bytes, over the {MIN_MAX_FRAME} announced",
                h.len
            ),
            out,
        )
    }

    fn fail(&mut self, code: u32, detail: String, out: &mut Vec<u8>) -> H2Error {
        self.goaway(code, out);
        H2Error { code, detail }
    }

    fn frame<'p>(
        &mut self,
        h: FrameHeader,
        p: &'p [u8],
        out: &mut Vec<u8>,
    ) -> Result<Event<'p>, H2Error> {
        if !self.peer_settings_seen && h.kind != kind::SETTINGS {
            return Err(self.fail(
                code::PROTOCOL_ERROR,
                format!("first frame is type {}, not SETTINGS", h.kind),
                out,
            ));
        }
        if self.block_stream != 0 && h.kind != kind::CONTINUATION {
            return Err(self.fail(
                code::PROTOCOL_ERROR,
                format!("frame type {} inside a header block", h.kind),
                out,
            ));
        }
        match h.kind {
            kind::DATA => self.data(h, p, out),
            kind::HEADERS => self.headers(h, p, out),
            kind::CONTINUATION => self.continuation(h, p, out),
            kind::SETTINGS => self.settings(h, p, out),
            kind::PING => {
                if h.stream != 0 || p.len() != 8 {
                    return Err(self.fail(code::FRAME_SIZE_ERROR, "bad PING".into(), out));
                }
                if h.flags & flag::ACK == 0 {
                    frame(out, kind::PING, flag::ACK, 0, p);
                }
                Ok(Event::Control)
            }
            kind::RST_STREAM => {
                let (Ok(c), true) = (<[u8; 4]>::try_from(p), h.stream != 0) else {
                    return Err(self.fail(code::FRAME_SIZE_ERROR, "bad RST_STREAM".into(), out));
                };
                let code = u32::from_be_bytes(c);
                match self.streams.remove(&h.stream) {
                    Some(s) => {
                        self.queued_bytes -= s.queued.len();
                        Ok(Event::Reset {
                            stream: h.stream,
                            app: s.app,
                            code,
                        })
                    }
                    None => Ok(Event::Control),
                }
            }
            kind::GOAWAY => {
                if h.stream != 0 || p.len() < 8 {
                    return Err(self.fail(code::FRAME_SIZE_ERROR, "bad GOAWAY".into(), out));
                }
                self.goaway_received = true;
                Ok(Event::GoAway {
                    last_stream: u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & MAX_WINDOW,
                    code: u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                })
            }
            kind::WINDOW_UPDATE => self.window_update(h, p, out),
            kind::PRIORITY => {
                if p.len() != 5 || h.stream == 0 {
                    return Err(self.fail(code::FRAME_SIZE_ERROR, "bad PRIORITY".into(), out));
                }
                Ok(Event::Control)
            }
            kind::PUSH_PROMISE => Err(self.fail(
                code::PROTOCOL_ERROR,
                "PUSH_PROMISE, with push disabled".into(),
                out,
            )),
            // Unknown types are ignored (RFC 9113 §4.1).
            _ => Ok(Event::Control),
        }
    }

    fn settings(
        &mut self,
        h: FrameHeader,
        p: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Event<'static>, H2Error> {
        if h.stream != 0 {
            return Err(self.fail(code::PROTOCOL_ERROR, "SETTINGS on a stream".into(), out));
        }
        if h.flags & flag::ACK != 0 {
            if !p.is_empty() {
                return Err(self.fail(
                    code::FRAME_SIZE_ERROR,
                    "SETTINGS ACK with a payload".into(),
                    out,
                ));
            }
            return Ok(Event::Control);
        }
        if !p.len().is_multiple_of(6) {
            return Err(self.fail(
                code::FRAME_SIZE_ERROR,
                format!("SETTINGS of {} bytes", p.len()),
                out,
            ));
        }
        self.peer_settings_seen = true;
        for s in p.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match id {
                2 if v > 1 => {
                    return Err(self.fail(code::PROTOCOL_ERROR, format!("ENABLE_PUSH {v}"), out))
                }
                3 => self.peer.max_streams = v,
                4 => {
                    if v > MAX_WINDOW {
                        return Err(self.fail(
                            code::FLOW_CONTROL_ERROR,
                            format!("INITIAL_WINDOW_SIZE {v}"),
                            out,
                        ));
                    }
                    let delta = i64::from(v) - i64::from(self.peer.stream_window);
                    for st in self.streams.values_mut() {
                        st.send_window += delta;
                        if st.send_window > i64::from(MAX_WINDOW) {
                            return Err(H2Error {
                                code: code::FLOW_CONTROL_ERROR,
                                detail: "a stream window over 2^31-1".into(),
                            });
                        }
                    }
                    self.peer.stream_window = v;
                }
                5 => {
                    if !(MIN_MAX_FRAME..=MAX_MAX_FRAME).contains(&v) {
                        return Err(self.fail(
                            code::PROTOCOL_ERROR,
                            format!("MAX_FRAME_SIZE {v}"),
                            out,
                        ));
                    }
                    self.peer.max_frame = v;
                }
                6 => self.peer.max_header_list = v,
                // HEADER_TABLE_SIZE: our encoder never indexes, so any size suits it.
                _ => {}
            }
        }
        frame(out, kind::SETTINGS, flag::ACK, 0, &[]);
        self.flush_queued(out);
        Ok(Event::Settings)
    }

    fn window_update(
        &mut self,
        h: FrameHeader,
        p: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Event<'static>, H2Error> {
        let Ok(b) = <[u8; 4]>::try_from(p) else {
            return Err(self.fail(code::FRAME_SIZE_ERROR, "bad WINDOW_UPDATE".into(), out));
        };
        let inc = i64::from(u32::from_be_bytes(b) & MAX_WINDOW);
        if inc == 0 {
            return Err(self.fail(code::PROTOCOL_ERROR, "WINDOW_UPDATE of 0".into(), out));
        }
        let w = if h.stream == 0 {
            Some(&mut self.send_window)
        } else {
            self.streams.get_mut(&h.stream).map(|s| &mut s.send_window)
        };
        if let Some(w) = w {
            *w += inc;
            if *w > i64::from(MAX_WINDOW) {
                return Err(self.fail(
                    code::FLOW_CONTROL_ERROR,
                    "a window over 2^31-1".into(),
                    out,
                ));
            }
        }
        self.flush_queued(out);
        Ok(Event::Control)
    }

    fn data<'p>(
        &mut self,
        h: FrameHeader,
        p: &'p [u8],
        out: &mut Vec<u8>,
    ) -> Result<Event<'p>, H2Error> {
        if h.stream == 0 {
            return Err(self.fail(code::PROTOCOL_ERROR, "DATA on stream 0".into(), out));
        }
        let Some(body) = unpad(h, p) else {
            return Err(self.fail(
                code::PROTOCOL_ERROR,
                "DATA padding over its length".into(),
                out,
            ));
        };
        // Flow control counts the whole payload, padding included.
        let len = p.len() as u32;
        self.recv_window -= i64::from(len);
        if self.recv_window < 0 {
            return Err(self.fail(
                code::FLOW_CONTROL_ERROR,
                "DATA over the connection window".into(),
                out,
            ));
        }
        self.recv_credit += len;
        let conn_window = self.limits.conn_window.max(DEFAULT_WINDOW);
        if self.recv_credit >= conn_window / 2 {
            frame(
                out,
                kind::WINDOW_UPDATE,
                0,
                0,
                &self.recv_credit.to_be_bytes(),
            );
            self.recv_window += i64::from(self.recv_credit);
            self.recv_credit = 0;
        }
        let end = h.flags & flag::END_STREAM != 0;
        let stream_window = i64::from(self.limits.stream_window);
        let Some(s) = self.streams.get_mut(&h.stream) else {
            if self.is_idle(h.stream) {
                return Err(self.fail(
                    code::PROTOCOL_ERROR,
                    format!("DATA on idle stream {}", h.stream),
                    out,
                ));
            }
            // A stream we reset or finished: its bytes are credited above and dropped.
            return Ok(Event::Control);
        };
        if s.remote_done {
            return Err(self.fail(
                code::STREAM_CLOSED,
                format!("DATA after END_STREAM on stream {}", h.stream),
                out,
            ));
        }
        s.recv_window -= i64::from(len);
        if s.recv_window < 0 {
            return Err(self.fail(
                code::FLOW_CONTROL_ERROR,
                format!("DATA over stream {}'s window", h.stream),
                out,
            ));
        }
        if !end && s.recv_window < stream_window / 2 {
            let inc = (stream_window - s.recv_window) as u32;
            frame(out, kind::WINDOW_UPDATE, 0, h.stream, &inc.to_be_bytes());
            s.recv_window = stream_window;
        }
        let app = s.app;
        if end {
            self.remote_done(h.stream);
        }
        Ok(Event::Data {
            stream: h.stream,
            app,
            data: body,
            end_stream: end,
        })
    }

    /// A stream id the peer could not have used yet.
    fn is_idle(&self, stream: u32) -> bool {
        match self.role {
            Role::Client => stream >= self.next_stream,
            Role::Server => stream > self.last_peer_stream,
        }
    }

    fn headers(
        &mut self,
        h: FrameHeader,
        p: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Event<'static>, H2Error> {
        if h.stream == 0 {
            return Err(self.fail(code::PROTOCOL_ERROR, "HEADERS on stream 0".into(), out));
        }
        let Some(mut frag) = unpad(h, p) else {
            return Err(self.fail(
                code::PROTOCOL_ERROR,
                "HEADERS padding over its length".into(),
                out,
            ));
        };
        if h.flags & flag::PRIORITY != 0 {
            let Some(rest) = frag.get(5..) else {
                return Err(self.fail(code::FRAME_SIZE_ERROR, "HEADERS priority cut".into(), out));
            };
            frag = rest;
        }
        let end_stream = h.flags & flag::END_STREAM != 0;
        if h.flags & flag::END_HEADERS == 0 {
            self.block_stream = h.stream;
            self.block_end_stream = end_stream;
            self.block.clear();
            return self.add_to_block(frag, out).map(|()| Event::Control);
        }
        self.block_done(h.stream, end_stream, frag, out)
    }

    fn add_to_block(&mut self, frag: &[u8], out: &mut Vec<u8>) -> Result<(), H2Error> {
        if self.block.len() + frag.len() > self.limits.max_header_list as usize {
            return Err(self.fail(
                code::ENHANCE_YOUR_CALM,
                format!(
                    "a header block over the {} bytes announced",
                    self.limits.max_header_list
                ),
                out,
            ));
        }
        self.block.extend_from_slice(frag);
        Ok(())
    }

    fn continuation(
        &mut self,
        h: FrameHeader,
        p: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Event<'static>, H2Error> {
        if self.block_stream == 0 || h.stream != self.block_stream {
            return Err(self.fail(
                code::PROTOCOL_ERROR,
                "CONTINUATION without its HEADERS".into(),
                out,
            ));
        }
        self.add_to_block(p, out)?;
        if h.flags & flag::END_HEADERS == 0 {
            return Ok(Event::Control);
        }
        let block = std::mem::take(&mut self.block);
        let (stream, end) = (self.block_stream, self.block_end_stream);
        self.block_stream = 0;
        let r = self.block_done(stream, end, &block, out);
        // The buffer's allocation is kept for the next split block.
        self.block = block;
        self.block.clear();
        r
    }

    /// A whole header block: decoded (always, so the HPACK table stays in step), then
    /// delivered, or refused for its stream.
    fn block_done(
        &mut self,
        stream: u32,
        end_stream: bool,
        block: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Event<'static>, H2Error> {
        self.field_bytes.clear();
        self.field_spans.clear();
        let max = self.limits.max_header_list as usize;
        let (bytes, spans) = (&mut self.field_bytes, &mut self.field_spans);
        let keep_all = !self.pseudo_only;
        let mut listed = 0usize;
        let decoded = self.dec.decode(block, |n, v| {
            listed += n.len() + v.len() + 32;
            if listed <= max && (keep_all || n.first() == Some(&b':')) {
                bytes.extend_from_slice(n);
                bytes.extend_from_slice(v);
                spans.push((n.len() as u32, v.len() as u32));
            }
        });
        if let Err(e) = decoded {
            return Err(self.fail(code::COMPRESSION_ERROR, format!("HPACK: {e}"), out));
        }
        if listed > max {
            return Err(self.fail(
                code::ENHANCE_YOUR_CALM,
                format!("a header list of {listed} bytes, over the {max} announced"),
                out,
            ));
        }
        match self.role {
            Role::Client => {
                let Some(s) = self.streams.get(&stream) else {
                    if self.is_idle(stream) {
                        return Err(self.fail(
                            code::PROTOCOL_ERROR,
                            format!("HEADERS on idle stream {stream}"),
                            out,
                        ));
                    }
                    return Ok(Event::Control);
                };
                let app = s.app;
                if end_stream {
                    self.remote_done(stream);
                }
                Ok(Event::Headers {
                    stream,
                    app,
                    end_stream,
                })
            }
            Role::Server => {
                if let Some(s) = self.streams.get(&stream) {
                    // Trailers.
                    let app = s.app;
                    if end_stream {
                        self.remote_done(stream);
                    }
                    return Ok(Event::Headers {
                        stream,
                        app,
                        end_stream,
                    });
                }
                if stream.is_multiple_of(2) || stream <= self.last_peer_stream {
                    return Err(self.fail(
                        code::PROTOCOL_ERROR,
                        format!("HEADERS opening stream {stream}"),
                        out,
                    ));
                }
                self.last_peer_stream = stream;
                if self.streams.len() >= self.limits.max_streams as usize {
                    frame(
                        out,
                        kind::RST_STREAM,
                        0,
                        stream,
                        &code::REFUSED_STREAM.to_be_bytes(),
                    );
                    return Ok(Event::Control);
                }
                self.streams.insert(
                    stream,
                    Stream {
                        send_window: i64::from(self.peer.stream_window),
                        recv_window: i64::from(self.limits.stream_window),
                        remote_done: end_stream,
                        ..Stream::default()
                    },
                );
                Ok(Event::Headers {
                    stream,
                    app: 0,
                    end_stream,
                })
            }
        }
    }
}

/// DATA frames for `data` within both windows, each at most `max_frame`; returns the bytes
/// sent. END_STREAM goes on the last frame only when all of `data` went.
fn push_data(
    out: &mut Vec<u8>,
    stream: u32,
    data: &[u8],
    end: bool,
    conn: &mut i64,
    win: &mut i64,
    max_frame: u32,
) -> usize {
    let room = (*conn).min(*win).max(0) as usize;
    let n = data.len().min(room);
    let mut sent = 0;
    loop {
        let take = (n - sent).min(max_frame as usize);
        let last = sent + take == data.len();
        if take == 0 && !(last && end && data.len() == sent) {
            break;
        }
        let flags = if last && end { flag::END_STREAM } else { 0 };
        frame(out, kind::DATA, flags, stream, &data[sent..sent + take]);
        sent += take;
        if last || sent == n {
            break;
        }
    }
    *conn -= sent as i64;
    *win -= sent as i64;
    sent
}

/// The payload of a frame that may be PADDED, without its padding; None if the padding
/// claims more than the payload.
fn unpad(h: FrameHeader, p: &[u8]) -> Option<&[u8]> {
    if h.flags & flag::PADDED == 0 {
        return Some(p);
    }
    let (&pad, rest) = p.split_first()?;
    rest.len().checked_sub(usize::from(pad)).map(|n| &rest[..n])
}

/// Body of the `h2` fuzz target: byte 0 picks the role and where the rest is cut in two; the
/// rest is what the peer sent. Nothing may panic, what the endpoint writes must be whole
/// frames, and the events must be the same whether the bytes come in one piece or in two.
pub fn fuzz_h2(data: &[u8]) {
    let [sel, rest @ ..] = data else {
        return;
    };
    let server = sel & 0x80 != 0;
    let cut = usize::from(sel & 0x7f).min(rest.len());
    let run = |parts: &[&[u8]]| {
        let limits = Limits {
            max_header_list: 4096,
            max_queued: 4096,
            ..Limits::default()
        };
        let mut ep = if server {
            Endpoint::server(limits)
        } else {
            Endpoint::client(limits)
        };
        let mut out = Vec::new();
        ep.start(&mut out);
        if !server {
            // Two streams in flight, one with a body that may wait for window.
            let block = hpack::request_block("GET", "http", "h", "/", &[]);
            ep.open(1, &block, None, &mut out);
            ep.open(2, &block, Some(&[7u8; 100]), &mut out);
        }
        let mut seen = Vec::new();
        'parts: for part in parts {
            let mut input: &[u8] = part;
            loop {
                match ep.next(&mut input, &mut out) {
                    Ok(Some(ev)) => {
                        let line = format!("{ev:?}");
                        if let Event::Headers { stream, .. } = ev {
                            let fields: Vec<_> =
                                ep.fields().map(|(n, v)| (n.len(), v.len())).collect();
                            seen.push(format!("{line} {fields:?}"));
                            if server {
                                ep.respond(
                                    stream,
                                    &hpack::status_block(200, None, 5),
                                    b"hello",
                                    &mut out,
                                );
                            }
                        } else {
                            seen.push(line);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        seen.push(format!("error {}", e.code));
                        break 'parts;
                    }
                }
            }
        }
        // What we wrote parses back as whole frames.
        let mut w: &[u8] = &out;
        if !server {
            w = &w[PREFACE.len()..];
        }
        while let Some(h) = FrameHeader::parse(w) {
            let len = FrameHeader::LEN + h.len as usize;
            assert!(w.len() >= len, "a frame cut short in our output");
            w = &w[len..];
        }
        assert!(w.is_empty(), "bytes after our last frame");
        seen
    };
    let whole = run(&[rest]);
    let split = run(&[&rest[..cut], &rest[cut..]]);
    // Data events differ in how they are cut; the rest must agree.
    let keep = |v: Vec<String>| -> Vec<String> {
        v.into_iter().filter(|l| !l.starts_with("Data")).collect()
    };
    assert_eq!(keep(whole), keep(split), "cut at {cut}");
}

#[cfg(test)]
mod tests;
