//! `--pin DIR`: the links and maps of `balance up` pinned on a bpf filesystem, so the
//! balancing outlives the process (an upgrade, a crash); `balance down --pin DIR` removes the
//! pins, and with the last reference the kernel detaches the programs and frees the maps.
//! An `up --pin` on a directory that already holds pins refuses (one line naming `down`)
//! rather than adopting them: the running set would have to be read back from the maps, and
//! a half-adopted balancer is worse than a clear refusal.

use std::path::{Path, PathBuf};

/// Where `balance down` looks without --pin (and what the README suggests for `up`).
pub const DEFAULT_DIR: &str = "/sys/fs/bpf/tcpkit/balance";

/// statfs(2) f_type of a bpf filesystem (linux/magic.h BPF_FS_MAGIC).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("--pin {0}: not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf)")]
    NotBpffs(String),
    #[error("--pin {0}: holds a pinned balancer already (tcpkit balance down --pin {0} first)")]
    Taken(String),
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

/// Checks `dir` can take new pins (on bpffs, empty or absent) and makes it.
pub fn prepare(dir: &Path) -> Result<(), PinError> {
    let shown = dir.display().to_string();
    if !on_bpffs(&existing(dir)) {
        return Err(PinError::NotBpffs(shown));
    }
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(|e| PinError::Io(shown.clone(), e))?;
        if entries.next().is_some() {
            return Err(PinError::Taken(shown));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| PinError::Io(shown, e))
}

/// Removes the pins under `dir` (`link_*`, `map_*`) and the directory; how many.
pub fn down(dir: &Path) -> Result<usize, PinError> {
    let shown = dir.display().to_string();
    if !dir.exists() {
        return Err(PinError::Nothing(shown));
    }
    if !on_bpffs(dir) {
        return Err(PinError::NotBpffs(shown));
    }
    let mut n = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| PinError::Io(shown.clone(), e))?;
    for e in entries {
        let e = e.map_err(|e| PinError::Io(shown.clone(), e))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        // Links first would be nicer, but the order does not matter: the programs hold the
        // maps, and the links go with their last pin.
        if name.starts_with("link_") || name.starts_with("map_") {
            std::fs::remove_file(e.path()).map_err(|e| PinError::Io(shown.clone(), e))?;
            n += 1;
        }
    }
    if n == 0 {
        return Err(PinError::Nothing(shown));
    }
    std::fs::remove_dir(dir).map_err(|e| PinError::Io(shown, e))?;
    Ok(n)
}
