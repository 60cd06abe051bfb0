//! `tcpkit balance run ... -- CMD`: the algorithms, IPv6 and v4-mapped VIPs, health checks,
//! UDP through the VIP, --trace, bad input, and that nothing stays attached afterwards.

use super::*;

#[test]
fn run_round_robin_alternates_shows_the_vip_and_leaves_nothing() {
    let (_g, mut lab, cli, srv, _link) = serial_pair("balrr");
    let (b1, b2) = (backend(&srv), backend(&srv));
    assert_ne!(b1.addr.port(), b2.addr.port());
    let go = lab.dir().join("go");
    let args = vip_args(VIP, &[&b1, &b2], &["--algorithm", "round-robin"]);
    let p = spawn_run(&mut lab, &cli, &args, &format!("{VIP};20;{}", go.display()));
    wait_for(&p, "READY", 20);

    // While it runs: the eight programs attached to its cgroup (--vip balances TCP and UDP
    // alike by default), found by the kernel's own query.
    let cg = cgroup_of(p.pid());
    let (progs, maps) = attached(&cg);
    assert_eq!(progs.len(), 9, "programs on {}: {progs:?}", cg.display());
    assert_eq!(hooks_on(&cg), ALL_HOOKS, "{}", cg.display());
    assert!(maps.len() >= 3, "maps {maps:?}");
    // A process outside the cgroup (this test, in the same host) is not translated: the VIP
    // is routed nowhere.
    let outside = cli.enter(|| {
        TcpStream::connect_timeout(&VIP.parse().unwrap(), Duration::from_secs(2)).map(|_| ())
    });
    assert!(
        outside.is_err(),
        "a connect outside the cgroup reached something"
    );

    let log = go_and_end(&p, &go);
    let c = conns(&log);
    assert_eq!(c.len(), 20, "{log}");
    for (i, (peer, port)) in c.iter().enumerate() {
        assert_eq!(peer, VIP, "getpeername of connect {i}");
        if i > 0 {
            assert_ne!(
                *port,
                c[i - 1].1,
                "round-robin repeated a backend at {i}: {c:?}"
            );
        }
    }
    assert_eq!(b1.accepted.load(Ordering::SeqCst), 10);
    assert_eq!(b2.accepted.load(Ordering::SeqCst), 10);
    assert!(
        log.contains(&format!("{}          10 connects", b1.addr)) || log.contains("10 connects"),
        "{log}"
    );
    assert!(log.contains("Connects: 20 translated, 0 refused"), "{log}");
    assert!(!cg.exists(), "{} left behind", cg.display());
    assert_all_gone(&progs, &maps);
}

#[test]
fn run_random_within_a_binomial_bound_json_report() {
    let (_g, _lab, cli, srv, _link) = serial_pair("balrnd");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let args = vip_args(VIP, &[&b1, &b2], &["--json"]);
    let n = 400;
    let argv = argv(&refs(&args), &format!("{VIP};{n};"));
    let (stdout, stderr) = output_ok(&cli, &argv, "");
    // --json: stdout is the report alone; the command's lines went to stderr.
    let v = report(&stdout);
    let c = conns(&stderr);
    assert_eq!(c.len(), n, "{stderr}");
    assert!(c.iter().all(|(peer, _)| peer == VIP));
    let k = b1.accepted.load(Ordering::SeqCst) as i64;
    assert_eq!(k + b2.accepted.load(Ordering::SeqCst) as i64, n as i64);
    // Binomial(400, 1/2): sd 10; 5 sd either side fails once in ~1.7 million runs.
    assert!((150..=250).contains(&k), "backend 1 got {k} of {n}");
    let picks: Vec<i64> = v["services"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["connects"].as_i64().unwrap())
        .collect();
    assert_eq!(
        picks,
        [k, n as i64 - k],
        "the report's counts are the backends' own"
    );
    assert_eq!(v["translated"], n);
    assert!(v["getpeername_vip"].as_u64().unwrap() >= n as u64);
    assert_eq!(
        v["private_mount"], true,
        "under ip netns exec cgroup2 is mounted privately"
    );
}

