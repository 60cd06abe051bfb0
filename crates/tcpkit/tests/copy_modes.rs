//! What `tcpkit copy` does whatever its transport: each body runs once in relay mode and once
//! in transparent mode (with intercept), in the copy lab of copy_common (clients → online →
//! target, plus the assistant for transparent mode), against real nginx and redis-server.

mod copy_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

use copy_common::modes::{Mode, ModeLab};
use copy_common::*;
use serde_json::Value;

const GET: &[u8] = b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n";

/// The failure counters of a report, by cause.
fn failed(r: &Value) -> [u64; 6] {
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

/// `-n 3`: every session copied three times over connections of its own (distinct ports at
/// the target), each copy completed; `--stats` lines on stderr, the JSON alone on stdout.
fn n3_copies_each_session_three_times(mode: Mode, tag: &str) {
    let mut m = ModeLab::new(tag, mode, 8080);
    let (_on, on_log) = m.l_mut().nginx(true, Log::Peer);
    let (_tg, tg_log) = m.l_mut().nginx(false, Log::Peer);
    let rule = format!("8080-{TARGET}:8080");
    let c = m.copy(
        &rule,
        &[
            "--timeout",
            "2",
            "-n",
            "3",
            "--duration",
            "2.5",
            "--stats",
            "0.5",
        ],
    );
    m.l().http_get("2", "100", "1.5", Some("1"));
    let o = wait_limited(c, Duration::from_secs(20));
    let r = m.report(&o);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let stats: Vec<&str> = err.lines().filter(|l| l.starts_with('[')).collect();
    assert!(
        stats.len() >= 3
            && stats
                .iter()
                .all(|s| s.contains("s] sessions") && s.contains("requests") && s.contains("loss")),
        "{stats:?}"
    );
    let (online, target) = (lines(&on_log), lines(&tg_log));
    eprintln!(
        "{mode:?} -n 3: online {} target {}",
        online.len(),
        target.len()
    );
    assert!(online.len() >= 100, "{}", online.len());
    assert_eq!(target.len(), 3 * online.len(), "{r:#}");
    assert!(
        target
            .iter()
            .all(|l| l.starts_with(&format!("{} ", m.seen_from()))),
        "{target:?}"
    );
    let mut ports: Vec<&str> = target
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), target.len(), "{r:#}");
    assert_eq!(u(&r, "sessions.copies"), 3 * u(&r, "sessions.selected"));
    assert_all_completed(&r);
}

#[test]
fn relay_n3_copies_each_session_three_times_on_distinct_ports() {
    n3_copies_each_session_three_times(Mode::Relay, "cpn3");
}

#[test]
fn transparent_n3_copies_each_session_three_times_on_distinct_ports() {
    n3_copies_each_session_three_times(Mode::Transparent, "cptrn3");
}

