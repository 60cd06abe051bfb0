//! AF_XDP output: whole link-layer frames onto one transmit queue of an interface through an
//! XDP socket, skipping the qdisc and the socket layer's per-frame work. Frames are copied into
//! the socket's UMEM (a region this process shares with the kernel, one chunk per frame), their
//! descriptors written to the TX ring in batches, and the kernel told with one `sendto` when
//! it asks for it (`XDP_USE_NEED_WAKEUP`); chunks come back through the completion ring.
//!
//! Zero-copy or copy: bound without either flag, the kernel tries zero-copy (the driver DMAs
//! from the UMEM) and falls back to copy mode (it builds an skb per frame from the UMEM and
//! hands it to the driver, `__dev_direct_xmit`) when the driver has no AF_XDP support.
//! `XDP_OPTIONS` then says which, for the report. veth has no AF_XDP zero-copy: checked on
//! 6.18, a bind forcing `XDP_ZEROCOPY` fails with EOPNOTSUPP on a plain pair and on one with a
//! native XDP program on both ends, so it is copy mode there.
//!
//! No XDP program is involved: a program is what steers *received* frames into an XDP socket's
//! RX ring; a socket with only a TX ring (and the fill ring bind insists on, left empty) needs
//! none on its own interface or on a veth's peer. A veth peer needs an XDP program or GRO only
//! to take `XDP_REDIRECT`ed frames natively (`ndo_xdp_xmit`), which this path does not use;
//! measured on 6.18, an XDP_PASS program on the peer makes copy-mode sending slower (1456 ns
//! of CPU a 64-byte frame against 808: each frame goes through the peer's program and back
//! into an skb), GRO on the peer changes nothing (816 ns).
//!
//! Accounting: a frame is counted when its chunk comes back (the kernel is done with it):
//! sent, or failed when the kernel said it dropped it (`EBUSY`: the link lost its carrier).
//! Frames the kernel would refuse for their length (shorter than an Ethernet header, longer
//! than MTU + 14, + 4 with an 802.1Q tag, as AF_PACKET allows) never enter the ring: a bad
//! descriptor is dropped by the kernel without ever completing, which would leak its chunk.
//! A frame longer than a chunk (a jumbo MTU) spans several chunks, one descriptor each with
//! `XDP_PKT_CONTD` on all but the last (multi-buffer, `XDP_USE_SG`, bound only then).
//!
//! In copy mode the kernel sends only inside `sendto` (at most its TX budget per call), so
//! [`Sink::send_batch`] returns once the ring is drained: a paced frame leaves when it is due,
//! not with the next batch. In zero-copy mode the driver sends on its own once woken.

mod ring;

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use tcpkit_kernel::afpacket::setsockopt;

use crate::afpacket::{set_sndbuf, ENOBUFS_PAUSE, STUCK_AFTER};
use crate::iface::if_link;
use crate::{if_info, Frame, IfInfo, SendCounters, SendError, Sink};
use ring::{ring_len, CompletionRing, Mapping, TxRing};

/// Entries of the TX and completion rings, and chunks of the UMEM: frames in flight at most.
const RING: u32 = 2048;
/// The fill ring (receive side) must exist for bind to succeed; nothing is ever put in it.
const FILL_RING: u32 = 64;
/// Ethernet header: the shortest frame an Ethernet device takes (AF_PACKET's EINVAL below it).
const ETH_HLEN: usize = 14;
/// An 802.1Q tag: what a tagged frame may have beyond MTU + 14.
const VLAN_HLEN: usize = 4;
/// Descriptors one frame may span with XDP_USE_SG: the kernel's copy mode puts the first in
/// the skb's head and each other in a page fragment, MAX_SKB_FRAGS (17) of them.
const MAX_DESCS_PER_FRAME: usize = 18;
/// `XDP_MAX_TX_SKB_BUDGET` (<linux/if_xdp.h>, 6.17+, not in libc yet): frames one `sendto`
/// may send in copy mode (default 32). Raised to the batch so one kick sends one batch.
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;
/// Chunks not coming back for this long after the ring was handed over mean the device
/// stopped completing transmissions: the sink gives up instead of hanging.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(2);
/// What an skb costs the send buffer beyond its frame's bytes (struct sk_buff and shared
/// info, rounded up).
const SKB_OVERHEAD: usize = 1024;
/// How long a busy queue is waited for at bind (see [`bind`]): measured a few ms after close.
const BUSY_QUEUE_WAIT: Duration = Duration::from_millis(500);

