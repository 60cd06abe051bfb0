//! One direction of a TCP connection: its sequence space, the out-of-order buffer, and the
//! delivery of contiguous bytes.
//!
//! Positions are 64-bit stream offsets (0 = the first byte after the SYN, or the first byte of
//! the first segment seen when the capture joined mid-stream), so comparisons never wrap; a
//! 32-bit sequence number is mapped to an offset by its signed distance from `next_seq`, the
//! sequence number of the next byte to deliver. That is exact while segments stay within 2^30
//! of the delivery point, which any real window does (the largest scaled window is 2^30); a
//! segment further away is counted as out of window and dropped.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::TrackerStats;

/// How far ahead of the delivery point a segment may start (the largest scaled TCP window).
const MAX_AHEAD: i64 = 1 << 30;

/// Bytes charged per buffered piece on top of its payload: the `Bytes` handle, the deque slot
/// and the allocator's header. Charging it keeps a flood of 1-byte segments bounded too.
pub(crate) const PIECE_COST: usize = 64;

/// In-order payload is copied into shared blocks of this size, so delivering a segment costs a
/// copy and a reference count, not an allocation.
const BLOCK: usize = 256 * 1024;

/// Hands out `Bytes` carved from a shared block.
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    cur: BytesMut,
}

impl Blocks {
    pub(crate) fn take(&mut self, d: &[u8]) -> Bytes {
        if self.cur.capacity() - self.cur.len() < d.len() {
            // Reuses the block in place when every Bytes carved from it has been dropped
            // (the usual case: the consumer sends and drops), else starts a new one; a fresh
            // block per 256 KiB cost page faults on every block.
            self.cur.reserve(BLOCK.max(d.len()));
        }
        self.cur.extend_from_slice(d);
        self.cur.split().freeze()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.cur.capacity()
    }
}

/// A contiguous run of buffered bytes starting at stream offset `at`.
#[derive(Debug)]
struct Piece {
    at: u64,
    data: Bytes,
}

impl Piece {
    fn end(&self) -> u64 {
        self.at + self.data.len() as u64
    }
}

/// Bytes handed to the caller by [`Half::segment`], in stream order.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub seq: u32,
    pub offset: u64,
    pub bytes: Bytes,
}

/// The last delivered bytes of a direction, kept to tell an identical retransmission from a
/// conflicting one (the bytes themselves have already left with a Data event).
#[derive(Debug, Default)]
struct Tail {
    ring: Vec<u8>,
}

impl Tail {
    /// Records `d`, delivered at stream offset `at` (always the end of what was recorded).
    fn record(&mut self, cap: usize, at: u64, d: &[u8]) {
        if cap == 0 {
            return;
        }
        if self.ring.len() != cap {
            self.ring = vec![0; cap];
        }
        let skip = d.len().saturating_sub(cap);
        let (at, d) = (at + skip as u64, d.get(skip..).unwrap_or(&[]));
        let start = (at % cap as u64) as usize;
        let first = d.len().min(cap - start);
        let (a, b) = d.split_at(first);
        if let Some(dst) = self.ring.get_mut(start..start + a.len()) {
            dst.copy_from_slice(a);
        }
        if let Some(dst) = self.ring.get_mut(..b.len()) {
            dst.copy_from_slice(b);
        }
    }

    /// Counts bytes of `d` (at stream offset `at`, wholly before `delivered`) that differ from
    /// what was delivered, as far as the ring still holds it.
    fn conflicts(&self, delivered: u64, at: u64, d: &[u8]) -> u64 {
        let cap = self.ring.len() as u64;
        if cap == 0 {
            return 0;
        }
        let lo = delivered.saturating_sub(cap).max(at);
        let mut n = 0;
        let mut x = lo;
        while x < at + d.len() as u64 {
            let r = (x % cap) as usize;
            let run = (cap as usize - r).min((at + d.len() as u64 - x) as usize);
            let new = d
                .get((x - at) as usize..(x - at) as usize + run)
                .unwrap_or(&[]);
            let old = self.ring.get(r..r + run).unwrap_or(&[]);
            n += new.iter().zip(old).filter(|(a, b)| a != b).count() as u64;
            x += run as u64;
        }
        n
    }

