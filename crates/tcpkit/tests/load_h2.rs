//! `tcpkit load --http2` and `--doh` (issue 26) against real servers in lab host b: Debian's
//! nginx speaking h2c (prior knowledge on a clear `listen ... http2` listener, curl
//! --http2-prior-knowledge as the oracle), unbound's DoH in clear (`http-notls-downstream`),
//! and `tcpkit echo --http`. The wire is read back with tshark: many streams on one
//! connection, never more open at once than --h2-streams; nginx's GOAWAY after
//! `keepalive_requests` reopens the connection without losing a query.

use crate::common;
use crate::common::unbound;
use common::peer::{json, nginx_conf, pair, run_limited, u, Pair, NGINX, SRV};
use common::schema;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use common::{stderr, stdout, tcpkit};
use tcpkit_lab::Lab;

const PORT: u16 = 8090;
const STREAMS: u64 = 6;

/// Per TCP connection of a capture (tshark's tcp.stream): the stream ids the client opened,
/// and the most open at once (opened by the client's HEADERS, closed by the server's frame
/// with END_STREAM or either side's RST_STREAM).
fn streams_on_the_wire(pcap: &std::path::Path, port: u16) -> BTreeMap<u64, (usize, usize)> {
    let out = std::process::Command::new("tshark")
        .args(["-r", pcap.to_str().unwrap(), "-d"])
        .arg(format!("tcp.port=={port},http2"))
        .args([
            "-Y",
            "http2",
            "-T",
            "fields",
            "-e",
            "tcp.stream",
            "-e",
            "tcp.dstport",
            "-e",
            "http2.streamid",
            "-e",
            "http2.type",
            "-e",
            "http2.flags.end_stream",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=,",
        ])
        .output()
        .expect("tshark (apt-get install tshark)");
    assert!(out.status.success(), "tshark: {}", stderr(&out));
    let mut per: BTreeMap<
        u64,
        (
            std::collections::BTreeSet<u64>,
            std::collections::BTreeSet<u64>,
            usize,
        ),
    > = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let [conn, dport, ids, types, ends] = f[..] else {
            continue;
        };
        let conn: u64 = conn.parse().unwrap();
        let to_server = dport == port.to_string();
        let ids: Vec<u64> = ids.split(',').filter_map(|s| s.parse().ok()).collect();
        let types: Vec<u64> = types.split(',').filter_map(|s| s.parse().ok()).collect();
        // end_stream is shown only for frames that have the flag (DATA, HEADERS).
        let ends: Vec<bool> = ends.split(',').map(|s| s == "1" || s == "True").collect();
        let e = per.entry(conn).or_default();
        let mut k_end = 0;
        for (k, &ty) in types.iter().enumerate() {
            let id = ids.get(k).copied().unwrap_or(0);
            let end = if ty == 0 || ty == 1 {
                let v = ends.get(k_end).copied().unwrap_or(false);
                k_end += 1;
                v
            } else {
                false
            };
            match (to_server, ty) {
                (true, 1) if id != 0 && e.0.insert(id) => {
                    e.1.insert(id);
                }
                (false, 0 | 1) if end => {
                    e.1.remove(&id);
                }
                (_, 3) => {
                    e.1.remove(&id);
                }
                _ => {}
            }
            e.2 = e.2.max(e.1.len());
        }
    }
    per.into_iter()
        .map(|(c, (all, _, most))| (c, (all.len(), most)))
        .collect()
}

