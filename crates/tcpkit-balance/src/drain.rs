//! `--drain-kill`: the sockets still connected to a backend that went down (health) or left
//! its service (reload) are ended, as `ss -K` ends them: sock_diag SOCK_DESTROY (netlink;
//! the kernel's CONFIG_INET_DIAG_DESTROY). A TCP socket gets ECONNABORTED and its peer a
//! reset; a connected UDP socket gets ECONNABORTED on its next receive.
//!
//! Only sockets the balancer sent there are touched: their cookies are the reverse map's
//! entries toward the backend (written by connect4/6 in the balanced cgroup), and each
//! socket's peer must still be that backend. An unconnected UDP socket that its first datagram
//! tied to the backend is not ended: its entry is dropped, so its next datagram picks a live
//! backend.
//!
//! Why not bpf_sock_destroy() from a BPF socket iterator (kernel 6.5 and later): calling a
//! kfunc needs its BTF id relocated at load time, which the loader (aya 0.14) does not do.
//! sock_diag reaches the same kernel function (tcp_abort, udp_abort) from user space. Like an
//! iterator, it sees the sockets of this process's network namespace only.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Which sockets `--drain-kill` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainKill {
    /// Connected UDP sockets (the default: a UDP client never notices its server is gone).
    Udp,
    /// TCP connections.
    Tcp,
    /// Both.
    All,
}

impl DrainKill {
    pub fn tcp(self) -> bool {
        matches!(self, DrainKill::Tcp | DrainKill::All)
    }
    pub fn udp(self) -> bool {
        matches!(self, DrainKill::Udp | DrainKill::All)
    }
    pub fn name(self) -> &'static str {
        match self {
            DrainKill::Udp => "udp",
            DrainKill::Tcp => "tcp",
            DrainKill::All => "all",
        }
    }
}

/// What one drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Sockets ended.
    pub ended: u64,
    /// Unconnected UDP sockets set free to pick again.
    pub repicked: u64,
}

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_LISTEN: u8 = 10;

/// struct nlmsghdr, 16 bytes.
const NLMSG_HDR: usize = 16;
/// struct inet_diag_sockid: sport, dport (network order; 0..4), src[4] (4..20), dst[4]
/// (20..36), if (36..40), cookie[2] (40..48).
const SOCKID: usize = 48;
/// struct inet_diag_req_v2: family, protocol, ext, pad, states (u32), sockid.
const REQ: usize = 8 + SOCKID;
/// struct inet_diag_msg: family, state, timer, retrans, sockid, then 5 u32.
const MSG_MIN: usize = 4 + SOCKID + 20;

/// One socket as sock_diag gives it.
struct Sock {
    family: u8,
    state: u8,
    /// The inet_diag_sockid as the kernel wrote it (given back as is to SOCK_DESTROY).
    id: [u8; SOCKID],
    cookie: u64,
    peer: Option<SocketAddr>,
}

fn sockaddr(family: u8, ip: &[u8], port: [u8; 2]) -> Option<SocketAddr> {
    let port = u16::from_be_bytes(port);
    let ip = if i32::from(family) == libc::AF_INET {
        IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
    } else {
        let mut o = [0u8; 16];
        o.copy_from_slice(&ip[..16]);
        let v6 = Ipv6Addr::from(o);
        // An IPv6 socket connected to an IPv4 backend (v4-mapped) is that backend's.
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    };
    (!ip.is_unspecified() || port != 0).then_some(SocketAddr::new(ip, port))
}

struct Diag {
    fd: OwnedFd,
    seq: u32,
}

impl Diag {
    fn open() -> io::Result<Diag> {
        // SAFETY: socket(2) with constant arguments; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a descriptor just returned to us and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: setsockopt on our own descriptor with a timeval of the right size; a
        // receive timeout keeps a kernel that never answers from hanging the prober.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Ok(Diag { fd, seq: 0 })
    }

    fn send(
        &mut self,
        kind: u16,
        flags: u16,
        family: u8,
        proto: u8,
        id: &[u8; SOCKID],
    ) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut m = Vec::with_capacity(NLMSG_HDR + REQ);
        m.extend_from_slice(&((NLMSG_HDR + REQ) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&self.seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[family, proto, 0, 0]);
        m.extend_from_slice(&u32::MAX.to_ne_bytes());
        m.extend_from_slice(id);
        // SAFETY: send(2) of a buffer we own, its length given.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self.seq)
    }

