//! Adopting the pins of a `balance up --pin DIR` that has ended (stopped for an upgrade,
//! killed, crashed): a new `up --pin DIR` loads its programs onto the pinned maps, so the sets,
//! counters, reverse entries and persistent clients carry on; reads each service and its live
//! set back from them (`owners` says whose each counter is, `backends` which are live); and
//! puts its programs into the pinned links with BPF_LINK_UPDATE, which replaces a link's
//! program atomically: no connect in between meets no program, or two. Then the file's
//! services are put in force as a reload does (each set swapped atomically).
//!
//! Pins of another build whose maps are shaped otherwise are refused before anything is
//! touched, in one line naming `down`.

use std::collections::{BTreeMap, HashMap as StdMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use aya::maps::MapType;

use super::*;
use crate::bpf::{COUNTERS, MAX_OVERFLOW, MAX_PERSIST};
use crate::config::{Backend as ConfigBackend, Protocol};

/// What the pins held: each service (VIP, protocol), its backends, and whether each was in the
/// live set when the balancer before stopped.
#[derive(Debug, Default)]
pub struct Adopted {
    live: StdMap<(SocketAddr, Protocol), StdMap<SocketAddr, bool>>,
}

impl Adopted {
    /// Whether `backend` of `service` was in its pinned live set; None when the pins did not
    /// have that service or backend.
    pub fn was_live(&self, service: &Service, backend: SocketAddr) -> Option<bool> {
        self.live
            .get(&(service.vip, service.protocol))?
            .get(&backend)
            .copied()
    }

    /// Services adopted, and backends live among them.
    pub fn counts(&self) -> (usize, usize) {
        let live = self.live.values().flat_map(|m| m.values()).filter(|l| **l);
        (self.live.len(), live.count())
    }
}

/// Each pinned map's type, key size, value size and entries, as this build declares it.
fn shape(name: &str) -> Option<(MapType, usize, usize, usize)> {
    use std::mem::size_of;
    let per_backend = MAX_SERVICES * MAX_BACKENDS;
    Some(match name {
        "owners" => (MapType::Array, 4, size_of::<Backend>(), per_backend),
        "services" => (
            MapType::Hash,
            size_of::<SvcKey>(),
            size_of::<Svc>(),
            MAX_SERVICES,
        ),
        "backends" => (
            MapType::Array,
            4,
            size_of::<Backend>(),
            per_backend * GENERATIONS,
        ),
        "revnat" => (MapType::Array, 4, size_of::<Revnat>(), MAX_SOCKETS as usize),
        "counters" => (MapType::PerCpuArray, 4, 8, COUNTERS as usize),
        "picks" => (MapType::PerCpuArray, 4, 8, per_backend),
        "ring" => (MapType::Array, 4, 4, MAX_SERVICES * GENERATIONS * RING_SIZE),
        "vip_ports" => (MapType::Array, 4, 4, VIP_PORT_WORDS),
        "active" => (MapType::Array, 4, size_of::<Active>(), per_backend),
        "overflow" => (
            MapType::Hash,
            8,
            size_of::<SockTag>(),
            MAX_OVERFLOW as usize,
        ),
        "persist" => (
            MapType::LruHash,
            size_of::<PersistKey>(),
            size_of::<PersistVal>(),
            MAX_PERSIST as usize,
        ),
        _ => return None,
    })
}

/// Checks the map pinned at `DIR/map_<name>` is one this build can use as its own.
fn check_shape(dir: &Path, name: &str) -> Result<PathBuf, LoadError> {
    let path = dir.join(format!("map_{name}"));
    let refuse = |why: String| LoadError::Adopt(dir.display().to_string(), why);
    let info = aya::maps::MapInfo::from_pin(&path)
        .map_err(|e| refuse(format!("{}: {e}", path.display())))?;
    let want = shape(name).ok_or_else(|| refuse(format!("no map {name} in this build")))?;
    let got = (
        info.map_type().ok(),
        info.key_size() as usize,
        info.value_size() as usize,
        info.max_entries() as usize,
    );
    if got != (Some(want.0), want.1, want.2, want.3) {
        return Err(refuse(format!(
            "map_{name} is not shaped as this build's (another version of tcpkit pinned it)"
        )));
    }
    Ok(path)
}

/// The address a map entry holds (the inverse of `key_of`).
fn addr_of(ip: [u32; 4], port: u16, family: u8) -> SocketAddr {
    let port = u16::from_be_bytes(port.to_ne_bytes());
    if family == 4 {
        return SocketAddr::from((Ipv4Addr::from(ip[0].to_ne_bytes()), port));
    }
    let mut o = [0u8; 16];
    for (i, w) in ip.iter().enumerate() {
        o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
    }
    SocketAddr::from((Ipv6Addr::from(o), port))
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_UPDATE: libc::c_long = 29;

/// A cgroup link's program id and cgroup id (struct bpf_link_info: type, id, prog_id, then
/// the union at offset 16 whose cgroup member is cgroup_id, attach_type).
fn link_info(link: &OwnedFd) -> std::io::Result<(u32, u64)> {
    let mut info = [0u64; 12];
    // union bpf_attr, BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len (u32), info (u64).
    let attr: [u64; 2] = [
        u64::from(link.as_raw_fd() as u32) | ((std::mem::size_of_val(&info) as u64) << 32),
        info.as_mut_ptr() as u64,
    ];
    // SAFETY: bpf(2) reads `attr` and writes at most info_len bytes into `info`, both alive.
    let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, attr.as_ptr(), 16) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(((info[1] & 0xffff_ffff) as u32, info[2]))
}

/// Replaces the program of `link` with `prog`, atomically (BPF_LINK_UPDATE: link_fd,
/// new_prog_fd, flags, old_prog_fd).
fn link_update(link: &OwnedFd, prog: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    let attr: [u32; 4] = [link.as_raw_fd() as u32, prog.as_raw_fd() as u32, 0, 0];
    // SAFETY: bpf(2) reads `attr`, of the size given.
    let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_UPDATE, attr.as_ptr(), 16) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The links pinned under `dir` (`link_<program>`), each with its program's name.
fn pinned_links(dir: &Path) -> Result<Vec<(&'static str, PathBuf)>, LoadError> {
    let shown = dir.display().to_string();
    let io = |e: std::io::Error| LoadError::Adopt(shown.clone(), e.to_string());
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let e = e.map_err(io)?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(prog) = name.strip_prefix("link_") else {
            continue;
        };
        let Some(p) = PROGRAMS.iter().find(|p| **p == prog) else {
            return Err(LoadError::Adopt(
                shown,
                format!("{name}: not a link of this build's programs"),
            ));
        };
        out.push((*p, e.path()));
    }
    Ok(out)
}

