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
use common::peer::{json, run_limited, u, Pair, SRV};
use common::{stderr, stdout};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use tcpkit_lab::{CertKey, Lab, Link, Nginx, NginxConf, TestCa, Unbound, UnboundConf, WWW_EXAMPLE};

/// A lab pair with a CA of its own and a server certificate for host b (its address and
/// `localhost`, the name a client gives as SNI).
pub(crate) struct TlsPair {
    p: Pair,
    ca: TestCa,
    cert: CertKey,
    /// The pair's link (captures on its client end).
    link: Link,
    /// What the clients read (query files), removed with the test.
    dir: tempfile::TempDir,
}

/// The name in the server certificate that clients ask for by SNI.
pub(crate) const NAME: &str = "localhost";

pub(crate) fn tls_pair(tag: &str) -> TlsPair {
    let (lab, cli, srv, link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
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
        link,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl TlsPair {
    /// unbound in host b: plain DNS on 53, DoT on 853, DoH on 443.
    pub(crate) fn unbound(&mut self) -> Unbound {
        let conf = UnboundConf::tls(SRV.into(), self.cert.clone());
        self.p
            .lab
            .unbound(&self.p.srv, &conf)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// nginx in host b: HTTPS with HTTP/1.1 and HTTP/2 on 443, an access log.
    fn nginx(&mut self) -> Nginx {
        self.nginx_serving(Vec::new())
    }

    /// [`TlsPair::nginx`] serving `files` (name, body) beside its index.html.
    pub(crate) fn nginx_serving(&mut self, files: Vec<(String, Vec<u8>)>) -> Nginx {
        let mut conf = NginxConf::https(SocketAddr::from((SRV, 443)), self.cert.clone());
        conf.files = files;
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

    pub(crate) fn ca(&self) -> String {
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
    // Resumption: a session saved from one connection resumes the next (a TLS 1.3 ticket of
    // unbound's OpenSSL). The sleep keeps s_client's input open until the ticket, sent after
    // the handshake, is in.
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

/// `tcpkit load TARGET ARGS -t 1 --json` in host a; it must succeed. Its report.
pub(crate) fn load(t: &TlsPair, target: &str, args: &[&str]) -> Value {
    let mut argv = vec![target, "-t", "1", "--json"];
    argv.extend_from_slice(args);
    let o = t.p.load(&argv, Duration::from_secs(20));
    assert!(
        o.status.success(),
        "load {argv:?}: {} {}",
        stderr(&o),
        stdout(&o)
    );
    json(&o)
}

/// Every query sent answered (none timed out, lost or left), none malformed, no errors.
pub(crate) fn assert_all_answered(r: &Value) {
    let sent = u(r, "queries.sent");
    assert!(sent >= 50, "{r:#}");
    assert_eq!(u(r, "queries.answered"), sent, "{r:#}");
    assert_eq!(u(r, "queries.malformed"), 0, "{r:#}");
    assert_eq!(r["errors"], serde_json::json!({}), "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
}

/// NOERROR for the zone's name and NXDOMAIN for the other, asked in turn: about half each
/// (each event-loop thread takes the names in turn; connections share threads unevenly); the
/// exact counts are checked against unbound's ([`assert_rcodes_as_unbound_counted`]).
pub(crate) fn assert_half_nxdomain(r: &Value) {
    let answered = u(r, "queries.answered");
    let (noerror, nxdomain) = (u(r, "codes.NOERROR"), u(r, "codes.NXDOMAIN"));
    assert_eq!(noerror + nxdomain, answered, "{r:#}");
    assert!(
        3 * noerror >= answered && 3 * nxdomain >= answered,
        "NOERROR {noerror}, NXDOMAIN {nxdomain}: {r:#}"
    );
}

/// The RCODEs the runs `rs` counted, together, are those unbound says it answered.
pub(crate) fn assert_rcodes_as_unbound_counted(ub: &Unbound, rs: &[&Value]) {
    for code in ["NOERROR", "NXDOMAIN"] {
        let counted: u64 = rs.iter().map(|r| u(r, &format!("codes.{code}"))).sum();
        let key = format!("num.answer.rcode.{code}");
        assert_eq!(ub.stat(&key).unwrap(), counted, "{key}");
    }
}

/// The report's TLS handshakes: (full, resumed, failed).
fn handshakes(r: &Value) -> (u64, u64, u64) {
    (
        u(r, "tls.handshakes.full"),
        u(r, "tls.handshakes.resumed"),
        u(r, "tls.handshakes.failed"),
    )
}

impl TlsPair {
    /// A file of two names, one in unbound's zone and one not, for --qname-file.
    pub(crate) fn names(&self) -> String {
        let names = self.dir.path().join("names");
        std::fs::write(&names, format!("{WWW_EXAMPLE}\nnope.example\n")).unwrap();
        names.to_string_lossy().into_owned()
    }
}

/// Issue 26 against unbound over DNS over TLS: `load --tls --dns` (the certificate checked
/// against the lab's CA) counts NOERROR and NXDOMAIN as unbound gives them, one full TLS 1.3
/// handshake per connection and no ALPN; `--tls-resume tickets --queries-per-conn 10`
/// reconnects every 10 answers and resumes all but the first handshakes. unbound's own counters
/// say every query came over TLS, and how many over resumed sessions.
#[test]
fn dot_against_unbound_counts_rcodes_and_resumes_by_ticket() {
    let mut t = tls_pair("tlsubdot");
    let ub = t.unbound();
    let dot = ub.dot().unwrap().to_string();
    let (ca, names) = (t.ca(), t.names());
    let common = [
        "--dns",
        "--tls",
        "--qname-file",
        &names,
        "--tls-ca",
        &ca,
        "-r",
        "200",
    ];
    let run = |args: &[&str]| load(&t, &dot, &[&common[..], args].concat());
    let (full, resumed) = std::thread::scope(|s| {
        let full = s.spawn(|| run(&["-c", "4"]));
        let resumed = run(&[
            "-c",
            "2",
            "--tls-resume",
            "tickets",
            "--queries-per-conn",
            "10",
        ]);
        (full.join().unwrap(), resumed)
    });
    for r in [&full, &resumed] {
        assert_all_answered(r);
        assert_half_nxdomain(r);
        assert_eq!(r["tls"]["version"], "TLSv1.3", "{r:#}");
        assert!(r["tls"]["alpn"].is_null(), "DoT offers no ALPN: {r:#}");
    }
    // Without resumption, one full handshake per connection and no reconnects.
    assert_eq!(handshakes(&full), (4, 0, 0), "{full:#}");
    assert_eq!(u(&full, "connections.attempts"), 4, "{full:#}");
    // A connection per 10 answers: the first two full, then resumed by ticket.
    let (f, r, failed) = handshakes(&resumed);
    let answered = u(&resumed, "queries.answered");
    assert_eq!(failed, 0, "{resumed:#}");
    assert!(f >= 2 && r >= 5 && r > f, "{resumed:#}");
    assert_eq!(u(&resumed, "connections.attempts"), f + r, "{resumed:#}");
    let stat = |k: &str| ub.stat(k).unwrap();
    assert_eq!(
        stat("num.query.tls"),
        u(&full, "queries.answered") + answered
    );
    assert_eq!(stat("num.query.https"), 0);
    assert_rcodes_as_unbound_counted(&ub, &[&full, &resumed]);
    // Queries over a resumed session: all but those of the full handshakes' connections.
    let on_resumed = stat("num.query.tls.resume");
    assert!(
        on_resumed <= answered && on_resumed + 10 * f >= answered,
        "unbound counted {on_resumed} queries over resumed sessions: {resumed:#}"
    );
}

/// The ALPN lists and SNI of the ClientHellos in `pcap` (tshark's reading), one per line.
fn client_hellos(pcap: &std::path::Path) -> Vec<String> {
    let o = std::process::Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(pcap)
        .args([
            "-Y",
            "tls.handshake.type == 1",
            "-T",
            "fields",
            "-e",
            "tls.handshake.extensions_alpn_str",
            "-e",
            "tls.handshake.extensions_server_name",
        ])
        .output()
        .expect("tshark is needed to read the capture: apt-get install -y tshark");
    assert!(o.status.success(), "tshark: {}", stderr(&o));
    let mut v: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    v.sort();
    v
}

/// `load` with `args` against nginx's HTTPS (`target`), captured on the client's link: its
/// report, nginx's access log and the ClientHellos on the wire.
pub(crate) fn https_run(
    t: &mut TlsPair,
    target: &str,
    args: &[&str],
) -> (Value, BTreeMap<String, u64>, Vec<String>) {
    let ng = t.nginx();
    let dump =
        t.p.lab
            .tcpdump(&t.p.cli, &t.link.a.name, "tcp port 443")
            .unwrap_or_else(|e| panic!("{e}"));
    let ca = t.ca();
    let common = ["--tls-sni", NAME, "--tls-ca", &ca, "-r", "200"];
    let r = load(t, target, &[&common[..], args].concat());
    let cap = dump.stop().unwrap_or_else(|e| panic!("{e}"));
    assert_all_answered(&r);
    assert_eq!(u(&r, "codes.200"), u(&r, "queries.answered"), "{r:#}");
    assert_eq!(r["tls"]["version"], "TLSv1.3", "{r:#}");
    (r, ng.requests().unwrap(), client_hellos(&cap.path))
}

/// Issue 26 against nginx over HTTPS: `load https://SRV/index.html` (HTTP/1.1 keep-alive over
/// TLS, --tls-sni naming the certificate's name) counts status 200 for every request; nginx's
/// access log says each came over TLS 1.3 as HTTP/1.1 with ALPN http/1.1, and on the wire
/// (tcpdump, read by tshark) each connection's ClientHello offered http/1.1 alone and named
/// `localhost`.
#[test]
fn https_against_nginx_counts_statuses_and_speaks_what_nginx_logs() {
    let mut t = tls_pair("tlsnghttps");
    let url = format!("https://{SRV}/index.html");
    let (r, log, hellos) = https_run(&mut t, &url, &["-c", "2"]);
    assert_eq!(r["tls"]["alpn"], "http/1.1", "{r:#}");
    assert!(r.get("http2").is_none(), "{r:#}");
    let want = BTreeMap::from([(
        "HTTP/1.1 TLSv1.3 . http/1.1 200".to_string(),
        u(&r, "queries.answered"),
    )]);
    assert_eq!(log, want);
    assert_eq!(
        hellos,
        [format!("http/1.1\t{NAME}"), format!("http/1.1\t{NAME}")]
    );
}
