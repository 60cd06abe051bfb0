//! AF_PACKET output: whole link-layer frames onto one interface, batched either through a
//! PACKET_TX_RING (the default: one `send()` per batch, see [`crate::ring`]) or with `sendmmsg`.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use tcpkit_kernel::afpacket::{self, setsockopt};

use crate::ring::TxRing;
use crate::{if_info, Frame, IfInfo, SendCounters, SendError, Sink};

/// `PACKET_QDISC_BYPASS` from <linux/if_packet.h> (not exported by libc for Linux targets).
const PACKET_QDISC_BYPASS: libc::c_int = 20;
/// `SO_SNDBUFFORCE` from <asm-generic/socket.h> (not exported by libc for Linux targets).
const SO_SNDBUFFORCE: libc::c_int = 32;

/// How long one frame may keep failing with ENOBUFS/EAGAIN before it is counted as failed: a
/// queue that stays full for this long is stuck, and blocking forever would hide it.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(1);
/// ENOBUFS comes from a full device queue, which has no wakeup to poll for: wait this long.
pub(crate) const ENOBUFS_PAUSE: Duration = Duration::from_micros(50);

/// How frames are handed to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxMode {
    /// Copy frames into a PACKET_TX_RING (TPACKET_V2) shared with the kernel and send each
    /// batch with one `send()`. Measured faster than `sendmmsg` on veth (bench/README.md).
    Ring,
    /// One `sendmmsg` per batch: one `msghdr` per frame copied in by the kernel.
    Sendmmsg,
}

/// Options of [`AfPacketSink::open`].
#[derive(Clone, Copy, Debug)]
pub struct AfPacketOpts {
    /// TX ring (default) or `sendmmsg`.
    pub mode: TxMode,
    /// Hand frames straight to the driver, skipping the qdisc (PACKET_QDISC_BYPASS): faster,
    /// but no traffic shaping and ENOBUFS when the device queue is full.
    pub qdisc_bypass: bool,
    /// Frames per `sendmmsg` or ring `send()` call (at least 1).
    pub batch: usize,
    /// Socket send buffer in bytes (SO_SNDBUFFORCE, falling back to SO_SNDBUF without
    /// CAP_NET_ADMIN); None keeps the system default.
    pub sndbuf: Option<usize>,
}

impl Default for AfPacketOpts {
    fn default() -> Self {
        AfPacketOpts {
            mode: TxMode::Ring,
            qdisc_bypass: false,
            batch: 32,
            sndbuf: None,
        }
    }
}

/// Sends frames on one interface through AF_PACKET SOCK_RAW sockets.
///
/// The sockets are bound with protocol 0, so they only send: the kernel does not hand them a
/// copy of every frame on the interface. The `mmsghdr`/`iovec` arrays and the TX ring are
/// allocated once, at open.
#[derive(Debug)]
pub struct AfPacketSink {
    /// The `sendmmsg` socket; in ring mode it carries only the frames the ring does not take
    /// (see [`crate::ring`]).
    fd: ManuallyDrop<OwnedFd>,
    /// Ring mode: the ring's own socket (a socket with a TX ring sends only from the ring).
    ring: Option<(OwnedFd, TxRing)>,
    info: IfInfo,
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    counters: SendCounters,
}

// SAFETY: the raw pointers in `hdrs` point into `iovs` (a heap buffer owned by this struct and
// never resized) and, only during `send_batch`, into the caller's frames; nothing is shared
// with another thread.
unsafe impl Send for AfPacketSink {}

/// A send-only AF_PACKET socket with `opts`' buffer size and qdisc bypass, not yet bound.
fn new_socket(ifname: &str, opts: &AfPacketOpts) -> Result<OwnedFd, SendError> {
    // Protocol 0: receive nothing.
    let fd = afpacket::socket().map_err(|e| SendError::sys(ifname, e.call, e.source))?;

    if let Some(size) = opts.sndbuf {
        set_sndbuf(&fd, ifname, size)?;
    }
    if opts.qdisc_bypass {
        let on: libc::c_int = 1;
        setsockopt(fd.as_fd(), libc::SOL_PACKET, PACKET_QDISC_BYPASS, &on)
            .map_err(|e| SendError::sys(ifname, "setsockopt(PACKET_QDISC_BYPASS)", e))?;
    }
    Ok(fd)
}

