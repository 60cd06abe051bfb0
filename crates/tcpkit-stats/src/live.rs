//! The live view of a long run: a progress line on stderr when stderr is a terminal, and
//! `--stats N` lines on stdout every N seconds in any case. Both run on their own thread and
//! read shared atomics, so the hot path only does relaxed adds.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Counters the workers bump (relaxed) and the monitor reads.
#[derive(Debug, Default)]
pub struct LiveCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub failed: AtomicU64,
}

impl LiveCounters {
    #[inline]
    pub fn add(&self, packets: u64, bytes: u64) {
        self.packets.fetch_add(packets, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Default)]
pub struct MonitorOptions {
    /// `--stats N`: a line on stdout every N.
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
                let text = line(elapsed);
                if let Some(b) = &bar {
                    b.suspend(|| println!("{text}"));
                } else {
                    println!("{text}");
                    let _ = std::io::stdout().flush();
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
    fn no_thread_when_nothing_to_show() {
        let m = Monitor::start(MonitorOptions::default(), |_| String::new());
        assert!(m.handle.is_none());
    }
}
