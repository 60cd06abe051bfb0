//! The lab against real namespaces: every test builds its own uniquely named hosts and
//! checks afterwards that none of its namespaces remain.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tcpkit_lab::{owner_pid, sweep_leftovers, Lab, LinkOpts, Tbf};

fn assert_gone(names: &[String]) {
    assert!(!names.is_empty());
    for n in names {
        assert!(
            !Path::new("/run/netns").join(n).exists(),
            "namespace {n} still exists"
        );
    }
}

fn pid_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn pair_pings_v4_and_v6_and_cleans_up() {
    let (lab, a, b, link) = Lab::pair("ping").unwrap();
    let names = lab.namespaces().to_vec();
    assert_eq!(names.len(), 2);
    assert!(names
        .iter()
        .all(|n| owner_pid(n) == Some(std::process::id())));
    assert_eq!(link.a.host, a.netns());
    assert_eq!(link.b.host, b.netns());
    assert_eq!(link.a.mtu, 1500);
    assert_ne!(link.a.mac, link.b.mac);
    assert!(link.a.name.len() <= 15);

    // No address, link-local included, is left tentative (DAD) once the link is returned.
    let tentative = a
        .run(&["ip", "-6", "addr", "show", "dev", &link.a.name, "tentative"])
        .unwrap();
    assert!(tentative.stdout.is_empty(), "{tentative:?}");

    a.run(&["ping", "-c1", "-W2", "198.18.0.2"]).unwrap();
    a.run(&["ping", "-6", "-c1", "-W2", "fd00:18::2"]).unwrap();
    b.run(&["ping", "-c1", "-W2", "198.18.0.1"]).unwrap();

    let sa = a.ifstats(&link.a.name).unwrap();
    let sb = b.ifstats(&link.b.name).unwrap();
    assert!(sa.tx_packets >= 3 && sb.rx_packets >= 3, "{sa:?} {sb:?}");

    // A failing command names itself and its stderr.
    let e = a.run(&["ping", "-c1", "-W1", "198.18.0.99"]).unwrap_err();
    assert!(e.to_string().contains("ping -c1"), "{e}");

    drop(lab);
    assert_gone(&names);
}

#[test]
fn spawned_process_is_killed_on_drop() {
    let mut lab = Lab::new("spawn").unwrap();
    let h = lab.host("h").unwrap();
    let p = h
        .spawn(
            &mut lab,
            "sleeper",
            &["sh", "-c", "echo started; exec sleep 600"],
        )
        .unwrap();
    // A grandchild that escapes the process group is still killed via the namespace.
    let escaped = h
        .spawn(&mut lab, "escaper", &["setsid", "-f", "sleep", "601"])
        .unwrap();
    assert!(escaped
        .wait_timeout(Duration::from_secs(5))
        .unwrap()
        .is_some());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !p.log().contains("started") {
        assert!(
            Instant::now() < deadline,
            "no output in {}",
            p.log_path().display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pids = Command::new("ip")
        .args(["netns", "pids", h.netns()])
        .output()
        .unwrap();
    let inside: Vec<u32> = String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    assert!(inside.contains(&p.pid()), "{inside:?}");
    assert!(inside.len() >= 2, "escaped sleep not found: {inside:?}");

    let names = lab.namespaces().to_vec();
    drop(lab);
    assert!(!pid_exists(p.pid()), "sleeper {} survived", p.pid());
    // The escaped sleep is not our child: give init a moment to reap it.
    let deadline = Instant::now() + Duration::from_secs(2);
    while inside.iter().any(|&pid| pid_exists(pid) && pid != p.pid()) {
        assert!(Instant::now() < deadline, "a process survived: {inside:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_gone(&names);
}

#[test]
fn proc_stop_and_exit_status() {
    let mut lab = Lab::new("stop").unwrap();
    let h = lab.host("h").unwrap();
    let p = h.spawn(&mut lab, "sleeper", &["sleep", "600"]).unwrap();
    let st = p.stop().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGTERM));
    let q = h
        .spawn(&mut lab, "quick", &["sh", "-c", "echo hi; exit 4"])
        .unwrap();
    let st = q.wait_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(st.code(), Some(4));
    assert_eq!(q.log(), "hi\n");
    assert!(q.log_path().starts_with(lab.dir()));
    let names = lab.namespaces().to_vec();
    lab.close().unwrap();
    assert_gone(&names);
}

#[test]
fn panic_with_live_lab_cleans_up() {
    let names = std::sync::Mutex::new(Vec::new());
    let dir = std::sync::Mutex::new(None);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (mut lab, a, _b, _link) = Lab::pair("panic").unwrap();
        a.spawn(&mut lab, "sleeper", &["sleep", "600"]).unwrap();
        *names.lock().unwrap() = lab.namespaces().to_vec();
        *dir.lock().unwrap() = Some(lab.dir().to_path_buf());
        panic!("deliberate panic with a lab alive");
    }));
    assert!(r.is_err());
    assert_gone(&names.lock().unwrap());
    if std::env::var("TCPKIT_LAB_KEEP").is_err() {
        let d = dir.lock().unwrap().clone().unwrap();
        assert!(!d.exists(), "{} kept", d.display());
    }
}

