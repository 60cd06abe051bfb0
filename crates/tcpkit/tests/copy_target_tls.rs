//! `copy --target-tls` (issue 27, "to the target"): clear production traffic, made as the
//! relay tests make it (tcpkit load against the online nginx, or a capture of known HTTP
//! sessions), copied in relay mode to a target that speaks TLS: nginx over HTTPS with a
//! certificate of the lab's own CA, and `tcpkit echo --http --tls`. The target's own count
//! of requests equals production's; --diff compares the plaintext answers read over TLS; a
//! certificate of another CA is named in one line; --insecure copies anyway and says so.
//! And TLS end to end: production over TLS decrypted with the clients' key log
//! (`--tls-keylog`) and re-encrypted toward the target.

use crate::common::peer::stop_echo;
use crate::copy_common::*;

use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tcpkit_lab::{Nginx, NginxConf, TestCa};

/// The target's TLS port.
const TLS_PORT: u16 = 8443;

/// Production's port 8080 copied to the target's TLS port.
fn tls_rule() -> String {
    format!("8080-{TARGET}:{TLS_PORT}")
}

/// A CA of the lab's (`name`: its directory and CN).
fn ca(l: &CopyLab, name: &str) -> TestCa {
    TestCa::new(&l.dir.path().join(name), name).unwrap_or_else(|e| panic!("{e}"))
}

/// nginx over TLS (HTTP/1.1 only) on the target's TLS port, its certificate from `ca` for
/// the target's address, serving `files` besides /index.html; an access log line per request.
fn tls_nginx(l: &mut CopyLab, ca: &TestCa, files: &[(&str, &str)]) -> Nginx {
    let host = l.target.clone();
    nginx_on(l, &host, TARGET, ca, files)
}

/// [`tls_nginx`] in `host` on `ip`.
fn nginx_on(
    l: &mut CopyLab,
    host: &tcpkit_lab::Host,
    ip: &str,
    ca: &TestCa,
    files: &[(&str, &str)],
) -> Nginx {
    let cert = ca
        .server(&format!("n{}", ip.replace('.', "-")), &[ip])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut conf = NginxConf::https(format!("{ip}:{TLS_PORT}").parse().unwrap(), cert);
    conf.http2 = false;
    conf.files = files
        .iter()
        .map(|(n, b)| ((*n).to_string(), b.as_bytes().to_vec()))
        .collect();
    l.lab.nginx(host, &conf).unwrap_or_else(|e| panic!("{e}"))
}

