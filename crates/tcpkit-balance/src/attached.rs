//! What the kernel has attached to a cgroup (BPF_PROG_QUERY), rather than what this process
//! remembers attaching: `status` lists the hooks found here, so one detached behind balance's
//! back (bpftool, a removed pin) shows; and `up` finds here another balancer's programs that
//! already serve one of its VIPs on the same cgroup, and refuses to add a second set.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use aya::maps::{HashMap, Map, MapData, MapInfo};

use crate::bpf::{Svc, SvcKey};
use crate::config::Service;

/// enum bpf_attach_type of each program (linux/bpf.h), by its name in the object.
pub fn attach_type(program: &str) -> Option<u32> {
    Some(match program {
        "tk_connect4" => 10,
        "tk_connect6" => 11,
        "tk_sendmsg4" => 14,
        "tk_sendmsg6" => 15,
        "tk_recvmsg4" => 19,
        "tk_recvmsg6" => 20,
        "tk_getpeername4" => 29,
        "tk_getpeername6" => 30,
        // cgroup/sock_release (BPF_CGROUP_INET_SOCK_RELEASE), for a program of that name.
        "tk_sock_release" => 34,
        _ => return None,
    })
}

/// union bpf_attr as BPF_PROG_QUERY reads and writes it (up to prog_attach_flags).
#[repr(C)]
#[derive(Default)]
struct Query {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
}

/// The ids of the programs attached to the cgroup `cg` at `attach_type` (its own, not its
/// ancestors'). A cgroup takes at most 64 per type (BPF_CGROUP_MAX_PROGS).
pub fn prog_ids(cg: BorrowedFd<'_>, attach_type: u32) -> io::Result<Vec<u32>> {
    const BPF_PROG_QUERY: libc::c_long = 16;
    let mut ids = [0u32; 64];
    let mut q = Query {
        target_fd: cg.as_raw_fd() as u32,
        attach_type,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: ids.len() as u32,
        ..Query::default()
    };
    // SAFETY: bpf(2) reads and writes `q` (of the size given) and writes at most prog_cnt ids
    // into `ids`, both alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &raw mut q,
            std::mem::size_of::<Query>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ids[..(q.prog_cnt as usize).min(ids.len())].to_vec())
}

/// Another balancer on this cgroup already serving a VIP of `services`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    pub vip: SocketAddr,
    /// Its connect program.
    pub prog_id: u32,
}

/// The first VIP of `services` that a tcpkit balancer attached to `cg` (its tk_connect4/6
/// programs, found by the kernel's query, less those in `adopting`: the pinned balancer this
/// `up` takes over) already has in its services map.
pub fn serving(
    cg: BorrowedFd<'_>,
    services: &[Service],
    adopting: &HashSet<u32>,
) -> io::Result<Option<Serving>> {
    let mut ids = HashSet::new();
    for name in ["tk_connect4", "tk_connect6"] {
        let t = attach_type(name).unwrap_or_default();
        ids.extend(
            prog_ids(cg, t)?
                .into_iter()
                .filter(|i| !adopting.contains(i)),
        );
    }
    if ids.is_empty() {
        return Ok(None);
    }
    for p in aya::programs::loaded_programs().flatten() {
        let ours = matches!(p.name_as_str(), Some("tk_connect4" | "tk_connect6"));
        if !ours || !ids.contains(&p.id()) {
            continue;
        }
        let Ok(Some(maps)) = p.map_ids() else {
            continue;
        };
        for m in maps {
            if !MapInfo::from_id(m).is_ok_and(|i| i.name_as_str() == Some("services")) {
                continue;
            }
            // Another build's map of another shape cannot be read as ours: not counted.
            let Ok(map) = MapData::from_id(m).and_then(Map::from_map_data) else {
                continue;
            };
            let Ok(svcs) = HashMap::<MapData, SvcKey, Svc>::try_from(map) else {
                continue;
            };
            for s in services {
                if crate::loader::Balancer::keys(s)
                    .iter()
                    .any(|k| svcs.get(k, 0).is_ok())
                {
                    return Ok(Some(Serving {
                        vip: s.vip,
                        prog_id: p.id(),
                    }));
                }
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_has_its_attach_type() {
        // hooks() asks the kernel per attach type: a program without one would never be
        // listed as attached.
        for p in crate::loader::PROGRAMS {
            assert!(attach_type(p).is_some(), "{p}");
        }
    }
}
