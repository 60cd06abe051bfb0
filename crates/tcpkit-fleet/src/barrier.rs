//! The controller (`tcpkit barrier`): one mio loop over its listener and its peers. It admits
//! at most `agents` authenticated agents, one per shard, plus [`PENDING_MAX`] handshakes in
//! progress (more are closed at once); a peer that has not proved the key within
//! [`HANDSHAKE_DEADLINE`] of its connect, sends a frame that does not parse, or stops reading
//! is dropped; a wrong key is closed without a word and counted. Once every agent is ready it
//! gives one start instant ([`crate::LEAD_MIN`] plus twice the largest round trip ahead);
//! an agent that says it cannot get ready, is not ready by `--ready-timeout`, or is lost
//! (closed, or silent for its `lost_after`) before its run ended fails the fleet run:
//! every other agent is told to stop, with the reason naming it.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use serde::Serialize;
use tcpkit_keyfile::proof::{Key, Nonce};
use tcpkit_stats::{Report, Verdict};

use crate::clock::wall_ns;
use crate::wire::{Msg, Shard, HDR, MAX_BODY, RUN_ID_LEN, VERSION};
use crate::{auth, hex, BEAT, LEAD_MIN};

/// Handshakes in progress at once (connections not yet admitted as agents).
pub const PENDING_MAX: usize = 8;
/// From connect to a proved key.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(3);
/// Bytes queued to one peer before it counts as not reading.
const WBUF_MAX: usize = 64 * 1024;
/// Wrong keys said on stderr one by one; past this, only counted.
const SAY_AUTH_MAX: u64 = 5;
/// After a failure, how long the Stop frames get to leave and the agents' Done to arrive.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long a refused peer's last words (its Refuse) get to leave before its socket closes.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// The loop's longest sleep: deadlines and beats are checked this often.
const TICK: Duration = Duration::from_millis(20);

/// What `tcpkit barrier` was asked.
#[derive(Debug, Clone)]
pub struct BarrierConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// How many agents make the fleet run.
    pub agents: u32,
    /// The key agents prove.
    pub key: Key,
    /// From the barrier's start to every agent ready.
    pub ready_timeout: Duration,
    /// An agent not heard for this long is lost; told to the agents in the welcome, so they
    /// find the barrier lost after the same silence ([`crate::LOST_AFTER`] by default).
    pub lost_after: Duration,
}

/// Why the barrier could not run.
#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    /// The listening socket.
    #[error("listen on {addr}")]
    Listen {
        /// The address asked.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The event loop.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// One agent of the fleet run, as the barrier saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AgentEntry {
    /// The shard it claimed (or its slot K/N when it claimed none, marked by `claimed`).
    pub shard: Shard,
    /// Whether it claimed its shard (`--shard`), or took the slot free when it joined.
    pub claimed: bool,
    /// Its host name, as it said.
    pub host: Option<String>,
    /// The address it connected from.
    pub address: Option<String>,
    /// When it joined (barrier clock, Unix ns).
    pub joined_unix_ns: Option<u64>,
    /// When it said ready (barrier clock).
    pub ready_unix_ns: Option<u64>,
    /// Its clock minus the barrier's.
    pub clock_offset_ns: Option<i64>,
    /// The round trip the offset came from (half of it bounds the offset's error).
    pub offset_rtt_ns: Option<u64>,
    /// The start instant on its clock.
    pub intended_start_unix_ns: Option<u64>,
    /// When its first query or frame went out (its clock), from its Done.
    pub actual_start_unix_ns: Option<u64>,
    /// `done`, `lost`, `not_ready`, `never_joined` or `stopped` (told to stop after another
    /// agent failed, and not heard ending since).
    pub outcome: &'static str,
    /// Why, for every outcome but `done`.
    pub why: Option<String>,
    /// Its own run's failure, as its Done said (its report has the rest).
    pub failure: Option<String>,
}

