//! `tcpkit replay prep`: tcpprep 4.4.3's modes, writing its cache byte for byte, and the
//! automatic split `--intf2` uses without a cache (tcpprep `--auto=client`).
//!
//! What each mode sends out of which side is tcpprep's *code*, which in places is not its
//! documentation (the cache must be tcpprep's, and tcpreplay reads it the same way):
//! - auto (bridge, router, client, server): a first pass counts, per source address, packets
//!   that show it a client (bare SYN, DNS query) or a server (SYN-ACK, DNS answer, ICMP port
//!   unreachable); a host is a server when server ≥ client × `--ratio` (2.0), a client when it
//!   has counts and is not, unknown with none. The second pass sends a packet out of the
//!   primary side (`--intf1`) when its source is a client, the secondary (`--intf2`) when a
//!   server; unknown sources go primary in client and router modes, secondary in server and
//!   bridge modes. Router mode is client mode that fails (as tcpprep does) when the lowest
//!   host in tcpprep's tree order is a client: its network list is never filled, so that is
//!   the only check its search makes. tcpprep's tree compares every IPv6 address as equal: all
//!   IPv6 hosts are one host, here too.
//! - first: a host first seen as a source is a client, first seen as a destination a server.
//! - cidr: a source inside one of the networks goes primary (tcpprep's help says "servers",
//!   its code sends them out of the primary side), others secondary; `--reverse` swaps.
//! - port: TCP/UDP to a destination port below 1024 goes primary, others secondary; other IP
//!   protocols go as non-IP packets do.
//! - non-IP packets go secondary, or primary with `--nonip` (the reverse of tcpprep's help,
//!   again its code).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

pub use tcpkit_pcap::{CaptureFile, PrepCache, PrepDir};
use tcpkit_send::SendCounters;

use crate::config::{Config, Output, Split};
use crate::report::{IfDelta, ReplaySplit};
use crate::ReplayError;
use tcpkit_wire::{prep_supports, PrepAddr, PrepPort, PrepRole, PrepView};

/// tcpprep's `MYARGS_LEN`: the arguments part of the comment is cut to 1023 bytes.
const MYARGS_LEN: usize = 1024;
/// tcpprep's bound on `-C`: the comment field is 16 bits and the arguments take up to 1024.
pub const MAX_USER_COMMENT: usize = (1 << 16) - 1 - MYARGS_LEN;

/// tcpprep's `--auto` hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoMode {
    Bridge,
    Router,
    Client,
    Server,
    First,
}

impl AutoMode {
    /// tcpprep's names, which `--auto` takes.
    pub fn parse(s: &str) -> Option<AutoMode> {
        Some(match s {
            "bridge" => AutoMode::Bridge,
            "router" => AutoMode::Router,
            "client" => AutoMode::Client,
            "server" => AutoMode::Server,
            "first" => AutoMode::First,
            _ => return None,
        })
    }
}

/// A network of `--cidr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepCidr {
    V4(Ipv4Addr, u8),
    V6(Ipv6Addr, u8),
}

impl PrepCidr {
    /// tcpprep's `--cidr` list: `a.b.c.d[/n]` and `[v6addr/n]` (brackets optional), comma
    /// separated.
    pub fn parse_list(s: &str) -> Result<Vec<PrepCidr>, String> {
        s.split(',')
            .filter(|p| !p.is_empty())
            .map(PrepCidr::parse)
            .collect()
    }

    fn parse(s: &str) -> Result<PrepCidr, String> {
        let bad = |why: &str| format!("{s:?}: {why}");
        let t = s.trim_start_matches('[');
        let t = t.split(']').next().unwrap_or_default();
        let (addr, len) = match t.split_once('/') {
            Some((a, l)) => (
                a,
                Some(l.parse::<u8>().map_err(|_| bad("bad mask length"))?),
            ),
            None => (t, None),
        };
        if let Ok(a) = addr.parse::<Ipv4Addr>() {
            let len = len.unwrap_or(32);
            if len > 32 {
                return Err(bad("an IPv4 mask is 0 to 32"));
            }
            return Ok(PrepCidr::V4(a, len));
        }
        if let Ok(a) = addr.parse::<Ipv6Addr>() {
            let len = len.unwrap_or(128);
            if len > 128 {
                return Err(bad("an IPv6 mask is 0 to 128"));
            }
            return Ok(PrepCidr::V6(a, len));
        }
        Err(bad("not an IPv4 or IPv6 network"))
    }

    fn contains(&self, a: &PrepAddr) -> bool {
        match (self, a) {
            (PrepCidr::V4(n, len), PrepAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
                u32::from_be_bytes(*ip) & mask == u32::from(*n) & mask
            }
            (PrepCidr::V6(n, len), PrepAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
                u128::from_be_bytes(*ip) & mask == u128::from(*n) & mask
            }
            _ => false,
        }
    }
}

