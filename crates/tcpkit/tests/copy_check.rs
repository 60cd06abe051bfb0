//! `tcpkit copy --check` in the copy lab: the target down is a FAIL with its fix and exit 1;
//! with everything in place every line is OK and the exit status 0; a wrong interface, a
//! memory limit past the host's, a busy --metrics address and (--transparent) an intercept
//! that is not there each say how to fix them.

mod copy_common;

use std::net::TcpListener;
use std::time::Duration;

use copy_common::*;

fn check(l: &CopyLab, args: &[&str]) -> (Option<i32>, String, String) {
    let mut argv = vec![tcpkit(), "copy", "--check"];
    argv.extend_from_slice(args);
    let o = run_limited(l.online.command(&argv), Duration::from_secs(20));
    (
        o.status.code(),
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    )
}

#[test]
fn target_down_fails_with_the_fix_then_all_ok() {
    let mut l = CopyLab::new("cpchk");
    let rule = format!("8080-{TARGET}:8080");
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
    let rule = format!("8080-{TARGET}:8080");
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
