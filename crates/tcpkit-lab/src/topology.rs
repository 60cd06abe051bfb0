//! Ready-made topologies beyond `pair` (which lives beside [`Lab::new`]): `multipath`, two
//! hosts joined by several links with ECMP routes hashed on the L4 tuple.

use crate::link::{Link, LinkOpts, Tbf};
use crate::{cmd, Host, Lab, LabError};

/// Address of A that routes over every path (on A's `lo`).
pub const MULTIPATH_A4: &str = "198.19.0.1";
/// Address of B that routes over every path (on B's `lo`).
pub const MULTIPATH_B4: &str = "198.19.0.2";
/// IPv6 address of A that routes over every path.
pub const MULTIPATH_A6: &str = "fd00:19::1";
/// IPv6 address of B that routes over every path.
pub const MULTIPATH_B6: &str = "fd00:19::2";

/// Most paths `multipath` builds: one /24 of 198.18.0.0/16 per path, 198.18.0.0/24 being
/// the `pair` link's.
pub const MULTIPATH_MAX: usize = 254;

impl Host {
    /// Sets a sysctl inside the host (`sysctl -qw key=value`); the host's namespace only.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), LabError> {
        self.run(&["sysctl", "-qw", &format!("{key}={value}")])
            .map(drop)
    }
}

/// `ip [-6] route add DST src SRC nexthop via GW dev IF ...` on `h`, one nexthop per path.
fn ecmp_route(
    h: &Host,
    v6: bool,
    dst: &str,
    src: &str,
    hops: &[(String, String)],
) -> Result<(), LabError> {
    let mut args: Vec<&str> = vec!["-n", h.netns()];
    if v6 {
        args.push("-6");
    }
    args.extend(["route", "add", dst, "src", src]);
    for (gw, dev) in hops {
        args.extend(["nexthop", "via", gw.as_str(), "dev", dev.as_str()]);
    }
    cmd::run_args("ip", &args).map(drop)
}

impl Lab {
    /// The `multipath` topology: hosts "a" and "b" joined by `paths` links, each shaped
    /// with `tbf` if given. Link i (from 0) has 198.18.(i+1).1/24 and fd00:18:(i+1)::1/64
    /// on A, .2 / ::2 on B. A's [`MULTIPATH_A4`]/[`MULTIPATH_A6`] and B's
    /// [`MULTIPATH_B4`]/[`MULTIPATH_B6`] sit on `lo` and are routed to each other over
    /// all links with ECMP, hashed on the L4 tuple (fib_multipath_hash_policy=1), so
    /// different connections take different paths while each stays on one.
    pub fn multipath(
        tag: &str,
        paths: usize,
        tbf: Option<Tbf>,
    ) -> Result<(Lab, Host, Host, Vec<Link>), LabError> {
        if paths == 0 || paths > MULTIPATH_MAX {
            return Err(LabError::invalid(format!(
                "multipath: {paths} paths; use 1..={MULTIPATH_MAX}"
            )));
        }
        let mut lab = Lab::new(tag)?;
        let a = lab.host("a")?;
        let b = lab.host("b")?;
        let mut links = Vec::with_capacity(paths);
        for i in 1..=paths {
            let opts = LinkOpts {
                addr_a: vec![format!("198.18.{i}.1/24"), format!("fd00:18:{i:x}::1/64")],
                addr_b: vec![format!("198.18.{i}.2/24"), format!("fd00:18:{i:x}::2/64")],
                tbf,
                ..LinkOpts::default()
            };
            links.push(lab.link(&a, &b, &opts)?);
        }
        let ends = [
            (
                &a,
                MULTIPATH_A4,
                MULTIPATH_A6,
                MULTIPATH_B4,
                MULTIPATH_B6,
                true,
            ),
            (
                &b,
                MULTIPATH_B4,
                MULTIPATH_B6,
                MULTIPATH_A4,
                MULTIPATH_A6,
                false,
            ),
        ];
        for (h, me4, me6, peer4, peer6, is_a) in ends {
            h.sysctl("net.ipv4.fib_multipath_hash_policy", "1")?;
            h.sysctl("net.ipv6.fib_multipath_hash_policy", "1")?;
            let ns = h.netns();
            cmd::run_args(
                "ip",
                &["-n", ns, "addr", "add", &format!("{me4}/32"), "dev", "lo"],
            )?;
            // nodad: even on lo, where no DAD runs, a new address stays tentative until the
            // kernel's DAD work item has run, and `route add ... src` in the meantime fails
            // with "Invalid source address" (seen once in four runs of the mpcat tests).
            cmd::run_args(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{me6}/128"),
                    "dev",
                    "lo",
                    "nodad",
                ],
            )?;
            let (mut hops4, mut hops6) = (Vec::new(), Vec::new());
            for (i, l) in links.iter().enumerate() {
                let i = i + 1;
                let (dev, peer_oct, peer_v6) = if is_a {
                    (&l.a.name, 2, "2")
                } else {
                    (&l.b.name, 1, "1")
                };
                hops4.push((format!("198.18.{i}.{peer_oct}"), dev.clone()));
                hops6.push((format!("fd00:18:{i:x}::{peer_v6}"), dev.clone()));
            }
            ecmp_route(h, false, &format!("{peer4}/32"), me4, &hops4)?;
            ecmp_route(h, true, &format!("{peer6}/128"), me6, &hops6)?;
        }
        Ok((lab, a, b, links))
    }
}

/// The `lan` topology's network: host i (from 0) of [`Lab::lan`] gets `198.18.0.(i+1)/24`.
pub const LAN_NET: [u8; 3] = [198, 18, 0];

/// Most hosts one [`Lab::lan`] joins (the /24's host addresses).
pub const LAN_MAX: usize = 254;

impl Lab {
    /// The `lan` topology: `hosts` joined through one switch, a host of its own holding a
    /// bridge (STP off, so ports forward at once), as machines on one Ethernet segment. Host
    /// i (from 0) gets `198.18.0.(i+1)/24` on its `eth<n>`; every host reaches every other
    /// directly. Returns the addresses, in the order of `hosts`.
    pub fn lan(&mut self, hosts: &[&Host]) -> Result<Vec<std::net::Ipv4Addr>, LabError> {
        if hosts.is_empty() || hosts.len() > LAN_MAX {
            return Err(LabError::invalid(format!(
                "lan: {} hosts; use 1..={LAN_MAX}",
                hosts.len()
            )));
        }
        let sw = self.host("switch")?;
        let ns = sw.netns().to_string();
        cmd::run_args("ip", &["-n", &ns, "link", "add", "br0", "type", "bridge"])?;
        cmd::run_args("ip", &["-n", &ns, "link", "set", "br0", "up"])?;
        let mut addrs = Vec::with_capacity(hosts.len());
        for (i, h) in hosts.iter().enumerate() {
            let [a, b, c] = LAN_NET;
            let last = u8::try_from(i + 1).expect("at most LAN_MAX hosts");
            let ip = std::net::Ipv4Addr::new(a, b, c, last);
            let opts = LinkOpts {
                addr_a: vec![format!("{ip}/24")],
                ..LinkOpts::default()
            };
            let link = self.link(h, &sw, &opts)?;
            cmd::run_args(
                "ip",
                &["-n", &ns, "link", "set", &link.b.name, "master", "br0"],
            )?;
            addrs.push(ip);
        }
        Ok(addrs)
    }
}
