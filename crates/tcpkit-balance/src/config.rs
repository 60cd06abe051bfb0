//! What a balancer is asked to do, resolved and checked: services (a VIP and its backends)
//! and how a backend is chosen. Every check that involves more than one value happens here,
//! so the loader only ever sees a valid set.

use std::collections::HashSet;
use std::net::SocketAddr;

/// How a connect picks its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Uniformly at random (bpf_get_prandom_u32), independently for each connect.
    Random,
    /// In turn, one counter per service shared by every CPU (atomic add).
    RoundRobin,
    /// At random in proportion to the backends' weights (a random slot of a table).
    Weighted,
    /// Maglev consistent hashing (weighted): the same key lands on the same backend while
    /// the set is stable, and few keys move when it changes.
    Maglev(HashKey),
}

/// What maglev hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKey {
    /// The client: the socket's bound source address in its network namespace (an unbound
    /// socket's is empty, so one namespace's unbound sockets are one client).
    Client,
    /// The socket cookie: each socket on its own.
    Cookie,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Random => "random",
            Algorithm::RoundRobin => "round-robin",
            Algorithm::Weighted => "weighted",
            Algorithm::Maglev(_) => "maglev",
        }
    }

    /// Whether backends' weights mean anything to this algorithm.
    pub fn weighs(self) -> bool {
        matches!(self, Algorithm::Weighted | Algorithm::Maglev(_))
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
}

/// A real server and its weight (1 unless given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    pub addr: SocketAddr,
    pub weight: u32,
}

/// Largest weight: a backend's share of a table is kept to within 1/RING_SIZE, so weights
/// beyond a few thousand mean nothing more.
pub const MAX_WEIGHT: u32 = 1000;

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
    #[error("--backend {0}@{1}: a weight is 1 to {MAX_WEIGHT}")]
    BadWeight(SocketAddr, u32),
    #[error("--backend {0}@{1}: weights need --algorithm weighted or maglev, not {2}")]
    WeightUnused(SocketAddr, u32, &'static str),
    #[error("--vip {0}: given twice for {1}")]
    DuplicateVip(SocketAddr, &'static str),
    #[error("{0} services given, at most {MAX_SERVICES}")]
    TooManyServices(usize),
    #[error("--health-interval 0: give a duration above 0")]
    HealthInterval,
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
        if self.backends.len() > MAX_BACKENDS {
            return Err(ConfigError::TooManyBackends(self.backends.len()));
        }
        let mut seen = HashSet::new();
        for Backend { addr: b, weight } in &self.backends {
            if *weight == 0 || *weight > MAX_WEIGHT {
                return Err(ConfigError::BadWeight(*b, *weight));
            }
            if *weight != 1 && !self.algorithm.weighs() {
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
        w.algorithm = Algorithm::Weighted;
        check(&[w.clone()]).unwrap();
        w.backends[0].weight = 0;
        assert!(matches!(check(&[w]), Err(ConfigError::BadWeight(..))));
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
