//! Issue 29: `mpcat --resume`. A file-to-file transfer broken off (both sides SIGKILLed, the
//! receiver alone killed, every path cut) is started again with --resume on both sides and
//! sends only what the receiver does not hold: both reports say how much was held (skipped)
//! and sent, the output is the input (sha256sum), and the state file is gone. An input
//! changed since the break, or an output whose chunk differs, is refused with one line on
//! both sides. What a crash leaves: no socket of either side, no file but the output and its
//! resume state, and no namespace once the lab is gone.

use crate::common;
use common::mpcat::{fails, json_of, succeeds, verified_reports, wait, wait_arrived, Transfer};

use std::path::Path;
use std::time::Instant;

use serde_json::Value;
use tcpkit_lab::{Host, Proc, Signal};

const SIZE: u64 = 8 << 20;

/// The receiver's resume state beside the output.
fn state_of(output: &Path) -> std::path::PathBuf {
    tcpkit_mpcat::resume::state_path(output)
}

fn len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// Starts a transfer of [`SIZE`] bytes at 8 MiB/s over 2 links, both sides with --resume
/// (and `rx_extra` on the receiver), and waits until 2 MiB arrived.
fn broken_start(tag: &str, rx_extra: &[&str]) -> (Transfer, Proc, Proc) {
    let mut t = Transfer::with_input(tag, 2, None, SIZE);
    let args = [&["--resume", "--path-timeout", "1s"][..], rx_extra].concat();
    let rx = t.listen(&args);
    let tx = t.send(&[
        "--resume",
        "--rate-limit",
        "8M",
        "-n",
        "2",
        "--path-timeout",
        "1s",
    ]);
    wait_arrived(&t.output, 2 << 20, &tx, &rx);
    (t, tx, rx)
}

