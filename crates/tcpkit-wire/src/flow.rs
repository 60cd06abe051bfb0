//! Flow keys (tcpreplay's flow counting), connection keys for sharding a capture over threads
//! and over hosts (`replay --shard`), `--unique-ip` and `--unique-ports`.
//!
//! tcpreplay 4.4.3 (`src/common/flows.c`) counts a packet as a *flow packet* when it is IPv4
//! or IPv6 of any protocol; everything else (ARP, LLDP, ...) is a *non-flow* packet. Its key
//! is (src ip, dst ip, protocol, src port, dst port), direction-specific, with TCP/UDP ports,
//! ICMP/ICMPv6 (type, code) in the port slots, and 0/0 for other protocols. [`flow_key`]
//! follows that, IP found through VLAN tags and MPLS (Ethernet over MPLS included) as
//! tcpreplay finds it, with four deliberate differences: it is exact (tcpreplay hashes, then
//! compares the entry); it skips every IPv6 extension header (tcpreplay only hop-by-hop);
//! non-first fragments, or packets whose L4 header is cut short, get ports 0/0 where
//! tcpreplay reads payload bytes or calls the packet invalid; and an IPv6 frame is a flow
//! packet whatever its MAC, where tcpreplay 4.4.3 checks the IP version in the *first byte of
//! the frame* (the destination MAC) and so files every IPv6 frame whose destination MAC does
//! not start with the nibble 6 (33:33:..., 00:...) as a non-flow packet.

use std::net::IpAddr;

use crate::parse::{
    self, be16, ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP,
};
use crate::rewrite::read_addr;

/// Direction-specific 5-tuple of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// IPv4/IPv6 source address.
    pub src: IpAddr,
    /// IPv4/IPv6 destination address.
    pub dst: IpAddr,
    /// IP protocol number (IPv6: the last next-header after the extension headers).
    pub proto: u8,
    /// TCP/UDP source port, ICMP/ICMPv6 type; 0 for other protocols, non-first fragments and cut
    /// L4 headers.
    pub src_port: u16,
    /// TCP/UDP destination port, ICMP/ICMPv6 code; 0 as for `src_port`.
    pub dst_port: u16,
}

/// The same for both directions of a connection: the lower (ip, port) endpoint first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    /// The lower (address, port) endpoint.
    pub a: (IpAddr, u16),
    /// The higher (address, port) endpoint.
    pub b: (IpAddr, u16),
    /// IP protocol number.
    pub proto: u8,
}

impl FlowKey {
    /// The key both directions of this packet's connection share.
    pub fn connection(&self) -> ConnKey {
        let s = (self.src, self.src_port);
        let d = (self.dst, self.dst_port);
        let (a, b) = if s <= d { (s, d) } else { (d, s) };
        ConnKey {
            a,
            b,
            proto: self.proto,
        }
    }

