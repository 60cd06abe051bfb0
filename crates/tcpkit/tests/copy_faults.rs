//! `tcpkit copy` (relay mode) when things go wrong, and offline: captures with lost packets
//! (in a file, or dropped by the kernel from a live capture), --speed / --max-idle / --loop /
//! --ramp, think-time pacing, bad rules and interfaces, no privilege to capture. A target down
//! at start and mid-run, a silent one, one that never answers (--timeout, --no-wait) and memory
//! over --max-memory are in copy_modes.rs, over both transports.

use crate::copy_common;

use std::time::{Duration, Instant};

use copy_common::*;
use tcpkit_wire::tcp::Segment;

/// [`run_copy`] of a run that fails by its own figures, `why` in its reason.
fn run_copy_failed(l: &CopyLab, args: &[&str], limit: Duration, why: &str) -> serde_json::Value {
    failed_report(&l.copy_to_end(args, limit), why)
}

/// The report of `copy ARGS` run to completion, which must succeed ([`mode_report`]).
fn run_copy(l: &CopyLab, args: &[&str], limit: Duration) -> serde_json::Value {
    mode_report(&l.copy_to_end(args, limit), "relay")
}

#[test]
fn offline_capture_with_a_lost_segment_is_counted_not_hung_and_speed_idle_loop_ramp_work() {
    let mut l = CopyLab::new("cpfile");
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    let dir = tempfile::tempdir().unwrap();
    let rule = rule_8080();
    // Real HTTP requests: 4 sessions of 5 GETs, 100 ms apart (a 2 s capture).
    let get = b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n";
    let pcap = dir.path().join("http.pcap");
    {
        let answer: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";
        let mut frames = http_session_frames(4, 41000, 100_000_000, &[(get.as_slice(), answer); 5]);
        // One client data segment of the first session never made it into the capture.
        lose_a_request(&mut frames, 41000);
        write_frames(&pcap, &frames);
    }
    let p = pcap.to_str().unwrap();
    let t = Instant::now();
    // 3 of the 19 requests at the source were lost with the hole: over --max-loss.
    let r = run_copy_failed(
        &l,
        &["-x", &rule, "--input", p, "--json"],
        Duration::from_secs(10),
        "request loss ratio 15.789 % is above --max-loss 1 % (16 of 19 requests answered; 1 of 4 copies failed: 1 lost capture data)",
    );
    let secs1 = t.elapsed().as_secs_f64();
    assert_eq!(u(&r, "sessions.failed.lost_capture_data"), 1, "{r:#}");
    assert_eq!(u(&r, "capture.sessions_with_lost_data"), 1, "{r:#}");
    assert_eq!(u(&r, "sessions.completed"), 3, "{r:#}");
    // The three requests of session 1 the capture saw past the hole count at the source
    // (the lost one itself was never seen), never copied.
    assert_eq!(u(&r, "requests.at_source"), 1 + 3 + 3 * 5, "{r:#}");
    // Session 1 is copied up to the hole (its first request), the others whole.
    assert_eq!(lines(&tg_log).len(), 1 + 3 * 5, "{r:#}");
    assert_eq!(u(&r, "requests.answered"), 16, "{r:#}");
    // copy lowers its priority by --nice steps (10 by default) from what it inherited, as
    // nice(1) does, at most to 19 (the suite may run under `nice -n 5` or `-n 19`).
    assert_eq!(u(&r, "nice"), (own_nice() + 10).min(19), "{r:#}");
    assert!(r["source"].as_str().unwrap().starts_with("file "));
    assert!(secs1 >= 0.5, "played at the capture's pace: {secs1}");
    check_schema(&r);
    // The same capture again, with `extra` flags.
    let play = |extra: &[&str]| {
        let args = [&["-x", &rule, "--input", p, "--json"], extra].concat();
        run_copy(&l, &args, Duration::from_secs(10))
    };
    // --speed 4 --loop 2: twice the requests, in less time; --max-idle caps the 100 ms gaps.
    // The hole's loss allowed (--max-loss 20): the runs are judged on the rest.
    let t = Instant::now();
    let r = play(&["--speed", "4", "--loop", "2", "--max-loss", "20"]);
    let secs4 = t.elapsed().as_secs_f64();
    assert_eq!(u(&r, "requests.answered"), 32, "{r:#}");
    assert_eq!(lines(&tg_log).len(), 16 * 3);
    assert!(
        secs4 < secs1,
        "--speed 4 --loop 2 took {secs4} s, --speed 1 {secs1} s"
    );
    let t = Instant::now();
    let r = play(&["--max-idle", "0.001", "--max-loss", "20"]);
    assert!(
        t.elapsed().as_secs_f64() < secs1 / 2.0,
        "{:?} vs {secs1}",
        t.elapsed()
    );
    assert_eq!(u(&r, "requests.answered"), 16, "{r:#}");
    // --ramp: at the start of a long ramp nothing is copied yet.
    let r = play(&["--ramp", "1000", "--max-idle", "0.001"]);
    assert_eq!(u(&r, "sessions.selected"), 0, "{r:#}");
    assert_eq!(u(&r, "sessions.sampled_out"), 4, "{r:#}");
    // A truncated file: what came before is copied, then exit 1 naming the file.
    let bytes = std::fs::read(&pcap).unwrap();
    let cut = dir.path().join("cut.pcap");
    std::fs::write(&cut, &bytes[..bytes.len() - 30]).unwrap();
    let cut = cut.to_str().unwrap();
    let o = l.copy_to_end(
        &["-x", &rule, "--input", cut, "--max-idle", "0.001", "--json"],
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("tcpkit copy: ") && err.contains("cut.pcap") && err.lines().count() == 1,
        "{err}"
    );
    assert!(json(&o)["failure"].is_string());
}

