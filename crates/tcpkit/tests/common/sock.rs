//! Reads that outlast a signal: shared by `common` and `copy_common`.
//!
//! A read on a socket with a receive timeout (SO_RCVTIMEO) is never restarted (socket(7)): a
//! signal, or the test process stopped and continued, ends it with EINTR, even with no handler
//! installed. std's `read_exact`, `read_to_end` and `read_line` go on after EINTR; a bare
//! `read` does not, and a test took it for a closed or broken peer (intercept_hostile failed
//! once so: "no close within 10s: Interrupted system call after 0 bytes").

use std::io::{self, ErrorKind, Read};

/// `r.read(b)`, read again after EINTR (each try waits the socket's whole timeout again).
pub fn read_some<R: Read + ?Sized>(r: &mut R, b: &mut [u8]) -> io::Result<usize> {
    no_eintr(|| r.read(b))
}

/// `f()` (a socket call: a UDP `recv`, say), called again after EINTR.
pub fn no_eintr<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}
