//! Issue 11: `tcpkit merge` reads report files anyone can write. Each hostile one gets one
//! line on stderr naming it and exit 2 (a file that cannot be used as given, issue 24 item 15),
//! in bounded time and memory (the process runs under a 512 MiB
//! address-space limit, so an allocation sized by the file instead of its bytes aborts it),
//! never a wrapped count, a hang or bytes sent to the terminal.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::tcpkit;
use tcpkit_load::report::{Histograms, LoadReport, QueryStats, LOAD_SCHEMA_VERSION};
use tcpkit_stats::Histogram;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn merge(files: &[&Path], json: bool) -> Run {
    let mut c = Command::new("prlimit");
    c.arg("--as=536870912")
        .arg(tcpkit())
        .arg("merge")
        .args(files);
    if json {
        c.arg("--json");
    }
    let t = Instant::now();
    let out = c.output().expect("run prlimit tcpkit merge");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: t.elapsed(),
    }
}

/// Exit 2 (the file cannot be used as given), one line starting `tcpkit merge: ` holding
/// every one of `says`, within 10 s, nothing on stdout.
fn assert_refused(r: &Run, says: &[&str]) {
    assert!(!r.stderr.contains("panicked"), "panic: {}", r.stderr);
    assert_eq!(r.code, Some(2), "exit status; stderr: {}", r.stderr);
    assert_eq!(r.stdout, "", "stdout");
    assert_eq!(r.stderr.lines().count(), 1, "one line:\n{}", r.stderr);
    assert!(r.stderr.starts_with("tcpkit merge: "), "{}", r.stderr);
    for s in says {
        assert!(r.stderr.contains(s), "does not say {s:?}: {}", r.stderr);
    }
    assert!(r.took < Duration::from_secs(10), "took {:?}", r.took);
}

fn report(id: &str) -> LoadReport {
    let mut h = Histogram::new();
    for v in [1_000, 2_000, 3_000] {
        h.record(v);
    }
    LoadReport {
        schema_version: LOAD_SCHEMA_VERSION,
        run_id: id.into(),
        target: "198.18.0.2:53".into(),
        payload: "dns A example.com".into(),
        runs: 1,
        processes: 1,
        threads: 1,
        start_unix_ns: 1_000_000_000,
        end_unix_ns: 2_000_000_000,
        seconds: 1.0,
        queries: QueryStats {
            sent: 3,
            answered: 3,
            ..Default::default()
        },
        codes: [("NOERROR".to_string(), 3)].into_iter().collect(),
        latency: h.percentiles(),
        latency_sent: h.percentiles(),
        histograms: Histograms {
            intended: h.to_base64(),
            sent: h.to_base64(),
        },
        ..Default::default()
    }
}

fn write(dir: &Path, name: &str, v: &serde_json::Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

fn value(r: &LoadReport) -> serde_json::Value {
    serde_json::to_value(r).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in bytes.chunks(3) {
        let n = u32::from(c[0]) << 16
            | u32::from(*c.get(1).unwrap_or(&0)) << 8
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[test]
fn good_reports_still_merge() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "a.json", &value(&report("aa")));
    let b = write(dir.path(), "b.json", &value(&report("bb")));
    let r = merge(&[&a, &b], true);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let m: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(m["queries"]["sent"], 6);
}

/// A V2 histogram whose header declares a 4 GiB payload: refused for that, not allocated.
#[test]
fn histogram_declaring_4_gib_is_refused_without_allocating_it() {
    let mut v2 = Vec::new();
    v2.extend_from_slice(&0x1c84_9313u32.to_be_bytes());
    v2.extend_from_slice(&u32::MAX.to_be_bytes());
    v2.extend_from_slice(&0u32.to_be_bytes());
    v2.extend_from_slice(&3u32.to_be_bytes());
    v2.extend_from_slice(&1u64.to_be_bytes());
    v2.extend_from_slice(&3_600_000_000_000u64.to_be_bytes());
    v2.extend_from_slice(&1.0f64.to_be_bytes());
    v2.extend_from_slice(&[2; 54]);
    assert_eq!(v2.len(), 94);
    let dir = tempfile::tempdir().unwrap();
    let mut v = value(&report("aa"));
    v["histograms"]["sent"] = b64(&v2).into();
    let a = write(dir.path(), "a.json", &v);
    let r = merge(&[&a], false);
    assert_refused(
        &r,
        &[
            "sent histogram",
            "4294967295-byte payload, 54 bytes are there",
        ],
    );
}

#[test]
fn a_sum_that_overflows_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = report("aa");
    a.queries.sent = u64::MAX - 1;
    let a = write(dir.path(), "a.json", &value(&a));
    let b = write(dir.path(), "b.json", &value(&report("bb")));
    let r = merge(&[&a, &b], false);
    assert_refused(
        &r,
        &["queries.sent: the sum overflows (18446744073709551614 + 3)"],
    );
    assert!(!r.stdout.contains("18446744073709551614"), "{}", r.stdout);
}

