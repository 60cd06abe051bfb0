//! One connection of the sender as the loop sees it: what it has queued and how far it is
//! written (control frames, a data frame written straight from its chunk with writev or
//! sendfile), what comes back on it (acks, the verdict) and how a failure is classed (the
//! path, or the whole session).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::frame::{self, Frame, FrameError, DATA_HDR};
use crate::secure::{Channel, REC_HDR, TAG};
use crate::Error;

use super::input::{shrank, written, Chunk, Src};
use super::schedule::Flow;

/// Bytes a sender keeps for frames coming back (acks, the verdict): they are small.
pub(super) const INBUF: usize = 4096;

/// Bytes kept for records not yet opened (--psk-file): two of the largest a receiver's
/// frames make (a record whose plaintext would not fit in INBUF is refused at its header).
pub(super) const RAW_BUF: usize = 2 * (REC_HDR + INBUF + TAG);

#[derive(Debug)]
pub(super) struct Conn {
    /// None while the stream's connection is down.
    pub(super) sock: Option<mio::net::TcpStream>,
    pub(super) local: SocketAddr,
    pub(super) peer: SocketAddr,
    /// The egress member it was placed on.
    pub(super) path: Option<String>,
    /// Control frames (and, with --psk-file, sealed data) being written, and how much of
    /// them is written.
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    /// A plain data frame being written straight from its chunk (after `out`).
    pub(super) data: Option<Sending>,
    /// The socket took everything offered last time: it may have room.
    pub(super) writable: bool,
    pub(super) inbuf: Vec<u8>,
    pub(super) in_len: usize,
    pub(super) bytes: u64,
    /// A reconnection is being tried (on its own thread).
    pub(super) reconnecting: bool,
    /// The size of the chunks it takes now (adapted each [`RATE_TICK`]), and the largest it
    /// has been.
    pub(super) size: usize,
    pub(super) size_max: usize,
    /// Bytes a second it took lately (0: not measured yet), and `bytes` when last measured.
    pub(super) rate: f64,
    pub(super) bytes_then: u64,
    /// When the next reconnection may start.
    pub(super) next_try: Instant,
    /// --psk-file: this connection's keys; `raw` holds records not yet opened into `inbuf`.
    pub(super) chan: Option<Channel>,
    pub(super) raw: Vec<u8>,
    pub(super) raw_len: usize,
}