    fn bytes(&self) -> usize {
        self.ring.len()
    }
}

/// One direction's reassembly state.
#[derive(Debug, Default)]
pub(crate) struct Half {
    started: bool,
    /// The SYN's sequence number, when the SYN was seen.
    pub isn: Option<u32>,
    /// Sequence number of stream offset `next`.
    next_seq: u32,
    /// Stream offset of the next byte to deliver.
    next: u64,
    /// Out-of-order pieces: sorted, disjoint, all starting after `next`.
    ooo: VecDeque<Piece>,
    /// Bytes charged for `ooo` (payload + [`PIECE_COST`] per piece).
    pub buffered: usize,
    fin_at: Option<u64>,
    pub fin_done: bool,
    /// Furthest position known to exist: data or FIN seen (FIN counts as one position), or
    /// acknowledged by the peer. Beyond what was delivered means a hole.
    seen_end: u64,
    /// When the current hole appeared or last shrank.
    pub hole_since: Option<u64>,
    /// Furthest position of payload seen (delivered or not): a segment reaching past it
    /// carries bytes never seen before.
    data_end: u64,
    /// Furthest position the peer acknowledged.
    acked_to: u64,
    tail: Tail,
}

impl Half {
    pub fn started(&self) -> bool {
        self.started
    }

    /// Anchors the stream: offset 0 is sequence number `seq`.
    pub fn anchor(&mut self, seq: u32) {
        self.started = true;
        self.next_seq = seq;
        self.next = 0;
    }

    /// Anchors on a SYN: its sequence number is consumed, data starts after it.
    pub fn anchor_syn(&mut self, isn: u32) {
        self.anchor(isn.wrapping_add(1));
        self.isn = Some(isn);
    }

    /// Nothing delivered or buffered yet, so re-anchoring loses nothing.
    pub fn pristine(&self) -> bool {
        self.next == 0 && self.ooo.is_empty() && self.fin_at.is_none()
    }

    /// Position consumed so far, counting a delivered FIN as one.
    fn pos(&self) -> u64 {
        self.next + u64::from(self.fin_done)
    }

    /// Sequence number of the first undelivered byte (where a hole starts).
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// Stream offset of `seq`, or `None` if it is more than 2^30 ahead or behind the
    /// stream's start.
    fn offset(&self, seq: u32) -> Option<i64> {
        let rel = i64::from(seq.wrapping_sub(self.next_seq) as i32);
        (rel <= MAX_AHEAD).then_some(self.next as i64 + rel)
    }

    /// Notes a segment of `len` payload bytes at `seq`, before it is taken; true when it
    /// carries bytes past every one seen before in this direction (not only a resend), in
    /// the order of the capture, whether or not they can be delivered.
    pub fn extends(&mut self, seq: u32, len: usize) -> bool {
        let Some(end) = self.offset(seq).map(|o| o + len as i64) else {
            return false;
        };
        if len == 0 || end <= self.data_end as i64 {
            return false;
        }
        self.data_end = end as u64;
        true
    }

    /// Whether a segment of `len` payload bytes at `seq` carries bytes past every one seen
    /// in this direction ([`Half::extends`] without noting it).
    pub fn would_extend(&self, seq: u32, len: usize) -> bool {
        self.offset(seq)
            .is_some_and(|o| len > 0 && o + len as i64 > self.data_end as i64)
    }

    pub fn has_hole(&self) -> bool {
        self.seen_end > self.pos()
    }

    pub fn memory(&self) -> usize {
        self.buffered + self.tail.bytes() + self.ooo.capacity() * std::mem::size_of::<Piece>()
    }

    /// Bytes buffered and never to be delivered (the session is ending).
    pub fn undelivered(&self) -> u64 {
        self.ooo.iter().map(|p| p.data.len() as u64).sum()
    }

    /// Releases all buffers (the session ended).
    pub fn release(&mut self) {
        self.ooo = VecDeque::new();
        self.tail = Tail::default();
        self.buffered = 0;
    }

