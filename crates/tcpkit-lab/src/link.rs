//! Links between hosts: the options a test asks for ([`LinkOpts`], [`Tbf`]), what it gets
//! back ([`Link`], [`Iface`]), interface counters ([`IfStats`]), and the checks that keep
//! addresses inside the test-only ranges.

use std::net::IpAddr;

use serde_json::Value;

use crate::cmd;
use crate::LabError;

/// Longest Linux interface name (IFNAMSIZ - 1).
pub const IFNAME_MAX: usize = 15;

/// Token-bucket shaping applied to the egress of both ends of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Rate in bits per second.
    pub rate_bit_s: u64,
    /// Bucket size in bytes; must hold at least one MTU-sized frame.
    pub burst_bytes: u32,
    /// Longest time a packet may wait in the queue before being dropped.
    pub latency_ms: u32,
}

/// How to build a link. `Default` gives an unaddressed, unshaped link with offloads off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkOpts {
    /// Addresses with prefix for end A, e.g. "198.18.0.1/24", "fd00:18::1/64".
    pub addr_a: Vec<String>,
    /// Addresses with prefix for end B.
    pub addr_b: Vec<String>,
    /// MTU of both ends; the veth default (1500) when None.
    pub mtu: Option<u32>,
    /// Shaping on both ends' egress.
    pub tbf: Option<Tbf>,
    /// Keep TSO/GSO/GRO on. Off by default so that captures show the frames as they would
    /// be on a wire rather than 64 KB super-packets.
    pub offloads: bool,
    /// Each end receives in a kernel thread of its own (veth NAPI: GRO on, threaded), which
    /// [`Iface::rx_thread`] names. Without it a veth runs the receiving host's whole stack
    /// inside the sender's syscalls, charged to the sending process; with it the receive
    /// path runs apart, as on a real network where it runs on the other host, so a
    /// benchmark can charge each process only its own work and show the rest beside it.
    /// TSO/GSO stay off unless `offloads`: veth hands a TSO frame to no thread.
    pub rx_threads: bool,
    /// Transmit and receive queues of each end (`numtxqueues`/`numrxqueues`): one AF_XDP
    /// socket per queue (`replay --xdp --threads N`); the veth default (1) when None.
    pub queues: Option<u32>,
}

/// One end of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    /// Interface name inside its namespace.
    pub name: String,
    /// Name of the namespace it lives in.
    pub host: String,
    /// Interface index inside its namespace.
    pub ifindex: u32,
    /// MAC address.
    pub mac: [u8; 6],
    /// Addresses assigned, as given in [`LinkOpts`].
    pub addrs: Vec<String>,
    /// MTU.
    pub mtu: u32,
    /// With [`LinkOpts::rx_threads`]: the pid of the kernel thread that receives for this end.
    pub rx_thread: Option<u32>,
}

/// A veth pair between two hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The end in host A.
    pub a: Iface,
    /// The end in host B.
    pub b: Iface,
}

/// Interface counters as the kernel reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IfStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets dropped on send.
    pub tx_dropped: u64,
    /// Send errors.
    pub tx_errors: u64,
}

/// Whether `addr` is inside the ranges the lab may use: 198.18.0.0/15 (benchmarking,
/// RFC 2544) and fd00::/8 (unique local). Anything else could shadow a real network.
pub fn in_test_range(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            o[0] == 198 && (o[1] == 18 || o[1] == 19)
        }
        IpAddr::V6(v6) => v6.octets()[0] == 0xfd,
    }
}

/// Parses "ADDR/PREFIX" and checks it lies in the test ranges.
pub(crate) fn parse_cidr(s: &str) -> Result<(IpAddr, u8), LabError> {
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| LabError::invalid(format!("address {s:?} lacks a /prefix")))?;
    let addr: IpAddr = a
        .parse()
        .map_err(|_| LabError::invalid(format!("address {s:?}: {a:?} is not an IP address")))?;
    let prefix: u8 = p
        .parse()
        .map_err(|_| LabError::invalid(format!("address {s:?}: bad prefix {p:?}")))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(LabError::invalid(format!(
            "address {s:?}: prefix {prefix} > {max}"
        )));
    }
    if !in_test_range(addr) {
        return Err(LabError::invalid(format!(
            "address {s:?} is outside the lab's ranges 198.18.0.0/15 and fd00::/8"
        )));
    }
    Ok((addr, prefix))
}

