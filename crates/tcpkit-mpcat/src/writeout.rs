//! The receiver's write-out: a thread that writes the pieces handed out of the reorder
//! window to the output and hashes them, while the event loop goes on reading the sockets.
//!
//! On one loop, every byte was read from its socket, copied into the page cache and hashed
//! before the next read: the loop was the one thread that never waited (a dozen voluntary
//! switches in a 400 MB transfer), so on a shared machine the transfer ran at whatever share
//! of a CPU that one thread got. Split, the sockets are read while the last megabyte is
//! written, as the kernel's receive buffer lets socat's reads and writes overlap.

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
}

impl Writer {
    /// Starts writing to `out` (a descriptor of its own, closed when the writer ends);
    /// `waker` wakes the loop each time something is done.
    pub(crate) fn start(out: File, waker: Arc<Waker>) -> std::io::Result<Writer> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("mpcat-write".into())
            .spawn(move || write_out(out, &rx, &tx, &waker))?;
        Ok(Writer {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Queues a piece; false when the writer has stopped (it said why in a [`Done`]).
    pub(crate) fn write(&self, p: Piece) -> bool {
        self.jobs
            .as_ref()
            .is_some_and(|j| j.send(Job::Piece(p)).is_ok())
    }

    /// What the writer has done since last asked, without waiting.
    pub(crate) fn poll(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }

    /// Waits until everything queued is written and flushed: the stream's hash, or why not.
    /// The writer is gone afterwards (its descriptor closed).
    pub(crate) fn finish(&mut self) -> Result<crate::Digest, std::io::Error> {
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

fn write_out(mut out: File, jobs: &Receiver<Job>, done: &Sender<Done>, waker: &Waker) {
    let mut hasher = crate::StreamHasher::new();
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
