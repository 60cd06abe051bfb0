//! mpcat's wire format: every connection of a session is a stream of frames,
//! `type: u8, body length: u32 (big endian), body`.
//!
//! The sender opens each connection with [`Frame::Hello`] (magic, version, the session's
//! random 128-bit token, this connection's stream index, the stream count, the chunk size);
//! the receiver answers [`Frame::Welcome`] (its window) or [`Frame::Refuse`] (why) and closes.
//! Then the sender sends [`Frame::Data`] (the byte offset of the chunk in the whole stream,
//! its length, its bytes) on whichever connection has room, and once its input ends one
//! [`Frame::End`] (the total length and the hash of the whole stream, [`StreamHasher`](crate::StreamHasher)). The receiver
//! sends [`Frame::Ack`] back: every byte below `acked` is written out, and the sender may send
//! bytes up to `limit` (the credit: the receiver holds at most its window). When every byte is
//! written and the hash checked it sends [`Frame::Done`] with the verdict.
//!
//! Duplex: the connecting side also opens one connection whose Hello carries the stream
//! index [`REVERSE_STREAM`]; on it the roles turn round: the listener sends its own input as
//! Data frames (its own sequence space from 0) and one End, the connecting side answers with
//! Acks (credit) and the Done verdict, and may send [`Frame::Stop`] to ask the listener to end
//! its stream with what it has sent so far (see [`crate::duplex`]).
//!
//! Either side that fails mid-session (Ctrl-C, a full disk, a bad input) sends
//! [`Frame::Abort`] with its reason on every connection, after the frame each is in the middle
//! of, so the peer fails at once with that reason instead of finding closed connections.
//!
//! `--resume` (both sides): right after stream 0's Welcome, before any other stream opens,
//! the sender names its input file ([`Frame::Resume`]: size and modification time) and the
//! receiver answers with how much of its output it holds and a hash of each of its chunks
//! ([`Frame::Held`], in several frames); the sender checks each against its own file and
//! then sends from there (or aborts: the input changed). See [`crate::resume`].
//!
//! With `--psk-file` each connection opens instead with the two messages of a Noise
//! handshake, each in a [`Frame::Noise`] (magic and version in the clear, so a receiver tells
//! an encrypted sender from a stray connection); after them the frames above travel inside
//! encrypted records (see [`crate::secure`]).
//!
//! Bytes from the network enter only through [`Frame::parse`], which checks the declared body
//! length against the most its type may carry before waiting for (or keeping) any of it: a
//! frame cut short is [`FrameError::Truncated`] (the reader waits for more bytes), a length
//! over the bound is [`FrameError::TooLong`] at once. [`Frame::emit`] writes a frame into a
//! caller's buffer; parse(emit(f)) gives back f. The `mpcat_frame` fuzz target runs
//! [`fuzz_frame`].

/// The protocol version this build speaks. 4: [`Frame::Abort`]. 3: the end frame's hash is XXH3-128 (2: BLAKE3,
/// 32 bytes). 2: a Hello's chunk is the largest of the session's chunks, which may be down to
/// [`CHUNK_SPAN`](crate::CHUNK_SPAN) times smaller (1: every chunk that size but the last).
pub const VERSION: u16 = 4;
/// Opens every Hello and Welcome, so a stray connection (an HTTP client, a port scanner) is
/// told apart from an mpcat of another version.
pub const MAGIC: [u8; 4] = *b"TKMP";
/// Bytes before a frame's body.
pub const FRAME_HDR: usize = 5;
/// The largest chunk a data frame carries (and the largest `--chunk`).
pub const MAX_CHUNK: usize = 1 << 20;
/// The smallest chunk size a session may declare.
pub const MIN_CHUNK: usize = 1024;
/// The longest reason a Refuse or an Abort carries.
pub const MAX_REASON: usize = 1024;
/// Bytes of a data frame before its payload.
pub const DATA_HDR: usize = FRAME_HDR + 8;
/// The most streams one session may have.
pub const MAX_STREAMS: u16 = 256;
/// The stream index of the reverse connection (listener → connecting side): outside
/// `0..MAX_STREAMS`, so a receiver without duplex refuses it as out of range.
pub const REVERSE_STREAM: u16 = u16::MAX;

