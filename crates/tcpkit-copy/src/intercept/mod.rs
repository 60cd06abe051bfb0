//! `tcpkit intercept`: catches the target's answers to `copy --transparent` and returns their
//! TCP/IP headers (and payload, when a copy asked for it) to every connected copy over the
//! control protocol ([`crate::control`]). It runs in one of two places.
//!
//! **On an assistant host** the target routes the clients' addresses to: the answers are
//! caught with a passive AF_PACKET capture (ring + kernel BPF filter) and then dropped by the
//! kernel itself: they are addressed to the clients, not to this host, and with forwarding
//! off a Linux host discards such packets without an ICMP error. That is why forwarding being
//! on is refused at start and ends the run if it is turned on later: a forwarding assistant
//! would send the target's answers on to the real clients. It needs no rule to install and
//! remove (a killed intercept leaves nothing behind) and no nftables on the assistant.
//!
//! **On the target itself** (`--on-target`, [`Source::OnTarget`]): no assistant and no route
//! to one. intercept installs a netfilter rule in the target's output hook ([`rule`]) that
//! queues the answers (TCP from the server ports, to the clients' addresses when given) to a
//! netfilter queue it reads ([`tcpkit_capture::nfqueue`]); every answer read is handed to the
//! copies exactly as a captured one is, then given the verdict DROP, so it never leaves the
//! target. A queue rather than a plain `drop` in the rule: TCP is told of a dropped packet
//! (EPERM) and counts it as never sent, sending it again and again, while a queued one counts
//! as sent. The rule has no `bypass`, so while no intercept reads the queue the kernel drops
//! what the rule queues: a killed intercept (SIGKILL, a crash) fails closed, nothing leaks,
//! and the next intercept replaces the rule it left. At exit (normal, SIGINT, SIGTERM, an
//! error) the target's connections the rule matches are aborted first (their resets still
//! queued and dropped), so no copied session sends a late FIN or retransmission to a real
//! client after the rule is gone; then the rule is removed.
//!
//! Nothing here sends a packet anywhere but to the copies' control connections. Several
//! copies may connect (one per online host); each gets every answer and ignores those of
//! sessions it does not know. A copy that reads too slowly has answers dropped for it
//! (counted) rather than memory growing without bound.

pub mod rule;

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use tcpkit_capture::nfqueue::{NfQueue, NfQueueError, NfQueueOpts, Verdict};
use tcpkit_capture::{Capture, CaptureError, CaptureOpts, Direction};
use tcpkit_pace::now_ns;
use tcpkit_stats::{Report, Verdict as RunVerdict};
use tcpkit_wire::tcp::Segment;
use tcpkit_wire::{as_ethernet, LinkType};

use crate::auth::{self, Exchange, Key};
use crate::control::{Msg, PacketHdr, VERSION};
pub use rule::AnswerRule;
use rule::RuleError;

/// Bumped whenever a JSON field changes meaning or disappears
/// (docs/schema/intercept.schema.json).
pub const INTERCEPT_SCHEMA_VERSION: u32 = 1;
/// Answers queued for one copy, at most; past it that copy is cut (counted).
const MAX_PENDING: usize = 8 << 20;
/// Answers queued for all copies together, at most: past it the copies holding more than
/// their share are cut, so intercept's memory does not grow with the number of copies that
/// do not read.
const PENDING_BUDGET: usize = 64 << 20;
/// A connection must complete its Hello within this unless `--hello-timeout` says otherwise;
/// a partial message (a header announcing bytes that never come) may not stall for longer
/// either.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Control connections at most (fewer when the descriptor limit is lower): past it a
/// connection is refused with the reason, so idle peers cannot take every descriptor.
const MAX_CONNECTIONS: usize = 1000;
/// Descriptors left for the capture, the rule's tools and /proc reads under the cap.
const SPARE_FDS: u64 = 64;
/// How long accepting pauses when the process (or system) is out of descriptors.
const ACCEPT_PAUSE_NS: u64 = 100_000_000;
/// Requests a copy may send before its Hello is complete: a Hello is 11 bytes.
const MAX_INBUF: usize = 4096;

