//! PACKET_TX_RING (TPACKET_V2): a ring of frame slots shared with the kernel. Frames are copied
//! into slots, marked "send request", and one `send()` hands the whole batch to the device;
//! the per-message work of `sendmmsg` (copying `msghdr`s in, one `sendmsg` per frame) is gone.
//!
//! Accounting is exact and in order. The kernel takes slots strictly in ring order starting
//! where it stopped last time, so after each `send()` the slots it took are exactly those, from
//! the oldest unconfirmed one on, whose status is no longer "send request". A frame the device
//! queue refused (ENOBUFS) is put back to "send request" by the kernel and retried; one that
//! stays refused for [`STUCK_AFTER`](crate::afpacket) is skipped on purpose (its length set to 0,
//! which the kernel discards under PACKET_LOSS) and counted as failed.
//!
//! Frames that the kernel would refuse for their size (shorter than an Ethernet header, longer
//! than MTU + header) never enter the ring: they go through a plain socket on the same
//! interface after the ring is drained, so the kernel's own verdict (EMSGSIZE, EINVAL, or
//! success for an 802.1Q-tagged frame up to MTU + 18) is what is counted, in order.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tcpkit_kernel::afpacket::{map_ring, setsockopt};

use crate::SendCounters;

/// Where a frame's bytes start in its slot with TPACKET_V2 and no PACKET_TX_HAS_OFF:
/// `tp_hdrlen - sizeof(sockaddr_ll)` = TPACKET_ALIGN(sizeof(tpacket2_hdr)).
const DATA_OFF: usize = TPACKET_HDR_ALIGNED;
const TPACKET_HDR_ALIGNED: usize =
    (std::mem::size_of::<libc::tpacket2_hdr>() + libc::TPACKET_ALIGNMENT - 1)
        & !(libc::TPACKET_ALIGNMENT - 1);
/// A `struct virtio_net_hdr` before each frame (PACKET_VNET_HDR). It carries no offload, only
/// `hdr_len` = the whole frame: the kernel then copies the frame into the skb's linear area
/// instead of attaching the ring's page as a fragment. A fragment of a user-mapped page has to
/// be copied into a fresh page anyway when the frame crosses a veth into another namespace
/// (skb_copy_ubufs), which made the ring slower than sendmmsg there.
const VNET_LEN: usize = 10;
/// Ethernet header length: the shortest frame the kernel takes (dev->min_header_len).
const ETH_HLEN: usize = 14;
/// Offsets of `tp_status` and `tp_len` in `struct tpacket2_hdr`.
const STATUS_OFF: usize = std::mem::offset_of!(libc::tpacket2_hdr, tp_status);
const LEN_OFF: usize = std::mem::offset_of!(libc::tpacket2_hdr, tp_len);
/// The ring never takes more than this much memory, whatever the MTU.
const MAX_RING_BYTES: usize = 32 << 20;
/// A slot still in flight (status "sending") after this long means the device stopped
/// completing transmissions: the sink gives up instead of hanging.
const SLOT_TIMEOUT: Duration = Duration::from_secs(10);

/// What [`TxRing::push`] and [`TxRing::kick`] can fail with: a fatal socket error, with the
/// number of frames it leaves unaccounted (they are counted as failed by the caller).
pub(crate) type Fatal = (usize, io::Error);

#[derive(Debug)]
pub(crate) struct TxRing {
    map: NonNull<u8>,
    map_len: usize,
    block_size: usize,
    frame_size: usize,
    frames_per_block: usize,
    frame_nr: usize,
    /// Longest frame a slot takes: MTU + Ethernet header (the kernel's limit for untagged
    /// frames); longer ones take the plain path.
    pub(crate) max_len: usize,
    /// Next slot to fill.
    tail: usize,
    /// Oldest slot marked "send request" that the kernel has not been seen to take.
    unconfirmed: usize,
    /// Slots marked "send request" and not yet seen taken.
    queued: usize,
    /// Frames per `send()`.
    batch: usize,
    /// Frames filled since the last `send()`.
    since_kick: usize,
}

// SAFETY: the mapping is owned by this struct (unmapped on drop) and only touched through it;
// the kernel's concurrent writes to slot status words go through atomics.
unsafe impl Send for TxRing {}

