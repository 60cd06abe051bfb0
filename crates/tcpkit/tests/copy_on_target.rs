//! `tcpkit copy --transparent` with `tcpkit intercept --on-target`, in the copy lab and no
//! assistant: clients → online (nginx; copy runs here) → target (nginx and intercept). The
//! target routes the clients' subnet back via the online host, as a target's default route
//! would send its answers toward the real clients; intercept's rule must queue and drop every
//! one of them. tcpdump on the target's link toward the online host is where a leak would
//! show, and a control at the end proves that capture sees such packets when they do leave.

use crate::copy_common;

use std::process::Child;
use std::time::{Duration, Instant};

use copy_common::*;
use serde_json::Value;
use tcpkit_lab::{Host, Proc, Signal, Tcpdump};

const CLIENTS: &str = "198.18.1.0/24";

pub(crate) struct OLab {
    pub(crate) l: CopyLab,
    /// intercept's --clients.
    clients: String,
    /// intercept's control port on the target.
    port: u16,
    /// The netfilter queue intercept reads.
    pub(crate) queue: u16,
}

impl OLab {
    pub(crate) fn new(tag: &str) -> OLab {
        let l = CopyLab::new(tag);
        // The target's way back to the clients is the online host (it does not forward):
        // answers that escaped intercept would be seen leaving on that link.
        l.target
            .run(&["ip", "route", "add", CLIENTS, "via", ONLINE_T])
            .expect("route");
        let id = std::process::id();
        OLab {
            l,
            clients: CLIENTS.into(),
            port: 30_000 + (id % 20_000) as u16,
            queue: 1_000 + (id % 30_000) as u16,
        }
    }

