//! tcpkit-stats
