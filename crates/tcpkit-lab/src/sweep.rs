//! Namespace names and the sweep of leftovers.
//!
//! Every namespace the lab creates is named `tk<owner pid>x<counter><host name>`. The owner
//! pid in the name is what makes leftovers recognisable: when a test process is killed
//! (SIGKILL, OOM, a CI timeout) its `Drop` never runs, and the next lab, or CI, deletes the
//! namespaces whose owner is gone. Namespaces of live processes are never touched, so
//! concurrent test runs do not disturb each other.

use std::path::Path;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cmd;
use crate::LabError;

/// Prefix of every namespace the lab creates (the project's before-stop hook looks for it).
pub const NETNS_PREFIX: &str = "tk";

/// Where iproute2 keeps named namespaces.
pub(crate) const NETNS_DIR: &str = "/run/netns";

/// The namespace name for host `name`, number `counter`, created by process `pid`.
pub fn netns_name(pid: u32, counter: u64, name: &str) -> String {
    format!("{NETNS_PREFIX}{pid}x{counter}{name}")
}

/// The owner pid encoded in a lab namespace name, or None if `netns` is not named like one.
pub fn owner_pid(netns: &str) -> Option<u32> {
    let rest = netns.strip_prefix(NETNS_PREFIX)?;
    let digits_end = rest.find(|c: char| !c.is_ascii_digit())?;
    let (pid, after) = rest.split_at(digits_end);
    let after = after.strip_prefix('x')?;
    // The counter follows the 'x'; requiring it rejects names that merely start alike.
    if !after.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    pid.parse::<u32>().ok().filter(|&p| p > 0)
}

/// Whether a process with this pid exists (EPERM still means it exists).
fn pid_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    !matches!(kill(Pid::from_raw(raw), None), Err(Errno::ESRCH))
}

pub(crate) fn netns_exists(name: &str) -> bool {
    Path::new(NETNS_DIR).join(name).exists()
}

/// SIGKILLs every process whose network namespace is `name` (never this process).
pub(crate) fn kill_netns_pids(name: &str) -> Result<usize, LabError> {
    let out = cmd::run_args("ip", &["netns", "pids", name])?;
    let me = std::process::id();
    let mut n = 0;
    for pid in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if pid <= 0 || pid.unsigned_abs() == me {
            continue;
        }
        match kill(Pid::from_raw(pid), Signal::SIGKILL) {
            Ok(()) => n += 1,
            Err(Errno::ESRCH) => {}
            Err(e) => {
                return Err(LabError::io(
                    format!("kill({pid}, SIGKILL) in netns {name}"),
                    std::io::Error::from(e),
                ))
            }
        }
    }
    Ok(n)
}

/// Kills what runs in namespace `name` and deletes it. Both steps are attempted; the first
/// error is returned. A namespace that disappeared meanwhile (another sweeper) is success.
pub(crate) fn remove_netns(name: &str) -> Result<(), LabError> {
    let killed = kill_netns_pids(name);
    let deleted = match cmd::run_args("ip", &["netns", "del", name]) {
        Err(_) if !netns_exists(name) => Ok(()),
        r => r.map(drop),
    };
    match (killed, deleted) {
        (_, Err(e)) => Err(e),
        (Err(e), Ok(())) if netns_exists(name) => Err(e),
        _ => Ok(()),
    }
}

/// Deletes the lab namespaces left behind by processes that no longer exist, killing any
/// process still inside them first. Returns how many namespaces were deleted.
///
/// Every leftover is attempted; if some could not be deleted the first error is returned.
pub fn sweep_leftovers() -> Result<usize, LabError> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(LabError::io(format!("read {NETNS_DIR}"), e)),
    };
    let me = std::process::id();
    let mut removed = 0;
    let mut first_err = None;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = owner_pid(&name) else {
            continue;
        };
        if owner == me || pid_alive(owner) {
            continue;
        }
        match remove_netns(&name) {
            Ok(()) => removed += 1,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_round_trips_owner() {
        let n = netns_name(4242, 7, "client");
        assert_eq!(n, "tk4242x7client");
        assert_eq!(owner_pid(&n), Some(4242));
        // Host names that start with digits or 'x' do not confuse the parse.
        assert_eq!(owner_pid(&netns_name(9, 0, "x1")), Some(9));
    }

    #[test]
    fn foreign_names_have_no_owner() {
        for n in [
            "tk",
            "tkx1a",
            "tk12",
            "tk12a",
            "tk12x",
            "tk12xa",
            "tk0x1a",
            "ns1",
            "tkfoo",
            "tk99999999999x1",
        ] {
            assert_eq!(owner_pid(n), None, "{n}");
        }
    }

    #[test]
    fn own_pid_is_alive_and_absurd_pid_is_not() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(u32::MAX));
    }
}
