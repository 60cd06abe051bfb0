//! `tcpkit mpcat --psk-file` in the lab's `multipath` topology: the stream arrives identical
//! (sha256sum outside tcpkit), nothing of it is readable on the wire (a tcpdump of every
//! link searched for a marker the input carries, beside a run without the key where the same
//! search finds it), and a key that differs is refused on both sides while the session goes
//! on.

use crate::common;
use common::mpcat::{json_of, listen, port, send, sha256, shaped, wait, wait_listening};
use common::tcpkit;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tcpkit_lab::{Host, Lab, Proc, MULTIPATH_B4};

fn last_line(p: &Proc) -> String {
    p.log().lines().last().unwrap_or_default().to_string()
}

/// A key file of `text`, mode 600.
fn key_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// Printed into the input every 4 KiB, so a readable stream shows it in most packets.
const MARKER: &[u8] = b"<<tcpkit mpcat plaintext marker 7f3a>>";

/// `bytes` of random data with [`MARKER`] at every 4 KiB.
fn marked_file(path: &Path, bytes: usize) {
    let mut data = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut data))
        .unwrap();
    for at in (0..bytes.saturating_sub(MARKER.len())).step_by(4096) {
        data[at..at + MARKER.len()].copy_from_slice(MARKER);
    }
    std::fs::write(path, &data).unwrap();
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Runs one session from a to b (receiver: -o out, --json; sender: -i input, --json) with
/// `extra` on both sides, tcpdump on every link; returns both reports and every capture's
/// bytes together.
fn session(
    lab: &mut Lab,
    a: &Host,
    b: &Host,
    links: &[tcpkit_lab::Link],
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> (Value, Value, Vec<u8>) {
    let port = port();
    let p = port.to_string();
    let mut argv = vec![
        tcpkit(),
        "mpcat",
        "-l",
        "-p",
        &p,
        "-o",
        output.to_str().unwrap(),
        "--json",
    ];
    argv.extend_from_slice(extra);
    let rx = b.spawn(lab, "rx", &argv).unwrap_or_else(|e| panic!("{e}"));
    wait_listening(b, port);
    let dumps: Vec<_> = links
        .iter()
        .map(|l| {
            lab.tcpdump(a, &l.a.name, &format!("tcp port {port}"))
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let mut argv = vec![tcpkit(), "mpcat", "-i", input.to_str().unwrap(), "--json"];
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&[MULTIPATH_B4, &p]);
    let tx = a.spawn(lab, "tx", &argv).unwrap_or_else(|e| panic!("{e}"));
    let st = wait(&tx, 30);
    assert!(st.success(), "sender: {st}\n{}", tx.log());
    let st = wait(&rx, 10);
    assert!(st.success(), "receiver: {st}\n{}", rx.log());
    let mut wire = Vec::new();
    for d in dumps {
        let c = d.stop().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.dropped_by_kernel, 0,
            "an incomplete capture proves nothing"
        );
        wire.extend_from_slice(&std::fs::read(&c.path).unwrap());
    }
    (json_of(&tx), json_of(&rx), wire)
}

/// Issue 12, --psk-file: with the key on both sides a 24 MiB stream over 2 links arrives
/// identical and both reports say `encrypted`; none of the input's 6,144 markers is on the
/// wire. The same capture of the same input without --psk-file finds the markers, so the
/// search would see a stream that leaked.
#[test]
fn mpcat_psk_file_encrypts_every_stream() {
    let (mut lab, a, b, links) = Lab::multipath("mpsk1", 2, None).unwrap_or_else(|e| panic!("{e}"));
    let dir = lab.dir().to_path_buf();
    let input = dir.join("in.bin");
    const SIZE: usize = 24 << 20;
    marked_file(&input, SIZE);
    let marks = count(&std::fs::read(&input).unwrap(), MARKER);
    assert_eq!(marks, SIZE / 4096);

    let plain_out = dir.join("plain.bin");
    let (jt, jr, wire) = session(&mut lab, &a, &b, &links, &input, &plain_out, &[]);
    assert_eq!(sha256(&input), sha256(&plain_out));
    assert_eq!(
        (jt["encrypted"].clone(), jr["encrypted"].clone()),
        (false.into(), false.into())
    );
    let seen = count(&wire, MARKER);
    assert!(
        seen >= marks / 2,
        "the control run shows {seen} of {marks} markers: the capture cannot tell"
    );

    let key = key_file(&dir, "psk", "correct horse battery staple 2026\n");
    let k = key.to_str().unwrap();
    let out = dir.join("out.bin");
    let (jt, jr, wire) = session(&mut lab, &a, &b, &links, &input, &out, &["--psk-file", k]);
    assert_eq!(sha256(&input), sha256(&out), "the stream differs");
    for j in [&jt, &jr] {
        assert_eq!(j["encrypted"], true, "{j}");
        assert_eq!(j["verified"], true, "{j}");
        assert_eq!(j["bytes"], SIZE as u64, "{j}");
        assert_eq!(j["streams"].as_array().unwrap().len(), 2, "{j}");
    }
    assert!(
        wire.len() > SIZE,
        "the capture holds the stream ({} bytes)",
        wire.len()
    );
    assert_eq!(
        count(&wire, MARKER),
        0,
        "the input's marker is readable on the wire"
    );
}

/// Issue 12, --psk-file refused: a sender with another key exits 1, its last line saying the
/// receiver holds another key; a sender without a key, and a receiver without one, refuse
/// with what to give. While a keyed session runs, a stranger with another key is refused and
/// counted, and the session completes identical.
#[test]
fn mpcat_psk_file_wrong_key_is_refused_on_both_sides() {
    let (mut lab, a, b, _links) =
        Lab::multipath("mpsk2", 2, Some(shaped(20))).unwrap_or_else(|e| panic!("{e}"));
    let dir = lab.dir().to_path_buf();
    let input = dir.join("in.bin");
    // 40 Mbit/s in all: several seconds, time for the stranger to come.
    const SIZE: usize = 24 << 20;
    marked_file(&input, SIZE);
    let good = key_file(&dir, "good", "the receiver's key, 32 bytes....\n");
    let other = key_file(&dir, "other", "a stranger's key, also long enough\n");
    let (good, other) = (good.to_str().unwrap(), other.to_str().unwrap());
    let out = dir.join("out.bin");
    let port = port();
    let p = port.to_string();
    let sender = |lab: &mut Lab, name: &str, extra: &[&str]| {
        let mut argv = vec![tcpkit(), "mpcat", "-i", input.to_str().unwrap()];
        argv.extend_from_slice(extra);
        argv.extend_from_slice(&[MULTIPATH_B4, &p]);
        a.spawn(lab, name, &argv).unwrap_or_else(|e| panic!("{e}"))
    };

    // A receiver without a key, a sender with one.
    let rx = b
        .spawn(
            &mut lab,
            "rx-plain",
            &[tcpkit(), "mpcat", "-l", "-p", &p, "-o", "/dev/null"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    wait_listening(&b, port);
    let tx = sender(&mut lab, "tx-keyed", &["--psk-file", good]);
    assert_eq!(wait(&tx, 20).code(), Some(1), "{}", tx.log());
    let l = last_line(&tx);
    assert!(
        l.starts_with("tcpkit mpcat: ") && l.contains("this receiver has no --psk-file"),
        "{l}"
    );
    rx.signal(tcpkit_lab::Signal::SIGTERM).unwrap();
    wait(&rx, 10);

    let rx = listen(
        &b,
        &mut lab,
        port,
        &["-o", out.to_str().unwrap(), "--json", "--psk-file", good],
    );
    let tx = sender(&mut lab, "tx-other", &["--psk-file", other]);
    assert_eq!(wait(&tx, 20).code(), Some(1), "{}", tx.log());
    let l = last_line(&tx);
    assert!(
        l.starts_with("tcpkit mpcat: ")
            && l.contains("the receiver holds another key (--psk-file)"),
        "{l}"
    );
    let tx = sender(&mut lab, "tx-nokey", &[]);
    assert_eq!(wait(&tx, 20).code(), Some(1), "{}", tx.log());
    let l = last_line(&tx);
    assert!(
        l.contains("this receiver takes encrypted sessions only") && l.contains("--psk-file"),
        "{l}"
    );

    // The right key: the session runs; a stranger with another key comes while it does.
    let tx = sender(&mut lab, "tx", &["--psk-file", good, "--json"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&out).map_or(0, |m| m.len()) == 0 {
        assert!(Instant::now() < deadline, "nothing arrived:\n{}", rx.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let stranger = sender(&mut lab, "stranger", &["--psk-file", other]);
    assert_eq!(wait(&stranger, 20).code(), Some(1), "{}", stranger.log());
    assert!(
        last_line(&stranger).contains("holds another key"),
        "{}",
        stranger.log()
    );
    assert!(
        rx.try_status().unwrap().is_none(),
        "the receiver ended with the stranger:\n{}",
        rx.log()
    );
    let st = wait(&tx, 30);
    assert!(st.success(), "sender: {st}\n{}", tx.log());
    let st = wait(&rx, 10);
    assert!(st.success(), "receiver: {st}\n{}", rx.log());
    assert_eq!(sha256(&input), sha256(&out), "the stream differs");
    let j = json_of(&rx);
    assert_eq!(j["connections"]["wrong_key"], 2, "{j}");
    assert_eq!(j["connections"]["bad_handshake"], 1, "{j}");
    assert_eq!(j["encrypted"], true);
    assert_eq!(j["verified"], true);
    assert!(json_of(&tx)["verified"] == true);
}

/// Issue 12, --psk-file bad input: a key file others can read, one too short, one missing:
/// exit 1 before anything listens or connects, one line naming --psk-file and the file.
#[test]
fn mpcat_psk_file_bad_key_files_are_named() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::write(&open, "a key that is long enough\n").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let short = key_file(dir.path(), "short", "too short\n");
    let missing = dir.path().join("missing");
    for (f, why) in [
        (
            &open,
            "readable by others than its owner (mode 0644): chmod 600 it",
        ),
        (&short, "the key is 9 bytes, at least 16 are needed"),
        (&missing, "No such file"),
    ] {
        for side in [&["-l", "-p", "1"][..], &["127.0.0.1", "1"][..]] {
            let out = std::process::Command::new(tcpkit())
                .args(["mpcat", "--psk-file", f.to_str().unwrap()])
                .args(side)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                err.starts_with(&format!("tcpkit mpcat: --psk-file {}", f.display()))
                    && err.contains(why),
                "{err}"
            );
        }
    }
}

/// Issue 12, --psk-file and a path failure: one of 2 links goes down for good once the
/// stream flows. The connection on it stalls past --path-timeout, its chunks go out again
/// sealed on the other connection's keys, its reopening keeps failing (each attempt a new
/// Noise handshake that never completes), and the stream arrives identical.
#[test]
fn mpcat_psk_file_survives_a_path_failure() {
    let (mut lab, a, b, links) =
        Lab::multipath("mpsk3", 2, Some(shaped(40))).unwrap_or_else(|e| panic!("{e}"));
    let dir = lab.dir().to_path_buf();
    let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
    const SIZE: usize = 40 << 20;
    marked_file(&input, SIZE);
    let key = key_file(&dir, "psk", "a key for both ends, long enough\n");
    let k = key.to_str().unwrap();
    let port = port();
    let out = output.to_str().unwrap();
    let rx = listen(
        &b,
        &mut lab,
        port,
        &["-o", out, "--json", "--psk-file", k, "--path-timeout", "2s"],
    );
    let tx = send(
        &a,
        &mut lab,
        port,
        &[
            "-n",
            "2",
            "--path-timeout",
            "2s",
            "--psk-file",
            k,
            "-i",
            input.to_str().unwrap(),
            "--json",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&output).map_or(0, |m| m.len()) < 4 << 20 {
        assert!(Instant::now() < deadline, "nothing arrived:\n{}", rx.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    b.run(&["ip", "link", "set", "dev", &links[0].b.name, "down"])
        .unwrap_or_else(|e| panic!("{e}"));
    let st = wait(&tx, 40);
    assert!(st.success(), "sender: {st}\n{}", tx.log());
    let st = wait(&rx, 10);
    assert!(st.success(), "receiver: {st}\n{}", rx.log());
    assert_eq!(sha256(&input), sha256(&output), "the stream differs");
    let (jt, jr) = (json_of(&tx), json_of(&rx));
    for j in [&jt, &jr] {
        assert_eq!(j["verified"], true, "{j}");
        assert_eq!(j["encrypted"], true, "{j}");
    }
    assert!(!jt["path_failures"].as_array().unwrap().is_empty(), "{jt}");
    assert!(jt["resent_bytes"].as_u64().unwrap() > 0, "{jt}");
}
