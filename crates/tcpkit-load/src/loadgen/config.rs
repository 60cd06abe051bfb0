//! The resolved `load` configuration (no clap types: the binary resolves its flags into this),
//! the parsers for the values that have a syntax of their own (`--rate-steps`, `--ramp`,
//! `--source`), and the share of a fleet's run that one `--shard` takes.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use tcpkit_wire::dns::Name;
use tcpkit_workers::Shard;

use super::LoadError;

/// What each query is and how its answer ends.
#[derive(Debug, Clone)]
pub enum Payload {
    /// DNS over TCP: the `(name, type)` queries in turn, IDs per connection from 0, answers
    /// matched by ID. Never empty.
    Dns { queries: Vec<(Name, u16)> },
    /// `len` random bytes; the answer is the same bytes, checked.
    Echo { len: u32 },
    /// The bytes of a file; the answer ends after `ResponseEnd`.
    File { query: Vec<u8>, end: ResponseEnd },
    /// RESP `PING`; the answer is `+PONG\r\n` (or a `-ERR` line, counted as ERR).
    RedisPing,
    /// `GET path HTTP/1.1` with a Host header, keep-alive, and `headers` (`Name: value`
    /// lines, `-H`; one named as a default header, Host included, takes its place).
    HttpGet {
        path: String,
        host: String,
        headers: Vec<String>,
    },
}

/// Where an answer to a `--payload-file` query ends.
#[derive(Debug, Clone)]
pub enum ResponseEnd {
    /// After this many bytes.
    Len(u64),
    /// After this byte string (included).
    Delim(Vec<u8>),
}

impl Payload {
    /// One line for the summary.
    pub fn describe(&self) -> String {
        match self {
            Payload::Dns { queries } => {
                let type_text = |t: u16| match t {
                    1 => "A".to_string(),
                    28 => "AAAA".into(),
                    n => format!("TYPE{n}"),
                };
                let first = queries.first().map_or(1, |q| q.1);
                let t = if queries.iter().all(|q| q.1 == first) {
                    type_text(first)
                } else {
                    "mixed types".into()
                };
                match queries.as_slice() {
                    [(name, _)] => format!("dns {t} {}", name_text(name)),
                    _ => format!("dns {t}, {} names", queries.len()),
                }
            }
            Payload::Echo { len } => format!("echo {len} bytes"),
            Payload::File { query, end } => match end {
                ResponseEnd::Len(n) => format!("file of {} bytes, {n}-byte answers", query.len()),
                ResponseEnd::Delim(d) => format!(
                    "file of {} bytes, answers end with {:?}",
                    query.len(),
                    String::from_utf8_lossy(d)
                ),
            },
            Payload::RedisPing => "redis PING".into(),
            Payload::HttpGet { path, .. } => format!("http GET {path}"),
        }
    }
}

/// A name in wire form back to text, for the summary.
fn name_text(n: &Name) -> String {
    let w = n.as_wire();
    let mut out = String::new();
    let mut i = 0;
    while let Some(&l) = w.get(i) {
        if l == 0 {
            break;
        }
        let label = w.get(i + 1..i + 1 + usize::from(l)).unwrap_or_default();
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(&String::from_utf8_lossy(label));
        i += 1 + usize::from(l);
    }
    if out.is_empty() {
        ".".into()
    } else {
        out
    }
}

/// The asked rate over the query phase, in queries per second in all.
#[derive(Debug, Clone, PartialEq)]
pub enum RateProfile {
    Constant(f64),
    /// `(length, rate)` steps one after the other; the last rate holds after them.
    Steps(Vec<(Duration, f64)>),
    /// From `from` to `to` linearly over `over`, then `to`.
    Ramp {
        from: f64,
        to: f64,
        over: Duration,
    },
}

impl RateProfile {
    /// The same profile at `share` of the rate (a thread's or a worker's part).
    pub fn scaled(&self, share: f64) -> RateProfile {
        match self {
            RateProfile::Constant(r) => RateProfile::Constant(r * share),
            RateProfile::Steps(s) => {
                RateProfile::Steps(s.iter().map(|&(d, r)| (d, r * share)).collect())
            }
            RateProfile::Ramp { from, to, over } => RateProfile::Ramp {
                from: from * share,
                to: to * share,
                over: *over,
            },
        }
    }

