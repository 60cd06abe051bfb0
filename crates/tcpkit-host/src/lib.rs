//! Facts about this host and this process that jobs report or check before they run: memory
//! (/proc/meminfo, the process's resident set), capabilities, CPU priority. Each is read here
//! once, so copy's memory cap, copy --check, load's `tune` and the lab's privilege check agree
//! on what they read and how a missing or odd line is taken. A part of its own, so the lab
//! (and with it the benchmarks) reads a capability without pulling in reports and plots.

#![warn(missing_docs)]

use std::path::Path;

/// A /proc/meminfo field (`"MemTotal"`, `"MemAvailable"`) in bytes; None when the file or
/// the field cannot be read.
pub fn meminfo(field: &str) -> Option<u64> {
    meminfo_field(&std::fs::read_to_string("/proc/meminfo").ok()?, field)
}

/// The host's memory in bytes (MemTotal).
pub fn mem_total() -> Option<u64> {
    meminfo("MemTotal")
}

/// Memory the kernel could give without swapping, in bytes (MemAvailable).
pub fn mem_available() -> Option<u64> {
    meminfo("MemAvailable")
}

/// `field` (without its colon) from meminfo's text, in bytes: the kernel writes kB (KiB).
fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The page size in bytes (4096 when sysconf does not say).
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant and has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// This process's resident set in bytes (/proc/self/statm); 0 when it cannot be read.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages.saturating_mul(page_size()))
}

/// Whether this process's effective capability set holds `cap` (a `CAP_*` number); None when
/// /proc/self/status cannot be read or has no readable CapEff line.
pub fn has_capability(cap: u32) -> Option<bool> {
    cap_eff_has(
        &std::fs::read_to_string(Path::new("/proc/self/status")).ok()?,
        cap,
    )
}

/// Whether the `CapEff:` line of a /proc/PID/status text has bit `cap`.
fn cap_eff_has(status: &str, cap: u32) -> Option<bool> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let bits = u64::from_str_radix(hex, 16).ok()?;
    Some(cap < 64 && bits & (1 << cap) != 0)
}

/// Lowers this process's CPU priority by `by` nice steps (at most to 19; 0 or less leaves it)
/// so that production goes first; returns the nice value it runs at afterwards.
pub fn lower_priority(by: i32) -> i32 {
    // SAFETY: getpriority/setpriority act on the calling process only and touch no memory of
    // ours.
    unsafe {
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        if by > 0 {
            let _ = libc::setpriority(libc::PRIO_PROCESS, 0, (now + by).min(19));
        }
        libc::getpriority(libc::PRIO_PROCESS, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_bytes_and_need_their_unit() {
        let t = "MemTotal:       24576000 kB\nMemFree: 100 kB\nMemAvailable:   2048 kB\nHugePages_Total:       0\n";
        assert_eq!(meminfo_field(t, "MemTotal"), Some(24_576_000 * 1024));
        assert_eq!(meminfo_field(t, "MemAvailable"), Some(2048 * 1024));
        // A prefix of another field's name is not that field.
        assert_eq!(meminfo_field(t, "Mem"), None);
        // No kB: not a size this reads.
        assert_eq!(meminfo_field(t, "HugePages_Total"), None);
        assert_eq!(
            meminfo_field("MemTotal: 99999999999999999999 kB\n", "MemTotal"),
            None
        );
        assert_eq!(
            meminfo_field("MemTotal: 18446744073709551615 kB\n", "MemTotal"),
            None
        );
    }

    #[test]
    fn capabilities_come_from_the_effective_set() {
        let s = "Name:\tx\nCapPrm:\t000001ffffffffff\nCapEff:\t000001fffeffffff\n";
        assert_eq!(cap_eff_has(s, 24), Some(false));
        assert_eq!(cap_eff_has(s, 12), Some(true));
        assert_eq!(cap_eff_has("CapEff:\t0000000001000000\n", 24), Some(true));
        assert_eq!(cap_eff_has("CapEff:\tzz\n", 24), None);
        assert_eq!(cap_eff_has("CapEff:\tffffffffffffffff\n", 64), Some(false));
        assert_eq!(cap_eff_has("Name:\tx\n", 1), None);
    }

    #[test]
    fn this_host_answers() {
        let total = mem_total().expect("MemTotal");
        assert!(mem_available().expect("MemAvailable") <= total);
        let rss = rss_bytes();
        assert!(rss > 0 && rss < total, "{rss}");
        assert!(page_size().is_power_of_two());
        assert!(has_capability(0).is_some());
    }
}