    /// The peer acknowledged up to `ack`.
    pub fn acked(&mut self, ack: u32, now: u64) {
        if !self.started {
            return;
        }
        if let Some(a) = self.offset(ack).filter(|&a| a > 0) {
            self.seen_end = self.seen_end.max(a as u64);
            self.acked_to = self.acked_to.max(a as u64);
        }
        self.update_hole(now, false);
    }

    /// How far the peer acknowledged (stream offset; a FIN counts as one position).
    pub fn acked_to(&self) -> u64 {
        self.acked_to
    }

    /// Gives up the first hole, up to `limit` at most: the bytes that were never captured
    /// are passed over, and what was buffered after them is delivered to `out`. Returns the
    /// hole passed over, `(seq, offset, len)`; `None` when there is no hole before `limit`.
    pub fn skip_hole(
        &mut self,
        limit: u64,
        now: u64,
        recheck: usize,
        out: &mut Vec<Delivery>,
    ) -> Option<(u32, u64, u64)> {
        if !self.has_hole() {
            return None;
        }
        let end = self
            .ooo
            .front()
            .map_or(self.seen_end, |p| p.at)
            .min(self.fin_at.unwrap_or(u64::MAX))
            .min(limit);
        if end <= self.next {
            return None;
        }
        let (seq, at, len) = (self.next_seq, self.next, end - self.next);
        self.next = end;
        self.next_seq = self.next_seq.wrapping_add(len as u32);
        self.data_end = self.data_end.max(end);
        self.drain(recheck, out);
        if self.fin_at == Some(self.next) {
            self.fin_done = true;
        }
        self.update_hole(now, true);
        Some((seq, at, len))
    }

    fn update_hole(&mut self, now: u64, progressed: bool) {
        if !self.has_hole() {
            self.hole_since = None;
        } else if progressed || self.hole_since.is_none() {
            self.hole_since = Some(now);
        }
    }