/// A connection refused after it proved the key (a shard taken, a fleet of another size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The address it connected from.
    pub address: String,
    /// The shard it claimed.
    pub shard: Option<Shard>,
    /// Its host name.
    pub host: String,
    /// Why it was refused (sent to it too).
    pub why: String,
    /// `refused`.
    pub outcome: &'static str,
}

/// `tcpkit barrier --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BarrierReport {
    /// Bumped when a field changes meaning.
    pub schema_version: u32,
    /// The fleet run's id (hex), the `fleet.run_id` of every agent's report.
    pub run_id: String,
    /// The address listened on.
    pub listen: String,
    /// Agents asked (`--agents`).
    pub agents_expected: u32,
    /// `--ready-timeout` in seconds.
    pub ready_timeout_seconds: f64,
    /// When the barrier began listening (its clock).
    pub began_unix_ns: u64,
    /// When the last agent said ready (its clock).
    pub all_ready_unix_ns: Option<u64>,
    /// The start instant given (its clock).
    pub start_unix_ns: Option<u64>,
    /// The start's lead over the moment it was given.
    pub lead_ns: Option<u64>,
    /// The agents' actual starts laid on the barrier's clock (each minus its offset): the
    /// latest minus the earliest, over the agents that said when they started.
    pub start_spread_ns: Option<u64>,
    /// The largest offset error bound (half the largest offset round trip).
    pub offset_error_bound_ns: Option<u64>,
    /// One entry per agent slot, shard order.
    pub agents: Vec<AgentEntry>,
    /// Connections refused after proving the key.
    pub refused: Vec<Refusal>,
    /// Connections whose proof was not of the key (closed without a word).
    pub auth_failures: u64,
    /// Connections dropped otherwise: over the handshake cap, no proof within the deadline,
    /// a frame that does not parse, not reading.
    pub dropped: u64,
    /// Why the fleet run failed (exit 1), or null.
    pub failure: Option<String>,
}

/// The barrier report's schema version.
pub const BARRIER_SCHEMA_VERSION: u32 = 1;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn rfc3339(ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_nanos(ns);
    humantime::format_rfc3339_millis(t).to_string()
}

impl Report for BarrierReport {
    fn human(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "fleet run {}: {} agents, listening on {}",
            self.run_id, self.agents_expected, self.listen
        );
        if let (Some(at), Some(lead)) = (self.start_unix_ns, self.lead_ns) {
            let _ = writeln!(s, "start at {} (lead {:.1} ms)", rfc3339(at), ms(lead));
        }
        if let Some(sp) = self.start_spread_ns {
            let _ = writeln!(
                s,
                "actual starts within {:.3} ms of each other (offsets known to {:.3} ms)",
                ms(sp),
                ms(self.offset_error_bound_ns.unwrap_or(0))
            );
        }
        for a in &self.agents {
            let _ = writeln!(
                s,
                "  shard {:<7} {:<20} {:<22} offset {:>9.3} ms (rtt {:.3} ms)  {}{}",
                a.shard.to_string(),
                a.host.as_deref().unwrap_or("-"),
                a.address.as_deref().unwrap_or("-"),
                a.clock_offset_ns.map_or(0.0, |o| o as f64 / 1e6),
                ms(a.offset_rtt_ns.unwrap_or(0)),
                a.outcome,
                a.why
                    .as_deref()
                    .or(a.failure.as_deref())
                    .map(|w| format!(": {w}"))
                    .unwrap_or_default()
            );
        }
        for r in &self.refused {
            let _ = writeln!(s, "  refused {} ({}): {}", r.address, r.host, r.why);
        }
        if self.auth_failures + self.dropped > 0 {
            let _ = writeln!(
                s,
                "{} wrong keys, {} connections dropped",
                self.auth_failures, self.dropped
            );
        }
        s
    }

    fn json(&self) -> String {
        tcpkit_stats::to_json(self)
    }

    fn verdict(&self) -> Verdict {
        Verdict::from_failure(self.failure.as_deref())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    AwaitHello,
    AwaitJoin,
    Agent(usize),
    /// Refused or failed: its last frames leave, then it is closed.
    Closing,
}

