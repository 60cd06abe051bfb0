//! A raw IP sink: whole IP packets (header included, `IPPROTO_RAW`) sent to an address and
//! routed by the kernel like any other packet of the host, for a sender that plays another
//! host's TCP (copy's transparent mode: the packets carry the client's address) and so has
//! no socket of its own to the peer. AF_PACKET frames ([`crate::AfPacketSink`]) would bypass
//! the routing table the target's path depends on.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One raw socket of one family; non-blocking, so a full socket buffer is an error to count
/// (and a retransmission timer's business), never a stall.
#[derive(Debug)]
pub struct RawIpSink {
    fd: OwnedFd,
    v6: bool,
}

impl RawIpSink {
    /// Opens the raw socket for IPv6 packets when `v6`, else IPv4. Needs root or
    /// CAP_NET_RAW (the error is the caller's to name).
    pub fn open(v6: bool) -> io::Result<RawIpSink> {
        let fam = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: socket(2) with constant arguments; the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                fam,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::IPPROTO_RAW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(RawIpSink { fd, v6 })
    }

    /// Sends `pkt`, an IP packet of this sink's family from its header on, toward `dst`
    /// (which picks the route; the packet's own header says where it goes).
    pub fn send(&self, dst: IpAddr, pkt: &[u8]) -> io::Result<()> {
        let r = match dst {
            IpAddr::V4(a) if !self.v6 => {
                let sa = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: 0,
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: pkt and sa outlive the call; the lengths are theirs.
                unsafe {
                    libc::sendto(
                        self.fd.as_raw_fd(),
                        pkt.as_ptr().cast(),
                        pkt.len(),
                        0,
                        (&raw const sa).cast(),
                        socklen::<libc::sockaddr_in>(),
                    )
                }
            }
            IpAddr::V6(a) if self.v6 => {
                // SAFETY: all-zero is a valid sockaddr_in6.
                let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_addr.s6_addr = a.octets();
                // SAFETY: as above.
                unsafe {
                    libc::sendto(
                        self.fd.as_raw_fd(),
                        pkt.as_ptr().cast(),
                        pkt.len(),
                        0,
                        (&raw const sa).cast(),
                        socklen::<libc::sockaddr_in6>(),
                    )
                }
            }
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

fn socklen<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<T>()).expect("a sockaddr fits socklen_t")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packet goes out as built: a UDP datagram with its own IPv4 header sent to
    /// loopback arrives at a UDP socket bound there, payload whole. (Needs root, as the
    /// sink does; the suite runs as root.)
    #[test]
    fn a_hand_built_packet_reaches_a_socket_on_loopback() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let port = rx.local_addr().unwrap().port();
        let payload = b"raw sink";
        let mut pkt = vec![0x45, 0];
        pkt.extend_from_slice(&(20u16 + 8 + payload.len() as u16).to_be_bytes());
        pkt.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
        pkt.extend_from_slice(&4000u16.to_be_bytes());
        pkt.extend_from_slice(&port.to_be_bytes());
        pkt.extend_from_slice(&(8u16 + payload.len() as u16).to_be_bytes());
        pkt.extend_from_slice(&[0, 0]); // no UDP checksum (IPv4 allows it)
        pkt.extend_from_slice(payload);
        // The kernel fills the IPv4 header checksum for IPPROTO_RAW.
        let sink = RawIpSink::open(false).unwrap();
        sink.send("127.0.0.1".parse().unwrap(), &pkt).unwrap();
        let mut b = [0u8; 64];
        let (n, from) = rx.recv_from(&mut b).unwrap();
        assert_eq!(&b[..n], payload);
        assert_eq!(from.port(), 4000);
        // Another family's address is refused, not sent.
        let e = sink.send("::1".parse().unwrap(), &pkt).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
