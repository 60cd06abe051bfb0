//! A connection's way into the session: the bytes before its Hello (with --psk-file, the
//! Noise handshake first, under a bounded buffer and the Hello deadline), the Hello checked
//! against the session it opens or joins, and the Refuse, with its reason, for the rest. The
//! reverse stream (duplex) joins here too and is handed to its own thread.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Instant;

use mio::{Poll, Token};

use crate::duplex::{Feed, Pump};
use crate::frame::{self, Frame, FrameError, DATA_HDR, MAX_CHUNK, MAX_STREAMS, MIN_CHUNK};
use crate::reorder::Reorder;
use crate::secure::HANDSHAKE_MSG;
use crate::Error;

use super::{
    flush, flush_out, session_window, Receiver, Reverse, Session, State, PENDING_BUF, RAW_BUF,
};

/// Why a --psk-file handshake under another key is refused (the sender shows it).
pub(super) const WRONG_KEY: &str =
    "the receiver holds another key (--psk-file): not this session's key";

pub(super) const PSK_WANTED: &str =
    "this receiver takes encrypted sessions only: give the sender the receiver's --psk-file";

/// Why a connection of another session is refused while one runs: what the other sender
/// needs to know is that the receiver serves one session at a time.
pub(super) const BUSY: &str = "the receiver is busy with another session (it serves one at a time; try again when that one ends)";

/// Why a connection of this session is refused once it is complete.
pub(super) const COMPLETE: &str = "this session is already complete";

pub(super) const PSK_UNWANTED: &str = "this receiver has no --psk-file: it takes unencrypted sessions only (give it the sender's --psk-file)";

