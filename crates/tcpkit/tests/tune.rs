//! `tcpkit tune` as users run it: the real binary inside a lab host, whose `net.*` sysctls
//! are its own namespace's, so settings can be made wrong, checked, applied and read back
//! without touching the host's own. Host-wide settings (fs.*, rlimits) are only read.

use crate::common;

use std::process::Output;

use common::{run, schema, stderr, stdout, tcpkit};
use serde_json::Value;
use tcpkit_lab::{Host, Lab};

/// Settings that belong to a network namespace: the only ones a test lets `--apply` write.
/// A CHANGE to anything else would reach the whole machine, so the test stops first.
const NAMESPACED: &[&str] = &[
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_tw_reuse",
];

fn host(tag: &str) -> (Lab, Host) {
    let mut lab = Lab::new(tag).unwrap_or_else(|e| panic!("{e}"));
    let h = lab.host("h").unwrap_or_else(|e| panic!("{e}"));
    (lab, h)
}

/// `tcpkit tune ARGS` inside `h`.
fn tune(h: &Host, args: &[&str]) -> Output {
    let mut argv = vec![tcpkit(), "tune"];
    argv.extend_from_slice(args);
    h.command(&argv).output().expect("run tcpkit tune")
}

fn json(o: &Output) -> Value {
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(o), stderr(o)))
}

/// `tcpkit tune ARGS --apply` inside `h`, after a run without --apply has shown that
/// every CHANGE is one of [`NAMESPACED`] or can only be refused (the host-wide conntrack
/// table is read-only inside a namespace; that is checked before this is called).
fn apply(h: &Host, args: &[&str], refused: &[&str]) -> Output {
    let mut dry: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
    dry.push("--json");
    let before = json(&tune(h, &dry));
    for c in before["checks"].as_array().unwrap() {
        let s = c["setting"].as_str().unwrap();
        if c["status"] == "CHANGE" && c["appliable"] == true {
            assert!(
                NAMESPACED.contains(&s) || refused.contains(&s),
                "refusing to run --apply: it would change {s}, which is not this namespace's own"
            );
        }
    }
    let mut argv: Vec<&str> = args.to_vec();
    argv.push("--apply");
    tune(h, &argv)
}

fn sysctl_in(h: &Host, key: &str) -> String {
    let o = h
        .run(&["sysctl", "-n", key])
        .unwrap_or_else(|e| panic!("{e}"));
    stdout(&o).split_whitespace().collect::<Vec<_>>().join(" ")
}

fn root_sysctl(key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/{}", key.replace('.', "/")))
        .unwrap()
        .trim()
        .to_string()
}

fn line_of<'a>(text: &'a str, setting: &str) -> &'a str {
    text.lines()
        .find(|l| {
            l.get(7..)
                .is_some_and(|r| r.starts_with(&format!("{setting} = ")))
        })
        .unwrap_or_else(|| panic!("no line for {setting} in:\n{text}"))
}

#[test]
fn server_somaxconn_is_changed_applied_and_then_ok() {
    let root_before = root_sysctl("net.core.somaxconn");
    let (_lab, h) = host("tunesrv");
    h.sysctl("net.core.somaxconn", "64").unwrap();
    let args = ["--role", "server", "--connections", "1000"];

    let o = tune(&h, &args);
    let out = stdout(&o);
    assert_eq!(
        line_of(&out, "net.core.somaxconn"),
        "CHANGE net.core.somaxconn = 64, want >= 1000: a listener's accept queue is cut to this (tcpkit echo asks 65535): connects beyond it are dropped and retried a second later; run: sysctl -w net.core.somaxconn=1000 (lost at reboot; to keep it: echo 'net.core.somaxconn = 1000' >> /etc/sysctl.d/90-tcpkit.conf)"
    );
    assert_eq!(o.status.code(), Some(1), "{out}");
    // The reason is said once, as the one-line error on stderr (issue 10, case 10: it was
    // printed on stdout too).
    let err = stderr(&o);
    assert!(
        err.starts_with(
            "tcpkit tune: not ready for 1000 server connections: 1 setting needs a change (net.core.somaxconn)"
        ) && err.lines().count() == 1,
        "{err}"
    );
    assert!(!out.contains("not ready"), "{out}");

    let o = apply(&h, &args, &[]);
    let out = stdout(&o);
    assert!(
        out.contains(
            "\napplied: net.core.somaxconn 64 -> 1000 (sysctl -w net.core.somaxconn=1000)\n"
        ),
        "{out}"
    );
    assert!(!out.contains("not applied"), "{out}");
    assert_eq!(sysctl_in(&h, "net.core.somaxconn"), "1000");
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.lines()
            .last()
            .unwrap()
            .starts_with("ready for 1000 server connections"),
        "{out}"
    );

    let o = tune(&h, &args);
    let out = stdout(&o);
    assert!(
        line_of(&out, "net.core.somaxconn")
            .starts_with("OK     net.core.somaxconn = 1000, want >= 1000: "),
        "{out}"
    );
    assert_eq!(o.status.code(), Some(0), "{out}");
    // The host's own value never moved.
    assert_eq!(root_sysctl("net.core.somaxconn"), root_before);
}

