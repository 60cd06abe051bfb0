//! `tcpkit balance up`, `reload` and `status`: a long-running balancer for a cgroup, its
//! config reloaded under load, its metrics endpoint.

use super::*;

/// A backend that keeps its connections: its port and a newline, then every line echoed
/// until the peer closes.
fn holding_backend(host: &Host) -> SocketAddr {
    let l = host.enter(|| TcpListener::bind(SocketAddr::from((SRV, 0))).unwrap());
    let addr = l.local_addr().unwrap();
    // Runs until the test process ends: its port is in a namespace the lab removes.
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || hold(s, addr.port()));
        }
    });
    addr
}

#[test]
fn up_balances_its_cgroup_status_shows_it_and_sigterm_detaches() {
    let (_g, lab, cli, srv, _link) = serial_pair("balup");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let cg = test_cgroup("up");
    let config = lb_config(&lab, &[b1.addr, b2.addr], true);
    let up = Up::start(&lab, &cli, &config, cg.rel(), &["--json"]);
    let (progs, maps) = attached(cg.path());
    // A TCP service: the UDP hooks are not attached, and status says which are.
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS, "{}", cg.path().display());
    assert_eq!(progs.len(), 5, "programs on {}", cg.path().display());
    assert_eq!(up.status()["hooks"], serde_json::json!(TCP_HOOKS));

    // A client in the cgroup: alternating backends, getpeername the VIP.
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 10);
    assert_eq!(got.len(), 10, "{log}");
    for (i, (peer, port)) in got.iter().enumerate() {
        assert_eq!(peer, VIP);
        if i > 0 {
            assert_ne!(*port, got[i - 1].1, "not alternating: {got:?}");
        }
    }
    // A process outside the cgroup (this test, in the same host) is not translated.
    let outside = cli.enter(|| {
        TcpStream::connect_timeout(&VIP.parse().unwrap(), Duration::from_secs(2)).map(|_| ())
    });
    assert!(
        outside.is_err(),
        "a connect outside the cgroup reached something"
    );

    let v = up.status();
    assert_eq!(v["mode"], "status");
    assert_eq!(v["cgroup"], cg.rel());
    let svc = &v["services"][0];
    assert_eq!(
        (svc["name"].as_str(), svc["protocol"].as_str()),
        (Some("redis"), Some("tcp"))
    );
    let backs = svc["backends"].as_array().unwrap();
    assert_eq!(backs.len(), 2);
    for (b, want) in backs.iter().zip([&b1, &b2]) {
        assert_eq!(b["addr"], want.addr.to_string());
        assert_eq!(b["connections"], 5, "{v}");
        assert_eq!(b["health"], "up", "{v}");
        // The backend also accepted the health probes.
        assert!(want.accepted.load(Ordering::SeqCst) >= 5);
    }
    assert_eq!(v["translated"], 10);
    // Kernel 6.18 has every feature; each was probed.
    let features = v["features"].as_array().unwrap();
    assert_eq!(features.len(), 12, "{v}");
    for f in features {
        assert_eq!(f["present"], true, "{f}");
    }
    // The table, as ipvsadm -Ln --stats shows one.
    let out = up.ask(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.contains(&format!("TCP  {VIP}")), "{text}");
    assert!(text.contains(&format!("  -> {}", b1.addr)), "{text}");
    assert!(text.contains("bpf_sock_destroy"), "{text}");

    // A dead backend leaves the set; status says so.
    b1.kill();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let v = up.status();
        if v["services"][0]["backends"][0]["health"] == "down" {
            assert!(v["services"][0]["backends"][0]["downs"].as_u64() >= Some(1));
            break;
        }
        assert!(Instant::now() < until, "not marked down in 20 s: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let socket = up.socket.clone();
    let (st, stdout, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    schema::check(&schema::load("balance-status"), &v, "balance-status");
    assert_eq!(
        (v["mode"].as_str(), v["interrupted"].as_bool()),
        (Some("up"), Some(true))
    );
    assert_all_gone(&progs, &maps);
    assert!(!socket.exists(), "the control socket is left behind");
    // No up running: status says so in one line, exit 1.
    let out = Command::new(tcpkit())
        .args(["balance", "status", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no balance up is running"), "{err}");
}

#[test]
fn up_bad_config_gives_one_line_and_attaches_nothing() {
    let (_g, lab, cli, _srv, _link) = serial_pair("balupbad");
    let cg = test_cgroup("upbad");
    let config = lab.dir().join("lb.toml");
    let socket = lab.dir().join("bad.sock");
    let cases: [(&str, &str); 8] = [
        ("[[service]]\nvip = \"198.19.0.1:80\"\nbackends = [\n", "lb.toml:3:13: "),
        ("[[service]]\nvip = 80\n", "lb.toml:2:7: "),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nbackends = [{ addr = \"198.19.0.1:80\" }]\n",
            "service 'web': backend 198.19.0.1:80: the same address as the VIP",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nbackends = [{ addr = \"198.18.0.2:80\" }, { addr = \"198.18.0.2:80\" }]\n",
            "service 'web': backend 198.18.0.2:80: given twice",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nbackends = [{ addr = \"[fd00:18::2]:80\" }]\n",
            "service 'web': backend [fd00:18::2]:80: not the same address family",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:0\"\n",
            "service 'web': vip 198.19.0.1:0: port 0",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:65536\"\n",
            "service 'web': vip '198.19.0.1:65536': not an IP:PORT",
        ),
        (
            "[[service]]\nname = \"web\"\nvip = \"198.19.0.1:80\"\nalgorithm = \"fastest\"\n",
            "service 'web': algorithm 'fastest'",
        ),
    ];
    let run = |cgroup: &str, socket: &Path| {
        let out = cli
            .command(&up_argv(&config, cgroup, socket))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (body, want) in cases {
        write_config(&config, body);
        let (code, err) = run(cg.rel(), &socket);
        // The file --config names cannot be used: a usage error (issue 24).
        assert_eq!(code, Some(2), "{body}: {err}");
        assert!(err.contains("--config "), "{body}: {err}");
        assert_eq!(err.lines().count(), 1, "{body}: {err}");
        assert!(err.starts_with("tcpkit balance: "), "{body}: {err}");
        assert!(err.contains(want), "{body}: {err}");
        assert!(
            attached(cg.path()).0.is_empty(),
            "{body}: something attached"
        );
        assert!(!socket.exists(), "{body}: a socket was made");
    }
    // A cgroup that does not exist: one line naming it.
    write_config(
        &config,
        &rr_config(&["198.18.0.2:80".parse().unwrap()], false),
    );
    let (code, err) = run("/tcpkit-no-such-cgroup", &socket);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--cgroup /tcpkit-no-such-cgroup: no such cgroup"),
        "{err}"
    );
    // A second up on a socket where one answers: refused before attaching anything.
    let first = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    let sock = first.socket.clone();
    let (code, err) = run(cg.rel(), &sock);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another balance up answers there"), "{err}");
    let (progs, maps) = attached(cg.path());
    assert_eq!(progs.len(), 5, "the second up attached");
    // SIGKILL: the links and maps go with the process; the socket file stays, and the next
    // up on that path finds nothing answering there and takes it over.
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert_all_gone(&progs, &maps);
    assert!(first.socket.exists());
    let log = lab.dir().join("again.err");
    let mut again = cli
        .command(&up_argv(&config, cg.rel(), &sock))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("status: tcpkit balance status")
    {
        assert!(
            Instant::now() < until,
            "up over a stale socket: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = first.status();
    assert_eq!(v["mode"], "status");
    // SAFETY: kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(again.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(again.wait().unwrap().code(), Some(0));
}

#[test]
fn reload_under_load_breaks_nothing_and_moves_new_connections() {
    let (_g, lab, cli, srv, _link) = serial_pair("balrl");
    let (a, b, c) = (
        holding_backend(&srv),
        holding_backend(&srv),
        holding_backend(&srv),
    );
    let cg = test_cgroup("reload");
    let config = lb_config(&lab, &[a, b], false);
    let up = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    let (phase, stop, start) = (
        lab.dir().join("phase2"),
        lab.dir().join("stop"),
        lab.dir().join("start"),
    );
    let hold = 10;
    let client = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_LOOP_ENV,
        &format!(
            "{VIP};{hold};{};{};{}",
            phase.display(),
            stop.display(),
            start.display()
        ),
        "loop_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    client.wait_for("HELD", 20);
    let count = |tag: &str| client.log().lines().filter(|l| l.starts_with(tag)).count();
    let wait_count = |tag: &str, n: usize| {
        let until = Instant::now() + Duration::from_secs(30);
        while count(tag) < n {
            assert!(
                Instant::now() < until,
                "fewer than {n} {tag} lines in 30 s:\n{}",
                client.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_count("C1 ", 50);

    // {A, B} -> {B, C} while the client connects in a loop: `reload` answers once the new
    // set is in the kernel, so every connect begun after it must land on B or C.
    write_config(&config, &rr_config(&[b, c], false));
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    std::fs::write(&phase, "").unwrap();
    wait_count("C2 ", 100);
    // A bad file by SIGHUP: refused with its line, the running set stays.
    write_config(
        &config,
        "[[service]]\nvip = \"198.19.0.1:6379\"\nbackends = [\n",
    );
    up.signal(libc::SIGHUP);
    let until = Instant::now() + Duration::from_secs(20);
    while !up.stderr().contains("SIGHUP: reload refused") {
        assert!(Instant::now() < until, "no refusal: {}", up.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(up.stderr().contains("lb.toml:3:13: "), "{}", up.stderr());
    // And by `reload`: exit 1, the file's line last on stderr.
    let out = up.ask(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("lb.toml:3:13: unclosed array"), "{err}");
    let before = count("C2 ");
    wait_count("C2 ", before + 50);
    std::fs::write(&stop, "").unwrap();
    client.wait_for("DONE", 30);

    let log = client.log();
    assert!(!log.contains("ERR"), "a connect failed:\n{log}");
    let ports = |tag: &str| -> Vec<u16> {
        log.lines()
            .filter_map(|l| l.strip_prefix(tag))
            .map(|p| p.trim().parse().unwrap())
            .collect()
    };
    let (p1, p2) = (ports("C1 "), ports("C2 "));
    assert!(
        p1.iter().all(|p| [a.port(), b.port()].contains(p)),
        "{p1:?}"
    );
    assert!(
        p2.iter().all(|p| [b.port(), c.port()].contains(p)),
        "a connect after the reload reached the removed backend: {p2:?}"
    );
    assert!(p2.contains(&b.port()) && p2.contains(&c.port()), "{p2:?}");
    // The held connections, half of them on A (removed), all still carry data.
    let held: Vec<&str> = log.lines().filter(|l| l.starts_with("HOLD ")).collect();
    assert_eq!(held.len(), hold, "{log}");
    assert!(
        held.iter().all(|l| l.starts_with(&format!("HOLD {VIP} "))),
        "{log}"
    );
    let on_a = held
        .iter()
        .filter(|l| l.ends_with(&format!(" {}", a.port())))
        .count();
    assert_eq!(on_a, hold / 2, "{log}");
    let alive = log.lines().filter(|l| l.starts_with("ALIVE ")).count();
    assert_eq!(alive, hold, "an established connection broke:\n{log}");

    let v = up.status();
    assert_eq!(
        (v["reloads"].as_u64(), v["reloads_refused"].as_u64()),
        (Some(1), Some(2))
    );
    let backs: Vec<String> = v["services"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["addr"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(backs, [b.to_string(), c.to_string()]);
    // B kept its counter across the reload; C's counts only what came after.
    let conns_of = |i: usize| {
        v["services"][0]["backends"][i]["connections"]
            .as_u64()
            .unwrap()
    };
    let b_total = (p1.iter().chain(&p2).filter(|p| **p == b.port()).count()
        + held
            .iter()
            .filter(|l| l.ends_with(&format!(" {}", b.port())))
            .count()) as u64;
    assert_eq!(conns_of(0), b_total, "{v}");
    assert_eq!(
        conns_of(1),
        p2.iter().filter(|p| **p == c.port()).count() as u64,
        "{v}"
    );
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

#[test]
fn up_metrics_serve_prometheus_and_survive_hostile_peers() {
    let (_g, lab, cli, srv, _link) = serial_pair("balmet");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let cg = test_cgroup("metrics");
    let config = lb_config(&lab, &[b1.addr, b2.addr], true);
    let up = Up::start(&lab, &cli, &config, cg.rel(), &["--metrics", "127.0.0.1:0"]);
    let err = up.stderr();
    let url = err
        .lines()
        .find_map(|l| l.strip_prefix("tcpkit balance: metrics on "))
        .unwrap_or_else(|| panic!("no metrics address: {err}"))
        .to_string();
    let addr: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();

    // Hostile peers first: silent connections and an oversize head.
    let silent: Vec<TcpStream> =
        cli.enter(|| (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect());
    let oversize = cli.enter(|| {
        let mut s = TcpStream::connect(addr).unwrap();
        let head = format!("GET /metrics HTTP/1.0\r\nX: {}\r\n\r\n", "a".repeat(9000));
        // The responder answers 431 at 8 KiB and may close before the rest is read.
        let _ = s.write_all(head.as_bytes());
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut answer);
        answer
    });
    // Balancing goes on meanwhile.
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 6);
    assert_eq!(got.len(), 6, "{log}");
    assert!(oversize.starts_with("HTTP/1.0 431"), "{oversize}");

    // curl, as a scraper would: served beside the silent peers, which wait for their 2 s.
    let out = cli
        .command(&["curl", "-sS", "--max-time", "30", "-D", "-", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.starts_with("HTTP/1.0 200 OK"), "{text}");
    assert!(text.contains("text/plain; version=0.0.4"), "{text}");
    for b in [&b1, &b2] {
        let labels = format!(
            "{{service=\"redis\",vip=\"{VIP}\",protocol=\"tcp\",backend=\"{}\"}}",
            b.addr
        );
        assert!(
            text.contains(&format!(
                "tcpkit_balance_backend_connections_total{labels} 3\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("tcpkit_balance_backend_up{labels} 1\n")),
            "{text}"
        );
    }
    assert!(
        text.contains("\ntcpkit_balance_reloads_total 0\n"),
        "{text}"
    );
    assert!(
        text.contains("\ntcpkit_balance_trace_lost_total 0\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE tcpkit_balance_backend_probes_total counter\n"),
        "{text}"
    );
    // Every sample has its TYPE line and a value that parses.
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let (name, v) = l.rsplit_once(' ').unwrap();
        let name = name.split('{').next().unwrap();
        assert!(v.parse::<f64>().is_ok(), "{l}");
        assert!(body.contains(&format!("# TYPE {name} ")), "{l}");
    }
    // Anything but GET /metrics is refused.
    let out = cli
        .command(&[
            "curl",
            "-sS",
            "--max-time",
            "30",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "405", "{out:?}");
    drop(silent);
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}