impl Conn {
    /// A connected, welcomed stream (placed on `path`), with `chan` under --psk-file.
    pub(super) fn new(
        sock: mio::net::TcpStream,
        local: SocketAddr,
        peer: SocketAddr,
        path: Option<String>,
        chan: Option<Channel>,
        cfg: &super::SendConfig,
        start: Instant,
    ) -> Conn {
        Conn {
            sock: Some(sock),
            local,
            peer,
            path,
            // Plain data frames are written from their chunk: `out` holds only control
            // frames then.
            out: Vec::with_capacity(if chan.is_some() {
                DATA_HDR + cfg.chunk as usize
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
        }
    }

    /// Queues `plain` (frames) for the receiver: sealed into records when encrypted.
    pub(super) fn put(&mut self, plain: &[u8]) {
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
pub(super) struct Sending {
    pub(super) hdr: [u8; DATA_HDR],
    pub(super) chunk: Chunk,
    /// Bytes of header and payload together already written.
    pub(super) pos: usize,
}

/// Writes what is left of the frame `hdr` + `payload` from `pos` (bytes of both already
/// written), one writev per call to the socket, until it is all written (Ok(true)) or the
/// socket is full (Ok(false)). A short write leaves `pos` where the next one resumes, also
/// in the middle of the header.
pub(super) fn write_frame(
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

/// As [`write_frame`], for a payload of `len` bytes of `file` at `off`: the header with
/// MSG_MORE (it waits for its payload and they leave in the same segments), then the payload
/// with sendfile, straight from the page cache: on TCP the kernel points the socket at the
/// cached pages (MSG_SPLICE_PAGES), no copy through the sender's memory. A file that ends
/// before `off + len` is an UnexpectedEof error.
pub(super) fn send_file_frame(
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

/// The session failed on this side: tells the receiver why, an [`Frame::Abort`] on every
/// connection, so it fails at once with this reason instead of blaming its connections or
/// waiting out --path-timeout. A data frame half-written is finished first (the abort must
/// start a frame); one not begun is dropped. Bounded by [`crate::ABORT_GRACE`] in all: a
/// receiver that reads nothing any more only delays the exit by that much.
pub(super) fn give_up(conns: &mut [Conn], why: &str) {
    let until = Instant::now() + crate::ABORT_GRACE;
    let mut b = [0u8; 64 + frame::MAX_REASON];
    let n = Frame::Abort { reason: why }.emit(&mut b);
    let mut done = VecDeque::new();
    for c in conns.iter_mut() {
        if c.data.as_ref().is_some_and(|d| d.pos == 0) {
            c.data = None;
        }
    }
    let mut queued = vec![false; conns.len()];
    loop {
        let mut pending = false;
        for (k, c) in conns.iter_mut().enumerate() {
            if c.sock.is_none() {
                continue;
            }
            if c.data.is_none() && !queued[k] {
                c.put(&b[..n]);
                queued[k] = true;
            }
            match flush(c, &mut done, None) {
                // A data frame that has just ended still needs the abort behind it.
                Ok(true) => pending |= !queued[k],
                Ok(false) => pending = true,
                Err(_) => c.sock = None,
            }
            done.clear();
        }
        if !pending || Instant::now() >= until {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mut socks: Vec<&mut mio::net::TcpStream> =
        conns.iter_mut().filter_map(|c| c.sock.as_mut()).collect();
    crate::linger(&mut socks, until);
}

/// Why a connection's read or write stopped.
pub(super) enum ConnError {
    /// The connection died: its chunks go out on the others.
    Path(String),
    /// The receiver said no, or spoke nonsense: the session is over.
    Fatal(Error),
}

/// Reads what the receiver sent on connection `i`: acks (credit) and the verdict.
pub(super) fn read_conn(i: usize, c: &mut Conn, flow: &mut Flow) -> Result<(), ConnError> {
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
                    .map_err(|e| {
                        ConnError::Fatal(Error::of(format!("stream {i} ({})", c.peer), e))
                    })?;
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
                                return Err(ConnError::Fatal(Error::msg(format!(
                                    "stream {i} ({}): refused: {reason}",
                                    c.peer
                                ))))
                            }
                            Frame::Abort { reason } => {
                                return Err(ConnError::Fatal(Error::msg(format!(
                                    "the receiver aborted the session: {reason}"
                                ))))
                            }
                            other => {
                                return Err(ConnError::Fatal(Error::msg(format!(
                                    "stream {i} ({}): the receiver sent a frame only a sender sends: {other:?}",
                                    c.peer
                                ))))
                            }
                        }
                    }
                    Err(FrameError::Truncated { .. }) => break,
                    Err(e) => {
                        return Err(ConnError::Fatal(Error::of(
                            format!("stream {i} ({})", c.peer),
                            e,
                        )))
                    }
                }
            }
            c.inbuf.copy_within(at..c.in_len, 0);
            c.in_len -= at;
            if c.in_len == c.inbuf.len() {
                return Err(ConnError::Fatal(Error::msg(format!(
                    "stream {i}: a frame from the receiver over {INBUF} bytes"
                ))));
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
pub(super) fn flush(
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
                return Err(ConnError::Fatal(Error::msg(e.to_string())))
            }
            Err(e) => return Err(ConnError::Path(format!("write: {e}"))),
        }
        if let Some(d) = c.data.take() {
            sent.push_back(written(d.chunk, file));
        }
    }
    Ok(true)
}

/// What the kernel knows of a connection's acknowledgements (TCP_INFO): the sender's only
/// per-path view of them, since the receiver's acks are cumulative over every path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AckState {
    /// Segments sent and not yet acknowledged.
    pub(super) unacked: u32,
    /// Since the last acknowledgement arrived (any, duplicates included).
    pub(super) since_ack: Duration,
    /// The retransmission timeout before any backoff: srtt + 4 rttvar, at least the
    /// kernel's 200 ms floor.
    pub(super) rto: Duration,
}

/// [`AckState`] of `sock`; None when the kernel does not say (not TCP, closed).
pub(super) fn ack_state(sock: &impl std::os::fd::AsRawFd) -> Option<AckState> {
    // SAFETY: tcp_info is plain integers; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket, a tcp_info to fill, its size.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // The fields read here end at byte 76 (tcpi_rttvar), which every kernel since 2.6 fills.
    if rc != 0 || (len as usize) < 76 {
        return None;
    }
    let rto_us = u64::from(info.tcpi_rtt) + 4 * u64::from(info.tcpi_rttvar);
    Some(AckState {
        unacked: info.tcpi_unacked,
        since_ack: Duration::from_millis(u64::from(info.tcpi_last_ack_recv)),
        rto: Duration::from_micros(rto_us).max(Duration::from_millis(200)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FRAME_HDR;
    use crate::send::TempFile;

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
