//! Transparent mode (tcpcopy's): the target sees the clients' own addresses.
//!
//! The capture side is relay mode's: the same input ([`crate::feed`]: the live ring or a
//! capture file at its pace, through [`crate::reasm::Tracker`]), rules, `-r` sampling, and
//! turns (`turns`: requests cut at server turns, the client's think time, `--diff`'s
//! original answers); the difference is how a copy reaches the target. Here copy plays the client's TCP itself through a raw IP socket
//! (IP_HDRINCL, IPv4 and IPv6): the SYN carries the client's address (or its `-c` rewrite),
//! port and ISN; the target answers toward that address, its route sends the answers to the
//! assistant host, and `tcpkit intercept` there returns their headers over the control
//! connection ([`crate::control`]); or intercept runs on the target itself and queues them
//! there (`--on-target`, [`crate::intercept`]). From those headers each copy (`Flow`) learns the
//! target's sequence numbers and acknowledgements: it ACKs the target's data, sends the next
//! request once the previous one was answered (plus the think time), retransmits what was not
//! acknowledged (go-back-N from the oldest byte, exponential RTO), and ends with a FIN — or a
//! RST when it must give up, so the target never keeps a half-open connection of ours.
//!
//! With `--diff`, copy asks intercept for the answers' payload too and feeds each copy's
//! target bytes, in sequence order, to the same comparison as relay mode ([`crate::diff`]).
//! A copy takes only the segment holding its next byte and acknowledges only the bytes it was
//! given, so the target resends anything lost, reordered or cut on the way, and the bytes
//! compared are exactly the target's.
//!
//! Sessions open before copying started get a handshake of their own (a fresh ISN) and are
//! copied from their next request boundary. With `-n N` copy 1 keeps the client's port when
//! that 4-tuple is free and every other copy takes a port from an explicit pool, round-robin,
//! skipping every port whose (client address, port, target) is in use — never tcpcopy's
//! random port shift, which collides.
//!
//! Several copies (one per online host) may feed one target and one intercept, which sends
//! every answer to all of them; each takes only the answers of its own 4-tuples. Two online
//! hosts can see the same client address and port (a client or a load balancer using one
//! source port toward two servers), so two copies can send SYNs for one 4-tuple, which neither
//! can know beforehand. The target answers the later SYN with an ACK of the connection it
//! holds there (a challenge ACK), not the answer to that SYN: the copy that gets it leaves the
//! tuple without a RST (the connection a RST would kill is the other copy's) and makes its SYN
//! again from a pool port, counted as `tuple_in_use`.
//!
//! The control connection lost (intercept restarted, the assistant unreachable): every copy
//! that had sent its SYN can no longer see its answers, so it is reset and counted as failed
//! by that cause; copy reconnects with a back-off, and new sessions wait for it (their SYN is
//! held) up to `--timeout`.
//!
//! A target that refuses (a RST to our SYN) holds back every copy to it with relay mode's
//! shared back-off (`crate::backoff`): one probe SYN per step, the other copies waiting for
//! its result, and a copy whose `--timeout` comes first ends refused without a SYN of its
//! own (`skipped_in_backoff`). A down target sees a trickle of SYNs, not one (plus
//! retransmissions) per production session.
//!
//! Nothing is ever sent toward a client: raw packets go to the targets only.
//!
//! The session front (capture side, request turns, tally, report) is `crate::front`'s;
//! this module is its transport: a raw TCP flow per copy, answered through intercept.

mod control_link;
mod ports;
mod probe;

pub use control_link::handshake;
use ports::PortPool;
pub use probe::{probe_return_path, ProbeAnswer};

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::report::{CopyReport, TransparentStats};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token};
use rustc_hash::FxHashMap;
use tcpkit_pace::now_ns;
use tcpkit_send::raw::RawIpSink;
use tcpkit_wire::tcp::{Flags, Options, Segment};
/// The `-c` prefix type, for callers that do not depend on tcpkit-wire.
pub use tcpkit_wire::Cidr;

use crate::auth::{CopyHandshake, HandshakeError, Key};
use crate::backoff::{Backoff, Down, Gate};
use crate::config::{CopyConfig, CopyCounters};
use crate::control::{ControlError, Msg, PacketHdr};
use crate::feed::{FeedError, Input};
use crate::front::{
    io_err, open_differ, Engine, Front, Item, Outcome, RunError, Transport, CLOSE_LINGER_NS,
};
use crate::transfer;

/// What transparent mode adds to the copy's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct TransparentConfig {
    /// intercept's control address.
    pub intercept: SocketAddr,
    /// `-c`: client addresses moved into this prefix (their host bits kept).
    pub client_cidr: Option<Cidr>,
    /// Source ports of `-n` copies beyond the first: `lo..=hi`.
    pub port_pool: (u16, u16),
    /// `--auth-key-file`: the key this copy proves to intercept (and intercept to it).
    pub key: Option<Key>,
}

/// The pool of `-n` copies' source ports when none is given: above the registered ports and
/// below Linux's default ephemeral range, so a copy's port is rarely a live client's.
pub const DEFAULT_PORT_POOL: (u16, u16) = (10_000, 32_767);

