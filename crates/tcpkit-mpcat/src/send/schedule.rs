//! Scheduling: which connection takes which bytes. Chunks are cut to each connection's size
//! (adapted to what its socket took lately), handed to connections with room one per round,
//! never past the receiver's credit or the --rate-limit; a failed connection's chunks go
//! back to the front of the queue for the others, and a connection whose acknowledgements
//! stopped while the others' still come is failed at once ([`watch`]).

use std::collections::VecDeque;
use std::fs::File;
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Poll;
use tcpkit_pace::TokenBucket;

use crate::frame::{self, Frame};
use crate::{Error, PathFailure};

use super::conn::{ack_state, flush, AckState, Conn, ConnError, Sending};
use super::input::{written, Chunk, FromReader, Source};

/// How long a chunk should take to leave on its connection: a connection's chunk size is
/// about this much of what its socket took lately.
///
/// The chunk is also the cushion a socket holds beyond TCP_NOTSENT_LOWAT (a write takes it
/// whole) while the loop waits for the CPU: 10 ms gives 200 Mbit/s links 256K, the fixed size
/// that held 95 MB/s over 4 of them.
pub(super) const CHUNK_TIME: Duration = Duration::from_millis(10);

/// How often each connection's rate (and so its chunk size) is measured.
pub(super) const RATE_TICK: Duration = Duration::from_millis(100);

/// The chunk size for a connection that took `rate` bytes a second lately: about
/// [`CHUNK_TIME`] of it, as a power of two within `lo..=hi`, and no more than half of an even
/// share of the window (`window / streams / 2`), so that a small window still gives every
/// connection several chunks in flight.
pub(super) fn chunk_size(rate: f64, lo: usize, hi: usize, window: u64, streams: usize) -> usize {
    let want = (rate * CHUNK_TIME.as_secs_f64()).max(1.0) as usize;
    let share = (window / (2 * streams.max(1) as u64)).min(hi as u64) as usize;
    want.next_power_of_two().min(share).clamp(lo, hi)
}

/// Largest chunks read but not yet handed to a connection, beyond one per connection. Read
/// no further ahead than this, a chunk leaves while it is still in the CPU's cache from its
/// read and hash; read as far ahead as the window allowed (64 MiB), each left from memory,
/// and every one of the 64 blocks was a fresh allocation's page faults: on one veth the
/// sender's socket copy read cold bytes (the whole pipeline then ran at 60-70 % of socat).
/// For one connection, and for a regular file, read on the loop ([`read_ahead`]).
pub(super) const READ_AHEAD: usize = 2;

/// Bytes the loop holds unsent: [`READ_AHEAD`] largest chunks beyond one per connection.
///
/// Several connections and the reader thread (a pipe, stdin): as far as the window allows,
/// as before the bound, since over 4 x 200 Mbit/s links under other builds' load the bound
/// (6 MiB there) went with 84.5-94.0 MB/s in 6 runs against the bench's ceiling of 90.3-94.6
/// beside them, and the builds before it held 93.4-94.6; whether the bound was the cause is
/// not shown. A regular file is read on the loop the moment a connection has room, so there
/// the bound costs no wait, and reading the window ahead into buffers (64 MiB of fresh pages
/// zeroed on the loop before the first chunk left) cost the first run after the lab's set-up
/// 3 %: 4 x 200 Mbit/s, 6 runs, window 92.9 then 94.7-95.0, bound 95.2-95.4 in every run.
/// With --duration (`bounded`) too: what is read ahead when the time comes still goes out,
/// and a window of it (64 MiB, 8 s under --rate-limit 8M) would outlast the duration.
pub(super) fn read_ahead(hi: usize, conns: usize, window: u64, bounded: bool) -> usize {
    if conns > 1 && !bounded {
        window.min(usize::MAX as u64) as usize
    } else {
        hi * (conns + READ_AHEAD)
    }
}

/// The shortest silence (no acknowledgement with data out) that makes a path suspect, and
/// how often the connections' acknowledgements are looked at ([`watch`]).
pub(super) const SUSPECT_AFTER: Duration = Duration::from_millis(400);
pub(super) const WATCH_TICK: Duration = Duration::from_millis(50);

/// How long a connection with data out may go without an acknowledgement before it is
/// suspect: two of its retransmission timeouts (the first retransmission then went
/// unanswered too), at least [`SUSPECT_AFTER`], at most --path-timeout.
pub(super) fn lag_limit(rto: Duration, path_timeout: Duration) -> Duration {
    (2 * rto).max(SUSPECT_AFTER).min(path_timeout)
}

