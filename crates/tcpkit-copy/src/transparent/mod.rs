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
//! there (`--on-target`, [`crate::intercept`]). From those headers each copy ([`Flow`]) learns the
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

mod control_link;
mod ports;
mod probe;

pub use control_link::handshake;
use ports::PortPool;
pub use probe::{probe_return_path, ProbeAnswer};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rustc_hash::FxHashMap;
use tcpkit_pace::{now_ns, Speed};
use tcpkit_send::raw::RawIpSink;
use tcpkit_stats::{CopyReport, Histogram, TransparentStats};
use tcpkit_wire::tcp::{Flags, Options, Segment};
/// The `-c` prefix type, for callers that do not depend on tcpkit-wire.
pub use tcpkit_wire::Cidr;

use crate::auth::{CopyHandshake, HandshakeError, Key};
use crate::backoff::{Backoff, Down, Gate};
use crate::config::{CopyConfig, CopyCounters};
use crate::control::{ControlError, Msg, PacketHdr};
use crate::diff::{ConnMeta, DiffConn, Differ};
use crate::feed::Input;
use crate::feed::{self, FeedError};
use crate::reasm::{CloseKind, Dir, SessionId};
use crate::transfer;
use crate::turns::{ClientBytes, ReqStart, Turns};

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
    /// The capture or the capture file.
    #[error(transparent)]
    Input(#[from] FeedError),
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> TransparentError {
    move |source| TransparentError::Io { what, source }
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

/// With --diff, until when a flow waits for the rest of the answer in progress before its next
/// request or its FIN (0: no wait). When more of it is certainly due (bytes seen past a hole,
/// which the target resends after its retransmission timeout, or an HTTP message its framing
/// says is not over) up to `timeout` without progress; when it only looks short of the
/// original, up to a short silence as in relay mode.
/// Takes the flow's fields, not the flow: callers hold its queue's front mutably.
fn diff_wait_until(
    diff: Option<&DiffConn>,
    rcv_max: u32,
    rcv_nxt: u32,
    last_rx_ns: u64,
    progress_ns: u64,
    timeout: u64,
) -> u64 {
    let Some(d) = diff else {
        return 0;
    };
    if seq_gt(rcv_max, rcv_nxt) || d.answer_partial() {
        last_rx_ns.max(progress_ns) + timeout
    } else if !d.answer_whole() {
        last_rx_ns + crate::diff::SETTLE_NS
    } else {
        0
    }
}

#[derive(Debug)]
enum Item {
    Data {
        bytes: Bytes,
        start: Option<ReqStart>,
    },
    End {
        wait_answer: bool,
        lost: bool,
    },
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Completed,
    Refused,
    Reset,
    Timeout,
    ClosedEarly,
    LostData,
    Shed,
    ControlLost,
    OpenAtEnd,
}

/// One copy: the client's TCP, played toward the target.
#[derive(Debug)]
struct Flow {
    gen: u32,
    /// The address the target sees.
    client: SocketAddr,
    target: SocketAddr,
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
    queue: VecDeque<Item>,
    /// Request bytes held (queue and `buf`), counted against the memory limit.
    held: usize,
    answered: bool,
    unanswered: u64,
    last_rx_ns: u64,
    last_write_ns: u64,
    /// Retransmission: when, the current timeout, and the last time anything was acked.
    rto_at: u64,
    rto_ns: u64,
    /// SynSent toward a silent target: this flow found it silent and keeps retransmitting
    /// (`probing`), or another did and this one waits for the back-off's gate before its SYN
    /// goes out again (`standing_back`).
    probing: bool,
    standing_back: bool,
    progress_ns: u64,
    /// WaitControl/SynSent: give up after this; Closing: reset after this.
    deadline: u64,
    ending: Outcome,
    timer_at: u64,
    /// `--diff`: this copy's answers (the payload intercept carried), paired with the
    /// original ones.
    diff: Option<Box<DiffConn>>,
}

/// A session being copied, on the capture side.
#[derive(Debug)]
struct Sess {
    flows: Vec<(usize, u32)>,
    turns: Turns,
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
}

const CONTROL: Token = Token(usize::MAX - 1);
const CLOSE_LINGER_NS: u64 = 1_000_000_000;
/// First retransmission timeout (Linux's minimum RTO is 200 ms; the SYN's is 1 s).
const RTO_NS: u64 = 200_000_000;
const SYN_RTO_NS: u64 = 1_000_000_000;
const RTO_MAX_NS: u64 = 4_000_000_000;
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

struct Engine<'a> {
    cfg: &'a CopyConfig,
    t: &'a TransparentConfig,
    poll: Poll,
    raw4: Option<RawIpSink>,
    raw6: Option<RawIpSink>,
    ctl: Control,
    sessions: FxHashMap<SessionId, Sess>,
    flows: Vec<Option<Flow>>,
    gens: Vec<u32>,
    free: Vec<usize>,
    /// (client as the target sees it, target) → flow: exact 4-tuples, so answers never go
    /// to the wrong copy and no two copies share one.
    by_tuple: FxHashMap<(SocketAddr, SocketAddr), (usize, u32)>,
    timers: BinaryHeap<Reverse<(u64, usize, u32)>>,
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
    start_ns: u64,
    held: usize,
    open: u64,
    pkt: Vec<u8>,
    report: CopyReport,
    ts: TransparentStats,
    orig: Histogram,
    target_lat: Histogram,
    server_ports: Vec<u16>,
    /// Think times are scaled by this (offline `--speed`).
    speed: Speed,
    /// Think times are capped at this (offline `--max-idle`), like the gaps between frames.
    max_think_ns: u64,
    differ: Option<Differ>,
}

impl<'a> Engine<'a> {
    /// Payload bytes of each answer asked of intercept: none unless answers are compared.
    fn max_payload(&self) -> u16 {
        if self.differ.is_some() {
            DIFF_PAYLOAD
        } else {
            0
        }
    }

    // ---- capture side -------------------------------------------------------------------

    /// The client's own port for the first copy when its 4-tuple is free; otherwise (and
    /// for every other copy) the next free port of the pool.
    fn pick_port(&mut self, ip: IpAddr, own: u16, target: SocketAddr, first: bool) -> Option<u16> {
        let by_tuple = &self.by_tuple;
        let taken = |p: u16| by_tuple.contains_key(&(SocketAddr::new(ip, p), target));
        self.pool
            .pick(own, first, taken, &mut self.ts.port_collisions)
    }

    /// Flow `idx`'s SYN met another connection on its 4-tuple at the target: the flow moves
    /// to the pool's next free port (as `-n`'s copies take theirs) and sends its SYN from
    /// there, keeping its ISN, its requests and its connect deadline. Nothing more is sent on
    /// the tuple it leaves, not even a RST: that connection is not ours. No free port: shed.
    fn leave_taken_tuple(&mut self, idx: usize, now: u64) {
        let Some(f) = self.flows[idx].as_ref() else {
            return;
        };
        let (old, target, gen) = (f.client, f.target, f.gen);
        self.ts.tuple_in_use += 1;
        // The tuple left is still ours in `by_tuple` here, so the pool passes over it.
        let Some(port) = self.pick_port(old.ip(), old.port(), target, false) else {
            self.ts.ports_exhausted += 1;
            self.end_flow(idx, Outcome::Shed, false);
            return;
        };
        let client = SocketAddr::new(old.ip(), port);
        self.by_tuple.remove(&(old, target));
        self.by_tuple.insert((client, target), (idx, gen));
        let Some(f) = self.flows[idx].as_mut() else {
            return;
        };
        f.client = client;
        f.rto_ns = SYN_RTO_NS;
        f.rto_at = now + SYN_RTO_NS;
        let (isn, at) = (f.isn, f.rto_at.min(f.deadline));
        self.send(idx, Flags::SYN, isn, 0, 0);
        self.arm(idx, at);
    }

    // ---- flows --------------------------------------------------------------------------

    fn flow_mut(&mut self, idx: usize, gen: u32) -> Option<&mut Flow> {
        self.flows
            .get_mut(idx)
            .and_then(Option::as_mut)
            .filter(|f| f.gen == gen)
    }

    fn new_flow(&mut self, client: SocketAddr, target: SocketAddr, isn: u32, now: u64) -> usize {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.flows.push(None);
            self.gens.push(0);
            self.flows.len() - 1
        });
        self.gens[idx] = self.gens[idx].wrapping_add(1);
        let gen = self.gens[idx];
        self.flows[idx] = Some(Flow {
            gen,
            client,
            target,
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
            queue: VecDeque::new(),
            held: 0,
            answered: false,
            unanswered: 0,
            last_rx_ns: now,
            last_write_ns: now,
            rto_at: 0,
            rto_ns: SYN_RTO_NS,
            probing: false,
            standing_back: false,
            progress_ns: now,
            deadline: now + self.cfg.timeout_ns,
            ending: Outcome::Completed,
            timer_at: 0,
            diff: None,
        });
        self.by_tuple.insert((client, target), (idx, gen));
        self.report.sessions.copies += 1;
        self.open += 1;
        idx
    }

    fn arm(&mut self, idx: usize, at: u64) {
        let Some(f) = self.flows[idx].as_mut() else {
            return;
        };
        if at != 0 && (f.timer_at == 0 || at < f.timer_at || f.timer_at < now_ns()) {
            f.timer_at = at;
            self.timers.push(Reverse((at, idx, f.gen)));
        }
    }

    /// Builds and sends one segment of flow `idx`; `payload` is `buf[off..off+len]`.
    fn send(&mut self, idx: usize, flags: Flags, seq: u32, off: usize, len: usize) {
        let Some(f) = self.flows[idx].as_ref() else {
            return;
        };
        let syn = flags.has(Flags::SYN);
        let seg = Segment {
            src: f.client,
            dst: f.target,
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
        self.pkt.clear();
        if seg.emit_ip(payload, &mut self.pkt).is_err() {
            self.ts.send_errors += 1;
            return;
        }
        let fd = if f.target.is_ipv6() {
            self.raw6.as_ref()
        } else {
            self.raw4.as_ref()
        };
        match fd.map(|fd| fd.send(f.target.ip(), &self.pkt)) {
            Some(Ok(())) => self.ts.segments_sent += 1,
            // Counted; the retransmission timer sends it again.
            _ => self.ts.send_errors += 1,
        }
    }

    fn send_rst(&mut self, idx: usize) {
        let Some(f) = self.flows[idx].as_ref() else {
            return;
        };
        if f.st == St::WaitControl {
            return;
        }
        let seq = f.snd_nxt;
        self.send(idx, Flags::RST | Flags::ACK, seq, 0, 0);
    }

    fn end_flow(&mut self, idx: usize, how: Outcome, rst: bool) {
        if rst {
            self.send_rst(idx);
        }
        let Some(mut f) = self.flows[idx].take() else {
            return;
        };
        if let (Some(d), Some(df)) = (f.diff.take(), self.differ.as_mut()) {
            d.closed(df, how == Outcome::Completed);
        }
        self.by_tuple.remove(&(f.client, f.target));
        self.held -= f.held;
        self.open -= 1;
        self.free.push(idx);
        let s = &mut self.report.sessions;
        let fl = &mut s.failed;
        match how {
            Outcome::Completed => s.completed += 1,
            Outcome::Refused => fl.target_refused += 1,
            Outcome::Reset => fl.reset += 1,
            Outcome::Timeout => fl.timeout += 1,
            Outcome::ClosedEarly => fl.closed_early += 1,
            Outcome::LostData => fl.lost_capture_data += 1,
            Outcome::Shed => fl.shed += 1,
            Outcome::ControlLost => self.ts.control_lost += 1,
            Outcome::OpenAtEnd => s.open_at_end += 1,
        }
    }

    /// Sends what the window allows of `buf` past `snd_nxt`.
    fn transmit(&mut self, idx: usize, now: u64) {
        loop {
            let Some(f) = self.flows[idx].as_mut() else {
                return;
            };
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
            f.last_write_ns = now;
            if f.rto_at == 0 {
                f.rto_at = now + f.rto_ns;
            }
            let at = f.rto_at;
            self.report.requests.bytes_copied += len as u64;
            self.send(idx, Flags::ACK | Flags::PSH, seq, off, len);
            self.arm(idx, at);
        }
    }

    /// Moves flow `idx` as far as it can go now; arms its timer when it must wait.
    fn pump(&mut self, idx: usize, now: u64) {
        let (no_wait, timeout, speed) = (self.cfg.no_wait, self.cfg.timeout_ns, self.speed);
        let ctl_up = self.ctl.st == CtlState::Up;
        loop {
            let Some(f) = self.flows[idx].as_mut() else {
                return;
            };
            match f.st {
                St::WaitControl => {
                    if ctl_up {
                        if let Gate::Wait(at) = self.backoff.gate(f.target, now) {
                            if at >= f.deadline {
                                // Down until past our timeout: given up unsent.
                                let how = match self.backoff.down(f.target) {
                                    Some(Down::Silent) => Outcome::Timeout,
                                    _ => Outcome::Refused,
                                };
                                self.report.sessions.skipped_in_backoff += 1;
                                self.end_flow(idx, how, false);
                            } else {
                                self.arm(idx, at);
                            }
                            return;
                        }
                        f.st = St::SynSent;
                        f.rto_ns = SYN_RTO_NS;
                        f.rto_at = now + SYN_RTO_NS;
                        f.snd_nxt = f.isn.wrapping_add(1);
                        f.deadline = now + timeout;
                        let (isn, at) = (f.isn, f.rto_at);
                        self.send(idx, Flags::SYN, isn, 0, 0);
                        self.arm(idx, at);
                    } else if now >= f.deadline {
                        self.end_flow(idx, Outcome::ControlLost, false);
                    } else {
                        let at = f.deadline;
                        self.arm(idx, at);
                    }
                    return;
                }
                St::SynSent => {
                    if now >= f.deadline {
                        self.end_flow(idx, Outcome::Timeout, true);
                    } else if now >= f.rto_at && f.standing_back {
                        match self.backoff.gate(f.target, now) {
                            // This flow's SYN is the probe.
                            Gate::Go => {
                                f.standing_back = false;
                                f.rto_ns = SYN_RTO_NS;
                                f.rto_at = now + SYN_RTO_NS;
                                let (isn, at) = (f.isn, f.rto_at.min(f.deadline));
                                self.ts.retransmitted_segments += 1;
                                self.send(idx, Flags::SYN, isn, 0, 0);
                                self.arm(idx, at);
                            }
                            Gate::Wait(at) => {
                                f.rto_at = at;
                                let at = at.min(f.deadline);
                                self.arm(idx, at);
                            }
                        }
                    } else if now >= f.rto_at && !f.probing && !self.backoff.silent(f.target, now) {
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
                        self.ts.retransmitted_segments += 1;
                        self.send(idx, Flags::SYN, isn, 0, 0);
                        self.arm(idx, at);
                    } else {
                        let at = f.rto_at.min(f.deadline);
                        self.arm(idx, at);
                    }
                    return;
                }
                St::Closing => {
                    if f.fin_acked && f.peer_fin {
                        let how = f.ending;
                        self.end_flow(idx, how, false);
                    } else if now >= f.deadline {
                        // The target never finished closing: reset it so it keeps nothing.
                        let how = f.ending;
                        self.end_flow(idx, how, true);
                    } else {
                        if !f.fin_acked && now >= f.rto_at {
                            f.rto_ns = (f.rto_ns * 2).min(RTO_MAX_NS);
                            f.rto_at = now + f.rto_ns;
                            let seq = f.fin_seq.unwrap_or(f.snd_nxt);
                            self.ts.retransmitted_segments += 1;
                            self.send(idx, Flags::FIN | Flags::ACK, seq, 0, 0);
                        }
                        let Some(f) = self.flows[idx].as_ref() else {
                            return;
                        };
                        let at = if f.fin_acked {
                            f.deadline
                        } else {
                            f.deadline.min(f.rto_at)
                        };
                        self.arm(idx, at);
                    }
                    return;
                }
                St::Established => {}
            }
            // Retransmission: nothing acked for an RTO, so everything from the oldest byte
            // goes again (go-back-N), unless nothing moved for the whole --timeout.
            if f.snd_una != f.snd_nxt && f.rto_at != 0 && now >= f.rto_at {
                if now.saturating_sub(f.progress_ns) >= timeout {
                    self.end_flow(idx, Outcome::Timeout, true);
                    return;
                }
                f.snd_nxt = f.snd_una;
                f.rto_ns = (f.rto_ns * 2).min(RTO_MAX_NS);
                f.rto_at = 0;
                self.ts.retransmitted_segments += 1;
            }
            self.transmit(idx, now);
            let Some(f) = self.flows[idx].as_mut() else {
                return;
            };
            let Some(front) = f.queue.front_mut() else {
                return;
            };
            match front {
                Item::Data { bytes, start } => {
                    if f.peer_fin {
                        self.end_flow(idx, Outcome::ClosedEarly, true);
                        return;
                    }
                    if let Some(r) = *start {
                        if r.wait_answer && !no_wait {
                            if !f.answered {
                                let dl = f.last_write_ns.max(f.progress_ns) + timeout;
                                if now >= dl {
                                    self.end_flow(idx, Outcome::Timeout, true);
                                } else {
                                    self.arm(idx, dl);
                                }
                                return;
                            }
                            // --diff: an answer arriving in pieces is not cut by the next
                            // request. When more of it is certainly due (bytes seen past a
                            // hole, which the target resends after its retransmission
                            // timeout, or an HTTP message its framing says is not over) it is
                            // waited for up to --timeout without progress; when it only looks
                            // short of the original, up to a short silence as in relay mode.
                            let at = diff_wait_until(
                                f.diff.as_deref(),
                                f.rcv_max,
                                f.rcv_nxt,
                                f.last_rx_ns,
                                f.progress_ns,
                                timeout,
                            );
                            if now < at {
                                self.arm(idx, at);
                                return;
                            }
                            let at = f.last_rx_ns + speed.wall(r.think_ns);
                            if now < at {
                                self.arm(idx, at);
                                return;
                            }
                        }
                        *start = None;
                        f.answered = false;
                        f.unanswered += 1;
                        self.report.requests.copied += 1;
                        if let (Some(d), Some(df)) = (f.diff.as_deref_mut(), self.differ.as_mut()) {
                            d.request_sent(df);
                        }
                    }
                    f.buf.extend_from_slice(bytes);
                    f.queue.pop_front();
                    // Continue: the bytes go out with the next transmit.
                }
                Item::End { wait_answer, lost } => {
                    let lost = *lost;
                    if *wait_answer && !no_wait && f.unanswered > 0 && !f.peer_fin {
                        let dl = f.last_write_ns.max(f.progress_ns) + timeout;
                        if now >= dl {
                            // As in relay mode: with a hole in the capture, the hole is the
                            // cause (its last request may be the part before it).
                            let how = if lost {
                                Outcome::LostData
                            } else {
                                Outcome::Timeout
                            };
                            self.end_flow(idx, how, true);
                        } else {
                            self.arm(idx, dl);
                        }
                        return;
                    }
                    // --diff: the last answer is waited for as any other (a FIN now would
                    // cut one whose tail the target is still resending).
                    if *wait_answer && !no_wait && !f.peer_fin {
                        let at = diff_wait_until(
                            f.diff.as_deref(),
                            f.rcv_max,
                            f.rcv_nxt,
                            f.last_rx_ns,
                            f.progress_ns,
                            timeout,
                        );
                        if now < at {
                            self.arm(idx, at);
                            return;
                        }
                    }
                    if !f.buf.is_empty() {
                        // Everything acked first; the ACK's arrival pumps again.
                        let at = if f.rto_at == 0 {
                            now + f.rto_ns
                        } else {
                            f.rto_at
                        };
                        self.arm(idx, at);
                        return;
                    }
                    f.queue.pop_front();
                    let seq = f.snd_nxt;
                    f.fin_seq = Some(seq);
                    f.snd_nxt = seq.wrapping_add(1);
                    f.st = St::Closing;
                    f.rto_ns = RTO_NS;
                    f.rto_at = now + RTO_NS;
                    f.deadline = now + CLOSE_LINGER_NS;
                    f.ending = if lost {
                        Outcome::LostData
                    } else {
                        Outcome::Completed
                    };
                    self.send(idx, Flags::FIN | Flags::ACK, seq, 0, 0);
                }
            }
        }
    }

    /// One answer of the target, as intercept saw it (`payload`: what it carried of it).
    fn on_answer(&mut self, h: &PacketHdr, payload: &[u8], now: u64) {
        self.ts.answers_received += 1;
        let Some(&(idx, gen)) = self.by_tuple.get(&(h.dst, h.src)) else {
            return;
        };
        let no_wait = self.cfg.no_wait;
        let diffing = self.differ.is_some();
        // Borrowed field by field (not through flow_mut) so the counters stay reachable.
        let Some(f) = self
            .flows
            .get_mut(idx)
            .and_then(Option::as_mut)
            .filter(|f| f.gen == gen)
        else {
            return;
        };
        let flags = Flags(h.flags);
        if flags.has(Flags::RST) {
            let how = match f.st {
                St::SynSent => Outcome::Refused,
                St::Closing if f.fin_acked => f.ending,
                _ => Outcome::Reset,
            };
            // A RST in answer to our SYN must acknowledge it; any other must be in window.
            let valid = match f.st {
                St::SynSent => h.ack == f.isn.wrapping_add(1),
                _ => !seq_gt(f.rcv_nxt, h.seq.wrapping_add(1)) || h.seq == f.rcv_nxt,
            };
            if valid {
                if how == Outcome::Refused {
                    let target = f.target;
                    self.backoff.refused(target, now);
                }
                self.end_flow(idx, how, false);
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
                self.backoff.accepted(f.target);
                f.rcv_nxt = h.seq.wrapping_add(1);
                f.rcv_max = f.rcv_nxt;
                f.snd_una = h.ack;
                f.snd_nxt = h.ack;
                f.mss = usize::from(h.mss.unwrap_or(536).clamp(88, 1460));
                f.peer_win = u32::from(h.window);
                f.st = St::Established;
                f.rto_ns = RTO_NS;
                f.rto_at = 0;
                f.progress_ns = now;
                f.last_rx_ns = now;
                f.last_write_ns = now;
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
            f.held -= n.min(f.held);
            self.held -= n.min(self.held);
            if f.fin_seq.is_some_and(|s| h.ack == s.wrapping_add(1)) {
                f.fin_acked = true;
            }
            f.snd_una = h.ack;
            f.progress_ns = now;
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
                if let Some(d) = f.diff.as_mut() {
                    let skip = f.rcv_nxt.wrapping_sub(h.seq) as usize;
                    d.target_bytes(payload.get(skip..).unwrap_or(&[]));
                }
                f.rcv_nxt = end;
                self.report.requests.bytes_answered += u64::from(new);
                if f.unanswered > 0 {
                    self.target_lat.record(now.saturating_sub(f.last_write_ns));
                    let k = if no_wait { f.unanswered } else { 1 };
                    self.report.requests.answered += k;
                    f.unanswered -= k;
                }
                f.answered = true;
                f.last_rx_ns = now;
            }
            // Every data segment is acknowledged, in order or not: a duplicate ACK is what
            // makes the target send the missing bytes again.
            ack_now = true;
        }
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

    // ---- loop -----------------------------------------------------------------------------

    fn fire_timers(&mut self, now: u64) {
        while let Some(Reverse((at, idx, gen))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(f) = self.flows[idx]
                .as_mut()
                .filter(|f| f.gen == gen && f.timer_at == at)
            {
                f.timer_at = 0;
                self.pump(idx, now);
            }
        }
    }

    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), TransparentError> {
        let now = now_ns();
        self.fire_timers(now);
        let mut wait = max_wait;
        if let Some(Reverse((at, _, _))) = self.timers.peek() {
            wait = wait.min(Duration::from_nanos(at.saturating_sub(now)));
        }
        match self.poll.poll(events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("wait for events (epoll_wait)")(e)),
        }
        let now = now_ns();
        if events.iter().any(|e| e.token() == CONTROL) {
            self.control_io(now);
        }
        // Silence is judged only after reading what intercept sent: a copy that did not run
        // for a while (a loaded machine, and copy runs niced) finds intercept's pings waiting
        // and must not take its own stall for intercept's silence (it reset the copies in
        // flight, and their answers went uncompared).
        self.control_tick(now);
        self.fire_timers(now);
        Ok(())
    }

    fn publish(&self, live: &CopyCounters) {
        let s = &self.report.sessions;
        let f = &s.failed;
        let st = |a: &std::sync::atomic::AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        st(&live.sessions_seen, s.seen);
        st(&live.copies, s.copies);
        st(&live.completed, s.completed);
        st(
            &live.failed,
            f.target_refused
                + f.reset
                + f.timeout
                + f.closed_early
                + f.lost_capture_data
                + f.shed
                + self.ts.control_lost,
        );
        st(&live.open, self.open);
        st(&live.requests_at_source, self.report.requests.at_source);
        st(&live.requests_copied, self.report.requests.copied);
        st(&live.requests_answered, self.report.requests.answered);
        st(&live.held_bytes, self.held as u64);
        st(&live.kernel_drops, self.report.capture.kernel_drops);
        st(&live.bytes_copied, self.report.requests.bytes_copied);
        st(&live.bytes_answered, self.report.requests.bytes_answered);
        if let Some(d) = self.differ.as_ref().map(Differ::stats) {
            st(&live.diff_compared, d.compared);
            st(&live.diff_equal, d.equal);
            st(&live.diff_different, d.different);
        }
    }

    /// After the input ended: lets the flows finish, at most `--timeout` and the linger, or
    /// [`feed::STOP_DRAIN`] when the run was `stopped` (or is stopped meanwhile); the rest
    /// count as open at the end.
    fn drain(
        &mut self,
        events: &mut Events,
        stop: &AtomicBool,
        live: &CopyCounters,
        mut stopped: bool,
    ) -> Result<(), TransparentError> {
        let mut deadline = feed::drain_deadline(self.cfg, stopped, CLOSE_LINGER_NS);
        while self.open > 0 && now_ns() < deadline {
            if !stopped && stop.load(Ordering::Relaxed) {
                stopped = true;
                deadline = deadline.min(feed::drain_deadline(self.cfg, true, 0));
            }
            self.step(events, Duration::from_millis(20))?;
            self.publish(live);
        }
        for idx in 0..self.flows.len() {
            if self.flows[idx].is_some() {
                self.end_flow(idx, Outcome::OpenAtEnd, true);
            }
        }
        Ok(())
    }
}

