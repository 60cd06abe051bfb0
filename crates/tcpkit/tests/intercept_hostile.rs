//! intercept's control port against hostile peers (issue 11), in the transparent lab: peers
//! without the key, copies that never read, connections that never say Hello or stop inside a
//! frame, more connections than the cap or than descriptors. Each time a good copy is still
//! served and intercept never exits.

use crate::copy_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use copy_common::tlab::*;
use copy_common::*;
use serde_json::Value;
use tcpkit_copy::auth::Key;
use tcpkit_copy::control::{Msg, NONCE_LEN, TAG_LEN, VERSION};
use tcpkit_copy::transparent::{handshake, TransparentError};
use tcpkit_lab::Signal;

/// The hello deadline the tests give intercept (its default is 5 s): the tests wait for it
/// to pass, and what it guards is the same at any length.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

fn tlab(tag: &str) -> TLab {
    let mut t = TLab::new(tag);
    t.filter = "src port 8080".into();
    t.intercept_flags = vec![
        "--hello-timeout".into(),
        format!("{}s", HELLO_TIMEOUT.as_secs()),
    ];
    t
}

/// A close `took` after the connection opened came at the hello deadline: not before it (a
/// second of slack for the time between our connect and intercept's accept), and within 4 s
/// past it (deadlines are checked once a second, and the machine may be busy).
fn at_the_hello_deadline(took: Duration) -> bool {
    took + Duration::from_secs(1) >= HELLO_TIMEOUT && took < HELLO_TIMEOUT + Duration::from_secs(4)
}

/// A process's resident set, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The Hello a copy sends, asking for whole payloads (the most intercept can queue).
fn hello() -> Vec<u8> {
    let mut b = Vec::new();
    Msg::Hello {
        version: VERSION,
        max_payload: u16::MAX,
        nonce: Some([0x42; NONCE_LEN]),
    }
    .emit(&mut b);
    b
}

/// The lab's key, as intercept reads it.
fn lab_key(t: &TLab) -> Key {
    Key::from_file(t.key.as_deref().unwrap()).unwrap()
}

/// A control connection that proved `key` (copy's own handshake), asking for whole payloads.
fn authenticated(addr: SocketAddr, key: &Key) -> TcpStream {
    let s = handshake(addr, Duration::from_secs(5), u16::MAX, Some(key)).unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Every frame in `b`, by type name; panics on bytes that are not whole frames.
fn frames(mut b: &[u8]) -> Vec<&'static str> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let (m, n) = Msg::parse(b).unwrap_or_else(|e| panic!("{e}: {b:?}"));
        out.push(match m {
            Msg::Hello { .. } => "hello",
            Msg::Challenge { .. } => "challenge",
            Msg::Proof { .. } => "proof",
            Msg::Welcome { .. } => "welcome",
            Msg::Refuse { .. } => "refuse",
            Msg::Packet { .. } => "packet",
            Msg::Ping => "ping",
        });
        b = &b[n..];
    }
    out
}

/// Reads until intercept closes (or `limit`): every byte, and when the end came.
fn read_to_close(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut b = [0u8; 65536];
    loop {
        let left = limit.saturating_sub(start.elapsed());
        assert!(
            !left.is_zero(),
            "no close within {limit:?} after {} bytes",
            got.len()
        );
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            // A read with SO_RCVTIMEO is never restarted: a signal, or this process stopped
            // and resumed, ends it with EINTR (socket(7)), which is not intercept closing.
            // The suite once failed on it here; the deadline stays the same.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("no close within {limit:?}: {e} after {} bytes", got.len()),
        }
    }
    (got, start.elapsed())
}

