//! `load`'s HTTP/2 and DoH flags (issue 26): what the user typed (clap) and their
//! resolution into the payload and [`lib::Http2`]; kept apart from load.rs, which holds the
//! rest of the command.

use clap::{Args as ClapArgs, ValueEnum};
use tcpkit_load::loadgen::{self as lib, DohMethod, Payload};

use crate::load::{check_headers, dns_queries, usage, Args};
use crate::Failure;

/// `load`'s HTTP/2 and DoH flags.
#[derive(Debug, Clone, ClapArgs)]
pub struct LoadH2 {
    /// HTTP/2 for --http-get (or a URL target), as h2load: in clear, h2c with prior knowledge
    /// (the connection starts with the HTTP/2 preface, no Upgrade). Requests go on
    /// concurrent streams of each connection (--h2-streams), on the same open-loop schedule.
    /// Example: tcpkit load http://10.0.0.2:8080/ --http2 -c 10 --h2-streams 50 -r 20000.
    #[arg(long, conflicts_with = "http1")]
    pub http2: bool,

    /// Streams open at once per connection at most (HTTP/2: --http2, --doh), 1 to 1024; the
    /// server's SETTINGS_MAX_CONCURRENT_STREAMS lowers it. A query due when every connection
    /// has that many open waits for a stream, and the wait counts in its latency (from its
    /// intended send time), as every wait does.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub h2_streams: u32,

    /// DNS over HTTPS (RFC 8484): each DNS query (--qname, --qtype, --qname-file) sent as
    /// an HTTP request to --doh-path (GET with ?dns=base64url, or POST of
    /// application/dns-message: --doh-method), answers parsed as DNS and their RCODEs counted
    /// (an HTTP status other than 200 counts as `HTTP <status>`). HTTP/2 by default (h2c with
    /// prior knowledge in clear); --http1 for HTTP/1.1 keep-alive. Example: tcpkit load
    /// 10.0.0.2:8053 --doh --doh-method get --qname example.com -c 4 -r 5000.
    #[arg(long, conflicts_with = "udp")]
    pub doh: bool,

    /// --doh's request: `post` (the body is the DNS message) or `get` (the message in the
    /// path's ?dns= parameter, base64url without padding).
    #[arg(
        long,
        value_enum,
        value_name = "METHOD",
        default_value = "post",
        requires = "doh"
    )]
    pub doh_method: DohMethodArg,

    /// --doh's path on the server.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/dns-query",
        requires = "doh"
    )]
    pub doh_path: String,

    /// --doh over HTTP/1.1 keep-alive (answers in order, one request at a time per
    /// connection in flight as HTTP/1.1 pipelining allows) instead of HTTP/2.
    #[arg(long, requires = "doh")]
    pub http1: bool,
}

/// `--doh-method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DohMethodArg {
    Get,
    Post,
}

/// `--doh` into its payload (the DNS flags' questions, --doh-method, --doh-path, -H), or
/// None without --doh.
pub fn doh_payload(a: &Args) -> Result<Option<Payload>, Failure> {
    if !a.h2.doh {
        return Ok(None);
    }
    if !a.h2.doh_path.starts_with('/')
        || a.h2
            .doh_path
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b == b'?')
    {
        return Err(usage(format!(
            "--doh-path {:?}: expected an absolute path without spaces or query string, like /dns-query",
            a.h2.doh_path
        )));
    }
    check_headers(&a.header)?;
    let queries = dns_queries(a)?;
    let host = a
        .target
        .strip_suffix(":80")
        .unwrap_or(&a.target)
        .to_string();
    Ok(Some(Payload::Doh {
        queries,
        method: match a.h2.doh_method {
            DohMethodArg::Get => DohMethod::Get,
            DohMethodArg::Post => DohMethod::Post,
        },
        path: a.h2.doh_path.clone(),
        host,
        headers: a.header.clone(),
    }))
}

