//! Past one process's file-descriptor limit: the parent starts N copies of itself with
//! `--worker K/N`; each runs its share (connections, rate, queries; source addresses and
//! connection numbers do not overlap) and prints JSON lines on stdout: `{"live": ...}` twice a
//! second (with the limit hints it hit), then `{"report": ..., "details": ...}` with its
//! histograms serialized. The parent shows the summed live line, says each hint once, forwards
//! interrupts, and merges the reports into one run.

use std::io::Write;
use std::process::ChildStdin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::report::LoadReport;
use serde::{Deserialize, Serialize};
use tcpkit_workers::{WorkerId, Workers};

use super::{Config, Details, LiveTotals, LoadCounters, LoadError, Plan};

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    /// All of this worker's connections are settled; it waits for `go` on its stdin. Why it
    /// is not ready for a fleet run, if it is not (fewer connections open than its share).
    Ready {
        #[serde(default)]
        not_ready: Option<String>,
    },
    Live(LiveTotals),
    Report {
        report: Box<LoadReport>,
        details: Details,
    },
}

/// In a worker: prints the live totals twice a second until `stop`.
pub(crate) fn live_loop(live: &LoadCounters, stop: &AtomicBool) {
    let mut ticks = 0u32;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        ticks += 1;
        if !ticks.is_multiple_of(25) {
            continue;
        }
        let line = Line::Live(live.totals());
        if let Ok(text) = serde_json::to_string(&line) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    }
}

/// How far ahead of "now" the parent sets the common start, so every worker has read it
/// before its first query is due.
const RELEASE_AHEAD_NS: u64 = 20_000_000;

/// In a worker: once `ready` (all threads settled), tells the parent and waits for its `go
/// MONO_NS WALL_NS` line, then sets the query phase's start. Runs on a detached thread: a
/// parent that never answers must not keep the process alive, so on EOF (the parent is
/// gone) the worker starts on its own.
pub(crate) fn await_release(
    ready: Arc<AtomicBool>,
    start: Arc<AtomicU64>,
    wall: Arc<AtomicU64>,
    (open, asked, target, failure): (Arc<AtomicU64>, u64, String, Arc<Mutex<Option<String>>>),
) {
    let start2 = Arc::clone(&start);
    let spawned = std::thread::Builder::new()
        .name("tcpkit-load-release".into())
        .spawn(move || {
            let start = start2;
            while !ready.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_micros(500));
            }
            let not_ready =
                super::not_ready_why(open.load(Ordering::SeqCst), asked, &target, &failure);
            if let Ok(text) = serde_json::to_string(&Line::Ready { not_ready }) {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
            }
            let mut line = String::new();
            let got = std::io::stdin()
                .read_line(&mut line)
                .ok()
                .filter(|&n| n > 0);
            let mut it = line.split_whitespace();
            match (got, it.next(), it.next(), it.next()) {
                (Some(_), Some("go"), Some(m), Some(w)) => {
                    if let (Ok(m), Ok(w)) = (m.parse(), w.parse()) {
                        wall.store(w, Ordering::SeqCst);
                        start.store(m, Ordering::SeqCst);
                        return;
                    }
                    start_alone(&start, &wall);
                }
                _ => start_alone(&start, &wall),
            }
        });
    if spawned.is_err() {
        // No thread: do not wait for a parent we cannot hear.
        ready_fallback(&start);
    }
}

fn start_alone(start: &AtomicU64, wall: &AtomicU64) {
    wall.store(wall_ns() + 2_000_000, Ordering::SeqCst);
    start.store(tcpkit_pace::now_ns() + 2_000_000, Ordering::SeqCst);
}

