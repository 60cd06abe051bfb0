//! The TLS flags of `load` and `echo` (issue 26), what the user typed (clap), resolved into
//! tcpkit-tls's options; kept apart from load.rs and echo.rs, which hold the rest of their
//! commands.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Args;
use tcpkit_tls::{ClientOptions, Resume, ServerOptions, ServerSetup, SetupError, Versions};

use crate::Failure;

/// `load`'s TLS flags.
#[derive(Debug, Clone, Default, Args)]
pub struct LoadTls {
    /// Speak TLS on every connection, for every TCP payload: --dns becomes DNS over TLS
    /// (port 853), --http-get HTTPS, and --redis-ping, --echo-bytes and --payload-file go over
    /// TLS as they are. The handshake is timed apart from the queries (the report's `tls`).
    /// A target https://HOST[:PORT]/PATH implies it. Not with --udp.
    /// Example: tcpkit load 10.0.0.2:853 --dns --tls --tls-ca ca.pem -c 2000 -r 50000
    #[arg(long, conflicts_with = "udp")]
    pub tls: bool,

    /// The server name asked for (SNI) and checked in the certificate (default: the target's
    /// host name, or its IP address, which sends no SNI and is checked against the
    /// certificate's IP names).
    #[arg(long, value_name = "NAME")]
    pub tls_sni: Option<String>,

    /// Trust the CA certificates in FILE (PEM) instead of the system store.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// Check no certificate at all (a lab's self-signed one): the session is still encrypted,
    /// but anyone in the middle could be the server. Said on stderr at the start of every run.
    #[arg(long, short = 'k')]
    pub insecure: bool,

    /// Present the client certificate in FILE (PEM; with --tls-key) to servers that ask.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Offer only this TLS version, 1.2 or 1.3 (default: both).
    #[arg(long, value_name = "1.2|1.3")]
    pub tls_version: Option<String>,

    /// ALPN protocols to offer, comma-separated (default: h2 with --http2 and --doh, http/1.1
    /// for --http-get and --doh --http1, none for DNS over TLS and the other payloads).
    /// Example: --alpn h2,http/1.1
    #[arg(long, value_name = "LIST")]
    pub alpn: Option<String>,

    /// Session resumption: `off` makes every connection a full handshake (as dnsperf);
    /// `tickets` resumes with the session tickets the server gave an earlier connection (a
    /// reopen after --queries-per-conn K then costs a resumed handshake).
    #[arg(long, value_name = "off|tickets", default_value = "off")]
    pub tls_resume: String,
}

fn usage(msg: String) -> Failure {
    Failure::Usage(msg)
}

fn setup_error(e: SetupError) -> Failure {
    usage(e.to_string())
}

impl LoadTls {
    /// Whether any TLS flag other than --tls was given (they need --tls).
    fn other_flag(&self) -> Option<&'static str> {
        [
            (self.tls_sni.is_some(), "--tls-sni"),
            (self.tls_ca.is_some(), "--tls-ca"),
            (self.insecure, "--insecure"),
            (self.tls_cert.is_some(), "--tls-cert"),
            (self.tls_version.is_some(), "--tls-version"),
            (self.alpn.is_some(), "--alpn"),
            (self.tls_resume != "off", "--tls-resume"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The client side of a run to `host` (the target's host part), or None in clear.
    /// `https` says the target was an https:// URL; `http` that the payload is HTTP.
    pub fn resolve(
        &self,
        host: &str,
        https: bool,
        http_alpn: Option<&str>,
    ) -> Result<Option<tcpkit_load::loadgen::TlsClient>, Failure> {
        if !(self.tls || https) {
            if let Some(flag) = self.other_flag() {
                return Err(usage(format!(
                    "{flag}: only with --tls (or an https:// target)"
                )));
            }
            return Ok(None);
        }
        let versions = match &self.tls_version {
            Some(v) => Versions::parse(v).map_err(|e| usage(format!("--tls-version {e}")))?,
            None => Versions::Both,
        };
        let resume =
            Resume::parse(&self.tls_resume).map_err(|e| usage(format!("--tls-resume {e}")))?;
        let alpn: Vec<String> = match &self.alpn {
            Some(list) => alpn_list(list)?,
            None => http_alpn.map(|p| vec![p.to_string()]).unwrap_or_default(),
        };
        let opts = ClientOptions {
            ca: self.tls_ca.clone(),
            insecure: self.insecure,
            cert: self.tls_cert.clone().zip(self.tls_key.clone()),
            versions,
            alpn,
            resume,
        };
        let sni = self.tls_sni.clone().unwrap_or_else(|| host_of(host));
        tcpkit_load::loadgen::TlsClient::new(&opts, &sni)
            .map(Some)
            .map_err(setup_error)
    }
}

/// `--alpn LIST`: comma-separated protocol names.
pub fn alpn_list(list: &str) -> Result<Vec<String>, Failure> {
    let v: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(bad) = v.iter().find(|a| a.is_empty() || a.len() > 255) {
        return Err(usage(format!(
            "--alpn {list:?}: {bad:?} is not a protocol name (1 to 255 bytes each, comma-separated, like h2,http/1.1)"
        )));
    }
    Ok(v)
}

/// The host part of `HOST:PORT` / `[v6]:PORT`, brackets taken off.
fn host_of(target: &str) -> String {
    if let Some(rest) = target.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest).to_string();
    }
    target
        .rsplit_once(':')
        .map_or(target, |(h, _)| h)
        .to_string()
}

/// `echo`'s TLS flags.
#[derive(Debug, Clone, Default, Args)]
pub struct EchoTls {
    /// Serve TLS on every connection, answering over it what echo answers in clear (bytes,
    /// --dns as DNS over TLS); with --tls-cert and --tls-key, or --tls-self-signed.
    /// Session tickets are on, so clients can resume (load --tls-resume tickets).
    /// Example: tcpkit echo --dns --tls --tls-self-signed --tls-cert-out ca.pem --port 853
    #[arg(long)]
    pub tls: bool,

