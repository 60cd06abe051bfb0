//! `--pin` and `balance down`: pinned programs keep balancing after the balancer is
//! SIGKILLed, until `down` removes them; reloads pin and unpin the UDP hooks.

use super::*;
use tcpkit_lab::Bpffs;

/// A bpf filesystem of the test's own (this host has none at /sys/fs/bpf), and where balance
/// pins in it.
fn bpffs(lab: &Lab) -> (Bpffs, PathBuf) {
    let fs = Bpffs::mount(lab.dir()).unwrap_or_else(|e| panic!("{e}"));
    let pin = fs.path().join("tcpkit").join("balance");
    (fs, pin)
}

#[test]
fn pin_keeps_balancing_after_sigkill_until_down() {
    let (_g, lab, cli, srv, _link) = serial_pair("balpin");
    let b1 = backend(&srv);
    let cg = test_cgroup("pin");
    let (_fs, pin_dir) = bpffs(&lab);
    let config = lb_config(&lab, &[b1.addr], false);
    let pin = pin_dir.to_str().unwrap();
    let mut up = Up::start(&lab, &cli, &config, cg.rel(), &["--pin", pin]);
    assert_eq!(up.status()["pin"], pin);
    let (progs, maps) = attached(cg.path());
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS, "{}", cg.path().display());
    // Killed: nothing of its own runs, the pins keep the programs attached.
    up.signal(libc::SIGKILL);
    up.child.wait().unwrap();
    assert_eq!(
        attached(cg.path()).0,
        progs,
        "the pinned programs left with the process"
    );
    let (got, log) = Client::connects(&lab, &cli, &cg, VIP, 3);
    assert_eq!(got, vec![(VIP.to_string(), b1.addr.port()); 3], "{}", log);
    // A second up on the same pins adopts them (issue 29; balance::faults tests it under
    // load): its programs replace the pinned ones in the same links, nothing more attached.
    let again = lab.dir().join("again.sock");
    let up2 = Up::start_at(&lab, &cli, &config, cg.rel(), &again, &["--pin", pin]);
    assert!(
        up2.stderr().contains("adopted the balancer pinned in"),
        "{}",
        up2.stderr()
    );
    let (progs2, maps2) = attached(cg.path());
    assert_eq!(progs2.len(), progs.len(), "{progs:?} then {progs2:?}");
    // Only the trace ring buffer and the .rodata (trace_on) are the new programs' own.
    let kept = maps2.iter().filter(|m| maps.contains(m)).count();
    assert_eq!(kept, maps.len() - 2, "{maps:?} then {maps2:?}");
    let (st, _, err) = up2.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    let progs: Vec<u64> = progs.into_iter().chain(progs2).collect();
    let maps: Vec<u64> = maps.into_iter().chain(maps2).collect();
    // down: the pins go, and with them the programs and maps.
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_all_gone(&progs, &maps);
    assert!(attached(cg.path()).0.is_empty());
    assert!(!pin_dir.exists());
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("nothing pinned there"), "{err}");
}

#[test]
fn reload_attaches_the_udp_hooks_only_while_a_udp_service_is_configured() {
    // Issue 13: sendmsg/recvmsg run on every datagram in the cgroup, so a configuration
    // without UDP services leaves them off; a reload adding one attaches them, one removing
    // the last detaches them again. Checked by the kernel's query and by status.
    let (_g, lab, cli, srv, _link) = serial_pair("balhook");
    let b1 = backend(&srv);
    let cg = test_cgroup("hooks");
    let config = lab.dir().join("lb.toml");
    let tcp = rr_config(&[b1.addr], false);
    write_config(&config, &tcp);
    let up = Up::start(&lab, &cli, &config, cg.rel(), &[]);
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS);
    assert_eq!(up.status()["hooks"], serde_json::json!(TCP_HOOKS));
    // Also a TCP VIP on a port no VIP used before (the programs skip ports without one).
    let vip2 = "198.19.0.1:7000";
    let with_udp = format!(
        "{tcp}[[service]]\nname = \"dns\"\nvip = \"198.19.0.1:53\"\nprotocol = \"udp\"\n\
         backends = [ {{ addr = \"{SRV}:53\" }} ]\n\
         [[service]]\nname = \"other\"\nvip = \"{vip2}\"\nbackends = [ {{ addr = \"{}\" }} ]\n",
        b1.addr
    );
    write_config(&config, &with_udp);
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(hooks_on(cg.path()), ALL_HOOKS);
    let (got, log) = Client::connects(&lab, &cli, &cg, vip2, 3);
    assert_eq!(got.len(), 3, "{log}");
    assert!(got.iter().all(|(peer, _)| peer == vip2), "{got:?}");
    assert_eq!(
        up.status()["hooks"],
        serde_json::json!([
            "connect4",
            "connect6",
            "getpeername4",
            "getpeername6",
            "sendmsg4",
            "recvmsg4",
            "sendmsg6",
            "recvmsg6",
            "sock_release"
        ])
    );
    let human = up.ask(&["status"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("Hooks attached: connect4 connect6 getpeername4 getpeername6 sendmsg4 recvmsg4 sendmsg6 recvmsg6 sock_release\n"),
        "{human}"
    );
    write_config(&config, &tcp);
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS);
    assert_eq!(up.status()["hooks"], serde_json::json!(TCP_HOOKS));
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(
        hooks_on(cg.path()).is_empty(),
        "left attached after SIGTERM"
    );
}

#[test]
fn pinned_reload_pins_the_udp_hooks_it_attaches_and_unpins_those_it_detaches() {
    // With --pin, a UDP hook a reload attaches must outlive the process like the others, and
    // one a reload detaches must not stay behind in a pin.
    let (_g, lab, cli, srv, _link) = serial_pair("balpinh");
    let b1 = backend(&srv);
    let cg = test_cgroup("pinh");
    let (_fs, pin_dir) = bpffs(&lab);
    let config = lab.dir().join("lb.toml");
    let tcp = rr_config(&[b1.addr], false);
    write_config(&config, &tcp);
    let pin = pin_dir.to_str().unwrap();
    let links = || {
        let mut v: Vec<String> = std::fs::read_dir(&pin_dir)
            .unwrap()
            .filter_map(|e| {
                let n = e.unwrap().file_name().to_string_lossy().into_owned();
                n.strip_prefix("link_tk_").map(String::from)
            })
            .collect();
        v.sort();
        v
    };
    let up = Up::start(&lab, &cli, &config, cg.rel(), &["--pin", pin]);
    assert_eq!(links(), TCP_HOOKS);
    write_config(
        &config,
        &format!(
            "{tcp}[[service]]\nname = \"dns\"\nvip = \"198.19.0.1:53\"\nprotocol = \"udp\"\n\
             backends = [ {{ addr = \"{SRV}:53\" }} ]\n"
        ),
    );
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(links(), ALL_HOOKS);
    assert_eq!(hooks_on(cg.path()), ALL_HOOKS);
    write_config(&config, &tcp);
    let out = up.ask(&["reload"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(links(), TCP_HOOKS);
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS);
    // The pins hold what is attached after the process is gone.
    let (st, _, err) = up.stop();
    assert_eq!(st.code(), Some(0), "{err}");
    assert_eq!(hooks_on(cg.path()), TCP_HOOKS);
    let (progs, maps) = attached(cg.path());
    let out = Command::new(tcpkit())
        .args(["balance", "down", "--pin", pin])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_all_gone(&progs, &maps);
    assert!(hooks_on(cg.path()).is_empty());
}
