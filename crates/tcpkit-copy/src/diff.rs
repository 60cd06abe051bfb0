//! `--diff`: the original server's answer to each copied request (from the capture) compared
//! with the target's (received by the relay).
//!
//! Pairing: a session's server bytes are cut at every request start, on both sides: response
//! `k` is what the server sent after request `k` began and before request `k + 1` began
//! (response 0 is a greeting sent before any request). On the capture side the cut is exact:
//! request `k + 1` is only seen after the server's turn ended. On the target side the cut is
//! the moment the relay sends request `k + 1`; with `--diff` the relay waits for the target's
//! answer to look whole first ([`DiffConn::answer_whole`]: its HTTP framing is complete, or,
//! without HTTP, it is as long as the original) or for [`SETTLE_NS`] of silence, so an answer
//! that arrives in pieces is not cut in two. A target answer longer than the original in bytes
//! mode can still spill into the next one; both then count as different.
//!
//! Modes:
//! - bytes (default): both answers compared byte for byte after every `--diff-ignore` match
//!   is blanked out of each (`^`/`$` match at line starts and ends).
//! - http: each answer parsed as one HTTP/1.x response: the status line must be equal; header
//!   lines matching a `--diff-ignore` pattern are left out and the rest compared as a set
//!   (names case-insensitive, values trimmed, order free); the body is compared after
//!   de-chunking (Content-Length, chunked, or up to the close). An answer that is not HTTP is
//!   compared as bytes.
//!
//! Memory: each answer keeps at most [`RESPONSE_CAP`] body bytes (and a head of at most as
//! much); over it the bodies are compared by length and a 64-bit SipHash of all their bytes,
//! and counted as such. Bytes kept are counted ([`Differ::held_bytes`]) so the relay's
//! `--max-memory` covers them.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::hash::{DefaultHasher, Hasher};
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;

use crate::report::DiffStats;
use regex::bytes::{Regex, RegexBuilder};
use serde::Serialize;
use tcpkit_wire::http::{Event, ResponseFramer};

/// Body bytes kept per answer; longer bodies are compared by length and hash.
pub const RESPONSE_CAP: usize = 64 << 10;
/// How long a target answer that does not look whole yet may stay silent before the next
/// request is sent anyway.
pub const SETTLE_NS: u64 = 50_000_000;

/// What `--diff-mode` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffMode {
    Bytes,
    Http,
}

impl DiffMode {
    pub fn name(self) -> &'static str {
        match self {
            DiffMode::Bytes => "bytes",
            DiffMode::Http => "http",
        }
    }
}

/// `--diff` and its flags, resolved.
#[derive(Debug, Clone)]
pub struct DiffConfig {
    pub mode: DiffMode,
    /// `--diff-ignore`, compiled with `^`/`$` matching at line boundaries.
    pub ignore: Vec<Regex>,
    /// `--diff-max`: differences written to `out`, at most.
    pub max_written: u64,
    /// `--diff-out`.
    pub out: Option<PathBuf>,
}

impl PartialEq for DiffConfig {
    fn eq(&self, o: &DiffConfig) -> bool {
        self.mode == o.mode
            && self.max_written == o.max_written
            && self.out == o.out
            && self.ignore.len() == o.ignore.len()
            && self
                .ignore
                .iter()
                .zip(&o.ignore)
                .all(|(a, b)| a.as_str() == b.as_str())
    }
}

/// Compiles one `--diff-ignore` pattern the way both modes use it.
pub fn ignore_pattern(p: &str) -> Result<Regex, regex::Error> {
    RegexBuilder::new(p)
        .multi_line(true)
        // A pattern over untrusted bytes: bounded compiled size, so a pattern cannot take
        // the relay's memory.
        .size_limit(1 << 20)
        .build()
}

/// Bytes kept by answers, shared by every answer of one relay (single thread).
#[derive(Debug, Default)]
struct Held {
    n: usize,
    total: Rc<Cell<usize>>,
}

impl Held {
    fn add(&mut self, k: usize) {
        self.n += k;
        self.total.set(self.total.get() + k);
    }
}

