//! The sending side: opens the session's connections, reads the input in chunks (hashing it
//! as it goes; a pipe or stdin on its own thread, a regular file on the loop), and hands the
//! next chunk to whichever connection has room in its socket, never past the receiver's
//! credit. A chunk is kept until the receiver acknowledges it (a file's as its offset: it is
//! sent, and re-sent, from the file with sendfile); the session ends when the receiver says
//! every byte arrived and the hash matched.
//!
//! The pieces: [`handshake`] (connect and Hello/Welcome, with --psk-file the Noise
//! handshake), [`input`] (reading and hashing the input into chunks), [`schedule`] (which
//! connection takes which bytes, credit, rate limit, fail-over), [`conn`] (one connection's
//! writes and what comes back on it). This file starts the session, runs the loop and
//! reports.

mod conn;
mod handshake;
mod input;
mod resume;
mod schedule;

pub(crate) use handshake::{connect, Connected};

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Waker};

use crate::frame::{self, MAX_CHUNK};
use crate::paths::{Egress, Paths};
use crate::secure::Psk;
use crate::{
    ConnCounts, Error, Input, MpcatCounters, MpcatReport, MptcpReport, Role, StreamReport,
};

use conn::{give_up, read_conn, Conn, ConnError, RAW_BUF};
use handshake::{open_mptcp, unsent_bound};
use input::{live_input, open_input, reader, Feed, Opened, Source};
use schedule::{adapt, fail_conn, fill, read_ahead, take, unsent_bytes, watch, Flow};
/// How the sending side runs.
#[derive(Debug, Clone)]
pub struct SendConfig {
    /// The receiver's addresses, tried in order for the first connection; the one that
    /// answered is used for the others.
    pub peer: Vec<SocketAddr>,
    /// The address as the user gave it, for the report.
    pub address: String,
    /// Connections to open; None: one per member of the egress (ECMP nexthop or bond slave).
    pub streams: Option<u16>,
    /// The largest chunk (declared in the Hello).
    pub chunk: u32,
    /// The smallest chunk each connection's size adapts down to ([`crate::smallest_chunk`]
    /// of `chunk` at least); equal to `chunk`: a fixed size.
    pub chunk_min: u32,
    pub input: Input,
    /// How long each connect and handshake may take.
    pub connect_timeout: Duration,
    /// A connection whose data stays unacknowledged this long has failed: its chunks go
    /// out again on the others and it is reopened (from the same source port, so over the
    /// same path) until the path answers again. With no connection left for this long, the
    /// session fails.
    pub path_timeout: Duration,
    /// Most stream bytes per second (--rate-limit), over all connections together.
    pub rate_limit: Option<u64>,
    /// --psk-file: every connection authenticated and encrypted with this key.
    pub psk: Option<Psk>,
    /// --mptcp: one IPPROTO_MPTCP connection instead of striping (striping over TCP when the
    /// kernel or the receiver does not do MPTCP).
    pub mptcp: bool,
    /// --size: the input's length, known beforehand (stdin of a known length): the live line
    /// shows percent and ETA, and an input of another length fails the session.
    pub size: Option<u64>,
    /// The session's token when the caller made it (duplex: the reverse connection, opened
    /// first, presents it too); None: a fresh one.
    pub token: Option<frame::Token>,
    /// -Z: a regular input file's chunks leave with sendfile from the page cache instead of
    /// being copied through the sender's buffers ([`open_input`] says when each pays).
    pub zerocopy: bool,
    /// --duration: the input is read for at most this long from the start (connecting
    /// included), then the stream ends with what was read (its end frame carrying that
    /// length and hash), as iperf3's -t bounds a run; None: read to its end.
    pub duration: Option<Duration>,
    /// -s: every connection's source address (the route's own source when None).
    pub source: Option<std::net::IpAddr>,
    /// -v: each connection said (through the caller's hint) as it is made.
    pub verbose: bool,
    /// -w: no byte acknowledged for this long (from the start) fails the session, as nc's
    /// idle timeout.
    pub idle: Option<Duration>,
    /// --resume: the input (a regular file) goes on from what the receiver already holds,
    /// once each held chunk matched ([`crate::resume`]).
    pub resume: bool,
}

const WAKER: mio::Token = mio::Token(usize::MAX);

/// A reconnection's outcome, from its thread.
type Reconnected = (usize, Result<Connected, Error>);