/// Whether a connection in state `a`, with data out for `out_for` (since the loop first saw
/// any), has had none of it acknowledged for longer than [`lag_limit`]. Both: a connection
/// idle for a while has its last acknowledgement long ago, and its first new segment must not
/// make it suspect before an acknowledgement could come back.
pub(super) fn lagging(a: &AckState, out_for: Duration, path_timeout: Duration) -> bool {
    a.unacked > 0 && a.since_ack.min(out_for) >= lag_limit(a.rto, path_timeout)
}

/// How late the loop may wake for the --rate-limit bucket without losing the tokens it
/// would have taken meanwhile: the bucket holds at least this much of the rate.
///
/// The bucket once held two of the smallest chunks (128K: 1.25 ms at 100 MiB/s) while the
/// loop's poll waits whole milliseconds and more on a loaded machine: every wait then found
/// the bucket full and lost the rest, and the rate fell up to 40 % short (100M gave 60.7
/// MiB/s). On this 2-core machine under a load of 12-19, 50 ms of slack still lost 5-8 % of
/// 60 MiB/s over 2 s (the sender, or the receiver it waits for, off the CPU that long): 250
/// ms holds the average there. The price: after a stall the loop catches up by at most 250 ms
/// of the rate at full speed, where iperf3's -b catches up on its whole average.
pub(super) const PACE_SLACK: Duration = Duration::from_millis(250);

/// The --rate-limit bucket for `rate` bytes a second when the smallest chunk is `lo`:
/// [`PACE_SLACK`] of the rate, and at least two of the largest pieces a chunk is cut to under
/// a limit ([`cut_size`]: two of the smallest), so one always fits beside a late wake-up.
/// It starts empty: the first bytes wait for their tokens, so the run's average is the rate
/// from its first byte, not the rate plus a burst.
pub(super) fn rate_bucket(rate: u64, lo: u32) -> TokenBucket {
    let slack = (rate as f64 * PACE_SLACK.as_secs_f64()) as u64;
    let burst = u32::try_from(slack.max(4 * u64::from(lo))).unwrap_or(u32::MAX);
    let mut b = TokenBucket::new(rate as f64, burst);
    b.try_take(0, u64::from(burst));
    b
}

/// The loop's state beside its connections.
pub(super) struct Flow {
    pub(super) unsent: VecDeque<Chunk>,
    pub(super) inflight: VecDeque<Chunk>,
    /// The receiver's credit: nothing at or past this offset may be sent.
    pub(super) limit: u64,
    pub(super) acked: u64,
    pub(super) end: Option<(u64, crate::Digest)>,
    /// The connection the end frame went out on.
    pub(super) end_sent: Option<usize>,
    /// The receiver's verdict.
    pub(super) done: Option<(u64, bool)>,
    pub(super) start: Instant,
    /// The receiver's window, and when the connections' rates were last measured.
    pub(super) window: u64,
    pub(super) tick: Instant,
    /// The smallest and largest chunk a connection takes.
    pub(super) lo: usize,
    pub(super) hi: usize,
    pub(super) failures: Vec<PathFailure>,
    pub(super) reconnects: u64,
    pub(super) resent: u64,
    /// Since when no connection has been up.
    pub(super) none_since: Option<Instant>,
    /// --rate-limit: stream bytes as tokens.
    pub(super) bucket: Option<TokenBucket>,
    /// How long until the bucket holds the next chunk, when it held too few.
    pub(super) pace_wait: Option<Duration>,
    /// Why the session cannot go on, found while writing (a file input that shrank).
    pub(super) fatal: Option<Error>,
    /// --duration stopped reading the input: the stream ends where it was cut.
    pub(super) cut: bool,
    /// The input when it is a regular file: a chunk written whole names its bytes there
    /// ([`written`]), so its buffer is read into again at once.
    pub(super) file: Option<Arc<File>>,
    /// --path-timeout, and when the connections' acknowledgements were last looked at.
    pub(super) path_timeout: Duration,
    pub(super) watched: Instant,
    /// Per connection: since when [`watch`] has seen data of it out unacknowledged, without
    /// a look that found none.
    pub(super) out_since: Vec<Option<Instant>>,
}

