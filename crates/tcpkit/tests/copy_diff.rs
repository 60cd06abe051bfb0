//! `tcpkit copy --diff` in the copy lab: the target's nginx serves one file with a different
//! body (found, exactly those requests), and answers whose Date differs from the capture's
//! (ignored only when asked, in each mode); --diff-out / --diff-max; the report's schema.

mod copy_common;

use std::path::Path;
use std::time::Duration;

use copy_common::*;
use serde_json::Value;

fn run(l: &CopyLab, args: &[&str]) -> std::process::Output {
    let mut argv = vec![tcpkit(), "copy"];
    argv.extend_from_slice(args);
    run_limited(l.online.command(&argv), Duration::from_secs(20))
}

#[test]
fn a_date_differs_and_is_ignored_only_when_asked_a_changed_body_is_found() {
    let mut l = CopyLab::new("cpdiffo");
    let (_tg, _) = l.nginx(false, Log::Peer);
    serve(&l, "target", &[("same.txt", SAME), ("other.txt", CHANGED)]);
    let same = fetch(&l, "/same.txt");
    let other = fetch(&l, "/other.txt");
    assert!(same.ends_with(SAME.as_bytes()) && other.ends_with(CHANGED.as_bytes()));
    // The production answers, as captured: another day's Date; other.txt's body differs.
    let orig_same = old_date(&same);
    let mut orig_other = old_date(&other);
    let n = orig_other.len();
    orig_other[n - CHANGED.len()..].copy_from_slice(ORIGINAL.as_bytes());
    // Our requests say keep-alive (no Connection: close): nginx's answers then differ from
    // the fetched ones in that header alone, which the capture must match.
    let ka = |a: Vec<u8>| {
        String::from_utf8(a)
            .unwrap()
            .replace("Connection: close", "Connection: keep-alive")
            .into_bytes()
    };
    let (orig_same, orig_other) = (ka(orig_same), ka(orig_other));
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("prod.pcap");
    // 3 sessions x (same, other, same): 6 answers alike but for the Date, 3 with a new body.
    diff_capture(
        &pcap,
        3,
        42000,
        &[
            ("/same.txt", orig_same),
            ("/other.txt", orig_other),
            ("/same.txt", ka(same.clone())),
        ][..],
    );
    // The third answer of each session is the target's own (Date from the fetch): it may
    // differ from the copy's answer by a second; every check below tolerates exactly that
    // by counting only the first two answers of each session where it matters.
    let p = pcap.to_str().unwrap();
    let rule = format!("8080-{TARGET}:8080");
    let base = ["-x", &rule, "--input", p, "--speed", "10", "--json"];
    let with = |extra: &[&str]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        diff_of(&run(&l, &v))
    };

    // Bytes, nothing ignored: the old Date makes the first two answers of each session differ.
    let d = with(&["--diff"]);
    assert_eq!(d["mode"], "bytes");
    assert_eq!(u(&d, "compared"), 9, "{d:#}");
    assert!(u(&d, "different") >= 6, "{d:#}");
    assert_eq!(u(&d, "equal") + u(&d, "different"), 9);
    assert_eq!(u(&d, "written"), 0);
    assert_eq!(d["out"], Value::Null);

    // Bytes with the Date line blanked: only other.txt's body differs.
    let d = with(&["--diff", "--diff-ignore", "^Date:.*$"]);
    assert_eq!(counts(&d), (9, 6, 3), "{d:#}");

    // http, nothing ignored: the headers differ (Date).
    let d = with(&["--diff", "--diff-mode", "http"]);
    assert_eq!(d["mode"], "http");
    assert!(u(&d, "different") >= 6, "{d:#}");

    // http without Date: exactly the three changed bodies; the first of them written.
    let out = dir.path().join("diffs.jsonl");
    let o = out.to_str().unwrap();
    let d = with(&[
        "--diff",
        "--diff-mode",
        "http",
        "--diff-ignore",
        "^Date:",
        "--diff-out",
        o,
        "--diff-max",
        "2",
    ]);
    assert_eq!(counts(&d), (9, 6, 3), "{d:#}");
    assert_eq!((u(&d, "written"), u(&d, "compared_by_hash")), (2, 0));
    assert_eq!(d["out"], o);
    let recs = records(&out);
    assert_eq!(recs.len(), 2);
    for r in &recs {
        assert_eq!(r["reason"], "body", "{r:#}");
        assert_eq!(
            r["request"], 2,
            "other.txt is each session's second request"
        );
        assert_eq!(
            (&r["copy"], &r["message"]),
            (&Value::from(1), &Value::from(1))
        );
        assert_eq!(r["target"], format!("{TARGET}:8080"));
        assert_eq!(r["server"], format!("{ONLINE}:8080"));
        let (a, b) = (
            r["original"]["text"].as_str().unwrap(),
            r["target_response"]["text"].as_str().unwrap(),
        );
        assert!(
            a.starts_with("HTTP/1.1 200 OK\r\n") && a.ends_with(ORIGINAL),
            "{a}"
        );
        assert!(b.ends_with(CHANGED), "{b}");
        assert_eq!(r["original"]["length"], r["target_response"]["length"]);
    }
    let s: Vec<u64> = recs.iter().map(|r| u(r, "session")).collect();
    assert_ne!(s[0], s[1], "one difference per session");

    // A name's case in a pattern matters unless it says (?i); several patterns add up.
    let d = with(&["--diff", "--diff-mode", "http", "--diff-ignore", "^date:"]);
    assert!(u(&d, "different") >= 6, "{d:#}");
    let d = with(&[
        "--diff",
        "--diff-mode",
        "http",
        "--diff-ignore",
        "(?i)^date:",
        "--diff-ignore",
        "^ETag:",
    ]);
    assert_eq!(counts(&d), (9, 6, 3), "{d:#}");

    // -n 2: every copy compared on its own.
    let d = with(&["--diff", "--diff-ignore", "^Date:.*$", "-n", "2"]);
    assert_eq!(counts(&d), (18, 12, 6), "{d:#}");

    // The human summary says it in one line.
    let mut argv = vec![tcpkit(), "copy", "-x", &rule, "--input", p, "--speed", "10"];
    argv.extend_from_slice(&["--diff", "--diff-mode", "http", "--diff-ignore", "^Date:"]);
    let h = run_limited(l.online.command(&argv), Duration::from_secs(20));
    let text = String::from_utf8_lossy(&h.stdout);
    assert!(
        text.contains("\nDiff (http): 9 compared, 6 equal, 3 different (0 written), 0 over 64.0 KiB compared by length and hash, 0 not compared\n"),
        "{text}"
    );
    // Without --diff the report has none.
    let o = run(&l, &base);
    assert_eq!(json(&o)["diff"], Value::Null);
}