/// What the event loop works with besides the flow.
struct Ctx<'a> {
    cfg: &'a SendConfig,
    n_streams: u16,
    lowat: Option<u32>,
    token: frame::Token,
    addr: SocketAddr,
    waker: Arc<Waker>,
    conn_tx: mpsc::Sender<Reconnected>,
}

fn register(poll: &Poll, s: TcpStream, i: usize) -> Result<mio::net::TcpStream, Error> {
    s.set_nonblocking(true)
        .map_err(|e| Error::io(format!("stream {i}: O_NONBLOCK"), e))?;
    let mut sock = mio::net::TcpStream::from_std(s);
    poll.registry()
        .register(
            &mut sock,
            mio::Token(i),
            Interest::READABLE | Interest::WRITABLE,
        )
        .map_err(|e| Error::io(format!("stream {i}: epoll_ctl"), e))?;
    Ok(sock)
}

/// Runs the sending side until the receiver's verdict, a failure, or `stop`.
pub fn run(
    cfg: &SendConfig,
    stop: &AtomicBool,
    live: &MpcatCounters,
    hint: &dyn Fn(&str),
) -> Result<MpcatReport, Error> {
    let opened = open_input(&cfg.input)?;
    let resume = match (&opened.file, cfg.resume) {
        (_, false) => None,
        (Some(f), true) => {
            let meta = f
                .metadata()
                .map_err(|e| Error::io("stat the input for --resume", e))?;
            Some((Arc::clone(f), crate::resume::Source::of(&meta)))
        }
        (None, true) => {
            return Err(Error::msg(
                "--resume needs -i FILE, a regular file (a pipe or stdin cannot be read again)",
            ))
        }
    };
    if let (true, None, Input::File(p)) = (cfg.zerocopy, &opened.file, &cfg.input) {
        hint(&format!(
            "-Z: {} is not a regular file: its bytes are copied as from a pipe",
            p.display()
        ));
    }
    // A regular file's length gives the live line its percent and ETA.
    if let Some(n) = opened.len {
        live.total.store(n, Ordering::Relaxed);
    }
    if let Some(n) = cfg.size {
        live.total.store(n, Ordering::Relaxed);
    }
    let token = match cfg.token {
        Some(t) => t,
        None => crate::random_token()?,
    };
    let chunk = cfg.chunk as usize;
    assert!(
        (1..=MAX_CHUNK).contains(&chunk),
        "chunk checked by the caller"
    );
    let start = Instant::now();
    let mut poll = Poll::new().map_err(|e| Error::io("epoll_create", e))?;
    // Where connections leave: the streams are placed one per member, round robin, by
    // their source port. Not knowing (no route answer) is said, not fatal.
    let to = *cfg
        .peer
        .first()
        .ok_or_else(|| Error::msg(format!("{}: no address", cfg.address)))?;
    let paths = match Paths::discover(to) {
        Ok(p) => Some(p),
        Err(e) => {
            hint(&format!(
                "cannot tell which links connections to {} take ({e}): source ports left to the kernel",
                to.ip()
            ));
            None
        }
    };
    let members = paths
        .as_ref()
        .map(|p| p.egress.members())
        .unwrap_or_default();
    let (pre, mut mptcp_report) = match cfg.mptcp {
        true => open_mptcp_first(cfg, hint)?,
        false => (None, None),
    };
    let used = matches!(pre, Some((_, _, true)));
    let eff = SendConfig {
        mptcp: used,
        streams: if used { Some(1) } else { cfg.streams },
        ..cfg.clone()
    };
    let cfg = &eff;
    let pre = pre.map(|(s, a, _)| (s, a));
    let n_streams = match cfg.streams {
        Some(n) => n,
        None => u16::try_from(members.len().clamp(1, usize::from(frame::MAX_STREAMS))).unwrap_or(1),
    };
    let egress = paths.as_ref().map(|p| describe(&p.egress));
    if let Some(e) = egress.as_ref().filter(|_| members.len() > 1 && !used) {
        hint(&format!(
            "{n_streams} streams over {e}, toward {}; the receive direction is spread by the peer's routes or the switch",
            to.ip()
        ));
    }
    let several = members.len() > 1 || (paths.is_none() && n_streams > 1);
    let lowat = (!used).then(|| unsent_bound(several, cfg.chunk));
    let plan = Plan {
        paths: paths.as_ref(),
        members: &members,
        to,
        n_streams,
        lowat,
        token,
        resume: resume.as_ref(),
    };
    let (mut conns, window, addr, resumed) = open_streams(cfg, &poll, &plan, pre, start)?;
    if cfg.verbose {
        for (i, c) in conns.iter().enumerate() {
            let via = c
                .path
                .as_ref()
                .map_or_else(String::new, |p| format!(" via {p}"));
            hint(&format!(
                "connected {} to {}{via}: stream {i} of {n_streams}",
                c.local, c.peer
            ));
        }
    }
    let waker = Arc::new(
        Waker::new(poll.registry(), WAKER).map_err(|e| Error::io("eventfd for the reader", e))?,
    );
    // Chunks alive at once: the window's worth, one more per stream being written, and a
    // few read ahead.
    let pool = (window / chunk as u64).min(1 << 16) as usize + conns.len() + 4;
    let file = opened.file.clone();
    let reader_stop = Arc::new(AtomicBool::new(false));
    let held = resumed.as_ref().map(|r| r.held);
    let (mut source, rthread) =
        start_source(opened, cfg, pool, start, &waker, &reader_stop, resumed)?;
    let mut flow = Flow::new(cfg, window, start, file);
    if let Some(h) = held {
        // The receiver's window and credit start where it holds the stream to.
        (flow.acked, flow.limit) = (h, h + window);
    }
    let (conn_tx, conn_rx) = mpsc::channel();
    let ctx = Ctx {
        cfg,
        n_streams,
        lowat,
        token,
        addr,
        waker: Arc::clone(&waker),
        conn_tx,
    };
    let failure = event_loop(
        &mut poll,
        &ctx,
        &mut conns,
        &mut flow,
        &mut source,
        &conn_rx,
        stop,
        live,
    )
    .err()
    .map(|e| e.line());
    if let Some(why) = &failure {
        give_up(&mut conns, why);
    }
    reader_stop.store(true, Ordering::Relaxed);
    drop(source);
    // A failed session does not wait for a reader blocked in a read of an input that sends
    // nothing (a terminal, a silent pipe: -w's case): the process exits with it.
    if let Some(t) = rthread.filter(|t| failure.is_none() || t.is_finished()) {
        let _ = t.join();
    }
    if let (true, Some(m), Some(sock)) = (used, mptcp_report.as_mut(), conns[0].sock.as_ref()) {
        match crate::mptcp::subflows(sock) {
            Ok(Some(n)) => m.subflows = n,
            Ok(None) => {}
            Err(e) => hint(&format!("--mptcp: MPTCP_INFO at the end: {e}")),
        }
        if m.subflows == 1 {
            hint(crate::mptcp::ONE_SUBFLOW_HINT);
        }
    }
    if let (Some(d), true, None, Some((total, _))) = (cfg.duration, flow.cut, &failure, flow.end) {
        hint(&format!(
            "--duration {d:?}: the input was read for that long; the stream ended after {total} bytes"
        ));
    }
    let mut report = report(cfg, &flow, &conns, failure, start);
    report.resume = held.map(|h| crate::ResumeReport {
        held: h,
        sent: flow.acked.saturating_sub(h),
    });
    if let (Some(r), true) = (report.resume, report.seconds > 0.0) {
        // The rate is what moved in this session, not the part held before.
        report.bytes_per_second = r.sent as f64 / report.seconds;
    }
    report.window = window;
    report.mptcp = mptcp_report;
    report.egress = egress;
    Ok(report)
}