impl Flow {
    /// The loop's state at the start: nothing read, credit for the receiver's `window`.
    pub(super) fn new(
        cfg: &super::SendConfig,
        window: u64,
        start: Instant,
        file: Option<Arc<File>>,
    ) -> Flow {
        Flow {
            unsent: VecDeque::new(),
            inflight: VecDeque::new(),
            limit: window,
            acked: 0,
            end: None,
            end_sent: None,
            done: None,
            start,
            window,
            tick: start,
            lo: cfg.chunk_min as usize,
            hi: cfg.chunk as usize,
            failures: Vec::new(),
            reconnects: 0,
            resent: 0,
            none_since: None,
            bucket: cfg.rate_limit.map(|r| rate_bucket(r, cfg.chunk_min)),
            pace_wait: None,
            fatal: None,
            cut: false,
            file,
            path_timeout: cfg.path_timeout,
            watched: start,
            out_since: Vec::new(),
        }
    }

    /// Drops the chunks the receiver has written (their blocks go back to the reader once
    /// all of their chunks are).
    pub(super) fn release(&mut self) {
        let acked = self.acked;
        self.inflight.retain(|ch| ch.end() > acked);
    }
}

/// Connection `i` failed: it is closed, its chunks not yet written by the receiver go back
/// to the front of the queue (the others will carry them), and it is reopened later.
pub(super) fn fail_conn(poll: &Poll, i: usize, c: &mut Conn, flow: &mut Flow, why: String) {
    let Some(mut sock) = c.sock.take() else {
        return;
    };
    let _ = poll.registry().deregister(&mut sock);
    drop(sock);
    flow.failures.push(PathFailure {
        stream: i as u16,
        local: c.local.to_string(),
        peer: c.peer.to_string(),
        at: flow.start.elapsed().as_secs_f64(),
        why,
    });
    c.out.clear();
    c.out_pos = 0;
    c.in_len = 0;
    c.raw_len = 0;
    c.chan = None;
    c.writable = false;
    c.next_try = Instant::now() + Duration::from_millis(200);
    let mut again: Vec<Chunk> = Vec::new();
    if let Some(d) = c.data.take() {
        if d.pos > 0 {
            flow.resent += d.chunk.len as u64;
        }
        again.push(d.chunk);
    }
    let mut k = 0;
    while k < flow.inflight.len() {
        if flow.inflight[k].conn == i {
            if let Some(ch) = flow.inflight.remove(k) {
                flow.resent += ch.len as u64;
                again.push(ch);
            }
        } else {
            k += 1;
        }
    }
    again.sort_by_key(|ch| ch.seq);
    for ch in again.into_iter().rev() {
        flow.unsent.push_front(ch);
    }
    if flow.end_sent == Some(i) {
        flow.end_sent = None;
    }
}

/// Fails, at once, each connection whose data went unacknowledged for its [`lag_limit`]
/// while another connection is up and acknowledged: a dead link, a cable pulled. Waiting for
/// --path-timeout (TCP_USER_TIMEOUT) instead stopped every stream: the receiver delivers in
/// order, so the dead path's chunks held up everything behind them until its window was full
/// and the credit ran out. The others carry the failed one's chunks at once, it is reset
/// (so that its reconnection from the same port finds the port free) and reopened as any
/// failed path. When no connection is acknowledged (the receiver, or every link, stopped),
/// nothing is failed here: --path-timeout decides as before.
pub(super) fn watch(poll: &Poll, conns: &mut [Conn], flow: &mut Flow) {
    if flow.watched.elapsed() < WATCH_TICK || flow.done.is_some() || conns.len() < 2 {
        return;
    }
    let now = Instant::now();
    flow.watched = now;
    let states: Vec<Option<AckState>> = conns
        .iter()
        .map(|c| c.sock.as_ref().and_then(ack_state))
        .collect();
    flow.out_since.resize(conns.len(), None);
    let mut lag = vec![false; conns.len()];
    for (i, s) in states.iter().enumerate() {
        let since = &mut flow.out_since[i];
        match s {
            Some(a) if a.unacked > 0 => {
                let out_for = now.duration_since(*since.get_or_insert(now));
                lag[i] = lagging(a, out_for, flow.path_timeout);
            }
            _ => *since = None,
        }
    }
    let acked_elsewhere = states.iter().zip(&lag).any(|(s, l)| s.is_some() && !l);
    if !acked_elsewhere {
        return;
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let (true, Some(a)) = (lag[i], states[i]) else {
            continue;
        };
        if let Some(s) = c.sock.as_ref() {
            // A reset rather than a FIN queued behind unacknowledged data: the socket goes
            // at once instead of lingering on the 4-tuple the reconnection reuses.
            let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
        }
        let why = format!(
            "no acknowledgement for {} ms while the other paths' came: its chunks re-sent on them",
            a.since_ack.as_millis()
        );
        fail_conn(poll, i, c, flow, why);
    }
}

