//! The per-frame rewriter of `tcpkit replay`, matched against Debian's tcprewrite 4.4.3.
//!
//! Behaviours of tcprewrite 4.4.3 found by running it on generated captures and matched here
//! (the test `tests/tcprewrite.rs` compares byte for byte, option by option):
//! - `--enet-smac/--enet-dmac` set the MACs of every Ethernet II frame, ARP included; 802.3
//!   (length-field) frames are left alone, also by VLAN add.
//! - `--enet-vlan add` pushes a new outermost 802.1Q tag (TCI = pri<<13 | cfi<<12 | tag) on
//!   every frame, even an already tagged one; `del` removes the outermost 802.1Q tag.
//!   tcprewrite corrupts frames unless all of `--enet-vlan-tag/-pri/-cfi` are given, so
//!   [`VlanEdit::Add`] always carries all three.
//! - Every IP edit finds the IP header as tcprewrite does: past 802.1Q/802.1ad tags and MPLS
//!   label stacks, IPv4/IPv6 directly under the bottom label and IP inside Ethernet over MPLS
//!   (control word, inner Ethernet header) alike (`parse::ethernet`). MAC and VLAN edits are
//!   made on the outer Ethernet header.
//! - `--srcipmap/--dstipmap` rewrite IPv4 and IPv6 source / destination addresses (not ARP);
//!   the first matching rule wins; host bits below the *target* prefix are kept. IPv6 rules
//!   must be written `[2001:db8::/32]:[2001:db9::/32]`: tcprewrite silently ignores the
//!   `[2001:db8::]/32` form (we accept both).
//! - `--portmap` maps both TCP and UDP ports, IPv4 and IPv6, first fragments included, later
//!   fragments untouched.
//! - `--ttl N/+N/-N` sets the IPv4 TTL and IPv6 hop limit; `+` saturates at 255, `-` stops at 1.
//! - IP header and TCP/UDP checksums follow address/port/TTL edits by incremental update
//!   (tcprewrite does the same; on a correct packet it equals a full recompute), including the
//!   first fragment's L4 checksum and truncated packets' (the field covers the original data).
//! - `--mtu-trunc --mtu N` cuts frames longer than L2 header + N, sets IPv4 total length /
//!   IPv6 payload length to what is left, and recomputes checksums over what is left.
//!   As tcprewrite, `--mtu-trunc` implies a full checksum pass on every packet.
//! - `--fixcsum` recomputes the IPv4 header checksum always; TCP, UDP (unless 0 = none) and
//!   ICMPv6 only when the whole datagram is there and it is not a fragment; ICMPv4 is not
//!   recomputed by tcprewrite 4.4.3 (it bails with "insufficient L4 data"), and neither here.
//!
//! tcprewrite 4.4.3 bugs deliberately NOT copied (tests/rewrite_oracle.rs names each as an
//! explicit exception, limited to the bytes it touches):
//! - it replaces the MACs of every IPv6 frame with 33:33:<last 4 bytes of the address>
//!   (multicast MACs), even for unicast and even with `--enet-smac/--enet-dmac`;
//! - it does not update the ICMPv6 checksum after an IPv6 address map;
//! - it recomputes IPv4 IP/TCP/UDP checksums on every packet it writes, even with no option:
//!   we leave checksums alone unless asked (`fixcsum`), so a replay is the capture unless the
//!   user asked for an edit;
//! - it sets an IPv4 total length that differs from the frame (Ethernet padding, a datagram
//!   cut by the snaplen) to the frame's length, on every packet, leaving the header checksum
//!   stale when no option recomputes it: we keep the header as captured;
//! - on Ethernet over MPLS it takes the inner Ethernet header for the frame's own: MACs are
//!   set and VLAN tags pushed or popped inside, the outer header stays as captured; ours edits
//!   the outer header (the one the switch sees), and the inner IP header as tcprewrite does;
//! - with IPv4 multicast destinations it writes 01:00:5e over the first three bytes of the
//!   source MAC (and of the destination's with `--enet-dmac`).

use crate::csum;
use crate::parse::{self, be16, IpLayout, ETHERTYPE_VLAN, ETH_HDR, PROTO_UDP};
use crate::types::{IpMap, MacAddr, PortMap, TtlEdit, VlanEdit};
use crate::WireError;

