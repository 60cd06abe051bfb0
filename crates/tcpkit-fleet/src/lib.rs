//! tcpkit-fleet: many hosts as one run. Agents (`load`, `replay` with `--barrier`) prepare
//! (open their connections, read their files, map their capture), say ready to one
//! controller (`tcpkit barrier`), and start at the one instant it gives once every agent is
//! ready; from the join to the end each side beats every [`BEAT`], and an agent or barrier not
//! heard for the barrier's `--lost-after` ([`LOST_AFTER`] by default, given to the agents in
//! the welcome so both ends use one bound), or whose connection closes, is lost: the barrier
//! stops the others, naming it. This crate is the frames ([`wire`], every length bounded), the key proof (tcpkit-keyfile's
//! HMAC challenge-response under this channel's labels, [`auth`]), the clock comparison
//! ([`clock`]), the controller's loop ([`barrier`]) and the agent's client ([`agent`]).
//!
//! The channel is authenticated, not encrypted: after the exchange its frames (ready, start,
//! stop, reasons) are readable on the path, and are not tagged one by one; keep it on the
//! path the agents' own control traffic takes.
#![warn(missing_docs)]

use std::time::Duration;

pub mod agent;
pub mod auth;
pub mod barrier;
pub mod clock;
pub mod wire;

pub use agent::{Agent, AgentConfig, AgentError};
pub use barrier::{BarrierConfig, BarrierReport};
pub use wire::Shard;

/// How often each side says it is still there.
pub const BEAT: Duration = Duration::from_millis(250);
/// A peer not heard for this long is lost (at once when its connection closes or resets):
/// the default of `tcpkit barrier --lost-after`. Beats share the path, the CPUs and the kernel
/// with an agent's preparation (tens of thousands of connects, its worker processes starting),
/// which on a loaded host has kept both ends of the barrier's connection from hearing each
/// other for over 2 s while nothing was wrong; a dead host is still found at once when its
/// connection resets, and within this bound when the path goes.
pub const LOST_AFTER: Duration = Duration::from_secs(10);
/// The shortest and longest `--lost-after` (the shortest: several beats; the longest: an
/// agent must not take a barrier's word for a bound that never finds it gone).
pub const LOST_AFTER_MIN: Duration = Duration::from_secs(1);
/// See [`LOST_AFTER_MIN`].
pub const LOST_AFTER_MAX: Duration = Duration::from_secs(600);
/// The start's lead over "now" when the barrier gives it: this, plus twice the largest
/// round trip an agent measured, so the start reaches every agent (and, under `--procs`,
/// every worker process of an agent) before it is due.
pub const LEAD_MIN: Duration = Duration::from_millis(100);

/// An agent report's `fleet` object: where the agent stood in the fleet run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FleetReport {
    /// The barrier's id for the whole fleet run (hex), the same on every agent.
    pub run_id: String,
    /// The barrier's address as given (`--barrier`).
    pub controller: String,
    /// This agent's host name.
    pub host: String,
    /// This agent's clock minus the barrier's, measured by timestamped round trips.
    pub clock_offset_ns: i64,
    /// The round trip of the sample the offset came from: its error bound is half of it.
    pub offset_rtt_ns: u64,
    /// The barrier's start instant on this agent's clock (0 if none was given).
    pub intended_start_unix_ns: u64,
    /// When the first query or frame went out, this agent's clock (0 if none did).
    pub actual_start_unix_ns: u64,
    /// Why the barrier stopped this agent early, naming the agent that failed.
    pub stopped_by: Option<String>,
}

/// Lowercase hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// This host's name (uname's nodename), or "?" if it cannot be read.
pub fn hostname() -> String {
    // SAFETY: uname fills the struct it is given; a zeroed utsname is a valid argument.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "?".into();
    }
    let bytes: Vec<u8> = u
        .nodename
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
