//! `tcpkit tune` (being written).
