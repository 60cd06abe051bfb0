//! HTTP/1.x responses framed as they arrive: where each head ends, what the body's framing is
//! (Content-Length, chunked, up to the close, none for 1xx/204/304 and answers to HEAD) and
//! which bytes are body. One framer for every job that reads HTTP answers (load's `--http`,
//! copy's `--diff-mode http`).
//!
//! The bytes are untrusted. Heads are parsed by `httparse` (checked, no allocation) once the
//! blank line is in; every count is bounded before it is used: a head at most [`MAX_HEAD`]
//! bytes and [`MAX_HEADERS`] headers, a chunk-size line at most [`MAX_CHUNK_LINE`] bytes with
//! at most 16 hex digits, trailers at most [`MAX_HEAD`] bytes, a body (Content-Length or one
//! chunk) at most the caller's `max_body`. Anything else is one [`HttpError`].
//!
//! The framer holds a few bytes of state; the only buffer is the caller's, and it is touched
//! only when a head is split across reads (a head whole in one read is parsed in place).
//! Bodies are never copied: [`Event::Body`] names the range of the caller's slice.
//!
//! ```text
//! loop {
//!     let step = framer.feed(data, &mut head_buf)?;
//!     match step.event { Event::More => break, Event::Head(h) => ..., Event::Body { from } =>
//!         body(&data[from..step.used]), Event::End => ... }
//!     data = &data[step.used..];
//! }
//! ```

/// Longest head (status line, headers and the blank line) accepted.
pub const MAX_HEAD: usize = 64 << 10;
/// Most header lines in one head (and in the trailers of a chunked body, counted as bytes).
pub const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (size, extensions, CRLF) accepted.
pub const MAX_CHUNK_LINE: u32 = 4096;

/// Why a response cannot be framed: the stream cannot be trusted past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The head is not an HTTP/1.x response head (httparse's reason).
    #[error("not an HTTP/1.x response head ({0})")]
    Head(httparse::Error),
    /// The status code is below 100.
    #[error("status code {0} below 100")]
    Status(u16),
    /// No blank line within [`MAX_HEAD`] bytes.
    #[error("response head longer than {MAX_HEAD} bytes")]
    HeadTooLong,
    /// Content-Length is not a number, or two of them differ.
    #[error("bad Content-Length")]
    ContentLength,
    /// A Content-Length or chunk size above the caller's bound.
    #[error("body of {0} bytes above the bound")]
    TooLarge(u64),
    /// A chunk-size line without hex digits, with too many, or too long.
    #[error("bad chunk size line")]
    ChunkSize,
    /// A chunk's data not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    ChunkEnd,
    /// Trailers longer than [`MAX_HEAD`] bytes.
    #[error("trailers longer than {MAX_HEAD} bytes")]
    TrailersTooLong,
}

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body: 1xx, 204, 304, an answer to HEAD, or `Content-Length: 0`.
    None,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Neither: the body runs to the end of the connection.
    UntilClose,
}

/// A response head, whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The status code (100..=999).
    pub status: u16,
    /// How the body is delimited.
    pub body: Body,
    /// The head was split across feeds: its bytes are the caller's buffer, not `data[..used]`.
    pub buffered: bool,
}

/// What one [`ResponseFramer::feed`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Every byte given was taken (`used == data.len()`); more are needed.
    More,
    /// A head is whole: `data[..used]` (or the caller's buffer when [`Head::buffered`]).
    Head(Head),
    /// Body bytes (de-chunked): `data[from..used]`.
    Body {
        /// Where they start in the slice given.
        from: usize,
    },
    /// The message is whole; the next byte starts the next response.
    End,
}

/// One step: `used` bytes of the slice given were taken, and what they made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Bytes of the slice taken.
    pub used: usize,
    /// What they made.
    pub event: Event,
}

impl Step {
    /// The bytes of the head an [`Event::Head`] step completed.
    pub fn head<'a>(&self, data: &'a [u8], buf: &'a [u8]) -> &'a [u8] {
        match self.event {
            Event::Head(Head { buffered: true, .. }) => buf,
            _ => &data[..self.used.min(data.len())],
        }
    }
}

const S_HEAD: u8 = 0;
const S_LENGTH: u8 = 1;
const S_CLOSE: u8 = 2;
const S_SIZE: u8 = 3;
const S_DATA: u8 = 4;
const S_DATA_END: u8 = 5;
const S_TRAILER: u8 = 6;
const S_DONE: u8 = 7;

