//! Packet captures with the real tcpdump running inside a host: started so that nothing sent
//! after [`Lab::tcpdump`](crate::Lab::tcpdump) returns is missed, stopped so that the file is
//! complete and tcpdump's own drop counters are known.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::cmd;
use crate::proc::{kill_and_reap, wait_timeout, Proc};
use crate::LabError;

/// How long tcpdump may take to open the interface, and to flush and exit after SIGINT.
pub(crate) const TCPDUMP_TIMEOUT: Duration = Duration::from_secs(10);

/// The capture arguments after `tcpdump`. `-U` and `--immediate-mode` make every packet
/// reach the file at once; `-Z root` stops tcpdump from switching to its own user, so the
/// file stays writable and readable like every other file in the lab's directory.
pub(crate) fn argv(iface: &str, file: &str, filter: &str) -> Vec<String> {
    let mut v: Vec<String> = [
        "tcpdump",
        "-i",
        iface,
        "-w",
        file,
        "-U",
        "--immediate-mode",
        "-s",
        "0",
        "-nn",
        "--time-stamp-precision",
        "nano",
        "-Z",
        "root",
        // 64 MiB of kernel ring (in KiB): top-speed bursts must not overrun the capture.
        "-B",
        "65536",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !filter.trim().is_empty() {
        v.push(filter.to_string());
    }
    v
}

/// A running capture; see [`Lab::tcpdump`](crate::Lab::tcpdump).
#[derive(Debug)]
pub struct Tcpdump {
    pub(crate) proc: Proc,
    pub(crate) path: PathBuf,
}

/// A finished capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    /// The pcap file (nanosecond timestamps).
    pub path: PathBuf,
    /// "N packets captured".
    pub captured: u64,
    /// "N packets received by filter".
    pub received_by_filter: u64,
    /// "N packets dropped by kernel": nonzero means the capture is incomplete.
    pub dropped_by_kernel: u64,
}

impl Tcpdump {
    /// The pcap file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tcpdump process (its log holds tcpdump's stderr).
    pub fn proc(&self) -> &Proc {
        &self.proc
    }

