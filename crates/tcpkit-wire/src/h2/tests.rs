use super::*;

/// Feeds `bytes` to `ep` in pieces of `step`, answering into `out`; the events as text
/// (headers with their fields), or the error's code as the last line.
fn pump(ep: &mut Endpoint, bytes: &[u8], step: usize, out: &mut Vec<u8>) -> Vec<String> {
    let mut seen = Vec::new();
    for part in bytes.chunks(step.max(1)) {
        let mut input = part;
        loop {
            match ep.next(&mut input, out) {
                Ok(Some(Event::Control)) => {}
                Ok(Some(Event::Headers {
                    stream, end_stream, ..
                })) => {
                    let f: Vec<String> = ep
                        .fields()
                        .map(|(n, v)| format!("{}={}", n.escape_ascii(), v.escape_ascii()))
                        .collect();
                    seen.push(format!("headers {stream} end={end_stream} {}", f.join(" ")));
                }
                Ok(Some(Event::Data {
                    stream,
                    data,
                    end_stream,
                    ..
                })) => seen.push(format!(
                    "data {stream} {} end={end_stream}",
                    data.escape_ascii()
                )),
                Ok(Some(ev)) => seen.push(format!("{ev:?}")),
                Ok(None) => break,
                Err(e) => {
                    seen.push(format!("error {}", error_name(e.code)));
                    return seen;
                }
            }
        }
    }
    seen
}

fn pair() -> (Endpoint, Endpoint, Vec<u8>, Vec<u8>) {
    let mut c = Endpoint::client(Limits::default());
    let mut s = Endpoint::server(Limits::default());
    let (mut to_s, mut to_c) = (Vec::new(), Vec::new());
    c.start(&mut to_s);
    s.start(&mut to_c);
    (c, s, to_s, to_c)
}

#[test]
fn frame_header_round_trips_and_is_cut_at_every_length() {
    let h = FrameHeader {
        len: 0x01_02_03,
        kind: kind::HEADERS,
        flags: flag::END_HEADERS,
        stream: 0x7fff_fffe,
    };
    let mut b = vec![0xa5];
    h.emit(&mut b);
    assert_eq!(b.len(), 10);
    assert_eq!(FrameHeader::parse(&b[1..]), Some(h));
    for cut in 0..9 {
        assert_eq!(FrameHeader::parse(&b[1..1 + cut]), None, "cut {cut}");
    }
    // The reserved bit is not part of the stream id.
    b[6] |= 0x80;
    assert_eq!(FrameHeader::parse(&b[1..]).unwrap().stream, 0x7fff_fffe);
}

#[test]
fn a_request_and_its_answer_at_every_cut() {
    let (mut c, _, mut to_s, _) = pair();
    let block = hpack::request_block("GET", "http", "h:80", "/x", &[("X-A".into(), "1".into())]);
    let id = c.open(7, &block, None, &mut to_s);
    assert_eq!(id, 1);
    let mut first = None;
    for step in 1..=to_s.len() {
        let mut s = Endpoint::server(Limits::default());
        let mut to_c = Vec::new();
        s.start(&mut to_c);
        let ev = pump(&mut s, &to_s, step, &mut to_c);
        match &first {
            None => first = Some(ev),
            Some(f) => assert_eq!(&ev, f, "step {step}"),
        }
    }
    let ev = first.unwrap();
    assert_eq!(
        ev,
        [
            "Settings",
            "headers 1 end=true :method=GET :scheme=http :authority=h:80 :path=/x user-agent=tcpkit-load x-a=1"
        ]
    );
    // The server answers; the client sees the status and the body, tagged with its 7.
    let mut s = Endpoint::server(Limits::default());
    let mut to_c = Vec::new();
    s.start(&mut to_c);
    pump(&mut s, &to_s, to_s.len(), &mut to_c);
    s.respond(
        1,
        &hpack::status_block(404, Some("text/plain"), 2),
        b"no",
        &mut to_c,
    );
    assert_eq!(s.open_streams(), 0, "answered: the stream is closed");
    let mut to_s2 = Vec::new();
    let mut input: &[u8] = &to_c;
    let mut tags = Vec::new();
    while let Some(ev) = c.next(&mut input, &mut to_s2).unwrap() {
        match ev {
            Event::Headers { app, .. } | Event::Data { app, .. } => tags.push(app),
            _ => {}
        }
    }
    assert_eq!(tags, [7, 7]);
    assert_eq!(c.field(b":status"), Some(&b"404"[..]));
    assert_eq!(c.open_streams(), 0);
    // A client that opened no stream takes HEADERS on stream 1 as a protocol error.
    let ev = pump(
        &mut Endpoint::client(Limits::default()),
        &to_c,
        5,
        &mut Vec::new(),
    );
    assert_eq!(ev, ["Settings", "error PROTOCOL_ERROR"]);
}