/// The next message answers a HEAD request.
const F_HEAD_REQ: u8 = 1;
/// Head: the status line was checked. Chunk size: a hex digit was seen.
const F_SEEN: u8 = 2;
/// Chunk size: the digits ended (whitespace or extension follows).
const F_DIGITS_DONE: u8 = 4;
/// The last byte was CR (chunk size, chunk end, trailer line).
const F_CR: u8 = 8;
/// Trailer: the current line has bytes.
const F_LINE: u8 = 16;

/// An incremental HTTP/1.x response framer: feed it the connection's bytes in order, in
/// slices of any size.
#[derive(Debug, Clone, Copy)]
pub struct ResponseFramer {
    /// Body bytes left (Content-Length, chunk data), or the chunk size being read.
    left: u64,
    max_body: u64,
    /// Head bytes seen (head), chunk-size line length, trailer bytes.
    count: u32,
    status: u16,
    state: u8,
    flags: u8,
}

impl Default for ResponseFramer {
    fn default() -> ResponseFramer {
        ResponseFramer::new(u64::MAX)
    }
}

impl ResponseFramer {
    /// A framer at the start of a response; a Content-Length or chunk size above `max_body` is
    /// [`HttpError::TooLarge`].
    pub fn new(max_body: u64) -> ResponseFramer {
        ResponseFramer {
            left: 0,
            max_body,
            count: 0,
            status: 0,
            state: S_HEAD,
            flags: 0,
        }
    }

    /// The next response (the one in progress if its head is not whole yet) answers a HEAD
    /// request: it has no body whatever its headers say.
    pub fn expect_head_response(&mut self, yes: bool) {
        if yes {
            self.flags |= F_HEAD_REQ;
        } else {
            self.flags &= !F_HEAD_REQ;
        }
    }

    /// No byte of a response is in progress.
    pub fn at_message_start(&self) -> bool {
        self.state == S_HEAD && self.count == 0
    }

    /// The head is whole and the body runs to the close.
    pub fn until_close(&self) -> bool {
        self.state == S_CLOSE
    }

    /// The status of the response in progress, or of the last one while no head is whole.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Ready for the next response (an expected HEAD answer stays expected).
    fn reset(&mut self) {
        let (head_req, status) = (self.flags & F_HEAD_REQ, self.status);
        *self = ResponseFramer::new(self.max_body);
        self.flags = head_req;
        self.status = status;
    }

    /// Takes bytes from `data` up to the next event. `buf` holds the head in progress when a
    /// head is split across feeds (cleared when a head starts); on an error, nothing of `data`
    /// was taken and `buf` holds the earlier bytes of that head.
    pub fn feed(&mut self, data: &[u8], buf: &mut Vec<u8>) -> Result<Step, HttpError> {
        match self.state {
            S_HEAD => self.feed_head(data, buf),
            S_DONE => {
                self.reset();
                Ok(Step {
                    used: 0,
                    event: Event::End,
                })
            }
            S_LENGTH | S_DATA => {
                if data.is_empty() {
                    return Ok(more(0));
                }
                let n = usize::try_from(self.left).map_or(data.len(), |l| l.min(data.len()));
                self.left -= n as u64;
                if self.left == 0 {
                    self.state = if self.state == S_LENGTH {
                        S_DONE
                    } else {
                        S_DATA_END
                    };
                }
                Ok(Step {
                    used: n,
                    event: Event::Body { from: 0 },
                })
            }
            S_CLOSE => Ok(if data.is_empty() {
                more(0)
            } else {
                Step {
                    used: data.len(),
                    event: Event::Body { from: 0 },
                }
            }),
            _ => self.feed_chunk_framing(data),
        }
    }

    fn feed_head(&mut self, data: &[u8], buf: &mut Vec<u8>) -> Result<Step, HttpError> {
        if data.is_empty() {
            return Ok(more(0));
        }
        if self.count == 0 {
            buf.clear();
            // In place: the usual case, a head whole in one read.
            if let Some(step) = self.parse_head(data, 0, true)? {
                return Ok(step);
            }
            if data.len() >= MAX_HEAD {
                return Err(HttpError::HeadTooLong);
            }
            buf.extend_from_slice(data);
            self.count = data.len() as u32;
            if data.contains(&b'\n') {
                self.flags |= F_SEEN;
            }
            return Ok(more(data.len()));
        }
        let old = buf.len();
        let keep = data.len().min(MAX_HEAD - old);
        buf.extend_from_slice(&data[..keep]);
        // Parse again only when a line ended: the status line is checked at its end, the
        // whole head at the blank line; so a head arriving a byte at a time costs two parses.
        let new_line = buf[old..].contains(&b'\n');
        let from = old.saturating_sub(2);
        let blank = new_line
            && (find(&buf[from..], b"\n\r\n").is_some() || find(&buf[from..], b"\n\n").is_some());
        if blank || (new_line && self.flags & F_SEEN == 0) {
            match self.parse_head(buf, old, false) {
                Ok(Some(step)) => {
                    // The buffer holds exactly the head.
                    buf.truncate(old + step.used);
                    return Ok(step);
                }
                Ok(None) => self.flags |= F_SEEN,
                Err(e) => {
                    buf.truncate(old);
                    return Err(e);
                }
            }
        }
        if buf.len() >= MAX_HEAD {
            buf.truncate(old);
            return Err(HttpError::HeadTooLong);
        }
        self.count = buf.len() as u32;
        Ok(more(data.len()))
    }