/// The ids of the programs the links pinned under `dir` run: a balancer being adopted, not
/// another one serving the same VIPs.
pub fn pinned_prog_ids(dir: &Path) -> HashSet<u32> {
    pinned_links(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, p)| link_info(&obj_get(p).ok()?).ok())
        .map(|(prog, _)| prog)
        .collect()
}

impl Balancer {
    /// Loads the programs onto the maps pinned under `dir` (checked first to be shaped as
    /// this build's), and reads the services back from them, each keeping its slot, its
    /// counters and the generation in use. Nothing is written: [`Balancer::replace`] with the
    /// file's services does that, once [`Balancer::adopt_links`] has the links.
    pub fn load_adopting(dir: &Path, trace: bool) -> Result<(Balancer, Adopted), LoadError> {
        let mut paths = Vec::new();
        for name in Self::PINNED_MAPS {
            paths.push((name, check_shape(dir, name)?));
        }
        let on = u32::from(trace);
        let mut loader = EbpfLoader::new();
        loader.override_global("trace_on", &on, true);
        for (name, path) in paths {
            loader.map_pin_path(name, path);
        }
        let ebpf = loader.load(OBJECT).map_err(LoadError::Load)?;
        let mut b = Balancer::empty(ebpf, Vec::new());
        let adopted = b.read_back()?;
        b.load_programs()?;
        Ok((b, adopted))
    }

