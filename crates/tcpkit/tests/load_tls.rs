//! `load --tls` against `echo --tls` and real TLS servers (issue 26), in the lab: each payload
//! over TLS, the handshake counted and timed apart, each certificate error named, resumption,
//! and the wire checked by a capture where the report alone could not prove it.

use crate::common;
use common::peer::{json, pair, stop_echo, target, u, Pair, NGINX, SRV};
use common::stderr;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// `echo --tls --tls-self-signed` on `port` in the server host, its certificate written to
/// `ca` (named for the server's lab address); `args` add the mode.
fn tls_echo(p: &mut Pair, port: u16, ca: &Path, args: &[&str]) -> tcpkit_lab::Proc {
    let ca = ca.to_str().unwrap();
    let srv = SRV.to_string();
    let mut a = vec![
        "--json",
        "--tls",
        "--tls-self-signed",
        "--tls-name",
        &srv,
        "--tls-cert-out",
        ca,
    ];
    a.extend_from_slice(args);
    p.echo(port, &a)
}

/// `tcpkit load TARGET ARGS --json` in the client host; its exit, stderr and report.
fn load(p: &Pair, t: &str, args: &[&str]) -> (Option<i32>, String, Value) {
    let mut a = vec![t];
    a.extend_from_slice(args);
    a.push("--json");
    let o = p.load(&a, Duration::from_secs(20));
    (o.status.code(), stderr(&o), json(&o))
}

/// The lowercase hex SHA-256 of the certificate in `pem`, as openssl computes it.
fn openssl_fingerprint(pem: &Path) -> String {
    let o = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(pem)
        .output()
        .expect("this test needs openssl");
    let text = String::from_utf8_lossy(&o.stdout);
    text.trim()
        .rsplit('=')
        .next()
        .unwrap()
        .replace(':', "")
        .to_lowercase()
}

/// DNS over TLS against echo's self-signed certificate, trusted by --tls-ca: every query
/// answered, one full handshake per connection, timed; echo counts the same handshakes, and
/// its fingerprint line is the certificate openssl reads from --tls-cert-out.
#[test]
fn dot_against_echo_self_signed() {
    let mut p = pair("tlsdot");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let echo = tls_echo(&mut p, 853, &ca, &["--dns"]);
    let (code, err, r) = load(
        &p,
        &target(853),
        &[
            "--dns",
            "--tls",
            "--tls-ca",
            ca.to_str().unwrap(),
            "-c",
            "4",
            "-r",
            "400",
            "-t",
            "0.5",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    common::schema::check(&common::schema::load("load"), &r, "load");
    assert!(u(&r, "queries.answered") > 150, "{r:#}");
    assert_eq!(r["codes"]["NOERROR"], r["queries"]["answered"]);
    let t = &r["tls"];
    assert_eq!(u(t, "handshakes.full"), 4, "{t:#}");
    assert_eq!(u(t, "handshakes.resumed"), 0);
    assert_eq!(u(t, "handshakes.failed"), 0);
    assert_eq!(t["version"], "TLSv1.3");
    assert!(t["alpn"].is_null(), "DoT offers no ALPN by default: {t:#}");
    assert_eq!(u(t, "handshake_latency.count"), 4);
    assert!(u(t, "handshake_latency.min_ns") > 0);
    let e = stop_echo(&echo);
    common::schema::check(&common::schema::load("echo"), &e, "echo");
    assert_eq!(u(&e, "tls.handshakes.full"), 4, "{e:#}");
    assert_eq!(u(&e, "answered"), u(&r, "queries.answered"));
    let said = echo
        .log()
        .lines()
        .find_map(|l| {
            l.strip_prefix("tcpkit echo: TLS certificate sha256 ")
                .map(str::to_string)
        })
        .expect("echo says its fingerprint");
    assert_eq!(said, openssl_fingerprint(&ca));
}

/// A self-signed certificate and key made by openssl for `names` (`IP:198.18.0.2`,
/// `DNS:lab`), valid for two days from now, or (`expired`) only in January 2020: (cert, key)
/// in `dir`.
fn openssl_cert(dir: &Path, tag: &str, names: &str, expired: bool) -> (String, String) {
    let cert = dir.join(format!("{tag}.crt"));
    let key = dir.join(format!("{tag}.key"));
    let mut cmd = Command::new("openssl");
    cmd.args([
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
    ])
    .args(["-nodes", "-subj", "/CN=tcpkit lab", "-addext"])
    .arg(format!("subjectAltName={names}"))
    // A server's certificate, not a CA's (openssl's default for -x509): rustls refuses
    // a CA certificate presented as the server's own.
    .args(["-addext", "basicConstraints=critical,CA:FALSE"])
    .arg("-keyout")
    .arg(&key)
    .arg("-out")
    .arg(&cert);
    if expired {
        cmd.args([
            "-not_before",
            "20200101000000Z",
            "-not_after",
            "20200102000000Z",
        ]);
    } else {
        cmd.args(["-days", "2"]);
    }
    let o = cmd.output().expect("this test needs openssl");
    assert!(
        o.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (
        cert.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
    )
}

/// HTTPS to nginx by an https:// URL target: GETs answered 200 over TLS, ALPN http/1.1.
#[test]
fn https_url_against_nginx() {
    let mut p = pair("tlsngx");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("hello.txt"), "hello over TLS\n").unwrap();
    let (cert, key) = openssl_cert(dir.path(), "ngx", "IP:198.18.0.2", false);
    let conf = common::peer::nginx_conf(
        dir.path(),
        &format!(
            "access_log off; server {{ listen 198.18.0.2:8443 ssl; ssl_certificate {cert}; ssl_certificate_key {key}; root {}; }}",
            root.display()
        ),
    );
    p.server("nginx", &[NGINX, "-c", conf.to_str().unwrap()], 8443);
    let (code, err, r) = load(
        &p,
        "https://198.18.0.2:8443/hello.txt",
        &["--tls-ca", &cert, "-c", "2", "-r", "200", "-t", "0.5"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(u(&r, "queries.answered") > 60, "{r:#}");
    assert_eq!(r["codes"]["200"], r["queries"]["answered"]);
    assert_eq!(r["tls"]["alpn"], "http/1.1", "{:#}", r["tls"]);
    assert_eq!(u(&r, "tls.handshakes.full"), 2);
}