/// HTTP/2's settings from the flags, checked against the payload: --http2 only with HTTP,
/// --h2-streams only with HTTP/2, no --coalesce with it.
pub fn http2(
    h: &LoadH2,
    payload: &Payload,
    coalesce: usize,
) -> Result<Option<lib::Http2>, Failure> {
    let http = matches!(payload, Payload::HttpGet { .. });
    if h.http2 && !http && !h.doh {
        return Err(usage(
            "--http2: only with HTTP (--http-get PATH, a target http://HOST:PORT/PATH, or --doh)",
        ));
    }
    if !(1..=1024).contains(&h.h2_streams) {
        return Err(usage(format!(
            "--h2-streams {}: must be 1 to 1024",
            h.h2_streams
        )));
    }
    if h.h2_streams != 100 && !(h.http2 || h.doh && !h.http1) {
        return Err(usage(
            "--h2-streams: only with HTTP/2 (--http2, or --doh without --http1)",
        ));
    }
    if (h.http2 || h.doh && !h.http1) && coalesce > 1 {
        return Err(usage(
            "--coalesce: not with HTTP/2, where each request is one HEADERS frame on a stream of its own, written as it falls due; --coalesce is for the other payloads",
        ));
    }
    Ok((h.http2 || h.doh && !h.http1).then_some(lib::Http2 {
        streams: h.h2_streams,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;
    use tcpkit_load::loadgen::Config;

    fn parse(args: &[&str]) -> Result<Config, String> {
        crate::common::resolved(&[&["load"], args].concat(), crate::load::resolve)
    }

    /// Issue 26: --http2 for HTTP, --h2-streams (1 to 1024, default 100) with HTTP/2 only,
    /// --doh with the DNS flags, its method and path, HTTP/1.1 on asking.
    #[test]
    fn http2_and_doh_flags() {
        let c = parse(&["http://127.0.0.1:8080/x", "--http2", "-r", "1"]).unwrap();
        assert_eq!(c.http2, Some(lib::Http2 { streams: 100 }));
        let c = parse(&[
            "127.0.0.1:80",
            "--http-get",
            "/",
            "--http2",
            "--h2-streams",
            "7",
            "-r",
            "1",
        ])
        .unwrap();
        assert_eq!(c.http2, Some(lib::Http2 { streams: 7 }));
        assert!(parse(&["127.0.0.1:80", "--http-get", "/", "-r", "1"])
            .unwrap()
            .http2
            .is_none());
        for (args, flag) in [
            (&["127.0.0.1:53", "--http2", "-r", "1"][..], "--http2"),
            (
                &[
                    "127.0.0.1:80",
                    "--http-get",
                    "/",
                    "--h2-streams",
                    "5",
                    "-r",
                    "1",
                ],
                "--h2-streams",
            ),
            (
                &[
                    "127.0.0.1:80",
                    "--http-get",
                    "/",
                    "--http2",
                    "--h2-streams",
                    "0",
                    "-r",
                    "1",
                ],
                "--h2-streams 0",
            ),
            (
                &["127.0.0.1:80", "--doh", "--h2-streams", "2000", "-r", "1"],
                "--h2-streams 2000",
            ),
            (
                &["127.0.0.1:80", "--doh", "--doh-path", "dns", "-r", "1"],
                "--doh-path",
            ),
            (
                &["127.0.0.1:80", "--doh", "--coalesce", "4", "-r", "1"],
                "--coalesce",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.starts_with(flag), "{args:?}: {e}");
        }
        let c = parse(&[
            "127.0.0.1:8053",
            "--doh",
            "--qname",
            "a.test",
            "--qtype",
            "AAAA",
            "-r",
            "1",
        ])
        .unwrap();
        assert_eq!(c.http2, Some(lib::Http2 { streams: 100 }));
        match &c.payload {
            Payload::Doh {
                queries,
                method,
                path,
                host,
                ..
            } => {
                assert_eq!((queries.len(), queries[0].1), (1, 28));
                assert_eq!(
                    (*method, path.as_str(), host.as_str()),
                    (DohMethod::Post, "/dns-query", "127.0.0.1:8053")
                );
            }
            p => panic!("{p:?}"),
        }
        let c = parse(&[
            "127.0.0.1:80",
            "--doh",
            "--doh-method",
            "get",
            "--doh-path",
            "/q",
            "--http1",
            "-r",
            "1",
        ])
        .unwrap();
        assert!(c.http2.is_none());
        assert!(
            matches!(&c.payload, Payload::Doh { method: DohMethod::Get, path, host, .. } if path == "/q" && host == "127.0.0.1")
        );
        // The DoH flags need --doh; --http1 and --http2 exclude each other; --doh is not --udp.
        for args in [
            &["load", "127.0.0.1:80", "--doh-method", "get", "-r", "1"][..],
            &["load", "127.0.0.1:80", "--doh-path", "/x", "-r", "1"],
            &["load", "127.0.0.1:80", "--http1", "-r", "1"],
            &[
                "load",
                "127.0.0.1:80",
                "--doh",
                "--http1",
                "--http2",
                "-r",
                "1",
            ],
            &["load", "127.0.0.1:80", "--doh", "--udp", "-r", "1"],
            &[
                "load",
                "127.0.0.1:80",
                "--doh",
                "--echo-bytes",
                "8",
                "-r",
                "1",
            ],
        ] {
            assert!(Args::try_parse_from(args).is_err(), "{args:?}");
        }
    }
}
