//! Internet checksum arithmetic (RFC 1071) and incremental update (RFC 1624).
//!
//! Everything here works on slices the caller has already bounds-checked; the functions never
//! index past the slices they are given.

/// Adds `data` as big-endian 16-bit words to a 32-bit accumulator (odd length padded with 0).
pub(crate) fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for w in &mut chunks {
        acc = acc.wrapping_add(u32::from(u16::from_be_bytes([w[0], w[1]])));
        // Fold early so a jumbo payload cannot overflow the accumulator.
        if acc > 0xffff_0000 {
            acc = (acc & 0xffff) + (acc >> 16);
        }
    }
    if let [last] = chunks.remainder() {
        acc = acc.wrapping_add(u32::from(*last) << 8);
    }
    acc
}

/// Folds the accumulator and returns the one's complement, ready to store.
pub(crate) fn finish(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')` for a field that changed from `old` to `new`
/// (both the same even length). Unlike eqn. 2 this never yields 0xffff from a non-zero sum,
/// so it gives exactly what a full recompute gives on a packet whose checksum was right.
pub(crate) fn update(hc: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut acc = u32::from(!hc);
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        acc += u32::from(!u16::from_be_bytes([o[0], o[1]]));
        acc += u32::from(u16::from_be_bytes([n[0], n[1]]));
    }
    finish(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // The worked example of RFC 1071 section 3: sum 0xddf2, checksum !0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(finish(sum(0, &data)), !0xddf2);
    }

    #[test]
    fn incremental_equals_full() {
        let mut data = [
            0x45u8, 0, 0, 20, 1, 2, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = finish(sum(0, &data));
        data[10..12].copy_from_slice(&c.to_be_bytes());
        let old = [10u8, 0, 0, 1];
        let new = [192u8, 168, 77, 3];
        data[12..16].copy_from_slice(&new);
        let inc = update(c, &old, &new);
        data[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(inc, finish(sum(0, &data)));
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(sum(0, &[0x12]), 0x1200);
    }
}
