//! `tcpkit copy --transparent` with `tcpkit intercept`, in the copy lab plus an assistant:
//! clients → online (nginx; copy runs here) → target (nginx; routes the clients' subnet via
//! the assistant) → assistant (intercept). The online host reaches intercept's control port
//! over a management link of its own, so the target needs no forwarding. What transparent mode
//! shares with relay mode is tested from one body in both, in copy_modes.rs.

use crate::copy_common;

use std::process::Child;
use std::time::Duration;

use copy_common::tlab::*;
use copy_common::*;
use tcpkit_lab::Signal;

/// The transparent lab with intercept catching every answer from `port` (both families).
fn tlab(tag: &str, port: u16) -> TLab {
    let mut t = TLab::new(tag);
    t.filter = format!("src port {port}");
    t
}

/// A live transparent copy of 8080 to the target, 2 s timeout, with `extra` flags.
fn copy(t: &TLab, extra: &[&str]) -> Child {
    t.copy(&rule_8080(), &[&["--timeout", "2"], extra].concat())
}

/// intercept killed and restarted under live copying ([`intercept_restarted`]): the copy
/// loses its control connection, counts the copies the gap cut, reconnects, and copying
/// resumes.
#[test]
fn transparent_survives_an_intercept_restart_counting_the_copies_it_cut() {
    let mut t = tlab("cptrrst", 8080);
    let (on_log, tg_log) = t.l.nginx_pair();
    let first = t.intercept("intercept1");
    let c = copy(&t, &["--duration", "5"]);
    let clients = t.l.clients.clone();
    let (_second, r, before) =
        intercept_restarted(&clients, &tg_log, c, &first, || t.intercept("intercept2"));
    let after = lines(&tg_log).len();
    eprintln!(
        "restart: online {} target {} (before restart {before}) {}",
        lines(&on_log).len(),
        after,
        r["transparent"]
    );
    // The keep-alive sessions in flight at the kill are cut (counted as control_lost);
    // the new connections of the 50/s load go on being copied after the restart.
    assert!(u(&r, "transparent.control_lost") >= 2, "{r:#}");
    assert_resumed(&r, before, after);
}

/// Clients sending 500 requests a second on each keep-alive connection (2 ms apart, as in the
/// copy bench's keep-alive rows): every request is copied and answered by the end of the run
/// (`--duration`, 1.5 s past the load) and its bounded drain. A copy learns of each answer
/// later than the client did of the original's (through intercept); when every request
/// waited for that whole lateness plus the client's think time, the copies ran at ~60 % of
/// the clients' pace, and after 10 s of load a third of the requests were still unsent.
#[test]
fn transparent_keep_alive_copies_keep_the_clients_pace_at_500_requests_a_second() {
    // A pace is timed: another paced test beside it on two cores would measure both.
    let _turn = crate::common::timing_turn();
    let mut t = tlab("cptrpace", 8080);
    let (on_log, tg_log) = t.l.nginx_pair();
    let _i = t.intercept("intercept");
    let c = copy(&t, &["--duration", "11.5"]);
    // Two connections at 500 requests a second each, for 10 s.
    load(&t.l.clients, "1000", "10", None);
    let o = wait_limited(c, Duration::from_secs(20));
    let r = json(&o);
    let (online, target) = (lines(&on_log).len() as u64, lines(&tg_log).len() as u64);
    eprintln!(
        "pace: online {online} target {target} requests {} sessions {} latency {}",
        r["requests"], r["sessions"], r["latency"]
    );
    let r = tlab::transparent_report(&o);
    assert_eq!(u(&r, "sessions.open_at_end"), 0, "{r:#}");
    assert_eq!(u(&r, "sessions.completed"), 2, "{r:#}");
    assert_eq!(
        u(&r, "requests.copied"),
        u(&r, "requests.at_source"),
        "{r:#}"
    );
    assert_all_answered(&r);
    // The load made thousands of requests, and the target got every one the online server did.
    assert!(online >= 5000, "only {online} requests online");
    assert_eq!(target, online, "{r:#}");
}

#[test]
fn intercept_refuses_to_start_on_a_forwarding_host() {
    let t = tlab("cptrfwd", 8080);
    t.assistant
        .sysctl("net.ipv4.ip_forward", "1")
        .expect("sysctl");
    let argv = t.intercept_args();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let o = run_limited(t.assistant.command(&argv), Duration::from_secs(5));
    one_line_failure(
        &o,
        "tcpkit intercept: forwarding is on (net.ipv4.ip_forward=1)",
        "sysctl -w net.ipv4.ip_forward=0",
    );
}

#[test]
fn copy_with_intercept_unreachable_at_start_is_one_line() {
    let t = tlab("cptrunr", 8080);
    let (rule, ia, cap) = (rule_8080(), t.intercept_addr(), t.l.capture_if());
    let mut argv = t.copy_args(&rule, &ia);
    argv.extend(["-i", &cap]);
    let o = t.l.copy_to_end(&argv, Duration::from_secs(10));
    one_line_failure(
        &o,
        &format!("tcpkit copy: intercept {ia} unreachable: "),
        "refused",
    );
}