/// How packets are split.
#[derive(Debug, Clone, PartialEq)]
pub enum PrepMode {
    Auto(AutoMode),
    Cidr(Vec<PrepCidr>),
    Port,
}

/// tcpprep's options that change the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepOptions {
    pub mode: PrepMode,
    /// `--reverse` (cidr mode).
    pub reverse: bool,
    /// `--nonip`.
    pub nonip: bool,
    /// `--ratio`.
    pub ratio: f64,
    /// The comment stored in the file (see [`prep_comment`]).
    pub comment: Vec<u8>,
}

impl PrepOptions {
    /// tcpprep's defaults for `mode`: ratio 2.0, no comment.
    pub fn new(mode: PrepMode) -> PrepOptions {
        PrepOptions {
            mode,
            reverse: false,
            nonip: false,
            ratio: 2.0,
            comment: Vec::new(),
        }
    }
}

/// The comment tcpprep stores: its arguments joined by spaces (cut to 1023 bytes, its buffer,
/// then its last byte dropped), skipping `-C` with the two arguments after it (tcpprep skips
/// one too many: `-C text --auto=client` keeps neither); then a newline and the `-C` text.
/// With `--no-arg-comment`, the arguments part is empty.
pub fn prep_comment(args: &[String], user: Option<&str>, no_args: bool) -> Vec<u8> {
    let mut myargs: Vec<u8> = Vec::new();
    let strlcat = |buf: &mut Vec<u8>, s: &[u8]| {
        let room = (MYARGS_LEN - 1).saturating_sub(buf.len());
        buf.extend_from_slice(&s[..s.len().min(room)]);
    };
    if !no_args {
        let mut i = 0;
        while i < args.len() {
            if args[i] == "-C" {
                i += 3;
                continue;
            }
            strlcat(&mut myargs, args[i].as_bytes());
            strlcat(&mut myargs, b" ");
            i += 1;
        }
        myargs.pop();
    }
    if let Some(c) = user {
        strlcat(&mut myargs, b"\n");
        myargs.extend_from_slice(c.as_bytes());
    }
    myargs
}

