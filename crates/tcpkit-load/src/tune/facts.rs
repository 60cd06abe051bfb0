//! The limits as they are now: sysctls under `/proc/sys` (of this process's namespaces),
//! this process's `RLIMIT_NOFILE`, whether it holds `CAP_SYS_RESOURCE`, cores and memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tcpkit_host as host;

/// Where the kernel shows sysctls.
pub const PROC_SYS: &str = "/proc/sys";

/// Every sysctl the checks read. `net.*` entries are per network namespace, except
/// `net.ipv4.tcp_mem` and `net.core.netdev_max_backlog` (host-wide, absent inside a
/// namespace) and `net.netfilter.nf_conntrack_max` (host-wide, read-only inside one).
pub const SYSCTLS: &[&str] = &[
    "fs.nr_open",
    "fs.file-max",
    "fs.file-nr",
    "net.core.somaxconn",
    "net.core.netdev_max_backlog",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_tw_reuse",
    "net.ipv4.tcp_mem",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_count",
];

/// `CAP_SYS_RESOURCE`'s bit in the capability sets (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;

/// A snapshot of the limits; [`super::evaluate`] judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// RLIMIT_NOFILE of this process (`u64::MAX`: unlimited).
    pub nofile_soft: u64,
    pub nofile_hard: u64,
    /// May this process (and so the shell it came from) raise its hard limit?
    pub cap_sys_resource: bool,
    /// Cores, for the descriptors a process keeps for itself (per-thread epoll and timers).
    pub cores: usize,
    pub page_size: u64,
    /// MemTotal in pages, when /proc/meminfo says.
    pub mem_pages: Option<u64>,
    /// Sysctl values that could be read (whitespace runs folded to one space); a key
    /// missing here is not shown in this namespace (or its module is not loaded).
    pub sysctl: BTreeMap<String, String>,
}

/// `key` under `root`: `net.core.somaxconn` → `<root>/net/core/somaxconn`.
pub fn sysctl_path(root: &Path, key: &str) -> PathBuf {
    root.join(key.replace('.', "/"))
}

/// A limit as people write it (`ulimit -n` says "unlimited" too).
pub fn limit_text(v: u64) -> String {
    if v == u64::MAX {
        "unlimited".into()
    } else {
        v.to_string()
    }
}

impl Facts {
    /// Reads everything from the running system, sysctls from under `root` (normally
    /// [`PROC_SYS`]). What cannot be read is left out, never guessed.
    pub fn read(root: &Path) -> Facts {
        let sysctl = SYSCTLS
            .iter()
            .filter_map(|k| {
                let v = std::fs::read_to_string(sysctl_path(root, k)).ok()?;
                Some((k.to_string(), fold(&v)))
            })
            .collect();
        let (nofile_soft, nofile_hard) = nofile();
        let page_size = host::page_size();
        Facts {
            nofile_soft,
            nofile_hard,
            cap_sys_resource: host::has_capability(CAP_SYS_RESOURCE).unwrap_or(false),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            page_size,
            mem_pages: host::mem_total().map(|b| b / page_size),
            sysctl,
        }
    }

    /// A sysctl's value, if it could be read.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.sysctl.get(key).map(String::as_str)
    }

    /// A sysctl's whitespace-separated numbers; `None` if unreadable or not numbers.
    pub fn numbers(&self, key: &str) -> Option<Vec<u64>> {
        self.get(key)?
            .split_whitespace()
            .map(|t| t.parse::<u64>().ok())
            .collect()
    }

    /// A one-number sysctl.
    pub fn number(&self, key: &str) -> Option<u64> {
        match self.numbers(key)?.as_slice() {
            [v] => Some(*v),
            _ => None,
        }
    }

    /// `net.ipv4.ip_local_port_range` as (low, high), when it makes sense.
    pub fn port_range(&self) -> Option<(u16, u16)> {
        match self.numbers("net.ipv4.ip_local_port_range")?.as_slice() {
            [lo, hi] => {
                let (lo, hi) = (u16::try_from(*lo).ok()?, u16::try_from(*hi).ok()?);
                (lo <= hi).then_some((lo, hi))
            }
            _ => None,
        }
    }

    /// Fixed facts for tests: a 2-core host with 4 KiB pages and 24 GiB, limits 20000/20000
    /// without CAP_SYS_RESOURCE (this machine's container), and the sysctls given.
    #[cfg(test)]
    pub(crate) fn fixture(sysctls: &[(&str, &str)]) -> Facts {
        Facts {
            nofile_soft: 20_000,
            nofile_hard: 20_000,
            cap_sys_resource: false,
            cores: 2,
            page_size: 4096,
            mem_pages: Some(24 * 1024 * 1024 / 4),
            sysctl: sysctls
                .iter()
                .map(|(k, v)| (k.to_string(), fold(v)))
                .collect(),
        }
    }
}

/// "4096\t131072\t6291456\n" → "4096 131072 6291456".
fn fold(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn nofile() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; the resource id is valid.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return (0, 0);
    }
    let conv = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            v
        }
    };
    (conv(lim.rlim_cur), conv(lim.rlim_max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sysctls_under_a_root_and_leaves_out_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        for (k, v) in [
            ("net.ipv4.ip_local_port_range", "32768\t60999\n"),
            ("net.core.somaxconn", "4096\n"),
            ("net.ipv4.tcp_mem", "garbage here\n"),
        ] {
            let p = sysctl_path(dir.path(), k);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
        let f = Facts::read(dir.path());
        assert_eq!(f.get("net.ipv4.ip_local_port_range"), Some("32768 60999"));
        assert_eq!(f.port_range(), Some((32768, 60999)));
        assert_eq!(f.number("net.core.somaxconn"), Some(4096));
        assert_eq!(f.numbers("net.ipv4.tcp_mem"), None);
        assert_eq!(f.get("fs.nr_open"), None);
        assert_eq!(f.sysctl.len(), 3);
    }

    #[test]
    fn port_range_rejects_nonsense() {
        let r = |v| Facts::fixture(&[("net.ipv4.ip_local_port_range", v)]).port_range();
        assert_eq!(r("1024 65535"), Some((1024, 65535)));
        assert_eq!(r("60000 50000"), None);
        assert_eq!(r("1 70000"), None);
        assert_eq!(r("5"), None);
    }

    #[test]
    fn limits_print_as_ulimit_does() {
        assert_eq!(limit_text(20_000), "20000");
        assert_eq!(limit_text(u64::MAX), "unlimited");
    }
}
