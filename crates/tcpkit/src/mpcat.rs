//! `tcpkit mpcat`: what the user typed (clap), then the resolved `tcpkit_mpcat` config of the
//! side it runs (send or receive), and where the report goes.

use std::cell::{Cell, RefCell};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tcpkit_mpcat::duplex::Wait;
use tcpkit_mpcat::recv::RecvConfig;
use tcpkit_mpcat::send::SendConfig;
use tcpkit_mpcat::{frame, Input, MpcatCounters, MpcatReport, Output, Role};
use tcpkit_stats::{Monitor, MonitorOptions, Report, Verdict};

use crate::common::{self, OutputFlags, RunFlags};
use crate::Failure;

/// One byte stream over several TCP connections (netcat's job, striped): `-l -p PORT` on the
/// receiving side, `HOST PORT` on the sending side; stdin to stdout unless -i/-o.
///
/// Duplex, as nc: the listener's stdin (or -i FILE) goes back to the connecting side's stdout
/// (or -o FILE) on a connection of its own, verified like the forward stream. At the end of
/// its input each side's stream ends with its length and hash, so the peer's output always
/// sees EOF (what nc -N gives). The connecting side then waits for the listener's stream as
/// OpenBSD nc does: by default (and with -N) until the listener's input ends, so the answer
/// of `echo cmd | mpcat HOST P` arrives whole (a listener whose stdin is a terminal ends it
/// with Ctrl-D); with -q SECS at most SECS, then the listener ends it with what it has sent
/// (-q 0: not at all, so `mpcat -l P > file` finishes whatever its stdin is).
/// Exit 0 only when every stream of both directions arrived whole and verified.
///
/// nc's habits hold: `-l PORT`, `-l ADDR PORT` and `-l -s ADDR -p PORT` listen (on one
/// address with ADDR); -v says each connection on stderr; -w SECS bounds the connect and ends
/// a run idle that long; -4/-6 pick the address family; -s ADDR is the sender's source.
///
/// --duration bounds a run as iperf3's -t does. The connecting side reads its input for at
/// most that long (from its start, connecting included), then ends the stream cleanly: the
/// end frame carries the length and hash of what was read, the listener verifies them, and
/// the run exits 0 as at the input's end (bytes already read still go out; a pipe that is
/// idle then is not waited for). The listening side stops after that long as at SIGINT: with
/// -k, exit 0 when every session that began was verified and none was cut short (none at all
/// is fine); without -k the one session must have ended by then, or exit 1 says how far it
/// got.
#[derive(Debug, Parser)]
#[command(
    mut_arg("duration", |a| a.help(DURATION_HELP)),
    mut_arg("stats", |a| a.help(STATS_HELP)),
    mut_arg("json", |a| a.help(JSON_HELP)),
    // -q is nc's quit-after here (see -q/--quit-after): --quiet has no short form.
    mut_arg("quiet", |a| a.short(None))
)]
pub struct Args {
    /// Listen for one session and write what arrives (the receiving side): `-l PORT`,
    /// `-l -p PORT`, or on one address `-l ADDR PORT` / `-l -s ADDR -p PORT` (as nc).
    #[arg(short = 'l', long)]
    pub listen: bool,

    /// Port to listen on (with -l); one port for every stream of the session.
    #[arg(short = 'p', long, value_name = "PORT")]
    pub port: Option<u16>,

    /// The receiver to connect to (the sending side): HOST PORT. With -l: the port to listen
    /// on (`-l PORT`), or the address (`-l ADDR PORT`).
    #[arg(value_name = "HOST")]
    pub host: Option<String>,

    /// The receiver's port (the sending side; with -l, the port after ADDR).
    #[arg(value_name = "PORT", requires = "host")]
    pub dest_port: Option<u16>,

    /// The source address of every connection (sending side), as nc's -s; with -l, the
    /// address to listen on.
    #[arg(short = 's', long = "source", value_name = "ADDR")]
    pub source: Option<std::net::IpAddr>,

    /// IPv4 only: resolve HOST to IPv4 addresses; with -l, listen on 0.0.0.0.
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,

    /// IPv6 only: resolve HOST to IPv6 addresses; with -l, listen on [::] for IPv6 alone.
    #[arg(short = '6')]
    pub ipv6: bool,

    /// Say each connection on stderr as it is made, accepted or refused (as nc -v).
    #[arg(short = 'v', long)]
    pub verbose: bool,

    /// As nc's -w: each connect and handshake may take at most SECS (--connect-timeout), and
    /// a run whose stream moves no byte for SECS ends (exit 1, the peer told why). The
    /// listener waits for its session however long it takes, as nc -l does.
    #[arg(short = 'w', long = "wait", value_name = "SECS", value_parser = common::duration_arg)]
    pub wait: Option<Duration>,