#[test]
fn transparent_ipv6_target_sees_the_clients_with_loss_under_a_thousandth_and_nothing_reaches_them()
{
    let mut t = tlab("cptr6", 8080);
    t.add_v6();
    let (_on, on_log) = t.l.nginx_also_on(true, Log::Peer, Some(ONLINE6));
    let (_tg, tg_log) = t.l.nginx_also_on(false, Log::Peer, Some(TARGET6));
    let icp = t.intercept("intercept");
    let dump = t.l.watch_clients();
    let c = t.copy(
        &format!("8080-[{TARGET6}]:8080"),
        &["--timeout", "2", "--duration", "3"],
    );
    let clients = t.l.clients.clone();
    let online6 = format!("[{ONLINE6}]");
    let load6 = |rate: &str, per_conn: Option<&str>| {
        load_to(&clients, &online6, rate, "2", per_conn, &[]);
    };
    std::thread::scope(|s| {
        let a = s.spawn(|| load6("300", None));
        let b = s.spawn(|| load6("150", Some("1")));
        a.join().unwrap();
        b.join().unwrap();
    });
    let r = copy_done(c);
    stop_intercept(&icp, Signal::SIGINT);
    let online = lines(&on_log);
    let target = lines(&tg_log);
    assert!(online.len() > 800, "{} requests online", online.len());
    assert_all_from(&online, CLIENT6);
    // Every request at the target came from the clients' own IPv6 address.
    assert_all_from(&target, CLIENT6);
    assert!(target.iter().all(|l| l.contains(" 200 ")), "{target:?}");
    let loss = (online.len() as f64 - target.len() as f64) / online.len() as f64;
    eprintln!(
        "transparent IPv6: {} requests online, {} at the target (loss {:.4} %)",
        online.len(),
        target.len(),
        loss * 100.0
    );
    assert!(loss <= 0.001, "loss {loss}: {r:#}");
    assert_eq!(r["rules"][0], format!("8080-[{TARGET6}]:8080"), "{r:#}");
    assert_all_completed(&r);
    assert_eq!(u(&r, "transparent.send_errors"), 0, "{r:#}");
    // Nothing from the target or the assistant on the clients' link, in either family.
    let beyond = [
        TARGET, TGT_A, ASSIST, ASSIST_M, ONLINE_T, ONLINE_M, TARGET6, TGT6_A, ASSIST6, ONLINE6_T,
    ];
    let text = assert_none_from(dump, &beyond, 1000);
    assert!(text.iter().any(|l| l.contains(&format!(" {CLIENT6}."))));
}

/// `--check` in transparent mode probes the return path end to end: a SYN from a client's
/// address through the raw socket, the target's SYN-ACK caught by intercept. With the target
/// routing the clients via the assistant the probe is OK, from `-c`'s prefix or from a client
/// seen on the capture; with neither it says what it lacks; with the route gone it fails and
/// names the route to add.
#[test]
fn check_probes_the_return_path_through_intercept() {
    let mut t = tlab("cptrchk", 8080);
    t.l.nginx_pair();
    let _icp = t.intercept("intercept");
    let ia = t.intercept_addr();
    let check = |extra: &[&str]| {
        let mut extra = extra.to_vec();
        extra.extend(t.key_args());
        let r = check_return_path(&t.l, &ia, &extra);
        (r.code, r.line)
    };
    let head = format!("return path {TARGET}:8080 via intercept {ia}: ");

    let (code, l) = check(&["-c", "198.18.1.0/24"]);
    assert_eq!(code, Some(0), "{l}");
    assert!(
        l.starts_with(&format!("OK   {head}a SYN from 198.18.1.1:"))
            && l.contains("answered with SYN-ACK (reset at once), caught by intercept in"),
        "{l}"
    );

    // No -c: the address of a client seen on the capture.
    let clients = t.l.clients.clone();
    let (code, l) = std::thread::scope(|s| {
        let traffic = s.spawn(|| load(&clients, "50", "3", None));
        std::thread::sleep(Duration::from_millis(300));
        let r = check(&[]);
        traffic.join().unwrap();
        r
    });
    assert_eq!(code, Some(0), "{l}");
    assert!(
        l.starts_with(&format!("OK   {head}a SYN from {CLIENT}:")),
        "{l}"
    );

    // Neither -c nor traffic: nothing to probe from, and what to do.
    let (code, l) = check(&[]);
    assert_eq!(code, Some(1), "{l}");
    assert!(
        l.starts_with(&format!("FAIL {head}no client address to probe from"))
            && l.contains("; fix: run --check while clients send traffic, or give -c"),
        "{l}"
    );

    // The target no longer routes the clients via the assistant.
    t.l.target
        .run(&["ip", "route", "del", "198.18.1.0/24"])
        .expect("route");
    let (code, l) = check(&["-c", "198.18.1.0/24"]);
    assert_eq!(code, Some(1), "{l}");
    assert!(
        l.starts_with(&format!("FAIL {head}a SYN from 198.18.1.1:"))
            && l.contains("got no answer through intercept within 2 s")
            && l.contains("`ip route add 198.18.1.1/32 via <assistant>`")
            && l.contains("rp_filter"),
        "{l}"
    );
}