/// How the kernel moves frames from the UMEM to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// The driver sends straight from the UMEM (XDP_ZEROCOPY).
    ZeroCopy,
    /// The kernel copies each frame into an skb for the driver (XDP_COPY; any driver).
    Copy,
}

impl XdpMode {
    /// The report's name: `zerocopy` or `copy`.
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::ZeroCopy => "zerocopy",
            XdpMode::Copy => "copy",
        }
    }
}

/// Options of [`XdpSink::open`].
#[derive(Clone, Copy, Debug)]
pub struct XdpOpts {
    /// The transmit queue to bind to.
    pub queue: u32,
    /// Frames per kick (at least 1).
    pub batch: usize,
}

impl Default for XdpOpts {
    fn default() -> Self {
        XdpOpts {
            queue: 0,
            batch: 64,
        }
    }
}

/// Sends frames on one transmit queue of an interface through an AF_XDP socket.
#[derive(Debug)]
pub struct XdpSink {
    /// Released on a thread of its own at drop (see `Drop`); None only once dropped.
    parts: Option<Parts>,
    info: IfInfo,
    queue: u32,
    mode: XdpMode,
    chunk: u64,
    /// UMEM addresses of the chunks not in flight.
    free: Vec<u64>,
    /// Per chunk in flight: the length of the whole frame on the frame's last chunk, 0 on the
    /// others (a multi-buffer frame's leading chunks), so each frame is counted once.
    lens: Vec<u32>,
    /// Frames the kernel said it dropped (EBUSY) whose chunks have not come back yet: the next
    /// chunks back are counted as those drops, not as sent.
    drops_pending: u64,
    /// A fatal error happened: the frames in flight were counted as failed and nothing more
    /// is sent.
    dead: bool,
    batch: u32,
    counters: SendCounters,
}

/// What the kernel shares with the sink, dropped in this order: the rings' mappings, the
/// socket (which unpins the UMEM), then the UMEM.
#[derive(Debug)]
struct Parts {
    tx: TxRing,
    cq: CompletionRing,
    fd: OwnedFd,
    umem: Mapping,
}

/// One line saying why AF_XDP cannot be used here.
fn unavailable(ifname: &str, why: String, source: Option<io::Error>) -> SendError {
    SendError::Xdp {
        ifname: ifname.to_owned(),
        why,
        source,
    }
}

fn getsockopt<T>(fd: &OwnedFd, name: libc::c_int, v: &mut T) -> io::Result<usize> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is a live value we lend for the call with its exact size; the kernel writes
    // at most `len` bytes and says how many.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            (v as *mut T).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(len as usize)
}