#[test]
fn client_sources_needed_follow_the_namespace_port_range() {
    let (_lab, h) = host("tunecli");
    h.sysctl("net.ipv4.ip_local_port_range", "40000 40999")
        .unwrap();
    // 1000 ports per source address: 4500 connections need 5.
    let o = tune(&h, &["--role", "client", "--connections", "4500", "--json"]);
    let j = json(&o);
    assert_eq!(j["sources_needed"], 5);
    assert_eq!(j["role"], "client");
    let range = j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["setting"] == "net.ipv4.ip_local_port_range")
        .unwrap();
    assert_eq!(range["status"], "CHANGE");
    assert_eq!(range["current"], "40000 40999");
    assert_eq!(
        range["command"],
        "sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\""
    );
    assert_eq!(o.status.code(), Some(1));

    let o = tune(&h, &["--role", "client", "--connections", "4500"]);
    assert!(line_of(&stdout(&o), "net.ipv4.ip_local_port_range").contains(
        "1000 local ports per source address and server address:port: 4500 connections need 5 source addresses (tcpkit load --source); 1024-65535 needs 1 "
    ));

    // Applied in the namespace, the range holds them all from one address.
    let o = apply(&h, &["--role", "client", "--connections", "4500"], &[]);
    assert!(
        stdout(&o).contains("applied: net.ipv4.ip_local_port_range 40000 40999 -> 1024 65535"),
        "{}",
        stdout(&o)
    );
    assert_eq!(sysctl_in(&h, "net.ipv4.ip_local_port_range"), "1024 65535");
    let j = json(&tune(
        &h,
        &["--role", "client", "--connections", "4500", "--json"],
    ));
    assert_eq!(j["sources_needed"], 1);
}

