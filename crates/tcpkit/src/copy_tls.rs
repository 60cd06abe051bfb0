//! `copy --target-tls` and its flags (issue 27): what the user typed (clap), checked against
//! the mode, resolved into relay mode's [`TargetTls`] (a tcpkit-tls client per target).
//! The flags have `load`'s names and meaning.

use std::path::PathBuf;

use clap::Args;
use tcpkit_copy::relay::TargetTls;
use tcpkit_copy::transfer::Rule;
use tcpkit_tls::{Client, ClientOptions, Resume, Versions};

use crate::Failure;

/// The TLS flags toward the target.
#[derive(Debug, Clone, Default, Args)]
pub struct TargetTlsFlags {
    /// Relay mode: each copy's connection to the target speaks TLS; the session's plaintext
    /// requests are sent over it and its plaintext answers read (--diff compares those).
    /// The handshake is not in the target's answer latency; a failed one is counted by
    /// reason. Without it, copies go to the target's clear port.
    /// Example: tcpkit copy -x 443-10.0.1.5:8443 --target-tls --tls-ca ca.pem
    #[arg(long, conflicts_with = "transparent")]
    pub target_tls: bool,

    /// With --target-tls: trust the CA certificates in FILE (PEM) instead of the system
    /// store.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// With --target-tls: check no certificate of the target at all (a lab's self-signed
    /// one): still encrypted, but anyone in the middle could be the target. Said on stderr
    /// at the start of every run.
    #[arg(long, short = 'k')]
    pub insecure: bool,

    /// With --target-tls: the server name asked for (SNI) and checked in the target's
    /// certificate (default: the target's IP address, which sends no SNI and is checked
    /// against the certificate's IP names).
    #[arg(long, value_name = "NAME")]
    pub tls_sni: Option<String>,

    /// With --target-tls: ALPN protocols to offer, comma-separated (default none: the
    /// target's default, HTTP/1.1 for a web server). Say h2 when the copied sessions speak
    /// HTTP/2. Example: --alpn h2
    #[arg(long, value_name = "LIST")]
    pub alpn: Option<String>,
}

impl TargetTlsFlags {
    /// The TLS toward each target of `rules`, or None in clear. A flag that needs
    /// --target-tls without it, or a file that cannot be used, is a usage error.
    pub fn resolve(&self, rules: &[Rule]) -> Result<Option<TargetTls>, Failure> {
        if !self.target_tls {
            let other = [
                (self.tls_ca.is_some(), "--tls-ca"),
                (self.insecure, "--insecure"),
                (self.tls_sni.is_some(), "--tls-sni"),
                (self.alpn.is_some(), "--alpn"),
            ]
            .into_iter()
            .find_map(|(given, flag)| given.then_some(flag));
            return match other {
                Some(flag) => Err(Failure::Usage(format!("{flag}: only with --target-tls"))),
                None => Ok(None),
            };
        }
        let opts = ClientOptions {
            ca: self.tls_ca.clone(),
            insecure: self.insecure,
            cert: None,
            versions: Versions::Both,
            alpn: match &self.alpn {
                Some(list) => crate::tls_flags::alpn_list(list)?,
                None => Vec::new(),
            },
            resume: Resume::Off,
        };
        let mut clients = Vec::new();
        for r in rules {
            if clients.iter().any(|(t, _)| *t == r.target) {
                continue;
            }
            let sni = self
                .tls_sni
                .clone()
                .unwrap_or_else(|| r.target.ip().to_string());
            let c = Client::new(&opts, &sni).map_err(|e| Failure::Usage(e.to_string()))?;
            clients.push((r.target, c));
        }
        Ok(Some(TargetTls::new(clients)))
    }
}

#[cfg(test)]
mod tests {
    use crate::common;

    fn parse(args: &[&str]) -> Result<crate::copy::Run, String> {
        common::resolved(&[&["copy"], args].concat(), crate::copy::resolve).map(|(_, r)| r)
    }

    #[test]
    fn target_tls_flags_parse_and_are_refused_without_it() {
        let x = ["-x", "80-127.0.0.1:8443,81-127.0.0.2:8443"];
        let r = parse(&[&x[..], &["--target-tls", "-k", "--alpn", "h2"]].concat()).unwrap();
        let t = r.target_tls.unwrap();
        assert!(t.insecure());
        // Each target asks for its own address unless --tls-sni names one for all.
        let a = "127.0.0.1:8443".parse().unwrap();
        let b = "127.0.0.2:8443".parse().unwrap();
        assert_eq!((t.sni(a), t.sni(b)), (Some("127.0.0.1"), Some("127.0.0.2")));
        let r = parse(&[&x[..], &["--target-tls", "-k", "--tls-sni", "t.example"]].concat());
        let t = r.unwrap().target_tls.unwrap();
        assert_eq!((t.sni(a), t.sni(b)), (Some("t.example"), Some("t.example")));
        assert!(parse(&x).unwrap().target_tls.is_none());
        for (args, says) in [
            (
                &["--tls-ca", "ca.pem"][..],
                "--tls-ca: only with --target-tls",
            ),
            (&["--insecure"][..], "--insecure: only with --target-tls"),
            (
                &["--tls-sni", "a.example"][..],
                "--tls-sni: only with --target-tls",
            ),
            (&["--alpn", "h2"][..], "--alpn: only with --target-tls"),
            (
                &["--target-tls", "--tls-ca", "/nonexistent.pem"][..],
                "--tls-ca /nonexistent.pem:",
            ),
            (
                &["--target-tls", "-k", "--tls-sni", "not a name"][..],
                "--tls-sni not a name",
            ),
            (
                &["--target-tls", "-k", "--alpn", "h2,"][..],
                "--alpn \"h2,\"",
            ),
            (
                &["--target-tls", "--transparent", "--intercept", "10.0.0.1"][..],
                "--target-tls",
            ),
        ] {
            let e = parse(&[&x[..], args].concat()).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }
}