    /// The natural length of the profile (steps' sum, ramp's length), used when no
    /// `--duration` is given.
    pub fn length(&self) -> Option<Duration> {
        match self {
            RateProfile::Constant(_) => None,
            RateProfile::Steps(s) => Some(s.iter().map(|(d, _)| *d).sum()),
            RateProfile::Ramp { over, .. } => Some(*over),
        }
    }

    /// Expected number of queries in the first `t` seconds (the integral of the rate).
    pub fn expected(&self, t: f64) -> f64 {
        match self {
            RateProfile::Constant(r) => r * t,
            RateProfile::Steps(s) => {
                let mut left = t;
                let mut n = 0.0;
                let mut last = 0.0;
                for &(d, r) in s {
                    let d = d.as_secs_f64();
                    n += r * left.min(d);
                    left -= d.min(left);
                    last = r;
                }
                n + last * left
            }
            RateProfile::Ramp { from, to, over } => {
                let big_t = over.as_secs_f64();
                let u = t.min(big_t);
                let a = if big_t > 0.0 {
                    (to - from) / (2.0 * big_t)
                } else {
                    0.0
                };
                from * u + a * u * u + to * (t - u)
            }
        }
    }
}

/// `10s:1000,10s:5000[,...]`: each step a duration (s, ms or m suffix; plain = seconds) and a
/// rate (≥ 0, at least one positive).
pub fn parse_steps(text: &str) -> Result<RateProfile, String> {
    let mut steps = Vec::new();
    for part in text.split(',') {
        let (d, r) = part
            .split_once(':')
            .ok_or_else(|| format!("step {part:?}: expected DURATION:RATE, e.g. 10s:1000"))?;
        let d = parse_duration(d).map_err(|e| format!("step {part:?}: {e}"))?;
        let r: f64 = r
            .trim()
            .parse()
            .map_err(|_| format!("step {part:?}: rate {r:?} is not a number"))?;
        if !r.is_finite() || r < 0.0 {
            return Err(format!("step {part:?}: rate must be 0 or more"));
        }
        if d.is_zero() {
            return Err(format!("step {part:?}: duration must be above 0"));
        }
        steps.push((d, r));
    }
    if !steps.iter().any(|&(_, r)| r > 0.0) {
        return Err("no step has a rate above 0".into());
    }
    Ok(RateProfile::Steps(steps))
}

/// `FROM..TO/DURATION`, e.g. `1000..100000/60s`.
pub fn parse_ramp(text: &str) -> Result<RateProfile, String> {
    let (rates, d) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: expected FROM..TO/DURATION, e.g. 1000..100000/60s"))?;
    let (a, b) = rates
        .split_once("..")
        .ok_or_else(|| format!("{text:?}: expected FROM..TO/DURATION, e.g. 1000..100000/60s"))?;
    let num = |s: &str| -> Result<f64, String> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: rate {s:?} is not a number"))?;
        if !v.is_finite() || v < 0.0 {
            return Err(format!("{text:?}: rates must be 0 or more"));
        }
        Ok(v)
    };
    let (from, to) = (num(a)?, num(b)?);
    let over = parse_duration(d).map_err(|e| format!("{text:?}: {e}"))?;
    if over.is_zero() {
        return Err(format!("{text:?}: the ramp must last more than 0 s"));
    }
    if from <= 0.0 && to <= 0.0 {
        return Err(format!("{text:?}: one end of the ramp must be above 0"));
    }
    Ok(RateProfile::Ramp { from, to, over })
}

/// `--shard`'s names of a `--qname-file`: those numbered K-1 modulo N (from 0, blank lines
/// and comments not counted), so the shards' queries are disjoint and together the file. A
/// file with fewer names than shards cannot be dealt so, and is refused (by every shard
/// alike: the error says why).
pub fn shard_names(names: Vec<(Name, u16)>, shard: Shard) -> Result<Vec<(Name, u16)>, String> {
    let n = shard.count as usize;
    if names.len() < n {
        return Err(format!(
            "{} name{} for {n} shards; each shard sends names of its own (name i goes to shard i mod N + 1), so the file needs at least {n} (or give every shard the same name with --qname)",
            names.len(),
            if names.len() == 1 { "" } else { "s" },
        ));
    }
    Ok(names
        .into_iter()
        .enumerate()
        .filter(|(i, _)| shard.takes(*i as u64))
        .map(|(_, q)| q)
        .collect())
}

