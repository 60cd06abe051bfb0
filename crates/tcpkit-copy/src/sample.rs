//! `-r PCT` and `--ramp S`: which sessions are copied.
//!
//! The decision is a pure function of the exact client and server addresses (both IP and
//! port), so a session is wholly in or wholly out, the same in every run and in every `copy`
//! process that sees it. The hash only spreads sessions over 10 000 buckets; it is never a
//! connection key (sessions are keyed by their exact 4-tuple elsewhere).

use std::net::{IpAddr, SocketAddr};

/// Buckets a session falls in: `-r` has a resolution of 0.01 %.
pub const BUCKETS: u64 = 10_000;

/// The bucket (0..BUCKETS) of the session `client` → `server`.
pub fn bucket(client: SocketAddr, server: SocketAddr) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for a in [client, server] {
        match a.ip() {
            IpAddr::V4(ip) => eat(&ip.octets()),
            IpAddr::V6(ip) => eat(&ip.octets()),
        }
        eat(&a.port().to_be_bytes());
    }
    // FNV alone leaves the low bits of nearby ports correlated: finish with splitmix64.
    let mut z = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % BUCKETS
}

/// The sampling percentage at a point of the run, ramping linearly from 0 to `percent`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// 0 to 100.
    pub percent: f64,
    /// Length of the ramp from 0 % (0: none).
    pub ramp_ns: u64,
}

impl Sampler {
    /// The percentage in force `elapsed_ns` after the copy started.
    pub fn percent_at(&self, elapsed_ns: u64) -> f64 {
        if self.ramp_ns == 0 || elapsed_ns >= self.ramp_ns {
            self.percent
        } else {
            self.percent * elapsed_ns as f64 / self.ramp_ns as f64
        }
    }

    /// Whether the session `client` → `server`, opening `elapsed_ns` after the start, is copied.
    pub fn selects(&self, client: SocketAddr, server: SocketAddr, elapsed_ns: u64) -> bool {
        let threshold = (self.percent_at(elapsed_ns) * (BUCKETS as f64 / 100.0)).round() as u64;
        bucket(client, server) < threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn all_none_and_half() {
        let srv = sa("10.0.0.1:80");
        let all = Sampler {
            percent: 100.0,
            ramp_ns: 0,
        };
        let none = Sampler {
            percent: 0.0,
            ramp_ns: 0,
        };
        let half = Sampler {
            percent: 50.0,
            ramp_ns: 0,
        };
        let mut n = 0;
        for p in 1024..11024u16 {
            let c = SocketAddr::new("10.0.0.9".parse().unwrap(), p);
            assert!(all.selects(c, srv, 0));
            assert!(!none.selects(c, srv, 0));
            n += u32::from(half.selects(c, srv, 0));
            // Same answer every time, and for the same 4-tuple seen later.
            assert_eq!(half.selects(c, srv, 0), half.selects(c, srv, 99));
        }
        assert!((4700..5300).contains(&n), "{n} of 10000 at 50 %");
        // The whole 4-tuple counts: another server, another decision somewhere.
        let other = sa("10.0.0.2:80");
        assert!((1024..2024u16).any(|p| {
            let c = SocketAddr::new("10.0.0.9".parse().unwrap(), p);
            half.selects(c, srv, 0) != half.selects(c, other, 0)
        }));
        assert_eq!(
            bucket(sa("[fd00::1]:5000"), sa("[fd00::2]:80")),
            bucket(sa("[fd00::1]:5000"), sa("[fd00::2]:80"))
        );
    }

    #[test]
    fn ramp_goes_from_zero_to_the_percentage() {
        let s = Sampler {
            percent: 40.0,
            ramp_ns: 10_000,
        };
        assert_eq!(s.percent_at(0), 0.0);
        assert_eq!(s.percent_at(5_000), 20.0);
        assert_eq!(s.percent_at(10_000), 40.0);
        assert_eq!(s.percent_at(1 << 40), 40.0);
        let c = sa("10.0.0.9:4000");
        assert!(!s.selects(c, sa("10.0.0.1:80"), 0));
    }
}
