//! The client processes the balance tests run inside the balanced cgroup: this test binary
//! again, running one of these `#[ignore]`d tests with its variable set, so the client is a
//! real process whose connects and sends the kernel's hooks see.

use super::*;

/// The client's environment variable: `VIP;N;GOFILE[;STARTFILE]` (GOFILE may be empty).
pub(super) const CLIENT_ENV: &str = "TCPKIT_BALANCE_TEST_CLIENT";
pub(super) const CLIENT_UDP_ENV: &str = "TCPKIT_BALANCE_TEST_UDP_CLIENT";

/// The arguments that make this binary run only the helper-process test `test` of this module.
pub(super) fn helper_args(test: &str) -> Vec<String> {
    common::helper_args(module_path!(), test)
}

/// Not a test of its own: the client that `balance run` starts (this binary again, with
/// CLIENT_ENV set). It connects N times to the VIP and prints, per connect, what getpeername()
/// returned and which backend answered (`CONN <peer> <backend port>`) or the errno (`ERR n`),
/// then `READY`, then waits for GOFILE to exist (at most 25 s) so the test can look at the
/// kernel while it runs.
#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn client_in_cgroup() {
    let spec = common::helper_env(CLIENT_ENV);
    let f: Vec<&str> = spec.split(';').collect();
    let vip: SocketAddr = f[0].parse().unwrap();
    let n: usize = f[1].parse().unwrap();
    if let Some(start) = f.get(3) {
        let until = Instant::now() + Duration::from_secs(25);
        while !Path::new(start).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("STARTED");
    }
    let mut out = std::io::stdout().lock();
    // libtest has printed `test balance::client_in_cgroup ... ` without a newline.
    writeln!(out).unwrap();
    for _ in 0..n {
        match TcpStream::connect_timeout(&vip, Duration::from_secs(5)) {
            Ok(s) => {
                let peer = s.peer_addr().unwrap();
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                writeln!(out, "CONN {peer} {}", line.trim()).unwrap();
            }
            Err(e) => writeln!(out, "ERR {}", e.raw_os_error().unwrap_or(0)).unwrap(),
        }
    }
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    if let Some(go) = f.get(2).filter(|g| !g.is_empty()) {
        let until = Instant::now() + Duration::from_secs(25);
        while !Path::new(go).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Not a test of its own: the UDP client `balance run` starts (CLIENT_UDP_ENV = the VIP,
/// then `;STARTFILE` when it must wait for that file to exist before it starts). Two unconnected sockets send three DNS queries each to the VIP (`UDP <socket> <source of
/// the reply> <rcode> <answers>`), then a connected socket one (`UDPC <peer> <source> ...`).
#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn udp_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_UDP_ENV);
    let (vip, start) = spec.split_once(';').unwrap_or((&spec, ""));
    let vip: SocketAddr = vip.parse().unwrap();
    let until = Instant::now() + Duration::from_secs(25);
    while !start.is_empty() && !Path::new(start).exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    let ask = |s: &UdpSocket, id: u16, to: Option<SocketAddr>| -> (SocketAddr, u8, u16) {
        let mut q = Vec::new();
        dns::write_tcp_query(
            &mut q,
            id,
            &unbound::WWW_EXAMPLE.parse().unwrap(),
            dns::TYPE_A,
        );
        // A TCP query less its 2-byte length is the UDP query.
        match to {
            Some(a) => s.send_to(&q[2..], a).unwrap(),
            None => s.send(&q[2..]).unwrap(),
        };
        let mut buf = [0u8; 1500];
        let (n, from) = common::sock::no_eintr(|| s.recv_from(&mut buf)).unwrap();
        let r = dns::parse_response(&buf[..n]).unwrap();
        assert_eq!(r.id, id);
        (from, r.rcode, r.answers)
    };
    let any = if vip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    for sock in 0..2 {
        let s = UdpSocket::bind(any).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for i in 0..3 {
            let (from, rcode, answers) = ask(&s, sock * 16 + i, Some(vip));
            writeln!(out, "UDP {sock} {from} {rcode} {answers}").unwrap();
        }
    }
    let s = UdpSocket::bind(any).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.connect(vip).unwrap();
    let (from, rcode, answers) = ask(&s, 99, None);
    writeln!(
        out,
        "UDPC {} {from} {rcode} {answers}",
        s.peer_addr().unwrap()
    )
    .unwrap();
}

/// The loop client (`VIP;HOLD;PHASEFILE;STOPFILE;STARTFILE`): once STARTFILE exists (it
/// has been moved into the cgroup by then), HOLD long-lived connections first
/// (`HOLD <peer> <port>`, then `HELD`), then connects in a loop, each tagged with the phase
/// (`C1 <port>` before PHASEFILE exists, `C2 <port>` after; `ERR1 n`/`ERR2 n` on failure),
/// until STOPFILE exists (60 s at most); then a line through each held connection
/// (`ALIVE <port>` when it comes back, `BROKEN <port> <why>`), and `DONE`.
pub(super) const CLIENT_LOOP_ENV: &str = "TCPKIT_BALANCE_TEST_LOOP_CLIENT";

#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn loop_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_LOOP_ENV);
    let f: Vec<&str> = spec.split(';').collect();
    let vip: SocketAddr = f[0].parse().unwrap();
    let hold: usize = f[1].parse().unwrap();
    let (phase, stop, start) = (Path::new(f[2]), Path::new(f[3]), Path::new(f[4]));
    // Not before the test has moved this process into the cgroup.
    let until = Instant::now() + Duration::from_secs(25);
    while !start.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    let read_port = |s: &TcpStream| -> std::io::Result<String> {
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line.trim().to_string())
    };
    let mut held = Vec::new();
    for _ in 0..hold {
        let s = TcpStream::connect_timeout(&vip, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let port = read_port(&s).unwrap();
        writeln!(out, "HOLD {} {port}", s.peer_addr().unwrap()).unwrap();
        held.push((s, port));
    }
    writeln!(out, "HELD").unwrap();
    out.flush().unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while !stop.exists() && Instant::now() < until {
        let tag = if phase.exists() { 2 } else { 1 };
        match TcpStream::connect_timeout(&vip, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                match read_port(&s) {
                    Ok(p) => writeln!(out, "C{tag} {p}").unwrap(),
                    Err(e) => writeln!(out, "ERR{tag} read {e}").unwrap(),
                }
            }
            Err(e) => writeln!(out, "ERR{tag} {}", e.raw_os_error().unwrap_or(0)).unwrap(),
        }
        out.flush().unwrap();
        // Paced, so the run's few thousand connects do not use up the ephemeral ports.
        std::thread::sleep(Duration::from_millis(2));
    }
    for (s, port) in &held {
        let echoed = (|| -> std::io::Result<String> {
            (&*s).write_all(b"ping\n")?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line)?;
            Ok(line)
        })();
        match echoed {
            Ok(l) if l == "ping\n" => writeln!(out, "ALIVE {port}").unwrap(),
            Ok(l) => writeln!(out, "BROKEN {port} got {l:?}").unwrap(),
            Err(e) => writeln!(out, "BROKEN {port} {e}").unwrap(),
        }
    }
    writeln!(out, "DONE").unwrap();
}

