//! Intended send times under a rate profile, as ns offsets from the query phase's start.
//!
//! Poisson arrivals: each thread draws its own process at its share of the rate, from a seed
//! of its own. Constant arrivals: the threads (of every process, and every `--shard` of a
//! fleet) deal one evenly spaced schedule between them ([`Lanes`]), so their sends together are
//! evenly spaced at the whole rate instead of each thread firing at once with the others.
//!
//! A constant rate maps arrival n to `n / rate` exactly (`tcpkit_pace::constant_at`). Steps
//! and ramps use the time-rescaling theorem: arrivals of a unit-rate process are cumulative
//! expected counts Λ, and each is mapped to the time t where ∫₀ᵗ rate = Λ. A Poisson process
//! stays Poisson (with the varying rate) and a constant one stays evenly spaced in Λ; all
//! times still come from one start, never from the previous send.

use tcpkit_pace::{constant_at, ArrivalClock, Arrivals};
use tcpkit_workers::{share, Shard};

use super::config::{ArrivalKind, RateProfile};

/// Which arrivals of this host's evenly spaced schedule one thread sends: arrival i (from 0)
/// is the thread's that holds connection `i mod cycle`, and a thread holds connections
/// `first, first + step, ...` (`count` of them: its process's block, dealt over its threads).
/// The threads' arrivals are disjoint and together every arrival, and each thread's share of
/// them is its share of the connections. `shard` places this host's schedule in the fleet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lanes {
    /// This host's connections (every process's).
    pub cycle: u64,
    pub first: u64,
    pub step: u64,
    pub count: u64,
    pub shard: Shard,
}

impl Lanes {
    /// Thread `t` of `threads` of a process whose connections are this host's
    /// `proc_first..proc_first + proc_conns` of `host_conns`: it holds the process's
    /// connections t, t + threads, ... (as the event loops number them).
    pub(crate) fn of(
        host_conns: u64,
        proc_first: u64,
        proc_conns: u64,
        threads: u64,
        t: u64,
        shard: Shard,
    ) -> Lanes {
        Lanes {
            cycle: host_conns,
            first: proc_first + t,
            step: threads.max(1),
            count: share(proc_conns, threads, t),
            shard,
        }
    }

    /// This host's arrival number of the thread's arrival `m`.
    fn index(&self, m: u64) -> u64 {
        let (round, q) = (m / self.count.max(1), m % self.count.max(1));
        round
            .saturating_mul(self.cycle)
            .saturating_add(self.first + q * self.step)
    }

    /// How many of this host's first `total` arrivals are this thread's (its part of `-n`).
    pub(crate) fn taken(&self, total: u64) -> u64 {
        if self.cycle == 0 || self.count == 0 {
            return 0;
        }
        let (rounds, rest) = (total / self.cycle, total % self.cycle);
        let in_rest = if rest <= self.first {
            0
        } else {
            ((rest - self.first - 1) / self.step.max(1) + 1).min(self.count)
        };
        rounds * self.count + in_rest
    }

    /// This thread's share of the host's rate.
    fn fraction(&self) -> f64 {
        if self.cycle == 0 {
            0.0
        } else {
            self.count as f64 / self.cycle as f64
        }
    }
}

#[derive(Debug)]
pub(crate) struct ArrivalTimes {
    source: Source,
    /// None: the source runs at the asked constant rate and its times are the send times.
    map: Option<Map>,
}

#[derive(Debug)]
enum Source {
    /// The thread's own Poisson process: at its share of the rate, or at one arrival per
    /// second of Λ (in the thread's own units) for a map.
    Clock(ArrivalClock),
    /// The thread's arrivals of the evenly spaced schedule; `m` is the next one's number.
    /// Direct: fleet arrival g at `g / fleet_rate`; a map takes Λ in this host's units,
    /// `index + phase`.
    Lanes {
        lanes: Lanes,
        m: u64,
        fleet_rate: f64,
    },
}

#[derive(Debug)]
enum Map {
    /// Piecewise-constant rate: `(start_ns, start_lambda, rate per ns)` per segment; `seg`
    /// remembers where the last lookup ended (Λ only grows).
    Steps {
        segs: Vec<(f64, f64, f64)>,
        seg: usize,
    },
    /// Rate from `r0` to `r1` (per ns) over `t_ns`, then `r1`.
    Ramp { r0: f64, r1: f64, t_ns: f64 },
}

