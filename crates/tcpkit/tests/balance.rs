//! `tcpkit balance run` as users run it: `ip netns exec HOST tcpkit balance run ... -- CMD` in
//! one lab host (so cgroup2 is mounted privately, as under any `ip netns exec`), real backends
//! listening in the other, the client a real process in the balanced cgroup (this test binary
//! run again as `client_in_cgroup`). What stays in the kernel is checked with bpftool.

use crate::common;
use crate::common::unbound;
use common::schema;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::tcpkit;
use serde_json::Value;
use tcpkit_lab::{Host, Lab};
use tcpkit_wire::dns;

/// The VIP: in the lab's test range, routed nowhere, so only a translated connect reaches
/// anything.
const VIP: &str = "198.19.0.1:6379";
/// The backends' host in `Lab::pair` (host b).
const SRV: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const SRV6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 2);
/// An IPv6 VIP, and the IPv4 VIP as an IPv6 socket names it.
const VIP6: &str = "[fd00:19::1]:6379";
const VIP_MAPPED: &str = "[::ffff:198.19.0.1]:6379";
/// The client's environment variable: `VIP;N;GOFILE[;STARTFILE]` (GOFILE may be empty).
const CLIENT_ENV: &str = "TCPKIT_BALANCE_TEST_CLIENT";
const CLIENT_UDP_ENV: &str = "TCPKIT_BALANCE_TEST_UDP_CLIENT";

/// The bpftool checks read every program in the kernel: one balance test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Not a test of its own: the client that `balance run` starts (this binary again, with
/// CLIENT_ENV set). It connects N times to the VIP and prints, per connect, what getpeername()
/// returned and which backend answered (`CONN <peer> <backend port>`) or the errno (`ERR n`),
/// then `READY`, then waits for GOFILE to exist (at most 25 s) so the test can look at the
/// kernel while it runs.
#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn client_in_cgroup() {
    let spec = common::helper_env(CLIENT_ENV);
    let f: Vec<&str> = spec.split(';').collect();
    let vip: SocketAddr = f[0].parse().unwrap();
    let n: usize = f[1].parse().unwrap();
    if let Some(start) = f.get(3) {
        let until = Instant::now() + Duration::from_secs(25);
        while !Path::new(start).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("STARTED");
    }
    let mut out = std::io::stdout().lock();
    // libtest has printed `test balance::client_in_cgroup ... ` without a newline.
    writeln!(out).unwrap();
    for _ in 0..n {
        match TcpStream::connect_timeout(&vip, Duration::from_secs(5)) {
            Ok(s) => {
                let peer = s.peer_addr().unwrap();
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                writeln!(out, "CONN {peer} {}", line.trim()).unwrap();
            }
            Err(e) => writeln!(out, "ERR {}", e.raw_os_error().unwrap_or(0)).unwrap(),
        }
    }
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    if let Some(go) = f.get(2).filter(|g| !g.is_empty()) {
        let until = Instant::now() + Duration::from_secs(25);
        while !Path::new(go).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Not a test of its own: the UDP client `balance run` starts (CLIENT_UDP_ENV = the VIP,
/// then `;STARTFILE` when it must wait for that file to exist before it starts). Two unconnected sockets send three DNS queries each to the VIP (`UDP <socket> <source of
/// the reply> <rcode> <answers>`), then a connected socket one (`UDPC <peer> <source> ...`).
#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn udp_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_UDP_ENV);
    let (vip, start) = spec.split_once(';').unwrap_or((&spec, ""));
    let vip: SocketAddr = vip.parse().unwrap();
    let until = Instant::now() + Duration::from_secs(25);
    while !start.is_empty() && !Path::new(start).exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    let ask = |s: &UdpSocket, id: u16, to: Option<SocketAddr>| -> (SocketAddr, u8, u16) {
        let mut q = Vec::new();
        dns::write_tcp_query(
            &mut q,
            id,
            &unbound::WWW_EXAMPLE.parse().unwrap(),
            dns::TYPE_A,
        );
        // A TCP query less its 2-byte length is the UDP query.
        match to {
            Some(a) => s.send_to(&q[2..], a).unwrap(),
            None => s.send(&q[2..]).unwrap(),
        };
        let mut buf = [0u8; 1500];
        let (n, from) = common::sock::no_eintr(|| s.recv_from(&mut buf)).unwrap();
        let r = dns::parse_response(&buf[..n]).unwrap();
        assert_eq!(r.id, id);
        (from, r.rcode, r.answers)
    };
    let any = if vip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    for sock in 0..2 {
        let s = UdpSocket::bind(any).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for i in 0..3 {
            let (from, rcode, answers) = ask(&s, sock * 16 + i, Some(vip));
            writeln!(out, "UDP {sock} {from} {rcode} {answers}").unwrap();
        }
    }
    let s = UdpSocket::bind(any).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.connect(vip).unwrap();
    let (from, rcode, answers) = ask(&s, 99, None);
    writeln!(
        out,
        "UDPC {} {from} {rcode} {answers}",
        s.peer_addr().unwrap()
    )
    .unwrap();
}

/// A backend in host b: answers each connection with its own port and a newline, counting.
struct Backend {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    /// Set to stop it: its listener is closed, so connects to it are refused.
    dead: Arc<std::sync::atomic::AtomicBool>,
}

impl Backend {
    /// Stops accepting and closes the listener; returns once it is closed.
    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        while Arc::strong_count(&self.dead) > 1 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn backend(host: &Host) -> Backend {
    backend_on(host, SocketAddr::from((SRV, 0)))
}

fn backend_on(host: &Host, at: SocketAddr) -> Backend {
    let l = host.enter(|| TcpListener::bind(at).unwrap());
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (n, d) = (Arc::clone(&accepted), Arc::clone(&dead));
    l.set_nonblocking(true).unwrap();
    // Runs until killed or the test process ends: its port is in a namespace the lab removes.
    std::thread::spawn(move || {
        while !d.load(Ordering::SeqCst) {
            match l.accept() {
                Ok((s, _)) => {
                    n.fetch_add(1, Ordering::SeqCst);
                    let _ = s.set_nonblocking(false);
                    let _ = (&s).write_all(format!("{}\n", addr.port()).as_bytes());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        drop(l);
        drop(d);
    });
    Backend {
        addr,
        accepted,
        dead,
    }
}

/// `tcpkit balance run ARGS -- env CLIENT_ENV=... <this binary> client_in_cgroup`.
fn argv(args: &[&str], client: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let mut v: Vec<String> = vec![tcpkit().into(), "balance".into(), "run".into()];
    v.extend(args.iter().map(|s| s.to_string()));
    v.extend([
        "--".into(),
        "env".into(),
        format!("{CLIENT_ENV}={client}"),
        exe.display().to_string(),
    ]);
    v.extend(helper_args("client_in_cgroup"));
    v
}

/// The arguments that make this binary run only the helper-process test `test` of this file.
fn helper_args(test: &str) -> Vec<String> {
    common::helper_args(module_path!(), test)
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// (peer shown by getpeername, backend port that answered) per connect.
fn conns(text: &str) -> Vec<(String, u16)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("CONN "))
        .map(|l| {
            let (peer, port) = l.split_once(' ').unwrap();
            (peer.to_string(), port.parse().unwrap())
        })
        .collect()
}

/// Where this (root-cgroup) test process sees the cgroup balance with pid `pid` creates.
fn cgroup_of(pid: u32) -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = tcpkit_balance::cgroup::mount_in(&info).expect("a cgroup2 mount on this host");
    let own = tcpkit_balance::cgroup::own_path().unwrap();
    mount
        .join(own.trim_start_matches('/'))
        .join(format!("{}{pid}", tcpkit_balance::cgroup::CHILD_PREFIX))
}

fn bpftool(args: &[&str]) -> (bool, Value) {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("bpftool (scripts/setup.sh installs it)");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), v)
}

/// The programs attached to `cg` (their ids) and the maps they use, via the kernel's query.
fn attached(cg: &Path) -> (Vec<u64>, Vec<u64>) {
    let (_, v) = bpftool(&["cgroup", "show", cg.to_str().unwrap()]);
    let progs: Vec<u64> = v
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["id"].as_u64()).collect())
        .unwrap_or_default();
    let mut maps = Vec::new();
    for id in &progs {
        let (_, p) = bpftool(&["prog", "show", "id", &id.to_string()]);
        maps.extend(
            p["map_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64),
        );
    }
    maps.sort_unstable();
    maps.dedup();
    (progs, maps)
}

/// The hooks attached to `cg` (`connect4`, ...: our programs' names less `tk_`), sorted, by
/// the kernel's own query.
fn hooks_on(cg: &Path) -> Vec<String> {
    let (_, v) = bpftool(&["cgroup", "show", cg.to_str().unwrap()]);
    let mut h: Vec<String> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str()?.strip_prefix("tk_").map(String::from))
        .collect();
    h.sort();
    h
}

/// connect4/6 and getpeername4/6: what a TCP-only balancer attaches.
const TCP_HOOKS: [&str; 4] = ["connect4", "connect6", "getpeername4", "getpeername6"];
/// Every hook: a balancer with a UDP service.
const ALL_HOOKS: [&str; 8] = [
    "connect4",
    "connect6",
    "getpeername4",
    "getpeername6",
    "recvmsg4",
    "recvmsg6",
    "sendmsg4",
    "sendmsg6",
];

/// Waits (at most 10 s: programs and maps are freed after an RCU grace period) until none of
/// `progs` and `maps` exists any more, and checks no `tk_` program is attached anywhere.
fn assert_all_gone(progs: &[u64], maps: &[u64]) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left_p: Vec<u64> = progs
            .iter()
            .copied()
            .filter(|id| bpftool(&["prog", "show", "id", &id.to_string()]).0)
            .collect();
        let left_m: Vec<u64> = maps
            .iter()
            .copied()
            .filter(|id| bpftool(&["map", "show", "id", &id.to_string()]).0)
            .collect();
        if left_p.is_empty() && left_m.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "still in the kernel 10 s after balance ended: programs {left_p:?}, maps {left_m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // None of ours attached anywhere (by id: on a shared host other balance runs may have
    // their own tk_ programs attached meanwhile).
    let (_, tree) = bpftool(&["cgroup", "tree"]);
    let ours: Vec<&Value> = tree
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|cg| cg["programs"].as_array().into_iter().flatten())
        .filter(|p| p["id"].as_u64().is_some_and(|id| progs.contains(&id)))
        .collect();
    assert!(ours.is_empty(), "still attached: {ours:?}");
}