    /// Blocks until tcpdump says it is listening; Err with its output if it exits first.
    pub(crate) fn wait_listening(&self) -> Result<(), LabError> {
        let start = Instant::now();
        loop {
            if self.proc.log().contains("listening on") {
                return Ok(());
            }
            if let Some(status) = self.proc.try_status()? {
                return Err(LabError::Failed {
                    cmd: format!("tcpdump ({})", self.proc.log_path().display()),
                    status,
                    stderr: cmd::tail(self.proc.log().as_bytes(), b""),
                });
            }
            if start.elapsed() > TCPDUMP_TIMEOUT {
                let _ = kill_and_reap(&self.proc.state, "tcpdump");
                return Err(LabError::Timeout {
                    what: format!("tcpdump to start listening (log: {})", self.proc.log()),
                    after: TCPDUMP_TIMEOUT,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the capture with SIGINT (tcpdump then flushes the file and prints its
    /// counters), waits for it to exit and returns the counters.
    pub fn stop(self) -> Result<Capture, LabError> {
        self.drain()?;
        self.proc.signal(Signal::SIGINT)?;
        let status = match wait_timeout(&self.proc.state, TCPDUMP_TIMEOUT, "tcpdump")? {
            Some(s) => s,
            None => {
                let _ = kill_and_reap(&self.proc.state, "tcpdump");
                return Err(LabError::Timeout {
                    what: "tcpdump to exit after SIGINT".into(),
                    after: TCPDUMP_TIMEOUT,
                });
            }
        };
        let log = self.proc.log();
        if !status.success() {
            return Err(LabError::Failed {
                cmd: format!("tcpdump ({})", self.proc.log_path().display()),
                status,
                stderr: cmd::tail(log.as_bytes(), b""),
            });
        }
        let (captured, received_by_filter, dropped_by_kernel) =
            parse_counters(&log).ok_or_else(|| LabError::Parse {
                cmd: "tcpdump".into(),
                why: format!("no packet counters in: {}", cmd::tail(log.as_bytes(), b"")),
            })?;
        Ok(Capture {
            path: self.path,
            captured,
            received_by_filter,
            dropped_by_kernel,
        })
    }
}

impl Capture {
    /// The capture decoded by `tcpdump -r FILE -nn -tt`, one line per packet.
    pub fn text(&self) -> Result<Vec<String>, LabError> {
        let mut c = Command::new("tcpdump");
        c.arg("-r").arg(&self.path).args(["-nn", "-tt"]);
        let out = cmd::run(c)?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }
}

impl Tcpdump {
    /// Waits until tcpdump has written every packet the kernel queued for it. SIGINT makes
    /// tcpdump leave its loop without reading what is still in the ring, so packets sent
    /// just before stop() would be counted "received by filter" but never written. SIGUSR1
    /// makes tcpdump print its counters; once captured == received, the ring is empty.
    fn drain(&self) -> Result<(), LabError> {
        let start = Instant::now();
        while start.elapsed() < TCPDUMP_TIMEOUT {
            let before = self.proc.log().len();
            self.proc.signal(Signal::SIGUSR1)?;
            std::thread::sleep(Duration::from_millis(10));
            let log = self.proc.log();
            if self.proc.try_status()?.is_some() {
                return Ok(());
            }
            let Some(fresh) = log.get(before..) else {
                continue;
            };
            if let Some((captured, received)) = parse_progress(fresh) {
                if captured >= received {
                    return Ok(());
                }
            }
        }
        // Not fatal: stop() still reports the counters, and the caller sees the shortfall.
        Ok(())
    }
}

/// Parses tcpdump's SIGUSR1 line "tcpdump: N packets captured, M packets received by
/// filter, K packets dropped by kernel" (the last one in `log`): (N, M).
pub(crate) fn parse_progress(log: &str) -> Option<(u64, u64)> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("received by filter,"))?;
    let line = line.strip_prefix("tcpdump: ").unwrap_or(line);
    let mut parts = line.split(", ");
    let num = |p: Option<&str>| p?.split(' ').next()?.parse::<u64>().ok();
    Some((num(parts.next())?, num(parts.next())?))
}

/// Parses tcpdump's exit summary: (captured, received by filter, dropped by kernel).
pub(crate) fn parse_counters(log: &str) -> Option<(u64, u64, u64)> {
    let find = |suffix: &str| {
        log.lines().rev().find_map(|l| {
            l.trim()
                .strip_suffix(suffix)
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
    };
    // tcpdump says "1 packet captured" in the singular.
    let either = |plural: &str, singular: &str| find(plural).or_else(|| find(singular));
    Some((
        either("packets captured", "packet captured")?,
        either("packets received by filter", "packet received by filter")?,
        either("packets dropped by kernel", "packet dropped by kernel")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_from_tcpdump_summary() {
        let log = "tcpdump: listening on eth0, link-type EN10MB (Ethernet), snapshot length 262144 bytes\n\
                   12 packets captured\n13 packets received by filter\n0 packets dropped by kernel\n";
        assert_eq!(parse_counters(log), Some((12, 13, 0)));
        let one = "1 packet captured\n1 packet received by filter\n2 packets dropped by kernel\n";
        assert_eq!(parse_counters(one), Some((1, 1, 2)));
        assert_eq!(parse_counters("tcpdump: listening on eth0\n"), None);
    }

    #[test]
    fn progress_from_sigusr1_line() {
        let log = "tcpdump: listening on eth0\n\
                   tcpdump: 1 packet captured, 10 packets received by filter, 0 packets dropped by kernel\n";
        assert_eq!(parse_progress(log), Some((1, 10)));
        assert_eq!(parse_progress("10 packets captured\n"), None);
    }

    #[test]
    fn argv_has_capture_flags_and_optional_filter() {
        let v = argv("eth0", "/tmp/x.pcap", "udp port 9");
        assert_eq!(v.last().map(String::as_str), Some("udp port 9"));
        assert!(v.iter().any(|a| a == "--immediate-mode"));
        let with = argv("eth0", "/tmp/x.pcap", "udp");
        let without = argv("eth0", "/tmp/x.pcap", "  ");
        assert_eq!(without.len() + 1, with.len());
        assert_eq!(without[..], with[..without.len()]);
    }
}
