//! Background processes started inside a host: the [`Proc`] handle a test holds, and the
//! shared state the [`Lab`](crate::Lab) keeps so it can stop every process on drop.
//!
//! Each process leads its own process group, so stopping it also reaches the children it
//! forked (a shell's pipeline, a server's workers).

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::LabError;

/// How long a process gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// How often exit is polled; short, because tests wait on it.
const POLL: Duration = Duration::from_millis(5);

/// The child and, once reaped, its exit status. The pid is only signalled while the
/// status is unknown: an unreaped child's pid cannot be reused, so we never signal a stranger.
#[derive(Debug)]
pub(crate) struct ProcState {
    child: Child,
    status: Option<ExitStatus>,
}

pub(crate) type Shared = Arc<Mutex<ProcState>>;

pub(crate) fn shared(child: Child) -> Shared {
    Arc::new(Mutex::new(ProcState {
        child,
        status: None,
    }))
}

/// Locks even if a panicking thread poisoned the mutex: the state stays consistent because
/// every update is a single assignment.
pub(crate) fn lock(s: &Shared) -> MutexGuard<'_, ProcState> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl ProcState {
    /// Reaps the child if it has exited.
    pub(crate) fn poll(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Sends `sig` to the child's process group if the child is still running.
    pub(crate) fn signal(&mut self, sig: Signal) -> Result<(), LabError> {
        if self.poll().ok().flatten().is_some() {
            return Ok(());
        }
        let pid = self.child.id();
        let pgid =
            i32::try_from(pid).map_err(|_| LabError::invalid(format!("pid {pid} out of range")))?;
        match killpg(Pid::from_raw(pgid), sig) {
            // Already gone between the poll and the signal: nothing to do.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(LabError::io(
                format!("killpg({pid}, {sig})"),
                std::io::Error::from(e),
            )),
        }
    }
}

/// Waits until the process has exited or `timeout` passed.
pub(crate) fn wait_timeout(
    s: &Shared,
    timeout: Duration,
    what: &str,
) -> Result<Option<ExitStatus>, LabError> {
    let deadline = Instant::now() + timeout;
    loop {
        let st = lock(s)
            .poll()
            .map_err(|e| LabError::io(format!("waitpid({what})"), e))?;
        if st.is_some() {
            return Ok(st);
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// SIGTERM, up to `grace` to exit, then SIGKILL and a blocking reap.
pub(crate) fn terminate(s: &Shared, grace: Duration, what: &str) -> Result<ExitStatus, LabError> {
    lock(s).signal(Signal::SIGTERM)?;
    if let Some(st) = wait_timeout(s, grace, what)? {
        return Ok(st);
    }
    kill_and_reap(s, what)
}

pub(crate) fn kill_and_reap(s: &Shared, what: &str) -> Result<ExitStatus, LabError> {
    let mut g = lock(s);
    g.signal(Signal::SIGKILL)?;
    if let Some(st) = g.status {
        return Ok(st);
    }
    let st = g
        .child
        .wait()
        .map_err(|e| LabError::io(format!("waitpid({what})"), e))?;
    g.status = Some(st);
    Ok(st)
}

/// A process running in the background inside a host; see [`Host::spawn`](crate::Host::spawn).
///
/// Dropping the handle does not stop the process; the lab stops it when the lab is dropped.
#[derive(Debug)]
pub struct Proc {
    pub(crate) name: String,
    pub(crate) pid: u32,
    pub(crate) log_path: PathBuf,
    pub(crate) state: Shared,
}

impl Proc {
    /// The name given at spawn time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id (also its process-group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The file that receives the process's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The log so far (lossy UTF-8); empty if it cannot be read.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Exit status if the process has exited, without waiting.
    pub fn try_status(&self) -> Result<Option<ExitStatus>, LabError> {
        lock(&self.state)
            .poll()
            .map_err(|e| LabError::io(format!("waitpid({})", self.name), e))
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<Option<ExitStatus>, LabError> {
        wait_timeout(&self.state, timeout, &self.name)
    }

    /// Sends `sig` to the process group if the process is still running.
    pub fn signal(&self, sig: Signal) -> Result<(), LabError> {
        lock(&self.state).signal(sig)
    }

    /// Stops the process: SIGTERM, then SIGKILL after [`STOP_GRACE`]; returns how it exited
    /// (its own status if it had already exited).
    pub fn stop(&self) -> Result<ExitStatus, LabError> {
        terminate(&self.state, STOP_GRACE, &self.name)
    }
}

/// Waits until `proc`, started in `host` and named `what` in errors, accepts TCP connections
/// on every one of `addrs` (connecting from inside `host`), for up to `within`. Fails at once,
/// with its log, if it exits first.
pub(crate) fn wait_listening(
    host: &crate::Host,
    proc: &Proc,
    addrs: &[std::net::SocketAddr],
    within: Duration,
    what: &str,
) -> Result<(), LabError> {
    let deadline = Instant::now() + within;
    for &addr in addrs {
        loop {
            let up = host.try_enter(|| {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            })?;
            if up {
                break;
            }
            if let Some(st) = proc.try_status()? {
                return Err(LabError::invalid(format!(
                    "{what} in {} exited ({st}) before listening on {addr}: {}",
                    host.netns(),
                    proc.log().trim()
                )));
            }
            if Instant::now() > deadline {
                return Err(LabError::Timeout {
                    what: format!(
                        "{what} in {} listening on {addr} (its log: {})",
                        host.netns(),
                        crate::cmd::tail(proc.log().as_bytes(), b"")
                    ),
                    after: within,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, Stdio};

    fn start(argv: &[&str]) -> Shared {
        let child = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn");
        shared(child)
    }

    #[test]
    fn terminate_stops_with_sigterm() {
        let s = start(&["sleep", "30"]);
        let st = terminate(&s, STOP_GRACE, "sleep").unwrap();
        assert_eq!(st.signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn terminate_escalates_to_sigkill() {
        let s = start(&["sh", "-c", "trap '' TERM; sleep 30"]);
        // Let the shell install its trap before the SIGTERM arrives.
        std::thread::sleep(Duration::from_millis(200));
        let st = terminate(&s, Duration::from_millis(200), "sh").unwrap();
        assert_eq!(st.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn wait_timeout_sees_exit_and_keeps_status() {
        let s = start(&["sh", "-c", "exit 7"]);
        let st = wait_timeout(&s, Duration::from_secs(5), "sh")
            .unwrap()
            .unwrap();
        assert_eq!(st.code(), Some(7));
        // Signalling an exited process is a no-op, and stop returns the original status.
        lock(&s).signal(Signal::SIGKILL).unwrap();
        assert_eq!(terminate(&s, STOP_GRACE, "sh").unwrap().code(), Some(7));
    }

    #[test]
    fn wait_timeout_returns_none_while_running() {
        let s = start(&["sleep", "30"]);
        assert!(wait_timeout(&s, Duration::from_millis(50), "sleep")
            .unwrap()
            .is_none());
        kill_and_reap(&s, "sleep").unwrap();
    }
}