/// Where and how the session's streams are opened.
struct Plan<'a> {
    /// The way out toward the receiver, when known, and its members' names.
    paths: Option<&'a Paths>,
    members: &'a [String],
    to: SocketAddr,
    n_streams: u16,
    /// TCP_NOTSENT_LOWAT ([`unsent_bound`]); None with MPTCP.
    lowat: Option<u32>,
    token: frame::Token,
    /// --resume: the input and its identity, checked on stream 0 before the others open.
    resume: Option<&'a (Arc<std::fs::File>, crate::resume::Source)>,
}

/// Connects and welcomes the session's streams, each from a source port that places it on
/// the next member of the way out (`pre`, a connection already made, is stream 0 wherever
/// it went); returns them, the smallest window the receiver gave, the address that
/// answered (which every stream then uses), and with --resume where the stream goes on from
/// (checked on stream 0 before the others open, so no data can come before it).
fn open_streams(
    cfg: &SendConfig,
    poll: &Poll,
    plan: &Plan<'_>,
    mut pre: Option<(TcpStream, SocketAddr)>,
    start: Instant,
) -> Result<(Vec<Conn>, u64, SocketAddr, Option<resume::Resumed>), Error> {
    let mut resumed = None;
    let mut conns = Vec::with_capacity(usize::from(plan.n_streams));
    let mut addrs = cfg.peer.clone();
    let mut window = u64::MAX;
    // A connection made before (--mptcp's) is stream 0 wherever it went; the others are
    // spread over the members after its own.
    let first = match (&pre, plan.paths) {
        (Some((s, a)), Some(p)) => s
            .local_addr()
            .ok()
            .and_then(|l| p.member_of(l, *a).ok())
            .unwrap_or(0),
        _ => 0,
    };
    for i in 0..plan.n_streams {
        let pre = if i == 0 { pre.take() } else { None };
        let placed = plan
            .paths
            .filter(|p| p.egress.members().len() > 1 && pre.is_none())
            .and_then(|p| {
                let src = cfg.source.unwrap_or(p.src);
                pick_source(
                    p,
                    src,
                    plan.to,
                    (first + usize::from(i)) % plan.members.len(),
                )
            });
        let from = placed
            .map(|(a, _)| a)
            .or_else(|| cfg.source.map(|ip| SocketAddr::new(ip, 0)));
        let (mut s, addr, w, mut chan) = connect(
            cfg,
            plan.n_streams,
            plan.lowat,
            &addrs,
            from,
            plan.token,
            i,
            pre,
        )?;
        if let (0, Some((file, source))) = (i, plan.resume) {
            // The receiver hashes its held chunks between answers: a wait as long as a
            // path's, at least.
            let wait = cfg.connect_timeout.max(cfg.path_timeout);
            resumed = Some(resume::exchange(
                &mut s,
                chan.as_mut(),
                file,
                *source,
                wait,
            )?);
        }
        // The first address that answered is the one every stream uses.
        addrs = vec![addr];
        window = window.min(w);
        let local = s
            .local_addr()
            .map_err(|e| Error::io(format!("stream {i}: getsockname"), e))?;
        let path = match (plan.paths, placed) {
            (_, Some((_, m))) => plan.members.get(m).cloned(),
            (Some(p), None) => p
                .member_of(local, addr)
                .ok()
                .and_then(|m| plan.members.get(m).cloned()),
            (None, None) => None,
        };
        let sock = register(poll, s, usize::from(i))?;
        conns.push(Conn::new(sock, local, addr, path, chan, cfg, start));
    }
    Ok((conns, window, addrs[0], resumed))
}

