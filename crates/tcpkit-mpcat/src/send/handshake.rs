//! The sender's side of a connection's start: the TCP connect (from a chosen source address,
//! or MPTCP), the socket options every stream carries, the Noise handshake with --psk-file,
//! and the Hello answered by a Welcome or a Refuse, each failure said with the stream and
//! the address.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::frame::{self, Frame, FrameError, VERSION};
use crate::secure::{Channel, Psk, HANDSHAKE_MSG, REC_HDR, TAG};
use crate::Error;

use super::SendConfig;

/// A connected, welcomed stream: its socket, the address that answered, the receiver's
/// window, and its keys with --psk-file.
pub(crate) type Connected = (TcpStream, SocketAddr, u64, Option<Channel>);

/// How soon a connection the receiver closed before answering is tried again, at first and
/// at most (doubling): its handshake slots were full of strangers, or it closed this one to
/// make room for a newer one.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(50);
pub(crate) const RETRY_MAX: Duration = Duration::from_millis(500);

/// Connects stream `index` and does its handshake (with --psk-file, the Noise handshake
/// first); returns the socket, the address that answered, the receiver's window and the keys.
/// `pre`: a connection already made (--mptcp's, or one that fell back), only handshaken here.
/// A connection the receiver closes before it answers is tried again, every 50 ms at first
/// and at most every 500 ms, for at most --connect-timeout from the first try.
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
    mut pre: Option<(TcpStream, SocketAddr)>,
) -> Result<Connected, Error> {
    let until = std::time::Instant::now() + cfg.connect_timeout;
    let mut wait = RETRY_FIRST;
    let attempt = |pre: Option<(TcpStream, SocketAddr)>| -> Result<Connected, Error> {
        let mut last = None;
        let mut sock = pre;
        let from = from.or(cfg.source.map(|ip| SocketAddr::new(ip, 0)));
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
            // The session's first connection (the reverse stream's in duplex, else stream 0's):
            // what failed is reaching the receiver at all, whichever stream asked.
            (None, Some((a, e))) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(Error::msg(format!(
                "connect refused to {a}: nothing listens there (is `mpcat -l {}` running on it?)",
                a.port()
            )))
            }
            (None, Some((a, e))) if index == frame::REVERSE_STREAM || index == 0 => {
                return Err(Error::io(format!("connect to {a}"), e))
            }
            (None, Some((a, e))) => {
                return Err(Error::io(format!("stream {index}: connect {a}"), e))
            }
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
            .map_err(|e| closed_or(e, what("send hello to")))?;
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
    };
    loop {
        match attempt(pre.take()) {
            Err(e) if e.is_closed_early() && std::time::Instant::now() + wait < until => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(RETRY_MAX);
            }
            r => return r,
        }
    }
}

/// Reads exactly one frame into `buf` (its header first, then the body it declares, bounded
/// by its type); returns its length.
pub(super) fn read_frame(
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

/// A write of the handshake that failed: the receiver closed the connection (reset, broken
/// pipe) before it answered is worth another try; anything else is said as it is.
fn closed_or(e: io::Error, what: String) -> Error {
    let closed = matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    );
    let e = Error::io(what, e);
    if closed {
        e.closed_early()
    } else {
        e
    }
}

