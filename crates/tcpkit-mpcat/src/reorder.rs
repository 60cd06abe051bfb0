//! The receiver's reorder window: chunks arrive out of order over several connections and
//! are held in one ring of `window` bytes until the bytes before them are in, then handed out
//! in order (to the thread that writes them out). Memory is the ring and a map of the held
//! ranges, both bounded: the sender may only send bytes below `released + window` (its
//! credit, `released` being what the writer has finished with), and the map holds at most
//! `max_gaps` ranges (a peer that sends small scattered pieces is refused, not obeyed).

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

/// Why a chunk cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReorderError {
    #[error(
        "bytes {seq}..{end} lie past the window's end {limit} (the sender ignored its credit)"
    )]
    PastWindow { seq: u64, end: u64, limit: u64 },
    #[error("more than {max} separate pieces held at once (chunks far smaller than declared)")]
    TooManyGaps { max: usize },
}

/// The ring's memory, shared between the [`Reorder`] (which fills it) and the [`Piece`]s
/// handed out of it (which another thread reads): each side only ever makes slices of the
/// bytes it owns at the time, never of the whole ring.
#[derive(Debug)]
struct Ring {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the ring is plain bytes; which thread may touch which bytes is kept by `Reorder`
// (see `Piece`).
unsafe impl Send for Ring {}
// SAFETY: as for Send: no two threads are given overlapping byte ranges at once.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(len: usize) -> Ring {
        // vec![0; n] is calloc: pages the sender never fills are never touched.
        let b: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let ptr = NonNull::from(Box::leak(b)).cast::<u8>();
        huge_pages(ptr.as_ptr(), len);
        Ring { ptr, len }
    }

    /// Bytes `at..at + n` of the ring.
    ///
    /// # Safety
    /// The range lies in the ring and no one writes to it while the slice lives.
    unsafe fn bytes(&self, at: usize, n: usize) -> &[u8] {
        debug_assert!(at + n <= self.len);
        // SAFETY: in bounds of the allocation, and not written meanwhile (the caller's word).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(at), n) }
    }

    /// Bytes `at..at + n` of the ring, to fill.
    ///
    /// # Safety
    /// The range lies in the ring and no one else reads or writes it while the slice lives.
    #[expect(
        clippy::mut_from_ref,
        reason = "disjoint ranges, kept apart by Reorder"
    )]
    unsafe fn bytes_mut(&self, at: usize, n: usize) -> &mut [u8] {
        debug_assert!(at + n <= self.len);
        // SAFETY: in bounds of the allocation, and no other reference to it (the caller's
        // word).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at), n) }
    }
}

/// Asks for transparent huge pages over the whole pages of `len` bytes at `p`, before any is
/// touched: the ring is filled front to back and stays (a 16 MiB ring first touched 4 KiB at a
/// time was ~4,100 page faults, each a trap and a zeroed page, on the loop that reads the
/// sockets; in 2 MiB pages it is 8). Only a hint: where THP is off, nothing changes.
fn huge_pages(p: *mut u8, len: usize) {
    const PAGE: usize = 4096;
    let start = (p as usize).next_multiple_of(PAGE);
    let end = (p as usize + len) & !(PAGE - 1);
    if end > start {
        // SAFETY: madvise on whole pages inside an allocation we own; MADV_HUGEPAGE changes
        // how its pages are backed, not their contents. Its failure (THP off) is harmless.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: made by Box::leak of a boxed slice of this length in `new`, dropped once.
        drop(unsafe { Box::from_raw(raw) });
    }
}

/// Bytes handed out in order, to be written out (on another thread): until the writer is
/// done with them and [`Reorder::release`]s them, the window never lends their place in the
/// ring to later bytes (the credit ends a window past `released`), and nothing is put below
/// what was handed out, so no one writes them meanwhile.
#[derive(Debug)]
pub struct Piece {
    ring: Arc<Ring>,
    at: usize,
    len: usize,
}

impl Piece {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: handed out by Reorder, which writes no byte of it until it is released,
        // and that is after this piece is dropped (the writer releases what it wrote).
        unsafe { self.ring.bytes(self.at, self.len) }
    }
}