/// --mptcp: one MPTCP connection, the kernel's subflows instead of striping; striping over
/// TCP when the kernel or the receiver does not do MPTCP (said once). A connection that
/// fell back is plain TCP: it serves as stream 0. Returns the connection (true: it is
/// MPTCP) and what the report says of MPTCP.
#[expect(
    clippy::type_complexity,
    reason = "the connection made, whether it is MPTCP, and the report's part, used apart"
)]
fn open_mptcp_first(
    cfg: &SendConfig,
    hint: &dyn Fn(&str),
) -> Result<(Option<(TcpStream, SocketAddr, bool)>, Option<MptcpReport>), Error> {
    let mut mptcp_report = None;
    let mut pre = None;
    {
        let fallback = |why: String, report: &mut Option<MptcpReport>| {
            hint(&format!("--mptcp: {why}: striping over TCP instead"));
            *report = Some(MptcpReport {
                subflows: 0,
                fallback: Some(why),
            });
        };
        match open_mptcp(cfg) {
            Ok((s, addr)) => match crate::mptcp::subflows(&s) {
                Ok(Some(n)) => {
                    pre = Some((s, addr, true));
                    mptcp_report = Some(MptcpReport {
                        subflows: n,
                        fallback: None,
                    });
                }
                Ok(None) => {
                    pre = Some((s, addr, false));
                    fallback(
                    "the receiver does not do MPTCP (the connection fell back to TCP; give it --mptcp)".into(),
                    &mut mptcp_report,
                );
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("MPTCP_INFO of the connection to {addr}"),
                        e,
                    ))
                }
            },
            Err(e) if crate::mptcp::unsupported(&e) => fallback(
                format!("this kernel does not do MPTCP (socket: {e}; is net.mptcp.enabled 1?)"),
                &mut mptcp_report,
            ),
            Err(e) => {
                return Err(Error::io(
                    format!("stream 0: connect {} (MPTCP)", cfg.address),
                    e,
                ))
            }
        }
    }
    Ok((pre, mptcp_report))
}

