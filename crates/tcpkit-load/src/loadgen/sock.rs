//! The host limits `load` runs into, and the non-blocking connect from a chosen source
//! address: `ip_local_port_range`, `IP_BIND_ADDRESS_NO_PORT`, and errno names
//! with the hint that goes with each.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, Socket, Type};

/// Descriptors a process keeps for itself (stdio, epoll and timer fds per thread, files).
pub(crate) fn fd_margin(threads: usize) -> u64 {
    64 + 4 * threads as u64
}

/// `net.ipv4.ip_local_port_range` of this network namespace (it applies to IPv6 too).
pub(crate) fn local_port_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .filter(|(lo, hi)| lo <= hi)
        .unwrap_or((32768, 60999))
}

/// Starts a non-blocking connect to `to` from `from` (the port left to connect time with
/// `IP_BIND_ADDRESS_NO_PORT`, so one address serves every destination port range).
pub(crate) fn connect(to: SocketAddr, from: Option<IpAddr>) -> io::Result<mio::net::TcpStream> {
    let s = Socket::new(
        Domain::for_address(to),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    s.set_tcp_nodelay(true)?;
    sequential_ports(&s);
    if let Some(src) = from {
        set_int(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            1,
        )?;
        s.bind(&SocketAddr::new(src, 0).into())?;
    }
    match s.connect(&to.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(mio::net::TcpStream::from_std(s.into()))
}

/// `setsockopt(fd, level, opt, &value)` for an int option.
fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: an int option and its size; a bad descriptor is an error, not undefined.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One of load's sockets: a TCP connection, a connected UDP socket (`--udp`: one datagram
/// per query and per answer, dnsperf's default transport), or TLS over TCP (`--tls`: reads
/// and writes are plaintext; the session is boxed so a clear connection's slot stays small).
#[derive(Debug)]
pub(crate) enum Sock {
    Tcp(mio::net::TcpStream),
    Udp(mio::net::UdpSocket),
    Tls(mio::net::TcpStream, Box<tcpkit_tls::Session>),
}

impl Sock {
    /// Reads bytes (TCP) or one datagram (UDP: `Ok(0)` is an empty datagram, not the end).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        match self {
            Sock::Tcp(s) => s.read(buf),
            Sock::Udp(s) => s.recv(buf),
            Sock::Tls(s, t) => t.read(s, buf),
        }
    }

    /// Writes bytes (TCP) or sends `buf` as one datagram (UDP, all or nothing).
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use std::io::Write;
        match self {
            Sock::Tcp(s) => s.write(buf),
            Sock::Udp(s) => s.send(buf),
            Sock::Tls(s, t) => t.write(s, buf),
        }
    }

    /// Writes output kept below the socket (TLS records the socket had no room for); true
    /// when none is left.
    pub(crate) fn flush_below(&mut self) -> io::Result<bool> {
        match self {
            Sock::Tls(s, t) => t.flush(s),
            Sock::Tcp(_) | Sock::Udp(_) => Ok(true),
        }
    }

    /// Whether output waits below the socket (see [`Sock::flush_below`]).
    pub(crate) fn wants_write(&self) -> bool {
        matches!(self, Sock::Tls(_, t) if t.wants_write())
    }

    /// Whether the read that just returned `n` of the `asked` bytes found the socket empty: a
    /// short read in clear; over TLS the session knows (one read returns what the records read
    /// so far decrypt to, and more records may wait in the socket behind them).
    pub(crate) fn drained(&self, n: usize, asked: usize) -> bool {
        match self {
            Sock::Tls(_, t) => t.drained(),
            Sock::Tcp(_) | Sock::Udp(_) => n < asked,
        }
    }

    /// Acknowledges at once what this TCP socket has received (`TCP_QUICKACK`; nothing for
    /// UDP). The kernel leaves quick-ack mode again by itself (a request-response connection
    /// falls back into delayed ACKs within a few segments), so this holds for what was read
    /// before the call: it is set again after each read.
    pub(crate) fn ack_now(&self) {
        if let Sock::Tcp(s) | Sock::Tls(s, _) = self {
            // A failure (the connection already closed) only leaves the ACK delayed.
            let _ = set_int(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1);
        }
    }

    pub(crate) fn take_error(&self) -> io::Result<Option<io::Error>> {
        match self {
            Sock::Tcp(s) | Sock::Tls(s, _) => s.take_error(),
            Sock::Udp(s) => s.take_error(),
        }
    }

    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Sock::Tcp(s) | Sock::Tls(s, _) => s.peer_addr(),
            Sock::Udp(s) => s.peer_addr(),
        }
    }

    pub(crate) fn is_udp(&self) -> bool {
        matches!(self, Sock::Udp(_))
    }
}