/// Usage errors, exit 2 with one line naming the flag (and the file): bad rules, and each file
/// flag whose file cannot be used as given (issue 24 item 15: a missing `--input`, a key file
/// of the wrong mode, a missing one exited 1); an interface that is not there is the
/// environment's refusal, exit 1.
#[test]
fn bad_rules_interfaces_and_files_are_one_line_errors() {
    use std::os::unix::fs::PermissionsExt;
    let l = CopyLab::new("cpbad");
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (pcap, text, open_key) = (path("s.pcap"), path("notes.txt"), path("open.key"));
    synth_pcap(dir.path().join("s.pcap").as_path(), 1, 1, 10, None);
    std::fs::write(&text, "not a capture\n").unwrap();
    std::fs::write(&open_key, "0123456789abcdef0123\n").unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let no_dir = path("no/such/dir/d.jsonl");
    let rule = "80-198.18.2.2:80";
    let transparent = ["-x", rule, "--transparent", "--intercept", "198.18.2.9"];
    for (args, code, want) in [
        (
            vec!["-x", "80"],
            2,
            "tcpkit copy: -x: rule '80': no '-' between source and target".to_string(),
        ),
        (
            vec!["-x", "80-nowhere:80"],
            2,
            "tcpkit copy: -x: rule '80-nowhere:80': target 'nowhere:80' is not IP:port".into(),
        ),
        (
            vec!["-x", "80-1.2.3.4:80,80-1.2.3.5:80"],
            2,
            "copies the same server".into(),
        ),
        (
            vec!["-x", rule, "-i", "nosuch0"],
            1,
            "tcpkit copy: capture: nosuch0: no such network interface".into(),
        ),
        (
            vec!["-x", rule, "--input", "/nonexistent.pcap"],
            2,
            "tcpkit copy: --input /nonexistent.pcap: cannot open: No such file or directory"
                .into(),
        ),
        (
            vec!["-x", rule, "--input", &text],
            2,
            format!("tcpkit copy: --input {text}: not a pcap or pcapng file"),
        ),
        (
            [&transparent[..], &["--auth-key-file", &open_key]].concat(),
            2,
            format!("tcpkit copy: --auth-key-file {open_key}: readable by others than its owner (mode 0644): chmod 600 it"),
        ),
        (
            [&transparent[..], &["--auth-key-file", "/nonexistent.key"]].concat(),
            2,
            "tcpkit copy: --auth-key-file /nonexistent.key: No such file or directory".into(),
        ),
        (
            vec!["-x", rule, "--input", &pcap, "--diff", "--diff-out", &no_dir],
            2,
            format!("tcpkit copy: --diff-out {no_dir}: cannot create: No such file or directory"),
        ),
        (
            vec![],
            2,
            "tcpkit copy: the following required arguments were not provided: --copy".into(),
        ),
    ] {
        let o = l.copy_to_end(&args, Duration::from_secs(10));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(&want), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

/// Without CAP_NET_RAW a live copy cannot open its capture: it says so on one line (the
/// capability, and root as the way) and exits 1 at once; `--check` says the same on its
/// capture line with the fix, while the target line stays OK. The same command as root
/// runs, so the failure is the privilege's and nothing else's.
#[test]
fn without_privilege_copy_and_check_name_the_missing_capability() {
    let mut l = CopyLab::new("cpnopriv");
    let (_tg, _) = l.nginx(false, Log::Peer);
    let rule = rule_8080();
    let cap = l.capture_if();
    let copy = [
        "copy",
        "-x",
        &rule,
        "-i",
        &cap,
        "--duration",
        "0.5",
        "--json",
    ];
    let argv = [&[tcpkit()], &copy[..]].concat();
    let t = Instant::now();
    let o = run_limited(unprivileged(&l.online, &argv), Duration::from_secs(10));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    one_line_failure(
        &o,
        &format!("tcpkit copy: capture: {cap}: socket(AF_PACKET) (needs root or CAP_NET_RAW)"),
        "Operation not permitted",
    );
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // -i any is the default: the same.
    let o = run_limited(
        unprivileged(
            &l.online,
            &[tcpkit(), "copy", "-x", &rule, "--duration", "0.5"],
        ),
        Duration::from_secs(10),
    );
    one_line_failure(
        &o,
        "tcpkit copy: capture: any: socket(AF_PACKET)",
        "CAP_NET_RAW",
    );
    // As root the same command copies.
    let o = run_limited(l.online.command(&argv), Duration::from_secs(10));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_accounted(&json(&o));

    let mut check = argv.clone();
    check.retain(|a| !["--duration", "0.5"].contains(a));
    check.push("--check");
    let o = run_limited(unprivileged(&l.online, &check), Duration::from_secs(20));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert_eq!(err, "tcpkit copy: --check: 1 of 4 checks failed\n");
    let a: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = a.as_array().unwrap();
    assert_eq!(a[0]["name"], format!("capture on {cap}"), "{out}");
    assert_eq!(a[0]["ok"], false, "{out}");
    assert_eq!(
        a[0]["detail"], "no permission to capture (needs CAP_NET_RAW)",
        "{out}"
    );
    assert_eq!(
        a[0]["fix"], "run as root, or `setcap cap_net_raw,cap_net_admin+ep $(command -v tcpkit)`",
        "{out}"
    );
    assert!(a[1..].iter().all(|c| c["ok"] == true), "{out}");
    // And as text: the line a user reads.
    check.retain(|x| *x != "--json");
    let o = run_limited(unprivileged(&l.online, &check), Duration::from_secs(20));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines().next().is_some_and(|x| x.starts_with(&format!(
            "FAIL capture on {cap}: no permission to capture (needs CAP_NET_RAW); fix: run as root"
        ))),
        "{out}"
    );
}

/// An HTTP/1.1 server in `host` on `addr` that answers each request `delay` after it arrived
/// (a target slower than production) and records when each request's head arrived, per
/// connection. Arrivals are read as they come, even while an answer is pending.
fn slow_http_server(
    host: &tcpkit_lab::Host,
    addr: &str,
    delay: Duration,
) -> std::sync::Arc<std::sync::Mutex<Vec<Vec<Instant>>>> {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<Vec<Instant>>>> = Arc::default();
    let s2 = seen.clone();
    serve_each(host, addr, move |mut s| {
        let conn = {
            let mut v = s2.lock().unwrap();
            v.push(Vec::new());
            v.len() - 1
        };
        let (tx, rx) = std::sync::mpsc::channel::<Instant>();
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            for at in rx {
                std::thread::sleep((at + delay).saturating_duration_since(Instant::now()));
                if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                    .is_err()
                {
                    return;
                }
            }
        });
        // Arrivals are read here, on the connection's own thread, while answers wait.
        let mut buf = Vec::new();
        let mut b = [0u8; 4096];
        while let Ok(n) = copy_common::sock::read_some(&mut s, &mut b) {
            if n == 0 {
                return;
            }
            let now = Instant::now();
            buf.extend_from_slice(&b[..n]);
            while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..i + 4);
                s2.lock().unwrap()[conn].push(now);
                let _ = tx.send(now);
            }
        }
    });
    seen
}