/// Why a capture cannot be prepared (tcpprep would stop too); one line.
#[derive(Debug, thiserror::Error)]
pub enum PrepError {
    #[error(transparent)]
    Input(#[from] tcpkit_pcap::PcapError),
    #[error("{path}: packet {number}: {what}")]
    Packet {
        path: String,
        number: u64,
        what: String,
    },
    #[error("{0}")]
    Mode(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Client,
    Server,
    Unknown,
}

#[derive(Debug, Clone, Copy)]
struct Host {
    server: i64,
    client: i64,
    kind: Kind,
}

/// tcpprep's tree order: family (IPv4 first), then the address as the little-endian number its
/// network-order bytes make; every IPv6 address is one key (its comparison compares an
/// address with itself).
fn tree_key(a: &PrepAddr) -> (u8, u32) {
    match a {
        PrepAddr::V4(b) => (0, u32::from_le_bytes(*b)),
        PrepAddr::V6(_) => (1, 0),
    }
}

/// What one pass over a capture does with each packet: its number, and its view (None for
/// what tcpprep calls non-IP).
type Visit<'f> = dyn FnMut(u64, Option<PrepView<'_>>) -> Result<(), PrepError> + 'f;

/// Builds tcpprep's cache for one capture.
pub fn prep(file: &CaptureFile, opts: &PrepOptions) -> Result<PrepCache, PrepError> {
    let path = file.path().display().to_string();
    let fail = |number: u64, what: String| PrepError::Packet {
        path: path.clone(),
        number,
        what,
    };
    // Every packet through tcpprep's eyes, the closure given the view (None: not IP).
    let walk = |f: &mut Visit<'_>| {
        let mut n = 0u64;
        for p in file.packets() {
            let p = p?;
            n = p.number;
            if !prep_supports(p.linktype) {
                return Err(fail(
                    p.number,
                    format!("link type DLT {}: tcpprep takes Ethernet (1), raw IP (101) and Linux cooked (113)", p.linktype),
                ));
            }
            let v =
                PrepView::parse(p.linktype, p.data).map_err(|e| fail(p.number, e.to_string()))?;
            f(p.number, v)?;
        }
        if n == 0 {
            return Err(PrepError::Mode(format!(
                "{path}: no packets were processed"
            )));
        }
        Ok(())
    };
    let mut tree: BTreeMap<(u8, u32), Host> = BTreeMap::new();
    if let PrepMode::Auto(auto) = opts.mode {
        let first = auto == AutoMode::First;
        walk(&mut |number, v| {
            let Some(v) = v else { return Ok(()) };
            if first {
                tree.entry(tree_key(&v.src())).or_insert(Host {
                    server: 0,
                    client: 1000,
                    kind: Kind::Client,
                });
                tree.entry(tree_key(&v.dst())).or_insert(Host {
                    server: 1000,
                    client: 0,
                    kind: Kind::Server,
                });
                return Ok(());
            }
            let role = v.role().map_err(|e| {
                fail(
                    number,
                    format!(
                        "{e}: tcpprep stops here too (packet capture length too small to process)"
                    ),
                )
            })?;
            let (s, c, kind) = match role {
                PrepRole::Server => (1, 0, Kind::Server),
                PrepRole::Client => (0, 1, Kind::Client),
                PrepRole::Unknown => (0, 0, Kind::Unknown),
            };
            let h = tree.entry(tree_key(&v.src())).or_insert(Host {
                server: 0,
                client: 0,
                kind,
            });
            h.server += s;
            h.client += c;
            Ok(())
        })?;
        for h in tree.values_mut() {
            h.kind = if h.server > 0 || h.client > 0 {
                if h.server as f64 >= h.client as f64 * opts.ratio {
                    Kind::Server
                } else {
                    Kind::Client
                }
            } else {
                Kind::Unknown
            };
        }
        if auto == AutoMode::Router && tree.values().next().is_some_and(|h| h.kind == Kind::Client)
        {
            return Err(PrepError::Mode(format!(
                "{path}: --auto=router: unable to determine any IP addresses as clients (tcpprep fails here too); change --ratio or use --auto=client"
            )));
        }
    }
    let nonip = if opts.nonip {
        PrepDir::Primary
    } else {
        PrepDir::Secondary
    };
    let swap = |d: PrepDir| match d {
        PrepDir::Primary => PrepDir::Secondary,
        PrepDir::Secondary => PrepDir::Primary,
        PrepDir::NoSend => PrepDir::NoSend,
    };
    let mut cache = PrepCache::new(opts.comment.clone());
    walk(&mut |number, v| {
        let Some(v) = v else {
            cache.push(nonip);
            return Ok(());
        };
        let dir = match &opts.mode {
            PrepMode::Cidr(nets) => {
                let src = v.src();
                let d = if nets.iter().any(|n| n.contains(&src)) {
                    PrepDir::Primary
                } else {
                    PrepDir::Secondary
                };
                if opts.reverse {
                    swap(d)
                } else {
                    d
                }
            }
            PrepMode::Port => match v.dst_port() {
                PrepPort::Port { port, .. } if port < 1024 => PrepDir::Primary,
                PrepPort::Port { .. } | PrepPort::Short => PrepDir::Secondary,
                PrepPort::Other => nonip,
            },
            PrepMode::Auto(auto) => {
                let kind = tree.get(&tree_key(&v.src())).map(|h| h.kind);
                let unknown = match auto {
                    AutoMode::Client => PrepDir::Primary,
                    AutoMode::Server | AutoMode::Bridge | AutoMode::First => PrepDir::Secondary,
                    // tcpprep passes its --nonip setting as the default here, the other
                    // way round from the non-IP packets'.
                    AutoMode::Router => swap(nonip),
                };
                match kind {
                    Some(Kind::Client) => PrepDir::Primary,
                    Some(Kind::Server) => PrepDir::Secondary,
                    Some(Kind::Unknown) => unknown,
                    None if matches!(auto, AutoMode::Bridge | AutoMode::First) => {
                        return Err(fail(
                            number,
                            "an unknown system (tcpprep aborts too): try --auto=client".into(),
                        ))
                    }
                    None => unknown,
                }
            }
        };
        cache.push(dir);
        Ok(())
    })?;
    Ok(cache)
}

/// The caches `--intf2` splits by: the `--cachefile` (one, for every input), or tcpprep
/// `--auto=client` of each input.
pub(crate) fn splits(split: &Split, files: &[CaptureFile]) -> Result<Vec<PrepCache>, ReplayError> {
    match split {
        Split::Cache(p) => Ok(vec![PrepCache::read(p).map_err(ReplayError::CacheFile)?]),
        Split::AutoClient => {
            let opts = PrepOptions::new(PrepMode::Auto(AutoMode::Client));
            files
                .iter()
                .map(|f| {
                    prep(f, &opts).map_err(|e| {
                        ReplayError::Setup(format!(
                            "--intf2 without --cachefile splits as tcpprep --auto=client: {e}"
                        ))
                    })
                })
                .collect()
        }
    }
}