/// Durations in steps and ramps are spelled as every duration flag is.
pub use tcpkit_pace::parse_duration;

/// Most source addresses `--source` may name (a /16 of IPv4): enough for 4 million
/// connections to one server port.
pub const MAX_SOURCES: usize = 65_536;

/// `--source`: comma-separated addresses and CIDR prefixes. A prefix stands for all its
/// addresses, except, for IPv4 prefixes up to /30, its network and broadcast addresses.
pub fn parse_sources(text: &str) -> Result<Vec<IpAddr>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (addr, prefix) = match part.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (part, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{part:?}: not an IP address or CIDR prefix"))?;
        let bits: u32 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u32 = match prefix {
            None => bits,
            Some(p) => p
                .parse()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("{part:?}: prefix length must be 0 to {bits}"))?,
        };
        let host_bits = bits - prefix;
        if host_bits > 16 {
            return Err(format!(
                "{part:?}: more than {MAX_SOURCES} addresses; give a longer prefix"
            ));
        }
        let count = 1u128 << host_bits;
        let base = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)) & !(count - 1),
            IpAddr::V6(a) => u128::from(a) & !(count - 1),
        };
        let skip_ends = addr.is_ipv4() && host_bits >= 2;
        for i in 0..count {
            if skip_ends && (i == 0 || i == count - 1) {
                continue;
            }
            let v = base + i;
            out.push(match addr {
                IpAddr::V4(_) => IpAddr::V4((v as u32).into()),
                IpAddr::V6(_) => IpAddr::V6(v.into()),
            });
        }
        if out.len() > MAX_SOURCES {
            return Err(format!("more than {MAX_SOURCES} source addresses"));
        }
    }
    if out.is_empty() {
        return Err("no source address given".into());
    }
    Ok(out)
}

/// Checks the form of `HOST:PORT` (or `[v6]:PORT`) without resolving it: what cannot be a
/// target is said as such (a usage error), not met later as a name that does not resolve
/// ("Temporary failure in name resolution" for `300.1.2.3`, which is no name either).
pub fn check_target(target: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = target.strip_prefix('[') {
        let (v6, port) = rest
            .split_once("]:")
            .ok_or("expected [IPv6]:PORT, like [fd00::2]:53")?;
        v6.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("{v6} is not an IPv6 address"))?;
        (v6, port)
    } else {
        target
            .rsplit_once(':')
            .ok_or("expected HOST:PORT, like 198.18.0.2:53")?
    };
    if host.is_empty() {
        return Err("no host before the port".into());
    }
    // Digits and dots only: meant as an IPv4 address (no DNS name is all digits), so it must
    // be one.
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && host.parse::<std::net::Ipv4Addr>().is_err()
    {
        return Err(format!(
            "{host} is not an IPv4 address (four numbers 0-255, like 198.18.0.2)"
        ));
    }
    if host.contains(':') && !target.starts_with('[') {
        return Err(format!("an IPv6 address takes brackets: [{host}]:{port}"));
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port '{port}' is not a number"));
    }
    match port.parse::<u32>() {
        Ok(0) => Err("port 0: the server's port is needed".into()),
        Ok(p) if p <= 65535 => Ok(()),
        _ => Err(format!("port {port} is above 65535")),
    }
}

/// `HOST:PORT` (or `[v6]:PORT`) to its first address; a name that does not resolve is an
/// error that names it.
pub fn resolve_target(target: &str) -> Result<SocketAddr, LoadError> {
    let mut addrs = target.to_socket_addrs().map_err(|e| LoadError::Resolve {
        target: target.to_string(),
        source: e,
    })?;
    addrs.next().ok_or_else(|| LoadError::Resolve {
        target: target.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
    })
}

/// How many worker processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Procs {
    /// One, or as many as the file-descriptor limit needs.
    Auto,
    Fixed(u32),
}

/// Arrival process of the queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalKind {
    Poisson { seed: u64 },
    Constant,
}