const T_HELLO: u8 = 1;
const T_WELCOME: u8 = 2;
const T_REFUSE: u8 = 3;
pub(crate) const T_DATA: u8 = 4;
const T_ACK: u8 = 5;
const T_END: u8 = 6;
const T_DONE: u8 = 7;
const T_NOISE: u8 = 8;
const T_STOP: u8 = 9;
const T_ABORT: u8 = 10;
const T_RESUME: u8 = 11;
const T_HELD: u8 = 12;

const HELLO_BODY: usize = 4 + 2 + 16 + 2 + 2 + 4;
const WELCOME_BODY: usize = 4 + 2 + 8;
const ACK_BODY: usize = 16;
const END_BODY: usize = 8 + 16;
const DONE_BODY: usize = 9;
/// The longest Noise handshake message a frame carries (mpcat's are 48 bytes).
pub const MAX_NOISE_MSG: usize = 64;
const NOISE_BODY: usize = 4 + 2 + MAX_NOISE_MSG;
const RESUME_BODY: usize = 16;
/// Chunk hashes a [`Frame::Held`] carries at most.
pub const HELD_PER_FRAME: usize = 16;
/// Bytes of one chunk hash in a [`Frame::Held`] (BLAKE3).
pub const HELD_HASH: usize = 32;
const HELD_BODY: usize = 16 + HELD_PER_FRAME * HELD_HASH;

/// The session's random token: connections that do not present it are refused.
pub type Token = [u8; 16];

/// One frame of mpcat's protocol. `Data` and `Refuse` borrow from the parsed buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// sender → receiver, first on every connection.
    Hello {
        version: u16,
        token: Token,
        /// This connection's index, `0..streams`.
        stream: u16,
        /// How many connections the session opens.
        streams: u16,
        /// The largest data frame payload; the others are at most
        /// [`CHUNK_SPAN`](crate::CHUNK_SPAN) times smaller, but the last.
        chunk: u32,
    },
    /// receiver → sender: accepted; the receiver's window (bytes it reorders in memory).
    Welcome { version: u16, window: u64 },
    /// receiver → sender: not accepted, and why (UTF-8); the receiver closes after it.
    Refuse { reason: &'a str },
    /// sender → receiver: bytes `seq .. seq + payload.len()` of the stream.
    Data { seq: u64, payload: &'a [u8] },
    /// receiver → sender: everything below `acked` is written; send nothing past `limit`.
    Ack { acked: u64, limit: u64 },
    /// sender → receiver: the stream is `total` bytes long and its hash ([`StreamHasher`](crate::StreamHasher)) is `hash`.
    End { total: u64, hash: crate::Digest },
    /// receiver → sender: all `total` bytes written, and whether the hash matched.
    Done { total: u64, ok: bool },
    /// Either way, first on a `--psk-file` connection: one message of the Noise handshake.
    Noise { version: u16, msg: &'a [u8] },
    /// connecting side → listener, on the reverse connection: end your stream now with the
    /// bytes sent so far (the connecting side stops waiting for more: -q, or no -N).
    Stop,
    /// Either way, mid-session: this side failed and why (UTF-8, at most [`MAX_REASON`]
    /// bytes); the peer fails the session with it, and both close.
    Abort { reason: &'a str },
    /// sender → receiver, --resume, first after stream 0's Welcome: the input file's length
    /// and modification time (nanoseconds since the epoch).
    Resume { size: u64, mtime_ns: u64 },
    /// receiver → sender, --resume: it holds the first `held` bytes of the output; `hashes`
    /// are the BLAKE3 hashes ([`HELD_HASH`] bytes each, at most [`HELD_PER_FRAME`]) of its
    /// chunks from index `first` on ([`crate::resume::CHUNK`] bytes each, the last one cut at
    /// `held`). Frames follow each other until every chunk has its hash.
    Held {
        held: u64,
        first: u64,
        hashes: &'a [u8],
    },
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame is not all there yet: `need` bytes from the frame's start, `have` present.
    #[error("frame cut short: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("unknown frame type {ty}")]
    UnknownType { ty: u8 },
    /// The declared body is longer than the type allows: refused before it is read.
    #[error("{what} frame declares a {len}-byte body, at most {max} allowed")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// The body does not hold what its type needs.
    #[error("{what} frame at offset {offset}: {why}")]
    Malformed {
        what: &'static str,
        offset: usize,
        why: &'static str,
    },
    #[error("magic {found:02x?} is not tcpkit mpcat's")]
    BadMagic { found: [u8; 4] },
}

/// The name and the longest body of a frame type.
fn kind(ty: u8) -> Result<(&'static str, usize), FrameError> {
    Ok(match ty {
        T_HELLO => ("hello", HELLO_BODY),
        T_WELCOME => ("welcome", WELCOME_BODY),
        T_REFUSE => ("refuse", MAX_REASON),
        T_DATA => ("data", 8 + MAX_CHUNK),
        T_ACK => ("ack", ACK_BODY),
        T_END => ("end", END_BODY),
        T_DONE => ("done", DONE_BODY),
        T_NOISE => ("noise", NOISE_BODY),
        T_STOP => ("stop", 0),
        T_ABORT => ("abort", MAX_REASON),
        T_RESUME => ("resume", RESUME_BODY),
        T_HELD => ("held", HELD_BODY),
        _ => return Err(FrameError::UnknownType { ty }),
    })
}

/// A checked reader over one frame's body; offsets in errors count from the frame's start.
struct Body<'a> {
    b: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Body<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let s = self
            .b
            .get(self.at..self.at + N)
            .ok_or(FrameError::Malformed {
                what: self.what,
                offset: FRAME_HDR + self.at,
                why: "body too short",
            })?;
        self.at += N;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        self.take::<2>().map(u16::from_be_bytes)
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        self.take::<4>().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        self.take::<8>().map(u64::from_be_bytes)
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = self.b.get(self.at..).unwrap_or(&[]);
        self.at = self.b.len();
        s
    }
    fn bad(&self, offset: usize, why: &'static str) -> FrameError {
        FrameError::Malformed {
            what: self.what,
            offset: FRAME_HDR + offset,
            why,
        }
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(self.bad(self.at, "bytes after the body's end"))
        }
    }
    fn magic(&mut self) -> Result<(), FrameError> {
        let found = self.take::<4>()?;
        if found != MAGIC {
            return Err(FrameError::BadMagic { found });
        }
        Ok(())
    }
}