/// tcpcopy's pacing, seen at the target: within a session a request goes out once the
/// target answered the one before, plus the think time the client really had (divided by
/// --speed), until the copy is --max-lag behind its client; --no-wait sends as captured.
#[test]
fn requests_wait_for_the_targets_answer_plus_the_clients_think_time() {
    let l = CopyLab::new("cpthink");
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("think.pcap");
    // One keep-alive session of 4 GETs, 300 ms apart, each answered within 150 µs: a think
    // time of ~300 ms before each request after the first.
    let get = b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n";
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
    write_frames(
        &pcap,
        &http_session_frames(1, 42000, 300_000_000, &[(get.as_slice(), answer); 4]),
    );
    let p = pcap.to_str().unwrap();
    // Each run gets its own port (and server), so arrivals are not mixed up.
    let run = |port: u16, extra: &[&str]| -> Vec<u128> {
        // The target takes 400 ms over each answer, longer than the captured gaps: paced
        // by the capture alone or by the answer alone, the gaps would be shorter than
        // answer + think.
        let addr = format!("{TARGET}:{port}");
        let seen = slow_http_server(&l.target, &addr, Duration::from_millis(400));
        let rule = format!("8080-{addr}");
        let mut args = vec!["-x", rule.as_str(), "--input", p, "--json"];
        args.extend_from_slice(extra);
        let r = run_copy(&l, &args, Duration::from_secs(15));
        assert_eq!(u(&r, "sessions.completed"), 1, "{r:#}");
        assert_eq!(u(&r, "requests.copied"), 4, "{r:#}");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "one connection: {r:#}");
        assert_eq!(seen[0].len(), 4, "{r:#}");
        seen[0]
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect()
    };
    // --speed 1: answer (400 ms) + think (300 ms) (the copy ends 1.2 s behind its client:
    // past the default --max-lag).
    let gaps = run(9101, &["--max-lag", "1h"]);
    assert!(
        gaps.iter().all(|g| (650..1000).contains(g)),
        "gaps at the target {gaps:?} ms, not 400 + 300"
    );
    // --speed 2: the think time halves (400 + 150).
    let gaps = run(9102, &["--speed", "2", "--max-lag", "1h"]);
    assert!(
        gaps.iter().all(|g| (500..650).contains(g)),
        "gaps at the target with --speed 2 {gaps:?} ms, not 400 + 150"
    );
    // --max-lag 500ms: the second request waits out the think time (400 ms behind its
    // client's 300 ms); the third would be 800 ms behind, so it goes at the bound, which is
    // its answer's time: from then on one every answer (400 ms).
    let gaps = run(9104, &["--max-lag", "500ms"]);
    assert!(
        (650..1000).contains(&gaps[0]) && gaps[1..].iter().all(|g| (380..500).contains(g)),
        "gaps at the target with --max-lag 500ms {gaps:?} ms, not 700, 400, 400"
    );
    // --no-wait: as captured, 300 ms apart, whatever the target's answers.
    let gaps = run(9103, &["--no-wait"]);
    assert!(
        gaps.iter().all(|g| (250..380).contains(g)),
        "gaps at the target with --no-wait {gaps:?} ms, not the captured 300"
    );
}