/// Why transparent mode could not run.
#[derive(Debug, thiserror::Error)]
pub enum TransparentError {
    #[error("intercept {addr} unreachable")]
    Unreachable {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// The opening exchange failed: refused, or the keys do not match.
    #[error("intercept {addr} {why}")]
    Handshake {
        addr: SocketAddr,
        why: HandshakeError,
    },
    #[error("intercept {addr} does not speak the control protocol: {why}")]
    NotIntercept { addr: SocketAddr, why: String },
    /// The input, or a system call of the run's own (shared with relay mode).
    #[error(transparent)]
    Run(#[from] RunError),
}

impl From<FeedError> for TransparentError {
    fn from(e: FeedError) -> Self {
        Self::Run(e.into())
    }
}

/// `ip` moved into `cidr`: the prefix's network bits, `ip`'s host bits. Another family is
/// kept as it is (resolve refuses a `-c` whose family matches no rule's target).
pub fn map_client(ip: IpAddr, cidr: &Cidr) -> IpAddr {
    let p = u32::from(cidr.prefix());
    match (ip, cidr.addr()) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            IpAddr::V4(Ipv4Addr::from(
                (u32::from(n) & mask) | (u32::from(a) & !mask),
            ))
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            IpAddr::V6(Ipv6Addr::from(
                (u128::from(n) & mask) | (u128::from(a) & !mask),
            ))
        }
        _ => ip,
    }
}

/// `a` is after `b` in sequence space.
fn seq_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// The control connection is down: the SYN waits for it.
    WaitControl,
    SynSent,
    Established,
    /// Our FIN is sent; waiting for its ACK and the target's FIN.
    Closing,
}

/// One copy's TCP, the client's, played toward the target.
#[derive(Debug)]
pub(crate) struct Flow {
    /// The address the target sees.
    client: SocketAddr,
    st: St,
    isn: u32,
    snd_una: u32,
    snd_nxt: u32,
    rcv_nxt: u32,
    /// The end of the furthest payload the target has sent (intercept saw): past `rcv_nxt`,
    /// bytes between them are still due.
    rcv_max: u32,
    /// Sequence number of our FIN, once sent.
    fin_seq: Option<u32>,
    fin_acked: bool,
    peer_fin: bool,
    peer_win: u32,
    mss: usize,
    /// Stream bytes from `snd_una` on: in flight, then not sent yet.
    buf: Vec<u8>,
    /// Retransmission: when, and the current timeout.
    rto_at: u64,
    rto_ns: u64,
    /// SynSent toward a silent target: this flow found it silent and keeps retransmitting
    /// (`probing`), or another did and this one waits for the back-off's gate before its SYN
    /// goes out again (`standing_back`).
    probing: bool,
    standing_back: bool,
    /// The segment the timer is for never left this host (its send failed here: a full
    /// socket buffer, a local firewall rule): the timer resends it soon, and its firing is
    /// neither the target's silence nor a loss, so the timeout does not double.
    local_pending: bool,
    /// Sends that failed here in a row: each waits twice as long as the one before
    /// ([`LOCAL_RETRY_NS`] first, the retransmission timeout at most), so a host whose
    /// buffers stay full is not sent a storm of retries.
    local_fails: u8,
    /// WaitControl/SynSent: give up after this; Closing: reset after this.
    deadline: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CtlState {
    Down { retry_at: u64 },
    Connecting,
    Hello,
    Up,
}

/// The control connection to intercept.
#[derive(Debug)]
struct Control {
    addr: SocketAddr,
    key: Option<Key>,
    /// The opening exchange of the connection being made (None once welcomed).
    hs: Option<CopyHandshake>,
    sock: Option<TcpStream>,
    st: CtlState,
    inbuf: Vec<u8>,
    last_rx_ns: u64,
    backoff: u32,
    /// When the connection that was up went down (0: it is up, or never was lost).
    down_since: u64,
}

const CONTROL: Token = Token(usize::MAX - 1);
/// First retransmission timeout (Linux's minimum RTO is 200 ms; the SYN's is 1 s).
const RTO_NS: u64 = 200_000_000;
const SYN_RTO_NS: u64 = 1_000_000_000;
const RTO_MAX_NS: u64 = 4_000_000_000;
/// A segment whose send failed on this host goes again this soon: nothing was lost on the
/// way, and waiting a whole retransmission timeout (a SYN's is 1 s) outlasts the 1 s drain a
/// stopped run gives its copies. The loop's timers count whole milliseconds.
const LOCAL_RETRY_NS: u64 = 1_000_000;
/// intercept pings every second: three missed means it is gone.
const CONTROL_SILENCE_NS: u64 = 3_000_000_000;
/// Our receive window (no window scaling is offered: we keep none of the target's bytes).
/// Below 64 KiB by a frame header's worth, so any one segment of the target's, a GSO one
/// included (the window bounds it), fits a control frame whole and `--diff` never has to
/// wait for the target to resend bytes intercept had to cut.
const WINDOW: u16 = (crate::control::MAX_BODY - crate::control::packet_fixed(true)) as u16;
/// The most bytes in flight toward the target, whatever its window.
const MAX_FLIGHT: u32 = 256 << 10;
/// SYNs seen whose session has not opened yet, at most (a SYN flood cannot grow it).
const MAX_PENDING_SYNS: usize = 1 << 16;
/// With `--diff`, the payload asked of intercept: all of every answer. intercept cuts only
/// what a control frame cannot hold, and a copy acknowledges only the bytes it was given, so
/// the target sends anything cut again.
const DIFF_PAYLOAD: u16 = u16::MAX;

/// Transparent mode's transport: raw sockets, the control connection, the 4-tuples.
pub(crate) struct Raw<'a> {
    t: &'a TransparentConfig,
    poll: Poll,
    raw4: Option<RawIpSink>,
    raw6: Option<RawIpSink>,
    ctl: Control,
    /// (client as the target sees it, target) → flow: exact 4-tuples, so answers never go
    /// to the wrong copy and no two copies share one.
    by_tuple: FxHashMap<(SocketAddr, SocketAddr), (usize, u32)>,
    /// The shared back-off toward targets that refuse or answer nothing (relay mode's): a
    /// down target gets one probe SYN per step, not one per production session.
    backoff: Backoff,
    pool: PortPool,
    /// SYNs' ISNs by (client, server), until their session opens.
    syn_isn: FxHashMap<(SocketAddr, SocketAddr), u32>,
    /// Mixed into the ISNs of synthesized handshakes: without it two copies (two processes)
    /// synthesizing a handshake for the same client port at the same moment would pick
    /// nearly the same ISN, and a SYN inside the other's window makes the target reset both.
    isn_salt: u32,
    pkt: Vec<u8>,
    ts: TransparentStats,
    server_ports: Vec<u16>,
}