fn ready_fallback(start: &AtomicU64) {
    start.store(tcpkit_pace::now_ns() + 2_000_000, Ordering::SeqCst);
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// In the parent: once every worker is ready or gone, sends all of them one common start
/// (CLOCK_MONOTONIC is the same clock in every process of a host).
fn release(stdins: &mut [Option<ChildStdin>]) {
    release_at(
        stdins,
        tcpkit_pace::now_ns() + RELEASE_AHEAD_NS,
        wall_ns() + RELEASE_AHEAD_NS,
    );
}

/// Sends every worker the start at `mono` (CLOCK_MONOTONIC ns), which is `wall` on the wall
/// clock.
fn release_at(stdins: &mut [Option<ChildStdin>], mono: u64, wall: u64) {
    for s in stdins.iter_mut() {
        if let Some(mut w) = s.take() {
            let _ = writeln!(w, "go {mono} {wall}");
            let _ = w.flush();
        }
    }
}

/// In a worker: the final line.
pub(crate) fn print_final(report: &LoadReport, details: &Details) {
    let line = Line::Report {
        report: Box::new(report.clone()),
        details: details.clone(),
    };
    if let Ok(text) = serde_json::to_string(&line) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

/// In the parent: runs `plan.procs` workers and merges what they report.
pub(crate) fn run_parent(
    cfg: &Config,
    plan: &Plan,
    interrupt: &AtomicBool,
    live: &LoadCounters,
    hint: &(dyn Fn(&str) + Sync),
) -> Result<(LoadReport, Details), LoadError> {
    let exe = std::env::current_exe().map_err(|e| LoadError::Io {
        what: "find this program to start worker processes",
        source: e,
    })?;
    let n = plan.procs;
    let ids = (0..n).map(|k| WorkerId {
        k,
        n,
        threads: Some(plan.threads),
    });
    let workers = Workers::start(&exe, &cfg.worker_argv, ids).map_err(|e| LoadError::Io {
        what: "start a worker process",
        source: e.source,
    })?;
    // Workers ready for the query phase, or gone (a worker that ended before it was ready
    // must not keep the others waiting).
    let settled = AtomicUsize::new(0);
    let ready: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let results: Mutex<Vec<Option<(LoadReport, Details)>>> =
        Mutex::new((0..n).map(|_| None).collect());
    let mut released = false;
    // A fleet agent: the barrier is told once every worker has settled, and its start is what
    // the workers are released at.
    let mut told_barrier = false;
    let mut not_ready: Option<String> = None;
    let workers_not_ready: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let said_ready: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let exits = workers.run(
        interrupt,
        &|k, line| match serde_json::from_str::<Line>(line) {
            Ok(Line::Ready { not_ready }) => {
                said_ready[k].store(true, Ordering::SeqCst);
                if let (Some(why), Ok(mut v)) = (not_ready, workers_not_ready.lock()) {
                    v.push(format!("worker process {k}: {why}"));
                }
                if !ready[k].swap(true, Ordering::SeqCst) {
                    settled.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(Line::Live(t)) => {
                live.set(k, &t);
                // A worker's hints are said here, once for all of them.
                live.give_hints(t.hints, hint);
            }
            Ok(Line::Report { report, details }) => {
                // Hints hit after the worker's last live line.
                let bits = super::sock::hint_bits(
                    report.errors.keys().map(String::as_str),
                    report.connections.established > 0,
                    report.connections.slow,
                );
                live.give_hints(bits, hint);
                if let Ok(mut r) = results.lock() {
                    r[k] = Some((*report, details));
                }
            }
            // Not ours (a worker never prints anything else); ignore.
            Err(_) => {}
        },
        &mut |stdins, ended| {
            for (k, _) in ended.iter().enumerate().filter(|(_, &e)| e) {
                if !ready[k].swap(true, Ordering::SeqCst) {
                    settled.fetch_add(1, Ordering::SeqCst);
                }
            }
            if released || settled.load(Ordering::SeqCst) < stdins.len() {
                return;
            }
            let Some(agent) = &cfg.fleet else {
                release(stdins);
                released = true;
                return;
            };
            if !told_barrier {
                told_barrier = true;
                let mut why = workers_not_ready
                    .lock()
                    .map(|v| v.clone())
                    .unwrap_or_default();
                for (k, _) in said_ready
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| !r.load(Ordering::SeqCst))
                {
                    why.push(format!("worker process {k} ended before it was ready"));
                }
                if why.is_empty() {
                    agent.ready();
                } else {
                    let why = why.join("; ");
                    agent.not_ready(&why);
                    not_ready = Some(why);
                    interrupt.store(true, Ordering::SeqCst);
                }
            } else if let Some(at) = agent.start() {
                release_at(stdins, tcpkit_fleet::clock::mono_of(at).max(1), at);
                released = true;
            }
        },
    );
    let results = results.into_inner().unwrap_or_default();
    let mut reports = Vec::with_capacity(n as usize);
    let mut details = Details::default();
    for (k, (r, exit)) in results.into_iter().zip(exits).enumerate() {
        let st = exit.status;
        match r {
            Some((rep, d)) => {
                if details.connect_error.is_none() {
                    details.connect_error = d.connect_error;
                }
                if details.bad_answer.is_none() {
                    details.bad_answer = d.bad_answer;
                }
                details.first_sent_unix_ns =
                    match (details.first_sent_unix_ns, d.first_sent_unix_ns) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                reports.push(rep);
            }
            None => {
                let why = match st {
                    Ok(s) => format!("ended without a report ({s})"),
                    Err(e) => format!("could not be waited for: {e}"),
                };
                return Err(LoadError::Worker { k: k as u32, why });
            }
        }
    }
    let mut merged = crate::merge::merge_reports(&reports).map_err(|e| LoadError::Worker {
        k: 0,
        why: e.to_string(),
    })?;
    // One run made of processes, not several runs.
    merged.runs = 1;
    // One run: its intervals are its own, the series is what merge makes of several runs.
    merged.series = None;
    merged.processes = n;
    details.not_ready = not_ready;
    Ok((merged, details))
}
