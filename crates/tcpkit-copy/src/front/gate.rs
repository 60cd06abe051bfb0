//! The request-turn gate: when a copy may send its next request, or its FIN after the last
//! one, the same rule in every mode. A request waits for the target's answer to the one
//! before (up to `--timeout` without progress), then with `--diff` for the rest of that
//! answer, then for the think time the client had.

/// What the gate needs to know of one copy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    /// The target sent bytes since the last request started.
    pub answered: bool,
    pub last_write_ns: u64,
    pub last_rx_ns: u64,
    /// The last time the target acknowledged anything (the transport's own progress).
    pub progress_ns: u64,
    /// Bytes of the target's past a hole are known (it will resend the hole).
    pub more_due: bool,
    /// `--diff`: the answer in progress as the comparison sees it.
    pub diff: Option<DiffView>,
}

/// `--diff`'s view of the answer in progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DiffView {
    /// As long as the original (or HTTP framing says it is complete).
    pub whole: bool,
    /// An HTTP message whose framing says it is not over.
    pub partial: bool,
}

/// The gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    Go,
    /// Not yet: ask again at this time.
    Wait(u64),
    /// The target did not answer within `--timeout`.
    TimedOut,
}

/// Waiting for an answer: given up `--timeout` after the later of the last write and the
/// last progress (a target still acknowledging a long request is not silent).
fn await_answer(a: &Answer, now: u64, timeout: u64) -> Turn {
    let dl = a.last_write_ns.max(a.progress_ns) + timeout;
    if now >= dl {
        Turn::TimedOut
    } else {
        Turn::Wait(dl)
    }
}

/// With `--diff`, until when a copy waits for the rest of the answer in progress before its
/// next request or its FIN (0: no wait). When more of it is certainly due (bytes seen past a
/// hole, or an HTTP message its framing says is not over) up to `timeout` without progress;
/// when it only looks short of the original, up to a short silence
/// ([`crate::diff::SETTLE_NS`]): a target's answer may be shorter than the original.
pub(crate) fn diff_wait_until(a: &Answer, timeout: u64) -> u64 {
    let Some(d) = a.diff else {
        return 0;
    };
    if a.more_due || d.partial {
        a.last_rx_ns.max(a.progress_ns) + timeout
    } else if !d.whole {
        a.last_rx_ns + crate::diff::SETTLE_NS
    } else {
        0
    }
}

/// May a request that waits for the previous answer go now; `think_at` is when it goes once
/// answered (the client's think time after the answer, on the wall clock:
/// [`crate::turns::ReqStart::send_at`]).
pub(crate) fn request(a: &Answer, think_at: u64, now: u64, timeout: u64) -> Turn {
    if !a.answered {
        return await_answer(a, now, timeout);
    }
    let at = diff_wait_until(a, timeout);
    if now < at {
        return Turn::Wait(at);
    }
    if now < think_at {
        return Turn::Wait(think_at);
    }
    Turn::Go
}

/// May the copy close now, its last request answered by the original server; `unanswered`
/// requests are still waiting for the target's answer; `short`: the target has sent fewer
/// bytes than the original server did.
///
/// A FIN while the target is still answering cuts what it has not sent: nginx ends a
/// request whose client closed (EPOLLRDHUP) and resets the connection with the pipelined
/// requests behind it unread. A copy's turn moves on at the first byte of an answer, so a
/// keep-alive copy whose answers are long (64 KiB through intercept) ends with several of
/// its requests still queued at the target: 37 of 587 never reached nginx's log in one lab
/// run. So a short copy waits, as --diff's does for an answer that looks short, until the
/// target has been silent for [`crate::diff::SETTLE_NS`] (a target may answer shorter).
pub(crate) fn close(a: &Answer, unanswered: u64, short: bool, now: u64, timeout: u64) -> Turn {
    if unanswered > 0 {
        return await_answer(a, now, timeout);
    }
    // --diff: the last answer is waited for as any other.
    let mut at = diff_wait_until(a, timeout);
    if short {
        at = at.max(a.last_rx_ns + crate::diff::SETTLE_NS);
    }
    if now < at {
        Turn::Wait(at)
    } else {
        Turn::Go
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::SETTLE_NS;

    const T: u64 = 5_000_000_000;

    fn answered_at(rx: u64) -> Answer {
        Answer {
            answered: true,
            last_write_ns: 100,
            last_rx_ns: rx,
            progress_ns: 100,
            more_due: false,
            diff: None,
        }
    }

    #[test]
    fn a_request_waits_for_the_answer_up_to_the_timeout_from_the_last_progress() {
        let mut a = answered_at(0);
        a.answered = false;
        assert_eq!(request(&a, 0, 200, T), Turn::Wait(100 + T));
        assert_eq!(request(&a, 0, 100 + T, T), Turn::TimedOut);
        // The target acknowledged meanwhile: the deadline moves.
        a.progress_ns = 1_000;
        assert_eq!(request(&a, 0, 100 + T, T), Turn::Wait(1_000 + T));
    }

    #[test]
    fn then_the_think_time_from_the_answer() {
        let a = answered_at(1_000);
        assert_eq!(request(&a, 1_500, 1_200, T), Turn::Wait(1_500));
        assert_eq!(request(&a, 1_500, 1_500, T), Turn::Go);
        assert_eq!(request(&a, 1_000, 1_000, T), Turn::Go);
    }

    #[test]
    fn with_diff_an_answer_short_of_the_original_settles_and_a_partial_one_waits_longer() {
        let mut a = answered_at(1_000);
        a.diff = Some(DiffView {
            whole: true,
            partial: false,
        });
        assert_eq!(request(&a, 0, 1_000, T), Turn::Go);
        a.diff = Some(DiffView {
            whole: false,
            partial: false,
        });
        assert_eq!(request(&a, 0, 1_001, T), Turn::Wait(1_000 + SETTLE_NS));
        assert_eq!(request(&a, 0, 1_000 + SETTLE_NS, T), Turn::Go);
        a.diff = Some(DiffView {
            whole: false,
            partial: true,
        });
        assert_eq!(request(&a, 0, 1_000 + SETTLE_NS, T), Turn::Wait(1_000 + T));
        // Bytes past a hole: the rest is due, whatever the comparison thinks.
        a.diff = Some(DiffView {
            whole: true,
            partial: false,
        });
        a.more_due = true;
        assert_eq!(request(&a, 0, 2_000, T), Turn::Wait(1_000 + T));
        // Without --diff nothing is waited for beyond the answer's first bytes.
        a.diff = None;
        assert_eq!(request(&a, 0, 2_000, T), Turn::Go);
    }

    #[test]
    fn the_close_waits_for_every_answer_then_for_the_last_ones_rest() {
        let mut a = answered_at(1_000);
        assert_eq!(close(&a, 1, false, 2_000, T), Turn::Wait(100 + T));
        assert_eq!(close(&a, 1, false, 100 + T, T), Turn::TimedOut);
        assert_eq!(close(&a, 0, false, 2_000, T), Turn::Go);
        // Fewer bytes from the target than from the original server: until it is silent.
        assert_eq!(close(&a, 0, true, 2_000, T), Turn::Wait(1_000 + SETTLE_NS));
        assert_eq!(close(&a, 0, true, 1_000 + SETTLE_NS, T), Turn::Go);
        a.diff = Some(DiffView {
            whole: false,
            partial: false,
        });
        assert_eq!(close(&a, 0, false, 2_000, T), Turn::Wait(1_000 + SETTLE_NS));
        assert_eq!(close(&a, 0, false, 1_000 + SETTLE_NS, T), Turn::Go);
    }
}
