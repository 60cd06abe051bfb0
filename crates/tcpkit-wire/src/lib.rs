//! tcpkit-wire: packet views, link-type conversion, rewriting and flow keys.
//!
//! This crate is the one place in tcpkit that indexes packet bytes. Untrusted frames enter
//! through functions that check every offset against the buffer and pass anything they do not
//! understand (unknown ethertypes, MPLS payloads that are not IP, cut headers) through untouched; nothing here panics on
//! bad input (the `rewrite` fuzz target and its corpus test hold us to that).
//!
//! - [`LinkType`], [`to_ethernet`] and [`as_ethernet`]: turn a captured frame of any supported
//!   DLT into Ethernet.
//! - [`Rewriter`]: what `tcpkit replay` does to each frame, matched byte for byte against
//!   Debian's tcprewrite 4.4.3 (see the [`rewrite`] module docs for the behaviours matched and
//!   the few tcprewrite bugs deliberately not copied).
//! - [`flow_key`], [`shard_hash`], [`flow_shard`], [`unique_ip`], [`unique_ports`]:
//!   tcpreplay-style flow counting, sharding a capture over threads and over hosts, and
//!   per-loop unique flows (by address, as tcpreplay, or by client port).
//! - [`PrepView`]: a packet as tcpprep sees it (its role, addresses, destination port), for
//!   `replay prep` and the two-interface split.
//! - [`http::ResponseFramer`]: where each HTTP/1.x response in a stream ends (load, copy).
//! - [`h2::Endpoint`]: HTTP/2 framing, sans-IO, either end (load --http2/--doh, echo's h2c);
//!   [`h2::doh`]: DNS over HTTPS's two request forms.

#![warn(missing_docs)]

mod csum;
pub mod dns;
mod flow;
mod fuzz;
pub mod h2;
pub mod http;
mod link;
mod parse;
mod prep;
pub mod rewrite;
pub mod tcp;
mod types;

pub use flow::{
    flow_class, flow_key, flow_shard, shard_hash, unique_ip, unique_port, unique_ports, ConnKey,
    FlowClass, FlowKey, UNIQUE_PORT_STEP,
};
pub use fuzz::fuzz_rewrite;
pub use link::{as_ethernet, is_8021q_tagged, to_ethernet, LinkType};
pub use prep::{prep_supports, PrepAddr, PrepPort, PrepRole, PrepView};
pub use rewrite::{RewriteConfig, RewriteOutcome, Rewriter, Uncut};
pub use types::{Cidr, IpMap, MacAddr, PortMap, TtlEdit, VlanEdit};

/// Why a frame or a piece of text could not be handled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A header needed for the requested operation is cut short.
    #[error("{layer} header truncated at offset {offset}: need {need} bytes, have {have}")]
    Truncated {
        /// The header that is cut: `ethernet`, `ipv4`, `tcp`, ...
        layer: &'static str,
        /// Byte of the frame where that header starts.
        offset: usize,
        /// Bytes that header needs.
        need: usize,
        /// Bytes left from `offset`.
        have: usize,
    },
    /// A pcap link type (DLT) tcpkit cannot convert to Ethernet.
    #[error("unsupported link type DLT {0}")]
    UnsupportedDlt(u32),
    /// A link-layer header names a payload we cannot carry in Ethernet.
    #[error("{link}: unsupported {what} {value:#x} at offset {offset}")]
    Unsupported {
        /// The link type whose header it is.
        link: &'static str,
        /// The field naming the payload (an ethertype, an address family, ...).
        what: &'static str,
        /// The value found in it.
        value: u32,
        /// Byte of the frame where that field is.
        offset: usize,
    },
    /// Text given for an option (MAC, CIDR, map, TTL) is not valid.
    #[error("invalid {what} {text:?}: {why}")]
    Parse {
        /// The option the text was given for.
        what: &'static str,
        /// The text as given.
        text: String,
        /// What is wrong with it.
        why: String,
    },
}

impl WireError {
    pub(crate) fn parse(what: &'static str, text: &str, why: impl Into<String>) -> WireError {
        WireError::Parse {
            what,
            text: text.to_owned(),
            why: why.into(),
        }
    }
}