fn wait_for(proc: &tcpkit_lab::Proc, what: &str, secs: u64) {
    let until = Instant::now() + Duration::from_secs(secs);
    while !proc.log().contains(what) {
        assert!(
            Instant::now() < until,
            "no {what} within {secs} s; log:\n{}",
            proc.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn run_round_robin_alternates_shows_the_vip_and_leaves_nothing() {
    let _g = serial();
    let (mut lab, cli, srv, _link) = Lab::pair("balrr").unwrap_or_else(|e| panic!("{e}"));
    let (b1, b2) = (backend(&srv), backend(&srv));
    assert_ne!(b1.addr.port(), b2.addr.port());
    let go = lab.dir().join("go");
    let args = [
        "--vip".to_string(),
        VIP.into(),
        "--backend".into(),
        b1.addr.to_string(),
        "--backend".into(),
        b2.addr.to_string(),
        "--algorithm".into(),
        "round-robin".into(),
    ];
    let argv = argv(&refs(&args), &format!("{VIP};20;{}", go.display()));
    let p = cli
        .spawn(&mut lab, "balance", &refs(&argv))
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for(&p, "READY", 20);

    // While it runs: the eight programs attached to its cgroup (--vip balances TCP and UDP
    // alike by default), found by the kernel's own query.
    let cg = cgroup_of(p.pid());
    let (progs, maps) = attached(&cg);
    assert_eq!(progs.len(), 8, "programs on {}: {progs:?}", cg.display());
    assert_eq!(hooks_on(&cg), ALL_HOOKS, "{}", cg.display());
    assert!(maps.len() >= 3, "maps {maps:?}");
    // A process outside the cgroup (this test, in the same host) is not translated: the VIP
    // is routed nowhere.
    let outside = cli.enter(|| {
        TcpStream::connect_timeout(&VIP.parse().unwrap(), Duration::from_secs(2)).map(|_| ())
    });
    assert!(
        outside.is_err(),
        "a connect outside the cgroup reached something"
    );

    std::fs::write(&go, "").unwrap();
    let st = p
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("balance ends with its command");
    let log = p.log();
    assert_eq!(st.code(), Some(0), "{log}");
    let c = conns(&log);
    assert_eq!(c.len(), 20, "{log}");
    for (i, (peer, port)) in c.iter().enumerate() {
        assert_eq!(peer, VIP, "getpeername of connect {i}");
        if i > 0 {
            assert_ne!(
                *port,
                c[i - 1].1,
                "round-robin repeated a backend at {i}: {c:?}"
            );
        }
    }
    assert_eq!(b1.accepted.load(Ordering::SeqCst), 10);
    assert_eq!(b2.accepted.load(Ordering::SeqCst), 10);
    assert!(
        log.contains(&format!("{}          10 connects", b1.addr)) || log.contains("10 connects"),
        "{log}"
    );
    assert!(log.contains("Connects: 20 translated, 0 refused"), "{log}");
    assert!(!cg.exists(), "{} left behind", cg.display());
    assert_all_gone(&progs, &maps);
}

#[test]
fn run_random_within_a_binomial_bound_json_report() {
    let _g = serial();
    let (_lab, cli, srv, _link) = Lab::pair("balrnd").unwrap_or_else(|e| panic!("{e}"));
    let (b1, b2) = (backend(&srv), backend(&srv));
    let args = [
        "--vip".to_string(),
        VIP.into(),
        "--backend".into(),
        b1.addr.to_string(),
        "--backend".into(),
        b2.addr.to_string(),
        "--json".into(),
    ];
    let n = 400;
    let argv = argv(&refs(&args), &format!("{VIP};{n};"));
    let out = cli.command(&refs(&argv)).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // --json: stdout is the report alone; the command's lines went to stderr.
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    schema::check(&schema::load("balance"), &v, "balance");
    let c = conns(&stderr);
    assert_eq!(c.len(), n, "{stderr}");
    assert!(c.iter().all(|(peer, _)| peer == VIP));
    let k = b1.accepted.load(Ordering::SeqCst) as i64;
    assert_eq!(k + b2.accepted.load(Ordering::SeqCst) as i64, n as i64);
    // Binomial(400, 1/2): sd 10; 5 sd either side fails once in ~1.7 million runs.
    assert!((150..=250).contains(&k), "backend 1 got {k} of {n}");
    let picks: Vec<i64> = v["services"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["connects"].as_i64().unwrap())
        .collect();
    assert_eq!(
        picks,
        [k, n as i64 - k],
        "the report's counts are the backends' own"
    );
    assert_eq!(v["translated"], n);
    assert!(v["getpeername_vip"].as_u64().unwrap() >= n as u64);
    assert_eq!(
        v["private_mount"], true,
        "under ip netns exec cgroup2 is mounted privately"
    );
}

#[test]
fn run_no_backend_refuses_and_exits_with_the_commands_status() {
    let _g = serial();
    let (_lab, cli, _srv, _link) = Lab::pair("balno").unwrap_or_else(|e| panic!("{e}"));
    let argv = argv(&["--vip", VIP], &format!("{VIP};3;"));
    let out = cli.command(&refs(&argv)).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("ERR "))
            .collect::<Vec<_>>(),
        ["ERR 111"; 3],
        "ECONNREFUSED for each connect: {stdout}"
    );
    assert!(stderr.contains("0 translated, 3 refused"), "{stderr}");
    for (cmd, want) in [("exit 7", 7), ("kill -TERM $$", 143)] {
        let out = cli
            .command(&[
                tcpkit(),
                "balance",
                "run",
                "--vip",
                VIP,
                "-q",
                "--",
                "sh",
                "-c",
                cmd,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(want), "{cmd}: {out:?}");
        assert!(out.stderr.is_empty(), "-q: {out:?}");
    }
}

#[test]
fn nothing_stays_attached_after_sigterm_or_sigkill() {
    let _g = serial();
    let (mut lab, cli, srv, _link) = Lab::pair("balsig").unwrap_or_else(|e| panic!("{e}"));
    let b1 = backend(&srv);
    let go = lab.dir().join("never");
    // --protocol tcp: the UDP hooks stay off, which the kernel's query shows.
    let args = [
        "--vip".to_string(),
        VIP.into(),
        "--backend".into(),
        b1.addr.to_string(),
        "--protocol".into(),
        "tcp".into(),
    ];
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        let argv = argv(&refs(&args), &format!("{VIP};1;{}", go.display()));
        let p = cli
            .spawn(&mut lab, "balance", &refs(&argv))
            .unwrap_or_else(|e| panic!("{e}"));
        wait_for(&p, "READY", 20);
        let cg = cgroup_of(p.pid());
        let (progs, maps) = attached(&cg);
        assert_eq!(hooks_on(&cg), TCP_HOOKS, "{}", cg.display());
        assert_eq!(progs.len(), 4, "{}", cg.display());
        // To balance alone, not its process group: the command must learn of it from balance.
        // SAFETY: kill(2) on a child of this test, still running.
        assert_eq!(unsafe { libc::kill(p.pid() as i32, sig) }, 0);
        let st = p
            .wait_timeout(Duration::from_secs(15))
            .unwrap()
            .expect("balance ends");
        assert_all_gone(&progs, &maps);
        if sig == libc::SIGTERM {
            // Forwarded to the command, which the signal ended: 128 + 15, and the report.
            assert_eq!(st.code(), Some(143), "{}", p.log());
            assert!(p.log().contains("killed by signal 15"), "{}", p.log());
            assert!(!cg.exists(), "{} left behind", cg.display());
        } else {
            // The command was told by PR_SET_PDEATHSIG and is gone too; its empty cgroup is
            // swept by the next run.
            let until = Instant::now() + Duration::from_secs(10);
            while std::fs::read_to_string(cg.join("cgroup.events"))
                .is_ok_and(|t| t.contains("populated 1"))
            {
                assert!(Instant::now() < until, "the command outlived balance");
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = cli
                .command(&[tcpkit(), "balance", "run", "--vip", VIP, "-q", "--", "true"])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{out:?}");
            assert!(!cg.exists(), "{} not swept by the next run", cg.display());
        }
    }
}

#[test]
fn run_ipv6_and_v4_mapped() {
    let _g = serial();
    let (_lab, cli, srv, _link) = Lab::pair("bal6").unwrap_or_else(|e| panic!("{e}"));
    let (v6a, v6b) = (
        backend_on(&srv, SocketAddr::from((SRV6, 0))),
        backend_on(&srv, SocketAddr::from((SRV6, 0))),
    );
    let (v4a, v4b) = (backend(&srv), backend(&srv));
    // An IPv6 VIP over IPv6 backends; the IPv4 VIP asked for as ::ffff:198.19.0.1 by an
    // IPv6 socket, over IPv4 backends: getpeername shows each as the application named it.
    for (vip, asked, b) in [(VIP6, VIP6, [&v6a, &v6b]), (VIP, VIP_MAPPED, [&v4a, &v4b])] {
        let args = [
            "--vip".to_string(),
            vip.into(),
            "--backend".into(),
            b[0].addr.to_string(),
            "--backend".into(),
            b[1].addr.to_string(),
            "--algorithm".into(),
            "round-robin".into(),
        ];
        let argv = argv(&refs(&args), &format!("{asked};6;"));
        let out = cli.command(&refs(&argv)).output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let c = conns(&stdout);
        assert_eq!(c.len(), 6, "{vip}: {stdout}");
        let asked: SocketAddr = asked.parse().unwrap();
        for (i, (peer, port)) in c.iter().enumerate() {
            assert_eq!(*peer, asked.to_string(), "getpeername of connect {i}");
            assert_eq!(*port, b[i % 2].addr.port(), "{vip}: connect {i}: {c:?}");
        }
        assert!(b.iter().all(|b| b.accepted.load(Ordering::SeqCst) == 3));
        assert!(stderr.contains("Connects: 6 translated"), "{stderr}");
    }
}

/// `tcpkit balance run ARGS -- client N`, to completion; the (peer, backend port) per connect.
fn run_client(cli: &Host, args: &[String], n: usize) -> Vec<(String, u16)> {
    let argv = argv(&refs(args), &format!("{VIP};{n};"));
    let out = cli.command(&refs(&argv)).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let c = conns(&stdout);
    assert_eq!(c.len(), n, "{stdout}\n{stderr}");
    assert!(c.iter().all(|(peer, _)| peer == VIP));
    c
}

#[test]
fn run_weighted_and_maglev() {
    let _g = serial();
    let (_lab, cli, srv, _link) = Lab::pair("balw").unwrap_or_else(|e| panic!("{e}"));
    let (b1, b2) = (backend(&srv), backend(&srv));
    let with = |extra: &[&str], w2: &str| -> Vec<String> {
        let mut v = vec![
            "--vip".to_string(),
            VIP.into(),
            "--backend".into(),
            b1.addr.to_string(),
            "--backend".into(),
            format!("{}{w2}", b2.addr),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    // Weighted 1:3 over 400 connects: Binomial(400, 3/4) for b2, sd 8.7; 5 sd either side.
    let n = 400;
    let c = run_client(&cli, &with(&["--algorithm", "weighted"], "@3"), n);
    let k = c.iter().filter(|(_, p)| *p == b2.addr.port()).count();
    assert!((257..=343).contains(&k), "weight 3 of 4 got {k} of {n}");

    // Maglev by client: every connect of this client (unbound sockets, one namespace) lands
    // on the same backend, run after run while the set is the same.
    let args = with(&["--algorithm", "maglev"], "");
    let first = run_client(&cli, &args, 30);
    let again = run_client(&cli, &args, 30);
    let port = first[0].1;
    assert!(
        first.iter().chain(&again).all(|(_, p)| *p == port),
        "{first:?} {again:?}"
    );
    // Maglev by socket cookie: each socket placed on its own, so both backends are used
    // (all 60 on one: probability 2^-59).
    let c = run_client(
        &cli,
        &with(&["--algorithm", "maglev", "--hash-key", "cookie"], ""),
        60,
    );
    let k = c.iter().filter(|(_, p)| *p == b1.addr.port()).count();
    assert!(
        k > 0 && k < 60,
        "cookie-keyed maglev put {k} of 60 on one backend"
    );
}

#[test]
fn health_checks_take_a_dead_backend_out() {
    let _g = serial();
    let (mut lab, cli, srv, _link) = Lab::pair("balhc").unwrap_or_else(|e| panic!("{e}"));
    let (b1, b2) = (backend(&srv), backend(&srv));
    let start = lab.dir().join("start");
    let args = [
        "--vip".to_string(),
        VIP.into(),
        "--backend".into(),
        b1.addr.to_string(),
        "--backend".into(),
        b2.addr.to_string(),
        "--algorithm".into(),
        "round-robin".into(),
        "--health-interval".into(),
        "100ms".into(),
        "--health-timeout".into(),
        "500ms".into(),
        "--fall".into(),
        "2".into(),
    ];
    let argv = argv(&refs(&args), &format!("{VIP};20;;{}", start.display()));
    let p = cli
        .spawn(&mut lab, "balance", &refs(&argv))
        .unwrap_or_else(|e| panic!("{e}"));
    // Both probed and up for a while, then one backend dies.
    std::thread::sleep(Duration::from_millis(500));
    b1.kill();
    let killed = Instant::now();
    // Two refused probes 100 ms apart take it out: 0.3 s at most unloaded; 1.5 s here.
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&start, "").unwrap();
    let st = p
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("balance ends with its command");
    let log = p.log();
    assert_eq!(st.code(), Some(0), "{log}");
    assert!(
        !log.contains("ERR "),
        "a connect failed after the backend was out: {log}"
    );
    let c = conns(&log);
    assert_eq!(c.len(), 20, "{log}");
    assert!(
        c.iter().all(|(_, port)| *port == b2.addr.port()),
        "connects reached the dead backend {:.1} s after it died: {c:?}",
        killed.elapsed().as_secs_f64()
    );
    let line = log
        .lines()
        .find(|l| l.trim_start().starts_with(&b1.addr.to_string()))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("down at end") && line.contains("down 1 time"),
        "{line}"
    );
}

#[test]
fn udp_dns_through_the_vip_reaches_unbound_and_answers_from_the_vip_v4_v6_mapped() {
    let _g = serial();
    unbound::require();
    let (mut lab, cli, srv, _link) = Lab::pair("baludp").unwrap_or_else(|e| panic!("{e}"));
    let mut backends = Vec::new();
    for (i, (ip, port)) in [
        (IpAddr::V4(SRV), 5301u16),
        (IpAddr::V4(SRV), 5302),
        (IpAddr::V6(SRV6), 5303),
    ]
    .iter()
    .enumerate()
    {
        let dir = lab.dir().join(format!("unbound{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = unbound::write_conf(&dir, *ip, *port, 10);
        let argv = unbound::argv(&conf);
        srv.spawn(&mut lab, &format!("unbound{i}"), &refs(&argv))
            .unwrap_or_else(|e| panic!("{e}"));
        backends.push(SocketAddr::new(*ip, *port));
    }
    // Ready when each answers over TCP (the lab's client host reaches it directly).
    for addr in &backends {
        let until = Instant::now() + Duration::from_secs(15);
        cli.enter(|| {
            while TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_err() {
                assert!(Instant::now() < until, "unbound on {addr} not up in 15 s");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    let exe = std::env::current_exe().unwrap();
    // (VIP, as the client asks for it, its backends, picks expected per backend): IPv4; the
    // IPv4 VIP through IPv6 sockets (v4-mapped, sendmsg6); IPv6.
    let cases = [
        ("198.19.0.1:53", "198.19.0.1:53", &backends[..2], vec![2, 1]),
        (
            "198.19.0.1:53",
            "[::ffff:198.19.0.1]:53",
            &backends[..2],
            vec![2, 1],
        ),
        (
            "[fd00:19::1]:53",
            "[fd00:19::1]:53",
            &backends[2..],
            vec![3],
        ),
    ];
    for (vip, asked, bs, want) in cases {
        let mut argv = vec![
            tcpkit().to_string(),
            "balance".into(),
            "run".into(),
            "--vip".into(),
            vip.into(),
        ];
        for b in bs {
            argv.extend(["--backend".to_string(), b.to_string()]);
        }
        argv.extend([
            "--algorithm".into(),
            "round-robin".into(),
            "--json".into(),
            "--".into(),
            "env".into(),
            format!("{CLIENT_UDP_ENV}={asked}"),
            exe.display().to_string(),
        ]);
        argv.extend(helper_args("udp_client_in_cgroup"));
        let out = cli.command(&refs(&argv)).output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(0), "{asked}: {stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        schema::check(&schema::load("balance"), &v, "balance");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("UDP")).collect();
        assert_eq!(lines.len(), 7, "{asked}: {stderr}");
        let asked: SocketAddr = asked.parse().unwrap();
        for l in &lines[..6] {
            // Answered by unbound (NOERROR, one A record), the reply's source the VIP as the
            // client named it.
            assert!(l.ends_with(&format!(" {asked} 0 1")), "{l}");
        }
        assert_eq!(lines[6], format!("UDPC {asked} {asked} 0 1"), "{stderr}");
        // Each unconnected socket stayed on one backend (one pick each; round-robin: one per
        // backend), the connected socket was sent on in turn.
        let picks: Vec<u64> = v["services"][0]["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["connects"].as_u64().unwrap())
            .collect();
        assert_eq!(picks, want, "{asked}: {stdout}");
        assert!(v["getpeername_vip"].as_u64().unwrap() >= 7, "{stdout}");
    }
}

#[test]
fn trace_prints_every_selection_with_its_pid() {
    let _g = serial();
    let (_lab, cli, srv, _link) = Lab::pair("baltr").unwrap_or_else(|e| panic!("{e}"));
    let (b1, b2) = (backend(&srv), backend(&srv));
    let args = [
        "--vip".to_string(),
        VIP.into(),
        "--backend".into(),
        b1.addr.to_string(),
        "--backend".into(),
        b2.addr.to_string(),
        "--algorithm".into(),
        "round-robin".into(),
        "--trace".into(),
        "--json".into(),
    ];
    let argv = argv(&refs(&args), &format!("{VIP};4;"));
    let out = cli.command(&refs(&argv)).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    schema::check(&schema::load("balance"), &v, "balance");
    assert_eq!(v["trace_lost"], 0);
    // `env` execs the client: the command's pid is the one that connects.
    let pid = v["command"]["pid"].as_u64().unwrap();
    let traced: Vec<&str> = stderr.lines().filter(|l| l.contains("] trace: ")).collect();
    let c = conns(&stderr);
    assert_eq!((traced.len(), c.len()), (4, 4), "{stderr}");
    for (t, (_, port)) in traced.iter().zip(&c) {
        let want = format!("trace: pid {pid} cgroup ");
        assert!(t.contains(&want), "{t}");
        assert!(
            t.ends_with(&format!("connect {VIP} -> {SRV}:{port}")),
            "{t} is not the backend that answered"
        );
    }
}

/// The command writes to the stderr `--trace` prints on, at the same time: every trace line
/// and every one of the command's lines arrives whole. Trace lines were written in two calls
/// (text, then newline), and a line of the command's landing between them ran the two together.
#[test]
fn trace_lines_stay_whole_while_the_command_writes_to_the_same_stderr() {
    let _g = serial();
    let (_lab, cli, _srv, _link) = Lab::pair("baltw").unwrap_or_else(|e| panic!("{e}"));
    // Nothing listens there: each connect is refused at once, after balance chose it.
    let backend = format!("{SRV}:9");
    let (vip_ip, vip_port) = VIP.split_once(':').unwrap();
    let spam = "import os\nwhile True:\n    os.write(2, b'command-line\\n')\n";
    let connects = format!(
        "import socket\n\
         for _ in range(1000):\n\
         \x20   s = socket.socket()\n\
         \x20   try:\n\
         \x20       s.connect(('{vip_ip}', {vip_port}))\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         \x20   s.close()\n"
    );
    // The writer is a process of its own, so it writes while the connecting one is in connect().
    let sh = "python3 -c \"$0\" & w=$!; python3 -c \"$1\"; rc=$?; kill $w; exit $rc";
    let argv = [
        tcpkit(),
        "balance",
        "run",
        "--vip",
        VIP,
        "--backend",
        &backend,
        "--trace",
        "--",
        "sh",
        "-c",
        sh,
        spam,
        &connects,
    ];
    let out = cli.command(&argv).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        &stderr[stderr.len().saturating_sub(2000)..]
    );
    let want_end = format!(" connect {VIP} -> {backend}");
    let (mut traced, mut command) = (0, 0);
    for l in stderr.lines() {
        if l.contains("trace:") {
            assert!(
                l.starts_with('[') && l.contains("] trace: pid ") && l.ends_with(&want_end),
                "a trace line run together with another: {l:?}"
            );
            traced += 1;
        } else if l.contains("command-line") {
            assert_eq!(l, "command-line", "a command line cut into");
            command += 1;
        }
    }
    assert_eq!(
        traced, 1000,
        "every connect traced, each on a line of its own"
    );
    assert!(command > 0, "the command wrote while balance traced");
}

/// Each bad input: exit 2, one line naming the flag, nothing run; not root: exit 1, one line.
#[test]
fn bad_input_gives_one_line() {
    let cases: [(&[&str], &str); 8] = [
        (&["--vip", "198.19.0.1:0"], "--vip 198.19.0.1:0: port 0"),
        (
            &["--vip", "198.19.0.1:80", "--backend", "198.18.0.2:0"],
            "port 0",
        ),
        (
            &["--vip", "198.19.0.1:80", "--backend", "198.19.0.1:80"],
            "the same address as the VIP",
        ),
        (
            &[
                "--vip",
                "198.19.0.1:80",
                "--backend",
                "198.18.0.2:80",
                "--backend",
                "198.18.0.2:80",
            ],
            "given twice",
        ),
        (
            &["--vip", "198.19.0.1:80", "--backend", "[fd00:18::2]:80"],
            "address family",
        ),
        (&["--vip", "198.19.0.1:65536"], "not an IP:PORT"),
        (
            &["--vip", "198.19.0.1:80", "--backend", "198.18.0.2:80@2"],
            "weights need",
        ),
        (
            &["--vip", "198.19.0.1:80", "--hash-key", "cookie"],
            "--hash-key",
        ),
    ];
    let marker = std::env::temp_dir().join(format!("tcpkit-balance-bad-{}", std::process::id()));
    for (args, want) in cases {
        let out = Command::new(tcpkit())
            .args(["balance", "run"])
            .args(args)
            .args(["--", "touch", marker.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("tcpkit balance: ") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(!marker.exists(), "{args:?} ran the command");
    }
    // Not root (setpriv from util-linux): the kernel refuses the maps; one line says why.
    let _g = serial();
    let exe = std::env::temp_dir().join(format!("tcpkit-balance-nonroot-{}", std::process::id()));
    std::fs::copy(tcpkit(), &exe).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(["balance", "run", "--vip", "198.19.0.1:80", "--", "true"])
        .output()
        .expect("setpriv (util-linux)");
    let _ = std::fs::remove_file(&exe);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs root"), "{err}");
}

// ---- balance up, reload, status -------------------------------------------------------------

/// The loop client (`VIP;HOLD;PHASEFILE;STOPFILE;STARTFILE`): once STARTFILE exists (it
/// has been moved into the cgroup by then), HOLD long-lived connections first
/// (`HOLD <peer> <port>`, then `HELD`), then connects in a loop, each tagged with the phase
/// (`C1 <port>` before PHASEFILE exists, `C2 <port>` after; `ERR1 n`/`ERR2 n` on failure),
/// until STOPFILE exists (60 s at most); then a line through each held connection
/// (`ALIVE <port>` when it comes back, `BROKEN <port> <why>`), and `DONE`.
const CLIENT_LOOP_ENV: &str = "TCPKIT_BALANCE_TEST_LOOP_CLIENT";

#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn loop_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_LOOP_ENV);
    let f: Vec<&str> = spec.split(';').collect();
    let vip: SocketAddr = f[0].parse().unwrap();
    let hold: usize = f[1].parse().unwrap();
    let (phase, stop, start) = (Path::new(f[2]), Path::new(f[3]), Path::new(f[4]));
    // Not before the test has moved this process into the cgroup.
    let until = Instant::now() + Duration::from_secs(25);
    while !start.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    let read_port = |s: &TcpStream| -> std::io::Result<String> {
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line.trim().to_string())
    };
    let mut held = Vec::new();
    for _ in 0..hold {
        let s = TcpStream::connect_timeout(&vip, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let port = read_port(&s).unwrap();
        writeln!(out, "HOLD {} {port}", s.peer_addr().unwrap()).unwrap();
        held.push((s, port));
    }
    writeln!(out, "HELD").unwrap();
    out.flush().unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while !stop.exists() && Instant::now() < until {
        let tag = if phase.exists() { 2 } else { 1 };
        match TcpStream::connect_timeout(&vip, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                match read_port(&s) {
                    Ok(p) => writeln!(out, "C{tag} {p}").unwrap(),
                    Err(e) => writeln!(out, "ERR{tag} read {e}").unwrap(),
                }
            }
            Err(e) => writeln!(out, "ERR{tag} {}", e.raw_os_error().unwrap_or(0)).unwrap(),
        }
        out.flush().unwrap();
        // Paced, so the run's few thousand connects do not use up the ephemeral ports.
        std::thread::sleep(Duration::from_millis(2));
    }
    for (s, port) in &held {
        let echoed = (|| -> std::io::Result<String> {
            (&*s).write_all(b"ping\n")?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line)?;
            Ok(line)
        })();
        match echoed {
            Ok(l) if l == "ping\n" => writeln!(out, "ALIVE {port}").unwrap(),
            Ok(l) => writeln!(out, "BROKEN {port} got {l:?}").unwrap(),
            Err(e) => writeln!(out, "BROKEN {port} {e}").unwrap(),
        }
    }
    writeln!(out, "DONE").unwrap();
}

/// A backend that keeps its connections: its port and a newline, then every line echoed
/// until the peer closes.
fn holding_backend(host: &Host) -> SocketAddr {
    let l = host.enter(|| TcpListener::bind(SocketAddr::from((SRV, 0))).unwrap());
    let addr = l.local_addr().unwrap();
    // Runs until the test process ends: its port is in a namespace the lab removes.
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = (&s).write_all(format!("{}\n", addr.port()).as_bytes());
                let mut r = BufReader::new(&s);
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if (&s).write_all(line.as_bytes()).is_err() {
                        break;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

/// A cgroup of the test's own under the host's cgroup2 (so the test can move a client into
/// it); its processes are killed and it is removed on drop, even after a panic.
struct TestCgroup {
    /// Where this test sees it.
    path: PathBuf,
    /// Its path in the hierarchy (what `up --cgroup` is given: it works under ip netns exec).
    rel: String,
}

impl TestCgroup {
    fn new(tag: &str) -> TestCgroup {
        static N: AtomicU64 = AtomicU64::new(0);
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount = tcpkit_balance::cgroup::mount_in(&info).expect("a cgroup2 mount on this host");
        let rel = format!(
            "/tcpkit-test-{tag}.{}.{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let path = mount.join(rel.trim_start_matches('/'));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TestCgroup { path, rel }
    }

    fn join(&self, pid: u32) {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        let until = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.path).is_err() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `tcpkit balance up` in a lab host, its stdout and stderr in files of their own; killed
/// on drop (its links go with it).
struct Up {
    child: std::process::Child,
    out: PathBuf,
    err: PathBuf,
    socket: PathBuf,
}

impl Up {
    fn start(lab: &Lab, host: &Host, config: &Path, cgroup: &str, extra: &[&str]) -> Up {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let (out, err) = (
            lab.dir().join(format!("up{n}.out")),
            lab.dir().join(format!("up{n}.err")),
        );
        let socket = lab.dir().join(format!("up{n}.sock"));
        let mut argv = vec![
            tcpkit(),
            "balance",
            "up",
            "--config",
            config.to_str().unwrap(),
            "--cgroup",
            cgroup,
            "--socket",
            socket.to_str().unwrap(),
        ];
        argv.extend_from_slice(extra);
        let child = host
            .command(&argv)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let up = Up {
            child,
            out,
            err,
            socket,
        };
        let until = Instant::now() + Duration::from_secs(20);
        while !up.stderr().contains("status: tcpkit balance status") {
            assert!(
                Instant::now() < until,
                "up not ready in 20 s: {}",
                up.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        up
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.err).unwrap_or_default()).into_owned()
    }

    /// `tcpkit balance ARGS --socket <its socket>` from this test (outside the lab).
    fn ask(&self, args: &[&str]) -> std::process::Output {
        Command::new(tcpkit())
            .arg("balance")
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .unwrap()
    }

    fn status(&self) -> Value {
        let out = self.ask(&["status", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        schema::check(&schema::load("balance-status"), &v, "balance-status");
        v
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child (ip netns exec execs tcpkit: same pid), not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// SIGTERM, then its exit status and stdout.
    fn stop(mut self) -> (std::process::ExitStatus, String, String) {
        self.signal(libc::SIGTERM);
        let until = Instant::now() + Duration::from_secs(20);
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < until, "up did not stop in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = String::from_utf8_lossy(&std::fs::read(&self.out).unwrap()).into_owned();
        (st, out, self.stderr())
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client process (this binary again, run in the lab host) moved into `cg` before it
/// starts (it waits for STARTFILE); its stdout in a file.
struct Client {
    child: std::process::Child,
    out: PathBuf,
}

impl Client {
    fn start(
        lab: &Lab,
        host: &Host,
        cg: &TestCgroup,
        env: &str,
        value: &str,
        test: &str,
    ) -> Client {
        static N: AtomicU64 = AtomicU64::new(0);
        let out = lab
            .dir()
            .join(format!("client{}.out", N.fetch_add(1, Ordering::SeqCst)));
        let exe = std::env::current_exe().unwrap();
        let kv = format!("{env}={value}");
        let mut argv = vec!["env".to_string(), kv, exe.display().to_string()];
        argv.extend(helper_args(test));
        let child = host
            .command(&refs(&argv))
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // `ip netns exec` and `env` exec: the pid is the client's from start to end.
        cg.join(child.id());
        Client { child, out }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.out).unwrap_or_default()).into_owned()
    }

    fn wait_for(&self, what: &str, secs: u64) {
        let until = Instant::now() + Duration::from_secs(secs);
        while !self.log().contains(what) {
            assert!(
                Instant::now() < until,
                "no {what} within {secs} s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_config(path: &Path, body: &str) {
    // Written aside and renamed: a reload never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn rr_config(backends: &[SocketAddr], health: bool) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ addr = \"{b}\" }}"))
        .collect();
    format!(
        "[[service]]\nname = \"redis\"\nvip = \"{VIP}\"\nalgorithm = \"round-robin\"\nbackends = [ {} ]\n{}",
        list.join(", "),
        if health {
            "health = { interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2 }\n"
        } else {
            ""
        }
    )
}

#[test]
fn up_balances_its_cgroup_status_shows_it_and_sigterm_detaches() {
    let _g = serial();
    let (lab, cli, srv, _link) = Lab::pair("balup").unwrap_or_else(|e| panic!("{e}"));
    let (b1, b2) = (backend(&srv), backend(&srv));
    let cg = TestCgroup::new("up");
    let config = lab.dir().join("lb.toml");
    write_config(&config, &rr_config(&[b1.addr, b2.addr], true));
    let up = Up::start(&lab, &cli, &config, &cg.rel, &["--json"]);
    let (progs, maps) = attached(&cg.path);
    // A TCP service: the UDP hooks are not attached, and status says which are.
    assert_eq!(hooks_on(&cg.path), TCP_HOOKS, "{}", cg.path.display());
    assert_eq!(progs.len(), 4, "programs on {}", cg.path.display());
    assert_eq!(up.status()["hooks"], serde_json::json!(TCP_HOOKS));

    // A client in the cgroup: alternating backends, getpeername the VIP.
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_ENV,
        &format!("{VIP};10;;{}", start.display()),
        "client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("READY", 20);
    let got = conns(&c.log());
    assert_eq!(got.len(), 10, "{}", c.log());
    for (i, (peer, port)) in got.iter().enumerate() {
        assert_eq!(peer, VIP);
        if i > 0 {
            assert_ne!(*port, got[i - 1].1, "not alternating: {got:?}");
        }
    }
    // A process outside the cgroup (this test, in the same host) is not translated.
    let outside = cli.enter(|| {
        TcpStream::connect_timeout(&VIP.parse().unwrap(), Duration::from_secs(2)).map(|_| ())
    });
    assert!(
        outside.is_err(),
        "a connect outside the cgroup reached something"
    );

    let v = up.status();
    assert_eq!(v["mode"], "status");
    assert_eq!(v["cgroup"], cg.rel.as_str());
    let svc = &v["services"][0];
    assert_eq!(
        (svc["name"].as_str(), svc["protocol"].as_str()),
        (Some("redis"), Some("tcp"))
    );
    let backs = svc["backends"].as_array().unwrap();
    assert_eq!(backs.len(), 2);
    for (b, want) in backs.iter().zip([&b1, &b2]) {
        assert_eq!(b["addr"], want.addr.to_string());
        assert_eq!(b["connections"], 5, "{v}");
        assert_eq!(b["health"], "up", "{v}");
        // The backend also accepted the health probes.
        assert!(want.accepted.load(Ordering::SeqCst) >= 5);
    }
    assert_eq!(v["translated"], 10);
    // Kernel 6.18 has every feature; each was probed.
    let features = v["features"].as_array().unwrap();
    assert_eq!(features.len(), 12, "{v}");
    for f in features {
        assert_eq!(f["present"], true, "{f}");
    }
    // The table, as ipvsadm -Ln --stats shows one.
    let out = up.ask(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.contains(&format!("TCP  {VIP}")), "{text}");
    assert!(text.contains(&format!("  -> {}", b1.addr)), "{text}");
    assert!(text.contains("bpf_sock_destroy"), "{text}");

    // A dead backend leaves the set; status says so.
    b1.kill();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let v = up.status();
        if v["services"][0]["backends"][0]["health"] == "down" {
            assert!(v["services"][0]["backends"][0]["downs"].as_u64() >= Some(1));
            break;
        }
        assert!(Instant::now() < until, "not marked down in 20 s: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let socket = up.socket.clone();
    let (st, stdout, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    schema::check(&schema::load("balance-status"), &v, "balance-status");
    assert_eq!(
        (v["mode"].as_str(), v["interrupted"].as_bool()),
        (Some("up"), Some(true))
    );
    assert_all_gone(&progs, &maps);
    assert!(!socket.exists(), "the control socket is left behind");
    // No up running: status says so in one line, exit 1.
    let out = Command::new(tcpkit())
        .args(["balance", "status", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no balance up is running"), "{err}");
    drop(c);
}

#[test]
fn up_bad_config_gives_one_line_and_attaches_nothing() {
    let _g = serial();
    let (lab, cli, _srv, _link) = Lab::pair("balupbad").unwrap_or_else(|e| panic!("{e}"));
    let cg = TestCgroup::new("upbad");
    let config = lab.dir().join("lb.toml");
    let socket = lab.dir().join("bad.sock");
    let cases: [(&str, &str); 8] = [
        ("[[service]]\nvip = \"198.19.0.1:80\"\nbackends = [\n", "lb.toml:3:13: "),
        ("[[service]]\nvip = 80\n", "lb.toml:2:7: "),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nbackends = [{ addr = \"198.19.0.1:80\" }]\n",
            "service 'web': backend 198.19.0.1:80: the same address as the VIP",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nbackends = [{ addr = \"198.18.0.2:80\" }, { addr = \"198.18.0.2:80\" }]\n",
            "service 'web': backend 198.18.0.2:80: given twice",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nbackends = [{ addr = \"[fd00:18::2]:80\" }]\n",
            "service 'web': backend [fd00:18::2]:80: not the same address family",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:0\"\n",
            "service 'web': vip 198.19.0.1:0: port 0",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:65536\"\n",
            "service 'web': vip '198.19.0.1:65536': not an IP:PORT",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nalgorithm = \"fastest\"\n",
            "service 'web': algorithm 'fastest'",
        ),
    ];
    let run = |extra: &[&str]| {
        let mut argv = vec![
            tcpkit(),
            "balance",
            "up",
            "--config",
            config.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
        ];
        argv.extend_from_slice(extra);
        let out = cli.command(&argv).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (body, want) in cases {
        write_config(&config, body);
        let (code, err) = run(&["--cgroup", &cg.rel]);
        assert_eq!(code, Some(1), "{body}: {err}");
        assert_eq!(err.lines().count(), 1, "{body}: {err}");
        assert!(err.starts_with("tcpkit balance: "), "{body}: {err}");
        assert!(err.contains(want), "{body}: {err}");
        assert!(
            attached(&cg.path).0.is_empty(),
            "{body}: something attached"
        );
        assert!(!socket.exists(), "{body}: a socket was made");
    }
    // A cgroup that does not exist: one line naming it.
    write_config(
        &config,
        &rr_config(&["198.18.0.2:80".parse().unwrap()], false),
    );
    let (code, err) = run(&["--cgroup", "/tcpkit-no-such-cgroup"]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--cgroup /tcpkit-no-such-cgroup: no such cgroup"),
        "{err}"
    );
    // A second up on a socket where one answers: refused before attaching anything.
    let first = Up::start(&lab, &cli, &config, &cg.rel, &[]);
    let sock = first.socket.to_str().unwrap().to_string();
    let mut argv = vec![
        tcpkit(),
        "balance",
        "up",
        "--config",
        config.to_str().unwrap(),
        "--cgroup",
        &cg.rel,
        "--socket",
        &sock,
    ];
    let out = cli.command(&argv).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("another balance up answers there"), "{err}");
    let (progs, maps) = attached(&cg.path);
    assert_eq!(progs.len(), 4, "the second up attached");
    // SIGKILL: the links and maps go with the process; the socket file stays, and the next
    // up on that path finds nothing answering there and takes it over.
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert_all_gone(&progs, &maps);
    assert!(first.socket.exists());
    let log = lab.dir().join("again.err");
    let mut again = cli
        .command(&argv)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("status: tcpkit balance status")
    {
        assert!(
            Instant::now() < until,
            "up over a stale socket: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = first.status();
    assert_eq!(v["mode"], "status");
    // SAFETY: kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(again.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(again.wait().unwrap().code(), Some(0));
    argv.clear();
}

#[test]
fn reload_under_load_breaks_nothing_and_moves_new_connections() {
    let _g = serial();
    let (lab, cli, srv, _link) = Lab::pair("balrl").unwrap_or_else(|e| panic!("{e}"));
    let (a, b, c) = (
        holding_backend(&srv),
        holding_backend(&srv),
        holding_backend(&srv),
    );
    let cg = TestCgroup::new("reload");
    let config = lab.dir().join("lb.toml");
    write_config(&config, &rr_config(&[a, b], false));
    let up = Up::start(&lab, &cli, &config, &cg.rel, &[]);
    let (phase, stop, start) = (
        lab.dir().join("phase2"),
        lab.dir().join("stop"),
        lab.dir().join("start"),
    );
    let hold = 10;
    let client = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_LOOP_ENV,
        &format!(
            "{VIP};{hold};{};{};{}",
            phase.display(),
            stop.display(),
            start.display()
        ),
        "loop_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    client.wait_for("HELD", 20);
    let count = |tag: &str| client.log().lines().filter(|l| l.starts_with(tag)).count();
    let wait_count = |tag: &str, n: usize| {
        let until = Instant::now() + Duration::from_secs(30);
        while count(tag) < n {
            assert!(
                Instant::now() < until,
                "fewer than {n} {tag} lines in 30 s:\n{}",
                client.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_count("C1 ", 50);

    // {A, B} -> {B, C} while the client connects in a loop: `reload` answers once the new
    // set is in the kernel, so every connect begun after it must land on B or C.
    write_config(&config, &rr_config(&[b, c], false));
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    std::fs::write(&phase, "").unwrap();
    wait_count("C2 ", 100);
    // A bad file by SIGHUP: refused with its line, the running set stays.
    write_config(
        &config,
        "[[service]]\nvip = \"198.19.0.1:6379\"\nbackends = [\n",
    );
    up.signal(libc::SIGHUP);
    let until = Instant::now() + Duration::from_secs(20);
    while !up.stderr().contains("SIGHUP: reload refused") {
        assert!(Instant::now() < until, "no refusal: {}", up.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(up.stderr().contains("lb.toml:3:13: "), "{}", up.stderr());
    // And by `reload`: exit 1, the file's line last on stderr.
    let out = up.ask(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("lb.toml:3:13: unclosed array"), "{err}");
    let before = count("C2 ");
    wait_count("C2 ", before + 50);
    std::fs::write(&stop, "").unwrap();
    client.wait_for("DONE", 30);

    let log = client.log();
    assert!(!log.contains("ERR"), "a connect failed:\n{log}");
    let ports = |tag: &str| -> Vec<u16> {
        log.lines()
            .filter_map(|l| l.strip_prefix(tag))
            .map(|p| p.trim().parse().unwrap())
            .collect()
    };
    let (p1, p2) = (ports("C1 "), ports("C2 "));
    assert!(
        p1.iter().all(|p| [a.port(), b.port()].contains(p)),
        "{p1:?}"
    );
    assert!(
        p2.iter().all(|p| [b.port(), c.port()].contains(p)),
        "a connect after the reload reached the removed backend: {p2:?}"
    );
    assert!(p2.contains(&b.port()) && p2.contains(&c.port()), "{p2:?}");
    // The held connections, half of them on A (removed), all still carry data.
    let held: Vec<&str> = log.lines().filter(|l| l.starts_with("HOLD ")).collect();
    assert_eq!(held.len(), hold, "{log}");
    assert!(
        held.iter().all(|l| l.starts_with(&format!("HOLD {VIP} "))),
        "{log}"
    );
    let on_a = held
        .iter()
        .filter(|l| l.ends_with(&format!(" {}", a.port())))
        .count();
    assert_eq!(on_a, hold / 2, "{log}");
    let alive = log.lines().filter(|l| l.starts_with("ALIVE ")).count();
    assert_eq!(alive, hold, "an established connection broke:\n{log}");

    let v = up.status();
    assert_eq!(
        (v["reloads"].as_u64(), v["reloads_refused"].as_u64()),
        (Some(1), Some(2))
    );
    let backs: Vec<String> = v["services"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["addr"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(backs, [b.to_string(), c.to_string()]);
    // B kept its counter across the reload; C's counts only what came after.
    let conns_of = |i: usize| {
        v["services"][0]["backends"][i]["connections"]
            .as_u64()
            .unwrap()
    };
    let b_total = (p1.iter().chain(&p2).filter(|p| **p == b.port()).count()
        + held
            .iter()
            .filter(|l| l.ends_with(&format!(" {}", b.port())))
            .count()) as u64;
    assert_eq!(conns_of(0), b_total, "{v}");
    assert_eq!(
        conns_of(1),
        p2.iter().filter(|p| **p == c.port()).count() as u64,
        "{v}"
    );
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

#[test]
fn up_metrics_serve_prometheus_and_survive_hostile_peers() {
    let _g = serial();
    let (lab, cli, srv, _link) = Lab::pair("balmet").unwrap_or_else(|e| panic!("{e}"));
    let (b1, b2) = (backend(&srv), backend(&srv));
    let cg = TestCgroup::new("metrics");
    let config = lab.dir().join("lb.toml");
    write_config(&config, &rr_config(&[b1.addr, b2.addr], true));
    let up = Up::start(&lab, &cli, &config, &cg.rel, &["--metrics", "127.0.0.1:0"]);
    let err = up.stderr();
    let url = err
        .lines()
        .find_map(|l| l.strip_prefix("tcpkit balance: metrics on "))
        .unwrap_or_else(|| panic!("no metrics address: {err}"))
        .to_string();
    let addr: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();

    // Hostile peers first: silent connections and an oversize head.
    let silent: Vec<TcpStream> =
        cli.enter(|| (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect());
    let oversize = cli.enter(|| {
        let mut s = TcpStream::connect(addr).unwrap();
        let head = format!("GET /metrics HTTP/1.0\r\nX: {}\r\n\r\n", "a".repeat(9000));
        // The responder answers 431 at 8 KiB and may close before the rest is read.
        let _ = s.write_all(head.as_bytes());
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut answer);
        answer
    });
    // Balancing goes on meanwhile.
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_ENV,
        &format!("{VIP};6;;{}", start.display()),
        "client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("READY", 20);
    assert_eq!(conns(&c.log()).len(), 6, "{}", c.log());
    assert!(oversize.starts_with("HTTP/1.0 431"), "{oversize}");

    // curl, as a scraper would: served beside the silent peers, which wait for their 2 s.
    let out = cli
        .command(&["curl", "-sS", "--max-time", "30", "-D", "-", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.starts_with("HTTP/1.0 200 OK"), "{text}");
    assert!(text.contains("text/plain; version=0.0.4"), "{text}");
    for b in [&b1, &b2] {
        let labels = format!(
            "{{service=\"redis\",vip=\"{VIP}\",protocol=\"tcp\",backend=\"{}\"}}",
            b.addr
        );
        assert!(
            text.contains(&format!(
                "tcpkit_balance_backend_connections_total{labels} 3\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("tcpkit_balance_backend_up{labels} 1\n")),
            "{text}"
        );
    }
    assert!(
        text.contains("\ntcpkit_balance_reloads_total 0\n"),
        "{text}"
    );
    assert!(
        text.contains("\ntcpkit_balance_trace_lost_total 0\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE tcpkit_balance_backend_probes_total counter\n"),
        "{text}"
    );
    // Every sample has its TYPE line and a value that parses.
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let (name, v) = l.rsplit_once(' ').unwrap();
        let name = name.split('{').next().unwrap();
        assert!(v.parse::<f64>().is_ok(), "{l}");
        assert!(body.contains(&format!("# TYPE {name} ")), "{l}");
    }
    // Anything but GET /metrics is refused.
    let out = cli
        .command(&[
            "curl",
            "-sS",
            "--max-time",
            "30",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "405", "{out:?}");
    drop(silent);
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

// ---- application and UDP health probes ------------------------------------------------------

/// The PING client (`VIP;N;STARTFILE`): once STARTFILE exists, N connects to the VIP, each
/// sending `PING\r\n` and printing the first line of the reply (`REPLY <line>`, or `ERR
/// <why>`), then `DONE`.
const CLIENT_PING_ENV: &str = "TCPKIT_BALANCE_TEST_PING_CLIENT";

#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn ping_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_PING_ENV);
    let f: Vec<&str> = spec.split(';').collect();
    let vip: SocketAddr = f[0].parse().unwrap();
    let n: usize = f[1].parse().unwrap();
    let until = Instant::now() + Duration::from_secs(25);
    while !Path::new(f[2]).exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    for _ in 0..n {
        let r = (|| -> std::io::Result<String> {
            let s = TcpStream::connect_timeout(&vip, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            (&s).write_all(b"PING\r\n")?;
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line)?;
            Ok(line.trim().to_string())
        })();
        match r {
            Ok(l) => writeln!(out, "REPLY {l}").unwrap(),
            Err(e) => writeln!(out, "ERR {e}").unwrap(),
        }
    }
    writeln!(out, "DONE").unwrap();
}

/// redis-server in `host` on `addr`, ready (answers a connect from `from`) when this returns.
fn redis_on(lab: &mut Lab, host: &Host, from: &Host, addr: SocketAddr) {
    let redis = "/usr/bin/redis-server";
    assert!(
        Path::new(redis).exists(),
        "this test needs redis-server (apt-get install redis-server)"
    );
    let port = addr.port().to_string();
    let ip = addr.ip().to_string();
    host.spawn(
        lab,
        &format!("redis{port}"),
        &[
            redis,
            "--port",
            &port,
            "--bind",
            &ip,
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let until = Instant::now() + Duration::from_secs(15);
    from.enter(|| {
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < until, "redis on {addr} not up in 15 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

/// Polls `up`'s status until `done` holds for it (at most `secs`), and returns that status.
fn status_until(up: &Up, secs: u64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = up.status();
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < until, "{what}: not within {secs} s: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn application_probe_takes_out_a_backend_that_accepts_but_answers_wrongly() {
    let _g = serial();
    let (mut lab, cli, srv, _link) = Lab::pair("balapp").unwrap_or_else(|e| panic!("{e}"));
    let redis = SocketAddr::from((SRV, 6391));
    redis_on(&mut lab, &srv, &cli, redis);
    // Accepts every connection (a TCP connect probe would pass) and answers its port number.
    let wrong = backend(&srv);
    let cg = TestCgroup::new("app");
    let config = lab.dir().join("lb.toml");
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"redis\"\nvip = \"{VIP}\"\nalgorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{redis}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"1s\", rise = 2, fall = 2, \
             send = 'PING\\r\\n', expect = \"+PONG\" }}\n",
            wrong.addr
        ),
    );
    let up = Up::start(&lab, &cli, &config, &cg.rel, &[]);
    let v = status_until(&up, 20, "the wrong backend marked down", |v| {
        v["services"][0]["backends"][1]["health"] == "down"
    });
    let svc = &v["services"][0];
    assert_eq!(svc["probe"], "tcp-send-expect", "{v}");
    let (good, bad) = (&svc["backends"][0], &svc["backends"][1]);
    assert_eq!(
        (good["health"].as_str(), &good["down_reason"]),
        (Some("up"), &Value::Null),
        "{v}"
    );
    let why = bad["down_reason"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("reply \"") && why.ends_with("does not start with \"+PONG\""),
        "{v}"
    );
    // It accepted the probes: a connect probe would have kept it.
    assert!(wrong.accepted.load(Ordering::SeqCst) >= 2);

    // New connections all go to redis.
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_PING_ENV,
        &format!("{VIP};10;{}", start.display()),
        "ping_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("DONE", 30);
    let replies: Vec<String> = c
        .log()
        .lines()
        .filter(|l| l.starts_with("REPLY ") || l.starts_with("ERR "))
        .map(str::to_string)
        .collect();
    assert_eq!(replies, vec!["REPLY +PONG".to_string(); 10], "{}", c.log());
    let v = up.status();
    let b = &v["services"][0]["backends"];
    assert_eq!(
        (b[0]["connections"].as_u64(), b[1]["connections"].as_u64()),
        (Some(10), Some(0)),
        "{v}"
    );
    // The table says it too.
    let out = up.ask(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(probe tcp-send-expect)"), "{text}");
    assert!(text.contains("down: reply \""), "{text}");
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

/// A DNS query for www.example A, id 0x1234, as a probe's `send` (C-style escapes).
const DNS_PROBE: &str =
    "\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x03www\\x07example\\x00\\x00\\x01\\x00\\x01";

#[test]
fn udp_health_dns_probe_and_port_unreachable_with_a_real_unbound() {
    let _g = serial();
    unbound::require();
    let (mut lab, cli, srv, _link) = Lab::pair("baludph").unwrap_or_else(|e| panic!("{e}"));
    let live4 = SocketAddr::new(IpAddr::V4(SRV), 5311);
    let live6 = SocketAddr::new(IpAddr::V6(SRV6), 5312);
    // Nothing listens on these: the host answers ICMP port unreachable.
    let dead4 = SocketAddr::new(IpAddr::V4(SRV), 5399);
    let dead6 = SocketAddr::new(IpAddr::V6(SRV6), 5398);
    for (i, a) in [live4, live6].iter().enumerate() {
        let dir = lab.dir().join(format!("unbound{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = unbound::write_conf(&dir, a.ip(), a.port(), 10);
        srv.spawn(
            &mut lab,
            &format!("unbound{i}"),
            &refs(&unbound::argv(&conf)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let until = Instant::now() + Duration::from_secs(15);
        cli.enter(|| {
            while TcpStream::connect_timeout(a, Duration::from_millis(200)).is_err() {
                assert!(Instant::now() < until, "unbound on {a} not up in 15 s");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    let cg = TestCgroup::new("udph");
    let config = lab.dir().join("lb.toml");
    // dns: an application probe (a query; the reply must carry its id). dns6: none, so only
    // ICMP port unreachable fails a probe; once a second (the ICMP rate limit).
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"dns\"\nvip = \"198.19.0.1:53\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{live4}\" }}, {{ addr = \"{dead4}\" }} ]\n\
             health = {{ interval = \"200ms\", timeout = \"500ms\", rise = 2, fall = 2, \
             send = '{DNS_PROBE}', expect = '\\x12\\x34' }}\n\
             [[service]]\nname = \"dns6\"\nvip = \"[fd00:19::1]:53\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{live6}\" }}, {{ addr = \"{dead6}\" }} ]\n\
             health = {{ interval = \"1s\", timeout = \"500ms\", rise = 2, fall = 2 }}\n"
        ),
    );
    let up = Up::start(&lab, &cli, &config, &cg.rel, &[]);
    // UDP services: every hook is attached.
    assert_eq!(hooks_on(&cg.path), ALL_HOOKS, "{}", cg.path.display());
    assert_eq!(up.status()["hooks"].as_array().map(Vec::len), Some(8));
    let v = status_until(&up, 30, "both dead backends down", |v| {
        v["services"][0]["backends"][1]["health"] == "down"
            && v["services"][1]["backends"][1]["health"] == "down"
    });
    let (dns, dns6) = (&v["services"][0], &v["services"][1]);
    assert_eq!(dns["probe"], "udp-send-expect", "{v}");
    assert_eq!(dns6["probe"], "udp-port-unreachable", "{v}");
    for s in [dns, dns6] {
        assert_eq!(s["backends"][0]["health"], "up", "{v}");
        assert_eq!(s["backends"][0]["probes_failed"], 0, "{v}");
    }
    let why = dns["backends"][1]["down_reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        why == "ICMP port unreachable (ECONNREFUSED)" || why.starts_with("no reply within"),
        "{v}"
    );
    assert_eq!(
        dns6["backends"][1]["down_reason"], "ICMP port unreachable (ECONNREFUSED)",
        "{v}"
    );
    // Queries through the VIP (unconnected and connected sockets) all reach unbound.
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_UDP_ENV,
        &format!("198.19.0.1:53;{}", start.display()),
        "udp_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("UDPC", 30);
    let log = c.log();
    let answered = log
        .lines()
        .filter(|l| l.starts_with("UDP") && l.ends_with(" 198.19.0.1:53 0 1"))
        .count();
    assert_eq!(answered, 7, "{log}");
    let v = up.status();
    let b = &v["services"][0]["backends"];
    assert_eq!(b[1]["connections"], 0, "{v}");
    assert_eq!(b[0]["connections"], 3, "{v}");
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

// ---- --drain-kill ---------------------------------------------------------------------------

/// The holding client (`TCPVIP;UDPVIP;N;STARTFILE;STOPFILE`): once STARTFILE exists, N TCP
/// connections (each reads the backend's port) and N connected UDP sockets (each sends a
/// datagram and reads the port back): `HOLD tcp|udp I PORT`, then `HELD`. Each socket then
/// waits for data: when it is ended, `GONE tcp|udp I PORT <errno or eof>`; when STOPFILE
/// exists, it checks it still works (`ALIVE tcp|udp I PORT`, or `BROKEN ...`).
const CLIENT_HOLD_ENV: &str = "TCPKIT_BALANCE_TEST_HOLD_CLIENT";

#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn hold_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_HOLD_ENV);
    let f: Vec<String> = spec.split(';').map(str::to_string).collect();
    let tvip: SocketAddr = f[0].parse().unwrap();
    let uvip: SocketAddr = f[1].parse().unwrap();
    let n: usize = f[2].parse().unwrap();
    let until = Instant::now() + Duration::from_secs(25);
    while !Path::new(&f[3]).exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let say = |l: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{l}").unwrap();
        out.flush().unwrap();
    };
    say(String::new());
    let stop = PathBuf::from(&f[4]);
    let why = |e: &std::io::Error| e.raw_os_error().map_or(e.to_string(), |n| n.to_string());
    let mut threads = Vec::new();
    for i in 0..n {
        let s = TcpStream::connect_timeout(&tvip, Duration::from_secs(5)).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        let port = line.trim().to_string();
        say(format!("HOLD tcp {i} {port}"));
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 64];
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                match common::sock::read_some(&mut &s, &mut buf) {
                    Ok(0) => return say(format!("GONE tcp {i} {port} eof")),
                    Ok(_) => return say(format!("BROKEN tcp {i} {port} unasked data")),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return say(format!("GONE tcp {i} {port} {}", why(&e))),
                }
                if stop.exists() || Instant::now() > until {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let echoed = (|| -> std::io::Result<String> {
                        (&s).write_all(b"ping\n")?;
                        let mut l = String::new();
                        BufReader::new(&s).read_line(&mut l)?;
                        Ok(l)
                    })();
                    return match echoed {
                        Ok(l) if l == "ping\n" => say(format!("ALIVE tcp {i} {port}")),
                        other => say(format!("BROKEN tcp {i} {port} {other:?}")),
                    };
                }
            }
        }));
    }
    for i in 0..n {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect(uvip).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.send(b"x").unwrap();
        let mut buf = [0u8; 64];
        let k = common::sock::no_eintr(|| s.recv(&mut buf)).unwrap();
        let port = String::from_utf8_lossy(&buf[..k]).to_string();
        say(format!("HOLD udp {i} {port}"));
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                match common::sock::no_eintr(|| s.recv(&mut buf)) {
                    Ok(_) => return say(format!("BROKEN udp {i} {port} unasked data")),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return say(format!("GONE udp {i} {port} {}", why(&e))),
                }
                if stop.exists() || Instant::now() > until {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let back = s
                        .send(b"x")
                        .and_then(|_| common::sock::no_eintr(|| s.recv(&mut buf)));
                    return match back {
                        Ok(k) if buf[..k] == *port.as_bytes() => {
                            say(format!("ALIVE udp {i} {port}"));
                        }
                        other => say(format!("BROKEN udp {i} {port} {other:?}")),
                    };
                }
            }
        }));
    }
    say("HELD".into());
    for t in threads {
        t.join().unwrap();
    }
    say("DONE".into());
}

/// A TCP backend in host b that keeps its connections (its port and a newline, then every
/// line echoed); `kill` closes its listener only, so probes are refused while the
/// connections it holds stay open.
fn killable_holding_backend(host: &Host) -> Backend {
    let l = host.enter(|| TcpListener::bind(SocketAddr::from((SRV, 0))).unwrap());
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (n, d) = (Arc::clone(&accepted), Arc::clone(&dead));
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while !d.load(Ordering::SeqCst) {
            match l.accept() {
                Ok((s, _)) => {
                    n.fetch_add(1, Ordering::SeqCst);
                    std::thread::spawn(move || {
                        let _ = s.set_nonblocking(false);
                        let _ = (&s).write_all(format!("{}\n", addr.port()).as_bytes());
                        let mut r = BufReader::new(&s);
                        let mut line = String::new();
                        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                            if (&s).write_all(line.as_bytes()).is_err() {
                                break;
                            }
                            line.clear();
                        }
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        drop(l);
        drop(d);
    });
    Backend {
        addr,
        accepted,
        dead,
    }
}

/// A UDP backend in host b answering every datagram with its port; `kill` closes it.
fn killable_udp_backend(host: &Host) -> Backend {
    let s = host.enter(|| UdpSocket::bind(SocketAddr::from((SRV, 0))).unwrap());
    let addr = s.local_addr().unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (n, d) = (Arc::clone(&accepted), Arc::clone(&dead));
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !d.load(Ordering::SeqCst) {
            if let Ok((_, from)) = s.recv_from(&mut buf) {
                n.fetch_add(1, Ordering::SeqCst);
                let _ = s.send_to(addr.port().to_string().as_bytes(), from);
            }
        }
        drop(s);
        drop(d);
    });
    Backend {
        addr,
        accepted,
        dead,
    }
}

#[test]
fn drain_kill_ends_the_sockets_on_a_dead_backend_and_no_others() {
    let _g = serial();
    let (lab, cli, srv, _link) = Lab::pair("baldrain").unwrap_or_else(|e| panic!("{e}"));
    let (t1, t2) = (
        killable_holding_backend(&srv),
        killable_holding_backend(&srv),
    );
    let (u1, u2) = (killable_udp_backend(&srv), killable_udp_backend(&srv));
    let cg = TestCgroup::new("drain");
    let config = lab.dir().join("lb.toml");
    let uvip = "198.19.0.1:5300";
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"tcp\"\nvip = \"{VIP}\"\nalgorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2 }}\n\
             [[service]]\nname = \"udp\"\nvip = \"{uvip}\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2, send = 'probe' }}\n",
            t1.addr, t2.addr, u1.addr, u2.addr
        ),
    );
    let up = Up::start(&lab, &cli, &config, &cg.rel, &["--drain-kill=all"]);
    let (start, stop) = (lab.dir().join("start"), lab.dir().join("stop"));
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_HOLD_ENV,
        &format!("{VIP};{uvip};4;{};{}", start.display(), stop.display()),
        "hold_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("HELD", 30);
    let log = c.log();
    // Round-robin: two of each kind on each backend.
    for (kind, b) in [("tcp", &t1), ("tcp", &t2), ("udp", &u1), ("udp", &u2)] {
        let held = log
            .lines()
            .filter(|l| l.starts_with(&format!("HOLD {kind} ")))
            .filter(|l| l.ends_with(&format!(" {}", b.addr.port())))
            .count();
        assert_eq!(held, 2, "{kind} on {}: {log}", b.addr);
    }
    // One backend of each service dies: its listener (the held connections stay open on its
    // side), its UDP socket.
    t1.kill();
    u1.kill();
    let v = status_until(&up, 30, "both dead backends down", |v| {
        v["services"][0]["backends"][0]["health"] == "down"
            && v["services"][1]["backends"][0]["health"] == "down"
    });
    assert_eq!(v["drain_kill"], "all", "{v}");
    // Their sockets end: two TCP (ECONNABORTED), two UDP (ECONNABORTED).
    let until = Instant::now() + Duration::from_secs(20);
    let gone = loop {
        let log = c.log();
        let gone: Vec<String> = log
            .lines()
            .filter(|l| l.starts_with("GONE "))
            .map(str::to_string)
            .collect();
        if gone.len() >= 4 {
            break gone;
        }
        assert!(
            Instant::now() < until,
            "the dead backends' sockets not ended in 20 s after both were down: {log}\nup: {}\n{}",
            up.stderr(),
            up.status()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    for l in &gone {
        let f: Vec<&str> = l.split(' ').collect();
        let dead = if f[1] == "tcp" { t1.addr } else { u1.addr };
        assert_eq!(
            f[3],
            dead.port().to_string(),
            "a live backend's socket ended: {l}"
        );
        assert_eq!(f[4], libc::ECONNABORTED.to_string(), "{l}");
    }
    let v = status_until(&up, 10, "the drained counts", |v| v["drained"] == 4);
    for s in 0..2 {
        assert_eq!(v["services"][s]["backends"][0]["drained"], 2, "{v}");
        assert_eq!(v["services"][s]["backends"][1]["drained"], 0, "{v}");
    }
    // A reload that drops the live TCP backend ends its connections too.
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"tcp\"\nvip = \"{VIP}\"\nalgorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2 }}\n\
             [[service]]\nname = \"udp\"\nvip = \"{uvip}\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2, send = 'probe' }}\n",
            t1.addr, u1.addr, u2.addr
        ),
    );
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ended = format!(" {} {}", t2.addr.port(), libc::ECONNABORTED);
    let until = Instant::now() + Duration::from_secs(20);
    while c
        .log()
        .lines()
        .filter(|l| l.starts_with("GONE tcp ") && l.ends_with(&ended))
        .count()
        < 2
    {
        assert!(
            Instant::now() < until,
            "the removed backend's connections not ended in 20 s: {}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    status_until(&up, 10, "the drained count after the reload", |v| {
        v["drained"] == 6
    });
    // The live UDP backend's sockets still work.
    std::fs::write(&stop, "").unwrap();
    c.wait_for("DONE", 30);
    let log = c.log();
    let alive: Vec<&str> = log.lines().filter(|l| l.starts_with("ALIVE ")).collect();
    assert_eq!(alive.len(), 2, "{log}");
    assert!(!log.contains("BROKEN"), "{log}");
    for l in alive {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(
            (f[1], f[3]),
            ("udp", u2.addr.port().to_string().as_str()),
            "{l}"
        );
    }
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

#[test]
fn run_application_probe_flags_take_out_a_wrongly_answering_backend() {
    let _g = serial();
    let (mut lab, cli, srv, _link) = Lab::pair("balappr").unwrap_or_else(|e| panic!("{e}"));
    let redis = SocketAddr::from((SRV, 6392));
    redis_on(&mut lab, &srv, &cli, redis);
    let wrong = backend(&srv);
    let start = lab.dir().join("start");
    let exe = std::env::current_exe().unwrap();
    let mut argv = vec![
        tcpkit().to_string(),
        "balance".into(),
        "run".into(),
        "--vip".into(),
        VIP.into(),
        "--backend".into(),
        redis.to_string(),
        "--backend".into(),
        wrong.addr.to_string(),
        "--algorithm".into(),
        "round-robin".into(),
        "--health-interval".into(),
        "100ms".into(),
        "--fall".into(),
        "2".into(),
        "--health-send".into(),
        "PING\\r\\n".into(),
        "--health-expect".into(),
        "+PONG".into(),
        "--json".into(),
        "--".into(),
        "env".into(),
        format!("{CLIENT_PING_ENV}={VIP};10;{}", start.display()),
        exe.display().to_string(),
    ];
    argv.extend(helper_args("ping_client_in_cgroup"));
    let (out, err) = (lab.dir().join("run.out"), lab.dir().join("run.err"));
    let mut child = KillOnDrop(
        cli.command(&refs(&argv))
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap(),
    );
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    // Probes of one backend run one after another: its third connection comes after its
    // second probe failed, and that failure (fall 2) took it out before the next began.
    let until = Instant::now() + Duration::from_secs(20);
    while wrong.accepted.load(Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < until,
            "no third probe in 20 s: {}",
            read(&err)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&start, "").unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let st = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > until {
            panic!("balance run not done in 30 s: {}", read(&err));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = read(&err);
    assert_eq!(st.code(), Some(0), "{log}");
    let replies = log.lines().filter(|l| *l == "REPLY +PONG").count();
    assert_eq!(replies, 10, "{log}");
    let stdout = read(&out);
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    schema::check(&schema::load("balance"), &v, "balance");
    let b = &v["services"][0]["backends"];
    assert_eq!(
        (b[0]["connects"].as_u64(), b[0]["up"].as_bool()),
        (Some(10), Some(true)),
        "{v}"
    );
    assert_eq!(
        (b[1]["connects"].as_u64(), b[1]["up"].as_bool()),
        (Some(0), Some(false)),
        "{v}"
    );
}

/// A child process killed (and reaped) when the test ends, even by a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- --pin and balance down -----------------------------------------------------------------

/// A bpf filesystem mounted for one test (this host has none at /sys/fs/bpf); on drop, what
/// is pinned under PIN is removed (`balance down`) and it is unmounted, even after a panic.
struct Bpffs {
    mount: PathBuf,
    pin: PathBuf,
}

impl Bpffs {
    fn new(under: &Path) -> Bpffs {
        let mount = under.join("bpffs");
        std::fs::create_dir_all(&mount).unwrap();
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&mount)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t bpf on {}", mount.display());
        Bpffs {
            pin: mount.join("tcpkit").join("balance"),
            mount,
        }
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new(tcpkit())
            .args(["balance", "down", "--pin"])
            .arg(&self.pin)
            .output();
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

#[test]
fn pin_keeps_balancing_after_sigkill_until_down() {
    let _g = serial();
    let (lab, cli, srv, _link) = Lab::pair("balpin").unwrap_or_else(|e| panic!("{e}"));
    let b1 = backend(&srv);
    let cg = TestCgroup::new("pin");
    let fs = Bpffs::new(lab.dir());
    let config = lab.dir().join("lb.toml");
    write_config(&config, &rr_config(&[b1.addr], false));
    let pin = fs.pin.to_str().unwrap();
    let mut up = Up::start(&lab, &cli, &config, &cg.rel, &["--pin", pin]);
    assert_eq!(up.status()["pin"], pin);
    let (progs, maps) = attached(&cg.path);
    assert_eq!(hooks_on(&cg.path), TCP_HOOKS, "{}", cg.path.display());
    // Killed: nothing of its own runs, the pins keep the programs attached.
    up.signal(libc::SIGKILL);
    up.child.wait().unwrap();
    assert_eq!(
        attached(&cg.path).0,
        progs,
        "the pinned programs left with the process"
    );
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_ENV,
        &format!("{VIP};3;;{}", start.display()),
        "client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("READY", 20);
    let got = conns(&c.log());
    assert_eq!(
        got,
        vec![(VIP.to_string(), b1.addr.port()); 3],
        "{}",
        c.log()
    );
    // A second up on the same pins refuses in one line and attaches nothing more.
    let out = cli
        .command(&[
            tcpkit(),
            "balance",
            "up",
            "--config",
            config.to_str().unwrap(),
            "--cgroup",
            &cg.rel,
            "--socket",
            lab.dir().join("again.sock").to_str().unwrap(),
            "--pin",
            pin,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.trim_end()
            .lines()
            .last()
            .unwrap_or("")
            .contains("holds a pinned balancer already"),
        "{err}"
    );
    assert_eq!(attached(&cg.path).0, progs);
    // down: the pins go, and with them the programs and maps.
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_all_gone(&progs, &maps);
    assert!(attached(&cg.path).0.is_empty());
    assert!(!fs.pin.exists());
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("nothing pinned there"), "{err}");
    drop(c);
}

#[test]
fn reload_attaches_the_udp_hooks_only_while_a_udp_service_is_configured() {
    // Issue 13: sendmsg/recvmsg run on every datagram in the cgroup, so a configuration
    // without UDP services leaves them off; a reload adding one attaches them, one removing
    // the last detaches them again. Checked by the kernel's query and by status.
    let _g = serial();
    let (lab, cli, srv, _link) = Lab::pair("balhook").unwrap_or_else(|e| panic!("{e}"));
    let b1 = backend(&srv);
    let cg = TestCgroup::new("hooks");
    let config = lab.dir().join("lb.toml");
    let tcp = rr_config(&[b1.addr], false);
    write_config(&config, &tcp);
    let up = Up::start(&lab, &cli, &config, &cg.rel, &[]);
    assert_eq!(hooks_on(&cg.path), TCP_HOOKS);
    assert_eq!(up.status()["hooks"], serde_json::json!(TCP_HOOKS));
    // Also a TCP VIP on a port no VIP used before (the programs skip ports without one).
    let vip2 = "198.19.0.1:7000";
    let with_udp = format!(
        "{tcp}[[service]]\nname = \"dns\"\nvip = \"198.19.0.1:53\"\nprotocol = \"udp\"\n\
         backends = [ {{ addr = \"{SRV}:53\" }} ]\n\
         [[service]]\nname = \"other\"\nvip = \"{vip2}\"\nbackends = [ {{ addr = \"{}\" }} ]\n",
        b1.addr
    );
    write_config(&config, &with_udp);
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(hooks_on(&cg.path), ALL_HOOKS);
    // The client waits for `start` until it is in the cgroup.
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_ENV,
        &format!("{vip2};3;;{}", start.display()),
        "client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("READY", 20);
    let got = conns(&c.log());
    assert_eq!(got.len(), 3, "{}", c.log());
    assert!(got.iter().all(|(peer, _)| peer == vip2), "{got:?}");
    assert_eq!(
        up.status()["hooks"],
        serde_json::json!([
            "connect4",
            "connect6",
            "getpeername4",
            "getpeername6",
            "sendmsg4",
            "recvmsg4",
            "sendmsg6",
            "recvmsg6"
        ])
    );
    let human = up.ask(&["status"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("Hooks attached: connect4 connect6 getpeername4 getpeername6 sendmsg4 recvmsg4 sendmsg6 recvmsg6\n"),
        "{human}"
    );
    write_config(&config, &tcp);
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(hooks_on(&cg.path), TCP_HOOKS);
    assert_eq!(up.status()["hooks"], serde_json::json!(TCP_HOOKS));
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(hooks_on(&cg.path).is_empty(), "left attached after SIGTERM");
}

#[test]
fn pinned_reload_pins_the_udp_hooks_it_attaches_and_unpins_those_it_detaches() {
    // With --pin, a UDP hook a reload attaches must outlive the process like the others, and
    // one a reload detaches must not stay behind in a pin.
    let _g = serial();
    let (lab, cli, srv, _link) = Lab::pair("balpinh").unwrap_or_else(|e| panic!("{e}"));
    let b1 = backend(&srv);
    let cg = TestCgroup::new("pinh");
    let fs = Bpffs::new(lab.dir());
    let config = lab.dir().join("lb.toml");
    let tcp = rr_config(&[b1.addr], false);
    write_config(&config, &tcp);
    let pin = fs.pin.to_str().unwrap();
    let links = || {
        let mut v: Vec<String> = std::fs::read_dir(&fs.pin)
            .unwrap()
            .filter_map(|e| {
                let n = e.unwrap().file_name().to_string_lossy().into_owned();
                n.strip_prefix("link_tk_").map(String::from)
            })
            .collect();
        v.sort();
        v
    };
    let up = Up::start(&lab, &cli, &config, &cg.rel, &["--pin", pin]);
    assert_eq!(links(), TCP_HOOKS);
    write_config(
        &config,
        &format!(
            "{tcp}[[service]]\nname = \"dns\"\nvip = \"198.19.0.1:53\"\nprotocol = \"udp\"\n\
             backends = [ {{ addr = \"{SRV}:53\" }} ]\n"
        ),
    );
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(links(), ALL_HOOKS);
    assert_eq!(hooks_on(&cg.path), ALL_HOOKS);
    write_config(&config, &tcp);
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(links(), TCP_HOOKS);
    assert_eq!(hooks_on(&cg.path), TCP_HOOKS);
    // The pins hold what is attached after the process is gone.
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    assert_eq!(hooks_on(&cg.path), TCP_HOOKS);
    let (progs, maps) = attached(&cg.path);
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_all_gone(&progs, &maps);
    assert!(hooks_on(&cg.path).is_empty());
}
