//! `tcpkit mpcat --psk-file` in the lab's `multipath` topology: the stream arrives identical
//! (sha256sum outside tcpkit), nothing of it is readable on the wire (a tcpdump of every
//! link searched for a marker the input carries, beside a run without the key where the same
//! search finds it), and a key that differs is refused on both sides while the session goes
//! on.

use crate::common;
use common::mpcat::{fails, key_file, shaped, verified_reports, wait, wait_arrived, Transfer};
use common::tcpkit;

use std::path::Path;

use serde_json::Value;

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

/// Runs one session from a to b (receiver: -o output, --json; sender: -i input, --json)
/// with `extra` on both sides, tcpdump on every link; checks that both exit 0, the output
/// identical, both reports verified, and returns them and every capture's bytes together.
fn session(t: &mut Transfer, extra: &[&str]) -> (Value, Value, Vec<u8>) {
    let args = [&["--json"][..], extra].concat();
    let rx = t.listen(&args);
    let filter = format!("tcp port {}", t.port);
    let dumps: Vec<_> = t
        .links
        .iter()
        .map(|l| {
            t.lab
                .tcpdump(&t.a, &l.a.name, &filter)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let tx = t.send(&args);
    t.arrives(&tx, 30, &rx, 10);
    let mut wire = Vec::new();
    for d in dumps {
        let c = d.stop().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.dropped_by_kernel, 0,
            "an incomplete capture proves nothing"
        );
        wire.extend_from_slice(&std::fs::read(&c.path).unwrap());
    }
    let bytes = std::fs::metadata(&t.input).unwrap().len();
    let (jt, jr) = verified_reports(&tx, &rx, bytes);
    (jt, jr, wire)
}

/// Issue 12, --psk-file: with the key on both sides a 24 MiB stream over 2 links arrives
/// identical and both reports say `encrypted`; none of the input's 6,144 markers is on the
/// wire. The same capture of the same input without --psk-file finds the markers, so the
/// search would see a stream that leaked.
#[test]
fn mpcat_psk_file_encrypts_every_stream() {
    let mut t = Transfer::new("mpsk1", 2, None);
    let dir = t.dir();
    const SIZE: usize = 24 << 20;
    marked_file(&t.input, SIZE);
    let marks = count(&std::fs::read(&t.input).unwrap(), MARKER);
    assert_eq!(marks, SIZE / 4096);

    t.output = dir.join("plain.bin");
    let (jt, jr, wire) = session(&mut t, &[]);
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
    t.output = dir.join("out.bin");
    let (jt, jr, wire) = session(&mut t, &["--psk-file", key.to_str().unwrap()]);
    for j in [&jt, &jr] {
        assert_eq!(j["encrypted"], true, "{j}");
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
    // 40 Mbit/s in all: about 2.5 s, time for the stranger to come and be refused.
    const SIZE: usize = 12 << 20;
    let mut t = Transfer::new("mpsk2", 2, Some(shaped(20)));
    let dir = t.dir();
    marked_file(&t.input, SIZE);
    let good = key_file(&dir, "good", "the receiver's key, 32 bytes....\n");
    let other = key_file(&dir, "other", "a stranger's key, also long enough\n");
    let (good, other) = (good.to_str().unwrap(), other.to_str().unwrap());

    // A receiver without a key, a sender with one.
    t.output = "/dev/null".into();
    let rx = t.listen_as("rx-plain", &[]);
    let tx = t.send_as("tx-keyed", &["--psk-file", good]);
    let l = fails(&tx, 20);
    assert!(
        l.starts_with("tcpkit mpcat: ") && l.contains("this receiver has no --psk-file"),
        "{l}"
    );
    rx.signal(tcpkit_lab::Signal::SIGTERM).unwrap();
    wait(&rx, 10);

    t.output = dir.join("out.bin");
    let rx = t.listen(&["--json", "--psk-file", good]);
    let tx = t.send_as("tx-other", &["--psk-file", other]);
    let l = fails(&tx, 20);
    assert!(
        l.starts_with("tcpkit mpcat: ")
            && l.contains("the receiver holds another key (--psk-file)"),
        "{l}"
    );
    let tx = t.send_as("tx-nokey", &[]);
    let l = fails(&tx, 20);
    assert!(
        l.contains("this receiver takes encrypted sessions only") && l.contains("--psk-file"),
        "{l}"
    );

    // The right key: the session runs; a stranger with another key comes while it does.
    let tx = t.send(&["--psk-file", good, "--json"]);
    wait_arrived(&t.output, 1, &tx, &rx);
    let stranger = t.send_as("stranger", &["--psk-file", other]);
    let l = fails(&stranger, 20);
    assert!(l.contains("holds another key"), "{}", stranger.log());
    assert!(
        rx.try_status().unwrap().is_none(),
        "the receiver ended with the stranger:\n{}",
        rx.log()
    );
    t.arrives(&tx, 30, &rx, 10);
    let (_, j) = verified_reports(&tx, &rx, SIZE as u64);
    assert_eq!(j["connections"]["wrong_key"], 2, "{j}");
    assert_eq!(j["connections"]["bad_handshake"], 1, "{j}");
    assert_eq!(j["encrypted"], true);
}

/// Issue 12, --psk-file bad input: a key file others can read, one too short, one missing:
/// exit 2 (a file the command line names cannot be used: issue 24's exit-status rule) before
/// anything listens or connects, one line naming --psk-file and the file.
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
            let head = format!("tcpkit mpcat: --psk-file {}", f.display());
            let err = crate::common::usage_line(&out, &[why]);
            assert!(err.starts_with(&head), "{err}");
        }
    }
}

/// Issue 12, --psk-file and a path failure: one of 2 links goes down for good once the
/// stream flows. The connection on it stalls past --path-timeout, its chunks go out again
/// sealed on the other connection's keys, its reopening keeps failing (each attempt a new
/// Noise handshake that never completes), and the stream arrives identical.
#[test]
fn mpcat_psk_file_survives_a_path_failure() {
    let mut t = Transfer::new("mpsk3", 2, Some(shaped(40)));
    // 5 MB/s a link: 12 MiB are left when the link goes down, over 2 s on the other one,
    // and the stream cannot end before the stalled connection's chunks are sent again.
    const SIZE: usize = 16 << 20;
    marked_file(&t.input, SIZE);
    let key = key_file(&t.dir(), "psk", "a key for both ends, long enough\n");
    let k = key.to_str().unwrap();
    let both = ["--path-timeout", "2s", "--psk-file", k, "--json"];
    let rx = t.listen(&both);
    let tx = t.send(&[&["-n", "2"][..], &both].concat());
    wait_arrived(&t.output, 4 << 20, &tx, &rx);
    t.b.run(&["ip", "link", "set", "dev", &t.links[0].b.name, "down"])
        .unwrap_or_else(|e| panic!("{e}"));
    t.arrives(&tx, 40, &rx, 10);
    let (jt, jr) = verified_reports(&tx, &rx, SIZE as u64);
    for j in [&jt, &jr] {
        assert_eq!(j["encrypted"], true, "{j}");
    }
    assert!(!jt["path_failures"].as_array().unwrap().is_empty(), "{jt}");
    assert!(jt["resent_bytes"].as_u64().unwrap() > 0, "{jt}");
}
