//! Which link a connection takes, so the sender can pick source ports that put its streams
//! on distinct members: an ECMP route's nexthops, asked of the kernel itself (an
//! `RTM_GETROUTE` carrying the connection's protocol and ports returns the nexthop the L4
//! multipath hash picks, exactly as for the connection: no traffic, no guessing), or a
//! bond's slaves with the bond's `layer3+4` hash computed here ([`bond_l34_slave`]).
//!
//! The receive direction is the peer's to spread (its own routes, or the switch's hash
//! toward this host): nothing chosen here changes it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use tcpkit_kernel::netlink::{self, put_attr, Msg, NLM_F_REQUEST};

/// Where connections toward the peer leave this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    /// The route has one way out (or nothing could be learnt): ports change nothing.
    Single { dev: String },
    /// An ECMP route: its nexthops' interfaces, in the order first seen.
    Ecmp { devs: Vec<String> },
    /// A bond in a hashing mode with `layer3+4`: its slaves, in the bond's order.
    Bond { bond: String, slaves: Vec<String> },
}

impl Egress {
    /// The members streams are spread over (one for `Single`).
    pub fn members(&self) -> Vec<String> {
        match self {
            Egress::Single { dev } => vec![dev.clone()],
            Egress::Ecmp { devs } => devs.clone(),
            Egress::Bond { slaves, .. } => slaves.clone(),
        }
    }
}

/// The member a connection `from` → `to` (TCP) leaves by, and this host's source address
/// for `to` when `from` has none.
#[derive(Debug)]
pub struct Paths {
    pub egress: Egress,
    /// The source address the kernel picks toward the peer.
    pub src: IpAddr,
    nl: Netlink,
}

/// How many source ports are sampled to find an ECMP route's nexthops: with 4 nexthops, one
/// is missed with probability 4 * (3/4)^64, about 4e-8.
const SAMPLES: u16 = 64;

impl Paths {
    /// Learns how connections to `to` leave this host.
    pub fn discover(to: SocketAddr) -> io::Result<Paths> {
        let nl = Netlink::open()?;
        let first = nl.route_get(to.ip(), None, 0, to.port())?;
        let src = first.prefsrc.ok_or_else(|| {
            io::Error::other(format!("the route to {} gives no source address", to.ip()))
        })?;
        let dev = ifname(first.oif)?;
        let egress = if let Some(slaves) = bond_l34_slaves(&dev) {
            Egress::Bond { bond: dev, slaves }
        } else {
            // The samples only tell interfaces apart: by index, and a name (a socket and an
            // ioctl) once per interface found.
            let mut oifs = vec![first.oif];
            for k in 0..SAMPLES {
                let sport = 33000 + k * 401;
                let r = nl.route_get(to.ip(), Some(src), sport, to.port())?;
                if !oifs.contains(&r.oif) {
                    oifs.push(r.oif);
                }
            }
            let mut devs = vec![dev];
            for &i in &oifs[1..] {
                devs.push(ifname(i)?);
            }
            if devs.len() == 1 {
                Egress::Single {
                    dev: devs.remove(0),
                }
            } else {
                Egress::Ecmp { devs }
            }
        };
        Ok(Paths { egress, src, nl })
    }

    /// The member (index into [`Egress::members`]) a TCP connection `from` → `to` takes.
    pub fn member_of(&self, from: SocketAddr, to: SocketAddr) -> io::Result<usize> {
        match &self.egress {
            Egress::Single { .. } => Ok(0),
            Egress::Ecmp { devs } => {
                let r = self
                    .nl
                    .route_get(to.ip(), Some(from.ip()), from.port(), to.port())?;
                let d = ifname(r.oif)?;
                // A nexthop the samples missed: counted as the first, which only makes
                // the spread less even, never wrong.
                Ok(devs.iter().position(|x| *x == d).unwrap_or(0))
            }
            Egress::Bond { slaves, .. } => Ok(bond_l34_slave(from, to, slaves.len())),
        }
    }
}

/// The slaves of `dev` if it is a bond that spreads by the `layer3+4` hash (802.3ad or
/// balance-xor); None otherwise.
fn bond_l34_slaves(dev: &str) -> Option<Vec<String>> {
    let dir = Path::new("/sys/class/net").join(dev).join("bonding");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let mode = read("mode")?;
    let policy = read("xmit_hash_policy")?;
    let hashing = mode.starts_with("802.3ad") || mode.starts_with("balance-xor");
    if !hashing || !policy.starts_with("layer3+4") {
        return None;
    }
    let slaves: Vec<String> = read("slaves")?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    (!slaves.is_empty()).then_some(slaves)
}

