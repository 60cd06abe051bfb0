//! `tcpkit merge` (being written).
