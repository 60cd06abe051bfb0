//! `tcpkit intercept`: on the assistant host the target routes the clients' addresses to,
//! catches the target's answers to `copy --transparent` and returns their TCP/IP headers (and
//! payload, when a copy asked for it) to every connected copy over the control protocol
//! ([`crate::control`]).
//!
//! The answers are caught with a passive AF_PACKET capture (ring + kernel BPF filter) and
//! then dropped by the kernel itself: they are addressed to the clients, not to this host, and
//! with forwarding off a Linux host discards such packets without an ICMP error. That is why
//! forwarding being on is refused at start and ends the run if it is turned on later: a
//! forwarding assistant would send the target's answers on to the real clients. Nothing here
//! sends a packet anywhere but to the copies' control connections. Chosen over an nftables
//! rule + NFQUEUE because it needs no rule to install and remove (a killed intercept leaves
//! nothing behind) and no nftables in the namespace.
//!
//! Several copies may connect (one per online host); each gets every answer and ignores those
//! of sessions it does not know. A copy that reads too slowly has answers dropped for it
//! (counted) rather than memory growing without bound.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use tcpkit_capture::{Capture, CaptureError, CaptureOpts, Direction};
use tcpkit_pace::now_ns;
use tcpkit_wire::tcp::Segment;
use tcpkit_wire::{to_ethernet, LinkType, MacAddr};

use crate::control::{Msg, PacketHdr, VERSION};

/// Bumped whenever a JSON field changes meaning or disappears
/// (docs/schema/intercept.schema.json).
pub const INTERCEPT_SCHEMA_VERSION: u32 = 1;
/// Answers queued for one copy, at most; past it that copy misses answers (counted).
const MAX_PENDING: usize = 8 << 20;
/// Requests a copy may send before its Hello is complete: a Hello is 11 bytes.
const MAX_INBUF: usize = 4096;

/// What intercept does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterceptConfig {
    /// Where the target's answers arrive.
    pub ifname: String,
    /// A tcpdump expression choosing the answers (`tcp` when None); the control port is
    /// always left out, so intercept never catches its own traffic.
    pub filter: Option<String>,
    /// Where copies connect.
    pub listen: SocketAddr,
}

impl InterceptConfig {
    /// The expression the kernel runs.
    pub fn capture_filter(&self) -> String {
        let user = self.filter.as_deref().unwrap_or("tcp");
        format!("(tcp and ({user})) and not port {}", self.listen.port())
    }
}

/// Why intercept cannot run (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("forwarding is on ({key}=1): the target's answers would be forwarded to the real clients; turn it off with 'sysctl -w {key}=0'")]
    Forwarding { key: &'static str },
    #[error("read {path}")]
    Sysctl {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("capture on {ifname}")]
    Capture {
        ifname: String,
        #[source]
        source: CaptureError,
    },
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

const FORWARDING: [(&str, &str); 2] = [
    ("net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"),
    (
        "net.ipv6.conf.all.forwarding",
        "/proc/sys/net/ipv6/conf/all/forwarding",
    ),
];

/// Fails when this host (its network namespace) forwards IPv4 or IPv6 packets.
pub fn check_forwarding() -> Result<(), InterceptError> {
    for (key, path) in FORWARDING {
        match std::fs::read_to_string(path) {
            Ok(v) if v.trim() != "0" => return Err(InterceptError::Forwarding { key }),
            Ok(_) => {}
            // A kernel without IPv6 cannot forward it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(InterceptError::Sysctl { path, source }),
        }
    }
    Ok(())
}

/// Counters published for the live line.
#[derive(Debug, Default)]
pub struct InterceptLive {
    pub answers: AtomicU64,
    pub sent: AtomicU64,
    pub copies: AtomicU64,
    pub dropped: AtomicU64,
    pub kernel_drops: AtomicU64,
}

impl InterceptLive {
    pub fn line(&self, elapsed: Duration) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{:.1}s answers {} caught, {} sent to copies, {} dropped for slow copies | {} copies connected | kernel drops {}",
            elapsed.as_secs_f64(),
            g(&self.answers),
            g(&self.sent),
            g(&self.dropped),
            g(&self.copies),
            g(&self.kernel_drops)
        )
    }
}

