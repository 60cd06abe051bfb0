//! Listening sockets: what `tcpkit echo` asks of the kernel before it serves, and how one
//! echo's listeners share a port that no other process may share.
//!
//! Each thread has its own listener per address, all in one SO_REUSEPORT group, so the kernel
//! spreads connections over them without a shared accept queue. But the kernel lets any
//! SO_REUSEPORT socket of the same user join a group: a second echo (root, as the first) used
//! to start on a port in use and take part of its connections. So the first listener on each
//! address *claims* it: it binds and listens without SO_REUSEPORT, which fails with
//! EADDRINUSE while anything else listens there (another echo, nc, nginx), atomically, so of
//! two echos started together exactly one wins. Only once it listens is SO_REUSEPORT turned on
//! for it, and this echo's other listeners join it; a later echo's claim still fails, since it
//! asks for the port without SO_REUSEPORT. (A program that sets SO_REUSEPORT itself could
//! still join, as it could join nginx's `reuseport` listeners: that is its own choice.)
//!
//! With `--procs` the parent claims before any worker starts, and hands its claims to worker 0
//! across exec (as nginx hands its listeners to a new binary); the other workers join. A worker
//! therefore never joins a group that is not its own echo's.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{FromRawFd, RawFd};

use mio::net::TcpListener;
use socket2::{Domain, Protocol, Socket, Type};

use super::{EchoConfig, EchoError};

/// Listen backlog; the kernel caps it at `net.core.somaxconn` (`tcpkit tune` explains that).
const BACKLOG: i32 = 65535;

/// The environment variable that names, to worker 0, the claimed listeners it inherits: their
/// descriptor numbers, comma-separated, in the order of the addresses.
pub const INHERITED_ENV: &str = "TCPKIT_ECHO_LISTEN_FDS";

fn err(what: &'static str, addr: SocketAddr) -> impl Fn(io::Error) -> EchoError {
    move |source| EchoError::Socket { what, addr, source }
}

/// A listener on `addr`: claimed (see the module's comment) or joining this echo's group.
fn listener(addr: SocketAddr, claim: bool) -> Result<Socket, EchoError> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(err("socket for", addr))?;
    // SO_REUSEADDR: a restart binds while the last run's connections are in TIME_WAIT. It
    // never lets a socket bind beside one that listens.
    sock.set_reuse_address(true)
        .map_err(err("SO_REUSEADDR on", addr))?;
    if !claim {
        sock.set_reuse_port(true)
            .map_err(err("SO_REUSEPORT on", addr))?;
    }
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        sock.set_only_v6(false)
            .map_err(err("IPV6_V6ONLY off on", addr))?;
    }
    sock.set_nonblocking(true)
        .map_err(err("O_NONBLOCK on", addr))?;
    sock.bind(&addr.into()).map_err(err("bind", addr))?;
    sock.listen(BACKLOG).map_err(err("listen on", addr))?;
    if claim {
        // The port is ours: from now on this echo's own listeners may join.
        sock.set_reuse_port(true)
            .map_err(err("SO_REUSEPORT on", addr))?;
    }
    Ok(sock)
}

/// One listener per address of `cfg`, each made by `make`; the default `[::]` becomes
/// `0.0.0.0` on a host without IPv6.
fn per_address(
    cfg: &EchoConfig,
    make: impl Fn(SocketAddr) -> Result<Socket, EchoError>,
) -> Result<Vec<(SocketAddr, Socket)>, EchoError> {
    let mut out = Vec::with_capacity(cfg.listen.len());
    for (i, &addr) in cfg.listen.iter().enumerate() {
        let s = match make(addr) {
            Err(EchoError::Socket { source, .. })
                if cfg.listen_is_default
                    && i == 0
                    && matches!(
                        source.raw_os_error(),
                        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
                    ) =>
            {
                // No IPv6 here (disabled by sysctl or not built): the dual-stack default
                // can only mean IPv4.
                let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
                return Ok(vec![(v4, make(v4)?)]);
            }
            r => r?,
        };
        out.push((addr, s));
    }
    Ok(out)
}

/// Claims every address of `cfg` (module comment): refused at once, naming the address, when
/// another process listens on one.
pub fn claim_all(cfg: &EchoConfig) -> Result<Vec<(SocketAddr, Socket)>, EchoError> {
    per_address(cfg, |a| listener(a, true))
}

/// The claims a parent handed to this process (worker 0), if it was given any: each must be a
/// listening TCP socket on the address it is taken for.
fn inherited(cfg: &EchoConfig) -> Result<Option<Vec<(SocketAddr, Socket)>>, EchoError> {
    let Ok(list) = std::env::var(INHERITED_ENV) else {
        return Ok(None);
    };
    let bad = |why: String| {
        EchoError::io(
            "take the listeners --procs handed over",
            io::Error::other(format!("{INHERITED_ENV}={list}: {why}")),
        )
    };
    let mut out = Vec::new();
    for (i, fd) in list.split(',').enumerate() {
        let fd: RawFd = fd
            .parse()
            .map_err(|_| bad(format!("'{fd}' is not a descriptor")))?;
        // SAFETY: F_GETFD only reads the descriptor table.
        if fd <= 2 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(bad(format!("descriptor {fd} is not open")));
        }
        // SAFETY: the descriptor is open and was handed to this process to own (nothing else
        // here knows its number); it is checked to be a listening socket below.
        let sock = unsafe { Socket::from_raw_fd(fd) };
        let addr = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| bad(format!("descriptor {fd} is not a TCP socket")))?;
        let listening =
            sock.r#type().is_ok_and(|t| t == Type::STREAM) && sock.is_listener().unwrap_or(false);
        let port = cfg.listen.get(i).map_or(0, SocketAddr::port);
        if !listening || addr.port() != port {
            return Err(bad(format!(
                "descriptor {fd} is not a listener on port {port}"
            )));
        }
        sock.set_cloexec(true).map_err(err("FD_CLOEXEC on", addr))?;
        out.push((addr, sock));
    }
    Ok(Some(out))
}

/// Binds `threads` listeners on every address of `cfg`. Returns the addresses actually bound
/// (the default `[::]` becomes `0.0.0.0` on a host without IPv6) and each thread's listeners.
/// Thread 0's are the claims (made here, or handed over to worker 0); a worker other than 0
/// only joins the group its parent claimed.
pub(super) fn bind_all(
    cfg: &EchoConfig,
    threads: usize,
) -> Result<(Vec<SocketAddr>, Vec<Vec<TcpListener>>), EchoError> {
    let firsts = match cfg.worker {
        Some((k, _)) if k > 0 => per_address(cfg, |a| listener(a, false))?,
        _ => match inherited(cfg)? {
            Some(v) => v,
            None => claim_all(cfg)?,
        },
    };
    let addrs: Vec<SocketAddr> = firsts.iter().map(|(a, _)| *a).collect();
    let mut per_thread: Vec<Vec<TcpListener>> = Vec::with_capacity(threads);
    per_thread.push(
        firsts
            .into_iter()
            .map(|(_, s)| TcpListener::from_std(s.into()))
            .collect(),
    );
    for _ in 1..threads {
        let mine = addrs
            .iter()
            .map(|&a| listener(a, false).map(|s| TcpListener::from_std(s.into())))
            .collect::<Result<_, _>>()?;
        per_thread.push(mine);
    }
    Ok((addrs, per_thread))
}
