//! The sending side: opens the session's connections, reads the input in chunks (hashing it
//! as it goes; a pipe or stdin on its own thread, a regular file on the loop), and hands the
//! next chunk to whichever connection has room in its socket, never past the receiver's
//! credit. A chunk is kept until the receiver acknowledges it (a file's as its offset: it is
//! sent, and re-sent, from the file with sendfile); the session ends when the receiver says
//! every byte arrived and the hash matched.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Waker};

use crate::bufpool::{self, Buf};
use crate::frame::{self, Frame, FrameError, DATA_HDR, MAX_CHUNK, VERSION};
use tcpkit_pace::TokenBucket;

use crate::paths::{Egress, Paths};
use crate::secure::{Channel, Psk, HANDSHAKE_MSG, REC_HDR, TAG};
use crate::{
    ConnCounts, Error, Input, MpcatCounters, MpcatReport, MptcpReport, PathFailure, Role,
    StreamReport,
};

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
}

const WAKER: mio::Token = mio::Token(usize::MAX);
/// Bytes a sender keeps for frames coming back (acks, the verdict): they are small.
const INBUF: usize = 4096;
/// Bytes kept for records not yet opened (--psk-file): two of the largest a receiver's
/// frames make (a record whose plaintext would not fit in INBUF is refused at its header).
const RAW_BUF: usize = 2 * (REC_HDR + INBUF + TAG);

/// A buffer of the input as the reader read it (the largest chunk's size); chunks are cut
/// from it as connections take them. It goes back to the reader when its last chunk is
/// acknowledged (dropped), so buffers are reused, never allocated per chunk.
#[derive(Debug)]
struct Block {
    /// None only once dropped.
    buf: Option<Buf>,
    back: mpsc::Sender<Buf>,
}

impl Block {
    fn bytes(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or_default()
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let _ = self.back.send(b);
        }
    }
}

/// Where a chunk's bytes are.
#[derive(Debug, Clone)]
enum Src {
    /// In a buffer the reader read them into.
    Mem(Arc<Block>),
    /// In a regular input file (`-i FILE`), at `off`: with -Z sent from the page cache with
    /// sendfile, so never copied into (or kept in) the sender's memory; without it, a chunk
    /// once written whole ([`written`]). Read from the file again when a failed path's chunk
    /// is re-sent.
    File(Arc<File>),
}

/// One chunk of the input, `seq` its offset in the stream: bytes `off..off + len` of its
/// source (a block, or the file, where `off` is `seq`).
#[derive(Debug)]
struct Chunk {
    seq: u64,
    src: Src,
    off: usize,
    len: usize,
    /// The connection it was last handed to.
    conn: usize,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.seq + self.len as u64
    }

    /// Its bytes: borrowed from the block, or read from the file into `scratch`.
    fn bytes<'a>(&'a self, scratch: &'a mut Vec<u8>) -> io::Result<&'a [u8]> {
        match &self.src {
            Src::Mem(b) => Ok(&b.bytes()[self.off..self.off + self.len]),
            Src::File(f) => {
                use std::os::unix::fs::FileExt;
                scratch.resize(self.len, 0);
                f.read_exact_at(scratch, self.off as u64)
                    .map_err(|e| shrank(e, self.off as u64 + self.len as u64))?;
                Ok(scratch)
            }
        }
    }

    /// Cuts the chunk after `n` bytes; the rest is returned.
    fn split(&mut self, n: usize) -> Chunk {
        debug_assert!(n > 0 && n < self.len);
        let rest = Chunk {
            seq: self.seq + n as u64,
            src: self.src.clone(),
            off: self.off + n,
            len: self.len - n,
            conn: self.conn,
        };
        self.len = n;
        rest
    }
}

/// How long a chunk should take to leave on its connection: a connection's chunk size is
/// about this much of what its socket took lately.
///
/// The chunk is also the cushion a socket holds beyond TCP_NOTSENT_LOWAT (a write takes it
/// whole) while the loop waits for the CPU: 10 ms gives 200 Mbit/s links 256K, the fixed size
/// that held 95 MB/s over 4 of them.
const CHUNK_TIME: Duration = Duration::from_millis(10);
/// How often each connection's rate (and so its chunk size) is measured.
const RATE_TICK: Duration = Duration::from_millis(100);

/// The chunk size for a connection that took `rate` bytes a second lately: about
/// [`CHUNK_TIME`] of it, as a power of two within `lo..=hi`, and no more than half of an even
/// share of the window (`window / streams / 2`), so that a small window still gives every
/// connection several chunks in flight.
fn chunk_size(rate: f64, lo: usize, hi: usize, window: u64, streams: usize) -> usize {
    let want = (rate * CHUNK_TIME.as_secs_f64()).max(1.0) as usize;
    let share = (window / (2 * streams.max(1) as u64)).min(hi as u64) as usize;
    want.next_power_of_two().min(share).clamp(lo, hi)
}

/// Largest chunks read but not yet handed to a connection, beyond one per connection. Read
/// no further ahead than this, a chunk leaves while it is still in the CPU's cache from its
/// read and hash; read as far ahead as the window allowed (64 MiB), each left from memory,
/// and every one of the 64 blocks was a fresh allocation's page faults: on one veth the
/// sender's socket copy read cold bytes (the whole pipeline then ran at 60-70 % of socat).
/// For one connection, and for a regular file, read on the loop ([`read_ahead`]).
const READ_AHEAD: usize = 2;

/// Bytes the loop holds unsent: [`READ_AHEAD`] largest chunks beyond one per connection.
///
/// Several connections and the reader thread (a pipe, stdin): as far as the window allows,
/// as before the bound, since over 4 x 200 Mbit/s links under other builds' load the bound
/// (6 MiB there) went with 84.5-94.0 MB/s in 6 runs against the bench's ceiling of 90.3-94.6
/// beside them, and the builds before it held 93.4-94.6; whether the bound was the cause is
/// not shown. A regular file is read on the loop the moment a connection has room, so there
/// the bound costs no wait, and reading the window ahead into buffers (64 MiB of fresh pages
/// zeroed on the loop before the first chunk left) cost the first run after the lab's set-up
/// 3 %: 4 x 200 Mbit/s, 6 runs, window 92.9 then 94.7-95.0, bound 95.2-95.4 in every run.
fn read_ahead(hi: usize, conns: usize, window: u64, file: bool) -> usize {
    if conns > 1 && !file {
        window.min(usize::MAX as u64) as usize
    } else {
        hi * (conns + READ_AHEAD)
    }
}

/// What the reader thread hands the loop.
#[derive(Debug)]
enum FromReader {
    Chunk(Chunk),
    End { total: u64, hash: crate::Digest },
    Failed(Error),
}

#[derive(Debug)]
struct Conn {
    /// None while the stream's connection is down.
    sock: Option<mio::net::TcpStream>,
    local: SocketAddr,
    peer: SocketAddr,
    /// The egress member it was placed on.
    path: Option<String>,
    /// Control frames (and, with --psk-file, sealed data) being written, and how much of
    /// them is written.
    out: Vec<u8>,
    out_pos: usize,
    /// A plain data frame being written straight from its chunk (after `out`).
    data: Option<Sending>,
    /// The socket took everything offered last time: it may have room.
    writable: bool,
    inbuf: Vec<u8>,
    in_len: usize,
    bytes: u64,
    /// A reconnection is being tried (on its own thread).
    reconnecting: bool,
    /// The size of the chunks it takes now (adapted each [`RATE_TICK`]), and the largest it
    /// has been.
    size: usize,
    size_max: usize,
    /// Bytes a second it took lately (0: not measured yet), and `bytes` when last measured.
    rate: f64,
    bytes_then: u64,
    /// When the next reconnection may start.
    next_try: Instant,
    /// --psk-file: this connection's keys; `raw` holds records not yet opened into `inbuf`.
    chan: Option<Channel>,
    raw: Vec<u8>,
    raw_len: usize,
}

impl Conn {
    /// Queues `plain` (frames) for the receiver: sealed into records when encrypted.
    fn put(&mut self, plain: &[u8]) {
        match self.chan.as_mut() {
            Some(ch) => ch.seal(plain, &mut self.out),
            None => self.out.extend_from_slice(plain),
        }
    }
}

