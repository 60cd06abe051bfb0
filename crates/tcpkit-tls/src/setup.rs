//! The rustls configurations, from what the user asked: the client's (trust, client
//! certificate, versions, ALPN, resumption) for `load --tls`, the server's (PEM files or a
//! self-signed certificate, tickets on) for `echo --tls`. Every file problem is a
//! [`SetupError`] naming the flag and the file, found before any connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::{ring as provider, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use sha2::{Digest, Sha256};

/// Why a TLS configuration could not be built (a usage error: exit 2, nothing run).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{flag} {path}: {why}")]
    File {
        flag: &'static str,
        path: String,
        why: String,
    },
    #[error("{0}")]
    Other(String),
}

/// Which TLS versions to offer or accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Versions {
    #[default]
    Both,
    Tls12,
    Tls13,
}

impl Versions {
    /// `--tls-version`'s value: `1.2` or `1.3`.
    pub fn parse(s: &str) -> Result<Versions, String> {
        match s {
            "1.2" => Ok(Versions::Tls12),
            "1.3" => Ok(Versions::Tls13),
            _ => Err(format!("{s:?}: expected 1.2 or 1.3")),
        }
    }

    /// As said in a "no common protocol" line.
    pub fn describe(self) -> &'static str {
        match self {
            Versions::Both => "TLSv1.2 and TLSv1.3",
            Versions::Tls12 => "TLSv1.2 only",
            Versions::Tls13 => "TLSv1.3 only",
        }
    }

    fn list(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        match self {
            Versions::Both => rustls::ALL_VERSIONS,
            Versions::Tls12 => TLS12_ONLY,
            Versions::Tls13 => TLS13_ONLY,
        }
    }
}

static TLS12_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// Session resumption on the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resume {
    /// Every connection a full handshake (as dnsperf).
    #[default]
    Off,
    /// Tickets (TLS 1.3) or tickets and session IDs (TLS 1.2) kept in memory per server name.
    Tickets,
}

impl Resume {
    pub fn parse(s: &str) -> Result<Resume, String> {
        match s {
            "off" => Ok(Resume::Off),
            "tickets" => Ok(Resume::Tickets),
            _ => Err(format!("{s:?}: expected off or tickets")),
        }
    }
}

/// What `load --tls` asked for.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// `--tls-ca FILE` (PEM); None: the system store.
    pub ca: Option<PathBuf>,
    /// `--insecure`: no certificate check at all.
    pub insecure: bool,
    /// `--tls-cert FILE --tls-key FILE`.
    pub cert: Option<(PathBuf, PathBuf)>,
    pub versions: Versions,
    pub alpn: Vec<String>,
    pub resume: Resume,
}

impl ClientOptions {
    /// The trust as said in an unknown-CA line.
    pub fn trust(&self) -> String {
        match (&self.ca, self.insecure) {
            (_, true) => "nothing checked (--insecure)".into(),
            (Some(p), false) => format!("--tls-ca {}", p.display()),
            (None, false) => "the system store".into(),
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(provider::default_provider())
}

fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, SetupError> {
    let bad = |why: String| SetupError::File {
        flag,
        path: path.display().to_string(),
        why,
    };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

fn read_key(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, SetupError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| SetupError::File {
        flag,
        path: path.display().to_string(),
        why: format!("no PEM private key in it ({e})"),
    })
}

/// The client configuration `load --tls` connects with.
pub fn client_config(o: &ClientOptions) -> Result<Arc<ClientConfig>, SetupError> {
    let p = provider();
    let b = ClientConfig::builder_with_provider(Arc::clone(&p))
        .with_protocol_versions(o.versions.list())
        .map_err(|e| SetupError::Other(format!("--tls-version: {e}")))?;
    let b = if o.insecure {
        b.dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCheck(p)))
    } else {
        let mut roots = RootCertStore::empty();
        match &o.ca {
            Some(path) => {
                let (good, _) = roots.add_parsable_certificates(read_certs("--tls-ca", path)?);
                if good == 0 {
                    return Err(SetupError::File {
                        flag: "--tls-ca",
                        path: path.display().to_string(),
                        why: "no usable CA certificate in it".into(),
                    });
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(SetupError::Other(
                        "no CA certificate in the system trust store (install ca-certificates, or give --tls-ca FILE, or --insecure for a lab certificate)".into(),
                    ));
                }
            }
        }
        b.with_root_certificates(roots)
    };
    let mut cfg = match &o.cert {
        Some((cert, key)) => b
            .with_client_auth_cert(read_certs("--tls-cert", cert)?, read_key("--tls-key", key)?)
            .map_err(|e| SetupError::File {
                flag: "--tls-key",
                path: key.display().to_string(),
                why: format!("does not go with --tls-cert {} ({e})", cert.display()),
            })?,
        None => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = o.alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    // SSLKEYLOGFILE, as curl, browsers and OpenSSL's tools honour it: each session's secrets
    // appended to that file (NSS key log format) for Wireshark or `copy --tls-keylog`; with
    // the variable unset nothing is written and the check costs nothing per connection.
    cfg.key_log = Arc::new(rustls::KeyLogFile::new());
    cfg.resumption = match o.resume {
        Resume::Off => Resumption::disabled(),
        // Sized for many connections to one server: TLS 1.3 tickets are used once each, and
        // each resumed connection brings new ones.
        Resume::Tickets => Resumption::in_memory_sessions(4096),
    };
    Ok(Arc::new(cfg))
}

/// The server name a client asks for: a DNS name, or an IP address (no SNI then; checked
/// against the certificate's IP names).
pub fn server_name(name: &str) -> Result<ServerName<'static>, SetupError> {
    ServerName::try_from(name.to_string()).map_err(|e| {
        SetupError::Other(format!(
            "--tls-sni {name}: not a DNS name or IP address ({e})"
        ))
    })
}