    /// The services in the pinned maps, into `slots`, `generation`, `order` and `ports`.
    fn read_back(&mut self) -> Result<Adopted, LoadError> {
        let map = |name: &'static str| self.ebpf.map(name).ok_or(LoadError::NoMap(name));
        let svcs: HashMap<_, SvcKey, Svc> =
            HashMap::try_from(map("services")?).map_err(|e| LoadError::Map("services", e))?;
        let mut by_slot: BTreeMap<usize, (Vec<SvcKey>, Svc)> = BTreeMap::new();
        for (k, v) in svcs.iter().filter_map(Result::ok) {
            if v.id as usize >= MAX_SERVICES * GENERATIONS {
                continue;
            }
            let e = by_slot
                .entry(v.id as usize / GENERATIONS)
                .or_insert_with(|| (Vec::new(), v));
            e.0.push(k);
        }
        let owners: Array<_, Backend> =
            Array::try_from(map("owners")?).map_err(|e| LoadError::Map("owners", e))?;
        let sets: Array<_, Backend> =
            Array::try_from(map("backends")?).map_err(|e| LoadError::Map("backends", e))?;
        let ports: Array<_, u32> =
            Array::try_from(map("vip_ports")?).map_err(|e| LoadError::Map("vip_ports", e))?;
        let mut adopted = Adopted::default();
        let mut found = Vec::new();
        for (slot, (keys, v)) in by_slot {
            let k = keys[0];
            let vip = addr_of(k.ip, k.port, k.family);
            let protos: HashSet<u8> = keys.iter().map(|k| k.proto).collect();
            let protocol = match (protos.contains(&6), protos.contains(&17)) {
                (true, true) => Protocol::Both,
                (false, true) => Protocol::Udp,
                _ => Protocol::Tcp,
            };
            let mut backends = Vec::new();
            let mut counter = Vec::new();
            for i in 0..MAX_BACKENDS {
                let o = owners
                    .get(&((slot * MAX_BACKENDS + i) as u32), 0)
                    .map_err(|e| LoadError::Map("owners", e))?;
                if o.family == 0 {
                    break;
                }
                backends.push(ConfigBackend {
                    addr: addr_of(o.ip, o.port, o.family),
                    weight: o.weight,
                });
                counter.push(o.index);
            }
            let mut live = HashSet::new();
            for i in 0..(v.count as usize).min(MAX_BACKENDS) {
                let b = sets
                    .get(&((v.id as usize * MAX_BACKENDS + i) as u32), 0)
                    .map_err(|e| LoadError::Map("backends", e))?;
                live.insert(addr_of(b.ip, b.port, b.family));
            }
            adopted.live.insert(
                (vip, protocol),
                backends
                    .iter()
                    .map(|b| (b.addr, live.contains(&b.addr)))
                    .collect(),
            );
            found.push((
                slot,
                v.id % GENERATIONS as u32,
                Slot {
                    // The algorithm and persistence are the file's once replaced; only the
                    // VIP, protocol, backends and counters of the slot are carried over.
                    service: Service {
                        vip,
                        protocol,
                        backends,
                        algorithm: Algorithm::Random,
                        persistence: None,
                    },
                    counter,
                },
            ));
        }
        for (i, w) in self.ports.iter_mut().enumerate() {
            *w = ports
                .get(&(i as u32), 0)
                .map_err(|e| LoadError::Map("vip_ports", e))?;
        }
        for (slot, generation, s) in found {
            self.slots[slot] = Some(s);
            self.generation[slot] = generation;
            self.order.push(slot);
        }
        Ok(adopted)
    }

    /// Puts this balancer's programs into the links pinned under `dir` (all on the cgroup at
    /// `path`, else nothing is touched), detaches pinned hooks the services no longer need,
    /// and attaches (and pins) those they need that were not pinned.
    pub fn adopt_links(&mut self, path: &Path, dir: &Path) -> Result<(), LoadError> {
        let shown = dir.display().to_string();
        let cg = File::open(path).map_err(|e| LoadError::Cgroup(path.display().to_string(), e))?;
        let cg_id = cg
            .metadata()
            .map_err(|e| LoadError::Cgroup(path.display().to_string(), e))?
            .ino();
        let mut links = Vec::new();
        for (name, pin) in pinned_links(dir)? {
            let fd = obj_get(&pin).map_err(|e| LoadError::Adopt(shown.clone(), e.to_string()))?;
            let (_, on) =
                link_info(&fd).map_err(|e| LoadError::Adopt(shown.clone(), e.to_string()))?;
            if on != cg_id {
                return Err(LoadError::Adopt(
                    shown,
                    format!(
                        "its links are on another cgroup (id {on}) than {} (id {cg_id})",
                        path.display()
                    ),
                ));
            }
            links.push((name, fd, pin));
        }
        self.cgroup = Some(cg);
        let wanted = self.wanted();
        for (name, fd, pin) in links {
            if !wanted.contains(&name) {
                detach_pinned(&pin).map_err(|e| LoadError::Adopt(shown.clone(), e.to_string()))?;
                continue;
            }
            let prog = self
                .loaded(name)?
                .fd()
                .map_err(|e| LoadError::Program(name, e))?;
            link_update(&fd, prog.as_fd()).map_err(|e| {
                LoadError::Adopt(shown.clone(), format!("replacing {name}'s program: {e}"))
            })?;
            self.links.push((name, None));
        }
        self.pinned = Some(dir.to_path_buf());
        self.attach_hooks(&wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_back_are_the_ones_written() {
        for a in [
            "198.18.0.2:6379",
            "[fd00:18::2]:80",
            "[::ffff:198.18.0.2]:53",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let (ip, port, family) = key_of(&a);
            assert_eq!(addr_of(ip, port, family), a);
        }
    }

    #[test]
    fn every_pinned_map_has_a_shape() {
        for name in Balancer::PINNED_MAPS {
            assert!(shape(name).is_some(), "{name}");
        }
    }
}