/// Sets a socket's send buffer to `size` bytes. FORCE lifts the wmem_max cap but needs
/// CAP_NET_ADMIN; without it take what the cap allows rather than fail.
pub(crate) fn set_sndbuf(fd: &OwnedFd, ifname: &str, size: usize) -> Result<(), SendError> {
    let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    if let Err(e) = setsockopt(fd.as_fd(), libc::SOL_SOCKET, SO_SNDBUFFORCE, &size) {
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(SendError::sys(ifname, "setsockopt(SO_SNDBUFFORCE)", e));
        }
        setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &size)
            .map_err(|e| SendError::sys(ifname, "setsockopt(SO_SNDBUF)", e))?;
    }
    Ok(())
}

/// Binds `fd` to the interface, protocol 0: frames go out there, nothing comes in.
fn bind(fd: &OwnedFd, info: &IfInfo) -> Result<(), SendError> {
    afpacket::bind(fd.as_fd(), info.ifindex, 0)
        .map_err(|e| SendError::sys(&info.name, "bind(AF_PACKET)", e))
}

impl AfPacketSink {
    /// Opens send-only AF_PACKET sockets on `ifname` (of the calling thread's namespace).
    pub fn open(ifname: &str, opts: AfPacketOpts) -> Result<Self, SendError> {
        let info = if_info(ifname)?;
        let fd = new_socket(ifname, &opts)?;
        bind(&fd, &info)?;
        let ring = match opts.mode {
            TxMode::Sendmmsg => None,
            TxMode::Ring => {
                let rfd = new_socket(ifname, &opts)?;
                let ring = TxRing::new(&rfd, info.mtu, opts.batch.max(1))
                    .map_err(|(call, e)| SendError::sys(ifname, call, e))?;
                bind(&rfd, &info)?;
                Some((rfd, ring))
            }
        };

        let batch = opts.batch.clamp(1, 1024);
        let iovs = vec![
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            };
            batch
        ];
        // SAFETY: mmsghdr is plain old data; the iov pointers are set just below.
        let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; batch];
        for (h, iov) in hdrs.iter_mut().zip(&iovs) {
            // No msg_name: the socket's bound interface is the destination.
            h.msg_hdr.msg_iov = (iov as *const libc::iovec).cast_mut();
            h.msg_hdr.msg_iovlen = 1;
        }
        Ok(AfPacketSink {
            fd: ManuallyDrop::new(fd),
            ring,
            info,
            hdrs,
            iovs,
            counters: SendCounters::default(),
        })
    }

    /// How this sink hands frames to the kernel.
    pub fn mode(&self) -> TxMode {
        if self.ring.is_some() {
            TxMode::Ring
        } else {
            TxMode::Sendmmsg
        }
    }

    /// The interface this sink sends on.
    pub fn info(&self) -> &IfInfo {
        &self.info
    }
}

/// Sends one chunk of at most `batch` frames. On a fatal error returns it with the index of
/// the first frame not accounted for.
fn send_chunk(
    fd: &OwnedFd,
    hdrs: &mut [libc::mmsghdr],
    iovs: &mut [libc::iovec],
    counters: &mut SendCounters,
    chunk: &[Frame<'_>],
) -> Result<(), (usize, io::Error)> {
    let n = chunk.len();
    for ((iov, h), f) in iovs.iter_mut().zip(hdrs.iter_mut()).zip(chunk) {
        // The kernel only reads through this pointer (sendmmsg); *mut is the C signature.
        iov.iov_base = f.data.as_ptr().cast_mut().cast();
        iov.iov_len = f.data.len();
        h.msg_len = 0;
    }
    let mut i = 0;
    let mut stuck_since: Option<std::time::Instant> = None;
    while i < n {
        let pending = &mut hdrs[i..n];
        // SAFETY: `pending` holds n - i initialised headers whose iovecs point at frames
        // borrowed for this call.
        let rc = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                pending.as_mut_ptr(),
                pending.len() as libc::c_uint,
                0,
            )
        };
        if rc > 0 {
            let sent = rc as usize;
            for (h, f) in hdrs[i..i + sent].iter().zip(&chunk[i..i + sent]) {
                let len = h.msg_len as usize;
                if len < f.data.len() {
                    counters.truncated += 1;
                } else {
                    counters.successful += 1;
                }
                counters.bytes += len as u64;
            }
            i += sent;
            stuck_since = None;
            continue;
        }
        // sendmmsg reports an error only for the first message of the call, so the error
        // below is about chunk[i].
        let err = if rc == 0 {
            io::Error::from_raw_os_error(libc::EAGAIN)
        } else {
            io::Error::last_os_error()
        };
        match err.raw_os_error() {
            Some(libc::EINTR) => {}
            // Too big for the MTU, or shorter than a link-layer header: this frame only.
            Some(code @ (libc::EMSGSIZE | libc::EINVAL)) => {
                counters.failed += 1;
                if code == libc::EMSGSIZE {
                    counters.failed_too_big += 1;
                } else {
                    counters.failed_malformed += 1;
                }
                i += 1;
                stuck_since = None;
            }
            Some(code @ (libc::ENOBUFS | libc::EAGAIN)) => {
                let since = *stuck_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > STUCK_AFTER {
                    counters.failed += 1;
                    counters.failed_stuck += 1;
                    i += 1;
                    stuck_since = None;
                    continue;
                }
                if code == libc::ENOBUFS {
                    counters.retried_enobufs += 1;
                    std::thread::sleep(ENOBUFS_PAUSE);
                } else {
                    counters.retried_eagain += 1;
                    let mut pfd = libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one pollfd we own. A poll error just means we retry sooner.
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                }
            }
            _ => return Err((i, err)),
        }
    }
    Ok(())
}