/// Packets the kernel drops from a live capture (the copy stopped for 2 s while clients keep
/// sending: its ring fills, then overflows) are never silent: the report counts them, every
/// keep-alive session they cut stalls at its hole and ends as lost_capture_data (copied up to
/// the hole, by that cause and no other), the requests the capture saw past the holes count
/// at the source unanswered so the loss ratio shows them, and the run still ends on time.
#[test]
fn live_capture_drops_are_counted_and_their_sessions_end_lost_not_silently() {
    let mut l = CopyLab::new("cpdrops");
    let (on_log, tg_log) = l.nginx_pair();
    let t0 = Instant::now();
    let c = l.copy_rule(
        &rule_8080(),
        &["--timeout", "1", "--duration", "7", "--json"],
    );
    // 4 keep-alive sessions, 400 requests/s for 4 s; the copy stopped from 0.8 s to 2.8 s.
    // The ring holds its 64 blocks of 10 ms: at this rate the last 1.3 s of the stop are
    // dropped.
    std::thread::scope(|s| {
        let load = s.spawn(|| l.http_get("4", "400", "4", None));
        std::thread::sleep(Duration::from_millis(800));
        freeze(&c, Duration::from_secs(2));
        load.join().unwrap();
    });
    let o = wait_limited(c, Duration::from_secs(20));
    // --duration 7, then at most --timeout and the 2 s the closing copies linger.
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(11), "{took:?}");
    // What the kernel dropped was never copied: the run lost more than --max-loss.
    let r = failed_report(&o, "is above --max-loss 1 %");
    check_schema(&r);
    let at_source = lines(&on_log).len() as u64;
    assert!(u(&r, "capture.kernel_drops") >= 100, "{r:#}");
    // Every session was cut, and each ended by that cause alone.
    assert_eq!(u(&r, "sessions.seen"), 4, "{r:#}");
    assert_eq!(u(&r, "sessions.failed.lost_capture_data"), 4, "{r:#}");
    assert_eq!(u(&r, "capture.sessions_with_lost_data"), 4, "{r:#}");
    assert_eq!(u(&r, "sessions.completed"), 0, "{r:#}");
    // Copied up to the holes, well short of the source. (The target may log a few more
    // than were counted: client bytes captured past a hole in the server's direction have
    // no server turn between them and go out as one request.)
    let answered = u(&r, "requests.answered");
    assert_eq!(u(&r, "requests.copied"), answered, "{r:#}");
    let at_target = lines(&tg_log).len() as u64;
    assert!(
        answered >= 200 && at_target >= answered && at_target + 300 < at_source,
        "{at_source} at the source, {at_target} at the target: {r:#}"
    );
    // The requests seen after the stop count at the source, never answered; the dropped
    // ones cannot be counted as requests (the kernel's count is the packets').
    let seen = u(&r, "requests.at_source");
    assert!(
        seen >= answered + 200 && seen <= at_source,
        "{at_source}: {r:#}"
    );
    let loss = r["requests"]["loss_ratio_percent"].as_f64().unwrap();
    assert!(loss >= 20.0, "{r:#}");
    assert_eq!(
        r["capture"]["out_of_order_segments"]
            .as_u64()
            .map(|n| n > 0),
        Some(true),
        "{r:#}"
    );
}

