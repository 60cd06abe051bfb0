//! HTTP/1 requests a client pipelined: sent before the server answered the request before
//! them, so they share that request's turn. copy's requests are turns (client bytes between
//! two server turns, `requests.at_source`), whatever the protocol; this counts the HTTP/1
//! requests hidden inside them apart (`requests.pipelined`), so that `at_source + pipelined`
//! is what a server's access log counts. A keep-alive load that keeps its schedule while the
//! server is slow pipelines: the soak's 50 connections at 50 requests/s each, on a loaded
//! VM, put 10 % of their requests behind the one before, and at_source fell short of
//! nginx's log by that much with nothing lost.
//!
//! The client's bytes are untrusted. A head is parsed by `httparse` (checked, no allocation)
//! once its blank line is in, at most [`MAX_HEAD`] bytes buffered and [`MAX_HEADERS`]
//! headers; a body is passed over by its Content-Length, never buffered. A stream this does
//! not frame for sure (no request line, a chunked body, an upgrade or CONNECT, a head too
//! long, a parse error) stops the count for its session: later requests are not guessed at.

/// Bytes of one request head buffered at most (nginx's default large_client_header_buffers
/// holds 8 KiB a line; two of those).
const MAX_HEAD: usize = 16 * 1024;
/// Headers of one request parsed at most.
const MAX_HEADERS: usize = 100;
/// A method token longer than this is no HTTP/1 request line.
const MAX_METHOD: usize = 20;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The next client byte begins a request.
    #[default]
    Start,
    /// Inside a request's head (buffered in `head`).
    Head,
    /// This many body bytes still to pass over.
    Body(u64),
    /// Not framed any more: nothing more is counted.
    Off,
}

/// One session's client stream, framed as HTTP/1 requests.
#[derive(Debug, Default)]
pub struct Pipeline {
    state: State,
    head: Vec<u8>,
    /// A request began in this session.
    begun: bool,
    /// The server sent bytes since the last request began.
    answered: bool,
}

impl Pipeline {
    /// The server sent bytes (or the capture lost some of them): the request in progress was
    /// answered, at least in part.
    pub fn server(&mut self) {
        self.answered = true;
    }

    /// The client's next bytes; returns how many requests began in them before the server
    /// answered the one before (pipelined).
    pub fn client(&mut self, mut data: &[u8]) -> u64 {
        let mut n = 0;
        while !data.is_empty() {
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
                }
                State::Start => {
                    if self.begun && !self.answered {
                        n += 1;
                    }
                    self.begun = true;
                    self.answered = false;
                    self.head.clear();
                    self.state = State::Head;
                }
                State::Head => data = self.head_bytes(data),
            }
        }
        if self.state == State::Off && self.head.capacity() > 0 {
            self.head = Vec::new();
        }
        n
    }

    /// Takes bytes of a head; returns what follows it in `data` (nothing while the head
    /// goes on).
    fn head_bytes<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        let had = self.head.len();
        let take = data.len().min(MAX_HEAD - had);
        self.head.extend_from_slice(data.get(..take).unwrap_or(&[]));
        if !plausible(&self.head).unwrap_or(true) {
            self.state = State::Off;
            return &[];
        }
        let from = had.saturating_sub(3);
        let end = self
            .head
            .get(from..)
            .and_then(|h| h.windows(4).position(|w| w == b"\r\n\r\n"))
            .map(|p| from + p + 4);
        let Some(end) = end else {
            if self.head.len() >= MAX_HEAD {
                self.state = State::Off;
            }
            return &[];
        };
        self.head.truncate(end);
        self.state = self.parse();
        data.get(end.saturating_sub(had)..).unwrap_or(&[])
    }

    /// The framing after a whole head: its body's length, or `Off`.
    fn parse(&self) -> State {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        if !matches!(req.parse(&self.head), Ok(httparse::Status::Complete(_))) {
            return State::Off;
        }
        if req.method == Some("CONNECT") {
            return State::Off;
        }
        let mut len = None;
        for h in req.headers.iter() {
            let name = h.name;
            if name.eq_ignore_ascii_case("transfer-encoding")
                || name.eq_ignore_ascii_case("upgrade")
            {
                return State::Off;
            }
            if name.eq_ignore_ascii_case("content-length") {
                let v = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok());
                match (v, len) {
                    (Some(v), None) => len = Some(v),
                    (Some(v), Some(l)) if v == l => {}
                    _ => return State::Off,
                }
            }
        }
        match len {
            Some(l) if l > 0 => State::Body(l),
            _ => State::Start,
        }
    }
}

