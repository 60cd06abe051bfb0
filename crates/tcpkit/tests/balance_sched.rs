//! What ipvsadm users look for in `tcpkit balance` (issue 24, item 10): the sockets open on
//! each backend now (ActiveConn), least-connection scheduling, weight 0 to drain, a
//! persistence timeout, weighted round robin beside weighted random, a line on stderr per
//! health transition, and maglev hashing the client's port by default. A child module of
//! `balance` (declared there), so it shares its lab helpers.

use super::run::run_client;
use super::*;

/// The scripted client's variable: `VIP;CTLFILE`.
const SCHED_ENV: &str = "TCPKIT_BALANCE_TEST_SCHED_CLIENT";

/// Not a test of its own: a client in the balanced cgroup driven by the test through CTLFILE,
/// one command a line, each answered with `OK <n>` once done (n counts the lines done):
/// `open N` opens N connections to the VIP, keeping them (`OPEN <backend port>` each); `close
/// PORT` closes those on that backend; `ping` sends a line through each held connection
/// (`ALIVE <port>` when it comes back, `BROKEN <port>` otherwise); `quit` ends it.
#[test]
#[ignore = "helper process: run by the balance tests, inside their cgroup"]
fn sched_client_in_cgroup() {
    let spec = common::helper_env(SCHED_ENV);
    let (vip, ctl) = spec.split_once(';').unwrap();
    let vip: SocketAddr = vip.parse().unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    let mut held: Vec<(TcpStream, u16)> = Vec::new();
    let mut done = 0;
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        let text = std::fs::read_to_string(ctl).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if done >= lines.len() {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let (op, arg) = lines[done].split_once(' ').unwrap_or((lines[done], ""));
        match op {
            "open" => {
                for _ in 0..arg.parse::<usize>().unwrap() {
                    let s = TcpStream::connect_timeout(&vip, Duration::from_secs(5)).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut line = String::new();
                    BufReader::new(&s).read_line(&mut line).unwrap();
                    let port: u16 = line.trim().parse().unwrap();
                    writeln!(out, "OPEN {port}").unwrap();
                    held.push((s, port));
                }
            }
            "close" => {
                let port: u16 = arg.parse().unwrap();
                held.retain(|(_, p)| *p != port);
            }
            "ping" => {
                for (s, port) in &held {
                    let back = (|| -> std::io::Result<String> {
                        (&*s).write_all(b"ping\n")?;
                        let mut l = String::new();
                        BufReader::new(s).read_line(&mut l)?;
                        Ok(l)
                    })();
                    let word = if back.is_ok_and(|l| l == "ping\n") {
                        "ALIVE"
                    } else {
                        "BROKEN"
                    };
                    writeln!(out, "{word} {port}").unwrap();
                }
            }
            "quit" => {
                // Said before the sockets close, so the test waits for the exit itself.
                writeln!(out, "OK {}", done + 1).unwrap();
                out.flush().unwrap();
                return;
            }
            other => panic!("unknown command {other}"),
        }
        done += 1;
        writeln!(out, "OK {done}").unwrap();
        out.flush().unwrap();
    }
}

/// A [`sched_client_in_cgroup`] in `cg`, and the commands sent to it so far.
struct Scripted {
    client: Client,
    ctl: PathBuf,
    sent: usize,
}

impl Scripted {
    fn start(lab: &Lab, host: &Host, cg: &Cgroup, vip: &str) -> Scripted {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let ctl = lab.dir().join(format!("sched{n}.ctl"));
        std::fs::write(&ctl, "").unwrap();
        // It reads no command before the first is written, by then it is in the cgroup.
        let client = Client::start_helper(
            lab,
            host,
            cg,
            SCHED_ENV,
            &format!("{vip};{}", ctl.display()),
            common::helper_args(module_path!(), "sched_client_in_cgroup"),
        );
        Scripted {
            client,
            ctl,
            sent: 0,
        }
    }

    /// Sends `cmd` and waits for it to be done: the lines it printed.
    fn run(&mut self, cmd: &str) -> Vec<String> {
        let before = self.client.log().lines().count();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.ctl)
            .unwrap();
        writeln!(f, "{cmd}").unwrap();
        self.sent += 1;
        self.client.wait_for(&format!("OK {}\n", self.sent), 20);
        let log = self.client.log();
        log.lines()
            .skip(before)
            .filter(|l| !l.starts_with("OK "))
            .map(String::from)
            .collect()
    }

    /// `open N`: the backend port of each connection.
    fn open(&mut self, n: usize) -> Vec<u16> {
        self.run(&format!("open {n}"))
            .iter()
            .filter_map(|l| l.strip_prefix("OPEN ")?.parse().ok())
            .collect()
    }
}

/// A backend that keeps its connections and echoes lines (see [`hold`]).
fn holding(host: &Host) -> Backend {
    killable(host, SocketAddr::from((SRV, 0)), |s, port| {
        std::thread::spawn(move || hold(s, port));
    })
}

