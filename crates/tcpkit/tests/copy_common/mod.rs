//! The copy lab shared by the copy tests: clients → online (nginx, redis-server; `copy` runs
//! here, with a second link) → target (the same servers). The clients have no route to the
//! target, and a test can watch the clients' link to prove nothing from the target reaches it.

pub mod modes;
pub use crate::common::peer::{json, u};
pub use crate::common::{nft, schema, sock};
pub mod tlab;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tcpkit_lab::{Host, Lab, Link, LinkOpts, Proc, Tcpdump};

pub const CLIENT: &str = "198.18.1.1";
pub const ONLINE: &str = "198.18.1.2";
pub const ONLINE_T: &str = "198.18.2.1";
pub const TARGET: &str = "198.18.2.2";
pub const NGINX: &str = "/usr/sbin/nginx";
pub const REDIS: &str = "/usr/bin/redis-server";

pub fn tcpkit() -> &'static str {
    env!("CARGO_BIN_EXE_tcpkit")
}

/// The rule most tests copy by: the online server's 8080 to the target's 8080.
pub fn rule_8080() -> String {
    format!("8080-{TARGET}:8080")
}

/// A link from `a` to `b`, addresses `a_addr` and `b_addr` (each in a /24) on its two ends.
pub fn link24(lab: &mut Lab, a: &Host, b: &Host, a_addr: &str, b_addr: &str) -> Link {
    lab.link(
        a,
        b,
        &LinkOpts::addrs(format!("{a_addr}/24"), format!("{b_addr}/24")),
    )
    .expect("link")
}

pub struct CopyLab {
    pub lab: Lab,
    pub clients: Host,
    pub online: Host,
    pub target: Host,
    pub cli_link: Link,
    pub tgt_link: Link,
    pub dir: tempfile::TempDir,
}

/// Which address each server logs as the client.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Log {
    Peer,
    /// [`Log::Peer`] with the arrival time last (`$msec`: seconds, millisecond resolution).
    PeerAt,
    ProxyProtocol,
}