    fn recv<'a>(&self, buf: &'a mut [u8]) -> io::Result<&'a [u8]> {
        // SAFETY: recv(2) into a buffer we own, its length given.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(&buf[..n as usize])
    }

    /// Every socket of `family`/`proto` in this network namespace.
    fn dump(&mut self, family: u8, proto: u8) -> io::Result<Vec<Sock>> {
        let seq = self.send(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            family,
            proto,
            &[0; SOCKID],
        )?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let data = self.recv(&mut buf)?;
            let mut at = 0;
            while at + NLMSG_HDR <= data.len() {
                let len =
                    u32::from_ne_bytes(data[at..at + 4].try_into().unwrap_or_default()) as usize;
                let kind = u16::from_ne_bytes([data[at + 4], data[at + 5]]);
                let mseq = u32::from_ne_bytes(data[at + 8..at + 12].try_into().unwrap_or_default());
                // Lengths from the kernel are still checked before they are used.
                if len < NLMSG_HDR || at + len > data.len() {
                    return Err(io::Error::other("sock_diag: a truncated message"));
                }
                let body = &data[at + NLMSG_HDR..at + len];
                at += (len + 3) & !3;
                if mseq != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let e = body
                            .get(..4)
                            .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap_or_default()));
                        return Err(io::Error::from_raw_os_error(-e));
                    }
                    SOCK_DIAG_BY_FAMILY if body.len() >= MSG_MIN => {
                        let mut id = [0u8; SOCKID];
                        id.copy_from_slice(&body[4..4 + SOCKID]);
                        let c0 = u32::from_ne_bytes(id[40..44].try_into().unwrap_or_default());
                        let c1 = u32::from_ne_bytes(id[44..48].try_into().unwrap_or_default());
                        out.push(Sock {
                            family: body[0],
                            state: body[1],
                            peer: sockaddr(body[0], &id[20..36], [id[2], id[3]]),
                            id,
                            cookie: u64::from(c0) | (u64::from(c1) << 32),
                        });
                    }
                    _ => {}
                }
            }
        }
    }

    /// SOCK_DESTROY of one socket, as dumped; Ok(false) when it was gone already.
    fn destroy(&mut self, s: &Sock, proto: u8) -> io::Result<bool> {
        let seq = self.send(
            SOCK_DESTROY,
            NLM_F_REQUEST | NLM_F_ACK,
            s.family,
            proto,
            &s.id,
        )?;
        let mut buf = vec![0u8; 4096];
        loop {
            let data = self.recv(&mut buf)?;
            if data.len() < NLMSG_HDR + 4 {
                return Err(io::Error::other("sock_diag: a short answer"));
            }
            let kind = u16::from_ne_bytes([data[4], data[5]]);
            let mseq = u32::from_ne_bytes(data[8..12].try_into().unwrap_or_default());
            if mseq != seq || kind != NLMSG_ERROR {
                continue;
            }
            let e = -i32::from_ne_bytes(data[16..20].try_into().unwrap_or_default());
            return match e {
                0 => Ok(true),
                libc::ENOENT => Ok(false),
                libc::EOPNOTSUPP => Err(io::Error::other(
                    "the kernel cannot end sockets (CONFIG_INET_DIAG_DESTROY is off)",
                )),
                e => Err(io::Error::from_raw_os_error(e)),
            };
        }
    }
}

/// Ends the sockets among `cookies` (the balancer sent them to `backend`) whose peer is still
/// `backend`: TCP and/or connected UDP as `which` says. Unconnected UDP sockets among them are
/// returned in `free` (their reverse-map entries are to be dropped).
pub fn drain(
    backend: SocketAddr,
    cookies: &HashSet<u64>,
    which: DrainKill,
    free: &mut Vec<u64>,
) -> io::Result<Drained> {
    let mut d = Drained::default();
    if cookies.is_empty() {
        return Ok(d);
    }
    let mut diag = Diag::open()?;
    let mut protos = Vec::new();
    if which.tcp() {
        protos.push(libc::IPPROTO_TCP as u8);
    }
    // UDP is looked at either way: unconnected sockets tied to the backend are set free.
    protos.push(libc::IPPROTO_UDP as u8);
    for proto in protos {
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            for s in diag.dump(family, proto)? {
                if !cookies.contains(&s.cookie) {
                    continue;
                }
                let udp = proto == libc::IPPROTO_UDP as u8;
                match s.peer {
                    None if udp => free.push(s.cookie),
                    Some(p) if p == backend => {
                        if (udp && !which.udp()) || (!udp && s.state == TCP_LISTEN) {
                            continue;
                        }
                        if diag.destroy(&s, proto)? {
                            d.ended += 1;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    d.repicked = free.len() as u64;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_read_as_the_backend_they_are() {
        let v4 = sockaddr(
            libc::AF_INET as u8,
            &[198, 18, 0, 2, 0, 0, 0, 0],
            [0x18, 0xeb],
        );
        assert_eq!(v4, Some("198.18.0.2:6379".parse().unwrap()));
        let mut mapped = [0u8; 16];
        mapped[10] = 0xff;
        mapped[11] = 0xff;
        mapped[12..].copy_from_slice(&[198, 18, 0, 2]);
        let m = sockaddr(libc::AF_INET6 as u8, &mapped, [0x18, 0xeb]);
        assert_eq!(m, Some("198.18.0.2:6379".parse().unwrap()));
        assert_eq!(sockaddr(libc::AF_INET as u8, &[0; 16], [0, 0]), None);
    }

    #[test]
    fn a_dump_of_this_namespace_finds_a_socket_by_its_cookie() {
        // Needs nothing but sock_diag, which every Linux with inet_diag has.
        let l = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.connect(l.local_addr().unwrap()).unwrap();
        let mut cookie = 0u64;
        let mut len = 8u32;
        // SAFETY: getsockopt SO_COOKIE into a u64 of the size given.
        let r = unsafe {
            libc::getsockopt(
                c.as_raw_fd(),
                libc::SOL_SOCKET,
                57, // SO_COOKIE
                (&raw mut cookie).cast(),
                &raw mut len,
            )
        };
        assert_eq!(r, 0);
        let Ok(mut d) = Diag::open() else { return };
        let all = d
            .dump(libc::AF_INET as u8, libc::IPPROTO_UDP as u8)
            .unwrap();
        let s = all
            .iter()
            .find(|s| s.cookie == cookie)
            .expect("our socket in the dump");
        assert_eq!(s.peer, Some(l.local_addr().unwrap()));
    }
}
