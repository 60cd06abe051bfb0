//! Duplex: the listener's input goes back to the connecting side's output, as with `nc` and
//! a shell on one side.
//!
//! # What a session is, both ways
//!
//! - Each direction is its own stream with its own sequence space, credit, end frame and
//!   hash. The forward stream (connecting side → listener) is striped as always; the
//!   reverse stream (listener → connecting side) travels on one more connection, which the
//!   connecting side opens *first* with the stream index
//!   [`REVERSE_STREAM`](crate::frame::REVERSE_STREAM) and the session's token. The listener
//!   holds it to the same bounds as every connection (Hello deadline, handshake cap, token,
//!   `--psk-file`); one opened first means the listener knows before any data whether the
//!   peer wants the reverse direction, and a peer that never opens one (an older mpcat) gets
//!   a one-way session exactly as before. Reopening after a failure is the connecting side's
//!   job and is not done for the reverse connection: its failure fails the session.
//! - An end of input always ends its direction with an end frame (mpcat needs it to check
//!   the hash), so the peer's output always sees EOF when the stream was delivered whole: the
//!   listener closes its output (stdout or -o FILE) once the forward stream is verified,
//!   while the reverse direction may still run. What OpenBSD `nc -N` gives is thus always
//!   there; what is left to choose is how long the connecting side waits for the answer:
//!   - default (as OpenBSD nc without -q), `-N` and `-q -1`: the session stays open until
//!     the listener's input ends, however long that takes, so the answer of
//!     `echo cmd | mpcat HOST P` arrives whole;
//!   - `-q 0`: the session ends once the forward stream is delivered; the listener ends its
//!     stream there with what it has sent ([`Frame::Stop`]), so `mpcat -l P > file` with a
//!     terminal (or any input that never ends) still finishes;
//!   - `-q SECS`: at most SECS after the forward stream is delivered, then as `-q 0`.
//! - A side exits 0 only when its forward stream and (when there was one) the reverse stream
//!   both ended and were verified; a reverse stream cut short fails both sides, naming it.
//! - With `-k` the listener's input is read once, by one thread, and each session's reverse
//!   stream carries what is read while it runs; the output is not closed between sessions.
//!
//! Both ends of the reverse connection run on their own threads with blocking I/O: its
//! rates are a shell's answers or a file, and keeping it off the striping engines' event
//! loops leaves their hot paths as they are.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::frame::{self, Frame, FrameError, DATA_HDR, MAX_CHUNK, REVERSE_STREAM};
use crate::secure::{Channel, MAX_RECORD, REC_HDR};
use crate::send::{self, SendConfig};
use crate::{Error, Input, MpcatCounters, MpcatReport, Output, ReverseReport};

/// Credit the connecting side gives the reverse stream beyond what it has written. It bounds
/// nothing in memory there (chunks are written as they arrive, in order, on one connection);
/// it keeps the rule that a sender never runs past the receiver's word.
pub const REVERSE_WINDOW: u64 = 16 << 20;
/// Bytes written between acks of the reverse stream.
const ACK_EVERY: u64 = 1 << 20;
/// How often the blocking sides look at their flags.
const TICK: Duration = Duration::from_millis(100);

/// How long the connecting side waits for the listener's stream once its own is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `-q 0`: stop the reverse stream at once.
    Now,
    /// `-q SECS`.
    For(Duration),
    /// The default (as OpenBSD nc), `-N`, or `-q -1`: until the listener's input ends.
    Forever,
}

fn failed(bytes: u64, why: String) -> ReverseReport {
    ReverseReport {
        bytes,
        total: None,
        hash: None,
        verified: false,
        stopped: false,
        failure: Some(why),
    }
}

