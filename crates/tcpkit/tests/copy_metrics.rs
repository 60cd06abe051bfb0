//! `tcpkit copy --metrics ADDR` in the copy lab: curl on the clients' host scrapes the
//! Prometheus text while the copy runs, and the counters move with the traffic.

use crate::copy_common;

use std::net::TcpListener;
use std::time::Duration;

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
