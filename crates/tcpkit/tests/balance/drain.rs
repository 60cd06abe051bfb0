//! `--drain-kill`: the sockets on a backend that went down are ended, and no others.

use super::*;

/// A TCP backend in host b that keeps its connections (its port and a newline, then every
/// line echoed); `kill` closes its listener only, so probes are refused while the
/// connections it holds stay open.
fn killable_holding_backend(host: &Host) -> Backend {
    killable(host, SocketAddr::from((SRV, 0)), |s, port| {
        std::thread::spawn(move || hold(s, port));
    })
}

/// A UDP backend in host b answering every datagram with its port; `kill` closes it.
fn killable_udp_backend(host: &Host) -> Backend {
    let s = host.enter(|| UdpSocket::bind(SocketAddr::from((SRV, 0))).unwrap());
    let addr = s.local_addr().unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (n, d) = (Arc::clone(&accepted), Arc::clone(&dead));
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !d.load(Ordering::SeqCst) {
            if let Ok((_, from)) = s.recv_from(&mut buf) {
                n.fetch_add(1, Ordering::SeqCst);
                let _ = s.send_to(addr.port().to_string().as_bytes(), from);
            }
        }
        drop(s);
        drop(d);
    });
    Backend {
        addr,
        accepted,
        dead,
    }
}

#[test]
fn drain_kill_ends_the_sockets_on_a_dead_backend_and_no_others() {
    let (_g, lab, cli, srv, _link) = serial_pair("baldrain");
    let (t1, t2) = (
        killable_holding_backend(&srv),
        killable_holding_backend(&srv),
    );
    let (u1, u2) = (killable_udp_backend(&srv), killable_udp_backend(&srv));
    let cg = test_cgroup("drain");
    let config = lab.dir().join("lb.toml");
    let uvip = "198.19.0.1:5300";
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"tcp\"\nvip = \"{VIP}\"\nalgorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2 }}\n\
             [[service]]\nname = \"udp\"\nvip = \"{uvip}\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2, send = 'probe' }}\n",
            t1.addr, t2.addr, u1.addr, u2.addr
        ),
    );
    let up = Up::start(&lab, &cli, &config, cg.rel(), &["--drain-kill=all"]);
    let (start, stop) = (lab.dir().join("start"), lab.dir().join("stop"));
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_HOLD_ENV,
        &format!("{VIP};{uvip};4;{};{}", start.display(), stop.display()),
        "hold_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("HELD", 30);
    let log = c.log();
    // Round-robin: two of each kind on each backend.
    for (kind, b) in [("tcp", &t1), ("tcp", &t2), ("udp", &u1), ("udp", &u2)] {
        let held = log
            .lines()
            .filter(|l| l.starts_with(&format!("HOLD {kind} ")))
            .filter(|l| l.ends_with(&format!(" {}", b.addr.port())))
            .count();
        assert_eq!(held, 2, "{kind} on {}: {log}", b.addr);
    }
    // One backend of each service dies: its listener (the held connections stay open on its
    // side), its UDP socket.
    t1.kill();
    u1.kill();
    let v = status_until(&up, 30, "both dead backends down", |v| {
        v["services"][0]["backends"][0]["health"] == "down"
            && v["services"][1]["backends"][0]["health"] == "down"
    });
    assert_eq!(v["drain_kill"], "all", "{v}");
    // Their sockets end: two TCP (ECONNABORTED), two UDP (ECONNABORTED).
    let until = Instant::now() + Duration::from_secs(20);
    let gone = loop {
        let log = c.log();
        let gone: Vec<String> = log
            .lines()
            .filter(|l| l.starts_with("GONE "))
            .map(str::to_string)
            .collect();
        if gone.len() >= 4 {
            break gone;
        }
        assert!(
            Instant::now() < until,
            "the dead backends' sockets not ended in 20 s after both were down: {log}\nup: {}\n{}",
            up.stderr(),
            up.status()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    for l in &gone {
        let f: Vec<&str> = l.split(' ').collect();
        let dead = if f[1] == "tcp" { t1.addr } else { u1.addr };
        assert_eq!(
            f[3],
            dead.port().to_string(),
            "a live backend's socket ended: {l}"
        );
        assert_eq!(f[4], libc::ECONNABORTED.to_string(), "{l}");
    }
    let v = status_until(&up, 10, "the drained counts", |v| v["drained"] == 4);
    for s in 0..2 {
        assert_eq!(v["services"][s]["backends"][0]["drained"], 2, "{v}");
        assert_eq!(v["services"][s]["backends"][1]["drained"], 0, "{v}");
    }
    // A reload that drops the live TCP backend ends its connections too.
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"tcp\"\nvip = \"{VIP}\"\nalgorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2 }}\n\
             [[service]]\nname = \"udp\"\nvip = \"{uvip}\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 2, send = 'probe' }}\n",
            t1.addr, u1.addr, u2.addr
        ),
    );
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ended = format!(" {} {}", t2.addr.port(), libc::ECONNABORTED);
    let until = Instant::now() + Duration::from_secs(20);
    while c
        .log()
        .lines()
        .filter(|l| l.starts_with("GONE tcp ") && l.ends_with(&ended))
        .count()
        < 2
    {
        assert!(
            Instant::now() < until,
            "the removed backend's connections not ended in 20 s: {}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    status_until(&up, 10, "the drained count after the reload", |v| {
        v["drained"] == 6
    });
    // The live UDP backend's sockets still work.
    std::fs::write(&stop, "").unwrap();
    c.wait_for("DONE", 30);
    let log = c.log();
    let alive: Vec<&str> = log.lines().filter(|l| l.starts_with("ALIVE ")).collect();
    assert_eq!(alive.len(), 2, "{log}");
    assert!(!log.contains("BROKEN"), "{log}");
    for l in alive {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(
            (f[1], f[3]),
            ("udp", u2.addr.port().to_string().as_str()),
            "{l}"
        );
    }
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}