/// Whether `head` starts like a request line (a method token of capitals, then a space):
/// None while too few bytes are in to tell.
fn plausible(head: &[u8]) -> Option<bool> {
    for (i, &b) in head.iter().enumerate().take(MAX_METHOD + 1) {
        match b {
            b' ' => return Some(i > 0),
            b'A'..=b'Z' | b'-' | b'_' if i < MAX_METHOD => {}
            _ => return Some(false),
        }
    }
    None
}

/// Body of the `copy_pipeline` fuzz target, public so a stable test runs it over the seed
/// corpus. The first byte sets how the rest is cut into reads; framing must not depend on
/// where the reads were cut, and no read may count more requests than it could hold.
pub fn fuzz_pipeline(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let mut whole = Pipeline::default();
    let all = whole.client(rest);
    let mut parts = Pipeline::default();
    let step = usize::from(cut % 16) + 1;
    let mut sum = 0;
    for chunk in rest.chunks(step) {
        let k = parts.client(chunk);
        // A pipelined request takes at least its request line ("A / HTTP/1.1\r\n\r\n").
        assert!(
            k as usize <= chunk.len(),
            "{k} requests in {} bytes",
            chunk.len()
        );
        sum += k;
    }
    assert_eq!(all, sum, "the same stream in reads of {step}");
    assert!(whole.head.len() <= MAX_HEAD && parts.head.len() <= MAX_HEAD);
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn requests_before_the_answer_to_the_one_before_count_as_pipelined() {
        let mut p = Pipeline::default();
        assert_eq!(p.client(GET), 0, "the first request");
        p.server();
        assert_eq!(p.client(GET), 0, "after its answer");
        // Three in one read, then one more, and no answer to the second yet: all pipelined.
        assert_eq!(p.client(&[GET, GET, GET].concat()), 3);
        assert_eq!(p.client(GET), 1);
        p.server();
        // A head cut anywhere, over several reads.
        let two = [GET, GET].concat();
        let (a, b) = two.split_at(GET.len() + 5);
        assert_eq!(p.client(&a[..3]) + p.client(&a[3..]) + p.client(b), 1);
    }

    #[test]
    fn bodies_are_passed_over_by_their_length() {
        let mut p = Pipeline::default();
        let post = b"POST /f HTTP/1.1\r\nContent-Length: 20\r\n\r\nGET / HTTP/1.1\r\n\r\nxx";
        // The body looks like a request: it is not one.
        assert_eq!(p.client(post), 0);
        assert_eq!(p.client(GET), 1);
        // The answer to a request's head (100 Continue) before its body: the request after
        // the body went after an answer.
        let mut p = Pipeline::default();
        assert_eq!(p.client(b"PUT /f HTTP/1.1\r\ncontent-length: 3\r\n\r\n"), 0);
        p.server();
        assert_eq!(p.client(&[b"abc", GET].concat()), 0);
    }

    #[test]
    fn what_is_not_framed_for_sure_stops_the_count() {
        for first in [
            &b"*1\r\n$4\r\nPING\r\n"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            let mut p = Pipeline::default();
            p.client(first);
            assert_eq!(p.client(&[GET, GET].concat()), 0, "{first:?}");
            assert_eq!(p.state, State::Off, "{first:?}");
        }
        // A head that never ends is buffered up to its bound.
        let mut p = Pipeline::default();
        p.client(b"GET /");
        for _ in 0..MAX_HEAD {
            p.client(b"a");
        }
        assert_eq!(p.state, State::Off);
        assert_eq!(p.head.capacity(), 0, "released");
    }

    #[test]
    fn the_fuzz_body_holds_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("copy_pipeline");
        assert!(!seeds.is_empty());
        for seed in seeds {
            fuzz_pipeline(&seed.bytes);
        }
    }

    #[test]
    fn fuzz_body_holds_on_plain_streams() {
        fuzz_pipeline(
            &[3u8]
                .iter()
                .chain([GET, GET, GET].concat().iter())
                .copied()
                .collect::<Vec<_>>(),
        );
        fuzz_pipeline(
            b"\x07POST /f HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n",
        );
    }
}