impl CopyLab {
    pub fn new(tag: &str) -> CopyLab {
        for bin in [NGINX, REDIS] {
            assert!(
                Path::new(bin).exists(),
                "the copy tests need {bin} (apt-get install nginx-light redis-server)"
            );
        }
        let mut lab = Lab::new(tag).unwrap_or_else(|e| panic!("{e}"));
        let clients = lab.host("cli").expect("host");
        let online = lab.host("onl").expect("host");
        let target = lab.host("tgt").expect("host");
        let cli_link = link24(&mut lab, &clients, &online, CLIENT, ONLINE);
        let tgt_link = link24(&mut lab, &online, &target, ONLINE_T, TARGET);
        CopyLab {
            lab,
            clients,
            online,
            target,
            cli_link,
            tgt_link,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// nginx on the online host and on the target, each logging its peers
    /// ([`CopyLab::nginx`]): their access logs, online's first.
    pub fn nginx_pair(&mut self) -> (PathBuf, PathBuf) {
        let (_on, on_log) = self.nginx(true, Log::Peer);
        let (_tg, tg_log) = self.nginx(false, Log::Peer);
        (on_log, tg_log)
    }

    /// tcpdump of everything on the clients' link, from the clients' side (where nothing from
    /// beyond the online host may ever show).
    pub fn watch_clients(&mut self) -> Tcpdump {
        let (clients, ifname) = (self.clients.clone(), self.cli_link.a.name.clone());
        self.lab.tcpdump(&clients, &ifname, "").expect("tcpdump")
    }

    /// The online host's interface toward the clients (what `copy` captures).
    pub fn capture_if(&self) -> String {
        self.cli_link.b.name.clone()
    }

    fn host(&self, online: bool) -> (&Host, &'static str, &'static str) {
        if online {
            (&self.online, ONLINE, "online")
        } else {
            (&self.target, TARGET, "target")
        }
    }

    /// nginx on port 8080 serving /hello.txt, one access-log line per request:
    /// `client_addr client_port status request`.
    pub fn nginx(&mut self, online: bool, log: Log) -> (Proc, PathBuf) {
        self.nginx_also_on(online, log, None)
    }

    /// [`CopyLab::nginx`], listening on `[v6]:8080` too when given.
    pub fn nginx_also_on(&mut self, online: bool, log: Log, v6: Option<&str>) -> (Proc, PathBuf) {
        let (host, ip, name) = self.host(online);
        let host = host.clone();
        self.nginx_in(&host, ip, name, log, v6)
    }

    /// [`CopyLab::nginx_also_on`] in any `host` of the lab, listening on `ip`; `name` names
    /// its directory and process (one per nginx).
    pub fn nginx_in(
        &mut self,
        host: &Host,
        ip: &str,
        name: &str,
        log: Log,
        v6: Option<&str>,
    ) -> (Proc, PathBuf) {
        let listen6 = v6.map_or(String::new(), |a| format!(" listen [{a}]:8080;"));
        let d = self.dir.path().join(format!("nginx-{name}"));
        let _ = std::fs::create_dir_all(d.join("www"));
        std::fs::write(d.join("www/hello.txt"), "hello from the lab\n").unwrap();
        let access = d.join("access.log");
        let (fmt, pp) = match log {
            Log::Peer => ("$remote_addr $remote_port $status \"$request\"", ""),
            Log::PeerAt => ("$remote_addr $remote_port $status \"$request\" $msec", ""),
            Log::ProxyProtocol => (
                "$proxy_protocol_addr $proxy_protocol_port $status \"$request\"",
                " proxy_protocol",
            ),
        };
        let conf = d.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "user root; daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\n\
                 events {{ worker_connections 1024; }}\n\
                 http {{ log_format t '{fmt}'; access_log {a} t; keepalive_requests 100000;\n\
                   client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
                   uwsgi_temp_path {d}; scgi_temp_path {d};\n\
                   server {{ listen {ip}:8080{pp};{listen6} root {d}/www; }} }}\n",
                d = d.display(),
                a = access.display(),
            ),
        )
        .unwrap();
        let p = host
            .spawn(
                &mut self.lab,
                &format!("nginx-{name}"),
                &[NGINX, "-c", conf.to_str().unwrap()],
            )
            .unwrap_or_else(|e| panic!("{e}"));
        wait_port(host, ip, 8080, &p);
        if let Some(a) = v6 {
            wait_port(host, &format!("[{a}]"), 8080, &p);
        }
        (p, access)
    }

    /// redis-server on port 6379, nothing saved.
    pub fn redis(&mut self, online: bool) -> Proc {
        let (host, ip, name) = self.host(online);
        let host = host.clone();
        let argv = crate::common::peer::redis_argv(SocketAddr::new(ip.parse().unwrap(), 6379));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let p = host
            .spawn(&mut self.lab, &format!("redis-{name}"), &argv)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_port(&host, ip, 6379, &p);
        p
    }

    /// `copy` live on the clients' link with one `-x` rule, then `args`.
    pub fn copy_rule(&self, rule: &str, args: &[&str]) -> Child {
        let cap = self.capture_if();
        let mut argv = vec!["-x", rule, "-i", &cap];
        argv.extend_from_slice(args);
        self.copy(&argv)
    }

    /// Starts `tcpkit copy ARGS` in the online host and returns once its capture is open.
    pub fn copy(&self, args: &[&str]) -> Child {
        copy_in(&self.online, self.cli_link.b.ifindex, args)
    }

    /// `tcpkit copy ARGS` in the online host, to completion (a run past `limit` is a hang).
    pub fn copy_to_end(&self, args: &[&str], limit: Duration) -> Output {
        let mut argv = vec![tcpkit(), "copy"];
        argv.extend_from_slice(args);
        run_limited(self.online.command(&argv), limit)
    }

    /// `ARGV` in the clients host, to completion.
    pub fn client(&self, argv: &[&str]) -> Output {
        run_limited(self.clients.command(argv), Duration::from_secs(20))
    }

    /// redis-benchmark from the clients to the online redis: `n` SETs of keys drawn from
    /// `keys` over 5 connections, to completion; it must succeed.
    pub fn redis_sets(&self, keys: &str, n: &str) -> Output {
        let o = self.client(&[
            "redis-benchmark",
            "-h",
            ONLINE,
            "-p",
            "6379",
            "-t",
            "set",
            "-r",
            keys,
            "-n",
            n,
            "-c",
            "5",
            "-q",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o
    }

    /// `tcpkit load ONLINE:PORT ARGS` in the clients host.
    pub fn load(&self, port: u16, args: &[&str]) -> Output {
        let t = format!("{ONLINE}:{port}");
        let mut argv = vec![tcpkit(), "load", &t];
        argv.extend_from_slice(args);
        let o = self.client(&argv);
        // The load is only traffic for the copy to see: a load that fell behind its rate on a
        // busy machine (exit 1, "asked rate not met") still made the requests it reports.
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success()
                || (o.status.code() == Some(1) && err.contains("asked rate not met")),
            "load failed: {err}"
        );
        o
    }

    /// HTTP GETs of /hello.txt from the clients to the online server's 8080: `rate` a second
    /// over `conns` keep-alive connections for `secs`, or a new connection every `per_conn`
    /// requests.
    pub fn http_get(&self, conns: &str, rate: &str, secs: &str, per_conn: Option<&str>) -> Output {
        self.load(
            8080,
            &http_get_args("/hello.txt", conns, rate, secs, per_conn),
        )
    }
}

/// `tcpkit load`'s flags for GETs of `path`: `rate` a second over `conns` keep-alive
/// connections for `secs`, or a new connection every `per_conn` requests.
pub fn http_get_args<'a>(
    path: &'a str,
    conns: &'a str,
    rate: &'a str,
    secs: &'a str,
    per_conn: Option<&'a str>,
) -> Vec<&'a str> {
    let mut a = vec!["--http-get", path, "-c", conns, "-r", rate, "-t", secs];
    if let Some(q) = per_conn {
        a.extend_from_slice(&["--queries-per-conn", q]);
    }
    a
}