/// A data frame on its way out: its header and its chunk are written together with writev
/// from where they lie, so the chunk is never copied into a frame buffer. The chunk joins
/// `inflight` only once written whole: until then no ack can cover it, and no other
/// connection's ack may hand its buffer back to the reader mid-write.
#[derive(Debug)]
struct Sending {
    hdr: [u8; DATA_HDR],
    chunk: Chunk,
    /// Bytes of header and payload together already written.
    pos: usize,
}

/// Writes what is left of the frame `hdr` + `payload` from `pos` (bytes of both already
/// written), one writev per call to the socket, until it is all written (Ok(true)) or the
/// socket is full (Ok(false)). A short write leaves `pos` where the next one resumes, also
/// in the middle of the header.
fn write_frame(
    w: &mut impl Write,
    hdr: &[u8],
    payload: &[u8],
    pos: &mut usize,
) -> io::Result<bool> {
    use std::io::IoSlice;
    let total = hdr.len() + payload.len();
    while *pos < total {
        let r = if *pos < hdr.len() {
            w.write_vectored(&[IoSlice::new(&hdr[*pos..]), IoSlice::new(payload)])
        } else {
            w.write(&payload[*pos - hdr.len()..])
        };
        match r {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
            Ok(n) => *pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Why a file chunk could not be read: the input file ended before `end` (it shrank under
/// the sender), which no other path can mend.
fn shrank(e: io::Error, end: u64) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the input file ended before byte {end}: it shrank while being sent"),
        )
    } else {
        e
    }
}

/// As [`write_frame`], for a payload of `len` bytes of `file` at `off`: the header with
/// MSG_MORE (it waits for its payload and they leave in the same segments), then the payload
/// with sendfile, straight from the page cache: on TCP the kernel points the socket at the
/// cached pages (MSG_SPLICE_PAGES), no copy through the sender's memory. A file that ends
/// before `off + len` is an UnexpectedEof error.
fn send_file_frame(
    sock: &impl std::os::fd::AsRawFd,
    hdr: &[u8],
    file: &File,
    off: u64,
    len: usize,
    pos: &mut usize,
) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    let total = hdr.len() + len;
    while *pos < total {
        let n = if *pos < hdr.len() {
            let h = &hdr[*pos..];
            // SAFETY: `h` is valid for its length for the duration of the call.
            unsafe {
                libc::send(
                    fd,
                    h.as_ptr().cast(),
                    h.len(),
                    libc::MSG_MORE | libc::MSG_NOSIGNAL,
                )
            }
        } else {
            let done = *pos - hdr.len();
            let mut o = (off + done as u64) as libc::off_t;
            // SAFETY: two open descriptors and an offset the call updates; nothing else.
            unsafe { libc::sendfile(fd, file.as_raw_fd(), &mut o, len - done) }
        };
        match n {
            0 if *pos < hdr.len() => {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "send returned 0"))
            }
            0 => {
                return Err(shrank(
                    io::ErrorKind::UnexpectedEof.into(),
                    off + len as u64,
                ))
            }
            n if n > 0 => *pos += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(false),
                    io::ErrorKind::Interrupted => {}
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(true)
}

/// A connected, welcomed stream: its socket, the address that answered, the receiver's
/// window, and its keys with --psk-file.
pub(crate) type Connected = (TcpStream, SocketAddr, u64, Option<Channel>);

/// A reconnection's outcome, from its thread.
type Reconnected = (usize, Result<Connected, Error>);

/// The opened input: what to read it from; a regular file's second descriptor, which its
/// chunks are sent from with sendfile or read from again for a re-send ([`Src::File`]); a
/// regular file's length when it was opened.
struct Opened {
    read: Box<dyn Read + Send>,
    file: Option<Arc<File>>,
    len: Option<u64>,
}

/// Opens the input: a file that cannot be opened fails before any connection is made.
///
/// Copying is the default and `sendfile` (-Z) the choice, as in iperf3. With sendfile the
/// socket points at the page cache's pages and the sender makes no copy, which saves its CPU
/// when a NIC sends them. When the receiver shares this machine's CPUs (a veth, loopback),
/// its copy out of the socket then reads those pages cold from memory, whereas a sender's
/// copy leaves the bytes in the cache the receiver reads them from. One veth, TSO on, 400 MB
/// file to file, medians of 7 interleaved runs (bench/results/mpcat-2026-11-27-c.md, MB/s):
/// copied 2127, sendfile 1655, socat 1876; with offloads off (every segment a packet, the
/// stacks' per-packet work the cost) 1069, 1131 and 752.
fn open_input(input: &Input) -> Result<Opened, Error> {
    match input {
        Input::Stdin => Ok(Opened {
            read: Box::new(io::stdin()),
            file: None,
            len: None,
        }),
        Input::File(p) => {
            let open = |e| Error::io(format!("open {}", p.display()), e);
            let f = File::open(p).map_err(open)?;
            let meta = f.metadata().map_err(open)?;
            let regular = meta.is_file();
            let file = match regular {
                // The reader reads (and hashes) through its own descriptor's offset;
                // sendfile and pread give theirs with each call and move none.
                true => Some(Arc::new(f.try_clone().map_err(open)?)),
                false => None,
            };
            Ok(Opened {
                read: Box::new(f),
                file,
                len: regular.then_some(meta.len()),
            })
        }
    }
}

