//! HTTP/1 requests framed as a client sends them: where each one begins, for jobs that count
//! the requests inside a client's stream (copy's `requests.pipelined`: requests sent before
//! the answer to the one before).
//!
//! The client's bytes are untrusted, and a connection may hold a head open for as long as it
//! likes: so nothing is buffered (unlike [`super::ResponseFramer`], which parses a whole head
//! with httparse: a response's head is needed, a request's only its framing). Heads are framed
//! byte by byte in a few bytes of state (the method, the name of the header being read, the
//! Content-Length so far, all bounded), at most [`MAX_REQUEST_HEAD`] bytes long; a body is
//! passed over by its Content-Length. A stream this does not frame for sure (no request line,
//! a chunked body, an upgrade or CONNECT, a head too long, a header without a colon, a bad or
//! twice-different length) stops the framing: later requests are not guessed at.

/// Bytes of one request head at most (nginx's default large_client_header_buffers hold
/// 8 KiB a line; two of those).
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// A method token, or the name of a header this looks at, is at most this long.
const MAX_TOKEN: usize = 20;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The next client byte begins a request.
    #[default]
    Start,
    /// In the method token (in `tok`).
    Method,
    /// In the rest of the request line.
    Line,
    /// At the start of a header line (or of the blank line that ends the head).
    LineStart,
    /// In a header's name (its first bytes, lowercased, in `tok`).
    Name,
    /// In Content-Length's value (digits so far in `value`).
    Value,
    /// In a header line of no interest.
    Skip,
    /// After the blank line's CR: its LF ends the head.
    EndLf,
    /// This many body bytes still to pass over.
    Body(u64),
    /// Not framed any more: nothing more is counted.
    Off,
}

/// One client stream, framed as HTTP/1 requests (see the module's doc).
#[derive(Debug, Default)]
pub struct RequestFramer {
    state: State,
    /// Bytes of the current head so far.
    head_len: usize,
    tok: [u8; MAX_TOKEN],
    tok_len: usize,
    /// The current request's method is CONNECT.
    connect: bool,
    /// The current request's Content-Length, once a header gave it.
    length: Option<u64>,
    /// The Content-Length value being read (None before its first digit).
    value: Option<u64>,
}

impl RequestFramer {
    /// The client's next bytes; returns how many requests began in them (a request begins
    /// at its first byte, so a read that ends right after a request's last byte does not
    /// count the next one yet).
    pub fn feed(&mut self, mut data: &[u8]) -> u64 {
        let mut n = 0;
        while let Some((&b, rest)) = data.split_first() {
            match self.state {
                State::Off => break,
                State::Body(left) => {
                    let k = left.min(data.len() as u64);
                    data = data.get(k as usize..).unwrap_or(&[]);
                    self.state = if k == left {
                        State::Start
                    } else {
                        State::Body(left - k)
                    };
                    continue;
                }
                State::Start => {
                    n += 1;
                    self.head_len = 0;
                    self.tok_len = 0;
                    self.connect = false;
                    self.length = None;
                    self.state = State::Method;
                    continue;
                }
                _ => {}
            }
            self.head_len += 1;
            self.state = if self.head_len > MAX_REQUEST_HEAD {
                State::Off
            } else {
                self.head_byte(b)
            };
            data = rest;
        }
        n
    }

    /// Whether the stream is no longer framed (see the module's doc): nothing more will be
    /// counted.
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }
    /// The next state after byte `b` of a head.
    fn head_byte(&mut self, b: u8) -> State {
        match self.state {
            State::Method => match b {
                b' ' if self.tok_len > 0 => {
                    self.connect = self.tok.get(..self.tok_len) == Some(b"CONNECT".as_slice());
                    State::Line
                }
                b'A'..=b'Z' | b'-' | b'_' if self.tok_len < MAX_TOKEN => {
                    self.push(b);
                    State::Method
                }
                _ => State::Off,
            },
            State::Line | State::Skip => {
                if b == b'\n' {
                    State::LineStart
                } else {
                    self.state
                }
            }
            State::LineStart => match b {
                b'\r' => State::EndLf,
                b'\n' => self.end_of_head(),
                _ => {
                    self.tok_len = 0;
                    self.name_byte(b)
                }
            },
            State::Name => self.name_byte(b),
            State::Value => match b {
                // Whitespace around the number; `tok_len` 1 marks it seen after digits.
                b' ' | b'\t' | b'\r' => {
                    if self.value.is_some() {
                        self.tok_len = 1;
                    }
                    State::Value
                }
                b'0'..=b'9' if self.tok_len == 0 => {
                    let v = self
                        .value
                        .unwrap_or(0)
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(b - b'0')));
                    self.value = v;
                    if v.is_some() {
                        State::Value
                    } else {
                        State::Off
                    }
                }
                b'\n' => match (self.value.take(), self.length) {
                    (Some(v), None) => {
                        self.length = Some(v);
                        State::LineStart
                    }
                    (Some(v), Some(l)) if v == l => State::LineStart,
                    _ => State::Off,
                },
                _ => State::Off,
            },
            State::EndLf if b == b'\n' => self.end_of_head(),
            _ => State::Off,
        }
    }

    /// Byte `b` of a header's name (or its colon).
    fn name_byte(&mut self, b: u8) -> State {
        match b {
            b':' => {
                let name = self.tok.get(..self.tok_len).unwrap_or(&[]);
                if name == b"content-length" {
                    self.value = None;
                    self.tok_len = 0;
                    State::Value
                } else if name == b"transfer-encoding" || name == b"upgrade" {
                    State::Off
                } else {
                    State::Skip
                }
            }
            b'\r' | b'\n' | b' ' | b'\t' => State::Off,
            _ => {
                // Past MAX_TOKEN bytes the name is none looked at; its colon still counts.
                if self.tok_len < MAX_TOKEN {
                    self.push(b.to_ascii_lowercase());
                }
                State::Name
            }
        }
    }

    fn push(&mut self, b: u8) {
        if let Some(t) = self.tok.get_mut(self.tok_len) {
            *t = b;
            self.tok_len += 1;
        }
    }

    /// The head ended: its body's framing.
    fn end_of_head(&mut self) -> State {
        match self.length {
            _ if self.connect => State::Off,
            Some(l) if l > 0 => State::Body(l),
            _ => State::Start,
        }
    }
}