impl<'a> Frame<'a> {
    /// Parses the frame at the start of `buf`; returns it and the bytes it took. A body
    /// longer than its type allows is refused from the header alone, so a reader never
    /// holds more than [`DATA_HDR`] + [`MAX_CHUNK`] bytes for one frame.
    pub fn parse(buf: &'a [u8]) -> Result<(Frame<'a>, usize), FrameError> {
        let hdr = buf.get(..FRAME_HDR).ok_or(FrameError::Truncated {
            need: FRAME_HDR,
            have: buf.len(),
        })?;
        let ty = hdr[0];
        let len = u32::from_be_bytes([hdr[1], hdr[2], hdr[3], hdr[4]]) as usize;
        let (what, max) = kind(ty)?;
        if len > max {
            return Err(FrameError::TooLong { what, len, max });
        }
        let total = FRAME_HDR + len;
        let body = buf.get(FRAME_HDR..total).ok_or(FrameError::Truncated {
            need: total,
            have: buf.len(),
        })?;
        let mut b = Body {
            b: body,
            at: 0,
            what,
        };
        let f = match ty {
            T_HELLO => {
                b.magic()?;
                let version = b.u16()?;
                let token = b.take::<16>()?;
                let stream = b.u16()?;
                let streams = b.u16()?;
                let chunk = b.u32()?;
                b.end()?;
                Frame::Hello {
                    version,
                    token,
                    stream,
                    streams,
                    chunk,
                }
            }
            T_WELCOME => {
                b.magic()?;
                let version = b.u16()?;
                let window = b.u64()?;
                b.end()?;
                Frame::Welcome { version, window }
            }
            T_REFUSE => {
                let reason =
                    std::str::from_utf8(b.rest()).map_err(|_| b.bad(0, "reason is not UTF-8"))?;
                Frame::Refuse { reason }
            }
            T_DATA => {
                let seq = b.u64()?;
                let payload = b.rest();
                if payload.is_empty() {
                    return Err(b.bad(8, "a data frame without bytes"));
                }
                if seq.checked_add(payload.len() as u64).is_none() {
                    return Err(b.bad(0, "the chunk ends past 2^64"));
                }
                Frame::Data { seq, payload }
            }
            T_ACK => {
                let acked = b.u64()?;
                let limit = b.u64()?;
                b.end()?;
                if limit < acked {
                    return Err(b.bad(8, "limit below the acknowledged offset"));
                }
                Frame::Ack { acked, limit }
            }
            T_END => {
                let total = b.u64()?;
                let hash = b.take::<16>()?;
                b.end()?;
                Frame::End { total, hash }
            }
            T_DONE => {
                let total = b.u64()?;
                let ok = match b.take::<1>()?[0] {
                    0 => false,
                    1 => true,
                    _ => return Err(b.bad(8, "verdict is neither 0 nor 1")),
                };
                b.end()?;
                Frame::Done { total, ok }
            }
            T_NOISE => {
                b.magic()?;
                let version = b.u16()?;
                let msg = b.rest();
                if msg.is_empty() {
                    return Err(b.bad(6, "no handshake message"));
                }
                Frame::Noise { version, msg }
            }
            T_STOP => {
                b.end()?;
                Frame::Stop
            }
            T_ABORT => {
                let reason =
                    std::str::from_utf8(b.rest()).map_err(|_| b.bad(0, "reason is not UTF-8"))?;
                Frame::Abort { reason }
            }
            T_RESUME => {
                let size = b.u64()?;
                let mtime_ns = b.u64()?;
                b.end()?;
                Frame::Resume { size, mtime_ns }
            }
            T_HELD => {
                let held = b.u64()?;
                let first = b.u64()?;
                let hashes = b.rest();
                if !hashes.len().is_multiple_of(HELD_HASH) {
                    return Err(b.bad(16, "hashes are not whole"));
                }
                let chunks = held.div_ceil(crate::resume::CHUNK);
                if first
                    .checked_add((hashes.len() / HELD_HASH) as u64)
                    .is_none_or(|e| e > chunks)
                {
                    return Err(b.bad(8, "hashes past the held bytes' last chunk"));
                }
                Frame::Held {
                    held,
                    first,
                    hashes,
                }
            }
            _ => return Err(FrameError::UnknownType { ty }),
        };
        Ok((f, total))
    }