/// `copy ARGS` in the online host, to completion: its output and the last line on stderr.
fn copy_failing(l: &CopyLab, args: &[&str]) -> (std::process::Output, String) {
    let o = l.copy_to_end(args, Duration::from_secs(15));
    let last = String::from_utf8_lossy(&o.stderr)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    (o, last)
}

/// Issue 10 case 3: a copy whose target answered nothing said `request loss ratio 100.000 %`
/// and exited 0. A run that copied nothing the target answered, or lost more than --max-loss
/// of the requests, exits 1 with the reason as the last line (the JSON report still printed,
/// the reason in its `failure`); a loss within --max-loss is a success.
#[test]
fn a_run_the_target_did_not_answer_exits_1_with_the_reason_last() {
    let l = CopyLab::new("cpverdict");
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("s.pcap");
    // 2 sessions of 3 requests each.
    synth_pcap(&pcap, 2, 3, 100, None);
    let p = pcap.to_str().unwrap();
    // Nothing listens on the target's 9191: every connect is refused.
    let refused = [
        "-x",
        "8080-198.18.2.2:9191",
        "--input",
        p,
        "--timeout",
        "0.5",
    ];
    let (o, last) = copy_failing(&l, &[&refused[..], &["--json"]].concat());
    assert_eq!(o.status.code(), Some(1), "{last}");
    let r = json(&o);
    assert_accounted(&r);
    check_schema(&r);
    assert_eq!(u(&r, "sessions.failed.target_refused"), 2, "{r:#}");
    assert_eq!(
        last,
        "tcpkit copy: the target answered none of the 6 requests seen (2 of 2 copies failed: 2 target refused)",
        "{r:#}"
    );
    assert_eq!(r["failure"].as_str(), last.strip_prefix("tcpkit copy: "));
    // The same in the human summary's last line.
    let (o, last2) = copy_failing(&l, &refused);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(last2, last);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.ends_with(&format!("Failed: {}\n", &last["tcpkit copy: ".len()..])),
        "{out}"
    );
    // A target that answers each session's first request, then closes: 2 of 6 answered.
    let _got = fault_server(&l.target, "198.18.2.2:9090", Fault::CloseAfterAnswer);
    let args = [
        "-x",
        "8080-198.18.2.2:9090",
        "--input",
        p,
        "--timeout",
        "0.5",
        "--json",
    ];
    let (o, last) = copy_failing(&l, &args);
    assert_eq!(o.status.code(), Some(1), "{last}");
    let r = json(&o);
    assert_eq!(u(&r, "requests.answered"), 2, "{r:#}");
    assert_eq!(
        r["requests"]["max_loss_percent"].as_f64(),
        Some(1.0),
        "{r:#}"
    );
    assert_eq!(
        last,
        "tcpkit copy: request loss ratio 66.667 % is above --max-loss 1 % (2 of 6 requests answered; 2 of 2 copies failed: 2 closed early)"
    );
    // Within --max-loss: done.
    let mut more = args.to_vec();
    more.extend_from_slice(&["--max-loss", "70"]);
    let (o, last) = copy_failing(&l, &more);
    assert_eq!(o.status.code(), Some(0), "{last}");
    let r = json(&o);
    assert!(r["failure"].is_null(), "{r:#}");
    assert_eq!(
        r["requests"]["max_loss_percent"].as_f64(),
        Some(70.0),
        "{r:#}"
    );
    check_schema(&r);
}

