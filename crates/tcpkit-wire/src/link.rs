//! pcap link types (DLTs) and conversion of captured frames to Ethernet.

use crate::parse::{be16, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::types::MacAddr;
use crate::WireError;

/// The link types tcpkit reads. The pcap crate hands us raw DLT numbers; this is where they
/// get a meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// DLT 0: BSD loopback, a 4-byte address family in the capturing host's byte order.
    Null,
    /// DLT 1.
    Ethernet,
    /// DLT 101 (and 12 / 14, which some BSDs use for raw IP).
    Raw,
    /// DLT 108: OpenBSD loopback, the family in network byte order.
    Loop,
    /// DLT 113: Linux cooked capture v1.
    LinuxSll,
    /// DLT 228.
    Ipv4,
    /// DLT 229.
    Ipv6,
    /// DLT 276: Linux cooked capture v2.
    LinuxSll2,
}

impl LinkType {
    /// The link type of a pcap DLT number, or [`WireError::UnsupportedDlt`].
    pub fn from_dlt(dlt: u32) -> Result<LinkType, WireError> {
        Ok(match dlt {
            0 => LinkType::Null,
            1 => LinkType::Ethernet,
            101 | 12 | 14 => LinkType::Raw,
            108 => LinkType::Loop,
            113 => LinkType::LinuxSll,
            228 => LinkType::Ipv4,
            229 => LinkType::Ipv6,
            276 => LinkType::LinuxSll2,
            other => return Err(WireError::UnsupportedDlt(other)),
        })
    }

    /// The canonical DLT number (Raw is 101).
    pub fn dlt(self) -> u32 {
        match self {
            LinkType::Null => 0,
            LinkType::Ethernet => 1,
            LinkType::Raw => 101,
            LinkType::Loop => 108,
            LinkType::LinuxSll => 113,
            LinkType::Ipv4 => 228,
            LinkType::Ipv6 => 229,
            LinkType::LinuxSll2 => 276,
        }
    }

    /// The libpcap name (`pcap_datalink_val_to_name`).
    pub fn name(self) -> &'static str {
        match self {
            LinkType::Null => "NULL",
            LinkType::Ethernet => "EN10MB",
            LinkType::Raw => "RAW",
            LinkType::Loop => "LOOP",
            LinkType::LinuxSll => "LINUX_SLL",
            LinkType::Ipv4 => "IPV4",
            LinkType::Ipv6 => "IPV6",
            LinkType::LinuxSll2 => "LINUX_SLL2",
        }
    }
}

/// BSD address families: AF_INET is 2 everywhere; AF_INET6 is 24 (NetBSD/OpenBSD), 28
/// (FreeBSD), 30 (macOS) and 10 (Linux).
fn family_ethertype(f: u32) -> Option<u16> {
    match f {
        2 => Some(ETHERTYPE_IPV4),
        10 | 24 | 28 | 30 => Some(ETHERTYPE_IPV6),
        _ => None,
    }
}

fn ip_version_ethertype(link: LinkType, data: &[u8], offset: usize) -> Result<u16, WireError> {
    let v = data.get(offset).ok_or(WireError::Truncated {
        layer: link.name(),
        offset,
        need: 1,
        have: 0,
    })? >> 4;
    match v {
        4 => Ok(ETHERTYPE_IPV4),
        6 => Ok(ETHERTYPE_IPV6),
        v => Err(WireError::Unsupported {
            link: link.name(),
            what: "IP version",
            value: u32::from(v),
            offset,
        }),
    }
}

fn need(link: LinkType, data: &[u8], n: usize) -> Result<(), WireError> {
    if data.len() < n {
        return Err(WireError::Truncated {
            layer: link.name(),
            offset: 0,
            need: n,
            have: data.len(),
        });
    }
    Ok(())
}

