//! tcpkit-workers: a job that needs more than one process can hold runs as N copies of itself.
//!
//! One process cannot hold more connections than its RLIMIT_NOFILE, and a container's hard
//! limit (20,000 here) cannot be raised from inside, so `load` and `echo` (`--procs N`)
//! re-execute themselves N times with the same arguments plus `--worker K/N[/T]`. This crate is
//! that supervisor, once: it starts the workers (each dies with its parent: PDEATHSIG), hands
//! every line they print on stdout to the job (their stderr is the parent's), lets the job
//! write to their stdin, forwards the first stop to them, stops the others when one fails, and
//! reaps them all. What the lines mean (live totals, a report) is the job's business.
//!
//! It also owns how a run is shared out ([`share`], [`Shard`]): between these processes, and
//! between the hosts of a fleet (`--shard K/N` on `load` and `replay`).
#![warn(missing_docs)]

mod share;

pub use share::{share, share_offset, Shard};

use std::ffi::OsString;
use std::fmt;
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often the supervisor looks at its workers and at the stop flag.
const POLL: Duration = Duration::from_millis(20);

/// Which worker a process is: `K/N` (K from 0) or `K/N/T` with the threads it runs, the value
/// of the internal `--worker` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerId {
    /// This worker's index, from 0.
    pub k: u32,
    /// How many workers the run has.
    pub n: u32,
    /// Threads this worker runs, when the parent chose them.
    pub threads: Option<usize>,
}

impl WorkerId {
    /// Parses `K/N` or `K/N/T` (K < N, T ≥ 1); the error says what was expected.
    pub fn parse(text: &str) -> Result<WorkerId, String> {
        let bad = || format!("--worker '{text}': expected K/N or K/N/T with K < N and T >= 1");
        let (k, n, t) = share::worker_numbers(text).ok_or_else(bad)?;
        let threads = t.map(usize::try_from).transpose().map_err(|_| bad())?;
        Ok(WorkerId { k, n, threads })
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.k, self.n)?;
        if let Some(t) = self.threads {
            write!(f, "/{t}")?;
        }
        Ok(())
    }
}

/// Descriptors handed to one worker across its exec ([`Workers::start_passing`]).
#[derive(Debug, Clone, Copy)]
pub struct Pass<'a> {
    /// The worker (its K) that gets them.
    pub worker: u32,
    /// The descriptors; the caller keeps them open until `start_passing` returns.
    pub fds: &'a [BorrowedFd<'a>],
    /// The environment variable that names them to the worker.
    pub var: &'a str,
}

/// The workers' stdins, in start order; `None` once the job took (closed) one.
pub type Stdins = [Option<ChildStdin>];

/// How one worker ended.
#[derive(Debug)]
pub struct Exit {
    /// The worker.
    pub id: WorkerId,
    /// Its exit status, or why it could not be waited for.
    pub status: io::Result<ExitStatus>,
}

/// Why the workers could not be started.
#[derive(Debug)]
pub struct StartError {
    /// The worker that could not be started.
    pub id: WorkerId,
    /// The OS error from spawning it.
    pub source: io::Error,
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "start worker {}", self.id)
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// In a worker process, once its SIGINT/SIGTERM handler is installed: lets the stop signals in.
/// [`Workers::start`] starts each worker with them blocked, so a stop that comes while the
/// worker is still starting waits for the handler instead of killing it; it is delivered here.
pub fn stop_signals_ready() {
    // SAFETY: a sigset_t is plain data; sigprocmask only changes this thread's mask, and this
    // is called on the main thread before any other is spawned, so every thread inherits it.
    unsafe {
        let mut stops: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut stops);
        libc::sigaddset(&mut stops, libc::SIGINT);
        libc::sigaddset(&mut stops, libc::SIGTERM);
        libc::sigprocmask(libc::SIG_UNBLOCK, &stops, std::ptr::null_mut());
    }
}

/// Running workers.
#[derive(Debug)]
pub struct Workers {
    ids: Vec<WorkerId>,
    children: Vec<Child>,
}

