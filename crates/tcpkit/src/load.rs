//! `tcpkit load`: what the user typed (clap; tcpclient's short options where it has them),
//! then the resolved `tcpkit_load::loadgen::Config` where every cross-flag check happens.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};
use tcpkit_load::loadgen::{
    self as lib, check_target, parse_ramp, parse_sources, parse_steps, ArrivalKind, Config,
    LiveTotals, LoadCounters, Payload, Procs, RateProfile, ResponseEnd,
};
use tcpkit_load::report::LoadReport;
use tcpkit_pace::units::unescape;
use tcpkit_stats::{Histogram, Monitor, MonitorOptions};

use crate::common::{self, duration_arg, LimitFlags, OutputFlags, RunFlags};
use crate::Failure;

/// The payloads other than DNS: the DNS flags (--qname, --qname-file, --qtype) would be
/// silently ignored with them, so clap refuses the combination (explicit values only; the
/// defaults do not conflict).
const NOT_DNS: [&str; 4] = ["echo_bytes", "payload_file", "redis_ping", "http_get"];

/// Load a TCP server with many connections and queries at a set rate (tcpclient, wrk2): an
/// open-loop schedule (intended send times from one start, never waiting for answers), latency
/// from the intended and from the actual send time, lag reported when the client falls behind.
#[derive(Debug, Parser)]
#[command(group(ArgGroup::new("payload").args(["dns", "echo_bytes", "payload_file", "redis_ping", "http_get"])))]
#[command(group(ArgGroup::new("rates").args(["rate", "rate_steps", "ramp"])))]
pub struct Args {
    /// The server, HOST:PORT (a name, an IPv4 address, or [IPv6]:PORT), or as wrk takes it,
    /// http://HOST[:PORT]/PATH: HTTP/1.1 GET of PATH with keep-alive (as --http-get PATH).
    #[arg(value_name = "HOST:PORT|URL")]
    pub target: String,

    /// Connections to hold open.
    #[arg(short = 'c', long, value_name = "N", default_value_t = 1)]
    pub connections: u64,

    /// New connections per second while opening them (and when reopening).
    #[arg(long, value_name = "N", default_value_t = 1000.0)]
    pub connect_rate: f64,

    /// A connect not finished after this long fails (and is retried).
    #[arg(long, value_name = "DURATION", default_value = "3s")]
    pub connect_timeout: String,

    /// Retries of a failed connect while opening, per connection (all are counted).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub connect_retries: u32,

    /// Source addresses, used in turn: a list of IPs and/or CIDR prefixes
    /// (10.0.0.0/28,10.0.1.5). Each must be on this host; ports are chosen at connect time
    /// (IP_BIND_ADDRESS_NO_PORT), so each address brings a whole local port range.
    #[arg(long, value_name = "LIST")]
    pub source: Option<String>,

    /// Queries per second in all, spread over the connections. A run needs a rate (or steps
    /// or a ramp), or --hold.
    #[arg(short = 'r', long, value_name = "QPS")]
    pub rate: Option<f64>,

    /// Only open the connections and hold them idle for --duration, sending no queries (the
    /// report counts connections; without a rate and without --hold a run is refused, since
    /// one that sends nothing is rarely what was meant).
    #[arg(long, conflicts_with_all = ["rate", "rate_steps", "ramp", "queries"])]
    pub hold: bool,

    /// Arrival process of the queries: poisson (exponential gaps, as tcpclient) or constant.
    #[arg(long, value_name = "KIND", default_value = "poisson")]
    pub arrivals: ArrivalsArg,

    /// Seed of the Poisson arrivals (runs with the same seed send at the same times); 42 if
    /// not given. Constant arrivals have no randomness: --seed with them is refused.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Rate steps, one after the other: "10s:1000,10s:5000" (the last rate holds after them;
    /// without --duration the run lasts the steps' sum).
    #[arg(long, value_name = "STEPS")]
    pub rate_steps: Option<String>,

    /// A linear rate ramp: "1000..100000/60s" (then the last rate holds; without --duration
    /// the run lasts the ramp).
    #[arg(long, value_name = "FROM..TO/DURATION")]
    pub ramp: Option<String>,

    /// As --duration (tcpclient's -t): how long the whole run may last, opening the
    /// connections included (10, 10s, 500ms, 2m).
    #[arg(short = 't', value_name = "DURATION", value_parser = duration_arg, conflicts_with = "duration")]
    pub t: Option<Duration>,

    /// Stop after N queries in all.
    #[arg(short = 'n', long, value_name = "N")]
    pub queries: Option<u64>,

    /// Close and reopen a connection after K queries on it (connection churn).
    #[arg(long, value_name = "K")]
    pub queries_per_conn: Option<u64>,

    /// DNS over TCP (the default payload): 2-byte length prefix, per-connection IDs, answers
    /// matched by ID in any order, RCODEs counted.
    #[arg(long)]
    pub dns: bool,

    /// DNS over UDP instead of TCP (dnsperf's default): -c connected UDP sockets, one query
    /// per datagram at the rate, answers matched by ID; a query unanswered after --timeout is
    /// a timeout (--dns; refused with another payload).
    #[arg(long, conflicts_with_all = NOT_DNS)]
    pub udp: bool,

    /// Write up to N queries that are due at once on one connection in one write (default 1:
    /// one write, and one TCP segment, per query, as a real client sends them). Several
    /// queries in one segment is not what a client sends, and with --delayed-ack it puts two
    /// answers of a connection in flight together at once, which leaves a server that writes
    /// small answers with Nagle on (unbound) answering one query late for the rest of the run
    /// (see --delayed-ack). Use it only to reach rates one write per query cannot (echo,
    /// benchmarks of the server's throughput). Not with --udp.
    #[arg(long, value_name = "N", default_value_t = 1, conflicts_with = "udp")]
    pub coalesce: usize,

    /// Leave TCP's delayed ACK on answers, as the kernel does by default (and dnsperf). By
    /// default load acknowledges answers at once (TCP_QUICKACK, set again after each read that
    /// leaves queries of the connection outstanding: the kernel drops it by itself). Why: a
    /// server that writes small answers with Nagle on (unbound) sends an answer only once the
    /// one before it is acknowledged; with delayed ACKs that waits for this client's next
    /// query, so after any stall that put two answers of a connection in flight together the
    /// connection is answered one query late for the rest of the run, and the latency measured
    /// is the gap between its queries, not the server. The cost of the default: one setsockopt
    /// per such read and an ACK segment of its own where one would have ridden on the next
    /// query; at top rate a read takes many answers, and against tcpkit echo --dns the
    /// rate reached and the CPU per query stayed within 3 % of --delayed-ack's. Not with --udp.
    #[arg(long, conflicts_with = "udp")]
    pub delayed_ack: bool,

    /// Name to query (--dns; refused with another payload).
    #[arg(long, value_name = "NAME", default_value = "example.com", conflicts_with_all = NOT_DNS)]
    pub qname: String,

