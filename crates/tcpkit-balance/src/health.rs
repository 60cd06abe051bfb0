//! Active TCP health checks: one prober thread per backend connects to it every interval
//! (from balance's own cgroup, outside the balanced one, so probes are never translated). A
//! backend goes down after `fall` failed probes in a row and comes back after `rise`
//! successes; each change swaps its service's backend set in the kernel at once (atomically:
//! see `Balancer::set_live`), so a dead backend leaves the selection within one interval of
//! its `fall`-th failed probe.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{ConfigError, Service};
use crate::loader::Balancer;

/// How backends are probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthOptions {
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
}

impl HealthOptions {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
    pub const DEFAULT_RISE: u32 = 2;
    pub const DEFAULT_FALL: u32 = 3;

    /// Checked options (the same checks for `run`'s flags and `up`'s file).
    pub fn new(
        interval: Duration,
        timeout: Duration,
        rise: u32,
        fall: u32,
    ) -> Result<HealthOptions, ConfigError> {
        if interval.is_zero() {
            return Err(ConfigError::HealthInterval);
        }
        if timeout.is_zero() {
            return Err(ConfigError::HealthTimeout);
        }
        if rise == 0 || fall == 0 {
            return Err(ConfigError::RiseFall);
        }
        Ok(HealthOptions {
            interval,
            timeout,
            rise,
            fall,
        })
    }
}

/// One backend's health as the probes found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendHealth {
    pub up: bool,
    /// Whether it is probed at all (a service without health checks: always up).
    pub checked: bool,
    /// When it last went up or down (or was first seen).
    pub since: Instant,
    pub probes: u64,
    pub failed: u64,
    /// Times it went down.
    pub downs: u64,
    ok_run: u32,
    fail_run: u32,
}

impl BackendHealth {
    /// Up until proven otherwise: a run starts balancing at once.
    pub fn new(checked: bool) -> BackendHealth {
        BackendHealth {
            up: true,
            checked,
            since: Instant::now(),
            probes: 0,
            failed: 0,
            downs: 0,
            ok_run: 0,
            fail_run: 0,
        }
    }

    /// Counts one probe; true when the backend changed state.
    fn probe(&mut self, ok: bool, o: &HealthOptions) -> bool {
        self.probes += 1;
        if ok {
            self.fail_run = 0;
            self.ok_run = self.ok_run.saturating_add(1);
            if !self.up && self.ok_run >= o.rise {
                self.up = true;
                self.since = Instant::now();
                return true;
            }
        } else {
            self.failed += 1;
            self.ok_run = 0;
            self.fail_run = self.fail_run.saturating_add(1);
            if self.up && self.fail_run >= o.fall {
                self.up = false;
                self.downs += 1;
                self.since = Instant::now();
                return true;
            }
        }
        false
    }
}

/// Every backend's health, by service and backend index; shared with `status`.
pub type State = Arc<Mutex<Vec<Vec<BackendHealth>>>>;

/// The running probers; [`Health::stop`] ends them and gives the final states.
#[derive(Debug)]
pub struct Health {
    state: State,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// The first error met swapping a set in the kernel, if any.
    error: Arc<Mutex<Option<String>>>,
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Health {
    /// Probes every backend of every service that has options in `health` (same order as
    /// `services`), from the states in `state` (one per backend; see [`BackendHealth::new`]).
    pub fn start(
        services: &[Service],
        health: &[Option<HealthOptions>],
        balancer: Arc<Mutex<Balancer>>,
        state: State,
    ) -> Health {
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let mut threads = Vec::new();
        for (si, s) in services.iter().enumerate() {
            let Some(o) = health.get(si).copied().flatten() else {
                continue;
            };
            for (bi, b) in s.backends.iter().enumerate() {
                let (state, stop, error, balancer) = (
                    Arc::clone(&state),
                    Arc::clone(&stop),
                    Arc::clone(&error),
                    Arc::clone(&balancer),
                );
                let addr = b.addr;
                let t = std::thread::Builder::new()
                    .name(format!("tcpkit-health-{addr}"))
                    .spawn(move || {
                        let start = Instant::now();
                        let mut k: u32 = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let ok = TcpStream::connect_timeout(&addr, o.timeout).is_ok();
                            let mut st = lock(&state);
                            if st[si][bi].probe(ok, &o) {
                                let live: Vec<bool> = st[si].iter().map(|h| h.up).collect();
                                // Under the state lock: swaps happen in the order of changes.
                                if let Err(e) = lock(&balancer).set_live(si, &live) {
                                    lock(&error).get_or_insert_with(|| tcpkit_stats::chain(&e));
                                }
                            }
                            drop(st);
                            // Absolute schedule: start + k * interval.
                            k += 1;
                            let next = start + o.interval * k;
                            while !stop.load(Ordering::Relaxed) {
                                let now = Instant::now();
                                if now >= next {
                                    break;
                                }
                                std::thread::sleep((next - now).min(Duration::from_millis(20)));
                            }
                        }
                    });
                if let Ok(t) = t {
                    threads.push(t);
                }
            }
        }
        Health {
            state,
            stop,
            threads,
            error,
        }
    }

    /// Stops the probers (each ends within its probe timeout) and returns the states.
    pub fn stop(self) -> (Vec<Vec<BackendHealth>>, Option<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        let st = lock(&self.state).clone();
        let e = lock(&self.error).clone();
        (st, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_after_fall_failures_and_rises_after_rise_successes() {
        let o = HealthOptions {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        };
        let mut h = BackendHealth::new(true);
        assert!(!h.probe(false, &o) && !h.probe(false, &o) && h.up);
        assert!(!h.probe(true, &o), "a success resets the failure run");
        assert!(!h.probe(false, &o) && !h.probe(false, &o));
        assert!(h.probe(false, &o) && !h.up && h.downs == 1);
        assert!(!h.probe(true, &o) && !h.up);
        assert!(h.probe(true, &o) && h.up);
        assert_eq!((h.probes, h.failed), (8, 5));
    }
}
