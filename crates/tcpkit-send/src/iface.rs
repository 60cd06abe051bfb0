//! Interface facts (index, MAC, MTU, link type) and counters, read in the calling thread's
//! network namespace.
//!
//! A thread that entered a namespace with `setns()` still sees the original namespace in
//! `/sys` (sysfs follows the mount namespace) and in `/proc/net` (a link to `/proc/self/net`,
//! i.e. the thread-group leader's namespace). So facts come from ioctls on a socket (a socket
//! belongs to the namespace of the thread that made it) and counters from
//! `/proc/thread-self/net/dev`, which follows the reading thread.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::SendError;

/// What tcpkit needs to know about an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfInfo {
    /// The interface name.
    pub name: String,
    /// The kernel's interface index.
    pub ifindex: u32,
    /// The hardware address, for Ethernet-like interfaces.
    pub mac: Option<[u8; 6]>,
    /// The MTU (without the link-layer header).
    pub mtu: u32,
    /// Whether the link type is Ethernet (ARPHRD_ETHER): frames start with an Ethernet header.
    pub is_ethernet: bool,
}

/// Packet and byte counters of an interface, as the kernel keeps them (64 bit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfCounters {
    /// Packets transmitted.
    pub tx_packets: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Packets dropped on transmit.
    pub tx_dropped: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets dropped on receive.
    pub rx_dropped: u64,
}

/// A request for `ifname`, or NoSuchInterface if the name cannot fit (so no such interface can
/// exist: names are at most IFNAMSIZ - 1 bytes).
fn ifreq_for(ifname: &str) -> Result<libc::ifreq, SendError> {
    let bytes = ifname.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(SendError::NoSuchInterface {
            ifname: ifname.to_owned(),
        });
    }
    // SAFETY: ifreq is plain old data; all zeroes is a valid (empty) request.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

fn ioctl(
    fd: &OwnedFd,
    ifname: &str,
    call: &'static str,
    request: libc::c_ulong,
    req: &mut libc::ifreq,
) -> Result<(), SendError> {
    // SAFETY: the SIOCGIF* requests used here read and write one ifreq, which we own.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, req as *mut libc::ifreq) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENODEV) => SendError::NoSuchInterface {
                ifname: ifname.to_owned(),
            },
            _ => SendError::sys(ifname, call, err),
        });
    }
    Ok(())
}

