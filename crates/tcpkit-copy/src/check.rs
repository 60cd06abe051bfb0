//! `tcpkit copy --check`: what usually breaks a copy setup, verified before copying, each with
//! the way to fix it. The checks do what the run would do (open the same capture with the
//! same filter, connect to each target) rather than guess from configuration, so an OK means
//! the run gets past that point.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use tcpkit_capture::{Capture, CaptureError, CaptureOpts};
use tcpkit_pcap::CaptureFile;

use crate::auth::{HandshakeError, Key};
use crate::config::CopyConfig;
use crate::feed::chain;
use crate::feed::Input;
use crate::transfer;
use crate::transparent::{TransparentConfig, TransparentError};
use tcpkit_wire::tcp::{Flags, Segment};
use tcpkit_wire::{as_ethernet, LinkType};

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked, e.g. `target 10.0.1.5:8080`.
    pub name: String,
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// How to fix it (failed checks only).
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok: true,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fail(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// `OK   name: detail` or `FAIL name: detail; fix: how`.
    pub fn line(&self) -> String {
        match &self.fix {
            Some(f) if !self.ok => format!("FAIL {}: {}; fix: {}", self.name, self.detail, f),
            _ => format!("OK   {}: {}", self.name, self.detail),
        }
    }
}

/// `--tls-uprobe-calls`: the probes load and attach to every PATH (permissions, the symbols), and
/// are taken off again at once.
fn uprobe(targets: &[std::path::PathBuf], pid: Option<u32>) -> Check {
    let names: Vec<String> = targets.iter().map(|t| t.display().to_string()).collect();
    let name = "tls-uprobe";
    match tcpkit_tlsprobe::Probes::attach(targets, pid) {
        Ok(_) => Check::ok(name, format!("SSL_read/SSL_write probes attach to {}", names.join(", "))),
        Err(e) => Check::fail(
            name,
            crate::feed::chain(&e),
            "run as root (or with CAP_BPF and CAP_PERFMON) and give the libssl.so.* the server maps (grep ssl /proc/PID/maps)",
        ),
    }
}

/// `--tls-uprobe`: the library's version has a known layout and the handshake probes load and
/// attach to every PATH, taken off again at once.
fn secrets(p: &crate::config::SecretProbe) -> Check {
    let names: Vec<String> = p.targets.iter().map(|t| t.display().to_string()).collect();
    let name = "tls-uprobe";
    match tcpkit_tlsprobe::SecretProbes::attach(&p.targets, p.pid) {
        Ok(s) => Check::ok(
            name,
            format!(
                "SSL_do_handshake probes attach to {} (OpenSSL {}.{}.{}, layout: {})",
                names.join(", "),
                s.release.0,
                s.release.1,
                s.release.2,
                s.layout_source
            ),
        ),
        Err(e) => Check::fail(
            name,
            crate::feed::chain(&e),
            "run as root (or with CAP_BPF and CAP_PERFMON), give the libssl.so.* the server maps (grep ssl /proc/PID/maps), or use --tls-uprobe-calls for a library of another version",
        ),
    }
}

/// Every check for a run with this configuration, in the order a run meets them;
/// `transparent` is `--transparent`'s configuration.
pub fn run(
    cfg: &CopyConfig,
    input: &Input,
    metrics: Option<SocketAddr>,
    transparent: Option<&TransparentConfig>,
) -> Vec<Check> {
    let mut out = vec![match input {
        Input::Live { ifname } => capture(
            ifname,
            &transfer::capture_filter(&cfg.rules, cfg.filter.as_deref()),
        ),
        Input::File { path, .. } => file(path),
        Input::Uprobe { targets, pid } => uprobe(targets, *pid),
    }];
    if let Some(p) = &cfg.tls_secrets {
        out.push(secrets(p));
    }
    let mut targets: Vec<SocketAddr> = cfg.rules.iter().map(|r| r.target).collect();
    targets.sort();
    targets.dedup();
    let wait = Duration::from_nanos(cfg.timeout_ns).min(Duration::from_secs(3));
    out.extend(targets.iter().map(|&t| target(t, wait)));
    if let Some(t) = transparent {
        let on_target = targets.iter().any(|tg| tg.ip() == t.intercept.ip());
        let reachable = intercept_check(t.intercept, t.key.as_ref(), on_target, wait);
        let ok = reachable.ok;
        out.push(reachable);
        if ok {
            out.extend(
                targets
                    .iter()
                    .map(|&tg| return_path(cfg, input, t, tg, wait)),
            );
        }
    }
    out.push(conntrack(Path::new("/proc/sys/net/netfilter")));
    out.push(memory(
        cfg.max_memory as u64,
        tcpkit_host::mem_available().unwrap_or(u64::MAX),
        cgroup_limit(),
    ));
    if let Some(d) = cfg.diff.as_ref().and_then(|d| d.out.as_deref()) {
        out.push(diff_out(d));
    }
    if let Some(a) = metrics {
        out.push(metrics_addr(a));
    }
    out
}