    /// Length of the frame [`Frame::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        FRAME_HDR
            + match self {
                Frame::Hello { .. } => HELLO_BODY,
                Frame::Welcome { .. } => WELCOME_BODY,
                Frame::Refuse { reason } => reason_cut(reason),
                Frame::Data { payload, .. } => 8 + payload.len(),
                Frame::Ack { .. } => ACK_BODY,
                Frame::End { .. } => END_BODY,
                Frame::Done { .. } => DONE_BODY,
                Frame::Noise { msg, .. } => 6 + msg.len(),
                Frame::Stop => 0,
                Frame::Abort { reason } => reason_cut(reason),
                Frame::Resume { .. } => RESUME_BODY,
                Frame::Held { hashes, .. } => 16 + hashes.len(),
            }
    }

    /// Writes the frame at the start of `out`, which must hold [`Frame::buffer_len`] bytes;
    /// returns the bytes written. A Refuse's reason longer than [`MAX_REASON`] is cut at a
    /// character boundary. Panics if `out` is too short or a data payload is longer than
    /// [`MAX_CHUNK`]: both are the caller's own sizes, never a peer's.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let n = self.buffer_len();
        assert!(
            out.len() >= n,
            "emit: {} bytes for a {n}-byte frame",
            out.len()
        );
        let (ty, body_len) = match self {
            Frame::Hello { .. } => (T_HELLO, HELLO_BODY),
            Frame::Welcome { .. } => (T_WELCOME, WELCOME_BODY),
            Frame::Refuse { reason } => (T_REFUSE, reason_cut(reason)),
            Frame::Data { payload, .. } => {
                assert!(payload.len() <= MAX_CHUNK, "emit: chunk over MAX_CHUNK");
                (T_DATA, 8 + payload.len())
            }
            Frame::Ack { .. } => (T_ACK, ACK_BODY),
            Frame::End { .. } => (T_END, END_BODY),
            Frame::Done { .. } => (T_DONE, DONE_BODY),
            Frame::Noise { msg, .. } => {
                assert!(
                    (1..=MAX_NOISE_MSG).contains(&msg.len()),
                    "emit: a {}-byte Noise message",
                    msg.len()
                );
                (T_NOISE, 6 + msg.len())
            }
            Frame::Stop => (T_STOP, 0),
            Frame::Abort { reason } => (T_ABORT, reason_cut(reason)),
            Frame::Resume { .. } => (T_RESUME, RESUME_BODY),
            Frame::Held { hashes, .. } => {
                assert!(
                    hashes.len() <= HELD_PER_FRAME * HELD_HASH
                        && hashes.len().is_multiple_of(HELD_HASH),
                    "emit: {} bytes of chunk hashes",
                    hashes.len()
                );
                (T_HELD, 16 + hashes.len())
            }
        };
        out[0] = ty;
        out[1..FRAME_HDR].copy_from_slice(&(body_len as u32).to_be_bytes());
        let mut w = Writer {
            out: &mut out[FRAME_HDR..n],
            at: 0,
        };
        match *self {
            Frame::Hello {
                version,
                token,
                stream,
                streams,
                chunk,
            } => {
                w.put(&MAGIC);
                w.put(&version.to_be_bytes());
                w.put(&token);
                w.put(&stream.to_be_bytes());
                w.put(&streams.to_be_bytes());
                w.put(&chunk.to_be_bytes());
            }
            Frame::Welcome { version, window } => {
                w.put(&MAGIC);
                w.put(&version.to_be_bytes());
                w.put(&window.to_be_bytes());
            }
            Frame::Refuse { reason } | Frame::Abort { reason } => {
                w.put(&reason.as_bytes()[..reason_cut(reason)]);
            }
            Frame::Data { seq, payload } => {
                w.put(&seq.to_be_bytes());
                w.put(payload);
            }
            Frame::Ack { acked, limit } => {
                w.put(&acked.to_be_bytes());
                w.put(&limit.to_be_bytes());
            }
            Frame::End { total, hash } => {
                w.put(&total.to_be_bytes());
                w.put(&hash);
            }
            Frame::Done { total, ok } => {
                w.put(&total.to_be_bytes());
                w.put(&[u8::from(ok)]);
            }
            Frame::Noise { version, msg } => {
                w.put(&MAGIC);
                w.put(&version.to_be_bytes());
                w.put(msg);
            }
            Frame::Stop => {}
            Frame::Resume { size, mtime_ns } => {
                w.put(&size.to_be_bytes());
                w.put(&mtime_ns.to_be_bytes());
            }
            Frame::Held {
                held,
                first,
                hashes,
            } => {
                w.put(&held.to_be_bytes());
                w.put(&first.to_be_bytes());
                w.put(hashes);
            }
        }
        n
    }

    /// Appends the frame to `out`.
    pub fn emit_vec(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + self.buffer_len(), 0);
        self.emit(&mut out[at..]);
    }
}

