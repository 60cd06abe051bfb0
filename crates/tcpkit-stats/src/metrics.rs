//! A Prometheus scrape endpoint (`--metrics ADDR` of copy and balance up): the text
//! exposition format served over HTTP/1.0, `GET /metrics` only, by a small responder on its
//! own thread. It is a listening socket like any other: one connection at a time (a scraper
//! is one client), the request head bounded (MAX_HEAD bytes, else 431) and due within
//! HEAD_DEADLINE of the connect, one response then close, and out of descriptors it pauses
//! accepting instead of exiting. The body is the caller's, computed per scrape from counters
//! it already keeps, so a scrape never touches a job's hot path.

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
/// How long a peer has, from its connect, to send the whole request head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);

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

/// Waits for a connection for at most `ms` (so the stop flag is seen within that).
fn readable(l: &TcpListener, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

fn serve(l: &TcpListener, body: &Body, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if !readable(l, 200) {
            continue;
        }
        match l.accept() {
            // A client that fails mid-request is its own problem; the next one is served.
            Ok((s, _)) => {
                let _ = answer(s, body);
            }
            // Out of descriptors (or another accept failure): pause rather than spin on a
            // listener that stays readable; never exit.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn answer(mut s: TcpStream, body: &Body) -> io::Result<()> {
    // One deadline for the whole head, not per read: a peer sending a byte at a time does not
    // keep the (only) responder longer than a silent one.
    let deadline = Instant::now() + HEAD_DEADLINE;
    s.set_write_timeout(Some(HEAD_DEADLINE))?;
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
        if req.len() > MAX_HEAD {
            respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            )?;
            // Read what the client still sends, so closing does not reset the answer away.
            s.shutdown(std::net::Shutdown::Write)?;
            let mut left = 1 << 16;
            while left > 0 {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left -= n.min(left),
                }
            }
            return Ok(());
        }
    }
    let line = req.split(|&c| c == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|&c| c == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = path.split(|&c| c == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET", b"/metrics") => respond(
            &mut s,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &body(),
        ),
        (b"GET", _) => respond(&mut s, "404 Not Found", "text/plain", "try /metrics\n"),
        _ => respond(
            &mut s,
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n",
        ),
    }
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
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
