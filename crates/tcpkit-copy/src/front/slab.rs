//! The copies of every mode, by slot: a slot is reused once its copy ended, so each has a
//! generation, and a handle `(slot, generation)` held by a session or a timer that outlived
//! its copy finds nothing rather than the slot's next tenant. One timer per copy: the timer
//! heap holds `(at, slot, generation)` and an entry counts only while it is its copy's
//! current timer.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Slots, their generations, their timers.
#[derive(Debug)]
pub(crate) struct Slab<C> {
    items: Vec<Option<C>>,
    gens: Vec<u32>,
    /// Each slot's pending timer (0: none).
    timer_at: Vec<u64>,
    free: Vec<usize>,
    timers: BinaryHeap<Reverse<(u64, usize, u32)>>,
}

impl<C> Default for Slab<C> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            gens: Vec::new(),
            timer_at: Vec::new(),
            free: Vec::new(),
            timers: BinaryHeap::new(),
        }
    }
}

impl<C> Slab<C> {
    /// Puts `c` in a free slot: its handle.
    pub(crate) fn insert(&mut self, c: C) -> (usize, u32) {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.items.push(None);
            self.gens.push(0);
            self.timer_at.push(0);
            self.items.len() - 1
        });
        self.gens[idx] = self.gens[idx].wrapping_add(1);
        self.timer_at[idx] = 0;
        self.items[idx] = Some(c);
        (idx, self.gens[idx])
    }

    /// The copy in slot `idx`, if any.
    pub(crate) fn get(&self, idx: usize) -> Option<&C> {
        self.items.get(idx).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, idx: usize) -> Option<&mut C> {
        self.items.get_mut(idx).and_then(Option::as_mut)
    }

    /// The copy a handle names, if it is still there.
    pub(crate) fn by_handle(&mut self, idx: usize, gen: u32) -> Option<&mut C> {
        if self.gens.get(idx) != Some(&gen) {
            return None;
        }
        self.get_mut(idx)
    }

    /// Takes the copy out of slot `idx`; the slot is free again.
    pub(crate) fn remove(&mut self, idx: usize) -> Option<C> {
        let c = self.items.get_mut(idx)?.take()?;
        self.timer_at[idx] = 0;
        self.free.push(idx);
        Some(c)
    }

    /// Every copy, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &C> {
        self.items.iter().flatten()
    }

    /// One past the highest slot ever used (every copy's slot is below it).
    pub(crate) fn slots(&self) -> usize {
        self.items.len()
    }

    /// Wakes copy `idx` at `at` (nanoseconds, the monotonic clock) unless a timer of its own
    /// comes first. The earliest wake-up is kept: a copy can wait for several things at once
    /// (transparent mode's retransmission timeout and the think time before the next
    /// request), each arm naming one, and a later arm must not cancel an earlier need. A
    /// wake-up that comes too early costs one pump that arms again. A pending timer already
    /// due (`<= now`) is being served by the pump that arms, so it is replaced.
    pub(crate) fn arm(&mut self, idx: usize, at: u64, now: u64) {
        if at == 0 || self.get(idx).is_none() {
            return;
        }
        let t = self.timer_at[idx];
        if t == 0 || at < t || t <= now {
            self.timer_at[idx] = at;
            self.timers.push(Reverse((at, idx, self.gens[idx])));
        }
    }

    /// The next copy whose timer is due at `now`, its timer cleared; stale entries (a copy
    /// gone, or armed again) are dropped on the way.
    pub(crate) fn next_due(&mut self, now: u64) -> Option<usize> {
        while let Some(Reverse((at, idx, gen))) = self.timers.peek().copied() {
            if at > now {
                return None;
            }
            self.timers.pop();
            if self.gens[idx] == gen && self.timer_at[idx] == at && self.items[idx].is_some() {
                self.timer_at[idx] = 0;
                return Some(idx);
            }
        }
        None
    }

    /// When the earliest timer entry is due (it may be stale: the wait it bounds only ends
    /// early).
    pub(crate) fn next_at(&self) -> Option<u64> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_outlives_its_copy_without_reaching_the_next_tenant() {
        let mut s: Slab<&str> = Slab::default();
        let (a, ga) = s.insert("a");
        assert_eq!(s.by_handle(a, ga).copied(), Some("a"));
        assert_eq!(s.remove(a), Some("a"));
        assert!(s.by_handle(a, ga).is_none());
        let (b, gb) = s.insert("b");
        assert_eq!(b, a, "the free slot is reused");
        assert_ne!(gb, ga);
        assert!(s.by_handle(a, ga).is_none());
        assert_eq!(s.by_handle(b, gb).copied(), Some("b"));
        assert_eq!(s.remove(a), Some("b"));
        assert_eq!(s.remove(a), None);
    }

    #[test]
    fn the_earliest_wake_up_is_kept_and_fires_once() {
        let mut s: Slab<u8> = Slab::default();
        let (i, _) = s.insert(1);
        s.arm(i, 100, 0);
        // A later need does not cancel the earlier one.
        s.arm(i, 300, 0);
        assert_eq!(s.next_at(), Some(100));
        assert_eq!(s.next_due(99), None);
        assert_eq!(s.next_due(100), Some(i));
        // Fired: cleared, and the later entry is stale.
        assert_eq!(s.next_due(1000), None);
        // An earlier need replaces a later one; the later entry is then stale.
        s.arm(i, 500, 100);
        s.arm(i, 200, 100);
        assert_eq!(s.next_due(1000), Some(i));
        assert_eq!(s.next_due(1000), None);
    }

    #[test]
    fn a_due_timer_is_replaced_by_the_pump_that_serves_it() {
        let mut s: Slab<u8> = Slab::default();
        let (i, _) = s.insert(1);
        s.arm(i, 100, 0);
        s.arm(i, 400, 150);
        assert_eq!(s.next_due(399), None);
        assert_eq!(s.next_due(400), Some(i));
    }

    #[test]
    fn timers_of_a_gone_copy_fire_nothing_even_in_a_reused_slot() {
        let mut s: Slab<u8> = Slab::default();
        let (i, _) = s.insert(1);
        s.arm(i, 100, 0);
        s.remove(i);
        assert_eq!(s.next_due(1000), None);
        let (j, _) = s.insert(2);
        assert_eq!(j, i);
        s.arm(j, 100, 0);
        s.arm(j, 50, 0);
        assert_eq!(s.next_due(1000), Some(j));
        assert_eq!(s.next_due(1000), None);
        // Arming an empty slot does nothing.
        s.remove(j);
        s.arm(j, 10, 0);
        assert_eq!(s.next_at(), None);
    }
}