/// Where intercept catches the answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// On the assistant: a capture on the interface the answers arrive on.
    Capture {
        ifname: String,
        /// A tcpdump expression choosing the answers (`tcp` when None); the control port is
        /// always left out, so intercept never catches its own traffic.
        filter: Option<String>,
    },
    /// On the target: its own answers, queued by the rule intercept installs.
    OnTarget(AnswerRule),
}

/// What intercept does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterceptConfig {
    pub source: Source,
    /// Where copies connect.
    pub listen: SocketAddr,
    /// Copies are accepted only from these prefixes (every address when empty).
    pub allow: Vec<tcpkit_wire::Cidr>,
    /// `--auth-key-file`: copies must prove this key before anything is sent to them.
    pub key: Option<Key>,
    /// `--hello-timeout`: how long a connection may take to complete its Hello (and the
    /// key's proof), and a later message to arrive whole once begun. Checked once a second.
    pub hello_timeout: Duration,
}

impl InterceptConfig {
    /// The expression the kernel runs (capture mode).
    pub fn capture_filter(&self) -> String {
        let user = match &self.source {
            Source::Capture { filter, .. } => filter.as_deref().unwrap_or("tcp"),
            Source::OnTarget(_) => "tcp",
        };
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
    /// The source names the interface: said once, after the flag that gave it.
    #[error("--capture")]
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
    #[error("--on-target")]
    Queue {
        #[source]
        source: NfQueueError,
    },
    #[error("--on-target")]
    Rule {
        #[source]
        source: RuleError,
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
    pub fn line(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "answers {} caught, {} sent to copies, {} dropped for slow copies | {} copies connected | kernel drops {}",
            g(&self.answers),
            g(&self.sent),
            g(&self.dropped),
            g(&self.copies),
            g(&self.kernel_drops)
        )
    }
}

/// What an intercept run did. Field names are the `--json` contract.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct InterceptReport {
    /// `capture` (on the assistant) or `on-target`.
    pub mode: &'static str,
    /// Where the answers are caught: the interface, or `queue N` on the target.
    pub interface: String,
    /// What chooses them: the capture's filter expression, or the rule's match.
    pub filter: String,
    pub listen: String,
    /// Copies had to prove the key (`--auth-key-file`).
    pub authenticated: bool,
    /// On the target: the rule installed (nft table or iptables chain).
    pub rule: Option<String>,
    /// On the target: a rule left by a killed intercept was replaced at start.
    pub stale_rule_replaced: bool,
    /// On the target: the connections aborted before the rule was removed (None when `ss`
    /// could not run).
    pub connections_aborted: Option<u64>,
    pub seconds: f64,
    /// TCP segments caught (the target's answers).
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
    /// Connections that did not prove the key: a wrong proof (refused with the reason), or
    /// closed or another message after the challenge.
    pub copies_auth_failed: u64,
    /// Connections closed for not completing their Hello, or a message, within 5 s.
    pub copies_timed_out: u64,
    /// Copies cut for not reading: more than 8 MiB unread, or more than their share when all
    /// copies' unread answers pass 64 MiB.
    pub copies_cut_slow: u64,
    /// Connections refused because the cap on control connections was reached.
    pub connections_over_cap: u64,
    /// Connections closed at once, without a word, because --allow does not cover them.
    pub connections_not_allowed: u64,
    /// Connections intercept could not accept (e.g. out of descriptors); accepting paused
    /// for 100 ms each time, the run went on.
    pub accept_failures: u64,
    /// The last accept failure, with the OS error.
    pub accept_error: Option<String>,
    /// Why the run failed (exit status 1).
    pub failure: Option<String>,
}

