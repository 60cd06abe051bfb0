//! A joined stream's bytes: frames parsed from its connection (records opened first with
//! --psk-file), a plain data frame's payload read from the socket straight into its place in
//! the reorder window (or, in order and with nothing held, straight to the write-out), each
//! chunk checked against the session before any of it is read.

use std::io::{self, Read};

use mio::{Poll, Token};

use crate::frame::{self, Frame, FrameError, DATA_HDR};
use crate::Error;

use super::{Receiver, Session, State};

/// Bytes a stream reads before the loop writes out what is in order. Reading a fast
/// connection until its socket is empty took the whole window before a write (400 MB on a
/// veth: 18 writes of ~22 MB, the sender waiting for credit meanwhile, the bytes out of cache
/// when written and hashed); a megabyte keeps the pipeline moving and the bytes warm.
pub(super) const READ_BUDGET: u64 = 1 << 20;

/// The most a direct read takes ([`Session::direct`]): socat's buffer is 128 KiB.
pub(super) const DIRECT_BUF: usize = 256 << 10;

/// Whether a data frame of `len` bytes at `seq` may be taken: no longer than the session's
/// chunk, within the stream's total once it is known, and below the window's credit. Checked
/// before any of its payload is read.
pub(super) fn check_data(s: &Session, seq: u64, len: usize) -> Result<(), Error> {
    s.resume.data_may_come()?;
    if len > s.chunk as usize {
        return Err(Error::msg(format!(
            "a {len}-byte chunk, the session declared {}",
            s.chunk
        )));
    }
    let end = seq + len as u64;
    if let Some((total, _)) = s.end {
        if end > total {
            return Err(Error::msg(format!(
                "bytes up to {end} of a {total}-byte stream"
            )));
        }
    }
    s.reorder
        .check(seq, len as u64)
        .map_err(|e| Error::msg(e.to_string()))
}

/// How far to read a plain connection's bytes (`b`: those not yet parsed) into its frame
/// buffer: to the end of the next frame, or of its header when it is a data frame (whose
/// payload is read into the window).
pub(super) fn plain_need(b: &[u8]) -> usize {
    match Frame::parse(b) {
        Err(FrameError::Truncated { need, .. })
            if b.first() == Some(&frame::T_DATA) && b.len() < DATA_HDR =>
        {
            need.min(DATA_HDR)
        }
        Err(FrameError::Truncated { need, .. }) => need,
        _ => b.len(),
    }
}

