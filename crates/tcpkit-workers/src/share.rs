//! How one run is shared out: the `K/N` syntax (`--worker K/N[/T]`, the processes of one host,
//! counting from 0; `--shard K/N`, the agents of a fleet, counting from 1 as jest and playwright
//! count theirs) and the arithmetic both levels use, written once: near-equal shares with exact
//! remainders, where a share starts, which items of a sequence dealt round-robin are a shard's,
//! where a shard's arrivals fall in the fleet's evenly spaced schedule, and its random stream.

use std::fmt;

/// `part` of `total` split in `n` near-equal shares: the first `total % n` get one more
/// (10 over 3 is 4/3/3). 0 when `n` is 0.
pub fn share(total: u64, n: u64, part: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    total / n + u64::from(part < total % n)
}

/// Sum of the shares before `part`: where `part`'s share starts.
pub fn share_offset(total: u64, n: u64, part: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let part = part.min(n);
    part * (total / n) + part.min(total % n)
}

/// The numbers of `K/N[/...]`, at most `most` of them; None unless each is a plain decimal.
fn numbers(text: &str, most: usize) -> Option<Vec<u64>> {
    let v: Vec<u64> = text
        .split('/')
        .map(|p| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                p.parse().ok()
            }
        })
        .collect::<Option<_>>()?;
    (2..=most).contains(&v.len()).then_some(v)
}

/// `K/N[/T]` for the internal `--worker` flag: K from 0, K < N, T ≥ 1.
pub(crate) fn worker_numbers(text: &str) -> Option<(u32, u32, Option<u64>)> {
    let v = numbers(text, 3)?;
    let (k, n) = (u32::try_from(v[0]).ok()?, u32::try_from(v[1]).ok()?);
    let t = v.get(2).copied();
    (k < n && t != Some(0)).then_some((k, n, t))
}

/// One agent's part of a run several hosts share (`--shard K/N`): shard `index` of `count`,
/// `index` from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    /// This agent's shard, 1 to `count`.
    pub index: u32,
    /// How many shards the run has.
    pub count: u32,
}

impl Shard {
    /// Parses `K/N` (1 ≤ K ≤ N); the error is one line naming `--shard` and what was wrong.
    pub fn parse(text: &str) -> Result<Shard, String> {
        let Some(v) = numbers(text, 2) else {
            return Err(format!(
                "--shard '{text}': expected K/N, this agent's shard K of N (K from 1 to N, like 2/3)"
            ));
        };
        let (Ok(k), Ok(n)) = (u32::try_from(v[0]), u32::try_from(v[1])) else {
            return Err(format!("--shard '{text}': K and N must be below 2^32"));
        };
        if n == 0 {
            return Err(format!(
                "--shard '{text}': N is 0; a run has at least 1 shard"
            ));
        }
        if k == 0 {
            return Err(format!(
                "--shard '{text}': shards count from 1 (the first is 1/{n})"
            ));
        }
        if k > n {
            return Err(format!(
                "--shard '{text}': K is above N (the shards are 1/{n} to {n}/{n})"
            ));
        }
        Ok(Shard { index: k, count: n })
    }

    /// The whole run as one shard (`1/1`).
    pub const WHOLE: Shard = Shard { index: 1, count: 1 };

    /// This shard's part number from 0.
    pub fn part(&self) -> u64 {
        u64::from(self.index - 1)
    }

    /// This shard's share of `total` (10 over 3 shards: 4, 3, 3).
    pub fn share(&self, total: u64) -> u64 {
        share(total, u64::from(self.count), self.part())
    }

    /// Where this shard's share of `total` starts.
    pub fn offset(&self, total: u64) -> u64 {
        share_offset(total, u64::from(self.count), self.part())
    }

    /// Whether item `i` (from 0) of a sequence dealt round-robin is this shard's: `i mod N =
    /// K - 1`. The shards' items are disjoint and together the whole sequence; the first
    /// `total` items give each shard [`Shard::share`] of them.
    pub fn takes(&self, i: u64) -> bool {
        i % u64::from(self.count) == self.part()
    }

    /// This shard's fraction of a rate: 1/N.
    pub fn fraction(&self) -> f64 {
        1.0 / f64::from(self.count)
    }

    /// Where this shard's arrivals sit in the fleet's evenly spaced schedule, as a fraction of
    /// one of its own gaps: (K - 1)/N. The fleet's arrival `g` (at `g / R`) is shard
    /// `g mod N + 1`'s arrival `g div N`, so with the shard's rate R/N its arrival `i` is at
    /// `(i + phase) / (R / N)`: shard K's first at (K - 1)/R, and the union of the N shards
    /// evenly spaced at 1/R instead of N arrivals at once.
    pub fn phase(&self) -> f64 {
        f64::from(self.index - 1) / f64::from(self.count)
    }