#[test]
fn bodies_wait_for_window_and_flow_both_ways() {
    let small = Limits {
        stream_window: 10,
        ..Limits::default()
    };
    let mut c = Endpoint::client(Limits::default());
    let mut s = Endpoint::server(small);
    let (mut to_s, mut to_c) = (Vec::new(), Vec::new());
    c.start(&mut to_s);
    s.start(&mut to_c);
    // The client learns the 10-byte window before it sends.
    pump(&mut c, &std::mem::take(&mut to_c), 1000, &mut to_s);
    let block = hpack::request_block("POST", "http", "h", "/p", &[]);
    let body: Vec<u8> = (0..35u8).collect();
    c.open(1, &block, Some(&body), &mut to_s);
    assert_eq!(c.window_stalls, 1);
    let mut got = Vec::new();
    for _ in 0..10 {
        for l in pump(&mut s, &std::mem::take(&mut to_s), 1000, &mut to_c) {
            got.push(l);
        }
        pump(&mut c, &std::mem::take(&mut to_c), 1000, &mut to_s);
        if to_s.is_empty() {
            break;
        }
    }
    let body_seen: usize = got
        .iter()
        .filter(|l| l.starts_with("data 1"))
        .map(|l| l.split(' ').nth(2).unwrap().len())
        .sum();
    assert!(body_seen >= 35, "{got:?}");
    assert!(got.last().unwrap().ends_with("end=true"), "{got:?}");
    assert_eq!(c.open_streams(), 1, "sent whole, waiting for the answer");
}

#[test]
fn goaway_hands_back_the_streams_never_processed() {
    let (mut c, mut s, mut to_s, mut to_c) = pair();
    let block = hpack::request_block("GET", "http", "h", "/", &[]);
    for tag in 10..13 {
        c.open(tag, &block, None, &mut to_s);
    }
    pump(&mut s, &to_s, 4096, &mut to_c);
    // The server processed stream 1 only.
    let mut g = Vec::new();
    frame(&mut g, kind::GOAWAY, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]);
    to_c.extend_from_slice(&g);
    let ev = pump(&mut c, &to_c, 4096, &mut Vec::new());
    assert_eq!(ev.last().unwrap(), "GoAway { last_stream: 1, code: 0 }");
    assert!(!c.can_open(100));
    let mut tags = Vec::new();
    c.take_above(1, &mut tags);
    tags.sort_unstable();
    assert_eq!(tags, [11, 12]);
    assert_eq!(c.open_streams(), 1);
}

#[test]
fn concurrency_is_the_smaller_of_ours_and_the_peers() {
    let mut c = Endpoint::client(Limits::default());
    let mut s = Endpoint::server(Limits {
        max_streams: 2,
        ..Limits::default()
    });
    let (mut to_s, mut to_c) = (Vec::new(), Vec::new());
    c.start(&mut to_s);
    s.start(&mut to_c);
    assert!(c.can_open(3));
    pump(&mut c, &to_c, 4096, &mut to_s);
    assert_eq!(c.peer().max_streams, 2);
    let block = hpack::request_block("GET", "http", "h", "/", &[]);
    c.open(1, &block, None, &mut to_s);
    assert!(c.can_open(3));
    c.open(2, &block, None, &mut to_s);
    assert!(!c.can_open(3));
    assert!(!c.can_open(1));
    // A third past the server's limit is refused by it with REFUSED_STREAM.
    c.open(3, &block, None, &mut to_s);
    let mut back = Vec::new();
    pump(&mut s, &to_s, 4096, &mut back);
    let ev = pump(&mut c, &back, 4096, &mut Vec::new());
    assert!(
        ev.contains(&"Reset { stream: 5, app: 3, code: 7 }".to_string()),
        "{ev:?}"
    );
    // The client can cancel a stream by its tag.
    let mut out = Vec::new();
    assert!(c.cancel(2, &mut out));
    assert!(!c.cancel(2, &mut out));
    assert_eq!(FrameHeader::parse(&out).unwrap().kind, kind::RST_STREAM);
}

