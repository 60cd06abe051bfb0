//! Every bad input gets one line on stderr and the right exit status, never a panic or a hang:
//! `tcpkit replay: <what>: <why>`, exit 2 for a usage error and 1 at run time (DESIGN.md). Each
//! run is killed after 20 s, which fails the test. Captures are built here, cut or corrupted
//! on purpose; cases that need a network run in a namespace lab.

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{read_frames, tcpkit, testdata, udp_frame, write_pcap, ReplayLab};

/// Longer than any case may take: the process is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// From start (or from `during` returning) to exit.
    took: Duration,
}

/// Kills the child if the test panics before it is reaped.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs `cmd`, calls `during(pid)` while it runs (to signal it, or pull a cable), and waits
/// for it to end; panics if it is still running `LIMIT` after start.
fn run_limited(mut cmd: Command, during: impl FnOnce(u32)) -> Run {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = Reap(cmd.spawn().expect("spawn tcpkit"));
    let mut out = child.0.stdout.take().unwrap();
    let mut err = child.0.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    during(child.0.id());
    let from = Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > LIMIT {
            let _ = child.0.kill();
            panic!("{cmd:?} still running after {LIMIT:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = from.elapsed();
    Run {
        code: status.code(),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
        took,
    }
}

fn replay_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(tcpkit());
    c.arg("replay").args(args);
    c
}

fn run(args: &[&str]) -> Run {
    run_limited(replay_cmd(args), |_| {})
}

/// The contract: exit `code`, exactly one line on stderr starting with `tcpkit replay: ` and
/// holding every one of `says`, no panic.
fn assert_error(r: &Run, code: i32, says: &[&str]) {
    assert!(!r.stderr.contains("panicked"), "panic: {}", r.stderr);
    assert_eq!(r.code, Some(code), "exit status; stderr: {}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "stderr must be one line:\n{}", r.stderr);
    assert!(
        r.stderr.ends_with('\n'),
        "stderr line not ended: {:?}",
        r.stderr
    );
    assert!(
        lines[0].starts_with("tcpkit replay: "),
        "stderr: {}",
        lines[0]
    );
    for s in says {
        assert!(
            lines[0].contains(s),
            "stderr does not say {s:?}: {}",
            lines[0]
        );
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tcpkit-bad-input-")
        .tempdir()
        .expect("tempdir")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `n` distinct UDP frames, 1 ms apart.
fn frames(n: u32) -> Vec<(u64, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let len = 60 + (i as usize * 37) % 400;
            (
                1_700_000_000_000_000_000 + u64::from(i) * 1_000_000,
                udp_frame(i, len, [198, 18, 0, 1], [198, 18, 0, 2]),
            )
        })
        .collect()
}

/// A good pcap of `n` frames; returns its bytes and the byte offset of every record.
fn good_pcap(path: &Path, n: u32) -> (Vec<u8>, Vec<usize>) {
    let f = frames(n);
    write_pcap(path, 1, &f);
    let bytes = std::fs::read(path).unwrap();
    let mut offs = Vec::new();
    let mut o = 24;
    for (_, d) in &f {
        offs.push(o);
        o += 16 + d.len();
    }
    assert_eq!(o, bytes.len());
    (bytes, offs)
}

fn write(path: &Path, bytes: &[u8]) -> PathBuf {
    std::fs::write(path, bytes).unwrap();
    path.to_path_buf()
}

/// `-w` into the temp dir, for cases that need no network.
fn dry(dir: &Path, input: &Path) -> Run {
    let out = dir.join("out.pcap");
    run(&["-t", "-w", s(&out), s(input)])
}

/// A 3-packet capture in `d` with the little-endian word at `at` (of the records' offsets)
/// set to `value`, written as `name` and given to [`dry`]: the run, the file, the offsets.
fn patched_dry_run(
    d: &tempfile::TempDir,
    name: &str,
    at: fn(&[usize]) -> usize,
    value: u32,
) -> (Run, PathBuf, Vec<usize>) {
    let (mut bytes, offs) = good_pcap(&d.path().join("good.pcap"), 3);
    let o = at(&offs);
    bytes[o..o + 4].copy_from_slice(&value.to_le_bytes());
    let p = write(&d.path().join(name), &bytes);
    (dry(d.path(), &p), p, offs)
}

// ---------------------------------------------------------------------------------------------
// Files that are not captures, or broken ones. A file that cannot be used as given (missing,
// not a capture, its file header bad) is a usage error, exit 2, nothing sent (issue 24 item
// 15); one found bad once packets flow (a record cut mid-file) stops a started run, exit 1.

#[test]
fn missing_file() {
    let d = tempdir();
    let p = d.path().join("nosuch.pcap");
    let r = dry(d.path(), &p);
    assert_error(&r, 2, &[s(&p), "No such file"]);
}

#[test]
fn empty_file() {
    let d = tempdir();
    let p = write(&d.path().join("empty.pcap"), b"");
    assert_error(&dry(d.path(), &p), 2, &[s(&p), "empty"]);
}

#[test]
fn html_page() {
    let d = tempdir();
    let p = write(
        &d.path().join("capture.pcap"),
        b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body>gone</body></html>\n",
    );
    assert_error(&dry(d.path(), &p), 2, &[s(&p), "not a pcap or pcapng file"]);
}

#[test]
fn cut_inside_the_file_header() {
    let d = tempdir();
    let (bytes, _) = good_pcap(&d.path().join("good.pcap"), 3);
    for cut in [4, 10, 23] {
        let p = write(&d.path().join(format!("cut{cut}.pcap")), &bytes[..cut]);
        assert_error(&dry(d.path(), &p), 2, &[s(&p), "file header", "truncated"]);
    }
}

#[test]
fn truncated_final_packet_dry_run() {
    let d = tempdir();
    let (bytes, offs) = good_pcap(&d.path().join("good.pcap"), 10);
    let last = offs[9];
    // Cut inside the last record's header, then inside its data.
    for cut in [last + 5, bytes.len() - 7] {
        let p = write(&d.path().join(format!("t{cut}.pcap")), &bytes[..cut]);
        let out = d.path().join("out.pcap");
        let r = run(&["-t", "-w", s(&out), s(&p)]);
        assert_error(
            &r,
            1,
            &[
                s(&p),
                "packet 10",
                &format!("byte offset {last}"),
                "truncated",
            ],
        );
        // What came before is written and counted; the summary is still printed.
        assert_eq!(read_frames(&out).len(), 9);
        assert!(
            r.stdout.contains("Actual: 9 packets"),
            "stdout: {}",
            r.stdout
        );
    }
}

#[test]
fn captured_length_above_snaplen() {
    let d = tempdir();
    // Snaplen 64 in the file header; packet 2 is 97 bytes.
    let (r, p, offs) = patched_dry_run(&d, "snap.pcap", |_| 16, 64);
    assert_error(
        &r,
        1,
        &[
            s(&p),
            "packet 2",
            &format!("byte offset {}", offs[1]),
            "snaplen 64",
        ],
    );
}

#[test]
fn absurd_captured_length() {
    let d = tempdir();
    // The third record's captured length.
    let (r, p, offs) = patched_dry_run(&d, "absurd.pcap", |offs| offs[2] + 8, 0x7fff_ffff);
    assert_error(
        &r,
        1,
        &[
            s(&p),
            "packet 3",
            &format!("byte offset {}", offs[2]),
            "2147483647",
        ],
    );
}

#[test]
fn unknown_link_type() {
    let d = tempdir();
    let p = d.path().join("dlt147.pcap");
    write_pcap(&p, 147, &frames(2));
    let r = dry(d.path(), &p);
    // In the pcap file header: found before anything is sent, a usage error.
    assert_error(&r, 2, &[s(&p), "147", "link type"]);
}

/// A packet whose link-layer bytes cannot be converted to Ethernet is a packet error like any
/// other: it names the packet and its byte offset.
#[test]
fn raw_ip_packet_of_unknown_ip_version() {
    let d = tempdir();
    let p = d.path().join("raw.pcap");
    let mut f: Vec<(u64, Vec<u8>)> = frames(3)
        .into_iter()
        .map(|(t, f)| (t, f[14..].to_vec()))
        .collect();
    f[1].1[0] = 0x75; // IP version 7
    write_pcap(&p, 101, &f);
    let off = 24 + 16 + f[0].1.len();
    let r = dry(d.path(), &p);
    assert_error(
        &r,
        1,
        &[s(&p), "packet 2", &format!("byte offset {off}"), "version"],
    );
}

#[test]
fn pcapng_packet_on_missing_interface() {
    let d = tempdir();
    let p = d.path().join("bad.pcapng");
    let f = frames(2);
    let mut w = tcpkit_pcap::PcapNgWriter::new(std::fs::File::create(&p).unwrap(), false).unwrap();
    w.add_interface(1, 65535, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    w.write_epb(0, f[0].0, &f[0].1, f[0].1.len() as u32)
        .unwrap();
    // An EPB naming interface 3 (the writer refuses it, so the block is written raw).
    let data = &f[1].1;
    let mut body = Vec::new();
    for v in [3u32, 0, 0, data.len() as u32, data.len() as u32] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    body.extend_from_slice(data);
    body.resize(body.len().next_multiple_of(4), 0);
    w.write_raw_block(6, &body).unwrap();
    w.finish().unwrap();
    let bytes = std::fs::read(&p).unwrap();
    // SHB 28 + IDB 32 (with if_tsresol) + first EPB.
    let first_epb = 28 + 32;
    let off = first_epb + 32 + f[0].1.len().next_multiple_of(4);
    assert_eq!(
        u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()),
        6,
        "EPB offset"
    );
    let r = dry(d.path(), &p);
    assert_error(
        &r,
        1,
        &[
            s(&p),
            "packet 2",
            &format!("byte offset {off}"),
            "interface 3",
        ],
    );
}

#[test]
fn write_into_missing_directory() {
    let d = tempdir();
    let (_, _) = good_pcap(&d.path().join("good.pcap"), 3);
    let out = d.path().join("no/such/dir/out.pcap");
    let r = run(&["-t", "-w", s(&out), s(&d.path().join("good.pcap"))]);
    assert_error(&r, 2, &["-w", s(&out), "No such file or directory"]);
}

// ---------------------------------------------------------------------------------------------
// Bad flag values: exit 2, the flag named, nothing written.

#[test]
fn bad_flag_values() {
    let d = tempdir();
    let input = d.path().join("good.pcap");
    good_pcap(&input, 3);
    let out = d.path().join("out.pcap");
    let cases: &[(&[&str], &[&str])] = &[
        (&["--pps", "0"], &["--pps", "0"]),
        (&["--mbps", "abc"], &["--mbps", "abc"]),
        (&["--srcipmap", "10.0.0.0/8"], &["--srcipmap", "10.0.0.0/8"]),
        (&["--src-mac", "zz"], &["--src-mac", "zz"]),
        (&["--ttl", "x"], &["--ttl", "x"]),
        (&["--threads", "2"], &["--threads", "--topspeed"]),
    ];
    let mut failures = Vec::new();
    for (flags, says) in cases {
        let mut args = vec!["-w", s(&out)];
        args.extend_from_slice(flags);
        args.push(s(&input));
        let r = run(&args);
        // Collect every case's failure, so one report shows them all.
        if let Err(e) = std::panic::catch_unwind(|| assert_error(&r, 2, says)) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "?".into());
            failures.push(format!("{flags:?}: {msg}"));
        }
        assert!(
            !out.exists(),
            "{flags:?}: a usage error must not create the output"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

// ---------------------------------------------------------------------------------------------
// Cases with a network: a lab of two namespaces.

/// The cut capture is sent up to the cut: the receiver sees exactly the packets before it,
/// the summary counts them, and the run fails with the error naming the packet.
#[test]
fn truncated_final_packet_sends_what_came_before() {
    let d = tempdir();
    let (bytes, offs) = good_pcap(&d.path().join("good.pcap"), 20);
    let p = write(&d.path().join("cut.pcap"), &bytes[..bytes.len() - 9]);
    let sent = frames(19);
    let mut lab = ReplayLab::new("badcut");
    let (r, got) = lab.capture(|l| {
        let c = l.tx.command(&[
            tcpkit(),
            "replay",
            "-i",
            &l.link.a.name,
            "--pps",
            "2000",
            s(&p),
        ]);
        run_limited(c, |_| {})
    });
    assert_error(
        &r,
        1,
        &[
            s(&p),
            "packet 20",
            &format!("byte offset {}", offs[19]),
            "truncated",
        ],
    );
    assert!(
        r.stdout.contains("Actual: 19 packets"),
        "stdout: {}",
        r.stdout
    );
    assert_eq!(got.len(), sent.len(), "frames at the receiver");
    for (n, (g, (_, want))) in got.iter().zip(&sent).enumerate() {
        assert_eq!(&g.data, want, "frame {}", n + 1);
    }
}

#[test]
fn interface_that_does_not_exist() {
    let lab = ReplayLab::new("badif");
    let c = lab.tx.command(&[
        tcpkit(),
        "replay",
        "-i",
        "tknosuch0",
        "-t",
        s(&testdata("tcpreplay-test.pcap")),
    ]);
    let r = run_limited(c, |_| {});
    assert_error(&r, 1, &["tknosuch0"]);
}

#[test]
fn not_root() {
    let lab = ReplayLab::new("badroot");
    // The capture must be readable by nobody: the shared test data is.
    let input = testdata("tcpreplay-test.pcap");
    let c = lab.tx.command(&[
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        tcpkit(),
        "replay",
        "-i",
        &lab.link.a.name,
        "-t",
        s(&input),
    ]);
    let r = run_limited(c, |_| {});
    assert_error(&r, 1, &[&lab.link.a.name, "needs root or CAP_NET_RAW"]);
}

fn kill(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// `tcpkit replay --pps PPS --loop LOOPS` of an `n`-packet capture, in a fresh lab (`tag`),
/// while `during` acts on the lab and the replay's pid; the run is printed under `what`.
fn paced_replay(
    tag: &str,
    n: u32,
    pps: &str,
    loops: &str,
    what: &str,
    during: impl FnOnce(&ReplayLab, u32),
) -> (Run, ReplayLab) {
    let d = tempdir();
    let input = d.path().join("good.pcap");
    good_pcap(&input, n);
    let lab = ReplayLab::new(tag);
    let c = lab.tx.command(&[
        tcpkit(),
        "replay",
        "-i",
        &lab.link.a.name,
        "--pps",
        pps,
        "--loop",
        loops,
        s(&input),
    ]);
    let r = run_limited(c, |pid| during(&lab, pid));
    eprintln!(
        "{what}: exit {:?} after {:?}\nstdout:\n{}\nstderr:\n{}",
        r.code, r.took, r.stdout, r.stderr
    );
    (r, lab)
}

/// SIGINT during a long paced replay: stops within a second, prints the summary, exit 1.
#[test]
fn interrupt_stops_within_a_second() {
    // 50 packets at 20 pps, forever: only the signal ends it.
    let (r, _lab) = paced_replay("badint", 50, "20", "0", "SIGINT", |_, pid| {
        std::thread::sleep(Duration::from_millis(1500));
        kill(pid, libc::SIGINT);
    });
    assert!(
        r.took < Duration::from_secs(1),
        "stopped {:?} after SIGINT",
        r.took
    );
    assert_error(&r, 1, &["interrupted"]);
    assert!(r.stdout.contains("Actual: "), "no summary: {}", r.stdout);
    // About 1.5 s at 20 pps.
    let sent: u64 = r
        .stdout
        .split("Actual: ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (20..=40).contains(&sent),
        "sent {sent} packets in 1.5 s at 20 pps: {}",
        r.stdout
    );
}

/// The receiving end of the veth is deleted while a paced replay runs (which takes the
/// sending end with it). tcpkit must neither hang nor panic: it either finishes, counting
/// the failed sends, or stops with exit 1 and one line.
#[test]
fn peer_disappears_mid_run() {
    // 300 packets at 100 pps: 3 s; the link goes after 1 s.
    let (r, lab) = paced_replay("badpeer", 100, "100", "3", "peer gone", |lab, _| {
        std::thread::sleep(Duration::from_secs(1));
        lab.rx
            .run(&["ip", "link", "del", &lab.link.b.name])
            .expect("delete the receiving end");
    });
    // The first send after the device went away fails (ENXIO once it is gone, ENETDOWN while
    // it is going down); replay stops, prints the summary with that failure counted, and
    // exits 1 with one line naming the interface and why.
    assert_error(&r, 1, &[&lab.link.a.name, "send("]);
    assert!(
        r.stderr.contains("No such device") || r.stderr.contains("Network is down"),
        "stderr does not say the device went away: {}",
        r.stderr
    );
    assert!(
        r.stdout.contains("Failed packets:"),
        "no summary: {}",
        r.stdout
    );
    assert!(
        r.took < Duration::from_secs(3),
        "ran {:?} after the link went",
        r.took
    );
}

/// SIGINT inside a long gap of the capture's own timing (60 s between two packets): the wait
/// is cut short, the summary counts the one packet sent, exit 1.
#[test]
fn interrupt_inside_a_long_capture_gap() {
    let d = tempdir();
    let input = d.path().join("gap.pcap");
    let mut f = frames(2);
    f[1].0 = f[0].0 + 60_000_000_000;
    write_pcap(&input, 1, &f);
    let lab = ReplayLab::new("badgap");
    let c = lab
        .tx
        .command(&[tcpkit(), "replay", "-i", &lab.link.a.name, s(&input)]);
    let r = run_limited(c, |pid| {
        std::thread::sleep(Duration::from_millis(1000));
        kill(pid, libc::SIGINT);
    });
    assert!(
        r.took < Duration::from_secs(1),
        "stopped {:?} after SIGINT",
        r.took
    );
    assert_error(&r, 1, &["interrupted"]);
    assert!(
        r.stdout.contains("Actual: 1 packets"),
        "summary: {}",
        r.stdout
    );
}
