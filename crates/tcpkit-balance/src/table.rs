//! The lookup tables of `weighted-random`, `weighted-round-robin` and `maglev` services: up to
//! RING_SIZE slots, each the index of a backend. `weighted-random` picks a random slot, so its
//! table only needs each backend in proportion to its weight; `weighted-round-robin` takes the
//! slots in turn, so its table is an interleaved order (`wrr`); `maglev` picks the slot by a
//! hash of the client (or socket), and its table is
//! Maglev's (Eisenbud et al., NSDI 2016), weighted: each backend fills slots in the order of
//! its own permutation, so when one of N backends goes, about 1/N of the slots move and the
//! rest keep their backend.

use std::net::SocketAddr;

/// Slots per table (bpf/balance.h): a prime well above 60 x MAX_BACKENDS.
pub use crate::bpf::RING_SIZE;

/// Each backend's share of the table in proportion to its weight (largest remainder, so the
/// shares add up to RING_SIZE and each is within one slot of exact).
pub fn weighted(weights: &[u32]) -> Vec<u32> {
    let shares = shares(weights, RING_SIZE as u64);
    let mut t = Vec::with_capacity(RING_SIZE);
    for (i, n) in shares.iter().enumerate() {
        t.extend(std::iter::repeat_n(i as u32, *n as usize));
    }
    t
}

/// `m` slots shared in proportion to `weights` (largest remainder); none when they are all 0.
fn shares(weights: &[u32], m: u64) -> Vec<u64> {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut shares: Vec<u64> = weights.iter().map(|w| u64::from(*w) * m / total).collect();
    let mut rest: Vec<(u64, usize)> = weights
        .iter()
        .enumerate()
        .map(|(i, w)| (u64::from(*w) * m % total, i))
        .collect();
    rest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let left = m - shares.iter().sum::<u64>();
    for (_, i) in rest.iter().take(left as usize) {
        shares[*i] += 1;
    }
    shares
}

/// Weighted round robin's order: each backend `weight` times per cycle, interleaved as
/// nginx's smooth weighted round robin does (weights 5, 1, 1 give a a b a c a a, never five
/// a in a row). The cycle is the weights over their greatest common divisor; one longer than
/// RING_SIZE is scaled down to at most RING_SIZE (largest remainder, each backend at least one).
pub fn wrr(weights: &[u32]) -> Vec<u32> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let g = weights.iter().fold(0u64, |g, w| gcd(g, u64::from(*w)));
    if g == 0 {
        return Vec::new();
    }
    let mut w: Vec<u64> = weights.iter().map(|x| u64::from(*x) / g).collect();
    if w.iter().sum::<u64>() > RING_SIZE as u64 {
        // One slot each first, so a small weight beside large ones is not scaled to nothing.
        let n = w.iter().filter(|x| **x > 0).count() as u64;
        w = shares(weights, RING_SIZE as u64 - n)
            .iter()
            .zip(weights)
            .map(|(s, x)| if *x > 0 { s + 1 } else { 0 })
            .collect();
    }
    let total: i64 = w.iter().sum::<u64>() as i64;
    let mut current = vec![0i64; w.len()];
    let mut order = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, x) in current.iter_mut().zip(&w) {
            *c += *x as i64;
        }
        // The first of the largest: ties go to the earlier backend.
        let (best, _) = current
            .iter()
            .enumerate()
            .rev()
            .max_by_key(|(_, c)| **c)
            .unwrap_or((0, &0));
        current[best] -= total;
        order.push(best as u32);
    }
    order
}

