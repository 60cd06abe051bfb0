//! The rules: from [`Facts`] and what is asked ([`TuneConfig`]) to one [`Check`] per setting,
//! each with the value wanted, the reason in a user's words and the exact command.

use super::facts::{limit_text, Facts};
use super::{Check, Fix, Role, Status, TuneConfig};

/// The widest useful `ip_local_port_range`: below 1024 are the privileged ports servers
/// bind to.
const WIDEST_PORTS: (u16, u16) = (1024, 65535);

/// A listen backlog is an int, but accept queues past this are queues nobody drains.
const MAX_QUEUE: u64 = 65535;

/// Packets per core the input queue needs to take a burst of connects or answers.
const MAX_NETDEV_BACKLOG: u64 = 16384;

/// Descriptors a process keeps for itself beside its connections (stdio, epoll and timer
/// descriptors per thread, files): the same margin `tcpkit load` plans its processes with.
pub fn fd_margin(cores: usize) -> u64 {
    64 + 4 * cores as u64
}

/// The checks, and the numbers they were computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    pub checks: Vec<Check>,
    /// Processes needed to hold the connections under the hard RLIMIT_NOFILE as it is.
    pub procs_needed: u64,
    /// Client: source addresses needed per server address:port with the port range as it
    /// is (`None` for a server, or when the range cannot be read).
    pub sources_needed: Option<u64>,
    /// Pages the sockets hold if each keeps its minimum buffers.
    pub memory_pages: u64,
}

impl Evaluation {
    /// Settings that stop the host from holding the connections.
    pub fn changes(&self) -> usize {
        self.count(Status::Change)
    }

    pub fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }
}

/// Judges `f` for `cfg`. Pure: the same facts give the same checks.
pub fn evaluate(cfg: &TuneConfig, f: &Facts) -> Evaluation {
    let n = cfg.connections;
    let margin = fd_margin(f.cores);
    let per_proc = f.nofile_hard.saturating_sub(margin).max(1);
    let procs_needed = n.div_ceil(per_proc);
    let mut checks = nofile(n, margin, procs_needed, f);
    let in_use = f.numbers("fs.file-nr").and_then(|v| v.first().copied());
    checks.push(at_least(
        f,
        "fs.file-max",
        n + in_use.unwrap_or(0),
        format!(
            "open files of the whole host: each connection is one ({} open now)",
            in_use.map_or("unknown".into(), |u| u.to_string())
        ),
    ));
    let mut sources_needed = None;
    match cfg.role {
        Role::Server => {
            let q = n.min(MAX_QUEUE);
            checks.push(at_least(
                f,
                "net.core.somaxconn",
                q,
                "a listener's accept queue is cut to this (tcpkit echo asks 65535): connects beyond it are dropped and retried a second later".into(),
            ));
            checks.push(at_least(
                f,
                "net.ipv4.tcp_max_syn_backlog",
                q,
                "half-open connections per listener: beyond it SYNs are answered with cookies, or dropped without them".into(),
            ));
            checks.push(syncookies(f));
        }
        Role::Client => {
            let (c, s) = port_range(n, f);
            checks.push(c);
            sources_needed = s;
            checks.push(tw_reuse(f));
        }
    }
    checks.push(conntrack(cfg, f));
    let (mem, memory_pages) = tcp_mem(n, f);
    checks.push(mem);
    checks.push(at_least(
        f,
        "net.core.netdev_max_backlog",
        n.min(MAX_NETDEV_BACKLOG),
        "packets queued per core before the stack takes them: a burst of connects or answers beyond it is dropped".into(),
    ));
    Evaluation {
        checks,
        procs_needed,
        sources_needed,
        memory_pages,
    }
}

/// `sysctl -w key=value`, the value quoted when it has spaces.
fn sysctl_w(key: &str, value: &str) -> String {
    if value.contains(' ') {
        format!("sysctl -w {key}=\"{value}\"")
    } else {
        format!("sysctl -w {key}={value}")
    }
}

fn change(key: &str, current: String, wanted: String, value: String, why: String) -> Check {
    Check {
        setting: key.into(),
        status: Status::Change,
        current: Some(current),
        wanted,
        why,
        command: Some(sysctl_w(key, &value)),
        fix: Some(Fix::Sysctl {
            key: key.into(),
            value,
        }),
    }
}