/// Starts reading the input: on the loop for a regular file, else on the reader thread
/// (with at most `pool` buffers). `start` and --duration say when reading stops.
fn start_source(
    opened: Opened,
    cfg: &SendConfig,
    pool: usize,
    start: Instant,
    waker: &Arc<Waker>,
    reader_stop: &Arc<AtomicBool>,
    resumed: Option<resume::Resumed>,
) -> Result<(Source, Option<std::thread::JoinHandle<()>>), Error> {
    // --resume: reading starts past what the receiver holds, the hash over it already taken.
    let (seq, hasher) = match resumed {
        Some(r) => {
            // SAFETY: lseek on the input's own descriptor, which `opened.read` owns and
            // nothing reads yet.
            let at = unsafe { libc::lseek(opened.fd, r.held as libc::off_t, libc::SEEK_SET) };
            if at < 0 {
                return Err(Error::io(
                    "seek the input past the held part",
                    io::Error::last_os_error(),
                ));
            }
            (r.held, r.hasher)
        }
        None => (0, crate::StreamHasher::new()),
    };
    // --psk-file seals the bytes in user space: they are read into buffers as from a pipe
    // (the command line refuses -Z with it).
    let sendfile = cfg.zerocopy && cfg.psk.is_none();
    let chunk = cfg.chunk as usize;
    let (back_tx, back_rx) = mpsc::channel();
    let inline = opened.file.is_some();
    let feed = Feed {
        input: opened.read,
        file: opened.file.clone().filter(|_| sendfile),
        opened_len: opened.len,
        live: live_input(&cfg.input),
        until: cfg.duration.map(|d| (start + d, opened.fd)),
        chunk,
        size: cfg.size,
        hasher,
        seq,
        back_tx,
        own: None,
    };
    let started = if inline {
        let source = Source::Inline {
            feed: Box::new(feed),
            queue: VecDeque::new(),
            more: true,
            back: back_rx,
            fresh: Vec::new(),
        };
        (source, None)
    } else {
        // The reader waits (a full channel) while the loop holds its read-ahead: see
        // READ_AHEAD.
        let (tx, rx) = mpsc::sync_channel(2);
        let (waker, rstop) = (Arc::clone(waker), Arc::clone(reader_stop));
        let t = std::thread::Builder::new()
            .name("mpcat-read".into())
            .spawn(move || reader(feed, pool, tx, back_rx, waker, rstop))
            .map_err(|e| Error::io("start the reader thread", e))?;
        (Source::Thread(rx), Some(t))
    };
    Ok(started)
}

/// The sending side's report once its loop ended (`failure`: why, if it failed); the
/// window, MPTCP and egress parts are the caller's.
fn report(
    cfg: &SendConfig,
    flow: &Flow,
    conns: &[Conn],
    failure: Option<String>,
    start: Instant,
) -> MpcatReport {
    let secs = start.elapsed().as_secs_f64();
    let verified = failure.is_none()
        && matches!((flow.done, flow.end), (Some((t, true)), Some((total, _))) if t == total);
    let failure = failure.or_else(|| {
        (!verified).then(|| match flow.done {
            Some((_, false)) => {
                "the receiver's hash does not match: the stream arrived corrupted".into()
            }
            _ => "the receiver's total differs from the bytes sent".into(),
        })
    });
    MpcatReport {
        schema_version: crate::report::SCHEMA_VERSION,
        role: Role::Send,
        address: cfg.address.clone(),
        bytes: flow.acked,
        total: flow.end.map(|e| e.0),
        seconds: secs,
        bytes_per_second: if secs > 0.0 {
            flow.acked as f64 / secs
        } else {
            0.0
        },
        chunk_size: u64::from(cfg.chunk),
        window: flow.window,
        encrypted: cfg.psk.is_some(),
        mptcp: None,
        streams: conns
            .iter()
            .enumerate()
            .map(|(i, c)| StreamReport {
                index: i as u16,
                local: c.local.to_string(),
                peer: c.peer.to_string(),
                bytes: c.bytes,
                path: c.path.clone(),
                chunk_max: Some(c.size_max as u64),
            })
            .collect(),
        egress: None,
        path_failures: flow.failures.clone(),
        reconnects: flow.reconnects,
        resent_bytes: flow.resent,
        hash: flow
            .end
            .map(|(_, h)| format!("{}:{}", crate::HASH_NAME, hex(&h))),
        verified,
        connections: ConnCounts::default(),
        sessions: 1,
        sessions_verified: u64::from(verified),
        failure,
        reverse: None,
        run: None,
        resume: None,
    }
}

