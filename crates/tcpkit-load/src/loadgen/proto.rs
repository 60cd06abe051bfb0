//! Payloads: how a query is written and where its answer ends. Answers are read as a stream
//! of chunks with a few bytes of state per connection ([`Rx`]); only DNS answers split
//! across reads and the line being parsed of an HTTP head are buffered (in the connection's
//! lazily allocated `rbuf`), so an idle connection holds no buffer at all.
//!
//! Answers come back in order for every payload but DNS, whose answers carry the query ID and
//! may come in any order.

use std::collections::VecDeque;

use tcpkit_wire::dns;
use tcpkit_wire::http::{Body, Event, HttpError, ResponseFramer};

use tcpkit_wire::h2::doh;

use super::config::{DohMethod, Http2, Payload, ResponseEnd};
use super::h2::{H2Proto, HTTP_STATUS_BASE};

/// A query in flight on one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub seq: u32,
    /// Intended and actual send times, ns after the query phase's start.
    pub intended: u64,
    pub sent: u64,
}

/// Per-connection parse state (40 bytes, no heap). Meaning per payload: echo/file-len: `a` = bytes of
/// the current answer seen; delimiter: `b` = delimiter bytes matched, `a` = answer bytes;
/// redis: `a` = position in `+PONG\r\n`, `phase` 1 = inside an error line; http: the
/// framer (the head of a response split across reads waits in the connection's `rbuf`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rx {
    a: u64,
    b: u32,
    phase: u8,
    http: ResponseFramer,
}

impl Default for Rx {
    fn default() -> Rx {
        Rx {
            a: 0,
            b: 0,
            phase: 0,
            // Bodies are counted, not kept; the bound says when an answer is not believable.
            http: ResponseFramer::new(MAX_OPEN_ANSWER),
        }
    }
}

/// One complete answer: the DNS ID it carries (None: the oldest query's answer) and its code
/// (DNS RCODE, HTTP status, 1 for a Redis error, [`ECHOED`] for a DNS query sent back, else 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub id: Option<u16>,
    pub code: u16,
}

/// An answer that breaks the protocol: the connection's stream cannot be trusted past it.
#[derive(Debug, Clone)]
pub(crate) struct BadAnswer {
    /// Counted under this name in the report's errors.
    pub kind: &'static str,
    pub detail: String,
}

fn bad(kind: &'static str, detail: impl Into<String>) -> BadAnswer {
    BadAnswer {
        kind,
        detail: detail.into(),
    }
}

/// Longest answer accepted where the protocol sets no bound (delimiter, HTTP body or chunk).
const MAX_OPEN_ANSWER: u64 = 64 << 20;
/// Longest Redis error line.
const MAX_ERROR_LINE: u64 = 64 << 10;
/// Codes are counted in a per-thread array of this size (DNS RCODEs and HTTP statuses fit).
pub(crate) const CODES: usize = 1000;
/// The code of a DNS "answer" that is the query itself (QR clear, same ID), as a plain echo
/// server sends it back: tcpclient counts it as the answer, so does load, apart from the
/// answers with an RCODE.
pub(crate) const ECHOED: u16 = u16::MAX;

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
const PONG: &[u8] = b"+PONG\r\n";

/// The payload, ready to write queries and read answers.
#[derive(Debug)]
pub(crate) struct Proto {
    kind: Kind,
    /// DNS over UDP: queries without the TCP length prefix, one per datagram, and answers
    /// read one per datagram ([`Proto::feed_datagram`]).
    udp: bool,
    /// HTTP/2 (`--http2`, `--doh`): requests go on streams ([`super::h2`]), not through
    /// `write_query`/`feed`.
    pub h2: Option<H2Proto>,
}

#[derive(Debug)]
enum Kind {
    Dns {
        queries: Vec<(dns::Name, u16)>,
    },
    Echo {
        len: u32,
    },
    FileLen {
        query: Vec<u8>,
        len: u64,
    },
    FileDelim {
        query: Vec<u8>,
        delim: Vec<u8>,
        fail: Vec<u32>,
    },
    Redis,
    Http {
        request: Vec<u8>,
    },
    /// DoH over HTTP/1.1: the request line's start, the headers after it (the path's query
    /// string or the body goes between), and the questions.
    Doh {
        queries: Vec<(dns::Name, u16)>,
        method: DohMethod,
        path: String,
        headers: Vec<u8>,
    },
}