    /// The certificate chain to serve (PEM; with --tls-key).
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        conflicts_with = "tls_self_signed"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Make a key and a self-signed certificate at start (for --tls-name), print its SHA-256
    /// fingerprint on stderr (`tcpkit echo: TLS certificate sha256 <hex>`).
    #[arg(long)]
    pub tls_self_signed: bool,

    /// A name for the self-signed certificate, DNS name or IP address; repeatable (default:
    /// localhost and the listen addresses that are not wildcards).
    #[arg(long, value_name = "NAME", requires = "tls_self_signed")]
    pub tls_name: Vec<String>,

    /// Write the self-signed certificate (PEM) to FILE, for clients to trust with --tls-ca.
    #[arg(long, value_name = "FILE", requires = "tls_self_signed")]
    pub tls_cert_out: Option<PathBuf>,

    /// Internal: a worker of --procs serves the certificate and key its parent made (one PEM
    /// file holding both), so every process serves the same self-signed certificate.
    #[arg(long, value_name = "FILE", hide = true)]
    pub tls_worker_pem: Option<PathBuf>,

    /// Close a TLS connection whose handshake is not done this long after it was accepted.
    #[arg(long, value_name = "DURATION", value_parser = crate::common::duration_arg, default_value = "10s")]
    pub tls_handshake_timeout: std::time::Duration,
}

impl EchoTls {
    /// The server side, with `alpn` accepted, or None in clear. Writes --tls-cert-out and
    /// says the fingerprint of a self-signed certificate (`say`), once, in the process that
    /// made it.
    pub fn resolve(
        &self,
        listen: &[std::net::SocketAddr],
        alpn: &[&str],
    ) -> Result<Option<ServerSetup>, Failure> {
        if !self.tls {
            let other = [
                (self.tls_cert.is_some(), "--tls-cert"),
                (self.tls_self_signed, "--tls-self-signed"),
            ]
            .into_iter()
            .find_map(|(g, f)| g.then_some(f));
            if let Some(flag) = other {
                return Err(usage(format!("{flag}: only with --tls")));
            }
            return Ok(None);
        }
        if self.tls_cert.is_none() && !self.tls_self_signed {
            return Err(usage(
                "--tls: give --tls-cert FILE --tls-key FILE, or --tls-self-signed".into(),
            ));
        }
        let mut names = self.tls_name.clone();
        if names.is_empty() {
            names.push("localhost".into());
            for a in listen {
                let ip: IpAddr = a.ip();
                if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
                    names.push(ip.to_string());
                }
            }
        }
        let files = match &self.tls_worker_pem {
            Some(f) => Some((f.clone(), f.clone())),
            None => self.tls_cert.clone().zip(self.tls_key.clone()),
        };
        let opts = ServerOptions {
            files,
            names,
            alpn: alpn.iter().map(|s| (*s).to_string()).collect(),
            versions: Versions::Both,
        };
        tcpkit_tls::server_config(&opts)
            .map(Some)
            .map_err(setup_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str]) -> Result<tcpkit_load::loadgen::Config, String> {
        crate::common::resolved(&[&["load"], args].concat(), crate::load::resolve)
    }

    fn echo(args: &[&str]) -> Result<(tcpkit_load::echo::EchoConfig, crate::echo::Run), String> {
        crate::common::resolved(&[&["echo"], args].concat(), crate::echo::resolve)
    }