#[test]
fn protocol_errors_are_goaways_with_their_code() {
    let errs = |bytes: &[u8], server: bool| {
        let mut ep = if server {
            Endpoint::server(Limits::default())
        } else {
            Endpoint::client(Limits::default())
        };
        let mut out = Vec::new();
        let ev = pump(&mut ep, bytes, bytes.len(), &mut out);
        let mut kinds = Vec::new();
        let mut w: &[u8] = &out;
        while let Some(h) = FrameHeader::parse(w) {
            kinds.push(h.kind);
            w = &w[FrameHeader::LEN + h.len as usize..];
        }
        let goaway = kinds.last() == Some(&kind::GOAWAY);
        (ev.last().cloned().unwrap_or_default(), goaway)
    };
    let settings = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    // Not the preface.
    assert_eq!(
        errs(b"GET / HTTP/1.1\r\n", true),
        ("error PROTOCOL_ERROR".into(), true)
    );
    // A frame over our max frame size, refused from its header alone.
    let mut big = settings.to_vec();
    big.extend_from_slice(&[0, 0x40, 0x01, 0, 0, 0, 0, 0, 1]);
    assert_eq!(errs(&big, false), ("error FRAME_SIZE_ERROR".into(), true));
    // The first frame must be SETTINGS.
    assert_eq!(
        errs(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8], false).0,
        "error PROTOCOL_ERROR"
    );
    // DATA on a stream never opened; a window update of 0; a bad HPACK index.
    let mut d = settings.to_vec();
    d.extend_from_slice(&[0, 0, 1, 0, 0, 0, 0, 0, 9, b'x']);
    assert_eq!(errs(&d, false).0, "error PROTOCOL_ERROR");
    let mut w = settings.to_vec();
    w.extend_from_slice(&[0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(errs(&w, false).0, "error PROTOCOL_ERROR");
    let mut h = PREFACE.to_vec();
    h.extend_from_slice(&settings);
    h.extend_from_slice(&[0, 0, 1, 1, 5, 0, 0, 0, 1, 0xff]);
    assert_eq!(errs(&h, true).0, "error COMPRESSION_ERROR");
    // A header block over the bound, across CONTINUATIONs, refused before it is kept.
    let mut hb = PREFACE.to_vec();
    hb.extend_from_slice(&settings);
    frame(&mut hb, kind::HEADERS, 0, 1, &[0u8; 10_000]);
    frame(&mut hb, kind::CONTINUATION, 0, 1, &[0u8; 10_000]);
    assert_eq!(errs(&hb, true).0, "error ENHANCE_YOUR_CALM");
    // A frame between HEADERS and its CONTINUATION.
    let mut hc = PREFACE.to_vec();
    hc.extend_from_slice(&settings);
    frame(&mut hc, kind::HEADERS, 0, 1, &[0x82]);
    frame(&mut hc, kind::PING, 0, 0, &[0; 8]);
    assert_eq!(errs(&hc, true).0, "error PROTOCOL_ERROR");
}

#[test]
fn hpack_dynamic_table_continuation_and_ping() {
    let mut hb = PREFACE.to_vec();
    hb.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    // Stream 1: literal with incremental indexing of `x-k: v`, split over a CONTINUATION.
    let mut block = vec![0x82, 0x86, 0x84, 0x41, 1, b'h', 0x40, 3];
    block.extend_from_slice(b"x-k");
    block.extend_from_slice(&[1, b'v']);
    frame(&mut hb, kind::HEADERS, flag::END_STREAM, 1, &block[..5]);
    frame(
        &mut hb,
        kind::CONTINUATION,
        flag::END_HEADERS,
        1,
        &block[5..],
    );
    // Stream 3 refers to it by index 62 (the dynamic table's first entry).
    frame(
        &mut hb,
        kind::HEADERS,
        flag::END_STREAM | flag::END_HEADERS,
        3,
        &[0x82, 0x86, 0x84, 0xbe],
    );
    frame(&mut hb, kind::PING, 0, 0, b"12345678");
    let mut first = None;
    for step in 1..=hb.len() {
        let mut s = Endpoint::server(Limits::default());
        let mut out = Vec::new();
        let ev = pump(&mut s, &hb, step, &mut out);
        // The PING is answered with its payload, ACK set.
        assert!(out.windows(8).any(|w| w == b"12345678"));
        match &first {
            None => first = Some(ev),
            Some(f) => assert_eq!(&ev, f, "step {step}"),
        }
    }
    assert_eq!(
        first.unwrap(),
        [
            "Settings",
            "headers 1 end=true :method=GET :scheme=http :path=/ :authority=h x-k=v",
            "headers 3 end=true :method=GET :scheme=http :path=/ x-k=v"
        ]
    );
}

#[test]
fn doh_get_parameter_round_trips() {
    let msg: Vec<u8> = (0..=255u8).collect();
    let mut p = b"/dns-query?x=1&dns=".to_vec();
    doh::encode(&mut p, &msg);
    let encoded = &p[19..];
    assert!(
        encoded
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_'),
        "base64url, no padding"
    );
    let param = doh::dns_param(&p).unwrap();
    assert_eq!(param.len(), doh::encoded_len(256));
    let mut buf = [0u8; 512];
    assert_eq!(doh::decode(param, &mut buf).unwrap(), &msg[..]);
    // Too long for the buffer: refused before decoding.
    let mut small = [0u8; 16];
    assert_eq!(doh::decode(param, &mut small), None);
    assert_eq!(doh::decode(b"!!!!", &mut buf), None);
    assert_eq!(doh::path_only(&p), b"/dns-query");
    assert_eq!(doh::dns_param(b"/dns-query"), None);
}

#[test]
fn hpack_integers_match_rfc_7541_examples() {
    let mut o = Vec::new();
    hpack::integer(&mut o, 10, 5, 0);
    hpack::integer(&mut o, 1337, 5, 0);
    hpack::integer(&mut o, 42, 8, 0);
    assert_eq!(o, [10, 31, 154, 10, 42]);
}

#[test]
fn fuzz_body_over_seed_corpus() {
    let seeds = tcpkit_lab::corpus::seeds("h2");
    let n = seeds.len();
    for s in seeds {
        fuzz_h2(&s.bytes);
    }
    assert!(n >= 6, "seed corpus has {n} files, expected at least 6");
}

/// Writes the hand-made seeds: what a client sends a server (byte 0 with the top bit set)
/// and what a server sends a client, whole and cut.
#[test]
#[ignore = "writes fuzz/corpus/h2; run by hand when the format changes"]
fn write_seed_corpus() {
    let (mut c, mut s, mut to_s, mut to_c) = pair();
    let get = hpack::request_block("GET", "http", "h", "/", &[]);
    let post = hpack::request_block("POST", "http", "h", "/dns-query", &[]);
    c.open(1, &get, None, &mut to_s);
    c.open(2, &post, Some(b"\x12\x34query"), &mut to_s);
    frame(&mut to_s, kind::PING, 0, 0, b"pingpong");
    pump(&mut s, &to_s, 4096, &mut to_c);
    s.respond(
        1,
        &hpack::status_block(200, Some(doh::MEDIA_TYPE), 3),
        b"abc",
        &mut to_c,
    );
    s.respond(3, &hpack::status_block(503, None, 0), b"", &mut to_c);
    frame(
        &mut to_c,
        kind::RST_STREAM,
        0,
        5,
        &code::CANCEL.to_be_bytes(),
    );
    frame(&mut to_c, kind::WINDOW_UPDATE, 0, 0, &100u32.to_be_bytes());
    frame(&mut to_c, kind::GOAWAY, 0, 0, &[0, 0, 0, 3, 0, 0, 0, 0]);
    let seed = |sel: u8, b: &[u8]| {
        let mut v = vec![sel];
        v.extend_from_slice(b);
        v
    };
    // The server side reads what the client wrote after its own preface.
    let client_frames = &to_s[..];
    let server_frames = &to_c[..];
    tcpkit_lab::corpus::write("h2", "server-whole", &seed(0x80, client_frames));
    tcpkit_lab::corpus::write("h2", "server-cut-30", &seed(0x80 | 30, client_frames));
    tcpkit_lab::corpus::write("h2", "client-whole", &seed(0, server_frames));
    tcpkit_lab::corpus::write("h2", "client-cut-17", &seed(17, server_frames));
    let mut dynamic = PREFACE.to_vec();
    dynamic.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    frame(
        &mut dynamic,
        kind::HEADERS,
        flag::END_STREAM,
        1,
        &[0x82, 0x86, 0x84, 0x41, 1, b'h', 0x40],
    );
    frame(
        &mut dynamic,
        kind::CONTINUATION,
        flag::END_HEADERS,
        1,
        &[3, b'x', b'-', b'k', 1, b'v'],
    );
    frame(
        &mut dynamic,
        kind::HEADERS,
        flag::END_STREAM | flag::END_HEADERS,
        3,
        &[0x82, 0x86, 0x84, 0xbe, 0x3f, 0xe1, 0x1f],
    );
    tcpkit_lab::corpus::write("h2", "server-dynamic-table", &seed(0x80 | 9, &dynamic));
    let mut padded = vec![0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 10];
    frame(
        &mut padded,
        kind::HEADERS,
        flag::END_HEADERS | flag::PADDED | flag::PRIORITY,
        1,
        &[2, 0, 0, 0, 0, 9, 0x88, 0, 0],
    );
    frame(
        &mut padded,
        kind::DATA,
        flag::PADDED,
        1,
        &[3, b'a', b'b', 0, 0, 0],
    );
    frame(&mut padded, kind::DATA, flag::END_STREAM, 1, &[b'c'; 20]);
    tcpkit_lab::corpus::write("h2", "client-padded-small-window", &seed(5, &padded));
    // Huffman-coded blocks: nginx's answer to stream 1, then one with a bad padding.
    let mut nginx = vec![0, 0, 0, 4, 0, 0, 0, 0, 0];
    let block = nginx_response_block();
    frame(&mut nginx, kind::HEADERS, flag::END_HEADERS, 1, &block);
    frame(&mut nginx, kind::DATA, flag::END_STREAM, 1, b"<html>");
    tcpkit_lab::corpus::write("h2", "client-nginx-huffman", &seed(40, &nginx));
    let mut bad = nginx[..9].to_vec();
    let mut block = vec![0x88];
    block.extend_from_slice(&huffman_field(&[0x1e]));
    frame(&mut bad, kind::HEADERS, flag::END_HEADERS, 1, &block);
    tcpkit_lab::corpus::write("h2", "client-huffman-bad-padding", &seed(3, &bad));
    // RFC 7541 C.4's three requests (Huffman, the dynamic table in use), one per stream.
    let mut c4 = PREFACE.to_vec();
    c4.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    for (stream, hex) in [
        (1, "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        (3, "8286 84be 5886 a8eb 1064 9cbf"),
        (
            5,
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ),
    ] {
        let f = flag::END_HEADERS | flag::END_STREAM;
        frame(&mut c4, kind::HEADERS, f, stream, &unhex(hex));
    }
    tcpkit_lab::corpus::write("h2", "server-rfc7541-c4-huffman", &seed(0x80 | 50, &c4));
}

/// Decodes RFC 7541 Appendix C's blocks in order on one decoder: each block's fields, then
/// the table's size and entries (newest first) after it.
type Example<'a> = (
    &'a [u8],
    &'a [(&'a str, &'a str)],
    usize,
    &'a [(&'a str, &'a str)],
);

fn rfc_sequence(table_size: usize, blocks: &[Example<'_>]) {
    let mut d = hpack::Decoder::new();
    d.bound(table_size);
    for (i, (block, fields, size, table)) in blocks.iter().enumerate() {
        let mut got = Vec::new();
        d.decode(block, |n, v| {
            got.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ));
        })
        .unwrap_or_else(|e| panic!("block {i}: {e}"));
        let want = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(got, want(fields), "block {i}'s fields");
        assert_eq!(d.table(), (*size, want(table)), "the table after block {i}");
    }
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const WWW: (&str, &str) = (":authority", "www.example.com");
const GET_HTTP: [(&str, &str); 3] = [(":method", "GET"), (":scheme", "http"), (":path", "/")];

#[test]
fn hpack_rfc_7541_c3_c4_requests_plain_and_huffman() {
    let third = [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        WWW,
        ("custom-key", "custom-value"),
    ];
    let first = [GET_HTTP[0], GET_HTTP[1], GET_HTTP[2], WWW];
    let second = [
        GET_HTTP[0],
        GET_HTTP[1],
        GET_HTTP[2],
        WWW,
        ("cache-control", "no-cache"),
    ];
    let cc = ("cache-control", "no-cache");
    let ck = ("custom-key", "custom-value");
    for blocks in [
        // C.3: without Huffman.
        [
            unhex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
            unhex("8286 84be 5808 6e6f 2d63 6163 6865"),
            unhex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65"),
        ],
        // C.4: the same with Huffman.
        [
            unhex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
            unhex("8286 84be 5886 a8eb 1064 9cbf"),
            unhex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
        ],
    ] {
        rfc_sequence(
            4096,
            &[
                (&blocks[0], &first, 57, &[WWW]),
                (&blocks[1], &second, 110, &[cc, WWW]),
                (&blocks[2], &third, 164, &[ck, cc, WWW]),
            ],
        );
    }
}

#[test]
fn hpack_rfc_7541_c5_c6_responses_with_eviction_plain_and_huffman() {
    let date1 = ("date", "Mon, 21 Oct 2013 20:13:21 GMT");
    let date2 = ("date", "Mon, 21 Oct 2013 20:13:22 GMT");
    let loc = ("location", "https://www.example.com");
    let private = ("cache-control", "private");
    let cookie = (
        "set-cookie",
        "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
    );
    let gzip = ("content-encoding", "gzip");
    for blocks in [
        // C.5: without Huffman.
        [
            unhex(
                "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230
                 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65
                 7861 6d70 6c65 2e63 6f6d",
            ),
            unhex("4803 3330 37c1 c0bf"),
            unhex(
                "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220
                 474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157
                 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076
                 6572 7369 6f6e 3d31",
            ),
        ],
        // C.6: the same with Huffman.
        [
            unhex(
                "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0
                 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            ),
            unhex("4883 640e ffc1 c0bf"),
            unhex(
                "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b
                 d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27
                 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
            ),
        ],
    ] {
        rfc_sequence(
            256,
            &[
                (
                    &blocks[0],
                    &[(":status", "302"), private, date1, loc],
                    222,
                    &[loc, date1, private, (":status", "302")],
                ),
                (
                    &blocks[1],
                    &[(":status", "307"), private, date1, loc],
                    222,
                    &[(":status", "307"), loc, date1, private],
                ),
                (
                    &blocks[2],
                    &[(":status", "200"), private, date2, loc, gzip, cookie],
                    215,
                    &[cookie, gzip, date2],
                ),
            ],
        );
    }
}

/// One field `x-k` whose value is the Huffman string `value` (literal without indexing).
fn huffman_field(value: &[u8]) -> Vec<u8> {
    let mut b = vec![0x00, 0x03, b'x', b'-', b'k'];
    hpack::integer(&mut b, value.len(), 7, 0x80);
    b.extend_from_slice(value);
    b
}

/// A client that has opened stream 1 (a GET), and what it wrote.
fn client_with_stream_1() -> (Endpoint, Vec<u8>) {
    let mut c = Endpoint::client(Limits::default());
    let mut out = Vec::new();
    c.start(&mut out);
    let block = hpack::request_block("GET", "http", "h", "/", &[]);
    c.open(1, &block, None, &mut out);
    (c, out)
}

#[test]
fn hpack_refuses_bad_huffman_padding_eos_and_bad_bounds() {
    let decode = |b: &[u8]| {
        let mut d = hpack::Decoder::new();
        d.decode(b, |_, _| {}).map_err(|e| e.to_string())
    };
    // "a" is 00011: padded with three ones it is 0x1f, a good string.
    assert_eq!(decode(&huffman_field(&[0x1f])), Ok(()));
    // Padding that is not all ones.
    let e = decode(&huffman_field(&[0x1e])).unwrap_err();
    assert!(e.contains("padding"), "{e}");
    // Padding of 8 bits or more: "a" then a whole byte of ones.
    let e = decode(&huffman_field(&[0x1f, 0xff])).unwrap_err();
    assert!(e.contains("padding"), "{e}");
    // EOS (30 ones) inside the string.
    let e = decode(&huffman_field(&[0xff, 0xff, 0xff, 0xff])).unwrap_err();
    assert!(e.contains("EOS"), "{e}");
    // A string longer than the block, refused before anything is read or grown.
    let e = decode(&[0x00, 0x03, b'x', b'-', b'k', 0xff, 0xff, 0xff, 0x07]).unwrap_err();
    assert!(e.contains("ends inside"), "{e}");
    // An integer too long for any bound.
    let e = decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).unwrap_err();
    assert!(e.contains("2^28"), "{e}");
    // Index 0, and past the (empty) dynamic table.
    assert!(decode(&[0x80]).unwrap_err().contains("index 0"));
    assert!(decode(&[0xbe]).unwrap_err().contains("index 62"));
    // A table size update over what we announced, and one after a field.
    assert!(decode(&[0x3f, 0xe2, 0x1f]).unwrap_err().contains("4097"));
    assert_eq!(decode(&[0x3f, 0xe1, 0x1f, 0x88]), Ok(()));
    assert!(decode(&[0x88, 0x20]).unwrap_err().contains("after a field"));
    // Through the endpoint it is a COMPRESSION_ERROR GOAWAY.
    let mut hb = vec![0, 0, 0, 4, 0, 0, 0, 0, 0];
    let (mut c, mut out) = client_with_stream_1();
    let mut block = vec![0x88];
    block.extend_from_slice(&huffman_field(&[0x1e]));
    frame(&mut hb, kind::HEADERS, flag::END_HEADERS, 1, &block);
    let ev = pump(&mut c, &hb, hb.len(), &mut out);
    assert_eq!(ev.last().unwrap(), "error COMPRESSION_ERROR");
}

