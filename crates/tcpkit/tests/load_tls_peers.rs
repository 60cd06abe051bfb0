//! Issue 26 against real TLS servers: Debian's unbound over DNS-over-TLS and DNS-over-HTTPS
//! and nginx over HTTPS and HTTP/2, each with a certificate of a CA made for the test
//! (tcpkit-lab's `TestCa`, `Lab::unbound`, `Lab::nginx`), in host b of a lab pair; the clients
//! in host a. First the fixtures are proven by the peers users measure them with (dnsperf
//! `-m dot` / `-m doh`, h2load, wrk, curl and openssl checking the certificate), then `tcpkit
//! load` speaks to them. The servers' own accounts are the oracles of what went over the
//! wire: unbound's counters of queries by transport (`num.query.tls`, `num.query.https`,
//! `num.query.tls.resume`) and nginx's access log of protocol, TLS version, resumption and
//! ALPN per request.

use crate::common;
use common::peer::{run_limited, Pair, SRV};
use common::{stderr, stdout};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tcpkit_lab::{CertKey, Lab, Nginx, NginxConf, TestCa, Unbound, UnboundConf, WWW_EXAMPLE};

/// A lab pair with a CA of its own and a server certificate for host b (its address and
/// `localhost`, the name a client gives as SNI).
struct TlsPair {
    p: Pair,
    ca: TestCa,
    cert: CertKey,
    /// What the clients read (query files), removed with the test.
    dir: tempfile::TempDir,
}

/// The name in the server certificate that clients ask for by SNI.
const NAME: &str = "localhost";

