//! HTTP/2 for load (`--http2`, `--doh`): how a request is written on a connection's streams
//! and how the frames that come back become answers, over tcpkit-wire's sans-IO endpoint.
//! The engine keeps the schedule, the queries in flight and the sockets; this keeps what only
//! an HTTP/2 connection has (its endpoint, the status of a response whose body is still
//! coming, a DoH body split over frames).
//!
//! A request costs no allocation once a connection has warmed up: the header block is the
//! template built once plus the path (and DoH's base64url or content-length) written into a
//! reused buffer, and a DoH POST body is built on the stack.

use tcpkit_wire::dns;
use tcpkit_wire::h2::{self, doh, hpack, Endpoint, Event, Limits};

use super::config::{DohMethod, Http2, Payload};
use super::proto::BadAnswer;

/// A DoH answer's code when its HTTP status is not 200: this plus the status, so it is counted
/// apart from the RCODEs (`HTTP 404`); see [`super::proto::Proto::code_name`].
pub(crate) const HTTP_STATUS_BASE: u16 = 100;
/// Longest DoH answer body kept (a DNS message's own bound).
const MAX_DNS_BODY: usize = 65_535;

/// The requests of a run over HTTP/2.
#[derive(Debug)]
pub(crate) struct H2Proto {
    template: hpack::RequestTemplate,
    req: Req,
    /// `--h2-streams`.
    pub streams: u32,
}

#[derive(Debug)]
enum Req {
    Get {
        path: Vec<u8>,
    },
    Doh {
        queries: Vec<(dns::Name, u16)>,
        method: DohMethod,
        path: String,
    },
}

impl H2Proto {
    /// None for payloads HTTP/2 does not carry (the binary allows --http2 with HTTP only).
    pub(crate) fn new(p: &Payload, h: Http2, scheme: &str) -> Option<H2Proto> {
        let headers = |hs: &[String]| -> Vec<(String, String)> {
            hs.iter()
                .filter_map(|h| h.split_once(':'))
                .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
                .collect()
        };
        let (template, req) = match p {
            Payload::HttpGet {
                path,
                host,
                headers: hs,
            } => (
                hpack::RequestTemplate::new("GET", scheme, host, &headers(hs)),
                Req::Get {
                    path: path.as_bytes().to_vec(),
                },
            ),
            Payload::Doh {
                queries,
                method,
                path,
                host,
                headers: hs,
            } => {
                let mut hs = headers(hs);
                hs.push(("accept".into(), doh::MEDIA_TYPE.into()));
                if *method == DohMethod::Post {
                    hs.push(("content-type".into(), doh::MEDIA_TYPE.into()));
                }
                let m = match method {
                    DohMethod::Get => "GET",
                    DohMethod::Post => "POST",
                };
                (
                    hpack::RequestTemplate::new(m, scheme, host, &hs),
                    Req::Doh {
                        queries: queries.clone(),
                        method: *method,
                        path: path.clone(),
                    },
                )
            }
            _ => return None,
        };
        Some(H2Proto {
            template,
            req,
            streams: h.streams,
        })
    }

    /// Whether answers are DNS messages (codes are RCODEs).
    pub(crate) fn is_doh(&self) -> bool {
        matches!(self.req, Req::Doh { .. })
    }

    /// Opens a stream on `conn` for query `seq` (the `name_idx`-th DNS name for DoH) and
    /// writes its frames into `out`.
    pub(crate) fn write(&self, conn: &mut H2Conn, out: &mut Vec<u8>, seq: u32, name_idx: usize) {
        let block = &mut conn.block;
        block.clear();
        match &self.req {
            Req::Get { path } => {
                self.template.write(block, |o| hpack::string(o, path), None);
                conn.ep.open(seq, block, None, out);
            }
            Req::Doh {
                queries,
                method,
                path,
            } => {
                let (name, qtype) = &queries[name_idx % queries.len()];
                // RFC 8484 §4.1: ID 0, so that equal questions are equal requests (answers
                // are matched by stream, not by ID).
                let mut msg = [0u8; 2 + 12 + 256 + 4];
                let len = dns_query(&mut msg, name, *qtype);
                let msg = &msg[..len];
                match method {
                    DohMethod::Get => {
                        self.template.write(
                            block,
                            |o| {
                                let n = path.len() + 5 + doh::encoded_len(msg.len());
                                hpack::integer(o, n, 7, 0);
                                o.extend_from_slice(path.as_bytes());
                                o.extend_from_slice(b"?dns=");
                                doh::encode(o, msg);
                            },
                            None,
                        );
                        conn.ep.open(seq, block, None, out);
                    }
                    DohMethod::Post => {
                        self.template.write(
                            block,
                            |o| hpack::string(o, path.as_bytes()),
                            Some(msg.len()),
                        );
                        conn.ep.open(seq, block, Some(msg), out);
                    }
                }
            }
        }
        conn.streams_max = conn.streams_max.max(conn.ep.open_streams() as u64);
    }
}

