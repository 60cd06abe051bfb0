//! `tcpkit load` as users run it: the real binary in lab host a, a real server in host b
//! (`tcpkit echo`, redis-server, nginx, or a misbehaving server written here), checked by
//! its report, its exit status, its per-query file and what the server saw.

use crate::common;
use common::schema;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::tcpkit;
use serde_json::Value;
use tcpkit_lab::{Host, Lab, Proc};

/// Host b of `Lab::pair`.
const SRV: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

struct Pair {
    lab: Lab,
    cli: Host,
    srv: Host,
}

fn pair(tag: &str) -> Pair {
    let (lab, cli, srv, _link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
    Pair { lab, cli, srv }
}

impl Pair {
    /// Starts `argv` in the server host and waits until `port` accepts connections.
    fn server(&mut self, name: &str, argv: &[&str], port: u16) -> Proc {
        let p = self
            .srv
            .spawn(&mut self.lab, name, argv)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_port(&self.cli, port, &p);
        p
    }

    /// `tcpkit echo --port PORT ARGS`.
    fn echo(&mut self, port: u16, args: &[&str]) -> Proc {
        let port_s = port.to_string();
        let mut argv = vec![tcpkit(), "echo", "--port", &port_s, "--threads", "1"];
        argv.extend_from_slice(args);
        self.server("echo", &argv, port)
    }

    /// `tcpkit load ARGS` in the client host; panics if it runs past `limit`.
    fn load(&self, args: &[&str], limit: Duration) -> Output {
        run_limited(
            self.cli.command(&[&[tcpkit(), "load"], args].concat()),
            limit,
        )
    }

    /// A server written here, in the server host: `serve` gets each accepted connection on a
    /// thread of its own.
    fn test_server(&self, serve: fn(TcpStream)) -> u16 {
        let l = self
            .srv
            .enter(|| TcpListener::bind((SRV, 0)))
            .expect("bind in the server host");
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                std::thread::spawn(move || serve(s));
            }
        });
        port
    }
}

fn wait_port(cli: &Host, port: u16, p: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let up = cli.enter(|| loop {
        if TcpStream::connect_timeout(&SocketAddr::from((SRV, port)), Duration::from_millis(200))
            .is_ok()
        {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    assert!(up, "server never listened on {port}: {}", p.log());
}

/// Runs `cmd` to completion; a run past `limit` is a hang: killed, and the test fails.
fn run_limited(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start tcpkit");
    let pid = child.id();
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            // The command is its own process group (Host::command): end all of it.
            // SAFETY: kill(2) on a process group we started.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
            let out = child.wait_with_output().expect("output");
            panic!(
                "tcpkit load ran past {limit:?} (a hang): stdout {} stderr {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): stdout {} stderr {}", stdout(o), stderr(o)))
}

fn u(v: &Value, path: &str) -> u64 {
    let mut x = v;
    for k in path.split('.') {
        x = &x[k];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path} is not a count in {v:#}"))
}

/// sent = answered + every query counted as not answered.
fn assert_accounted(r: &Value) {
    let sent = u(r, "queries.sent");
    let not = u(r, "queries.timeouts") + u(r, "queries.lost") + u(r, "queries.unanswered_at_end");
    assert_eq!(u(r, "queries.answered"), sent - not, "{r:#}");
}

const SRV_PORT: &str = "198.18.0.2";

fn target(port: u16) -> String {
    format!("{SRV_PORT}:{port}")
}

mod faults;
mod limits;
mod traffic;

fn fault_run(p: &Pair, port: u16, args: &[&str]) -> (Output, Value) {
    let t = target(port);
    let mut a = vec![&t as &str];
    a.extend_from_slice(args);
    a.push("--json");
    let o = p.load(&a, Duration::from_secs(15));
    let r = json(&o);
    (o, r)
}

/// The starts of the hints load says on stderr when a limit is first hit.
const HINTS: [&str; 6] = [
    "tcpkit load: out of file descriptors",
    "tcpkit load: out of local ports",
    "tcpkit load: connects timed out while others were answered",
    "tcpkit load: no answer to any connect",
    "tcpkit load: connects refused (RST)",
    "tcpkit load: connects answered late",
];

/// The one line saying why the run failed: the last on stderr. Only limit hints, each said
/// once, may come before it.
fn failure_line(o: &Output) -> String {
    let e = stderr(o);
    assert!(!e.contains("panicked"), "{e}");
    let lines: Vec<&str> = e.lines().collect();
    let Some((last, before)) = lines.split_last() else {
        panic!("nothing on stderr")
    };
    assert!(last.starts_with("tcpkit load: "), "{e}");
    for h in before {
        assert!(
            HINTS.iter().any(|s| h.starts_with(s)),
            "not a hint: {h}: {e}"
        );
        assert_eq!(
            lines.iter().filter(|l| *l == h).count(),
            1,
            "said twice: {e}"
        );
    }
    format!("{last}\n")
}
