//! Option values for the rewriter and their text forms, as tcprewrite spells them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::WireError;

/// An Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff, every station of the segment.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
}

impl FromStr for MacAddr {
    type Err = WireError;
    /// `aa:bb:cc:dd:ee:ff` (also `-` separated); each part one or two hex digits.
    fn from_str(s: &str) -> Result<MacAddr, WireError> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for (i, b) in out.iter_mut().enumerate() {
            let p = parts.next().ok_or_else(|| {
                WireError::parse("MAC address", s, format!("only {i} of 6 octets"))
            })?;
            if p.is_empty() || p.len() > 2 {
                return Err(WireError::parse(
                    "MAC address",
                    s,
                    format!("octet {} is {p:?}, expected 1-2 hex digits", i + 1),
                ));
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| {
                WireError::parse(
                    "MAC address",
                    s,
                    format!("octet {} {p:?} is not hex", i + 1),
                )
            })?;
        }
        if parts.next().is_some() {
            return Err(WireError::parse("MAC address", s, "more than 6 octets"));
        }
        Ok(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// An IPv4 or IPv6 prefix. A plain address is a /32 or /128.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// A prefix; host bits of `addr` are kept as given (tcprewrite ignores them when mapping).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Cidr, WireError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(WireError::parse(
                "CIDR",
                &format!("{addr}/{prefix}"),
                format!("prefix longer than {max}"),
            ));
        }
        Ok(Cidr { addr, prefix })
    }
    /// The network address as given (host bits not cleared).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }
    /// The prefix length: 0-32 for IPv4, 0-128 for IPv6.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
    fn mask(&self) -> u128 {
        let bits = if self.addr.is_ipv4() { 32 } else { 128 };
        let all = if bits == 32 {
            u128::from(u32::MAX)
        } else {
            u128::MAX
        };
        match u32::from(self.prefix) {
            0 => 0,
            p => all & !(all >> p),
        }
    }
    fn bits(&self) -> u128 {
        match self.addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        }
    }
    /// Does the prefix contain this address (of the same family)?
    pub fn contains(&self, ip: IpAddr) -> bool {
        let other = Cidr {
            addr: ip,
            prefix: 0,
        };
        self.addr.is_ipv4() == ip.is_ipv4() && (other.bits() ^ self.bits()) & self.mask() == 0
    }
}

impl FromStr for Cidr {
    type Err = WireError;
    /// `10.0.0.0/8`, `2001:db8::/32`, `[2001:db8::/32]`, `[2001:db8::]/32`, or a plain address.
    fn from_str(s: &str) -> Result<Cidr, WireError> {
        let t = s.trim();
        let (addr, prefix) = if let Some(rest) = t.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| WireError::parse("CIDR", s, "'[' without ']'"))?;
            match (inside.split_once('/'), after.strip_prefix('/')) {
                (Some((a, p)), None) if after.is_empty() => (a, Some(p)),
                (None, Some(p)) => (inside, Some(p)),
                (None, None) if after.is_empty() => (inside, None),
                _ => {
                    return Err(WireError::parse(
                        "CIDR",
                        s,
                        "expected [addr/len] or [addr]/len",
                    ))
                }
            }
        } else {
            match t.split_once('/') {
                Some((a, p)) => (a, Some(p)),
                None => (t, None),
            }
        };
        let addr: IpAddr = addr.parse().map_err(|_| {
            WireError::parse(
                "CIDR",
                s,
                format!("{addr:?} is not an IPv4 or IPv6 address"),
            )
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|&p| p <= max).ok_or_else(|| {
                WireError::parse("CIDR", s, format!("prefix length {p:?} is not 0..={max}"))
            })?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// One tcprewrite `--srcipmap`/`--dstipmap` rule: addresses in `from` move into `to`, keeping
/// the host bits below `to`'s prefix length (so `10.1.0.0/16:172.16.0.0/8` sends 10.1.2.3 to
/// 172.1.2.3, as tcprewrite 4.4.3 does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpMap {
    /// Addresses this rule applies to.
    pub from: Cidr,
    /// The prefix they move into; host bits below its length are kept.
    pub to: Cidr,
}

impl IpMap {
    /// Parses tcprewrite's comma-separated list, e.g. `10.0.0.0/8:192.168.0.0/16,1.2.3.4:5.6.7.8`
    /// or `[2001:db8::/32]:[2001:db9::/32]`.
    pub fn parse_list(s: &str) -> Result<Vec<IpMap>, WireError> {
        s.split(',').map(str::parse).collect()
    }