/// Starts `tcpkit copy ARGS` in `host` and returns once its capture is open; `ifindex` is the
/// index of the interface a `-i` names (the host's side of its clients' link).
pub fn copy_in(host: &Host, ifindex: u32, args: &[&str]) -> Child {
    let mut argv = vec![tcpkit(), "copy"];
    argv.extend_from_slice(args);
    // The capture is bound (ring and filter in place) once a packet socket shows the
    // interface's index; "any" shows 0.
    let ifindex = match argv.iter().position(|a| *a == "-i") {
        Some(i) if argv[i + 1] != "any" => ifindex,
        _ => 0,
    };
    let before = packet_sockets(host, ifindex);
    let mut cmd = host.command(&argv);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start tcpkit copy");
    let deadline = Instant::now() + Duration::from_secs(5);
    while packet_sockets(host, ifindex) <= before {
        if let Ok(Some(st)) = child.try_wait() {
            let o = child.wait_with_output().unwrap();
            panic!(
                "copy exited {st} before capturing: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        assert!(Instant::now() < deadline, "copy never opened its capture");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// The keys of the redis at `ip` (in `host`), sorted.
pub fn redis_keys(host: &Host, ip: &str) -> Vec<String> {
    let o = host
        .run(&["redis-cli", "-h", ip, "--scan"])
        .expect("redis-cli");
    let mut k: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    k.sort();
    k
}

/// Packet sockets bound to interface `ifindex` in `host`'s namespace (the copy's capture is
/// one). /proc/net/packet: sk RefCnt Type Proto Iface R Rmem User Inode.
fn packet_sockets(host: &Host, ifindex: u32) -> usize {
    host.run(&["cat", "/proc/net/packet"])
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .skip(1)
                .filter(|l| l.split_whitespace().nth(4) == Some(&ifindex.to_string()))
                .count()
        })
        .unwrap_or(0)
}

pub fn wait_port(host: &Host, ip: &str, port: u16, p: &Proc) {
    let addr: std::net::SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let up = host.enter(|| loop {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    assert!(up, "{} never listened on {addr}: {}", p.name(), p.log());
}

/// Stops `child`'s process group for `d` (SIGSTOP, then SIGCONT): the process reads
/// nothing meanwhile, as if the host had starved it.
pub fn freeze(child: &Child, d: Duration) {
    let pg = -(child.id() as libc::pid_t);
    // SAFETY: kill(2) on the process group the lab made for this child.
    assert_eq!(unsafe { libc::kill(pg, libc::SIGSTOP) }, 0, "SIGSTOP");
    std::thread::sleep(d);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pg, libc::SIGCONT) }, 0, "SIGCONT");
}

/// Runs `cmd` to completion; a run past `limit` is a hang: killed, and the test fails.
pub fn run_limited(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("start");
    wait_limited(child, limit)
}

/// What `tcpkit copy --check --transparent` said, run on the online host with the lab's rule
/// (8080 to the target's 8080), `intercept`, the lab's capture interface, `--timeout 2` and
/// then `extra`: the exit status, its "return path" line, and all it printed.
pub struct ReturnPath {
    pub code: Option<i32>,
    pub line: String,
    pub out: String,
    pub err: String,
}

pub fn check_return_path(l: &CopyLab, intercept: &str, extra: &[&str]) -> ReturnPath {
    let rule = rule_8080();
    let cap = l.capture_if();
    let mut argv = vec![
        tcpkit(),
        "copy",
        "--check",
        "--transparent",
        "-x",
        &rule,
        "--intercept",
        intercept,
        "-i",
        &cap,
        "--timeout",
        "2",
    ];
    argv.extend_from_slice(extra);
    let o = run_limited(l.online.command(&argv), Duration::from_secs(30));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    let line = out
        .lines()
        .find(|l| l.contains(" return path "))
        .unwrap_or_else(|| panic!("no return path line: {out}{err}"))
        .to_string();
    ReturnPath {
        code: o.status.code(),
        line,
        out,
        err,
    }
}

/// A silent target, as both modes' tests play it, once the copy runs and every segment to the
/// target's 8080 is dropped (`nft::drop_tcp_to`): 300 sessions of one request over 3 s, then
/// `wait` for their copies' --timeout, while the SYNs toward the target are counted; then the
/// drop is lifted and 50 more sessions come. Returns the SYNs and the target's log length
/// from before those last sessions.
pub fn silent_then_back(l: &mut CopyLab, tg_log: &Path, wait: Duration) -> (usize, usize) {
    let (online, tif) = (l.online.clone(), l.tgt_link.a.name.clone());
    let dump = l.lab.tcpdump(&online, &tif, "tcp").expect("tcpdump");
    l.http_get("8", "100", "3", Some("1"));
    std::thread::sleep(wait);
    let syns = syns_to(&dump.stop().expect("tcpdump").path, TARGET);
    let before = lines(tg_log).len();
    nft::stop_dropping(&l.target);
    l.http_get("2", "50", "1", Some("1"));
    (syns, before)
}

/// What [`silent_then_back`] must leave in the copy's report: the copies that never got
/// through timed out (silent is not refused), most never sent a SYN of their own, the target
/// saw at most `max_syns`, and the last sessions went through.
pub fn assert_held_back(r: &Value, syns: usize, max_syns: usize, tg_log: &Path, before: usize) {
    let f = |k: &str| u(r, &format!("sessions.failed.{k}"));
    assert!(f("timeout") >= 250, "{r:#}");
    assert_eq!(f("target_refused") + f("shed"), 0, "{r:#}");
    assert!(
        (20..=max_syns).contains(&syns),
        "{syns} SYNs toward the silent target: {r:#}"
    );
    assert!(u(r, "sessions.skipped_in_backoff") >= 150, "{r:#}");
    assert!(u(r, "sessions.completed") >= 40, "{r:#}");
    assert!(lines(tg_log).len() >= before + 40);
}

/// The failure counters of a report, by cause.
pub fn failed(r: &Value) -> [u64; 6] {
    let f = |k: &str| u(r, &format!("sessions.failed.{k}"));
    [
        f("target_refused"),
        f("reset"),
        f("timeout"),
        f("closed_early"),
        f("lost_capture_data"),
        f("shed"),
    ]
}

/// Every request the copy sent was answered by the target.
pub fn assert_all_answered(r: &serde_json::Value) {
    assert_eq!(u(r, "requests.answered"), u(r, "requests.copied"), "{r:#}");
}

/// Every request answered, and every copy of every session completed.
pub fn assert_all_completed(r: &serde_json::Value) {
    assert_all_answered(r);
    assert_eq!(u(r, "sessions.completed"), u(r, "sessions.copies"), "{r:#}");
}

/// Waits (up to 20 s) for a relay copy run with --json that must succeed, and returns its
/// report ([`mode_report`]).
pub fn copy_report(c: Child) -> Value {
    mode_report(&wait_limited(c, Duration::from_secs(20)), "relay")
}

/// The --json report of a copy run that must have exited 0 (if not, all it printed).
pub fn succeeded(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "copy failed: {} {}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    json(o)
}

/// The report of a copy run in `mode` ("relay" or "transparent") that exited 0: every copy
/// accounted for as that mode counts them, against the committed schema.
pub fn mode_report(o: &Output, mode: &str) -> Value {
    let r = succeeded(o);
    accounted_in(&r, mode);
    check_schema(&r);
    assert_eq!(r["mode"], mode, "{r:#}");
    r
}

/// [`mode_report`] of a run that had to fail by its own figures ([`failed_because`]).
pub fn mode_report_failed(o: &Output, why: &str, mode: &str) -> Value {
    let r = failed_because(o, why);
    accounted_in(&r, mode);
    check_schema(&r);
    assert_eq!(r["mode"], mode, "{r:#}");
    r
}

fn accounted_in(r: &Value, mode: &str) {
    match mode {
        "relay" => assert_accounted(r),
        "transparent" => tlab::transparent_accounted(r),
        _ => panic!("no copy mode {mode}"),
    }
}

/// A copy run with --json that had to fail by its own figures (issue 10 case 3: a target
/// that answered none of the requests, or a loss over --max-loss): exit 1, the reason, which
/// contains `why`, as the last line on stderr and as the report's `failure`. Returns the
/// report, whose session counts must add up.
pub fn failed_report(o: &Output, why: &str) -> Value {
    let r = failed_because(o, why);
    assert_accounted(&r);
    r
}

/// The report of a copy run with --json that exited 1, `why` in the reason it gave as its
/// last line on stderr and as the report's `failure`.
fn failed_because(o: &Output, why: &str) -> Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let r = json(o);
    let last = err.lines().last().unwrap_or_default();
    let failure = r["failure"].as_str().unwrap_or_default();
    assert!(
        failure.contains(why) && last == format!("tcpkit copy: {failure}"),
        "{why}: {err} {r:#}"
    );
    r
}

