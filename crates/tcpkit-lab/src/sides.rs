//! A fixed pattern of client and server turns for two-interface replays (`replay --intf2`'s
//! lab test and its bench row): which side each of n frames belongs to, in runs of 1 to 4
//! frames a side, the run lengths from a xorshift with a fixed seed, so a failure reproduces
//! and the test and the bench send the same pattern.

/// Side of each of `n` frames: `true` the client's (first), `false` the server's.
pub fn client_server_runs(n: u32) -> Vec<bool> {
    let (mut side, mut left, mut x) = (false, 0u32, 0x9e37_79b9u32);
    (0..n)
        .map(|_| {
            if left == 0 {
                side = !side;
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                left = 1 + x % 4;
            }
            left -= 1;
            side
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_alternate_and_are_one_to_four_long() {
        let s = super::client_server_runs(1000);
        assert!(s[0]);
        let mut run = 1;
        for w in s.windows(2) {
            if w[0] == w[1] {
                run += 1;
                assert!(run <= 4);
            } else {
                run = 1;
            }
        }
        assert!(s.iter().filter(|&&c| c).count() > 300);
        assert!(s.iter().filter(|&&c| !c).count() > 300);
    }
}