/// Binds, waiting out a queue still held by a socket just closed: the kernel frees a queue's
/// buffer pool from a work queue after the socket is gone (`xp_put_pool`), so a replay started
/// right after another on the same queue would find it busy for a moment.
fn bind(fd: &OwnedFd, sxdp: &libc::sockaddr_xdp) -> io::Result<()> {
    let start = Instant::now();
    loop {
        // SAFETY: binds our socket to an address we own, passed with its exact size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (sxdp as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) || start.elapsed() > BUSY_QUEUE_WAIT {
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl XdpSink {
    /// Opens an AF_XDP socket on transmit queue `opts.queue` of `ifname` (of the calling
    /// thread's namespace). Every reason it cannot be used is one [`SendError`] line.
    pub fn open(ifname: &str, opts: XdpOpts) -> Result<Self, SendError> {
        let info = if_info(ifname)?;
        let link = if_link(ifname)?;
        if !link.up {
            // ENETDOWN, as a send on a down interface says: callers name the fix from it.
            return Err(SendError::sys(
                ifname,
                "bind(AF_XDP)",
                io::Error::from_raw_os_error(libc::ENETDOWN),
            ));
        }
        if !link.carrier {
            return Err(unavailable(
                ifname,
                format!("{ifname} is up but has no carrier (its link, or a veth's peer, is down): the kernel would drop every frame"),
                None,
            ));
        }
        if let Some(n) = link.tx_queues {
            if opts.queue >= n {
                return Err(unavailable(
                    ifname,
                    format!(
                        "queue {} is not one of {ifname}'s {n} transmit queue{} (0-{}); add queues (ethtool -L {ifname} tx N or combined N; a veth: ip link add ... numtxqueues N)",
                        opts.queue,
                        if n == 1 { "" } else { "s" },
                        n - 1
                    ),
                    None,
                ));
            }
        }
        let max_frame = info.mtu as usize + ETH_HLEN + VLAN_HLEN;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        // Aligned chunks are a power of two from 2048 to a page. A frame longer than a chunk
        // (jumbo MTUs) goes as several descriptors, the kernel's multi-buffer (XDP_USE_SG).
        let chunk = if max_frame <= 2048 { 2048 } else { page };
        let multi_buffer = max_frame > chunk;
        let most_descs = max_frame.div_ceil(chunk);
        if most_descs > MAX_DESCS_PER_FRAME {
            return Err(unavailable(
                ifname,
                format!(
                    "frames up to {max_frame} bytes (MTU {}) take more than {MAX_DESCS_PER_FRAME} {chunk}-byte UMEM chunks, the most the kernel joins into one frame; lower the MTU",
                    info.mtu
                ),
                None,
            ));
        }

        // SAFETY: plain socket(2); the fd is owned right after.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAFNOSUPPORT) {
                return Err(unavailable(
                    ifname,
                    "this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS)".into(),
                    Some(e),
                ));
            }
            return Err(SendError::sys(ifname, "socket(AF_XDP)", e));
        }
        // SAFETY: raw is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let umem_len = RING as usize * chunk;
        let umem =
            Mapping::anonymous(umem_len).map_err(|e| SendError::sys(ifname, "mmap(UMEM)", e))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.addr() as u64,
            len: umem.len() as u64,
            chunk_size: chunk as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        if let Err(e) = setsockopt(fd.as_fd(), libc::SOL_XDP, libc::XDP_UMEM_REG, &reg) {
            // The UMEM's pages are pinned and counted against RLIMIT_MEMLOCK unless the process
            // has CAP_IPC_LOCK.
            let why = match e.raw_os_error() {
                Some(libc::ENOBUFS | libc::ENOMEM | libc::EPERM) => format!(
                    "setsockopt(XDP_UMEM_REG): {} KiB of UMEM cannot be locked in memory; raise the limit (ulimit -l) or run with CAP_IPC_LOCK",
                    umem_len >> 10
                ),
                _ => "setsockopt(XDP_UMEM_REG)".to_string(),
            };
            return Err(unavailable(ifname, why, Some(e)));
        }
        for (name, size, call) in [
            (
                libc::XDP_UMEM_FILL_RING,
                FILL_RING,
                "setsockopt(XDP_UMEM_FILL_RING)",
            ),
            (
                libc::XDP_UMEM_COMPLETION_RING,
                RING,
                "setsockopt(XDP_UMEM_COMPLETION_RING)",
            ),
            (libc::XDP_TX_RING, RING, "setsockopt(XDP_TX_RING)"),
        ] {
            setsockopt(fd.as_fd(), libc::SOL_XDP, name, &size)
                .map_err(|e| SendError::sys(ifname, call, e))?;
        }
        // SAFETY: xdp_mmap_offsets is plain integers; all zero is a valid value.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let got = getsockopt(&fd, libc::XDP_MMAP_OFFSETS, &mut off)
            .map_err(|e| SendError::sys(ifname, "getsockopt(XDP_MMAP_OFFSETS)", e))?;
        // Kernels before 5.4 answer the shorter layout without flags words (and without
        // need_wakeup): those rings are kicked on every batch.
        let has_flags = got >= std::mem::size_of::<libc::xdp_mmap_offsets>();
        if !has_flags {
            return Err(unavailable(
                ifname,
                "this kernel's AF_XDP rings have no flags word (before Linux 5.4)".into(),
                None,
            ));
        }
        let desc = std::mem::size_of::<libc::xdp_desc>();
        let tx_map = Mapping::ring(
            fd.as_fd(),
            ring_len(&off.tx, RING, desc),
            libc::XDP_PGOFF_TX_RING as u64,
        )
        .map_err(|e| SendError::sys(ifname, "mmap(XDP_TX_RING)", e))?;
        let cq_map = Mapping::ring(
            fd.as_fd(),
            ring_len(&off.cr, RING, std::mem::size_of::<u64>()),
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        )
        .map_err(|e| SendError::sys(ifname, "mmap(XDP_UMEM_COMPLETION_RING)", e))?;
        let tx = TxRing::new(tx_map, &off.tx, has_flags, RING);
        let cq = CompletionRing::new(cq_map, &off.cr, RING);

        // In copy mode each frame in flight is an skb charged to this socket's send buffer
        // until the device frees it; a full buffer makes the kernel refuse the next frame
        // (EAGAIN). Room for every chunk in flight, with the skb's own overhead, so a NIC that
        // completes late does not stall the ring.
        set_sndbuf(&fd, ifname, RING as usize * (chunk + SKB_OVERHEAD))?;
        let batch = opts.batch.clamp(1, RING as usize / 2) as u32;
        // Older kernels do not know the option (ENOPROTOOPT): they send 32 per kick, and the
        // drain loop kicks again.
        let budget = batch.max(32);
        let _ = setsockopt(fd.as_fd(), libc::SOL_XDP, XDP_MAX_TX_SKB_BUDGET, &budget);

        let sxdp = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            // Neither XDP_COPY nor XDP_ZEROCOPY: zero-copy where the driver has it, else copy.
            sxdp_flags: libc::XDP_USE_NEED_WAKEUP | if multi_buffer { libc::XDP_USE_SG } else { 0 },
            sxdp_ifindex: info.ifindex,
            sxdp_queue_id: opts.queue,
            sxdp_shared_umem_fd: 0,
        };
        if let Err(e) = bind(&fd, &sxdp) {
            let why = match e.raw_os_error() {
                Some(libc::EBUSY) => format!(
                    "bind: queue {} of {ifname} already has an AF_XDP socket (another sender, or a program's)",
                    opts.queue
                ),
                Some(libc::EINVAL) => format!(
                    "bind: queue {} is not one of {ifname}'s queues",
                    opts.queue
                ),
                _ => format!("bind to queue {}", opts.queue),
            };
            return Err(unavailable(ifname, why, Some(e)));
        }
        let mut xo = libc::xdp_options { flags: 0 };
        getsockopt(&fd, libc::XDP_OPTIONS, &mut xo)
            .map_err(|e| SendError::sys(ifname, "getsockopt(XDP_OPTIONS)", e))?;
        let mode = if xo.flags & libc::XDP_OPTIONS_ZEROCOPY != 0 {
            XdpMode::ZeroCopy
        } else {
            XdpMode::Copy
        };

        let chunk = chunk as u64;
        // Handed out from the end: the lowest addresses first, which reads best in a trace.
        let free = (0..u64::from(RING)).rev().map(|i| i * chunk).collect();
        Ok(XdpSink {
            parts: Some(Parts { tx, cq, fd, umem }),
            info,
            queue: opts.queue,
            mode,
            chunk,
            free,
            lens: vec![0; RING as usize],
            drops_pending: 0,
            dead: false,
            batch,
            counters: SendCounters::default(),
        })
    }

    /// The interface this sink sends on.
    pub fn info(&self) -> &IfInfo {
        &self.info
    }

    /// The transmit queue this sink's socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Zero-copy or copy, as the kernel chose at bind.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// Chunks back from the kernel: each one's frame counted as sent, or as one of the drops
    /// the kernel reported. Returns how many came back.
    fn reap(&mut self) -> u32 {
        let (cq, lens, free, c) = (
            &mut self.parts.as_mut().expect("live sink").cq,
            &mut self.lens,
            &mut self.free,
            &mut self.counters,
        );
        let (chunk, drops) = (self.chunk, &mut self.drops_pending);
        cq.take(|addr| {
            let i = (addr / chunk) as usize;
            let len = std::mem::take(&mut lens[i]);
            free.push(addr - addr % chunk);
            if len == 0 {
                // A leading chunk of a multi-buffer frame: counted with its last.
                return;
            }
            if *drops > 0 {
                // Counted as failed when the kernel said so (EBUSY).
                *drops -= 1;
            } else {
                c.successful += 1;
                c.bytes += u64::from(len);
            }
        })
    }

    /// One `sendto` kick. Ok(true) when the kernel took what it could; Ok(false) when it
    /// asks to be kicked again (budget spent, completion ring full, device queue busy).
    fn kick(&mut self) -> Result<bool, SendError> {
        let fd = self.parts().fd.as_raw_fd();
        // SAFETY: sendto with no buffer and no address: the AF_XDP wakeup.
        let rc = unsafe {
            libc::sendto(
                fd,
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if rc >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS) => Ok(false),
            // Zero-copy: a driver busy with the queue says so; nothing was dropped.
            Some(libc::EBUSY) if self.mode == XdpMode::ZeroCopy => Ok(false),
            Some(libc::EBUSY) => {
                // Copy mode: the device refused the frame (no carrier, or down): its chunk
                // comes back through the completion ring all the same.
                self.counters.failed += 1;
                self.drops_pending += 1;
                let name = &self.info.name;
                let link = if_link(name)?;
                if !link.up {
                    return Err(SendError::sys(
                        name,
                        "sendto(AF_XDP)",
                        io::Error::from_raw_os_error(libc::ENETDOWN),
                    ));
                }
                if !link.carrier {
                    return Err(unavailable(
                        name,
                        format!("{name} lost its carrier (its link, or a veth's peer, went down): the kernel drops every frame"),
                        Some(e),
                    ));
                }
                Ok(false)
            }
            _ => Err(SendError::sys(&self.info.name, "sendto(AF_XDP)", e)),
        }
    }

    /// Hands the published descriptors to the kernel. Copy mode: kicks until the kernel has
    /// taken all of them (it sends only inside `sendto`). Zero-copy: one kick if the driver
    /// asked for it; it sends on its own. On an error the frames in flight count as failed:
    /// the sink cannot go on.
    fn push_out(&mut self) -> Result<(), SendError> {
        if self.dead {
            return Ok(());
        }
        let r = self.push_out_once();
        if r.is_err() {
            self.fail_in_flight();
        }
        r
    }

    /// The frames in flight (their chunks not back) counted as failed, apart from the drops
    /// already counted; the sink sends nothing more. Returns how many.
    fn fail_in_flight(&mut self) -> u64 {
        let n = self.lens.iter().filter(|&&l| l > 0).count() as u64;
        let n = n.saturating_sub(self.drops_pending);
        self.counters.failed += n;
        self.lens.fill(0);
        self.drops_pending = 0;
        self.dead = true;
        n
    }

    fn push_out_once(&mut self) -> Result<(), SendError> {
        self.parts().tx.publish();
        if self.mode == XdpMode::ZeroCopy {
            if self.parts().tx.needs_wakeup() {
                self.kick()?;
            }
            self.reap();
            return Ok(());
        }
        let mut stalled_since: Option<Instant> = None;
        loop {
            let before = self.parts().tx.pending();
            if before == 0 {
                break;
            }
            let done = self.kick()?;
            self.reap();
            let after = self.parts().tx.pending();
            if after < before {
                stalled_since = None;
                continue;
            }
            if done && after > 0 {
                // sendto said all is well and took nothing: the kernel sends nothing for a
                // queue past the device's real TX queues (it checks only at send time).
                return Err(unavailable(
                    &self.info.name,
                    format!(
                        "the kernel took no frame from queue {}: it is not one of {}'s transmit queues",
                        self.queue, self.info.name
                    ),
                    None,
                ));
            }
            let since = *stalled_since.get_or_insert_with(Instant::now);
            if since.elapsed() > STUCK_AFTER {
                return Err(SendError::sys(
                    &self.info.name,
                    "sendto(AF_XDP)",
                    io::Error::from_raw_os_error(libc::ETIMEDOUT),
                ));
            }
            // The device queue is full (NETDEV_TX_BUSY) or the completion ring is: give the
            // device a moment, as the AF_PACKET path does on ENOBUFS.
            self.counters.retried_eagain += 1;
            std::thread::sleep(ENOBUFS_PAUSE);
        }
        Ok(())
    }

    /// Whether `n` chunks and `n` TX slots are free.
    fn room_for(&mut self, n: usize) -> bool {
        self.free.len() >= n && self.parts().tx.free(n as u32) as usize >= n
    }

    /// Waits until `n` chunks and TX slots are free, pushing out and reaping meanwhile.
    fn make_room(&mut self, n: usize) -> Result<(), SendError> {
        let mut since: Option<Instant> = None;
        loop {
            if self.free.len() < n {
                self.reap();
            }
            if self.room_for(n) {
                return Ok(());
            }
            self.push_out()?;
            if self.room_for(n) {
                return Ok(());
            }
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > COMPLETION_TIMEOUT {
                return Err(self.stuck());
            }
            std::thread::sleep(Duration::from_micros(10));
        }
    }

    /// The frames still in flight are counted as failed; the error says the device stopped.
    fn stuck(&mut self) -> SendError {
        let lost = self.fail_in_flight();
        self.counters.failed_stuck += lost;
        SendError::sys(
            &self.info.name,
            "AF_XDP completion ring",
            io::Error::from_raw_os_error(libc::ETIMEDOUT),
        )
    }

    /// Longest frame the kernel takes (AF_PACKET's rule): MTU + 14, 4 more when 802.1Q-tagged.
    fn max_len(&self, frame: &[u8]) -> usize {
        let base = self.info.mtu as usize + ETH_HLEN;
        if tcpkit_wire::is_8021q_tagged(frame) {
            base + VLAN_HLEN
        } else {
            base
        }
    }

    /// XDP_STATISTICS' count of descriptors the kernel found invalid on TX (0 when all is well).
    pub fn invalid_descriptors(&self) -> Option<u64> {
        // SAFETY: xdp_statistics is plain integers; all zero is a valid value.
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        getsockopt(&self.parts.as_ref()?.fd, libc::XDP_STATISTICS, &mut st).ok()?;
        Some(st.tx_invalid_descs)
    }
}

