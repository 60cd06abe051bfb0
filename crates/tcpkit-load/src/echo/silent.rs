//! The connections of one event-loop thread that have not yet sent their first message, oldest
//! first: who is evicted when the server is at its connection cap, and who is past
//! `--first-timeout` once the server has been full.
//!
//! A connection is silent from its accept until its first message (echo: a byte; DNS: a whole
//! query). The slab slot of a silent connection carries a nonzero tag, and this FIFO holds one
//! 12-byte entry (slot, tag, accept time) per silent connection. When the connection speaks
//! its tag becomes 0 and its entry goes stale; when it closes its slot is emptied or reused
//! under another tag. Stale entries are not searched for (that would cost a scan per first
//! message): they are dropped when they reach the front, or all at once when they outnumber
//! the live ones. So a connection that has spoken costs nothing here, and the FIFO never holds
//! more than about twice the silent connections.

use std::collections::VecDeque;

/// Below this many entries the FIFO is not compacted: a pass over a short queue is not worth
/// saving a few bytes.
const COMPACT_MIN: usize = 64;

/// One silent connection as it was accepted. `at_ms` is milliseconds since the thread's
/// epoch, in 32 bits (ages are taken with wrapping arithmetic: right for any connection
/// younger than 49 days, which every connection the deadline or the cap ever judges is
/// while the server is under pressure; an older idle one may look young for a moment once
/// every 49 days, which only delays its deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    slot: u32,
    tag: u32,
    at_ms: u32,
}

// What a silent connection costs here, beside its slab slot.
const _: () = assert!(std::mem::size_of::<Entry>() == 12);

/// The FIFO of silent connections (see the module's documentation).
#[derive(Debug, Default)]
pub(super) struct Silent {
    fifo: VecDeque<Entry>,
    /// Connections that are silent now (each has exactly one entry that names it).
    live: usize,
    /// The last tag handed out; tags are never 0, which means "has spoken".
    last_tag: u32,
}

impl Silent {
    /// The tag for a connection being accepted: nonzero, and unique among the entries in the
    /// FIFO (a tag comes round again after 2^32 - 1 accepts, long after compaction dropped
    /// every stale entry that could carry it: the FIFO holds at most about 2 × live + 64).
    pub fn next_tag(&mut self) -> u32 {
        self.last_tag = self.last_tag.wrapping_add(1);
        if self.last_tag == 0 {
            self.last_tag = 1;
        }
        self.last_tag
    }

    /// Records a connection accepted into `slot` with `tag` at `at_ms`. `is_live(slot, tag)`
    /// says whether an entry still names a silent connection; it is asked only when the FIFO
    /// is compacted.
    pub fn push(
        &mut self,
        slot: usize,
        tag: u32,
        at_ms: u32,
        is_live: impl Fn(usize, u32) -> bool,
    ) {
        self.compact(&is_live);
        // A slab slot index fits in 32 bits: slots are bounded by the descriptor limit.
        self.fifo.push_back(Entry {
            slot: slot as u32,
            tag,
            at_ms,
        });
        self.live += 1;
    }

    /// Drops the stale entries once they are half the FIFO or more: a pass over it then costs
    /// at most two entries' worth per entry gone stale since the last one.
    fn compact(&mut self, is_live: &impl Fn(usize, u32) -> bool) {
        if self.fifo.len() >= COMPACT_MIN && self.fifo.len() >= 2 * self.live {
            self.fifo.retain(|e| is_live(e.slot as usize, e.tag));
            self.shrink();
        }
    }

    /// Between floods (called on the loop's tick): without new accepts, nothing else would
    /// drop the entries of connections that spoke since, nor give back what a flood grew.
    pub fn tidy(&mut self, is_live: impl Fn(usize, u32) -> bool) {
        self.compact(&is_live);
        self.shrink();
    }

    /// A silent connection spoke, or was closed: one fewer live entry.
    pub fn left(&mut self) {
        self.live = self.live.saturating_sub(1);
    }