/// Opens the capture the run would open: privilege, interface and filter in one go.
pub fn capture(ifname: &str, filter: &str) -> Check {
    let name = format!("capture on {ifname}");
    let opts = CaptureOpts {
        filter: Some(filter.to_string()),
        ..CaptureOpts::default()
    };
    match Capture::open(ifname, &opts) {
        Ok(c) => {
            drop(c);
            Check::ok(
                name,
                format!("packet socket, ring and filter '{filter}' in place"),
            )
        }
        Err(CaptureError::NoSuchInterface { .. }) => Check::fail(
            name,
            "no such interface in this network namespace",
            "pick one from `ip -br link` (the one production traffic arrives on), or -i any",
        ),
        Err(e @ CaptureError::Sys { .. })
            if matches!(
                std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<io::Error>())
                    .and_then(io::Error::raw_os_error),
                Some(libc::EPERM | libc::EACCES)
            ) =>
        {
            Check::fail(
                name,
                "no permission to capture (needs CAP_NET_RAW)",
                "run as root, or `setcap cap_net_raw,cap_net_admin+ep $(command -v tcpkit)`",
            )
        }
        Err(e) => Check::fail(
            name,
            chain(&e),
            "see the reason; a capture needs CAP_NET_RAW and an interface that is up",
        ),
    }
}

fn file(path: &Path) -> Check {
    let name = format!("input {}", path.display());
    match CaptureFile::open(path) {
        Ok(f) => Check::ok(
            name,
            format!("{:?}, {} bytes", f.format(), f.len_bytes()).to_lowercase(),
        ),
        Err(e) => Check::fail(
            name,
            chain(&e),
            "give a readable pcap or pcapng file (tcpdump -w writes one)",
        ),
    }
}

