//! The error type of this crate: one line naming the interface (or file) and the syscall.
//!
//! As in tcpkit-pcap, the `io::Error` of a failed syscall is the `source()` and is not repeated
//! in `Display` (Rust API guidelines), so printing the chain (`{:#}` with anyhow) gives one
//! line: `veth0: socket(AF_PACKET) (needs root or CAP_NET_RAW): Operation not permitted (os
//! error 1)`. A failed syscall is tcpkit-kernel's [`IfError`], the same for sending as for
//! capturing.

use std::io;
use std::path::PathBuf;

use tcpkit_kernel::afpacket::IfError;

/// Why opening or using a sink failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The interface does not exist in the calling thread's network namespace.
    #[error("{ifname}: no such network interface")]
    NoSuchInterface {
        /// The name asked for.
        ifname: String,
    },
    /// A syscall on an interface's socket failed (`socket(AF_PACKET)`, `sendmmsg`, ...).
    #[error(transparent)]
    Sys(IfError),
    /// Reading or writing a file failed.
    #[error("{}: {what}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What was being done: `cannot write`, `cannot read`.
        what: &'static str,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// AF_XDP cannot be used on this interface or queue: `why` says what is missing (a queue
    /// the interface does not have, no carrier, a kernel without AF_XDP, ...).
    #[error("{ifname}: AF_XDP: {why}")]
    Xdp {
        /// The interface.
        ifname: String,
        /// What stands in the way, and what would remove it.
        why: String,
        /// The kernel's refusal, when a syscall said it.
        #[source]
        source: Option<io::Error>,
    },
    /// Creating a capture file failed.
    #[error(transparent)]
    Pcap(#[from] tcpkit_pcap::PcapError),
}

impl SendError {
    pub(crate) fn sys(ifname: &str, call: &'static str, source: io::Error) -> SendError {
        SendError::Sys(IfError::new(ifname, call, source))
    }

    /// The errno behind this error, if a syscall failed.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SendError::Sys(IfError { source, .. }) | SendError::File { source, .. } => {
                source.raw_os_error()
            }
            SendError::Xdp { source, .. } => source.as_ref().and_then(io::Error::raw_os_error),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_option_names_the_capability_and_keeps_its_errno() {
        let e = SendError::sys(
            "eth1",
            "setsockopt(SO_SNDBUFFORCE)",
            io::Error::from_raw_os_error(libc::EPERM),
        );
        assert_eq!(
            e.to_string(),
            "eth1: setsockopt(SO_SNDBUFFORCE) (needs root or CAP_NET_ADMIN)"
        );
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        let e = SendError::sys(
            "eth1",
            "sendmmsg",
            io::Error::from_raw_os_error(libc::ENETDOWN),
        );
        assert_eq!(e.to_string(), "eth1: sendmmsg");
    }

    #[test]
    fn missing_interface_message() {
        let e = SendError::NoSuchInterface {
            ifname: "eth7".into(),
        };
        assert_eq!(e.to_string(), "eth7: no such network interface");
    }
}
