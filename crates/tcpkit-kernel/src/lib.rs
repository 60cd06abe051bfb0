//! The kernel's socket interfaces that more than one part speaks, written once: netlink
//! ([`netlink`]: messages, attributes, acknowledgements and the socket, for nfnetlink_queue,
//! rtnetlink and sock_diag) and AF_PACKET ([`afpacket`]: opening the socket, its options,
//! binding, mapping its ring, and what to tell a user the kernel refused).
//!
//! What each protocol carries (nfqueue's packets, a route, a socket's diag record) stays with
//! the part that uses it; this crate owns only the framing and the syscalls.

use std::io;

pub mod afpacket;
pub mod netlink;

/// A syscall that failed while a socket was being set up: which one, and the kernel's reason.
/// Callers name what the socket was for (an interface, a queue) around it.
#[derive(Debug, thiserror::Error)]
#[error("{call}")]
pub struct SysError {
    /// The syscall, with its key argument: `socket(AF_PACKET)`, `bind(AF_NETLINK)`.
    pub call: &'static str,
    /// The operating system's reason.
    #[source]
    pub source: io::Error,
}

impl SysError {
    /// The error of the syscall `call` that just failed (errno read now).
    pub(crate) fn last(call: &'static str) -> SysError {
        SysError {
            call,
            source: io::Error::last_os_error(),
        }
    }
}

impl From<SysError> for io::Error {
    /// The kernel's reason, errno kept (`raw_os_error` still answers).
    fn from(e: SysError) -> io::Error {
        e.source
    }
}

/// `rc` as a result: negative means errno holds the reason.
pub(crate) fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
