//! The control connection to intercept: the opening exchange (Hello, the key's proof,
//! Welcome), and the engine's side of it afterwards (answers read, pings, loss and
//! reconnection with a back-off).

use super::*;

/// Connects to intercept, says Hello (asking for `max_payload` bytes of each answer), proves
/// `key` when intercept asks for it, and waits for the Welcome: the check at start, so an
/// unreachable or foreign intercept, or a key that does not match, is one clear error instead
/// of copies that never answer.
pub fn handshake(
    addr: SocketAddr,
    timeout: Duration,
    max_payload: u16,
    key: Option<&Key>,
) -> Result<std::net::TcpStream, TransparentError> {
    let unreachable = |source| TransparentError::Unreachable { addr, source };
    let mut hs = CopyHandshake::new(max_payload).map_err(io_err("draw a nonce"))?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(unreachable)?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(timeout)).map_err(unreachable)?;
    let mut out = Vec::new();
    hs.hello(&mut out);
    s.write_all(&out).map_err(unreachable)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    let deadline = Instant::now() + timeout;
    let not = |why: String| TransparentError::NotIntercept { addr, why };
    loop {
        match Msg::parse(&buf) {
            Ok((m, used)) => {
                out.clear();
                let welcomed = hs
                    .on_msg(key, &m, &mut out)
                    .map_err(|why| TransparentError::Handshake { addr, why })?;
                if welcomed {
                    break;
                }
                buf.drain(..used);
                s.write_all(&out).map_err(unreachable)?;
                continue;
            }
            Err(ControlError::Truncated { .. }) => {}
            Err(e) => return Err(not(e.to_string())),
        }
        if Instant::now() > deadline || buf.len() > 4096 {
            return Err(not("no Welcome in time".into()));
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err(not("closed the connection after our Hello".into())),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(not("no Welcome in time".into()))
            }
            Err(e) => return Err(not(format!("the connection failed after our Hello: {e}"))),
        }
    }
    // Anything intercept sent after its Welcome is read by the loop: none is expected before
    // the first SYN, so it is dropped here with the handshake's buffer.
    s.set_nonblocking(true).map_err(unreachable)?;
    Ok(s)
}

impl TpEngine<'_, '_> {
    // ---- control connection ---------------------------------------------------------------

    pub(super) fn control_lost(&mut self, now: u64) {
        if let Some(mut s) = self.t.ctl.sock.take() {
            let _ = self.t.poll.registry().deregister(&mut s);
        }
        let was_up = self.t.ctl.st == CtlState::Up;
        self.t.ctl.inbuf.clear();
        self.t.ctl.backoff = self.t.ctl.backoff.saturating_add(1);
        let wait = (100_000_000u64 << self.t.ctl.backoff.min(4)).min(1_000_000_000);
        self.t.ctl.st = CtlState::Down {
            retry_at: now + wait,
        };
        if !was_up {
            return;
        }
        self.t.ts.control_losses += 1;
        self.t.ctl.down_since = now;
        // Copies past their SYN cannot see their answers any more: reset and counted.
        let mut cut = 0u64;
        for idx in 0..self.f.conns.slots() {
            if self
                .f
                .conns
                .get(idx)
                .is_some_and(|c| c.x.st != St::WaitControl)
            {
                self.end(idx, Outcome::ControlLost, true);
                cut += 1;
            }
        }
        // Said at once (intercept restarted, or its host went away), not only in the report.
        (self.f.say)(&format!(
            "lost the control connection to intercept {}: {cut} copies in flight cut (counted \
             as control lost); new copies wait while it reconnects, {:.1} s apart at first, \
             doubling to 1 s",
            self.t.ctl.addr,
            wait as f64 / 1e9
        ));
    }

    pub(super) fn control_connect(&mut self, now: u64) {
        match TcpStream::connect(self.t.ctl.addr) {
            Ok(mut s) => {
                if self
                    .t
                    .poll
                    .registry()
                    .register(&mut s, CONTROL, Interest::READABLE | Interest::WRITABLE)
                    .is_err()
                {
                    return self.control_lost(now);
                }
                self.t.ctl.sock = Some(s);
                self.t.ctl.st = CtlState::Connecting;
                self.t.ctl.last_rx_ns = now;
            }
            Err(_) => self.control_lost(now),
        }
    }