impl ArrivalTimes {
    /// The arrivals of the thread `lanes` describes under this host's `profile` (its shard's,
    /// when sharded).
    pub(crate) fn new(profile: &RateProfile, kind: ArrivalKind, lanes: Lanes) -> ArrivalTimes {
        // Poisson: the thread's own process, its profile its share of the host's. Constant:
        // the host's profile, the thread picking its arrivals out of it.
        let (source, profile) = match kind {
            ArrivalKind::Poisson { seed } => {
                let own = profile.scaled(lanes.fraction());
                let rate = match own {
                    RateProfile::Constant(r) => r,
                    _ => 1.0,
                };
                let clock = ArrivalClock::new(Arrivals::Poisson { rate, seed });
                (Source::Clock(clock), own)
            }
            ArrivalKind::Constant => {
                let fleet_rate = match profile {
                    RateProfile::Constant(r) => r * f64::from(lanes.shard.count),
                    _ => 0.0,
                };
                let source = Source::Lanes {
                    lanes,
                    m: 0,
                    fleet_rate,
                };
                (source, profile.clone())
            }
        };
        let map = match profile {
            RateProfile::Constant(_) => None,
            RateProfile::Steps(steps) => {
                let mut segs = Vec::with_capacity(steps.len());
                let (mut t, mut l) = (0.0, 0.0);
                for &(d, r) in &steps {
                    let per_ns = r / 1e9;
                    segs.push((t, l, per_ns));
                    let d = d.as_nanos() as f64;
                    t += d;
                    l += per_ns * d;
                }
                Some(Map::Steps { segs, seg: 0 })
            }
            RateProfile::Ramp { from, to, over } => Some(Map::Ramp {
                r0: from / 1e9,
                r1: to / 1e9,
                t_ns: over.as_nanos() as f64,
            }),
        };
        ArrivalTimes { source, map }
    }

    /// The next intended send time (ns after the start); `u64::MAX` when the rate has dropped
    /// to zero for good.
    pub(crate) fn next_ns(&mut self) -> u64 {
        let Some(map) = &mut self.map else {
            return match &mut self.source {
                Source::Clock(c) => c.next().unwrap_or(u64::MAX),
                Source::Lanes {
                    lanes,
                    m,
                    fleet_rate,
                } => {
                    // Fleet arrival g = N·i + K - 1 (shard K of N; g = i unsharded).
                    let g = lanes
                        .index(std::mem::replace(m, *m + 1))
                        .saturating_mul(u64::from(lanes.shard.count))
                        .saturating_add(lanes.shard.part());
                    constant_at(*fleet_rate, g)
                }
            };
        };
        let lambda = match &mut self.source {
            // One arrival per second of this clock is one unit of Λ.
            Source::Clock(c) => c.next().unwrap_or(u64::MAX) as f64 / 1e9,
            Source::Lanes { lanes, m, .. } => {
                lanes.index(std::mem::replace(m, *m + 1)) as f64 + lanes.shard.phase()
            }
        };
        map.time_of(lambda)
    }
}

impl Map {
    /// The time t (ns) where ∫₀ᵗ rate = `lambda`.
    fn time_of(&mut self, lambda: f64) -> u64 {
        match self {
            Map::Steps { segs, seg } => {
                // The last segment whose start Λ is at or below `lambda` and whose rate is not
                // zero (a zero-rate segment has no arrivals in it).
                while *seg + 1 < segs.len() && segs[*seg + 1].1 <= lambda {
                    *seg += 1;
                }
                let mut s = *seg;
                while segs[s].2 <= 0.0 {
                    if s + 1 >= segs.len() {
                        return u64::MAX;
                    }
                    s += 1;
                }
                let (t0, l0, r) = segs[s];
                to_ns(t0 + (lambda - l0).max(0.0) / r)
            }
            Map::Ramp { r0, r1, t_ns } => {
                let a = (*r1 - *r0) / (2.0 * *t_ns);
                let at_end = *r0 * *t_ns + a * *t_ns * *t_ns;
                if lambda <= at_end {
                    // r0·t + a·t² = Λ, in the form that stays exact when a is 0 or negative.
                    let disc = (*r0 * *r0 + 4.0 * a * lambda).max(0.0);
                    let den = *r0 + disc.sqrt();
                    if den <= 0.0 {
                        return 0;
                    }
                    to_ns(2.0 * lambda / den)
                } else if *r1 > 0.0 {
                    to_ns(*t_ns + (lambda - at_end) / *r1)
                } else {
                    u64::MAX
                }
            }
        }
    }
}