/// A plain TCP connect, as each copy makes.
pub fn target(t: SocketAddr, wait: Duration) -> Check {
    let name = format!("target {t}");
    let start = Instant::now();
    match TcpStream::connect_timeout(&t, wait) {
        Ok(_) => Check::ok(
            name,
            format!("connected in {:.1} ms", start.elapsed().as_secs_f64() * 1e3),
        ),
        Err(e) => {
            let fix = match e.raw_os_error() {
                Some(libc::ECONNREFUSED) => {
                    "nothing listens there: start the server on the target, or correct the -x rule's address and port"
                }
                Some(libc::ENETUNREACH | libc::EHOSTUNREACH) => {
                    "no route from this host: `ip route get` the target's address, add a route or fix the address"
                }
                _ if e.kind() == io::ErrorKind::TimedOut => {
                    "no answer to the SYN: a firewall or security group drops it, or the host is down; allow this host to reach the port"
                }
                _ => "see the reason; the copy connects to the target like any client",
            };
            Check::fail(name, format!("connect: {e}"), fix)
        }
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// `--transparent`: the opening exchange the run starts with, so the intercept is reachable,
/// is a tcpkit intercept, speaks this build's control protocol version, and holds the same
/// key as `key` (or, like this copy, none). `on_target`: its address is a target's, so it is
/// meant to run there (`--on-target`).
pub fn intercept_check(a: SocketAddr, key: Option<&Key>, on_target: bool, wait: Duration) -> Check {
    let name = format!("intercept {a}");
    match crate::transparent::handshake(a, wait, 0, key) {
        Ok(_) => Check::ok(
            name,
            format!(
                "welcomed this copy, control protocol version {}, {}",
                crate::control::VERSION,
                if key.is_some() {
                    "the key proved both ways (HMAC-SHA256 over nonces from both sides)"
                } else {
                    "not authenticated (no --auth-key-file on either side)"
                }
            ),
        ),
        Err(e) => {
            let fix = match &e {
                TransparentError::Handshake { why, .. } => match why {
                    HandshakeError::KeyWanted => {
                        "give copy --auth-key-file with the key file intercept was started with (mode 600 on this host too)"
                    }
                    HandshakeError::NoKeyThere => {
                        "start intercept with the same --auth-key-file (or run copy without one)"
                    }
                    HandshakeError::KeyDiffers => {
                        "copy and intercept must read the same key: compare the two files (sha256sum on each host)"
                    }
                    HandshakeError::Refused(r) if r.contains("--auth-key-file") => {
                        "copy and intercept must read the same key: compare the two files (sha256sum on each host)"
                    }
                    HandshakeError::Refused(_) | HandshakeError::Unexpected(_) => {
                        "run the same tcpkit version on this host and on intercept's (the assistant, or the target)"
                    }
                },
                TransparentError::NotIntercept { .. } => {
                    "something else listens there: give --intercept intercept's address (the assistant's, or the target's with --on-target) and its --listen port"
                }
                _ if on_target => {
                    "start `tcpkit intercept --on-target --server-port <port>` on the target (no assistant needed), and let this host reach its control port (firewall)"
                }
                _ => {
                    "start `tcpkit intercept` on the assistant (or on the target with --on-target), and let this host reach its control port (firewall, route)"
                }
            };
            Check::fail(name, chain(&e), fix)
        }
    }
}

/// The address the return-path probe sends from: `-c`'s prefix when given (a copy's client
/// addresses land there), else the source of the first client packet the capture sees within
/// `wait` (every client address must come back through intercept; one shows whether
/// it does).
fn probe_client(
    cfg: &CopyConfig,
    input: &Input,
    t: &TransparentConfig,
    v6: bool,
    wait: Duration,
) -> Option<IpAddr> {
    if let Some(c) = &t.client_cidr {
        let one = if v6 {
            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::new(0, 0, 0, 1))
        };
        return Some(crate::transparent::map_client(one, c));
    }
    let Input::Live { ifname } = input else {
        return None;
    };
    let opts = CaptureOpts {
        filter: Some(transfer::capture_filter(&cfg.rules, cfg.filter.as_deref())),
        ..CaptureOpts::default()
    };
    let mut cap = Capture::open(ifname, &opts).ok()?;
    let link = LinkType::from_dlt(cap.linktype()).unwrap_or(LinkType::Ethernet);
    let ports: Vec<u16> = cfg.rules.iter().map(|r| r.port).collect();
    let mut eth = Vec::new();
    let mut found = None;
    let deadline = Instant::now() + wait;
    while found.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let r = cap.next_block(left, |p| {
            if found.is_some() {
                return;
            }
            let Some(frame) = as_ethernet(link, p.data, &mut eth) else {
                return;
            };
            if let Ok(seg) = Segment::parse(frame) {
                if ports.contains(&seg.dst.port()) && seg.src.is_ipv6() == v6 {
                    found = Some(seg.src.ip());
                }
            }
        });
        if r.is_err() {
            break;
        }
    }
    found
}

/// The path transparent mode depends on, end to end: a SYN from a client's address to
/// `target` through the raw socket, answered by the target toward that address, caught by
/// intercept and reported back here. It fails when the target routes the clients' addresses
/// elsewhere (its answers would go to the real clients), when its reverse-path filter drops
/// the copy's packets, or when intercept captures on the wrong interface.
///
/// An intercept whose address is the target's runs on the target (`intercept --on-target`):
/// there is no assistant, and the advice is about its rule and the target's own route.
pub fn return_path(
    cfg: &CopyConfig,
    input: &Input,
    t: &TransparentConfig,
    target: SocketAddr,
    wait: Duration,
) -> Check {
    let on_target = t.intercept.ip() == target.ip();
    let name = format!(
        "return path {target} via intercept {}{}",
        t.intercept,
        if on_target { " (on the target)" } else { "" }
    );
    let Some(client) = probe_client(cfg, input, t, target.is_ipv6(), wait) else {
        return Check::fail(
            name,
            format!(
                "no client address to probe from: no client packet on the capture within {} s",
                wait.as_secs()
            ),
            if on_target {
                "run --check while clients send traffic, or give -c with the clients' prefix (intercept's --clients)"
            } else {
                "run --check while clients send traffic, or give -c with the prefix the target routes via the assistant"
            },
        );
    };
    // A port no real client of this address is likely to hold: above the ephemeral range.
    let port = 61_000 + (std::process::id() % 4_000) as u16;
    let from = SocketAddr::new(client, port);
    match crate::transparent::probe_return_path(t.intercept, t.key.as_ref(), target, from, wait) {
        Ok(Some(a)) => {
            let f = Flags(a.flags);
            let what = if f.has(Flags::SYN) && f.has(Flags::ACK) {
                "SYN-ACK (reset at once)"
            } else if f.has(Flags::RST) {
                "RST (the target does not listen there)"
            } else {
                "an answer"
            };
            Check::ok(
                name,
                format!(
                    "a SYN from {from} was answered with {what}, caught by intercept in {:.1} ms",
                    a.rtt.as_secs_f64() * 1e3
                ),
            )
        }
        Ok(None) => {
            let v = if target.is_ipv6() { 6 } else { 4 };
            let fix = if on_target {
                format!(
                    "intercept runs on the target: its --on-target rule must catch the answer, so give it --server-port {port} and --clients covering {client} (`nft list table inet tcpkit_intercept_<queue>`, or `iptables -S TCPKIT-INTERCEPT-<queue>`, shows the rule); the target needs a route to {client} (any: the answers are dropped before they leave) and must let the copies in past reverse-path filtering (`sysctl -w net.ipv{v}.conf.all.rp_filter=0`, and on the interface the copies arrive on)",
                    port = target.port(),
                )
            } else {
                format!(
                    "on the target, route the clients' addresses via the assistant (`ip route add {client}/32 via <assistant>`, or the clients' prefix) and let them in past reverse-path filtering (`sysctl -w net.ipv{v}.conf.all.rp_filter=0`, and on the interface the copies arrive on); on the assistant, run intercept on the interface the target's answers arrive on, with forwarding off; or run intercept on the target itself (--on-target)"
                )
            };
            Check::fail(
                name,
                format!(
                    "a SYN from {from} got no answer through intercept within {} s",
                    wait.as_secs()
                ),
                fix,
            )
        }
        Err(e) => Check::fail(
            name,
            chain(&e),
            "a raw socket needs CAP_NET_RAW here; intercept must stay reachable",
        ),
    }
}