pub fn wait_limited(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().expect("output");
            panic!(
                "still running after {limit:?}: stdout {} stderr {}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The lines `r` (a child's stderr) gives, each with when it came, read on a thread until
/// it closes: for tests that ask how soon something was said.
pub fn timed_lines(
    r: impl Read + Send + 'static,
) -> std::thread::JoinHandle<Vec<(Instant, String)>> {
    use std::io::BufRead;
    std::thread::spawn(move || {
        std::io::BufReader::new(r)
            .lines()
            .map_while(Result::ok)
            .map(|l| (Instant::now(), l))
            .collect()
    })
}

pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Every copy ended exactly one way.
pub fn assert_accounted(r: &Value) {
    accounted_with(r, 0);
}

/// Every copy ended exactly one way, `also` being how many ended in a way of the mode's own
/// (transparent mode's control_lost), and every selected session was copied -n times.
pub fn accounted_with(r: &Value, also: u64) {
    let ended = u(r, "sessions.completed")
        + failed(r).iter().sum::<u64>()
        + u(r, "sessions.failed.target_gone")
        + also
        + u(r, "sessions.open_at_end");
    assert_eq!(ended, u(r, "sessions.copies"), "{r:#}");
    assert_eq!(
        u(r, "sessions.copies"),
        u(r, "sessions.selected") * u(r, "copies_per_session"),
        "{r:#}"
    );
    assert_eq!(
        u(r, "sessions.selected") + u(r, "sessions.sampled_out"),
        u(r, "sessions.seen"),
        "{r:#}"
    );
}

/// Checks a copy report against the committed docs/schema/copy.schema.json.
pub fn check_schema(v: &Value) {
    schema::check(&schema::load("copy"), v, "report");
}

/// The frames of `sessions` whole keep-alive HTTP sessions from CLIENT:`first_port`+k to
/// ONLINE:8080, in capture order: a handshake, then for each `(request, answer)` of `turns`,
/// `gap_ns` after the previous one, the request and the answer in two segments (as nginx
/// sends a head and a file), then FINs. For offline-mode tests that need known captures.
pub fn http_session_frames(
    sessions: u16,
    first_port: u16,
    gap_ns: u64,
    turns: &[(&[u8], &[u8])],
) -> Vec<(u64, Vec<u8>)> {
    use tcpkit_wire::tcp::{Flags, Options, Segment};
    let server: std::net::SocketAddr = format!("{ONLINE}:8080").parse().unwrap();
    let mut frames = Vec::new();
    let mut buf = Vec::new();
    for k in 0..sessions {
        let client: std::net::SocketAddr = format!("{CLIENT}:{}", first_port + k).parse().unwrap();
        let mut ts = 1_700_000_000_000_000_000u64 + u64::from(k) * 1_000_000;
        let (mut cs, mut ss) = (1u32, 9u32);
        let mut seg = |ts: u64, fwd: bool, seq, ack, fl: u8, pl: &[u8]| {
            let (src, dst) = if fwd {
                (client, server)
            } else {
                (server, client)
            };
            let s = Segment {
                src,
                dst,
                seq,
                ack,
                flags: Flags(fl),
                window: 65535,
                options: Options::default(),
                payload: 0..0,
                payload_len: 0,
            };
            buf.clear();
            s.emit(pl, &mut buf).unwrap();
            frames.push((ts, buf.clone()));
        };
        seg(ts, true, cs - 1, 0, 0x02, &[]);
        seg(ts + 1000, false, ss - 1, cs, 0x12, &[]);
        for (request, answer) in turns {
            ts += gap_ns;
            seg(ts, true, cs, ss, 0x18, request);
            cs += request.len() as u32;
            let cut = answer.len() / 2;
            seg(ts + 100_000, false, ss, cs, 0x18, &answer[..cut]);
            seg(
                ts + 150_000,
                false,
                ss + cut as u32,
                cs,
                0x18,
                &answer[cut..],
            );
            ss += answer.len() as u32;
        }
        seg(ts + 1_000_000, true, cs, ss, 0x11, &[]);
        seg(ts + 1_100_000, false, ss, cs + 1, 0x11, &[]);
    }
    frames.sort_by_key(|f| f.0);
    frames
}

/// Takes out of `frames` ([`http_session_frames`]) the client's first data segment past its
/// first request in the session from CLIENT:`port`: a hole the capture never saw, after which
/// that session's requests count at the source but are never copied (lost_capture_data).
pub fn lose_a_request(frames: &mut Vec<(u64, Vec<u8>)>, port: u16) {
    use tcpkit_wire::tcp::Segment;
    let lost = frames
        .iter()
        .position(|(_, f)| {
            let s = Segment::parse(f).unwrap();
            s.src.port() == port && !s.payload.is_empty() && s.seq > 1
        })
        .expect("a second request in that session");
    frames.remove(lost);
}

/// Writes `frames` as an Ethernet pcap with nanosecond timestamps.
pub fn write_frames(path: &Path, frames: &[(u64, Vec<u8>)]) {
    let mut w = tcpkit_pcap::PcapWriter::create(path, 1, 65535, true).unwrap();
    for (ts, f) in frames {
        w.write_packet(*ts, f, f.len() as u32).unwrap();
    }
    w.finish().unwrap();
}

// ---- --diff: files served alike or not, and captures of their answers ------------------

/// Same length on both servers, different bytes: only the body differs.
pub const ORIGINAL: &str = "original body\n";
pub const CHANGED: &str = "changed! body\n";
pub const SAME: &str = "the same on both servers\n";

/// Writes `files` into the `name` nginx's root with one fixed mtime, so Last-Modified and
/// ETag agree between the servers.
pub fn serve(l: &CopyLab, name: &str, files: &[(&str, &str)]) {
    let www = l.dir.path().join(format!("nginx-{name}/www"));
    for (f, body) in files {
        let p = www.join(f);
        std::fs::write(&p, body).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
            .unwrap();
    }
}

/// The target nginx's whole answer to GET `path`.
pub fn fetch(l: &CopyLab, path: &str) -> Vec<u8> {
    let addr: SocketAddr = format!("{TARGET}:8080").parse().unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    l.target.enter(|| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        out
    })
}

/// `answer` with its Date value replaced by one from another day (same length).
pub fn old_date(answer: &[u8]) -> Vec<u8> {
    let text = String::from_utf8(answer.to_vec()).unwrap();
    let i = text.find("\r\nDate: ").expect("a Date header") + 8;
    let j = i + text[i..].find("\r\n").unwrap();
    assert_eq!(j - i, 29, "{text}");
    format!("{}Sat, 01 Jan 2000 00:00:00 GMT{}", &text[..i], &text[j..]).into_bytes()
}

/// A capture of `sessions` keep-alive sessions to ONLINE:8080 from CLIENT:`first_port`+k,
/// each asking for each path of `gets` in turn and getting the answer beside it.
pub fn diff_capture(path: &Path, sessions: u16, first_port: u16, gets: &[(&str, Vec<u8>)]) {
    let requests: Vec<String> = gets
        .iter()
        .map(|(p, _)| format!("GET {p} HTTP/1.1\r\nHost: t\r\n\r\n"))
        .collect();
    let turns: Vec<(&[u8], &[u8])> = requests
        .iter()
        .zip(gets)
        .map(|(r, (_, a))| (r.as_bytes(), a.as_slice()))
        .collect();
    write_frames(
        path,
        &http_session_frames(sessions, first_port, 20_000_000, &turns),
    );
}

pub fn diff_of(o: &std::process::Output) -> Value {
    assert!(
        o.status.success(),
        "copy failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = json(o);
    assert_accounted(&r);
    check_schema(&r);
    r["diff"].clone()
}

pub fn counts(d: &Value) -> (u64, u64, u64) {
    (u(d, "compared"), u(d, "equal"), u(d, "different"))
}

pub fn records(p: &Path) -> Vec<Value> {
    lines(p)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

// ---- servers that misbehave, for the fault tests -----------------------------------------

/// A listener in `host` on `addr` whose every connection `each` serves, on a thread of its
/// own, for as long as the test runs.
pub fn serve_each(host: &Host, addr: &str, each: impl Fn(TcpStream) + Send + Sync + 'static) {
    let listener = host.enter(|| TcpListener::bind(addr)).unwrap();
    let each = Arc::new(each);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            let each = each.clone();
            std::thread::spawn(move || each(s));
        }
    });
}

