//! `tcpkit echo` (being written).