/// Connections to the target are tracked by this host's conntrack when it is loaded; a full
/// table drops new ones, production's included.
pub fn conntrack(dir: &Path) -> Check {
    let name = "conntrack";
    let (Some(count), Some(max)) = (
        read_u64(&dir.join("nf_conntrack_count")),
        read_u64(&dir.join("nf_conntrack_max")),
    ) else {
        return Check::ok(name, "nf_conntrack not loaded here: no table to fill");
    };
    let detail = format!("{count} of {max} entries in use");
    if max == 0 || count.saturating_mul(5) >= max.saturating_mul(4) {
        Check::fail(
            name,
            format!("{detail}: under 20 % headroom, and every copy adds an entry"),
            format!(
                "sysctl -w net.netfilter.nf_conntrack_max={}",
                (max.max(count) * 2).max(65536)
            ),
        )
    } else {
        Check::ok(name, detail)
    }
}

/// The memory.max of this process's cgroup (v2), when it has one.
fn cgroup_limit() -> Option<u64> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/memory.max")).ok()?;
    max.trim().parse().ok()
}

/// `--max-memory` must fit in what the host (and the cgroup) can give, or the kernel kills
/// the copy before it sheds sessions.
pub fn memory(limit: u64, available: u64, cgroup: Option<u64>) -> Check {
    let name = "memory limit";
    let room = cgroup.map_or(available, |c| c.min(available));
    let mib = |b: u64| b >> 20;
    let detail = format!(
        "--max-memory {} MiB, {} MiB available{}",
        mib(limit),
        mib(available),
        cgroup.map_or(String::new(), |c| format!(", cgroup limit {} MiB", mib(c)))
    );
    // Buffers are not the whole process: leave a quarter for the rest of it.
    if limit.saturating_mul(4) > room.saturating_mul(3) {
        Check::fail(
            name,
            format!("{detail}: over three quarters of it"),
            format!("--max-memory {}M", (mib(room) / 2).max(1)),
        )
    } else {
        Check::ok(name, detail)
    }
}

fn diff_out(p: &Path) -> Check {
    let name = format!("--diff-out {}", p.display());
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        Check::ok(name, "its directory is writable")
    } else {
        let e = io::Error::last_os_error();
        Check::fail(
            name,
            format!("{}: {e}", dir.display()),
            "choose a file in a directory that exists and this user can write",
        )
    }
}

fn metrics_addr(a: SocketAddr) -> Check {
    let name = format!("--metrics {a}");
    match TcpListener::bind(a) {
        Ok(_) => Check::ok(name, "address free"),
        Err(e) => Check::fail(
            name,
            format!("bind: {e}"),
            "choose a free port (`ss -ltn` lists those in use) and an address of this host",
        ),
    }
}

