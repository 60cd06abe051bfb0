//! [`Capture`]: an AF_PACKET socket with a TPACKET_V3 RX ring, opened so that nothing reaches
//! the ring before the filter is in place, and read one retired block at a time; or, in
//! immediate mode, a TPACKET_V2 ring read frame by frame as each packet lands.
//!
//! Order of setup, and why:
//! 1. `socket(AF_PACKET, SOCK_RAW, 0)`: protocol 0 receives nothing until `bind` names one.
//! 2. `PACKET_VERSION` = V3 (must precede the ring), `SO_ATTACH_FILTER`, promiscuous
//!    membership, `PACKET_RX_RING` and `mmap`.
//! 3. `bind` with `ETH_P_ALL`: from here on packets flow, all of them through the filter.
//! 4. `PACKET_FANOUT`, which the kernel only accepts on a bound socket.
//!
//! `PACKET_IGNORE_OUTGOING` is left at its default (off), so frames the host sends are
//! captured too (`Direction::Outgoing`): `copy` needs both directions of a conversation.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tcpkit_kernel::afpacket::{self, setsockopt};

use crate::filter::{compile_filter, ethernet_only, LINKTYPE_ETHERNET, LINKTYPE_RAW};
use crate::{CaptureError, CaptureOpts, CaptureStats, CapturedPacket, Direction, FanoutMode};

/// `ARPHRD_NONE` (tun devices) and `ARPHRD_RAWIP`: frames start with the IP header.
const ARPHRD_NONE: u16 = 0xfffe;
const ARPHRD_RAWIP: u16 = 519;
/// Where the `sockaddr_ll` sits after each packet's `tpacket3_hdr`.
const SLL_OFF: usize = (std::mem::size_of::<libc::tpacket3_hdr>() + libc::TPACKET_ALIGNMENT - 1)
    & !(libc::TPACKET_ALIGNMENT - 1);
/// The kernel packs V3 packets in a block at this alignment (V3_ALIGNMENT in af_packet.c).
const V3_ALIGNMENT: usize = 8;
/// Offset of `block_status` in `struct tpacket_block_desc` (after `version`, `offset_to_priv`).
const BLOCK_STATUS_OFF: usize = 8;
/// Nominal frame size for `tpacket_req3`. V3 packs packets back to back in a block and does
/// not use frames, but the kernel still checks that the block divides into them.
const FRAME_SIZE: u32 = 2048;
/// Where the `sockaddr_ll` sits after each frame's `tpacket2_hdr` (immediate mode).
const SLL2_OFF: usize = (std::mem::size_of::<libc::tpacket2_hdr>() + libc::TPACKET_ALIGNMENT - 1)
    & !(libc::TPACKET_ALIGNMENT - 1);

/// Immediate mode's ring: fixed frames, `per_block` to a block (a frame never spans two).
#[derive(Clone, Copy, Debug)]
struct Frames {
    size: usize,
    per_block: usize,
    count: usize,
}

impl Frames {
    /// Frames that hold `snaplen` bytes of a packet: the kernel puts the link header at
    /// TPACKET_ALIGN(TPACKET2_HDRLEN + 16) less its length (tpacket_rcv's netoff and macoff)
    /// and cuts the packet to what is left of the frame.
    fn for_snaplen(snaplen: u32, block_size: u32, block_count: u32) -> Option<Frames> {
        let align = |n: usize| (n + libc::TPACKET_ALIGNMENT - 1) & !(libc::TPACKET_ALIGNMENT - 1);
        let size = align(align(libc::TPACKET2_HDRLEN + 16) + snaplen as usize);
        let per_block = block_size as usize / size;
        (per_block > 0).then_some(Frames {
            size,
            per_block,
            count: per_block * block_count as usize,
        })
    }
}

/// Hands a block or frame back to the kernel however the walk of it ends (a panic in the
/// caller's closure included); Release orders our reads of it before the hand-over.
struct Give<'a>(&'a AtomicU32);

impl Drop for Give<'_> {
    fn drop(&mut self) {
        self.0.store(libc::TP_STATUS_KERNEL, Ordering::Release);
    }
}

