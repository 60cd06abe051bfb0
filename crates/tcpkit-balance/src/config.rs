//! What a balancer is asked to do, resolved and checked: services (a VIP and its backends)
//! and how a backend is chosen. Every check that involves more than one value happens here,
//! so the loader only ever sees a valid set.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

/// How a connect picks its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Uniformly at random (bpf_get_prandom_u32), independently for each connect.
    Random,
    /// In turn, one counter per service shared by every CPU (atomic add).
    RoundRobin,
    /// At random in proportion to the backends' weights (a random slot of a table). Was
    /// called `weighted`, which the file and flags still accept.
    WeightedRandom,
    /// In turn in proportion to the weights, interleaved (nginx's smooth weighted round
    /// robin): ipvs wrr. Exact when the weights over their greatest common divisor add up to
    /// at most RING_SIZE, within one slot of RING_SIZE otherwise.
    WeightedRoundRobin,
    /// The backend with the fewest sockets open now (ipvs lc); ties in turn.
    LeastConn,
    /// The fewest open sockets per unit of weight (ipvs wlc).
    WeightedLeastConn,
    /// Maglev consistent hashing (weighted): the same key lands on the same backend while
    /// the set is stable, and few keys move when it changes.
    Maglev(HashKey),
}

/// What maglev hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKey {
    /// The client's address and port, as IPVS mh with its port flag: the socket's bound
    /// source address in its network namespace and its bound port (an unbound socket has no
    /// port yet: its cookie stands in, so each such socket is placed on its own).
    Client,
    /// The client host only: the bound source address in its network namespace (one
    /// namespace's unbound sockets are one client, all on one backend), as IPVS mh without
    /// the port flag.
    Host,
    /// The socket cookie: each socket on its own.
    Cookie,
}

impl HashKey {
    pub fn name(self) -> &'static str {
        match self {
            HashKey::Client => "client",
            HashKey::Host => "host",
            HashKey::Cookie => "cookie",
        }
    }
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Random => "random",
            Algorithm::RoundRobin => "round-robin",
            Algorithm::WeightedRandom => "weighted-random",
            Algorithm::WeightedRoundRobin => "weighted-round-robin",
            Algorithm::LeastConn => "least-conn",
            Algorithm::WeightedLeastConn => "weighted-least-conn",
            Algorithm::Maglev(_) => "maglev",
        }
    }

    /// The algorithm a configuration names (ipvsadm's short names too: rr, wrr, lc, wlc,
    /// mh; `weighted`, the old name of weighted-random); maglev's key is set apart.
    pub fn parse(name: &str) -> Option<Algorithm> {
        Some(match name {
            "random" => Algorithm::Random,
            "round-robin" | "rr" => Algorithm::RoundRobin,
            "weighted-random" | "weighted" => Algorithm::WeightedRandom,
            "weighted-round-robin" | "wrr" => Algorithm::WeightedRoundRobin,
            "least-conn" | "lc" => Algorithm::LeastConn,
            "weighted-least-conn" | "wlc" => Algorithm::WeightedLeastConn,
            "maglev" | "mh" => Algorithm::Maglev(HashKey::Client),
            _ => return None,
        })
    }

    /// What maglev hashes, by name; None for the other algorithms.
    pub fn hash_key(self) -> Option<&'static str> {
        match self {
            Algorithm::Maglev(k) => Some(k.name()),
            _ => None,
        }
    }

    /// The names [`Algorithm::parse`] takes, as an error lists them.
    pub const NAMES: &'static str = "random, round-robin (rr), weighted-random (weighted), \
        weighted-round-robin (wrr), least-conn (lc), weighted-least-conn (wlc), maglev (mh)";

    /// Whether backends' weights above 1 mean anything to this algorithm (0 drains under
    /// every one).
    pub fn weighs(self) -> bool {
        matches!(
            self,
            Algorithm::WeightedRandom
                | Algorithm::WeightedRoundRobin
                | Algorithm::WeightedLeastConn
                | Algorithm::Maglev(_)
        )
    }
}

/// Which sockets a service balances: TCP connects, UDP (connected and unconnected), or both
/// (`run`, whose --vip names no protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Both,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Both => "tcp+udp",
        }
    }

    /// The IP protocol numbers the BPF map is keyed by (bpf/balance.h svc_key.proto).
    pub fn numbers(self) -> &'static [u8] {
        match self {
            Protocol::Tcp => &[6],
            Protocol::Udp => &[17],
            Protocol::Both => &[6, 17],
        }
    }
}

