//! The [`Lab`]: owner of every namespace, link and process a test creates, and the one place
//! that tears them down again, including after a panic.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::host::Host;
use crate::link::{parse_cidr, query_iface, Link, LinkOpts, IFNAME_MAX};
use crate::proc::{self, Proc, Shared, STOP_GRACE};
use crate::sweep::{self, netns_name, remove_netns};
use crate::tcpdump::{self, Tcpdump};
use crate::{cmd, LabError};

/// Namespace counter shared by every lab in the process, so labs built by tests running in
/// parallel threads never pick the same name.
static NEXT_NETNS: AtomicU64 = AtomicU64::new(0);

/// Longest host name a test may give (the namespace name adds the prefix, pid and counter).
const HOST_NAME_MAX: usize = 32;

/// Env var that keeps the lab directory (logs, captures) after the lab is dropped.
pub const KEEP_ENV: &str = "TCPKIT_LAB_KEEP";

/// Capability bits in /proc/self/status CapEff.
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

/// A set of hosts (network namespaces), links and processes, all removed on drop.
#[derive(Debug)]
pub struct Lab {
    tag: String,
    dir: TempDir,
    namespaces: Vec<String>,
    procs: Vec<(String, Shared)>,
    /// Next interface number per namespace, so veth names are unique within each host.
    ifnums: HashMap<String, u32>,
    files: u32,
}

/// Names the lab accepts for hosts, processes and tags: they end up in namespace and
/// file names, so only characters that are safe in both.
fn check_name(kind: &str, name: &str, max: usize) -> Result<(), LabError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(LabError::invalid(format!(
            "{kind} name {name:?}: use 1..={max} characters from [A-Za-z0-9_-]"
        )))
    }
}

/// Whether the effective capability set has both capabilities the lab needs.
fn privileged() -> bool {
    use tcpkit_host::has_capability;
    match (has_capability(CAP_NET_ADMIN), has_capability(CAP_SYS_ADMIN)) {
        (Some(net), Some(sys)) => net && sys,
        _ => nix::unistd::geteuid().is_root(),
    }
}

impl Lab {
    /// A new, empty lab. Fails with one clear line when not privileged enough, and first
    /// deletes leftovers of dead runs ([`sweep_leftovers`](crate::sweep_leftovers)).
    pub fn new(tag: &str) -> Result<Lab, LabError> {
        check_name("lab tag", tag, 64)?;
        if !privileged() {
            return Err(LabError::NotPrivileged);
        }
        // A leftover that cannot be deleted is worth a warning, not a failed test: it does
        // not collide with the fresh names this lab uses.
        if let Err(e) = sweep::sweep_leftovers() {
            eprintln!("{e} (while sweeping leftovers; continuing)");
        }
        let dir = TempDir::with_prefix(format!("tcpkit-lab-{tag}-"))
            .map_err(|e| LabError::io("create lab directory in the temp dir", e))?;
        Ok(Lab {
            tag: tag.to_string(),
            dir,
            namespaces: Vec::new(),
            procs: Vec::new(),
            ifnums: HashMap::new(),
            files: 0,
        })
    }

    /// The `pair` topology: hosts "a" and "b" joined by one link with 198.18.0.1/24 and
    /// fd00:18::1/64 on A, 198.18.0.2/24 and fd00:18::2/64 on B.
    pub fn pair(tag: &str) -> Result<(Lab, Host, Host, Link), LabError> {
        let mut lab = Lab::new(tag)?;
        let a = lab.host("a")?;
        let b = lab.host("b")?;
        let link = lab.link(&a, &b, &LinkOpts::pair())?;
        Ok((lab, a, b, link))
    }