/// The framer's checks, run by the `copy_pipeline` fuzz target (and the tests): the first byte
/// sets how the rest is cut into reads; framing must not depend on where the reads were cut,
/// and no read may begin more requests than it has bytes.
pub fn fuzz_request_framer(data: &[u8]) {
    if let Some((whole, parts)) = counts_agree_across_reads(data, RequestFramer::feed) {
        assert!(whole.tok_len <= MAX_TOKEN && parts.tok_len <= MAX_TOKEN);
    }
}

/// The check shared by fuzz bodies that count requests in a stream (the framer's, copy's
/// pipelined count): `data`'s first byte sets a read size from 1 to 16, the rest is fed
/// whole to one counter and in reads of that size to another; the counts must add up the
/// same, and no read may count more than it has bytes. The two counters, for more checks.
pub fn counts_agree_across_reads<S: Default>(
    data: &[u8],
    mut feed: impl FnMut(&mut S, &[u8]) -> u64,
) -> Option<(S, S)> {
    let (&cut, rest) = data.split_first()?;
    let mut whole = S::default();
    let all = feed(&mut whole, rest);
    let mut parts = S::default();
    let step = usize::from(cut % 16) + 1;
    let mut sum = 0;
    for chunk in rest.chunks(step) {
        let k = feed(&mut parts, chunk);
        assert!(
            k as usize <= chunk.len(),
            "{k} requests in {} bytes",
            chunk.len()
        );
        sum += k;
    }
    assert_eq!(all, sum, "the same stream in reads of {step}");
    Some((whole, parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn each_request_is_counted_where_it_begins() {
        let mut f = RequestFramer::default();
        assert_eq!(f.feed(GET), 1);
        assert_eq!(f.feed(&[GET, GET, GET].concat()), 3);
        // A head cut anywhere, over several reads.
        let two = [GET, GET].concat();
        let (a, b) = two.split_at(GET.len() + 5);
        assert_eq!(f.feed(&a[..3]) + f.feed(&a[3..]) + f.feed(b), 2);
    }

    #[test]
    fn bodies_are_passed_over_by_their_length() {
        let mut f = RequestFramer::default();
        let post = b"POST /f HTTP/1.1\r\nContent-Length: 20\r\n\r\nGET / HTTP/1.1\r\n\r\nxx";
        // The body looks like a request: it is not one.
        assert_eq!(f.feed(post), 1);
        assert_eq!(f.feed(GET), 1);
        assert_eq!(
            f.feed(b"PUT /f HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc"),
            1
        );
        assert_eq!(f.feed(GET), 1);
    }

    #[test]
    fn what_is_not_framed_for_sure_stops_the_framing() {
        for first in [
            &b"*1\r\n$4\r\nPING\r\n"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            let mut f = RequestFramer::default();
            f.feed(first);
            assert_eq!(f.feed(&[GET, GET].concat()), 0, "{first:?}");
            assert!(f.is_off(), "{first:?}");
        }
        // A head that never ends is followed up to its bound.
        let mut f = RequestFramer::default();
        f.feed(b"GET /");
        f.feed(&vec![b'a'; MAX_REQUEST_HEAD - 5]);
        assert_eq!(f.state, State::Line);
        f.feed(b"a");
        assert!(f.is_off());
        // Lengths: whitespace around one number only, within 64 bits.
        for (len, framed) in [
            ("3", true),
            (" 3 \t", true),
            ("3 3", false),
            ("18446744073709551616", false),
            ("", false),
            ("3x", false),
        ] {
            let mut f = RequestFramer::default();
            let head = format!("POST / HTTP/1.1\r\nContent-Length:{len}\r\n\r\nabc");
            f.feed(head.as_bytes());
            assert_eq!(!f.is_off(), framed, "{len:?}: {:?}", f.state);
        }
    }

    #[test]
    fn the_checks_hold_on_plain_streams() {
        fuzz_request_framer(
            &[3u8]
                .iter()
                .chain([GET, GET, GET].concat().iter())
                .copied()
                .collect::<Vec<_>>(),
        );
        fuzz_request_framer(
            b"\x07POST /f HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n",
        );
    }
}
