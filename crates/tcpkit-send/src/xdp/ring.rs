//! The memory an AF_XDP socket shares with the kernel: the UMEM (the frames' bytes) and the
//! single-producer/single-consumer rings of descriptors and addresses laid out as
//! `XDP_MMAP_OFFSETS` says. This file holds every load and store of the rings' indices and
//! the reason for its memory ordering; the sink above it sees counts and slots only.
//!
//! The protocol (the kernel's `net/xdp/xsk_queue.h`): each ring has a producer and a consumer
//! index, free-running `u32`s that wrap; an entry `i` lives at `i & (size - 1)`. The producer
//! writes entries, then publishes them by storing its index; the consumer reads entries up to
//! that index, then gives the slots back by storing its own index. The kernel pairs its side
//! with `smp_load_acquire`/`smp_store_release` (and full barriers); ours are the `Acquire`
//! loads and `Release` stores below, the same pairing libxdp makes with C11 atomics.

use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};

/// A region mapped into this process (a ring, or the anonymous UMEM), unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by one sink and touched only through it; the kernel's side of a
// ring is synchronised through the atomics below.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of the socket's object at `offset` (a ring's page offset, such as
    /// `XDP_PGOFF_TX_RING`), shared with the kernel.
    pub(crate) fn ring(fd: BorrowedFd<'_>, len: usize, offset: u64) -> io::Result<Mapping> {
        let ptr = tcpkit_kernel::afpacket::map_ring_at(fd, len, offset)?;
        Ok(Mapping { ptr, len })
    }

    /// `len` bytes of zeroed, page-aligned private memory, faulted in now: the UMEM. The kernel
    /// pins these pages at `XDP_UMEM_REG`, so they must exist and stay put.
    pub(crate) fn anonymous(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choice.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        Self::from_raw(p, len)
    }

    fn from_raw(p: *mut libc::c_void, len: usize) -> io::Result<Mapping> {
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        Ok(Mapping { ptr, len })
    }

    pub(crate) fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A pointer to the `T` at byte `off` of the mapping.
    ///
    /// # Safety
    /// `off` is aligned for `T` (the kernel aligns every ring offset for what lives there:
    /// index words to 4, descriptors and addresses to 8; a mapping starts on a page) and
    /// `off + size_of::<T>() <= len`.
    unsafe fn at<T>(&self, off: usize) -> *mut T {
        // SAFETY: in bounds by the caller's promise.
        unsafe { self.ptr.as_ptr().add(off).cast::<T>() }
    }

    /// The `u32` at byte `off` of the mapping, as an atomic.
    ///
    /// # Safety
    /// `off` is 4-aligned and `off + 4 <= len` (the kernel's offsets for index words are).
    unsafe fn atomic_at(&self, off: u64) -> &AtomicU32 {
        // SAFETY: in bounds and aligned by the caller's promise; the mapping outlives `&self`.
        unsafe { &*self.at::<AtomicU32>(off as usize) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `mmap` returned; no reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The words every ring has, found through `xdp_ring_offset`.
#[derive(Debug)]
struct Indices {
    map: Mapping,
    producer: u64,
    consumer: u64,
    /// `None` on kernels before 5.4, whose rings have no flags word.
    flags: Option<u64>,
    desc: u64,
    mask: u32,
}

impl Indices {
    fn new(map: Mapping, off: &libc::xdp_ring_offset, has_flags: bool, size: u32) -> Indices {
        Indices {
            map,
            producer: off.producer,
            consumer: off.consumer,
            flags: has_flags.then_some(off.flags),
            desc: off.desc,
            mask: size - 1,
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: the kernel's offset of the producer word, inside the mapping it sized.
        unsafe { self.map.atomic_at(self.producer) }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.map.atomic_at(self.consumer) }
    }
}

/// Bytes to map for a ring of `size` entries of `entry` bytes at these offsets.
pub(crate) fn ring_len(off: &libc::xdp_ring_offset, size: u32, entry: usize) -> usize {
    off.desc as usize + size as usize * entry
}

/// The TX ring: we produce `xdp_desc`s, the kernel consumes them.
#[derive(Debug)]
pub(crate) struct TxRing {
    ix: Indices,
    size: u32,
    /// Our producer index: entries below it are written; `publish` makes them the kernel's.
    cached_prod: u32,
    /// The kernel's consumer index as last read: slots below it are free to reuse.
    cached_cons: u32,
}

impl TxRing {
    pub(crate) fn new(
        map: Mapping,
        off: &libc::xdp_ring_offset,
        has_flags: bool,
        size: u32,
    ) -> Self {
        let ix = Indices::new(map, off, has_flags, size);
        // The kernel starts both at 0; read them anyway, so a ring handed over mid-way would
        // still be right. Nothing else runs on this socket yet: relaxed is enough.
        let prod = ix.producer().load(Ordering::Relaxed);
        let cons = ix.consumer().load(Ordering::Relaxed);
        TxRing {
            ix,
            size,
            cached_prod: prod,
            cached_cons: cons,
        }
    }

    /// Free slots. The kernel's consumer index is read only when the cached one says fewer
    /// than `want` are free (one shared cache line less touched per frame).
    pub(crate) fn free(&mut self, want: u32) -> u32 {
        let free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        // Acquire: pairs with the kernel's release store of the consumer index after it read
        // the descriptors (xskq_cons_release). Once we see the index move, the kernel is done
        // reading those slots and our next writes to them cannot reach its reads.
        self.cached_cons = self.ix.consumer().load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Writes one descriptor into the next slot (not yet visible to the kernel).
    /// The caller has seen `free(1) >= 1`.
    pub(crate) fn push(&mut self, addr: u64, len: u32, options: u32) {
        debug_assert!(self.cached_prod.wrapping_sub(self.cached_cons) < self.size);
        let i = (self.cached_prod & self.ix.mask) as usize;
        // SAFETY: slot i is inside the descriptor array the kernel sized for `size` entries,
        // and it is free (below the consumer index + size), so the kernel does not read it
        // until `publish`. A plain write: the release in `publish` orders it.
        unsafe {
            let d = self
                .ix
                .map
                .at::<libc::xdp_desc>(self.ix.desc as usize)
                .add(i);
            d.write(libc::xdp_desc { addr, len, options });
        }
        self.cached_prod = self.cached_prod.wrapping_add(1);
    }

    /// Makes every pushed descriptor the kernel's.
    pub(crate) fn publish(&self) {
        // Release: the descriptor writes above happen-before the kernel's acquire load of the
        // producer index (xskq_cons_peek), so it never reads a slot before it is written.
        self.ix
            .producer()
            .store(self.cached_prod, Ordering::Release);
    }

    /// Descriptors published and not yet taken by the kernel (reads its consumer index).
    pub(crate) fn pending(&mut self) -> u32 {
        // Acquire, as in `free`.
        self.cached_cons = self.ix.consumer().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Whether the kernel asked to be woken with `sendto` (XDP_USE_NEED_WAKEUP), read after
    /// `publish`. A ring without a flags word always needs it.
    pub(crate) fn needs_wakeup(&self) -> bool {
        let Some(off) = self.ix.flags else {
            return true;
        };
        // The producer store in `publish` and this load must not be reordered (store→load is
        // the one reordering x86 does): otherwise we could read "no wakeup needed" from
        // before the driver set the flag and went idle, while the driver, having checked the
        // ring before our store landed, found it empty: frames left waiting for a kick that
        // never comes. A full fence orders the two; it costs one per batch.
        fence(Ordering::SeqCst);
        // SAFETY: the kernel's offset of the flags word, inside the mapping.
        let flags = unsafe { self.ix.map.atomic_at(off) }.load(Ordering::Relaxed);
        flags & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// The completion ring: the kernel produces the UMEM addresses of frames it is done with; we
/// consume them.
#[derive(Debug)]
pub(crate) struct CompletionRing {
    ix: Indices,
    cached_cons: u32,
}

impl CompletionRing {
    pub(crate) fn new(map: Mapping, off: &libc::xdp_ring_offset, size: u32) -> Self {
        let ix = Indices::new(map, off, false, size);
        let cons = ix.consumer().load(Ordering::Relaxed);
        CompletionRing {
            ix,
            cached_cons: cons,
        }
    }

    /// Hands every completed address to `f`, then gives the slots back. Returns how many.
    pub(crate) fn take(&mut self, mut f: impl FnMut(u64)) -> u32 {
        // Acquire: pairs with the kernel's release store of the producer index
        // (xskq_prod_submit_n), so the addresses it wrote before are visible to the reads below.
        let prod = self.ix.producer().load(Ordering::Acquire);
        let n = prod.wrapping_sub(self.cached_cons);
        for k in 0..n {
            let i = (self.cached_cons.wrapping_add(k) & self.ix.mask) as usize;
            // SAFETY: slot i is inside the address array and published by the kernel (below
            // `prod`), which does not write it again until we store the consumer index.
            let addr = unsafe { self.ix.map.at::<u64>(self.ix.desc as usize).add(i).read() };
            f(addr);
        }
        if n > 0 {
            self.cached_cons = prod;
            // Release: our reads of those slots happen-before the kernel sees them free (its
            // acquire load of the consumer index when it reserves a slot), so it cannot
            // overwrite an address we have not read yet.
            self.ix.consumer().store(prod, Ordering::Release);
        }
        n
    }
}
