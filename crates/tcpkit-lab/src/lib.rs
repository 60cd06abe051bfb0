//! tcpkit-lab