/// A socket for the device ioctls, in the calling thread's namespace. Any socket will do for
/// SIOCGIF*; a datagram socket needs no privilege. AF_UNIX would not do: its ioctl does not
/// fall back to the device ioctls.
fn ioctl_socket(ifname: &str) -> Result<OwnedFd, SendError> {
    // SAFETY: plain socket(2); the fd is owned right after.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(SendError::sys(
            ifname,
            "socket(AF_INET)",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: raw is a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Whether an interface can carry frames now, and how many transmit queues it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IfLink {
    /// IFF_UP: set administratively up.
    pub up: bool,
    /// The carrier is on (for a veth: its peer is up too). Asked of the driver
    /// (ETHTOOL_GLINK) where it answers: IFF_RUNNING follows the carrier only once the kernel's
    /// link watch has run, up to a second later.
    pub carrier: bool,
    /// Transmit queues in use (ethtool's channel counts: tx + combined); None when the driver
    /// does not say (no ETHTOOL_GCHANNELS).
    pub tx_queues: Option<u32>,
}

/// `struct ethtool_channels` of <linux/ethtool.h> (not in libc).
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// `ETHTOOL_GCHANNELS` of <linux/ethtool.h>.
const ETHTOOL_GCHANNELS: u32 = 0x3c;
/// `ETHTOOL_GLINK` of <linux/ethtool.h>: the carrier, in a `struct ethtool_value`.
const ETHTOOL_GLINK: u32 = 0x0a;

/// `struct ethtool_value` of <linux/ethtool.h>.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// Up flag, carrier and transmit queue count of `ifname` in the calling thread's namespace.
pub(crate) fn if_link(ifname: &str) -> Result<IfLink, SendError> {
    let fd = ioctl_socket(ifname)?;
    let mut req = ifreq_for(ifname)?;
    ioctl(
        &fd,
        ifname,
        "ioctl(SIOCGIFFLAGS)",
        libc::SIOCGIFFLAGS,
        &mut req,
    )?;
    // SAFETY: SIOCGIFFLAGS filled the flags member.
    let flags = libc::c_int::from(unsafe { req.ifr_ifru.ifru_flags });
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    req.ifr_ifru.ifru_data = (&mut ch as *mut EthtoolChannels).cast();
    // Any failure (EOPNOTSUPP from a driver without channels, most often) leaves the count
    // unknown: the bind and the first send then tell.
    let tx_queues = ioctl(
        &fd,
        ifname,
        "ioctl(SIOCETHTOOL)",
        libc::SIOCETHTOOL,
        &mut req,
    )
    .ok()
    .map(|()| ch.tx_count + ch.combined_count)
    .filter(|&n| n > 0);
    let mut link = EthtoolValue {
        cmd: ETHTOOL_GLINK,
        data: 0,
    };
    req.ifr_ifru.ifru_data = (&mut link as *mut EthtoolValue).cast();
    let carrier = match ioctl(
        &fd,
        ifname,
        "ioctl(SIOCETHTOOL)",
        libc::SIOCETHTOOL,
        &mut req,
    ) {
        Ok(()) => link.data != 0,
        Err(_) => flags & libc::IFF_RUNNING != 0,
    };
    Ok(IfLink {
        up: flags & libc::IFF_UP != 0,
        carrier,
        tx_queues,
    })
}

/// Index, MAC, MTU and link type of `ifname` in the calling thread's network namespace.
pub fn if_info(ifname: &str) -> Result<IfInfo, SendError> {
    let mut req = ifreq_for(ifname)?;
    let fd = ioctl_socket(ifname)?;
    ioctl(
        &fd,
        ifname,
        "ioctl(SIOCGIFINDEX)",
        libc::SIOCGIFINDEX,
        &mut req,
    )?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member of the union.
    let ifindex = unsafe { req.ifr_ifru.ifru_ifindex } as u32;
    ioctl(&fd, ifname, "ioctl(SIOCGIFMTU)", libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU filled the mtu member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu } as u32;
    ioctl(
        &fd,
        ifname,
        "ioctl(SIOCGIFHWADDR)",
        libc::SIOCGIFHWADDR,
        &mut req,
    )?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member: sa_family is the ARPHRD type.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let is_ethernet = hw.sa_family == libc::ARPHRD_ETHER;
    let mac = is_ethernet.then(|| {
        let mut mac = [0u8; 6];
        for (dst, &src) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *dst = src as u8;
        }
        mac
    });
    Ok(IfInfo {
        name: ifname.to_owned(),
        ifindex,
        mac,
        mtu,
        is_ethernet,
    })
}

/// Counters of `ifname` in the calling thread's network namespace.
pub fn if_counters(ifname: &str) -> Result<IfCounters, SendError> {
    const PATH: &str = "/proc/thread-self/net/dev";
    let text = std::fs::read_to_string(PATH).map_err(|source| SendError::File {
        path: PATH.into(),
        what: "cannot read",
        source,
    })?;
    parse_net_dev(&text, ifname).ok_or_else(|| SendError::NoSuchInterface {
        ifname: ifname.to_owned(),
    })
}

/// Every interface of the calling thread's network namespace (in the kernel's order), with
/// its facts: what `replay --listnics` shows. An interface that goes away while it is listed is
/// left out.
pub fn interfaces() -> Result<Vec<IfInfo>, SendError> {
    const PATH: &str = "/proc/thread-self/net/dev";
    let text = std::fs::read_to_string(PATH).map_err(|source| SendError::File {
        path: PATH.into(),
        what: "cannot read",
        source,
    })?;
    Ok(net_dev_names(&text)
        .filter_map(|name| if_info(name).ok())
        .collect())
}

