//! Server-first protocols (an SMTP banner, a MySQL greeting): the copy sends the client's
//! first bytes only after the target's own greeting, in relay and transparent mode. The
//! target's greeting server is slow on purpose (300 ms), and checks just before greeting
//! whether any client bytes are already waiting: a copy that did not wait would have sent
//! them at once.

use crate::copy_common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use copy_common::modes::{Mode, ModeLab};
use copy_common::*;
use serde_json::Value;

const LINES: [&str; 3] = ["HELO copy", "MAIL FROM:<a@b>", "QUIT"];

/// Three sessions of the greeting protocol from the clients to the online server, one after
/// another, each with its three lines.
fn sessions(l: &CopyLab) {
    for _ in 0..3 {
        greeting_client(&l.clients, &format!("{ONLINE}:2525"), &LINES);
    }
}

fn check(r: &Value, target: &Greeted) {
    assert_eq!(u(r, "sessions.seen"), 3, "{r:#}");
    assert_eq!(u(r, "sessions.completed"), 3, "{r:#}");
    assert_eq!(u(r, "requests.copied"), 9, "{r:#}");
    assert_eq!(u(r, "requests.answered"), 9, "{r:#}");
    assert_eq!(target.conns.load(Ordering::Relaxed), 3, "{r:#}");
    assert_eq!(target.lines.load(Ordering::Relaxed), 9, "{r:#}");
    assert_eq!(
        target.early.load(Ordering::Relaxed),
        0,
        "copies spoke before the target's greeting: {r:#}"
    );
}

/// The slow greeting server on the target, the copy, three sessions, and the checks.
fn waits_for_the_targets_own_greeting(mode: Mode, tag: &str) {
    let m = ModeLab::new(tag, mode, 2525);
    let _on = greeting_server(&m.l().online, &format!("{ONLINE}:2525"), Duration::ZERO);
    let tg = greeting_server(
        &m.l().target,
        &format!("{TARGET}:2525"),
        Duration::from_millis(300),
    );
    let rule = format!("2525-{TARGET}:2525");
    let c = m.copy(&rule, &["--timeout", "2", "--duration", "1.5"]);
    sessions(m.l());
    let r = m.done(c);
    check(&r, &tg);
}

#[test]
fn relay_waits_for_the_targets_own_greeting_before_the_clients_first_bytes() {
    waits_for_the_targets_own_greeting(Mode::Relay, "cpgreet");
}

#[test]
fn transparent_waits_for_the_targets_own_greeting_before_the_clients_first_bytes() {
    waits_for_the_targets_own_greeting(Mode::Transparent, "cptgreet");
}