    /// intercept's command line, its control port on `listen`.
    fn intercept_args(&self, listen: &str) -> Vec<String> {
        let mut v: Vec<String> = [
            tcpkit(),
            "intercept",
            "--on-target",
            "--server-port",
            "8080",
            "--clients",
            &self.clients,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend([
            "--queue".into(),
            self.queue.to_string(),
            "--listen".into(),
            listen.into(),
            "--json".into(),
        ]);
        v
    }

    /// Starts intercept on the target and waits for its control port.
    pub(crate) fn intercept(&mut self, name: &str) -> Proc {
        let argv = self.intercept_args(&self.intercept_addr());
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let target = self.l.target.clone();
        let p = target
            .spawn(&mut self.l.lab, name, &argv)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_port(&self.l.target, TARGET, self.port, &p);
        p
    }

    pub(crate) fn intercept_addr(&self) -> String {
        format!("{TARGET}:{}", self.port)
    }

    pub(crate) fn copy(&self, extra: &[&str]) -> Child {
        let (rule, ia) = (rule_8080(), self.intercept_addr());
        let mut args = vec![
            "--transparent",
            "--intercept",
            &ia,
            "--timeout",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        self.l.copy_rule(&rule, &args)
    }

    /// Everything the target sends from port 8080 on its link toward the online host.
    fn watch(&mut self) -> Tcpdump {
        let (target, ifname) = (self.l.target.clone(), self.l.tgt_link.b.name.clone());
        self.l
            .lab
            .tcpdump(&target, &ifname, "tcp src port 8080")
            .expect("tcpdump")
    }

    /// The rule intercept installs, as the target's netfilter shows it: the nftables table,
    /// or on kernels without nftables' queue the iptables chain.
    fn rule_present(&self) -> bool {
        let table = format!("tcpkit_intercept_{}", self.queue);
        let chain = format!("TCPKIT-INTERCEPT-{}", self.queue);
        let ok = |argv: &[&str]| {
            self.l
                .target
                .command(argv)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        ok(&["nft", "list", "table", "inet", &table]) || ok(&["iptables", "-w", "-S", &chain])
    }
}

/// Lines of a capture that are packets from the target to a client address.
fn leaks(dump: Tcpdump) -> (Vec<String>, usize) {
    let text = dump.stop().expect("tcpdump").text().expect("tcpdump -r");
    let n = text.len();
    let bad = text
        .into_iter()
        .filter(|l| l.contains(&format!("{TARGET}.8080 > 198.18.1.")))
        .collect();
    (bad, n)
}

/// The control that makes the leak checks able to fail: with the rule gone, a connection
/// from the online host's client-side address (in the clients' prefix) gets its answer
/// back over the watched link, and the watch sees it.
fn watch_sees_a_leak_once_the_rule_is_gone(t: &mut OLab) {
    let dump = t.watch();
    let url = format!("http://{TARGET}:8080/hello.txt");
    let o =
        t.l.online
            .run(&[
                "curl",
                "-sS",
                "--max-time",
                "5",
                "--interface",
                ONLINE,
                &url,
            ])
            .expect("curl from the clients' prefix, the rule gone");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello from the lab\n");
    let (seen, _) = leaks(dump);
    assert!(
        seen.iter().any(|l| l.contains(&format!(" > {ONLINE}."))),
        "{seen:#?}"
    );
}

#[test]
fn on_target_intercept_loses_no_request_and_no_answer_leaves_the_target() {
    let start = Instant::now();
    let mut t = OLab::new("cpontgt");
    let (on_log, tg_log) = t.l.nginx_pair();
    let dump = t.watch();
    let icp = t.intercept("intercept");
    assert!(t.rule_present(), "no rule while intercept runs");
    let c = t.copy(&["--duration", "3"]);
    let clients = t.l.clients.clone();
    std::thread::scope(|s| {
        let a = s.spawn(|| load(&clients, "300", "2", None));
        let b = s.spawn(|| load(&clients, "150", "2", Some("1")));
        a.join().unwrap();
        b.join().unwrap();
    });
    let r = copy_done(c);
    stop_intercept(&icp, Signal::SIGINT);
    let (bad, watched) = leaks(dump);
    let online = lines(&on_log);
    let target = lines(&tg_log);
    eprintln!(
        "on target: {} requests online, {} at the target, {watched} packets from 8080 on the \
         target's link, {:.1} s",
        online.len(),
        target.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(online.len() > 800, "{} requests online", online.len());
    // Every request reached the target, from the clients' own address.
    assert_eq!(target.len(), online.len(), "{r:#}");
    assert_all_from(&target, CLIENT);
    assert!(target.iter().all(|l| l.contains(" 200 ")), "{target:?}");
    assert_eq!(r["mode"], "transparent");
    assert_all_completed(&r);
    assert_eq!(u(&r, "transparent.control_lost"), 0, "{r:#}");
    // Not one answer left the target toward a client.
    assert!(
        bad.is_empty(),
        "{} leaked: {:#?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    // intercept's report: the rule, the answers it queued and sent on.
    let ir = intercept_report(&icp);
    eprintln!("intercept: {ir}");
    assert_eq!(ir["mode"], "on-target", "{ir:#}");
    assert_eq!(ir["interface"], format!("queue {}", t.queue), "{ir:#}");
    assert_eq!(
        ir["filter"], "tcp sport { 8080 } ip daddr { 198.18.1.0/24 }",
        "{ir:#}"
    );
    assert_eq!(ir["stale_rule_replaced"], false, "{ir:#}");
    assert_eq!(u(&ir, "copies_connected"), 1, "{ir:#}");
    assert!(
        u(&ir, "sent") >= u(&r, "transparent.answers_received"),
        "{ir:#}"
    );
    assert_eq!(u(&ir, "kernel_drops"), 0, "{ir:#}");
    assert_eq!(ir["failure"], Value::Null);
    // The rule went with intercept, and the watch would have seen a leak.
    assert!(!t.rule_present(), "the rule outlived intercept");
    watch_sees_a_leak_once_the_rule_is_gone(&mut t);
}

#[test]
fn on_target_intercept_killed_fails_closed_and_a_restarted_one_replaces_its_rule() {
    let mut t = OLab::new("cpontkill");
    let (on_log, tg_log) = t.l.nginx_pair();
    let dump = t.watch();
    let first = t.intercept("intercept1");
    let c = t.copy(&["--duration", "5"]);
    let clients = t.l.clients.clone();
    // The killed intercept's gap costs the copies in flight their answers
    // ([`intercept_restarted`]).
    let (second, r, before) = intercept_restarted(&clients, &tg_log, c, &first, || {
        // Killed: the rule stays, and with nobody reading its queue the answers are dropped.
        assert!(t.rule_present(), "the rule went with a killed intercept");
        t.intercept("intercept2")
    });
    let after = lines(&tg_log).len();
    stop_intercept(&second, Signal::SIGTERM);
    let (bad, watched) = leaks(dump);
    eprintln!(
        "on-target restart: online {} target {after} (before restart {before}), {watched} \
         packets from 8080 on the target's link; {}",
        lines(&on_log).len(),
        r["transparent"]
    );
    // Nothing left the target, the killed intercept's gap included.
    assert!(
        bad.is_empty(),
        "{} leaked: {:#?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert_resumed(&r, before, after);
    let ir = intercept_report(&second);
    assert_eq!(ir["stale_rule_replaced"], true, "{ir:#}");
    assert!(u(&ir, "copies_connected") >= 1, "{ir:#}");
    assert!(!t.rule_present(), "the rule outlived SIGTERM");
    watch_sees_a_leak_once_the_rule_is_gone(&mut t);
}

/// The target's whole netfilter ruleset, as `nft list ruleset` prints it.
fn ruleset(t: &OLab) -> String {
    let o = t.l.target.run(&["nft", "list", "ruleset"]).expect("nft");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// Issue 24 item 16: on a kernel without nftables' queue, intercept's iptables fallback left
/// an empty `table ip filter` (with its OUTPUT chain) behind. intercept leaves the ruleset as
/// it found it: what it created goes, what was there before stays, rules and all.
#[test]
fn on_target_intercept_leaves_the_targets_ruleset_as_it_found_it() {
    let mut t = OLab::new("cpontrs");
    let cycle = |t: &mut OLab, name: &str| {
        let before = ruleset(t);
        let icp = t.intercept(name);
        assert!(t.rule_present());
        assert_ne!(ruleset(t), before, "the rule is in the ruleset");
        stop_intercept(&icp, Signal::SIGINT);
        assert_eq!(ruleset(t), before);
    };
    // A namespace with no table at all.
    cycle(&mut t, "intercept");
    // iptables' filter table there already, with a rule in INPUT and no OUTPUT chain: the
    // table and its rule stay, the OUTPUT chain intercept's jump needed goes.
    let o =
        t.l.target
            .run(&[
                "iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT",
            ])
            .expect("iptables");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    cycle(&mut t, "intercept2");
    assert!(ruleset(&t).contains("table ip filter"));
}

/// The target's TCP connections from port 8080 to the clients' prefix, established.
fn copied_connections(t: &OLab) -> usize {
    let o =
        t.l.target
            .run(&[
                "ss",
                "-H",
                "-t",
                "-n",
                "state",
                "established",
                "( sport = :8080 )",
                "and",
                "( dst 198.18.1.0/24 )",
            ])
            .expect("ss");
    String::from_utf8_lossy(&o.stdout).lines().count()
}

#[test]
fn on_target_intercept_exit_aborts_the_copied_connections_a_dead_copy_left() {
    let mut t = OLab::new("cpontabrt");
    let (_, tg_log) = t.l.nginx_pair();
    let dump = t.watch();
    let icp = t.intercept("intercept");
    let mut c = t.copy(&["--duration", "30"]);
    let clients = t.l.clients.clone();
    // Keep-alive sessions, still open when the copy dies.
    std::thread::scope(|s| {
        let a = s.spawn(|| load(&clients, "50", "3", None));
        let deadline = Instant::now() + Duration::from_secs(10);
        while lines(&tg_log).len() < 20 {
            assert!(Instant::now() < deadline, "no copies reached the target");
            std::thread::sleep(Duration::from_millis(50));
        }
        c.kill().unwrap();
        c.wait().unwrap();
        a.join().unwrap();
    });
    // The dead copy's sessions stay open on the target (nginx keeps them for 75 s): left
    // alone, each would send a FIN to a real client once the rule is gone.
    let open = copied_connections(&t);
    assert!(open >= 1, "nothing left open to abort");
    stop_intercept(&icp, Signal::SIGTERM);
    let ir = intercept_report(&icp);
    eprintln!("{open} copied connections open at intercept's exit: {ir}");
    assert!(u(&ir, "connections_aborted") >= open as u64, "{ir:#}");
    assert_eq!(copied_connections(&t), 0);
    assert!(!t.rule_present());
    // Their resets were queued by the rule still in place and dropped.
    std::thread::sleep(Duration::from_millis(300));
    let (bad, _) = leaks(dump);
    assert!(bad.is_empty(), "{bad:#?}");
}

/// `ARGV` in `host` to completion.
fn run_in(host: &Host, argv: &[&str]) -> std::process::Output {
    run_limited(host.command(argv), Duration::from_secs(10))
}

#[test]
fn on_target_refusals_are_one_line_and_touch_no_rule() {
    let mut t = OLab::new("cpontbad");
    let held = t.intercept("intercept");
    assert!(t.rule_present());
    // The queue is taken: refused before any rule changes; the first keeps its rule.
    let other = format!("{TARGET}:{}", t.port + 1);
    let mut argv = t.intercept_args(&other);
    argv.retain(|a| a != "--json");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let o = run_in(&t.l.target, &argv);
    one_line_failure(
        &o,
        &format!(
            "tcpkit intercept: --on-target: netfilter queue {} is taken by another reader (netlink port ",
            t.queue
        ),
        "; stop it or choose another queue",
    );
    assert!(
        t.rule_present(),
        "a refused intercept removed the first one's rule"
    );
    stop_intercept(&held, Signal::SIGINT);
    assert!(!t.rule_present());
    // nft is not there.
    let mut env = vec!["env", "PATH=/nonexistent"];
    env.extend_from_slice(&argv);
    one_line_failure(
        &run_in(&t.l.target, &env),
        "tcpkit intercept: --on-target: nft not found: ",
        "(apt-get install nftables)",
    );
    // Not root.
    one_line_failure(
        &run_limited(unprivileged(&t.l.target, &argv), Duration::from_secs(10)),
        &format!(
            "tcpkit intercept: --on-target: netfilter queue {}: bind refused by the kernel (needs root or CAP_NET_ADMIN)",
            t.queue
        ),
        "Operation not permitted",
    );
    assert!(!t.rule_present());
    // A usage error: exit 2, one line.
    let o = run_in(
        &t.l.target,
        &[
            tcpkit(),
            "intercept",
            "--on-target",
            "--server-port",
            "8080",
            "--capture",
            "eth0",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tcpkit intercept: ") && err.contains("--capture"),
        "{err}"
    );
    // A key file that cannot be used as given is a usage error too (issue 24 item 15: it
    // exited 1): exit 2, one line naming the flag and the file, and no rule touched.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open_key = dir.path().join("open.key");
    std::fs::write(&open_key, "0123456789abcdef0123\n").unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open_key = open_key.to_str().unwrap();
    for (key, want) in [
        (
            open_key,
            format!("tcpkit intercept: --auth-key-file {open_key}: readable by others than its owner (mode 0644): chmod 600 it\n"),
        ),
        (
            "/nonexistent.key",
            "tcpkit intercept: --auth-key-file /nonexistent.key: No such file or directory (os error 2)\n".into(),
        ),
    ] {
        let mut a = argv.clone();
        a.extend_from_slice(&["--auth-key-file", key]);
        let o = run_in(&t.l.target, &a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!((o.status.code(), &*err), (Some(2), &*want));
        assert!(o.stdout.is_empty());
        assert!(!t.rule_present());
    }
}

/// `copy --check` with intercept on the target: the return-path probe comes back through
/// the queue; when intercept's rule does not cover the probe's address, the advice is about
/// that rule and the target's own route, not about an assistant.
#[test]
fn check_probes_the_return_path_through_an_intercept_on_the_target() {
    let mut t = OLab::new("cpontchk");
    let (_tg, _) = t.l.nginx(false, Log::Peer);
    let ia = t.intercept_addr();
    let check = |t: &OLab| {
        let r = check_return_path(&t.l, &ia, &["-c", CLIENTS]);
        (r.code, r.line)
    };
    let head = format!("return path {TARGET}:8080 via intercept {ia} (on the target): ");

    let icp = t.intercept("intercept");
    let (code, l) = check(&t);
    assert_eq!(code, Some(0), "{l}");
    assert!(
        l.starts_with(&format!("OK   {head}a SYN from 198.18.1.1:"))
            && l.contains("answered with SYN-ACK (reset at once), caught by intercept in"),
        "{l}"
    );
    stop_intercept(&icp, Signal::SIGINT);

    // intercept's rule catches answers to another prefix only.
    t.clients = "10.99.0.0/16".into();
    let _icp = t.intercept("intercept2");
    let (code, l) = check(&t);
    assert_eq!(code, Some(1), "{l}");
    assert!(
        l.starts_with(&format!("FAIL {head}a SYN from 198.18.1.1:"))
            && l.contains("got no answer through intercept within 2 s")
            && l.contains(
                "intercept runs on the target: its --on-target rule must catch the answer, so give it --server-port 8080 and --clients covering 198.18.1.1"
            )
            && l.contains("rp_filter")
            && !l.contains("via <assistant>"),
        "{l}"
    );
}
