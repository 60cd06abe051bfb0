//! `balance run -- CMD`: a fresh cgroup, the programs attached to it, the command started
//! inside it (it joins the cgroup between fork and exec, so its first socket is already
//! balanced), waited for, and everything removed when it ends.

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cgroup::{self, CgroupError, Child, PrivateMount};
use crate::config::{self, ConfigError, Service};
use crate::health::{BackendHealth, Health, HealthOptions};
use crate::loader::{Balancer, LoadError};
use crate::report::{BackendReport, CommandReport, RunReport, ServiceReport};
use crate::trace::Tracer;
use std::sync::{Arc, Mutex};

/// How long the command has to end after the SIGTERM forwarded to it, before what is left in
/// its cgroup is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub services: Vec<Service>,
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// Send the command's stdout to this process's stderr (--json: stdout holds the report).
    pub stdout_to_stderr: bool,
    /// Active TCP health checks, when asked.
    pub health: Option<HealthOptions>,
    /// Print every selection on stderr (`--trace`).
    pub trace: bool,
    /// End the sockets still on a backend that goes down (`--drain-kill`).
    pub drain: Option<crate::drain::DrainKill>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("starting {0}: {1}")]
    Spawn(String, #[source] std::io::Error),
    #[error("waiting for {0}: {1}")]
    Wait(String, #[source] std::io::Error),
    #[error("health checks: {0}")]
    Health(String),
    #[error("a command is needed after --")]
    NoCommand,
    /// Exit 127, as a shell's.
    #[error("{0}: command not found")]
    NotFound(String),
    /// Exit 126, as a shell's.
    #[error("{0}: not executable ({1})")]
    NotExecutable(String, #[source] std::io::Error),
}

impl RunError {
    /// The status a shell gives a command it cannot find (127) or cannot execute (126);
    /// None for the others (balance's own failures).
    pub fn shell_status(&self) -> Option<u8> {
        match self {
            RunError::NotFound(_) => Some(127),
            RunError::NotExecutable(..) => Some(126),
            RunError::Spawn(_, e) => match e.raw_os_error() {
                Some(libc::ENOENT) => Some(127),
                Some(libc::EACCES | libc::ENOEXEC | libc::EISDIR) => Some(126),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Finds `argv0` as execvp(3) would (a name with a slash as given, else each $PATH entry),
/// before anything is loaded: a command that cannot be run is said as a shell says it, and
/// nothing is attached for it.
fn locate(argv0: &std::ffi::OsStr) -> Result<(), RunError> {
    let shown = argv0.to_string_lossy().into_owned();
    let candidates: Vec<std::path::PathBuf> = if argv0.as_bytes().contains(&b'/') {
        vec![argv0.into()]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        std::env::split_paths(&path)
            .map(|d| d.join(argv0))
            .collect()
    };
    let mut denied = None;
    for c in candidates {
        let Ok(m) = std::fs::metadata(&c) else {
            continue;
        };
        let e = if m.is_dir() {
            std::io::Error::from_raw_os_error(libc::EISDIR)
        } else if !m.is_file() {
            std::io::Error::from_raw_os_error(libc::EACCES)
        } else {
            let cs = CString::new(c.as_os_str().as_bytes())
                .map_err(|e| RunError::Spawn(shown.clone(), std::io::Error::other(e)))?;
            // SAFETY: access(2) on a NUL-terminated path.
            if unsafe { libc::access(cs.as_ptr(), libc::X_OK) } == 0 {
                return Ok(());
            }
            std::io::Error::last_os_error()
        };
        denied.get_or_insert(e);
    }
    match denied {
        Some(e) => Err(RunError::NotExecutable(shown, e)),
        None => Err(RunError::NotFound(shown)),
    }
}

/// Runs the command balanced; returns when it has ended and everything is removed.
/// Must be called before this process starts any thread (a private cgroup2 mount needs its
/// own mount namespace).
pub fn run(opts: &RunOptions, interrupted: &AtomicBool) -> Result<RunReport, RunError> {
    config::check(&opts.services)?;
    let argv0 = opts.command.first().ok_or(RunError::NoCommand)?;
    locate(argv0)?;
    let argv0 = argv0.to_string_lossy().into_owned();
    let (mount, private) = match cgroup::find_mount()? {
        Some(m) => (m, None),
        None => {
            let p = PrivateMount::new()?;
            (p.dir.clone(), Some(p))
        }
    };
    let own = cgroup::own_path()?;
    let parent = mount.join(own.trim_start_matches('/'));
    // Load before creating anything: a kernel that refuses the programs leaves nothing behind.
    let mut balancer = Balancer::load(&opts.services, opts.trace)?;
    let tracer = if opts.trace {
        Some(Tracer::start(balancer.take_trace()?))
    } else {
        None
    };
    let child_cg = Child::create(&parent)?;
    balancer.attach(&child_cg.path)?;

    let procs = CString::new(child_cg.procs_file().as_os_str().as_bytes())
        .map_err(|e| RunError::Spawn(argv0.clone(), std::io::Error::other(e)))?;
    let mut cmd = Command::new(&opts.command[0]);
    cmd.args(&opts.command[1..]);
    if opts.stdout_to_stderr {
        use std::os::fd::AsFd;
        let err = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| RunError::Spawn(argv0.clone(), e))?;
        cmd.stdout(Stdio::from(err));
    }
    let parent_pid = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls (open, write, close, prctl,
    // getppid) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if n != 1 {
                return Err(err);
            }
            // Without its balancer the command would connect to the VIP itself: it is told
            // to stop when balance dies (even by SIGKILL).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() as u32 != parent_pid {
                return Err(std::io::Error::other("balance exited while starting"));
            }
            Ok(())
        });
    }
    let balancer = Arc::new(Mutex::new(balancer));
    let health = opts.health.as_ref().map(|o| {
        let state = Arc::new(Mutex::new(
            opts.services
                .iter()
                .map(|s| vec![BackendHealth::new(true); s.backends.len()])
                .collect(),
        ));
        Health::start(
            &opts.services,
            &vec![Some(o.clone()); opts.services.len()],
            Arc::clone(&balancer),
            state,
            opts.drain,
        )
    });
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| RunError::Spawn(argv0.clone(), e))?;
    let pid = child.id();
    // The child's end wakes us through a pidfd (Linux 5.3); the timeout only bounds how soon
    // a signal of ours is passed on. Polling try_wait every 5 ms woke this process 200 times
    // a second, CPU that showed in the machine's busy time beside the balanced command's.
    // SAFETY: pidfd_open(2) on our own child, not yet reaped; the descriptor is owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    let pidfd = i32::try_from(pidfd)
        .ok()
        .filter(|fd| *fd >= 0)
        // SAFETY: a descriptor pidfd_open just gave us and nothing else owns.
        .map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    let mut forwarded: Option<Instant> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => return Err(RunError::Wait(argv0, e)),
        }
        if interrupted.load(Ordering::Relaxed) {
            match forwarded {
                None => {
                    // SAFETY: kill(2) on our own child's pid, not yet reaped.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                    forwarded = Some(Instant::now());
                }
                Some(t) if t.elapsed() > STOP_GRACE => {
                    let _ = child.kill();
                }
                Some(_) => {}
            }
        }
        match &pidfd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd on the stack for the call's duration.
                unsafe { libc::poll(&mut p, 1, 100) };
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let elapsed = start.elapsed();
    if let Some(t) = tracer {
        t.stop();
    }
    let (health, health_error) = match health {
        Some(h) => {
            let (st, e) = h.stop();
            (Some(st), e)
        }
        None => (None, None),
    };
    let balancer = Arc::try_unwrap(balancer)
        .map_err(|_| RunError::Health("a prober outlived its stop".into()))?
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    let counters = balancer.counters()?;
    let cgroup_path = child_cg.path.display().to_string();
    // Whatever the command left running goes with its cgroup; then the links.
    child_cg.remove()?;
    drop(balancer);
    let private_mount = private.is_some();
    drop(private);

    if let Some(e) = health_error {
        return Err(RunError::Health(e));
    }
    let services = opts
        .services
        .iter()
        .zip(&counters.picks)
        .enumerate()
        .map(|(si, (s, picks))| ServiceReport {
            vip: s.vip.to_string(),
            algorithm: s.algorithm.name(),
            hash_key: s.algorithm.hash_key(),
            persistence_s: s.persistence.map(|p| p.as_secs_f64()),
            backends: s
                .backends
                .iter()
                .zip(picks)
                .zip(&counters.active[si])
                .enumerate()
                .map(|(bi, ((b, n), open))| {
                    let h = health.as_ref().map(|h| &h[si][bi]);
                    BackendReport {
                        addr: b.addr.to_string(),
                        weight: b.weight,
                        connects: *n,
                        active: *open,
                        up: h.map(|h| h.up),
                        probes: h.map_or(0, |h| h.probes),
                        probes_failed: h.map_or(0, |h| h.failed),
                        downs: h.map_or(0, |h| h.downs),
                        drained: h.map_or(0, |h| h.drained),
                    }
                })
                .collect(),
        })
        .collect();
    let (code, signal) = (status.code(), status.signal());
    let exit = match (code, signal) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(s)) => (128 + s).min(255) as u8,
        (None, None) => 1,
    };
    Ok(RunReport {
        schema_version: 1,
        mode: "run",
        command: CommandReport {
            argv: opts
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            pid,
            code,
            signal,
            status: exit,
        },
        cgroup: cgroup_path,
        private_mount,
        elapsed_s: elapsed.as_secs_f64(),
        services,
        translated: counters.translated,
        refused: counters.refused,
        getpeername_vip: counters.revnat,
        stale: counters.stale,
        trace_lost: counters.trace_lost,
        interrupted: forwarded.is_some(),
    })
}
