//! Past one process's file-descriptor limit: the parent starts N copies of itself with
//! `--worker K/N`; each runs its share (connections, rate, queries; source addresses and
//! connection numbers do not overlap) and prints JSON lines on stdout: `{"live": ...}` twice a
//! second, then `{"report": ..., "details": ...}` with its histograms serialized. The parent
//! shows the summed live line, forwards interrupts, and merges the reports into one run.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tcpkit_stats::LoadReport;

use super::{Config, Details, Live, LiveTotals, LoadError, Plan};

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Live(LiveTotals),
    Report {
        report: Box<LoadReport>,
        details: Details,
    },
}

/// In a worker: prints the live totals twice a second until `stop`.
pub(crate) fn live_loop(live: &Live, stop: &AtomicBool) {
    let mut ticks = 0u32;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        ticks += 1;
        if ticks % 25 != 0 {
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
    live: &Live,
) -> Result<(LoadReport, Details), LoadError> {
    let exe = std::env::current_exe().map_err(|e| LoadError::Io {
        what: "find this program to start worker processes",
        source: e,
    })?;
    let n = plan.procs;
    let mut children: Vec<Child> = Vec::with_capacity(n as usize);
    for k in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&cfg.worker_argv)
            .arg("--worker")
            .arg(format!("{k}/{n}/{}", plan.threads))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(LoadError::Io {
                    what: "start a worker process",
                    source: e,
                });
            }
        }
    }
    let results: Mutex<Vec<Option<(LoadReport, Details)>>> =
        Mutex::new((0..n).map(|_| None).collect());
    let pids: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
    let done = AtomicBool::new(false);
    let statuses = std::thread::scope(|s| {
        for (k, child) in children.iter_mut().enumerate() {
            let Some(out) = child.stdout.take() else {
                continue;
            };
            let results = &results;
            s.spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    match serde_json::from_str::<Line>(&line) {
                        Ok(Line::Live(t)) => live.set(k, &t),
                        Ok(Line::Report { report, details }) => {
                            if let Ok(mut r) = results.lock() {
                                r[k] = Some((*report, details));
                            }
                        }
                        // Not ours (a worker never prints anything else); ignore.
                        Err(_) => {}
                    }
                }
            });
        }
        // Forward an interrupt to the workers (they stop and report, like one process).
        let done = &done;
        s.spawn(move || {
            let mut sent = false;
            while !done.load(Ordering::Relaxed) {
                if !sent && interrupt.load(Ordering::Relaxed) {
                    for &pid in &pids {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGINT,
                        );
                    }
                    sent = true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let statuses: Vec<_> = children.iter_mut().map(Child::wait).collect();
        done.store(true, Ordering::Relaxed);
        statuses
    });
    let results = results.into_inner().unwrap_or_default();
    let mut reports = Vec::with_capacity(n as usize);
    let mut details = Details::default();
    for (k, (r, st)) in results.into_iter().zip(statuses).enumerate() {
        match r {
            Some((rep, d)) => {
                if details.connect_error.is_none() {
                    details.connect_error = d.connect_error;
                }
                if details.bad_answer.is_none() {
                    details.bad_answer = d.bad_answer;
                }
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
    merged.processes = n;
    Ok((merged, details))
}
