//! Issue 10, replay's part of the run contract: a run that did not send what it was asked
//! fails and says why; tcpreplay's own words in the summary; -v, --listnics; --plot.

use crate::common;
use common::schema;

use common::{stderr, stdout, udp_frame, write_pcap, ReplayLab};
use serde_json::Value;
use tcpkit_lab::LinkOpts;

/// `small` frames of 100 bytes with `big` frames of 2000 bytes spread among them, 1 ms apart.
fn mixed(small: u32, big: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mixed.pcap");
    let frames: Vec<(u64, Vec<u8>)> = (0..small + big)
        .map(|n| {
            let len = if n % 3 == 1 && n / 3 < big { 2000 } else { 100 };
            (
                u64::from(n) * 1_000_000,
                udp_frame(n, len, [198, 18, 1, 1], [198, 18, 2, 1]),
            )
        })
        .collect();
    assert_eq!(
        frames.iter().filter(|f| f.1.len() == 2000).count(),
        big as usize
    );
    write_pcap(&p, 1, &frames);
    (dir, p)
}

fn mtu_1500_lab(tag: &str) -> ReplayLab {
    ReplayLab::with_opts(
        tag,
        LinkOpts {
            mtu: Some(1500),
            ..LinkOpts::default()
        },
    )
}

fn last_line(s: &str) -> &str {
    s.lines().last().unwrap_or("")
}

