//! Several `tcpkit copy --transparent` feeding one target and one intercept: the transparent
//! lab with a second online host ([`TLab::add_online`]), each online host with its own nginx
//! and its own clients, both copies sending to the same target nginx and both connected to
//! the same intercept, which sends every answer to both.

use crate::copy_common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use copy_common::tlab::*;
use copy_common::*;
use serde_json::Value;
use tcpkit_lab::{Host, Signal};
use tcpkit_wire::tcp::{Flags, Segment};

/// The transparent lab with intercept catching every answer from 8080, and a second online
/// host whose clients have address `client2`.
fn two_online(tag: &str, client2: &str) -> (TLab, Online) {
    let mut t = TLab::new(tag);
    t.filter = "src port 8080".into();
    let o = t.add_online(client2);
    (t, o)
}

/// The target's access-log lines (`addr port status request`) from `addr`.
fn from<'a>(log: &'a [String], addr: &str) -> Vec<&'a String> {
    log.iter()
        .filter(|l| l.split_whitespace().next() == Some(addr))
        .collect()
}

/// The failures of a copy report, all causes summed, control_lost among them.
fn failures(r: &Value) -> u64 {
    failed(r).iter().sum::<u64>() + u(r, "transparent.control_lost")
}

#[test]
fn two_online_hosts_feed_one_target_and_one_intercept_each_copy_counting_its_own_sessions() {
    let start = Instant::now();
    let (mut t, o) = two_online("cptrmul", CLIENT2);
    let (on1_log, tg_log) = t.l.nginx_pair();
    let (_on2, on2_log) = t.nginx_on(&o, Log::Peer);
    let icp = t.intercept("intercept");
    let c1 = t.copy(&rule_8080(), &["--timeout", "2", "--duration", "3"]);
    let c2 = t.copy_on(&o, &rule_8080(), &["--timeout", "2", "--duration", "3"]);
    let (cli1, cli2) = (t.l.clients.clone(), o.clients.clone());
    // Keep-alive sessions and a new connection per request on both online hosts at once.
    // The connections each host's loads made: the sessions its copy sees.
    let conns = |h: &Host, server: &str, rate: &str, per_conn: Option<&str>| {
        let o = load_to(h, server, rate, "2", per_conn, &["--json"]);
        u(&json(&o), "connections.established")
    };
    let (sessions1, sessions2) = std::thread::scope(|s| {
        let loads = [
            s.spawn(|| conns(&cli1, ONLINE, "150", None)),
            s.spawn(|| conns(&cli1, ONLINE, "50", Some("1"))),
            s.spawn(|| conns(&cli2, ONLINE2, "150", None)),
            s.spawn(|| conns(&cli2, ONLINE2, "50", Some("1"))),
        ]
        .map(|l| l.join().unwrap());
        (loads[0] + loads[1], loads[2] + loads[3])
    });
    let r1 = copy_done(c1);
    let r2 = copy_done(c2);
    stop_intercept(&icp, Signal::SIGINT);
    let ir = intercept_report(&icp);
    let (online1, online2, target) = (lines(&on1_log), lines(&on2_log), lines(&tg_log));
    eprintln!(
        "two online hosts: {} + {} requests online, {} at the target; answers {} caught, {} + {} received; {:.1} s",
        online1.len(),
        online2.len(),
        target.len(),
        u(&ir, "answers"),
        u(&r1, "transparent.answers_received"),
        u(&r2, "transparent.answers_received"),
        start.elapsed().as_secs_f64()
    );
    assert!(
        online1.len() >= 300 && online2.len() >= 300,
        "{r1:#} {r2:#}"
    );
    // Every request of both online hosts reached the one target, each from its own clients.
    assert_eq!(target.len(), online1.len() + online2.len(), "{r1:#} {r2:#}");
    assert_eq!(from(&target, CLIENT).len(), online1.len(), "{r1:#}");
    assert_eq!(from(&target, CLIENT2).len(), online2.len(), "{r2:#}");
    assert!(target.iter().all(|l| l.contains(" 200 ")), "{target:?}");
    // Each copy counted its own sessions, none of the other's: one per connection its own
    // clients made. Every copy of each completed, every request turn answered: the other
    // copy's answers, which intercept sent to it as well, disturbed none of them. (Request
    // turns, not requests: the load sends on schedule, so a late answer makes two requests
    // one turn.)
    for (r, online, sessions) in [(&r1, &online1, sessions1), (&r2, &online2, sessions2)] {
        assert_eq!(u(r, "sessions.seen"), sessions, "{r:#}");
        assert_eq!(
            u(r, "requests.answered"),
            u(r, "requests.at_source"),
            "{r:#}"
        );
        assert!(u(r, "requests.at_source") <= online.len() as u64, "{r:#}");
        assert_eq!(u(r, "sessions.completed"), u(r, "sessions.copies"), "{r:#}");
        assert_eq!(failures(r), 0, "{r:#}");
        assert_eq!(u(r, "transparent.tuple_in_use"), 0, "{r:#}");
        // Both received the answers of both: well over their own half.
        assert!(
            u(r, "transparent.answers_received") * 4 > u(&ir, "answers") * 3,
            "{r:#} {ir:#}"
        );
    }
    // intercept served two copies, sending each answer to both.
    assert_eq!(u(&ir, "copies_connected"), 2, "{ir:#}");
    assert_eq!(u(&ir, "dropped_slow_copy"), 0, "{ir:#}");
    assert!(u(&ir, "sent") > u(&ir, "answers") * 3 / 2, "{ir:#}");
    assert_eq!(ir["failure"], Value::Null);
}

