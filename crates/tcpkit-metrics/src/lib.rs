//! A Prometheus scrape endpoint (`--metrics ADDR` of copy and balance up): the text
//! exposition format served over HTTP/1.0, `GET /metrics` only, by a small responder on its
//! own thread. It is a listening socket like any other: at most MAX_CONNS connections at once
//! in one poll loop (past that the oldest still sending its head is closed for the newcomer,
//! so silent peers never keep a scraper waiting), the request head bounded (MAX_HEAD bytes,
//! else 431) and due within HEAD_DEADLINE of the connect, the answer written within another
//! HEAD_DEADLINE, one response then close, and out of descriptors it pauses accepting instead
//! of exiting. The body is the caller's, computed per scrape from counters it already keeps, so
//! a scrape never touches a job's hot path.
//!
//! A part of its own: a listening socket with its own rules (README's "What listens"), used by
//! two jobs, with nothing to do with counting or reports; [`family`] and [`sample`] write the
//! exposition lines each job's body is made of.

#![warn(missing_docs)]

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request head read; a larger one is answered 431.
pub const MAX_HEAD: usize = 8192;
/// How long a peer has, from its connect, to send the whole request head (and then again to
/// read the answer).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// Connections served at once. A scraper is one client; the rest is room for a few more and
/// for peers that never send, which are closed oldest first when a newcomer needs the room.
pub const MAX_CONNS: usize = 32;
/// How much of what a peer sends after an oversize head is read before closing, so the close
/// does not reset the 431 away.
const DRAIN: usize = 1 << 16;

/// The exposition text of one scrape.
pub type Body = dyn Fn() -> String + Send + Sync;

/// The running responder; stops and joins its thread on [`Metrics::stop`] or drop.
#[derive(Debug)]
pub struct Metrics {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Binds `addr` (the error is the caller's to report: address in use, no permission) and
/// starts serving `body()` on `GET /metrics`.
pub fn start(addr: SocketAddr, body: Arc<Body>) -> io::Result<Metrics> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(&listener, body.as_ref(), &flag))?;
    Ok(Metrics {
        addr,
        stop,
        thread: Some(thread),
    })
}

impl Metrics {
    /// The address bound (the port chosen when ADDR said 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the responder and joins its thread (also done on drop).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where one connection is in its single exchange.
enum Stage {
    /// Reading the request head.
    Head(Vec<u8>),
    /// Writing the answer; `drain` when the head was too large (read what follows, then close).
    Answer {
        out: Vec<u8>,
        sent: usize,
        drain: bool,
    },
    /// After a 431: reading (up to `left` bytes) until the peer closes.
    Drain { left: usize },
}

struct Conn {
    s: TcpStream,
    due: Instant,
    stage: Stage,
}

/// What a readiness event left the connection as.
enum Next {
    Keep,
    Close,
}

fn serve(l: &TcpListener, body: &Body, stop: &AtomicBool) {
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNS);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CONNS + 1);
    let mut paused_until: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        conns.retain(|c| c.due > now);
        if paused_until.is_some_and(|t| t <= now) {
            paused_until = None;
        }
        // Wake for the stop flag (200 ms), the nearest deadline, or the end of a pause.
        let wake = conns
            .iter()
            .map(|c| c.due)
            .chain(paused_until)
            .min()
            .map_or(200, |t| {
                let ms = t.saturating_duration_since(now).as_millis() + 1;
                i32::try_from(ms.min(200)).unwrap_or(200)
            });
        fds.clear();
        fds.push(libc::pollfd {
            fd: l.as_raw_fd(),
            events: if paused_until.is_some() {
                0
            } else {
                libc::POLLIN
            },
            revents: 0,
        });
        fds.extend(conns.iter().map(|c| libc::pollfd {
            fd: c.s.as_raw_fd(),
            events: match c.stage {
                Stage::Answer { .. } => libc::POLLOUT,
                Stage::Head(_) | Stage::Drain { .. } => libc::POLLIN,
            },
            revents: 0,
        }));
        let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: `fds` is a valid array of `nfds` pollfds for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), nfds, wake) };
        if ready <= 0 {
            continue;
        }
        // Connections first (their indices are fds[1..]), then the listener, which may push.
        let mut i = conns.len();
        while i > 0 {
            i -= 1;
            if fds[i + 1].revents == 0 {
                continue;
            }
            if matches!(step(&mut conns[i], body), Next::Close) {
                conns.swap_remove(i);
            }
        }
        if fds[0].revents != 0 {
            paused_until = accept_all(l, &mut conns);
        }
    }
}

/// Takes every waiting connection. Past MAX_CONNS the oldest one still sending its head makes
/// room (a scraper sends at once, a silent peer never does); when every slot is answering, the
/// newcomer is closed. Out of descriptors (or another accept failure) returns when to try
/// again, rather than spinning on a listener that stays readable; never an exit.
fn accept_all(l: &TcpListener, conns: &mut Vec<Conn>) -> Option<Instant> {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                if conns.len() >= MAX_CONNS {
                    let oldest = conns
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| matches!(c.stage, Stage::Head(_)))
                        .min_by_key(|(_, c)| c.due)
                        .map(|(i, _)| i);
                    match oldest {
                        Some(i) => drop(conns.swap_remove(i)),
                        None => continue,
                    }
                }
                if s.set_nonblocking(true).is_err() {
                    continue;
                }
                conns.push(Conn {
                    s,
                    due: Instant::now() + HEAD_DEADLINE,
                    stage: Stage::Head(Vec::with_capacity(512)),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Some(Instant::now() + Duration::from_millis(100)),
        }
    }
}