/// A live capture on one interface (or all), through a TPACKET_V3 ring shared with the kernel.
///
/// Packets are read in place with [`Capture::next_block`]; nothing is allocated or copied per
/// packet. Dropping the capture unmaps the ring and closes the socket (which also ends
/// promiscuous mode and the fanout membership).
#[derive(Debug)]
pub struct Capture {
    fd: OwnedFd,
    ifname: String,
    /// The bound interface's index; 0 for "any".
    ifindex: u32,
    linktype: u32,
    map: NonNull<u8>,
    map_len: usize,
    block_size: usize,
    block_count: usize,
    /// The block the kernel will retire next, in ring order (in immediate mode, the frame it
    /// will fill next).
    next: usize,
    /// Immediate mode's frames; None for a V3 ring of blocks.
    frames: Option<Frames>,
    stats: CaptureStats,
}

// SAFETY: the mapping is owned by this struct (unmapped on drop) and only touched through
// `&mut self`; the kernel's concurrent writes are ordered by the block status word, which is
// accessed atomically.
unsafe impl Send for Capture {}

/// The index of `ifname` in the calling thread's namespace, or NoSuchInterface.
fn ifindex(ifname: &str) -> Result<u32, CaptureError> {
    let missing = || CaptureError::NoSuchInterface {
        ifname: ifname.to_owned(),
    };
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ {
        return Err(missing());
    }
    let c = std::ffi::CString::new(ifname).map_err(|_| missing())?;
    // SAFETY: a NUL-terminated name; if_nametoindex reads it and returns 0 when not found.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENODEV | libc::ENXIO) | None => Err(missing()),
            _ => Err(CaptureError::sys(ifname, "if_nametoindex", err)),
        };
    }
    Ok(idx)
}

/// The ARPHRD type of `ifname`, asked through `fd` (device ioctls work on any socket).
fn hatype(fd: &OwnedFd, ifname: &str) -> Result<u16, CaptureError> {
    // SAFETY: ifreq is plain old data; all zeroes is a valid (empty) request.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    // The name was checked by `ifindex`: shorter than IFNAMSIZ, no NUL.
    for (dst, &src) in req.ifr_name.iter_mut().zip(ifname.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR reads and writes one ifreq, which we own.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR as _, &mut req) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENODEV) => CaptureError::NoSuchInterface {
                ifname: ifname.to_owned(),
            },
            _ => CaptureError::sys(ifname, "ioctl(SIOCGIFHWADDR)", err),
        });
    }
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member: sa_family is the ARPHRD type.
    Ok(unsafe { req.ifr_ifru.ifru_hwaddr.sa_family })
}

/// Checks the ring geometry and snaplen before any syscall, so a bad option is named as such
/// rather than as the kernel's EINVAL.
fn check_opts(ifname: &str, opts: &CaptureOpts) -> Result<(), CaptureError> {
    // SAFETY: sysconf has no preconditions.
    let page = u32::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let bad = |what: String| Err(CaptureError::invalid(ifname, what));
    if opts.snaplen == 0 {
        return bad("snaplen 0 would capture nothing".into());
    }
    if opts.block_size == 0 || !opts.block_size.is_multiple_of(page) {
        return bad(format!(
            "ring block size {} is not a positive multiple of the page size {page}",
            opts.block_size
        ));
    }
    if opts.block_count == 0 {
        return bad("ring block count 0: the ring needs at least one block".into());
    }
    let total = u64::from(opts.block_size) * u64::from(opts.block_count);
    if total > u64::from(u32::MAX) || usize::try_from(total).is_err() {
        return bad(format!(
            "ring of {} blocks of {} bytes is larger than 4 GiB",
            opts.block_count, opts.block_size
        ));
    }
    if opts.promisc && ifname == "any" {
        return bad("promiscuous mode needs one interface, not \"any\"".into());
    }
    Ok(())
}

