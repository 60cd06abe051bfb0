//! A real DNS resolver in the lab: Debian's unbound started by [`Lab::unbound`] in a host, in
//! the foreground, from a configuration of its own ([`UnboundConf`]): plain DNS (UDP and TCP),
//! DNS over TLS and DNS over HTTPS (unbound 1.17 is built with libnghttp2: DoH is HTTP/2 only)
//! with a [`CertKey`] of a [`TestCa`](crate::TestCa), answering from a static local zone:
//! [`WWW_EXAMPLE`] A [`WWW_EXAMPLE_A`], NXDOMAIN for every other name under `example.`. Its
//! statistics (`unbound-control stats_noreset` over a Unix socket of its own) tell which
//! transport each query came by and how many TLS sessions were resumed: the server's own
//! account of what a client did. Nothing of the system's unbound configuration is read.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tls::{write, CertKey};
use crate::{cmd, Host, Lab, LabError, Proc};

/// The name the local zone answers, and its address.
pub const WWW_EXAMPLE: &str = "www.example";
/// The A record of [`WWW_EXAMPLE`].
pub const WWW_EXAMPLE_A: &str = "198.18.0.53";
/// The path unbound answers DoH on (RFC 8484's example, and dnsperf's and load's default).
pub const DOH_PATH: &str = "/dns-query";
/// Debian's unbound and its control tool.
pub const UNBOUND: &str = "/usr/sbin/unbound";
const UNBOUND_CONTROL: &str = "/usr/sbin/unbound-control";

/// How long unbound gets to listen on every port.
const LISTEN_WITHIN: Duration = Duration::from_secs(10);

/// What an unbound of the lab listens on and how much it holds.
#[derive(Debug, Clone)]
pub struct UnboundConf {
    /// The address it listens on (an address of its host).
    pub addr: IpAddr,
    /// Plain DNS over UDP and TCP, if any.
    pub dns_port: Option<u16>,
    /// DNS over TLS (RFC 7858), if any; needs `cert`.
    pub dot_port: Option<u16>,
    /// DNS over HTTPS (RFC 8484, HTTP/2 over TLS, on [`DOH_PATH`]), if any; needs `cert`.
    pub doh_port: Option<u16>,
    /// The server certificate of DoT and DoH.
    pub cert: Option<CertKey>,
    /// TCP, TLS and HTTPS connections it holds at once (`incoming-num-tcp`).
    pub tcp_conns: u32,
    /// Threads (`num-threads`).
    pub threads: u32,
}

impl UnboundConf {
    /// One thread on `addr`: DoT on 853 and DoH on 443 with `cert`, plain DNS on 53, up to 256
    /// connections.
    pub fn tls(addr: IpAddr, cert: CertKey) -> UnboundConf {
        UnboundConf {
            addr,
            dns_port: Some(53),
            dot_port: Some(853),
            doh_port: Some(443),
            cert: Some(cert),
            tcp_conns: 256,
            threads: 1,
        }
    }

    /// Every port it listens on, plain first.
    fn ports(&self) -> Vec<u16> {
        [self.dns_port, self.dot_port, self.doh_port]
            .into_iter()
            .flatten()
            .collect()
    }

    /// `dir/unbound.conf` from these settings; its path. (Resumption needs nothing more:
    /// unbound's OpenSSL issues TLS 1.3 tickets with keys of its own.)
    fn write(&self, dir: &Path) -> Result<PathBuf, LabError> {
        let ports = self.ports();
        if ports.is_empty() {
            return Err(LabError::invalid("unbound: give at least one port"));
        }
        let d = dir.display();
        let addr = self.addr;
        let mut text = String::from("server:\n");
        for p in &ports {
            text.push_str(&format!("    interface: {addr}@{p}\n"));
        }
        if let Some(p) = self.dns_port {
            text.push_str(&format!("    port: {p}\n"));
        }
        let tls = self.dot_port.is_some() || self.doh_port.is_some();
        match (&self.cert, tls) {
            (Some(c), true) => {
                text.push_str(&format!(
                    "    tls-service-key: \"{}\"\n    tls-service-pem: \"{}\"\n",
                    c.key.display(),
                    c.cert.display()
                ));
            }
            (None, true) => {
                return Err(LabError::invalid(
                    "unbound: DoT and DoH need a certificate (UnboundConf::cert)",
                ))
            }
            _ => {}
        }
        if let Some(p) = self.dot_port {
            text.push_str(&format!("    tls-port: {p}\n"));
        }
        if let Some(p) = self.doh_port {
            text.push_str(&format!(
                "    https-port: {p}\n    http-endpoint: \"{DOH_PATH}\"\n"
            ));
        }
        text.push_str(&format!(
            "    do-ip4: yes\n    do-ip6: yes\n    do-udp: yes\n    do-tcp: yes\n    \
             incoming-num-tcp: {conns}\n    num-threads: {threads}\n    chroot: \"\"\n    \
             username: \"\"\n    directory: \"{d}\"\n    pidfile: \"{d}/unbound.pid\"\n    \
             use-syslog: no\n    logfile: \"\"\n    verbosity: 1\n    \
             extended-statistics: yes\n    \
             access-control: 127.0.0.0/8 allow\n    access-control: 198.18.0.0/15 allow\n    \
             access-control: ::1 allow\n    access-control: fd00::/8 allow\n    \
             local-zone: \"example.\" static\n    \
             local-data: \"{WWW_EXAMPLE}. A {WWW_EXAMPLE_A}\"\n\
             remote-control:\n    control-enable: yes\n    \
             control-interface: \"{d}/unbound.ctl\"\n    control-use-cert: no\n",
            conns = self.tcp_conns,
            threads = self.threads.max(1),
        ));
        let path = dir.join("unbound.conf");
        write(&path, &text)?;
        Ok(path)
    }
}

