//! `tcpkit copy` in relay mode, in the copy lab (clients → online → target) with real nginx and
//! redis-server on both servers and real clients (`tcpkit load`, redis-benchmark).

mod copy_common;

use std::time::Duration;

use copy_common::*;

fn count_200(log: &[String]) -> usize {
    log.iter().filter(|l| l.contains(" 200 ")).count()
}

#[test]
fn http_keepalive_and_new_connections_copied_with_loss_under_a_thousandth_and_nothing_toward_clients(
) {
    let mut l = CopyLab::new("cphttp");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    // Everything the clients' link carries, to prove nothing from the target reaches it.
    let ifname = l.cli_link.a.name.clone();
    let clients = l.clients.clone();
    let dump = l.lab.tcpdump(&clients, &ifname, "").expect("tcpdump");
    let rule = format!("8080-{TARGET}:8080");
    let c = l.copy_rule(&rule, &["--duration", "3.5", "--json"]);
    // Keep-alive connections (two loads of 2: `tcpkit load -c 3` and more hangs while
    // opening against nginx in this lab), and a new connection per request.
    let ka = std::thread::scope(|s| {
        let a = s.spawn(|| l.http_get("2", "400", "2", None));
        let _a2 = s.spawn(|| l.http_get("2", "400", "2", None));
        let b = s.spawn(|| l.http_get("2", "200", "2", Some("1")));
        (a.join().unwrap(), b.join().unwrap())
    });
    drop(ka);
    // The copy's CPU while it copied (user + system ticks of its process so far).
    let ticks = std::fs::read_to_string(format!("/proc/{}/stat", c.id()))
        .ok()
        .and_then(|st| {
            let f: Vec<u64> = st
                .rsplit(')')
                .next()?
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|x| x.parse().ok())
                .collect();
            Some(f.iter().sum::<u64>())
        });
    let r = copy_report(c);
    let cap = dump.stop().expect("tcpdump");
    let online = lines(&on_log);
    let target = lines(&tg_log);
    assert!(online.len() > 1500, "{} requests online", online.len());
    assert_eq!(count_200(&online), online.len());
    assert_eq!(
        count_200(&target),
        target.len(),
        "every copied request is whole: {target:?}"
    );
    // tcpcopy's request loss ratio, from the servers' own logs.
    let loss = (online.len() as f64 - target.len() as f64) / online.len() as f64;
    assert!(
        loss <= 0.001,
        "loss {loss}: online {} target {} {r:#}",
        online.len(),
        target.len()
    );
    assert!(target.len() <= online.len());
    if let Some(t) = ticks {
        eprintln!(
            "copy: {} requests online, {} at the target (loss {:.4} %), copy CPU {:.1} % of a core over the ~2.1 s of load",
            online.len(),
            target.len(),
            loss * 100.0,
            t as f64 / 100.0 / 2.1 * 100.0
        );
    }
    // The target saw only the copy host.
    assert!(
        target.iter().all(|l| l.starts_with(ONLINE_T)),
        "{:?}",
        &target[..3]
    );
    // The report agrees with the logs. A request is the client's bytes between two server
    // turns (tcpcopy's definition): an HTTP request sent before the previous answer came
    // joins it, so there can be fewer than HTTP requests.
    assert!(u(&r, "requests.copied") <= target.len() as u64, "{r:#}");
    assert!(
        u(&r, "requests.copied") * 100 >= target.len() as u64 * 95,
        "{r:#}"
    );
    assert_all_answered(&r);
    assert!(r["requests"]["loss_ratio_percent"].as_f64().unwrap() <= 0.1);
    assert_eq!(
        u(&r, "sessions.completed"),
        u(&r, "sessions.copies"),
        "{r:#}"
    );
    assert!(u(&r, "sessions.copies") >= 4 + 300, "{r:#}");
    assert_eq!(u(&r, "capture.kernel_drops"), 0);
    assert_eq!(
        u(&r, "latency.original.count"),
        u(&r, "requests.copied"),
        "{r:#}"
    );
    assert_eq!(
        u(&r, "latency.target.count"),
        u(&r, "requests.copied"),
        "{r:#}"
    );
    // Loopback-fast servers on both sides: the original latency is a real figure (frames
    // keep their capture times), within an order of magnitude of the target's.
    let (o50, t50) = (
        u(&r, "latency.original.p50_ns"),
        u(&r, "latency.target.p50_ns"),
    );
    assert!(
        o50 > 1_000 && o50 < 10 * t50.max(1) && t50 < 50 * o50,
        "{r:#}"
    );
    // Nothing from the target (or toward it) on the clients' link, ever.
    let frames = tcpkit_pcap::CaptureFile::open(&cap.path).unwrap();
    let target_ip: std::net::IpAddr = TARGET.parse().unwrap();
    let mut n = 0;
    for p in frames.packets() {
        let p = p.unwrap();
        n += 1;
        if let Ok(s) = tcpkit_wire::tcp::Segment::parse(p.data) {
            assert_ne!(
                s.src.ip(),
                target_ip,
                "a packet from the target reached the clients"
            );
            assert_ne!(s.dst.ip(), target_ip);
            assert!(s.src.port() != 8080 || s.src.ip().to_string() == ONLINE);
        }
    }
    assert!(n > 1000, "the clients' link capture holds {n} frames");
}

