//! `--metrics ADDR`: the relay's live counters in Prometheus' text exposition format, served
//! by the shared responder (`tcpkit_metrics`: HTTP/1.0 `GET /metrics`, bounded head,
//! deadline, 32 connections at once in one poll loop).
//!
//! The body only reads the [`CopyCounters`] atomics the relay already publishes once per loop turn,
//! so a scrape never touches the relay's thread.

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::CopyCounters;

pub use tcpkit_metrics::Metrics;

/// Binds `addr` (the error is the caller's to report: address in use, no permission) and
/// starts serving the relay's counters.
pub fn start(addr: SocketAddr, live: Arc<CopyCounters>, info: Info) -> io::Result<Metrics> {
    let started = Instant::now();
    tcpkit_metrics::start(
        addr,
        Arc::new(move || exposition(&live, info, started.elapsed())),
    )
}

/// Figures fixed for the run, exported beside the counters.
#[derive(Debug, Clone, Copy)]
pub struct Info {
    /// `--max-memory`.
    pub limit_bytes: u64,
    /// `--diff` is on (its counters are exported).
    pub diff: bool,
}

/// The exposition text: one `# HELP`, `# TYPE` and sample per metric.
pub fn exposition(live: &CopyCounters, info: Info, elapsed: Duration) -> String {
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (copied, answered) = (g(&live.requests_copied), g(&live.requests_answered));
    let at_source = g(&live.requests_at_source);
    let loss = live.loss_percent() / 100.0;
    let mut m: Vec<(&str, &str, &str, String)> = vec![
        (
            "seconds",
            "gauge",
            "Seconds since the copy started.",
            format!("{:.3}", elapsed.as_secs_f64()),
        ),
        (
            "sessions_seen_total",
            "counter",
            "Client sessions to a copied server seen in the capture.",
            g(&live.sessions_seen).to_string(),
        ),
        (
            "copies_total",
            "counter",
            "Connections to the target made for selected sessions (-n per session).",
            g(&live.copies).to_string(),
        ),
        (
            "copies_open",
            "gauge",
            "Copies running now.",
            g(&live.open).to_string(),
        ),
        (
            "copies_completed_total",
            "counter",
            "Copies that sent every request, got every awaited answer and closed.",
            g(&live.completed).to_string(),
        ),
        (
            "copies_failed_total",
            "counter",
            "Copies that failed (refused, reset, timeout, closed early, lost capture data, shed).",
            g(&live.failed).to_string(),
        ),
        (
            "requests_copied_total",
            "counter",
            "Requests sent to the target.",
            copied.to_string(),
        ),
        (
            "requests_at_source_total",
            "counter",
            "Requests of the copied sessions seen at the source, once per copy.",
            at_source.to_string(),
        ),
        (
            "requests_answered_total",
            "counter",
            "Requests the target answered.",
            answered.to_string(),
        ),
        (
            "requests_lost_total",
            "counter",
            "Requests seen at the source that can no longer be answered (their copy ended first, or past --timeout unanswered).",
            g(&live.requests_lost).to_string(),
        ),
        (
            "request_loss_ratio",
            "gauge",
            "tcpcopy's request loss ratio of what can be judged so far: lost / at the source (at the end: (at the source - answered) / at the source).",
            format!("{loss}"),
        ),
        (
            "bytes_copied_total",
            "counter",
            "Request bytes sent to the target.",
            g(&live.bytes_copied).to_string(),
        ),
        (
            "bytes_answered_total",
            "counter",
            "Bytes the target answered.",
            g(&live.bytes_answered).to_string(),
        ),
        (
            "capture_kernel_drops_total",
            "counter",
            "Packets the kernel dropped for want of capture ring space.",
            g(&live.kernel_drops).to_string(),
        ),
        (
            "memory_held_bytes",
            "gauge",
            "Request bytes waiting for the target (the figure kept under --max-memory).",
            g(&live.held_bytes).to_string(),
        ),
        (
            "memory_limit_bytes",
            "gauge",
            "--max-memory.",
            info.limit_bytes.to_string(),
        ),
        (
            "memory_resident_bytes",
            "gauge",
            "Resident set size of the copy process.",
            tcpkit_host::rss_bytes().to_string(),
        ),
    ];
    if info.diff {
        m.push((
            "diff_compared_total",
            "counter",
            "Answers compared with the original server's (--diff).",
            g(&live.diff_compared).to_string(),
        ));
        m.push((
            "diff_equal_total",
            "counter",
            "Answers equal to the original server's.",
            g(&live.diff_equal).to_string(),
        ));
        m.push((
            "diff_different_total",
            "counter",
            "Answers different from the original server's.",
            g(&live.diff_different).to_string(),
        ));
    }
    let mut s = String::with_capacity(4096);
    for (name, ty, help, v) in m {
        let _ = writeln!(s, "# HELP tcpkit_copy_{name} {help}\n# TYPE tcpkit_copy_{name} {ty}\ntcpkit_copy_{name} {v}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn get(addr: SocketAddr, req: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_counters_and_refuses_the_rest() {
        let live = Arc::new(CopyCounters::default());
        live.requests_at_source.store(1000, Ordering::Relaxed);
        live.requests_copied.store(1000, Ordering::Relaxed);
        live.requests_answered.store(990, Ordering::Relaxed);
        // Of the 10 not answered yet, 1 can no longer be: only that one is lost so far.
        live.requests_lost.store(1, Ordering::Relaxed);
        let info = Info {
            limit_bytes: 1 << 20,
            diff: true,
        };
        let mut m = start("127.0.0.1:0".parse().unwrap(), Arc::clone(&live), info).unwrap();
        let r = get(m.addr(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.0 200 OK\r\n"), "{r}");
        assert!(r.contains("Content-Type: text/plain; version=0.0.4"));
        assert!(
            r.contains("\ntcpkit_copy_requests_copied_total 1000\n"),
            "{r}"
        );
        assert!(
            r.contains("\ntcpkit_copy_request_loss_ratio 0.001\n"),
            "{r}"
        );
        assert!(r.contains("\ntcpkit_copy_requests_lost_total 1\n"), "{r}");
        assert!(r.contains("# TYPE tcpkit_copy_diff_equal_total counter\n"));
        // Every sample line has a HELP and TYPE line before it, and a value that parses.
        let body = &r[r.find("\r\n\r\n").unwrap() + 4..];
        for l in body.lines().filter(|l| !l.starts_with('#')) {
            let (name, v) = l.split_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
            assert!(body.contains(&format!("# TYPE {name} ")), "{l}");
        }
        assert!(get(m.addr(), "GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
        assert!(get(m.addr(), "POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 405"));
        let big = format!("GET /metrics HTTP/1.0\r\nX: {}\r\n\r\n", "a".repeat(9000));
        assert!(get(m.addr(), &big).starts_with("HTTP/1.0 431"));
        // A client that connects and says nothing does not keep others out for long.
        let _idle = TcpStream::connect(m.addr()).unwrap();
        let t = Instant::now();
        assert!(get(m.addr(), "GET /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 200"));
        assert!(t.elapsed() < Duration::from_secs(4));
        m.stop();
        assert!(TcpStream::connect(m.addr()).is_err());
    }

    #[test]
    fn an_address_in_use_is_an_error() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = start(
            l.local_addr().unwrap(),
            Arc::new(CopyCounters::default()),
            Info {
                limit_bytes: 0,
                diff: false,
            },
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
