//! `load --tls`: the client side resolved once per process (tcpkit-tls's [`Client`]: rustls
//! configuration, the name asked for, what is offered, for the lines that name a failure),
//! and a session per connection from it.

pub use tcpkit_tls::Client as TlsClient;
