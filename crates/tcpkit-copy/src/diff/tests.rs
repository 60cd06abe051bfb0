use super::*;

fn cfg(mode: DiffMode, ignore: &[&str]) -> DiffConfig {
    DiffConfig {
        mode,
        ignore: ignore.iter().map(|p| ignore_pattern(p).unwrap()).collect(),
        max_written: 100,
        out: None,
    }
}

/// `bytes` cut into pieces of `step` bytes, as segments arrive.
fn resp(d: &Differ, bytes: &[u8], step: usize, head_req: bool) -> (Resp, bool) {
    let mut a = Acc::new(d.cfg.mode, head_req, &d.total);
    for c in bytes.chunks(step.max(1)) {
        a.push(c);
    }
    let whole = a.complete();
    (a.finish(), whole)
}

/// A copy's connection as these tests name it: every address the same (the differ only
/// writes them out).
fn meta(session: u64, copy: u32) -> ConnMeta {
    let a: SocketAddr = "10.0.0.1:1000".parse().unwrap();
    ConnMeta {
        session,
        copy,
        client: a,
        server: a,
        target: a,
    }
}

fn verdict(mode: DiffMode, ignore: &[&str], a: &[u8], b: &[u8]) -> Verdict {
    let d = Differ::new(cfg(mode, ignore)).unwrap();
    let (ra, _) = resp(&d, a, 7, false);
    let (rb, _) = resp(&d, b, 3, false);
    compare(&ra.msgs[0], &rb.msgs[0], mode, &d.cfg.ignore)
}

const A: &[u8] = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 01 Jan 2026 00:00:00 GMT\r\nContent-Length: 5\r\n\r\nhello";
const B: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length:  5\r\nDate: Tue, 02 Jan 2026 10:00:00 GMT\r\nServer: nginx\r\n\r\nhello";

#[test]
fn bytes_mode_equal_and_different() {
    assert_eq!(verdict(DiffMode::Bytes, &[], A, A).diff, None);
    assert_eq!(
        verdict(DiffMode::Bytes, &[], A, B).diff,
        Some(Reason::Bytes)
    );
}

#[test]
fn bytes_mode_ignore_blanks_matches_on_both_sides() {
    let a = b"id=123 ok\nDate: x\nend";
    let b = b"id=987 ok\nDate: yyyy\nend";
    assert_eq!(
        verdict(DiffMode::Bytes, &[], a, b).diff,
        Some(Reason::Bytes)
    );
    assert_eq!(
        verdict(DiffMode::Bytes, &["id=[0-9]+"], a, b).diff,
        Some(Reason::Bytes)
    );
    // ^ and $ are line anchors.
    assert_eq!(
        verdict(DiffMode::Bytes, &["id=[0-9]+", "^Date:.*$"], a, b).diff,
        None
    );
    // An anchored pattern does not match mid-line.
    assert_eq!(
        verdict(DiffMode::Bytes, &["^ok"], b"x ok", b"x ko").diff,
        Some(Reason::Bytes)
    );
}

#[test]
fn http_mode_headers_as_a_set_with_ignored_lines() {
    // Order and name case free, values trimmed, but Date differs.
    assert_eq!(
        verdict(DiffMode::Http, &[], A, B).diff,
        Some(Reason::Headers)
    );
    assert_eq!(verdict(DiffMode::Http, &["^Date:"], A, B).diff, None);
    // Patterns see the header line as sent: case matters unless the pattern says (?i).
    assert_eq!(
        verdict(DiffMode::Http, &["^date:"], A, B).diff,
        Some(Reason::Headers)
    );
    assert_eq!(verdict(DiffMode::Http, &["(?i)^date:"], A, B).diff, None);
    let other_status = [&b"HTTP/1.1 404 Not Found"[..], &A[15..]].concat();
    assert_eq!(
        verdict(DiffMode::Http, &["^Date:"], A, &other_status).diff,
        Some(Reason::Status)
    );
    let other_body = [&A[..A.len() - 5], b"world"].concat();
    assert_eq!(
        verdict(DiffMode::Http, &["^Date:"], A, &other_body).diff,
        Some(Reason::Body)
    );
    // Ignore patterns apply to headers only in http mode, not the body.
    assert_eq!(
        verdict(DiffMode::Http, &["^Date:", "hello|world"], A, &other_body).diff,
        Some(Reason::Body)
    );
    assert_eq!(
        verdict(DiffMode::Http, &[], A, b"+OK\r\n").diff,
        Some(Reason::NotHttp)
    );
    assert_eq!(
        verdict(DiffMode::Http, &[], b"+OK\r\n", b"+OK\r\n").diff,
        None
    );
}