impl feed::Consumer for Engine<'_> {
    type Error = TransparentError;
    const LIVE_WAIT: Duration = Duration::from_millis(5);

    fn cfg(&self) -> &CopyConfig {
        self.cfg
    }
    fn registry(&self) -> &mio::Registry {
        self.poll.registry()
    }
    fn report(&mut self) -> &mut CopyReport {
        &mut self.report
    }
    /// The client's ISN, for a SYN that carries it; the session opens with the tracker's event.
    fn frame(&mut self, frame: &[u8]) {
        if let Ok(s) = Segment::parse(frame) {
            if s.flags.0 & (Flags::SYN.0 | Flags::ACK.0) == Flags::SYN.0
                && self.server_ports.contains(&s.dst.port())
            {
                if self.syn_isn.len() >= MAX_PENDING_SYNS {
                    self.syn_isn.clear();
                }
                self.syn_isn.insert((s.src, s.dst), s.seq);
            }
        }
    }
    fn open_session(
        &mut self,
        id: SessionId,
        client: SocketAddr,
        server: SocketAddr,
        syn_seen: bool,
        now: u64,
    ) {
        let isn = self.syn_isn.remove(&(client, server));
        let Some(rule) = transfer::rule_for(&self.cfg.rules, server).copied() else {
            return;
        };
        let s = &mut self.report.sessions;
        s.seen += 1;
        if !syn_seen {
            s.joined_mid_stream += 1;
        }
        if !self
            .cfg
            .sampler
            .selects(client, server, now.saturating_sub(self.start_ns))
        {
            s.sampled_out += 1;
            return;
        }
        s.selected += 1;
        let ip = match &self.t.client_cidr {
            Some(c) => map_client(client.ip(), c),
            None => client.ip(),
        };
        // The client's own ISN when its SYN was seen; otherwise a handshake of our own, with
        // an ISN from the clock as a TCP stack picks one, salted per process.
        let isn = match isn {
            Some(i) => i,
            None => {
                self.ts.synthesized_handshakes += u64::from(self.cfg.copies);
                ((now >> 6) as u32 ^ (u32::from(client.port()) << 16)).wrapping_add(self.isn_salt)
            }
        };
        let mut flows = Vec::with_capacity(self.cfg.copies as usize);
        for k in 0..self.cfg.copies {
            let Some(port) = self.pick_port(ip, client.port(), rule.target, k == 0) else {
                self.ts.ports_exhausted += 1;
                self.report.sessions.copies += 1;
                self.report.sessions.failed.shed += 1;
                continue;
            };
            let idx = self.new_flow(SocketAddr::new(ip, port), rule.target, isn, now);
            flows.push((idx, self.gens[idx]));
            if let (Some(d), Some(f)) = (self.differ.as_ref(), self.flows[idx].as_mut()) {
                f.diff = Some(Box::new(d.conn(ConnMeta {
                    session: id.0,
                    copy: k + 1,
                    client,
                    server,
                    target: rule.target,
                })));
            }
        }
        self.sessions.insert(
            id,
            Sess {
                flows: flows.clone(),
                turns: Turns::new(syn_seen, self.differ.as_ref()),
            },
        );
        for (idx, _) in flows {
            self.pump(idx, now);
        }
    }
    fn session_data(
        &mut self,
        id: SessionId,
        dir: Dir,
        bytes: &Bytes,
        ts: u64,
        now: u64,
        tracker_mem: u64,
    ) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        match dir {
            Dir::ServerToClient => {
                if let Some(lat) = s.turns.server(bytes, ts) {
                    self.orig.record(lat);
                }
            }
            Dir::ClientToServer => {
                let (start, answer) =
                    match s
                        .turns
                        .client(bytes, ts, self.max_think_ns, self.differ.as_ref())
                    {
                        ClientBytes::Skipped => {
                            self.report.requests.bytes_skipped_joining += bytes.len() as u64;
                            return;
                        }
                        ClientBytes::Copy { start, answer } => (start, answer),
                    };
                if start.is_some() {
                    self.report.requests.at_source += s.flows.len() as u64;
                }
                let data = Bytes::copy_from_slice(bytes);
                let flows = s.flows.clone();
                let diff_held = self.differ.as_ref().map_or(0, Differ::held_bytes);
                if self.held + data.len() * flows.len() + tracker_mem as usize + diff_held
                    > self.cfg.max_memory
                {
                    if let Some(s) = self.sessions.remove(&id) {
                        for (idx, gen) in s.flows {
                            if self.flow_mut(idx, gen).is_some() {
                                self.end_flow(idx, Outcome::Shed, true);
                            }
                        }
                    }
                    return;
                }
                for (idx, gen) in flows {
                    if let Some(f) = self.flow_mut(idx, gen) {
                        if let Some(d) = f.diff.as_mut() {
                            if let Some((k, r)) = &answer {
                                d.original(*k, Rc::clone(r));
                            }
                            if start.is_some() {
                                d.request_queued(&data);
                            }
                        }
                        f.queue.push_back(Item::Data {
                            bytes: data.clone(),
                            start,
                        });
                        f.held += data.len();
                        self.held += data.len();
                        self.pump(idx, now);
                    }
                }
                let peak = (self.held + diff_held) as u64 + tracker_mem;
                let m = &mut self.report.memory;
                m.peak_held_bytes = m.peak_held_bytes.max(peak);
            }
        }
    }
    fn session_gap(&mut self, id: SessionId, dir: Dir, len: u64, ts: u64) {
        if let (Some(s), Dir::ServerToClient) = (self.sessions.get_mut(&id), dir) {
            s.turns.server_gap(len, ts);
        }
    }
    fn close_session(&mut self, id: SessionId, how: CloseKind, requests_seen: u64, now: u64) {
        let Some(s) = self.sessions.remove(&id) else {
            return;
        };
        if matches!(how, CloseKind::LostData { .. }) {
            self.report.requests.at_source +=
                s.turns.unreplayed(requests_seen) * s.flows.len() as u64;
        }
        if matches!(how, CloseKind::Shed) {
            for (idx, gen) in s.flows {
                if self.flow_mut(idx, gen).is_some() {
                    self.end_flow(idx, Outcome::Shed, true);
                }
            }
            return;
        }
        let lost = matches!(how, CloseKind::LostData { .. });
        let (wait_answer, answer) = s.turns.close();
        for (idx, gen) in s.flows {
            if let Some(f) = self.flow_mut(idx, gen) {
                if let (Some(d), Some((k, r))) = (f.diff.as_mut(), &answer) {
                    d.original(*k, Rc::clone(r));
                }
                f.queue.push_back(Item::End { wait_answer, lost });
                self.pump(idx, now);
            }
        }
    }
    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), TransparentError> {
        Engine::step(self, events, max_wait)
    }
    fn publish(&self, live: &CopyCounters) {
        Engine::publish(self, live);
    }
}