fn ok(key: &str, current: String, wanted: String, why: String) -> Check {
    Check {
        setting: key.into(),
        status: Status::Ok,
        current: Some(current),
        wanted,
        why,
        command: None,
        fix: None,
    }
}

/// A sysctl that cannot be read here: a host-wide one seen from inside a network namespace.
fn hidden(key: &str, wanted: String, why: String) -> Check {
    Check {
        setting: key.into(),
        status: Status::Check,
        current: None,
        wanted,
        why: format!("host-wide (or its module is not loaded), so not shown in this network namespace: read it on the host; {why}"),
        command: Some(format!("sysctl {key}")),
        fix: None,
    }
}

/// A one-number sysctl that must be at least `want`.
fn at_least(f: &Facts, key: &str, want: u64, why: String) -> Check {
    let wanted = format!(">= {want}");
    match f.number(key) {
        None => hidden(key, wanted, why),
        Some(v) if v >= want => ok(key, v.to_string(), wanted, why),
        Some(v) => change(key, v.to_string(), wanted, want.to_string(), why),
    }
}

fn nofile(n: u64, margin: u64, procs: u64, f: &Facts) -> Vec<Check> {
    let need = n + margin;
    let (soft, hard) = (f.nofile_soft, f.nofile_hard);
    let want_soft = need.min(hard);
    let soft_line = Check {
        setting: "RLIMIT_NOFILE (soft)".into(),
        status: if soft >= want_soft {
            Status::Ok
        } else {
            Status::Change
        },
        current: Some(limit_text(soft)),
        wanted: format!(">= {want_soft}"),
        why: "descriptors a process may open now, one per connection: tcpkit load and echo raise theirs to the hard limit, other servers inherit it from the shell that starts them".into(),
        command: (soft < want_soft).then(|| format!("ulimit -n {want_soft}")),
        fix: (soft < want_soft).then(|| Fix::Manual("a process's limits come from the shell that starts it and tcpkit cannot change its shell's: run the command there".into())),
    };
    let setting = "RLIMIT_NOFILE (hard)".to_string();
    let current = Some(limit_text(hard));
    let hard_line = if hard >= need {
        Check {
            setting,
            status: Status::Ok,
            current,
            wanted: format!(">= {need}"),
            why: format!("the most a process may raise its soft limit to: {n} connections and {margin} descriptors of its own fit in one process"),
            command: None,
            fix: None,
        }
    } else if f.cap_sys_resource {
        Check {
            setting,
            status: Status::Change,
            current,
            wanted: format!(">= {need}"),
            why: format!("the most a process may raise its soft limit to: {n} connections and {margin} descriptors of its own do not fit (raising it needs CAP_SYS_RESOURCE, which this shell has; it may not exceed fs.nr_open)"),
            command: Some(format!("ulimit -Hn {need}")),
            fix: Some(Fix::Manual("limits come from the shell that starts the server: run the command there, or set LimitNOFILE= in its systemd unit".into())),
        }
    } else {
        Check {
            setting,
            status: Status::Ok,
            current,
            wanted: format!("--procs {procs} at this limit (one process would need >= {need})"),
            why: format!("without CAP_SYS_RESOURCE (as in this container) no process started from here can raise it, so one process holds at most {} connections: use --procs {procs} (tcpkit load chooses it itself)", hard.saturating_sub(margin)),
            command: None,
            fix: None,
        }
    };
    let mut nr_open = at_least(
        f,
        "fs.nr_open",
        need,
        "the ceiling of any process's hard RLIMIT_NOFILE".into(),
    );
    if nr_open.status == Status::Change && hard < need && !f.cap_sys_resource {
        // Raising the ceiling helps nobody who may not raise the hard limit up to it.
        nr_open = ok(
            "fs.nr_open",
            nr_open.current.unwrap_or_default(),
            nr_open.wanted,
            format!("the ceiling of any process's hard RLIMIT_NOFILE; this shell cannot raise its hard limit anyway, so --procs {procs} is the way"),
        );
    }
    vec![soft_line, hard_line, nr_open]
}