#[test]
fn redis_set_workload_leaves_the_same_keys_on_the_target() {
    let mut l = CopyLab::new("cpredis");
    let _on = l.redis(true);
    let _tg = l.redis(false);
    let rule = format!("6379-{TARGET}:6379");
    let c = l.copy_rule(&rule, &["--duration", "3", "--json"]);
    let o = l.client(&[
        "redis-benchmark",
        "-h",
        ONLINE,
        "-p",
        "6379",
        "-t",
        "set",
        "-r",
        "1000",
        "-n",
        "3000",
        "-c",
        "5",
        "-q",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = copy_report(c);
    let on = redis_keys(&l.online, ONLINE);
    let tg = redis_keys(&l.target, TARGET);
    assert!(on.len() > 900, "{} keys online", on.len());
    let missing: Vec<&String> = on.iter().filter(|k| tg.binary_search(k).is_err()).collect();
    assert!(
        missing.is_empty() && on.len() == tg.len(),
        "{} keys online, {} on the target, missing {:?}: {r:#}",
        on.len(),
        tg.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(u(&r, "requests.copied") >= 3000, "{r:#}");
    assert_all_answered(&r);
}

#[test]
fn sessions_open_before_the_copy_are_joined_at_a_request_boundary_and_only_full_skips_them() {
    let mut l = CopyLab::new("cpjoin");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    let rule = format!("8080-{TARGET}:8080");
    std::thread::scope(|s| {
        // Keep-alive connections opened before the copy starts, running 3 s.
        let load = s.spawn(|| l.http_get("2", "300", "3", None));
        std::thread::sleep(Duration::from_millis(700));
        let c = l.copy_rule(&rule, &["--duration", "1", "--json"]);
        let r = copy_report(c);
        let target = lines(&tg_log);
        // Joined: both connections, from their next request on, every copied request whole.
        assert_eq!(u(&r, "sessions.joined_mid_stream"), 2, "{r:#}");
        assert_eq!(u(&r, "sessions.completed"), 2, "{r:#}");
        assert!(
            target.len() > 200,
            "{} requests at the target: {r:#}",
            target.len()
        );
        assert_eq!(count_200(&target), target.len(), "{target:?}");
        assert_all_answered(&r);
        // --only-full: the same open connections are left alone.
        let c = l.copy_rule(&rule, &["--duration", "0.5", "--only-full", "--json"]);
        let r = copy_report(c);
        assert_eq!(u(&r, "sessions.seen"), 0, "{r:#}");
        assert_eq!(lines(&tg_log).len(), target.len());
        load.join().unwrap();
    });
    assert!(lines(&on_log).len() > lines(&tg_log).len());
}

#[test]
fn sampling_keeps_whole_sessions_and_proxy_protocol_carries_the_client() {
    let mut l = CopyLab::new("cpsample");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let (_tg, tg_log) = l.nginx(false, Log::ProxyProtocol);
    let rule = format!("8080-{TARGET}:8080");
    let c = l.copy_rule(
        &rule,
        &["-r", "50", "--proxy-protocol", "--duration", "3", "--json"],
    );
    // 40 connections of several requests each (2 loads of 2, reconnecting every 5 requests).
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| l.http_get("2", "100", "2", Some("5")));
        }
    });
    let r = copy_report(c);
    check_schema(&r);
    // Per client port: requests online, requests at the target (the PROXY header's source).
    let per_port = |log: &[String]| {
        let mut m = std::collections::BTreeMap::<u16, usize>::new();
        for l in log {
            let mut f = l.split(' ');
            let ip = f.next().unwrap();
            assert_eq!(ip, CLIENT, "{l}");
            *m.entry(f.next().unwrap().parse().unwrap()).or_default() += 1;
        }
        m
    };
    let on = per_port(&lines(&on_log));
    let tg = per_port(&lines(&tg_log));
    let server: std::net::SocketAddr = format!("{ONLINE}:8080").parse().unwrap();
    let sampler = tcpkit_copy::sample::Sampler {
        percent: 50.0,
        ramp_ns: 0,
    };
    let mut copied = 0;
    for (port, n) in &on {
        let client = std::net::SocketAddr::new(CLIENT.parse().unwrap(), *port);
        let want = sampler.selects(client, server, 0);
        // Wholly in (every request, under the client's own address) or wholly out.
        assert_eq!(
            tg.get(port).copied().unwrap_or(0),
            if want { *n } else { 0 },
            "port {port}"
        );
        copied += usize::from(want);
    }
    assert!(on.len() >= 30, "{} client connections", on.len());
    assert!(
        copied * 5 >= on.len() && copied * 5 <= on.len() * 4,
        "{copied} of {} copied",
        on.len()
    );
    // The report counts sessions, the logs connections that made a request (load may open
    // one at the end that never sends; a client port can also be reused).
    let (sel, out) = (u(&r, "sessions.selected"), u(&r, "sessions.sampled_out"));
    assert!(sel >= copied as u64 && sel <= copied as u64 + 2, "{r:#}");
    assert!(
        out >= (on.len() - copied) as u64 && out <= (on.len() - copied) as u64 + 2,
        "{r:#}"
    );
}