/// Transparent mode: the front over raw flows.
type TpEngine<'e, 'a> = Engine<'e, Raw<'a>>;

impl<'a> Transport for Raw<'a> {
    type Conn = Flow;
    /// The client's ISN: from its SYN, or synthesized for the session's first copy.
    type Seed = Option<u32>;
    type Error = TransparentError;
    const MODE: &'static str = "transparent";
    const LIVE_WAIT: Duration = Duration::from_millis(5);
    const DRAIN_WAIT: Duration = Duration::from_millis(20);

    fn registry(&self) -> &Registry {
        self.poll.registry()
    }

    /// The client's ISN, for a SYN that carries it; the session opens with the tracker's event.
    fn frame(e: &mut Engine<'_, Self>, frame: &[u8]) {
        let t = &mut e.t;
        if let Ok(s) = Segment::parse(frame) {
            if s.flags.0 & (Flags::SYN.0 | Flags::ACK.0) == Flags::SYN.0
                && t.server_ports.contains(&s.dst.port())
            {
                if t.syn_isn.len() >= MAX_PENDING_SYNS {
                    t.syn_isn.clear();
                }
                t.syn_isn.insert((s.src, s.dst), s.seq);
            }
        }
    }

    fn session_seen(
        e: &mut Engine<'_, Self>,
        client: SocketAddr,
        server: SocketAddr,
    ) -> Option<u32> {
        e.t.syn_isn.remove(&(client, server))
    }

    fn new_conn(
        e: &mut Engine<'_, Self>,
        seed: &mut Option<u32>,
        client: SocketAddr,
        target: SocketAddr,
        k: u32,
        now: u64,
    ) -> Option<Flow> {
        let ip = match &e.t.t.client_cidr {
            Some(c) => map_client(client.ip(), c),
            None => client.ip(),
        };
        // The client's own ISN when its SYN was seen; otherwise a handshake of our own, with
        // an ISN from the clock as a TCP stack picks one, salted per process.
        let isn = match *seed {
            Some(i) => i,
            None => {
                e.t.ts.synthesized_handshakes += u64::from(e.f.cfg.copies);
                let i = ((now >> 6) as u32 ^ (u32::from(client.port()) << 16))
                    .wrapping_add(e.t.isn_salt);
                *seed = Some(i);
                i
            }
        };
        let Some(port) = e.t.pick_port(ip, client.port(), target, k == 0) else {
            e.t.ts.ports_exhausted += 1;
            e.f.report.sessions.copies += 1;
            e.f.report.sessions.failed.shed += 1;
            return None;
        };
        Some(Flow {
            client: SocketAddr::new(ip, port),
            st: St::WaitControl,
            isn,
            snd_una: isn,
            snd_nxt: isn,
            rcv_nxt: 0,
            rcv_max: 0,
            fin_seq: None,
            fin_acked: false,
            peer_fin: false,
            peer_win: 0,
            mss: 536,
            buf: Vec::new(),
            rto_at: 0,
            rto_ns: SYN_RTO_NS,
            probing: false,
            standing_back: false,
            local_pending: false,
            local_fails: 0,
            deadline: now + e.f.cfg.timeout_ns,
        })
    }

    fn placed(e: &mut Engine<'_, Self>, idx: usize, gen: u32) {
        if let Some(c) = e.f.conns.get(idx) {
            e.t.by_tuple.insert((c.x.client, c.target), (idx, gen));
        }
    }