#[test]
fn http2_multiplexes_streams_against_nginx_and_reopens_after_goaway() {
    let (lab, cli, srv, link) = Lab::pair("ldh2").unwrap_or_else(|e| panic!("{e}"));
    let mut p = Pair { lab, cli, srv };
    let dir = tempfile::tempdir().unwrap();
    // nginx closes each connection with GOAWAY after 300 requests.
    let conf = nginx_conf(
        dir.path(),
        &format!(
            "access_log off;\n\
             server {{ listen {SRV}:{PORT} http2; keepalive_requests 300;\n\
               location / {{ return 200 \"ok\\n\"; }} }}"
        ),
    );
    let _nginx = p.server("nginx", &[NGINX, "-c", conf.to_str().unwrap()], PORT);
    let (lab, cli) = (&mut p.lab, &p.cli);
    // The oracle: nginx answers HTTP/2 with prior knowledge in clear.
    let url = format!("http://{SRV}:{PORT}/");
    let o = cli
        .run(&[
            "curl",
            "-s",
            "--http2-prior-knowledge",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
            &url,
        ])
        .unwrap();
    assert_eq!(stdout(&o), "2 200", "curl: {}", stderr(&o));
    let dump = lab
        .tcpdump(cli, &link.a.name, &format!("tcp port {PORT}"))
        .expect("tcpdump");
    let streams = STREAMS.to_string();
    let mut cmd = cli.command(&[
        tcpkit(),
        "load",
        &url,
        "--http2",
        "-c",
        "2",
        "--h2-streams",
        &streams,
        "-r",
        "4000",
        "-t",
        "0.5",
        "--json",
    ]);
    cmd.current_dir("/");
    let (o, _) = run_limited(cmd, Duration::from_secs(20));
    let cap = dump.stop().expect("tcpdump stop");
    let r = json(&o);
    schema::check(&schema::load("load"), &r, "report");
    let sent = u(&r, "queries.sent");
    assert!(sent >= 1000, "{r:#}");
    // Every query answered 200: none lost to the GOAWAYs (those the server had not
    // processed were sent again), no timeouts.
    assert_eq!(u(&r, "queries.answered"), sent, "{r:#}");
    assert_eq!(r["codes"]["200"].as_u64(), Some(sent), "{r:#}");
    assert_eq!(
        u(&r, "queries.lost") + u(&r, "queries.timeouts"),
        0,
        "{r:#}"
    );
    let h = &r["http2"];
    assert!(
        u(h, "goaway") >= 2,
        "nginx closes after 300 requests: {r:#}"
    );
    assert!(u(&r, "connections.reconnects") >= 2, "{r:#}");
    assert!(u(h, "streams_max") <= STREAMS, "{r:#}");
    assert_eq!(u(h, "rst_stream"), 0, "{r:#}");
    // On the wire: connections of up to 300 streams each, never more than STREAMS open.
    let per = streams_on_the_wire(&cap.path, PORT);
    let busiest = per.values().map(|v| v.0).max().unwrap_or(0);
    let most = per.values().map(|v| v.1).max().unwrap_or(0) as u64;
    assert!(busiest >= 100, "many streams on one connection: {per:?}");
    assert!(
        most <= STREAMS,
        "at most --h2-streams open at once: {per:?}"
    );
    assert!(most >= 2, "streams in flight together: {per:?}");
}

/// Queries a GOAWAY hands back after the last query was sent are sent again, not left
/// unanswered: nginx answers 300 requests on a connection (`keepalive_requests`) and sends
/// GOAWAY; load has all 301 of `-n 301` out on it at once (--h2-streams above the count, nginx
/// taking 512), so the 301st is handed back once sending is over. load used to reopen
/// connections and resend handed-back queries only while it was still sending: the 301st stayed
/// unanswered at the end (as in the multiplexing test above now and then, 3 of 1,837).
#[test]
fn a_query_handed_back_by_goaway_after_the_last_send_is_sent_again() {
    let (lab, cli, srv, _link) = Lab::pair("ldh2ga").unwrap_or_else(|e| panic!("{e}"));
    let mut p = Pair { lab, cli, srv };
    let dir = tempfile::tempdir().unwrap();
    let conf = nginx_conf(
        dir.path(),
        &format!(
            "access_log off;\n\
             server {{ listen {SRV}:{PORT} http2; keepalive_requests 300;\n\
               http2_max_concurrent_streams 512;\n\
               location / {{ return 200 \"ok\\n\"; }} }}"
        ),
    );
    let _nginx = p.server("nginx", &[NGINX, "-c", conf.to_str().unwrap()], PORT);
    let url = format!("http://{SRV}:{PORT}/");
    let mut cmd = p.cli.command(&[
        tcpkit(),
        "load",
        &url,
        "--http2",
        "-c",
        "1",
        "--h2-streams",
        "400",
        "-n",
        "301",
        "-r",
        "100000",
        "--timeout",
        "2s",
        "-t",
        "3",
        "--json",
    ]);
    cmd.current_dir("/");
    let (o, _) = run_limited(cmd, Duration::from_secs(20));
    let r = json(&o);
    assert_eq!(u(&r, "queries.sent"), 301, "{r:#}");
    assert_eq!(u(&r, "queries.answered"), 301, "{r:#}");
    assert_eq!(u(&r, "queries.unanswered_at_end"), 0, "{r:#}");
    assert_eq!(u(&r, "http2.goaway"), 1, "{r:#}");
    assert!(u(&r, "http2.retried") >= 1, "{r:#}");
    assert_eq!(u(&r, "connections.reconnects"), 1, "{r:#}");
    assert!(o.status.success(), "{}", stderr(&o));
}

