//! One captured session's turns, as every copy mode sees them: where the client's requests
//! start (the first client bytes after a server turn), the client's think time before each,
//! whether each waits for an answer, and, with `--diff`, the original server's answers cut at
//! those starts ([`crate::diff::OrigSide`]). Relay and transparent mode differ only in how a
//! request reaches the target, so this bookkeeping lives here once.

use std::rc::Rc;

use tcpkit_pace::Speed;

use crate::diff::{Differ, OrigSide, Resp};
use crate::pipeline::Pipeline;

/// How late an answer may reach a copy, past the original server's time, and still not push
/// the next request back. A copy learns of its answers later than the client did of the
/// original's: transparent mode's come through intercept (a capture, a control connection,
/// two event loops), on a real network the target is further away than the online server,
/// and the copy's event loop waits in whole milliseconds (epoll), so a think time ends up to
/// 1 ms late. Counted whole from every answer, that lateness added up request after request,
/// and a client sending 500 requests a second on one connection outran its copy for good
/// (the copy bench's transparent keep-alive 5k row: 93 % copied, every session still open at
/// the end). Up to this much comes out of the think time instead; lateness beyond it is the
/// target being slower and delays the next request, as tcpcopy's pacing does, until the
/// session is `--max-lag` behind its client (see [`ReqStart::send_at`]).
pub(crate) const ANSWER_SLACK_NS: u64 = 2_000_000;

/// The first request of a turn: how it is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReqStart {
    /// The client's think time: from the server's last byte to this request's first.
    pub think_ns: u64,
    /// From the previous request's first byte to this one's (the server's time plus the
    /// think time): None for a session's first request.
    pub since_prev_ns: Option<u64>,
    /// Sent only after the target answered (the server had a turn before it).
    pub wait_answer: bool,
}

/// When a copy sends a request, and where that request is on its client's own schedule (what
/// the next request's pace counts from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendAt {
    pub at: u64,
    pub sched: u64,
}

impl ReqStart {
    /// When a copy sends this request: the think time after the target's answer reached it
    /// (`answer_ns`), less up to [`ANSWER_SLACK_NS`] of that answer's lateness over the
    /// original; never before the answer, nor before the client's own interval from the
    /// previous request's place on the client's schedule (`sched_ns`, when there was one in
    /// this session: the client's times chained from the session's first request, not the
    /// times the copy's requests went, so neither a late turn of the loop nor a late answer
    /// is carried on to every later request). Once waiting out the think time would leave
    /// the request more than `max_lag_ns` behind that schedule, it goes at `max_lag_ns`
    /// behind it, or at the answer if that is later: the copy catches up as fast as the
    /// target answers, and stays within `max_lag_ns` of its client while the target keeps up.
    pub fn send_at(
        &self,
        answer_ns: u64,
        sched_ns: Option<u64>,
        max_lag_ns: u64,
        speed: Speed,
    ) -> SendAt {
        let think = answer_ns.saturating_add(speed.wall(self.think_ns));
        match (sched_ns, self.since_prev_ns) {
            (Some(p), Some(gap)) => {
                let on_pace = p.saturating_add(speed.wall(gap));
                let earliest = think.saturating_sub(ANSWER_SLACK_NS).max(answer_ns);
                let catch_up = on_pace.saturating_add(max_lag_ns).max(answer_ns);
                SendAt {
                    at: think.min(on_pace.max(earliest.min(catch_up))),
                    sched: on_pace,
                }
            }
            _ => SendAt {
                at: think,
                sched: think,
            },
        }
    }
}

/// What the client's bytes are to the copies.
#[derive(Debug)]
pub(crate) enum ClientBytes {
    /// Joined mid-stream and no server turn seen yet: not copied.
    Skipped,
    /// Copied; `start` when they begin a request, `answer` (with `--diff`) the original
    /// answer to the request before, with its index, for every copy; `pipelined`: HTTP/1
    /// requests that began in them before the answer to the one before ([`Pipeline`]).
    Copy {
        start: Option<ReqStart>,
        answer: Option<(u64, Rc<Resp>)>,
        pipelined: u64,
    },
}

