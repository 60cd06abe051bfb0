//! Issue 24: mpcat as a user of OpenBSD nc runs it (items 9, 15 and 18): `-l PORT` and
//! `-l ADDR PORT`, -v, -s, the listener's answer waited for as nc waits, --json and the exit
//! status of a run that fails before its session, the progress line on a terminal (under
//! `script`, which gives the sender a pty) and -k's summaries.

use crate::common;
use common::mpcat::{fails, json_of, last_line, succeeds, wait_listening, Transfer};
use common::tcpkit;

use std::process::Command;

use tcpkit_lab::{Proc, Signal, MULTIPATH_A4, MULTIPATH_B4, MULTIPATH_B6};

/// Starts `tcpkit mpcat ARGS...` in the receiving host `b`, its log named `name`.
fn in_b(t: &mut Transfer, name: &str, args: &[&str]) -> Proc {
    let argv = [&[tcpkit(), "mpcat"][..], args].concat();
    t.b.spawn(&mut t.lab, name, &argv)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Starts `sh -c CMD` in the sending host `a`, its log named `name`.
fn sh_in_a(t: &mut Transfer, name: &str, cmd: &str) -> Proc {
    t.a.spawn(&mut t.lab, name, &["sh", "-c", cmd])
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Item 9: `-l ADDR PORT` listens on that address alone, as nc's does (the same host's IPv6
/// address refuses, said as a refused connect to HOST:PORT); -v says each connection on both
/// sides; -s ADDR is the sender's source address.
#[test]
fn mpcat_listens_on_one_address_and_says_its_connections() {
    let mut t = Transfer::with_input("mpcnc", 1, None, 1 << 20);
    let (p, out) = (t.port.to_string(), t.output.to_str().unwrap().to_string());
    let rx = in_b(&mut t, "rx", &["-v", "-l", MULTIPATH_B4, &p, "-o", &out]);
    wait_listening(&t.b, t.port);
    let input = t.input.to_str().unwrap().to_string();
    let six = sh_in_a(
        &mut t,
        "tx6",
        &format!("exec {} mpcat -i {input} {MULTIPATH_B6} {p}", tcpkit()),
    );
    let why = fails(&six, 5);
    assert!(
        why.contains(&format!("connect refused to [{MULTIPATH_B6}]:{p}")),
        "{}",
        six.log()
    );
    let tx = sh_in_a(
        &mut t,
        "tx",
        &format!(
            "exec {} mpcat -v -s {MULTIPATH_A4} -i {input} {MULTIPATH_B4} {p}",
            tcpkit()
        ),
    );
    t.arrives(&tx, 10, &rx, 5);
    let (tl, rl) = (tx.log(), rx.log());
    assert!(
        rl.contains(&format!("tcpkit mpcat: listening on {MULTIPATH_B4}:{p}\n")),
        "{rl}"
    );
    assert!(
        rl.contains(&format!("tcpkit mpcat: connection from {MULTIPATH_A4}:"))
            && rl.contains(": stream 0 of 1\n")
            && rl.contains(": the reverse stream\n"),
        "{rl}"
    );
    assert!(
        tl.contains(&format!("tcpkit mpcat: connected {MULTIPATH_A4}:"))
            && tl.contains(&format!(" to {MULTIPATH_B4}:{p}")),
        "{tl}"
    );
}

/// Item 9: `echo cmd | mpcat HOST P` gets the listener's whole answer, as with OpenBSD nc
/// (which waits for the peer's close): by default the connecting side waits for the
/// listener's input to end. The listener here answers half a second after it starts, well
/// after the forward stream (4 bytes) was delivered.
#[test]
fn mpcat_waits_for_the_listeners_answer_as_nc() {
    let mut t = Transfer::new("mpcans", 1, None);
    let p = t.port.to_string();
    let out = t.output.to_str().unwrap().to_string();
    let rx =
        t.b.spawn(
            &mut t.lab,
            "rx",
            &[
                "sh",
                "-c",
                &format!(
                    "(sleep 0.5; echo answer) | exec {} mpcat -l {p} -o {out}",
                    tcpkit()
                ),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    wait_listening(&t.b, t.port);
    let tx = sh_in_a(
        &mut t,
        "tx",
        &format!("echo cmd | exec {} mpcat {MULTIPATH_B4} {p}", tcpkit()),
    );
    succeeds(&tx, 5);
    succeeds(&rx, 5);
    assert_eq!(std::fs::read_to_string(&t.output).unwrap(), "cmd\n");
    let log = tx.log();
    assert!(log.starts_with("answer\n"), "{log}");
    assert!(
        log.contains("  reverse: received 7 bytes from the listener, verified\n"),
        "{log}"
    );
}

/// Item 9: -w SECS as nc's idle timeout: a sender whose input sends nothing (a fifo it holds
/// open itself, as a terminal nobody types into) ends after SECS with exit 1, and its
/// receiver is told why at once.
#[test]
fn mpcat_wait_ends_an_idle_run() {
    let mut t = Transfer::new("mpcidle", 1, None);
    let rx = t.listen(&[]);
    let silent = t.dir().join("silent");
    let st = Command::new("mkfifo").arg(&silent).status().unwrap();
    assert!(st.success());
    let cmd = format!(
        "exec {} mpcat -w 1 {MULTIPATH_B4} {} 0<>{}",
        tcpkit(),
        t.port,
        silent.display()
    );
    let t0 = std::time::Instant::now();
    let tx = sh_in_a(&mut t, "tx", &cmd);
    let why = fails(&tx, 5);
    let took = t0.elapsed();
    assert_eq!(
        why,
        "tcpkit mpcat: -w 1s: nothing was acknowledged for that long, 0 bytes in all",
        "{}",
        tx.log()
    );
    assert!(
        took >= std::time::Duration::from_secs(1) && took < std::time::Duration::from_secs(3),
        "{took:?}"
    );
    let told = fails(&rx, 5);
    assert!(
        told.starts_with("tcpkit mpcat: the sender aborted the session: -w 1s: "),
        "{}",
        rx.log()
    );
}

/// Item 15: a run that fails before its session began still prints its --json document
/// (the failure in it, every count 0), and says a refused connect as one (not as the
/// reverse stream's); a file it cannot use exits 2 with one line naming flag and file.
#[test]
fn mpcat_failures_before_the_session_print_json_and_files_exit_2() {
    let mut t = Transfer::with_input("mpcjson", 1, None, 4096);
    let (p, input) = (t.port.to_string(), t.input.to_str().unwrap().to_string());
    let to = format!("{MULTIPATH_B4}:{p}");
    let tx = sh_in_a(
        &mut t,
        "tx",
        &format!(
            "exec {} mpcat --json -i {input} {MULTIPATH_B4} {p}",
            tcpkit()
        ),
    );
    let why = fails(&tx, 5);
    let j = json_of(&tx);
    assert_eq!(j["role"], "send");
    assert_eq!(j["verified"], false);
    assert_eq!(j["sessions"], 0);
    let failure = j["failure"].as_str().unwrap();
    assert!(
        failure.starts_with(&format!("connect refused to {to}")),
        "{j}"
    );
    assert_eq!(why, format!("tcpkit mpcat: {failure}"));
    // Duplex (no --json): the first connection is the reverse stream's, but what failed is
    // reaching the receiver.
    let duplex = sh_in_a(
        &mut t,
        "tx-duplex",
        &format!("exec {} mpcat -i {input} {MULTIPATH_B4} {p}", tcpkit()),
    );
    let why = fails(&duplex, 5);
    assert!(
        why.starts_with(&format!("tcpkit mpcat: connect refused to {to}"))
            && !why.contains("reverse"),
        "{why}"
    );
    // Files: exit 2, one line, nothing run.
    let key = t.dir().join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(tcpkit())
            .arg("mpcat")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        err
    };
    let missing = t.dir().join("missing.bin");
    let err = run(&["-i", missing.to_str().unwrap(), "127.0.0.1", "9"]);
    assert!(
        err.starts_with(&format!("tcpkit mpcat: -i {}: ", missing.display())),
        "{err}"
    );
    let err = run(&["--psk-file", key.to_str().unwrap(), "127.0.0.1", "9"]);
    assert!(
        err.starts_with(&format!("tcpkit mpcat: --psk-file {}: ", key.display()))
            && err.contains("chmod 600"),
        "{err}"
    );
}

/// Item 18: on a terminal the progress line is cleared before the summary, not left above
/// it at 90-odd percent. The sender runs under `script`, whose pty is its stderr; the
/// escape that clears the line (indicatif's `ESC [2K`) must come after the last drawing of
/// the line and before the summary.
#[test]
fn mpcat_progress_line_is_cleared_before_the_summary() {
    let mut t = Transfer::with_input("mpcpty", 1, None, 2 << 20);
    let rx = t.listen(&[]);
    let cmd = format!(
        "{} mpcat --rate-limit 3M -i {} {MULTIPATH_B4} {}",
        tcpkit(),
        t.input.display(),
        t.port
    );
    let tx =
        t.a.spawn(&mut t.lab, "tx", &["script", "-qec", &cmd, "/dev/null"])
            .unwrap_or_else(|e| panic!("{e}"));
    t.arrives(&tx, 10, &rx, 5);
    let log = tx.log();
    let summary = log
        .find("mpcat: sent ")
        .unwrap_or_else(|| panic!("no summary:\n{log:?}"));
    let before = &log[..summary];
    let drawn = before
        .rfind(" MiB/s")
        .unwrap_or_else(|| panic!("no progress line was drawn:\n{log:?}"));
    assert!(
        before[drawn..].contains("\x1b[2K"),
        "the progress line stays above the summary:\n{log:?}"
    );
}

/// Waits until a -k listener has summed up `n` sessions: its last session ends a moment
/// after its sender's (the sender's Done for the reverse stream is on its way), and a
/// Ctrl-C before that cuts it short, as a user who stops it before its summary would.
fn summed_up(rx: &Proc, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while rx.log().matches("mpcat: received ").count() < n {
        assert!(std::time::Instant::now() < deadline, "{}", rx.log());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Item 18: with -k each session's summary is printed once, as it ends, and the run's
/// total after the last (and in --json, `run`).
#[test]
fn mpcat_keep_listening_sums_up_each_session_once_and_the_run() {
    const SIZE: u64 = 64 << 10;
    let mut t = Transfer::with_input("mpckeep", 1, None, SIZE);
    let rx = two_sessions(&mut t, "", &[]);
    let log = rx.log();
    assert_eq!(log.matches("mpcat: received ").count(), 2, "{log}");
    assert!(
        log.contains(&format!(
            "mpcat: run total: 2 sessions, 2 verified, {} bytes",
            2 * SIZE
        )),
        "{log}"
    );
    assert!(
        last_line(&rx).starts_with("refused: 0 wrong token"),
        "{log}"
    );
    // --json: one document, the run in it.
    t.port += 1;
    let rx = two_sessions(&mut t, "-json", &["--json"]);
    let j = json_of(&rx);
    assert_eq!(j["run"]["sessions"], 2, "{j}");
    assert_eq!(j["run"]["sessions_verified"], 2, "{j}");
    assert_eq!(j["run"]["bytes"], 2 * SIZE, "{j}");
}

/// A `-k -l PORT` listener (with `args`), two sessions sent to it one after the other,
/// then Ctrl-C once it has summed up the second: it exits 0.
fn two_sessions(t: &mut Transfer, tag: &str, args: &[&str]) -> Proc {
    let (p, out) = (t.port.to_string(), t.output.to_str().unwrap().to_string());
    let argv = [&["-k", "-l", &p, "-o", &out][..], args].concat();
    let rx = in_b(t, &format!("rx{tag}"), &argv);
    wait_listening(&t.b, t.port);
    for k in 0..2 {
        let tx = t.send_as(&format!("tx{tag}{k}"), &[]);
        succeeds(&tx, 5);
        summed_up(&rx, k + 1);
    }
    rx.signal(Signal::SIGINT).unwrap();
    succeeds(&rx, 5);
    rx
}
