//! The PROXY protocol version 2 header (`--proxy-protocol`), which tells a target that
//! accepts it the address of the original client and server of a copied session.
//!
//! Only the emitter lives here: the copy writes headers and never reads one. The layout is
//! haproxy's proxy-protocol.txt section 2.2: a 12-byte signature, version 2 + PROXY command,
//! TCP over IPv4 or IPv6, the address block length, then source address, destination
//! address, source port, destination port. Mixed families are sent as IPv6 (v4-mapped).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The 12-byte signature every v2 header starts with.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Length of the header for these addresses: 28 bytes for IPv4, 52 for IPv6.
pub fn header_len(client: SocketAddr, server: SocketAddr) -> usize {
    match (client.ip(), server.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => 16 + 12,
        _ => 16 + 36,
    }
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// Appends the header saying the connection came from `client` to `server`.
pub fn emit(client: SocketAddr, server: SocketAddr, out: &mut Vec<u8>) {
    out.extend_from_slice(&SIGNATURE);
    // Version 2, command PROXY.
    out.push(0x21);
    match (client.ip(), server.ip()) {
        (IpAddr::V4(c), IpAddr::V4(s)) => {
            // AF_INET, STREAM.
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&c.octets());
            out.extend_from_slice(&s.octets());
        }
        (c, s) => {
            // AF_INET6, STREAM.
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(c).octets());
            out.extend_from_slice(&v6(s).octets());
        }
    }
    out.extend_from_slice(&client.port().to_be_bytes());
    out.extend_from_slice(&server.port().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_byte_for_byte() {
        let mut out = vec![0xAA];
        emit(
            "198.18.1.1:40000".parse().unwrap(),
            "198.18.1.2:80".parse().unwrap(),
            &mut out,
        );
        assert_eq!(out[0], 0xAA, "appends");
        let h = &out[1..];
        assert_eq!(h.len(), 28);
        assert_eq!(
            h.len(),
            header_len("1.1.1.1:1".parse().unwrap(), "2.2.2.2:2".parse().unwrap())
        );
        assert_eq!(
            &h[..12],
            b"\x0d\x0a\x0d\x0a\x00\x0d\x0a\x51\x55\x49\x54\x0a"
        );
        assert_eq!(&h[12..16], &[0x21, 0x11, 0, 12]);
        assert_eq!(&h[16..20], &[198, 18, 1, 1]);
        assert_eq!(&h[20..24], &[198, 18, 1, 2]);
        assert_eq!(&h[24..28], &[0x9c, 0x40, 0, 80]);
    }

    #[test]
    fn ipv6_and_mixed_families() {
        let mut out = Vec::new();
        let c: SocketAddr = "[fd00::1]:1234".parse().unwrap();
        let s: SocketAddr = "10.0.0.1:80".parse().unwrap();
        emit(c, s, &mut out);
        assert_eq!(out.len(), 52);
        assert_eq!(out.len(), header_len(c, s));
        assert_eq!(&out[12..16], &[0x21, 0x21, 0, 36]);
        assert_eq!(
            &out[16..32],
            &"fd00::1".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(
            &out[32..48],
            &"::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(&out[48..52], &[0x04, 0xd2, 0, 80]);
    }
}