#[test]
fn sweep_removes_namespace_of_dead_pid() {
    // The namespace is named for a process that lives until a process is inside it, then
    // dies: a sweeper in a concurrent test (every Lab::new sweeps) leaves it alone until then,
    // and from then on finds the process and kills it. Named for an already dead pid, a
    // concurrent sweeper could list its (still empty) pids, then our process enter, then the
    // sweeper delete the name: a process no sweep can find, and this test waited 600 s.
    let mut owner = Command::new("sleep").arg("600").spawn().unwrap();
    let name = tcpkit_lab::netns_name(owner.id(), 0, "sweepme");
    let st = Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .unwrap();
    assert!(st.success());
    let mut inside = Command::new("ip")
        .args(["netns", "exec", &name, "sleep", "600"])
        .spawn()
        .unwrap();
    // Wait until the sleep is really inside before its owner dies.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = Command::new("ip")
            .args(["netns", "pids", &name])
            .output()
            .unwrap();
        if !out.stdout.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    owner.kill().unwrap();
    owner.wait().unwrap();
    // A concurrent Lab::new in another test may sweep it first; either way it must go.
    sweep_leftovers().unwrap();
    let st = inside.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    assert_gone(&[name]);
}

/// Sends `bytes` from A to B over TCP and returns how long until B had read all of it.
fn transfer(a: &tcpkit_lab::Host, b: &tcpkit_lab::Host, bytes: usize) -> Duration {
    let listener = b.enter(|| TcpListener::bind("198.18.0.2:0").unwrap());
    let addr = listener.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    });
    let data = vec![0x5au8; bytes];
    let start = Instant::now();
    a.enter(|| {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.write_all(&data).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let got = rx.join().unwrap();
    let took = start.elapsed();
    assert_eq!(got, bytes);
    took
}

#[test]
fn tbf_shapes_the_link() {
    const BYTES: usize = 2_000_000;
    let mut lab = Lab::new("tbf").unwrap();
    let a = lab.host("a").unwrap();
    let b = lab.host("b").unwrap();
    let opts = LinkOpts {
        tbf: Some(Tbf {
            rate_bit_s: 10_000_000,
            burst_bytes: 32_000,
            latency_ms: 50,
        }),
        ..LinkOpts::pair()
    };
    lab.link(&a, &b, &opts).unwrap();
    let shaped = transfer(&a, &b, BYTES);
    assert!(
        shaped >= Duration::from_millis(1200) && shaped <= Duration::from_secs(3),
        "2 MB at 10 Mbit/s took {shaped:?}"
    );

    let c = lab.host("c").unwrap();
    let d = lab.host("d").unwrap();
    lab.link(&c, &d, &LinkOpts::pair()).unwrap();
    let free = transfer(&c, &d, BYTES);
    eprintln!("2 MB: shaped {shaped:?}, unshaped {free:?}");
    assert!(free * 4 < shaped, "unshaped {free:?} vs shaped {shaped:?}");

    let names = lab.namespaces().to_vec();
    drop(lab);
    assert_gone(&names);
}

#[test]
fn tcpdump_captures_everything_sent_after_start() {
    let (mut lab, a, b, link) = Lab::pair("tcpdump").unwrap();
    let rx = b.enter(|| UdpSocket::bind("198.18.0.2:0").unwrap());
    let dst: SocketAddr = rx.local_addr().unwrap();
    let filter = format!("udp port {}", dst.port());
    let cap = lab.tcpdump(&b, &link.b.name, &filter).unwrap();
    a.enter(|| {
        let tx = UdpSocket::bind((Ipv4Addr::new(198, 18, 0, 1), 0)).unwrap();
        for i in 0..10u8 {
            tx.send_to(&[i; 100], dst).unwrap();
        }
    });
    // All ten arrived at the socket, so all ten passed the interface before stop().
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 200];
    for _ in 0..10 {
        rx.recv_from(&mut buf).unwrap();
    }
    let c = cap.stop().unwrap();
    assert!(c.captured >= 10, "{c:?}");
    assert_eq!(c.dropped_by_kernel, 0, "{c:?}");
    let lines = c.text().unwrap();
    let udp = lines
        .iter()
        .filter(|l| l.contains("UDP, length 100"))
        .count();
    assert_eq!(udp, 10, "{lines:#?}");
    assert!(c.path.starts_with(lab.dir()));
    let names = lab.namespaces().to_vec();
    drop(lab);
    assert_gone(&names);
}

