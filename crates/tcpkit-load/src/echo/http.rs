//! `tcpkit echo --http`: HTTP/1.1 keep-alive and HTTP/2 (h2c: the client's preface with
//! prior knowledge tells them apart) answering every request at once, and DNS over HTTPS
//! (RFC 8484, GET `?dns=` and POST `application/dns-message`) on `/dns-query`, so that load's
//! --http-get, --http2 and --doh have a reference server that is never the limit.
//!
//! Bounded as every echo peer: a request head or an HTTP/2 frame is taken only within half
//! the connection's buffer (`--max-conn-buf`), a request body likewise; HTTP/2 announces the
//! streams it takes at once ([`MAX_STREAMS`]) and refuses more; a connection holding an
//! incomplete request or frame has `--partial-timeout` to finish it; the first-message
//! deadline and the connection cap are the loop's, as in the other modes.

use std::net::{Ipv4Addr, Ipv6Addr};

use tcpkit_wire::dns;
use tcpkit_wire::h2::{self, doh, hpack, Endpoint, Event, Limits};

/// Streams an HTTP/2 connection may have open at once (announced in SETTINGS).
pub const MAX_STREAMS: u32 = 256;
/// The body of an answer that is not DoH.
const BODY: &[u8] = b"tcpkit echo\n";
/// Headers of one HTTP/1 request at most.
const MAX_HEADERS: usize = 32;

/// A connection's HTTP state, made at its first byte.
#[derive(Debug)]
pub(super) enum HttpConn {
    /// HTTP/1.1: the start of a request (head, or head and part of its body) in `input`.
    H1 { input: Vec<u8> },
    /// HTTP/2; DoH POST bodies still arriving, by stream.
    H2 {
        ep: Box<Endpoint>,
        bodies: Vec<(u32, Vec<u8>)>,
        held: usize,
    },
}

/// What a round of input ended with.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Fed {
    /// Keep the connection; `partial` when it holds an incomplete request or frame.
    Keep { answered: u64, partial: bool },
    /// Close it once `out` is written (a protocol error: `malformed` requests counted).
    Close { answered: u64, malformed: u64 },
}

/// DoH's answers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answers {
    pub a: Ipv4Addr,
    pub aaaa: Ipv6Addr,
    /// Half the connection's buffer: the bound of a head, a frame's worth of bodies.
    pub window: usize,
}

impl HttpConn {
    /// The state for a connection whose first bytes are `first`; HTTP/2's SETTINGS go into
    /// `out`.
    pub(super) fn new(first: &[u8], ans: &Answers, out: &mut Vec<u8>) -> HttpConn {
        let n = first.len().min(h2::PREFACE.len());
        if first[..n] == h2::PREFACE[..n] && n > 0 {
            let mut ep = Endpoint::server(Limits {
                max_streams: MAX_STREAMS,
                stream_window: 1 << 16,
                conn_window: 1 << 20,
                max_header_list: (ans.window as u32).clamp(1024, 16 << 10),
                max_queued: ans.window,
            });
            ep.start(out);
            HttpConn::H2 {
                ep: Box::new(ep),
                bodies: Vec::new(),
                held: 0,
            }
        } else {
            HttpConn::H1 { input: Vec::new() }
        }
    }

    /// Takes `data`, appending the answers to `out`.
    pub(super) fn feed(&mut self, data: &[u8], out: &mut Vec<u8>, ans: &Answers) -> Fed {
        match self {
            HttpConn::H1 { input } => feed_h1(input, data, out, ans),
            HttpConn::H2 { ep, bodies, held } => feed_h2(ep, bodies, held, data, out, ans),
        }
    }
}

