//! `--tls-uprobe`'s keys: the secrets the server's TLS library held when each handshake
//! completed (tcpkit-tlsprobe's secrets mode), turned into the NSS key log lines a key log
//! file would have carried and fed to the same [`KeyLog`], so the TLS layer decrypts the
//! captured sessions as with `--tls-keylog`. TLS 1.3's handshake traffic secrets are not kept
//! by OpenSSL: they are derived here from its handshake secret and transcript hash (RFC 8446
//! 7.1), as ecapture does.
//!
//! Each handshake's socket pair is remembered (bounded) so a captured session still waiting
//! for its secret after the probes saw its handshake can be named: the client random read
//! from the library was not its ClientHello's, so the layout is not this library's
//! (`probe_layout_mismatch`), never copied.

use std::collections::{HashSet, VecDeque};
use std::fmt::Write as _;
use std::net::SocketAddr;

use tcpkit_tls::decrypt::keys::{expand_label_ctx, Hash};
use tcpkit_tls::decrypt::KeyLog;
use tcpkit_tlsprobe::{SecretProbes, Secrets, TlsVersion};

use crate::report::UprobeStats;

/// Handshakes read per poll at most (the rest wait for the next).
const PER_POLL: usize = 4096;
/// Socket pairs of recent handshakes remembered for the layout check.
const MAX_PAIRS: usize = 1 << 16;
/// Processes remembered for the report's count.
const MAX_PIDS: usize = 1 << 16;

/// The probes' secrets as a key log.
#[derive(Debug)]
pub(crate) struct ProbeKeys {
    /// None only in tests, which hand records in through [`ProbeKeys::take`].
    probes: Option<SecretProbes>,
    pub log: KeyLog,
    pairs: HashSet<(SocketAddr, SocketAddr)>,
    order: VecDeque<(SocketAddr, SocketAddr)>,
    pids: HashSet<u32>,
    line: String,
    /// Handshakes read, and those whose record was not usable.
    pub records: u64,
    pub bad: u64,
}

fn hex(out: &mut String, b: &[u8]) {
    for x in b {
        let _ = write!(out, "{x:02x}");
    }
}

/// The suite's hash (TLS 1.3: SHA-384 for TLS_AES_256_GCM_SHA384 only).
fn hash_of(suite: u16) -> Hash {
    if suite == 0x1302 {
        Hash::Sha384
    } else {
        Hash::Sha256
    }
}

/// The key log lines of one handshake, into `out`.
pub(crate) fn keylog_lines(s: &Secrets, out: &mut String) {
    let mut line = |label: &str, secret: &[u8]| {
        out.push_str(label);
        out.push(' ');
        hex(out, &s.client_random);
        out.push(' ');
        hex(out, secret);
        out.push('\n');
    };
    match s.version {
        TlsVersion::Tls12 => line("CLIENT_RANDOM", &s.master_key),
        TlsVersion::Tls13 => {
            let h = hash_of(s.suite);
            let n = h.out_len();
            let mut derived = [0u8; 48];
            for (label, name) in [
                (&b"c hs traffic"[..], "CLIENT_HANDSHAKE_TRAFFIC_SECRET"),
                (&b"s hs traffic"[..], "SERVER_HANDSHAKE_TRAFFIC_SECRET"),
            ] {
                expand_label_ctx(
                    h,
                    &s.handshake_secret[..n],
                    label,
                    &s.handshake_hash[..n],
                    &mut derived[..n],
                );
                line(name, &derived[..n]);
            }
            line("CLIENT_TRAFFIC_SECRET_0", &s.client_app[..n]);
            line("SERVER_TRAFFIC_SECRET_0", &s.server_app[..n]);
        }
    }
}

