//! `tcpkit load`'s part of issue 10 ("One run contract for every subcommand"): each case is
//! run as a user met it, the real binary in lab host a against a real peer in host b
//! (`tcpkit echo`, a server that accepts late, a host behind an nftables drop), and checked by
//! exit status, stderr and the report. Named after the cases they pin.

use crate::common;
use common::peer::{echo_pair, json, merge, pair, target, u, Pair, SRV};
use common::schema;

use std::net::SocketAddr;
use std::process::Output;
use std::time::Duration;

use common::{stderr, stdout};
use serde_json::Value;

/// `tcpkit load ARGS` in the client host, 30 s at most; also how long it ran.
fn run(p: &Pair, args: &[&str]) -> (Output, Duration) {
    p.load_in(std::path::Path::new("/"), args, Duration::from_secs(30))
}

/// `tcpkit load SRV:PORT PAYLOAD -c 2 -r 100 -t 1 --timeout 300ms --json`: a short run
/// against a server that answers nothing, ending in bounded time.
fn quiet_run(p: &Pair, port: u16, payload: &[&str]) -> (Output, Duration) {
    let t = target(port);
    let tail = [
        "-c",
        "2",
        "-r",
        "100",
        "-t",
        "1",
        "--timeout",
        "300ms",
        "--json",
    ];
    run(p, &[&[t.as_str()][..], payload, &tail].concat())
}

fn last_line(o: &Output) -> String {
    stderr(o).lines().last().unwrap_or("").to_string()
}

fn hints(r: &Value) -> Vec<String> {
    r["hints"]
        .as_array()
        .unwrap_or_else(|| panic!("no hints array in {r:#}"))
        .iter()
        .filter_map(|h| h.as_str().map(str::to_string))
        .collect()
}

// ---- Case 5: load's default payload (DNS) against echo's default mode (plain echo). ----