/// An unbound started by [`Lab::unbound`]; the lab stops it on drop, also after a panic.
#[derive(Debug)]
pub struct Unbound {
    /// The process (its log is unbound's stderr).
    pub proc: Proc,
    conf: PathBuf,
    addr: IpAddr,
    dot_port: Option<u16>,
    doh_port: Option<u16>,
}

impl Unbound {
    /// Its configuration file.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// Where it answers DNS over TLS.
    pub fn dot(&self) -> Option<SocketAddr> {
        self.dot_port.map(|p| SocketAddr::new(self.addr, p))
    }

    /// Where it answers DNS over HTTPS (on [`DOH_PATH`]).
    pub fn doh(&self) -> Option<SocketAddr> {
        self.doh_port.map(|p| SocketAddr::new(self.addr, p))
    }

    /// Its counters since start (`unbound-control stats_noreset`): `total.num.queries`,
    /// `num.query.tcp` (queries over TCP, TLS included), `num.query.tls` (over TLS, DoH
    /// included), `num.query.tls.resume` (over a resumed TLS session), `num.query.https`
    /// (DoH), `num.answer.rcode.NOERROR`, `num.answer.rcode.NXDOMAIN`, ...
    pub fn stats(&self) -> Result<BTreeMap<String, f64>, LabError> {
        let conf = self.conf.to_string_lossy();
        let out = cmd::run_args(UNBOUND_CONTROL, &["-c", &conf, "stats_noreset"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let stats: BTreeMap<String, f64> = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once('=')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        if stats.is_empty() {
            return Err(LabError::Parse {
                cmd: format!("{UNBOUND_CONTROL} -c {conf} stats_noreset"),
                why: format!("no counters in: {}", cmd::tail(&out.stdout, &out.stderr)),
            });
        }
        Ok(stats)
    }

    /// One counter of [`Unbound::stats`], 0 when unbound has not counted anything under it yet
    /// (it leaves out rcodes and transports it has not seen).
    pub fn stat(&self, name: &str) -> Result<u64, LabError> {
        Ok(self.stats()?.get(name).copied().unwrap_or(0.0) as u64)
    }
}

impl Lab {
    /// Starts Debian's unbound in `host` as `conf` says, in the foreground (`-d`), its files in
    /// a directory of the lab's; returns once it accepts TCP connections on every port. A
    /// missing unbound is one clear error naming the package.
    pub fn unbound(&mut self, host: &Host, conf: &UnboundConf) -> Result<Unbound, LabError> {
        if !Path::new(UNBOUND).exists() {
            return Err(LabError::invalid(format!(
                "{UNBOUND} is not installed (apt-get install unbound; scripts/setup.sh does)"
            )));
        }
        let ports = conf.ports();
        let name = format!("unbound-{}", ports.first().copied().unwrap_or(0));
        let dir = self.dir().join(format!("{}-{name}", host.name()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| LabError::io(format!("create {}", dir.display()), e))?;
        let path = conf.write(&dir)?;
        let path_s = path.to_string_lossy().into_owned();
        let proc = self.spawn_in(host, &name, &[UNBOUND, "-d", "-c", &path_s])?;
        let addrs: Vec<SocketAddr> = ports.iter().map(|&p| (conf.addr, p).into()).collect();
        crate::proc::wait_listening(host, &proc, &addrs, LISTEN_WITHIN, "unbound")?;
        Ok(Unbound {
            proc,
            conf: path,
            addr: conf.addr,
            dot_port: conf.dot_port,
            doh_port: conf.doh_port,
        })
    }
}