/// One virtual address and the backends behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub vip: SocketAddr,
    pub protocol: Protocol,
    pub backends: Vec<Backend>,
    pub algorithm: Algorithm,
    /// A client (its bound source address in its network namespace) keeps its backend this
    /// long after its last connect, as ipvsadm -p; None: each connect is placed anew.
    pub persistence: Option<Duration>,
}

/// A real server and its weight (1 unless given; 0 drains it: no new sockets are sent to it,
/// those open stay, as ipvsadm's weight 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    pub addr: SocketAddr,
    pub weight: u32,
}

/// Largest weight: a backend's share of a table is kept to within 1/RING_SIZE, so weights
/// beyond a few thousand mean nothing more.
pub const MAX_WEIGHT: u32 = 1000;

/// Longest persistence: the kernel side keeps it in milliseconds in 32 bits; a day is more
/// than any ipvsadm -p in use.
pub const MAX_PERSISTENCE: Duration = Duration::from_secs(86_400);

/// Most backends one service holds, and most services one balancer holds: the BPF maps'
/// slots (bpf/balance.h).
pub use crate::bpf::{MAX_BACKENDS, MAX_SERVICES};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--vip {0}: port 0 is not a port to balance")]
    VipPortZero(SocketAddr),
    #[error("--backend {0}: port 0 is not a port to connect to")]
    BackendPortZero(SocketAddr),
    #[error("--backend {0}: the same address as the VIP (connects would loop back to it)")]
    BackendIsVip(SocketAddr),
    #[error("--backend {0}: given twice")]
    DuplicateBackend(SocketAddr),
    #[error("--backend: {0} given, at most {MAX_BACKENDS} per VIP")]
    TooManyBackends(usize),
    #[error("--backend {1}: not the same address family as --vip {0}")]
    FamilyMismatch(SocketAddr, SocketAddr),
    #[error("--backend {0}@{1}: a weight is 0 (drained) to {MAX_WEIGHT}")]
    BadWeight(SocketAddr, u32),
    #[error("--backend {0}@{1}: weights above 1 need --algorithm weighted-random, weighted-round-robin, weighted-least-conn or maglev, not {2}")]
    WeightUnused(SocketAddr, u32, &'static str),
    #[error("--persistent {0:?}: from 1ms to 1 day")]
    Persistence(Duration),
    #[error("--vip {0}: given twice for {1}")]
    DuplicateVip(SocketAddr, &'static str),
    #[error("{0} services given, at most {MAX_SERVICES}")]
    TooManyServices(usize),
    #[error("--health-interval {0:?}: at least {min:?} (each backend is probed once an interval; below that the probes alone keep a core busy)", min = crate::health::MIN_INTERVAL)]
    HealthInterval(Duration),
    #[error("--vip {0}: a v4-mapped address is never matched (an IPv6 socket's connect to it is balanced by the IPv4 VIP): give it as {1}")]
    MappedVip(SocketAddr, SocketAddr),
    #[error("--health-timeout 0: give a duration above 0")]
    HealthTimeout,
    #[error("--rise and --fall count probes: 1 or more")]
    RiseFall,
    #[error("--health-{0}: at most {1} bytes")]
    HealthPayload(&'static str, usize),
    #[error("--health-expect: a UDP probe expects a reply to --health-send, which is missing")]
    UdpExpectWithoutSend,
}

impl Service {
    /// Checks one service on its own.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.vip.port() == 0 {
            return Err(ConfigError::VipPortZero(self.vip));
        }
        if let SocketAddr::V6(v6) = self.vip {
            if let Some(v4) = v6.ip().to_ipv4_mapped() {
                return Err(ConfigError::MappedVip(
                    self.vip,
                    SocketAddr::from((v4, v6.port())),
                ));
            }
        }
        if self.backends.len() > MAX_BACKENDS {
            return Err(ConfigError::TooManyBackends(self.backends.len()));
        }
        if let Some(p) = self.persistence {
            if p < Duration::from_millis(1) || p > MAX_PERSISTENCE {
                return Err(ConfigError::Persistence(p));
            }
        }
        let mut seen = HashSet::new();
        for Backend { addr: b, weight } in &self.backends {
            if *weight > MAX_WEIGHT {
                return Err(ConfigError::BadWeight(*b, *weight));
            }
            if *weight > 1 && !self.algorithm.weighs() {
                return Err(ConfigError::WeightUnused(
                    *b,
                    *weight,
                    self.algorithm.name(),
                ));
            }
            if b.port() == 0 {
                return Err(ConfigError::BackendPortZero(*b));
            }
            if b.is_ipv4() != self.vip.is_ipv4() {
                return Err(ConfigError::FamilyMismatch(self.vip, *b));
            }
            if *b == self.vip {
                return Err(ConfigError::BackendIsVip(*b));
            }
            if !seen.insert(*b) {
                return Err(ConfigError::DuplicateBackend(*b));
            }
        }
        Ok(())
    }
}