#[test]
fn chunked_equals_content_length_body() {
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nX-T: 1\r\n\r\n";
    let cl = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    let ign = ["^(Transfer-Encoding|Content-Length):"];
    for step in [1, 2, 5, 100] {
        let d = Differ::new(cfg(DiffMode::Http, &ign)).unwrap();
        let (a, whole) = resp(&d, chunked, step, false);
        assert!(whole, "step {step}");
        assert_eq!(a.msgs[0].body, b"hello");
        let (b, whole) = resp(&d, cl, step, false);
        assert!(whole);
        assert_eq!(
            compare(&a.msgs[0], &b.msgs[0], DiffMode::Http, &d.cfg.ignore).diff,
            None
        );
    }
}

#[test]
fn framing_says_when_an_answer_is_whole() {
    let d = Differ::new(cfg(DiffMode::Http, &[])).unwrap();
    assert!(!resp(&d, &A[..A.len() - 1], 4, false).1);
    assert!(resp(&d, A, 4, false).1);
    // HEAD: headers only, whatever Content-Length says; 304 likewise.
    assert!(resp(&d, &A[..A.len() - 5], 4, true).1);
    assert!(
        resp(
            &d,
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            4,
            false
        )
        .1
    );
    // Until the close: never whole by framing.
    assert!(!resp(&d, b"HTTP/1.0 200 OK\r\n\r\nabc", 4, false).1);
}

#[test]
fn bodies_over_the_cap_are_compared_by_length_and_hash() {
    let big = vec![b'a'; RESPONSE_CAP + 10];
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 65546\r\n\r\n";
    let a = [&head[..], &big].concat();
    let mut other = big.clone();
    other[RESPONSE_CAP + 5] = b'b';
    let b = [&head[..], &other].concat();
    let d = Differ::new(cfg(DiffMode::Http, &[])).unwrap();
    let (ra, _) = resp(&d, &a, 1000, false);
    let (rb, _) = resp(&d, &b, 333, false);
    assert_eq!(ra.msgs[0].body.len(), RESPONSE_CAP);
    let v = compare(&ra.msgs[0], &rb.msgs[0], DiffMode::Http, &[]);
    assert_eq!(
        v,
        Verdict {
            diff: Some(Reason::Hash),
            by_hash: true
        }
    );
    let (ra2, _) = resp(&d, &a, 4096, false);
    assert_eq!(
        compare(&ra.msgs[0], &ra2.msgs[0], DiffMode::Http, &[]),
        Verdict {
            diff: None,
            by_hash: true
        }
    );
    // Held bytes are bounded by the cap and released with the answers.
    assert!(d.held_bytes() <= 3 * (RESPONSE_CAP + head.len()));
    drop((ra, rb, ra2));
    assert_eq!(d.held_bytes(), 0);
}

#[test]
fn a_head_past_the_cap_is_not_http() {
    let d = Differ::new(cfg(DiffMode::Http, &[])).unwrap();
    let long = [
        &b"HTTP/1.1 200 OK\r\nX: "[..],
        &vec![b'x'; RESPONSE_CAP + 100],
    ]
    .concat();
    let (r, whole) = resp(&d, &long, 1000, false);
    assert!(!whole && r.msgs[0].head.is_none());
    assert_eq!(r.msgs[0].body_len, long.len() as u64);
}

