//! The control socket of `balance up`: a unix stream socket (default
//! /run/tcpkit/balance.sock, mode 600 in a directory of mode 700) where `balance status` and
//! `balance reload` ask one question each. It is a listening socket like any other: one
//! request per connection, a line of at most MAX_REQUEST bytes that must arrive within
//! FIRST_MESSAGE, at most MAX_CONNECTIONS at once (more are told so and closed, and counted),
//! and out of descriptors it pauses accepting instead of exiting.

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub const DEFAULT_SOCKET: &str = "/run/tcpkit/balance.sock";
/// Longest request line: the longest request word with room to spare.
pub const MAX_REQUEST: usize = 64;
/// How long a peer has to send its request once connected.
pub const FIRST_MESSAGE: Duration = Duration::from_secs(2);
/// Requests served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// Longest answer a client accepts (a status of 64 services x 64 backends is ~1 MiB).
pub const MAX_ANSWER: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("--socket {0}: {1}")]
    Setup(String, #[source] io::Error),
    #[error("--socket {0}: another balance up answers there")]
    InUse(String),
    #[error("--socket {0}: exists and is not a socket")]
    NotSocket(String),
    #[error("no balance up is running (nothing answers on {0}: {1})")]
    NotRunning(String, #[source] io::Error),
    #[error("{0}: {1}")]
    Talk(String, #[source] io::Error),
    /// The running `up` answered with a refusal (its reason).
    #[error("{0}")]
    Refused(String),
}

/// What the control socket met, for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlStats {
    /// Requests answered.
    pub answered: u64,
    /// Connections turned away because MAX_CONNECTIONS were being served.
    pub refused_busy: u64,
    /// Connections closed because no request came within FIRST_MESSAGE.
    pub timed_out: u64,
    /// Requests too long or not understood.
    pub bad: u64,
    /// Times accept failed for want of descriptors (accepting paused for a moment).
    pub out_of_fds: u64,
}

/// The counters behind [`ControlStats`], shared with whoever reports them.
#[derive(Debug, Default)]
pub struct Counts {
    answered: AtomicU64,
    refused_busy: AtomicU64,
    timed_out: AtomicU64,
    bad: AtomicU64,
    out_of_fds: AtomicU64,
}

/// The answer to one request word (`status`, `reload`), or None for a word not understood.
pub type Handler = dyn Fn(&str) -> Option<String> + Send + Sync;

/// The running control socket; [`Control::stop`] closes it and removes the file (and the
/// directories made for it).
#[derive(Debug)]
pub struct Control {
    made: Option<Made>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

/// The socket file this process bound and the directories it made for it (the deepest
/// first): removed on drop, so neither a refused `up` nor a stopped one leaves them. A
/// directory goes only when empty (another `up`'s socket may be in it).
#[derive(Debug)]
struct Made {
    /// Set once bound: a file found there before is not ours to remove.
    path: Option<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl Drop for Made {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A bound control socket not serving yet ([`Control::start`]); dropped, its file goes.
#[derive(Debug)]
pub struct Bound {
    listener: UnixListener,
    made: Made,
}

/// Binds `path`: its directory made (mode 700) if missing, a stale socket left by a killed
/// `up` removed, one that still answers refused.
pub fn bind(path: &Path) -> Result<Bound, ControlError> {
    let shown = path.display().to_string();
    let mut dirs = Vec::new();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        dirs = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .map(Path::to_path_buf)
            .collect();
        if !dirs.is_empty() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| ControlError::Setup(shown.clone(), e))?;
        }
    }
    // From here on, the directories made go again if binding fails.
    let mut made = Made { path: None, dirs };
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => return Err(ControlError::NotSocket(shown)),
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(ControlError::InUse(shown));
            }
            std::fs::remove_file(path).map_err(|e| ControlError::Setup(shown.clone(), e))?;
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|e| ControlError::Setup(shown.clone(), e))?;
    made.path = Some(path.to_path_buf());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ControlError::Setup(shown, e))?;
    Ok(Bound { listener, made })
}

