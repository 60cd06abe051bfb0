//! `--trace`: every selection the BPF programs make (a VIP never shows in tcpdump), read from
//! their ring buffer and printed on stderr as it happens: pid, cgroup id, VIP -> backend.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};

/// One selection as the programs write it: bpf/balance.h `struct trace_event`.
pub use crate::bpf::TraceEvent;

impl TraceEvent {
    /// The event in `bytes` (a ring-buffer record the program wrote), if it is whole.
    pub fn parse(bytes: &[u8]) -> Option<TraceEvent> {
        if bytes.len() < std::mem::size_of::<TraceEvent>() {
            return None;
        }
        // SAFETY: the length is checked above; TraceEvent is plain integers (any bit pattern
        // is valid) and read_unaligned needs no alignment.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<TraceEvent>()) })
    }

    fn addr(&self, ip: &[u32; 4], port: u16) -> SocketAddr {
        let port = u16::from_be_bytes(port.to_ne_bytes());
        if self.family == 4 {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip[0].to_ne_bytes())), port)
        } else {
            let mut o = [0u8; 16];
            for (i, w) in ip.iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port)
        }
    }

    /// `trace: pid 1234 cgroup 5678 tcp 198.19.0.1:6379 -> 198.18.0.2:6380`.
    pub fn line(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "trace: pid {} cgroup {} {} {} -> {}",
            self.pid_tgid >> 32,
            self.cgroup,
            if self.udp == 1 { "udp" } else { "connect" },
            self.addr(&self.vip, self.vport),
            self.addr(&self.bip, self.bport)
        );
        s
    }
}

/// Writes `line` and its newline in one call. The command `run` started writes to the same
/// stderr, and writeln!/eprintln! write the text and the newline in two calls (stderr is not
/// buffered), between which a line of the command's could land: a trace line then ran into the
/// command's and the command's line lost its start. One write of less than PIPE_BUF bytes to
/// a pipe is never split.
pub(crate) fn write_line(err: &mut impl std::io::Write, mut line: String) {
    line.push('\n');
    let _ = err.write_all(line.as_bytes());
}

/// The thread printing the ring buffer; [`Tracer::stop`] prints what is left and ends it.
#[derive(Debug)]
pub struct Tracer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Tracer {
    pub fn start(mut ring: RingBuf<MapData>) -> Tracer {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tcpkit-trace".into())
            .spawn(move || {
                let start = Instant::now();
                loop {
                    let last = s.load(Ordering::SeqCst);
                    let mut err = std::io::stderr().lock();
                    while let Some(item) = ring.next() {
                        if let Some(e) = TraceEvent::parse(&item) {
                            let line = tcpkit_stats::stamp(start.elapsed(), &e.line());
                            write_line(&mut err, line);
                        }
                    }
                    drop(err);
                    if last {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
            .ok();
        Tracer { stop, thread }
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_has_the_c_size_and_prints_as_a_line() {
        assert_eq!(std::mem::size_of::<TraceEvent>(), 56);
        let e = TraceEvent {
            pid_tgid: (1234u64 << 32) | 1235,
            cgroup: 42,
            vip: [u32::from_ne_bytes([198, 19, 0, 1]), 0, 0, 0],
            bip: [u32::from_ne_bytes([198, 18, 0, 2]), 0, 0, 0],
            vport: u16::from_ne_bytes(6379u16.to_be_bytes()),
            bport: u16::from_ne_bytes(6380u16.to_be_bytes()),
            family: 4,
            udp: 0,
            pad: [0; 2],
        };
        let mut bytes = vec![0xa5u8; 56];
        // SAFETY: 56 bytes written into a 56-byte buffer.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast::<TraceEvent>(), e) };
        let back = TraceEvent::parse(&bytes).unwrap();
        assert_eq!(
            back.line(),
            "trace: pid 1234 cgroup 42 connect 198.19.0.1:6379 -> 198.18.0.2:6380"
        );
        assert!(TraceEvent::parse(&bytes[..55]).is_none());
    }
}
