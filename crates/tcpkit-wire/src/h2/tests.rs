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
}