/// The slave (index among `n`) the Linux bonding driver's `layer3+4` policy sends a TCP
/// connection `from` → `to` on, as `bond_xmit_hash` computes it (drivers/net/bonding/
/// bond_main.c, `__bond_xmit_hash` then `bond_ip_hash`):
///
/// ```text
/// hash  = ports            (the TCP header's first 4 bytes, read as a host-order u32)
/// hash ^= daddr ^ saddr    (each read as a host-order u32; IPv6: the XOR of its 4 words)
/// hash ^= hash >> 16
/// hash ^= hash >> 8
/// hash >>= 1               (layer3+4 only: drops the low bit, even ports are common)
/// slave = hash % n
/// ```
///
/// The kernel reads the network-order bytes as native words, so this uses native-endian
/// reads too: the same bytes give the same slave as on this host's kernel.
pub fn bond_l34_slave(from: SocketAddr, to: SocketAddr, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let word = |a: IpAddr| -> u32 {
        match a {
            IpAddr::V4(v4) => u32::from_ne_bytes(v4.octets()),
            IpAddr::V6(v6) => {
                let o = v6.octets();
                (0..4).fold(0, |h, k| {
                    h ^ u32::from_ne_bytes([o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]])
                })
            }
        }
    };
    let s = from.port().to_be_bytes();
    let d = to.port().to_be_bytes();
    let mut hash = u32::from_ne_bytes([s[0], s[1], d[0], d[1]]);
    hash ^= word(to.ip()) ^ word(from.ip());
    hash ^= hash >> 16;
    hash ^= hash >> 8;
    hash >>= 1;
    (hash % n as u32) as usize
}

fn ifname(index: u32) -> io::Result<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success the kernel wrote a NUL-terminated name into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// A route lookup's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RouteGot {
    oif: u32,
    prefsrc: Option<IpAddr>,
}

/// An rtnetlink socket for route lookups.
#[derive(Debug)]
struct Netlink {
    sock: netlink::Socket,
}