impl Capture {
    /// Opens a capture on `ifname` (in the calling thread's network namespace), or on every
    /// interface when `ifname` is `"any"`. On `"any"`, only Ethernet and loopback interfaces
    /// are captured, so that every packet starts with an Ethernet header.
    pub fn open(ifname: &str, opts: &CaptureOpts) -> Result<Capture, CaptureError> {
        check_opts(ifname, opts)?;
        let any = ifname == "any";
        // The name first: a typo is reported as such even without privileges.
        let index = if any { 0 } else { ifindex(ifname)? };

        // Protocol 0: nothing is queued to it before `bind`.
        let fd = afpacket::socket().map_err(|e| CaptureError::sys(ifname, e.call, e.source))?;

        let linktype = if any {
            LINKTYPE_ETHERNET
        } else {
            match hatype(&fd, ifname)? {
                libc::ARPHRD_ETHER | libc::ARPHRD_LOOPBACK => LINKTYPE_ETHERNET,
                ARPHRD_NONE | ARPHRD_RAWIP => LINKTYPE_RAW,
                other => {
                    return Err(CaptureError::UnsupportedLink {
                        ifname: ifname.to_owned(),
                        hatype: other,
                    })
                }
            }
        };

        let frames = if opts.immediate {
            let f = Frames::for_snaplen(opts.snaplen, opts.block_size, opts.block_count);
            Some(f.ok_or_else(|| {
                CaptureError::invalid(
                    ifname,
                    format!(
                        "immediate mode: ring block size {} cannot hold a frame of snaplen {} bytes",
                        opts.block_size, opts.snaplen
                    ),
                )
            })?)
        } else {
            None
        };
        let (version, call) = if frames.is_some() {
            (
                libc::tpacket_versions::TPACKET_V2,
                "setsockopt(PACKET_VERSION, TPACKET_V2)",
            )
        } else {
            (
                libc::tpacket_versions::TPACKET_V3,
                "setsockopt(PACKET_VERSION, TPACKET_V3)",
            )
        };
        setsockopt(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &(version as libc::c_int),
        )
        .map_err(|e| CaptureError::sys(ifname, call, e))?;

        let expr = opts.filter.as_deref().unwrap_or("");
        let mut prog = compile_filter(expr, linktype, opts.snaplen)?;
        if any {
            prog = ethernet_only(&prog);
        }
        let fprog = libc::sock_fprog {
            len: u16::try_from(prog.len()).map_err(|_| CaptureError::Filter {
                expr: expr.to_owned(),
                reason: format!("{} instructions, more than the kernel takes", prog.len()),
            })?,
            filter: prog.as_mut_ptr(),
        };
        setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
            .map_err(|e| CaptureError::sys(ifname, "setsockopt(SO_ATTACH_FILTER)", e))?;

        if opts.promisc {
            let mreq = libc::packet_mreq {
                mr_ifindex: index as libc::c_int,
                mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            setsockopt(
                fd.as_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                &mreq,
            )
            .map_err(|e| {
                CaptureError::sys(ifname, "setsockopt(PACKET_ADD_MEMBERSHIP, PROMISC)", e)
            })?;
        }

        let ring = match frames {
            // V2 reads only the tpacket_req part of the request.
            Some(f) => setsockopt(
                fd.as_fd(),
                libc::SOL_PACKET,
                libc::PACKET_RX_RING,
                &libc::tpacket_req {
                    tp_block_size: opts.block_size,
                    tp_block_nr: opts.block_count,
                    tp_frame_size: f.size as u32,
                    tp_frame_nr: f.count as u32,
                },
            ),
            None => setsockopt(
                fd.as_fd(),
                libc::SOL_PACKET,
                libc::PACKET_RX_RING,
                &libc::tpacket_req3 {
                    tp_block_size: opts.block_size,
                    tp_block_nr: opts.block_count,
                    tp_frame_size: FRAME_SIZE.min(opts.block_size),
                    tp_frame_nr: (opts.block_size / FRAME_SIZE.min(opts.block_size))
                        * opts.block_count,
                    tp_retire_blk_tov: opts.block_timeout_ms,
                    // No private area: the first packet follows the block header directly.
                    tp_sizeof_priv: 0,
                    tp_feature_req_word: 0,
                },
            ),
        };
        ring.map_err(|e| CaptureError::sys(ifname, "setsockopt(PACKET_RX_RING)", e))?;
        let map_len = opts.block_size as usize * opts.block_count as usize;
        let map = afpacket::map_ring(fd.as_fd(), map_len)
            .map_err(|e| CaptureError::sys(ifname, "mmap(PACKET_RX_RING)", e))?;
        // From here on `cap`'s Drop unmaps the ring, also when a later step fails.
        let cap = Capture {
            fd,
            ifname: ifname.to_owned(),
            ifindex: index,
            linktype,
            map,
            map_len,
            block_size: opts.block_size as usize,
            block_count: opts.block_count as usize,
            next: 0,
            frames,
            stats: CaptureStats::default(),
        };

        afpacket::bind(cap.fd.as_fd(), index, libc::ETH_P_ALL as u16)
            .map_err(|e| CaptureError::sys(ifname, "bind(AF_PACKET, ETH_P_ALL)", e))?;

        if let Some((group, mode)) = opts.fanout {
            let mode = match mode {
                FanoutMode::Hash => libc::PACKET_FANOUT_HASH,
                FanoutMode::Cpu => libc::PACKET_FANOUT_CPU,
            };
            let arg = (u32::from(group) | (mode << 16)) as libc::c_int;
            setsockopt(cap.fd.as_fd(), libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)
                .map_err(|e| CaptureError::sys(ifname, "setsockopt(PACKET_FANOUT)", e))?;
        }
        Ok(cap)
    }

    /// The interface name given to [`Capture::open`].
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The pcap link type of the captured frames: [`LINKTYPE_ETHERNET`] (also for loopback and
    /// `"any"`) or [`LINKTYPE_RAW`] (tun and other headerless interfaces).
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    fn block(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.block_count);
        // SAFETY: i < block_count, so the block lies inside the mapping.
        unsafe { self.map.as_ptr().add(i * self.block_size) }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "blocks are page-aligned (mmap, block size a multiple of the page) and the offset is 8"
    )]
    fn block_status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: block_status is an aligned u32 at a fixed offset of a page-aligned block; the
        // kernel writes it concurrently, so it is only accessed atomically.
        unsafe { &*self.block(i).add(BLOCK_STATUS_OFF).cast::<AtomicU32>() }
    }

    /// Waits up to `timeout` for the next retired block and calls `f` for each packet in it
    /// (a view into the ring, valid during the call); returns the number of packets seen, 0
    /// when nothing arrived in time. The block is returned to the kernel after the last `f`
    /// returns (also if `f` panics).
    ///
    /// A block retires when it is full or `block_timeout_ms` after its first packet, so that
    /// is the latency between a packet's arrival and its delivery here. In immediate mode
    /// there are no blocks: this takes every packet already landed, each frame handed back
    /// as soon as its `f` returns.
    ///
    /// While the interface is down this waits as usual (the kernel resumes the capture when it
    /// comes back up); once the interface is deleted it fails with
    /// [`CaptureError::NoSuchInterface`].
    pub fn next_block(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(&CapturedPacket<'_>),
    ) -> Result<usize, CaptureError> {
        if let Some(fr) = self.frames {
            return self.next_frames(fr, timeout, f);
        }
        let i = self.next;
        if !self.wait(self.block_status(i), timeout)? {
            return Ok(0);
        }
        self.next = (i + 1) % self.block_count;
        let _give = Give(self.block_status(i));
        self.walk(i, &mut f)
    }

    /// Immediate mode's [`Capture::next_block`]: every frame the kernel has filled, in ring
    /// order, at most the whole ring once.
    fn next_frames(
        &mut self,
        fr: Frames,
        timeout: Duration,
        mut f: impl FnMut(&CapturedPacket<'_>),
    ) -> Result<usize, CaptureError> {
        if !self.wait(self.frame_status(fr, self.next), timeout)? {
            return Ok(0);
        }
        let mut n = 0;
        while n < fr.count
            && self.frame_status(fr, self.next).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
        {
            let i = self.next;
            self.next = (i + 1) % fr.count;
            let _give = Give(self.frame_status(fr, i));
            self.walk_frame(fr, i, &mut f)?;
            n += 1;
        }
        Ok(n)
    }

    fn frame(&self, fr: Frames, i: usize) -> *mut u8 {
        debug_assert!(i < fr.count);
        // SAFETY: i < count, so the frame lies inside its block, inside the mapping.
        unsafe {
            self.map
                .as_ptr()
                .add((i / fr.per_block) * self.block_size + (i % fr.per_block) * fr.size)
        }
    }

    #[expect(
        clippy::cast_ptr_alignment,
        reason = "frames start at multiples of TPACKET_ALIGNMENT (16) in page-aligned blocks"
    )]
    fn frame_status(&self, fr: Frames, i: usize) -> &AtomicU32 {
        // SAFETY: tp_status is the first u32 of an aligned frame; the kernel writes it
        // concurrently, so it is only accessed atomically.
        unsafe { &*self.frame(fr, i).cast::<AtomicU32>() }
    }

    /// Calls `f` for the packet in frame `i`, which is ours, every offset checked against
    /// the frame before it is followed.
    fn walk_frame(
        &self,
        fr: Frames,
        i: usize,
        f: &mut impl FnMut(&CapturedPacket<'_>),
    ) -> Result<(), CaptureError> {
        let base = self.frame(fr, i);
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "frames start at multiples of TPACKET_ALIGNMENT (16) in page-aligned blocks"
        )]
        // SAFETY: the frame is ours (TP_STATUS_USER, read with Acquire) and starts with a
        // tpacket2_hdr, plain old data the kernel does not write until we hand it back.
        let h = unsafe { &*base.cast::<libc::tpacket2_hdr>() };
        let mac = usize::from(h.tp_mac);
        let snap = h.tp_snaplen as usize;
        let sll_len = std::mem::size_of::<libc::sockaddr_ll>();
        if mac < SLL2_OFF + sll_len || mac + snap > fr.size {
            return Err(CaptureError::Ring {
                ifname: self.ifname.clone(),
                block: i / fr.per_block,
                what: "packet data outside its frame",
            });
        }
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "SLL2_OFF is TPACKET_ALIGNMENT-rounded in an aligned frame"
        )]
        // SAFETY: in bounds (checked above), 16-byte aligned; plain old data.
        let sll = unsafe { &*base.add(SLL2_OFF).cast::<libc::sockaddr_ll>() };
        // SAFETY: [mac, mac + snap) lies inside the frame (checked above), which stays ours
        // and unchanged until the caller hands it back.
        let data = unsafe { std::slice::from_raw_parts(base.add(mac), snap) };
        let vlan_valid = h.tp_status & libc::TP_STATUS_VLAN_VALID != 0;
        f(&CapturedPacket {
            ts_ns: u64::from(h.tp_sec) * 1_000_000_000 + u64::from(h.tp_nsec),
            data,
            orig_len: h.tp_len,
            ifindex: sll.sll_ifindex as u32,
            direction: Direction::from_pkttype(sll.sll_pkttype),
            vlan_tci: vlan_valid.then_some(h.tp_vlan_tci),
            vlan_tpid: (vlan_valid && h.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0)
                .then_some(h.tp_vlan_tpid),
        });
        Ok(())
    }

    /// Whether the block or frame `status` belongs to is ours, waiting up to `timeout`.
    fn wait(&self, status: &AtomicU32, timeout: Duration) -> Result<bool, CaptureError> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if status.load(Ordering::Acquire) & libc::TP_STATUS_USER != 0 {
                return Ok(true);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return Ok(false);
            }
            // Rounded up, so a sub-millisecond wait does not become a busy poll(0).
            let ms = left
                .as_nanos()
                .div_ceil(1_000_000)
                .min(libc::c_int::MAX as u128) as libc::c_int;
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN | libc::POLLERR,
                revents: 0,
            };
            // SAFETY: one pollfd that we own.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(CaptureError::sys(&self.ifname, "poll", err));
            }
            if pfd.revents & libc::POLLERR != 0 {
                // Reading SO_ERROR also clears it.
                if let Some(err) = self.take_socket_error()? {
                    self.check_link_error(err)?;
                }
            }
        }
    }

    /// The kernel reports ENETDOWN both when the interface goes down (it re-attaches the
    /// socket when the interface comes back up, so waiting on is right) and when it is
    /// deleted (nothing will ever arrive again: an error). Which one it was is told by the
    /// name still leading to the same index in the socket's namespace (the calling thread
    /// may be in another one).
    fn check_link_error(&self, err: io::Error) -> Result<(), CaptureError> {
        if err.raw_os_error() != Some(libc::ENETDOWN) || self.ifindex == 0 {
            return Err(CaptureError::sys(&self.ifname, "poll", err));
        }
        // SAFETY: ifreq is plain old data; all zeroes is a valid (empty) request.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        // The name was checked at open: shorter than IFNAMSIZ, no NUL.
        for (dst, &src) in req.ifr_name.iter_mut().zip(self.ifname.as_bytes()) {
            *dst = src as libc::c_char;
        }
        // SAFETY: SIOCGIFINDEX reads and writes one ifreq, which we own.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCGIFINDEX as _, &mut req) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENODEV) => CaptureError::NoSuchInterface {
                    ifname: self.ifname.clone(),
                },
                _ => CaptureError::sys(&self.ifname, "ioctl(SIOCGIFINDEX)", e),
            });
        }
        // SAFETY: SIOCGIFINDEX filled the ifindex member of the union.
        if unsafe { req.ifr_ifru.ifru_ifindex } as u32 == self.ifindex {
            Ok(())
        } else {
            // Deleted and replaced by another interface of the same name, which this socket
            // is not bound to.
            Err(CaptureError::NoSuchInterface {
                ifname: self.ifname.clone(),
            })
        }
    }

    fn take_socket_error(&self) -> Result<Option<io::Error>, CaptureError> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads one int into `v`, which we own.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(CaptureError::sys(
                &self.ifname,
                "getsockopt(SO_ERROR)",
                io::Error::last_os_error(),
            ));
        }
        Ok((v != 0).then(|| io::Error::from_raw_os_error(v)))
    }

    /// Calls `f` for each packet of block `i`, which is ours. Every offset the kernel wrote is
    /// checked against the block before it is followed.
    fn walk(
        &self,
        i: usize,
        f: &mut impl FnMut(&CapturedPacket<'_>),
    ) -> Result<usize, CaptureError> {
        let base = self.block(i);
        let bad = |what| CaptureError::Ring {
            ifname: self.ifname.clone(),
            block: i,
            what,
        };
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "a block starts page-aligned (mmap, block size a multiple of the page)"
        )]
        // SAFETY: the block is ours (TP_STATUS_USER, read with Acquire) and starts with a
        // tpacket_block_desc; the kernel does not write it until we hand it back.
        let bh = unsafe { &(*base.cast::<libc::tpacket_block_desc>()).hdr.bh1 };
        let num = bh.num_pkts as usize;
        let mut off = bh.offset_to_first_pkt as usize;
        let hdr_len = std::mem::size_of::<libc::tpacket3_hdr>();
        let sll_len = std::mem::size_of::<libc::sockaddr_ll>();
        for n in 0..num {
            if !off.is_multiple_of(V3_ALIGNMENT) || off + SLL_OFF + sll_len > self.block_size {
                return Err(bad("packet header outside the block"));
            }
            #[expect(
                clippy::cast_ptr_alignment,
                reason = "`off` is checked to be a multiple of V3_ALIGNMENT in a page-aligned block"
            )]
            // SAFETY: in bounds (checked above) and 8-byte aligned within a page-aligned
            // block (tpacket3_hdr needs 4); it is plain old data.
            let h = unsafe { &*base.add(off).cast::<libc::tpacket3_hdr>() };
            debug_assert!(hdr_len <= SLL_OFF);
            let mac = off + usize::from(h.tp_mac);
            let snap = h.tp_snaplen as usize;
            if mac < off + SLL_OFF + sll_len || mac + snap > self.block_size {
                return Err(bad("packet data outside the block"));
            }
            #[expect(
                clippy::cast_ptr_alignment,
                reason = "`off` is aligned (checked above) and SLL_OFF is TPACKET_ALIGNMENT-rounded"
            )]
            // SAFETY: in bounds (checked above); sockaddr_ll is plain old data and needs 4-byte
            // alignment, which an 8-byte-aligned offset + 48 has.
            let sll = unsafe { &*base.add(off + SLL_OFF).cast::<libc::sockaddr_ll>() };
            // SAFETY: [mac, mac + snap) lies inside the block (checked above), which stays
            // ours and unchanged until `walk` returns.
            let data = unsafe { std::slice::from_raw_parts(base.add(mac), snap) };
            let status = h.tp_status;
            let vlan_valid = status & libc::TP_STATUS_VLAN_VALID != 0;
            let pkt = CapturedPacket {
                ts_ns: u64::from(h.tp_sec) * 1_000_000_000 + u64::from(h.tp_nsec),
                data,
                orig_len: h.tp_len,
                ifindex: sll.sll_ifindex as u32,
                direction: Direction::from_pkttype(sll.sll_pkttype),
                vlan_tci: vlan_valid.then_some(h.hv1.tp_vlan_tci as u16),
                vlan_tpid: (vlan_valid && status & libc::TP_STATUS_VLAN_TPID_VALID != 0)
                    .then_some(h.hv1.tp_vlan_tpid),
            };
            f(&pkt);
            let next = h.tp_next_offset as usize;
            if next == 0 {
                if n + 1 != num {
                    return Err(bad("packet chain ends before the block's packet count"));
                }
                break;
            }
            off += next;
        }
        Ok(num)
    }

    /// Packets accepted by the filter and dropped for want of ring space since the capture
    /// was opened. The kernel resets its counters on each read; this sums them.
    pub fn stats(&mut self) -> Result<CaptureStats, CaptureError> {
        // SAFETY: tpacket_stats_v3 is plain old data. A V2 ring gets the shorter
        // tpacket_stats, its freeze count left 0.
        let mut st: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: reads at most `len` bytes into `st`, which we own.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(CaptureError::sys(
                &self.ifname,
                "getsockopt(PACKET_STATISTICS)",
                io::Error::last_os_error(),
            ));
        }
        // tp_packets already includes the drops (the kernel adds them before answering).
        self.stats.packets += u64::from(st.tp_packets);
        self.stats.drops += u64::from(st.tp_drops);
        self.stats.freeze_count += u64::from(st.tp_freeze_q_cnt);
        Ok(self.stats)
    }
}

