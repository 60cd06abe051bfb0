//! `--mptcp`: the kernel's Multipath TCP instead of striping. One `IPPROTO_MPTCP` connection;
//! the kernel's path manager opens the subflows and spreads the stream over them. What mpcat
//! needs of it: the socket, whether the connection really is MPTCP (a peer without MPTCP
//! makes it fall back to plain TCP at the handshake), and how many subflows it has.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `IPPROTO_MPTCP` (linux/in.h).
pub const IPPROTO_MPTCP: i32 = 262;
/// `SOL_MPTCP` (linux/socket.h).
const SOL_MPTCP: libc::c_int = 284;
/// `MPTCP_INFO` (linux/mptcp.h).
const MPTCP_INFO: libc::c_int = 1;
/// `MPTCP_INFO_FLAG_FALLBACK`: the connection runs as plain TCP.
const FLAG_FALLBACK: u32 = 1;

/// The start of `struct mptcp_info` (linux/mptcp.h), as old as the option itself; the kernel
/// copies at most the length asked for, so later fields do not matter.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct InfoHead {
    subflows: u8,
    add_addr_signal: u8,
    add_addr_accepted: u8,
    subflows_max: u8,
    add_addr_signal_max: u8,
    add_addr_accepted_max: u8,
    flags: u32,
}

/// Whether creating an MPTCP socket failed because this kernel has no MPTCP (not built in,
/// or `net.mptcp.enabled=0`), rather than for a reason that would fail TCP too.
pub fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPROTONOSUPPORT | libc::EINVAL | libc::ENOPROTOOPT | libc::EAFNOSUPPORT)
    )
}

/// What `MPTCP_INFO` says of a connected MPTCP socket: Ok(Some(subflows)), counting the
/// first; Ok(None) when the connection fell back to plain TCP (the kernel answers a fallen-back
/// socket's MPTCP_INFO with an error, older ones with the fallback flag).
pub fn subflows(s: &impl AsFd) -> io::Result<Option<u32>> {
    let mut info = InfoHead::default();
    let mut len = std::mem::size_of::<InfoHead>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, a plain repr(C) struct.
    let r = unsafe {
        libc::getsockopt(
            s.as_fd().as_raw_fd(),
            SOL_MPTCP,
            MPTCP_INFO,
            (&mut info as *mut InfoHead).cast(),
            &mut len,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::ENOPROTOOPT) => Ok(None),
            _ => Err(e),
        };
    }
    if info.flags & FLAG_FALLBACK != 0 {
        return Ok(None);
    }
    // mptcpi_subflows counts the subflows the path manager added to the first.
    Ok(Some(u32::from(info.subflows) + 1))
}

/// What the path manager needs for more than one subflow, said when only one formed.
pub const ONE_SUBFLOW_HINT: &str = "only 1 MPTCP subflow formed: the path manager needs endpoints and limits, e.g. here 'ip mptcp endpoint add ADDR dev DEV subflow' for each other local address and on both hosts 'ip mptcp limits set subflows N add_addr_accepted N'";
