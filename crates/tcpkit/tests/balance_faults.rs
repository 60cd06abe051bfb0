//! Issue 29, balance: faults, hostile inputs and what stays after a crash. `up --pin`
//! restarted (SIGKILL or SIGTERM, then the same command) adopts the pinned balancer with a
//! client connecting in a loop across both restarts; a VIP whose every backend flaps refuses
//! while none is up and never lets a connect through to itself; a FIFO as the configuration,
//! a 1 ns health interval, a v4-mapped VIP and a control socket that never answers are each
//! refused or bounded; a SIGKILLed `up` leaves nothing but the pins it was asked for.

use super::*;

/// A bpf filesystem of the test's own, and where balance pins in it.
fn bpffs(lab: &Lab) -> (tcpkit_lab::Bpffs, PathBuf) {
    let fs = tcpkit_lab::Bpffs::mount(lab.dir()).unwrap_or_else(|e| panic!("{e}"));
    let pin = fs.path().join("tcpkit").join("balance");
    (fs, pin)
}

/// The loop client (clients.rs) connecting to VIP, with its phase, stop and start files.
struct Looper {
    client: Client,
    phase: PathBuf,
    stop: PathBuf,
}

impl Looper {
    fn start(lab: &Lab, host: &Host, cg: &Cgroup) -> Looper {
        let (phase, stop, start) = (
            lab.dir().join("phase2"),
            lab.dir().join("stop"),
            lab.dir().join("start"),
        );
        let spec = format!(
            "{VIP};0;{};{};{}",
            phase.display(),
            stop.display(),
            start.display()
        );
        let client = Client::start(
            lab,
            host,
            cg,
            CLIENT_LOOP_ENV,
            &spec,
            "loop_client_in_cgroup",
        );
        std::fs::write(&start, "").unwrap();
        client.wait_for("HELD", 20);
        Looper {
            client,
            phase,
            stop,
        }
    }

    fn count(&self, tag: &str) -> usize {
        let log = self.client.log();
        log.lines().filter(|l| l.starts_with(tag)).count()
    }

    /// Waits for `n` more lines starting with `tag` than there are now.
    fn more(&self, tag: &str, n: usize) {
        let want = self.count(tag) + n;
        let until = Instant::now() + Duration::from_secs(20);
        while self.count(tag) < want {
            assert!(
                Instant::now() < until,
                "fewer than {want} {tag} lines in 20 s:\n{}",
                self.client.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the loop; its log.
    fn finish(self) -> String {
        std::fs::write(&self.stop, "").unwrap();
        self.client.wait_for("DONE", 20);
        self.client.log()
    }
}

/// The backend ports of the `C1 `/`C2 ` lines (`tag`) of a loop client's log.
fn ports(log: &str, tag: &str) -> Vec<u16> {
    log.lines()
        .filter_map(|l| l.strip_prefix(tag))
        .map(|p| p.trim().parse().unwrap())
        .collect()
}

fn connections(v: &Value, backend: usize) -> u64 {
    v["services"][0]["backends"][backend]["connections"]
        .as_u64()
        .unwrap()
}

#[test]
fn pinned_up_restarted_adopts_the_pins_and_drops_no_connect() {
    let (_g, lab, cli, srv, _link) = serial_pair("balfadopt");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let cg = test_cgroup("fadopt");
    let (_fs, pin_dir) = bpffs(&lab);
    let pin = pin_dir.to_str().unwrap();
    let config = lb_config(&lab, &[b1.addr, b2.addr], true);
    let socket = lab.dir().join("up.sock");
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &["--pin", pin]);
    let (progs, maps) = attached(cg.path());
    let looper = Looper::start(&lab, &cli, &cg);
    looper.more("C1 ", 20);
    // An upgrade by SIGKILL: the pins balance alone meanwhile, then the same command again.
    up.signal(libc::SIGKILL);
    drop(up);
    looper.more("C1 ", 20);
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &["--pin", pin]);
    assert!(
        up.stderr().contains("adopted the balancer pinned in"),
        "{}",
        up.stderr()
    );
    // The maps were adopted, not made afresh: the connects before the restart still count.
    let v = up.status();
    assert!(connections(&v, 0) + connections(&v, 1) >= 40, "{v}");
    let (progs2, maps2) = attached(cg.path());
    assert_eq!(
        progs2.len(),
        progs.len(),
        "a second set of programs attached"
    );
    looper.more("C1 ", 20);
    // And by SIGTERM (the pins stay).
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    looper.more("C1 ", 20);
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &["--pin", pin]);
    looper.more("C1 ", 20);
    let log = looper.finish();
    assert!(
        !log.contains("ERR"),
        "a connect failed across the restarts:\n{log}"
    );
    let p = ports(&log, "C1 ");
    assert!(
        p.iter()
            .all(|p| [b1.addr.port(), b2.addr.port()].contains(p)),
        "{p:?}"
    );
    assert!(p.len() >= 100, "{}", p.len());
    // It goes on health-checking: a backend that dies leaves the adopted set.
    b1.kill();
    status_until(&up, 5, "b1 down", |v| {
        v["services"][0]["backends"][0]["health"] == "down"
    });
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 4);
    assert_eq!(got, vec![(VIP.to_string(), b2.addr.port()); 4], "{log}");
    // The sets are read back from the pins: b1, out of the pinned set, stays out when the
    // next up adopts them (until --rise probes pass), rather than starting up.
    up.signal(libc::SIGKILL);
    drop(up);
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &["--pin", pin]);
    // Down, and never gone down in this process (a probe may have failed since: its reason
    // then replaces "out of the pinned set when its pins were adopted").
    let b = &up.status()["services"][0]["backends"][0];
    assert_eq!(
        (&b["health"], &b["downs"]),
        (&"down".into(), &0.into()),
        "{b}"
    );
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 4);
    assert_eq!(got, vec![(VIP.to_string(), b2.addr.port()); 4], "{log}");
    let (progs3, maps3) = attached(cg.path());
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let all = |a: Vec<u64>, b: Vec<u64>, c: Vec<u64>| -> Vec<u64> {
        a.into_iter().chain(b).chain(c).collect()
    };
    assert_all_gone(&all(progs, progs2, progs3), &all(maps, maps2, maps3));
}

