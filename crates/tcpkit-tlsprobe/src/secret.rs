//! The secrets mode's ring records (bpf/tlsprobe.h `struct secret_record`): one per completed
//! handshake, what an NSS key log line needs, read from the library's SSL object. Parsed with
//! its size checked against the ring's item and every length field bounded (untrusted input:
//! the fuzz target `tlsprobe_secret` runs [`fuzz_secret`]).

use std::net::SocketAddr;

use crate::record::{addr, words, RawSecret};

/// The record's size: a ring item shorter than it is not one.
pub const SECRET_LEN: usize = std::mem::size_of::<RawSecret>();

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// The protocol version the handshake settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// One handshake's secrets, as the library held them when it completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secrets {
    /// The SSL object (its address in the process).
    pub ssl: u64,
    pub tgid: u32,
    pub ts_mono_ns: u64,
    pub version: TlsVersion,
    /// The suite's IANA number (0x1301...; 0xc02f... for TLS 1.2).
    pub suite: u16,
    pub client_random: [u8; 32],
    /// TLS 1.2: the master secret.
    pub master_key: Vec<u8>,
    /// TLS 1.3 (64 bytes each; the suite's hash length of them is the secret): the handshake
    /// secret, the transcript hash through ServerHello, both application traffic secrets 0.
    pub handshake_secret: [u8; 64],
    pub handshake_hash: [u8; 64],
    pub client_app: [u8; 64],
    pub server_app: [u8; 64],
    /// The connection's socket (its own address, the peer's), when the read BIO's descriptor
    /// named an IPv4/IPv6 socket.
    pub sockets: Option<(SocketAddr, SocketAddr)>,
}

/// Why a ring item is not a usable record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret record of {got} bytes, {SECRET_LEN} expected")]
    Size { got: usize },
    /// A version the library should not have set after a handshake: the layout is not this
    /// library's (or the handshake was SSLv3/TLS 1.0/1.1).
    #[error("handshake of version {0:#06x}")]
    Version(u32),
    #[error("cipher id {0:#010x} is not a TLS suite's")]
    Cipher(u32),
    #[error("TLS 1.2 master key of {0} bytes (48 expected)")]
    MasterKey(u64),
}

impl Secrets {
    /// The record in `b`, one item of the secrets ring (rounded up to 8 bytes by the ring).
    pub fn parse(b: &[u8]) -> Result<Secrets, SecretError> {
        if b.len() < SECRET_LEN || b.len() >= SECRET_LEN + 8 {
            return Err(SecretError::Size { got: b.len() });
        }
        // SAFETY: SECRET_LEN bytes are there (checked above); RawSecret is #[repr(C)] plain
        // integers and byte arrays (any bit pattern is valid); read_unaligned needs no
        // alignment.
        let h = unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<RawSecret>()) };
        let version = match h.version {
            0x0303 => TlsVersion::Tls12,
            0x0304 => TlsVersion::Tls13,
            v => return Err(SecretError::Version(v)),
        };
        if h.cipher_id >> 16 != 0x0300 {
            return Err(SecretError::Cipher(h.cipher_id));
        }
        let master_key = match version {
            TlsVersion::Tls12 if h.master_key_len != 48 => {
                return Err(SecretError::MasterKey(h.master_key_len))
            }
            TlsVersion::Tls12 => h.master_key.to_vec(),
            TlsVersion::Tls13 => Vec::new(),
        };
        let sockets = (h.family == AF_INET || h.family == AF_INET6).then(|| {
            (
                addr(h.family, &h.local, h.lport),
                addr(h.family, &h.remote, h.rport),
            )
        });
        Ok(Secrets {
            ssl: h.ssl,
            tgid: h.tgid,
            ts_mono_ns: h.ts,
            version,
            suite: h.cipher_id as u16,
            client_random: h.client_random,
            master_key,
            handshake_secret: h.handshake_secret,
            handshake_hash: h.handshake_traffic_hash,
            client_app: h.client_app_secret,
            server_app: h.server_app_secret,
            sockets,
        })
    }

    /// The record as the program writes it (tests and the fuzz seeds).
    pub fn emit(&self) -> Vec<u8> {
        let mut h = RawSecret {
            ssl: self.ssl,
            ts: self.ts_mono_ns,
            tgid: self.tgid,
            version: match self.version {
                TlsVersion::Tls12 => 0x0303,
                TlsVersion::Tls13 => 0x0304,
            },
            cipher_id: 0x0300_0000 | u32::from(self.suite),
            client_random: self.client_random,
            handshake_secret: self.handshake_secret,
            handshake_traffic_hash: self.handshake_hash,
            client_app_secret: self.client_app,
            server_app_secret: self.server_app,
            ..RawSecret::default()
        };
        if !self.master_key.is_empty() {
            let n = self.master_key.len().min(h.master_key.len());
            h.master_key[..n].copy_from_slice(&self.master_key[..n]);
            h.master_key_len = n as u64;
        }
        if let Some((local, remote)) = self.sockets {
            h.family = if local.is_ipv4() { AF_INET } else { AF_INET6 };
            h.local = words(&local);
            h.remote = words(&remote);
            h.lport = local.port();
            h.rport = remote.port();
        }
        let mut out = vec![0u8; SECRET_LEN];
        // SAFETY: out holds SECRET_LEN bytes; write_unaligned needs no alignment.
        unsafe { std::ptr::write_unaligned(out.as_mut_ptr().cast::<RawSecret>(), h) };
        out
    }
}