    /// Queries to send in turn, one per line: a name (asked with --qtype) or, as in dnsperf's
    /// query files, a name and a type (`example.com AAAA`); blank lines and comments (from ;
    /// or #) are skipped (--dns; refused with another payload).
    #[arg(long, value_name = "FILE", conflicts_with = "qname", conflicts_with_all = NOT_DNS)]
    pub qname_file: Option<PathBuf>,

    /// Query type (--dns): A, AAAA, MX, TXT, ..., or a number (refused with another payload).
    #[arg(long, value_name = "TYPE", default_value = "A", conflicts_with_all = NOT_DNS)]
    pub qtype: String,

    /// N random bytes per query; the answer must be the same bytes (checked).
    #[arg(long, value_name = "N")]
    pub echo_bytes: Option<u32>,

    /// Send the bytes of FILE as each query; the answer ends after --response-len bytes or at
    /// --response-delim.
    #[arg(long, value_name = "FILE")]
    pub payload_file: Option<PathBuf>,

    /// Answers to --payload-file queries are N bytes long.
    #[arg(
        long,
        value_name = "N",
        requires = "payload_file",
        conflicts_with = "response_delim"
    )]
    pub response_len: Option<u64>,

    /// Answers to --payload-file queries end with STR (escapes \r \n \t \\ \xHH).
    #[arg(long, value_name = "STR", requires = "payload_file")]
    pub response_delim: Option<String>,

    /// Redis PING (RESP); the answer must be +PONG (a -ERR line is counted as ERR).
    #[arg(long)]
    pub redis_ping: bool,

    /// HTTP/1.1 GET of PATH with keep-alive and a Host header; answers end by Content-Length
    /// or chunked encoding; status codes counted.
    #[arg(long, value_name = "PATH")]
    pub http_get: Option<String>,

    /// An HTTP header sent with every request, `Name: value` (wrk's -H; repeatable); one
    /// named as a default (Host, User-Agent, Connection) takes its place. Only with HTTP (a
    /// URL target or --http-get).
    #[arg(short = 'H', long, value_name = "'NAME: VALUE'")]
    pub header: Vec<String>,

    /// --tls and its flags: DNS over TLS, HTTPS, and TLS under the other TCP payloads.
    #[command(flatten)]
    pub tls: crate::tls_flags::LoadTls,

    /// wrk2's flags, which mean other things here or do not exist: accepted only to answer a
    /// wrk2 command line with the one to write instead (see [`wrk2_hint`]).
    #[command(flatten)]
    pub wrk2: Box<Wrk2Flags>,

    /// A query unanswered after this long counts as a timeout; also the longest wait for
    /// answers after the last query.
    #[arg(long, value_name = "DURATION", default_value = "2s")]
    pub timeout: String,

    /// Write one CSV line per query and answer to FILE (columns:
    /// type,timestamp,connection_id,query_id,intended_ns,sent_ns,latency_us,rtt_us), from a
    /// thread of its own; lines it cannot keep up with are dropped and counted. With several
    /// processes each writes FILE.K. (tcpclient's -R; the rate is -r: `-R 200` writes a file
    /// named 200, and says so on stderr.)
    #[arg(short = 'R', long, value_name = "FILE")]
    pub per_query: Option<PathBuf>,

    /// Write an HdrHistogram interval log (one line per second and thread, tags "intended" and
    /// "sent") to FILE. With several processes each writes FILE.K.
    #[arg(long, value_name = "FILE")]
    pub hdr_log: Option<PathBuf>,

    /// Event-loop threads per process (default: one per core); connections and rate are
    /// shared out between them.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Worker processes (default: as many as the file-descriptor limit needs); connections and
    /// rate are shared out and the run reports as one.
    #[arg(long, value_name = "N")]
    pub procs: Option<u32>,

    /// --duration: the length of the query phase (after the connections are open); --stats:
    /// the live line (connections open, sent/s, answered/s, errors, timeouts, lag).
    #[command(flatten)]
    pub run: RunFlags,

    #[command(flatten)]
    pub out: OutputFlags,

    /// --barrier, --barrier-key, --shard: one agent of a fleet run (`tcpkit barrier`).
    #[command(flatten)]
    pub fleet: crate::fleet::AgentFlags,

    /// Pass/fail limits on this run (all its processes), as `merge` judges a fleet's.
    #[command(flatten)]
    pub limits: LimitFlags,

    /// Internal: this process is worker K of N (with T threads) started by the parent.
    #[arg(long, value_name = "K/N/T", hide = true)]
    pub worker: Option<String>,

    /// Draw the run into FILE, an SVG picture (so FILE must end in .svg), titled with the
    /// target, the asked rate and the connections: latency by percentile as wrk2 -U and HdrHistogram's
    /// plotter show it (corrected, from the intended send time, and uncorrected), then latency
    /// p50/p99 and the rate achieved, per second. Taken from the --hdr-log interval log
    /// (FILE.hlog, removed afterwards, when --hdr-log is not given).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// wrk2's flags that load does not have (hidden): each found makes the command line wrk2's.
#[derive(Debug, clap::Args)]
pub struct Wrk2Flags {
    /// wrk2's duration (here -t or --duration).
    #[arg(short = 'd', value_name = "DURATION", hide = true)]
    pub d: Option<String>,
    /// wrk2's latency table (printed here always).
    #[arg(long, hide = true)]
    pub latency: bool,
    /// wrk2's uncorrected latency table (printed here always).
    #[arg(short = 'U', long = "u_latency", hide = true)]
    pub u: bool,
    /// wrk2's batch latency.
    #[arg(short = 'B', long = "batch_latency", hide = true)]
    pub b: bool,
    /// wrk's Lua script (none here).
    #[arg(short = 's', long, value_name = "SCRIPT", hide = true)]
    pub script: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ArrivalsArg {
    Poisson,
    Constant,
}

fn usage(msg: impl Into<String>) -> Failure {
    Failure::Usage(msg.into())
}

fn duration(flag: &str, text: &str) -> Result<Duration, Failure> {
    common::duration(flag, text)
}

fn positive(flag: &str, v: f64) -> Result<f64, Failure> {
    if !v.is_finite() || v <= 0.0 {
        return Err(usage(format!("{flag} {v}: must be a positive number")));
    }
    Ok(v)
}

/// `K/N/T`: worker K (from 0) of N, with T threads (the parent always says T).
fn parse_worker(text: &str) -> Result<(u32, u32, usize), Failure> {
    match tcpkit_workers::WorkerId::parse(text) {
        Ok(tcpkit_workers::WorkerId {
            k,
            n,
            threads: Some(t),
        }) => Ok((k, n, t)),
        _ => Err(usage(format!(
            "--worker '{text}': expected K/N/T with K < N and T >= 1"
        ))),
    }
}

/// A file named by `flag` that cannot be read: a usage error (exit 2, nothing run), one line
/// naming the flag, the file and why.
fn file_error(flag: &str, f: &Path, e: &std::io::Error) -> Failure {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        std::io::ErrorKind::InvalidData => "not text (UTF-8)".to_string(),
        std::io::ErrorKind::IsADirectory => "a directory, not a file".to_string(),
        _ => e.to_string(),
    };
    usage(format!("{flag} {}: {why}", f.display()))
}