/// (active, connections) of each backend of the first service, by `status --json`.
fn active(up: &Up) -> Vec<(u64, u64)> {
    let v = up.status();
    v["services"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["active"].as_u64().unwrap_or_else(|| panic!("{v}")),
                b["connections"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The service of [`VIP`] over `backends` (address, weight) with `algorithm`, and `extra` lines.
fn config(algorithm: &str, backends: &[(SocketAddr, u32)], extra: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|(a, w)| format!("{{ addr = \"{a}\", weight = {w} }}"))
        .collect();
    format!(
        "[[service]]\nvip = \"{VIP}\"\nalgorithm = \"{algorithm}\"\nbackends = [ {} ]\n{extra}\n",
        list.join(", ")
    )
}

/// A `balance up` of [`config`] over holding backends in a fresh pair, and a scripted client
/// in its cgroup. Fields drop in order: the client and `up` before the lab.
struct Bed {
    c: Scripted,
    up: Up,
    path: PathBuf,
    b: Vec<Backend>,
    _cg: Cgroup,
    _link: Link,
    _srv: Host,
    _cli: Host,
    _lab: Lab,
    _g: std::sync::MutexGuard<'static, ()>,
}

/// A [`Bed`]: lab `tag`, `algorithm` over a holding backend per weight, `extra` lines.
fn bed(tag: &str, algorithm: &str, weights: &[u32], extra: &str) -> Bed {
    let (g, lab, cli, srv, link) = serial_pair(tag);
    let b: Vec<Backend> = weights.iter().map(|_| holding(&srv)).collect();
    let cg = test_cgroup(tag);
    let path = lab.dir().join("lb.toml");
    let set: Vec<(SocketAddr, u32)> = b
        .iter()
        .map(|x| x.addr)
        .zip(weights.iter().copied())
        .collect();
    write_config(&path, &config(algorithm, &set, extra));
    let up = Up::start(&lab, &cli, &path, cg.rel(), &[]);
    let c = Scripted::start(&lab, &cli, &cg, VIP);
    Bed {
        c,
        up,
        path,
        b,
        _cg: cg,
        _link: link,
        _srv: srv,
        _cli: cli,
        _lab: lab,
        _g: g,
    }
}

#[test]
fn active_conns_are_the_sockets_open_now_and_least_conn_fills_the_emptiest() {
    let mut t = bed("balac", "least-conn", &[1, 1], "");
    let Bed { c, up, b, .. } = &mut t;
    let b1 = &b[0];
    // Four held: two each (ties go in turn), all four open.
    let first = c.open(4);
    assert_eq!(first.len(), 4);
    assert_eq!(active(up), [(2, 2), (2, 2)], "{first:?}");
    // The two on b1 closed: b1 has none open, b2 two, while both were sent two.
    c.run(&format!("close {}", b1.addr.port()));
    assert_eq!(active(up), [(0, 2), (2, 2)]);
    // Least-conn sends the next two to the emptier b1 (round robin would alternate).
    let next = c.open(2);
    assert_eq!(next, [b1.addr.port(), b1.addr.port()], "{:?}", active(up));
    assert_eq!(active(up), [(2, 4), (2, 2)]);
    // The table shows ActiveConn beside Conns, as ipvsadm -Ln does.
    let out = up.ask(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ActiveConn") && text.contains(" lc "),
        "{text}"
    );
    // The client ends: every socket it had is counted off.
    c.run("quit");
    let _ = c.client.child.wait();
    assert_eq!(active(up), [(0, 4), (0, 2)]);
}

#[test]
fn weighted_least_conn_holds_open_sockets_in_proportion_to_the_weights() {
    let mut t = bed("balwlc", "wlc", &[1, 3], "");
    let Bed { c, up, .. } = &mut t;
    assert_eq!(c.open(8).len(), 8);
    // Eight held over weights 1:3: two and six, as ipvs wlc would hold them.
    assert_eq!(active(up), [(2, 2), (6, 6)]);
}

#[test]
fn weight_zero_drains_new_sockets_and_keeps_the_open_ones_through_reload() {
    let mut t = bed("baldrain", "round-robin", &[0, 1], "");
    let Bed { c, up, b, path, .. } = &mut t;
    let (b1, b2) = (&b[0], &b[1]);
    assert_eq!(up.status()["services"][0]["backends"][0]["weight"], 0);
    // b1 drained from the start: nothing goes there.
    assert_eq!(c.open(3), [b2.addr.port(); 3]);
    // Drain b2 and undrain b1 by reload: new sockets go to b1, b2's stay open and work.
    write_config(
        path,
        &config("round-robin", &[(b1.addr, 1), (b2.addr, 0)], ""),
    );
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(c.open(2), [b1.addr.port(); 2]);
    let pings = c.run("ping");
    assert_eq!(pings.len(), 5, "{pings:?}");
    assert!(pings.iter().all(|l| l.starts_with("ALIVE")), "{pings:?}");
    assert_eq!(active(up), [(2, 2), (3, 3)]);
}

#[test]
fn persistence_keeps_a_client_on_its_backend_until_it_is_idle_that_long() {
    // Round robin alone would alternate; persistence keeps the client on the first backend.
    let mut t = bed("balpers", "round-robin", &[1, 1], "persistence = \"600ms\"");
    let Bed { c, up, b, .. } = &mut t;
    let (b1, b2) = (&b[0], &b[1]);
    assert_eq!(up.status()["services"][0]["persistence_s"], 0.6);
    let first = c.open(6);
    assert_eq!(first, [b1.addr.port(); 6]);
    // Idle past the timeout: the next connect is placed anew (round robin's next), and
    // stays there.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(c.open(3), [b2.addr.port(); 3]);
}

#[test]
fn weighted_round_robin_is_exact_and_weighted_random_is_named_so() {
    let (_g, _lab, cli, srv, _link) = serial_pair("balwrr");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let w = |alg: &str| {
        vip_args(
            VIP,
            &[&b1],
            &["--backend", &format!("{}@3", b2.addr), "--algorithm", alg],
        )
    };
    // Weights 1:3, interleaved: b2 b1 b2 b2, then again.
    let got: Vec<u16> = run_client(&cli, &w("wrr"), 8).iter().map(|c| c.1).collect();
    let (p1, p2) = (b1.addr.port(), b2.addr.port());
    assert_eq!(got, [p2, p1, p2, p2, p2, p1, p2, p2]);
    // The old spelling still works, and the report says what it does.
    let mut args = w("weighted");
    args.push("--json".into());
    let argv = argv(&refs(&args), &format!("{VIP};4;"));
    let (stdout, stderr) = output_ok(&cli, &argv, "");
    let v = report(&stdout);
    assert_eq!(v["services"][0]["algorithm"], "weighted-random", "{stderr}");
    // And its run counted every socket off as the client closed it.
    for b in v["services"][0]["backends"].as_array().unwrap() {
        assert_eq!(b["active"], 0, "{v}");
    }
}

#[test]
fn health_transitions_are_said_on_stderr_with_time_and_reason() {
    let (_g, lab, cli, srv, _link) = serial_pair("balhlog");
    let b1 = backend(&srv);
    let cg = test_cgroup("hlog");
    let path = lab.dir().join("lb.toml");
    write_config(
        &path,
        &config(
            "round-robin",
            &[(b1.addr, 1)],
            "health = { interval = \"50ms\", timeout = \"500ms\", rise = 2, fall = 2 }",
        ),
    );
    let up = Up::start(&lab, &cli, &path, cg.rel(), &[]);
    let lines = |what: &str| -> Vec<String> {
        up.stderr()
            .lines()
            .filter(|l| l.contains(&format!("backend {} (VIP {VIP}) {what}", b1.addr)))
            .map(String::from)
            .collect()
    };
    let wait = |what: &str| {
        let until = Instant::now() + Duration::from_secs(10);
        while lines(what).is_empty() {
            assert!(Instant::now() < until, "no {what} line: {}", up.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    b1.kill();
    wait("down:");
    // Back on the same port: up again after two good probes.
    let _again = backend_on(&srv, b1.addr);
    wait("up:");
    let (down, back) = (lines("down:"), lines("up:"));
    assert_eq!((down.len(), back.len()), (1, 1), "{}", up.stderr());
    // RFC 3339 UTC time first, then the reason.
    for l in [&down[0], &back[0]] {
        let t = l.split(' ').next().unwrap();
        assert!(
            t.len() == 24 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
            "{l}"
        );
    }
    assert!(
        down[0].ends_with(
            "down: connect: Connection refused (os error 111) (2 probes failed in a row)"
        ),
        "{}",
        down[0]
    );
    assert!(
        back[0].ends_with("up: 2 probes passed in a row"),
        "{}",
        back[0]
    );
}

#[test]
fn maglev_hashes_the_client_port_by_default_and_the_host_when_asked() {
    let (_g, _lab, cli, srv, _link) = serial_pair("balmh");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let args = |extra: &[&str]| {
        let mut v = vip_args(VIP, &[&b1, &b2], &["--algorithm", "maglev"]);
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    // Unbound sockets have no port yet at connect: each is placed on its own, so one host's
    // 40 connects use both backends (all on one: probability 2^-39).
    let c = run_client(&cli, &args(&[]), 40);
    let k = c.iter().filter(|(_, p)| *p == b1.addr.port()).count();
    assert!(k > 0 && k < 40, "{k} of 40 on one backend");
    // By host: the whole host on one backend.
    let c = run_client(&cli, &args(&["--hash-key", "host"]), 20);
    assert!(c.iter().all(|(_, p)| *p == c[0].1), "{c:?}");
}