/// Runs the transfer again with --resume on both sides and --json; checks that both exit 0,
/// the output is the input, the state file is gone, and both reports say `held` bytes were
/// skipped and the rest sent. Returns the reports.
fn resumes(t: &mut Transfer, held: u64) -> (Value, Value) {
    assert!(state_of(&t.output).exists(), "no resume state was kept");
    let rx = t.listen_as("rx2", &["--resume", "--json"]);
    let tx = t.send_as("tx2", &["--resume", "--json", "-n", "2"]);
    t.arrives(&tx, 10, &rx, 5);
    let (jt, jr) = verified_reports(&tx, &rx, SIZE);
    for j in [&jt, &jr] {
        assert_eq!(j["resume"]["held"], held, "{j:#}");
        assert_eq!(j["resume"]["sent"], SIZE - held, "{j:#}");
    }
    // Only what the receiver lacked went over the streams.
    let carried: u64 = jt["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(carried, SIZE - held, "{jt:#}");
    assert!(
        !state_of(&t.output).exists(),
        "the state outlived the verified transfer"
    );
    (jt, jr)
}

/// No socket of an mpcat process left in `host`, and nothing listening on `port`.
fn no_socket_left(host: &Host, port: u16) {
    let out = host
        .run(&["ss", "-Htanp"])
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines() {
        assert!(!l.contains("tcpkit"), "a socket still held: {l}");
        assert!(
            !(l.starts_with("LISTEN") && l.contains(&format!(":{port} "))),
            "still listening: {l}"
        );
    }
}

/// The lab's folder holds the input, the output, its resume state and the logs, nothing
/// else (no temporary state file).
fn only_the_state_left(t: &Transfer) {
    let mut names: Vec<String> = std::fs::read_dir(t.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".log"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["in.bin", "out.bin", "out.bin.mpcat-resume"],
        "files left in {}",
        t.dir().display()
    );
}

/// The lab's namespaces are gone once it is dropped.
fn namespaces_gone(names: &[String]) {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    for n in names {
        assert!(
            !list.lines().any(|l| l.split_whitespace().next() == Some(n)),
            "namespace {n} left behind"
        );
    }
}

/// Both sides SIGKILLed mid-transfer: nothing of them is left but the output and its resume
/// state (no socket, no temporary file; the test's namespaces go with the lab), and a
/// --resume run sends only the rest.
#[test]
fn mpcat_resume_after_both_sides_are_killed_sends_only_the_rest() {
    let (mut t, tx, rx) = broken_start("mprsk", &[]);
    tx.signal(Signal::SIGKILL).unwrap();
    rx.signal(Signal::SIGKILL).unwrap();
    wait(&tx, 5);
    wait(&rx, 5);
    no_socket_left(&t.a, t.port);
    no_socket_left(&t.b, t.port);
    only_the_state_left(&t);
    let held = len(&t.output);
    assert!((2 << 20..SIZE).contains(&held), "{held} bytes held");
    resumes(&mut t, held);
    let names = t.lab.namespaces().to_vec();
    drop(t);
    namespaces_gone(&names);
}

/// The receiver alone SIGKILLed: the sender fails (no path left), and a --resume run sends
/// only what the receiver had not written.
#[test]
fn mpcat_resume_after_the_receiver_is_killed_sends_only_the_rest() {
    let (mut t, tx, rx) = broken_start("mprsr", &[]);
    rx.signal(Signal::SIGKILL).unwrap();
    wait(&rx, 5);
    let why = fails(&tx, 5);
    assert!(why.starts_with("tcpkit mpcat: "), "{why}");
    let held = len(&t.output);
    assert!((2 << 20..SIZE).contains(&held), "{held} bytes held");
    resumes(&mut t, held);
}

/// Every path cut (whatever arrives on either end of both links dropped, as cables pulled):
/// both sides fail, the links come back, and a --resume run sends only the rest.
#[test]
fn mpcat_resume_after_every_path_is_cut_sends_only_the_rest() {
    let (mut t, tx, rx) = broken_start("mprsc", &[]);
    for l in &t.links {
        for (h, name) in [(&t.a, &l.a.name), (&t.b, &l.b.name)] {
            h.drop_arriving(name).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let t0 = Instant::now();
    let (ts, rs) = (fails(&tx, 8), fails(&rx, 8));
    eprintln!("both sides failed {:?} after the cut", t0.elapsed());
    assert!(ts.contains("no path left"), "{}", tx.log());
    assert!(rs.starts_with("tcpkit mpcat: "), "{}", rx.log());
    for l in &t.links {
        for (h, name) in [(&t.a, &l.a.name), (&t.b, &l.b.name)] {
            h.stop_dropping(name).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let held = len(&t.output);
    assert!((2 << 20..SIZE).contains(&held), "{held} bytes held");
    resumes(&mut t, held);
}

/// Runs both sides with --resume (logs `rxN`, `txN`, the receiver with --json) and checks
/// that both exit 1, the side that refused (`by_sender`) with `says`, its peer with "the
/// sender (receiver) aborted the session: " and the same.
fn refused(t: &mut Transfer, n: &str, by_sender: bool, says: &str) -> Proc {
    let rx = t.listen_as(&format!("rx{n}"), &["--resume", "--json"]);
    let tx = t.send_as(&format!("tx{n}"), &["--resume"]);
    let (ts, rs) = (fails(&tx, 5), fails(&rx, 5));
    let (own, told, peer) = match by_sender {
        true => (&ts, &rs, "sender"),
        false => (&rs, &ts, "receiver"),
    };
    let logs = format!("{}\n{}", tx.log(), rx.log());
    assert!(own.starts_with(&format!("tcpkit mpcat: {says}")), "{logs}");
    assert!(
        told.starts_with(&format!(
            "tcpkit mpcat: the {peer} aborted the session: {says}"
        )),
        "{logs}"
    );
    rx
}

/// After a break, an input whose modification time changed is refused by the receiver (its
/// state names the old one), and with no state an output whose chunk differs from the input
/// is refused by the sender, naming the chunk: one line, exit 1, on both sides; the output is
/// left as it was.
#[test]
fn mpcat_resume_refuses_a_changed_input() {
    let (mut t, tx, rx) = broken_start("mprsx", &[]);
    tx.signal(Signal::SIGKILL).unwrap();
    rx.signal(Signal::SIGKILL).unwrap();
    wait(&tx, 5);
    wait(&rx, 5);
    let held = len(&t.output);
    let st = std::process::Command::new("touch")
        .args(["-d", "+1 minute"])
        .arg(&t.input)
        .status()
        .unwrap();
    assert!(st.success());
    refused(
        &mut t,
        "2",
        false,
        "--resume: the input changed since the transfer broke off (then 8388608 bytes, modified at",
    );
    assert_eq!(len(&t.output), held, "a refused resume changed the output");
    // No state (as after a transfer by other means): the chunks decide. One byte changed in
    // the second chunk.
    std::fs::remove_file(state_of(&t.output)).unwrap();
    let mut out = std::fs::read(&t.output).unwrap();
    out[(1 << 20) + 77] ^= 0xff;
    std::fs::write(&t.output, &out).unwrap();
    let rx = refused(
        &mut t,
        "3",
        true,
        "--resume: the receiver's output differs from the input in chunk 1 (bytes 1048576..2097152)",
    );
    assert_eq!(json_of(&rx)["verified"], false);
    assert_eq!(std::fs::read(&t.output).unwrap(), out);
    // Without the change the same output resumes.
    out[(1 << 20) + 77] ^= 0xff;
    std::fs::write(&t.output, &out).unwrap();
    let rx = t.listen_as("rx4", &["--resume"]);
    let tx = t.send_as("tx4", &["--resume"]);
    succeeds(&tx, 10);
    succeeds(&rx, 5);
    t.identical();
}
