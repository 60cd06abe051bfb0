//! `--procs N`: the server as N worker processes sharing the port through `SO_REUSEPORT`.
//!
//! One process cannot hold more connections than its RLIMIT_NOFILE, and a container's hard
//! limit (20,000 here) cannot be raised from inside. So the parent re-executes itself N times
//! with the same arguments plus `--worker K/N`; each worker prints its report as one JSON line
//! on stdout, and the parent forwards stop signals, passes any other stdout line to its stderr
//! (live lines already go there: stdout is the report's),
//! and merges the reports into one.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{EchoError, EchoReport};

/// How often the parent looks at its workers and at the stop flag.
const POLL: Duration = Duration::from_millis(20);

struct Worker {
    label: String,
    child: Child,
    status: Option<ExitStatus>,
    reader: Option<JoinHandle<Option<String>>>,
}

fn signal(child: &Child, sig: libc::c_int) {
    // The child is not yet reaped when this is called, so its pid cannot belong to anyone else.
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Runs `exe args... --worker K/N` for K in 1..=N and returns their merged report. `stop` set
/// (by SIGINT/SIGTERM) is forwarded to the workers as SIGTERM. A worker that fails stops the
/// others and fails the run (its own error line is already on stderr, which workers inherit).
pub fn run_workers(
    exe: &Path,
    args: &[OsString],
    procs: u32,
    stop: &AtomicBool,
) -> Result<EchoReport, EchoError> {
    let mut workers: Vec<Worker> = Vec::new();
    for k in 1..=procs {
        let label = format!("{k}/{procs}");
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .arg("--worker")
            .arg(&label)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                // A worker must not outlive a parent that was killed outright.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut workers);
                return Err(EchoError::Worker {
                    worker: label,
                    why: format!("start {}: {e}", exe.display()),
                });
            }
        };
        let reader = child.stdout.take().map(|out| {
            std::thread::spawn(move || {
                let mut report = None;
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if line.starts_with('{') {
                        report = Some(line);
                    } else {
                        // Not the report: never on our stdout, which holds only the report.
                        let mut o = std::io::stderr().lock();
                        let _ = writeln!(o, "{line}");
                        let _ = o.flush();
                    }
                }
                report
            })
        });
        workers.push(Worker {
            label,
            child,
            status: None,
            reader,
        });
    }
    let mut forwarded = false;
    let mut failed: Option<(String, ExitStatus)> = None;
    loop {
        if stop.load(Ordering::Relaxed) && !forwarded {
            forwarded = true;
            for w in workers.iter().filter(|w| w.status.is_none()) {
                signal(&w.child, libc::SIGTERM);
            }
        }
        for w in workers.iter_mut().filter(|w| w.status.is_none()) {
            if let Ok(Some(st)) = w.child.try_wait() {
                w.status = Some(st);
                if !st.success() && failed.is_none() {
                    failed = Some((w.label.clone(), st));
                }
            }
        }
        if failed.is_some() && !forwarded {
            forwarded = true;
            for w in workers.iter().filter(|w| w.status.is_none()) {
                signal(&w.child, libc::SIGTERM);
            }
        }
        if workers.iter().all(|w| w.status.is_some()) {
            break;
        }
        std::thread::sleep(POLL);
    }
    let mut reports = Vec::with_capacity(workers.len());
    for w in &mut workers {
        let line = w.reader.take().and_then(|h| h.join().ok()).flatten();
        if failed.is_some() {
            continue;
        }
        let Some(line) = line else {
            return Err(EchoError::Worker {
                worker: w.label.clone(),
                why: "exited without a report".into(),
            });
        };
        let r: EchoReport = serde_json::from_str(&line).map_err(|e| EchoError::Worker {
            worker: w.label.clone(),
            why: format!("unreadable report: {e}"),
        })?;
        reports.push(r);
    }
    if let Some((label, st)) = failed {
        return Err(EchoError::Worker {
            worker: label,
            why: format!("failed ({st}); its error is above"),
        });
    }
    EchoReport::merge(&reports).ok_or_else(|| EchoError::Worker {
        worker: "0".into(),
        why: "no workers".into(),
    })
}

fn stop_all(workers: &mut [Worker]) {
    for w in workers.iter_mut() {
        signal(&w.child, libc::SIGTERM);
        let _ = w.child.wait();
    }
}