#[test]
fn pairs_by_request_index_and_writes_the_differences() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.jsonl");
    let mut c = cfg(DiffMode::Bytes, &[]);
    c.out = Some(out.clone());
    c.max_written = 1;
    let mut d = Differ::new(c).unwrap();
    let mut orig = d.original(true);
    let mut conn = d.conn(meta(7, 2));
    // Request 1 and its answers.
    let (k, r) = orig.request_starts(&d, b"GET /1").unwrap();
    assert_eq!(k, 0);
    conn.original(k, r);
    conn.request_queued(b"GET /1");
    // Answer 0: no greeting on either side, not counted.
    conn.request_sent(&mut d);
    orig.server_bytes(b"one\xff");
    conn.target_bytes(b"on");
    // Request 2: the original answer 1 is whole; the target's only when as long.
    let (k, r) = orig.request_starts(&d, b"GET /2").unwrap();
    conn.original(k, r);
    conn.request_queued(b"GET /2");
    assert!(!conn.answer_whole());
    conn.target_bytes(b"E\xfe");
    assert!(conn.answer_whole());
    conn.request_sent(&mut d);
    orig.server_bytes(b"two");
    conn.target_bytes(b"TWO");
    let (k, r) = orig.close().unwrap();
    assert_eq!(k, 2);
    conn.original(k, r);
    conn.closed(&mut d, true);
    let st = d.finish();
    assert_eq!(
        (st.compared, st.equal, st.different, st.written),
        (2, 0, 2, 1)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(v["session"], 7);
    assert_eq!(v["copy"], 2);
    assert_eq!(v["request"], 1);
    assert_eq!(v["reason"], "bytes");
    assert_eq!(v["original"]["text"], "one\\xff");
    assert_eq!(v["target_response"]["text"], "onE\\xfe");
    assert_eq!(v["original"]["length"], 4);
}

#[test]
fn a_mid_stream_join_skips_the_answer_before_it_and_a_cut_copy_counts() {
    let mut d = Differ::new(cfg(DiffMode::Bytes, &[])).unwrap();
    let mut orig = d.original(false);
    orig.server_bytes(b"answer to a request never copied");
    assert!(orig.request_starts(&d, b"GET /").is_none());
    let mut conn = d.conn(meta(1, 1));
    conn.request_queued(b"GET /");
    conn.request_sent(&mut d);
    conn.target_bytes(b"par");
    conn.closed(&mut d, false);
    let st = d.finish();
    assert_eq!((st.compared, st.not_compared), (0, 1));
}

#[test]
fn escape_keeps_text_readable_and_bytes_lossless() {
    assert_eq!(
        escape(b"a\\b\r\n\t\x00\x7f\xc3"),
        "a\\\\b\r\n\t\\x00\\x7f\\xc3"
    );
}

#[test]
fn a_bad_pattern_is_an_error_not_a_panic() {
    assert!(ignore_pattern("(").is_err());
    assert!(ignore_pattern("a{1000}{1000}").is_err());
}

#[test]
fn pipelined_answers_are_compared_message_by_message() {
    let mut d = Differ::new(cfg(DiffMode::Http, &["^Date:"])).unwrap();
    let mut orig = d.original(true);
    let mut conn = d.conn(meta(1, 1));
    let two = b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
    let (k, r) = orig.request_starts(&d, two).unwrap();
    conn.original(k, r);
    conn.request_queued(two);
    conn.request_sent(&mut d);
    orig.server_bytes(A);
    orig.server_bytes(B);
    let (k, r) = orig.close().unwrap();
    conn.original(k, r);
    // The target's first message alone is not the whole answer to a turn of two.
    conn.target_bytes(A);
    assert!(!conn.answer_whole());
    let other = [&B[..B.len() - 5], b"world"].concat();
    conn.target_bytes(&other[..10]);
    assert!(!conn.answer_whole());
    conn.target_bytes(&other[10..]);
    assert!(conn.answer_whole());
    conn.closed(&mut d, true);
    let st = d.finish();
    assert_eq!((st.compared, st.equal, st.different), (2, 1, 1));
    // A message the target never sent is a difference of its own.
    let mut d = Differ::new(cfg(DiffMode::Http, &[])).unwrap();
    let (ra, _) = resp(&d, &[A, A].concat(), 9, false);
    let (rb, _) = resp(&d, A, 9, false);
    assert_eq!((ra.msgs.len(), rb.msgs.len()), (2, 1));
    let meta = meta(1, 1);
    d.judge(&meta, 1, &ra, &rb);
    assert_eq!(
        (d.stats.compared, d.stats.equal, d.stats.different),
        (2, 1, 1)
    );
}