/// Connects stream `index` and does its handshake (with --psk-file, the Noise handshake
/// first); returns the socket, the address that answered, the receiver's window and the keys.
/// `pre`: a connection already made (--mptcp's, or one that fell back), only handshaken here.
#[expect(
    clippy::too_many_arguments,
    reason = "the session's fixed parts and this stream's own, called from the start and from reconnect threads"
)]
pub(crate) fn connect(
    cfg: &SendConfig,
    n_streams: u16,
    lowat: Option<u32>,
    addrs: &[SocketAddr],
    from: Option<SocketAddr>,
    token: frame::Token,
    index: u16,
    pre: Option<(TcpStream, SocketAddr)>,
) -> Result<Connected, Error> {
    let mut last = None;
    let mut sock = pre;
    for a in addrs.iter().filter(|_| sock.is_none()) {
        match connect_from(*a, from, cfg.connect_timeout, cfg.mptcp) {
            Ok(s) => {
                sock = Some((s, *a));
                break;
            }
            Err(e) => last = Some((*a, e)),
        }
    }
    let (mut s, addr) = match (sock, last) {
        (Some(s), _) => s,
        (None, Some((a, e))) if index == frame::REVERSE_STREAM => {
            return Err(Error::io(format!("the reverse stream: connect {a}"), e))
        }
        (None, Some((a, e))) => return Err(Error::io(format!("stream {index}: connect {a}"), e)),
        (None, None) => return Err(Error::msg(format!("{}: no address", cfg.address))),
    };
    let name = if index == frame::REVERSE_STREAM {
        "the reverse stream".to_string()
    } else {
        format!("stream {index}")
    };
    let what = |w: &str| format!("{name}: {w} {addr}");
    // Small frames (acks, the verdict) must not wait for Nagle.
    s.set_nodelay(true)
        .map_err(|e| Error::io(what("TCP_NODELAY on"), e))?;
    match crate::set_path_timeout(&s, cfg.path_timeout) {
        Ok(()) => {}
        // Not every kernel takes these on an MPTCP socket; its subflows then rely on TCP's
        // own retransmission limits and MPTCP's re-injection.
        Err(_) if cfg.mptcp => {}
        Err(e) => return Err(Error::io(what("TCP_USER_TIMEOUT/keepalive on"), e)),
    }
    // "Room" means little unsent data in the socket, not a free send buffer ([`unsent_bound`]).
    if let Some(lowat) = lowat {
        set_notsent_lowat(&s, lowat).map_err(|e| Error::io(what("TCP_NOTSENT_LOWAT on"), e))?;
    }
    let hello = Frame::Hello {
        version: VERSION,
        token,
        stream: index,
        streams: n_streams,
        chunk: cfg.chunk,
    };
    let mut buf = [0u8; 64 + frame::MAX_REASON];
    s.set_read_timeout(Some(cfg.connect_timeout))
        .map_err(|e| Error::io(what("SO_RCVTIMEO on"), e))?;
    if let Some(psk) = &cfg.psk {
        let mut chan = noise_handshake(&mut s, psk, cfg.connect_timeout, &what)?;
        let n = hello.emit(&mut buf);
        let mut sealed = Vec::with_capacity(n + REC_HDR + TAG);
        chan.seal(&buf[..n], &mut sealed);
        s.write_all(&sealed)
            .map_err(|e| Error::io(what("send hello to"), e))?;
        // The Welcome (or a Refuse) is one record; read exactly it, so nothing that follows
        // (an ack, on a stream that rejoins a running session) is lost with this buffer.
        let mut raw = [0u8; REC_HDR + TAG + 64 + frame::MAX_REASON];
        read_exact(&mut s, &mut raw[..REC_HDR], cfg.connect_timeout, &what)?;
        let len = usize::from(u16::from_be_bytes([raw[0], raw[1]]));
        if !(TAG..=raw.len() - REC_HDR).contains(&len) {
            return Err(Error::msg(format!(
                "{}: a {len}-byte record where a welcome belongs",
                what("handshake with")
            )));
        }
        read_exact(
            &mut s,
            &mut raw[REC_HDR..REC_HDR + len],
            cfg.connect_timeout,
            &what,
        )?;
        let mut have = 0;
        chan.open(&raw[..REC_HDR + len], &mut buf, &mut have)
            .map_err(|e| Error::msg(format!("{}: {e}", what("handshake with"))))?;
        let window = match Frame::parse(&buf[..have]) {
            Ok((Frame::Welcome { version, window }, used))
                if version == VERSION && used == have =>
            {
                window
            }
            Ok((Frame::Refuse { reason }, _)) => {
                return Err(Error::msg(format!("{}: {reason}", what("refused by"))));
            }
            other => {
                return Err(Error::msg(format!(
                    "{}: expected a welcome, got {other:?}",
                    what("handshake with")
                )))
            }
        };
        return Ok((s, addr, window, Some(chan)));
    }
    let n = hello.emit(&mut buf);
    s.write_all(&buf[..n])
        .map_err(|e| Error::io(what("send hello to"), e))?;
    // Exactly one frame: on a stream that rejoins a running session an ack may follow the
    // Welcome at once, and it belongs to the event loop, not to this buffer.
    let frame = read_frame(&mut s, &mut buf, cfg.connect_timeout, &what)?;
    match Frame::parse(&buf[..frame]) {
        Ok((Frame::Welcome { version, window }, _)) if version == VERSION => {
            Ok((s, addr, window, None))
        }
        Ok((Frame::Welcome { version, .. }, _)) => Err(Error::msg(format!(
            "{}: the receiver speaks version {version}, this is {VERSION}",
            what("handshake with")
        ))),
        Ok((Frame::Refuse { reason }, _)) => {
            Err(Error::msg(format!("{}: {reason}", what("refused by"))))
        }
        Ok((Frame::Noise { .. }, _)) => Err(Error::msg(format!(
            "{}: the receiver wants a key handshake: give this side its --psk-file",
            what("handshake with")
        ))),
        other => Err(Error::msg(format!(
            "{}: expected a welcome, got {other:?}",
            what("handshake with")
        ))),
    }
}

/// Reads exactly one frame into `buf` (its header first, then the body it declares, bounded
/// by its type); returns its length.
fn read_frame(
    s: &mut TcpStream,
    buf: &mut [u8],
    timeout: Duration,
    what: &dyn Fn(&str) -> String,
) -> Result<usize, Error> {
    read_exact(s, &mut buf[..frame::FRAME_HDR], timeout, what)?;
    let need = match Frame::parse(&buf[..frame::FRAME_HDR]) {
        Err(FrameError::Truncated { need, .. }) if need <= buf.len() => need,
        Ok(_) => return Ok(frame::FRAME_HDR),
        Err(e) => {
            return Err(Error::msg(format!(
                "{}: not an mpcat receiver: {e}",
                what("handshake with")
            )))
        }
    };
    read_exact(s, &mut buf[frame::FRAME_HDR..need], timeout, what)?;
    Ok(need)
}

/// Fills `buf` from `s` (whose SO_RCVTIMEO is set); a timeout or a close is said as such.
fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    timeout: Duration,
    what: &dyn Fn(&str) -> String,
) -> Result<(), Error> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            Error::msg(format!("{}: closed during the handshake", what("receiver")))
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::msg(format!(
            "{}: no answer within {timeout:?}",
            what("handshake with")
        )),
        _ => Error::io(what("read the handshake from"), e),
    })
}

/// The sender's side of a --psk-file connection's Noise handshake: its message out, the
/// receiver's answer (or refusal) in.
fn noise_handshake(
    s: &mut TcpStream,
    psk: &Psk,
    timeout: Duration,
    what: &dyn Fn(&str) -> String,
) -> Result<Channel, Error> {
    let mut m1 = [0u8; HANDSHAKE_MSG];
    let init = psk.initiate(&mut m1)?;
    let mut buf = [0u8; frame::FRAME_HDR + frame::MAX_REASON];
    let n = Frame::Noise {
        version: VERSION,
        msg: &m1,
    }
    .emit(&mut buf);
    s.write_all(&buf[..n])
        .map_err(|e| Error::io(what("send the key handshake to"), e))?;
    // One frame back: its header says how long it is (bounded by its type).
    let need = read_frame(s, &mut buf, timeout, what)?;
    match Frame::parse(&buf[..need]) {
        Ok((Frame::Noise { version, msg }, _)) if version == VERSION => {
            init.finish(msg).ok_or_else(|| {
                Error::msg(format!(
                    "{}: its answer does not authenticate under this --psk-file: the receiver holds another key",
                    what("handshake with")
                ))
            })
        }
        Ok((Frame::Noise { version, .. }, _)) => Err(Error::msg(format!(
            "{}: the receiver speaks version {version}, this is {VERSION}",
            what("handshake with")
        ))),
        Ok((Frame::Refuse { reason }, _)) => {
            Err(Error::msg(format!("{}: {reason}", what("refused by"))))
        }
        other => Err(Error::msg(format!(
            "{}: expected the key handshake's answer, got {other:?}",
            what("handshake with")
        ))),
    }
}

/// The session failed on this side: tells the receiver why (a Refuse, on every connection with
/// nothing half-written), so it fails at once instead of waiting out --path-timeout. Best
/// effort: the connections close right after.
fn give_up(conns: &mut [Conn], why: &str) {
    let mut b = [0u8; 64 + frame::MAX_REASON];
    let n = Frame::Refuse { reason: why }.emit(&mut b);
    for c in conns.iter_mut() {
        if c.sock.is_none() || c.out_pos < c.out.len() || c.data.is_some() {
            continue;
        }
        c.out.clear();
        c.out_pos = 0;
        c.put(&b[..n]);
        let _ = flush(c, &mut VecDeque::new(), None);
    }
}