impl Control {
    /// Serves `listener` on a thread of its own until stopped.
    /// `first_message`: how long a peer has to send its request (FIRST_MESSAGE in use).
    pub fn start(
        bound: Bound,
        handler: Arc<Handler>,
        first_message: Duration,
        counts: Arc<Counts>,
    ) -> Result<Control, ControlError> {
        let Bound { listener, made } = bound;
        let shown = made
            .path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        listener
            .set_nonblocking(true)
            .map_err(|e| ControlError::Setup(shown.clone(), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (st, c) = (Arc::clone(&stop), Arc::clone(&counts));
        let thread = std::thread::Builder::new()
            .name("tcpkit-balance-control".into())
            .spawn(move || accept_loop(&listener, &st, &c, &handler, first_message))
            .map_err(|e| ControlError::Setup(shown, e))?;
        Ok(Control {
            made: Some(made),
            stop,
            thread: Some(thread),
            counts,
        })
    }

    pub fn stats(&self) -> ControlStats {
        self.counts.stats()
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.made = None;
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Counts {
    pub fn stats(&self) -> ControlStats {
        ControlStats {
            answered: self.answered.load(Ordering::Relaxed),
            refused_busy: self.refused_busy.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            bad: self.bad.load(Ordering::Relaxed),
            out_of_fds: self.out_of_fds.load(Ordering::Relaxed),
        }
    }
}

fn accept_loop(
    l: &UnixListener,
    stop: &AtomicBool,
    counts: &Arc<Counts>,
    handler: &Arc<Handler>,
    first_message: Duration,
) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match l.accept() {
            Ok((s, _)) => {
                if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    counts.refused_busy.fetch_add(1, Ordering::Relaxed);
                    // What the peer sent is read (if here yet) and dropped: closing on unread
                    // bytes would reset the connection before it reads why.
                    let _ = s.set_nonblocking(true);
                    let _ = (&s).read(&mut [0u8; MAX_REQUEST + 1]);
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = (&s).write_all(
                        error_answer(&format!(
                            "busy: {MAX_CONNECTIONS} requests are being served, try again"
                        ))
                        .as_bytes(),
                    );
                    continue;
                }
                active.fetch_add(1, Ordering::SeqCst);
                let (a, c, h) = (Arc::clone(&active), Arc::clone(counts), Arc::clone(handler));
                let spawned = std::thread::Builder::new()
                    .name("tcpkit-balance-request".into())
                    .spawn(move || {
                        serve_one(s, &c, h.as_ref(), first_message);
                        a.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // Out of descriptors: counted, and accepting waits for some to free up.
                counts.out_of_fds.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `{"error": "..."}` and a newline.
pub fn error_answer(why: &str) -> String {
    serde_json::json!({ "error": why }).to_string() + "\n"
}

/// Reads one request line (at most MAX_REQUEST bytes, within `first_message`), answers, closes.
fn serve_one(mut s: UnixStream, counts: &Counts, handler: &Handler, first_message: Duration) {
    let deadline = Instant::now() + first_message;
    let mut buf = [0u8; MAX_REQUEST + 1];
    let mut n = 0;
    let line = loop {
        if let Some(end) = buf[..n].iter().position(|b| *b == b'\n') {
            break Some(end);
        }
        if n > MAX_REQUEST {
            break None;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            counts.timed_out.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match s.read(&mut buf[n..]) {
            // A request without its newline is complete when the peer shuts its side.
            Ok(0) if n > 0 => break Some(n),
            Ok(0) => return,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                counts.timed_out.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(_) => return,
        }
    };
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let answer = match line {
        None => {
            counts.bad.fetch_add(1, Ordering::Relaxed);
            error_answer(&format!("request longer than {MAX_REQUEST} bytes"))
        }
        Some(end) => {
            let word = std::str::from_utf8(&buf[..end]).unwrap_or("").trim();
            match handler(word) {
                Some(a) => {
                    counts.answered.fetch_add(1, Ordering::Relaxed);
                    a
                }
                None => {
                    counts.bad.fetch_add(1, Ordering::Relaxed);
                    error_answer(&format!(
                        "unknown request {:?}: status or reload",
                        word.chars().take(MAX_REQUEST).collect::<String>()
                    ))
                }
            }
        }
    };
    let _ = s.write_all(answer.as_bytes());
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// Asks and parses the answer: the `{"error": ...}` of a refusal becomes an error.
fn ask_json(
    path: &Path,
    word: &str,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<serde_json::Value, ControlError> {
    let text = request_until(path, word, timeout, stop)?;
    let shown = path.display().to_string();
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        ControlError::Talk(
            shown.clone(),
            io::Error::other(format!("the answer is not JSON: {e}")),
        )
    })?;
    if let Some(why) = v.get("error").and_then(|e| e.as_str()) {
        return Err(ControlError::Refused(why.to_string()));
    }
    Ok(v)
}

/// `balance status`: the running `up`'s status, within `timeout` unless `stop` is set first.
pub fn ask_status(
    path: &Path,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<crate::StatusReport, ControlError> {
    let v = ask_json(path, "status", timeout, stop)?;
    serde_json::from_value(v).map_err(|e| {
        ControlError::Talk(
            path.display().to_string(),
            io::Error::other(format!("the answer is not a status: {e}")),
        )
    })
}

/// `balance reload`: how many services the new configuration has.
pub fn ask_reload(path: &Path, timeout: Duration, stop: &AtomicBool) -> Result<u64, ControlError> {
    let v = ask_json(path, "reload", timeout, stop)?;
    Ok(v["services"].as_u64().unwrap_or(0))
}

/// Asks the `up` listening on `path` one question and returns its answer.
pub fn request(path: &Path, word: &str, timeout: Duration) -> Result<String, ControlError> {
    request_until(path, word, timeout, &AtomicBool::new(false))
}

/// How often a client waiting for its answer looks at `stop`.
const STOP_POLL: Duration = Duration::from_millis(50);

/// A connection to `path` that does not block: a listener whose backlog is full (one that
/// never accepts) gives EAGAIN, tried again until `deadline` or `stop`.
fn connect(path: &Path, deadline: Instant, stop: &AtomicBool) -> io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; zeroed is a valid (empty) value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= sa.sun_path.len() {
        return Err(io::Error::other("the path is longer than a unix socket's"));
    }
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, b) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *b as libc::c_char;
    }
    loop {
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor socket(2) just returned and nothing else owns.
        let s = unsafe { UnixStream::from_raw_fd(fd) };
        // SAFETY: connect(2) reads `sa`, of the size given, alive for the call.
        let r = unsafe {
            libc::connect(
                fd,
                (&raw const sa).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if r == 0 {
            s.set_nonblocking(false)?;
            return Ok(s);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
        waited(deadline, stop)?;
        std::thread::sleep(STOP_POLL);
    }
}

/// Ok while there is time left and no signal asked to stop.
fn waited(deadline: Instant, stop: &AtomicBool) -> io::Result<()> {
    if stop.load(Ordering::Relaxed) {
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "interrupted (SIGINT/SIGTERM) before an answer",
        ));
    }
    if Instant::now() >= deadline {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no answer in time: the balance up there is stuck, or what listens is no balance up",
        ));
    }
    Ok(())
}

/// [`request`], giving up after `timeout` in all, or as soon as `stop` is set (SIGINT,
/// SIGTERM): the socket is read in short slices, so a server that never answers holds the
/// client no longer than that.
pub fn request_until(
    path: &Path,
    word: &str,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<String, ControlError> {
    let shown = path.display().to_string();
    let deadline = Instant::now() + timeout;
    let mut s = connect(path, deadline, stop).map_err(|e| match e.kind() {
        io::ErrorKind::Interrupted | io::ErrorKind::TimedOut => {
            ControlError::Talk(shown.clone(), e)
        }
        _ => ControlError::NotRunning(shown.clone(), e),
    })?;
    let talk = |e| ControlError::Talk(shown.clone(), e);
    s.set_read_timeout(Some(STOP_POLL)).map_err(talk)?;
    s.set_write_timeout(Some(timeout.max(STOP_POLL)))
        .map_err(talk)?;
    match s.write_all(format!("{word}\n").as_bytes()) {
        Ok(()) => {}
        // Answered and closed before our line was read (busy): the answer is still to read.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) => {}
        Err(e) => return Err(talk(e)),
    }
    let mut out = Vec::new();
    let mut r = (&mut s).take(MAX_ANSWER);
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) =>
            {
                waited(deadline, stop).map_err(talk)?;
            }
            // A server that answered without reading our line (busy) resets after its answer.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !out.is_empty() => break,
            Err(e) => return Err(talk(e)),
        }
    }
    String::from_utf8(out).map_err(|e| talk(io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(dir: &Path, first_message: Duration) -> (Control, PathBuf) {
        let path = dir.join("sub").join("c.sock");
        let l = bind(&path).unwrap();
        let h: Arc<Handler> = Arc::new(|w: &str| (w == "status").then(|| "{}\n".to_string()));
        let c = Control::start(l, h, first_message, Arc::default()).unwrap();
        (c, path)
    }

    #[test]
    fn one_request_one_answer_and_hostile_peers_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (c, path) = serve(dir.path(), Duration::from_millis(300));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
        let t = Duration::from_secs(10);
        assert_eq!(request(&path, "status", t).unwrap(), "{}\n");
        assert!(request(&path, "nonsense", t)
            .unwrap()
            .contains("unknown request"));
        let long = "x".repeat(MAX_REQUEST + 10);
        assert!(request(&path, &long, t).unwrap().contains("longer than"));
        // A silent peer is closed after FIRST_MESSAGE; others are served meanwhile.
        let silent = UnixStream::connect(&path).unwrap();
        assert_eq!(request(&path, "status", t).unwrap(), "{}\n");
        let mut buf = Vec::new();
        (&silent).read_to_end(&mut buf).unwrap();
        assert!(buf.is_empty());
        // A second bind on the same path is refused while this one answers.
        assert!(matches!(bind(&path), Err(ControlError::InUse(_))));
        let s = c.stats();
        assert_eq!((s.answered, s.bad, s.timed_out), (2, 2, 1), "{s:?}");
        c.stop();
        assert!(!path.exists(), "the socket file goes with it");
        assert!(
            !dir.path().join("sub").exists(),
            "and the directory made for it"
        );
        assert!(matches!(
            request(&path, "status", t),
            Err(ControlError::NotRunning(..))
        ));
    }

    #[test]
    fn a_refused_up_leaves_no_socket_and_never_removes_anothers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a").join("b").join("c.sock");
        // Bound, then refused for another reason before serving: nothing of it stays.
        drop(bind(&path).unwrap());
        assert!(!dir.path().join("a").exists());
        // A directory that was there stays; a file that is not a socket is not touched.
        std::fs::create_dir(dir.path().join("a")).unwrap();
        drop(bind(&path).unwrap());
        assert!(dir.path().join("a").exists() && !dir.path().join("a/b").exists());
        let plain = dir.path().join("a").join("plain");
        std::fs::write(&plain, "").unwrap();
        assert!(matches!(bind(&plain), Err(ControlError::NotSocket(_))));
        assert!(plain.exists());
        // Nor is the socket of an `up` that answers.
        let (c, live) = serve(dir.path(), Duration::from_secs(1));
        assert!(matches!(bind(&live), Err(ControlError::InUse(_))));
        assert!(live.exists());
        c.stop();
    }

    #[test]
    fn more_than_the_cap_are_told_busy() {
        let dir = tempfile::tempdir().unwrap();
        // Held connections stay in service for the whole test (a minute to send a request).
        let (c, path) = serve(dir.path(), Duration::from_secs(60));
        let held: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        // Until all held ones are accepted, a new one may still get in; wait for the cap.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let a = request(&path, "status", Duration::from_secs(10)).unwrap();
            if a.contains("busy") {
                break;
            }
            assert!(Instant::now() < until, "never busy: {a}");
        }
        assert!(c.stats().refused_busy >= 1);
        drop(held);
    }
}