/// Fills `buf` from `s` (whose SO_RCVTIMEO is set); a timeout or a close is said as such.
pub(super) fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    timeout: Duration,
    what: &dyn Fn(&str) -> String,
) -> Result<(), Error> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
            Error::msg(format!("{}: closed during the handshake", what("receiver"))).closed_early()
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
pub(super) fn noise_handshake(
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
        .map_err(|e| closed_or(e, what("send the key handshake to")))?;
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

/// --mptcp's connection: an IPPROTO_MPTCP socket connected to the first of the receiver's
/// addresses that answers. The error of socket() itself when the kernel has no MPTCP.
pub(super) fn open_mptcp(cfg: &SendConfig) -> io::Result<(TcpStream, SocketAddr)> {
    let mut last = io::Error::other("no address");
    for a in &cfg.peer {
        let from = cfg.source.map(|ip| SocketAddr::new(ip, 0));
        match connect_from(*a, from, cfg.connect_timeout, true) {
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
pub(super) fn unsent_bound(several: bool, chunk: u32) -> u32 {
    chunk.min(if several { 128 << 10 } else { 32 << 10 })
}

/// TCP_NOTSENT_LOWAT: the socket is writable (and takes writes) only while fewer than
/// `bytes` of what was written are not yet sent.
pub(super) fn set_notsent_lowat(s: &TcpStream, bytes: u32) -> io::Result<()> {
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
pub(super) fn connect_from(
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
        match s.bind(&f.into()) {
            Ok(()) => {}
            // -s ADDR that is not this host's: said, not replaced by another source.
            Err(e) if f.port() == 0 => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("source address {} (-s): {e}", f.ip()),
                ))
            }
            // Taken (still in use by the old connection's remains): any port will do.
            Err(_) => {}
        }
    }
    s.connect_timeout(&to.into(), timeout)?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::send::testing::config;
    use std::net::TcpListener;

    /// A receiver played by the test: accepts one connection, reads what comes (the Hello),
    /// then does `then` with it.
    fn peer(then: impl FnOnce(TcpStream) + Send + 'static) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 64];
            let _ = s.read(&mut b);
            then(s);
        });
        addr
    }

    fn said(addr: SocketAddr) -> String {
        connect(&config(addr), 1, None, &[addr], None, [1; 16], 0, None)
            .unwrap_err()
            .line()
    }

    fn answer(f: Frame<'static>) -> impl FnOnce(TcpStream) + Send + 'static {
        move |mut s| {
            let mut b = Vec::new();
            f.emit_vec(&mut b);
            s.write_all(&b).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    #[test]
    fn a_welcome_gives_the_window_and_the_stream_its_options() {
        let addr = peer(answer(Frame::Welcome {
            version: VERSION,
            window: 12345,
        }));
        let (s, at, window, chan) = connect(
            &config(addr),
            1,
            Some(32 << 10),
            &[addr],
            None,
            [1; 16],
            0,
            None,
        )
        .unwrap();
        assert_eq!((at, window, chan.is_none()), (addr, 12345, true));
        assert!(s.nodelay().unwrap());
        let user_timeout = socket2::SockRef::from(&s).tcp_user_timeout().unwrap();
        assert_eq!(user_timeout, Some(Duration::from_secs(2)));
    }

    #[test]
    fn every_way_a_handshake_fails_is_said_with_the_stream_and_the_address() {
        let addr = peer(answer(Frame::Refuse { reason: "go away" }));
        assert_eq!(said(addr), format!("stream 0: refused by {addr}: go away"));
        let addr = peer(answer(Frame::Welcome {
            version: VERSION + 1,
            window: 1,
        }));
        assert_eq!(
            said(addr),
            format!(
                "stream 0: handshake with {addr}: the receiver speaks version {}, this is {VERSION}",
                VERSION + 1
            )
        );
        // A receiver that closes every connection before answering (its handshake slots
        // full): tried again, every 50 ms and more, for --connect-timeout (500 ms here).
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let tries = std::thread::spawn(move || {
            l.set_nonblocking(true).unwrap();
            let until = std::time::Instant::now() + Duration::from_secs(1);
            let mut n = 0;
            while std::time::Instant::now() < until {
                if let Ok((s, _)) = l.accept() {
                    drop(s);
                    n += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            n
        });
        let t0 = std::time::Instant::now();
        assert_eq!(
            said(addr),
            format!("stream 0: receiver {addr}: closed during the handshake")
        );
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(900),
            "{took:?}"
        );
        let n = tries.join().unwrap();
        assert!((3..=8).contains(&n), "{n} tries");
        let addr = peer(|_s| std::thread::sleep(Duration::from_secs(2)));
        assert_eq!(
            said(addr),
            format!("stream 0: handshake with {addr}: no answer within 500ms")
        );
        let addr = peer(|mut s| {
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let e = said(addr);
        assert!(
            e.starts_with(&format!(
                "stream 0: handshake with {addr}: not an mpcat receiver"
            )),
            "{e}"
        );
        // Nothing listens: said as such, with the address (the first connection is where a
        // session finds out, whichever stream it is).
        let gone = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = said(gone);
        assert!(
            e.starts_with(&format!("connect refused to {gone}: nothing listens there")),
            "{e}"
        );
    }

    #[test]
    fn the_unsent_bound_is_smaller_for_one_way_out() {
        assert_eq!(unsent_bound(false, 1 << 20), 32 << 10);
        assert_eq!(unsent_bound(true, 1 << 20), 128 << 10);
        assert_eq!(unsent_bound(true, 4096), 4096);
    }
}