/// The requests the TLS nginx logged: all of them HTTP/1.1 over TLS 1.3 with status 200
/// (any ALPN), or the test fails.
fn tls_requests(n: &Nginx) -> u64 {
    let log = n.requests().unwrap();
    let all: u64 = log.values().sum();
    let ok: u64 = log
        .iter()
        .filter(|(l, _)| l.starts_with("HTTP/1.1 TLSv1.3 ") && l.ends_with(" 200"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(ok, all, "{log:?}");
    all
}

/// The report's `tls` object: from clear TCP, `handshakes` done with the target and none
/// failed.
fn assert_handshakes(r: &Value, handshakes: u64) {
    let t = &r["tls"];
    assert_eq!(t["source"], "clear", "{t:#}");
    assert_eq!(u(t, "target.handshakes"), handshakes, "{t:#}");
    assert_eq!(u(t, "target.failed"), 0, "{t:#}");
}

/// A live copy to the target's TLS port trusting `ca`, for `secs`, while the clients send
/// HTTP to the online nginx for `load_secs` (100/s over 2 keep-alive connections, and 20/s
/// with a connection per request): its report, which says it succeeded.
fn copy_live(l: &CopyLab, ca: &Path, secs: &str, load_secs: &str) -> Value {
    let ca = ca.to_str().unwrap();
    let args = ["--target-tls", "--tls-ca", ca, "--duration", secs, "--json"];
    let c = l.copy_rule(&tls_rule(), &args);
    std::thread::scope(|s| {
        s.spawn(|| l.http_get("2", "100", load_secs, None));
        s.spawn(|| l.http_get("1", "20", load_secs, Some("1")));
    });
    copy_report(c)
}

/// Live HTTP (keep-alive, and a connection per request) to the clear online nginx, copied to
/// nginx over TLS: the target logged every request production did, each over TLS; one
/// handshake per copy.
#[test]
fn clear_http_is_copied_to_nginx_over_tls() {
    let mut l = CopyLab::new("cptlsng");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let ca = ca(&l, "ca");
    let ng = tls_nginx(&mut l, &ca, &[("hello.txt", "hello from the lab\n")]);
    let r = copy_live(&l, &ca.cert(), "2", "1");
    let online = lines(&on_log).len() as u64;
    // Traffic came (a busy host sends fewer than asked; the counts below must still agree).
    assert!(online >= 50, "{online} requests online");
    assert_eq!(tls_requests(&ng), online, "{r:#}");
    // Request turns: an open-loop client's request sent before the last answer came rides
    // in its turn, so there may be fewer turns than requests.
    assert!(u(&r, "requests.at_source") * 100 >= online * 95, "{r:#}");
    assert_all_completed(&r);
    assert_handshakes(&r, u(&r, "sessions.copies"));
}

/// The same to `tcpkit echo --http --tls` (its self-signed certificate trusted by --tls-ca):
/// echo answered as many requests as production's nginx logged, over as many handshakes as
/// copies.
#[test]
fn clear_http_is_copied_to_echo_over_tls() {
    let mut l = CopyLab::new("cptlsec");
    let (_on, on_log) = l.nginx(true, Log::Peer);
    let cert = l.dir.path().join("echo.pem");
    let port = TLS_PORT.to_string();
    let listen = format!("{TARGET}:{TLS_PORT}");
    let target = l.target.clone();
    let echo = target
        .spawn(
            &mut l.lab,
            "echo",
            &[
                tcpkit(),
                "echo",
                "--http",
                "--listen",
                &listen,
                "--port",
                &port,
                "--threads",
                "1",
                "--json",
                "--tls",
                "--tls-self-signed",
                "--tls-name",
                TARGET,
                "--tls-cert-out",
                cert.to_str().unwrap(),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    wait_port(&l.target, TARGET, TLS_PORT, &echo);
    let r = copy_live(&l, &cert, "1.5", "0.7");
    let e = stop_echo(&echo);
    let online = lines(&on_log).len() as u64;
    // Traffic came (a busy host sends fewer than asked; the counts below must still agree).
    assert!(online >= 30, "{online} requests online");
    assert_eq!(u(&e, "answered"), online, "{e:#} {r:#}");
    assert_eq!(
        u(&e, "tls.handshakes.full"),
        u(&r, "sessions.copies"),
        "{e:#}"
    );
    assert_all_completed(&r);
    assert_handshakes(&r, u(&r, "sessions.copies"));
}

/// The target's whole answer to GET `path` over TLS (curl in the target host trusting `ca`),
/// as a keep-alive client gets it.
fn fetch_tls(l: &CopyLab, ca: &Path, path: &str) -> Vec<u8> {
    let url = format!("https://{TARGET}:{TLS_PORT}{path}");
    let o = l
        .target
        .run(&["curl", "-sSi", "--cacert", ca.to_str().unwrap(), &url])
        .expect("curl");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

/// `copy --input PCAP -x 8080-TARGET:8443 ARGS --json` to its end.
fn copy_file(l: &CopyLab, pcap: &Path, args: &[&str]) -> std::process::Output {
    let rule = tls_rule();
    let mut a = vec![
        "-x",
        &rule,
        "--input",
        pcap.to_str().unwrap(),
        "--speed",
        "10",
        "--timeout",
        "2",
        "--json",
    ];
    a.extend_from_slice(args);
    l.copy_to_end(&a, Duration::from_secs(20))
}

/// --diff over TLS: captured answers (the target's own, one file's body changed since)
/// against the plaintext the target answers over TLS, in http mode without the Date: the
/// changed file's answers and only they differ. Were the answers compared as read off the
/// socket (ciphertext), none would be equal.
#[test]
fn diff_compares_the_plaintext_answers_over_tls() {
    let mut l = CopyLab::new("cptlsdf");
    let ca = ca(&l, "ca");
    let _ng = tls_nginx(&mut l, &ca, &[("same.txt", SAME), ("other.txt", CHANGED)]);
    let same = fetch_tls(&l, &ca.cert(), "/same.txt");
    let mut other = fetch_tls(&l, &ca.cert(), "/other.txt");
    assert!(same.ends_with(SAME.as_bytes()) && other.ends_with(CHANGED.as_bytes()));
    let n = other.len();
    other[n - CHANGED.len()..].copy_from_slice(ORIGINAL.as_bytes());
    let pcap = l.dir.path().join("prod.pcap");
    diff_capture(
        &pcap,
        3,
        46000,
        &[("/same.txt", same), ("/other.txt", other)],
    );
    let cert = ca.cert();
    let o = copy_file(
        &l,
        &pcap,
        &[
            "--target-tls",
            "--tls-ca",
            cert.to_str().unwrap(),
            "--diff",
            "--diff-mode",
            "http",
            "--diff-ignore",
            "^Date:",
        ],
    );
    let d = diff_of(&o);
    assert_eq!(counts(&d), (6, 3, 3), "{d:#}");
    let r = json(&o);
    assert_all_completed(&r);
    assert_handshakes(&r, 3);
}

/// A target whose certificate comes from a CA the copy was not told to trust: every
/// handshake fails as unknown_ca, the target gets no request, and the run fails in one line
/// that names the target, the cause and what to do.
#[test]
fn a_target_certificate_of_an_unknown_ca_is_named() {
    let mut l = CopyLab::new("cptlsuca");
    let (ca, other) = (ca(&l, "ca"), ca(&l, "other"));
    let ng = tls_nginx(&mut l, &ca, &[]);
    let pcap = l.dir.path().join("prod.pcap");
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec();
    diff_capture(&pcap, 2, 46100, &[("/index.html", answer)]);
    let trusted = other.cert();
    let o = copy_file(
        &l,
        &pcap,
        &["--target-tls", "--tls-ca", trusted.to_str().unwrap()],
    );
    let r = failed_report(
        &o,
        &format!(
            "TLS handshake with {TARGET}:{TLS_PORT} failed: certificate signed by an unknown CA (trusted: --tls-ca {}; --tls-ca FILE, or --insecure for a lab certificate)",
            trusted.display()
        ),
    );
    check_schema(&r);
    let t = &r["tls"]["target"];
    assert_eq!(
        (
            u(t, "handshakes"),
            u(t, "failed"),
            u(t, "failures.unknown_ca")
        ),
        (0, 2, 2),
        "{t:#}"
    );
    assert_eq!(u(&r, "sessions.failed.reset"), 2, "{r:#}");
    assert_eq!(tls_requests(&ng), 0);
}

/// --insecure: the same certificate of an unknown CA is taken, every request copied, and
/// stderr says at the start that nothing was checked.
#[test]
fn insecure_copies_to_any_certificate_and_says_so() {
    let mut l = CopyLab::new("cptlsins");
    let ca = ca(&l, "ca");
    let ng = tls_nginx(&mut l, &ca, &[]);
    let pcap = l.dir.path().join("prod.pcap");
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec();
    diff_capture(
        &pcap,
        2,
        46200,
        &[("/index.html", answer.clone()), ("/index.html", answer)],
    );
    let o = copy_file(&l, &pcap, &["--target-tls", "--insecure"]);
    let r = mode_report(&o, "relay");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines()
            .next()
            .unwrap_or_default()
            .starts_with("tcpkit copy: --insecure: no TLS certificate of the target is checked"),
        "{err}"
    );
    assert_all_completed(&r);
    assert_handshakes(&r, 2);
    assert_eq!(tls_requests(&ng), 4);
}

/// TLS end to end: the clients (`tcpkit load https://...`, writing their key log through
/// SSLKEYLOGFILE) ask production nginx over TLS, keep-alive and a connection per request; the
/// copy decrypts each session with the key log as it grows and sends its plaintext over TLS
/// to the target nginx. The target logged every request production did, each over TLS; every
/// session decrypted, one handshake with the target per copy.
#[test]
fn keylog_plaintext_is_reencrypted_to_nginx_over_tls() {
    let mut l = CopyLab::new("cptlskl");
    let ca = ca(&l, "ca");
    let online = l.online.clone();
    let prod = nginx_on(&mut l, &online, ONLINE, &ca, &[]);
    let ng = tls_nginx(&mut l, &ca, &[]);
    let keys = l.dir.path().join("keys.log");
    let cert = ca.cert();
    let rule = format!("{TLS_PORT}-{TARGET}:{TLS_PORT}");
    let (keys_s, cert_s) = (keys.to_str().unwrap(), cert.to_str().unwrap());
    let c = l.copy_rule(
        &rule,
        &[
            "--tls-keylog",
            keys_s,
            "--target-tls",
            "--tls-ca",
            cert_s,
            "--duration",
            "2",
            "--json",
        ],
    );
    let url = format!("https://{ONLINE}:{TLS_PORT}/index.html");
    let get = |conns: &str, rate: &str, per_conn: Option<&str>| {
        let mut argv = vec![tcpkit(), "load", &url, "--tls-ca", cert_s, "-c", conns];
        argv.extend_from_slice(&["-r", rate, "-t", "0.8"]);
        if let Some(q) = per_conn {
            argv.extend_from_slice(&["--queries-per-conn", q]);
        }
        let mut cmd = l.clients.command(&argv);
        cmd.env("SSLKEYLOGFILE", &keys);
        run_limited(cmd, Duration::from_secs(20))
    };
    std::thread::scope(|s| {
        s.spawn(|| get("2", "100", None));
        s.spawn(|| get("1", "20", Some("1")));
    });
    let r = copy_report(c);
    let online = tls_requests(&prod);
    // Traffic came (a busy host sends fewer than asked; the counts below must still agree).
    assert!(online >= 30, "{online} requests online");
    assert_eq!(tls_requests(&ng), online, "{r:#}");
    assert_all_completed(&r);
    let t = &r["tls"];
    assert_eq!(t["source"], "keylog", "{t:#}");
    assert_eq!(
        u(t, "sessions.decrypted"),
        u(&r, "sessions.copies"),
        "{t:#}"
    );
    assert_eq!(u(t, "target.handshakes"), u(&r, "sessions.copies"), "{t:#}");
    assert_eq!(u(t, "target.failed"), 0, "{t:#}");
}