fn syncookies(f: &Facts) -> Check {
    let key = "net.ipv4.tcp_syncookies";
    let why = "when a listener's SYN queue is full, cookies keep accepting connects instead of dropping them".to_string();
    match f.number(key) {
        None => hidden(key, "1".into(), why),
        // 2 sends cookies always: connects still succeed.
        Some(v @ (1 | 2)) => ok(key, v.to_string(), "1".into(), why),
        Some(v) => change(key, v.to_string(), "1".into(), "1".into(), why),
    }
}

fn tw_reuse(f: &Facts) -> Check {
    let key = "net.ipv4.tcp_tw_reuse";
    let why = "new connections may reuse a local port still in TIME_WAIT (safe with TCP timestamps; 2 means loopback only): with reconnects (--queries-per-conn) the ports run out otherwise".to_string();
    match f.number(key) {
        None => hidden(key, "1".into(), why),
        Some(1) => ok(key, "1".into(), "1".into(), why),
        Some(v) => change(key, v.to_string(), "1".into(), "1".into(), why),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The client's port range, and the source addresses it makes the connections need.
fn port_range(n: u64, f: &Facts) -> (Check, Option<u64>) {
    let key = "net.ipv4.ip_local_port_range";
    let (wlo, whi) = WIDEST_PORTS;
    let widest = u64::from(whi - wlo) + 1;
    let wanted_value = format!("{wlo} {whi}");
    let Some((lo, hi)) = f.port_range() else {
        let why = format!(
            "local ports per source address and server address:port; {wlo}-{whi} gives {widest}"
        );
        return (hidden(key, wanted_value, why), None);
    };
    let ports = u64::from(hi - lo) + 1;
    let sources = n.div_ceil(ports);
    let at_widest = n.div_ceil(widest);
    let current = format!("{lo} {hi}");
    let mut why = format!(
        "{ports} local ports per source address and server address:port: {n} connections need {} (tcpkit load --source)",
        plural(sources, "source address", "source addresses")
    );
    let check = if sources <= 1 || (lo <= wlo && hi >= whi) {
        ok(
            key,
            current,
            format!(">= {n} ports, or {wanted_value}"),
            why,
        )
    } else {
        why.push_str(&format!(
            "; {wlo}-{whi} needs {at_widest} (keep listening ports out with net.ipv4.ip_local_reserved_ports)"
        ));
        change(key, current, wanted_value.clone(), wanted_value, why)
    };
    (check, Some(sources))
}

/// The NOTRACK rules that keep the port's connections out of conntrack in this namespace.
fn notrack(cfg: &TuneConfig) -> String {
    let p = cfg.port;
    // Packets to a server's port arrive with it as dport and leave with it as sport; a
    // client sees the reverse.
    let (inbound, outbound) = match cfg.role {
        Role::Server => ("dport", "sport"),
        Role::Client => ("sport", "dport"),
    };
    format!(
        "nft add table inet raw; nft 'add chain inet raw pre {{ type filter hook prerouting priority raw; }}'; nft add rule inet raw pre tcp {inbound} {p} notrack; nft 'add chain inet raw out {{ type filter hook output priority raw; }}'; nft add rule inet raw out tcp {outbound} {p} notrack"
    )
}

fn conntrack(cfg: &TuneConfig, f: &Facts) -> Check {
    let key = "net.netfilter.nf_conntrack_max";
    if f.get(key).is_none() {
        return ok(
            key,
            "nf_conntrack not loaded".into(),
            format!(">= {} or not loaded", cfg.connections),
            "connections are not tracked".into(),
        );
    }
    let count = f.number("net.netfilter.nf_conntrack_count").unwrap_or(0);
    at_least(
        f,
        key,
        cfg.connections + count,
        format!(
            "nf_conntrack is loaded: if a firewall rule here tracks connections ({count} tracked now), each takes an entry and new ones are dropped when the table is full; or keep port {} out of it in this namespace with `{}`",
            cfg.port,
            notrack(cfg)
        ),
    )
}

/// tcp_mem against the pages `n` sockets hold if each keeps its minimum buffers.
fn tcp_mem(n: u64, f: &Facts) -> (Check, u64) {
    let key = "net.ipv4.tcp_mem";
    let min_of = |k| {
        f.numbers(k)
            .and_then(|v| v.first().copied())
            .unwrap_or(4096)
    };
    let (rmin, wmin) = (min_of("net.ipv4.tcp_rmem"), min_of("net.ipv4.tcp_wmem"));
    let per_socket = (rmin + wmin).div_ceil(f.page_size);
    let pages = n.saturating_mul(per_socket);
    let mib = pages.saturating_mul(f.page_size) >> 20;
    let mut why = format!(
        "pages all TCP sockets may hold (low, pressure, high): {n} sockets with their minimum buffers (tcp_rmem {rmin} + tcp_wmem {wmin} bytes) hold {pages} pages ({mib} MiB); past the high mark sends and receives fail"
    );
    if let Some(total) = f.mem_pages.filter(|&t| pages > t) {
        why.push_str(&format!(
            "; that is more than this host's memory ({} MiB)",
            total.saturating_mul(f.page_size) >> 20
        ));
    }
    let wanted = format!("high >= {pages}");
    let check = match f.numbers(key).as_deref() {
        Some(&[low, pressure, high]) if high >= pages => {
            ok(key, format!("{low} {pressure} {high}"), wanted, why)
        }
        Some(&[low, pressure, high]) => {
            // Pressure (buffers trimmed to their minimum) starts where the estimate is; the
            // high mark leaves a quarter more for sockets that hold more than the minimum.
            let value = format!(
                "{low} {} {}",
                pressure.max(pages),
                high.max(pages.saturating_add(pages / 4))
            );
            change(key, format!("{low} {pressure} {high}"), wanted, value, why)
        }
        _ => hidden(key, wanted, why),
    };
    (check, pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(n: u64) -> TuneConfig {
        TuneConfig {
            role: Role::Server,
            connections: n,
            port: 4242,
        }
    }

    fn client(n: u64) -> TuneConfig {
        TuneConfig {
            role: Role::Client,
            ..server(n)
        }
    }

    /// This machine's root namespace, as read on it.
    fn this_host() -> Facts {
        Facts::fixture(&[
            ("fs.nr_open", "1048576"),
            ("fs.file-max", "2466183"),
            ("fs.file-nr", "604\t0\t2466183"),
            ("net.core.somaxconn", "4096"),
            ("net.core.netdev_max_backlog", "1000"),
            ("net.ipv4.tcp_max_syn_backlog", "2048"),
            ("net.ipv4.tcp_syncookies", "1"),
            ("net.ipv4.ip_local_port_range", "32768\t60999"),
            ("net.ipv4.tcp_tw_reuse", "2"),
            ("net.ipv4.tcp_mem", "287901\t383869\t575802"),
            ("net.ipv4.tcp_rmem", "4096\t131072\t33554432"),
            ("net.ipv4.tcp_wmem", "4096\t16384\t4194304"),
            ("net.netfilter.nf_conntrack_max", "262144"),
            ("net.netfilter.nf_conntrack_count", "0"),
        ])
    }

    fn find<'a>(e: &'a Evaluation, key: &str) -> &'a Check {
        e.checks
            .iter()
            .find(|c| c.setting == key)
            .unwrap_or_else(|| panic!("no check for {key}"))
    }

    fn keys(e: &Evaluation) -> Vec<&str> {
        e.checks.iter().map(|c| c.setting.as_str()).collect()
    }

    #[test]
    fn each_role_checks_its_settings_in_order() {
        let f = this_host();
        assert_eq!(
            keys(&evaluate(&server(10), &f)),
            [
                "RLIMIT_NOFILE (soft)",
                "RLIMIT_NOFILE (hard)",
                "fs.nr_open",
                "fs.file-max",
                "net.core.somaxconn",
                "net.ipv4.tcp_max_syn_backlog",
                "net.ipv4.tcp_syncookies",
                "net.netfilter.nf_conntrack_max",
                "net.ipv4.tcp_mem",
                "net.core.netdev_max_backlog"
            ]
        );
        assert_eq!(
            keys(&evaluate(&client(10), &f)),
            [
                "RLIMIT_NOFILE (soft)",
                "RLIMIT_NOFILE (hard)",
                "fs.nr_open",
                "fs.file-max",
                "net.ipv4.ip_local_port_range",
                "net.ipv4.tcp_tw_reuse",
                "net.netfilter.nf_conntrack_max",
                "net.ipv4.tcp_mem",
                "net.core.netdev_max_backlog"
            ]
        );
    }

    #[test]
    fn a_million_server_connections_on_this_host() {
        let e = evaluate(&server(1_000_000), &this_host());
        // 20000 - (64 + 4 * 2) = 19928 per process.
        assert_eq!(e.procs_needed, 1_000_000u64.div_ceil(19_928));
        assert_eq!(e.procs_needed, 51);
        let hard = find(&e, "RLIMIT_NOFILE (hard)");
        assert_eq!(hard.status, Status::Ok);
        // Issue 10, case 10: "OK ... = 20000, want >= 1000072" read as OK below what is wanted.
        assert_eq!(
            hard.wanted,
            "--procs 51 at this limit (one process would need >= 1000072)"
        );
        assert!(hard.why.contains("at most 19928 connections"));
        assert_eq!(find(&e, "RLIMIT_NOFILE (soft)").status, Status::Ok);
        assert_eq!(find(&e, "fs.nr_open").status, Status::Ok);
        let q = find(&e, "net.core.somaxconn");
        assert_eq!(
            (q.status, q.wanted.as_str(), q.command.as_deref()),
            (
                Status::Change,
                ">= 65535",
                Some("sysctl -w net.core.somaxconn=65535")
            )
        );
        assert_eq!(
            q.fix,
            Some(Fix::Sysctl {
                key: "net.core.somaxconn".into(),
                value: "65535".into()
            })
        );
        assert_eq!(
            find(&e, "net.ipv4.tcp_max_syn_backlog").status,
            Status::Change
        );
        assert_eq!(find(&e, "net.ipv4.tcp_syncookies").status, Status::Ok);
        let ct = find(&e, "net.netfilter.nf_conntrack_max");
        assert_eq!(ct.status, Status::Change);
        assert!(ct
            .why
            .contains("nft add rule inet raw pre tcp dport 4242 notrack"));
        // 2 pages per socket (4096 + 4096 bytes).
        assert_eq!(e.memory_pages, 2_000_000);
        let m = find(&e, "net.ipv4.tcp_mem");
        assert_eq!(m.status, Status::Change);
        assert_eq!(
            m.command.as_deref(),
            Some("sysctl -w net.ipv4.tcp_mem=\"287901 2000000 2500000\"")
        );
        assert_eq!(find(&e, "net.core.netdev_max_backlog").wanted, ">= 16384");
        assert_eq!(e.changes(), 5);
    }

    #[test]
    fn a_small_server_fits_as_it_is() {
        let e = evaluate(&server(1000), &this_host());
        assert_eq!(e.changes(), 0, "{:#?}", e.checks);
        assert_eq!(e.procs_needed, 1);
        assert_eq!(find(&e, "RLIMIT_NOFILE (hard)").wanted, ">= 1072");
    }

    #[test]
    fn hard_limit_with_cap_sys_resource_is_a_change() {
        let mut f = this_host();
        f.cap_sys_resource = true;
        let e = evaluate(&server(1_000_000), &f);
        let hard = find(&e, "RLIMIT_NOFILE (hard)");
        assert_eq!(hard.status, Status::Change);
        assert_eq!(hard.command.as_deref(), Some("ulimit -Hn 1000072"));
        assert!(matches!(hard.fix, Some(Fix::Manual(_))));
        // With the privilege, a low ceiling matters.
        f.sysctl.insert("fs.nr_open".into(), "500000".into());
        let e = evaluate(&server(1_000_000), &f);
        assert_eq!(find(&e, "fs.nr_open").status, Status::Change);
        // Without it, the ceiling is not the way.
        f.cap_sys_resource = false;
        let e = evaluate(&server(1_000_000), &f);
        assert_eq!(find(&e, "fs.nr_open").status, Status::Ok);
    }

    #[test]
    fn soft_limit_below_what_the_hard_one_allows() {
        let mut f = this_host();
        f.nofile_soft = 1024;
        let e = evaluate(&client(5000), &f);
        let soft = find(&e, "RLIMIT_NOFILE (soft)");
        assert_eq!(soft.status, Status::Change);
        assert_eq!(soft.command.as_deref(), Some("ulimit -n 5072"));
        // Never more than the hard limit: past it, --procs.
        let e = evaluate(&client(50_000), &f);
        assert_eq!(
            find(&e, "RLIMIT_NOFILE (soft)").command.as_deref(),
            Some("ulimit -n 20000")
        );
    }

    #[test]
    fn client_sources_follow_the_port_range() {
        let mut f = this_host();
        f.sysctl
            .insert("net.ipv4.ip_local_port_range".into(), "40000 40999".into());
        let e = evaluate(&client(4500), &f);
        assert_eq!(e.sources_needed, Some(5));
        let c = find(&e, "net.ipv4.ip_local_port_range");
        assert_eq!(c.status, Status::Change);
        assert!(
            c.why.starts_with("1000 local ports per source address and server address:port: 4500 connections need 5 source addresses (tcpkit load --source); 1024-65535 needs 1 "),
            "{}",
            c.why
        );
        assert_eq!(
            c.command.as_deref(),
            Some("sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\"")
        );
        // A range that holds them all is fine however narrow.
        let e = evaluate(&client(1000), &f);
        assert_eq!(e.sources_needed, Some(1));
        assert_eq!(find(&e, "net.ipv4.ip_local_port_range").status, Status::Ok);
        // The widest range is fine however many addresses it still takes.
        f.sysctl
            .insert("net.ipv4.ip_local_port_range".into(), "1024 65535".into());
        let e = evaluate(&client(1_000_000), &f);
        assert_eq!(e.sources_needed, Some(16));
        assert_eq!(find(&e, "net.ipv4.ip_local_port_range").status, Status::Ok);
        assert_eq!(evaluate(&server(1_000_000), &f).sources_needed, None);
    }

    #[test]
    fn client_wants_tw_reuse_and_reverse_notrack() {
        let e = evaluate(&client(1_000_000), &this_host());
        let tw = find(&e, "net.ipv4.tcp_tw_reuse");
        assert_eq!(
            (tw.status, tw.command.as_deref()),
            (Status::Change, Some("sysctl -w net.ipv4.tcp_tw_reuse=1"))
        );
        let ct = find(&e, "net.netfilter.nf_conntrack_max");
        assert!(ct.why.contains("pre tcp sport 4242 notrack"), "{}", ct.why);
        assert!(ct.why.contains("out tcp dport 4242 notrack"), "{}", ct.why);
    }

    #[test]
    fn syncookies_off_is_a_change() {
        let mut f = this_host();
        for (v, want) in [("0", Status::Change), ("1", Status::Ok), ("2", Status::Ok)] {
            f.sysctl.insert("net.ipv4.tcp_syncookies".into(), v.into());
            assert_eq!(
                find(&evaluate(&server(10), &f), "net.ipv4.tcp_syncookies").status,
                want
            );
        }
    }

    #[test]
    fn hidden_settings_are_checks_with_the_command_to_read_them() {
        let mut f = this_host();
        f.sysctl.remove("net.ipv4.tcp_mem");
        f.sysctl.remove("net.core.netdev_max_backlog");
        let e = evaluate(&server(10), &f);
        let m = find(&e, "net.ipv4.tcp_mem");
        assert_eq!(
            (m.status, m.current.as_deref(), m.command.as_deref()),
            (Status::Check, None, Some("sysctl net.ipv4.tcp_mem"))
        );
        assert_eq!(e.count(Status::Check), 2);
        assert_eq!(e.changes(), 0);
    }

    #[test]
    fn no_conntrack_module_is_fine() {
        let mut f = this_host();
        f.sysctl.remove("net.netfilter.nf_conntrack_max");
        let ct = evaluate(&server(1_000_000), &f)
            .checks
            .into_iter()
            .find(|c| c.setting == "net.netfilter.nf_conntrack_max")
            .unwrap();
        assert_eq!(ct.status, Status::Ok);
        assert_eq!(ct.current.as_deref(), Some("nf_conntrack not loaded"));
    }

    #[test]
    fn memory_beyond_the_host_is_said() {
        let e = evaluate(&server(10_000_000), &this_host());
        assert!(find(&e, "net.ipv4.tcp_mem")
            .why
            .ends_with("that is more than this host's memory (24576 MiB)"));
    }
}
