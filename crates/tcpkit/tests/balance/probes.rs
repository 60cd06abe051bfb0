//! Application (send/expect) and UDP health probes, in `up`'s config and on `run`'s flags.

use super::*;
use tcpkit_lab::KillOnDrop;

/// redis-server in `host` on `addr`, ready (answers a connect from `from`) when this returns.
fn redis_on(lab: &mut Lab, host: &Host, from: &Host, addr: SocketAddr) {
    let argv = common::peer::redis_argv(addr);
    host.spawn(lab, &format!("redis{}", addr.port()), &refs(&argv))
        .unwrap_or_else(|e| panic!("{e}"));
    let until = Instant::now() + Duration::from_secs(15);
    from.enter(|| {
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < until, "redis on {addr} not up in 15 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

#[test]
fn application_probe_takes_out_a_backend_that_accepts_but_answers_wrongly() {
    let (_g, mut lab, cli, srv, _link) = serial_pair("balapp");
    let redis = SocketAddr::from((SRV, 6391));
    redis_on(&mut lab, &srv, &cli, redis);
    // Accepts every connection (a TCP connect probe would pass) and answers its port number.
    let wrong = backend(&srv);
    let cg = test_cgroup("app");
    let config = lab.dir().join("lb.toml");
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"redis\"\nvip = \"{VIP}\"\nalgorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{redis}\" }}, {{ addr = \"{}\" }} ]\n\
             health = {{ interval = \"100ms\", timeout = \"1s\", rise = 2, fall = 2, \
             send = 'PING\\r\\n', expect = \"+PONG\" }}\n",
            wrong.addr
        ),
    );
    let up = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    let v = status_until(&up, 20, "the wrong backend marked down", |v| {
        v["services"][0]["backends"][1]["health"] == "down"
    });
    let svc = &v["services"][0];
    assert_eq!(svc["probe"], "tcp-send-expect", "{v}");
    let (good, bad) = (&svc["backends"][0], &svc["backends"][1]);
    assert_eq!(
        (good["health"].as_str(), &good["down_reason"]),
        (Some("up"), &Value::Null),
        "{v}"
    );
    let why = bad["down_reason"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("reply \"") && why.ends_with("does not start with \"+PONG\""),
        "{v}"
    );
    // It accepted the probes: a connect probe would have kept it.
    assert!(wrong.accepted.load(Ordering::SeqCst) >= 2);

    // New connections all go to redis.
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_PING_ENV,
        &format!("{VIP};10;{}", start.display()),
        "ping_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("DONE", 30);
    let replies: Vec<String> = c
        .log()
        .lines()
        .filter(|l| l.starts_with("REPLY ") || l.starts_with("ERR "))
        .map(str::to_string)
        .collect();
    assert_eq!(replies, vec!["REPLY +PONG".to_string(); 10], "{}", c.log());
    let v = up.status();
    let b = &v["services"][0]["backends"];
    assert_eq!(
        (b[0]["connections"].as_u64(), b[1]["connections"].as_u64()),
        (Some(10), Some(0)),
        "{v}"
    );
    // The table says it too.
    let out = up.ask(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(probe tcp-send-expect)"), "{text}");
    assert!(text.contains("down: reply \""), "{text}");
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

/// A DNS query for www.example A, id 0x1234, as a probe's `send` (C-style escapes).
const DNS_PROBE: &str =
    "\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x03www\\x07example\\x00\\x00\\x01\\x00\\x01";

#[test]
fn udp_health_dns_probe_and_port_unreachable_with_a_real_unbound() {
    let _g = serial();
    unbound::require();
    let (mut lab, cli, srv, _link) = Lab::pair("baludph").unwrap_or_else(|e| panic!("{e}"));
    let live4 = SocketAddr::new(IpAddr::V4(SRV), 5311);
    let live6 = SocketAddr::new(IpAddr::V6(SRV6), 5312);
    // Nothing listens on these: the host answers ICMP port unreachable.
    let dead4 = SocketAddr::new(IpAddr::V4(SRV), 5399);
    let dead6 = SocketAddr::new(IpAddr::V6(SRV6), 5398);
    for (i, a) in [live4, live6].iter().enumerate() {
        let dir = lab.dir().join(format!("unbound{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = unbound::write_conf(&dir, a.ip(), a.port(), 10);
        srv.spawn(
            &mut lab,
            &format!("unbound{i}"),
            &refs(&unbound::argv(&conf)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let until = Instant::now() + Duration::from_secs(15);
        cli.enter(|| {
            while TcpStream::connect_timeout(a, Duration::from_millis(200)).is_err() {
                assert!(Instant::now() < until, "unbound on {a} not up in 15 s");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    let cg = test_cgroup("udph");
    let config = lab.dir().join("lb.toml");
    // dns: an application probe (a query; the reply must carry its id). dns6: none, so only
    // ICMP port unreachable fails a probe; once a second (the ICMP rate limit).
    write_config(
        &config,
        &format!(
            "[[service]]\nname = \"dns\"\nvip = \"198.19.0.1:53\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{live4}\" }}, {{ addr = \"{dead4}\" }} ]\n\
             health = {{ interval = \"200ms\", timeout = \"500ms\", rise = 2, fall = 2, \
             send = '{DNS_PROBE}', expect = '\\x12\\x34' }}\n\
             [[service]]\nname = \"dns6\"\nvip = \"[fd00:19::1]:53\"\nprotocol = \"udp\"\n\
             algorithm = \"round-robin\"\n\
             backends = [ {{ addr = \"{live6}\" }}, {{ addr = \"{dead6}\" }} ]\n\
             health = {{ interval = \"1s\", timeout = \"500ms\", rise = 2, fall = 2 }}\n"
        ),
    );
    let up = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    // UDP services: every hook is attached.
    assert_eq!(hooks_on(cg.path()), ALL_HOOKS, "{}", cg.path().display());
    assert_eq!(up.status()["hooks"].as_array().map(Vec::len), Some(9));
    let v = status_until(&up, 30, "both dead backends down", |v| {
        v["services"][0]["backends"][1]["health"] == "down"
            && v["services"][1]["backends"][1]["health"] == "down"
    });
    let (dns, dns6) = (&v["services"][0], &v["services"][1]);
    assert_eq!(dns["probe"], "udp-send-expect", "{v}");
    assert_eq!(dns6["probe"], "udp-port-unreachable", "{v}");
    for s in [dns, dns6] {
        assert_eq!(s["backends"][0]["health"], "up", "{v}");
        assert_eq!(s["backends"][0]["probes_failed"], 0, "{v}");
    }
    let why = dns["backends"][1]["down_reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        why == "ICMP port unreachable (ECONNREFUSED)" || why.starts_with("no reply within"),
        "{v}"
    );
    assert_eq!(
        dns6["backends"][1]["down_reason"], "ICMP port unreachable (ECONNREFUSED)",
        "{v}"
    );
    // Queries through the VIP (unconnected and connected sockets) all reach unbound.
    let start = lab.dir().join("start");
    let c = Client::start(
        &lab,
        &cli,
        &cg,
        CLIENT_UDP_ENV,
        &format!("198.19.0.1:53;{}", start.display()),
        "udp_client_in_cgroup",
    );
    std::fs::write(&start, "").unwrap();
    c.wait_for("UDPC", 30);
    let log = c.log();
    let answered = log
        .lines()
        .filter(|l| l.starts_with("UDP") && l.ends_with(" 198.19.0.1:53 0 1"))
        .count();
    assert_eq!(answered, 7, "{log}");
    let v = up.status();
    let b = &v["services"][0]["backends"];
    assert_eq!(b[1]["connections"], 0, "{v}");
    assert_eq!(b[0]["connections"], 3, "{v}");
    let (st, _, stderr) = up.stop();
    assert_eq!(st.code(), Some(0), "{stderr}");
}

#[test]
fn run_application_probe_flags_take_out_a_wrongly_answering_backend() {
    let (_g, mut lab, cli, srv, _link) = serial_pair("balappr");
    let redis = SocketAddr::from((SRV, 6392));
    redis_on(&mut lab, &srv, &cli, redis);
    let wrong = backend(&srv);
    let start = lab.dir().join("start");
    let exe = std::env::current_exe().unwrap();
    let mut argv = vec![
        tcpkit().to_string(),
        "balance".into(),
        "run".into(),
        "--vip".into(),
        VIP.into(),
        "--backend".into(),
        redis.to_string(),
        "--backend".into(),
        wrong.addr.to_string(),
        "--algorithm".into(),
        "round-robin".into(),
        "--health-interval".into(),
        "100ms".into(),
        "--fall".into(),
        "2".into(),
        "--health-send".into(),
        "PING\\r\\n".into(),
        "--health-expect".into(),
        "+PONG".into(),
        "--json".into(),
        "--".into(),
        "env".into(),
        format!("{CLIENT_PING_ENV}={VIP};10;{}", start.display()),
        exe.display().to_string(),
    ];
    argv.extend(helper_args("ping_client_in_cgroup"));
    let (out, err) = (lab.dir().join("run.out"), lab.dir().join("run.err"));
    let mut child = KillOnDrop(
        cli.command(&refs(&argv))
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap(),
    );
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    // Probes of one backend run one after another: its third connection comes after its
    // second probe failed, and that failure (fall 2) took it out before the next began.
    let until = Instant::now() + Duration::from_secs(20);
    while wrong.accepted.load(Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < until,
            "no third probe in 20 s: {}",
            read(&err)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&start, "").unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let st = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > until {
            panic!("balance run not done in 30 s: {}", read(&err));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = read(&err);
    assert_eq!(st.code(), Some(0), "{log}");
    let replies = log.lines().filter(|l| *l == "REPLY +PONG").count();
    assert_eq!(replies, 10, "{log}");
    let stdout = read(&out);
    let v = report(&stdout);
    let b = &v["services"][0]["backends"];
    assert_eq!(
        (b[0]["connects"].as_u64(), b[0]["up"].as_bool()),
        (Some(10), Some(true)),
        "{v}"
    );
    assert_eq!(
        (b[1]["connects"].as_u64(), b[1]["up"].as_bool()),
        (Some(0), Some(false)),
        "{v}"
    );
}
