//! `load --tls`: the client side resolved once per process (rustls configuration, the name
//! asked for, what is offered, for the lines that name a failure), and a session per
//! connection from it.

use std::sync::Arc;

use tcpkit_tls::rustls::pki_types::ServerName;
use tcpkit_tls::rustls::ClientConfig;
use tcpkit_tls::{ClientOptions, Offer, Session, SetupError};

/// What every connection of a `--tls` run shares.
#[derive(Debug, Clone)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    /// `--tls-sni`, or the target's host name or address.
    pub sni: String,
    versions: &'static str,
    alpn: Vec<String>,
    trust: String,
    /// `--insecure`: said on stderr at the start of every run.
    pub insecure: bool,
}

impl TlsClient {
    /// Builds the client configuration (reading `--tls-ca`, the system store or the client
    /// certificate: a file problem is a usage error, before any connection).
    pub fn new(opts: &ClientOptions, sni: &str) -> Result<TlsClient, SetupError> {
        Ok(TlsClient {
            config: tcpkit_tls::client_config(opts)?,
            name: tcpkit_tls::setup::server_name(sni)?,
            sni: sni.to_string(),
            versions: opts.versions.describe(),
            alpn: opts.alpn.clone(),
            trust: opts.trust(),
            insecure: opts.insecure,
        })
    }

    /// A new connection's session (its ClientHello is ready to go).
    pub(crate) fn session(&self) -> Result<Session, tcpkit_tls::rustls::Error> {
        Session::client(&self.config, self.name.clone())
    }

    /// What this side offers, for the line that names a failed handshake.
    pub(crate) fn offer(&self) -> Offer<'_> {
        Offer {
            name: &self.sni,
            versions: self.versions,
            alpn: &self.alpn,
            trust: &self.trust,
        }
    }
}
