//! The lab's one error type: every variant renders as one line that names the command or
//! operation that failed and why, and keeps the underlying `io::Error` as the source.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

/// Why a lab operation failed.
///
/// `Debug` prints the same single line as `Display`, so that `Lab::new(..).unwrap()` in a
/// test fails with the readable reason instead of a struct dump.
#[derive(thiserror::Error)]
pub enum LabError {
    /// The process lacks CAP_NET_ADMIN / CAP_SYS_ADMIN.
    #[error("tcpkit-lab: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces")]
    NotPrivileged,
    /// A command could not be started at all (missing binary, fork failure).
    #[error("tcpkit-lab: cannot run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why it could not be started.
        #[source]
        source: io::Error,
    },
    /// A command ran and exited unsuccessfully.
    #[error("tcpkit-lab: `{cmd}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its stderr (or stdout when stderr was empty), on one line.
        stderr: String,
    },
    /// A file or system call failed.
    #[error("tcpkit-lab: {what}: {source}")]
    Io {
        /// What was being done, with the path or syscall.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The caller passed something the lab refuses (bad name, address outside the test ranges).
    #[error("tcpkit-lab: {what}")]
    Invalid {
        /// What was wrong.
        what: String,
    },
    /// Something did not happen in time.
    #[error("tcpkit-lab: {what}: timed out after {after:?}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the lab waited.
        after: Duration,
    },
    /// A tool's output did not have the expected shape.
    #[error("tcpkit-lab: cannot parse output of `{cmd}`: {why}")]
    Parse {
        /// The command whose output was parsed.
        cmd: String,
        /// What was missing or malformed.
        why: String,
    },
}

impl std::fmt::Debug for LabError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl LabError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> LabError {
        LabError::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>) -> LabError {
        LabError::Invalid { what: what.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_the_one_line_message() {
        let e = LabError::NotPrivileged;
        assert_eq!(format!("{e:?}"), format!("{e}"));
        assert!(!format!("{e}").contains('\n'));
    }

    #[test]
    fn io_keeps_source() {
        let e = LabError::io("open /x", io::Error::from(io::ErrorKind::NotFound));
        let src = std::error::Error::source(&e).expect("source kept");
        assert!(src.to_string().contains("not found"), "{src}");
        assert!(e.to_string().starts_with("tcpkit-lab: open /x: "));
    }
}