/// Convert a captured frame of any supported link type into an Ethernet frame in `out`
/// (cleared first). Ethernet input is copied as is; others get an Ethernet header with the
/// ethertype from the IP version / SLL protocol / loopback family, and the given MACs.
pub fn to_ethernet(
    link: LinkType,
    data: &[u8],
    src: MacAddr,
    dst: MacAddr,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    out.clear();
    let (ethertype, payload) = match link {
        LinkType::Ethernet => {
            out.extend_from_slice(data);
            return Ok(());
        }
        LinkType::Null | LinkType::Loop => {
            need(link, data, 4)?;
            let b = [data[0], data[1], data[2], data[3]];
            let be = u32::from_be_bytes(b);
            // DLT_NULL is in the writer's byte order, which we do not know: the family is a
            // small number, so whichever reading is small is the right one.
            let fam = if link == LinkType::Loop || be < 0x1_0000 {
                be
            } else {
                u32::from_le_bytes(b)
            };
            let et = family_ethertype(fam).ok_or(WireError::Unsupported {
                link: link.name(),
                what: "address family",
                value: fam,
                offset: 0,
            })?;
            (et, &data[4..])
        }
        LinkType::Raw => (ip_version_ethertype(link, data, 0)?, data),
        LinkType::Ipv4 => (ETHERTYPE_IPV4, data),
        LinkType::Ipv6 => (ETHERTYPE_IPV6, data),
        LinkType::LinuxSll => {
            need(link, data, 16)?;
            (
                sll_protocol(link, be16(data, 14).unwrap_or(0), 14)?,
                &data[16..],
            )
        }
        LinkType::LinuxSll2 => {
            need(link, data, 20)?;
            (
                sll_protocol(link, be16(data, 0).unwrap_or(0), 0)?,
                &data[20..],
            )
        }
    };
    out.extend_from_slice(&dst.0);
    out.extend_from_slice(&src.0);
    out.extend_from_slice(&ethertype.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// A captured frame as Ethernet, for readers that only look at its IP and TCP headers: an
/// Ethernet frame is itself (no copy); any other link type is rewritten into `scratch` with
/// zero MACs. None when it has no Ethernet form (a short header, a protocol that is not IP).
pub fn as_ethernet<'a>(
    link: LinkType,
    data: &'a [u8],
    scratch: &'a mut Vec<u8>,
) -> Option<&'a [u8]> {
    if link == LinkType::Ethernet {
        return Some(data);
    }
    to_ethernet(link, data, MacAddr([0; 6]), MacAddr([0; 6]), scratch).ok()?;
    Some(scratch)
}

/// SLL protocol values below 0x600 are not ethertypes (802.2 LLC, CAN, ...) and have no
/// Ethernet II form.
fn sll_protocol(link: LinkType, p: u16, offset: usize) -> Result<u16, WireError> {
    if p < 0x600 {
        return Err(WireError::Unsupported {
            link: link.name(),
            what: "protocol",
            value: u32::from(p),
            offset,
        });
    }
    Ok(p)
}

