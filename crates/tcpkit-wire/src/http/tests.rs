use super::*;

/// Frames `stream` whole, cut at every byte boundary into two, and a byte at a time; all must
/// agree. Returns the framing of the whole stream.
fn every_cut(stream: &[u8]) -> (Vec<Framed>, Option<HttpError>) {
    let whole = frame_all(&[stream], u64::MAX);
    for cut in 0..=stream.len() {
        let two = frame_all(&[&stream[..cut], &stream[cut..]], u64::MAX);
        assert_eq!(two, whole, "cut at {cut}");
    }
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(frame_all(&bytes, u64::MAX), whole, "a byte at a time");
    whole
}

fn one(stream: &[u8]) -> Framed {
    let (mut v, e) = every_cut(stream);
    assert_eq!(e, None);
    assert_eq!(v.len(), 1, "{v:?}");
    v.remove(0)
}

fn err(stream: &[u8]) -> HttpError {
    frame_all(&[stream], 1 << 20).1.expect("an error")
}

#[test]
fn content_length() {
    let m = one(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello");
    assert_eq!(m.status, 200);
    assert_eq!(m.body_kind, Body::Length(5));
    assert_eq!(m.body, b"hello");
    assert!(m.whole);
    assert_eq!(
        m.head,
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\n"
    );
    // Cut short: not whole.
    let (v, e) = every_cut(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel");
    assert_eq!(e, None);
    assert!(!v[0].whole);
    assert_eq!(v[0].body, b"hel");
}

#[test]
fn chunked_with_extensions_and_trailers() {
    let m = one(
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n\
3;ext=1\r\nabc\r\n10 ; a=\"b\"\r\n0123456789abcdef\r\n0\r\nT: v\r\nU: w\r\n\r\n",
    );
    assert_eq!(m.status, 404);
    assert_eq!(m.body_kind, Body::Chunked);
    assert_eq!(m.body, b"abc0123456789abcdef");
    assert!(m.whole);
    // Bare LF line ends are taken too (old servers).
    let m = one(b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\nhi\n0\n\n");
    assert_eq!(m.body, b"hi");
    assert!(m.whole);
    // Chunked wins over Content-Length.
    let m = one(
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
    assert_eq!(m.body_kind, Body::Chunked);
    assert!(m.whole);
}

#[test]
fn no_body_for_1xx_204_304_and_head() {
    let (v, e) = every_cut(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n\
HTTP/1.1 304 Not Modified\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(e, None);
    let got: Vec<(u16, Body, bool)> = v.iter().map(|m| (m.status, m.body_kind, m.whole)).collect();
    assert_eq!(
        got,
        [
            (100, Body::None, true),
            (204, Body::None, true),
            (304, Body::None, true),
            (200, Body::None, true)
        ]
    );
    // An answer to HEAD: no body whatever Content-Length says; an interim answer first does
    // not use up the HEAD.
    let mut f = ResponseFramer::default();
    f.expect_head_response(true);
    let mut buf = Vec::new();
    let s = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n";
    let mut d = &s[..];
    let mut events = Vec::new();
    loop {
        let step = f.feed(d, &mut buf).unwrap();
        if step.event == Event::More {
            break;
        }
        events.push(step.event);
        d = &d[step.used..];
    }
    let none = |status| {
        Event::Head(Head {
            status,
            body: Body::None,
            buffered: false,
        })
    };
    assert_eq!(events, [none(100), Event::End, none(200), Event::End]);
    assert!(f.at_message_start());
    assert_eq!(f.status(), 200);
}

#[test]
fn until_close() {
    let m = every_cut(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of this until the end").0;
    assert_eq!(m[0].body_kind, Body::UntilClose);
    assert_eq!(m[0].body, b"all of this until the end");
    assert!(!m[0].whole);
}

#[test]
fn pipelined_responses() {
    let mut stream = Vec::new();
    for i in 0..5 {
        stream.extend_from_slice(
            format!("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{i}{i}").as_bytes(),
        );
        stream.extend_from_slice(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        );
    }
    let (v, e) = every_cut(&stream);
    assert_eq!(e, None);
    assert_eq!(v.len(), 10);
    assert!(v.iter().all(|m| m.whole));
    assert_eq!(v[4].body, b"22");
    assert_eq!(v[9].body, b"x");
    assert_eq!(v[9].status, 201);
}

#[test]
fn a_split_head_is_buffered_and_given_whole() {
    let mut f = ResponseFramer::default();
    let mut buf = Vec::new();
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n";
    let s = f.feed(&head[..10], &mut buf).unwrap();
    assert_eq!((s.used, s.event), (10, Event::More));
    assert!(!f.at_message_start());
    let mut rest = head[10..].to_vec();
    rest.push(b'!');
    let s = f.feed(&rest, &mut buf).unwrap();
    assert_eq!(s.used, head.len() - 10);
    assert!(matches!(s.event, Event::Head(Head { buffered: true, .. })));
    assert_eq!(s.head(&rest, &buf), head);
    let s = f.feed(&rest[s.used..], &mut buf).unwrap();
    assert_eq!((s.used, s.event), (1, Event::Body { from: 0 }));
    assert_eq!(f.feed(&[], &mut buf).unwrap().event, Event::End);
    assert!(f.at_message_start());
}

#[test]
fn bad_input_is_one_error_each() {
    assert!(matches!(err(b"SSH-2.0-OpenSSH\r\n"), HttpError::Head(_)));
    // The status line is checked as soon as it ends, before any blank line.
    let mut f = ResponseFramer::default();
    let mut buf = Vec::new();
    f.feed(b"HTTP/1.1 2", &mut buf).unwrap();
    assert!(matches!(
        f.feed(b"x0 OK\r\n", &mut buf),
        Err(HttpError::Head(_))
    ));
    assert_eq!(buf, b"HTTP/1.1 2", "the failing bytes are not taken");
    assert_eq!(err(b"HTTP/1.1 099 Low\r\n\r\n"), HttpError::Status(99));
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n"),
        HttpError::ContentLength
    );
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
        HttpError::ContentLength
    );
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n"),
        HttpError::ContentLength
    );
    assert_eq!(
        err(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n"),
        HttpError::TooLarge(2_000_000)
    );
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    let with = |tail: &[u8]| {
        let mut v = chunked.to_vec();
        v.extend_from_slice(tail);
        err(&v)
    };
    assert_eq!(with(b"zz\r\n"), HttpError::ChunkSize);
    assert_eq!(with(b";x\r\n"), HttpError::ChunkSize);
    assert_eq!(with(b"\r\n"), HttpError::ChunkSize);
    assert_eq!(with(b"11111111111111111\r\n"), HttpError::ChunkSize);
    assert_eq!(with(b"200000\r\n"), HttpError::TooLarge(0x20_0000));
    assert_eq!(with(b"2\r\nabX"), HttpError::ChunkEnd);
    let mut ext = b"1;".to_vec();
    ext.resize(MAX_CHUNK_LINE as usize + 1, b'a');
    assert_eq!(with(&ext), HttpError::ChunkSize);
    let mut trailers = b"0\r\n".to_vec();
    while trailers.len() <= MAX_HEAD + 10 {
        trailers.extend_from_slice(b"T: v\r\n");
    }
    assert_eq!(with(&trailers), HttpError::TrailersTooLong);
    // A head without end: bounded whether it comes in one read or many.
    let mut long = b"HTTP/1.1 200 OK\r\n".to_vec();
    while long.len() <= MAX_HEAD {
        long.extend_from_slice(b"X-Filler: 0123456789012345678901234567890123456789\r\n");
    }
    let e = err(&long);
    assert!(
        matches!(e, HttpError::HeadTooLong | HttpError::Head(_)),
        "{e:?}"
    );
    let pieces: Vec<&[u8]> = long.chunks(1000).collect();
    let e = frame_all(&pieces, u64::MAX).1.unwrap();
    assert!(
        matches!(e, HttpError::HeadTooLong | HttpError::Head(_)),
        "{e:?}"
    );
    let mut line = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
    line.resize(MAX_HEAD + 5, b'a');
    assert_eq!(err(&line), HttpError::HeadTooLong);
    let pieces: Vec<&[u8]> = line.chunks(777).collect();
    assert_eq!(frame_all(&pieces, u64::MAX).1, Some(HttpError::HeadTooLong));
    // Too many headers.
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for _ in 0..=MAX_HEADERS {
        many.extend_from_slice(b"A: b\r\n");
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(err(&many), HttpError::Head(httparse::Error::TooManyHeaders));
}

#[test]
fn state_is_small() {
    assert!(std::mem::size_of::<ResponseFramer>() <= 24);
}

#[test]
fn fuzz_body_over_seed_corpus() {
    let seeds = tcpkit_lab::corpus::seeds("http");
    for s in &seeds {
        fuzz_http(&s.bytes);
    }
    let n = seeds.len();
    assert!(n >= 8, "seed corpus has {n} files, expected at least 8");
}