#[test]
fn huffman_round_trips_every_byte() {
    let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    for s in [&b""[..], b"a", b"nginx/1.22.1", &all] {
        let mut enc = Vec::new();
        huffman::encode(s, &mut enc);
        assert_eq!(enc.len(), huffman::encoded_len(s));
        let mut dec = Vec::new();
        huffman::decode(&enc, &mut dec).unwrap();
        assert_eq!(dec, s);
    }
}

/// The block nginx 1.22.1 answered a GET of its default page with (h2c on loopback, captured
/// once): `:status` indexed; server, date, content-type, content-length and last-modified
/// literals with incremental indexing (nginx never refers to its entries, so each answer adds
/// them again and evicts older ones), etag and accept-ranges without; Huffman-coded values.
fn nginx_response_block() -> Vec<u8> {
    unhex(
        "887689aa6355e580ae212e1f6196dc34fd282794d27eea080271408ae32ddc65f53168df5f87497ca589
         d34d1f5c033631356c96e4593e940bea6a225410042500f5c00ae080a62d1bff00832a47378bfe5c65a9
         472808b09c77f9008919085ad2b583aa62a3848fd24a8f",
    )
}

#[test]
fn hpack_decodes_nginx_s_response_block() {
    let mut d = hpack::Decoder::new();
    let mut got = Vec::new();
    d.decode(&nginx_response_block(), |n, v| {
        got.push(format!("{}: {}", n.escape_ascii(), v.escape_ascii()));
    })
    .unwrap();
    assert_eq!(got[0], ":status: 200");
    assert_eq!(got[1], "server: nginx/1.22.1");
    assert_eq!(got[2], "date: Sat, 28 Nov 2026 12:35:39 GMT");
    assert_eq!(got[4], "content-length: 615");
    assert_eq!(got[6], "etag: \\\"634faf0c-267\\\"");
    assert_eq!(got[7], "accept-ranges: bytes");
    assert_eq!(got.len(), 8);
    // Server, date, content-type, content-length and last-modified went into the table.
    assert_eq!(d.table().0, 291, "{:?}", d.table());
    assert_eq!(d.table().1[0].0, "last-modified");
    // Only pseudo-fields kept: the rest is decoded (the table stays exact) but not copied.
    let (mut c, mut out) = client_with_stream_1();
    c.pseudo_fields_only();
    let mut hb = vec![0, 0, 0, 4, 0, 0, 0, 0, 0];
    let block = nginx_response_block();
    frame(
        &mut hb,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        1,
        &block,
    );
    assert_eq!(
        pump(&mut c, &hb, hb.len(), &mut out),
        ["Settings", "headers 1 end=true :status=200"]
    );
}

/// Nanoseconds to decode nginx's response block (`cargo test -p tcpkit-wire --profile suite
/// --lib -- --ignored --nocapture bench_hpack`).
#[test]
#[ignore = "a micro-benchmark, run by hand"]
fn bench_hpack_nginx_response_block() {
    let block = nginx_response_block();
    let mut d = hpack::Decoder::new();
    let n = 1_000_000u32;
    let t = std::time::Instant::now();
    let mut sum = 0usize;
    for _ in 0..n {
        d.decode(std::hint::black_box(&block), |n, v| {
            sum += n.len() + v.len();
        })
        .unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    println!(
        "tcpkit hpack: {ns:.0} ns per nginx response block ({} bytes, {sum})",
        block.len()
    );
}
