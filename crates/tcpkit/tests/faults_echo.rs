//! `tcpkit echo` when things go wrong (issue 29): killed under load and started again at
//! once, what a SIGKILL leaves on the host, and a client that stops reading its answers
//! counted as what it is.

use crate::common;
use common::peer::{listening, stop_echo, u, SRV};
use common::schema;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::tcpkit;
use tcpkit_lab::{Host, Lab, Proc, Signal};
use tcpkit_wire::dns;

const PORT: u16 = 4243;

fn srv() -> SocketAddr {
    SocketAddr::from((SRV, PORT))
}

/// `tcpkit echo --port PORT ARGS` started on `host`, once it accepts connections.
fn echo(lab: &mut Lab, host: &Host, cli: &Host, name: &str, args: &[&str]) -> Proc {
    let port = PORT.to_string();
    let mut argv = vec![tcpkit(), "echo", "--port", &port];
    argv.extend_from_slice(args);
    let p = host
        .spawn(lab, name, &argv)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(listening(cli, srv()), "echo never listened: {}", p.log());
    p
}

fn query(id: u16) -> Vec<u8> {
    let mut q = Vec::new();
    dns::write_tcp_query(&mut q, id, &"load.example".parse().unwrap(), dns::TYPE_A);
    q
}

/// One query on `s` and its answer.
fn ask(s: &mut TcpStream, id: u16) -> std::io::Result<()> {
    s.write_all(&query(id))?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut m = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut m)
}

/// What a SIGKILLed server may leave in its namespace: processes, and sockets bound to its
/// port (listening or not; the kernel's orphans closing the killed connections are no one's
/// and hold no port to listen on, so only a listener or an owned socket counts).
fn leftovers(host: &Host) -> Vec<String> {
    let mut left = Vec::new();
    let pids = host
        .command(&["ip", "netns", "pids", host.netns()])
        .output()
        .expect("ip netns pids");
    // `ip netns exec` runs `ip netns pids` itself in the namespace: its own pid is listed.
    let pids = String::from_utf8_lossy(&pids.stdout).to_string();
    for pid in pids.split_whitespace() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "ip" && !comm.is_empty() {
            left.push(format!("process {pid} {}", comm.trim()));
        }
    }
    let ss = host
        .run(&["ss", "-Htanp", &format!("sport = :{PORT}")])
        .expect("ss");
    for l in String::from_utf8_lossy(&ss.stdout).lines() {
        if l.starts_with("LISTEN") || l.contains("users:") {
            left.push(l.to_string());
        }
    }
    left
}

