//! `tcpkit copy` and `tcpkit intercept` when things go wrong on the host (issue 29): the
//! capture interface going down and up, `--diff-out` on a full disk, intercept restarting
//! under a transparent copy, what a SIGKILL leaves on the host, and a Hello that is wrong in
//! a way the refusal must name.

use crate::copy_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::copy_on_target::OLab;
use copy_common::modes::{Mode, ModeLab};
use copy_common::tlab::*;
use copy_common::*;
use tcpkit_copy::control::{Msg, VERSION};
use tcpkit_lab::{Host, Signal};

/// SIGKILL to a copy (our child: `ip netns exec` execs it, so its pid is the copy's).
fn sigkill(c: &mut Child) {
    // SAFETY: kill(2) takes no pointers; the pid is our unreaped child, so it names no other
    // process.
    let sent = unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(sent, 0);
    c.wait().unwrap();
}

/// Stderr lines of a finished copy.
fn err_lines(o: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(String::from)
        .collect()
}

/// Issue 29: the capture interface going down and coming back up mid-run. copy goes on (the
/// kernel hooks the packet socket back in when the interface comes up), says each change on
/// stderr as it happens, counts the gap in the report, and copies what comes after it.
#[test]
fn relay_capture_interface_down_and_up_is_said_counted_and_copying_goes_on() {
    let mut l = CopyLab::new("fcpifdown");
    let (_on_log, tg_log) = l.nginx_pair();
    let cap = l.capture_if();
    let c = l.copy_rule(&rule_8080(), &["--duration", "3.2", "--json"]);
    l.http_get("2", "100", "0.6", Some("1"));
    let before = lines(&tg_log).len();
    let set = |how: &str| {
        let o = l.online.run(&["ip", "link", "set", "dev", &cap, how]);
        assert!(o.is_ok(), "{o:?}");
    };
    set("down");
    std::thread::sleep(Duration::from_millis(700));
    set("up");
    // The clients' link needs a moment for its carrier (veth) before traffic flows again.
    std::thread::sleep(Duration::from_millis(300));
    l.http_get("2", "100", "0.6", Some("1"));
    let o = wait_limited(c, Duration::from_secs(15));
    let err = err_lines(&o);
    let r = mode_report(&o, "relay");
    check_schema(&r);
    let after = lines(&tg_log).len();
    eprintln!(
        "interface down/up: {before} then {after} at the target; {}",
        r["capture"]
    );
    let said = |what: &str| err.iter().filter(|l| l.contains(what)).count();
    assert_eq!(
        said(&format!("tcpkit copy: capture: {cap} went down:")),
        1,
        "{err:#?}"
    );
    assert_eq!(
        said(&format!("tcpkit copy: capture: {cap} is up again (down ")),
        1,
        "{err:#?}"
    );
    assert_eq!(u(&r, "capture.interface_downs"), 1, "{r:#}");
    let gap = r["capture"]["interface_down_seconds"].as_f64().unwrap();
    assert!((0.5..2.5).contains(&gap), "{gap} s down: {r:#}");
    // Copying went on after the interface came back.
    assert!(
        before >= 50 && after >= before + 50,
        "{before} then {after}"
    );
}

