//! The scale test of issue 3: 45,000 concurrent connections held by one `tcpkit load` run
//! against one `tcpkit echo` run, to one server address and port. One source address reaches
//! only the local port range (28,232 ports by default) and one process only 20,000
//! descriptors on this machine, so this proves the past-64k machinery (several `--source`
//! addresses) and the past-the-fd-limit machinery (several processes on each side) at small
//! scale. Checked from both ends: load's report and live line, echo's report, and the server
//! host's own socket table while the connections are held.
//!
//! Issue 3 held them 10 s. Beyond the counts, a hold guards that a silent connection is not
//! cut while the server has room (most of the 45,000 carry no query in it): echo's
//! first-message deadline, 10 s by default, applies only once it has been full, as it is not
//! here. So the hold is 3 s with that deadline at 1 s: a deadline applied regardless would
//! cut most of them within it.

use crate::common;
use common::peer::{listening, u, SRV};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::tcpkit;
use serde_json::Value;
use tcpkit_lab::{Host, Lab};

const CONNS: u64 = 45_000;
const HOLD_S: u64 = 3;
/// echo's first-message deadline, a third of the hold (its default is 10 s).
const FIRST_TIMEOUT: &str = "1s";
const RATE: u64 = 2000;
const PORT: u16 = 4260;
/// Extra client addresses on the link; with the default port range two would do, four
/// leave each well below it.
const SOURCES: [&str; 4] = ["198.18.0.11", "198.18.0.12", "198.18.0.13", "198.18.0.14"];

