//! The BPF side: loads the clang-built object (bpf/balance.bpf.c), fills its maps from the
//! checked services, attaches the programs to one cgroup with bpf_link, and reads the
//! counters back. The links are file descriptors of this process: they die with it.

use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;

use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::cgroup_sock::CgroupSockLinkId;
use aya::programs::cgroup_sock_addr::CgroupSockAddrLinkId;
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSock, CgroupSockAddr};
use aya::{Ebpf, EbpfLoader};

use crate::bpf::{
    Active, Backend, PersistKey, PersistVal, Revnat, SockTag, Svc, SvcKey, ALGO_LC,
    ALGO_MAGLEV_CLIENT, ALGO_MAGLEV_COOKIE, ALGO_MAGLEV_HOST, ALGO_RANDOM, ALGO_ROUND_ROBIN,
    ALGO_WEIGHTED, ALGO_WLC, ALGO_WRR, COUNTER_REFUSED, COUNTER_REVNAT, COUNTER_STALE,
    COUNTER_TRACE_LOST, COUNTER_TRANSLATED, COUNTER_UNTAGGED, GENERATIONS, MAX_BACKENDS,
    MAX_SERVICES, MAX_SOCKETS, RING_SIZE, VIP_PORT_WORDS,
};
use crate::config::{Algorithm, HashKey, Service};
use crate::table;

#[path = "adopt.rs"]
mod adopt;
pub use adopt::{pinned_prog_ids, Adopted};

static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/balance.bpf.o"));

/// The programs, by the names they have in the object and in `bpftool prog`.
pub const PROGRAMS: [&str; 9] = [
    "tk_connect4",
    "tk_connect6",
    "tk_getpeername4",
    "tk_getpeername6",
    "tk_sendmsg4",
    "tk_recvmsg4",
    "tk_sendmsg6",
    "tk_recvmsg6",
    RELEASE,
];

/// The one program that is not a socket-address hook (cgroup/sock_release, a cgroup_sock
/// program): counts a closed socket off its backend's active sockets.
const RELEASE: &str = "tk_sock_release";

/// The hooks every balancer attaches: TCP and connected UDP go through connect, getpeername
/// shows the VIP, and sock_release keeps the active counts.
const ALWAYS: [&str; 5] = [
    "tk_connect4",
    "tk_connect6",
    "tk_getpeername4",
    "tk_getpeername6",
    RELEASE,
];

/// An attached program's link, of either program type.
#[derive(Debug)]
enum LinkId {
    Addr(CgroupSockAddrLinkId),
    Sock(CgroupSockLinkId),
}

/// Attached only while a service balances UDP: they run on every datagram sent and received
/// in the cgroup (DNS lookups included), so a TCP-only configuration leaves them off.
const UDP_ONLY: [&str; 4] = ["tk_sendmsg4", "tk_recvmsg4", "tk_sendmsg6", "tk_recvmsg6"];

/// The reverse map's slots as the kernel holds them (the map is BPF_F_MMAPABLE): one mmap
/// instead of a lookup syscall per slot. Read only, while the programs write it.
struct RevnatView {
    ptr: std::ptr::NonNull<Revnat>,
    len: usize,
}

impl RevnatView {
    fn map(fd: impl std::os::fd::AsFd) -> std::io::Result<RevnatView> {
        use std::os::fd::AsRawFd;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = (std::mem::size_of::<Revnat>() * MAX_SOCKETS as usize).div_ceil(page) * page;
        // SAFETY: a fresh read-only shared mapping of the map's descriptor, which outlives
        // the call; nothing else refers to the address returned.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast()).ok_or_else(|| std::io::Error::other("mmap"))?;
        Ok(RevnatView { ptr, len })
    }

    /// Slot `i`'s entry when it holds one that stayed whole while it was read: the programs
    /// clear a slot's cookie before rewriting it (rev_put), so the cookie read the same before
    /// and after the copy means the copy is that socket's.
    fn get(&self, i: usize) -> Option<Revnat> {
        assert!(i < MAX_SOCKETS as usize);
        // SAFETY: i is within the MAX_SOCKETS entries mapped (56 bytes each, 8-aligned); the
        // kernel writes them concurrently, hence volatile reads of plain integers (any bit
        // pattern is a valid Revnat) and the cookie check around the copy.
        unsafe {
            let slot = self.ptr.as_ptr().add(i);
            let c1 = std::ptr::read_volatile(&raw const (*slot).cookie);
            if c1 == 0 {
                return None;
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let r = std::ptr::read_volatile(slot);
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let c2 = std::ptr::read_volatile(&raw const (*slot).cookie);
            (c1 == c2 && r.cookie == c1).then_some(r)
        }
    }
}

impl Drop for RevnatView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in map(), of this length, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Detaches the link pinned at `path` now, then removes the pin. Removing the pin alone
/// detaches only when the kernel frees the pin's inode (after an RCU grace period, then from a
/// workqueue): a reload answered while the hooks it dropped still ran (seen in the balance
/// tests under load). aya 0.14 has no call for BPF_LINK_DETACH, hence the raw bpf(2) calls.
pub(crate) fn detach_pinned(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const BPF_LINK_DETACH: libc::c_long = 34;
    let link = obj_get(path)?;
    // BPF_LINK_DETACH: link_fd (u32).
    let detach: [u32; 1] = [link.as_raw_fd() as u32];
    // SAFETY: bpf(2) reads `detach`, of the size given.
    let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_DETACH, detach.as_ptr(), 4) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(link);
    std::fs::remove_file(path)
}

