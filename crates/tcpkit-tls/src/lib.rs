//! TLS for `tcpkit load` and `tcpkit echo` (issue 26), on rustls, driven by hand: no async
//! runtime, our own non-blocking sockets and event loops.
//!
//! - [`setup`]: the rustls configurations from what the user asked (trust: a PEM file, the
//!   system store, or none with `--insecure`; a client certificate; TLS 1.2 / 1.3; ALPN;
//!   session resumption by tickets or none), and a server's (PEM files, or a self-signed
//!   certificate made by rcgen, its SHA-256 fingerprint and PEM for the client to trust).
//! - [`client`]: a client resolved once per run (configuration, name, what it offers), a
//!   session per connection from it (`load --tls`, `copy --target-tls`).
//! - [`fail`]: a failed handshake named by a short reason (`unknown_ca`, `bad_name`,
//!   `expired`, `no_common_protocol`, `no_alpn`, `handshake_timeout`, `reset`, `other`) and
//!   said in one line that tells the user what to do about it.
//! - [`session`]: the TLS byte stream over a non-blocking socket the caller owns and polls
//!   (rustls `read_tls`/`process_new_packets`/`write_tls`): the handshake step by step, then
//!   plaintext in and out, with the negotiated version, cipher, ALPN and whether the session
//!   was resumed. Above it, load's and echo's protocols see plaintext only.

pub mod client;
pub mod decrypt;
pub mod fail;
pub mod session;
pub mod setup;

pub use client::Client;
pub use fail::{Failure, Offer, Reason};
pub use rustls;
pub use session::{HandshakeError, Info, Session};
pub use setup::{
    client_config, server_config, ClientOptions, Resume, ServerOptions, ServerSetup, SetupError,
    Versions,
};
