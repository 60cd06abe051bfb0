//! `tcpkit load --dns` against a real resolver, as issue 3 asks: Debian's unbound in lab
//! host b, answering over TCP from a local zone written by the test (common/unbound.rs), and
//! `tcpkit load` in host a. Checked by load's report: every answer counted, RCODEs as
//! unbound gives them (NOERROR for the zone's name, NXDOMAIN for names it lacks).

use crate::common;
use crate::common::unbound;
use common::peer::{listening, u, SRV};

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Output};
use std::time::Duration;

use common::{stderr, stdout, tcpkit};
use serde_json::Value;
use tcpkit_lab::{Host, Lab, Proc, Signal};

const CONNS: u64 = 20;
const RATE: u64 = 2000;
const SECS: u64 = 3;
/// Issue 24's runs against unbound over TCP: many connections at a rate where two queries
/// are often due within one wakeup of the sender (a mean gap of 200 µs), so that batching
/// them shows, while each connection gets a query only every 20 ms on average.
const BUSY_CONNS: u64 = 100;
const BUSY_RATE: u64 = 5000;

/// Unbound in `srv` on `port`, once it accepts TCP connections from `cli`.
fn start_unbound(lab: &mut Lab, cli: &Host, srv: &Host, dir: &std::path::Path, port: u16) -> Proc {
    unbound::require();
    // Room for the clients' connections (load's, dnsperf's) and the readiness probes.
    let conf = unbound::write_conf(dir, IpAddr::V4(SRV), port, 4 * BUSY_CONNS as u32);
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
    let (c, r, t) = (CONNS.to_string(), RATE.to_string(), SECS.to_string());
    load_as(cli, port, &[&["-c", &c, "-r", &r, "-t", &t], args].concat())
}

