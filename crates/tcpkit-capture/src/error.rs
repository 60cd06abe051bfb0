//! The error type of this crate: one line naming the interface (or filter expression, or
//! option) and the syscall or reason.
//!
//! As in tcpkit-send, the `io::Error` of a failed syscall is the `source()` and is not repeated
//! in `Display`, so printing the chain (as `tcpkit`'s main does) gives one line:
//! `eth0: socket(AF_PACKET) (needs root or CAP_NET_RAW): Operation not permitted (os error 1)`.
//! A failed syscall is tcpkit-kernel's [`IfError`], the same for sending as for capturing.

use std::io;

use tcpkit_kernel::afpacket::IfError;

/// Why opening or reading a capture failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The interface does not exist in the calling thread's network namespace.
    #[error("{ifname}: no such network interface")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// A syscall on the capture socket failed.
    #[error(transparent)]
    Sys(IfError),
    /// libpcap could not compile the filter expression.
    #[error("filter {expr:?}: {reason}")]
    Filter {
        /// The expression as given.
        expr: String,
        /// libpcap's reason, e.g. `syntax error`.
        reason: String,
    },
    /// An option cannot work, e.g. a ring block that is not a multiple of the page size.
    #[error("{ifname}: {what}")]
    Invalid {
        /// The interface the capture was for.
        ifname: String,
        /// The option and why it cannot work.
        what: String,
    },
    /// The interface's link layer is one this crate cannot filter or describe.
    #[error(
        "{ifname}: unsupported link type (ARPHRD {hatype}); Ethernet, loopback and raw IP are"
    )]
    UnsupportedLink {
        /// The interface.
        ifname: String,
        /// The kernel's hardware type (ARPHRD_*).
        hatype: u16,
    },
    /// The kernel handed back a ring block whose layout does not add up. Never expected; the
    /// capture stops instead of reading outside the block.
    #[error("{ifname}: ring block {block}: {what}")]
    Ring {
        /// The interface.
        ifname: String,
        /// The block's index in the ring.
        block: usize,
        /// What did not add up.
        what: &'static str,
    },
}

impl CaptureError {
    pub(crate) fn sys(ifname: &str, call: &'static str, source: io::Error) -> CaptureError {
        CaptureError::Sys(IfError::new(ifname, call, source))
    }

    pub(crate) fn invalid(ifname: &str, what: String) -> CaptureError {
        CaptureError::Invalid {
            ifname: ifname.to_owned(),
            what,
        }
    }

    /// The errno behind this error, if a syscall failed.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            CaptureError::Sys(e) => e.source.raw_os_error(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The syscall's error is the source, not the line; the hint (tested in tcpkit-kernel)
    /// follows the call when the kernel refused it for lack of privilege.
    #[test]
    fn a_failed_syscall_is_named_with_its_hint_and_keeps_its_errno() {
        let denied = CaptureError::sys(
            "eth0",
            "socket(AF_PACKET)",
            io::Error::from_raw_os_error(libc::EPERM),
        );
        assert_eq!(
            denied.to_string(),
            "eth0: socket(AF_PACKET) (needs root or CAP_NET_RAW)"
        );
        let src = std::error::Error::source(&denied).map(|s| s.to_string());
        assert_eq!(src.as_deref(), Some("Operation not permitted (os error 1)"));
        let e = CaptureError::sys(
            "eth1",
            "setsockopt(PACKET_RX_RING)",
            io::Error::from_raw_os_error(libc::ENOMEM),
        );
        assert_eq!(e.to_string(), "eth1: setsockopt(PACKET_RX_RING)");
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
    }

    #[test]
    fn messages_are_one_line() {
        let e = CaptureError::Filter {
            expr: "tcp port".into(),
            reason: "syntax error".into(),
        };
        assert_eq!(e.to_string(), "filter \"tcp port\": syntax error");
        let e = CaptureError::NoSuchInterface {
            ifname: "eth9".into(),
        };
        assert_eq!(e.to_string(), "eth9: no such network interface");
        assert_eq!(e.raw_os_error(), None);
    }
}