/// How a [`fault_server`] treats each connection once the first bytes of a request arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Reads everything and never answers, keeping the connection open (a stalled target).
    Silent,
    /// Resets the connection (SO_LINGER 0, then close) instead of answering.
    Reset,
    /// Answers the first request with one line, then closes (FIN) with the session not over.
    CloseAfterAnswer,
}

/// A server in `host` on `addr` that misbehaves as `fault` says; returns the request bytes it
/// read, over every connection.
pub fn fault_server(host: &Host, addr: &str, fault: Fault) -> Arc<AtomicU64> {
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    serve_each(host, addr, move |mut s| {
        let mut b = [0u8; 65536];
        while let Ok(n) = sock::read_some(&mut s, &mut b) {
            if n == 0 {
                break;
            }
            g.fetch_add(n as u64, Ordering::Relaxed);
            match fault {
                Fault::Silent => continue,
                Fault::Reset => {
                    let l = libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    };
                    // SAFETY: setsockopt on a descriptor we own, with a linger's size.
                    let r = unsafe {
                        libc::setsockopt(
                            s.as_raw_fd(),
                            libc::SOL_SOCKET,
                            libc::SO_LINGER,
                            (&l as *const libc::linger).cast(),
                            std::mem::size_of::<libc::linger>() as libc::socklen_t,
                        )
                    };
                    assert_eq!(r, 0, "SO_LINGER");
                    return;
                }
                Fault::CloseAfterAnswer => {
                    let _ = s.write_all(b"one answer, then goodbye\n");
                    return;
                }
            }
        }
        // Silent even to the peer's FIN: the connection is left open, never closed.
        std::thread::sleep(Duration::from_secs(30));
    });
    got
}