/// The PING client (`VIP;N;STARTFILE`): once STARTFILE exists, N connects to the VIP, each
/// sending `PING\r\n` and printing the first line of the reply (`REPLY <line>`, or `ERR
/// <why>`), then `DONE`.
pub(super) const CLIENT_PING_ENV: &str = "TCPKIT_BALANCE_TEST_PING_CLIENT";

#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn ping_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_PING_ENV);
    let f: Vec<&str> = spec.split(';').collect();
    let vip: SocketAddr = f[0].parse().unwrap();
    let n: usize = f[1].parse().unwrap();
    let until = Instant::now() + Duration::from_secs(25);
    while !Path::new(f[2]).exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    for _ in 0..n {
        let r = (|| -> std::io::Result<String> {
            let s = TcpStream::connect_timeout(&vip, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            (&s).write_all(b"PING\r\n")?;
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line)?;
            Ok(line.trim().to_string())
        })();
        match r {
            Ok(l) => writeln!(out, "REPLY {l}").unwrap(),
            Err(e) => writeln!(out, "ERR {e}").unwrap(),
        }
    }
    writeln!(out, "DONE").unwrap();
}

/// The holding client (`TCPVIP;UDPVIP;N;STARTFILE;STOPFILE`): once STARTFILE exists, N TCP
/// connections (each reads the backend's port) and N connected UDP sockets (each sends a
/// datagram and reads the port back): `HOLD tcp|udp I PORT`, then `HELD`. Each socket then
/// waits for data: when it is ended, `GONE tcp|udp I PORT <errno or eof>`; when STOPFILE
/// exists, it checks it still works (`ALIVE tcp|udp I PORT`, or `BROKEN ...`).
pub(super) const CLIENT_HOLD_ENV: &str = "TCPKIT_BALANCE_TEST_HOLD_CLIENT";