    fn drive(e: &mut Engine<'_, Self>, idx: usize, now: u64) -> bool {
        let timeout = e.f.cfg.timeout_ns;
        let ctl_up = e.t.ctl.st == CtlState::Up;
        loop {
            let Some(c) = e.f.conns.get_mut(idx) else {
                return false;
            };
            let target = c.target;
            let f = &mut c.x;
            match f.st {
                St::WaitControl => {
                    if ctl_up {
                        if let Gate::Wait(at) = e.t.backoff.gate(target, now) {
                            if at >= f.deadline {
                                // Down until past our timeout: given up unsent.
                                let how = match e.t.backoff.down(target) {
                                    Some(Down::Silent) => Outcome::Timeout,
                                    _ => Outcome::Refused,
                                };
                                e.f.report.sessions.skipped_in_backoff += 1;
                                e.end(idx, how, false);
                            } else {
                                e.f.arm(idx, at, now);
                            }
                            return false;
                        }
                        f.st = St::SynSent;
                        f.rto_ns = SYN_RTO_NS;
                        f.rto_at = now + SYN_RTO_NS;
                        f.snd_nxt = f.isn.wrapping_add(1);
                        f.deadline = now + timeout;
                        let (isn, at) = (f.isn, f.rto_at);
                        e.send(idx, Flags::SYN, isn, 0, 0);
                        e.f.arm(idx, at, now);
                    } else if now >= f.deadline {
                        e.end(idx, Outcome::ControlLost, false);
                    } else {
                        let at = f.deadline;
                        e.f.arm(idx, at, now);
                    }
                    return false;
                }
                St::SynSent => {
                    if now >= f.deadline {
                        e.end(idx, Outcome::Timeout, true);
                    } else if now >= f.rto_at && f.local_pending {
                        // The SYN never left: sent now, with the timeout it had.
                        f.local_pending = false;
                        f.rto_at = now + f.rto_ns;
                        let (isn, at) = (f.isn, f.rto_at.min(f.deadline));
                        e.send(idx, Flags::SYN, isn, 0, 0);
                        e.f.arm(idx, at, now);
                    } else if now >= f.rto_at && f.standing_back {
                        match e.t.backoff.gate(target, now) {
                            // This flow's SYN is the probe.
                            Gate::Go => {
                                f.standing_back = false;
                                f.rto_ns = SYN_RTO_NS;
                                f.rto_at = now + SYN_RTO_NS;
                                let (isn, at) = (f.isn, f.rto_at.min(f.deadline));
                                e.t.ts.retransmitted_segments += 1;
                                e.send(idx, Flags::SYN, isn, 0, 0);
                                e.f.arm(idx, at, now);
                            }
                            Gate::Wait(at) => {
                                f.rto_at = at;
                                let at = at.min(f.deadline);
                                e.f.arm(idx, at, now);
                            }
                        }
                    } else if now >= f.rto_at
                        && !f.probing
                        && !e
                            .t
                            .backoff
                            .silent(target, now, f.deadline.saturating_sub(timeout))
                    {
                        // A SYN unanswered for its first timeout: the target is silent (off,
                        // or firewalled). Another flow found out first and keeps trying; this
                        // one stands back rather than retransmit, so the target does not get
                        // every session's SYNs.
                        f.standing_back = true;
                        continue;
                    } else if now >= f.rto_at {
                        f.probing = true;
                        f.rto_ns = (f.rto_ns * 2).min(RTO_MAX_NS);
                        f.rto_at = now + f.rto_ns;
                        let (isn, at) = (f.isn, f.rto_at.min(f.deadline));
                        e.t.ts.retransmitted_segments += 1;
                        e.send(idx, Flags::SYN, isn, 0, 0);
                        e.f.arm(idx, at, now);
                    } else {
                        let at = f.rto_at.min(f.deadline);
                        e.f.arm(idx, at, now);
                    }
                    return false;
                }
                St::Closing => {
                    if f.fin_acked && f.peer_fin {
                        let how = c.ending;
                        e.end(idx, how, false);
                    } else if now >= f.deadline {
                        // The target never finished closing: reset it so it keeps nothing.
                        let how = c.ending;
                        e.end(idx, how, true);
                    } else {
                        if !f.fin_acked && now >= f.rto_at {
                            if f.local_pending {
                                f.local_pending = false;
                            } else {
                                f.rto_ns = (f.rto_ns * 2).min(RTO_MAX_NS);
                                e.t.ts.retransmitted_segments += 1;
                            }
                            f.rto_at = now + f.rto_ns;
                            let seq = f.fin_seq.unwrap_or(f.snd_nxt);
                            e.send(idx, Flags::FIN | Flags::ACK, seq, 0, 0);
                        }
                        let Some(f) = e.f.conns.get(idx).map(|c| &c.x) else {
                            return false;
                        };
                        let at = if f.fin_acked {
                            f.deadline
                        } else {
                            f.deadline.min(f.rto_at)
                        };
                        e.f.arm(idx, at, now);
                    }
                    return false;
                }
                St::Established => {}
            }
            // Retransmission: nothing acked for an RTO, so everything from the oldest byte
            // goes again (go-back-N), unless nothing moved for the whole --timeout.
            if f.snd_una != f.snd_nxt && f.rto_at != 0 && now >= f.rto_at {
                if now.saturating_sub(c.progress_ns) >= timeout {
                    e.end(idx, Outcome::Timeout, true);
                    return false;
                }
                f.snd_nxt = f.snd_una;
                f.rto_at = 0;
                if f.local_pending {
                    // What did not leave goes now, with the timeout it had.
                    f.local_pending = false;
                } else {
                    f.rto_ns = (f.rto_ns * 2).min(RTO_MAX_NS);
                    e.t.ts.retransmitted_segments += 1;
                }
            }
            e.transmit(idx, now);
            return true;
        }
    }