/// The checks as a JSON array of {name, ok, detail, fix}.
pub fn json(checks: &[Check]) -> String {
    serde_json::to_string_pretty(checks).unwrap_or_else(|_| "[]".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_say_ok_or_fail_with_the_fix() {
        assert_eq!(Check::ok("a", "b").line(), "OK   a: b");
        assert_eq!(Check::fail("a", "b", "c").line(), "FAIL a: b; fix: c");
    }

    #[test]
    fn a_refused_target_says_to_start_the_server() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        assert!(target(a, Duration::from_secs(1)).ok);
        drop(l);
        let c = target(a, Duration::from_secs(1));
        assert!(!c.ok);
        assert!(c.line().contains("start the server"), "{}", c.line());
    }

    #[test]
    fn conntrack_headroom() {
        let d = tempfile::tempdir().unwrap();
        assert!(conntrack(d.path()).ok);
        std::fs::write(d.path().join("nf_conntrack_count"), "100\n").unwrap();
        std::fs::write(d.path().join("nf_conntrack_max"), "1000\n").unwrap();
        assert!(conntrack(d.path()).ok);
        std::fs::write(d.path().join("nf_conntrack_count"), "900\n").unwrap();
        let c = conntrack(d.path());
        assert!(!c.ok);
        assert!(c.line().contains("nf_conntrack_max=65536"), "{}", c.line());
    }

    #[test]
    fn memory_limit_against_the_host_and_cgroup() {
        let g = 1u64 << 30;
        assert!(memory(g, 8 * g, None).ok);
        let c = memory(7 * g, 8 * g, None);
        assert!(
            !c.ok && c.line().ends_with("fix: --max-memory 4096M"),
            "{}",
            c.line()
        );
        let c = memory(g, 8 * g, Some(g));
        assert!(
            !c.ok && c.line().contains("cgroup limit 1024 MiB"),
            "{}",
            c.line()
        );
    }

    #[test]
    fn a_missing_interface_or_file_says_so() {
        let c = capture("nosuchif0", "tcp");
        assert!(!c.ok);
        // Without privilege the socket fails before the interface is looked up.
        assert!(
            c.line().contains("ip -br link") || c.line().contains("CAP_NET_RAW"),
            "{}",
            c.line()
        );
        let c = file(Path::new("/nonexistent.pcap"));
        assert!(
            !c.ok && c.line().contains("/nonexistent.pcap"),
            "{}",
            c.line()
        );
    }

    #[test]
    fn intercept_welcome_refusal_and_strangers() {
        use crate::control::{Msg, VERSION};
        use std::io::{Read, Write};
        // A one-connection server answering the Hello with `answer`.
        let serve = |answer: Vec<u8>| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let a = l.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut b = [0u8; 64];
                let _ = s.read(&mut b);
                s.write_all(&answer).unwrap();
                std::thread::sleep(Duration::from_millis(200));
            });
            (a, t)
        };
        let mut w = Vec::new();
        Msg::Welcome { version: VERSION }.emit(&mut w);
        let (a, t) = serve(w);
        let c = intercept_check(a, None, false, Duration::from_secs(2));
        assert!(c.ok, "{}", c.line());
        t.join().unwrap();
        let mut r = Vec::new();
        Msg::Refuse {
            version: VERSION + 1,
            reason: "version 2 only",
        }
        .emit(&mut r);
        let (a, t) = serve(r);
        let c = intercept_check(a, None, false, Duration::from_secs(2));
        assert!(
            !c.ok && c.line().contains("same tcpkit version"),
            "{}",
            c.line()
        );
        t.join().unwrap();
        let (a, t) = serve(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec());
        let c = intercept_check(a, None, false, Duration::from_secs(2));
        assert!(
            !c.ok && c.line().contains("something else listens"),
            "{}",
            c.line()
        );
        t.join().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        let c = intercept_check(a, None, false, Duration::from_secs(1));
        assert!(
            !c.ok
                && c.line()
                    .contains("start `tcpkit intercept` on the assistant"),
            "{}",
            c.line()
        );
        let c = intercept_check(a, None, true, Duration::from_secs(1));
        assert!(
            !c.ok
                && c.line().contains(
                    "start `tcpkit intercept --on-target --server-port <port>` on the target"
                ),
            "{}",
            c.line()
        );
    }

    #[test]
    fn diff_out_and_metrics_address() {
        assert!(diff_out(Path::new("d.jsonl")).ok);
        assert!(!diff_out(Path::new("/nonexistent/dir/d.jsonl")).ok);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = metrics_addr(l.local_addr().unwrap());
        assert!(!c.ok && c.line().contains("ss -ltn"), "{}", c.line());
    }
}