    /// Connections to stripe the stream over (sending side), 1 to 256. Default: one per
    /// member of the way out toward the receiver (each nexthop of an ECMP route, each slave
    /// of a layer3+4 bond; 1 on a plain route). Either way each connection's source port is
    /// chosen so that the connections spread evenly over the members.
    #[arg(
        short = 'n',
        long = "streams",
        value_name = "N",
        conflicts_with = "listen"
    )]
    pub streams: Option<u16>,

    /// Read the stream from FILE instead of stdin. On the listening side: what goes back to
    /// the connecting side (the reverse stream).
    #[arg(short = 'i', long, value_name = "FILE")]
    pub input: Option<PathBuf>,

    /// Half-close and wait for the answer (connecting side): once our input has ended and
    /// been delivered, keep the session open until the listener's input ends too, however
    /// long that takes (as -q -1, and the default without -q). The listener's output sees
    /// EOF at our end either way.
    #[arg(short = 'N', long = "half-close", conflicts_with = "listen")]
    pub half_close: bool,

    /// After our input has ended and been delivered, wait at most SECS for the rest of the
    /// listener's stream, then have it end with what it has sent (connecting side; as nc's
    /// -q). 0: not at all; -1 (and the default, as nc without -q): until the listener's
    /// input ends.
    #[arg(
        short = 'q',
        long = "quit-after",
        value_name = "SECS",
        allow_negative_numbers = true,
        conflicts_with = "listen"
    )]
    pub quit_after: Option<i64>,

    /// Keep listening after a session for the next one (each with its own token), writing
    /// their streams one after another; stop with SIGINT/SIGTERM (exit 0 only when every
    /// session was verified). Receiving side.
    #[arg(short = 'k', long = "keep-listening")]
    pub keep: bool,

    /// Write the stream to FILE instead of stdout. On the connecting side: where the
    /// listener's stream (the reverse one) goes.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Bytes the receiver holds to put chunks back in order (64M, 1G); the sender never
    /// sends further ahead than this (receiving side). A session of one stream, whose bytes
    /// arrive in order, holds at most 16M of it.
    #[arg(long, value_name = "SIZE", value_parser = common::size_arg)]
    pub window: Option<u64>,

    /// The input's length when it is known but not from a file (stdin of a known length, e.g.
    /// `--size 20G < /dev/sda`; sending side): the progress line and --stats show percent and
    /// ETA, and an input that ends at another length fails the session, naming both lengths.
    #[arg(long, value_name = "SIZE", value_parser = common::size_arg, conflicts_with = "listen")]
    pub size: Option<u64>,

    /// Bytes per data frame (sending side), 1K to 1M: SIZE for a fixed size, or MIN-MAX
    /// (default 64K-1M, MAX at most 16 × MIN) for a size each connection adapts every 0.1 s:
    /// about 10 ms of what its socket took lately, as a power of two, and at most half its even
    /// share of the receiver's window. A fast path gets large chunks (fewer frames and system
    /// calls per byte); a slow one, or one with few bytes in flight, small ones (less of the
    /// window held behind one chunk, a shorter wait for the last).
    #[arg(long, value_name = "SIZE|MIN-MAX", conflicts_with = "listen")]
    pub chunk: Option<String>,

    /// How long each connection's connect and handshake may take (sending side; default 5s,
    /// or -w's SECS).
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg, conflicts_with = "listen")]
    pub connect_timeout: Option<Duration>,

    /// A connection whose data stays unacknowledged this long has failed (TCP_USER_TIMEOUT;
    /// an idle one is probed by keepalive from then on): the sender re-sends its chunks on
    /// the other connections and reopens it from the same source port (so over the same
    /// path) until the path answers. With no connection left for this long, both sides fail.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg, default_value = "5s")]
    pub path_timeout: Duration,

    /// How long a connection to the listener may take to present its Hello (and, with
    /// --psk-file, its handshake) before it is closed and counted (receiving side; default
    /// 5s). Strangers that connect and say nothing hold a descriptor no longer than this.
    #[arg(long, value_name = "DURATION", value_parser = common::duration_arg)]
    pub hello_timeout: Option<Duration>,

    /// At most this much of the stream per second over all connections together (sending
    /// side). Bytes by default, as every size here: 300M (or 300MB, 300MiB) is 300 MiB/s.
    /// Bits as iperf3's -b, 1000-based: 100Mbit (or 100Mbps, 100Mbit/s) is 100,000,000
    /// bit/s, 12.5 MB/s.
    #[arg(long, value_name = "RATE", value_parser = rate_arg, conflicts_with = "listen")]
    pub rate_limit: Option<u64>,

    #[command(flatten)]
    pub run: RunFlags,

    /// Authenticate and encrypt every connection with the pre-shared key in FILE (both sides
    /// give the same key; at least 16 bytes, mode 600, e.g. `openssl rand -base64 32 > FILE;
    /// chmod 600 FILE`): a Noise NNpsk0 handshake per connection, then ChaCha20-Poly1305
    /// records. Only a holder of the key can join the session or read it on the wire; a
    /// connection under another key is refused and counted, and the session goes on.
    #[arg(long, value_name = "FILE")]
    pub psk_file: Option<PathBuf>,

    /// Send the input file (-i FILE, a regular file) with sendfile(2) straight from the page
    /// cache instead of copying it (as iperf3's -Z): the sender makes no copy of the bytes,
    /// which saves its CPU when a NIC sends them. Slower where the receiver shares this
    /// machine's CPUs (a veth, loopback): its copy then reads the pages cold from memory
    /// instead of from the cache the sender's copy left them in (one veth: 1655 MB/s against
    /// 2127 copied). Not with --psk-file (records are sealed from a copy).
    #[arg(short = 'Z', long, requires = "input", conflicts_with_all = ["listen", "psk_file"])]
    pub zerocopy: bool,

    /// Use the kernel's Multipath TCP: the sender opens one IPPROTO_MPTCP connection and the
    /// kernel's path manager spreads it over subflows (no striping); the receiver listens with
    /// IPPROTO_MPTCP (plain TCP senders still welcome). The sender reports the subflows and
    /// says what the path manager needs when only one formed; when this kernel or the
    /// receiver does not do MPTCP it says so once and stripes over TCP instead.
    #[arg(long)]
    pub mptcp: bool,

    /// Go on with a file-to-file transfer that broke off (either side killed, every path
    /// down), sending only what the receiver does not already hold: give it to both sides,
    /// the sender with -i FILE, the receiver with -o FILE. The receiver keeps its output and
    /// a small state file beside it (FILE.mpcat-resume: the input's length and modification
    /// time); an input whose length or time changed is refused, and each held 1 MiB chunk is
    /// checked against the sender's BLAKE3 hash of its own (a chunk that differs is refused,
    /// named); the end checks the whole file's hash. A verified transfer removes the state
    /// file. E.g. `mpcat -l 31337 --resume -o disk.img` and `mpcat --resume -i disk.img HOST
    /// 31337`, run again after a break.
    #[arg(long)]
    pub resume: bool,

    #[command(flatten)]
    pub out: OutputFlags,
}