/// A pair in one order whichever side (server or client library) read it.
fn pair(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

impl ProbeKeys {
    pub(crate) fn new(probes: SecretProbes) -> ProbeKeys {
        ProbeKeys::with(Some(probes))
    }

    /// Without probes: records come through [`ProbeKeys::take`] only.
    #[cfg(test)]
    pub(crate) fn detached() -> ProbeKeys {
        ProbeKeys::with(None)
    }

    fn with(probes: Option<SecretProbes>) -> ProbeKeys {
        ProbeKeys {
            probes,
            log: KeyLog::new(),
            pairs: HashSet::new(),
            order: VecDeque::new(),
            pids: HashSet::new(),
            line: String::new(),
            records: 0,
            bad: 0,
        }
    }

    /// Takes the handshakes waiting in the ring; whether any secret came with them.
    pub(crate) fn poll(&mut self) -> bool {
        let before = self.log.secrets;
        let mut got = Vec::new();
        if let Some(p) = self.probes.as_mut() {
            p.drain(PER_POLL, |r| got.push(r));
        }
        for r in got {
            self.take(r);
        }
        self.log.secrets > before
    }

    /// One handshake record: its key log lines into the log, its socket pair remembered.
    pub(crate) fn take(&mut self, r: Result<Secrets, tcpkit_tlsprobe::SecretError>) {
        self.records += 1;
        let Ok(s) = r else {
            self.bad += 1;
            return;
        };
        if self.pids.len() < MAX_PIDS {
            self.pids.insert(s.tgid);
        }
        self.line.clear();
        keylog_lines(&s, &mut self.line);
        self.log.feed(self.line.as_bytes(), false);
        if let Some((a, b)) = s.sockets {
            let p = pair(a, b);
            if self.pairs.insert(p) {
                self.order.push_back(p);
                if self.order.len() > MAX_PAIRS {
                    if let Some(old) = self.order.pop_front() {
                        self.pairs.remove(&old);
                    }
                }
            }
        }
    }

    /// Whether the probes saw a handshake complete on this connection.
    pub(crate) fn saw(&self, client: SocketAddr, server: SocketAddr) -> bool {
        self.pairs.contains(&pair(client, server))
    }

    /// The report's `uprobe` object.
    pub(crate) fn stats(&self) -> UprobeStats {
        let p = self.probes.as_ref();
        UprobeStats {
            targets: p
                .map(|p| {
                    p.targets()
                        .iter()
                        .map(|t| t.display().to_string())
                        .collect()
                })
                .unwrap_or_default(),
            pids: self.pids.len() as u64,
            records: self.records,
            lost_records: p.map_or(0, SecretProbes::lost_records),
            unmatched: self.bad,
            mode: "secrets".into(),
            library: p.map(|p| {
                let r = p.release;
                format!("OpenSSL {}.{}.{}", r.0, r.1, r.2)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8448's simple 1-RTT handshake: its handshake secret and ClientHello..ServerHello
    /// hash give its client and server handshake traffic secrets.
    #[test]
    fn tls13_handshake_secrets_are_derived_as_rfc_8448_gives_them() {
        let unhex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len() / 2)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        };
        let mut s = Secrets {
            ssl: 1,
            tgid: 1,
            ts_mono_ns: 0,
            version: TlsVersion::Tls13,
            suite: 0x1301,
            client_random: [0xab; 32],
            master_key: Vec::new(),
            handshake_secret: [0; 64],
            handshake_hash: [0; 64],
            client_app: [5; 64],
            server_app: [6; 64],
            sockets: None,
        };
        s.handshake_secret[..32].copy_from_slice(&unhex(
            "1d c8 26 e9 36 06 aa 6f dc 0a ad c1 2f 74 1b 01 04 6a a6 b9 9f 69 1e d2 21 a9 f0 ca 04 3f be ac",
        ));
        s.handshake_hash[..32].copy_from_slice(&unhex(
            "86 0c 06 ed c0 78 58 ee 8e 78 f0 e7 42 8c 58 ed d6 b4 3f 2c a3 e6 e9 5f 02 ed 06 3c f0 e1 ca d8",
        ));
        let mut out = String::new();
        keylog_lines(&s, &mut out);
        let r = "ab".repeat(32);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            format!("CLIENT_HANDSHAKE_TRAFFIC_SECRET {r} b3eddb126e067f35a780b3abf45e2d8f3b1a950738f52e9600746a0e27a55a21")
        );
        assert_eq!(
            lines[1],
            format!("SERVER_HANDSHAKE_TRAFFIC_SECRET {r} b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38")
        );
        assert_eq!(
            lines[2],
            format!("CLIENT_TRAFFIC_SECRET_0 {r} {}", "05".repeat(32))
        );
        let mut k = KeyLog::new();
        k.feed(out.as_bytes(), false);
        assert_eq!((k.secrets, k.bad_lines), (4, 0));
    }
}