/// Everything a `load` run needs, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// As typed, for the report and the HTTP Host header.
    pub target: String,
    pub addr: SocketAddr,
    pub connections: u64,
    /// New connections per second, in all.
    pub connect_rate: f64,
    pub connect_timeout: Duration,
    /// Connect retries per connection before it is given up (during the opening ramp).
    pub retries: u32,
    /// Source addresses, used in turn; empty = the kernel chooses.
    pub sources: Vec<IpAddr>,
    /// None: connections only, no queries (idle connections).
    pub rate: Option<RateProfile>,
    pub arrivals: ArrivalKind,
    pub duration: Option<Duration>,
    pub queries: Option<u64>,
    pub queries_per_conn: Option<u64>,
    pub payload: Payload,
    /// DNS over UDP (`--udp`): each "connection" is a connected UDP socket, each query one
    /// datagram, an answer not back by `timeout` a timeout. Only with a DNS payload.
    pub udp: bool,
    /// Most due queries written on one connection in one write (`--coalesce`); 1 = one
    /// write, and so one TCP segment, per query, as a client sends them.
    pub coalesce: usize,
    /// Acknowledge answers at once (`TCP_QUICKACK` after each read that leaves queries of the
    /// connection outstanding); false leaves the kernel's delayed ACK (`--delayed-ack`).
    pub quickack: bool,
    /// A query unanswered for this long counts as a timeout; also the longest wait for
    /// answers after the last query.
    pub timeout: Duration,
    pub per_query: Option<PathBuf>,
    pub hdr_log: Option<PathBuf>,
    /// Event-loop threads per process; 0 = one per core.
    pub threads: usize,
    pub procs: Procs,
    /// Set in a worker process: its index and the number of workers.
    pub worker: Option<(u32, u32)>,
    /// `--shard K/N`: this host's part of a fleet's run. The counts and rates above are
    /// already its share ([`Config::take_shard`]); this places its arrivals in the fleet's.
    pub shard: Option<Shard>,
    /// The arguments (after the binary's path) that re-run this command; a worker is started
    /// with these plus `--worker K/N`.
    pub worker_argv: Vec<std::ffi::OsString>,
    /// The fleet barrier this run joined (`--barrier`): the query phase starts at the instant
    /// it gives, once this host is prepared. Set in the parent only; a worker is `gated`.
    pub fleet: Option<std::sync::Arc<tcpkit_fleet::Agent>>,
    /// The start is given from outside (a barrier, through the parent for a worker):
    /// `--duration` counts from that start, not from the first connect, since waiting for
    /// the other agents is not this run's time.
    pub gated: bool,
    /// `--tls`: every TCP connection speaks TLS first (DoT, HTTPS, ...); None in clear.
    pub tls: Option<super::tls::TlsClient>,
}

impl Config {
    /// A config with the defaults of the command line: DNS A example.com, 1 connection,
    /// 1000 connects/s, no rate.
    pub fn new(target: String, addr: SocketAddr) -> Config {
        Config {
            target,
            addr,
            connections: 1,
            connect_rate: 1000.0,
            connect_timeout: Duration::from_secs(3),
            retries: 3,
            sources: Vec::new(),
            rate: None,
            arrivals: ArrivalKind::Poisson { seed: 42 },
            duration: None,
            queries: None,
            queries_per_conn: None,
            payload: Payload::Dns {
                queries: vec![("example.com".parse().expect("static name is valid"), 1)],
            },
            udp: false,
            coalesce: 1,
            quickack: true,
            timeout: Duration::from_secs(2),
            per_query: None,
            hdr_log: None,
            threads: 0,
            procs: Procs::Auto,
            worker: None,
            shard: None,
            worker_argv: Vec::new(),
            fleet: None,
            gated: false,
            tls: None,
        }
    }

    /// Makes this the part of the run that `shard` takes, the whole run being what the
    /// config says now: its share of `-c` (10 over 3 shards is 4/3/3) and of `-n`, the rate
    /// profile (constant, steps or ramp) divided by N, `--connect-rate` in proportion to its
    /// connections (every shard opens its connections in the same time), and a Poisson seed
    /// of its own. A `--qname-file`'s lines are the binary's to deal ([`Shard::takes`]).
    ///
    /// Every shard of one command line makes the same checks, so a command line that cannot
    /// be shared out is refused by all of them alike: fewer connections or queries than
    /// shards would leave one with none.
    pub fn take_shard(&mut self, shard: Shard) -> Result<(), String> {
        let n = u64::from(shard.count);
        if self.connections < n {
            return Err(format!(
                "--shard {shard}: -c {} is fewer connections than the {n} shards; each needs one (-c {n} or more)",
                self.connections
            ));
        }
        if let Some(q) = self.queries.filter(|&q| q < n) {
            return Err(format!(
                "--shard {shard}: -n {q} is fewer queries than the {n} shards; each needs one (-n {n} or more)"
            ));
        }
        let mine = shard.share(self.connections);
        self.connect_rate *= mine as f64 / self.connections as f64;
        self.connections = mine;
        self.queries = self.queries.map(|q| shard.share(q));
        self.rate = self.rate.as_ref().map(|r| r.scaled(shard.fraction()));
        if let ArrivalKind::Poisson { seed } = self.arrivals {
            self.arrivals = ArrivalKind::Poisson {
                seed: shard.seed(seed),
            };
        }
        self.shard = Some(shard);
        Ok(())
    }