impl Report for InterceptReport {
    fn human(&self) -> String {
        let rule = match &self.rule {
            Some(r) => format!(
                "Rule: {r}{}, removed at exit {}\n",
                if self.stale_rule_replaced {
                    " (replaced one left by a killed intercept)"
                } else {
                    ""
                },
                self.connections_aborted.map_or(
                    "(ss could not abort its connections first)".to_string(),
                    |n| format!("after aborting {n} connections")
                )
            ),
            None => String::new(),
        };
        let mut s = format!(
            "Intercept: on {} ({}), control on {}, {:.3} s\n\
             Answers: {} caught, {} sent to copies, {} with no copy connected, {} dropped for slow copies\n\
             {rule}Capture: {} dropped by the kernel, {} not TCP\n\
             Copies: {} connected{}, {} refused, {} failed the key, {} timed out, {} cut for not reading, {} over the cap, {} not allowed\n",
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
            if self.authenticated {
                " (authenticated)"
            } else {
                " (not authenticated)"
            },
            self.copies_refused,
            self.copies_auth_failed,
            self.copies_timed_out,
            self.copies_cut_slow,
            self.connections_over_cap,
            self.connections_not_allowed
        );
        if self.accept_failures > 0 {
            s.push_str(&format!(
                "Accept: {} failed, accepting paused 100 ms each time (last: {})\n",
                self.accept_failures,
                self.accept_error.as_deref().unwrap_or("?")
            ));
        }
        if let Some(f) = &self.failure {
            s.push_str(&format!("Failed: {f}\n"));
        }
        s
    }

    /// One JSON document (docs/schema/intercept.schema.json): the report's fields with the
    /// schema and control-protocol versions.
    fn json(&self) -> String {
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            schema_version: u32,
            protocol_version: u16,
            #[serde(flatten)]
            report: &'a InterceptReport,
        }
        tcpkit_stats::to_json(&Doc {
            schema_version: INTERCEPT_SCHEMA_VERSION,
            protocol_version: VERSION,
            report: self,
        })
    }

    /// An intercept stopped by its operator has done its job; it fails only when it could not
    /// go on (the reason in `failure`).
    fn verdict(&self) -> RunVerdict {
        match &self.failure {
            Some(f) => RunVerdict::Failed(f.clone()),
            None => RunVerdict::Done,
        }
    }
}