#[test]
fn host_wide_settings_are_not_applied_from_a_namespace() {
    let (_lab, h) = host("tunect");
    let ct = "/proc/sys/net/netfilter/nf_conntrack_max";
    let mode = h
        .run(&["stat", "-c", "%a", ct])
        .map(|o| stdout(&o).trim().to_string())
        .unwrap_or_else(|e| {
            panic!("this test needs nf_conntrack loaded (its table is host-wide): {e}")
        });
    assert_eq!(
        mode, "444",
        "this test needs a kernel where nf_conntrack_max is read-only inside a namespace"
    );
    let max: u64 = sysctl_in(&h, "net.netfilter.nf_conntrack_max")
        .parse()
        .unwrap();
    let n = (max + 1).to_string();
    let before = root_sysctl("net.netfilter.nf_conntrack_max");
    let o = apply(
        &h,
        &["--role", "server", "--connections", &n],
        &["net.netfilter.nf_conntrack_max"],
    );
    let out = stdout(&o);
    assert!(
        out.contains("\nnot applied: net.netfilter.nf_conntrack_max: read-only in this network namespace (a host-wide setting): set it on the host\n"),
        "{out}"
    );
    assert!(
        stderr(&o).lines().last().unwrap().contains(
            "after --apply 1 setting still needs a change (net.netfilter.nf_conntrack_max)"
        ),
        "{}",
        stderr(&o)
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(root_sysctl("net.netfilter.nf_conntrack_max"), before);
    // tcp_mem is not shown inside a namespace at all: a CHECK with the command to read it.
    assert!(
        line_of(&out, "net.ipv4.tcp_mem").starts_with("CHECK  net.ipv4.tcp_mem = not shown here, ")
    );
}

#[test]
fn json_matches_the_committed_schema() {
    let schema = schema::load("tune");
    // The checker must be able to fail: a document missing a field is refused, and so is
    // a check (reached through $ref) with a status the schema does not know.
    let refused = std::panic::catch_unwind(|| schema::check(&schema, &serde_json::json!({}), "$"));
    assert!(refused.is_err());
    let bad_check = serde_json::json!([{"setting": "x", "status": "MAYBE", "current": null,
        "wanted": "1", "why": "w", "command": null, "appliable": false}]);
    let refused = std::panic::catch_unwind(|| {
        schema::check_part(
            &schema,
            &schema["properties"]["checks"],
            &bad_check,
            "$.checks",
        );
    });
    assert!(refused.is_err());

    let (_lab, h) = host("tunejson");
    h.sysctl("net.core.somaxconn", "64").unwrap();
    let mut seen_after = false;
    for args in [
        vec!["--role", "server", "--json"],
        vec!["--role", "client", "--connections", "100000", "--json"],
        vec!["--role", "server", "--connections", "1000", "--json"],
    ] {
        let j = json(&tune(&h, &args));
        schema::check(&schema, &j, "$");
        assert_eq!(j["after_apply"], Value::Null);
    }
    let o = apply(
        &h,
        &["--role", "server", "--connections", "1000", "--json"],
        &[],
    );
    let j = json(&o);
    schema::check(&schema, &j, "$");
    for c in j["after_apply"].as_array().unwrap() {
        seen_after = true;
        if c["setting"] == "net.core.somaxconn" {
            assert_eq!(c["status"], "OK");
        }
    }
    assert!(seen_after);
    assert_eq!(j["applied"][0]["setting"], "net.core.somaxconn");
    assert_eq!(j["changes_needed"], 0);
    assert_eq!(o.status.code(), Some(0));
    // One document, nothing else on stdout.
    assert_eq!(stdout(&o).lines().count(), 1);
}

#[test]
fn bad_flags_are_one_line_and_exit_2() {
    for (args, says) in [
        (vec!["tune"], "--role"),
        (vec!["tune", "--role", "both"], "'both'"),
        (
            vec!["tune", "--role", "server", "--connections", "0"],
            "--connections 0",
        ),
        (
            vec!["tune", "--role", "server", "--connections", "x"],
            "--connections",
        ),
        (vec!["tune", "--role", "client", "--port", "0"], "--port 0"),
        (vec!["tune", "--role", "client", "--bogus"], "--bogus"),
    ] {
        let o = run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(stdout(&o).is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("tcpkit tune: "), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Issue 24, item 18: with --json, stdout is one document and nothing is "above": the commands
/// to run are in the document (`commands`), and the line on stderr says where to find them.
/// Without --json the summary still lists them above that line.
#[test]
fn with_json_the_commands_are_in_the_document_and_nothing_says_above() {
    let (_lab, h) = host("tuneabove");
    h.sysctl("net.core.somaxconn", "64").unwrap();
    let o = tune(&h, &["--role", "server", "--connections", "1000", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(
        j["commands"],
        serde_json::json!(["sysctl -w net.core.somaxconn=1000"]),
        "{j}"
    );
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("above"), "{err}");
    assert!(
        err.contains(
            "1 setting needs a change (net.core.somaxconn): run the report's `commands` or tcpkit tune --apply"
        ),
        "{err}"
    );
    let verdict = j["verdict"].as_str().unwrap();
    assert!(!verdict.contains("above"), "{verdict}");

    let o = tune(&h, &["--role", "server", "--connections", "1000"]);
    assert!(
        stderr(&o).contains("(net.core.somaxconn): run the commands above or tcpkit tune --apply"),
        "{}",
        stderr(&o)
    );
}
