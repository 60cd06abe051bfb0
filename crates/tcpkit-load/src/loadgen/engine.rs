//! One event-loop thread: its share of the connections (opened at a paced rate, retried,
//! reopened), its share of the rate (its own `ArrivalClock`, intended send times from the
//! common start), the answers (two HDR histograms: from the intended and from the actual send
//! time; the per-second counts and histograms, the report's intervals and `--hdr-log`'s, in
//! [`super::interval`]), timeouts, and what it counted.
//!
//! The loop is: send what is due, read what arrived, sweep for timeouts every few ms, and
//! sleep until the next due time in epoll_pwait2 (a timerfd on kernels before 5.11;
//! [`super::wake`]), so sends leave on time without a 1 ms epoll granularity. Queries never wait for answers (open loop); when no
//! connection can take a query, the schedule falls behind and the lag is measured.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};
use tcpkit_pace::{now_ns, TokenBucket};
use tcpkit_stats::{HdrLog, Histogram};

use super::config::Config;
use super::h2::{H2Conn, Outcome};
use super::interval::{Asked, Interval};
use super::perquery::{Kind as RecKind, Rec, Sink};
use super::profile::{ArrivalTimes, Lanes};
use super::proto::{Answer, BadAnswer, Pending, Proto, Rx, CODES, ECHOED};
use super::sock::{
    connect, connect_udp, errno_name, hint_bit, syn_was_resent, Sock, LATE_HINT, UNANSWERED_AT_END,
};
use super::wake::Wake;
use super::{LoadCounters, LoadError};
use crate::series::{IntervalRec, Tally};
use crate::tls_report::TlsTally;
use tcpkit_workers::share;

mod h2_answers;
mod handshake;

/// Queries in flight per connection at most: bounds memory, and keeps DNS IDs (16 bits)
/// unique among a connection's queries in flight.
const MAX_PENDING: usize = 1024;
/// Bytes waiting to be written per connection at most (the server is not reading).
const WBUF_MAX: usize = 256 << 10;
/// Queries sent in one go before reading again, so answers are timed promptly.
const SEND_BURST: usize = 256;
/// Queries-in-flight slots a connection keeps when its queue empties: reallocating the queue
/// for every query would be an allocation per query; freeing larger queues keeps idle
/// connections small.
const KEEP_PENDING: usize = 8;
/// Wait before retrying a failed connect.
const RETRY_DELAY_NS: u64 = 100_000_000;
/// Scratch read size: one read takes up to this much of a connection's answers.
const READ_CHUNK: usize = 64 << 10;
const TIMER: Token = Token(usize::MAX - 1);

/// The per-query line of query `p` on connection `conn` for an event at `at`.
#[inline]
fn rec_of(kind: RecKind, conn: u64, p: &Pending, at: u64) -> Rec {
    Rec {
        kind,
        conn,
        seq: p.seq,
        intended: p.intended,
        sent: p.sent,
        at,
    }
}

/// What every thread of this process shares (not Debug: it holds the hint callback).
pub(crate) struct Shared<'a> {
    pub cfg: &'a Config,
    pub proto: Proto,
    pub interrupt: &'a AtomicBool,
    pub live: &'a LoadCounters,
    /// Says a limit's hint (once per run, through `live`).
    pub hint: &'a (dyn Fn(&str) + Sync),
    pub threads: usize,
    /// Connections of this process, and the run-wide number of its first one.
    pub conns: u64,
    pub conn_offset: u64,
    /// Run-wide index of this process's first thread (seeds differ per thread).
    pub thread_offset: u64,
    /// This process's share of the asked rate.
    pub rate_share: f64,
    /// Threads done opening connections; the last one sets the common start.
    pub connected: AtomicUsize,
    /// CLOCK_MONOTONIC ns of the query phase's start; 0 until set.
    pub start: Arc<AtomicU64>,
    /// CLOCK_MONOTONIC ns when the whole run ends (`--duration` from the first connect, so
    /// that a host that never answers cannot stretch the run); `u64::MAX` without a duration.
    pub deadline: u64,
    /// In a worker process: set when all this process's threads are done opening; the
    /// parent then sets `start` for every worker at once (see `procs::release`), so the
    /// processes of one run share one query phase.
    pub ready: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Wall-clock ns of the same instant.
    pub wall_start: Arc<AtomicU64>,
    /// Connections open now in this process, and the most at once.
    pub open: Arc<AtomicU64>,
    pub peak_open: AtomicU64,
    pub hdr_log: Option<Mutex<HdrLog>>,
    /// When this process's first query went out (monotonic ns); `u64::MAX` until then.
    pub first_sent: AtomicU64,
    /// Why this process's first connect failed (errno name and text), for a fleet agent's
    /// "not ready" while its threads still hold their own counts.
    pub connect_failure: Arc<Mutex<Option<String>>>,
}

impl Shared<'_> {
    /// Which of this host's arrivals thread `t` of this process sends (and so its part of
    /// `-n`).
    pub(crate) fn lanes(&self, t: usize) -> Lanes {
        Lanes::of(
            self.cfg.connections,
            self.conn_offset,
            self.conns,
            self.threads as u64,
            t as u64,
            self.cfg.shard.unwrap_or(tcpkit_workers::Shard::WHOLE),
        )
    }
}