    /// The mapped address if `ip` is in `from` (and `to` is of the same family).
    pub fn map(&self, ip: IpAddr) -> Option<IpAddr> {
        if !self.from.contains(ip) || self.to.addr.is_ipv4() != ip.is_ipv4() {
            return None;
        }
        let host = Cidr {
            addr: ip,
            prefix: 0,
        }
        .bits()
            & !self.to.mask();
        let net = self.to.bits() & self.to.mask();
        let v = net | host;
        Some(match ip {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(v as u32)),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
        })
    }
}

impl FromStr for IpMap {
    type Err = WireError;
    fn from_str(s: &str) -> Result<IpMap, WireError> {
        let t = s.trim();
        // IPv6 prefixes are bracketed, so the separating ':' is the one after the first ']'
        // (or, for IPv4, the only one).
        let split = if t.starts_with('[') {
            let close = t
                .find(']')
                .ok_or_else(|| WireError::parse("IP map", s, "'[' without ']'"))?;
            t[close..].find(':').map(|i| close + i)
        } else {
            t.find(':')
        };
        let at = split.ok_or_else(|| WireError::parse("IP map", s, "expected <from>:<to>"))?;
        let from: Cidr = t[..at].parse()?;
        let to: Cidr = t[at + 1..].parse()?;
        if from.addr.is_ipv4() != to.addr.is_ipv4() {
            return Err(WireError::parse(
                "IP map",
                s,
                "both sides must be the same IP version",
            ));
        }
        Ok(IpMap { from, to })
    }
}

/// tcprewrite `--portmap`: TCP and UDP source and destination ports are both mapped; the first
/// rule that matches wins. Rules are `80:8000` or a range `1000-2000:80` (all to one port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMap {
    rules: Vec<(u16, u16, u16)>,
}

impl PortMap {
    /// The port `p` maps to, if a rule covers it.
    pub fn map(&self, p: u16) -> Option<u16> {
        self.rules
            .iter()
            .find(|&&(lo, hi, _)| (lo..=hi).contains(&p))
            .map(|&(_, _, to)| to)
    }
}

impl FromStr for PortMap {
    type Err = WireError;
    /// Comma-separated `from:to` rules; `from` may be a range `lo-hi`.
    fn from_str(s: &str) -> Result<PortMap, WireError> {
        let port = |p: &str| {
            p.trim().parse::<u16>().map_err(|_| {
                WireError::parse("port map", s, format!("{p:?} is not a port 0-65535"))
            })
        };
        let mut rules = Vec::new();
        for rule in s.split(',') {
            let (from, to) = rule.split_once(':').ok_or_else(|| {
                WireError::parse("port map", s, format!("rule {rule:?} is not <from>:<to>"))
            })?;
            let (lo, hi) = match from.split_once('-') {
                Some((lo, hi)) => (port(lo)?, port(hi)?),
                None => (port(from)?, port(from)?),
            };
            if lo > hi {
                return Err(WireError::parse(
                    "port map",
                    s,
                    format!("range {from:?} runs backwards"),
                ));
            }
            rules.push((lo, hi, port(to)?));
        }
        Ok(PortMap { rules })
    }
}

/// tcprewrite `--enet-vlan`: push an 802.1Q tag (outermost, even on an already tagged frame)
/// or remove the outermost 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VlanEdit {
    /// Push a tag (`--enet-vlan add`).
    Add {
        /// VLAN identifier, the tag's low 12 bits (`--enet-vlan-tag`).
        vid: u16,
        /// Priority code point, the top 3 bits (`--enet-vlan-pri`).
        pcp: u8,
        /// The CFI/DEI bit between them (`--enet-vlan-cfi`).
        cfi: bool,
    },
    /// Pop the outermost tag (`--enet-vlan del`).
    Remove,
}

/// tcprewrite `--ttl`: `64` sets, `+1` adds (saturating at 255), `-1` subtracts (never below
/// 1, as tcprewrite). Applies to the IPv4 TTL and the IPv6 hop limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlEdit {
    /// `64`: set to this value.
    Set(u8),
    /// `+1`: add this much, saturating at 255.
    Increase(u8),
    /// `-1`: subtract this much, never below 1.
    Decrease(u8),
}