impl mio::event::Source for Sock {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        match self {
            Sock::Tcp(s) | Sock::Tls(s, _) => s.register(registry, token, interests),
            Sock::Udp(s) => s.register(registry, token, interests),
        }
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        match self {
            Sock::Tcp(s) | Sock::Tls(s, _) => s.reregister(registry, token, interests),
            Sock::Udp(s) => s.reregister(registry, token, interests),
        }
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        match self {
            Sock::Tcp(s) | Sock::Tls(s, _) => s.deregister(registry),
            Sock::Udp(s) => s.deregister(registry),
        }
    }
}

/// A non-blocking UDP socket connected to `to` (from `from` if given, any port): connected,
/// so the kernel drops datagrams from anyone else and reports an ICMP port unreachable as
/// ECONNREFUSED on the next call.
pub(crate) fn connect_udp(to: SocketAddr, from: Option<IpAddr>) -> io::Result<Sock> {
    let s = Socket::new(
        Domain::for_address(to),
        Type::DGRAM.nonblocking().cloexec(),
        Some(Protocol::UDP),
    )?;
    if let Some(src) = from {
        s.bind(&SocketAddr::new(src, 0).into())?;
    }
    s.connect(&to.into())?;
    Ok(Sock::Udp(mio::net::UdpSocket::from_std(s.into())))
}

/// `IP_LOCAL_PORT_RANGE` from `linux/in.h` (Linux 6.3); not in the libc crate.
const IP_LOCAL_PORT_RANGE: libc::c_int = 51;

/// Makes `connect()` pick this socket's port by one sequential scan of the whole range.
///
/// Without a per-socket range the kernel hands out ports of one parity first and, once those
/// are used up, scans all of them again before each connect that takes the other parity: past
/// half the range each connect costs ~32k probes, and opening a million connections crawled
/// from ~19k/s to ~250/s at exactly 50 % of (source addresses x ports). With any per-socket
/// range set, `__inet_hash_connect` steps by 1 and continues from where the last connect to
/// the same destination stopped. The range asked, 1..=65535, is clamped by the kernel to
/// `ip_local_port_range`, so it changes which ports are tried first, never which may be used.
/// Older kernels refuse the option; they keep their own order.
fn sequential_ports(s: &Socket) {
    let range: u32 = (65535 << 16) | 1;
    // SAFETY: a valid socket, a u32 option, its size. A failure leaves the kernel's default.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            IP_LOCAL_PORT_RANGE,
            (&range as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        );
    }
}

/// The error name of connects still unanswered when the run ended: named here, beside the
/// errno names, because its hint is chosen here ([`hint_bit`]).
pub(crate) const UNANSWERED_AT_END: &str = "connect unanswered at end";

/// The errno's name, as the report counts it.
pub(crate) fn errno_name(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ECONNREFUSED",
        Some(libc::ECONNRESET) => "ECONNRESET",
        Some(libc::ETIMEDOUT) => "ETIMEDOUT",
        Some(libc::EMFILE) => "EMFILE",
        Some(libc::ENFILE) => "ENFILE",
        Some(libc::EADDRNOTAVAIL) => "EADDRNOTAVAIL",
        Some(libc::EADDRINUSE) => "EADDRINUSE",
        Some(libc::ENETUNREACH) => "ENETUNREACH",
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH",
        Some(libc::EPIPE) => "EPIPE",
        Some(libc::ENOBUFS) => "ENOBUFS",
        Some(libc::ENOMEM) => "ENOMEM",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EPERM) => "EPERM",
        Some(libc::EINVAL) => "EINVAL",
        _ => "other socket error",
    }
}