fn to_ns(t: f64) -> u64 {
    if (0.0..1.8e19).contains(&t) {
        t as u64
    } else {
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tcpkit_workers::share_offset;

    /// One thread holding every connection of an unsharded run.
    fn whole() -> Lanes {
        Lanes::of(1, 0, 1, 1, 0, Shard::WHOLE)
    }

    fn count_before(p: &RateProfile, kind: ArrivalKind, t_ns: u64) -> u64 {
        let mut a = ArrivalTimes::new(p, kind, whole());
        let mut n = 0;
        while a.next_ns() < t_ns {
            n += 1;
        }
        n
    }

    #[test]
    fn constant_is_the_clock() {
        let mut a = ArrivalTimes::new(&RateProfile::Constant(4.0), ArrivalKind::Constant, whole());
        let v: Vec<u64> = (0..3).map(|_| a.next_ns()).collect();
        assert_eq!(v, [0, 250_000_000, 500_000_000]);
    }

    #[test]
    fn steps_follow_each_rate() {
        let p = RateProfile::Steps(vec![
            (Duration::from_secs(1), 1000.0),
            (Duration::from_secs(1), 0.0),
            (Duration::from_secs(1), 3000.0),
        ]);
        let mut a = ArrivalTimes::new(&p, ArrivalKind::Constant, whole());
        let times: Vec<u64> = (0..4000).map(|_| a.next_ns()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        let in_range =
            |lo: u64, hi: u64| times.iter().filter(|&&t| t >= lo && t < hi).count() as i64;
        assert!((in_range(0, 1_000_000_000) - 1000).abs() <= 1);
        assert_eq!(in_range(1_000_000_000, 2_000_000_000), 0);
        assert!((in_range(2_000_000_000, 3_000_000_000) - 3000).abs() <= 1);
        // Constant within a step: 1 ms gaps in the first, 333 µs in the last.
        assert!((times[11] - times[10]).abs_diff(1_000_000) < 2);
        assert!((times[2011] - times[2010]).abs_diff(333_333) < 2);
    }

    #[test]
    fn ramp_count_matches_the_integral() {
        let p = RateProfile::Ramp {
            from: 1000.0,
            to: 5000.0,
            over: Duration::from_secs(2),
        };
        for kind in [ArrivalKind::Constant, ArrivalKind::Poisson { seed: 3 }] {
            let n = count_before(&p, kind, 2_000_000_000) as f64;
            // Expected 6000; Poisson's sd is ~77.
            assert!((n - 6000.0).abs() < 300.0, "{kind:?}: {n}");
            let n2 = count_before(&p, kind, 3_000_000_000) as f64;
            assert!((n2 - 11_000.0).abs() < 400.0, "{kind:?}: {n2}");
        }
        // Rising rate: the gaps shrink.
        let mut a = ArrivalTimes::new(&p, ArrivalKind::Constant, whole());
        let t: Vec<u64> = (0..5000).map(|_| a.next_ns()).collect();
        assert!(t[11] - t[10] > t[4001] - t[4000]);
        // A falling ramp to zero ends.
        let down = RateProfile::Ramp {
            from: 1000.0,
            to: 0.0,
            over: Duration::from_secs(1),
        };
        assert!((count_before(&down, ArrivalKind::Constant, u64::MAX - 1) as i64 - 500).abs() <= 1);
    }

    /// Every thread of every process of every shard, as `-c conns --procs procs --threads
    /// threads --shard K/N` sets them up (each shard's profile its share of the fleet's).
    fn fleet_threads(conns: u64, n: u32, procs: u64, threads: u64) -> Vec<(Shard, Lanes)> {
        let mut out = Vec::new();
        for k in 1..=n {
            let shard = Shard { index: k, count: n };
            let host = shard.share(conns);
            for p in 0..procs {
                let (first, mine) = (share_offset(host, procs, p), share(host, procs, p));
                let t_here = threads.min(mine.max(1));
                for t in 0..t_here {
                    out.push((shard, Lanes::of(host, first, mine, t_here, t, shard)));
                }
            }
        }
        out
    }

    /// All arrivals before `t_ns` of every thread of the fleet, sorted.
    fn fleet_times(p: &RateProfile, fleet: &[(Shard, Lanes)], t_ns: u64) -> Vec<u64> {
        let mut all = Vec::new();
        for (shard, lanes) in fleet {
            let mut a =
                ArrivalTimes::new(&p.scaled(shard.fraction()), ArrivalKind::Constant, *lanes);
            loop {
                let t = a.next_ns();
                if t >= t_ns {
                    break;
                }
                all.push(t);
            }
        }
        all.sort_unstable();
        all
    }

    /// Constant arrivals: the shards (phase-shifted), their processes and their threads,
    /// whatever the remainders of -c, deal one schedule, evenly spaced at the whole rate: the
    /// same times to the ns as one thread alone at the whole rate.
    #[test]
    fn shards_processes_and_threads_deal_one_even_schedule() {
        let r = RateProfile::Constant(3000.0);
        let alone = fleet_times(&r, &fleet_threads(1, 1, 1, 1), 1_000_000_000);
        assert_eq!(alone.len(), 3000);
        assert_eq!(alone[1], 333_333);
        for (conns, n, procs, threads) in
            [(10, 3, 1, 2), (10, 3, 2, 1), (7, 1, 2, 3), (23, 4, 2, 2)]
        {
            let fleet = fleet_threads(conns, n, procs, threads);
            let all = fleet_times(&r, &fleet, 1_000_000_000);
            assert_eq!(
                all, alone,
                "-c {conns} over {n} shards, {procs} procs, {threads} threads"
            );
        }
        // Shard K of 3 starts (K-1)/R after the start, and then every 3/R.
        for (shard, lanes) in fleet_threads(10, 3, 1, 1) {
            let mut a =
                ArrivalTimes::new(&r.scaled(shard.fraction()), ArrivalKind::Constant, lanes);
            let first: Vec<u64> = (0..3).map(|_| a.next_ns()).collect();
            let k = u64::from(shard.index - 1);
            assert_eq!(
                first,
                [k, k + 3, k + 6].map(|g| g * 1_000_000_000 / 3000),
                "{shard}"
            );
        }
        // Unsharded, several threads no longer fire at once: before, every thread's first
        // arrival was at 0.
        let two = fleet_threads(4, 1, 1, 2);
        let firsts: Vec<u64> = two
            .iter()
            .map(|(s, l)| {
                ArrivalTimes::new(&r.scaled(s.fraction()), ArrivalKind::Constant, *l).next_ns()
            })
            .collect();
        assert_eq!(firsts, [0, 333_333]);
    }

    /// Steps and ramps divide by N too, and shards stay interleaved in Λ: the fleet's times
    /// are the lone run's (to float rounding, a ns).
    #[test]
    fn steps_and_ramps_are_shared_out_in_step() {
        for p in [
            RateProfile::Steps(vec![
                (Duration::from_millis(300), 1000.0),
                (Duration::from_millis(200), 0.0),
                (Duration::from_millis(500), 4000.0),
            ]),
            RateProfile::Ramp {
                from: 500.0,
                to: 5000.0,
                over: Duration::from_secs(1),
            },
        ] {
            let alone = fleet_times(&p, &fleet_threads(1, 1, 1, 1), 1_500_000_000);
            assert!(alone.len() > 2000, "{p:?}: {}", alone.len());
            let all = fleet_times(&p, &fleet_threads(10, 3, 2, 2), 1_500_000_000);
            assert_eq!(all.len(), alone.len(), "{p:?}");
            for (a, b) in all.iter().zip(&alone) {
                assert!(a.abs_diff(*b) <= 1, "{p:?}: {a} vs {b}");
            }
        }
    }

    /// A thread's part of -n: exactly its arrivals among the host's first n.
    #[test]
    fn each_thread_takes_its_arrivals_of_n() {
        for (conns, procs, threads) in [(1, 1, 1), (3, 1, 2), (10, 2, 3), (7, 3, 2)] {
            let fleet = fleet_threads(conns, 1, procs, threads);
            for n in [0, 1, 2, 5, 9, 10, 11, 100] {
                let mut sum = 0;
                for (_, l) in &fleet {
                    let by_index = (0..n)
                        .filter(|&i| {
                            (i % conns) >= l.first
                                && (i % conns - l.first) % l.step == 0
                                && (i % conns - l.first) / l.step < l.count
                        })
                        .count() as u64;
                    assert_eq!(l.taken(n), by_index, "{l:?} of {n}");
                    sum += l.taken(n);
                }
                assert_eq!(
                    sum, n,
                    "-c {conns}, {procs} procs, {threads} threads, -n {n}"
                );
            }
        }
    }

    /// Poisson: shards draw different streams, each reproducible.
    #[test]
    fn poisson_shards_are_not_copies() {
        let r = RateProfile::Constant(1000.0);
        let times = |k: u32| {
            let s = Shard { index: k, count: 2 };
            let kind = ArrivalKind::Poisson { seed: s.seed(42) };
            let mut a =
                ArrivalTimes::new(&r.scaled(s.fraction()), kind, Lanes::of(1, 0, 1, 1, 0, s));
            (0..50).map(|_| a.next_ns()).collect::<Vec<u64>>()
        };
        assert_eq!(times(1), times(1));
        assert_ne!(times(1), times(2));
        // At half the rate each: about 50 arrivals in 100 ms, not 100.
        let last = *times(2).last().unwrap();
        assert!((50_000_000..200_000_000).contains(&last), "{last}");
    }
}