impl Receiver<'_> {
    /// Reads what connection `t` has: its Hello while pending; a stream's frames, at most
    /// [`READ_BUDGET`] bytes of them before the loop writes out (the rest is read again
    /// after, [`Receiver::again`]).
    pub(super) fn read(&mut self, poll: &mut Poll, t: Token) -> Result<(), Error> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(());
        };
        if matches!(c.state, State::Pending { .. }) {
            return self.read_hello(poll, t);
        }
        // Edge-triggered: a read event means bytes (or the end) arrived.
        c.last_in = std::time::Instant::now();
        // Bytes that came with the Hello are parsed before anything is read.
        let mut first = true;
        let mut budget = READ_BUDGET;
        loop {
            let in_payload = matches!(
                self.conns.get(&t).map(|c| &c.state),
                Some(State::Stream {
                    payload: Some(_),
                    ..
                })
            );
            let go_on = if in_payload {
                self.read_payload(poll, t, &mut budget)?
            } else {
                self.read_frames(poll, t, std::mem::take(&mut first), &mut budget)?
            };
            if !go_on {
                return Ok(());
            }
            if budget == 0 {
                self.again.push(t);
                return Ok(());
            }
        }
    }

    /// A plain data frame's payload, from the socket straight to its place in the window (no
    /// copy through `inbuf`), or, when it is the next byte to write and nothing waits in the
    /// window, through a small buffer straight to the write-out. False when the socket is
    /// empty or the connection went.
    fn read_payload(&mut self, poll: &mut Poll, t: Token, budget: &mut u64) -> Result<bool, Error> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(false);
        };
        let State::Stream {
            index,
            inbuf,
            bytes,
            payload,
            ..
        } = &mut c.state
        else {
            return Ok(false);
        };
        let Some((start, at, end)) = payload.as_mut() else {
            return Ok(true);
        };
        let Some(s) = self.session.as_mut() else {
            return Err(Error::msg("a stream without a session"));
        };
        let peer = c.peer;
        let written = s.reorder.written();
        if let (true, true, Some(w)) = (*at == written, s.reorder.idle(), s.writer.as_mut()) {
            if w.takes_direct() {
                if s.direct.is_empty() {
                    s.direct = vec![0; DIRECT_BUF];
                }
                let k = ((*end - *at) as usize).min(DIRECT_BUF);
                let n = match c.sock.read(&mut s.direct[..k]) {
                    Ok(0) => return self.lost(poll, t, "closed").map(|()| false),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
                    Err(e) => return self.lost(poll, t, &format!("failed ({e})")).map(|()| false),
                };
                w.direct(&s.direct[..n])?;
                s.reorder.skip(n as u64);
                *at += n as u64;
                *bytes += n as u64;
                *budget = budget.saturating_sub(n as u64);
                if *at == *end {
                    *payload = None;
                }
                return Ok(true);
            }
        }
        let into = if *at < written {
            // Written out already (another copy came first): read past it.
            let k = ((written.min(*end) - *at) as usize).min(inbuf.len());
            &mut inbuf[..k]
        } else {
            s.reorder.slot(*at, (*end - *at) as usize)
        };
        match c.sock.read(into) {
            Ok(0) => return self.lost(poll, t, "closed").map(|()| false),
            Ok(n) => {
                *at += n as u64;
                *bytes += n as u64;
                *budget = budget.saturating_sub(n as u64);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return self.lost(poll, t, &format!("failed ({e})")).map(|()| false),
        }
        if *at == *end {
            let (seq, len) = (*start, *end - *start);
            *payload = None;
            s.reorder
                .commit(seq, len)
                .map_err(|e| Error::of(format!("stream {index} ({peer})"), e))?;
        }
        Ok(true)
    }

    /// Reads the stream's next bytes (unless `first` and bytes that came with the Hello
    /// wait) into `inbuf`, or `raw` with --psk-file, and takes the frames that are whole.
    /// False when the socket is empty or the connection went.
    fn read_frames(
        &mut self,
        poll: &mut Poll,
        t: Token,
        first: bool,
        budget: &mut u64,
    ) -> Result<bool, Error> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(false);
        };
        let State::Stream {
            index,
            inbuf,
            in_len,
            raw,
            raw_len,
            ..
        } = &mut c.state
        else {
            return Ok(false);
        };
        if !(first && (*in_len > 0 || *raw_len > 0)) {
            let into = match c.chan {
                Some(_) => &mut raw[*raw_len..],
                // Plain: no further than the next frame, and for a data frame no further
                // than its header, so its payload can be read into the window.
                None => {
                    let want = plain_need(&inbuf[..*in_len]).min(inbuf.len());
                    if want <= *in_len {
                        return Err(Error::msg(format!(
                            "stream {index} ({}): a frame longer than this session's chunk size allows",
                            c.peer
                        )));
                    }
                    &mut inbuf[*in_len..want]
                }
            };
            match c.sock.read(into) {
                Ok(0) => return self.lost(poll, t, "closed").map(|()| false),
                Ok(n) if c.chan.is_some() => {
                    *raw_len += n;
                    *budget = budget.saturating_sub(n as u64);
                }
                Ok(n) => *in_len += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
                Err(e) => return self.lost(poll, t, &format!("failed ({e})")).map(|()| false),
            }
        }
        self.take_frames(poll, t)
    }

    /// Opens the records that are whole (--psk-file) and takes the frames in `inbuf`, until
    /// none is left to open: after a round `inbuf` has room for a whole record, so `raw`
    /// never fills. A plain data frame cut after its header goes on as a payload read into
    /// the window. False when the connection went.
    fn take_frames(&mut self, poll: &mut Poll, t: Token) -> Result<bool, Error> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(false);
        };
        let State::Stream {
            index,
            inbuf,
            in_len,
            bytes,
            raw,
            raw_len,
            payload,
        } = &mut c.state
        else {
            return Ok(false);
        };
        let Some(s) = self.session.as_mut() else {
            return Err(Error::msg("a stream without a session"));
        };
        let peer = c.peer;
        let on = |e: FrameError| Error::of(format!("stream {index} ({peer})"), e);
        loop {
            let mut opened = 0;
            if let Some(ch) = c.chan.as_mut() {
                match ch.open(&raw[..*raw_len], inbuf, in_len) {
                    Ok(n) => opened = n,
                    // Someone on the path, not the sender: this connection goes, the
                    // sender re-sends its chunks on the others.
                    Err(e) => return self.lost(poll, t, &e.to_string()).map(|()| false),
                }
                raw.copy_within(opened..*raw_len, 0);
                *raw_len -= opened;
            }
            let mut at = 0;
            loop {
                match Frame::parse(&inbuf[at..*in_len]) {
                    Ok((f, used)) => {
                        at += used;
                        take_frame(s, f, *index, peer, bytes)?;
                    }
                    Err(FrameError::Truncated { .. }) => {
                        // Plain: the rest of the payload is read straight into the window.
                        let head = frame::data_header_of(&inbuf[at..*in_len]);
                        if let (None, Some((seq, len))) = (&c.chan, head) {
                            check_data(s, seq, len)
                                .map_err(|e| Error::of(format!("stream {index} ({peer})"), e))?;
                            let have = &inbuf[at + DATA_HDR..*in_len];
                            s.reorder.put(seq, have);
                            *bytes += have.len() as u64;
                            let next = seq + have.len() as u64;
                            *payload = Some((seq, next, seq + len as u64));
                            s.reading_to = s.reading_to.max(seq + len as u64);
                            at = *in_len;
                        }
                        break;
                    }
                    Err(e) => return Err(on(e)),
                }
            }
            inbuf.copy_within(at..*in_len, 0);
            *in_len -= at;
            if opened == 0 {
                return Ok(true);
            }
        }
    }
}