impl Receiver<'_> {
    /// A Hello with the reverse stream's index: welcomed, then handed to its own thread
    /// (at once, or when the session's first stream comes).
    pub(super) fn join_reverse(
        &mut self,
        poll: &mut Poll,
        t: Token,
        token: frame::Token,
        chunk: u32,
        extra: bool,
    ) -> Result<(), Error> {
        if extra {
            self.counts.bad_handshake += 1;
            self.refuse(
                poll,
                t,
                "bytes after the reverse stream's hello, before its welcome",
            );
            return Ok(());
        }
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&(chunk as usize)) {
            self.counts.bad_handshake += 1;
            self.refuse(poll, t, "chunk size out of range");
            return Ok(());
        }
        let late = self
            .session
            .as_ref()
            .is_some_and(|s| s.token != token || s.verdict.is_some());
        if late || !matches!(self.reverse, Reverse::None) {
            self.counts.wrong_token += 1;
            let why = self.why_not(&token);
            self.refuse(poll, t, why);
            return Ok(());
        }
        let Some(mut c) = self.drop_conn(poll, t) else {
            return Ok(());
        };
        let _ = crate::set_path_timeout(&c.sock, self.cfg.path_timeout);
        self.say(&format!(
            "connection from {} to {}: the reverse stream",
            c.peer, c.local
        ));
        c.put(&Frame::Welcome {
            version: frame::VERSION,
            window: self.cfg.window,
        });
        // What the socket does not take now, the reverse stream's thread writes first.
        let _ = flush(&mut c);
        let unsent = c.out[c.out_pos..].to_vec();
        let sock = {
            use std::os::fd::{FromRawFd, IntoRawFd};
            // SAFETY: the descriptor comes out of the mio socket, which gives it up.
            unsafe { std::net::TcpStream::from_raw_fd(c.sock.into_raw_fd()) }
        };
        if sock.set_nonblocking(false).is_err() {
            self.counts.accept_errors += 1;
            return Ok(());
        }
        self.reverse = Reverse::Parked {
            token,
            sock,
            chan: c.chan.take(),
            unsent,
            chunk,
            since: Instant::now(),
        };
        if self.session.is_some() {
            self.start_pump()?;
        }
        Ok(())
    }

    /// Starts the parked reverse stream's thread (the session has begun).
    pub(super) fn start_pump(&mut self) -> Result<(), Error> {
        let Reverse::Parked {
            sock,
            chan,
            unsent,
            chunk,
            ..
        } = std::mem::replace(&mut self.reverse, Reverse::None)
        else {
            return Ok(());
        };
        let feed = match &self.feed {
            Some(f) => Arc::clone(f),
            None => {
                let f = Feed::start(&self.cfg.input)?;
                self.feed = Some(Arc::clone(&f));
                f
            }
        };
        let pump = Pump::start(sock, chan, unsent, chunk as usize, feed)?;
        self.reverse = Reverse::Running(pump);
        Ok(())
    }

    /// Reads a pending connection's Hello; accepts it into the session or refuses it.
    pub(super) fn read_hello(&mut self, poll: &mut Poll, t: Token) -> Result<(), Error> {
        if !self.read_pending(poll, t) {
            return Ok(());
        }
        let Step::Next(hello) = self.open_hello(poll, t) else {
            return Ok(());
        };
        if hello.version != frame::VERSION {
            self.counts.bad_handshake += 1;
            self.refuse(poll, t, &not_spoken(hello.version));
            return Ok(());
        }
        if hello.stream == frame::REVERSE_STREAM {
            let extra = hello.rest_len + hello.raw_rest_len > 0;
            return self.join_reverse(poll, t, hello.token, hello.chunk, extra);
        }
        let Some(begins) = self.admit(poll, t, &hello) else {
            return Ok(());
        };
        if begins {
            self.start_pump()?;
        }
        self.start_stream(poll, t, &hello)
    }

    /// Reads what a pending connection has sent into its bounded buffer; false when it
    /// closed or failed (it is dropped and counted).
    fn read_pending(&mut self, poll: &mut Poll, t: Token) -> bool {
        let Some(c) = self.conns.get_mut(&t) else {
            return false;
        };
        let State::Pending { buf, len, .. } = &mut c.state else {
            return false;
        };
        loop {
            match c.sock.read(&mut buf[*len..]) {
                // Closed; or a full buffer that is still no handshake (a read into no room).
                Ok(0) => break,
                Ok(n) => *len += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
            if *len == buf.len() {
                return true;
            }
        }
        self.counts.bad_handshake += 1;
        self.drop_conn(poll, t);
        false
    }

    /// The Hello out of the pending bytes: in plain, or (--psk-file) after the Noise
    /// handshake, inside the first record.
    fn open_hello(&mut self, poll: &mut Poll, t: Token) -> Step<Hello> {
        let encrypted = self.cfg.psk.is_some();
        let mut plain = [0u8; PENDING_BUF];
        let mut plain_len = 0;
        let mut raw_rest = [0u8; PENDING_BUF];
        let mut raw_rest_len = 0;
        if encrypted {
            match self.key_handshake(poll, t) {
                Step::Next(()) => {}
                Step::Wait => return Step::Wait,
                Step::Gone => return Step::Gone,
            }
            let Some(c) = self.conns.get_mut(&t) else {
                return Step::Gone;
            };
            let (State::Pending { buf, len, .. }, Some(ch)) = (&c.state, c.chan.as_mut()) else {
                return Step::Gone;
            };
            match ch.open(&buf[..*len], &mut plain, &mut plain_len) {
                // The Hello's record is not all there yet.
                Ok(_) if plain_len == 0 => return Step::Wait,
                Ok(used) => {
                    raw_rest_len = *len - used;
                    raw_rest[..raw_rest_len].copy_from_slice(&buf[used..*len]);
                }
                Err(_) => {
                    self.counts.bad_handshake += 1;
                    self.drop_conn(poll, t);
                    return Step::Gone;
                }
            }
        } else {
            let Some(State::Pending { buf, len, .. }) = self.conns.get(&t).map(|c| &c.state) else {
                return Step::Gone;
            };
            plain[..*len].copy_from_slice(&buf[..*len]);
            plain_len = *len;
        }
        let full = matches!(
            self.conns.get(&t).map(|c| &c.state),
            Some(State::Pending { len, .. }) if *len == PENDING_BUF
        );
        match Frame::parse(&plain[..plain_len]) {
            // Unencrypted, the Hello may come in pieces; encrypted, its record holds it whole.
            Err(FrameError::Truncated { .. }) if !encrypted && !full => Step::Wait,
            Ok((
                Frame::Hello {
                    version,
                    token,
                    stream,
                    streams,
                    chunk,
                },
                used,
            )) => {
                // Bytes after the Hello (a sender that did not wait for the Welcome) are
                // the stream's first: kept for it.
                let mut rest = [0u8; PENDING_BUF];
                let rest_len = plain_len - used;
                rest[..rest_len].copy_from_slice(&plain[used..plain_len]);
                Step::Next(Hello {
                    version,
                    token,
                    stream,
                    streams,
                    chunk,
                    rest,
                    rest_len,
                    raw_rest,
                    raw_rest_len,
                })
            }
            Ok((Frame::Noise { .. }, _)) if !encrypted => {
                self.counts.bad_handshake += 1;
                self.refuse(poll, t, PSK_UNWANTED);
                Step::Gone
            }
            _ => {
                self.counts.bad_handshake += 1;
                self.refuse(poll, t, "not an mpcat hello");
                Step::Gone
            }
        }
    }

    /// --psk-file: answers the connection's Noise message (once), so that its keys open
    /// the Hello's record. Next when the keys are there and bytes wait to be opened.
    fn key_handshake(&mut self, poll: &mut Poll, t: Token) -> Step<()> {
        let Some(psk) = self.cfg.psk.as_ref() else {
            return Step::Next(());
        };
        let Some(c) = self.conns.get_mut(&t) else {
            return Step::Gone;
        };
        if c.chan.is_some() {
            return Step::Next(());
        }
        let State::Pending { buf, len, .. } = &mut c.state else {
            return Step::Gone;
        };
        let refused = match Frame::parse(&buf[..*len]) {
            Err(FrameError::Truncated { .. }) if *len < buf.len() => return Step::Wait,
            Ok((Frame::Noise { version, msg }, used))
                if version == frame::VERSION && msg.len() == HANDSHAKE_MSG =>
            {
                let mut reply = [0u8; HANDSHAKE_MSG];
                match psk.respond(msg, &mut reply) {
                    Ok(ch) => {
                        Frame::Noise {
                            version,
                            msg: &reply,
                        }
                        .emit_vec(&mut c.out);
                        c.chan = Some(ch);
                        buf.copy_within(used..*len, 0);
                        *len -= used;
                        if flush_out(&mut c.sock, &mut c.out, &mut c.out_pos).is_err() {
                            self.counts.bad_handshake += 1;
                            self.drop_conn(poll, t);
                            return Step::Gone;
                        }
                        return if *len == 0 {
                            Step::Wait
                        } else {
                            Step::Next(())
                        };
                    }
                    Err(None) => {
                        self.counts.wrong_key += 1;
                        WRONG_KEY.to_string()
                    }
                    Err(Some(e)) => {
                        self.counts.bad_handshake += 1;
                        e.to_string()
                    }
                }
            }
            Ok((Frame::Noise { version, .. }, _)) if version != frame::VERSION => {
                self.counts.bad_handshake += 1;
                not_spoken(version)
            }
            Ok((Frame::Hello { .. }, _)) => {
                self.counts.bad_handshake += 1;
                PSK_WANTED.to_string()
            }
            _ => {
                self.counts.bad_handshake += 1;
                "not an mpcat handshake".to_string()
            }
        };
        self.refuse(poll, t, &refused);
        Step::Gone
    }

    /// Takes a stream's Hello into the session: the first opens it, the others must carry
    /// its token, stream count and chunk size. Some(true) when this Hello began the
    /// session; None when it was refused (and counted).
    fn admit(&mut self, poll: &mut Poll, t: Token, h: &Hello) -> Option<bool> {
        let Some(s) = self.session.as_mut() else {
            return self.open_session(poll, t, h).then_some(true);
        };
        if s.token != h.token || s.verdict.is_some() {
            self.counts.wrong_token += 1;
            let why = self.why_not(&h.token);
            self.refuse(poll, t, why);
            return None;
        }
        let k = usize::from(h.stream);
        if k >= s.joined.len() || h.streams != s.streams || h.chunk != s.chunk {
            self.counts.bad_handshake += 1;
            self.refuse(
                poll,
                t,
                "stream index out of range, or another stream count or chunk size",
            );
            return None;
        }
        // The session's own token for a stream already joined: its sender saw that
        // connection fail before this side did. The new one takes its place.
        let old = s.joined[k].replace(t);
        if s.seen[k] {
            self.reconnects += 1;
        }
        s.seen[k] = true;
        if let Some(old) = old {
            let _ = self.lost(poll, old, "replaced by a new connection");
            if let Some(s) = self.session.as_mut() {
                s.joined[k] = Some(t);
            }
        }
        Some(false)
    }

    /// The session's first stream: checks what its Hello declares and opens the session
    /// (its window sized for the stream count); false when refused.
    fn open_session(&mut self, poll: &mut Poll, t: Token, h: &Hello) -> bool {
        if matches!(&self.reverse, Reverse::Parked { token: r, .. } if *r != h.token) {
            self.counts.wrong_token += 1;
            self.refuse(poll, t, BUSY);
            return false;
        }
        let ok = (1..=MAX_STREAMS).contains(&h.streams)
            && h.stream < h.streams
            && (MIN_CHUNK..=MAX_CHUNK).contains(&(h.chunk as usize));
        if !ok {
            self.counts.bad_handshake += 1;
            self.refuse(
                poll,
                t,
                "stream count, stream index or chunk size out of range",
            );
            return false;
        }
        let window = session_window(self.cfg.window, h.streams) as usize;
        let (ring, max_gaps) = super::window_parts(window, h.chunk);
        let mut joined = vec![None; usize::from(h.streams)];
        joined[usize::from(h.stream)] = Some(t);
        let mut seen = vec![false; usize::from(h.streams)];
        seen[usize::from(h.stream)] = true;
        self.session = Some(Session {
            token: h.token,
            streams: h.streams,
            chunk: h.chunk,
            reorder: Reorder::new(ring, max_gaps),
            writer: None,
            direct: Vec::new(),
            end: None,
            reading_to: 0,
            joined,
            seen,
            last_ack: 0,
            verdict: None,
            resume: if self.cfg.resume {
                super::resume::Step::Wanted
            } else {
                super::resume::Step::Off
            },
            seed: None,
        });
        self.started = Some(Instant::now());
        true
    }

    /// An admitted connection becomes a stream: its buffers (holding what came after the
    /// Hello), the Welcome with the session's window, and a first read.
    fn start_stream(&mut self, poll: &mut Poll, t: Token, h: &Hello) -> Result<(), Error> {
        let window = self
            .session
            .as_ref()
            .map_or(self.cfg.window, |s| s.reorder.window());
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(());
        };
        let chunk = h.chunk as usize;
        // Best effort: a socket without these still works, only a dead path is noticed
        // later (when the sender gives up on it).
        let _ = crate::set_path_timeout(&c.sock, self.cfg.path_timeout);
        // Room for one more record's plaintext (64 KiB) beside the longest part of a frame
        // left waiting, so a whole record always opens.
        let mut inbuf = vec![0; DATA_HDR + chunk + (64 << 10)];
        inbuf[..h.rest_len].copy_from_slice(&h.rest[..h.rest_len]);
        let mut raw = Vec::new();
        if c.chan.is_some() {
            raw = vec![0; RAW_BUF];
            raw[..h.raw_rest_len].copy_from_slice(&h.raw_rest[..h.raw_rest_len]);
        }
        let said = format!(
            "connection from {} to {}: stream {} of {}",
            c.peer, c.local, h.stream, h.streams
        );
        c.state = State::Stream {
            index: h.stream,
            inbuf,
            in_len: h.rest_len,
            bytes: 0,
            raw,
            raw_len: h.raw_rest_len,
            payload: None,
        };
        c.put(&Frame::Welcome {
            version: frame::VERSION,
            window,
        });
        let flushed = flush(c);
        self.say(&said);
        if let Err(e) = flushed {
            return self.lost(poll, t, &e.line());
        }
        // What came with the Hello, and what is still in the socket: edge-triggered, no
        // new event would say so.
        self.read(poll, t)
    }

    /// Why a Hello with `token` has no place here: another session runs (or ends), or its
    /// own is complete.
    fn why_not(&self, token: &frame::Token) -> &'static str {
        match &self.session {
            Some(s) if s.token == *token => COMPLETE,
            _ => BUSY,
        }
    }

    /// Tells a connection why it is refused (best effort) and closes it.
    pub(super) fn refuse(&mut self, poll: &mut Poll, t: Token, reason: &str) {
        if let Some(mut c) = self.drop_conn(poll, t) {
            self.say(&format!("refused {}: {reason}", c.peer));
            c.out.clear();
            c.out_pos = 0;
            c.put(&Frame::Refuse { reason });
            let _ = c.sock.write(&c.out);
        }
    }
}