struct Client {
    sock: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// Bytes of `out` already written.
    off: usize,
    /// Hello accepted (and the key proved): answers are sent.
    ready: bool,
    /// Challenge sent: the Proof is awaited over these fields.
    challenge: Option<Exchange>,
    max_payload: usize,
    /// Refused: closed once `out` is written.
    closing: bool,
    /// To be closed now: too slow a reader, or too slow a talker.
    cut: bool,
    /// When accepted, and when the last bytes arrived (ns).
    accepted: u64,
    last_read: u64,
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
            // An idle copy keeps no large buffer once its burst is written.
            if self.out.capacity() > (256 << 10) {
                self.out = Vec::new();
            }
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

/// Where the answers come from while running.
enum Input {
    Capture {
        cap: Capture,
        link: LinkType,
    },
    /// Declared before the rule's guard in `run`, so the rule goes first at exit and the
    /// queue's last packets are dropped when it closes.
    Queue(NfQueue),
}

/// Hands one answer (an Ethernet frame) to every ready copy: its headers, and as much of its
/// payload as each asked for. The one path every caught answer takes, captured or queued.
fn deliver(frame: &[u8], clients: &mut [Option<Client>], r: &mut InterceptReport) {
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
    let ready = clients
        .iter()
        .flatten()
        .filter(|c| c.ready && !c.cut)
        .count();
    let mut total: usize = clients.iter().flatten().map(Client::pending).sum();
    let share = PENDING_BUDGET / ready.max(1);
    for c in clients.iter_mut().flatten().filter(|c| c.ready && !c.cut) {
        any = true;
        if c.pending() > MAX_PENDING || (total > PENDING_BUDGET && c.pending() > share) {
            // Cut rather than skipped: a copy missing answers is wrong anyway, and its
            // queue is memory intercept gets back.
            r.dropped_slow_copy += 1;
            r.copies_cut_slow += 1;
            total -= c.pending();
            c.cut = true;
            continue;
        }
        let before = c.out.len();
        let take = payload.len().min(c.max_payload);
        Msg::Packet {
            hdr,
            payload: payload.get(..take).unwrap_or(&[]),
        }
        .emit(&mut c.out);
        total += c.out.len() - before;
        r.sent += 1;
    }
    if !any {
        r.unclaimed += 1;
    }
}

/// Runs until `stop` is set; then returns the report. In capture mode, refuses to start when
/// the host forwards; on the target, installs the rule and removes it on the way out.
pub fn run(
    cfg: &InterceptConfig,
    stop: &AtomicBool,
    live: &InterceptLive,
) -> Result<InterceptReport, InterceptError> {
    if matches!(cfg.source, Source::Capture { .. }) {
        check_forwarding()?;
    }
    let io_err = |what| move |source| InterceptError::Io { what, source };
    let mut r = InterceptReport {
        listen: cfg.listen.to_string(),
        authenticated: cfg.key.is_some(),
        ..InterceptReport::default()
    };
    let poll = Poll::new().map_err(io_err("create the event loop (epoll)"))?;
    let (mut input, mut installed) = match &cfg.source {
        Source::Capture { ifname, .. } => {
            let filter = cfg.capture_filter();
            let cap = Capture::open(
                ifname,
                &CaptureOpts {
                    filter: Some(filter.clone()),
                    // An answer should reach copy at once: copy's pacing and retransmissions
                    // wait on it. A V3 block's timeout held every answer up to 1 ms (p50
                    // 0.94 ms, the target's own 0.05 ms), half of what a keep-alive client
                    // at 500 requests a second leaves between its requests, so a loaded
                    // host's scheduling delays on top let the copies fall behind.
                    immediate: true,
                    ..CaptureOpts::default()
                },
            )
            .map_err(|source| InterceptError::Capture {
                ifname: ifname.clone(),
                source,
            })?;
            let link = LinkType::from_dlt(cap.linktype()).unwrap_or(LinkType::Ethernet);
            r.mode = "capture";
            r.interface = ifname.clone();
            r.filter = filter;
            (Input::Capture { cap, link }, None)
        }
        Source::OnTarget(rule) => {
            // The queue first: a busy queue or no privilege is refused before any rule
            // changes, and once the rule is in place its packets have a reader.
            let q = NfQueue::open(rule.queue, &NfQueueOpts::default())
                .map_err(|source| InterceptError::Queue { source })?;
            let installed =
                rule::install(rule).map_err(|source| InterceptError::Rule { source })?;
            r.mode = "on-target";
            r.interface = format!("queue {}", rule.queue);
            r.filter = rule.matches().join("; ");
            r.rule = Some(installed.describe());
            r.stale_rule_replaced = installed.replaced_stale;
            if installed.replaced_stale {
                // A killed intercept's rule stays on purpose (its queue, unread, drops the
                // answers rather than let them reach the clients): taken over, and said.
                eprintln!(
                    "tcpkit intercept: took over the {} a killed intercept left on queue {}: \
                     the answers it dropped while nobody read the queue are lost to their copies",
                    installed.describe(),
                    rule.queue
                );
            }
            (Input::Queue(q), Some(installed))
        }
    };
    // Copies can connect once the answers are caught: the listener comes last.
    let mut listener = TcpListener::bind(cfg.listen).map_err(|source| InterceptError::Listen {
        addr: cfg.listen,
        source,
    })?;
    // Once the port is open (a run that cannot start fails in one line), and whatever -q:
    // anyone who reaches the port reads the target's answers.
    if cfg.key.is_none() {
        eprintln!(
            "tcpkit intercept: WARNING: copies are not authenticated (no --auth-key-file): anyone \
             who reaches {} {} receives the target's answers (payload too, when it asks)",
            cfg.listen,
            if cfg.allow.is_empty() {
                "from anywhere".to_string()
            } else {
                let a: Vec<String> = cfg.allow.iter().map(ToString::to_string).collect();
                format!("from --allow {}", a.join(", "))
            }
        );
    }
    let fd = match &input {
        Input::Capture { cap, .. } => cap.as_fd().as_raw_fd(),
        Input::Queue(q) => q.as_fd().as_raw_fd(),
    };
    poll.registry()
        .register(&mut SourceFd(&fd), CAPTURE, Interest::READABLE)
        .map_err(io_err("watch the capture socket (epoll_ctl)"))?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(io_err("watch the control socket (epoll_ctl)"))?;
    let start = now_ns();
    let mut poll = poll;
    let mut events = Events::with_capacity(256);
    let mut clients: Vec<Option<Client>> = Vec::new();
    let mut eth = Vec::new();
    let mut scratch = vec![0u8; 4096];
    let mut last_second = start;
    let hello_deadline_ns = u64::try_from(cfg.hello_timeout.as_nanos()).unwrap_or(u64::MAX);
    let max_conns = connection_cap();
    // Out of descriptors: no accept until then. The listener is edge-triggered, so the
    // backlog left waiting is taken up again from the loop once the pause is over.
    let mut accept_paused_until = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match poll.poll(&mut events, Some(Duration::from_millis(5))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("wait for events (epoll_wait)")(e)),
        }
        for ev in events.iter() {
            match ev.token() {
                CAPTURE => {}
                LISTENER => {
                    if now_ns() >= accept_paused_until {
                        accept_paused_until =
                            accept_all(&listener, &poll, &mut clients, max_conns, cfg, &mut r);
                    }
                }
                Token(i) => {
                    let keep = match clients.get_mut(i).and_then(Option::as_mut) {
                        Some(c) => serve(c, cfg.key.as_ref(), &mut scratch, &mut r),
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
        match &mut input {
            // Every retired block, a bounded number per turn so the copies get served.
            Input::Capture { cap, link } => {
                let link = *link;
                for _ in 0..64 {
                    let n = cap
                        .next_block(Duration::ZERO, |p| {
                            if p.direction != Direction::Incoming {
                                return;
                            }
                            let Some(frame) = as_ethernet(link, p.data, &mut eth) else {
                                r.not_tcp += 1;
                                return;
                            };
                            deliver(frame, &mut clients, &mut r);
                        })
                        .map_err(|source| InterceptError::Capture {
                            ifname: r.interface.clone(),
                            source,
                        })?;
                    if n == 0 {
                        break;
                    }
                }
            }
            // What is queued, a bounded number per turn, all dropped in one verdict.
            Input::Queue(q) => {
                q.read(1024, Verdict::Drop, |p| {
                    if let Some(frame) = as_ethernet(LinkType::Raw, p.payload, &mut eth) {
                        deliver(frame, &mut clients, &mut r);
                    } else {
                        r.not_tcp += 1;
                    }
                })
                .map_err(|source| InterceptError::Queue { source })?;
            }
        }
        let now = now_ns();
        if accept_paused_until != 0 && now >= accept_paused_until {
            accept_paused_until =
                accept_all(&listener, &poll, &mut clients, max_conns, cfg, &mut r);
        }
        let second = now >= last_second + 1_000_000_000;
        if second {
            last_second = now;
            r.kernel_drops = kernel_drops(&mut input);
            // Forwarding turned on under us: the kernel would now send the answers on to the
            // clients. Stop loudly rather than look as if all is well. A file that cannot be
            // read this second (out of descriptors) is read again the next.
            if let (Input::Capture { .. }, Err(e @ InterceptError::Forwarding { .. })) =
                (&input, check_forwarding())
            {
                r.failure = Some(e.to_string());
            }
        }
        for slot in clients.iter_mut() {
            let Some(c) = slot.as_mut() else {
                continue;
            };
            if second {
                let stalled = if c.ready {
                    !c.inbuf.is_empty() && now > c.last_read + hello_deadline_ns
                } else {
                    now > c.accepted + hello_deadline_ns
                };
                if stalled && !c.cut {
                    r.copies_timed_out += 1;
                    c.cut = true;
                }
            }
            if second && c.ready && !c.cut {
                Msg::Ping.emit(&mut c.out);
            }
            if c.cut || (c.pending() > 0 && !c.flush()) {
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
    r.kernel_drops = kernel_drops(&mut input);
    if let Some(i) = installed.as_mut() {
        r.connections_aborted = i.remove();
    }
    r.seconds = (now_ns() - start) as f64 / 1e9;
    Ok(r)
}

/// The cap on control connections: [`MAX_CONNECTIONS`], or fewer when the descriptor limit
/// would be reached first.
fn connection_cap() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        u64::MAX
    };
    usize::try_from(cur.saturating_sub(SPARE_FDS))
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_CONNECTIONS)
}

/// Accepts every waiting connection; returns when accepting may resume (0: at once, on the
/// next readiness), a moment later when out of descriptors.
fn accept_all(
    listener: &TcpListener,
    poll: &Poll,
    clients: &mut Vec<Option<Client>>,
    max_conns: usize,
    cfg: &InterceptConfig,
    r: &mut InterceptReport,
) -> u64 {
    loop {
        match listener.accept() {
            Ok((mut sock, peer)) => {
                // Not ours: closed before it can learn anything, not even a refusal.
                if !cfg.allow.is_empty() && !cfg.allow.iter().any(|c| c.contains(peer.ip())) {
                    r.connections_not_allowed += 1;
                    continue;
                }
                if clients.iter().flatten().count() >= max_conns {
                    r.connections_over_cap += 1;
                    let reason = format!("intercept has {max_conns} control connections, its cap");
                    let mut out = Vec::new();
                    Msg::Refuse {
                        version: VERSION,
                        reason: &reason,
                    }
                    .emit(&mut out);
                    // Best effort: a fresh socket's buffer takes it; closed either way.
                    let _ = sock.write(&out);
                    continue;
                }
                let _ = sock.set_nodelay(true);
                let slot = clients.iter().position(Option::is_none).unwrap_or_else(|| {
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
                    let now = now_ns();
                    clients[slot] = Some(Client {
                        sock,
                        inbuf: Vec::new(),
                        out: Vec::new(),
                        off: 0,
                        ready: false,
                        challenge: None,
                        max_payload: 0,
                        closing: false,
                        cut: false,
                        accepted: now,
                        last_read: now,
                    });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return 0,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Out of descriptors (EMFILE, ENFILE), buffers (ENOBUFS, ENOMEM) or a connection
            // reset before it was taken: counted, named, and accepting resumes shortly. Never
            // an exit: the copies already connected are still served.
            Err(e) => {
                r.accept_failures += 1;
                r.accept_error = Some(format!("accept on {}: {e}", r.listen));
                return now_ns() + ACCEPT_PAUSE_NS;
            }
        }
    }
}

/// Packets the kernel could not give us: ring full, or queue or socket full.
fn kernel_drops(input: &mut Input) -> u64 {
    match input {
        Input::Capture { cap, .. } => cap.stats().map_or(0, |s| s.drops),
        Input::Queue(q) => {
            let s = q.stats();
            s.queue_full + s.socket_full
        }
    }
}

/// Reads what a copy sent and answers its Hello (and, with a key, its Proof); false when the
/// connection is to be dropped.
fn serve(c: &mut Client, key: Option<&Key>, scratch: &mut [u8], r: &mut InterceptReport) -> bool {
    // A connection that goes away (or says anything else) between the challenge and its
    // proof did not prove the key.
    let lost = |c: &Client, r: &mut InterceptReport| {
        if c.challenge.is_some() && !c.ready {
            r.copies_auth_failed += 1;
        } else if !c.ready {
            r.copies_refused += 1;
        }
    };
    loop {
        match c.sock.read(scratch) {
            Ok(0) => {
                if c.challenge.is_some() && !c.ready {
                    r.copies_auth_failed += 1;
                }
                return false;
            }
            Ok(n) => {
                if c.inbuf.len() + n > MAX_INBUF {
                    lost(c, r);
                    return false;
                }
                c.last_read = now_ns();
                c.inbuf.extend_from_slice(&scratch[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    while !c.inbuf.is_empty() && !c.closing {
        let refuse = |c: &mut Client, reason: &str| {
            Msg::Refuse {
                version: VERSION,
                reason,
            }
            .emit(&mut c.out);
            c.closing = true;
        };
        match Msg::parse(&c.inbuf) {
            Err(crate::control::ControlError::Truncated { .. }) => break,
            Ok((
                Msg::Hello {
                    version,
                    max_payload,
                    nonce,
                },
                n,
            )) if !c.ready && c.challenge.is_none() => {
                c.inbuf.drain(..n);
                let copy_nonce = match nonce {
                    Some(cn) if version == VERSION => cn,
                    // The version is right and the Hello is not: say that, not a mismatch
                    // of versions that are the same.
                    None if version == VERSION => {
                        r.copies_refused += 1;
                        refuse(
                            c,
                            &format!("copy's version-{VERSION} Hello carries no nonce (cut short, or not sent by tcpkit copy)"),
                        );
                        continue;
                    }
                    _ => {
                        r.copies_refused += 1;
                        refuse(
                            c,
                            &format!("copy speaks control protocol version {version}, this intercept speaks {VERSION}"),
                        );
                        continue;
                    }
                };
                c.max_payload = usize::from(max_payload);
                let Some(key) = key else {
                    c.ready = true;
                    r.copies_connected += 1;
                    Msg::Welcome { version: VERSION }.emit(&mut c.out);
                    continue;
                };
                match auth::nonce() {
                    Ok(intercept_nonce) => {
                        let x = Exchange {
                            max_payload,
                            copy_nonce,
                            intercept_nonce,
                        };
                        Msg::Challenge {
                            nonce: intercept_nonce,
                            proof: key.intercept_proof(&x),
                        }
                        .emit(&mut c.out);
                        c.challenge = Some(x);
                    }
                    Err(e) => {
                        r.copies_refused += 1;
                        refuse(c, &format!("intercept could not draw a nonce: {e}"));
                    }
                }
            }
            Ok((Msg::Proof { tag }, n)) if !c.ready && c.challenge.is_some() => {
                c.inbuf.drain(..n);
                let x = c.challenge.expect("matched above");
                if key.is_some_and(|k| k.verify_copy(&x, &tag)) {
                    c.ready = true;
                    r.copies_connected += 1;
                    Msg::Welcome { version: VERSION }.emit(&mut c.out);
                } else {
                    r.copies_auth_failed += 1;
                    refuse(
                        c,
                        "authentication failed: this copy's --auth-key-file is not intercept's key",
                    );
                }
            }
            // Pings from a copy are allowed (a keep-alive); anything else is not ours.
            Ok((Msg::Ping, n)) if c.ready => {
                c.inbuf.drain(..n);
            }
            Ok(_) | Err(_) => {
                lost(c, r);
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
            source: Source::Capture {
                ifname: "eth0".into(),
                filter: None,
            },
            listen: "0.0.0.0:36524".parse().unwrap(),
            allow: vec![],
            key: None,
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
        };
        assert_eq!(c.capture_filter(), "(tcp and (tcp)) and not port 36524");
        c.source = Source::Capture {
            ifname: "eth0".into(),
            filter: Some("src port 8080".into()),
        };
        assert_eq!(
            c.capture_filter(),
            "(tcp and (src port 8080)) and not port 36524"
        );
    }

    #[test]
    fn report_json_and_human() {
        let r = InterceptReport {
            mode: "capture",
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
             Copies: 0 connected (not authenticated), 0 refused, 0 failed the key, 0 timed out, 0 cut for not reading, 0 over the cap, 0 not allowed\n\
             Failed: a \"quoted\" why\n"
        );
        // serde escapes what the hand-written JSON had to: control characters in strings.
        let r = InterceptReport {
            filter: "a\nb".into(),
            ..InterceptReport::default()
        };
        assert!(r.json().contains("\"filter\": \"a\\nb\""), "{}", r.json());
    }

    #[test]
    fn on_target_report_names_the_rule() {
        let mut r = InterceptReport {
            mode: "on-target",
            interface: "queue 7".into(),
            filter: "tcp sport { 8080 } ip daddr { 198.18.1.0/24 }".into(),
            listen: "0.0.0.0:1".into(),
            rule: Some("nft table inet tcpkit_intercept_7".into()),
            stale_rule_replaced: true,
            connections_aborted: Some(2),
            seconds: 2.0,
            ..InterceptReport::default()
        };
        assert_eq!(
            r.human(),
            "Intercept: on queue 7 (tcp sport { 8080 } ip daddr { 198.18.1.0/24 }), control on 0.0.0.0:1, 2.000 s\n\
             Answers: 0 caught, 0 sent to copies, 0 with no copy connected, 0 dropped for slow copies\n\
             Rule: nft table inet tcpkit_intercept_7 (replaced one left by a killed intercept), removed at exit after aborting 2 connections\n\
             Capture: 0 dropped by the kernel, 0 not TCP\n\
             Copies: 0 connected (not authenticated), 0 refused, 0 failed the key, 0 timed out, 0 cut for not reading, 0 over the cap, 0 not allowed\n"
        );
        let j = r.json();
        for f in [
            "\"mode\": \"on-target\",",
            "\"rule\": \"nft table inet tcpkit_intercept_7\",",
            "\"stale_rule_replaced\": true,",
            "\"connections_aborted\": 2,",
        ] {
            assert!(j.contains(f), "{f} in {j}");
        }
        r.connections_aborted = None;
        assert!(r.json().contains("\"connections_aborted\": null,"));
        assert!(r
            .human()
            .contains("removed at exit (ss could not abort its connections first)"));
    }
}