#[test]
fn n_3_sends_every_request_three_times_over_independent_connections() {
    let mut l = CopyLab::new("cpn3");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    let rule = format!("8080-{TARGET}:8080");
    let c = l.copy_rule(
        &rule,
        &["-n", "3", "--duration", "3", "--stats", "0.5", "--json"],
    );
    l.http_get("2", "300", "2", Some("20"));
    let o = wait_limited(c, Duration::from_secs(15));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // --stats lines go to stderr, elapsed time first; stdout is the JSON document alone.
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let stats: Vec<&str> = err.lines().filter(|l| l.starts_with('[')).collect();
    assert!(
        stats.len() >= 3
            && stats
                .iter()
                .all(|s| s.contains("s] sessions") && s.contains("requests") && s.contains("loss")),
        "{stats:?}"
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_accounted(&r);
    let (on, tg) = (lines(&on_log), lines(&tg_log));
    assert!(on.len() > 300);
    assert_eq!(tg.len(), 3 * on.len(), "{r:#}");
    assert_eq!(u(&r, "sessions.copies"), 3 * u(&r, "sessions.selected"));
    assert_eq!(
        u(&r, "sessions.completed"),
        u(&r, "sessions.copies"),
        "{r:#}"
    );
    // Three distinct connections per session: no source port used twice at once.
    let mut ports: Vec<&str> = tg.iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
    ports.dedup();
    assert!(
        ports.len() >= 3 * on.len() / 20,
        "{} connections",
        ports.len()
    );
}

#[test]
fn two_rules_in_one_copy_send_http_and_redis_each_to_its_own_target_server() {
    let mut l = CopyLab::new("cp2rules");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    let _ron = l.redis(true);
    let _rtg = l.redis(false);
    let rules = format!("8080-{TARGET}:8080,6379-{TARGET}:6379");
    let c = l.copy_rule(&rules, &["--duration", "3.5", "--json"]);
    // Both kinds of traffic at once: HTTP over 2 keep-alive connections and a new connection
    // per request, and a redis SET workload over 5.
    let redis = std::thread::scope(|s| {
        let ka = s.spawn(|| l.http_get("2", "200", "2", None));
        let new = s.spawn(|| l.http_get("1", "50", "2", Some("1")));
        let redis = s.spawn(|| {
            l.client(&[
                "redis-benchmark",
                "-h",
                ONLINE,
                "-p",
                "6379",
                "-t",
                "set",
                "-r",
                "1000",
                "-n",
                "3000",
                "-c",
                "5",
                "-q",
            ])
        });
        ka.join().unwrap();
        new.join().unwrap();
        redis.join().unwrap()
    });
    assert!(
        redis.status.success(),
        "{}",
        String::from_utf8_lossy(&redis.stderr)
    );
    let r = copy_report(c);
    check_schema(&r);
    assert_eq!(
        r["rules"],
        serde_json::json!([format!("8080-{TARGET}:8080"), format!("6379-{TARGET}:6379")]),
        "{r:#}"
    );
    // HTTP reached the target's nginx, all of it and nothing else (redis bytes sent to nginx
    // would be logged as 400s).
    let online = lines(&on_log);
    let target = lines(&tg_log);
    assert!(online.len() > 400, "{} requests online", online.len());
    assert_eq!(
        target.len(),
        online.len(),
        "target's nginx log vs the online's: {r:#}"
    );
    assert_eq!(count_200(&target), target.len(), "{target:?}");
    // The SETs reached the target's redis, all of them.
    let on = redis_keys(&l.online, ONLINE);
    let tg = redis_keys(&l.target, TARGET);
    assert!(on.len() > 900, "{} keys online", on.len());
    assert_eq!(on, tg, "redis keys online vs on the target: {r:#}");
    // The report counts both rules' sessions and requests: the HTTP connections (2
    // keep-alive, ~100 of one request each) and the benchmark's 5, all completed; the 3,000
    // SETs and the HTTP requests, all answered.
    assert!(u(&r, "sessions.copies") >= 2 + 50 + 5, "{r:#}");
    assert_eq!(
        u(&r, "sessions.completed"),
        u(&r, "sessions.copies"),
        "{r:#}"
    );
    assert!(
        u(&r, "requests.copied") * 100 >= (3000 + online.len() as u64) * 95,
        "3000 SETs + {} GETs: {r:#}",
        online.len()
    );
    assert_all_answered(&r);
}

/// tcpcopy's `-F` (issue 10): a tcpdump expression the live capture must also match. Two
/// clients ask the online nginx; `-F 'host 198.18.1.3'` copies the second one's session and
/// nothing of the first's.
#[test]
fn a_capture_filter_copies_what_it_matches_and_nothing_else() {
    let mut l = CopyLab::new("cpfilt");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    let cif = l.cli_link.a.name.clone();
    l.clients
        .run(&["ip", "addr", "add", "198.18.1.3/24", "dev", &cif])
        .expect("a second client address");
    let rule = format!("8080-{TARGET}:8080");
    let c = l.copy_rule(
        &rule,
        &["-F", "host 198.18.1.3", "--duration", "2", "--json"],
    );
    // Each curl: one keep-alive session of 10 GETs, from its own address.
    for (from, tag) in [(CLIENT, "one"), ("198.18.1.3", "three"), (CLIENT, "one")] {
        let url = format!("http://{ONLINE}:8080/hello.txt?{tag}=[1-10]");
        let o = l.client(&["curl", "-sS", "--interface", from, &url]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let r = copy_report(c);
    assert_all_completed(&r);
    check_schema(&r);
    assert_eq!(lines(&on_log).len(), 30);
    let copied = lines(&tg_log);
    assert_eq!(copied.len(), 10, "{copied:#?}");
    assert!(copied.iter().all(|l| l.contains("?three=")), "{copied:#?}");
    assert_eq!(u(&r, "sessions.seen"), 1, "{r:#}");
    assert_eq!(u(&r, "requests.answered"), 10, "{r:#}");
    let filter = r["filter"].as_str().unwrap();
    assert!(filter.ends_with(" and (host 198.18.1.3)"), "{filter}");
}