#[test]
fn tcpdump_on_missing_interface_fails_with_reason() {
    let mut lab = Lab::new("tcpdumpbad").unwrap();
    let h = lab.host("h").unwrap();
    let e = lab.tcpdump(&h, "nosuchif0", "").unwrap_err().to_string();
    assert!(e.contains("tcpdump") && e.contains("nosuchif0"), "{e}");
    let names = lab.namespaces().to_vec();
    drop(lab);
    assert_gone(&names);
}

fn tso(h: &tcpkit_lab::Host, ifname: &str) -> String {
    let out = h.run(&["ethtool", "-k", ifname]).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("tcp-segmentation-offload:"))
        .unwrap_or_default()
        .to_string()
}

/// Time a thread has run, from the scheduler (ns).
fn on_cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn rx_threads_receive_apart_from_the_sender() {
    let mut lab = Lab::new("rxthr").unwrap();
    let a = lab.host("a").unwrap();
    let b = lab.host("b").unwrap();
    let opts = LinkOpts {
        rx_threads: true,
        ..LinkOpts::pair()
    };
    let link = lab.link(&a, &b, &opts).unwrap();
    let (ta, tb) = (link.a.rx_thread.unwrap(), link.b.rx_thread.unwrap());
    assert_ne!(ta, tb);
    let before = (on_cpu_ns(ta), on_cpu_ns(tb));
    transfer(&a, &b, 20_000_000);
    // B's thread took A's data in, A's thread took B's ACKs in: both ran for it.
    let ran = (on_cpu_ns(ta) - before.0, on_cpu_ns(tb) - before.1);
    assert!(ran.1 > 1_000_000, "B's receive thread ran {} ns", ran.1);
    assert!(ran.0 > 0, "A's receive thread never ran");
    // A plain link has none.
    let c = lab.host("c").unwrap();
    let plain = lab.link(&a, &c, &LinkOpts::default()).unwrap();
    assert_eq!((plain.a.rx_thread, plain.b.rx_thread), (None, None));
    drop(lab);
    // The threads go with their namespaces' interfaces.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!std::path::Path::new(&format!("/proc/{tb}")).exists());
}

#[test]
fn offloads_off_by_default_and_on_when_asked() {
    let (mut lab, a, b, link) = Lab::pair("offload").unwrap();
    assert_eq!(tso(&a, &link.a.name), "tcp-segmentation-offload: off");
    assert_eq!(tso(&b, &link.b.name), "tcp-segmentation-offload: off");
    let opts = LinkOpts {
        offloads: true,
        mtu: Some(9000),
        ..LinkOpts::default()
    };
    let l2 = lab.link(&a, &b, &opts).unwrap();
    assert_eq!(l2.a.name, "eth1");
    assert_eq!(l2.a.mtu, 9000);
    assert_eq!(l2.b.mtu, 9000);
    assert_eq!(tso(&a, &l2.a.name), "tcp-segmentation-offload: on");
    let names = lab.namespaces().to_vec();
    drop(lab);
    assert_gone(&names);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let mut lab = Lab::new("badinput").unwrap();
    let a = lab.host("a").unwrap();
    let b = lab.host("b").unwrap();
    assert!(lab.host("no/slash").is_err());
    let opts = LinkOpts {
        addr_a: vec!["192.168.1.1/24".into()],
        ..LinkOpts::default()
    };
    let e = lab.link(&a, &b, &opts).unwrap_err().to_string();
    assert!(e.contains("outside"), "{e}");
    assert!(a.run(&[]).is_err());
    assert!(a.spawn(&mut lab, "empty", &[]).is_err());
    assert!(a.ifstats("nosuchif0").is_err());
    let names = lab.namespaces().to_vec();
    drop(lab);
    assert_gone(&names);
}