/// Issue 24 item 4: in relay mode a target that refused every connect was said nothing of
/// until the 10 s --timeout, and a run shorter than that reported "0 target refused, 20
/// open", where transparent mode counts each refusal at once. A refused connect ends its
/// copy as refused at once; the first refusal is said on stderr at once, the live line
/// counts it, and the copies still held back by the back-off when the run ends count as
/// refused (skipped in back-off), not open.
#[test]
fn relay_to_a_closed_port_counts_and_says_refusals_at_once() {
    let _turn = crate::common::timing_turn();
    let mut l = CopyLab::new("cprefuse");
    let (_on, _) = l.nginx(true, Log::Peer);
    // Nothing listens on the target's 9191.
    let target = format!("{TARGET}:9191");
    let rule = format!("8080-{target}");
    let mut c = l.copy_rule(&rule, &["--json", "--duration", "1.2", "--stats", "0.1"]);
    let err = timed_lines(c.stderr.take().unwrap());
    let t0 = Instant::now();
    // 10 sessions of one request each, over 0.5 s.
    l.http_get("2", "20", "0.5", Some("1"));
    let o = wait_limited(c, Duration::from_secs(10));
    let err = err.join().unwrap();
    let text: Vec<&str> = err.iter().map(|(_, l)| l.as_str()).collect();
    let first = |what: &str, f: &dyn Fn(&str) -> bool| {
        let (at, line) = err
            .iter()
            .find(|(_, l)| f(l))
            .unwrap_or_else(|| panic!("no {what} on stderr: {text:#?}"));
        let after = at.duration_since(t0);
        assert!(
            after < Duration::from_secs(1),
            "{what} {after:?} in: {line}"
        );
        (after, line.clone())
    };
    let (said_after, said) = first("refusal", &|l| l.starts_with("tcpkit copy: target "));
    assert_eq!(
        said,
        format!(
            "tcpkit copy: target {target} refused a connection (Connection refused (os error 111)): \
             its copies count as refused, and try again one at a time until it accepts one"
        )
    );
    let (counted_after, _) = first("live line with a failed copy", &|l| {
        l.starts_with('[') && l.contains(" completed, ") && !l.contains(" 0 failed")
    });
    assert_eq!(o.status.code(), Some(1), "{text:#?}");
    let r = json(&o);
    assert_accounted(&r);
    check_schema(&r);
    let copies = u(&r, "sessions.copies");
    assert!(copies >= 5, "{r:#}");
    assert_eq!(u(&r, "sessions.failed.target_refused"), copies, "{r:#}");
    assert_eq!(u(&r, "sessions.open_at_end"), 0, "{r:#}");
    eprintln!(
        "relay to a closed port: said {said_after:?} and counted on a live line {counted_after:?} \
         after the traffic started; {}",
        r["sessions"]
    );
    assert_eq!(
        text.last().copied().unwrap_or_default(),
        format!(
            "tcpkit copy: the target answered none of the {} requests seen ({copies} of {copies} copies failed: {copies} target refused)",
            u(&r, "requests.at_source")
        )
    );
}

