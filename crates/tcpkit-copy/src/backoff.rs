//! The back-off every copy mode shares toward a target that refuses: after a refusal, no
//! copy to that target tries again before an exponential delay has passed (20 ms doubling to
//! 1 s), and then only one tries — a probe — while the others wait for its result. A target
//! that is down therefore sees a trickle of SYNs, not one per production session (nor their
//! retransmissions); the first accepted connection ends the back-off for everyone.

use std::net::SocketAddr;

use rustc_hash::FxHashMap;

#[derive(Debug, Default)]
struct TargetState {
    /// Consecutive refusals.
    streak: u32,
    /// No attempt before this.
    next_try: u64,
}

/// What a copy about to connect (or send its SYN) may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Go ahead; when the target was refusing, this attempt is the probe.
    Go,
    /// Wait until then (a copy whose deadline comes first gives up, counted as refused).
    Wait(u64),
}

/// The delay after `streak` consecutive refusals.
pub(crate) fn backoff_ns(streak: u32) -> u64 {
    (20_000_000u64 << streak.min(16).saturating_sub(1)).min(1_000_000_000)
}

/// Per-target back-off state; targets come from the `-x` rules, so the map stays small.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    targets: FxHashMap<SocketAddr, TargetState>,
}

impl Backoff {
    /// May a copy to `target` try now? A `Go` while the target is refusing claims the probe:
    /// the next copy waits one more back-off step for its result.
    pub fn gate(&mut self, target: SocketAddr, now: u64) -> Gate {
        let t = self.targets.entry(target).or_default();
        if now < t.next_try {
            return Gate::Wait(t.next_try);
        }
        if t.streak > 0 {
            t.next_try = now + backoff_ns(t.streak);
        }
        Gate::Go
    }

    /// An attempt to `target` was refused.
    pub fn refused(&mut self, target: SocketAddr, now: u64) {
        let t = self.targets.entry(target).or_default();
        t.streak = t.streak.saturating_add(1);
        t.next_try = t.next_try.max(now + backoff_ns(t.streak));
    }

    /// An attempt to `target` was accepted: the back-off is over.
    pub fn accepted(&mut self, target: SocketAddr) {
        if let Some(t) = self.targets.get_mut(&target) {
            t.streak = 0;
            t.next_try = 0;
        }
    }

    /// `target` refused the last attempt and has not accepted one since.
    pub fn refusing(&self, target: SocketAddr) -> bool {
        self.targets.get(&target).is_some_and(|t| t.streak > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn refusals_back_off_exponentially_with_one_probe_per_step() {
        let t: SocketAddr = "198.18.2.2:80".parse().unwrap();
        let other: SocketAddr = "198.18.2.3:80".parse().unwrap();
        let mut b = Backoff::default();
        assert_eq!(b.gate(t, 0), Gate::Go);
        assert_eq!(b.gate(t, 0), Gate::Go, "no back-off before a refusal");
        b.refused(t, 0);
        assert!(b.refusing(t));
        assert_eq!(b.gate(t, MS), Gate::Wait(20 * MS));
        // Another target is not held back.
        assert_eq!(b.gate(other, MS), Gate::Go);
        // The probe at 20 ms; everyone else waits one more step for its result.
        assert_eq!(b.gate(t, 20 * MS), Gate::Go);
        assert_eq!(b.gate(t, 21 * MS), Gate::Wait(40 * MS));
        b.refused(t, 22 * MS);
        assert_eq!(b.gate(t, 23 * MS), Gate::Wait(62 * MS));
        // Capped at 1 s.
        for _ in 0..20 {
            b.refused(t, 100 * MS);
        }
        assert_eq!(b.gate(t, 100 * MS), Gate::Wait(1100 * MS));
        // An accepted connection ends it at once.
        b.accepted(t);
        assert!(!b.refusing(t));
        assert_eq!(b.gate(t, 101 * MS), Gate::Go);
        assert_eq!(b.gate(t, 101 * MS), Gate::Go);
    }

    #[test]
    fn backoff_doubles_from_20ms_to_a_second() {
        assert_eq!(backoff_ns(1), 20 * MS);
        assert_eq!(backoff_ns(2), 40 * MS);
        assert_eq!(backoff_ns(6), 640 * MS);
        assert_eq!(backoff_ns(7), 1000 * MS);
        assert_eq!(backoff_ns(u32::MAX), 1000 * MS);
    }
}