    /// The key of the opposite direction.
    pub fn reversed(&self) -> FlowKey {
        FlowKey {
            src: self.dst,
            dst: self.src,
            proto: self.proto,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

/// The exact flow key of an Ethernet frame; `None` for non-IP ("non-flow") frames.
pub fn flow_key(frame: &[u8]) -> Option<FlowKey> {
    key_of(frame).map(|(k, _)| k)
}

/// [`flow_key`], and whether the packet is a fragment (first or later) of a datagram.
fn key_of(frame: &[u8]) -> Option<(FlowKey, bool)> {
    let ip = parse::ip(frame)?;
    let (s, d) = if ip.v6 { (8, 24) } else { (12, 16) };
    let src = read_addr(frame, ip.off + s, ip.v6)?;
    let dst = read_addr(frame, ip.off + d, ip.v6)?;
    let (src_port, dst_port) = match ip.proto {
        _ if !ip.has_l4 => (0, 0),
        PROTO_TCP | PROTO_UDP => match ip.ports_at(frame) {
            Some(at) => (be16(frame, at)?, be16(frame, at + 2)?),
            None => (0, 0),
        },
        PROTO_ICMP | PROTO_ICMPV6 if ip.l4 + 2 <= ip.end => {
            (u16::from(frame[ip.l4]), u16::from(frame[ip.l4 + 1]))
        }
        _ => (0, 0),
    };
    let key = FlowKey {
        src,
        dst,
        proto: ip.proto,
        src_port,
        dst_port,
    };
    Some((key, ip.fragmented))
}

/// How tcpreplay 4.4.3's `flow_decode` files a packet (src/common/flows.c), which decides
/// which of its `Flows:` counts the packet lands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowClass {
    /// IPv4 or IPv6 (through VLAN tags and MPLS): a flow packet with this key.
    Flow(FlowKey),
    /// A link header tcpreplay can walk with something other than IP behind it (ARP, LLDP,
    /// ...): a "non-flow packet".
    NonFlow,
    /// A link header tcpreplay cannot walk (shorter than its headers, an 802.3 length field
    /// instead of an ethertype, an MPLS GACH label or an unknown payload under the bottom
    /// label) or an IP header cut short: counted in neither (its "invalid" packets).
    Invalid,
}

/// [`flow_key`], with what tcpreplay does with packets that have none.
pub fn flow_class(frame: &[u8]) -> FlowClass {
    let Some((et, off)) = parse::ethernet(frame) else {
        return FlowClass::Invalid;
    };
    if let Some(k) = flow_key(frame) {
        return FlowClass::Flow(k);
    }
    match et {
        0..0x600 => FlowClass::Invalid,
        ETHERTYPE_IPV4 if frame.len() < off + 20 => FlowClass::Invalid,
        ETHERTYPE_IPV6 if frame.len() < off + 40 => FlowClass::Invalid,
        _ => FlowClass::NonFlow,
    }
}

/// A 64-bit hash equal for both directions of a connection, for sharding a capture over
/// threads (not a key: collisions only put two connections on one thread). Non-IP frames
/// hash their unordered MAC pair.
pub fn shard_hash(frame: &[u8]) -> u64 {
    match flow_key(frame) {
        Some(k) => conn_hash(&k.connection()),
        None => {
            let (Some(d), Some(s)) = (frame.get(0..6), frame.get(6..12)) else {
                return 0;
            };
            let (x, y) = if d <= s { (d, s) } else { (s, d) };
            let mut h = Fnv::default();
            h.write(x);
            h.write(y);
            h.finish()
        }
    }
}

/// Which of `n` hosts sends this frame when they share one replay (`replay --shard K/N`):
/// 1 to `n`, the same for both directions of a connection, so no flow is split between hosts.
/// The key is the connection's: addresses, protocol and TCP/UDP ports. Protocols without ports
/// (an ICMP request and its reply alike) and fragments of a datagram (later fragments carry no
/// ports) go by addresses and protocol alone. Frames that are not IP go to host 1. The hash's
/// top bits choose the host, where [`shard_hash`] modulo a thread count uses its low ones, so
/// a host's flows still spread over its threads.
pub fn flow_shard(frame: &[u8], n: u32) -> u32 {
    if n <= 1 {
        return 1;
    }
    let Some((k, fragmented)) = key_of(frame) else {
        return 1;
    };
    let k = if matches!(k.proto, PROTO_TCP | PROTO_UDP) && !fragmented {
        k
    } else {
        FlowKey {
            src_port: 0,
            dst_port: 0,
            ..k
        }
    };
    let h = conn_hash(&k.connection());
    // Lemire's multiply-shift: the top bits of h, spread over 0..n without a division.
    ((u128::from(h) * u128::from(n)) >> 64) as u32 + 1
}

/// The 64-bit hash of a connection key.
fn conn_hash(c: &ConnKey) -> u64 {
    let mut h = Fnv::default();
    for (ip, port) in [c.a, c.b] {
        match ip {
            IpAddr::V4(a) => h.write(&a.octets()),
            IpAddr::V6(a) => h.write(&a.octets()),
        }
        h.write(&port.to_be_bytes());
    }
    h.write(&[c.proto]);
    h.finish()
}

/// FNV-1a with a final avalanche (splitmix64), so the low bits spread well when the caller
/// takes the hash modulo a small thread count.
#[derive(Debug)]
struct Fnv(u64);
impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}
impl Fnv {
    fn write(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// tcpreplay `--unique-ip`: make loop `loop_no`'s flows new flows, with tcpreplay 4.4.3's
/// mapping (src/send_packets.c, `fast_edit_packet`), so both count the same flows on the same
/// capture.
///
/// Of the two addresses (IPv4, or the low 32 bits of IPv6, read as big-endian u32) the higher
/// moves up by `loop_no` and the lower down (wrapping, one step less where exactly one of them
/// wraps). Both directions of a connection move alike, so they stay one connection; loop 0 is
/// the identity. The two moves cancel in the one's-complement sum, so the IPv4 header, TCP, UDP
/// and ICMPv6 checksums stay right with no update, as in tcpreplay. IP is found as the
/// rewriter finds it (through VLAN tags and MPLS); ARP, other non-IP frames and cut headers
/// are left alone (tcpreplay drops those from every loop after the first: we send them).
pub fn unique_ip(frame: &mut [u8], loop_no: u32) {
    if loop_no == 0 {
        return;
    }
    let Some(ip) = parse::ip(frame) else { return };
    // The low 32 bits of each address.
    let (s, d) = if ip.v6 {
        (ip.off + 8 + 12, ip.off + 24 + 12)
    } else {
        (ip.off + 12, ip.off + 16)
    };
    let (Some(src), Some(dst)) = (be32(frame, s), be32(frame, d)) else {
        return;
    };
    let (new_src, new_dst) = unique_pair(src, dst, loop_no);
    frame[s..s + 4].copy_from_slice(&new_src.to_be_bytes());
    frame[d..d + 4].copy_from_slice(&new_dst.to_be_bytes());
}

/// `--unique-ports`' step per loop: loop `i` moves a port by `i * 3979` within 1024-65535.
/// 3979 is prime to the range's 64512 ports (so a port comes back only after 64512 loops),
/// and of such steps below 20000 it keeps the loops of one port farthest apart from each other
/// for longest: for loops less than 989 apart the moved ports differ by more than 64, so the
/// neighbouring ephemeral ports one client used for its next connections (p+1, p+2...) are not
/// met by another loop of this connection.
pub const UNIQUE_PORT_STEP: u32 = 3979;
const EPHEMERAL_FIRST: u32 = 1024;
const EPHEMERAL_SPAN: u32 = 65536 - EPHEMERAL_FIRST;

/// `--unique-ports`: make loop `loop_no`'s TCP and UDP flows new flows by their client port,
/// leaving addresses and the service port as captured.
///
/// Of a packet's two ports the higher is taken as the client's (ephemeral) port, the lower as
/// the service's: that choice depends only on the pair, so both directions of a connection
/// move the same port and stay one connection. It moves to `1024 + (p − 1024 + loop_no ×
/// 3979) mod 64512` (a port below 1024, where both are service ports, counts from 1024 as if
/// it were `p + 64512`); when the two ports are equal both move. Loop 0 is the identity. The
/// TCP or UDP checksum is updated for the changed field (RFC 1624, as the rewriter does for
/// `--portmap`: a zero UDP checksum over IPv4 stays "none"). Non-first fragments, cut headers
/// and other protocols are left alone.
pub fn unique_ports(frame: &mut [u8], loop_no: u32) {
    if loop_no == 0 {
        return;
    }
    let Some(ip) = parse::ip(frame) else { return };
    let Some(at) = ip.ports_at(frame) else { return };
    let (Some(sp), Some(dp)) = (be16(frame, at), be16(frame, at + 2)) else {
        return;
    };
    let hi = sp.max(dp);
    let moved = unique_port(hi, loop_no).to_be_bytes();
    for (field, port) in [(at, sp), (at + 2, dp)] {
        if port == hi {
            crate::rewrite::set_l4_field(frame, &ip, field, &moved);
        }
    }
}

/// Where `--unique-ports` moves port `p` in loop `i` (see [`unique_ports`]).
pub fn unique_port(p: u16, i: u32) -> u16 {
    let base = (u32::from(p) + EPHEMERAL_SPAN - EPHEMERAL_FIRST) % EPHEMERAL_SPAN;
    let step = (u64::from(i) * u64::from(UNIQUE_PORT_STEP) % u64::from(EPHEMERAL_SPAN)) as u32;
    (EPHEMERAL_FIRST + (base + step) % EPHEMERAL_SPAN) as u16
}

/// tcpreplay's per-loop address pair (its "CRC compensations for wrap conditions" included:
/// 2^32 is 1 in the one's-complement sum, so a lone wrap is undone by one step back).
fn unique_pair(src: u32, dst: u32, i: u32) -> (u32, u32) {
    if dst > src {
        let (mut s, mut d) = (src.wrapping_sub(i), dst.wrapping_add(i));
        if s > src && d > dst {
            s = s.wrapping_sub(1);
        } else if d < dst && s < src {
            d = d.wrapping_add(1);
        }
        (s, d)
    } else {
        let (mut s, mut d) = (src.wrapping_add(i), dst.wrapping_sub(i));
        if d > dst && s > src {
            d = d.wrapping_sub(1);
        } else if s < src && d < dst {
            s = s.wrapping_add(1);
        }
        (s, d)
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp4(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16) -> Vec<u8> {
        let mut b = vec![0u8; 54];
        b[12..14].copy_from_slice(&[8, 0]);
        b[14..24].copy_from_slice(&[0x45, 0, 0, 40, 0, 1, 0, 0, 64, 6]);
        b[26..30].copy_from_slice(&src);
        b[30..34].copy_from_slice(&dst);
        b[34..36].copy_from_slice(&sp.to_be_bytes());
        b[36..38].copy_from_slice(&dp.to_be_bytes());
        b[46] = 0x50;
        let ip = parse::ip(&b).unwrap();
        crate::rewrite::fix_checksums(&mut b, &ip);
        b
    }

    fn valid(b: &[u8]) -> bool {
        let mut c = b.to_vec();
        crate::Rewriter::new(crate::RewriteConfig {
            fixcsum: true,
            ..Default::default()
        })
        .apply(&mut c)
        .unwrap();
        c == b
    }

    #[test]
    fn keys_and_connections() {
        let a = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1234, 80);
        let b = tcp4([10, 0, 0, 2], [10, 0, 0, 1], 80, 1234);
        let (ka, kb) = (flow_key(&a).unwrap(), flow_key(&b).unwrap());
        assert_ne!(ka, kb);
        assert_eq!(ka.reversed(), kb);
        assert_eq!(ka.connection(), kb.connection());
        assert_eq!((ka.src_port, ka.dst_port, ka.proto), (1234, 80, 6));
        assert_eq!(shard_hash(&a), shard_hash(&b));
        assert_ne!(
            shard_hash(&a),
            shard_hash(&tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1235, 80))
        );
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[8, 6]);
        assert_eq!(flow_key(&arp), None);
        assert_eq!(flow_class(&arp), FlowClass::NonFlow);
        assert_eq!(flow_class(&a), FlowClass::Flow(ka));
        // 802.3 (a length, not an ethertype), a cut Ethernet header, a cut IP header.
        let mut llc = arp.clone();
        llc[12..14].copy_from_slice(&[0, 40]);
        assert_eq!(flow_class(&llc), FlowClass::Invalid);
        assert_eq!(flow_class(&a[..13]), FlowClass::Invalid);
        assert_eq!(flow_class(&a[..30]), FlowClass::Invalid);
        let mut arp2 = arp.clone();
        arp2[0..6].copy_from_slice(&[1; 6]);
        let mut arp3 = arp.clone();
        arp3[6..12].copy_from_slice(&[1; 6]);
        assert_eq!(shard_hash(&arp2), shard_hash(&arp3));
    }