/// One whole frame from the sender on stream `index`: a chunk into the window, the end
/// (its length and hash), or the sender giving up; a frame only a receiver sends is an
/// error, as is a second, different end or one that says less than already arrived.
fn take_frame(
    s: &mut Session,
    f: Frame<'_>,
    index: u16,
    peer: std::net::SocketAddr,
    bytes: &mut u64,
) -> Result<(), Error> {
    let at = || format!("stream {index} ({peer})");
    match f {
        Frame::Data { seq, payload } => {
            check_data(s, seq, payload.len()).map_err(|e| Error::of(at(), e))?;
            s.reorder
                .insert(seq, payload)
                .map_err(|e| Error::of(at(), e))?;
            *bytes += payload.len() as u64;
        }
        Frame::End { total, hash } => {
            if s.end.is_some_and(|e| e != (total, hash)) {
                return Err(Error::msg(format!(
                    "{}: a second, different end frame",
                    at()
                )));
            }
            // Bytes held out of order count as much as those written: an end below them
            // would leave the session waiting for a total it has already passed.
            let arrived = s.reorder.highest().max(s.reading_to);
            if total < arrived {
                return Err(Error::msg(format!(
                    "{}: the end says {total} bytes, {arrived} already arrived",
                    at(),
                )));
            }
            s.end = Some((total, hash));
        }
        Frame::Refuse { reason } => {
            return Err(Error::msg(format!("the sender gave up: {reason}")));
        }
        Frame::Abort { reason } => {
            return Err(Error::msg(format!(
                "the sender aborted the session: {reason}"
            )));
        }
        Frame::Resume { size, mtime_ns } => {
            let begun = s.reorder.highest() > 0 || s.reading_to > 0 || s.writer.is_some();
            s.resume
                .ask(index, crate::resume::Source { size, mtime_ns }, begun)?;
        }
        other => {
            return Err(Error::msg(format!(
                "{}: the sender sent a frame only a receiver sends: {other:?}",
                at()
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use std::io::Write;

    #[test]
    fn a_plain_read_stops_at_a_data_frames_header_or_a_control_frames_end() {
        let hdr = frame::data_header(0, 5000);
        // The frame header first; then for a data frame its header only (the payload goes
        // to the window).
        assert_eq!(plain_need(&hdr[..1]), frame::FRAME_HDR);
        assert_eq!(plain_need(&hdr[..frame::FRAME_HDR]), DATA_HDR);
        assert_eq!(plain_need(&hdr[..DATA_HDR - 1]), DATA_HDR);
        let mut end = Vec::new();
        Frame::End {
            total: 9,
            hash: [1; 16],
        }
        .emit_vec(&mut end);
        // A control frame: to its end; a whole one is all there is to read.
        assert_eq!(plain_need(&end[..3]), frame::FRAME_HDR);
        assert_eq!(plain_need(&end[..frame::FRAME_HDR]), end.len());
        assert_eq!(plain_need(&end), end.len());
    }

    /// The Hello, the stream's frames and its end in one write: what came with the Hello is
    /// the stream's first bytes, taken before anything more is read.
    #[test]
    fn bytes_that_come_with_the_hello_are_the_streams_first() {
        let out = Temp::new("with-hello");
        let rx = Running::start(config(&out.0));
        let stream = pattern(5000, 9);
        let mut all = Vec::new();
        hello(4, 0, 1, 4096).emit_vec(&mut all);
        all.extend_from_slice(&frame::data_header(0, 4096));
        all.extend_from_slice(&stream[..4096]);
        all.extend_from_slice(&frame::data_header(4096, 904));
        all.extend_from_slice(&stream[4096..]);
        Frame::End {
            total: 5000,
            hash: crate::stream_hash(&stream),
        }
        .emit_vec(&mut all);
        let mut s = dial(rx.addr);
        s.write_all(&all).unwrap();
        let mut ok = None;
        until(&mut s, &mut |f| match f {
            Frame::Done { ok: v, .. } => {
                ok = Some(v);
                true
            }
            _ => false,
        });
        assert_eq!(ok, Some(true));
        let r = rx.report();
        assert_eq!((r.failure, r.bytes), (None, 5000));
        assert_eq!(std::fs::read(&out.0).unwrap(), stream);
    }

    /// A chunk longer than the Hello declared fails the session before any of it is read,
    /// naming the stream and both sizes.
    #[test]
    fn a_chunk_longer_than_declared_fails_the_session_naming_the_stream() {
        let out = Temp::new("long-chunk");
        let rx = Running::start(config(&out.0));
        let mut s = dial(rx.addr);
        put(&mut s, &hello(4, 0, 1, 1024));
        assert!(answer(&mut s).starts_with("Welcome"));
        let me = s.local_addr().unwrap();
        data(&mut s, 0, &pattern(2048, 0));
        let r = rx.report();
        assert_eq!(
            r.failure.as_deref(),
            Some(&*format!(
                "stream 0 ({me}): a 2048-byte chunk, the session declared 1024"
            ))
        );
    }
}