/// A Hello as it arrived, with the bytes that came after it: the stream's first frames,
/// in plain (`rest`) or still sealed (`raw_rest`, --psk-file).
struct Hello {
    version: u16,
    token: frame::Token,
    stream: u16,
    streams: u16,
    chunk: u32,
    rest: [u8; PENDING_BUF],
    rest_len: usize,
    raw_rest: [u8; PENDING_BUF],
    raw_rest_len: usize,
}

/// How far a connection's handshake got with the bytes it has sent.
enum Step<T> {
    /// More bytes are needed: wait for the connection's next event.
    Wait,
    /// Refused or dropped (and counted): nothing more to do.
    Gone,
    Next(T),
}

/// Why a handshake of another version is refused.
fn not_spoken(version: u16) -> String {
    format!(
        "version {version} not spoken: this receiver speaks {}",
        frame::VERSION
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::{PSK_UNWANTED, WRONG_KEY};
    use crate::frame::{self, Frame};
    use std::io::Write;

    /// A session's first stream, then strangers of every kind: each is refused with its
    /// reason and counted, and the session ends verified all the same.
    #[test]
    fn strangers_are_refused_with_their_reason_and_counted() {
        let out = Temp::new("strangers");
        let rx = Running::start(config(&out.0));
        let mut s0 = dial(rx.addr);
        put(&mut s0, &hello(7, 0, 1, 64 << 10));
        assert!(answer(&mut s0).starts_with("Welcome"));
        let refused = |first: &[u8]| {
            let mut s = dial(rx.addr);
            s.write_all(first).unwrap();
            answer(&mut s)
        };
        let emit = |f: Frame<'_>| {
            let mut b = Vec::new();
            f.emit_vec(&mut b);
            b
        };
        let other = refused(&emit(hello(8, 0, 1, 64 << 10)));
        assert!(other.contains(super::BUSY), "{other}");
        let http = refused(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(http.contains("not an mpcat hello"), "{http}");
        let old = refused(&emit(Frame::Hello {
            version: frame::VERSION - 1,
            token: [7; 16],
            stream: 0,
            streams: 1,
            chunk: 64 << 10,
        }));
        assert!(old.contains("not spoken"), "{old}");
        let m = [0u8; crate::secure::HANDSHAKE_MSG];
        let keyed = refused(&emit(Frame::Noise {
            version: frame::VERSION,
            msg: &m,
        }));
        assert!(keyed.contains(PSK_UNWANTED), "{keyed}");
        put(
            &mut s0,
            &Frame::End {
                total: 0,
                hash: crate::stream_hash(&[]),
            },
        );
        let r = rx.report();
        assert_eq!(r.failure, None);
        assert_eq!(
            (r.connections.wrong_token, r.connections.bad_handshake),
            (1, 3)
        );
    }

    /// A Hello that arrives a byte at a time is read whole; one declaring no streams is
    /// refused.
    #[test]
    fn a_hello_in_pieces_is_welcomed_and_an_impossible_one_refused() {
        let out = Temp::new("pieces");
        let rx = Running::start(config(&out.0));
        let mut b = Vec::new();
        hello(3, 1, 0, 64 << 10).emit_vec(&mut b);
        let mut bad = dial(rx.addr);
        bad.write_all(&b).unwrap();
        let why = answer(&mut bad);
        assert!(why.contains("out of range"), "{why}");
        b.clear();
        hello(3, 0, 1, 64 << 10).emit_vec(&mut b);
        let mut s = dial(rx.addr);
        for byte in &b {
            s.write_all(std::slice::from_ref(byte)).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let w = answer(&mut s);
        assert!(w.starts_with("Welcome"), "{w}");
        put(
            &mut s,
            &Frame::End {
                total: 0,
                hash: crate::stream_hash(&[]),
            },
        );
        let r = rx.report();
        assert_eq!((r.failure, r.connections.bad_handshake), (None, 1));
    }

    /// --psk-file: a sender under another key is refused with the reason and counted as
    /// wrong_key; one under the receiver's key is welcomed.
    #[test]
    fn the_key_handshake_takes_the_right_key_and_refuses_another() {
        let out = Temp::new("psk");
        let key = crate::secure::Psk::from_bytes(b"the receiver's own key, 32 bytes").unwrap();
        let other = crate::secure::Psk::from_bytes(b"someone else's key, also 32 byte").unwrap();
        let mut cfg = config(&out.0);
        cfg.psk = Some(key.clone());
        let rx = Running::start(cfg);
        let mut scfg = crate::send::testing::config(rx.addr);
        scfg.psk = Some(other);
        let e = crate::send::connect(&scfg, 1, None, &[rx.addr], None, [5; 16], 0, None)
            .unwrap_err()
            .line();
        assert!(e.contains(WRONG_KEY), "{e}");
        scfg.psk = Some(key);
        let (_s, _, window, chan) =
            crate::send::connect(&scfg, 1, None, &[rx.addr], None, [5; 16], 0, None).unwrap();
        // The window less what its map of held ranges may take.
        assert_eq!(
            window,
            super::super::window_parts(1 << 20, 64 << 10).0 as u64
        );
        assert!(chan.is_some());
        rx.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let r = rx.report();
        assert_eq!(r.connections.wrong_key, 1);
        assert!(r.failure.unwrap().starts_with("interrupted"));
    }
}
