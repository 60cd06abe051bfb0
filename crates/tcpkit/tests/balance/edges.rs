//! The contracts of `balance` at their edges (issue 24): `down` and a second `up` against a
//! running `up`, status read from the kernel, a backend a reload adds, `--pin` under
//! `ip netns exec`, what a refused or stopped `up` leaves behind, and the exit statuses of a
//! command that cannot be run and of a configuration file that cannot be used.

use super::*;
use tcpkit_lab::Bpffs;

/// `tcpkit balance down --pin DIR` from this test: (exit code, stderr).
fn down(dir: &str) -> (Option<i32>, String) {
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", dir])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `argv` in `host` to its end, which must come within 5 s (a refused `up` ends at once;
/// one that starts would run on): (exit code, stderr).
fn refused(host: &Host, argv: &[&str]) -> (Option<i32>, String) {
    let mut child = host
        .command(argv)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{argv:?} was not refused: still running after 5 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (st.code(), err)
}

/// Exit 1 and one line on stderr that contains every one of `want`.
fn one_line(what: &str, (code, err): &(Option<i32>, String), want: &[&str]) {
    assert_eq!(*code, Some(1), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: {err}");
    for w in want {
        assert!(err.contains(w), "{what}: no {w:?} in: {err}");
    }
}

#[test]
fn down_refuses_while_up_holds_the_pins_and_status_reads_the_kernel() {
    // `down` on the pins of a running `up` used to detach it under its feet (clients got
    // ENETUNREACH) while its status still listed the hooks.
    let (_g, lab, cli, srv, _link) = serial_pair("baledown");
    let b1 = backend(&srv);
    let cg = test_cgroup("edown");
    let fs = Bpffs::mount(lab.dir()).unwrap_or_else(|e| panic!("{e}"));
    let pin_dir = fs.path().join("tcpkit").join("balance");
    let pin = pin_dir.to_str().unwrap();
    let config = lb_config(&lab, &[b1.addr], false);
    // Refused late (its metrics port is taken): nothing stays pinned, attached or made.
    let busy = cli.enter(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let port = busy.local_addr().unwrap().to_string();
    let sock = lab.dir().join("late.sock");
    let mut argv = up_argv(&config, cg.rel(), &sock);
    argv.extend(["--pin", pin, "--metrics", &port]);
    one_line("metrics port taken", &refused(&cli, &argv), &[&port]);
    assert!(!pin_dir.exists(), "a refused up left its pins");
    assert!(hooks_on(cg.path()).is_empty(), "a refused up left hooks");
    assert!(!sock.exists());
    let mut up = Up::start(&lab, &cli, &config, cg.rel(), &["--pin", pin]);
    let pid = up.child.id().to_string();
    let socket = up.socket.display().to_string();
    let held = down(pin);
    one_line("down while up runs", &held, &[pin, &pid, &socket]);
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS, "down detached a running up");
    // A second up on those pins is told the same, not to run `down`.
    let again = lab.dir().join("again.sock");
    let mut argv = up_argv(&config, cg.rel(), &again);
    argv.extend(["--pin", pin]);
    let second = refused(&cli, &argv);
    one_line("a second up on the pins", &second, &[&pid, &socket]);
    assert!(!second.1.contains("balance down"), "{}", second.1);

    // A hook taken off behind balance's back (as bpftool can): status says what the kernel
    // has, not what balance attached.
    let link = pin_dir.join("link_tk_connect4");
    let out = Command::new("bpftool")
        .args(["link", "detach", "pinned", link.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS[1..]);
    assert_eq!(up.status()["hooks"], serde_json::json!(TCP_HOOKS[1..]));

    // Once the up is gone (SIGKILL frees its lock too), down does its work.
    up.signal(libc::SIGKILL);
    up.child.wait().unwrap();
    let (code, err) = down(pin);
    assert_eq!(code, Some(0), "{err}");
    assert!(hooks_on(cg.path()).is_empty());
}

#[test]
fn a_second_up_on_the_same_cgroup_and_vip_is_refused_naming_the_first() {
    let (_g, lab, cli, srv, _link) = serial_pair("baletwo");
    let b1 = backend(&srv);
    let cg = test_cgroup("etwo");
    let config = lb_config(&lab, &[b1.addr], false);
    let first = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    let (progs, _) = attached(cg.path());
    let second_sock = lab.dir().join("second.sock");
    let second = refused(&cli, &up_argv(&config, cg.rel(), &second_sock));
    one_line(
        "a second up",
        &second,
        &[
            VIP,
            &first.child.id().to_string(),
            &first.socket.display().to_string(),
        ],
    );
    assert_eq!(attached(cg.path()).0, progs, "the second up attached");
    assert!(!second_sock.exists(), "the refused up left its socket file");
    // Another VIP on the same cgroup is another service: allowed.
    let other = lab.dir().join("other.toml");
    write_config(
        &other,
        &rr_config(&[b1.addr], false).replace(VIP, "198.19.0.1:7000"),
    );
    let third = Up::start(&lab, &cli, &other, cg.rel(), &[]);
    assert_eq!(attached(cg.path()).0.len(), 2 * TCP_HOOKS.len());
    drop(third);
    drop(first);
    // Two started at the same moment: one runs, the other is refused.
    let (progs, _) = attached(cg.path());
    assert!(progs.is_empty(), "{progs:?}");
    let racers: Vec<(std::process::Child, PathBuf)> = (0..2)
        .map(|i| {
            let log = lab.dir().join(format!("race{i}.err"));
            let sock = lab.dir().join(format!("race{i}.sock"));
            let child = cli
                .command(&up_argv(&config, cg.rel(), &sock))
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            (child, log)
        })
        .collect();
    let mut racers: Vec<_> = racers
        .into_iter()
        .map(|(c, log)| (tcpkit_lab::KillOnDrop(c), log))
        .collect();
    let until = Instant::now() + Duration::from_secs(10);
    let (mut ready, mut out) = (0, 0);
    for (c, log) in &mut racers {
        loop {
            let text = std::fs::read_to_string(&*log).unwrap_or_default();
            if text.contains("status: tcpkit balance status") {
                ready += 1;
                break;
            }
            if let Some(st) = c.0.try_wait().unwrap() {
                assert_eq!(st.code(), Some(1), "{text}");
                assert!(text.contains("is balanced there already"), "{text}");
                out += 1;
                break;
            }
            assert!(Instant::now() < until, "neither ready nor refused: {text}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!((ready, out), (1, 1));
    assert_eq!(attached(cg.path()).0.len(), TCP_HOOKS.len());
}

#[test]
fn a_backend_added_by_reload_takes_nothing_before_its_first_probe_passes() {
    // With a 1 s interval and fall 3, a dead backend a reload adds was in the set for ~2 s:
    // round-robin sent every second connect there, refused.
    let (_g, lab, cli, srv, _link) = serial_pair("balenew");
    let (b1, b2) = (backend(&srv), backend(&srv));
    let dead = {
        let l = srv.enter(|| TcpListener::bind(SocketAddr::from((SRV, 0))).unwrap());
        l.local_addr().unwrap()
    };
    let cg = test_cgroup("enew");
    let health = "health = { interval = \"1s\", timeout = \"500ms\", rise = 2, fall = 3 }\n";
    let config = lab.dir().join("lb.toml");
    let with = |backends: &[SocketAddr]| rr_config(backends, false) + health;
    write_config(&config, &with(&[b1.addr]));
    let up = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    write_config(&config, &with(&[b1.addr, dead]));
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 6);
    assert_eq!(
        got,
        vec![(VIP.to_string(), b1.addr.port()); 6],
        "connects went to the new, never probed backend:\n{log}"
    );
    let v = up.status();
    assert_eq!(v["services"][0]["backends"][1]["health"], "down", "{v}");
    // A live one comes in with its first probe (not after --rise).
    write_config(&config, &with(&[b1.addr, dead, b2.addr]));
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    status_until(&up, 3, "the added live backend up", |v| {
        v["services"][0]["backends"][2]["health"] == "up"
    });
    let came_in = format!(
        "backend {} (VIP {VIP}) up: its first probe passed (added by reload)",
        b2.addr
    );
    assert!(up.stderr().contains(&came_in), "{}", up.stderr());
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 4);
    let ports: Vec<u16> = got.iter().map(|(_, p)| *p).collect();
    assert_eq!(ports.len(), 4, "{log}");
    assert!(ports.contains(&b2.addr.port()), "{log}");
    assert!(!ports.contains(&dead.port()), "{log}");
}

#[test]
fn pin_under_ip_netns_exec_needs_a_bpffs_outside_the_namespace() {
    // `ip netns exec` mounts /sys afresh: a bpffs mounted on /sys/fs/bpf there lives in that
    // command's mount namespace only and goes (pins and all) when it ends.
    let (_g, lab, cli, srv, _link) = serial_pair("balensx");
    let b1 = backend(&srv);
    let cg = test_cgroup("ensx");
    let config = lb_config(&lab, &[b1.addr], false);
    let socket = lab.dir().join("ns.sock");
    let mut argv = up_argv(&config, cg.rel(), &socket);
    argv.extend(["--pin", "/sys/fs/bpf/tcpkit/balance"]);
    let script = format!("mount -t bpf bpf /sys/fs/bpf && exec {}", argv.join(" "));
    let private = refused(&cli, &["sh", "-c", &script]);
    one_line(
        "a bpffs private to the namespace",
        &private,
        &["/sys/fs/bpf/tcpkit/balance", "/run/tcpkit/bpf"],
    );
    assert!(attached(cg.path()).0.is_empty(), "something attached");
    assert!(!socket.exists(), "the refused up left its socket file");
    // No bpffs there at all: the hint names a mount that outlives the namespace.
    let none = refused(&cli, &argv);
    one_line(
        "no bpffs",
        &none,
        &["not on a bpf filesystem", "/run/tcpkit/bpf"],
    );
    assert!(
        !none.1.contains("mount -t bpf bpf /sys/fs/bpf"),
        "{}",
        none.1
    );
}

#[test]
fn up_removes_the_socket_directory_it_made_and_names_the_cgroup_as_given() {
    let (_g, lab, cli, srv, _link) = serial_pair("baleleft");
    let b1 = backend(&srv);
    let cg = test_cgroup("eleft");
    let config = lb_config(&lab, &[b1.addr], false);
    // A socket in directories that do not exist yet: made (mode 700), and gone with the up.
    let run = lab.dir().join("run");
    let socket = run.join("tcpkit").join("balance.sock");
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &socket, &[]);
    assert!(socket.exists());
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(!run.exists(), "the directories made for the socket stay");
    // A directory that was there before stays.
    std::fs::create_dir_all(&run).unwrap();
    let up = Up::start_at(&lab, &cli, &config, cg.rel(), &run.join("b.sock"), &[]);
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(run.exists() && !run.join("b.sock").exists());
    // Under ip netns exec the hierarchy is mounted privately: the error names the cgroup as
    // the user gave it, never the private mount's directory.
    let no = refused(
        &cli,
        &up_argv(&config, "/tcpkit-no-such-cgroup", &run.join("c.sock")),
    );
    one_line(
        "no such cgroup",
        &no,
        &["--cgroup /tcpkit-no-such-cgroup: no such cgroup"],
    );
    assert!(!no.1.contains("tcpkit-balance-cgroup2"), "{}", no.1);
    assert!(
        !run.join("c.sock").exists(),
        "the refused up left its socket"
    );
}

#[test]
fn run_exits_127_or_126_as_shells_do_and_a_bad_config_is_a_usage_error() {
    let (_g, lab, cli, _srv, _link) = serial_pair("bale127");
    let run = |cmd: &str| {
        let out = cli
            .command(&[tcpkit(), "balance", "run", "--vip", VIP, "--", cmd])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run("/no/such/cmd");
    assert_eq!(code, Some(127), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/no/such/cmd: command not found"), "{err}");
    let (code, err) = run("tcpkit-no-such-command-in-path");
    assert_eq!(code, Some(127), "{err}");
    let text = lab.dir().join("not-executable");
    std::fs::write(&text, "#!/bin/sh\n").unwrap();
    let (code, err) = run(text.to_str().unwrap());
    assert_eq!(code, Some(126), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not executable"), "{err}");
    // up: a configuration file that is missing or not TOML is a usage error, one line
    // naming the flag and the file.
    let socket = lab.dir().join("u.sock");
    let missing = lab.dir().join("missing.toml");
    for (config, want) in [(missing.clone(), "--config "), (text.clone(), "--config ")] {
        let out = cli
            .command(&up_argv(&config, "/", &socket))
            .output()
            .unwrap();
        crate::common::usage_line(&out, &[&format!("{want}{}", config.display())]);
        assert!(!socket.exists());
    }
}