/// How a captured session ended, for its copies ([`Turns::close`]).
#[derive(Debug)]
pub(crate) struct Closed {
    pub wait_answer: bool,
    pub answer_bytes: u64,
    /// `--diff`: the last original answer, with its index.
    pub last: Option<(u64, Rc<Resp>)>,
}

/// A session on the capture side.
#[derive(Debug)]
pub(crate) struct Turns {
    pub syn_seen: bool,
    /// Joined mid-stream and no server turn seen yet: client bytes are skipped.
    skipping: bool,
    /// The server spoke since the last request began.
    server_turn: bool,
    /// The last bytes were the client's: a request is in progress.
    in_request: bool,
    pub requests: u64,
    last_client_ts: u64,
    last_server_ts: Option<u64>,
    /// When the last request began.
    last_start_ts: Option<u64>,
    /// `--diff`: the original server's answers, cut at request starts.
    diff: Option<OrigSide>,
    /// The client's stream framed as HTTP/1 requests, for those pipelined within a turn.
    pipe: Pipeline,
    /// The server's bytes since the first request copied (lost ones included): what a copy
    /// waits for from its target before its FIN.
    answer_bytes: u64,
}

impl Turns {
    pub fn new(syn_seen: bool, differ: Option<&Differ>) -> Turns {
        Turns {
            syn_seen,
            skipping: !syn_seen,
            server_turn: false,
            in_request: false,
            requests: 0,
            last_client_ts: 0,
            last_server_ts: None,
            last_start_ts: None,
            diff: differ.map(|d| d.original(syn_seen)),
            pipe: Pipeline::default(),
            answer_bytes: 0,
        }
    }

    /// The server's bytes, captured at `ts`; returns the original latency of the request
    /// they answer when they are the first of its answer.
    pub fn server(&mut self, bytes: &[u8], ts: u64) -> Option<u64> {
        self.skipping = false;
        self.pipe.server();
        self.count_answer(bytes.len() as u64);
        let lat = self
            .in_request
            .then(|| ts.saturating_sub(self.last_client_ts));
        self.in_request = false;
        self.server_turn = true;
        self.last_server_ts = Some(ts);
        if let Some(d) = self.diff.as_mut() {
            d.server_bytes(bytes);
        }
        lat
    }

    /// `len` bytes of the server's answer the capture lost, passed over at `ts`: the server
    /// had its turn (the next client bytes start a request that waits for an answer), but
    /// when it began is not known, so no original latency; with `--diff` the answer is
    /// marked incomplete.
    pub fn server_gap(&mut self, len: u64, ts: u64) {
        self.skipping = false;
        self.pipe.server();
        self.count_answer(len);
        self.in_request = false;
        self.server_turn = true;
        self.last_server_ts = Some(ts);
        if let Some(d) = self.diff.as_mut() {
            d.server_gap(len);
        }
    }

    /// The client's bytes, captured at `ts`; think times capped at `max_think_ns`.
    pub fn client(
        &mut self,
        bytes: &[u8],
        ts: u64,
        max_think_ns: u64,
        differ: Option<&Differ>,
    ) -> ClientBytes {
        if self.skipping {
            return ClientBytes::Skipped;
        }
        let mut answer = None;
        let start = if self.in_request {
            None
        } else {
            if let (Some(d), Some(df)) = (self.diff.as_mut(), differ) {
                answer = d.request_starts(df, bytes);
            }
            let think_ns = self
                .last_server_ts
                .map_or(0, |t| ts.saturating_sub(t))
                .min(max_think_ns);
            let r = ReqStart {
                think_ns,
                // The server's time as the capture saw it, with the think time as capped.
                since_prev_ns: self.last_start_ts.map(|p| {
                    self.last_server_ts
                        .map_or(0, |t| t.saturating_sub(p))
                        .saturating_add(think_ns)
                }),
                wait_answer: self.server_turn && (self.requests > 0 || self.syn_seen),
            };
            self.last_start_ts = Some(ts);
            self.requests += 1;
            self.in_request = true;
            self.server_turn = false;
            Some(r)
        };
        self.last_client_ts = ts;
        let pipelined = self.pipe.client(bytes);
        ClientBytes::Copy {
            start,
            answer,
            pipelined,
        }
    }

