//! `tcpkit replay`: the tcpreplay replacement, composed from the part crates.
//!
//! The path of a packet: read (`tcpkit-pcap`, zero-copy) → given an Ethernet header if its link
//! type has none, made unique per loop, rewritten (`tcpkit-wire`) → due at an absolute time
//! (`tcpkit-pace`) → sent in batches (`tcpkit-send`) → counted (`tcpkit-stats`).
//! This crate owns only the composition: the resolved [`Config`], the worker loop and the report.

mod config;
mod engine;

pub use config::{Config, Output};
pub use engine::{run, Outcome, ReplayError};
pub use tcpkit_pace::Rate;
pub use tcpkit_stats::ReplayReport;
pub use tcpkit_wire::{IpMap, MacAddr, PortMap, RewriteConfig, TtlEdit, VlanEdit};