    fn peer_closed(x: &Flow) -> bool {
        x.peer_fin
    }

    fn answer_due(x: &Flow) -> bool {
        seq_gt(x.rcv_max, x.rcv_nxt)
    }

    /// The request's bytes join the stream; they go out with the next transmit and stay
    /// held until the target acknowledges them.
    fn write(e: &mut Engine<'_, Self>, idx: usize, _now: u64) -> bool {
        let Some(c) = e.f.conns.get_mut(idx) else {
            return false;
        };
        if let Some(Item::Data { bytes, .. }) = c.queue.front() {
            c.x.buf.extend_from_slice(bytes);
        }
        c.queue.pop_front();
        true
    }

    fn close(e: &mut Engine<'_, Self>, idx: usize, now: u64, ending: Outcome) -> bool {
        let Some(c) = e.f.conns.get_mut(idx) else {
            return false;
        };
        let f = &mut c.x;
        if !f.buf.is_empty() {
            // Everything acked first; the ACK's arrival pumps again.
            let at = if f.rto_at == 0 {
                now + f.rto_ns
            } else {
                f.rto_at
            };
            e.f.arm(idx, at, now);
            return false;
        }
        c.queue.pop_front();
        let seq = f.snd_nxt;
        f.fin_seq = Some(seq);
        f.snd_nxt = seq.wrapping_add(1);
        f.st = St::Closing;
        f.rto_ns = RTO_NS;
        f.rto_at = now + RTO_NS;
        f.deadline = now + CLOSE_LINGER_NS;
        c.ending = ending;
        e.send(idx, Flags::FIN | Flags::ACK, seq, 0, 0);
        true
    }

    fn release(e: &mut Engine<'_, Self>, idx: usize, _how: Outcome, reset: bool) {
        if reset {
            e.send_rst(idx);
        }
        if let Some(c) = e.f.conns.get(idx) {
            e.t.by_tuple.remove(&(c.x.client, c.target));
        }
    }

    fn io(
        e: &mut Engine<'_, Self>,
        events: &mut Events,
        wait: Duration,
    ) -> Result<(), TransparentError> {
        match e.t.poll.poll(events, Some(wait)) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(io_err("wait for events (epoll_wait)")(err).into()),
        }
        let now = now_ns();
        if events.iter().any(|ev| ev.token() == CONTROL) {
            e.control_io(now);
        }
        // Silence is judged only after reading what intercept sent: a copy that did not run
        // for a while (a loaded machine, and copy runs niced) finds intercept's pings waiting
        // and must not take its own stall for intercept's silence (it reset the copies in
        // flight, and their answers went uncompared).
        e.control_tick(now);
        Ok(())
    }

    fn finish(&mut self, f: &Front<'_, Flow>, r: &mut CopyReport) {
        self.ts.control_lost = f.control_lost;
        r.transparent = Some(std::mem::take(&mut self.ts));
    }

    fn backoff(&mut self) -> &mut Backoff {
        &mut self.backoff
    }

    /// A flow waiting for the control connection or the back-off's gate has sent no SYN yet.
    fn gated(x: &Flow) -> Option<bool> {
        (x.st == St::WaitControl).then_some(false)
    }
}

impl Raw<'_> {
    /// The client's own port for the first copy when its 4-tuple is free; otherwise (and
    /// for every other copy) the next free port of the pool.
    fn pick_port(&mut self, ip: IpAddr, own: u16, target: SocketAddr, first: bool) -> Option<u16> {
        let by_tuple = &self.by_tuple;
        let taken = |p: u16| by_tuple.contains_key(&(SocketAddr::new(ip, p), target));
        self.pool
            .pick(own, first, taken, &mut self.ts.port_collisions)
    }
}

impl TpEngine<'_, '_> {
    /// Payload bytes of each answer asked of intercept: none unless answers are compared.
    fn max_payload(&self) -> u16 {
        if self.f.differ.is_some() {
            DIFF_PAYLOAD
        } else {
            0
        }
    }