/// Whether an Ethernet frame carries an 802.1Q tag right after its addresses. The kernel lets
/// such a frame be 4 bytes longer than MTU + 14 (AF_PACKET's `packet_extra_vlan_len_allowed`);
/// a sender that checks lengths itself (AF_XDP) applies the same rule with this.
pub fn is_8021q_tagged(frame: &[u8]) -> bool {
    crate::parse::be16(frame, 12) == Some(crate::parse::ETHERTYPE_VLAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_ethernet_borrows_ethernet_and_rewrites_the_rest() {
        let mut scratch = Vec::new();
        let eth = [0u8; 14];
        let got = as_ethernet(LinkType::Ethernet, &eth, &mut scratch).unwrap();
        assert_eq!(got.as_ptr(), eth.as_ptr(), "no copy of an Ethernet frame");
        let got = as_ethernet(LinkType::Raw, &V4, &mut scratch).unwrap();
        assert_eq!(&got[..14], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0]);
        assert_eq!(&got[14..], &V4);
        assert!(as_ethernet(LinkType::LinuxSll, &V4[..10], &mut scratch).is_none());
    }

    const S: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const D: MacAddr = MacAddr::BROADCAST;
    const V4: [u8; 20] = [
        0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];

    fn v6() -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0] = 0x60;
        b[6] = 59;
        b
    }

    fn conv(link: LinkType, data: &[u8]) -> Result<Vec<u8>, WireError> {
        let mut out = vec![0xa5; 7]; // marker: must be cleared
        to_ethernet(link, data, S, D, &mut out).map(|()| out)
    }

    fn check(out: &[u8], et: u16, payload: &[u8]) {
        assert_eq!(&out[0..6], &D.0);
        assert_eq!(&out[6..12], &S.0);
        assert_eq!(be16(out, 12), Some(et));
        assert_eq!(&out[14..], payload);
    }

    #[test]
    fn dlt_roundtrip() {
        for d in [0, 1, 101, 108, 113, 228, 229, 276] {
            assert_eq!(LinkType::from_dlt(d).unwrap().dlt(), d);
        }
        assert_eq!(LinkType::from_dlt(12), Ok(LinkType::Raw));
        assert_eq!(LinkType::from_dlt(14), Ok(LinkType::Raw));
        assert_eq!(LinkType::from_dlt(105), Err(WireError::UnsupportedDlt(105)));
    }

    #[test]
    fn null_both_byte_orders_and_families() {
        for (fam, payload, et) in [
            (2u32, &V4[..], ETHERTYPE_IPV4),
            (24, &v6()[..], ETHERTYPE_IPV6),
            (28, &v6()[..], ETHERTYPE_IPV6),
            (30, &v6()[..], ETHERTYPE_IPV6),
        ] {
            for hdr in [fam.to_le_bytes(), fam.to_be_bytes()] {
                let data = [&hdr[..], payload].concat();
                check(&conv(LinkType::Null, &data).unwrap(), et, payload);
            }
            let data = [&fam.to_be_bytes()[..], payload].concat();
            check(&conv(LinkType::Loop, &data).unwrap(), et, payload);
        }
        assert!(conv(LinkType::Null, &[7, 0, 0, 0]).is_err());
        assert!(conv(LinkType::Null, &[2, 0]).is_err());
    }

    #[test]
    fn raw_sll_sll2_ethernet() {
        check(&conv(LinkType::Raw, &V4).unwrap(), ETHERTYPE_IPV4, &V4);
        check(&conv(LinkType::Raw, &v6()).unwrap(), ETHERTYPE_IPV6, &v6());
        check(&conv(LinkType::Ipv4, &V4).unwrap(), ETHERTYPE_IPV4, &V4);
        check(&conv(LinkType::Ipv6, &v6()).unwrap(), ETHERTYPE_IPV6, &v6());
        assert!(conv(LinkType::Raw, &[0x50]).is_err());
        assert!(conv(LinkType::Raw, &[]).is_err());
        let mut sll = vec![0u8; 16];
        sll[14..16].copy_from_slice(&0x86ddu16.to_be_bytes());
        sll.extend_from_slice(&v6());
        check(
            &conv(LinkType::LinuxSll, &sll).unwrap(),
            ETHERTYPE_IPV6,
            &v6(),
        );
        let mut sll2 = vec![0u8; 20];
        sll2[0..2].copy_from_slice(&0x0800u16.to_be_bytes());
        sll2.extend_from_slice(&V4);
        check(
            &conv(LinkType::LinuxSll2, &sll2).unwrap(),
            ETHERTYPE_IPV4,
            &V4,
        );
        sll2[0..2].copy_from_slice(&4u16.to_be_bytes());
        assert!(conv(LinkType::LinuxSll2, &sll2).is_err());
        assert_eq!(conv(LinkType::Ethernet, &sll).unwrap(), sll);
    }

    #[test]
    fn every_cut_is_an_error_or_ok_never_a_panic() {
        let mut sll = vec![0u8; 16];
        sll[14..16].copy_from_slice(&0x0800u16.to_be_bytes());
        sll.extend_from_slice(&V4);
        for link in [
            LinkType::Null,
            LinkType::Loop,
            LinkType::Raw,
            LinkType::LinuxSll,
            LinkType::LinuxSll2,
            LinkType::Ethernet,
            LinkType::Ipv4,
        ] {
            for n in 0..=sll.len() {
                let _ = conv(link, &sll[..n]);
            }
        }
    }
}