/// How the egress reads in the report: `ecmp: eth1 eth2`, `bond bond0 (layer3+4): eth0 eth1`.
fn describe(e: &Egress) -> String {
    match e {
        Egress::Single { dev } => format!("one link: {dev}"),
        Egress::Ecmp { devs } => format!("ecmp: {}", devs.join(" ")),
        Egress::Bond { bond, slaves } => {
            format!("bond {bond} (layer3+4): {}", slaves.join(" "))
        }
    }
}

/// A free source address (the route's source, a kernel-chosen port) whose connection to
/// `to` leaves by member `want`; None if 4096 tries found none (the member is then left
/// to chance).
fn pick_source(
    p: &Paths,
    src: std::net::IpAddr,
    to: SocketAddr,
    want: usize,
) -> Option<(SocketAddr, usize)> {
    use socket2::{Domain, Protocol, Socket, Type};
    for _ in 0..4096 {
        let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP)).ok()?;
        s.bind(&SocketAddr::new(src, 0).into()).ok()?;
        let local = s.local_addr().ok()?.as_socket()?;
        if p.member_of(local, to).ok()? == want {
            // Closed here and bound again by connect (SO_REUSEADDR): the port is free.
            return Some((local, want));
        }
    }
    None
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Starts reopening the failed streams whose time has come, each on its own thread (a
/// connect to a dead path blocks until its timeout), from the stream's own address.
fn reconnect(ctx: &Ctx<'_>, conns: &mut [Conn]) {
    let now = Instant::now();
    for (i, c) in conns.iter_mut().enumerate() {
        if c.sock.is_some() || c.reconnecting || now < c.next_try {
            continue;
        }
        c.reconnecting = true;
        let cfg = SendConfig {
            connect_timeout: ctx.cfg.connect_timeout.min(ctx.cfg.path_timeout),
            ..ctx.cfg.clone()
        };
        let (addr, from, token, n, lowat) =
            (ctx.addr, c.local, ctx.token, ctx.n_streams, ctx.lowat);
        let (tx, waker) = (ctx.conn_tx.clone(), Arc::clone(&ctx.waker));
        let spawned = std::thread::Builder::new()
            .name("mpcat-reconnect".into())
            .spawn(move || {
                let r = connect(&cfg, n, lowat, &[addr], Some(from), token, i as u16, None);
                let _ = tx.send((i, r));
                let _ = waker.wake();
            });
        if spawned.is_err() {
            c.reconnecting = false;
            c.next_try = now + Duration::from_secs(1);
        }
    }
}

/// Takes the streams whose reconnection finished: registered again and writable, or (the
/// path still down) tried again in a second.
fn rejoin(poll: &Poll, conns: &mut [Conn], flow: &mut Flow, conn_rx: &Receiver<Reconnected>) {
    while let Ok((i, r)) = conn_rx.try_recv() {
        let c = &mut conns[i];
        c.reconnecting = false;
        match r {
            Ok((s, _, _, chan)) => {
                let local = s.local_addr().ok();
                match register(poll, s, i) {
                    Ok(sock) => {
                        c.sock = Some(sock);
                        if chan.is_some() && c.raw.is_empty() {
                            c.raw = vec![0; RAW_BUF];
                        }
                        c.chan = chan;
                        c.raw_len = 0;
                        c.local = local.unwrap_or(c.local);
                        c.writable = true;
                        flow.reconnects += 1;
                    }
                    Err(_) => c.next_try = Instant::now() + Duration::from_secs(1),
                }
            }
            // The path is still down: try again in a second.
            Err(_) => c.next_try = Instant::now() + Duration::from_secs(1),
        }
    }
}

/// Fails the session when no stream has been up for --path-timeout.
fn no_path_left(ctx: &Ctx<'_>, conns: &[Conn], flow: &mut Flow) -> Result<(), Error> {
    if conns.iter().any(|c| c.sock.is_some()) {
        flow.none_since = None;
    } else {
        let since = *flow.none_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= ctx.cfg.path_timeout {
            let last = flow.failures.last().map_or_else(String::new, |f| {
                format!(" (last: stream {}: {})", f.stream, f.why)
            });
            return Err(Error::msg(format!(
                "no path left: every stream failed and none reopened within {:?}, {} bytes acknowledged{last}",
                ctx.cfg.path_timeout, flow.acked
            )));
        }
    }
    Ok(())
}

/// -w: fails the session when nothing was acknowledged for that long (`moved`: when the
/// acknowledged count last changed, and to what).
fn idle(ctx: &Ctx<'_>, flow: &Flow, moved: &mut (Instant, u64)) -> Result<(), Error> {
    let Some(idle) = ctx.cfg.idle else {
        return Ok(());
    };
    if flow.acked != moved.1 {
        *moved = (Instant::now(), flow.acked);
    } else if moved.0.elapsed() >= idle && flow.done.is_none() {
        return Err(Error::msg(format!(
            "-w {idle:?}: nothing was acknowledged for that long, {} bytes in all",
            flow.acked
        )));
    }
    Ok(())
}

/// The session's outcome once the receiver's verdict came: Ok when it verified every byte
/// that was sent.
fn verdict(flow: &Flow) -> Option<Result<(), Error>> {
    let (total, ok) = flow.done?;
    if !ok {
        return Some(Err(Error::msg(
            "the receiver's hash does not match: the stream arrived corrupted",
        )));
    }
    Some(match flow.end {
        Some((t, _)) if t == total => Ok(()),
        _ => Err(Error::msg(format!(
            "the receiver counted {total} bytes, {} were sent",
            flow.end.map_or(0, |e| e.0)
        ))),
    })
}

#[expect(
    clippy::too_many_arguments,
    reason = "the loop's parts, each borrowed differently"
)]
fn event_loop(
    poll: &mut Poll,
    ctx: &Ctx<'_>,
    conns: &mut [Conn],
    flow: &mut Flow,
    rx: &mut Source,
    conn_rx: &Receiver<Reconnected>,
    stop: &AtomicBool,
    live: &MpcatCounters,
) -> Result<(), Error> {
    let mut events = Events::with_capacity(256);
    let mut rr = 0usize;
    let mut moved = (Instant::now(), 0u64);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(Error::msg(format!(
                "interrupted: {} bytes acknowledged by the receiver",
                flow.acked
            )));
        }
        let ahead = read_ahead(
            flow.hi,
            conns.len(),
            flow.window,
            matches!(rx, Source::Inline { .. }) || ctx.cfg.duration.is_some(),
        );
        let mut held_back = take(rx, flow, ahead)?;
        rejoin(poll, conns, flow, conn_rx);
        no_path_left(ctx, conns, flow)?;
        idle(ctx, flow, &mut moved)?;
        if flow.done.is_none() {
            reconnect(ctx, conns);
        }
        fill(poll, conns, flow, &mut rr);
        // The reader waits on a full channel, which no event announces: while the sockets
        // take what was held back, take more at once rather than at the next event.
        while held_back && unsent_bytes(flow) < ahead && flow.fatal.is_none() {
            held_back = take(rx, flow, ahead)?;
            fill(poll, conns, flow, &mut rr);
        }
        if let Some(why) = flow.fatal.take() {
            return Err(why);
        }
        adapt(conns, flow);
        watch(poll, conns, flow);
        live.bytes.store(flow.acked, Ordering::Relaxed);
        for (i, c) in conns.iter().enumerate() {
            live.set_stream(i, c.bytes);
        }
        if let Some(v) = verdict(flow) {
            return v;
        }
        let wait = flow
            .pace_wait
            .take()
            .map_or(Duration::from_millis(100), |w| {
                w.clamp(Duration::from_millis(1), Duration::from_millis(100))
            });
        match poll.poll(&mut events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("epoll_wait", e)),
        }
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            let i = ev.token().0;
            let Some(c) = conns.get_mut(i) else {
                continue;
            };
            if ev.is_writable() {
                c.writable = true;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                match read_conn(i, c, flow) {
                    Ok(()) => {}
                    Err(ConnError::Fatal(why)) => return Err(why),
                    Err(ConnError::Path(why)) => fail_conn(poll, i, c, flow, why),
                }
            }
        }
    }
}