    /// The tag given to [`Lab::new`].
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Directory for logs and captures; removed on drop unless `TCPKIT_LAB_KEEP=1`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Names of the namespaces this lab created and has not yet deleted.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// A new host: a fresh network namespace with `lo` up.
    pub fn host(&mut self, name: &str) -> Result<Host, LabError> {
        check_name("host", name, HOST_NAME_MAX)?;
        let n = NEXT_NETNS.fetch_add(1, Ordering::Relaxed);
        let netns = netns_name(std::process::id(), n, name);
        cmd::run_args("ip", &["netns", "add", &netns])?;
        // Recorded before anything else can fail, so drop deletes it in any case.
        self.namespaces.push(netns.clone());
        cmd::run_args("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
        let host = Host {
            name: name.to_string(),
            netns,
        };
        host.try_enter(new_netns_sysctls)??;
        Ok(host)
    }

    fn next_ifname(&mut self, host: &Host) -> String {
        let n = self.ifnums.entry(host.netns.clone()).or_insert(0);
        let name = format!("eth{n}");
        *n += 1;
        name
    }

    /// Joins `a` and `b` with a veth pair created directly inside the two namespaces,
    /// named `eth<n>` (numbered per host), configured as `opts` says and up.
    ///
    /// IPv6 addresses are added with `nodad`, so they are usable at once.
    pub fn link(&mut self, a: &Host, b: &Host, opts: &LinkOpts) -> Result<Link, LabError> {
        for s in opts.addr_a.iter().chain(&opts.addr_b) {
            parse_cidr(s)?;
        }
        if let Some(t) = opts.tbf {
            if t.rate_bit_s == 0 || t.burst_bytes == 0 {
                return Err(LabError::invalid(format!(
                    "tbf {t:?}: rate and burst must be positive"
                )));
            }
        }
        let name_a = self.next_ifname(a);
        let name_b = self.next_ifname(b);
        debug_assert!(name_a.len() <= IFNAME_MAX && name_b.len() <= IFNAME_MAX);
        let queues = opts.queues.map(|q| q.to_string());
        let q: Vec<&str> = match &queues {
            Some(n) => vec!["numtxqueues", n, "numrxqueues", n],
            None => Vec::new(),
        };
        let mut argv = vec!["link", "add", &name_a, "netns", &a.netns];
        argv.extend(&q);
        argv.extend(["type", "veth", "peer", "name", &name_b, "netns", &b.netns]);
        argv.extend(&q);
        cmd::run_args("ip", &argv)?;
        let ends = [
            (a, name_a.as_str(), &opts.addr_a),
            (b, name_b.as_str(), &opts.addr_b),
        ];
        let mut threads = [None, None];
        for (k, (h, ifname, addrs)) in ends.into_iter().enumerate() {
            configure_end(h, ifname, addrs, opts)?;
            if opts.rx_threads {
                threads[k] = Some(rx_thread(h, ifname)?);
            }
        }
        let mut link = Link {
            a: query_iface(&a.netns, &name_a, opts.addr_a.clone())?,
            b: query_iface(&b.netns, &name_b, opts.addr_b.clone())?,
        };
        link.a.rx_thread = threads[0];
        link.b.rx_thread = threads[1];
        Ok(link)
    }

    fn next_file(&mut self, stem: &str, ext: &str) -> PathBuf {
        self.files += 1;
        self.dir
            .path()
            .join(format!("{:02}-{stem}.{ext}", self.files))
    }

    pub(crate) fn spawn_in(
        &mut self,
        host: &Host,
        name: &str,
        argv: &[&str],
    ) -> Result<Proc, LabError> {
        check_name("process", name, 64)?;
        if argv.is_empty() {
            return Err(LabError::invalid(format!(
                "spawn {name} in {}: empty command",
                host.netns
            )));
        }
        let log_path = self.next_file(&format!("{}-{name}", host.name), "log");
        let log = File::create(&log_path)
            .map_err(|e| LabError::io(format!("create {}", log_path.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| LabError::io(format!("dup {}", log_path.display()), e))?;
        let mut c = host.command(argv);
        c.stdin(Stdio::null()).stdout(log).stderr(log2);
        let desc = cmd::describe(&c);
        let child = c
            .spawn()
            .map_err(|source| LabError::Spawn { cmd: desc, source })?;
        let pid = child.id();
        let state = proc::shared(child);
        self.procs.push((name.to_string(), state.clone()));
        Ok(Proc {
            name: name.to_string(),
            pid,
            log_path,
            state,
        })
    }

    /// Starts tcpdump on `iface` inside `host` writing a pcap into the lab's directory, and
    /// returns once tcpdump is capturing, so nothing sent afterwards is missed.
    pub fn tcpdump(&mut self, host: &Host, iface: &str, filter: &str) -> Result<Tcpdump, LabError> {
        if iface.is_empty() || iface.len() > IFNAME_MAX {
            return Err(LabError::invalid(format!(
                "tcpdump: interface name {iface:?} must be 1..={IFNAME_MAX} characters"
            )));
        }
        let path = self.next_file(&format!("{}-{iface}", host.name), "pcap");
        let file = path.to_string_lossy().into_owned();
        let argv = tcpdump::argv(iface, &file, filter);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let proc = self.spawn_in(host, "tcpdump", &argv)?;
        let t = Tcpdump { proc, path };
        t.wait_listening()?;
        Ok(t)
    }

    /// Stops every process, then every namespace; each step is attempted even if an
    /// earlier one failed. Returns the first error.
    fn teardown(&mut self) -> Result<(), LabError> {
        let mut first: Option<LabError> = None;
        let mut note = |r: Result<(), LabError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        // SIGTERM everything first so the grace period runs once for all processes.
        for (_, s) in &self.procs {
            note(proc::lock(s).signal(Signal::SIGTERM));
        }
        let deadline = std::time::Instant::now() + STOP_GRACE;
        for (name, s) in self.procs.drain(..) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let r = match proc::wait_timeout(&s, left, &name) {
                Ok(Some(_)) => Ok(()),
                Ok(None) => proc::kill_and_reap(&s, &name).map(drop),
                Err(e) => Err(e),
            };
            note(r);
        }
        // Whatever is still inside (grandchildren that left the process group, daemons)
        // is killed by remove_netns before the namespace is deleted.
        for ns in self.namespaces.drain(..) {
            note(remove_netns(&ns));
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Tears the lab down now and reports failures (drop does the same but can only print).
    pub fn close(mut self) -> Result<(), LabError> {
        self.teardown()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("{e} (while tearing down lab {})", self.tag);
        }
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v == "1");
        if keep {
            self.dir.disable_cleanup(true);
            eprintln!(
                "tcpkit-lab: {KEEP_ENV}=1, kept {}",
                self.dir.path().display()
            );
        } else if std::thread::panicking() {
            eprintln!(
                "tcpkit-lab: lab {} torn down after a panic; set {KEEP_ENV}=1 to keep its logs",
                self.tag
            );
        }
    }
}

/// IPv6 settings for every interface later created in a fresh namespace; written through
/// /proc/sys from a thread inside it (sysctls under net/ follow the writer's namespace).
/// - accept_dad=0: link-local addresses are usable the moment a link is up, not ~1 s later
///   (`nodad` on the configured addresses does not cover them, and neighbour discovery and
///   the first packets otherwise fail while they are tentative).
/// - router_solicitations=0: no router solicitations cluttering captures.
const NEW_NETNS_SYSCTLS: &[(&str, &str)] = &[
    ("/proc/sys/net/ipv6/conf/all/accept_dad", "0"),
    ("/proc/sys/net/ipv6/conf/default/accept_dad", "0"),
    ("/proc/sys/net/ipv6/conf/default/router_solicitations", "0"),
];

fn new_netns_sysctls() -> Result<(), LabError> {
    for (path, value) in NEW_NETNS_SYSCTLS {
        std::fs::write(path, value).map_err(|e| LabError::io(format!("write {path}"), e))?;
    }
    Ok(())
}

impl LinkOpts {
    /// The `pair` topology's addresses: 198.18.0.1/24 + fd00:18::1/64 on A,
    /// 198.18.0.2/24 + fd00:18::2/64 on B.
    pub fn pair() -> LinkOpts {
        LinkOpts {
            addr_a: vec!["198.18.0.1/24".into(), "fd00:18::1/64".into()],
            addr_b: vec!["198.18.0.2/24".into(), "fd00:18::2/64".into()],
            ..LinkOpts::default()
        }
    }

    /// One address (with prefix) on each end, the rest default.
    pub fn addrs(a: impl Into<String>, b: impl Into<String>) -> LinkOpts {
        LinkOpts {
            addr_a: vec![a.into()],
            addr_b: vec![b.into()],
            ..LinkOpts::default()
        }
    }
}

/// MTU, offloads, addresses, up, shaping: in that order, because shaping needs the link's
/// final MTU and addresses are best added before the link carries traffic.
fn configure_end(
    h: &Host,
    ifname: &str,
    addrs: &[String],
    opts: &LinkOpts,
) -> Result<(), LabError> {
    let ns = h.netns.as_str();
    if let Some(mtu) = opts.mtu {
        let m = mtu.to_string();
        cmd::run_args("ip", &["-n", ns, "link", "set", "dev", ifname, "mtu", &m])?;
    }
    if !opts.offloads {
        // ethtool has no netns option; it runs inside the namespace.
        h.run(&[
            "ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off",
        ])?;
    }
    for a in addrs {
        let mut args = vec!["-n", ns, "addr", "add", a.as_str(), "dev", ifname];
        if a.contains(':') {
            args.push("nodad");
        }
        cmd::run_args("ip", &args)?;
    }
    cmd::run_args("ip", &["-n", ns, "link", "set", "dev", ifname, "up"])?;
    if let Some(t) = opts.tbf {
        let rate = format!("{}bit", t.rate_bit_s);
        let burst = t.burst_bytes.to_string();
        let latency = format!("{}ms", t.latency_ms);
        cmd::run_args(
            "tc",
            &[
                "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", &rate, "burst",
                &burst, "latency", &latency,
            ],
        )?;
    }
    Ok(())
}

/// Pids of the threaded-NAPI kernel threads now running.
fn napi_threads() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("napi/"))
        })
        .collect()
}

