//! The live view of a long run: a progress line on stderr when stderr is a terminal, and
//! `--stats N` lines on stderr every N seconds in any case (stdout is the report's alone, so
//! `--json` output stays one document). Every job's live line starts the same way: the
//! elapsed time, `[   12.0s]`. Both run on their own thread and
//! read shared atomics, so the hot path only does relaxed adds.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Counters the workers bump (relaxed) and the monitor reads.
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Frames sent whole so far.
    pub packets: AtomicU64,
    /// Bytes of those frames.
    pub bytes: AtomicU64,
    /// Frames that could not be sent so far.
    pub failed: AtomicU64,
    /// The loop being sent, from 1 (0 before the first packet).
    pub loop_no: AtomicU64,
    /// Packets in one loop, known once every sender has started its second loop (0 until
    /// then): what the live line's percent and ETA are computed from when the run is a number
    /// of loops.
    pub loop_packets: AtomicU64,
    /// Senders that have added their first loop's frames to `loop_packets`.
    pub loop_sized: AtomicU64,
    /// Senders in the run (each sends its share of every loop); 0 is taken as 1.
    pub senders: AtomicU64,
}

impl LiveCounters {
    /// Counts a batch sent: `packets` frames of `bytes` bytes in all.
    #[inline]
    pub fn add(&self, packets: u64, bytes: u64) {
        self.packets.fetch_add(packets, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A sender starts loop `n` (0-based), having offered `offered` frames in the loop before
    /// (sent, failed or still batched: counted by the sender itself, since what `packets`
    /// holds at that moment is short of a batch not yet flushed).
    pub fn loop_started(&self, n: u64, offered: u64) {
        self.loop_no.fetch_max(n + 1, Ordering::Relaxed);
        if n == 1 {
            self.loop_packets.fetch_add(offered, Ordering::Relaxed);
            self.loop_sized.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Packets in one loop over all senders, once every sender has told.
    pub fn one_loop(&self) -> Option<u64> {
        let senders = self.senders.load(Ordering::Relaxed).max(1);
        let n = self.loop_packets.load(Ordering::Relaxed);
        (self.loop_sized.load(Ordering::Relaxed) >= senders && n > 0).then_some(n)
    }
}

/// What the live view draws on stderr.
#[derive(Debug, Clone, Default)]
pub struct MonitorOptions {
    /// `--stats N`: a line on stderr every N.
    pub stats_every: Option<Duration>,
    /// Draw the progress line (only honoured when stderr is a terminal).
    pub progress: bool,
}

type LineFn = Box<dyn FnMut(Duration) -> String + Send>;

/// Runs the live view until dropped or [`Monitor::stop`]ped.
#[derive(Debug)]
pub struct Monitor {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
    stopped: AtomicBool,
}

impl Monitor {
    /// `line(elapsed)` renders the current state in one line (it may contain newlines for
    /// `--stats` blocks; the progress line shows only its first line).
    pub fn start(
        opts: MonitorOptions,
        line: impl FnMut(Duration) -> String + Send + 'static,
    ) -> Monitor {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let progress = opts.progress && std::io::stderr().is_terminal();
        if !progress && opts.stats_every.is_none() {
            return Monitor {
                stop,
                handle: None,
                stopped: AtomicBool::new(false),
            };
        }
        let stop2 = Arc::clone(&stop);
        let mut line: LineFn = Box::new(line);
        let handle = std::thread::Builder::new()
            .name("tcpkit-monitor".into())
            .spawn(move || run(opts.stats_every, progress, &stop2, &mut line))
            .ok();
        Monitor {
            stop,
            handle,
            stopped: AtomicBool::new(false),
        }
    }

    /// Stops the view and clears the progress line, so the summary prints on a clean screen.
    pub fn stop(&mut self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let (lock, cv) = &*self.stop;
        if let Ok(mut s) = lock.lock() {
            *s = true;
        }
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One live line (or block) as every job prints it: the elapsed time, then `text`; the lines
/// after the first are indented under it.
pub fn stamp(elapsed: Duration, text: &str) -> String {
    let head = format!("[{:>8.1}s] ", elapsed.as_secs_f64());
    let pad = " ".repeat(head.len());
    let mut out = String::with_capacity(text.len() + head.len());
    for (i, l) in text.lines().enumerate() {
        if i > 0 {
            out.push('\n');
            out.push_str(&pad);
        } else {
            out.push_str(&head);
        }
        out.push_str(l);
    }
    out
}

/// `done` of `total` as a live line's tail: ` 42.0% ETA 12s`, the ETA from the rate so far.
pub fn percent_eta(done: u64, total: u64, elapsed: Duration) -> String {
    if total == 0 {
        return String::new();
    }
    let frac = (done as f64 / total as f64).min(1.0);
    let mut s = format!(" {:5.1}%", frac * 100.0);
    if frac > 0.0 && frac < 1.0 {
        let left = elapsed.as_secs_f64() * (1.0 - frac) / frac;
        s.push_str(&format!(" ETA {}", fmt_secs(left)));
    }
    s
}

fn fmt_secs(s: f64) -> String {
    let s = s.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn run(
    stats_every: Option<Duration>,
    progress: bool,
    stop: &(Mutex<bool>, Condvar),
    line: &mut LineFn,
) {
    let start = Instant::now();
    let bar = progress.then(|| {
        let b =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        b
    });
    let tick = Duration::from_millis(250);
    let mut next_stats = stats_every.map(|d| start + d);
    let (lock, cv) = stop;
    loop {
        let now = Instant::now();
        let mut wait = if bar.is_some() {
            tick
        } else {
            Duration::from_secs(3600)
        };
        if let Some(ns) = next_stats {
            wait = wait.min(ns.saturating_duration_since(now));
        }
        let Ok(guard) = lock.lock() else { return };
        let Ok((guard, _)) = cv.wait_timeout_while(guard, wait, |s| !*s) else {
            return;
        };
        if *guard {
            break;
        }
        drop(guard);
        let now = Instant::now();
        let elapsed = now - start;
        if let (Some(ns), Some(every)) = (next_stats, stats_every) {
            if now >= ns {
                let text = stamp(elapsed, &line(elapsed));
                if let Some(b) = &bar {
                    b.suspend(|| eprintln!("{text}"));
                } else {
                    let mut err = std::io::stderr().lock();
                    let _ = writeln!(err, "{text}");
                    let _ = err.flush();
                }
                // Absolute schedule: the next line is due at start + k*every, not now + every.
                let mut t = ns;
                while t <= now {
                    t += every;
                }
                next_stats = Some(t);
            }
        }
        if let Some(b) = &bar {
            let text = line(elapsed);
            b.set_message(text.lines().collect::<Vec<_>>().join(" | "));
            b.tick();
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn stats_lines_come_every_interval_and_stop_promptly() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = Arc::clone(&calls);
        let mut m = Monitor::start(
            MonitorOptions {
                stats_every: Some(Duration::from_millis(50)),
                progress: false,
            },
            move |_| {
                c2.fetch_add(1, Ordering::SeqCst);
                String::from("tick")
            },
        );
        std::thread::sleep(Duration::from_millis(280));
        let t = Instant::now();
        m.stop();
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "stop must not wait for the next tick"
        );
        let n = calls.load(Ordering::SeqCst);
        assert!(
            (4..=6).contains(&n),
            "expected ~5 stats lines in 280 ms at 50 ms, got {n}"
        );
    }

    #[test]
    fn live_lines_start_with_the_elapsed_time() {
        assert_eq!(stamp(Duration::from_millis(2500), "a"), "[     2.5s] a");
        assert_eq!(
            stamp(Duration::from_secs(12), "a\nb"),
            "[    12.0s] a\n            b"
        );
        assert_eq!(
            percent_eta(1, 4, Duration::from_secs(10)),
            "  25.0% ETA 30s"
        );
        assert_eq!(percent_eta(4, 4, Duration::from_secs(10)), " 100.0%");
        assert_eq!(percent_eta(0, 0, Duration::from_secs(10)), "");
    }

    #[test]
    fn no_thread_when_nothing_to_show() {
        let m = Monitor::start(MonitorOptions::default(), |_| String::new());
        assert!(m.handle.is_none());
    }
}