impl Held {
    fn sub(&mut self, k: usize) {
        let k = k.min(self.n);
        self.n -= k;
        self.total.set(self.total.get().saturating_sub(k));
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.total.set(self.total.get().saturating_sub(self.n));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Http {
    /// A head is arriving (or none yet).
    Head,
    /// The head is whole; the body is arriving.
    Body,
    Done,
    /// Not an HTTP/1.x response (or bytes mode): compared as bytes.
    Opaque,
    /// The body's framing broke (a bad chunk size): the rest is compared as it comes.
    Loose,
}

/// The answer to one request turn being received: in http mode, the HTTP messages in it (a
/// turn of pipelined requests has several), the last one possibly still arriving.
#[derive(Debug)]
pub struct Acc {
    /// Messages received whole.
    msgs: Vec<Msg>,
    mode: DiffMode,
    http: Http,
    /// Where each message ends (knows when one answers HEAD: no body whatever the headers
    /// say).
    framer: ResponseFramer,
    raw_len: u64,
    /// The head in progress or whole, without its blank line (the framer's buffer while the
    /// head is split across pushes).
    head: Vec<u8>,
    body: Vec<u8>,
    body_len: u64,
    hash: DefaultHasher,
    held: Held,
}

/// One message of an answer (bytes mode: the whole answer).
#[derive(Debug, Default)]
pub struct Msg {
    /// HTTP mode: the status line and headers, without the blank line.
    head: Option<Vec<u8>>,
    /// The first [`RESPONSE_CAP`] bytes of the body (bytes mode: of the answer).
    body: Vec<u8>,
    body_len: u64,
    hash: u64,
}

impl Msg {
    fn mem(&self) -> usize {
        self.head.as_ref().map_or(0, Vec::len) + self.body.len()
    }
}

/// One whole answer: what the server sent between two request starts (http mode: the
/// messages completed in that time).
#[derive(Debug)]
pub struct Resp {
    raw_len: u64,
    msgs: Vec<Msg>,
    /// The capture lost part of this original answer: it is not compared (counted in
    /// [`DiffStats::original_incomplete`]).
    incomplete: bool,
    _held: Held,
}

/// Messages in one turn past which further bytes are folded into the last one (a client
/// pipelining without bound must not grow the list without bound).
const MAX_MSGS: usize = 1024;

impl Acc {
    fn new(mode: DiffMode, head_req: bool, total: &Rc<Cell<usize>>) -> Acc {
        Acc {
            msgs: Vec::new(),
            mode,
            http: if mode == DiffMode::Http {
                Http::Head
            } else {
                Http::Opaque
            },
            framer: {
                let mut f = ResponseFramer::default();
                f.expect_head_response(head_req);
                f
            },
            raw_len: 0,
            head: Vec::new(),
            body: Vec::new(),
            body_len: 0,
            hash: DefaultHasher::new(),
            held: Held {
                n: 0,
                total: Rc::clone(total),
            },
        }
    }

    fn body_bytes(&mut self, b: &[u8]) {
        self.body_len += b.len() as u64;
        self.hash.write(b);
        let keep = b.len().min(RESPONSE_CAP.saturating_sub(self.body.len()));
        self.body.extend_from_slice(&b[..keep]);
        self.held.add(keep);
    }

    /// Bytes of the answer, in order.
    pub fn push(&mut self, mut b: &[u8]) {
        self.raw_len += b.len() as u64;
        loop {
            match self.http {
                Http::Done if b.is_empty() => return,
                Http::Done if self.msgs.len() < MAX_MSGS => self.next_msg(),
                Http::Opaque | Http::Done | Http::Loose => {
                    // Bytes after a whole message count as body: a difference either way.
                    self.body_bytes(b);
                    return;
                }
                Http::Head | Http::Body => {
                    let before = self.head.len();
                    let step = self.framer.feed(b, &mut self.head);
                    // The framer buffers a split head in `head`: counted as kept.
                    match self.head.len().cmp(&before) {
                        std::cmp::Ordering::Greater => self.held.add(self.head.len() - before),
                        std::cmp::Ordering::Less => self.held.sub(before - self.head.len()),
                        std::cmp::Ordering::Equal => {}
                    }
                    let step = match step {
                        Ok(step) => step,
                        Err(_) if self.http == Http::Head => {
                            // Not a response worth parsing: what was kept and the rest are
                            // compared as bytes.
                            self.not_http();
                            continue;
                        }
                        Err(_) => {
                            self.http = Http::Loose;
                            continue;
                        }
                    };
                    match step.event {
                        Event::More => return,
                        Event::Head(h) => {
                            if !h.buffered {
                                self.head.extend_from_slice(&b[..step.used]);
                                self.held.add(step.used);
                            }
                            // Kept without the blank line that ends it.
                            let n = self.head.len();
                            while self.head.last().is_some_and(|&c| c == b'\n' || c == b'\r') {
                                self.head.pop();
                            }
                            self.held.sub(n - self.head.len());
                            self.http = Http::Body;
                        }
                        Event::Body { from } => self.body_bytes(&b[from..step.used]),
                        Event::End => self.http = Http::Done,
                    }
                    b = &b[step.used..];
                }
            }
        }
    }

    /// The message is whole: kept, and the next one starts.
    fn next_msg(&mut self) {
        self.msgs.push(Msg {
            head: Some(std::mem::take(&mut self.head)),
            body: std::mem::take(&mut self.body),
            body_len: std::mem::take(&mut self.body_len),
            hash: std::mem::take(&mut self.hash).finish(),
        });
        self.http = Http::Head;
    }

    /// The next message (when none is in progress) answers a HEAD request, or not.
    fn expect_head_response(&mut self, yes: bool) {
        self.framer.expect_head_response(yes);
    }

    /// The head turned out not to be HTTP: everything kept so far becomes the body.
    fn not_http(&mut self) {
        let h = std::mem::take(&mut self.head);
        self.http = Http::Opaque;
        self.body_len += h.len() as u64;
        self.hash.write(&h);
        self.body = h;
        self.body.truncate(RESPONSE_CAP);
    }

    /// Http mode: the messages received whole so far, handed over with their kept bytes.
    fn take_done(&mut self) -> Resp {
        if self.http == Http::Done && self.msgs.len() < MAX_MSGS {
            self.next_msg();
        }
        let msgs = std::mem::take(&mut self.msgs);
        let n: usize = msgs.iter().map(Msg::mem).sum();
        self.held.sub(n);
        let mut held = Held {
            n: 0,
            total: Rc::clone(&self.held.total),
        };
        held.add(n);
        Resp {
            raw_len: msgs.iter().map(|m| m.body_len).sum(),
            msgs,
            incomplete: false,
            _held: held,
        }
    }

    /// No message is in progress.
    fn at_boundary(&self) -> bool {
        self.http == Http::Head && self.head.is_empty()
    }

    /// HTTP messages received whole, and whether one is still arriving.
    fn http_progress(&self) -> (usize, bool) {
        let whole = self.msgs.len() + usize::from(self.http == Http::Done);
        let partial = !(self.http == Http::Done || self.at_boundary());
        (whole, partial)
    }

    /// The HTTP framing says every message so far is whole (and there is one).
    pub fn complete(&self) -> bool {
        let (whole, partial) = self.http_progress();
        self.mode == DiffMode::Http && whole > 0 && !partial
    }

    pub fn raw_len(&self) -> u64 {
        self.raw_len
    }

    fn finish(mut self) -> Resp {
        let (_, partial) = self.http_progress();
        let last = if self.mode == DiffMode::Http && self.http == Http::Head {
            // Ended inside a head: compared as the bytes it is.
            let mut h = DefaultHasher::new();
            h.write(&self.head);
            let n = self.head.len() as u64;
            Msg {
                head: None,
                body: std::mem::take(&mut self.head),
                body_len: n,
                hash: h.finish(),
            }
        } else {
            let http = self.mode == DiffMode::Http && self.http != Http::Opaque;
            Msg {
                head: http.then(|| std::mem::take(&mut self.head)),
                body: std::mem::take(&mut self.body),
                body_len: self.body_len,
                hash: self.hash.finish(),
            }
        };
        let mut msgs = self.msgs;
        let bytes_mode_answer = self.mode == DiffMode::Bytes && self.raw_len > 0;
        let http_answer = self.mode == DiffMode::Http && (partial || self.http == Http::Done);
        if http_answer || bytes_mode_answer {
            msgs.push(last);
        }
        Resp {
            raw_len: self.raw_len,
            msgs,
            incomplete: false,
            _held: self.held,
        }
    }
}

fn trim_cr(l: &[u8]) -> &[u8] {
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// Why two answers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Bytes mode: the (masked) bytes differ.
    Bytes,
    /// Over the cap: lengths or hashes differ.
    Length,
    Hash,
    Status,
    Headers,
    Body,
    /// One answer is HTTP and the other is not.
    NotHttp,
    /// One side has a message (of pipelined requests) the other lacks.
    Missing,
}

/// The verdict on one pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub diff: Option<Reason>,
    /// A body over the cap was compared by length and hash.
    pub by_hash: bool,
}

fn mask<'a>(b: &'a [u8], ignore: &[Regex]) -> std::borrow::Cow<'a, [u8]> {
    let mut out = std::borrow::Cow::Borrowed(b);
    for r in ignore {
        if let std::borrow::Cow::Owned(o) = r.replace_all(&out, &b""[..]) {
            out = std::borrow::Cow::Owned(o);
        }
    }
    out
}