    /// The one's-complement sum of a pair of addresses' 16-bit words, as checksums see them.
    fn ones_sum(a: u32, b: u32) -> u32 {
        let mut acc = (a >> 16) + (a & 0xffff) + (b >> 16) + (b & 0xffff);
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc
    }

    #[test]
    fn unique_pair_keeps_the_checksum_sum_and_wraps_as_tcpreplay() {
        for (s, d) in [
            (1u32, 2u32),
            (2, 1),
            (0, 0xffff_ffff),
            (0xffff_fff0, 5),
            (7, 7),
            (0x0a00_0001, 0xc0a8_0101),
        ] {
            for i in [1u32, 2, 16, 1000, 0x8000_0000] {
                let (a, b) = unique_pair(s, d, i);
                assert_eq!(ones_sum(a, b), ones_sum(s, d), "{s:#x} {d:#x} loop {i}");
                // The reverse direction maps to the same pair, reversed (a host talking to
                // itself is one address and takes the second branch both ways).
                if s != d {
                    assert_eq!(unique_pair(d, s, i), (b, a), "{s:#x} {d:#x} loop {i}");
                }
            }
        }
        // tcpreplay's own numbers: loop 3 of 10.0.0.1 -> 10.0.0.9.
        assert_eq!(
            unique_pair(0x0a00_0001, 0x0a00_0009, 3),
            (0x09ff_fffe, 0x0a00_000c)
        );
        // The lower address wraps below zero: one step back keeps the sum.
        assert_eq!(unique_pair(1, 10, 3), (0xffff_fffd, 13));
    }