/// The header of a data frame carrying `len` bytes at `seq`, for a sender that writes the
/// payload from its own buffer (no copy into a frame).
pub fn data_header(seq: u64, len: usize) -> [u8; DATA_HDR] {
    assert!(
        (1..=MAX_CHUNK).contains(&len),
        "data_header: {len}-byte chunk"
    );
    let mut h = [0u8; DATA_HDR];
    h[0] = T_DATA;
    h[1..FRAME_HDR].copy_from_slice(&((8 + len) as u32).to_be_bytes());
    h[FRAME_HDR..].copy_from_slice(&seq.to_be_bytes());
    h
}

/// The offset and payload length of the data frame whose header (its first [`DATA_HDR`]
/// bytes) starts `buf`, when that header is one [`Frame::parse`] would accept once the payload
/// is there: a receiver reads the payload straight to where it belongs. None for any other
/// frame, a header cut short, or one `parse` refuses (the caller lets `parse` say why).
pub fn data_header_of(buf: &[u8]) -> Option<(u64, usize)> {
    let h: &[u8; DATA_HDR] = buf.get(..DATA_HDR)?.try_into().ok()?;
    if h[0] != T_DATA {
        return None;
    }
    let body = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    let len = body
        .checked_sub(8)
        .filter(|l| (1..=MAX_CHUNK).contains(l))?;
    let mut s = [0u8; 8];
    s.copy_from_slice(&h[FRAME_HDR..]);
    let seq = u64::from_be_bytes(s);
    seq.checked_add(len as u64)?;
    Some((seq, len))
}

struct Writer<'o> {
    out: &'o mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, b: &[u8]) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