    /// Takes one segment: `data` (the captured payload) at sequence number `seq`, of which the
    /// IP header declared `declared` bytes (more when the capture cut it), and a FIN after it.
    /// Appends what became deliverable to `out`, in order. First-seen bytes win: bytes that
    /// overlap delivered or buffered ones are compared, counted and dropped.
    #[expect(
        clippy::too_many_arguments,
        reason = "one segment's fields and the tracker's shared parts; a struct would only rename them"
    )]
    pub fn segment(
        &mut self,
        seq: u32,
        data: &[u8],
        declared: usize,
        fin: bool,
        now: u64,
        recheck: usize,
        blocks: &mut Blocks,
        stats: &mut TrackerStats,
        out: &mut Vec<Delivery>,
    ) {
        let Some(start) = self.offset(seq) else {
            stats.out_of_window_segments += 1;
            return;
        };
        let declared = declared.max(data.len());
        if declared > data.len() {
            stats.truncated_segments += 1;
        }
        // Bytes before the stream's start (a retransmission older than where we joined) are
        // not part of the stream.
        let skip = usize::try_from((-start).max(0)).unwrap_or(usize::MAX);
        let data = data.get(skip.min(data.len())..).unwrap_or(&[]);
        let start = start.max(0) as u64;
        let declared_end = start + (declared.saturating_sub(skip)) as u64;
        let mut end = start + data.len() as u64;

        if fin {
            match self.fin_at {
                None if declared_end >= self.next => self.fin_at = Some(declared_end),
                Some(f) if f == declared_end => {}
                _ => stats.conflicting_fins += 1,
            }
        }
        if let Some(f) = self.fin_at {
            if end > f {
                // Data past the FIN cannot be part of this stream.
                stats.conflicting_bytes += end - start.max(f);
                end = end.min(f).max(start);
            }
        }
        // The FIN takes one position after the last byte, so an ACK of it is no hole.
        let seen = if fin && self.fin_at == Some(declared_end) {
            declared_end + 1
        } else {
            declared_end.min(self.fin_at.unwrap_or(u64::MAX))
        };
        self.seen_end = self.seen_end.max(seen);

        // The part already delivered: a retransmission.
        let old_end = end.min(self.next);
        if start < old_end {
            let old = data.get(..(old_end - start) as usize).unwrap_or(&[]);
            stats.retransmitted_bytes += old.len() as u64;
            stats.conflicting_bytes += self.tail.conflicts(self.next, start, old);
        }
        let a = start.max(self.next);
        let before = self.next;
        if a < end {
            let d = data
                .get((a - start) as usize..(end - start) as usize)
                .unwrap_or(&[]);
            if a == self.next && self.ooo.front().is_none_or(|p| end <= p.at) {
                // The common case: in order and not overlapping anything buffered.
                let bytes = blocks.take(d);
                self.deliver(bytes, recheck, out);
            } else {
                if a > self.next {
                    stats.out_of_order_segments += 1;
                }
                self.insert(a, d, stats);
            }
            self.drain(recheck, out);
        }
        if self.fin_at == Some(self.next) {
            self.fin_done = true;
        }
        self.update_hole(now, self.next > before);
    }

    fn deliver(&mut self, bytes: Bytes, recheck: usize, out: &mut Vec<Delivery>) {
        self.tail.record(recheck, self.next, &bytes);
        let len = bytes.len();
        out.push(Delivery {
            seq: self.next_seq,
            offset: self.next,
            bytes,
        });
        self.next += len as u64;
        self.next_seq = self.next_seq.wrapping_add(len as u32);
    }

    fn drain(&mut self, recheck: usize, out: &mut Vec<Delivery>) {
        while self.ooo.front().is_some_and(|p| p.at == self.next) {
            if let Some(p) = self.ooo.pop_front() {
                self.buffered = self.buffered.saturating_sub(p.data.len() + PIECE_COST);
                self.deliver(p.data, recheck, out);
            }
        }
    }

    /// Buffers the parts of `d` (at offset `a`, after `next`) that no piece holds yet.
    fn insert(&mut self, a: u64, d: &[u8], stats: &mut TrackerStats) {
        let b = a + d.len() as u64;
        let slice =
            |from: u64, to: u64| d.get((from - a) as usize..(to - a) as usize).unwrap_or(&[]);
        let mut i = self.ooo.partition_point(|p| p.end() <= a);
        let mut pos = a;
        while pos < b {
            match self.ooo.get(i) {
                Some(p) if p.at <= pos => {
                    let e = b.min(p.end());
                    let held = p
                        .data
                        .get((pos - p.at) as usize..(e - p.at) as usize)
                        .unwrap_or(&[]);
                    let new = slice(pos, e);
                    stats.overlapping_bytes += new.len() as u64;
                    stats.conflicting_bytes +=
                        new.iter().zip(held).filter(|(x, y)| x != y).count() as u64;
                    pos = e;
                    i += 1;
                }
                next => {
                    let e = next.map_or(b, |p| b.min(p.at));
                    let data = Bytes::copy_from_slice(slice(pos, e));
                    self.buffered += data.len() + PIECE_COST;
                    self.ooo.insert(i, Piece { at: pos, data });
                    pos = e;
                    i += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_compares_across_the_ring_edge() {
        let mut t = Tail::default();
        let d: Vec<u8> = (0..10).collect();
        t.record(8, 0, &d); // keeps offsets 2..10
        assert_eq!(t.conflicts(10, 0, &d), 0);
        let mut w = d.clone();
        w[1] = 99; // offset 1 is no longer held: not counted
        w[3] = 99;
        w[9] = 99;
        assert_eq!(t.conflicts(10, 0, &w), 2);
        t.record(8, 10, &[10, 11, 12]);
        assert_eq!(t.conflicts(13, 7, &[7, 8, 9, 10, 11, 12]), 0);
        assert_eq!(t.conflicts(13, 7, &[7, 8, 0, 10, 0, 12]), 2);
        let off = Tail::default();
        assert_eq!(off.conflicts(13, 7, &[0; 6]), 0, "recheck 0 keeps nothing");
    }
}
