//! A test certificate authority made per lab with the `openssl` CLI: [`TestCa`] (an ECDSA
//! P-256 CA key and certificate in a directory of the test's) issues server and client
//! certificates for the names and addresses a test gives ([`CertKey`]), valid now or already
//! expired, so that TLS peers in the lab (unbound over DoT and DoH, nginx over HTTPS, `tcpkit
//! echo --tls`) present a certificate a client trusts with `--tls-ca` alone, and the failures
//! a client must name (unknown CA: another `TestCa`; wrong name; expired) can be made on purpose.
//!
//! The CLI rather than a Rust crate: the lab already drives the tools a test's peers use, and
//! `openssl` is installed wherever nginx and unbound are (scripts/setup.sh); nothing here is a
//! build dependency of tcpkit.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::{cmd, LabError};

/// The CLI the CA is made with (Debian's openssl package).
pub const OPENSSL: &str = "openssl";

/// `openssl req`'s arguments for a new unencrypted ECDSA P-256 key: the key type servers
/// present most today, and cheap to sign with, so handshakes measure the TLS stack, not RSA.
const NEW_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

/// How long a certificate [`TestCa`] issues is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From now for this many days.
    Days(u32),
    /// Valid for one day in January 2020 only: expired, with a sane validity window (a
    /// certificate whose notAfter precedes its notBefore is a different error to a verifier).
    Expired,
}

/// What a certificate is for: its extended key usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// TLS server (`serverAuth`): what a client checks.
    Server,
    /// TLS client (`clientAuth`): a client certificate.
    Client,
}

/// A certificate and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKey {
    /// The certificate (leaf only; the CA's certificate is [`TestCa::cert`]).
    pub cert: PathBuf,
    /// The unencrypted private key (PKCS#8).
    pub key: PathBuf,
}

/// A certificate authority of one test, in a directory of its own (a lab's directory, or a
/// temporary one): nothing of the system's trust store is read or changed.
#[derive(Debug, Clone)]
pub struct TestCa {
    dir: PathBuf,
}

/// The `openssl ca` configuration: a database of the CA's own, extensions copied from the
/// request (the names and key usages [`TestCa::issue`] puts there), any subject.
const CA_CNF: &str = "[ca]\n\
default_ca = lab\n\
[lab]\n\
database = index.txt\n\
new_certs_dir = .\n\
serial = serial\n\
default_md = sha256\n\
policy = any\n\
copy_extensions = copy\n\
unique_subject = no\n\
[any]\n\
commonName = supplied\n";

