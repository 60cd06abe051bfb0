//! `--pin DIR`: the links and maps of `balance up` pinned on a bpf filesystem, so the
//! balancing outlives the process (an upgrade, a crash); `balance down --pin DIR` removes the
//! pins, and with the last reference the kernel detaches the programs and frees the maps.
//! An `up --pin` on a directory that holds the pins of an `up` that has ended adopts them
//! (`adopt`: the sets are read back from the maps and the programs swapped into the links),
//! so an upgrade (stop the old `up`, start the new one with the same flags) drops no connect
//! and needs no `down`.
//!
//! The `up` that pins holds an exclusive flock(2) on DIR for as long as it runs, so `down`
//! (and a second `up`) can tell pins in use from pins left behind, and name the process: the
//! lock goes with the process however it ends (SIGKILL included), the pins stay. DIR must be
//! on a bpf filesystem that outlives the process: one mounted inside `ip netns exec` (which
//! mounts /sys afresh in a mount namespace of that command's own) goes with the namespace,
//! pins and all, so it is refused.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Where `balance down` looks without --pin (and what the README suggests for `up`).
pub const DEFAULT_DIR: &str = "/sys/fs/bpf/tcpkit/balance";

/// Where to mount a bpf filesystem that `ip netns exec` does not hide (it mounts its own /sys).
pub const OUTSIDE_MOUNT: &str = "/run/tcpkit/bpf";

/// statfs(2) f_type of a bpf filesystem (linux/magic.h BPF_FS_MAGIC).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("--pin {0}: not on a bpf filesystem ({1})")]
    NotBpffs(String, String),
    #[error("--pin {0}: holds {1}, which is no balancer's pin (give a directory of its own)")]
    Taken(String, String),
    #[error("--pin {0}: in use by a running balance up ({1}): stop that one first")]
    Held(String, String),
    #[error("--pin {0}: the bpf filesystem there is mounted only in this process's mount namespace (as one mounted under ip netns exec, whose /sys is its own) and the pins would go with it: mount one outside first (mkdir -p {OUTSIDE_MOUNT} && mount -t bpf bpf {OUTSIDE_MOUNT}, before ip netns exec) and pin under it (--pin {OUTSIDE_MOUNT}/balance)")]
    Private(String),
    #[error("--pin {0}: nothing pinned there")]
    Nothing(String),
    #[error("--pin {0}: {1}")]
    Io(String, #[source] std::io::Error),
}

fn on_bpffs(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) on a NUL-terminated path into a zeroed struct of the right type.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::statfs(c.as_ptr(), &raw mut s) };
    r == 0 && s.f_type as i64 == BPF_FS_MAGIC
}

/// The nearest existing directory at or above `dir`.
fn existing(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|a| a.exists())
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

/// A mountinfo text's mounts as (major:minor, mount point, fs type).
fn mounts(info: &str) -> impl Iterator<Item = (&str, &str, &str)> {
    info.lines().filter_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let f: Vec<&str> = pre.split(' ').collect();
        Some((*f.get(2)?, *f.get(4)?, post.split(' ').next()?))
    })
}

/// The device of the mount at `point` in a mountinfo text.
fn device_at<'a>(info: &'a str, point: &str) -> Option<&'a str> {
    mounts(info)
        .filter(|(_, p, _)| *p == point)
        .last()
        .map(|(d, _, _)| d)
}

/// Whether this process's /sys is not pid 1's (`ip netns exec` mounts a fresh one), so
/// /sys/fs/bpf here is not the host's.
fn own_sys() -> bool {
    let (Ok(mine), Ok(init)) = (
        std::fs::read_to_string("/proc/self/mountinfo"),
        std::fs::read_to_string("/proc/1/mountinfo"),
    ) else {
        return false;
    };
    device_at(&mine, "/sys") != device_at(&init, "/sys")
}

/// What to mount, as the NotBpffs error says it.
fn mount_hint() -> String {
    if own_sys() {
        format!(
            "this /sys is ip netns exec's own: mkdir -p {OUTSIDE_MOUNT} && mount -t bpf bpf {OUTSIDE_MOUNT} before ip netns exec, and --pin {OUTSIDE_MOUNT}/balance"
        )
    } else {
        "mount -t bpf bpf /sys/fs/bpf".into()
    }
}

/// Whether the bpf filesystem holding `at` is also mounted in pid 1's mount namespace, which
/// outlives this process; one mounted only in a namespace of this command's own (under
/// `ip netns exec`) is unmounted with it and the pins freed. Unknown (pid 1's mounts not
/// readable): taken as yes.
fn outlives(at: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(m), Ok(init)) = (
        std::fs::metadata(at),
        std::fs::read_to_string("/proc/1/mountinfo"),
    ) else {
        return true;
    };
    let dev = format!("{}:{}", libc::major(m.dev()), libc::minor(m.dev()));
    // Bound first: as the tail expression the iterator would outlive `init`.
    let found = mounts(&init).any(|(d, _, fs)| fs == "bpf" && d == dev);
    found
}