/// Header lines not ignored, as (lowercase name, trimmed value), sorted.
fn headers<'a>(head: &'a [u8], ignore: &[Regex]) -> Vec<(Vec<u8>, &'a [u8])> {
    let mut v: Vec<(Vec<u8>, &[u8])> = head
        .split(|&c| c == b'\n')
        .map(trim_cr)
        .skip(1)
        .filter(|l| !l.is_empty() && !ignore.iter().any(|r| r.is_match(l)))
        .map(|l| match l.iter().position(|&c| c == b':') {
            Some(i) => (l[..i].to_ascii_lowercase(), l[i + 1..].trim_ascii()),
            None => (l.to_vec(), &b""[..]),
        })
        .collect();
    v.sort();
    v
}

fn bodies(a: &Msg, b: &Msg, ignore: &[Regex], masked: bool) -> Verdict {
    let over = a.body_len > RESPONSE_CAP as u64 || b.body_len > RESPONSE_CAP as u64;
    let diff = if over {
        if a.body_len != b.body_len {
            Some(Reason::Length)
        } else if a.hash != b.hash {
            Some(Reason::Hash)
        } else {
            None
        }
    } else if masked {
        (mask(&a.body, ignore) != mask(&b.body, ignore)).then_some(Reason::Bytes)
    } else {
        (a.body != b.body).then_some(Reason::Body)
    };
    Verdict {
        diff,
        by_hash: over,
    }
}