impl AsFd for Capture {
    /// The socket, for an event loop: it is readable when a block has retired (in immediate
    /// mode, when a frame has been filled).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `open`, once; no view into it outlives `&self`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ring_options_are_named() {
        let e = |o: CaptureOpts| Capture::open("lo", &o).unwrap_err().to_string();
        let d = CaptureOpts::default();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        assert_eq!(
            e(CaptureOpts {
                block_size: 1000,
                ..d.clone()
            }),
            format!("lo: ring block size 1000 is not a positive multiple of the page size {page}")
        );
        assert_eq!(
            e(CaptureOpts {
                block_count: 0,
                ..d.clone()
            }),
            "lo: ring block count 0: the ring needs at least one block"
        );
        assert_eq!(
            e(CaptureOpts {
                snaplen: 0,
                ..d.clone()
            }),
            "lo: snaplen 0 would capture nothing"
        );
        assert_eq!(
            Capture::open(
                "any",
                &CaptureOpts {
                    promisc: true,
                    ..d.clone()
                }
            )
            .unwrap_err()
            .to_string(),
            "any: promiscuous mode needs one interface, not \"any\""
        );
    }

    #[test]
    fn missing_interface_is_named() {
        let d = CaptureOpts::default();
        for name in ["tknosuch9", "", "a-name-far-too-long-for-linux", "x\0y"] {
            let e = Capture::open(name, &d).unwrap_err();
            assert!(
                matches!(e, CaptureError::NoSuchInterface { .. }),
                "{name:?}: {e}"
            );
        }
        assert_eq!(
            Capture::open("tknosuch9", &d).unwrap_err().to_string(),
            "tknosuch9: no such network interface"
        );
    }
}