/// SYNs (without ACK) toward `ip` in the capture file `frames` (a tcpdump's).
pub fn syns_to(frames: &Path, ip: &str) -> usize {
    use tcpkit_wire::tcp::{Flags, Segment};
    let ip: std::net::IpAddr = ip.parse().unwrap();
    let f = tcpkit_pcap::CaptureFile::open(frames).unwrap();
    f.packets()
        .filter_map(|p| Segment::parse(p.unwrap().data).ok())
        .filter(|s| s.dst.ip() == ip && s.flags.has(Flags::SYN) && !s.flags.has(Flags::ACK))
        .count()
}

/// A pcap of `sessions` client sessions to ONLINE:8080, each with `requests` requests of
/// `size` bytes answered by 20 bytes, 10 ms apart; `drop` leaves out the nth client data
/// segment of the first session (a hole the capture never filled).
pub fn synth_pcap(
    path: &Path,
    sessions: u16,
    requests: u32,
    size: usize,
    drop: Option<u32>,
) -> u64 {
    use tcpkit_wire::tcp::{Flags, Options, Segment};
    let server: SocketAddr = format!("{ONLINE}:8080").parse().unwrap();
    let mut ts: u64 = 1_700_000_000_000_000_000;
    let mut frames: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut put = |ts: u64,
                   src: SocketAddr,
                   dst: SocketAddr,
                   seq: u32,
                   ack: u32,
                   flags: u8,
                   payload: &[u8]| {
        let s = Segment {
            src,
            dst,
            seq,
            ack,
            flags: Flags(flags),
            window: 65535,
            options: Options::default(),
            payload: 0..0,
            payload_len: 0,
        };
        let mut buf = Vec::new();
        s.emit(payload, &mut buf).unwrap();
        frames.push((ts, buf));
    };
    let (syn, ack, psh_ack, fin_ack) = (0x02u8, 0x10u8, 0x18u8, 0x11u8);
    let start = ts;
    for k in 0..sessions {
        let client: SocketAddr = format!("{CLIENT}:{}", 40000 + k).parse().unwrap();
        let (mut cs, mut ss) = (1000u32, 5000u32);
        put(ts, client, server, cs, 0, syn, &[]);
        put(ts + 10_000, server, client, ss, cs + 1, syn | ack, &[]);
        put(ts + 20_000, client, server, cs + 1, ss + 1, ack, &[]);
        cs += 1;
        ss += 1;
        ts += 100_000;
        let mut n = 0;
        for _ in 0..requests {
            let body = vec![b'a' + (k % 26) as u8; size];
            for chunk in body.chunks(1400) {
                if !(k == 0 && drop == Some(n)) {
                    put(ts, client, server, cs, ss, psh_ack, chunk);
                }
                n += 1;
                cs += chunk.len() as u32;
                ts += 10_000;
            }
            ts += 200_000;
            put(
                ts,
                server,
                client,
                ss,
                cs,
                psh_ack,
                b"answer to a request\n",
            );
            ss += 20;
            ts += 10_000_000;
        }
        put(ts, client, server, cs, ss, fin_ack, &[]);
        put(ts + 10_000, server, client, ss, cs + 1, fin_ack, &[]);
        put(ts + 20_000, client, server, cs + 1, ss + 1, ack, &[]);
        ts += 1_000_000;
    }
    let mut w = tcpkit_pcap::PcapWriter::create(path, 1, 65535, true).unwrap();
    for (t, f) in &frames {
        w.write_packet(*t, f, f.len() as u32).unwrap();
    }
    w.finish().unwrap();
    ts - start
}

