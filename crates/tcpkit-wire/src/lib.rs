//! tcpkit-wire