#[test]
fn a_vip_whose_every_backend_flaps_refuses_and_never_connects_to_itself() {
    let (_g, lab, cli, srv, _link) = serial_pair("balfflap");
    let mut bs = vec![backend(&srv), backend(&srv)];
    let addrs: Vec<SocketAddr> = bs.iter().map(|b| b.addr).collect();
    let cg = test_cgroup("fflap");
    let config = lb_config(&lab, &addrs, true);
    let up = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    let looper = Looper::start(&lab, &cli, &cg);
    looper.more("C1 ", 10);
    let health =
        |v: &Value, want: &str| (0..2).all(|i| v["services"][0]["backends"][i]["health"] == want);
    for round in 0..2 {
        for b in &bs {
            b.kill();
        }
        status_until(&up, 5, "every backend down", |v| health(v, "down"));
        if round == 0 {
            std::fs::write(&looper.phase, "").unwrap();
        }
        looper.more("ERR2 ", 10);
        bs = addrs.iter().map(|a| backend_on(&srv, *a)).collect();
        status_until(&up, 5, "every backend up", |v| health(v, "up"));
        looper.more("C2 ", 10);
    }
    let refused = up.status()["refused"].as_u64().unwrap();
    let log = looper.finish();
    // A connect either reached a backend, or was refused: by the balancer while none was up,
    // by a dead backend's host before its probes caught up; or it reached a backend that
    // died before accepting it (reset). Never another errno: a connect let through to the
    // VIP, which is routed nowhere, would fail otherwise (unreachable, or a timeout).
    for l in log.lines().filter(|l| l.starts_with("ERR")) {
        assert!(
            l.ends_with(" 111") || l.ends_with("(os error 104)"),
            "{l}\n{log}"
        );
    }
    let ok: Vec<u16> = [ports(&log, "C1 "), ports(&log, "C2 ")].concat();
    assert!(
        ok.iter().all(|p| addrs.iter().any(|a| a.port() == *p)),
        "{ok:?}"
    );
    assert!(refused >= 20, "refused {refused}:\n{log}");
}

/// `argv` run in `host` to its end within `secs` (killed and failed otherwise): its exit
/// code and stderr.
fn up_exits(host: &Host, argv: &[&str], secs: u64) -> (Option<i32>, String) {
    let c = host
        .command(argv)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    ends_within(c, Duration::from_secs(secs), &format!("{argv:?}"))
}