/// The one-line hints for the limits an errno (or a connect timeout, or a late answer to a
/// connect) says were hit. A hint's index is its bit in [`super::Live`]'s set of hints given.
///
/// Each hint says only what its evidence shows (issue 10, case 8): a SYN nobody ever answers
/// is a host that is down or a firewall, not a full accept queue (a full queue still lets
/// some connects through, or answers them late); a refused connect is nothing listening.
const HINTS: [&str; 6] = [
    "out of file descriptors (EMFILE/ENFILE): run more processes with --procs N, or raise the limits (tcpkit tune --role client)",
    "out of local ports or addresses (EADDRNOTAVAIL): add source addresses with --source, or widen net.ipv4.ip_local_port_range (tcpkit tune --role client)",
    "connects timed out while others were answered: the server's accept queue may be full (somaxconn, tcp_max_syn_backlog) or SYN cookies in use; lower --connect-rate or run tcpkit tune --role server on the server",
    "no answer to any connect (no SYN-ACK): the host is down or unreachable, or a firewall drops the SYNs; check HOST:PORT and the path to it (a busy server still answers some connects)",
    "connects refused (RST): nothing listens on that address and port, or a firewall rejects the connects; check HOST:PORT and that the server runs",
    "connects answered late (the SYN was sent again): the server's accept queue may be full (somaxconn, tcp_max_syn_backlog) or SYN cookies in use; lower --connect-rate or run tcpkit tune --role server on the server",
];

const FDS_HINT: u32 = 1 << 0;
const PORTS_HINT: u32 = 1 << 1;
const QUEUE_HINT: u32 = 1 << 2;
const NO_ANSWER_HINT: u32 = 1 << 3;
const REFUSED_HINT: u32 = 1 << 4;
/// Raised by a connect that succeeded only after its SYN was sent again ([`syn_was_resent`]).
pub(crate) const LATE_HINT: u32 = 1 << 5;

/// The bit of the hint that error `name` raises (0: none); `answered` says whether any connect
/// to the target has been answered, which decides what a connect timeout means.
pub(crate) fn hint_bit(name: &str, answered: bool) -> u32 {
    match name {
        "EMFILE" | "ENFILE" => FDS_HINT,
        "EADDRNOTAVAIL" | "EADDRINUSE" => PORTS_HINT,
        "connect timeout" | UNANSWERED_AT_END if answered => QUEUE_HINT,
        "connect timeout" | UNANSWERED_AT_END => NO_ANSWER_HINT,
        "ECONNREFUSED" => REFUSED_HINT,
        _ => 0,
    }
}

/// True when the connected socket `s` had to send its SYN more than once (TCP_INFO's
/// `tcpi_total_retrans`, read right after the handshake, before any data: only SYNs can have
/// been retransmitted). False when the kernel does not say.
pub(crate) fn syn_was_resent(s: &Sock) -> bool {
    let (Sock::Tcp(s) | Sock::Tls(s, _)) = s else {
        return false;
    };
    // SAFETY: tcp_info is plain integers; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket, a tcp_info to fill, its size.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    rc == 0 && info.tcpi_total_retrans > 0
}

/// The hints of the bits set in `bits`, in a fixed order.
pub(crate) fn hints_of(bits: u32) -> impl Iterator<Item = &'static str> {
    HINTS
        .iter()
        .enumerate()
        .filter(move |(i, _)| bits & (1 << i) != 0)
        .map(|(_, h)| *h)
}

