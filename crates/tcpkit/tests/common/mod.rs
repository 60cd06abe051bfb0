//! Shared by the binary's integration tests: the binary under test, a quiet replay lab, and
//! reading captures back. Every test that touches the network builds its own lab.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod mpcat;
pub mod nft;
pub mod peer;
pub mod schema;
pub mod sock;
pub mod unbound;

use tcpkit_lab::{Host, Lab, Link, LinkOpts};

/// The binary cargo built for these tests (in the suite profile under scripts/test.sh).
pub fn tcpkit() -> &'static str {
    env!("CARGO_BIN_EXE_tcpkit")
}

/// The arguments that make this test binary run only the helper-process test `test` of
/// `module` (the caller's `module_path!()`), printing as it goes. Helper processes are
/// `#[ignore]`d, so a plain run lists them as ignored instead of passing them without their
/// parent; libtest names a test by its module path without the crate's name, and one thread
/// keeps the helper's output in order.
pub fn helper_args(module: &str, test: &str) -> Vec<String> {
    let module = module.split_once("::").map_or("", |(_, m)| m);
    [
        "--ignored".to_string(),
        "--exact".into(),
        format!("{module}::{test}"),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
    .into()
}

/// What a helper process's parent test put in `var`: a helper run any other way (say, by
/// `--include-ignored`) fails rather than passing without having done anything.
pub fn helper_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("helper process: runs only under its parent test, which sets {var}")
    })
}

/// Timing tests take turns: two paced senders and their receivers sharing two cores would
/// measure each other. One lock for the whole test binary, since replay's and load's timing
/// tests now run in one process side by side.
pub fn timing_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

/// A sender and a receiver on one veth link with no addresses and IPv6 off on both ends, so
/// the kernels add nothing of their own to what the receiver captures.
pub struct ReplayLab {
    pub lab: Lab,
    pub tx: Host,
    pub rx: Host,
    pub link: Link,
}

impl ReplayLab {
    /// MTU 9000, so captures taken with offloads on (frames above 1514 bytes) fit.
    pub fn new(tag: &str) -> ReplayLab {
        Self::with_opts(
            tag,
            LinkOpts {
                mtu: Some(9000),
                ..LinkOpts::default()
            },
        )
    }

    pub fn with_opts(tag: &str, opts: LinkOpts) -> ReplayLab {
        let mut lab = Lab::new(tag).unwrap_or_else(|e| panic!("{e}"));
        let tx = lab.host("tx").expect("host tx");
        let rx = lab.host("rx").expect("host rx");
        let link = lab.link(&tx, &rx, &opts).expect("link");
        for (h, i) in [(&tx, &link.a.name), (&rx, &link.b.name)] {
            h.run(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{i}.disable_ipv6=1"),
            ])
            .expect("sysctl");
        }
        ReplayLab { lab, tx, rx, link }
    }

    /// `tcpkit replay -i <tx end> ARGS...` inside the sender.
    pub fn replay(&self, args: &[&str]) -> Output {
        let mut argv = vec![tcpkit(), "replay", "-i", &self.link.a.name];
        argv.extend_from_slice(args);
        self.tx.command(&argv).output().expect("run tcpkit")
    }

    /// Runs `f` while tcpdump records what arrives at the receiver; returns the frames.
    pub fn capture<T>(&mut self, f: impl FnOnce(&ReplayLab) -> T) -> (T, Vec<Frame>) {
        // No filter: the receiver has no address and IPv6 off, so it sends nothing of its own,
        // and libpcap's `inbound` filter loses the first packet after it is attached.
        let dump = self
            .lab
            .tcpdump(&self.rx, &self.link.b.name.clone(), "")
            .expect("tcpdump");
        let t = f(self);
        // Frames are on the wire when the sender returns; give the capture a moment to write.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let cap = dump.stop().expect("stop tcpdump");
        assert_eq!(
            cap.dropped_by_kernel, 0,
            "tcpdump dropped packets: the comparison would be wrong"
        );
        (t, read_frames(&cap.path))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ts_ns: u64,
    pub data: Vec<u8>,
    pub linktype: u32,
}

pub fn read_frames(path: &Path) -> Vec<Frame> {
    let f = tcpkit_pcap::CaptureFile::open(path).unwrap_or_else(|e| panic!("{e}"));
    f.packets()
        .map(|p| {
            let p = p.unwrap_or_else(|e| panic!("{e}"));
            Frame {
                ts_ns: p.ts_ns,
                data: p.data.to_vec(),
                linktype: p.linktype,
            }
        })
        .collect()
}

/// Writes an Ethernet pcap of `frames` with nanosecond timestamps.
pub fn write_pcap(path: &Path, linktype: u32, frames: &[(u64, Vec<u8>)]) {
    let mut w = tcpkit_pcap::PcapWriter::create(path, linktype, 65535, true).expect("create pcap");
    for (ts, d) in frames {
        w.write_packet(*ts, d, d.len() as u32).expect("write");
    }
    w.finish().expect("finish");
}

/// A UDP/IPv4 Ethernet frame of `len` bytes (≥ 42) with a valid IPv4 header checksum; `n`
/// is written into the payload and the source port so frames are distinguishable.
pub fn udp_frame(n: u32, len: usize, src_ip: [u8; 4], dst_ip: [u8; 4]) -> Vec<u8> {
    assert!(len >= 42);
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (len - 14) as u16;
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src_ip);
    ip[16..20].copy_from_slice(&dst_ip);
    let mut sum: u32 = 0;
    for c in ip.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let udp_len = (len - 34) as u16;
    f[34..36].copy_from_slice(&((1024 + (n % 60000)) as u16).to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&udp_len.to_be_bytes());
    // UDP checksum 0 = none (valid for IPv4).
    for (i, b) in f[42..].iter_mut().enumerate() {
        *b = (n as u8).wrapping_add(i as u8);
    }
    if len >= 46 {
        f[42..46].copy_from_slice(&n.to_be_bytes());
    }
    f
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A usage error as the exit rule has it (README): exit 2 and one line on stderr, which holds
/// every one of `want`; that line.
pub fn usage_line(o: &Output, want: &[&str]) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for w in want {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
    err
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs the binary outside any namespace (for -w and argument errors).
pub fn run(args: &[&str]) -> Output {
    Command::new(tcpkit())
        .args(args)
        .output()
        .expect("run tcpkit")
}