/// A copy behind the capture by several requests (transparent mode's first handshake goes
/// through intercept): the answer in flight looks whole once it holds its own message, not
/// only once it holds as many as every original answer captured so far.
#[test]
fn a_copy_lagging_the_capture_sees_each_answer_whole_on_its_own() {
    let mut d = Differ::new(cfg(DiffMode::Http, &["^Date:"])).unwrap();
    let mut orig = d.original(true);
    let mut conn = d.conn(meta(1, 1));
    let get = b"GET /a HTTP/1.1\r\n\r\n";
    // The capture runs four requests ahead of the copy.
    for _ in 0..4 {
        if let Some((k, r)) = orig.request_starts(&d, get) {
            conn.original(k, r);
        }
        conn.request_queued(get);
        orig.server_bytes(A);
    }
    let (k, r) = orig.request_starts(&d, get).unwrap();
    conn.original(k, r);
    conn.request_queued(get);
    // The copy sends its first request; the target's answer is one message, as the
    // original's first was.
    conn.request_sent(&mut d);
    assert!(!conn.answer_whole());
    assert!(
        !conn.answer_partial(),
        "nothing yet is not a message cut short"
    );
    conn.target_bytes(&B[..20]);
    assert!(!conn.answer_whole(), "half a message");
    assert!(conn.answer_partial());
    conn.target_bytes(&B[20..B.len() - 2]);
    assert!(conn.answer_partial(), "its Content-Length is not reached");
    conn.target_bytes(&B[B.len() - 2..]);
    assert!(conn.answer_whole());
    assert!(!conn.answer_partial());
    conn.request_sent(&mut d);
    assert!(!conn.answer_whole());
    conn.target_bytes(A);
    assert!(conn.answer_whole());
    conn.request_sent(&mut d);
    assert_eq!(d.stats().compared, 2);
    assert_eq!(d.stats().equal, 2);
}

/// Issue 10 case 13: an original answer the capture lost part of is not compared but
/// counted, its length (gap included) still tells when the target's answer is whole, and the
/// answers after it pair as before.
#[test]
fn an_original_answer_with_a_hole_is_counted_not_compared() {
    let mut d = Differ::new(cfg(DiffMode::Bytes, &[])).unwrap();
    let mut orig = d.original(true);
    let mut conn = d.conn(meta(1, 1));
    let (k, r) = orig.request_starts(&d, b"GET /1").unwrap();
    conn.original(k, r);
    conn.request_queued(b"GET /1");
    conn.request_sent(&mut d);
    // Answer 1: "one" + 4 bytes the capture lost + "!".
    orig.server_bytes(b"one");
    orig.server_gap(4);
    orig.server_bytes(b"!");
    conn.target_bytes(b"one");
    let (k, r) = orig.request_starts(&d, b"GET /2").unwrap();
    conn.original(k, r);
    conn.request_queued(b"GET /2");
    assert!(!conn.answer_whole(), "8 bytes due, 3 in");
    conn.target_bytes(b"-two!");
    assert!(conn.answer_whole());
    conn.request_sent(&mut d);
    orig.server_bytes(b"two");
    conn.target_bytes(b"two");
    let (k, r) = orig.close().unwrap();
    conn.original(k, r);
    conn.closed(&mut d, true);
    let st = d.finish();
    assert_eq!((st.compared, st.equal, st.original_incomplete), (1, 1, 1));
}