impl Workers {
    /// Starts `exe args... --worker ID` for each of `ids`: stdin and stdout piped to us, stderr
    /// inherited (their error lines and live lines reach the user as ours do). If one cannot be
    /// started, those already started are stopped and reaped. Each starts with SIGINT and
    /// SIGTERM blocked and lets them in with [`stop_signals_ready`] once its handler is in
    /// place, so a stop never finds a worker half started.
    pub fn start(
        exe: &Path,
        args: &[OsString],
        ids: impl IntoIterator<Item = WorkerId>,
    ) -> Result<Workers, StartError> {
        Self::start_passing(exe, args, ids, None)
    }

    /// [`Workers::start`], handing `pass.fds` to worker `pass.worker` across its exec: they
    /// stay open in it under the same numbers (every other descriptor is close-on-exec, and
    /// these stay so in the parent and in the other workers), and `pass.var` names them to it,
    /// comma-separated (as nginx names the listeners it hands to a new binary).
    pub fn start_passing(
        exe: &Path,
        args: &[OsString],
        ids: impl IntoIterator<Item = WorkerId>,
        pass: Option<Pass<'_>>,
    ) -> Result<Workers, StartError> {
        let mut w = Workers {
            ids: Vec::new(),
            children: Vec::new(),
        };
        for id in ids {
            let mut cmd = Command::new(exe);
            cmd.args(args)
                .arg("--worker")
                .arg(id.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let keep: Vec<RawFd> = match pass {
                Some(p) if p.worker == id.k => {
                    let fds: Vec<RawFd> = p.fds.iter().map(AsRawFd::as_raw_fd).collect();
                    let list: Vec<String> = fds.iter().map(ToString::to_string).collect();
                    cmd.env(p.var, list.join(","));
                    fds
                }
                _ => Vec::new(),
            };
            // SAFETY: prctl, sigemptyset/sigaddset, sigprocmask and fcntl are
            // async-signal-safe, and `keep` was allocated before the fork; nothing else runs
            // between fork and exec.
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(move || {
                    // A worker must not outlive a parent that was killed outright.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    // Until its handler is in place (`stop_signals_ready`), a stop signal
                    // would kill the worker by default action: a run stopped while a worker
                    // was still starting ended "worker failed (signal 15)". Blocked, the signal
                    // waits for the handler; the mask is kept across exec.
                    let mut stops: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut stops);
                    libc::sigaddset(&mut stops, libc::SIGINT);
                    libc::sigaddset(&mut stops, libc::SIGTERM);
                    libc::sigprocmask(libc::SIG_BLOCK, &stops, std::ptr::null_mut());
                    // In this child only (its descriptor table is its own after the fork).
                    for &fd in &keep {
                        let flags = libc::fcntl(fd, libc::F_GETFD);
                        if flags < 0
                            || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                        {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(c) => {
                    w.ids.push(id);
                    w.children.push(c);
                }
                Err(source) => {
                    w.signal_all(libc::SIGTERM);
                    for c in &mut w.children {
                        let _ = c.wait();
                    }
                    return Err(StartError { id, source });
                }
            }
        }
        Ok(w)
    }

    /// The workers' ids, in the order they were started (line and stdin indices follow it).
    pub fn ids(&self) -> &[WorkerId] {
        &self.ids
    }

    fn signal_all(&self, sig: libc::c_int) {
        for c in &self.children {
            // The children are not reaped before `run` returns, so their pids cannot be
            // anyone else's.
            // SAFETY: kill has no memory effects.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    /// Runs the workers to their end and returns how each ended, in start order.
    ///
    /// `on_line(i, line)` is called, from one reader thread per worker, with every line worker
    /// `i` prints on stdout. `tick(stdins, ended)` is called on this thread every 20 ms with the
    /// workers' stdins (the job's way to talk to them; take one to close it) and which of them
    /// have ended (a protocol waiting for every worker must stop waiting for those). When `stop` is
    /// set, or a worker ends with a failure, the workers still running get SIGTERM once: they
    /// stop as the job does on its first signal and print what they have.
    pub fn run(
        mut self,
        stop: &AtomicBool,
        on_line: &(dyn Fn(usize, &str) + Sync),
        tick: &mut dyn FnMut(&mut Stdins, &[bool]),
    ) -> Vec<Exit> {
        let mut stdins: Vec<Option<ChildStdin>> =
            self.children.iter_mut().map(|c| c.stdin.take()).collect();
        let outs: Vec<_> = self.children.iter_mut().map(|c| c.stdout.take()).collect();
        let mut status: Vec<Option<io::Result<ExitStatus>>> =
            self.children.iter().map(|_| None).collect();
        std::thread::scope(|s| {
            for (i, out) in outs.into_iter().enumerate() {
                let Some(out) = out else { continue };
                s.spawn(move || {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        on_line(i, &line);
                    }
                });
            }
            let mut stopped = false;
            loop {
                for (c, st) in self.children.iter_mut().zip(status.iter_mut()) {
                    if st.is_none() {
                        match c.try_wait() {
                            Ok(Some(x)) => *st = Some(Ok(x)),
                            Ok(None) => {}
                            Err(e) => *st = Some(Err(e)),
                        }
                    }
                }
                let failed = status.iter().any(|st| {
                    matches!(st, Some(Ok(x)) if !x.success()) || matches!(st, Some(Err(_)))
                });
                if !stopped && (failed || stop.load(Ordering::Relaxed)) {
                    stopped = true;
                    for (c, st) in self.children.iter().zip(&status) {
                        if st.is_none() {
                            // SAFETY: kill has no memory effects; the child is not reaped.
                            unsafe {
                                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
                            }
                        }
                    }
                }
                if status.iter().all(Option::is_some) {
                    break;
                }
                let ended: Vec<bool> = status.iter().map(Option::is_some).collect();
                tick(&mut stdins, &ended);
                std::thread::sleep(POLL);
            }
            // The readers end at their worker's EOF, which came with its exit.
        });
        self.ids
            .iter()
            .zip(status)
            .map(|(&id, st)| Exit {
                id,
                status: st.unwrap_or_else(|| Err(io::Error::other("not waited for"))),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn one_syntax_with_or_without_threads() {
        let w = WorkerId::parse("0/3").unwrap();
        assert_eq!((w.k, w.n, w.threads), (0, 3, None));
        assert_eq!(w.to_string(), "0/3");
        let w = WorkerId::parse("2/3/4").unwrap();
        assert_eq!((w.k, w.n, w.threads), (2, 3, Some(4)));
        assert_eq!(w.to_string(), "2/3/4");
        for bad in [
            "",
            "1",
            "3/3",
            "1/0",
            "a/2",
            "0/2/0",
            "0/2/1/1",
            "0/99999999999",
            "-1/2",
        ] {
            let e = WorkerId::parse(bad).unwrap_err();
            assert!(e.starts_with(&format!("--worker '{bad}': expected")), "{e}");
        }
    }

    fn ids(n: u32) -> Vec<WorkerId> {
        (0..n)
            .map(|k| WorkerId {
                k,
                n,
                threads: None,
            })
            .collect()
    }

    /// `sh -c SCRIPT sh --worker K/N`: $2 is the worker's id.
    fn sh(script: &str, n: u32) -> Workers {
        let args: Vec<OsString> = ["-c", script, "sh"].iter().map(OsString::from).collect();
        Workers::start(Path::new("/bin/sh"), &args, ids(n)).unwrap()
    }

    #[test]
    fn lines_reach_the_job_and_stdin_reaches_the_workers() {
        let w = sh("read go; echo \"$2 got $go\"", 3);
        let lines = Mutex::new(Vec::new());
        let mut said = false;
        let exits = w.run(
            &AtomicBool::new(false),
            &|i, l| lines.lock().unwrap().push((i, l.to_string())),
            &mut |stdins, _| {
                if !said {
                    said = true;
                    for s in stdins.iter_mut() {
                        use std::io::Write;
                        let _ = writeln!(s.take().unwrap(), "go");
                    }
                }
            },
        );
        assert!(exits.iter().all(|e| e.status.as_ref().unwrap().success()));
        let mut l = lines.into_inner().unwrap();
        l.sort();
        assert_eq!(
            l,
            vec![
                (0, "0/3 got go".to_string()),
                (1, "1/3 got go".to_string()),
                (2, "2/3 got go".to_string())
            ]
        );
    }

    #[test]
    fn a_failing_worker_stops_the_others() {
        // Worker 0 fails at once; the others would sleep for a minute, once they let the stop
        // signals in as a tcpkit worker does when its handler is ready (they start blocked).
        let w = sh(
            "[ \"$2\" = 0/3 ] && exit 3; exec perl -MPOSIX -e \
             'sigprocmask(SIG_UNBLOCK, POSIX::SigSet->new(SIGINT, SIGTERM)); sleep 60'",
            3,
        );
        let t = std::time::Instant::now();
        let exits = w.run(&AtomicBool::new(false), &|_, _| {}, &mut |_, _| {});
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
        assert_eq!(exits[0].status.as_ref().unwrap().code(), Some(3));
        for e in &exits[1..] {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(e.status.as_ref().unwrap().signal(), Some(libc::SIGTERM));
        }
    }

    #[test]
    fn the_stop_flag_reaches_every_worker() {
        let w = sh(
            "trap 'echo stopped; exit 0' TERM; echo up; while :; do sleep 0.05; done",
            2,
        );
        let stop = AtomicBool::new(false);
        let up = std::sync::atomic::AtomicUsize::new(0);
        let stopped = std::sync::atomic::AtomicUsize::new(0);
        let exits = w.run(
            &stop,
            &|_, l| match l {
                // Both shells have their trap: stop now.
                "up" if up.fetch_add(1, Ordering::SeqCst) == 1 => {
                    stop.store(true, Ordering::SeqCst);
                }
                "stopped" => {
                    stopped.fetch_add(1, Ordering::SeqCst);
                }
                _ => {}
            },
            &mut |_, _| {},
        );
        assert!(exits.iter().all(|e| e.status.as_ref().unwrap().success()));
        assert_eq!(stopped.load(Ordering::SeqCst), 2);
    }

    /// A passed descriptor is open in its worker only, which is told its number; the others
    /// and the parent keep it close-on-exec.
    #[test]
    fn a_passed_descriptor_reaches_its_worker_only() {
        use std::os::fd::AsFd;
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = file.as_raw_fd();
        let script = format!(
            "if [ -e /proc/self/fd/{fd} ]; then echo \"$2 open ${{PASSED:-unnamed}}\"; else echo \"$2 closed ${{PASSED:-unnamed}}\"; fi"
        );
        let args: Vec<OsString> = ["-c", &script, "sh"].iter().map(OsString::from).collect();
        let fds = [file.as_fd()];
        let pass = Pass {
            worker: 1,
            fds: &fds,
            var: "PASSED",
        };
        let w = Workers::start_passing(Path::new("/bin/sh"), &args, ids(2), Some(pass)).unwrap();
        let lines = Mutex::new(Vec::new());
        let exits = w.run(
            &AtomicBool::new(false),
            &|_, l| lines.lock().unwrap().push(l.to_string()),
            &mut |_, _| {},
        );
        assert!(exits.iter().all(|e| e.status.as_ref().unwrap().success()));
        let mut l = lines.into_inner().unwrap();
        l.sort();
        assert_eq!(
            l,
            vec!["0/2 closed unnamed".to_string(), format!("1/2 open {fd}")]
        );
        // SAFETY: F_GETFD only reads the descriptor table.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(
            flags & libc::FD_CLOEXEC,
            libc::FD_CLOEXEC,
            "the parent's copy"
        );
    }

    #[test]
    fn a_program_that_cannot_start_names_the_worker() {
        let e = Workers::start(Path::new("/nonexistent/tcpkit"), &[], ids(2)).unwrap_err();
        assert_eq!(e.id.k, 0);
        assert_eq!(e.to_string(), "start worker 0/2");
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
    }
}