/// `tcpkit load SRV:PORT --dns --json ARGS` in `cli`, with a hang limit; it must succeed.
fn load_as(cli: &Host, port: u16, args: &[&str]) -> (Output, Value) {
    let target = format!("{SRV}:{port}");
    let mut argv = vec![tcpkit(), "load", &target, "--dns", "--json"];
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
    // -t bounds the whole run, opening included: the query phase is `seconds` long (0.04 to
    // 0.16 s short of -t on a loaded 2-CPU VM, which failed a bound on RATE * SECS).
    let want = (RATE as f64 * r["seconds"].as_f64().unwrap()) as u64;
    assert!(SECS as f64 - r["seconds"].as_f64().unwrap() < 0.5, "{r:#}");
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

    // Two runs at once (each its own process and connections; unbound takes both rates
    // easily): their lengths overlap instead of adding up.
    let names = dir.path().join("names");
    std::fs::write(
        &names,
        format!(
            "# one name unbound has, two it does not\n{}\nnope.example\n\nmissing.example\n",
            unbound::WWW_EXAMPLE
        ),
    )
    .unwrap();
    let (one, three) = std::thread::scope(|s| {
        let three = s.spawn(|| load(&cli, port, &["--qname-file", names.to_str().unwrap()]).1);
        let one = load(&cli, port, &["--qname", unbound::WWW_EXAMPLE]).1;
        (one, three.join().unwrap())
    });

    // One name from the zone: every answer NOERROR.
    let r = one;
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
    let r = three;
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

/// The TCP payload length of every segment in `pcap` that carries data (tshark's reading).
fn segment_lengths(pcap: &std::path::Path) -> Vec<u64> {
    let o = std::process::Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(pcap)
        .args(["-Y", "tcp.len > 0", "-T", "fields", "-e", "tcp.len"])
        .output()
        .expect("tshark is needed to read the capture: apt-get install -y tshark");
    assert!(o.status.success(), "tshark: {}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| l.trim().parse().unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// Issue 24, item 1: queries leave as a client sends them, one write and so one TCP segment
/// per query, even when several are due at once; `--coalesce` puts several in one segment,
/// and only when asked. The wire oracle: tcpdump in the client host, read by tshark.
#[test]
fn tcp_queries_leave_one_per_segment_unless_coalesce_is_asked() {
    let (mut lab, cli, srv, link) = Lab::pair("ldseg").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let port = 5303;
    let _ub = start_unbound(&mut lab, &cli, &srv, dir.path(), port);
    let filter = format!("tcp dst port {port}");
    let mut capture = |extra: &[&str]| {
        let dump = lab.tcpdump(&cli, &link.a.name, &filter).expect("tcpdump");
        let rep = load_www(&cli, port, (BUSY_CONNS, BUSY_RATE), "1", extra);
        let cap = dump.stop().expect("stop tcpdump");
        assert_eq!(cap.dropped_by_kernel, 0, "tcpdump dropped packets");
        (rep, segment_lengths(&cap.path))
    };
    let (rep, lens) = capture(&[]);
    // One query of www.example A over TCP: 2 length bytes + 29 of DNS message.
    let query = u(&rep, "queries.bytes_sent") / u(&rep, "queries.sent");
    assert_eq!(query, 31, "{rep:#}");
    let multi = lens.iter().filter(|&&l| l != query).count();
    assert_eq!(
        multi,
        0,
        "{multi} of {} segments are not one query of {query} bytes: {:?}",
        lens.len(),
        lens.iter()
            .filter(|&&l| l != query)
            .take(10)
            .collect::<Vec<_>>()
    );
    // At least one segment per query (a tail-loss probe under a loaded CPU can add one).
    assert!(lens.len() as u64 >= u(&rep, "queries.sent"), "{rep:#}");

    let (rep, lens) = capture(&["--coalesce", "32"]);
    let most = lens.iter().max().copied().unwrap_or(0);
    assert!(
        most >= 2 * query && lens.len() < u(&rep, "queries.sent") as usize,
        "--coalesce 32: {} segments for {} queries, the largest {most} bytes",
        lens.len(),
        u(&rep, "queries.sent")
    );
}

/// The latencies of `dnsperf -v` lines (`> NOERROR www.example A 0.000107`), in ns, sorted.
fn dnsperf_latencies(out: &str) -> Vec<u64> {
    let mut v: Vec<u64> = out
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|s| (s * 1e9) as u64)
        .collect();
    v.sort_unstable();
    v
}

/// `dnsperf -m tcp -c CONNS -Q RATE -l SECS -v` against unbound on `port`, started in `cli`;
/// its line per answer goes to `out` (more than a pipe holds).
fn start_dnsperf(cli: &Host, dir: &std::path::Path, port: u16, out: &std::path::Path) -> Child {
    let queries = dir.join("queries");
    std::fs::write(&queries, format!("{} A\n", unbound::WWW_EXAMPLE)).unwrap();
    let (srv_s, port_s) = (SRV.to_string(), port.to_string());
    let (c, r) = (SAME.0.to_string(), SAME.1.to_string());
    let argv = [
        "dnsperf",
        "-m",
        "tcp",
        "-s",
        &srv_s,
        "-p",
        &port_s,
        "-c",
        &c,
        "-Q",
        &r,
        "-l",
        "1",
        "-v",
        "-d",
        queries.to_str().unwrap(),
    ];
    let mut cmd = cli.command(&argv);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::process::Stdio::null());
    cmd.spawn()
        .expect("dnsperf is needed: apt-get install -y dnsperf")
}

/// Waits for `child` (with a hang limit) and returns the latencies of its `-v` lines in `out`.
fn dnsperf_result(mut child: Child, out: &std::path::Path) -> Vec<u64> {
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("dnsperf ran past 20 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(out).unwrap();
    assert!(status.success(), "dnsperf: {status}: {text}");
    let lat = dnsperf_latencies(&text);
    assert!(
        lat.len() as u64 * 10 >= SAME.1 * 9,
        "dnsperf answered {} queries",
        lat.len()
    );
    lat
}

/// `tcpkit load` asking unbound's www.example over `(connections, rate)` for `secs`, with
/// `extra` flags.
fn load_www(cli: &Host, port: u16, (conns, rate): (u64, u64), secs: &str, extra: &[&str]) -> Value {
    let (c, r) = (conns.to_string(), rate.to_string());
    let args = [
        &[
            "-c",
            &c,
            "-r",
            &r,
            "-t",
            secs,
            "--qname",
            unbound::WWW_EXAMPLE,
        ][..],
        extra,
    ]
    .concat();
    load_as(cli, port, &args).1
}

/// Issue 24's case: `-c 10 -r 2000`, a query every 5 ms on each connection.
const SAME: (u64, u64) = (10, 2000);
/// The median a connection answered one query late gets is about the 5 ms gap between its
/// queries (3-5 ms measured); answered at once, 0.05-0.15 ms. A fifth of the gap tells them
/// apart with room for a loaded machine on either side.
const STUCK_NS: u64 = 1_000_000;

/// Issue 24, item 1: load's latency against unbound over TCP is dnsperf's, at the issue's 10
/// connections and 2k q/s, both clients run at the same time in the same lab.
///
/// The mechanism, from captures: unbound writes small answers with Nagle on, so it sends an
/// answer only once the one before it is acknowledged. With the kernel's delayed ACK that
/// acknowledgement rides on the client's next query: once two answers of a connection were in
/// flight together (after any stall of the server longer than the 5 ms between a connection's
/// queries), the connection is answered one query late for the rest of the run and the median
/// becomes that gap. load acknowledges answers at once (TCP_QUICKACK after each read), so a
/// stall costs it the stall, not the run. Two parts:
/// 1. load and dnsperf side by side, no stall of ours: load's median (from the actual send
///    time, as dnsperf measures) at most dnsperf's + 1 ms. A stall of the machine catches
///    both clients' connections; dnsperf stays stuck where load does not, so this only ever
///    loosens. Before: load stuck in about half the bench's runs (3-5 ms against 0.075).
/// 2. unbound stopped for 50 ms (SIGSTOP) 0.3 s into a run of two loads at once, one with
///    `--delayed-ack`: that one stuck (median over 1 ms, the control that the stall did what
///    it must), the default one not (median under 1 ms). Before: both stuck (3.7-4.6 ms).
#[test]
fn latency_over_tcp_is_dnsperfs_within_noise() {
    let _turn = common::timing_turn();
    let (mut lab, cli, srv, _link) = Lab::pair("ldperf").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let port = 5304;
    let ub = start_unbound(&mut lab, &cli, &srv, dir.path(), port);
    let p50 = |rep: &Value| u(rep, "latency_sent.p50_ns");
    let ms = |ns: u64| ns as f64 / 1e6;

    let out = dir.path().join("dnsperf.out");
    let dnsperf = start_dnsperf(&cli, dir.path(), port, &out);
    let rep = load_www(&cli, port, SAME, "1.1", &[]);
    let lat = dnsperf_result(dnsperf, &out);
    let dnsperf_p50 = lat[lat.len() / 2];
    assert!(
        p50(&rep) <= dnsperf_p50 + 1_000_000,
        "side by side: load's median {:.3} ms, dnsperf's {:.3} ms: {rep:#}",
        ms(p50(&rep)),
        ms(dnsperf_p50)
    );

    let stall = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        ub.signal(Signal::SIGSTOP).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        ub.signal(Signal::SIGCONT).unwrap();
        ub
    });
    let (rep, delayed) = std::thread::scope(|s| {
        let delayed = s.spawn(|| load_www(&cli, port, SAME, "0.9", &["--delayed-ack"]));
        let rep = load_www(&cli, port, SAME, "0.9", &[]);
        (rep, delayed.join().unwrap())
    });
    let ub = stall.join().unwrap();
    assert!(
        p50(&delayed) > STUCK_NS,
        "--delayed-ack after unbound's 50 ms stall: median {:.3} ms, not stuck one query late; \
         the stall did not do what this test needs: {delayed:#}",
        ms(p50(&delayed))
    );
    assert!(
        p50(&rep) < STUCK_NS,
        "after unbound's 50 ms stall: load's median {:.3} ms (--delayed-ack's {:.3} ms): {rep:#}",
        ms(p50(&rep)),
        ms(p50(&delayed))
    );
    assert!(
        ub.try_status().unwrap().is_none(),
        "unbound exited during the runs: {}",
        ub.log()
    );
}