/// The payload flags into a [`Payload`].
fn payload(a: &Args) -> Result<Payload, Failure> {
    let url = url_target(&a.target)?;
    if let Some((_, path, _)) = &url {
        if let Some(other) = other_payload(a) {
            return Err(usage(format!(
                "{other}: the target {} is a URL, which asks for HTTP GET; give HOST:PORT for another payload",
                a.target
            )));
        }
        return http_payload(a, path);
    }
    if let Some(n) = a.echo_bytes {
        if !(1..=1 << 20).contains(&n) {
            return Err(usage(format!("--echo-bytes {n}: must be 1 to 1048576")));
        }
        return Ok(Payload::Echo { len: n });
    }
    if let Some(f) = &a.payload_file {
        let query = std::fs::read(f).map_err(|e| file_error("--payload-file", f, &e))?;
        if query.is_empty() {
            return Err(usage(format!(
                "--payload-file {}: the file is empty",
                f.display()
            )));
        }
        let end = match (a.response_len, &a.response_delim) {
            (Some(0), _) => return Err(usage("--response-len 0: must be at least 1")),
            (Some(n), _) => ResponseEnd::Len(n),
            (None, Some(d)) => {
                let d = unescape(d).map_err(|e| usage(format!("--response-delim {d:?}: {e}")))?;
                if d.is_empty() {
                    return Err(usage("--response-delim: must not be empty"));
                }
                ResponseEnd::Delim(d)
            }
            (None, None) => {
                return Err(usage(
                    "--payload-file needs --response-len N or --response-delim STR to know where an answer ends",
                ))
            }
        };
        return Ok(Payload::File { query, end });
    }
    if a.redis_ping {
        return Ok(Payload::RedisPing);
    }
    if let Some(path) = &a.http_get {
        if !path.starts_with('/')
            || path
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(usage(format!(
                "--http-get {path:?}: expected an absolute path without spaces, like /index.html"
            )));
        }
        return http_payload(a, path);
    }
    if !a.header.is_empty() {
        return Err(usage(
            "-H/--header: only with HTTP (a target http://HOST:PORT/PATH, or --http-get PATH)",
        ));
    }
    let qtype = lib::qtype_from_str(&a.qtype).map_err(|e| usage(format!("--qtype: {e}")))?;
    let queries = match &a.qname_file {
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|e| file_error("--qname-file", f, &e))?;
            let queries = query_lines(&text, qtype)
                .map_err(|e| usage(format!("--qname-file {} {e}", f.display())))?;
            if queries.is_empty() {
                return Err(usage(format!(
                    "--qname-file {}: no names in it",
                    f.display()
                )));
            }
            match common::shard(a.fleet.shard.as_deref())? {
                Some(s) => lib::shard_names(queries, s)
                    .map_err(|e| usage(format!("--qname-file {}: {e}", f.display())))?,
                None => queries,
            }
        }
        None => vec![(
            a.qname
                .parse::<lib::DnsName>()
                .map_err(|e| usage(format!("--qname: {e}")))?,
            qtype,
        )],
    };
    Ok(Payload::Dns { queries })
}

/// The payload flag given besides a URL target, if any (a URL asks for HTTP GET).
fn other_payload(a: &Args) -> Option<&'static str> {
    [
        (a.dns, "--dns"),
        (a.echo_bytes.is_some(), "--echo-bytes"),
        (a.payload_file.is_some(), "--payload-file"),
        (a.redis_ping, "--redis-ping"),
        (a.http_get.is_some(), "--http-get"),
        (a.udp, "--udp"),
        (a.qname_file.is_some(), "--qname-file"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag))
}

/// HTTP GET of `path` at the target, with the -H headers (checked: `Name: value`, no line
/// breaks). The Host header is the target's host, with its port unless it is 80 (as wrk).
fn http_payload(a: &Args, path: &str) -> Result<Payload, Failure> {
    for h in &a.header {
        let name = h.split_once(':').map(|(n, _)| n);
        let bad_name = name.is_none_or(|n| {
            n.is_empty()
                || n.bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        });
        if bad_name || h.bytes().any(|b| b == b'\r' || b == b'\n') {
            return Err(usage(format!(
                "-H {h:?}: expected 'Name: value' on one line, like -H 'Accept: text/html'"
            )));
        }
    }
    let (authority, https) = match url_target(&a.target)? {
        Some((authority, _, https)) => (authority, https),
        None => (a.target.clone(), a.tls.tls),
    };
    // The port is left out of Host when it is the scheme's own (as wrk and curl do).
    let default_port = if https { ":443" } else { ":80" };
    let host = authority
        .strip_suffix(default_port)
        .unwrap_or(&authority)
        .to_string();
    Ok(Payload::HttpGet {
        path: path.to_string(),
        host,
        headers: a.header.clone(),
    })
}

/// A URL target as wrk takes it: `http://HOST[:PORT][/PATH]` into `HOST:PORT` (port 80 when
/// none is given) and PATH (`/` when none); `https://` the same over TLS (port 443 by
/// default), returned as true. None for a target that is no URL.
fn url_target(target: &str) -> Result<Option<(String, String, bool)>, Failure> {
    let Some((scheme, rest)) = target.split_once("://") else {
        return Ok(None);
    };
    let https = scheme.eq_ignore_ascii_case("https");
    if !(https || scheme.eq_ignore_ascii_case("http")) {
        return Err(usage(format!(
            "{target}: load speaks http:// and https://; give http(s)://HOST:PORT/PATH or HOST:PORT"
        )));
    }
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    if path
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(usage(format!(
            "{target}: the path has a space or a control byte"
        )));
    }
    let has_port = if authority.starts_with('[') {
        authority.contains("]:")
    } else {
        authority.contains(':')
    };
    let authority = if has_port {
        authority.to_string()
    } else if https {
        format!("{authority}:443")
    } else {
        format!("{authority}:80")
    };
    Ok(Some((authority, path, https)))
}

