//! Issue 24 item 14: a side that fails mid-session says why to its peer at once (an abort
//! frame on every connection), so the peer fails with that reason within a second instead of
//! finding closed connections and waiting out --path-timeout (5 s) as "no path left"; and the
//! failures a sender meets before or beside a session are named as what they are: a busy
//! receiver, an input of another length than --size (both lengths).

use crate::common;
use common::mpcat::{fails, shaped, wait_arrived, Transfer};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tcpkit_lab::{Proc, Signal};

/// How soon the peer of a side that failed must fail too: the abort travels at once, and the
/// side that failed lingers at most [`ABORT_GRACE`](tcpkit_mpcat) (1 s) for the peer to close.
const AT_ONCE: Duration = Duration::from_millis(1500);

/// Waits for `first` to fail, then for `second`, and returns both last lines and how long
/// after `t0` both had ended.
fn both_fail(first: &Proc, second: &Proc, t0: Instant) -> (String, String, Duration) {
    let a = fails(first, 10);
    let b = fails(second, 10);
    (a, b, t0.elapsed())
}

/// Ctrl-C on the receiver mid-transfer: the sender fails within a second, naming the
/// receiver's reason (before: 5 s later, "no path left").
#[test]
fn mpcat_receiver_interrupted_reaches_the_sender_at_once() {
    interrupted_mid_transfer("mpcabrx", true);
}

/// Ctrl-C on the sender mid-transfer: the receiver fails within a second saying the sender
/// aborted and why (before: it blamed its connections, 5 s later).
#[test]
fn mpcat_sender_interrupted_is_named_by_the_receiver() {
    interrupted_mid_transfer("mpcabtx", false);
}

/// 16 MiB over 2 links of 20 Mbit/s; once 1 MiB has arrived, SIGINT to the receiver (or the
/// sender): it fails "interrupted", and its peer "the receiver (sender) aborted the session:
/// interrupted", both within [`AT_ONCE`] of the signal.
fn interrupted_mid_transfer(tag: &str, receiver: bool) {
    let _turn = common::timing_turn();
    let mut t = Transfer::with_input(tag, 2, Some(shaped(20)), 16 << 20);
    let rx = t.listen(&[]);
    let tx = t.send(&[]);
    wait_arrived(&t.output, 1 << 20, &tx, &rx);
    let (stopped, peer, who) = if receiver {
        (&rx, &tx, "receiver")
    } else {
        (&tx, &rx, "sender")
    };
    let t0 = Instant::now();
    stopped.signal(Signal::SIGINT).unwrap();
    let (own, told, after) = both_fail(stopped, peer, t0);
    let logs = format!("{}\n{}", stopped.log(), peer.log());
    assert!(own.starts_with("tcpkit mpcat: interrupted: "), "{logs}");
    assert!(
        told.starts_with(&format!(
            "tcpkit mpcat: the {who} aborted the session: interrupted: "
        )),
        "{logs}"
    );
    eprintln!("both sides ended {after:?} after the {who}'s Ctrl-C");
    assert!(after < AT_ONCE, "{after:?}\n{logs}");
}

/// A tmpfs of `size` mounted on `dir` for the test's life (unmounted when dropped, before
/// the lab removes its folder).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A full disk on the receiver (-o on a 1 MiB tmpfs) fails the sender within a second with
/// the receiver's own reason; the receiver's summary does not call the reverse stream (its
/// -i answer, delivered before the disk filled) verified, since the session failed.
#[test]
fn mpcat_full_disk_on_the_receiver_reaches_the_sender_at_once() {
    let _turn = common::timing_turn();
    let mut t = Transfer::with_input("mpcfull", 1, None, 8 << 20);
    let full = Tmpfs::mount(&t.dir().join("full"), "1m");
    t.output = full.0.join("out.bin");
    let answer = t.dir().join("answer");
    std::fs::write(&answer, "the answer\n").unwrap();
    let back = t.dir().join("back");
    let rx = t.listen(&["-i", answer.to_str().unwrap()]);
    // Slow enough that the answer is back before the disk is full.
    let tx = t.send(&["--rate-limit", "4M", "-o", back.to_str().unwrap()]);
    // The disk is full after 1 MiB: about 0.25 s in.
    wait_arrived(&t.output, 512 << 10, &tx, &rx);
    let t0 = Instant::now();
    let (rs, ts, after) = both_fail(&rx, &tx, t0);
    assert!(rs.contains("No space left on device"), "{}", rx.log());
    assert!(
        ts.starts_with("tcpkit mpcat: the receiver aborted the session: ")
            && ts.contains("No space left on device"),
        "{}",
        tx.log()
    );
    eprintln!("both sides ended {after:?} after half the disk was written");
    assert!(after < AT_ONCE, "{after:?}\n{}", tx.log());
    let log = rx.log();
    let reverse = log
        .lines()
        .find(|l| l.starts_with("  reverse: "))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(!reverse.contains("verified"), "{log}");
    drop(full);
}

/// A receiver serving another session is said to be busy, not "not this session's token".
#[test]
fn mpcat_busy_receiver_is_said_to_be_busy() {
    let mut t = Transfer::with_input("mpcbusy", 2, Some(shaped(20)), 8 << 20);
    let rx = t.listen(&[]);
    let tx = t.send(&[]);
    wait_arrived(&t.output, 1, &tx, &rx);
    let other = t.send_as("tx-other", &[]);
    let why = fails(&other, 10);
    assert!(
        why.contains("the receiver is busy with another session"),
        "{}",
        other.log()
    );
    t.arrives(&tx, 15, &rx, 5);
}

/// A file longer than --size: both sides name both lengths, the file's whole length (not
/// what was read so far) and --size's.
#[test]
fn mpcat_size_mismatch_names_both_lengths() {
    const LEN: u64 = 3 << 20;
    let mut t = Transfer::with_input("mpcsz", 1, None, LEN);
    let rx = t.listen(&[]);
    let tx = t.send(&["--size", "1M"]);
    let (ts, rs) = (fails(&tx, 10), fails(&rx, 10));
    let says = format!("the input is {LEN} bytes long, --size says {}", 1 << 20);
    assert_eq!(ts, format!("tcpkit mpcat: {says}"), "{}", tx.log());
    assert_eq!(
        rs,
        format!("tcpkit mpcat: the sender aborted the session: {says}"),
        "{}",
        rx.log()
    );
}