    /// Parses `head` (bytes of the head so far, `old` of them from earlier feeds): None while
    /// it is not whole.
    fn parse_head(
        &mut self,
        head: &[u8],
        old: usize,
        in_place: bool,
    ) -> Result<Option<Step>, HttpError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match httparse::ParserConfig::default()
            .allow_spaces_after_header_name_in_responses(true)
            .allow_obsolete_multiline_headers_in_responses(true)
            .allow_multiple_spaces_in_response_status_delimiters(true)
            .parse_response(&mut resp, head)
        {
            Ok(httparse::Status::Complete(n)) if n > MAX_HEAD => {
                return Err(HttpError::HeadTooLong)
            }
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(HttpError::Head(e)),
        };
        let status = resp.code.unwrap_or(0);
        if status < 100 {
            return Err(HttpError::Status(status));
        }
        let mut length = None;
        let mut chunked = false;
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked |= h
                    .value
                    .split(|&c| c == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if h.name.eq_ignore_ascii_case("content-length") {
                let n = parse_decimal(h.value.trim_ascii()).ok_or(HttpError::ContentLength)?;
                if length.is_some_and(|l| l != n) {
                    return Err(HttpError::ContentLength);
                }
                length = Some(n);
            }
        }
        let bodyless = self.flags & F_HEAD_REQ != 0
            || status < 200
            || status == 204
            || status == 304
            || (!chunked && length == Some(0));
        let body = if bodyless {
            Body::None
        } else if chunked {
            Body::Chunked
        } else if let Some(n) = length {
            if n > self.max_body {
                return Err(HttpError::TooLarge(n));
            }
            Body::Length(n)
        } else {
            Body::UntilClose
        };
        self.status = status;
        self.count = 0;
        // The HEAD request is answered (by its final response); what follows answers the next.
        self.flags = if status < 200 {
            self.flags & F_HEAD_REQ
        } else {
            0
        };
        (self.state, self.left) = match body {
            Body::None => (S_DONE, 0),
            Body::Length(n) => (S_LENGTH, n),
            Body::Chunked => (S_SIZE, 0),
            Body::UntilClose => (S_CLOSE, 0),
        };
        Ok(Some(Step {
            used: n - old,
            event: Event::Head(Head {
                status,
                body,
                buffered: !in_place,
            }),
        }))
    }

    /// Chunk-size lines, the CRLF after chunk data and trailers, byte by byte (they are short).
    fn feed_chunk_framing(&mut self, data: &[u8]) -> Result<Step, HttpError> {
        for (i, &b) in data.iter().enumerate() {
            match self.state {
                S_SIZE => {
                    self.count += 1;
                    if self.count > MAX_CHUNK_LINE {
                        return Err(HttpError::ChunkSize);
                    }
                    if b == b'\n' {
                        if self.flags & F_SEEN == 0 {
                            return Err(HttpError::ChunkSize);
                        }
                        self.count = 0;
                        self.flags &= !(F_SEEN | F_DIGITS_DONE | F_CR);
                        if self.left == 0 {
                            self.state = S_TRAILER;
                        } else {
                            if self.left > self.max_body {
                                return Err(HttpError::TooLarge(self.left));
                            }
                            self.state = S_DATA;
                            let from = i + 1;
                            let n = usize::try_from(self.left)
                                .map_or(data.len() - from, |l| l.min(data.len() - from));
                            self.left -= n as u64;
                            if self.left == 0 {
                                self.state = S_DATA_END;
                            }
                            return Ok(Step {
                                used: from + n,
                                event: Event::Body { from },
                            });
                        }
                        continue;
                    }
                    if self.flags & F_DIGITS_DONE != 0 {
                        // Extensions and whitespace up to the end of the line.
                        continue;
                    }
                    match (b as char).to_digit(16) {
                        Some(d) => {
                            self.left = self
                                .left
                                .checked_mul(16)
                                .map(|v| v + u64::from(d))
                                .ok_or(HttpError::ChunkSize)?;
                            self.flags |= F_SEEN;
                        }
                        None if matches!(b, b';' | b' ' | b'\t' | b'\r')
                            && self.flags & F_SEEN != 0 =>
                        {
                            self.flags |= F_DIGITS_DONE;
                        }
                        None => return Err(HttpError::ChunkSize),
                    }
                }
                S_DATA_END => {
                    if b == b'\r' && self.flags & F_CR == 0 {
                        self.flags |= F_CR;
                    } else if b == b'\n' {
                        self.flags &= !F_CR;
                        self.state = S_SIZE;
                        self.left = 0;
                        self.count = 0;
                    } else {
                        return Err(HttpError::ChunkEnd);
                    }
                }
                _ => {
                    // Trailer lines up to an empty one.
                    self.count += 1;
                    if self.count as usize > MAX_HEAD {
                        return Err(HttpError::TrailersTooLong);
                    }
                    if b == b'\n' {
                        if self.flags & F_LINE == 0 {
                            self.reset();
                            return Ok(Step {
                                used: i + 1,
                                event: Event::End,
                            });
                        }
                        self.flags &= !F_LINE;
                    } else if b != b'\r' {
                        self.flags |= F_LINE;
                    }
                }
            }
        }
        Ok(more(data.len()))
    }
}