/// The fuzz target's body: any bytes parse to secrets or an error, never a panic, and secrets
/// parsed emit back to the same.
pub fn fuzz_secret(data: &[u8]) {
    if let Ok(s) = Secrets::parse(data) {
        assert!(s.master_key.len() <= 48);
        let back = Secrets::parse(&s.emit()).expect("emitted secrets parse");
        assert_eq!(back, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(version: TlsVersion) -> Secrets {
        Secrets {
            ssl: 0x5555_0000_4321,
            tgid: 77,
            ts_mono_ns: 5,
            version,
            suite: if version == TlsVersion::Tls13 {
                0x1302
            } else {
                0xc02f
            },
            client_random: [7; 32],
            master_key: if version == TlsVersion::Tls12 {
                vec![9; 48]
            } else {
                Vec::new()
            },
            handshake_secret: [1; 64],
            handshake_hash: [2; 64],
            client_app: [3; 64],
            server_app: [4; 64],
            sockets: Some((
                "198.18.0.2:443".parse().unwrap(),
                "198.18.0.1:40000".parse().unwrap(),
            )),
        }
    }

    #[test]
    fn secrets_round_trip_and_cuts_and_bad_fields_are_errors() {
        for v in [TlsVersion::Tls12, TlsVersion::Tls13] {
            let s = sample(v);
            let mut b = s.emit();
            assert_eq!(Secrets::parse(&b).unwrap(), s);
            for cut in 0..b.len() {
                assert!(Secrets::parse(&b[..cut]).is_err());
            }
            b.extend_from_slice(&[0; 4]);
            assert_eq!(Secrets::parse(&b).unwrap(), s, "the ring's rounding");
        }
        let b = sample(TlsVersion::Tls12).emit();
        // version: the u32 after ssl, ts, master_key_len, tgid.
        let mut bad = b.clone();
        bad[28..32].copy_from_slice(&0x0301u32.to_ne_bytes());
        assert_eq!(Secrets::parse(&bad), Err(SecretError::Version(0x0301)));
        let mut bad = b.clone();
        bad[32..36].copy_from_slice(&0xdead_beefu32.to_ne_bytes());
        assert_eq!(Secrets::parse(&bad), Err(SecretError::Cipher(0xdead_beef)));
        let mut bad = b;
        bad[16..24].copy_from_slice(&1_000_000u64.to_ne_bytes());
        assert_eq!(Secrets::parse(&bad), Err(SecretError::MasterKey(1_000_000)));
    }

    fn seeds() -> Vec<(&'static str, Vec<u8>)> {
        let mut v6 = sample(TlsVersion::Tls13);
        v6.sockets = Some((
            "[fd00:18::2]:443".parse().unwrap(),
            "[fd00:18::1]:40000".parse().unwrap(),
        ));
        let mut nosock = sample(TlsVersion::Tls12);
        nosock.sockets = None;
        vec![
            ("tls13", sample(TlsVersion::Tls13).emit()),
            ("tls12", sample(TlsVersion::Tls12).emit()),
            ("tls13-v6", v6.emit()),
            ("no-socket", nosock.emit()),
        ]
    }

    #[test]
    fn the_fuzz_body_runs_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("tlsprobe_secret");
        assert!(seeds.len() >= 4, "{} seeds", seeds.len());
        let mut ok = 0;
        for s in &seeds {
            fuzz_secret(&s.bytes);
            ok += usize::from(Secrets::parse(&s.bytes).is_ok());
        }
        assert_eq!(ok, seeds.len(), "every seed is a record");
    }

    /// Writes the seed corpus (run by hand: `cargo test -p tcpkit-tlsprobe
    /// write_secret_corpus -- --ignored`) when the record changes.
    #[test]
    #[ignore = "writes fuzz/corpus/tlsprobe_secret"]
    fn write_secret_corpus() {
        for (name, b) in seeds() {
            tcpkit_lab::corpus::write("tlsprobe_secret", name, &b);
        }
    }
}