/// What one thread counted.
#[derive(Debug)]
pub(crate) struct ThreadOut {
    pub hist_intended: Histogram,
    pub hist_sent: Histogram,
    pub codes: Vec<u64>,
    pub errors: BTreeMap<&'static str, u64>,
    pub first_bad: Option<String>,
    pub first_connect_error: Option<String>,
    pub c: Counters,
    /// When this thread finished opening its connections (monotonic ns).
    pub connected_at: u64,
    /// Its seconds, `start_unix_ns` from the query phase's start.
    pub intervals: Vec<IntervalRec>,
    /// Its TLS handshakes (`--tls`).
    pub tls: Option<TlsTally>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub attempts: u64,
    pub established: u64,
    pub failed: u64,
    pub connect_timeouts: u64,
    pub retries: u64,
    pub closed_by_server: u64,
    pub reconnects: u64,
    /// Connects that succeeded only after the SYN was sent again.
    pub slow: u64,
    pub scheduled: u64,
    pub sent: u64,
    pub answered: u64,
    /// Answers that were the query sent back (included in `answered`).
    pub echoed: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub unanswered_at_end: u64,
    pub malformed: u64,
    pub unmatched: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub behind: u64,
    pub lag_max: u64,
    pub lag_end: u64,
    pub open_at_end: u64,
    /// When sending stopped (monotonic ns): the end of the query phase.
    pub stopped_at: u64,
    pub h2: H2Counters,
}

/// HTTP/2's own counts (the report's `http2`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct H2Counters {
    /// The most streams open at once on one connection.
    pub streams_max: u64,
    pub goaway: u64,
    pub rst_stream: u64,
    pub window_stalls: u64,
    /// Queries sent again on another connection because a GOAWAY said the server never
    /// processed them.
    pub retried: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for its (re)connect turn at `since`.
    Idle,
    Connecting,
    /// `--tls`: connected, the TLS handshake under way since `since`; takes no query yet.
    Handshaking,
    Open,
    /// Given up (retries spent while opening, or the run is ending).
    Dead,
}

/// One connection slot: ~130 bytes when idle; buffers and the queue of queries in flight are
/// allocated only while they hold something.
#[derive(Debug)]
struct Conn {
    sock: Option<Sock>,
    state: State,
    was_open: bool,
    /// Reached `--queries-per-conn`: no new queries; reopened once its answers are in.
    retiring: bool,
    retries: u16,
    seq: u32,
    on_conn: u64,
    /// Connect start (Connecting) or retry time (Idle), monotonic ns.
    since: u64,
    rx: Rx,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    pending: VecDeque<Pending>,
    /// HTTP/2's state of the connection (`--http2`, `--doh`), made when it opens.
    h2: Option<Box<H2Conn>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Waiting,
    Running,
    Draining { until: u64 },
}

enum Why<'e> {
    ByServer,
    Error(&'e io::Error),
    Bad(BadAnswer),
    /// Our decision (timeout of an in-order answer, `--queries-per-conn`, end of run).
    Ours,
}

struct Worker<'s, 'a> {
    sh: &'s Shared<'a>,
    t: usize,
    /// Run-wide number of this thread's connection 0; connection i is `base + i*stride`.
    base: u64,
    stride: u64,
    conns: Vec<Conn>,
    idle: VecDeque<u32>,
    bucket: TokenBucket,
    phase: Phase,
    start: u64,
    end: u64,
    arrivals: Option<ArrivalTimes>,
    next_due: u64,
    queries_left: Option<u64>,
    rr: usize,
    no_conn_until: u64,
    name_idx: usize,
    open: u64,
    hist_i: Histogram,
    hist_s: Histogram,
    /// The current second's counts and histograms (the report's intervals, `--hdr-log`).
    ival: Interval<'s>,
    codes: Vec<u64>,
    errors: BTreeMap<&'static str, u64>,
    first_bad: Option<String>,
    first_connect_error: Option<String>,
    c: Counters,
    sink: Option<Sink>,
    wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    answers: Vec<Answer>,
    connected_at: u64,
    sent_any: bool,
    tls: Option<TlsTally>,
    /// HTTP/2: what a read meant, and the queries a GOAWAY handed back (reused buffers).
    outcomes: Vec<Outcome>,
    handed_back: Vec<u32>,
    /// Queries a GOAWAY said were never processed, sent again first (with their intended
    /// times: the wait counts in their latency).
    retry: VecDeque<Pending>,
}

pub(crate) fn run_thread(
    sh: &Shared<'_>,
    t: usize,
    sink: Option<Sink>,
) -> Result<ThreadOut, LoadError> {
    let io_err = |what: &'static str| move |e: io::Error| LoadError::Io { what, source: e };
    let mut poll = Poll::new().map_err(io_err("epoll_create"))?;
    let mut wake = Wake::new().map_err(|e| LoadError::Io {
        what: "timerfd_create",
        source: e.into(),
    })?;
    let tfd = wake.raw_fd();
    poll.registry()
        .register(&mut SourceFd(&tfd), TIMER, Interest::READABLE)
        .map_err(io_err("epoll_ctl(timerfd)"))?;
    // SAFETY: PR_SET_TIMERSLACK takes one unsigned long and touches only this thread; on
    // failure wakeups are just less precise.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }

    let threads = sh.threads as u64;
    let n = share(sh.conns, threads, t as u64);
    let cfg = sh.cfg;
    // The thread's share of the host's connections is its share of --connect-rate (of every
    // process's: each process taking the whole rate would open N times too fast).
    let frac = if cfg.connections == 0 {
        0.0
    } else {
        n as f64 / cfg.connections as f64
    };
    let mut w = Worker {
        sh,
        t,
        base: sh.conn_offset + t as u64,
        stride: threads,
        conns: (0..n)
            .map(|_| Conn {
                sock: None,
                state: State::Idle,
                was_open: false,
                retiring: false,
                retries: 0,
                seq: 0,
                on_conn: 0,
                since: 0,
                rx: Rx::default(),
                rbuf: Vec::new(),
                wbuf: Vec::new(),
                pending: VecDeque::new(),
                h2: None,
            })
            .collect(),
        idle: (0..n as u32).collect(),
        bucket: TokenBucket::new((cfg.connect_rate * frac).max(1e-3), 1),
        phase: Phase::Connecting,
        start: 0,
        end: u64::MAX,
        arrivals: None,
        next_due: u64::MAX,
        queries_left: cfg.queries.map(|q| sh.lanes(t).taken(q)),
        rr: 0,
        no_conn_until: 0,
        name_idx: t,
        open: 0,
        hist_i: Histogram::new(),
        hist_s: Histogram::new(),
        ival: Interval::new(
            sh.hdr_log.as_ref(),
            (crate::series::MAX_INTERVALS / sh.threads.max(1)).max(64),
            crate::series::thread_budget(sh.threads),
        ),
        codes: vec![0; CODES],
        errors: BTreeMap::new(),
        first_bad: None,
        first_connect_error: None,
        c: Counters::default(),
        sink,
        wbuf: Vec::with_capacity(4096),
        rbuf: vec![0; READ_CHUNK],
        answers: Vec::with_capacity(256),
        connected_at: 0,
        sent_any: false,
        tls: cfg.tls.as_ref().map(|_| TlsTally::default()),
        outcomes: Vec::new(),
        handed_back: Vec::new(),
        retry: VecDeque::new(),
    };
    w.run(&mut poll, &mut wake);
    Ok(w.finish())
}

