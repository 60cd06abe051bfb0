//! A packet as tcpprep 4.4.3 sees it (src/tcpprep.c, src/tree.c, src/common/get.c): whether it
//! is IPv4 or IPv6, its addresses, what its headers say about the sender's role (client,
//! server, unknown) and where its TCP/UDP destination port is. `tcpkit replay prep` builds
//! tcpprep's cache from these answers, so each is tcpprep's own, quirks included (they decide
//! which interface a packet leaves by, and the cache must be tcpprep's byte for byte):
//!
//! - IPv4 is found by the ethertype alone (no version check) and needs 20 bytes after the link
//!   headers; IPv6 needs 40. 802.3 frames (a length where the ethertype goes) are IP when the
//!   nibble after the header says 4 or 6. VLAN tags and MPLS stacks are walked as tcpreplay
//!   walks them; Linux cooked captures are not walked further than their protocol field.
//! - tcpprep reads the TCP source port and the DNS flags without byte-swapping them on a
//!   little-endian host: "ftp-data" is source port 5120 (0x1400), a DNS query to port 53 counts
//!   as a response when its RA bit is set, and one from port 53 as a query only when its flags
//!   are exactly 0x0080 on the wire. Those are the comparisons made here.
//! - A packet whose TCP, UDP, DNS or ICMP header is cut short makes tcpprep give up on the
//!   whole capture ("packet capture length N too small to process"): [`PrepView::role`] says so
//!   as an error.

use crate::parse::{be16, ethernet};
use crate::WireError;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;

/// The link types tcpprep 4.4.3 takes that tcpkit reads: Ethernet, raw IP, Linux cooked v1.
pub fn prep_supports(dlt: u32) -> bool {
    matches!(dlt, 1 | 12 | 14 | 101 | 113)
}

/// A source or destination address as tcpprep keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PrepAddr {
    /// IPv4, the four bytes as on the wire.
    V4([u8; 4]),
    /// IPv6, the sixteen bytes as on the wire.
    V6([u8; 16]),
}

/// What a packet's headers say about its sender (tcpprep's `packet2tree`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepRole {
    /// A bare SYN, or a DNS query.
    Client,
    /// A SYN-ACK, a DNS answer, or an ICMP port unreachable.
    Server,
    /// Nothing telling.
    Unknown,
}

/// The TCP/UDP destination port as tcpprep's port mode reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepPort {
    /// TCP (`udp` false) or UDP, and its destination port.
    Port {
        /// UDP rather than TCP.
        udp: bool,
        /// The destination port.
        port: u16,
    },
    /// Another protocol: tcpprep sends it the way it sends non-IP packets.
    Other,
    /// Too short to tell (or an IPv6 fragment / ESP): tcpprep sends it out the secondary side.
    Short,
}

/// An IP packet as tcpprep sees it. Built by [`PrepView::parse`], which checks every offset;
/// the methods read only what it checked or check again.
#[derive(Debug, Clone, Copy)]
pub struct PrepView<'a> {
    data: &'a [u8],
    /// Length of the link headers (tcpreplay's l2len).
    l2: usize,
    v6: bool,
}

