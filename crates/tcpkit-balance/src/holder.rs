//! Who holds what, read from /proc: the process holding the lock on a pin directory
//! (/proc/locks), the process holding a BPF program (its descriptors' fdinfo), and that
//! process's control socket (its listening unix socket, /proc/PID/net/unix). A refusal names
//! the `balance up` to stop or ask (`pid 4242, control socket /run/tcpkit/balance.sock`)
//! instead of a command that would pull the balancing from under it.

use std::fs;
use std::path::Path;

/// `pid N, control socket PATH` (or `pid N` when it has none we can see).
pub fn describe(pid: u32) -> String {
    match control_socket(pid) {
        Some(s) => format!("pid {pid}, control socket {s}"),
        None => format!("pid {pid}"),
    }
}

/// The process holding a flock(2) on the file or directory `path`, from /proc/locks
/// (`1: FLOCK  ADVISORY  WRITE 4242 00:27:33943885 0 EOF`: the device as hex major:minor).
pub fn flock_holder(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).ok()?;
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    );
    locks_holder(&fs::read_to_string("/proc/locks").ok()?, &want)
}

/// The pid of the FLOCK entry on `dev_ino` (`MAJ:MIN:INODE`) in a /proc/locks text; waiters
/// (`->`) are not holders.
fn locks_holder(locks: &str, dev_ino: &str) -> Option<u32> {
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&dev_ino))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// A process with a descriptor of BPF program `id` (a program's or a link's fdinfo names
/// `prog_id`), other than this one.
pub fn prog_holder(id: u32) -> Option<u32> {
    let me = std::process::id();
    let want = format!("prog_id:\t{id}");
    fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
        let pid: u32 = p.file_name().to_str()?.parse().ok()?;
        if pid == me {
            return None;
        }
        let fds = fs::read_dir(p.path().join("fdinfo")).ok()?;
        fds.flatten()
            .any(|fd| fs::read_to_string(fd.path()).is_ok_and(|t| t.lines().any(|l| l == want)))
            .then_some(pid)
    })
}

/// The path of a listening unix socket `pid` holds (a `balance up` has one: its control
/// socket), from its network namespace's /proc/PID/net/unix.
pub fn control_socket(pid: u32) -> Option<String> {
    let inodes: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| {
            let t = fs::read_link(fd.path()).ok()?;
            let t = t.to_str()?;
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let table = fs::read_to_string(format!("/proc/{pid}/net/unix")).ok()?;
    listening_path(&table, &inodes)
}

/// In a /proc/net/unix text (`Num RefCount Protocol Flags Type St Inode Path`), the path of
/// the first listening socket (flag __SO_ACCEPTCON, 0x10000) among `inodes`.
fn listening_path(table: &str, inodes: &[String]) -> Option<String> {
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
        let (inode, path) = (f.get(6)?, f.get(7)?);
        (flags & 0x10000 != 0 && inodes.iter().any(|i| i == inode) && path.starts_with('/'))
            .then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_flock_holder_and_not_a_waiter() {
        let locks = "1: FLOCK  ADVISORY  WRITE 8620 00:27:33943885 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 9000 00:27:33943885 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 77 00:27:5 0 EOF\n";
        assert_eq!(locks_holder(locks, "00:27:33943885"), Some(8620));
        assert_eq!(locks_holder(locks, "00:27:5"), None);
        assert_eq!(locks_holder(locks, "00:28:33943885"), None);
    }

    #[test]
    fn finds_the_listening_socket_with_a_path() {
        let t = "Num       RefCount Protocol Flags    Type St Inode Path\n\
                 0000000000000000: 00000002 00000000 00010000 0001 01 5001 /run/tcpkit/balance.sock\n\
                 0000000000000000: 00000002 00000000 00000000 0001 03 5002 /run/other.sock\n\
                 0000000000000000: 00000002 00000000 00010000 0001 01 5003 @abstract\n";
        let ins = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            listening_path(t, &ins(&["5002", "5001"])).as_deref(),
            Some("/run/tcpkit/balance.sock")
        );
        assert_eq!(listening_path(t, &ins(&["5002", "5003"])), None);
    }

    #[test]
    fn this_process_holds_its_own_flock() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let f = fs::File::open(dir.path()).unwrap();
        // SAFETY: flock(2) on a descriptor we own.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert_eq!(flock_holder(dir.path()), Some(std::process::id()));
    }
}