impl Worker<'_, '_> {
    fn key(&self, i: usize) -> u64 {
        self.base + i as u64 * self.stride
    }

    fn run(&mut self, poll: &mut Poll, wake: &mut Wake) {
        let sweep_every =
            (self.sh.cfg.timeout.as_nanos() as u64 / 20).clamp(10_000_000, 100_000_000);
        let mut next_sweep = 0u64;
        let mut next_settle_check = 0u64;
        loop {
            let mut now = now_ns();
            let past_deadline =
                now >= self.sh.deadline && matches!(self.phase, Phase::Connecting | Phase::Waiting);
            if past_deadline || self.sh.interrupt.load(Ordering::Relaxed) {
                match self.phase {
                    Phase::Running => self.stop_sending(now),
                    Phase::Draining { .. } => break,
                    _ => {
                        // Interrupted, or out of time, while opening: no query phase. Every
                        // thread sees the same flag and deadline, so none waits on another.
                        self.phase = Phase::Draining { until: now };
                        break;
                    }
                }
            }
            self.start_connects(now, poll);
            match self.phase {
                // A connection still queued to open means not settled (the queue's stale entries
                // were popped by start_connects); the full scan runs at most once per ms, since
                // with 50k connections per thread a scan per event would be quadratic.
                Phase::Connecting if self.idle.is_empty() && now >= next_settle_check => {
                    next_settle_check = now + 1_000_000;
                    let settled = self
                        .conns
                        .iter()
                        .all(|c| matches!(c.state, State::Open | State::Dead));
                    if settled {
                        self.connected_at = now;
                        self.phase = Phase::Waiting;
                        let done = self.sh.connected.fetch_add(1, Ordering::SeqCst) + 1;
                        if done == self.sh.threads {
                            if let Some(ready) = &self.sh.ready {
                                ready.store(true, Ordering::SeqCst);
                            } else {
                                // The last thread sets the common start, a little ahead so every
                                // thread sees it before its first send is due.
                                let wall = std::time::SystemTime::now()
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .map(|d| d.as_nanos() as u64)
                                    .unwrap_or(0);
                                self.sh.wall_start.store(wall + 2_000_000, Ordering::SeqCst);
                                self.sh.start.store(now + 2_000_000, Ordering::SeqCst);
                            }
                        }
                    }
                }
                Phase::Connecting => {}
                Phase::Waiting => {
                    let s = self.sh.start.load(Ordering::SeqCst);
                    if s != 0 {
                        self.begin(s);
                    }
                }
                Phase::Running => {
                    self.send_due(now);
                    now = now_ns();
                    let done = self.queries_left == Some(0);
                    if now >= self.end || done {
                        self.stop_sending(now);
                    }
                }
                Phase::Draining { until } => {
                    // Queries a GOAWAY handed back after the last one was sent are still the
                    // run's: sent again on a connection reopened for them (`reopens`).
                    if !self.retry.is_empty() && now >= self.no_conn_until {
                        self.resend(now);
                    }
                    let empty =
                        self.retry.is_empty() && self.conns.iter().all(|c| c.pending.is_empty());
                    if empty || now >= until {
                        break;
                    }
                }
            }
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + sweep_every;
            }
            // Sleep until the next thing is due.
            let mut deadline = next_sweep;
            if self.phase == Phase::Running {
                if self.next_due < self.no_conn_until {
                    deadline = deadline.min(self.no_conn_until);
                } else {
                    deadline = deadline.min(self.next_due);
                }
                deadline = deadline.min(self.end);
            }
            if let Phase::Draining { until } = self.phase {
                deadline = deadline.min(until);
            }
            if self.phase == Phase::Waiting {
                deadline = deadline.min(now + 500_000);
            }
            if self.phase == Phase::Connecting {
                deadline = deadline.min(next_settle_check.max(now + 1_000));
            }
            if matches!(self.phase, Phase::Connecting | Phase::Waiting) {
                deadline = deadline.min(self.sh.deadline);
            }
            if let Some(&i) = self.idle.front() {
                let c = &self.conns[i as usize];
                let at = c.since.max(now + self.bucket.time_until(now, 1));
                deadline = deadline.min(at);
            }
            let n = match wake.wait(poll.as_raw_fd(), deadline, now) {
                Ok(n) => n,
                Err(e) => {
                    if e.kind() != io::ErrorKind::Interrupted {
                        self.count_error("epoll_wait");
                    }
                    continue;
                }
            };
            let now = now_ns();
            for k in 0..n {
                let ev = wake.ready(k);
                if ev.token == TIMER.0 {
                    wake.fired(now);
                    continue;
                }
                let i = ev.token;
                if i >= self.conns.len() {
                    continue;
                }
                self.on_event(
                    i,
                    ev.readable || ev.read_closed || ev.error,
                    ev.writable || ev.error,
                    ev.read_closed || ev.error,
                    now,
                );
            }
        }
        // The end: whatever is still in flight is unanswered; close everything.
        let now = now_ns();
        if self.phase != Phase::Waiting && self.connected_at == 0 {
            self.connected_at = now;
        }
        // Connects still unanswered when the run ended (its --duration came first): as much
        // evidence as a connect timeout, and counted as failed so that attempts add up.
        let mut longest = 0;
        for c in &self.conns {
            if c.state == State::Connecting {
                self.c.failed += 1;
                *self.errors.entry(UNANSWERED_AT_END).or_insert(0) += 1;
                longest = longest.max(now.saturating_sub(c.since));
            }
        }
        if longest > 0 {
            let bit = hint_bit(
                UNANSWERED_AT_END,
                self.sh.peak_open.load(Ordering::Relaxed) > 0,
            );
            self.sh.live.give_hints(bit, self.sh.hint);
        }
        if longest > 0 && self.first_connect_error.is_none() {
            self.first_connect_error = Some(format!(
                "no answer within {:?} (still connecting when the run ended)",
                Duration::from_millis(longest / 1_000_000)
            ));
        }
        for i in 0..self.conns.len() {
            let at = now.saturating_sub(self.start);
            let key = self.key(i);
            let c = &mut self.conns[i];
            if c.state == State::Open {
                self.c.open_at_end += 1;
            }
            for p in c.pending.drain(..) {
                self.c.unanswered_at_end += 1;
                if let Some(s) = &mut self.sink {
                    s.push(rec_of(RecKind::Unanswered, key, &p, at));
                }
            }
            c.sock = None;
            if let Some(h) = c.h2.take() {
                Self::h2_tally(&mut self.c.h2, &h);
            }
        }
        // Handed back by a GOAWAY and not sent again before the end.
        self.c.unanswered_at_end += self.retry.len() as u64;
        self.retry.clear();
        self.publish();
    }

    fn begin(&mut self, start: u64) {
        let mut asked_clock = None;
        self.start = start;
        self.phase = Phase::Running;
        let cfg = self.sh.cfg;
        self.end = cfg
            .phase_length()
            .map(|d| start.saturating_add(d.as_nanos() as u64))
            .unwrap_or(u64::MAX)
            .min(self.sh.deadline);
        if let Some(profile) = &cfg.rate {
            let lanes = self.sh.lanes(self.t);
            let kind = match cfg.arrivals {
                super::config::ArrivalKind::Poisson { seed } => {
                    super::config::ArrivalKind::Poisson {
                        seed: seed
                            ^ (self.sh.thread_offset + self.t as u64 + 1)
                                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    }
                }
                k @ super::config::ArrivalKind::Constant => k,
            };
            if lanes.count > 0 {
                let mut a = ArrivalTimes::new(profile, kind, lanes);
                self.next_due = start.saturating_add(a.next_ns());
                self.arrivals = Some(a);
                // The same schedule again, counted per second as asked.
                let asked = ArrivalTimes::new(profile, kind, lanes);
                asked_clock = Some(Asked::new(asked, start, self.end, self.queries_left));
            }
        }
        self.ival.begin(start, asked_clock);
    }

    fn stop_sending(&mut self, now: u64) {
        if self.phase != Phase::Running {
            return;
        }
        // Queries due inside the phase but never sent: the client was behind. Bounded: at
        // most what the rate allows in the lag, counted once.
        let end = self.end.min(now);
        if let Some(a) = &mut self.arrivals {
            if self.queries_left != Some(0) {
                let mut behind = 0u64;
                let mut due = self.next_due;
                while due < end && behind < 100_000_000 {
                    behind += 1;
                    due = self.start.saturating_add(a.next_ns());
                }
                self.c.behind = behind;
                self.c.lag_end = end.saturating_sub(self.next_due);
            }
        }
        self.c.scheduled = self.c.sent + self.c.behind;
        self.c.stopped_at = now.min(self.end);
        self.phase = Phase::Draining {
            until: now + self.sh.cfg.timeout.as_nanos() as u64,
        };
        self.next_due = u64::MAX;
    }

    /// The running totals the intervals are cut from (asked is counted by the interval).
    fn tally(c: &Counters, errors: &BTreeMap<&'static str, u64>) -> Tally {
        Tally {
            asked: c.scheduled,
            sent: c.sent,
            answered: c.answered,
            errors: errors.values().sum(),
            timeouts: c.timeouts,
        }
    }

    /// Closes the second that ended by `now`, if one did.
    #[inline]
    fn tick(&mut self, now: u64) {
        let (c, e) = (&self.c, &self.errors);
        self.ival.tick(now, || Self::tally(c, e));
    }

    fn send_due(&mut self, now: u64) {
        self.tick(now);
        if !self.retry.is_empty() && now >= self.no_conn_until {
            self.resend(now);
        }
        let mut burst = 0;
        // A query belongs to the phase when it is due before its end, whenever the loop gets
        // to it: one due 0.3 ms before the end, reached 0.1 ms after it, is sent late (its lag
        // measured), not counted unsent. Counting it unsent failed short runs for one query
        // (43 of 44 sent, "asked rate not met") on a busy machine.
        while self.next_due <= now && self.next_due < self.end && burst < SEND_BURST {
            if self.queries_left == Some(0) {
                return;
            }
            if now < self.no_conn_until {
                break;
            }
            let Some(i) = self.pick() else {
                // No connection can take a query now: the schedule falls behind (measured).
                self.no_conn_until = now + 1_000_000;
                break;
            };
            // One write per query unless --coalesce asks for more: several queries in one
            // segment are not what a client sends, and they put two answers of a connection
            // in flight together, which with delayed ACKs leaves a server that writes small
            // answers with Nagle on (unbound) one answer behind for good (see `ack_now`; issue
            // 24: 5 ms medians where dnsperf saw 0.1-2 ms). A datagram is always one query.
            let batch = if self.sh.cfg.udp {
                1
            } else {
                self.sh.cfg.coalesce
            };
            burst += self.send_batch(i, now, (SEND_BURST - burst).min(batch));
        }
        let now = now_ns();
        if self.next_due <= now {
            let lag = now - self.next_due;
            self.c.lag_max = self.c.lag_max.max(lag);
            self.sh
                .live
                .slot(self.live_slot())
                .lag_ns
                .store(lag, Ordering::Relaxed);
        }
    }

    fn live_slot(&self) -> usize {
        self.t
    }

    /// The next connection, in turn, that can take a query.
    fn pick(&mut self) -> Option<usize> {
        let n = self.conns.len();
        for _ in 0..n {
            self.rr = (self.rr + 1) % n;
            let c = &self.conns[self.rr];
            if c.state == State::Open
                && !c.retiring
                && c.pending.len() < MAX_PENDING
                && c.wbuf.len() < WBUF_MAX
                && c.h2.as_ref().is_none_or(|h| h.can_open(self.h2_limit()))
            {
                return Some(self.rr);
            }
        }
        None
    }

    /// Writes the queries due by `now` (at most `max`: 1 unless `--coalesce`) on connection
    /// `i`, in one write. Each keeps its own intended time; they share the actual send time.
    /// Returns the number taken from the schedule (those of a failed write count as lost).
    fn send_batch(&mut self, i: usize, now: u64, max: usize) -> usize {
        let key = self.key(i);
        let sent_at = now_ns();
        let sent = sent_at.saturating_sub(self.start);
        self.wbuf.clear();
        let mut n = 0;
        {
            let h2_limit = self.h2_limit();
            let c = &mut self.conns[i];
            let per_conn = self.sh.cfg.queries_per_conn;
            while n < max
                && self.next_due <= now
                && self.queries_left != Some(0)
                && c.pending.len() < MAX_PENDING
                && !c.retiring
                && c.h2.as_ref().is_none_or(|h| h.can_open(h2_limit))
            {
                let seq = c.seq;
                match (c.h2.as_mut(), &self.sh.proto.h2) {
                    (Some(h), Some(proto)) => {
                        proto.write(h, &mut self.wbuf, seq, self.name_idx);
                    }
                    _ => self
                        .sh
                        .proto
                        .write_query(&mut self.wbuf, key, seq, self.name_idx),
                }
                self.name_idx = self.name_idx.wrapping_add(self.sh.threads);
                let intended = self.next_due.saturating_sub(self.start);
                c.pending.push_back(Pending {
                    seq,
                    intended,
                    sent,
                });
                c.seq = c.seq.wrapping_add(1);
                c.on_conn += 1;
                if per_conn.is_some_and(|k| c.on_conn >= k) {
                    c.retiring = true;
                }
                if let Some(q) = &mut self.queries_left {
                    *q -= 1;
                }
                if let Some(s) = &mut self.sink {
                    s.push(Rec {
                        kind: RecKind::Query,
                        conn: key,
                        seq,
                        intended,
                        sent,
                        at: sent,
                    });
                }
                n += 1;
                self.next_due = match &mut self.arrivals {
                    Some(a) => self.start.saturating_add(a.next_ns()),
                    None => u64::MAX,
                };
            }
        }
        if n == 0 {
            return 0;
        }
        if !self.sent_any {
            // The fleet report's actual start: the first query this process put out.
            self.sent_any = true;
            self.sh.first_sent.fetch_min(sent_at, Ordering::SeqCst);
        }
        self.c.sent += n as u64;
        self.put(i, sent_at);
        n
    }

    /// Writes the worker's `wbuf` (queries just taken) on connection `i`, or queues it.
    fn put(&mut self, i: usize, sent_at: u64) {
        let len = self.wbuf.len();
        self.c.bytes_sent += len as u64;
        let c = &mut self.conns[i];
        let Some(sock) = c.sock.as_mut() else {
            return;
        };
        if sock.is_udp() {
            // One query per datagram (batches of one). A datagram the socket cannot take now
            // is not queued: its query stays pending and times out, as a lost one would.
            if let Err(e) = sock.write(&self.wbuf) {
                if e.kind() != io::ErrorKind::Interrupted {
                    let name = errno_name(&e);
                    self.count_error(name);
                }
            }
            return;
        }
        if c.wbuf.is_empty() {
            match sock.write(&self.wbuf) {
                Ok(w) if w == len => {}
                Ok(w) => c.wbuf.extend_from_slice(&self.wbuf[w..]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    c.wbuf.extend_from_slice(&self.wbuf);
                }
                Err(e) => {
                    // The batch is in `pending`: closing counts it as lost.
                    self.close(i, Why::Error(&e), sent_at);
                }
            }
        } else {
            c.wbuf.extend_from_slice(&self.wbuf);
        }
    }

    /// Whether a connection that closes now is opened again: while queries are sent, and
    /// after the last one while queries a GOAWAY handed back wait to be sent again (else they
    /// would be left unanswered for want of a connection).
    fn reopens(&self) -> bool {
        match self.phase {
            Phase::Running => true,
            Phase::Draining { .. } => !self.retry.is_empty(),
            Phase::Connecting | Phase::Waiting => false,
        }
    }

    fn start_connects(&mut self, now: u64, poll: &Poll) {
        let reconnecting = self.reopens();
        if !(self.phase == Phase::Connecting || reconnecting) {
            return;
        }
        while let Some(&i) = self.idle.front() {
            let i = i as usize;
            if self.conns[i].state != State::Idle {
                self.idle.pop_front();
                continue;
            }
            if self.conns[i].since > now || !self.bucket.try_take(now, 1) {
                break;
            }
            self.idle.pop_front();
            self.c.attempts += 1;
            let key = self.key(i);
            let src = if self.sh.cfg.sources.is_empty() {
                None
            } else {
                Some(self.sh.cfg.sources[(key % self.sh.cfg.sources.len() as u64) as usize])
            };
            // A UDP socket is "connected" at once; it goes through the same writable event
            // to Open as a TCP connect, so both are counted the same way.
            let sock = match (&self.sh.cfg.tls, self.sh.cfg.udp) {
                (_, true) => connect_udp(self.sh.cfg.addr, src),
                (Some(tls), false) => connect(self.sh.cfg.addr, src).and_then(|s| {
                    let t = tls.session().map_err(io::Error::other)?;
                    Ok(Sock::Tls(s, Box::new(t)))
                }),
                (None, false) => connect(self.sh.cfg.addr, src).map(Sock::Tcp),
            };
            match sock {
                Ok(mut s) => {
                    if let Err(e) = poll.registry().register(
                        &mut s,
                        Token(i),
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        self.connect_failed(i, &e, now);
                        continue;
                    }
                    let c = &mut self.conns[i];
                    c.sock = Some(s);
                    c.state = State::Connecting;
                    c.since = now;
                }
                Err(e) => self.connect_failed(i, &e, now),
            }
        }
    }

    /// The process's first connect failure, kept where a fleet agent's gate reads it.
    fn note_connect_failure(&self, why: impl FnOnce() -> String) {
        if let Ok(mut f) = self.sh.connect_failure.lock() {
            if f.is_none() {
                *f = Some(why());
            }
        }
    }

    fn connect_failed(&mut self, i: usize, e: &io::Error, now: u64) {
        let name = errno_name(e);
        self.count_error(name);
        if self.first_connect_error.is_none() {
            self.first_connect_error = Some(e.to_string());
            self.note_connect_failure(|| format!("{name}: {e}"));
        }
        self.c.failed += 1;
        self.retry_later(i, now);
    }

    fn retry_later(&mut self, i: usize, now: u64) {
        let opening = self.phase == Phase::Connecting;
        let reopen = self.reopens();
        let max = self.sh.cfg.retries;
        let c = &mut self.conns[i];
        c.sock = None;
        if opening && u32::from(c.retries) >= max {
            c.state = State::Dead;
            return;
        }
        if !(opening || reopen) {
            c.state = State::Dead;
            return;
        }
        c.retries = c.retries.saturating_add(1);
        self.c.retries += 1;
        c.state = State::Idle;
        c.since = now + RETRY_DELAY_NS;
        self.idle.push_back(i as u32);
    }

    fn count_error(&mut self, name: &'static str) {
        *self.errors.entry(name).or_insert(0) += 1;
        // The evidence so far: has any connect of this process been answered?
        let bit = hint_bit(name, self.sh.peak_open.load(Ordering::Relaxed) > 0);
        if bit != 0 {
            self.sh.live.give_hints(bit, self.sh.hint);
        }
    }

    fn on_event(&mut self, i: usize, readable: bool, writable: bool, closed: bool, now: u64) {
        match self.conns[i].state {
            State::Connecting => {
                if !(writable || closed) {
                    return;
                }
                let c = &mut self.conns[i];
                let Some(s) = c.sock.as_ref() else { return };
                let err = match s.take_error() {
                    Ok(Some(e)) | Err(e) => Some(e),
                    Ok(None) => match s.peer_addr() {
                        Ok(_) => None,
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                        Err(e) => Some(e),
                    },
                };
                if let Some(e) = err {
                    self.connect_failed(i, &e, now);
                    return;
                }
                c.state = State::Open;
                if self.phase == Phase::Running {
                    c.retries = 0;
                }
                if syn_was_resent(s) {
                    // The first SYN went unanswered: dropped on the way, or by a server whose
                    // accept queue was full. The evidence for the accept-queue hint.
                    self.c.slow += 1;
                    self.sh.live.give_hints(LATE_HINT, self.sh.hint);
                }
                c.on_conn = 0;
                c.retiring = false;
                if self.sh.proto.h2.is_some() {
                    // Prior knowledge (h2c): the preface and SETTINGS go first.
                    c.h2 = Some(Box::new(H2Conn::new(&mut c.wbuf)));
                }
                if c.was_open {
                    self.c.reconnects += 1;
                }
                c.was_open = true;
                self.c.established += 1;
                if self.sh.cfg.tls.is_some() {
                    // Open (taking queries) once the handshake is done; HTTP/2's preface
                    // waits in wbuf until then.
                    c.state = State::Handshaking;
                    c.since = now;
                    self.handshake(i);
                    return;
                }
                self.opened();
                if !self.conns[i].wbuf.is_empty() {
                    self.flush(i, now);
                }
                if readable && self.conns[i].state == State::Open {
                    self.on_readable(i, closed, now);
                }
            }
            State::Handshaking => {
                if readable || writable {
                    self.handshake(i);
                }
            }
            State::Open => {
                let c = &self.conns[i];
                if writable
                    && (!c.wbuf.is_empty() || c.sock.as_ref().is_some_and(Sock::wants_write))
                {
                    self.flush(i, now);
                }
                if readable && self.conns[i].state == State::Open {
                    self.on_readable(i, closed, now);
                }
            }
            State::Idle | State::Dead => {}
        }
    }

    /// A connection became open (connected; with --tls, handshake done): it takes queries.
    fn opened(&mut self) {
        self.open += 1;
        let open = self.sh.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.sh.peak_open.fetch_max(open, Ordering::Relaxed);
    }

    fn flush(&mut self, i: usize, now: u64) {
        let c = &mut self.conns[i];
        let Some(s) = c.sock.as_mut() else { return };
        while !c.wbuf.is_empty() {
            match s.write(&c.wbuf) {
                Ok(n) => {
                    c.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.close(i, Why::Error(&e), now);
                    return;
                }
            }
        }
        // Idle connections hold no buffer.
        c.wbuf = Vec::new();
        if let Err(e) = s.flush_below() {
            self.close(i, Why::Error(&e), now);
        }
    }

    /// Answers on a UDP socket: one per datagram, read until the socket is empty (edge
    /// triggered: a short datagram says nothing about the next). Nothing here closes the
    /// socket: a bad datagram spoils no stream, and an ICMP error is about one datagram.
    fn on_datagrams(&mut self, i: usize) {
        loop {
            let Some(s) = self.conns[i].sock.as_mut() else {
                return;
            };
            let n = match s.read(&mut self.rbuf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP port unreachable (ECONNREFUSED) and the like, reported once each.
                    let name = errno_name(&e);
                    self.count_error(name);
                    continue;
                }
            };
            let now = now_ns();
            self.c.bytes_received += n as u64;
            match self.sh.proto.feed_datagram(&self.rbuf[..n]) {
                Ok(a) => self.answered(i, a, now),
                Err(b) => {
                    self.c.malformed += 1;
                    self.count_error(b.kind);
                    if self.first_bad.is_none() {
                        self.first_bad = Some(format!("{}: {}", b.kind, b.detail));
                    }
                }
            }
            let c = &self.conns[i];
            if c.retiring && c.pending.is_empty() {
                self.close(i, Why::Ours, now);
                return;
            }
        }
    }

    fn on_readable(&mut self, i: usize, closed: bool, _now: u64) {
        if self.sh.cfg.udp {
            self.on_datagrams(i);
            return;
        }
        let mut read_any = false;
        loop {
            let c = &mut self.conns[i];
            let Some(s) = c.sock.as_mut() else { return };
            let n = match s.read(&mut self.rbuf) {
                Ok(0) => {
                    let now = now_ns();
                    self.close(i, Why::ByServer, now);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if read_any {
                        self.ack_now(i);
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let now = now_ns();
                    if e.raw_os_error() == Some(libc::ECONNRESET) {
                        self.count_error("ECONNRESET");
                        self.close(i, Why::ByServer, now);
                    } else {
                        self.close(i, Why::Error(&e), now);
                    }
                    return;
                }
            };
            read_any = true;
            let now = now_ns();
            self.c.bytes_received += n as u64;
            // Whether that read emptied the socket: with edge-triggered epoll the next data
            // raises a new event, so another read would only return EAGAIN. Not so over TLS
            // whenever a read returns one record's plaintext and more records wait behind it
            // (`Sock::drained` asks the session). A pending FIN is the exception: read on to
            // see it.
            let drained = !closed
                && self.conns[i]
                    .sock
                    .as_ref()
                    .is_some_and(|s| s.drained(n, self.rbuf.len()));
            if self.conns[i].h2.is_some() {
                if !self.h2_read(i, n, now) {
                    return;
                }
                if drained {
                    self.ack_now(i);
                    return;
                }
                continue;
            }
            self.answers.clear();
            let key = self.key(i);
            let c = &mut self.conns[i];
            let fed = self.sh.proto.feed(
                &mut c.rx,
                &mut c.rbuf,
                &c.pending,
                key,
                &self.rbuf[..n],
                &mut self.answers,
            );
            for k in 0..self.answers.len() {
                let a = self.answers[k];
                self.answered(i, a, now);
            }
            if let Err(bad) = fed {
                self.close(i, Why::Bad(bad), now);
                return;
            }
            let c = &self.conns[i];
            if c.retiring && c.pending.is_empty() {
                self.close(i, Why::Ours, now);
                return;
            }
            if drained {
                self.ack_now(i);
                return;
            }
        }
    }

    /// After reading answers on connection `i`: acknowledges them at once while queries of
    /// it are still out. A server that writes small answers with Nagle on (unbound) sends
    /// an answer only once the one before it is acknowledged; the kernel's delayed ACK leaves
    /// that to this client's next query, so after any stall that put two answers of a
    /// connection in flight together, the server answers it one query late for good and the
    /// latency measured is the gap between its queries (issue 24: ~3 ms medians in half the
    /// runs at 2k q/s over 10 connections where dnsperf saw 75 µs). With nothing outstanding
    /// no answer can be waiting for the ACK: it rides on the next query, as without this.
    fn ack_now(&self, i: usize) {
        let c = &self.conns[i];
        if !self.sh.cfg.quickack || c.pending.is_empty() {
            return;
        }
        if let Some(s) = &c.sock {
            s.ack_now();
        }
    }

    fn answered(&mut self, i: usize, a: Answer, now: u64) {
        let c = &mut self.conns[i];
        let p = match a.id {
            None => c.pending.pop_front(),
            Some(id) => c
                .pending
                .iter()
                .position(|p| p.seq as u16 == id)
                .and_then(|k| c.pending.remove(k)),
        };
        let Some(p) = p else {
            self.c.unmatched += 1;
            return;
        };
        self.record_answer(i, p, a.code, now);
    }

    /// Takes query `seq` of connection `i` out of its queries in flight.
    fn take_pending(&mut self, i: usize, seq: u32) -> Option<Pending> {
        let c = &mut self.conns[i];
        let k = c.pending.iter().position(|p| p.seq == seq)?;
        c.pending.remove(k)
    }

    /// Query `p` of connection `i` answered with `code` at `now`.
    fn record_answer(&mut self, i: usize, p: Pending, code: u16, now: u64) {
        let key = self.key(i);
        let c = &mut self.conns[i];
        // A stream (or an in-flight slot) freed: a query waiting for one may go now, not at
        // the next millisecond's retry.
        self.no_conn_until = 0;
        if c.pending.is_empty() && c.pending.capacity() > KEEP_PENDING {
            // A queue grown by a burst is not kept by a connection gone quiet.
            c.pending = VecDeque::new();
        }
        let at = now.saturating_sub(self.start);
        let lat_i = at.saturating_sub(p.intended);
        let lat_s = at.saturating_sub(p.sent);
        self.hist_i.record(lat_i);
        self.hist_s.record(lat_s);
        self.tick(now);
        self.ival.record(lat_i, lat_s);
        self.c.answered += 1;
        if code == ECHOED {
            self.c.echoed += 1;
        } else {
            self.codes[usize::from(code).min(CODES - 1)] += 1;
        }
        if let Some(s) = &mut self.sink {
            s.push(rec_of(RecKind::Answer, key, &p, at));
        }
    }

    /// Closes connection `i`; its queries in flight are lost. It is reopened while the run
    /// goes on.
    fn close(&mut self, i: usize, why: Why<'_>, now: u64) {
        let key = self.key(i);
        let reopen = self.reopens();
        let at = now.saturating_sub(self.start);
        match &why {
            Why::ByServer => self.c.closed_by_server += 1,
            Why::Error(e) => {
                let n = errno_name(e);
                self.count_error(n);
            }
            Why::Bad(b) => {
                self.c.malformed += 1;
                self.count_error(b.kind);
                if self.first_bad.is_none() {
                    self.first_bad = Some(format!("{}: {}", b.kind, b.detail));
                }
            }
            Why::Ours => {}
        }
        let c = &mut self.conns[i];
        let was_open = c.state == State::Open;
        if let (Some(Sock::Tls(s, t)), Why::Ours) = (c.sock.as_mut(), &why) {
            t.close(s);
        }
        c.sock = None;
        for p in c.pending.drain(..) {
            self.c.lost += 1;
            if let Some(s) = &mut self.sink {
                s.push(rec_of(RecKind::Lost, key, &p, at));
            }
        }
        c.pending = VecDeque::new();
        c.rbuf = Vec::new();
        c.wbuf = Vec::new();
        c.rx = Rx::default();
        c.retiring = false;
        if let Some(h) = c.h2.take() {
            Self::h2_tally(&mut self.c.h2, &h);
        }
        if was_open {
            self.open -= 1;
            self.sh.open.fetch_sub(1, Ordering::Relaxed);
        }
        if self.phase == Phase::Connecting {
            // While opening, a connection the server drops counts against the retries like
            // a failed connect, so the opening phase ends even if the server drops them all.
            self.retry_later(i, now);
        } else if reopen {
            c.state = State::Idle;
            // A connection the server closed is reopened at once (paced by the connect rate);
            // after an error, after the retry delay.
            c.since = match why {
                Why::ByServer | Why::Ours => now,
                _ => now + RETRY_DELAY_NS,
            };
            self.idle.push_back(i as u32);
        } else {
            c.state = State::Dead;
        }
    }

    fn sweep(&mut self, now: u64) {
        let ct = self.sh.cfg.connect_timeout.as_nanos() as u64;
        let qt = self.sh.cfg.timeout.as_nanos() as u64;
        let by_id = self.sh.proto.matched_by_id();
        let at = now.saturating_sub(self.start);
        for i in 0..self.conns.len() {
            let key = self.key(i);
            let c = &mut self.conns[i];
            match c.state {
                State::Connecting if now.saturating_sub(c.since) >= ct => {
                    self.c.connect_timeouts += 1;
                    self.c.failed += 1;
                    self.count_error("connect timeout");
                    if self.first_connect_error.is_none() {
                        let why = format!("no answer within {:?}", self.sh.cfg.connect_timeout);
                        self.note_connect_failure(|| format!("connect timeout: {why}"));
                        self.first_connect_error = Some(why);
                    }
                    self.retry_later(i, now);
                }
                State::Handshaking if now.saturating_sub(c.since) >= ct => {
                    let f = tcpkit_tls::Failure::timeout(self.sh.cfg.connect_timeout);
                    self.tls_failed(i, &f, now);
                }
                State::Open if !c.pending.is_empty() && self.start != 0 => {
                    let Some(front) = c.pending.front() else {
                        continue;
                    };
                    if at.saturating_sub(front.sent) < qt {
                        continue;
                    }
                    while let Some(p) = c.pending.front().copied() {
                        if at.saturating_sub(p.sent) < qt {
                            break;
                        }
                        c.pending.pop_front();
                        if let Some(h) = c.h2.as_mut() {
                            // Its stream is reset, so its slot is free for the next query.
                            h.cancel(p.seq, &mut c.wbuf);
                        }
                        self.c.timeouts += 1;
                        if let Some(s) = &mut self.sink {
                            s.push(rec_of(RecKind::Timeout, key, &p, at));
                        }
                    }
                    if !self.conns[i].wbuf.is_empty() {
                        self.flush(i, now);
                    }
                    if !by_id {
                        // In-order answers: once one is overdue the stream cannot be matched
                        // any more. The overdue ones were counted as timeouts; closing counts
                        // the rest as lost, and the connection is reopened.
                        self.close(i, Why::Ours, now);
                    }
                }
                _ => {}
            }
        }
        self.tick(now);
        self.publish();
    }

    fn publish(&self) {
        let s = self.sh.live.slot(self.live_slot());
        s.open.store(self.open, Ordering::Relaxed);
        s.sent.store(self.c.sent, Ordering::Relaxed);
        s.answered.store(self.c.answered, Ordering::Relaxed);
        s.timeouts.store(self.c.timeouts, Ordering::Relaxed);
        s.errors.store(
            self.c.failed + self.c.malformed + self.c.closed_by_server,
            Ordering::Relaxed,
        );
        if self.phase != Phase::Running || self.next_due > now_ns() {
            s.lag_ns.store(0, Ordering::Relaxed);
        }
    }

    fn finish(mut self) -> ThreadOut {
        // The last second, closed with the run's totals: the seconds add up to them.
        let last = Self::tally(&self.c, &self.errors);
        let intervals = self.ival.finish(now_ns(), last);
        if let Some(s) = &mut self.sink {
            s.flush();
        }
        ThreadOut {
            intervals,
            hist_intended: self.hist_i,
            hist_sent: self.hist_s,
            codes: self.codes,
            errors: self.errors,
            first_bad: self.first_bad,
            first_connect_error: self.first_connect_error,
            c: self.c,
            connected_at: self.connected_at,
            tls: self.tls,
        }
    }
}
