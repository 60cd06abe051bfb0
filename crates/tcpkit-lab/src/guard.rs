//! What a test makes outside the lab's namespaces and must not leave behind: a cgroup of its
//! own under the host's cgroup2, a bpf filesystem mounted for it, a child process it started.
//! Each is removed on drop, also after a panic. A cleanup that fails panics, so the test fails
//! instead of passing with something left on the host (as aya's test helpers do); when the
//! test is already panicking it is said on stderr instead, since a second panic would abort
//! the process and hide the first.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::LabError;

/// How long a cgroup's processes get to die once `cgroup.kill` is written.
const CGROUP_KILL_WAIT: Duration = Duration::from_secs(10);

fn cleanup_failed(what: &str) {
    if std::thread::panicking() {
        eprintln!("tcpkit-lab: {what} (while the test was panicking)");
    } else {
        panic!("tcpkit-lab: {what}");
    }
}

/// A cgroup of the test's own, `/tcpkit-test-<tag>.<pid>.<n>` under a cgroup2 hierarchy, so
/// the test can move a process into it. On drop its processes are killed (`cgroup.kill`) and
/// it is removed.
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
    rel: String,
}

impl Cgroup {
    /// Creates it under the cgroup2 hierarchy mounted at `mount` (whose root must be the
    /// hierarchy's root, as on a host with cgroup2 mounted at /sys/fs/cgroup).
    pub fn new(mount: &Path, tag: &str) -> Result<Cgroup, LabError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let rel = format!(
            "/tcpkit-test-{tag}.{}.{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let path = mount.join(rel.trim_start_matches('/'));
        std::fs::create_dir(&path)
            .map_err(|e| LabError::io(format!("mkdir {}", path.display()), e))?;
        Ok(Cgroup { path, rel })
    }

    /// Where this process sees it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its path in the hierarchy (`/tcpkit-test-...`): the same from any mount of it, so also
    /// under `ip netns exec`, which mounts cgroup2 afresh.
    pub fn rel(&self) -> &str {
        &self.rel
    }

    /// Moves process `pid` into it.
    pub fn join(&self, pid: u32) -> Result<(), LabError> {
        let procs = self.path.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .map_err(|e| LabError::io(format!("write {pid} to {}", procs.display()), e))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Fails only when it is empty already (or the kernel predates cgroup.kill, 5.14).
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        let until = Instant::now() + CGROUP_KILL_WAIT;
        // rmdir fails with EBUSY until the killed processes have exited.
        while let Err(e) = std::fs::remove_dir(&self.path) {
            if Instant::now() >= until {
                cleanup_failed(&format!(
                    "cgroup {} not removed {CGROUP_KILL_WAIT:?} after cgroup.kill: {e}",
                    self.path.display()
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A bpf filesystem mounted for one test at `<under>/bpffs`, for a host without one at
/// /sys/fs/bpf or a test that must not share it. On drop what is pinned in it is unpinned
/// and it is unmounted.
#[derive(Debug)]
pub struct Bpffs {
    mount: PathBuf,
}

impl Bpffs {
    /// Mounts it at `<under>/bpffs` (`under` is typically the lab's [`dir`](crate::Lab::dir)).
    pub fn mount(under: &Path) -> Result<Bpffs, LabError> {
        let mount = under.join("bpffs");
        std::fs::create_dir_all(&mount)
            .map_err(|e| LabError::io(format!("mkdir {}", mount.display()), e))?;
        let mut cmd = Command::new("mount");
        cmd.args(["-t", "bpf", "bpf"]).arg(&mount);
        crate::cmd::run(cmd)?;
        Ok(Bpffs { mount })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        // Unpinning releases what nothing else holds (an attached link goes with its pin);
        // the unmount then fails only if something is still open in it.
        let entries = std::fs::read_dir(&self.mount)
            .into_iter()
            .flatten()
            .flatten();
        for e in entries {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
        let mut cmd = Command::new("umount");
        cmd.arg(&self.mount);
        if let Err(e) = crate::cmd::run(cmd) {
            cleanup_failed(&format!(
                "bpffs {} not unmounted: {e}",
                self.mount.display()
            ));
        }
    }
}

/// A child process the test started itself (outside [`Lab::spawn`](crate::Lab::spawn), say
/// with its own pipes), killed and reaped on drop.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // kill is Ok for a child that has exited but is not yet reaped; wait reaps it.
        let pid = self.0.id();
        if let Err(e) = self.0.kill().and_then(|()| self.0.wait().map(drop)) {
            cleanup_failed(&format!("kill and reap child {pid}: {e}"));
        }
    }
}