/// Bytes of a reason that fit in a Refuse, cut at a character boundary.
fn reason_cut(reason: &str) -> usize {
    let mut n = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The `mpcat_frame` fuzz target's body: parses every frame in `data`, and for each one that
/// parses checks that emitting it gives the same bytes and parsing those gives it back.
pub fn fuzz_frame(data: &[u8]) {
    let mut rest = data;
    let mut buf = Vec::new();
    while !rest.is_empty() {
        // A data header taken alone agrees with the whole frame's parse.
        if let Some((seq, len)) = data_header_of(rest) {
            match Frame::parse(rest) {
                Ok((Frame::Data { seq: s, payload }, _)) => {
                    assert_eq!((s, payload.len()), (seq, len));
                }
                Err(FrameError::Truncated { need, .. }) => assert_eq!(need, DATA_HDR + len),
                other => panic!("data_header_of accepted what parse gives as {other:?}"),
            }
        }
        match Frame::parse(rest) {
            Ok((f, used)) => {
                assert!(used >= FRAME_HDR && used <= rest.len());
                // A peer's reason (a refusal, an abort) is bounded whatever it declares.
                if let Frame::Refuse { reason } | Frame::Abort { reason } = f {
                    assert!(reason.len() <= MAX_REASON);
                }
                buf.clear();
                f.emit_vec(&mut buf);
                assert_eq!(buf.len(), f.buffer_len());
                assert_eq!(&buf[..], &rest[..used], "emit gives back the bytes parsed");
                let (back, n) = Frame::parse(&buf).expect("an emitted frame parses");
                assert_eq!((back, n), (f, used));
                rest = &rest[used..];
            }
            Err(FrameError::Truncated { need, have }) => {
                assert!(need > have && have == rest.len());
                break;
            }
            Err(FrameError::TooLong { len, max, .. }) => {
                assert!(len > max);
                break;
            }
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_header_alone_gives_what_the_whole_frame_gives() {
        let h = data_header(77, 5000);
        assert_eq!(data_header_of(&h), Some((77, 5000)));
        assert_eq!(data_header_of(&h[..DATA_HDR - 1]), None);
        let mut bad = h;
        bad[1..FRAME_HDR].copy_from_slice(&8u32.to_be_bytes()); // no payload
        assert_eq!(data_header_of(&bad), None);
        bad[1..FRAME_HDR].copy_from_slice(&((9 + MAX_CHUNK) as u32).to_be_bytes());
        assert_eq!(data_header_of(&bad), None);
        let mut end = data_header(u64::MAX - 10, 11); // ends past 2^64
        assert_eq!(data_header_of(&end), None);
        end[0] = T_ACK;
        assert_eq!(data_header_of(&end), None);
    }

    fn samples() -> Vec<Frame<'static>> {
        vec![
            Frame::Hello {
                version: VERSION,
                token: [0xa5; 16],
                stream: 3,
                streams: 8,
                chunk: 262_144,
            },
            Frame::Welcome {
                version: VERSION,
                window: 64 << 20,
            },
            Frame::Refuse {
                reason: "not this session's token",
            },
            Frame::Data {
                seq: 1 << 40,
                payload: b"some bytes of the stream",
            },
            Frame::Ack {
                acked: 4096,
                limit: 4096 + (64 << 20),
            },
            Frame::End {
                total: 123_456_789,
                hash: [0x3c; 16],
            },
            Frame::Done {
                total: 123_456_789,
                ok: true,
            },
            Frame::Done {
                total: 7,
                ok: false,
            },
            Frame::Noise {
                version: VERSION,
                msg: &[0x5a; 48],
            },
            Frame::Stop,
            Frame::Abort {
                reason: "write out.bin: No space left on device",
            },
            Frame::Resume {
                size: 5 << 30,
                mtime_ns: 1_764_000_000_123_456_789,
            },
            Frame::Held {
                held: (3 << 20) + 5,
                first: 2,
                hashes: &[0x6b; 2 * HELD_HASH],
            },
        ]
    }

    #[test]
    fn every_frame_round_trips_through_a_marked_buffer() {
        for f in samples() {
            // Pre-filled with a marker: a field emit forgets shows as 0xee.
            let mut buf = vec![0xee; f.buffer_len() + 7];
            let n = f.emit(&mut buf);
            assert_eq!(n, f.buffer_len());
            assert_eq!(buf[n..], [0xee; 7], "{f:?} wrote past its length");
            let (back, used) = Frame::parse(&buf[..n]).unwrap();
            assert_eq!((back, used), (f, n));
            // Trailing bytes belong to the next frame.
            assert_eq!(Frame::parse(&buf).unwrap().1, n);
        }
    }

    #[test]
    fn every_frame_cut_at_every_length_is_truncated() {
        for f in samples() {
            let mut buf = Vec::new();
            f.emit_vec(&mut buf);
            for cut in 0..buf.len() {
                match Frame::parse(&buf[..cut]) {
                    Err(FrameError::Truncated { need, have }) => {
                        assert_eq!(have, cut);
                        assert!(need > cut && need <= buf.len(), "{f:?} cut at {cut}");
                    }
                    other => panic!("{f:?} cut at {cut}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn the_data_header_is_the_frames_first_bytes() {
        let f = Frame::Data {
            seq: 99,
            payload: &[1, 2, 3],
        };
        let mut buf = Vec::new();
        f.emit_vec(&mut buf);
        assert_eq!(buf[..DATA_HDR], data_header(99, 3));
        assert_eq!(buf.len(), DATA_HDR + 3);
    }

    #[test]
    fn an_oversized_body_is_refused_from_the_header_alone() {
        // A data frame declaring 4 GiB: refused with 5 bytes read, nothing waited for.
        let hdr = [T_DATA, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            Frame::parse(&hdr),
            Err(FrameError::TooLong {
                what: "data",
                len: u32::MAX as usize,
                max: 8 + MAX_CHUNK
            })
        );
        let hello = [T_HELLO, 0, 0, 0, 31];
        assert!(matches!(
            Frame::parse(&hello),
            Err(FrameError::TooLong { what: "hello", .. })
        ));
        let refuse = [T_REFUSE, 0, 0, 4, 1];
        assert!(matches!(
            Frame::parse(&refuse),
            Err(FrameError::TooLong { what: "refuse", .. })
        ));
        // An abort's reason is bounded as a refusal's: a peer cannot make the other side
        // hold more than MAX_REASON bytes for it.
        let abort = [T_ABORT, 0, 0, 4, 1];
        assert!(matches!(
            Frame::parse(&abort),
            Err(FrameError::TooLong { what: "abort", .. })
        ));
        let mut buf = Vec::new();
        let long = "é".repeat(MAX_REASON);
        Frame::Abort { reason: &long }.emit_vec(&mut buf);
        assert!(buf.len() <= FRAME_HDR + MAX_REASON);
        assert!(matches!(Frame::parse(&buf), Ok((Frame::Abort { .. }, _))));
        let bad = [T_ABORT, 0, 0, 0, 1, 0xff];
        assert!(matches!(
            Frame::parse(&bad),
            Err(FrameError::Malformed { what: "abort", .. })
        ));
    }

    #[test]
    fn malformed_bodies_name_the_frame_and_offset() {
        let mut buf = Vec::new();
        Frame::Hello {
            version: 1,
            token: [0; 16],
            stream: 0,
            streams: 1,
            chunk: 4096,
        }
        .emit_vec(&mut buf);
        buf[FRAME_HDR] = b'X';
        assert!(matches!(
            Frame::parse(&buf),
            Err(FrameError::BadMagic { .. })
        ));
        // A short hello body: the declared length says 4, magic needs 4, version is missing.
        let short = [T_HELLO, 0, 0, 0, 4, b'T', b'K', b'M', b'P'];
        assert_eq!(
            Frame::parse(&short),
            Err(FrameError::Malformed {
                what: "hello",
                offset: 9,
                why: "body too short"
            })
        );
        assert_eq!(
            Frame::parse(&[13, 0, 0, 0, 0]),
            Err(FrameError::UnknownType { ty: 13 })
        );
        // Held: hashes whole, and none past the last chunk of what is held.
        let mut held = Vec::new();
        Frame::Held {
            held: 1,
            first: 0,
            hashes: &[0; HELD_HASH],
        }
        .emit_vec(&mut held);
        assert!(Frame::parse(&held).is_ok());
        held[FRAME_HDR + 7] = 0; // held 0: no chunk to hash
        assert!(matches!(
            Frame::parse(&held),
            Err(FrameError::Malformed { what: "held", .. })
        ));
        let cut = [
            T_HELD, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9,
        ];
        assert!(matches!(
            Frame::parse(&cut),
            Err(FrameError::Malformed { what: "held", .. })
        ));
        // A stop carries nothing.
        assert!(matches!(
            Frame::parse(&[T_STOP, 0, 0, 0, 1, 0]),
            Err(FrameError::TooLong { what: "stop", .. })
        ));
        let empty_data = [T_DATA, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(matches!(
            Frame::parse(&empty_data),
            Err(FrameError::Malformed { what: "data", .. })
        ));
        let mut ack = Vec::new();
        Frame::Ack {
            acked: 10,
            limit: 10,
        }
        .emit_vec(&mut ack);
        ack[FRAME_HDR + 15] = 9; // limit 9 < acked 10
        assert!(matches!(
            Frame::parse(&ack),
            Err(FrameError::Malformed { what: "ack", .. })
        ));
        let mut done = Vec::new();
        Frame::Done { total: 1, ok: true }.emit_vec(&mut done);
        done[FRAME_HDR + 8] = 2;
        assert!(matches!(
            Frame::parse(&done),
            Err(FrameError::Malformed { what: "done", .. })
        ));
        let bad_utf8 = [T_REFUSE, 0, 0, 0, 2, 0xff, 0xfe];
        assert!(matches!(
            Frame::parse(&bad_utf8),
            Err(FrameError::Malformed { what: "refuse", .. })
        ));
        let mut wrapped = vec![T_DATA, 0, 0, 0, 9];
        wrapped.extend_from_slice(&u64::MAX.to_be_bytes());
        wrapped.push(0);
        assert!(matches!(
            Frame::parse(&wrapped),
            Err(FrameError::Malformed { what: "data", .. })
        ));
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_REASON);
        let f = Frame::Refuse { reason: &long };
        let mut buf = Vec::new();
        f.emit_vec(&mut buf);
        let (back, _) = Frame::parse(&buf).unwrap();
        let Frame::Refuse { reason } = back else {
            panic!("{back:?}")
        };
        assert_eq!(reason.len(), MAX_REASON);
        assert!(long.starts_with(reason));
    }

    #[test]
    fn the_fuzz_body_runs_over_every_frame_and_their_concatenation() {
        let mut all = Vec::new();
        for f in samples() {
            let mut one = Vec::new();
            f.emit_vec(&mut one);
            fuzz_frame(&one);
            all.extend_from_slice(&one);
        }
        fuzz_frame(&all);
    }

    #[test]
    fn the_fuzz_body_runs_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("mpcat_frame");
        assert!(seeds.len() >= 8, "{} seeds", seeds.len());
        let mut kinds = std::collections::HashSet::new();
        for s in &seeds {
            fuzz_frame(&s.bytes);
            if let Ok((f, _)) = Frame::parse(&s.bytes) {
                kinds.insert(std::mem::discriminant(&f));
            }
        }
        assert_eq!(kinds.len(), 12, "every frame type has a seed");
    }

    /// Writes the seed corpus (run by hand: `cargo test -p tcpkit-mpcat write_frame_corpus
    /// -- --ignored`), kept so the seeds can be made again when a frame changes.
    #[test]
    #[ignore = "writes fuzz/corpus/mpcat_frame"]
    fn write_frame_corpus() {
        let put = |name: &str, bytes: &[u8]| tcpkit_lab::corpus::write("mpcat_frame", name, bytes);
        let names = [
            "hello", "welcome", "refuse", "data", "ack", "end", "done-ok", "done-bad", "noise",
            "stop", "abort", "resume", "held",
        ];
        let mut all = Vec::new();
        for (name, f) in names.iter().zip(samples()) {
            let mut b = Vec::new();
            f.emit_vec(&mut b);
            all.extend_from_slice(&b);
            put(name, &b);
        }
        // A whole session's frames back to back, and a data frame cut short.
        put("session", &all);
        let mut cut = Vec::new();
        Frame::Data {
            seq: 0,
            payload: &[0xab; 300],
        }
        .emit_vec(&mut cut);
        cut.truncate(100);
        put("data-cut", &cut);
    }

    #[test]
    fn the_fuzz_body_survives_random_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..3000 {
            let data: Vec<u8> = (0..len % 131)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Small types and lengths often, so whole frames occur.
                    if i % 5 == 0 {
                        (x % 8) as u8
                    } else if i % 5 < 3 {
                        0
                    } else {
                        x as u8
                    }
                })
                .collect();
            fuzz_frame(&data);
        }
    }
}
