//! tcpkit-send