fn tls_pair(tag: &str) -> TlsPair {
    let (lab, cli, srv, _link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
    let p = Pair { lab, cli, srv };
    let ca =
        TestCa::new(&p.lab.dir().join("ca"), "tcpkit lab CA").unwrap_or_else(|e| panic!("{e}"));
    let srv = SRV.to_string();
    let cert = ca
        .server("server", &[NAME, &srv])
        .unwrap_or_else(|e| panic!("{e}"));
    TlsPair {
        p,
        ca,
        cert,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl TlsPair {
    /// unbound in host b: plain DNS on 53, DoT on 853, DoH on 443.
    fn unbound(&mut self) -> Unbound {
        let conf = UnboundConf::tls(SRV.into(), self.cert.clone());
        self.p
            .lab
            .unbound(&self.p.srv, &conf)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// nginx in host b: HTTPS with HTTP/1.1 and HTTP/2 on 443, an access log.
    fn nginx(&mut self) -> Nginx {
        let conf = NginxConf::https(SocketAddr::from((SRV, 443)), self.cert.clone());
        self.p
            .lab
            .nginx(&self.p.srv, &conf)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `argv` in host a, to completion within 20 s; it must succeed. Its stdout.
    fn peer(&self, argv: &[&str]) -> String {
        let (o, _) = run_limited(self.p.cli.command(argv), Duration::from_secs(20));
        assert!(
            o.status.success(),
            "{argv:?}: {} {}",
            stdout(&o),
            stderr(&o)
        );
        stdout(&o)
    }

    /// dnsperf's query file: one name of the zone and one it lacks, in turn.
    fn queries(&self) -> String {
        let f = self.dir.path().join("queries");
        std::fs::write(&f, format!("{WWW_EXAMPLE} A\nnope.example A\n")).unwrap();
        f.to_string_lossy().into_owned()
    }

    fn ca(&self) -> String {
        self.ca.cert().to_string_lossy().into_owned()
    }
}

/// A figure of dnsperf's statistics (`  Queries completed:    200 (100.00%)`).
fn dnsperf_figure(out: &str, label: &str) -> u64 {
    out.lines()
        .find(|l| l.trim_start().starts_with(label))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in dnsperf's output: {out}"))
}

/// dnsperf's `Response codes:` line as counts (`NOERROR 100 (50.00%), NXDOMAIN 100 (50.00%)`).
fn dnsperf_codes(out: &str) -> BTreeMap<String, u64> {
    let line = out
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Response codes:"))
        .unwrap_or_else(|| panic!("no response codes in dnsperf's output: {out}"));
    line.split(',')
        .filter_map(|c| {
            let mut w = c.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect()
}

/// The fixture, proven by the peers: unbound's certificate chains to the test's CA for the
/// name and the address (openssl s_client with verification on), a TLS 1.3 session resumes
/// (s_client -sess_out, then -sess_in), and dnsperf
/// 2.10's `-m dot` and `-m doh` (POST) get every query answered, NOERROR and NXDOMAIN half
/// each, and unbound counts them as queries over TLS and over HTTPS.
#[test]
fn unbound_answers_dnsperf_over_dot_and_doh_with_the_labs_certificate() {
    let mut t = tls_pair("tlsubpeer");
    let ub = t.unbound();
    let dot = ub.dot().unwrap().to_string();
    let (ca, srv) = (t.ca(), SRV.to_string());
    // By name (SNI and the name checked) and by address (no SNI, the address checked).
    for check in [
        ["-servername", NAME, "-verify_hostname", NAME],
        ["-verify_ip", &srv, "", ""],
    ] {
        let mut argv = vec!["openssl", "s_client", "-connect", &dot, "-CAfile", &ca];
        argv.extend(check.iter().filter(|a| !a.is_empty()));
        argv.extend(["-verify_return_error", "-brief"]);
        t.peer(&argv);
    }
    // Resumption: a session saved from one connection resumes the next (unbound needs
    // tls-session-ticket-keys for it: without them it issues no ticket a client can use). The
    // sleep keeps s_client's input open until the ticket, sent after the handshake, is in.
    let sess = t.dir.path().join("session");
    for (flag, want) in [
        ("-sess_out", "New, TLSv1.3"),
        ("-sess_in", "Reused, TLSv1.3"),
    ] {
        let line = format!(
            "sleep 0.3 | openssl s_client -connect {dot} -CAfile {ca} {flag} {}",
            sess.display()
        );
        let out = t.peer(&["sh", "-c", &line]);
        assert!(out.contains(want), "{flag}: {out}");
    }
    let queries = t.queries();
    let run = |mode: &str, extra: &[&str]| {
        let mut argv = vec![
            "dnsperf", "-m", mode, "-s", &srv, "-c", "2", "-Q", "200", "-l", "1", "-t", "2", "-d",
            &queries,
        ];
        argv.extend_from_slice(extra);
        t.peer(&argv)
    };
    let (dnsperf_dot, dnsperf_doh) = std::thread::scope(|s| {
        let doh = s.spawn(|| {
            run(
                "doh",
                &[
                    "-O",
                    "doh-uri=https://198.18.0.2:443/dns-query",
                    "-O",
                    "doh-method=POST",
                ],
            )
        });
        (run("dot", &[]), doh.join().unwrap())
    });
    let mut answered = 0;
    for out in [&dnsperf_dot, &dnsperf_doh] {
        let done = dnsperf_figure(out, "Queries completed");
        assert!(done >= 150, "{out}");
        assert_eq!(dnsperf_figure(out, "Queries lost"), 0, "{out}");
        let codes = dnsperf_codes(out);
        assert_eq!(codes.len(), 2, "{out}");
        assert!(codes["NOERROR"].abs_diff(codes["NXDOMAIN"]) <= 2, "{out}");
        answered += done;
    }
    let tls = ub.stat("num.query.tls").unwrap();
    let https = ub.stat("num.query.https").unwrap();
    assert_eq!(https, dnsperf_figure(&dnsperf_doh, "Queries completed"));
    // DoH's queries are counted as over TLS too.
    assert_eq!(tls, answered, "{:?}", ub.stats().unwrap());
}

/// `Application protocol: h2` and the `requests:` line of h2load's summary, as (done,
/// succeeded).
fn h2load_done(out: &str) -> (u64, u64) {
    assert!(out.contains("Application protocol: h2"), "{out}");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .unwrap_or_else(|| panic!("no requests line in h2load's output: {out}"));
    // "100 total, 100 started, 100 done, 100 succeeded, 0 failed, 0 errored, 0 timeout"
    let field = |name: &str| -> u64 {
        line.split(", ")
            .find_map(|f| f.strip_suffix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in {line:?}"))
    };
    (field(" done"), field(" succeeded"))
}

/// The fixture, proven by the peers: nginx's certificate chains to the test's CA (curl with
/// verification on, over HTTP/1.1 and HTTP/2), h2load gets every request over h2, wrk gets
/// answers over HTTPS, and nginx's access log says each came as asked: HTTP/2.0 with ALPN h2,
/// HTTP/1.1 with ALPN http/1.1 (curl) or none (wrk's OpenSSL offers none), TLS 1.3.
#[test]
fn nginx_serves_curl_h2load_and_wrk_over_tls_with_the_labs_certificate() {
    let mut t = tls_pair("tlsngpeer");
    let ng = t.nginx();
    let ca = t.ca();
    let url = format!("https://{NAME}/index.html");
    let resolve = format!("{NAME}:443:{SRV}");
    for (proto, want) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = t.peer(&[
            "curl",
            "-sS",
            proto,
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code} %{size_download}",
            &url,
        ]);
        assert_eq!(out, format!("{want} 200 {}", tcpkit_lab::INDEX_HTML_LEN));
    }
    let by_ip = format!("https://{SRV}/index.html");
    let out = t.peer(&["h2load", "-n", "200", "-c", "2", "-m", "10", &by_ip]);
    assert_eq!(h2load_done(&out), (200, 200), "{out}");
    let out = t.peer(&["wrk", "-t", "1", "-c", "2", "-d", "1", &by_ip]);
    assert!(
        !out.contains("Non-2xx") && !out.contains("Socket errors"),
        "{out}"
    );
    let log = ng.requests().unwrap();
    let n = |line: &str| log.get(line).copied().unwrap_or(0);
    assert_eq!(n("HTTP/1.1 TLSv1.3 . http/1.1 200"), 1, "{log:?}");
    assert_eq!(n("HTTP/2.0 TLSv1.3 . h2 200"), 201, "{log:?}");
    assert!(n("HTTP/1.1 TLSv1.3 . - 200") > 100, "{log:?}");
    assert_eq!(log.len(), 3, "{log:?}");
}