/// Compares a message of the original answer, `a`, with the target's, `b`.
pub fn compare(a: &Msg, b: &Msg, mode: DiffMode, ignore: &[Regex]) -> Verdict {
    match (mode, &a.head, &b.head) {
        (DiffMode::Http, Some(ha), Some(hb)) => {
            let status =
                |h: &[u8]| trim_cr(h.split(|&c| c == b'\n').next().unwrap_or_default()).to_vec();
            let diff = if status(ha) != status(hb) {
                Some(Reason::Status)
            } else if headers(ha, ignore) != headers(hb, ignore) {
                Some(Reason::Headers)
            } else {
                return bodies(a, b, ignore, false);
            };
            Verdict {
                diff,
                by_hash: false,
            }
        }
        (DiffMode::Http, Some(_), None) | (DiffMode::Http, None, Some(_)) => Verdict {
            diff: Some(Reason::NotHttp),
            by_hash: false,
        },
        _ => bodies(a, b, ignore, true),
    }
}

/// Answer bytes escaped for diffs.jsonl: printable ASCII, CR, LF and TAB as they are (JSON
/// escapes the controls), a backslash doubled, any other byte as `\xNN`.
pub fn escape(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            b'\r' | b'\n' | b'\t' | 0x20..=0x7e => s.push(c as char),
            _ => {
                let _ = fmt::Write::write_fmt(&mut s, format_args!("\\x{c:02x}"));
            }
        }
    }
    s
}

#[derive(Serialize)]
struct Side {
    /// Bytes of this message (http mode: head, blank line and de-chunked body).
    length: u64,
    /// The text shows the first RESPONSE_CAP body bytes only.
    truncated: bool,
    /// Head, blank line and (de-chunked) body in http mode; the bytes in bytes mode.
    text: String,
}