/// Writes `plain` (whole frames) to `s`, sealed into records with --psk-file.
fn put(
    s: &mut TcpStream,
    chan: &Mutex<Option<Channel>>,
    plain: &[u8],
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    let mut ch = chan.lock().unwrap_or_else(|e| e.into_inner());
    match ch.as_mut() {
        Some(c) => {
            scratch.clear();
            c.seal(plain, scratch);
            drop(ch);
            s.write_all(scratch)
        }
        None => {
            drop(ch);
            s.write_all(plain)
        }
    }
}

fn put_frame(
    s: &mut TcpStream,
    chan: &Mutex<Option<Channel>>,
    f: &Frame<'_>,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    let mut b = Vec::with_capacity(f.buffer_len());
    f.emit_vec(&mut b);
    put(s, chan, &b, scratch)
}

/// Frames coming in on the reverse connection: bytes read, records opened (--psk-file), and
/// each whole frame handed to `on` (which returns true to stop).
struct Incoming {
    raw: Vec<u8>,
    raw_len: usize,
    inbuf: Vec<u8>,
    in_len: usize,
}

enum Got {
    Bytes,
    Idle,
    Closed,
}

impl Incoming {
    fn new(chunk: usize) -> Incoming {
        Incoming {
            raw: vec![0; 2 * (REC_HDR + MAX_RECORD)],
            raw_len: 0,
            // A whole data frame beside the longest record's plaintext, so one always opens.
            inbuf: vec![0; DATA_HDR + chunk + (64 << 10)],
            in_len: 0,
        }
    }

    fn read(&mut self, s: &mut TcpStream, encrypted: bool) -> Result<Got, Error> {
        let into = if encrypted {
            &mut self.raw[self.raw_len..]
        } else {
            &mut self.inbuf[self.in_len..]
        };
        match s.read(into) {
            Ok(0) => Ok(Got::Closed),
            Ok(n) if encrypted => {
                self.raw_len += n;
                Ok(Got::Bytes)
            }
            Ok(n) => {
                self.in_len += n;
                Ok(Got::Bytes)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(Got::Idle)
            }
            Err(e) => Err(Error::io("read", e)),
        }
    }

