//! `tcpkit load` (being written).