fn feed_h2(
    ep: &mut Endpoint,
    bodies: &mut Vec<(u32, Vec<u8>)>,
    held: &mut usize,
    data: &[u8],
    out: &mut Vec<u8>,
    ans: &Answers,
) -> Fed {
    let mut input = data;
    let mut answered = 0;
    let mut block = Vec::new();
    let mut body = Vec::new();
    loop {
        let ev = match ep.next(&mut input, out) {
            Ok(Some(ev)) => ev,
            Ok(None) => break,
            Err(_) => {
                return Fed::Close {
                    answered,
                    malformed: 1,
                }
            }
        };
        match ev {
            Event::Headers {
                stream, end_stream, ..
            } => {
                let method = ep.field(b":method").unwrap_or_default();
                let path = ep.field(b":path").unwrap_or_default();
                let post_doh =
                    method == b"POST" && doh::path_only(path) == doh::DEFAULT_PATH.as_bytes();
                if end_stream || !post_doh {
                    // Whatever body a request other than a DoH POST has is read and dropped.
                    block.clear();
                    body.clear();
                    let status = answer(method, path, None, &mut body, ans);
                    respond_h2(ep, stream, status, &body, &mut block, out);
                    answered += 1;
                } else {
                    ep.set_app(stream, 1);
                    bodies.push((stream, Vec::new()));
                }
            }
            Event::Data {
                stream,
                app,
                data,
                end_stream,
            } => {
                if app != 1 {
                    continue;
                }
                let Some(k) = bodies.iter().position(|b| b.0 == stream) else {
                    continue;
                };
                if *held + data.len() > ans.window {
                    let mut rst = Vec::new();
                    ep.reset(stream, h2::code::ENHANCE_YOUR_CALM, &mut rst);
                    out.extend_from_slice(&rst);
                    *held -= bodies.swap_remove(k).1.len();
                    continue;
                }
                bodies[k].1.extend_from_slice(data);
                *held += data.len();
                if end_stream {
                    let (_, msg) = bodies.swap_remove(k);
                    *held -= msg.len();
                    block.clear();
                    body.clear();
                    let status = answer(
                        b"POST",
                        doh::DEFAULT_PATH.as_bytes(),
                        Some(&msg),
                        &mut body,
                        ans,
                    );
                    respond_h2(ep, stream, status, &body, &mut block, out);
                    answered += 1;
                }
            }
            Event::Reset { stream, .. } => {
                if let Some(k) = bodies.iter().position(|b| b.0 == stream) {
                    *held -= bodies.swap_remove(k).1.len();
                }
            }
            // A client going away closes its end; ours follows when it does.
            Event::GoAway { .. } | Event::Settings | Event::Control => {}
        }
    }
    Fed::Keep {
        answered,
        partial: !ep.quiet(),
    }
}

fn respond_h2(
    ep: &mut Endpoint,
    stream: u32,
    status: u16,
    body: &[u8],
    block: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    let ctype = (status == 200 && body != BODY).then_some(doh::MEDIA_TYPE);
    hpack::write_status(block, status, ctype, body.len());
    ep.respond(stream, block, body, out);
}

/// The answer to one request: its status, its body in `body`. `/dns-query` is DoH (the
/// query from GET's `dns` parameter or POST's body); any other GET, HEAD or POST gets 200
/// and [`BODY`]; other methods 405.
fn answer(
    method: &[u8],
    path: &[u8],
    post: Option<&[u8]>,
    body: &mut Vec<u8>,
    ans: &Answers,
) -> u16 {
    if doh::path_only(path) == doh::DEFAULT_PATH.as_bytes() {
        let mut buf = [0u8; 4096];
        let msg = match (method, post) {
            (b"POST", Some(m)) => Some(m),
            (b"GET", _) => doh::dns_param(path).and_then(|p| doh::decode(p, &mut buf)),
            _ => return 405,
        };
        let Some(msg) = msg else {
            return 400;
        };
        let Ok(q) = dns::parse_query(msg) else {
            return 400;
        };
        dns::write_tcp_response(body, msg, &q, ans.a, ans.aaaa);
        // The TCP length prefix is not part of a DoH body.
        body.drain(..2);
        return 200;
    }
    match method {
        b"GET" | b"HEAD" | b"POST" => {
            body.extend_from_slice(BODY);
            200
        }
        _ => 405,
    }
}

/// HTTP/1.1: every whole request in `input` + `data` answered in order; the start of the
/// next kept (at most `window` bytes: a longer head or body is refused and the connection
/// closed).
fn feed_h1(input: &mut Vec<u8>, data: &[u8], out: &mut Vec<u8>, ans: &Answers) -> Fed {
    input.extend_from_slice(data);
    let mut used = 0;
    let mut answered = 0;
    let mut body = Vec::new();
    let fed = loop {
        let rest = &input[used..];
        if rest.is_empty() {
            break Fed::Keep {
                answered,
                partial: false,
            };
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let head = match req.parse(rest) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if rest.len() < ans.window => {
                break Fed::Keep {
                    answered,
                    partial: true,
                }
            }
            _ => {
                let status = if rest.len() >= ans.window { 431 } else { 400 };
                h1_head(out, status, None, 0, true);
                break Fed::Close {
                    answered,
                    malformed: 1,
                };
            }
        };
        let mut len = 0usize;
        let mut close = false;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                match std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                {
                    Some(n) => len = n,
                    None => len = usize::MAX,
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                len = usize::MAX;
            } else if h.name.eq_ignore_ascii_case("connection")
                && h.value.eq_ignore_ascii_case(b"close")
            {
                close = true;
            }
        }
        if len > ans.window.saturating_sub(head) {
            h1_head(out, 413, None, 0, true);
            break Fed::Close {
                answered,
                malformed: 1,
            };
        }
        if rest.len() < head + len {
            break Fed::Keep {
                answered,
                partial: true,
            };
        }
        let method = req.method.unwrap_or_default().as_bytes();
        let path = req.path.unwrap_or_default().as_bytes();
        let post = (method == b"POST").then(|| &rest[head..head + len]);
        body.clear();
        let status = answer(method, path, post, &mut body, ans);
        let ctype = (status == 200 && body != BODY).then_some(doh::MEDIA_TYPE);
        h1_head(out, status, ctype, body.len(), close);
        if method != b"HEAD" {
            out.extend_from_slice(&body);
        }
        answered += 1;
        used += head + len;
        if close {
            break Fed::Close {
                answered,
                malformed: 0,
            };
        }
    };
    input.drain(..used);
    if input.is_empty() {
        // Idle connections hold no buffer.
        *input = Vec::new();
    }
    fed
}

