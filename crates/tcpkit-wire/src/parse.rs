//! Bounds-checked location of the layers inside an Ethernet frame.
//!
//! The rewriter, the flow key and `unique_ip` all need the same answers: where the IP header
//! starts, where L4 starts, whether this fragment carries the L4 header and whether the whole
//! datagram is in the buffer. They are computed here once, with every offset checked against
//! the buffer, so the editing code can index the offsets it is handed.

pub(crate) const ETH_HDR: usize = 14;
pub(crate) const ETHERTYPE_IPV4: u16 = 0x0800;
pub(crate) const ETHERTYPE_IPV6: u16 = 0x86dd;
pub(crate) const ETHERTYPE_VLAN: u16 = 0x8100;
pub(crate) const PROTO_ICMP: u8 = 1;
pub(crate) const PROTO_TCP: u8 = 6;
pub(crate) const PROTO_UDP: u8 = 17;
pub(crate) const PROTO_ICMPV6: u8 = 58;

pub(crate) fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

pub(crate) const ETHERTYPE_MPLS: u16 = 0x8847;
pub(crate) const ETHERTYPE_MPLS_MULTI: u16 = 0x8848;

/// Steps of [`ethernet`]'s walk (a tag, a label, a control word with its inner Ethernet
/// header): each takes at least 4 bytes, and 64 of them cover far more headers than any
/// real frame stacks, so a frame made of nothing but tags and labels cannot make us loop long.
const MAX_L2_STEPS: usize = 64;

/// MPLS label 13, the Generic Associated Channel: what follows is not a packet.
const MPLS_LABEL_GACH: u32 = 13;

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Walks the link headers of an Ethernet frame as tcpreplay 4.4.3 does (src/common/get.c,
/// `parse_metadata`), so the rewriter, the flow key and `--unique-ip` find the same L3 header
/// tcprewrite and tcpreplay find: 802.1Q / 802.1ad tags, and MPLS label stacks to the
/// bottom-of-stack label, after which the first nibble says IPv4 (4), IPv6 (6) or a
/// pseudowire control word (0) followed by a whole inner Ethernet frame (EoMPLS), whose own
/// tags and labels are walked in turn. Returns (ethertype, offset of the L3 header); `None`
/// when a header is cut short, for a GACH label or another first nibble (tcpreplay gives up
/// on those too), and past [`MAX_L2_STEPS`].
pub(crate) fn ethernet(buf: &[u8]) -> Option<(u16, usize)> {
    let mut et = be16(buf, 12)?;
    let mut off = ETH_HDR;
    for _ in 0..MAX_L2_STEPS {
        match et {
            0x8100 | 0x88a8 | 0x9100 => {
                et = be16(buf, off + 2)?;
                off += 4;
            }
            ETHERTYPE_MPLS | ETHERTYPE_MPLS_MULTI => {
                let entry = be32(buf, off)?;
                off += 4;
                if entry >> 12 == MPLS_LABEL_GACH {
                    return None;
                }
                if entry & 0x100 == 0 {
                    // Not the bottom of the stack: another label follows.
                    continue;
                }
                match buf.get(off)? >> 4 {
                    4 => return Some((ETHERTYPE_IPV4, off)),
                    6 => return Some((ETHERTYPE_IPV6, off)),
                    0 => {
                        // Control word (4 bytes), then the inner Ethernet header.
                        et = be16(buf, off + 4 + 12)?;
                        off += 4 + ETH_HDR;
                    }
                    _ => return None,
                }
            }
            _ => return Some((et, off)),
        }
    }
    None
}

/// Where the IP and L4 headers of one frame are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IpLayout {
    pub v6: bool,
    /// Offset of the IP header in the frame.
    pub off: usize,
    /// Offset of the L4 header (after IPv4 options / IPv6 extension headers).
    pub l4: usize,
    pub proto: u8,
    /// End of the datagram as far as we have it: min(declared length, captured bytes).
    pub end: usize,
    /// The declared datagram length is all in the buffer (not cut by the snaplen).
    pub whole: bool,
    /// This packet carries the start of the L4 payload (unfragmented or first fragment).
    pub has_l4: bool,
    /// Part of a fragmented datagram (first or later): its L4 checksum covers bytes we do
    /// not have, so it cannot be recomputed, only updated.
    pub fragmented: bool,
}

impl IpLayout {
    /// Offset of the L4 checksum field if this protocol has one that covers the pseudo header
    /// and the field is in the buffer.
    pub fn l4_csum_at(&self, buf: &[u8]) -> Option<usize> {
        if !self.has_l4 {
            return None;
        }
        let at = match self.proto {
            PROTO_TCP => self.l4 + 16,
            PROTO_UDP => self.l4 + 6,
            PROTO_ICMPV6 if self.v6 => self.l4 + 2,
            _ => return None,
        };
        (at + 2 <= self.end.min(buf.len())).then_some(at)
    }

    /// Offset of the TCP/UDP ports if present.
    pub fn ports_at(&self, buf: &[u8]) -> Option<usize> {
        (self.has_l4
            && matches!(self.proto, PROTO_TCP | PROTO_UDP)
            && self.l4 + 4 <= self.end.min(buf.len()))
        .then_some(self.l4)
    }
}