    pub(super) fn control_io(&mut self, now: u64) {
        if self.t.ctl.st == CtlState::Connecting {
            let max_payload = self.max_payload();
            let Some(s) = self.t.ctl.sock.as_mut() else {
                return;
            };
            match s.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                    if let Ok(Some(_)) | Err(_) = s.take_error() {
                        return self.control_lost(now);
                    }
                    return;
                }
                Err(_) => return self.control_lost(now),
            }
            let Ok(hs) = CopyHandshake::new(max_payload) else {
                return self.control_lost(now);
            };
            let mut hello = Vec::new();
            hs.hello(&mut hello);
            // 27 bytes into an empty socket buffer: written whole or the connection is broken.
            if !matches!(s.write(&hello), Ok(n) if n == hello.len()) {
                return self.control_lost(now);
            }
            self.t.ctl.hs = Some(hs);
            self.t.ctl.st = CtlState::Hello;
            self.t.ctl.last_rx_ns = now;
        }
        let mut chunk = [0u8; 16 << 10];
        loop {
            let Some(s) = self.t.ctl.sock.as_mut() else {
                return;
            };
            match s.read(&mut chunk) {
                Ok(0) => return self.control_lost(now),
                Ok(n) => {
                    self.t.ctl.inbuf.extend_from_slice(&chunk[..n]);
                    self.t.ctl.last_rx_ns = now;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.control_lost(now),
            }
        }
        let buf = std::mem::take(&mut self.t.ctl.inbuf);
        let mut at = 0;
        let mut broken = false;
        let mut welcomed = false;
        while at < buf.len() {
            match Msg::parse(&buf[at..]) {
                Ok((m, n)) => {
                    at += n;
                    match m {
                        Msg::Packet { hdr, payload } if self.t.ctl.st == CtlState::Up => {
                            self.on_answer(&hdr, payload, now);
                        }
                        Msg::Ping if self.t.ctl.st == CtlState::Up => {}
                        _ if self.t.ctl.st == CtlState::Hello => {
                            let Some(hs) = self.t.ctl.hs.as_mut() else {
                                broken = true;
                                break;
                            };
                            let mut out = Vec::new();
                            // The key was proved at start: a reconnect that fails it now
                            // (intercept restarted with another key) is a lost control
                            // connection, retried, and counted as such.
                            match hs.on_msg(self.t.ctl.key.as_ref(), &m, &mut out) {
                                Ok(true) => {
                                    self.t.ctl.hs = None;
                                    self.t.ctl.st = CtlState::Up;
                                    self.t.ctl.backoff = 0;
                                    self.t.ts.control_reconnects += 1;
                                    welcomed = true;
                                    let down = now.saturating_sub(self.t.ctl.down_since);
                                    (self.f.say)(&format!(
                                        "reconnected to intercept {} (down {:.1} s): copying \
                                         resumes",
                                        self.t.ctl.addr,
                                        down as f64 / 1e9
                                    ));
                                }
                                // A 35-byte Proof into a socket that took only 27: written
                                // whole or the connection is broken.
                                Ok(false) => {
                                    let sent = self.t.ctl.sock.as_mut().map(|s| s.write(&out));
                                    if !matches!(sent, Some(Ok(n)) if n == out.len()) {
                                        broken = true;
                                        break;
                                    }
                                }
                                Err(_) => {
                                    broken = true;
                                    break;
                                }
                            }
                        }
                        _ => {
                            broken = true;
                            break;
                        }
                    }
                }
                Err(ControlError::Truncated { .. }) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        if broken {
            return self.control_lost(now);
        }
        let mut buf = buf;
        buf.drain(..at);
        self.t.ctl.inbuf = buf;
        if welcomed {
            // The SYNs held while the control connection was down go now.
            for idx in 0..self.f.conns.slots() {
                if self
                    .f
                    .conns
                    .get(idx)
                    .is_some_and(|c| c.x.st == St::WaitControl)
                {
                    self.pump(idx, now);
                }
            }
        }
    }

    pub(super) fn control_tick(&mut self, now: u64) {
        let silent =
            |e: &TpEngine<'_, '_>| now.saturating_sub(e.t.ctl.last_rx_ns) > CONTROL_SILENCE_NS;
        match self.t.ctl.st {
            CtlState::Down { retry_at } if now >= retry_at => self.control_connect(now),
            CtlState::Connecting | CtlState::Hello | CtlState::Up if silent(self) => {
                // Read before judging: what intercept sent while this process did not run
                // (a loaded machine; or a wait cut short by a signal, which returns no event)
                // is not silence.
                self.control_io(now);
                if matches!(
                    self.t.ctl.st,
                    CtlState::Connecting | CtlState::Hello | CtlState::Up
                ) && silent(self)
                {
                    self.control_lost(now);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_with_nothing_listening_is_unreachable() {
        // A port just released by a listener of our own: nothing listens there now.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let e = handshake(addr, Duration::from_secs(1), 0, None).unwrap_err();
        assert!(matches!(e, TransparentError::Unreachable { .. }), "{e}");
    }

    #[test]
    fn handshake_with_a_foreign_server_says_so() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = [0u8; 11];
            let _ = s.read_exact(&mut hello);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        });
        let e = handshake(addr, Duration::from_secs(1), 0, None).unwrap_err();
        t.join().unwrap();
        assert!(matches!(e, TransparentError::NotIntercept { .. }), "{e}");
    }

    #[test]
    fn handshake_refused_for_another_version_carries_the_reason() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = Vec::new();
            Msg::Refuse {
                version: 9,
                reason: "copy speaks 1, this intercept speaks 9",
            }
            .emit(&mut b);
            let _ = s.write_all(&b);
        });
        let e = handshake(addr, Duration::from_secs(1), 0, None).unwrap_err();
        t.join().unwrap();
        assert_eq!(
            e.to_string(),
            format!("intercept {addr} refused this copy: copy speaks 1, this intercept speaks 9")
        );
    }
}