impl Proto {
    /// `udp` only with DNS (the binary refuses other payloads with --udp).
    pub(crate) fn new(p: &Payload, udp: bool) -> Proto {
        let kind = match p {
            Payload::Dns { queries } => Kind::Dns {
                queries: queries.clone(),
            },
            Payload::Echo { len } => Kind::Echo { len: *len },
            Payload::File {
                query,
                end: ResponseEnd::Len(n),
            } => Kind::FileLen {
                query: query.clone(),
                len: *n,
            },
            Payload::File {
                query,
                end: ResponseEnd::Delim(d),
            } => Kind::FileDelim {
                query: query.clone(),
                fail: kmp_table(d),
                delim: d.clone(),
            },
            Payload::RedisPing => Kind::Redis,
            Payload::HttpGet {
                path,
                host,
                headers,
            } => Kind::Http {
                request: http_request(path, host, headers),
            },
            Payload::Doh {
                queries,
                method,
                path,
                host,
                headers,
            } => Kind::Doh {
                queries: queries.clone(),
                method: *method,
                path: path.clone(),
                headers: doh_headers(host, headers, *method),
            },
        };
        Proto {
            udp: udp && matches!(kind, Kind::Dns { .. }),
            kind,
            h2: None,
        }
    }

    /// The same payload over HTTP/2 (h2c in clear, h2 over TLS) when `http2` is given.
    pub(crate) fn with_http2(mut self, p: &Payload, http2: Option<Http2>, tls: bool) -> Proto {
        let scheme = if tls { "https" } else { "http" };
        self.h2 = http2.and_then(|h| H2Proto::new(p, h, scheme));
        self
    }

    /// One answer datagram (UDP): a whole DNS message, no prefix.
    pub(crate) fn feed_datagram(&self, msg: &[u8]) -> Result<Answer, BadAnswer> {
        dns_answer(msg)
    }

    /// True when answers carry an ID (DNS): a timed-out query can be forgotten alone. For the
    /// in-order payloads a timeout leaves the stream ambiguous, so the connection is closed.
    pub(crate) fn matched_by_id(&self) -> bool {
        matches!(self.kind, Kind::Dns { .. }) || self.h2.is_some()
    }

    /// The name a code is reported under.
    pub(crate) fn code_name(&self, code: u16) -> String {
        match self.kind {
            Kind::Dns { .. } => dns::rcode_name(code as u8).to_string(),
            Kind::Http { .. } => code.to_string(),
            Kind::Doh { .. } if code >= HTTP_STATUS_BASE => {
                format!("HTTP {}", code - HTTP_STATUS_BASE)
            }
            Kind::Doh { .. } => dns::rcode_name(code as u8).to_string(),
            Kind::Redis if code == 1 => "ERR".into(),
            Kind::Redis => "PONG".into(),
            _ => "ok".into(),
        }
    }

