//! The cgroup v2 a run lives in: found wherever the host mounts cgroup2 (`/sys/fs/cgroup`,
//! `/sys/fs/cgroup/unified`, ...), or, where none is visible (under `ip netns exec`, which
//! remounts /sys), mounted by this process in a private mount namespace of its own. A run's
//! cgroup is a fresh child of this process's own cgroup, removed at the end; children left by
//! runs that were killed are swept by the next run.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Prefix of the cgroups runs create: `tcpkit-balance.<pid>`.
pub const CHILD_PREFIX: &str = "tcpkit-balance.";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("no cgroup v2 line (0::) in /proc/self/cgroup: this host has no cgroup v2 hierarchy")]
    NoUnified,
    /// The cgroup as given, and where the hierarchy is mounted (None: privately, a directory
    /// the user cannot see).
    #[error("--cgroup {0}: no such cgroup (neither a cgroup v2 directory nor a path {where_})", where_ = in_hierarchy(.1.as_deref()))]
    Unknown(String, Option<String>),
}

fn in_hierarchy(mount: Option<&str>) -> String {
    match mount {
        Some(m) => format!("under the hierarchy mounted at {m}"),
        None => "in the cgroup v2 hierarchy as /proc/PID/cgroup shows it".into(),
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> CgroupError {
    let what = what.into();
    move |source| CgroupError::Io { what, source }
}

/// Where cgroup2 is mounted in this mount namespace, from /proc/self/mountinfo.
pub fn find_mount() -> Result<Option<PathBuf>, CgroupError> {
    let info =
        fs::read_to_string("/proc/self/mountinfo").map_err(io_err("read /proc/self/mountinfo"))?;
    Ok(mount_in(&info))
}

/// The first cgroup2 mount point in a mountinfo text. Its root must be the hierarchy's root
/// (`/`), else paths from /proc/self/cgroup would not be found under it.
pub fn mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split(' ').next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = pre.split(' ').collect();
        let (root, point) = (f.get(3)?, f.get(4)?);
        (*root == "/").then(|| PathBuf::from(unescape(point)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup `up --cgroup` names: a cgroup v2 directory as given (`/sys/fs/cgroup/x.slice`),
/// or else a path in the hierarchy as /proc/PID/cgroup shows it (`/x.slice`), under `mount`
/// (which is how it is found under `ip netns exec`, where the host's mount is not visible).
/// None: the hierarchy's root, every process of the host. `private`: `mount` is a private
/// mount of this process's own, not named in errors.
pub fn resolve(given: Option<&str>, mount: &Path, private: bool) -> Result<PathBuf, CgroupError> {
    let Some(g) = given else {
        return Ok(mount.to_path_buf());
    };
    let as_given = Path::new(g);
    if as_given.join("cgroup.procs").is_file() {
        return Ok(as_given.to_path_buf());
    }
    let under = mount.join(g.trim_start_matches('/'));
    if under.join("cgroup.procs").is_file() {
        return Ok(under);
    }
    Err(CgroupError::Unknown(
        g.to_string(),
        (!private).then(|| mount.display().to_string()),
    ))
}

/// This process's cgroup v2 path (relative to the hierarchy's root), from /proc/self/cgroup.
pub fn own_path() -> Result<String, CgroupError> {
    let text = fs::read_to_string("/proc/self/cgroup").map_err(io_err("read /proc/self/cgroup"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
        .ok_or(CgroupError::NoUnified)
}

/// A cgroup2 mount made by this process because none was visible: in a mount namespace of
/// this process's own (private propagation, so the host never sees it), on a directory
/// removed again at the end.
#[derive(Debug)]
pub struct PrivateMount {
    pub dir: PathBuf,
}

impl PrivateMount {
    /// Must run before this process starts any thread (unshare(CLONE_NEWNS) needs that).
    pub fn new() -> Result<PrivateMount, CgroupError> {
        use nix::mount::{mount, MsFlags};
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| io_err("unshare(CLONE_NEWNS)")(e.into()))?;
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|e| io_err("mount --make-rprivate /")(e.into()))?;
        sweep_mount_dirs(&std::env::temp_dir());
        let dir = std::env::temp_dir().join(format!("{MOUNT_PREFIX}{}", std::process::id()));
        fs::create_dir_all(&dir).map_err(io_err(format!("mkdir {}", dir.display())))?;
        if let Err(e) = mount(
            Some("cgroup2"),
            &dir,
            Some("cgroup2"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        ) {
            let _ = fs::remove_dir(&dir);
            return Err(io_err(format!(
                "mount -t cgroup2 cgroup2 {}",
                dir.display()
            ))(e.into()));
        }
        Ok(PrivateMount { dir })
    }
}

impl Drop for PrivateMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Prefix of the directories private mounts are made on: `tcpkit-balance-cgroup2.<pid>`.
pub const MOUNT_PREFIX: &str = "tcpkit-balance-cgroup2.";

/// Removes the empty mount directories left by balance processes that were killed (SIGKILL
/// gives no chance to remove them; their mounts went with their mount namespaces).
fn sweep_mount_dirs(tmp: &Path) {
    let Ok(dir) = fs::read_dir(tmp) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(MOUNT_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            // remove_dir, not remove_dir_all: only an empty directory goes.
            let _ = fs::remove_dir(e.path());
        }
    }
}

/// A cgroup this process created; [`Child::remove`] ends what is left in it and removes it.
#[derive(Debug)]
pub struct Child {
    pub path: PathBuf,
    removed: bool,
}

impl Child {
    /// Creates `<parent>/tcpkit-balance.<pid>`, first sweeping empty ones left by runs
    /// whose process is gone.
    pub fn create(parent: &Path) -> Result<Child, CgroupError> {
        sweep(parent);
        let path = parent.join(format!("{CHILD_PREFIX}{}", std::process::id()));
        fs::create_dir(&path).map_err(io_err(format!("mkdir {}", path.display())))?;
        Ok(Child {
            path,
            removed: false,
        })
    }

    /// The file a process writes its pid (or 0, itself) into to join this cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// Whether any process is left in the cgroup (cgroup.events: `populated`).
    pub fn populated(&self) -> bool {
        fs::read_to_string(self.path.join("cgroup.events"))
            .map(|t| t.lines().any(|l| l == "populated 1"))
            .unwrap_or(false)
    }

    /// Kills whatever the command left running in the cgroup (cgroup.kill), waits up to 2 s for
    /// it to empty, and removes it.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.removed = true;
        self.kill_and_remove()
    }

    fn kill_and_remove(&self) -> Result<(), CgroupError> {
        if self.populated() {
            let _ = fs::write(self.path.join("cgroup.kill"), "1");
            let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while self.populated() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        fs::remove_dir(&self.path).map_err(io_err(format!("rmdir {}", self.path.display())))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.kill_and_remove();
        }
    }
}

/// Removes `tcpkit-balance.<pid>` cgroups under `parent` whose pid is not running (a run
/// killed by SIGKILL leaves its empty cgroup behind; its BPF links died with it).
fn sweep(parent: &Path) {
    let Ok(dir) = fs::read_dir(parent) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(CHILD_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            // Fails harmlessly (EBUSY) while processes are still inside.
            let _ = fs::remove_dir(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_mount_dirs_of_dead_pids_are_swept() {
        let tmp = std::env::temp_dir().join(format!("tcpkit-sweep-test.{}", std::process::id()));
        fs::create_dir_all(&tmp).unwrap();
        // Above any pid_max (2^22): never a running process.
        let dead = tmp.join(format!("{MOUNT_PREFIX}999999999"));
        let full = tmp.join(format!("{MOUNT_PREFIX}999999998"));
        let alive = tmp.join(format!("{MOUNT_PREFIX}{}", std::process::id()));
        for d in [&dead, &full, &alive] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(full.join("x"), "").unwrap();
        sweep_mount_dirs(&tmp);
        let left = (dead.exists(), full.exists(), alive.exists());
        fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(
            left,
            (false, true, true),
            "only the empty one of a dead pid goes"
        );
    }

    #[test]
    fn finds_cgroup2_in_a_hybrid_mountinfo() {
        let info = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                    32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            mount_in(info),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn skips_a_bind_mount_of_a_subtree_and_unescapes() {
        let info = "50 1 0:38 /sub /mnt/x rw - cgroup2 cgroup2 rw\n\
                    51 1 0:38 / /mnt/with\\040space rw - cgroup2 cgroup2 rw\n";
        assert_eq!(mount_in(info), Some(PathBuf::from("/mnt/with space")));
        assert_eq!(mount_in("1 0 0:1 / / rw - ext4 /dev/sda rw\n"), None);
    }
}
