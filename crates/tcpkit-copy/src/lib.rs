//! tcpkit-copy: `tcpkit copy` and `tcpkit intercept`.
//!
//! - [`reasm`]: TCP session tracking and exact byte-stream reassembly of captured packets, the
//!   part every copy mode stands on (relay mode replays the reassembled client streams).
//! - [`rules`]: the `-x` rules, the server ports tracked and the live capture's filter.
//! - [`sample`]: `-r` / `--ramp`, session-consistent sampling.
//! - [`proxy`]: the PROXY v2 header of `--proxy-protocol`.
//! - [`relay`]: relay mode, live or from a file: sessions replayed over ordinary TCP
//!   connections to the target, paced like the clients, with the report.

pub mod proxy;
pub mod reasm;
pub mod relay;
pub mod rules;
pub mod sample;
