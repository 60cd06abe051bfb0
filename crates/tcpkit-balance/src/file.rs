//! The `balance up` configuration file (TOML): services, each a VIP with its protocol,
//! algorithm, backends and health checks. A file that is not TOML, or has a key of the wrong
//! type or an unknown one, is refused with its line and column; a file that reads but asks for
//! something wrong is refused with the service it concerns. The checks are the ones `run`'s
//! flags go through (`config::check`, `HealthOptions::new`): one place says what is valid.
//!
//! ```toml
//! [[service]]
//! name = "redis"                 # optional; the VIP names it otherwise
//! vip = "198.19.0.1:6379"
//! protocol = "tcp"               # tcp (default) or udp
//! algorithm = "maglev"           # random (default), round-robin, weighted-random,
//!                                # weighted-round-robin, least-conn, weighted-least-conn,
//!                                # maglev (or ipvsadm's rr, wrr, lc, wlc, mh)
//! hash_key = "client"            # maglev only: client (default: address and port), host, cookie
//! persistence = "300s"           # optional: a client keeps its backend (ipvsadm -p)
//! backends = [
//!   { addr = "198.18.0.2:6379", weight = 2 },
//!   { addr = "198.18.0.3:6380" },
//!   { addr = "198.18.0.4:6379", weight = 0 },   # drained: no new sockets
//! ]
//! health = { interval = "1s", timeout = "500ms", rise = 2, fall = 3,
//!            send = 'PING\r\n', expect = "+PONG" }   # optional: an application probe
//! ```
//!
//! `send` and `expect` take the C-style escapes of `--health-send` (`\r`, `\n`, `\xHH`, ...;
//! in a TOML literal string, or with doubled backslashes). Without them a TCP service's probe
//! is a connect and a UDP service's an empty datagram that ICMP port unreachable may answer
//! (`health::Probe`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{self, Algorithm, Backend, ConfigError, HashKey, Protocol, Service};
use crate::health::{self, HealthOptions};

/// Most bytes a configuration file may have: bounded before it is read whole.
pub const MAX_FILE: u64 = 1 << 20;

/// A service as the file gives it, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    /// Its name in errors and in `status` (the VIP unless the file names it).
    pub name: String,
    pub service: Service,
    pub health: Option<HealthOptions>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FileError {
    #[error("{0}: {1}")]
    Read(String, String),
    /// Not TOML, or not the shape of a configuration: file, line, column, what.
    #[error("{0}:{1}:{2}: {3}")]
    Syntax(String, usize, usize, String),
    #[error("{0}: service '{1}': {2}")]
    Service(String, String, String),
    #[error("{0}: {1}")]
    Whole(String, String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    service: Vec<RawService>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    name: Option<String>,
    vip: String,
    protocol: Option<String>,
    algorithm: Option<String>,
    hash_key: Option<String>,
    persistence: Option<RawDuration>,
    #[serde(default)]
    backends: Vec<RawBackend>,
    health: Option<RawHealth>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    addr: String,
    weight: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval: RawDuration,
    timeout: Option<RawDuration>,
    rise: Option<u32>,
    fall: Option<u32>,
    send: Option<String>,
    expect: Option<String>,
}

/// `"500ms"`, `"2s"`, or a number of seconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawDuration {
    Text(String),
    Secs(f64),
}

impl RawDuration {
    fn get(&self) -> Result<Duration, String> {
        match self {
            RawDuration::Text(t) => tcpkit_pace::parse_duration(t),
            RawDuration::Secs(s) => tcpkit_pace::parse_duration(&s.to_string()),
        }
    }
}

/// Reads and checks the file at `path`.
pub fn load(path: &Path) -> Result<Vec<ServiceConfig>, FileError> {
    let shown = path.display().to_string();
    let read = || -> std::io::Result<String> {
        use std::io::Read;
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        // Not blocking on open: a FIFO (or a device) there would hold `up` before it installs
        // anything, or a reload with the status lock held, until something wrote to it.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        let t = f.metadata()?.file_type();
        if !t.is_file() {
            let what = if t.is_fifo() {
                "a FIFO"
            } else if t.is_dir() {
                "a directory"
            } else if t.is_socket() {
                "a socket"
            } else {
                "a device"
            };
            return Err(std::io::Error::other(format!("{what}, not a regular file")));
        }
        let mut text = String::new();
        // One byte more than allowed tells a file at the limit from one beyond it.
        f.take(MAX_FILE + 1).read_to_string(&mut text)?;
        Ok(text)
    };
    let text = read().map_err(|e| FileError::Read(shown.clone(), e.to_string()))?;
    if text.len() as u64 > MAX_FILE {
        return Err(FileError::Read(
            shown,
            format!("larger than {MAX_FILE} bytes"),
        ));
    }
    parse(&shown, &text)
}

