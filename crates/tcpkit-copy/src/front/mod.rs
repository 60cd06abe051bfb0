//! The session front every copy mode shares, written once over a [`Transport`]: the capture
//! side (sessions opening, their bytes cut into requests, their end), each copy's queue of
//! requests and the request-turn gate ([`gate`]: wait for the answer, `--diff`'s rest of it,
//! the think time), the copies' slots and timers ([`slab`]), the memory limit, how each copy
//! ended (the tally), the live counters and the report.
//!
//! A transport is how one copy reaches the target: relay mode's kernel TCP connection
//! ([`crate::relay`]) or transparent mode's raw TCP flow answered through intercept
//! ([`crate::transparent`]). It owns its connection states (connecting, closing,
//! retransmitting) and its I/O; the front calls it through static dispatch, so a copy's
//! bytes go through no virtual call.

pub(crate) mod gate;
pub(crate) mod slab;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::report::CopyReport;
use bytes::Bytes;
use mio::{Events, Registry};
use rustc_hash::FxHashMap;
use tcpkit_pace::{now_ns, Speed};
use tcpkit_stats::Histogram;

use crate::backoff::{Backoff, Down};
use crate::config::{CopyConfig, CopyCounters};
use crate::diff::{ConnMeta, DiffConn, Differ};
use crate::feed::{self, FeedError, Input};
use crate::reasm::{CloseKind, Dir, SessionId};
use crate::transfer;
use crate::turns::{ClientBytes, ReqStart, Turns};
use gate::{Answer, DiffView, Turn};
use slab::Slab;

/// How long a closing copy waits for the target's FIN before it is dropped (relay) or reset
/// (transparent).
pub(crate) const CLOSE_LINGER_NS: u64 = 1_000_000_000;

/// How often the live counters' overdue requests are counted again (a pass over the copies;
/// live lines come no faster than a tenth of a second).
const OVERDUE_SCAN_NS: u64 = 100_000_000;

/// Why a copy run stopped, in either transport: its input (the capture or its file), or a
/// system call of its own that failed. Transparent mode's control errors wrap it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
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

/// `map_err(io_err("what the call was for"))`.
pub(crate) fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> RunError {
    move |source| RunError::Io { what, source }
}

/// The answer differ `--diff` asks for, its `--diff-out` created: both transports open it
/// before their first copy.
pub(crate) fn open_differ(cfg: &CopyConfig) -> Result<Option<Differ>, RunError> {
    cfg.diff
        .clone()
        .map(Differ::new)
        .transpose()
        .map_err(io_err("create the --diff-out file"))
}

/// One entry of a copy's queue.
#[derive(Debug)]
pub(crate) enum Item {
    /// Client bytes; `start` when they begin a request.
    Data {
        bytes: Bytes,
        start: Option<ReqStart>,
    },
    /// The session ended in the capture: close once the last answer is in (`wait_answer`:
    /// the original server answered the last request; `answer_bytes`: what the original
    /// server sent after the first request copied); `lost`: the capture had a hole.
    End {
        wait_answer: bool,
        lost: bool,
        answer_bytes: u64,
    },
}

/// How a copy ended: each copy ends exactly once, counted by one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Completed,
    Refused,
    Reset,
    Timeout,
    ClosedEarly,
    LostData,
    Shed,
    /// Transparent mode: intercept's control connection was lost.
    ControlLost,
    OpenAtEnd,
}

/// One copy of a session: what the front keeps of it, and the transport's part `x`.
#[derive(Debug)]
pub(crate) struct Conn<X> {
    pub target: SocketAddr,
    pub queue: VecDeque<Item>,
    /// Request bytes held (counted against the memory limit) until the transport lets them go.
    pub held: usize,
    /// The target sent bytes since the last request started (or since connecting).
    pub answered: bool,
    /// Requests started and not answered yet.
    pub unanswered: u64,
    /// Requests of this copy's session seen at the source, and those of them the target
    /// answered: what the copy leaves unanswered when it ends is lost (the live loss figure).
    pub at_source: u64,
    pub answered_reqs: u64,
    /// The target's bytes so far.
    pub rx_bytes: u64,
    pub last_rx_ns: u64,
    pub last_write_ns: u64,
    /// The last request's place on its client's schedule (see
    /// [`crate::turns::ReqStart::send_at`]).
    pub last_req_ns: Option<u64>,
    /// The last time the target acknowledged anything (transparent's ACKs; relay has no
    /// view of them and leaves it at the copy's start).
    pub progress_ns: u64,
    /// What the end will count as once the copy is closed.
    pub ending: Outcome,
    /// `--diff`: this copy's answers, paired with the original ones.
    pub diff: Option<Box<DiffConn>>,
    pub x: X,
}