/// The BPF object (a link, here) pinned at `path`.
fn obj_get(path: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    const BPF_OBJ_GET: libc::c_long = 7;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // union bpf_attr, BPF_OBJ_GET: pathname (u64), bpf_fd, file_flags, path_fd (u32 each).
    let get: [u64; 3] = [c.as_ptr() as u64, 0, 0];
    // SAFETY: bpf(2) reads `get` (of the size given) and the NUL-terminated path it points
    // to, both alive for the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, get.as_ptr(), 24) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor BPF_OBJ_GET just returned and nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Addresses as bpf_sock_addr holds them: network byte order in the u32s' and u16's memory;
/// an IPv4 address in the first word, family 4.
fn key_of(a: &SocketAddr) -> ([u32; 4], u16, u8) {
    let port = u16::from_ne_bytes(a.port().to_be_bytes());
    match a {
        SocketAddr::V4(v4) => ([u32::from_ne_bytes(v4.ip().octets()), 0, 0, 0], port, 4),
        SocketAddr::V6(v6) => {
            let o = v6.ip().octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], port, 6)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the BPF object: {0} (needs root, or CAP_BPF and CAP_NET_ADMIN)")]
    Load(#[source] aya::EbpfError),
    #[error("BPF map {0} missing from the object")]
    NoMap(&'static str),
    #[error("BPF map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    #[error("BPF program {0}: {1}")]
    Program(&'static str, #[source] aya::programs::ProgramError),
    #[error("open {0}: {1}")]
    Cgroup(String, #[source] std::io::Error),
    #[error("asking the kernel what is attached to the cgroup (BPF_PROG_QUERY): {0}")]
    Query(#[source] std::io::Error),
    #[error("every map slot is in use ({MAX_SERVICES} services of {MAX_BACKENDS} backends)")]
    Full,
    #[error("counting CPUs: {0}")]
    Cpus(#[source] std::io::Error),
    #[error("pinning {0}: {1}")]
    Pin(String, String),
    /// (pin directory, why): pins `up --pin` found and could not take over.
    #[error("--pin {0}: cannot adopt the pinned balancer: {1} (tcpkit balance down --pin {0} removes it)")]
    Adopt(String, String),
    #[error("mapping BPF map {0} into memory: {1}")]
    Mmap(&'static str, #[source] std::io::Error),
}

/// What the programs counted, summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub translated: u64,
    pub refused: u64,
    pub revnat: u64,
    pub stale: u64,
    /// Trace events the ring buffer had no room for.
    pub trace_lost: u64,
    /// Sockets sent to a backend that could not be tagged (no memory for their socket
    /// storage): not in any active count.
    pub untagged: u64,
    /// Connects sent to each backend, per service, in the order given.
    pub picks: Vec<Vec<u64>>,
    /// Sockets open now on each backend (sent there and not yet closed), as `picks`.
    pub active: Vec<Vec<u64>>,
}

/// The loaded object and its links; dropping it detaches everything.
#[derive(Debug)]
pub struct Balancer {
    ebpf: Ebpf,
    /// The services in use, each in a slot of the maps (slot * GENERATIONS + generation is its
    /// set's id in bpf/balance.h). A service keeps its slot across reloads, so its counters
    /// and a connect in flight are never mixed with another service's.
    slots: Vec<Option<Slot>>,
    /// Each slot's generation last written (kept when the slot is freed: a later service in
    /// the slot starts on the other one).
    generation: Vec<u32>,
    /// The services in the order they were given: service index -> slot.
    order: Vec<usize>,
    /// The programs attached, each with its link: this process's (`Some`), or pinned at
    /// `DIR/link_<program>` (`None`) after [`Balancer::pin`].
    links: Vec<(&'static str, Option<LinkId>)>,
    /// The cgroup attached to, kept for hooks attached later (a reload adding UDP).
    cgroup: Option<File>,
    /// Where the links are pinned ([`Balancer::pin`]).
    pinned: Option<std::path::PathBuf>,
    /// The vip_ports bitmap as last written.
    ports: Vec<u32>,
}

#[derive(Debug, Clone)]
struct Slot {
    service: Service,
    /// Each backend's `picks` counter in the slot. A backend kept by a reload keeps its
    /// counter; a new one takes a counter no backend of the set before used, zeroed first, so
    /// a connect still counting against the old set never lands on it.
    counter: Vec<u32>,
}

/// A backend as the `backends` and `owners` maps hold it, with its `picks` counter.
fn entry(b: &crate::config::Backend, counter: u32) -> Backend {
    let (ip, port, family) = key_of(&b.addr);
    Backend {
        ip,
        port,
        family,
        pad: 0,
        index: counter,
        weight: b.weight,
    }
}

/// Whether any of `services` balances UDP (protocol 17 in its keys).
fn needs_udp(services: &[Service]) -> bool {
    services
        .iter()
        .any(|s| s.protocol.numbers().contains(&(libc::IPPROTO_UDP as u8)))
}

fn lowest_free(used: &std::collections::HashSet<u32>, below: usize) -> Option<u32> {
    (0..below as u32).find(|i| !used.contains(i))
}

impl Balancer {
    /// Loads the programs and fills the maps with `services` (checked by `config::check`),
    /// every backend in the set. With `trace`, every selection goes to the ring buffer
    /// ([`Balancer::take_trace`]).
    pub fn load(services: &[Service], trace: bool) -> Result<Balancer, LoadError> {
        let on = u32::from(trace);
        let ebpf = EbpfLoader::new()
            .override_global("trace_on", &on, true)
            .load(OBJECT)
            .map_err(LoadError::Load)?;
        let mut b = Balancer::empty(ebpf, (0..services.len()).collect());
        for (i, s) in services.iter().enumerate() {
            b.slots[i] = Some(Slot {
                service: s.clone(),
                counter: (0..s.backends.len() as u32).collect(),
            });
            b.write_owners(i)?;
            b.write_set(i, 0, &vec![true; s.backends.len()])?;
        }
        b.load_programs()?;
        Ok(b)
    }

    /// A balancer of `ebpf` with no slot filled and nothing attached.
    fn empty(ebpf: Ebpf, order: Vec<usize>) -> Balancer {
        Balancer {
            ebpf,
            slots: vec![None; MAX_SERVICES],
            generation: vec![0; MAX_SERVICES],
            order,
            links: Vec::new(),
            cgroup: None,
            pinned: None,
            ports: vec![0; VIP_PORT_WORDS],
        }
    }

    /// Loads every program into the kernel (the verifier runs here).
    fn load_programs(&mut self) -> Result<(), LoadError> {
        for name in PROGRAMS {
            let r = if name == RELEASE {
                self.sock_program(name)?.load()
            } else {
                self.program(name)?.load()
            };
            r.map_err(|e| LoadError::Program(name, e))?;
        }
        Ok(())
    }

    /// The services in use, in order.
    pub fn services(&self) -> Vec<Service> {
        self.order
            .iter()
            .filter_map(|k| self.slots[*k].as_ref().map(|s| s.service.clone()))
            .collect()
    }

    /// Swaps service `svc`'s backend set to the backends marked in `live` (by their index in
    /// the service), atomically: the other generation's slots are written first, then the
    /// service's value is replaced in one map update. None live: its connects are refused.
    pub fn set_live(&mut self, svc: usize, live: &[bool]) -> Result<(), LoadError> {
        let slot = self.order[svc];
        let g = (self.generation[slot] + 1) % GENERATIONS as u32;
        self.write_set(slot, g, live)
    }

    /// Replaces the services with `services` (checked), each with the backends marked in
    /// `live`: a service with the same VIP and protocol as one in use keeps its slot and its
    /// backends' counters, and its set is swapped atomically as [`Balancer::set_live`] does;
    /// new services are added, and those no longer given removed (their VIPs untouched from
    /// then on). Sockets already connected are not touched: the address was rewritten once,
    /// inside their connect.
    pub fn replace(&mut self, services: &[Service], live: &[Vec<bool>]) -> Result<(), LoadError> {
        use std::collections::HashSet;
        // A UDP service's hooks go on before its VIP is in the map, so no datagram to it goes
        // out untranslated; hooks no longer needed come off once the old services are gone.
        if needs_udp(services) {
            self.attach_hooks(&UDP_ONLY)?;
        }
        let id = |s: &Service| (s.vip, s.protocol);
        let old_used: HashSet<usize> = self.order.iter().copied().collect();
        let mut placed: Vec<Option<usize>> = services
            .iter()
            .map(|s| {
                self.order.iter().copied().find(|k| {
                    self.slots[*k]
                        .as_ref()
                        .is_some_and(|o| id(&o.service) == id(s))
                })
            })
            .collect();
        let kept: HashSet<usize> = placed.iter().flatten().copied().collect();
        let mut taken = kept.clone();
        for p in placed.iter_mut().filter(|p| p.is_none()) {
            // A slot no service of the old set uses, so nothing in flight counts into it.
            let k = (0..MAX_SERVICES)
                .find(|k| !old_used.contains(k) && !taken.contains(k))
                .or_else(|| (0..MAX_SERVICES).find(|k| !taken.contains(k)))
                .ok_or(LoadError::Full)?;
            taken.insert(k);
            *p = Some(k);
        }
        let placed: Vec<usize> = placed.into_iter().flatten().collect();
        // Services no longer given: their VIPs are left alone from now on.
        let removed: Vec<usize> = self
            .order
            .iter()
            .copied()
            .filter(|k| !kept.contains(k))
            .collect();
        for k in &removed {
            if let Some(old) = self.slots[*k].take() {
                self.delete_keys(&old.service)?;
            }
        }
        for (i, (s, k)) in services.iter().zip(&placed).enumerate() {
            let old = self.slots[*k].take();
            let before: Vec<(SocketAddr, u32)> = old
                .as_ref()
                .map(|o| {
                    o.service
                        .backends
                        .iter()
                        .map(|b| b.addr)
                        .zip(o.counter.iter().copied())
                        .collect()
                })
                .unwrap_or_default();
            let mut used: HashSet<u32> = before.iter().map(|(_, c)| *c).collect();
            let mut counter = Vec::with_capacity(s.backends.len());
            let mut fresh = Vec::new();
            for b in &s.backends {
                match before.iter().find(|(a, _)| *a == b.addr) {
                    Some((_, c)) => counter.push(*c),
                    None => {
                        let c = lowest_free(&used, MAX_BACKENDS)
                            .or_else(|| {
                                let mine: HashSet<u32> = counter.iter().copied().collect();
                                lowest_free(&mine, MAX_BACKENDS)
                            })
                            .ok_or(LoadError::Full)?;
                        used.insert(c);
                        counter.push(c);
                        fresh.push(c);
                    }
                }
            }
            if old.is_none() {
                // A slot new to this service: every counter starts from zero, and no client
                // of the slot's service before keeps a backend here.
                fresh = counter.clone();
                self.forget_clients(*k)?;
            }
            self.zero_picks(*k, &fresh)?;
            self.slots[*k] = Some(Slot {
                service: s.clone(),
                counter,
            });
            self.write_owners(*k)?;
            let g = (self.generation[*k] + 1) % GENERATIONS as u32;
            let all = vec![true; s.backends.len()];
            self.write_set(*k, g, live.get(i).unwrap_or(&all))?;
        }
        self.order = placed;
        // Ports of removed VIPs last: until now they only cost a services lookup.
        let ports: Vec<u16> = self.services().iter().map(|s| key_of(&s.vip).1).collect();
        self.write_ports(&ports, true)?;
        self.sync_hooks()
    }

    /// Sets the bits of `ports` (as bpf_sock_addr holds them) in vip_ports; with `exact`,
    /// clears every other. Only the words that change are written.
    fn write_ports(&mut self, ports: &[u16], exact: bool) -> Result<(), LoadError> {
        let mut want = if exact {
            vec![0; VIP_PORT_WORDS]
        } else {
            self.ports.clone()
        };
        for p in ports {
            want[usize::from(*p) / 32] |= 1 << (p % 32);
        }
        let mut m: Array<_, u32> = Array::try_from(
            self.ebpf
                .map_mut("vip_ports")
                .ok_or(LoadError::NoMap("vip_ports"))?,
        )
        .map_err(|e| LoadError::Map("vip_ports", e))?;
        for (i, (w, old)) in want.iter().zip(&self.ports).enumerate() {
            if w != old {
                m.set(i as u32, w, 0)
                    .map_err(|e| LoadError::Map("vip_ports", e))?;
            }
        }
        self.ports = want;
        Ok(())
    }

    /// Writes slot `slot`'s backends, in order, with their counters into `owners` (what an
    /// `up` adopting the pins reads back), and ends the list.
    fn write_owners(&mut self, slot: usize) -> Result<(), LoadError> {
        let Some(Slot {
            service: s,
            counter,
        }) = self.slots[slot].clone()
        else {
            return Ok(());
        };
        let mut m: Array<_, Backend> = Array::try_from(
            self.ebpf
                .map_mut("owners")
                .ok_or(LoadError::NoMap("owners"))?,
        )
        .map_err(|e| LoadError::Map("owners", e))?;
        for (i, (b, c)) in s.backends.iter().zip(&counter).enumerate() {
            m.set((slot * MAX_BACKENDS + i) as u32, entry(b, *c), 0)
                .map_err(|e| LoadError::Map("owners", e))?;
        }
        if s.backends.len() < MAX_BACKENDS {
            m.set(
                (slot * MAX_BACKENDS + s.backends.len()) as u32,
                Backend::default(),
                0,
            )
            .map_err(|e| LoadError::Map("owners", e))?;
        }
        Ok(())
    }

    /// Drops the --persistent entries of service slot `slot`.
    fn forget_clients(&mut self, slot: usize) -> Result<(), LoadError> {
        let mut m: HashMap<_, PersistKey, PersistVal> = HashMap::try_from(
            self.ebpf
                .map_mut("persist")
                .ok_or(LoadError::NoMap("persist"))?,
        )
        .map_err(|e| LoadError::Map("persist", e))?;
        let keys: Vec<PersistKey> = m
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.svc as usize == slot)
            .collect();
        for k in keys {
            // Gone already (evicted) is as good.
            let _ = m.remove(&k);
        }
        Ok(())
    }

    /// Zeroes counters `which` of `slot` for the backend they are given to: its connects, and
    /// its active sockets with the epoch moved on, so a socket of the counter's backend
    /// before, closed later, does not count off this one (bpf/balance.h, struct active).
    fn zero_picks(&mut self, slot: usize, which: &[u32]) -> Result<(), LoadError> {
        if which.is_empty() {
            return Ok(());
        }
        {
            let mut a: Array<_, Active> = Array::try_from(
                self.ebpf
                    .map_mut("active")
                    .ok_or(LoadError::NoMap("active"))?,
            )
            .map_err(|e| LoadError::Map("active", e))?;
            for c in which {
                let k = (slot * MAX_BACKENDS) as u32 + c;
                let old = a.get(&k, 0).map_err(|e| LoadError::Map("active", e))?;
                let v = Active {
                    n: 0,
                    epoch: old.epoch.wrapping_add(1),
                    pad: 0,
                };
                a.set(k, v, 0).map_err(|e| LoadError::Map("active", e))?;
            }
        }
        let n = aya::util::nr_cpus().map_err(|(_, e)| LoadError::Cpus(e))?;
        let mut p: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.ebpf
                .map_mut("picks")
                .ok_or(LoadError::NoMap("picks"))?,
        )
        .map_err(|e| LoadError::Map("picks", e))?;
        for c in which {
            let zeros = aya::maps::PerCpuValues::try_from(vec![0u64; n])
                .map_err(|e| LoadError::Cpus(std::io::Error::other(e)))?;
            p.set((slot * MAX_BACKENDS) as u32 + c, zeros, 0)
                .map_err(|e| LoadError::Map("picks", e))?;
        }
        Ok(())
    }

    /// The services map's keys of `s` (one per protocol it balances).
    pub(crate) fn keys(s: &Service) -> Vec<SvcKey> {
        let (ip, port, family) = key_of(&s.vip);
        s.protocol
            .numbers()
            .iter()
            .map(|p| SvcKey {
                ip,
                port,
                family,
                proto: *p,
            })
            .collect()
    }

    fn delete_keys(&mut self, s: &Service) -> Result<(), LoadError> {
        let mut svcs: HashMap<_, SvcKey, Svc> = HashMap::try_from(
            self.ebpf
                .map_mut("services")
                .ok_or(LoadError::NoMap("services"))?,
        )
        .map_err(|e| LoadError::Map("services", e))?;
        for k in Self::keys(s) {
            // Absent already is fine: removal is what was asked.
            let _ = svcs.remove(&k);
        }
        Ok(())
    }

    fn write_set(&mut self, slot: usize, generation: u32, live: &[bool]) -> Result<(), LoadError> {
        let Some(Slot {
            service: s,
            counter,
        }) = self.slots[slot].clone()
        else {
            return Ok(());
        };
        let id = slot * GENERATIONS + generation as usize;
        // Weight 0 drains: out of the set, its open sockets untouched.
        let set: Vec<(usize, &crate::config::Backend)> = s
            .backends
            .iter()
            .enumerate()
            .filter(|(i, b)| b.weight > 0 && live.get(*i).copied().unwrap_or(false))
            .collect();
        {
            let mut backends: Array<_, Backend> = Array::try_from(
                self.ebpf
                    .map_mut("backends")
                    .ok_or(LoadError::NoMap("backends"))?,
            )
            .map_err(|e| LoadError::Map("backends", e))?;
            for (k, (index, b)) in set.iter().enumerate() {
                let v = entry(b, counter[*index]);
                backends
                    .set((id * MAX_BACKENDS + k) as u32, v, 0)
                    .map_err(|e| LoadError::Map("backends", e))?;
            }
        }
        let weights = || set.iter().map(|(_, b)| b.weight).collect::<Vec<_>>();
        let table = match s.algorithm {
            Algorithm::WeightedRandom => table::weighted(&weights()),
            Algorithm::WeightedRoundRobin => table::wrr(&weights()),
            Algorithm::Maglev(_) => table::maglev(
                &set.iter()
                    .map(|(_, b)| (b.addr, b.weight))
                    .collect::<Vec<_>>(),
            ),
            Algorithm::Random
            | Algorithm::RoundRobin
            | Algorithm::LeastConn
            | Algorithm::WeightedLeastConn => Vec::new(),
        };
        if !table.is_empty() {
            let mut ring: Array<_, u32> =
                Array::try_from(self.ebpf.map_mut("ring").ok_or(LoadError::NoMap("ring"))?)
                    .map_err(|e| LoadError::Map("ring", e))?;
            for (k, i) in table.iter().enumerate() {
                ring.set((id * RING_SIZE + k) as u32, i, 0)
                    .map_err(|e| LoadError::Map("ring", e))?;
            }
        }
        let algo = match s.algorithm {
            Algorithm::Random => ALGO_RANDOM,
            Algorithm::RoundRobin => ALGO_ROUND_ROBIN,
            Algorithm::WeightedRandom => ALGO_WEIGHTED,
            Algorithm::WeightedRoundRobin => ALGO_WRR,
            Algorithm::LeastConn => ALGO_LC,
            Algorithm::WeightedLeastConn => ALGO_WLC,
            Algorithm::Maglev(HashKey::Client) => ALGO_MAGLEV_CLIENT,
            Algorithm::Maglev(HashKey::Host) => ALGO_MAGLEV_HOST,
            Algorithm::Maglev(HashKey::Cookie) => ALGO_MAGLEV_COOKIE,
        };
        let v = Svc {
            id: id as u32,
            count: set.len() as u32,
            algo,
            rr: 0,
            len: table.len() as u32,
            // Checked: 1 ms to a day.
            persist_ms: s.persistence.map_or(0, |p| p.as_millis() as u32),
        };
        // The VIP's port bit before its key: a connect that finds the key passed the bit.
        self.write_ports(&[key_of(&s.vip).1], false)?;
        let mut svcs: HashMap<_, SvcKey, Svc> = HashMap::try_from(
            self.ebpf
                .map_mut("services")
                .ok_or(LoadError::NoMap("services"))?,
        )
        .map_err(|e| LoadError::Map("services", e))?;
        for k in Self::keys(&s) {
            svcs.insert(k, v, 0)
                .map_err(|e| LoadError::Map("services", e))?;
        }
        self.generation[slot] = generation;
        Ok(())
    }

    /// The ring buffer of `--trace` events (once).
    pub fn take_trace(&mut self) -> Result<RingBuf<MapData>, LoadError> {
        let m = self
            .ebpf
            .take_map("trace")
            .ok_or(LoadError::NoMap("trace"))?;
        RingBuf::try_from(m).map_err(|e| LoadError::Map("trace", e))
    }

    /// Attaches the programs the services need to the cgroup at `path` with bpf_link (links
    /// are this process's file descriptors: they go when it exits, however it exits).
    pub fn attach(&mut self, path: &Path) -> Result<(), LoadError> {
        let cg = File::open(path).map_err(|e| LoadError::Cgroup(path.display().to_string(), e))?;
        self.cgroup = Some(cg);
        self.sync_hooks()
    }

    /// The hooks of ours the kernel has attached to the cgroup now, by their attach names
    /// (`connect4`, ...), in [`PROGRAMS`] order: asked of the kernel, so a link detached
    /// behind this process's back (bpftool, a pin removed) is not listed.
    pub fn hooks(&self) -> Result<Vec<String>, LoadError> {
        use std::os::fd::AsFd;
        let Some(cg) = &self.cgroup else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for name in PROGRAMS {
            let id = self
                .loaded(name)?
                .info()
                .map_err(|e| LoadError::Program(name, e))?
                .id();
            let t = crate::attached::attach_type(name).unwrap_or_default();
            let ids = crate::attached::prog_ids(cg.as_fd(), t).map_err(LoadError::Query)?;
            if ids.contains(&id) {
                out.push(name.trim_start_matches("tk_").to_string());
            }
        }
        Ok(out)
    }

    /// Program `name` of the object.
    fn loaded(&self, name: &'static str) -> Result<&aya::programs::Program, LoadError> {
        self.ebpf.program(name).ok_or(LoadError::Program(
            name,
            aya::programs::ProgramError::UnexpectedProgramType,
        ))
    }

    fn wanted(&self) -> Vec<&'static str> {
        let services: Vec<Service> = self.services();
        let mut w = ALWAYS.to_vec();
        if needs_udp(&services) {
            w.extend(UDP_ONLY);
        }
        w
    }

    /// Attaches what the services in the maps need and detaches what they no longer do.
    fn sync_hooks(&mut self) -> Result<(), LoadError> {
        let wanted = self.wanted();
        self.attach_hooks(&wanted)?;
        let extra: Vec<&'static str> = self
            .links
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| !wanted.contains(n))
            .collect();
        for name in extra {
            self.detach_hook(name)?;
        }
        Ok(())
    }

    /// Program `name` as its type `P` (a socket-address hook, or sock_release's).
    fn typed<'a, P: 'a>(&'a mut self, name: &'static str) -> Result<&'a mut P, LoadError>
    where
        &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
    {
        self.ebpf
            .program_mut(name)
            .ok_or(LoadError::Program(
                name,
                aya::programs::ProgramError::UnexpectedProgramType,
            ))?
            .try_into()
            .map_err(|e| LoadError::Program(name, e))
    }

    fn program(&mut self, name: &'static str) -> Result<&mut CgroupSockAddr, LoadError> {
        self.typed(name)
    }

    fn sock_program(&mut self, name: &'static str) -> Result<&mut CgroupSock, LoadError> {
        self.typed(name)
    }

    fn attach_program(&mut self, name: &'static str, cg: &File) -> Result<LinkId, LoadError> {
        let r = if name == RELEASE {
            self.sock_program(name)?
                .attach(cg, CgroupAttachMode::Single)
                .map(LinkId::Sock)
        } else {
            self.program(name)?
                .attach(cg, CgroupAttachMode::Single)
                .map(LinkId::Addr)
        };
        r.map_err(|e| LoadError::Program(name, e))
    }

    fn detach_program(&mut self, name: &'static str, id: LinkId) -> Result<(), LoadError> {
        let r = match id {
            LinkId::Sock(id) => self.sock_program(name)?.detach(id),
            LinkId::Addr(id) => self.program(name)?.detach(id),
        };
        r.map_err(|e| LoadError::Program(name, e))
    }

    /// The link, taken from aya (it no longer detaches it on drop), as a descriptor to pin.
    fn take_fd_link(&mut self, name: &'static str, id: LinkId) -> Result<FdLink, LoadError> {
        let fd = match id {
            LinkId::Sock(id) => {
                let l = self
                    .sock_program(name)?
                    .take_link(id)
                    .map_err(|e| LoadError::Program(name, e))?;
                FdLink::try_from(l)
            }
            LinkId::Addr(id) => {
                let l = self
                    .program(name)?
                    .take_link(id)
                    .map_err(|e| LoadError::Program(name, e))?;
                FdLink::try_from(l)
            }
        };
        fd.map_err(|e| LoadError::Pin(name.to_string(), e.to_string()))
    }

    /// Attaches those of `names` not attached yet (nothing before [`Balancer::attach`]); pinned
    /// too when the others are.
    fn attach_hooks(&mut self, names: &[&'static str]) -> Result<(), LoadError> {
        let Some(cg) = self
            .cgroup
            .as_ref()
            .map(File::try_clone)
            .transpose()
            .map_err(|e| LoadError::Cgroup("the attached cgroup".into(), e))?
        else {
            return Ok(());
        };
        for name in names {
            if self.links.iter().any(|(n, _)| n == name) {
                continue;
            }
            let id = self.attach_program(name, &cg)?;
            self.links.push((name, Some(id)));
            if let Some(dir) = self.pinned.clone() {
                self.pin_link(name, &dir)?;
            }
        }
        Ok(())
    }

    fn detach_hook(&mut self, name: &'static str) -> Result<(), LoadError> {
        let Some(i) = self.links.iter().position(|(n, _)| *n == name) else {
            return Ok(());
        };
        let (_, id) = self.links.remove(i);
        match (id, &self.pinned) {
            (Some(id), _) => self.detach_program(name, id),
            // A pinned link (this process closed its descriptor already) is detached through
            // its pin, then the pin removed.
            (None, Some(dir)) => {
                let path = dir.join(format!("link_{name}"));
                detach_pinned(&path)
                    .map_err(|e| LoadError::Pin(path.display().to_string(), e.to_string()))
            }
            (None, None) => Ok(()),
        }
    }

    /// Pins link `name` (attached, this process's) at `DIR/link_<name>`.
    fn pin_link(&mut self, name: &'static str, dir: &Path) -> Result<(), LoadError> {
        let pin_err = |what: String, e: &dyn std::fmt::Display| LoadError::Pin(what, e.to_string());
        let Some(slot) = self.links.iter_mut().find(|(n, _)| *n == name) else {
            return Ok(());
        };
        let Some(id) = slot.1.take() else {
            return Ok(());
        };
        let path = dir.join(format!("link_{name}"));
        let fd = self.take_fd_link(name, id)?;
        // The pin holds the link; the descriptor returned is closed at once.
        fd.pin(&path)
            .map_err(|e| pin_err(path.display().to_string(), &e))?;
        Ok(())
    }

    /// The maps pinned by [`Balancer::pin`] (the trace ring buffer, read by this process
    /// only, is not).
    pub const PINNED_MAPS: [&'static str; 11] = [
        "owners",
        "services",
        "backends",
        "revnat",
        "counters",
        "picks",
        "ring",
        "vip_ports",
        "active",
        "overflow",
        "persist",
    ];

    /// Pins every link (`DIR/link_<program>`) and map (`DIR/map_<name>`) under `dir` (on a
    /// bpf filesystem): they outlive this process until the pins are removed.
    pub fn pin(&mut self, dir: &Path) -> Result<(), LoadError> {
        let pin_err = |what: String, e: &dyn std::fmt::Display| LoadError::Pin(what, e.to_string());
        let names: Vec<&'static str> = self.links.iter().map(|(n, _)| *n).collect();
        for name in names {
            self.pin_link(name, dir)?;
        }
        self.pinned = Some(dir.to_path_buf());
        for name in Self::PINNED_MAPS {
            let path = dir.join(format!("map_{name}"));
            self.ebpf
                .map(name)
                .ok_or(LoadError::NoMap(name))?
                .pin(&path)
                .map_err(|e| pin_err(path.display().to_string(), &e))?;
        }
        Ok(())
    }

    /// The cookies of the sockets the programs sent to `backend` (the reverse map's entries
    /// toward it, in IPv4 form or v4-mapped), for `--drain-kill`.
    pub fn cookies_toward(
        &self,
        backend: SocketAddr,
    ) -> Result<std::collections::HashSet<u64>, LoadError> {
        let (ip, port, family) = key_of(&backend);
        let mapped = [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), ip[0]];
        let map = self.ebpf.map("revnat").ok_or(LoadError::NoMap("revnat"))?;
        let m: Array<_, Revnat> = Array::try_from(map).map_err(|e| LoadError::Map("revnat", e))?;
        let slots = RevnatView::map(aya::maps::IterableMap::map(&m).fd())
            .map_err(|e| LoadError::Mmap("revnat", e))?;
        let mut out = std::collections::HashSet::new();
        for i in 0..MAX_SOCKETS as usize {
            if let Some(r) = slots.get(i) {
                if r.bport == port && (r.bip == ip || (family == 4 && r.bip == mapped)) {
                    out.insert(r.cookie);
                }
            }
        }
        Ok(out)
    }

    /// Drops the reverse-map entries of `cookies`: an unconnected UDP socket's next datagram
    /// to its VIP then picks a backend again. Each one's tag moves to the overflow map first,
    /// so the socket is still counted off its backend once, when it picks again or closes.
    pub fn forget(&mut self, cookies: &[u64]) -> Result<(), LoadError> {
        {
            let map = self.ebpf.map("revnat").ok_or(LoadError::NoMap("revnat"))?;
            let m: Array<_, Revnat> =
                Array::try_from(map).map_err(|e| LoadError::Map("revnat", e))?;
            let mut tags = Vec::new();
            for c in cookies {
                let k = (*c % u64::from(MAX_SOCKETS)) as u32;
                let r = m.get(&k, 0).map_err(|e| LoadError::Map("revnat", e))?;
                if r.cookie == *c && r.key1 != 0 {
                    tags.push((
                        *c,
                        SockTag {
                            key1: r.key1,
                            epoch: r.epoch,
                        },
                    ));
                }
            }
            let mut o: HashMap<_, u64, SockTag> = HashMap::try_from(
                self.ebpf
                    .map_mut("overflow")
                    .ok_or(LoadError::NoMap("overflow"))?,
            )
            .map_err(|e| LoadError::Map("overflow", e))?;
            for (c, t) in tags {
                // Full: the socket stays counted on that backend (as COUNTER_UNTAGGED).
                let _ = o.insert(c, t, 0);
            }
        }
        let map = self
            .ebpf
            .map_mut("revnat")
            .ok_or(LoadError::NoMap("revnat"))?;
        let mut m: Array<_, Revnat> =
            Array::try_from(map).map_err(|e| LoadError::Map("revnat", e))?;
        for c in cookies {
            let k = (*c % u64::from(MAX_SOCKETS)) as u32;
            let r = m.get(&k, 0).map_err(|e| LoadError::Map("revnat", e))?;
            // A slot taken over by a newer socket since is that socket's: left alone. (A
            // connect writing the slot between this read and the write below would lose its
            // entry, as to an eviction; that needs MAX_SOCKETS sockets made in between.)
            if r.cookie == *c {
                m.set(k, Revnat::default(), 0)
                    .map_err(|e| LoadError::Map("revnat", e))?;
            }
        }
        Ok(())
    }

    /// The counters so far.
    pub fn counters(&self) -> Result<Counters, LoadError> {
        let map = self
            .ebpf
            .map("counters")
            .ok_or(LoadError::NoMap("counters"))?;
        let c: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|e| LoadError::Map("counters", e))?;
        let sum = |i: u32| -> Result<u64, LoadError> {
            Ok(c.get(&i, 0)
                .map_err(|e| LoadError::Map("counters", e))?
                .iter()
                .sum())
        };
        let map = self.ebpf.map("picks").ok_or(LoadError::NoMap("picks"))?;
        let p: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|e| LoadError::Map("picks", e))?;
        let map = self.ebpf.map("active").ok_or(LoadError::NoMap("active"))?;
        let a: Array<_, Active> = Array::try_from(map).map_err(|e| LoadError::Map("active", e))?;
        let mut picks = Vec::with_capacity(self.order.len());
        let mut active = Vec::with_capacity(self.order.len());
        for k in &self.order {
            let Some(s) = &self.slots[*k] else { continue };
            let mut per = Vec::with_capacity(s.counter.len());
            let mut open = Vec::with_capacity(s.counter.len());
            for c in &s.counter {
                let slot = (*k * MAX_BACKENDS) as u32 + c;
                per.push(
                    p.get(&slot, 0)
                        .map_err(|e| LoadError::Map("picks", e))?
                        .iter()
                        .sum(),
                );
                // Below 0 only for a moment: a release counted before its connect's add.
                let n = a.get(&slot, 0).map_err(|e| LoadError::Map("active", e))?.n;
                open.push(n.max(0) as u64);
            }
            picks.push(per);
            active.push(open);
        }
        Ok(Counters {
            translated: sum(COUNTER_TRANSLATED)?,
            refused: sum(COUNTER_REFUSED)?,
            revnat: sum(COUNTER_REVNAT)?,
            stale: sum(COUNTER_STALE)?,
            trace_lost: sum(COUNTER_TRACE_LOST)?,
            untagged: sum(COUNTER_UNTAGGED)?,
            picks,
            active,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_in_network_order_in_memory() {
        let (ip, port, family) = key_of(&"198.18.0.2:6379".parse().unwrap());
        assert_eq!(
            (ip[0].to_ne_bytes(), &ip[1..], family),
            ([198, 18, 0, 2], &[0, 0, 0][..], 4)
        );
        assert_eq!(port.to_ne_bytes(), [0x18, 0xeb]);
        let (ip, _, family) = key_of(&"[fd00:18::2]:80".parse().unwrap());
        assert_eq!(
            (ip[0].to_ne_bytes(), ip[3].to_ne_bytes(), family),
            ([0xfd, 0, 0, 0x18], [0, 0, 0, 2], 6)
        );
    }

    #[test]
    fn the_object_has_both_programs() {
        let obj = aya_obj_names(OBJECT);
        for p in PROGRAMS {
            assert!(obj.contains(p), "{p} missing from the BPF object");
        }
    }

    fn aya_obj_names(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }
}