/// The interface names of /proc/net/dev's text, after its two header lines.
fn net_dev_names(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
}

/// The counters of `ifname` in the text of /proc/net/dev: after `name:`, 8 receive fields
/// (bytes packets errs drop fifo frame compressed multicast) then 8 transmit fields (bytes
/// packets errs drop fifo colls carrier compressed).
fn parse_net_dev(text: &str, ifname: &str) -> Option<IfCounters> {
    text.lines().find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        if name.trim() != ifname {
            return None;
        }
        let mut f = [0u64; 12];
        let mut fields = rest.split_whitespace();
        for slot in &mut f {
            *slot = fields.next()?.parse().ok()?;
        }
        Some(IfCounters {
            rx_bytes: f[0],
            rx_packets: f[1],
            rx_dropped: f[3],
            tx_bytes: f[8],
            tx_packets: f[9],
            tx_errors: f[10],
            tx_dropped: f[11],
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testnet::TestNet;

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  123456     789    0    0    0     0          0         0   123456     789    0    0    0     0       0          0
  tka1: 18446744073709551615 2 0 3 0 0 0 0 4000000000000 5 6 7 0 0 0 0
";

    #[test]
    fn lists_proc_net_dev_names() {
        assert_eq!(net_dev_names(NET_DEV).collect::<Vec<_>>(), ["lo", "tka1"]);
    }

    #[test]
    fn parses_proc_net_dev_with_64_bit_counters() {
        let c = parse_net_dev(NET_DEV, "tka1");
        assert_eq!(
            c,
            Some(IfCounters {
                rx_bytes: u64::MAX,
                rx_packets: 2,
                rx_dropped: 3,
                tx_bytes: 4_000_000_000_000,
                tx_packets: 5,
                tx_errors: 6,
                tx_dropped: 7,
            })
        );
        assert_eq!(parse_net_dev(NET_DEV, "tka").map(|c| c.tx_packets), None);
        assert_eq!(
            parse_net_dev(NET_DEV, "lo").map(|c| c.tx_packets),
            Some(789)
        );
        // Cut lines never parse as zeroes.
        assert_eq!(parse_net_dev("  x: 1 2 3", "x"), None);
    }

    #[test]
    fn missing_interface_is_named() {
        let e = if_info("tknosuch0").err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("tknosuch0: no such network interface"));
        let e = if_info("a-name-far-too-long-for-linux")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("a-name-far-too-long-for-linux: no such network interface")
        );
        let e = if_counters("tknosuch0").err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("tknosuch0: no such network interface"));
    }

    /// The veth pair exists only inside the test's namespace: finding it (and its counters) from
    /// a thread that entered the namespace with setns() proves both read that namespace.
    #[test]
    fn reads_the_namespace_of_the_calling_thread() {
        let net = TestNet::new();
        let (a, b) = (net.a.clone(), net.b.clone());
        net.ip(&["link", "set", &a, "mtu", "1400"]);
        net.run_in(move || {
            let ia = if_info(&a).expect("if_info in namespace");
            let ib = if_info(&b).expect("if_info in namespace");
            assert_eq!(ia.mtu, 1400);
            assert!(ia.is_ethernet);
            assert!(ia.mac.is_some() && ia.mac != ib.mac);
            assert_ne!(ia.ifindex, ib.ifindex);
            let lo = if_info("lo").expect("lo");
            assert!(!lo.is_ethernet);
            assert_eq!(lo.mac, None);
            if_counters(&a).expect("counters in namespace");
        });
        // And outside, it does not exist.
        assert!(matches!(
            if_info(&net.a),
            Err(SendError::NoSuchInterface { .. })
        ));
    }
}