/// --connect-timeout without it or -w.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// mpcat's words for the shared --duration (the command's help says more).
const DURATION_HELP: &str =
    "Bound the run (2, 2s, 500ms, 1m), as iperf3's -t: the connecting side reads its input \
that long, then ends the stream with the length and hash of what it read (exit 0 once \
verified); the listening side stops after that long as at SIGINT (with -k: exit 0 unless a \
session failed or was cut short)";

/// mpcat's words for the shared --stats: what its live line holds.
const STATS_HELP: &str =
    "A live line on stderr every DURATION (2, 2s, 500ms), elapsed time first: bytes, rate, \
each stream's rate, and percent and ETA when the length is known. On a terminal a progress \
line is drawn on stderr without it (not with --quiet or --json).";

/// mpcat's words for the shared --json: stdout may carry the stream.
const JSON_HELP: &str =
    "Print the report as one JSON document (schema docs/schema/mpcat.schema.json) on \
stdout; the receiving side needs -o FILE then, since stdout carries the stream. On the \
connecting side without -o the session is one way (no stdout for the listener's stream: it \
is not asked for).";

/// The side this run is, resolved.
#[derive(Debug)]
pub enum Side {
    Send(SendConfig),
    Receive(RecvConfig),
}

fn usage(m: impl Into<String>) -> Failure {
    Failure::Usage(m.into())
}