/// Takes the exclusive lock on the directory `f` without waiting: false when another
/// process holds it.
fn try_lock(f: &File, shown: &str) -> Result<bool, PinError> {
    // SAFETY: flock(2) on a descriptor this function borrows.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(PinError::Io(shown.to_string(), e))
}

/// The refusal for pins a running `up` holds.
fn held(dir: &Path, shown: String) -> PinError {
    let who = crate::holder::flock_holder(dir)
        .map_or_else(|| "pid unknown".to_string(), crate::holder::describe);
    PinError::Held(shown, who)
}

/// A pin directory this process holds (locked) while its `up` runs; on drop the lock goes and
/// so do the directories [`prepare`] made, unless they hold pins.
#[derive(Debug)]
pub struct PinLock {
    /// Holds the flock: `down` and other `up`s see this process in /proc/locks.
    lock: File,
    /// The directories `prepare` created, the deepest first.
    made: Vec<PathBuf>,
    /// The directory held pins already (of an `up` that has ended): adopt them.
    pub adopt: bool,
}

impl Drop for PinLock {
    fn drop(&mut self) {
        // remove_dir: only an empty directory goes, never one with pins.
        for d in &self.made {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Checks `dir` can take pins (on a bpffs that outlives this process; absent, empty, or
/// holding only a balancer's pins, which are then to be adopted), makes it, and locks it for
/// as long as the [`PinLock`] lives.
pub fn prepare(dir: &Path) -> Result<PinLock, PinError> {
    let shown = dir.display().to_string();
    let base = existing(dir);
    if !on_bpffs(&base) {
        return Err(PinError::NotBpffs(shown, mount_hint()));
    }
    if !outlives(&base) {
        return Err(PinError::Private(shown));
    }
    let made: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.exists())
        .map(Path::to_path_buf)
        .collect();
    std::fs::create_dir_all(dir).map_err(|e| PinError::Io(shown.clone(), e))?;
    let f = File::open(dir).map_err(|e| PinError::Io(shown.clone(), e))?;
    let mut pins = PinLock {
        lock: f,
        made,
        adopt: false,
    };
    if !try_lock(&pins.lock, &shown)? {
        return Err(held(dir, shown));
    }
    for e in std::fs::read_dir(dir).map_err(|e| PinError::Io(shown.clone(), e))? {
        let name = e
            .map_err(|e| PinError::Io(shown.clone(), e))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if !name.starts_with("link_") && !name.starts_with("map_") {
            return Err(PinError::Taken(shown, name));
        }
        pins.adopt = true;
    }
    Ok(pins)
}

/// `balance down`: removes the pins under `dir` (`link_*`, `map_*`) and the directory; how
/// many. Refused while the `up` that pinned them runs (it holds the directory's lock).
pub fn down(dir: &Path) -> Result<usize, PinError> {
    let shown = dir.display().to_string();
    if !dir.exists() {
        return Err(PinError::Nothing(shown));
    }
    if !on_bpffs(dir) {
        return Err(PinError::NotBpffs(shown, mount_hint()));
    }
    let f = File::open(dir).map_err(|e| PinError::Io(shown.clone(), e))?;
    if !try_lock(&f, &shown)? {
        return Err(held(dir, shown));
    }
    remove(dir)
}

/// Removes the pins under `dir` and the directory (no lock taken: the caller holds it).
pub fn remove(dir: &Path) -> Result<usize, PinError> {
    let shown = dir.display().to_string();
    let mut n = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| PinError::Io(shown.clone(), e))?;
    for e in entries {
        let e = e.map_err(|e| PinError::Io(shown.clone(), e))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        // A link is detached now, not when the kernel gets round to freeing its pin's inode:
        // `down` returns with the programs off the cgroup. The maps go with the programs.
        let link = name.starts_with("link_");
        if link || name.starts_with("map_") {
            if !link || crate::loader::detach_pinned(&e.path()).is_err() {
                // A map, or a link that cannot be detached so (or is already): the pin goes,
                // and the link with it in time.
                std::fs::remove_file(e.path()).map_err(|e| PinError::Io(shown.clone(), e))?;
            }
            n += 1;
        }
    }
    if n == 0 {
        return Err(PinError::Nothing(shown));
    }
    std::fs::remove_dir(dir).map_err(|e| PinError::Io(shown, e))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_mount_by_point_and_its_device() {
        let info = "23 27 0:22 / /sys rw,relatime - sysfs sysfs rw\n\
                    50 23 0:40 / /sys/fs/bpf rw - bpf bpf rw\n\
                    49 46 0:39 / /sys rw,relatime - sysfs tkx rw\n";
        assert_eq!(
            device_at(info, "/sys"),
            Some("0:39"),
            "the last mount on top"
        );
        let bpf: Vec<_> = mounts(info).filter(|m| m.2 == "bpf").collect();
        assert_eq!(bpf, [("0:40", "/sys/fs/bpf", "bpf")]);
    }
}