#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn hold_client_in_cgroup() {
    let spec = common::helper_env(CLIENT_HOLD_ENV);
    let f: Vec<String> = spec.split(';').map(str::to_string).collect();
    let tvip: SocketAddr = f[0].parse().unwrap();
    let uvip: SocketAddr = f[1].parse().unwrap();
    let n: usize = f[2].parse().unwrap();
    let until = Instant::now() + Duration::from_secs(25);
    while !Path::new(&f[3]).exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let say = |l: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{l}").unwrap();
        out.flush().unwrap();
    };
    say(String::new());
    let stop = PathBuf::from(&f[4]);
    let why = |e: &std::io::Error| e.raw_os_error().map_or(e.to_string(), |n| n.to_string());
    let mut threads = Vec::new();
    for i in 0..n {
        let s = TcpStream::connect_timeout(&tvip, Duration::from_secs(5)).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        let port = line.trim().to_string();
        say(format!("HOLD tcp {i} {port}"));
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 64];
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                match common::sock::read_some(&mut &s, &mut buf) {
                    Ok(0) => return say(format!("GONE tcp {i} {port} eof")),
                    Ok(_) => return say(format!("BROKEN tcp {i} {port} unasked data")),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return say(format!("GONE tcp {i} {port} {}", why(&e))),
                }
                if stop.exists() || Instant::now() > until {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let echoed = (|| -> std::io::Result<String> {
                        (&s).write_all(b"ping\n")?;
                        let mut l = String::new();
                        BufReader::new(&s).read_line(&mut l)?;
                        Ok(l)
                    })();
                    return match echoed {
                        Ok(l) if l == "ping\n" => say(format!("ALIVE tcp {i} {port}")),
                        other => say(format!("BROKEN tcp {i} {port} {other:?}")),
                    };
                }
            }
        }));
    }
    for i in 0..n {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect(uvip).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.send(b"x").unwrap();
        let mut buf = [0u8; 64];
        let k = common::sock::no_eintr(|| s.recv(&mut buf)).unwrap();
        let port = String::from_utf8_lossy(&buf[..k]).to_string();
        say(format!("HOLD udp {i} {port}"));
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                match common::sock::no_eintr(|| s.recv(&mut buf)) {
                    Ok(_) => return say(format!("BROKEN udp {i} {port} unasked data")),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return say(format!("GONE udp {i} {port} {}", why(&e))),
                }
                if stop.exists() || Instant::now() > until {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let back = s
                        .send(b"x")
                        .and_then(|_| common::sock::no_eintr(|| s.recv(&mut buf)));
                    return match back {
                        Ok(k) if buf[..k] == *port.as_bytes() => {
                            say(format!("ALIVE udp {i} {port}"));
                        }
                        other => say(format!("BROKEN udp {i} {port} {other:?}")),
                    };
                }
            }
        }));
    }
    say("HELD".into());
    for t in threads {
        t.join().unwrap();
    }
    say("DONE".into());
}