/// Moves one connection on as far as its socket allows.
fn step(c: &mut Conn, body: &Body) -> Next {
    let mut buf = [0u8; 1024];
    loop {
        match &mut c.stage {
            Stage::Head(req) => match c.s.read(&mut buf) {
                Ok(0) if req.is_empty() => return Next::Close,
                // A client that half-closes after its head is answered with what it sent.
                Ok(0) => c.stage = answer(req, body),
                Ok(n) => {
                    req.extend_from_slice(&buf[..n]);
                    if req.len() > MAX_HEAD || head_complete(req) {
                        c.stage = answer(req, body);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Next::Keep,
                Err(_) => return Next::Close,
            },
            Stage::Answer { out, sent, drain } => match c.s.write(&out[*sent..]) {
                Ok(n) => {
                    *sent += n;
                    if *sent < out.len() {
                        continue;
                    }
                    if !*drain {
                        return Next::Close;
                    }
                    let _ = c.s.shutdown(std::net::Shutdown::Write);
                    c.stage = Stage::Drain { left: DRAIN };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Next::Keep,
                Err(_) => return Next::Close,
            },
            Stage::Drain { left } => match c.s.read(&mut buf) {
                Ok(0) => return Next::Close,
                Ok(n) if n >= *left => return Next::Close,
                Ok(n) => *left -= n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Next::Keep,
                Err(_) => return Next::Close,
            },
        }
        if matches!(c.stage, Stage::Answer { sent: 0, .. }) {
            // The answer gets its own deadline: a peer that sent its head but does not read
            // is closed as surely as one that never sent.
            c.due = Instant::now() + HEAD_DEADLINE;
        }
    }
}

fn head_complete(req: &[u8]) -> bool {
    req.windows(4).any(|w| w == b"\r\n\r\n") || req.windows(2).any(|w| w == b"\n\n")
}

/// The answer to a request head (or to what came of it before the peer stopped sending).
fn answer(req: &[u8], body: &Body) -> Stage {
    if req.len() > MAX_HEAD {
        return Stage::Answer {
            out: response(
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            ),
            sent: 0,
            drain: true,
        };
    }
    let line = req.split(|&c| c == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|&c| c == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = path.split(|&c| c == b'?').next().unwrap_or_default();
    let out = match (method, path) {
        (b"GET", b"/metrics") => response(
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &body(),
        ),
        (b"GET", _) => response("404 Not Found", "text/plain", "try /metrics\n"),
        _ => response("405 Method Not Allowed", "text/plain", "GET /metrics\n"),
    };
    Stage::Answer {
        out,
        sent: 0,
        drain: false,
    }
}

fn response(status: &str, ctype: &str, body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// A metric family's `# HELP` and `# TYPE` lines.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample, with its labels (values escaped as the format asks: backslash, quote,
/// newline).
pub fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(out, "{k}=\"{v}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn responder() -> Metrics {
        start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(|| "x_total 1\n".to_string()),
        )
        .unwrap()
    }

    fn scrape(addr: SocketAddr, req: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// True while the responder has not closed `s` (nothing to read yet, no EOF).
    fn still_open(s: &TcpStream) -> bool {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        matches!(s.peek(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Silent peers used to hold the only responder 2 s each, so a scraper behind three of
    /// them waited 6 s. Now they wait beside it: the scrape is answered while every silent peer
    /// is still open (before any of their 2 s could run out), and more silent peers than the
    /// responder's room only push the oldest of them out.
    #[test]
    fn silent_peers_do_not_keep_a_scraper_waiting() {
        let m = responder();
        let silent: Vec<TcpStream> = (0..MAX_CONNS + 8)
            .map(|_| TcpStream::connect(m.addr()).unwrap())
            .collect();
        let got = scrape(m.addr(), "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(got.starts_with("HTTP/1.0 200 OK\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\nx_total 1\n"), "{got}");
        let open = silent.iter().filter(|s| still_open(s)).count();
        // The newest ones hold the room (the scraper made one more leave).
        assert!(
            open >= MAX_CONNS - 1,
            "{open} of {} still open",
            silent.len()
        );
        assert!(open < silent.len(), "nothing was pushed out");
    }

    #[test]
    fn a_silent_peer_is_closed_after_the_deadline() {
        let m = responder();
        let mut s = TcpStream::connect(m.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let t = Instant::now();
        let mut b = [0u8; 16];
        assert_eq!(s.read(&mut b).unwrap(), 0);
        assert!(
            t.elapsed() + Duration::from_millis(50) >= HEAD_DEADLINE,
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn oversize_heads_get_431_and_other_requests_their_status() {
        let m = responder();
        let big = format!(
            "GET /metrics HTTP/1.0\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        assert!(scrape(m.addr(), &big).starts_with("HTTP/1.0 431 "));
        assert!(scrape(m.addr(), "POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 405 "));
        assert!(scrape(m.addr(), "GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404 "));
        // A head sent a byte at a time still counts as one head.
        let mut s = TcpStream::connect(m.addr()).unwrap();
        for b in b"GET /metrics?x=1 HTTP/1.0\n\n" {
            s.write_all(&[*b]).unwrap();
        }
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.0 200 OK"), "{out}");
    }

    #[test]
    fn labels_are_escaped() {
        let mut s = String::new();
        family(&mut s, "x_total", "counter", "X.");
        sample(&mut s, "x_total", &[("a", "q\"b\\c\nd"), ("z", "1")], 3);
        sample(&mut s, "x_total", &[], 4);
        assert_eq!(
            s,
            "# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"q\\\"b\\\\c\\nd\",z=\"1\"} 3\nx_total 4\n"
        );
    }
}