impl TestCa {
    /// Makes a CA named `name` (its certificate's CN) in `dir` (created if missing): a P-256
    /// key and a self-signed certificate valid for 30 days, marked as a CA.
    pub fn new(dir: &Path, name: &str) -> Result<TestCa, LabError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| LabError::io(format!("create {}", dir.display()), e))?;
        let ca = TestCa {
            dir: dir.to_path_buf(),
        };
        write(&dir.join("ca.cnf"), CA_CNF)?;
        write(&dir.join("index.txt"), "")?;
        write(&dir.join("serial"), "1000\n")?;
        let (key, cert) = (ca.key(), ca.cert());
        ca.req(&[
            "-x509",
            "-keyout",
            &s(&key),
            "-out",
            &s(&cert),
            "-days",
            "30",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ])?;
        Ok(ca)
    }

    /// The directory holding the CA and everything it issued.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA's certificate (PEM): what a client trusts (`--tls-ca FILE`, curl's `--cacert`).
    pub fn cert(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// A server certificate for `names` (DNS names and IP addresses; the first is its CN),
    /// valid for 30 days, written as `STEM.pem` and `STEM.key`.
    pub fn server(&self, stem: &str, names: &[&str]) -> Result<CertKey, LabError> {
        self.issue(stem, names, Purpose::Server, Validity::Days(30))
    }

    /// A certificate of `purpose` for `names`, valid as `validity` says, signed by this CA.
    pub fn issue(
        &self,
        stem: &str,
        names: &[&str],
        purpose: Purpose,
        validity: Validity,
    ) -> Result<CertKey, LabError> {
        if stem.is_empty() || !stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(LabError::invalid(format!(
                "certificate file stem {stem:?}: use [A-Za-z0-9-]"
            )));
        }
        let Some(first) = names.first() else {
            return Err(LabError::invalid(format!(
                "certificate {stem}: give at least one name"
            )));
        };
        let san = names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect::<Vec<_>>()
            .join(",");
        let eku = match purpose {
            Purpose::Server => "serverAuth",
            Purpose::Client => "clientAuth",
        };
        let out = CertKey {
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}.key")),
        };
        let csr = self.dir.join(format!("{stem}.csr"));
        self.req(&[
            "-new",
            "-keyout",
            &s(&out.key),
            "-out",
            &s(&csr),
            "-subj",
            &format!("/CN={first}"),
            "-addext",
            &format!("subjectAltName={san}"),
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "keyUsage=critical,digitalSignature",
            "-addext",
            &format!("extendedKeyUsage={eku}"),
        ])?;
        let (cnf, key, cert) = (s(&self.dir.join("ca.cnf")), s(&self.key()), s(&self.cert()));
        let mut args = vec![
            "ca", "-batch", "-notext", "-config", &cnf, "-cert", &cert, "-keyfile", &key,
        ];
        let days;
        match validity {
            Validity::Days(d) => {
                days = d.to_string();
                args.extend(["-days", &days]);
            }
            Validity::Expired => args.extend([
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
            ]),
        }
        let (csr_s, out_s) = (s(&csr), s(&out.cert));
        args.extend(["-in", &csr_s, "-out", &out_s]);
        self.openssl(&args)?;
        Ok(out)
    }

    /// `openssl req` with a new key ([`NEW_KEY`]) and `args`.
    fn req(&self, args: &[&str]) -> Result<(), LabError> {
        let mut all = vec!["req"];
        all.extend(NEW_KEY);
        all.extend_from_slice(args);
        self.openssl(&all)
    }

    /// Runs `openssl ARGS` in the CA's directory (its database paths are relative to it).
    fn openssl(&self, args: &[&str]) -> Result<(), LabError> {
        let mut c = std::process::Command::new(OPENSSL);
        c.args(args).current_dir(&self.dir);
        cmd::run(c).map(drop)
    }
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), LabError> {
    std::fs::write(path, text).map_err(|e| LabError::io(format!("write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl verify` and `x509 -checkend` as the oracle: what the CA issues chains to it, and
    /// carries the names, purpose and validity asked for.
    #[test]
    fn issues_trusted_named_and_expired_certificates() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = TestCa::new(&tmp.path().join("ca"), "tcpkit lab CA").unwrap();
        let ok = ca.server("srv", &["localhost", "198.18.0.2"]).unwrap();
        let old = ca
            .issue("old", &["localhost"], Purpose::Server, Validity::Expired)
            .unwrap();
        let cli = ca
            .issue("cli", &["client"], Purpose::Client, Validity::Days(1))
            .unwrap();
        let other = TestCa::new(&tmp.path().join("other"), "another CA").unwrap();
        let text = |c: &Path| {
            let o = cmd::run_args(OPENSSL, &["x509", "-noout", "-text", "-in", &s(c)]).unwrap();
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let t = text(&ok.cert);
        assert!(t.contains("DNS:localhost, IP Address:198.18.0.2"), "{t}");
        assert!(t.contains("TLS Web Server Authentication"), "{t}");
        assert!(text(&cli.cert).contains("TLS Web Client Authentication"));
        let verify = |ca: &TestCa, c: &Path| {
            cmd::run_args(
                OPENSSL,
                &[
                    "verify",
                    "-purpose",
                    "sslserver",
                    "-CAfile",
                    &s(&ca.cert()),
                    &s(c),
                ],
            )
        };
        verify(&ca, &ok.cert).unwrap();
        let e = verify(&ca, &old.cert).unwrap_err().to_string();
        assert!(e.contains("certificate has expired"), "{e}");
        let e = verify(&other, &ok.cert).unwrap_err().to_string();
        assert!(e.contains("unable to get local issuer certificate"), "{e}");
        // The key matches the certificate: the same public key from both.
        let public = |args: &[&str]| {
            String::from_utf8_lossy(&cmd::run_args(OPENSSL, args).unwrap().stdout).into_owned()
        };
        assert_eq!(
            public(&["x509", "-noout", "-pubkey", "-in", &s(&ok.cert)]),
            public(&["pkey", "-pubout", "-in", &s(&ok.key)])
        );
        assert!(ca
            .issue("bad/stem", &["x"], Purpose::Server, Validity::Days(1))
            .is_err());
        assert!(ca
            .issue("none", &[], Purpose::Server, Validity::Days(1))
            .is_err());
    }
}