/// Bytes held out of order, and the offsets up to which everything has been handed out and
/// written out.
#[derive(Debug)]
pub struct Reorder {
    ring: Arc<Ring>,
    /// Everything below this offset has been handed out.
    written: u64,
    /// Everything below this offset has been written out: its place in the ring is free.
    released: u64,
    /// Held ranges at or above `written`: start -> end, disjoint and not touching.
    held: BTreeMap<u64, u64>,
    max_gaps: usize,
}

impl Reorder {
    /// A window of `window` bytes (at least 1) holding at most `max_gaps` separate ranges.
    pub fn new(window: usize, max_gaps: usize) -> Reorder {
        assert!(window > 0, "an empty window");
        Reorder {
            ring: Arc::new(Ring::new(window)),
            written: 0,
            released: 0,
            held: BTreeMap::new(),
            max_gaps: max_gaps.max(1),
        }
    }

    /// Everything below this offset has been handed out.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The ring's size: the most bytes beyond `released` it takes.
    pub fn window(&self) -> u64 {
        self.ring.len as u64
    }

    /// Everything below this offset has been written out ([released](Reorder::release)).
    pub fn released(&self) -> u64 {
        self.released
    }

    /// The first offset the sender may not send yet: `released + window`.
    pub fn limit(&self) -> u64 {
        self.released + self.ring.len as u64
    }

    /// The end of the furthest bytes taken so far (in order or held): an end frame that
    /// declares less is a lie about bytes already here.
    pub fn highest(&self) -> u64 {
        self.held
            .last_key_value()
            .map_or(self.written, |(_, &e)| e.max(self.written))
    }

    /// Bytes held beyond `written` (received, not yet in order).
    pub fn held_bytes(&self) -> u64 {
        self.held.iter().map(|(s, e)| e - s).sum()
    }

    /// Takes bytes `seq .. seq + data.len()`. Bytes already handed out are ignored (a chunk
    /// re-sent after its first copy arrived); bytes past the window are an error.
    pub fn insert(&mut self, seq: u64, data: &[u8]) -> Result<(), ReorderError> {
        self.check(seq, data.len() as u64)?;
        self.commit(seq, data.len() as u64)?;
        self.put(seq, data);
        Ok(())
    }

    /// Whether bytes `seq .. seq + len` may be taken: an error when they lie past the
    /// window. Checked before any of them is read into the ring.
    pub fn check(&self, seq: u64, len: u64) -> Result<(), ReorderError> {
        let end = seq + len;
        if end > self.limit() {
            return Err(ReorderError::PastWindow {
                seq,
                end,
                limit: self.limit(),
            });
        }
        Ok(())
    }

    /// Copies `data` (bytes from `seq`, [checked](Reorder::check)) into the ring without
    /// holding it yet. Bytes below `written` are skipped: their place in the ring belongs to
    /// bytes a window further on, or to a piece being written out.
    pub fn put(&mut self, seq: u64, data: &[u8]) {
        let skip = self.written.saturating_sub(seq).min(data.len() as u64) as usize;
        let (mut seq, mut data) = (seq + skip as u64, &data[skip..]);
        while !data.is_empty() {
            let slot = self.slot(seq, data.len());
            let n = slot.len();
            slot.copy_from_slice(&data[..n]);
            (seq, data) = (seq + n as u64, &data[n..]);
        }
    }

    /// The ring's bytes where `seq ..` goes, at most `len` of them (fewer where the ring
    /// wraps), for reading from a socket straight into place. `seq` must be at or above
    /// `written` and the bytes [checked](Reorder::check); they are held once
    /// [committed](Reorder::commit).
    pub fn slot(&mut self, seq: u64, len: usize) -> &mut [u8] {
        assert!(
            seq >= self.written && seq + len as u64 <= self.limit(),
            "slot {seq}+{len} outside {}..{}",
            self.written,
            self.limit()
        );
        let w = self.ring.len;
        let at = (seq % w as u64) as usize;
        let n = len.min(w - at);
        // SAFETY: in the ring; at or above `written` and below `released + window`, so not
        // a handed-out piece's bytes (those lie in released..written, a window apart from
        // anything below the limit), and borrowed from `&mut self`, so no other slot.
        unsafe { self.ring.bytes_mut(at, n) }
    }