impl Side {
    fn of(r: &Msg) -> Side {
        let mut text = String::new();
        if let Some(h) = &r.head {
            text = escape(h);
            text.push_str("\r\n\r\n");
        }
        text.push_str(&escape(&r.body));
        Side {
            length: r.head.as_ref().map_or(0, |h| h.len() as u64 + 4) + r.body_len,
            truncated: r.body_len > r.body.len() as u64,
            text,
        }
    }
}

#[derive(Serialize)]
struct Record {
    session: u64,
    /// Which of the `-n` copies (1-based).
    copy: u32,
    /// The request turn within the session (1-based; 0 is a greeting before any request).
    request: u64,
    /// The message within the turn's answer (1-based; above 1 for pipelined requests).
    message: usize,
    client: SocketAddr,
    server: SocketAddr,
    target: SocketAddr,
    reason: Reason,
    original: Side,
    #[serde(rename = "target_response")]
    target_resp: Side,
}

/// The comparisons of one relay run: counters and the differences file.
#[derive(Debug)]
pub struct Differ {
    pub cfg: DiffConfig,
    stats: DiffStats,
    out: Option<BufWriter<File>>,
    total: Rc<Cell<usize>>,
    /// The line saying writing stopped, until the session front has said it.
    news: Option<String>,
    /// Bytes of whole records in `out`: a record a full disk took only part of is cut off.
    out_len: u64,
}

impl Differ {
    /// Creates `--diff-out` (truncating it).
    pub fn new(cfg: DiffConfig) -> io::Result<Differ> {
        let out = match &cfg.out {
            Some(p) => Some(BufWriter::new(File::create(p)?)),
            None => None,
        };
        let stats = DiffStats {
            mode: cfg.mode.name().into(),
            out: cfg.out.as_ref().map(|p| p.display().to_string()),
            cap_bytes: RESPONSE_CAP as u64,
            ..DiffStats::default()
        };
        Ok(Differ {
            cfg,
            stats,
            out,
            total: Rc::new(Cell::new(0)),
            news: None,
            out_len: 0,
        })
    }

    /// Answer bytes kept by every comparison not made yet.
    pub fn held_bytes(&self) -> usize {
        self.total.get()
    }

    pub fn stats(&self) -> &DiffStats {
        &self.stats
    }

    /// The line saying `--diff-out` could not be written, once, when it first fails.
    pub fn take_news(&mut self) -> Option<String> {
        self.news.take()
    }

    /// The counters for the report; flushes the differences file (a failed write is the
    /// report's `write_error`, not a failed run: the comparisons were made).
    pub fn finish(&mut self) -> DiffStats {
        if let Some(mut w) = self.out.take() {
            if let Err(e) = w.flush() {
                self.stats.write_error.get_or_insert(e.to_string());
            }
        }
        self.stats.clone()
    }

    /// The capture side of one session.
    pub fn original(&self, syn_seen: bool) -> OrigSide {
        OrigSide {
            acc: Acc::new(self.cfg.mode, false, &self.total),
            syn_seen,
            requests: 0,
            lost: false,
        }
    }

    /// The target side of one copy.
    pub fn conn(&self, meta: ConnMeta) -> DiffConn {
        DiffConn {
            meta,
            orig: VecDeque::new(),
            flat_o: VecDeque::new(),
            flat_t: VecDeque::new(),
            orig_msgs: 0,
            tgt_msgs: 0,
            orig_later: VecDeque::new(),
            heads: VecDeque::new(),
            cur: Acc::new(self.cfg.mode, false, &self.total),
            index: 0,
            incomplete: VecDeque::new(),
        }
    }

    /// [`Differ::judge`], unless the capture lost part of the original `a`: then it is
    /// counted as such.
    fn judge_or_skip(&mut self, meta: &ConnMeta, index: u64, a: &Resp, b: &Resp) {
        if a.incomplete {
            self.stats.original_incomplete += 1;
        } else {
            self.judge(meta, index, a, b);
        }
    }