/// An HTTP/1.1 keep-alive session from `client`:`port` in `host` to `server`:8080: `gets`
/// GETs of /hello.txt, each answer read whole, `gap` between them; then closed.
fn session_from_port(
    host: &Host,
    client: &str,
    port: u16,
    server: &str,
    gets: usize,
    gap: Duration,
) {
    let local: SocketAddr = format!("{client}:{port}").parse().unwrap();
    let remote: SocketAddr = format!("{server}:8080").parse().unwrap();
    let mut s = host.enter(|| connect_from(local, remote));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for k in 0..gets {
        if k > 0 {
            std::thread::sleep(gap);
        }
        s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: lab\r\n\r\n")
            .unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        while !got.ends_with(b"hello from the lab\n") {
            let n = copy_common::sock::read_some(&mut s, &mut b).unwrap();
            assert!(n > 0, "{server} closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&b[..n]);
        }
    }
}

/// A TCP connection from exactly `local` (its port chosen, as a load balancer or a NAT does)
/// to `remote`.
fn connect_from(local: SocketAddr, remote: SocketAddr) -> TcpStream {
    let sa = |a: SocketAddr| {
        let SocketAddr::V4(a) = a else {
            panic!("IPv4 only: {a}")
        };
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            },
            sin_zero: [0; 8],
        }
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket(2) with constant arguments; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just returned by socket(2) and nothing else owns it.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let (l, r) = (sa(local), sa(remote));
    // SAFETY: l and r outlive the calls; len is their size.
    let rc = unsafe { libc::bind(fd, (&l as *const libc::sockaddr_in).cast(), len) };
    assert_eq!(rc, 0, "bind {local}: {}", std::io::Error::last_os_error());
    // SAFETY: as above.
    let rc = unsafe { libc::connect(fd, (&r as *const libc::sockaddr_in).cast(), len) };
    assert_eq!(
        rc,
        0,
        "connect {remote}: {}",
        std::io::Error::last_os_error()
    );
    s
}

/// The TCP segments in the capture file `path` (a tcpdump's), as (source, flags).
fn segments(path: &Path) -> Vec<(SocketAddr, Flags)> {
    let f = tcpkit_pcap::CaptureFile::open(path).unwrap();
    f.packets()
        .filter_map(|p| {
            Segment::parse(p.unwrap().data)
                .ok()
                .map(|s| (s.src, s.flags))
        })
        .collect()
}