impl<'a> PrepView<'a> {
    /// `Ok(None)` for what tcpprep calls non-IP (ARP, cut headers...);
    /// [`WireError::UnsupportedDlt`] for a link type tcpprep refuses.
    pub fn parse(dlt: u32, data: &'a [u8]) -> Result<Option<PrepView<'a>>, WireError> {
        let Some((proto, l2)) = l2len_protocol(dlt, data)? else {
            return Ok(None);
        };
        let v6 = match proto {
            ETHERTYPE_IPV4 if l2 + 20 <= data.len() => false,
            ETHERTYPE_IPV6 if l2 + 40 <= data.len() => true,
            _ => return Ok(None),
        };
        Ok(Some(PrepView { data, l2, v6 }))
    }

    /// IPv6 rather than IPv4.
    pub fn is_v6(&self) -> bool {
        self.v6
    }

    fn addr(&self, v4_at: usize, v6_at: usize) -> PrepAddr {
        let d = &self.data[self.l2..];
        if self.v6 {
            PrepAddr::V6(d[v6_at..v6_at + 16].try_into().expect("40 bytes checked"))
        } else {
            PrepAddr::V4(d[v4_at..v4_at + 4].try_into().expect("20 bytes checked"))
        }
    }

    /// The source address.
    pub fn src(&self) -> PrepAddr {
        self.addr(12, 8)
    }

    /// The destination address.
    pub fn dst(&self) -> PrepAddr {
        self.addr(16, 24)
    }

    /// IP protocol (IPv6: the next-header field, no extension header walked) and the length of
    /// the IP header (IPv4: its IHL, whatever it says).
    fn proto_hl(&self) -> (u8, usize) {
        let d = &self.data[self.l2..];
        if self.v6 {
            (d[6], 40)
        } else {
            (d[9], usize::from(d[0] & 0x0f) * 4)
        }
    }

    /// The sender's role from this packet alone (tcpprep's `packet2tree`); an error where
    /// tcpprep stops with "packet capture length N too small to process".
    pub fn role(&self) -> Result<PrepRole, WireError> {
        let (proto, hl) = self.proto_hl();
        let at = self.l2 + hl;
        let need = |n: usize, layer: &'static str| {
            if self.data.len() < at + n {
                Err(WireError::Truncated {
                    layer,
                    offset: at,
                    need: n,
                    have: self.data.len().saturating_sub(at),
                })
            } else {
                Ok(())
            }
        };
        let d = self.data;
        Ok(match proto {
            6 => {
                need(20, "tcp")?;
                // th_sport compared with 20 unswapped: port 0x1400 on the wire.
                if d[at] == 20 && d[at + 1] == 0 {
                    return Ok(PrepRole::Unknown);
                }
                match d[at + 13] {
                    0x02 => PrepRole::Client,
                    0x12 => PrepRole::Server,
                    _ => PrepRole::Unknown,
                }
            }
            17 => {
                need(8, "udp")?;
                let (sport, dport) = (be16(d, at).unwrap_or(0), be16(d, at + 2).unwrap_or(0));
                if dport == 53 {
                    need(20, "dns")?;
                    // flags & 0x8000 on the unswapped u16: the RA bit of the second byte.
                    if d[at + 11] & 0x80 != 0 {
                        PrepRole::Server
                    } else {
                        PrepRole::Client
                    }
                } else if sport == 53 {
                    need(20, "dns")?;
                    if d[at + 10] == 0 && d[at + 11] == 0x80 {
                        PrepRole::Client
                    } else {
                        PrepRole::Server
                    }
                } else {
                    PrepRole::Unknown
                }
            }
            1 => {
                need(4, "icmp")?;
                if d[at] == 3 && d[at + 1] == 3 {
                    PrepRole::Server
                } else {
                    PrepRole::Unknown
                }
            }
            _ => PrepRole::Unknown,
        })
    }

    /// The destination port as tcpprep's port mode finds it (`check_dst_port`).
    pub fn dst_port(&self) -> PrepPort {
        let ip = &self.data[self.l2..];
        let (proto, l4) = if self.v6 {
            if ip.len() < 44 {
                return PrepPort::Short;
            }
            match ipv6_l4(ip) {
                Some(x) => x,
                None => return PrepPort::Short,
            }
        } else {
            let hl = usize::from(ip[0] & 0x0f) * 4;
            if ip.len() < hl + 4 {
                return PrepPort::Short;
            }
            (ip[9], hl)
        };
        let udp = match proto {
            6 => false,
            17 => true,
            _ => return PrepPort::Other,
        };
        match be16(ip, l4 + 2) {
            Some(port) => PrepPort::Port { udp, port },
            None => PrepPort::Short,
        }
    }
}