    /// Opens records and hands every whole frame to `on`; stops early when `on` says so.
    fn frames(
        &mut self,
        chan: &Mutex<Option<Channel>>,
        on: &mut dyn FnMut(Frame<'_>) -> Result<bool, Error>,
    ) -> Result<bool, Error> {
        loop {
            let mut opened = 0;
            {
                let mut ch = chan.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = ch.as_mut() {
                    opened = c
                        .open(&self.raw[..self.raw_len], &mut self.inbuf, &mut self.in_len)
                        .map_err(|e| Error::msg(e.to_string()))?;
                    self.raw.copy_within(opened..self.raw_len, 0);
                    self.raw_len -= opened;
                }
            }
            let mut at = 0;
            loop {
                match Frame::parse(&self.inbuf[at..self.in_len]) {
                    Ok((f, used)) => {
                        at += used;
                        if on(f)? {
                            return Ok(true);
                        }
                    }
                    Err(FrameError::Truncated { .. }) => break,
                    Err(e) => return Err(Error::msg(e.to_string())),
                }
            }
            self.inbuf.copy_within(at..self.in_len, 0);
            self.in_len -= at;
            if opened == 0 {
                return Ok(false);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The connecting side.

/// What the connecting side's main thread tells its reverse receiver.
#[derive(Debug, Default)]
struct Ctl {
    /// Send Stop: no more waiting for the listener's input.
    stop: AtomicBool,
    /// The session failed or was interrupted: give up.
    abort: AtomicBool,
}

/// The connecting side's receiving end of the reverse stream, on its own thread.
#[derive(Debug)]
pub struct Back {
    ctl: Arc<Ctl>,
    thread: JoinHandle<ReverseReport>,
}

impl Back {
    /// Opens the reverse connection (the session's first) and starts receiving on it into
    /// `output`, which is opened first so a bad -o fails before anything connects.
    pub fn open(
        cfg: &SendConfig,
        token: frame::Token,
        output: &Output,
        hint: &dyn Fn(&str),
    ) -> Result<Back, Error> {
        let out = crate::recv::open_output(output, false)?;
        let c = SendConfig {
            mptcp: false,
            ..cfg.clone()
        };
        let (s, _addr, _window, chan) =
            send::connect(&c, 1, None, &cfg.peer, None, token, REVERSE_STREAM, None)?;
        s.set_read_timeout(Some(TICK))
            .map_err(|e| Error::io("SO_RCVTIMEO on the reverse stream", e))?;
        if let (true, Ok(l), Ok(p)) = (cfg.verbose, s.local_addr(), s.peer_addr()) {
            hint(&format!("connected {l} to {p}: the reverse stream"));
        }
        let ctl = Arc::new(Ctl::default());
        let thread = {
            let ctl = Arc::clone(&ctl);
            let (chunk, idle) = (cfg.chunk as usize, cfg.path_timeout);
            std::thread::Builder::new()
                .name("mpcat-back".into())
                .spawn(move || receive(s, chan, out, chunk, idle, &ctl))
                .map_err(|e| Error::io("start the reverse stream's thread", e))?
        };
        Ok(Back { ctl, thread })
    }

    fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    fn join(self) -> ReverseReport {
        self.thread
            .join()
            .unwrap_or_else(|_| failed(0, "its thread panicked".into()))
    }
}

/// The connecting side: the reverse connection first, then the forward stream as always,
/// then the wait for the listener's stream that `wait` asks for.
pub fn connect_side(
    cfg: &SendConfig,
    output: &Output,
    wait: Wait,
    stop: &AtomicBool,
    live: &MpcatCounters,
    hint: &dyn Fn(&str),
) -> Result<MpcatReport, Error> {
    let token = crate::random_token()?;
    let back = Back::open(cfg, token, output, hint)?;
    let fwd = SendConfig {
        token: Some(token),
        ..cfg.clone()
    };
    let mut report = match send::run(&fwd, stop, live, hint) {
        Ok(r) => r,
        Err(e) => {
            back.ctl.abort.store(true, Ordering::Relaxed);
            let _ = back.join();
            return Err(e);
        }
    };
    if report.failure.is_none() && report.verified {
        let since = Instant::now();
        loop {
            if back.finished() {
                break;
            }
            if stop.load(Ordering::Relaxed) {
                back.ctl.abort.store(true, Ordering::Relaxed);
                break;
            }
            let enough = match wait {
                Wait::Now => true,
                Wait::For(d) => since.elapsed() >= d,
                Wait::Forever => false,
            };
            if enough {
                back.ctl.stop.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        back.ctl.abort.store(true, Ordering::Relaxed);
    }
    let interrupted = back.ctl.abort.load(Ordering::Relaxed) && report.failure.is_none();
    let mut rev = back.join();
    if interrupted {
        rev.failure = Some(format!(
            "interrupted while waiting for the listener's stream ({} bytes of it written)",
            rev.bytes
        ));
        rev.verified = false;
    }
    if report.failure.is_none() {
        if let Some(why) = &rev.failure {
            report.failure = Some(format!("the reverse stream (listener to here): {why}"));
        }
    }
    report.reverse = Some(rev);
    Ok(report)
}

/// The connecting side's loop on the reverse connection: data in order to the output,
/// credit back, and the verdict once its end frame comes.
fn receive(
    mut s: TcpStream,
    chan: Option<Channel>,
    out: crate::recv::Sink,
    chunk: usize,
    idle: Duration,
    ctl: &Ctl,
) -> ReverseReport {
    let encrypted = chan.is_some();
    let chan = Mutex::new(chan);
    let r = receive_on(&mut s, &chan, encrypted, out, chunk, idle, ctl);
    // Failed here (the output, a bad frame): the listener is told why rather than left to
    // find a closed connection. Best effort; the connection closes right after.
    if let Some(why) = r.failure.as_deref().filter(|_| r.total.is_none()) {
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = put_frame(
            &mut s,
            &chan,
            &Frame::Refuse { reason: why },
            &mut Vec::new(),
        );
        // Closing with its data unread would reset the connection, and the listener could
        // lose the reason with it: half-close, and read what is still coming (at most 1 s).
        let _ = s.shutdown(std::net::Shutdown::Write);
        let until = Instant::now() + Duration::from_secs(1);
        let mut sink = [0u8; 64 << 10];
        while Instant::now() < until {
            match s.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => break,
            }
        }
    }
    r
}

fn receive_on(
    s: &mut TcpStream,
    chan: &Mutex<Option<Channel>>,
    encrypted: bool,
    mut out: crate::recv::Sink,
    chunk: usize,
    idle: Duration,
    ctl: &Ctl,
) -> ReverseReport {
    let mut scratch = Vec::new();
    let mut inc = Incoming::new(chunk);
    let mut hasher = crate::StreamHasher::new();
    let (mut got, mut last_ack) = (0u64, 0u64);
    let mut stop_sent: Option<Instant> = None;
    let mut last_byte = Instant::now();
    let ack = |s: &mut TcpStream, scratch: &mut Vec<u8>, got: u64| {
        put_frame(
            s,
            chan,
            &Frame::Ack {
                acked: got,
                limit: got + REVERSE_WINDOW,
            },
            scratch,
        )
    };
    if let Err(e) = ack(s, &mut scratch, 0) {
        return failed(0, format!("write: {e}"));
    }
    let mut verdict: Option<ReverseReport> = None;
    loop {
        if ctl.abort.load(Ordering::Relaxed) {
            return failed(got, "the session failed before it ended".into());
        }
        if stop_sent.is_none() && ctl.stop.load(Ordering::Relaxed) {
            if let Err(e) = put_frame(s, chan, &Frame::Stop, &mut scratch) {
                return failed(got, format!("write: {e}"));
            }
            stop_sent = Some(Instant::now());
            last_byte = Instant::now();
        }
        // Once stopped, the listener owes its end frame: silence past --path-timeout is
        // a listener that no longer answers, not a wait.
        if stop_sent.is_some() && last_byte.elapsed() >= idle.max(Duration::from_secs(1)) {
            return failed(
                got,
                format!("no end frame within {idle:?} of asking the listener to stop"),
            );
        }
        match inc.read(s, encrypted) {
            Ok(Got::Idle) => continue,
            Ok(Got::Closed) => {
                return failed(
                    got,
                    format!(
                    "the listener closed its connection after {got} bytes, before the stream's end"
                ),
                )
            }
            Ok(Got::Bytes) => last_byte = Instant::now(),
            Err(e) => return failed(got, e.line()),
        }
        let mut on = |f: Frame<'_>| -> Result<bool, Error> {
            match f {
                Frame::Data { seq, payload } => {
                    if payload.len() > chunk {
                        return Err(Error::msg(format!(
                            "a {}-byte chunk, the session's chunk is {chunk}",
                            payload.len()
                        )));
                    }
                    if seq != got {
                        return Err(Error::msg(format!("bytes at {seq} where {got} was due")));
                    }
                    out.w
                        .write_all(payload)
                        .map_err(|e| Error::io(format!("write {}", out.name), e))?;
                    hasher.update(payload);
                    got += payload.len() as u64;
                    if got - last_ack >= ACK_EVERY {
                        last_ack = got;
                        ack(s, &mut scratch, got).map_err(|e| Error::io("write", e))?;
                    }
                    Ok(false)
                }
                Frame::End { total, hash } => {
                    out.w
                        .flush()
                        .map_err(|e| Error::io(format!("write {}", out.name), e))?;
                    let ok = total == got && hasher.finish() == hash;
                    put_frame(s, chan, &Frame::Done { total, ok }, &mut scratch)
                        .map_err(|e| Error::io("write", e))?;
                    let failure = match (total == got, ok) {
                        (false, _) => {
                            Some(format!("its end frame says {total} bytes, {got} arrived"))
                        }
                        (true, false) => Some(format!(
                            "its hash does not match: {total} bytes arrived corrupted"
                        )),
                        _ => None,
                    };
                    verdict = Some(ReverseReport {
                        bytes: got,
                        total: Some(total),
                        hash: Some(format!("{}:{}", crate::HASH_NAME, send::hex(&hash))),
                        verified: ok,
                        stopped: stop_sent.is_some(),
                        failure,
                    });
                    Ok(true)
                }
                Frame::Refuse { reason } | Frame::Abort { reason } => {
                    Err(Error::msg(format!("the listener gave up: {reason}")))
                }
                other => Err(Error::msg(format!(
                    "the listener sent a frame only a connecting side sends: {other:?}"
                ))),
            }
        };
        match inc.frames(chan, &mut on) {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => return failed(got, e.line()),
        }
    }
    verdict.unwrap_or_else(|| failed(got, "no verdict".into()))
}

// ---------------------------------------------------------------------------------------
// The listener.

/// What the listener's input reader hands on.
#[derive(Debug)]
enum Piece {
    Bytes(Vec<u8>),
    End,
    Failed(Error),
}

/// The listener's input, read by one thread for every session of the run (-k): each reverse
/// stream takes what is read while it runs.
#[derive(Debug)]
pub struct Feed {
    inner: Mutex<FeedState>,
}

#[derive(Debug)]
struct FeedState {
    rx: mpsc::Receiver<Piece>,
    /// Bytes read but not yet sent (a Stop came in the middle of a piece).
    pending: Vec<u8>,
    ended: Option<Result<(), Error>>,
}

impl Feed {
    /// Starts reading `input` (opened here: a file that cannot be opened is said at once).
    pub fn start(input: &Input) -> Result<Arc<Feed>, Error> {
        let mut r: Box<dyn Read + Send> = match input {
            Input::Stdin => Box::new(io::stdin()),
            Input::File(p) => Box::new(
                std::fs::File::open(p)
                    .map_err(|e| Error::io(format!("open {}", p.display()), e))?,
            ),
        };
        // A few pieces ahead: the input is read no faster than the reverse stream goes.
        let (tx, rx) = mpsc::sync_channel(4);
        std::thread::Builder::new()
            .name("mpcat-input".into())
            .spawn(move || {
                // What one read gives is sent at once (a shell's answer should not wait for
                // a full chunk); the allocation per piece is noise at these rates.
                loop {
                    let mut b = vec![0u8; 64 << 10];
                    match r.read(&mut b) {
                        Ok(0) => {
                            let _ = tx.send(Piece::End);
                            return;
                        }
                        Ok(n) => {
                            b.truncate(n);
                            if tx.send(Piece::Bytes(b)).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let _ = tx.send(Piece::Failed(Error::io("read the input", e)));
                            return;
                        }
                    }
                }
            })
            .map_err(|e| Error::io("start the input's thread", e))?;
        Ok(Arc::new(Feed {
            inner: Mutex::new(FeedState {
                rx,
                pending: Vec::new(),
                ended: None,
            }),
        }))
    }
}

/// What the listener's reverse sender and the thread reading its connection share.
#[derive(Default)]
struct Shared {
    st: Mutex<PumpState>,
    cv: Condvar,
}

#[derive(Default)]
struct PumpState {
    limit: u64,
    stop: bool,
    done: Option<(u64, bool)>,
    /// The connection failed or the peer gave up.
    broken: Option<String>,
}

/// The listener's sending end of the reverse stream, on its own threads.
#[derive(Debug)]
pub struct Pump {
    abort: Arc<AtomicBool>,
    sock: TcpStream,
    thread: JoinHandle<ReverseReport>,
}

impl Pump {
    /// Starts sending `feed` on the reverse connection `s` (blocking), after `unsent` (the
    /// end of the Welcome, if the socket did not take it all).
    pub fn start(
        s: TcpStream,
        chan: Option<Channel>,
        unsent: Vec<u8>,
        chunk: usize,
        feed: Arc<Feed>,
    ) -> Result<Pump, Error> {
        let abort = Arc::new(AtomicBool::new(false));
        let sock = s
            .try_clone()
            .map_err(|e| Error::io("dup the reverse connection", e))?;
        let thread = {
            let abort = Arc::clone(&abort);
            std::thread::Builder::new()
                .name("mpcat-pump".into())
                .spawn(move || pump(s, chan, unsent, chunk.min(MAX_CHUNK), &feed, &abort))
                .map_err(|e| Error::io("start the reverse stream's thread", e))?
        };
        Ok(Pump {
            abort,
            sock,
            thread,
        })
    }

    pub fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Ends it now (the session failed or was interrupted): blocking writes and reads on its
    /// connection return at once.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    pub fn join(self) -> ReverseReport {
        self.thread
            .join()
            .unwrap_or_else(|_| failed(0, "its thread panicked".into()))
    }
}

fn pump(
    mut s: TcpStream,
    chan: Option<Channel>,
    unsent: Vec<u8>,
    chunk: usize,
    feed: &Feed,
    abort: &AtomicBool,
) -> ReverseReport {
    let encrypted = chan.is_some();
    let chan = Arc::new(Mutex::new(chan));
    let shared = Arc::new(Shared::default());
    if let Err(e) = s.write_all(&unsent) {
        return failed(0, format!("write: {e}"));
    }
    let reader = {
        let (chan, shared) = (Arc::clone(&chan), Arc::clone(&shared));
        let r = s.try_clone();
        std::thread::Builder::new()
            .name("mpcat-pump-acks".into())
            .spawn(move || match r {
                Ok(r) => acks(r, &chan, encrypted, chunk, &shared),
                Err(e) => broken(&shared, format!("dup: {e}")),
            })
    };
    if let Err(e) = reader {
        return failed(0, format!("start a thread: {e}"));
    }
    let mut f = feed.inner.lock().unwrap_or_else(|e| e.into_inner());
    let mut hasher = crate::StreamHasher::new();
    let mut sent = 0u64;
    let mut scratch = Vec::new();
    let mut frame_buf = Vec::with_capacity(DATA_HDR + chunk);
    let mut stopped = false;
    let gone = |sent: u64, why: &str| {
        failed(
            sent,
            format!("cut after {sent} bytes: the connecting side's connection {why}"),
        )
    };
    loop {
        if abort.load(Ordering::Relaxed) {
            return failed(sent, "the session failed before it ended".into());
        }
        let room = {
            let st = shared.st.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(why) = &st.broken {
                return gone(sent, why);
            }
            if st.stop {
                stopped = true;
                break;
            }
            st.limit.saturating_sub(sent)
        };
        if f.pending.is_empty() {
            if f.ended.is_some() {
                break;
            }
            match f.rx.recv_timeout(TICK) {
                Ok(Piece::Bytes(b)) => f.pending = b,
                Ok(Piece::End) => f.ended = Some(Ok(())),
                Ok(Piece::Failed(e)) => f.ended = Some(Err(e)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => f.ended = Some(Ok(())),
            }
            continue;
        }
        if room == 0 {
            let st = shared.st.lock().unwrap_or_else(|e| e.into_inner());
            let _ = shared.cv.wait_timeout(st, TICK);
            continue;
        }
        let n = f.pending.len().min(chunk).min(room as usize);
        frame_buf.clear();
        frame_buf.extend_from_slice(&frame::data_header(sent, n));
        frame_buf.extend_from_slice(&f.pending[..n]);
        if let Err(e) = put(&mut s, &chan, &frame_buf, &mut scratch) {
            // The connecting side's own reason (a refusal just before it closed) says more
            // than the write's error: its reader thread may be about to tell it.
            let why = said_why(&shared, Duration::from_secs(1))
                .unwrap_or_else(|| format!("failed (write: {e})"));
            return gone(sent, &why);
        }
        hasher.update(&f.pending[..n]);
        f.pending.drain(..n);
        sent += n as u64;
    }
    if let Some(Err(e)) = &f.ended {
        let why = e.line();
        let _ = put_frame(&mut s, &chan, &Frame::Refuse { reason: &why }, &mut scratch);
        return failed(sent, why);
    }
    let hash = hasher.finish();
    if let Err(e) = put_frame(
        &mut s,
        &chan,
        &Frame::End { total: sent, hash },
        &mut scratch,
    ) {
        return gone(sent, &format!("failed (write: {e})"));
    }
    drop(f);
    let mut st = shared.st.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if abort.load(Ordering::Relaxed) {
            return failed(sent, "the session failed before it ended".into());
        }
        if let Some((total, ok)) = st.done {
            let failure = match (total == sent, ok) {
                (true, true) => None,
                (false, _) => Some(format!(
                    "the connecting side counted {total} bytes of {sent} sent"
                )),
                (true, false) => Some(format!(
                    "the connecting side's hash does not match: {sent} bytes arrived corrupted"
                )),
            };
            return ReverseReport {
                bytes: sent,
                total: Some(sent),
                hash: Some(format!("{}:{}", crate::HASH_NAME, send::hex(&hash))),
                verified: failure.is_none(),
                stopped,
                failure,
            };
        }
        if let Some(why) = &st.broken {
            return gone(sent, why);
        }
        st = shared
            .cv
            .wait_timeout(st, TICK)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// What the reader thread found wrong with the connection, waiting at most `wait` for it.
fn said_why(shared: &Shared, wait: Duration) -> Option<String> {
    let until = Instant::now() + wait;
    let mut st = shared.st.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(why) = &st.broken {
            return Some(why.clone());
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        st = shared
            .cv
            .wait_timeout(st, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

fn broken(shared: &Shared, why: String) {
    let mut st = shared.st.lock().unwrap_or_else(|e| e.into_inner());
    st.broken.get_or_insert(why);
    shared.cv.notify_all();
}

/// The listener's thread reading the reverse connection: credit, Stop, the verdict.
fn acks(
    mut r: TcpStream,
    chan: &Mutex<Option<Channel>>,
    encrypted: bool,
    chunk: usize,
    shared: &Shared,
) {
    let mut inc = Incoming::new(chunk.min(MAX_CHUNK));
    loop {
        match inc.read(&mut r, encrypted) {
            Ok(Got::Bytes) => {}
            Ok(Got::Idle) => continue,
            Ok(Got::Closed) => return broken(shared, "closed".into()),
            Err(e) => return broken(shared, format!("failed ({})", e.line())),
        }
        let mut on = |f: Frame<'_>| -> Result<bool, Error> {
            let mut st = shared.st.lock().unwrap_or_else(|e| e.into_inner());
            match f {
                Frame::Ack { limit, .. } => st.limit = st.limit.max(limit),
                Frame::Stop => st.stop = true,
                Frame::Done { total, ok } => {
                    st.done = Some((total, ok));
                    shared.cv.notify_all();
                    return Ok(true);
                }
                Frame::Refuse { reason } => {
                    return Err(Error::msg(format!("sent a refusal: {reason}")));
                }
                Frame::Abort { reason } => {
                    return Err(Error::msg(format!("aborted the session: {reason}")));
                }
                other => {
                    return Err(Error::msg(format!(
                        "sent a frame only a listener sends: {other:?}"
                    )))
                }
            }
            shared.cv.notify_all();
            Ok(false)
        };
        match inc.frames(chan, &mut on) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => return broken(shared, e.line()),
        }
    }
}
