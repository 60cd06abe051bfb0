//! `tcpkit load --dns` against a real resolver, as issue 3 asks: Debian's unbound in lab
//! host b, answering over TCP from a local zone written by the test (common/unbound.rs), and
//! `tcpkit load` in host a. Checked by load's report: every answer counted, RCODEs as
//! unbound gives them (NOERROR for the zone's name, NXDOMAIN for names it lacks).

use crate::common;
use crate::common::unbound;
use common::peer::{listening, u, SRV};

use std::net::{IpAddr, SocketAddr};
use std::process::Output;
use std::time::Duration;

use common::{stderr, stdout, tcpkit};
use serde_json::Value;
use tcpkit_lab::{Host, Lab, Proc};

const CONNS: u64 = 20;
const RATE: u64 = 2000;
const SECS: u64 = 3;

/// Unbound in `srv` on `port`, once it accepts TCP connections from `cli`.
fn start_unbound(lab: &mut Lab, cli: &Host, srv: &Host, dir: &std::path::Path, port: u16) -> Proc {
    unbound::require();
    // Room for load's connections and the readiness probes.
    let conf = unbound::write_conf(dir, IpAddr::V4(SRV), port, 4 * CONNS as u32);
    let argv = unbound::argv(&conf);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let p = srv
        .spawn(lab, "unbound", &argv)
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = SocketAddr::from((SRV, port));
    assert!(
        listening(cli, addr),
        "unbound never listened on {addr}: {}",
        p.log()
    );
    p
}

/// `tcpkit load SRV:PORT --dns -c 20 -r 2000 -t 3 --json ARGS` in `cli`, with a hang limit.
fn load(cli: &Host, port: u16, args: &[&str]) -> (Output, Value) {
    let target = format!("{SRV}:{port}");
    let (c, r, t) = (CONNS.to_string(), RATE.to_string(), SECS.to_string());
    let mut argv = vec![
        tcpkit(),
        "load",
        &target,
        "--dns",
        "-c",
        &c,
        "-r",
        &r,
        "-t",
        &t,
        "--json",
    ];
    argv.extend_from_slice(args);
    let mut cmd = cli.command(&argv);
    cmd.stdin(std::process::Stdio::null());
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tcpkit load");
    let pid = child.id();
    // 3 s of queries, the connect ramp and up to --timeout (2 s) for the last answers.
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        // SAFETY: kill(2) of the process group we started (Host::command makes one); if it
        // already exited and was reaped, the group is gone and this is ESRCH.
        unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
    });
    let o = child.wait_with_output().expect("wait for tcpkit load");
    assert!(
        !watchdog.is_finished(),
        "tcpkit load ran past 30 s (a hang): {} {}",
        stdout(&o),
        stderr(&o)
    );
    assert!(o.status.success(), "load: {} {}", stderr(&o), stdout(&o));
    let r: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", stdout(&o), stderr(&o)));
    (o, r)
}