    #[test]
    fn unique_ip_is_consistent() {
        let a = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1234, 80);
        let b = tcp4([10, 0, 0, 2], [10, 0, 0, 1], 80, 1234);
        let mut a0 = a.clone();
        unique_ip(&mut a0, 0);
        assert_eq!(a0, a);
        let (mut a1, mut b1) = (a.clone(), b.clone());
        unique_ip(&mut a1, 1);
        unique_ip(&mut b1, 1);
        assert_ne!(a1, a);
        // tcpreplay's mapping: the lower address down, the higher up.
        assert_eq!(&a1[26..34], &[10, 0, 0, 0, 10, 0, 0, 3]);
        assert_eq!(&b1[26..34], &[10, 0, 0, 3, 10, 0, 0, 0]);
        assert!(valid(&a1) && valid(&b1));
        assert_eq!(
            flow_key(&a1).unwrap().connection(),
            flow_key(&b1).unwrap().connection()
        );
        assert_ne!(
            flow_key(&a1).unwrap().connection(),
            flow_key(&a).unwrap().connection()
        );
        for n in 0..a.len() {
            let mut c = a[..n].to_vec();
            unique_ip(&mut c, 7);
            let _ = shard_hash(&c);
        }
    }

    /// Issue 28: --unique-ports moves the client (higher) port of both directions alike,
    /// keeps the service port and the addresses, and leaves the checksum right.
    #[test]
    fn unique_ports_moves_the_client_port_of_both_directions() {
        let a = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 40000, 80);
        let b = tcp4([10, 0, 0, 2], [10, 0, 0, 1], 80, 40000);
        let mut a0 = a.clone();
        unique_ports(&mut a0, 0);
        assert_eq!(a0, a);
        let mut seen = std::collections::HashSet::new();
        for i in 1..=300u32 {
            let (mut ai, mut bi) = (a.clone(), b.clone());
            unique_ports(&mut ai, i);
            unique_ports(&mut bi, i);
            let p = 1024 + (40000 - 1024 + i * UNIQUE_PORT_STEP) % 64512;
            assert_eq!(u16::from_be_bytes([ai[34], ai[35]]), p as u16);
            assert_eq!(&ai[36..38], &80u16.to_be_bytes());
            assert_eq!(&ai[26..34], &a[26..34]);
            assert!(valid(&ai) && valid(&bi), "loop {i}");
            let k = flow_key(&ai).unwrap().connection();
            assert_eq!(k, flow_key(&bi).unwrap().connection());
            assert!(seen.insert(k), "loop {i} repeats a flow");
        }
        // Equal ports move together; a pair of service ports moves its higher one.
        let mut e = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 123, 123);
        unique_ports(&mut e, 1);
        assert_eq!(&e[34..38], &[&e[36..38], &e[36..38]].concat()[..]);
        assert_eq!(
            unique_port(123, 1),
            (1024 + (123 + 63488 + 3979) % 64512) as u16
        );
        assert_eq!(unique_port(65535, 64512), 65535);
        // A zero UDP checksum stays zero; cut frames are left alone.
        let mut u = ip4(17, 0, [10, 0, 0, 1], [10, 0, 0, 2], 5000, 53);
        unique_ports(&mut u, 2);
        assert_eq!(&u[40..42], &[0, 0]);
        assert_ne!(&u[34..36], &5000u16.to_be_bytes());
        for n in 0..a.len() {
            let mut c = a[..n].to_vec();
            unique_ports(&mut c, 7);
        }
    }

    /// An IPv4 frame of `proto` with the fragment field `frag` and 8 bytes of L4 header
    /// (ports `sp`/`dp`, or ICMP type/code in their place).
    fn ip4(proto: u8, frag: u16, src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16) -> Vec<u8> {
        let mut b = vec![0u8; 42];
        b[12..14].copy_from_slice(&[8, 0]);
        b[14..24].copy_from_slice(&[0x45, 0, 0, 28, 0, 1, 0, 0, 64, proto]);
        b[20..22].copy_from_slice(&frag.to_be_bytes());
        b[26..30].copy_from_slice(&src);
        b[30..34].copy_from_slice(&dst);
        b[34..36].copy_from_slice(&sp.to_be_bytes());
        b[36..38].copy_from_slice(&dp.to_be_bytes());
        b
    }

    /// Issue 25: hosts sharing a replay split it by connection: both directions on one host,
    /// ICMP requests with their replies, every fragment of a datagram together, the rest
    /// (not IP) on host 1; connections spread evenly, and a host's still spread over its
    /// threads.
    #[test]
    fn hosts_share_a_capture_by_connection() {
        let (c, s) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        for n in [2, 3, 7] {
            let a = tcp4(c, s, 40_000, 80);
            let b = tcp4(s, c, 80, 40_000);
            assert_eq!(flow_shard(&a, n), flow_shard(&b, n));
            let req = ip4(PROTO_ICMP, 0, c, s, 0x0800, 0x1234);
            let rep = ip4(PROTO_ICMP, 0, s, c, 0x0000, 0x1234);
            assert_eq!(flow_shard(&req, n), flow_shard(&rep, n));
            // First fragment (MF, offset 0: ports readable) and a later one (offset 185).
            let first = ip4(PROTO_UDP, 0x2000, c, s, 5353, 53);
            let later = ip4(PROTO_UDP, 185, c, s, 0xdead, 0xbeef);
            assert_eq!(flow_shard(&first, n), flow_shard(&later, n));
            let mut arp = vec![0u8; 42];
            arp[12..14].copy_from_slice(&[8, 6]);
            assert_eq!(flow_shard(&arp, n), 1);
            assert_eq!(flow_shard(&a[..13], n), 1);
        }
        assert_eq!(flow_shard(&tcp4(c, s, 1, 2), 1), 1);
        assert_eq!(flow_shard(&tcp4(c, s, 1, 2), 0), 1);
        // 3000 connections over 3 hosts: about 1000 each; the host 1 of 2 ones over 2 threads
        // by shard_hash: about half each (top bits for hosts, low bits for threads).
        let mut hosts = [0u32; 3];
        let mut threads = [0u32; 2];
        for p in 0..3000u16 {
            let f = tcp4(c, s, 10_000 + p, 443);
            let h = flow_shard(&f, 3);
            assert!((1..=3).contains(&h));
            hosts[h as usize - 1] += 1;
            if flow_shard(&f, 2) == 1 {
                threads[(shard_hash(&f) % 2) as usize] += 1;
            }
        }
        assert!(hosts.iter().all(|&n| (850..1150).contains(&n)), "{hosts:?}");
        let on_one: u32 = threads.iter().sum();
        assert!(threads.iter().all(|&n| n * 10 > on_one * 4), "{threads:?}");
    }
}