/// A file of `len` bytes (`i * 7 + 3` each) under the temp dir, removed when dropped.
#[cfg(test)]
pub(crate) struct TempFile(pub(crate) std::path::PathBuf);

#[cfg(test)]
impl TempFile {
    pub(crate) fn new(tag: &str, len: usize) -> (TempFile, Vec<u8>) {
        let p = std::env::temp_dir().join(format!("mpcat-{tag}-{}", std::process::id()));
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        (TempFile(p), bytes)
    }
}

#[cfg(test)]
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What the sender's unit tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A sender's settings for a test: toward `to`, one stream, short deadlines.
    pub(crate) fn config(to: SocketAddr) -> SendConfig {
        SendConfig {
            peer: vec![to],
            address: to.to_string(),
            streams: Some(1),
            chunk: 64 << 10,
            chunk_min: 64 << 10,
            input: Input::Stdin,
            connect_timeout: Duration::from_millis(500),
            path_timeout: Duration::from_secs(2),
            rate_limit: None,
            psk: None,
            mptcp: false,
            size: None,
            token: None,
            zerocopy: false,
            duration: None,
            source: None,
            verbose: false,
            idle: None,
            resume: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recv::testing::{config as recv_config, Running, Temp};

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex(&[0, 0xab, 7]), "00ab07");
    }

    fn quiet(_: &str) {}

    /// The whole sending side against the real receiver on loopback: a file over two
    /// streams, every byte acknowledged, the receiver's verdict verified.
    #[test]
    fn a_file_over_two_streams_arrives_verified() {
        let (input, bytes) = TempFile::new("run-two", 3 << 20);
        let out = Temp::new("run-two");
        let rx = Running::start(recv_config(&out.0));
        let mut cfg = testing::config(rx.addr);
        cfg.streams = Some(2);
        cfg.input = Input::File(input.0.clone());
        let stop = AtomicBool::new(false);
        let r = run(&cfg, &stop, &MpcatCounters::default(), &quiet).unwrap();
        assert_eq!((r.failure.as_deref(), r.verified), (None, true));
        assert_eq!((r.bytes, r.total), (3 << 20, Some(3 << 20)));
        assert_eq!(r.streams.len(), 2);
        assert!(r.streams.iter().all(|s| s.bytes > 0), "{:?}", r.streams);
        assert_eq!(rx.report().failure, None);
        assert_eq!(std::fs::read(&out.0).unwrap(), bytes);
    }

    /// --duration on an endless input (/dev/zero, read as a pipe): reading stops after it,
    /// the stream ends with what was read, verified, and says so.
    #[test]
    fn duration_ends_an_endless_input_verified() {
        let out = Temp::new("run-duration");
        let rx = Running::start(recv_config(&out.0));
        let mut cfg = testing::config(rx.addr);
        cfg.input = Input::File("/dev/zero".into());
        cfg.rate_limit = Some(4 << 20);
        cfg.duration = Some(Duration::from_millis(500));
        let said = std::sync::Mutex::new(Vec::new());
        let hint = |m: &str| said.lock().unwrap().push(m.to_string());
        let started = Instant::now();
        let r = run(
            &cfg,
            &AtomicBool::new(false),
            &MpcatCounters::default(),
            &hint,
        )
        .unwrap();
        let took = started.elapsed();
        assert_eq!((r.failure.as_deref(), r.verified), (None, true));
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(3),
            "{took:?}"
        );
        let total = r.total.unwrap();
        assert!((1 << 20..=6 << 20).contains(&total), "{total} bytes");
        let said = said.lock().unwrap();
        assert!(
            said.iter()
                .any(|m| m.starts_with("--duration 500ms: the input was read")),
            "{said:?}"
        );
        assert_eq!(rx.report().bytes, total);
        assert_eq!(std::fs::metadata(&out.0).unwrap().len(), total);
    }
}