/// Every check that involves more than one flag, or a value's meaning, happens here.
pub fn resolve(a: &Args) -> Result<Side, Failure> {
    // Read before anything listens or connects: a bad key file is said first.
    let psk = a
        .psk_file
        .as_deref()
        .map(tcpkit_mpcat::secure::Psk::from_file)
        .transpose()
        .map_err(|e| usage(crate::chain(&e)))?;
    if a.path_timeout < Duration::from_secs(1) {
        return Err(usage(format!(
            "--path-timeout {:?}: at least 1s (TCP retransmits take that long on a live path)",
            a.path_timeout
        )));
    }
    if a.hello_timeout.is_some_and(|t| t.is_zero()) {
        return Err(usage(
            "--hello-timeout 0: give how long a connection may take to say Hello (default 5s)",
        ));
    }
    if a.listen {
        let (listen, v6only) = listen_on(a)?;
        let window = a.window.unwrap_or(tcpkit_mpcat::DEFAULT_WINDOW);
        if !(tcpkit_mpcat::MIN_WINDOW..=tcpkit_mpcat::MAX_WINDOW).contains(&window) {
            return Err(usage(format!(
                "--window {window}: must be {}M to {}G",
                tcpkit_mpcat::MIN_WINDOW >> 20,
                tcpkit_mpcat::MAX_WINDOW >> 30
            )));
        }
        if a.out.json && a.output.is_none() {
            return Err(usage(
                "--json needs -o FILE on the receiving side: stdout carries the stream",
            ));
        }
        if a.resume && a.output.is_none() {
            return Err(usage(
                "--resume needs -o FILE on the receiving side: the file it goes on writing",
            ));
        }
        if a.resume && a.keep {
            return Err(usage(
                "--resume with -k: a resumed transfer is one session into its own -o FILE",
            ));
        }
        return Ok(Side::Receive(RecvConfig {
            listen,
            v6only,
            output: a.output.clone().map_or(Output::Stdout, Output::File),
            window,
            handshake_timeout: a.hello_timeout.unwrap_or(tcpkit_mpcat::HANDSHAKE_TIMEOUT),
            max_pending: tcpkit_mpcat::MAX_PENDING,
            keep: a.keep,
            path_timeout: a.path_timeout,
            psk,
            mptcp: a.mptcp,
            input: a.input.clone().map_or(Input::Stdin, Input::File),
            duration: a.run.duration,
            verbose: a.verbose,
            idle: a.wait,
            resume: a.resume,
        }));
    }
    // clap's `requires` takes a bool flag as always present, so the receiving side's own
    // flags are checked here.
    for (given, flag) in [
        (a.port.is_some(), "-p/--port"),
        (a.window.is_some(), "--window"),
        (a.keep, "-k/--keep-listening"),
        (a.hello_timeout.is_some(), "--hello-timeout"),
    ] {
        if given {
            return Err(usage(format!(
                "{flag} is for the receiving side: it needs -l/--listen"
            )));
        }
    }
    let (Some(host), Some(port)) = (&a.host, a.dest_port) else {
        return Err(usage("give HOST PORT to send to, or -l -p PORT to receive"));
    };
    if port == 0 {
        return Err(usage("PORT 0: give a port from 1 to 65535"));
    }
    if let Some(q) = a.quit_after.filter(|q| *q < -1) {
        return Err(usage(format!(
            "-q {q}: give seconds to wait (0 or more), or -1 to wait until the listener's input ends"
        )));
    }
    if a.rate_limit == Some(0) {
        return Err(usage("--rate-limit 0: give a rate above 0 (e.g. 300M)"));
    }
    if let (true, Some(n)) = (a.mptcp, a.streams) {
        return Err(usage(format!(
            "-n {n} with --mptcp: MPTCP opens one connection and the kernel makes the subflows"
        )));
    }
    if let Some(n) = a.streams.filter(|n| !(1..=frame::MAX_STREAMS).contains(n)) {
        return Err(usage(format!(
            "-n {n}: must be 1 to {}",
            frame::MAX_STREAMS
        )));
    }
    if a.resume && a.input.is_none() {
        return Err(usage(
            "--resume needs -i FILE on the sending side: stdin cannot be read again",
        ));
    }
    if let (true, Some(d)) = (a.resume, a.run.duration) {
        return Err(usage(format!(
            "--resume with --duration {d:?}: a resumed transfer goes to the input's end"
        )));
    }
    let (chunk_min, chunk) = chunk_bounds(a.chunk.as_deref())?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let family = |p: &SocketAddr| (!a.ipv4 || p.is_ipv4()) && (!a.ipv6 || p.is_ipv6());
    let all: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| Failure::Runtime(format!("resolve {host}: {e}")))?
        .collect();
    let mut peer: Vec<SocketAddr> = all.iter().copied().filter(family).collect();
    if let Some(src) = a.source {
        // A source address of one family reaches only that family's addresses.
        peer.retain(|p| p.is_ipv4() == src.is_ipv4());
    }
    if peer.is_empty() {
        let want = match (a.ipv4, a.ipv6, a.source) {
            (true, _, _) => "IPv4 (-4)".to_string(),
            (_, true, _) => "IPv6 (-6)".to_string(),
            (_, _, Some(s)) => format!("the family of -s {s}"),
            _ => "any".to_string(),
        };
        return Err(Failure::Runtime(format!(
            "resolve {host}: no {want} address (it has {})",
            all.iter()
                .map(|x| x.ip().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let address = match peer.first() {
        Some(SocketAddr::V6(_)) if !host.starts_with('[') && bare.contains(':') => {
            format!("[{bare}]:{port}")
        }
        _ => format!("{host}:{port}"),
    };
    Ok(Side::Send(SendConfig {
        peer,
        address,
        streams: a.streams,
        chunk,
        chunk_min,
        input: a.input.clone().map_or(Input::Stdin, Input::File),
        // -w is nc's connect timeout too; --connect-timeout given as well wins.
        connect_timeout: a
            .connect_timeout
            .or(a.wait)
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        source: a.source,
        verbose: a.verbose,
        idle: a.wait,
        path_timeout: a.path_timeout,
        rate_limit: a.rate_limit,
        psk,
        mptcp: a.mptcp,
        size: a.size,
        token: None,
        zerocopy: a.zerocopy,
        duration: a.run.duration,
        resume: a.resume,
    }))
}

/// A file named by `flag` that the run will read: missing, unreadable or a directory is a
/// usage error said before anything listens or connects. Only looked at, not opened: a FIFO
/// would block an open until its writer came.
fn readable(flag: &str, p: &std::path::Path) -> Result<(), Failure> {
    let m = std::fs::metadata(p).map_err(|e| usage(format!("{flag} {}: {e}", p.display())))?;
    if m.is_dir() {
        return Err(usage(format!("{flag} {}: a directory", p.display())));
    }
    if m.is_file() {
        std::fs::File::open(p).map_err(|e| usage(format!("{flag} {}: {e}", p.display())))?;
    }
    Ok(())
}

/// A file named by `flag` that the run will create: its folder must be there.
fn writable_dir(flag: &str, p: &std::path::Path) -> Result<(), Failure> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(usage(format!(
            "{flag} {}: {} is not a directory",
            p.display(),
            dir.display()
        ))),
        Err(e) => Err(usage(format!(
            "{flag} {}: {}: {e}",
            p.display(),
            dir.display()
        ))),
    }
}

/// Where the listener listens (`-l PORT`, `-l -p PORT`, `-l ADDR PORT`, `-l -s ADDR -p
/// PORT`, as nc), and whether an IPv6 socket takes IPv6 alone (-6).
fn listen_on(a: &Args) -> Result<(SocketAddr, bool), Failure> {
    let forms =
        "give -l PORT, -l -p PORT, or -l ADDR PORT / -l -s ADDR -p PORT to listen on one address";
    let (addr_text, port) = match (&a.host, a.dest_port, a.port) {
        (Some(_), Some(_), Some(p)) => {
            return Err(usage(format!("-p {p} and a PORT after -l: {forms}")))
        }
        (Some(h), Some(p), None) => (Some(h.as_str()), p),
        (Some(h), None, Some(p)) => (Some(h.as_str()), p),
        (Some(h), None, None) => match h.parse::<u16>() {
            Ok(p) => (None, p),
            Err(_) => return Err(usage(format!("-l {h}: not a port; {forms}"))),
        },
        (None, _, Some(p)) => (None, p),
        (None, _, None) => return Err(usage(format!("-l needs a port: {forms}"))),
    };
    if port == 0 {
        return Err(usage(format!(
            "-p 0: give a port from 1 to 65535 ({forms})"
        )));
    }
    let named = match (addr_text, a.source) {
        (Some(t), Some(s)) => {
            return Err(usage(format!("-l {t} and -s {s}: give the address once")))
        }
        (Some(t), None) => Some(listen_addr(t, a)?),
        (None, s) => s,
    };
    let ip = match named {
        Some(ip) => {
            if (a.ipv4 && ip.is_ipv6()) || (a.ipv6 && ip.is_ipv4()) {
                let f = if a.ipv4 { "-4" } else { "-6" };
                return Err(usage(format!("{f} and the address {ip}: another family")));
            }
            ip
        }
        None if a.ipv4 => std::net::Ipv4Addr::UNSPECIFIED.into(),
        None => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    Ok((SocketAddr::new(ip, port), a.ipv6))
}

/// The address after -l: an IP address (IPv6 with or without brackets) or a name of this
/// host, resolved (in the family -4/-6 asks for).
fn listen_addr(text: &str, a: &Args) -> Result<std::net::IpAddr, Failure> {
    let bare = text
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(text);
    if let Ok(ip) = bare.parse() {
        return Ok(ip);
    }
    (bare, 0)
        .to_socket_addrs()
        .map_err(|e| {
            usage(format!(
                "-l {text}: not an address or a name of this host ({e})"
            ))
        })?
        .map(|s| s.ip())
        .find(|ip| (!a.ipv4 || ip.is_ipv4()) && (!a.ipv6 || ip.is_ipv6()))
        .ok_or_else(|| usage(format!("-l {text}: no address of the family asked for")))
}

/// --rate-limit: bytes per second as every size (`300M` = 300 MiB/s, `300MB`, `300MiB`), or
/// bits per second as iperf3's -b, 1000-based (`100Mbit`, `100Mbps`, `100Mbit/s`).
pub(crate) fn rate_arg(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let bits = ["bit/s", "bits/s", "bits", "bit", "bps"]
        .iter()
        .find_map(|u| lower.strip_suffix(u));
    if let Some(num) = bits {
        let (num, scale) = match num.trim_end().chars().last() {
            Some('k') => (&num[..num.len() - 1], 1e3),
            Some('m') => (&num[..num.len() - 1], 1e6),
            Some('g') => (&num[..num.len() - 1], 1e9),
            Some('t') => (&num[..num.len() - 1], 1e12),
            _ => (num, 1.0),
        };
        let v: f64 = num.trim().parse().map_err(|_| {
            format!(
                "{text:?}: expected a rate like 300M (MiB/s), 300MB or 100Mbit (bits, as iperf3)"
            )
        })?;
        let bytes = v * scale / 8.0;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("{text:?}: out of range"));
        }
        return Ok(bytes.round() as u64);
    }
    let bytes = lower.strip_suffix("/s").map_or(t, |_| &t[..t.len() - 2]);
    common::size_arg(bytes)
}

/// The connecting side's reverse stream: where it goes and how long to wait for it; None for
/// the listener, and for --json without -o (stdout holds the report: a one-way session).
pub fn reverse(a: &Args) -> Option<(Output, Wait)> {
    if a.listen || (a.out.json && a.output.is_none()) {
        return None;
    }
    // As OpenBSD nc: without -q the answer is waited for until it ends (-N says the same).
    let wait = match a.quit_after {
        None | Some(-1) => Wait::Forever,
        Some(q) if q > 0 => Wait::For(Duration::from_secs(q.unsigned_abs())),
        Some(_) => Wait::Now,
    };
    Some((a.output.clone().map_or(Output::Stdout, Output::File), wait))
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    let side = resolve(&args)?;
    if let Some(p) = &args.input {
        readable("-i", p)?;
    }
    if let Some(p) = &args.output {
        writable_dir("-o", p)?;
    }
    let live = Arc::new(MpcatCounters::default());
    let screen = Screen::start(&args, &live);
    let result = run_side(side, reverse(&args), &args.out, interrupt, &live, &screen);
    screen.clear();
    result
}

/// The live view (--stats, the progress line), which every summary printed on stderr must
/// clear first: a progress line left above it reads as where the run stopped.
struct Screen {
    monitor: RefCell<Monitor>,
    opts: MonitorOptions,
    live: Arc<MpcatCounters>,
}

impl Screen {
    fn start(args: &Args, live: &Arc<MpcatCounters>) -> Screen {
        let opts = MonitorOptions {
            stats_every: args.run.stats.filter(|d| !d.is_zero()),
            progress: args.out.progress(),
        };
        Screen {
            monitor: RefCell::new(Screen::monitor(&opts, live)),
            opts,
            live: Arc::clone(live),
        }
    }

    fn monitor(opts: &MonitorOptions, live: &Arc<MpcatCounters>) -> Monitor {
        let live = Arc::clone(live);
        let mut prev = (Duration::ZERO, 0, Vec::new());
        Monitor::start(opts.clone(), move |elapsed| live.line(elapsed, &mut prev))
    }

    /// Stops the live view and clears the progress line.
    fn clear(&self) {
        self.monitor.borrow_mut().stop();
    }

    /// -k: a session's summary between sessions: the progress line cleared first, then
    /// drawn again for the next session.
    fn between(&self, text: &str) {
        self.clear();
        eprint!("{text}");
        *self.monitor.borrow_mut() = Screen::monitor(&self.opts, &self.live);
    }
}

/// The report's tail: stdout (summary or --json) unless stdout carries the stream, then the
/// summary goes to stderr; the verdict becomes the exit status.
fn finish(report: &MpcatReport, out: &OutputFlags, stdout_is_stream: bool) -> Result<(), Failure> {
    if !stdout_is_stream {
        return common::finish(report, out);
    }
    if !out.quiet {
        eprint!("{}", report.human());
    }
    match report.verdict() {
        Verdict::Done => Ok(()),
        Verdict::Failed(why) => Err(Failure::Runtime(why)),
    }
}

fn run_side(
    side: Side,
    back: Option<(Output, Wait)>,
    out: &OutputFlags,
    interrupt: &'static AtomicBool,
    live: &MpcatCounters,
    screen: &Screen,
) -> Result<(), Failure> {
    // A run that failed before it had a report still gives --json its document.
    let failed = |role: Role, address: String, e: tcpkit_mpcat::Error| {
        let why = crate::chain(&e);
        screen.clear();
        if out.json {
            let r = MpcatReport::failed(role, address, why.clone());
            common::print(&(r.json() + "\n"));
        }
        Failure::Runtime(why)
    };
    match side {
        Side::Send(cfg) => {
            let quiet = out.quiet;
            let hint = move |m: &str| {
                if !quiet {
                    eprintln!("tcpkit mpcat: {m}");
                }
            };
            let address = cfg.address.clone();
            let Some((output, wait)) = back else {
                let report = tcpkit_mpcat::send::run(&cfg, interrupt, live, &hint)
                    .map_err(|e| failed(Role::Send, address, e))?;
                screen.clear();
                return finish(&report, out, false);
            };
            let report =
                tcpkit_mpcat::duplex::connect_side(&cfg, &output, wait, interrupt, live, &hint)
                    .map_err(|e| failed(Role::Send, address, e))?;
            screen.clear();
            // stdout may carry the listener's stream: the summary goes to stderr then.
            finish(&report, out, output == Output::Stdout)
        }
        Side::Receive(cfg) => {
            let address = cfg.listen.to_string();
            let listener = tcpkit_mpcat::recv::bind(cfg.listen, cfg.mptcp, cfg.v6only)
                .map_err(|e| failed(Role::Receive, address.clone(), e))?;
            let quiet = out.quiet;
            if let (Some(why), false) = (listener.mptcp_fallback(), quiet) {
                eprintln!("tcpkit mpcat: {why}");
            }
            if cfg.verbose {
                eprintln!("tcpkit mpcat: listening on {}", listener.local_addr());
            }
            // With -k each session's summary goes to stderr as it ends, once; the run's
            // total follows at the end.
            let shown = Cell::new(0u64);
            let each = |r: &MpcatReport| {
                shown.set(shown.get() + 1);
                if !quiet {
                    screen.between(&r.human());
                }
            };
            let report = tcpkit_mpcat::recv::run(&cfg, listener, interrupt, live, &each)
                .map_err(|e| failed(Role::Receive, address, e))?;
            screen.clear();
            let to_stdout = cfg.output == Output::Stdout;
            if report.run.is_some() && shown.get() == report.sessions && !out.json && !quiet {
                // The last session was summed up as it ended: only the total is new.
                let total = report.run_summary();
                if to_stdout {
                    eprint!("{total}");
                } else {
                    common::print(&total);
                }
                return match report.verdict() {
                    Verdict::Done => Ok(()),
                    Verdict::Failed(why) => Err(Failure::Runtime(why)),
                };
            }
            finish(&report, out, to_stdout)
        }
    }
}

/// --chunk: SIZE (fixed) or MIN-MAX (adaptive), as (smallest, largest); the default when
/// not given.
fn chunk_bounds(text: Option<&str>) -> Result<(u32, u32), Failure> {
    let Some(t) = text else {
        return Ok((tcpkit_mpcat::DEFAULT_CHUNK_MIN, tcpkit_mpcat::DEFAULT_CHUNK));
    };
    let size = |x: &str| {
        let n = common::size_arg(x.trim()).map_err(|e| usage(format!("--chunk {t}: {e}")))?;
        if !(frame::MIN_CHUNK as u64..=frame::MAX_CHUNK as u64).contains(&n) {
            return Err(usage(format!("--chunk {t}: {n} bytes, must be 1K to 1M")));
        }
        Ok(n as u32)
    };
    let (lo, hi) = match t.split_once('-') {
        Some((a, b)) => (size(a)?, size(b)?),
        None => {
            let n = size(t)?;
            (n, n)
        }
    };
    if lo > hi {
        return Err(usage(format!(
            "--chunk {t}: MIN-MAX with the smaller first"
        )));
    }
    if lo < tcpkit_mpcat::smallest_chunk(hi) {
        return Err(usage(format!(
            "--chunk {t}: MAX may be at most {} times MIN",
            tcpkit_mpcat::CHUNK_SPAN
        )));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Side, String> {
        let mut v = vec!["mpcat"];
        v.extend_from_slice(args);
        let a = Args::try_parse_from(v).map_err(|e| e.to_string())?;
        resolve(&a).map_err(|f| match f {
            Failure::Usage(m) | Failure::Runtime(m) => m,
        })
    }

    #[test]
    fn the_receiving_side_and_its_defaults() {
        let Side::Receive(c) = parse(&["-l", "-p", "31337"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.listen, "[::]:31337".parse().unwrap());
        assert_eq!(c.output, Output::Stdout);
        assert_eq!(c.window, 64 << 20);
        assert_eq!(c.path_timeout, Duration::from_secs(5));
        assert_eq!(c.handshake_timeout, Duration::from_secs(5));
        let Side::Receive(c) = parse(&[
            "--listen",
            "--port",
            "9",
            "-o",
            "out.bin",
            "--window",
            "8M",
            "--json",
            "--quiet",
            "--path-timeout",
            "2s",
            "--hello-timeout",
            "1s",
            "-k",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.handshake_timeout, Duration::from_secs(1));
        assert_eq!(c.output, Output::File("out.bin".into()));
        assert_eq!(c.window, 8 << 20);
        assert_eq!(c.path_timeout, Duration::from_secs(2));
        assert!(c.keep);
        assert!(!c.resume);
        let Side::Receive(c) = parse(&["-l", "-p", "9", "--resume", "-o", "f"]).unwrap() else {
            panic!()
        };
        assert!(c.resume);
        let Side::Send(c) = parse(&["--resume", "-i", "f", "127.0.0.1", "9"]).unwrap() else {
            panic!()
        };
        assert!(c.resume);
        let Side::Receive(c) = parse(&["-l", "-p", "9", "--keep-listening"]).unwrap() else {
            panic!()
        };
        assert!(c.keep);
    }

    #[test]
    fn the_sending_side_and_its_defaults() {
        let Side::Send(c) = parse(&["127.0.0.1", "31337"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.peer, vec!["127.0.0.1:31337".parse().unwrap()]);
        assert_eq!((c.streams, c.chunk_min, c.chunk), (None, 64 << 10, 1 << 20));
        assert_eq!(c.input, Input::Stdin);
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert!(!c.zerocopy, "copying is the default");
        let Side::Send(z) = parse(&["-Z", "-i", "image.raw", "127.0.0.1", "9"]).unwrap() else {
            panic!()
        };
        assert!(z.zerocopy);
        let Side::Send(c) = parse(&[
            "-n",
            "8",
            "-i",
            "image.raw",
            "--chunk",
            "64K",
            "--connect-timeout",
            "2s",
            "--path-timeout",
            "1500ms",
            "--rate-limit",
            "300M",
            "--stats",
            "2",
            "::1",
            "9",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.address, "[::1]:9");
        assert_eq!(
            (c.streams, c.chunk_min, c.chunk),
            (Some(8), 64 << 10, 64 << 10)
        );
        let Side::Send(adaptive) = parse(&["--chunk", "16K-256K", "127.0.0.1", "9"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((adaptive.chunk_min, adaptive.chunk), (16 << 10, 256 << 10));
        assert_eq!(c.input, Input::File("image.raw".into()));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.path_timeout, Duration::from_millis(1500));
        assert_eq!(c.rate_limit, Some(300 << 20));
        assert_eq!(c.size, None);
        let Side::Send(c) = parse(&["--size", "20G", "127.0.0.1", "9"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.size, Some(20 << 30));
        let Side::Send(c) = parse(&["--streams", "2", "--input", "x", "[::1]", "9"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((c.streams, c.address.as_str()), (Some(2), "[::1]:9"));
    }

    /// The shared run flags: --duration reaches both sides' configs (none by default);
    /// --quiet has no -q here, which stays nc's quit-after.
    #[test]
    fn duration_and_the_shared_flags_reach_both_sides() {
        let Side::Send(c) = parse(&["--duration", "3s", "127.0.0.1", "9"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.duration, Some(Duration::from_secs(3)));
        let Side::Send(c) = parse(&["127.0.0.1", "9"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.duration, None);
        let Side::Receive(c) = parse(&["-l", "-p", "9", "-k", "--duration", "1m"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.duration, Some(Duration::from_secs(60)));
        let Side::Receive(c) = parse(&["-l", "-p", "9"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.duration, None);
        let a = Args::try_parse_from(["mpcat", "--quiet", "-q", "5", "--stats", "2", "h", "1"])
            .unwrap();
        assert!(a.out.quiet);
        assert_eq!(a.quit_after, Some(5));
        assert_eq!(a.run.stats, Some(Duration::from_secs(2)));
        assert!(parse(&["--duration", "soon", "h", "1"])
            .unwrap_err()
            .contains("--duration"));
    }

    #[test]
    fn the_reverse_stream_and_how_long_to_wait_for_it() {
        let r = |args: &[&str]| {
            let mut v = vec!["mpcat"];
            v.extend_from_slice(args);
            reverse(&Args::try_parse_from(v).unwrap())
        };
        // As OpenBSD nc: the answer is waited for to its end unless -q says otherwise.
        assert_eq!(r(&["h", "1"]), Some((Output::Stdout, Wait::Forever)));
        assert_eq!(r(&["-q", "0", "h", "1"]), Some((Output::Stdout, Wait::Now)));
        assert_eq!(r(&["-N", "h", "1"]), Some((Output::Stdout, Wait::Forever)));
        assert_eq!(
            r(&["-q", "-1", "h", "1"]),
            Some((Output::Stdout, Wait::Forever))
        );
        assert_eq!(
            r(&["-q", "0", "-N", "h", "1"]),
            Some((Output::Stdout, Wait::Now))
        );
        assert_eq!(
            r(&["-q", "3", "-o", "back", "h", "1"]),
            Some((
                Output::File("back".into()),
                Wait::For(Duration::from_secs(3))
            ))
        );
        // --json holds stdout: the session is one way unless -o says where to.
        assert_eq!(r(&["--json", "h", "1"]), None);
        assert!(r(&["--json", "-o", "b", "h", "1"]).is_some());
        assert_eq!(r(&["-l", "-p", "1"]), None);
        let Side::Receive(c) = parse(&["-l", "-p", "1", "-i", "answer"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.input, Input::File("answer".into()));
        let Side::Send(_) = parse(&["-o", "back", "127.0.0.1", "1"]).unwrap() else {
            panic!()
        };
    }

    /// Issue 24 item 9: nc's ways of saying where to listen, -s, -4/-6, -w and -v.
    #[test]
    fn nc_habits_are_understood() {
        let listen = |args: &[&str]| match parse(args).unwrap() {
            Side::Receive(c) => (c.listen, c.v6only),
            Side::Send(_) => panic!("{args:?}"),
        };
        assert_eq!(
            listen(&["-l", "31355"]),
            ("[::]:31355".parse().unwrap(), false)
        );
        assert_eq!(
            listen(&["-l", "-p", "31355"]).0,
            "[::]:31355".parse().unwrap()
        );
        assert_eq!(
            listen(&["-l", "127.0.0.1", "31355"]).0,
            "127.0.0.1:31355".parse().unwrap()
        );
        assert_eq!(
            listen(&["-l", "-s", "127.0.0.1", "-p", "31355"]).0,
            "127.0.0.1:31355".parse().unwrap()
        );
        assert_eq!(listen(&["-l", "[::1]", "9"]).0, "[::1]:9".parse().unwrap());
        assert_eq!(listen(&["-4", "-l", "9"]).0, "0.0.0.0:9".parse().unwrap());
        assert_eq!(
            listen(&["-6", "-l", "9"]),
            ("[::]:9".parse().unwrap(), true)
        );
        let Side::Send(c) = parse(&["-s", "127.0.0.2", "-w", "3", "-v", "127.0.0.1", "9"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.source, Some("127.0.0.2".parse().unwrap()));
        assert_eq!(c.connect_timeout, Duration::from_secs(3));
        assert_eq!(c.idle, Some(Duration::from_secs(3)));
        assert!(c.verbose);
        let Side::Send(c) =
            parse(&["-w", "3", "--connect-timeout", "1s", "127.0.0.1", "9"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.connect_timeout, Duration::from_secs(1));
        let Side::Send(c) = parse(&["-4", "localhost", "9"]).unwrap() else {
            panic!()
        };
        assert!(c.peer.iter().all(SocketAddr::is_ipv4), "{:?}", c.peer);
        let e = |args: &[&str]| parse(args).map(|_| ()).expect_err(&format!("{args:?}"));
        assert!(e(&["-l", "nine"]).contains("-l nine: not a port"));
        assert!(e(&["-l", "127.0.0.1", "9", "-p", "9"]).contains("-p 9 and a PORT"));
        assert!(e(&["-l", "127.0.0.1", "9", "-s", "::1"]).contains("give the address once"));
        assert!(e(&["-4", "-l", "::1", "9"]).contains("another family"));
        assert!(e(&["-6", "127.0.0.1", "9"]).contains("no IPv6 (-6) address"));
        assert!(e(&["-4", "-6", "h", "9"]).contains("cannot be used"));
    }

    /// Issue 24 item 9: --rate-limit in bytes as every size, or in bits as iperf3's -b.
    #[test]
    fn rates_say_bits_or_bytes() {
        assert_eq!(rate_arg("100M"), Ok(100 << 20));
        assert_eq!(rate_arg("100MB"), Ok(100 << 20));
        assert_eq!(rate_arg("100MiB"), Ok(100 << 20));
        assert_eq!(rate_arg("100MB/s"), Ok(100 << 20));
        assert_eq!(rate_arg("100Mbit"), Ok(12_500_000));
        assert_eq!(rate_arg("100Mbps"), Ok(12_500_000));
        assert_eq!(rate_arg("100mbit/s"), Ok(12_500_000));
        assert_eq!(rate_arg("1.5Gbit"), Ok(187_500_000));
        assert_eq!(rate_arg("800kbit"), Ok(100_000));
        assert!(rate_arg("fastbit").unwrap_err().contains("100Mbit"));
        let Side::Send(c) = parse(&["--rate-limit", "100Mbit", "127.0.0.1", "9"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.rate_limit, Some(12_500_000));
    }

    /// Issue 24 item 15: a file the run cannot use is a usage error, before anything runs.
    #[test]
    fn unusable_files_are_usage_errors() {
        let f = |r: Result<(), Failure>| match r {
            Err(Failure::Usage(m)) => m,
            other => panic!("{other:?}"),
        };
        let no = std::path::Path::new("/no/such/file");
        assert!(f(readable("-i", no)).starts_with("-i /no/such/file: "));
        assert!(f(readable("-i", std::path::Path::new("/"))).contains("a directory"));
        assert!(
            f(writable_dir("-o", std::path::Path::new("/no/such/dir/out")))
                .starts_with("-o /no/such/dir/out: /no/such/dir: ")
        );
        assert!(writable_dir("-o", std::path::Path::new("out.bin")).is_ok());
        let a = Args::try_parse_from(["mpcat", "--psk-file", "/no/such/key", "-l", "9"]).unwrap();
        assert!(f(resolve(&a).map(|_| ())).starts_with("--psk-file /no/such/key"));
    }

    #[test]
    fn bad_values_say_which_flag() {
        let e = |args: &[&str]| parse(args).map(|_| ()).expect_err(&format!("{args:?}"));
        assert!(e(&["-l"]).contains("-l -p PORT"));
        assert!(e(&["-l", "-p", "0"]).contains("-p 0"));
        assert!(e(&["-l", "-p", "1", "--window", "1K"]).contains("--window 1024"));
        assert!(e(&["-l", "-p", "1", "--json"]).contains("-o FILE"));
        assert!(e(&[]).contains("HOST PORT"));
        assert!(e(&["h"]).contains("HOST PORT"));
        assert!(e(&["127.0.0.1", "0"]).contains("PORT 0"));
        assert!(e(&["-n", "0", "127.0.0.1", "1"]).contains("-n 0"));
        assert!(e(&["-n", "257", "127.0.0.1", "1"]).contains("-n 257"));
        assert!(e(&["--chunk", "100", "127.0.0.1", "1"]).contains("--chunk 100"));
        // -Z sends a file: not stdin, not the listener, not sealed records.
        assert!(e(&["-Z", "127.0.0.1", "1"]).contains("--input"));
        assert!(e(&["-Z", "-i", "f", "-l", "-p", "1"]).contains("--listen"));
        assert!(e(&["-Z", "-i", "f", "--psk-file", "k", "127.0.0.1", "1"]).contains("--psk-file"));
        assert!(e(&["--chunk", "2M", "127.0.0.1", "1"]).contains("--chunk"));
        assert!(e(&["--chunk", "1K-1M", "127.0.0.1", "1"]).contains("--chunk 1K-1M: MAX"));
        assert!(e(&["--chunk", "1M-64K", "127.0.0.1", "1"]).contains("--chunk 1M-64K"));
        assert!(e(&["--chunk", "64K-x", "127.0.0.1", "1"]).contains("--chunk 64K-x"));
        // Flags of the other side are refused.
        assert!(e(&["-l", "-p", "1", "-n", "3"]).contains("--streams"));
        assert!(e(&["-q", "-2", "h", "1"]).contains("-q -2"));
        assert!(e(&["-l", "-p", "1", "-N"]).contains("cannot be used"));
        assert!(e(&["-l", "-p", "1", "-q", "1"]).contains("cannot be used"));
        assert!(e(&["--window", "8M", "127.0.0.1", "1"]).contains("--listen"));
        assert!(e(&["-l", "-p", "1", "127.0.0.1", "1"]).contains("-p 1 and a PORT"));
        assert!(e(&["--connect-timeout", "soon", "h", "1"]).contains("--connect-timeout"));
        assert!(e(&["--path-timeout", "500ms", "h", "1"]).contains("--path-timeout 500ms"));
        assert!(e(&["--rate-limit", "0", "h", "1"]).contains("--rate-limit 0"));
        assert!(e(&["-k", "h", "1"]).contains("-k/--keep-listening"));
        assert!(e(&["--hello-timeout", "1s", "h", "1"]).contains("--hello-timeout is for"));
        assert!(e(&["-l", "-p", "1", "--hello-timeout", "0"]).contains("--hello-timeout 0"));
        assert!(e(&["--rate-limit", "fast", "h", "1"]).contains("--rate-limit"));
        assert!(e(&["-l", "-p", "1", "--rate-limit", "1M"]).contains("--rate-limit"));
        assert!(e(&["--stats", "often", "h", "1"]).contains("--stats"));
        assert!(e(&["--mptcp", "-n", "2", "h", "1"]).contains("-n 2 with --mptcp"));
        assert!(e(&["--size", "lots", "h", "1"]).contains("--size"));
        assert!(e(&["-l", "-p", "1", "--size", "1M"]).contains("--size"));
        assert!(e(&["--resume", "h", "1"]).contains("--resume needs -i FILE"));
        assert!(e(&["-l", "-p", "1", "--resume"]).contains("--resume needs -o FILE"));
        assert!(e(&["-l", "-p", "1", "--resume", "-k", "-o", "f"]).contains("--resume with -k"));
        assert!(
            e(&["--resume", "-i", "f", "--duration", "1s", "127.0.0.1", "1"])
                .contains("--resume with --duration")
        );
    }
}