impl Sink for XdpSink {
    fn send_batch(&mut self, frames: &[Frame<'_>]) -> Result<(), SendError> {
        if self.dead {
            self.counters.failed += frames.len() as u64;
            return Ok(());
        }
        let mut since_kick = 0u32;
        for (k, f) in frames.iter().enumerate() {
            let len = f.data.len();
            if len < ETH_HLEN {
                self.counters.failed += 1;
                self.counters.failed_malformed += 1;
                continue;
            }
            if len > self.max_len(f.data) {
                self.counters.failed += 1;
                self.counters.failed_too_big += 1;
                continue;
            }
            let descs = len.div_ceil(self.chunk as usize);
            if !self.room_for(descs) {
                if let Err(e) = self.make_room(descs) {
                    self.counters.failed += (frames.len() - k) as u64;
                    return Err(e);
                }
            }
            let chunk = self.chunk as usize;
            for (d, piece) in f.data.chunks(chunk).enumerate() {
                let addr = self.free.pop().expect("make_room left the chunks free");
                // SAFETY: the chunk at `addr` is ours (not in flight: the kernel neither reads
                // nor writes it until its descriptor is published) and a piece is at most one
                // chunk long.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        piece.as_ptr(),
                        self.parts().umem.addr().add(addr as usize),
                        piece.len(),
                    );
                }
                let last = d + 1 == descs;
                self.lens[(addr / self.chunk) as usize] = if last { len as u32 } else { 0 };
                // XDP_PKT_CONTD: the frame goes on in the next descriptor.
                let options = if last { 0 } else { libc::XDP_PKT_CONTD };
                self.parts().tx.push(addr, piece.len() as u32, options);
            }
            since_kick += 1;
            if since_kick == self.batch {
                since_kick = 0;
                if let Err(e) = self.push_out() {
                    self.counters.failed += (frames.len() - k - 1) as u64;
                    return Err(e);
                }
            }
        }
        if since_kick > 0 {
            self.push_out()?;
        }
        Ok(())
    }

    fn counters(&self) -> SendCounters {
        self.counters
    }

    /// Waits until every chunk is back, so the counters are final.
    fn flush(&mut self) -> Result<(), SendError> {
        self.push_out()?;
        if self.dead {
            return Ok(());
        }
        let mut progress = Instant::now();
        while self.free.len() < RING as usize {
            if self.mode == XdpMode::ZeroCopy && self.parts().tx.needs_wakeup() {
                if let Err(e) = self.kick() {
                    self.fail_in_flight();
                    return Err(e);
                }
            }
            if self.reap() > 0 {
                progress = Instant::now();
                continue;
            }
            if progress.elapsed() > COMPLETION_TIMEOUT {
                return Err(self.stuck());
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }
}

impl Parts {
    fn release(self) {
        let Parts { tx, cq, fd, umem } = self;
        drop((tx, cq));
        drop(fd);
        drop(umem);
    }
}

impl XdpSink {
    fn parts(&mut self) -> &mut Parts {
        self.parts
            .as_mut()
            .expect("an XdpSink's parts live until it is dropped")
    }

    /// Closes the socket now, on this thread: its queue is free again when this returns (a
    /// drop frees it a moment later, on a thread of its own).
    pub fn close(mut self) {
        if let Some(p) = self.parts.take() {
            p.release();
        }
    }
}

impl Drop for XdpSink {
    /// Releasing an XDP socket waits for an RCU grace period, as a packet socket does (see
    /// `AfPacketSink`'s drop): done on a thread of its own so a caller timing its run up to
    /// the drop does not count it. Every frame was handed over before this point.
    fn drop(&mut self) {
        let Some(parts) = self.parts.take() else {
            return;
        };
        // If no thread can be started, the closure is dropped here, releasing inline (its
        // fields drop in the order `release` keeps).
        let _ = std::thread::Builder::new()
            .name("tcpkit-xdp-close".into())
            .spawn(move || parts.release());
    }
}

#[cfg(test)]
mod tests;
