//! The source ports of `-n` copies beyond the first, which keeps the client's own.

/// The source ports of `-n` copies: `lo..=hi`, handed out round-robin, every port whose
/// 4-tuple is in use passed over (and counted), so no two copies ever share a 4-tuple.
#[derive(Debug)]
pub(super) struct PortPool {
    lo: u16,
    hi: u16,
    next: u16,
}

impl PortPool {
    pub(super) fn new((lo, hi): (u16, u16)) -> PortPool {
        PortPool { lo, hi, next: lo }
    }

    /// `own` for a session's first copy when `taken` says it is free; otherwise the pool's
    /// next free port. Each port found taken adds one to `collisions`; None when every port
    /// of the pool is taken (the copy cannot be made).
    pub(super) fn pick(
        &mut self,
        own: u16,
        first: bool,
        taken: impl Fn(u16) -> bool,
        collisions: &mut u64,
    ) -> Option<u16> {
        if first {
            if !taken(own) {
                return Some(own);
            }
            *collisions += 1;
        }
        let n = u32::from(self.hi - self.lo) + 1;
        for _ in 0..n {
            let p = self.next.clamp(self.lo, self.hi);
            self.next = if p >= self.hi { self.lo } else { p + 1 };
            if !taken(p) {
                return Some(p);
            }
            *collisions += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_pool_skips_taken_ports_round_robin_and_says_when_it_is_exhausted() {
        let mut pool = PortPool::new((100, 103));
        let mut coll = 0;
        let none = |_: u16| false;
        // The first copy keeps the client's own port when its 4-tuple is free.
        assert_eq!(pool.pick(40_000, true, none, &mut coll), Some(40_000));
        assert_eq!(coll, 0);
        // Taken: the pool's next port instead, one collision counted.
        assert_eq!(
            pool.pick(40_000, true, |p| p == 40_000, &mut coll),
            Some(100)
        );
        assert_eq!(coll, 1);
        // Other copies take the pool round-robin, passing over (and counting) taken ports.
        let taken = |p: u16| p == 101 || p == 102;
        assert_eq!(pool.pick(40_000, false, taken, &mut coll), Some(103));
        assert_eq!(coll, 3);
        assert_eq!(
            pool.pick(40_000, false, none, &mut coll),
            Some(100),
            "wraps"
        );
        assert_eq!(pool.pick(40_000, false, none, &mut coll), Some(101));
        // A client port inside the pool collides with a copy already holding it.
        assert_eq!(pool.pick(102, true, |p| p == 102, &mut coll), Some(103));
        assert_eq!(coll, 5);
        // Every port taken: none, after one full turn (each port counted once).
        assert_eq!(pool.pick(40_000, false, |_| true, &mut coll), None);
        assert_eq!(coll, 9);
        assert_eq!(pool.pick(100, true, |_| true, &mut coll), None);
        assert_eq!(coll, 14);
        // One port freed: found wherever the turn stands.
        assert_eq!(pool.pick(40_000, false, |p| p != 102, &mut coll), Some(102));
        // A pool reaching port 65535 wraps without overflowing.
        let mut top = PortPool::new((65_534, 65_535));
        let got: Vec<_> = (0..3)
            .map(|_| top.pick(1, false, none, &mut coll))
            .collect();
        assert_eq!(got, [Some(65_534), Some(65_535), Some(65_534)]);
    }
}