/// For a wrk2 command line (one of its flags that load lacks, or `-R N` as the rate with no
/// -r): the line to write instead, said in one line. wrk2's -t (threads) is load's
/// duration, -d is -t, -R is -r; --latency and -U are printed always; -s has no equal.
pub fn wrk2_hint(a: &Args) -> Option<String> {
    let w = &a.wrk2;
    let rate_as_r = a
        .per_query
        .as_ref()
        .and_then(|p| p.to_str())
        .and_then(|p| p.parse::<f64>().ok().map(|_| p.to_string()))
        .filter(|_| a.rate.is_none() && a.rate_steps.is_none() && a.ramp.is_none());
    let mut seen = Vec::new();
    if let Some(d) = &w.d {
        seen.push(format!("-d {d}"));
    }
    if let Some(r) = &rate_as_r {
        seen.push(format!("-R {r}"));
    }
    for (on, flag) in [
        (w.latency, "--latency"),
        (w.u, "-U"),
        (w.b, "-B"),
        (w.script.is_some(), "-s"),
    ] {
        if on {
            seen.push(flag.to_string());
        }
    }
    if seen.is_empty() {
        return None;
    }
    let mut line = format!("tcpkit load {} -c {}", a.target, a.connections);
    if let Some(t) = a.t.filter(|t| t.subsec_nanos() == 0 && t.as_secs() > 0) {
        // wrk2's -tN is N threads.
        line.push_str(&format!(" --threads {}", t.as_secs()));
    }
    match (&w.d, a.run.duration) {
        (Some(d), _) => line.push_str(&format!(" -t {d}")),
        (None, Some(d)) => line.push_str(&format!(" -t {}s", d.as_secs_f64())),
        _ => {}
    }
    match (&rate_as_r, a.rate) {
        (Some(r), _) => line.push_str(&format!(" -r {r}")),
        (None, Some(r)) => line.push_str(&format!(" -r {r}")),
        _ => {}
    }
    for h in &a.header {
        line.push_str(&format!(" -H '{h}'"));
    }
    if a.timeout != "2s" {
        line.push_str(&format!(" --timeout {}", a.timeout));
    }
    let script = if w.script.is_some() {
        " (no Lua scripts: -H adds headers)"
    } else {
        ""
    };
    Some(format!(
        "{} is wrk2's command line, whose flags mean other things here (-t is the duration, -R a per-query CSV file, both latency tables are always printed){script}: write `{line}`",
        seen.join(" ")
    ))
}

/// The lines of a query file: `name` (asked as `qtype`) or dnsperf's `name type`; blank lines
/// and comments (`;` as in dnsperf and zone files, `#`) skipped. Errors name the line.
fn query_lines(text: &str, qtype: u16) -> Result<Vec<(lib::DnsName, u16)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}", n + 1);
        let l = line.split(['#', ';']).next().unwrap_or("");
        let mut words = l.split_whitespace();
        let Some(name) = words.next() else { continue };
        let name = name
            .parse::<lib::DnsName>()
            .map_err(|e| at(e.to_string()))?;
        let t = match words.next() {
            Some(t) => lib::qtype_from_str(t).map_err(|e| at(e.to_string()))?,
            None => qtype,
        };
        if let Some(extra) = words.next() {
            return Err(at(format!(
                "'{extra}': expected a name and at most a type (dnsperf's `name type`)"
            )));
        }
        out.push((name, t));
    }
    Ok(out)
}

/// Every check that involves more than one flag, or a value's meaning, happens here. The
/// target is resolved here too (an unresolvable name is a runtime error, exit 1).
pub fn resolve(a: &Args) -> Result<Config, Failure> {
    if let Some(hint) = wrk2_hint(a) {
        return Err(usage(hint));
    }
    let shard = common::shard(a.fleet.shard.as_deref())?;
    // A URL's HOST:PORT is what is connected to; the report shows the URL as typed.
    let (addr_text, https) = match url_target(&a.target)? {
        Some((authority, _, https)) => (authority, https),
        None => (a.target.clone(), false),
    };
    check_target(&addr_text).map_err(|why| usage(format!("{}: {why}", a.target)))?;
    let payload = payload(a)?;
    if a.connections == 0 {
        return Err(usage("-c 0: at least one connection"));
    }
    let connect_rate = positive("--connect-rate", a.connect_rate)?;
    let rate = match (&a.rate, &a.rate_steps, &a.ramp) {
        (Some(r), _, _) => Some(RateProfile::Constant(positive("--rate", *r)?)),
        (_, Some(s), _) => Some(parse_steps(s).map_err(|e| usage(format!("--rate-steps {e}")))?),
        (_, _, Some(r)) => Some(parse_ramp(r).map_err(|e| usage(format!("--ramp {e}")))?),
        _ => None,
    };
    if rate.is_none() && a.queries.is_some() {
        return Err(usage(
            "-n/--queries needs a rate (-r, --rate-steps or --ramp)",
        ));
    }
    if rate.is_none() && !a.hold {
        // wrk2's users type -R for the rate; a run that sends nothing exits 0 with a table
        // of nothing unless told apart from a mistake.
        return Err(usage(
            "no rate: -r QPS (or --rate-steps, --ramp) sets the queries per second; to only open connections and hold them, say --hold",
        ));
    }
    if a.queries == Some(0) {
        return Err(usage("-n 0: at least one query"));
    }
    if a.queries_per_conn == Some(0) {
        return Err(usage("--queries-per-conn 0: at least one query"));
    }
    if let Some(t) = a.threads {
        if !(1..=256).contains(&t) {
            return Err(usage(format!("--threads {t}: must be 1 to 256")));
        }
    }
    if let Some(p) = a.procs {
        if !(1..=lib::MAX_PROCS).contains(&p) {
            return Err(usage(format!(
                "--procs {p}: must be 1 to {}",
                lib::MAX_PROCS
            )));
        }
    }
    let timeout = duration("--timeout", &a.timeout)?;
    if timeout.is_zero() {
        return Err(usage("--timeout: must be above 0"));
    }
    let connect_timeout = duration("--connect-timeout", &a.connect_timeout)?;
    if connect_timeout.is_zero() {
        return Err(usage("--connect-timeout: must be above 0"));
    }
    let dur = a.t.or(a.run.duration);
    if dur.is_some_and(|d| d.is_zero()) {
        return Err(usage("--duration: must be above 0"));
    }
    let addr = lib::resolve_target(&addr_text).map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    let mut cfg = Config::new(a.target.clone(), addr);
    cfg.connections = a.connections;
    cfg.connect_rate = connect_rate;
    cfg.connect_timeout = connect_timeout;
    cfg.retries = a.connect_retries;
    if let Some(s) = &a.source {
        cfg.sources = parse_sources(s).map_err(|e| usage(format!("--source {e}")))?;
        if let Some(bad) = cfg.sources.iter().find(|s| s.is_ipv4() != addr.is_ipv4()) {
            return Err(usage(format!(
                "--source {bad}: not the address family of {addr}"
            )));
        }
    }
    cfg.rate = rate;
    cfg.arrivals = match a.arrivals {
        ArrivalsArg::Poisson => ArrivalKind::Poisson {
            seed: a.seed.unwrap_or(42),
        },
        ArrivalsArg::Constant if a.seed.is_some() => {
            return Err(usage(
                "--seed: constant arrivals have no randomness to seed (--seed is for --arrivals poisson)",
            ))
        }
        ArrivalsArg::Constant => ArrivalKind::Constant,
    };
    cfg.duration = dur;
    cfg.queries = a.queries;
    cfg.queries_per_conn = a.queries_per_conn;
    let http = matches!(payload, Payload::HttpGet { .. });
    cfg.tls = a.tls.resolve(&addr_text, https, http)?;
    cfg.payload = payload;
    cfg.udp = a.udp;
    if !(1..=1024).contains(&a.coalesce) {
        return Err(usage(format!(
            "--coalesce {}: must be 1 to 1024",
            a.coalesce
        )));
    }
    cfg.coalesce = a.coalesce;
    cfg.quickack = !a.delayed_ack;
    cfg.timeout = timeout;
    if let Some(p) = &a.plot {
        check_plot_name(p)?;
    }
    cfg.per_query = a.per_query.clone();
    // --plot draws the per-second panels from the interval log: one is kept when none is asked.
    cfg.hdr_log = a
        .hdr_log
        .clone()
        .or_else(|| a.plot.as_deref().map(plot_log));
    cfg.threads = a.threads.unwrap_or(0);
    cfg.procs = a.procs.map_or(Procs::Auto, Procs::Fixed);
    if let Some(w) = &a.worker {
        let (k, n, t) = parse_worker(w)?;
        cfg.worker = Some((k, n));
        cfg.threads = t;
    }
    if let Some(s) = shard {
        cfg.take_shard(s).map_err(usage)?;
    }
    // A worker is started with the same arguments (plus --worker); its parent talks to the
    // barrier and releases it at the barrier's start.
    cfg.worker_argv = std::env::args_os().skip(1).collect::<Vec<_>>();
    cfg.gated = a.fleet.barrier.is_some();
    Ok(cfg)
}

