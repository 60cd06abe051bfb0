//! When an event-loop thread wakes: a timerfd in the thread's epoll set, armed for the next
//! thing due (a send, a sweep, a reconnect), so that epoll's 1 ms timeout granularity does
//! not delay sends; set again only when what it should do changes, since timerfd_settime is
//! a syscall on the send path.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

/// While the next deadline is nearer than this, the timerfd ticks periodically instead of being
/// re-armed for every query: timerfd_settime cost ~18 % of the client's CPU at 300k q/s (hrtimer
/// cancel + start under a lock, worse on a VM), and each tick sends every query due by then in
/// one write per connection. It bounds the extra delay past the intended time at high rates.
const TICK_NS: u64 = 20_000;

/// How the timerfd is set, so that it is re-armed only when that changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    Off,
    /// One shot at this CLOCK_MONOTONIC time (ns).
    At(u64),
    /// Every `TICK_NS`.
    Tick,
}

/// One thread's wake-up timer.
#[derive(Debug)]
pub(crate) struct Wake {
    fd: TimerFd,
    armed: Armed,
}

impl Wake {
    pub(crate) fn new() -> nix::Result<Self> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        Ok(Wake {
            fd,
            armed: Armed::Off,
        })
    }

    /// The descriptor to register for readability.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_fd().as_raw_fd()
    }

    /// Arms the timer for `deadline` (CLOCK_MONOTONIC ns) and returns the timeout to poll
    /// with: none when the timer will wake the poll, zero when the deadline has passed.
    #[inline]
    pub(crate) fn until(&mut self, deadline: u64, now: u64) -> Option<Duration> {
        if deadline <= now {
            return Some(Duration::ZERO);
        }
        let want = if deadline - now < TICK_NS {
            Armed::Tick
        } else {
            Armed::At(deadline)
        };
        if want == self.armed || self.set(want) {
            self.armed = want;
            None
        } else {
            // Cannot happen with a valid fd and time; poll with a short timeout.
            self.armed = Armed::Off;
            Some(Duration::from_millis(1))
        }
    }

    /// The timer's event came, at `now`.
    #[inline]
    pub(crate) fn fired(&mut self, now: u64) {
        match self.armed {
            // A periodic timerfd is re-armed by the kernel only when read.
            Armed::Tick => {
                let mut buf = [0u8; 8];
                // SAFETY: reads 8 bytes into a local buffer from our timerfd.
                unsafe {
                    libc::read(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len());
                }
            }
            // A one-shot is not read: mio registers edge-triggered, so the expiry
            // raised this event whatever the count, and the next timerfd_settime
            // resets the count; a read would be one more syscall per wake.
            Armed::At(t) if t <= now => self.armed = Armed::Off,
            Armed::At(_) | Armed::Off => {}
        }
    }

    /// Arms the timer as `how`; false if the kernel refused.
    fn set(&self, how: Armed) -> bool {
        let ts = |ns: u64| {
            TimeSpec::new(
                (ns / 1_000_000_000) as libc::time_t,
                (ns % 1_000_000_000) as libc::c_long,
            )
        };
        match how {
            Armed::Off => self.fd.unset().is_ok(),
            Armed::At(t) => self
                .fd
                .set(
                    Expiration::OneShot(ts(t)),
                    TimerSetTimeFlags::TFD_TIMER_ABSTIME,
                )
                .is_ok(),
            Armed::Tick => self
                .fd
                .set(
                    Expiration::Interval(ts(TICK_NS)),
                    TimerSetTimeFlags::empty(),
                )
                .is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpkit_pace::now_ns;

    /// Waits for the timer to become readable, at most `ms`.
    fn readable_within(w: &Wake, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd: w.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, of our own descriptor.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    #[test]
    fn a_passed_deadline_polls_at_once_and_a_far_one_wakes_on_time() {
        let mut w = Wake::new().unwrap();
        let now = now_ns();
        assert_eq!(w.until(now, now), Some(Duration::ZERO));
        let at = now_ns() + 30_000_000;
        assert_eq!(w.until(at, now_ns()), None);
        assert!(readable_within(&w, 2_000));
        assert!(now_ns() >= at, "woke {} ns early", at - now_ns());
        w.fired(now_ns());
        assert_eq!(w.armed, Armed::Off);
    }

    #[test]
    fn a_near_deadline_ticks_until_read() {
        let mut w = Wake::new().unwrap();
        let now = now_ns();
        assert_eq!(w.until(now + TICK_NS / 2, now), None);
        assert_eq!(w.armed, Armed::Tick);
        for _ in 0..3 {
            assert!(readable_within(&w, 2_000));
            w.fired(now_ns());
            // Read: not readable again until the next tick.
            assert_eq!(w.armed, Armed::Tick);
        }
        // The same deadline again: no syscall needed, still ticking.
        let n = now_ns();
        assert_eq!(w.until(n + 1, n), None);
        assert!(readable_within(&w, 2_000));
    }
}
