//! Issue 10, replay's part of the run contract: a run that did not send what it was asked
//! fails and says why; tcpreplay's own words in the summary; -v, --listnics; --plot.

mod common;
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