    fn judge(&mut self, meta: &ConnMeta, index: u64, a: &Resp, b: &Resp) {
        let none = Msg::default();
        for i in 0..a.msgs.len().max(b.msgs.len()) {
            let (ma, mb) = (a.msgs.get(i), b.msgs.get(i));
            let v = match (ma, mb) {
                (Some(x), Some(y)) => compare(x, y, self.cfg.mode, &self.cfg.ignore),
                _ => Verdict {
                    diff: Some(Reason::Missing),
                    by_hash: false,
                },
            };
            self.count(
                meta,
                index,
                i + 1,
                v,
                ma.unwrap_or(&none),
                mb.unwrap_or(&none),
            );
        }
    }

    fn count(&mut self, meta: &ConnMeta, index: u64, message: usize, v: Verdict, a: &Msg, b: &Msg) {
        let s = &mut self.stats;
        s.compared += 1;
        s.compared_by_hash += u64::from(v.by_hash);
        let Some(reason) = v.diff else {
            s.equal += 1;
            return;
        };
        s.different += 1;
        if s.written + s.not_written >= self.cfg.max_written {
            return;
        }
        if s.write_error.is_some() {
            s.not_written += 1;
            return;
        }
        let Some(w) = self.out.as_mut() else { return };
        let rec = Record {
            session: meta.session,
            copy: meta.copy,
            request: index,
            message,
            client: meta.client,
            server: meta.server,
            target: meta.target,
            reason,
            original: Side::of(a),
            target_resp: Side::of(b),
        };
        // Flushed per record (at most --diff-max of them): `written` then counts what is in
        // the file, not what sits in a buffer a full disk will refuse at the end.
        let mut line = serde_json::to_vec(&rec).unwrap_or_default();
        line.push(b'\n');
        match w.write_all(&line).and_then(|()| w.flush()) {
            Ok(()) => {
                s.written += 1;
                self.out_len += line.len() as u64;
            }
            Err(e) => {
                // Out of disk or the like: stop writing, keep comparing and counting; said
                // once now, and in the report.
                s.not_written += 1;
                self.news = Some(format!(
                    "--diff-out {}: cannot write ({e}): {} differences written; the rest are \
                     still compared and counted, not written",
                    s.out.as_deref().unwrap_or_default(),
                    s.written
                ));
                s.write_error.get_or_insert(e.to_string());
                // The part of this record the disk took goes, and what the buffer still holds
                // is dropped unwritten: the file keeps whole records only.
                if let Some(w) = self.out.take() {
                    let (f, _) = w.into_parts();
                    let _ = f.set_len(self.out_len);
                }
            }
        }
    }
}

/// The capture side of a session: the original server's answers, cut at request starts
/// (bytes mode) or parsed as one stream of HTTP messages handed out as they complete (http
/// mode: a message still arriving when the client's next request starts stays for later).
#[derive(Debug)]
pub struct OrigSide {
    acc: Acc,
    syn_seen: bool,
    requests: u64,
    /// The capture lost bytes of the answer in progress.
    lost: bool,
}

impl OrigSide {
    pub fn server_bytes(&mut self, b: &[u8]) {
        if self.lost && self.acc.mode == DiffMode::Http {
            // Past a hole the HTTP framing cannot be followed: the rest of this answer is
            // only counted, and the next request's answer starts afresh.
            self.acc.raw_len += b.len() as u64;
            return;
        }
        self.acc.push(b);
    }

    /// The capture lost `len` bytes of the server's answer in progress: that answer is not
    /// compared, but its length still tells how long the target's answer should be.
    pub fn server_gap(&mut self, len: u64) {
        self.lost = true;
        self.acc.raw_len += len;
    }

    /// The answer just cut at a request start (or the end), marked when the capture lost
    /// part of it.
    fn cut(&mut self, mut r: Resp) -> Resp {
        if std::mem::take(&mut self.lost) {
            r.incomplete = true;
            r.msgs.clear();
        }
        r
    }

    /// A request starts with `first`: returns the answer before it (bytes mode) or the
    /// messages completed since the last request start (http mode), with the request's
    /// index, for every copy of the session; none for the bytes before a mid-stream join.
    pub fn request_starts(&mut self, differ: &Differ, first: &[u8]) -> Option<(u64, Rc<Resp>)> {
        let head_req = first.starts_with(b"HEAD ");
        let k = self.requests;
        self.requests += 1;
        let keep = k > 0 || self.syn_seen;
        let fresh = || Acc::new(differ.cfg.mode, head_req, &differ.total);
        let batch = if differ.cfg.mode == DiffMode::Bytes || !keep || self.lost {
            // Before a mid-stream join nothing is kept, a message in progress included.
            std::mem::replace(&mut self.acc, fresh()).finish()
        } else {
            let b = self.acc.take_done();
            if self.acc.at_boundary() {
                self.acc.expect_head_response(head_req);
            }
            b
        };
        let batch = self.cut(batch);
        keep.then(|| (k, Rc::new(batch)))
    }

