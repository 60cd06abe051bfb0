//! The sender's read buffers, cut from slabs of whole 2 MiB pages that ask for transparent huge
//! pages. Each buffer is written by the reader once per use and read by the loop; in 1 MiB
//! buffers from malloc (one mapping each, never 2 MiB-aligned) every first use was 256 page
//! faults, each a trap and a zeroed page: ~5,800 faults per 400 MB one-stream transfer, the
//! pool being the window's worth of buffers.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// A huge page: slabs are whole multiples of it, so the kernel places them on its boundary.
const HUGE: usize = 2 << 20;

#[derive(Debug)]
struct Slab {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain bytes; each range of a slab belongs to one Buf (see Buf).
unsafe impl Send for Slab {}
// SAFETY: as for Send: a slab itself is never read or written, only its Bufs' ranges.
unsafe impl Sync for Slab {}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `carve`, unmapped once, after its last Buf is gone.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// `len` bytes (at most its capacity) of a slab that no other Buf shares: a Vec<u8> that
/// never reallocates. Its bytes are always initialized (zero pages, then what was read).
#[derive(Debug)]
pub(crate) struct Buf {
    slab: Arc<Slab>,
    at: usize,
    cap: usize,
    len: usize,
}

impl Buf {
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length, up to the capacity.
    pub(crate) fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "a buffer of {} bytes set to {len}",
            self.cap
        );
        self.len = len;
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `at..at + len` lies in the slab (carve), belongs to this Buf alone, and is
        // initialized.
        unsafe { std::slice::from_raw_parts(self.slab.ptr.as_ptr().add(self.at), self.len) }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for deref; `&mut self` is the only way to this range.
        unsafe { std::slice::from_raw_parts_mut(self.slab.ptr.as_ptr().add(self.at), self.len) }
    }
}

/// `count` buffers of `size` bytes (both at least 1) from one new slab, each of full length.
pub(crate) fn carve(size: usize, count: usize) -> std::io::Result<Vec<Buf>> {
    let want = size
        .checked_mul(count)
        .filter(|&n| n > 0)
        .ok_or_else(|| std::io::Error::other("read buffers: no size or too large"))?;
    let len = want.next_multiple_of(HUGE);
    // SAFETY: a new private anonymous mapping; nothing else refers to its range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: advice over the mapping just made; it changes how its pages are backed, not
    // their contents. Its failure (THP off) only leaves 4 KiB pages.
    unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap gave 0"))?;
    let slab = Arc::new(Slab { ptr, len });
    Ok((0..count)
        .map(|i| Buf {
            slab: Arc::clone(&slab),
            at: i * size,
            cap: size,
            len: size,
        })
        .collect())
}

/// How many buffers of `size` bytes one slab holds: a huge page's worth, at least one.
pub(crate) fn per_slab(size: usize) -> usize {
    (HUGE / size.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_of_one_slab_are_apart_and_outlive_each_other() {
        let mut bufs = carve(1 << 20, 2).unwrap();
        assert_eq!(bufs.len(), 2);
        bufs[0].fill(1);
        bufs[1].fill(2);
        let b = bufs.pop().unwrap();
        let mut a = bufs.pop().unwrap();
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        a.set_len(10);
        assert_eq!((a.len(), a.capacity()), (10, 1 << 20));
        drop(a);
        // The slab stays mapped while any of its buffers lives.
        assert!(b.iter().all(|&x| x == 2));
    }

    #[test]
    fn slabs_hold_a_huge_pages_worth() {
        assert_eq!(per_slab(1 << 20), 2);
        assert_eq!(per_slab(64 << 10), 32);
        assert_eq!(per_slab(3 << 20), 1);
        let odd = carve(3000, per_slab(3000)).unwrap();
        assert_eq!(odd.len(), 699);
        assert!(odd
            .iter()
            .all(|b| b.len() == 3000 && b.iter().all(|&x| x == 0)));
    }

    #[test]
    #[should_panic(expected = "set to")]
    fn a_length_past_the_capacity_is_refused() {
        carve(4096, 1).unwrap().pop().unwrap().set_len(4097);
    }
}
