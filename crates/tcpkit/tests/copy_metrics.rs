//! `tcpkit copy --metrics ADDR` in the copy lab: curl on the clients' host scrapes the
//! Prometheus text while the copy runs, and the counters move with the traffic.

use crate::copy_common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use copy_common::*;

/// A port free on the online host's address toward the clients.
fn free_port(l: &CopyLab) -> u16 {
    l.online.enter(|| {
        TcpListener::bind(format!("{ONLINE}:0"))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    })
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

/// curl's answer, from the clients' host.
fn scrape(l: &CopyLab, url: &str) -> String {
    let o = run_limited(
        l.clients
            .command(&["curl", "-sS", "-i", "--max-time", "5", url]),
        Duration::from_secs(10),
    );
    assert!(
        o.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn curl_scrapes_live_counters_during_a_copy() {
    let mut l = CopyLab::new("cpmet");
    let (_, tg_log) = l.nginx_pair();
    let port = free_port(&l);
    // Scraped from the clients' host, as a Prometheus server elsewhere would.
    let addr = format!("{ONLINE}:{port}");
    let url = format!("http://{addr}/metrics");
    let rule = rule_8080();
    let c = l.copy_rule(
        &rule,
        &["--duration", "4", "--json", "--diff", "--metrics", &addr],
    );
    let before = scrape(&l, &url);
    assert!(before.starts_with("HTTP/1.0 200 OK\r\n"), "{before}");
    assert!(before.contains("Content-Type: text/plain; version=0.0.4"));
    assert_eq!(sample(&before, "tcpkit_copy_requests_copied_total"), 0.0);
    let mid = std::thread::scope(|s| {
        let load = s.spawn(|| l.http_get("2", "300", "2", None));
        std::thread::sleep(Duration::from_millis(1200));
        let mid = scrape(&l, &url);
        load.join().unwrap();
        mid
    });
    std::thread::sleep(Duration::from_millis(500));
    let after = scrape(&l, &url);
    // Anything but GET /metrics is refused.
    let nf = scrape(&l, &format!("http://{addr}/"));
    assert!(nf.starts_with("HTTP/1.0 404"), "{nf}");
    let r = succeeded(&wait_limited(c, Duration::from_secs(20)));
    let m = |t: &str, n: &str| sample(t, &format!("tcpkit_copy_{n}"));
    // Mid-run the counters are moving; after the load they hold what the report says.
    let copied_mid = m(&mid, "requests_copied_total");
    assert!(copied_mid > 50.0, "{mid}");
    assert!(m(&mid, "sessions_seen_total") >= 2.0);
    assert!(m(&mid, "bytes_copied_total") > 0.0);
    assert!(m(&mid, "memory_resident_bytes") > 1e6);
    assert!(m(&mid, "memory_limit_bytes") > 0.0);
    let copied = m(&after, "requests_copied_total");
    assert!(copied > copied_mid, "{after}");
    assert!(
        copied >= u(&r, "requests.copied") as f64 - 5.0,
        "{after} {r:#}"
    );
    assert!(m(&after, "request_loss_ratio") <= 0.01);
    assert!(m(&after, "diff_compared_total") > 0.0);
    assert_eq!(m(&after, "capture_kernel_drops_total"), 0.0);
    assert!(lines(&tg_log).len() as f64 >= copied - 5.0);
}

#[test]
fn a_metrics_address_in_use_is_a_one_line_error() {
    let l = CopyLab::new("cpmetb");
    let held = l.online.enter(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = held.local_addr().unwrap().to_string();
    let rule = rule_8080();
    let o = l.copy_to_end(
        &["-x", &rule, "-i", &l.capture_if(), "--metrics", &addr],
        Duration::from_secs(10),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("tcpkit copy: --metrics {addr}: ")) && err.lines().count() == 1,
        "{err}"
    );
    let o = l.copy_to_end(&["-x", &rule, "--metrics", "9100"], Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2));
    drop(held);
}

/// `conns` keep-alive connections from the clients to the online nginx, each sending `depth`
/// GETs at once (pipelined) and reading their `depth` answers, again and again for `secs`.
/// Returns the requests answered.
fn pipelined_gets(l: &CopyLab, conns: usize, depth: usize, secs: f64) -> usize {
    use std::io::Write;
    let batch = b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n".repeat(depth);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    std::thread::scope(|s| {
        let each: Vec<_> = (0..conns)
            .map(|_| {
                let batch = &batch;
                s.spawn(move || {
                    let mut c = l
                        .clients
                        .enter(|| std::net::TcpStream::connect(format!("{ONLINE}:8080")))
                        .unwrap();
                    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let (mut done, mut buf) = (0, [0u8; 65536]);
                    while Instant::now() < until {
                        c.write_all(batch).unwrap();
                        let mut got = Vec::new();
                        while got.windows(9).filter(|w| w == b"HTTP/1.1 ").count() < depth {
                            let n = sock::read_some(&mut c, &mut buf).unwrap();
                            assert!(n > 0, "nginx closed the connection");
                            got.extend_from_slice(&buf[..n]);
                        }
                        done += depth;
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    done
                })
            })
            .collect();
        each.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// Issue 24 item 4: with pipelining clients the live loss figure read 0.2-19 % mid-run and
/// 0 % at the end: it counted requests whose answer could still come. Live figures count
/// only what can already be judged (a copy that ended with requests unanswered), so while
/// the target answers everything every live line and every scrape says 0.
#[test]
fn live_loss_is_zero_while_the_target_answers_pipelined_clients() {
    let mut l = CopyLab::new("cppipe");
    let (_, tg_log) = l.nginx_pair();
    let addr = format!("{ONLINE}:{}", free_port(&l));
    let url = format!("http://{addr}/metrics");
    let rule = rule_8080();
    let mut c = l.copy_rule(
        &rule,
        &[
            "--json",
            "--duration",
            "1.5",
            "--stats",
            "0.1",
            "--metrics",
            &addr,
        ],
    );
    let err = timed_lines(c.stderr.take().unwrap());
    let (sent, scrapes) = std::thread::scope(|s| {
        let load = s.spawn(|| pipelined_gets(&l, 4, 4, 0.9));
        let scrapes: Vec<String> = (0..3)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(250));
                scrape(&l, &url)
            })
            .collect();
        (load.join().unwrap(), scrapes)
    });
    let o = wait_limited(c, Duration::from_secs(10));
    let err = err.join().unwrap();
    let r = succeeded(&o);
    let live: Vec<(&str, f64)> = err
        .iter()
        .filter_map(|(_, l)| {
            let loss = l.split(", loss ").nth(1)?.split(' ').next()?;
            Some((l.as_str(), loss.parse().unwrap()))
        })
        .collect();
    eprintln!(
        "{sent} pipelined requests, {} turns copied; {} live lines, {} losing",
        u(&r, "requests.copied"),
        live.len(),
        live.iter().filter(|(_, x)| *x != 0.0).count()
    );
    assert!(live.len() >= 10, "{err:#?}");
    let losing: Vec<&str> = live
        .iter()
        .filter(|(_, x)| *x != 0.0)
        .map(|(l, _)| *l)
        .collect();
    assert!(losing.is_empty(), "{losing:#?}");
    for m in &scrapes {
        assert_eq!(sample(m, "tcpkit_copy_request_loss_ratio"), 0.0, "{m}");
        assert_eq!(sample(m, "tcpkit_copy_requests_lost_total"), 0.0, "{m}");
    }
    assert!(sample(&scrapes[1], "tcpkit_copy_requests_copied_total") > 50.0);
    // And the target did answer everything.
    assert_all_answered(&r);
    assert_eq!(r["requests"]["loss_ratio_percent"].as_f64(), Some(0.0));
    assert_eq!(lines(&tg_log).len(), sent, "{r:#}");
}

/// Issue 24 item 4, the other half: a request counts as lost on the live line once it is past
/// its --timeout unanswered, while its copy is still open, and not before. A target that
/// reads and never answers; one client sends a GET and keeps its connection open.
#[test]
fn live_loss_counts_a_request_once_past_its_timeout_and_not_before() {
    use std::io::{Read, Write};
    let mut l = CopyLab::new("cpoverdue");
    let (_on, _) = l.nginx(true, Log::Peer);
    let _got = fault_server(&l.target, &format!("{TARGET}:9090"), Fault::Silent);
    let rule = format!("8080-{TARGET}:9090");
    let mut c = l.copy_rule(
        &rule,
        &[
            "--json",
            "--duration",
            "1.6",
            "--stats",
            "0.1",
            "--timeout",
            "0.5",
        ],
    );
    let err = timed_lines(c.stderr.take().unwrap());
    let mut s = l
        .clients
        .enter(|| std::net::TcpStream::connect(format!("{ONLINE}:8080")))
        .unwrap();
    s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let _ = s.read(&mut [0u8; 4096]).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    drop(s);
    let o = wait_limited(c, Duration::from_secs(10));
    let err = err.join().unwrap();
    let live: Vec<&str> = err
        .iter()
        .map(|(_, l)| l.as_str())
        .filter(|l| l.contains(" 1 open, ") && l.contains("requests 1 copied, 0 answered"))
        .collect();
    let not_yet = live.iter().position(|l| l.contains("loss 0.000 %"));
    let past = live.iter().position(|l| l.contains("loss 100.000 %"));
    assert!(
        matches!((not_yet, past), (Some(a), Some(b)) if a < b),
        "{live:#?}"
    );
    let r = json(&o);
    assert_eq!(o.status.code(), Some(1), "{r:#}");
    assert_eq!(u(&r, "sessions.failed.timeout"), 1, "{r:#}");
}