#[derive(Debug)]
struct Conn {
    sock: TcpStream,
    addr: SocketAddr,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    st: St,
    opened: Instant,
    heard: Instant,
    nonce: Nonce,
    agent_nonce: Nonce,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Joined,
    Ready,
    Running,
    Ended,
}

/// The controller's state.
struct Barrier<'a> {
    cfg: &'a BarrierConfig,
    say: &'a dyn Fn(&str),
    run_id: [u8; RUN_ID_LEN],
    slots: Vec<Slot>,
    report: BarrierReport,
    conns: Vec<Option<Conn>>,
    started: bool,
    failed_at: Option<Instant>,
}

const LISTENER: Token = Token(usize::MAX);

/// Runs the barrier until every agent has ended its run (the report's `failure` is None), or
/// the fleet run fails, or `stop` is set. `say` gets the lines for stderr (without the
/// program's prefix): the start, each wrong key (the first few), each refusal.
pub fn run(
    cfg: &BarrierConfig,
    stop: &AtomicBool,
    say: &dyn Fn(&str),
) -> Result<BarrierReport, BarrierError> {
    let mut listener = TcpListener::bind(cfg.listen).map_err(|source| BarrierError::Listen {
        addr: cfg.listen,
        source,
    })?;
    let io = |what: &'static str| move |source| BarrierError::Io { what, source };
    let mut poll = Poll::new().map_err(io("epoll_create"))?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(io("epoll_ctl"))?;
    let run_id = tcpkit_keyfile::proof::nonce().map_err(io("draw the fleet run's id"))?;
    let n = cfg.agents as usize;
    let began = Instant::now();
    let mut b = Barrier {
        cfg,
        say,
        run_id,
        slots: vec![Slot::Free; n],
        report: BarrierReport {
            schema_version: BARRIER_SCHEMA_VERSION,
            run_id: hex(&run_id),
            listen: listener
                .local_addr()
                .map_or_else(|_| cfg.listen.to_string(), |a| a.to_string()),
            agents_expected: cfg.agents,
            ready_timeout_seconds: cfg.ready_timeout.as_secs_f64(),
            began_unix_ns: wall_ns(),
            all_ready_unix_ns: None,
            start_unix_ns: None,
            lead_ns: None,
            start_spread_ns: None,
            offset_error_bound_ns: None,
            agents: (0..n)
                .map(|k| AgentEntry {
                    shard: Shard {
                        index: k as u32 + 1,
                        count: cfg.agents,
                    },
                    outcome: "never_joined",
                    ..AgentEntry::default()
                })
                .collect(),
            refused: Vec::new(),
            auth_failures: 0,
            dropped: 0,
            failure: None,
        },
        conns: Vec::new(),
        started: false,
        failed_at: None,
    };
    let mut events = Events::with_capacity(64);
    let mut next_beat = Instant::now() + BEAT;
    loop {
        if let Err(e) = poll.poll(&mut events, Some(TICK)) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(BarrierError::Io {
                    what: "epoll_wait",
                    source: e,
                });
            }
        }
        for ev in events.iter() {
            if ev.token() != LISTENER {
                b.serve(&poll, ev.token().0);
            }
        }
        // Every tick, not only on an event: an accept that failed (out of descriptors) is
        // tried again, and the listener's edge is not lost.
        b.accept(&poll, &listener);
        let now = Instant::now();
        if now >= next_beat {
            next_beat = now + BEAT;
            b.beat();
        }
        b.check_deadlines(now, began);
        if stop.load(Ordering::Relaxed) && b.report.failure.is_none() {
            b.fail(None, "interrupted".into());
        }
        // What this tick queued (beats, the start, stops) leaves now: a writable edge
        // comes only when a full socket drains.
        for i in 0..b.conns.len() {
            b.flush(&poll, i);
        }
        if let Some(at) = b.failed_at {
            let quiet = b
                .conns
                .iter()
                .flatten()
                .all(|c| c.wbuf.is_empty() && c.st != St::AwaitJoin);
            let all_done = b
                .slots
                .iter()
                .all(|s| matches!(s, Slot::Ended | Slot::Free));
            if now >= at + STOP_GRACE || (quiet && all_done) {
                break;
            }
        } else if b.started && b.slots.iter().all(|s| *s == Slot::Ended) {
            break;
        }
    }
    b.finish();
    Ok(b.report)
}