    /// Appends query `seq` of the connection keyed `key` to `out`; `name_idx` picks the DNS
    /// name (callers pass a running counter).
    pub(crate) fn write_query(&self, out: &mut Vec<u8>, key: u64, seq: u32, name_idx: usize) {
        match &self.kind {
            Kind::Dns { queries } => {
                // Per-connection IDs: the sequence number's low 16 bits, unique among the
                // (at most MAX_PENDING) queries in flight on one connection.
                let (name, qtype) = &queries[name_idx % queries.len()];
                let start = out.len();
                dns::write_tcp_query(out, seq as u16, name, *qtype);
                if self.udp {
                    // A datagram carries its own length: no prefix (a few dozen bytes moved).
                    out.drain(start..start + 2);
                }
            }
            Kind::Echo { len } => {
                let start = out.len();
                out.resize(start + *len as usize, 0);
                echo_fill(&mut out[start..], key, seq, 0);
            }
            Kind::FileLen { query, .. } | Kind::FileDelim { query, .. } => {
                out.extend_from_slice(query);
            }
            Kind::Redis => out.extend_from_slice(PING),
            Kind::Http { request } => out.extend_from_slice(request),
            Kind::Doh {
                queries,
                method,
                path,
                headers,
            } => {
                let (name, qtype) = &queries[name_idx % queries.len()];
                // The query (ID 0, RFC 8484 §4.1) is built at the end of `out`, copied to the
                // stack and cut off again: no allocation per query.
                let start = out.len();
                dns::write_tcp_query(out, 0, name, *qtype);
                let mut msg = [0u8; 2 + 12 + 256 + 4];
                let len = out.len() - start - 2;
                msg[..len].copy_from_slice(&out[start + 2..]);
                out.truncate(start);
                let msg = &msg[..len];
                match method {
                    DohMethod::Get => {
                        out.extend_from_slice(b"GET ");
                        out.extend_from_slice(path.as_bytes());
                        out.extend_from_slice(b"?dns=");
                        doh::encode(out, msg);
                        out.extend_from_slice(b" HTTP/1.1\r\n");
                        out.extend_from_slice(headers);
                        out.extend_from_slice(b"\r\n");
                    }
                    DohMethod::Post => {
                        out.extend_from_slice(b"POST ");
                        out.extend_from_slice(path.as_bytes());
                        out.extend_from_slice(b" HTTP/1.1\r\n");
                        out.extend_from_slice(headers);
                        out.extend_from_slice(b"Content-Length: ");
                        out.extend_from_slice(len.to_string().as_bytes());
                        out.extend_from_slice(b"\r\n\r\n");
                        out.extend_from_slice(msg);
                    }
                }
            }
        }
    }

    /// Reads `data`, the next bytes from the connection keyed `key`, whose queries in flight
    /// are `pending` (oldest first). Complete answers are appended to `out`; for in-order
    /// payloads the k-th answer in `out` answers `pending[k]`.
    pub(crate) fn feed(
        &self,
        rx: &mut Rx,
        rbuf: &mut Vec<u8>,
        pending: &VecDeque<Pending>,
        key: u64,
        data: &[u8],
        out: &mut Vec<Answer>,
    ) -> Result<(), BadAnswer> {
        match &self.kind {
            Kind::Dns { .. } => feed_dns(rbuf, data, out),
            Kind::Echo { len } => {
                let mut d = data;
                while !d.is_empty() {
                    let Some(head) = pending.get(out.len()) else {
                        return Err(unsolicited(d));
                    };
                    let want = u64::from(*len) - rx.a;
                    let n = (want.min(d.len() as u64)) as usize;
                    if let Some(at) = echo_mismatch(&d[..n], key, head.seq, rx.a) {
                        return Err(bad(
                            "echo mismatch",
                            format!(
                                "answer to query {} differs from the query at byte {at}",
                                head.seq
                            ),
                        ));
                    }
                    rx.a += n as u64;
                    d = &d[n..];
                    if rx.a == u64::from(*len) {
                        rx.a = 0;
                        out.push(Answer { id: None, code: 0 });
                    }
                }
                Ok(())
            }
            Kind::FileLen { len, .. } => {
                let mut d = data;
                while !d.is_empty() {
                    if pending.len() <= out.len() {
                        return Err(unsolicited(d));
                    }
                    let n = ((len - rx.a).min(d.len() as u64)) as usize;
                    rx.a += n as u64;
                    d = &d[n..];
                    if rx.a == *len {
                        rx.a = 0;
                        out.push(Answer { id: None, code: 0 });
                    }
                }
                Ok(())
            }
            Kind::FileDelim { delim, fail, .. } => {
                for &byte in data {
                    if pending.len() <= out.len() {
                        return Err(unsolicited(data));
                    }
                    let mut m = rx.b as usize;
                    while m > 0 && delim[m] != byte {
                        m = fail[m - 1] as usize;
                    }
                    if delim[m] == byte {
                        m += 1;
                    }
                    rx.a += 1;
                    if m == delim.len() {
                        rx.a = 0;
                        m = 0;
                        out.push(Answer { id: None, code: 0 });
                    } else if rx.a > MAX_OPEN_ANSWER {
                        return Err(bad(
                            "oversized answer",
                            format!("no delimiter in {MAX_OPEN_ANSWER} bytes"),
                        ));
                    }
                    rx.b = m as u32;
                }
                Ok(())
            }
            Kind::Redis => {
                for &byte in data {
                    if pending.len() <= out.len() {
                        return Err(unsolicited(data));
                    }
                    if rx.phase == 1 {
                        // An error reply (`-ERR ...\r\n`): skip to the end of its line.
                        rx.a += 1;
                        if byte == b'\n' {
                            rx.phase = 0;
                            rx.a = 0;
                            out.push(Answer { id: None, code: 1 });
                        } else if rx.a > MAX_ERROR_LINE {
                            return Err(bad("oversized answer", "Redis error line too long"));
                        }
                        continue;
                    }
                    if rx.a == 0 && byte == b'-' {
                        rx.phase = 1;
                        rx.a = 1;
                        continue;
                    }
                    if PONG[rx.a as usize] != byte {
                        return Err(bad(
                            "garbage",
                            format!("expected +PONG, byte {} is {byte:#04x}", rx.a),
                        ));
                    }
                    rx.a += 1;
                    if rx.a as usize == PONG.len() {
                        rx.a = 0;
                        out.push(Answer { id: None, code: 0 });
                    }
                }
                Ok(())
            }
            Kind::Doh { .. } => feed_http(rx, rbuf, pending, data, out, true),
            Kind::Http { .. } => feed_http(rx, rbuf, pending, data, out, false),
        }
    }
}

