//! One captured session's turns, as every copy mode sees them: where the client's requests
//! start (the first client bytes after a server turn), the client's think time before each,
//! whether each waits for an answer, and, with `--diff`, the original server's answers cut at
//! those starts ([`crate::diff::OrigSide`]). Relay and transparent mode differ only in how a
//! request reaches the target, so this bookkeeping lives here once.

use std::rc::Rc;

use crate::diff::{Differ, OrigSide, Resp};

/// The first request of a turn: how it is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReqStart {
    /// The client's think time: from the server's last byte to this request's first.
    pub think_ns: u64,
    /// Sent only after the target answered (the server had a turn before it).
    pub wait_answer: bool,
}

/// What the client's bytes are to the copies.
#[derive(Debug)]
pub(crate) enum ClientBytes {
    /// Joined mid-stream and no server turn seen yet: not copied.
    Skipped,
    /// Copied; `start` when they begin a request, `answer` (with `--diff`) the original
    /// answer to the request before, with its index, for every copy.
    Copy {
        start: Option<ReqStart>,
        answer: Option<(u64, Rc<Resp>)>,
    },
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
    /// `--diff`: the original server's answers, cut at request starts.
    diff: Option<OrigSide>,
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
            diff: differ.map(|d| d.original(syn_seen)),
        }
    }

    /// The server's bytes, captured at `ts`; returns the original latency of the request
    /// they answer when they are the first of its answer.
    pub fn server(&mut self, bytes: &[u8], ts: u64) -> Option<u64> {
        self.skipping = false;
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
            let r = ReqStart {
                think_ns: self
                    .last_server_ts
                    .map_or(0, |t| ts.saturating_sub(t))
                    .min(max_think_ns),
                wait_answer: self.server_turn && (self.requests > 0 || self.syn_seen),
            };
            self.requests += 1;
            self.in_request = true;
            self.server_turn = false;
            Some(r)
        };
        self.last_client_ts = ts;
        ClientBytes::Copy { start, answer }
    }

    /// Requests the capture saw in this session that never reached the copies: `seen`, the
    /// reassembler's count in capture order ([`crate::reasm::Event::Close`]), less those
    /// delivered here. Only a session that lost capture data has any: they count at the
    /// source, never answered, so the loss ratio shows what the capture lost.
    pub fn unreplayed(&self, seen: u64) -> u64 {
        seen.saturating_sub(self.requests)
    }

    /// The session closed: whether the copies wait for the target's answer to the last
    /// request (the server answered it), and with `--diff` that last original answer.
    pub fn close(self) -> (bool, Option<(u64, Rc<Resp>)>) {
        let wait_answer = self.server_turn && self.requests > 0;
        (wait_answer, self.diff.and_then(OrigSide::close))
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
        // The server spoke before the first request only if it greeted: not here.
        assert!(!r.wait_answer);
        assert_eq!(start(t.client(b"HTTP/1.1\r\n", 110, u64::MAX, None)), None);
        assert_eq!(t.server(b"200", 150), Some(40));
        assert_eq!(t.server(b" OK", 160), None);
        let r = start(t.client(b"GET /b", 1_160, 500, None)).unwrap();
        assert_eq!(r.think_ns, 500, "capped");
        assert!(r.wait_answer);
        assert_eq!(t.requests, 2);
        // The reassembler saw 5 request starts in all: 3 never delivered.
        assert_eq!(t.unreplayed(5), 3);
        assert_eq!(t.unreplayed(1), 0);
        // The last request was not answered: the copies do not wait for it.
        assert!(!t.close().0);
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
        assert!(t.close().0);
    }
}