/// Established TCP sockets in `h` matching the `ss` filter `filter`.
fn established(h: &Host, filter: &str) -> u64 {
    let o = h
        .run(&[
            "sh",
            "-c",
            &format!("ss -tnH state established {filter} | wc -l"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("ss | wc -l: {e}"))
}

/// Sockets open in the calling thread's network namespace (the kernel's per-namespace count;
/// its "TCP: inuse" line reads 0 on this kernel).
fn sockets_used() -> u64 {
    // thread-self: /proc/net follows the process's first thread, not a thread that joined a
    // lab host.
    let s = std::fs::read_to_string("/proc/thread-self/net/sockstat").expect("sockstat");
    s.lines()
        .find_map(|l| l.strip_prefix("sockets: used "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no socket count in sockstat: {s}"))
}

/// The local port range of `h` as a count of ports.
fn port_range(h: &Host) -> u64 {
    let o = h
        .run(&["sysctl", "-n", "net.ipv4.ip_local_port_range"])
        .unwrap_or_else(|e| panic!("{e}"));
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    v[1] - v[0] + 1
}

/// The JSON report in `log`: the first value from the first line that opens an object
/// (load prints it over several lines after its live lines, echo on one line).
fn report(log: &str) -> Value {
    let at = log
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| log.starts_with('{').then_some(0))
        .unwrap_or_else(|| panic!("no JSON report in: {log}"));
    serde_json::Deserializer::from_str(&log[at..])
        .into_iter::<Value>()
        .next()
        .unwrap_or_else(|| panic!("no JSON report in: {log}"))
        .unwrap_or_else(|e| panic!("{e}: {}", &log[at..]))
}

/// `[  12.0s] conns 45000 open | ...` → (12.0, 45000).
fn live(line: &str) -> Option<(f64, u64)> {
    let rest = line.strip_prefix('[')?;
    let (t, rest) = rest.split_once("s] conns ")?;
    let (n, _) = rest.split_once(" open")?;
    Some((t.trim().parse().ok()?, n.parse().ok()?))
}

#[test]
fn forty_five_thousand_connections_held_through_the_query_phase() {
    let (mut lab, cli, srv, link) = Lab::pair("ldscale").unwrap_or_else(|e| panic!("{e}"));
    // Connects arrive at 20,000/s: a default accept queue would drop SYNs, and a dropped
    // SYN costs a 1 s retransmit or a retry, which the counts below would show.
    srv.sysctl("net.core.somaxconn", "65535").unwrap();
    srv.sysctl("net.ipv4.tcp_max_syn_backlog", "65535").unwrap();
    for a in SOURCES {
        cli.run(&["ip", "addr", "add", &format!("{a}/24"), "dev", &link.a.name])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let ports = port_range(&cli);
    assert!(
        ports < CONNS,
        "the client's port range ({ports}) alone reaches {CONNS}: the test would not need --source"
    );
    assert!(ports * SOURCES.len() as u64 >= CONNS);

    let port = PORT.to_string();
    // Three processes of 15,000 connections each (SO_REUSEPORT spreads them), under the
    // 20,000-descriptor limit; one process would run out.
    let echo = srv
        .spawn(
            &mut lab,
            "echo",
            &[
                tcpkit(),
                "echo",
                "--port",
                &port,
                "--procs",
                "3",
                "--threads",
                "1",
                "--first-timeout",
                FIRST_TIMEOUT,
                "--json",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        listening(&cli, (SRV, PORT).into()),
        "echo never listened on {PORT}: {}",
        echo.log()
    );

    let target = format!("{SRV}:{PORT}");
    let conns = CONNS.to_string();
    // One address cannot hold them: refused up front, with the reason (killed after 20 s
    // if it tried instead).
    let o = cli
        .command(&[
            "timeout",
            "-s",
            "KILL",
            "20",
            tcpkit(),
            "load",
            &target,
            "--hold",
            "-c",
            &conns,
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.starts_with(&format!(
            "tcpkit load: -c {CONNS}: at most {ports} connections"
        )) && e.contains("--source"),
        "{e}"
    );

    // Sockets the server host holds with no client: echo's listeners (the readiness probe's
    // is closed by now).
    std::thread::sleep(Duration::from_millis(200));
    let idle = srv.enter(sockets_used);
    let sources = SOURCES.join(",");
    // -t bounds the whole run, opening the connections included (issue 10, case 8): at least
    // HOLD_S seconds of queries after CONNS connects at 7,500/s or faster. About 20,000/s on a
    // quiet machine; 12,700/s was seen beside two compilers, which left a budget sized for
    // 20,000/s with a 9.7 s query phase: the budget is for the connects' worst, not their best.
    let run_s = HOLD_S as f64 + CONNS as f64 / 7_500.0 + 1.0;
    let (hold, rate) = (format!("{run_s}"), RATE.to_string());
    // No --procs: load must see that 45,000 descriptors do not fit one process.
    let load = cli
        .spawn(
            &mut lab,
            "load",
            &[
                tcpkit(),
                "load",
                &target,
                "--echo-bytes",
                "16",
                "-c",
                &conns,
                "--connect-rate",
                "20000",
                "--source",
                &sources,
                "-r",
                &rate,
                "-t",
                &hold,
                "--stats",
                "1",
                "--json",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));

    // The server's own view until load exits: sockets open in the server host, every
    // 20 ms (a count the kernel keeps per namespace, cheap where `ss` over 45,000 sockets
    // takes most of a second), and once in the hold `ss` itself, on both hosts.
    let start = Instant::now();
    let done = AtomicBool::new(false);
    let now_held = AtomicU64::new(0);
    let mut ss_srv: Option<u64> = None;
    let mut per_source: Option<Vec<u64>> = None;
    let filter = format!("'( sport = :{PORT} )'");
    let samples: Vec<(f64, u64)> = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            srv.enter(|| {
                let mut v = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let n = sockets_used().saturating_sub(idle);
                    v.push((start.elapsed().as_secs_f64(), n));
                    now_held.store(n, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
                v
            })
        });
        let mut full_since: Option<Instant> = None;
        while load.try_status().unwrap().is_none() && start.elapsed() < Duration::from_secs(50) {
            if now_held.load(Ordering::Relaxed) < CONNS {
                full_since = None;
            } else if full_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(2)
                && ss_srv.is_none()
            {
                ss_srv = Some(established(&srv, &filter));
                per_source = Some(
                    SOURCES
                        .iter()
                        .chain(std::iter::once(&"198.18.0.1"))
                        .map(|a| established(&cli, &format!("src {a}")))
                        .collect(),
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        done.store(true, Ordering::Relaxed);
        sampler.join().unwrap()
    });
    assert!(
        load.try_status().unwrap().is_some(),
        "load ran past 50 s: {}",
        load.log()
    );
    let log = load.log();
    let status = load.wait_timeout(Duration::ZERO).unwrap().unwrap();
    assert!(status.success(), "load exited {status}: {log}");
    let mut r = report(&log);
    // Not checked here; without them a failure message fits on a screen.
    r.as_object_mut().unwrap().remove("histograms");

    // load's report: every connection opened once, none failed, closed or reopened, so all
    // 45,000 were open for the whole query phase; the queries all answered, on time.
    assert_eq!(u(&r, "runs"), 1, "{r:#}");
    assert!(u(&r, "processes") >= 3, "{r:#}");
    let c = &r["connections"];
    assert_eq!(u(c, "asked"), CONNS, "{r:#}");
    assert_eq!(u(c, "reachable_max"), ports * SOURCES.len() as u64, "{r:#}");
    assert_eq!(u(c, "peak_open"), CONNS, "{r:#}");
    assert_eq!(u(c, "open_at_end"), CONNS, "{r:#}");
    assert_eq!(u(c, "established"), CONNS, "{r:#}");
    assert_eq!(u(c, "attempts"), CONNS, "{r:#}");
    for k in [
        "failed",
        "timeouts",
        "retries",
        "closed_by_server",
        "reconnects",
    ] {
        assert_eq!(u(c, k), 0, "connections.{k}: {r:#}");
    }
    assert_eq!(r["errors"], serde_json::json!({}), "{r:#}");
    assert_eq!(r["hints"], serde_json::json!([]), "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
    let q = &r["queries"];
    let sent = u(q, "sent");
    let want = (RATE as f64 * r["seconds"].as_f64().unwrap()) as u64;
    assert!(
        sent.abs_diff(want) * 50 <= want,
        "sent {sent}, asked {want}: {r:#}"
    );
    assert_eq!(u(q, "answered"), sent, "{r:#}");
    for k in [
        "timeouts",
        "lost",
        "unanswered_at_end",
        "malformed",
        "unmatched",
    ] {
        assert_eq!(u(q, k), 0, "queries.{k}: {r:#}");
    }
    // A query or two due in the last milliseconds may be unsent at the end (the machine is
    // shared); more than 1 % behind is a client that could not keep up.
    assert!(u(&r, "lag.behind") * 100 <= u(q, "scheduled"), "{r:#}");
    assert_eq!(u(&r, "codes.ok"), sent, "{r:#}");

    // load's live line: 45,000 open on every line of the query phase.
    let secs = r["seconds"].as_f64().unwrap();
    let connect = r["connect_seconds"].as_f64().unwrap();
    let lines: Vec<(f64, u64)> = log.lines().filter_map(live).collect();
    let during: Vec<&(f64, u64)> = lines
        .iter()
        .filter(|(t, _)| *t > connect + 0.5 && *t < connect + secs)
        .collect();
    assert!(
        during.len() >= (HOLD_S - 1) as usize,
        "live lines: {lines:?}"
    );
    assert!(
        during.iter().all(|(_, n)| *n == CONNS),
        "live lines: {lines:?}"
    );

    // The server's socket table: exactly 45,000 connections, never more, for an unbroken
    // stretch (checked last, below); and `ss` agreeing in the middle of it.
    // (`ss` itself adds its netlink socket to the count while it runs.)
    assert!(samples.iter().all(|s| s.1 <= CONNS + 1), "{samples:?}");
    assert_eq!(ss_srv, Some(CONNS), "ss in the server host during the hold");
    // Every extra address carried connections, the link's own address none.
    let per = per_source.unwrap_or_else(|| panic!("never sampled the sources: {samples:?}"));
    assert_eq!(per.iter().sum::<u64>(), CONNS, "{SOURCES:?} + .1: {per:?}");
    assert!(
        per[..SOURCES.len()].iter().all(|&n| n > 0 && n < ports),
        "{per:?}"
    );
    assert_eq!(per[SOURCES.len()], 0, "{per:?}");

    // echo's report: every connection accepted (plus the readiness probe) by three
    // processes that never ran out of descriptors.
    let j = common::peer::stop_echo(&echo);
    assert_eq!(u(&j, "processes"), 3, "{j:#}");
    assert_eq!(u(&j, "accepted"), CONNS + 1, "{j:#}");
    assert!(u(&j, "fd_limit") < CONNS, "{j:#}");
    for k in ["fd_exhausted", "accept_errors", "malformed"] {
        assert_eq!(u(&j, k), 0, "{k}: {j:#}");
    }
    assert_eq!(u(&j, "bytes_in"), 16 * sent, "{j:#}");
    assert_eq!(u(&j, "bytes_out"), 16 * sent, "{j:#}");

    // One run, one window: the query phase lasts -t and the rate is met over it, and the
    // server held all 45,000 at once for at least that long (within the 20 ms sampling).
    // Last, because a miss here comes with everything above already known to be right.
    let mut best = 0.0f64;
    let mut from: Option<f64> = None;
    for &(t, n) in &samples {
        match (n >= CONNS, from) {
            (true, None) => from = Some(t),
            (true, Some(f)) => best = best.max(t - f),
            (false, _) => from = None,
        }
    }
    let sent_qps = r["rates"]["sent_qps"].as_f64().unwrap();
    let window = format!(
        "query phase {secs:.2} s (asked {HOLD_S}), sent {sent_qps:.0} q/s (asked {RATE}), \
         all {CONNS} held on the server for {best:.2} s"
    );
    assert!(
        secs >= HOLD_S as f64 && (secs + connect - run_s).abs() < 0.3,
        "{window}, connects {connect:.2} s, -t {run_s}"
    );
    assert!(
        (sent_qps - RATE as f64).abs() < RATE as f64 * 0.02,
        "{window}"
    );
    assert!(best >= secs - 0.1, "{window}");
}