impl<X> Conn<X> {
    /// The target's bytes arrived: counted, compared, and the request they answer.
    /// `n` bytes counted (`data`, what of them is known, goes to `--diff`).
    pub(crate) fn answer_bytes(
        &mut self,
        n: u64,
        data: &[u8],
        report: &mut CopyReport,
        target_lat: &mut Histogram,
        no_wait: bool,
        now: u64,
    ) {
        report.requests.bytes_answered += n;
        self.rx_bytes = self.rx_bytes.saturating_add(n);
        if let Some(d) = self.diff.as_mut() {
            d.target_bytes(data);
        }
        if self.unanswered > 0 {
            target_lat.record(now.saturating_sub(self.last_write_ns));
            // Waiting, one request is outstanding; with --no-wait an answer stands for every
            // request before it on the stream.
            let k = if no_wait { self.unanswered } else { 1 };
            report.requests.answered += k;
            self.answered_reqs += k;
            self.unanswered -= k;
        }
        self.answered = true;
        self.last_rx_ns = now;
    }

    fn answer(&self, more_due: bool) -> Answer {
        Answer {
            answered: self.answered,
            last_write_ns: self.last_write_ns,
            last_rx_ns: self.last_rx_ns,
            progress_ns: self.progress_ns,
            more_due,
            diff: self.diff.as_deref().map(|d| DiffView {
                whole: d.answer_whole(),
                partial: d.answer_partial(),
            }),
        }
    }
}

/// A session being copied, on the capture side: its copies' handles and its turns.
#[derive(Debug)]
pub(crate) struct Sess {
    copies: Vec<(usize, u32)>,
    turns: Turns,
}

/// The front's state: sessions, copies, memory, counters.
pub(crate) struct Front<'a, X> {
    pub cfg: &'a CopyConfig,
    sessions: FxHashMap<SessionId, Sess>,
    pub conns: Slab<Conn<X>>,
    /// Request bytes held by every copy.
    pub held: usize,
    /// Copies not ended yet.
    pub open: u64,
    pub report: CopyReport,
    pub target_lat: Histogram,
    orig: Histogram,
    /// Think times are scaled by this (offline `--speed`).
    speed: Speed,
    /// Think times are capped at this (offline `--max-idle`), like the gaps between frames.
    max_think_ns: u64,
    pub differ: Option<Differ>,
    start_ns: u64,
    /// Copies ended by a lost control connection (transparent mode).
    pub control_lost: u64,
    /// Requests seen at the source that can no longer be answered: their copy ended (or had
    /// already ended) first. Only these and the overdue ones count in the live loss figure;
    /// a request whose answer may still come is not lost yet.
    pub lost: u64,
    /// Requests of open copies past their `--timeout` unanswered, at the last count: lost
    /// too while the run goes on (the copy ends them as lost when it next moves).
    overdue: u64,
    /// When the overdue requests are counted next.
    overdue_scan_at: u64,
    /// Says a line on stderr (the user's `-q` decides).
    pub(crate) say: &'a dyn Fn(&str),
    /// Copies the target reset or closed early lately, with when and how: those whose target
    /// is found down (refusing, or silent) within [`GONE_WINDOW_NS`] were cut by it going
    /// away (a restart, a crash) and are counted so ([`Engine::settle_cut`]).
    cut: VecDeque<(SocketAddr, u64, Outcome)>,
}

/// How soon after a copy was cut its target must be found down for the cut to count as the
/// target going away: a restarting server refuses the next connect at once, and a new
/// session (or the back-off's probe) tries one within this.
const GONE_WINDOW_NS: u64 = 2_000_000_000;
/// Cut copies awaiting that verdict, at most (more count as what they were cut by).
const MAX_CUT: usize = 4096;