/// Checks a whole set of services: each one, and no VIP twice.
pub fn check(services: &[Service]) -> Result<(), ConfigError> {
    if services.len() > MAX_SERVICES {
        return Err(ConfigError::TooManyServices(services.len()));
    }
    let mut vips = HashSet::new();
    for s in services {
        s.check()?;
        for p in s.protocol.numbers() {
            if !vips.insert((s.vip, *p)) {
                let name = if *p == 6 { "tcp" } else { "udp" };
                return Err(ConfigError::DuplicateVip(s.vip, name));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(vip: &str, backends: &[&str]) -> Service {
        Service {
            vip: vip.parse().unwrap(),
            backends: backends
                .iter()
                .map(|b| Backend {
                    addr: b.parse().unwrap(),
                    weight: 1,
                })
                .collect(),
            algorithm: Algorithm::Random,
            protocol: Protocol::Both,
            persistence: None,
        }
    }

    #[test]
    fn a_valid_service_passes() {
        check(&[svc("198.19.0.1:80", &["198.18.0.2:80", "198.18.0.2:81"])]).unwrap();
        // No backend is valid: its connects are refused.
        check(&[svc("198.19.0.1:80", &[])]).unwrap();
    }

    #[test]
    fn each_bad_value_has_its_own_error() {
        let cases = [
            (
                svc("198.19.0.1:0", &["198.18.0.2:80"]),
                "--vip 198.19.0.1:0: port 0",
            ),
            (
                svc("198.19.0.1:80", &["198.18.0.2:0"]),
                "--backend 198.18.0.2:0: port 0",
            ),
            (
                svc("198.19.0.1:80", &["198.19.0.1:80"]),
                "the same address as the VIP",
            ),
            (
                svc("198.19.0.1:80", &["198.18.0.2:80", "198.18.0.2:80"]),
                "--backend 198.18.0.2:80: given twice",
            ),
        ];
        for (s, want) in cases {
            let e = check(&[s]).unwrap_err().to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
        let many: Vec<String> = (1..=65).map(|p| format!("198.18.0.2:{p}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            check(&[svc("198.19.0.1:80", &many)]),
            Err(ConfigError::TooManyBackends(65))
        );
        assert!(matches!(
            check(&[svc("198.19.0.1:80", &["[fd00:18::2]:80"])]),
            Err(ConfigError::FamilyMismatch(..))
        ));
        check(&[svc("[fd00:19::1]:80", &["[fd00:18::2]:80"])]).unwrap();
        let mut w = svc("198.19.0.1:80", &["198.18.0.2:80"]);
        w.backends[0].weight = 3;
        assert!(matches!(
            check(&[w.clone()]),
            Err(ConfigError::WeightUnused(..))
        ));
        w.algorithm = Algorithm::WeightedRandom;
        check(&[w.clone()]).unwrap();
        w.backends[0].weight = 1001;
        assert!(matches!(check(&[w]), Err(ConfigError::BadWeight(..))));
        // Weight 0 drains, under any algorithm.
        let mut d = svc("198.19.0.1:80", &["198.18.0.2:80"]);
        d.backends[0].weight = 0;
        check(&[d.clone()]).unwrap();
        d.persistence = Some(Duration::ZERO);
        assert!(matches!(check(&[d]), Err(ConfigError::Persistence(..))));
        let s = svc("198.19.0.1:80", &["198.18.0.2:80"]);
        assert!(matches!(
            check(&[s.clone(), s.clone()]),
            Err(ConfigError::DuplicateVip(..))
        ));
        // The same VIP for TCP and for UDP is two services.
        let (mut t, mut u) = (s.clone(), s.clone());
        t.protocol = Protocol::Tcp;
        u.protocol = Protocol::Udp;
        check(&[t.clone(), u]).unwrap();
        assert!(check(&[t, s]).is_err());
    }
}