/// Waits for `c` (its stderr piped) at most `limit`, else kills it and fails naming `what`:
/// its exit code and stderr.
fn ends_within(mut c: std::process::Child, limit: Duration, what: &str) -> (Option<i32>, String) {
    let until = Instant::now() + limit;
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > until {
            let _ = c.kill();
            let _ = c.wait();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
    (st.code(), err)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_fifo_as_the_configuration_is_refused_at_once_and_blocks_nothing() {
    let (_g, lab, cli, srv, _link) = serial_pair("balffifo");
    let b1 = backend(&srv);
    let cg = test_cgroup("ffifo");
    let fifo = lab.dir().join("fifo.toml");
    mkfifo(&fifo);
    let socket = lab.dir().join("fifo.sock");
    let argv = up_argv(&fifo, cg.rel(), &socket);
    let (code, err) = up_exits(&cli, &argv, 3);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("a FIFO, not a regular file"), "{err}");
    // A running up whose file becomes a FIFO: reload refuses it at once, status and SIGINT
    // are answered.
    let config = lb_config(&lab, &[b1.addr], false);
    let up = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    std::fs::remove_file(&config).unwrap();
    mkfifo(&config);
    let t = Instant::now();
    let out = up.ask(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("a FIFO, not a regular file"), "{err}");
    up.signal(libc::SIGHUP);
    status_until(&up, 2, "the SIGHUP reload refused", |v| {
        v["reloads_refused"] == 2
    });
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    up.signal(libc::SIGINT);
    let mut up = up;
    let until = Instant::now() + Duration::from_secs(3);
    while up.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < until,
            "SIGINT not honoured: {}",
            up.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        up.stderr().contains("SIGHUP: reload refused"),
        "{}",
        up.stderr()
    );
}

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(tcpkit()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `balance up` on a file of `body`, on a cgroup that does not exist: a file accepted by
/// mistake fails there (exit 1) rather than balancing the host's root cgroup.
fn up_on(dir: &Path, body: &str) -> (Option<i32>, String) {
    let config = dir.join("lb.toml");
    write_config(&config, body);
    let sock = dir.join("s.sock");
    run(&[
        "balance",
        "up",
        "--config",
        config.to_str().unwrap(),
        "--cgroup",
        "/tcpkit-test-no-such-cgroup",
        "--socket",
        sock.to_str().unwrap(),
    ])
}

#[test]
fn a_health_interval_below_the_minimum_is_a_usage_error() {
    let (code, err) = run(&[
        "balance",
        "run",
        "--vip",
        VIP,
        "--backend",
        "198.18.0.2:6379",
        "--health-interval",
        "1ns",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--health-interval 1ns: at least 10ms"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = up_on(
        dir.path(),
        &format!(
            "[[service]]\nvip = \"{VIP}\"\nbackends = [ {{ addr = \"198.18.0.2:6379\" }} ]\n\
             health = {{ interval = \"1ns\" }}\n"
        ),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("health-interval 1ns: at least 10ms"), "{err}");
}

#[test]
fn a_v4_mapped_vip_is_a_usage_error() {
    // Beside the same IPv4 VIP, or alone: an IPv6 socket's connect to ::ffff:IP is the IPv4
    // VIP's, so a v4-mapped one would never be used.
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = up_on(
        dir.path(),
        &format!(
            "[[service]]\nvip = \"{VIP}\"\nbackends = [ {{ addr = \"198.18.0.2:6379\" }} ]\n\
             [[service]]\nvip = \"{VIP_MAPPED}\"\nbackends = [ {{ addr = \"[fd00:18::2]:6379\" }} ]\n"
        ),
    );
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("a v4-mapped address is never matched")
            && err.contains("give it as 198.19.0.1:6379"),
        "{err}"
    );
    let (code, err) = run(&[
        "balance",
        "run",
        "--vip",
        VIP_MAPPED,
        "--backend",
        "[fd00:18::2]:6379",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("v4-mapped"), "{err}");
}

#[test]
fn status_against_a_socket_that_never_answers_honours_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mute.sock");
    // Listening, never accepting: connect succeeds (the backlog), no answer ever comes.
    let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut c = Command::new(tcpkit())
        .args(["balance", "status", "--socket", path.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        c.try_wait().unwrap().is_none(),
        "status ended before the signal"
    );
    // SAFETY: kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
    let (code, err) = ends_within(c, Duration::from_secs(2), "status after SIGTERM");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("interrupted"), "{err}");
}

#[test]
fn a_sigkilled_up_leaves_nothing_but_the_pins_it_was_asked_for() {
    let (_g, lab, cli, srv, _link) = serial_pair("balfkill");
    let b1 = backend(&srv);
    let cg = test_cgroup("fkill");
    let config = lb_config(&lab, &[b1.addr], true);
    let socket = lab.dir().join("k.sock");
    // Without --pin: links, programs and maps go with the process; the next up on the same
    // socket and cgroup starts as if none had run.
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &[]);
    let (progs, maps) = attached(cg.path());
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS);
    up.signal(libc::SIGKILL);
    drop(up);
    assert_all_gone(&progs, &maps);
    assert!(hooks_on(cg.path()).is_empty());
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &[]);
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 2);
    assert_eq!(got, vec![(VIP.to_string(), b1.addr.port()); 2], "{log}");
    let (progs, maps) = attached(cg.path());
    up.signal(libc::SIGKILL);
    drop(up);
    assert_all_gone(&progs, &maps);
    // With --pin: what stays is the pins (links and maps) and the programs they hold, no
    // second set; the next up --pin takes them over, and down removes everything.
    let (_fs, pin_dir) = bpffs(&lab);
    let pin = pin_dir.to_str().unwrap();
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &["--pin", pin]);
    let (progs, maps) = attached(cg.path());
    up.signal(libc::SIGKILL);
    drop(up);
    assert_eq!(attached(cg.path()).0, progs);
    let mut pins: Vec<String> = std::fs::read_dir(&pin_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pins.sort();
    assert!(
        pins.iter()
            .all(|p| p.starts_with("link_tk_") || p.starts_with("map_")),
        "{pins:?}"
    );
    assert_eq!(
        pins.iter().filter(|p| p.starts_with("link_")).count(),
        TCP_HOOKS.len(),
        "{pins:?}"
    );
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &["--pin", pin]);
    let (progs2, maps2) = attached(cg.path());
    assert_eq!(progs2.len(), progs.len());
    up.signal(libc::SIGKILL);
    drop(up);
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let progs: Vec<u64> = progs.into_iter().chain(progs2).collect();
    let maps: Vec<u64> = maps.into_iter().chain(maps2).collect();
    assert_all_gone(&progs, &maps);
    assert!(!pin_dir.exists());
}