    /// Flow `idx`'s SYN met another connection on its 4-tuple at the target: the flow moves
    /// to the pool's next free port (as `-n`'s copies take theirs) and sends its SYN from
    /// there, keeping its ISN, its requests and its connect deadline. Nothing more is sent on
    /// the tuple it leaves, not even a RST: that connection is not ours. No free port: shed.
    fn leave_taken_tuple(&mut self, idx: usize, now: u64) {
        let Some(c) = self.f.conns.get(idx) else {
            return;
        };
        let (old, target) = (c.x.client, c.target);
        let gen = self.t.by_tuple.get(&(old, target)).map(|&(_, g)| g);
        self.t.ts.tuple_in_use += 1;
        // The tuple left is still ours in `by_tuple` here, so the pool passes over it.
        let Some(port) = self.t.pick_port(old.ip(), old.port(), target, false) else {
            self.t.ts.ports_exhausted += 1;
            self.end(idx, Outcome::Shed, false);
            return;
        };
        let client = SocketAddr::new(old.ip(), port);
        self.t.by_tuple.remove(&(old, target));
        if let Some(gen) = gen {
            self.t.by_tuple.insert((client, target), (idx, gen));
        }
        let Some(f) = self.f.conns.get_mut(idx).map(|c| &mut c.x) else {
            return;
        };
        f.client = client;
        f.rto_ns = SYN_RTO_NS;
        f.rto_at = now + SYN_RTO_NS;
        let (isn, at) = (f.isn, f.rto_at.min(f.deadline));
        self.send(idx, Flags::SYN, isn, 0, 0);
        self.f.arm(idx, at, now);
    }

    /// Builds and sends one segment of flow `idx`; `payload` is `buf[off..off+len]`.
    fn send(&mut self, idx: usize, flags: Flags, seq: u32, off: usize, len: usize) {
        let Some(c) = self.f.conns.get(idx) else {
            return;
        };
        let f = &c.x;
        let syn = flags.has(Flags::SYN);
        let seg = Segment {
            src: f.client,
            dst: c.target,
            seq,
            ack: if syn { 0 } else { f.rcv_nxt },
            flags,
            window: WINDOW,
            options: Options {
                mss: syn.then_some(1460),
                ..Options::default()
            },
            payload: 0..0,
            payload_len: 0,
        };
        let payload = f.buf.get(off..off + len).unwrap_or(&[]);
        let t = &mut self.t;
        t.pkt.clear();
        if seg.emit_ip(payload, &mut t.pkt).is_err() {
            t.ts.send_errors += 1;
            return;
        }
        let fd = if c.target.is_ipv6() {
            t.raw6.as_ref()
        } else {
            t.raw4.as_ref()
        };
        let sent = matches!(fd.map(|fd| fd.send(c.target.ip(), &t.pkt)), Some(Ok(())));
        if sent {
            t.ts.segments_sent += 1;
        } else {
            t.ts.send_errors += 1;
        }
        // A segment the timer answers for (SYN, FIN, data; not a bare ACK or RST): a failed
        // send is resent soon (see `local_pending`), a good one ends the streak of failures.
        if !(syn || flags.has(Flags::FIN) || len > 0) {
            return;
        }
        let Some(f) = self.f.conns.get_mut(idx).map(|c| &mut c.x) else {
            return;
        };
        if sent {
            f.local_fails = 0;
            return;
        }
        let now = now_ns();
        let wait = (LOCAL_RETRY_NS << f.local_fails.min(16)).min(f.rto_ns);
        f.local_fails = f.local_fails.saturating_add(1);
        f.local_pending = true;
        let at = now + wait;
        if f.rto_at == 0 || at < f.rto_at {
            f.rto_at = at;
        }
        // The earliest of a copy's timers is kept: this one comes before its timeout's.
        self.f.arm(idx, at, now);
    }

    fn send_rst(&mut self, idx: usize) {
        let Some(c) = self.f.conns.get(idx) else {
            return;
        };
        if c.x.st == St::WaitControl {
            return;
        }
        let seq = c.x.snd_nxt;
        self.send(idx, Flags::RST | Flags::ACK, seq, 0, 0);
    }

    /// Sends what the window allows of `buf` past `snd_nxt`.
    fn transmit(&mut self, idx: usize, now: u64) {
        loop {
            let Some(c) = self.f.conns.get_mut(idx) else {
                return;
            };
            let f = &mut c.x;
            let flight = f.snd_nxt.wrapping_sub(f.snd_una);
            let unsent = f.buf.len().saturating_sub(flight as usize);
            // A closed window still lets one segment through when nothing is in flight: the
            // probe that learns when it opens.
            let win = f
                .peer_win
                .min(MAX_FLIGHT)
                .max(if flight == 0 { 1 } else { 0 });
            if unsent == 0 || flight >= win {
                return;
            }
            let len = unsent.min(f.mss).min((win - flight) as usize);
            let (seq, off) = (f.snd_nxt, flight as usize);
            f.snd_nxt = f.snd_nxt.wrapping_add(len as u32);
            if f.rto_at == 0 {
                f.rto_at = now + f.rto_ns;
            }
            let at = f.rto_at;
            c.last_write_ns = now;
            self.f.report.requests.bytes_copied += len as u64;
            self.send(idx, Flags::ACK | Flags::PSH, seq, off, len);
            self.f.arm(idx, at, now);
            if self.f.conns.get(idx).is_some_and(|c| c.x.local_pending) {
                // The rest would fail the same way: all of it goes again from snd_una.
                return;
            }
        }
    }

