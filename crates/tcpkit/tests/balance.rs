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
use tcpkit_lab::{Cgroup, Host, Lab, Link};
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

/// The bpftool checks read every program in the kernel: one balance test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The start of every lab test here: its turn ([`serial`], held to the end of the test) and a
/// fresh pair.
fn serial_pair(tag: &str) -> (std::sync::MutexGuard<'static, ()>, Lab, Host, Host, Link) {
    let g = serial();
    let (lab, a, b, link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
    (g, lab, a, b, link)
}

mod clients;
mod drain;
mod edges;
#[path = "balance_faults.rs"]
mod faults;
mod pin;
mod probes;
mod run;
#[path = "balance_sched.rs"]
mod sched;
mod up;

use clients::{
    helper_args, CLIENT_ENV, CLIENT_HOLD_ENV, CLIENT_LOOP_ENV, CLIENT_PING_ENV, CLIENT_UDP_ENV,
};

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
    killable(host, at, |s, port| {
        let _ = (&s).write_all(format!("{port}\n").as_bytes());
    })
}

/// A TCP listener on `at` in `host`: each connection it accepts is counted and handed to
/// `serve` with the listener's port, on the accepting thread; `kill` closes the listener.
fn killable(host: &Host, at: SocketAddr, serve: fn(TcpStream, u16)) -> Backend {
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
                    serve(s, addr.port());
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

/// A connection that stays: `port` and a newline, then every line echoed until the peer
/// closes.
fn hold(s: TcpStream, port: u16) {
    let _ = (&s).write_all(format!("{port}\n").as_bytes());
    let mut r = BufReader::new(&s);
    let mut line = String::new();
    while r.read_line(&mut line).is_ok_and(|n| n > 0) {
        if (&s).write_all(line.as_bytes()).is_err() {
            break;
        }
        line.clear();
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

/// `--vip VIP`, a `--backend` for each of `backends` in order, then `extra`.
fn vip_args(vip: &str, backends: &[&Backend], extra: &[&str]) -> Vec<String> {
    let mut v = vec!["--vip".to_string(), vip.to_string()];
    for b in backends {
        v.extend(["--backend".to_string(), b.addr.to_string()]);
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// [`argv`] started in `host`; the lab stops it on drop.
fn spawn_run(lab: &mut Lab, host: &Host, args: &[String], client: &str) -> tcpkit_lab::Proc {
    let argv = argv(&refs(args), client);
    host.spawn(lab, "balance", &refs(&argv))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `argv` in `host` to completion: it must exit 0 (else the test fails with `what`, a
/// prefix, and its stderr); its stdout and stderr.
fn output_ok(host: &Host, argv: &[String], what: &str) -> (String, String) {
    let out = host.command(&refs(argv)).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(0), "{what}{stderr}");
    (stdout, stderr)
}

/// A --json report (alone on stdout: the command's own lines go to stderr), checked against
/// the committed schema.
fn report(stdout: &str) -> Value {
    let v: Value = serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    schema::check(&schema::load("balance"), &v, "balance");
    v
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
    let own = tcpkit_balance::cgroup::own_path().unwrap();
    cgroup2_mount()
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

/// connect4/6, getpeername4/6 and sock_release (the active counts): what a TCP-only balancer
/// attaches.
const TCP_HOOKS: [&str; 5] = [
    "connect4",
    "connect6",
    "getpeername4",
    "getpeername6",
    "sock_release",
];
/// Every hook: a balancer with a UDP service.
const ALL_HOOKS: [&str; 9] = [
    "connect4",
    "connect6",
    "getpeername4",
    "getpeername6",
    "recvmsg4",
    "recvmsg6",
    "sendmsg4",
    "sendmsg6",
    "sock_release",
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

/// Where cgroup2 is mounted in this (the root) mount namespace.
fn cgroup2_mount() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    tcpkit_balance::cgroup::mount_in(&info).expect("a cgroup2 mount on this host")
}

/// A cgroup of the test's own under the host's cgroup2 (so the test can move a client into
/// it), removed with its processes on drop.
fn test_cgroup(tag: &str) -> Cgroup {
    Cgroup::new(&cgroup2_mount(), tag).unwrap_or_else(|e| panic!("{e}"))
}

/// `tcpkit balance up --config CONFIG --cgroup CGROUP --socket SOCKET`.
fn up_argv<'a>(config: &'a Path, cgroup: &'a str, socket: &'a Path) -> Vec<&'a str> {
    vec![
        tcpkit(),
        "balance",
        "up",
        "--config",
        config.to_str().unwrap(),
        "--cgroup",
        cgroup,
        "--socket",
        socket.to_str().unwrap(),
    ]
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
        let socket = lab
            .dir()
            .join(format!("up{}.sock", N.fetch_add(1, Ordering::SeqCst)));
        Up::start_at(lab, host, config, cgroup, &socket, extra)
    }

    /// [`Up::start`] with its control socket at `socket`.
    fn start_at(
        lab: &Lab,
        host: &Host,
        config: &Path,
        cgroup: &str,
        socket: &Path,
        extra: &[&str],
    ) -> Up {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let (out, err) = (
            lab.dir().join(format!("up{n}.out")),
            lab.dir().join(format!("up{n}.err")),
        );
        let socket = socket.to_path_buf();
        let mut argv = up_argv(config, cgroup, &socket);
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
    /// A CLIENT_ENV client in `cg` connecting `n` times to `vip`, run until it is READY: the
    /// (peer, backend port) of each connect, and its log.
    fn connects(
        lab: &Lab,
        host: &Host,
        cg: &Cgroup,
        vip: &str,
        n: usize,
    ) -> (Vec<(String, u16)>, String) {
        static N: AtomicU64 = AtomicU64::new(0);
        // The client waits for `start` until it is in the cgroup.
        let start = lab
            .dir()
            .join(format!("start{}", N.fetch_add(1, Ordering::SeqCst)));
        let c = Client::start(
            lab,
            host,
            cg,
            CLIENT_ENV,
            &format!("{vip};{n};;{}", start.display()),
            "client_in_cgroup",
        );
        std::fs::write(&start, "").unwrap();
        c.wait_for("READY", 20);
        let log = c.log();
        (conns(&log), log)
    }

    fn start(lab: &Lab, host: &Host, cg: &Cgroup, env: &str, value: &str, test: &str) -> Client {
        Client::start_helper(lab, host, cg, env, value, helper_args(test))
    }

    /// [`Client::start`] for a helper-process test given by its arguments (`helper_args` of
    /// its own module).
    fn start_helper(
        lab: &Lab,
        host: &Host,
        cg: &Cgroup,
        env: &str,
        value: &str,
        helper: Vec<String>,
    ) -> Client {
        static N: AtomicU64 = AtomicU64::new(0);
        let out = lab
            .dir()
            .join(format!("client{}.out", N.fetch_add(1, Ordering::SeqCst)));
        let exe = std::env::current_exe().unwrap();
        let kv = format!("{env}={value}");
        let mut argv = vec!["env".to_string(), kv, exe.display().to_string()];
        argv.extend(helper);
        let child = host
            .command(&refs(&argv))
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // `ip netns exec` and `env` exec: the pid is the client's from start to end.
        cg.join(child.id()).unwrap_or_else(|e| panic!("{e}"));
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

/// `lb.toml` in the lab's folder, holding [`rr_config`].
fn lb_config(lab: &Lab, backends: &[SocketAddr], health: bool) -> PathBuf {
    let config = lab.dir().join("lb.toml");
    write_config(&config, &rr_config(backends, health));
    config
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