/// `--insecure`: any certificate is taken, but the handshake's signatures are still checked
/// (against the key in the certificate presented), so the session is encrypted as usual.
#[derive(Debug)]
struct NoCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// What `echo --tls` serves with.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// `--tls-cert FILE --tls-key FILE`; None: self-signed for `names`.
    pub files: Option<(PathBuf, PathBuf)>,
    /// `--tls-name`s of a self-signed certificate (DNS names or IP addresses).
    pub names: Vec<String>,
    /// ALPN protocols accepted, in the server's order of preference; empty: ALPN is ignored.
    pub alpn: Vec<String>,
    pub versions: Versions,
}

/// A server configuration and its certificate, for the fingerprint line and `--tls-cert-out`.
#[derive(Debug, Clone)]
pub struct ServerSetup {
    pub config: Arc<ServerConfig>,
    /// SHA-256 of the leaf certificate (DER), lowercase hex.
    pub fingerprint: String,
    /// The certificate chain, PEM.
    pub cert_pem: String,
    /// A self-signed certificate's private key, PEM (PKCS#8), so that other processes of the
    /// same server can serve the same certificate; None for one read from files.
    pub key_pem: Option<String>,
}

/// Builds the server side: files, or a fresh ECDSA P-256 key and a self-signed certificate.
/// Session tickets are on (stateless, rotated by rustls), so clients can resume.
pub fn server_config(o: &ServerOptions) -> Result<ServerSetup, SetupError> {
    let (certs, key, key_pem) = match &o.files {
        Some((cert, key)) => (
            read_certs("--tls-cert", cert)?,
            read_key("--tls-key", key)?,
            None,
        ),
        None => {
            let ck = rcgen::generate_simple_self_signed(o.names.clone())
                .map_err(|e| SetupError::Other(format!("--tls-self-signed: {e}")))?;
            let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der())
                .map_err(|e| SetupError::Other(format!("--tls-self-signed: {e}")))?;
            let pem = ck.signing_key.serialize_pem();
            (vec![ck.cert.der().clone()], key, Some(pem))
        }
    };
    let p = provider();
    let mut cfg = ServerConfig::builder_with_provider(p)
        .with_protocol_versions(o.versions.list())
        .map_err(|e| SetupError::Other(format!("TLS versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs.clone(), key)
        .map_err(|e| match &o.files {
            Some((cert, key)) => SetupError::File {
                flag: "--tls-key",
                path: key.display().to_string(),
                why: format!("does not go with --tls-cert {} ({e})", cert.display()),
            },
            None => SetupError::Other(format!("--tls-self-signed: {e}")),
        })?;
    cfg.ticketer = provider::Ticketer::new()
        .map_err(|e| SetupError::Other(format!("TLS session tickets: {e}")))?;
    cfg.alpn_protocols = o.alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    let fingerprint = hex(&Sha256::digest(certs[0].as_ref()));
    let cert_pem = certs
        .iter()
        .map(|c| pem("CERTIFICATE", c.as_ref()))
        .collect();
    Ok(ServerSetup {
        config: Arc::new(cfg),
        fingerprint,
        cert_pem,
        key_pem,
    })
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// One PEM block (base64 in 64-column lines).
fn pem(label: &str, der: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b = String::with_capacity(der.len() * 4 / 3 + 4);
    for c in der.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                b.push(B64[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                b.push('=');
            }
        }
    }
    let mut s = format!("-----BEGIN {label}-----\n");
    for line in b.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(line).unwrap_or_default());
        s.push('\n');
    }
    s.push_str(&format!("-----END {label}-----\n"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pem_reads_back_as_the_same_certificate() {
        let s = server_config(&ServerOptions {
            names: vec!["localhost".into(), "127.0.0.1".into()],
            ..ServerOptions::default()
        })
        .unwrap();
        assert_eq!(s.fingerprint.len(), 64);
        let dir = std::env::temp_dir().join(format!("tcpkit-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.pem");
        std::fs::write(&f, &s.cert_pem).unwrap();
        let back = read_certs("--tls-ca", &f).unwrap();
        assert_eq!(hex(&Sha256::digest(back[0].as_ref())), s.fingerprint);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            pem("X", b"ab"),
            "-----BEGIN X-----\nYWI=\n-----END X-----\n"
        );
    }
}
