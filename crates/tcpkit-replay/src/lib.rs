//! `tcpkit replay`: the tcpreplay replacement, composed from the part crates.
//!
//! The path of a packet: read (`tcpkit-pcap`, zero-copy) → given an Ethernet header if its link
//! type has none, made unique per loop, rewritten (`tcpkit-wire`) → due at an absolute time
//! (`tcpkit-pace`) → sent in batches (`tcpkit-send`) → counted (`tcpkit-stats`).
//! This crate owns only the composition: the resolved [`Config`], the worker loop and the report
//! ([`ReplayReport`], built from `tcpkit-stats`' pieces), and [`prep`]: tcpprep's modes, which
//! decide the side of each packet for `--intf2` and write tcpprep's cache.

mod config;
mod engine;
mod flows;
pub mod prep;
mod report;

pub use config::{Config, Intf2, Output, Split};
pub use engine::{run, run_with_tap, Outcome, ReplayError, Tap};
pub use report::{
    DeviceStats, FlowStats, IfDelta, MtuTrunc, ReplayReport, ReplayShard, ReplaySplit, SendPath,
    TimingError, REPLAY_SCHEMA_VERSION,
};
pub use tcpkit_pace::Rate;
pub use tcpkit_send::IfInfo;
pub use tcpkit_wire::{IpMap, MacAddr, PortMap, RewriteConfig, TtlEdit, VlanEdit};
pub use tcpkit_workers::Shard;

/// The interfaces of this network namespace that replay can send on: Ethernet ones (replay
/// sends Ethernet frames; loopback and tunnels take none). `replay --listnics`.
pub fn sendable_interfaces() -> Result<Vec<IfInfo>, ReplayError> {
    Ok(tcpkit_send::interfaces()?
        .into_iter()
        .filter(|i| i.is_ethernet)
        .collect())
}