#[test]
fn live_copy_finds_exactly_the_requests_for_the_changed_file() {
    let mut l = CopyLab::new("cpdiffl");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    serve(&l, "online", &[("same.txt", SAME), ("other.txt", ORIGINAL)]);
    serve(&l, "target", &[("same.txt", SAME), ("other.txt", CHANGED)]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("diffs.jsonl");
    let rule = format!("8080-{TARGET}:8080");
    let c = l.copy_rule(
        &rule,
        &[
            "--duration",
            "3",
            "--json",
            "--diff",
            "--diff-mode",
            "http",
            "--diff-ignore",
            "^Date:",
            "--diff-out",
            out.to_str().unwrap(),
            "--diff-max",
            "3",
        ],
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            l.load(
                8080,
                &[
                    "--http-get",
                    "/same.txt",
                    "-c",
                    "2",
                    "-r",
                    "300",
                    "-t",
                    "1.5",
                ],
            )
        });
        s.spawn(|| {
            l.load(
                8080,
                &[
                    "--http-get",
                    "/other.txt",
                    "-c",
                    "1",
                    "-r",
                    "40",
                    "-t",
                    "1.5",
                ],
            )
        });
        // A new connection per request too.
        s.spawn(|| {
            l.load(
                8080,
                &[
                    "--http-get",
                    "/other.txt",
                    "-c",
                    "1",
                    "-r",
                    "20",
                    "-t",
                    "1.5",
                    "--queries-per-conn",
                    "1",
                ],
            )
        });
    });
    let o = wait_limited(c, Duration::from_secs(20));
    let d = diff_of(&o);
    let r = json(&o);
    let count = |log: &Path, f: &str| lines(log).iter().filter(|x| x.contains(f)).count() as u64;
    let (same_t, other_t) = (count(&tg_log, "/same.txt"), count(&tg_log, "/other.txt"));
    assert!(count(&on_log, "/other.txt") >= 80, "{r:#}");
    assert_eq!(u(&r, "sessions.open_at_end"), 0, "{r:#}");
    // Exactly the requests for other.txt differ; every same.txt answer is equal.
    assert_eq!(counts(&d), (same_t + other_t, same_t, other_t), "{d:#}");
    assert_eq!(u(&d, "not_compared"), 0);
    assert_eq!(u(&d, "written"), 3);
    let recs = records(&out);
    assert_eq!(recs.len(), 3);
    for x in &recs {
        assert_eq!(x["reason"], "body");
        assert!(x["original"]["text"].as_str().unwrap().ends_with(ORIGINAL));
        assert!(x["target_response"]["text"]
            .as_str()
            .unwrap()
            .ends_with(CHANGED));
        assert_eq!(
            x["client"].as_str().unwrap().split(':').next(),
            Some(CLIENT)
        );
    }
}