/// Issue: "several copy processes on several online hosts can feed one target and one
/// intercept", when both online hosts see the same client address and port.
#[test]
fn copies_colliding_on_a_tuple_move_the_later_one_to_a_pool_port_without_disturbing_the_other() {
    let (mut t, o) = two_online("cptrcol", CLIENT);
    let (on1_log, tg_log) = t.l.nginx_pair();
    let (_on2, on2_log) = t.nginx_on(&o, Log::Peer);
    let icp = t.intercept("intercept");
    // What reaches the target from each copy.
    let target = t.l.target.clone();
    let in1 = t.l.tgt_link.b.name.clone();
    let in2 = o.tgt_link.b.name.clone();
    let d1 = t.l.lab.tcpdump(&target, &in1, "tcp").expect("tcpdump");
    let d2 = t.l.lab.tcpdump(&target, &in2, "tcp").expect("tcpdump");
    let c1 = t.copy(&rule_8080(), &["--timeout", "2", "--duration", "6.5"]);
    let c2 = t.copy_on(&o, &rule_8080(), &["--timeout", "2", "--duration", "6.5"]);
    let (cli1, cli2) = (t.l.clients.clone(), o.clients.clone());
    // Both clients hosts are CLIENT, each with its own online host: a session from port p
    // on one, and 250 ms later (the first copied and established on the target) a session
    // from the same port on the other. Both copies play CLIENT:p toward TARGET:8080.
    // The first session outlasts the copies' --timeout (2 s), so the second copy cannot just
    // retransmit its SYN until the tuple is free; its second request comes after the second
    // session is over and after the second copy's SYN would have timed out: that request
    // answered shows the first copy's connection undisturbed.
    let pair = |first: (&Host, &str), second: (&Host, &str), p: u16| {
        std::thread::scope(|s| {
            let a = s.spawn(|| {
                session_from_port(first.0, CLIENT, p, first.1, 2, Duration::from_millis(2500));
            });
            std::thread::sleep(Duration::from_millis(250));
            session_from_port(second.0, CLIENT, p, second.1, 2, Duration::from_millis(200));
            a.join().unwrap();
        });
    };
    let (p1, p2) = (45_001, 45_002);
    // Copy 2's session collides with copy 1's on CLIENT:p1, then the other way round on
    // CLIENT:p2, once the first pair's copies are closed.
    pair((&cli1, ONLINE), (&cli2, ONLINE2), p1);
    std::thread::sleep(Duration::from_millis(300));
    pair((&cli2, ONLINE2), (&cli1, ONLINE), p2);
    let r1 = copy_done(c1);
    let r2 = copy_done(c2);
    stop_intercept(&icp, Signal::SIGINT);
    let ir = intercept_report(&icp);
    let (seg1, seg2) = (
        segments(&d1.stop().expect("tcpdump").path),
        segments(&d2.stop().expect("tcpdump").path),
    );
    let (online1, online2, tgt) = (lines(&on1_log), lines(&on2_log), lines(&tg_log));
    let rsts: Vec<_> = seg1
        .iter()
        .chain(&seg2)
        .filter(|(_, fl)| fl.has(Flags::RST))
        .collect();
    eprintln!(
        "collisions: target {tgt:?}\nRSTs to the target {rsts:?}\n{}\n{}\n{}\n{}",
        r1["sessions"], r1["transparent"], r2["sessions"], r2["transparent"]
    );
    assert_eq!(
        (online1.len(), online2.len()),
        (4, 4),
        "{online1:?} {online2:?}"
    );
    // The collisions were real: each copy sent its SYN for the tuple the other held.
    let syn = |segs: &[(SocketAddr, Flags)], p: u16| {
        segs.iter()
            .filter(|(src, fl)| src.port() == p && fl.has(Flags::SYN) && !fl.has(Flags::ACK))
            .count()
    };
    assert!(
        syn(&seg2, p1) >= 1 && syn(&seg1, p2) >= 1,
        "no collision made"
    );
    // Every request of both reached the target: the first session of each pair on the
    // client's own port, the later one on a port of its copy's pool.
    assert_eq!(tgt.len(), 8, "{tgt:?}");
    let port = |l: &String| l.split_whitespace().nth(1).unwrap().parse::<u16>().unwrap();
    let mut ports: Vec<u16> = tgt.iter().map(port).collect();
    ports.sort_unstable();
    assert_eq!(&ports[4..], [p1, p1, p2, p2], "{tgt:?}");
    // Each copy's pool hands out its first port first.
    let first = tcpkit_copy::transparent::DEFAULT_PORT_POOL.0;
    assert_eq!(&ports[..4], [first; 4], "{tgt:?}");
    assert!(tgt
        .iter()
        .all(|l| l.starts_with(&format!("{CLIENT} ")) && l.contains(" 200 ")));
    // Each copy: both its sessions completed with both requests answered, one of them after
    // moving off a tuple the target held for the other copy.
    for r in [&r1, &r2] {
        assert_eq!(u(r, "sessions.copies"), 2, "{r:#}");
        assert_eq!(u(r, "sessions.completed"), 2, "{r:#}");
        assert_eq!(failures(r), 0, "{r:#}");
        assert_eq!(u(r, "requests.answered"), 4, "{r:#}");
        assert_eq!(u(r, "transparent.tuple_in_use"), 1, "{r:#}");
    }
    // Nothing a copy sent reset anything: every session ended with FINs.
    assert!(rsts.is_empty(), "{rsts:?}");
    assert_eq!(u(&ir, "copies_connected"), 2, "{ir:#}");
}
