//! `tcpkit load` command lines refused before anything runs (issue 24): exit 2 and one line
//! on stderr naming the flag or file and what to write instead. No lab: nothing is sent.

use crate::common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{stderr, tcpkit};

/// `tcpkit load ARGS`, which must be refused at once: exit 2, one line on stderr, nothing on
/// stdout. The line.
fn refused(args: &[&str]) -> String {
    let t0 = Instant::now();
    let mut child = Command::new(tcpkit())
        .arg("load")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A line that is not refused runs (toward 127.0.0.1:9, nothing): stopped, and the test
    // fails below, instead of waiting on a run with no end.
    while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let o: Output = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    assert!(o.stdout.is_empty(), "{args:?}: {}", common::stdout(&o));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{args:?}: not one line: {e}");
    // Refused before anything ran (no connection: 127.0.0.1:9 listens for nothing).
    assert!(t0.elapsed() < Duration::from_secs(2), "{args:?}");
    e.trim_end().to_string()
}

/// Issue 24, item 15: a file load reads or writes that cannot be used is a usage error naming
/// the flag and the file, not exit 1 after the start.
#[test]
fn missing_or_unwritable_files_exit_2_naming_flag_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("names.txt");
    let missing = missing.to_str().unwrap();
    assert_eq!(
        refused(&["127.0.0.1:9", "-r", "10", "--qname-file", missing]),
        format!("tcpkit load: --qname-file {missing}: no such file")
    );
    assert_eq!(
        refused(&[
            "127.0.0.1:9",
            "-r",
            "10",
            "--payload-file",
            missing,
            "--response-len",
            "4"
        ]),
        format!("tcpkit load: --payload-file {missing}: no such file")
    );
    // A directory is not a query file.
    let d = dir.path().to_str().unwrap();
    assert_eq!(
        refused(&["127.0.0.1:9", "-r", "10", "--qname-file", d]),
        format!("tcpkit load: --qname-file {d}: a directory, not a file")
    );
    // Output files in a folder that does not exist.
    let nowhere = dir.path().join("no/such/dir/out");
    let nowhere = nowhere.to_str().unwrap();
    for (flag, named) in [("-R", "-R/--per-query"), ("--hdr-log", "--hdr-log")] {
        let e = refused(&["127.0.0.1:9", "-r", "10", "-t", "1", flag, nowhere]);
        assert!(
            e.starts_with(&format!("tcpkit load: {named} {nowhere}: cannot create: ")),
            "{e}"
        );
    }
    let svg = format!("{nowhere}.svg");
    let e = refused(&["127.0.0.1:9", "-r", "10", "--plot", &svg]);
    assert!(
        e.starts_with(&format!("tcpkit load: --plot {svg}: cannot create: ")),
        "{e}"
    );
}

/// Issue 24, item 18: the picture is SVG; a name that says otherwise is refused with the
/// name to give instead (before, x.png was written with SVG in it).
#[test]
fn plot_to_a_file_not_named_svg_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.png");
    let e = refused(&["127.0.0.1:9", "-r", "10", "--plot", png.to_str().unwrap()]);
    let svg = dir.path().join("x.svg");
    assert!(
        e.starts_with(&format!(
            "tcpkit load: --plot {}: the picture is SVG, so the file is named .svg: --plot {}",
            png.display(),
            svg.display()
        )),
        "{e}"
    );
    assert!(!png.exists());
}

/// Issue 24, item 7: a wrk2 command line (its -d, -R as the rate, --latency, -U, -s) is
/// answered with the line to write here, in one line, exit 2; tcpclient's meanings of -t
/// (the duration) and -R (a per-query file) stay for everyone else.
#[test]
fn wrk2_command_lines_get_the_line_to_write_instead() {
    let url = "http://127.0.0.1:9/index.html";
    assert_eq!(
        refused(&["-t2", "-c100", "-d30s", "-R2000", "--latency", url]),
        format!(
            "tcpkit load: -d 30s -R 2000 --latency is wrk2's command line, whose flags mean other things here (-t is the duration, -R a per-query CSV file, both latency tables are always printed): write `tcpkit load {url} -c 100 --threads 2 -t 30s -r 2000`"
        )
    );
    // Each wrk2 flag on its own.
    for (args, seen, write) in [
        (&["-R", "500", "-c", "4"][..], "-R 500", "-c 4 -r 500"),
        (&["-d", "5s", "-r", "10"], "-d 5s", "-c 1 -t 5s -r 10"),
        (&["--latency", "-r", "10"], "--latency", "-c 1 -r 10"),
        (&["-U", "-r", "10"], "-U", "-c 1 -r 10"),
        (
            &["-s", "x.lua", "-r", "10", "-H", "X-A: b"],
            "-s",
            "-c 1 -r 10 -H 'X-A: b'",
        ),
    ] {
        let e = refused(&[&[url][..], args].concat());
        assert!(
            e.starts_with(&format!("tcpkit load: {seen} is wrk2's command line")),
            "{args:?}: {e}"
        );
        assert!(
            e.ends_with(&format!("write `tcpkit load {url} {write}`")),
            "{args:?}: {e}"
        );
    }
    // A URL is a target; http and https are spoken, other schemes not; -H needs HTTP.
    let e = refused(&["ftp://127.0.0.1:9/", "-r", "10"]);
    assert!(e.contains("load speaks http:// and https://"), "{e}");
    let e = refused(&["127.0.0.1:9", "-r", "10", "-H", "X-A: b"]);
    assert!(
        e.starts_with("tcpkit load: -H/--header: only with HTTP"),
        "{e}"
    );
    let e = refused(&[url, "-r", "10", "-H", "no colon"]);
    assert!(
        e.starts_with("tcpkit load: -H \"no colon\": expected 'Name: value'"),
        "{e}"
    );
    let e = refused(&[url, "-r", "10", "--echo-bytes", "8"]);
    assert!(
        e.starts_with("tcpkit load: --echo-bytes: the target"),
        "{e}"
    );
}