/// Parses "aa:bb:cc:dd:ee:ff".
pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// `ip -n NS [-s] -j link show dev IF`, parsed to its single JSON object.
pub(crate) fn ip_link_json(netns: &str, ifname: &str, stats: bool) -> Result<Value, LabError> {
    let mut args = vec!["-n", netns];
    if stats {
        args.push("-s");
    }
    args.extend(["-j", "link", "show", "dev", ifname]);
    let out = cmd::run_args("ip", &args)?;
    let desc = format!("ip {}", args.join(" "));
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| LabError::Parse {
        cmd: desc.clone(),
        why: e.to_string(),
    })?;
    match v {
        Value::Array(mut a) if a.len() == 1 => Ok(a.remove(0)),
        _ => Err(LabError::Parse {
            cmd: desc,
            why: "expected one interface object".into(),
        }),
    }
}

fn field_u64(v: &Value, path: &[&str], cmd: &str) -> Result<u64, LabError> {
    let mut cur = v;
    for k in path {
        cur = cur.get(k).ok_or_else(|| LabError::Parse {
            cmd: cmd.to_string(),
            why: format!("no field {}", path.join(".")),
        })?;
    }
    cur.as_u64().ok_or_else(|| LabError::Parse {
        cmd: cmd.to_string(),
        why: format!("{} is not a number", path.join(".")),
    })
}

/// Reads index, MAC and MTU of an interface.
pub(crate) fn query_iface(
    netns: &str,
    ifname: &str,
    addrs: Vec<String>,
) -> Result<Iface, LabError> {
    let v = ip_link_json(netns, ifname, false)?;
    let desc = format!("ip -n {netns} -j link show dev {ifname}");
    let ifindex =
        u32::try_from(field_u64(&v, &["ifindex"], &desc)?).map_err(|_| LabError::Parse {
            cmd: desc.clone(),
            why: "ifindex out of range".into(),
        })?;
    let mtu = u32::try_from(field_u64(&v, &["mtu"], &desc)?).map_err(|_| LabError::Parse {
        cmd: desc.clone(),
        why: "mtu out of range".into(),
    })?;
    let mac = v
        .get("address")
        .and_then(Value::as_str)
        .and_then(parse_mac)
        .ok_or_else(|| LabError::Parse {
            cmd: desc.clone(),
            why: "no MAC address".into(),
        })?;
    Ok(Iface {
        name: ifname.to_string(),
        host: netns.to_string(),
        ifindex,
        mac,
        addrs,
        mtu,
        rx_thread: None,
    })
}

/// Reads the counters of an interface (`ip -s -j link`, which has the 64-bit counters).
pub(crate) fn query_stats(netns: &str, ifname: &str) -> Result<IfStats, LabError> {
    let v = ip_link_json(netns, ifname, true)?;
    let d = format!("ip -n {netns} -s -j link show dev {ifname}");
    let s = ["stats64"];
    let f = |dir: &str, k: &str| field_u64(&v, &[s[0], dir, k], &d);
    Ok(IfStats {
        rx_packets: f("rx", "packets")?,
        rx_bytes: f("rx", "bytes")?,
        rx_dropped: f("rx", "dropped")?,
        rx_errors: f("rx", "errors")?,
        tx_packets: f("tx", "packets")?,
        tx_bytes: f("tx", "bytes")?,
        tx_dropped: f("tx", "dropped")?,
        tx_errors: f("tx", "errors")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ranges_only() {
        assert!(parse_cidr("198.18.0.1/24").is_ok());
        assert!(parse_cidr("198.19.255.254/15").is_ok());
        assert!(parse_cidr("fd00:18::1/64").is_ok());
        for bad in [
            "10.0.0.1/8",
            "192.168.1.1/24",
            "198.20.0.1/24",
            "2001:db8::1/64",
            "fe80::1/64",
        ] {
            let e = parse_cidr(bad).unwrap_err().to_string();
            assert!(e.contains("outside"), "{bad}: {e}");
        }
    }

    #[test]
    fn malformed_cidrs_are_errors() {
        for bad in [
            "198.18.0.1",
            "198.18.0.1/33",
            "fd00::1/129",
            "x/24",
            "198.18.0.1/",
            "",
        ] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(
            parse_mac("92:4f:82:82:98:b0"),
            Some([0x92, 0x4f, 0x82, 0x82, 0x98, 0xb0])
        );
        assert_eq!(parse_mac("92:4f:82:82:98"), None);
        assert_eq!(parse_mac("92:4f:82:82:98:b0:01"), None);
        assert_eq!(parse_mac("zz:4f:82:82:98:b0"), None);
    }

    #[test]
    fn linkopts_default_has_offloads_off() {
        let o = LinkOpts::default();
        assert!(!o.offloads);
        assert!(o.tbf.is_none() && o.mtu.is_none());
    }
}
