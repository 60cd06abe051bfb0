//! The TLS byte stream an event loop drives: a rustls connection over a non-blocking socket
//! that the caller owns, registers and polls (edge-triggered: every call here goes on until
//! the socket would block, so no readiness is left unseen).
//!
//! The session does not own the socket, so a server keeps its slab slot as small as in clear
//! and a client keeps its own socket type; each call takes the socket it works on. Memory:
//! rustls holds one record's worth of input while it decrypts, and output only while the
//! socket cannot take it (capped by [`OUT_LIMIT`]); an idle session holds neither.

use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{
    ClientConfig, ClientConnection, Connection, HandshakeKind, ServerConfig, ServerConnection,
};

/// Most bytes of TLS output (and plaintext waiting for the handshake) a session keeps for a
/// socket that is not taking them: past it, [`Session::write`] takes nothing more
/// (back-pressure), as a clear connection's send buffer would.
pub const OUT_LIMIT: usize = 64 << 10;

/// Why a handshake did not complete.
#[derive(Debug)]
pub enum HandshakeError {
    /// The TLS layer refused (a certificate, a version, ALPN, an alert from the peer).
    Tls(rustls::Error),
    /// The socket failed.
    Io(io::Error),
    /// The peer closed the connection before the handshake was done.
    Eof,
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Tls(e) => write!(f, "{e}"),
            HandshakeError::Io(e) => write!(f, "{e}"),
            HandshakeError::Eof => f.write_str("connection closed by the peer"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// What a completed handshake agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    /// `TLSv1.3` or `TLSv1.2`.
    pub version: &'static str,
    /// The cipher suite's IANA name (`TLS13_AES_128_GCM_SHA256`).
    pub cipher: &'static str,
    /// A session resumed (ticket or session ID) rather than a full handshake.
    pub resumed: bool,
}

/// One TLS connection's state (client or server side), without its socket.
#[derive(Debug)]
pub struct Session {
    conn: Connection,
    /// The last read from the socket returned less than it asked for (the socket was empty).
    short: bool,
    /// See [`Session::drained`].
    drained: bool,
}

/// The socket as rustls reads it, noting whether a read came back short: a stream socket's
/// read that returns less than asked found its receive queue empty, which is what lets
/// [`Session::drained`] spare the read that would only say EAGAIN.
struct Probe<'a, S> {
    sock: &'a mut S,
    short: bool,
}

impl<S: Read> Read for Probe<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}

/// The socket as rustls writes to it: rustls hands its queued records to `write_vectored`,
/// which a socket does with writev(2); a single record (a query's or an answer's, the usual
/// case) goes to `write` instead, which std's sockets do with send(2). writev runs through the
/// VFS layer (the file position lock, the iovec import, rw_verify_area) that send skips:
/// vfs_writev alone was 3-4 % of `load --tls --dns`'s CPU at top rate.
struct OneWrite<'a, S>(&'a mut S);

