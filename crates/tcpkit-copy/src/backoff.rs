//! The back-off every copy mode shares toward a target that is down: after a refusal, or a
//! SYN left unanswered for [`SILENT_NS`] (a host that is off or firewalled answers nothing),
//! no copy to that target tries again before an exponential delay has passed (20 ms doubling
//! to 1 s), and then only one tries — a probe — while the others wait for its result. A
//! target that is down therefore sees a trickle of SYNs, not one per production session (nor
//! their retransmissions); the first accepted connection ends the back-off for everyone.
//!
//! A target going down (refusing, or silent) and coming back is news the user hears at once,
//! not at the end of the run: each change is queued as one line ([`Backoff::take_news`]) that
//! the session front says on stderr.

use std::net::SocketAddr;

use rustc_hash::FxHashMap;

/// A SYN unanswered this long is about to need a retransmission (TCP's initial RTO is 1 s):
/// the target is silent, not slow. Judged just before the kernel's retransmission, so the
/// connections that stand back on it do not send one each.
pub(crate) const SILENT_NS: u64 = 900_000_000;

/// Why a target is held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Down {
    /// It refused (RST, or ICMP unreachable).
    Refused,
    /// It left a SYN unanswered for [`SILENT_NS`].
    Silent,
}

#[derive(Debug, Default)]
struct TargetState {
    /// Consecutive failed attempts.
    streak: u32,
    /// No attempt before this.
    next_try: u64,
    /// How the last failed attempt failed.
    last: Option<Down>,
    /// When it last accepted a connection (0: never).
    last_accept: u64,
    /// When it went down (the first failed attempt of the streak).
    down_since: u64,
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
    /// Changes of a target's state not said yet, one line each.
    news: Vec<String>,
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

    /// An attempt to `target` was refused; `why` is how (the connect's error, or a RST).
    pub fn refused(&mut self, target: SocketAddr, now: u64, why: &dyn std::fmt::Display) {
        if self.down(target) != Some(Down::Refused) {
            self.news.push(format!(
                "target {target} refused a connection ({why}): its copies count as refused, \
                 and try again one at a time until it accepts one"
            ));
        }
        self.failed(target, now, Down::Refused);
    }

    /// An attempt to `target` begun at `since` has had no answer to its SYN for
    /// [`SILENT_NS`]. True when this attempt should go on trying (the kernel, or the
    /// transparent flow, retransmits its SYN): when this is the news that holds the target back
    /// (it was not already), the others still waiting on a SYN then stand back; and when the
    /// target accepted another connection since this SYN went out, which is not silence but a
    /// SYN lost on the way (a full queue at 20k new connections a second), for TCP's own
    /// retransmission to mend: holding the target back then put thousands of copies to a
    /// target that was answering into the back-off's gate, past the end of a stopped run.
    pub fn silent(&mut self, target: SocketAddr, now: u64, since: u64) -> bool {
        if self
            .targets
            .get(&target)
            .is_some_and(|t| t.last_accept != 0 && t.last_accept >= since)
        {
            return true;
        }
        let down = self.down(target);
        if down != Some(Down::Silent) {
            self.news.push(format!(
                "target {target} left a SYN unanswered for {:.1} s (off, or a firewall \
                 dropping it?): its copies count as timeouts, and try again one at a time \
                 until it answers",
                SILENT_NS as f64 / 1e9
            ));
        }
        self.failed(target, now, Down::Silent);
        down.is_none()
    }

    fn failed(&mut self, target: SocketAddr, now: u64, how: Down) {
        let t = self.targets.entry(target).or_default();
        if t.streak == 0 {
            t.down_since = now;
        }
        t.streak = t.streak.saturating_add(1);
        t.next_try = t.next_try.max(now + backoff_ns(t.streak));
        t.last = Some(how);
    }

    /// An attempt to `target` was accepted: the back-off is over.
    pub fn accepted(&mut self, target: SocketAddr, now: u64) {
        let t = self.targets.entry(target).or_default();
        if t.streak > 0 {
            self.news.push(format!(
                "target {target} accepts connections again (down {:.1} s)",
                now.saturating_sub(t.down_since) as f64 / 1e9
            ));
        }
        t.streak = 0;
        t.next_try = 0;
        t.last = None;
        t.last_accept = now;
    }