impl Drop for AfPacketSink {
    /// Releasing a packet socket waits for an RCU grace period (`synchronize_net` in
    /// `packet_release`): 5–25 ms per socket measured on a busy 2-core VM, for the ring socket
    /// when its mapping goes. A caller that times its run up to the sink's drop would count
    /// that as sending time, so the sockets and the ring are released on a thread of their own.
    /// Every frame was handed to the kernel before this point; nothing is lost by the delay.
    fn drop(&mut self) {
        // SAFETY: `fd` is not used again: this is the sink's drop.
        let fd = unsafe { ManuallyDrop::take(&mut self.fd) };
        let ring = self.ring.take();
        // If no thread can be started, the closure is dropped here, releasing inline: slower,
        // never wrong.
        let _ = std::thread::Builder::new()
            .name("tcpkit-send-close".into())
            .spawn(move || drop((ring, fd)));
    }
}

impl AfPacketSink {
    fn send_ring(&mut self, frames: &[Frame<'_>]) -> Result<(), SendError> {
        let Some((rfd, ring)) = self.ring.as_mut() else {
            unreachable!("send_ring without a ring")
        };
        for (k, f) in frames.iter().enumerate() {
            let r = if ring.fits(f.data.len()) {
                ring.push(rfd, f.data, &mut self.counters)
                    .map_err(|(n, e)| (n, e, "send(PACKET_TX_RING)"))
            } else {
                // The kernel's verdict on this one, after everything before it left.
                match ring.kick(rfd, &mut self.counters) {
                    Err((n, e)) => Err((n + 1, e, "send(PACKET_TX_RING)")),
                    Ok(()) => {
                        let chunk = std::slice::from_ref(f);
                        let (hdrs, iovs) = (&mut self.hdrs, &mut self.iovs);
                        send_chunk(&self.fd, hdrs, iovs, &mut self.counters, chunk)
                            .map_err(|(i, e)| (1 - i, e, "sendmmsg"))
                    }
                }
            };
            if let Err((left, err, call)) = r {
                ring.abandon();
                self.counters.failed += (left + frames.len() - k - 1) as u64;
                return Err(SendError::sys(&self.info.name, call, err));
            }
        }
        if let Err((left, err)) = ring.kick(rfd, &mut self.counters) {
            ring.abandon();
            self.counters.failed += left as u64;
            return Err(SendError::sys(&self.info.name, "send(PACKET_TX_RING)", err));
        }
        debug_assert_eq!(ring.queued(), 0);
        Ok(())
    }
}

impl Sink for AfPacketSink {
    fn send_batch(&mut self, frames: &[Frame<'_>]) -> Result<(), SendError> {
        if self.ring.is_some() {
            return self.send_ring(frames);
        }
        let batch = self.hdrs.len();
        for (c, chunk) in frames.chunks(batch).enumerate() {
            let (hdrs, iovs) = (&mut self.hdrs, &mut self.iovs);
            if let Err((i, err)) = send_chunk(&self.fd, hdrs, iovs, &mut self.counters, chunk) {
                let done = c * batch + i;
                self.counters.failed += (frames.len() - done) as u64;
                return Err(SendError::sys(&self.info.name, "sendmmsg", err));
            }
        }
        Ok(())
    }

    fn counters(&self) -> SendCounters {
        self.counters
    }

    /// Nothing is buffered in user space: every frame was handed to the kernel.
    fn flush(&mut self) -> Result<(), SendError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testnet::{
        frame, lengths_at_the_edges, receive_the_edges, receiver, recv, topspeed, TestNet,
    };

    fn send_and_check(opts: AfPacketOpts) {
        let net = TestNet::new();
        let (a, b) = (net.a.clone(), net.b.clone());
        net.run_in(move || {
            let rx = receiver(&b);
            let mut sink = AfPacketSink::open(&a, opts).expect("open");
            let src = sink.info().mac.expect("veth mac");
            let dst = if_info(&b).expect("peer").mac.expect("peer mac");
            let before = crate::if_counters(&a).expect("counters");
            // 300 frames of varied sizes, up to a full 1514-byte frame.
            let frames: Vec<Vec<u8>> = (0..300u32)
                .map(|i| frame(dst, src, i, 60 + (i as usize * 37) % 1455))
                .collect();
            let refs: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
            for part in refs.chunks(100) {
                sink.send_batch(part).expect("send");
            }
            let c = sink.counters();
            assert_eq!(c.successful, 300);
            assert_eq!(c.failed + c.truncated, 0);
            let total: u64 = frames.iter().map(|f| f.len() as u64).sum();
            assert_eq!(c.bytes, total);

            let mut buf = vec![0u8; 2048];
            for (i, f) in frames.iter().enumerate() {
                let n = recv(&rx, &mut buf).unwrap_or_else(|| panic!("frame {i} never arrived"));
                assert_eq!(&buf[..n], &f[..], "frame {i} differs or is out of order");
            }
            // The kernel may add a frame or two of its own on a fresh link (IPv6 router
            // solicitation, MLD): the interface counts at least ours, and not many more.
            let after = crate::if_counters(&a).expect("counters");
            let sent = after.tx_packets - before.tx_packets;
            assert!(
                (300..=304).contains(&sent),
                "interface sent {sent} frames for our 300"
            );
            assert!(after.tx_bytes - before.tx_bytes >= total);
        });
    }

    #[test]
    fn frames_arrive_byte_identical_and_in_order() {
        for mode in [TxMode::Ring, TxMode::Sendmmsg] {
            send_and_check(AfPacketOpts {
                mode,
                batch: 16,
                ..AfPacketOpts::default()
            });
        }
    }

    #[test]
    fn qdisc_bypass_batch_one_and_sndbuf() {
        for mode in [TxMode::Ring, TxMode::Sendmmsg] {
            send_and_check(AfPacketOpts {
                mode,
                qdisc_bypass: true,
                batch: 1,
                sndbuf: Some(4 << 20),
            });
        }
    }

    /// The ring wraps many times, with batches that do not divide its size, and a small send
    /// buffer so that the kernel runs out of room (EAGAIN) while slots are in flight.
    #[test]
    fn ring_wraps_and_keeps_order_under_a_small_sndbuf() {
        let net = TestNet::new();
        let (a, b) = (net.a.clone(), net.b.clone());
        net.run_in(move || {
            let rx = receiver(&b);
            let opts = AfPacketOpts {
                mode: TxMode::Ring,
                batch: 37,
                sndbuf: Some(16 << 10),
                ..AfPacketOpts::default()
            };
            let mut sink = AfPacketSink::open(&a, opts).expect("open");
            assert_eq!(sink.mode(), TxMode::Ring);
            let src = sink.info().mac.expect("mac");
            let dst = if_info(&b).expect("peer").mac.expect("peer mac");
            let frames: Vec<Vec<u8>> = (0..5000u32)
                .map(|i| frame(dst, src, i, 60 + (i as usize * 101) % 1455))
                .collect();
            let refs: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
            let mut buf = vec![0u8; 2048];
            let mut next = 0;
            // Receive as we go so the receiver's buffer never overflows.
            for part in refs.chunks(250) {
                sink.send_batch(part).expect("send");
                for f in &frames[next..next + part.len()] {
                    let n = recv(&rx, &mut buf).unwrap_or_else(|| panic!("frame {next} lost"));
                    assert_eq!(&buf[..n], &f[..], "frame {next} differs or is out of order");
                    next += 1;
                }
            }
            let c = sink.counters();
            assert_eq!((c.successful, c.failed, c.truncated), (5000, 0, 0));
            let total: u64 = frames.iter().map(|f| f.len() as u64).sum();
            assert_eq!(c.bytes, total);
        });
    }

    #[test]
    fn oversize_frames_count_as_failed_and_the_rest_go_on() {
        for mode in [TxMode::Ring, TxMode::Sendmmsg] {
            oversize_frames(mode);
        }
    }

    /// In ring mode the oversize and runt frames take the plain socket: the order still holds.
    fn oversize_frames(mode: TxMode) {
        let net = TestNet::new();
        let (a, b) = (net.a.clone(), net.b.clone());
        net.run_in(move || {
            let rx = receiver(&b);
            let opts = AfPacketOpts {
                mode,
                ..AfPacketOpts::default()
            };
            let mut sink = AfPacketSink::open(&a, opts).expect("open");
            let src = sink.info().mac.expect("mac");
            let frames = lengths_at_the_edges(src, sink.info().mtu as usize);
            let refs: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
            sink.send_batch(&refs).expect("send");
            let c = sink.counters();
            assert_eq!((c.successful, c.failed, c.truncated), (4, 3, 0), "{mode:?}");
            // Each failure is told by its errno: two too big, one too short.
            assert_eq!(
                (c.failed_too_big, c.failed_malformed, c.failed_stuck),
                (2, 1, 0),
                "{mode:?}"
            );
            receive_the_edges(&rx, &frames);
        });
    }

    #[test]
    fn missing_interface() {
        let e = AfPacketSink::open("tknosuch0", AfPacketOpts::default()).map(|_| ());
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("tknosuch0: no such network interface".into())
        );
    }