/// Runs transparent mode on `input` (a live capture or a capture file at its pace) until it
/// ends, `stop` is set or `duration` passes; then lets the copies finish and returns the
/// report. Fails at start when intercept is unreachable or refuses, or a raw socket cannot be
/// opened (root or CAP_NET_RAW).
pub fn run(
    cfg: &CopyConfig,
    t: &TransparentConfig,
    input: &Input,
    duration: Option<Duration>,
    stop: &AtomicBool,
    live: &CopyCounters,
) -> Result<CopyReport, TransparentError> {
    let start = now_ns();
    let differ = cfg
        .diff
        .clone()
        .map(Differ::new)
        .transpose()
        .map_err(io_err("create the --diff-out file"))?;
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
    let (speed, max_think_ns) = feed::pace(input);
    let mut e = Engine {
        cfg,
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
        },
        sessions: FxHashMap::default(),
        flows: Vec::new(),
        gens: Vec::new(),
        free: Vec::new(),
        by_tuple: FxHashMap::default(),
        timers: BinaryHeap::new(),
        backoff: Backoff::default(),
        pool: PortPool::new(t.port_pool),
        syn_isn: FxHashMap::default(),
        // std seeds each RandomState from the OS's randomness: a salt per process.
        isn_salt: std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            0u8,
        ) as u32,
        start_ns: start,
        held: 0,
        open: 0,
        pkt: Vec::with_capacity(2048),
        report: CopyReport::default(),
        ts: TransparentStats {
            intercept: t.intercept.to_string(),
            client_addr: t
                .client_cidr
                .map(|c| format!("{}/{}", c.addr(), c.prefix()))
                .unwrap_or_default(),
            ..TransparentStats::default()
        },
        orig: Histogram::new(),
        target_lat: Histogram::new(),
        server_ports: transfer::server_ports(&cfg.rules),
        speed,
        max_think_ns,
        differ,
    };
    let end_at = duration.map(|d| start + d.as_nanos() as u64);
    let mut events = Events::with_capacity(1024);
    feed::run(&mut e, input, end_at, stop, live, &mut events)?;
    let stopped = feed::stopped(stop, end_at);
    e.drain(&mut events, stop, live, stopped)?;
    e.publish(live);
    let mut r = std::mem::take(&mut e.report);
    r.mode = "transparent".into();
    r.rules = cfg.rules.iter().map(ToString::to_string).collect();
    r.copies_per_session = cfg.copies;
    r.sample_percent = cfg.sampler.percent;
    r.seconds = (now_ns() - start) as f64 / 1e9;
    r.latency.original = e.orig.percentiles();
    r.latency.target = e.target_lat.percentiles();
    r.memory.limit_bytes = cfg.max_memory as u64;
    r.transparent = Some(std::mem::take(&mut e.ts));
    r.diff = e.differ.as_mut().map(Differ::finish);
    r.requests.max_loss_percent = cfg.max_loss_percent;
    r.finish();
    Ok(r)
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