/// HTTP/1.1 answers, each coded by its status. With `doh`, the body (at most a DNS message)
/// is kept in `rbuf` once the head is done with it and parsed as DNS at the end: the answer's
/// code is its RCODE, or [`HTTP_STATUS_BASE`] + a status other than 200.
fn feed_http(
    rx: &mut Rx,
    rbuf: &mut Vec<u8>,
    pending: &VecDeque<Pending>,
    data: &[u8],
    out: &mut Vec<Answer>,
    doh: bool,
) -> Result<(), BadAnswer> {
    let mut d = data;
    loop {
        if !d.is_empty() && pending.len() <= out.len() && rx.http.at_message_start() {
            return Err(unsolicited(d));
        }
        let step = rx.http.feed(d, rbuf).map_err(bad_http)?;
        match step.event {
            Event::More => break,
            Event::Head(h) => {
                if h.body == Body::UntilClose {
                    return Err(bad(
                        "malformed HTTP answer",
                        format!("status {} without Content-Length or chunked encoding on a keep-alive connection", h.status),
                    ));
                }
                if doh {
                    // From here the buffer holds the body.
                    rbuf.clear();
                } else if h.buffered {
                    // Idle connections hold no buffer.
                    *rbuf = Vec::new();
                }
            }
            Event::Body { .. } if !doh => {}
            Event::Body { from } => {
                let body = &d[from..step.used];
                if rbuf.len() + body.len() > 65_535 {
                    return Err(bad("oversized answer", "a DoH body over 65535 bytes"));
                }
                rbuf.extend_from_slice(body);
            }
            // An interim answer (1xx): the real one follows.
            Event::End if rx.http.status() < 200 => {}
            Event::End if !doh => out.push(Answer {
                id: None,
                code: rx.http.status(),
            }),
            Event::End => {
                let status = rx.http.status();
                let code = if status == 200 {
                    let v = dns::parse_whole_response(rbuf)
                        .map_err(|e| bad("malformed DNS answer", format!("DoH body: {e}")))?;
                    u16::from(v.rcode)
                } else {
                    HTTP_STATUS_BASE + status.min(899)
                };
                // Idle connections hold no buffer.
                *rbuf = Vec::new();
                out.push(Answer { id: None, code });
            }
        }
        d = &d[step.used..];
    }
    Ok(())
}

/// DoH/1.1's headers after the request line (each with its CRLF; the blank line is the
/// caller's): Host, User-Agent, keep-alive, Accept, Content-Type for POST, then `-H`'s (one
/// named as a default takes its place).
fn doh_headers(host: &str, headers: &[String], method: DohMethod) -> Vec<u8> {
    let mut defaults = vec![
        ("host", format!("Host: {host}")),
        ("user-agent", "User-Agent: tcpkit-load".to_string()),
        ("connection", "Connection: keep-alive".to_string()),
        ("accept", format!("Accept: {}", doh::MEDIA_TYPE)),
    ];
    if method == DohMethod::Post {
        defaults.push(("content-type", format!("Content-Type: {}", doh::MEDIA_TYPE)));
    }
    header_lines(&defaults, headers).into_bytes()
}