/// A tmpfs of `size`, mounted at a fresh directory for as long as the value lives.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let o = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tcpkit-test"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        SmallDisk { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// Issue 29: `--diff-out` on a disk that fills up. Before, writing stopped silently (one
/// `write_error` in the final report). Now the failure is said once on stderr when it happens,
/// the differences that could not be written are counted (`not_written`: written +
/// not_written = every difference within --diff-max), what was written is whole records,
/// and the copy goes on copying and comparing to the end, exit 0.
#[test]
fn diff_out_on_a_full_disk_is_said_once_counted_and_copying_goes_on() {
    let mut l = CopyLab::new("fcpdiskfull");
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    let disk = SmallDisk::new("8k");
    let out = disk.path("d.jsonl");
    let pcap = l.dir.path().join("d.pcap");
    // 30 sessions of 4 GETs whose captured answers differ from the target's: 120
    // differences, some 20 of which fit in 8 KiB.
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ncaptured\n".to_vec();
    let gets: Vec<(&str, Vec<u8>)> = (0..4).map(|_| ("/hello.txt", answer.clone())).collect();
    diff_capture(&pcap, 30, 43000, &gets);
    let o = l.copy_to_end(
        &[
            "-x",
            &rule_8080(),
            "--input",
            pcap.to_str().unwrap(),
            "--max-idle",
            "0.01",
            "--diff",
            "--diff-out",
            out.to_str().unwrap(),
            "--diff-max",
            "1000",
            "--json",
        ],
        Duration::from_secs(15),
    );
    let err = err_lines(&o);
    let d = diff_of(&o);
    let r = json(&o);
    eprintln!("full disk: {d}");
    assert_eq!(u(&r, "requests.answered"), 120, "{r:#}");
    assert_eq!(lines(&tg_log).len(), 120);
    assert_eq!(counts(&d), (120, 0, 120), "{d:#}");
    let written = records(&out).len() as u64;
    assert!(written > 0, "{d:#}");
    assert_eq!(u(&d, "written"), written, "{d:#}");
    assert_eq!(u(&d, "not_written"), 120 - written, "{d:#}");
    assert!(
        d["write_error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left on device")),
        "{d:#}"
    );
    let said: Vec<&String> = err.iter().filter(|l| l.contains("--diff-out")).collect();
    assert_eq!(said.len(), 1, "{err:#?}");
    assert_eq!(
        *said[0],
        format!(
            "tcpkit copy: --diff-out {}: cannot write (No space left on device (os error 28)): \
             {written} differences written; the rest are still compared and counted, not written",
            out.display()
        )
    );
}