    /// Holds bytes `seq .. seq + len`, already in the ring ([put](Reorder::put) or read into
    /// [slots](Reorder::slot)): they come out in order once the bytes before them are in.
    pub fn commit(&mut self, seq: u64, len: u64) -> Result<(), ReorderError> {
        let end = seq + len;
        if end <= self.written {
            return Ok(());
        }
        let seq = seq.max(self.written);
        // Merge [seq, end) with the ranges it touches.
        let mut start = seq;
        let mut stop = end;
        let touching = self
            .held
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= seq)
            .count();
        if self.held.len() - touching + 1 > self.max_gaps {
            return Err(ReorderError::TooManyGaps { max: self.max_gaps });
        }
        while let Some((s, e)) = self
            .held
            .range(..=stop)
            .next_back()
            .filter(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
        {
            self.held.remove(&s);
            start = start.min(s);
            stop = stop.max(e);
        }
        self.held.insert(start, stop);
        Ok(())
    }

    /// Hands out the bytes ready in order from `written` (up to the ring's wrap: call again
    /// for the rest); they count as handed out, and their place stays theirs until
    /// [released](Reorder::release).
    pub fn hand_out(&mut self) -> Option<Piece> {
        let (&s, &e) = self.held.first_key_value()?;
        if s > self.written {
            return None;
        }
        let w = self.ring.len;
        let at = (self.written % w as u64) as usize;
        let len = ((e - self.written) as usize).min(w - at);
        self.advance(len as u64);
        Some(Piece {
            ring: Arc::clone(&self.ring),
            at,
            len,
        })
    }

    /// The writer is done with the next `n` handed-out bytes: their place in the ring, and
    /// credit for the sender, are free again.
    pub fn release(&mut self, n: u64) {
        assert!(
            self.released + n <= self.written,
            "released past what was handed out"
        );
        self.released += n;
    }

    /// The bytes ready in order from `written`, as at most two slices (the ring wraps).
    pub fn ready(&self) -> (&[u8], &[u8]) {
        let Some((&s, &e)) = self.held.first_key_value() else {
            return (&[], &[]);
        };
        if s > self.written {
            return (&[], &[]);
        }
        let w = self.ring.len as u64;
        let n = (e - self.written) as usize;
        let at = (self.written % w) as usize;
        let first = n.min(self.ring.len - at);
        // SAFETY: held bytes at or above `written`: no piece holds them, and `&self` lends
        // no slot meanwhile.
        unsafe { (self.ring.bytes(at, first), self.ring.bytes(0, n - first)) }
    }

    /// Marks `n` ready bytes as handed out and written out at once (a caller that writes
    /// them itself, from [ready](Reorder::ready)); only with no piece outstanding.
    pub fn consume(&mut self, n: u64) {
        debug_assert_eq!(self.released, self.written, "pieces outstanding");
        self.advance(n);
        self.released = self.written;
    }

    /// Nothing is held or handed out: every byte taken so far is written out.
    pub fn idle(&self) -> bool {
        self.held.is_empty() && self.released == self.written
    }

    /// Counts the next `n` bytes as taken, handed out and written out at once, without
    /// their passing through the ring (a caller that wrote them itself, in order, straight
    /// from where it read them); only when [idle](Reorder::idle).
    pub fn skip(&mut self, n: u64) {
        assert!(self.idle(), "skip with bytes held or outstanding");
        self.written += n;
        self.released = self.written;
    }

