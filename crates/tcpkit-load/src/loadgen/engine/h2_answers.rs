//! The worker's HTTP/2 side: the stream limit, the queries a GOAWAY handed back sent again, and
//! the answers read off an HTTP/2 connection (load --http2, --doh).

use super::*;

impl Worker<'_, '_> {
    /// `--h2-streams`: streams open at once per connection at most.
    pub(super) fn h2_limit(&self) -> u32 {
        self.sh.proto.h2.as_ref().map_or(u32::MAX, |h| h.streams)
    }

    /// Sends again, on connections with a free stream, the queries a GOAWAY handed back:
    /// each keeps its intended time (the wait counts in its latency) and is counted once in
    /// `sent`. The per-query file keeps its first line only.
    pub(super) fn resend(&mut self, now: u64) {
        let sh = self.sh;
        let Some(proto) = sh.proto.h2.as_ref() else {
            return;
        };
        while !self.retry.is_empty() {
            let Some(i) = self.pick() else {
                self.no_conn_until = now + 1_000_000;
                return;
            };
            let sent_at = now_ns();
            let sent = sent_at.saturating_sub(self.start);
            self.wbuf.clear();
            let limit = self.h2_limit();
            let c = &mut self.conns[i];
            let Some(h) = c.h2.as_mut() else { return };
            while h.can_open(limit) && c.pending.len() < MAX_PENDING {
                let Some(p) = self.retry.pop_front() else {
                    break;
                };
                let seq = c.seq;
                proto.write(h, &mut self.wbuf, seq, self.name_idx);
                self.name_idx = self.name_idx.wrapping_add(self.sh.threads);
                c.seq = c.seq.wrapping_add(1);
                c.pending.push_back(Pending {
                    seq,
                    intended: p.intended,
                    sent,
                });
            }
            self.put(i, sent_at);
        }
    }

    /// Reads `n` bytes of `rbuf` on HTTP/2 connection `i`. False when the connection was
    /// closed.
    pub(super) fn h2_read(&mut self, i: usize, n: usize, now: u64) -> bool {
        let sh = self.sh;
        let Some(proto) = sh.proto.h2.as_ref() else {
            return true;
        };
        self.outcomes.clear();
        self.handed_back.clear();
        let c = &mut self.conns[i];
        let Some(h) = c.h2.as_mut() else {
            return true;
        };
        let fed = h.feed(
            proto,
            &self.rbuf[..n],
            &mut c.wbuf,
            &mut self.outcomes,
            &mut self.handed_back,
        );
        let mut outcomes = std::mem::take(&mut self.outcomes);
        for o in outcomes.drain(..) {
            match o {
                Outcome::Answer { seq, code } => match self.take_pending(i, seq) {
                    Some(p) => self.record_answer(i, p, code, now),
                    None => self.c.unmatched += 1,
                },
                Outcome::Failed { seq, why } => {
                    if self.take_pending(i, seq).is_some() {
                        self.c.malformed += 1;
                        self.count_error(why.kind);
                        if self.first_bad.is_none() {
                            self.first_bad = Some(format!("{}: {}", why.kind, why.detail));
                        }
                    }
                }
                Outcome::GoAway { code } => {
                    // No new stream on it; it closes once what the server kept is answered,
                    // and reopens.
                    self.conns[i].retiring = true;
                    if code != tcpkit_wire::h2::code::NO_ERROR {
                        self.count_error("GOAWAY with an error");
                    }
                }
            }
        }
        self.outcomes = outcomes;
        for k in 0..self.handed_back.len() {
            let seq = self.handed_back[k];
            if let Some(p) = self.take_pending(i, seq) {
                self.retry.push_back(p);
                self.c.h2.retried += 1;
                // A stream freed: a query waiting for one may go now.
                self.no_conn_until = 0;
            }
        }
        if let Err(bad) = fed {
            self.flush(i, now);
            self.close(i, Why::Bad(bad), now);
            return false;
        }
        if !self.conns[i].wbuf.is_empty() {
            self.flush(i, now);
            if self.conns[i].state != State::Open {
                return false;
            }
        }
        let c = &self.conns[i];
        if c.retiring && c.pending.is_empty() {
            self.close(i, Why::Ours, now);
            return false;
        }
        true
    }

    pub(super) fn h2_tally(t: &mut H2Counters, h: &H2Conn) {
        t.streams_max = t.streams_max.max(h.streams_max);
        t.goaway += h.goaways;
        t.rst_stream += h.resets;
        t.window_stalls += h.window_stalls();
    }
}