/// The live line: connections open, sent and answered per second since the last line,
/// errors, timeouts, lag.
fn live_line(now: LiveTotals, prev: &mut (LiveTotals, Duration), elapsed: Duration) -> String {
    let dt = elapsed.saturating_sub(prev.1).as_secs_f64();
    let rate = |a: u64, b: u64| {
        if dt > 0.0 {
            a.saturating_sub(b) as f64 / dt
        } else {
            0.0
        }
    };
    let line = format!(
        "conns {} open | sent {:.0}/s | answered {:.0}/s | errors {} | timeouts {} | lag {:.1} ms",
        now.open,
        rate(now.sent, prev.0.sent),
        rate(now.answered, prev.0.answered),
        now.errors,
        now.timeouts,
        now.lag_ns as f64 / 1e6
    );
    *prev = (now, elapsed);
    line
}

/// The warning for `-R NUMBER`: wrk2's rate flag is tcpclient's per-query file here.
fn per_query_warning(a: &Args) -> Option<String> {
    let p = a.per_query.as_ref()?.to_str()?;
    p.parse::<f64>().ok()?;
    Some(format!(
        "warning: -R {p} writes per-query lines to a CSV file named {p} (tcpclient's -R); the rate flag is -r (-r {p} for {p} queries per second)"
    ))
}

/// The interval log `--plot FILE` reads when no --hdr-log is given: FILE.hlog (with several
/// processes each writes FILE.hlog.K). Worker processes compute the same name.
fn plot_log(svg: &Path) -> PathBuf {
    let mut s = svg.as_os_str().to_os_string();
    s.push(".hlog");
    s.into()
}

/// `--plot`'s file must be named .svg (tcpkit-stats says why).
fn check_plot_name(p: &Path) -> Result<(), Failure> {
    tcpkit_stats::plot::check_name(p).map_err(usage)
}

/// The plot's title: the target, and what was asked (rate, connections), so that two
/// pictures side by side say which run each is.
fn plot_title(a: &Args, report: &LoadReport) -> String {
    let rate = match (a.rate, &a.rate_steps, &a.ramp) {
        (Some(r), _, _) => format!("{r} q/s"),
        (_, Some(steps), _) => format!("rate steps {steps} q/s"),
        (_, _, Some(ramp)) => format!("ramp {ramp} q/s"),
        _ => "no rate".into(),
    };
    let conns = report.connections.asked;
    format!(
        "tcpkit load: {}, {rate} asked over {conns} connection{}",
        report.target,
        if conns == 1 { "" } else { "s" }
    )
}

