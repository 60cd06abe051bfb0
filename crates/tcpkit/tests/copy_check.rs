//! `tcpkit copy --check` in the copy lab: the target down is a FAIL with its fix and exit 1;
//! with everything in place every line is OK and the exit status 0; a wrong interface, a
//! memory limit past the host's, a busy --metrics address and (--transparent) an intercept
//! that is not there each say how to fix them; a target whose strict reverse-path filter
//! drops the copies fails the return-path check with rp_filter in the fix.

use crate::copy_common;

use std::net::TcpListener;
use std::time::Duration;

use copy_common::*;

fn check(l: &CopyLab, args: &[&str]) -> (Option<i32>, String, String) {
    let o = l.copy_to_end(&[&["--check"], args].concat(), Duration::from_secs(20));
    (
        o.status.code(),
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    )
}

#[test]
fn target_down_fails_with_the_fix_then_all_ok() {
    let mut l = CopyLab::new("cpchk");
    let rule = rule_8080();
    let cap = l.capture_if();
    let (code, out, err) = check(&l, &["-x", &rule, "-i", &cap]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(err, "tcpkit copy: --check: 1 of 4 checks failed\n");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[0].starts_with(&format!("OK   capture on {cap}: ")),
        "{out}"
    );
    assert!(
        lines[1].starts_with(&format!("FAIL target {TARGET}:8080: connect: "))
            && lines[1].contains("; fix: nothing listens there: start the server on the target"),
        "{out}"
    );
    assert!(lines[2].starts_with("OK   conntrack: "), "{out}");
    assert!(
        lines[3].starts_with("OK   memory limit: --max-memory "),
        "{out}"
    );
    // Nothing was copied: no capture report.
    assert!(!out.contains("Sessions:"));

    let (_tg, _) = l.nginx(false, Log::Peer);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d.jsonl");
    let (code, out, err) = check(
        &l,
        &[
            "-x",
            &rule,
            "-i",
            &cap,
            "--diff",
            "--diff-out",
            d.to_str().unwrap(),
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.lines().count(), 6, "{out}");
    assert!(out.lines().all(|x| x.starts_with("OK   ")), "{out}");
    assert!(out.contains(&format!("OK   target {TARGET}:8080: connected in ")));
    assert!(!d.exists(), "--check creates nothing");

    // The same as JSON.
    let (code, out, _) = check(&l, &["-x", &rule, "-i", &cap, "--json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|c| c["ok"] == true && c["fix"].is_null()));
    assert_eq!(a[1]["name"], format!("target {TARGET}:8080"));
}

#[test]
fn wrong_interface_memory_and_metrics_address_each_say_the_fix() {
    let mut l = CopyLab::new("cpchk2");
    let (_tg, _) = l.nginx(false, Log::Peer);
    let rule = rule_8080();
    let busy = l.online.enter(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let busy_addr = busy.local_addr().unwrap().to_string();
    let (code, out, _) = check(
        &l,
        &[
            "-x",
            &rule,
            "-i",
            "nosuch0",
            "--max-memory",
            "100000G",
            "--metrics",
            &busy_addr,
        ],
    );
    assert_eq!(code, Some(1), "{out}");
    let fail: Vec<&str> = out.lines().filter(|x| x.starts_with("FAIL")).collect();
    assert_eq!(fail.len(), 3, "{out}");
    assert!(
        fail[0].starts_with("FAIL capture on nosuch0: ") && fail[0].contains("ip -br link"),
        "{out}"
    );
    assert!(
        fail[1].starts_with("FAIL memory limit: --max-memory 102400000 MiB")
            && fail[1].contains("; fix: --max-memory "),
        "{out}"
    );
    assert!(
        fail[2].starts_with(&format!("FAIL --metrics {busy_addr}: bind: "))
            && fail[2].contains("ss -ltn"),
        "{out}"
    );
    assert!(out.contains(&format!("OK   target {TARGET}:8080")));
    // --transparent: the intercept's handshake is checked too (none runs here). Its address
    // is the target's: the advice is to run it there.
    let cap = l.capture_if();
    let (code, out, _) = check(
        &l,
        &[
            "-x",
            &rule,
            "-i",
            &cap,
            "--transparent",
            "--intercept",
            TARGET,
        ],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.lines().any(
            |x| x.starts_with(&format!("FAIL intercept {TARGET}:36524: "))
                && x.contains("; fix: start `tcpkit intercept --on-target --server-port <port>` on the target")
        ),
        "{out}"
    );
    // Offline: the input file is checked instead of the capture.
    let (code, out, _) = check(&l, &["-x", &rule, "--input", "/nonexistent.pcap"]);
    assert_eq!(code, Some(1));
    assert!(out.starts_with("FAIL input /nonexistent.pcap: "), "{out}");
    drop(busy);
}

/// The kernel's count of packets its reverse-path filter dropped, in `host`'s namespace.
fn rp_filter_drops(host: &tcpkit_lab::Host) -> u64 {
    let o = host.run(&["cat", "/proc/net/netstat"]).expect("netstat");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut l = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (l.next().unwrap(), l.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|n| n == "IPReversePathFilter")
        .expect("IPReversePathFilter in /proc/net/netstat");
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// `--check --transparent` when the target filters reverse paths strictly: the copies arrive
/// from the online host while the target routes their (the clients') addresses via the
/// assistant, so a strict filter drops every copied SYN. The return-path line is OK with
/// the filter off, and FAIL naming rp_filter once it is on; the kernel's own count shows the
/// probe was dropped by that filter and not by something else.
#[test]
fn strict_reverse_path_filter_on_the_target_fails_the_return_path_check() {
    use copy_common::tlab::TLab;
    let mut t = TLab::new("cpchkrp");
    let (_tg, _) = t.l.nginx(false, Log::Peer);
    let _icp = t.intercept("intercept");
    let ia = t.intercept_addr();
    let head = format!("return path {TARGET}:8080 via intercept {ia}: ");
    let r = check_return_path(
        &t.l,
        &ia,
        &["-c", "198.18.1.0/24", "--auth-key-file", t.key_arg()],
    );
    assert_eq!(r.code, Some(0), "{}{}", r.out, r.err);
    assert!(
        r.line
            .starts_with(&format!("OK   {head}a SYN from 198.18.1.1:")),
        "{}",
        r.out
    );

    for k in ["all", &t.l.tgt_link.b.name] {
        t.l.target
            .sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "1")
            .expect("rp_filter");
    }
    let dropped = rp_filter_drops(&t.l.target);
    let ReturnPath {
        code,
        line: l,
        out,
        err,
    } = check_return_path(
        &t.l,
        &ia,
        &["-c", "198.18.1.0/24", "--auth-key-file", t.key_arg()],
    );
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(err, "tcpkit copy: --check: 1 of 6 checks failed\n", "{out}");
    assert!(
        l.starts_with(&format!("FAIL {head}a SYN from 198.18.1.1:"))
            && l.contains("got no answer through intercept within 2 s; fix: ")
            && l.contains("`sysctl -w net.ipv4.conf.all.rp_filter=0`, and on the interface the copies arrive on"),
        "{out}"
    );
    assert!(
        rp_filter_drops(&t.l.target) > dropped,
        "the target's reverse-path filter dropped nothing: {out}"
    );
    // Everything else still passes: the target itself answers this host.
    assert!(
        out.contains(&format!("OK   target {TARGET}:8080: connected in ")),
        "{out}"
    );
}

/// `--check` says whether copy and intercept hold the same key, and each way they can
/// disagree has its own line and fix; a copy run with another key than intercept's fails at
/// start, one line, exit 1.
#[test]
fn check_says_whether_the_keys_match() {
    use copy_common::tlab::{write_key, TLab};
    let mut t = TLab::new("cpchkkey");
    let (_tg, _) = t.l.nginx(false, Log::Peer);
    let rule = rule_8080();
    let cap = t.l.capture_if();
    let ia = t.intercept_addr();
    let other = t.l.dir.path().join("other.key");
    write_key(&other, "not the lab's key, but long enough\n");
    let other = other.to_str().unwrap().to_string();
    let key = t.key_arg().to_string();
    let line = |t: &TLab, extra: &[&str]| {
        let mut a = vec!["-x", &rule, "-i", &cap, "--transparent", "--intercept", &ia];
        // The return-path probe's source: every other check passes.
        a.extend(["-c", "198.18.1.0/24"]);
        a.extend_from_slice(extra);
        let (code, out, err) = check(&t.l, &a);
        let l = out
            .lines()
            .find(|l| l.contains(&format!(" intercept {ia}: ")))
            .unwrap_or_else(|| panic!("{out}{err}"))
            .to_string();
        (code, l)
    };
    let icp = t.intercept("intercept");
    let (code, l) = line(&t, &["--auth-key-file", &key]);
    assert!(
        l.starts_with("OK   ") && l.contains("the key proved both ways"),
        "{l}"
    );
    assert_eq!(code, Some(0), "{l}");
    let (code, l) = line(&t, &["--auth-key-file", &other]);
    assert_eq!(code, Some(1));
    assert!(
        l.starts_with("FAIL ")
            && l.contains("holds another key than this copy's --auth-key-file")
            && l.contains("fix: copy and intercept must read the same key"),
        "{l}"
    );
    let (_, l) = line(&t, &[]);
    assert!(
        l.starts_with("FAIL ")
            && l.contains("asks copies for a key")
            && l.contains("fix: give copy --auth-key-file"),
        "{l}"
    );
    let lab_key = t.key.replace(other.clone().into());
    let o = t.copy_offline(&rule, &["--input", "/dev/null"]);
    t.key = lab_key;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.trim_end()
            .lines()
            .last()
            .unwrap()
            .contains("holds another key than this copy's --auth-key-file"),
        "{err}"
    );
    icp.signal(tcpkit_lab::Signal::SIGINT).unwrap();
    icp.wait_timeout(Duration::from_secs(10)).unwrap();
    // intercept without a key, copy with one.
    t.key = None;
    let _icp = t.intercept("intercept2");
    let (_, l) = line(&t, &["--auth-key-file", &key]);
    assert!(
        l.starts_with("FAIL ") && l.contains("does not authenticate copies"),
        "{l}"
    );
    let (code, l) = line(&t, &[]);
    assert!(
        l.starts_with("OK   ") && l.contains("not authenticated"),
        "{l}"
    );
    assert_eq!(code, Some(0), "{l}");
}
