//! When an event-loop thread wakes, and the wait itself: epoll_pwait2(2) (Linux 5.11) with
//! the next thing due (a send, a sweep, a reconnect) as its nanosecond timeout, so that sends
//! leave on time with no syscall but the wait; on an older kernel, a timerfd in the thread's
//! epoll set armed for that time (epoll_wait's own timeout is in whole ms), set again only when
//! what it should do changes, since timerfd_settime is a syscall on the send path.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

/// On the timerfd path (kernels before 5.11): while the next deadline is nearer than this, the
/// timerfd ticks periodically instead of being re-armed for every query: timerfd_settime cost
/// ~18 % of the client's CPU at 300k q/s (hrtimer cancel + start under a lock, worse on a VM),
/// and each tick sends every query due by then in one write per connection. It bounds the
/// extra delay past the intended time at high rates.
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

/// Events one wait returns at most.
const EVENTS: usize = 1024;

/// One readiness event, as mio would read it (same flags, same meaning).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    /// The token the descriptor was registered with.
    pub token: usize,
    pub readable: bool,
    pub writable: bool,
    pub read_closed: bool,
    pub error: bool,
}

impl Ready {
    fn of(ev: &libc::epoll_event) -> Ready {
        // Copies: the struct is packed on x86-64.
        let (flags, data) = (ev.events, ev.u64);
        let has = |f: libc::c_int| flags & f as u32 != 0;
        Ready {
            token: data as usize,
            readable: has(libc::EPOLLIN | libc::EPOLLPRI),
            writable: has(libc::EPOLLOUT),
            read_closed: has(libc::EPOLLHUP) || (has(libc::EPOLLIN) && has(libc::EPOLLRDHUP)),
            error: has(libc::EPOLLERR),
        }
    }
}

/// One thread's waits: its epoll_pwait2 timeout, or (older kernels) its timerfd.
#[derive(Debug)]
pub(crate) struct Wake {
    fd: TimerFd,
    armed: Armed,
    /// epoll_pwait2 works here; cleared by the first ENOSYS or EPERM, after which the timerfd
    /// wakes.
    pwait2: bool,
    events: Vec<libc::epoll_event>,
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
            pwait2: true,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS],
        })
    }

    /// Waits on epoll set `epfd` until an event or `deadline` (CLOCK_MONOTONIC ns; `now` is
    /// the time now), and returns how many events came (read them with [`Wake::ready`]). The
    /// timerfd's own event (older kernels) is among them under the token it was registered
    /// with; hand it to [`Wake::fired`].
    pub(crate) fn wait(&mut self, epfd: RawFd, deadline: u64, now: u64) -> io::Result<usize> {
        let cap = self.events.len() as libc::c_int;
        if self.pwait2 {
            let left = deadline.saturating_sub(now);
            let ts = libc::timespec {
                tv_sec: (left / 1_000_000_000) as libc::time_t,
                tv_nsec: (left % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: the buffer holds `cap` events; the timeout is a valid timespec; no mask.
            let n = unsafe {
                libc::epoll_pwait2(epfd, self.events.as_mut_ptr(), cap, &ts, std::ptr::null())
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            // ENOSYS: before Linux 5.11; EPERM: a seccomp filter that predates the call
            // (older container runtimes' default profiles refuse unknown calls so).
            if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
                return Err(e);
            }
            self.pwait2 = false;
        }
        // Before Linux 5.11: the timerfd wakes the wait; epoll_wait's timeout only says
        // "return at once" or, if the timerfd could not be set, a ms.
        let ms = match self.until(deadline, now) {
            None => -1,
            Some(d) if d.is_zero() => 0,
            Some(d) => d.as_millis().max(1) as libc::c_int,
        };
        // SAFETY: the buffer holds `cap` events.
        let n = unsafe { libc::epoll_wait(epfd, self.events.as_mut_ptr(), cap, ms) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Event `k` of the last [`Wake::wait`].
    #[inline]
    pub(crate) fn ready(&self, k: usize) -> Ready {
        Ready::of(&self.events[k])
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

    /// An epoll set holding `w`'s timerfd (token 7) and one end of a socket pair (token 3,
    /// registered as mio registers: edge-triggered, with RDHUP), and that end, whose peer
    /// is closed.
    fn epoll_with(w: &Wake) -> (std::os::fd::OwnedFd, std::os::unix::net::UnixStream) {
        use std::os::fd::FromRawFd;
        // SAFETY: no arguments but flags; the descriptor is owned below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        // SAFETY: a new descriptor nobody else owns.
        let ep = unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) };
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        for (fd, token) in [(w.raw_fd(), 7u64), (a.as_raw_fd(), 3)] {
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
                u64: token,
            };
            // SAFETY: valid descriptors and an event on the stack.
            let rc = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
            assert_eq!(rc, 0);
        }
        drop(b);
        (ep, a)
    }

    #[test]
    fn the_wait_returns_on_time_or_with_what_is_ready_on_either_path() {
        for pwait2 in [true, false] {
            let mut w = Wake::new().unwrap();
            w.pwait2 = pwait2;
            let (ep, _a) = epoll_with(&w);
            // The closed peer's end: readable, writable and read-closed, once (edge).
            let now = now_ns();
            let n = w.wait(ep.as_raw_fd(), now + 1_000_000_000, now).unwrap();
            assert_eq!(n, 1, "pwait2 {pwait2}");
            let r = w.ready(0);
            assert_eq!(r.token, 3);
            assert!(r.readable && r.read_closed, "pwait2 {pwait2}: {r:?}");
            // Nothing new: the wait ends at the deadline, not before.
            let now = now_ns();
            let at = now + 3_000_000;
            let mut n = w.wait(ep.as_raw_fd(), at, now).unwrap();
            let mut woke = now_ns();
            if n == 1 && w.ready(0).token == 7 {
                // The timerfd path: its event is the wake.
                w.fired(woke);
                n = 0;
            }
            assert_eq!(n, 0, "pwait2 {pwait2}");
            assert!(woke >= at, "pwait2 {pwait2}: woke {} ns early", at - woke);
            // A passed deadline does not wait.
            woke = now_ns();
            assert_eq!(w.wait(ep.as_raw_fd(), woke - 1, woke).unwrap(), 0);
            assert!(now_ns() - woke < 50_000_000, "pwait2 {pwait2}");
        }
    }
}
