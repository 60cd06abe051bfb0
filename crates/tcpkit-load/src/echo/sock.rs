//! Listening sockets: what `tcpkit echo` asks of the kernel before it serves.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use mio::net::TcpListener;
use socket2::{Domain, Protocol, Socket, Type};

use super::{EchoConfig, EchoError};

/// Listen backlog; the kernel caps it at `net.core.somaxconn` (`tcpkit tune` explains that).
const BACKLOG: i32 = 65535;

fn listener(addr: SocketAddr) -> Result<TcpListener, EchoError> {
    let err =
        |what: &'static str| move |source: io::Error| EchoError::Socket { what, addr, source };
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(err("socket for"))?;
    // SO_REUSEPORT: one listener per thread (and per worker process) on the same port.
    sock.set_reuse_port(true).map_err(err("SO_REUSEPORT on"))?;
    sock.set_reuse_address(true)
        .map_err(err("SO_REUSEADDR on"))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        sock.set_only_v6(false).map_err(err("IPV6_V6ONLY off on"))?;
    }
    sock.set_nonblocking(true).map_err(err("O_NONBLOCK on"))?;
    sock.bind(&addr.into()).map_err(err("bind"))?;
    sock.listen(BACKLOG).map_err(err("listen on"))?;
    Ok(TcpListener::from_std(sock.into()))
}

/// Binds `threads` listeners on every address of `cfg`. Returns the addresses actually bound
/// (the default `[::]` becomes `0.0.0.0` on a host without IPv6) and each thread's listeners.
pub(super) fn bind_all(
    cfg: &EchoConfig,
    threads: usize,
) -> Result<(Vec<SocketAddr>, Vec<Vec<TcpListener>>), EchoError> {
    let mut addrs = cfg.listen.clone();
    let mut per_thread: Vec<Vec<TcpListener>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, addr) in addrs.iter_mut().enumerate() {
        for (t, mine) in per_thread.iter_mut().enumerate() {
            let l = match listener(*addr) {
                Err(EchoError::Socket { source, .. })
                    if cfg.listen_is_default
                        && t == 0
                        && i == 0
                        && matches!(
                            source.raw_os_error(),
                            Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
                        ) =>
                {
                    // No IPv6 here (disabled by sysctl or not built): the dual-stack default
                    // can only mean IPv4.
                    *addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
                    listener(*addr)?
                }
                r => r?,
            };
            mine.push(l);
        }
    }
    Ok((addrs, per_thread))
}