    /// One answer of the target, as intercept saw it (`payload`: what it carried of it).
    fn on_answer(&mut self, h: &PacketHdr, payload: &[u8], now: u64) {
        self.t.ts.answers_received += 1;
        let Some(&(idx, gen)) = self.t.by_tuple.get(&(h.dst, h.src)) else {
            return;
        };
        let no_wait = self.f.cfg.no_wait;
        let diffing = self.f.differ.is_some();
        // Borrowed field by field so the counters stay reachable.
        let fr = &mut self.f;
        let Some(c) = fr.conns.by_handle(idx, gen) else {
            return;
        };
        let target = c.target;
        let f = &mut c.x;
        let flags = Flags(h.flags);
        if flags.has(Flags::RST) {
            let how = match f.st {
                St::SynSent => Outcome::Refused,
                St::Closing if f.fin_acked => c.ending,
                _ => Outcome::Reset,
            };
            // A RST in answer to our SYN must acknowledge it; any other must be in window.
            let valid = match f.st {
                St::SynSent => h.ack == f.isn.wrapping_add(1),
                _ => !seq_gt(f.rcv_nxt, h.seq.wrapping_add(1)) || h.seq == f.rcv_nxt,
            };
            if valid {
                if how == Outcome::Refused {
                    self.t.backoff.refused(target, now, &"a RST to its SYN");
                }
                self.end(idx, how, false);
            }
            return;
        }
        match f.st {
            St::WaitControl => return,
            St::SynSent => {
                if !(flags.has(Flags::SYN) && flags.has(Flags::ACK))
                    || h.ack != f.isn.wrapping_add(1)
                {
                    // An acknowledgement on our 4-tuple of another sequence than our SYN's:
                    // the target holds another connection there (its challenge ACK to our
                    // SYN, or that connection's own traffic): another copy's, when two online
                    // hosts see the same client address and port, or one the target has not
                    // let go. The textbook answer, a RST, could kill that connection; this
                    // copy leaves the tuple instead, for a port of the pool. A bare ACK of
                    // our SYN is the target keeping our own half-open connection (its answer
                    // to another copy's SYN arriving there): we stay.
                    if flags.has(Flags::ACK) && h.ack != f.isn.wrapping_add(1) {
                        self.leave_taken_tuple(idx, now);
                    }
                    return;
                }
                self.t.backoff.accepted(target, now);
                f.rcv_nxt = h.seq.wrapping_add(1);
                f.rcv_max = f.rcv_nxt;
                f.snd_una = h.ack;
                f.snd_nxt = h.ack;
                f.mss = usize::from(h.mss.unwrap_or(536).clamp(88, 1460));
                f.peer_win = u32::from(h.window);
                f.st = St::Established;
                f.rto_ns = RTO_NS;
                f.rto_at = 0;
                c.progress_ns = now;
                c.last_rx_ns = now;
                c.last_write_ns = now;
                let seq = f.snd_nxt;
                self.send(idx, Flags::ACK, seq, 0, 0);
                self.pump(idx, now);
                return;
            }
            St::Established | St::Closing => {}
        }
        if flags.has(Flags::SYN) {
            // Our ACK of its SYN-ACK was lost: the target sent it again.
            let seq = f.snd_nxt;
            self.send(idx, Flags::ACK, seq, 0, 0);
            return;
        }
        if flags.has(Flags::ACK) && seq_gt(h.ack, f.snd_una) && !seq_gt(h.ack, f.snd_nxt) {
            let data_end = f.fin_seq.unwrap_or(f.snd_nxt.wrapping_add(1));
            let upto = if seq_gt(h.ack, data_end) {
                data_end
            } else {
                h.ack
            };
            let n = (upto.wrapping_sub(f.snd_una) as usize).min(f.buf.len());
            f.buf.drain(..n);
            c.held -= n.min(c.held);
            fr.held -= n.min(fr.held);
            if f.fin_seq.is_some_and(|s| h.ack == s.wrapping_add(1)) {
                f.fin_acked = true;
            }
            f.snd_una = h.ack;
            c.progress_ns = now;
            f.rto_ns = if f.st == St::Closing {
                f.rto_ns
            } else {
                RTO_NS
            };
            f.rto_at = if f.snd_una == f.snd_nxt {
                0
            } else {
                now + f.rto_ns
            };
        }
        f.peer_win = u32::from(h.window);
        let len = u32::from(h.payload_len);
        // With --diff a byte counts as received only when intercept carried it: the bytes
        // past what a frame held are not acknowledged and come again. Only the segment that
        // holds the next byte is taken (a later one is not kept: the duplicate ACK below
        // makes the target send the gap, and the segment after it, again). Copy is the
        // receiving TCP here, so in-order delivery is exact with no buffer at all; the
        // capture side's reassembler must keep out-of-order bytes only because nobody
        // retransmits for a passive observer.
        let have = if diffing {
            (payload.len() as u32).min(len)
        } else {
            len
        };
        let mut ack_now = false;
        if len > 0 {
            if seq_gt(h.seq.wrapping_add(len), f.rcv_max) {
                f.rcv_max = h.seq.wrapping_add(len);
            }
            let end = h.seq.wrapping_add(have);
            if !seq_gt(h.seq, f.rcv_nxt) && seq_gt(end, f.rcv_nxt) {
                let new = end.wrapping_sub(f.rcv_nxt);
                let skip = f.rcv_nxt.wrapping_sub(h.seq) as usize;
                f.rcv_nxt = end;
                let data = payload.get(skip..).unwrap_or(&[]);
                c.answer_bytes(
                    u64::from(new),
                    data,
                    &mut fr.report,
                    &mut fr.target_lat,
                    no_wait,
                    now,
                );
            }
            // Every data segment is acknowledged, in order or not: a duplicate ACK is what
            // makes the target send the missing bytes again.
            ack_now = true;
        }
        let f = &mut c.x;
        if flags.has(Flags::FIN) && h.seq.wrapping_add(len) == f.rcv_nxt && !f.peer_fin {
            f.rcv_nxt = f.rcv_nxt.wrapping_add(1);
            f.peer_fin = true;
            ack_now = true;
        }
        if ack_now {
            let seq = f.snd_nxt;
            self.send(idx, Flags::ACK, seq, 0, 0);
        }
        self.pump(idx, now);
    }
}