// ---- a server-first protocol -------------------------------------------------------------

/// What a [`greeting_server`] saw.
#[derive(Debug, Default)]
pub struct Greeted {
    pub conns: AtomicU64,
    /// Connections whose client sent bytes before the greeting was out.
    pub early: AtomicU64,
    /// Lines answered.
    pub lines: AtomicU64,
}

/// A server-first line protocol (an SMTP-like banner) in `host` on `addr`: `delay` after a
/// connection is accepted it is greeted with `220 ready`, then each line it sends is answered
/// `250 LINE`. Whether the client spoke before the greeting is checked just before sending it.
pub fn greeting_server(host: &Host, addr: &str, delay: Duration) -> Arc<Greeted> {
    use std::io::BufRead;
    let seen = Arc::new(Greeted::default());
    let g = seen.clone();
    serve_each(host, addr, move |mut s| {
        g.conns.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(delay);
        s.set_nonblocking(true).unwrap();
        if matches!(s.peek(&mut [0u8; 1]), Ok(n) if n > 0) {
            g.early.fetch_add(1, Ordering::Relaxed);
        }
        s.set_nonblocking(false).unwrap();
        if s.write_all(b"220 ready\r\n").is_err() {
            return;
        }
        let mut r = std::io::BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
            g.lines.fetch_add(1, Ordering::Relaxed);
            if s.write_all(format!("250 {line}").as_bytes()).is_err() {
                return;
            }
            line.clear();
        }
    });
    seen
}