#[test]
fn reports_missing_summed_fields_are_refused_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    for field in ["per_query", "failure", "rates.asked_qps"] {
        let mut v = value(&report("aa"));
        match field.split_once('.') {
            Some((o, i)) => v[o].as_object_mut().unwrap().remove(i),
            None => v.as_object_mut().unwrap().remove(field),
        };
        let a = write(dir.path(), "r.json", &v);
        let r = merge(&[&a], false);
        assert_refused(&r, &["r.json: no `", field]);
    }
}

/// Escape sequences (a title change, clear screen), NUL and CR in a report's strings reach the
/// terminal written out, never as themselves.
#[test]
fn control_characters_are_escaped_before_printing() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = report("aa");
    a.target = "\u{1b}]0;pwned\u{7}\u{1b}[2J\0\r".into();
    a.hints = vec!["raise \u{1b}[31m ulimit".into()];
    a.failure = Some("\u{1b}[8mhidden".into());
    let a = write(dir.path(), "a.json", &value(&a));
    let r = merge(&[&a], false);
    assert_eq!(r.code, Some(1), "the failure is kept: {}", r.stderr);
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(!all.chars().any(|c| c.is_control() && c != '\n'), "{all:?}");
    assert!(r.stdout.contains("\\u{1b}]0;pwned\\u{7}"), "{}", r.stdout);
    assert!(all.contains("\\u{1b}[8mhidden"), "{all}");
}

/// 300,000 distinct hints took over 20 s to merge (quadratic); linear now.
#[test]
fn many_hints_merge_in_linear_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = report("aa");
    a.hints = (0..300_000).map(|i| format!("hint {i}")).collect();
    let mut b = a.clone();
    b.run_id = "bb".into();
    let a = write(dir.path(), "a.json", &value(&a));
    let b = write(dir.path(), "b.json", &value(&b));
    let r = merge(&[&a, &b], true);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    eprintln!("300,000 hints x 2 merged in {:?}", r.took);
    assert!(r.took < Duration::from_secs(5), "took {:?}", r.took);
    let m: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(m["hints"].as_array().unwrap().len(), 300_000);
}

/// Issue 24, item 18: a replay (or tune) report given to merge was refused for lacking
/// `per_query`; it is refused for what it is: the kind of report it got, and what merge takes.
#[test]
fn another_commands_report_is_named_for_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let replay = dir.path().join("replay.json");
    let out = Command::new(tcpkit())
        .args(["replay", "--json", "-w"])
        .arg(dir.path().join("out.pcap"))
        .arg(common::testdata("trex-http_get.pcap"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&replay, &out.stdout).unwrap();
    let tune = dir.path().join("tune.json");
    // tune only reads this host's settings; its verdict does not matter here.
    let out = Command::new(tcpkit())
        .args(["tune", "--role", "server", "--connections", "10", "--json"])
        .output()
        .unwrap();
    std::fs::write(&tune, &out.stdout).unwrap();
    for (file, kind) in [(&replay, "replay"), (&tune, "tune")] {
        let r = merge(&[file], false);
        assert_refused(
            &r,
            &[
                &format!(
                    "{}: a `tcpkit {kind} --json` report, not a load report",
                    file.display()
                ),
                "merge takes the reports of `tcpkit load --json`",
            ],
        );
        assert!(!r.stderr.contains("per_query"), "{}", r.stderr);
    }
}