/// A DNS query (no TCP prefix, ID 0) for `name` and `qtype` written into `buf`; its length.
fn dns_query(buf: &mut [u8; 274], name: &dns::Name, qtype: u16) -> usize {
    let w = name.as_wire();
    let header = [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    let len = header.len() + w.len() + 4;
    buf[..12].copy_from_slice(&header);
    buf[12..12 + w.len()].copy_from_slice(w);
    buf[12 + w.len()..len - 2].copy_from_slice(&qtype.to_be_bytes());
    buf[len - 2..len].copy_from_slice(&1u16.to_be_bytes());
    len
}

/// What the frames read on a connection meant for the queries in flight.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Query `seq` answered with `code` (HTTP status; DoH: RCODE or
    /// [`HTTP_STATUS_BASE`] + status).
    Answer { seq: u32, code: u16 },
    /// Query `seq` failed alone (its stream reset, or a DoH body that is not DNS).
    Failed { seq: u32, why: BadAnswer },
    /// The server is going away (the queries it never processed are in `feed`'s `retry`).
    GoAway { code: u32 },
}

/// One HTTP/2 connection of load.
#[derive(Debug)]
pub(crate) struct H2Conn {
    ep: Endpoint,
    /// The status of responses whose body is still coming, by query.
    statuses: Vec<(u32, u16)>,
    /// DoH bodies split over frames, by query.
    bodies: Vec<(u32, Vec<u8>)>,
    /// The request block being written (reused).
    block: Vec<u8>,
    /// The most streams open at once.
    pub streams_max: u64,
    /// GOAWAY and RST_STREAM frames received.
    pub goaways: u64,
    pub resets: u64,
}

impl H2Conn {
    /// A connection just opened: its preface and SETTINGS go into `out`.
    pub(crate) fn new(out: &mut Vec<u8>) -> H2Conn {
        let mut ep = Endpoint::client(Limits::default());
        // Only :status is read; the other values need not be copied.
        ep.pseudo_fields_only();
        ep.start(out);
        H2Conn {
            ep,
            statuses: Vec::new(),
            bodies: Vec::new(),
            block: Vec::new(),
            streams_max: 0,
            goaways: 0,
            resets: 0,
        }
    }

    /// Whether one more stream may open (at most `limit`, the server's limit, no GOAWAY).
    pub(crate) fn can_open(&self, limit: u32) -> bool {
        self.ep.can_open(limit)
    }

    /// Bodies that waited for the server's window.
    pub(crate) fn window_stalls(&self) -> u64 {
        self.ep.window_stalls
    }

    /// Gives up on query `seq` (timed out): its stream is reset, freeing its slot.
    pub(crate) fn cancel(&mut self, seq: u32, out: &mut Vec<u8>) {
        self.ep.cancel(seq, out);
        self.forget(seq);
    }

    fn forget(&mut self, seq: u32) {
        self.statuses.retain(|s| s.0 != seq);
        self.bodies.retain(|b| b.0 != seq);
    }

    /// Reads `data`; answers to `out_frames` what the protocol asks (SETTINGS ACK, PING
    /// ACK, window), appends outcomes to `outcomes` and, after a GOAWAY, the queries the
    /// server never processed to `retry`. Err: the connection is broken (a GOAWAY saying
    /// why is in `out_frames`).
    pub(crate) fn feed(
        &mut self,
        proto: &H2Proto,
        data: &[u8],
        out_frames: &mut Vec<u8>,
        outcomes: &mut Vec<Outcome>,
        retry: &mut Vec<u32>,
    ) -> Result<(), BadAnswer> {
        let mut input = data;
        loop {
            let ev = match self.ep.next(&mut input, out_frames) {
                Ok(Some(ev)) => ev,
                Ok(None) => return Ok(()),
                Err(e) => return Err(bad_h2(&e)),
            };
            match ev {
                Event::Headers {
                    app, end_stream, ..
                } => {
                    let status = self
                        .ep
                        .field(b":status")
                        .and_then(|s| std::str::from_utf8(s).ok())
                        .and_then(|s| s.parse::<u16>().ok());
                    let Some(status) = status.or_else(|| status_of(&self.statuses, app)) else {
                        self.forget(app);
                        outcomes.push(Outcome::Failed {
                            seq: app,
                            why: BadAnswer {
                                kind: "malformed HTTP answer",
                                detail: "HTTP/2 response without :status".into(),
                            },
                        });
                        continue;
                    };
                    if (100..200).contains(&status) && !end_stream {
                        // An interim answer: the real one follows.
                        continue;
                    }
                    if end_stream {
                        self.forget(app);
                        outcomes.push(answer(proto, app, status, &[]));
                    } else if status_of(&self.statuses, app).is_none() {
                        self.statuses.push((app, status));
                    }
                }
                Event::Data {
                    app,
                    data,
                    end_stream,
                    ..
                } => {
                    let doh = proto.is_doh();
                    let k = self.bodies.iter().position(|b| b.0 == app);
                    if !end_stream {
                        if doh {
                            let b = match k {
                                Some(k) => &mut self.bodies[k].1,
                                None => {
                                    self.bodies.push((app, Vec::new()));
                                    &mut self.bodies.last_mut().expect("just pushed").1
                                }
                            };
                            if b.len() + data.len() > MAX_DNS_BODY {
                                let mut frames = Vec::new();
                                self.cancel(app, &mut frames);
                                out_frames.extend_from_slice(&frames);
                                outcomes.push(Outcome::Failed {
                                    seq: app,
                                    why: BadAnswer {
                                        kind: "oversized answer",
                                        detail: format!("a DoH body over {MAX_DNS_BODY} bytes"),
                                    },
                                });
                                continue;
                            }
                            b.extend_from_slice(data);
                        }
                        continue;
                    }
                    let status = status_of(&self.statuses, app).unwrap_or(200);
                    let outcome = match k {
                        Some(k) => {
                            let (_, mut body) = self.bodies.swap_remove(k);
                            body.extend_from_slice(data);
                            answer(proto, app, status, &body)
                        }
                        None => answer(proto, app, status, data),
                    };
                    self.forget(app);
                    outcomes.push(outcome);
                }
                Event::Reset { app, code, .. } => {
                    self.resets += 1;
                    self.forget(app);
                    outcomes.push(Outcome::Failed {
                        seq: app,
                        why: BadAnswer {
                            kind: rst_kind(code),
                            detail: format!(
                                "the server reset the stream ({})",
                                h2::error_name(code)
                            ),
                        },
                    });
                }
                Event::GoAway { last_stream, code } => {
                    self.goaways += 1;
                    let before = retry.len();
                    self.ep.take_above(last_stream, retry);
                    for &seq in &retry[before..] {
                        self.statuses.retain(|s| s.0 != seq);
                        self.bodies.retain(|b| b.0 != seq);
                    }
                    outcomes.push(Outcome::GoAway { code });
                }
                Event::Settings | Event::Control => {}
            }
        }
    }
}

