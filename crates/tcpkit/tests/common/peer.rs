//! The server end the load, echo and run-contract lab tests share: host b of `Lab::pair`
//! (`tcpkit echo` or another server there, `tcpkit load` run against it from host a), waiting
//! until it listens, and reading the JSON reports both print.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tcpkit_lab::{Host, Lab, Proc, Signal};

use super::{stderr, stdout, tcpkit};

/// Host b of `Lab::pair`, where the servers under test listen.
pub const SRV: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// `SRV:port`, as load's target argument.
pub fn target(port: u16) -> String {
    format!("{SRV}:{port}")
}

/// Whether `addr` accepts a TCP connection from `host` within 10 s; the caller asserts it,
/// saying what it waited for.
pub fn listening(host: &Host, addr: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    host.enter(|| loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    })
}

/// The count at `path` (keys joined by dots) in a JSON report; the test fails if it is not one.
pub fn u(v: &Value, path: &str) -> u64 {
    let mut x = v;
    for k in path.split('.') {
        x = &x[k];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path} is not a count in {v:#}"))
}

/// The JSON document on a run's stdout.
pub fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): stdout {} stderr {}", stdout(o), stderr(o)))
}

/// Stops a `tcpkit echo --json` with SIGTERM; it must exit 0 within 10 s. Its report.
pub fn stop_echo(proc: &Proc) -> Value {
    proc.signal(Signal::SIGTERM).unwrap();
    let st = proc
        .wait_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("echo did not stop on SIGTERM");
    let log = proc.log();
    assert!(st.success(), "echo exited {st}: {log}");
    echo_report(&log)
}

/// Echo's report in its output `log`: the first line that opens a JSON object.
pub fn echo_report(log: &str) -> Value {
    let line = log
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON report in: {log}"));
    serde_json::from_str(line).unwrap()
}

/// redis-server on `addr` alone, open to the lab's other host and keeping nothing on disk:
/// its argv. The test fails here if redis-server is not installed.
pub fn redis_argv(addr: SocketAddr) -> Vec<String> {
    let redis = "/usr/bin/redis-server";
    assert!(
        Path::new(redis).exists(),
        "this test needs redis-server (apt-get install redis-server)"
    );
    let (port, ip) = (addr.port().to_string(), addr.ip().to_string());
    [
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
    ]
    .map(String::from)
    .into()
}

/// `tcpkit merge FILES --json` (outside any namespace): its output.
pub fn merge(files: &[&Path]) -> Output {
    merge_as(files, &["--json"])
}

/// `tcpkit merge FILES ARGS`.
pub fn merge_as(files: &[&Path], args: &[&str]) -> Output {
    Command::new(tcpkit())
        .arg("merge")
        .args(files)
        .args(args)
        .output()
        .unwrap()
}

/// Writes `dir/nginx.conf` for nginx in the foreground as root, its temporary files and error
/// log in `dir`, with `http` inside its http block (log formats, servers). Returns its path;
/// the test fails here if nginx is not installed.
pub fn nginx_conf(dir: &Path, http: &str) -> std::path::PathBuf {
    assert!(
        Path::new(NGINX).exists(),
        "this test needs nginx (apt-get install nginx-light)"
    );
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "user root; daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\n\
             events {{ worker_connections 256; }}\n\
             http {{ keepalive_requests 100000;\n\
               client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
               uwsgi_temp_path {d}; scgi_temp_path {d};\n\
               {http} }}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    conf
}

/// Debian's nginx.
pub const NGINX: &str = "/usr/sbin/nginx";

/// A fresh `Lab::pair`: `tcpkit load` runs in `cli` (host a), its servers in `srv` (host b).
pub struct Pair {
    pub lab: Lab,
    pub cli: Host,
    pub srv: Host,
}

pub fn pair(tag: &str) -> Pair {
    let (lab, cli, srv, _link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
    Pair { lab, cli, srv }
}

/// A fresh pair with `tcpkit echo --port PORT` listening in its server host.
pub fn echo_pair(tag: &str, port: u16) -> Pair {
    let mut p = pair(tag);
    p.echo(port, &[]);
    p
}

impl Pair {
    /// Starts `argv` in the server host and waits until `port` accepts connections.
    pub fn server(&mut self, name: &str, argv: &[&str], port: u16) -> Proc {
        let p = self
            .srv
            .spawn(&mut self.lab, name, argv)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            listening(&self.cli, SocketAddr::from((SRV, port))),
            "{name} never listened on {port}: {}",
            p.log()
        );
        p
    }

    /// `tcpkit echo --port PORT --threads 1 ARGS` in the server host, once it listens.
    pub fn echo(&mut self, port: u16, args: &[&str]) -> Proc {
        let port_s = port.to_string();
        let mut argv = vec![tcpkit(), "echo", "--port", &port_s, "--threads", "1"];
        argv.extend_from_slice(args);
        self.server("echo", &argv, port)
    }

    /// `tcpkit load ARGS` in the client host; a run past `limit` is a hang: killed, and the
    /// test fails.
    pub fn load(&self, args: &[&str], limit: Duration) -> Output {
        self.load_in(Path::new("/"), args, limit).0
    }

    /// [`Pair::load`] in the working directory `cwd`; also how long it ran.
    pub fn load_in(&self, cwd: &Path, args: &[&str], limit: Duration) -> (Output, Duration) {
        let mut cmd = self.cli.command(&[&[tcpkit(), "load"], args].concat());
        cmd.current_dir(cwd);
        run_limited(cmd, limit)
    }
}

/// Runs `cmd` (a lab host's command, its own process group) to completion, stdin empty; a
/// run past `limit` is a hang: killed, and the test fails. Its output and how long it ran.
pub fn run_limited(mut cmd: Command, limit: Duration) -> (Output, Duration) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("start tcpkit");
    let pid = child.id();
    loop {
        if child.try_wait().expect("wait").is_some() {
            let took = t0.elapsed();
            return (child.wait_with_output().expect("output"), took);
        }
        if t0.elapsed() > limit {
            // SAFETY: kill(2) on a process group we started (Host::command).
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
            let out = child.wait_with_output().expect("output");
            panic!(
                "{cmd:?} ran past {limit:?} (a hang): stdout {} stderr {}",
                stdout(&out),
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
