//! `tcpkit mpcat` both ways (issue 12, netcat semantics): the listener's input goes back to
//! the connecting side on its own verified stream; -N waits for the listener's answer, -q
//! bounds the wait; a reverse stream cut short fails the connecting side, naming it. The real
//! binary on both hosts of the lab's `multipath` topology, every stream checked outside
//! tcpkit (sha256sum).

use crate::common;
use common::mpcat::{
    fails, json_of, key_file, random_file, sha256, succeeds, verified_reports, wait,
    wait_listening, Transfer,
};
use common::tcpkit;

use std::path::Path;
use std::time::{Duration, Instant};

use tcpkit_lab::{Signal, MULTIPATH_B4};

fn mkfifo(p: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Both directions at once over 2 streams, plain and with --psk-file: the connecting side's
/// 24 MiB arrive at the listener's -o and the listener's 16 MiB (-i) at the connecting
/// side's -o, each identical; both reports say both directions were verified, and the
/// reverse stream ended at the listener's EOF (-N waits for it), not by a Stop.
#[test]
fn mpcat_duplex_both_directions_arrive_identical() {
    // The forward stream is the input (in.bin), the reverse one `rev`.
    let mut t = Transfer::with_input("mpdup1", 2, None, 24 << 20);
    let dir = t.dir();
    let rev = dir.join("rev.bin");
    random_file(&rev, 16 << 20);
    let key = key_file(&dir, "psk", "both directions, one key, 32 bytes\n");
    for (k, extra) in [vec![], vec!["--psk-file", key.to_str().unwrap()]]
        .into_iter()
        .enumerate()
    {
        let back = dir.join(format!("back{k}"));
        t.output = dir.join(format!("out{k}"));
        let rx_args = [&["-i", rev.to_str().unwrap(), "--json"][..], &extra].concat();
        let rx = t.listen_as(&format!("rx{k}"), &rx_args);
        let back_s = back.to_str().unwrap();
        let tx_args = [&["-N", "-n", "2", "-o", back_s, "--json"][..], &extra].concat();
        let tx = t.send_as(&format!("tx{k}"), &tx_args);
        t.arrives(&tx, 60, &rx, 10);
        assert_eq!(sha256(&rev), sha256(&back), "the reverse stream differs");
        let (jt, jr) = verified_reports(&tx, &rx, 24 << 20);
        for j in [jt, jr] {
            assert_eq!(j["encrypted"], k == 1, "{j}");
            assert_eq!(j["streams"].as_array().unwrap().len(), 2, "{j}");
            let r = &j["reverse"];
            assert_eq!(r["verified"], true, "{j}");
            assert_eq!(r["stopped"], false, "{j}");
            assert_eq!(r["bytes"], 16u64 << 20, "{j}");
            assert_eq!(r["total"], 16u64 << 20, "{j}");
        }
    }
}

/// -N with a shell-like peer: the listener's output and input are fifos to a process that
/// answers only once its input has ended (`sha256sum`). The connecting side sends 8 MiB with
/// -N: the listener closes its output when the stream is verified, so sha256sum sees EOF and
/// answers while the session is still open, and its answer, computed from the whole input,
/// arrives at the connecting side's -o. Both exit 0.
#[test]
fn mpcat_half_close_lets_the_peer_answer() {
    let mut t = Transfer::with_input("mpdup2", 2, None, 8 << 20);
    let dir = t.dir();
    let answer = dir.join("answer");
    let (to_peer, from_peer) = (dir.join("to-peer"), dir.join("from-peer"));
    mkfifo(&to_peer);
    mkfifo(&from_peer);
    // mpcat opens its -o before its -i, and the peer its input before its output, so neither
    // waits on the other's fifo.
    let peer =
        t.b.spawn(
            &mut t.lab,
            "peer",
            &[
                "sh",
                "-c",
                &format!(
                    "sha256sum < {} > {}",
                    to_peer.display(),
                    from_peer.display()
                ),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    t.output = to_peer;
    let rx = t.listen(&["-i", from_peer.to_str().unwrap()]);
    let tx = t.send(&["-N", "-n", "2", "-o", answer.to_str().unwrap()]);
    succeeds(&tx, 30);
    succeeds(&rx, 10);
    succeeds(&peer, 10);
    let got = std::fs::read_to_string(&answer).unwrap();
    assert_eq!(
        got,
        format!("{}  -\n", sha256(&t.input)),
        "the peer's answer"
    );
    assert!(
        tx.log()
            .contains("reverse: received 68 bytes from the listener, verified"),
        "{}",
        tx.log()
    );
}

/// The listener's input never ends and sends nothing (a fifo it holds open itself, as a
/// terminal nobody types into). With -q 0 the one-way copy ends as soon as it is delivered
/// (without -q it waits for the listener's input to end, as OpenBSD nc: issue 24's
/// mpcat_nc::mpcat_waits_for_the_listeners_answer_as_nc). With -q 2 the connecting side
/// waits 2 s for the listener's
/// stream, stops it, and both exit 0 with an empty reverse stream that was ended by the
/// connecting side. Only a lower bound on the time (and a generous upper one).
#[test]
fn mpcat_quit_after_waits_then_stops_the_reverse_stream() {
    let mut t = Transfer::with_input("mpdup3", 1, None, 1 << 20);
    let (back, silent) = (t.dir().join("back"), t.dir().join("silent"));
    mkfifo(&silent);
    // Opened read-write, the fifo has a writer for as long as mpcat runs: no EOF, no data.
    let script = format!(
        "exec {} mpcat -l -p {} -o {} 0<>{}",
        tcpkit(),
        t.port,
        t.output.display(),
        silent.display()
    );
    let listener = |t: &mut Transfer, name: &str| {
        let rx =
            t.b.spawn(&mut t.lab, name, &["bash", "-c", &script])
                .unwrap_or_else(|e| panic!("{e}"));
        wait_listening(&t.b, t.port);
        rx
    };
    let rx = listener(&mut t, "rx0");
    let tx = t.send_as("tx0", &["--quiet", "-q", "0"]);
    t.arrives(&tx, 30, &rx, 10);
    assert!(
        rx.log().contains("reverse: sent 0 bytes to the connecting side, verified (stopped by the connecting side)"),
        "{}",
        rx.log()
    );

    let rx = listener(&mut t, "rx");
    let t0 = Instant::now();
    let tx = t.send(&["-q", "2", "-o", back.to_str().unwrap(), "--json"]);
    succeeds(&tx, 30);
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(2), "quit after {took:?}");
    assert!(took < Duration::from_secs(20), "quit after {took:?}");
    succeeds(&rx, 10);
    t.identical();
    assert_eq!(std::fs::metadata(&back).unwrap().len(), 0);
    let j = json_of(&tx);
    assert_eq!(j["reverse"]["stopped"], true, "{j}");
    assert_eq!(j["reverse"]["verified"], true, "{j}");
    assert_eq!(j["reverse"]["bytes"], 0, "{j}");
}

/// Which side a reverse-stream test kills once 1 MiB of the listener's input has come back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Killed {
    Listener,
    ConnectingSide,
}

/// A reverse stream cut short: the listener sends 1 MiB of its input (a fifo this test
/// writes) and, once it has arrived and before the input ends, one side is SIGKILLed. The
/// other exits 1, its last line naming the reverse stream and the bytes that came or went;
/// never 0 with a short output. Killing the listener: the connecting side (-N, waiting for
/// the rest) fails. Killing the connecting side: the listener, whose forward stream was
/// verified, fails.
fn reverse_stream_cut(tag: &str, killed: Killed) {
    use std::io::Write;

    let mut t = Transfer::with_input(tag, 1, None, 64 << 10);
    let dir = t.dir();
    let (back, feed, chunk) = (dir.join("back"), dir.join("feed"), dir.join("chunk"));
    mkfifo(&feed);
    random_file(&chunk, 1 << 20);
    let rx = t.start_listener("rx", &[], &["-i", feed.to_str().unwrap()]);
    // Opening the fifo waits for the listener to open it (at its start), and the writes for
    // the reverse stream to take them: on a thread, which hands the still open fifo back.
    let writer = {
        let (feed, chunk) = (feed.clone(), chunk.clone());
        std::thread::spawn(move || {
            let mut w = std::fs::OpenOptions::new().write(true).open(&feed).unwrap();
            w.write_all(&std::fs::read(&chunk).unwrap()).unwrap();
            w
        })
    };
    wait_listening(&t.b, t.port);
    let tx = t.send(&["-N", "-o", back.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&back).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(
            Instant::now() < deadline,
            "the reverse stream did not arrive:\n{}\n{}",
            tx.log(),
            rx.log()
        );
        assert!(tx.try_status().unwrap().is_none(), "{}", tx.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let w = writer.join().unwrap();
    let (dead, survivor, who, why) = match killed {
        Killed::Listener => (
            &rx,
            &tx,
            "sender",
            "tcpkit mpcat: the reverse stream (listener to here): ",
        ),
        Killed::ConnectingSide => (
            &tx,
            &rx,
            "listener",
            "tcpkit mpcat: the reverse stream (here to the connecting side): cut after 1048576 bytes",
        ),
    };
    dead.signal(Signal::SIGKILL).unwrap();
    let last = fails(survivor, 20);
    drop(w);
    assert!(
        last.starts_with(why) && last.contains("1048576 bytes"),
        "{who}:\n{}",
        survivor.log()
    );
    if killed == Killed::Listener {
        assert_eq!(sha256(&chunk), sha256(&back));
    } else {
        // The forward stream was whole.
        t.identical();
    }
}

#[test]
fn mpcat_reverse_stream_cut_fails_the_connecting_side() {
    reverse_stream_cut("mpdup4", Killed::Listener);
}

#[test]
fn mpcat_reverse_stream_cut_fails_the_listener() {
    reverse_stream_cut("mpdup5", Killed::ConnectingSide);
}

/// The connecting side's stdout closed early (`| head -c 1000`) while the listener's 8 MiB
/// come back: it exits 1 naming the reverse stream and stdout, and tells the listener, which
/// exits 1 with the connecting side's reason rather than a bare closed connection.
#[test]
fn mpcat_reverse_stdout_closed_early_fails_both_sides() {
    let mut t = Transfer::with_input("mpdup6", 1, None, 64 << 10);
    let rev = t.dir().join("rev");
    random_file(&rev, 8 << 20);
    let rx = t.listen(&["-i", rev.to_str().unwrap()]);
    let script = format!(
        "{} mpcat -N -i {} {MULTIPATH_B4} {} | head -c 1000 > /dev/null; echo \"status ${{PIPESTATUS[0]}}\"",
        tcpkit(),
        t.input.display(),
        t.port
    );
    let tx =
        t.a.spawn(&mut t.lab, "tx", &["bash", "-c", &script])
            .unwrap_or_else(|e| panic!("{e}"));
    wait(&tx, 20);
    let log = tx.log();
    assert!(log.contains("status 1"), "{log}");
    assert!(
        log.contains(
            "tcpkit mpcat: the reverse stream (listener to here): write stdout: Broken pipe"
        ),
        "{log}"
    );
    let last = fails(&rx, 20);
    assert!(
        last.starts_with(
            "tcpkit mpcat: the reverse stream (here to the connecting side): cut after "
        ) && last.contains("sent a refusal: write stdout: Broken pipe"),
        "{}",
        rx.log()
    );
}

/// As with `nc` and a shell on the other side: a line written to the connecting side's
/// stdin (a pipe whose writer stays open) reaches the listener's output at once, not when a
/// whole chunk has been read or the input ends. The writer holds its end open until the line
/// has arrived, so a sender that waited for a full chunk or for EOF never delivers it.
#[test]
fn mpcat_a_line_typed_into_a_pipe_arrives_before_the_input_ends() {
    let mut t = Transfer::new("mpdupline", 2, None);
    let (out, done) = (t.output.clone(), t.dir().join("done"));
    let rx = t.listen(&[]);
    // The writer: one line, then its end of the pipe stays open until `done` exists.
    let script = format!(
        "(echo 'uname -a'; while [ ! -e {} ]; do sleep 0.05; done) | {} mpcat -n 2 {MULTIPATH_B4} {}",
        done.display(),
        tcpkit(),
        t.port
    );
    let tx =
        t.a.spawn(&mut t.lab, "tx", &["sh", "-c", &script])
            .unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = std::fs::read(&out).unwrap_or_default();
        if got == b"uname -a\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the line did not arrive while the input stayed open: {got:?}\n{}",
            tx.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&done, "").unwrap();
    succeeds(&tx, 20);
    succeeds(&rx, 10);
    assert_eq!(std::fs::read(&out).unwrap(), b"uname -a\n");
}
