//! AF_PACKET sockets as both capture (an RX ring) and send (sendmmsg, a TX ring) open them:
//! the socket itself, its options, binding it to an interface, mapping its ring, and the hint
//! a user gets when the kernel refuses one of these for lack of privilege.
//!
//! Each function returns the kernel's `io::Error`; the caller wraps it in an [`IfError`] with
//! the interface and the call's name (`setsockopt(PACKET_RX_RING)`), which [`hint`] reads.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::{cvt, SysError};

/// An AF_PACKET `SOCK_RAW` socket with protocol 0: the kernel queues nothing to it until a
/// `bind` names a protocol, so a capture sees no packet before its filter is in place and a
/// send-only socket never receives. Close-on-exec.
pub fn socket() -> Result<OwnedFd, SysError> {
    // SAFETY: plain socket(2); the descriptor is owned at once below.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(SysError::last("socket(AF_PACKET)"));
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `setsockopt(fd, level, name, v)` with `v`'s size: `T` must be the type the option takes
/// (an int, `tpacket_req3`, `sock_fprog`, ...).
pub fn setsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: `v` is a live value we borrow for the call, passed with its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Binds `fd` to interface `ifindex` (0: every interface) for `protocol` (an ethertype in host
/// order: `ETH_P_ALL` to receive everything, 0 to send only).
pub fn bind(fd: BorrowedFd<'_>, ifindex: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain old data; all zeroes is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as libc::c_ushort;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex as libc::c_int;
    // SAFETY: passes a sockaddr_ll we own, with its size.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Maps the `len` bytes of the ring the kernel allocated for `fd` (after `PACKET_RX_RING` or
/// `PACKET_TX_RING`), shared and populated up front so the first packets do not fault.
/// The caller owns the mapping and unmaps it (`munmap`); the kernel keeps the ring while the
/// socket or the mapping holds it.
pub fn map_ring(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    map_ring_at(fd, len, 0)
}

/// Maps `len` bytes of a socket's ring at page offset `offset`, shared with the kernel and
/// faulted in: an AF_XDP socket has several rings, each at its own offset
/// (`XDP_PGOFF_TX_RING`, ...). The caller unmaps it.
pub fn map_ring_at(fd: BorrowedFd<'_>, len: usize, offset: u64) -> io::Result<NonNull<u8>> {
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: maps a ring the kernel allocated for this socket; nothing of ours is overwritten
    // (the address is the kernel's choice).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            offset,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// A syscall on an interface's socket that failed, as capture and send report it: one line
/// naming the interface and the call, with the [`hint`]; the kernel's reason is the
/// `source()`, not repeated in the line, so printing the chain gives
/// `eth0: socket(AF_PACKET) (needs root or CAP_NET_RAW): Operation not permitted (os error 1)`.
#[derive(Debug, thiserror::Error)]
#[error("{ifname}: {call}{}", hint(call, source))]
pub struct IfError {
    /// The interface ("any" for all).
    pub ifname: String,
    /// The syscall, with its key argument: `socket(AF_PACKET)`, `setsockopt(PACKET_RX_RING)`.
    pub call: &'static str,
    /// The operating system's reason.
    #[source]
    pub source: io::Error,
}

impl IfError {
    /// `call` on `ifname`'s socket failed with `source`.
    pub fn new(ifname: &str, call: &'static str, source: io::Error) -> IfError {
        IfError {
            ifname: ifname.to_owned(),
            call,
            source,
        }
    }
}

/// What the user can do when the kernel refused `call` with `err`, to follow the call's name
/// in an error line: packet and raw sockets need CAP_NET_RAW; the options set beyond what an
/// unprivileged socket may (forced buffer sizes) need CAP_NET_ADMIN. Empty for anything else,
/// notably EPERM from a send, which is a firewall's verdict, not a missing privilege.
pub fn hint(call: &str, err: &io::Error) -> &'static str {
    let denied = matches!(err.raw_os_error(), Some(libc::EPERM | libc::EACCES));
    if !denied {
        ""
    } else if call.starts_with("socket") {
        " (needs root or CAP_NET_RAW)"
    } else if call.starts_with("setsockopt") {
        " (needs root or CAP_NET_ADMIN)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn os(errno: i32) -> io::Error {
        io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn refusals_name_the_privilege_each_call_needs() {
        assert_eq!(
            hint("socket(AF_PACKET)", &os(libc::EPERM)),
            " (needs root or CAP_NET_RAW)"
        );
        assert_eq!(
            hint("socket(AF_INET, SOCK_RAW)", &os(libc::EACCES)),
            " (needs root or CAP_NET_RAW)"
        );
        assert_eq!(
            hint("setsockopt(SO_SNDBUFFORCE)", &os(libc::EPERM)),
            " (needs root or CAP_NET_ADMIN)"
        );
    }

    #[test]
    fn the_error_line_names_interface_call_and_hint_and_keeps_the_errno_as_source() {
        let e = IfError::new("eth0", "socket(AF_PACKET)", os(libc::EPERM));
        assert_eq!(
            e.to_string(),
            "eth0: socket(AF_PACKET) (needs root or CAP_NET_RAW)"
        );
        let src = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(src.as_deref(), Some("Operation not permitted (os error 1)"));
        let e = IfError::new("eth1", "setsockopt(PACKET_RX_RING)", os(libc::ENOMEM));
        assert_eq!(e.to_string(), "eth1: setsockopt(PACKET_RX_RING)");
    }

    #[test]
    fn other_errors_and_other_calls_have_no_hint() {
        assert_eq!(hint("setsockopt(PACKET_RX_RING)", &os(libc::ENOMEM)), "");
        assert_eq!(hint("socket(AF_PACKET)", &os(libc::EAFNOSUPPORT)), "");
        // EPERM from a send is a netfilter rule's drop, not a missing capability.
        assert_eq!(hint("sendmmsg", &os(libc::EPERM)), "");
        assert_eq!(hint("bind(AF_PACKET)", &os(libc::EPERM)), "");
    }

    #[test]
    fn a_socket_is_opened_and_bound_or_refused_with_the_call_named() {
        // As root (the lab and CI) the socket opens; without CAP_NET_RAW it is refused, and
        // the error says which call and why.
        let fd = match socket() {
            Ok(fd) => fd,
            Err(e) => {
                assert_eq!(e.call, "socket(AF_PACKET)");
                assert_eq!(e.source.raw_os_error(), Some(libc::EPERM));
                return;
            }
        };
        let one: libc::c_int = 1;
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_LOSS, &one).unwrap();
        // An option the kernel does not know is refused, not ignored.
        let e = setsockopt(fd.as_fd(), libc::SOL_PACKET, 9999, &one).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT));
        // Every interface (index 0), send-only protocol 0.
        bind(fd.as_fd(), 0, 0).unwrap();
        let e = bind(fd.as_fd(), u32::MAX >> 1, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
        // No ring was asked for: there is nothing to map.
        assert_eq!(
            map_ring(fd.as_fd(), 4096).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