fn status_of(statuses: &[(u32, u16)], seq: u32) -> Option<u16> {
    statuses.iter().find(|s| s.0 == seq).map(|s| s.1)
}

/// The outcome of a whole response.
fn answer(proto: &H2Proto, seq: u32, status: u16, body: &[u8]) -> Outcome {
    if !proto.is_doh() {
        return Outcome::Answer { seq, code: status };
    }
    if status != 200 {
        return Outcome::Answer {
            seq,
            code: HTTP_STATUS_BASE + status.min(899),
        };
    }
    match dns::parse_whole_response(body) {
        Ok(v) => Outcome::Answer {
            seq,
            code: u16::from(v.rcode),
        },
        Err(e) => Outcome::Failed {
            seq,
            why: BadAnswer {
                kind: "malformed DNS answer",
                detail: format!("DoH body: {e}"),
            },
        },
    }
}

/// A broken connection as a counted bad answer.
fn bad_h2(e: &h2::H2Error) -> BadAnswer {
    BadAnswer {
        kind: "HTTP/2 protocol error",
        detail: e.to_string(),
    }
}

/// The error kind a reset stream is counted under, by its code.
fn rst_kind(code: u32) -> &'static str {
    match code {
        h2::code::NO_ERROR => "RST_STREAM NO_ERROR",
        h2::code::PROTOCOL_ERROR => "RST_STREAM PROTOCOL_ERROR",
        h2::code::INTERNAL_ERROR => "RST_STREAM INTERNAL_ERROR",
        h2::code::FLOW_CONTROL_ERROR => "RST_STREAM FLOW_CONTROL_ERROR",
        h2::code::STREAM_CLOSED => "RST_STREAM STREAM_CLOSED",
        h2::code::FRAME_SIZE_ERROR => "RST_STREAM FRAME_SIZE_ERROR",
        h2::code::REFUSED_STREAM => "RST_STREAM REFUSED_STREAM",
        h2::code::CANCEL => "RST_STREAM CANCEL",
        h2::code::COMPRESSION_ERROR => "RST_STREAM COMPRESSION_ERROR",
        h2::code::ENHANCE_YOUR_CALM => "RST_STREAM ENHANCE_YOUR_CALM",
        _ => "RST_STREAM other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doh_query_is_a_dns_query_with_id_0() {
        let name: dns::Name = "example.com".parse().unwrap();
        let mut buf = [0xa5u8; 274];
        let n = dns_query(&mut buf, &name, 28);
        let q = dns::parse_query(&buf[..n]).unwrap();
        assert_eq!((q.id, q.qtype, q.question_end), (0, 28, n));
        let mut tcp = Vec::new();
        dns::write_tcp_query(&mut tcp, 0, &name, 28);
        assert_eq!(&tcp[2..], &buf[..n]);
    }

    #[test]
    fn reset_kinds_name_their_code() {
        assert_eq!(rst_kind(7), "RST_STREAM REFUSED_STREAM");
        assert_eq!(rst_kind(99), "RST_STREAM other");
    }
}