fn more(used: usize) -> Step {
    Step {
        used,
        event: Event::More,
    }
}

fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0u64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0'))
    })
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// A response as the framer saw it: status, body framing, de-chunked body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framed {
    /// Its head's bytes.
    pub head: Vec<u8>,
    /// The head's facts.
    pub status: u16,
    /// Its framing.
    pub body_kind: Body,
    /// Its body, de-chunked.
    pub body: Vec<u8>,
    /// The message ended (false: the stream ended inside it).
    pub whole: bool,
}

/// Frames every response in `chunks` (the stream cut where the caller likes); for tests and
/// the fuzz target. Stops at the first error.
pub fn frame_all(chunks: &[&[u8]], max_body: u64) -> (Vec<Framed>, Option<HttpError>) {
    let mut f = ResponseFramer::new(max_body);
    let mut buf = Vec::new();
    let mut out: Vec<Framed> = Vec::new();
    for chunk in chunks {
        let mut d = *chunk;
        loop {
            let step = match f.feed(d, &mut buf) {
                Ok(s) => s,
                Err(e) => return (out, Some(e)),
            };
            assert!(step.used <= d.len(), "used past the slice");
            match step.event {
                Event::More => {
                    assert_eq!(step.used, d.len(), "More leaves bytes");
                    break;
                }
                Event::Head(h) => out.push(Framed {
                    head: step.head(d, &buf).to_vec(),
                    status: h.status,
                    body_kind: h.body,
                    body: Vec::new(),
                    whole: false,
                }),
                Event::Body { from } => {
                    if let Some(m) = out.last_mut() {
                        m.body.extend_from_slice(&d[from..step.used]);
                    }
                }
                Event::End => {
                    if let Some(m) = out.last_mut() {
                        m.whole = true;
                    }
                }
            }
            d = &d[step.used..];
        }
    }
    // A stream may end where a message ends: the End is due without more bytes.
    if let Ok(Step {
        event: Event::End, ..
    }) = f.feed(&[], &mut buf)
    {
        if let Some(m) = out.last_mut() {
            m.whole = true;
        }
    }
    (out, None)
}

/// Body of the `http` fuzz target: byte 0 picks where the rest is cut in two and the body
/// bound. Nothing may panic, and the responses framed whole must be the same whether the
/// stream comes in one piece, in two or a byte at a time. (Where a stream ends inside a bad
/// head, one read may already see the error that byte-wise reading sees only at the line's
/// end; so only whole responses are compared.)
pub fn fuzz_http(data: &[u8]) {
    let [sel, rest @ ..] = data else {
        return;
    };
    let max_body = if sel & 0x80 != 0 { 1 << 10 } else { u64::MAX };
    let cut = usize::from(*sel & 0x7f).min(rest.len());
    let whole_msgs = |r: (Vec<Framed>, Option<HttpError>)| {
        r.0.into_iter().filter(|m| m.whole).collect::<Vec<_>>()
    };
    let whole = whole_msgs(frame_all(&[rest], max_body));
    let split = whole_msgs(frame_all(&[&rest[..cut], &rest[cut..]], max_body));
    let one_byte: Vec<&[u8]> = rest.chunks(1).collect();
    let bytes = whole_msgs(frame_all(&one_byte, max_body));
    assert_eq!(whole, split, "cut at {cut}");
    assert_eq!(whole, bytes, "one byte at a time");
}

mod request;
pub use request::{
    counts_agree_across_reads, fuzz_request_framer, RequestFramer, MAX_REQUEST_HEAD,
};

#[cfg(test)]
mod tests;