/// What to do to every frame. `Default` is the identity.
#[derive(Debug, Clone, Default)]
pub struct RewriteConfig {
    /// `--enet-smac`: Ethernet source address of every Ethernet II frame.
    pub src_mac: Option<MacAddr>,
    /// `--enet-dmac`: Ethernet destination address of every Ethernet II frame.
    pub dst_mac: Option<MacAddr>,
    /// `--srcipmap`: IPv4/IPv6 source address rules; the first that matches applies.
    pub srcipmap: Vec<IpMap>,
    /// `--dstipmap`: IPv4/IPv6 destination address rules; the first that matches applies.
    pub dstipmap: Vec<IpMap>,
    /// `--portmap`: TCP and UDP port rules, both ports of each segment.
    pub portmap: Option<PortMap>,
    /// Truncate frames so the L3 part is at most this many bytes.
    pub mtu_trunc: Option<u16>,
    /// Recompute all checksums from scratch.
    pub fixcsum: bool,
    /// `--enet-vlan`: push or pop an outermost 802.1Q tag.
    pub vlan: Option<VlanEdit>,
    /// `--ttl`: edit the IPv4 TTL / IPv6 hop limit.
    pub ttl: Option<TtlEdit>,
}

/// What [`Rewriter::apply`] did to a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RewriteOutcome {
    /// Some edit was applied (bytes may still be equal, e.g. a MAC set to its own value).
    pub edited: bool,
    /// The frame was cut by `mtu_trunc`.
    pub truncated: bool,
    /// With `mtu_trunc`: the frame is still longer than an Ethernet header plus the MTU, and why
    /// the rewriter could not make it shorter.
    pub uncut: Option<Uncut>,
}

/// Why `--mtu-trunc` left a frame longer than an Ethernet header plus `--mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uncut {
    /// Not IPv4/IPv6 (ARP, MPLS over something else, 802.3...): there is no datagram length
    /// to shorten, so tcprewrite and we leave it whole.
    NotIp,
    /// IP, cut to `--mtu` bytes from its IP header, but the link headers before it (VLAN tags,
    /// MPLS labels) are longer than Ethernet's 14 bytes, and the MTU counts them.
    LongHeaders,
}

/// Applies a [`RewriteConfig`] to Ethernet frames. Holds no per-packet state.
#[derive(Debug, Clone)]
pub struct Rewriter {
    cfg: RewriteConfig,
}

impl Rewriter {
    /// A rewriter that applies `cfg` to every frame it is given.
    pub fn new(cfg: RewriteConfig) -> Rewriter {
        Rewriter { cfg }
    }

    /// The edits this rewriter applies.
    pub fn config(&self) -> &RewriteConfig {
        &self.cfg
    }

    /// True when `apply` would leave every frame as it is.
    pub fn is_identity(&self) -> bool {
        let c = &self.cfg;
        c.src_mac.is_none()
            && c.dst_mac.is_none()
            && c.srcipmap.is_empty()
            && c.dstipmap.is_empty()
            && c.portmap.is_none()
            && c.mtu_trunc.is_none()
            && !c.fixcsum
            && c.vlan.is_none()
            && c.ttl.is_none()
    }