/// The default header lines not named in `headers`, then `headers`, each ending in CRLF.
fn header_lines(defaults: &[(&str, String)], headers: &[String]) -> String {
    let name = |h: &str| {
        h.split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    };
    let given = |n: &str| headers.iter().any(|h| name(h) == n);
    let mut s = String::new();
    for (n, line) in defaults {
        if !given(n) {
            s.push_str(line);
            s.push_str("\r\n");
        }
    }
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s
}

/// Bytes nobody asked for; the first of them are quoted (a server often says why, e.g.
/// Redis in protected mode).
fn unsolicited(data: &[u8]) -> BadAnswer {
    let head = &data[..data.len().min(60)];
    bad(
        "unsolicited bytes",
        format!(
            "{} bytes arrived with no query in flight: \"{}\"",
            data.len(),
            head.escape_ascii()
        ),
    )
}

/// One DNS message (no prefix) as an answer.
fn dns_answer(msg: &[u8]) -> Result<Answer, BadAnswer> {
    if msg.get(2).is_some_and(|flags| flags & 0x80 == 0) {
        // QR clear: the query came back. A well-formed query with a query's ID is what an
        // echo server sends; anything else is as malformed as a bad answer.
        let q = dns::parse_query(msg).map_err(|e| bad("malformed DNS answer", e.to_string()))?;
        Ok(Answer {
            id: Some(q.id),
            code: ECHOED,
        })
    } else {
        // Whole: bytes after the last record (a padded answer) make it malformed, not NOERROR.
        let v = dns::parse_whole_response(msg)
            .map_err(|e| bad("malformed DNS answer", e.to_string()))?;
        Ok(Answer {
            id: Some(v.id),
            code: u16::from(v.rcode),
        })
    }
}

fn feed_dns(rbuf: &mut Vec<u8>, data: &[u8], out: &mut Vec<Answer>) -> Result<(), BadAnswer> {
    fn take(rest: &mut &[u8], out: &mut Vec<Answer>) -> Result<(), BadAnswer> {
        while let Some(len) = dns::tcp_message_len(rest) {
            out.push(dns_answer(&rest[2..len])?);
            *rest = &rest[len..];
        }
        Ok(())
    }
    if rbuf.is_empty() {
        let mut rest = data;
        take(&mut rest, out)?;
        rbuf.extend_from_slice(rest);
    } else {
        rbuf.extend_from_slice(data);
        let mut rest: &[u8] = rbuf;
        take(&mut rest, out)?;
        let used = rbuf.len() - rest.len();
        rbuf.drain(..used);
    }
    if rbuf.is_empty() && rbuf.capacity() > 0 {
        // Idle connections hold no buffer.
        *rbuf = Vec::new();
    }
    Ok(())
}

/// An HTTP framing error as a counted bad answer.
/// `GET path HTTP/1.1` with the default headers (Host, User-Agent, keep-alive), each
/// replaced by a header of `headers` of the same name (as wrk's -H does), then the others.
fn http_request(path: &str, host: &str, headers: &[String]) -> Vec<u8> {
    let defaults = [
        ("host", format!("Host: {host}")),
        ("user-agent", "User-Agent: tcpkit-load".to_string()),
        ("connection", "Connection: keep-alive".to_string()),
    ];
    format!(
        "GET {path} HTTP/1.1\r\n{}\r\n",
        header_lines(&defaults, headers)
    )
    .into_bytes()
}

fn bad_http(e: HttpError) -> BadAnswer {
    let kind = match e {
        HttpError::TooLarge(_) | HttpError::HeadTooLong | HttpError::TrailersTooLong => {
            "oversized answer"
        }
        _ => "malformed HTTP answer",
    };
    bad(kind, e.to_string())
}

/// KMP failure function: `fail[i]` = length of the longest proper border of `d[..=i]`.
fn kmp_table(d: &[u8]) -> Vec<u32> {
    let mut fail = vec![0u32; d.len()];
    let mut k = 0usize;
    for i in 1..d.len() {
        while k > 0 && d[i] != d[k] {
            k = fail[k - 1] as usize;
        }
        if d[i] == d[k] {
            k += 1;
        }
        fail[i] = k as u32;
    }
    fail
}

