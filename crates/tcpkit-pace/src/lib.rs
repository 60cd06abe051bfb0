//! tcpkit-pace
