//! The receiver's write-out: a thread that writes the pieces handed out of the reorder
//! window to the output and hashes them, while the event loop goes on reading the sockets.
//!
//! On one loop, every byte was read from its socket, copied into the page cache and hashed
//! before the next read: the loop was the one thread that never waited (a dozen voluntary
//! switches in a 400 MB transfer), so on a shared machine the transfer ran at whatever share
//! of a CPU that one thread got. Split, the sockets are read while the last megabyte is
//! written, as the kernel's receive buffer lets socat's reads and writes overlap.
//!
//! One stream into a regular file is written on the loop's own thread instead
//! ([`Writer::inline`]): a payload that arrives in order is read into a small buffer and
//! written from it at once, as socat does, while it is still in this CPU's cache. Through the
//! thread, each byte was received into the ring on one CPU and read out of it on the other,
//! and both copies cost about twice socat's (perf: the socket read 14 % and the page-cache
//! write 30 % of the receiver's samples, socat's 8 % and 18 %). The write-out thread stays
//! where a write can block for long (a pipe, a terminal) or streams arrive out of order.

use std::fs::File;
use std::io::Write;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::Waker;

use crate::reorder::Piece;

enum Job {
    Piece(Piece),
    /// Flush, and say the hash of everything written.
    Finish,
}

/// What the write-out tells the loop.
#[derive(Debug)]
pub(crate) enum Done {
    /// These many more bytes are written (their place in the ring is free).
    Wrote(u64),
    /// The hash of the whole stream, after a flush.
    Hash(crate::Digest),
    /// Writing failed: the OS error. Nothing is written after it.
    Failed(std::io::Error),
}

pub(crate) struct Writer {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    /// Written by the caller's own thread instead ([`Writer::inline`]).
    inline: Option<Inline>,
}

/// The write-out done in the loop's thread: the output, the hash so far, and what is done
/// but not yet polled.
struct Inline {
    out: File,
    /// The output's name, for the error of a direct write.
    name: String,
    hasher: crate::StreamHasher,
    done: std::collections::VecDeque<Done>,
    failed: bool,
}

impl Writer {
    /// Writes each piece at once, on the caller's thread, while its bytes are still in this
    /// CPU's cache from the socket read: for one stream into a regular file, where a write
    /// takes no longer than the page cache's copy (or the kernel's dirty-page throttling).
    /// `hasher` has taken what the output held before (--resume), else nothing.
    pub(crate) fn inline(out: File, name: &str, hasher: crate::StreamHasher) -> Writer {
        let (_, done) = mpsc::channel();
        Writer {
            jobs: None,
            done,
            thread: None,
            inline: Some(Inline {
                out,
                name: name.to_string(),
                hasher,
                done: std::collections::VecDeque::new(),
                failed: false,
            }),
        }
    }

    /// Starts writing to `out` (a descriptor of its own, closed when the writer ends);
    /// `waker` wakes the loop each time something is done.
    pub(crate) fn start(
        out: File,
        waker: Arc<Waker>,
        hasher: crate::StreamHasher,
    ) -> std::io::Result<Writer> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("mpcat-write".into())
            .spawn(move || write_out(out, hasher, &rx, &tx, &waker))?;
        Ok(Writer {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            inline: None,
        })
    }

    /// Whether bytes may be written with [`Writer::direct`]: inline, nothing failed.
    pub(crate) fn takes_direct(&self) -> bool {
        self.inline.as_ref().is_some_and(|w| !w.failed)
    }

    /// Writes and hashes `b` at once (inline only: the bytes that follow everything written
    /// so far, never in the ring); the error names the output.
    pub(crate) fn direct(&mut self, b: &[u8]) -> Result<(), crate::Error> {
        let Some(w) = self.inline.as_mut() else {
            return Err(crate::Error::msg("a direct write without an inline writer"));
        };
        if let Err(e) = w.out.write_all(b) {
            w.failed = true;
            return Err(crate::Error::io(format!("write {}", w.name), e));
        }
        w.hasher.update(b);
        Ok(())
    }

    /// Queues a piece; false when the writer has stopped (it said why in a [`Done`]).
    pub(crate) fn write(&mut self, p: Piece) -> bool {
        if let Some(w) = self.inline.as_mut() {
            if w.failed {
                return false;
            }
            let b = p.bytes();
            match w.out.write_all(b) {
                Ok(()) => {
                    w.hasher.update(b);
                    w.done.push_back(Done::Wrote(b.len() as u64));
                }
                Err(e) => {
                    w.failed = true;
                    w.done.push_back(Done::Failed(e));
                }
            }
            return !w.failed;
        }
        self.jobs
            .as_ref()
            .is_some_and(|j| j.send(Job::Piece(p)).is_ok())
    }

    /// What the writer has done since last asked, without waiting.
    pub(crate) fn poll(&mut self) -> Option<Done> {
        if let Some(w) = self.inline.as_mut() {
            return w.done.pop_front();
        }
        self.done.try_recv().ok()
    }

    /// Waits until everything queued is written and flushed: the stream's hash, or why not.
    /// The writer is gone afterwards (its descriptor closed).
    pub(crate) fn finish(&mut self) -> Result<crate::Digest, std::io::Error> {
        if let Some(mut w) = self.inline.take() {
            if let Some(Done::Failed(e)) = w.done.into_iter().find(|d| matches!(d, Done::Failed(_)))
            {
                return Err(e);
            }
            w.out.flush()?;
            return Ok(w.hasher.finish());
        }
        if let Some(j) = self.jobs.take() {
            let _ = j.send(Job::Finish);
        }
        let r = loop {
            match self.done.recv() {
                Ok(Done::Wrote(_)) => {}
                Ok(Done::Hash(h)) => break Ok(h),
                Ok(Done::Failed(e)) => break Err(e),
                Err(_) => break Err(std::io::Error::other("the write-out thread ended")),
            }
        };
        self.join();
        r
    }

    /// Lets the writer write what is queued and end; the bytes written since last asked.
    pub(crate) fn close(&mut self) -> u64 {
        self.join();
        let mut n = 0;
        if let Some(w) = self.inline.take() {
            for d in w.done {
                if let Done::Wrote(k) = d {
                    n += k;
                }
            }
        }
        while let Ok(d) = self.done.try_recv() {
            if let Done::Wrote(k) = d {
                n += k;
            }
        }
        n
    }

    fn join(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    /// Whatever was queued is still written (it is the stream's in-order part), then the
    /// thread ends.
    fn drop(&mut self) {
        self.join();
    }
}

fn write_out(
    mut out: File,
    mut hasher: crate::StreamHasher,
    jobs: &Receiver<Job>,
    done: &Sender<Done>,
    waker: &Waker,
) {
    let say = |d: Done| {
        let _ = done.send(d);
        let _ = waker.wake();
    };
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Piece(p) => {
                let b = p.bytes();
                if let Err(e) = out.write_all(b) {
                    say(Done::Failed(e));
                    return;
                }
                hasher.update(b);
                let n = b.len() as u64;
                // The piece's place in the ring goes back only now that it is dropped.
                drop(p);
                say(Done::Wrote(n));
            }
            Job::Finish => {
                match out.flush() {
                    Ok(()) => say(Done::Hash(hasher.finish())),
                    Err(e) => say(Done::Failed(e)),
                }
                return;
            }
        }
    }
}