/// Issue 29: intercept killed (SIGKILL) and started again under a live transparent copy. The
/// copy said nothing until its final report; now it says on stderr, as each happens, that it
/// lost the control connection (how many copies in flight that cut) and that it reconnected
/// (after how long), and the report counts both.
#[test]
fn transparent_says_when_it_loses_intercept_and_when_it_reconnects() {
    let mut t = TLab::new("fcpicprst");
    t.filter = "src port 8080".into();
    let (_on_log, tg_log) = t.l.nginx_pair();
    let first = t.intercept("intercept1");
    let c = t.copy(&rule_8080(), &["--timeout", "1", "--duration", "3"]);
    let clients = t.l.clients.clone();
    let (o, before) = std::thread::scope(|s| {
        // A new connection per request: the sessions after the restart are new ones.
        let load = s.spawn(|| load(&clients, "100", "2.2", Some("1")));
        std::thread::sleep(Duration::from_millis(600));
        first.signal(Signal::SIGKILL).unwrap();
        first.wait_timeout(Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let _second = t.intercept("intercept2");
        let before = lines(&tg_log).len();
        load.join().unwrap();
        (wait_limited(c, Duration::from_secs(15)), before)
    });
    let err = err_lines(&o);
    // The copies cut are a few of some 220 requests: within --max-loss or just over it.
    assert!(matches!(o.status.code(), Some(0 | 1)), "{err:#?}");
    let r = json(&o);
    check_schema(&r);
    transparent_accounted(&r);
    let after = lines(&tg_log).len();
    let ia = t.intercept_addr();
    let lost = format!("tcpkit copy: lost the control connection to intercept {ia}: ");
    let back = format!("tcpkit copy: reconnected to intercept {ia} (down ");
    let lost_at = err.iter().position(|l| l.starts_with(&lost));
    let back_at = err.iter().position(|l| l.starts_with(&back));
    assert!(
        lost_at.is_some() && back_at > lost_at,
        "lost, then reconnected: {err:#?}"
    );
    let line = &err[lost_at.unwrap()];
    let cut = u(&r, "transparent.control_lost");
    assert!(
        line.contains(&format!(
            ": {cut} copies in flight cut (counted as control lost)"
        )),
        "{line} vs {r:#}"
    );
    assert_eq!(u(&r, "transparent.control_losses"), 1, "{r:#}");
    assert_eq!(u(&r, "transparent.control_reconnects"), 1, "{r:#}");
    assert!(after >= before + 40, "copying resumed: {before} -> {after}");
}

/// The frames intercept sends a connection that opens with `hello`, up to its close.
fn refusal(addr: &str, hello: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(hello).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    match Msg::parse(&got) {
        Ok((Msg::Refuse { reason, .. }, _)) => reason.to_string(),
        other => panic!("not a Refuse: {other:?} ({got:?})"),
    }
}

/// Issue 29 (small): a version-2 Hello without its nonce (cut short, or not from tcpkit copy)
/// was refused with "copy speaks control protocol version 2, this intercept speaks 2". The
/// refusal says what is wrong; a version-1 Hello is still told the versions differ.
#[test]
fn intercept_refuses_a_nonce_less_version_2_hello_naming_what_is_wrong() {
    let mut t = TLab::new("fcphello");
    let _icp = t.intercept("intercept");
    let hello = |version: u16| {
        let mut b = Vec::new();
        Msg::Hello {
            version,
            max_payload: 0,
            nonce: None,
        }
        .emit(&mut b);
        b
    };
    let addr = t.intercept_addr();
    let (v2, v1) =
        t.l.online
            .enter(|| (refusal(&addr, &hello(VERSION)), refusal(&addr, &hello(1))));
    assert_eq!(
        v2,
        "copy's version-2 Hello carries no nonce (cut short, or not sent by tcpkit copy)"
    );
    assert_eq!(
        v1,
        "copy speaks control protocol version 1, this intercept speaks 2"
    );
}

/// What a killed process of ours could leave in `host`: its processes (by name), sockets
/// it owned, its nftables ruleset and qdiscs (compared with `before`).
#[derive(Debug, PartialEq, Eq)]
struct HostState {
    tcpkit_procs: Vec<String>,
    tcpkit_sockets: Vec<String>,
    ruleset: String,
    qdiscs: String,
}

fn host_state(host: &Host) -> HostState {
    let text = |argv: &[&str]| {
        let o = host.run(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let pids = text(&["ip", "netns", "pids", host.netns()]);
    let tcpkit_procs = pids
        .split_whitespace()
        .filter_map(|p| {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
            comm.starts_with("tcpkit")
                .then(|| format!("{p} {}", comm.trim()))
        })
        .collect();
    // Every socket family (packet ones included) with its owner.
    let tcpkit_sockets = text(&["ss", "-Hanp", "-A", "all"])
        .lines()
        .filter(|l| l.contains("\"tcpkit\""))
        .map(String::from)
        .collect();
    HostState {
        tcpkit_procs,
        tcpkit_sockets,
        ruleset: text(&["nft", "list", "ruleset"]),
        qdiscs: text(&["tc", "qdisc", "show"]),
    }
}

/// BPF links held by `pids` (bpftool names each link's holders); empty when bpftool is not
/// there, which the lab's hosts have.
fn bpf_links_of(pids: &[u32]) -> Vec<String> {
    let Ok(o) = std::process::Command::new("bpftool")
        .args(["link", "show"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| pids.iter().any(|p| l.contains(&format!("({p})"))))
        .map(String::from)
        .collect()
}

/// Issue 29, what stays after a crash: a relay copy, a transparent copy and the intercept it
/// uses (capturing on the assistant), all SIGKILLed mid-run under load, leave nothing of
/// theirs on the hosts they ran on: no process, no socket (packet sockets included), no
/// nftables rule, no qdisc, no BPF link. (The namespaces are the lab's, and go with it.)
/// Needed no fix: a guard.
#[test]
fn copy_both_modes_and_intercept_sigkilled_leave_nothing_on_the_host() {
    let mut t = TLab::new("fcpcrash");
    t.filter = "src port 8080".into();
    t.l.nginx_pair();
    // Where they ran: the copies on the online host, intercept on the assistant.
    let hosts = [t.l.online.clone(), t.assistant.clone()];
    let before: Vec<HostState> = hosts.iter().map(host_state).collect();
    let icp = t.intercept("intercept");
    let mut transparent = t.copy(&rule_8080(), &["--timeout", "1"]);
    let mut relay = t.l.copy_rule(&rule_8080(), &["--timeout", "1"]);
    let pids = [icp.pid(), transparent.id(), relay.id()];
    let clients = t.l.clients.clone();
    std::thread::scope(|s| {
        let load = s.spawn(|| load(&clients, "200", "1", None));
        std::thread::sleep(Duration::from_millis(500));
        sigkill(&mut transparent);
        sigkill(&mut relay);
        icp.signal(Signal::SIGKILL).unwrap();
        icp.wait_timeout(Duration::from_secs(5))
            .unwrap()
            .expect("intercept did not die of SIGKILL");
        load.join().unwrap();
    });
    let t0 = Instant::now();
    let after: Vec<HostState> = hosts.iter().map(host_state).collect();
    for ((h, b), a) in hosts.iter().zip(&before).zip(&after) {
        assert_eq!(a, b, "{} after SIGKILL", h.name());
    }
    assert_eq!(bpf_links_of(&pids), Vec::<String>::new());
    eprintln!("checked in {:?}", t0.elapsed());
}

/// Issue 29: the target restarts mid-run (nginx stopped under keep-alive sessions and a new
/// connection per request, started again 0.6 s later). The copies in flight that its exit cut
/// are counted under a reason of their own, `target_gone` (before: reset or closed early, the
/// same as a target that resets a connection and is still there), in the report and the
/// summary's reason; the refusals meanwhile and its return are said on stderr as they happen
/// (the back-off probes it, one at a time, until it accepts); and the sessions after it is
/// back are copied.
fn target_restart(mode: Mode, tag: &str) {
    let mut m = ModeLab::new(tag, mode, 8080);
    let (_on, _) = m.l_mut().nginx(true, Log::Peer);
    let (tg, _) = m.l_mut().nginx(false, Log::Peer);
    let c = m.copy(&rule_8080(), &["--timeout", "1", "--duration", "3"]);
    let clients = m.l().clients.clone();
    let tg2 = std::thread::scope(|s| {
        let keep = s.spawn(|| load(&clients, "100", "2.2", None));
        let new = s.spawn(|| load(&clients, "50", "2.2", Some("1")));
        std::thread::sleep(Duration::from_millis(700));
        tg.stop().expect("stop nginx");
        std::thread::sleep(Duration::from_millis(600));
        let tg2 = m.l_mut().nginx(false, Log::Peer);
        keep.join().unwrap();
        new.join().unwrap();
        tg2
    });
    let o = wait_limited(c, Duration::from_secs(15));
    let err = err_lines(&o);
    let r = m.report_failed(&o, "is above --max-loss 1 %");
    let gone = u(&r, "sessions.failed.target_gone");
    eprintln!("{mode:?} target restart: {}", r["sessions"]);
    // The two keep-alive sessions' copies at least.
    assert!(gone >= 2, "{r:#}");
    assert!(
        r["failure"]
            .as_str()
            .is_some_and(|f| f.contains(&format!("{gone} target gone"))),
        "{r:#}"
    );
    for said in ["refused a connection (", "accepts connections again (down "] {
        let line = format!("tcpkit copy: target {TARGET}:8080 {said}");
        assert_eq!(
            err.iter().filter(|l| l.starts_with(&line)).count(),
            1,
            "{said}: {err:#?}"
        );
    }
    // Copied again once it was back: the last 0.9 s of new connections, 45 sessions.
    let after = lines(&tg2.1).len();
    assert!(after >= 30, "{after} requests after the restart: {r:#}");
}

#[test]
fn relay_target_restart_counts_the_copies_it_cut_as_target_gone() {
    target_restart(Mode::Relay, "fcptgrst");
}

#[test]
fn transparent_target_restart_counts_the_copies_it_cut_as_target_gone() {
    target_restart(Mode::Transparent, "fcptftgrst");
}

/// Issue 29: memory stays bounded while the target is away. Nothing listens on the target's
/// port (down), requests of 1 MB keep coming, --max-memory 2M, --timeout 3: the copies held
/// at the back-off's gate keep their queued bytes counted against the limit; past it copies
/// are shed (a reason of their own), the bytes held never pass the limit, and the rest count
/// as refused. (Needed no fix: a guard.)
#[test]
fn memory_stays_bounded_while_the_target_is_away() {
    let l = CopyLab::new("fcpaway");
    let p = l.dir.path().join("big.pcap");
    synth_pcap(&p, 6, 3, 1 << 20, None);
    let o = l.copy_to_end(
        &[
            "-x",
            &format!("8080-{TARGET}:9004"),
            "--input",
            p.to_str().unwrap(),
            "--max-memory",
            "2M",
            "--timeout",
            "3",
            "--json",
        ],
        Duration::from_secs(20),
    );
    let r = failed_report(&o, "the target answered none of the");
    check_schema(&r);
    let [refused, _, _, _, _, shed] = failed(&r);
    assert!(shed >= 1, "{r:#}");
    assert_eq!(refused + shed, 6, "{r:#}");
    assert!(u(&r, "memory.peak_held_bytes") <= 2 << 20, "{r:#}");
}

/// The netfilter queues bound in `host` (`/proc/net/netfilter/nfnetlink_queue`), by number.
fn bound_queues(host: &Host) -> Vec<String> {
    let o = host
        .run(&["cat", "/proc/net/netfilter/nfnetlink_queue"])
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    o.lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// Issue 29, intercept on the target SIGKILLed under a live transparent copy and started
/// again at once. What stays of the killed one is its nftables table and nothing else: the
/// table on purpose (its queue, unread, drops the answers rather than let them reach the
/// clients: it fails closed), no bound queue, no socket, no process. The new intercept takes
/// the table over and says so on stderr, listens within a second, the copy reconnects; once
/// it is stopped the target's ruleset is as it was before either ran.
#[test]
fn on_target_intercept_sigkilled_leaves_only_its_fail_closed_rule_and_a_restart_takes_it_over() {
    let mut t = OLab::new("fcpontkill");
    let (_on_log, tg_log) = t.l.nginx_pair();
    let target = t.l.target.clone();
    let ruleset = || {
        let o = target.run(&["nft", "list", "ruleset"]).expect("nft");
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let before = ruleset();
    let queue = t.queue;
    let start = |t: &mut OLab, name: &str| {
        let at = Instant::now();
        let p = t.intercept(name);
        (p, at.elapsed())
    };
    let (first, _) = start(&mut t, "intercept1");
    let c = t.copy(&["--duration", "2.5"]);
    let clients = t.l.clients.clone();
    let (second, took, left, before_restart) = std::thread::scope(|s| {
        let load = s.spawn(|| load(&clients, "100", "2", Some("1")));
        std::thread::sleep(Duration::from_millis(600));
        first.signal(Signal::SIGKILL).unwrap();
        first
            .wait_timeout(Duration::from_secs(5))
            .unwrap()
            .expect("intercept did not die of SIGKILL");
        let left = (
            ruleset(),
            bound_queues(&target),
            host_state(&target).tcpkit_sockets,
        );
        let before_restart = lines(&tg_log).len();
        let (second, took) = start(&mut t, "intercept2");
        load.join().unwrap();
        (second, took, left, before_restart)
    });
    let o = wait_limited(c, Duration::from_secs(15));
    let r = json(&o);
    check_schema(&r);
    let after = lines(&tg_log).len();
    let log = second.log();
    stop_intercept(&second, Signal::SIGTERM);
    eprintln!("on-target SIGKILL: restarted and listening in {took:?}; target {before_restart} -> {after}");
    // The killed one's rule stays, failing closed (its nftables table, or on a kernel
    // without nftables' queue its iptables chain); no queue bound, no socket.
    assert!(
        left.0
            .contains(&format!("table inet tcpkit_intercept_{queue}"))
            || left.0.contains(&format!("chain TCPKIT-INTERCEPT-{queue}")),
        "{}",
        left.0
    );
    assert_eq!(left.1, Vec::<String>::new(), "queues still bound");
    assert_eq!(left.2, Vec::<String>::new(), "sockets left");
    assert!(
        log.contains("tcpkit intercept: took over the ")
            && log.contains(&format!(" a killed intercept left on queue {queue}: ")),
        "{log}"
    );
    assert!(took < Duration::from_secs(1), "listening after {took:?}");
    assert!(u(&r, "transparent.control_reconnects") >= 1, "{r:#}");
    assert!(after >= before_restart + 30, "{before_restart} -> {after}");
    // Stopped: nothing of either is left.
    assert_eq!(ruleset(), before);
    assert_eq!(bound_queues(&target), Vec::<String>::new());
}