/// What each side sent, per worker and summed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SplitCounts {
    /// (frames, bytes) sent whole out of `--intf1`.
    pub intf1: (u64, u64),
    /// (frames, bytes) sent whole out of `--intf2`.
    pub intf2: (u64, u64),
    pub not_sent: u64,
}

impl SplitCounts {
    pub(crate) fn add(&mut self, o: &SplitCounts) {
        self.intf1 = (self.intf1.0 + o.intf1.0, self.intf1.1 + o.intf1.1);
        self.intf2 = (self.intf2.0 + o.intf2.0, self.intf2.1 + o.intf2.1);
        self.not_sent += o.not_sent;
    }
}

/// The report's `split`, None without `--intf2`.
pub(crate) fn split_report(
    cfg: &Config,
    c: &SplitCounts,
    if2_before: Option<tcpkit_send::IfCounters>,
) -> Option<ReplaySplit> {
    let i2 = cfg.intf2.as_ref()?;
    let intf1 = match &cfg.output {
        Output::Interface { name, .. } => name.clone(),
        Output::File(p) => p.display().to_string(),
    };
    Some(ReplaySplit {
        intf1,
        intf2: i2.name.clone(),
        source: match &i2.split {
            Split::Cache(p) => format!("cache {}", p.display()),
            Split::AutoClient => "auto client".into(),
        },
        intf1_packets: c.intf1.0,
        intf1_bytes: c.intf1.1,
        intf2_packets: c.intf2.0,
        intf2_bytes: c.intf2.1,
        not_sent: c.not_sent,
        intf2_interface: if2_before.and_then(|b| {
            let a = tcpkit_send::if_counters(&i2.name).ok()?;
            Some(IfDelta {
                tx_packets: a.tx_packets.saturating_sub(b.tx_packets),
                tx_bytes: a.tx_bytes.saturating_sub(b.tx_bytes),
                tx_dropped: a.tx_dropped.saturating_sub(b.tx_dropped),
                tx_errors: a.tx_errors.saturating_sub(b.tx_errors),
            })
        }),
    })
}

/// Two sinks' counters as one.
pub(crate) fn sum_counters(a: &SendCounters, b: &SendCounters) -> SendCounters {
    SendCounters {
        successful: a.successful + b.successful,
        failed: a.failed + b.failed,
        failed_too_big: a.failed_too_big + b.failed_too_big,
        failed_malformed: a.failed_malformed + b.failed_malformed,
        failed_stuck: a.failed_stuck + b.failed_stuck,
        truncated: a.truncated + b.truncated,
        retried_enobufs: a.retried_enobufs + b.retried_enobufs,
        retried_eagain: a.retried_eagain + b.retried_eagain,
        bytes: a.bytes + b.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_comment_is_tcpprep_s_skip_included() {
        let a = s(&["--auto=client", "-i", "in.pcap", "-o", "o.cache"]);
        assert_eq!(
            prep_comment(&a, None, false),
            b"--auto=client -i in.pcap -o o.cache"
        );
        let a = s(&["-C", "hello", "--auto=client", "-i", "x", "-o", "y"]);
        assert_eq!(prep_comment(&a, Some("hello"), false), b"-i x -o y\nhello");
        assert_eq!(prep_comment(&a, Some("hello"), true), b"\nhello");
        assert_eq!(prep_comment(&a, None, true), b"");
        let long = s(&["x".repeat(2000).as_str(), "-i"]);
        let c = prep_comment(&long, None, false);
        assert_eq!(c.len(), 1022);
    }

    #[test]
    fn cidrs_parse_as_tcpprep_takes_them() {
        let l = PrepCidr::parse_list("10.0.0.0/8,192.168.1.1,[fe80::/16],::1").unwrap();
        assert_eq!(
            l,
            vec![
                PrepCidr::V4(Ipv4Addr::new(10, 0, 0, 0), 8),
                PrepCidr::V4(Ipv4Addr::new(192, 168, 1, 1), 32),
                PrepCidr::V6("fe80::".parse().unwrap(), 16),
                PrepCidr::V6("::1".parse().unwrap(), 128),
            ]
        );
        assert!(l[0].contains(&PrepAddr::V4([10, 9, 8, 7])));
        assert!(!l[0].contains(&PrepAddr::V4([11, 0, 0, 0])));
        assert!(PrepCidr::V4(Ipv4Addr::UNSPECIFIED, 0).contains(&PrepAddr::V4([1, 2, 3, 4])));
        assert!(l[2].contains(&PrepAddr::V6([
            0xfe, 0x80, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9
        ])));
        assert!(PrepCidr::parse_list("10.0.0.0/33").is_err());
        assert!(PrepCidr::parse_list("host.example").is_err());
    }
}
