//! tcpkit-tlsprobe: what a TLS server's own library knows, read live by BPF uprobes without
//! touching the server: each handshake's secrets (the secrets mode, OpenSSL of a known
//! layout) or every call's plaintext (the per-call mode: OpenSSL 1.1/3.x, BoringSSL where the
//! symbols exist).
//!
//! - bpf/tlsprobe.bpf.c: uprobes on SSL_read/SSL_write/SSL_read_ex/SSL_write_ex (entry and
//!   return) and SSL_free, and raw tracepoints on the kernel's sock_recv_length /
//!   sock_send_length that tie each SSL object to the socket its calls read and write (why
//!   that way: the program's opening comment). Compiled by clang in build.rs.
//! - bpf/tlsprobe.bpf.c's second half: a uprobe and uretprobe on SSL_do_handshake reading the
//!   SSL object at the offsets of [`layout`] (its table by OpenSSL version) when a handshake
//!   completes: one [`secret`] record per handshake, on a ring of its own.
//! - [`record`]: the ring buffer's records, parsed with every length bounded.
//! - [`Probes`]: the object loaded by aya and attached by path through the kernel's perf
//!   uprobe PMU (no tracefs), to every process mapping the file (those started later too) or
//!   to one. The links are file descriptors of this process: when it ends, SIGKILL included,
//!   the kernel removes every probe. [`SecretProbes`]: the same for the secrets mode.

pub mod layout;
pub mod record;
pub mod secret;

use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::UProbeScope;
use aya::programs::{RawTracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};

pub use record::{Kind, Record, RecordError, CHUNK};
pub use secret::{SecretError, Secrets, TlsVersion};

static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tlsprobe.bpf.o"));

const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The calls probed: (symbol, entry program, required). The return of each goes to
/// `tk_ssl_leave`. SSL_read and SSL_write are what makes a file a TLS library; the `_ex`
/// forms exist from OpenSSL 1.1.1 on, not in every BoringSSL.
/// SSL_do_handshake (SSL_accept and SSL_connect call it) ties a connection from its start.
const CALLS: [(&str, &str, bool); 5] = [
    ("SSL_read", "tk_ssl_read_enter", true),
    ("SSL_write", "tk_ssl_write_enter", true),
    ("SSL_read_ex", "tk_ssl_read_enter_ex", false),
    ("SSL_write_ex", "tk_ssl_write_enter_ex", false),
    ("SSL_do_handshake", "tk_ssl_handshake_enter", false),
];