    /// The seed of this shard's random stream, from the run's `seed`: the same seed and shard
    /// give the same stream, two shards different ones; the whole run (`1/1`) keeps `seed`.
    pub fn seed(&self, seed: u64) -> u64 {
        if self.count == 1 {
            return seed;
        }
        // SplitMix64's finalizer over the seed moved by the shard: nearby seeds and shards
        // give unrelated streams.
        let mut z = seed ^ u64::from(self.index).wrapping_mul(0xD1B5_4A32_D192_ED03);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remainders_go_to_the_first_shares() {
        let s: Vec<u64> = (0..3).map(|p| share(10, 3, p)).collect();
        assert_eq!(s, [4, 3, 3]);
        let o: Vec<u64> = (0..=3).map(|p| share_offset(10, 3, p)).collect();
        assert_eq!(o, [0, 4, 7, 10]);
        for (total, n) in [(0, 1), (1, 3), (7, 7), (100, 7), (u64::MAX, 3), (5, 9)] {
            let sum: u64 = (0..n).map(|p| share(total, n, p)).sum();
            assert_eq!(sum, total, "{total} over {n}");
            for p in 0..n {
                let by_sum: u64 = (0..p).map(|q| share(total, n, q)).sum();
                assert_eq!(
                    share_offset(total, n, p),
                    by_sum,
                    "{total} over {n}, part {p}"
                );
                assert!(share(total, n, p).abs_diff(total / n) <= 1);
            }
        }
        assert_eq!(share(5, 0, 0), 0);
        assert_eq!(share_offset(5, 0, 0), 0);
    }

    #[test]
    fn shards_parse_from_one() {
        let s = Shard::parse("2/3").unwrap();
        assert_eq!(s, Shard { index: 2, count: 3 });
        assert_eq!(s.to_string(), "2/3");
        assert_eq!(Shard::parse("1/1").unwrap(), Shard::WHOLE);
        for (bad, why) in [
            ("0/3", "count from 1"),
            ("4/3", "K is above N"),
            ("1/0", "N is 0"),
            ("0/0", "N is 0"),
            ("", "expected K/N"),
            ("2", "expected K/N"),
            ("a/3", "expected K/N"),
            ("1/3/2", "expected K/N"),
            ("-1/3", "expected K/N"),
            ("+1/3", "expected K/N"),
            (" 1/3", "expected K/N"),
            ("1/99999999999", "below 2^32"),
        ] {
            let e = Shard::parse(bad).unwrap_err();
            assert!(e.starts_with(&format!("--shard '{bad}': ")), "{e}");
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn ten_over_three_is_four_three_three() {
        let shards: Vec<Shard> = (1..=3).map(|k| Shard { index: k, count: 3 }).collect();
        let c: Vec<u64> = shards.iter().map(|s| s.share(10)).collect();
        assert_eq!(c, [4, 3, 3]);
        let o: Vec<u64> = shards.iter().map(|s| s.offset(10)).collect();
        assert_eq!(o, [0, 4, 7]);
        // Lines dealt round-robin: disjoint, the union is all, and the first `total` give
        // each shard its share (the first shards the extra ones).
        for total in [0u64, 1, 2, 3, 10, 11] {
            let mut seen = vec![0; total as usize];
            for s in &shards {
                let mine: Vec<u64> = (0..total).filter(|&i| s.takes(i)).collect();
                assert_eq!(mine.len() as u64, s.share(total), "{s} of {total}");
                for i in mine {
                    seen[i as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{total}: {seen:?}");
        }
        assert!(Shard::WHOLE.takes(5));
    }

    /// The phase shift: shard K's arrival i at (i + (K-1)/N) gaps of its rate R/N, so the N
    /// shards' arrivals together are the fleet's, evenly spaced at 1/R.
    #[test]
    fn shifted_shards_interleave_evenly() {
        let r = 300.0;
        let n = 3;
        let mut all: Vec<f64> = Vec::new();
        for k in 1..=n {
            let s = Shard { index: k, count: n };
            assert!((s.fraction() * 3.0 - 1.0).abs() < 1e-12);
            let rate = r * s.fraction();
            all.extend((0..100).map(|i| (f64::from(i) + s.phase()) / rate));
        }
        all.sort_by(f64::total_cmp);
        for (g, t) in all.iter().enumerate() {
            assert!((t - g as f64 / r).abs() < 1e-9, "arrival {g} at {t}");
        }
        assert_eq!(Shard::WHOLE.phase(), 0.0);
        assert!((Shard { index: 3, count: 3 }.phase() - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn each_shard_has_its_own_stream() {
        let seeds: Vec<u64> = (1..=4)
            .map(|k| Shard { index: k, count: 4 }.seed(42))
            .collect();
        for (i, a) in seeds.iter().enumerate() {
            for b in &seeds[i + 1..] {
                assert_ne!(a, b);
            }
            assert_ne!(*a, 42);
        }
        // Reproducible, and a different run seed moves every shard.
        let s = Shard { index: 2, count: 4 };
        assert_eq!(s.seed(42), s.seed(42));
        assert_ne!(s.seed(42), s.seed(43));
        assert_eq!(Shard::WHOLE.seed(42), 42);
    }
}
