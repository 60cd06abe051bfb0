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
    fd: std::os::fd::OwnedFd,
}

const RTM_GETROUTE: u16 = 26;
const RTM_NEWROUTE: u16 = 24;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_PREFSRC: u16 = 7;
const RTA_IP_PROTO: u16 = 27;
const RTA_SPORT: u16 = 28;
const RTA_DPORT: u16 = 29;

fn put_attr(msg: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(data);
    while !msg.len().is_multiple_of(4) {
        msg.push(0);
    }
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// The `RTM_GETROUTE` request for a TCP connection `src:sport` → `dst:dport`.
fn route_request(dst: IpAddr, src: Option<IpAddr>, sport: u16, dport: u16, seq: u32) -> Vec<u8> {
    let (family, bits) = match dst {
        IpAddr::V4(_) => (libc::AF_INET as u8, 32u8),
        IpAddr::V6(_) => (libc::AF_INET6 as u8, 128u8),
    };
    let mut m = vec![0u8; 16];
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32)
    m.extend_from_slice(&[
        family,
        bits,
        if src.is_some() { bits } else { 0 },
        0,
        0,
        0,
        0,
        0,
    ]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    put_attr(&mut m, RTA_DST, &addr_bytes(dst));
    if let Some(s) = src {
        put_attr(&mut m, RTA_SRC, &addr_bytes(s));
    }
    put_attr(&mut m, RTA_IP_PROTO, &[libc::IPPROTO_TCP as u8]);
    put_attr(&mut m, RTA_SPORT, &sport.to_be_bytes());
    put_attr(&mut m, RTA_DPORT, &dport.to_be_bytes());
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&RTM_GETROUTE.to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m
}

/// Reads the kernel's answer (one netlink message; the kernel's, so trusted to be well
/// formed, but every length is still checked against the buffer).
fn parse_route_reply(b: &[u8], family_v6: bool) -> io::Result<RouteGot> {
    let bad = || io::Error::other("malformed rtnetlink answer");
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let len = u32_at(0).ok_or_else(bad)? as usize;
    let ty = u16_at(4).ok_or_else(bad)?;
    if len > b.len() || len < 16 {
        return Err(bad());
    }
    if ty == NLMSG_ERROR {
        let errno = u32_at(16).ok_or_else(bad)? as i32;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    if ty != RTM_NEWROUTE {
        return Err(bad());
    }
    let mut at = 16 + 12;
    let mut got = RouteGot {
        oif: 0,
        prefsrc: None,
    };
    while at + 4 <= len {
        let alen = usize::from(u16_at(at).ok_or_else(bad)?);
        let aty = u16_at(at + 2).ok_or_else(bad)?;
        if alen < 4 || at + alen > len {
            return Err(bad());
        }
        let data = &b[at + 4..at + alen];
        match aty {
            RTA_OIF if data.len() == 4 => {
                got.oif = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
            }
            RTA_PREFSRC if !family_v6 && data.len() == 4 => {
                got.prefsrc = Some(IpAddr::from([data[0], data[1], data[2], data[3]]));
            }
            RTA_PREFSRC if family_v6 && data.len() == 16 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(data);
                got.prefsrc = Some(IpAddr::from(o));
            }
            _ => {}
        }
        at += (alen + 3) & !3;
    }
    if at < len {
        // 1 to 3 bytes after the last attribute: a header cut short.
        return Err(bad());
    }
    if got.oif == 0 {
        return Err(io::Error::other("the route has no output interface"));
    }
    Ok(got)
}

impl Netlink {
    fn open() -> io::Result<Netlink> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(Netlink { fd })
    }

    fn route_get(
        &self,
        dst: IpAddr,
        src: Option<IpAddr>,
        sport: u16,
        dport: u16,
    ) -> io::Result<RouteGot> {
        use std::os::fd::AsRawFd;
        let req = route_request(dst, src, sport, dport, u32::from(sport) + 1);
        // SAFETY: `req` is a valid buffer of its length; the kernel is the destination.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 8192];
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        parse_route_reply(&buf[..n as usize], dst.is_ipv6())
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
            7,
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
        let mut r = vec![0u8; 16];
        r.extend_from_slice(&[libc::AF_INET as u8, 32, 0, 0, 254, 0, 0, 1, 0, 0, 0, 0]);
        put_attr(&mut r, RTA_OIF, &7u32.to_ne_bytes());
        put_attr(&mut r, RTA_PREFSRC, &[198, 19, 0, 1]);
        let len = r.len() as u32;
        r[0..4].copy_from_slice(&len.to_ne_bytes());
        r[4..6].copy_from_slice(&RTM_NEWROUTE.to_ne_bytes());
        assert_eq!(
            parse_route_reply(&r, false).unwrap(),
            RouteGot {
                oif: 7,
                prefsrc: Some("198.19.0.1".parse().unwrap())
            }
        );
        for cut in 0..r.len() {
            let mut c = r[..cut].to_vec();
            if cut >= 4 {
                c[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            }
            match parse_route_reply(&c, false) {
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
                assert!(
                    parse_route_reply(&c, false).is_err(),
                    "cut at {cut}, full length"
                );
            }
        }
        let mut e = vec![0u8; 20];
        e[0..4].copy_from_slice(&20u32.to_ne_bytes());
        e[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        e[16..20].copy_from_slice(&(-libc::ENETUNREACH).to_ne_bytes());
        assert_eq!(
            parse_route_reply(&e, false).unwrap_err().raw_os_error(),
            Some(libc::ENETUNREACH)
        );
    }
}
