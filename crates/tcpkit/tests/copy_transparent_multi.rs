//! Several `tcpkit copy --transparent` feeding one target and one intercept: the transparent
//! lab with a second online host ([`TLab::add_online`]), each online host with its own nginx
//! and its own clients, both copies sending to the same target nginx and both connected to
//! the same intercept, which sends every answer to both.

mod copy_common;

use std::time::{Duration, Instant};

use copy_common::tlab::*;
use copy_common::*;
use serde_json::Value;
use tcpkit_lab::{Host, Signal};

/// The transparent lab with intercept catching every answer from 8080, and a second online
/// host whose clients have address `client2`.
fn two_online(tag: &str, client2: &str) -> (TLab, Online) {
    let mut t = TLab::new(tag);
    t.filter = "src port 8080".into();
    let o = t.add_online(client2);
    (t, o)
}

fn rule() -> String {
    format!("8080-{TARGET}:8080")
}

/// The target's access-log lines (`addr port status request`) from `addr`.
fn from<'a>(log: &'a [String], addr: &str) -> Vec<&'a String> {
    log.iter()
        .filter(|l| l.split_whitespace().next() == Some(addr))
        .collect()
}

/// The failures of a copy report, all causes summed.
fn failed(r: &Value) -> u64 {
    let f = |k: &str| u(r, &format!("sessions.failed.{k}"));
    f("target_refused")
        + f("reset")
        + f("timeout")
        + f("closed_early")
        + f("lost_capture_data")
        + f("shed")
        + u(r, "transparent.control_lost")
}

#[test]
fn two_online_hosts_feed_one_target_and_one_intercept_each_copy_counting_its_own_sessions() {
    let start = Instant::now();
    let (mut t, o) = two_online("cptrmul", CLIENT2);
    let (_on1, on1_log) = t.l.nginx(true, Log::Peer);
    let (_on2, on2_log) = t.nginx_on(&o, Log::Peer);
    let (_tg, tg_log) = t.l.nginx(false, Log::Peer);
    let icp = t.intercept("intercept");
    let c1 = t.copy(&rule(), &["--timeout", "2", "--duration", "3"]);
    let c2 = t.copy_on(&o, &rule(), &["--timeout", "2", "--duration", "3"]);
    let (cli1, cli2) = (t.l.clients.clone(), o.clients.clone());
    // Keep-alive sessions and a new connection per request on both online hosts at once.
    // The connections each host's loads made: the sessions its copy sees.
    let conns = |h: &Host, server: &str, rate: &str, per_conn: Option<&str>| {
        let o = load_to(h, server, rate, "2", per_conn, &["--json"]);
        u(&json(&o), "connections.established")
    };
    let (sessions1, sessions2) = std::thread::scope(|s| {
        let loads = [
            s.spawn(|| conns(&cli1, ONLINE, "150", None)),
            s.spawn(|| conns(&cli1, ONLINE, "50", Some("1"))),
            s.spawn(|| conns(&cli2, ONLINE2, "150", None)),
            s.spawn(|| conns(&cli2, ONLINE2, "50", Some("1"))),
        ]
        .map(|l| l.join().unwrap());
        (loads[0] + loads[1], loads[2] + loads[3])
    });
    let r1 = copy_done(c1);
    let r2 = copy_done(c2);
    icp.signal(Signal::SIGINT).unwrap();
    icp.wait_timeout(Duration::from_secs(5)).unwrap();
    let ir = TLab::intercept_report(&icp);
    let (online1, online2, target) = (lines(&on1_log), lines(&on2_log), lines(&tg_log));
    eprintln!(
        "two online hosts: {} + {} requests online, {} at the target; answers {} caught, {} + {} received; {:.1} s",
        online1.len(),
        online2.len(),
        target.len(),
        u(&ir, "answers"),
        u(&r1, "transparent.answers_received"),
        u(&r2, "transparent.answers_received"),
        start.elapsed().as_secs_f64()
    );
    assert!(
        online1.len() >= 300 && online2.len() >= 300,
        "{r1:#} {r2:#}"
    );
    // Every request of both online hosts reached the one target, each from its own clients.
    assert_eq!(target.len(), online1.len() + online2.len(), "{r1:#} {r2:#}");
    assert_eq!(from(&target, CLIENT).len(), online1.len(), "{r1:#}");
    assert_eq!(from(&target, CLIENT2).len(), online2.len(), "{r2:#}");
    assert!(target.iter().all(|l| l.contains(" 200 ")), "{target:?}");
    // Each copy counted its own sessions, none of the other's: one per connection its own
    // clients made. Every copy of each completed, every request turn answered: the other
    // copy's answers, which intercept sent to it as well, disturbed none of them. (Request
    // turns, not requests: the load sends on schedule, so a late answer makes two requests
    // one turn.)
    for (r, online, sessions) in [(&r1, &online1, sessions1), (&r2, &online2, sessions2)] {
        assert_eq!(u(r, "sessions.seen"), sessions, "{r:#}");
        assert_eq!(
            u(r, "requests.answered"),
            u(r, "requests.at_source"),
            "{r:#}"
        );
        assert!(u(r, "requests.at_source") <= online.len() as u64, "{r:#}");
        assert_eq!(u(r, "sessions.completed"), u(r, "sessions.copies"), "{r:#}");
        assert_eq!(failed(r), 0, "{r:#}");
        // Both received the answers of both: well over their own half.
        assert!(
            u(r, "transparent.answers_received") * 4 > u(&ir, "answers") * 3,
            "{r:#} {ir:#}"
        );
    }
    // intercept served two copies, sending each answer to both.
    assert_eq!(u(&ir, "copies_connected"), 2, "{ir:#}");
    assert_eq!(u(&ir, "dropped_slow_copy"), 0, "{ir:#}");
    assert!(u(&ir, "sent") > u(&ir, "answers") * 3 / 2, "{ir:#}");
    assert_eq!(ir["failure"], Value::Null);
}