/// Issue 10 case 2: frames over the interface's MTU were counted as failed and the run exited 0.
#[test]
fn issue10_frames_over_the_mtu_fail_the_run_and_say_why() {
    let (_d, p) = mixed(10, 5);
    let lab = mtu_1500_lab("mtu");
    let p = p.to_str().unwrap();
    for rate in [&["-t"][..], &["--pps", "2000"][..]] {
        let mut args = rate.to_vec();
        args.push(p);
        let out = lab.replay(&args);
        let (so, se) = (stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(1), "{rate:?}\n{so}\n{se}");
        // The report still says what happened.
        assert!(so.contains("\tSuccessful packets:        10\n"), "{so}");
        assert!(so.contains("\tFailed packets:            5\n"), "{so}");
        // The last line says why (the errno, how many) and what to do.
        let why = last_line(&se);
        for part in [
            "5 of 15 packets",
            "Message too long (EMSGSIZE)",
            &format!("MTU of {} is 1500", lab.link.a.name),
            "--mtu-trunc",
            "ip link set",
        ] {
            assert!(why.contains(part), "{part:?} not in the last line: {why}");
        }
    }
    // --json: the document holds the count and the reason, and the exit status is the same.
    let out = lab.replay(&["-t", "--json", p]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let j: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    schema::check(&schema::load("replay"), &j, "report");
    assert_eq!(j["device"]["failed"], 5);
    assert_eq!(j["device"]["failed_too_big"], 5);
    let why = j["failure"].as_str().expect("failure is a string");
    assert!(why.contains("EMSGSIZE"), "{why}");
    assert!(last_line(&stderr(&out)).contains("EMSGSIZE"));
    // Doing what the line says makes the run whole.
    let out = lab.replay(&["-t", "--mtu-trunc", "--mtu", "1500", p]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("\tFailed packets:            0\n"));
}

/// Issue 24: after `--mtu-trunc` cut frames the summary said "Truncated packets: 0" (as
/// tcpreplay-edit does) and nothing else; a frame it could not cut (not IP) was refused by the
/// kernel and the last line still advised `--mtu-trunc`. Now: a line and `--json` say how many
/// were cut, and the failure line says why the rest could not be (beside tcpreplay-edit, which
/// sends the same frames on the same link, to show the frames and the counts are the same).
#[test]
fn mtu_trunc_counts_what_it_cut_and_says_why_it_could_not() {
    let (d, p) = mixed(10, 4);
    // Two ARP frames of 2000 bytes: no datagram length to cut.
    let mut frames: Vec<(u64, Vec<u8>)> = common::read_frames(&p)
        .into_iter()
        .map(|f| (f.ts_ns, f.data))
        .collect();
    for n in 0..2u64 {
        let mut arp = vec![0xff; 2000];
        arp[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        frames.push((20_000_000 + n, arp));
    }
    let with_arp = d.path().join("with-arp.pcap");
    write_pcap(&with_arp, 1, &frames);
    let lab = mtu_1500_lab("mtutrunc");
    let (p, with_arp) = (p.to_str().unwrap(), with_arp.to_str().unwrap());
    // All IP: the 4 big frames are cut, and the report says so.
    let out = lab.replay(&["-t", "--mtu-trunc", "--mtu", "1500", "--json", p]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    schema::check(&schema::load("replay"), &j, "report");
    assert_eq!(j["mtu_trunc"]["truncated"], 4, "{j}");
    assert_eq!(j["mtu_trunc"]["too_long_not_ip"], 0, "{j}");
    let out = lab.replay(&["-t", "--mtu-trunc", "--mtu", "1500", p]);
    let so = stdout(&out);
    assert!(
        so.contains("\nTruncated by --mtu-trunc: 4 packets to --mtu 1500\n"),
        "{so}"
    );
    let theirs = lab
        .tx
        .command(&[
            "tcpreplay-edit",
            "-i",
            &lab.link.a.name,
            "-t",
            "--mtu-trunc",
            "--mtu=1500",
            p,
        ])
        .output()
        .expect("tcpreplay-edit");
    assert!(
        stdout(&theirs).contains("Actual: 14 packets"),
        "tcpreplay-edit sends the same 14 frames: {}",
        stdout(&theirs)
    );
    // Two ARP frames too long: refused, and the last line says why --mtu-trunc did not help.
    let out = lab.replay(&["-t", "--mtu-trunc", "--mtu", "1500", with_arp]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let why = last_line(&stderr(&out)).to_string();
    assert!(!why.contains("truncate them with --mtu-trunc"), "{why}");
    assert!(
        why.contains("2 frames longer than --mtu are not IPv4/IPv6"),
        "{why}"
    );
    assert!(why.contains("ip link set"), "{why}");
    assert!(
        stdout(&out).contains("; 2 longer ones not IP, left whole\n"),
        "{}",
        stdout(&out)
    );
}

/// The snap length in a pcap file's header, and tcpdump's reading of it.
fn snaplen_of(p: &std::path::Path) -> (u32, String) {
    let b = std::fs::read(p).expect("read -w output");
    let t = std::process::Command::new("tcpdump")
        .args(["-r"])
        .arg(p)
        .args(["-c", "1", "-n"])
        .output()
        .expect("tcpdump");
    (
        u32::from_le_bytes(b[16..20].try_into().unwrap()),
        stderr(&t),
    )
}

/// Issue 24 item 18: `-w` wrote snap length 0 in its file header (tcpdump prints "snapshot
/// length 0"; some readers refuse it). It writes the input's, at least 65535 (tcprewrite's).
#[test]
fn dry_run_writes_the_inputs_snaplen() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out.pcap");
    for (name, want) in [
        ("tcpreplay-test.pcap", 262_144),
        ("zeek-redis-django-cloud.pcapng", 65_535),
    ] {
        let input = common::testdata(name);
        let o = std::process::Command::new(common::tcpkit())
            .args(["replay", "-t", "-w"])
            .arg(&out)
            .arg(&input)
            .output()
            .expect("tcpkit");
        assert!(o.status.success(), "{}", stderr(&o));
        let (snaplen, said) = snaplen_of(&out);
        assert_eq!(snaplen, want, "{name}");
        assert!(
            said.contains(&format!("snapshot length {want}")),
            "{name}: {said}"
        );
    }
}

/// Issue 24 item 18: on an interface that is down the run ended on "Network is down" with no
/// word on what to do; the last line now says `ip link set DEV up`.
#[test]
fn interface_down_says_how_to_bring_it_up() {
    let (_d, p) = mixed(3, 0);
    let lab = ReplayLab::new("down");
    let dev = lab.link.a.name.clone();
    let down = lab
        .tx
        .command(&["ip", "link", "set", &dev, "down"])
        .output()
        .expect("ip link set down");
    assert!(down.status.success(), "{}", stderr(&down));
    let out = lab.replay(&["-t", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let why = last_line(&stderr(&out)).to_string();
    assert!(why.contains("Network is down"), "{why}");
    assert!(
        why.contains(&format!("`ip link set {dev} up`")),
        "no way out in: {why}"
    );
}

/// A summary line with its numbers masked: integer parts become `N`, each decimal `9`, so two
/// runs compare on wording and on the number of decimals, not on timings.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut prev = ' ';
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let after_dot = prev == '.';
            out.push(if after_dot { '9' } else { 'N' });
            while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                chars.next();
                if after_dot {
                    out.push('9');
                }
                prev = d;
            }
        } else {
            out.push(c);
            prev = c;
        }
    }
    out
}

/// tcpreplay 4.4.3, run in the same lab on the same capture, is the reference for the words
/// and the decimals of every summary line it prints (seconds: 6 decimals under a second, 2
/// above; Mbps: 3 decimals under 1 Mbps, 2 above; `unique flow packets`).
#[test]
fn issue10_summary_reads_as_tcpreplays() {
    let f = common::testdata("tcpreplay-test.pcap");
    let f = f.to_str().unwrap();
    let lab = ReplayLab::new("words");
    // Top speed: well under a second and above 1 Mbps; -x 3: over a second, under 1 Mbps.
    for rate in [&["-t"][..], &["-x", "3"][..]] {
        let mut argv = vec!["tcpreplay", "-i", &lab.link.a.name];
        argv.extend_from_slice(rate);
        argv.push(f);
        let theirs = lab.tx.run(&argv).expect("run tcpreplay");
        assert!(theirs.status.success(), "{}", stderr(&theirs));
        let mut args = rate.to_vec();
        args.push(f);
        let ours = lab.replay(&args);
        assert!(ours.status.success(), "{}", stderr(&ours));
        let ours: Vec<String> = stdout(&ours).lines().map(shape).collect();
        let theirs = stdout(&theirs);
        assert!(theirs.lines().count() >= 8, "{theirs}");
        for line in theirs.lines() {
            assert!(
                ours.contains(&shape(line)),
                "{rate:?}: tcpreplay's {line:?} ({:?}) is not among ours:\n{}",
                shape(line),
                ours.join("\n")
            );
        }
    }
}

#[test]
fn shape_masks_numbers_but_keeps_decimals() {
    assert_eq!(
        shape("Rated: 16602.8 Bps, 0.132 Mbps, 43.07 pps"),
        "Rated: N.9 Bps, N.999 Mbps, N.99 pps"
    );
    assert_ne!(shape("0.13 Mbps"), shape("0.132 Mbps"));
}

/// With --stats, tcpreplay brackets the run with `Test start:` and `Test complete:` (local
/// time, microseconds); ours go with the other live lines, to stderr.
#[test]
fn issue10_stats_brackets_the_run_with_test_start_and_complete() {
    let f = common::testdata("zeek-dns-tcp-keepalive.pcap");
    let lab = ReplayLab::new("teststart");
    let out = lab.replay(&["-t", "--stats", "1", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let se = stderr(&out);
    let start = se
        .lines()
        .position(|l| shape(l) == "Test start: N-N-N N:N:N.999999 ...");
    let done = se
        .lines()
        .position(|l| shape(l) == "Test complete: N-N-N N:N:N.999999");
    assert!(matches!((start, done), (Some(a), Some(b)) if a < b), "{se}");
    assert!(!stdout(&out).contains("Test "), "{}", stdout(&out));
    // Without --stats, neither line.
    let out = lab.replay(&["-t", f.to_str().unwrap()]);
    assert!(!stderr(&out).contains("Test start"));
}

/// Five small UDP frames, 1 ms apart.
fn five_udp() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("five.pcap");
    let frames: Vec<(u64, Vec<u8>)> = (0..5)
        .map(|n| {
            (
                u64::from(n) * 1_000_000,
                udp_frame(n, 100, [198, 18, 1, 1], [198, 18, 2, 1]),
            )
        })
        .collect();
    write_pcap(&p, 1, &frames);
    (dir, p)
}

/// What tcpdump -n says of frame `n` of [`five_udp`].
fn decoded(n: u16) -> String {
    format!("IP 198.18.1.1.{} > 198.18.2.1.9: UDP, length 58", 1024 + n)
}

/// `-v`, as tcpreplay -v: every packet sent, decoded by tcpdump, one line each, before the
/// summary; with --json the lines go to stderr so stdout stays one JSON document.
#[test]
fn issue10_verbose_decodes_every_sent_packet() {
    let (_d, p) = five_udp();
    let p = p.to_str().unwrap();
    let lab = ReplayLab::new("verbose");
    let out = lab.replay(&["-v", "-t", p]);
    assert!(out.status.success(), "{}", stderr(&out));
    let so = stdout(&out);
    let lines: Vec<&str> = so.lines().collect();
    for n in 0..5u16 {
        assert!(
            lines[usize::from(n)].ends_with(&decoded(n)),
            "line {n}: {:?}\n{so}",
            lines[usize::from(n)]
        );
    }
    assert!(lines[5].starts_with("Actual: 5 packets"), "{so}");
    // What was sent after rewriting is what is decoded.
    let out = lab.replay(&["--verbose", "-t", "--portmap", "9:53", p]);
    assert!(stdout(&out).contains("198.18.2.1.53: "), "{}", stdout(&out));
    // --json: stdout is the document alone; the decoded lines are on stderr.
    let out = lab.replay(&["-v", "-t", "--json", p]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON alone");
    assert_eq!(j["packets"], 5);
    assert_eq!(
        stderr(&out)
            .lines()
            .filter(|l| l.contains(": UDP, length 58"))
            .count(),
        5,
        "{}",
        stderr(&out)
    );
}

/// -v needs tcpdump; without it the run does not start and says so in one line.
#[test]
fn issue10_verbose_without_tcpdump_says_so() {
    let (d, p) = five_udp();
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::tcpkit())
        .args(["replay", "-v", "-w"])
        .arg(d.path().join("o.pcap"))
        .arg(&p)
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let se = stderr(&out);
    assert_eq!(se.lines().count(), 1, "{se}");
    assert!(
        se.starts_with("tcpkit replay: -v: cannot run tcpdump"),
        "{se}"
    );
    assert!(se.contains("No such file or directory"), "{se}");
    assert!(!d.path().join("o.pcap").exists(), "nothing was sent");
}

/// `--listnics`, as tcpreplay's: the interfaces replay can send on (Ethernet), exit 0.
#[test]
fn issue10_listnics_lists_the_interfaces_replay_can_send_on() {
    let lab = ReplayLab::new("nics");
    let out = lab
        .tx
        .command(&[common::tcpkit(), "replay", "--listnics"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let so = stdout(&out);
    let lines: Vec<&str> = so.lines().collect();
    assert_eq!(lines[0], "Available network interfaces:", "{so}");
    let names: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    // The namespace holds lo and the link's end; lo carries no Ethernet frames.
    assert_eq!(names, [lab.link.a.name.as_str()], "{so}");
    assert!(lines[1].contains("mtu 9000"), "{so}");
    // It stands alone.
    let out = common::run(&["replay", "--listnics", "-i", "x", "f.pcap"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Whether `text` is well-formed XML (every tag closed in order), and the names of its elements.
fn xml_elements(text: &str) -> Result<Vec<String>, String> {
    let doc = roxmltree::Document::parse(text).map_err(|e| e.to_string())?;
    Ok(doc
        .descendants()
        .filter(|n| n.is_element())
        .map(|n| n.tag_name().name().to_string())
        .collect())
}

/// `replay --plot`: the timing error as a spectrum and over time, in an SVG that parses, with
/// its series and axes named; a path that cannot be written is one line before anything is
/// sent.
#[test]
fn issue10_plot_draws_the_timing_error() {
    let (_d, p) = mixed(300, 0);
    let lab = ReplayLab::new("plot");
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("timing.svg");
    // 300 packets 1 ms apart at twice the speed: 0.15 s.
    let out = lab.replay(&[
        "-x",
        "2",
        "--plot",
        svg.to_str().unwrap(),
        p.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).expect("the SVG was written");
    let elements = xml_elements(&text).expect("well-formed XML");
    assert_eq!(elements[0], "svg");
    assert!(
        elements
            .iter()
            .filter(|e| *e == "polyline" || *e == "path")
            .count()
            >= 4
    );
    for s in [
        "Timing error by percentile",
        "timing error",
        "Timing error over time",
        "p50",
        "p99",
        "max",
        // The unit follows the largest delay: us on a quiet machine, ms on a loaded one.
        "late by (",
        "99%",
        "time since start (s)",
    ] {
        assert!(text.contains(s), "{s:?} not in the SVG");
    }
    if let Some(keep) = std::env::var_os("TCPKIT_PLOT_KEEP") {
        std::fs::copy(&svg, keep).unwrap();
    }
    let out = lab.replay(&[
        "-x",
        "2",
        "--plot",
        "/nonexistent/dir/t.svg",
        p.to_str().unwrap(),
    ]);
    // A file the command line names that cannot be created: a usage error, as -w's.
    assert_eq!(out.status.code(), Some(2));
    let se = stderr(&out);
    assert_eq!(se.lines().count(), 1, "{se}");
    assert!(
        se.starts_with("tcpkit replay: --plot /nonexistent/dir/t.svg: cannot create: No such file or directory"),
        "{se}"
    );
    assert!(stdout(&out).is_empty(), "nothing was sent");
    // A .png name would hold SVG: refused, with the name to give instead.
    let png = dir.path().join("t.png");
    let out = lab.replay(&[
        "-x",
        "2",
        "--plot",
        png.to_str().unwrap(),
        p.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let se = stderr(&out);
    assert_eq!(se.lines().count(), 1, "{se}");
    assert!(
        se.contains("the picture is SVG, so the file is named .svg"),
        "{se}"
    );
    assert!(!png.exists(), "a .png holding SVG was written");
    // A run that cannot start leaves no empty picture behind.
    let gone = dir.path().join("gone.svg");
    let out = common::run(&[
        "replay",
        "-i",
        "no-such-if0",
        "-x",
        "2",
        "--plot",
        gone.to_str().unwrap(),
        p.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!gone.exists());
}
