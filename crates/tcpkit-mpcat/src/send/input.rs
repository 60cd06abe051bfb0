//! The sender's input: opening it, reading it chunk by chunk and hashing it as it goes (on
//! the reader thread for a pipe or stdin, on the loop for a regular file), and the chunks
//! themselves: where their bytes lie (a reused buffer, or the file) and when a buffer goes
//! back to be read into again.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;

use crate::bufpool::{self, Buf};
use crate::{Error, Input};

/// A buffer of the input as the reader read it (the largest chunk's size); chunks are cut
/// from it as connections take them. It goes back to the reader when its last chunk is
/// acknowledged (dropped), so buffers are reused, never allocated per chunk.
#[derive(Debug)]
pub(super) struct Block {
    /// None only once dropped.
    pub(super) buf: Option<Buf>,
    pub(super) back: mpsc::Sender<Buf>,
}

impl Block {
    pub(super) fn bytes(&self) -> &[u8] {
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
pub(super) enum Src {
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
pub(super) struct Chunk {
    pub(super) seq: u64,
    pub(super) src: Src,
    pub(super) off: usize,
    pub(super) len: usize,
    /// The connection it was last handed to.
    pub(super) conn: usize,
}

impl Chunk {
    pub(super) fn end(&self) -> u64 {
        self.seq + self.len as u64
    }

    /// Its bytes: borrowed from the block, or read from the file into `scratch`.
    pub(super) fn bytes<'a>(&'a self, scratch: &'a mut Vec<u8>) -> io::Result<&'a [u8]> {
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
    pub(super) fn split(&mut self, n: usize) -> Chunk {
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

/// What the reader thread hands the loop.
#[derive(Debug)]
pub(super) enum FromReader {
    Chunk(Chunk),
    /// The input's end, or (`cut`) where --duration stopped reading it.
    End {
        total: u64,
        hash: crate::Digest,
        cut: bool,
    },
    Failed(Error),
}

/// Why a file chunk could not be read: the input file ended before `end` (it shrank under
/// the sender), which no other path can mend.
pub(super) fn shrank(e: io::Error, end: u64) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the input file ended before byte {end}: it shrank while being sent"),
        )
    } else {
        e
    }
}

/// The opened input: what to read it from; a regular file's second descriptor, which its
/// chunks are sent from with sendfile or read from again for a re-send ([`Src::File`]); a
/// regular file's length when it was opened.
pub(super) struct Opened {
    pub(super) read: Box<dyn Read + Send>,
    /// `read`'s descriptor (--duration waits on it).
    pub(super) fd: std::os::fd::RawFd,
    pub(super) file: Option<Arc<File>>,
    pub(super) len: Option<u64>,
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
pub(super) fn open_input(input: &Input) -> Result<Opened, Error> {
    match input {
        Input::Stdin => Ok(Opened {
            read: Box::new(io::stdin()),
            fd: 0,
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
                fd: f.as_raw_fd(),
                read: Box::new(f),
                file,
                len: regular.then_some(meta.len()),
            })
        }
    }
}

/// The input's descriptor when it is stdin and not a regular file or a block device (a pipe,
/// a terminal, a socket): there a read returns what has arrived, and what has arrived goes
/// out without waiting for a whole chunk, so lines typed to a shell on the other side reach it
/// as `nc` sends them. Files and disks always fill their chunks.
pub(super) fn live_input(input: &Input) -> Option<std::os::fd::RawFd> {
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
pub(super) fn readable_now(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// Whether `fd` has something to read (or its end) before `until`, waiting for it until then;
/// false once `until` has come.
pub(super) fn readable_before(fd: std::os::fd::RawFd, until: Instant) -> bool {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // Whole milliseconds, rounded up: a wait cut short comes round again.
        let ms = left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            0 => {}
            n if n > 0 => return true,
            // Interrupted: look at the time again. Anything else the read will say.
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return true,
        }
    }
}

/// The input read chunk by chunk and hashed as it goes: on the reader thread ([`reader`]), or
/// for a regular file on the loop itself ([`Source::Inline`]).
pub(super) struct Feed {
    pub(super) input: Box<dyn Read + Send>,
    /// -Z, and the input is this regular file: one buffer serves every read (it is only
    /// hashed) and each chunk names the file's bytes ([`Src::File`]).
    pub(super) file: Option<Arc<File>>,
    /// A regular file's length when it was opened: ending before it, the file shrank under
    /// us, and the stream fails rather than end short and verified (growing is fine, as cat).
    pub(super) opened_len: Option<u64>,
    /// See [`live_input`]: a piece ends early when nothing more has arrived.
    pub(super) live: Option<std::os::fd::RawFd>,
    /// --duration: when reading stops, and the input's descriptor to wait on until then
    /// (a pipe's read would block past it); the stream then ends with what was read.
    pub(super) until: Option<(Instant, std::os::fd::RawFd)>,
    pub(super) chunk: usize,
    pub(super) size: Option<u64>,
    pub(super) hasher: crate::StreamHasher,
    pub(super) seq: u64,
    pub(super) back_tx: mpsc::Sender<Buf>,
    /// The buffer reused for a file's reads.
    pub(super) own: Option<Buf>,
}

impl Feed {
    /// Reads the next chunk into `buf` and queues what the loop is to get: the chunk, and the
    /// end after it at EOF, or why reading failed. False once nothing more will come. The
    /// buffer goes into the chunk's block, or back to `own` for a file.
    pub(super) fn fill(&mut self, mut buf: Buf, out: &mut VecDeque<FromReader>) -> bool {
        buf.set_len(buf.capacity());
        let chunk = self.chunk.min(buf.len());
        let mut got = 0;
        let mut eof = false;
        let mut cut = false;
        while got < chunk {
            if let Some((t, fd)) = self.until {
                if !readable_before(fd, t) {
                    cut = true;
                    break;
                }
            }
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
                // Both lengths: the whole of a regular file's, else as much as is known.
                let is = match self.opened_len {
                    Some(len) => format!("{len} bytes long"),
                    None => format!("at least {read} bytes long"),
                };
                out.push_back(FromReader::Failed(Error::msg(format!(
                    "the input is {is}, --size says {want}"
                ))));
                return false;
            }
            Some(want) if eof && !cut && read != want => {
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
        if eof || cut {
            let hasher = std::mem::take(&mut self.hasher);
            out.push_back(FromReader::End {
                total: self.seq,
                hash: hasher.finish(),
                cut,
            });
            return false;
        }
        true
    }
}

/// Runs `feed` on its own thread, into buffers from the pool (at most `pool` of them exist,
/// so the input is read no further ahead than the window).
pub(super) fn reader(
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
pub(super) enum Source {
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
    pub(super) fn try_next(&mut self) -> Result<FromReader, TryRecvError> {
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

/// A chunk written whole to its socket, kept until the receiver has it: a copied chunk of a
/// regular file names its bytes in the file from now on, and its buffer goes back to be read
/// into again. Kept, the buffers were the bytes in flight (megabytes on a fast path), fresh
/// ones page-faulted and zeroed as the flight grew: on one veth one run in three spent 5-10 %
/// of the CPU's samples in clear_page_erms and ran at 700-1200 MB/s against 1700-1900.
pub(super) fn written(mut ch: Chunk, file: Option<&Arc<File>>) -> Chunk {
    if let (Src::Mem(_), Some(f)) = (&ch.src, file) {
        ch.src = Src::File(Arc::clone(f));
        ch.off = ch.seq as usize;
    }
    ch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::send::TempFile;
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
}