/// The checks both runs share: every connection held, every query answered (answered =
/// sent − every query counted as not answered, and here none is), well-formed, at the rate.
fn assert_all_answered(r: &Value) {
    assert_eq!(u(r, "connections.peak_open"), CONNS, "{r:#}");
    assert_eq!(u(r, "connections.closed_by_server"), 0, "{r:#}");
    let sent = u(r, "queries.sent");
    let not = u(r, "queries.timeouts") + u(r, "queries.lost") + u(r, "queries.unanswered_at_end");
    assert_eq!(u(r, "queries.answered"), sent - not, "{r:#}");
    assert_eq!(not, 0, "{r:#}");
    let want = RATE * SECS;
    assert!(
        sent.abs_diff(want) * 50 <= want,
        "sent {sent}, asked {want}: {r:#}"
    );
    assert_eq!(u(r, "queries.malformed"), 0, "{r:#}");
    assert_eq!(u(r, "queries.unmatched"), 0, "{r:#}");
    assert_eq!(r["errors"], serde_json::json!({}), "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
    assert_eq!(u(r, "latency.count"), sent, "{r:#}");
}

#[test]
fn dns_load_against_unbound_counts_noerror_and_nxdomain() {
    let (mut lab, cli, srv, _link) = Lab::pair("ldunbound").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let port = 5301;
    let ub = start_unbound(&mut lab, &cli, &srv, dir.path(), port);

    // One name from the zone: every answer NOERROR.
    let (_, r) = load(&cli, port, &["--qname", unbound::WWW_EXAMPLE]);
    assert_all_answered(&r);
    assert_eq!(
        r["payload"],
        format!("dns A {}", unbound::WWW_EXAMPLE),
        "{r:#}"
    );
    assert_eq!(
        r["codes"],
        serde_json::json!({ "NOERROR": u(&r, "queries.answered") }),
        "{r:#}"
    );

    // One name of three exists: a third NOERROR, two thirds NXDOMAIN (names are taken in
    // turn, so the split is exact up to one name per event-loop thread).
    let names = dir.path().join("names");
    std::fs::write(
        &names,
        format!(
            "# one name unbound has, two it does not\n{}\nnope.example\n\nmissing.example\n",
            unbound::WWW_EXAMPLE
        ),
    )
    .unwrap();
    let (_, r) = load(&cli, port, &["--qname-file", names.to_str().unwrap()]);
    assert_all_answered(&r);
    assert_eq!(r["payload"], "dns A, 3 names", "{r:#}");
    let answered = u(&r, "queries.answered");
    let noerror = u(&r, "codes.NOERROR");
    let nxdomain = u(&r, "codes.NXDOMAIN");
    assert_eq!(r["codes"].as_object().unwrap().len(), 2, "{r:#}");
    assert_eq!(noerror + nxdomain, answered, "{r:#}");
    let threads = u(&r, "threads");
    assert!(
        (3 * nxdomain).abs_diff(2 * answered) <= 3 * threads,
        "NXDOMAIN {nxdomain} of {answered}, want two thirds: {r:#}"
    );

    assert!(
        ub.try_status().unwrap().is_none(),
        "unbound exited during the runs: {}",
        ub.log()
    );
}

/// `Udp: ... OutDatagrams` of `/proc/net/snmp` in `host` (its network namespace's count).
fn udp_out_datagrams(host: &Host) -> u64 {
    let o = host.run(&["cat", "/proc/net/snmp"]).unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "OutDatagrams")
        .unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// What dnsperf users bring (issue 10): DNS over UDP (`--udp`, dnsperf's default) and a query
/// file in dnsperf's `name type` form, against unbound. Every query answered, RCODEs as
/// unbound gives them, and the queries did leave as datagrams.
#[test]
fn dns_over_udp_against_unbound_with_a_dnsperf_query_file() {
    let (mut lab, cli, srv, _link) = Lab::pair("ldunbudp").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let port = 5302;
    let ub = start_unbound(&mut lab, &cli, &srv, dir.path(), port);
    let queries = dir.path().join("queries");
    std::fs::write(
        &queries,
        format!(
            "; dnsperf's format: name type\n{w} A\n\n{w} AAAA\nnope.example A ; not in the zone\n",
            w = unbound::WWW_EXAMPLE
        ),
    )
    .unwrap();
    let before = udp_out_datagrams(&cli);
    let (_, r) = load(
        &cli,
        port,
        &["--udp", "--qname-file", queries.to_str().unwrap()],
    );
    let datagrams = udp_out_datagrams(&cli) - before;
    assert_all_answered(&r);
    assert_eq!(r["payload"], "dns mixed types, 3 names over UDP", "{r:#}");
    assert!(
        datagrams >= u(&r, "queries.sent"),
        "{datagrams} datagrams: {r:#}"
    );
    let answered = u(&r, "queries.answered");
    let noerror = u(&r, "codes.NOERROR");
    let nxdomain = u(&r, "codes.NXDOMAIN");
    assert_eq!(noerror + nxdomain, answered, "{r:#}");
    // www.example A and AAAA (no AAAA record: NOERROR, no data) vs nope.example.
    let threads = u(&r, "threads");
    assert!(
        (3 * nxdomain).abs_diff(answered) <= 3 * threads,
        "NXDOMAIN {nxdomain} of {answered}, want a third: {r:#}"
    );
    assert!(
        ub.try_status().unwrap().is_none(),
        "unbound exited during the run: {}",
        ub.log()
    );
}