    /// The session ended: the last answer (or messages), when the server gave one.
    pub fn close(self) -> Option<(u64, Rc<Resp>)> {
        let OrigSide {
            acc,
            requests,
            lost,
            ..
        } = self;
        if requests == 0 || acc.raw_len == 0 {
            return None;
        }
        let mut last = acc.finish();
        if lost {
            last.incomplete = true;
            last.msgs.clear();
        }
        Some((requests, Rc::new(last)))
    }
}

/// Who a copy is, for diffs.jsonl.
#[derive(Debug, Clone, Copy)]
pub struct ConnMeta {
    pub session: u64,
    pub copy: u32,
    pub client: SocketAddr,
    pub server: SocketAddr,
    pub target: SocketAddr,
}

/// The target side of one copy: its answers, paired with the original ones by request
/// index (bytes mode) or by HTTP message order (http mode).
#[derive(Debug)]
pub struct DiffConn {
    meta: ConnMeta,
    /// Bytes mode: original answers by request index.
    orig: VecDeque<(u64, Rc<Resp>)>,
    /// Http mode: original and target messages not paired yet, each with its request index
    /// and place in its batch.
    flat_o: VecDeque<(u64, usize, Rc<Resp>)>,
    flat_t: VecDeque<(u64, usize, Rc<Resp>)>,
    /// Http mode: messages of the original answers up to the request in flight, and of the
    /// target's taken.
    orig_msgs: usize,
    tgt_msgs: usize,
    /// Http mode: message counts of original answers to requests not sent yet (a copy that
    /// lags the capture has several): they count toward `orig_msgs` once their request is
    /// the one in flight, not before, or every answer would look short of them.
    orig_later: VecDeque<(u64, usize)>,
    /// Whether each request queued and not sent yet is a HEAD.
    heads: VecDeque<bool>,
    cur: Acc,
    /// The request `cur` answers (0 before the first).
    index: u64,
    /// Http mode: indexes of original answers the capture lost part of; the target's
    /// messages of those turns are left out of the pairing.
    incomplete: VecDeque<u64>,
}

impl DiffConn {
    fn http(&self) -> bool {
        self.cur.mode == DiffMode::Http
    }

    /// The original answer `index` (http mode: messages completed by then), from the capture.
    pub fn original(&mut self, index: u64, r: Rc<Resp>) {
        if self.http() && r.incomplete {
            self.incomplete.push_back(index);
            return;
        }
        if self.http() {
            if index <= self.index {
                self.orig_msgs += r.msgs.len();
            } else {
                self.orig_later.push_back((index, r.msgs.len()));
            }
            for i in 0..r.msgs.len() {
                self.flat_o.push_back((index, i, Rc::clone(&r)));
            }
        } else {
            self.orig.push_back((index, r));
        }
    }

    /// A request was queued for this copy; `first` are its first bytes.
    pub fn request_queued(&mut self, first: &[u8]) {
        self.heads.push_back(first.starts_with(b"HEAD "));
    }

    pub fn target_bytes(&mut self, b: &[u8]) {
        self.cur.push(b);
    }

    fn orig_for(&mut self, k: u64) -> Option<Rc<Resp>> {
        while self.orig.front().is_some_and(|(i, _)| *i < k) {
            self.orig.pop_front();
        }
        match self.orig.front() {
            Some((i, _)) if *i == k => self.orig.pop_front().map(|(_, r)| r),
            _ => None,
        }
    }

    /// The target's answer to the request in flight looks whole: in http mode no message is
    /// half received and there are as many as the original server sent up to that request;
    /// otherwise it is at least as long as the original answer.
    pub fn answer_whole(&self) -> bool {
        if self.http() && self.cur.http != Http::Opaque {
            let (whole, partial) = self.cur.http_progress();
            return !partial && self.tgt_msgs + whole >= self.orig_msgs.max(1);
        }
        let orig = self.orig.iter().find(|(i, _)| *i == self.index);
        orig.is_none_or(|(_, r)| self.cur.raw_len >= r.raw_len)
    }