/// While a good copy (with the key) copies traffic whose answers flow through intercept,
/// a peer without the key that says Hello asking for whole payloads receives the challenge
/// and nothing more, and is closed when its hello deadline is up; one that answers with a forged proof
/// is refused and closed; one with another key learns that the keys differ and gets nothing.
/// Before, the first read every answer, payload included.
#[test]
fn a_peer_without_the_key_receives_no_answer() {
    let mut t = tlab("icphkey");
    let (_on, on_log) = t.l.nginx(true, Log::Peer);
    let (_tg, tg_log) = t.l.nginx(false, Log::Peer);
    let icp = t.intercept("intercept");
    let addr: SocketAddr = t.intercept_addr().parse().unwrap();
    let c = t.copy(
        &format!("8080-{TARGET}:8080"),
        &["--timeout", "2", "--duration", "6"],
    );
    let clients = t.l.clients.clone();
    let online = t.l.online.clone();
    let (silent, forged, other) = std::thread::scope(|s| {
        let traffic = s.spawn(|| load(&clients, "100", "5", None));
        std::thread::sleep(Duration::from_millis(500));
        let silent = s.spawn(|| {
            online.enter(|| {
                let mut r = TcpStream::connect(addr).unwrap();
                r.write_all(&hello()).unwrap();
                read_to_close(&mut r, Duration::from_secs(10))
            })
        });
        let forged = s.spawn(|| {
            online.enter(|| {
                let mut r = TcpStream::connect(addr).unwrap();
                r.write_all(&hello()).unwrap();
                let mut b = [0u8; 3 + NONCE_LEN + TAG_LEN];
                r.read_exact(&mut b).unwrap();
                let mut p = Vec::new();
                Msg::Proof { tag: [0; TAG_LEN] }.emit(&mut p);
                r.write_all(&p).unwrap();
                let (rest, _) = read_to_close(&mut r, Duration::from_secs(10));
                let mut all = b.to_vec();
                all.extend_from_slice(&rest);
                all
            })
        });
        let wrong = Key::from_bytes(b"another key, 16+ bytes").unwrap();
        let other =
            online.enter(|| handshake(addr, Duration::from_secs(5), u16::MAX, Some(&wrong)));
        traffic.join().unwrap();
        (silent.join().unwrap(), forged.join().unwrap(), other)
    });
    let r = copy_done(c);
    let ir = stop(icp);
    let (silent, took) = silent;
    assert_eq!(frames(&silent), ["challenge"], "{silent:?}");
    assert!(at_the_hello_deadline(took), "{took:?}");
    assert_eq!(frames(&forged), ["challenge", "refuse"]);
    let (Msg::Refuse { reason, .. }, _) = Msg::parse(&forged[3 + NONCE_LEN + TAG_LEN..]).unwrap()
    else {
        unreachable!()
    };
    assert!(reason.starts_with("authentication failed"), "{reason}");
    match other {
        Err(e @ TransparentError::Handshake { .. }) => assert!(
            e.to_string()
                .ends_with("holds another key than this copy's --auth-key-file"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
    // Answers flowed to the good copy meanwhile: there was something to leak.
    let online_n = lines(&on_log).len();
    let target_n = lines(&tg_log).len();
    assert!(online_n > 300, "{online_n}");
    assert!(
        target_n as f64 >= online_n as f64 * 0.99,
        "{target_n} of {online_n}: {r:#}"
    );
    assert!(u(&ir, "sent") > 300, "{ir:#}");
    assert_eq!(u(&ir, "copies_connected"), 1, "{ir:#}");
    assert_eq!(ir["authenticated"], Value::Bool(true), "{ir:#}");
    // The forged proof, and the peer with another key (which closes after the challenge).
    assert_eq!(u(&ir, "copies_auth_failed"), 2, "{ir:#}");
    assert_eq!(u(&ir, "copies_timed_out"), 1, "{ir:#}");
}

/// intercept's JSON report, once stopped by SIGINT, against its committed schema.
fn stop(icp: tcpkit_lab::Proc) -> Value {
    icp.signal(Signal::SIGINT).unwrap();
    icp.wait_timeout(Duration::from_secs(10)).unwrap();
    let ilog = icp.log();
    let (a, b) = (ilog.find('{').unwrap(), ilog.rfind('}').unwrap());
    let ir: Value = serde_json::from_str(&ilog[a..=b]).unwrap_or_else(|e| panic!("{e}: {ilog}"));
    schema::check(&schema::load("intercept"), &ir, "intercept");
    ir
}

/// 150 copies that prove the key, ask for whole payloads and never read, while a good copy replays
/// 64 KiB answers: before, each had up to 8 MiB queued (RSS 72 MB → 1.87 GB in the issue's
/// probe); now the copies that do not read are cut once all queues pass 64 MiB, and
/// intercept's RSS grows by less than 192 MiB, whatever their number (109, 121 and 127 MiB
/// measured; with only the per-copy 8 MiB bound it would be up to 1.2 GB).
#[test]
fn intercept_rss_stays_bounded_with_150_copies_that_never_read() {
    let mut t = tlab("icphrss");
    let body = "x".repeat(64 << 10);
    let (_on, on_log) = t.l.nginx(true, Log::Peer);
    let (_tg, tg_log) = t.l.nginx(false, Log::Peer);
    serve(&t.l, "online", &[("hello.txt", &body)]);
    serve(&t.l, "target", &[("hello.txt", &body)]);
    let icp = t.intercept("intercept");
    let pid = icp.pid();
    let before = rss_kib(pid);
    let addr: SocketAddr = t.intercept_addr().parse().unwrap();
    // Copies with the key (an authenticated copy that stops reading is the case the bounds
    // are for: without the key a peer gets nothing to queue).
    let key = lab_key(&t);
    let rogues: Vec<TcpStream> =
        t.l.online
            .enter(|| (0..150).map(|_| authenticated(addr, &key)).collect());
    // At nice 0, not copy's default 10: what is under test is intercept. Beside the suite's
    // other lab tests (nice 0) a nice-10 copy got a few % of a CPU, its capture fell behind
    // the clients, and a --duration ended it before it had read the last sessions (33 of
    // 583 never seen in a stressed run): the good copy looked unserved though intercept
    // served it. So the copy also runs until its target has had every request, or 10 s.
    let c = t.copy(
        &format!("8080-{TARGET}:8080"),
        &["--timeout", "2", "--nice", "0"],
    );
    let clients = t.l.clients.clone();
    let mut peak = before;
    let sample = |peak: &mut u64| {
        *peak = (*peak).max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::scope(|s| {
        let a = s.spawn(|| load(&clients, "150", "4", None));
        while !a.is_finished() {
            sample(&mut peak);
        }
        a.join().unwrap();
    });
    let online = lines(&on_log).len();
    let end = Instant::now() + Duration::from_secs(10);
    while lines(&tg_log).len() < online && Instant::now() < end {
        sample(&mut peak);
    }
    // SAFETY: kill(2) on our own child's pid.
    let sent = unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(sent, 0);
    let r = copy_done(c);
    peak = peak.max(rss_kib(pid));
    drop(rogues);
    let ir = stop(icp);
    let target = lines(&tg_log).len();
    eprintln!(
        "150 non-reading copies: intercept RSS {before} KiB before, {peak} KiB peak (+{} KiB); \
         {} copies cut, {} answers sent, {} kernel drops; {online} requests online, {target} at \
         the target",
        peak - before,
        u(&ir, "copies_cut_slow"),
        u(&ir, "sent"),
        u(&ir, "kernel_drops"),
    );
    // The rogues were fed enough to matter: more than 64 MiB of answers went out.
    assert!(u(&ir, "sent") > 2000, "{ir:#}");
    assert!(u(&ir, "copies_cut_slow") >= 100, "{ir:#}");
    assert!(
        peak - before < 192 << 10,
        "RSS +{} KiB: {ir:#}",
        peak - before
    );
    // The good copy was served throughout.
    assert!(online > 400, "{online}");
    assert!(
        target as f64 >= online as f64 * 0.99,
        "{target} of {online}: {r:#}\nintercept: {ir:#}"
    );
    assert_eq!(ir["failure"], Value::Null);
}

/// Connections that never say Hello, stop inside a frame whose header declares a long
/// length, or (welcomed, with the key) stop inside a later frame, are closed at --hello-timeout and
/// counted; the welcomed one meanwhile got its pings and nothing else.
#[test]
fn intercept_times_out_a_silent_connection_and_a_partial_frame() {
    let mut t = tlab("icphto");
    let icp = t.intercept("intercept");
    let addr: SocketAddr = t.intercept_addr().parse().unwrap();
    let key = lab_key(&t);
    let (mut silent, mut partial, mut later) = t.l.online.enter(|| {
        let silent = TcpStream::connect(addr).unwrap();
        let mut partial = TcpStream::connect(addr).unwrap();
        // A frame header announcing more than ever comes.
        let h = hello();
        partial.write_all(&h[..h.len() - 1]).unwrap();
        let mut later = authenticated(addr, &key);
        // A Ping's header, then a header announcing 9 bytes of which 2 come.
        later.write_all(&[5, 0, 0, 5, 0, 9, 1, 2]).unwrap();
        (silent, partial, later)
    });
    let start = Instant::now();
    let mut closed = Vec::new();
    for s in [&mut silent, &mut partial, &mut later] {
        closed.push(read_to_close(s, Duration::from_secs(10)).0);
    }
    let took = start.elapsed();
    assert!(at_the_hello_deadline(took), "{took:?}");
    assert!(closed[0].is_empty(), "{:?}", closed[0]);
    // Waiting for the proof of a Hello it never completed: nothing.
    assert!(closed[1].is_empty(), "{:?}", closed[1]);
    // A ping a second until the deadline: as many as its seconds less 2 of slack (3 at the
    // default 5 s), and one at least.
    let later = frames(&closed[2]);
    let pings = (HELLO_TIMEOUT.as_secs() as usize).saturating_sub(2).max(1);
    assert!(
        later.len() >= pings && later.iter().all(|f| *f == "ping"),
        "{later:?}"
    );
    let ir = stop(icp);
    assert_eq!(u(&ir, "copies_timed_out"), 3, "{ir:#}");
    assert_eq!(u(&ir, "copies_connected"), 1, "{ir:#}");
}

/// With its descriptor limit at 96, intercept takes 32 control connections (96 less 64 kept
/// for the capture and the rest): the 33rd is refused with the reason and counted, nothing
/// else happens to the 32; once the silent ones time out, a copy with the key is welcomed.
#[test]
fn intercept_refuses_connections_past_its_cap_with_the_reason() {
    let mut t = tlab("icphcap");
    let mut argv = t.intercept_args();
    argv.splice(0..0, ["prlimit", "--nofile=96:96", "--"].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let assistant = t.assistant.clone();
    let icp = assistant.spawn(&mut t.l.lab, "intercept", &argv).unwrap();
    wait_port(&t.assistant, ASSIST_M, t.port, &icp);
    let addr: SocketAddr = t.intercept_addr().parse().unwrap();
    let key = lab_key(&t);
    // wait_port's probe may still hold its slot: let its deadline pass with the others'.
    let (held, over) = t.l.online.enter(|| {
        let held: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut over = TcpStream::connect(addr).unwrap();
        (held, read_to_close(&mut over, Duration::from_secs(10)))
    });
    let (got, took) = over;
    assert_eq!(frames(&got), ["refuse"], "{got:?}");
    let (Msg::Refuse { reason, .. }, _) = Msg::parse(&got).unwrap() else {
        unreachable!()
    };
    assert_eq!(reason, "intercept has 32 control connections, its cap");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Until intercept has closed every silent one (--hello-timeout each; a fixed sleep was short on
    // a busy machine once): the count from its own side of the sockets, so no probe of ours
    // takes a slot or counts as over the cap.
    let port = t.port.to_string();
    let filter = format!("sport = :{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = t
            .assistant
            .run(&["ss", "-Htn", "state", "established", &filter])
            .expect("ss");
        let open = String::from_utf8_lossy(&o.stdout).lines().count();
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} control connections still open after 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let welcomed =
        t.l.online
            .enter(|| handshake(addr, Duration::from_secs(5), 0, Some(&key)));
    assert!(welcomed.is_ok(), "{welcomed:?}");
    drop(held);
    let ir = stop(icp);
    // 40 held: 32 (or 31 beside the probe) taken, the rest and the 41st over the cap.
    assert!((9..=10).contains(&u(&ir, "connections_over_cap")), "{ir:#}");
    assert_eq!(u(&ir, "copies_connected"), 1, "{ir:#}");
    assert_eq!(ir["failure"], Value::Null, "{ir:#}");
}

/// Opens `n` connections to `addr` without a word (non-blocking connects), holds them for
/// `secs`, then prints how many were established.
const IDLE_CLIENT: &str = r#"
import socket, sys, time, select
addr = (sys.argv[1], int(sys.argv[2])); n = int(sys.argv[3]); secs = float(sys.argv[4])
socks = []
for _ in range(n):
    s = socket.socket(); s.setblocking(False); s.connect_ex(addr); socks.append(s)
time.sleep(secs)
up = 0
for s in socks:
    try:
        s.getpeername(); up += 1
    except OSError:
        pass
print("established", up, flush=True)
time.sleep(1)
"#;

/// 20,000 idle connection attempts (two client processes on the online host; some 3,400 get
/// established, the rest wait on the full backlog) against an intercept
/// whose descriptor limit was lowered to 500 while it runs: accept fails with EMFILE,
/// intercept counts it with the OS error, pauses, goes on, and the copy connected before the
/// flood is served throughout. Before, the run ended with `read /proc/sys/net/ipv4/ip_forward`
/// and no OS error.
#[test]
fn intercept_out_of_descriptors_keeps_serving_the_copy_connected_before() {
    let ir = flood_with_idle_connections("icphfd", Some("--nofile=500:500"));
    assert!(u(&ir, "accept_failures") > 0, "{ir:#}");
    let e = ir["accept_error"].as_str().unwrap();
    assert!(e.contains("os error 24"), "{e}");
}

/// The issue's case as it was met: 20,000 idle connections (two client processes of 10,000)
/// against intercept at its own limits. It takes up to its cap, refuses the rest with the
/// reason, times the silent ones out, and the copy connected before is served throughout;
/// before, intercept ran out of descriptors and exited.
#[test]
fn intercept_keeps_serving_through_20000_idle_connections_at_its_defaults() {
    let ir = flood_with_idle_connections("icphidle", None);
    assert!(u(&ir, "connections_over_cap") > 5_000, "{ir:#}");
}

/// Runs a copy through intercept (its descriptor limit first set by `prlimit` when given),
/// floods intercept's control port with 2 x 10,000 connections that never speak while 100
/// requests/s reach the online nginx for 5 s, and checks what both cases share: most of the
/// flood got through to intercept, the silent ones were timed out, intercept did not fail and
/// the target saw what the online server saw. Returns intercept's report.
fn flood_with_idle_connections(tag: &str, nofile: Option<&str>) -> Value {
    let mut t = tlab(tag);
    // Its default hello deadline, as the issue met it: the flood's length is the load's.
    t.intercept_flags.clear();
    let (_on, on_log) = t.l.nginx(true, Log::Peer);
    let (_tg, tg_log) = t.l.nginx(false, Log::Peer);
    let icp = t.intercept("intercept");
    let c = t.copy(
        &format!("8080-{TARGET}:8080"),
        &["--timeout", "2", "--duration", "9"],
    );
    if let Some(nofile) = nofile {
        let st = std::process::Command::new("prlimit")
            .args(["--pid", &icp.pid().to_string(), nofile])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let port = t.port.to_string();
    let online = t.l.online.clone();
    let flood: Vec<_> = (0..2)
        .map(|i| {
            online
                .spawn(
                    &mut t.l.lab,
                    &format!("idle{i}"),
                    &["python3", "-c", IDLE_CLIENT, ASSIST_M, &port, "10000", "6"],
                )
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let clients = t.l.clients.clone();
    load(&clients, "100", "5", None);
    let mut established = 0;
    for p in &flood {
        p.wait_timeout(Duration::from_secs(30)).unwrap();
        let log = p.log();
        let n: u64 = log
            .lines()
            .find_map(|l| l.strip_prefix("established "))
            .unwrap_or_else(|| panic!("{log}"))
            .trim()
            .parse()
            .unwrap();
        established += n;
    }
    let r = copy_done(c);
    let ir = stop(icp);
    let online_n = lines(&on_log).len();
    let target_n = lines(&tg_log).len();
    eprintln!(
        "{established} idle connections established; intercept: {} accept failures ({}), \
         {} over its cap, {} timed out; {online_n} requests online, {target_n} at the target",
        u(&ir, "accept_failures"),
        ir["accept_error"],
        u(&ir, "connections_over_cap"),
        u(&ir, "copies_timed_out"),
    );
    assert!(established >= 1000, "{established}");
    assert!(u(&ir, "copies_timed_out") > 100, "{ir:#}");
    assert_eq!(ir["failure"], Value::Null, "{ir:#}");
    assert!(online_n > 300, "{online_n}");
    assert!(
        target_n as f64 >= online_n as f64 * 0.99,
        "{target_n} of {online_n}: {r:#}"
    );
    ir
}

/// With --allow leaving the online host's management address out, a client that says Hello
/// from there is closed without a single byte (not even a refusal) and counted; intercept
/// warns at start that copies are not authenticated.
#[test]
fn intercept_allow_closes_a_peer_outside_it_without_a_word() {
    let mut t = tlab("icphallow");
    t.key = None;
    // Only the (unused) documentation prefix is allowed.
    let mut argv = t.intercept_args();
    argv.extend(["--allow".to_string(), "192.0.2.0/24".to_string()]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let assistant = t.assistant.clone();
    let icp = assistant.spawn(&mut t.l.lab, "intercept", &argv).unwrap();
    wait_port(&t.assistant, ASSIST_M, t.port, &icp);
    let addr: SocketAddr = t.intercept_addr().parse().unwrap();
    let got = t.l.online.enter(|| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The peer may see a reset for the Hello it sends after the close.
        let _ = s.write_all(&hello());
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    });
    assert!(got.is_empty(), "{got:?}");
    let log = icp.log();
    assert!(
        log.contains("WARNING: copies are not authenticated")
            && log.contains("--allow 192.0.2.0/24"),
        "{log}"
    );
    let ir = stop(icp);
    // wait_port's probe and the rogue.
    assert!(u(&ir, "connections_not_allowed") >= 1, "{ir:#}");
    assert_eq!(u(&ir, "copies_connected"), 0, "{ir:#}");
}