/// Issue 10 case 9: SIGINT to a live copy whose copies wait on a silent target took 9.2 s
/// (their --timeout), and `--duration 5` ran 10.3 s. After the first signal, or --duration,
/// the copies still waiting get a bounded drain (1 s, said in --help), then the report is
/// printed; those copies count as open at the end.
#[test]
fn sigint_or_duration_stops_a_copy_waiting_on_a_silent_target_within_the_drain_bound() {
    let mut l = CopyLab::new("cpsigint");
    l.nginx_pair();
    nft::drop_tcp_to(&l.target, 8080);
    let rule = rule_8080();
    // SIGINT, with the default --timeout of 10 s.
    let c = l.copy_rule(&rule, &["--json"]);
    l.http_get("2", "20", "1", None);
    let t = Instant::now();
    // SAFETY: kill(2) takes no pointers; the pid is the copy's own process, still our
    // unreaped child (ip netns exec execs it), so it cannot name another process.
    let sent = unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(sent, 0);
    let o = wait_limited(c, Duration::from_secs(15));
    let took = t.elapsed();
    assert!(took < Duration::from_millis(1800), "SIGINT took {took:?}");
    let r = failed_report(&o, "the target answered none of the");
    assert!(u(&r, "sessions.open_at_end") >= 1, "{r:#}");
    check_schema(&r);
    // --duration 2: the run ends within 2 s and the drain.
    let t = Instant::now();
    let c = l.copy_rule(&rule, &["--json", "--duration", "2"]);
    l.http_get("2", "20", "1", None);
    let o = wait_limited(c, Duration::from_secs(20));
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(3800),
        "--duration 2 took {took:?}"
    );
    let r = failed_report(&o, "the target answered none of the");
    assert!(u(&r, "sessions.open_at_end") >= 1, "{r:#}");
}