    /// Http mode: a message of the answer in flight is certainly not over (its framing says
    /// more bytes are due), as opposed to merely fewer messages than the original's.
    pub fn answer_partial(&self) -> bool {
        self.http() && self.cur.http != Http::Opaque && self.cur.http_progress().1
    }

    /// The next request is being sent: the answer to the one before is compared.
    pub fn request_sent(&mut self, differ: &mut Differ) {
        let head_req = self.heads.pop_front().unwrap_or(false);
        let k = self.index;
        self.index += 1;
        while let Some(&(i, n)) = self.orig_later.front() {
            if i > self.index {
                break;
            }
            self.orig_msgs += n;
            self.orig_later.pop_front();
        }
        if self.http() {
            let batch = self.cur.take_done();
            if self.cur.at_boundary() {
                self.cur.expect_head_response(head_req);
            }
            self.take_target(k, batch, differ);
            return;
        }
        let prev = std::mem::replace(
            &mut self.cur,
            Acc::new(differ.cfg.mode, head_req, &differ.total),
        );
        let got = prev.finish();
        // No original answer (a greeting before a mid-stream join, or a last request the
        // server never answered): nothing to compare it with.
        if let Some(o) = self.orig_for(k) {
            differ.judge_or_skip(&self.meta, k, &o, &got);
        }
    }

    /// Http mode: the target's messages of request `k`, paired with the original ones in
    /// order.
    fn take_target(&mut self, k: u64, batch: Resp, differ: &mut Differ) {
        while self.incomplete.front().is_some_and(|&i| i < k) {
            self.incomplete.pop_front();
        }
        if self.incomplete.front() == Some(&k) {
            // The original of this turn is incomplete: the target's messages of the turn are
            // not paired (nor counted against the original's), so later ones still pair.
            self.incomplete.pop_front();
            differ.stats.original_incomplete += 1;
            return;
        }
        self.tgt_msgs += batch.msgs.len();
        let batch = Rc::new(batch);
        for i in 0..batch.msgs.len() {
            self.flat_t.push_back((k, i, Rc::clone(&batch)));
        }
        while !self.flat_o.is_empty() && !self.flat_t.is_empty() {
            let (Some((ko, io, o)), Some((_, it, t))) =
                (self.flat_o.pop_front(), self.flat_t.pop_front())
            else {
                break;
            };
            let v = compare(
                &o.msgs[io],
                &t.msgs[it],
                differ.cfg.mode,
                &differ.cfg.ignore,
            );
            differ.count(&self.meta, ko, io + 1, v, &o.msgs[io], &t.msgs[it]);
        }
    }

    /// The copy ended; `whole` when it closed normally, so the last answer is complete.
    pub fn closed(mut self, differ: &mut Differ, whole: bool) {
        let k = self.index;
        let cur = std::mem::replace(
            &mut self.cur,
            Acc::new(differ.cfg.mode, false, &differ.total),
        );
        if !whole {
            // Requests sent whose answers the copy's failure or the run's end cut.
            differ.stats.not_compared += if self.http() {
                self.flat_o.len() as u64 + u64::from(cur.raw_len > 0 && cur.http_progress().1)
            } else {
                u64::from(k > 0)
            };
            return;
        }
        if !self.http() {
            let got = cur.finish();
            if let Some(o) = self.orig_for(k) {
                differ.judge_or_skip(&self.meta, k, &o, &got);
            }
            return;
        }
        self.take_target(k, cur.finish(), differ);
        // What one side has and the other never sent is a difference of its own.
        let none = Msg::default();
        let missing = Verdict {
            diff: Some(Reason::Missing),
            by_hash: false,
        };
        for (ko, io, o) in std::mem::take(&mut self.flat_o) {
            differ.count(&self.meta, ko, io + 1, missing, &o.msgs[io], &none);
        }
        for (kt, it, t) in std::mem::take(&mut self.flat_t) {
            differ.count(&self.meta, kt, it + 1, missing, &none, &t.msgs[it]);
        }
    }
}

#[cfg(test)]
mod tests;