    /// How long the query phase lasts: `--duration`, else the rate profile's own length.
    pub fn phase_length(&self) -> Option<Duration> {
        self.duration
            .or_else(|| self.rate.as_ref().and_then(RateProfile::length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_and_integrate() {
        let p = parse_steps("10s:1000,500ms:5000").unwrap();
        assert_eq!(
            p,
            RateProfile::Steps(vec![
                (Duration::from_secs(10), 1000.0),
                (Duration::from_millis(500), 5000.0)
            ])
        );
        assert_eq!(p.length(), Some(Duration::from_millis(10_500)));
        assert!((p.expected(10.5) - 12_500.0).abs() < 1e-6);
        // After the last step its rate holds.
        assert!((p.expected(11.5) - 17_500.0).abs() < 1e-6);
        for bad in ["10s", "x:1", "1s:-1", "0s:5", "1s:0", "1s:abc"] {
            assert!(parse_steps(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ramp_parses_and_integrates() {
        let p = parse_ramp("1000..3000/2s").unwrap();
        assert_eq!(
            p,
            RateProfile::Ramp {
                from: 1000.0,
                to: 3000.0,
                over: Duration::from_secs(2)
            }
        );
        // Mean rate 2000 over 2 s, then 3000/s.
        assert!((p.expected(2.0) - 4000.0).abs() < 1e-6);
        assert!((p.expected(3.0) - 7000.0).abs() < 1e-6);
        for bad in ["1000..3000", "1000/2s", "a..b/2s", "0..0/2s", "1..2/0s"] {
            assert!(parse_ramp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn sources_expand_prefixes_and_lists() {
        let v = parse_sources("10.0.0.0/29").unwrap();
        assert_eq!(v.len(), 6, "network and broadcast left out: {v:?}");
        assert_eq!(v[0], "10.0.0.1".parse::<IpAddr>().unwrap());
        let v = parse_sources("10.0.0.5/31,10.0.0.9, fd00::1/127").unwrap();
        assert_eq!(v.len(), 5);
        assert_eq!(parse_sources("10.0.0.7/32").unwrap().len(), 1);
        assert!(parse_sources("10.0.0.0/8").is_err());
        assert!(parse_sources("10.0.0.0/33").is_err());
        assert!(parse_sources("nope").is_err());
        assert!(parse_sources("").is_err());
    }

    fn names(n: usize) -> Vec<(Name, u16)> {
        (0..n)
            .map(|i| (format!("q{i}.test").parse().unwrap(), 1))
            .collect()
    }

    fn shard(index: u32, count: u32) -> Shard {
        Shard { index, count }
    }

    /// Issue 25: a query file dealt over shards: line i to shard i mod N + 1, disjoint, the
    /// union the file; fewer names than shards refused.
    #[test]
    fn a_query_file_is_dealt_over_the_shards() {
        let file = names(7);
        let mut union = Vec::new();
        for k in 1..=3 {
            let mine = shard_names(file.clone(), shard(k, 3)).unwrap();
            assert_eq!(mine.len() as u64, shard(k, 3).share(7));
            assert_eq!(mine[0], file[k as usize - 1]);
            union.extend(mine);
        }
        union.sort_by(|a, b| a.0.as_wire().cmp(b.0.as_wire()));
        let mut all = file.clone();
        all.sort_by(|a, b| a.0.as_wire().cmp(b.0.as_wire()));
        assert_eq!(union, all);
        assert_eq!(shard_names(file.clone(), Shard::WHOLE).unwrap(), file);
        let e = shard_names(names(2), shard(1, 3)).unwrap_err();
        assert!(e.starts_with("2 names for 3 shards;"), "{e}");
        assert!(shard_names(names(3), shard(3, 3)).unwrap().len() == 1);
    }

    /// Issue 25: what one shard of a command line takes.
    #[test]
    fn a_shard_takes_its_share_of_the_command_line() {
        let base = || {
            let mut c = Config::new("h:53".into(), "127.0.0.1:53".parse().unwrap());
            c.connections = 10;
            c.connect_rate = 1000.0;
            c.queries = Some(100);
            c.rate = Some(RateProfile::Constant(300.0));
            c
        };
        let mut got = Vec::new();
        for k in 1..=3 {
            let mut c = base();
            c.take_shard(shard(k, 3)).unwrap();
            assert_eq!(c.shard, Some(shard(k, 3)));
            assert_eq!(c.rate, Some(RateProfile::Constant(100.0)));
            got.push((
                c.connections,
                c.queries.unwrap(),
                c.connect_rate.round() as u64,
            ));
            let ArrivalKind::Poisson { seed } = c.arrivals else {
                panic!("{:?}", c.arrivals)
            };
            assert_eq!(seed, shard(k, 3).seed(42));
        }
        assert_eq!(got, [(4, 34, 400), (3, 33, 300), (3, 33, 300)]);
        // Steps and ramps: each rate divided by N, the times kept.
        let mut c = base();
        c.rate = Some(parse_steps("1s:300,2s:900").unwrap());
        c.take_shard(shard(2, 3)).unwrap();
        assert_eq!(c.rate, Some(parse_steps("1s:100,2s:300").unwrap()));
        let mut c = base();
        c.rate = Some(parse_ramp("300..3000/2s").unwrap());
        c.arrivals = ArrivalKind::Constant;
        c.take_shard(shard(3, 3)).unwrap();
        assert_eq!(c.rate, Some(parse_ramp("100..1000/2s").unwrap()));
        assert_eq!(c.arrivals, ArrivalKind::Constant);
        // 1/1 is the whole run.
        let mut c = base();
        c.take_shard(Shard::WHOLE).unwrap();
        assert_eq!(
            (c.connections, c.queries, c.arrivals),
            (10, Some(100), ArrivalKind::Poisson { seed: 42 })
        );
        // A command line that would leave a shard with nothing is refused by every shard.
        for k in 1..=11 {
            let e = base().take_shard(shard(k, 11)).unwrap_err();
            assert!(
                e.starts_with(&format!(
                    "--shard {k}/11: -c 10 is fewer connections than the 11 shards"
                )),
                "{e}"
            );
        }
        let mut c = base();
        c.queries = Some(2);
        let e = c.take_shard(shard(1, 3)).unwrap_err();
        assert!(e.contains("-n 2 is fewer queries than the 3 shards"), "{e}");
    }

    /// Issue 10, case 7.
    #[test]
    fn impossible_targets_are_said_as_such() {
        for ok in [
            "198.18.0.2:53",
            "example.com:80",
            "[fd00::2]:53",
            "localhost:65535",
        ] {
            assert_eq!(check_target(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("300.1.2.3:4242", "300.1.2.3 is not an IPv4 address"),
            ("1.2.3:1", "1.2.3 is not an IPv4 address"),
            ("198.18.0.2:70000", "port 70000 is above 65535"),
            ("198.18.0.2:99999999999", "port 99999999999 is above 65535"),
            ("h:0", "port 0"),
            ("h:", "port '' is not a number"),
            ("h:dns", "port 'dns' is not a number"),
            (":53", "no host"),
            ("[fd00::2:53", "expected [IPv6]:PORT"),
            ("[fd00::zz]:53", "fd00::zz is not an IPv6 address"),
            ("fd00::2:53", "brackets"),
            ("nocolon", "expected HOST:PORT"),
        ] {
            let e = check_target(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn names_print_back() {
        let p = Payload::Dns {
            queries: vec![("example.com".parse().unwrap(), 1)],
        };
        assert_eq!(p.describe(), "dns A example.com");
        let p = Payload::Dns {
            queries: vec![
                ("a.example".parse().unwrap(), 1),
                ("b.example".parse().unwrap(), 28),
            ],
        };
        assert_eq!(p.describe(), "dns mixed types, 2 names");
    }
}