    fn advance(&mut self, n: u64) {
        let Some((&s, &e)) = self.held.first_key_value() else {
            return;
        };
        debug_assert!(s <= self.written && self.written + n <= e);
        self.held.remove(&s);
        self.written += n;
        if self.written < e {
            self.held.insert(self.written, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(r: &mut Reorder, out: &mut Vec<u8>) {
        let (a, b) = r.ready();
        let n = (a.len() + b.len()) as u64;
        out.extend_from_slice(a);
        out.extend_from_slice(b);
        r.consume(n);
    }

    #[test]
    fn skipped_bytes_move_the_window_and_later_ones_land_after_them() {
        let mut r = Reorder::new(64, 4);
        assert!(r.idle());
        r.skip(100);
        assert_eq!((r.written(), r.released(), r.limit()), (100, 100, 164));
        // Bytes below the skipped end are old news; the next ones come out in order.
        r.insert(90, &[9; 10]).unwrap();
        r.insert(110, &[2; 5]).unwrap();
        assert!(!r.idle());
        r.insert(100, &[1; 10]).unwrap();
        let mut out = Vec::new();
        drain(&mut r, &mut out);
        assert_eq!(out, [[1u8; 10].as_slice(), &[2; 5]].concat());
        assert!(r.idle());
        assert!(r.insert(115, &[0; 65]).is_err(), "past the moved window");
    }

    #[test]
    #[should_panic(expected = "skip with bytes held")]
    fn skipping_past_held_bytes_is_refused() {
        let mut r = Reorder::new(64, 4);
        r.insert(10, &[1; 5]).unwrap();
        r.skip(10);
    }

    #[test]
    fn out_of_order_chunks_come_out_in_order_across_the_wrap() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut r = Reorder::new(64, 16);
        let mut out = Vec::new();
        let mut next = 0usize;
        while next < data.len() {
            // Send up to the credit in chunks of 10, the pairs swapped.
            let limit = r.limit() as usize;
            let mut chunks = Vec::new();
            let mut s = next;
            while s < limit.min(data.len()) {
                let e = (s + 10).min(limit).min(data.len());
                chunks.push((s, e));
                s = e;
            }
            next = s;
            for pair in chunks.chunks(2).rev() {
                for &(s, e) in pair.iter().rev() {
                    r.insert(s as u64, &data[s..e]).unwrap();
                }
            }
            drain(&mut r, &mut out);
        }
        assert_eq!(out, data);
        assert_eq!(r.written(), 1000);
        assert_eq!(r.held_bytes(), 0);
    }

    #[test]
    fn nothing_is_ready_before_the_first_gap_fills() {
        let mut r = Reorder::new(32, 8);
        r.insert(8, &[2; 8]).unwrap();
        assert_eq!(r.ready(), (&[][..], &[][..]));
        assert_eq!(r.held_bytes(), 8);
        r.insert(0, &[1; 8]).unwrap();
        let (a, b) = r.ready();
        assert_eq!((a.len(), b.len()), (16, 0));
        r.consume(16);
        assert_eq!(r.limit(), 48);
    }

    #[test]
    fn duplicates_and_old_bytes_are_harmless() {
        let mut r = Reorder::new(16, 4);
        r.insert(0, b"abcdefgh").unwrap();
        r.insert(4, b"efgh").unwrap();
        let mut out = Vec::new();
        drain(&mut r, &mut out);
        r.insert(0, b"abcdefgh").unwrap(); // all below written
        r.insert(6, b"ghij").unwrap(); // half below written
        drain(&mut r, &mut out);
        assert_eq!(out, b"abcdefghij");
    }

    #[test]
    fn bytes_past_the_credit_are_refused() {
        let mut r = Reorder::new(16, 4);
        assert_eq!(
            r.insert(10, &[0; 7]),
            Err(ReorderError::PastWindow {
                seq: 10,
                end: 17,
                limit: 16
            })
        );
        r.insert(10, &[0; 6]).unwrap();
    }

    /// Reads `data` into the window the way a receiver does from a socket: into slots, a few
    /// bytes per read, then committed.
    fn read_in(r: &mut Reorder, seq: u64, data: &[u8], step: usize) {
        r.check(seq, data.len() as u64).unwrap();
        let mut at = 0;
        while at < data.len() {
            let slot = r.slot(seq + at as u64, data.len() - at);
            let n = slot.len().min(step);
            slot[..n].copy_from_slice(&data[at..at + n]);
            at += n;
        }
        r.commit(seq, data.len() as u64).unwrap();
    }

    #[test]
    fn bytes_read_into_slots_come_out_in_order_across_the_wrap() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 13 % 251) as u8).collect();
        let mut r = Reorder::new(48, 16);
        let mut out = Vec::new();
        let mut next = 0usize;
        while next < data.len() {
            let limit = (r.limit() as usize).min(data.len());
            // Two pieces up to the credit, the later one first; reads of 5 bytes, so pieces
            // that straddle the ring's end are read in two slots.
            let mid = next + (limit - next) / 2;
            read_in(&mut r, mid as u64, &data[mid..limit], 5);
            assert_eq!(r.ready().0.len() + r.ready().1.len(), 0);
            read_in(&mut r, next as u64, &data[next..mid], 5);
            next = limit;
            drain(&mut r, &mut out);
        }
        assert_eq!(out, data);
        assert_eq!(r.held_bytes(), 0);
    }

    #[test]
    fn a_slot_never_holds_more_than_up_to_the_wrap() {
        let mut r = Reorder::new(16, 4);
        r.insert(0, &[1; 12]).unwrap();
        r.consume(12);
        assert_eq!(r.slot(12, 10).len(), 4);
        assert_eq!(r.slot(16, 10).len(), 10);
    }

    #[test]
    fn old_bytes_put_do_not_overwrite_the_next_window() {
        let mut r = Reorder::new(8, 4);
        r.insert(0, b"abcd").unwrap();
        let mut out = Vec::new();
        drain(&mut r, &mut out);
        // Bytes 8..10 sit where 0..2 sat; a late copy of 0..6 must not land on them.
        r.insert(8, b"ij").unwrap();
        r.insert(0, b"ABCDEF").unwrap();
        r.insert(6, b"gh").unwrap();
        drain(&mut r, &mut out);
        assert_eq!(out, b"abcdEFghij");
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_slot_below_what_was_handed_out_is_refused() {
        let mut r = Reorder::new(8, 4);
        r.insert(0, b"abcd").unwrap();
        r.consume(4);
        r.slot(2, 2);
    }

    #[test]
    fn handed_out_pieces_keep_their_place_until_released() {
        let mut r = Reorder::new(8, 4);
        r.insert(0, b"abcdef").unwrap();
        let p = r.hand_out().unwrap();
        assert_eq!(p.bytes(), b"abcdef");
        assert_eq!((r.written(), r.released(), r.limit()), (6, 0, 8));
        // The credit ends a window past what is written out, not what is handed out: bytes
        // 8..14 would land on the piece.
        assert!(r.check(8, 6).is_err());
        r.insert(6, b"gh").unwrap();
        let q = r.hand_out().unwrap();
        assert_eq!(q.bytes(), b"gh");
        assert!(r.hand_out().is_none());
        r.release(6);
        assert_eq!(
            p.bytes(),
            b"abcdef",
            "nothing written over a piece still out"
        );
        drop(p);
        assert_eq!(r.limit(), 14);
        r.insert(8, b"ijklmn").unwrap();
        assert_eq!(q.bytes(), b"gh");
        drop(q);
        r.release(2);
        let t = r.hand_out().unwrap();
        // 8..14 sits at 0..6 of the ring.
        assert_eq!(t.bytes(), b"ijklmn");
        assert_eq!(r.limit(), 16);
    }

    #[test]
    #[should_panic(expected = "released past")]
    fn more_than_was_handed_out_cannot_be_released() {
        let mut r = Reorder::new(8, 4);
        r.insert(0, b"abcd").unwrap();
        let _p = r.hand_out();
        r.release(5);
    }

    #[test]
    fn scattered_pieces_are_bounded() {
        let mut r = Reorder::new(100, 3);
        r.insert(10, &[0]).unwrap();
        r.insert(20, &[0]).unwrap();
        r.insert(30, &[0]).unwrap();
        assert_eq!(
            r.insert(40, &[0]),
            Err(ReorderError::TooManyGaps { max: 3 })
        );
        // A piece that joins two held ranges adds none.
        let mut r = Reorder::new(100, 2);
        r.insert(10, &[0; 5]).unwrap();
        r.insert(20, &[0; 5]).unwrap();
        r.insert(15, &[0; 5]).unwrap();
        assert_eq!(r.held_bytes(), 15);
    }
}