/// --mptcp's connection: an IPPROTO_MPTCP socket connected to the first of the receiver's
/// addresses that answers. The error of socket() itself when the kernel has no MPTCP.
fn open_mptcp(cfg: &SendConfig) -> io::Result<(TcpStream, SocketAddr)> {
    let mut last = io::Error::other("no address");
    for a in &cfg.peer {
        match connect_from(*a, None, cfg.connect_timeout, true) {
            Ok(s) => return Ok((s, *a)),
            Err(e) if crate::mptcp::unsupported(&e) => return Err(e),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// What a socket may hold written but not yet sent (TCP_NOTSENT_LOWAT) before the loop
/// gives it more: "room" is little unsent data, not a free send buffer.
///
/// Several ways out: 128 KiB. A slow link's socket then cannot swallow megabytes that the
/// fast links wait for at the end (40/30/20/10 Mbit/s links: 85 % of their sum with the
/// autotuned buffer alone, 94.5 % with this).
///
/// One way out: 32 KiB. With the autotuned buffer alone (megabytes unsent), on one veth the
/// connection sent 1,500-8,400 segments a run again (400 MB) while their originals were still
/// queued on the other CPU's backlog, against socat's 0-400. Most likely cause: data left both
/// from the sender's `sendfile` and from the ACKs the receiver's CPU handled, and a veth
/// queues each packet on the CPU that sent it, so the two queues reordered it. With little
/// left unsent, the sender's own writes send nearly all of it. Hand runs,
/// 4 rounds interleaved, MB/s medians against socat's in the same rounds (retransmitted
/// segments): TSO on, unbounded 1235 (1,600-2,300), 32 KiB 1312 (1), 64 KiB 1291, 128 KiB
/// 1270, 256 KiB 1183, socat 1395; offloads off, unbounded 967 (6,000-8,400), 32 KiB 1264
/// (1-141), 64 KiB 1191, 128 KiB 1160, socat 1320. The price, with TSO on and the output on
/// disk: 1283 against 1366 unbounded (socat 1358). Unbounded, the ACKs the receiver's CPU
/// handled sent the unsent megabytes, so that CPU did the sender's transmits for it: a veth
/// can move that work, a network between two hosts cannot. Those runs sent the file with
/// sendfile; copied (the default since -Z), 7 rounds, TSO on: 32 KiB 1750, 128 KiB 1381,
/// unbounded 1402 (socat 1512).
fn unsent_bound(several: bool, chunk: u32) -> u32 {
    chunk.min(if several { 128 << 10 } else { 32 << 10 })
}

/// TCP_NOTSENT_LOWAT: the socket is writable (and takes writes) only while fewer than
/// `bytes` of what was written are not yet sent.
fn set_notsent_lowat(s: &TcpStream, bytes: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt with a pointer to an int and its size, on a socket we own.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A TCP connection to `to`, from `from` when given (a failed stream's own address and
/// port, so the L4 hash puts it on the same path; a fresh port if that one is taken).
fn connect_from(
    to: SocketAddr,
    from: Option<SocketAddr>,
    timeout: Duration,
    mptcp: bool,
) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let proto = if mptcp {
        Protocol::from(crate::mptcp::IPPROTO_MPTCP)
    } else {
        Protocol::TCP
    };
    let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(proto))?;
    if let Some(f) = from {
        s.set_reuse_address(true)?;
        // Taken (still in use by the old connection's remains): any port will do.
        let _ = s.bind(&f.into());
    }
    s.connect_timeout(&to.into(), timeout)?;
    Ok(s.into())
}

/// The input's descriptor when it is stdin and not a regular file or a block device (a pipe,
/// a terminal, a socket): there a read returns what has arrived, and what has arrived goes
/// out without waiting for a whole chunk, so lines typed to a shell on the other side reach it
/// as `nc` sends them. Files and disks always fill their chunks.
fn live_input(input: &Input) -> Option<std::os::fd::RawFd> {
    if *input != Input::Stdin {
        return None;
    }
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on fd 0 with a pointer to a stat we own.
    if unsafe { libc::fstat(0, &mut st) } != 0 {
        return None;
    }
    let kind = st.st_mode & libc::S_IFMT;
    (kind != libc::S_IFREG && kind != libc::S_IFBLK).then_some(0)
}

/// Whether `fd` has more to read at once (or its end: the next read returns it at once).
fn readable_now(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// The input read chunk by chunk and hashed as it goes: on the reader thread ([`reader`]), or
/// for a regular file on the loop itself ([`Source::Inline`]).
struct Feed {
    input: Box<dyn Read + Send>,
    /// -Z, and the input is this regular file: one buffer serves every read (it is only
    /// hashed) and each chunk names the file's bytes ([`Src::File`]).
    file: Option<Arc<File>>,
    /// A regular file's length when it was opened: ending before it, the file shrank under
    /// us, and the stream fails rather than end short and verified (growing is fine, as cat).
    opened_len: Option<u64>,
    /// See [`live_input`]: a piece ends early when nothing more has arrived.
    live: Option<std::os::fd::RawFd>,
    chunk: usize,
    size: Option<u64>,
    hasher: crate::StreamHasher,
    seq: u64,
    back_tx: mpsc::Sender<Buf>,
    /// The buffer reused for a file's reads.
    own: Option<Buf>,
}

impl Feed {
    /// Reads the next chunk into `buf` and queues what the loop is to get: the chunk, and the
    /// end after it at EOF, or why reading failed. False once nothing more will come. The
    /// buffer goes into the chunk's block, or back to `own` for a file.
    fn fill(&mut self, mut buf: Buf, out: &mut VecDeque<FromReader>) -> bool {
        buf.set_len(buf.capacity());
        let chunk = self.chunk.min(buf.len());
        let mut got = 0;
        let mut eof = false;
        while got < chunk {
            match self.input.read(&mut buf[got..chunk]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    got += n;
                    if got < chunk && self.live.is_some_and(|fd| !readable_now(fd)) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    out.push_back(FromReader::Failed(Error::io("read the input", e)));
                    return false;
                }
            }
        }
        buf.set_len(got);
        // --size: nothing past it is sent, and an input that ends short never sends its end.
        let read = self.seq + got as u64;
        match self.size {
            Some(want) if read > want => {
                out.push_back(FromReader::Failed(Error::msg(format!(
                    "the input is longer than --size {want}: {read} bytes read so far"
                ))));
                return false;
            }
            Some(want) if eof && read != want => {
                out.push_back(FromReader::Failed(Error::msg(format!(
                    "the input ended after {read} bytes, --size says {want}"
                ))));
                return false;
            }
            _ => {}
        }
        if let Some(len) = self.opened_len.filter(|l| eof && read < *l) {
            let e = shrank(io::ErrorKind::UnexpectedEof.into(), len);
            out.push_back(FromReader::Failed(Error::msg(e.to_string())));
            return false;
        }
        if got > 0 {
            self.hasher.update(&buf);
            let (src, off) = match &self.file {
                Some(f) => {
                    self.own = Some(buf);
                    (Src::File(Arc::clone(f)), self.seq as usize)
                }
                None => (
                    Src::Mem(Arc::new(Block {
                        buf: Some(buf),
                        back: self.back_tx.clone(),
                    })),
                    0,
                ),
            };
            out.push_back(FromReader::Chunk(Chunk {
                seq: self.seq,
                src,
                off,
                len: got,
                conn: 0,
            }));
            self.seq += got as u64;
        } else if self.file.is_some() {
            self.own = Some(buf);
        }
        if eof {
            let hasher = std::mem::take(&mut self.hasher);
            out.push_back(FromReader::End {
                total: self.seq,
                hash: hasher.finish(),
            });
            return false;
        }
        true
    }
}

/// Runs `feed` on its own thread, into buffers from the pool (at most `pool` of them exist,
/// so the input is read no further ahead than the window).
fn reader(
    mut feed: Feed,
    pool: usize,
    tx: SyncSender<FromReader>,
    back: Receiver<Buf>,
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
) {
    let mut made = 0usize;
    let mut fresh: Vec<Buf> = Vec::new();
    let mut out = VecDeque::new();
    let send = |m: FromReader| {
        let ok = tx.send(m).is_ok();
        let _ = waker.wake();
        ok
    };
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let buf = match feed.own.take().map_or_else(|| back.try_recv(), Ok) {
            Ok(b) => b,
            Err(_) if made < pool => {
                if fresh.is_empty() {
                    match bufpool::carve(feed.chunk, bufpool::per_slab(feed.chunk).min(pool - made))
                    {
                        Ok(b) => fresh = b,
                        Err(e) => {
                            send(FromReader::Failed(Error::io("map the read buffers", e)));
                            return;
                        }
                    }
                }
                match fresh.pop() {
                    Some(b) => {
                        made += 1;
                        b
                    }
                    // carve gives as many as asked, at least one: never empty here.
                    None => continue,
                }
            }
            Err(_) => match back.recv_timeout(Duration::from_millis(100)) {
                Ok(b) => b,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        let more = feed.fill(buf, &mut out);
        for m in out.drain(..) {
            if !send(m) {
                return;
            }
        }
        if !more {
            return;
        }
    }
}

/// Where the loop takes the input's chunks from.
enum Source {
    /// The reader thread.
    Thread(Receiver<FromReader>),
    /// A regular file, read (and hashed) by the loop itself when it needs the next chunk:
    /// reading takes a fraction of the loop's time, and on 2 CPUs a third busy thread beside
    /// the loop and the receiver only waits for a CPU (and wakes the loop through the waker,
    /// each chunk). Copied (without -Z), the chunks' buffers come back as soon as each is
    /// written ([`written`]), so a few serve the whole file.
    Inline {
        feed: Box<Feed>,
        queue: VecDeque<FromReader>,
        more: bool,
        /// Copied chunks' buffers, back once the receiver has every piece of theirs.
        back: Receiver<Buf>,
        /// Buffers of the last slab cut, not used yet.
        fresh: Vec<Buf>,
    },
}

impl Source {
    fn try_next(&mut self) -> Result<FromReader, TryRecvError> {
        match self {
            Source::Thread(rx) => rx.try_recv(),
            Source::Inline {
                feed,
                queue,
                more,
                back,
                fresh,
            } => {
                if queue.is_empty() && *more {
                    let reused = feed.own.take().or_else(|| back.try_recv().ok());
                    let buf = match reused.or_else(|| fresh.pop()) {
                        Some(b) => b,
                        None => match bufpool::carve(feed.chunk, bufpool::per_slab(feed.chunk)) {
                            Ok(mut b) => {
                                let one = b.pop().ok_or(TryRecvError::Disconnected)?;
                                *fresh = b;
                                one
                            }
                            Err(e) => {
                                *more = false;
                                return Ok(FromReader::Failed(Error::io("map the read buffer", e)));
                            }
                        },
                    };
                    *more = feed.fill(buf, queue);
                }
                queue.pop_front().ok_or(TryRecvError::Disconnected)
            }
        }
    }
}

/// The loop's state beside its connections.
struct Flow {
    unsent: VecDeque<Chunk>,
    inflight: VecDeque<Chunk>,
    /// The receiver's credit: nothing at or past this offset may be sent.
    limit: u64,
    acked: u64,
    end: Option<(u64, crate::Digest)>,
    /// The connection the end frame went out on.
    end_sent: Option<usize>,
    /// The receiver's verdict.
    done: Option<(u64, bool)>,
    start: Instant,
    /// The receiver's window, and when the connections' rates were last measured.
    window: u64,
    tick: Instant,
    /// The smallest and largest chunk a connection takes.
    lo: usize,
    hi: usize,
    failures: Vec<PathFailure>,
    reconnects: u64,
    resent: u64,
    /// Since when no connection has been up.
    none_since: Option<Instant>,
    /// --rate-limit: stream bytes as tokens.
    bucket: Option<TokenBucket>,
    /// How long until the bucket holds the next chunk, when it held too few.
    pace_wait: Option<Duration>,
    /// Why the session cannot go on, found while writing (a file input that shrank).
    fatal: Option<String>,
    /// The input when it is a regular file: a chunk written whole names its bytes there
    /// ([`written`]), so its buffer is read into again at once.
    file: Option<Arc<File>>,
}

impl Flow {
    /// Drops the chunks the receiver has written (their blocks go back to the reader once
    /// all of their chunks are).
    fn release(&mut self) {
        let acked = self.acked;
        self.inflight.retain(|ch| ch.end() > acked);
    }
}

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
    // --psk-file seals the bytes in user space: they are read into buffers as from a pipe
    // (the command line refuses -Z with it).
    let opened = open_input(&cfg.input)?;
    let sendfile = cfg.zerocopy && cfg.psk.is_none();
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
    // --mptcp: one MPTCP connection, the kernel's subflows instead of striping; striping over
    // TCP when the kernel or the receiver does not do MPTCP (said once). A connection that
    // fell back is plain TCP: it serves as stream 0.
    let mut mptcp_report = None;
    let mut pre = None;
    if cfg.mptcp {
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
    let used = matches!(pre, Some((_, _, true)));
    let eff = SendConfig {
        mptcp: used,
        streams: if used { Some(1) } else { cfg.streams },
        ..cfg.clone()
    };
    let cfg = &eff;
    let mut pre = pre.map(|(s, a, _)| (s, a));
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
    let mut conns = Vec::with_capacity(usize::from(n_streams));
    let mut addrs = cfg.peer.clone();
    let mut window = u64::MAX;
    // A connection made before (--mptcp's) is stream 0 wherever it went; the others are
    // spread over the members after its own.
    let first = match (&pre, &paths) {
        (Some((s, a)), Some(p)) => s
            .local_addr()
            .ok()
            .and_then(|l| p.member_of(l, *a).ok())
            .unwrap_or(0),
        _ => 0,
    };
    for i in 0..n_streams {
        let pre = if i == 0 { pre.take() } else { None };
        let placed = paths
            .as_ref()
            .filter(|p| p.egress.members().len() > 1 && pre.is_none())
            .and_then(|p| pick_source(p, to, (first + usize::from(i)) % members.len()));
        let from = placed.map(|(a, _)| a);
        let (s, addr, w, chan) = connect(cfg, n_streams, lowat, &addrs, from, token, i, pre)?;
        // The first address that answered is the one every stream uses.
        addrs = vec![addr];
        window = window.min(w);
        let local = s
            .local_addr()
            .map_err(|e| Error::io(format!("stream {i}: getsockname"), e))?;
        let path = match (&paths, placed) {
            (_, Some((_, m))) => members.get(m).cloned(),
            (Some(p), None) => p
                .member_of(local, addr)
                .ok()
                .and_then(|m| members.get(m).cloned()),
            (None, None) => None,
        };
        let sock = register(&poll, s, usize::from(i))?;
        conns.push(Conn {
            sock: Some(sock),
            local,
            peer: addr,
            path,
            // Plain data frames are written from their chunk: `out` holds only control
            // frames then.
            out: Vec::with_capacity(if chan.is_some() {
                DATA_HDR + chunk
            } else {
                256
            }),
            out_pos: 0,
            data: None,
            writable: true,
            inbuf: vec![0; INBUF],
            in_len: 0,
            bytes: 0,
            reconnecting: false,
            size: cfg.chunk_min as usize,
            size_max: cfg.chunk_min as usize,
            rate: 0.0,
            bytes_then: 0,
            next_try: start,
            raw: if chan.is_some() {
                vec![0; RAW_BUF]
            } else {
                Vec::new()
            },
            raw_len: 0,
            chan,
        });
    }
    let waker = Arc::new(
        Waker::new(poll.registry(), WAKER).map_err(|e| Error::io("eventfd for the reader", e))?,
    );
    // Chunks alive at once: the window's worth, one more per stream being written, and a
    // few read ahead.
    let pool = (window / chunk as u64).min(1 << 16) as usize + conns.len() + 4;
    let (back_tx, back_rx) = mpsc::channel();
    let inline = opened.file.is_some();
    let feed = Feed {
        input: opened.read,
        file: opened.file.clone().filter(|_| sendfile),
        opened_len: opened.len,
        live: live_input(&cfg.input),
        chunk,
        size: cfg.size,
        hasher: crate::StreamHasher::new(),
        seq: 0,
        back_tx,
        own: None,
    };
    let reader_stop = Arc::new(AtomicBool::new(false));
    let (mut source, rthread) = if inline {
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
        let (waker, rstop) = (Arc::clone(&waker), Arc::clone(&reader_stop));
        let t = std::thread::Builder::new()
            .name("mpcat-read".into())
            .spawn(move || reader(feed, pool, tx, back_rx, waker, rstop))
            .map_err(|e| Error::io("start the reader thread", e))?;
        (Source::Thread(rx), Some(t))
    };
    let mut flow = Flow {
        unsent: VecDeque::new(),
        inflight: VecDeque::new(),
        limit: window,
        acked: 0,
        end: None,
        end_sent: None,
        done: None,
        start,
        window,
        tick: start,
        lo: cfg.chunk_min as usize,
        hi: chunk,
        failures: Vec::new(),
        reconnects: 0,
        resent: 0,
        none_since: None,
        // A burst of two of the smallest chunks (chunks are cut no larger under a limit):
        // enough to keep every connection fed between polls, small enough that a second's
        // rate stays within a few percent of the limit.
        bucket: cfg
            .rate_limit
            .map(|r| TokenBucket::new(r as f64, (2 * cfg.chunk_min).max(1))),
        pace_wait: None,
        fatal: None,
        file: opened.file,
    };
    let (conn_tx, conn_rx) = mpsc::channel();
    let ctx = Ctx {
        cfg,
        n_streams,
        lowat,
        token,
        addr: addrs[0],
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
    .err();
    if let Some(why) = &failure {
        give_up(&mut conns, why);
    }
    reader_stop.store(true, Ordering::Relaxed);
    drop(source);
    if let Some(t) = rthread {
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
    Ok(MpcatReport {
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
        chunk_size: chunk as u64,
        window,
        encrypted: cfg.psk.is_some(),
        mptcp: mptcp_report,
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
        egress,
        path_failures: flow.failures,
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
    })
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
fn pick_source(p: &Paths, to: SocketAddr, want: usize) -> Option<(SocketAddr, usize)> {
    use socket2::{Domain, Protocol, Socket, Type};
    for _ in 0..4096 {
        let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP)).ok()?;
        s.bind(&SocketAddr::new(p.src, 0).into()).ok()?;
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

/// Connection `i` failed: it is closed, its chunks not yet written by the receiver go back
/// to the front of the queue (the others will carry them), and it is reopened later.
fn fail_conn(poll: &Poll, i: usize, c: &mut Conn, flow: &mut Flow, why: String) {
    let Some(mut sock) = c.sock.take() else {
        return;
    };
    let _ = poll.registry().deregister(&mut sock);
    drop(sock);
    flow.failures.push(PathFailure {
        stream: i as u16,
        local: c.local.to_string(),
        peer: c.peer.to_string(),
        at: flow.start.elapsed().as_secs_f64(),
        why,
    });
    c.out.clear();
    c.out_pos = 0;
    c.in_len = 0;
    c.raw_len = 0;
    c.chan = None;
    c.writable = false;
    c.next_try = Instant::now() + Duration::from_millis(200);
    let mut again: Vec<Chunk> = Vec::new();
    if let Some(d) = c.data.take() {
        if d.pos > 0 {
            flow.resent += d.chunk.len as u64;
        }
        again.push(d.chunk);
    }
    let mut k = 0;
    while k < flow.inflight.len() {
        if flow.inflight[k].conn == i {
            if let Some(ch) = flow.inflight.remove(k) {
                flow.resent += ch.len as u64;
                again.push(ch);
            }
        } else {
            k += 1;
        }
    }
    again.sort_by_key(|ch| ch.seq);
    for ch in again.into_iter().rev() {
        flow.unsent.push_front(ch);
    }
    if flow.end_sent == Some(i) {
        flow.end_sent = None;
    }
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
) -> Result<(), String> {
    let mut events = Events::with_capacity(256);
    let mut rr = 0usize;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(format!(
                "interrupted: {} bytes acknowledged by the receiver",
                flow.acked
            ));
        }
        let ahead = read_ahead(
            flow.hi,
            conns.len(),
            flow.window,
            matches!(rx, Source::Inline { .. }),
        );
        let mut held_back = take(rx, flow, ahead)?;
        // Streams that came back.
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
        if conns.iter().any(|c| c.sock.is_some()) {
            flow.none_since = None;
        } else {
            let since = *flow.none_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= ctx.cfg.path_timeout {
                let last = flow.failures.last().map_or_else(String::new, |f| {
                    format!(" (last: stream {}: {})", f.stream, f.why)
                });
                return Err(format!(
                    "no path left: every stream failed and none reopened within {:?}, {} bytes acknowledged{last}",
                    ctx.cfg.path_timeout, flow.acked
                ));
            }
        }
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
        live.bytes.store(flow.acked, Ordering::Relaxed);
        for (i, c) in conns.iter().enumerate() {
            live.set_stream(i, c.bytes);
        }
        if let Some((total, ok)) = flow.done {
            if !ok {
                return Err(
                    "the receiver's hash does not match: the stream arrived corrupted".into(),
                );
            }
            return match flow.end {
                Some((t, _)) if t == total => Ok(()),
                _ => Err(format!(
                    "the receiver counted {total} bytes, {} were sent",
                    flow.end.map_or(0, |e| e.0)
                )),
            };
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
            Err(e) => return Err(format!("epoll_wait: {e}")),
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

fn unsent_bytes(flow: &Flow) -> usize {
    flow.unsent.iter().map(|c| c.len).sum()
}

/// Takes what the reader has until `ahead` bytes are unsent; true when it stopped there
/// (the reader may have more).
fn take(rx: &mut Source, flow: &mut Flow, ahead: usize) -> Result<bool, String> {
    let mut unsent = unsent_bytes(flow);
    while unsent < ahead {
        match rx.try_next() {
            Ok(FromReader::Chunk(c)) => {
                unsent += c.len;
                flow.unsent.push_back(c);
            }
            Ok(FromReader::End { total, hash }) => flow.end = Some((total, hash)),
            Ok(FromReader::Failed(e)) => return Err(tcpkit_stats::chain(&e)),
            Err(TryRecvError::Empty) => return Ok(false),
            Err(TryRecvError::Disconnected) => {
                if flow.end.is_none() {
                    return Err("the input reader stopped".into());
                }
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Each [`RATE_TICK`]: measures what each connection took since the last, and sets its chunk
/// size from that ([`chunk_size`]).
fn adapt(conns: &mut [Conn], flow: &mut Flow) {
    let dt = flow.tick.elapsed();
    if dt < RATE_TICK || flow.lo == flow.hi {
        return;
    }
    flow.tick = Instant::now();
    let up = conns.iter().filter(|c| c.sock.is_some()).count();
    for c in conns.iter_mut() {
        let r = (c.bytes - c.bytes_then) as f64 / dt.as_secs_f64();
        c.bytes_then = c.bytes;
        c.rate = if c.rate == 0.0 { r } else { (c.rate + r) / 2.0 };
        c.size = chunk_size(c.rate, flow.lo, flow.hi, flow.window, up);
        c.size_max = c.size_max.max(c.size);
    }
}

/// Why a connection's read or write stopped.
enum ConnError {
    /// The connection died: its chunks go out on the others.
    Path(String),
    /// The receiver said no, or spoke nonsense: the session is over.
    Fatal(String),
}

/// Reads what the receiver sent on connection `i`: acks (credit) and the verdict.
fn read_conn(i: usize, c: &mut Conn, flow: &mut Flow) -> Result<(), ConnError> {
    let Some(sock) = c.sock.as_mut() else {
        return Ok(());
    };
    loop {
        let into = match c.chan {
            Some(_) => &mut c.raw[c.raw_len..],
            None => &mut c.inbuf[c.in_len..],
        };
        match sock.read(into) {
            Ok(0) => {
                if flow.done.is_some() {
                    return Ok(());
                }
                return Err(ConnError::Path("closed by the receiver".into()));
            }
            Ok(n) if c.chan.is_some() => c.raw_len += n,
            Ok(n) => c.in_len += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ConnError::Path(format!("read: {e}"))),
        }
        // Records are opened as room frees up in inbuf: until none is left to open.
        loop {
            let mut opened = 0;
            if let Some(ch) = c.chan.as_mut() {
                // A record that does not open is not a path failure: someone altered it.
                opened = ch
                    .open(&c.raw[..c.raw_len], &mut c.inbuf, &mut c.in_len)
                    .map_err(|e| ConnError::Fatal(format!("stream {i} ({}): {e}", c.peer)))?;
                c.raw.copy_within(opened..c.raw_len, 0);
                c.raw_len -= opened;
            }
            let mut at = 0;
            loop {
                match Frame::parse(&c.inbuf[at..c.in_len]) {
                    Ok((f, used)) => {
                        at += used;
                        match f {
                            Frame::Ack { acked, limit } => {
                                flow.limit = flow.limit.max(limit);
                                if acked > flow.acked {
                                    flow.acked = acked;
                                    flow.release();
                                }
                            }
                            Frame::Done { total, ok } => {
                                if ok {
                                    flow.acked = flow.acked.max(total);
                                }
                                flow.done = Some((total, ok));
                            }
                            Frame::Refuse { reason } => {
                                return Err(ConnError::Fatal(format!(
                                    "stream {i} ({}): refused: {reason}",
                                    c.peer
                                )))
                            }
                            other => {
                                return Err(ConnError::Fatal(format!(
                                    "stream {i} ({}): the receiver sent a frame only a sender sends: {other:?}",
                                    c.peer
                                )))
                            }
                        }
                    }
                    Err(FrameError::Truncated { .. }) => break,
                    Err(e) => {
                        return Err(ConnError::Fatal(format!("stream {i} ({}): {e}", c.peer)))
                    }
                }
            }
            c.inbuf.copy_within(at..c.in_len, 0);
            c.in_len -= at;
            if c.in_len == c.inbuf.len() {
                return Err(ConnError::Fatal(format!(
                    "stream {i}: a frame from the receiver over {INBUF} bytes"
                )));
            }
            if opened == 0 {
                break;
            }
        }
    }
}

/// Writes what connection `c` has pending: its control frames, then its data frame (which
/// joins `sent` once written whole); Ok(false) when the socket is full. A file input that
/// shrank is fatal: the bytes are gone for every path.
fn flush(
    c: &mut Conn,
    sent: &mut VecDeque<Chunk>,
    file: Option<&Arc<File>>,
) -> Result<bool, ConnError> {
    let Some(sock) = c.sock.as_mut() else {
        return Ok(false);
    };
    while c.out_pos < c.out.len() {
        match sock.write(&c.out[c.out_pos..]) {
            Ok(0) => return Err(ConnError::Path("write returned 0".into())),
            Ok(n) => c.out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.writable = false;
                return Ok(false);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ConnError::Path(format!("write: {e}"))),
        }
    }
    c.out.clear();
    c.out_pos = 0;
    if let Some(d) = c.data.as_mut() {
        let ch = &d.chunk;
        let r = match &ch.src {
            Src::Mem(b) => write_frame(
                sock,
                &d.hdr,
                &b.bytes()[ch.off..ch.off + ch.len],
                &mut d.pos,
            ),
            Src::File(f) => send_file_frame(sock, &d.hdr, f, ch.off as u64, ch.len, &mut d.pos),
        };
        match r {
            Ok(true) => {}
            Ok(false) => {
                c.writable = false;
                return Ok(false);
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ConnError::Fatal(e.to_string()))
            }
            Err(e) => return Err(ConnError::Path(format!("write: {e}"))),
        }
        if let Some(d) = c.data.take() {
            sent.push_back(written(d.chunk, file));
        }
    }
    Ok(true)
}

/// A chunk written whole to its socket, kept until the receiver has it: a copied chunk of a
/// regular file names its bytes in the file from now on, and its buffer goes back to be read
/// into again. Kept, the buffers were the bytes in flight (megabytes on a fast path), fresh
/// ones page-faulted and zeroed as the flight grew: on one veth one run in three spent 5-10 %
/// of the CPU's samples in clear_page_erms and ran at 700-1200 MB/s against 1700-1900.
fn written(mut ch: Chunk, file: Option<&Arc<File>>) -> Chunk {
    if let (Src::Mem(_), Some(f)) = (&ch.src, file) {
        ch.src = Src::File(Arc::clone(f));
        ch.off = ch.seq as usize;
    }
    ch
}

/// Hands chunks to connections with room, one chunk per connection per round so that every
/// connection with room gets work, until the sockets are full, the credit is used, or no
/// chunk is ready; then the end frame. A connection whose write fails is failed over.
fn fill(poll: &Poll, conns: &mut [Conn], flow: &mut Flow, rr: &mut usize) {
    let n = conns.len();
    loop {
        let mut progressed = false;
        for k in 0..n {
            let i = (*rr + k) % n;
            let c = &mut conns[i];
            if c.sock.is_none() || !c.writable {
                continue;
            }
            match flush(c, &mut flow.inflight, flow.file.as_ref()) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(ConnError::Path(why)) => {
                    fail_conn(poll, i, c, flow, why);
                    continue;
                }
                Err(ConnError::Fatal(why)) => {
                    flow.fatal = Some(why);
                    return;
                }
            }
            // The connection's own size, cut from the front chunk (a rest smaller than the
            // smallest chunk goes along), and never more than two of the smallest under a
            // rate limit (the bucket's burst).
            let lo = flow.lo;
            let take = flow.unsent.front().map_or(0, |ch| {
                let mut n = c.size.min(ch.len);
                if flow.bucket.is_some() {
                    n = n.min(2 * lo);
                }
                if ch.len - n < lo {
                    n = ch.len;
                    if flow.bucket.is_some() && n > 2 * lo {
                        n = 2 * lo;
                    }
                }
                n
            });
            let mut fits = flow
                .unsent
                .front()
                .is_some_and(|ch| ch.seq + take as u64 <= flow.limit);
            if let (true, Some(b)) = (fits, flow.bucket.as_mut()) {
                let now = flow.start.elapsed().as_nanos() as u64;
                if !b.try_take(now, take as u64) {
                    flow.pace_wait = Some(Duration::from_nanos(b.time_until(now, take as u64)));
                    fits = false;
                }
            }
            if fits {
                let Some(mut ch) = flow.unsent.pop_front() else {
                    continue;
                };
                if take < ch.len {
                    flow.unsent.push_front(ch.split(take));
                }
                c.bytes += ch.len as u64;
                ch.conn = i;
                let hdr = frame::data_header(ch.seq, ch.len);
                if c.chan.is_some() {
                    // Records are sealed into a buffer: the copy is the encryption's own.
                    c.put(&hdr);
                    let mut scratch = Vec::new();
                    match ch.bytes(&mut scratch) {
                        Ok(b) => c.put(b),
                        Err(e) => {
                            flow.fatal = Some(format!("read the input: {e}"));
                            return;
                        }
                    }
                    flow.inflight.push_back(written(ch, flow.file.as_ref()));
                } else {
                    c.data = Some(Sending {
                        hdr,
                        chunk: ch,
                        pos: 0,
                    });
                }
                progressed = true;
            } else if let (Some((total, hash)), true, None) =
                (flow.end, flow.unsent.is_empty(), flow.end_sent)
            {
                let mut b = [0u8; 64];
                let n = Frame::End { total, hash }.emit(&mut b);
                c.put(&b[..n]);
                flow.end_sent = Some(i);
                progressed = true;
            } else {
                continue;
            }
            match flush(c, &mut flow.inflight, flow.file.as_ref()) {
                Ok(_) => {}
                Err(ConnError::Path(why)) => fail_conn(poll, i, c, flow, why),
                Err(ConnError::Fatal(why)) => {
                    flow.fatal = Some(why);
                    return;
                }
            }
        }
        *rr = (*rr + 1) % n.max(1);
        if !progressed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FRAME_HDR;

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex(&[0, 0xab, 7]), "00ab07");
    }

    /// A non-blocking socket pair whose writing end holds 4 KiB: writes come up short.
    fn tiny_pair() -> (
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
    ) {
        let (w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        socket2::SockRef::from(&w)
            .set_send_buffer_size(4096)
            .unwrap();
        w.set_nonblocking(true).unwrap();
        r.set_nonblocking(true).unwrap();
        (w, r)
    }

    /// Reads everything `r` holds now into `got`.
    fn drain_into(r: &mut std::os::unix::net::UnixStream, got: &mut Vec<u8>) {
        let mut b = [0u8; 65536];
        loop {
            match r.read(&mut b) {
                Ok(n) if n > 0 => got.extend_from_slice(&b[..n]),
                Ok(_) => panic!("closed"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn writev_frames_resume_where_a_short_write_stopped() {
        // A tiny send buffer, drained only when it is full (one thread, no timing): nearly
        // every frame is cut short, some inside the header.
        let (mut w, mut r) = tiny_pair();
        let mut got = Vec::new();
        let mut drain = |got: &mut Vec<u8>| drain_into(&mut r, got);
        let mut want = Vec::new();
        let (mut short, mut in_header) = (0, 0);
        for (k, len) in [1usize, 7, 5000, 200_000, 13, 65_536, 3]
            .into_iter()
            .enumerate()
        {
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 + k) as u8).collect();
            let hdr = frame::data_header(k as u64 * 1000, len);
            want.extend_from_slice(&hdr);
            want.extend_from_slice(&payload);
            let mut pos = 0;
            while !write_frame(&mut w, &hdr, &payload, &mut pos).unwrap() {
                short += 1;
                if pos < hdr.len() {
                    in_header += 1;
                }
                assert!(pos < hdr.len() + payload.len());
                drain(&mut got);
            }
            assert_eq!(pos, hdr.len() + payload.len());
        }
        drain(&mut got);
        assert!(
            short > 10,
            "only {short} short writes: the test did not test resuming"
        );
        assert_eq!(got.len(), want.len());
        assert!(
            got == want,
            "the bytes differ ({in_header} resumes inside a header)"
        );
    }

    #[test]
    fn chunk_sizes_follow_the_rate_within_their_bounds() {
        let (lo, hi, w) = (64 << 10, 1 << 20, 64 << 20);
        // Not measured yet, or a path that took little: the smallest.
        assert_eq!(chunk_size(0.0, lo, hi, w, 4), lo);
        assert_eq!(chunk_size(5e6, lo, hi, w, 4), lo);
        assert_eq!(chunk_size(6.25e6, lo, hi, w, 4), lo);
        // 200 Mbit/s: 250 kB in 10 ms, the next power of two.
        assert_eq!(chunk_size(25e6, lo, hi, w, 4), 256 << 10);
        // An unshaped veth: the largest.
        assert_eq!(chunk_size(900e6, lo, hi, w, 1), hi);
        // A small window shared by 8 connections: half of an eighth of it.
        assert_eq!(chunk_size(900e6, lo, hi, 4 << 20, 8), 256 << 10);
        // Never under the smallest, however small the window.
        assert_eq!(chunk_size(900e6, lo, hi, 1 << 20, 64), lo);
        // A fixed size stays fixed.
        assert_eq!(chunk_size(900e6, 4096, 4096, w, 2), 4096);
    }

    #[test]
    fn a_block_goes_back_to_the_reader_when_its_last_piece_is_dropped() {
        let (back, returned) = mpsc::channel();
        let mut buf = bufpool::carve(100, 1).unwrap().pop().unwrap();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut a = Chunk {
            seq: 1000,
            src: Src::Mem(Arc::new(Block {
                buf: Some(buf),
                back,
            })),
            off: 0,
            len: 100,
            conn: 0,
        };
        let mut b = a.split(30);
        let c = b.split(50);
        assert_eq!((a.seq, a.len, a.end()), (1000, 30, 1030));
        assert_eq!((b.seq, b.len, b.end()), (1030, 50, 1080));
        assert_eq!((c.seq, c.len, c.end()), (1080, 20, 1100));
        let mut scratch = Vec::new();
        assert_eq!(
            b.bytes(&mut scratch).unwrap(),
            &(30..80u8).collect::<Vec<_>>()[..]
        );
        assert_eq!(
            c.bytes(&mut scratch).unwrap(),
            &(80..100u8).collect::<Vec<_>>()[..]
        );
        drop(b);
        drop(a);
        assert!(
            returned.try_recv().is_err(),
            "returned while a piece is alive"
        );
        drop(c);
        assert_eq!(returned.try_recv().unwrap().len(), 100);
    }

    /// A copied chunk of a regular file, once written, names its bytes in the file (which a
    /// re-send reads) and gives its buffer back at once; without a file (a pipe) it keeps
    /// the buffer until the receiver has it.
    #[test]
    fn a_written_chunk_of_a_file_gives_its_buffer_back_and_reads_from_the_file() {
        let (tmp, bytes) = TempFile::new("written", 4096);
        let file = Arc::new(File::open(&tmp.0).unwrap());
        let chunk = |seq: u64, back: mpsc::Sender<Buf>| {
            let mut buf = bufpool::carve(1000, 1).unwrap().pop().unwrap();
            buf.copy_from_slice(&bytes[seq as usize..seq as usize + 1000]);
            Chunk {
                seq,
                src: Src::Mem(Arc::new(Block {
                    buf: Some(buf),
                    back,
                })),
                off: 0,
                len: 1000,
                conn: 0,
            }
        };
        let (back, returned) = mpsc::channel();
        let mut ch = chunk(2000, back.clone());
        let rest = ch.split(300);
        let ch = written(ch, Some(&file));
        assert!(matches!(ch.src, Src::File(_)));
        assert_eq!((ch.seq, ch.off, ch.len), (2000, 2000, 300));
        assert!(returned.try_recv().is_err(), "the rest still holds it");
        let rest = written(rest, Some(&file));
        assert_eq!(returned.try_recv().unwrap().len(), 1000);
        let mut scratch = Vec::new();
        assert_eq!(ch.bytes(&mut scratch).unwrap(), &bytes[2000..2300]);
        assert_eq!(rest.bytes(&mut scratch).unwrap(), &bytes[2300..3000]);

        let kept = written(chunk(0, back), None);
        assert!(matches!(kept.src, Src::Mem(_)));
        assert!(
            returned.try_recv().is_err(),
            "a pipe's chunk keeps its buffer"
        );
        drop(kept);
        assert_eq!(returned.try_recv().unwrap().len(), 1000);
    }

    /// A file of `len` bytes (`i * 7 + 3` each) under the temp dir, removed when dropped.
    struct TempFile(std::path::PathBuf);
    impl TempFile {
        fn new(tag: &str, len: usize) -> (TempFile, Vec<u8>) {
            let p = std::env::temp_dir().join(format!("mpcat-{tag}-{}", std::process::id()));
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            std::fs::write(&p, &bytes).unwrap();
            (TempFile(p), bytes)
        }
    }
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn sendfile_frames_resume_where_a_short_write_stopped() {
        let (tmp, bytes) = TempFile::new("sendfile", 600_000);
        let file = File::open(&tmp.0).unwrap();
        let (w, mut r) = tiny_pair();
        let mut got = Vec::new();
        let mut drain = |got: &mut Vec<u8>| drain_into(&mut r, got);
        let mut want = Vec::new();
        let mut short = 0;
        // Pieces of the file out of order, as chunks re-sent after a path failure are.
        let pieces = [
            (1000usize, 1),
            (0, 7),
            (300_000, 200_000),
            (5, 5000),
            (599_990, 10),
        ];
        for (k, &(off, len)) in pieces.iter().cycle().take(40).enumerate() {
            let off = (off + k) % (600_000 - len);
            let hdr = frame::data_header(off as u64, len);
            want.extend_from_slice(&hdr);
            want.extend_from_slice(&bytes[off..off + len]);
            let mut pos = 0;
            while !send_file_frame(&w, &hdr, &file, off as u64, len, &mut pos).unwrap() {
                short += 1;
                assert!(pos < hdr.len() + len);
                drain(&mut got);
            }
            assert_eq!(pos, hdr.len() + len);
        }
        drain(&mut got);
        assert!(
            short > 10,
            "only {short} short writes: resuming was not tested"
        );
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the frames arrived altered");
    }

    #[test]
    fn a_file_that_shrank_is_an_error_naming_where_it_ended() {
        use std::os::unix::net::UnixStream;
        let (tmp, _) = TempFile::new("shrank", 10_000);
        let file = File::open(&tmp.0).unwrap();
        let (w, _r) = UnixStream::pair().unwrap();
        let hdr = frame::data_header(8000, 4000);
        let mut pos = 0;
        let e = send_file_frame(&w, &hdr, &file, 8000, 4000, &mut pos).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("before byte 12000"), "{e}");
        // What was there went out; nothing past the end was made up.
        assert_eq!(pos, hdr.len() + 2000);
        let c = Chunk {
            seq: 9000,
            src: Src::File(Arc::new(file)),
            off: 9000,
            len: 2000,
            conn: 0,
        };
        let e = c.bytes(&mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn the_frame_header_size_is_what_the_loop_reserves() {
        assert_eq!(DATA_HDR, FRAME_HDR + 8);
    }
}