/// Set in the child run by `without_caps_lab_fails_with_one_line`.
const UNPRIV_CHILD: &str = "TCPKIT_LAB_TEST_UNPRIV_CHILD";

/// The helper processes' guard: run any other way (say, by `--include-ignored`), a helper
/// fails rather than passing without having tested anything.
fn assert_helper(var: &str) {
    assert!(
        std::env::var_os(var).is_some(),
        "helper process: runs only under its parent test, which sets {var}"
    );
}

/// The child of `without_caps_lab_fails_with_one_line`: no CAP_NET_ADMIN, no CAP_SYS_ADMIN.
#[test]
#[ignore = "helper process: run by without_caps_lab_fails_with_one_line"]
fn without_caps_child() {
    assert_helper(UNPRIV_CHILD);
    let e = Lab::new("unpriv").unwrap_err();
    assert_eq!(
        format!("{e:?}"),
        "tcpkit-lab: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces"
    );
}

#[test]
fn without_caps_lab_fails_with_one_line() {
    // Run the child as root minus the two capabilities: exec recomputes the capability sets
    // from the bounding set, so the child really lacks them.
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args(["--bounding-set", "-net_admin,-sys_admin", "--"])
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            "without_caps_child",
            "--test-threads=1",
        ])
        .env(UNPRIV_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn multipath_spreads_connections_over_all_links() {
    use tcpkit_lab::{MULTIPATH_A4, MULTIPATH_B4, MULTIPATH_B6};
    let (lab, a, b, links) = Lab::multipath("multipath", 2, None).unwrap();
    assert_eq!(links.len(), 2);
    a.run(&["ping", "-c1", "-W2", "-I", MULTIPATH_A4, MULTIPATH_B4])
        .unwrap();
    a.run(&["ping", "-6", "-c1", "-W2", MULTIPATH_B6]).unwrap();
    for (i, l) in links.iter().enumerate() {
        let peer = format!("198.18.{}.2", i + 1);
        a.run(&["ping", "-c1", "-W2", "-I", &l.a.name, &peer])
            .unwrap();
    }

    let before: Vec<u64> = links
        .iter()
        .map(|l| a.ifstats(&l.a.name).unwrap().tx_bytes)
        .collect();
    let listener = b.enter(|| TcpListener::bind((MULTIPATH_B4, 0)).unwrap());
    let dst = listener.local_addr().unwrap();
    const FLOWS: usize = 32;
    const CHUNK: usize = 100_000;
    let rx = std::thread::spawn(move || {
        let mut total = 0;
        for _ in 0..FLOWS {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            total += s.read_to_end(&mut buf).unwrap();
        }
        total
    });
    a.enter(|| {
        for _ in 0..FLOWS {
            let mut sock = TcpStream::connect(dst).unwrap();
            sock.write_all(&[7u8; CHUNK]).unwrap();
        }
    });
    assert_eq!(rx.join().unwrap(), FLOWS * CHUNK);
    for (l, b0) in links.iter().zip(before) {
        let sent = a.ifstats(&l.a.name).unwrap().tx_bytes - b0;
        // 32 flows hashed over 2 paths: each path carries several of them.
        assert!(
            sent > 2 * CHUNK as u64,
            "{} carried only {sent} bytes",
            l.a.name
        );
    }
    let names = lab.namespaces().to_vec();
    drop(lab);
    assert_gone(&names);
}

/// Set in the child run by `sweep_cleans_up_after_a_killed_test_process`.
const KILLED_CHILD: &str = "TCPKIT_LAB_TEST_KILLED_CHILD";

/// The child of `sweep_cleans_up_after_a_killed_test_process`: builds a lab with a process
/// in it, reports, and waits to be SIGKILLed, so Drop never runs.
#[test]
#[ignore = "helper process: run by sweep_cleans_up_after_a_killed_test_process"]
fn killed_child() {
    assert_helper(KILLED_CHILD);
    let (mut lab, a, _b, _l) = Lab::pair("killed").unwrap();
    let p = a.spawn(&mut lab, "orphan", &["sleep", "600"]).unwrap();
    println!("NETNS {}", lab.namespaces().join(" "));
    println!("PID {}", p.pid());
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn sweep_cleans_up_after_a_killed_test_process() {
    use std::io::BufRead;
    // Kills the child even when an assertion below fails, so no test process is left behind.
    let exe = std::env::current_exe().unwrap();
    let mut child = tcpkit_lab::KillOnDrop(
        Command::new(exe)
            .args([
                "--ignored",
                "--exact",
                "killed_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(KILLED_CHILD, "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut names = Vec::new();
    let mut orphan = 0u32;
    let lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    // libtest may print "test NAME ... " on the same line before the test's own output.
    for line in lines {
        let line = line.unwrap();
        if let Some((_, n)) = line.split_once("NETNS ") {
            names = n.split(' ').map(str::to_string).collect();
        }
        if let Some((_, p)) = line.split_once("PID ") {
            orphan = p.trim().parse().unwrap();
            break;
        }
    }
    assert_eq!(names.len(), 2);
    assert!(pid_exists(orphan));
    drop(child);
    for n in &names {
        assert!(
            Path::new("/run/netns").join(n).exists(),
            "{n} vanished early"
        );
    }
    // Another test's Lab::new may sweep concurrently; either way they must end up gone.
    sweep_leftovers().unwrap();
    assert_gone(&names);
    let deadline = Instant::now() + Duration::from_secs(2);
    while pid_exists(orphan) {
        assert!(
            Instant::now() < deadline,
            "orphan {orphan} survived the sweep"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The cgroup2 mount point of this mount namespace whose root is the hierarchy's root.
fn cgroup2_mount() -> std::path::PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            (post.starts_with("cgroup2 ") && f.get(3) == Some(&"/")).then(|| f[4].into())
        })
        .expect("a cgroup2 mount on this host")
}

/// Whether `path` is a mount point of type `fstype` in this mount namespace.
fn mounted(path: &Path, fstype: &str) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = path.to_str().unwrap();
    info.lines().any(|l| {
        let (pre, post) = l.split_once(" - ").unwrap();
        pre.split(' ').nth(4) == Some(point) && post.split(' ').next() == Some(fstype)
    })
}

#[test]
fn cgroup_guard_kills_its_processes_and_goes_on_drop() {
    let cg = tcpkit_lab::Cgroup::new(&cgroup2_mount(), "guard").unwrap();
    assert!(cg.rel().starts_with("/tcpkit-test-guard."), "{}", cg.rel());
    let mut child = Command::new("sleep").arg("600").spawn().unwrap();
    cg.join(child.id()).unwrap();
    let procs = std::fs::read_to_string(cg.path().join("cgroup.procs")).unwrap();
    assert_eq!(procs.trim(), child.id().to_string());
    let path = cg.path().to_path_buf();
    drop(cg);
    assert!(!path.exists(), "{} left behind", path.display());
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
}

#[test]
fn cgroup_guard_that_cannot_be_removed_fails_the_test() {
    let cg = tcpkit_lab::Cgroup::new(&cgroup2_mount(), "stuck").unwrap();
    // A child cgroup keeps it from being removed (cgroup.kill kills processes, not cgroups).
    let inner = cg.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let path = cg.path().to_path_buf();
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(cg))).unwrap_err();
    let msg = e.downcast_ref::<String>().unwrap();
    assert!(msg.starts_with("tcpkit-lab: cgroup "), "{msg}");
    assert!(msg.contains("not removed"), "{msg}");
    std::fs::remove_dir(&inner).unwrap();
    std::fs::remove_dir(&path).unwrap();
}

#[test]
fn bpffs_guard_unmounts_and_kill_on_drop_reaps() {
    let dir = tempfile::tempdir().unwrap();
    let fs = tcpkit_lab::Bpffs::mount(dir.path()).unwrap();
    let point = fs.path().to_path_buf();
    assert!(mounted(&point, "bpf"), "{} not a bpffs", point.display());
    // What a test leaves in it (balance pins under directories) does not keep it mounted.
    std::fs::create_dir_all(point.join("tcpkit").join("balance")).unwrap();
    drop(fs);
    assert!(!mounted(&point, "bpf"), "{} still mounted", point.display());

    let child = Command::new("sleep").arg("600").spawn().unwrap();
    let pid = child.id();
    drop(tcpkit_lab::KillOnDrop(child));
    assert!(!pid_exists(pid), "child {pid} not killed and reaped");
}
