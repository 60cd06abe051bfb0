//! tcpkit-copy: `tcpkit copy` and `tcpkit intercept`.
//!
//! - [`reasm`]: TCP session tracking and exact byte-stream reassembly of captured packets, the
//!   part every copy mode stands on (relay mode replays the reassembled client streams).

pub mod reasm;