#[test]
fn run_no_backend_refuses_and_exits_with_the_commands_status() {
    let (_g, _lab, cli, _srv, _link) = serial_pair("balno");
    let argv = argv(&["--vip", VIP], &format!("{VIP};3;"));
    let (stdout, stderr) = output_ok(&cli, &argv, "");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("ERR "))
            .collect::<Vec<_>>(),
        ["ERR 111"; 3],
        "ECONNREFUSED for each connect: {stdout}"
    );
    assert!(stderr.contains("0 translated, 3 refused"), "{stderr}");
    for (cmd, want) in [("exit 7", 7), ("kill -TERM $$", 143)] {
        let out = cli
            .command(&[
                tcpkit(),
                "balance",
                "run",
                "--vip",
                VIP,
                "-q",
                "--",
                "sh",
                "-c",
                cmd,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(want), "{cmd}: {out:?}");
        assert!(out.stderr.is_empty(), "-q: {out:?}");
    }
}

#[test]
fn nothing_stays_attached_after_sigterm_or_sigkill() {
    let (_g, mut lab, cli, srv, _link) = serial_pair("balsig");
    let b1 = backend(&srv);
    let go = lab.dir().join("never");
    // --protocol tcp: the UDP hooks stay off, which the kernel's query shows.
    let args = vip_args(VIP, &[&b1], &["--protocol", "tcp"]);
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        let p = spawn_run(&mut lab, &cli, &args, &format!("{VIP};1;{}", go.display()));
        wait_for(&p, "READY", 20);
        let cg = cgroup_of(p.pid());
        let (progs, maps) = attached(&cg);
        assert_eq!(hooks_on(&cg), TCP_HOOKS, "{}", cg.display());
        assert_eq!(progs.len(), 5, "{}", cg.display());
        // To balance alone, not its process group: the command must learn of it from balance.
        // SAFETY: kill(2) on a child of this test, still running.
        assert_eq!(unsafe { libc::kill(p.pid() as i32, sig) }, 0);
        let st = p
            .wait_timeout(Duration::from_secs(15))
            .unwrap()
            .expect("balance ends");
        assert_all_gone(&progs, &maps);
        if sig == libc::SIGTERM {
            // Forwarded to the command, which the signal ended: 128 + 15, and the report.
            assert_eq!(st.code(), Some(143), "{}", p.log());
            assert!(p.log().contains("killed by signal 15"), "{}", p.log());
            assert!(!cg.exists(), "{} left behind", cg.display());
        } else {
            // The command was told by PR_SET_PDEATHSIG and is gone too; its empty cgroup is
            // swept by the next run.
            let until = Instant::now() + Duration::from_secs(10);
            while std::fs::read_to_string(cg.join("cgroup.events"))
                .is_ok_and(|t| t.contains("populated 1"))
            {
                assert!(Instant::now() < until, "the command outlived balance");
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = cli
                .command(&[tcpkit(), "balance", "run", "--vip", VIP, "-q", "--", "true"])
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{out:?}");
            assert!(!cg.exists(), "{} not swept by the next run", cg.display());
        }
    }
}

#[test]
fn run_ipv6_and_v4_mapped() {
    let (_g, _lab, cli, srv, _link) = serial_pair("bal6");
    let (v6a, v6b) = (
        backend_on(&srv, SocketAddr::from((SRV6, 0))),
        backend_on(&srv, SocketAddr::from((SRV6, 0))),
    );
    let (v4a, v4b) = (backend(&srv), backend(&srv));
    // An IPv6 VIP over IPv6 backends; the IPv4 VIP asked for as ::ffff:198.19.0.1 by an
    // IPv6 socket, over IPv4 backends: getpeername shows each as the application named it.
    for (vip, asked, b) in [(VIP6, VIP6, [&v6a, &v6b]), (VIP, VIP_MAPPED, [&v4a, &v4b])] {
        let args = vip_args(vip, &b, &["--algorithm", "round-robin"]);
        let argv = argv(&refs(&args), &format!("{asked};6;"));
        let (stdout, stderr) = output_ok(&cli, &argv, "");
        let c = conns(&stdout);
        assert_eq!(c.len(), 6, "{vip}: {stdout}");
        let asked: SocketAddr = asked.parse().unwrap();
        for (i, (peer, port)) in c.iter().enumerate() {
            assert_eq!(*peer, asked.to_string(), "getpeername of connect {i}");
            assert_eq!(*port, b[i % 2].addr.port(), "{vip}: connect {i}: {c:?}");
        }
        assert!(b.iter().all(|b| b.accepted.load(Ordering::SeqCst) == 3));
        assert!(stderr.contains("Connects: 6 translated"), "{stderr}");
    }
}