    /// Silent connections now.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.live
    }

    /// Entries held, live or stale (for tests and the bound on memory).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.fifo.len()
    }

    /// Takes the oldest silent connection out of the FIFO and returns its slot, if there is
    /// one and (with `older_than`) if it was accepted at least that many milliseconds before
    /// `now_ms`. Stale entries met on the way are dropped. The caller closes the connection
    /// (and calls [`Silent::left`]).
    pub fn pop_oldest(
        &mut self,
        now_ms: u32,
        older_than: Option<u32>,
        is_live: impl Fn(usize, u32) -> bool,
    ) -> Option<usize> {
        while let Some(e) = self.fifo.front().copied() {
            if !is_live(e.slot as usize, e.tag) {
                self.fifo.pop_front();
                continue;
            }
            if older_than.is_some_and(|limit| now_ms.wrapping_sub(e.at_ms) < limit) {
                return None;
            }
            self.fifo.pop_front();
            return Some(e.slot as usize);
        }
        None
    }

    /// Gives back memory a past flood grew, keeping room to grow again.
    fn shrink(&mut self) {
        if self.fifo.capacity() > 4 * self.fifo.len() + COMPACT_MIN {
            self.fifo.shrink_to(2 * self.fifo.len() + COMPACT_MIN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// A slab stand-in: slot → tag (0 once the connection spoke), absent when closed.
    #[derive(Default)]
    struct Model {
        slots: RefCell<HashMap<usize, u32>>,
        next_slot: usize,
        free: Vec<usize>,
        /// Silent connections in accept order, (slot, tag, at): what the FIFO must agree with.
        order: Vec<(usize, u32, u32)>,
    }

    impl Model {
        fn live(&self) -> impl Fn(usize, u32) -> bool + '_ {
            |slot, tag| self.slots.borrow().get(&slot) == Some(&tag)
        }

        fn accept(&mut self, s: &mut Silent, at: u32) -> usize {
            let slot = self.free.pop().unwrap_or_else(|| {
                self.next_slot += 1;
                self.next_slot - 1
            });
            let tag = s.next_tag();
            self.slots.borrow_mut().insert(slot, tag);
            s.push(slot, tag, at, self.live());
            self.order.push((slot, tag, at));
            slot
        }

        fn speak(&mut self, s: &mut Silent, slot: usize) {
            let mut m = self.slots.borrow_mut();
            let t = m.get_mut(&slot).unwrap();
            if *t != 0 {
                *t = 0;
                s.left();
            }
            self.order.retain(|o| o.0 != slot);
        }

        fn close(&mut self, s: &mut Silent, slot: usize) {
            if self.slots.borrow_mut().remove(&slot).unwrap() != 0 {
                s.left();
            }
            self.free.push(slot);
            self.order.retain(|o| o.0 != slot);
        }
    }

    #[test]
    fn evicts_the_oldest_silent_connection_skipping_those_that_spoke_or_left() {
        let mut s = Silent::default();
        let mut m = Model::default();
        let a = m.accept(&mut s, 10);
        let b = m.accept(&mut s, 20);
        let c = m.accept(&mut s, 30);
        let d = m.accept(&mut s, 40);
        m.speak(&mut s, a);
        m.close(&mut s, b);
        // b's slot is reused by a new silent connection: its old entry must not name it.
        let e = m.accept(&mut s, 50);
        assert_eq!(e, b);
        assert_eq!(s.live(), 3);
        assert_eq!(s.pop_oldest(60, None, m.live()), Some(c));
        m.close(&mut s, c);
        assert_eq!(s.pop_oldest(60, None, m.live()), Some(d));
        m.close(&mut s, d);
        assert_eq!(s.pop_oldest(60, None, m.live()), Some(e));
        m.close(&mut s, e);
        assert_eq!(s.pop_oldest(60, None, m.live()), None);
        assert_eq!(s.live(), 0);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn the_deadline_takes_only_connections_older_than_it_in_order() {
        let mut s = Silent::default();
        let mut m = Model::default();
        let old: Vec<usize> = (0..5).map(|i| m.accept(&mut s, 1000 + i)).collect();
        let young = m.accept(&mut s, 5000);
        let mut got = Vec::new();
        while let Some(slot) = s.pop_oldest(6000, Some(2000), m.live()) {
            got.push(slot);
            m.close(&mut s, slot);
        }
        assert_eq!(got, old);
        // The young one stays, and is still first in line for the cap.
        assert_eq!(s.pop_oldest(6000, None, m.live()), Some(young));
    }

    #[test]
    fn ages_survive_the_32_bit_millisecond_clock_wrapping() {
        let mut s = Silent::default();
        let mut m = Model::default();
        let a = m.accept(&mut s, u32::MAX - 500);
        // 1501 ms later the clock reads 1000.
        assert_eq!(s.pop_oldest(1000, Some(2000), m.live()), None);
        assert_eq!(s.pop_oldest(1000, Some(1500), m.live()), Some(a));
    }

    #[test]
    fn tags_are_never_zero_even_when_they_wrap() {
        let mut s = Silent {
            last_tag: u32::MAX - 1,
            ..Silent::default()
        };
        assert_eq!(s.next_tag(), u32::MAX);
        assert_eq!(s.next_tag(), 1);
    }

    /// Connections that speak at once (every honest client) leave stale entries behind a
    /// silent one that never speaks (a `load --hold` connection, or a probe): the FIFO must
    /// not grow with the number of connections accepted, only with the silent ones.
    #[test]
    fn stale_entries_do_not_accumulate_behind_a_connection_that_never_speaks() {
        let mut s = Silent::default();
        let mut m = Model::default();
        let forever = m.accept(&mut s, 0);
        for i in 0..100_000u32 {
            let c = m.accept(&mut s, i);
            m.speak(&mut s, c);
            if i % 3 == 0 {
                m.close(&mut s, c);
            }
            assert!(
                s.len() <= 2 * s.live() + COMPACT_MIN + 1,
                "{} entries",
                s.len()
            );
        }
        assert_eq!(s.live(), 1);
        assert!(
            s.fifo.capacity() <= 4 * COMPACT_MIN,
            "{}",
            s.fifo.capacity()
        );
        assert_eq!(s.pop_oldest(0, None, m.live()), Some(forever));
    }

    /// 10,000 connections that all spoke, and no accept since: the tick's tidy gives their
    /// entries and the memory back.
    #[test]
    fn connections_that_spoke_cost_nothing_once_tidied() {
        let mut s = Silent::default();
        let mut m = Model::default();
        let slots: Vec<usize> = (0..10_000).map(|i| m.accept(&mut s, i)).collect();
        assert!(s.fifo.capacity() >= 10_000);
        for slot in slots {
            m.speak(&mut s, slot);
        }
        s.tidy(m.live());
        assert_eq!((s.len(), s.live()), (0, 0));
        assert!(s.fifo.capacity() <= COMPACT_MIN, "{}", s.fifo.capacity());
    }

    /// Random accepts, first messages, closes, evictions and deadlines against the model: the
    /// FIFO always gives the oldest silent connection, never one that spoke or left.
    #[test]
    fn agrees_with_a_model_under_random_operations() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut s = Silent::default();
        let mut m = Model::default();
        let mut now = 0u32;
        for _ in 0..50_000 {
            now = now.wrapping_add((next() % 3) as u32);
            let open: Vec<usize> = m.slots.borrow().keys().copied().collect();
            match next() % 10 {
                0..=3 => {
                    m.accept(&mut s, now);
                }
                4 | 5 if !open.is_empty() => {
                    let slot = open[(next() as usize) % open.len()];
                    m.speak(&mut s, slot);
                }
                6 if !open.is_empty() => {
                    let slot = open[(next() as usize) % open.len()];
                    m.close(&mut s, slot);
                }
                7 => {
                    let want = m.order.first().map(|o| o.0);
                    let got = s.pop_oldest(now, None, m.live());
                    assert_eq!(got, want);
                    if let Some(slot) = got {
                        m.close(&mut s, slot);
                    }
                }
                8 => {
                    let limit = 50;
                    let want = m
                        .order
                        .first()
                        .filter(|o| now.wrapping_sub(o.2) >= limit)
                        .map(|o| o.0);
                    let got = s.pop_oldest(now, Some(limit), m.live());
                    assert_eq!(got, want);
                    if let Some(slot) = got {
                        m.close(&mut s, slot);
                    }
                }
                _ => s.tidy(m.live()),
            }
            assert_eq!(s.live(), m.order.len());
            assert!(s.len() <= 2 * s.live() + COMPACT_MIN + 1);
        }
    }
}