/// Makes `ifname` (up, in `h`) receive in a NAPI thread of its own and returns its pid. The
/// thread is named after the interface alone (`napi/eth0-N`, the same in every namespace),
/// so it is told apart as the one thread that was not there before; labs of one process take
/// turns (test binaries run one after another).
fn rx_thread(h: &Host, ifname: &str) -> Result<u32, LabError> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = napi_threads();
    h.run(&["ethtool", "-K", ifname, "gro", "on"])?;
    // sysfs shows the namespace's own interfaces only inside it (`ip netns exec` remounts it).
    h.run(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{ifname}/threaded"),
    ])?;
    let new: Vec<u32> = napi_threads()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    match new[..] {
        [pid] => Ok(pid),
        _ => Err(LabError::invalid(format!(
            "{ifname} in {}: expected one new NAPI thread after enabling threaded receive, found {}",
            h.netns,
            new.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("host", "a", 32).is_ok());
        assert!(check_name("host", "client-1_x", 32).is_ok());
        for bad in ["", "a b", "a/b", "..", "ä", &"x".repeat(33)] {
            assert!(check_name("host", bad, 32).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lab_is_send() {
        fn send<T: Send>() {}
        send::<Lab>();
        send::<Host>();
        send::<Proc>();
        send::<Tcpdump>();
    }

    #[test]
    fn pair_opts() {
        let o = LinkOpts::pair();
        assert_eq!(o.addr_a, ["198.18.0.1/24", "fd00:18::1/64"]);
        assert_eq!(o.addr_b, ["198.18.0.2/24", "fd00:18::2/64"]);
        assert!(!o.offloads);
    }
}
