//! What the mpcat tests share: their port, waiting for a listener or a process, random
//! inputs and their hashes, the report (checked against its schema), shaped links.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tcpkit_lab::{Host, Lab, Proc, Tbf, MULTIPATH_B4};

use super::schema;

/// A port for this test process (no fixed ports: the namespaces are new, but two runs of a
/// test binary at once should not meet even if they shared one).
pub fn port() -> u16 {
    20000 + (std::process::id() % 30000) as u16
}

/// Waits until something listens on `port` in `host` (`ss`, not a probe connection, which
/// the receiver would count as a bad handshake).
pub fn wait_listening(host: &Host, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = host
            .run(&["ss", "-Hltn", &format!("sport = :{port}")])
            .unwrap_or_else(|e| panic!("{e}"));
        if !out.stdout.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts the receiver, `tcpkit mpcat -l -p PORT ARGS...`, in `host` (its log named "rx"),
/// and waits until it listens.
pub fn listen(host: &Host, lab: &mut Lab, port: u16, args: &[&str]) -> Proc {
    let p = port.to_string();
    let mut argv = vec![super::tcpkit(), "mpcat", "-l", "-p", &p];
    argv.extend_from_slice(args);
    let rx = host
        .spawn(lab, "rx", &argv)
        .unwrap_or_else(|e| panic!("{e}"));
    wait_listening(host, port);
    rx
}

/// Starts the sender, `tcpkit mpcat ARGS... B PORT` toward the multipath lab's far host, in
/// `host` (its log named "tx").
pub fn send(host: &Host, lab: &mut Lab, port: u16, args: &[&str]) -> Proc {
    send_as(host, lab, "tx", port, args)
}

/// [`send`], its log named `name` (for a test that runs several senders).
pub fn send_as(host: &Host, lab: &mut Lab, name: &str, port: u16, args: &[&str]) -> Proc {
    let p = port.to_string();
    let mut argv = vec![super::tcpkit(), "mpcat"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&[MULTIPATH_B4, &p]);
    host.spawn(lab, name, &argv)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until `output` holds `bytes`, while the sender still runs (10 s at most).
pub fn wait_arrived(output: &Path, bytes: u64, tx: &Proc, rx: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(output).map_or(0, |m| m.len()) < bytes {
        assert!(
            Instant::now() < deadline,
            "nothing arrived:\n{}\n{}",
            tx.log(),
            rx.log()
        );
        assert!(
            tx.try_status().unwrap().is_none(),
            "sender ended early:\n{}",
            tx.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait(p: &Proc, secs: u64) -> std::process::ExitStatus {
    p.wait_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("{} still running after {secs} s:\n{}", p.name(), p.log()))
}

/// `bytes` of random data in `path` (from the kernel's generator, so no two runs share it).
pub fn random_file(path: &Path, bytes: u64) {
    let out = std::process::Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/urandom"])
        .stdout(std::fs::File::create(path).unwrap())
        .status()
        .unwrap();
    assert!(out.success());
    assert_eq!(std::fs::metadata(path).unwrap().len(), bytes);
}

pub fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// The JSON document a process printed (its log holds stdout then stderr lines; the
/// document is the lines from the first `{` to the matching last `}`).
pub fn json_of(p: &Proc) -> Value {
    let log = p.log();
    let start = log
        .find("{\n")
        .unwrap_or_else(|| panic!("no JSON in:\n{log}"));
    let end = log
        .rfind("\n}")
        .unwrap_or_else(|| panic!("no JSON end in:\n{log}"))
        + 2;
    let v: Value = serde_json::from_str(&log[start..end]).unwrap_or_else(|e| panic!("{e}:\n{log}"));
    schema::check(&schema::load("mpcat"), &v, p.name());
    v
}

pub fn shaped(mbit: u64) -> Tbf {
    Tbf {
        rate_bit_s: mbit * 1_000_000,
        burst_bytes: 64_000,
        latency_ms: 100,
    }
}