const RTM_GETROUTE: u16 = 26;
const RTM_NEWROUTE: u16 = 24;
/// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
const RTMSG: usize = 12;
const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_PREFSRC: u16 = 7;
const RTA_IP_PROTO: u16 = 27;
const RTA_SPORT: u16 = 28;
const RTA_DPORT: u16 = 29;

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// The `RTM_GETROUTE` request for a TCP connection `src:sport` → `dst:dport` (its sequence
/// number is set when it is sent).
fn route_request(dst: IpAddr, src: Option<IpAddr>, sport: u16, dport: u16) -> Vec<u8> {
    let (family, bits) = match dst {
        IpAddr::V4(_) => (libc::AF_INET as u8, 32u8),
        IpAddr::V6(_) => (libc::AF_INET6 as u8, 128u8),
    };
    let mut m = Vec::with_capacity(96);
    let start = netlink::begin(&mut m, RTM_GETROUTE, NLM_F_REQUEST, 0);
    let src_bits = if src.is_some() { bits } else { 0 };
    m.extend_from_slice(&[family, bits, src_bits, 0, 0, 0, 0, 0]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    put_attr(&mut m, RTA_DST, &addr_bytes(dst));
    if let Some(s) = src {
        put_attr(&mut m, RTA_SRC, &addr_bytes(s));
    }
    put_attr(&mut m, RTA_IP_PROTO, &[libc::IPPROTO_TCP as u8]);
    put_attr(&mut m, RTA_SPORT, &sport.to_be_bytes());
    put_attr(&mut m, RTA_DPORT, &dport.to_be_bytes());
    netlink::finish(&mut m, start);
    m
}

/// Reads the kernel's answer, a route (every length checked by the netlink parser).
fn parse_route_reply(m: &Msg<'_>, family_v6: bool) -> io::Result<RouteGot> {
    if m.ty != RTM_NEWROUTE {
        return Err(io::Error::other(format!(
            "rtnetlink answered with message type {}, not a route",
            m.ty
        )));
    }
    let (_, attrs) = m.split(RTMSG, "route message without its rtmsg")?;
    let mut got = RouteGot {
        oif: 0,
        prefsrc: None,
    };
    for a in attrs {
        let a = a?;
        match (a.ty, a.value) {
            (RTA_OIF, &[a, b, c, d]) => got.oif = u32::from_ne_bytes([a, b, c, d]),
            (RTA_PREFSRC, &[a, b, c, d]) if !family_v6 => {
                got.prefsrc = Some(IpAddr::from([a, b, c, d]));
            }
            (RTA_PREFSRC, v) if family_v6 => {
                if let Ok(o) = <[u8; 16]>::try_from(v) {
                    got.prefsrc = Some(IpAddr::from(o));
                }
            }
            _ => {}
        }
    }
    if got.oif == 0 {
        return Err(io::Error::other("the route has no output interface"));
    }
    Ok(got)
}

impl Netlink {
    fn open() -> io::Result<Netlink> {
        let sock = netlink::Socket::open(libc::NETLINK_ROUTE, false)?;
        // The kernel answers a lookup at once; this only keeps a broken one from hanging us.
        sock.set_recv_timeout(std::time::Duration::from_secs(5))?;
        Ok(Netlink { sock })
    }

    fn route_get(
        &self,
        dst: IpAddr,
        src: Option<IpAddr>,
        sport: u16,
        dport: u16,
    ) -> io::Result<RouteGot> {
        let mut req = route_request(dst, src, sport, dport);
        let mut buf = [0u8; 8192];
        let mut got = None;
        self.sock.request(&mut req, &mut buf, |m| {
            got = Some(parse_route_reply(m, dst.is_ipv6())?);
            Ok(())
        })?;
        got.ok_or_else(|| io::Error::other("rtnetlink gave no route"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's formula written out byte by byte as a little-endian machine computes
    /// it (the lab machines and CI are x86_64), independent of the native-endian reads
    /// above: ports and addresses as their network-order bytes laid into a u32 low byte
    /// first.
    fn kernel_l34_le(s: [u8; 4], d: [u8; 4], sport: u16, dport: u16, n: u32) -> u32 {
        let le = |b: [u8; 4]| {
            u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16 | u32::from(b[3]) << 24
        };
        let sp = sport.to_be_bytes();
        let dp = dport.to_be_bytes();
        let mut h = le([sp[0], sp[1], dp[0], dp[1]]);
        h ^= le(d) ^ le(s);
        h ^= h >> 16;
        h ^= h >> 8;
        (h >> 1) % n
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn the_bond_hash_is_the_kernels_layer3_4_formula() {
        let s = [198, 19, 0, 1];
        let d = [198, 19, 0, 2];
        for (sport, dport, n) in [
            (40000u16, 31337u16, 4u32),
            (1, 2, 2),
            (65535, 80, 3),
            (12345, 443, 8),
        ] {
            let from = SocketAddr::from((s, sport));
            let to = SocketAddr::from((d, dport));
            assert_eq!(
                bond_l34_slave(from, to, n as usize) as u32,
                kernel_l34_le(s, d, sport, dport, n),
                "{from} -> {to} over {n}"
            );
        }
    }

    #[test]
    fn a_worked_example_of_the_bond_hash() {
        // 10.0.0.1:1000 -> 10.0.0.2:2000 over 2 slaves, on a little-endian host:
        // ports bytes 03 e8 07 d0 -> 0xd007e803; addresses 0x0100000a ^ 0x0200000a =
        // 0x03000000; hash 0xd307e803; ^>>16 -> 0xd3073b04; ^>>8 -> 0xd3d43c3f;
        // >>1 -> 0x69ea1e1f, odd: slave 1.
        let from: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let to: SocketAddr = "10.0.0.2:2000".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(bond_l34_slave(from, to, 2), 1);
            assert_eq!(bond_l34_slave(from, to, 3), (0x69ea_1e1f_u32 % 3) as usize);
        }
        // One slave (or none) is slave 0.
        assert_eq!(bond_l34_slave(from, to, 1), 0);
        assert_eq!(bond_l34_slave(from, to, 0), 0);
    }

    #[test]
    fn ipv6_addresses_fold_to_one_word() {
        let from: SocketAddr = "[fd00:19::1]:40000".parse().unwrap();
        let to: SocketAddr = "[fd00:19::2]:31337".parse().unwrap();
        let v4from = SocketAddr::from(([0, 0, 0, 0], 40000));
        // fd00:0019:0:0:0:0:0:1 ^ ...:2 folds to (fd 00 00 19) ^ (00 00 00 01) ^ (00 00 00 02)
        // per word position, the same as IPv4 addresses of those folded bytes.
        let f = |o: [u8; 16]| {
            let mut w = [0u8; 4];
            for k in 0..16 {
                w[k % 4] ^= o[k];
            }
            w
        };
        let IpAddr::V6(a) = from.ip() else { panic!() };
        let IpAddr::V6(b) = to.ip() else { panic!() };
        let from4 = SocketAddr::from((f(a.octets()), 40000));
        let to4 = SocketAddr::from((f(b.octets()), 31337));
        let _ = v4from;
        for n in 1..9 {
            assert_eq!(bond_l34_slave(from, to, n), bond_l34_slave(from4, to4, n));
        }
    }

    #[test]
    fn the_route_request_carries_the_connections_tuple() {
        let m = route_request(
            "198.19.0.2".parse().unwrap(),
            Some("198.19.0.1".parse().unwrap()),
            40000,
            31337,
        );
        assert_eq!(m.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), RTM_GETROUTE);
        assert_eq!(&m[16..19], &[libc::AF_INET as u8, 32, 32]);
        let tail = &m[28..];
        // RTA_DST, RTA_SRC (8 bytes each), RTA_IP_PROTO (8 with padding), SPORT, DPORT.
        assert_eq!(&tail[4..8], &[198, 19, 0, 2]);
        assert_eq!(&tail[12..16], &[198, 19, 0, 1]);
        assert_eq!(tail[20], libc::IPPROTO_TCP as u8);
        assert_eq!(&tail[28..30], &40000u16.to_be_bytes());
        assert_eq!(&tail[36..38], &31337u16.to_be_bytes());
    }

    #[test]
    fn replies_are_read_with_every_length_checked() {
        let mut r = Vec::new();
        let start = netlink::begin(&mut r, RTM_NEWROUTE, 0, 1);
        r.extend_from_slice(&[libc::AF_INET as u8, 32, 0, 0, 254, 0, 0, 1, 0, 0, 0, 0]);
        put_attr(&mut r, RTA_OIF, &7u32.to_ne_bytes());
        put_attr(&mut r, RTA_PREFSRC, &[198, 19, 0, 1]);
        netlink::finish(&mut r, start);
        let read = |b: &[u8]| -> io::Result<RouteGot> {
            let (m, _) = Msg::parse(b)?;
            parse_route_reply(&m, false)
        };
        assert_eq!(
            read(&r).unwrap(),
            RouteGot {
                oif: 7,
                prefsrc: Some("198.19.0.1".parse().unwrap())
            }
        );
        let len = r.len() as u32;
        for cut in 0..r.len() {
            let mut c = r[..cut].to_vec();
            if cut >= 4 {
                c[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            }
            match read(&c) {
                // Cut between the two attributes: a whole message with only the first.
                Ok(g) => assert!(
                    cut == 36 && g.oif == 7 && g.prefsrc.is_none(),
                    "cut at {cut}"
                ),
                Err(_) => assert_ne!(cut, 36),
            }
            // The declared length past the bytes there: refused.
            if cut >= 6 {
                let mut c = r[..cut].to_vec();
                c[0..4].copy_from_slice(&(len).to_ne_bytes());
                assert!(read(&c).is_err(), "cut at {cut}, full length");
            }
        }
        // An answer of another kind (the kernel's refusals are the netlink socket's to turn
        // into errors) is not read as a route.
        let mut e = Vec::new();
        netlink::emit_ack(&mut e, RTM_GETROUTE, 1, libc::ENETUNREACH);
        assert!(read(&e).is_err());
    }

    #[test]
    fn a_route_lookup_asks_the_kernel() {
        // Loopback is up in every namespace: 127.0.0.1 is reached by it, from itself.
        let nl = Netlink::open().unwrap();
        let lo = "127.0.0.1".parse().unwrap();
        let r = nl.route_get(lo, None, 40000, 9).unwrap();
        assert!(r.oif != 0 && ifname(r.oif).is_ok(), "{r:?}");
        assert_eq!(r.prefsrc, Some(lo));
        // Asked again with the source given: the same way out.
        assert_eq!(nl.route_get(lo, Some(lo), 40001, 9).unwrap().oif, r.oif);
    }
}