/// What an intercept run did. Field names are the `--json` contract.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InterceptReport {
    pub interface: String,
    pub filter: String,
    pub listen: String,
    pub seconds: f64,
    /// TCP segments the capture caught arriving (the target's answers).
    pub answers: u64,
    /// Answers sent to copies (one per copy connected when it arrived).
    pub sent: u64,
    /// Answers caught while no copy was connected.
    pub unclaimed: u64,
    /// Answers not sent to a copy that had too many unread.
    pub dropped_slow_copy: u64,
    /// Frames that were not TCP/IP.
    pub not_tcp: u64,
    pub kernel_drops: u64,
    /// Copies that connected and spoke our version.
    pub copies_connected: u64,
    /// Connections refused: another protocol version, or not the control protocol.
    pub copies_refused: u64,
    /// Why the run failed (exit status 1).
    pub failure: Option<String>,
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

impl InterceptReport {
    pub fn human(&self) -> String {
        let mut s = format!(
            "Intercept: on {} ({}), control on {}, {:.3} s\n\
             Answers: {} caught, {} sent to copies, {} with no copy connected, {} dropped for slow copies\n\
             Capture: {} dropped by the kernel, {} not TCP\n\
             Copies: {} connected, {} refused\n",
            self.interface,
            self.filter,
            self.listen,
            self.seconds,
            self.answers,
            self.sent,
            self.unclaimed,
            self.dropped_slow_copy,
            self.kernel_drops,
            self.not_tcp,
            self.copies_connected,
            self.copies_refused
        );
        if let Some(f) = &self.failure {
            s.push_str(&format!("Failed: {f}\n"));
        }
        s
    }

    /// One JSON document (docs/schema/intercept.schema.json).
    pub fn json(&self) -> String {
        format!(
            "{{\n  \"schema_version\": {},\n  \"interface\": {},\n  \"filter\": {},\n  \"listen\": {},\n  \"protocol_version\": {},\n  \"seconds\": {},\n  \"answers\": {},\n  \"sent\": {},\n  \"unclaimed\": {},\n  \"dropped_slow_copy\": {},\n  \"not_tcp\": {},\n  \"kernel_drops\": {},\n  \"copies_connected\": {},\n  \"copies_refused\": {},\n  \"failure\": {}\n}}",
            INTERCEPT_SCHEMA_VERSION,
            json_str(&self.interface),
            json_str(&self.filter),
            json_str(&self.listen),
            VERSION,
            if self.seconds.is_finite() { self.seconds } else { 0.0 },
            self.answers,
            self.sent,
            self.unclaimed,
            self.dropped_slow_copy,
            self.not_tcp,
            self.kernel_drops,
            self.copies_connected,
            self.copies_refused,
            self.failure.as_deref().map_or("null".to_string(), json_str)
        )
    }
}

struct Client {
    sock: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// Bytes of `out` already written.
    off: usize,
    /// Hello accepted: answers are sent.
    ready: bool,
    max_payload: usize,
    /// Refused: closed once `out` is written.
    closing: bool,
}

impl Client {
    fn pending(&self) -> usize {
        self.out.len() - self.off
    }

