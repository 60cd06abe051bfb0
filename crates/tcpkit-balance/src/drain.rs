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

use tcpkit_kernel::netlink::{self, Msg, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

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

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const TCP_LISTEN: u8 = 10;

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

/// The socket of one inet_diag record, read from a SOCK_DIAG_BY_FAMILY answer's payload
/// (None when it is shorter than `struct inet_diag_msg`).
fn sock_of(body: &[u8]) -> Option<Sock> {
    let body = body.get(..MSG_MIN)?;
    let mut id = [0u8; SOCKID];
    id.copy_from_slice(&body[4..4 + SOCKID]);
    let c0 = u32::from_ne_bytes([id[40], id[41], id[42], id[43]]);
    let c1 = u32::from_ne_bytes([id[44], id[45], id[46], id[47]]);
    Some(Sock {
        family: body[0],
        state: body[1],
        peer: sockaddr(body[0], &id[20..36], [id[2], id[3]]),
        id,
        cookie: u64::from(c0) | (u64::from(c1) << 32),
    })
}

struct Diag {
    sock: netlink::Socket,
    /// Answers: a dump's datagrams are at most a page or two each.
    buf: Vec<u8>,
}

impl Diag {
    fn open() -> io::Result<Diag> {
        let sock = netlink::Socket::open(libc::NETLINK_SOCK_DIAG, false)?;
        // A receive timeout keeps a kernel that never answers from hanging the prober.
        sock.set_recv_timeout(std::time::Duration::from_secs(5))?;
        Ok(Diag {
            sock,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Sends an inet_diag_req_v2 for `family`/`proto` and socket `id` and calls `each` with
    /// every answer.
    fn request(
        &mut self,
        kind: u16,
        flags: u16,
        (family, proto): (u8, u8),
        id: &[u8; SOCKID],
        each: impl FnMut(&Msg<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut m = Vec::with_capacity(netlink::NLMSG_HDR + REQ);
        let start = netlink::begin(&mut m, kind, NLM_F_REQUEST | flags, 0);
        m.extend_from_slice(&[family, proto, 0, 0]);
        // Every TCP state.
        m.extend_from_slice(&u32::MAX.to_ne_bytes());
        m.extend_from_slice(id);
        netlink::finish(&mut m, start);
        self.sock.request(&mut m, &mut self.buf, each)
    }

    /// Every socket of `family`/`proto` in this network namespace.
    fn dump(&mut self, family: u8, proto: u8) -> io::Result<Vec<Sock>> {
        let mut out = Vec::new();
        self.request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_DUMP,
            (family, proto),
            &[0; SOCKID],
            |m| {
                if m.ty == SOCK_DIAG_BY_FAMILY {
                    out.extend(sock_of(m.payload()));
                }
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// SOCK_DESTROY of one socket, as dumped; Ok(false) when it was gone already.
    fn destroy(&mut self, s: &Sock, proto: u8) -> io::Result<bool> {
        let r = self.request(
            SOCK_DESTROY,
            NLM_F_ACK,
            (s.family, proto),
            &s.id,
            |_| Ok(()),
        );
        match r.as_ref().map_err(io::Error::raw_os_error) {
            Ok(()) => Ok(true),
            Err(Some(libc::ENOENT)) => Ok(false),
            Err(Some(libc::EOPNOTSUPP)) => Err(io::Error::other(
                "the kernel cannot end sockets (CONFIG_INET_DIAG_DESTROY is off)",
            )),
            Err(_) => r.map(|()| false),
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
    use std::os::fd::AsRawFd;

    #[test]
    fn a_diag_record_is_read_only_when_whole() {
        // struct inet_diag_msg of a connected IPv4 socket, a marker byte after it.
        let mut b = vec![libc::AF_INET as u8, 1, 0, 0];
        let mut id = [0u8; SOCKID];
        id[..4].copy_from_slice(&[0x9c, 0x40, 0x18, 0xeb]);
        id[4..8].copy_from_slice(&[198, 18, 0, 1]);
        id[20..24].copy_from_slice(&[198, 18, 0, 2]);
        id[40..44].copy_from_slice(&0x0506_0708u32.to_ne_bytes());
        id[44..48].copy_from_slice(&0x0102_0304u32.to_ne_bytes());
        b.extend_from_slice(&id);
        b.extend_from_slice(&[0; 20]);
        assert_eq!(b.len(), MSG_MIN);
        b.push(0xa5);
        let s = sock_of(&b).unwrap();
        assert_eq!((s.family, s.state), (libc::AF_INET as u8, 1));
        assert_eq!(s.cookie, 0x0102_0304_0506_0708);
        assert_eq!(s.peer, Some("198.18.0.2:6379".parse().unwrap()));
        assert_eq!(s.id, id);
        for cut in 0..MSG_MIN {
            assert!(sock_of(&b[..cut]).is_none(), "cut at {cut}");
        }
    }

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
        let mut d = Diag::open().unwrap();
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