/// Line and column (from 1) of byte `at` in `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Parses and checks a configuration; `name` is the file as errors show it.
pub fn parse(name: &str, text: &str) -> Result<Vec<ServiceConfig>, FileError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let (line, col) = e.span().map_or((1, 1), |s| line_col(text, s.start));
        // toml's message can run over lines (it quotes the source); the first says what.
        let what = e.message().lines().next().unwrap_or("").trim().to_string();
        FileError::Syntax(name.to_string(), line, col, what)
    })?;
    if raw.service.is_empty() {
        return Err(FileError::Whole(
            name.to_string(),
            "no [[service]]: nothing to balance".into(),
        ));
    }
    let mut out = Vec::with_capacity(raw.service.len());
    for s in raw.service {
        let label = s.name.clone().unwrap_or_else(|| s.vip.clone());
        let fail = |what: String| FileError::Service(name.to_string(), label.clone(), what);
        let c = service(s).map_err(&fail)?;
        // Flag names in the shared messages (`--backend X: ...`) read as the file's keys.
        c.service.check().map_err(|e| fail(unflag(&e)))?;
        out.push(c);
    }
    let all: Vec<Service> = out.iter().map(|c| c.service.clone()).collect();
    if let Err(e) = config::check(&all) {
        // Each service passed on its own: what is left is between services.
        let which = match &e {
            ConfigError::DuplicateVip(vip, _) => out
                .iter()
                .filter(|c| c.service.vip == *vip)
                .nth(1)
                .map(|c| c.name.clone()),
            _ => None,
        };
        return Err(match which {
            Some(n) => FileError::Service(name.to_string(), n, unflag(&e)),
            None => FileError::Whole(name.to_string(), unflag(&e)),
        });
    }
    Ok(out)
}

/// A shared check's message with the flag dashes dropped (`--vip X` is the file's `vip X`).
fn unflag(e: &ConfigError) -> String {
    let t = e.to_string();
    t.strip_prefix("--").map(str::to_string).unwrap_or(t)
}

fn addr(what: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>().map_err(|_| {
        format!("{what} '{text}': not an IP:PORT ([IPv6]:PORT) with a port from 1 to 65535")
    })
}