    /// The changes not said yet, oldest first.
    pub fn take_news(&mut self) -> std::vec::Drain<'_, String> {
        self.news.drain(..)
    }

    /// How `target` failed the last attempt, if it has not accepted one since.
    pub fn down(&self, target: SocketAddr) -> Option<Down> {
        self.targets
            .get(&target)
            .filter(|t| t.streak > 0)
            .and_then(|t| t.last)
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
        b.refused(t, 0, &"a RST");
        assert_eq!(b.down(t), Some(Down::Refused));
        assert_eq!(b.gate(t, MS), Gate::Wait(20 * MS));
        // Another target is not held back.
        assert_eq!(b.gate(other, MS), Gate::Go);
        // The probe at 20 ms; everyone else waits one more step for its result.
        assert_eq!(b.gate(t, 20 * MS), Gate::Go);
        assert_eq!(b.gate(t, 21 * MS), Gate::Wait(40 * MS));
        b.refused(t, 22 * MS, &"a RST");
        assert_eq!(b.gate(t, 23 * MS), Gate::Wait(62 * MS));
        // Capped at 1 s.
        for _ in 0..20 {
            b.refused(t, 100 * MS, &"a RST");
        }
        assert_eq!(b.gate(t, 100 * MS), Gate::Wait(1100 * MS));
        // An accepted connection ends it at once.
        b.accepted(t, 100 * MS);
        assert_eq!(b.down(t), None);
        assert_eq!(b.gate(t, 101 * MS), Gate::Go);
        assert_eq!(b.gate(t, 101 * MS), Gate::Go);
    }

    #[test]
    fn a_silent_target_is_held_back_like_a_refusing_one() {
        let t: SocketAddr = "198.18.2.2:80".parse().unwrap();
        let mut b = Backoff::default();
        // The first unanswered SYN is the news; the next ones are not.
        assert!(b.silent(t, SILENT_NS, 0));
        assert_eq!(b.down(t), Some(Down::Silent));
        assert!(!b.silent(t, SILENT_NS + MS, MS));
        assert_eq!(
            b.gate(t, SILENT_NS + 2 * MS),
            Gate::Wait(SILENT_NS + 41 * MS)
        );
        // A refusal after it says refused; an accepted connection ends both.
        b.refused(t, SILENT_NS + 3 * MS, &"a RST");
        assert_eq!(b.down(t), Some(Down::Refused));
        b.accepted(t, 4 * MS);
        assert_eq!(b.down(t), None);
        assert!(
            b.silent(t, 5 * SILENT_NS, 4 * SILENT_NS),
            "news again after a recovery"
        );
    }

    #[test]
    fn a_syn_unanswered_while_the_target_accepts_others_is_lost_not_silence() {
        let t: SocketAddr = "198.18.2.2:80".parse().unwrap();
        let mut b = Backoff::default();
        // Two SYNs sent at 0; another connection accepted at 300 ms.
        b.accepted(t, 300 * MS);
        // Both keep trying (their SYNs are retransmitted), and nobody is held back.
        assert!(b.silent(t, SILENT_NS, 0));
        assert!(b.silent(t, SILENT_NS, 0));
        assert_eq!(b.down(t), None);
        assert_eq!(b.gate(t, SILENT_NS + MS), Gate::Go);
        // A SYN sent after the last accepted connection and unanswered: silence.
        assert!(b.silent(t, 2 * SILENT_NS, SILENT_NS));
        assert_eq!(b.down(t), Some(Down::Silent));
        assert!(!b.silent(t, 2 * SILENT_NS + MS, SILENT_NS + MS));
    }

    #[test]
    fn each_change_of_a_targets_state_is_news_once() {
        let t: SocketAddr = "198.18.2.2:80".parse().unwrap();
        let mut b = Backoff::default();
        let news = |b: &mut Backoff| b.take_news().collect::<Vec<_>>();
        b.accepted(t, MS);
        assert!(news(&mut b).is_empty(), "up is no news");
        b.refused(t, 10 * MS, &"Connection refused (os error 111)");
        b.refused(t, 30 * MS, &"Connection refused (os error 111)");
        assert_eq!(
            news(&mut b),
            [
                "target 198.18.2.2:80 refused a connection (Connection refused (os error 111)): \
              its copies count as refused, and try again one at a time until it accepts one"
            ]
        );
        assert!(!b.silent(t, SILENT_NS, 40 * MS));
        b.silent(t, SILENT_NS + MS, 41 * MS);
        let said = news(&mut b);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with("target 198.18.2.2:80 left a SYN unanswered for 0.9 s"),
            "{said:?}"
        );
        b.accepted(t, 2_010 * MS);
        b.accepted(t, 2_020 * MS);
        assert_eq!(
            news(&mut b),
            ["target 198.18.2.2:80 accepts connections again (down 2.0 s)"]
        );
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
