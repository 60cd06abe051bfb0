//! `--procs N`: the server as N worker processes sharing the port through `SO_REUSEPORT`.
//! The parent claims the port first and hands its claim to worker 0 ([`super::sock`]), so the
//! workers share it with each other and with no one else.
//!
//! One process cannot hold more connections than its RLIMIT_NOFILE, and a container's hard
//! limit (20,000 here) cannot be raised from inside. So the parent re-executes itself N times
//! with the same arguments plus `--worker K/N` (tcpkit-workers); each worker prints its report as one JSON line
//! on stdout, and the parent forwards stop signals, passes any other stdout line to its stderr
//! (live lines already go there: stdout is the report's),
//! and merges the reports into one.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use std::os::fd::AsFd;

use tcpkit_workers::{Pass, WorkerId, Workers};

use super::{sock, EchoConfig, EchoError, EchoReport};

/// Claims the addresses of `cfg`, then runs `exe args... --worker K/N` for K in 0..N and
/// returns their merged report. A port in use is refused here, before any worker starts.
/// `stop` set (by SIGINT/SIGTERM) is forwarded to the workers as SIGTERM. A worker that fails
/// stops the others and fails the run (its own error line is already on stderr, which workers
/// inherit).
pub fn run_workers(
    cfg: &EchoConfig,
    exe: &Path,
    args: &[OsString],
    procs: u32,
    stop: &AtomicBool,
) -> Result<EchoReport, EchoError> {
    let claims = sock::claim_all(cfg)?;
    let ids = (0..procs).map(|k| WorkerId {
        k,
        n: procs,
        threads: None,
    });
    let fds: Vec<_> = claims.iter().map(|(_, s)| s.as_fd()).collect();
    let pass = Pass {
        worker: 0,
        fds: &fds,
        var: sock::INHERITED_ENV,
    };
    let workers =
        Workers::start_passing(exe, args, ids, Some(pass)).map_err(|e| EchoError::Worker {
            worker: e.id.to_string(),
            why: format!("start {}: {}", exe.display(), e.source),
        })?;
    // Worker 0 holds the claims now: a copy here would keep a listener open, its queue
    // filling, if worker 0 died.
    drop(fds);
    drop(claims);
    let ids = workers.ids().to_vec();
    let lines: Mutex<Vec<Option<String>>> = Mutex::new(vec![None; ids.len()]);
    let exits = workers.run(
        stop,
        &|i, line| {
            if line.starts_with('{') {
                if let Ok(mut l) = lines.lock() {
                    l[i] = Some(line.to_string());
                }
            } else {
                // Not the report: never on our stdout, which holds only the report.
                let mut o = std::io::stderr().lock();
                let _ = writeln!(o, "{line}");
                let _ = o.flush();
            }
        },
        // Echo's workers need nothing on stdin: close it.
        &mut |stdins, _| stdins.iter_mut().for_each(|s| drop(s.take())),
    );
    if let Some(e) = exits
        .iter()
        .find(|e| !e.status.as_ref().is_ok_and(|s| s.success()))
    {
        let why = match &e.status {
            Ok(st) => format!("failed ({st}); its error is above"),
            Err(err) => format!("could not be waited for: {err}"),
        };
        return Err(EchoError::Worker {
            worker: e.id.to_string(),
            why,
        });
    }
    let lines = lines.into_inner().unwrap_or_default();
    let mut reports = Vec::with_capacity(ids.len());
    for (id, line) in ids.iter().zip(lines) {
        let Some(line) = line else {
            return Err(EchoError::Worker {
                worker: id.to_string(),
                why: "exited without a report".into(),
            });
        };
        let r: EchoReport = serde_json::from_str(&line).map_err(|e| EchoError::Worker {
            worker: id.to_string(),
            why: format!("unreadable report: {e}"),
        })?;
        reports.push(r);
    }
    EchoReport::merge(&reports).ok_or_else(|| EchoError::Worker {
        worker: "0".into(),
        why: "no workers".into(),
    })
}
