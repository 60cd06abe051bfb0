//! `tcpkit load` as users run it: the real binary in lab host a, a real server in host b
//! (`tcpkit echo`, redis-server, nginx, or a misbehaving server written here), checked by
//! its report, its exit status, its per-query file and what the server saw.

use crate::common;
use common::peer::{echo_pair, json, merge, merge_as, pair, target, u, Pair, SRV};
use common::schema;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{stderr, stdout, tcpkit};
use serde_json::Value;

impl Pair {
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

/// `tcpkit load ARGS` under `prlimit --nofile=NOFILE` in the client host; a run past `limit`
/// is a hang: killed, and the test fails.
fn load_nofile(p: &Pair, nofile: &str, args: &[&str], limit: Duration) -> Output {
    let nofile = format!("--nofile={nofile}");
    let argv = [&["prlimit", &nofile, "--", tcpkit(), "load"], args].concat();
    common::peer::run_limited(p.cli.command(&argv), limit).0
}

/// sent = answered + every query counted as not answered.
fn assert_accounted(r: &Value) {
    let sent = u(r, "queries.sent");
    let not = u(r, "queries.timeouts") + u(r, "queries.lost") + u(r, "queries.unanswered_at_end");
    assert_eq!(u(r, "queries.answered"), sent - not, "{r:#}");
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

/// [`fault_run`] that must fail (exit 1): its failure line ([`failure_line`]) and report.
fn fault_fails(p: &Pair, port: u16, args: &[&str]) -> (String, Value) {
    let (o, r) = fault_run(p, port, args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    (failure_line(&o), r)
}

/// [`fault_run`] that must succeed: its report.
fn run_ok(p: &Pair, port: u16, args: &[&str]) -> Value {
    let (o, r) = fault_run(p, port, args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    r
}

/// [`run_ok`] with every query sent accounted for.
fn load_ok(p: &Pair, port: u16, args: &[&str]) -> Value {
    let r = run_ok(p, port, args);
    assert_accounted(&r);
    r
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