/// Runs transparent mode on `input` (a live capture or a capture file at its pace) until it
/// ends, `stop` is set or `duration` passes; then lets the copies finish and returns the
/// report. Fails at start when intercept is unreachable or refuses, or a raw socket cannot be
/// opened (root or CAP_NET_RAW). `say` gives the user a line as it happens (a target
/// refusing, or back).
pub fn run(
    cfg: &CopyConfig,
    t: &TransparentConfig,
    input: &Input,
    duration: Option<Duration>,
    stop: &AtomicBool,
    live: &CopyCounters,
    say: &dyn Fn(&str),
) -> Result<CopyReport, TransparentError> {
    let start = now_ns();
    let differ = open_differ(cfg)?;
    let max_payload = if differ.is_some() { DIFF_PAYLOAD } else { 0 };
    let ctl_sock = handshake(
        t.intercept,
        Duration::from_secs(2),
        max_payload,
        t.key.as_ref(),
    )?;
    let want4 = cfg.rules.iter().any(|r| r.target.is_ipv4());
    let want6 = cfg.rules.iter().any(|r| r.target.is_ipv6());
    let raw4 = want4
        .then(|| RawIpSink::open(false))
        .transpose()
        .map_err(io_err("open a raw IPv4 socket (needs root or CAP_NET_RAW)"))?;
    let raw6 = want6
        .then(|| RawIpSink::open(true))
        .transpose()
        .map_err(io_err("open a raw IPv6 socket (needs root or CAP_NET_RAW)"))?;
    let poll = Poll::new().map_err(io_err("create the event loop (epoll)"))?;
    let mut ctl_sock = TcpStream::from_std(ctl_sock);
    poll.registry()
        .register(
            &mut ctl_sock,
            CONTROL,
            Interest::READABLE | Interest::WRITABLE,
        )
        .map_err(io_err("watch the control connection (epoll_ctl)"))?;
    let raw = Raw {
        t,
        poll,
        raw4,
        raw6,
        ctl: Control {
            addr: t.intercept,
            key: t.key.clone(),
            hs: None,
            sock: Some(ctl_sock),
            st: CtlState::Up,
            inbuf: Vec::new(),
            last_rx_ns: start,
            backoff: 0,
            down_since: 0,
        },
        by_tuple: FxHashMap::default(),
        backoff: Backoff::default(),
        pool: PortPool::new(t.port_pool),
        syn_isn: FxHashMap::default(),
        // std seeds each RandomState from the OS's randomness: a salt per process.
        isn_salt: std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            0u8,
        ) as u32,
        pkt: Vec::with_capacity(2048),
        ts: TransparentStats {
            intercept: t.intercept.to_string(),
            client_addr: t
                .client_cidr
                .map(|c| format!("{}/{}", c.addr(), c.prefix()))
                .unwrap_or_default(),
            ..TransparentStats::default()
        },
        server_ports: transfer::server_ports(&cfg.rules),
    };
    Engine::new(cfg, raw, differ, input, start, say).run(input, duration, stop, live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_addresses_map_into_the_prefix_keeping_host_bits() {
        let c: Cidr = "10.9.0.0/16".parse().unwrap();
        assert_eq!(
            map_client("198.18.1.7".parse().unwrap(), &c),
            "10.9.1.7".parse::<IpAddr>().unwrap()
        );
        let c: Cidr = "10.9.8.7/32".parse().unwrap();
        assert_eq!(
            map_client("198.18.1.7".parse().unwrap(), &c),
            "10.9.8.7".parse::<IpAddr>().unwrap()
        );
        let c: Cidr = "fd00:99::/64".parse().unwrap();
        assert_eq!(
            map_client("fd00:18:1::5".parse().unwrap(), &c),
            "fd00:99::5".parse::<IpAddr>().unwrap()
        );
        // Another family is left alone.
        assert_eq!(
            map_client("198.18.1.7".parse().unwrap(), &c),
            "198.18.1.7".parse::<IpAddr>().unwrap()
        );
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert_eq!(
            map_client("198.18.1.7".parse().unwrap(), &all),
            "198.18.1.7".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn sequence_comparison_wraps() {
        assert!(seq_gt(1, 0));
        assert!(seq_gt(5, u32::MAX - 5));
        assert!(!seq_gt(u32::MAX - 5, 5));
        assert!(!seq_gt(7, 7));
    }
}