    /// Rewrites one Ethernet frame held in `buf` (which may grow or shrink: VLAN add/remove,
    /// MTU truncation). Checksums (IPv4 header, TCP, UDP, ICMPv6) stay right after every edit:
    /// incremental update (RFC 1624); full recompute with `fixcsum` / `mtu_trunc`.
    /// Does not allocate when `buf` has 4 bytes of spare capacity (VLAN add).
    ///
    /// Errors only when an edit is asked for and the frame has no complete Ethernet header;
    /// unknown or cut payloads are passed through.
    pub fn apply(&self, buf: &mut Vec<u8>) -> Result<RewriteOutcome, WireError> {
        let c = &self.cfg;
        let mut out = RewriteOutcome::default();
        if self.is_identity() {
            return Ok(out);
        }
        if buf.len() < ETH_HDR {
            return Err(WireError::Truncated {
                layer: "ethernet",
                offset: 0,
                need: ETH_HDR,
                have: buf.len(),
            });
        }
        out.edited = true;
        // tcprewrite leaves 802.3 frames (a length, not an ethertype, at offset 12: LLC, IS-IS,
        // STP) as they are; so do we.
        let ethernet2 = be16(buf, 12).is_some_and(|t| t >= 0x600);
        if let (Some(m), true) = (c.dst_mac, ethernet2) {
            buf[0..6].copy_from_slice(&m.0);
        }
        if let (Some(m), true) = (c.src_mac, ethernet2) {
            buf[6..12].copy_from_slice(&m.0);
        }
        match c.vlan {
            Some(VlanEdit::Add { vid, pcp, cfi }) if ethernet2 => {
                let tci = (u16::from(pcp & 7) << 13) | (u16::from(cfi) << 12) | (vid & 0x0fff);
                let len = buf.len();
                buf.resize(len + 4, 0);
                buf.copy_within(12..len, 16);
                buf[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
                buf[14..16].copy_from_slice(&tci.to_be_bytes());
            }
            Some(VlanEdit::Remove) if be16(buf, 12) == Some(ETHERTYPE_VLAN) && buf.len() >= 16 => {
                let len = buf.len();
                buf.copy_within(16..len, 12);
                buf.truncate(len - 4);
            }
            _ => {}
        }
        let Some(mut ip) = parse::ip(buf) else {
            out.uncut = self.uncut(buf, false);
            return Ok(out);
        };
        if ip.v6 {
            self.map_addrs(buf, &ip, 8, &c.srcipmap);
            self.map_addrs(buf, &ip, 24, &c.dstipmap);
        } else {
            self.map_addrs(buf, &ip, 12, &c.srcipmap);
            self.map_addrs(buf, &ip, 16, &c.dstipmap);
        }
        if let (Some(pm), Some(at)) = (&c.portmap, ip.ports_at(buf)) {
            for field in [at, at + 2] {
                let old = [buf[field], buf[field + 1]];
                if let Some(new) = pm.map(u16::from_be_bytes(old)) {
                    set_l4_field(buf, &ip, field, &new.to_be_bytes());
                }
            }
        }
        if let Some(t) = c.ttl {
            if ip.v6 {
                buf[ip.off + 7] = t.apply(buf[ip.off + 7]);
            } else {
                let old = [buf[ip.off + 8], buf[ip.off + 9]];
                let new = [t.apply(old[0]), old[1]];
                set_ipv4_field(buf, &ip, ip.off + 8, &new);
            }
        }
        if let Some(mtu) = c.mtu_trunc {
            let limit = ip.off + usize::from(mtu);
            if buf.len() > limit {
                buf.truncate(limit);
                out.truncated = true;
                // What remains is the whole (shorter) datagram: say so in its length field.
                if ip.v6 {
                    let plen = limit
                        .saturating_sub(ip.off + 40)
                        .min(usize::from(be16(buf, ip.off + 4).unwrap_or(0)));
                    if ip.off + 6 <= buf.len() {
                        buf[ip.off + 4..ip.off + 6].copy_from_slice(&(plen as u16).to_be_bytes());
                    }
                } else if ip.off + 4 <= buf.len() {
                    let tot = usize::from(be16(buf, ip.off + 2).unwrap_or(0)).min(usize::from(mtu));
                    buf[ip.off + 2..ip.off + 4].copy_from_slice(&(tot as u16).to_be_bytes());
                }
                match parse::ip(buf) {
                    Some(l) => ip = l,
                    None => {
                        out.uncut = self.uncut(buf, true);
                        return Ok(out);
                    }
                }
            }
        }
        if c.fixcsum || c.mtu_trunc.is_some() {
            fix_checksums(buf, &ip);
        }
        out.uncut = self.uncut(buf, true);
        Ok(out)
    }

    /// With `mtu_trunc`, why a frame that is still too long could not be cut.
    fn uncut(&self, buf: &[u8], ip: bool) -> Option<Uncut> {
        let mtu = usize::from(self.cfg.mtu_trunc?);
        (buf.len() > ETH_HDR + mtu).then_some(if ip { Uncut::LongHeaders } else { Uncut::NotIp })
    }

    fn map_addrs(&self, buf: &mut [u8], ip: &IpLayout, rel: usize, maps: &[IpMap]) {
        if maps.is_empty() {
            return;
        }
        let at = ip.off + rel;
        let Some(cur) = read_addr(buf, at, ip.v6) else {
            return;
        };
        if let Some(new) = maps.iter().find_map(|m| m.map(cur)) {
            match new {
                std::net::IpAddr::V4(a) => set_addr(buf, ip, at, &a.octets()),
                std::net::IpAddr::V6(a) => set_addr(buf, ip, at, &a.octets()),
            }
        }
    }
}

pub(crate) fn read_addr(buf: &[u8], at: usize, v6: bool) -> Option<std::net::IpAddr> {
    if v6 {
        let b: [u8; 16] = buf.get(at..at + 16)?.try_into().ok()?;
        Some(std::net::IpAddr::V6(b.into()))
    } else {
        let b: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
        Some(std::net::IpAddr::V4(b.into()))
    }
}

/// Writes an address (covered by the IPv4 header checksum and the L4 pseudo header).
pub(crate) fn set_addr(buf: &mut [u8], ip: &IpLayout, at: usize, new: &[u8]) {
    if !ip.v6 {
        update_csum_at(
            buf,
            ip.off + 10,
            &buf[at..at + new.len()].to_vec_in_stack(),
            new,
        );
    }
    let old = buf[at..at + new.len()].to_vec_in_stack();
    if let Some(c) = ip.l4_csum_at(buf) {
        update_l4_csum(buf, ip, c, &old, new);
    }
    buf[at..at + new.len()].copy_from_slice(new);
}

/// Writes a 2-byte field inside the L4 header (a port), updating the L4 checksum.
pub(crate) fn set_l4_field(buf: &mut [u8], ip: &IpLayout, at: usize, new: &[u8; 2]) {
    let old = [buf[at], buf[at + 1]];
    if let Some(c) = ip.l4_csum_at(buf) {
        update_l4_csum(buf, ip, c, &old, new);
    }
    buf[at..at + 2].copy_from_slice(new);
}

/// Writes a 2-byte IPv4 header field, updating the header checksum.
fn set_ipv4_field(buf: &mut [u8], ip: &IpLayout, at: usize, new: &[u8; 2]) {
    let old = [buf[at], buf[at + 1]];
    update_csum_at(buf, ip.off + 10, &old, new);
    buf[at..at + 2].copy_from_slice(new);
}

fn update_csum_at(buf: &mut [u8], at: usize, old: &[u8], new: &[u8]) {
    let hc = u16::from_be_bytes([buf[at], buf[at + 1]]);
    buf[at..at + 2].copy_from_slice(&csum::update(hc, old, new).to_be_bytes());
}

fn update_l4_csum(buf: &mut [u8], ip: &IpLayout, at: usize, old: &[u8], new: &[u8]) {
    let hc = u16::from_be_bytes([buf[at], buf[at + 1]]);
    // A zero UDP checksum means "none" (IPv4); it must stay zero, and a computed zero must be
    // sent as 0xffff (RFC 768).
    let udp = ip.proto == PROTO_UDP;
    if udp && hc == 0 {
        return;
    }
    let mut v = csum::update(hc, old, new);
    if udp && v == 0 {
        v = 0xffff;
    }
    buf[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Full recompute: IPv4 header always (when all of it is there); L4 only for a whole,
/// unfragmented datagram.
pub(crate) fn fix_checksums(buf: &mut [u8], ip: &IpLayout) {
    if !ip.v6 {
        let hl = ip.l4 - ip.off;
        buf[ip.off + 10..ip.off + 12].copy_from_slice(&[0, 0]);
        let c = csum::finish(csum::sum(0, &buf[ip.off..ip.off + hl]));
        buf[ip.off + 10..ip.off + 12].copy_from_slice(&c.to_be_bytes());
    }
    if !ip.whole || ip.fragmented {
        return;
    }
    let Some(at) = ip.l4_csum_at(buf) else { return };
    if ip.proto == PROTO_UDP && buf[at] == 0 && buf[at + 1] == 0 {
        return;
    }
    let l4len = ip.end - ip.l4;
    let mut acc = if ip.v6 {
        csum::sum(0, &buf[ip.off + 8..ip.off + 40])
    } else {
        csum::sum(0, &buf[ip.off + 12..ip.off + 20])
    };
    acc += u32::from(ip.proto) + (l4len as u32 & 0xffff) + (l4len as u32 >> 16);
    buf[at..at + 2].copy_from_slice(&[0, 0]);
    acc = csum::sum(acc, &buf[ip.l4..ip.end]);
    let mut c = csum::finish(acc);
    if c == 0 && ip.proto == PROTO_UDP {
        c = 0xffff;
    }
    buf[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// A copy of up to 16 bytes on the stack, so an edit can read the old value while writing
/// the new one without a heap allocation.
trait StackCopy {
    fn to_vec_in_stack(&self) -> StackBuf;
}
pub(crate) struct StackBuf([u8; 16], usize);
impl std::ops::Deref for StackBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[..self.1]
    }
}
impl StackCopy for [u8] {
    fn to_vec_in_stack(&self) -> StackBuf {
        let mut b = [0u8; 16];
        let n = self.len().min(16);
        b[..n].copy_from_slice(&self[..n]);
        StackBuf(b, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csum;
    use crate::parse::PROTO_TCP;

    const MARK: u8 = 0xa5;

    /// Builds Ethernet + IPv4/IPv6 + TCP/UDP into a buffer pre-filled with a marker byte, with
    /// every field written explicitly and right checksums.
    fn frame(v6: bool, proto: u8, payload: usize) -> Vec<u8> {
        let l4len = if proto == PROTO_TCP { 20 } else { 8 } + payload;
        let iplen = if v6 { 40 } else { 20 };
        let mut b = vec![MARK; 14 + iplen + l4len];
        b[0..12].copy_from_slice(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        b[12..14].copy_from_slice(&(if v6 { 0x86ddu16 } else { 0x0800 }).to_be_bytes());
        let ip = 14;
        if v6 {
            b[ip..ip + 4].copy_from_slice(&[0x60, 0, 0, 0]);
            b[ip + 4..ip + 6].copy_from_slice(&(l4len as u16).to_be_bytes());
            b[ip + 6] = proto;
            b[ip + 7] = 64;
            for i in 0..16 {
                b[ip + 8 + i] = 0x20 + i as u8;
                b[ip + 24 + i] = 0x40 + i as u8;
            }
        } else {
            b[ip..ip + 12].copy_from_slice(&[
                0x45,
                0,
                0,
                (20 + l4len) as u8,
                0,
                1,
                0,
                0,
                64,
                proto,
                0,
                0,
            ]);
            b[ip + 12..ip + 20].copy_from_slice(&[10, 0, 0, 1, 192, 168, 1, 2]);
        }
        let l4 = ip + iplen;
        b[l4..l4 + 4].copy_from_slice(&[0x04, 0xd2, 0x00, 0x50]); // 1234 -> 80
        if proto == PROTO_TCP {
            b[l4 + 4..l4 + 20]
                .copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0x20, 0, 0, 0, 0, 0]);
        } else {
            b[l4 + 4..l4 + 6].copy_from_slice(&(l4len as u16).to_be_bytes());
            b[l4 + 6..l4 + 8].copy_from_slice(&[0, 0]);
            b[l4 + 6] = 0; // checksum written below
        }
        // Non-zero so the UDP checksum is not skipped as "none".
        if proto == PROTO_UDP {
            b[l4 + 6] = 1;
        }
        let lay = parse::ip(&b).unwrap();
        fix_checksums(&mut b, &lay);
        b
    }

    /// Recomputes every checksum independently of the code under test's update path.
    fn checksums_valid(b: &[u8]) -> bool {
        let ip = parse::ip(b).unwrap();
        if !ip.v6 && csum::finish(csum::sum(0, &b[ip.off..ip.l4])) != 0 {
            return false;
        }
        if !ip.whole || ip.fragmented {
            return true;
        }
        let len = ip.end - ip.l4;
        let pseudo = if ip.v6 {
            &b[ip.off + 8..ip.off + 40]
        } else {
            &b[ip.off + 12..ip.off + 20]
        };
        let acc = csum::sum(0, pseudo) + u32::from(ip.proto) + len as u32;
        csum::finish(csum::sum(acc, &b[ip.l4..ip.end])) == 0
    }

    fn cases() -> Vec<Vec<u8>> {
        vec![
            frame(false, PROTO_TCP, 7),
            frame(false, PROTO_UDP, 5),
            frame(true, PROTO_TCP, 3),
            frame(true, PROTO_UDP, 0),
        ]
    }

    fn run(cfg: RewriteConfig, b: &mut Vec<u8>) -> RewriteOutcome {
        Rewriter::new(cfg).apply(b).unwrap()
    }

    #[test]
    fn builder_makes_valid_packets() {
        for b in cases() {
            assert!(checksums_valid(&b));
        }
    }

    #[test]
    fn identity_leaves_bytes() {
        assert!(Rewriter::new(RewriteConfig::default()).is_identity());
        for b in cases() {
            let mut c = b.clone();
            assert_eq!(
                run(RewriteConfig::default(), &mut c),
                RewriteOutcome::default()
            );
            assert_eq!(b, c);
        }
    }

    #[test]
    fn each_op_keeps_checksums_right() {
        let d = RewriteConfig::default;
        let ops = vec![
            RewriteConfig {
                src_mac: Some(MacAddr([1; 6])),
                dst_mac: Some(MacAddr([2; 6])),
                ..d()
            },
            RewriteConfig {
                srcipmap: IpMap::parse_list("10.0.0.0/8:172.16.0.0/12,[2020::/16]:[fd00::/8]")
                    .unwrap(),
                ..d()
            },
            RewriteConfig {
                dstipmap: IpMap::parse_list(
                    "192.168.0.0/16:1.2.0.0/16,[4041::/16]:[2001:db8::/32]",
                )
                .unwrap(),
                ..d()
            },
            RewriteConfig {
                portmap: Some("80:8080,1000-2000:1".parse().unwrap()),
                ..d()
            },
            RewriteConfig {
                ttl: Some(TtlEdit::Set(3)),
                ..d()
            },
            RewriteConfig {
                ttl: Some(TtlEdit::Decrease(100)),
                ..d()
            },
            RewriteConfig {
                mtu_trunc: Some(62),
                ..d()
            },
            RewriteConfig {
                fixcsum: true,
                ..d()
            },
            RewriteConfig {
                vlan: Some(VlanEdit::Add {
                    vid: 7,
                    pcp: 1,
                    cfi: false,
                }),
                ..d()
            },
        ];
        for cfg in ops {
            for b in cases() {
                let mut c = b.clone();
                run(cfg.clone(), &mut c);
                assert!(checksums_valid(&c), "{cfg:?} on {b:02x?} gave {c:02x?}");
            }
        }
    }

    #[test]
    fn portmap_maps_both_ports_and_ttl_saturates() {
        let mut b = frame(false, PROTO_TCP, 0);
        run(
            RewriteConfig {
                portmap: Some("80:8080,1234:99".parse().unwrap()),
                ttl: Some(TtlEdit::Increase(250)),
                ..Default::default()
            },
            &mut b,
        );
        assert_eq!(&b[34..38], &[0, 99, 0x1f, 0x90]);
        assert_eq!(b[22], 255);
    }

    #[test]
    fn vlan_add_then_remove_roundtrips() {
        for b in cases() {
            let mut c = b.clone();
            c.reserve(4);
            run(
                RewriteConfig {
                    vlan: Some(VlanEdit::Add {
                        vid: 42,
                        pcp: 5,
                        cfi: true,
                    }),
                    ..Default::default()
                },
                &mut c,
            );
            assert_eq!(&c[12..16], &[0x81, 0, 0xb0, 0x2a]);
            run(
                RewriteConfig {
                    vlan: Some(VlanEdit::Remove),
                    ..Default::default()
                },
                &mut c,
            );
            assert_eq!(b, c);
        }
    }

    #[test]
    fn mtu_trunc_fixes_lengths() {
        let mut b = frame(false, PROTO_TCP, 100);
        let o = run(
            RewriteConfig {
                mtu_trunc: Some(60),
                ..Default::default()
            },
            &mut b,
        );
        assert!(o.truncated);
        assert_eq!(b.len(), 74);
        assert_eq!(&b[16..18], &[0, 60]);
        assert!(checksums_valid(&b));
        let mut b = frame(true, PROTO_UDP, 100);
        run(
            RewriteConfig {
                mtu_trunc: Some(60),
                ..Default::default()
            },
            &mut b,
        );
        assert_eq!(&b[18..20], &[0, 20]);
        assert!(checksums_valid(&b));
    }

    #[test]
    fn mtu_trunc_says_why_a_frame_stays_too_long() {
        let cfg = RewriteConfig {
            mtu_trunc: Some(60),
            ..Default::default()
        };
        let mut arp = vec![MARK; 200];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(run(cfg.clone(), &mut arp).uncut, Some(Uncut::NotIp));
        assert_eq!(arp.len(), 200);
        // IPv4 under one MPLS label: cut to 60 bytes past the label, 4 over 14 + 60.
        let ip = frame(false, PROTO_UDP, 100);
        let mut mpls = ip[..12].to_vec();
        mpls.extend_from_slice(&[0x88, 0x47, 0x00, 0x01, 0x01, 0x40]);
        mpls.extend_from_slice(&ip[14..]);
        let o = run(cfg.clone(), &mut mpls);
        assert!(o.truncated);
        assert_eq!((mpls.len(), o.uncut), (18 + 60, Some(Uncut::LongHeaders)));
        let mut plain = frame(false, PROTO_UDP, 100);
        assert_eq!(run(cfg, &mut plain).uncut, None);
        assert_eq!(plain.len(), 74);
    }

    #[test]
    fn ip_inside_mpls_is_rewritten_with_right_checksums() {
        let cfg = RewriteConfig {
            srcipmap: IpMap::parse_list("0.0.0.0/0:1.0.0.0/8,[::/0]:[fd00::/8]").unwrap(),
            ttl: Some(TtlEdit::Set(9)),
            portmap: Some("1234:99".parse().unwrap()),
            ..Default::default()
        };
        for v6 in [false, true] {
            let ip = frame(v6, PROTO_TCP, 10);
            let mut f = ip[..12].to_vec();
            f.extend_from_slice(&[0x88, 0x47, 0x00, 0x01, 0x00, 0x40, 0x00, 0x02, 0x01, 0x40]);
            f.extend_from_slice(&ip[14..]);
            run(cfg.clone(), &mut f);
            // The same edits as on the plain frame, 8 bytes of labels later.
            let mut want = ip.clone();
            run(cfg.clone(), &mut want);
            assert_ne!(want, ip);
            assert_eq!(&f[22..], &want[14..], "v6 {v6}");
        }
    }

    #[test]
    fn later_fragment_ports_untouched() {
        let mut b = frame(false, PROTO_UDP, 8);
        b[20..22].copy_from_slice(&[0, 2]); // fragment offset 16 bytes
        let before = b.clone();
        run(
            RewriteConfig {
                portmap: Some("0-65535:1".parse().unwrap()),
                ..Default::default()
            },
            &mut b,
        );
        assert_eq!(before, b);
    }

    #[test]
    fn every_cut_goes_through_without_panic() {
        let all = RewriteConfig {
            src_mac: Some(MacAddr([1; 6])),
            srcipmap: IpMap::parse_list("0.0.0.0/0:1.0.0.0/8,[::/0]:[fd00::/8]").unwrap(),
            portmap: Some("0-65535:7".parse().unwrap()),
            ttl: Some(TtlEdit::Decrease(1)),
            mtu_trunc: Some(30),
            fixcsum: true,
            vlan: Some(VlanEdit::Add {
                vid: 1,
                pcp: 0,
                cfi: false,
            }),
            ..Default::default()
        };
        for b in cases() {
            for n in 0..=b.len() {
                let mut c = b[..n].to_vec();
                let r = run_result(all.clone(), &mut c);
                assert_eq!(r.is_err(), n < 14);
                let _ = crate::flow_key(&b[..n]);
            }
        }
    }

    fn run_result(cfg: RewriteConfig, b: &mut Vec<u8>) -> Result<RewriteOutcome, WireError> {
        Rewriter::new(cfg).apply(b)
    }
}