/// Lets the command waiting for the file `go` go on (the file appears), and waits for balance
/// to end with it (20 s at most) with exit 0: its log.
fn go_and_end(p: &tcpkit_lab::Proc, go: &Path) -> String {
    std::fs::write(go, "").unwrap();
    let st = p
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("balance ends with its command");
    let log = p.log();
    assert_eq!(st.code(), Some(0), "{log}");
    log
}

/// `tcpkit balance run ARGS -- client N`, to completion; the (peer, backend port) per connect.
pub(super) fn run_client(cli: &Host, args: &[String], n: usize) -> Vec<(String, u16)> {
    let argv = argv(&refs(args), &format!("{VIP};{n};"));
    let (stdout, stderr) = output_ok(cli, &argv, "");
    let c = conns(&stdout);
    assert_eq!(c.len(), n, "{stdout}\n{stderr}");
    assert!(c.iter().all(|(peer, _)| peer == VIP));
    c
}

#[test]
fn run_weighted_and_maglev() {
    let (_g, _lab, cli, srv, _link) = serial_pair("balw");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let with = |extra: &[&str], w2: &str| -> Vec<String> {
        let weighted = format!("{}{w2}", b2.addr);
        let mut v = vip_args(VIP, &[&b1], &["--backend", &weighted]);
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    // Weighted 1:3 over 400 connects: Binomial(400, 3/4) for b2, sd 8.7; 5 sd either side.
    let n = 400;
    let c = run_client(&cli, &with(&["--algorithm", "weighted"], "@3"), n);
    let k = c.iter().filter(|(_, p)| *p == b2.addr.port()).count();
    assert!((257..=343).contains(&k), "weight 3 of 4 got {k} of {n}");

    // Maglev by client host: every connect of this client (unbound sockets, one namespace)
    // lands on the same backend, run after run while the set is the same.
    let args = with(&["--algorithm", "maglev", "--hash-key", "host"], "");
    let first = run_client(&cli, &args, 30);
    let again = run_client(&cli, &args, 30);
    let port = first[0].1;
    assert!(
        first.iter().chain(&again).all(|(_, p)| *p == port),
        "{first:?} {again:?}"
    );
    // Maglev by socket cookie: each socket placed on its own, so both backends are used
    // (all 60 on one: probability 2^-59).
    let c = run_client(
        &cli,
        &with(&["--algorithm", "maglev", "--hash-key", "cookie"], ""),
        60,
    );
    let k = c.iter().filter(|(_, p)| *p == b1.addr.port()).count();
    assert!(
        k > 0 && k < 60,
        "cookie-keyed maglev put {k} of 60 on one backend"
    );
}

#[test]
fn health_checks_take_a_dead_backend_out() {
    let (_g, mut lab, cli, srv, _link) = serial_pair("balhc");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let start = lab.dir().join("start");
    let args = vip_args(
        VIP,
        &[&b1, &b2],
        &[
            "--algorithm",
            "round-robin",
            "--health-interval",
            "100ms",
            "--health-timeout",
            "500ms",
            "--fall",
            "2",
        ],
    );
    let p = spawn_run(
        &mut lab,
        &cli,
        &args,
        &format!("{VIP};20;;{}", start.display()),
    );
    // Both probed and up for a while, then one backend dies.
    std::thread::sleep(Duration::from_millis(500));
    b1.kill();
    let killed = Instant::now();
    // Two refused probes 100 ms apart take it out: 0.3 s at most unloaded; 1.5 s here.
    std::thread::sleep(Duration::from_millis(1500));
    let log = go_and_end(&p, &start);
    assert!(
        !log.contains("ERR "),
        "a connect failed after the backend was out: {log}"
    );
    let c = conns(&log);
    assert_eq!(c.len(), 20, "{log}");
    assert!(
        c.iter().all(|(_, port)| *port == b2.addr.port()),
        "connects reached the dead backend {:.1} s after it died: {c:?}",
        killed.elapsed().as_secs_f64()
    );
    let line = log
        .lines()
        .find(|l| l.trim_start().starts_with(&b1.addr.to_string()))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("down at end") && line.contains("down 1 time"),
        "{line}"
    );
}