/// Why the probes could not be set.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "--tls-uprobe needs CAP_BPF and CAP_PERFMON (or root) to load and attach BPF programs"
    )]
    Permission,
    #[error("loading the BPF programs: {0} (needs CAP_BPF and CAP_PERFMON, or root)")]
    Load(#[source] aya::EbpfError),
    #[error("BPF program or map {0} missing from the object")]
    Missing(&'static str),
    #[error("BPF program {0}: {1}")]
    Program(&'static str, #[source] aya::programs::ProgramError),
    #[error("BPF map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    #[error("{}: {what}", path.display())]
    Target { path: PathBuf, what: String },
    /// The secrets mode: the library's version has no known layout (or none was found).
    #[error("{}: {what}", path.display())]
    Layout { path: PathBuf, what: String },
}

/// The probes attached, their ring buffer and counters. Dropping it (or this process ending)
/// detaches them all.
pub struct Probes {
    // Held for its links and maps; the ring and counters are taken out of it.
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    targets: Vec<PathBuf>,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

/// What the programs counted, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Records the ring buffer had no room for.
    pub lost_records: u64,
    /// Calls of SSL objects not tied to a socket when they moved bytes (their bytes are not
    /// copied).
    pub unmatched_calls: u64,
    /// Bytes of one call beyond the records one call is split into.
    pub lost_bytes: u64,
    /// Bytes the programs could not read from the process.
    pub unreadable_bytes: u64,
}

fn attach_err(path: &Path, e: &aya::programs::ProgramError) -> ProbeError {
    ProbeError::Target {
        path: path.to_path_buf(),
        what: chain(e),
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Whether `e` says the symbol is not in the file (rather than the attach failing).
fn no_symbol(e: &aya::programs::ProgramError) -> bool {
    matches!(
        e,
        aya::programs::ProgramError::UProbeError(
            aya::programs::uprobe::UProbeError::SymbolError { .. }
        )
    )
}

impl Probes {
    /// Loads the programs and attaches them to each file of `targets` (a libssl.so.* or a
    /// binary with the symbols), in every process mapping it (those started later too) or,
    /// with `pid`, in that process only.
    pub fn attach(targets: &[PathBuf], pid: Option<u32>) -> Result<Probes, ProbeError> {
        let mut ebpf = load(targets, &record::RawLayout::default())?;
        let scope = scope(pid);
        for (name, tp) in [
            ("tk_sock_recv", "sock_recv_length"),
            ("tk_sock_send", "sock_send_length"),
        ] {
            let p: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or(ProbeError::Missing("raw tracepoint"))?
                .try_into()
                .map_err(|e| ProbeError::Program("raw tracepoint", e))?;
            p.load()
                .map_err(|e| ProbeError::Program("raw tracepoint", e))?;
            p.attach(tp)
                .map_err(|e| ProbeError::Program("raw tracepoint", e))?;
        }
        let names = [
            "tk_ssl_read_enter",
            "tk_ssl_write_enter",
            "tk_ssl_read_enter_ex",
            "tk_ssl_write_enter_ex",
            "tk_ssl_handshake_enter",
            "tk_ssl_leave",
            "tk_ssl_free",
        ];
        for n in names {
            let p: &mut UProbe = ebpf
                .program_mut(n)
                .ok_or(ProbeError::Missing("uprobe"))?
                .try_into()
                .map_err(|e| ProbeError::Program("uprobe", e))?;
            p.load().map_err(|e| ProbeError::Program("uprobe", e))?;
        }
        for t in targets {
            for (sym, entry, required) in CALLS {
                let p: &mut UProbe = ebpf
                    .program_mut(entry)
                    .ok_or(ProbeError::Missing("uprobe"))?
                    .try_into()
                    .map_err(|e| ProbeError::Program("uprobe", e))?;
                match p.attach(sym, t, scope) {
                    Ok(_) => {}
                    Err(e) if no_symbol(&e) && !required => continue,
                    Err(e) if no_symbol(&e) => {
                        return Err(ProbeError::Target {
                            path: t.clone(),
                            what: format!(
                                "no {sym} symbol: not a TLS library (give libssl.so.* or a binary with OpenSSL or BoringSSL linked in, e.g. /usr/lib/x86_64-linux-gnu/libssl.so.3)"
                            ),
                        })
                    }
                    Err(e) => return Err(attach_err(t, &e)),
                }
                let leave: &mut UProbe = ebpf
                    .program_mut("tk_ssl_leave")
                    .ok_or(ProbeError::Missing("uretprobe"))?
                    .try_into()
                    .map_err(|e| ProbeError::Program("uretprobe", e))?;
                leave.attach(sym, t, scope).map_err(|e| attach_err(t, &e))?;
            }
            let free: &mut UProbe = ebpf
                .program_mut("tk_ssl_free")
                .ok_or(ProbeError::Missing("uprobe"))?
                .try_into()
                .map_err(|e| ProbeError::Program("uprobe", e))?;
            match free.attach("SSL_free", t, scope) {
                Ok(_) => {}
                // Without it a connection ends when its process does (the caller's check).
                Err(e) if no_symbol(&e) => {}
                Err(e) => return Err(attach_err(t, &e)),
            }
        }
        let ring = RingBuf::try_from(
            ebpf.take_map("records")
                .ok_or(ProbeError::Missing("records"))?,
        )
        .map_err(|e| ProbeError::Map("records", e))?;
        let counters = PerCpuArray::try_from(
            ebpf.take_map("counters")
                .ok_or(ProbeError::Missing("counters"))?,
        )
        .map_err(|e| ProbeError::Map("counters", e))?;
        Ok(Probes {
            _ebpf: ebpf,
            ring,
            counters,
            targets: targets.to_vec(),
        })
    }

    /// The files probed.
    pub fn targets(&self) -> &[PathBuf] {
        &self.targets
    }

    /// Hands at most `max` records waiting in the ring to `f` (or why one did not parse);
    /// returns how many items were taken.
    pub fn drain(
        &mut self,
        max: usize,
        mut f: impl FnMut(Result<Record<'_>, RecordError>),
    ) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else { break };
            n += 1;
            f(Record::parse(&item));
        }
        n
    }

    /// What the programs counted so far.
    pub fn counters(&self) -> Counters {
        let sum = |i: u32| sum_counter(&self.counters, i);
        debug_assert_eq!(record::COUNTERS, 4);
        Counters {
            lost_records: sum(record::COUNTER_LOST_RECORDS),
            unmatched_calls: sum(record::COUNTER_UNMATCHED),
            lost_bytes: sum(record::COUNTER_LOST_BYTES),
            unreadable_bytes: sum(record::COUNTER_LOST_CHUNKS),
        }
    }
}

/// The ring buffer's descriptor: readable when records wait (for the caller's epoll).
impl AsRawFd for Probes {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

/// The capabilities and the targets checked, the object loaded with `layout` set.
fn load(targets: &[PathBuf], layout: &record::RawLayout) -> Result<Ebpf, ProbeError> {
    for cap in [CAP_BPF, CAP_PERFMON] {
        if tcpkit_host_cap(cap) == Some(false) {
            return Err(ProbeError::Permission);
        }
    }
    for t in targets {
        std::fs::File::open(t).map_err(|e| ProbeError::Target {
            path: t.clone(),
            what: format!("cannot open: {e}"),
        })?;
    }
    EbpfLoader::new()
        .override_global("LAYOUT", layout, true)
        .load(OBJECT)
        .map_err(|e| match &e {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EPERM) =>
            {
                ProbeError::Permission
            }
            _ => ProbeError::Load(e),
        })
}

fn scope(pid: Option<u32>) -> UProbeScope {
    match pid.and_then(std::num::NonZeroU32::new) {
        Some(p) => UProbeScope::OneProcess(p),
        None => UProbeScope::AllProcesses,
    }
}

// SAFETY: RawLayout is #[repr(C)] u32s only (bindgen's, padding-free: -Wpadded), so its bytes
// are what the program's LAYOUT global holds.
unsafe impl aya::Pod for record::RawLayout {}

/// The secrets mode's probes: a uprobe and a uretprobe on SSL_do_handshake, one ring record
/// per completed handshake (its secrets). No probe on SSL_read/SSL_write: a request on an
/// open connection costs the server nothing. Dropping it (or this process ending) detaches
/// them.
pub struct SecretProbes {
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    targets: Vec<PathBuf>,
    /// The library's release, and where its layout comes from.
    pub release: layout::Release,
    pub layout_source: &'static str,
}

impl std::fmt::Debug for SecretProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretProbes")
            .field("targets", &self.targets)
            .field("release", &self.release)
            .finish_non_exhaustive()
    }
}

/// Each target's release and layout; they must agree (one layout serves the programs).
pub fn layout_of(
    targets: &[PathBuf],
) -> Result<(layout::Release, record::RawLayout, &'static str), ProbeError> {
    let mut found: Option<(layout::Release, record::RawLayout, &'static str)> = None;
    for t in targets {
        let (r, l, src) = layout::for_library(t).map_err(|what| ProbeError::Layout {
            path: t.clone(),
            what,
        })?;
        if let Some((r0, l0, _)) = &found {
            if l0.session != l.session {
                return Err(ProbeError::Layout {
                    path: t.clone(),
                    what: format!(
                        "OpenSSL {}.{}.{} beside {}.{}.{}: one run probes one layout (run a copy per library)",
                        r.0, r.1, r.2, r0.0, r0.1, r0.2
                    ),
                });
            }
        }
        found = Some((r, l, src));
    }
    found.ok_or(ProbeError::Missing("target"))
}

impl SecretProbes {
    /// Loads the programs with the layout of `targets`' OpenSSL version and attaches the
    /// handshake probes to each (in every process mapping it, or only `pid`).
    pub fn attach(targets: &[PathBuf], pid: Option<u32>) -> Result<SecretProbes, ProbeError> {
        let (release, layout, layout_source) = layout_of(targets)?;
        let mut ebpf = load(targets, &layout)?;
        let scope = scope(pid);
        for (n, what) in [("tk_hs_enter", "uprobe"), ("tk_hs_leave", "uretprobe")] {
            let p: &mut UProbe = ebpf
                .program_mut(n)
                .ok_or(ProbeError::Missing(what))?
                .try_into()
                .map_err(|e| ProbeError::Program(what, e))?;
            p.load().map_err(|e| ProbeError::Program(what, e))?;
            for t in targets {
                match p.attach("SSL_do_handshake", t, scope) {
                    Ok(_) => {}
                    Err(e) if no_symbol(&e) => {
                        return Err(ProbeError::Target {
                            path: t.clone(),
                            what: "no SSL_do_handshake symbol: not a TLS library (give libssl.so.* or a binary with OpenSSL linked in, e.g. /usr/lib/x86_64-linux-gnu/libssl.so.3)".into(),
                        })
                    }
                    Err(e) => return Err(attach_err(t, &e)),
                }
            }
        }
        let ring = RingBuf::try_from(
            ebpf.take_map("secrets")
                .ok_or(ProbeError::Missing("secrets"))?,
        )
        .map_err(|e| ProbeError::Map("secrets", e))?;
        let counters = PerCpuArray::try_from(
            ebpf.take_map("counters")
                .ok_or(ProbeError::Missing("counters"))?,
        )
        .map_err(|e| ProbeError::Map("counters", e))?;
        Ok(SecretProbes {
            _ebpf: ebpf,
            ring,
            counters,
            targets: targets.to_vec(),
            release,
            layout_source,
        })
    }

    /// The files probed.
    pub fn targets(&self) -> &[PathBuf] {
        &self.targets
    }

    /// Hands at most `max` handshakes waiting in the ring to `f` (or why one did not parse);
    /// returns how many were taken.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(Result<Secrets, SecretError>)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else { break };
            n += 1;
            f(Secrets::parse(&item));
        }
        n
    }

    /// Handshake records the ring had no room for.
    pub fn lost_records(&self) -> u64 {
        sum_counter(&self.counters, record::COUNTER_LOST_RECORDS)
    }
}

