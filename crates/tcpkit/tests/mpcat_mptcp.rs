//! `tcpkit mpcat --mptcp` in the lab's `multipath` topology (2 links, ECMP): the kernel's
//! MPTCP with a `subflow` endpoint on the sender forms a second subflow (seen in the kernel's
//! own MPJoin counters, beside the report's count) and the stream arrives identical; without
//! the endpoint one subflow forms and the sender says what the path manager needs; a receiver
//! without --mptcp makes the sender fall back to striping over TCP, said once.

use crate::common;
use common::mpcat::{random_file, shaped, verified_reports, Transfer};

use serde_json::Value;
use tcpkit_lab::{Host, Proc};

/// A counter of the host's MPTCP MIB (`nstat -az`: absolute, and the namespace is this
/// test's own, so every count is from this test).
fn nstat(h: &Host, name: &str) -> u64 {
    let out = h
        .run(&["nstat", "-az", name])
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(name)).then(|| f.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} in nstat"))
}

/// The multipath lab (2 links of 200 Mbit/s) with MPTCP on in both namespaces and the path
/// manager's limits set.
fn lab(tag: &str) -> Transfer {
    let t = Transfer::new(tag, 2, Some(shaped(200)));
    for h in [&t.a, &t.b] {
        h.sysctl("net.mptcp.enabled", "1")
            .unwrap_or_else(|e| panic!("{e}"));
        h.run(&[
            "ip",
            "mptcp",
            "limits",
            "set",
            "subflows",
            "4",
            "add_addr_accepted",
            "4",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    }
    t
}

/// Runs one session of `size` random bytes, the sender with --mptcp; returns the sender and
/// both reports once both exited 0, the output identical, both reports verified.
fn session(t: &mut Transfer, size: u64, rx_extra: &[&str]) -> (Proc, Value, Value) {
    random_file(&t.input, size);
    let rx = t.listen(&[&["--json"][..], rx_extra].concat());
    let tx = t.send(&["--mptcp", "--json"]);
    t.arrives(&tx, 30, &rx, 10);
    let (jt, jr) = verified_reports(&tx, &rx, size);
    (tx, jt, jr)
}

/// Issue 12, --mptcp: with a `subflow` endpoint on the sender's second link, the one MPTCP
/// connection has 2 subflows (the report's count, and the kernel's MPJoinSynAckRx counter
/// saw the join), the stream is identical and nothing is said about the path manager.
/// Without the endpoint, one subflow: the report says 1 and the sender says what is needed.
#[test]
fn mpcat_mptcp_uses_the_kernels_subflows() {
    let mut t = lab("mpmp1");
    let (a, b) = (t.a.clone(), t.b.clone());
    let second = t.links[1].a.name.clone();
    a.run(&[
        "ip",
        "mptcp",
        "endpoint",
        "add",
        "198.18.2.1",
        "dev",
        &second,
        "subflow",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(nstat(&a, "MPTcpExtMPJoinSynAckRx"), 0);
    let (tx, j, _) = session(&mut t, 64 << 20, &["--mptcp"]);
    assert_eq!(j["mptcp"]["fallback"], Value::Null, "{j}");
    assert_eq!(j["mptcp"]["subflows"], 2, "{j}");
    assert_eq!(j["streams"].as_array().unwrap().len(), 1, "{j}");
    assert!(
        nstat(&a, "MPTcpExtMPJoinSynAckRx") >= 1,
        "the kernel saw no join"
    );
    assert!(nstat(&b, "MPTcpExtMPCapableSYNRX") >= 1);
    assert!(!tx.log().contains("only 1 MPTCP subflow"), "{}", tx.log());

    a.run(&["ip", "mptcp", "endpoint", "flush"])
        .unwrap_or_else(|e| panic!("{e}"));
    let joins = nstat(&a, "MPTcpExtMPJoinSynAckRx");
    let (tx, j, _) = session(&mut t, 8 << 20, &["--mptcp"]);
    assert_eq!(j["mptcp"]["subflows"], 1, "{j}");
    assert_eq!(nstat(&a, "MPTcpExtMPJoinSynAckRx"), joins);
    let log = tx.log();
    assert_eq!(
        log.matches("tcpkit mpcat: only 1 MPTCP subflow formed: the path manager needs endpoints and limits")
            .count(),
        1,
        "{log}"
    );
    assert!(
        log.contains("ip mptcp endpoint add")
            && log.contains("ip mptcp limits set subflows N add_addr_accepted N"),
        "{log}"
    );
}

/// Issue 12, --mptcp's fallback: a receiver without --mptcp answers the MPTCP SYN as plain
/// TCP; the sender says so once, stripes over both links instead, and the stream arrives
/// identical with exit 0 on both sides.
#[test]
fn mpcat_mptcp_falls_back_to_striping_when_the_receiver_does_not_do_it() {
    let mut t = lab("mpmp2");
    let (tx, j, r) = session(&mut t, 32 << 20, &[]);
    let log = tx.log();
    assert_eq!(
        log.matches("tcpkit mpcat: --mptcp: the receiver does not do MPTCP")
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains("striping over TCP instead"), "{log}");
    assert_eq!(j["mptcp"]["subflows"], 0, "{j}");
    assert!(
        j["mptcp"]["fallback"]
            .as_str()
            .is_some_and(|f| f.contains("the receiver does not do MPTCP")),
        "{j}"
    );
    assert_eq!(j["streams"].as_array().unwrap().len(), 2, "{j}");
    for s in j["streams"].as_array().unwrap() {
        assert!(s["bytes"].as_u64().unwrap() > 0, "{j}");
    }
    assert_eq!(r["connections"]["bad_handshake"], 0, "{r}");
}