/// An echoed query (same ID, QR clear) is the answer tcpclient counts it as: every query is
/// answered, at the asked rate, on the connections first opened, and the echoes are counted
/// apart (`echoed`), not as NOERROR answers and not as malformed ones.
#[test]
fn issue_10_case_5_dns_load_against_plain_echo_counts_echoed_queries() {
    let p = echo_pair("lcecho", 5300);
    let t = target(5300);
    let (o, _) = run(&p, &[&t, "-c", "4", "-r", "500", "-t", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&o);
    schema::check(&schema::load("load"), &r, "report");
    let sent = u(&r, "queries.sent");
    assert!(sent > 400, "{r:#}");
    assert_eq!(u(&r, "queries.answered"), sent, "{r:#}");
    assert_eq!(u(&r, "queries.echoed"), sent, "{r:#}");
    assert_eq!(u(&r, "queries.malformed"), 0, "{r:#}");
    assert_eq!(u(&r, "connections.reconnects"), 0, "{r:#}");
    assert_eq!(u(&r, "connections.established"), 4, "{r:#}");
    assert!(r["codes"].as_object().unwrap().is_empty(), "{r:#}");
    // Issue 24, item 18: and says which server this is, and what loads it.
    let h = hints(&r);
    assert!(
        h.iter()
            .any(|h| h.starts_with("every answer was the query sent back")
                && h.contains("--echo-bytes N")),
        "{h:?}"
    );
    // The summary says so in words.
    let (o, _) = run(&p, &[&t, "-c", "2", "-r", "100", "-t", "0.5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains(" of them the query echoed back)"), "{text}");
}

/// Issue 24, item 18: `--echo-bytes` against `echo --dns` (a DNS server waits for the rest
/// of what a length prefix made of echo bytes asks for) ends with the protocol hint, on the
/// last line and in the report, not only "no answers" and timeouts.
#[test]
fn issue_24_echo_bytes_against_a_dns_server_hints_the_protocol() {
    let mut p = common::peer::pair("lcproto");
    p.echo(5303, &["--dns"]);
    let (o, _) = quiet_run(&p, 5303, &["--echo-bytes", "32"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(u(&r, "queries.answered"), 0, "{r:#}");
    let e = last_line(&o);
    assert!(
        e.starts_with("tcpkit load: no answers: ")
            && e.contains("the server accepted")
            && e.contains("loaded with --dns"),
        "{e}"
    );
    let h = hints(&r);
    assert!(
        h.iter()
            .any(|h| h.starts_with("the server accepted") && h.contains("(echo 32 bytes)")),
        "{h:?}"
    );
}

// ---- Case 6: wrk2 habits. ----

/// Without `-r` a run sends nothing: refused as a usage error naming -r, unless `--hold`
/// says that holding connections is the point. A held run reports its connections and a
/// latency table that says "no samples", not rows of `0.0 us`.
#[test]
fn issue_10_case_6_no_rate_is_refused_unless_hold() {
    let p = echo_pair("lchold", 5301);
    let t = target(5301);
    let (o, took) = run(&p, &[&t, "-t", "1", "-c", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = last_line(&o);
    assert!(
        e.starts_with("tcpkit load: ") && e.contains("-r") && e.contains("--hold"),
        "{e}"
    );
    assert!(
        took < Duration::from_millis(900),
        "refused before running: {took:?}"
    );
    let (o, took) = run(&p, &[&t, "-t", "1", "-c", "3", "--hold"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(took >= Duration::from_millis(900), "{took:?}");
    let text = stdout(&o);
    assert!(
        text.contains("Connections: 3 asked, 3 peak open, 3 open at end"),
        "{text}"
    );
    assert!(text.contains("  no samples\n"), "{text}");
    assert!(!text.contains("0.0 us"), "{text}");
    // With a rate, --hold is a contradiction.
    let (o, _) = run(&p, &[&t, "-t", "1", "--hold", "-r", "10"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// `-R 200` (wrk2's rate) is tcpclient's per-query CSV file: the run does what it says, and
/// stderr warns that a file named 200 is written and that the rate flag is `-r`.
#[test]
fn issue_10_case_6_bare_number_for_per_query_file_warns() {
    let p = echo_pair("lcbigr", 5302);
    let t = target(5302);
    let dir = tempfile::tempdir().unwrap();
    // In a folder of its own, where the file a bare -R names is written.
    let with_r = |file: &str| {
        let args = [
            t.as_str(),
            "--echo-bytes",
            "8",
            "-c",
            "1",
            "-r",
            "20",
            "-t",
            "0.5",
            "-R",
            file,
        ];
        p.load_in(dir.path(), &args, Duration::from_secs(30)).0
    };
    let o = with_r("200");
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    let warning = e
        .lines()
        .find(|l| l.starts_with("tcpkit load: warning: -R 200"))
        .unwrap_or_else(|| panic!("no warning: {e}"));
    assert!(
        warning.contains("CSV file named 200") && warning.contains("-r"),
        "{warning}"
    );
    assert!(dir.path().join("200").is_file());
    // A path is not warned about.
    let o = with_r("q.csv");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

// ---- Case 7: targets that cannot be are usage errors. ----

/// Not a name lookup that fails at run time (exit 1, "Temporary failure in name
/// resolution"), but a usage error (exit 2) naming the target and what is wrong with it.
#[test]
fn issue_10_case_7_impossible_targets_are_usage_errors() {
    for (target, why) in [
        ("300.1.2.3:4242", "300.1.2.3 is not an IPv4 address"),
        ("1.2.3:4242", "1.2.3 is not an IPv4 address"),
        ("198.18.0.2:70000", "port 70000 is above 65535"),
        ("example.com:70000", "port 70000 is above 65535"),
        ("198.18.0.2:0", "port 0"),
        ("198.18.0.2:http", "port 'http' is not a number"),
        ("[fe80::1:4242", "["),
    ] {
        let o = common::run(&["load", target, "-r", "1", "-t", "1"]);
        assert_eq!(o.status.code(), Some(2), "{target}: {}", stderr(&o));
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{target}: {e}");
        assert!(
            e.starts_with(&format!("tcpkit load: {target}: ")) && e.contains(why),
            "{target}: {e}"
        );
    }
}

// ---- Case 8: the hint matches the evidence; the duration bounds the run. ----

/// A black-holed host (nftables drops every SYN: no SYN-ACK at all) is not an accept queue
/// that is full: the hint says nothing answered and what that means. And `-t 1` bounds the
/// whole run, connect phase included: about 1 s, not 4 attempts of 3 s.
#[test]
fn issue_10_case_8_blackholed_host_hint_and_duration_bound() {
    let p = pair("lcblack");
    common::nft::drop_tcp_to(&p.srv, 5303);
    let t = target(5303);
    for flag in ["-t", "--duration"] {
        let (o, took) = run(&p, &[&t, "-c", "3", "-r", "10", flag, "1", "--json"]);
        eprintln!("{flag} 1 against a black hole ran {took:?}");
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            took < Duration::from_millis(1800),
            "{flag} 1 ran {took:?}: {}",
            stderr(&o)
        );
        let r = json(&o);
        let h = hints(&r);
        assert!(
            h.iter().any(|h| h.starts_with("no answer to any connect")),
            "{h:?}"
        );
        assert!(!h.iter().any(|h| h.contains("accept queue")), "{h:?}");
        let e = stderr(&o);
        assert!(!e.contains("accept queue"), "{e}");
        assert!(
            last_line(&o).contains("could not connect to 198.18.0.2:5303"),
            "{e}"
        );
    }
}

/// A refused connect (RST) says nothing listens there; neither the accept queue nor "no
/// answer".
#[test]
fn issue_10_case_8_refused_port_hint() {
    let p = pair("lcrefuse");
    let t = target(9);
    let (o, _) = run(&p, &[&t, "-c", "2", "-r", "10", "-t", "1", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let r = json(&o);
    let h = hints(&r);
    assert_eq!(h.len(), 1, "{h:?}");
    assert!(h[0].starts_with("connects refused (RST)"), "{h:?}");
    let e = stderr(&o);
    assert!(
        e.lines()
            .any(|l| l.starts_with("tcpkit load: connects refused (RST)")),
        "{e}"
    );
}

/// A server whose accept queue is full drops SYNs, then answers a retransmission once it
/// accepts: connects answered late (after the 1 s retransmission) are the evidence for the
/// accept-queue hint. The server here listens with a backlog of 1 and accepts nothing for
/// 1.5 s, then everything.
#[test]
fn issue_10_case_8_connects_answered_late_give_the_accept_queue_hint() {
    let p = pair("lclate");
    let l = p.srv.enter(|| {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.bind(&SocketAddr::from((SRV, 5304)).into())?;
        s.listen(1)?;
        std::io::Result::Ok(std::net::TcpListener::from(s))
    });
    let l = l.expect("listen in the server host");
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    let t = target(5304);
    let (o, _) = run(
        &p,
        &[
            &t,
            "-c",
            "8",
            "--hold",
            // The SYNs dropped at the full queue are resent at 1 s and 3 s: all 8 are open
            // by ~3 s.
            "-t",
            "4.5",
            "--connect-timeout",
            "5s",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(u(&r, "connections.peak_open"), 8, "{r:#}");
    assert!(u(&r, "connections.slow") >= 1, "{r:#}");
    let h = hints(&r);
    assert!(
        h.iter()
            .any(|h| h.starts_with("connects answered late") && h.contains("accept queue")),
        "{h:?}"
    );
    assert!(!h.iter().any(|h| h.starts_with("no answer")), "{h:?}");
}

// ---- Case 11: run ids and merge. ----

fn load_json_to(p: &Pair, t: &str, path: &std::path::Path) -> Value {
    let (o, _) = run(
        p,
        &[
            t,
            "--echo-bytes",
            "8",
            "-c",
            "2",
            "-r",
            "100",
            "-t",
            "0.5",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(path, &o.stdout).unwrap();
    json(&o)
}

/// Every report has a run id (128 random bits in hex) and its wall-clock window; merge
/// refuses one run given twice, under one name or two, with one line naming both files.
#[test]
fn issue_10_case_11_merge_refuses_the_same_run_twice() {
    let p = echo_pair("lcmerge2", 5305);
    let t = target(5305);
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let ra = load_json_to(&p, &t, &a);
    schema::check(&schema::load("load"), &ra, "report");
    let id = ra["run_id"].as_str().unwrap();
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
    assert!(u(&ra, "start_unix_ns") > 0 && u(&ra, "end_unix_ns") > u(&ra, "start_unix_ns"));
    std::fs::copy(&a, &b).unwrap();
    for files in [[&a, &a], [&a, &b]] {
        let o = merge(&[files[0], files[1]]);
        // The files named cannot be used as given: a usage error (issue 24, item 15).
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(o.stdout.is_empty(), "{}", stdout(&o));
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        let (fa, fb) = (
            files[0].display().to_string(),
            files[1].display().to_string(),
        );
        assert!(
            e.starts_with("tcpkit merge: ")
                && e.contains(&fa)
                && e.contains(&fb)
                && e.contains("same run")
                && e.contains(id),
            "{e}"
        );
    }
    // Another run has another id and merges; the merged report has an id of its own and
    // names what it merged, so merging it with one of its parts is refused too.
    let c = dir.path().join("c.json");
    let rc = load_json_to(&p, &t, &c);
    assert_ne!(rc["run_id"], ra["run_id"]);
    let o = merge(&[&a, &c]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = json(&o);
    schema::check(&schema::load("load"), &m, "merged");
    assert_eq!(
        m["merged_run_ids"],
        serde_json::json!([ra["run_id"], rc["run_id"]])
    );
    let mp = dir.path().join("m.json");
    std::fs::write(&mp, &o.stdout).unwrap();
    let o = merge(&[&mp, &c]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("same run"), "{}", stderr(&o));
}

/// Runs that did not overlap in time merge (their counts are right), with a warning on
/// stderr saying by how much they missed each other, since the combined rate is over a
/// window neither filled.
#[test]
fn issue_10_case_11_merge_warns_when_runs_do_not_overlap() {
    let p = echo_pair("lcmergegap", 5306);
    let t = target(5306);
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let ra = load_json_to(&p, &t, &a);
    std::thread::sleep(Duration::from_millis(1200));
    let rb = load_json_to(&p, &t, &b);
    let gap = (u(&rb, "start_unix_ns") - u(&ra, "end_unix_ns")) as f64 / 1e9;
    assert!(gap > 1.0, "{gap}");
    let o = merge(&[&a, &b]);
    assert!(o.status.success(), "{}", stderr(&o));
    json(&o);
    let e = stderr(&o);
    let w = e
        .lines()
        .find(|l| l.starts_with("tcpkit merge: warning: "))
        .unwrap_or_else(|| panic!("no warning: {e}"));
    let said = format!("{gap:.1} s");
    assert!(
        w.contains("did not overlap")
            && w.contains(&a.display().to_string())
            && w.contains(&b.display().to_string())
            && w.contains(&said),
        "{w} (gap {said})"
    );
    // Overlapping runs: no warning. Two runs at once, one per process.
    let (c, d) = (dir.path().join("c.json"), dir.path().join("d.json"));
    std::thread::scope(|s| {
        let h = s.spawn(|| load_json_to(&p, &t, &c));
        load_json_to(&p, &t, &d);
        h.join().unwrap();
    });
    let o = merge(&[&c, &d]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

// ---- DNS over UDP: an unanswered datagram is a timeout. ----

/// A UDP server that reads and never answers: every query is a timeout after --timeout (no
/// connection to close, nothing lost), and the run fails with no answers, in bounded time.
#[test]
fn udp_queries_unanswered_by_the_timeout_are_timeouts() {
    let p = pair("lcudpmute");
    let sock = p
        .srv
        .enter(|| std::net::UdpSocket::bind((SRV, 5307)))
        .expect("bind in the server host");
    let (o, took) = quiet_run(&p, 5307, &["--udp"]);
    drop(sock);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(took < Duration::from_secs(3), "{took:?}");
    let r = json(&o);
    schema::check(&schema::load("load"), &r, "report");
    assert_eq!(r["payload"], "dns A example.com over UDP", "{r:#}");
    assert_eq!(u(&r, "queries.answered"), 0, "{r:#}");
    let sent = u(&r, "queries.sent");
    assert!(sent > 50, "{r:#}");
    assert_eq!(
        u(&r, "queries.timeouts") + u(&r, "queries.unanswered_at_end"),
        sent,
        "{r:#}"
    );
    assert!(u(&r, "queries.timeouts") > 50, "{r:#}");
    assert_eq!(u(&r, "queries.lost"), 0, "{r:#}");
    assert!(last_line(&o).contains("no answers"), "{}", stderr(&o));
}
