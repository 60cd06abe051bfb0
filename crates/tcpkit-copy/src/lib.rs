//! tcpkit-copy: `tcpkit copy` and `tcpkit intercept`.
//!
//! - [`reasm`]: TCP session tracking and exact byte-stream reassembly of captured packets, the
//!   part every copy mode stands on (relay mode replays the reassembled client streams).
//! - [`config`]: the copy's settings and live counters, the same for every mode.
//! - [`feed`]: the input of every copy mode, a live capture or a capture file at its pace.
//! - `turns`: a captured session's request turns and think times, with `--diff`'s original
//!   answers, the same for every mode.
//! - [`pipeline`]: the HTTP/1 requests a client pipelined inside one turn, counted apart
//!   (`requests.pipelined`).
//! - [`transfer`]: the `-x` rules (tcpcopy calls them transfers), the server ports tracked and the live capture's filter.
//! - [`sample`]: `-r` / `--ramp`, session-consistent sampling.
//! - [`proxy`]: the PROXY v2 header of `--proxy-protocol`.
//! - [`control`]: the protocol between `copy --transparent` and `intercept`.
//! - [`transparent`]: transparent mode's transport, the client's TCP played through a raw
//!   socket, the target's answers seen through intercept.
//! - [`intercept`]: `tcpkit intercept`, which catches the target's answers on the assistant, or
//!   on the target itself through a netfilter queue.
//! - `front`: the session front of every copy mode, written once over a transport: the
//!   capture side, each copy's requests and their turns (wait for the answer, `--diff`'s
//!   rest of it, the think time), the copies' slots and timers, how each copy ended, the
//!   live counters and the report.
//! - `tls`: `--tls-keylog`, between the reassembler and the session front: each TLS
//!   session's ciphertext events in, its plaintext events out (the front copies plaintext).
//! - [`relay`]: relay mode's transport: each copy over an ordinary TCP connection to the
//!   target.
//! - `backoff`: the back-off after a target's refusals, shared by every copy mode, so a
//!   down target sees a trickle of SYNs; each change of a target's state is a line the user
//!   hears at once.
//! - [`diff`]: `--diff`, the target's answers compared with the original server's.
//! - [`metrics`]: `--metrics`, the live counters for Prometheus over HTTP (the responder is
//!   `tcpkit-metrics`).
//! - [`report`]: the copy report, its human summary, `--json` and verdict (intercept's report
//!   lives in [`intercept`]).
//! - [`merged`]: `tcpkit merge` of copy reports, several hosts' copies into one loss figure.
//! - [`check`]: `copy --check`, what usually breaks a copy setup, verified with its fix.

pub mod auth;
mod backoff;
pub mod check;
pub mod config;
pub mod control;
pub mod diff;
pub mod feed;
mod front;
pub mod merged;
pub use front::RunError;
pub mod intercept;
pub mod metrics;
pub mod pipeline;
pub mod proxy;
pub mod reasm;
pub mod relay;
pub mod report;
pub mod sample;
mod tls;
pub mod transfer;
pub mod transparent;
mod turns;