/// redis-benchmark SETs of random keys: the target ends with exactly the online server's
/// keys, and nothing from beyond the online host reaches the clients' link.
fn redis_set_workload_leaves_the_same_keys(mode: Mode, tag: &str) {
    let mut m = ModeLab::new(tag, mode, 6379);
    let _on = m.l_mut().redis(true);
    let _tg = m.l_mut().redis(false);
    let l = m.l_mut();
    let ifname = l.cli_link.a.name.clone();
    let clients = l.clients.clone();
    let dump = l.lab.tcpdump(&clients, &ifname, "").expect("tcpdump");
    let rule = format!("6379-{TARGET}:6379");
    let c = m.copy(&rule, &["--timeout", "2", "--duration", "4"]);
    let o = m.l().client(&[
        "redis-benchmark",
        "-h",
        ONLINE,
        "-p",
        "6379",
        "-t",
        "set",
        "-r",
        "20000",
        "-n",
        "6000",
        "-c",
        "5",
        "-q",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = m.done(c);
    let cap = dump.stop().expect("tcpdump");
    let on = redis_keys(&m.l().online, ONLINE);
    let tg = redis_keys(&m.l().target, TARGET);
    eprintln!(
        "{mode:?} redis: {} keys online, {} on the target; {} requests copied, {} answered",
        on.len(),
        tg.len(),
        u(&r, "requests.copied"),
        u(&r, "requests.answered")
    );
    assert!(on.len() > 4000, "{} keys online", on.len());
    let missing: Vec<&String> = on.iter().filter(|k| tg.binary_search(k).is_err()).collect();
    assert!(
        missing.is_empty() && on.len() == tg.len(),
        "{} keys online, {} on the target, missing {:?}: {r:#}",
        on.len(),
        tg.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(u(&r, "requests.copied") >= 6000, "{r:#}");
    assert_all_completed(&r);
    let text = cap.text().expect("tcpdump -r");
    assert!(text.len() > 1000, "{} packets", text.len());
    for l in &text {
        for bad in m.beyond_online() {
            assert!(!l.contains(&format!(" {bad}.")), "{l}");
        }
    }
}

#[test]
fn relay_redis_set_workload_leaves_the_same_keys_on_the_target() {
    redis_set_workload_leaves_the_same_keys(Mode::Relay, "cpredis");
}

#[test]
fn transparent_redis_set_workload_leaves_the_same_keys_on_the_target() {
    redis_set_workload_leaves_the_same_keys(Mode::Transparent, "cptrrds");
}

/// One GET on a keep-alive connection to the online nginx, its answer read whole.
fn get(c: &mut TcpStream) {
    c.write_all(GET).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !got.ends_with(b"hello from the lab\n") {
        let n = c.read(&mut b).unwrap();
        assert!(n > 0, "nginx closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    }
}

/// Keep-alive connections from the clients host to the online nginx.
fn connect(m: &ModeLab, n: usize) -> Vec<TcpStream> {
    let online: SocketAddr = format!("{ONLINE}:8080").parse().unwrap();
    (0..n)
        .map(|_| m.l().clients.enter(|| TcpStream::connect(online)).unwrap())
        .collect()
}

/// Connections open (one request answered) before the copy starts are joined at a request
/// boundary: the first request each sends under the copy comes before any server turn the
/// copy saw (where a request ends is not known yet) and is skipped, the next four are copied.
/// In transparent mode each copy gets a handshake of its own from the client's address and
/// port. With --only-full the same kind of connections are left alone while a new one is
/// copied.
fn sessions_open_before_the_copy_are_joined(mode: Mode, tag: &str) {
    let mut m = ModeLab::new(tag, mode, 8080);
    let (_on, _) = m.l_mut().nginx(true, Log::Peer);
    let (_tg, tg_log) = m.l_mut().nginx(false, Log::Peer);
    let rule = format!("8080-{TARGET}:8080");
    let mut conns = connect(&m, 2);
    conns.iter_mut().for_each(get);
    let c = m.copy(&rule, &["--timeout", "2", "--duration", "1.5"]);
    for _ in 0..5 {
        conns.iter_mut().for_each(get);
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(conns);
    let r = m.done(c);
    assert_eq!(u(&r, "sessions.joined_mid_stream"), 2, "{r:#}");
    if mode == Mode::Transparent {
        assert_eq!(u(&r, "transparent.synthesized_handshakes"), 2, "{r:#}");
    }
    assert_eq!(u(&r, "sessions.completed"), 2, "{r:#}");
    assert_eq!(
        u(&r, "requests.bytes_skipped_joining"),
        2 * GET.len() as u64,
        "{r:#}"
    );
    assert_eq!(u(&r, "requests.copied"), 8, "{r:#}");
    assert_all_answered(&r);
    let target = lines(&tg_log);
    assert_eq!(target.len(), 8, "{target:#?}");
    assert!(target.iter().all(|l| l.contains(" 200 ")), "{target:#?}");
    // --only-full: two connections open before the copy, one opened under it.
    let mut old = connect(&m, 2);
    old.iter_mut().for_each(get);
    let c = m.copy(
        &rule,
        &["--timeout", "2", "--duration", "1.5", "--only-full"],
    );
    let mut new = connect(&m, 1);
    for _ in 0..3 {
        old.iter_mut().chain(new.iter_mut()).for_each(get);
    }
    drop((old, new));
    let r = m.done(c);
    assert_eq!(u(&r, "sessions.seen"), 1, "{r:#}");
    assert_eq!(u(&r, "sessions.completed"), 1, "{r:#}");
    assert_eq!(u(&r, "sessions.joined_mid_stream"), 0, "{r:#}");
    assert_eq!(lines(&tg_log).len(), 8 + 3);
}

#[test]
fn relay_sessions_open_before_the_copy_are_joined_at_a_request_boundary_and_only_full_skips_them() {
    sessions_open_before_the_copy_are_joined(Mode::Relay, "cpjoin");
}

#[test]
fn transparent_sessions_open_before_the_copy_get_a_synthesized_handshake_and_only_full_skips_them()
{
    sessions_open_before_the_copy_are_joined(Mode::Transparent, "cptfjoin");
}

/// `-r 50`: the sessions the sampler picks (by client and server address) are copied whole,
/// the others not at all, and the target sees each under the client's own address: in
/// transparent mode as the packets' source, in relay mode through `--proxy-protocol`.
fn sampling_copies_whole_sessions_or_none(mode: Mode, tag: &str) {
    let mut m = ModeLab::new(tag, mode, 8080);
    let (_on, on_log) = m.l_mut().nginx(true, Log::Peer);
    let (tg_logged, mut args) = match mode {
        Mode::Relay => (Log::ProxyProtocol, vec!["--proxy-protocol"]),
        Mode::Transparent => (Log::Peer, vec![]),
    };
    let (_tg, tg_log) = m.l_mut().nginx(false, tg_logged);
    let rule = format!("8080-{TARGET}:8080");
    args.extend(["--timeout", "2", "-r", "50", "--duration", "3"]);
    let c = m.copy(&rule, &args);
    // 40 connections of several requests each (2 loads of 2, reconnecting every 5 requests).
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| m.l().http_get("2", "100", "2", Some("5")));
        }
    });
    let r = m.done(c);
    // Per client port: requests online, requests at the target.
    let per_port = |log: &[String]| {
        let mut by = std::collections::BTreeMap::<u16, usize>::new();
        for l in log {
            let mut f = l.split(' ');
            assert_eq!(f.next().unwrap(), CLIENT, "{l}");
            *by.entry(f.next().unwrap().parse().unwrap()).or_default() += 1;
        }
        by
    };
    let on = per_port(&lines(&on_log));
    let tg = per_port(&lines(&tg_log));
    let server: SocketAddr = format!("{ONLINE}:8080").parse().unwrap();
    let sampler = tcpkit_copy::sample::Sampler {
        percent: 50.0,
        ramp_ns: 0,
    };
    let mut copied = 0;
    for (port, n) in &on {
        let client = SocketAddr::new(CLIENT.parse().unwrap(), *port);
        let want = sampler.selects(client, server, 0);
        assert_eq!(
            tg.get(port).copied().unwrap_or(0),
            if want { *n } else { 0 },
            "port {port}"
        );
        copied += usize::from(want);
    }
    eprintln!("{mode:?} -r 50: {copied} of {} sessions copied", on.len());
    assert_eq!(r["sample_percent"].as_f64(), Some(50.0), "{r:#}");
    assert!(on.len() >= 30, "{} client connections", on.len());
    assert!(
        copied >= 6 && on.len() - copied >= 6,
        "{copied} of {}",
        on.len()
    );
    // The report counts sessions, the logs connections that made a request (load may open
    // one at the end that never sends; a client port can also be reused).
    let (sel, out) = (u(&r, "sessions.selected"), u(&r, "sessions.sampled_out"));
    assert!(sel >= copied as u64 && sel <= copied as u64 + 2, "{r:#}");
    assert!(
        out >= (on.len() - copied) as u64 && out <= (on.len() - copied) as u64 + 2,
        "{r:#}"
    );
    assert_all_completed(&r);
}

#[test]
fn relay_sampling_copies_whole_sessions_and_proxy_protocol_carries_the_client() {
    sampling_copies_whole_sessions_or_none(Mode::Relay, "cpsample");
}

#[test]
fn transparent_sampling_copies_whole_sessions_or_none() {
    sampling_copies_whole_sessions_or_none(Mode::Transparent, "cptfsample");
}

/// A target that never answers: waiting for answers, each copy sends its first request and
/// times out; with --no-wait every request goes as captured and the copies end normally.
/// Both runs fail by their own figures (nothing answered), each with its reason.
fn no_wait_sends_every_request_to_a_target_that_never_answers(mode: Mode, tag: &str) {
    let m = ModeLab::new(tag, mode, 9003);
    let got = fault_server(&m.l().target, &format!("{TARGET}:9003"), Fault::Silent);
    let p = m.l().dir.path().join("s.pcap");
    synth_pcap(&p, 2, 3, 100, None);
    let p = p.to_str().unwrap();
    let rule = format!("8080-{TARGET}:9003");
    let r = m.report_failed(
        &m.copy_offline(&rule, &["--input", p, "--timeout", "0.5"]),
        "the target answered none of the 6 requests seen (2 of 2 copies failed: 2 timeout)",
    );
    assert_eq!(failed(&r), [0, 0, 2, 0, 0, 0], "{r:#}");
    assert_eq!(u(&r, "requests.at_source"), 6, "{r:#}");
    assert_eq!(u(&r, "requests.copied"), 2, "{r:#}");
    assert_eq!(u(&r, "requests.answered"), 0, "{r:#}");
    assert_eq!(r["requests"]["loss_ratio_percent"].as_f64(), Some(100.0));
    // Original latency from the capture: 200 µs + the request's own span.
    assert_eq!(u(&r, "latency.original.count"), 6, "{r:#}");
    assert!(
        (200_000..260_000).contains(&u(&r, "latency.original.p50_ns")),
        "{r:#}"
    );
    // The silent server counts bytes; give the last ones time to land.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(got.load(Ordering::Relaxed), 200);
    let r = m.report_failed(
        &m.copy_offline(&rule, &["--input", p, "--timeout", "0.5", "--no-wait"]),
        "the target answered none of the 6 requests seen (0 of 2 copies failed)",
    );
    assert_eq!(u(&r, "requests.copied"), 6, "{r:#}");
    assert_eq!(u(&r, "sessions.completed"), 2, "{r:#}");
    assert_eq!(u(&r, "requests.answered"), 0, "{r:#}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(got.load(Ordering::Relaxed), 200 + 600);
}

#[test]
fn relay_no_wait_sends_every_request_to_a_target_that_never_answers() {
    no_wait_sends_every_request_to_a_target_that_never_answers(Mode::Relay, "cpsilent");
}

#[test]
fn transparent_no_wait_sends_every_request_to_a_target_that_never_answers() {
    no_wait_sends_every_request_to_a_target_that_never_answers(Mode::Transparent, "cptfnowait");
}

/// Requests of 1 MB piling up behind a target that never answers, --max-memory 2M: copies
/// are shed and counted, the others time out and nothing else, the bytes held never pass the
/// limit, and the copy runs to its end (failing by its own figures: nothing answered).
fn memory_over_the_limit_sheds_copies(mode: Mode, tag: &str) {
    let m = ModeLab::new(tag, mode, 9003);
    let _got = fault_server(&m.l().target, &format!("{TARGET}:9003"), Fault::Silent);
    let p = m.l().dir.path().join("big.pcap");
    synth_pcap(&p, 6, 3, 1 << 20, None);
    let rule = format!("8080-{TARGET}:9003");
    let r = m.report_failed(
        &m.copy_offline(
            &rule,
            &[
                "--input",
                p.to_str().unwrap(),
                "--max-memory",
                "2M",
                "--timeout",
                "1",
            ],
        ),
        "the target answered none of the",
    );
    let shed = u(&r, "sessions.failed.shed");
    assert!(shed >= 3, "{r:#}");
    assert_eq!(failed(&r), [0, 0, 6 - shed, 0, 0, shed], "{r:#}");
    assert!(u(&r, "memory.peak_held_bytes") <= 2 << 20, "{r:#}");
    assert_eq!(u(&r, "memory.limit_bytes"), 2 << 20);
}

#[test]
fn relay_memory_over_the_limit_sheds_sessions_and_keeps_going() {
    memory_over_the_limit_sheds_copies(Mode::Relay, "cpshed");
}

#[test]
fn transparent_memory_over_the_limit_sheds_copies_and_keeps_going() {
    memory_over_the_limit_sheds_copies(Mode::Transparent, "cptfshed");
}

/// The target down at start (its SYNs reset), then up under keep-alive sessions, down under
/// them, and back: the refused copies are counted, the back-off sends one probe per step
/// rather than a SYN per session, the copies cut by the target's exit are counted under
/// their cause, and once it is back the last phase's sessions go through. Most requests were
/// lost, so the run fails by --max-loss.
fn target_down_at_start_and_mid_run(mode: Mode, tag: &str) {
    let mut m = ModeLab::new(tag, mode, 8080);
    let (_on, _) = m.l_mut().nginx(true, Log::Peer);
    let rule = format!("8080-{TARGET}:8080");
    let c = m.copy(&rule, &["--timeout", "1", "--duration", "6"]);
    // Down at start: 50 sessions of one request each, while the SYNs toward it are counted.
    let l = m.l_mut();
    let (online, tif) = (l.online.clone(), l.tgt_link.a.name.clone());
    let dump = l.lab.tcpdump(&online, &tif, "tcp").expect("tcpdump");
    let one_per_conn = [
        "--http-get",
        "/hello.txt",
        "-r",
        "50",
        "-t",
        "1",
        "--queries-per-conn",
        "1",
    ];
    l.load(8080, &one_per_conn);
    std::thread::sleep(Duration::from_millis(1200));
    let syns = syns_to(&dump.stop().expect("tcpdump").path, TARGET);
    // Comes up: keep-alive sessions; goes down under them; comes back.
    let (tg, tg_log) = l.nginx(false, Log::Peer);
    std::thread::scope(|s| {
        let load = s.spawn(|| m.l().http_get("2", "100", "1", None));
        std::thread::sleep(Duration::from_millis(500));
        tg.stop().expect("stop nginx");
        load.join().unwrap();
    });
    let before = lines(&tg_log).len();
    let (_tg2, _) = m.l_mut().nginx(false, Log::Peer);
    m.l().load(8080, &one_per_conn);
    let r = m.report_failed(
        &wait_limited(c, Duration::from_secs(20)),
        "is above --max-loss 1 %",
    );
    let [refused, reset, timeout, closed_early, lost, shed] = failed(&r);
    eprintln!("{mode:?}: {syns} SYNs while down; {}", r["sessions"]);
    assert!(refused >= 40, "{r:#}");
    // One probe per back-off step, not one SYN per session (50 without the back-off).
    assert!(
        syns < 25,
        "{syns} SYNs toward the target while it was down: {r:#}"
    );
    // The copies that waited past their --timeout for a probe's verdict, never sent.
    assert!(u(&r, "sessions.skipped_in_backoff") >= 20, "{r:#}");
    // The keep-alive copies cut by nginx's exit.
    assert!(reset + closed_early + timeout >= 1, "{r:#}");
    assert_eq!(lost + shed, 0, "{r:#}");
    // Back up: the last phase's sessions went through.
    assert!(u(&r, "sessions.completed") >= 30, "{r:#}");
    let after = lines(&tg_log).len();
    assert!(after >= before + 30, "{before} then {after}: {r:#}");
}

#[test]
fn relay_target_down_at_start_and_mid_run_is_counted_without_a_syn_storm_and_recovers() {
    target_down_at_start_and_mid_run(Mode::Relay, "cpdown");
}

#[test]
fn transparent_target_down_at_start_and_mid_run_is_counted_and_copying_resumes() {
    target_down_at_start_and_mid_run(Mode::Transparent, "cptfdown");
}

/// A target that answers nothing (every segment to it dropped, as by a firewall) is judged
/// silent once a SYN has gone unanswered for a while; from then on one probe at a time tries
/// and the other copies stand back, so the target gets about one SYN per session of that
/// first second and the probes, not every session's SYN and its retransmissions (>= 600);
/// the copies time out (silent is not refused), and once the target answers again copying
/// goes on.
fn a_silent_target_gets_probes_not_a_syn_storm(mode: Mode, tag: &str) {
    let mut m = ModeLab::new(tag, mode, 8080);
    let (_on, _) = m.l_mut().nginx(true, Log::Peer);
    let (_tg, tg_log) = m.l_mut().nginx(false, Log::Peer);
    nft::drop_tcp_to(&m.l().target, 8080);
    let rule = format!("8080-{TARGET}:8080");
    let c = m.copy(&rule, &["--timeout", "2.5", "--duration", "8"]);
    // Each copy waits up to 2.5 s for the target.
    let (syns, before) = silent_then_back(m.l_mut(), &tg_log, Duration::from_millis(2700));
    let r = m.report_failed(
        &wait_limited(c, Duration::from_secs(20)),
        "is above --max-loss 1 %",
    );
    eprintln!("{mode:?}: {syns} SYNs toward the silent target");
    assert_eq!(u(&r, "sessions.failed.lost_capture_data"), 0, "{r:#}");
    assert_held_back(&r, syns, 140, &tg_log, before);
}

#[test]
fn relay_silent_target_gets_probes_not_a_syn_storm_and_recovers() {
    a_silent_target_gets_probes_not_a_syn_storm(Mode::Relay, "cpsilnt");
}

#[test]
fn transparent_silent_target_gets_probes_not_every_sessions_retransmissions() {
    a_silent_target_gets_probes_not_a_syn_storm(Mode::Transparent, "cptfsil");
}
