//! A TLS client resolved once per run (the rustls configuration, the name asked for, what is
//! offered, for the lines that name a failure), and a session per connection from it: what
//! `load --tls` and `copy --target-tls` connect with.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;

use crate::{ClientOptions, Offer, Session, SetupError};

/// What every connection of a TLS client run shares.
#[derive(Debug, Clone)]
pub struct Client {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    /// `--tls-sni`, or the target's host name or address.
    pub sni: String,
    versions: &'static str,
    alpn: Vec<String>,
    trust: String,
    /// `--insecure`: said on stderr at the start of every run.
    pub insecure: bool,
    /// `--tls-resume`.
    pub resume: crate::Resume,
}

impl Client {
    /// Builds the client configuration (reading `--tls-ca`, the system store or the client
    /// certificate: a file problem is a usage error, before any connection).
    pub fn new(opts: &ClientOptions, sni: &str) -> Result<Client, SetupError> {
        Ok(Client {
            config: crate::client_config(opts)?,
            name: crate::setup::server_name(sni)?,
            sni: sni.to_string(),
            versions: opts.versions.describe(),
            alpn: opts.alpn.clone(),
            trust: opts.trust(),
            insecure: opts.insecure,
            resume: opts.resume,
        })
    }

    /// The ALPN protocols offered.
    pub fn alpn(&self) -> &[String] {
        &self.alpn
    }

    /// The versions offered, as said in a failure line (`TLSv1.3 only`).
    pub fn versions(&self) -> &'static str {
        self.versions
    }

    /// A new connection's session (its ClientHello is ready to go).
    pub fn session(&self) -> Result<Session, rustls::Error> {
        Session::client(&self.config, self.name.clone())
    }

    /// What this side offers, for the line that names a failed handshake.
    pub fn offer(&self) -> Offer<'_> {
        Offer {
            name: &self.sni,
            versions: self.versions,
            alpn: &self.alpn,
            trust: &self.trust,
        }
    }
}