fn service(s: RawService) -> Result<ServiceConfig, String> {
    let vip = addr("vip", &s.vip)?;
    let protocol = match s.protocol.as_deref() {
        None | Some("tcp") => Protocol::Tcp,
        Some("udp") => Protocol::Udp,
        Some(p) => return Err(format!("protocol '{p}': tcp or udp")),
    };
    let algorithm = match s.algorithm.as_deref() {
        None => Algorithm::Random,
        Some(a) => Algorithm::parse(a)
            .ok_or_else(|| format!("algorithm '{a}': one of {}", Algorithm::NAMES))?,
    };
    let algorithm = match (algorithm, s.hash_key.as_deref()) {
        (Algorithm::Maglev(_), k) => Algorithm::Maglev(match k {
            None | Some("client") => HashKey::Client,
            Some("host") => HashKey::Host,
            Some("cookie") => HashKey::Cookie,
            Some(k) => return Err(format!("hash_key '{k}': client, host or cookie")),
        }),
        (_, Some(_)) => return Err("hash_key: only algorithm = \"maglev\" hashes".into()),
        (a, None) => a,
    };
    let persistence = match &s.persistence {
        None => None,
        Some(p) => Some(p.get().map_err(|e| format!("persistence {e}"))?),
    };
    let mut backends = Vec::with_capacity(s.backends.len().min(config::MAX_BACKENDS + 1));
    for b in &s.backends {
        backends.push(Backend {
            addr: addr("backend", &b.addr)?,
            weight: b.weight.unwrap_or(1),
        });
    }
    let health = match &s.health {
        None => None,
        Some(h) => {
            let bytes = |t: &Option<String>, key: &str| {
                t.as_deref()
                    .map(tcpkit_pace::units::unescape)
                    .transpose()
                    .map_err(|e| format!("health.{key}: {e}"))
            };
            let probe = health::Probe::new(
                protocol == Protocol::Udp,
                bytes(&h.send, "send")?,
                bytes(&h.expect, "expect")?,
            )
            .map_err(|e| unflag(&e).replacen("health-", "health.", 1))?;
            let d = |r: &RawDuration, key: &str| r.get().map_err(|e| format!("health.{key} {e}"));
            let interval = d(&h.interval, "interval")?;
            let timeout = match &h.timeout {
                Some(t) => d(t, "timeout")?,
                None => HealthOptions::DEFAULT_TIMEOUT,
            };
            Some(
                HealthOptions::new(
                    interval,
                    timeout,
                    h.rise.unwrap_or(HealthOptions::DEFAULT_RISE),
                    h.fall.unwrap_or(HealthOptions::DEFAULT_FALL),
                    probe,
                )
                .map_err(|e| unflag(&e))?,
            )
        }
    };
    Ok(ServiceConfig {
        name: s.name.unwrap_or_else(|| vip.to_string()),
        service: Service {
            vip,
            protocol,
            backends,
            algorithm,
            persistence,
        },
        health,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[service]]
name = "redis"
vip = "198.19.0.1:6379"
algorithm = "maglev"
backends = [ { addr = "198.18.0.2:6379", weight = 2 }, { addr = "198.18.0.3:6380" } ]
health = { interval = "1s", timeout = 0.5, fall = 2 }

[[service]]
vip = "198.19.0.1:53"
protocol = "udp"
backends = [ { addr = "198.18.0.2:53" } ]
"#;

    #[test]
    fn a_good_file_gives_its_services() {
        let s = parse("lb.toml", GOOD).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "redis");
        assert_eq!(s[0].service.algorithm, Algorithm::Maglev(HashKey::Client));
        assert_eq!(s[0].service.backends[0].weight, 2);
        assert_eq!(s[0].service.protocol, Protocol::Tcp);
        let h = s[0].health.clone().unwrap();
        assert_eq!(h.probe, health::Probe::Connect);
        assert_eq!(
            (h.interval, h.timeout, h.rise, h.fall),
            (
                Duration::from_secs(1),
                Duration::from_millis(500),
                HealthOptions::DEFAULT_RISE,
                2
            )
        );
        assert_eq!(s[1].name, "198.19.0.1:53");
        assert_eq!(s[1].service.protocol, Protocol::Udp);
        assert!(s[1].health.is_none());
    }

    #[test]
    fn ipvsadm_names_old_spellings_drain_and_persistence() {
        let one = |body: &str| {
            parse(
                "lb.toml",
                &format!("[[service]]\nvip = \"198.19.0.1:80\"\n{body}\nbackends = [ {{ addr = \"198.18.0.2:80\", weight = 0 }} ]\n"),
            )
            .map(|s| s[0].service.clone())
        };
        for (name, want) in [
            ("rr", Algorithm::RoundRobin),
            ("weighted", Algorithm::WeightedRandom),
            ("weighted-random", Algorithm::WeightedRandom),
            ("wrr", Algorithm::WeightedRoundRobin),
            ("lc", Algorithm::LeastConn),
            ("wlc", Algorithm::WeightedLeastConn),
            ("mh", Algorithm::Maglev(HashKey::Client)),
        ] {
            let s = one(&format!("algorithm = \"{name}\"")).unwrap();
            assert_eq!(s.algorithm, want, "{name}");
            assert_eq!(s.backends[0].weight, 0);
        }
        let s = one("algorithm = \"maglev\"\nhash_key = \"host\"\npersistence = \"300s\"").unwrap();
        assert_eq!(s.algorithm, Algorithm::Maglev(HashKey::Host));
        assert_eq!(s.persistence, Some(Duration::from_secs(300)));
    }

    #[test]
    fn application_probes_from_the_file() {
        let s = parse(
            "lb.toml",
            r#"
[[service]]
vip = "198.19.0.1:6379"
backends = [ { addr = "198.18.0.2:6379" } ]
health = { interval = "1s", send = 'PING\r\n', expect = "+PONG" }
[[service]]
vip = "198.19.0.1:53"
protocol = "udp"
backends = [ { addr = "198.18.0.2:53" } ]
health = { interval = "1s", send = '\x12\x34', expect = '\x12\x34' }
[[service]]
vip = "198.19.0.1:54"
protocol = "udp"
backends = [ { addr = "198.18.0.2:54" } ]
health = { interval = "1s" }
"#,
        )
        .unwrap();
        let probes: Vec<_> = s.iter().map(|c| c.health.clone().unwrap().probe).collect();
        assert_eq!(
            probes,
            [
                health::Probe::Tcp {
                    send: b"PING\r\n".to_vec(),
                    expect: b"+PONG".to_vec()
                },
                health::Probe::Udp {
                    send: vec![0x12, 0x34],
                    expect: vec![0x12, 0x34]
                },
                health::Probe::UdpUnreachable,
            ]
        );
    }

    #[test]
    fn malformed_files_give_line_and_column() {
        let e = parse(
            "lb.toml",
            "[[service]]\nvip = \"198.19.0.1:80\"\nbackends = [\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("lb.toml:3:13: ") && e.contains("unclosed array"),
            "{e}"
        );
        let e = parse("lb.toml", "[[service]]\nvip = 5\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("lb.toml:2:7: "), "{e}");
        let e = parse(
            "lb.toml",
            "[[service]]\nvip = \"198.19.0.1:80\"\n  colour = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("lb.toml:3:3: ") && e.contains("colour"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn semantic_errors_name_the_service() {
        let one = |body: &str| {
            parse("lb.toml", &format!("[[service]]\nname = \"web\"\n{body}\n"))
                .unwrap_err()
                .to_string()
        };
        for (body, want) in [
            (
                "vip = \"198.19.0.1:80\"\nbackends = [{addr = \"198.19.0.1:80\"}]",
                "the same address as the VIP",
            ),
            (
                "vip = \"198.19.0.1:80\"\nbackends = [{addr = \"198.18.0.2:80\"}, {addr = \"198.18.0.2:80\"}]",
                "backend 198.18.0.2:80: given twice",
            ),
            (
                "vip = \"198.19.0.1:80\"\nbackends = [{addr = \"[fd00:18::2]:80\"}]",
                "address family",
            ),
            ("vip = \"198.19.0.1:0\"", "vip 198.19.0.1:0: port 0"),
            (
                "vip = \"198.19.0.1:80\"\nbackends = [{addr = \"198.18.0.2:65536\"}]",
                "backend '198.18.0.2:65536': not an IP:PORT",
            ),
            ("vip = \"198.19.0.1:80\"\nalgorithm = \"fastest\"", "algorithm 'fastest'"),
            (
                "vip = \"198.19.0.1:80\"\npersistence = \"0s\"",
                "persistent 0ns: from 1ms to 1 day",
            ),
            (
                "vip = \"198.19.0.1:80\"\nprotocol = \"udp\"\nhealth = { interval = \"1s\", expect = \"x\" }",
                "health.expect: a UDP probe expects a reply",
            ),
            (
                "vip = \"198.19.0.1:80\"\nhealth = { interval = \"1s\", send = 'a\\q' }",
                "health.send: unknown escape",
            ),
            (
                "vip = \"198.19.0.1:80\"\nhealth = { interval = \"0s\" }",
                "health-interval 0ns: at least 10ms",
            ),
        ] {
            let e = one(body);
            assert!(
                e.starts_with("lb.toml: service 'web': ") && e.contains(want),
                "{body}: {e}"
            );
        }
        let e = parse(
            "lb.toml",
            "[[service]]\nvip = \"198.19.0.1:80\"\n[[service]]\nname = \"again\"\nvip = \"198.19.0.1:80\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("lb.toml: service 'again': vip 198.19.0.1:80: given twice"),
            "{e}"
        );
        assert!(parse("lb.toml", "")
            .unwrap_err()
            .to_string()
            .contains("no [[service]]"));
    }
}