/// Issue 29: echo (two worker processes, as a campaign runs it) SIGKILLed, whole, under
/// full load from 8 clients asking on new connections: nothing of it stays (no process, no
/// listener, no socket it owns), and a new echo started at once binds the same port
/// (SO_REUSEADDR beside the killed connections' TIME_WAIT and orphans) and answers within a
/// second of its start; the clients never stopped asking.
#[test]
fn echo_sigkilled_under_load_leaves_nothing_and_a_restart_serves_at_once() {
    let (mut lab, cli, srv_host, _link) = Lab::pair("fechokill").unwrap_or_else(|e| panic!("{e}"));
    let args = ["--dns", "--procs", "2", "--threads", "1", "--json"];
    let first = echo(&mut lab, &srv_host, &cli, "echo1", &args);
    let stop = AtomicBool::new(false);
    let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let (gap, restart_took, left) = std::thread::scope(|s| {
        for k in 0..8u16 {
            let (cli, stop, ok, failed) = (&cli, &stop, &ok, &failed);
            s.spawn(move || {
                cli.enter(|| {
                    let mut id = k;
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut c) =
                            TcpStream::connect_timeout(&srv(), Duration::from_millis(200))
                        else {
                            failed.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        };
                        c.set_read_timeout(Some(Duration::from_millis(500)))
                            .unwrap();
                        for _ in 0..10 {
                            id = id.wrapping_add(8);
                            if ask(&mut c, id).is_err() {
                                failed.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            });
        }
        std::thread::sleep(Duration::from_millis(400));
        assert!(ok.load(Ordering::Relaxed) > 100, "no load before the kill");
        first.signal(Signal::SIGKILL).unwrap();
        first
            .wait_timeout(Duration::from_secs(5))
            .unwrap()
            .expect("echo did not die of SIGKILL");
        let killed = Instant::now();
        // The workers die with the parent's group; give the kernel a moment to reap them.
        let left = (0..50)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(20));
                leftovers(&srv_host)
            })
            .find(Vec::is_empty)
            .unwrap_or_else(|| leftovers(&srv_host));
        let answered_before = ok.load(Ordering::Relaxed);
        let t = Instant::now();
        let second = echo(&mut lab, &srv_host, &cli, "echo2", &args);
        // Served: the clients' answers resume.
        while ok.load(Ordering::Relaxed) < answered_before + 100 {
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "the restarted echo answered {} queries in 3 s: {}",
                ok.load(Ordering::Relaxed) - answered_before,
                second.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let restart_took = t.elapsed();
        let gap = killed.elapsed();
        stop.store(true, Ordering::Relaxed);
        let j = stop_echo(&second);
        schema::check(&schema::load("echo"), &j, "report");
        assert!(u(&j, "answered") >= 100, "{j:#}");
        (gap, restart_took, left)
    });
    eprintln!(
        "echo SIGKILL: {} answered, {} failed; restarted and serving {restart_took:?} after \
         its start ({gap:?} after the kill)",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    assert!(left.is_empty(), "left after SIGKILL: {left:#?}");
    assert!(
        restart_took < Duration::from_secs(1),
        "the restarted echo took {restart_took:?} to serve"
    );
}

/// Issue 29 (small): a DNS client that sends its queries and stops reading the answers was
/// counted as holding a partial query: echo stops reading a connection whose answers do not
/// fit (back-pressure), so the queries left in its buffer aged past --partial-timeout as if
/// the client had sent half of one. It is closed at the same deadline, counted as what it is
/// (`unread_timeouts`), in the report and the summary; a real partial query still counts
/// as such.
#[test]
fn echo_counts_a_client_that_stopped_reading_as_such_not_as_a_partial_query() {
    let (mut lab, cli, srv_host, _link) =
        Lab::pair("fechounread").unwrap_or_else(|e| panic!("{e}"));
    let first = echo(
        &mut lab,
        &srv_host,
        &cli,
        "echo",
        &[
            "--dns",
            "--threads",
            "1",
            "--partial-timeout",
            "500ms",
            "--max-conn-buf",
            "4096",
            "--json",
        ],
    );
    cli.enter(|| {
        // Queries by the thousand, never an answer read, a small receive buffer: echo's
        // answers back up and it stops reading.
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(&srv().into()).unwrap();
        let mut deaf: TcpStream = sock.into();
        deaf.set_nonblocking(true).unwrap();
        // Written round and round until the socket stays full: how much the kernel buffers
        // before that (echo's receive window grows with what echo read first) is not ours to
        // fix, so a fixed amount once backed up on one run and fitted in the buffers on
        // another. A socket still full 200 ms after it first was means echo stopped reading.
        let q: Vec<u8> = (0..20_000u16).flat_map(query).collect();
        let (mut at, mut sent, mut backed_up) = (0, 0usize, false);
        let t = Instant::now();
        let mut full_since: Option<Instant> = None;
        while !backed_up && t.elapsed() < Duration::from_secs(3) {
            match deaf.write(&q[at..]) {
                Ok(n) => {
                    at = (at + n) % q.len();
                    sent += n;
                    full_since = None;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let since = *full_since.get_or_insert_with(Instant::now);
                    backed_up = since.elapsed() >= Duration::from_millis(200);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(
            backed_up,
            "echo read all {sent} bytes in 3 s: nothing backed up"
        );
        // And one that sends half a query and waits.
        let mut half = TcpStream::connect(srv()).unwrap();
        half.write_all(&query(1)[..7]).unwrap();
        // Both past the deadline, swept within 100 ms of it.
        std::thread::sleep(Duration::from_millis(1200));
        drop((deaf, half));
    });
    let j = stop_echo(&first);
    schema::check(&schema::load("echo"), &j, "report");
    assert_eq!(j["unread_timeouts"], 1, "{j:#}");
    assert_eq!(u(&j, "partial_timeouts"), 1, "{j:#}");
}