/// Issue 10 case 13: a real capture whose server side has a hole (the client's bytes whole):
/// copy sent the client's bytes up to the hole, then ended the session as "lost capture
/// data". The client's stream is what is copied, so it is copied whole; the hole only costs
/// that answer's comparison (--diff counts it as an incomplete original) and its timing.
/// The capture is tcpdump's of one keep-alive session of 5 GETs of a 100 kB file; one data
/// frame of the server's second answer is cut out of it.
#[test]
fn a_hole_in_a_servers_answer_still_copies_the_clients_session_whole() {
    use tcpkit_pcap::{CaptureFile, PcapWriter};
    let mut l = CopyLab::new("cpsrvhole");
    let (on_log, tg_log) = l.nginx_pair();
    let body: String = (0..100_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    serve(&l, "online", &[("big.txt", &body)]);
    serve(&l, "target", &[("big.txt", &body)]);
    let (online, cif) = (l.online.clone(), l.capture_if());
    let dump = l
        .lab
        .tcpdump(&online, &cif, "tcp port 8080")
        .expect("tcpdump");
    let url = format!("http://{ONLINE}:8080/big.txt?k=[1-5]");
    let o = l.client(&["curl", "-sS", "-o", "/dev/null", &url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::thread::sleep(Duration::from_millis(300));
    let whole = dump.stop().expect("tcpdump").path;
    assert_eq!(lines(&on_log).len(), 5);
    // The server's data frames of its second answer: those after the second request.
    let f = CaptureFile::open(&whole).unwrap();
    let frames: Vec<(u64, u32, Vec<u8>)> = f
        .packets()
        .map(|p| p.unwrap())
        .map(|p| (p.ts_ns, p.linktype, p.data.to_vec()))
        .collect();
    let seg = |d: &[u8]| Segment::parse(d).unwrap();
    let (mut requests, mut cut, mut client_bytes) = (0, None, 0usize);
    let mut answer2 = 0;
    for (k, (_, _, d)) in frames.iter().enumerate() {
        let s = seg(d);
        if s.payload.is_empty() {
            continue;
        }
        if s.dst.port() == 8080 {
            requests += 1;
            client_bytes += s.payload.len();
        } else if requests == 2 {
            answer2 += 1;
            // Its second data frame: inside the answer, headers seen.
            if answer2 == 2 {
                cut = Some(k);
            }
        }
    }
    assert_eq!(requests, 5, "one frame per GET");
    let cut = cut.expect("the second answer in more than one frame");
    let lost = seg(&frames[cut].2).payload.len();
    let holed = l.dir.path().join("holed.pcap");
    {
        let mut w = PcapWriter::create(&holed, frames[0].1, 65535, true).unwrap();
        for (k, (ts, _, d)) in frames.iter().enumerate() {
            if k != cut {
                w.write_packet(*ts, d, d.len() as u32).unwrap();
            }
        }
        w.finish().unwrap();
    }
    let rule = rule_8080();
    let r = run_copy(
        &l,
        &[
            "-x",
            &rule,
            "--input",
            holed.to_str().unwrap(),
            "--diff",
            "--diff-mode",
            "http",
            "--diff-ignore",
            "^Date:",
            "--json",
        ],
        Duration::from_secs(15),
    );
    check_schema(&r);
    // Copied whole: every client byte, every request answered, the session completed.
    assert_eq!(u(&r, "requests.bytes_copied"), client_bytes as u64, "{r:#}");
    assert_eq!(u(&r, "requests.at_source"), 5, "{r:#}");
    assert_eq!(u(&r, "requests.answered"), 5, "{r:#}");
    assert_eq!(u(&r, "sessions.completed"), 1, "{r:#}");
    assert_eq!(u(&r, "sessions.failed.lost_capture_data"), 0, "{r:#}");
    assert_eq!(lines(&tg_log).len(), 5);
    // The hole is counted, and only its answer goes uncompared.
    assert_eq!(u(&r, "capture.server_bytes_lost"), lost as u64, "{r:#}");
    let d = &r["diff"];
    assert_eq!(u(d, "original_incomplete"), 1, "{d:#}");
    assert_eq!(counts(d), (4, 4, 0), "{d:#}");
}

/// This process's nice value.
fn own_nice() -> u64 {
    // SAFETY: getpriority reads the calling process's priority; no pointers.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    u64::try_from(n).unwrap_or(0)
}