/// FNV-1a, 64 bits, over `bytes` after `seed`: stable across runs and builds (a table must
/// not change because the program was rebuilt).
fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.to_le_bytes().iter().chain(bytes) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Maglev's table over `backends` (address, weight): a backend's permutation depends on its
/// address alone, so the table changes little when the set does. Weights: in each round a
/// backend takes a slot once its credit (its weight per round) reaches the largest weight.
pub fn maglev(backends: &[(SocketAddr, u32)]) -> Vec<u32> {
    let n = backends.len();
    if n == 0 {
        return Vec::new();
    }
    let m = RING_SIZE as u64;
    let perm: Vec<(u64, u64)> = backends
        .iter()
        .map(|(a, _)| {
            let key = a.to_string();
            let offset = fnv(0x6d61_676c_6576, key.as_bytes()) % m;
            let skip = fnv(0x736b_6970, key.as_bytes()) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let wmax = backends
        .iter()
        .map(|(_, w)| u64::from(*w))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut next = vec![0u64; n];
    let mut credit = vec![0u64; n];
    let mut table = vec![u32::MAX; RING_SIZE];
    let mut filled = 0;
    while filled < RING_SIZE {
        for i in 0..n {
            credit[i] += u64::from(backends[i].1);
            if credit[i] < wmax {
                continue;
            }
            credit[i] -= wmax;
            let (offset, skip) = perm[i];
            let mut c = (offset + next[i] * skip) % m;
            while table[c as usize] != u32::MAX {
                next[i] += 1;
                c = (offset + next[i] * skip) % m;
            }
            table[c as usize] = i as u32;
            next[i] += 1;
            filled += 1;
            if filled == RING_SIZE {
                break;
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: usize) -> Vec<(SocketAddr, u32)> {
        (0..n)
            .map(|i| (SocketAddr::from(([198, 18, 0, 2 + i as u8], 6379)), 1))
            .collect()
    }

    fn shares(t: &[u32], n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for i in t {
            c[*i as usize] += 1;
        }
        c
    }

    #[test]
    fn weighted_shares_follow_the_weights() {
        let t = weighted(&[1, 2, 5]);
        assert_eq!(t.len(), RING_SIZE);
        let s = shares(&t, 3);
        for (got, w) in s.iter().zip([1.0, 2.0, 5.0]) {
            let want = RING_SIZE as f64 * w / 8.0;
            assert!((*got as f64 - want).abs() <= 1.0, "{s:?}");
        }
    }

    #[test]
    fn wrr_interleaves_in_proportion() {
        assert_eq!(wrr(&[5, 1, 1]), [0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(wrr(&[2, 2]), [0, 1]);
        assert_eq!(wrr(&[3, 1]), [0, 0, 1, 0]);
        assert!(wrr(&[]).is_empty());
        // A cycle beyond the table is scaled to it, each backend kept.
        let big: Vec<u32> = (0..64).map(|i| if i == 0 { 1 } else { 997 }).collect();
        let t = wrr(&big);
        assert!(t.len() <= RING_SIZE, "{}", t.len());
        assert!(t.contains(&0));
    }

    #[test]
    fn maglev_is_stable_and_even() {
        let b = addrs(5);
        let t = maglev(&b);
        assert_eq!(t, maglev(&b), "the same set gives the same table");
        assert!(t.iter().all(|i| (*i as usize) < 5));
        for s in shares(&t, 5) {
            // Maglev's own bound: shares within a few percent of even.
            assert!(
                (s as f64 - RING_SIZE as f64 / 5.0).abs() < RING_SIZE as f64 * 0.02,
                "{s}"
            );
        }
    }

    #[test]
    fn maglev_moves_about_one_nth_when_one_of_n_goes() {
        for n in [2usize, 3, 5, 8, 16] {
            for gone in [0, n / 2, n - 1] {
                let all = addrs(n);
                let before = maglev(&all);
                let mut rest = all.clone();
                rest.remove(gone);
                let after = maglev(&rest);
                // Map indexes in `rest` back to the full set's.
                let back = |i: u32| if (i as usize) < gone { i } else { i + 1 };
                let moved = before
                    .iter()
                    .zip(&after)
                    .filter(|(b, a)| **b != back(**a))
                    .count();
                let share_gone = before.iter().filter(|b| **b as usize == gone).count();
                // The gone backend's slots must move; others may move only a little more.
                let bound = RING_SIZE as f64 * (1.0 / n as f64 + 0.05);
                assert!(moved >= share_gone, "n={n}");
                assert!(
                    (moved as f64) <= bound,
                    "n={n} gone={gone}: {moved} of {RING_SIZE} moved, bound {bound:.0}"
                );
            }
        }
    }

    #[test]
    fn maglev_weights_are_kept() {
        let mut b = addrs(3);
        b[0].1 = 1;
        b[1].1 = 2;
        b[2].1 = 3;
        let s = shares(&maglev(&b), 3);
        for (got, w) in s.iter().zip([1.0, 2.0, 3.0]) {
            let want = RING_SIZE as f64 * w / 6.0;
            assert!(
                (*got as f64 - want).abs() < RING_SIZE as f64 * 0.02,
                "{s:?}"
            );
        }
    }
}