fn sum_counter(c: &PerCpuArray<MapData, u64>, i: u32) -> u64 {
    c.get(&i, 0)
        .map(|v| v.iter().copied().fold(0u64, u64::wrapping_add))
        .unwrap_or(0)
}

fn tcpkit_host_cap(cap: u32) -> Option<bool> {
    tcpkit_host::has_capability(cap)
}

/// CLOCK_REALTIME less CLOCK_MONOTONIC now, in nanoseconds: added to a record's monotonic
/// time, its wall-clock time.
pub fn mono_to_realtime_ns() -> i128 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec we own.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
    };
    read(libc::CLOCK_REALTIME) - read(libc::CLOCK_MONOTONIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The secrets programs pass the verifier and attach to Debian's libssl3 (root, as the
    /// lab tests run); an unknown library is refused by name before anything loads.
    #[test]
    fn secret_probes_attach_to_libssl_and_refuse_a_library_without_a_layout() {
        let lib = PathBuf::from("/usr/lib/x86_64-linux-gnu/libssl.so.3");
        let p = SecretProbes::attach(std::slice::from_ref(&lib), None).unwrap();
        assert_eq!((p.release.0, p.release.1), (3, 0));
        let e = SecretProbes::attach(&[PathBuf::from("/bin/true")], None).unwrap_err();
        assert!(matches!(e, ProbeError::Layout { .. }), "{e}");
    }
}