    /// Requests the capture saw in this session that never reached the copies: `seen`, the
    /// reassembler's count in capture order ([`crate::reasm::Event::Close`]), less those
    /// delivered here. Only a session that lost capture data has any: they count at the
    /// source, never answered, so the loss ratio shows what the capture lost.
    pub fn unreplayed(&self, seen: u64) -> u64 {
        seen.saturating_sub(self.requests)
    }

    fn count_answer(&mut self, len: u64) {
        if self.requests > 0 {
            self.answer_bytes = self.answer_bytes.saturating_add(len);
        }
    }

    /// The session closed: whether the copies wait for the target's answer to the last
    /// request (the server answered it), the server's bytes since the first request copied,
    /// and with `--diff` that last original answer.
    pub fn close(self) -> Closed {
        Closed {
            wait_answer: self.server_turn && self.requests > 0,
            answer_bytes: self.answer_bytes,
            last: self.diff.and_then(OrigSide::close),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_start_after_server_turns_with_the_think_time_capped() {
        let mut t = Turns::new(true, None);
        let start = |c: ClientBytes| match c {
            ClientBytes::Copy { start, .. } => start,
            ClientBytes::Skipped => panic!("skipped"),
        };
        let r = start(t.client(b"GET / ", 100, u64::MAX, None)).unwrap();
        assert_eq!(r.think_ns, 0);
        assert_eq!(r.since_prev_ns, None);
        // The server spoke before the first request only if it greeted: not here.
        assert!(!r.wait_answer);
        assert_eq!(start(t.client(b"HTTP/1.1\r\n", 110, u64::MAX, None)), None);
        assert_eq!(t.server(b"200", 150), Some(40));
        assert_eq!(t.server(b" OK", 160), None);
        let r = start(t.client(b"GET /b", 1_160, 500, None)).unwrap();
        assert_eq!(r.think_ns, 500, "capped");
        // 60 of the server's and the think time as capped.
        assert_eq!(r.since_prev_ns, Some(560));
        assert!(r.wait_answer);
        assert_eq!(t.requests, 2);
        // The reassembler saw 5 request starts in all: 3 never delivered.
        assert_eq!(t.unreplayed(5), 3);
        assert_eq!(t.unreplayed(1), 0);
        // The last request was not answered: the copies do not wait for it.
        assert!(!t.close().wait_answer);
    }

    #[test]
    fn late_answers_come_out_of_the_think_time_up_to_the_slack() {
        const MS: u64 = 1_000_000;
        let r = ReqStart {
            think_ns: 19 * MS / 10,
            since_prev_ns: Some(2 * MS),
            wait_answer: true,
        };
        let one = Speed::new(1.0);
        let lag = 1_000_000_000;
        let at = |r: &ReqStart, answer, sched, speed| r.send_at(answer, sched, lag, speed).at;
        // The previous request went at 10 ms. Its answer reached the copy 0.6 ms later, where
        // the original took 0.1 ms: the client's pace holds (12 ms), not answer + think.
        assert_eq!(at(&r, 10_600_000, Some(10 * MS), one), 12 * MS);
        // A target slower by more than the slack (2 ms): the think time less the slack, and
        // never before the answer.
        assert_eq!(at(&r, 15 * MS, Some(10 * MS), one), 15 * MS);
        let long = ReqStart {
            think_ns: 300 * MS,
            since_prev_ns: Some(301 * MS),
            ..r
        };
        assert_eq!(at(&long, 410 * MS, Some(10 * MS), one), 708 * MS);
        // A target faster than the original: answer + think, as before.
        assert_eq!(at(&r, 10 * MS, Some(10 * MS), one), 11_900_000);
        // No previous request of this copy (the first, or a session joined mid-stream).
        assert_eq!(at(&r, 10_600_000, None, one), 12_500_000);
        let first = ReqStart {
            since_prev_ns: None,
            ..r
        };
        assert_eq!(at(&first, 10_600_000, Some(10 * MS), one), 12_500_000);
        // --speed 2 halves the client's times; the slack is the copy's, in wall time.
        assert_eq!(at(&r, 10_600_000, Some(10 * MS), Speed::new(2.0)), 11 * MS);
        assert_eq!(at(&r, u64::MAX - 5, Some(10 * MS), one), u64::MAX - 5);
    }

    /// A request's place on the client's schedule is the client's, whenever the copy sent
    /// it; once the think time would leave it more than --max-lag behind, the copy goes at
    /// that bound or at the answer, and so stays within it while the target keeps up.
    #[test]
    fn a_copy_falls_behind_its_client_by_max_lag_at_most() {
        const MS: u64 = 1_000_000;
        let one = Speed::new(1.0);
        // A client every 20 ms (0.3 ms server, 19.7 ms think).
        let r = ReqStart {
            think_ns: 19_700_000,
            since_prev_ns: Some(20 * MS),
            wait_answer: true,
        };
        // The schedule is the client's: 20 ms on from the last place, however late the answer.
        let s = r.send_at(500 * MS, Some(100 * MS), 50 * MS, one);
        assert_eq!(s.sched, 120 * MS);
        // 380 ms behind, the bound 50 ms: at the answer (it is later than the bound).
        assert_eq!(s.at, 500 * MS);
        // An answer 10 ms late with the copy on schedule: think less the slack, as before.
        let s = r.send_at(110_300_000 + 10 * MS, Some(100 * MS), 50 * MS, one);
        assert_eq!(s.at, 110_300_000 + 10 * MS + 19_700_000 - 2 * MS);
        // Behind by more than the bound but answered early enough: at the bound.
        let s = r.send_at(140 * MS, Some(100 * MS), 30 * MS, one);
        assert_eq!(s.at, 150 * MS);
        // Answers 3 ms late every time: with the slack alone each request went 1 ms later
        // than its client's; with the bound the copy is never more than it behind.
        let mut sched = Some(0);
        let mut sent = 0u64;
        for k in 1..=10_000u64 {
            let answer = sent + 300_000 + 3 * MS;
            let s = r.send_at(answer, sched, 50 * MS, one);
            assert!(s.at >= answer);
            assert_eq!(s.sched, k * 20 * MS);
            assert!(
                s.at <= s.sched + 50 * MS,
                "request {k}: {} behind",
                s.at - s.sched
            );
            (sent, sched) = (s.at, Some(s.sched));
        }
        assert!(
            sent >= 10_000 * 20 * MS + 49 * MS,
            "the lag reached its bound"
        );
    }

    #[test]
    fn a_mid_stream_join_skips_client_bytes_until_the_server_speaks() {
        let mut t = Turns::new(false, None);
        assert!(matches!(
            t.client(b"tail of a request", 1, u64::MAX, None),
            ClientBytes::Skipped
        ));
        t.server(b"its answer", 2);
        let ClientBytes::Copy { start: Some(r), .. } = t.client(b"GET /", 3, u64::MAX, None) else {
            panic!("not a request start");
        };
        // Joined mid-stream, the first whole request does not wait for the answer before it.
        assert!(!r.wait_answer);
        t.server(b"answer", 4);
        assert!(t.close().wait_answer);
    }
}
