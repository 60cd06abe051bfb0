//! `tcpkit echo` as users run it: the real binary in one lab host, real clients in the other
//! (sockets opened inside the client namespace), checked byte for byte, by RSS, by its report
//! and against a real resolver for the DNS wire format.

use crate::common;
use crate::common::unbound;
use common::peer::{echo_report, listening, stop_echo, SRV};
use common::schema;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::tcpkit;
use serde_json::Value;
use tcpkit_lab::{Host, Lab, Proc};
use tcpkit_wire::dns;

fn srv(port: u16) -> SocketAddr {
    SocketAddr::from((SRV, port))
}

struct Echo {
    /// Held for its drop: stops the server and removes the namespaces.
    _lab: Lab,
    cli: Host,
    srv: Host,
    proc: Proc,
}

/// `tcpkit echo ARGS` on host b of a fresh pair, once it accepts connections. The readiness
/// probe is one accepted connection that sends nothing ([`PROBES`]).
fn start(tag: &str, args: &[&str]) -> Echo {
    start_with(tag, &[], args)
}

/// [`start`] with `prefix` (a command such as `prlimit ...`) in front of `tcpkit echo`.
fn start_with(tag: &str, prefix: &[&str], args: &[&str]) -> Echo {
    let (mut lab, cli, srv_host, _link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
    let mut argv = prefix.to_vec();
    argv.extend_from_slice(&[tcpkit(), "echo"]);
    argv.extend_from_slice(args);
    let proc = srv_host
        .spawn(&mut lab, "echo", &argv)
        .unwrap_or_else(|e| panic!("{e}"));
    let port = args
        .iter()
        .position(|a| *a == "--port")
        .map_or(4242, |i| args[i + 1].parse().unwrap());
    assert!(
        listening(&cli, srv(port)),
        "echo never listened: {}",
        proc.log()
    );
    // The probe is closed by echo before the test goes on: a probe still open when a test
    // fills echo to its cap was the oldest silent connection, evicted, one more than the
    // test's own (1 run in ~20 under load).
    let filter = format!("( sport = :{port} )");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let o = srv_host
            .command(&[
                "ss",
                "-Htn",
                "state",
                "established",
                "state",
                "close-wait",
                &filter,
            ])
            .output()
            .expect("ss");
        if o.stdout.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "echo never closed the probe: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Echo {
        _lab: lab,
        cli,
        srv: srv_host,
        proc,
    }
}

const PROBES: u64 = 1;

impl Echo {
    /// SIGTERM, wait, and the JSON report from its output (run with --json).
    fn stop_json(&self) -> Value {
        stop_echo(&self.proc)
    }

    fn rss_kib(&self) -> u64 {
        rss_kib(self.proc.pid())
    }
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Lets this test process hold thousands of client sockets.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// xorshift64*: reproducible "random" payloads without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn fill(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn roundtrip(s: &mut TcpStream, payload: &[u8]) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(payload).unwrap();
    let mut back = vec![0u8; payload.len()];
    s.read_exact(&mut back).unwrap();
    assert!(back == payload, "echoed bytes differ");
}

