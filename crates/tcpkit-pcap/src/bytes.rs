//! Endian-aware reads from untrusted slices and writes into buffers we sized ourselves.
//!
//! Reads return `None` instead of panicking when the slice is short, so parsers turn a short
//! buffer into a `Reason` with the lengths in it; writes take fixed-size arrays whose bounds the
//! compiler checks.

/// `u16` at `at`, or `None` if the slice ends before.
#[inline]
pub(crate) fn u16_at(b: &[u8], at: usize, be: bool) -> Option<u16> {
    let raw: [u8; 2] = b.get(at..at.checked_add(2)?)?.try_into().ok()?;
    Some(if be {
        u16::from_be_bytes(raw)
    } else {
        u16::from_le_bytes(raw)
    })
}

/// `u32` at `at`, or `None` if the slice ends before.
#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize, be: bool) -> Option<u32> {
    let raw: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if be {
        u32::from_be_bytes(raw)
    } else {
        u32::from_le_bytes(raw)
    })
}

/// `u64` at `at`, or `None` if the slice ends before.
#[inline]
pub(crate) fn u64_at(b: &[u8], at: usize, be: bool) -> Option<u64> {
    let raw: [u8; 8] = b.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(if be {
        u64::from_be_bytes(raw)
    } else {
        u64::from_le_bytes(raw)
    })
}

/// The bytes of `v` in the chosen order.
#[inline]
pub(crate) fn u16_bytes(v: u16, be: bool) -> [u8; 2] {
    if be {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    }
}

/// The bytes of `v` in the chosen order.
#[inline]
pub(crate) fn u32_bytes(v: u32, be: bool) -> [u8; 4] {
    if be {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    }
}

/// The bytes of `v` in the chosen order.
#[inline]
pub(crate) fn u64_bytes(v: u64, be: bool) -> [u8; 8] {
    if be {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_both_orders_and_refuses_short_slices() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(u16_at(&b, 0, true), Some(0x0102));
        assert_eq!(u16_at(&b, 0, false), Some(0x0201));
        assert_eq!(u32_at(&b, 4, true), Some(0x0506_0708));
        assert_eq!(u64_at(&b, 0, false), Some(0x0807_0605_0403_0201));
        assert_eq!(u32_at(&b, 5, true), None);
        assert_eq!(u64_at(&b, 1, true), None);
        assert_eq!(u16_at(&b, usize::MAX, true), None);
        assert_eq!(u32_bytes(0x0102_0304, true), [1, 2, 3, 4]);
        assert_eq!(u16_bytes(0x0102, false), [2, 1]);
        assert_eq!(u64_bytes(1, true), [0, 0, 0, 0, 0, 0, 0, 1]);
    }
}