impl TtlEdit {
    pub(crate) fn apply(self, ttl: u8) -> u8 {
        match self {
            TtlEdit::Set(v) => v,
            TtlEdit::Increase(v) => ttl.saturating_add(v),
            TtlEdit::Decrease(v) => ttl.saturating_sub(v).max(1),
        }
    }
}

impl FromStr for TtlEdit {
    type Err = WireError;
    fn from_str(s: &str) -> Result<TtlEdit, WireError> {
        let t = s.trim();
        let num = |n: &str| {
            n.parse::<u8>()
                .map_err(|_| WireError::parse("TTL", s, format!("{n:?} is not a number 0-255")))
        };
        match (t.strip_prefix('+'), t.strip_prefix('-')) {
            (Some(n), _) => num(n).map(TtlEdit::Increase),
            (_, Some(n)) => num(n).map(TtlEdit::Decrease),
            _ => num(t).map(TtlEdit::Set),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parse_and_display() {
        let m: MacAddr = "aa:bb:cc:0:e:ff".parse().unwrap();
        assert_eq!(m.to_string(), "aa:bb:cc:00:0e:ff");
        assert!("aa:bb:cc:dd:ee".parse::<MacAddr>().is_err());
        assert!("aa:bb:cc:dd:ee:ff:00".parse::<MacAddr>().is_err());
        assert!("aa:bb:cc:dd:ee:gg"
            .parse::<MacAddr>()
            .unwrap_err()
            .to_string()
            .contains("octet 6"));
    }

    #[test]
    fn cidr_forms() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.200.1.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert_eq!("1.2.3.4".parse::<Cidr>().unwrap().prefix(), 32);
        assert_eq!("2001:db8::/32".parse::<Cidr>().unwrap().prefix(), 32);
        assert_eq!("[2001:db8::/32]".parse::<Cidr>().unwrap().prefix(), 32);
        assert_eq!("[2001:db8::]/32".parse::<Cidr>().unwrap().prefix(), 32);
        assert_eq!("[::1]".parse::<Cidr>().unwrap().prefix(), 128);
        assert!("10.0.0.0/33"
            .parse::<Cidr>()
            .unwrap_err()
            .to_string()
            .contains("prefix length"));
        assert!("10.0.0/8".parse::<Cidr>().is_err());
        assert!("0.0.0.0/0"
            .parse::<Cidr>()
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
    }

    #[test]
    fn ipmap_keeps_host_bits_of_target_prefix() {
        let m: IpMap = "10.1.0.0/16:172.16.0.0/8".parse().unwrap();
        assert_eq!(
            m.map("10.1.2.3".parse().unwrap()),
            Some("172.1.2.3".parse().unwrap())
        );
        let m: IpMap = "10.0.0.0/8:10.0.0.0/24".parse().unwrap();
        assert_eq!(
            m.map("10.1.2.3".parse().unwrap()),
            Some("10.0.0.3".parse().unwrap())
        );
        let l =
            IpMap::parse_list("[2001:db8::/32]:[2001:db7::/32],[2001:db9::]/32:[2001:db6::]/32")
                .unwrap();
        assert_eq!(
            l[0].map("2001:db8::1".parse().unwrap()),
            Some("2001:db7::1".parse().unwrap())
        );
        assert_eq!(
            l[1].map("2001:db9::1".parse().unwrap()),
            Some("2001:db6::1".parse().unwrap())
        );
        assert!("10.0.0.0/8".parse::<IpMap>().is_err());
        assert!("10.0.0.0/8:[::1]".parse::<IpMap>().is_err());
    }

    #[test]
    fn portmap_and_ttl() {
        let p: PortMap = "80:8000,1000-2000:81".parse().unwrap();
        assert_eq!(p.map(80), Some(8000));
        assert_eq!(p.map(1500), Some(81));
        assert_eq!(p.map(2001), None);
        assert!("80".parse::<PortMap>().is_err());
        assert!("9-3:1".parse::<PortMap>().is_err());
        assert!("70000:1".parse::<PortMap>().is_err());
        assert_eq!("64".parse(), Ok(TtlEdit::Set(64)));
        assert_eq!("+1".parse(), Ok(TtlEdit::Increase(1)));
        assert_eq!("-1".parse(), Ok(TtlEdit::Decrease(1)));
        assert!("x".parse::<TtlEdit>().is_err());
        assert_eq!(TtlEdit::Decrease(65).apply(64), 1);
        assert_eq!(TtlEdit::Increase(200).apply(64), 255);
    }
}
