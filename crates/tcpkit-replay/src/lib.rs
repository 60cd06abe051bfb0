//! tcpkit-replay