/// Finds the IP header of an Ethernet frame, through VLAN tags and MPLS as [`ethernet`] walks
/// them; `None` for non-IP frames and for IP headers that are cut short or malformed (those
/// are passed through untouched).
pub(crate) fn ip(buf: &[u8]) -> Option<IpLayout> {
    let (et, off) = ethernet(buf)?;
    match et {
        ETHERTYPE_IPV4 => ipv4(buf, off),
        ETHERTYPE_IPV6 => ipv6(buf, off),
        _ => None,
    }
}

fn ipv4(buf: &[u8], off: usize) -> Option<IpLayout> {
    let vihl = *buf.get(off)?;
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < 20 || off + ihl > buf.len() {
        return None;
    }
    let total = usize::from(be16(buf, off + 2)?);
    let frag = be16(buf, off + 6)?;
    let declared = off + total;
    let sane = total >= ihl;
    Some(IpLayout {
        v6: false,
        off,
        l4: off + ihl,
        proto: buf[off + 9],
        end: if sane {
            declared.min(buf.len())
        } else {
            buf.len()
        },
        whole: sane && declared <= buf.len(),
        has_l4: frag & 0x1fff == 0,
        fragmented: frag & 0x3fff != 0,
    })
}

fn ipv6(buf: &[u8], off: usize) -> Option<IpLayout> {
    if off + 40 > buf.len() || buf[off] >> 4 != 6 {
        return None;
    }
    let plen = usize::from(be16(buf, off + 4)?);
    // Payload length 0 means a jumbogram (RFC 2675); we cannot see its length, so we treat
    // it as cut short and never recompute its L4 checksum.
    let declared = off + 40 + plen;
    let sane = plen != 0;
    let end = if sane {
        declared.min(buf.len())
    } else {
        buf.len()
    };
    let mut nh = buf[off + 6];
    let mut l4 = off + 40;
    let mut has_l4 = true;
    let mut fragmented = false;
    for _ in 0..8 {
        let len = match nh {
            0 | 43 | 60 => buf.get(l4 + 1).map(|&l| (usize::from(l) + 1) * 8),
            51 => buf.get(l4 + 1).map(|&l| (usize::from(l) + 2) * 4),
            44 => {
                let fo = be16(buf, l4 + 2);
                if let Some(fo) = fo {
                    fragmented = true;
                    has_l4 &= fo & 0xfff8 == 0;
                }
                fo.map(|_| 8)
            }
            _ => break,
        };
        match len {
            Some(len) if l4 + len <= end => {
                nh = buf[l4];
                l4 += len;
            }
            _ => {
                // The extension header chain is cut: no L4 header to find.
                has_l4 = false;
                break;
            }
        }
    }
    Some(IpLayout {
        v6: true,
        off,
        l4,
        proto: nh,
        end,
        whole: sane && declared <= buf.len(),
        has_l4,
        fragmented,
    })
}

#[cfg(test)]
mod mpls_tests {
    use super::*;

    fn frame(labels: &[[u8; 4]], ip: &[u8]) -> Vec<u8> {
        let mut f = vec![0xa5; 12];
        f.extend_from_slice(&[0x88, 0x47]);
        for l in labels {
            f.extend_from_slice(l);
        }
        f.extend_from_slice(ip);
        f
    }

    #[test]
    fn walks_the_label_stack_to_the_ip_header() {
        let mut pkt = vec![
            0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        pkt.extend_from_slice(&[0, 53, 0, 54, 0, 8, 0, 0]);
        let f = frame(&[[0, 0x10, 0x00, 64], [0, 0x20, 0x01, 64]], &pkt);
        let l = ip(&f).expect("IPv4 under two labels");
        assert_eq!((l.off, l.proto, l.v6), (22, 17, false));
        for cut in 0..f.len() {
            let _ = ip(&f[..cut]);
        }
        // Bottom of stack, then neither 4, 6 nor a control word.
        assert!(ip(&frame(&[[0, 0x10, 0x01, 64]], &[0x50; 20])).is_none());
        // GACH (label 13) is not a packet, as tcpreplay says.
        assert!(ip(&frame(&[[0, 0x00, 0xd1, 64]], &pkt)).is_none());
    }

    #[test]
    fn ethernet_over_mpls_is_walked_to_the_inner_ip_header() {
        let mut pkt = vec![
            0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        pkt.extend_from_slice(&[0, 53, 0, 54, 0, 8, 0, 0]);
        // Control word, inner Ethernet with one 802.1Q tag, then IPv4.
        let mut inner = vec![0, 0, 0, 0];
        inner.extend_from_slice(&[0xa5; 12]);
        inner.extend_from_slice(&[0x81, 0x00, 0x00, 0x07, 0x08, 0x00]);
        inner.extend_from_slice(&pkt);
        let f = frame(&[[0, 0x13, 0x00, 254], [0, 0x10, 0x01, 255]], &inner);
        let l = ip(&f).expect("IPv4 in Ethernet over MPLS");
        assert_eq!((l.off, l.proto), (22 + 4 + 14 + 4, 17));
        for cut in 0..f.len() {
            assert!(ip(&f[..cut]).is_none_or(|l| l.off == 44));
        }
    }

    #[test]
    fn a_frame_of_labels_ends_the_walk() {
        let f = frame(&[[0, 0x10, 0x00, 64]; 2000], &[]);
        assert!(ethernet(&f).is_none());
        let mut tags = vec![0xa5; 12];
        for _ in 0..2000 {
            tags.extend_from_slice(&[0x81, 0x00, 0, 1]);
        }
        assert!(ethernet(&tags).is_none());
    }
}
