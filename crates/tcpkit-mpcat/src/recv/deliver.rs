//! What the receiver does with bytes in order: hands them to the write-out (inline, or its
//! thread), returns credit to the sender as acks once enough is written, and at the end
//! checks the stream's length and hash and sends the verdict on every stream.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Poll};

use crate::frame::Frame;
use crate::writeout::{Done, Writer};
use crate::{Error, Output};

use super::{flush, Receiver, State};

/// Unwritten acks a connection may hold before its sender counts as not reading them.
pub(super) const MAX_ACK_BACKLOG: usize = 4096;

/// Where the stream's bytes are written.
pub(crate) struct Sink {
    pub(crate) w: File,
    pub(crate) name: String,
}

impl Sink {
    /// Closes the output (the peer's stream is whole and verified) while the session goes on
    /// for the reverse stream, so whatever reads it sees EOF now: stdout's descriptor is
    /// pointed at /dev/null, a file closed.
    pub(super) fn close(&mut self) {
        let Ok(null) = File::options().write(true).open("/dev/null") else {
            return;
        };
        if self.name == "stdout" {
            use std::os::fd::AsRawFd;
            // SAFETY: dup2 onto fd 1 of a descriptor we own; nothing else holds fd 1 open
            // as an object (the sink's own copy is replaced just below).
            unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
        }
        self.w = null;
    }
}

impl Sink {
    /// Where the next byte goes when the output is a regular file (-o FILE, or stdout
    /// redirected to one); None for a pipe, a terminal or a device, whose bytes cannot be
    /// taken back.
    pub(super) fn position(&mut self) -> Option<u64> {
        use std::io::Seek;
        if !self.w.metadata().is_ok_and(|m| m.is_file()) {
            return None;
        }
        self.w.stream_position().ok()
    }

    /// Cuts the output back to `at` bytes (a session that was not verified) and goes on
    /// writing from there.
    pub(super) fn cut_back(&mut self, at: u64) -> Result<(), Error> {
        use std::io::{Seek, SeekFrom};
        self.w
            .set_len(at)
            .and_then(|()| self.w.seek(SeekFrom::Start(at)).map(|_| ()))
            .map_err(|e| {
                Error::io(
                    format!("cut the failed session off {} at byte {at}", self.name),
                    e,
                )
            })
    }
}

/// Opens the output: a file is created (truncated, unless `keep`: --resume goes on from
/// what it holds).
pub(crate) fn open_output(o: &Output, keep: bool) -> Result<Sink, Error> {
    match o {
        Output::Stdout => {
            let fd = io::stdout()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| Error::io("dup stdout", e))?;
            Ok(Sink {
                w: File::from(fd),
                name: "stdout".into(),
            })
        }
        Output::File(p) => File::options()
            .write(true)
            .read(keep)
            .create(true)
            .truncate(!keep)
            .open(p)
            .map(|w| Sink {
                w,
                name: p.display().to_string(),
            })
            .map_err(|e| Error::io(format!("create {}", p.display()), e)),
    }
}

