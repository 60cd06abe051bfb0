//! `--apply`: writes the sysctls that need a change under `/proc/sys`, reads each back, and
//! says for every other change why it was not made.

use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::Serialize;

use super::facts::sysctl_path;
use super::{Check, Fix, Status};

/// A change made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub setting: String,
    pub from: String,
    pub to: String,
    /// The command that does the same by hand.
    pub command: String,
}

/// A change that was not made, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotApplied {
    pub setting: String,
    pub reason: String,
}

/// Makes every CHANGE of `checks` that a write under `root` (normally `/proc/sys`) can make.
pub fn apply(checks: &[Check], root: &Path) -> (Vec<Applied>, Vec<NotApplied>) {
    let mut done = Vec::new();
    let mut not = Vec::new();
    for c in checks.iter().filter(|c| c.status == Status::Change) {
        let refuse = |reason: String| NotApplied {
            setting: c.setting.clone(),
            reason,
        };
        match &c.fix {
            Some(Fix::Sysctl { key, value }) => match write_sysctl(root, key, value) {
                Ok(()) => done.push(Applied {
                    setting: c.setting.clone(),
                    from: c.current.clone().unwrap_or_default(),
                    to: value.clone(),
                    command: c.command.clone().unwrap_or_default(),
                }),
                Err(reason) => not.push(refuse(reason)),
            },
            Some(Fix::Manual(reason)) => not.push(refuse(reason.clone())),
            None => not.push(refuse("no way to apply it is known".into())),
        }
    }
    (done, not)
}

/// Writes `value` to `key` and reads it back; Err is the reason in a user's words.
fn write_sysctl(root: &Path, key: &str, value: &str) -> Result<(), String> {
    let path = sysctl_path(root, key);
    let write = || -> io::Result<()> {
        // No create, no truncate: a sysctl file exists or the setting is not here.
        let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
        f.write_all(format!("{value}\n").as_bytes())
    };
    if let Err(e) = write() {
        return Err(match e.raw_os_error() {
            Some(libc::ENOENT) => "not shown in this network namespace: set it on the host".into(),
            Some(libc::EROFS) => {
                "/proc/sys is mounted read-only (a container): set it on the host".into()
            }
            Some(libc::EACCES | libc::EPERM) if read_only(&path) => {
                "read-only in this network namespace (a host-wide setting): set it on the host"
                    .into()
            }
            Some(libc::EACCES | libc::EPERM) => {
                format!("write {}: permission denied (run as root)", path.display())
            }
            Some(libc::EINVAL) => format!("the kernel refused {value} (EINVAL)"),
            _ => format!("write {}: {e}", path.display()),
        });
    }
    // The kernel may clamp a value it accepted; only what it kept counts as applied.
    let kept =
        std::fs::read_to_string(&path).map_err(|e| format!("read back {}: {e}", path.display()))?;
    let kept = kept.split_whitespace().collect::<Vec<_>>().join(" ");
    if kept != value {
        return Err(format!("the kernel kept {kept} instead of {value}"));
    }
    Ok(())
}

/// A sysctl file nobody may write (mode 0444), as host-wide ones look from a namespace.
fn read_only(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o222 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str, status: Status, fix: Option<Fix>) -> Check {
        Check {
            setting: key.into(),
            status,
            current: Some("128".into()),
            wanted: ">= 4096".into(),
            why: "w".into(),
            command: Some(format!("sysctl -w {key}=4096")),
            fix,
        }
    }

    fn sysctl(key: &str, value: &str) -> Option<Fix> {
        Some(Fix::Sysctl {
            key: key.into(),
            value: value.into(),
        })
    }

    #[test]
    fn writes_changes_only_and_explains_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mk = |key: &str, body: &str, mode: u32| {
            let p = sysctl_path(root, key);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        mk("net.core.somaxconn", "128\n", 0o644);
        mk("net.ipv4.tcp_max_syn_backlog", "128\n", 0o644);
        let checks = [
            check(
                "net.core.somaxconn",
                Status::Change,
                sysctl("net.core.somaxconn", "4096"),
            ),
            // OK lines are left alone even with a fix attached.
            check(
                "net.ipv4.tcp_max_syn_backlog",
                Status::Ok,
                sysctl("net.ipv4.tcp_max_syn_backlog", "9"),
            ),
            check(
                "net.ipv4.tcp_mem",
                Status::Change,
                sysctl("net.ipv4.tcp_mem", "1 2 3"),
            ),
            check(
                "RLIMIT_NOFILE (soft)",
                Status::Change,
                Some(Fix::Manual("run it in the shell".into())),
            ),
        ];
        let (done, not) = apply(&checks, root);
        assert_eq!(
            done,
            [Applied {
                setting: "net.core.somaxconn".into(),
                from: "128".into(),
                to: "4096".into(),
                command: "sysctl -w net.core.somaxconn=4096".into(),
            }]
        );
        let read = |k| std::fs::read_to_string(sysctl_path(root, k)).unwrap();
        assert_eq!(read("net.core.somaxconn"), "4096\n");
        assert_eq!(read("net.ipv4.tcp_max_syn_backlog"), "128\n");
        let reasons: Vec<(&str, &str)> = not
            .iter()
            .map(|n| (n.setting.as_str(), n.reason.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                (
                    "net.ipv4.tcp_mem",
                    "not shown in this network namespace: set it on the host"
                ),
                ("RLIMIT_NOFILE (soft)", "run it in the shell"),
            ]
        );
    }

    #[test]
    fn only_what_reads_back_counts() {
        let dir = tempfile::tempdir().unwrap();
        let p = sysctl_path(dir.path(), "net.core.somaxconn");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // A plain file is not truncated by the write (as /proc/sys files need not be), so
        // a longer old value leaves a tail: what reads back differs, as after a clamp.
        std::fs::write(&p, "1234567890\n").unwrap();
        let c = check(
            "net.core.somaxconn",
            Status::Change,
            sysctl("net.core.somaxconn", "4096"),
        );
        let (done, not) = apply(std::slice::from_ref(&c), dir.path());
        assert!(done.is_empty());
        assert_eq!(not[0].reason, "the kernel kept 4096 67890 instead of 4096");
        // A write that fails comes back as a reason too, not a panic.
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        let (done, not) = apply(&[c], dir.path());
        assert!(done.is_empty());
        assert!(not[0].reason.starts_with("write "), "{}", not[0].reason);
    }
}
