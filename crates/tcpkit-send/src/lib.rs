//! tcpkit-send: packet output.
//!
//! Every way a link-layer frame leaves tcpkit is a [`Sink`]: [`AfPacketSink`] puts whole link-layer
//! frames on an interface with batched `sendmmsg` on an AF_PACKET socket; [`XdpSink`] puts them
//! on one transmit queue through an AF_XDP socket (kernel bypass of the qdisc and socket
//! layers; zero-copy where the driver can); [`PcapFileSink`]
//! writes them to a pcap file instead (dry runs, `-w`, tests); [`raw::RawIpSink`] sends whole IP
//! packets through the kernel's routing (a sender playing another host's TCP). Sinks count every frame
//! ([`SendCounters`]): a frame is sent, truncated or failed, never dropped silently.
//! [`if_info`] and [`if_counters`] describe an interface of the calling thread's network
//! namespace.

#![warn(missing_docs)]

mod afpacket;
mod error;
mod file;
mod iface;
pub mod raw;
mod ring;
mod xdp;

pub use afpacket::{AfPacketOpts, AfPacketSink, TxMode};
pub use error::SendError;
pub use file::PcapFileSink;
pub use iface::{if_counters, if_info, interfaces, IfCounters, IfInfo};
/// A failed syscall on an interface's socket ([`SendError::Sys`]).
pub use tcpkit_kernel::afpacket::IfError;
pub use xdp::{XdpMode, XdpOpts, XdpSink};

/// What a sink did with the frames it was given. `successful + failed + truncated` is the
/// number of frames offered.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendCounters {
    /// Frames sent whole.
    pub successful: u64,
    /// Frames not sent (too big for the MTU, malformed, or the interface failed).
    pub failed: u64,
    /// Of `failed`: refused with EMSGSIZE, longer than the interface's MTU + link header.
    pub failed_too_big: u64,
    /// Of `failed`: refused with EINVAL, shorter than a link-layer header.
    pub failed_malformed: u64,
    /// Of `failed`: given up after the device queue or socket buffer stayed full (ENOBUFS /
    /// EAGAIN) for over a second.
    pub failed_stuck: u64,
    /// Frames of which the kernel took fewer bytes than asked.
    pub truncated: u64,
    /// Times a send was retried after ENOBUFS (a full device queue).
    pub retried_enobufs: u64,
    /// Times a send was retried after EAGAIN (a full socket buffer).
    pub retried_eagain: u64,
    /// Bytes sent (link-layer frames, without FCS).
    pub bytes: u64,
}

/// One link-layer frame to send.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// The frame, starting at the link-layer header.
    pub data: &'a [u8],
    /// The timestamp it would have had (ns since the epoch): used by file sinks.
    pub ts_ns: u64,
}

/// Where frames go.
pub trait Sink {
    /// Send frames in order; returns when all were sent or counted as failed. Never drops
    /// silently. An `Err` means the sink cannot go on (the interface went away, the disk is
    /// full); the frames not sent by then are counted as failed.
    fn send_batch(&mut self, frames: &[Frame<'_>]) -> Result<(), SendError>;
    /// Totals since the sink was opened.
    fn counters(&self) -> SendCounters;
    /// Push out anything buffered.
    fn flush(&mut self) -> Result<(), SendError>;
}

#[cfg(test)]
mod testnet;