/// A client of [`greeting_server`] from `host`: waits for the greeting, then sends each of
/// `lines` and reads its answer, then closes.
pub fn greeting_client(host: &Host, addr: &str, lines: &[&str]) {
    use std::io::BufRead;
    let addr: SocketAddr = addr.parse().unwrap();
    let s = host.enter(|| TcpStream::connect(addr)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut got = String::new();
    r.read_line(&mut got).unwrap();
    assert_eq!(got, "220 ready\r\n");
    for l in lines {
        w.write_all(format!("{l}\r\n").as_bytes()).unwrap();
        got.clear();
        r.read_line(&mut got).unwrap();
        assert_eq!(got, format!("250 {l}\r\n"));
    }
}

// ---- transparent mode (copy_transparent, copy_on_target) -------------------------------

/// A live transparent copy's report, once it exited successfully
/// ([`tlab::transparent_report`]).
pub fn copy_done(c: Child) -> Value {
    tlab::transparent_report(&wait_limited(c, Duration::from_secs(15)))
}

/// intercept's report, once it exited, against its committed schema.
pub fn intercept_report(p: &Proc) -> Value {
    let log = p.log();
    let (a, b) = (log.find('{').unwrap(), log.rfind('}').unwrap());
    let r: Value = serde_json::from_str(&log[a..=b]).unwrap_or_else(|e| panic!("{e}: {log}"));
    schema::check(&schema::load("intercept"), &r, "intercept");
    r
}

/// Stops intercept with `sig`, which it must exit cleanly on within 5 s.
pub fn stop_intercept(p: &Proc, sig: tcpkit_lab::Signal) {
    p.signal(sig).unwrap();
    let st = p.wait_timeout(Duration::from_secs(5)).unwrap();
    assert!(st.is_some_and(|s| s.success()), "{}", p.log());
}

/// An intercept restarted under live copying, as both intercept placements' tests play it:
/// from `clients`, a keep-alive load (100/s) and a new connection per request (50/s) for 4 s;
/// 1.2 s in, `first` is killed (SIGKILL), and 0.5 s later `restart` starts its successor.
/// The keep-alive sessions the gap cut lose the rest of their requests, more than
/// --max-loss: the copy `c` must fail so (issue 10 case 3). Returns the successor, the copy's
/// report, and the target's log length (`tg_log`) at the restart: each line after it is a
/// copy that got through.
pub fn intercept_restarted(
    clients: &Host,
    tg_log: &Path,
    c: Child,
    first: &Proc,
    restart: impl FnOnce() -> Proc,
) -> (Proc, Value, usize) {
    std::thread::scope(|s| {
        let a = s.spawn(|| load(clients, "100", "4", None));
        let b = s.spawn(|| load(clients, "50", "4", Some("1")));
        std::thread::sleep(Duration::from_millis(1200));
        first.signal(tcpkit_lab::Signal::SIGKILL).unwrap();
        first.wait_timeout(Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let second = restart();
        let before = lines(tg_log).len();
        a.join().unwrap();
        b.join().unwrap();
        let r = tlab::transparent_report_failed(
            &wait_limited(c, Duration::from_secs(15)),
            "is above --max-loss 1 %",
        );
        (second, r, before)
    })
}

/// What [`intercept_restarted`] must leave: the copy lost its control connection and
/// reconnected, and copying resumed (`after`: the target's log length at the end).
pub fn assert_resumed(r: &Value, before: usize, after: usize) {
    assert!(u(r, "transparent.control_losses") >= 1, "{r:#}");
    assert!(u(r, "transparent.control_reconnects") >= 1, "{r:#}");
    assert!(
        after > before + 60,
        "copying resumed: {before} -> {after} {r:#}"
    );
    assert!(u(r, "sessions.completed") > 0, "{r:#}");
}

/// Every line of an access log starts with the client address `addr` (what the server saw).
pub fn assert_all_from(log: &[String], addr: &str) {
    assert!(
        log.iter().all(|l| l.starts_with(&format!("{addr} "))),
        "not all from {addr}: {:?}",
        &log[..log.len().min(3)]
    );
}

/// The packets `dump` saw (more than `min` of them), none from any address of `bad`.
pub fn assert_none_from(dump: Tcpdump, bad: &[&str], min: usize) -> Vec<String> {
    let text = dump.stop().expect("tcpdump").text().expect("tcpdump -r");
    assert!(text.len() > min, "{} packets", text.len());
    for l in &text {
        for bad in bad {
            assert!(!l.contains(&format!(" {bad}.")), "{l}");
        }
    }
    text
}

/// `chain` drops the first SYNs to port 8080 that `matches` (an nft match, such as
/// `ip daddr ADDR`), up to `quota` bytes of them, and counts them.
pub fn drop_first_syns(chain: &nft::Chain, matches: &[&str], quota: &str) {
    let mut words = matches.to_vec();
    words.extend([
        "tcp",
        "dport",
        "8080",
        "tcp",
        "flags",
        "&",
        "(syn|ack)",
        "==",
        "syn",
        "quota",
        "until",
        quota,
        "bytes",
        "counter",
        "drop",
    ]);
    chain.rule(&words);
}

/// `tcpkit load` of HTTP GETs from the clients host to the online nginx.
pub fn load(clients: &Host, rate: &str, secs: &str, per_conn: Option<&str>) -> Output {
    load_to(clients, ONLINE, rate, secs, per_conn, &[])
}

/// [`load`] to the nginx on `server`:8080, with `extra` flags.
pub fn load_to(
    clients: &Host,
    server: &str,
    rate: &str,
    secs: &str,
    per_conn: Option<&str>,
    extra: &[&str],
) -> Output {
    let t = format!("{server}:8080");
    let mut a = vec![tcpkit(), "load", &t];
    a.extend(http_get_args("/hello.txt", "2", rate, secs, per_conn));
    a.extend_from_slice(extra);
    let o = run_limited(clients.command(&a), Duration::from_secs(20));
    assert!(
        o.status.success(),
        "load failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// `argv` in `host` as nobody with no capability at all (none inherited, none left in the
/// bounding set, so no file capability can bring one back): a user who forgot sudo.
pub fn unprivileged(host: &Host, argv: &[&str]) -> Command {
    let mut v = vec![
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ];
    v.extend_from_slice(argv);
    host.command(&v)
}

/// One line, `tcpkit <cmd>: ...`, and exit status 1.
pub fn one_line_failure(o: &Output, prefix: &str, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(prefix) && err.contains(needle), "{err}");
}