    /// Capabilities are per thread: drop CAP_NET_RAW from this thread's effective set and the
    /// socket call fails with EPERM, reported with the hint.
    #[test]
    fn eperm_without_cap_net_raw() {
        #[repr(C)]
        struct CapHeader {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct CapData {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const CAP_V3: u32 = 0x2008_0522;
        const CAP_NET_RAW: u32 = 13;
        let out = std::thread::spawn(|| {
            let mut hdr = CapHeader {
                version: CAP_V3,
                pid: 0,
            };
            let mut data = [CapData::default(); 2];
            // SAFETY: capget/capset with a v3 header and two data structs, for this thread.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()),
                    0
                );
                data[0].effective &= !(1 << CAP_NET_RAW);
                assert_eq!(libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()), 0);
            }
            AfPacketSink::open("lo", AfPacketOpts::default())
                .map(|_| ())
                .map_err(|e| (e.to_string(), e.raw_os_error()))
        })
        .join()
        .expect("thread");
        assert_eq!(
            out,
            Err((
                "lo: socket(AF_PACKET) (needs root or CAP_NET_RAW)".to_string(),
                Some(libc::EPERM)
            ))
        );
    }

    /// Top speed with 64-byte frames on a veth pair (nobody listening on the peer). Run with
    /// `cargo test -p tcpkit-send --release -- --ignored --nocapture topspeed`.
    #[test]
    #[ignore = "benchmark: prints numbers"]
    fn topspeed_veth_64_byte_frames() {
        let net = TestNet::new();
        let (a, b) = (net.a.clone(), net.b.clone());
        net.run_in(move || {
            let dst = if_info(&b).expect("peer").mac.expect("mac");
            for (mode, bypass) in [
                (TxMode::Sendmmsg, false),
                (TxMode::Sendmmsg, true),
                (TxMode::Ring, false),
                (TxMode::Ring, true),
            ] {
                for batch in [1usize, 32, 64, 256] {
                    let opts = AfPacketOpts {
                        mode,
                        qdisc_bypass: bypass,
                        batch,
                        sndbuf: None,
                    };
                    let mut sink = AfPacketSink::open(&a, opts).expect("open");
                    let src = sink.info().mac.expect("mac");
                    let (pps, cpu) = topspeed(&mut sink, dst, src);
                    let c = sink.counters();
                    println!(
                        "{mode:?} qdisc_bypass {bypass:5} batch {batch:3}: {pps:>9.0} pps, {cpu:>5.0} ns CPU/frame (failed {}, enobufs retries {})",
                        c.failed, c.retried_enobufs
                    );
                }
            }
        });
    }
}