/// Drops on the target's way to the assistant (every 8th answer segment, by an nft rule on
/// the target: a count, not a queue too short for its bursts, which lost nothing when a busy
/// machine slowed the target down): intercept never sees those segments, so copy gets the
/// rest out of order and must rely on the target resending what it did not acknowledge.
#[test]
fn transparent_diff_is_exact_when_answers_are_lost_on_the_way_to_intercept() {
    let mut t = tlab("cptrdfl2", 8080);
    let (_tg, _) = t.l.nginx(false, Log::Peer);
    let body: String = (0..60_000u32)
        .map(|i| char::from(b'A' + (i * 11 % 26) as u8))
        .collect();
    serve(&t.l, "target", &[("big.txt", &body)]);
    let big = fetch(&t.l, "/big.txt");
    assert!(big.ends_with(body.as_bytes()));
    let orig = String::from_utf8(old_date(&big))
        .unwrap()
        .replace("Connection: close", "Connection: keep-alive")
        .into_bytes();
    let _icp = t.intercept("intercept");
    let dev = t.tgt_ast_if.clone();
    let chain = nft::Chain::new(&t.l.target, "lossy", "output");
    // Only segments with payload: the handshake and the close are not what is tested.
    chain.rule(&[
        "oifname", &dev, "tcp", "sport", "8080", "meta", "length", ">", "100", "numgen", "inc",
        "mod", "8", "==", "0", "counter", "drop",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("big.pcap");
    diff_capture(
        &pcap,
        4,
        44000,
        &[
            ("/big.txt", orig.clone()),
            ("/big.txt", orig.clone()),
            ("/big.txt", orig),
        ],
    );
    // --timeout 10, not the file's 2 s: each lost segment costs the target a retransmission
    // timeout (200 ms, doubling when it is lost again), and on a busy machine the last
    // answer of a tbf-lossy run once needed more than the 2 s + linger the drain gives.
    let o = t.copy_offline(
        &rule_8080(),
        &[
            "--timeout",
            "10",
            "--input",
            pcap.to_str().unwrap(),
            "--speed",
            "10",
            "--diff",
            "--diff-mode",
            "http",
            "--diff-ignore",
            "^Date:",
        ],
    );
    let d = diff_of(&o);
    let (dropped, rules) = chain.packets();
    eprintln!("lossy path: {dropped} answer segments dropped before intercept; {d}");
    assert!(
        dropped > 0,
        "the path lost nothing, so nothing was tested: {rules}"
    );
    // Every one of the 12 answers arrived whole and equal (60 kB bodies compared byte by
    // byte, under the 64 KiB kept per answer).
    assert_eq!(counts(&d), (12, 12, 0), "{d:#}");
    assert_eq!(u(&d, "compared_by_hash"), 0, "{d:#}");
    assert_eq!(u(&d, "not_compared"), 0, "{d:#}");
}

/// A SYN whose send fails on the copy's own host never reached the target, so it is sent
/// again at once, not after the SYN's 1 s retransmission timeout: here an nft rule in the
/// online host's output path refuses the first SYN toward the target (sendto says EPERM;
/// under load a full raw socket buffer says EAGAIN the same way). With `--timeout 1` the
/// connect deadline is that 1 s, so a copy that waited the timeout always timed out (and at
/// 20k new connections a second such SYNs were still waiting when a stopped run's 1 s drain
/// ended); resent, the session completes.
#[test]
fn a_syn_that_failed_to_leave_the_copy_host_is_sent_again_before_its_timeout() {
    let mut t = tlab("cptrlocal", 8080);
    let (_tg, tg_log) = t.l.nginx(false, Log::Peer);
    serve(&t.l, "target", &[("same.txt", SAME)]);
    let answer = fetch(&t.l, "/same.txt");
    let before = lines(&tg_log).len();
    let _icp = t.intercept("intercept");
    let chain = nft::Chain::new(&t.l.online, "localfail", "output");
    // The first SYN only: a 44-byte SYN uses up the 50-byte quota's match, the next passes.
    drop_first_syns(&chain, &["ip", "daddr", TARGET], "50");
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("one.pcap");
    diff_capture(&pcap, 1, 45000, &[("/same.txt", answer)]);
    let o = t.copy_offline(
        &rule_8080(),
        &["--timeout", "1", "--input", pcap.to_str().unwrap()],
    );
    let (dropped, rules) = chain.packets();
    assert_eq!(dropped, 1, "the first SYN was not refused: {rules}");
    let r = tlab::transparent_report(&o);
    assert!(u(&r, "transparent.send_errors") >= 1, "{r:#}");
    assert_eq!(u(&r, "sessions.completed"), 1, "{r:#}");
    assert_eq!(u(&r, "sessions.failed.timeout"), 0, "{r:#}");
    assert_all_answered(&r);
    assert_eq!(lines(&tg_log).len(), before + 1, "{r:#}");
}