pub(super) fn unsent_bytes(flow: &Flow) -> usize {
    flow.unsent.iter().map(|c| c.len).sum()
}

/// Takes what the reader has until `ahead` bytes are unsent; true when it stopped there
/// (the reader may have more).
pub(super) fn take(rx: &mut Source, flow: &mut Flow, ahead: usize) -> Result<bool, Error> {
    let mut unsent = unsent_bytes(flow);
    while unsent < ahead {
        match rx.try_next() {
            Ok(FromReader::Chunk(c)) => {
                unsent += c.len;
                flow.unsent.push_back(c);
            }
            Ok(FromReader::End { total, hash, cut }) => {
                flow.end = Some((total, hash));
                flow.cut = cut;
            }
            Ok(FromReader::Failed(e)) => return Err(e),
            Err(TryRecvError::Empty) => return Ok(false),
            Err(TryRecvError::Disconnected) => {
                if flow.end.is_none() {
                    return Err(Error::msg("the input reader stopped"));
                }
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Each [`RATE_TICK`]: measures what each connection took since the last, and sets its chunk
/// size from that ([`chunk_size`]).
pub(super) fn adapt(conns: &mut [Conn], flow: &mut Flow) {
    let dt = flow.tick.elapsed();
    if dt < RATE_TICK || flow.lo == flow.hi {
        return;
    }
    flow.tick = Instant::now();
    let up = conns.iter().filter(|c| c.sock.is_some()).count();
    for c in conns.iter_mut() {
        let r = (c.bytes - c.bytes_then) as f64 / dt.as_secs_f64();
        c.bytes_then = c.bytes;
        c.rate = if c.rate == 0.0 { r } else { (c.rate + r) / 2.0 };
        c.size = chunk_size(c.rate, flow.lo, flow.hi, flow.window, up);
        c.size_max = c.size_max.max(c.size);
    }
}

/// Hands chunks to connections with room, one chunk per connection per round so that every
/// connection with room gets work, until the sockets are full, the credit is used, or no
/// chunk is ready; then the end frame. A connection whose write fails is failed over.
pub(super) fn fill(poll: &Poll, conns: &mut [Conn], flow: &mut Flow, rr: &mut usize) {
    let n = conns.len();
    loop {
        let mut progressed = false;
        for k in 0..n {
            let i = (*rr + k) % n;
            let c = &mut conns[i];
            if c.sock.is_none() || !c.writable {
                continue;
            }
            match flush(c, &mut flow.inflight, flow.file.as_ref()) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(ConnError::Path(why)) => {
                    fail_conn(poll, i, c, flow, why);
                    continue;
                }
                Err(ConnError::Fatal(why)) => {
                    flow.fatal = Some(why);
                    return;
                }
            }
            let take = cut_size(flow, c.size);
            if may_send(flow, take) {
                match hand_out(c, i, flow, take) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        flow.fatal = Some(e);
                        return;
                    }
                }
                progressed = true;
            } else if let (Some((total, hash)), true, None) =
                (flow.end, flow.unsent.is_empty(), flow.end_sent)
            {
                let mut b = [0u8; 64];
                let n = Frame::End { total, hash }.emit(&mut b);
                c.put(&b[..n]);
                flow.end_sent = Some(i);
                progressed = true;
            } else {
                continue;
            }
            match flush(c, &mut flow.inflight, flow.file.as_ref()) {
                Ok(_) => {}
                Err(ConnError::Path(why)) => fail_conn(poll, i, c, flow, why),
                Err(ConnError::Fatal(why)) => {
                    flow.fatal = Some(why);
                    return;
                }
            }
        }
        *rr = (*rr + 1) % n.max(1);
        if !progressed {
            return;
        }
    }
}

/// How much of the front chunk a connection whose size is `size` takes: its own size (a
/// rest smaller than the smallest chunk goes along), and never more than two of the
/// smallest under a rate limit (paced in small pieces; [`rate_bucket`] holds at least two of
/// them). 0 when nothing is unsent.
fn cut_size(flow: &Flow, size: usize) -> usize {
    let lo = flow.lo;
    flow.unsent.front().map_or(0, |ch| {
        let mut n = size.min(ch.len);
        if flow.bucket.is_some() {
            n = n.min(2 * lo);
        }
        if ch.len - n < lo {
            n = ch.len;
            if flow.bucket.is_some() && n > 2 * lo {
                n = 2 * lo;
            }
        }
        n
    })
}

/// Whether `take` bytes of the front chunk may go now: within the receiver's credit, and
/// (--rate-limit) with tokens for them; without, the loop waits for the bucket
/// (`pace_wait`).
fn may_send(flow: &mut Flow, take: usize) -> bool {
    let fits = flow
        .unsent
        .front()
        .is_some_and(|ch| ch.seq + take as u64 <= flow.limit);
    if let (true, Some(b)) = (fits, flow.bucket.as_mut()) {
        let now = flow.start.elapsed().as_nanos() as u64;
        if !b.try_take(now, take as u64) {
            flow.pace_wait = Some(Duration::from_nanos(b.time_until(now, take as u64)));
            return false;
        }
    }
    fits
}

/// Hands `take` bytes of the front chunk to connection `i` as a data frame: sealed into its
/// buffer under --psk-file, else written later straight from the chunk. False when nothing
/// was unsent; an error when the input could not be read again.
fn hand_out(c: &mut Conn, i: usize, flow: &mut Flow, take: usize) -> Result<bool, Error> {
    let Some(mut ch) = flow.unsent.pop_front() else {
        return Ok(false);
    };
    if take < ch.len {
        flow.unsent.push_front(ch.split(take));
    }
    c.bytes += ch.len as u64;
    ch.conn = i;
    let hdr = frame::data_header(ch.seq, ch.len);
    if c.chan.is_some() {
        // Records are sealed into a buffer: the copy is the encryption's own.
        c.put(&hdr);
        let mut scratch = Vec::new();
        let b = ch
            .bytes(&mut scratch)
            .map_err(|e| Error::io("read the input", e))?;
        c.put(b);
        flow.inflight.push_back(written(ch, flow.file.as_ref()));
    } else {
        c.data = Some(Sending {
            hdr,
            chunk: ch,
            pos: 0,
        });
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flow with one unsent chunk of `len` bytes at 0 (from a pipe: its buffer).
    fn flow_with(len: usize, rate: Option<u64>, window: u64) -> Flow {
        let mut cfg = crate::send::testing::config("127.0.0.1:9".parse().unwrap());
        (cfg.chunk, cfg.chunk_min, cfg.rate_limit) = (1 << 20, 64 << 10, rate);
        let mut flow = Flow::new(&cfg, window, Instant::now(), None);
        let (back, _) = std::sync::mpsc::channel();
        let buf = crate::bufpool::carve(len, 1).unwrap().pop().unwrap();
        flow.unsent.push_back(Chunk {
            seq: 0,
            src: super::super::input::Src::Mem(Arc::new(super::super::input::Block {
                buf: Some(buf),
                back,
            })),
            off: 0,
            len,
            conn: 0,
        });
        flow
    }

    #[test]
    fn a_connection_takes_its_size_and_a_small_rest_goes_along() {
        let flow = flow_with(1 << 20, None, 64 << 20);
        assert_eq!(cut_size(&flow, 256 << 10), 256 << 10);
        // 1 MiB less 1000 KiB leaves 24 KiB, under the smallest chunk: it goes along.
        assert_eq!(cut_size(&flow, 1000 << 10), 1 << 20);
        // Under a rate limit, two of the smallest at most.
        let paced = flow_with(1 << 20, Some(1 << 30), 64 << 20);
        assert_eq!(cut_size(&paced, 1 << 20), 128 << 10);
        assert_eq!(
            cut_size(
                &Flow {
                    unsent: VecDeque::new(),
                    ..flow
                },
                1 << 20
            ),
            0
        );
    }

    #[test]
    fn nothing_goes_past_the_credit_or_ahead_of_the_rate() {
        let mut flow = flow_with(1 << 20, None, 512 << 10);
        assert!(may_send(&mut flow, 512 << 10));
        assert!(
            !may_send(&mut flow, (512 << 10) + 1),
            "past the receiver's credit"
        );
        // 1 MiB/s: the bucket starts empty, so the first 128K wait their 125 ms.
        let mut paced = flow_with(1 << 20, Some(1 << 20), 64 << 20);
        assert!(!may_send(&mut paced, 128 << 10));
        let wait = paced.pace_wait.unwrap();
        assert!(
            wait > Duration::from_millis(100) && wait <= Duration::from_millis(130),
            "{wait:?}"
        );
        // A second later it holds its burst, 256K (250 ms of 1 MiB/s, and four of the
        // smallest chunks), and no more.
        paced.start -= Duration::from_secs(1);
        assert!(may_send(&mut paced, 128 << 10));
        assert!(may_send(&mut paced, 128 << 10));
        assert!(!may_send(&mut paced, 128 << 10));
    }

    /// Issue 24: the loop wakes late (a poll rounds to whole milliseconds, a loaded machine
    /// adds more); taking greedily whenever it wakes, 7 ms late each time, a bucket for 100
    /// MiB/s with the default smallest chunk (64K) still gives the rate within 1 %, from an
    /// empty start. With the old burst (two smallest chunks: 1.25 ms of the rate) it gave
    /// 128K per wake-up, 15 % of the rate.
    #[test]
    fn the_rate_holds_when_the_loop_wakes_late() {
        let rate = 100u64 << 20;
        let mut b = rate_bucket(rate, 64 << 10);
        let (mut now, mut sent) = (0u64, 0u64);
        while now < 2_000_000_000 {
            while b.try_take(now, 128 << 10) {
                sent += 128 << 10;
            }
            now += b.time_until(now, 128 << 10) + 7_000_000;
        }
        let got = sent as f64 / (now as f64 / 1e9);
        assert!((got / rate as f64 - 1.0).abs() < 0.01, "{got} of {rate}");
    }

    #[test]
    fn a_path_is_suspect_only_when_data_it_sent_long_enough_ago_is_unanswered() {
        let ms = Duration::from_millis;
        let pt = Duration::from_secs(5);
        let st = |unacked, since_ack, rto| AckState {
            unacked,
            since_ack: ms(since_ack),
            rto: ms(rto),
        };
        // Two RTOs, at least 400 ms, at most --path-timeout.
        assert_eq!(lag_limit(ms(200), pt), ms(400));
        assert_eq!(lag_limit(ms(300), pt), ms(600));
        assert_eq!(lag_limit(ms(200), ms(300)), ms(300));
        // A dead link: data out for a second, nothing acknowledged for as long.
        assert!(lagging(&st(10, 1000, 200), ms(1000), pt));
        // A live one: acknowledgements keep coming.
        assert!(!lagging(&st(10, 3, 200), ms(1000), pt));
        // Nothing out: an idle connection is never suspect, however long its silence.
        assert!(!lagging(&st(0, 9000, 200), ms(9000), pt));
        // Idle for 9 s, then a chunk 50 ms ago: its acknowledgement has not had the time.
        assert!(!lagging(&st(4, 9000, 200), ms(50), pt));
        // A slow path (300 ms RTO): 500 ms without one is not yet two of its RTOs.
        assert!(!lagging(&st(4, 500, 300), ms(500), pt));
    }

    #[test]
    fn read_ahead_is_the_window_only_for_a_pipe_over_several_connections() {
        let (hi, w) = (1 << 20, 64 << 20);
        assert_eq!(read_ahead(hi, 4, w, false), 64 << 20);
        // One connection, a regular file, or --duration: two chunks beyond one each.
        assert_eq!(read_ahead(hi, 1, w, false), 3 << 20);
        assert_eq!(read_ahead(hi, 4, w, true), 6 << 20);
    }
    #[test]
    fn chunk_sizes_follow_the_rate_within_their_bounds() {
        let (lo, hi, w) = (64 << 10, 1 << 20, 64 << 20);
        // Not measured yet, or a path that took little: the smallest.
        assert_eq!(chunk_size(0.0, lo, hi, w, 4), lo);
        assert_eq!(chunk_size(5e6, lo, hi, w, 4), lo);
        assert_eq!(chunk_size(6.25e6, lo, hi, w, 4), lo);
        // 200 Mbit/s: 250 kB in 10 ms, the next power of two.
        assert_eq!(chunk_size(25e6, lo, hi, w, 4), 256 << 10);
        // An unshaped veth: the largest.
        assert_eq!(chunk_size(900e6, lo, hi, w, 1), hi);
        // A small window shared by 8 connections: half of an eighth of it.
        assert_eq!(chunk_size(900e6, lo, hi, 4 << 20, 8), 256 << 10);
        // Never under the smallest, however small the window.
        assert_eq!(chunk_size(900e6, lo, hi, 1 << 20, 64), lo);
        // A fixed size stays fixed.
        assert_eq!(chunk_size(900e6, 4096, 4096, w, 2), 4096);
    }
}