#[test]
fn echo_returns_the_same_bytes_over_1000_connections() {
    raise_nofile();
    let e = start("echo1k", &["--threads", "2", "--json"]);
    let total: u64 = e.cli.enter(|| {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u64)
                .map(|t| {
                    s.spawn(move || {
                        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                        // All 250 of this thread's connections are open at once.
                        let mut conns: Vec<TcpStream> = (0..250)
                            .map(|_| TcpStream::connect(srv(4242)).unwrap())
                            .collect();
                        let mut bytes = 0u64;
                        for c in &mut conns {
                            let n = 1 + (rng.next() % 40_000) as usize;
                            let p = rng.fill(n);
                            roundtrip(c, &p);
                            bytes += n as u64;
                        }
                        bytes
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        })
    });
    let j = e.stop_json();
    assert_eq!(j["accepted"], 1000 + PROBES);
    assert_eq!(j["bytes_in"], total);
    assert_eq!(j["bytes_out"], total);
    assert_eq!(j["mode"], "echo");
    assert_eq!(j["stopped_by"], "signal");
}

#[test]
fn a_client_that_never_reads_gets_back_pressure_not_server_memory() {
    // Each client tries to write 50 MB; the kernel's socket buffers on both sides take up to
    // ~20 MB of it (tcp_wmem/tcp_rmem maxima), the server at most --max-conn-buf.
    const CONNS: usize = 2;
    const PER_CONN: usize = 50 << 20;
    const BUF: u64 = 64 * 1024;
    let e = start(
        "echobp",
        &["--threads", "1", "--max-conn-buf", "65536", "--json"],
    );
    let mut conns: Vec<TcpStream> = e.cli.enter(|| {
        (0..CONNS)
            .map(|_| TcpStream::connect(srv(4242)).unwrap())
            .collect()
    });
    // Let the accepts land before the baseline.
    std::thread::sleep(Duration::from_millis(200));
    let before = e.rss_kib();
    let pattern = |i: usize| (i % 251) as u8;
    let written: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = conns
            .iter_mut()
            .map(|c| {
                s.spawn(move || {
                    c.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
                    let mut done = 0;
                    while done < PER_CONN {
                        // The pattern runs on across writes, so order can be checked later.
                        let piece: Vec<u8> = (done..done + 65536).map(pattern).collect();
                        match c.write(&piece) {
                            Ok(n) => done += n,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    ErrorKind::WouldBlock | ErrorKind::TimedOut
                                ) =>
                            {
                                break
                            }
                            Err(e) => panic!("write: {e}"),
                        }
                    }
                    done
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let after = e.rss_kib();
    let growth = after.saturating_sub(before) * 1024;
    let slack = 4u64 << 20;
    eprintln!(
        "back-pressure: wrote {written:?} of {PER_CONN} per connection; server RSS {before} -> {after} KiB"
    );
    for w in &written {
        assert!(
            *w < PER_CONN,
            "the server took all {w} bytes: no back-pressure"
        );
    }
    assert!(
        growth <= CONNS as u64 * BUF + slack,
        "server RSS grew {growth} bytes for {CONNS} stalled connections (cap {BUF} each)"
    );
    // The stalled connections did not stall the (single) event loop.
    e.cli.enter(|| {
        let mut c = TcpStream::connect(srv(4242)).unwrap();
        roundtrip(&mut c, b"still serving");
    });
    // And once a client reads, everything it wrote comes back, in order.
    for (c, w) in conns.iter_mut().zip(&written) {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut back = vec![0u8; *w];
        c.read_exact(&mut back).unwrap();
        assert!(
            back.iter().enumerate().all(|(i, b)| *b == pattern(i)),
            "echo after back-pressure is out of order"
        );
    }
    let j = e.stop_json();
    let w: usize = written.iter().sum();
    assert_eq!(j["bytes_in"], w as u64 + 13);
    assert_eq!(j["bytes_out"], w as u64 + 13);
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// The default cap keeps echo within its descriptors; a cap above them (given, or descriptors
/// taken by something else) runs out, and that is counted with its OS error and survived.
#[test]
fn out_of_file_descriptors_is_counted_hinted_once_and_survived() {
    let e = start_with(
        "echoemfile",
        &["prlimit", "--nofile=64:64"],
        &["--threads", "1", "--max-conns", "1000", "--json"],
    );
    // About 56 of these fit in 64 descriptors; the rest wait in the accept queue.
    let conns: Vec<TcpStream> = e.cli.enter(|| {
        (0..100)
            .map(|_| TcpStream::connect(srv(4242)).unwrap())
            .collect()
    });
    std::thread::sleep(Duration::from_millis(500));
    let pid = e.proc.pid();
    let t0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - t0;
    // Ticks are 10 ms: a loop retrying accept without pause would use ~100 in this second.
    assert!(
        used <= 10,
        "{used} CPU ticks in 1 s while out of descriptors: spinning"
    );
    let log = e.proc.log();
    let hint = "tcpkit echo: out of file descriptors (limit 64; accept: Too many open files (os error 24)): more than 64 connections need --procs or a higher hard limit (tcpkit tune --role server)";
    assert_eq!(log.lines().filter(|l| *l == hint).count(), 1, "{log}");
    drop(conns);
    // Descriptors come back as clients leave, and the server serves again.
    e.cli.enter(|| {
        let mut c = TcpStream::connect(srv(4242)).unwrap();
        roundtrip(&mut c, b"after EMFILE");
    });
    let j = e.stop_json();
    assert_eq!(j["fd_limit"], 64);
    assert_eq!(j["max_conns"], 1000);
    assert!(j["fd_exhausted"].as_u64().unwrap() >= 1, "{j}");
    assert_eq!(
        j["accept_error"], "Too many open files (os error 24)",
        "{j}"
    );
    assert_eq!(j["accepted"], 100 + PROBES + 1);
}

/// Reads one length-prefixed DNS message.
fn read_msg(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).unwrap();
    let mut m = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut m).unwrap();
    m
}

fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::new();
    dns::write_tcp_query(&mut q, id, &name.parse().unwrap(), qtype);
    q
}

/// Issue 11 (slowloris): connections each holding one byte of a DNS query exhausted echo's
/// descriptors, and a good client waited forever. Each partial query now has
/// --partial-timeout to complete, and the connection cap (128 descriptors less the reserve)
/// is never passed: of 300 such connections the oldest make room for the newer (evicted),
/// the rest are closed by the partial timeout, each counted, and a good client is answered
/// promptly.
#[test]
fn dns_partial_queries_are_closed_after_the_partial_timeout() {
    let e = start_with(
        "echoslow",
        &["prlimit", "--nofile=128:128"],
        &[
            "--dns",
            "--threads",
            "1",
            "--partial-timeout",
            "1s",
            "--json",
        ],
    );
    let t0 = Instant::now();
    let (hostile, answered_after) = e.cli.enter(|| {
        let hostile: Vec<TcpStream> = (0..300)
            .map(|_| {
                let mut s = TcpStream::connect(srv(4242)).unwrap();
                s.write_all(&[0]).unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut good = TcpStream::connect(srv(4242)).unwrap();
        good.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        good.write_all(&query(77, "good.example", 1)).unwrap();
        let m = read_msg(&mut good);
        assert_eq!(dns::parse_response(&m).unwrap().id, 77);
        (hostile, t0.elapsed())
    });
    // Over the cap the good client takes a silent connection's place at once (before the
    // cap, waiting for the partial timeouts, this took 2.1 s).
    assert!(
        answered_after < Duration::from_secs(2),
        "good client answered after {answered_after:?}"
    );
    // The server closed the hostile ones: each reads EOF (or a reset), not a wait.
    e.cli.enter(|| {
        for mut s in hostile {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 1];
            assert!(
                !matches!(common::sock::read_some(&mut s, &mut b), Err(ref x) if x.kind() == std::io::ErrorKind::WouldBlock || x.kind() == std::io::ErrorKind::TimedOut),
                "a hostile connection still open"
            );
        }
    });
    let j = e.stop_json();
    eprintln!("good client answered after {answered_after:?}; report {j}");
    let (partial, evicted) = (
        j["partial_timeouts"].as_u64().unwrap(),
        j["evicted"].as_u64().unwrap(),
    );
    assert_eq!(partial + evicted, 300, "{j}");
    // The cap (128 - 18 = 110) held all but 190 (and the good client's place): those were
    // evicted; the rest waited for the partial timeout.
    assert_eq!(j["max_conns"], 110, "{j}");
    assert!(evicted >= 190 && partial >= 50, "{j}");
    assert_eq!(j["fd_exhausted"], 0, "{j}");
    assert!(j["answered"].as_u64().unwrap() >= 1, "{j}");
}

#[test]
fn dns_answers_a_plain_tcp_query() {
    let e = start("echodns", &["--dns", "--dns-a", "10.9.8.7", "--json"]);
    e.cli.enter(|| {
        let mut s = TcpStream::connect(srv(4242)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&query(0x4242, "www.example.com", dns::TYPE_A))
            .unwrap();
        let m = read_msg(&mut s);
        let r = dns::parse_response(&m).unwrap();
        assert_eq!(
            (r.id, r.rcode, r.answers, r.truncated),
            (0x4242, 0, 1, false)
        );
        assert_eq!(
            dns::first_answer_addr(&m).unwrap(),
            Some(IpAddr::from([10, 9, 8, 7]))
        );
        s.write_all(&query(7, "www.example.com", dns::TYPE_AAAA))
            .unwrap();
        let m = read_msg(&mut s);
        assert_eq!(
            dns::first_answer_addr(&m).unwrap(),
            Some("fd00:53::53".parse().unwrap())
        );
    });
    let j = e.stop_json();
    assert_eq!(
        (j["mode"].as_str(), j["answered"].as_u64()),
        (Some("dns"), Some(2))
    );
}

#[test]
fn pipelined_and_fragmented_dns_queries_are_answered_in_order() {
    let e = start("echopipe", &["--dns", "--max-conn-buf", "4096", "--json"]);
    const N: u16 = 500;
    e.cli.enter(|| {
        let mut s = TcpStream::connect(srv(4242)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Each 7-byte piece its own segment, without waiting for the server's delayed ACK.
        s.set_nodelay(true).unwrap();
        let types = [dns::TYPE_A, dns::TYPE_AAAA, dns::TYPE_MX];
        let mut all = Vec::new();
        for id in 0..N {
            all.extend(query(id, "pipelined.example", types[usize::from(id) % 3]));
        }
        // The first half in one write (more than the buffer holds: the server must take it
        // in windows), the second in 7-byte pieces so queries straddle reads.
        let half = all.len() / 2;
        s.write_all(&all[..half]).unwrap();
        for piece in all[half..].chunks(7) {
            s.write_all(piece).unwrap();
        }
        for id in 0..N {
            let m = read_msg(&mut s);
            let r = dns::parse_response(&m).unwrap();
            assert_eq!(r.id, id, "answers out of order");
            assert_eq!(r.rcode, 0);
            assert_eq!(r.answers, u16::from(id % 3 != 2));
        }
    });
    assert_eq!(e.stop_json()["answered"], u64::from(N));
}

#[test]
fn a_malformed_query_closes_only_its_connection() {
    let e = start("echobad", &["--dns", "--threads", "1", "--json"]);
    e.cli.enter(|| {
        let mut good = TcpStream::connect(srv(4242)).unwrap();
        good.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut bad = TcpStream::connect(srv(4242)).unwrap();
        bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // A good query, then a message too short to be a DNS header.
        let mut b = query(1, "a.example", dns::TYPE_A);
        b.extend_from_slice(&[0, 3, 1, 2, 3]);
        bad.write_all(&b).unwrap();
        let m = read_msg(&mut bad);
        assert_eq!(dns::parse_response(&m).unwrap().id, 1);
        let mut rest = [0u8; 16];
        match common::sock::read_some(&mut bad, &mut rest) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("malformed query: connection not closed: {other:?}"),
        }
        for id in 0..3 {
            good.write_all(&query(id, "b.example", dns::TYPE_A))
                .unwrap();
            assert_eq!(dns::parse_response(&read_msg(&mut good)).unwrap().id, id);
        }
        let mut fresh = TcpStream::connect(srv(4242)).unwrap();
        fresh
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        fresh
            .write_all(&query(9, "c.example", dns::TYPE_A))
            .unwrap();
        assert_eq!(dns::parse_response(&read_msg(&mut fresh)).unwrap().id, 9);
    });
    let j = e.stop_json();
    assert_eq!(j["malformed"], 1);
    assert_eq!(j["answered"], 5);
}

#[test]
fn procs_2_serve_one_port_and_report_one_total() {
    let e = start(
        "echoprocs",
        &["--procs", "2", "--threads", "1", "--json", "--stats", "0.2"],
    );
    // Both workers must be listening before the count starts: wait for both stats lines.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(e.proc.log().contains("s] worker 0/2 ") && e.proc.log().contains("s] worker 1/2 ")) {
        assert!(Instant::now() < deadline, "workers: {}", e.proc.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    e.cli.enter(|| {
        for i in 0..200u32 {
            let mut c = TcpStream::connect(srv(4242)).unwrap();
            roundtrip(&mut c, &i.to_be_bytes());
        }
    });
    let j = e.stop_json();
    assert_eq!(j["processes"], 2);
    assert_eq!(j["threads"], 2);
    assert_eq!(j["accepted"], 200 + PROBES);
    assert_eq!(j["bytes_out"], 800);
    let log = e.proc.log();
    assert_eq!(
        log.lines().filter(|l| l.starts_with('{')).count(),
        1,
        "{log}"
    );
}

#[test]
fn json_matches_the_committed_schema() {
    let schema = schema::load("echo");
    for args in [
        vec!["--json", "--duration", "0.5"],
        vec!["--json", "--duration", "0.5", "--dns", "--port", "53"],
        vec!["--json", "--duration", "0.5", "--http", "--port", "80"],
    ] {
        let e = start("echojson", &args);
        let st = e
            .proc
            .wait_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("--duration did not end the run");
        assert!(st.success());
        let j = echo_report(&e.proc.log());
        schema::check(&schema, &j, "report");
        assert_eq!(j["stopped_by"], "duration");
        assert_eq!(j["accepted"], PROBES);
        let s = j["seconds"].as_f64().unwrap();
        assert!((0.5..1.5).contains(&s), "ran {s} s for --duration 0.5");
        let port = if args.contains(&"--dns") {
            53
        } else if args.contains(&"--http") {
            80
        } else {
            4242
        };
        assert_eq!(j["listen"][0], format!("[::]:{port}"));
    }
}

#[test]
fn stats_lines_appear_and_the_summary_is_human() {
    let e = start(
        "echostats",
        &["--stats", "0.2", "--duration", "1.2", "--dns"],
    );
    let st = e
        .proc
        .wait_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert!(st.success());
    let log = e.proc.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with('[') && l.contains("] open "))
        .collect();
    assert!(
        (4..=7).contains(&lines.len()),
        "{} stats lines:\n{log}",
        lines.len()
    );
    assert!(lines
        .last()
        .unwrap()
        .contains("accepted 1, bytes in 0, bytes out 0, answered 0"));
    assert!(
        log.contains("Connections: 1 accepted, 1 closed, 0 open at exit\n"),
        "{log}"
    );
    assert!(log.contains("DNS: 0 queries answered"), "{log}");
    assert!(log.contains("; stopped by duration"), "{log}");
}

fn one_line_error(args: &[&str], code: i32, want: &str) {
    let mut argv = vec!["echo"];
    argv.extend_from_slice(args);
    let out = std::process::Command::new(tcpkit())
        .args(&argv)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("tcpkit echo: "), "{err}");
    assert!(err.contains(want), "{args:?}: {err} lacks {want}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_flags_are_one_line_usage_errors() {
    one_line_error(&["--port", "70000"], 2, "70000");
    one_line_error(
        &["--listen", "garbage"],
        2,
        "--listen 'garbage': not an address",
    );
    one_line_error(&["--max-conn-buf", "1"], 2, "--max-conn-buf 1");
    one_line_error(&["--dns-aaaa", "::1"], 2, "--dns");
}

#[test]
fn a_port_in_use_is_a_one_line_runtime_error() {
    let (_lab, _a, b, _link) = Lab::pair("echoinuse").unwrap_or_else(|e| panic!("{e}"));
    let out = b.enter(|| {
        let _held = TcpListener::bind(srv(4242)).unwrap();
        b.command(&[
            tcpkit(),
            "echo",
            "--listen",
            "198.18.0.2",
            "--duration",
            "1",
        ])
        .output()
        .unwrap()
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "tcpkit echo: bind 198.18.0.2:4242: Address already in use (os error 98)"
    );
}

/// Issue 24, item 8: a second `echo` on a port already in use started and silently took part
/// of the connections (57/43): every listener set SO_REUSEPORT, and the kernel lets any socket
/// of the same user join such a group. Now only one echo's own listeners share a port: a second
/// echo, of one process or several, exits 1 at once with the one line nc and nginx would give,
/// and the first, of one process or several, serves every connection.
#[test]
fn a_second_echo_on_a_port_in_use_is_refused_and_the_first_serves_every_connection() {
    let firsts: [(&str, &[&str]); 2] = [
        ("echotwice", &["--threads", "2"]),
        ("echotwicep", &["--procs", "2", "--threads", "2"]),
    ];
    for (tag, first) in firsts {
        let mut args = first.to_vec();
        args.extend_from_slice(&["--json", "--stats", "0.2"]);
        let e = start(tag, &args);
        if first.contains(&"--procs") {
            // Both workers listening: each has printed a stats line.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !(e.proc.log().contains("s] worker 0/2 ")
                && e.proc.log().contains("s] worker 1/2 "))
            {
                assert!(Instant::now() < deadline, "workers: {}", e.proc.log());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for second in [
            &["--threads", "2"][..],
            &["--procs", "2", "--threads", "1"][..],
        ] {
            let mut argv = vec![tcpkit(), "echo"];
            argv.extend_from_slice(second);
            argv.extend_from_slice(&["--duration", "3"]);
            let t = Instant::now();
            let out = e.srv.command(&argv).output().unwrap();
            let took = t.elapsed();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{first:?} then {second:?}: {err}"
            );
            assert_eq!(
                err.trim_end(),
                "tcpkit echo: bind [::]:4242: Address already in use (os error 98)",
                "{first:?} then {second:?}"
            );
            assert!(out.stdout.is_empty(), "{first:?} then {second:?}");
            assert!(
                took < Duration::from_secs(2),
                "{first:?} then {second:?}: refused after {took:?}"
            );
        }
        e.cli.enter(|| {
            for i in 0..100u32 {
                let mut c = TcpStream::connect(srv(4242)).unwrap();
                roundtrip(&mut c, &i.to_be_bytes());
            }
        });
        let j = e.stop_json();
        assert_eq!(j["accepted"], 100 + PROBES, "{first:?}: {j}");
        assert_eq!(j["bytes_out"], 400, "{first:?}");
    }
}

#[test]
fn our_queries_get_real_answers_from_unbound() {
    unbound::require();
    let (mut lab, a, b, _link) = Lab::pair("echounbound").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let conf = unbound::write_conf(dir.path(), IpAddr::V4(SRV), 53, 100);
    let argv = unbound::argv(&conf);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let p = b.spawn(&mut lab, "unbound", &argv).unwrap();
    let (r, addr, nx) = a.enter(|| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = loop {
            match TcpStream::connect(srv(53)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => panic!("unbound: {e}: {}", p.log()),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&query(0xabcd, unbound::WWW_EXAMPLE, dns::TYPE_A))
            .unwrap();
        let m = read_msg(&mut s);
        let r = dns::parse_response(&m).unwrap();
        let addr = dns::first_answer_addr(&m).unwrap();
        s.write_all(&query(0xabce, "nope.example", dns::TYPE_A))
            .unwrap();
        let nx = dns::parse_response(&read_msg(&mut s)).unwrap();
        (r, addr, nx)
    });
    assert_eq!(
        (r.id, r.rcode, r.answers, r.truncated),
        (0xabcd, 0, 1, false)
    );
    assert_eq!(addr, Some(unbound::WWW_EXAMPLE_A.parse().unwrap()));
    assert_eq!((nx.id, dns::rcode_name(nx.rcode)), (0xabce, "NXDOMAIN"));
}

/// The memory target: user-space memory per idle connection. Run with
/// `cargo test --release -p tcpkit --test echo -- --ignored --nocapture idle`.
#[test]
#[ignore = "measurement: 10,000 connections"]
fn idle_connection_memory() {
    const N: usize = 10_000;
    raise_nofile();
    let e = start("echoidle", &["--threads", "1"]);
    std::thread::sleep(Duration::from_millis(200));
    let before = e.rss_kib();
    let conns: Vec<TcpStream> = e.cli.enter(|| {
        (0..N)
            .map(|_| TcpStream::connect(srv(4242)).unwrap())
            .collect()
    });
    // Every connection accepted (and one byte echoed on the last, so the loop caught up).
    let mut last = conns.last().unwrap().try_clone().unwrap();
    roundtrip(&mut last, b"x");
    std::thread::sleep(Duration::from_millis(300));
    let after = e.rss_kib();
    let per = (after.saturating_sub(before) * 1024) as f64 / N as f64;
    eprintln!("idle: RSS {before} -> {after} KiB over {N} connections: {per:.0} bytes each");
    drop(conns);
    assert!(
        per <= 1024.0,
        "{per:.0} bytes of user memory per idle connection"
    );
}

/// A full listen queue drops connections the server never sees: echo watches the kernel's
/// counters and says so once, with the settings to change.
#[test]
fn listen_queue_overflow_is_hinted_once() {
    let (mut lab, cli, srv_host, _link) = Lab::pair("echosyn").unwrap_or_else(|e| panic!("{e}"));
    // A tiny accept queue, and too few descriptors to drain it: connects pile up and overflow.
    srv_host.sysctl("net.core.somaxconn", "4").unwrap();
    let proc = srv_host
        .spawn(
            &mut lab,
            "echo",
            &[
                "prlimit",
                "--nofile=32:32",
                tcpkit(),
                "echo",
                "--threads",
                "1",
                // A cap above the descriptors: they run out and the queue fills, rather
                // than newcomers taking the place of silent connections.
                "--max-conns",
                "1000",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(300));
    let conns: Vec<TcpStream> = cli.enter(|| {
        (0..80)
            .filter_map(|_| TcpStream::connect_timeout(&srv(4242), Duration::from_millis(50)).ok())
            .collect()
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let want = "connections overflowed the listen queue: ";
    while !proc.log().contains(want) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = proc.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(want)).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].starts_with("tcpkit echo: "), "{}", lines[0]);
    assert!(
        lines[0].contains("tcpkit tune --role server"),
        "{}",
        lines[0]
    );
    drop(conns);
}