/// `--plot`: the whole run's histograms from the report, the per-second ones from the log.
fn plot(
    svg: &Path,
    log: &Path,
    temporary: bool,
    title: &str,
    report: &LoadReport,
) -> Result<(), Failure> {
    let logs = lib::hdr_logs(log);
    let fail = |what: String| Failure::Runtime(format!("--plot {}: {what}", svg.display()));
    let timeline = tcpkit_stats::plot::timeline_from_hdr_logs(&logs, "intended").map_err(|e| {
        fail(format!(
            "cannot read the interval log {}: {e}",
            log.display()
        ))
    });
    if temporary {
        for l in &logs {
            let _ = std::fs::remove_file(l);
        }
    }
    let hist = |b64: &str| {
        Histogram::from_base64(b64).map_err(|e| fail(format!("the report's histogram: {e}")))
    };
    let corrected = hist(&report.histograms.intended)?;
    let uncorrected = hist(&report.histograms.sent)?;
    tcpkit_stats::plot::load_svg(svg, title, &corrected, &uncorrected, &timeline?)
        .map_err(|e| fail(format!("cannot write: {e}")))
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    // A fleet agent joins first, so that whatever keeps it from getting ready (a file it
    // cannot read, a limit) reaches the barrier, which fails the fleet run naming it.
    let agent = match &args.worker {
        None => args.fleet.join(interrupt)?.map(Arc::new),
        Some(_) => None,
    };
    let not_ready = |f: Failure| crate::fleet::not_ready(agent.as_deref(), f);
    let mut cfg = resolve(&args).map_err(not_ready)?;
    // A picture that cannot be written is found out before the run, not after it.
    if let (Some(p), None) = (&args.plot, &cfg.worker) {
        tcpkit_stats::plot::check_path(p)
            .map_err(|e| not_ready(usage(format!("--plot {}: cannot create: {e}", p.display()))))?;
    }
    cfg.fleet = agent.clone();
    if cfg.worker.is_none() && cfg.tls.as_ref().is_some_and(|t| t.insecure) {
        eprintln!("tcpkit load: --insecure: no TLS certificate is checked; the server is whoever answers (use --tls-ca FILE to check a lab certificate)");
    }
    let live = Arc::new(LoadCounters::new());
    if cfg.worker.is_none() {
        if let Some(w) = per_query_warning(&args) {
            eprintln!("tcpkit load: {w}");
        }
    }
    if cfg.worker.is_some() {
        // A worker talks JSON lines to its parent; the library prints them.
        return lib::run(&cfg, interrupt, &live, &|_| {})
            .map(drop)
            .map_err(|e| Failure::Runtime(crate::chain(&e)));
    }
    let stats_every = args.run.stats.filter(|d| !d.is_zero());
    let mut monitor = {
        let live = Arc::clone(&live);
        let prev = Mutex::new((LiveTotals::default(), Duration::ZERO));
        Monitor::start(
            MonitorOptions {
                stats_every,
                progress: args.out.progress(),
            },
            move |elapsed| {
                let mut p = prev.lock().unwrap_or_else(|e| e.into_inner());
                live_line(live.totals(), &mut p, elapsed)
            },
        )
    };
    // Each limit's hint once, when first hit (as echo does); the summary repeats them.
    let hint = |h: &str| eprintln!("tcpkit load: {h}");
    let result = lib::run(&cfg, interrupt, &live, &hint);
    monitor.stop();
    if let (Err(_), Some(p)) = (&result, &args.plot) {
        // The run did not happen: no picture, not an empty file.
        let _ = std::fs::remove_file(p);
    }
    let report = result.map_err(|e| {
        not_ready(if e.is_usage() {
            Failure::Usage(crate::chain(&e))
        } else {
            Failure::Runtime(crate::chain(&e))
        })
    })?;
    let plotted = match (&args.plot, &cfg.hdr_log) {
        (Some(svg), Some(log)) => plot(
            svg,
            log,
            args.hdr_log.is_none(),
            &plot_title(&args, &report),
            &report,
        ),
        _ => Ok(()),
    };
    let mut report = report;
    if report.failure.is_none() && interrupt.load(std::sync::atomic::Ordering::Relaxed) {
        // Stopped before it did what was asked: the report is printed, the run failed.
        report.failure = Some("interrupted".into());
    }
    // The limits last: a broken one is the end of the last line.
    report.judge_limits(&args.limits.limits());
    if let (Some(a), Some(f)) = (&agent, &report.fleet) {
        a.done(f.actual_start_unix_ns, report.failure.as_deref());
    }
    common::finish(&report, &args.out)?;
    plotted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        common::resolved(&[&["load"], args].concat(), resolve)
    }

    #[test]
    fn defaults() {
        let c = parse(&["127.0.0.1:53", "--hold"]).unwrap();
        assert_eq!(c.connections, 1);
        assert_eq!(c.connect_rate, 1000.0);
        assert_eq!(c.connect_timeout, Duration::from_secs(3));
        assert_eq!(c.retries, 3);
        assert_eq!(c.arrivals, ArrivalKind::Poisson { seed: 42 });
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert!(c.rate.is_none());
        assert_eq!(c.procs, Procs::Auto);
        assert_eq!(c.payload.describe(), "dns A example.com");
    }

    #[test]
    fn every_flag_parses() {
        let dir = tempfile::tempdir().unwrap();
        let names = dir.path().join("names");
        std::fs::write(&names, "a.example\n# comment\nb.example\n").unwrap();
        let names = names.to_str().unwrap();
        let c = parse(&[
            "127.0.0.1:53",
            "-c",
            "10",
            "--connect-rate",
            "50",
            "--connect-timeout",
            "500ms",
            "--connect-retries",
            "1",
            "--source",
            "127.0.0.1,127.0.0.2/31",
            "-r",
            "100",
            "--arrivals",
            "constant",
            "-t",
            "3",
            "-n",
            "20",
            "--queries-per-conn",
            "5",
            "--dns",
            "--qname-file",
            names,
            "--qtype",
            "AAAA",
            "--timeout",
            "1.5",
            "-R",
            "/tmp/q.csv",
            "--hdr-log",
            "/tmp/h.hlog",
            "--threads",
            "2",
            "--procs",
            "3",
            "--stats",
            "1",
            "--json",
        ])
        .unwrap();
        assert_eq!(c.connections, 10);
        assert_eq!(c.connect_rate, 50.0);
        assert_eq!(c.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.retries, 1);
        assert_eq!(c.sources.len(), 3);
        assert_eq!(c.rate, Some(RateProfile::Constant(100.0)));
        assert_eq!(c.arrivals, ArrivalKind::Constant);
        assert_eq!(c.duration, Some(Duration::from_secs(3)));
        assert_eq!(c.queries, Some(20));
        assert_eq!(c.queries_per_conn, Some(5));
        assert_eq!(c.payload.describe(), "dns AAAA, 2 names");
        assert_eq!(c.timeout, Duration::from_millis(1500));
        assert_eq!(c.per_query, Some(PathBuf::from("/tmp/q.csv")));
        assert_eq!(c.hdr_log, Some(PathBuf::from("/tmp/h.hlog")));
        assert_eq!(c.threads, 2);
        assert_eq!(c.procs, Procs::Fixed(3));
        let c = parse(&["127.0.0.1:53", "--seed", "7", "--rate", "1"]).unwrap();
        assert_eq!(c.arrivals, ArrivalKind::Poisson { seed: 7 });
        let c = parse(&[
            "127.0.0.1:53",
            "--qname",
            "x.test",
            "--qtype",
            "MX",
            "-r",
            "1",
        ])
        .unwrap();
        assert_eq!(c.payload.describe(), "dns TYPE15 x.test");
    }

    #[test]
    fn payloads_parse() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("q");
        std::fs::write(&f, "hello").unwrap();
        let f = f.to_str().unwrap();
        let c = parse(&["127.0.0.1:7", "--echo-bytes", "64", "-r", "1"]).unwrap();
        assert!(matches!(c.payload, Payload::Echo { len: 64 }));
        let c = parse(&[
            "127.0.0.1:7",
            "--payload-file",
            f,
            "--response-len",
            "9",
            "-r",
            "1",
        ])
        .unwrap();
        assert!(matches!(
            c.payload,
            Payload::File {
                end: ResponseEnd::Len(9),
                ..
            }
        ));
        let c = parse(&[
            "127.0.0.1:7",
            "--payload-file",
            f,
            "--response-delim",
            "\\r\\n\\x00",
            "-r",
            "1",
        ])
        .unwrap();
        match c.payload {
            Payload::File {
                end: ResponseEnd::Delim(d),
                query,
            } => {
                assert_eq!(d, b"\r\n\0");
                assert_eq!(query, b"hello");
            }
            other => panic!("{other:?}"),
        }
        let c = parse(&["127.0.0.1:6379", "--redis-ping", "-r", "1"]).unwrap();
        assert!(matches!(c.payload, Payload::RedisPing));
        let c = parse(&["127.0.0.1:80", "--http-get", "/a?b=1", "-r", "1"]).unwrap();
        match c.payload {
            Payload::HttpGet { path, host, .. } => {
                assert_eq!(path, "/a?b=1");
                assert_eq!(host, "127.0.0.1");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Issue 24, item 7: wrk's URL target: HOST:PORT to connect to (80 by default), GET of
    /// the path (/ by default), the Host header as wrk sends it, -H headers along.
    #[test]
    fn url_targets_are_http_get() {
        for (url, host, path) in [
            (
                "http://127.0.0.1:8080/a/b?c=1",
                "127.0.0.1:8080",
                "/a/b?c=1",
            ),
            ("http://127.0.0.1", "127.0.0.1", "/"),
            ("http://127.0.0.1:80?x", "127.0.0.1", "/?x"),
            ("HTTP://[::1]/", "[::1]", "/"),
        ] {
            let c = parse(&[url, "-r", "1", "-H", "X-A: b"]).unwrap();
            match c.payload {
                Payload::HttpGet {
                    path: p,
                    host: h,
                    headers,
                } => {
                    assert_eq!((h.as_str(), p.as_str()), (host, path), "{url}");
                    assert_eq!(headers, ["X-A: b"]);
                }
                other => panic!("{url}: {other:?}"),
            }
            assert_eq!(c.target, url);
        }
        assert_eq!(
            parse(&["http://127.0.0.1/", "-r", "1"]).unwrap().addr,
            "127.0.0.1:80".parse().unwrap()
        );
    }

    #[test]
    fn rate_profiles_parse() {
        let c = parse(&["127.0.0.1:53", "--rate-steps", "1s:100,2s:200"]).unwrap();
        assert_eq!(
            c.rate,
            Some(RateProfile::Steps(vec![
                (Duration::from_secs(1), 100.0),
                (Duration::from_secs(2), 200.0)
            ]))
        );
        assert_eq!(c.phase_length(), Some(Duration::from_secs(3)));
        let c = parse(&["127.0.0.1:53", "--ramp", "10..1000/5s"]).unwrap();
        assert_eq!(c.phase_length(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn bad_values_are_refused_with_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("q");
        std::fs::write(&f, "x").unwrap();
        let f = f.to_str().unwrap();
        for (args, want) in [
            (vec!["127.0.0.1"], "HOST:PORT"),
            (vec!["127.0.0.1:53", "-c", "0"], "-c 0"),
            (vec!["127.0.0.1:53", "-r", "0"], "--rate"),
            (
                vec!["127.0.0.1:53", "-r", "5", "--ramp", "1..2/1s"],
                "cannot be used",
            ),
            (vec!["127.0.0.1:53", "--rate-steps", "1s"], "--rate-steps"),
            (vec!["127.0.0.1:53", "--ramp", "1..2"], "--ramp"),
            (vec!["127.0.0.1:53", "-n", "5"], "needs a rate"),
            (vec!["127.0.0.1:53", "--echo-bytes", "0"], "--echo-bytes"),
            (
                vec!["127.0.0.1:53", "--echo-bytes", "8", "--redis-ping"],
                "cannot be used",
            ),
            (vec!["127.0.0.1:53", "--payload-file", f], "--response-len"),
            (
                vec![
                    "127.0.0.1:53",
                    "--payload-file",
                    f,
                    "--response-delim",
                    "a\\",
                ],
                "--response-delim \"a\\\\\": a lone \\",
            ),
            (
                vec!["127.0.0.1:53", "--response-len", "3"],
                "--payload-file",
            ),
            (vec!["127.0.0.1:53", "--http-get", "x y"], "--http-get"),
            (vec!["127.0.0.1:53", "--qname", "a..b"], "--qname"),
            (vec!["127.0.0.1:53", "--qtype", "BOGUS"], "--qtype"),
            (vec!["127.0.0.1:53", "--timeout", "0"], "--timeout"),
            (
                vec!["127.0.0.1:53", "--source", "fd00::1"],
                "address family",
            ),
            (vec!["127.0.0.1:53", "--source", "x"], "--source"),
            (vec!["127.0.0.1:53", "--threads", "0"], "--threads"),
            (vec!["127.0.0.1:53", "--procs", "0"], "--procs"),
            (vec!["127.0.0.1:53", "-t", "soon"], "-t <DURATION>"),
            (vec!["127.0.0.1:53", "--duration", "soon"], "--duration"),
            (
                vec!["127.0.0.1:53", "--arrivals", "bursty"],
                "invalid value",
            ),
            (vec!["127.0.0.1:53", "--worker", "3/2/1"], "--worker"),
            (
                vec!["127.0.0.1:53", "--arrivals", "constant", "--seed", "7"],
                "--seed: constant arrivals have no randomness",
            ),
        ] {
            // A rate where none is given, so that each is refused for its own flag, not for
            // the missing rate (refused on its own below).
            let mut args = args.clone();
            let rated = ["-r", "--rate-steps", "--ramp", "-n"];
            if !args.iter().any(|a| rated.contains(a)) {
                args.extend(["-r", "1"]);
            }
            let e = parse(&args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    /// The DNS flags with another payload would be ignored: each is refused with each payload
    /// (by clap, so exit 2), while their defaults do not get in the way.
    #[test]
    fn dns_flags_with_another_payload_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("q");
        std::fs::write(&f, "x").unwrap();
        let f = f.to_str().unwrap();
        let others: [&[&str]; 4] = [
            &["--echo-bytes", "8"],
            &["--payload-file", f, "--response-len", "1"],
            &["--redis-ping"],
            &["--http-get", "/"],
        ];
        for other in others {
            for (flag, value, long) in [
                ("--qname", "a.test", "'--qname <NAME>'"),
                ("--qname-file", f, "'--qname-file <FILE>'"),
                ("--qtype", "AAAA", "'--qtype <TYPE>'"),
            ] {
                let mut v = vec!["load", "127.0.0.1:7", flag, value];
                v.extend_from_slice(other);
                let e = Args::try_parse_from(&v).unwrap_err();
                assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{v:?}");
                let text = e.to_string();
                assert!(
                    text.contains(long) && text.contains("cannot be used with"),
                    "{v:?}: {text}"
                );
            }
            let mut v = vec!["load", "127.0.0.1:7"];
            v.extend_from_slice(other);
            assert!(Args::try_parse_from(&v).is_ok(), "{v:?}");
        }
        // With --dns said or implied, they are what they were.
        let c = parse(&[
            "127.0.0.1:53",
            "--dns",
            "--qname",
            "a.test",
            "--qtype",
            "AAAA",
            "--hold",
        ])
        .unwrap();
        assert_eq!(c.payload.describe(), "dns AAAA a.test");
    }

    #[test]
    fn seed_only_with_poisson_arrivals() {
        let c = parse(&["127.0.0.1:53", "--seed", "9", "-r", "1"]).unwrap();
        assert_eq!(c.arrivals, ArrivalKind::Poisson { seed: 9 });
        let c = parse(&[
            "127.0.0.1:53",
            "--arrivals",
            "poisson",
            "--seed",
            "9",
            "-r",
            "1",
        ])
        .unwrap();
        assert_eq!(c.arrivals, ArrivalKind::Poisson { seed: 9 });
        let c = parse(&["127.0.0.1:53", "--arrivals", "constant", "-r", "1"]).unwrap();
        assert_eq!(c.arrivals, ArrivalKind::Constant);
        let e = parse(&[
            "127.0.0.1:53",
            "--arrivals",
            "constant",
            "--seed",
            "9",
            "-r",
            "1",
        ])
        .unwrap_err();
        assert!(e.starts_with("--seed: "), "{e}");
    }

    /// Issue 24: one write per query unless --coalesce asks for more; not with --udp, where
    /// a datagram is one query.
    #[test]
    fn coalesce_is_one_unless_asked() {
        assert_eq!(parse(&["127.0.0.1:53", "-r", "1"]).unwrap().coalesce, 1);
        let c = parse(&["127.0.0.1:53", "-r", "1", "--coalesce", "32"]).unwrap();
        assert_eq!(c.coalesce, 32);
        for bad in ["0", "1025"] {
            let e = parse(&["127.0.0.1:53", "-r", "1", "--coalesce", bad]).unwrap_err();
            assert_eq!(e, format!("--coalesce {bad}: must be 1 to 1024"));
        }
        let e =
            Args::try_parse_from(["load", "127.0.0.1:53", "--udp", "--coalesce", "4"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    /// Issue 24: answers are acknowledged at once unless --delayed-ack; not with --udp.
    #[test]
    fn quickack_unless_delayed_ack_is_asked() {
        assert!(parse(&["127.0.0.1:53", "-r", "1"]).unwrap().quickack);
        assert!(
            !parse(&["127.0.0.1:53", "-r", "1", "--delayed-ack"])
                .unwrap()
                .quickack
        );
        let e =
            Args::try_parse_from(["load", "127.0.0.1:53", "--udp", "--delayed-ack"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    /// --udp: DNS over UDP, and only DNS.
    #[test]
    fn udp_is_dns_only() {
        let c = parse(&["127.0.0.1:53", "--udp", "-r", "1"]).unwrap();
        assert!(c.udp);
        assert!(!parse(&["127.0.0.1:53", "-r", "1"]).unwrap().udp);
        let e = Args::try_parse_from(["load", "127.0.0.1:7", "--udp", "--echo-bytes", "8"])
            .unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    /// Issue 10, case 6: a run that sends nothing is refused unless it says --hold, which
    /// itself takes no rate.
    #[test]
    fn no_rate_is_refused_unless_hold() {
        let e = parse(&["127.0.0.1:53", "-t", "2", "-c", "10"]).unwrap_err();
        assert!(
            e.starts_with("no rate: -r QPS") && e.contains("--hold"),
            "{e}"
        );
        let c = parse(&["127.0.0.1:53", "-t", "2", "-c", "10", "--hold"]).unwrap();
        assert!(c.rate.is_none());
        assert_eq!(c.duration, Some(Duration::from_secs(2)));
        for rate in [
            &["-r", "5"][..],
            &["--ramp", "1..2/1s"],
            &["--rate-steps", "1s:5"],
        ] {
            let mut v = vec!["load", "127.0.0.1:53", "--hold"];
            v.extend_from_slice(rate);
            let e = Args::try_parse_from(&v).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{v:?}");
        }
    }

    /// Issue 10, case 6: `-R 200` is wrk2's rate typed into tcpclient's per-query file flag.
    #[test]
    fn per_query_file_named_like_a_number_warns() {
        let w = |v: &[&str]| {
            let mut a = vec!["load", "127.0.0.1:53"];
            a.extend_from_slice(v);
            per_query_warning(&Args::try_parse_from(a).unwrap())
        };
        assert_eq!(
            w(&["-R", "200"]).unwrap(),
            "warning: -R 200 writes per-query lines to a CSV file named 200 (tcpclient's -R); the rate flag is -r (-r 200 for 200 queries per second)"
        );
        assert!(w(&["-R", "1.5e3"]).is_some());
        assert_eq!(w(&["-R", "q.csv"]), None);
        assert_eq!(w(&["-R", "./200"]), None);
        assert_eq!(w(&[]), None);
    }

    /// dnsperf's query file (`name type` per line) and the one-name-per-line form, mixed;
    /// comments and blank lines skipped; errors name the line.
    #[test]
    fn query_files_in_dnsperf_form() {
        let q = query_lines(
            "; dnsperf comment\nwww.example A\n\n  mail.example   MX  \nplain.example\n# also\nv6.example AAAA ; trailing\n",
            28,
        )
        .unwrap();
        let got: Vec<u16> = q.iter().map(|(_, t)| *t).collect();
        assert_eq!(got, [1, 15, 28, 28]);
        assert_eq!(q[0].0, "www.example".parse().unwrap());
        assert_eq!(q[3].0, "v6.example".parse().unwrap());
        let e = query_lines("a.example A\nb.example BOGUS\n", 1).unwrap_err();
        assert!(e.starts_with("line 2: "), "{e}");
        let e = query_lines("a.example A IN\n", 1).unwrap_err();
        assert!(e.starts_with("line 1: 'IN': expected a name"), "{e}");
        // Through the flag: the payload says the types are mixed.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("queries");
        std::fs::write(&f, "www.example A\nwww.example AAAA\n").unwrap();
        let c = parse(&[
            "127.0.0.1:53",
            "-r",
            "1",
            "--qname-file",
            f.to_str().unwrap(),
        ])
        .unwrap();
        assert_eq!(c.payload.describe(), "dns mixed types, 2 names");
    }

    /// Issue 25: shard K of N takes its share; a bad K/N is a usage error naming --shard.
    #[test]
    fn shard_flag_takes_its_share() {
        let args =
            |s: &str| ["127.0.0.1:53", "-c", "10", "-r", "300", "--shard", s].map(String::from);
        let c = parse(&args("1/3").each_ref().map(String::as_str)).unwrap();
        assert_eq!(
            (c.connections, c.shard.map(|s| s.to_string())),
            (4, Some("1/3".into()))
        );
        assert_eq!(c.rate, Some(RateProfile::Constant(100.0)));
        for bad in ["0/3", "4/3", "1/0", "x"] {
            let e = parse(&args(bad).each_ref().map(String::as_str)).unwrap_err();
            assert!(e.starts_with(&format!("--shard '{bad}': ")), "{e}");
        }
    }

    #[test]
    fn worker_flag_sets_the_share() {
        let c = parse(&["127.0.0.1:53", "--worker", "1/3/2", "-r", "1"]).unwrap();
        assert_eq!(c.worker, Some((1, 3)));
        assert_eq!(c.threads, 2);
    }

    #[test]
    fn live_line_shows_rates_since_the_last_line() {
        let mut prev = (LiveTotals::default(), Duration::ZERO);
        let now = LiveTotals {
            open: 5,
            sent: 200,
            answered: 190,
            errors: 1,
            timeouts: 2,
            lag_ns: 1_500_000,
            hints: 0,
        };
        let l = live_line(now, &mut prev, Duration::from_secs(2));
        assert_eq!(
            l,
            "conns 5 open | sent 100/s | answered 95/s | errors 1 | timeouts 2 | lag 1.5 ms"
        );
    }

    #[test]
    fn plot_parses_and_keeps_an_interval_log() {
        let c = parse(&["127.0.0.1:53", "-r", "10", "--plot", "/tmp/l.svg"]).unwrap();
        assert_eq!(c.hdr_log, Some(PathBuf::from("/tmp/l.svg.hlog")));
        // A log the user asked for is the one drawn from.
        let c = parse(&[
            "127.0.0.1:53",
            "-r",
            "10",
            "--plot",
            "/tmp/l.svg",
            "--hdr-log",
            "/tmp/h.hlog",
        ])
        .unwrap();
        assert_eq!(c.hdr_log, Some(PathBuf::from("/tmp/h.hlog")));
    }
}