impl Receiver<'_> {
    /// Hands the bytes that are in order to the write-out, and acks what it has written
    /// when enough has gone out.
    pub(super) fn write_out(&mut self, poll: &mut Poll, sink: &mut Sink) -> Result<(), Error> {
        let Some(s) = self.session.as_mut() else {
            return Ok(());
        };
        while let Some(p) = s.reorder.hand_out() {
            if s.writer.is_none() {
                let out = sink
                    .w
                    .try_clone()
                    .map_err(|e| Error::io(format!("dup the output ({})", sink.name), e))?;
                // --resume: the held part was hashed as the answer was made.
                let hasher = s.seed.take().unwrap_or_default();
                let w = if s.streams == 1 && out.metadata().is_ok_and(|m| m.is_file()) {
                    Writer::inline(out, &sink.name, hasher)
                } else {
                    Writer::start(out, Arc::clone(&self.waker), hasher)
                        .map_err(|e| Error::io("start the write-out thread", e))?
                };
                s.writer = Some(w);
            }
            if let Some(w) = &mut s.writer {
                if !w.write(p) {
                    break;
                }
            }
        }
        while let Some(d) = s.writer.as_mut().and_then(Writer::poll) {
            match d {
                Done::Wrote(n) => s.reorder.release(n),
                Done::Failed(e) => return Err(Error::io(format!("write {}", sink.name), e)),
                Done::Hash(_) => {}
            }
        }
        let written = s.reorder.released();
        let complete = s.end.is_some_and(|e| e.0 == written);
        // Every MiB (or eighth of a small window): credit returns soon, and the sender's live
        // line and its acknowledged count move smoothly. Acks are a few bytes per stream.
        let every = (s.reorder.window() / 8).min(1 << 20);
        if written - s.last_ack >= every || (complete && written > s.last_ack) {
            s.last_ack = written;
            let ack = Frame::Ack {
                acked: written,
                limit: s.reorder.limit(),
            };
            let mut failed = Vec::new();
            for (t, c) in self.conns.iter_mut() {
                if !matches!(c.state, State::Stream { .. }) {
                    continue;
                }
                if c.out_pos == 0 && c.chan.is_none() {
                    // An unwritten older ack says less than this one. (A sealed one stays:
                    // the sender's nonces count every record.)
                    c.out.clear();
                }
                c.put(&ack);
                if c.out.len() > MAX_ACK_BACKLOG {
                    failed.push((
                        *t,
                        "its sender stopped reading acknowledgements".to_string(),
                    ));
                } else if let Err(e) = flush(c) {
                    failed.push((*t, e.line()));
                }
            }
            for (t, why) in failed {
                self.lost(poll, t, &why)?;
            }
        }
        Ok(())
    }

    /// Once every byte is written: checks the hash, sends the verdict on every stream, and
    /// waits (at most 2 s) for it to leave. True when the session is over.
    pub(super) fn finish(&mut self, poll: &mut Poll, sink: &mut Sink) -> Result<bool, Error> {
        let Some(s) = self.session.as_mut() else {
            return Ok(false);
        };
        let Some((total, hash)) = s.end else {
            return Ok(false);
        };
        if s.reorder.released() != total {
            return Ok(false);
        }
        // Every byte is written (released); the write-out's flush and hash, and its
        // descriptor closed, before the output may be closed for the reverse stream.
        let got = match s.writer.take() {
            Some(mut w) => w.finish(),
            // Nothing was ever handed out: an empty stream, or (--resume) one the receiver
            // held whole.
            None => sink
                .w
                .flush()
                .map(|()| s.seed.take().unwrap_or_default().finish()),
        };
        let got = got.map_err(|e| Error::io(format!("write {}", sink.name), e))?;
        let ok = got == hash;
        s.verdict = Some(ok);
        let done = Frame::Done { total, ok };
        for c in self.conns.values_mut() {
            if matches!(c.state, State::Stream { .. }) {
                c.put(&done);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut events = Events::with_capacity(64);
        loop {
            let mut left = false;
            for c in self.conns.values_mut() {
                if matches!(c.state, State::Stream { .. })
                    && flush(c).is_ok()
                    && c.out_pos < c.out.len()
                {
                    left = true;
                }
            }
            if !left || Instant::now() >= deadline {
                break;
            }
            let _ = poll.poll(&mut events, Some(Duration::from_millis(20)));
        }
        if !ok {
            return Err(Error::msg(format!(
                "the stream's hash does not match the sender's: {total} bytes arrived corrupted"
            )));
        }
        if let (true, Output::File(p)) = (self.cfg.resume, &self.cfg.output) {
            // Whole and verified: nothing is left to resume.
            let _ = std::fs::remove_file(crate::resume::state_path(p));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn an_output_that_cannot_be_created_is_said_with_its_path() {
        let e = open_output(&Output::File("/nonexistent-dir/out.bin".into()), false)
            .err()
            .unwrap()
            .line();
        assert!(
            e.starts_with("create /nonexistent-dir/out.bin: No such file"),
            "{e}"
        );
    }

    /// Credit returns as bytes are written (the acknowledged offset and a window beyond
    /// it), and a stream whose hash differs is told so (done, not ok) and fails the receiver.
    #[test]
    fn acks_return_credit_and_a_wrong_hash_is_told_to_the_sender() {
        let out = Temp::new("acks");
        let rx = Running::start(config(&out.0));
        let mut s = dial(rx.addr);
        put(&mut s, &hello(2, 0, 1, 64 << 10));
        assert!(answer(&mut s).starts_with("Welcome"));
        let stream = pattern(512 << 10, 3);
        for (k, piece) in stream.chunks(64 << 10).enumerate() {
            data(&mut s, (k * (64 << 10)) as u64, piece);
        }
        let mut acks = Vec::new();
        until(&mut s, &mut |f| match f {
            Frame::Ack { acked, limit } => {
                acks.push((acked, limit));
                acked == stream.len() as u64
            }
            _ => false,
        });
        let (acked, limit) = *acks.last().unwrap();
        assert_eq!(acked, 512 << 10, "{acks:?}");
        let ring = super::super::window_parts(1 << 20, 64 << 10).0 as u64;
        assert_eq!(limit, acked + ring, "the window's credit beyond it");
        assert!(acks.windows(2).all(|w| w[0] <= w[1]), "{acks:?}");
        put(
            &mut s,
            &Frame::End {
                total: stream.len() as u64,
                hash: [0; 16],
            },
        );
        let mut done = None;
        until(&mut s, &mut |f| match f {
            Frame::Done { total, ok } => {
                done = Some((total, ok));
                true
            }
            _ => false,
        });
        assert_eq!(done, Some((512 << 10, false)));
        let r = rx.report();
        assert_eq!(
            r.failure.as_deref(),
            Some("the stream's hash does not match the sender's: 524288 bytes arrived corrupted")
        );
        // What arrived was written all the same.
        assert_eq!(std::fs::read(&out.0).unwrap(), stream);
    }
}