    /// Writes what it can; false when the connection is gone.
    fn flush(&mut self) -> bool {
        while self.off < self.out.len() {
            match self.sock.write(&self.out[self.off..]) {
                Ok(0) => return false,
                Ok(n) => self.off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        if self.off == self.out.len() {
            self.out.clear();
            self.off = 0;
        } else if self.off > (1 << 20) {
            // Written bytes are dropped from the front once they are many, not per write.
            self.out.drain(..self.off);
            self.off = 0;
        }
        !(self.closing && self.out.is_empty())
    }
}

const CAPTURE: Token = Token(usize::MAX);
const LISTENER: Token = Token(usize::MAX - 1);

/// Runs until `stop` is set; then returns the report. Refuses to start when the host forwards.
pub fn run(
    cfg: &InterceptConfig,
    stop: &AtomicBool,
    live: &InterceptLive,
) -> Result<InterceptReport, InterceptError> {
    check_forwarding()?;
    let io_err = |what| move |source| InterceptError::Io { what, source };
    let mut listener = TcpListener::bind(cfg.listen).map_err(|source| InterceptError::Listen {
        addr: cfg.listen,
        source,
    })?;
    let filter = cfg.capture_filter();
    let cap_err = |source| InterceptError::Capture {
        ifname: cfg.ifname.clone(),
        source,
    };
    let mut cap = Capture::open(
        &cfg.ifname,
        &CaptureOpts {
            filter: Some(filter.clone()),
            // An answer should reach copy at once: copy's pacing and retransmissions wait on it.
            block_timeout_ms: 1,
            ..CaptureOpts::default()
        },
    )
    .map_err(cap_err)?;
    let link = LinkType::from_dlt(cap.linktype()).unwrap_or(LinkType::Ethernet);
    let poll = Poll::new().map_err(io_err("create the event loop (epoll)"))?;
    let fd = cap.as_fd().as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), CAPTURE, Interest::READABLE)
        .map_err(io_err("watch the capture socket (epoll_ctl)"))?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(io_err("watch the control socket (epoll_ctl)"))?;
    let mut r = InterceptReport {
        interface: cfg.ifname.clone(),
        filter,
        listen: cfg.listen.to_string(),
        ..InterceptReport::default()
    };
    let start = now_ns();
    let mut poll = poll;
    let mut events = Events::with_capacity(256);
    let mut clients: Vec<Option<Client>> = Vec::new();
    let mut eth = Vec::new();
    let mut scratch = vec![0u8; 4096];
    let mut last_second = start;
    while !stop.load(Ordering::Relaxed) {
        match poll.poll(&mut events, Some(Duration::from_millis(5))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("wait for events (epoll_wait)")(e)),
        }
        for ev in events.iter() {
            match ev.token() {
                CAPTURE => {}
                LISTENER => loop {
                    match listener.accept() {
                        Ok((mut sock, _)) => {
                            let _ = sock.set_nodelay(true);
                            let slot =
                                clients.iter().position(Option::is_none).unwrap_or_else(|| {
                                    clients.push(None);
                                    clients.len() - 1
                                });
                            if poll
                                .registry()
                                .register(
                                    &mut sock,
                                    Token(slot),
                                    Interest::READABLE | Interest::WRITABLE,
                                )
                                .is_ok()
                            {
                                clients[slot] = Some(Client {
                                    sock,
                                    inbuf: Vec::new(),
                                    out: Vec::new(),
                                    off: 0,
                                    ready: false,
                                    max_payload: 0,
                                    closing: false,
                                });
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        // Out of descriptors and the like: the copy retries.
                        Err(_) => break,
                    }
                },
                Token(i) => {
                    let keep = match clients.get_mut(i).and_then(Option::as_mut) {
                        Some(c) => serve(c, &mut scratch, &mut r),
                        None => continue,
                    };
                    if !keep {
                        if let Some(mut c) = clients[i].take() {
                            let _ = poll.registry().deregister(&mut c.sock);
                        }
                    }
                }
            }
        }
        // Every retired block, a bounded number per turn so the copies get served.
        for _ in 0..64 {
            let n = cap
                .next_block(Duration::ZERO, |p| {
                    if p.direction != Direction::Incoming {
                        return;
                    }
                    let frame = if link == LinkType::Ethernet {
                        p.data
                    } else if to_ethernet(link, p.data, MacAddr([0; 6]), MacAddr([0; 6]), &mut eth)
                        .is_ok()
                    {
                        &eth
                    } else {
                        r.not_tcp += 1;
                        return;
                    };
                    let Ok(seg) = Segment::parse(frame) else {
                        r.not_tcp += 1;
                        return;
                    };
                    r.answers += 1;
                    let hdr = PacketHdr {
                        src: seg.src,
                        dst: seg.dst,
                        seq: seg.seq,
                        ack: seg.ack,
                        flags: seg.flags.0,
                        window: seg.window,
                        mss: seg.options.mss,
                        wscale: seg.options.wscale,
                        payload_len: u16::try_from(seg.payload_len).unwrap_or(u16::MAX),
                    };
                    let payload = frame.get(seg.payload.clone()).unwrap_or(&[]);
                    let mut any = false;
                    for c in clients.iter_mut().flatten().filter(|c| c.ready) {
                        any = true;
                        if c.pending() > MAX_PENDING {
                            r.dropped_slow_copy += 1;
                            continue;
                        }
                        let take = payload.len().min(c.max_payload);
                        Msg::Packet {
                            hdr,
                            payload: payload.get(..take).unwrap_or(&[]),
                        }
                        .emit(&mut c.out);
                        r.sent += 1;
                    }
                    if !any {
                        r.unclaimed += 1;
                    }
                })
                .map_err(cap_err)?;
            if n == 0 {
                break;
            }
        }
        let now = now_ns();
        let second = now >= last_second + 1_000_000_000;
        if second {
            last_second = now;
            if let Ok(st) = cap.stats() {
                r.kernel_drops = st.drops;
            }
            // Forwarding turned on under us: the kernel would now send the answers on to the
            // clients. Stop loudly rather than look as if all is well.
            if let Err(e) = check_forwarding() {
                r.failure = Some(e.to_string());
            }
        }
        for slot in clients.iter_mut() {
            let Some(c) = slot.as_mut() else {
                continue;
            };
            if second && c.ready {
                Msg::Ping.emit(&mut c.out);
            }
            if c.pending() > 0 && !c.flush() {
                if let Some(mut c) = slot.take() {
                    let _ = poll.registry().deregister(&mut c.sock);
                }
            }
        }
        let st = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        st(&live.answers, r.answers);
        st(&live.sent, r.sent);
        st(&live.dropped, r.dropped_slow_copy);
        st(&live.kernel_drops, r.kernel_drops);
        st(
            &live.copies,
            clients.iter().flatten().filter(|c| c.ready).count() as u64,
        );
        if r.failure.is_some() {
            break;
        }
    }
    if let Ok(st) = cap.stats() {
        r.kernel_drops = st.drops;
    }
    r.seconds = (now_ns() - start) as f64 / 1e9;
    Ok(r)
}

/// Reads what a copy sent and answers its Hello; false when the connection is to be dropped.
fn serve(c: &mut Client, scratch: &mut [u8], r: &mut InterceptReport) -> bool {
    loop {
        match c.sock.read(scratch) {
            Ok(0) => return false,
            Ok(n) => {
                if c.inbuf.len() + n > MAX_INBUF {
                    return false;
                }
                c.inbuf.extend_from_slice(&scratch[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    while !c.inbuf.is_empty() && !c.closing {
        match Msg::parse(&c.inbuf) {
            Err(crate::control::ControlError::Truncated { .. }) => break,
            Ok((
                Msg::Hello {
                    version,
                    max_payload,
                },
                n,
            )) if !c.ready => {
                if version == VERSION {
                    c.ready = true;
                    c.max_payload = usize::from(max_payload);
                    r.copies_connected += 1;
                    Msg::Welcome { version: VERSION }.emit(&mut c.out);
                } else {
                    r.copies_refused += 1;
                    let reason = format!(
                        "copy speaks control protocol version {version}, this intercept speaks {VERSION}"
                    );
                    Msg::Refuse {
                        version: VERSION,
                        reason: &reason,
                    }
                    .emit(&mut c.out);
                    c.closing = true;
                }
                c.inbuf.drain(..n);
            }
            // Pings from a copy are allowed (a keep-alive); anything else is not ours.
            Ok((Msg::Ping, n)) if c.ready => {
                c.inbuf.drain(..n);
            }
            Ok(_) | Err(_) => {
                if !c.ready {
                    r.copies_refused += 1;
                }
                return false;
            }
        }
    }
    c.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_leaves_the_control_port_out() {
        let mut c = InterceptConfig {
            ifname: "eth0".into(),
            filter: None,
            listen: "0.0.0.0:36524".parse().unwrap(),
        };
        assert_eq!(c.capture_filter(), "(tcp and (tcp)) and not port 36524");
        c.filter = Some("src port 8080".into());
        assert_eq!(
            c.capture_filter(),
            "(tcp and (src port 8080)) and not port 36524"
        );
    }

    #[test]
    fn report_json_and_human() {
        let r = InterceptReport {
            interface: "eth1".into(),
            filter: "tcp".into(),
            listen: "0.0.0.0:1".into(),
            seconds: 1.5,
            answers: 10,
            sent: 9,
            unclaimed: 1,
            failure: Some("a \"quoted\" why".into()),
            ..InterceptReport::default()
        };
        let j = r.json();
        assert!(j.contains("\"answers\": 10,"), "{j}");
        assert!(j.contains("\"failure\": \"a \\\"quoted\\\" why\""), "{j}");
        assert_eq!(
            r.human(),
            "Intercept: on eth1 (tcp), control on 0.0.0.0:1, 1.500 s\n\
             Answers: 10 caught, 9 sent to copies, 1 with no copy connected, 0 dropped for slow copies\n\
             Capture: 0 dropped by the kernel, 0 not TCP\n\
             Copies: 0 connected, 0 refused\n\
             Failed: a \"quoted\" why\n"
        );
        assert_eq!(json_str("a\nb"), "\"a\\u000ab\"");
    }
}