impl Barrier<'_> {
    fn accept(&mut self, poll: &Poll, listener: &TcpListener) {
        loop {
            let (mut sock, addr) = match listener.accept() {
                Ok(x) => x,
                // WouldBlock: all taken; EMFILE and the like: tried again next tick.
                Err(_) => return,
            };
            let pending = self
                .conns
                .iter()
                .flatten()
                .filter(|c| matches!(c.st, St::AwaitHello | St::AwaitJoin | St::Closing))
                .count();
            let nonce = match tcpkit_keyfile::proof::nonce() {
                Ok(n) if pending < PENDING_MAX => n,
                // Over the cap (or no randomness): closed at once, counted.
                _ => {
                    self.report.dropped += 1;
                    continue;
                }
            };
            let i = match self.conns.iter().position(Option::is_none) {
                Some(i) => i,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            if poll
                .registry()
                .register(&mut sock, Token(i), Interest::READABLE | Interest::WRITABLE)
                .is_err()
            {
                self.report.dropped += 1;
                continue;
            }
            let _ = sock.set_nodelay(true);
            let now = Instant::now();
            self.conns[i] = Some(Conn {
                sock,
                addr,
                rbuf: Vec::with_capacity(HDR + MAX_BODY),
                wbuf: Vec::new(),
                st: St::AwaitHello,
                opened: now,
                heard: now,
                nonce,
                agent_nonce: [0; 16],
            });
        }
    }

    /// Reads what `conns[i]` sent, answers it, writes what is queued. Reads until the socket
    /// would block: the poll is edge-triggered, so bytes left unread wait for the next event
    /// on the socket (the next beat either way, or the writable edge after our next write).
    /// The buffer stays bounded anyway: each chunk's whole frames are taken before the next
    /// read, so at most one partial frame is kept.
    fn serve(&mut self, poll: &Poll, i: usize) {
        let mut buf = [0u8; 4096];
        let gone = loop {
            let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
                return;
            };
            match c.sock.read(&mut buf) {
                Ok(0) => break Some("its connection closed"),
                Ok(n) => {
                    let t2 = wall_ns();
                    c.heard = Instant::now();
                    c.rbuf.extend_from_slice(&buf[..n]);
                    self.take_frames(i, t2);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Some("its connection was reset"),
            }
        };
        if let Some(why) = gone {
            self.close(poll, i, why);
            return;
        }
        self.flush(poll, i);
    }

    fn take_frames(&mut self, i: usize, t2: u64) {
        loop {
            let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
                return;
            };
            let mut rbuf = std::mem::take(&mut c.rbuf);
            let used = match Msg::parse(&rbuf) {
                Ok(Some((m, used))) => {
                    self.on_msg(i, m, t2);
                    used
                }
                Ok(None) => {
                    if let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) {
                        c.rbuf = rbuf;
                    }
                    return;
                }
                Err(e) => {
                    self.drop_peer(i, &format!("sent a frame that does not parse: {e}"));
                    return;
                }
            };
            if let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) {
                rbuf.drain(..used);
                c.rbuf = rbuf;
            }
        }
    }

    fn send(&mut self, i: usize, m: &Msg<'_>) {
        if let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) {
            if c.wbuf.len() + m.buffer_len() > WBUF_MAX {
                // Not reading: it will be found lost or dropped.
                return;
            }
            m.emit(&mut c.wbuf);
        }
    }

    fn on_msg(&mut self, i: usize, m: Msg<'_>, t2: u64) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        match (c.st, m) {
            (St::AwaitHello, Msg::Hello { version, nonce }) => {
                if version != VERSION {
                    let why = format!(
                        "speaks barrier protocol version {version}, this barrier {VERSION}: run one tcpkit version on every host"
                    );
                    c.st = St::Closing;
                    self.send(i, &Msg::Refuse { reason: &why });
                    return;
                }
                c.agent_nonce = nonce;
                c.st = St::AwaitJoin;
                let proof = auth::barrier_proof(&self.cfg.key, &nonce, &c.nonce);
                let nonce = c.nonce;
                self.send(i, &Msg::Challenge { nonce, proof });
            }
            (St::AwaitJoin, Msg::Join { proof, shard, host }) => {
                if !auth::verify_agent(&self.cfg.key, &c.agent_nonce, &c.nonce, shard, host, &proof)
                {
                    self.report.auth_failures += 1;
                    if self.report.auth_failures <= SAY_AUTH_MAX {
                        (self.say)(&format!(
                            "{}: its proof is not of --key-file's key: closed",
                            c.addr
                        ));
                    }
                    c.st = St::Closing;
                    c.wbuf.clear();
                    return;
                }
                self.admit(i, shard, host);
            }
            (St::Agent(k), m) => self.on_agent_msg(i, k, m, t2),
            (St::Closing, _) => {}
            (_, m) => {
                let what = format!("sent {m:?} before proving the key");
                self.drop_peer(i, &what);
            }
        }
    }

    fn admit(&mut self, i: usize, shard: Option<Shard>, host: &str) {
        let n = self.cfg.agents;
        let slot = match shard {
            Some(s) if s.count != n => Err(format!(
                "claims shard {s}, and this fleet run has {n} agents: give every agent --shard K/{n}"
            )),
            Some(s) => {
                let k = s.index as usize - 1;
                if self.slots[k] == Slot::Free {
                    Ok(k)
                } else {
                    let e = &self.report.agents[k];
                    Err(format!(
                        "shard {s} is taken by {} ({}): an agent is never counted twice",
                        e.host.as_deref().unwrap_or("?"),
                        e.address.as_deref().unwrap_or("?")
                    ))
                }
            }
            None => self
                .slots
                .iter()
                .position(|s| *s == Slot::Free)
                .ok_or_else(|| format!("all {n} agents of this fleet run have joined")),
        };
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let addr = c.addr.to_string();
        match slot {
            Err(why) => {
                c.st = St::Closing;
                (self.say)(&format!("{addr} ({host}): refused: {why}"));
                self.report.refused.push(Refusal {
                    address: addr,
                    shard,
                    host: host.to_string(),
                    why: why.clone(),
                    outcome: "refused",
                });
                self.send(i, &Msg::Refuse { reason: &why });
            }
            Ok(k) if self.report.failure.is_some() => {
                let _ = k;
                c.st = St::Closing;
                let why = format!(
                    "the fleet run failed: {}",
                    self.report.failure.clone().unwrap_or_default()
                );
                self.send(i, &Msg::Refuse { reason: &why });
            }
            Ok(k) => {
                c.st = St::Agent(k);
                self.slots[k] = Slot::Joined;
                let e = &mut self.report.agents[k];
                e.claimed = shard.is_some();
                e.host = Some(host.to_string());
                e.address = Some(addr);
                e.joined_unix_ns = Some(wall_ns());
                e.outcome = "joined";
                let run_id = self.run_id;
                let lost_after_ms =
                    u32::try_from(self.cfg.lost_after.as_millis()).unwrap_or(u32::MAX);
                self.send(
                    i,
                    &Msg::Welcome {
                        run_id,
                        agents: n,
                        lost_after_ms,
                    },
                );
                let joined = self.slots.iter().filter(|s| **s != Slot::Free).count();
                let name = self.name(k);
                let addr = self.report.agents[k].address.clone().unwrap_or_default();
                (self.say)(&format!("{name} joined from {addr} ({joined} of {n})"));
            }
        }
    }

    fn name(&self, k: usize) -> String {
        let e = &self.report.agents[k];
        let host = e.host.as_deref().unwrap_or("?");
        if e.claimed || e.host.is_none() {
            format!("shard {} on {host}", e.shard)
        } else {
            format!("agent {} of {} on {host}", e.shard.index, e.shard.count)
        }
    }

    fn on_agent_msg(&mut self, i: usize, k: usize, m: Msg<'_>, t2: u64) {
        match m {
            Msg::Beat => {}
            Msg::TimeReq { t1 } => {
                let t3 = wall_ns();
                self.send(i, &Msg::TimeResp { t1, t2, t3 });
            }
            Msg::Ready { offset_ns, rtt_ns } if self.slots[k] == Slot::Joined => {
                self.slots[k] = Slot::Ready;
                let e = &mut self.report.agents[k];
                e.ready_unix_ns = Some(wall_ns());
                e.clock_offset_ns = Some(offset_ns);
                e.offset_rtt_ns = Some(rtt_ns);
                e.outcome = "ready";
                self.maybe_start();
            }
            Msg::NotReady { why } if self.slots[k] != Slot::Ended => {
                // After the start, an agent that cannot go on (a worker process lost, say).
                let running = self.slots[k] == Slot::Running;
                let e = &mut self.report.agents[k];
                e.outcome = if running { "lost" } else { "not_ready" };
                e.why = Some(why.to_string());
                self.slots[k] = Slot::Ended;
                let name = self.name(k);
                let what = if running {
                    "cannot go on"
                } else {
                    "cannot get ready"
                };
                self.fail(Some(k), format!("{name}: {what}: {why}"));
            }
            Msg::Done { failure, .. } if matches!(self.slots[k], Slot::Joined | Slot::Ready) => {
                let why = format!(
                    "ended before the start ({})",
                    failure.unwrap_or("no failure given")
                );
                self.lose(k, &why);
            }
            Msg::Done {
                actual_start_ns,
                failure,
            } => {
                let e = &mut self.report.agents[k];
                if self.slots[k] != Slot::Ended {
                    if e.outcome != "stopped" {
                        e.outcome = "done";
                    }
                    e.failure = failure.map(str::to_string);
                    e.actual_start_unix_ns = (actual_start_ns != 0).then_some(actual_start_ns);
                    self.slots[k] = Slot::Ended;
                }
            }
            other => {
                let what = format!("sent {other:?} out of turn");
                self.lose(k, &what);
                self.drop_peer(i, &what);
            }
        }
    }

    fn maybe_start(&mut self) {
        if self.started
            || self.report.failure.is_some()
            || !self.slots.iter().all(|s| *s == Slot::Ready)
        {
            return;
        }
        let max_rtt = self
            .report
            .agents
            .iter()
            .filter_map(|a| a.offset_rtt_ns)
            .max()
            .unwrap_or(0);
        let lead = LEAD_MIN.as_nanos() as u64 + 2 * max_rtt;
        let now = wall_ns();
        let at = now + lead;
        self.report.all_ready_unix_ns = Some(now);
        self.report.start_unix_ns = Some(at);
        self.report.lead_ns = Some(lead);
        self.report.offset_error_bound_ns = Some(max_rtt / 2);
        self.started = true;
        for k in 0..self.slots.len() {
            self.slots[k] = Slot::Running;
            let e = &mut self.report.agents[k];
            e.outcome = "running";
            e.intended_start_unix_ns =
                Some(crate::clock::to_agent(at, e.clock_offset_ns.unwrap_or(0)));
        }
        for i in 0..self.conns.len() {
            if matches!(self.conns[i].as_ref().map(|c| c.st), Some(St::Agent(_))) {
                self.send(i, &Msg::Start { at_unix_ns: at });
            }
        }
        (self.say)(&format!(
            "all {} agents ready, start at {}",
            self.cfg.agents,
            rfc3339(at)
        ));
    }

    /// Agent `k` is lost (before its run ended): the fleet run fails, naming it.
    fn lose(&mut self, k: usize, why: &str) {
        if matches!(self.slots[k], Slot::Ended | Slot::Free) {
            return;
        }
        self.slots[k] = Slot::Ended;
        let e = &mut self.report.agents[k];
        let phase = match e.outcome {
            "running" => "mid-run",
            "ready" => "before the start",
            _ => "before it was ready",
        };
        e.outcome = "lost";
        let why = format!("{why} {phase}");
        e.why = Some(why.clone());
        let name = self.name(k);
        self.fail(Some(k), format!("{name}: lost: {why}"));
    }

    /// The fleet run fails: every other agent still running is told to stop, with `reason`.
    fn fail(&mut self, who: Option<usize>, reason: String) {
        if self.report.failure.is_some() {
            return;
        }
        let mut told = 0;
        for i in 0..self.conns.len() {
            let Some(St::Agent(k)) = self.conns[i].as_ref().map(|c| c.st) else {
                continue;
            };
            if Some(k) == who || self.slots[k] == Slot::Ended {
                continue;
            }
            self.send(i, &Msg::Stop { reason: &reason });
            let e = &mut self.report.agents[k];
            e.outcome = "stopped";
            e.why = Some(reason.clone());
            told += 1;
        }
        // Said as it happens; the same reason is the last line at exit.
        (self.say)(&format!("{reason}; {told} other agents told to stop"));
        self.report.failure = Some(reason);
        self.failed_at = Some(Instant::now());
    }

    fn beat(&mut self) {
        for i in 0..self.conns.len() {
            if matches!(self.conns[i].as_ref().map(|c| c.st), Some(St::Agent(_))) {
                self.send(i, &Msg::Beat);
            }
        }
    }

    fn check_deadlines(&mut self, now: Instant, began: Instant) {
        for i in 0..self.conns.len() {
            let Some(c) = self.conns[i].as_ref() else {
                continue;
            };
            match c.st {
                St::AwaitHello | St::AwaitJoin
                    if now.duration_since(c.opened) > HANDSHAKE_DEADLINE =>
                {
                    self.drop_peer(i, "did not prove the key in time");
                }
                St::Closing if c.wbuf.is_empty() || now.duration_since(c.opened) > CLOSE_GRACE => {
                    self.conns[i] = None;
                }
                St::Agent(k) if now.duration_since(c.heard) > self.cfg.lost_after => {
                    let why = format!("silent for {} ms", self.cfg.lost_after.as_millis());
                    self.lose(k, &why);
                    self.conns[i] = None;
                }
                _ => {}
            }
        }
        if !self.started
            && self.report.failure.is_none()
            && now.duration_since(began) > self.cfg.ready_timeout
        {
            let k = self
                .slots
                .iter()
                .position(|s| *s != Slot::Ready)
                .unwrap_or(0);
            let t = humantime::format_duration(self.cfg.ready_timeout);
            let (outcome, why) = if self.slots[k] == Slot::Free {
                (
                    "never_joined",
                    format!("never joined within --ready-timeout {t}"),
                )
            } else {
                ("not_ready", format!("not ready within --ready-timeout {t}"))
            };
            let e = &mut self.report.agents[k];
            e.outcome = outcome;
            e.why = Some(why.clone());
            let name = self.name(k);
            let waiting = self.slots.iter().filter(|s| **s != Slot::Ready).count();
            self.fail(
                Some(k),
                format!(
                    "{name}: {why} ({waiting} of {} agents not ready)",
                    self.cfg.agents
                ),
            );
            self.slots[k] = Slot::Ended;
        }
    }

    fn drop_peer(&mut self, i: usize, why: &str) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::take) else {
            return;
        };
        match c.st {
            St::Agent(k) => self.lose(k, why),
            _ => self.report.dropped += 1,
        }
    }

    fn close(&mut self, poll: &Poll, i: usize, why: &str) {
        if let Some(mut c) = self.conns.get_mut(i).and_then(Option::take) {
            let _ = poll.registry().deregister(&mut c.sock);
            match c.st {
                St::Agent(k) => self.lose(k, why),
                // Gone mid-handshake (an agent that found the key differs leaves here).
                St::AwaitHello | St::AwaitJoin => self.report.dropped += 1,
                St::Closing => {}
            }
        }
    }

    fn flush(&mut self, poll: &Poll, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        while !c.wbuf.is_empty() {
            match c.sock.write(&c.wbuf) {
                Ok(0) => break,
                Ok(n) => {
                    c.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close(poll, i, "its connection was reset");
                    return;
                }
            }
        }
    }

    fn finish(&mut self) {
        // Each agent's actual start on the barrier's clock.
        let starts: Vec<i128> = self
            .report
            .agents
            .iter()
            .filter_map(|a| {
                let at = a.actual_start_unix_ns?;
                Some(i128::from(at) - i128::from(a.clock_offset_ns.unwrap_or(0)))
            })
            .collect();
        if let (Some(lo), Some(hi)) = (starts.iter().min(), starts.iter().max()) {
            self.report.start_spread_ns = Some((hi - lo) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{Agent, AgentConfig};
    use std::io::{Read, Write};

    fn key() -> Key {
        Key::from_bytes(b"barrier-test-key-0123").unwrap()
    }

    /// Waits for the peer to close `s`; true if it did within `limit` having sent nothing.
    fn closed_silently(s: &mut std::net::TcpStream, limit: Duration) -> bool {
        s.set_read_timeout(Some(limit)).unwrap();
        let mut b = [0u8; 64];
        matches!(s.read(&mut b), Ok(0))
            || matches!(s.read(&mut b), Err(e) if e.kind() == io::ErrorKind::ConnectionReset)
    }

    /// Hostile peers neither stop nor slow the fleet run: past the handshake cap a connection
    /// is closed at once, a frame that does not parse closes its sender, and the one real
    /// agent still joins, starts and ends (exit 0), with each peer counted.
    #[test]
    fn bad_peers_are_dropped_and_counted_and_a_real_agent_still_runs() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let cfg = BarrierConfig {
            listen: addr,
            agents: 1,
            key: key(),
            ready_timeout: Duration::from_secs(10),
            lost_after: crate::LOST_AFTER,
        };
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let barrier = s.spawn(|| run(&cfg, &stop, &|_| {}));
            let connect = || loop {
                if let Ok(c) = std::net::TcpStream::connect(addr) {
                    return c;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            // PENDING_MAX silent handshakes hold their slots; the next is closed at once.
            let mut silent: Vec<_> = (0..PENDING_MAX).map(|_| connect()).collect();
            std::thread::sleep(Duration::from_millis(100));
            let mut over = connect();
            assert!(closed_silently(&mut over, Duration::from_secs(1)));
            // A frame whose header is refused closes its sender (a slot freed first).
            drop(silent.pop());
            std::thread::sleep(Duration::from_millis(100));
            let mut bad = connect();
            bad.write_all(&[0xFF, 0xFF, 0xFF, 1, 2, 3]).unwrap();
            assert!(closed_silently(&mut bad, Duration::from_secs(1)));
            drop(silent);
            std::thread::sleep(Duration::from_millis(100));
            // The real agent.
            let agent_stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
            let a = Agent::join(
                &AgentConfig {
                    barrier: addr.to_string(),
                    key: key(),
                    shard: Some(Shard { index: 1, count: 1 }),
                    host: "h".into(),
                    patience: Duration::from_secs(5),
                },
                agent_stop,
            )
            .unwrap();
            a.ready();
            let at = a.wait_start(agent_stop).expect("a start");
            crate::clock::wait_until_wall(at);
            a.done(crate::clock::wall_ns(), None);
            let r = barrier.join().unwrap().unwrap();
            assert_eq!(r.failure, None, "{r:#?}");
            assert_eq!(r.agents[0].outcome, "done");
            assert_eq!(r.auth_failures, 0);
            // The one over the cap, the bad frame, the silent ones that left.
            assert_eq!(r.dropped, 2 + PENDING_MAX as u64, "{r:#?}");
            let f = a.report(0);
            assert_eq!(f.run_id, r.run_id);
            assert!(f.offset_rtt_ns > 0 && f.offset_rtt_ns < 50_000_000, "{f:?}");
            assert!(f.stopped_by.is_none());
        });
    }
}