#[test]
fn udp_dns_through_the_vip_reaches_unbound_and_answers_from_the_vip_v4_v6_mapped() {
    let _g = serial();
    unbound::require();
    let (mut lab, cli, srv, _link) = Lab::pair("baludp").unwrap_or_else(|e| panic!("{e}"));
    let mut backends = Vec::new();
    for (i, (ip, port)) in [
        (IpAddr::V4(SRV), 5301u16),
        (IpAddr::V4(SRV), 5302),
        (IpAddr::V6(SRV6), 5303),
    ]
    .iter()
    .enumerate()
    {
        let dir = lab.dir().join(format!("unbound{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = unbound::write_conf(&dir, *ip, *port, 10);
        let argv = unbound::argv(&conf);
        srv.spawn(&mut lab, &format!("unbound{i}"), &refs(&argv))
            .unwrap_or_else(|e| panic!("{e}"));
        backends.push(SocketAddr::new(*ip, *port));
    }
    // Ready when each answers over TCP (the lab's client host reaches it directly).
    for addr in &backends {
        let until = Instant::now() + Duration::from_secs(15);
        cli.enter(|| {
            while TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_err() {
                assert!(Instant::now() < until, "unbound on {addr} not up in 15 s");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    let exe = std::env::current_exe().unwrap();
    // (VIP, as the client asks for it, its backends, picks expected per backend): IPv4; the
    // IPv4 VIP through IPv6 sockets (v4-mapped, sendmsg6); IPv6.
    let cases = [
        ("198.19.0.1:53", "198.19.0.1:53", &backends[..2], vec![2, 1]),
        (
            "198.19.0.1:53",
            "[::ffff:198.19.0.1]:53",
            &backends[..2],
            vec![2, 1],
        ),
        (
            "[fd00:19::1]:53",
            "[fd00:19::1]:53",
            &backends[2..],
            vec![3],
        ),
    ];
    for (vip, asked, bs, want) in cases {
        let mut argv = vec![
            tcpkit().to_string(),
            "balance".into(),
            "run".into(),
            "--vip".into(),
            vip.into(),
        ];
        for b in bs {
            argv.extend(["--backend".to_string(), b.to_string()]);
        }
        argv.extend([
            "--algorithm".into(),
            "round-robin".into(),
            "--json".into(),
            "--".into(),
            "env".into(),
            format!("{CLIENT_UDP_ENV}={asked}"),
            exe.display().to_string(),
        ]);
        argv.extend(helper_args("udp_client_in_cgroup"));
        let (stdout, stderr) = output_ok(&cli, &argv, &format!("{asked}: "));
        let v = report(&stdout);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("UDP")).collect();
        assert_eq!(lines.len(), 7, "{asked}: {stderr}");
        let asked: SocketAddr = asked.parse().unwrap();
        for l in &lines[..6] {
            // Answered by unbound (NOERROR, one A record), the reply's source the VIP as the
            // client named it.
            assert!(l.ends_with(&format!(" {asked} 0 1")), "{l}");
        }
        assert_eq!(lines[6], format!("UDPC {asked} {asked} 0 1"), "{stderr}");
        // Each unconnected socket stayed on one backend (one pick each; round-robin: one per
        // backend), the connected socket was sent on in turn.
        let picks: Vec<u64> = v["services"][0]["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["connects"].as_u64().unwrap())
            .collect();
        assert_eq!(picks, want, "{asked}: {stdout}");
        assert!(v["getpeername_vip"].as_u64().unwrap() >= 7, "{stdout}");
    }
}

#[test]
fn trace_prints_every_selection_with_its_pid() {
    let (_g, _lab, cli, srv, _link) = serial_pair("baltr");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let args = vip_args(
        VIP,
        &[&b1, &b2],
        &["--algorithm", "round-robin", "--trace", "--json"],
    );
    let argv = argv(&refs(&args), &format!("{VIP};4;"));
    let (stdout, stderr) = output_ok(&cli, &argv, "");
    let v = report(&stdout);
    assert_eq!(v["trace_lost"], 0);
    // `env` execs the client: the command's pid is the one that connects.
    let pid = v["command"]["pid"].as_u64().unwrap();
    let traced: Vec<&str> = stderr.lines().filter(|l| l.contains("] trace: ")).collect();
    let c = conns(&stderr);
    assert_eq!((traced.len(), c.len()), (4, 4), "{stderr}");
    for (t, (_, port)) in traced.iter().zip(&c) {
        let want = format!("trace: pid {pid} cgroup ");
        assert!(t.contains(&want), "{t}");
        assert!(
            t.ends_with(&format!("connect {VIP} -> {SRV}:{port}")),
            "{t} is not the backend that answered"
        );
    }
}

/// The command writes to the stderr `--trace` prints on, at the same time: every trace line
/// and every one of the command's lines arrives whole. Trace lines were written in two calls
/// (text, then newline), and a line of the command's landing between them ran the two together.
#[test]
fn trace_lines_stay_whole_while_the_command_writes_to_the_same_stderr() {
    let (_g, lab, cli, _srv, _link) = serial_pair("baltw");
    // Nothing listens there: each connect is refused at once, after balance chose it.
    let backend = format!("{SRV}:9");
    let (vip_ip, vip_port) = VIP.split_once(':').unwrap();
    // The connects start once the writer has written: a loaded machine can take longer to
    // start a python than 1000 refused connects take, and then nothing ran alongside them.
    let ready = lab.dir().join("writing");
    let ready = ready.display();
    let spam = format!(
        "import os\nos.write(2, b'command-line\\n')\nopen('{ready}', 'w').close()\n\
         while True:\n    os.write(2, b'command-line\\n')\n"
    );
    let connects = format!(
        "import os, socket, time\n\
         while not os.path.exists('{ready}'):\n\
         \x20   time.sleep(0.005)\n\
         for _ in range(1000):\n\
         \x20   s = socket.socket()\n\
         \x20   try:\n\
         \x20       s.connect(('{vip_ip}', {vip_port}))\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         \x20   s.close()\n"
    );
    // The writer is a process of its own, so it writes while the connecting one is in connect().
    let sh = "python3 -c \"$0\" & w=$!; python3 -c \"$1\"; rc=$?; kill $w; exit $rc";
    let argv = [
        tcpkit(),
        "balance",
        "run",
        "--vip",
        VIP,
        "--backend",
        &backend,
        "--trace",
        "--",
        "sh",
        "-c",
        sh,
        &spam,
        &connects,
    ];
    let out = cli.command(&argv).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        &stderr[stderr.len().saturating_sub(2000)..]
    );
    let want_end = format!(" connect {VIP} -> {backend}");
    let (mut traced, mut command) = (0, 0);
    for l in stderr.lines() {
        if l.contains("trace:") {
            assert!(
                l.starts_with('[') && l.contains("] trace: pid ") && l.ends_with(&want_end),
                "a trace line run together with another: {l:?}"
            );
            traced += 1;
        } else if l.contains("command-line") {
            assert_eq!(l, "command-line", "a command line cut into");
            command += 1;
        }
    }
    assert_eq!(
        traced, 1000,
        "every connect traced, each on a line of its own"
    );
    assert!(command > 0, "the command wrote while balance traced");
}

/// Each bad input: exit 2, one line naming the flag, nothing run; not root: exit 1, one line.
#[test]
fn bad_input_gives_one_line() {
    let cases: [(&[&str], &str); 8] = [
        (&["--vip", "198.19.0.1:0"], "--vip 198.19.0.1:0: port 0"),
        (
            &["--vip", "198.19.0.1:80", "--backend", "198.18.0.2:0"],
            "port 0",
        ),
        (
            &["--vip", "198.19.0.1:80", "--backend", "198.19.0.1:80"],
            "the same address as the VIP",
        ),
        (
            &[
                "--vip",
                "198.19.0.1:80",
                "--backend",
                "198.18.0.2:80",
                "--backend",
                "198.18.0.2:80",
            ],
            "given twice",
        ),
        (
            &["--vip", "198.19.0.1:80", "--backend", "[fd00:18::2]:80"],
            "address family",
        ),
        (&["--vip", "198.19.0.1:65536"], "not an IP:PORT"),
        (
            &["--vip", "198.19.0.1:80", "--backend", "198.18.0.2:80@2"],
            "weights above 1 need",
        ),
        (
            &["--vip", "198.19.0.1:80", "--hash-key", "cookie"],
            "--hash-key",
        ),
    ];
    let marker = std::env::temp_dir().join(format!("tcpkit-balance-bad-{}", std::process::id()));
    for (args, want) in cases {
        let out = Command::new(tcpkit())
            .args(["balance", "run"])
            .args(args)
            .args(["--", "touch", marker.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("tcpkit balance: ") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(!marker.exists(), "{args:?} ran the command");
    }
    // Not root (setpriv from util-linux): the kernel refuses the maps; one line says why.
    let _g = serial();
    let exe = std::env::temp_dir().join(format!("tcpkit-balance-nonroot-{}", std::process::id()));
    std::fs::copy(tcpkit(), &exe).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(["balance", "run", "--vip", "198.19.0.1:80", "--", "true"])
        .output()
        .expect("setpriv (util-linux)");
    let _ = std::fs::remove_file(&exe);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs root"), "{err}");
}
