//! Test-only: a network namespace holding one veth pair, deleted on drop (even after a panic),
//! and a way to run code on a thread inside it. tcpkit-lab will own this for the workspace;
//! this crate keeps a minimal copy so its tests do not wait for it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;

use tcpkit_kernel::afpacket::setsockopt;

use crate::{if_info, Frame, Sink};
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub(crate) struct TestNet {
    pub ns: String,
    /// Both ends of the veth pair, up, inside `ns`.
    pub a: String,
    pub b: String,
}

impl TestNet {
    pub fn new() -> TestNet {
        TestNet::with_queues(1)
    }

    /// A pair whose ends have `queues` transmit and receive queues each.
    pub fn with_queues(queues: u32) -> TestNet {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let net = TestNet {
            ns: format!("tkps{pid}-{n}"),
            a: format!("tka{n}"),
            b: format!("tkb{n}"),
        };
        run(&["ip", "netns", "add", &net.ns]);
        let q = queues.to_string();
        net.ip(&[
            "link",
            "add",
            &net.a,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            &net.b,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ]);
        for dev in [&net.a, &net.b, "lo"] {
            net.ip(&["link", "set", dev, "up"]);
        }
        net
    }

    /// `ip -n <ns> args...`, panicking with the command's stderr on failure.
    pub fn ip(&self, args: &[&str]) {
        ip_in(&self.ns, args);
    }

    /// Runs `f` on a new thread that has entered the namespace; panics in `f` propagate.
    pub fn run_in<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let path = format!("/run/netns/{}", self.ns);
        let handle = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns({path}): {e}"));
            f()
        });
        handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair in it.
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.ns])
            .status();
    }
}

/// `ip -n <ns> args...` (for a thread inside `ns`, where the TestNet is out of reach).
pub(crate) fn ip_in(ns: &str, args: &[&str]) {
    let mut all = vec!["ip", "-n", ns];
    all.extend_from_slice(args);
    run(&all);
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (these tests need iproute2)", args[0]));
    assert!(
        out.status.success(),
        "{} failed (these tests need root): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// IEEE 802 local experimental ethertype: nothing else on the link uses it.
pub(crate) const ETHERTYPE: u16 = 0x88b5;

pub(crate) fn frame(dst: [u8; 6], src: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0xa5u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    f
}

/// An AF_PACKET socket receiving only our ethertype on `ifname`.
pub(crate) fn receiver(ifname: &str) -> OwnedFd {
    let info = if_info(ifname).expect("receiver interface");
    let proto = ETHERTYPE.to_be();
    // SAFETY: socket/setsockopt/bind with values we own.
    unsafe {
        let raw = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, libc::c_int::from(proto));
        assert!(raw >= 0, "receiver socket: {}", io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(raw);
        let size: libc::c_int = 8 << 20;
        setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &size).expect("rcvbuf");
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as libc::c_ushort;
        sll.sll_protocol = proto;
        sll.sll_ifindex = info.ifindex as libc::c_int;
        let rc = libc::bind(
            raw,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        );
        assert_eq!(rc, 0, "receiver bind: {}", io::Error::last_os_error());
        fd
    }
}

pub(crate) fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: receives into a buffer we own.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(n).ok()
}

/// Sends 64-byte frames from `src` to `dst` through `sink` as fast as it takes them for one
/// second (then flushes): frames per second, and CPU ns per frame of the calling thread. CPU
/// per frame is the figure to compare on a busy machine: wall-clock pps also measures what
/// else ran on the core.
pub(crate) fn topspeed(sink: &mut dyn Sink, dst: [u8; 6], src: [u8; 6]) -> (f64, f64) {
    let frames: Vec<Vec<u8>> = (0..1024u32).map(|i| frame(dst, src, i, 64)).collect();
    let refs: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
    let start = std::time::Instant::now();
    let cpu0 = thread_cpu_ns();
    while start.elapsed() < std::time::Duration::from_secs(1) {
        sink.send_batch(&refs).expect("send");
    }
    sink.flush().expect("flush");
    let secs = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_ns() - cpu0;
    let ok = sink.counters().successful;
    (ok as f64 / secs, cpu as f64 / ok.max(1) as f64)
}

/// CPU time of the calling thread (user + system), in ns.
fn thread_cpu_ns() -> u64 {
    // SAFETY: timespec is plain integers, for which all zero bytes is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes one timespec, which we own and lend for the call only.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Frames around the kernel's length limits, to broadcast from `src` on an interface of MTU
/// `mtu`: 0, 2, 4 and 6 go out; 1 and 3 are too long (MTU + 15 bytes, 9000), 5 is shorter
/// than an Ethernet header.
pub(crate) fn lengths_at_the_edges(src: [u8; 6], mtu: usize) -> Vec<Vec<u8>> {
    let dst = [0xff; 6];
    vec![
        frame(dst, src, 0, 64),
        frame(dst, src, 1, mtu + 15), // one byte over MTU + Ethernet header
        frame(dst, src, 2, mtu + 14),
        frame(dst, src, 3, 9000),
        frame(dst, src, 4, 64),
        frame(dst, src, 5, 64)[..13].to_vec(), // shorter than an Ethernet header
        frame(dst, src, 6, 64),
    ]
}

/// Receives the frames of [`lengths_at_the_edges`] that go out, byte for byte, in order.
pub(crate) fn receive_the_edges(rx: &OwnedFd, frames: &[Vec<u8>]) {
    let mut buf = vec![0u8; 10000];
    for i in [0, 2, 4, 6] {
        let n = recv(rx, &mut buf).expect("frame");
        assert_eq!(&buf[..n], &frames[i][..], "frame {i}");
    }
}
