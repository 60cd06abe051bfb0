//! `tcpkit copy` in relay mode, in the copy lab (clients → online → target) with real nginx and
//! redis-server on both servers and real clients (`tcpkit load`, redis-benchmark).

mod copy_common;

use std::time::Duration;

use copy_common::*;

fn copy_done(c: std::process::Child) -> serde_json::Value {
    let o = wait_limited(c, Duration::from_secs(15));
    assert!(
        o.status.success(),
        "copy failed: {} {}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    let r = json(&o);
    assert_accounted(&r);
    r
}

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
    let c = l.copy(&[
        "-x",
        &rule,
        "-i",
        &l.capture_if(),
        "--duration",
        "3.5",
        "--json",
    ]);
    // Keep-alive connections (two loads of 2: `tcpkit load -c 3` and more hangs while
    // opening against nginx in this lab), and a new connection per request.
    let ka = std::thread::scope(|s| {
        let a = s.spawn(|| {
            l.load(
                8080,
                &[
                    "--http-get",
                    "/hello.txt",
                    "-c",
                    "2",
                    "-r",
                    "400",
                    "-t",
                    "2",
                ],
            )
        });
        let _a2 = s.spawn(|| {
            l.load(
                8080,
                &[
                    "--http-get",
                    "/hello.txt",
                    "-c",
                    "2",
                    "-r",
                    "400",
                    "-t",
                    "2",
                ],
            )
        });
        let b = s.spawn(|| {
            l.load(
                8080,
                &[
                    "--http-get",
                    "/hello.txt",
                    "-c",
                    "2",
                    "-r",
                    "200",
                    "-t",
                    "2",
                    "--queries-per-conn",
                    "1",
                ],
            )
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    drop(ka);
    let r = copy_done(c);
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
    assert_eq!(
        u(&r, "requests.answered"),
        u(&r, "requests.copied"),
        "{r:#}"
    );
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
    let c = l.copy(&[
        "-x",
        &rule,
        "-i",
        &l.capture_if(),
        "--duration",
        "3",
        "--json",
    ]);
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
    let r = copy_done(c);
    let keys = |h: &tcpkit_lab::Host, ip: &str| {
        let o = h
            .run(&["redis-cli", "-h", ip, "--scan"])
            .expect("redis-cli");
        let mut k: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        k.sort();
        k
    };
    let on = keys(&l.online, ONLINE);
    let tg = keys(&l.target, TARGET);
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
    assert_eq!(
        u(&r, "requests.copied"),
        u(&r, "requests.answered"),
        "{r:#}"
    );
}