/// The bits of the hints a run's totals call for: its errors by name, whether any connect was
/// answered, and how many connects were answered late.
pub(crate) fn hint_bits<'a>(
    errors: impl IntoIterator<Item = &'a str>,
    answered: bool,
    late: u64,
) -> u32 {
    let bits = errors
        .into_iter()
        .fold(0, |b, name| b | hint_bit(name, answered));
    if late > 0 {
        bits | LATE_HINT
    } else {
        bits
    }
}

/// The hints of [`hint_bits`], in a fixed order.
pub(crate) fn hints_for<'a>(
    errors: impl IntoIterator<Item = &'a str>,
    answered: bool,
    late: u64,
) -> impl Iterator<Item = &'static str> {
    hints_of(hint_bits(errors, answered, late))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_range_is_read() {
        let (lo, hi) = local_port_range();
        assert!(lo > 0 && lo <= hi);
    }

    #[test]
    fn connects_ask_for_sequential_ports_on_both_families() {
        for to in ["127.0.0.1:0", "[::1]:0"] {
            let l = std::net::TcpListener::bind(to).unwrap();
            let s = connect(l.local_addr().unwrap(), None).unwrap();
            let mut range: u32 = 0;
            let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
            // SAFETY: a valid socket, a u32 to read into, its size.
            let rc = unsafe {
                libc::getsockopt(
                    s.as_raw_fd(),
                    libc::IPPROTO_IP,
                    IP_LOCAL_PORT_RANGE,
                    (&mut range as *mut u32).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0, "{to}: {}", io::Error::last_os_error());
            assert_eq!(range, (65535 << 16) | 1, "{to}");
        }
    }

    #[test]
    fn refused_connect_reports_econnrefused() {
        // A port nobody listens on: bind one, learn its number, close it.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let s = connect(addr, Some("127.0.0.1".parse().unwrap())).unwrap();
        let mut err = None;
        for _ in 0..100 {
            if let Ok(Some(e)) = s.take_error() {
                err = Some(e);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let e = err.expect("the connect fails");
        assert_eq!(errno_name(&e), "ECONNREFUSED");
        let hint = |name| hints_of(hint_bit(name, false)).next();
        assert!(hint("EMFILE").unwrap().contains("--procs"));
        assert!(hint("EADDRNOTAVAIL").unwrap().contains("--source"));
        assert!(hint("ECONNREFUSED")
            .unwrap()
            .starts_with("connects refused (RST)"));
    }

    #[test]
    fn a_connect_answered_at_once_did_not_resend_its_syn() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = Sock::Tcp(connect(l.local_addr().unwrap(), None).unwrap());
        let _a = l.accept().unwrap();
        for _ in 0..100 {
            if s.peer_addr().is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!syn_was_resent(&s));
    }

    #[test]
    fn each_hint_has_its_own_bit() {
        let bits: Vec<u32> = ["EMFILE", "ENFILE", "EADDRNOTAVAIL", "ECONNREFUSED", "EPIPE"]
            .iter()
            .map(|n| hint_bit(n, false))
            .collect();
        assert_eq!(bits, [1, 1, 2, 16, 0]);
        let all: Vec<&str> = hints_of(63).collect();
        assert_eq!(all.len(), 6);
        assert!(all[2].starts_with("connects timed out while others were answered"));
    }

    /// Issue 10, case 8: a connect timeout means a full accept queue only when other connects
    /// were answered; with none answered it means nothing answers at all.
    #[test]
    fn a_connect_timeout_hint_follows_the_evidence() {
        let h = |answered, late| hints_for(["connect timeout"], answered, late).collect::<Vec<_>>();
        let none = h(false, 0);
        assert_eq!(none.len(), 1);
        assert!(none[0].starts_with("no answer to any connect"), "{none:?}");
        assert!(!none[0].contains("accept queue may be full"), "{none:?}");
        let some = h(true, 0);
        assert!(some[0].contains("accept queue may be full"), "{some:?}");
        let late: Vec<&str> = hints_for([], true, 3).collect();
        assert_eq!(late.len(), 1);
        assert!(late[0].starts_with("connects answered late"), "{late:?}");
    }
}