impl<S: Write> Write for OneWrite<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match bufs {
            [one] => self.0.write(one),
            _ => self.0.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Session {
    /// A client session for `name` (the SNI and the name the certificate is checked against;
    /// an IP address sends no SNI and is checked against the certificate's IP names).
    pub fn client(
        cfg: &Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> Result<Session, rustls::Error> {
        let mut c = ClientConnection::new(Arc::clone(cfg), name)?;
        c.set_buffer_limit(Some(OUT_LIMIT));
        Ok(Session::of(c.into()))
    }

    fn of(conn: Connection) -> Session {
        Session {
            conn,
            short: false,
            drained: false,
        }
    }

    /// A server session: the handshake waits for the client's hello.
    pub fn server(cfg: &Arc<ServerConfig>) -> Result<Session, rustls::Error> {
        let mut c = ServerConnection::new(Arc::clone(cfg))?;
        c.set_buffer_limit(Some(OUT_LIMIT));
        Ok(Session::of(c.into()))
    }

    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Moves the handshake on as far as the socket allows: `Ok(true)` once it is done (the
    /// session then carries plaintext), `Ok(false)` when it waits for the socket. On an error
    /// the alert that says why is sent when the socket takes it.
    pub fn handshake<S: Read + Write>(&mut self, sock: &mut S) -> Result<bool, HandshakeError> {
        loop {
            self.flush(sock).map_err(HandshakeError::Io)?;
            if !self.conn.is_handshaking() {
                return Ok(true);
            }
            match self.conn.read_tls(sock) {
                Ok(0) => return Err(HandshakeError::Eof),
                Ok(_) => {
                    if let Err(e) = self.conn.process_new_packets() {
                        let _ = self.flush(sock);
                        return Err(HandshakeError::Tls(e));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(HandshakeError::Io(e)),
            }
        }
    }

    /// Reads plaintext: `Ok(n > 0)` bytes, `Ok(0)` at the end of the stream (the peer's
    /// close_notify or its FIN: servers that close without close_notify are common, and
    /// nothing here depends on telling the two apart), `WouldBlock` when the socket is empty.
    /// A TLS error after the handshake (a bad record) is `InvalidData`.
    pub fn read<S: Read + Write>(&mut self, sock: &mut S, out: &mut [u8]) -> io::Result<usize> {
        self.drained = false;
        loop {
            match self.conn.reader().read(out) {
                Ok(n) => {
                    // Less than asked: every byte of plaintext held was handed out.
                    self.drained = self.short && n < out.len();
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            let mut probe = Probe { sock, short: false };
            let got = self.conn.read_tls(&mut probe);
            self.short = probe.short;
            match got {
                Ok(_) => {
                    // Ok(0) too: the end is then seen by the reader above.
                    self.conn
                        .process_new_packets()
                        .map_err(|e| io::Error::new(ErrorKind::InvalidData, e))?;
                    // A key update or a ticket's acknowledgement may want to go out.
                    if self.conn.wants_write() {
                        self.flush(sock)?;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// After a [`Session::read`] that returned bytes: whether the socket was found empty and
    /// every byte of plaintext held has been handed out, so that the next read would only say
    /// `WouldBlock` (what a short read says of a clear socket). An edge-triggered caller then
    /// waits for the next readiness event instead of making that read: one receive syscall
    /// in three of a request-response TLS connection. A partial record held back waits for
    /// bytes that raise a new event.
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// Takes plaintext (as much as [`OUT_LIMIT`] allows) and writes its records as far as the
    /// socket takes them; what it does not take stays here until [`Session::flush`]. Returns
    /// the plaintext bytes taken, or `WouldBlock` when none could be.
    pub fn write<S: Read + Write>(&mut self, sock: &mut S, data: &[u8]) -> io::Result<usize> {
        if self.conn.wants_write() {
            self.flush(sock)?;
        }
        let n = self.conn.writer().write(data)?;
        self.flush(sock)?;
        if n == 0 && !data.is_empty() {
            return Err(ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    /// Writes pending TLS output; `Ok(true)` when none is left.
    pub fn flush<S: Write>(&mut self, sock: &mut S) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut OneWrite(sock)) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether TLS output waits for the socket.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Sends close_notify (as far as the socket takes it at once: the connection is being
    /// closed, nothing waits for it).
    pub fn close<S: Write>(&mut self, sock: &mut S) {
        self.conn.send_close_notify();
        let _ = self.flush(sock);
    }

    /// The protocol agreed by ALPN (`h2`, `http/1.1`, `dot`), once the handshake is done.
    pub fn alpn(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// The server name the client asked for (server side; None without SNI).
    pub fn sni(&self) -> Option<&str> {
        match &self.conn {
            Connection::Server(s) => s.server_name(),
            Connection::Client(_) => None,
        }
    }

    /// What the handshake agreed on; None while it is not done.
    pub fn info(&self) -> Option<Info> {
        if self.conn.is_handshaking() {
            return None;
        }
        let version = match self.conn.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
            rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
            _ => "other",
        };
        let cipher = self
            .conn
            .negotiated_cipher_suite()
            .and_then(|s| s.suite().as_str())
            .unwrap_or("unknown");
        Some(Info {
            version,
            cipher,
            resumed: self.conn.handshake_kind() == Some(HandshakeKind::Resumed),
        })
    }
}