    #[test]
    fn load_tls_flags_parse() {
        let c = load(&[
            "127.0.0.1:853",
            "--dns",
            "--tls",
            "-k",
            "-r",
            "1",
            "--tls-sni",
            "dot.example",
            "--tls-version",
            "1.3",
            "--alpn",
            "dot, x",
            "--tls-resume",
            "tickets",
        ])
        .unwrap();
        let t = c.tls.unwrap();
        assert_eq!(t.sni, "dot.example");
        assert!(t.insecure);
        assert_eq!(t.alpn(), ["dot", "x"]);
        assert_eq!(t.versions(), "TLSv1.3 only");
        assert_eq!(t.resume, Resume::Tickets);
        // The defaults: the target's address as the name, both versions, no resumption,
        // http/1.1 offered for HTTP and nothing for DNS.
        let t = load(&[
            "127.0.0.1:443",
            "--tls",
            "--insecure",
            "--http-get",
            "/",
            "-r",
            "1",
        ])
        .unwrap()
        .tls
        .unwrap();
        assert_eq!(t.sni, "127.0.0.1");
        assert_eq!(t.alpn(), ["http/1.1"]);
        assert_eq!(t.versions(), "TLSv1.2 and TLSv1.3");
        assert_eq!(t.resume, Resume::Off);
        let t = load(&["[::1]:853", "--tls", "--insecure", "-r", "1"])
            .unwrap()
            .tls
            .unwrap();
        assert_eq!(t.sni, "::1");
        assert!(t.alpn().is_empty());
        assert!(load(&["127.0.0.1:53", "-r", "1"]).unwrap().tls.is_none());
        // An https URL is HTTP GET over TLS, on 443 unless it says.
        let c = load(&["https://127.0.0.1/x", "--insecure", "-r", "1"]).unwrap();
        assert_eq!(c.addr.port(), 443);
        assert!(c.tls.is_some());
        let tcpkit_load::loadgen::Payload::HttpGet { path, host, .. } = &c.payload else {
            panic!("{:?}", c.payload)
        };
        assert_eq!((path.as_str(), host.as_str()), ("/x", "127.0.0.1"));
        let c = load(&["https://127.0.0.1:8443/", "--insecure", "-r", "1"]).unwrap();
        assert_eq!(c.addr.port(), 8443);
    }

    #[test]
    fn load_tls_flags_refused_with_the_flag() {
        for (args, says) in [
            (&["--udp", "--tls"][..], "--tls"),
            (&["--tls-sni", "x"][..], "--tls-sni: only with --tls"),
            (&["--insecure"][..], "--insecure: only with --tls"),
            (
                &["--tls", "-k", "--tls-version", "1.1"][..],
                "--tls-version \"1.1\"",
            ),
            (
                &["--tls", "-k", "--tls-resume", "maybe"][..],
                "--tls-resume \"maybe\"",
            ),
            (&["--tls", "-k", "--alpn", "h2,"][..], "--alpn \"h2,\""),
            (
                &["--tls", "--tls-ca", "/nonexistent.pem"][..],
                "--tls-ca /nonexistent.pem:",
            ),
            (&["--tls", "-k", "--tls-cert", "c.pem"][..], "--tls-key"),
            (
                &["--tls", "-k", "--tls-sni", "not a name"][..],
                "--tls-sni not a name",
            ),
        ] {
            let a = [&["127.0.0.1:853", "-r", "1"][..], args].concat();
            let e = load(&a).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn echo_tls_flags_parse() {
        let (c, r) = echo(&[
            "--tls",
            "--tls-self-signed",
            "--tls-name",
            "a.example",
            "--tls-handshake-timeout",
            "3s",
        ])
        .unwrap();
        assert!(c.tls.is_some());
        assert_eq!(c.tls_handshake_timeout, std::time::Duration::from_secs(3));
        // What --procs workers are handed: the certificate and its key.
        let pem = r.tls_pem.unwrap();
        assert!(
            pem.contains("BEGIN CERTIFICATE") && pem.contains("PRIVATE KEY"),
            "{pem}"
        );
        let (c, r) = echo(&[]).unwrap();
        assert!(c.tls.is_none() && r.tls_pem.is_none());
        for (args, says) in [
            (&["--tls"][..], "--tls-self-signed"),
            (
                &["--tls-self-signed"][..],
                "--tls-self-signed: only with --tls",
            ),
            (&["--tls", "--tls-cert", "c.pem"][..], "--tls-key"),
            (
                &[
                    "--tls",
                    "--tls-cert",
                    "/nonexistent.pem",
                    "--tls-key",
                    "/nonexistent.key",
                ][..],
                "--tls-cert /nonexistent.pem:",
            ),
            (&["--tls", "--tls-name", "x"][..], "--tls-self-signed"),
        ] {
            let e = echo(args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn host_of_targets() {
        assert_eq!(host_of("dns.example:853"), "dns.example");
        assert_eq!(host_of("10.0.0.2:853"), "10.0.0.2");
        assert_eq!(host_of("[fd00::2]:853"), "fd00::2");
    }
}