/// tcpreplay's `get_l2len_protocol` for the link types tcpprep takes: (protocol, l2len), None
/// where it returns -1.
fn l2len_protocol(dlt: u32, d: &[u8]) -> Result<Option<(u16, usize)>, WireError> {
    let nibble = |at: usize| match d.get(at).map(|b| b >> 4) {
        Some(4) => ETHERTYPE_IPV4,
        Some(6) => ETHERTYPE_IPV6,
        _ => 0,
    };
    Ok(match dlt {
        12 | 14 | 101 => (!d.is_empty()).then(|| (nibble(0), 0)),
        113 => be16(d, 14).filter(|_| d.len() >= 16).map(|p| (p, 16)),
        1 => {
            if d.len() <= 14 {
                return Ok(None);
            }
            let Some((et, off)) = ethernet(d) else {
                return Ok(None);
            };
            if d.len() <= off {
                return Ok(None);
            }
            if et > 1500 {
                Some((et, off))
            } else {
                match nibble(off) {
                    0 => None,
                    p => Some((p, off)),
                }
            }
        }
        other => return Err(WireError::UnsupportedDlt(other)),
    })
}

/// IPv6 extension headers as tcpreplay's `get_ipv6_l4proto` and `get_layer4_v6` walk them
/// (hop-by-hop, routing, destination options, AH, their lengths as (len * 4) + 8; a fragment or
/// ESP ends the walk with no L4 header): (protocol, offset of L4 in `ip`).
fn ipv6_l4(ip: &[u8]) -> Option<(u8, usize)> {
    let ext = |nh: u8| matches!(nh, 0 | 43 | 60 | 51);
    let mut nh = ip[6];
    let mut at = 40;
    // Each step moves at least 8 bytes, so this ends; the bound keeps it short.
    for _ in 0..32 {
        if matches!(nh, 44 | 50) {
            return None;
        }
        if !ext(nh) {
            return Some((nh, at));
        }
        let len = usize::from(*ip.get(at + 1)?) * 4 + 8;
        nh = *ip.get(at)?;
        at += len;
        if at > ip.len() {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth(et: u16, ip: &[u8]) -> Vec<u8> {
        let mut f = vec![0xAA; 12];
        f.extend_from_slice(&et.to_be_bytes());
        f.extend_from_slice(ip);
        f
    }

    fn v4(proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        ip.extend_from_slice(l4);
        ip
    }

    fn tcp(sport: u16, flags: u8) -> Vec<u8> {
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&80u16.to_be_bytes());
        t[13] = flags;
        t
    }

    fn view(f: &[u8]) -> PrepView<'_> {
        PrepView::parse(1, f).unwrap().unwrap()
    }

    #[test]
    fn roles_are_tcpprep_s_including_its_unswapped_fields() {
        let syn = eth(0x0800, &v4(6, &tcp(40000, 0x02)));
        assert_eq!(view(&syn).role(), Ok(PrepRole::Client));
        assert_eq!(view(&syn).src(), PrepAddr::V4([10, 0, 0, 1]));
        assert_eq!(view(&syn).dst(), PrepAddr::V4([10, 0, 0, 2]));
        let synack = eth(0x0800, &v4(6, &tcp(80, 0x12)));
        assert_eq!(view(&synack).role(), Ok(PrepRole::Server));
        // ECN-setup SYN (0xc2) is not a bare SYN.
        let ecn = eth(0x0800, &v4(6, &tcp(40000, 0xc2)));
        assert_eq!(view(&ecn).role(), Ok(PrepRole::Unknown));
        // "ftp-data" unswapped: source port 5120, not 20.
        let p5120 = eth(0x0800, &v4(6, &tcp(5120, 0x02)));
        assert_eq!(view(&p5120).role(), Ok(PrepRole::Unknown));
        let p20 = eth(0x0800, &v4(6, &tcp(20, 0x02)));
        assert_eq!(view(&p20).role(), Ok(PrepRole::Client));
        // DNS to 53: RA bit decides; from 53: only flags 0x0080 is a client.
        let mut q = vec![0, 53, 0, 53, 0, 0, 0, 0];
        q.extend_from_slice(&[0, 1, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        q[0..2].copy_from_slice(&3333u16.to_be_bytes());
        assert_eq!(view(&eth(0x0800, &v4(17, &q))).role(), Ok(PrepRole::Client));
        q[11] = 0x80;
        assert_eq!(view(&eth(0x0800, &v4(17, &q))).role(), Ok(PrepRole::Server));
        let mut r = q.clone();
        r[0..4].copy_from_slice(&[0, 53, 0x0d, 0x05]);
        r[10] = 0;
        assert_eq!(view(&eth(0x0800, &v4(17, &r))).role(), Ok(PrepRole::Client));
        r[10] = 0x81;
        assert_eq!(view(&eth(0x0800, &v4(17, &r))).role(), Ok(PrepRole::Server));
        let unreach = eth(0x0800, &v4(1, &[3, 3, 0, 0]));
        assert_eq!(view(&unreach).role(), Ok(PrepRole::Server));
        // A cut TCP header is tcpprep's fatal "too small".
        let cut = eth(0x0800, &v4(6, &[0; 10]));
        assert!(matches!(
            view(&cut).role(),
            Err(WireError::Truncated { layer: "tcp", .. })
        ));
    }

    #[test]
    fn what_counts_as_ip_and_where_ports_are() {
        // ARP, a short frame, 19 bytes of "IPv4": not IP.
        assert!(PrepView::parse(1, &eth(0x0806, &[0; 28]))
            .unwrap()
            .is_none());
        assert!(PrepView::parse(1, &[0; 14]).unwrap().is_none());
        assert!(PrepView::parse(1, &eth(0x0800, &[0x45; 19]))
            .unwrap()
            .is_none());
        // A VLAN tag is walked; an 802.3 length with an IPv4 nibble after it is IP.
        let mut tagged = vec![0u8; 12];
        tagged.extend_from_slice(&[0x81, 0, 0, 5, 0x08, 0]);
        tagged.extend_from_slice(&v4(17, &[0, 1, 0, 53, 0, 0, 0, 0]));
        assert_eq!(
            view(&tagged).dst_port(),
            PrepPort::Port {
                udp: true,
                port: 53
            }
        );
        let dot3 = eth(46, &v4(6, &tcp(1, 0)));
        assert!(PrepView::parse(1, &dot3).unwrap().is_some());
        // Raw IP and Linux cooked.
        let raw = v4(6, &tcp(1, 0));
        assert!(PrepView::parse(101, &raw).unwrap().is_some());
        let mut sll = vec![0u8; 14];
        sll.extend_from_slice(&[0x08, 0]);
        sll.extend_from_slice(&raw);
        assert_eq!(
            PrepView::parse(113, &sll).unwrap().unwrap().dst_port(),
            PrepPort::Port {
                udp: false,
                port: 80
            }
        );
        assert_eq!(
            PrepView::parse(0, &raw).unwrap_err(),
            WireError::UnsupportedDlt(0)
        );
        assert_eq!(
            view(&eth(0x0800, &v4(1, &[8, 0, 0, 0]))).dst_port(),
            PrepPort::Other
        );
        assert_eq!(
            view(&eth(0x0800, &v4(6, &[0, 1]))).dst_port(),
            PrepPort::Short
        );
        // IPv6 with a hop-by-hop header before TCP.
        let mut ip6 = vec![0x60, 0, 0, 0, 0, 28, 0, 64];
        ip6.extend_from_slice(&[0xfe; 32]);
        ip6.extend_from_slice(&[6, 0, 0, 0, 0, 0, 0, 0]);
        ip6.extend_from_slice(&tcp(1, 0x02));
        let f = eth(0x86dd, &ip6);
        assert_eq!(
            view(&f).dst_port(),
            PrepPort::Port {
                udp: false,
                port: 80
            }
        );
        assert!(view(&f).is_v6());
        // Every cut of every frame parses without panicking.
        for f in [&syn_frame(), &f, &tagged, &sll] {
            for n in 0..f.len() {
                for dlt in [1, 101, 113] {
                    if let Ok(Some(v)) = PrepView::parse(dlt, &f[..n]) {
                        let _ = (v.role(), v.dst_port(), v.src(), v.dst());
                    }
                }
            }
        }
    }

    fn syn_frame() -> Vec<u8> {
        eth(0x0800, &v4(6, &tcp(40000, 0x02)))
    }
}