/// DoH both ways against `tcpkit echo --http` and unbound (its DoH in clear), over HTTP/2
/// and, against echo, HTTP/1.1: every answer parsed as DNS and counted by RCODE.
#[test]
fn doh_get_and_post_against_echo_and_unbound() {
    let mut p = pair("lddoh");
    p.echo(PORT, &["--http"]);
    let dir = tempfile::tempdir().unwrap();
    unbound::require();
    let conf = unbound::write_conf(dir.path(), IpAddr::V4(SRV), PORT + 1, 64);
    let text = std::fs::read_to_string(&conf).unwrap().replace(
        "remote-control:",
        &format!(
            "    https-port: {}\n    http-notls-downstream: yes\nremote-control:",
            PORT + 1
        ),
    );
    std::fs::write(&conf, text).unwrap();
    let argv = unbound::argv(&conf);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    p.server("unbound", &argv, PORT + 1);
    // The twelve loads at once, each its own process and connections, so their lengths
    // overlap instead of adding up.
    let cases: Vec<(u16, Vec<&str>, &str)> = ["get", "post"]
        .into_iter()
        .flat_map(|m| {
            [
                // echo: its A answer for any name, over HTTP/2 and HTTP/1.1.
                (PORT, vec!["--doh-method", m], "NOERROR"),
                (PORT, vec!["--doh-method", m, "--http1"], "NOERROR"),
                // unbound: NOERROR for the zone's name, NXDOMAIN for one it lacks.
                (
                    PORT + 1,
                    vec!["--doh-method", m, "--qname", unbound::WWW_EXAMPLE],
                    "NOERROR",
                ),
                (
                    PORT + 1,
                    vec!["--doh-method", m, "--qname", "nope.example"],
                    "NXDOMAIN",
                ),
            ]
        })
        .collect();
    let cli = &p.cli;
    std::thread::scope(|sc| {
        let runs: Vec<_> = cases
            .iter()
            .map(|(port, args, code)| {
                sc.spawn(move || {
                    let target = format!("{SRV}:{port}");
                    let argv = [
                        &[
                            tcpkit(),
                            "load",
                            target.as_str(),
                            "--doh",
                            "-c",
                            "2",
                            "-r",
                            "400",
                            // A count, not a length: twelve processes starting at once on a
                            // busy machine may take long to get going, and every query of a
                            // count is waited for.
                            "-n",
                            "100",
                            "--json",
                        ][..],
                        args,
                    ]
                    .concat();
                    let mut cmd = cli.command(&argv);
                    cmd.current_dir("/");
                    let (o, _) = run_limited(cmd, Duration::from_secs(20));
                    let r = json(&o);
                    schema::check(&schema::load("load"), &r, "report");
                    assert_eq!(
                        u(&r, "queries.answered"),
                        100,
                        "{args:?}: {r:#} {}",
                        stderr(&o)
                    );
                    assert_eq!(
                        r["codes"][code], r["queries"]["answered"],
                        "{args:?}: {r:#}"
                    );
                    let h2 = !args.contains(&"--http1");
                    assert_eq!(r["http2"].is_object(), h2, "{args:?}: {r:#}");
                    if h2 {
                        assert_eq!(u(&r["http2"], "rst_stream"), 0, "{r:#}");
                    }
                })
            })
            .collect();
        for r in runs {
            if let Err(e) = r.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
}