fn h1_head(out: &mut Vec<u8>, status: u16, ctype: Option<&str>, len: usize, close: bool) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        _ => "Request Header Fields Too Large",
    };
    let _ = std::io::Write::write_fmt(
        out,
        format_args!("HTTP/1.1 {status} {reason}\r\nContent-Length: {len}\r\n"),
    );
    if let Some(t) = ctype {
        let _ = std::io::Write::write_fmt(out, format_args!("Content-Type: {t}\r\n"));
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ans() -> Answers {
        Answers {
            a: Ipv4Addr::new(198, 18, 0, 53),
            aaaa: Ipv6Addr::LOCALHOST,
            window: 8192,
        }
    }

    fn query() -> Vec<u8> {
        let mut q = Vec::new();
        dns::write_tcp_query(&mut q, 0, &"example.com".parse().unwrap(), 1);
        q.drain(..2);
        q
    }

    #[test]
    fn http1_get_post_doh_and_pipelining() {
        let a = ans();
        let mut c = HttpConn::new(b"GET", &a, &mut Vec::new());
        let mut get = b"GET /dns-query?dns=".to_vec();
        doh::encode(&mut get, &query());
        get.extend_from_slice(b" HTTP/1.1\r\nHost: h\r\n\r\n");
        let mut reqs = get.clone();
        reqs.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let q = query();
        reqs.extend_from_slice(
            format!(
                "POST /dns-query HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                q.len()
            )
            .as_bytes(),
        );
        reqs.extend_from_slice(&q);
        let mut out = Vec::new();
        // Cut in two anywhere, the same three answers.
        let mut first = None;
        for cut in 0..reqs.len() {
            let mut c2 = HttpConn::new(b"GET", &a, &mut Vec::new());
            let mut o = Vec::new();
            let f1 = c2.feed(&reqs[..cut], &mut o, &a);
            let f2 = c2.feed(&reqs[cut..], &mut o, &a);
            let n = [f1, f2]
                .iter()
                .map(|f| match f {
                    Fed::Keep { answered, .. } => *answered,
                    Fed::Close { .. } => panic!("closed at cut {cut}"),
                })
                .sum::<u64>();
            assert_eq!(n, 3, "cut {cut}");
            match &first {
                None => first = Some(o),
                Some(f) => assert_eq!(&o, f, "cut {cut}"),
            }
        }
        assert_eq!(
            c.feed(&reqs, &mut out, &a),
            Fed::Keep {
                answered: 3,
                partial: false
            }
        );
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 3, "{text}");
        assert_eq!(text.matches("application/dns-message").count(), 2);
        // A head longer than the window is refused.
        let mut c = HttpConn::new(b"GET", &a, &mut Vec::new());
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.resize(9000, b'a');
        let mut out = Vec::new();
        assert!(matches!(
            c.feed(&long, &mut out, &a),
            Fed::Close { malformed: 1, .. }
        ));
        assert!(out.starts_with(b"HTTP/1.1 431"));
    }

    #[test]
    fn http2_answers_get_and_doh_post_on_streams() {
        let a = ans();
        let mut client = Endpoint::client(Limits::default());
        let mut wire = Vec::new();
        client.start(&mut wire);
        let get = hpack::request_block("GET", "http", "h", "/", &[]);
        let post = hpack::request_block("POST", "http", "h", "/dns-query", &[]);
        client.open(1, &get, None, &mut wire);
        client.open(2, &post, Some(&query()), &mut wire);
        let mut back = Vec::new();
        let mut server = HttpConn::new(&wire, &a, &mut back);
        assert_eq!(
            server.feed(&wire, &mut back, &a),
            Fed::Keep {
                answered: 2,
                partial: false
            }
        );
        let mut input: &[u8] = &back;
        let mut got = Vec::new();
        let mut sink = Vec::new();
        while let Some(ev) = client.next(&mut input, &mut sink).unwrap() {
            if let Event::Data { app, data, .. } = ev {
                got.push((app, data.to_vec()));
            }
        }
        assert_eq!(got[0], (1, BODY.to_vec()));
        let v = dns::parse_whole_response(&got[1].1).unwrap();
        assert_eq!((got[1].0, v.id, v.answers), (2, 0, 1));
        // Not the preface: HTTP/1.
        assert!(matches!(
            HttpConn::new(b"PRX", &a, &mut Vec::new()),
            HttpConn::H1 { .. }
        ));
    }
}