impl TxRing {
    /// Sets up a TPACKET_V2 TX ring on `fd` (an unbound or bound AF_PACKET socket) for frames
    /// up to `mtu + 14` bytes, sending `batch` frames per `send()`. Returns the failing call.
    pub(crate) fn new(
        fd: &OwnedFd,
        mtu: u32,
        batch: usize,
    ) -> Result<TxRing, (&'static str, io::Error)> {
        let one: libc::c_int = 1;
        // Before the ring: the kernel refuses it once a ring exists.
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, &one)
            .map_err(|e| ("setsockopt(PACKET_VNET_HDR)", e))?;
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, &version)
            .map_err(|e| ("setsockopt(PACKET_VERSION, TPACKET_V2)", e))?;
        // Slots the kernel finds malformed are skipped instead of stopping the ring; only the
        // deliberate skip of a stuck frame relies on it (see the module comment).
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_LOSS, &one)
            .map_err(|e| ("setsockopt(PACKET_LOSS)", e))?;

        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let max_len = mtu as usize + ETH_HLEN;
        let align = libc::TPACKET_ALIGNMENT;
        let frame_size = (DATA_OFF + VNET_LEN + max_len + align - 1) & !(align - 1);
        let block_size = if frame_size <= 1 << 16 {
            1 << 16
        } else {
            frame_size.div_ceil(page) * page
        };
        let frames_per_block = block_size / frame_size;
        // Room for several batches in flight, within the memory cap.
        let want = (batch * 8).max(512);
        let max_blocks = (MAX_RING_BYTES / block_size).max(2);
        let block_nr = want.div_ceil(frames_per_block).clamp(2, max_blocks);
        let frame_nr = frames_per_block * block_nr;
        let req = libc::tpacket_req {
            tp_block_size: block_size as libc::c_uint,
            tp_block_nr: block_nr as libc::c_uint,
            tp_frame_size: frame_size as libc::c_uint,
            tp_frame_nr: frame_nr as libc::c_uint,
        };
        setsockopt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_TX_RING, &req)
            .map_err(|e| ("setsockopt(PACKET_TX_RING)", e))?;
        let map_len = block_size * block_nr;
        let map = map_ring(fd.as_fd(), map_len).map_err(|e| ("mmap(PACKET_TX_RING)", e))?;
        Ok(TxRing {
            map,
            map_len,
            block_size,
            frame_size,
            frames_per_block,
            frame_nr,
            max_len: max_len.min(frame_size - DATA_OFF - VNET_LEN),
            tail: 0,
            unconfirmed: 0,
            queued: 0,
            batch: batch.clamp(1, frame_nr),
            since_kick: 0,
        })
    }

    /// Whether a frame of `len` bytes goes through the ring (else: the plain socket).
    pub(crate) fn fits(&self, len: usize) -> bool {
        (ETH_HLEN..=self.max_len).contains(&len)
    }

    /// Frames handed to the ring and not yet seen taken by the kernel.
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    fn slot(&self, i: usize) -> *mut u8 {
        let off = (i / self.frames_per_block) * self.block_size
            + (i % self.frames_per_block) * self.frame_size;
        debug_assert!(off + self.frame_size <= self.map_len);
        // SAFETY: `off` is inside the mapping (i < frame_nr).
        unsafe { self.map.as_ptr().add(off) }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "slots start TPACKET_ALIGNMENT-aligned in a page-aligned ring; the field is a u32 of tpacket2_hdr"
    )]
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the status word is a 4-byte-aligned u32 at the start of a 16-byte-aligned
        // slot; the kernel writes it concurrently, so it is only accessed atomically.
        unsafe { &*self.slot(i).add(STATUS_OFF).cast::<AtomicU32>() }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "slots start TPACKET_ALIGNMENT-aligned in a page-aligned ring; the field is a u32 of tpacket2_hdr"
    )]
    fn len_of(&self, i: usize) -> usize {
        // SAFETY: tp_len of slot i; only we write it, and only while the slot is ours.
        unsafe { self.slot(i).add(LEN_OFF).cast::<u32>().read_volatile() as usize }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "slots start TPACKET_ALIGNMENT-aligned in a page-aligned ring; the field is a u32 of tpacket2_hdr"
    )]
    fn set_len(&self, i: usize, len: usize) {
        // SAFETY: as in len_of; the slot is ours (available, or "send request" between sends).
        unsafe {
            self.slot(i)
                .add(LEN_OFF)
                .cast::<u32>()
                .write_volatile(len as u32);
        }
    }

    /// Counts the slots the kernel took since the last look, oldest first.
    fn confirm(&mut self, c: &mut SendCounters) {
        while self.queued > 0 {
            let s = self.status(self.unconfirmed).load(Ordering::Acquire);
            if s & libc::TP_STATUS_SEND_REQUEST != 0 {
                break;
            }
            let len = self.len_of(self.unconfirmed).saturating_sub(VNET_LEN);
            if len == 0 {
                // Skipped on purpose after being stuck; already counted as failed.
            } else {
                c.successful += 1;
                c.bytes += len as u64;
            }
            self.unconfirmed = (self.unconfirmed + 1) % self.frame_nr;
            self.queued -= 1;
        }
    }

    /// Copies `data` (which [`fits`](Self::fits)) into the next slot, waiting for it to be
    /// free, and sends when a batch is full. A fatal error's count includes this frame.
    pub(crate) fn push(
        &mut self,
        fd: &OwnedFd,
        data: &[u8],
        c: &mut SendCounters,
    ) -> Result<(), Fatal> {
        debug_assert!(self.fits(data.len()));
        let i = self.tail;
        if self.status(i).load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE {
            // This frame is not queued yet: it is left over too.
            self.wait_free(fd, c).map_err(|(n, e)| (n + 1, e))?;
        }
        // virtio_net_hdr: flags 0, gso_type NONE, hdr_len = the frame (little endian, as
        // modern virtio), gso_size/csum_start/csum_offset 0.
        let mut vnet = [0u8; VNET_LEN];
        vnet[2..4].copy_from_slice(&(data.len() as u16).to_le_bytes());
        // SAFETY: the slot is available, so the kernel does not read it; header and data fit
        // its room (max_len leaves space for both).
        unsafe {
            let p = self.slot(i).add(DATA_OFF);
            std::ptr::copy_nonoverlapping(vnet.as_ptr(), p, VNET_LEN);
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(VNET_LEN), data.len());
        };
        self.set_len(i, VNET_LEN + data.len());
        // Release: the bytes and length are visible before the kernel can see the request.
        self.status(i)
            .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.tail = (i + 1) % self.frame_nr;
        self.queued += 1;
        self.since_kick += 1;
        if self.since_kick >= self.batch {
            self.kick(fd, c)?;
        }
        Ok(())
    }

    /// The slot at `tail` is not free: either it still waits to be sent (the ring is full of
    /// requests: send them) or it is in flight (wait for the device to complete it).
    fn wait_free(&mut self, fd: &OwnedFd, c: &mut SendCounters) -> Result<(), Fatal> {
        let start = Instant::now();
        loop {
            let s = self.status(self.tail).load(Ordering::Acquire);
            if s == libc::TP_STATUS_AVAILABLE || s & libc::TP_STATUS_WRONG_FORMAT != 0 {
                // WRONG_FORMAT cannot happen under PACKET_LOSS; if it did, the slot is dead
                // to the kernel and reusable.
                return Ok(());
            }
            if s & libc::TP_STATUS_SEND_REQUEST != 0 {
                self.kick(fd, c)?;
                continue;
            }
            // In flight: POLLOUT means the kernel's next slot (= tail) is available again.
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one pollfd we own. A poll error just means we look again sooner.
            unsafe { libc::poll(&mut pfd, 1, 100) };
            if start.elapsed() > SLOT_TIMEOUT {
                return Err((
                    self.queued,
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "TX ring slot still in flight after 10 s",
                    ),
                ));
            }
        }
    }

    /// Sends every queued slot: returns when the kernel has taken them all (each counted as
    /// sent, or failed after being stuck), or with a fatal error and the count left over.
    pub(crate) fn kick(&mut self, fd: &OwnedFd, c: &mut SendCounters) -> Result<(), Fatal> {
        self.since_kick = 0;
        let mut stuck_since: Option<Instant> = None;
        let mut blocking = false;
        while self.queued > 0 {
            let before = self.queued;
            let flags = if blocking { 0 } else { libc::MSG_DONTWAIT };
            // SAFETY: send with no buffer: the kernel reads the ring it owns.
            let rc = unsafe { libc::send(fd.as_raw_fd(), std::ptr::null(), 0, flags) };
            let err = (rc < 0).then(io::Error::last_os_error);
            self.confirm(c);
            if self.queued < before {
                stuck_since = None;
                blocking = false;
            }
            let Some(err) = err else { continue };
            match err.raw_os_error() {
                Some(libc::EINTR) => {}
                // The socket's send buffer is full of frames in flight: wait for room.
                Some(libc::EAGAIN) => {
                    c.retried_eagain += 1;
                    blocking = true;
                }
                // The device queue refused the oldest frame; the kernel put it back.
                Some(libc::ENOBUFS) => {
                    let since = *stuck_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > crate::afpacket::STUCK_AFTER {
                        // Skip it: length 0 (shorter than the virtio header) is malformed, and
                        // PACKET_LOSS discards it.
                        self.set_len(self.unconfirmed, 0);
                        c.failed += 1;
                        c.failed_stuck += 1;
                        stuck_since = None;
                        continue;
                    }
                    c.retried_enobufs += 1;
                    std::thread::sleep(crate::afpacket::ENOBUFS_PAUSE);
                }
                _ => return Err((self.queued, err)),
            }
        }
        Ok(())
    }

    /// After a fatal error: forget the queued slots (the caller counted them as failed) so
    /// that a later batch does not count them again.
    pub(crate) fn abandon(&mut self) {
        while self.queued > 0 {
            self.set_len(self.unconfirmed, 0);
            self.unconfirmed = (self.unconfirmed + 1) % self.frame_nr;
            self.queued -= 1;
        }
    }
}

impl Drop for TxRing {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in new(), which nothing references any more.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}