impl<X> Front<'_, X> {
    /// Arms copy `idx`'s timer (see [`Slab::arm`]).
    pub(crate) fn arm(&mut self, idx: usize, at: u64, now: u64) {
        self.conns.arm(idx, at, now);
    }
}

/// How a copy reaches the target. The front drives it: [`Transport::drive`] moves the
/// transport's own states, [`Transport::write`] takes the front request bytes,
/// [`Transport::close`] ends the stream; the transport reports back through
/// [`Engine::pump`] and [`Engine::end`]. Associated functions take the whole engine, so
/// the transport reaches the front's state and the front's logic without a callback table.
pub(crate) trait Transport: Sized {
    /// The transport's part of a copy.
    type Conn;
    /// What the transport keeps of a session while its copies are made (transparent mode:
    /// the client's ISN).
    type Seed;
    type Error: From<FeedError>;
    /// The report's `mode`.
    const MODE: &'static str;
    /// How long one turn of the live loop waits for the transport's I/O at most.
    const LIVE_WAIT: Duration;
    /// How long one turn of the drain after the input waits at most.
    const DRAIN_WAIT: Duration;

    fn registry(&self) -> &Registry;
    /// Every frame (Ethernet), before the reassembler sees it.
    fn frame(_e: &mut Engine<'_, Self>, _frame: &[u8]) {}
    /// A session of the capture opens (copied or not).
    fn session_seen(e: &mut Engine<'_, Self>, client: SocketAddr, server: SocketAddr)
        -> Self::Seed;
    /// The transport's part of copy `k` (0-based) of a selected session toward `target`, or
    /// None when it cannot be made (counted by the transport).
    fn new_conn(
        e: &mut Engine<'_, Self>,
        seed: &mut Self::Seed,
        client: SocketAddr,
        target: SocketAddr,
        k: u32,
        now: u64,
    ) -> Option<Self::Conn>;
    /// Copy `idx` has its slot and handle.
    fn placed(_e: &mut Engine<'_, Self>, _idx: usize, _gen: u32) {}
    /// Moves the transport's own states of copy `idx` (connecting, closing, retransmitting,
    /// sending what it holds); true when the queue may move too.
    fn drive(e: &mut Engine<'_, Self>, idx: usize, now: u64) -> bool;
    /// The target closed its side.
    fn peer_closed(x: &Self::Conn) -> bool;
    /// Bytes of the target's are known to be due (past a hole it will resend).
    fn answer_due(_x: &Self::Conn) -> bool {
        false
    }
    /// Takes the front `Item::Data`'s bytes (all or part; the transport pops the item once
    /// they are its own); true when the queue may move on.
    fn write(e: &mut Engine<'_, Self>, idx: usize, now: u64) -> bool;
    /// Ends copy `idx`'s stream (FIN), its last answers in: the transport pops the
    /// `Item::End` once it did, and sets the conn's `ending`. True when the queue may move on.
    fn close(e: &mut Engine<'_, Self>, idx: usize, now: u64, ending: Outcome) -> bool;
    /// Copy `idx` ends as `how`, still in its slot; `reset`: tell the target (a RST) where
    /// the transport can.
    fn release(e: &mut Engine<'_, Self>, idx: usize, how: Outcome, reset: bool);
    /// One wait for I/O of at most `wait`, then the I/O.
    fn io(e: &mut Engine<'_, Self>, events: &mut Events, wait: Duration)
        -> Result<(), Self::Error>;
    /// The transport's part of the report.
    fn finish(&mut self, _f: &Front<'_, Self::Conn>, _r: &mut CopyReport) {}
    /// The back-off toward targets that refuse or answer nothing.
    fn backoff(&mut self) -> &mut Backoff;
    /// `Some(tried)` when the copy waits at the back-off's gate with no attempt of its own in
    /// flight; `tried`: it made one before.
    fn gated(x: &Self::Conn) -> Option<bool>;
}

/// A copy mode: the front over transport `T`.
pub(crate) struct Engine<'a, T: Transport> {
    pub f: Front<'a, T::Conn>,
    pub t: T,
}

impl<'a, T: Transport> Engine<'a, T> {
    /// `say` gives the user a line on stderr (a target going down or coming back).
    pub(crate) fn new(
        cfg: &'a CopyConfig,
        t: T,
        differ: Option<Differ>,
        input: &Input,
        start_ns: u64,
        say: &'a dyn Fn(&str),
    ) -> Self {
        let (speed, max_think_ns) = feed::pace(input);
        Engine {
            f: Front {
                cfg,
                sessions: FxHashMap::default(),
                conns: Slab::default(),
                held: 0,
                open: 0,
                report: CopyReport::default(),
                target_lat: Histogram::new(),
                orig: Histogram::new(),
                speed,
                max_think_ns,
                differ,
                start_ns,
                control_lost: 0,
                lost: 0,
                overdue: 0,
                overdue_scan_at: 0,
                say,
                cut: VecDeque::new(),
            },
            t,
        }
    }

    /// Ends copy `idx` as `how` and counts it; `reset`: see [`Transport::release`].
    pub(crate) fn end(&mut self, idx: usize, how: Outcome, reset: bool) {
        if self.f.conns.get(idx).is_none() {
            return;
        }
        T::release(self, idx, how, reset);
        let f = &mut self.f;
        let Some(mut c) = f.conns.remove(idx) else {
            return;
        };
        if let (Some(d), Some(df)) = (c.diff.take(), f.differ.as_mut()) {
            d.closed(df, how == Outcome::Completed);
        }
        f.held -= c.held;
        f.open -= 1;
        f.lost += c.at_source.saturating_sub(c.answered_reqs);
        let s = &mut f.report.sessions;
        let fl = &mut s.failed;
        match how {
            Outcome::Completed => s.completed += 1,
            Outcome::Refused => fl.target_refused += 1,
            Outcome::Reset => fl.reset += 1,
            Outcome::Timeout => fl.timeout += 1,
            Outcome::ClosedEarly => fl.closed_early += 1,
            Outcome::LostData => fl.lost_capture_data += 1,
            Outcome::Shed => fl.shed += 1,
            Outcome::ControlLost => f.control_lost += 1,
            Outcome::OpenAtEnd => s.open_at_end += 1,
        }
        if matches!(how, Outcome::Reset | Outcome::ClosedEarly) && f.cut.len() < MAX_CUT {
            f.cut.push_back((c.target, now_ns(), how));
        }
    }

    /// The copies cut lately whose target is now found down were cut by it going away:
    /// counted as `target_gone` instead of how they were cut; those past [`GONE_WINDOW_NS`]
    /// stay as they were. `all`: the run is over, nothing more will be found.
    fn settle_cut(&mut self, now: u64, all: bool) {
        let mut keep = VecDeque::new();
        while let Some((target, at, how)) = self.f.cut.pop_front() {
            if self.t.backoff().down(target).is_some() {
                let fl = &mut self.f.report.sessions.failed;
                match how {
                    Outcome::Reset => fl.reset -= 1,
                    _ => fl.closed_early -= 1,
                }
                fl.target_gone += 1;
            } else if !all && now < at + GONE_WINDOW_NS {
                keep.push_back((target, at, how));
            }
        }
        self.f.cut = keep;
    }

    /// Ends a session's copies as shed (memory over the limit, or the reassembler's).
    fn shed(&mut self, copies: Vec<(usize, u32)>) {
        for (idx, gen) in copies {
            if self.f.conns.by_handle(idx, gen).is_some() {
                self.end(idx, Outcome::Shed, true);
            }
        }
    }

    /// Moves copy `idx` as far as it can go now; arms its timer when it must wait.
    pub(crate) fn pump(&mut self, idx: usize, now: u64) {
        let (no_wait, timeout) = (self.f.cfg.no_wait, self.f.cfg.timeout_ns);
        let max_lag = self.f.cfg.max_lag_ns;
        loop {
            if !T::drive(self, idx, now) {
                return;
            }
            let Some(c) = self.f.conns.get_mut(idx) else {
                return;
            };
            let peer_closed = T::peer_closed(&c.x);
            match c.queue.front() {
                None => return,
                Some(Item::Data { start, .. }) => {
                    if peer_closed {
                        self.end(idx, Outcome::ClosedEarly, true);
                        return;
                    }
                    if let Some(r) = *start {
                        // Its place on the client's schedule (or now, when the copy is ahead
                        // of it): neither the loop's lateness nor a late answer is carried on
                        // to the requests after it.
                        let mut due = now;
                        if r.wait_answer && !no_wait {
                            let a = c.answer(T::answer_due(&c.x));
                            let s = r.send_at(a.last_rx_ns, c.last_req_ns, max_lag, self.f.speed);
                            match gate::request(&a, s.at, now, timeout) {
                                Turn::Go => due = s.sched.min(now),
                                Turn::Wait(at) => {
                                    self.f.arm(idx, at, now);
                                    return;
                                }
                                Turn::TimedOut => {
                                    self.end(idx, Outcome::Timeout, true);
                                    return;
                                }
                            }
                        }
                        if let Some(Item::Data { start, .. }) = c.queue.front_mut() {
                            *start = None;
                        }
                        c.last_req_ns = Some(due);
                        c.answered = false;
                        c.unanswered += 1;
                        self.f.report.requests.copied += 1;
                        if let (Some(d), Some(df)) = (c.diff.as_deref_mut(), self.f.differ.as_mut())
                        {
                            d.request_sent(df);
                        }
                    }
                    if !T::write(self, idx, now) {
                        return;
                    }
                }
                Some(&Item::End {
                    wait_answer,
                    lost,
                    answer_bytes,
                }) => {
                    if wait_answer && !no_wait && !peer_closed {
                        let a = c.answer(T::answer_due(&c.x));
                        let short = c.rx_bytes < answer_bytes;
                        match gate::close(&a, c.unanswered, short, now, timeout) {
                            Turn::Go => {}
                            Turn::Wait(at) => {
                                self.f.arm(idx, at, now);
                                return;
                            }
                            // A session with a hole in its capture: its last request may be
                            // the part before the hole, which no target answers. The hole is
                            // the cause, whatever the clock says.
                            Turn::TimedOut => {
                                let how = if lost {
                                    Outcome::LostData
                                } else {
                                    Outcome::Timeout
                                };
                                self.end(idx, how, true);
                                return;
                            }
                        }
                    }
                    let ending = if lost {
                        Outcome::LostData
                    } else {
                        Outcome::Completed
                    };
                    if !T::close(self, idx, now, ending) {
                        return;
                    }
                }
            }
        }
    }

    fn fire_timers(&mut self, now: u64) {
        while let Some(idx) = self.f.conns.next_due(now) {
            self.pump(idx, now);
        }
    }

    /// Timers, then one wait for I/O of at most `max_wait`, then the I/O and the timers due.
    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), T::Error> {
        let now = now_ns();
        self.fire_timers(now);
        let mut wait = max_wait;
        if let Some(at) = self.f.conns.next_at() {
            wait = wait.min(Duration::from_nanos(at.saturating_sub(now)));
        }
        T::io(self, events, wait)?;
        self.fire_timers(now_ns());
        for line in self.t.backoff().take_news() {
            (self.f.say)(&line);
        }
        if !self.f.cut.is_empty() {
            self.settle_cut(now_ns(), false);
        }
        if let Some(line) = self.f.differ.as_mut().and_then(Differ::take_news) {
            (self.f.say)(&line);
        }
        Ok(())
    }

    /// Ends the copies waiting at the back-off's gate for a target that refuses: at the end
    /// of the run they were refused, not open (those that never tried, skipped in back-off).
    fn end_held_back(&mut self) {
        for idx in 0..self.f.conns.slots() {
            let Some(c) = self.f.conns.get(idx) else {
                continue;
            };
            let Some(tried) = T::gated(&c.x) else {
                continue;
            };
            let target = c.target;
            if self.t.backoff().down(target) == Some(Down::Refused) {
                if !tried {
                    self.f.report.sessions.skipped_in_backoff += 1;
                }
                // A copy that never tried has nothing at the target to reset.
                self.end(idx, Outcome::Refused, tried);
            }
        }
    }

    /// The requests of open copies waiting for an answer past their `--timeout` (from the
    /// later of the last write and the last progress, as the gate judges it). Counted every
    /// [`OVERDUE_SCAN_NS`], and at the end (no copy open: none).
    fn count_overdue(&mut self) {
        let now = now_ns();
        let f = &mut self.f;
        if now < f.overdue_scan_at && f.open > 0 {
            return;
        }
        f.overdue_scan_at = now + OVERDUE_SCAN_NS;
        let timeout = f.cfg.timeout_ns;
        f.overdue = f
            .conns
            .iter()
            .filter(|c| c.unanswered > 0 && c.last_write_ns.max(c.progress_ns) + timeout <= now)
            .map(|c| c.unanswered)
            .sum();
    }

    fn publish(&mut self, live: &CopyCounters) {
        self.count_overdue();
        let f = &self.f;
        let s = &f.report.sessions;
        let fl = &s.failed;
        let st = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        st(&live.sessions_seen, s.seen);
        st(&live.copies, s.copies);
        st(&live.completed, s.completed);
        st(
            &live.failed,
            fl.target_refused
                + fl.reset
                + fl.timeout
                + fl.closed_early
                + fl.target_gone
                + fl.lost_capture_data
                + fl.shed
                + f.control_lost,
        );
        st(&live.open, f.open);
        st(&live.requests_at_source, f.report.requests.at_source);
        st(&live.requests_copied, f.report.requests.copied);
        st(&live.requests_answered, f.report.requests.answered);
        st(&live.requests_lost, f.lost + f.overdue);
        st(&live.held_bytes, f.held as u64);
        st(&live.kernel_drops, f.report.capture.kernel_drops);
        st(&live.bytes_copied, f.report.requests.bytes_copied);
        st(&live.bytes_answered, f.report.requests.bytes_answered);
        if let Some(d) = f.differ.as_ref().map(Differ::stats) {
            st(&live.diff_compared, d.compared);
            st(&live.diff_equal, d.equal);
            st(&live.diff_different, d.different);
        }
    }

    /// After the input ended: lets the copies finish (each waits at most `--timeout` for an
    /// answer and the linger for the target's FIN; at most [`feed::STOP_DRAIN`] in all when
    /// the run was `stopped`, or is stopped meanwhile), then counts the rest as open. Those
    /// held back by a target that refuses do not wait for a stopped run's drain: they are
    /// counted refused at once.
    fn drain(
        &mut self,
        events: &mut Events,
        stop: &AtomicBool,
        live: &CopyCounters,
        mut stopped: bool,
    ) -> Result<(), T::Error> {
        let mut deadline = feed::drain_deadline(self.f.cfg, stopped, CLOSE_LINGER_NS);
        if stopped {
            self.end_held_back();
        }
        while self.f.open > 0 && now_ns() < deadline {
            if !stopped && stop.load(Ordering::Relaxed) {
                stopped = true;
                deadline = deadline.min(feed::drain_deadline(self.f.cfg, true, 0));
                self.end_held_back();
            }
            self.step(events, T::DRAIN_WAIT)?;
            self.publish(live);
        }
        self.end_held_back();
        for idx in 0..self.f.conns.slots() {
            if self.f.conns.get(idx).is_some() {
                self.end(idx, Outcome::OpenAtEnd, true);
            }
        }
        self.settle_cut(now_ns(), true);
        Ok(())
    }

    fn finish(mut self, seconds: f64) -> CopyReport {
        let cfg = self.f.cfg;
        let mut r = std::mem::take(&mut self.f.report);
        r.mode = T::MODE.into();
        r.rules = cfg.rules.iter().map(ToString::to_string).collect();
        r.copies_per_session = cfg.copies;
        r.sample_percent = cfg.sampler.percent;
        r.seconds = seconds;
        r.latency.original = self.f.orig.percentiles();
        r.latency.target = self.f.target_lat.percentiles();
        r.memory.limit_bytes = cfg.max_memory as u64;
        r.memory.rss_bytes = tcpkit_host::rss_bytes();
        r.diff = self.f.differ.as_mut().map(Differ::finish);
        r.requests.max_loss_percent = cfg.max_loss_percent;
        self.t.finish(&self.f, &mut r);
        r.finish();
        r
    }

    /// Feeds `input` to the copies until it ends (a file), `stop` is set, or `duration`
    /// passes; then lets the copies finish and returns the report (`start_ns`: when the run
    /// started). A capture file that turns out truncated ends the input early with the
    /// reason in the report's `failure`.
    pub(crate) fn run(
        mut self,
        input: &Input,
        duration: Option<Duration>,
        stop: &AtomicBool,
        live: &CopyCounters,
    ) -> Result<CopyReport, T::Error> {
        let start = self.f.start_ns;
        let end_at = duration.map(|d| start + d.as_nanos() as u64);
        let mut events = Events::with_capacity(1024);
        let say = self.f.say;
        feed::run(&mut self, input, end_at, stop, live, &mut events, say)?;
        let stopped = feed::stopped(stop, end_at);
        self.drain(&mut events, stop, live, stopped)?;
        self.publish(live);
        let secs = (now_ns() - start) as f64 / 1e9;
        Ok(self.finish(secs))
    }
}

impl<T: Transport> feed::Consumer for Engine<'_, T> {
    type Error = T::Error;
    const LIVE_WAIT: Duration = T::LIVE_WAIT;

    fn cfg(&self) -> &CopyConfig {
        self.f.cfg
    }
    fn registry(&self) -> &Registry {
        self.t.registry()
    }
    fn report(&mut self) -> &mut CopyReport {
        &mut self.f.report
    }
    fn frame(&mut self, frame: &[u8]) {
        T::frame(self, frame);
    }
    fn open_session(
        &mut self,
        id: SessionId,
        client: SocketAddr,
        server: SocketAddr,
        syn_seen: bool,
        now: u64,
    ) {
        let mut seed = T::session_seen(self, client, server);
        let cfg = self.f.cfg;
        let Some(rule) = transfer::rule_for(&cfg.rules, server).copied() else {
            return;
        };
        let s = &mut self.f.report.sessions;
        s.seen += 1;
        if !syn_seen {
            s.joined_mid_stream += 1;
        }
        if !cfg
            .sampler
            .selects(client, server, now.saturating_sub(self.f.start_ns))
        {
            s.sampled_out += 1;
            return;
        }
        s.selected += 1;
        let mut copies = Vec::with_capacity(cfg.copies as usize);
        for k in 0..cfg.copies {
            let Some(x) = T::new_conn(self, &mut seed, client, rule.target, k, now) else {
                continue;
            };
            let mut queue = VecDeque::new();
            // The PROXY header is queued bytes like any request's: counted in `held` here,
            // since the transports take every Data item they send off it (relay once it is
            // written whole: counted as 0, it wrapped the gauge below zero).
            let mut held = 0;
            if cfg.proxy_protocol {
                let mut h = Vec::with_capacity(crate::proxy::header_len(client, server));
                crate::proxy::emit(client, server, &mut h);
                held = h.len();
                self.f.held += held;
                queue.push_back(Item::Data {
                    bytes: Bytes::from(h),
                    start: None,
                });
            }
            let diff = self.f.differ.as_ref().map(|d| {
                Box::new(d.conn(ConnMeta {
                    session: id.0,
                    copy: k + 1,
                    client,
                    server,
                    target: rule.target,
                }))
            });
            let (idx, gen) = self.f.conns.insert(Conn {
                target: rule.target,
                queue,
                held,
                answered: false,
                unanswered: 0,
                at_source: 0,
                answered_reqs: 0,
                rx_bytes: 0,
                last_rx_ns: now,
                last_write_ns: now,
                last_req_ns: None,
                progress_ns: now,
                ending: Outcome::Completed,
                diff,
                x,
            });
            self.f.report.sessions.copies += 1;
            self.f.open += 1;
            T::placed(self, idx, gen);
            copies.push((idx, gen));
        }
        self.f.sessions.insert(
            id,
            Sess {
                copies,
                turns: Turns::new(syn_seen, self.f.differ.as_ref()),
            },
        );
        // Every copy has its handle (and transparent its 4-tuple) before any starts.
        for i in 0..cfg.copies as usize {
            let Some(&(idx, _)) = self.f.sessions.get(&id).and_then(|s| s.copies.get(i)) else {
                break;
            };
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
        let f = &mut self.f;
        let Some(s) = f.sessions.get_mut(&id) else {
            return;
        };
        match dir {
            Dir::ServerToClient => {
                if let Some(lat) = s.turns.server(bytes, ts) {
                    f.orig.record(lat);
                }
            }
            Dir::ClientToServer => {
                let (start, answer, pipelined) =
                    match s.turns.client(bytes, ts, f.max_think_ns, f.differ.as_ref()) {
                        ClientBytes::Skipped => {
                            f.report.requests.bytes_skipped_joining += bytes.len() as u64;
                            return;
                        }
                        ClientBytes::Copy {
                            start,
                            answer,
                            pipelined,
                        } => (start, answer, pipelined),
                    };
                let n = s.copies.len();
                // Once per copy, as at_source counts.
                f.report.requests.pipelined += pipelined * n as u64;
                if start.is_some() {
                    f.report.requests.at_source += n as u64;
                    for &(idx, gen) in &s.copies {
                        match f.conns.by_handle(idx, gen) {
                            Some(c) => c.at_source += 1,
                            None => f.lost += 1,
                        }
                    }
                }
                let diff_held = f.differ.as_ref().map_or(0, Differ::held_bytes);
                if f.held + bytes.len() * n + tracker_mem as usize + diff_held > f.cfg.max_memory {
                    if let Some(s) = f.sessions.remove(&id) {
                        self.shed(s.copies);
                    }
                    return;
                }
                // One copy out of the reassembler's shared block, shared by the -n copies.
                let data = Bytes::copy_from_slice(bytes);
                for i in 0..n {
                    let Some(&(idx, gen)) = self.f.sessions.get(&id).and_then(|s| s.copies.get(i))
                    else {
                        break;
                    };
                    let f = &mut self.f;
                    if let Some(c) = f.conns.by_handle(idx, gen) {
                        if let Some(d) = c.diff.as_mut() {
                            if let Some((k, r)) = &answer {
                                d.original(*k, Rc::clone(r));
                            }
                            if start.is_some() {
                                d.request_queued(&data);
                            }
                        }
                        c.queue.push_back(Item::Data {
                            bytes: data.clone(),
                            start,
                        });
                        c.held += data.len();
                        f.held += data.len();
                        self.pump(idx, now);
                    }
                }
                let f = &mut self.f;
                let peak = (f.held + diff_held) as u64 + tracker_mem;
                let m = &mut f.report.memory;
                m.peak_held_bytes = m.peak_held_bytes.max(peak);
            }
        }
    }
    fn session_gap(&mut self, id: SessionId, dir: Dir, len: u64, ts: u64) {
        if let (Some(s), Dir::ServerToClient) = (self.f.sessions.get_mut(&id), dir) {
            s.turns.server_gap(len, ts);
        }
    }
    fn close_session(&mut self, id: SessionId, how: CloseKind, requests_seen: u64, now: u64) {
        let Some(s) = self.f.sessions.remove(&id) else {
            return;
        };
        let lost = matches!(how, CloseKind::LostData { .. });
        if lost {
            let k = s.turns.unreplayed(requests_seen);
            let f = &mut self.f;
            f.report.requests.at_source += k * s.copies.len() as u64;
            for &(idx, gen) in &s.copies {
                match f.conns.by_handle(idx, gen) {
                    Some(c) => c.at_source += k,
                    None => f.lost += k,
                }
            }
        }
        if matches!(how, CloseKind::Shed) {
            self.shed(s.copies);
            return;
        }
        // Wait for the target's answer to the last request if the server answered it.
        let closed = s.turns.close();
        for (idx, gen) in s.copies {
            if let Some(c) = self.f.conns.by_handle(idx, gen) {
                if let (Some(d), Some((k, r))) = (c.diff.as_mut(), &closed.last) {
                    d.original(*k, Rc::clone(r));
                }
                c.queue.push_back(Item::End {
                    wait_answer: closed.wait_answer,
                    lost,
                    answer_bytes: closed.answer_bytes,
                });
                self.pump(idx, now);
            }
        }
    }
    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), T::Error> {
        Engine::step(self, events, max_wait)
    }
    fn publish(&mut self, live: &CopyCounters) {
        Engine::publish(self, live);
    }
}