/// Echo bytes are a function of (connection key, query, position), so an answer is checked
/// without keeping the query: SplitMix64 of a per-(key, query) seed plus the word index.
fn echo_word(key: u64, seq: u32, word: u64) -> u64 {
    let mut z = key
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(seq).wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(word.wrapping_mul(0x94D0_49BB_1331_11EB))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn echo_byte(key: u64, seq: u32, pos: u64) -> u8 {
    (echo_word(key, seq, pos / 8) >> ((pos % 8) * 8)) as u8
}

/// Fills `out` with the echo bytes at positions `from..`.
pub(crate) fn echo_fill(out: &mut [u8], key: u64, seq: u32, from: u64) {
    let mut pos = from;
    for chunk in out.chunks_mut(8) {
        if pos.is_multiple_of(8) && chunk.len() == 8 {
            chunk.copy_from_slice(&echo_word(key, seq, pos / 8).to_le_bytes());
        } else {
            for (i, b) in chunk.iter_mut().enumerate() {
                *b = echo_byte(key, seq, pos + i as u64);
            }
        }
        pos += chunk.len() as u64;
    }
}

/// The first position in `got` (which starts at answer byte `from`) that differs.
fn echo_mismatch(got: &[u8], key: u64, seq: u32, from: u64) -> Option<u64> {
    got.iter()
        .enumerate()
        .find(|(i, &b)| b != echo_byte(key, seq, from + *i as u64))
        .map(|(i, _)| from + i as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pend(n: u32) -> VecDeque<Pending> {
        (0..n)
            .map(|seq| Pending {
                seq,
                intended: 0,
                sent: 0,
            })
            .collect()
    }

    /// Feeds `stream` in one piece to a fresh connection, `key` its number.
    fn feed_once(
        p: &Proto,
        stream: &[u8],
        pending: &VecDeque<Pending>,
        key: u64,
    ) -> Result<Vec<Answer>, BadAnswer> {
        let (mut rx, mut rbuf, mut out) = (Rx::default(), Vec::new(), Vec::new());
        p.feed(&mut rx, &mut rbuf, pending, key, stream, &mut out)?;
        Ok(out)
    }

    /// Feeds `stream` cut at every position into two chunks; returns the answers.
    fn every_cut(p: &Proto, stream: &[u8], pending: &VecDeque<Pending>) -> Vec<Answer> {
        let mut first = None;
        for cut in 0..=stream.len() {
            let (mut rx, mut rbuf, mut out) = (Rx::default(), Vec::new(), Vec::new());
            p.feed(&mut rx, &mut rbuf, pending, 7, &stream[..cut], &mut out)
                .unwrap();
            p.feed(&mut rx, &mut rbuf, pending, 7, &stream[cut..], &mut out)
                .unwrap();
            match &first {
                None => first = Some(out),
                Some(f) => assert_eq!(&out, f, "cut at {cut}"),
            }
        }
        first.unwrap()
    }

    #[test]
    fn echo_answers_are_checked_across_cuts() {
        let p = Proto::new(&Payload::Echo { len: 13 }, false);
        let mut stream = Vec::new();
        p.write_query(&mut stream, 7, 0, 0);
        p.write_query(&mut stream, 7, 1, 0);
        assert_eq!(stream.len(), 26);
        assert_ne!(stream[..13], stream[13..], "queries differ");
        let out = every_cut(&p, &stream, &pend(2));
        assert_eq!(out.len(), 2);
        // A flipped byte is caught and named.
        let mut bad_stream = stream.clone();
        bad_stream[17] ^= 1;
        let e = feed_once(&p, &bad_stream, &pend(2), 7).unwrap_err();
        assert_eq!(e.kind, "echo mismatch");
        assert!(
            e.detail.contains("query 1") && e.detail.contains("byte 4"),
            "{e:?}"
        );
        // Bytes nobody asked for.
        let e = feed_once(&p, b"x", &pend(0), 7).unwrap_err();
        assert_eq!(e.kind, "unsolicited bytes");
    }

    #[test]
    fn dns_answers_by_id_in_any_order() {
        let p = Proto::new(
            &Payload::Dns {
                queries: vec![("example.com".parse().unwrap(), 1)],
            },
            false,
        );
        let mut q = Vec::new();
        p.write_query(&mut q, 0, 0x1234, 0);
        let query = &q[2..];
        let ans = |id: u16, rcode: u8| {
            let mut m = query.to_vec();
            m[0..2].copy_from_slice(&id.to_be_bytes());
            m[2] |= 0x80; // QR
            m[3] = (m[3] & 0xf0) | rcode;
            let mut framed = (m.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&m);
            framed
        };
        let mut stream = ans(5, 0);
        stream.extend(ans(3, 3));
        let out = every_cut(&p, &stream, &pend(0));
        assert_eq!(
            out,
            [
                Answer {
                    id: Some(5),
                    code: 0
                },
                Answer {
                    id: Some(3),
                    code: 3
                }
            ]
        );
        assert_eq!(p.code_name(3), "NXDOMAIN");
        // A query echoed back is an answer of its own kind (issue 10, case 5), at every cut.
        let out = every_cut(&p, &q, &pend(1));
        assert_eq!(
            out,
            [Answer {
                id: Some(0x1234),
                code: ECHOED
            }]
        );
        // A "query" that is not one (two questions) is malformed, echoed or not.
        let mut two = q.clone();
        two[7] = 2;
        let e = feed_once(&p, &two, &pend(1), 0).unwrap_err();
        assert_eq!(e.kind, "malformed DNS answer");
        // Garbage inside a declared maximum-size message: one malformed answer, no panic.
        let mut big = vec![0xff, 0xff];
        big.extend(std::iter::repeat_n(0xa5u8, 65535));
        assert!(feed_once(&p, &big, &pend(1), 0).is_err());
    }

    /// --udp: a query is the bare message (no length prefix); an answer is one datagram.
    #[test]
    fn dns_over_udp_has_no_prefix() {
        let payload = Payload::Dns {
            queries: vec![("example.com".parse().unwrap(), 28)],
        };
        let (tcp, udp) = (Proto::new(&payload, false), Proto::new(&payload, true));
        let (mut t, mut u) = (vec![0xa5], vec![0xa5]);
        tcp.write_query(&mut t, 0, 7, 0);
        udp.write_query(&mut u, 0, 7, 0);
        assert_eq!(u[0], 0xa5);
        assert_eq!(&u[1..], &t[3..]);
        let mut answer = u[1..].to_vec();
        answer[2] |= 0x80; // QR
        answer[3] |= 3; // NXDOMAIN
        assert_eq!(
            udp.feed_datagram(&answer).unwrap(),
            Answer {
                id: Some(7),
                code: 3
            }
        );
        assert_eq!(udp.feed_datagram(&u[1..]).unwrap().code, ECHOED);
        assert!(udp.feed_datagram(&answer[..11]).is_err());
        // Not DNS: no UDP form.
        assert!(!Proto::new(&Payload::Echo { len: 8 }, true).udp);
    }

    #[test]
    fn file_payload_by_length_and_by_delimiter() {
        let p = Proto::new(
            &Payload::File {
                query: b"hello".to_vec(),
                end: ResponseEnd::Len(3),
            },
            false,
        );
        assert_eq!(every_cut(&p, b"abcdef", &pend(2)).len(), 2);
        // A self-overlapping delimiter: "aab" inside "aaab" must match.
        let p = Proto::new(
            &Payload::File {
                query: b"q".to_vec(),
                end: ResponseEnd::Delim(b"aab".to_vec()),
            },
            false,
        );
        assert_eq!(every_cut(&p, b"xaaabyyaab", &pend(2)).len(), 2);
        assert_eq!(kmp_table(b"abab"), [0, 0, 1, 2]);
    }

    #[test]
    fn redis_pong_error_and_garbage() {
        let p = Proto::new(&Payload::RedisPing, false);
        let mut q = Vec::new();
        p.write_query(&mut q, 0, 0, 0);
        assert_eq!(q, b"*1\r\n$4\r\nPING\r\n");
        let out = every_cut(&p, b"+PONG\r\n-ERR busy\r\n+PONG\r\n", &pend(3));
        let codes: Vec<u16> = out.iter().map(|a| a.code).collect();
        assert_eq!(codes, [0, 1, 0]);
        assert_eq!(p.code_name(1), "ERR");
        let e = feed_once(&p, b"+PANG\r\n", &pend(1), 0).unwrap_err();
        assert_eq!(e.kind, "garbage");
    }

    /// -H headers as wrk sends them: one named as a default (any case) takes its place.
    #[test]
    fn http_headers_replace_the_defaults_of_their_name() {
        let req = http_request("/a", "h", &["host: other:81".into(), "X-Trace: 1".into()]);
        assert_eq!(
            String::from_utf8(req).unwrap(),
            "GET /a HTTP/1.1\r\nUser-Agent: tcpkit-load\r\nConnection: keep-alive\r\nhost: other:81\r\nX-Trace: 1\r\n\r\n"
        );
    }

    #[test]
    fn http_content_length_chunked_and_no_body() {
        let p = Proto::new(
            &Payload::HttpGet {
                path: "/x".into(),
                host: "h:8080".into(),
                headers: Vec::new(),
            },
            false,
        );
        let mut q = Vec::new();
        p.write_query(&mut q, 0, 0, 0);
        assert!(q.starts_with(b"GET /x HTTP/1.1\r\nHost: h:8080\r\n"));
        let stream = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello\
HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\n\r\n\
HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        let out = every_cut(&p, stream, &pend(3));
        let codes: Vec<u16> = out.iter().map(|a| a.code).collect();
        assert_eq!(codes, [200, 404, 204]);
        let e = feed_once(&p, b"SSH-2.0-OpenSSH\r\n", &pend(1), 0).unwrap_err();
        assert_eq!(e.kind, "malformed HTTP answer");
        let e = feed_once(&p, b"HTTP/1.0 200 OK\r\n\r\n", &pend(1), 0).unwrap_err();
        assert!(e.detail.contains("without Content-Length"), "{e:?}");
    }

    /// --doh --http1: the two request forms, and answers parsed as DNS at every cut (a
    /// status other than 200 counted apart from the RCODEs).
    #[test]
    fn doh_over_http1_requests_and_answers() {
        let mk = |method| {
            Proto::new(
                &Payload::Doh {
                    queries: vec![("example.com".parse().unwrap(), 1)],
                    method,
                    path: "/dns-query".into(),
                    host: "h".into(),
                    headers: Vec::new(),
                },
                false,
            )
        };
        let (get, post) = (mk(DohMethod::Get), mk(DohMethod::Post));
        let mut q = Vec::new();
        get.write_query(&mut q, 0, 0, 0);
        let text = String::from_utf8(q.clone()).unwrap();
        assert!(
            text.starts_with("GET /dns-query?dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE HTTP/1.1\r\nHost: h\r\n"),
            "{text}"
        );
        assert!(text.contains("Accept: application/dns-message\r\n") && text.ends_with("\r\n\r\n"));
        let mut p = Vec::new();
        post.write_query(&mut p, 0, 0, 0);
        let mut msg = Vec::new();
        tcpkit_wire::dns::write_tcp_query(&mut msg, 0, &"example.com".parse().unwrap(), 1);
        assert!(p.ends_with(&msg[2..]));
        assert!(String::from_utf8_lossy(&p).contains("Content-Length: 29\r\n"));
        // An answer: the query with QR and NXDOMAIN.
        let mut answer = msg[2..].to_vec();
        answer[2] |= 0x80;
        answer[3] |= 3;
        let mut stream = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/dns-message\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        )
        .into_bytes();
        stream.extend_from_slice(&answer);
        stream.extend_from_slice(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno");
        let out = every_cut(&post, &stream, &pend(2));
        let codes: Vec<u16> = out.iter().map(|a| a.code).collect();
        assert_eq!(codes, [3, HTTP_STATUS_BASE + 404]);
        assert_eq!(post.code_name(3), "NXDOMAIN");
        assert_eq!(post.code_name(HTTP_STATUS_BASE + 404), "HTTP 404");
        // A 200 whose body is not DNS is a malformed answer.
        let e = feed_once(
            &post,
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
            &pend(1),
            0,
        )
        .unwrap_err();
        assert_eq!(e.kind, "malformed DNS answer");
    }

    #[test]
    fn echo_fill_matches_bytewise_at_any_offset() {
        let mut a = vec![0u8; 40];
        echo_fill(&mut a, 9, 4, 0);
        let mut b = vec![0u8; 29];
        echo_fill(&mut b, 9, 4, 11);
        assert_eq!(a[11..], b[..]);
        assert_eq!(echo_mismatch(&a[3..], 9, 4, 3), None);
    }
}
